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

/* Step timing (DESIGN §8): prefill ms = PREFILL_A t^2 + PREFILL_B t +
 * PREFILL_C; decode ms = max(DECODE_MIN, DECODE_A u^2 + DECODE_B u +
 * DECODE_C). */
#define PREFILL_A 4.209989e-7
#define PREFILL_B 0.01518344
#define PREFILL_C 16.50142
#define DECODE_A (-25.74)
#define DECODE_B 54.01
#define DECODE_C 5.74
#define DECODE_MIN 1.0

/* First capacity of the started-users array. */
#define STARTED_FIRST_CAP 64

/* pool_evict_fn: the offload to the CPU tier (its LRU eviction, its
 * store), then the GPU BlockRemoved. The copy is announced before the GPU
 * frees its block: an index detaches a node's children when its last
 * holder leaves (DESIGN §7), so a GPU removal first would cut the CPU run
 * under the block. A failed offload (no memory for the tier's map) leaves
 * the block out of the tier and unannounced: truth and events agree. */
static void on_evict(void *ctx, const mock_hash *hash, const mock_hash *parent,
                     const mock_block_meta *meta) {
    mock_sched *s = ctx;
    (void)cpu_offload(&s->cpu, hash, parent, meta, s->ev);
    events_on_evict(s->ev, hash, parent, meta);
}

kvo_status sched_init(mock_sched *s, const mock_cfg *cfg,
                      uint32_t max_model_len, mock_hasher *hasher,
                      step_events *ev, mock_engine_stats *st) {
    memset(s, 0, sizeof(*s));
    s->cfg = cfg;
    s->max_model_len = max_model_len;
    s->hasher = hasher;
    s->ev = ev;
    s->st = st;
    /* Blocks keep their tokens when something needs them after eviction:
     * the CPU tier (offloaded blocks are self-describing) or a renderer
     * that re-announces removed blocks (resurrect-removed). */
    bool caching = cfg->prefix_caching;
    bool keep = caching && (cfg->cpu_offload_blocks > 0 ||
                            (cfg->mutations & MOCK_MUT_RESURRECT_REMOVED));
    kvo_status rc = pool_init(&s->pool, cfg->num_gpu_blocks, caching,
                              keep ? cfg->block_size : 0);
    if (rc == KVO_OK)
        rc = cpu_init(&s->cpu, caching ? cfg->cpu_offload_blocks : 0,
                      cfg->block_size);
    if (rc != KVO_OK) {
        pool_fini(&s->pool);
        return rc;
    }
    s->pool.on_evict = on_evict;
    s->pool.evict_ctx = s;
    return KVO_OK;
}

void sched_fini(mock_sched *s) {
    for (uint32_t i = 0; i < s->running.n; i++) req_free(s->running.v[i]);
    for (uint32_t i = 0; i < s->waiting.n; i++)
        req_free(req_deque_at(&s->waiting, i));
    kvo_free(s->running.v);
    kvo_free(s->waiting.v);
    kvo_free(s->scheduled.v);
    kvo_free(s->started);
    pool_fini(&s->pool);
    cpu_fini(&s->cpu);
    memset(s, 0, sizeof(*s));
}

kvo_status sched_add(mock_sched *s, mock_req *r) {
    return req_deque_push(&s->waiting, r, false);
}

bool sched_has_work(const mock_sched *s) {
    return s->running.n > 0 || s->waiting.n > 0;
}

const mock_req *sched_find_running(const mock_sched *s, uint64_t req_id) {
    for (uint32_t i = 0; i < s->running.n; i++)
        if (s->running.v[i]->id == req_id) return s->running.v[i];
    return NULL;
}

/* KVCacheManager.free: blocks released in reverse (tail first) so that the
 * request's deepest blocks become the next eviction candidates; group by
 * group (the coordinator frees each manager's table in group order). The
 * null block of a skipped position is not released. */
static void free_req_blocks(mock_sched *s, mock_req *r) {
    for (uint32_t k = r->n_blocks; k-- > 0;)
        pool_release(&s->pool, &r->blocks[k], 1);
    r->n_blocks = 0;
    r->num_cached_block = 0;
    for (uint32_t g = 0; g < r->n_grp; g++) {
        struct req_group *q = &r->grp[g];
        for (uint32_t k = q->n_blocks; k-- > 0;)
            pool_release(&s->pool, &q->blocks[k], 1);
        q->n_blocks = 0;
        q->num_cached_block = 0;
    }
}

/* ---- hybrid models: sliding-window groups ------------------------------
 * vLLM's SlidingWindowManager and HybridKVCacheCoordinator, for one block
 * size: a sliding group of window W needs, for a hit of L blocks, the
 * ceil((W - 1) / bs) blocks before L cached in that group (the earlier
 * positions are null blocks); the hit every group agrees on is found by
 * shrinking L until each sliding group has its window there. As the
 * computation moves on, a sliding group frees the blocks that left the
 * window (remove_skipped_blocks): they stay cached, in the free queue, until
 * evicted (BlockRemoved with their group_idx). */

/* SlidingWindowManager.find_longest_cache_hit over blocks [0, max) of bh
 * in group g: scanning from the right, the first run of `contiguous`
 * cached blocks ends the hit; without one, the leading run is the hit. ids
 * (may be NULL) gets the hit's block ids, 0 (null) before the run. */
static uint32_t sliding_hit(const mock_sched *s, uint32_t g,
                            const mock_hash *bh, uint32_t max, uint32_t *ids) {
    uint32_t bs = s->cfg->block_size, w = s->cfg->groups[g].window;
    uint32_t contiguous = (w - 1 + bs - 1) / bs, run = 0;
    for (uint32_t i = max; i-- > 0;) {
        uint32_t id = pool_lookup_g(&s->pool, bh[i].key, g);
        if (id == MOCK_NIL) {
            run = 0;
            continue;
        }
        if (ids) ids[i] = id;
        run++;
        if (run >= contiguous) {
            if (ids)
                for (uint32_t k = 0; k < i; k++) ids[k] = 0;
            return i + run;
        }
    }
    if (ids) /* the leading run, found last */
        for (uint32_t k = 0; k < run; k++)
            ids[k] = pool_lookup_g(&s->pool, bh[k].key, g);
    return run;
}

uint32_t sched_hybrid_hit(const mock_sched *s, const mock_hash *bh,
                          uint32_t n_full) {
    uint32_t n = n_full;
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t g = 1; g < mock_cfg_groups(s->cfg); g++) {
            uint32_t l = sliding_hit(s, g, bh, n, NULL);
            if (l < n) {
                n = l;
                changed = true;
            }
        }
    }
    return n;
}

/* remove_skipped_blocks: the blocks of each sliding group that left the
 * window of the request's computed tokens are released (deepest first) and
 * their positions become the null block. */
static void remove_skipped(mock_sched *s, mock_req *r) {
    uint32_t bs = s->cfg->block_size;
    for (uint32_t g = 0; g < r->n_grp; g++) {
        uint32_t w = s->cfg->groups[g + 1].window;
        if (r->num_computed + 1 <= w) continue;
        uint32_t skip = (r->num_computed + 1 - w) / bs;
        struct req_group *q = &r->grp[g];
        if (skip > q->n_blocks) skip = q->n_blocks;
        for (uint32_t i = skip; i-- > 0;) {
            if (q->blocks[i] == 0) break; /* skipped before */
            pool_release(&s->pool, &q->blocks[i], 1);
            q->blocks[i] = 0;
        }
    }
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
static uint32_t computed_blocks(mock_sched *s, mock_req *r, uint32_t *n_cpu) {
    *n_cpu = 0;
    if (!s->cfg->prefix_caching) return 0;
    uint32_t bs = s->cfg->block_size;
    uint32_t cap = (r->n_tokens - 1) / bs;
    if (cap > r->n_bh) cap = r->n_bh;
    uint32_t *ids = r->blocks;
    uint32_t n = 0;
    uint32_t known = r->n_hit_ids < cap ? r->n_hit_ids : cap;
    const pool_block *pb = s->pool.blocks;
    while (n < known) {
        const pool_block *b = &pb[ids[n]];
        if (!b->cached || b->key != r->bh[n].key || b->copies.prev != MOCK_NIL)
            break;
        n++;
    }
    while (n < cap) {
        uint32_t id = pool_lookup(&s->pool, r->bh[n].key);
        if (id == MOCK_NIL) break;
        ids[n++] = id;
    }
    r->n_hit_ids = n;
    /* a hybrid model: the hit every group agrees on, each sliding group's
     * ids into its table (unused while waiting) */
    if (r->n_grp) {
        n = sched_hybrid_hit(s, r->bh, n);
        for (uint32_t g = 0; g < r->n_grp; g++)
            sliding_hit(s, g + 1, r->bh, n, r->grp[g].blocks);
    }
    if (r->num_preemptions == 0) {
        s->st->prefix_queries += r->n_tokens;
        s->st->prefix_hits += (uint64_t)n * bs;
    }
    /* The CPU tier, as vLLM asks its offloading connector for the blocks
     * past the local hit (get_num_new_matched_tokens): the run of full
     * prompt blocks it holds from there, not capped -- a full hit is cut
     * by one token when loaded (_update_waiting_for_remote_kv). Hits are
     * touched (most recently used) as LRUOffloadingManager.touch does it:
     * last block first, so the run's first block ends most recent and the
     * tier evicts a run's children before their parents. */
    if (s->cpu.cap) {
        uint32_t full = r->n_tokens / bs, m = 0;
        if (full > r->n_bh) full = r->n_bh;
        while (n + m < full && cpu_has(&s->cpu, r->bh[n + m].key)) m++;
        for (uint32_t k = m; k-- > 0;) cpu_touch(&s->cpu, r->bh[n + k].key);
        *n_cpu = m;
        s->st->cpu_queries += r->n_tokens;
        s->st->cpu_hits += (uint64_t)m * bs;
    }
    return n;
}

/* cache_blocks for groups 1..: each group's new full blocks (never a
 * skipped position: those are below what the group cached already), one
 * BlockStored per group after group 0's. */
static kvo_status cache_groups(mock_sched *s, mock_req *r, uint32_t full,
                               bool decode, mock_step *out) {
    mock_pool *p = &s->pool;
    for (uint32_t g = 0; g < r->n_grp; g++) {
        struct req_group *q = &r->grp[g];
        if (q->num_cached_block >= full) continue;
        uint32_t first = q->num_cached_block;
        for (uint32_t k = first; k < full; k++) {
            kvo_status st = pool_cache_g(p, q->blocks[k], &r->bh[k],
                                         k ? &r->bh[k - 1] : NULL, NULL, g + 1);
            if (st != KVO_OK) return st;
        }
        q->num_cached_block = full;
        out->stored += full - first;
        kvo_status st =
            events_stored_g(s->ev, r, first, full - first, s->cfg->block_size,
                            decode, g + 1, s->cfg->groups[g + 1].window);
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

/* allocate_slots. *ok = false (nothing changed) when the pool cannot supply
 * the blocks. What it evicted and stored is added to out's counts. */
static kvo_status allocate_slots(mock_sched *s, mock_req *r, uint32_t num_new,
                                 uint32_t new_computed, const uint32_t *hit,
                                 uint32_t n_hit, bool decode, mock_step *out,
                                 bool *ok) {
    mock_pool *p = &s->pool;
    uint32_t bs = s->cfg->block_size;
    /* sliding groups free what left the window first (vLLM does, even
     * when the request then does not fit: fewer evictions) */
    if (r->n_grp) remove_skipped(s, r);
    uint64_t num_computed = (uint64_t)r->num_computed + new_computed;
    uint64_t need = num_computed + num_new;
    if (need > s->max_model_len) need = s->max_model_len;
    uint32_t required = (uint32_t)((need + bs - 1) / bs);
    uint32_t have = n_hit + r->n_blocks;
    uint32_t n_new = required > have ? required - have : 0;
    uint64_t wanted = n_new; /* over every group */
    uint32_t evictable = 0;
    for (uint32_t k = 0; k < n_hit; k++)
        if (p->blocks[hit[k]].ref == 0) evictable++;
    for (uint32_t g = 0; g < r->n_grp; g++) {
        const struct req_group *q = &r->grp[g];
        uint32_t hv = n_hit + q->n_blocks;
        wanted += required > hv ? required - hv : 0;
        for (uint32_t k = 0; k < n_hit; k++) {
            uint32_t id = q->blocks[q->n_blocks + k];
            if (id != 0 && p->blocks[id].ref == 0) evictable++;
        }
    }
    *ok = false;
    if (wanted + evictable > p->n_free) return KVO_OK;
    if (r->n_blocks + n_hit + n_new > r->cap_blocks) return KVO_ESTATE;
    *ok = true;
    if (n_hit) {
        pool_touch(p, hit, n_hit);
        if (hit != r->blocks + r->n_blocks)
            memcpy(r->blocks + r->n_blocks, hit, n_hit * sizeof(uint32_t));
        r->n_blocks += n_hit;
        r->num_cached_block = n_hit; /* a new request's computed blocks */
    }
    for (uint32_t g = 0; g < r->n_grp; g++) { /* the other groups' hits */
        struct req_group *q = &r->grp[g];
        if (!n_hit) continue;
        for (uint32_t k = 0; k < n_hit; k++)
            if (q->blocks[q->n_blocks + k] != 0)
                pool_touch(p, &q->blocks[q->n_blocks + k], 1);
        q->n_blocks += n_hit;
        q->num_cached_block = n_hit;
    }
    if (n_new) {
        out->evicted += pool_alloc(p, n_new, r->blocks + r->n_blocks);
        r->n_blocks += n_new;
    }
    for (uint32_t g = 0; g < r->n_grp; g++) { /* then theirs, group by group */
        struct req_group *q = &r->grp[g];
        uint32_t add = required > q->n_blocks ? required - q->n_blocks : 0;
        if (!add) continue;
        out->evicted += pool_alloc(p, add, q->blocks + q->n_blocks);
        q->n_blocks += add;
    }
    if (!s->cfg->prefix_caching) return KVO_OK;
    uint64_t to_cache = num_computed + num_new;
    if (to_cache > r->n_tokens) to_cache = r->n_tokens;
    uint32_t full = (uint32_t)(to_cache / bs);
    if (r->num_cached_block < full) {
        uint32_t first = r->num_cached_block;
        for (uint32_t k = first; k < full; k++) {
            mock_block_meta meta = {r->tokens + (size_t)k * bs,
                                    r->lora_tab ? r->lora_id : 0, r->lora_tab,
                                    0};
            kvo_status st = pool_cache(p, r->blocks[k], &r->bh[k],
                                       k ? &r->bh[k - 1] : NULL, &meta);
            if (st != KVO_OK) return st;
        }
        r->num_cached_block = full;
        s->st->blocks_stored += full - first;
        out->stored += full - first;
        kvo_status st =
            events_stored(s->ev, r, first, full - first, bs, decode);
        if (st != KVO_OK) return st;
    }
    return r->n_grp ? cache_groups(s, r, full, decode, out) : KVO_OK;
}

static kvo_status mark_scheduled(mock_sched *s, mock_req *r, uint32_t n,
                                 bool decode) {
    r->sched_tokens = n;
    r->sched_decode = decode;
    kvo_status st = req_vec_push(&s->scheduled, r);
    if (st != KVO_OK) return st;
    if (!r->started) {
        r->started = true;
        st = kvo_grow(&s->started, &s->cap_started, s->n_started + 1,
                      sizeof(*s->started), STARTED_FIRST_CAP);
        if (st != KVO_OK) return st;
        s->started[s->n_started++] = r->user;
    }
    return KVO_OK;
}

static kvo_status preempt(mock_sched *s, mock_req *v) {
    free_req_blocks(s, v);
    v->status = REQ_PREEMPTED;
    v->num_computed = 0;
    v->num_preemptions++;
    s->st->preemptions++;
    return req_deque_push(&s->waiting, v, true); /* prepend_request */
}

static bool is_decode(const mock_req *r, uint32_t num_new) {
    return num_new == 1 && r->num_computed >= r->n_prompt &&
           r->num_computed + 1 == r->n_tokens;
}

static double prefill_ms(double t) {
    return PREFILL_A * t * t + PREFILL_B * t + PREFILL_C;
}

static double decode_ms(double u) {
    double d = DECODE_A * u * u + DECODE_B * u + DECODE_C;
    return d < DECODE_MIN ? DECODE_MIN : d;
}

kvo_status sched_step(mock_sched *s, mock_step *out) {
    memset(out, 0, sizeof(*out));
    s->scheduled.n = 0;
    s->n_started = 0;
    const mock_cfg *cfg = s->cfg;
    uint32_t budget = cfg->max_num_batched_tokens;
    uint32_t preempted = 0;
    kvo_status st = KVO_OK;
    bool ok;

    /* 1. running requests */
    for (uint32_t i = 0; i < s->running.n && budget > 0;) {
        mock_req *r = s->running.v[i];
        uint32_t num_new = r->n_tokens - r->num_computed;
        if (num_new > budget) num_new = budget;
        uint32_t room = s->max_model_len - 1 > r->num_computed
                            ? s->max_model_len - 1 - r->num_computed
                            : 0;
        if (num_new > room) num_new = room;
        if (num_new == 0) {
            i++;
            continue;
        }
        bool decode = is_decode(r, num_new);
        bool scheduled = true;
        for (;;) {
            st = allocate_slots(s, r, num_new, 0, NULL, 0, decode, out, &ok);
            if (st != KVO_OK) return st;
            if (ok) break;
            mock_req *victim = s->running.v[--s->running.n];
            if ((st = preempt(s, victim)) != KVO_OK) return st;
            preempted++;
            if (victim == r) {
                scheduled = false;
                break;
            }
        }
        if (!scheduled) break;
        if ((st = mark_scheduled(s, r, num_new, decode)) != KVO_OK) return st;
        budget -= num_new;
        i++;
    }

    /* 2. waiting requests, only when nothing was preempted */
    while (preempted == 0 && s->waiting.n > 0 && budget > 0 &&
           s->running.n < cfg->max_num_seqs) {
        mock_req *r = req_deque_at(&s->waiting, 0);
        uint32_t bs = cfg->block_size;
        if ((st = req_materialize(r, cfg, s->hasher)) != KVO_OK) return st;
        uint32_t n_cpu;
        uint32_t n_hit = computed_blocks(s, r, &n_cpu);
        uint32_t num_computed = (n_hit + n_cpu) * bs;
        /* blocks loaded from the CPU tier count as computed (and cached)
         * tokens, as vLLM counts a connector's; a prompt loaded whole
         * recomputes its last token */
        if (num_computed >= r->n_tokens) num_computed = r->n_tokens - 1;
        uint32_t num_new = r->n_tokens - num_computed;
        if (num_new > budget) num_new = budget;
        st = allocate_slots(s, r, num_new, num_computed, r->blocks, n_hit,
                            false, out, &ok);
        if (st != KVO_OK) return st;
        if (!ok) break;
        req_deque_pop_front(&s->waiting);
        if ((st = req_vec_push(&s->running, r)) != KVO_OK) return st;
        r->status = REQ_RUNNING;
        r->n_hit_ids = 0;
        r->num_computed = num_computed;
        if (r->num_cached_tokens < 0) r->num_cached_tokens = num_computed;
        if ((st = mark_scheduled(s, r, num_new, false)) != KVO_OK) return st;
        budget -= num_new;
    }

    /* 3. update_after_schedule, and the step's modeled duration */
    uint64_t prefill_tokens = 0, transfer_blocks = 0;
    uint32_t decode_reqs = 0;
    for (uint32_t i = 0; i < s->scheduled.n; i++) {
        mock_req *r = s->scheduled.v[i];
        if (r->sched_decode)
            decode_reqs++;
        else if (r->remote_prefill && cfg->role == MOCK_ROLE_DECODE)
            transfer_blocks +=
                (r->sched_tokens + cfg->block_size - 1) / cfg->block_size;
        else
            prefill_tokens += r->sched_tokens;
        r->num_computed += r->sched_tokens;
        s->st->computed_tokens += r->sched_tokens;
        if (!r->split && r->num_computed < r->n_tokens) { /* chunked */
            r->split = true;
            s->st->prefills_split++;
        }
    }
    out->n_scheduled = s->scheduled.n;
    out->prefill_tokens = (uint32_t)prefill_tokens;
    out->decode_reqs = decode_reqs;
    out->preempted = preempted;
    out->idle = s->scheduled.n == 0;
    double ms = 0;
    if (prefill_tokens) ms += prefill_ms((double)prefill_tokens);
    if (decode_reqs) ms += decode_ms(pool_usage(&s->pool));
    ms += (double)transfer_blocks * cfg->kv_transfer_ms_per_block;
    out->duration_ms = ms;
    out->started = s->started;
    out->n_started = s->n_started;
    if (!out->idle) {
        s->step_open = true;
        s->st->steps++;
    }
    if (s->scheduled.n >= 2) s->st->steps_multi++;
    if (s->running.n > s->st->max_running) s->st->max_running = s->running.n;
    if (out->stored) s->st->evictions_in_store_steps += out->evicted;
    return KVO_OK;
}

/* A request leaves the engine: its blocks go back to the pool. */
static void finish_req(mock_sched *s, mock_req *r) {
    free_req_blocks(s, r);
    r->status = REQ_FINISHED;
}

void sched_complete(mock_sched *s) {
    s->step_open = false;
    bool removed = false;
    for (uint32_t i = 0; i < s->scheduled.n; i++) {
        mock_req *r = s->scheduled.v[i];
        r->sched_tokens = 0;
        if (r->aborted) {
            finish_req(s, r);
            removed = true;
            continue;
        }
        if (r->num_computed < r->n_tokens) continue; /* partial prefill */
        uint64_t tok = req_sample_token(r);
        if (req_append_token(r, s->cfg, s->hasher, tok) != KVO_OK) {
            r->aborted = true; /* cannot happen: sized at add */
            finish_req(s, r);
            removed = true;
            continue;
        }
        s->st->generated_tokens++;
        uint32_t n_out = r->n_tokens - r->n_prompt;
        bool done = n_out >= r->max_tokens || r->n_tokens >= s->max_model_len;
        mock_output o = {.req_id = r->id,
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
            finish_req(s, r);
            s->st->requests_finished++;
            removed = true;
        }
    }
    if (!removed) return;
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->running.n; i++) {
        mock_req *r = s->running.v[i];
        if (r->status != REQ_FINISHED) {
            s->running.v[k++] = r;
            continue;
        }
        if (r->aborted) {
            s->st->requests_aborted++;
            req_abort_deliver(r); /* frees r */
        } else {
            req_free(r);
        }
    }
    s->running.n = k;
}

kvo_status sched_abort(mock_sched *s, uint64_t req_id) {
    for (uint32_t i = 0; i < s->running.n; i++) {
        mock_req *r = s->running.v[i];
        if (r->id != req_id) continue;
        if (s->step_open) {
            r->aborted = true; /* in the open step: complete() ends it */
            return KVO_OK;
        }
        free_req_blocks(s, r);
        memmove(&s->running.v[i], &s->running.v[i + 1],
                (s->running.n - i - 1) * sizeof(mock_req *));
        s->running.n--;
        s->st->requests_aborted++;
        req_abort_deliver(r);
        return KVO_OK;
    }
    for (uint32_t i = 0; i < s->waiting.n; i++) {
        mock_req *r = req_deque_at(&s->waiting, i);
        if (r->id != req_id) continue;
        req_deque_remove(&s->waiting, i);
        s->st->requests_aborted++;
        req_abort_deliver(r);
        return KVO_OK;
    }
    return KVO_ENOTFOUND;
}
