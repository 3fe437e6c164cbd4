/* mock_engine.c -- one data-parallel rank: the engine core around vLLM's
 * scheduler, and the configuration helpers.
 *
 * Dependencies run one way, as vLLM's do (EngineCore -> Scheduler ->
 * KVCacheManager/BlockPool):
 *
 *   mock_engine (this file)    API: add, abort, schedule, complete, probe,
 *     |   |                    reset, stats, inspection; LoRA ids, counters
 *     |   +--> mock_sched      running/waiting queues, one step, complete
 *     |   |      |   |         (mock_sched.c)
 *     |   |      |   +--> mock_pool   blocks, free queue, cached map
 *     |   |      |   |                (mock_pool.c); its evict callback
 *     |   |      |   |                feeds step_events and the CPU tier
 *     |   |      |   +--> mock_cpu    the CPU tier (mock_cpu.c)
 *     +---+------+--> mock_req     a request, its tokens and hashes; the
 *     |          |                 vector and deque (mock_req.c)
 *     +----------+--> step_events  the step's KVEventBatch (mock_events.c)
 *
 * No file calls back up: the scheduler never sees mock_engine, the pool
 * never sees the scheduler (it reports evictions through a function
 * pointer), requests and events see only what they are given.
 *
 * A step: mock_engine_schedule opens the batch (an AllBlocksCleared a reset
 * queued goes first), lets the scheduler allocate, evict (BlockRemoved, in
 * eviction order) and cache (BlockStored) request by request, then closes
 * the batch (events in the order they happened); mock_engine_complete
 * samples, finishes and frees.
 */
#include "mock_int.h"

#include <stdio.h>
#include <string.h>

/* LoRA adapters one engine names (vLLM's max_loras is far smaller). */
#define MAX_LORAS 4096

/* ---- configuration -------------------------------------------------------*/

void mock_cfg_default(mock_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->block_size = 16;
    c->num_gpu_blocks = 16384;
    c->max_num_seqs = 256;
    c->max_num_batched_tokens = 8192;
    c->prefix_caching = true;
    c->role = MOCK_ROLE_AGGREGATED;
    c->hash_algo = WIRE_ALGO_SHA256;
    c->hash_seed = "0";
    c->hash_memo_log2 = 14;
    c->vocab_size = MOCK_DEFAULT_VOCAB;
    c->event_format = WIRE_FMT_MAP;
    c->dp_size = 1;
    c->model = "kvo-mock";
    c->host = "127.0.0.1";
    c->port = 8000;
    c->zmq_host = "127.0.0.1";
    c->zmq_port = 5557;
    c->replay_port = 5558;
    c->replay = true;
    c->topic = "";
    c->replay_buffer = 10000;
    c->replay_buffer_bytes = 0; /* no byte cap: the count bounds it */
    c->zmq_hwm = 100000;
}

uint32_t mock_cfg_groups(const mock_cfg *c) {
    return c->n_groups > 1 ? c->n_groups : 1;
}

kvo_status mock_groups_parse(const char *s, mock_cfg *c) {
    mock_group_spec g[MOCK_MAX_GROUPS];
    uint32_t n = 0;
    if (!s || !*s) return KVO_EINVAL;
    for (const char *p = s; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (n == MOCK_MAX_GROUPS) return KVO_EINVAL;
        char item[32];
        if (len == 0 || len >= sizeof(item)) return KVO_EINVAL;
        memcpy(item, p, len);
        item[len] = '\0';
        uint32_t w = 0;
        if (strcmp(item, "full") == 0) {
            g[n++] = (mock_group_spec){false, 0};
        } else if (strncmp(item, "sliding:", 8) == 0 &&
                   kvo_parse_u32(item + 8, &w) == KVO_OK && w >= 1) {
            g[n++] = (mock_group_spec){true, w};
        } else {
            return KVO_EINVAL;
        }
        p += len;
        if (*p == ',') p++;
    }
    if (g[0].sliding) return KVO_EINVAL; /* group 0 is the full-attention one */
    for (uint32_t i = 1; i < n; i++)
        if (!g[i].sliding) return KVO_EINVAL;
    memcpy(c->groups, g, n * sizeof(*g));
    c->n_groups = n;
    return KVO_OK;
}

uint32_t mock_cfg_max_model_len(const mock_cfg *c) {
    /* every group holds a block table of the request (one shared pool) */
    uint64_t cap = (uint64_t)(c->num_gpu_blocks ? c->num_gpu_blocks - 1 : 0) /
                   mock_cfg_groups(c) * c->block_size;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    if (c->max_model_len && c->max_model_len < cap) return c->max_model_len;
    return (uint32_t)cap;
}

/* The next "name[=path]" of a --lora-modules list from *p: the name's
 * bytes and length; false at the end. */
static bool lora_next(const char **p, const char **name, size_t *len) {
    const char *q = *p;
    if (!q || !*q) return false;
    const char *end = strchr(q, ',');
    size_t item = end ? (size_t)(end - q) : strlen(q);
    const char *eq = memchr(q, '=', item);
    *name = q;
    *len = eq ? (size_t)(eq - q) : item;
    *p = end ? end + 1 : q + item;
    return true;
}

uint32_t mock_cfg_lora_module(const mock_cfg *c, const char *name) {
    const char *p = c->lora_modules, *n;
    size_t len, want = strlen(name);
    for (uint32_t i = 1; lora_next(&p, &n, &len); i++)
        if (len == want && memcmp(n, name, len) == 0) return i;
    return 0;
}

bool mock_cfg_lora_module_at(const mock_cfg *c, uint32_t i, char *buf,
                             size_t bufsz) {
    const char *p = c->lora_modules, *n;
    size_t len;
    for (uint32_t k = 0; lora_next(&p, &n, &len); k++) {
        if (k != i) continue;
        snprintf(buf, bufsz, "%.*s", (int)len, n);
        return true;
    }
    return false;
}

kvo_status mock_cfg_lora_modules_check(const mock_cfg *c) {
    const char *p = c->lora_modules, *n;
    size_t len;
    uint32_t count = 0;
    char name[256];
    while (lora_next(&p, &n, &len)) {
        if (len == 0 || len >= sizeof(name) || ++count > MAX_LORAS)
            return KVO_EINVAL;
        memcpy(name, n, len);
        name[len] = '\0';
        if (mock_cfg_lora_module(c, name) != count)
            return KVO_EINVAL; /* twice */
    }
    return KVO_OK;
}

static const char *const role_names[] = {"aggregated", "prefill", "decode"};

kvo_status mock_role_parse(const char *s, mock_role *out) {
    for (unsigned i = 0; i < KVO_ARRAY_LEN(role_names); i++) {
        if (strcmp(s, role_names[i]) == 0) {
            *out = (mock_role)i;
            return KVO_OK;
        }
    }
    return KVO_EINVAL;
}

const char *mock_role_name(mock_role r) {
    return (unsigned)r < KVO_ARRAY_LEN(role_names) ? role_names[r] : "?";
}

static kvo_status lora_id_of(mock_engine *e, const char *name, int64_t *id);

/* ---- lifecycle ------------------------------------------------------------*/

kvo_status mock_engine_new(mock_engine **out, const mock_cfg *cfg,
                           uint32_t dp_rank, mock_hasher *hasher) {
    if (!out || !cfg || !hasher || cfg->block_size == 0 ||
        cfg->num_gpu_blocks < 2 || cfg->max_num_seqs == 0 ||
        cfg->max_num_batched_tokens == 0 || cfg->n_groups > MOCK_MAX_GROUPS ||
        (cfg->n_groups > 1 && cfg->cpu_offload_blocks > 0) ||
        mock_cfg_max_model_len(cfg) == 0)
        return KVO_EINVAL;
    mock_engine *e = kvo_calloc(1, sizeof(*e));
    if (!e) return KVO_ENOMEM;
    e->cfg = *cfg;
    e->rank = dp_rank;
    e->hasher = hasher;
    e->max_model_len = mock_cfg_max_model_len(cfg);
    e->next_id = 1;
    events_init(&e->ev, cfg->prefix_caching && cfg->role != MOCK_ROLE_DECODE,
                cfg->block_size);
    kvo_status st = sched_init(&e->sched, &e->cfg, e->max_model_len, hasher,
                               &e->ev, &e->st);
    /* --lora-modules: lora_int_id 1, 2, ... in the listed order, as vLLM's
     * serving models register their static adapters */
    char name[256];
    int64_t id;
    for (uint32_t i = 0;
         st == KVO_OK && mock_cfg_lora_module_at(cfg, i, name, sizeof(name));
         i++)
        st = lora_id_of(e, name, &id);
    if (st != KVO_OK) {
        mock_engine_free(e);
        return st;
    }
    *out = e;
    return KVO_OK;
}

void mock_engine_free(mock_engine *e) {
    if (!e) return;
    sched_fini(&e->sched);
    events_fini(&e->ev);
    for (uint32_t i = 0; i < e->n_loras; i++) kvo_free(e->loras[i]);
    kvo_free(e->loras);
    kvo_free(e);
}

uint32_t mock_engine_rank(const mock_engine *e) { return e->rank; }

/* ---- requests -------------------------------------------------------------*/

/* LoRA ids as vLLM's LoRARequest.lora_int_id: 1, 2, ... by first use. */
static kvo_status lora_id_of(mock_engine *e, const char *name, int64_t *id) {
    for (uint32_t i = 0; i < e->n_loras; i++) {
        if (strcmp(e->loras[i], name) == 0) {
            *id = i + 1;
            return KVO_OK;
        }
    }
    if (e->n_loras >= MAX_LORAS) return KVO_ETOOBIG;
    char **v = kvo_realloc(e->loras, (e->n_loras + 1) * sizeof(*v));
    if (!v) return KVO_ENOMEM;
    e->loras = v;
    if (!(v[e->n_loras] = kvo_strdup(name))) return KVO_ENOMEM;
    *id = ++e->n_loras;
    return KVO_OK;
}

kvo_status mock_engine_add(mock_engine *e, const mock_req_in *in,
                           uint64_t *req_id) {
    if (!e || !in || in->n_tokens == 0 || in->max_tokens == 0)
        return KVO_EINVAL;
    bool trace = in->trace.hash_ids && in->trace.n_hash_ids;
    if (!in->tokens &&
        (!trace || mock_trace_validate(in->trace.hash_ids, in->trace.n_hash_ids,
                                       in->n_tokens) != KVO_OK))
        return KVO_EINVAL;
    if ((in->n_mm && !in->mm) ||
        mock_mm_check(in->mm, in->n_mm, in->n_tokens, NULL) != KVO_OK)
        return KVO_EINVAL;
    uint32_t max_tokens = in->max_tokens;
    if (e->cfg.role == MOCK_ROLE_PREFILL) max_tokens = 1;
    if ((uint64_t)in->n_tokens + max_tokens > e->max_model_len)
        return KVO_ETOOBIG;
    mock_req *r = NULL;
    kvo_status st = req_new(&r, in, max_tokens, e->cfg.block_size, e->next_id,
                            e->cfg.seed, e->rank, mock_cfg_groups(&e->cfg));
    if (st != KVO_OK) return st;
    if (r->lora) {
        if ((st = lora_id_of(e, r->lora, &r->lora_id)) != KVO_OK) goto fail;
        r->lora_tab = e->loras[r->lora_id - 1];
    }
    if ((st = sched_add(&e->sched, r)) != KVO_OK) goto fail;
    uint64_t inflight = (uint64_t)e->sched.running.n + e->sched.waiting.n;
    if (inflight > e->st.max_inflight) e->st.max_inflight = inflight;
    e->next_id++;
    e->st.requests_added++;
    e->st.prompt_tokens += in->n_tokens;
    if (req_id) *req_id = r->id;
    return KVO_OK;
fail:
    req_free(r);
    return st;
}

bool mock_engine_has_work(const mock_engine *e) {
    return sched_has_work(&e->sched);
}

bool mock_engine_has_events(const mock_engine *e) { return e->pending_clear; }

/* ---- probe, reset, stats, inspection -------------------------------------*/

uint32_t mock_engine_probe(const mock_engine *e, const mock_hash *hashes,
                           uint32_t n_tokens) {
    if (!e->cfg.prefix_caching || n_tokens == 0) return 0;
    uint32_t cap = (n_tokens - 1) / e->cfg.block_size;
    uint32_t h = 0;
    while (h < cap && pool_lookup(&e->sched.pool, hashes[h].key) != MOCK_NIL)
        h++;
    return h;
}

bool mock_engine_cached(const mock_engine *e, uint64_t key) {
    return e->cfg.prefix_caching &&
           pool_lookup(&e->sched.pool, key) != MOCK_NIL;
}

bool mock_engine_reset_cache(mock_engine *e, bool reset_external) {
    if (!pool_reset(&e->sched.pool)) return false;
    if (reset_external) cpu_reset(&e->sched.cpu);
    if (e->ev.enabled) e->pending_clear = true;
    e->st.cleared++;
    return true;
}

bool mock_engine_reset_prefix_cache(mock_engine *e) {
    return mock_engine_reset_cache(e, false);
}

bool mock_engine_cpu_cached(const mock_engine *e, uint64_t key) {
    return cpu_has(&e->sched.cpu, key);
}

uint32_t mock_engine_cpu_blocks(const mock_engine *e) {
    return e->sched.cpu.cap;
}

kvo_status mock_engine_cpu_cached_blocks(const mock_engine *e, bool has_after,
                                         uint64_t after, mock_cached_block *out,
                                         uint32_t max, uint32_t *n,
                                         bool *more) {
    return cpu_list(&e->sched.cpu, has_after, after, out, max, n, more);
}

uint32_t mock_engine_hybrid_hit(const mock_engine *e, const mock_hash *bh,
                                uint32_t n_full) {
    return sched_hybrid_hit(&e->sched, bh, n_full);
}

kvo_status mock_engine_group_blocks(const mock_engine *e, uint32_t g,
                                    bool has_after, uint64_t after,
                                    mock_cached_block *out, uint32_t max,
                                    uint32_t *n, bool *more) {
    return pool_list_g(&e->sched.pool, g, has_after, after, out, max, n, more);
}

void mock_engine_group_set(const mock_engine *e, uint32_t g, uint64_t *distinct,
                           uint64_t *digest) {
    *distinct = g < MOCK_MAX_GROUPS ? e->sched.pool.g_distinct[g] : 0;
    *digest = g < MOCK_MAX_GROUPS ? e->sched.pool.g_digest[g] : 0;
}

bool mock_engine_group_cached(const mock_engine *e, uint32_t g, uint64_t key) {
    return e->cfg.prefix_caching && g < mock_cfg_groups(&e->cfg) &&
           pool_lookup_g(&e->sched.pool, key, g) != MOCK_NIL;
}

uint32_t mock_engine_copies_count(const mock_engine *e, uint64_t key) {
    uint32_t n = 0;
    const mock_pool *p = &e->sched.pool;
    if (!e->cfg.prefix_caching) return 0;
    for (uint32_t id = pool_lookup(p, key); id != MOCK_NIL;
         id = p->blocks[id].copies.next)
        n++;
    return n;
}

void mock_engine_stats_get(const mock_engine *e, mock_engine_stats *out) {
    const mock_pool *p = &e->sched.pool;
    *out = e->st;
    out->requests_running = e->sched.running.n;
    out->requests_waiting = e->sched.waiting.n;
    out->blocks_removed = p->evicted;
    out->events_lost_enomem = e->ev.lost_enomem;
    out->resident_blocks = p->n_cached;
    out->free_blocks = p->n_free;
    out->used_blocks = p->n - 1 - p->n_free;
    out->usage = pool_usage(p);
    out->cached_distinct = p->n_distinct;
    out->cached_digest = p->digest;
    const mock_cpu *c = &e->sched.cpu;
    out->cpu_stored = c->stored;
    out->cpu_removed = c->removed;
    out->cpu_cached_distinct = c->n;
    out->cpu_cached_digest = c->digest;
}

kvo_status mock_engine_cached_blocks(const mock_engine *e, bool has_after,
                                     uint64_t after, mock_cached_block *out,
                                     uint32_t max, uint32_t *n, bool *more) {
    return pool_list(&e->sched.pool, has_after, after, out, max, n, more);
}

kvo_status mock_engine_block(const mock_engine *e, uint32_t block_id,
                             mock_block_info *out) {
    const mock_pool *p = &e->sched.pool;
    if (block_id >= p->n) return KVO_EINVAL;
    const pool_block *b = &p->blocks[block_id];
    memset(out, 0, sizeof(*out));
    out->ref = b->ref;
    out->cached = b->cached;
    out->in_free_queue = b->in_free;
    if (b->cached) out->hash = p->hash[block_id];
    return KVO_OK;
}

uint32_t mock_engine_free_queue(const mock_engine *e, uint32_t *ids,
                                uint32_t max) {
    const mock_pool *p = &e->sched.pool;
    uint32_t n = 0;
    for (uint32_t id = p->free_q.head; id != MOCK_NIL && n < max;
         id = p->blocks[id].q.next)
        ids[n++] = id;
    return n;
}

uint32_t mock_engine_copies(const mock_engine *e, uint64_t key, uint32_t *ids,
                            uint32_t max) {
    const mock_pool *p = &e->sched.pool;
    uint32_t n = 0;
    for (uint32_t id = pool_lookup(p, key); id != MOCK_NIL && n < max;
         id = p->blocks[id].copies.next)
        ids[n++] = id;
    return n;
}

kvo_status mock_engine_req_blocks(const mock_engine *e, uint64_t req_id,
                                  const uint32_t **ids, uint32_t *n) {
    const mock_req *r = sched_find_running(&e->sched, req_id);
    if (!r) return KVO_ENOTFOUND;
    *ids = r->blocks;
    *n = r->n_blocks;
    return KVO_OK;
}

/* ---- steps ----------------------------------------------------------------*/

kvo_status mock_engine_schedule(mock_engine *e, double ts, mock_step *out) {
    if (!e || !out) return KVO_EINVAL;
    if (e->sched.step_open) return KVO_ESTATE;
    events_begin(&e->ev);
    if (e->pending_clear) {
        e->pending_clear = false;
        kvo_status st = events_cleared(&e->ev);
        if (st != KVO_OK) return st;
    }
    kvo_status st = sched_step(&e->sched, out);
    if (st == KVO_OK)
        st = events_finish(&e->ev, ts, e->rank, &out->batch, &out->aux);
    if (st != KVO_OK) return st;
    out->events_lost = e->ev.step_lost;
    if (out->batch) {
        e->st.batches++;
        e->st.events += out->batch->n_events;
    }
    return KVO_OK;
}

void mock_engine_complete(mock_engine *e) {
    if (e && e->sched.step_open) sched_complete(&e->sched);
}

kvo_status mock_engine_abort(mock_engine *e, uint64_t req_id) {
    return sched_abort(&e->sched, req_id);
}
