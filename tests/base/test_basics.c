/* The shared basics: status table, buffer, arena, parsing, allocation
 * failure injection. */
#include "kt.h"
#include "kvo_map.h"
#include "kvo_prom.h"

#include <stdlib.h>
#include <string.h>

Suite *suite_basics(void);

START_TEST(status_names_and_messages_come_from_one_table) {
    ck_assert_str_eq(kvo_status_name(KVO_OK), "OK");
    ck_assert_str_eq(kvo_status_name(KVO_EPROTO), "EPROTO");
    ck_assert_str_eq(kvo_strerror(KVO_EPROTO), "malformed input");
    ck_assert_str_eq(kvo_strerror((kvo_status)999), "unknown status");
}
END_TEST

START_TEST(buffer_grows_and_printf_appends) {
    kvo_buf b;
    kvo_buf_init(&b);
    for (int i = 0; i < 1000; i++)
        ck_assert(kvo_buf_printf(&b, "%d,", i) == KVO_OK);
    ck_assert(kvo_buf_cstr(&b) == KVO_OK);
    ck_assert(strncmp((char *)b.data, "0,1,2,", 6) == 0);
    ck_assert_uint_eq(b.len, strlen((char *)b.data));
    kvo_buf_fini(&b);
}
END_TEST

START_TEST(
    grow_doubles_from_the_first_capacity_and_keeps_the_array_on_failure) {
    uint32_t *v = NULL;
    size_t cap = 0;
    ck_assert(kvo_grow(&v, &cap, 1, sizeof(*v), 8) == KVO_OK);
    ck_assert_uint_eq(cap, 8);
    for (uint32_t i = 0; i < 8; i++) v[i] = i;
    ck_assert(kvo_grow(&v, &cap, 8, sizeof(*v), 8) == KVO_OK); /* fits */
    ck_assert_uint_eq(cap, 8);
    ck_assert(kvo_grow(&v, &cap, 9, sizeof(*v), 8) == KVO_OK);
    ck_assert_uint_eq(cap, 16);
    ck_assert(kvo_grow(&v, &cap, 100, sizeof(*v), 8) == KVO_OK);
    ck_assert_uint_eq(cap, 128);
    uint32_t *before = v;
    kvo_alloc_fail_after(0);
    ck_assert(kvo_grow(&v, &cap, 129, sizeof(*v), 8) == KVO_ENOMEM);
    kvo_alloc_fail_after(-1);
    ck_assert_ptr_eq(v, before);
    ck_assert_uint_eq(cap, 128);
    ck_assert(kvo_grow(&v, &cap, SIZE_MAX / 2, sizeof(*v), 8) == KVO_ENOMEM);
    ck_assert(kvo_grow(&v, &cap, SIZE_MAX, 1, 8) == KVO_ENOMEM);
    ck_assert_uint_eq(cap, 128);
    for (uint32_t i = 0; i < 8; i++) ck_assert_uint_eq(v[i], i);
    kvo_free(v);
}
END_TEST

START_TEST(arena_is_aligned_and_reset_keeps_memory) {
    kvo_arena a;
    kvo_arena_init(&a);
    for (int i = 1; i < 500; i++) {
        void *p = kvo_arena_alloc(&a, (size_t)i * 7);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq((uintptr_t)p % 16, 0);
        memset(p, 0xab, (size_t)i * 7);
    }
    kvo_arena_reset(&a);
    ck_assert_uint_eq(a.used_total, 0);
    ck_assert_ptr_nonnull(a.head);
    kvo_arena_fini(&a);
}
END_TEST

START_TEST(parsers_reject_trailing_garbage_and_overflow) {
    uint64_t u;
    int64_t i;
    uint32_t u32;
    ck_assert(kvo_parse_u64("18446744073709551615", &u) == KVO_OK);
    ck_assert(u == UINT64_MAX);
    ck_assert(kvo_parse_u64("18446744073709551616", &u) == KVO_EINVAL);
    ck_assert(kvo_parse_u64("12x", &u) == KVO_EINVAL);
    ck_assert(kvo_parse_u64("-1", &u) == KVO_EINVAL);
    ck_assert(kvo_parse_i64("-5", &i) == KVO_OK && i == -5);
    ck_assert(kvo_parse_u32("4294967296", &u32) == KVO_EINVAL);
    char host[64];
    uint16_t port;
    ck_assert(kvo_parse_hostport(":8090", host, sizeof(host), &port) == KVO_OK);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_uint_eq(port, 8090);
    ck_assert(kvo_parse_hostport("0.0.0.0:70000", host, sizeof(host), &port) ==
              KVO_EINVAL);
}
END_TEST

START_TEST(allocation_failure_injection_fails_the_nth_call) {
    kvo_alloc_fail_after(2);
    void *a = kvo_malloc(8), *b = kvo_malloc(8), *c = kvo_malloc(8);
    kvo_alloc_fail_after(-1);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_null(c);
    kvo_free(a);
    kvo_free(b);
}
END_TEST

START_TEST(error_detail_names_status_offset_and_reason) {
    kvo_err e;
    char buf[300];
    ck_assert(kvo_err_set(&e, KVO_EPROTO, 17, "token_ids[%d]: not an int", 3) ==
              KVO_EPROTO);
    ck_assert_str_eq(kvo_err_str(&e, buf, sizeof(buf)),
                     "EPROTO at byte 17: token_ids[3]: not an int");
    kvo_err_set(&e, KVO_EINTR, KVO_ERR_NO_OFFSET, "%s", "");
    ck_assert_str_eq(kvo_err_str(&e, buf, sizeof(buf)), "EINTR: interrupted");
    ck_assert(kvo_err_set(NULL, KVO_ENOMEM, 0, "x") == KVO_ENOMEM);
}
END_TEST

/* The map against a plain array model, with key 0 and deletions that force
 * backward shifts through wrapped probe runs. */
START_TEST(u64_map_matches_a_model_through_puts_decs_and_deletes) {
    enum { KEYS = 4096 };
    static uint64_t model[KEYS]; /* value + 1, 0 = absent */
    memset(model, 0, sizeof(model));
    kvo_map m;
    kvo_map_init(&m);
    uint64_t rng = 7;
    size_t live = 0;
    for (int op = 0; op < 200000; op++) {
        uint64_t r = kvo_splitmix64(&rng);
        uint32_t k = (uint32_t)(r % KEYS);
        /* keys that collide in their low bits, key 0 included */
        uint64_t key = (uint64_t)k << 40;
        switch ((r >> 32) % 4) {
        case 0: {
            bool added;
            uint64_t *v = kvo_map_put(&m, key, &added);
            ck_assert_ptr_nonnull(v);
            ck_assert(added == (model[k] == 0));
            if (added) live++;
            (*v)++;
            model[k] = *v + 1;
            break;
        }
        case 1: {
            kvo_map_dec_result d = kvo_map_dec(&m, key);
            if (model[k] == 0) {
                ck_assert(d == KVO_MAP_ABSENT);
            } else if (model[k] <= 2) {
                ck_assert(d == KVO_MAP_GONE);
                model[k] = 0;
                live--;
            } else {
                ck_assert(d == KVO_MAP_HELD);
                model[k]--;
            }
            break;
        }
        case 2:
            ck_assert(kvo_map_del(&m, key) == (model[k] != 0));
            if (model[k]) live--;
            model[k] = 0;
            break;
        default: { /* a lookup, then its delete by the value's pointer */
            uint64_t *v = kvo_map_get(&m, key);
            ck_assert(v ? model[k] != 0 : model[k] == 0);
            if (v) {
                ck_assert_uint_eq(*v, model[k] - 1);
                kvo_map_del_at(&m, v);
                live--;
                model[k] = 0;
            }
        }
        }
        ck_assert_uint_eq(m.len, live);
    }
    for (uint32_t k = 0; k < KEYS; k++) {
        uint64_t *v = kvo_map_get(&m, (uint64_t)k << 40);
        if (model[k] == 0)
            ck_assert_ptr_null(v);
        else
            ck_assert_uint_eq(*v, model[k] - 1);
    }
    kvo_map_fini(&m);
}
END_TEST

START_TEST(prometheus_writer_prefixes_names_and_keeps_the_first_failure) {
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_prom p;
    kvo_prom_init(&p, &b, "kvo_x_");
    kvo_prom_counter(&p, "ops_total", "operations", 3);
    kvo_prom_family(&p, "drops_total", "counter", "drops by kind");
    kvo_prom_u64(&p, "drops_total", 5, "kind=\"%s\"", "gap");
    kvo_prom_f64(&p, "ratio", 0.5, NULL);
    ck_assert(kvo_prom_status(&p) == KVO_OK);
    ck_assert(kvo_buf_cstr(&b) == KVO_OK);
    ck_assert_str_eq((char *)b.data, "# HELP kvo_x_ops_total operations\n"
                                     "# TYPE kvo_x_ops_total counter\n"
                                     "kvo_x_ops_total 3\n"
                                     "# HELP kvo_x_drops_total drops by kind\n"
                                     "# TYPE kvo_x_drops_total counter\n"
                                     "kvo_x_drops_total{kind=\"gap\"} 5\n"
                                     "kvo_x_ratio 0.5\n");
    size_t len = b.len;
    kvo_alloc_fail_after(0);
    for (int i = 0; i < 1000; i++) kvo_prom_gauge(&p, "g", "grows", 1);
    kvo_alloc_fail_after(-1);
    kvo_prom_gauge(&p, "after", "nothing more is written", 1);
    ck_assert(kvo_prom_status(&p) == KVO_ENOMEM);
    ck_assert_uint_le(b.len, len + 4096);
    kvo_buf_fini(&b);
}
END_TEST

static int help_seen;
static kvo_status set_opt(void *ctx, int code, const char *arg) {
    (void)ctx;
    (void)arg;
    if (code == 'h') help_seen = 1;
    return KVO_OK;
}

START_TEST(help_and_version_never_come_from_the_environment) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    setenv("KVO_HELP", "1", 1);
    char a0[] = "prog";
    char *argv[] = {a0, NULL};
    help_seen = 0;
    ck_assert_int_eq(kvo_getopt(1, argv, opts, set_opt, NULL), 1);
    ck_assert_int_eq(help_seen, 0);
    char a1[] = "--help";
    char *argv2[] = {a0, a1, NULL};
    ck_assert_int_eq(kvo_getopt(2, argv2, opts, set_opt, NULL), 2);
    ck_assert_int_eq(help_seen, 1);
    unsetenv("KVO_HELP");
}
END_TEST

Suite *suite_basics(void) {
    Suite *s = suite_create("basics");
    TCase *tc = tcase_create("basics");
    tcase_add_test(tc, status_names_and_messages_come_from_one_table);
    tcase_add_test(tc, buffer_grows_and_printf_appends);
    tcase_add_test(
        tc,
        grow_doubles_from_the_first_capacity_and_keeps_the_array_on_failure);
    tcase_add_test(tc, arena_is_aligned_and_reset_keeps_memory);
    tcase_add_test(tc, parsers_reject_trailing_garbage_and_overflow);
    tcase_add_test(tc, allocation_failure_injection_fails_the_nth_call);
    tcase_add_test(tc, error_detail_names_status_offset_and_reason);
    tcase_add_test(tc, u64_map_matches_a_model_through_puts_decs_and_deletes);
    tcase_add_test(
        tc, prometheus_writer_prefixes_names_and_keeps_the_first_failure);
    tcase_add_test(tc, help_and_version_never_come_from_the_environment);
    suite_add_tcase(s, tc);
    return s;
}
