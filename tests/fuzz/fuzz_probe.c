/* fuzz_probe.c -- libFuzzer target for kvo-mocker's probe body parser
 * (mock_probe_parse, mocker/mock_request.c), and the reset body check
 * (mock_reset_parse) beside it.
 *
 * For every input, under small limits: the parse returns; a refusal is a
 * 4xx kind (EPROTO, ETRUNC, ETOOBIG, EINVAL) or ENOMEM with a message and
 * leaves the probe empty; an accepted probe holds one prompt of 1..max_len tokens (every id below the
 * vocabulary, or a valid trace form) and no empty LoRA or salt; the tree
 * stays within its budget; parsing again into used storage gives the same
 * probe; a body the probe reads as an object is a valid reset body
 * (abort otherwise).
 *
 * Built by tests/fuzz/CMakeLists.txt; replayed over the corpus and the
 * crash files by tests/mocker/test_request.c (KVO_FUZZ_REPLAY).
 */
#include "mock_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PFUZZ_CHECK(c)                                                         \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_probe: check failed: %s (line %d)\n", #c,    \
                    __LINE__);                                                 \
            abort();                                                           \
        }                                                                      \
    } while (0)

int kvo_fuzz_probe(const uint8_t *data, size_t size);

static const mock_req_limits pfuzz_lim = {
    .max_len = 4096, .vocab_size = 50000, .n_ranks = 1};

/* A probe that leaves every field of the storage set. */
static const char pfuzz_other[] =
    "{\"token_ids\": [1, 2, 3], \"lora_name\": \"l\", \"cache_salt\": \"s\", "
    "\"warm\": true}";

static bool pfuzz_same(const mock_probe_req *a, const mock_probe_req *b) {
    const mock_prompt *x = &a->prompt, *y = &b->prompt;
    return a->warm == b->warm && !a->lora == !b->lora && !a->salt == !b->salt &&
           (!a->lora || strcmp(a->lora, b->lora) == 0) &&
           (!a->salt || strcmp(a->salt, b->salt) == 0) && x->n == y->n &&
           x->n_trace == y->n_trace && !x->tok == !y->tok &&
           (!x->tok || memcmp(x->tok, y->tok, x->n * sizeof(uint64_t)) == 0) &&
           (!x->trace_ids || memcmp(x->trace_ids, y->trace_ids,
                                    x->n_trace * sizeof(uint64_t)) == 0);
}

int kvo_fuzz_probe(const uint8_t *data, size_t size) {
    mock_probe_req p, again;
    mock_probe_req_init(&p);
    mock_probe_req_init(&again);
    kvo_err err;
    kvo_status st = mock_probe_parse(&p, data, size, &pfuzz_lim, &err);
    PFUZZ_CHECK(p.doc.mem <= size * 16 + (64u << 10));
    kvo_status rst = mock_reset_parse(data, size, NULL);
    if (st != KVO_OK) {
        PFUZZ_CHECK(st == KVO_EPROTO || st == KVO_ETRUNC || st == KVO_ETOOBIG ||
                    st == KVO_EINVAL || st == KVO_ENOMEM);
        PFUZZ_CHECK(err.status == st && err.msg[0] != '\0');
        PFUZZ_CHECK(p.prompt.n == 0 && !p.prompt.tok && !p.prompt.trace_ids &&
                    !p.lora && !p.salt &&
                    !p.warm); /* a refused body leaves nothing */
    } else {
        const mock_prompt *q = &p.prompt;
        PFUZZ_CHECK(q->n >= 1 && q->n <= pfuzz_lim.max_len);
        if (q->trace_ids) {
            PFUZZ_CHECK(q->tok == NULL);
            PFUZZ_CHECK(mock_trace_validate(q->trace_ids, q->n_trace, q->n) ==
                        KVO_OK);
        } else {
            PFUZZ_CHECK(q->tok != NULL && q->n_trace == 0);
            for (uint32_t i = 0; i < q->n; i++)
                PFUZZ_CHECK(q->tok[i] < pfuzz_lim.vocab_size);
        }
        PFUZZ_CHECK(!p.lora || *p.lora);
        PFUZZ_CHECK(!p.salt || *p.salt);
        PFUZZ_CHECK(rst == KVO_OK || rst == KVO_ENOMEM);
        PFUZZ_CHECK(mock_probe_parse(&again, pfuzz_other, strlen(pfuzz_other),
                                     &pfuzz_lim, NULL) == KVO_OK);
        PFUZZ_CHECK(mock_probe_parse(&again, data, size, &pfuzz_lim, NULL) ==
                    KVO_OK);
        PFUZZ_CHECK(pfuzz_same(&p, &again));
    }
    mock_probe_req_fini(&p);
    mock_probe_req_fini(&again);
    return 0;
}

#ifndef KVO_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return kvo_fuzz_probe(data, size);
}
#endif
