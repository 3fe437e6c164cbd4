/* idx_table.c -- the tree's hash tables: bucketized cuckoo tables of u32
 * refs. The tree keeps the keys (in the node or alias record a ref names);
 * a table keeps, per entry, the top half of the key's hash (the tag) and
 * the ref. The probes are static inline in idx_int.h (the tree's hot path);
 * what changes a table's shape is here.
 *
 * Layout
 * ------
 *   bk[nb]   buckets, one cache line each, aligned inside bk_mem:
 *
 *       0                                32                               64
 *       +---+---+---+---+---+---+---+---+---+---+---+---+---+---+---+---+
 *       |tag|tag|tag|tag|tag|tag|tag|tag|ref|ref|ref|ref|ref|ref|ref|ref|
 *       +---+---+---+---+---+---+---+---+---+---+---+---+---+---+---+---+
 *
 *            the 8 tags first, so a probe compares all 8 with one vector
 *            compare; ref 0 marks an empty slot (ref 0, the root, is never
 *            stored) and an empty slot has tag 0.
 *   spill[nb] keys of primary bucket b kept in their secondary;
 *            saturates at 255, then sticks.
 *   stash[]  tag << 32 | ref: keys no displacement walk could place.
 *
 *   A position names an entry: bucket * BW + slot, or nb * BW + i for stash
 *   entry i.
 *
 * Placement
 * ---------
 *   A key lives in its primary bucket fastrange(tag) or, when that is full,
 *   in its secondary (a scramble of the tag), displacing others along a
 *   short random walk if need be; the rare key no walk can place goes to the
 *   stash. spill[b] counts the keys of primary b that live elsewhere, so a
 *   miss reads one line unless b spilled. A probe reads the key (through the
 *   owner's compare) only on a tag match; the tag alone places a key, so
 *   growing never reads keys, and a table grows in place (its pages stay).
 *   Deletion just clears the slot. Load <= 15/16, growth x1.5 (load stays
 *   within 0.63..0.94).
 */
#define IDX_TREE_LAYOUT /* idx_int.h: the layout's types, constants, probes */
#include "idx_int.h"

#include <string.h>

#define MAX_KICKS 64 /* cuckoo displacements before the stash */
#define SPILL_STUCK 255  /* spill[] saturates here, then sticks */
#define STASH_SLACK 16   /* stash entries added beyond a request */
#define STASH_MAX 0x7FFFFFFFu /* stash entries (positions stay u32) */
#define TAB_MAX_SLOTS 0x70000000u /* bucket slots (positions stay u32) */
#define TAB_FIRST_BUCKETS 4 /* buckets of a table's first allocation */
#define LOAD_NUM 15 /* load <= LOAD_NUM / LOAD_DEN */
#define LOAD_DEN 16
#define RNG_SEED 0x9E3779B9u /* displacement choices, xorshift32 */

/* A key with this tag now lives in (or left) bucket bk: keep spill[]. */
static inline void spill_note(tab *r, uint32_t bk, uint32_t tag, bool in) {
    uint32_t b1 = tab_b1(r, tag);
    if (b1 == bk) return;
    uint8_t *c = &r->spill[b1];
    if (in) {
        if (*c < SPILL_STUCK) (*c)++;
    } else if (*c != SPILL_STUCK) {
        (*c)--;
    }
}

void idx_tab_put(tab *r, uint32_t tag, uint32_t v) {
    uint32_t bk = tab_b1(r, tag);
    unsigned h = bucket_holes(&r->bk[bk]);
    if (h) {
        unsigned i = (unsigned)__builtin_ctz(h);
        r->bk[bk].tag[i] = tag;
        r->bk[bk].ref[i] = v;
        r->len++;
        return;
    }
    bk = tab_b2(r, tag);
    for (int k = 0; k < MAX_KICKS; k++) {
        if ((h = bucket_holes(&r->bk[bk])) != 0) {
            unsigned i = (unsigned)__builtin_ctz(h);
            r->bk[bk].tag[i] = tag;
            r->bk[bk].ref[i] = v;
            spill_note(r, bk, tag, true);
            r->len++;
            return;
        }
        /* displace a random key of bk towards its other bucket */
        r->rng ^= r->rng << 13;
        r->rng ^= r->rng >> 17;
        r->rng ^= r->rng << 5;
        unsigned i = r->rng % BW;
        uint32_t vt = r->bk[bk].tag[i], vv = r->bk[bk].ref[i];
        r->bk[bk].tag[i] = tag;
        r->bk[bk].ref[i] = v;
        spill_note(r, bk, tag, true);
        spill_note(r, bk, vt, false);
        tag = vt;
        v = vv;
        uint32_t v1 = tab_b1(r, tag);
        bk = bk == v1 ? tab_b2(r, tag) : v1;
    }
    r->stash[r->nstash++] = (uint64_t)tag << 32 | v;
    r->len++;
}

void idx_tab_del(tab *r, uint32_t pos) {
    uint32_t n = r->nb * BW;
    if (pos >= n) {
        r->stash[pos - n] = r->stash[--r->nstash];
    } else {
        bucket *k = &r->bk[pos / BW];
        spill_note(r, pos / BW, k->tag[pos % BW], false);
        k->tag[pos % BW] = 0;
        k->ref[pos % BW] = 0;
    }
    r->len--;
}

static kvo_status stash_room(tab *r, uint32_t more) {
    if (r->stash_cap - r->nstash >= more) return KVO_OK;
    uint64_t cap = (uint64_t)r->nstash + more + STASH_SLACK;
    if (cap > STASH_MAX) return KVO_ETOOBIG;
    uint64_t *p = kvo_realloc(r->stash, cap * sizeof(uint64_t));
    if (!p) return KVO_ENOMEM;
    r->stash = p;
    r->stash_cap = (uint32_t)cap;
    return KVO_OK;
}

static inline uint32_t b1_of(uint32_t tag, uint32_t nb) {
    return (uint32_t)(((uint64_t)tag * nb) >> 32);
}

/* Grow to nb buckets in place, so the pages already touched stay in use
 * (a fresh table per growth would fault in five times the final size).
 * The primary bucket only ever moves up when the table grows, so one pass
 * from the top bucket down moves primary keys into buckets already done
 * (or back into their own); keys in secondaries or the stash, and those a
 * bucket cannot hold, are put aside and re-inserted at the end. Everything
 * that can fail comes before the realloc: then nothing changes on failure. */
static kvo_status tab_grow(tab *r, uint32_t nb) {
    uint32_t ob = r->nb;
    uint8_t *spill = kvo_calloc(nb, 1);
    if (!spill) return KVO_ENOMEM;
    uint64_t out = r->nstash;
    for (uint32_t b = 0; b < ob; b++) {
        const bucket *k = &r->bk[b];
        for (unsigned m = ~bucket_holes(k) & BUCKET_ALL; m; m &= m - 1) {
            uint32_t tag = k->tag[__builtin_ctz(m)];
            if (b1_of(tag, ob) != b) out++;
            else spill[b1_of(tag, nb)]++; /* at most 2 old buckets each */
        }
    }
    for (uint32_t b = 0; b < nb; b++)
        if (spill[b] > BW) out += spill[b] - BW;
    uint64_t *aside = kvo_malloc((out ? out : 1) * sizeof(uint64_t));
    if (!aside || out > STASH_MAX || stash_room(r, (uint32_t)out) != KVO_OK) {
        kvo_free(spill);
        kvo_free(aside);
        return KVO_ENOMEM;
    }
    size_t off = r->bk_mem ? (size_t)((char *)r->bk - (char *)r->bk_mem) : 0;
    /* one bucket more than nb, to align bk inside it */
    void *mem = kvo_realloc(r->bk_mem, ((size_t)nb + 1) * sizeof(bucket));
    if (!mem) {
        kvo_free(spill);
        kvo_free(aside);
        return KVO_ENOMEM;
    }
    bucket *bk = (bucket *)(((uintptr_t)mem + CACHE_LINE - 1) &
                            ~(uintptr_t)(CACHE_LINE - 1));
    if ((size_t)((char *)bk - (char *)mem) != off)
        memmove(bk, (char *)mem + off, (size_t)ob * sizeof(bucket));
    memset(&bk[ob], 0, (size_t)(nb - ob) * sizeof(bucket));
    r->bk_mem = mem;
    r->bk = bk;
    uint64_t k = 0;
    for (uint32_t j = 0; j < r->nstash; j++) aside[k++] = r->stash[j];
    r->nstash = 0;
    for (uint32_t b = ob; b-- > 0;) {
        bucket *c = &bk[b];
        bucket was = *c;
        memset(c, 0, sizeof(*c));
        for (unsigned m = ~bucket_holes(&was) & BUCKET_ALL; m; m &= m - 1) {
            unsigned i = (unsigned)__builtin_ctz(m);
            uint32_t tag = was.tag[i];
            bucket *d = &bk[b1_of(tag, nb)];
            unsigned h = b1_of(tag, ob) == b ? bucket_holes(d) : 0;
            if (!h) { /* a secondary, or a full bucket: put aside */
                aside[k++] = (uint64_t)tag << 32 | was.ref[i];
                continue;
            }
            unsigned j = (unsigned)__builtin_ctz(h);
            d->tag[j] = tag;
            d->ref[j] = was.ref[i];
        }
    }
    r->nb = nb;
    r->len -= (uint32_t)k;
    memset(spill, 0, nb);
    kvo_free(r->spill);
    r->spill = spill;
    if (!r->rng) r->rng = RNG_SEED;
    for (uint64_t j = 0; j < k; j++)
        idx_tab_put(r, (uint32_t)(aside[j] >> 32), (uint32_t)aside[j]);
    kvo_free(aside);
    return KVO_OK;
}

kvo_status idx_tab_reserve(tab *r, uint32_t more) {
    kvo_status s = stash_room(r, more);
    if (s != KVO_OK) return s;
    uint64_t need = (uint64_t)r->len + more;
    if (need * LOAD_DEN <= (uint64_t)r->nb * BW * LOAD_NUM) return KVO_OK;
    uint64_t nb = r->nb ? r->nb : TAB_FIRST_BUCKETS;
    while (need * LOAD_DEN > nb * BW * LOAD_NUM) nb = nb * 3 / 2 + 1;
    if (nb * BW > TAB_MAX_SLOTS) return KVO_ETOOBIG;
    return tab_grow(r, (uint32_t)nb);
}

void idx_tab_fini(tab *r) {
    kvo_free(r->bk_mem);
    kvo_free(r->spill);
    kvo_free(r->stash);
    memset(r, 0, sizeof(*r));
}

uint64_t idx_tab_bytes(const tab *r) {
    return (uint64_t)r->nb * (sizeof(bucket) + 1) +
           (uint64_t)r->stash_cap * sizeof(uint64_t);
}

bool idx_tab_check(const tab *r, tab_hash_fn hash, const void *owner,
                   const char *name, char *msg, size_t msgsz) {
    uint32_t used = 0, n = r->nb * BW;
    uint32_t *spill = kvo_calloc(r->nb ? r->nb : 1, sizeof(uint32_t));
    bool ok = false;
    if (!spill) {
        snprintf(msg, msgsz, "out of memory");
        return false;
    }
    for (uint32_t i = 0; i < tab_positions(r); i++) {
        uint32_t v = tab_ref(r, i);
        if (!v) {
            if (tab_tag(r, i)) {
                snprintf(msg, msgsz, "%s[%u]: empty slot with a tag", name, i);
                goto done;
            }
            continue;
        }
        used++;
        uint32_t tag = tab_tag(r, i);
        uint64_t h = hash(owner, v);
        if (tag != tab_hash_tag(h)) {
            snprintf(msg, msgsz, "%s[%u]: tag %08x, key hashes to %08x", name,
                     i, tag, tab_hash_tag(h));
            goto done;
        }
        if (i >= n) continue;
        uint32_t b1 = tab_b1(r, tag), b2 = tab_b2(r, tag);
        if (i / BW != b1 && i / BW != b2) {
            snprintf(msg, msgsz, "%s[%u]: key outside its buckets", name, i);
            goto done;
        }
        if (i / BW != b1) spill[b1]++;
    }
    for (uint32_t b = 0; b < r->nb; b++)
        if (r->spill[b] != SPILL_STUCK && r->spill[b] != spill[b]) {
            snprintf(msg, msgsz, "%s: bucket %u spills %u, counted %u", name, b,
                     r->spill[b], spill[b]);
            goto done;
        }
    if (used != r->len) {
        snprintf(msg, msgsz, "%s: %u entries, len %u", name, used, r->len);
        goto done;
    }
    ok = true;
done:
    kvo_free(spill);
    return ok;
}
