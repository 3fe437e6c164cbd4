/* helpers.c -- event builders and assertions for the indexer suites. */
#include "idx_test.h"

#include <stdlib.h>

idx_evstatus tt_store_bh(idx_tree *t, uint64_t wid, uint32_t rank,
                         const uint64_t *parent, const uint64_t *tok,
                         const uint64_t *bh, size_t n) {
    wire_rblock *b = kvo_calloc(n ? n : 1, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n; i++) b[i] = (wire_rblock){bh[i], tok[i]};
    wire_revent ev = {.worker_id = wid, .dp_rank = rank,
                      .type = WIRE_R_STORED, .has_parent = parent != NULL,
                      .parent_hash = parent ? *parent : 0,
                      .n_blocks = (uint32_t)n, .blocks = b};
    idx_evstatus st = IDX_EV_STATUS_COUNT;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    kvo_free(b);
    return st;
}

idx_evstatus tt_store(idx_tree *t, uint64_t wid, uint32_t rank,
                      const uint64_t *parent, const uint64_t *tok, size_t n) {
    uint64_t *bh = kvo_calloc(n ? n : 1, sizeof(uint64_t));
    ck_assert_ptr_nonnull(bh);
    for (size_t i = 0; i < n; i++) bh[i] = tok[i] * 100;
    idx_evstatus st = tt_store_bh(t, wid, rank, parent, tok, bh, n);
    kvo_free(bh);
    return st;
}

idx_evstatus tt_remove(idx_tree *t, uint64_t wid, uint32_t rank,
                       const uint64_t *bh, size_t n) {
    wire_revent ev = {.worker_id = wid, .dp_rank = rank,
                      .type = WIRE_R_REMOVED, .n_removed = (uint32_t)n,
                      .removed = (uint64_t *)bh};
    idx_evstatus st = IDX_EV_STATUS_COUNT;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    return st;
}

idx_evstatus tt_clear(idx_tree *t, uint64_t wid, uint32_t rank) {
    wire_revent ev = {.worker_id = wid, .dp_rank = rank,
                      .type = WIRE_R_CLEARED};
    idx_evstatus st = IDX_EV_STATUS_COUNT;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    return st;
}

uint32_t tt_score(idx_tree *t, const uint64_t *q, size_t n, uint64_t wid,
                  uint32_t rank) {
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, q, n, &s), KVO_OK);
    uint32_t r = 0;
    for (size_t i = 0; i < s.n; i++) {
        ck_assert_uint_gt(s.v[i].blocks, 0);
        if (s.v[i].worker_id == wid && s.v[i].dp_rank == rank) r = s.v[i].blocks;
    }
    idx_scores_fini(&s);
    return r;
}

size_t tt_nscores(idx_tree *t, const uint64_t *q, size_t n) {
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, q, n, &s), KVO_OK);
    size_t k = s.n;
    idx_scores_fini(&s);
    return k;
}

uint64_t tt_blocks(const idx_tree *t, uint64_t wid, uint32_t rank) {
    idx_worker *w;
    size_t n;
    ck_assert_int_eq(idx_tree_workers(t, &w, &n), KVO_OK);
    uint64_t r = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (w[i].worker_id == wid && w[i].dp_rank == rank) r = w[i].blocks;
    kvo_free(w);
    return r;
}

void tt_check(const idx_tree *t, bool strict) {
    char msg[256] = "";
    uint64_t unreachable = 0;
    kvo_status s = idx_tree_check(t, &unreachable, msg, sizeof(msg));
    ck_assert_msg(s == KVO_OK, "invariant: %s", msg);
    if (strict)
        ck_assert_msg(unreachable == 0, "%llu unreachable nodes",
                      (unsigned long long)unreachable);
}
