/* mock_engine.c -- one data-parallel rank: the block pool, the requests,
 * hashing, and the step's KV-event batch (the scheduling itself is in
 * mock_sched.c).
 *
 * Events are built the way vLLM's BlockPool queues them: one BlockRemoved
 * per evicted block, at the moment allocation pops it from the free queue
 * (so deepest-first when a request's blocks were freed tail-first), and one
 * BlockStored per cache_full_blocks call (the blocks a request's scheduled
 * tokens complete, with the parent's hash). The queue is drained into one
 * KVEventBatch per step: an AllBlocksCleared queued by a reset, the step's
 * removals in the order allocation evicted them, then its stores in
 * scheduling order (ev_append_stores says why). Hashes go out as vLLM's
 * default int form (low 64 bits); the full digests ride along in the aux
 * arrays for mock_render (raw-digest form, mutations).
 */
#include "mock_int.h"

#include <msgpack.h>
#include <string.h>

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

uint32_t mock_cfg_max_model_len(const mock_cfg *c) {
    uint64_t cap = (uint64_t)(c->num_gpu_blocks ? c->num_gpu_blocks - 1 : 0) *
                   c->block_size;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    if (c->max_model_len && c->max_model_len < cap) return c->max_model_len;
    return (uint32_t)cap;
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

/* ---- event builder --------------------------------------------------------*/

static kvo_status ev_grow(ev_builder *b) {
    if (b->n < b->cap) return KVO_OK;
    uint32_t cap = b->cap ? b->cap * 2 : 64;
    wire_event *ev = kvo_realloc(b->ev, cap * sizeof(*ev));
    if (!ev) return KVO_ENOMEM;
    b->ev = ev;
    mock_hash *rp = kvo_realloc(b->removed_parent, cap * sizeof(*rp));
    if (!rp) return KVO_ENOMEM;
    b->removed_parent = rp;
    bool *ds = kvo_realloc(b->decode_store, cap * sizeof(*ds));
    if (!ds) return KVO_ENOMEM;
    b->decode_store = ds;
    mock_hash **sh = kvo_realloc(b->stored, cap * sizeof(*sh));
    if (!sh) return KVO_ENOMEM;
    b->stored = sh;
    mock_hash *pa = kvo_realloc(b->parent, cap * sizeof(*pa));
    if (!pa) return KVO_ENOMEM;
    b->parent = pa;
    mock_hash **rh = kvo_realloc(b->removed, cap * sizeof(*rh));
    if (!rh) return KVO_ENOMEM;
    b->removed = rh;
    mock_hash *rf = kvo_realloc(b->removed_hash, cap * sizeof(*rf));
    if (!rf) return KVO_ENOMEM;
    b->removed_hash = rf;
    wire_hash *rw = kvo_realloc(b->removed_wire, cap * sizeof(*rw));
    if (!rw) return KVO_ENOMEM;
    b->removed_wire = rw;
    b->cap = cap;
    return KVO_OK;
}

/* A fresh event slot with vLLM's BlockPool defaults filled in. */
static wire_event *ev_push(ev_builder *b, wire_ev_type type) {
    if (ev_grow(b) != KVO_OK) return NULL;
    uint32_t i = b->n++;
    wire_event *ev = &b->ev[i];
    memset(ev, 0, sizeof(*ev));
    ev->type = type;
    ev->layout = WIRE_LAYOUT_MAP;
    memset(&b->removed_parent[i], 0, sizeof(mock_hash));
    memset(&b->parent[i], 0, sizeof(mock_hash));
    b->decode_store[i] = false;
    b->stored[i] = NULL;
    b->removed[i] = NULL;
    if (type != WIRE_EV_CLEARED) {
        ev->medium = (wire_str){"GPU", 3};
        ev->group_idx = (wire_int){true, 0};
    }
    return ev;
}

static void hash_int_form(wire_hash *w, const mock_hash *h) {
    w->kind = WIRE_HASH_UINT;
    w->len = 0;
    w->key = h->key;
    w->bytes = NULL;
}

/* pool callback: the block at the free-queue head still holds a hash. Its
 * hash is copied (the block is about to be reused); the event's pointers
 * into the per-event arrays are set when the step's batch is finished, as
 * the arrays may still grow. */
static void on_evict(void *ctx, uint32_t id) {
    mock_engine *e = ctx;
    e->st.blocks_removed++;
    if (!e->events) return;
    ev_builder *b = &e->ev;
    wire_event *ev = ev_push(b, WIRE_EV_REMOVED);
    if (!ev) return; /* out of memory: the event is lost */
    uint32_t i = b->n - 1;
    b->removed_hash[i] = e->pool.hash[id];
    hash_int_form(&b->removed_wire[i], &e->pool.hash[id]);
    ev->n_hashes = 1;
    b->removed_parent[i] = e->pool.parent[id];
}

static int kvobuf_write(void *data, const char *p, size_t n) {
    return kvo_buf_append(data, p, n) == KVO_OK ? 0 : -1;
}

/* extra_keys of n blocks from first: per block nil, or the tuple the hash
 * used -- (lora_name,) / (lora_name, cache_salt) / (cache_salt,), the salt
 * on block 0 only. */
static kvo_status extra_keys_msgpack(kvo_buf *b, uint32_t first, uint32_t n,
                                     const char *lora, const char *salt) {
    kvo_buf_reset(b);
    msgpack_packer pk;
    msgpack_packer_init(&pk, b, kvobuf_write);
    if (msgpack_pack_array(&pk, n)) return KVO_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        const char *k[2];
        uint32_t nk = 0;
        if (lora) k[nk++] = lora;
        if (salt && first + i == 0) k[nk++] = salt;
        if (nk == 0) {
            if (msgpack_pack_nil(&pk)) return KVO_ENOMEM;
            continue;
        }
        if (msgpack_pack_array(&pk, nk)) return KVO_ENOMEM;
        for (uint32_t j = 0; j < nk; j++) {
            size_t len = strlen(k[j]);
            if (msgpack_pack_str(&pk, len) ||
                msgpack_pack_str_body(&pk, k[j], len))
                return KVO_ENOMEM;
        }
    }
    return KVO_OK;
}

kvo_status eng_ev_stored(mock_engine *e, mock_req *r, uint32_t first,
                         uint32_t n, bool decode) {
    e->st.blocks_stored += n;
    if (!e->events || n == 0) return KVO_OK;
    ev_builder *b = &e->evs;
    uint32_t bs = e->cfg.block_size;
    wire_event *ev = ev_push(b, WIRE_EV_STORED);
    if (!ev) return KVO_ENOMEM;
    uint32_t i = b->n - 1;
    kvo_status st = KVO_ENOMEM;
    /* Hashes and tokens point into the request: it lives until complete(). */
    mock_hash *full = r->bh + first;
    wire_hash *wh = kvo_arena_alloc(&b->arena, n * sizeof(wire_hash));
    uint64_t *tok = r->tokens + (size_t)first * bs;
    if (!wh) goto fail;
    for (uint32_t k = 0; k < n; k++) hash_int_form(&wh[k], &full[k]);
    ev->n_hashes = n;
    ev->hashes = wh;
    if (first > 0) {
        hash_int_form(&ev->parent, &r->bh[first - 1]);
        b->parent[i] = r->bh[first - 1];
    } else {
        ev->parent.kind = WIRE_HASH_NONE;
    }
    ev->n_tokens = n * bs;
    ev->token_ids = tok;
    ev->block_size = (wire_int){true, bs};
    if (r->lora) {
        ev->lora_id = (wire_int){true, r->lora_id};
        ev->lora_name = (wire_str){r->lora, (uint32_t)strlen(r->lora)};
    }
    st = extra_keys_msgpack(&e->extra_buf, first, n, r->lora, r->salt);
    if (st != KVO_OK) goto fail;
    st = KVO_ENOMEM;
    void *ek = kvo_arena_memdup(&b->arena, e->extra_buf.data, e->extra_buf.len);
    if (!ek) goto fail;
    ev->extra_keys = (wire_raw){ek, (uint32_t)e->extra_buf.len};
    ev->kv_cache_spec_kind = (wire_str){"full_attention", 14};
    b->stored[i] = full;
    b->decode_store[i] = decode;
    return KVO_OK;
fail:
    b->n--;
    return st;
}

static void ev_builder_fini(ev_builder *b) {
    kvo_free(b->ev);
    kvo_free(b->removed_parent);
    kvo_free(b->decode_store);
    kvo_free(b->stored);
    kvo_free(b->parent);
    kvo_free(b->removed);
    kvo_free(b->removed_hash);
    kvo_free(b->removed_wire);
    kvo_arena_fini(&b->arena);
    b->batch.events = NULL;
    b->batch.n_events = 0;
    wire_batch_fini(&b->batch);
}

/* The step's stores go after its removals (DESIGN §8: "one KVEventBatch per
 * scheduler step, removals of the step before its stores"). vLLM's queue is
 * in occurrence order, where each allocation evicts before it caches; the
 * two orders differ only across requests of one step, and both rebuild the
 * same index (a block stored in a step is held by its request, so it is
 * never evicted in that step). */
static kvo_status ev_append_stores(ev_builder *b, const ev_builder *s) {
    for (uint32_t k = 0; k < s->n; k++) {
        wire_event *ev = ev_push(b, WIRE_EV_STORED);
        if (!ev) return KVO_ENOMEM;
        uint32_t i = b->n - 1;
        *ev = s->ev[k];
        b->stored[i] = s->stored[k];
        b->parent[i] = s->parent[k];
        b->decode_store[i] = s->decode_store[k];
    }
    return KVO_OK;
}

/* ---- lifecycle ------------------------------------------------------------*/

kvo_status mock_engine_new(mock_engine **out, const mock_cfg *cfg,
                           uint32_t dp_rank, mock_hasher *hasher) {
    if (!out || !cfg || !hasher || cfg->block_size == 0 ||
        cfg->num_gpu_blocks < 2 || cfg->max_num_seqs == 0 ||
        cfg->max_num_batched_tokens == 0)
        return KVO_EINVAL;
    mock_engine *e = kvo_calloc(1, sizeof(*e));
    if (!e) return KVO_ENOMEM;
    e->cfg = *cfg;
    e->rank = dp_rank;
    e->hasher = hasher;
    e->max_model_len = mock_cfg_max_model_len(cfg);
    e->events = cfg->prefix_caching && cfg->role != MOCK_ROLE_DECODE;
    e->next_id = 1;
    kvo_arena_init(&e->ev.arena);
    wire_batch_init(&e->ev.batch);
    kvo_arena_init(&e->evs.arena);
    wire_batch_init(&e->evs.batch);
    kvo_buf_init(&e->extra_buf);
    kvo_status st = pool_init(&e->pool, cfg->num_gpu_blocks, cfg->prefix_caching);
    if (st != KVO_OK) {
        mock_engine_free(e);
        return st;
    }
    e->pool.on_evict = on_evict;
    e->pool.evict_ctx = e;
    *out = e;
    return KVO_OK;
}

static uint64_t *memdup_u64(const uint64_t *p, uint32_t n) {
    uint64_t *d = kvo_malloc((size_t)n * sizeof(uint64_t));
    if (d) memcpy(d, p, (size_t)n * sizeof(uint64_t));
    return d;
}

void eng_req_destroy(mock_req *r) {
    if (!r) return;
    kvo_free(r->trace_ids);
    kvo_free(r->tokens);
    kvo_free(r->bh);
    kvo_free(r->blocks);
    kvo_free(r->lora);
    kvo_free(r->salt);
    kvo_free(r);
}

void mock_engine_free(mock_engine *e) {
    if (!e) return;
    for (uint32_t i = 0; i < e->running.n; i++) eng_req_destroy(e->running.v[i]);
    for (uint32_t i = 0; i < e->waiting.n; i++)
        eng_req_destroy(e->waiting.v[(e->waiting.head + i) % e->waiting.cap]);
    kvo_free(e->running.v);
    kvo_free(e->waiting.v);
    kvo_free(e->scheduled.v);
    kvo_free(e->started);
    ev_builder_fini(&e->ev);
    ev_builder_fini(&e->evs);
    kvo_buf_fini(&e->extra_buf);
    for (uint32_t i = 0; i < e->n_loras; i++) kvo_free(e->loras[i]);
    kvo_free(e->loras);
    pool_fini(&e->pool);
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
    if (e->n_loras >= 4096) return KVO_ETOOBIG;
    char **v = kvo_realloc(e->loras, (e->n_loras + 1) * sizeof(*v));
    if (!v) return KVO_ENOMEM;
    e->loras = v;
    if (!(v[e->n_loras] = kvo_strdup(name))) return KVO_ENOMEM;
    *id = ++e->n_loras;
    return KVO_OK;
}

kvo_status eng_deque_push(req_deque *d, mock_req *r, bool front) {
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 64;
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

kvo_status eng_req_append_token(mock_engine *e, mock_req *r, uint64_t tok) {
    uint32_t bs = e->cfg.block_size;
    if (r->n_tokens == r->cap_tokens) return KVO_ESTATE; /* sized at add */
    r->tokens[r->n_tokens++] = tok;
    /* vLLM's request.block_hashes grows as tokens fill blocks. */
    if (e->cfg.prefix_caching && r->n_tokens % bs == 0) {
        uint32_t blk = r->n_tokens / bs - 1;
        if (blk != r->n_bh) return KVO_ESTATE;
        kvo_status st = mock_hasher_blocks(
            e->hasher, r->tokens, bs, blk, 1, blk ? &r->bh[blk - 1] : NULL,
            r->lora, r->salt, NULL, &r->bh[blk]);
        if (st != KVO_OK) return st;
        r->n_bh++;
    }
    return KVO_OK;
}

/* Tokens and block hashes are filled in when the request first competes
 * for admission (both are pure functions of the request, so when they are
 * computed changes nothing): a long waiting queue of trace requests then
 * holds only their hash ids. */
kvo_status eng_req_materialize(mock_engine *e, mock_req *r) {
    if (r->materialized) return KVO_OK;
    uint32_t bs = e->cfg.block_size;
    if (!r->tokens) {
        r->tokens = kvo_malloc((size_t)r->cap_tokens * sizeof(uint64_t));
        if (!r->tokens) return KVO_ENOMEM;
        mock_trace_tokens(r->trace_ids, r->n_trace, r->n_prompt, r->tokens);
    }
    if (e->cfg.prefix_caching) {
        if (!r->bh) {
            r->bh = kvo_malloc((size_t)r->cap_bh * sizeof(mock_hash));
            if (!r->bh) return KVO_ENOMEM;
        }
        uint32_t nb = r->n_prompt / bs;
        mock_trace_ref tr = {r->trace_ids, r->n_trace};
        kvo_status st =
            mock_hasher_blocks(e->hasher, r->tokens, bs, 0, nb, NULL, r->lora,
                               r->salt, r->trace_ids ? &tr : NULL, r->bh);
        if (st != KVO_OK) return st;
        r->n_bh = nb;
    }
    kvo_free(r->trace_ids);
    r->trace_ids = NULL;
    r->n_trace = 0;
    r->materialized = true;
    return KVO_OK;
}

kvo_status mock_engine_add(mock_engine *e, const mock_req_in *in,
                           uint64_t *req_id) {
    if (!e || !in || in->n_tokens == 0 || in->max_tokens == 0) return KVO_EINVAL;
    bool trace = in->trace.hash_ids && in->trace.n_hash_ids;
    if (!in->tokens && (!trace || mock_trace_validate(in->trace.hash_ids,
                                                      in->trace.n_hash_ids,
                                                      in->n_tokens) != KVO_OK))
        return KVO_EINVAL;
    uint32_t max_tokens = in->max_tokens;
    if (e->cfg.role == MOCK_ROLE_PREFILL) max_tokens = 1;
    if ((uint64_t)in->n_tokens + max_tokens > e->max_model_len)
        return KVO_ETOOBIG;
    uint32_t bs = e->cfg.block_size;
    kvo_status st = KVO_ENOMEM;
    mock_req *r = kvo_calloc(1, sizeof(*r));
    if (!r) return KVO_ENOMEM;
    r->cap_tokens = in->n_tokens + max_tokens;
    r->cap_bh = r->cap_tokens / bs + 1;
    r->cap_blocks = (r->cap_tokens + bs - 1) / bs;
    r->blocks = kvo_malloc((size_t)r->cap_blocks * sizeof(uint32_t));
    if (!r->blocks) goto fail;
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
    if (in->lora_name && *in->lora_name) {
        if (!(r->lora = kvo_strdup(in->lora_name))) goto fail;
        if ((st = lora_id_of(e, r->lora, &r->lora_id)) != KVO_OK) goto fail;
        st = KVO_ENOMEM;
    }
    if (in->cache_salt && *in->cache_salt &&
        !(r->salt = kvo_strdup(in->cache_salt)))
        goto fail;
    r->id = e->next_id++;
    r->rng = e->cfg.seed ^ ((uint64_t)e->rank << 48) ^ (r->id * 0xD1B54A32D192ED03ull);
    kvo_splitmix64(&r->rng);
    st = eng_deque_push(&e->waiting, r, false);
    if (st != KVO_OK) goto fail;
    r->status = REQ_WAITING;
    e->st.requests_added++;
    e->st.prompt_tokens += in->n_tokens;
    if (req_id) *req_id = r->id;
    return KVO_OK;
fail:
    eng_req_destroy(r);
    return st;
}

uint64_t eng_sample_token(mock_req *r) {
    return kvo_splitmix64(&r->rng) % MOCK_TRACE_VOCAB;
}

bool mock_engine_has_work(const mock_engine *e) {
    return e->running.n > 0 || e->waiting.n > 0;
}

bool mock_engine_has_events(const mock_engine *e) { return e->pending_clear; }

/* ---- probe, reset, stats, inspection -------------------------------------*/

uint32_t mock_engine_probe(const mock_engine *e, const mock_hash *hashes,
                           uint32_t n_tokens) {
    if (!e->cfg.prefix_caching || n_tokens == 0) return 0;
    uint32_t cap = (n_tokens - 1) / e->cfg.block_size;
    uint32_t h = 0;
    while (h < cap && pool_lookup(&e->pool, hashes[h].key) != MOCK_NIL) h++;
    return h;
}

bool mock_engine_cached(const mock_engine *e, uint64_t key) {
    return e->cfg.prefix_caching && pool_lookup(&e->pool, key) != MOCK_NIL;
}

bool mock_engine_reset_prefix_cache(mock_engine *e) {
    if (!pool_reset(&e->pool)) return false;
    if (e->events) e->pending_clear = true;
    e->st.cleared++;
    return true;
}

void mock_engine_stats_get(const mock_engine *e, mock_engine_stats *out) {
    *out = e->st;
    out->requests_running = e->running.n;
    out->requests_waiting = e->waiting.n;
    out->resident_blocks = e->pool.n_cached;
    out->free_blocks = e->pool.n_free;
    out->used_blocks = e->pool.n - 1 - e->pool.n_free;
    out->usage = pool_usage(&e->pool);
}

kvo_status mock_engine_block(const mock_engine *e, uint32_t block_id,
                             mock_block_info *out) {
    if (block_id >= e->pool.n) return KVO_EINVAL;
    const pool_block *b = &e->pool.blocks[block_id];
    memset(out, 0, sizeof(*out));
    out->ref = b->ref;
    out->cached = b->cached;
    out->in_free_queue = b->in_free;
    if (b->cached) out->hash = e->pool.hash[block_id];
    return KVO_OK;
}

uint32_t mock_engine_free_queue(const mock_engine *e, uint32_t *ids,
                                uint32_t max) {
    uint32_t n = 0;
    for (uint32_t id = e->pool.head; id != MOCK_NIL && n < max;
         id = e->pool.blocks[id].next)
        ids[n++] = id;
    return n;
}

uint32_t mock_engine_copies(const mock_engine *e, uint64_t key, uint32_t *ids,
                            uint32_t max) {
    uint32_t n = 0;
    for (uint32_t id = pool_lookup(&e->pool, key); id != MOCK_NIL && n < max;
         id = e->pool.blocks[id].cnext)
        ids[n++] = id;
    return n;
}

kvo_status mock_engine_req_blocks(const mock_engine *e, uint64_t req_id,
                                  const uint32_t **ids, uint32_t *n) {
    for (uint32_t i = 0; i < e->running.n; i++) {
        const mock_req *r = e->running.v[i];
        if (r->id == req_id) {
            *ids = r->blocks;
            *n = r->n_blocks;
            return KVO_OK;
        }
    }
    return KVO_ENOTFOUND;
}

kvo_status mock_engine_schedule(mock_engine *e, double ts, mock_step *out) {
    if (!e || !out) return KVO_EINVAL;
    if (e->step_open) return KVO_ESTATE;
    ev_builder *b = &e->ev;
    b->n = 0;
    kvo_arena_reset(&b->arena);
    e->evs.n = 0;
    kvo_arena_reset(&e->evs.arena);
    if (e->pending_clear) {
        e->pending_clear = false;
        if (!ev_push(b, WIRE_EV_CLEARED)) return KVO_ENOMEM;
    }
    kvo_status st = sched_step(e, out);
    if (st == KVO_OK) st = ev_append_stores(b, &e->evs);
    if (st != KVO_OK) return st;
    out->batch = NULL;
    out->aux = NULL;
    if (b->n > 0) {
        for (uint32_t i = 0; i < b->n; i++) {
            if (b->ev[i].type != WIRE_EV_REMOVED) continue;
            b->ev[i].hashes = &b->removed_wire[i];
            b->removed[i] = &b->removed_hash[i];
        }
        wire_batch *wb = &b->batch;
        wb->ts = ts;
        wb->batch_len = 3;
        wb->dp_rank = (wire_int){true, e->rank};
        wb->n_events = b->n;
        wb->events = b->ev;
        b->aux = (mock_step_aux){b->removed_parent, b->decode_store, b->stored,
                                 b->parent, b->removed};
        out->batch = wb;
        out->aux = &b->aux;
        e->st.batches++;
        e->st.events += b->n;
    }
    return KVO_OK;
}

void mock_engine_complete(mock_engine *e) {
    if (e && e->step_open) sched_complete(e);
}

void eng_abort_deliver(mock_engine *e, mock_req *r) {
    mock_output o = {
        .req_id = r->id,
        .n_output = r->n_tokens - r->n_prompt,
        .finish = MOCK_FINISH_ABORTED,
        .cached_tokens =
            r->num_cached_tokens > 0 ? (uint32_t)r->num_cached_tokens : 0,
        .n_prompt = r->n_prompt};
    if (r->on_output) r->on_output(r->user, &o);
    e->st.requests_aborted++;
    eng_req_destroy(r);
}

kvo_status mock_engine_abort(mock_engine *e, uint64_t req_id) {
    for (uint32_t i = 0; i < e->running.n; i++) {
        mock_req *r = e->running.v[i];
        if (r->id != req_id) continue;
        if (e->step_open) {
            r->aborted = true; /* in the open step: complete() ends it */
            return KVO_OK;
        }
        sched_free_req(e, r);
        memmove(&e->running.v[i], &e->running.v[i + 1],
                (e->running.n - i - 1) * sizeof(mock_req *));
        e->running.n--;
        eng_abort_deliver(e, r);
        return KVO_OK;
    }
    req_deque *d = &e->waiting;
    for (uint32_t i = 0; i < d->n; i++) {
        mock_req *r = d->v[(d->head + i) % d->cap];
        if (r->id != req_id) continue;
        for (uint32_t j = i; j + 1 < d->n; j++)
            d->v[(d->head + j) % d->cap] = d->v[(d->head + j + 1) % d->cap];
        d->n--;
        eng_abort_deliver(e, r);
        return KVO_OK;
    }
    return KVO_ENOTFOUND;
}
