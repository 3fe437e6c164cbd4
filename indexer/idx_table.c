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
 *   growing never reads keys: it moves every (tag, ref) into a fresh table
 *   (idx_mem_alloc: huge pages from 2 MiB on, never an mremap).
 *   Deletion just clears the slot. Load <= 15/16; growth x4 below 512 KiB,
 *   x2 beyond (load within 0.47..0.94), by splitting each bucket into its
 *   2 or 4 successors (tab_grow).
 *
 * Growth without a long stall
 * ---------------------------
 *   The first write to a fresh huge page costs milliseconds here (the
 *   kernel zeroes 2 MiB): a table growing into 16 MiB would fault 8 of them
 *   inside one event, and a query waits behind it. So once a table is 7/8
 *   of the way to its next growth, reservations fault in the next table's
 *   memory, mapped ahead, a huge page at a time in step with the fill
 *   (tab_prefault); the growth then moves the keys into pages already
 *   there. What is faulted ahead counts in idx_tab_bytes.
 */
#define IDX_TREE_LAYOUT /* idx_int.h: the layout's types, constants, probes */
#include "idx_int.h"

#include <assert.h>
#include <string.h>
#include <sys/mman.h>

/* ======================================================================== */
/* Memory that never moves                                                   */
/* ======================================================================== */

void *idx_mem_alloc(size_t bytes) {
    if (bytes < HUGE_BYTES) return kvo_malloc(bytes ? bytes : 1);
    size_t len = (bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
    /* map one huge page more, then trim to a 2 MiB-aligned range */
    char *m = mmap(NULL, len + HUGE_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uintptr_t a =
        ((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1);
    size_t head = a - (uintptr_t)m;
    if (head) munmap(m, head);
    munmap((char *)a + len, HUGE_BYTES - head);
#ifdef MADV_HUGEPAGE
    madvise((void *)a, len, MADV_HUGEPAGE); /* advice: failure is harmless */
#endif
    return (void *)a;
}

void idx_mem_free(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < HUGE_BYTES) {
        kvo_free(p);
        return;
    }
    munmap(p, (bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1));
}

kvo_status idx_segv_reserve(segv *v, uint32_t need, size_t elem) {
    while (v->cap < need) {
        uint32_t k = v->nseg;
        if (k >= SEG_MAX) return KVO_ETOOBIG;
        size_t n = (size_t)1 << (k + SEG0_SHIFT);
        char *m = idx_mem_alloc(n * elem);
        if (!m) return KVO_ENOMEM;
        v->base[k] = (char *)((uintptr_t)m - (uintptr_t)seg_first(k) * elem);
        v->nseg = k + 1;
        v->cap = seg_first(k + 1);
    }
    return KVO_OK;
}

void idx_segv_fini(segv *v, size_t elem) {
    for (uint32_t k = 0; k < v->nseg; k++)
        idx_mem_free(
            (void *)((uintptr_t)v->base[k] + (uintptr_t)seg_first(k) * elem),
            ((size_t)1 << (k + SEG0_SHIFT)) * elem);
    memset(v, 0, sizeof(*v));
}

/* ======================================================================== */
/* Tables                                                                    */
/* ======================================================================== */

#define MAX_KICKS 64              /* cuckoo displacements before the stash */
#define SPILL_STUCK 255           /* spill[] saturates here, then sticks */
#define STASH_SLACK 16            /* stash entries added beyond a request */
#define STASH_MAX 0x7FFFFFFFu     /* stash entries (positions stay u32) */
#define TAB_MAX_SLOTS 0x70000000u /* bucket slots (positions stay u32) */
#define TAB_FIRST_BUCKETS 4       /* buckets of a table's first allocation */
#define LOAD_NUM 15               /* load <= LOAD_NUM / LOAD_DEN */
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

/* Insert (tag, v); false (and a key lost) only when the stash is full,
 * which idx_tab_reserve rules out and tab_grow handles. */
static bool put(tab *r, uint32_t tag, uint32_t v) {
    uint32_t bk = tab_b1(r, tag);
    unsigned h = bucket_holes(&r->bk[bk]);
    if (h) {
        unsigned i = (unsigned)__builtin_ctz(h);
        r->bk[bk].tag[i] = tag;
        r->bk[bk].ref[i] = v;
        r->len++;
        return true;
    }
    bk = tab_b2(r, tag);
    for (int k = 0; k < MAX_KICKS; k++) {
        if ((h = bucket_holes(&r->bk[bk])) != 0) {
            unsigned i = (unsigned)__builtin_ctz(h);
            r->bk[bk].tag[i] = tag;
            r->bk[bk].ref[i] = v;
            spill_note(r, bk, tag, true);
            r->len++;
            return true;
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
    if (r->nstash == r->stash_cap) return false;
    r->stash[r->nstash++] = (uint64_t)tag << 32 | v;
    r->len++;
    return true;
}

void idx_tab_put(tab *r, uint32_t tag, uint32_t v) {
    bool ok = put(r, tag, v);
    assert(ok); /* idx_tab_reserve made room */
    (void)ok;
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

static size_t bk_bytes(uint32_t nb) { /* one bucket more, to align bk */
    return ((size_t)nb + 1) * sizeof(bucket);
}

static void tab_free_mem(tab *r) {
    if (r->bk_mem) idx_mem_free(r->bk_mem, bk_bytes(r->nb));
    if (r->next_mem) idx_mem_free(r->next_mem, bk_bytes(r->next_nb));
    kvo_free(r->spill);
    kvo_free(r->stash);
}

/* The buckets a table of nb grows to (x4 below HUGE_BYTES / 4: each
 * growth writes a fresh table, and small ones are first-touched 4 KiB
 * pages, ~15 us a fault here: 1.33x the final size touched instead of 3x;
 * x2 beyond). Whole factors let tab_grow split buckets in one pass. */
static uint64_t next_buckets(uint64_t nb) {
    return nb * sizeof(bucket) < HUGE_BYTES / 4 ? nb * 4 : nb * 2;
}

/* A table about to hold `fill` keys: once that is 7/8 of the way to its
 * next growth, fault in the next table's huge pages in step with the fill
 * (all of them by the growth; the file's header says why). Memory that
 * cannot be had now is simply not ahead: tab_grow maps its own. */
static void tab_prefault(tab *r, uint64_t fill) {
    uint64_t cap = (uint64_t)r->nb * BW * LOAD_NUM / LOAD_DEN,
             from = cap - cap / 8;
    if (!r->nb || fill <= from) return;
    uint64_t nb = next_buckets(r->nb);
    if (nb * BW > TAB_MAX_SLOTS || bk_bytes((uint32_t)nb) < HUGE_BYTES) return;
    if (!r->next_mem) {
        r->next_mem = idx_mem_alloc(bk_bytes((uint32_t)nb));
        if (!r->next_mem) return;
        r->next_nb = (uint32_t)nb;
        r->next_touched = 0;
    }
    uint64_t pages = (nb * sizeof(bucket) + HUGE_BYTES - 1) / HUGE_BYTES;
    uint64_t want = (pages * (fill - from) + cap - from - 1) / (cap - from);
    while (r->next_touched < want && r->next_touched < pages)
        ((volatile char *)r->next_mem)[r->next_touched++ * HUGE_BYTES] = 0;
}

/* Move every entry into a fresh table of nb buckets, with stash room for
 * `more` insertions after it. The tag alone places a key, so no key is
 * read. A fresh table, not one grown in place: growing a large block in
 * place is an mremap, whose moved pages cost a first touch again (see
 * idx_mem_alloc); huge pages make touching the new one cheap. On the
 * (astronomically rare) stash overflow the move starts over one size up.
 * Nothing changes on failure. */
static kvo_status tab_grow(tab *r, uint32_t nb, uint32_t more) {
    for (;;) {
        tab g;
        memset(&g, 0, sizeof(g));
        g.nb = nb;
        g.rng = r->rng ? r->rng : RNG_SEED;
        g.stash_cap = r->nstash + more + STASH_SLACK;
        if (r->next_mem && r->next_nb == nb) { /* mapped ahead: take it */
            g.bk_mem = r->next_mem;
            r->next_mem = NULL;
            r->next_touched = 0;
        } else {
            g.bk_mem = idx_mem_alloc(bk_bytes(nb));
        }
        g.spill = kvo_calloc(nb, 1);
        g.stash = kvo_malloc((size_t)g.stash_cap * sizeof(uint64_t));
        if (!g.bk_mem || !g.spill || !g.stash) {
            tab_free_mem(&g);
            return KVO_ENOMEM;
        }
        g.bk = (bucket *)(((uintptr_t)g.bk_mem + CACHE_LINE - 1) &
                          ~(uintptr_t)(CACHE_LINE - 1));
        if (bk_bytes(nb) < HUGE_BYTES) /* mapped memory comes zeroed */
            memset(g.bk, 0, (size_t)nb * sizeof(bucket));
        bool ok = true;
        uint32_t from = 0; /* positions moved by the split below */
        if (r->nb && nb % r->nb == 0) {
            /* Growing by a whole factor f: both buckets of a key are
             * fastrange(x, nb), and floor(f * y) lies in [f * floor(y),
             * f * floor(y) + f - 1], so the keys of old bucket b go to new
             * buckets f*b .. f*b+f-1, in the same role (primary or
             * secondary), and those f buckets get no other key: no bucket
             * can overflow, and the move is one sequential pass instead of
             * a random write per key. */
            for (uint32_t b = 0; b < r->nb; b++) {
                const bucket *k = &r->bk[b];
                for (unsigned m = ~bucket_holes(k) & BUCKET_ALL; m;
                     m &= m - 1) {
                    unsigned i = (unsigned)__builtin_ctz(m);
                    uint32_t tag = k->tag[i];
                    bool prim = tab_b1(r, tag) == b;
                    uint32_t d = prim ? tab_b1(&g, tag) : tab_b2(&g, tag);
                    unsigned hole = bucket_holes(&g.bk[d]);
                    assert(hole); /* see above */
                    unsigned j = (unsigned)__builtin_ctz(hole);
                    g.bk[d].tag[j] = tag;
                    g.bk[d].ref[j] = k->ref[i];
                    g.len++;
                    if (!prim) spill_note(&g, d, tag, true);
                }
            }
            from = r->nb * BW;
        }
        for (uint32_t i = from; ok && i < tab_positions(r); i++) {
            uint32_t v = tab_ref(r, i);
            if (v) ok = put(&g, tab_tag(r, i), v);
        }
        if (ok) {
            tab_free_mem(r);
            *r = g;
            return KVO_OK;
        }
        tab_free_mem(&g);
        if ((uint64_t)nb * 2 > TAB_MAX_SLOTS / BW) return KVO_ETOOBIG;
        nb = nb * 2;
    }
}

kvo_status idx_tab_reserve(tab *r, uint32_t more) {
    kvo_status s = stash_room(r, more);
    if (s != KVO_OK) return s;
    uint64_t need = (uint64_t)r->len + more;
    if (need * LOAD_DEN <= (uint64_t)r->nb * BW * LOAD_NUM) {
        tab_prefault(r, need);
        return KVO_OK;
    }
    uint64_t nb = r->nb ? r->nb : TAB_FIRST_BUCKETS;
    while (need * LOAD_DEN > nb * BW * LOAD_NUM) nb = next_buckets(nb);
    if (nb * BW > TAB_MAX_SLOTS) return KVO_ETOOBIG;
    return tab_grow(r, (uint32_t)nb, more);
}

void idx_tab_fini(tab *r) {
    tab_free_mem(r);
    memset(r, 0, sizeof(*r));
}

uint64_t idx_tab_bytes(const tab *r) {
    return (uint64_t)r->nb * (sizeof(bucket) + 1) +
           (uint64_t)r->stash_cap * sizeof(uint64_t) +
           (uint64_t)r->next_touched * HUGE_BYTES;
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
