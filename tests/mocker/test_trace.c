/* The Mooncake trace reader and prompt synthesis. */
#include "mt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

Suite *suite_trace(void);

START_TEST(reader_returns_every_request_of_the_bundled_1000_line_trace) {
    char *path = kt_src_path("traces/mooncake_conversation_1000.jsonl");
    mock_trace *t;
    ck_assert_int_eq(mock_trace_open(&t, path), KVO_OK);
    mock_trace_req r;
    uint64_t n = 0, in_sum = 0, out_sum = 0;
    double last_ts = -1;
    while (mock_trace_next(t, &r, NULL, 0) == KVO_OK) {
        if (n == 0) {
            ck_assert(r.timestamp_ms == 0);
            ck_assert_uint_eq(r.input_length, 6758);
            ck_assert_uint_eq(r.output_length, 500);
            ck_assert_uint_eq(r.n_hash_ids, 14);
            for (uint32_t i = 0; i < 14; i++)
                ck_assert_uint_eq(r.hash_ids[i], i);
        }
        ck_assert(r.timestamp_ms >= last_ts);
        last_ts = r.timestamp_ms;
        ck_assert_uint_eq(r.line, n + 1);
        in_sum += r.input_length;
        out_sum += r.output_length;
        n++;
    }
    ck_assert_uint_eq(n, 1000);
    ck_assert_uint_eq(in_sum, 13732944);
    ck_assert_uint_eq(out_sum, 349357); /* = the generated tokens of a replay */
    ck_assert(last_ts == 330000);
    ck_assert_uint_eq(mock_trace_malformed(t), 0);
    ck_assert_int_eq(mock_trace_next(t, &r, NULL, 0), KVO_EOF);
    mock_trace_free(t);
    kvo_free(path);
}
END_TEST

START_TEST(prompt_is_the_trace_blocks_tokens_cut_to_input_length) {
    uint64_t ids[3] = {7, 123456789, 42};
    uint64_t *tok = kvo_malloc(1536 * sizeof(uint64_t));
    ck_assert_int_eq(mock_trace_validate(ids, 3, 1100), KVO_OK);
    mock_trace_tokens(ids, 3, 1100, tok);
    for (uint32_t k = 0; k < 1100; k++) {
        ck_assert_uint_eq(tok[k], mock_trace_token(ids[k / 512], k % 512));
        ck_assert_uint_lt(tok[k], 32000);
    }
    /* Same id, same tokens: the prefix of a 2-id prompt is the 3-id one's. */
    uint64_t *tok2 = kvo_malloc(1024 * sizeof(uint64_t));
    mock_trace_tokens(ids, 2, 1024, tok2);
    ck_assert(memcmp(tok, tok2, 1024 * sizeof(uint64_t)) == 0);
    /* Any slice (the probe's one block at a time, across a trace block's
     * end too) is that slice of the prompt. */
    static const uint32_t from[] = {0, 16, 500, 511, 512, 1000, 1084};
    for (size_t i = 0; i < KVO_ARRAY_LEN(from); i++) {
        memset(tok2, 0xff, 16 * sizeof(uint64_t));
        mock_trace_tokens_at(ids, from[i], 16, tok2);
        ck_assert(memcmp(tok + from[i], tok2, 16 * sizeof(uint64_t)) == 0);
    }
    /* input_length must fall in (512 (k-1), 512 k]. */
    ck_assert_int_eq(mock_trace_validate(ids, 3, 1024), KVO_EPROTO);
    ck_assert_int_eq(mock_trace_validate(ids, 3, 1025), KVO_OK);
    ck_assert_int_eq(mock_trace_validate(ids, 3, 1536), KVO_OK);
    ck_assert_int_eq(mock_trace_validate(ids, 3, 1537), KVO_EPROTO);
    ck_assert_int_eq(mock_trace_validate(ids, 0, 1), KVO_EPROTO);
    kvo_free(tok);
    kvo_free(tok2);
}
END_TEST

START_TEST(malformed_lines_are_counted_and_skipped_never_fatal) {
    char *dir = kt_tmpdir("trace");
    char path[600];
    snprintf(path, sizeof(path), "%s/bad.jsonl", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, "
          "\"hash_ids\": [1, 2], \"extra\": {\"ignored\": true}}\n",
          f);                      /* 1 ok */
    fputs("not json at all\n", f); /* 2 */
    fputs("[1, 2, 3]\n", f);       /* 3 */
    fputs("{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1}\n",
          f);
    fputs("{\"timestamp\": 1, \"input_length\": 513, \"output_length\": 1, "
          "\"hash_ids\": [1]}\n",
          f); /* 5 */
    fputs("{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, "
          "\"hash_ids\": [-4]}\n",
          f); /* 6 */
    fputs("{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 0, "
          "\"hash_ids\": [4]}\n",
          f);            /* 7 */
    fputs("\n   \n", f); /* 8, 9 blank */
    fputs("{\"timestamp\": \"x\", \"input_length\": 10, \"output_length\": 1, "
          "\"hash_ids\": [4]}\n",
          f); /* 10 */
    /* 11: a line far over the limit (a huge hash id list) */
    fputs("{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, "
          "\"hash_ids\": [",
          f);
    for (int i = 0; i < 900000; i++) fputs("12345,", f);
    fputs("1]}\n", f);
    fputs("{\"timestamp\": 7.5, \"input_length\": 4, \"output_length\": 2, "
          "\"hash_ids\": [9]}",
          f); /* 12 ok, no final newline */
    fclose(f);
    mock_trace *t;
    ck_assert_int_eq(mock_trace_open(&t, path), KVO_OK);
    mock_trace_req r;
    char msg[256];
    uint64_t ok_lines[4];
    int ok = 0, bad = 0;
    for (;;) {
        kvo_status st = mock_trace_next(t, &r, msg, sizeof(msg));
        if (st == KVO_EOF) break;
        if (st == KVO_OK) {
            ck_assert_int_lt(ok, 4);
            ok_lines[ok++] = r.line;
            continue;
        }
        ck_assert(st == KVO_EPROTO || st == KVO_ETOOBIG);
        ck_assert_msg(strncmp(msg, "line ", 5) == 0,
                      "message names the line: %s", msg);
        bad++;
    }
    ck_assert_int_eq(ok, 2);
    ck_assert_uint_eq(ok_lines[0], 1);
    ck_assert_uint_eq(ok_lines[1], 12);
    ck_assert(r.timestamp_ms == 7.5 && r.input_length == 4 &&
              r.hash_ids[0] == 9);
    ck_assert_int_eq(bad, 8);
    ck_assert_uint_eq(mock_trace_malformed(t), 8);
    mock_trace_free(t);
    ck_assert_int_eq(mock_trace_open(&t, "/nonexistent/trace.jsonl"),
                     KVO_ENOTFOUND);
    remove(path);
    rmdir(dir);
    kvo_free(dir);
}
END_TEST

Suite *suite_trace(void) {
    const TTest *tests[] = {
        reader_returns_every_request_of_the_bundled_1000_line_trace,
        prompt_is_the_trace_blocks_tokens_cut_to_input_length,
        malformed_lines_are_counted_and_skipped_never_fatal,
    };
    return mt_suite(suite_create("trace"), 120, tests, KVO_ARRAY_LEN(tests));
}
