/* fuzz_completions.c -- libFuzzer target for kvo-mocker's completion body
 * parser (mock_completion_parse, mocker/mock_request.c), both forms:
 * /v1/completions and /v1/chat/completions.
 *
 * For every input, under small limits: the parse returns; a refusal is a
 * 4xx kind (EPROTO, ETRUNC, ETOOBIG, EINVAL) or ENOMEM with a message and
 * leaves the request empty; an accepted request holds only what the handler may rely on (1..1024
 * prompts of 1..max_len tokens, every id below the vocabulary, a valid
 * trace form, max_tokens >= 1 within the context, a rank in range, no
 * empty LoRA or salt); memory stays within a small multiple of the input;
 * parsing again into the same storage gives the same request (abort
 * otherwise).
 *
 * Built by tests/fuzz/CMakeLists.txt; replayed over the corpus and the
 * crash files by tests/mocker/test_request.c (KVO_FUZZ_REPLAY).
 */
#include "mock_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFUZZ_CHECK(c)                                                         \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_completions: check failed: %s (line %d)\n",  \
                    #c, __LINE__);                                             \
            abort();                                                           \
        }                                                                      \
    } while (0)

int kvo_fuzz_completions(const uint8_t *data, size_t size);

/* Limits small enough for the fuzzer to reach every edge. */
static const mock_req_limits cfuzz_lim = {
    .max_len = 2048, .vocab_size = 50000, .n_ranks = 2};

/* Requests that leave every field of the storage set. */
static const char cfuzz_other[] =
    "{\"prompt\": [\"abc\", [1, 2]], \"lora_name\": \"l\", \"cache_salt\": "
    "\"s\", "
    "\"stream\": true, \"stream_options\": {\"include_usage\": true}, "
    "\"return_token_ids\": true, \"data_parallel_rank\": 1, \"max_tokens\": 7, "
    "\"kv_transfer_params\": {\"do_remote_prefill\": true}}";
static const char cfuzz_other_chat[] =
    "{\"messages\": [{\"role\": \"u\", \"content\": \"abc\"}], \"lora_name\": "
    "\"l\", "
    "\"cache_salt\": \"s\", \"stream\": true, \"data_parallel_rank\": 1}";

static bool cfuzz_refusal(kvo_status st) {
    return st == KVO_EPROTO || st == KVO_ETRUNC || st == KVO_ETOOBIG ||
           st == KVO_EINVAL || st == KVO_ENOMEM;
}

static void cfuzz_check_prompt(const mock_prompt *p) {
    CFUZZ_CHECK(p->n >= 1 && p->n <= cfuzz_lim.max_len);
    if (p->trace_ids) {
        CFUZZ_CHECK(p->tok == NULL);
        CFUZZ_CHECK(mock_trace_validate(p->trace_ids, p->n_trace, p->n) ==
                    KVO_OK);
        return;
    }
    CFUZZ_CHECK(p->tok != NULL && p->n_trace == 0);
    for (uint32_t i = 0; i < p->n; i++)
        CFUZZ_CHECK(p->tok[i] < cfuzz_lim.vocab_size);
}

static void cfuzz_check(const mock_completion_req *c, bool chat, size_t size) {
    CFUZZ_CHECK(c->n_prompts >= 1 && c->n_prompts <= MOCK_MAX_PROMPTS);
    CFUZZ_CHECK(!chat || c->n_prompts == 1);
    CFUZZ_CHECK(c->max_tokens >= 1 && c->max_tokens <= cfuzz_lim.max_len);
    for (uint32_t i = 0; i < c->n_prompts; i++) {
        cfuzz_check_prompt(&c->prompts[i]);
        CFUZZ_CHECK(c->prompts[i].n + c->max_tokens <= cfuzz_lim.max_len);
        CFUZZ_CHECK(!chat || c->prompts[i].trace_ids == NULL);
    }
    CFUZZ_CHECK(!c->has_rank || c->rank < cfuzz_lim.n_ranks);
    CFUZZ_CHECK(!c->lora || *c->lora);
    CFUZZ_CHECK(!c->salt || *c->salt);
    /* the chat template adds at most 6 bytes per message (of >= 11 bytes)
     * and 14 at the end; tokens take 8 bytes per byte of text; prompts[]
     * 1024 entries and the arena's rounding at most 64 KiB */
    CFUZZ_CHECK(c->text.len <= 2 * size + 14);
    CFUZZ_CHECK(c->arena.used_total <= 8 * size + (64u << 10));
}

/* The same request, field by field (the pointers into the tree aside). */
static bool cfuzz_same(const mock_completion_req *a,
                       const mock_completion_req *b) {
    if (a->n_prompts != b->n_prompts || a->max_tokens != b->max_tokens ||
        a->stream != b->stream || a->include_usage != b->include_usage ||
        a->return_token_ids != b->return_token_ids ||
        a->remote_prefill != b->remote_prefill || a->has_rank != b->has_rank ||
        a->rank != b->rank || !a->lora != !b->lora || !a->salt != !b->salt ||
        (a->lora && strcmp(a->lora, b->lora) != 0) ||
        (a->salt && strcmp(a->salt, b->salt) != 0))
        return false;
    for (uint32_t i = 0; i < a->n_prompts; i++) {
        const mock_prompt *x = &a->prompts[i], *y = &b->prompts[i];
        if (x->n != y->n || x->n_trace != y->n_trace || !x->tok != !y->tok ||
            (x->tok && memcmp(x->tok, y->tok, x->n * sizeof(uint64_t)) != 0) ||
            (x->trace_ids && memcmp(x->trace_ids, y->trace_ids,
                                    x->n_trace * sizeof(uint64_t)) != 0))
            return false;
    }
    return true;
}

int kvo_fuzz_completions(const uint8_t *data, size_t size) {
    for (int chat = 0; chat < 2; chat++) {
        mock_completion_req c, again;
        mock_completion_req_init(&c);
        mock_completion_req_init(&again);
        kvo_err err;
        kvo_status st =
            mock_completion_parse(&c, data, size, chat, &cfuzz_lim, &err);
        CFUZZ_CHECK(c.doc.mem <= size * 16 + (64u << 10));
        if (st != KVO_OK) {
            CFUZZ_CHECK(cfuzz_refusal(st));
            CFUZZ_CHECK(err.status == st && err.msg[0] != '\0');
            /* a refused body leaves nothing */
            CFUZZ_CHECK(c.n_prompts == 0 && c.prompts == NULL &&
                        c.max_tokens == 0);
            CFUZZ_CHECK(!c.lora && !c.salt && !c.stream && !c.has_rank);
        } else {
            cfuzz_check(&c, chat, size);
            /* parsed into storage another request used, it reads the same */
            const char *other = chat ? cfuzz_other_chat : cfuzz_other;
            CFUZZ_CHECK(mock_completion_parse(&again, other, strlen(other),
                                              chat, &cfuzz_lim,
                                              NULL) == KVO_OK);
            CFUZZ_CHECK(mock_completion_parse(&again, data, size, chat,
                                              &cfuzz_lim, NULL) == KVO_OK);
            CFUZZ_CHECK(cfuzz_same(&c, &again));
        }
        mock_completion_req_fini(&c);
        mock_completion_req_fini(&again);
    }
    return 0;
}

#ifndef KVO_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return kvo_fuzz_completions(data, size);
}
#endif
