/* test_model: the tree against a reference model of Dynamo's RadixTree,
 * written independently and as simply as possible (linear scans, nodes
 * never freed), after every random operation, with the invariant walker.
 *
 * Two kinds of streams:
 *   consistent  block_hash = f(parent block_hash, tokens_hash), as engines
 *               publish; also checks that dump -> restore answers the same
 *               and that nothing unreachable is left alive;
 *   chaotic     block hashes drawn from a tiny set: stores that re-link
 *               nodes under several parents, self edges, cycles, hash
 *               mismatches, lookup and worker sets disagreeing.
 * The seed is printed; KVO_MODEL_SEED=N reruns one. */
#include "idx_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- The reference model ------------------------------------------------ */

typedef struct mnode mnode;
typedef struct mkid {
    uint64_t t;
    mnode *n;
} mkid;
struct mnode {
    uint64_t bh;
    mnode *prim;  /* the parent of its primary edge (the first edge that
                    linked it and still does), NULL when none */
    uint64_t tok; /* that edge's key (the one it was created under before) */
    mkid *kids;
    size_t nk, ck;
    int *ws; /* model worker indices, unordered */
    size_t nw, cw;
};
typedef struct mlook {
    uint64_t bh;
    mnode *n;
} mlook;
typedef struct mworker {
    uint64_t wid;
    uint32_t rank;
    bool present;
    mlook *l;
    size_t nl, cl;
} mworker;
typedef struct model {
    mnode root;
    mnode **all;
    size_t nall, call;
    mworker w[64];
    size_t nw;
    idx_counters c;
} model;

#define PUSH(arr, n, cap, x)                                                   \
    do {                                                                       \
        if ((n) == (cap)) {                                                    \
            (cap) = (cap) ? (cap)*2 : 4;                                       \
            (arr) = realloc((arr), (cap) * sizeof(*(arr)));                    \
            ck_assert_ptr_nonnull(arr);                                        \
        }                                                                      \
        (arr)[(n)++] = (x);                                                    \
    } while (0)

static int m_worker(model *m, uint64_t wid, uint32_t rank) {
    for (size_t i = 0; i < m->nw; i++)
        if (m->w[i].wid == wid && m->w[i].rank == rank) {
            m->w[i].present = true;
            return (int)i;
        }
    ck_assert_uint_lt(m->nw, 64);
    m->w[m->nw] = (mworker){wid, rank, true, NULL, 0, 0};
    return (int)m->nw++;
}

static mnode *m_kid(mnode *p, uint64_t t) {
    for (size_t i = 0; i < p->nk; i++)
        if (p->kids[i].t == t) return p->kids[i].n;
    return NULL;
}

static mlook *m_look(mworker *w, uint64_t bh) {
    for (size_t i = 0; i < w->nl; i++)
        if (w->l[i].bh == bh) return &w->l[i];
    return NULL;
}

static bool m_has(const mnode *n, int w) {
    for (size_t i = 0; i < n->nw; i++)
        if (n->ws[i] == w) return true;
    return false;
}

static void m_drop_worker(mnode *n, int w) {
    for (size_t i = 0; i < n->nw; i++)
        if (n->ws[i] == w) {
            n->ws[i] = n->ws[--n->nw];
            break;
        }
    if (n->nw == 0) { /* Dynamo: children.clear() */
        for (size_t i = 0; i < n->nk; i++)
            if (n->kids[i].n->prim == n) n->kids[i].n->prim = NULL;
        n->nk = 0;
    }
}

static idx_evstatus m_store(model *m, int w, bool has_parent, uint64_t parent,
                            const wire_rblock *b, size_t n) {
    mworker *W = &m->w[w];
    mnode *cur = &m->root;
    if (has_parent) {
        mlook *l = m_look(W, parent);
        if (!l) return IDX_EV_PARENT_NOT_FOUND;
        cur = l->n;
    }
    for (size_t i = 0; i < n; i++) {
        mnode *child = m_kid(cur, b[i].tokens_hash);
        if (child) {
            if (child == cur) return IDX_EV_INVALID_BLOCK;
            if (child->bh != b[i].block_hash) m->c.hash_mismatch++;
        } else {
            mlook *l = m_look(W, b[i].block_hash);
            if (l) {
                child = l->n;
            } else {
                child = calloc(1, sizeof(mnode));
                ck_assert_ptr_nonnull(child);
                child->bh = b[i].block_hash;
                child->tok = b[i].tokens_hash;
                PUSH(m->all, m->nall, m->call, child);
            }
            PUSH(cur->kids, cur->nk, cur->ck,
                 ((mkid){b[i].tokens_hash, child}));
            if (!child->prim && child != cur) {
                child->prim = cur;
                child->tok = b[i].tokens_hash;
            }
            if (child == cur) return IDX_EV_INVALID_BLOCK;
        }
        if (!m_has(child, w)) PUSH(child->ws, child->nw, child->cw, w);
        mlook *l = m_look(W, b[i].block_hash);
        if (l)
            l->n = child;
        else
            PUSH(W->l, W->nl, W->cl, ((mlook){b[i].block_hash, child}));
        m->c.blocks_stored++;
        cur = child;
    }
    return IDX_EV_OK;
}

static idx_evstatus m_remove(model *m, int w, const uint64_t *h, size_t n) {
    mworker *W = &m->w[w];
    idx_evstatus st = IDX_EV_OK;
    for (size_t i = 0; i < n; i++) {
        mlook *l = m_look(W, h[i]);
        if (!l) {
            m->c.blocks_not_found++;
            st = IDX_EV_BLOCK_NOT_FOUND;
            continue;
        }
        m_drop_worker(l->n, w);
        *l = W->l[--W->nl];
        m->c.blocks_removed++;
    }
    return st;
}

static void m_clear(model *m, int w) {
    mworker *W = &m->w[w];
    for (size_t i = 0; i < W->nl; i++) m_drop_worker(W->l[i].n, w);
    W->nl = 0;
}

static void m_query(const model *m, const uint64_t *q, size_t n,
                    uint32_t *score /* per model worker */) {
    const mnode *path[64];
    size_t len = 0;
    const mnode *cur = &m->root;
    for (size_t i = 0; i < n && i < 64; i++) {
        cur = m_kid((mnode *)cur, q[i]);
        if (!cur) break;
        path[len++] = cur;
    }
    for (size_t w = 0; w < m->nw; w++) {
        size_t k = 0;
        while (k < len && m_has(path[k], (int)w)) k++;
        score[w] = (uint32_t)k;
    }
}

static void m_free(model *m) {
    for (size_t i = 0; i < m->nall; i++) {
        free(m->all[i]->kids);
        free(m->all[i]->ws);
        free(m->all[i]);
    }
    free(m->all);
    free(m->root.kids);
    for (size_t i = 0; i < m->nw; i++) free(m->w[i].l);
}

/* ---- Comparing ---------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ z >> 27) * 0x94D049BB133111EBull;
    return z ^ z >> 31;
}

static uint64_t rnd(uint64_t *s, uint64_t n) { return rng_next(s) % n; }

static void compare_query(idx_tree *t, const model *m, const uint64_t *q,
                          size_t n, uint64_t seed, long step) {
    uint32_t want[64];
    m_query(m, q, n, want);
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, q, n, &s), KVO_OK);
    size_t expect = 0;
    for (size_t w = 0; w < m->nw; w++) {
        if (!want[w]) continue;
        expect++;
        uint32_t got = 0;
        for (size_t i = 0; i < s.n; i++)
            if (s.v[i].worker_id == m->w[w].wid &&
                s.v[i].dp_rank == m->w[w].rank)
                got = s.v[i].blocks;
        ck_assert_msg(
            got == want[w],
            "seed %llu step %ld: worker (%llu,%u) scores %u, model %u",
            (unsigned long long)seed, step, (unsigned long long)m->w[w].wid,
            m->w[w].rank, got, want[w]);
    }
    ck_assert_msg(s.n == expect, "seed %llu step %ld: %zu scores, model %zu",
                  (unsigned long long)seed, step, s.n, expect);
    for (size_t i = 1; i < s.n; i++)
        ck_assert(s.v[i - 1].worker_id < s.v[i].worker_id ||
                  (s.v[i - 1].worker_id == s.v[i].worker_id &&
                   s.v[i - 1].dp_rank < s.v[i].dp_rank));
    idx_scores_fini(&s);
}

/* Queries that follow the model's edges (so they hit), then random ones. */
static void compare_queries(idx_tree *t, const model *m, uint64_t *rs,
                            uint64_t seed, long step, idx_tree *restored) {
    for (int k = 0; k < 12; k++) {
        uint64_t q[12];
        size_t n = 1 + rnd(rs, 12);
        const mnode *cur = &m->root;
        for (size_t i = 0; i < n; i++) {
            if (cur && cur->nk && rnd(rs, 5)) {
                const mkid *kid = &cur->kids[rnd(rs, cur->nk)];
                q[i] = kid->t;
                cur = kid->n;
            } else {
                q[i] = 1 + rnd(rs, 5);
                cur = cur ? m_kid((mnode *)cur, q[i]) : NULL;
            }
        }
        compare_query(t, m, q, n, seed, step);
        if (restored) compare_query(restored, m, q, n, seed, step);
    }
}

typedef struct blist {
    idx_block v[512];
    size_t n;
} blist;

static kvo_status collect_block(void *ctx, const idx_block *b) {
    blist *l = ctx;
    ck_assert_uint_lt(l->n, 512);
    l->v[l->n++] = *b;
    return KVO_OK;
}

/* idx_tree_worker_blocks and idx_tree_block_info against the model: the
 * same blocks per worker, the same nodes (block_hash, worker set); on
 * consistent streams also the same tokens_hash and primary parent (on
 * chaotic ones the tree frees nodes that only cycles keep, which the model
 * never does, so primary edges may differ there). */
static void compare_views(const idx_tree *t, const model *m, bool chaotic,
                          uint64_t *rs, uint64_t seed, long step) {
    static blist got;
    for (size_t i = 0; i < m->nw; i++) {
        const mworker *W = &m->w[i];
        got.n = 0;
        ck_assert_int_eq(idx_tree_worker_blocks(t, W->wid, W->rank,
                                                WIRE_TIER_DEVICE, collect_block,
                                                &got),
                         KVO_OK);
        ck_assert_msg(got.n == W->nl,
                      "seed %llu step %ld: worker (%llu,%u) lists %zu blocks, "
                      "model %zu",
                      (unsigned long long)seed, step,
                      (unsigned long long)W->wid, W->rank, got.n, W->nl);
        for (size_t j = 0; j < W->nl; j++) {
            const mlook *l = &W->l[j];
            const idx_block *b = NULL;
            for (size_t k = 0; k < got.n; k++)
                if (got.v[k].block_hash == l->bh) b = &got.v[k];
            ck_assert_msg(
                b != NULL, "seed %llu step %ld: block %llu not listed",
                (unsigned long long)seed, step, (unsigned long long)l->bh);
            idx_block_info in;
            ck_assert_int_eq(
                idx_tree_block_info(t, W->wid, W->rank, l->bh, &in), KVO_OK);
            ck_assert(in.held);
            ck_assert(in.block.block_hash == b->block_hash &&
                      in.block.tokens_hash == b->tokens_hash &&
                      in.block.has_parent == b->has_parent &&
                      in.block.parent_block_hash == b->parent_block_hash);
            ck_assert_uint_eq(in.node_block_hash, l->n->bh);
            bool mine = m_has(l->n, (int)i);
            ck_assert_msg(in.in_set == mine, "seed %llu step %ld: in_set",
                          (unsigned long long)seed, step);
            ck_assert_uint_eq(in.others, l->n->nw - (mine ? 1 : 0));
            ck_assert_uint_eq(in.listed, in.others < IDX_INFO_OTHERS
                                             ? in.others
                                             : IDX_INFO_OTHERS);
            for (uint32_t k = 0; k < in.listed; k++) {
                bool there = false;
                for (size_t x = 0; x < l->n->nw; x++) {
                    const mworker *o = &m->w[l->n->ws[x]];
                    there |= o->wid == in.other[k].worker_id &&
                             o->rank == in.other[k].dp_rank &&
                             l->n->ws[x] != (int)i;
                }
                ck_assert_msg(there,
                              "seed %llu step %ld: listed holder not in "
                              "the model's set",
                              (unsigned long long)seed, step);
                if (k)
                    ck_assert(
                        in.other[k - 1].worker_id < in.other[k].worker_id ||
                        (in.other[k - 1].worker_id == in.other[k].worker_id &&
                         in.other[k - 1].dp_rank < in.other[k].dp_rank));
            }
            if (chaotic) continue;
            const mnode *p = l->n->prim;
            bool hp = p && p != &m->root;
            ck_assert_msg(b->tokens_hash == l->n->tok && b->has_parent == hp &&
                              b->parent_block_hash == (hp ? p->bh : 0),
                          "seed %llu step %ld: block %llu: tokens %llu parent "
                          "%d/%llu, model %llu %d/%llu",
                          (unsigned long long)seed, step,
                          (unsigned long long)l->bh,
                          (unsigned long long)b->tokens_hash, b->has_parent,
                          (unsigned long long)b->parent_block_hash,
                          (unsigned long long)l->n->tok, hp,
                          (unsigned long long)(hp ? p->bh : 0));
        }
        /* a hash the worker does not hold */
        uint64_t other = rng_next(rs) | 1;
        if (!m_look((mworker *)W, other)) {
            idx_block_info in;
            ck_assert_int_eq(
                idx_tree_block_info(t, W->wid, W->rank, other, &in), KVO_OK);
            ck_assert(!in.held && in.others == 0 && in.block.block_hash == 0);
        }
    }
    got.n = 0; /* an unknown worker holds nothing */
    ck_assert_int_eq(idx_tree_worker_blocks(t, 12345, 9, WIRE_TIER_DEVICE,
                                            collect_block, &got),
                     KVO_OK);
    ck_assert_uint_eq(got.n, 0);
}

static void compare_state(const idx_tree *t, const model *m, uint64_t seed,
                          long step) {
    idx_counters c;
    idx_tree_counters(t, &c);
    ck_assert_msg(memcmp(&c, &m->c, sizeof(c)) == 0,
                  "seed %llu step %ld: counters differ (stored %llu/%llu, "
                  "removed %llu/%llu, mismatch %llu/%llu)",
                  (unsigned long long)seed, step,
                  (unsigned long long)c.blocks_stored,
                  (unsigned long long)m->c.blocks_stored,
                  (unsigned long long)c.blocks_removed,
                  (unsigned long long)m->c.blocks_removed,
                  (unsigned long long)c.hash_mismatch,
                  (unsigned long long)m->c.hash_mismatch);
    idx_worker *w;
    size_t n;
    ck_assert_int_eq(idx_tree_workers(t, &w, &n), KVO_OK);
    size_t present = 0;
    uint64_t pairs = 0;
    for (size_t i = 0; i < m->nw; i++) {
        if (!m->w[i].present) continue;
        present++;
        pairs += m->w[i].nl;
        bool found = false;
        for (size_t j = 0; j < n; j++)
            if (w[j].worker_id == m->w[i].wid && w[j].dp_rank == m->w[i].rank) {
                found = true;
                ck_assert_msg(
                    w[j].blocks == m->w[i].nl,
                    "seed %llu step %ld: worker blocks %llu, model %zu",
                    (unsigned long long)seed, step,
                    (unsigned long long)w[j].blocks, m->w[i].nl);
            }
        ck_assert_msg(found, "seed %llu step %ld: worker missing",
                      (unsigned long long)seed, step);
    }
    ck_assert_uint_eq(n, present);
    kvo_free(w);
    idx_stats st;
    idx_tree_stats(t, &st);
    ck_assert_uint_eq(st.pairs, pairs);
}

/* ---- Random streams ----------------------------------------------------- */

static uint64_t chain_hash(uint64_t parent, uint64_t t) {
    uint64_t x = parent * 0x100000001B3ull ^ (t + 0x9E37);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    return (x ^ x >> 32) | 1; /* never 0 */
}

static void run_model(uint64_t seed, long steps, bool chaotic) {
    fprintf(stderr, "model: %s stream, seed %llu, %ld steps\n",
            chaotic ? "chaotic" : "consistent", (unsigned long long)seed,
            steps);
    uint64_t rs = seed;
    model m;
    memset(&m, 0, sizeof(m));
    idx_tree *t = tt_tree_new();
    const uint64_t wids[] = {0, 1, 7, 1ull << 63};
    for (long step = 0; step < steps; step++) {
        uint64_t wid = wids[rnd(&rs, 4)];
        uint32_t rank = (uint32_t)rnd(&rs, 2);
        uint64_t op = rnd(&rs, 100);
        int w = op < 98 ? m_worker(&m, wid, rank) : -1;
        mworker *W = w >= 0 ? &m.w[w] : NULL;
        idx_evstatus want, got;
        wire_revent ev = {.worker_id = wid, .dp_rank = rank};
        if (op < 55) {
            wire_rblock b[6];
            size_t n = rnd(&rs, 7);
            bool has_parent = rnd(&rs, 10) >= 3;
            uint64_t parent = 0;
            if (has_parent) {
                if (W->nl && rnd(&rs, 10))
                    parent = W->l[rnd(&rs, W->nl)].bh;
                else
                    parent = chaotic ? 1 + rnd(&rs, 12) : rng_next(&rs) | 1;
            }
            uint64_t prev = has_parent ? parent : 0;
            for (size_t i = 0; i < n; i++) {
                b[i].tokens_hash = 1 + rnd(&rs, chaotic ? 3 : 5);
                b[i].block_hash = chaotic ? 1 + rnd(&rs, 12)
                                          : chain_hash(prev, b[i].tokens_hash);
                prev = b[i].block_hash;
            }
            ev.type = WIRE_R_STORED;
            ev.has_parent = has_parent;
            ev.parent_hash = parent;
            ev.n_blocks = (uint32_t)n;
            ev.blocks = b;
            want = m_store(&m, w, has_parent, parent, b, n);
            ck_assert_int_eq(idx_tree_apply(t, &ev, &got), KVO_OK);
        } else if (op < 93) {
            uint64_t h[4];
            size_t n = 1 + rnd(&rs, 4);
            for (size_t i = 0; i < n; i++)
                h[i] = W->nl && rnd(&rs, 8) ? W->l[rnd(&rs, W->nl)].bh
                                            : 1 + rnd(&rs, 14);
            ev.type = WIRE_R_REMOVED;
            ev.n_removed = (uint32_t)n;
            ev.removed = h;
            want = m_remove(&m, w, h, n);
            ck_assert_int_eq(idx_tree_apply(t, &ev, &got), KVO_OK);
        } else if (op < 98) {
            ev.type = WIRE_R_CLEARED;
            m_clear(&m, w);
            want = IDX_EV_OK;
            ck_assert_int_eq(idx_tree_apply(t, &ev, &got), KVO_OK);
        } else {
            for (size_t i = 0; i < m.nw; i++)
                if (m.w[i].wid == wid && m.w[i].present) {
                    m_clear(&m, (int)i);
                    m.w[i].present = false;
                }
            ck_assert_int_eq(idx_tree_worker_remove(t, wid), KVO_OK);
            want = got = IDX_EV_OK;
            ev.type = 0;
        }
        if (ev.type) m.c.events[ev.type][want]++;
        ck_assert_msg(got == want, "seed %llu step %ld: status %s, model %s",
                      (unsigned long long)seed, step, idx_evstatus_name(got),
                      idx_evstatus_name(want));
        char msg[256] = "";
        uint64_t unreachable = 0;
        ck_assert_msg(
            idx_tree_check(t, &unreachable, msg, sizeof(msg)) == KVO_OK,
            "seed %llu step %ld: %s", (unsigned long long)seed, step, msg);
        if (!chaotic)
            ck_assert_msg(unreachable == 0,
                          "seed %llu step %ld: %llu unreachable",
                          (unsigned long long)seed, step,
                          (unsigned long long)unreachable);
        compare_state(t, &m, seed, step);
        compare_views(t, &m, chaotic, &rs, seed, step);
        idx_tree *restored = NULL;
        if (!chaotic && step % 10 == 0) {
            restored = tt_restore(t, NULL, NULL);
            tt_check(restored, true);
        }
        compare_queries(t, &m, &rs, seed, step, restored);
        idx_tree_free(restored);
    }
    idx_tree_free(t);
    m_free(&m);
}

static uint64_t seed_for(int i) {
    const char *e = getenv("KVO_MODEL_SEED");
    if (e && *e) return strtoull(e, NULL, 10) + (uint64_t)i;
    return 20240601ull + (uint64_t)i * 7919;
}

START_TEST(tree_matches_the_model_on_consistent_streams) {
    for (int i = 0; i < 4; i++) run_model(seed_for(i), 2500, false);
}
END_TEST

START_TEST(tree_matches_the_model_on_chaotic_streams) {
    for (int i = 0; i < 4; i++) run_model(seed_for(100 + i), 2500, true);
}
END_TEST

Suite *suite_model(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("random");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, tree_matches_the_model_on_consistent_streams);
    tcase_add_test(tc, tree_matches_the_model_on_chaotic_streams);
    suite_add_tcase(s, tc);
    return s;
}
