/* The shared basics: status table, buffer, arena, parsing, allocation
 * failure injection. */
#include "kt.h"

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

START_TEST(grow_doubles_from_the_first_capacity_and_keeps_the_array_on_failure) {
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

Suite *suite_basics(void) {
    Suite *s = suite_create("basics");
    TCase *tc = tcase_create("basics");
    tcase_add_test(tc, status_names_and_messages_come_from_one_table);
    tcase_add_test(tc, buffer_grows_and_printf_appends);
    tcase_add_test(tc,
                   grow_doubles_from_the_first_capacity_and_keeps_the_array_on_failure);
    tcase_add_test(tc, arena_is_aligned_and_reset_keeps_memory);
    tcase_add_test(tc, parsers_reject_trailing_garbage_and_overflow);
    tcase_add_test(tc, allocation_failure_injection_fails_the_nth_call);
    suite_add_tcase(s, tc);
    return s;
}
