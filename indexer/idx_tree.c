/* idx_tree.c -- the radix index of DESIGN §7 as a pure data structure, with
 * the semantics of Dynamo's RadixTree (lib/kv-router/src/radix_tree.rs).
 * No sockets, clocks, logging or I/O in here.
 *
 * What a path means
 * -----------------
 * Edges are keyed by tokens_hash (the router hash of one block's tokens). The
 * node reached from the root by the keys h0, h1, ..., hd-1 stands for "the
 * first d blocks of a prompt hash to h0..hd-1". Each node holds the set of
 * workers (worker slots: one per (worker_id, dp_rank, storage tier)) that
 * hold that block,
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
 * Storage tiers
 * -------------
 * Each tier a rank publishes (device, then host_pinned, disk, external) is
 * a slot of its own in the same tree: an offloaded block joins the very
 * node its device copy was stored at (same parent, same tokens_hash), its
 * parent found in the slot's own tier or, failing that, in the tiers above
 * (the parent of a block offloaded from the GPU is usually still there).
 * The device walk scores device slots only; query_lower then extends each
 * rank's run tier by tier along the same path. A node stays under its
 * parent while any tier of any rank holds it, so an engine that offloads a
 * block before it frees the GPU copy keeps the chain whole. What a detach
 * still cuts (an engine reset empties the GPU, the CPU keeps its copies)
 * is relinked when its parent's block comes back ("Orphans" below), and a
 * store whose block another tier of the rank holds joins that node
 * (tier_node).
 *
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
 *   tok[], blk[], meta[]  a node is 20 bytes at one u32 index, in three
 *            slabs; 0 is the root. A query's walk along a chain streams
 *            tok[] and meta[] (12 bytes a block). Slabs (idx_int.h): each
 *            is one address range reserved whole at the first growth and
 *            made usable as it fills, so growth copies nothing, leaves no
 *            moved pages behind, and a record is one multiply-add away;
 *            they grow by huge pages from 2 MiB on (meta[] from 4 MiB on,
 *            META_SMALL below).
 *
 *       tok  0             8   blk  0            8   meta  0      4
 *            +-------------+        +------------+         +------+
 *            | tokens_hash |        | block_hash |         | meta |
 *            +-------------+        +------------+         +------+
 *
 *     The meta word holds the node's fields in place ("lean": the parent
 *     is none or n - 1, the first child none or n + 1, no next sibling, at
 *     most one worker, at most 15 references), or all but the parent and
 *     next sibling ("far": those are in a farrec in fars[], which the table
 *     `far` finds by node), or names a fat record in fats[] that holds
 *     them all (idx_int.h draws the word). A chain stored by one worker in
 *     one event is lean all along, 20 bytes a block; where a prompt
 *     branches off the node is far (12 bytes more, and a slot of `far`),
 *     so a query, which reads a node's worker and child only, never reads
 *     a record there; nodes held by two workers or more are fat.
 *     parent, tokens_hash  the node's primary edge (parent NIL: none; DEAD:
 *                          the node is free or being freed, and then
 *                          tok[] holds the dying stack's link)
 *     wset    NIL: no worker; < 2^31: the single worker slot; TAG|off: a
 *             sorted array of 2+ slots in the set pool sp[] (header word =
 *             class << 24 | count)
 *     child   first edge of this node's child list
 *     next    the following edge in the parent's child list (primary edge)
 *     refs    lookup entries + alias edges pointing at the node
 *   free[]   the free node indexes, a bitmap in three levels of slabs; a
 *            new node takes the lowest ("Free nodes" below)
 *
 *   An edge is named by a u32 "ref": a node index n is n's primary edge;
 *   TAG|i is ea[i], an alias edge {tokens_hash, parent, child, next} for a
 *   node's second (third...) parent. A lookup entry is named the same way:
 *   in slot w's table, n is the inline entry (w, n.block_hash) -> n; TAG|i
 *   is la[i] = {block_hash, slot, node}, for an entry whose block_hash is
 *   not its node's (inconsistent streams: a block stored at two nodes).
 *
 *   edges    table (parent, tokens_hash) -> edge ref, holding the edges of
 *            parents with two children or more. A lone child is found
 *            through parent.child, so chains cost no table space. Its tags
 *            tell parents apart (edge_hash), so a probe compares the
 *            tokens_hash only and never reads a far node's record.
 *   far      table node -> its farrec, for far nodes.
 *   ws[w].look  table block_hash -> lookup ref, one per worker slot (as
 *            Dynamo keeps one map per worker): listing or clearing a worker
 *            costs O(its blocks). Keys are still hashed with the slot.
 *   wmap     (worker_id, dp_rank) -> slot. Slots are never reused.
 *
 *   The tables are bucketized cuckoo hash tables of u32 refs (idx_table.c
 *   draws them): an entry is a tag (the top half of the key's hash) and a
 *   ref, and the key itself is read from the node or alias record the ref
 *   names. A lean block costs 20 bytes of slab plus one lookup slot (8
 *   bytes / load, load 0.47 to 0.94): 28.5 to 37 bytes per (block,
 *   worker), plus at most 2 MiB per huge-page slab of tail (W1: 31.5
 *   bytes a pair at 0.8 M pairs, 31.7 at 3.2 M and 12.6 M).
 *
 * Invariants (idx_tree_check, in idx_verify.c, verifies all of them)
 * ----------
 *  I1 a live node with parent != NIL appears exactly once, as itself, in
 *     its parent's child list; alias edges appear once in ea[].parent's list.
 *  I2 keys are unique within a child list; the edges of a list of 2+ are all
 *     in `edges`, those of a list of 1 are not.
 *  I3 an inline lookup ref n in slot w's table sits at key (w,
 *     blk[n]); every entry of ws[w].look is w's; every lookup key is unique;
 *     per-slot entry counts equal ws[].blocks and their sum equals pairs.
 *  I4 refs of n = lookup entries naming n + alias edges to n.
 *  I5 a live node other than the root has parent != NIL or refs > 0 (else it
 *     would have been freed); nothing is left on the dying stack.
 *  I6 worker sets are sorted, duplicate-free, of 2+ valid slots.
 *  I7 table tags match their entries' keys, keys sit in one of their two
 *     buckets (or the stash; during a growth, old buckets not moved yet),
 *     spill counts are exact (or stuck at 255; old ones an upper bound).
 *  I8 free nodes are exactly the bits of free[0], each level's bits are its
 *     lower level's non-zero words, no free node lies below nd_low; free
 *     alias records are exactly those on their free lists.
 *  I9 a fat record belongs to one live node, a farrec to one far node (the
 *     table `far` has exactly the far nodes, and a far node's links do not
 *     fit its word); free records are exactly those on their free lists;
 *     lean meta words decode to valid fields.
 */
#define IDX_TREE_LAYOUT /* idx_int.h: the layout's types, constants, probes */
#include "idx_int.h"

#include <stdlib.h>
#include <string.h>

#define MAX_INDEX 0x7FFFFF00u /* nodes, alias records, set-pool words */
#define MAX_SLOTS 0x00FFFFF0u /* worker slots: about 2^24 workers */
_Static_assert(MAX_SLOTS < M_WSET, "a slot fits in a lean meta word");
#define POOL_FIRST_CAP 64     /* entries of a pool's first allocation */
#define SLOTS_FIRST_CAP 16    /* worker slots allocated at first */
#define WMAP_FIRST_CAP 32     /* worker map entries at first (power of 2) */
#define SORT_INSERTION_MAX 16 /* scores sorted by insertion up to this many */
/* The small regions of meta[], fats[] and fars[] (idx_int.h, slab): while
 * a tree is small a huge page's unused tail (up to 2 MiB: 2.6 bytes a pair
 * at W1's 0.8 M pairs) costs more than the faults it saves (~11 ms here
 * for 4 MiB of small pages); once a slab grows past its region, the region
 * turns into huge pages, because random reads through small pages miss
 * the TLB (W1x16 cold hit p99 6.9 us with the fat records a query read on
 * small pages, 1.8 on huge ones). meta[], read along chains, stays small
 * for a million nodes; the records, read at random, for 2 MiB. */
#define META_SMALL ((size_t)4 << 20)
#define RECORDS_SMALL ((size_t)2 << 20)

/* ======================================================================== */
/* Finding children and lookup slots (the probes are in idx_int.h)           */
/* ======================================================================== */

/* Bring in the lookup slot of (w, bh): a later block's, while this one is
 * worked on, AHEAD blocks ahead; and AHEAD / 2 blocks ahead, once its
 * first bucket and spill count are in, its second bucket if a find or an
 * insert may have to look there (look_prefetch_second: at a load of 3/4,
 * a fifth to two thirds of first buckets have spilled, and a miss there
 * cost a find a wait for memory). An event of up to AHEAD blocks thus asks
 * for all its buckets at once, before it works on the first: the more
 * misses in flight, the better, once a block's own work is short (W1x4
 * warm apply, alternating runs: 33.1 M/s at 16 ahead, 36.9 at 32, 38.9
 * at 64, 40.3 at 128; W1x16: 23.5, 24.8, 26.8, 28.0). The first AHEAD / 2
 * blocks take their second stage right after the first stage of all:
 * without it, W1x4 cold remove was 16.7 M/s against 24.9 with it. */
#define AHEAD 128
static inline __attribute__((always_inline)) uint64_t
look_prefetch(const idx_tree *t, uint32_t w, uint64_t bh) {
    uint64_t h = mix(bh, w);
    tab_prefetch(&t->ws[w].look, h);
    return h;
}

static inline __attribute__((always_inline)) void
look_prefetch_second(const idx_tree *t, uint32_t w, uint64_t h) {
    tab_prefetch_second(&t->ws[w].look, h);
}

/* The child of p under tokens_hash th, or NIL. The first edge of p's list
 * is looked at first: when its key is th it is the one (keys are unique in
 * a list, I2), found without the table or the side records; when it is a
 * lean node that is not far, it has no sibling. Otherwise the table has
 * p's edges if p has two or more (and none of p's when p has one). */
static inline uint32_t child_find(const idx_tree *t, uint32_t p, uint64_t th) {
    uint32_t e = nd_child(t, p);
    if (e == NIL) return NIL;
    if (!(e & TAG)) {
        if (TOK(t, e) == th) return e;
        uint32_t m = META(t, e); /* lean, not far: e has no sibling */
        if (!(m & M_FAT) && !meta_far(m)) return NIL;
    } else {
        const ealias *a = &t->ea[e & ~TAG];
        if (a->tokens_hash == th) return a->child;
        if (a->next == NIL) return NIL;
    }
    uint32_t pos = edge_find(t, p, th);
    return pos == NIL ? NIL : edge_child(t, tab_ref(&t->edges, pos));
}

/* ======================================================================== */
/* Pools                                                                     */
/* ======================================================================== */

static kvo_status grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return KVO_OK;
    if (need > MAX_INDEX) return KVO_ETOOBIG;
    uint64_t n = *cap ? *cap : POOL_FIRST_CAP;
    while (n < need) n = n * 3 / 2 + 1;
    if (n > MAX_INDEX) n = MAX_INDEX;
    void *q = kvo_realloc(*p, (size_t)n * elem);
    if (!q) return KVO_ENOMEM;
    *p = q;
    *cap = (uint32_t)n;
    return KVO_OK;
}

/* ---- Free nodes -----------------------------------------------------------
 * A free node index is a set bit of free[0]; a bit of free[k + 1] says that
 * the word of free[k] it stands for is not zero:
 *
 *   free[2]  1 bit per 2^18 nodes    scanned from nd_low's word on
 *   free[1]  1 bit per 2^12 nodes    \  one word each, found by the
 *   free[0]  1 bit per node          /   lowest bit of the level above
 *
 * A new node takes the lowest free index. Nodes made one after the other
 * (a stored event's chain) then sit in address order even when they reuse
 * freed ones, so a query walks them as a run (the first child is cur + 1),
 * and a tree emptied and filled again lays out as it did when new. A LIFO
 * free list handed nodes back in the order the detaches freed them: one
 * prefix node of every prompt first, and a warm W1x4 hit p99 of 9.8 us
 * against 1.4. The levels are slabs, zero when mapped; they cover nd_cap. */

static void free_put(idx_tree *t, uint32_t n) {
    for (int k = 0; k < FREE_LEVELS; k++) {
        uint64_t *w = free_word(t, k, n >> 6 * (k + 1));
        uint64_t was = *w;
        *w = was | 1ull << (n >> 6 * k & 63);
        if (was) break; /* the levels above know this word already */
    }
    if (n < t->nd_low) t->nd_low = n;
}

/* The free[0] word of the lowest free index; there must be one. The word
 * of nd_low, when it is not zero (no free index lies below nd_low), else
 * found from the top level down. */
static uint32_t free_lowest_word(const idx_tree *t) {
    uint32_t i = t->nd_low >> 6;
    if (*free_word(t, 0, i)) return i;
    i = t->nd_low >> 6 * FREE_LEVELS;
    while (!*free_word(t, FREE_LEVELS - 1, i)) i++;
    for (int k = FREE_LEVELS - 1; k > 0; k--)
        i = i << 6 | (uint32_t)__builtin_ctzll(*free_word(t, k, i));
    return i;
}

/* Take the lowest free index; there must be one. */
static uint32_t free_take(idx_tree *t) {
    uint32_t i = free_lowest_word(t);
    uint64_t *w = free_word(t, 0, i);
    uint32_t n = i << 6 | (uint32_t)__builtin_ctzll(*w);
    *w &= *w - 1;
    for (int k = 1; k < FREE_LEVELS && !*w; k++) { /* emptied: tell above */
        w = free_word(t, k, n >> 6 * (k + 1));
        *w &= ~(1ull << (n >> 6 * k & 63));
    }
    t->nd_low = n + 1;
    return n;
}

/* Is a node free? (Nodes being freed still count as live.) */
static inline bool nodes_free(const idx_tree *t) {
    return t->nd_live + 1 < t->nd_len;
}

static kvo_status nodes_reserve(idx_tree *t, uint32_t more) {
    if (nodes_free(t) && more <= 1) return KVO_OK;
    if (more > MAX_INDEX - t->nd_len) return KVO_ETOOBIG;
    uint32_t need = t->nd_len + more;
    if (need <= t->nd_cap) return KVO_OK;
    kvo_status s = idx_slab_reserve(&t->tok, need, MAX_INDEX, 8);
    if (s == KVO_OK) s = idx_slab_reserve(&t->blk, need, MAX_INDEX, 8);
    if (s == KVO_OK) s = idx_slab_reserve(&t->meta, need, MAX_INDEX, 4);
    if (s != KVO_OK) return s; /* one may have grown already: harmless */
    uint32_t cap = t->tok.cap < t->blk.cap ? t->tok.cap : t->blk.cap;
    if (t->meta.cap < cap) cap = t->meta.cap;
    for (int k = 0; k < FREE_LEVELS && s == KVO_OK; k++)
        s = idx_slab_reserve(&t->free[k], free_words(cap, k),
                             free_words(MAX_INDEX, k), sizeof(uint64_t));
    if (s == KVO_OK) t->nd_cap = cap;
    return s;
}

static uint32_t node_new(idx_tree *t, uint64_t bh, uint64_t th) {
    uint32_t n = nodes_free(t) ? free_take(t) : t->nd_len++;
    TOK(t, n) = th;
    BLK(t, n) = bh;
    META(t, n) = M_NEW;
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

/* ---- Fat and far records, and the fields' setters ----------------------- */

/* Room for `more` nodes to turn fat or far without failing. */
static kvo_status records_reserve(idx_tree *t, uint32_t more) {
    if (more > MAX_INDEX - t->fat_len || more > MAX_INDEX - t->far_len)
        return KVO_ETOOBIG;
    kvo_status s = idx_tab_reserve(&t->far, more);
    if (s == KVO_OK && t->fats.cap - t->fat_live < more)
        s = idx_slab_reserve(&t->fats, t->fat_len + more, MAX_INDEX,
                             sizeof(fat));
    if (s == KVO_OK && t->fars.cap - t->far.len < more)
        s = idx_slab_reserve(&t->fars, t->far_len + more, MAX_INDEX,
                             sizeof(farrec));
    return s;
}

static uint32_t fat_take(idx_tree *t) {
    uint32_t i = t->fat_free;
    if (i != NIL)
        t->fat_free = FAT(t, i).next;
    else
        i = t->fat_len++;
    t->fat_live++;
    return i;
}

static void fat_put(idx_tree *t, uint32_t i) {
    FAT(t, i).wset = DEAD;
    FAT(t, i).next = t->fat_free;
    t->fat_free = i;
    t->fat_live--;
}

/* A far node's record leaves the table and goes back to the free list;
 * returns a copy of what it held. */
static farrec far_drop(idx_tree *t, uint32_t n) {
    uint32_t pos = far_pos(t, n), i = tab_ref(&t->far, pos) - 1;
    farrec r = FAR(t, i);
    idx_tab_del(&t->far, pos);
    FAR(t, i) = (farrec){NIL, NIL, t->far_free};
    t->far_free = i;
    return r;
}

/* n's fat record, made from its lean (or far) fields when it has none
 * (reserved: records_reserve). */
static __attribute__((noinline)) fat *nd_fat(idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (m & M_FAT) return &FAT(t, m & ~M_FAT);
    farrec links = {n, nd_parent(t, n), NIL};
    if (meta_far(m)) links = far_drop(t, n);
    uint32_t i = fat_take(t);
    FAT(t, i) = (fat){links.parent, nd_child(t, n), links.next, nd_wset(t, n),
                      nd_refs(t, n)};
    META(t, n) = M_FAT | i;
    return &FAT(t, i);
}

/* A lean n with links its word cannot hold turns far (reserved). */
static __attribute__((noinline)) void nd_far(idx_tree *t, uint32_t n,
                                             uint32_t parent, uint32_t next) {
    uint32_t i = t->far_free;
    if (i != NIL)
        t->far_free = FAR(t, i).next;
    else
        i = t->far_len++;
    FAR(t, i) = (farrec){n, parent, next};
    idx_tab_put(&t->far, tab_hash_tag(far_hash(n)), i + 1);
    META(t, n) = (META(t, n) & ~M_PARENT) | P_FAR << M_PARENT_SHIFT;
}

/* A freed node's record goes back; its meta says free. */
static void nd_release(idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (m & M_FAT)
        fat_put(t, m & ~M_FAT);
    else if (meta_far(m))
        far_drop(t, n);
    META(t, n) = P_DEAD << M_PARENT_SHIFT | M_WSET;
}

/* The setters: in the meta word when the value fits there, else in the
 * node's far or fat record. */

/* n's parent and next sibling (its primary edge's links) are p and next:
 * in the word when they fit (no next; the parent none, n - 1 or DEAD: the
 * kind k), else (k = P_FAR) in its far record, made or dropped as they
 * stop or start fitting (a detach cuts a far node, or it is freed). */
static __attribute__((noinline)) void
set_links_slow(idx_tree *t, uint32_t n, uint32_t p, uint32_t next, uint32_t k) {
    uint32_t m = META(t, n);
    if (m & M_FAT) {
        FAT(t, m & ~M_FAT).parent = p;
        FAT(t, m & ~M_FAT).next = next;
    } else if (k == P_FAR && meta_far(m)) {
        FAR(t, far_index(t, n)) = (farrec){n, p, next};
    } else if (k == P_FAR) {
        nd_far(t, n, p, next);
    } else { /* far until now */
        far_drop(t, n);
        META(t, n) = (m & ~M_PARENT) | k << M_PARENT_SHIFT;
    }
}

/* The common case, a lean node whose links fit (a chain node cut or freed
 * on the remove path), changes the word without a call. */
static inline void set_links(idx_tree *t, uint32_t n, uint32_t p,
                             uint32_t next) {
    uint32_t m = META(t, n);
    uint32_t k = next != NIL  ? P_FAR
                 : p == NIL   ? P_NIL
                 : p == DEAD  ? P_DEAD
                 : p == n - 1 ? P_PREV
                              : P_FAR;
    if (k != P_FAR && !(m & M_FAT) && !meta_far(m))
        META(t, n) = (m & ~M_PARENT) | k << M_PARENT_SHIFT;
    else
        set_links_slow(t, n, p, next, k);
}

static inline void set_child(idx_tree *t, uint32_t n, uint32_t e) {
    uint32_t m = META(t, n);
    if (!(m & M_FAT) && (e == NIL || e == n + 1)) {
        META(t, n) = e == NIL ? m & ~M_CHILD : m | M_CHILD;
        return;
    }
    nd_fat(t, n)->child = e;
}

static inline void set_wset(idx_tree *t, uint32_t n, uint32_t ws) {
    uint32_t m = META(t, n);
    if (!(m & M_FAT) && (ws == NIL || ws < M_WSET)) {
        META(t, n) = (m & ~M_WSET) | (ws == NIL ? M_WSET : ws);
        return;
    }
    nd_fat(t, n)->wset = ws;
}

#define REF_ONE (1u << M_REFS_SHIFT)

/* A count past M_REFS_MAX turns the node fat. */
static inline void ref_inc(idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (!(m & M_FAT) && (m & M_REFS) != M_REFS)
        META(t, n) = m + REF_ONE;
    else
        nd_fat(t, n)->refs++;
}

static inline void ref_dec(idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (!(m & M_FAT))
        META(t, n) = m - REF_ONE;
    else
        FAT(t, m & ~M_FAT).refs--;
}

/* ---- Worker sets -------------------------------------------------------- */

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
        t->sp_len += class_words(cls);
    }
    t->sp[off] = cls << SET_CLASS_SHIFT;
    t->sp_live++;
    return off;
}

static void set_release(idx_tree *t, uint32_t off) {
    uint32_t cls = set_class(&t->sp[off]);
    t->sp[off] = cls << SET_CLASS_SHIFT;
    t->sp[off + 1] = t->sp_free[cls];
    t->sp_free[cls] = off;
    t->sp_live--;
}

/* Room for one set to grow by one class (sets hold at most every slot). */
static inline kvo_status sets_reserve(idx_tree *t) {
    uint32_t words = t->sp_step; /* class_words(class_for(ws_len + 1)) */
    if (t->sp_cap - t->sp_len >= words) return KVO_OK;
    if (words > MAX_INDEX - t->sp_len) return KVO_ETOOBIG;
    return grow((void **)&t->sp, &t->sp_cap, t->sp_len + words,
                sizeof(uint32_t));
}

static uint32_t lower_bound(const uint32_t *a, uint32_t n, uint32_t w) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (a[mid] < w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void wset_add(idx_tree *t, uint32_t n, uint32_t w) {
    uint32_t ws = nd_wset(t, n);
    if (ws == NIL) {
        set_wset(t, n, w);
        t->held++;
        return;
    }
    if (!(ws & TAG)) {
        if (ws == w) return;
        uint32_t off = set_new(t, 0);
        uint32_t *s = &t->sp[off];
        s[0] |= 2;
        s[1] = ws < w ? ws : w;
        s[2] = ws < w ? w : ws;
        set_wset(t, n, TAG | off);
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
        s[0] = cls << SET_CLASS_SHIFT | (cnt + 1);
        return;
    }
    uint32_t noff = set_new(t, cls + 1); /* reserved: sp does not move */
    uint32_t *d = &t->sp[noff];
    memcpy(&d[1], &s[1], i * sizeof(uint32_t));
    d[1 + i] = w;
    memcpy(&d[2 + i], &s[1 + i], (cnt - i) * sizeof(uint32_t));
    d[0] = (cls + 1) << SET_CLASS_SHIFT | (cnt + 1);
    set_release(t, off);
    set_wset(t, n, TAG | noff);
}

/* Remove w from n's pooled set at off (no-op when absent). */
static void wset_del_pooled(idx_tree *t, uint32_t n, uint32_t w, uint32_t off) {
    uint32_t *s = &t->sp[off];
    uint32_t cnt = set_count(s), i = lower_bound(s + 1, cnt, w);
    if (i == cnt || s[1 + i] != w) return;
    memmove(&s[1 + i], &s[2 + i], (cnt - i - 1) * sizeof(uint32_t));
    cnt--;
    if (cnt == 1) {
        set_wset(t, n, s[1]);
        set_release(t, off);
    } else {
        s[0] = set_class(s) << SET_CLASS_SHIFT | cnt;
    }
}

/* Remove w from n's set (no-op when absent). */
static inline void wset_del(idx_tree *t, uint32_t n, uint32_t w) {
    uint32_t ws = nd_wset(t, n);
    if (ws == NIL) return;
    if (ws & TAG) {
        wset_del_pooled(t, n, w, ws & ~TAG);
    } else if (ws == w) {
        set_wset(t, n, NIL);
        t->held--;
    }
}

/* ======================================================================== */
/* Edges, detaching and freeing                                              */
/* ======================================================================== */

/* Add the edge (p, th) -> c (absent so far). It becomes c's primary edge when
 * c has none; otherwise an alias edge that holds a reference on c. (A
 * store's chain of new nodes does not come here: apply_store links each in
 * the words.) */
static void edge_add(idx_tree *t, uint32_t p, uint64_t th, uint32_t c) {
    uint32_t first = nd_child(t, p);
    bool was_single = first != NIL && edge_next(t, first) == NIL;
    uint32_t e;
    if (nd_parent(t, c) == NIL && c != p) {
        set_links(t, c, p, first);
        TOK(t, c) = th;
        e = c;
    } else {
        uint32_t a = ea_new(t);
        t->ea[a] = (ealias){th, p, c, first, 0};
        ref_inc(t, c);
        e = TAG | a;
    }
    set_child(t, p, e);
    if (was_single)
        idx_tab_put(&t->edges, tab_hash_tag(edge_hash(edge_key(t, first), p)),
                    first);
    if (first != NIL) idx_tab_put(&t->edges, tab_hash_tag(edge_hash(th, p)), e);
}

/* Queue n for release when nothing refers to it any more. */
static inline void maybe_free(idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (!(m & M_FAT) ? (m & (M_PARENT | M_REFS)) != 0
                     : nd_parent(t, n) != NIL || nd_refs(t, n) != 0)
        return;
    if (n == ROOT) return;
    set_links(t, n, DEAD, NIL); /* no parent: no next either */
    TOK(t, n) = t->dying;       /* the key of no edge now: the stack's link */
    t->dying = n;
}

static void orphan_add(idx_tree *t, uint64_t parent_bh, uint32_t c);

/* Drop every edge from p, whose child list begins with e (not NIL). */
static void detach_edges(idx_tree *t, uint32_t p, uint32_t e) {
    bool hashed = edge_next(t, e) != NIL;
    set_child(t, p, NIL);
    while (e != NIL) {
        uint32_t nx = edge_next(t, e);
        if (hashed) {
            uint32_t pos = edge_find(t, p, edge_key(t, e));
            idx_tab_del(&t->edges, pos);
        }
        uint32_t c;
        if (e & TAG) {
            c = t->ea[e & ~TAG].child;
            ea_release(t, e & ~TAG);
            ref_dec(t, c);
        } else {
            c = e;
            set_links(t, c, NIL, NIL);
            if (t->lower_slots) orphan_add(t, BLK(t, p), c);
        }
        maybe_free(t, c);
        e = nx;
    }
}

/* Drop every edge from p to its children (Dynamo: children.clear()). Half
 * the calls find none: that case costs no call. */
static inline void detach(idx_tree *t, uint32_t p) {
    uint32_t e = nd_child(t, p);
    if (e != NIL) detach_edges(t, p, e);
}

/* ---- Orphans ---------------------------------------------------------------
 * A node whose last holder leaves detaches its children (Dynamo). With
 * storage tiers that cuts offloaded blocks off: after an engine reset
 * empties the GPU and the CPU keeps its copies, every CPU block whose parent
 * was on the GPU only hangs under nothing, and when the GPU computes that
 * parent again the engine can load the block back while no query path
 * reaches it. So a cut child that a lower tier holds is remembered under
 * its parent's block_hash, and a store of that block relinks it (under its
 * tokens_hash, when that key is free there). A record is checked when used
 * (the node may have been relinked, freed or reused); the lists are swept
 * when they outgrow twice the tree's pairs (plus ORPHANS_SLACK). */
#define ORPHANS_SLACK 4096

/* Does a lower-tier slot hold node n? */
static bool lower_held(const idx_tree *t, uint32_t n) {
    uint32_t ws = nd_wset(t, n);
    if (ws == NIL) return false;
    if (!(ws & TAG)) return t->ws[ws].tier != WIRE_TIER_DEVICE;
    const uint32_t *s = &t->sp[ws & ~TAG];
    for (uint32_t i = 1; i <= set_count(s); i++)
        if (t->ws[s[i]].tier != WIRE_TIER_DEVICE) return true;
    return false;
}

/* Is the record still a detached live node with its block? */
static bool orphan_valid(const idx_tree *t, const orphan *o) {
    return o->node < t->nd_len && nd_parent(t, o->node) == NIL &&
           BLK(t, o->node) == o->block_hash && nd_refs(t, o->node);
}

/* Record i goes to the free list (it is in no list, or its list is gone). */
static void orphan_free(idx_tree *t, uint32_t i) {
    t->orph[i].node = NIL;
    t->orph[i].next = t->orph_free;
    t->orph_free = i;
}

/* A list's head value (1 + its first record; 0: empty) as an index. */
static uint32_t orphan_first(uint64_t head) {
    return head ? (uint32_t)(head - 1) : NIL;
}

/* Put record i at the head of its parent's list; false: out of memory. */
static bool orphan_link(idx_tree *t, uint32_t i) {
    bool added;
    uint64_t *head = kvo_map_put(&t->orphans, t->orph[i].parent_hash, &added);
    if (!head) return false;
    t->orph[i].next = orphan_first(*head);
    *head = (uint64_t)i + 1;
    t->orph_live++;
    return true;
}

/* Rebuild the lists from the records that are still valid; the others,
 * and the keys of emptied lists, go. */
static void orphan_sweep(idx_tree *t) {
    kvo_map_clear(&t->orphans);
    t->orph_free = NIL;
    t->orph_live = 0;
    for (uint32_t i = t->orph_len; i-- > 0;) {
        orphan *o = &t->orph[i];
        if (o->node == NIL || !orphan_valid(t, o) || !orphan_link(t, i))
            orphan_free(t, i);
    }
}

static void orphan_add(idx_tree *t, uint64_t parent_bh, uint32_t c) {
    if (!lower_held(t, c)) return;
    if (t->orph_live >= t->orph_sweep_at) {
        orphan_sweep(t);
        /* valid records can outnumber the pairs (a node cut, relinked by
         * tier_node, cut again is listed twice): never sweep in a loop */
        t->orph_sweep_at =
            2 * (t->orph_live > t->pairs ? t->orph_live : t->pairs) +
            ORPHANS_SLACK;
    }
    if (t->orph_free == NIL &&
        grow((void **)&t->orph, &t->orph_cap, t->orph_len + 1,
             sizeof(orphan)) != KVO_OK) {
        t->c.orphans_lost++; /* the block stays cut, as in Dynamo */
        return;
    }
    uint32_t i = t->orph_free;
    if (i != NIL)
        t->orph_free = t->orph[i].next;
    else
        i = t->orph_len++;
    t->orph[i] = (orphan){parent_bh, BLK(t, c), c, NIL};
    if (!orphan_link(t, i)) { /* out of memory: as above */
        orphan_free(t, i);
        t->c.orphans_lost++;
    }
}

/* Block bh lives at node n now: relink the orphans cut from it. */
static void orphan_relink(idx_tree *t, uint64_t bh, uint32_t n) {
    uint64_t *head = kvo_map_get(&t->orphans, bh);
    if (!head) return;
    uint32_t i = orphan_first(*head);
    kvo_map_del_at(&t->orphans, head);
    while (i != NIL) {
        const orphan *o = &t->orph[i];
        uint32_t nx = o->next, c = o->node;
        if (orphan_valid(t, o) && c != n &&
            child_find(t, n, TOK(t, c)) == NIL &&
            idx_tab_reserve(&t->edges, 2) == KVO_OK &&
            records_reserve(t, 2) == KVO_OK)
            edge_add(t, n, TOK(t, c), c);
        orphan_free(t, i);
        t->orph_live--;
        i = nx;
    }
}

/* Release every queued node; their children may follow. */
static void drain_dying(idx_tree *t) {
    while (t->dying != NIL) {
        uint32_t n = t->dying;
        t->dying = (uint32_t)TOK(t, n);
        detach(t, n);
        uint32_t ws = nd_wset(t, n);
        if (ws != NIL) t->held--;
        if (ws != NIL && (ws & TAG)) set_release(t, ws & ~TAG);
        nd_release(t, n);
        free_put(t, n);
        t->nd_live--;
    }
}

/* drain_dying, called only when a node is queued (after most blocks of a
 * store none is). */
static inline void drain(idx_tree *t) {
    if (t->dying != NIL) drain_dying(t);
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
    if (pos == FIND) pos = look_find_h(t, w, bh, h);
    bool inl = BLK(t, n) == bh;
    if (pos != NIL) {
        uint32_t v = tab_ref(&t->ws[w].look, pos), old = look_node(t, v);
        if (old == n) return NIL;
        if (v & TAG) {
            if (inl) {
                la_release(t, v & ~TAG);
                tab_ref_set(&t->ws[w].look, pos, n);
            } else {
                t->la[v & ~TAG].node = n;
            }
        } else {
            tab_ref_set(&t->ws[w].look, pos,
                        inl ? n : (TAG | la_new(t, bh, w, n)));
        }
        ref_inc(t, n);
        ref_dec(t, old);
        return old;
    }
    uint32_t v = inl ? n : (TAG | la_new(t, bh, w, n));
    idx_tab_put(&t->ws[w].look, tab_hash_tag(h), v);
    ref_inc(t, n);
    t->ws[w].blocks++;
    t->pairs++;
    return NIL;
}

/* Erase the lookup entry at pos; returns the node it named. */
static uint32_t look_erase(idx_tree *t, uint32_t w, uint32_t pos) {
    uint32_t v = tab_ref(&t->ws[w].look, pos), n = look_node(t, v);
    idx_tab_del(&t->ws[w].look, pos);
    if (v & TAG) la_release(t, v & ~TAG);
    ref_dec(t, n);
    t->ws[w].blocks--;
    t->pairs--;
    return n;
}

/* ======================================================================== */
/* Worker slots                                                              */
/* ======================================================================== */

static void wmap_insert(idx_tree *t, uint32_t s) {
    uint32_t i =
        wmap_home(t, t->ws[s].worker_id, t->ws[s].dp_rank, t->ws[s].tier);
    while (t->wmap[i] != NIL) i = (i + 1) & (t->wmap_cap - 1);
    t->wmap[i] = s;
}

/* The slot of (wid, rank, tier), created on first sight (Dynamo creates
 * the worker's lookup map for any event, even a rejected one). */
static kvo_status slot_get(idx_tree *t, uint64_t wid, uint32_t rank,
                           uint32_t tier, uint32_t *out) {
    uint32_t s = slot_find(t, wid, rank, tier);
    if (s != NIL) {
        t->ws[s].present = 1;
        *out = s;
        return KVO_OK;
    }
    if (t->ws_len >= MAX_SLOTS) return KVO_ETOOBIG;
    if (t->ws_len + 1 > t->ws_cap) {
        uint32_t cap = t->ws_cap ? t->ws_cap * 2 : SLOTS_FIRST_CAP;
        wslot *w = kvo_realloc(t->ws, cap * sizeof(wslot));
        if (!w) return KVO_ENOMEM;
        t->ws = w;
        uint32_t *a = kvo_realloc(t->act, cap * sizeof(uint32_t));
        if (!a) return KVO_ENOMEM;
        t->act = a;
        t->ws_cap = cap;
    }
    if ((t->ws_len + 1) * 2 > t->wmap_cap) {
        uint32_t cap = t->wmap_cap ? t->wmap_cap * 2 : WMAP_FIRST_CAP;
        uint32_t *m = kvo_malloc(cap * sizeof(uint32_t));
        if (!m) return KVO_ENOMEM;
        memset(m, 0xFF, cap * sizeof(uint32_t));
        kvo_free(t->wmap);
        t->wmap = m;
        t->wmap_cap = cap;
        for (uint32_t i = 0; i < t->ws_len; i++) wmap_insert(t, i);
    }
    s = t->ws_len++;
    t->sp_step = class_words(class_for(t->ws_len + 1));
    t->ws[s] = (wslot){
        .worker_id = wid, .dp_rank = rank, .present = 1, .tier = (uint8_t)tier};
    t->lower_slots += tier != WIRE_TIER_DEVICE;
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
    t->ea_free = t->la_free = t->fat_free = t->far_free = NIL;
    t->dying = t->orph_free = NIL;
    t->orph_sweep_at = ORPHANS_SLACK;
    kvo_map_init(&t->orphans);
    for (int i = 0; i < SET_CLASSES; i++) t->sp_free[i] = NIL;
    t->edges.by2 = t->far.by2 = true; /* a key per branch, not per block */
    t->meta.small = META_SMALL;
    t->fats.small = t->fars.small = RECORDS_SMALL;
    if (nodes_reserve(t, 1) != KVO_OK) {
        idx_tree_free(t);
        return KVO_ENOMEM;
    }
    TOK(t, ROOT) = BLK(t, ROOT) = 0;
    META(t, ROOT) = M_NEW;
    t->nd_len = 1;
    *out = t;
    return KVO_OK;
}

void idx_tree_free(idx_tree *t) {
    if (!t) return;
    idx_slab_fini(&t->tok);
    idx_slab_fini(&t->blk);
    idx_slab_fini(&t->meta);
    for (int k = 0; k < FREE_LEVELS; k++) idx_slab_fini(&t->free[k]);
    kvo_free(t->ea);
    kvo_free(t->la);
    kvo_free(t->sp);
    idx_slab_fini(&t->fats);
    idx_tab_fini(&t->edges);
    idx_tab_fini(&t->far);
    idx_slab_fini(&t->fars);
    for (uint32_t w = 0; w < t->ws_len; w++) idx_tab_fini(&t->ws[w].look);
    kvo_free(t->ws);
    kvo_free(t->wmap);
    kvo_free(t->act);
    kvo_free(t->path);
    kvo_map_fini(&t->orphans);
    kvo_free(t->orph);
    kvo_free(t);
}

/* ======================================================================== */
/* Applying events                                                           */
/* ======================================================================== */

/* Everything a store of n blocks may allocate, so that it never fails
 * half-way: per block a node, an alias edge, two lookup aliases, two
 * edge-table and one lookup-table entries, two nodes turned fat or far,
 * and one set growth (sets_reserve, per block: the set pool moves). */
static kvo_status store_reserve(idx_tree *t, uint32_t w, uint32_t n) {
    kvo_status s;
    if (n > MAX_INDEX / 2) return KVO_ETOOBIG;
    if ((s = nodes_reserve(t, n)) != KVO_OK) return s;
    if ((s = grow((void **)&t->ea, &t->ea_cap, t->ea_len + n,
                  sizeof(ealias))) != KVO_OK)
        return s;
    if ((s = grow((void **)&t->la, &t->la_cap, t->la_len + 2 * n,
                  sizeof(lalias))) != KVO_OK)
        return s;
    if ((s = records_reserve(t, 2 * n + 2)) != KVO_OK) return s;
    if ((s = idx_tab_reserve(&t->edges, 2 * n)) != KVO_OK) return s;
    return idx_tab_reserve(&t->ws[w].look, n);
}

/* The node another tier of w's rank holds bh at, with tokens_hash th, or
 * NIL: a store re-links it rather than making a second node for the same
 * block (as Dynamo re-links a block the worker's own map knows). After the
 * GPU tier was cleared while the CPU kept its copies, the recomputed GPU
 * chain thus meets the offloaded blocks again. */
static uint32_t tier_node(const idx_tree *t, uint32_t w, uint64_t bh,
                          uint64_t th) {
    if (!t->lower_slots) return NIL;
    const wslot *ws = &t->ws[w];
    for (uint32_t k = 0; k < WIRE_TIER_COUNT; k++) {
        uint32_t o =
            k == ws->tier ? NIL : slot_find(t, ws->worker_id, ws->dp_rank, k);
        uint32_t pos = o == NIL ? NIL : look_find(t, o, bh);
        if (pos == NIL) continue;
        uint32_t n = look_node(t, tab_ref(&t->ws[o].look, pos));
        if (TOK(t, n) == th) return n;
    }
    return NIL;
}

static kvo_status apply_store(idx_tree *t, uint32_t w, const wire_revent *ev,
                              idx_evstatus *st) {
    uint32_t cur = ROOT;
    if (ev->has_parent) {
        /* the slot's own tier first, then the rank's tiers above it */
        uint32_t pw = w, pos = look_find(t, w, ev->parent_hash);
        for (uint32_t k = 0; pos == NIL && k < t->ws[w].tier; k++) {
            pw = slot_find(t, ev->worker_id, ev->dp_rank, k);
            if (pw != NIL) pos = look_find(t, pw, ev->parent_hash);
        }
        if (pos == NIL) {
            *st = IDX_EV_PARENT_NOT_FOUND;
            return KVO_OK;
        }
        cur = look_node(t, tab_ref(&t->ws[pw].look, pos));
    }
    kvo_status s = store_reserve(t, w, ev->n_blocks);
    if (s != KVO_OK) return s;
    *st = IDX_EV_OK;
    uint64_t ring[AHEAD]; /* hashes of the blocks prefetched ahead */
    for (uint32_t i = 0; i < ev->n_blocks && i < AHEAD; i++)
        ring[i] = look_prefetch(t, w, ev->blocks[i].block_hash);
    for (uint32_t i = 0; i < ev->n_blocks && i < AHEAD / 2; i++)
        look_prefetch_second(t, w, ring[i]);
    for (uint32_t i = 0; i < ev->n_blocks; i++) {
        if ((s = sets_reserve(t)) != KVO_OK) return s;
        uint64_t bh = ev->blocks[i].block_hash;
        uint64_t th = ev->blocks[i].tokens_hash;
        uint64_t h = ring[i % AHEAD];
        if (i + AHEAD < ev->n_blocks)
            ring[i % AHEAD] =
                look_prefetch(t, w, ev->blocks[i + AHEAD].block_hash);
        if (i + AHEAD / 2 < ev->n_blocks)
            look_prefetch_second(t, w, ring[(i + AHEAD / 2) % AHEAD]);
        uint32_t c = child_find(t, cur, th), pos = FIND;
        if (c != NIL) {
            if (c == cur) { /* a self edge left by an earlier event */
                *st = IDX_EV_INVALID_BLOCK;
                return KVO_OK;
            }
            if (BLK(t, c) != bh) t->c.hash_mismatch++;
        } else {
            pos = look_find_h(t, w, bh, h);
            if (pos != NIL)
                c = look_node(t, tab_ref(&t->ws[w].look, pos));
            else if ((c = tier_node(t, w, bh, th)) == NIL &&
                     (c = node_new(t, bh, th)) == cur + 1 &&
                     !(META(t, cur) & (M_FAT | M_CHILD))) {
                /* A chain goes on (a prompt's own blocks, the bulk of a
                 * store): c is lean, its link, worker and reference all in
                 * its word. What edge_add, wset_add and look_put do for a
                 * new node, with their general cases left out. */
                META(t, c) = P_PREV << M_PARENT_SHIFT | REF_ONE | w;
                META(t, cur) |= M_CHILD;
                idx_tab_put(&t->ws[w].look, tab_hash_tag(h), c);
                t->ws[w].blocks++;
                t->pairs++;
                t->held++;
                t->c.blocks_stored++;
                if (t->orph_live) orphan_relink(t, bh, c);
                cur = c;
                continue;
            }
            edge_add(t, cur, th, c);
            if (c == cur) { /* Dynamo links it, then rejects the block */
                *st = IDX_EV_INVALID_BLOCK;
                return KVO_OK;
            }
            /* pos stays valid: nothing below moves lookup entries */
        }
        wset_add(t, c, w);
        uint32_t old = look_put(t, w, bh, h, c, pos);
        if (old != NIL) maybe_free(t, old);
        drain(t);
        if (t->orph_live) orphan_relink(t, bh, c);
        t->c.blocks_stored++;
        cur = c;
    }
    return KVO_OK;
}

/* After w lost its lookup entry for node n: w leaves n's set, and an
 * emptied n detaches its children. */
static inline void leave_node(idx_tree *t, uint32_t w, uint32_t n) {
    uint32_t m = META(t, n);
    if (!(m & M_FAT)) { /* at most one worker, at most the child n + 1 */
        if ((m & M_WSET) == w) {
            META(t, n) = m |= M_WSET;
            t->held--;
        }
        if ((m & (M_WSET | M_CHILD)) == (M_WSET | M_CHILD))
            detach_edges(t, n, n + 1);
        return;
    }
    wset_del(t, n, w);
    if (nd_wset(t, n) == NIL) detach(t, n);
}

static kvo_status apply_remove(idx_tree *t, uint32_t w, const wire_revent *ev,
                               idx_evstatus *st) {
    *st = IDX_EV_OK;
    uint64_t ring[AHEAD];
    for (uint32_t i = 0; i < ev->n_removed && i < AHEAD; i++)
        ring[i] = look_prefetch(t, w, ev->removed[i]);
    for (uint32_t i = 0; i < ev->n_removed && i < AHEAD / 2; i++)
        look_prefetch_second(t, w, ring[i]);
    for (uint32_t i = 0; i < ev->n_removed; i++) {
        uint64_t h = ring[i % AHEAD];
        if (i + AHEAD < ev->n_removed)
            ring[i % AHEAD] = look_prefetch(t, w, ev->removed[i + AHEAD]);
        if (i + AHEAD / 2 < ev->n_removed)
            look_prefetch_second(t, w, ring[(i + AHEAD / 2) % AHEAD]);
        uint32_t pos = look_find_h(t, w, ev->removed[i], h);
        if (pos == NIL) {
            t->c.blocks_not_found++;
            *st = IDX_EV_BLOCK_NOT_FOUND;
            continue;
        }
        uint32_t n = look_erase(t, w, pos);
        leave_node(t, w, n);
        maybe_free(t, n);
        drain(t);
        t->c.blocks_removed++;
    }
    return KVO_OK;
}

typedef struct centry {
    uint64_t block_hash;
    uint32_t node;
} centry;

/* Drop every lookup entry of slot w (Dynamo: remove_or_clear_worker_blocks),
 * in O(w's entries): its own table lists them. All entries are erased
 * first, then w leaves the nodes, then unreferenced nodes are released. */
static kvo_status clear_slot(idx_tree *t, uint32_t w) {
    uint64_t n = t->ws[w].blocks;
    if (n == 0) return KVO_OK;
    centry *list = kvo_malloc(n * sizeof(centry));
    if (!list) return KVO_ENOMEM;
    tab *lk = &t->ws[w].look;
    uint64_t k = 0;
    for (uint32_t i = 0; i < tab_positions(lk) && k < n; i++) {
        uint32_t v = tab_ref(lk, i);
        if (v) list[k++] = (centry){look_block_hash(t, v), look_node(t, v)};
    }
    for (uint64_t i = 0; i < k; i++) {
        uint32_t pos = look_find(t, w, list[i].block_hash);
        if (pos != NIL) look_erase(t, w, pos);
    }
    for (uint64_t i = 0; i < k; i++) leave_node(t, w, list[i].node);
    for (uint64_t i = 0; i < k; i++) maybe_free(t, list[i].node);
    drain(t);
    kvo_free(list);
    return KVO_OK;
}

kvo_status idx_tree_apply(idx_tree *t, const wire_revent *ev,
                          idx_evstatus *st) {
    if (!t || !ev || !st) return KVO_EINVAL;
    if (ev->type < WIRE_R_STORED || ev->type > WIRE_R_CLEARED ||
        (unsigned)ev->tier >= WIRE_TIER_COUNT)
        return KVO_EINVAL;
    uint32_t w;
    kvo_status s = KVO_OK;
    if (ev->type == WIRE_R_CLEARED && ev->tier != WIRE_TIER_DEVICE) {
        /* a relay clears every tier it might have sent: no slot needed */
        w = slot_find(t, ev->worker_id, ev->dp_rank, ev->tier);
        if (w == NIL) {
            *st = IDX_EV_OK;
            t->c.events[ev->type][*st]++;
            return KVO_OK;
        }
    } else {
        s = slot_get(t, ev->worker_id, ev->dp_rank, ev->tier, &w);
    }
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

kvo_status idx_tree_rank_clear(idx_tree *t, uint64_t worker_id,
                               uint32_t dp_rank) {
    uint32_t dev; /* known afterwards, as after a device cleared */
    kvo_status s = slot_get(t, worker_id, dp_rank, WIRE_TIER_DEVICE, &dev);
    if (s != KVO_OK) return s;
    for (uint32_t k = 0; k < WIRE_TIER_COUNT; k++) {
        uint32_t w = slot_find(t, worker_id, dp_rank, k);
        if (w != NIL && (s = clear_slot(t, w)) != KVO_OK) return s;
    }
    return KVO_OK;
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

/* Whether slot w is in node n's worker set. */
static bool wset_has(const idx_tree *t, uint32_t n, uint32_t w) {
    uint32_t ws = nd_wset(t, n);
    if (ws == NIL || !(ws & TAG)) return ws == w;
    const uint32_t *s = &t->sp[ws & ~TAG];
    uint32_t cnt = set_count(s), i = lower_bound(s + 1, cnt, w);
    return i < cnt && s[1 + i] == w;
}

/* A device slot's run (lower-tier slots ride along in the walk's sets but
 * score in query_lower). */
static inline void emit(const idx_tree *t, idx_scores *out, uint32_t w,
                        size_t depth) {
    if (t->ws[w].tier != WIRE_TIER_DEVICE) return;
    idx_score *e = &out->v[out->n++];
    *e = (idx_score){
        t->ws[w].worker_id, t->ws[w].dp_rank, (uint32_t)depth, 0, {0}};
    for (uint32_t k = 0; k < IDX_LOWER_TIERS; k++) e->through[k] = e->blocks;
}

static bool score_less(const idx_score *a, const idx_score *b) {
    return a->worker_id != b->worker_id ? a->worker_id < b->worker_id
                                        : a->dp_rank < b->dp_rank;
}

static int score_cmp(const void *a, const void *b) {
    return score_less(a, b) ? -1 : score_less(b, a) ? 1 : 0;
}

static void scores_sort(idx_scores *out) {
    if (out->n > SORT_INSERTION_MAX) {
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

/* The device tier's scores of the walk along h[0..n), n >= 1, unsorted. */
static void query_device(idx_tree *t, const uint64_t *h, size_t n,
                         idx_scores *out) {
    uint32_t c = child_find(t, ROOT, h[0]);
    if (c == NIL || nd_wset(t, c) == NIL) return;

    /* act: the workers present at every node so far, sorted */
    uint32_t *act = t->act, na;
    uint32_t curws = nd_wset(t, c);
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
        /* Chains are allocated in order, so cur's child is most often cur
         * + 1: when cur's first child edge is cur + 1's primary edge and its
         * key is h[i], cur + 1 is the child for h[i] (keys are unique in a
         * child list, I2). Run along such a chain while the worker set
         * stays the same: no load waits for another, so the walk streams
         * through tok[] and meta[]. Lean nodes only: their wset equals
         * curws only when it is one slot (a lean word has no fat bit), and
         * a fat node (a shared prefix, each with a set of its own) goes
         * through child_find and the set compare below anyway. */
        const uint64_t *tk = &TOK(t, 0);
        const uint32_t *mt = &META(t, 0);
        while (i < n && (mt[cur] & (M_FAT | M_CHILD)) == M_CHILD &&
               tk[cur + 1] == h[i] &&
               (mt[cur + 1] & (M_FAT | M_WSET)) == curws) {
            __builtin_prefetch(&tk[cur + 16]); /* a chain's start is cold, */
            __builtin_prefetch(&mt[cur + 16]); /* its pages random */
            cur++;
            i++;
        }
        depth = i;
        if (i == n) break;
        uint32_t nx = child_find(t, cur, h[i]);
        if (nx == NIL) break;
        uint32_t ws = nd_wset(t, nx);
        if (ws != curws) {
            if (ws == NIL) break;
            if (!(ws & TAG)) {
                bool keep = false;
                for (uint32_t j = 0; j < na; j++) {
                    if (act[j] == ws)
                        keep = true;
                    else
                        emit(t, out, act[j], depth);
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
                        if (j < cnt && s[j] == act[a])
                            act[k++] = act[a];
                        else
                            emit(t, out, act[a], depth);
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
}

/* The entry of (wid, rank): v[0..sorted) is sorted, the rest appended. */
static idx_score *score_find(idx_scores *out, size_t sorted, uint64_t wid,
                             uint32_t rank) {
    idx_score key = {.worker_id = wid, .dp_rank = rank};
    size_t lo = 0, hi = sorted;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (score_less(&out->v[mid], &key))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < sorted && !score_less(&key, &out->v[lo])) return &out->v[lo];
    for (size_t i = sorted; i < out->n; i++)
        if (out->v[i].worker_id == wid && out->v[i].dp_rank == rank)
            return &out->v[i];
    return NULL;
}

/* The lower tiers' cumulative runs (out sorted, device scores in): walk the
 * query's path once, then per lower tier k and slot of that tier, extend
 * the rank's run through the tiers above by the nodes the slot holds. A
 * rank that scored 0 on the device tier joins when its lower run is not
 * empty. */
static kvo_status query_lower(idx_tree *t, const uint64_t *h, size_t n,
                              idx_scores *out) {
    if (t->path_cap < n) {
        uint32_t *p = kvo_realloc(t->path, n * sizeof(uint32_t));
        if (!p) {
            out->n = 0;
            return KVO_ENOMEM;
        }
        t->path = p;
        t->path_cap = n;
    }
    size_t len = 0;
    for (uint32_t cur = ROOT; len < n; len++) {
        uint32_t c = child_find(t, cur, h[len]);
        if (c == NIL || c == cur) break;
        t->path[len] = cur = c;
    }
    size_t sorted = out->n;
    for (uint32_t k = 1; k < WIRE_TIER_COUNT; k++) {
        for (size_t i = 0; i < out->n; i++) {
            idx_score *e = &out->v[i];
            e->through[k - 1] = k == 1 ? e->blocks : e->through[k - 2];
        }
        for (uint32_t s = 0; s < t->ws_len; s++) {
            const wslot *w = &t->ws[s];
            if (w->tier != k || !w->present) continue;
            idx_score *e = score_find(out, sorted, w->worker_id, w->dp_rank);
            uint32_t d = e ? e->through[k - 1] : 0;
            while (d < len && wset_has(t, t->path[d], s)) d++;
            if (!e) {
                if (d == 0) continue;
                e = &out->v[out->n++];
                *e = (idx_score){w->worker_id, w->dp_rank, 0, 0, {0}};
            }
            e->lower |= 1u << (k - 1);
            e->through[k - 1] = d;
        }
    }
    if (out->n > sorted) scores_sort(out);
    return KVO_OK;
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
    query_device(t, h, n, out);
    scores_sort(out);
    return t->lower_slots ? query_lower(t, h, n, out) : KVO_OK;
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
    for (uint32_t w = 0; w < t->ws_len; w++) {
        out->workers += t->ws[w].present;
        out->bytes += idx_tab_bytes(&t->ws[w].look);
    }
    out->edge_alias = t->ea_live;
    out->look_alias = t->la_live;
    out->sets = t->sp_live;
    out->bytes += sizeof(*t) + t->tok.usable + t->blk.usable + t->meta.usable +
                  t->free[0].usable + t->free[1].usable + t->free[2].usable +
                  (uint64_t)t->ea_cap * sizeof(ealias) +
                  (uint64_t)t->la_cap * sizeof(lalias) +
                  (uint64_t)t->sp_cap * 4 + t->fats.usable + t->fars.usable +
                  idx_tab_bytes(&t->edges) + idx_tab_bytes(&t->far) +
                  (uint64_t)t->ws_cap * (sizeof(wslot) + 4) +
                  (uint64_t)t->wmap_cap * 4 + (uint64_t)t->path_cap * 4 +
                  (uint64_t)t->orph_cap * sizeof(orphan) +
                  t->orphans.cap * sizeof(kvo_map_slot);
}

static int worker_cmp(const void *a, const void *b) {
    const idx_worker *x = a, *y = b;
    if (x->worker_id != y->worker_id)
        return x->worker_id < y->worker_id ? -1 : 1;
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
    for (uint32_t w = 0; w < t->ws_len; w++) {
        const wslot *s = &t->ws[w];
        if (!s->present) continue;
        bool dev = s->tier == WIRE_TIER_DEVICE;
        v[k++] = (idx_worker){s->worker_id, s->dp_rank, dev ? s->blocks : 0,
                              dev ? 0 : s->blocks};
    }
    qsort(v, k, sizeof(*v), worker_cmp);
    /* one entry per (worker_id, dp_rank): its tiers' slots summed */
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m && worker_cmp(&v[m - 1], &v[i]) == 0) {
            v[m - 1].blocks += v[i].blocks;
            v[m - 1].lower_blocks += v[i].lower_blocks;
        } else {
            v[m++] = v[i];
        }
    }
    *out = v;
    *n = m;
    return KVO_OK;
}

/* The block a lookup ref v of w names, in the API's terms. */
static idx_block block_of(const idx_tree *t, uint32_t v) {
    uint32_t n = look_node(t, v), p = nd_parent(t, n);
    bool hp = p != NIL && p != ROOT;
    return (idx_block){look_block_hash(t, v), TOK(t, n), hp,
                       hp ? BLK(t, p) : 0};
}

kvo_status idx_tree_worker_blocks(const idx_tree *t, uint64_t worker_id,
                                  uint32_t dp_rank, wire_tier tier,
                                  idx_block_fn fn, void *ctx) {
    if (!t || !fn || (unsigned)tier >= WIRE_TIER_COUNT) return KVO_EINVAL;
    uint32_t w = slot_find(t, worker_id, dp_rank, tier);
    if (w == NIL) return KVO_OK;
    const tab *lk = &t->ws[w].look;
    for (uint32_t i = 0; i < tab_positions(lk); i++) {
        uint32_t v = tab_ref(lk, i);
        if (!v) continue;
        idx_block b = block_of(t, v);
        kvo_status s = fn(ctx, &b);
        if (s != KVO_OK) return s;
    }
    return KVO_OK;
}

static bool slot_less(const idx_tree *t, uint32_t a, uint32_t b) {
    const wslot *x = &t->ws[a], *y = &t->ws[b];
    return x->worker_id != y->worker_id ? x->worker_id < y->worker_id
                                        : x->dp_rank < y->dp_rank;
}

kvo_status idx_tree_block_info(const idx_tree *t, uint64_t worker_id,
                               uint32_t dp_rank, uint64_t block_hash,
                               idx_block_info *out) {
    if (!t || !out) return KVO_EINVAL;
    memset(out, 0, sizeof(*out));
    uint32_t w = slot_find(t, worker_id, dp_rank, WIRE_TIER_DEVICE);
    uint32_t pos = w == NIL ? NIL : look_find(t, w, block_hash);
    if (pos == NIL) return KVO_OK;
    uint32_t v = tab_ref(&t->ws[w].look, pos), n = look_node(t, v);
    out->held = true;
    out->block = block_of(t, v);
    out->node_block_hash = BLK(t, n);
    uint32_t ws = nd_wset(t, n), one = ws, cnt = ws == NIL ? 0 : 1;
    const uint32_t *items = &one;
    if (ws != NIL && (ws & TAG)) {
        items = &t->sp[(ws & ~TAG) + 1];
        cnt = set_count(&t->sp[ws & ~TAG]);
    }
    /* the IDX_INFO_OTHERS smallest others, by insertion: sets are sorted by
     * slot, not by worker id */
    uint32_t best[IDX_INFO_OTHERS];
    for (uint32_t i = 0; i < cnt; i++) {
        uint32_t x = items[i];
        if (x == w) {
            out->in_set = true;
            continue;
        }
        if (t->ws[x].tier != WIRE_TIER_DEVICE) continue;
        out->others++;
        uint32_t k = out->listed;
        if (k == IDX_INFO_OTHERS) {
            if (!slot_less(t, x, best[k - 1])) continue;
            k--;
        } else {
            out->listed++;
        }
        for (; k > 0 && slot_less(t, x, best[k - 1]); k--)
            best[k] = best[k - 1];
        best[k] = x;
    }
    for (uint32_t i = 0; i < out->listed; i++) {
        out->other[i].worker_id = t->ws[best[i]].worker_id;
        out->other[i].dp_rank = t->ws[best[i]].dp_rank;
    }
    return KVO_OK;
}

idx_found idx_tree_find_tokens(const idx_tree *t, uint64_t worker_id,
                               uint32_t dp_rank, bool has_parent,
                               uint64_t parent_hash, uint64_t tokens_hash,
                               uint64_t *block_hash) {
    uint32_t w = t ? slot_find(t, worker_id, dp_rank, WIRE_TIER_DEVICE) : NIL;
    if (w == NIL) return IDX_FOUND_NONE;
    uint32_t p = ROOT;
    if (has_parent) {
        uint32_t pos = look_find(t, w, parent_hash);
        p = pos == NIL ? NIL : look_node(t, tab_ref(&t->ws[w].look, pos));
    }
    uint32_t c = p == NIL ? NIL : child_find(t, p, tokens_hash);
    if (c != NIL && c != p && wset_has(t, c, w)) {
        *block_hash = BLK(t, c);
        return IDX_FOUND_UNDER_PARENT; /* the root when it has no parent */
    }
    if (p == ROOT) return IDX_FOUND_NONE;
    c = child_find(t, ROOT, tokens_hash);
    if (c == NIL || !wset_has(t, c, w)) return IDX_FOUND_NONE;
    *block_hash = BLK(t, c);
    return IDX_FOUND_UNDER_ROOT;
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
        for (uint32_t e = nd_child(t, p); e != NIL; e = edge_next(t, e)) {
            uint32_t c = edge_child(t, e);
            ev.has_parent = p != ROOT;
            ev.parent_hash = p != ROOT ? BLK(t, p) : 0;
            blk.block_hash = BLK(t, c);
            blk.tokens_hash = edge_key(t, e);
            uint32_t ws = nd_wset(t, c);
            uint32_t one = ws, cnt = ws == NIL ? 0 : 1;
            const uint32_t *items = &one;
            if (ws != NIL && (ws & TAG)) {
                items = &t->sp[(ws & ~TAG) + 1];
                cnt = set_count(&t->sp[ws & ~TAG]);
            }
            for (uint32_t i = 0; i < cnt; i++) {
                ev.worker_id = t->ws[items[i]].worker_id;
                ev.dp_rank = t->ws[items[i]].dp_rank;
                ev.tier = (wire_tier)t->ws[items[i]].tier;
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
