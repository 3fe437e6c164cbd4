/* mock_pool.c -- vLLM v1's BlockPool (vllm/v1/core/block_pool.py) with its
 * FreeKVCacheBlockQueue (kv_cache_utils.py) and BlockHashToBlockMap.
 *
 *   free queue:  head -> [b7] <-> [b3] <-> ... <-> [b9] <- tail
 *                popped from the head by allocation, freed blocks appended
 *                at the tail, hit blocks unlinked from the middle (touch).
 *                Initially blocks 1..N-1 in id order (block 0 is the null
 *                block vLLM pops at start-up and never frees).
 *   cached map:  open addressing on the hash's low 64 bits (linear probing,
 *                backward-shift deletion, never more than N keys so it
 *                never grows); each slot heads a list of the physical
 *                copies of that hash, oldest first. A lookup returns the
 *                oldest copy, as `get_one_block` returns the first entry of
 *                the insertion-ordered dict.
 *
 * Two digests that agree in their low 64 bits are one key here: that is
 * the identity every consumer of the int form uses anyway (p ~ 2^-64).
 */
#include "mock_int.h"

#include <string.h>

static uint64_t slot_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

kvo_status pool_init(mock_pool *p, uint32_t n, bool caching) {
    memset(p, 0, sizeof(*p));
    if (n < 2) return KVO_EINVAL;
    uint32_t cap = 16;
    while (cap < 2u * n && cap < (1u << 31)) cap <<= 1;
    p->blocks = kvo_calloc(n, sizeof(*p->blocks));
    p->hash = kvo_calloc(n, sizeof(*p->hash));
    p->parent = kvo_calloc(n, sizeof(*p->parent));
    p->map = kvo_malloc((size_t)cap * sizeof(*p->map));
    if (!p->blocks || !p->hash || !p->parent || !p->map) {
        pool_fini(p);
        return KVO_ENOMEM;
    }
    for (uint32_t i = 0; i < cap; i++) p->map[i].head = MOCK_NIL;
    p->map_mask = cap - 1;
    p->n = n;
    p->caching = caching;
    /* Block 0 is the null block: ref never maintained, never free. */
    for (uint32_t i = 0; i < n; i++) {
        pool_block *b = &p->blocks[i];
        b->cprev = b->cnext = MOCK_NIL;
        b->prev = (i > 1) ? i - 1 : MOCK_NIL;
        b->next = (i + 1 < n && i > 0) ? i + 1 : MOCK_NIL;
        b->in_free = i > 0;
    }
    p->blocks[0].prev = p->blocks[0].next = MOCK_NIL;
    p->head = 1;
    p->tail = n - 1;
    p->n_free = n - 1;
    return KVO_OK;
}

void pool_fini(mock_pool *p) {
    kvo_free(p->blocks);
    kvo_free(p->hash);
    kvo_free(p->parent);
    kvo_free(p->map);
    memset(p, 0, sizeof(*p));
}

/* ---- free queue -----------------------------------------------------------*/

static void q_unlink(mock_pool *p, uint32_t id) {
    pool_block *b = &p->blocks[id];
    if (b->prev != MOCK_NIL) p->blocks[b->prev].next = b->next;
    else p->head = b->next;
    if (b->next != MOCK_NIL) p->blocks[b->next].prev = b->prev;
    else p->tail = b->prev;
    b->prev = b->next = MOCK_NIL;
    b->in_free = false;
    p->n_free--;
}

static void q_append(mock_pool *p, uint32_t id) {
    pool_block *b = &p->blocks[id];
    b->prev = p->tail;
    b->next = MOCK_NIL;
    if (p->tail != MOCK_NIL) p->blocks[p->tail].next = id;
    else p->head = id;
    p->tail = id;
    b->in_free = true;
    p->n_free++;
}

/* ---- cached map -----------------------------------------------------------*/

static uint32_t map_find(const mock_pool *p, uint64_t key) {
    uint32_t i = (uint32_t)slot_hash(key) & p->map_mask;
    for (;;) {
        const pool_slot *s = &p->map[i];
        if (s->head == MOCK_NIL) return MOCK_NIL;
        if (s->key == key) return i;
        i = (i + 1) & p->map_mask;
    }
}

static void map_delete_slot(mock_pool *p, uint32_t i) {
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & p->map_mask;
        pool_slot *s = &p->map[j];
        if (s->head == MOCK_NIL) break;
        uint32_t home = (uint32_t)slot_hash(s->key) & p->map_mask;
        /* Move s into the hole at i when its home is not in (i, j]. */
        bool between = (i <= j) ? (home > i && home <= j)
                                : (home > i || home <= j);
        if (!between) {
            p->map[i] = *s;
            i = j;
        }
    }
    p->map[i].head = MOCK_NIL;
}

uint32_t pool_lookup(const mock_pool *p, uint64_t key) {
    uint32_t i = map_find(p, key);
    return i == MOCK_NIL ? MOCK_NIL : p->map[i].head;
}

void pool_cache(mock_pool *p, uint32_t id, const mock_hash *h,
                const mock_hash *parent) {
    pool_block *b = &p->blocks[id];
    b->cached = true;
    b->key = h->key;
    p->hash[id] = *h;
    if (parent) p->parent[id] = *parent;
    else memset(&p->parent[id], 0, sizeof(mock_hash));
    b->cnext = MOCK_NIL;
    uint32_t i = (uint32_t)slot_hash(h->key) & p->map_mask;
    for (;;) {
        pool_slot *s = &p->map[i];
        if (s->head == MOCK_NIL) {
            s->key = h->key;
            s->head = s->tail = id;
            b->cprev = MOCK_NIL;
            break;
        }
        if (s->key == h->key) {
            b->cprev = s->tail;
            p->blocks[s->tail].cnext = id;
            s->tail = id;
            break;
        }
        i = (i + 1) & p->map_mask;
    }
    p->n_cached++;
}

/* Drop block id's hash (vLLM _maybe_evict_cached_block minus the event). */
static void uncache(mock_pool *p, uint32_t id) {
    pool_block *b = &p->blocks[id];
    uint32_t i = map_find(p, b->key);
    if (i != MOCK_NIL) {
        pool_slot *s = &p->map[i];
        if (b->cprev != MOCK_NIL) p->blocks[b->cprev].cnext = b->cnext;
        else s->head = b->cnext;
        if (b->cnext != MOCK_NIL) p->blocks[b->cnext].cprev = b->cprev;
        else s->tail = b->cprev;
        if (s->head == MOCK_NIL) map_delete_slot(p, i);
    }
    b->cprev = b->cnext = MOCK_NIL;
    b->cached = false;
    p->n_cached--;
}

/* ---- operations -----------------------------------------------------------*/

void pool_touch(mock_pool *p, const uint32_t *ids, uint32_t n) {
    for (uint32_t k = 0; k < n; k++) {
        pool_block *b = &p->blocks[ids[k]];
        if (b->ref == 0 && ids[k] != 0) q_unlink(p, ids[k]);
        b->ref++;
    }
}

void pool_alloc(mock_pool *p, uint32_t n, uint32_t *out) {
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = p->head;
        q_unlink(p, id);
        pool_block *b = &p->blocks[id];
        if (b->cached) {
            p->evicted++;
            if (p->on_evict) p->on_evict(p->evict_ctx, &p->hash[id], &p->parent[id]);
            uncache(p, id);
        }
        b->ref = 1;
        out[k] = id;
    }
}

void pool_release(mock_pool *p, const uint32_t *ids, uint32_t n) {
    for (uint32_t k = 0; k < n; k++) {
        if (ids[k] == 0) continue;
        pool_block *b = &p->blocks[ids[k]];
        if (--b->ref == 0) q_append(p, ids[k]);
    }
}

bool pool_reset(mock_pool *p) {
    if (p->n_free != p->n - 1) return false;
    for (uint32_t i = 0; i < p->n; i++) {
        pool_block *b = &p->blocks[i];
        b->cached = false;
        b->cprev = b->cnext = MOCK_NIL;
    }
    for (uint32_t i = 0; i <= p->map_mask; i++) p->map[i].head = MOCK_NIL;
    p->n_cached = 0;
    return true;
}

double pool_usage(const mock_pool *p) {
    return 1.0 - (double)p->n_free / (double)(p->n - 1);
}
