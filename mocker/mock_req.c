/* mock_req.c -- one engine request (vLLM's Request) and the two containers
 * the scheduler keeps them in: a vector (running, this step's scheduled) and
 * a ring-buffer deque (waiting; preempted requests go back to its front).
 *
 * A request is created by the engine (mock_engine_add), then owned by the
 * scheduler's queues until it finishes or is aborted, when req_free (or
 * req_abort_deliver) ends it. Its tokens and block hashes are filled in
 * lazily, when it first competes for admission (req_materialize): both are
 * pure functions of the request, so when they are computed changes
 * nothing, and a long waiting queue of trace requests then holds only their
 * hash ids.
 */
#include "mock_int.h"

#include <string.h>

/* Generated tokens are uniform over the trace vocabulary. */
#define SAMPLE_VOCAB MOCK_TRACE_VOCAB
/* Odd constant that spreads request ids over the 64-bit rng seed space. */
#define REQ_RNG_MULT 0xD1B54A32D192ED03ull
/* The rank goes in the seed's top bits, above any realistic request id. */
#define REQ_RNG_RANK_SHIFT 48

static uint64_t *memdup_u64(const uint64_t *p, uint32_t n) {
    uint64_t *d = kvo_malloc((size_t)n * sizeof(uint64_t));
    if (d) memcpy(d, p, (size_t)n * sizeof(uint64_t));
    return d;
}

/* The items and their ids in one allocation (freed with kvo_free). */
static mock_mm_item *mm_copy(const mock_mm_item *mm, uint32_t n) {
    size_t ids = 0;
    for (uint32_t i = 0; i < n; i++) ids += strlen(mm[i].id) + 1;
    mock_mm_item *c = kvo_malloc((size_t)n * sizeof(*c) + ids);
    if (!c) return NULL;
    char *p = (char *)(c + n);
    for (uint32_t i = 0; i < n; i++) {
        size_t len = strlen(mm[i].id) + 1;
        memcpy(p, mm[i].id, len);
        c[i] = (mock_mm_item){mm[i].offset, mm[i].length, p};
        p += len;
    }
    return c;
}

mock_keys req_keys(const mock_req *r) {
    return (mock_keys){r->lora, r->salt, r->mm, r->n_mm};
}

kvo_status req_new(mock_req **out, const mock_req_in *in, uint32_t max_tokens,
                   uint32_t block_size, uint64_t id, uint64_t seed,
                   uint32_t rank, uint32_t n_groups) {
    kvo_status st = KVO_ENOMEM;
    bool trace = in->trace.hash_ids && in->trace.n_hash_ids;
    uint32_t bs = block_size;
    mock_req *r = kvo_calloc(1, sizeof(*r));
    if (!r) return KVO_ENOMEM;
    r->cap_tokens = in->n_tokens + max_tokens;
    r->cap_bh = r->cap_tokens / bs + 1;
    r->cap_blocks = (r->cap_tokens + bs - 1) / bs;
    r->blocks = kvo_malloc((size_t)r->cap_blocks * sizeof(uint32_t));
    if (!r->blocks) goto fail;
    r->n_grp = n_groups > 1 ? n_groups - 1 : 0;
    for (uint32_t g = 0; g < r->n_grp; g++)
        if (!(r->grp[g].blocks =
                  kvo_malloc((size_t)r->cap_blocks * sizeof(uint32_t))))
            goto fail;
    if (in->tokens) {
        r->tokens = kvo_malloc((size_t)r->cap_tokens * sizeof(uint64_t));
        if (!r->tokens) goto fail;
        memcpy(r->tokens, in->tokens, (size_t)in->n_tokens * sizeof(uint64_t));
    }
    if (trace) {
        /* Kept for the hash memo (and the tokens when none were given). */
        r->trace_ids = memdup_u64(in->trace.hash_ids, in->trace.n_hash_ids);
        if (!r->trace_ids) goto fail;
        r->n_trace = in->trace.n_hash_ids;
    }
    r->n_tokens = r->n_prompt = in->n_tokens;
    r->max_tokens = max_tokens;
    r->num_cached_tokens = -1;
    r->remote_prefill = in->remote_prefill;
    r->on_output = in->on_output;
    r->user = in->user;
    if (in->lora_name && *in->lora_name &&
        !(r->lora = kvo_strdup(in->lora_name)))
        goto fail;
    if (in->cache_salt && *in->cache_salt &&
        !(r->salt = kvo_strdup(in->cache_salt)))
        goto fail;
    if (in->n_mm && !(r->mm = mm_copy(in->mm, in->n_mm))) goto fail;
    r->n_mm = in->n_mm;
    r->id = id;
    r->rng =
        seed ^ ((uint64_t)rank << REQ_RNG_RANK_SHIFT) ^ (id * REQ_RNG_MULT);
    kvo_splitmix64(&r->rng);
    r->status = REQ_WAITING;
    *out = r;
    return KVO_OK;
fail:
    req_free(r);
    return st;
}

void req_free(mock_req *r) {
    if (!r) return;
    kvo_free(r->trace_ids);
    kvo_free(r->tokens);
    kvo_free(r->bh);
    kvo_free(r->blocks);
    for (uint32_t g = 0; g < r->n_grp; g++) kvo_free(r->grp[g].blocks);
    kvo_free(r->lora);
    kvo_free(r->salt);
    kvo_free(r->mm);
    kvo_free(r);
}

kvo_status req_materialize(mock_req *r, const mock_cfg *cfg, mock_hasher *h) {
    if (r->materialized) return KVO_OK;
    uint32_t bs = cfg->block_size;
    if (!r->tokens) {
        r->tokens = kvo_malloc((size_t)r->cap_tokens * sizeof(uint64_t));
        if (!r->tokens) return KVO_ENOMEM;
        mock_trace_tokens(r->trace_ids, r->n_trace, r->n_prompt, r->tokens);
    }
    if (cfg->prefix_caching) {
        if (!r->bh) {
            r->bh = kvo_malloc((size_t)r->cap_bh * sizeof(mock_hash));
            if (!r->bh) return KVO_ENOMEM;
        }
        uint32_t nb = r->n_prompt / bs;
        mock_trace_ref tr = {r->trace_ids, r->n_trace};
        mock_keys k = req_keys(r);
        kvo_status st =
            mock_hasher_blocks_keys(h, r->tokens, bs, 0, nb, NULL, &k,
                                    r->trace_ids ? &tr : NULL, r->bh);
        if (st != KVO_OK) return st;
        r->n_bh = nb;
    }
    kvo_free(r->trace_ids);
    r->trace_ids = NULL;
    r->n_trace = 0;
    r->materialized = true;
    return KVO_OK;
}

kvo_status req_append_token(mock_req *r, const mock_cfg *cfg, mock_hasher *h,
                            uint64_t tok) {
    uint32_t bs = cfg->block_size;
    if (r->n_tokens == r->cap_tokens) return KVO_ESTATE; /* sized at add */
    r->tokens[r->n_tokens++] = tok;
    /* vLLM's request.block_hashes grows as tokens fill blocks. */
    if (cfg->prefix_caching && r->n_tokens % bs == 0) {
        uint32_t blk = r->n_tokens / bs - 1;
        if (blk != r->n_bh) return KVO_ESTATE;
        mock_keys k = req_keys(r);
        kvo_status st = mock_hasher_blocks_keys(h, r->tokens, bs, blk, 1,
                                                blk ? &r->bh[blk - 1] : NULL,
                                                &k, NULL, &r->bh[blk]);
        if (st != KVO_OK) return st;
        r->n_bh++;
    }
    return KVO_OK;
}

uint64_t req_sample_token(mock_req *r) {
    return kvo_splitmix64(&r->rng) % SAMPLE_VOCAB;
}

void req_abort_deliver(mock_req *r) {
    mock_output o = {.req_id = r->id,
                     .n_output = r->n_tokens - r->n_prompt,
                     .finish = MOCK_FINISH_ABORTED,
                     .cached_tokens = r->num_cached_tokens > 0
                                          ? (uint32_t)r->num_cached_tokens
                                          : 0,
                     .n_prompt = r->n_prompt};
    if (r->on_output) r->on_output(r->user, &o);
    req_free(r);
}

/* ---- containers -----------------------------------------------------------*/

/* First capacity of the request vectors and the waiting deque. */
#define REQ_FIRST_CAP 64

kvo_status req_vec_push(req_vec *v, mock_req *r) {
    kvo_status st =
        kvo_grow(&v->v, &v->cap, v->n + 1, sizeof(*v->v), REQ_FIRST_CAP);
    if (st != KVO_OK) return st;
    v->v[v->n++] = r;
    return KVO_OK;
}

kvo_status req_deque_push(req_deque *d, mock_req *r, bool front) {
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : REQ_FIRST_CAP;
        mock_req **v = kvo_malloc(cap * sizeof(*v));
        if (!v) return KVO_ENOMEM;
        for (uint32_t i = 0; i < d->n; i++) v[i] = d->v[(d->head + i) % d->cap];
        kvo_free(d->v);
        d->v = v;
        d->head = 0;
        d->cap = cap;
    }
    if (front) {
        d->head = (d->head + d->cap - 1) % d->cap;
        d->v[d->head] = r;
    } else {
        d->v[(d->head + d->n) % d->cap] = r;
    }
    d->n++;
    return KVO_OK;
}

mock_req *req_deque_at(const req_deque *d, uint32_t i) {
    return d->v[(d->head + i) % d->cap];
}

mock_req *req_deque_pop_front(req_deque *d) {
    mock_req *r = d->v[d->head];
    d->head = (d->head + 1) % d->cap;
    d->n--;
    return r;
}

void req_deque_remove(req_deque *d, uint32_t i) {
    for (uint32_t j = i; j + 1 < d->n; j++)
        d->v[(d->head + j) % d->cap] = d->v[(d->head + j + 1) % d->cap];
    d->n--;
}
