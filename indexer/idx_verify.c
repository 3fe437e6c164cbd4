/* idx_verify.c -- idx_tree_check: walks every structure of the tree and
 * checks the invariants I1-I9 drawn in idx_tree.c's header. A test seam
 * (idx_int.h): O(size of the tree), never on the service's path.
 */
#define IDX_TREE_LAYOUT /* idx_int.h: the layout's types, constants, probes */
#include "idx_int.h"

#include <stdio.h>

#define FAIL(...)                                                              \
    do {                                                                       \
        snprintf(msg, msgsz, __VA_ARGS__);                                     \
        s = KVO_ESTATE;                                                        \
        goto done;                                                             \
    } while (0)

static bool live(const idx_tree *t, uint32_t n) {
    return n < t->nd_len && nd_parent(t, n) != DEAD;
}

/* Key hashes of the two tables' refs, for idx_tab_check. */
static uint64_t far_record_hash(const void *owner, uint32_t v) {
    return far_hash(FAR((const idx_tree *)owner, v - 1).node);
}

static uint64_t edge_key_hash(const void *owner, uint32_t v) {
    return edge_hash(edge_key(owner, v), edge_parent(owner, v));
}

typedef struct look_owner { /* a lookup table and its slot */
    const idx_tree *t;
    uint32_t slot;
} look_owner;

static uint64_t look_hash(const void *owner, uint32_t v) {
    const look_owner *o = owner;
    return mix(look_block_hash(o->t, v), o->slot);
}

kvo_status idx_tree_check(const idx_tree *t, uint64_t *unreachable, char *msg,
                          size_t msgsz) {
    kvo_status s = KVO_OK;
    uint32_t N = t->nd_len;
    uint64_t *want = kvo_calloc(N, sizeof(uint64_t)); /* expected refs */
    uint32_t *prim = kvo_calloc(N, sizeof(uint32_t)); /* primary edges seen */
    uint64_t *per_slot = kvo_calloc(t->ws_len + 1, sizeof(uint64_t));
    uint32_t *queue = kvo_malloc((size_t)(N + 1) * sizeof(uint32_t));
    uint8_t *seen = kvo_calloc(N, 1);
    uint8_t *fat_user = kvo_calloc(t->fat_len + 1, 1); /* I9 */
    if (!want || !prim || !per_slot || !queue || !seen || !fat_user) {
        s = KVO_ENOMEM;
        snprintf(msg, msgsz, "out of memory");
        goto done;
    }
    if (t->dying != NIL) FAIL("dying stack not empty");
    if (nd_parent(t, ROOT) != NIL || nd_wset(t, ROOT) != NIL)
        FAIL("root has a parent or workers");

    /* I8: free nodes */
    uint32_t nfree = 0, nlive = 0;
    for (uint32_t n = 0; n < t->nd_cap; n++) {
        bool bit = *free_word(t, 0, n >> 6) >> (n & 63) & 1;
        bool dead = n > ROOT && n < N && nd_parent(t, n) == DEAD;
        if (bit != dead) FAIL("node %u: free bit %d, free %d", n, bit, dead);
        if (bit && n < t->nd_low) FAIL("free node %u below %u", n, t->nd_low);
        nfree += dead;
        nlive += n > ROOT && n < N && !dead;
    }
    for (int k = 1; k < FREE_LEVELS; k++)
        for (uint32_t i = 0; i < free_words(t->nd_cap, k - 1); i++) {
            bool bit = *free_word(t, k, i >> 6) >> (i & 63) & 1;
            if (bit != (*free_word(t, k - 1, i) != 0))
                FAIL("free bitmap level %d, bit %u", k, i);
        }
    if (nlive != t->nd_live || nlive + nfree + 1 != N)
        FAIL("node counts: %u live (%u counted), %u free, %u slab", t->nd_live,
             nlive, nfree, N);
    /* I9: meta words, fat and far records */
    uint32_t nfar = 0;
    for (uint32_t n = 0; n < N; n++) {
        uint32_t m = META(t, n);
        if (m & M_FAT) {
            uint32_t i = m & ~M_FAT;
            bool bad = i >= t->fat_len || fat_user[i]++ ||
                       FAT(t, i).wset == DEAD || FAT(t, i).parent == DEAD;
            if (bad)
                FAIL("node %u: fat record %u free, shared or out of range", n,
                     i);
            continue;
        }
        uint32_t k = (m & M_PARENT) >> M_PARENT_SHIFT;
        bool bad = (k == P_PREV && n == ROOT) ||
                   ((m & M_CHILD) && n + 1 >= N) ||
                   ((m & M_WSET) != M_WSET && (m & M_WSET) >= t->ws_len);
        if (bad) FAIL("node %u: meta word %08x", n, m);
        if (k != P_FAR) continue;
        uint32_t pos = far_pos(t, n), i = pos == NIL ? NIL : far_index(t, n);
        if (pos == NIL || i >= t->far_len) FAIL("far node %u: no record", n);
        uint32_t p = FAR(t, i).parent;
        if (FAR(t, i).next == NIL && (p == NIL || p == DEAD || p == n - 1))
            FAIL("far node %u: its links fit its word", n);
        nfar++;
    }
    if (nfar != t->far.len)
        FAIL("%u far nodes, %u in their table", nfar, t->far.len);
    uint32_t farfree = 0;
    for (uint32_t i = t->far_free; i != NIL; i = FAR(t, i).next) {
        if (i >= t->far_len || FAR(t, i).node != NIL) FAIL("far free list");
        if (++farfree > t->far_len) FAIL("far free list loops");
    }
    if (farfree + nfar != t->far_len)
        FAIL("far records: %u in use, %u free, %u made", nfar, farfree,
             t->far_len);
    uint32_t fatfree = 0;
    for (uint32_t i = t->fat_free; i != NIL; i = FAT(t, i).next) {
        if (i >= t->fat_len || FAT(t, i).wset != DEAD) FAIL("fat free list");
        if (++fatfree > t->fat_len) FAIL("fat free list loops");
    }
    if (fatfree + t->fat_live != t->fat_len)
        FAIL("fat records: %u live, %u free, %u made", t->fat_live, fatfree,
             t->fat_len);

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
        uint32_t ws = nd_wset(t, n);
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
        if (cls >= SET_CLASSES || off + class_words(cls) > t->sp_len ||
            cnt > class_items(cls) || cnt < 2)
            FAIL("node %u: set header %08x", n, st[0]);
        for (uint32_t i = 0; i < cnt; i++) {
            if (st[1 + i] >= t->ws_len) FAIL("node %u: set slot", n);
            if (i && st[i] >= st[1 + i]) FAIL("node %u: set not sorted", n);
        }
        sets++;
    }
    if (sets != t->sp_live)
        FAIL("%u sets in use, %u counted", t->sp_live, sets);
    if (held != t->held)
        FAIL("%llu nodes held, %llu counted", (unsigned long long)t->held,
             (unsigned long long)held);

    /* I1, I2: child lists */
    uint32_t in_table = 0;
    for (uint32_t p = 0; p < N; p++) {
        if (!live(t, p)) continue;
        uint32_t len = 0;
        for (uint32_t e = nd_child(t, p); e != NIL; e = edge_next(t, e)) {
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
                if (!live(t, c) || nd_parent(t, c) != p)
                    FAIL("node %u: child %u has parent %u", p, c,
                         c < N ? nd_parent(t, c) : 0);
                prim[c]++;
            }
        }
        for (uint32_t e = nd_child(t, p); e != NIL; e = edge_next(t, e)) {
            uint32_t pos = edge_find(t, p, edge_key(t, e));
            if (len >= 2 && (pos == NIL || tab_ref(&t->edges, pos) != e))
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
        if (nd_parent(t, n) != NIL && prim[n] != 1)
            FAIL("node %u listed %u times under its parent", n, prim[n]);
    }
    uint32_t ealive = 0;
    for (uint32_t a = 0; a < t->ea_len; a++) ealive += t->ea[a].parent != DEAD;
    if (ealive != t->ea_live)
        FAIL("alias edges: %u live, %u counted", t->ea_live, ealive);

    /* I3: lookup, one table per slot */
    if (!idx_tab_check(&t->edges, edge_key_hash, t, "edges", msg, msgsz) ||
        !idx_tab_check(&t->far, far_record_hash, t, "far", msg, msgsz)) {
        s = KVO_ESTATE;
        goto done;
    }
    uint32_t lalive = 0;
    for (uint32_t sw = 0; sw < t->ws_len; sw++) {
        const tab *lk = &t->ws[sw].look;
        char name[32];
        snprintf(name, sizeof(name), "look of slot %u", sw);
        look_owner lo = {t, sw};
        if (!idx_tab_check(lk, look_hash, &lo, name, msg, msgsz)) {
            s = KVO_ESTATE;
            goto done;
        }
        for (uint32_t i = 0; i < tab_positions(lk); i++) {
            if (!tab_ref(lk, i)) continue;
            uint32_t v = tab_ref(lk, i), n, w;
            uint64_t bh;
            if (v & TAG) {
                uint32_t a = v & ~TAG;
                if (a >= t->la_len || t->la[a].slot == NIL)
                    FAIL("%s[%u]: free alias", name, i);
                lalive++;
                n = t->la[a].node;
                w = t->la[a].slot;
                bh = t->la[a].block_hash;
            } else {
                n = v;
                if (!live(t, n)) FAIL("%s[%u]: dead node %u", name, i, n);
                w = sw;
                bh = BLK(t, n);
            }
            if (!live(t, n)) FAIL("%s[%u]: names dead node %u", name, i, n);
            if (w != sw) FAIL("%s[%u]: entry of slot %u", name, i, w);
            if (look_find(t, w, bh) != i)
                FAIL("%s[%u]: key repeated or unreachable", name, i);
            want[n]++;
            per_slot[w]++;
        }
    }
    if (lalive != t->la_live)
        FAIL("lookup aliases: %u live, %u in table", t->la_live, lalive);
    uint64_t pairs = 0;
    for (uint32_t w = 0; w < t->ws_len; w++) {
        if (per_slot[w] != t->ws[w].blocks)
            FAIL("slot %u: %llu entries, blocks %llu", w,
                 (unsigned long long)per_slot[w],
                 (unsigned long long)t->ws[w].blocks);
        if (!t->ws[w].present && t->ws[w].blocks)
            FAIL("absent slot %u holds blocks", w);
        if (slot_find(t, t->ws[w].worker_id, t->ws[w].dp_rank, t->ws[w].tier) !=
            w)
            FAIL("slot %u not in the worker map", w);
        pairs += per_slot[w];
    }
    if (pairs != t->pairs)
        FAIL("pairs %llu, counted %llu", (unsigned long long)t->pairs,
             (unsigned long long)pairs);

    /* I4, I5 */
    for (uint32_t n = 1; n < N; n++) {
        if (!live(t, n)) continue;
        if (nd_refs(t, n) != want[n])
            FAIL("node %u: refs %u, counted %llu", n, nd_refs(t, n),
                 (unsigned long long)want[n]);
        if (nd_parent(t, n) == NIL && want[n] == 0)
            FAIL("node %u: garbage left alive", n);
    }

    /* Reachability: from the root and from every lookup entry. */
    uint32_t head = 0, tail = 0;
    queue[tail++] = ROOT;
    seen[ROOT] = 1;
    for (uint32_t w = 0; w < t->ws_len; w++) {
        const tab *lk = &t->ws[w].look;
        for (uint32_t i = 0; i < tab_positions(lk); i++) {
            if (!tab_ref(lk, i)) continue;
            uint32_t n = look_node(t, tab_ref(lk, i));
            if (!seen[n]) {
                seen[n] = 1;
                queue[tail++] = n;
            }
        }
    }
    while (head < tail) {
        uint32_t p = queue[head++];
        for (uint32_t e = nd_child(t, p); e != NIL; e = edge_next(t, e)) {
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
    kvo_free(fat_user);
    return s;
}
