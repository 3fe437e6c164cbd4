/* kvo_map.c -- u64 -> u64 open-addressing map (see kvo_map.h). */
#include "kvo_map.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Fibonacci hashing (top bits of key * 2^64/phi): one multiply; spreads
 * keys that share their low bits (small ints, signed -1, -2, ...) too. */
static size_t slot_of(uint64_t key, size_t cap) {
    unsigned shift = 64 - (unsigned)__builtin_ctzll((unsigned long long)cap);
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> shift);
}

void kvo_map_init(kvo_map *m) { memset(m, 0, sizeof(*m)); }

void kvo_map_fini(kvo_map *m) {
    kvo_free(m->slots);
    memset(m, 0, sizeof(*m));
}

void kvo_map_clear(kvo_map *m) {
    if (m->slots) memset(m->slots, 0, m->cap * sizeof(*m->slots));
    m->len = 0;
    m->has_zero = false;
    m->zero_val = 0;
}

uint64_t *kvo_map_get(kvo_map *m, uint64_t key) {
    if (key == 0) return m->has_zero ? &m->zero_val : NULL;
    if (!m->cap) return NULL;
    for (size_t i = slot_of(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key) return &m->slots[i].val;
        if (m->slots[i].key == 0) return NULL;
    }
}

static kvo_status grow(kvo_map *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    kvo_map_slot *ns = kvo_calloc(ncap, sizeof(*ns));
    if (!ns) return KVO_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        size_t j = slot_of(m->slots[i].key, ncap);
        while (ns[j].key) j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    kvo_free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return KVO_OK;
}

uint64_t *kvo_map_put(kvo_map *m, uint64_t key, bool *added) {
    bool dummy;
    if (!added) added = &dummy;
    *added = false;
    if (key == 0) {
        if (!m->has_zero) {
            m->has_zero = true;
            m->zero_val = 0;
            m->len++;
            *added = true;
        }
        return &m->zero_val;
    }
    /* Load <= 1/4: the dedup maps take a put and a remove per block, and
     * linear probing's runs (probe loops, backward shifts) shorten sharply
     * below 1/2; the price is twice the memory per entry. */
    if ((m->len + 1) * 4 > m->cap && grow(m) != KVO_OK) return NULL;
    size_t i = slot_of(key, m->cap);
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & (m->cap - 1);
    if (!m->slots[i].key) {
        m->slots[i].key = key;
        m->slots[i].val = 0;
        m->len++;
        *added = true;
    }
    return &m->slots[i].val;
}

/* Slot index of key, or SIZE_MAX. */
static size_t find(const kvo_map *m, uint64_t key) {
    if (!m->cap) return SIZE_MAX;
    size_t mask = m->cap - 1, i = slot_of(key, m->cap);
    while (m->slots[i].key != key) {
        if (!m->slots[i].key) return SIZE_MAX;
        i = (i + 1) & mask;
    }
    return i;
}

static void remove_at(kvo_map *m, size_t i) {
    size_t mask = m->cap - 1;
    /* Backward shift: pull later entries of the probe run into the hole when
     * their home slot does not lie cyclically in (hole, j]. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
        size_t home = slot_of(m->slots[j].key, m->cap);
        bool stays =
            hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (stays) continue;
        m->slots[hole] = m->slots[j];
        hole = j;
    }
    m->slots[hole].key = 0;
    m->slots[hole].val = 0;
    m->len--;
}

bool kvo_map_del(kvo_map *m, uint64_t key) {
    if (key == 0) {
        if (!m->has_zero) return false;
        m->has_zero = false;
        m->len--;
        return true;
    }
    size_t i = find(m, key);
    if (i == SIZE_MAX) return false;
    remove_at(m, i);
    return true;
}

void kvo_map_del_at(kvo_map *m, uint64_t *v) {
    if (v == &m->zero_val) {
        assert(m->has_zero);
        m->has_zero = false;
        m->zero_val = 0;
        m->len--;
        return;
    }
    kvo_map_slot *s =
        (kvo_map_slot *)(void *)((char *)v - offsetof(kvo_map_slot, val));
    assert(s >= m->slots && s < m->slots + m->cap && s->key);
    remove_at(m, (size_t)(s - m->slots));
}

kvo_map_dec_result kvo_map_dec(kvo_map *m, uint64_t key) {
    uint64_t *v;
    size_t i = SIZE_MAX;
    if (key == 0) {
        if (!m->has_zero) return KVO_MAP_ABSENT;
        v = &m->zero_val;
    } else {
        i = find(m, key);
        if (i == SIZE_MAX) return KVO_MAP_ABSENT;
        v = &m->slots[i].val;
    }
    if (*v > 1) {
        (*v)--;
        return KVO_MAP_HELD;
    }
    if (key == 0) {
        m->has_zero = false;
        m->len--;
    } else {
        remove_at(m, i);
    }
    return KVO_MAP_GONE;
}
