/* fuzz_query.c -- libFuzzer target for the indexer's request reader
 * (idx_request_parse: the bodies of POST /query and /query_by_hash and
 * replay's query lines, wait clause included).
 *
 * Every input is read three ways (as /query, as /query_by_hash, as a
 * replay line). Each read must return, within kvo_json's memory budget.
 * A refusal leaves an empty request and a message. An accepted request
 * must be of a kind it was asked for, hold what its kind promises (token
 * ids below 2^32, at most IDX_WAIT_MAX_PAIRS pairs, a timeout in range),
 * and, written back as a canonical body, read again to the same request
 * (abort otherwise).
 *
 * Built by tests/fuzz/CMakeLists.txt; replayed over the corpus and the
 * crash files by tests/indexer/test_fuzz_query.c (KVO_FUZZ_REPLAY).
 */
#include "idx_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QFUZZ_CHECK(c)                                                         \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_query: check failed: %s (line %d)\n", #c,    \
                    __LINE__);                                                 \
            abort();                                                           \
        }                                                                      \
    } while (0)

int kvo_fuzz_query(const uint8_t *data, size_t size);

static void qwrite_str(kvo_buf *b, const char *s) {
    kvo_buf_append(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            kvo_buf_printf(b, "\\%c", c);
        else if (c < 0x20)
            kvo_buf_printf(b, "\\u%04x", c);
        else
            kvo_buf_append(b, s, 1);
    }
    kvo_buf_append(b, "\"", 1);
}

/* q as the one canonical body that means it. */
static void qwrite(kvo_buf *b, const idx_request *q) {
    if (q->kind == IDX_REQ_APPLY) {
        kvo_buf_printf(b, "{\"apply\":%" PRIu64 "}", q->apply);
        return;
    }
    kvo_buf_printf(b, "{\"%s\":[",
                   q->kind == IDX_REQ_TOKENS ? "token_ids" : "tokens_hashes");
    for (size_t i = 0; i < q->n; i++)
        kvo_buf_printf(b, "%s%" PRIu64, i ? "," : "", q->v[i]);
    kvo_buf_append(b, "]", 1);
    if (q->lora) {
        kvo_buf_append(b, ",\"lora_name\":", 13);
        qwrite_str(b, q->lora);
    }
    if (q->salt) {
        kvo_buf_append(b, ",\"cache_salt\":", 14);
        qwrite_str(b, q->salt);
    }
    if (q->metrics) kvo_buf_printf(b, ",\"metrics\":true");
    if (q->wait) {
        kvo_buf_printf(b, ",\"wait\":{\"timeout_ms\":%" PRIu32 ",\"zmq_seq\":[",
                       q->timeout_ms);
        for (size_t i = 0; i < q->n_pairs; i++)
            kvo_buf_printf(b, "%s[%" PRIu64 ",%" PRIu64 "]", i ? "," : "",
                           q->pairs[2 * i], q->pairs[2 * i + 1]);
        kvo_buf_append(b, "]}", 2);
    }
    kvo_buf_append(b, "}", 1);
}

static bool same_str(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* a and b are the same request. */
static bool qsame(const idx_request *a, const idx_request *b) {
    if (a->kind != b->kind || a->apply != b->apply || a->n != b->n ||
        a->metrics != b->metrics || a->wait != b->wait ||
        a->timeout_ms != b->timeout_ms || a->n_pairs != b->n_pairs ||
        !same_str(a->lora, b->lora) || !same_str(a->salt, b->salt))
        return false;
    if (a->n && memcmp(a->v, b->v, a->n * sizeof(*a->v)) != 0) return false;
    return !a->n_pairs ||
           memcmp(a->pairs, b->pairs, 2 * a->n_pairs * sizeof(*a->pairs)) == 0;
}

static void check_one(const uint8_t *data, size_t size, unsigned accept) {
    idx_request q;
    idx_request_init(&q);
    kvo_err err;
    memset(&err, 0, sizeof(err));
    kvo_status st = idx_request_parse(&q, data, size, accept, &err);
    QFUZZ_CHECK(q.doc.mem <= size * 16 + (64u << 10));
    if (st != KVO_OK) {
        QFUZZ_CHECK(err.status == st && err.msg[0] != '\0');
        QFUZZ_CHECK(q.kind == 0 && q.n == 0 && !q.wait);
        idx_request_fini(&q);
        return;
    }
    QFUZZ_CHECK(q.kind & accept);
    QFUZZ_CHECK(q.kind == IDX_REQ_TOKENS || q.kind == IDX_REQ_HASHES ||
                q.kind == IDX_REQ_APPLY);
    QFUZZ_CHECK(q.n == 0 || q.v != NULL);
    for (size_t i = 0; q.kind == IDX_REQ_TOKENS && i < q.n; i++)
        QFUZZ_CHECK(q.v[i] <= UINT32_MAX);
    QFUZZ_CHECK(q.kind == IDX_REQ_TOKENS || (!q.lora && !q.salt));
    QFUZZ_CHECK(q.wait || (q.n_pairs == 0 && q.timeout_ms == 0));
    QFUZZ_CHECK(q.n_pairs <= IDX_WAIT_MAX_PAIRS);
    QFUZZ_CHECK(q.timeout_ms <= IDX_WAIT_MAX_MS);
    QFUZZ_CHECK(q.n_pairs == 0 || q.pairs != NULL);
    kvo_buf b;
    kvo_buf_init(&b);
    qwrite(&b, &q);
    QFUZZ_CHECK(kvo_buf_cstr(&b) == KVO_OK);
    idx_request again;
    idx_request_init(&again);
    kvo_status st2 = idx_request_parse(&again, b.data, b.len, accept, &err);
    if (st2 != KVO_OK)
        fprintf(stderr, "fuzz_query: %s: %s\n", (const char *)b.data, err.msg);
    QFUZZ_CHECK(st2 == KVO_OK);
    QFUZZ_CHECK(qsame(&q, &again));
    idx_request_fini(&again);
    kvo_buf_fini(&b);
    idx_request_fini(&q);
}

int kvo_fuzz_query(const uint8_t *data, size_t size) {
    check_one(data, size, IDX_REQ_TOKENS);
    check_one(data, size, IDX_REQ_HASHES);
    check_one(data, size, IDX_REQ_TOKENS | IDX_REQ_HASHES | IDX_REQ_APPLY);
    return 0;
}

#ifndef KVO_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return kvo_fuzz_query(data, size);
}
#endif
