/* kvo_map.h -- a u64 -> u64 hash map: reference counts by block hash, digests
 * by key, anything keyed by a 64-bit hash.
 *
 * Fibonacci hashing (the top bits of key * 2^64/phi: one multiply, and keys
 * sharing their low bits still spread), so keys need not be random.
 */
#ifndef KVO_MAP_H
#define KVO_MAP_H

#include "kvo.h"

/* Open addressing, linear probing, power-of-two capacity, load <= 1/4,
 * backward-shift deletion (no tombstones). Key 0 lives outside the table. */
typedef struct kvo_map_slot {
    uint64_t key; /* 0 = empty */
    uint64_t val;
} kvo_map_slot;

typedef struct kvo_map {
    kvo_map_slot *slots;
    size_t cap; /* 0 or a power of two */
    size_t len; /* entries, key 0 included */
    bool has_zero;
    uint64_t zero_val;
} kvo_map;

void kvo_map_init(kvo_map *m);
void kvo_map_fini(kvo_map *m);
void kvo_map_clear(kvo_map *m); /* keeps memory */
/* Pointer to the value of key, or NULL. Valid until the next put/del. */
uint64_t *kvo_map_get(kvo_map *m, uint64_t key);
/* Pointer to the value of key, inserted as 0 when absent (*added true).
 * NULL only when out of memory. */
uint64_t *kvo_map_put(kvo_map *m, uint64_t key, bool *added);
bool kvo_map_del(kvo_map *m, uint64_t key);
/* Delete the entry whose value v points to (as kvo_map_get or kvo_map_put
 * returned it, no put or del since): a lookup and its delete in one probe. */
void kvo_map_del_at(kvo_map *m, uint64_t *v);
/* Reference-count step in one probe: absent -> KVO_MAP_ABSENT; value 1
 * (or 0) -> the entry is deleted, KVO_MAP_GONE; more -> value-1,
 * KVO_MAP_HELD. */
typedef enum { KVO_MAP_ABSENT, KVO_MAP_GONE, KVO_MAP_HELD } kvo_map_dec_result;
kvo_map_dec_result kvo_map_dec(kvo_map *m, uint64_t key);

#endif /* KVO_MAP_H */
