/* mock_sched.c -- vLLM v1's Scheduler.schedule() / update_from_output() and
 * KVCacheManager (get_computed_blocks, allocate_slots, cache_blocks, free)
 * for one full-attention KV cache group, plus the step timing model.
 *
 * One step:
 *   1. running requests in order, each asking for min(remaining tokens,
 *      token budget) slots; when the pool cannot supply the blocks, the
 *      newest running request (the list's last) is preempted -- its blocks
 *      freed tail first, its progress reset (recompute), and it goes to the
 *      front of the waiting queue -- until the request fits or preempted
 *      itself;
 *   2. only if nobody was preempted: waiting requests in order while a seat
 *      (--max-num-seqs) and budget remain: prefix hit (leading cached
 *      blocks, capped at (num_tokens - 1) // block_size), then
 *      allocate_slots; the first that does not fit stops admission;
 *   3. every scheduled request's num_computed advances by its tokens.
 * allocate_slots touches the hit blocks, pops new blocks (evicting cached
 * ones: BlockRemoved) and caches every block the scheduled tokens complete
 * (BlockStored) -- so chunked prefill stores each chunk's full blocks and a
 * decode stores the block its token completes.
 *
 * complete(): each scheduled request whose tokens are all computed samples
 * one token (vLLM discards samples of partial prefill chunks); a request
 * reaching max_tokens (or max_model_len) finishes and frees its blocks tail
 * first. So n prompt tokens + m generated -> KV computed for n + m - 1.
 *
 * Timing (DESIGN §8, ms): prefill 4.209989e-7 t^2 + 0.01518344 t + 16.50142
 * for the t new prompt tokens of the step; decode max(1, -25.74 u^2 +
 * 54.01 u + 5.74) when some request decodes, u = fraction of blocks in
 * use; a decode-role request whose prompt KV is received costs
 * --kv-transfer-ms-per-block per block instead of prefill. The parts add.
 */
#include "mock_int.h"

#include <string.h>

static kvo_status vec_push(req_vec *v, mock_req *r) {
    kvo_status st = kvo_grow(&v->v, &v->cap, v->n + 1, sizeof(*v->v), 64);
    if (st != KVO_OK) return st;
    v->v[v->n++] = r;
    return KVO_OK;
}

/* KVCacheManager.free: blocks released in reverse (tail first) so that the
 * request's deepest blocks become the next eviction candidates. */
void sched_free_req(mock_engine *e, mock_req *r) {
    for (uint32_t k = r->n_blocks; k-- > 0;)
        pool_release(&e->pool, &r->blocks[k], 1);
    r->n_blocks = 0;
    r->num_cached_block = 0;
}

/* get_computed_blocks: leading cached blocks, capped at (n - 1) // bs, into
 * r->blocks (unused while the request waits). vLLM counts the query on
 * every attempt (prefix-cache stats).
 *
 * A waiting request that does not fit is retried every step, and a just-
 * preempted one has hundreds of hits (its own freed blocks), so the ids of
 * the last attempt are kept and revalidated first: a block that is still
 * cached under the same key and is its key's oldest copy is exactly what
 * the lookup would return -- a plain array read instead of a hash probe. */
static uint32_t computed_blocks(mock_engine *e, mock_req *r) {
    if (!e->cfg.prefix_caching) return 0;
    uint32_t bs = e->cfg.block_size;
    uint32_t cap = (r->n_tokens - 1) / bs;
    if (cap > r->n_bh) cap = r->n_bh;
    uint32_t *ids = r->blocks;
    uint32_t n = 0;
    uint32_t known = r->n_hit_ids < cap ? r->n_hit_ids : cap;
    const pool_block *pb = e->pool.blocks;
    while (n < known) {
        const pool_block *b = &pb[ids[n]];
        if (!b->cached || b->key != r->bh[n].key || b->cprev != MOCK_NIL) break;
        n++;
    }
    while (n < cap) {
        uint32_t id = pool_lookup(&e->pool, r->bh[n].key);
        if (id == MOCK_NIL) break;
        ids[n++] = id;
    }
    r->n_hit_ids = n;
    if (r->num_preemptions == 0) {
        e->st.prefix_queries += r->n_tokens;
        e->st.prefix_hits += (uint64_t)n * bs;
    }
    return n;
}

/* allocate_slots. *ok = false (nothing changed) when the pool cannot supply
 * the blocks. */
static kvo_status allocate_slots(mock_engine *e, mock_req *r,
                                 uint32_t num_new, uint32_t new_computed,
                                 const uint32_t *hit, uint32_t n_hit,
                                 bool decode, bool *ok) {
    mock_pool *p = &e->pool;
    uint32_t bs = e->cfg.block_size;
    uint64_t num_computed = (uint64_t)r->num_computed + new_computed;
    uint64_t need = num_computed + num_new;
    if (need > e->max_model_len) need = e->max_model_len;
    uint32_t required = (uint32_t)((need + bs - 1) / bs);
    uint32_t have = n_hit + r->n_blocks;
    uint32_t n_new = required > have ? required - have : 0;
    uint32_t evictable = 0;
    for (uint32_t k = 0; k < n_hit; k++)
        if (p->blocks[hit[k]].ref == 0) evictable++;
    *ok = false;
    if ((uint64_t)n_new + evictable > p->n_free) return KVO_OK;
    if (r->n_blocks + n_hit + n_new > r->cap_blocks) return KVO_ESTATE;
    *ok = true;
    if (n_hit) {
        pool_touch(p, hit, n_hit);
        if (hit != r->blocks + r->n_blocks)
            memcpy(r->blocks + r->n_blocks, hit, n_hit * sizeof(uint32_t));
        r->n_blocks += n_hit;
        r->num_cached_block = n_hit; /* a new request's computed blocks */
    }
    if (n_new) {
        pool_alloc(p, n_new, r->blocks + r->n_blocks);
        r->n_blocks += n_new;
    }
    if (!e->cfg.prefix_caching) return KVO_OK;
    uint64_t to_cache = num_computed + num_new;
    if (to_cache > r->n_tokens) to_cache = r->n_tokens;
    uint32_t full = (uint32_t)(to_cache / bs);
    if (r->num_cached_block >= full) return KVO_OK;
    uint32_t first = r->num_cached_block;
    for (uint32_t k = first; k < full; k++)
        pool_cache(p, r->blocks[k], &r->bh[k], k ? &r->bh[k - 1] : NULL);
    r->num_cached_block = full;
    return eng_ev_stored(e, r, first, full - first, decode);
}

static kvo_status mark_scheduled(mock_engine *e, mock_req *r, uint32_t n,
                                 bool decode) {
    r->sched_tokens = n;
    r->sched_decode = decode;
    kvo_status st = vec_push(&e->scheduled, r);
    if (st != KVO_OK) return st;
    if (!r->started) {
        r->started = true;
        st = kvo_grow(&e->started, &e->cap_started, e->n_started + 1,
                      sizeof(*e->started), 64);
        if (st != KVO_OK) return st;
        e->started[e->n_started++] = r->user;
    }
    return KVO_OK;
}

static kvo_status preempt(mock_engine *e, mock_req *v) {
    sched_free_req(e, v);
    v->status = REQ_PREEMPTED;
    v->num_computed = 0;
    v->num_preemptions++;
    e->st.preemptions++;
    return eng_deque_push(&e->waiting, v, true); /* prepend_request */
}

static bool is_decode(const mock_req *r, uint32_t num_new) {
    return num_new == 1 && r->num_computed >= r->n_prompt &&
           r->num_computed + 1 == r->n_tokens;
}

static double prefill_ms(double t) {
    return 4.209989e-7 * t * t + 0.01518344 * t + 16.50142;
}

static double decode_ms(double u) {
    double d = -25.74 * u * u + 54.01 * u + 5.74;
    return d < 1.0 ? 1.0 : d;
}

kvo_status sched_step(mock_engine *e, mock_step *out) {
    memset(out, 0, sizeof(*out));
    e->scheduled.n = 0;
    e->n_started = 0;
    uint32_t budget = e->cfg.max_num_batched_tokens;
    uint32_t preempted = 0;
    kvo_status st = KVO_OK;
    bool ok;

    /* 1. running requests */
    for (uint32_t i = 0; i < e->running.n && budget > 0;) {
        mock_req *r = e->running.v[i];
        uint32_t num_new = r->n_tokens - r->num_computed;
        if (num_new > budget) num_new = budget;
        uint32_t room = e->max_model_len - 1 > r->num_computed
                            ? e->max_model_len - 1 - r->num_computed
                            : 0;
        if (num_new > room) num_new = room;
        if (num_new == 0) {
            i++;
            continue;
        }
        bool decode = is_decode(r, num_new);
        bool scheduled = true;
        for (;;) {
            st = allocate_slots(e, r, num_new, 0, NULL, 0, decode, &ok);
            if (st != KVO_OK) return st;
            if (ok) break;
            mock_req *victim = e->running.v[--e->running.n];
            if ((st = preempt(e, victim)) != KVO_OK) return st;
            preempted++;
            if (victim == r) {
                scheduled = false;
                break;
            }
        }
        if (!scheduled) break;
        if ((st = mark_scheduled(e, r, num_new, decode)) != KVO_OK) return st;
        budget -= num_new;
        i++;
    }

    /* 2. waiting requests, only when nothing was preempted */
    while (preempted == 0 && e->waiting.n > 0 && budget > 0 &&
           e->running.n < e->cfg.max_num_seqs) {
        req_deque *d = &e->waiting;
        mock_req *r = d->v[d->head];
        uint32_t bs = e->cfg.block_size;
        if ((st = eng_req_materialize(e, r)) != KVO_OK) return st;
        uint32_t n_hit = computed_blocks(e, r);
        uint32_t num_computed = n_hit * bs;
        uint32_t num_new = r->n_tokens - num_computed;
        if (num_new > budget) num_new = budget;
        st = allocate_slots(e, r, num_new, num_computed, r->blocks, n_hit,
                            false, &ok);
        if (st != KVO_OK) return st;
        if (!ok) break;
        d->head = (d->head + 1) % d->cap;
        d->n--;
        if ((st = vec_push(&e->running, r)) != KVO_OK) return st;
        r->status = REQ_RUNNING;
        r->n_hit_ids = 0;
        r->num_computed = num_computed;
        if (r->num_cached_tokens < 0) r->num_cached_tokens = num_computed;
        if ((st = mark_scheduled(e, r, num_new, false)) != KVO_OK) return st;
        budget -= num_new;
    }

    /* 3. update_after_schedule, and the step's modeled duration */
    uint64_t prefill_tokens = 0, transfer_blocks = 0;
    uint32_t decode_reqs = 0;
    for (uint32_t i = 0; i < e->scheduled.n; i++) {
        mock_req *r = e->scheduled.v[i];
        if (r->sched_decode) decode_reqs++;
        else if (r->remote_prefill && e->cfg.role == MOCK_ROLE_DECODE)
            transfer_blocks += (r->sched_tokens + e->cfg.block_size - 1) /
                               e->cfg.block_size;
        else prefill_tokens += r->sched_tokens;
        r->num_computed += r->sched_tokens;
        e->st.computed_tokens += r->sched_tokens;
    }
    out->n_scheduled = e->scheduled.n;
    out->prefill_tokens = (uint32_t)prefill_tokens;
    out->decode_reqs = decode_reqs;
    out->preempted = preempted;
    out->idle = e->scheduled.n == 0;
    double ms = 0;
    if (prefill_tokens) ms += prefill_ms((double)prefill_tokens);
    if (decode_reqs) ms += decode_ms(pool_usage(&e->pool));
    ms += (double)transfer_blocks * e->cfg.kv_transfer_ms_per_block;
    out->duration_ms = ms;
    out->started = e->started;
    out->n_started = e->n_started;
    if (!out->idle) {
        e->step_open = true;
        e->st.steps++;
    }
    return KVO_OK;
}

void sched_complete(mock_engine *e) {
    e->step_open = false;
    bool removed = false;
    for (uint32_t i = 0; i < e->scheduled.n; i++) {
        mock_req *r = e->scheduled.v[i];
        r->sched_tokens = 0;
        if (r->aborted) {
            sched_free_req(e, r);
            r->status = REQ_FINISHED;
            removed = true;
            continue;
        }
        if (r->num_computed < r->n_tokens) continue; /* partial prefill */
        uint64_t tok = eng_sample_token(r);
        if (eng_req_append_token(e, r, tok) != KVO_OK) {
            r->aborted = true; /* cannot happen: sized at add */
            sched_free_req(e, r);
            r->status = REQ_FINISHED;
            removed = true;
            continue;
        }
        e->st.generated_tokens++;
        uint32_t n_out = r->n_tokens - r->n_prompt;
        bool done = n_out >= r->max_tokens || r->n_tokens >= e->max_model_len;
        mock_output o = {
            .req_id = r->id,
            .token = tok,
            .has_token = true,
            .n_output = n_out,
            .finish = done ? MOCK_FINISH_LENGTH : MOCK_FINISH_NONE,
            .cached_tokens = r->num_cached_tokens > 0
                                 ? (uint32_t)r->num_cached_tokens
                                 : 0,
            .n_prompt = r->n_prompt,
            .block_ids = r->blocks,
            .n_blocks = r->n_blocks};
        if (r->on_output) r->on_output(r->user, &o);
        if (done) {
            sched_free_req(e, r);
            r->status = REQ_FINISHED;
            e->st.requests_finished++;
            removed = true;
        }
    }
    if (!removed) return;
    uint32_t k = 0;
    for (uint32_t i = 0; i < e->running.n; i++) {
        mock_req *r = e->running.v[i];
        if (r->status != REQ_FINISHED) {
            e->running.v[k++] = r;
            continue;
        }
        if (r->aborted) eng_abort_deliver(e, r); /* destroys */
        else eng_req_destroy(r);
    }
    e->running.n = k;
}
