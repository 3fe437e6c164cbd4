/* mock_pool.c -- vLLM v1's BlockPool (vllm/v1/core/block_pool.py) with its
 * FreeKVCacheBlockQueue (kv_cache_utils.py) and BlockHashToBlockMap.
 *
 *   free queue:  head -> [b7] <-> [b3] <-> ... <-> [b9] <- tail
 *                popped from the head by allocation, freed blocks appended
 *                at the tail, hit blocks unlinked from the middle (touch).
 *                Initially blocks 1..N-1 in id order (block 0 is the null
 *                block vLLM pops at start-up and never frees).
 *   cached map:  base's kvo_map, the hash's low 64 bits -> the list of the
 *                physical copies of that hash, oldest first, linked through
 *                the blocks (pool_block.copies); the value packs the list's head
 *                (low 32 bits) and tail (high 32 bits), so appending a copy
 *                walks nothing. A lookup returns the head, the oldest copy,
 *                as `get_one_block` returns the first entry of the
 *                insertion-ordered dict. At most N-1 keys, so the map stops
 *                growing once it has held that many.
 *
 * With several KV-cache groups (--kv-groups) a block is cached for one
 * group, and the map key is (hash, group) -- vLLM's BlockHashWithGroupId --
 * the hash itself for group 0, mixed with the group for the others; the
 * cached set and its digest are kept per group.
 *
 * Two digests that agree in their low 64 bits are one key here: that is
 * the identity every consumer of the int form uses anyway (p ~ 2^-64).
 *
 * The cached set (what /kvo/blocks lists and a checkpoint compares with
 * the index): every distinct key, once however many copies hold it, with
 * its parent's key. n_distinct counts them and digest sums their
 * kvo_block_digest terms mod 2^64, both kept as the first copy of a key
 * is cached and its last copy evicted -- an order-independent digest that
 * any holder of the same (hash, parent) set computes alike.
 */
#include "mock_int.h"

#include <stdlib.h>
#include <string.h>

/* The digest term of block id's hash (its parent from the cold array). */
static uint64_t block_term(const mock_pool *p, uint32_t id) {
    const mock_hash *par = &p->parent[id];
    return kvo_block_digest(p->hash[id].key, par->d.len != 0, par->key);
}

/* The map key of (hash, group): the hash itself for group 0 (so a pool
 * with one group is keyed as before), mixed with the group otherwise. */
static uint64_t gkey(uint64_t key, uint32_t g) {
    return g ? kvo_mix64(key ^ (0x9E3779B97F4A7C15ull * g)) : key;
}

/* The map's value: a list's head and tail block ids. */
static uint64_t copies_pack(mock_list l) {
    return (uint64_t)l.tail << 32 | l.head;
}
static mock_list copies_unpack(uint64_t v) {
    return (mock_list){(uint32_t)v, (uint32_t)(v >> 32)};
}

kvo_status pool_init(mock_pool *p, uint32_t n, bool caching, uint32_t keep_bs) {
    memset(p, 0, sizeof(*p));
    if (n < 2) return KVO_EINVAL;
    p->blocks = kvo_calloc(n, sizeof(*p->blocks));
    p->hash = kvo_calloc(n, sizeof(*p->hash));
    p->parent = kvo_calloc(n, sizeof(*p->parent));
    kvo_map_init(&p->map);
    bool keep_ok = true;
    if (keep_bs) {
        p->bs = keep_bs;
        p->tok = kvo_malloc((size_t)n * keep_bs * sizeof(uint64_t));
        p->lora_id = kvo_calloc(n, sizeof(*p->lora_id));
        p->lora_name = kvo_calloc(n, sizeof(*p->lora_name));
        keep_ok = p->tok && p->lora_id && p->lora_name;
    }
    if (!p->blocks || !p->hash || !p->parent || !keep_ok) {
        pool_fini(p);
        return KVO_ENOMEM;
    }
    p->n = n;
    p->caching = caching;
    /* Block 0 is the null block: ref never maintained, never free. */
    p->free_q = MOCK_LIST_EMPTY;
    for (uint32_t i = 0; i < n; i++) {
        pool_block *b = &p->blocks[i];
        b->q = b->copies = (mock_link){MOCK_NIL, MOCK_NIL};
        if (i > 0) {
            mock_list_append(&p->free_q, MOCK_LINKS(p->blocks, q), i);
            b->in_free = true;
        }
    }
    p->n_free = n - 1;
    return KVO_OK;
}

void pool_fini(mock_pool *p) {
    kvo_free(p->blocks);
    kvo_free(p->hash);
    kvo_free(p->parent);
    kvo_free(p->tok);
    kvo_free(p->lora_id);
    kvo_free(p->lora_name);
    kvo_map_fini(&p->map);
    memset(p, 0, sizeof(*p));
}

/* ---- free queue -----------------------------------------------------------*/

static void q_unlink(mock_pool *p, uint32_t id) {
    mock_list_unlink(&p->free_q, MOCK_LINKS(p->blocks, q), id);
    p->blocks[id].in_free = false;
    p->n_free--;
}

static void q_append(mock_pool *p, uint32_t id) {
    mock_list_append(&p->free_q, MOCK_LINKS(p->blocks, q), id);
    p->blocks[id].in_free = true;
    p->n_free++;
}

/* ---- cached map -----------------------------------------------------------*/

uint32_t pool_lookup_g(const mock_pool *p, uint64_t key, uint32_t g) {
    /* kvo_map_get does not modify the map; it only lacks a const form. */
    const uint64_t *v = kvo_map_get((kvo_map *)&p->map, gkey(key, g));
    return v ? copies_unpack(*v).head : MOCK_NIL;
}

uint32_t pool_lookup(const mock_pool *p, uint64_t key) {
    return pool_lookup_g(p, key, 0);
}

kvo_status pool_cache(mock_pool *p, uint32_t id, const mock_hash *h,
                      const mock_hash *parent, const mock_block_meta *meta) {
    return pool_cache_g(p, id, h, parent, meta, 0);
}

kvo_status pool_cache_g(mock_pool *p, uint32_t id, const mock_hash *h,
                        const mock_hash *parent, const mock_block_meta *meta,
                        uint32_t g) {
    bool added;
    uint64_t *v = kvo_map_put(&p->map, gkey(h->key, g), &added);
    if (!v) return KVO_ENOMEM; /* nothing changed */
    if (p->tok && meta) {
        memcpy(&p->tok[(size_t)id * p->bs], meta->tokens,
               p->bs * sizeof(uint64_t));
        p->lora_id[id] = meta->lora_id;
        p->lora_name[id] = meta->lora_name;
    }
    pool_block *b = &p->blocks[id];
    b->cached = true;
    b->group = (uint8_t)g;
    b->key = gkey(h->key, g);
    p->hash[id] = *h;
    if (parent)
        p->parent[id] = *parent;
    else
        memset(&p->parent[id], 0, sizeof(mock_hash));
    mock_list l = added ? MOCK_LIST_EMPTY : copies_unpack(*v);
    mock_list_append(&l, MOCK_LINKS(p->blocks, copies), id);
    *v = copies_pack(l);
    if (added) {
        uint64_t t = block_term(p, id);
        p->g_distinct[g]++;
        p->g_digest[g] += t;
        if (g == 0) {
            p->n_distinct++;
            p->digest += t;
        }
    }
    p->n_cached++;
    return KVO_OK;
}

/* Drop block id's hash (vLLM _maybe_evict_cached_block minus the event). */
static void uncache(mock_pool *p, uint32_t id) {
    pool_block *b = &p->blocks[id];
    uint64_t *v = kvo_map_get(&p->map, b->key);
    if (v) {
        mock_list l = copies_unpack(*v);
        mock_list_unlink(&l, MOCK_LINKS(p->blocks, copies), id);
        if (l.head == MOCK_NIL) { /* its last copy: the key leaves the set */
            kvo_map_del(&p->map, b->key);
            uint64_t t = block_term(p, id);
            p->g_distinct[b->group]--;
            p->g_digest[b->group] -= t;
            if (b->group == 0) {
                p->n_distinct--;
                p->digest -= t;
            }
        } else {
            *v = copies_pack(l);
        }
    }
    b->copies = (mock_link){MOCK_NIL, MOCK_NIL};
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

uint32_t pool_alloc(mock_pool *p, uint32_t n, uint32_t *out) {
    uint32_t evicted = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = p->free_q.head;
        q_unlink(p, id);
        pool_block *b = &p->blocks[id];
        if (b->cached) {
            evicted++;
            p->evicted++;
            if (p->on_evict) {
                mock_block_meta m = {NULL, 0, NULL, b->group};
                if (p->tok)
                    m = (mock_block_meta){&p->tok[(size_t)id * p->bs],
                                          p->lora_id[id], p->lora_name[id],
                                          b->group};
                p->on_evict(p->evict_ctx, &p->hash[id], &p->parent[id], &m);
            }
            uncache(p, id);
        }
        b->ref = 1;
        out[k] = id;
    }
    return evicted;
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
        b->copies = (mock_link){MOCK_NIL, MOCK_NIL};
    }
    kvo_map_clear(&p->map);
    p->n_cached = 0;
    p->n_distinct = 0;
    p->digest = 0;
    memset(p->g_distinct, 0, sizeof(p->g_distinct));
    memset(p->g_digest, 0, sizeof(p->g_digest));
    return true;
}

/* A listed block: its hash key and the copy that stands for it. */
typedef struct key_id {
    uint64_t key;
    uint32_t id;
} key_id;

static int key_cmp(const void *a, const void *b) {
    uint64_t x = ((const key_id *)a)->key, y = ((const key_id *)b)->key;
    return x < y ? -1 : x > y;
}

kvo_status pool_list_g(const mock_pool *p, uint32_t g, bool has_after,
                       uint64_t after, mock_cached_block *out, uint32_t max,
                       uint32_t *n, bool *more) {
    *n = 0;
    *more = false;
    if (g >= MOCK_MAX_GROUPS || p->g_distinct[g] == 0) return KVO_OK;
    key_id *keys = kvo_malloc((size_t)p->g_distinct[g] * sizeof(*keys));
    if (!keys) return KVO_ENOMEM;
    /* a key's oldest copy (head of its list) stands for the key once */
    uint32_t k = 0;
    for (uint32_t id = 1; id < p->n; id++) {
        const pool_block *b = &p->blocks[id];
        if (!b->cached || b->copies.prev != MOCK_NIL || b->group != g) continue;
        if (has_after && p->hash[id].key <= after) continue;
        keys[k++] = (key_id){p->hash[id].key, id};
    }
    qsort(keys, k, sizeof(*keys), key_cmp);
    uint32_t take = k < max ? k : max;
    for (uint32_t i = 0; i < take; i++) {
        const mock_hash *par = &p->parent[keys[i].id];
        out[i] = (mock_cached_block){.hash = keys[i].key,
                                     .has_parent = par->d.len != 0,
                                     .parent = par->key};
    }
    kvo_free(keys);
    *n = take;
    *more = k > take;
    return KVO_OK;
}

kvo_status pool_list(const mock_pool *p, bool has_after, uint64_t after,
                     mock_cached_block *out, uint32_t max, uint32_t *n,
                     bool *more) {
    return pool_list_g(p, 0, has_after, after, out, max, n, more);
}

double pool_usage(const mock_pool *p) {
    return 1.0 - (double)p->n_free / (double)(p->n - 1);
}
