/* test_fuzz_query: the request reader's fuzzing corpus and every crash file
 * found so far, replayed through the fuzz target's own checks
 * (tests/fuzz/fuzz_query.c) in every ordinary build; and the checks shown
 * able to fail. */
#include "idx_test.h"

#include <string.h>

#define KVO_FUZZ_REPLAY
#include "../fuzz/fuzz_query.c"

START_TEST(query_corpus_and_crashes_replay_cleanly) {
    size_t n = kt_fuzz_replay("corpus/query", kvo_fuzz_query);
    ck_assert_uint_ge(n, 7); /* at least the seeds */
    kt_fuzz_replay("crashes/query", kvo_fuzz_query);
}
END_TEST

/* A replay that cannot fail proves nothing: the round-trip comparison
 * tells requests apart, and the canonical writing reads back. */
START_TEST(the_query_fuzz_checks_can_fail) {
    static const char *const bodies[] = {
        "{\"tokens_hashes\":[1,2],\"wait\":{\"zmq_seq\":[[7,8]]}}",
        "{\"token_ids\":[1,2],\"lora_name\":\"a\\\"b\",\"metrics\":true}",
        "{\"apply\":9}",
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(bodies); i++) {
        unsigned all = IDX_REQ_TOKENS | IDX_REQ_HASHES | IDX_REQ_APPLY;
        idx_request a, b;
        idx_request_init(&a);
        idx_request_init(&b);
        ck_assert_int_eq(
            idx_request_parse(&a, bodies[i], strlen(bodies[i]), all, NULL),
            KVO_OK);
        kvo_buf w;
        kvo_buf_init(&w);
        qwrite(&w, &a);
        ck_assert_int_eq(idx_request_parse(&b, w.data, w.len, all, NULL),
                         KVO_OK);
        ck_assert(qsame(&a, &b));
        /* the same request but one thing: told apart */
        b.metrics = !b.metrics;
        ck_assert(!qsame(&a, &b));
        b.metrics = !b.metrics;
        b.apply++;
        ck_assert(!qsame(&a, &b));
        kvo_buf_fini(&w);
        idx_request_fini(&a);
        idx_request_fini(&b);
        kvo_fuzz_query((const uint8_t *)bodies[i], strlen(bodies[i]));
    }
}
END_TEST

Suite *suite_fuzz_query(void) {
    Suite *s = suite_create("fuzz_query");
    TCase *tc = tcase_create("fuzz_query");
    tcase_add_test(tc, query_corpus_and_crashes_replay_cleanly);
    tcase_add_test(tc, the_query_fuzz_checks_can_fail);
    suite_add_tcase(s, tc);
    return s;
}
