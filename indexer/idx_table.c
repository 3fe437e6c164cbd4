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
 *   obk[onb], ospill[onb]  while a growth is under way: the buckets before
 *            it, whose [moved, onb) still hold keys (tab_move).
 *
 *   A position names an entry: bucket * BW + slot, or nb * BW + i for stash
 *   entry i, or nb * BW + nstash + old bucket * BW + slot.
 *
 * Placement
 * ---------
 *   A key lives in its primary bucket fastrange(tag) or, when that is full,
 *   in its secondary (a scramble of the tag). When both are full it takes
 *   the slot of a key of the secondary that moves to its own other bucket
 *   (displace_one), else it displaces keys along a short random walk; the
 *   rare key no walk can place goes to the stash. spill[b] counts the keys
 *   of primary b that live elsewhere, so a miss reads one line unless b
 *   spilled. A probe reads the key (through the owner's compare) only on a
 *   tag match; the tag alone places a key, so growing never reads keys: it
 *   moves every (tag, ref) into a fresh table (idx_mem_alloc: huge pages
 *   from 2 MiB on, never an mremap).
 *   Deletion just clears the slot. Load <= 15/16; growth x4 below 512 KiB,
 *   x2 beyond (load within 0.47..0.94), each bucket's keys going to its 2
 *   or 4 successors.
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
 *
 *   Nor does a growth move every key at once (17 ms for 1 M keys here). It
 *   makes the fresh buckets the table and keeps the present ones as old
 *   buckets (tab_grow); each later reservation moves MOVE_PER_KEY old
 *   buckets per key it reserves, in order (tab_move), and frees them when
 *   the last is empty. Meanwhile inserts go to the new buckets, and a find
 *   that misses there looks in the old bucket of its key if not moved yet.
 *   The move ends long before the new buckets can fill (at x2 they take
 *   about 7 keys per old bucket); a growth still under way is finished
 *   before the next starts.
 */
#define IDX_TREE_LAYOUT /* idx_int.h: the layout's types, constants, probes */
#include "idx_int.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ======================================================================== */
/* Memory that never moves                                                   */
/* ======================================================================== */

/* len bytes (a multiple of HUGE_BYTES) mapped with prot and flags so that
 * base + skew is 2 MiB aligned, advised as huge pages from base + skew +
 * small on (small: a multiple of HUGE_BYTES); NULL when refused. One huge
 * page more is mapped, then trimmed. */
static char *map_aligned(size_t len, int prot, int flags, size_t skew,
                         size_t small) {
    char *m = mmap(NULL, len + HUGE_BYTES, prot,
                   MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uintptr_t a = (((uintptr_t)m + skew + HUGE_BYTES - 1) &
                   ~(uintptr_t)(HUGE_BYTES - 1)) -
                  skew;
    size_t head = a - (uintptr_t)m;
    if (head) munmap(m, head);
    munmap((char *)a + len, HUGE_BYTES - head);
#ifdef MADV_HUGEPAGE
    /* advice: refused, it changes nothing else */
    if (skew + small) madvise((void *)a, skew + small, MADV_NOHUGEPAGE);
    madvise((char *)a + skew + small, len - skew - small, MADV_HUGEPAGE);
#endif
    return (char *)a;
}

void *idx_mem_alloc(size_t bytes) {
    if (bytes < HUGE_BYTES) return kvo_malloc(bytes ? bytes : 1);
    return map_aligned((bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1),
                       PROT_READ | PROT_WRITE, 0, 0, 0);
}

void idx_mem_free(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < HUGE_BYTES) {
        kvo_free(p);
        return;
    }
    munmap(p, (bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1));
}

/* A slab's first bytes lie below its first 2 MiB boundary: small pages (a
 * huge page needs all of its 2 MiB in the mapping), so a small tree stays
 * small; huge pages from there on. */
#define SLAB_HEAD ((size_t)64 << 10)

/* A slab's small region, full now that the slab grows past it, becomes
 * huge pages: small pages kept a small tree's memory exact, and a large
 * one's random reads need the TLB reach. One copy of the region, now (the
 * kernel's background collapse would come at no known time). */
static void slab_collapse(char *p, size_t len) {
#if defined(MADV_HUGEPAGE) && defined(__linux__)
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif
    madvise(p, len, MADV_HUGEPAGE); /* advice: refused, nothing changes */
    madvise(p, len, MADV_COLLAPSE);
#else
    (void)p;
    (void)len;
#endif
}

/* vm.overcommit_memory = 2: the kernel charges a writable private mapping
 * in full, MAP_NORESERVE or not. */
static bool overcommit_strict(void) {
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = 0;
    if (f) {
        if (fscanf(f, "%d", &mode) != 1) mode = 0;
        fclose(f);
    }
    return mode == 2;
}

kvo_status idx_slab_reserve(slab *v, uint32_t need, uint32_t max, size_t elem) {
    if (need <= v->cap) return KVO_OK;
    if (need > max) return KVO_ETOOBIG;
    if (!kvo_alloc_ok()) return KVO_ENOMEM;
    size_t want = (size_t)need * elem;
    if (!v->base) {
        /* Writable at once, memory at first touch (NORESERVE): opening a
         * range later by mprotect made the next touch of the pages already
         * in use slow again on this kind of VM (W1x4 cold hit p99 8.5 us
         * against 1.6). Under strict overcommit, where that would charge
         * the whole range, it is reserved closed and opened as it fills.
         * Where address space is short (a ulimit -v), the range is halved
         * until the kernel gives it, down to what is wanted now: the slab
         * then cannot grow past it (KVO_ENOMEM). */
        bool open = !overcommit_strict();
        size_t len = ((size_t)max * elem + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
        int prot = open ? PROT_READ | PROT_WRITE : PROT_NONE;
        size_t small = v->small < len - SLAB_HEAD ? v->small : len - SLAB_HEAD;
        char *m = map_aligned(len, prot, MAP_NORESERVE, SLAB_HEAD, small);
        while (!m && len / 2 >= want && len / 2 >= HUGE_BYTES) {
            len /= 2;
            m = map_aligned(len, prot, MAP_NORESERVE, SLAB_HEAD, small);
        }
        if (!m) return KVO_ENOMEM;
        v->base = m;
        v->reserved = len;
        v->open = open;
    }
    size_t to = v->usable ? v->usable : (size_t)sysconf(_SC_PAGESIZE);
    while (to < want && to < HUGE_BYTES) to *= 2;
    if (to < want)
        to = SLAB_HEAD + ((want - SLAB_HEAD + HUGE_BYTES - 1) &
                          ~(HUGE_BYTES - 1)); /* ends on a 2 MiB boundary */
    if (to > v->reserved) to = v->reserved;
    if (to < want) return KVO_ENOMEM; /* a short reservation is full */
    if (!v->open &&
        mprotect(v->base + v->usable, to - v->usable, PROT_READ | PROT_WRITE))
        return KVO_ENOMEM;
    size_t small_end = SLAB_HEAD + v->small;
    if (v->small && v->usable <= small_end && to > small_end)
        slab_collapse(v->base + SLAB_HEAD, v->small);
    v->usable = to;
    v->cap = to / elem > max ? max : (uint32_t)(to / elem);
    return KVO_OK;
}

void idx_slab_fini(slab *v) {
    if (v->base) munmap(v->base, v->reserved);
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
#define MOVE_PER_KEY 2       /* old buckets moved per key reserved */

/* A key with this tag now lives in (or left) bucket bk of the nb buckets
 * whose spill counts are spill[]: keep them. */
static inline void spill_count(uint8_t *spill, uint32_t nb, uint32_t bk,
                               uint32_t tag, bool in) {
    uint32_t b1 = bucket1(tag, nb);
    if (b1 == bk) return;
    uint8_t *c = &spill[b1];
    if (in) {
        if (*c < SPILL_STUCK) (*c)++;
    } else if (*c != SPILL_STUCK) {
        (*c)--;
    }
}

static inline void spill_note(tab *r, uint32_t bk, uint32_t tag, bool in) {
    spill_count(r->spill, r->nb, bk, tag, in);
}

/* Put (tag, v) in slot i of bucket bk. */
static inline void slot_put(tab *r, uint32_t bk, unsigned i, uint32_t tag,
                            uint32_t v) {
    r->bk[bk].tag[i] = tag;
    r->bk[bk].ref[i] = v;
    spill_note(r, bk, tag, true);
}

/* The other bucket of a key with this tag that lives in bucket bk. */
static inline uint32_t other_bucket(const tab *r, uint32_t bk, uint32_t tag) {
    uint32_t b1 = tab_b1(r, tag);
    return bk == b1 ? tab_b2(r, tag) : b1;
}

/* bk is full: move one of its keys to its other bucket, if one of those
 * has a hole, and put (tag, v) in its slot. The other buckets are fetched
 * all at once: one wait for memory, where each step of a walk is one (a
 * walk took 0.9 steps more per key put in a second bucket, at W1x4's
 * load of 3/4; 0.1 after this). */
static bool displace_one(tab *r, uint32_t bk, uint32_t tag, uint32_t v) {
    bucket *k = &r->bk[bk];
    uint32_t other[BW];
    for (unsigned i = 0; i < BW; i++) {
        other[i] = other_bucket(r, bk, k->tag[i]);
        __builtin_prefetch(&r->bk[other[i]]);
    }
    for (unsigned i = 0; i < BW; i++) {
        unsigned h = bucket_holes(&r->bk[other[i]]);
        if (!h) continue; /* (never bk itself: it is full) */
        uint32_t vt = k->tag[i];
        slot_put(r, other[i], (unsigned)__builtin_ctz(h), vt, k->ref[i]);
        spill_note(r, bk, vt, false);
        slot_put(r, bk, i, tag, v);
        return true;
    }
    return false;
}

/* Insert (tag, v): in its first bucket, else its second, else in place of
 * a key displace_one can move, else displacing keys along a random walk;
 * false (and a key lost) only when the stash is full, which
 * idx_tab_reserve (and tab_move's own stash_room) rule out. */
static bool put(tab *r, uint32_t tag, uint32_t v) {
    uint32_t bk = tab_b1(r, tag);
    unsigned h = bucket_holes(&r->bk[bk]);
    if (!h) {
        bk = tab_b2(r, tag);
        h = bucket_holes(&r->bk[bk]);
    }
    if (h || displace_one(r, bk, tag, v)) {
        if (h) slot_put(r, bk, (unsigned)__builtin_ctz(h), tag, v);
        r->len++;
        return true;
    }
    for (int k = 0; k < MAX_KICKS; k++) {
        /* displace a random key of bk (full) towards its other bucket */
        r->rng ^= r->rng << 13;
        r->rng ^= r->rng >> 17;
        r->rng ^= r->rng << 5;
        unsigned i = r->rng % BW;
        uint32_t vt = r->bk[bk].tag[i], vv = r->bk[bk].ref[i];
        spill_note(r, bk, vt, false);
        slot_put(r, bk, i, tag, v);
        tag = vt;
        v = vv;
        bk = other_bucket(r, bk, tag);
        if ((h = bucket_holes(&r->bk[bk])) != 0) {
            slot_put(r, bk, (unsigned)__builtin_ctz(h), tag, v);
            r->len++;
            return true;
        }
    }
    if (r->nstash == r->stash_cap) return false;
    r->stash[r->nstash++] = (uint64_t)tag << 32 | v;
    r->len++;
    return true;
}

void idx_tab_put_displacing(tab *r, uint32_t tag, uint32_t v) {
    bool ok = put(r, tag, v);
    assert(ok); /* idx_tab_reserve made room */
    (void)ok;
}

void idx_tab_del(tab *r, uint32_t pos) {
    uint32_t n = r->nb * BW;
    if (pos < n) {
        bucket *k = &r->bk[pos / BW];
        spill_note(r, pos / BW, k->tag[pos % BW], false);
        k->tag[pos % BW] = 0;
        k->ref[pos % BW] = 0;
    } else if (pos - n < r->nstash) {
        r->stash[pos - n] = r->stash[--r->nstash];
    } else { /* an old bucket, not moved yet */
        pos -= n + r->nstash;
        bucket *k = &r->obk[pos / BW];
        spill_count(r->ospill, r->onb, pos / BW, k->tag[pos % BW], false);
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

/* Free the old buckets (every key has left them). */
static void old_free(tab *r) {
    if (r->obk_mem) idx_mem_free(r->obk_mem, bk_bytes(r->onb));
    kvo_free(r->ospill);
    r->obk = NULL;
    r->obk_mem = NULL;
    r->ospill = NULL;
    r->onb = r->moved = 0;
}

static void tab_free_mem(tab *r) {
    old_free(r);
    if (r->bk_mem) idx_mem_free(r->bk_mem, bk_bytes(r->nb));
    if (r->next_mem) idx_mem_free(r->next_mem, bk_bytes(r->next_nb));
    kvo_free(r->spill);
    kvo_free(r->stash);
}

/* The buckets a table of nb grows to (x4 below HUGE_BYTES / 4 unless the
 * table grows by 2: each growth writes a fresh table, and small ones are
 * first-touched 4 KiB pages, ~15 us a fault here: 1.33x the final size
 * touched instead of 3x; x2 beyond). Whole factors let tab_grow split
 * buckets in one pass. */
static uint64_t next_buckets(const tab *r, uint64_t nb) {
    return !r->by2 && nb * sizeof(bucket) < HUGE_BYTES / 4 ? nb * 4 : nb * 2;
}

/* A table about to hold `fill` keys: once that is 7/8 of the way to its
 * next growth, fault in the next table's huge pages in step with the fill
 * (all of them by the growth; the file's header says why). Memory that
 * cannot be had now is simply not ahead: tab_grow maps its own. */
static void tab_prefault(tab *r, uint64_t fill) {
    uint64_t cap = (uint64_t)r->nb * BW * LOAD_NUM / LOAD_DEN,
             from = cap - cap / 8;
    if (!r->nb || fill <= from) return;
    uint64_t nb = next_buckets(r, r->nb);
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

/* Start a growth to nb buckets, with stash room for `more` insertions:
 * fresh buckets (those mapped ahead if they fit) become the table and the
 * present ones its old buckets, which tab_move empties a few at a time.
 * The stash moves at once. No key is read: the tag alone places a key. A
 * fresh table, never one grown in place: growing a large block in place
 * is an mremap, whose moved pages cost a first touch again (see
 * idx_mem_alloc). Nothing changes on failure. */
static kvo_status tab_grow(tab *r, uint32_t nb, uint32_t more) {
    assert(!r->onb); /* a growth under way is finished first */
    tab g;
    memset(&g, 0, sizeof(g));
    g.nb = nb;
    g.rng = r->rng ? r->rng : RNG_SEED;
    g.by2 = r->by2;
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
    for (uint32_t i = 0; i < r->nstash; i++) {
        bool ok = put(&g, (uint32_t)(r->stash[i] >> 32), (uint32_t)r->stash[i]);
        assert(ok); /* the stash has room for them all */
        (void)ok;
    }
    g.len = r->len; /* the old buckets' keys count where they are */
    if (r->nb) {
        g.obk = r->bk;
        g.obk_mem = r->bk_mem;
        g.ospill = r->spill;
        g.onb = r->nb;
    }
    if (r->next_mem) /* mapped ahead for another size */
        idx_mem_free(r->next_mem, bk_bytes(r->next_nb));
    kvo_free(r->stash);
    *r = g;
    return KVO_OK;
}

/* Move the keys of the next n old buckets (all that are left, at most) into
 * the table. Growth is by a whole factor f, and both buckets of a key are
 * fastrange(x, nb): the keys of old bucket b belong to buckets f*b ..
 * f*b+f-1 in the same role (primary or secondary), so a key goes there
 * when its bucket has a hole, else through put like any key. The stash
 * room there was stays (a reservation made before counts on it). KVO_ENOMEM
 * (no stash room) before a bucket is touched: every key is still there. */
static kvo_status tab_move(tab *r, uint32_t n) {
    uint32_t keep = r->stash_cap - r->nstash;
    while (r->onb && n--) {
        kvo_status s = stash_room(r, keep + BW);
        if (s != KVO_OK) return s;
        bucket *k = &r->obk[r->moved];
        for (unsigned m = ~bucket_holes(k) & BUCKET_ALL; m; m &= m - 1) {
            unsigned i = (unsigned)__builtin_ctz(m);
            uint32_t tag = k->tag[i], v = k->ref[i];
            bool prim = bucket1(tag, r->onb) == r->moved;
            uint32_t d = prim ? tab_b1(r, tag) : tab_b2(r, tag);
            unsigned hole = bucket_holes(&r->bk[d]);
            if (hole) {
                unsigned j = (unsigned)__builtin_ctz(hole);
                r->bk[d].tag[j] = tag;
                r->bk[d].ref[j] = v;
                if (!prim) spill_note(r, d, tag, true);
            } else {
                bool ok = put(r, tag, v); /* stash room: above */
                assert(ok);
                (void)ok;
                r->len--; /* put counted a key that was counted */
            }
        }
        memset(k, 0, sizeof(*k));
        if (++r->moved == r->onb) old_free(r);
    }
    return KVO_OK;
}

kvo_status idx_tab_reserve(tab *r, uint32_t more) {
    kvo_status s = stash_room(r, more);
    if (s != KVO_OK) return s;
    uint64_t need = (uint64_t)r->len + more;
    if (need * LOAD_DEN <= (uint64_t)r->nb * BW * LOAD_NUM) {
        /* a growth under way moves MOVE_PER_KEY old buckets per key to
         * come: done long before the table can fill */
        if (r->onb &&
            (s = tab_move(r, more ? MOVE_PER_KEY * more : 1)) != KVO_OK)
            return s;
        tab_prefault(r, need);
        return KVO_OK;
    }
    if ((s = tab_move(r, r->onb)) != KVO_OK) return s; /* finish it first */
    uint64_t nb = r->nb ? r->nb : TAB_FIRST_BUCKETS;
    while (need * LOAD_DEN > nb * BW * LOAD_NUM) nb = next_buckets(r, nb);
    if (nb * BW > TAB_MAX_SLOTS) return KVO_ETOOBIG;
    return tab_grow(r, (uint32_t)nb, more);
}

void idx_tab_fini(tab *r) {
    tab_free_mem(r);
    memset(r, 0, sizeof(*r));
}

uint64_t idx_tab_bytes(const tab *r) {
    return ((uint64_t)r->nb + r->onb) * (sizeof(bucket) + 1) +
           (uint64_t)r->stash_cap * sizeof(uint64_t) +
           (uint64_t)r->next_touched * HUGE_BYTES;
}

bool idx_tab_check(const tab *r, tab_hash_fn hash, const void *owner,
                   const char *name, char *msg, size_t msgsz) {
    uint32_t used = 0, n = r->nb * BW, old = n + r->nstash;
    uint32_t *spill = kvo_calloc(r->nb ? r->nb : 1, sizeof(uint32_t));
    uint32_t *ospill = kvo_calloc(r->onb ? r->onb : 1, sizeof(uint32_t));
    bool ok = false;
    if (!spill || !ospill) {
        kvo_free(spill);
        kvo_free(ospill);
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
        if (i >= n && i < old) continue; /* the stash */
        bool in_old = i >= old;
        uint32_t nb = in_old ? r->onb : r->nb, bk = (in_old ? i - old : i) / BW;
        uint32_t b1 = bucket1(tag, nb), b2 = bucket2(tag, nb);
        if (bk != b1 && bk != b2) {
            snprintf(msg, msgsz, "%s[%u]: key outside its buckets", name, i);
            goto done;
        }
        if (in_old && bk < r->moved) {
            snprintf(msg, msgsz, "%s[%u]: key in a moved old bucket", name, i);
            goto done;
        }
        if (bk != b1) (in_old ? ospill : spill)[b1]++;
    }
    for (uint32_t b = 0; b < r->nb; b++)
        if (r->spill[b] != SPILL_STUCK && r->spill[b] != spill[b]) {
            snprintf(msg, msgsz, "%s: bucket %u spills %u, counted %u", name, b,
                     r->spill[b], spill[b]);
            goto done;
        }
    for (uint32_t b = 0; b < r->onb; b++) /* an upper bound there */
        if (r->ospill[b] != SPILL_STUCK && r->ospill[b] < ospill[b]) {
            snprintf(msg, msgsz, "%s: old bucket %u spills %u, counted %u",
                     name, b, r->ospill[b], ospill[b]);
            goto done;
        }
    if (used != r->len) {
        snprintf(msg, msgsz, "%s: %u entries, len %u", name, used, r->len);
        goto done;
    }
    ok = true;
done:
    kvo_free(spill);
    kvo_free(ospill);
    return ok;
}
