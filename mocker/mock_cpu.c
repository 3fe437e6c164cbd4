/* mock_cpu.c -- the second tier (--cpu-offload-blocks N): a CPU block store
 * in the manner of vLLM's OffloadingConnector with its LRU CPU manager
 * (vllm/v1/kv_offload/cpu, OffloadingEventsTracker's self-describing
 * events), fed as issue 15 specifies: a block evicted from the GPU pool is
 * offloaded here.
 *
 *   slots[0..cap)   one offloaded block each: its hash, parent, tokens
 *                   (tok[slot * bs ..]) and LoRA adapter
 *   LRU list        doubly linked through the slots, head = least recently
 *                   used (the next to evict), tail = most recent; an
 *                   offload or a lookup hit moves a block to the tail (a
 *                   hit run is touched last block first, as vLLM's
 *                   LRUOffloadingManager.touch: its first block ends most
 *                   recent, so children are evicted before their parents)
 *   map             hash key -> slot
 *
 * Offloading a block the tier holds only touches it (vLLM's prepare_store
 * skips keys already stored): no event. Otherwise, when full, the head is
 * evicted first (BlockRemoved, medium CPU), then the block is stored
 * (BlockStored, medium CPU, with its parent, tokens, block_size and LoRA
 * fields); both go into the batch at once, before the GPU's BlockRemoved
 * of the block (mock_sched.c on_evict: the copy exists before the GPU
 * frees its block). A prefix that continues in this tier past the GPU hits
 * is loaded back at admission (mock_sched.c). The cached set (count,
 * digest) is kept as the pool keeps its own: one kvo_block_digest term per
 * block.
 *
 * Pure: the events go to the step's builder (events_cpu_*), no sockets.
 */
#include "mock_int.h"

#include <stdlib.h>
#include <string.h>

static uint64_t slot_term(const mock_cpu *c, uint32_t s) {
    const cpu_slot *e = &c->slots[s];
    return kvo_block_digest(e->hash.key, e->parent.d.len != 0, e->parent.key);
}

kvo_status cpu_init(mock_cpu *c, uint32_t cap, uint32_t block_size) {
    memset(c, 0, sizeof(*c));
    kvo_map_init(&c->map);
    c->lru = MOCK_LIST_EMPTY;
    if (cap == 0) return KVO_OK;
    c->slots = kvo_calloc(cap, sizeof(*c->slots));
    c->tok = kvo_malloc((size_t)cap * block_size * sizeof(uint64_t));
    if (!c->slots || !c->tok) {
        cpu_fini(c);
        return KVO_ENOMEM;
    }
    c->cap = cap;
    c->bs = block_size;
    return KVO_OK;
}

void cpu_fini(mock_cpu *c) {
    kvo_free(c->slots);
    kvo_free(c->tok);
    kvo_map_fini(&c->map);
    memset(c, 0, sizeof(*c));
    c->lru = MOCK_LIST_EMPTY;
}

static void lru_unlink(mock_cpu *c, uint32_t s) {
    mock_list_unlink(&c->lru, MOCK_LINKS(c->slots, lru), s);
}

static void lru_append(mock_cpu *c, uint32_t s) {
    mock_list_append(&c->lru, MOCK_LINKS(c->slots, lru), s);
}

static uint32_t slot_of(const mock_cpu *c, uint64_t key) {
    const uint64_t *v = kvo_map_get((kvo_map *)&c->map, key);
    return v ? (uint32_t)*v : MOCK_NIL;
}

bool cpu_has(const mock_cpu *c, uint64_t key) {
    return c->cap && slot_of(c, key) != MOCK_NIL;
}

void cpu_touch(mock_cpu *c, uint64_t key) {
    uint32_t s = c->cap ? slot_of(c, key) : MOCK_NIL;
    if (s == MOCK_NIL || s == c->lru.tail) return;
    lru_unlink(c, s);
    lru_append(c, s);
}

kvo_status cpu_offload(mock_cpu *c, const mock_hash *h, const mock_hash *parent,
                       const mock_block_meta *meta, step_events *ev) {
    if (c->cap == 0 || !meta->tokens) return KVO_OK;
    if (slot_of(c, h->key) != MOCK_NIL) {
        cpu_touch(c, h->key);
        return KVO_OK;
    }
    /* reserve the map entry first: a failure changes nothing */
    bool added;
    uint64_t *v = kvo_map_put(&c->map, h->key, &added);
    if (!v) return KVO_ENOMEM;
    uint32_t s;
    if (c->n < c->cap) {
        s = c->n++;
    } else { /* evict the least recently used block */
        s = c->lru.head;
        cpu_slot *old = &c->slots[s];
        lru_unlink(c, s);
        c->digest -= slot_term(c, s);
        kvo_map_del(&c->map, old->hash.key);
        v = kvo_map_get(&c->map, h->key); /* the delete may move entries */
        c->removed++;
        events_cpu_removed(ev, &old->hash, &old->parent);
    }
    *v = s;
    cpu_slot *e = &c->slots[s];
    e->hash = *h;
    if (parent && parent->d.len)
        e->parent = *parent;
    else
        memset(&e->parent, 0, sizeof(e->parent));
    e->lora_id = meta->lora_id;
    e->lora_name = meta->lora_name;
    memcpy(&c->tok[(size_t)s * c->bs], meta->tokens, c->bs * sizeof(uint64_t));
    lru_append(c, s);
    c->digest += slot_term(c, s);
    c->stored++;
    mock_block_meta m = {&c->tok[(size_t)s * c->bs], e->lora_id, e->lora_name,
                         0};
    events_cpu_stored(ev, &e->hash, &e->parent, &m, c->bs);
    return KVO_OK;
}

void cpu_reset(mock_cpu *c) {
    kvo_map_clear(&c->map);
    c->n = 0;
    c->lru = MOCK_LIST_EMPTY;
    c->digest = 0;
}

static int key_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

kvo_status cpu_list(const mock_cpu *c, bool has_after, uint64_t after,
                    mock_cached_block *out, uint32_t max, uint32_t *n,
                    bool *more) {
    *n = 0;
    *more = false;
    if (c->n == 0) return KVO_OK;
    uint64_t *keys = kvo_malloc((size_t)c->n * sizeof(uint64_t));
    if (!keys) return KVO_ENOMEM;
    uint32_t k = 0;
    for (uint32_t s = 0; s < c->n; s++)
        if (!has_after || c->slots[s].hash.key > after)
            keys[k++] = c->slots[s].hash.key;
    qsort(keys, k, sizeof(uint64_t), key_cmp);
    uint32_t take = k < max ? k : max;
    for (uint32_t i = 0; i < take; i++) {
        const cpu_slot *e = &c->slots[slot_of(c, keys[i])];
        out[i] = (mock_cached_block){.hash = keys[i],
                                     .has_parent = e->parent.d.len != 0,
                                     .parent = e->parent.key};
    }
    kvo_free(keys);
    *n = take;
    *more = k > take;
    return KVO_OK;
}
