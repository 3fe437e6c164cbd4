/* mock_events.c -- one step's KV-event batch, built the way vLLM's
 * BlockPool queues its events: in the order they happen (DESIGN §8).
 *
 *   [AllBlocksCleared]            queued by a reset, first
 *   for each request the step allocates for (running ones first, then the
 *   newly scheduled, in scheduling order):
 *     per cached block its allocation evicted, at the moment the pool
 *     pops it from the free queue (the evict callback: deepest first when
 *     a request's blocks were freed tail first):
 *       [BlockRemoved Y (CPU)]    with --cpu-offload-blocks, a full tier's
 *                                 LRU block Y, evicted to make room
 *       [BlockStored X (CPU)]     the evicted block X offloaded (none when
 *                                 the tier holds X already)
 *       BlockRemoved X            the GPU's own removal
 *     BlockStored                 the blocks its scheduled tokens complete
 *                                 (one cache_full_blocks call, with the
 *                                 parent's hash)
 *
 * So under load a step's removals and stores interleave, request by
 * request, exactly as vLLM's event queue has them. The CPU copy is
 * announced before the GPU frees its block: an index (DESIGN §7) detaches
 * a node's children when its last holder leaves, so a GPU removal first
 * would cut the CPU run under X.
 *
 * Hashes go out as vLLM's default int form (low 64 bits); the full digests
 * ride along in the aux arrays for mock_render (raw-digest form,
 * mutations). Stored tokens and hashes point into the requests, which live
 * until mock_engine_complete (a CPU store's, into the step's arena).
 */
#include "mock_int.h"

#include <msgpack.h>
#include <string.h>

/* First capacity of a builder's per-event arrays. */
#define EV_FIRST_CAP 64
/* A wire_str of a string literal. */
#define WIRE_LIT(s) ((wire_str){s, sizeof(s) - 1})

static void builder_init(ev_builder *b) {
    memset(b, 0, sizeof(*b));
    kvo_arena_init(&b->arena);
    wire_batch_init(&b->batch);
}

static void builder_fini(ev_builder *b) {
    kvo_free(b->ev);
    kvo_free(b->removed_parent);
    kvo_free(b->decode_store);
    kvo_free(b->stored);
    kvo_free(b->parent);
    kvo_free(b->removed);
    kvo_free(b->removed_hash);
    kvo_free(b->removed_wire);
    kvo_free(b->removed_meta);
    kvo_free(b->keys);
    kvo_free(b->first);
    kvo_arena_fini(&b->arena);
    b->batch.events = NULL;
    b->batch.n_events = 0;
    wire_batch_fini(&b->batch);
}

static void builder_reset(ev_builder *b) {
    b->n = 0;
    kvo_arena_reset(&b->arena);
}

/* One per-event array from the builder's capacity to the next (base's
 * kvo_grow: 64, then doubling). */
static kvo_status grow_array(const ev_builder *b, void *items_pp, size_t elem,
                             size_t *cap) {
    *cap = b->cap;
    return kvo_grow(items_pp, cap, (size_t)b->n + 1, elem, EV_FIRST_CAP);
}

/* Room for one more event in every per-event array. They share b->cap: each
 * grows from it to the same next capacity, and b->cap moves only when all
 * have (one that fails leaves the ones before it larger, which is
 * harmless). */
static kvo_status builder_grow(ev_builder *b) {
    if (b->n < b->cap) return KVO_OK;
    size_t cap = 0;
    kvo_status st;
    if ((st = grow_array(b, &b->ev, sizeof(*b->ev), &cap)) != KVO_OK ||
        (st = grow_array(b, &b->removed_parent, sizeof(*b->removed_parent),
                         &cap)) != KVO_OK ||
        (st = grow_array(b, &b->decode_store, sizeof(*b->decode_store),
                         &cap)) != KVO_OK ||
        (st = grow_array(b, &b->stored, sizeof(*b->stored), &cap)) != KVO_OK ||
        (st = grow_array(b, &b->parent, sizeof(*b->parent), &cap)) != KVO_OK ||
        (st = grow_array(b, &b->removed, sizeof(*b->removed), &cap)) !=
            KVO_OK ||
        (st = grow_array(b, &b->removed_hash, sizeof(*b->removed_hash),
                         &cap)) != KVO_OK ||
        (st = grow_array(b, &b->removed_wire, sizeof(*b->removed_wire),
                         &cap)) != KVO_OK ||
        (st = grow_array(b, &b->removed_meta, sizeof(*b->removed_meta),
                         &cap)) != KVO_OK ||
        (st = grow_array(b, &b->keys, sizeof(*b->keys), &cap)) != KVO_OK ||
        (st = grow_array(b, &b->first, sizeof(*b->first), &cap)) != KVO_OK)
        return st;
    b->cap = (uint32_t)cap;
    return KVO_OK;
}

/* A fresh event slot with vLLM's BlockPool defaults filled in. */
static wire_event *builder_push(ev_builder *b, wire_ev_type type) {
    if (builder_grow(b) != KVO_OK) return NULL;
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
    b->removed_meta[i] = (mock_block_meta){NULL, 0, NULL, 0};
    b->keys[i] = (mock_keys){NULL, NULL, NULL, 0};
    b->first[i] = 0;
    if (type != WIRE_EV_CLEARED) {
        ev->medium = WIRE_LIT("GPU");
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

void events_init(step_events *s, bool enabled, uint32_t block_size) {
    memset(s, 0, sizeof(*s));
    s->enabled = enabled;
    s->block_size = block_size;
    builder_init(&s->ev);
    kvo_buf_init(&s->extra_buf);
}

void events_fini(step_events *s) {
    builder_fini(&s->ev);
    kvo_buf_fini(&s->extra_buf);
    kvo_free(s->mmk);
}

void events_begin(step_events *s) {
    builder_reset(&s->ev);
    s->step_lost = 0;
}

kvo_status events_cleared(step_events *s) {
    if (!s->enabled) return KVO_OK;
    return builder_push(&s->ev, WIRE_EV_CLEARED) ? KVO_OK : KVO_ENOMEM;
}

/* The hash is copied (the block is about to be reused); the event's
 * pointers into the per-event arrays are set by events_finish, as the
 * arrays may still grow. The kept tokens too: the block may be cached
 * again, with others, later in the step. */
void events_on_evict(step_events *s, const mock_hash *hash,
                     const mock_hash *parent, const mock_block_meta *meta) {
    if (!s->enabled) return;
    ev_builder *b = &s->ev;
    wire_event *ev = builder_push(b, WIRE_EV_REMOVED);
    if (!ev) { /* out of memory: the event is lost, and counted */
        s->step_lost++;
        s->lost_enomem++;
        return;
    }
    uint32_t i = b->n - 1;
    b->removed_hash[i] = *hash;
    hash_int_form(&b->removed_wire[i], hash);
    ev->n_hashes = 1;
    b->removed_parent[i] = *parent;
    if (meta) ev->group_idx = (wire_int){true, meta->group};
    if (meta && meta->tokens && s->block_size) {
        uint64_t *t = kvo_arena_memdup(&b->arena, meta->tokens,
                                       s->block_size * sizeof(uint64_t));
        if (t)
            b->removed_meta[i] = (mock_block_meta){
                t, meta->lora_id, meta->lora_name, meta->group};
    }
}

/* A CPU-tier event slot (medium CPU), pushed at the moment the tier acts;
 * NULL (counted lost) out of memory. */
static wire_event *cpu_push(step_events *s, wire_ev_type type) {
    wire_event *ev = builder_push(&s->ev, type);
    if (!ev) {
        s->step_lost++;
        s->lost_enomem++;
        return NULL;
    }
    ev->medium = WIRE_LIT("CPU");
    return ev;
}

/* The tokens are copied: the tier's slot may be reused later in the step. */
void events_cpu_stored(step_events *s, const mock_hash *hash,
                       const mock_hash *parent, const mock_block_meta *meta,
                       uint32_t block_size) {
    if (!s->enabled) return;
    ev_builder *b = &s->ev;
    uint64_t *t = kvo_arena_memdup(&b->arena, meta->tokens,
                                   block_size * sizeof(uint64_t));
    mock_hash *h = kvo_arena_memdup(&b->arena, hash, sizeof(mock_hash));
    wire_hash *wh = kvo_arena_alloc(&b->arena, sizeof(wire_hash));
    wire_event *ev = t && h && wh ? cpu_push(s, WIRE_EV_STORED) : NULL;
    if (!ev) {
        if (!t || !h || !wh) {
            s->step_lost++;
            s->lost_enomem++;
        }
        return;
    }
    uint32_t i = b->n - 1;
    hash_int_form(wh, h);
    ev->n_hashes = 1;
    ev->hashes = wh;
    if (parent && parent->d.len) {
        hash_int_form(&ev->parent, parent);
        b->parent[i] = *parent;
    } else {
        ev->parent.kind = WIRE_HASH_NONE;
    }
    ev->n_tokens = block_size;
    ev->token_ids = t;
    ev->block_size = (wire_int){true, block_size};
    if (meta->lora_name) {
        ev->lora_id = (wire_int){true, meta->lora_id};
        ev->lora_name =
            (wire_str){meta->lora_name, (uint32_t)strlen(meta->lora_name)};
    }
    /* extra_keys: None (the tracker defers them); the group's spec */
    ev->kv_cache_spec_kind = WIRE_LIT("full_attention");
    b->stored[i] = h;
}

/* As events_on_evict: the hash pointers are set by events_finish. */
void events_cpu_removed(step_events *s, const mock_hash *hash,
                        const mock_hash *parent) {
    if (!s->enabled) return;
    ev_builder *b = &s->ev;
    wire_event *ev = cpu_push(s, WIRE_EV_REMOVED);
    if (!ev) return;
    uint32_t i = b->n - 1;
    b->removed_hash[i] = *hash;
    hash_int_form(&b->removed_wire[i], hash);
    ev->n_hashes = 1;
    if (parent) b->removed_parent[i] = *parent;
}

static int kvobuf_write(void *data, const char *p, size_t n) {
    return kvo_buf_append(data, p, n) == KVO_OK ? 0 : -1;
}

static kvo_status pack_str(msgpack_packer *pk, const char *str) {
    size_t len = strlen(str);
    return msgpack_pack_str(pk, len) || msgpack_pack_str_body(pk, str, len)
               ? KVO_ENOMEM
               : KVO_OK;
}

kvo_status events_extra_keys(kvo_buf *b, wire_mm_key **mmk, size_t *cap_mmk,
                             uint32_t first, uint32_t n, uint32_t bs,
                             const mock_keys *k, bool lora_as_mm) {
    kvo_buf_reset(b);
    if (k->n_mm && kvo_grow(mmk, cap_mmk, k->n_mm, sizeof(**mmk), 16) != KVO_OK)
        return KVO_ENOMEM;
    msgpack_packer pk;
    msgpack_packer_init(&pk, b, kvobuf_write);
    if (msgpack_pack_array(&pk, n)) return KVO_ENOMEM;
    int64_t idx = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t start = (uint64_t)(first + i) * bs;
        uint32_t nm = k->n_mm ? mock_mm_block_keys(k->mm, k->n_mm, start,
                                                   start + bs, &idx, *mmk)
                              : 0;
        bool salt = k->salt && first + i == 0;
        uint32_t nk = (k->lora ? 1u : 0u) + nm + (salt ? 1u : 0u);
        if (nk == 0) {
            if (msgpack_pack_nil(&pk)) return KVO_ENOMEM;
            continue;
        }
        if (msgpack_pack_array(&pk, nk)) return KVO_ENOMEM;
        if (k->lora && lora_as_mm &&
            (msgpack_pack_array(&pk, 2) || pack_str(&pk, k->lora) ||
             msgpack_pack_int64(&pk, 0)))
            return KVO_ENOMEM;
        if (k->lora && !lora_as_mm && pack_str(&pk, k->lora) != KVO_OK)
            return KVO_ENOMEM;
        for (uint32_t j = 0; j < nm; j++)
            if (msgpack_pack_array(&pk, 2) || pack_str(&pk, (*mmk)[j].id) ||
                msgpack_pack_int64(&pk, (*mmk)[j].offset))
                return KVO_ENOMEM;
        if (salt && pack_str(&pk, k->salt) != KVO_OK) return KVO_ENOMEM;
    }
    return KVO_OK;
}

kvo_status events_stored(step_events *s, const mock_req *r, uint32_t first,
                         uint32_t n, uint32_t block_size, bool decode) {
    return events_stored_g(s, r, first, n, block_size, decode, 0, 0);
}

kvo_status events_stored_g(step_events *s, const mock_req *r, uint32_t first,
                           uint32_t n, uint32_t block_size, bool decode,
                           uint32_t g, uint32_t window) {
    if (!s->enabled || n == 0) return KVO_OK;
    ev_builder *b = &s->ev;
    uint32_t bs = block_size;
    wire_event *ev = builder_push(b, WIRE_EV_STORED);
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
    mock_keys k = req_keys(r);
    st = events_extra_keys(&s->extra_buf, &s->mmk, &s->cap_mmk, first, n, bs,
                           &k, false);
    if (st != KVO_OK) goto fail;
    st = KVO_ENOMEM;
    void *ek = kvo_arena_memdup(&b->arena, s->extra_buf.data, s->extra_buf.len);
    if (!ek) goto fail;
    ev->extra_keys = (wire_raw){ek, (uint32_t)s->extra_buf.len};
    if (window) { /* KVCacheManager.take_events' annotation of the group */
        ev->group_idx = (wire_int){true, g};
        ev->kv_cache_spec_kind = WIRE_LIT("sliding_window");
        ev->kv_cache_spec_sliding_window = (wire_int){true, window};
    } else {
        ev->group_idx = (wire_int){true, g};
        ev->kv_cache_spec_kind = WIRE_LIT("full_attention");
    }
    b->stored[i] = full;
    b->decode_store[i] = decode;
    b->keys[i] = k;
    b->first[i] = first;
    return KVO_OK;
fail:
    b->n--;
    return st;
}

kvo_status events_finish(step_events *s, double ts, uint32_t rank,
                         const wire_batch **batch, const mock_step_aux **aux) {
    ev_builder *b = &s->ev;
    *batch = NULL;
    *aux = NULL;
    if (b->n == 0) return KVO_OK;
    for (uint32_t i = 0; i < b->n; i++) {
        if (b->ev[i].type != WIRE_EV_REMOVED) continue;
        b->ev[i].hashes = &b->removed_wire[i];
        b->removed[i] = &b->removed_hash[i];
    }
    wire_batch *wb = &b->batch;
    wb->ts = ts;
    wb->batch_len = 3;
    wb->dp_rank = (wire_int){true, rank};
    wb->n_events = b->n;
    wb->events = b->ev;
    b->aux = (mock_step_aux){
        b->removed_parent, b->decode_store, b->stored, b->parent,
        b->removed,        b->removed_meta, b->keys,   b->first};
    *batch = wb;
    *aux = &b->aux;
    return KVO_OK;
}
