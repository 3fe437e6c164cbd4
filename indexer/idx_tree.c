/* idx_tree.c -- the radix index of DESIGN §7 as a pure data structure, with
 * the semantics of Dynamo's RadixTree (lib/kv-router/src/radix_tree.rs).
 * No sockets, clocks, logging or I/O in here.
 *
 * What a path means
 * -----------------
 * Edges are keyed by tokens_hash (the router hash of one block's tokens). The
 * node reached from the root by the keys h0, h1, ..., hd-1 stands for "the
 * first d blocks of a prompt hash to h0..hd-1". Each node holds the set of
 * workers (worker slots: one per (worker_id, dp_rank)) that hold that block,
 * and the engine block_hash it was first stored with. Each worker also has a
 * lookup, block_hash -> node, through which a store finds its parent and a
 * removal its block. A query walks the path of its hashes from the root; a
 * worker's score is the number of leading nodes of the walk whose worker set
 * contains it (no gaps, no early exit).
 *
 * Dynamo's corners, kept on purpose (they are what the router really does):
 *  - a node whose worker set becomes empty after a removal drops every edge
 *    to its children ("detach"); a child lives on while a lookup entry or
 *    another edge refers to it, reachable through lookups only. The emptied
 *    node itself stays under its parent, with no workers, until its parent
 *    detaches in turn.
 *  - a store under a parent that lacks the tokens_hash re-links the node the
 *    worker's lookup already maps the block_hash to, if any, so a node can
 *    have several parents; a block re-linked under itself is an
 *    invalid_block (the edge stays, as in Dynamo).
 *  - lookup and worker sets can disagree after inconsistent streams (a
 *    block_hash stored at two nodes): each keeps its own truth, as in Dynamo.
 *  - freeing follows Rc: a node is released when no edge and no lookup entry
 *    refers to it. Nodes kept alive only by a cycle of edges leak, as Rc
 *    cycles do (only hashes repeating along a chain make cycles).
 * Deliberate differences (DESIGN §7 decides):
 *  - "cleared" drops the blocks of the emitting (worker_id, dp_rank) only;
 *    Dynamo clears every rank of the worker_id.
 *  - queries intersect worker sets level by level. Dynamo's find_matches
 *    assumes a child's set is a subset of its parent's and skips equal-size
 *    sets, which only differs after the corners above (a worker that lost a
 *    parent but kept its child).
 *  - the dump visits each node once, so cycles end and shared subtrees are
 *    not repeated (Dynamo's BFS would loop, or repeat them).
 *
 * Layout
 * ------
 *   nd[]     slab of 32-byte nodes addressed by u32 index; 0 is the root.
 *
 *       0             8             16       20     24      28      32
 *       +-------------+-------------+--------+------+-------+------+
 *       | tokens_hash | block_hash  | parent | wset | child | next |
 *       +-------------+-------------+--------+------+-------+------+
 *
 *     parent, tokens_hash  the node's primary edge (parent NIL: none; DEAD:
 *                          the node is free or being freed)
 *     wset    NIL: no worker; < 2^31: the single worker slot; TAG|off: a
 *             sorted array of 2+ slots in the set pool sp[] (header word =
 *             class << 24 | count)
 *     child   first edge of this node's child list
 *     next    the following edge in the parent's child list (primary edge);
 *             the free-list / dying-stack link of free nodes
 *   refs[]   u8 per node: lookup entries + alias edges pointing at it (from
 *            255 on, the rest is counted in the sorted side array ov[])
 *
 *   An edge is named by a u32 "ref": a node index n is n's primary edge;
 *   TAG|i is ea[i], an alias edge {tokens_hash, parent, child, next} for a
 *   node's second (third...) parent. A lookup entry is named the same way:
 *   n is the inline entry (n's single worker, n.block_hash) -> n; TAG|i is
 *   la[i] = {block_hash, slot, node}, for entries that cannot be inlined
 *   (node shared by several workers, or a block_hash other than the node's);
 *   an inline entry is turned into an alias record before its node's set
 *   stops being that one worker.
 *
 *   edges    table (parent, tokens_hash) -> edge ref, holding the edges of
 *            parents with two children or more. A lone child is found
 *            through parent.child, so chains cost no table space.
 *   look     table (slot, block_hash) -> lookup ref: every worker's lookup
 *            in one table.
 *   wmap     (worker_id, dp_rank) -> slot. Slots are never reused.
 *
 *   Tables are bucketized cuckoo hash tables of u32 refs. A bucket is one
 *   cache line: 8 tags (the top half of the key's hash) then 8 refs, probed
 *   with one vector compare. A key lives in its primary bucket
 *   fastrange(tag) or, when that is full, in its secondary (a scramble of
 *   the tag), displacing others along a short random walk if need be; the
 *   rare key no walk can place goes to a stash. spill[b] counts the keys of
 *   primary b that live elsewhere, so a miss reads one line unless b spilled.
 *   The key itself lives in the node or alias record the ref names (a probe
 *   reads it only on a tag match); the tag alone places a key, so growing
 *   never reads keys, and a table grows in place (its pages stay). Deletion
 *   just clears the slot. Load <= 15/16, growth x1.5 (load stays within
 *   0.63..0.94). A single-worker block costs 32 + 1 bytes of slab plus one
 *   lookup slot (8 bytes / load): 41.5 to 46 bytes per (block, worker).
 *
 * Invariants (idx_tree_check verifies all of them)
 * ----------
 *  I1 a live node with parent != NIL appears exactly once, as itself, in
 *     nd[parent]'s child list; alias edges appear once in ea[].parent's list.
 *  I2 keys are unique within a child list; the edges of a list of 2+ are all
 *     in `edges`, those of a list of 1 are not.
 *  I3 an inline lookup ref n sits at key (nd[n].wset, nd[n].block_hash) and
 *     nd[n].wset is a single slot; every lookup key is unique; per-slot entry
 *     counts equal ws[].blocks and their sum equals pairs.
 *  I4 refs[n] (+ ov) = lookup entries naming n + alias edges to n.
 *  I5 a live node other than the root has parent != NIL or refs > 0 (else it
 *     would have been freed); nothing is left on the dying stack.
 *  I6 worker sets are sorted, duplicate-free, of 2+ valid slots.
 *  I7 table tags match their entries' keys, keys sit in one of their two
 *     buckets (or the stash), spill counts are exact (or stuck at 255).
 *  I8 free nodes and free alias records are exactly those on the free lists.
 */
#include "idx_int.h"

#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define NIL 0xFFFFFFFFu
#define DEAD 0xFFFFFFFEu
#define TAG 0x80000000u
#define ROOT 0u
#define MAX_INDEX 0x7FFFFF00u /* nodes, alias records, set-pool words */
#define SET_CLASSES 26         /* class c = a block of 4 << c words */
#define SET_MAX_COUNT 0xFFFFFFu
#define MAX_SLOTS 0x00FFFFF0u

typedef struct node {
    uint64_t tokens_hash;
    uint64_t block_hash;
    uint32_t parent;
    uint32_t wset;
    uint32_t child;
    uint32_t next;
} node;

typedef struct ealias {
    uint64_t tokens_hash;
    uint32_t parent; /* DEAD when free */
    uint32_t child;
    uint32_t next;   /* list link, or free-list link */
    uint32_t spare;
} ealias;

typedef struct lalias {
    uint64_t block_hash;
    uint32_t slot; /* NIL when free */
    uint32_t node; /* or free-list link */
} lalias;

typedef struct wslot {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t present; /* known to the tree (Dynamo: has a lookup map) */
    uint64_t blocks;  /* lookup entries */
} wslot;

#define BW 8         /* slots per table bucket */
#define MAX_KICKS 64 /* cuckoo displacements before the stash */

/* One cache line: the tags first, so a probe compares all 8 at once. */
typedef struct bucket {
    uint32_t tag[BW];
    uint32_t ref[BW]; /* 0 = empty (ref 0, the root, is never stored) */
} __attribute__((aligned(64))) bucket;

typedef struct tab {
    bucket *bk;       /* nb, cache-line aligned inside bk_mem */
    void *bk_mem;
    uint8_t *spill;   /* nb: keys of primary bucket b kept in their
                         secondary (saturates at 255, then sticks) */
    uint64_t *stash;  /* tag << 32 | ref: keys no bucket could take */
    uint32_t nb, len; /* len counts the stash too */
    uint32_t nstash, stash_cap;
    uint32_t rng;     /* displacement choices */
} tab;

typedef struct ovf {
    uint32_t node;
    uint32_t extra; /* refs beyond 255 */
} ovf;

enum { K_EDGE = 0, K_LOOK = 1 };

struct idx_tree {
    node *nd;
    uint8_t *refs;
    uint32_t nd_len, nd_cap, nd_free, nd_live; /* nd_live excludes root */

    ealias *ea;
    uint32_t ea_len, ea_cap, ea_free, ea_live;
    lalias *la;
    uint32_t la_len, la_cap, la_free, la_live;

    uint32_t *sp;
    uint32_t sp_len, sp_cap, sp_live;
    uint32_t sp_step; /* words one set growth may take */
    uint32_t sp_free[SET_CLASSES];

    ovf *ov;
    uint32_t ov_len, ov_cap;

    tab edges, look;

    wslot *ws;
    uint32_t ws_len, ws_cap;
    uint32_t *wmap; /* power of two, NIL = empty */
    uint32_t wmap_cap;

    uint32_t *act; /* query scratch, ws_cap entries */
    uint32_t dying;
    uint64_t pairs;
    uint64_t held; /* live nodes with a non-empty worker set */
    idx_counters c;
};

/* ======================================================================== */
/* Hashing and tables                                                        */
/* ======================================================================== */

static inline uint64_t mix(uint64_t a, uint32_t b) {
    uint64_t x = a ^ ((uint64_t)b * 0x9E3779B97F4A7C15ull) ^ 0x2545F4914F6CDD1Dull;
    x ^= x >> 32;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    return x;
}

/* The tag is the hash's top half. The primary bucket is fastrange(tag),
 * the secondary a scramble of it, so neither growing nor displacing ever
 * reads a key; tags also filter probes (bucket-mates share only the bits
 * that chose the bucket). */
static inline uint32_t tab_b1(const tab *r, uint32_t tag) {
    return (uint32_t)(((uint64_t)tag * r->nb) >> 32);
}

static inline uint32_t tab_b2(const tab *r, uint32_t tag) {
    uint32_t x = tag * 0x9E3779B1u;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    return (uint32_t)(((uint64_t)x * r->nb) >> 32);
}

/* A position is bucket * BW + slot, or nb * BW + i for stash entry i. */
static inline uint32_t pos_ref(const tab *r, uint32_t pos) {
    uint32_t n = r->nb * BW;
    return pos < n ? r->bk[pos / BW].ref[pos % BW] : (uint32_t)r->stash[pos - n];
}

static inline uint32_t pos_tag(const tab *r, uint32_t pos) {
    uint32_t n = r->nb * BW;
    return pos < n ? r->bk[pos / BW].tag[pos % BW]
                   : (uint32_t)(r->stash[pos - n] >> 32);
}

static inline void tab_prefetch(const tab *r, uint64_t h) {
    if (!r->nb) return;
    uint32_t b = tab_b1(r, (uint32_t)(h >> 32));
    __builtin_prefetch(&r->bk[b]);
    __builtin_prefetch(&r->spill[b]);
}

/* Bit i set when tag[i] == tag (match) or ref[i] == 0 (hole). */
static inline unsigned bucket_match(const bucket *b, uint32_t tag) {
#ifdef __SSE2__
    __m128i k = _mm_set1_epi32((int)tag);
    __m128i lo = _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->tag), k);
    __m128i hi = _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->tag + 1), k);
    return (unsigned)(_mm_movemask_ps(_mm_castsi128_ps(lo)) |
                      _mm_movemask_ps(_mm_castsi128_ps(hi)) << 4);
#else
    unsigned m = 0;
    for (unsigned i = 0; i < BW; i++) m |= (unsigned)(b->tag[i] == tag) << i;
    return m;
#endif
}

static inline unsigned bucket_holes(const bucket *b) {
#ifdef __SSE2__
    __m128i z = _mm_setzero_si128();
    __m128i lo = _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->ref), z);
    __m128i hi = _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->ref + 1), z);
    return (unsigned)(_mm_movemask_ps(_mm_castsi128_ps(lo)) |
                      _mm_movemask_ps(_mm_castsi128_ps(hi)) << 4);
#else
    unsigned m = 0;
    for (unsigned i = 0; i < BW; i++) m |= (unsigned)(b->ref[i] == 0) << i;
    return m;
#endif
}

/* Hash of the key an entry's ref names. */
static uint64_t ref_hash(const idx_tree *t, int kind, uint32_t v) {
    if (kind == K_EDGE) {
        if (v & TAG) {
            const ealias *a = &t->ea[v & ~TAG];
            return mix(a->tokens_hash, a->parent);
        }
        return mix(t->nd[v].tokens_hash, t->nd[v].parent);
    }
    if (v & TAG) {
        const lalias *a = &t->la[v & ~TAG];
        return mix(a->block_hash, a->slot);
    }
    return mix(t->nd[v].block_hash, t->nd[v].wset);
}

/* Does ref v name the key (a, b)? Edges: (tokens_hash, parent); lookup:
 * (block_hash, slot). */
static inline bool key_eq(const idx_tree *t, int kind, uint32_t v, uint64_t a,
                          uint32_t b) {
    if (kind == K_EDGE) {
        if (v & TAG) {
            const ealias *e = &t->ea[v & ~TAG];
            return e->tokens_hash == a && e->parent == b;
        }
        return t->nd[v].tokens_hash == a && t->nd[v].parent == b;
    }
    if (v & TAG) {
        const lalias *l = &t->la[v & ~TAG];
        return l->block_hash == a && l->slot == b;
    }
    return t->nd[v].block_hash == a && t->nd[v].wset == b;
}

static inline uint32_t scan_bucket(const idx_tree *t, const tab *r, int kind,
                                   uint32_t bk, uint32_t tag, uint64_t a,
                                   uint32_t b) {
    const bucket *k = &r->bk[bk];
    for (unsigned m = bucket_match(k, tag) & ~bucket_holes(k); m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctz(m);
        if (key_eq(t, kind, k->ref[i], a, b)) return bk * BW + i;
    }
    return NIL;
}

/* Position of key (a, b) whose hash is h, or NIL. */
static inline uint32_t tab_find_h(const idx_tree *t, const tab *r, int kind,
                                  uint64_t a, uint32_t b, uint64_t h) {
    if (r->len == 0) return NIL;
    uint32_t tag = (uint32_t)(h >> 32);
    uint32_t b1 = tab_b1(r, tag);
    uint32_t pos = scan_bucket(t, r, kind, b1, tag, a, b);
    if (pos != NIL) return pos;
    if (r->spill[b1]) {
        uint32_t b2 = tab_b2(r, tag);
        if (b2 != b1 && (pos = scan_bucket(t, r, kind, b2, tag, a, b)) != NIL)
            return pos;
    }
    for (uint32_t j = 0; j < r->nstash; j++)
        if ((uint32_t)(r->stash[j] >> 32) == tag &&
            key_eq(t, kind, (uint32_t)r->stash[j], a, b))
            return r->nb * BW + j;
    return NIL;
}

static inline uint32_t tab_find(const idx_tree *t, const tab *r, int kind,
                                uint64_t a, uint32_t b) {
    return tab_find_h(t, r, kind, a, b, mix(a, b));
}

static inline uint32_t ref_at(const tab *r, uint32_t pos) {
    return pos_ref(r, pos);
}

static inline void ref_set(tab *r, uint32_t pos, uint32_t v) {
    uint32_t n = r->nb * BW;
    if (pos < n) r->bk[pos / BW].ref[pos % BW] = v;
    else r->stash[pos - n] = (r->stash[pos - n] & 0xFFFFFFFF00000000ull) | v;
}

/* A key with this tag now lives in (or left) bucket bk: keep spill[]. */
static inline void spill_note(tab *r, uint32_t bk, uint32_t tag, bool in) {
    uint32_t b1 = tab_b1(r, tag);
    if (b1 == bk) return;
    uint8_t *c = &r->spill[b1];
    if (in) {
        if (*c < 255) (*c)++;
    } else if (*c != 255) {
        (*c)--;
    }
}

/* Insert (tag, v), an absent key. The stash must have room for one (a
 * failed displacement walk parks its last key there); tab_reserve sees to
 * it. */
static void tab_put(tab *r, uint32_t tag, uint32_t v) {
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

static void tab_del(tab *r, uint32_t pos) {
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
    uint64_t cap = (uint64_t)r->nstash + more + 16;
    if (cap > 0x7FFFFFFFu) return KVO_ETOOBIG;
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
 * bucket cannot hold, are put aside and re-inserted at the end. Everything that can fail comes
 * before the realloc: then nothing changes on failure. */
static kvo_status tab_grow(tab *r, uint32_t nb) {
    uint32_t ob = r->nb;
    uint8_t *spill = kvo_calloc(nb, 1);
    if (!spill) return KVO_ENOMEM;
    uint64_t out = r->nstash;
    for (uint32_t b = 0; b < ob; b++) {
        const bucket *k = &r->bk[b];
        for (unsigned m = ~bucket_holes(k) & 0xFFu; m; m &= m - 1) {
            uint32_t tag = k->tag[__builtin_ctz(m)];
            if (b1_of(tag, ob) != b) out++;
            else spill[b1_of(tag, nb)]++; /* at most 2 old buckets each */
        }
    }
    for (uint32_t b = 0; b < nb; b++)
        if (spill[b] > BW) out += spill[b] - BW;
    uint64_t *aside = kvo_malloc((out ? out : 1) * sizeof(uint64_t));
    if (!aside || out > 0x7FFFFFFFu || stash_room(r, (uint32_t)out) != KVO_OK) {
        kvo_free(spill);
        kvo_free(aside);
        return KVO_ENOMEM;
    }
    size_t off = r->bk_mem ? (size_t)((char *)r->bk - (char *)r->bk_mem) : 0;
    void *mem = kvo_realloc(r->bk_mem, ((size_t)nb + 1) * sizeof(bucket));
    if (!mem) {
        kvo_free(spill);
        kvo_free(aside);
        return KVO_ENOMEM;
    }
    bucket *bk = (bucket *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
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
        for (unsigned m = ~bucket_holes(&was) & 0xFFu; m; m &= m - 1) {
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
    if (!r->rng) r->rng = 0x9E3779B9u;
    for (uint64_t j = 0; j < k; j++)
        tab_put(r, (uint32_t)(aside[j] >> 32), (uint32_t)aside[j]);
    kvo_free(aside);
    return KVO_OK;
}

/* Room for `more` insertions: load <= 15/16 (growing x1.5, so the load
 * stays within 0.63..0.94) and stash space for each. */
static kvo_status tab_reserve(tab *r, uint32_t more) {
    kvo_status s = stash_room(r, more);
    if (s != KVO_OK) return s;
    uint64_t need = (uint64_t)r->len + more;
    if (need * 16 <= (uint64_t)r->nb * BW * 15) return KVO_OK;
    uint64_t nb = r->nb ? r->nb : 4;
    while (need * 16 > nb * BW * 15) nb = nb * 3 / 2 + 1;
    if (nb * BW > 0x70000000u) return KVO_ETOOBIG;
    return tab_grow(r, (uint32_t)nb);
}

/* Bring in the lookup slot of (w, bh): a later block's, while this one is
 * worked on, AHEAD blocks ahead (about one memory latency of work). */
#define AHEAD 8
static inline uint64_t look_prefetch(const idx_tree *t, uint32_t w,
                                     uint64_t bh) {
    uint64_t h = mix(bh, w);
    tab_prefetch(&t->look, h);
    return h;
}

/* ---- Edge refs ---------------------------------------------------------- */

static inline uint32_t edge_next(const idx_tree *t, uint32_t e) {
    return (e & TAG) ? t->ea[e & ~TAG].next : t->nd[e].next;
}
static inline uint64_t edge_key(const idx_tree *t, uint32_t e) {
    return (e & TAG) ? t->ea[e & ~TAG].tokens_hash : t->nd[e].tokens_hash;
}
static inline uint32_t edge_child(const idx_tree *t, uint32_t e) {
    return (e & TAG) ? t->ea[e & ~TAG].child : e;
}

static inline uint32_t edge_find(const idx_tree *t, uint32_t p,
                                  uint64_t th) {
    return tab_find(t, &t->edges, K_EDGE, th, p);
}

/* The child of p under tokens_hash th, or NIL. */
static inline uint32_t child_find(const idx_tree *t, uint32_t p,
                                  uint64_t th) {
    uint32_t e = t->nd[p].child;
    if (e == NIL) return NIL;
    if (!(e & TAG)) {
        const node *c = &t->nd[e];
        if (c->next == NIL) return c->tokens_hash == th ? e : NIL;
    } else {
        const ealias *a = &t->ea[e & ~TAG];
        if (a->next == NIL) return a->tokens_hash == th ? a->child : NIL;
    }
    uint32_t pos = edge_find(t, p, th);
    return pos == NIL ? NIL : edge_child(t, ref_at(&t->edges, pos));
}

/* ---- Lookup refs -------------------------------------------------------- */

static inline uint32_t look_node(const idx_tree *t, uint32_t v) {
    return (v & TAG) ? t->la[v & ~TAG].node : v;
}

static inline uint32_t look_find(const idx_tree *t, uint32_t slot,
                                  uint64_t bh) {
    return tab_find(t, &t->look, K_LOOK, bh, slot);
}

/* ======================================================================== */
/* Pools                                                                     */
/* ======================================================================== */

static kvo_status grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return KVO_OK;
    if (need > MAX_INDEX) return KVO_ETOOBIG;
    uint64_t n = *cap ? *cap : 64;
    while (n < need) n = n * 3 / 2 + 1;
    if (n > MAX_INDEX) n = MAX_INDEX;
    void *q = kvo_realloc(*p, (size_t)n * elem);
    if (!q) return KVO_ENOMEM;
    *p = q;
    *cap = (uint32_t)n;
    return KVO_OK;
}

static kvo_status nodes_reserve(idx_tree *t, uint32_t more) {
    if (t->nd_free != NIL && more <= 1) return KVO_OK;
    if (more > MAX_INDEX - t->nd_len) return KVO_ETOOBIG;
    uint32_t need = t->nd_len + more;
    if (need <= t->nd_cap) return KVO_OK;
    uint32_t cap = t->nd_cap;
    kvo_status s = grow((void **)&t->nd, &cap, need, sizeof(node));
    if (s != KVO_OK) return s;
    uint32_t rcap = t->nd_cap;
    uint8_t *r = t->refs;
    if (rcap < cap) {
        r = kvo_realloc(t->refs, cap);
        if (!r) return KVO_ENOMEM; /* nd keeps its larger block: harmless */
    }
    t->refs = r;
    t->nd_cap = cap;
    return KVO_OK;
}

static uint32_t node_new(idx_tree *t, uint64_t bh, uint64_t th) {
    uint32_t n;
    if (t->nd_free != NIL) {
        n = t->nd_free;
        t->nd_free = t->nd[n].next;
    } else {
        n = t->nd_len++;
    }
    t->nd[n] = (node){th, bh, NIL, NIL, NIL, NIL};
    t->refs[n] = 0;
    t->nd_live++;
    return n;
}

static uint32_t ea_new(idx_tree *t) {
    uint32_t a;
    if (t->ea_free != NIL) {
        a = t->ea_free;
        t->ea_free = t->ea[a].next;
    } else {
        a = t->ea_len++;
    }
    t->ea_live++;
    return a;
}

static void ea_release(idx_tree *t, uint32_t a) {
    t->ea[a].parent = DEAD;
    t->ea[a].next = t->ea_free;
    t->ea_free = a;
    t->ea_live--;
}

static uint32_t la_new(idx_tree *t, uint64_t bh, uint32_t slot, uint32_t n) {
    uint32_t a;
    if (t->la_free != NIL) {
        a = t->la_free;
        t->la_free = t->la[a].node;
    } else {
        a = t->la_len++;
    }
    t->la[a] = (lalias){bh, slot, n};
    t->la_live++;
    return a;
}

static void la_release(idx_tree *t, uint32_t a) {
    t->la[a].slot = NIL;
    t->la[a].node = t->la_free;
    t->la_free = a;
    t->la_live--;
}

/* ---- Reference counts --------------------------------------------------- */

static uint32_t ov_find(const idx_tree *t, uint32_t n) {
    uint32_t lo = 0, hi = t->ov_len;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (t->ov[mid].node < n) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void ref_inc(idx_tree *t, uint32_t n) {
    if (t->refs[n] < 255) {
        t->refs[n]++;
        return;
    }
    uint32_t i = ov_find(t, n);
    if (i < t->ov_len && t->ov[i].node == n) {
        t->ov[i].extra++;
        return;
    }
    memmove(&t->ov[i + 1], &t->ov[i], (t->ov_len - i) * sizeof(ovf));
    t->ov[i] = (ovf){n, 1};
    t->ov_len++;
}

static void ref_dec(idx_tree *t, uint32_t n) {
    if (t->refs[n] == 255) {
        uint32_t i = ov_find(t, n);
        if (i < t->ov_len && t->ov[i].node == n) {
            if (--t->ov[i].extra == 0) {
                memmove(&t->ov[i], &t->ov[i + 1],
                        (t->ov_len - i - 1) * sizeof(ovf));
                t->ov_len--;
            }
            return;
        }
    }
    t->refs[n]--;
}

/* ---- Worker sets -------------------------------------------------------- */

static inline uint32_t set_count(const uint32_t *s) { return s[0] & SET_MAX_COUNT; }
static inline uint32_t set_class(const uint32_t *s) { return s[0] >> 24; }
static inline uint32_t class_items(uint32_t cls) { return (4u << cls) - 1; }

static uint32_t class_for(uint32_t count) {
    uint32_t c = 0;
    while (class_items(c) < count) c++;
    return c;
}

static uint32_t set_new(idx_tree *t, uint32_t cls) {
    uint32_t off;
    if (t->sp_free[cls] != NIL) {
        off = t->sp_free[cls];
        t->sp_free[cls] = t->sp[off + 1];
    } else {
        off = t->sp_len;
        t->sp_len += 4u << cls;
    }
    t->sp[off] = cls << 24;
    t->sp_live++;
    return off;
}

static void set_release(idx_tree *t, uint32_t off) {
    uint32_t cls = set_class(&t->sp[off]);
    t->sp[off] = cls << 24;
    t->sp[off + 1] = t->sp_free[cls];
    t->sp_free[cls] = off;
    t->sp_live--;
}

/* Room for one set to grow by one class (sets hold at most every slot). */
static inline kvo_status sets_reserve(idx_tree *t) {
    uint32_t words = t->sp_step; /* 4 << class_for(ws_len + 1) */
    if (t->sp_cap - t->sp_len >= words) return KVO_OK;
    if (words > MAX_INDEX - t->sp_len) return KVO_ETOOBIG;
    return grow((void **)&t->sp, &t->sp_cap, t->sp_len + words,
                sizeof(uint32_t));
}

static uint32_t lower_bound(const uint32_t *a, uint32_t n, uint32_t w) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (a[mid] < w) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Turn the inline lookup entry (w, n.block_hash) -> n, if there is one,
 * into an alias record: n's worker set is about to stop being {w}. */
static void look_outline(idx_tree *t, uint32_t n, uint32_t w) {
    uint64_t bh = t->nd[n].block_hash;
    uint32_t pos = look_find(t, w, bh);
    if (pos == NIL || ref_at(&t->look, pos) != n) return;
    ref_set(&t->look, pos, TAG | la_new(t, bh, w, n));
}

static void wset_add(idx_tree *t, uint32_t n, uint32_t w) {
    uint32_t ws = t->nd[n].wset;
    if (ws == NIL) {
        t->nd[n].wset = w;
        t->held++;
        return;
    }
    if (!(ws & TAG)) {
        if (ws == w) return;
        look_outline(t, n, ws);
        uint32_t off = set_new(t, 0);
        uint32_t *s = &t->sp[off];
        s[0] |= 2;
        s[1] = ws < w ? ws : w;
        s[2] = ws < w ? w : ws;
        t->nd[n].wset = TAG | off;
        return;
    }
    uint32_t off = ws & ~TAG;
    uint32_t *s = &t->sp[off];
    uint32_t cnt = set_count(s), cls = set_class(s);
    uint32_t i = lower_bound(s + 1, cnt, w);
    if (i < cnt && s[1 + i] == w) return;
    if (cnt + 1 <= class_items(cls)) {
        memmove(&s[2 + i], &s[1 + i], (cnt - i) * sizeof(uint32_t));
        s[1 + i] = w;
        s[0] = cls << 24 | (cnt + 1);
        return;
    }
    uint32_t noff = set_new(t, cls + 1); /* reserved: sp does not move */
    uint32_t *d = &t->sp[noff];
    memcpy(&d[1], &s[1], i * sizeof(uint32_t));
    d[1 + i] = w;
    memcpy(&d[2 + i], &s[1 + i], (cnt - i) * sizeof(uint32_t));
    d[0] = (cls + 1) << 24 | (cnt + 1);
    set_release(t, off);
    t->nd[n].wset = TAG | noff;
}

/* Remove w from n's set (no-op when absent). The caller has already
 * outlined any inline lookup entry that depends on the set being {w}. */
static void wset_del(idx_tree *t, uint32_t n, uint32_t w) {
    uint32_t ws = t->nd[n].wset;
    if (ws == NIL) return;
    if (!(ws & TAG)) {
        if (ws == w) {
            t->nd[n].wset = NIL;
            t->held--;
        }
        return;
    }
    uint32_t off = ws & ~TAG;
    uint32_t *s = &t->sp[off];
    uint32_t cnt = set_count(s), i = lower_bound(s + 1, cnt, w);
    if (i == cnt || s[1 + i] != w) return;
    memmove(&s[1 + i], &s[2 + i], (cnt - i - 1) * sizeof(uint32_t));
    cnt--;
    if (cnt == 1) {
        t->nd[n].wset = s[1];
        set_release(t, off);
    } else {
        s[0] = set_class(s) << 24 | cnt;
    }
}

/* ======================================================================== */
/* Edges, detaching and freeing                                              */
/* ======================================================================== */

/* Add the edge (p, th) -> c (absent so far). It becomes c's primary edge when
 * c has none; otherwise an alias edge that holds a reference on c. */
static void edge_add(idx_tree *t, uint32_t p, uint64_t th, uint32_t c) {
    uint32_t first = t->nd[p].child;
    bool was_single = first != NIL && edge_next(t, first) == NIL;
    uint32_t e;
    if (t->nd[c].parent == NIL && c != p) {
        t->nd[c].parent = p;
        t->nd[c].tokens_hash = th;
        t->nd[c].next = first;
        e = c;
    } else {
        uint32_t a = ea_new(t);
        t->ea[a] = (ealias){th, p, c, first, 0};
        ref_inc(t, c);
        e = TAG | a;
    }
    t->nd[p].child = e;
    if (was_single)
        tab_put(&t->edges, (uint32_t)(mix(edge_key(t, first), p) >> 32), first);
    if (first != NIL) tab_put(&t->edges, (uint32_t)(mix(th, p) >> 32), e);
}

/* Queue n for release when nothing refers to it any more. */
static void maybe_free(idx_tree *t, uint32_t n) {
    if (n == ROOT || t->nd[n].parent != NIL || t->refs[n] != 0) return;
    t->nd[n].parent = DEAD;
    t->nd[n].next = t->dying;
    t->dying = n;
}

/* Drop every edge from p to its children (Dynamo: children.clear()). */
static void detach(idx_tree *t, uint32_t p) {
    uint32_t e = t->nd[p].child;
    if (e == NIL) return;
    bool hashed = edge_next(t, e) != NIL;
    t->nd[p].child = NIL;
    while (e != NIL) {
        uint32_t nx = edge_next(t, e);
        if (hashed) {
            uint32_t pos = edge_find(t, p, edge_key(t, e));
            tab_del(&t->edges, pos);
        }
        uint32_t c;
        if (e & TAG) {
            c = t->ea[e & ~TAG].child;
            ea_release(t, e & ~TAG);
            ref_dec(t, c);
        } else {
            c = e;
            t->nd[c].parent = NIL;
            t->nd[c].next = NIL;
        }
        maybe_free(t, c);
        e = nx;
    }
}

/* Release every queued node; their children may follow. */
static void drain(idx_tree *t) {
    while (t->dying != NIL) {
        uint32_t n = t->dying;
        t->dying = t->nd[n].next;
        detach(t, n);
        if (t->nd[n].wset != NIL) t->held--;
        if (t->nd[n].wset != NIL && (t->nd[n].wset & TAG))
            set_release(t, t->nd[n].wset & ~TAG);
        t->nd[n].wset = NIL;
        t->nd[n].next = t->nd_free;
        t->nd_free = n;
        t->nd_live--;
    }
}

/* ======================================================================== */
/* Lookup entries                                                            */
/* ======================================================================== */

/* Map (w, bh) -> n; h = mix(bh, w). pos: the entry's position, NIL when
 * (w, bh) is known to be absent, or FIND. Returns the node it mapped to
 * before (NIL when new). */
#define FIND DEAD
static uint32_t look_put(idx_tree *t, uint32_t w, uint64_t bh, uint64_t h,
                         uint32_t n, uint32_t pos) {
    if (pos == FIND) pos = tab_find_h(t, &t->look, K_LOOK, bh, w, h);
    bool inl = t->nd[n].wset == w && t->nd[n].block_hash == bh;
    if (pos != NIL) {
        uint32_t v = ref_at(&t->look, pos), old = look_node(t, v);
        if (old == n) return NIL;
        if (v & TAG) {
            if (inl) {
                la_release(t, v & ~TAG);
                ref_set(&t->look, pos, n);
            } else {
                t->la[v & ~TAG].node = n;
            }
        } else {
            ref_set(&t->look, pos, inl ? n : (TAG | la_new(t, bh, w, n)));
        }
        ref_inc(t, n);
        ref_dec(t, old);
        return old;
    }
    uint32_t v = inl ? n : (TAG | la_new(t, bh, w, n));
    tab_put(&t->look, (uint32_t)(h >> 32), v);
    ref_inc(t, n);
    t->ws[w].blocks++;
    t->pairs++;
    return NIL;
}

/* Erase the lookup entry at pos; returns the node it named. */
static uint32_t look_erase(idx_tree *t, uint32_t w, uint32_t pos) {
    uint32_t v = ref_at(&t->look, pos), n = look_node(t, v);
    tab_del(&t->look, pos);
    if (v & TAG) la_release(t, v & ~TAG);
    ref_dec(t, n);
    t->ws[w].blocks--;
    t->pairs--;
    return n;
}

/* ======================================================================== */
/* Worker slots                                                              */
/* ======================================================================== */

static inline uint32_t wmap_home(const idx_tree *t, uint64_t wid,
                                 uint32_t rank) {
    return (uint32_t)mix(wid, rank) & (t->wmap_cap - 1);
}

static uint32_t slot_find(const idx_tree *t, uint64_t wid, uint32_t rank) {
    if (!t->wmap_cap) return NIL;
    for (uint32_t i = wmap_home(t, wid, rank);; i = (i + 1) & (t->wmap_cap - 1)) {
        uint32_t s = t->wmap[i];
        if (s == NIL) return NIL;
        if (t->ws[s].worker_id == wid && t->ws[s].dp_rank == rank) return s;
    }
}

static void wmap_insert(idx_tree *t, uint32_t s) {
    uint32_t i = wmap_home(t, t->ws[s].worker_id, t->ws[s].dp_rank);
    while (t->wmap[i] != NIL) i = (i + 1) & (t->wmap_cap - 1);
    t->wmap[i] = s;
}

/* The slot of (wid, rank), created on first sight (Dynamo creates the
 * worker's lookup map for any event, even a rejected one). */
static kvo_status slot_get(idx_tree *t, uint64_t wid, uint32_t rank,
                           uint32_t *out) {
    uint32_t s = slot_find(t, wid, rank);
    if (s != NIL) {
        t->ws[s].present = 1;
        *out = s;
        return KVO_OK;
    }
    if (t->ws_len >= MAX_SLOTS) return KVO_ETOOBIG;
    if (t->ws_len + 1 > t->ws_cap) {
        uint32_t cap = t->ws_cap ? t->ws_cap * 2 : 16;
        wslot *w = kvo_realloc(t->ws, cap * sizeof(wslot));
        if (!w) return KVO_ENOMEM;
        t->ws = w;
        uint32_t *a = kvo_realloc(t->act, cap * sizeof(uint32_t));
        if (!a) return KVO_ENOMEM;
        t->act = a;
        t->ws_cap = cap;
    }
    if ((t->ws_len + 1) * 2 > t->wmap_cap) {
        uint32_t cap = t->wmap_cap ? t->wmap_cap * 2 : 32;
        uint32_t *m = kvo_malloc(cap * sizeof(uint32_t));
        if (!m) return KVO_ENOMEM;
        memset(m, 0xFF, cap * sizeof(uint32_t));
        kvo_free(t->wmap);
        t->wmap = m;
        t->wmap_cap = cap;
        for (uint32_t i = 0; i < t->ws_len; i++) wmap_insert(t, i);
    }
    s = t->ws_len++;
    t->sp_step = 4u << class_for(t->ws_len + 1);
    t->ws[s] = (wslot){wid, rank, 1, 0};
    wmap_insert(t, s);
    *out = s;
    return KVO_OK;
}

/* ======================================================================== */
/* Lifecycle                                                                 */
/* ======================================================================== */

kvo_status idx_tree_new(idx_tree **out) {
    idx_tree *t = kvo_calloc(1, sizeof(*t));
    if (!t) return KVO_ENOMEM;
    t->nd_free = t->ea_free = t->la_free = t->dying = NIL;
    for (int i = 0; i < SET_CLASSES; i++) t->sp_free[i] = NIL;
    if (nodes_reserve(t, 1) != KVO_OK) {
        idx_tree_free(t);
        return KVO_ENOMEM;
    }
    t->nd[ROOT] = (node){0, 0, NIL, NIL, NIL, NIL};
    t->refs[ROOT] = 0;
    t->nd_len = 1;
    *out = t;
    return KVO_OK;
}

void idx_tree_free(idx_tree *t) {
    if (!t) return;
    kvo_free(t->nd);
    kvo_free(t->refs);
    kvo_free(t->ea);
    kvo_free(t->la);
    kvo_free(t->sp);
    kvo_free(t->ov);
    kvo_free(t->edges.bk_mem);
    kvo_free(t->edges.spill);
    kvo_free(t->edges.stash);
    kvo_free(t->look.bk_mem);
    kvo_free(t->look.spill);
    kvo_free(t->look.stash);
    kvo_free(t->ws);
    kvo_free(t->wmap);
    kvo_free(t->act);
    kvo_free(t);
}

/* ======================================================================== */
/* Applying events                                                           */
/* ======================================================================== */

/* Everything a store of n blocks may allocate, so that it never fails
 * half-way: per block a node, an alias edge, two lookup aliases, two
 * edge-table and one lookup-table entries, two overflow counts, and one set
 * growth (sets_reserve, per block: the set pool moves). */
static kvo_status store_reserve(idx_tree *t, uint32_t n) {
    kvo_status s;
    if (n > MAX_INDEX / 2) return KVO_ETOOBIG;
    if ((s = nodes_reserve(t, n)) != KVO_OK) return s;
    if ((s = grow((void **)&t->ea, &t->ea_cap, t->ea_len + n,
                  sizeof(ealias))) != KVO_OK)
        return s;
    if ((s = grow((void **)&t->la, &t->la_cap, t->la_len + 2 * n,
                  sizeof(lalias))) != KVO_OK)
        return s;
    if ((s = grow((void **)&t->ov, &t->ov_cap, t->ov_len + 2 * n,
                  sizeof(ovf))) != KVO_OK)
        return s;
    if ((s = tab_reserve(&t->edges, 2 * n)) != KVO_OK) return s;
    return tab_reserve(&t->look, n);
}

static kvo_status apply_store(idx_tree *t, uint32_t w, const wire_revent *ev,
                              idx_evstatus *st) {
    uint32_t cur = ROOT;
    if (ev->has_parent) {
        uint32_t pos = look_find(t, w, ev->parent_hash);
        if (pos == NIL) {
            *st = IDX_EV_PARENT_NOT_FOUND;
            return KVO_OK;
        }
        cur = look_node(t, ref_at(&t->look, pos));
    }
    kvo_status s = store_reserve(t, ev->n_blocks);
    if (s != KVO_OK) return s;
    *st = IDX_EV_OK;
    uint64_t ring[AHEAD]; /* hashes of the blocks prefetched ahead */
    for (uint32_t i = 0; i < ev->n_blocks && i < AHEAD; i++)
        ring[i] = look_prefetch(t, w, ev->blocks[i].block_hash);
    for (uint32_t i = 0; i < ev->n_blocks; i++) {
        if ((s = sets_reserve(t)) != KVO_OK) return s;
        uint64_t bh = ev->blocks[i].block_hash;
        uint64_t th = ev->blocks[i].tokens_hash;
        uint64_t h = ring[i % AHEAD];
        if (i + AHEAD < ev->n_blocks)
            ring[i % AHEAD] = look_prefetch(t, w, ev->blocks[i + AHEAD].block_hash);
        uint32_t c = child_find(t, cur, th), pos = FIND;
        if (c != NIL) {
            if (c == cur) { /* a self edge left by an earlier event */
                *st = IDX_EV_INVALID_BLOCK;
                return KVO_OK;
            }
            if (t->nd[c].block_hash != bh) t->c.hash_mismatch++;
        } else {
            pos = tab_find_h(t, &t->look, K_LOOK, bh, w, h);
            c = pos != NIL ? look_node(t, ref_at(&t->look, pos))
                           : node_new(t, bh, th);
            edge_add(t, cur, th, c);
            if (c == cur) { /* Dynamo links it, then rejects the block */
                *st = IDX_EV_INVALID_BLOCK;
                return KVO_OK;
            }
            /* pos stays valid: nothing below moves lookup entries
             * (outlining rewrites a value in place) */
        }
        wset_add(t, c, w);
        uint32_t old = look_put(t, w, bh, h, c, pos);
        if (old != NIL) maybe_free(t, old);
        drain(t);
        t->c.blocks_stored++;
        cur = c;
    }
    return KVO_OK;
}

/* After w lost its lookup entry (value v) for node n: w leaves n's set, and
 * an emptied n detaches its children. */
static void leave_node(idx_tree *t, uint32_t w, uint32_t v, uint32_t n) {
    if ((v & TAG) && t->nd[n].wset == w) look_outline(t, n, w);
    wset_del(t, n, w);
    if (t->nd[n].wset == NIL) detach(t, n);
}

static kvo_status apply_remove(idx_tree *t, uint32_t w, const wire_revent *ev,
                               idx_evstatus *st) {
    *st = IDX_EV_OK;
    uint64_t ring[AHEAD];
    for (uint32_t i = 0; i < ev->n_removed && i < AHEAD; i++)
        ring[i] = look_prefetch(t, w, ev->removed[i]);
    for (uint32_t i = 0; i < ev->n_removed; i++) {
        kvo_status s = grow((void **)&t->la, &t->la_cap, t->la_len + 1,
                            sizeof(lalias));
        if (s != KVO_OK) return s;
        uint64_t h = ring[i % AHEAD];
        if (i + AHEAD < ev->n_removed)
            ring[i % AHEAD] = look_prefetch(t, w, ev->removed[i + AHEAD]);
        uint32_t pos = tab_find_h(t, &t->look, K_LOOK, ev->removed[i], w, h);
        if (pos == NIL) {
            t->c.blocks_not_found++;
            *st = IDX_EV_BLOCK_NOT_FOUND;
            continue;
        }
        uint32_t v = ref_at(&t->look, pos);
        uint32_t n = look_erase(t, w, pos);
        leave_node(t, w, v, n);
        maybe_free(t, n);
        drain(t);
        t->c.blocks_removed++;
    }
    return KVO_OK;
}

typedef struct centry {
    uint64_t block_hash;
    uint32_t node;
    uint32_t v;
} centry;

/* Drop every lookup entry of slot w (Dynamo: remove_or_clear_worker_blocks).
 * All entries are erased first, so no inline entry of w needs outlining;
 * then w leaves the nodes; then unreferenced nodes are released. */
static kvo_status clear_slot(idx_tree *t, uint32_t w) {
    uint64_t n = t->ws[w].blocks;
    if (n == 0) return KVO_OK;
    centry *list = kvo_malloc(n * sizeof(centry));
    if (!list) return KVO_ENOMEM;
    uint64_t k = 0;
    for (uint32_t a = 0; a < t->la_len && k < n; a++)
        if (t->la[a].slot == w)
            list[k++] = (centry){t->la[a].block_hash, t->la[a].node, TAG};
    for (uint32_t x = 1; x < t->nd_len && k < n; x++) {
        if (t->nd[x].parent == DEAD || t->nd[x].wset != w) continue;
        uint32_t pos = look_find(t, w, t->nd[x].block_hash);
        if (pos != NIL && ref_at(&t->look, pos) == x)
            list[k++] = (centry){t->nd[x].block_hash, x, x};
    }
    for (uint64_t i = 0; i < k; i++) {
        uint32_t pos = look_find(t, w, list[i].block_hash);
        if (pos != NIL) look_erase(t, w, pos);
    }
    for (uint64_t i = 0; i < k; i++) {
        uint32_t x = list[i].node;
        wset_del(t, x, w);
        if (t->nd[x].wset == NIL) detach(t, x);
    }
    for (uint64_t i = 0; i < k; i++) maybe_free(t, list[i].node);
    drain(t);
    kvo_free(list);
    return KVO_OK;
}

kvo_status idx_tree_apply(idx_tree *t, const wire_revent *ev,
                          idx_evstatus *st) {
    if (!t || !ev || !st) return KVO_EINVAL;
    if (ev->type < WIRE_R_STORED || ev->type > WIRE_R_CLEARED)
        return KVO_EINVAL;
    uint32_t w;
    kvo_status s = slot_get(t, ev->worker_id, ev->dp_rank, &w);
    if (s != KVO_OK) return s;
    switch (ev->type) {
    case WIRE_R_STORED: s = apply_store(t, w, ev, st); break;
    case WIRE_R_REMOVED: s = apply_remove(t, w, ev, st); break;
    default:
        s = clear_slot(t, w);
        *st = IDX_EV_OK;
        break;
    }
    if (s == KVO_OK) t->c.events[ev->type][*st]++;
    return s;
}

kvo_status idx_tree_worker_remove(idx_tree *t, uint64_t worker_id) {
    for (uint32_t w = 0; w < t->ws_len; w++) {
        if (t->ws[w].worker_id != worker_id || !t->ws[w].present) continue;
        kvo_status s = clear_slot(t, w);
        if (s != KVO_OK) return s;
        t->ws[w].present = 0;
    }
    return KVO_OK;
}

/* ======================================================================== */
/* Queries                                                                   */
/* ======================================================================== */

void idx_scores_init(idx_scores *s) { memset(s, 0, sizeof(*s)); }

void idx_scores_fini(idx_scores *s) {
    kvo_free(s->v);
    memset(s, 0, sizeof(*s));
}

static inline void emit(const idx_tree *t, idx_scores *out, uint32_t w,
                        size_t depth) {
    out->v[out->n++] = (idx_score){t->ws[w].worker_id, t->ws[w].dp_rank,
                                   (uint32_t)depth};
}

static bool score_less(const idx_score *a, const idx_score *b) {
    return a->worker_id != b->worker_id ? a->worker_id < b->worker_id
                                        : a->dp_rank < b->dp_rank;
}

static int score_cmp(const void *a, const void *b) {
    return score_less(a, b) ? -1 : score_less(b, a) ? 1 : 0;
}

static void scores_sort(idx_scores *out) {
    if (out->n > 16) {
        qsort(out->v, out->n, sizeof(idx_score), score_cmp);
        return;
    }
    for (size_t i = 1; i < out->n; i++) {
        idx_score x = out->v[i];
        size_t j = i;
        for (; j > 0 && score_less(&x, &out->v[j - 1]); j--)
            out->v[j] = out->v[j - 1];
        out->v[j] = x;
    }
}

kvo_status idx_tree_query(idx_tree *t, const uint64_t *h, size_t n,
                          idx_scores *out) {
    out->n = 0;
    out->isl_blocks = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    if (out->cap < t->ws_len) {
        idx_score *v = kvo_realloc(out->v, t->ws_len * sizeof(idx_score));
        if (!v) return KVO_ENOMEM;
        out->v = v;
        out->cap = t->ws_len;
    }
    if (n == 0) return KVO_OK;
    uint32_t c = child_find(t, ROOT, h[0]);
    if (c == NIL || t->nd[c].wset == NIL) return KVO_OK;

    /* act: the workers present at every node so far, sorted */
    uint32_t *act = t->act, na;
    uint32_t curws = t->nd[c].wset;
    if (!(curws & TAG)) {
        act[0] = curws;
        na = 1;
    } else {
        const uint32_t *s = &t->sp[curws & ~TAG];
        na = set_count(s);
        memcpy(act, s + 1, na * sizeof(uint32_t));
    }
    size_t depth = 1;
    uint32_t cur = c;
    for (size_t i = 1; i < n; i++) {
        uint32_t nx = child_find(t, cur, h[i]);
        if (nx == NIL) break;
        uint32_t ws = t->nd[nx].wset;
        if (ws != curws) {
            if (ws == NIL) break;
            if (!(ws & TAG)) {
                bool keep = false;
                for (uint32_t j = 0; j < na; j++) {
                    if (act[j] == ws) keep = true;
                    else emit(t, out, act[j], depth);
                }
                na = 0;
                if (!keep) break;
                act[0] = ws;
                na = 1;
            } else {
                const uint32_t *s = &t->sp[ws & ~TAG];
                uint32_t cnt = set_count(s);
                s++;
                if (cnt != na || memcmp(s, act, na * sizeof(uint32_t))) {
                    uint32_t k = 0, j = 0;
                    for (uint32_t a = 0; a < na; a++) {
                        while (j < cnt && s[j] < act[a]) j++;
                        if (j < cnt && s[j] == act[a]) act[k++] = act[a];
                        else emit(t, out, act[a], depth);
                    }
                    na = k;
                    if (na == 0) break;
                }
            }
            curws = ws;
        }
        cur = nx;
        depth = i + 1;
    }
    for (uint32_t a = 0; a < na; a++) emit(t, out, act[a], depth);
    scores_sort(out);
    return KVO_OK;
}

/* ======================================================================== */
/* Introspection                                                             */
/* ======================================================================== */

const char *idx_evstatus_name(idx_evstatus s) {
    static const char *names[] = {"ok", "parent_not_found", "block_not_found",
                                  "invalid_block"};
    return (unsigned)s < IDX_EV_STATUS_COUNT ? names[s] : "?";
}

const char *idx_rtype_name(wire_rtype t) {
    switch (t) {
    case WIRE_R_STORED: return "stored";
    case WIRE_R_REMOVED: return "removed";
    case WIRE_R_CLEARED: return "cleared";
    }
    return "?";
}

void idx_tree_counters(const idx_tree *t, idx_counters *out) { *out = t->c; }

void idx_tree_stats(const idx_tree *t, idx_stats *out) {
    memset(out, 0, sizeof(*out));
    out->nodes = t->nd_live;
    out->held = t->held;
    out->pairs = t->pairs;
    for (uint32_t w = 0; w < t->ws_len; w++) out->workers += t->ws[w].present;
    out->edge_alias = t->ea_live;
    out->look_alias = t->la_live;
    out->sets = t->sp_live;
    out->bytes = sizeof(*t) + (uint64_t)t->nd_cap * (sizeof(node) + 1) +
                 (uint64_t)t->ea_cap * sizeof(ealias) +
                 (uint64_t)t->la_cap * sizeof(lalias) +
                 (uint64_t)t->sp_cap * 4 + (uint64_t)t->ov_cap * sizeof(ovf) +
                 (uint64_t)(t->edges.nb + t->look.nb) * (BW * 8 + 1) +
                 (uint64_t)(t->edges.stash_cap + t->look.stash_cap) * 8 +
                 (uint64_t)t->ws_cap * (sizeof(wslot) + 4) +
                 (uint64_t)t->wmap_cap * 4;
}

static int worker_cmp(const void *a, const void *b) {
    const idx_worker *x = a, *y = b;
    if (x->worker_id != y->worker_id) return x->worker_id < y->worker_id ? -1 : 1;
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

kvo_status idx_tree_workers(const idx_tree *t, idx_worker **out, size_t *n) {
    size_t k = 0;
    for (uint32_t w = 0; w < t->ws_len; w++) k += t->ws[w].present;
    *out = NULL;
    *n = 0;
    if (k == 0) return KVO_OK;
    idx_worker *v = kvo_malloc(k * sizeof(*v));
    if (!v) return KVO_ENOMEM;
    k = 0;
    for (uint32_t w = 0; w < t->ws_len; w++)
        if (t->ws[w].present)
            v[k++] = (idx_worker){t->ws[w].worker_id, t->ws[w].dp_rank,
                                  t->ws[w].blocks};
    qsort(v, k, sizeof(*v), worker_cmp);
    *out = v;
    *n = k;
    return KVO_OK;
}

kvo_status idx_tree_dump(const idx_tree *t, idx_dump_fn fn, void *ctx) {
    kvo_status s = KVO_OK;
    uint8_t *seen = kvo_calloc(t->nd_len, 1);
    uint32_t *queue = kvo_malloc((size_t)t->nd_len * sizeof(uint32_t));
    if (!seen || !queue) {
        s = KVO_ENOMEM;
        goto done;
    }
    uint32_t head = 0, tail = 0;
    queue[tail++] = ROOT;
    seen[ROOT] = 1;
    wire_rblock blk;
    wire_revent ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = WIRE_R_STORED;
    ev.tier = WIRE_TIER_DEVICE;
    ev.n_blocks = 1;
    ev.blocks = &blk;
    uint64_t id = 0;
    while (head < tail) {
        uint32_t p = queue[head++];
        for (uint32_t e = t->nd[p].child; e != NIL; e = edge_next(t, e)) {
            uint32_t c = edge_child(t, e);
            ev.has_parent = p != ROOT;
            ev.parent_hash = p != ROOT ? t->nd[p].block_hash : 0;
            blk.block_hash = t->nd[c].block_hash;
            blk.tokens_hash = edge_key(t, e);
            uint32_t ws = t->nd[c].wset;
            uint32_t one = ws, cnt = ws == NIL ? 0 : 1;
            const uint32_t *items = &one;
            if (ws != NIL && (ws & TAG)) {
                items = &t->sp[(ws & ~TAG) + 1];
                cnt = set_count(&t->sp[ws & ~TAG]);
            }
            for (uint32_t i = 0; i < cnt; i++) {
                ev.worker_id = t->ws[items[i]].worker_id;
                ev.dp_rank = t->ws[items[i]].dp_rank;
                ev.event_id = id++;
                if ((s = fn(ctx, &ev)) != KVO_OK) goto done;
            }
            if (!seen[c]) {
                seen[c] = 1;
                queue[tail++] = c;
            }
        }
    }
done:
    kvo_free(seen);
    kvo_free(queue);
    return s;
}

/* ======================================================================== */
/* Invariant walker                                                          */
/* ======================================================================== */

#define FAIL(...)                                                             \
    do {                                                                      \
        snprintf(msg, msgsz, __VA_ARGS__);                                    \
        s = KVO_ESTATE;                                                       \
        goto done;                                                            \
    } while (0)

static bool live(const idx_tree *t, uint32_t n) {
    return n < t->nd_len && t->nd[n].parent != DEAD;
}

static uint64_t refs_of(const idx_tree *t, uint32_t n) {
    uint64_t r = t->refs[n];
    if (r == 255) {
        uint32_t i = ov_find(t, n);
        if (i < t->ov_len && t->ov[i].node == n) r += t->ov[i].extra;
    }
    return r;
}

/* Structure of a table: tags agree with keys, keys sit in one of their
 * two buckets, spill counts are right. */
static bool tab_sane(const idx_tree *t, const tab *r, int kind, char *msg,
                     size_t msgsz, const char *name) {
    uint32_t used = 0, n = r->nb * BW;
    uint32_t *spill = kvo_calloc(r->nb ? r->nb : 1, sizeof(uint32_t));
    bool ok = false;
    if (!spill) {
        snprintf(msg, msgsz, "out of memory");
        return false;
    }
    for (uint32_t i = 0; i < n + r->nstash; i++) {
        uint32_t v = pos_ref(r, i);
        if (!v) {
            if (pos_tag(r, i)) {
                snprintf(msg, msgsz, "%s[%u]: empty slot with a tag", name, i);
                goto done;
            }
            continue;
        }
        used++;
        uint32_t tag = pos_tag(r, i);
        uint64_t h = ref_hash(t, kind, v);
        if (tag != (uint32_t)(h >> 32)) {
            snprintf(msg, msgsz, "%s[%u]: tag %08x, key hashes to %08x", name,
                     i, tag, (uint32_t)(h >> 32));
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
        if (r->spill[b] != 255 && r->spill[b] != spill[b]) {
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

kvo_status idx_tree_check(const idx_tree *t, uint64_t *unreachable,
                          char *msg, size_t msgsz) {
    kvo_status s = KVO_OK;
    uint32_t N = t->nd_len;
    uint64_t *want = kvo_calloc(N, sizeof(uint64_t)); /* expected refs */
    uint32_t *prim = kvo_calloc(N, sizeof(uint32_t)); /* primary edges seen */
    uint64_t *per_slot = kvo_calloc(t->ws_len + 1, sizeof(uint64_t));
    uint32_t *queue = kvo_malloc((size_t)(N + 1) * sizeof(uint32_t));
    uint8_t *seen = kvo_calloc(N, 1);
    if (!want || !prim || !per_slot || !queue || !seen) {
        s = KVO_ENOMEM;
        snprintf(msg, msgsz, "out of memory");
        goto done;
    }
    if (t->dying != NIL) FAIL("dying stack not empty");
    if (t->nd[ROOT].parent != NIL || t->nd[ROOT].wset != NIL)
        FAIL("root has a parent or workers");

    /* I8: free nodes */
    uint32_t nfree = 0;
    for (uint32_t n = t->nd_free; n != NIL; n = t->nd[n].next) {
        if (n >= N || t->nd[n].parent != DEAD) FAIL("free list holds node %u", n);
        if (++nfree > N) FAIL("free list loops");
    }
    uint32_t nlive = 0;
    for (uint32_t n = 1; n < N; n++) nlive += t->nd[n].parent != DEAD;
    if (nlive != t->nd_live || nlive + nfree + 1 != N)
        FAIL("node counts: %u live (%u counted), %u free, %u slab", t->nd_live,
             nlive, nfree, N);
    uint32_t eafree = 0, lafree = 0;
    for (uint32_t a = t->ea_free; a != NIL; a = t->ea[a].next) {
        if (a >= t->ea_len || t->ea[a].parent != DEAD) FAIL("ea free list");
        if (++eafree > t->ea_len) FAIL("ea free list loops");
    }
    for (uint32_t a = t->la_free; a != NIL; a = t->la[a].node) {
        if (a >= t->la_len || t->la[a].slot != NIL) FAIL("la free list");
        if (++lafree > t->la_len) FAIL("la free list loops");
    }
    if (eafree + t->ea_live != t->ea_len || lafree + t->la_live != t->la_len)
        FAIL("alias pool counts");

    /* I6 + set pool */
    uint32_t sets = 0;
    uint64_t held = 0;
    for (uint32_t n = 1; n < N; n++) {
        if (!live(t, n)) continue;
        uint32_t ws = t->nd[n].wset;
        if (ws == NIL) continue;
        held++;
        if (!(ws & TAG)) {
            if (ws >= t->ws_len) FAIL("node %u: bad slot %u", n, ws);
            continue;
        }
        uint32_t off = ws & ~TAG;
        if (off >= t->sp_len) FAIL("node %u: set offset %u", n, off);
        const uint32_t *st = &t->sp[off];
        uint32_t cnt = set_count(st), cls = set_class(st);
        if (cls >= SET_CLASSES || off + (4u << cls) > t->sp_len ||
            cnt > class_items(cls) || cnt < 2)
            FAIL("node %u: set header %08x", n, st[0]);
        for (uint32_t i = 0; i < cnt; i++) {
            if (st[1 + i] >= t->ws_len) FAIL("node %u: set slot", n);
            if (i && st[i] >= st[1 + i]) FAIL("node %u: set not sorted", n);
        }
        sets++;
    }
    if (sets != t->sp_live) FAIL("%u sets in use, %u counted", t->sp_live, sets);
    if (held != t->held)
        FAIL("%llu nodes held, %llu counted", (unsigned long long)t->held,
             (unsigned long long)held);

    /* I1, I2: child lists */
    uint32_t in_table = 0;
    for (uint32_t p = 0; p < N; p++) {
        if (!live(t, p)) continue;
        uint32_t len = 0;
        for (uint32_t e = t->nd[p].child; e != NIL; e = edge_next(t, e)) {
            if (++len > N + t->ea_len) FAIL("node %u: child list loops", p);
            uint32_t c;
            if (e & TAG) {
                uint32_t a = e & ~TAG;
                if (a >= t->ea_len || t->ea[a].parent != p)
                    FAIL("node %u: alias edge %u", p, a);
                c = t->ea[a].child;
                if (!live(t, c)) FAIL("alias edge %u to dead node %u", a, c);
                want[c]++;
            } else {
                c = e;
                if (!live(t, c) || t->nd[c].parent != p)
                    FAIL("node %u: child %u has parent %u", p, c,
                         c < N ? t->nd[c].parent : 0);
                prim[c]++;
            }
        }
        for (uint32_t e = t->nd[p].child; e != NIL; e = edge_next(t, e)) {
            uint32_t pos = edge_find(t, p, edge_key(t, e));
            if (len >= 2 && (pos == NIL || ref_at(&t->edges, pos) != e))
                FAIL("node %u: edge %016llx not hashed (or key repeated)", p,
                     (unsigned long long)edge_key(t, e));
            if (len == 1 && pos != NIL)
                FAIL("node %u: lone edge in the table", p);
        }
        if (len >= 2) in_table += len;
    }
    if (in_table != t->edges.len)
        FAIL("edge table holds %u, lists %u", t->edges.len, in_table);
    for (uint32_t n = 1; n < N; n++) {
        if (!live(t, n)) continue;
        if (t->nd[n].parent != NIL && prim[n] != 1)
            FAIL("node %u listed %u times under its parent", n, prim[n]);
    }
    uint32_t ealive = 0;
    for (uint32_t a = 0; a < t->ea_len; a++) ealive += t->ea[a].parent != DEAD;
    if (ealive != t->ea_live) FAIL("alias edges: %u live, %u counted", t->ea_live, ealive);

    /* I3: lookup */
    if (!tab_sane(t, &t->edges, K_EDGE, msg, msgsz, "edges")) {
        s = KVO_ESTATE;
        goto done;
    }
    if (!tab_sane(t, &t->look, K_LOOK, msg, msgsz, "look")) {
        s = KVO_ESTATE;
        goto done;
    }
    uint32_t lalive = 0;
    for (uint32_t i = 0; i < t->look.nb * BW + t->look.nstash; i++) {
        if (!pos_ref(&t->look, i)) continue;
        uint32_t v = ref_at(&t->look, i), n, w;
        uint64_t bh;
        if (v & TAG) {
            uint32_t a = v & ~TAG;
            if (a >= t->la_len || t->la[a].slot == NIL) FAIL("look[%u]: free alias", i);
            lalive++;
            n = t->la[a].node;
            w = t->la[a].slot;
            bh = t->la[a].block_hash;
        } else {
            n = v;
            if (!live(t, n)) FAIL("look[%u]: dead node %u", i, n);
            w = t->nd[n].wset;
            bh = t->nd[n].block_hash;
            if (w == NIL || (w & TAG)) FAIL("look[%u]: inline entry, node %u has set %08x", i, n, w);
        }
        if (!live(t, n)) FAIL("look[%u]: names dead node %u", i, n);
        if (w >= t->ws_len) FAIL("look[%u]: slot %u", i, w);
        if (look_find(t, w, bh) != i) FAIL("look[%u]: key repeated or unreachable", i);
        want[n]++;
        per_slot[w]++;
    }
    if (lalive != t->la_live) FAIL("lookup aliases: %u live, %u in table", t->la_live, lalive);
    uint64_t pairs = 0;
    for (uint32_t w = 0; w < t->ws_len; w++) {
        if (per_slot[w] != t->ws[w].blocks)
            FAIL("slot %u: %llu entries, blocks %llu", w,
                 (unsigned long long)per_slot[w],
                 (unsigned long long)t->ws[w].blocks);
        if (!t->ws[w].present && t->ws[w].blocks) FAIL("absent slot %u holds blocks", w);
        if (slot_find(t, t->ws[w].worker_id, t->ws[w].dp_rank) != w)
            FAIL("slot %u not in the worker map", w);
        pairs += per_slot[w];
    }
    if (pairs != t->pairs) FAIL("pairs %llu, counted %llu", (unsigned long long)t->pairs, (unsigned long long)pairs);

    /* I4, I5 */
    for (uint32_t i = 0; i < t->ov_len; i++)
        if ((i && t->ov[i - 1].node >= t->ov[i].node) || !t->ov[i].extra ||
            t->ov[i].node >= N || t->refs[t->ov[i].node] != 255)
            FAIL("overflow entry %u", i);
    for (uint32_t n = 1; n < N; n++) {
        if (!live(t, n)) continue;
        if (refs_of(t, n) != want[n])
            FAIL("node %u: refs %llu, counted %llu", n,
                 (unsigned long long)refs_of(t, n), (unsigned long long)want[n]);
        if (t->nd[n].parent == NIL && want[n] == 0) FAIL("node %u: garbage left alive", n);
    }

    /* Reachability: from the root and from every lookup entry. */
    uint32_t head = 0, tail = 0;
    queue[tail++] = ROOT;
    seen[ROOT] = 1;
    for (uint32_t i = 0; i < t->look.nb * BW + t->look.nstash; i++) {
        if (!pos_ref(&t->look, i)) continue;
        uint32_t n = look_node(t, ref_at(&t->look, i));
        if (!seen[n]) {
            seen[n] = 1;
            queue[tail++] = n;
        }
    }
    while (head < tail) {
        uint32_t p = queue[head++];
        for (uint32_t e = t->nd[p].child; e != NIL; e = edge_next(t, e)) {
            uint32_t c = edge_child(t, e);
            if (!seen[c]) {
                seen[c] = 1;
                queue[tail++] = c;
            }
        }
    }
    if (unreachable) *unreachable = nlive + 1 - tail;
done:
    kvo_free(want);
    kvo_free(prim);
    kvo_free(per_slot);
    kvo_free(queue);
    kvo_free(seen);
    return s;
}
