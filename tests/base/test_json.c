/* The strict JSON reader: what it accepts and how it reads it, what it
 * refuses and where, its memory budget, and the fuzz corpus replayed. */
#include "kt.h"
#include "kvo_json.h"

#include <string.h>

#define KVO_FUZZ_REPLAY
#include "../fuzz/fuzz_json.c"

Suite *suite_json(void);

static kvo_json doc;
static kvo_err err;

static kvo_status parse(const char *text) {
    return kvo_json_parse(&doc, text, strlen(text), NULL, &err);
}

static void setup(void) { kvo_json_init(&doc); }
static void teardown(void) { kvo_json_fini(&doc); }

START_TEST(a_typical_body_reads_back_exactly) {
    ck_assert_int_eq(parse(" {\"token_ids\": [1, 2, 18446744073709551615],"
                           " \"model\": \"m\\u00e9\\n\", \"temp\": 0.5,"
                           " \"stream\": false, \"x\": null,"
                           " \"pairs\": [[1, -2], \"s\", {}], \"e\": []} \n"),
                     KVO_OK);
    const kvo_jv *root = doc.root;
    ck_assert(kvo_json_is(root, KVO_JSON_OBJ));
    ck_assert_uint_eq(root->len, 7);
    const uint64_t *ids;
    size_t n;
    ck_assert_int_eq(
        kvo_json_u64s(kvo_json_get(root, "token_ids"), &ids, &n, &err), KVO_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ids[2], UINT64_MAX);
    size_t len;
    ck_assert_str_eq(kvo_json_str(kvo_json_get(root, "model"), &len),
                     "m\xc3\xa9\n");
    ck_assert_uint_eq(len, 4);
    double d;
    ck_assert(kvo_json_num(kvo_json_get(root, "temp"), &d) && d == 0.5);
    bool b = true;
    ck_assert(kvo_json_bool(kvo_json_get(root, "stream"), &b) && !b);
    ck_assert(kvo_json_is(kvo_json_get(root, "x"), KVO_JSON_NULL));
    ck_assert_ptr_null(kvo_json_get(root, "absent"));
    ck_assert_ptr_null(kvo_json_get(kvo_json_get(root, "absent"), "deeper"));
    /* a mixed array has nodes; its packed inner array reads with signs */
    const kvo_jv *pairs = kvo_json_get(root, "pairs");
    kvo_jv e, x;
    ck_assert(kvo_json_at(pairs, 0, &e) && e.packed && e.len == 2);
    int64_t i;
    ck_assert(kvo_json_at(&e, 1, &x) && kvo_json_i64(&x, &i) && i == -2);
    uint64_t u;
    ck_assert(!kvo_json_u64(&x, &u));
    ck_assert(kvo_json_at(pairs, 1, &e) && kvo_json_is(&e, KVO_JSON_STR));
    ck_assert(!kvo_json_at(pairs, 3, &e));
    const int64_t *iv;
    ck_assert_int_eq(kvo_json_u64s(pairs, &ids, &n, &err), KVO_EPROTO);
    ck_assert_str_eq(err.msg, "[0]: expected an integer");
    ck_assert_int_eq(kvo_json_u64s(kvo_json_get(root, "e"), &ids, &n, &err),
                     KVO_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(
        kvo_json_i64s(kvo_json_get(root, "token_ids"), &iv, &n, &err),
        KVO_EPROTO); /* 2^64 - 1 is no int64 */
}
END_TEST

START_TEST(an_array_turning_mixed_keeps_its_integers_in_order) {
    ck_assert_int_eq(parse("[5, -6, 7, \"eight\", 9]"), KVO_OK);
    ck_assert(!doc.root->packed);
    kvo_jv e;
    int64_t v[5];
    for (int k = 0; k < 5; k++) {
        ck_assert(kvo_json_at(doc.root, (size_t)k, &e));
        if (k != 3) ck_assert(kvo_json_i64(&e, &v[k]));
    }
    ck_assert(v[0] == 5 && v[1] == -6 && v[2] == 7 && v[4] == 9);
}
END_TEST

START_TEST(integers_are_exact_at_both_ends_and_refused_beyond) {
    int64_t i;
    uint64_t u;
    ck_assert_int_eq(parse("-9223372036854775808"), KVO_OK);
    ck_assert(kvo_json_i64(doc.root, &i) && i == INT64_MIN);
    ck_assert_int_eq(parse("18446744073709551615"), KVO_OK);
    ck_assert(kvo_json_u64(doc.root, &u) && u == UINT64_MAX);
    ck_assert(!kvo_json_i64(doc.root, &i));
    ck_assert_int_eq(parse("-0"), KVO_OK);
    ck_assert(kvo_json_u64(doc.root, &u) && u == 0);
    static const char *const bad[] = {"18446744073709551616",
                                      "-9223372036854775809",
                                      "99999999999999999999999",
                                      "01",
                                      "-",
                                      "1.",
                                      ".5",
                                      "1e",
                                      "+1",
                                      "0x10",
                                      "1e999"};
    for (size_t k = 0; k < KVO_ARRAY_LEN(bad); k++) {
        ck_assert_msg(parse(bad[k]) != KVO_OK, "accepted %s", bad[k]);
        ck_assert_ptr_null(doc.root);
    }
}
END_TEST

/* (input, status, offset): each refusal says where. */
START_TEST(malformed_input_is_refused_with_its_offset) {
    static const struct {
        const char *text;
        size_t len; /* 0: strlen */
        kvo_status st;
        size_t offset;
        const char *msg;
    } cases[] = {
        {"", 0, KVO_ETRUNC, 0, "should start"},
        {"{} x", 0, KVO_EPROTO, 3, "trailing"},
        {"{}{}", 0, KVO_EPROTO, 2, "trailing"},
        {"{}\0garbage", 10, KVO_EPROTO, 2, "trailing"},
        {"[1,]", 0, KVO_EPROTO, 3, "expected a JSON value"},
        {"[1 2]", 0, KVO_EPROTO, 3, "expected ',' or ']'"},
        {"{\"a\" 1}", 0, KVO_EPROTO, 5, "expected ':'"},
        {"{\"a\":1,\"a\":2}", 0, KVO_EPROTO, 0, "duplicate key \"a\""},
        {"{1:2}", 0, KVO_EPROTO, 1, "expected a key"},
        {"[1,2", 0, KVO_ETRUNC, 0, "inside an array"},
        {"\"abc", 0, KVO_ETRUNC, 0, "inside a string"},
        {"\"a\\x\"", 0, KVO_EPROTO, 2, "bad escape"},
        {"\"\\u12\"", 0, KVO_EPROTO, 1, "bad \\u"},
        {"\"\\ud800\"", 0, KVO_EPROTO, 1, "unpaired surrogate"},
        {"\"\\udc00\\ud800\"", 0, KVO_EPROTO, 1, "unpaired surrogate"},
        {"\"\\u0000\"", 0, KVO_EPROTO, 1, "U+0000"},
        {"\"a\tb\"", 0, KVO_EPROTO, 2, "control character"},
        {"\"a\0b\"", 5, KVO_EPROTO, 2, "control character"},
        {"\"\xc0\x80\"", 0, KVO_EPROTO, 1, "invalid UTF-8"},     /* overlong */
        {"\"\xed\xa0\x80\"", 0, KVO_EPROTO, 1, "invalid UTF-8"}, /* surrogate */
        {"\"\xf4\x90\x80\x80\"", 0, KVO_EPROTO, 1,
         "invalid UTF-8"},                                   /* > 10FFFF */
        {"\"\xe2\x82\"", 0, KVO_EPROTO, 1, "invalid UTF-8"}, /* cut short */
        {"\"\xff\"", 0, KVO_EPROTO, 1, "invalid UTF-8"},
        {"tru", 0, KVO_EPROTO, 0, "expected a JSON value"},
        {"nul", 0, KVO_EPROTO, 0, "expected a JSON value"},
        {"NaN", 0, KVO_EPROTO, 0, "expected a JSON value"},
    };
    for (size_t k = 0; k < KVO_ARRAY_LEN(cases); k++) {
        size_t len = cases[k].len ? cases[k].len : strlen(cases[k].text);
        kvo_status st = kvo_json_parse(&doc, cases[k].text, len, NULL, &err);
        ck_assert_msg(st == cases[k].st, "case %zu: %s, want %s", k,
                      kvo_status_name(st), kvo_status_name(cases[k].st));
        ck_assert_msg(err.offset == cases[k].offset, "case %zu: offset %zu", k,
                      err.offset);
        ck_assert_msg(strstr(err.msg, cases[k].msg), "case %zu: '%s'", k,
                      err.msg);
    }
    /* and good strings: every escape, a surrogate pair, raw UTF-8 */
    ck_assert_int_eq(
        parse("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\ud83d\\ude00\xf0\x9f\x98\x80\""),
        KVO_OK);
    ck_assert_str_eq(doc.root->v.s,
                     "\"\\/\b\f\n\r\t\xf0\x9f\x98\x80\xf0\x9f\x98\x80");
}
END_TEST

START_TEST(nesting_is_bounded) {
    char deep[200];
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    deep[130] = '\0';
    ck_assert_int_eq(parse(deep), KVO_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(err.msg, "nesting deeper than 64"));
    deep[64] = ' ', deep[65] = ' '; /* 64 deep */
    ck_assert_int_eq(parse(deep), KVO_OK);
    kvo_json_limits lim = {.max_depth = 3};
    ck_assert_int_eq(kvo_json_parse(&doc, "[[[[]]]]", 8, &lim, &err),
                     KVO_ETOOBIG);
}
END_TEST

/* A token array costs 8 bytes per element, whatever its text, and the
 * budget is enforced whatever the input. */
START_TEST(memory_stays_within_a_small_multiple_of_the_input) {
    enum { N = 1 << 20 };
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_buf_append(&b, "{\"prompt\":[", 11);
    for (int k = 0; k < N; k++) kvo_buf_append(&b, k ? ",7" : "7", k ? 2 : 1);
    kvo_buf_append(&b, "]}", 2);
    ck_assert_int_eq(kvo_json_parse(&doc, b.data, b.len, NULL, &err), KVO_OK);
    /* peak: the integer stack (8 B) + the packed copy (8 B) + signs */
    ck_assert_uint_le(doc.mem, 18u * N + (64u << 10));
    ck_assert_uint_le(doc.mem, 9 * b.len);
    const uint64_t *v;
    size_t n;
    ck_assert_int_eq(
        kvo_json_u64s(kvo_json_get(doc.root, "prompt"), &v, &n, &err), KVO_OK);
    ck_assert_uint_eq(n, N);
    ck_assert_uint_eq(v[N - 1], 7);
    kvo_json_limits lim = {.max_mem = 4u * b.len};
    ck_assert_int_eq(kvo_json_parse(&doc, b.data, b.len, &lim, &err),
                     KVO_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(err.msg, "needs more than"));
    ck_assert_uint_le(doc.mem, lim.max_mem);
    /* objects and strings are charged too */
    kvo_buf_reset(&b);
    kvo_buf_append(&b, "[", 1);
    for (int k = 0; k < 100000; k++)
        kvo_buf_printf(&b, "%s{\"k%d\":\"v\"}", k ? "," : "", k);
    kvo_buf_append(&b, "]", 1);
    ck_assert_int_eq(kvo_json_parse(&doc, b.data, b.len, NULL, &err), KVO_OK);
    ck_assert_uint_le(doc.mem, 16 * b.len + (64u << 10));
    kvo_buf_fini(&b);
}
END_TEST

START_TEST(a_document_is_reusable_and_failed_parses_leave_no_root) {
    ck_assert_int_eq(parse("[1]"), KVO_OK);
    ck_assert_int_eq(parse("[1"), KVO_ETRUNC);
    ck_assert_ptr_null(doc.root);
    ck_assert_int_eq(parse("{\"a\":{\"b\":[true]}}"), KVO_OK);
    kvo_jv e;
    bool b;
    ck_assert(
        kvo_json_at(kvo_json_get(kvo_json_get(doc.root, "a"), "b"), 0, &e) &&
        kvo_json_bool(&e, &b) && b);
    /* out of memory mid-parse: a status, no leak (ASan), no root */
    for (long k = 0; k < 6; k++) {
        kvo_alloc_fail_after(k);
        kvo_status st = parse("{\"a\":[1,2,{\"b\":\"c\"}],\"d\":\"e\"}");
        kvo_alloc_fail_after(-1);
        ck_assert(st == KVO_OK || st == KVO_ENOMEM);
        if (st != KVO_OK) ck_assert_ptr_null(doc.root);
    }
}
END_TEST

START_TEST(fuzz_corpus_and_crashes_replay_cleanly) {
    ck_assert_uint_ge(kt_fuzz_replay("corpus/json", kvo_fuzz_json), 20);
    kt_fuzz_replay("crashes/json", kvo_fuzz_json);
}
END_TEST

Suite *suite_json(void) {
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("reader");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, a_typical_body_reads_back_exactly);
    tcase_add_test(tc, an_array_turning_mixed_keeps_its_integers_in_order);
    tcase_add_test(tc, integers_are_exact_at_both_ends_and_refused_beyond);
    tcase_add_test(tc, malformed_input_is_refused_with_its_offset);
    tcase_add_test(tc, nesting_is_bounded);
    tcase_add_test(tc, memory_stays_within_a_small_multiple_of_the_input);
    tcase_add_test(tc, a_document_is_reusable_and_failed_parses_leave_no_root);
    tcase_add_test(tc, fuzz_corpus_and_crashes_replay_cleanly);
    suite_add_tcase(s, tc);
    return s;
}
