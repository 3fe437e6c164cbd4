/* test_tree: the radix tree against Dynamo's own radix-tree cases
 * (lib/kv-router/src/radix_tree.rs tests) and the corners of DESIGN §7. */
#define IDX_TREE_LAYOUT /* the table test reads a table's fields */
#include "idx_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define Q(...) U64S(__VA_ARGS__), NARGS(__VA_ARGS__)

/* Dynamo test_radix_tree: two workers sharing a prefix. */
START_TEST(two_workers_share_a_prefix) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 3);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 3);
    ck_assert_uint_eq(tt_nodes(t), 3);

    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(1, 4, 5)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 3);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 1, 0), 1);
    ck_assert_uint_eq(tt_blocks(t, 1, 0), 3);
    ck_assert_uint_eq(tt_nodes(t), 5);
    tt_check(t, true);

    /* removing a leaf leaves it, empty, under its parent */
    ck_assert_int_eq(tt_remove(t, 1, 0, Q(500)), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 1, 0), 2);
    ck_assert_uint_eq(tt_nodes(t), 5);
    ck_assert_uint_eq(tt_score(t, Q(1, 4, 5), 1, 0), 2);
    /* removing its parent detaches it, and nothing refers to it any more */
    ck_assert_int_eq(tt_remove(t, 1, 0, Q(400)), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 1, 0), 1);
    ck_assert_uint_eq(tt_nodes(t), 4);
    tt_check(t, true);

    ck_assert_int_eq(tt_store(t, 1, 0, U64S(100), Q(2, 6, 7)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 3);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 1, 0), 2);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 6, 7), 1, 0), 4);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 6, 7), 0, 0), 2);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 3);
    ck_assert_uint_eq(tt_blocks(t, 1, 0), 4);
    ck_assert_uint_eq(tt_pairs(t), 7);
    tt_tree_done(t);
}
END_TEST

/* Dynamo test_radix_tree_apply_event_errors. */
START_TEST(unknown_parent_rejects_the_whole_store) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(12345), Q(1, 2, 3)),
                     IDX_EV_PARENT_NOT_FOUND);
    ck_assert_uint_eq(tt_nscores(t, Q(1, 2, 3)), 0);
    ck_assert_uint_eq(tt_nodes(t), 0);
    /* the worker is known from then on (Dynamo creates its lookup map) */
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 0);
    /* the parent must be in THAT worker's map */
    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(1)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(2)),
                     IDX_EV_PARENT_NOT_FOUND);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 0);
    idx_counters c;
    idx_tree_counters(t, &c);
    ck_assert_uint_eq(c.events[WIRE_R_STORED][IDX_EV_PARENT_NOT_FOUND], 2);
    ck_assert_uint_eq(c.events[WIRE_R_STORED][IDX_EV_OK], 1);
    tt_tree_done(t);
}
END_TEST

START_TEST(unknown_removed_hashes_are_skipped_and_counted) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(100, 200, 300)),
                     IDX_EV_BLOCK_NOT_FOUND);
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    /* the known hashes in a batch are applied, the unknown one skipped */
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(300, 999, 200)),
                     IDX_EV_BLOCK_NOT_FOUND);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 1);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 1);
    idx_counters c;
    idx_tree_counters(t, &c);
    ck_assert_uint_eq(c.events[WIRE_R_REMOVED][IDX_EV_BLOCK_NOT_FOUND], 2);
    ck_assert_uint_eq(c.blocks_not_found, 4);
    ck_assert_uint_eq(c.blocks_removed, 2);
    tt_tree_done(t);
}
END_TEST

static kvo_status count_event(void *ctx, const wire_revent *ev) {
    (void)ev;
    (*(size_t *)ctx)++;
    return KVO_OK;
}

/* Dynamo: a block whose hash is its own parent's is linked under itself,
 * then the store fails with InvalidBlockSequence; earlier blocks stay. */
START_TEST(self_referencing_block_is_invalid_and_keeps_dynamos_self_edge) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(1, 2, 3)),
                     IDX_EV_INVALID_BLOCK);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 1);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 1);
    /* the self edge: 1 -> 1 -> 1 ... */
    ck_assert_uint_eq(tt_score(t, Q(1, 1, 1, 1, 2), 0, 0), 4);
    /* storing through it again meets the self edge itself */
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(1)), IDX_EV_INVALID_BLOCK);
    /* a valid block before the bad one is applied */
    uint64_t tok[] = {5, 1}, bh[] = {500, 100};
    ck_assert_int_eq(tt_store_bh(t, 0, 0, U64S(100), tok, bh, 2),
                     IDX_EV_OK); /* 1 -> 5 -> (1 relinked: not self) */
    idx_counters c;
    idx_tree_counters(t, &c);
    ck_assert_uint_eq(c.events[WIRE_R_STORED][IDX_EV_INVALID_BLOCK], 2);
    tt_check(t, false);
    /* dumping the cycles terminates: one event per edge (root->1, 1->1,
     * 1->5, 5->1), each held by worker 0 */
    size_t events = 0;
    ck_assert_int_eq(idx_tree_dump(t, count_event, &events), KVO_OK);
    ck_assert_uint_eq(events, 4);
    idx_tree_free(t);
}
END_TEST

/* Dynamo test_clear_all_blocks (one rank, so per-rank clearing agrees). */
START_TEST(cleared_drops_every_block_of_the_worker) {
    idx_tree *t = tt_tree_new();
    ck_assert_uint_eq(tt_nscores(t, Q(0)), 0);
    ck_assert_int_eq(tt_clear(t, 0, 0), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 0);

    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(0, 1, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(0, 2, 3)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(0), 0, 0), 1);
    ck_assert_uint_eq(tt_score(t, Q(0), 1, 0), 1);
    ck_assert_int_eq(tt_clear(t, 0, 0), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 0);
    ck_assert_uint_eq(tt_nscores(t, Q(0, 2)), 1);
    ck_assert_uint_eq(tt_score(t, Q(0, 2), 1, 0), 2);
    ck_assert_uint_eq(tt_nscores(t, Q(0, 1, 3)), 1);
    ck_assert_uint_eq(tt_score(t, Q(0, 1, 3), 1, 0), 1);
    tt_check(t, true);

    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(4, 5)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(4, 5), 0, 0), 2);
    ck_assert_int_eq(tt_clear(t, 0, 0), IDX_EV_OK);
    ck_assert_int_eq(tt_clear(t, 0, 0), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 0);
    ck_assert_int_eq(tt_clear(t, 1, 0), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 1, 0), 0);
    ck_assert_uint_eq(tt_pairs(t), 0);
    tt_check(t, true);

    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(6)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(6)), IDX_EV_OK);
    ck_assert_int_eq(idx_tree_worker_remove(t, 0), KVO_OK);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), UINT64_MAX);
    ck_assert_uint_eq(tt_nscores(t, Q(6)), 1);
    ck_assert_uint_eq(tt_score(t, Q(6), 1, 0), 1);
    ck_assert_int_eq(idx_tree_worker_remove(t, 2), KVO_OK); /* unknown */
    ck_assert_uint_eq(tt_blocks(t, 1, 0), 1);
    tt_tree_done(t);
}
END_TEST

/* Dynamo test_remove_worker_verifies_hash_removal. */
START_TEST(remove_worker_forgets_every_rank) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 0, 1, NULL, Q(1, 2)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 2, 0, NULL, Q(1, 4, 5)), IDX_EV_OK);
    ck_assert_uint_eq(tt_nscores(t, Q(1)), 4);
    ck_assert_int_eq(idx_tree_worker_remove(t, 0), KVO_OK);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), UINT64_MAX);
    ck_assert_uint_eq(tt_blocks(t, 0, 1), UINT64_MAX);
    ck_assert_uint_eq(tt_nscores(t, Q(1, 2, 3)), 2);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 1, 0), 3);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 2, 0), 1);
    idx_worker *w;
    size_t n;
    ck_assert_int_eq(idx_tree_workers(t, &w, &n), KVO_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(w[0].worker_id, 1);
    ck_assert_uint_eq(w[1].worker_id, 2);
    kvo_free(w);
    /* a removed worker comes back on its next event */
    ck_assert_int_eq(tt_store(t, 0, 1, NULL, Q(1)), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 0, 1), 1);
    tt_tree_done(t);
}
END_TEST

START_TEST(dp_ranks_are_independent_workers) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 7, 0, NULL, Q(1, 2)), IDX_EV_OK);
    /* rank 1 of the same worker does not hold rank 0's parent */
    ck_assert_int_eq(tt_store(t, 7, 1, U64S(200), Q(3)),
                     IDX_EV_PARENT_NOT_FOUND);
    ck_assert_int_eq(tt_store(t, 7, 1, NULL, Q(1)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2), 7, 0), 2);
    ck_assert_uint_eq(tt_score(t, Q(1, 2), 7, 1), 1);
    ck_assert_int_eq(tt_remove(t, 7, 1, Q(200)), IDX_EV_BLOCK_NOT_FOUND);
    /* cleared is per (worker_id, dp_rank) (DESIGN §7) */
    ck_assert_int_eq(tt_clear(t, 7, 1), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2), 7, 0), 2);
    ck_assert_uint_eq(tt_score(t, Q(1, 2), 7, 1), 0);
    ck_assert_uint_eq(tt_blocks(t, 7, 1), 0);
    /* scores come sorted by worker_id then dp_rank */
    ck_assert_int_eq(tt_store(t, 3, 5, NULL, Q(1)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 7, 1, NULL, Q(1)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 3, 2, NULL, Q(1)), IDX_EV_OK);
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, Q(1, 2), &s), KVO_OK);
    ck_assert_uint_eq(s.isl_blocks, 2);
    ck_assert_uint_eq(s.n, 4);
    ck_assert(s.v[0].worker_id == 3 && s.v[0].dp_rank == 2 &&
              s.v[0].blocks == 1);
    ck_assert(s.v[1].worker_id == 3 && s.v[1].dp_rank == 5);
    ck_assert(s.v[2].worker_id == 7 && s.v[2].dp_rank == 0 &&
              s.v[2].blocks == 2);
    ck_assert(s.v[3].worker_id == 7 && s.v[3].dp_rank == 1 &&
              s.v[3].blocks == 1);
    idx_scores_fini(&s);
    tt_tree_done(t);
}
END_TEST

START_TEST(lora_and_base_prompts_do_not_collide) {
    uint64_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = 1000 + (uint64_t)i;
    uint64_t base[4], lora[4], salted[4];
    ck_assert_uint_eq(idx_prompt_hash(tok, 64, 16, NULL, NULL, base), 4);
    ck_assert_uint_eq(idx_prompt_hash(tok, 64, 16, "sql-adapter", NULL, lora),
                      4);
    ck_assert_uint_eq(idx_prompt_hash(tok, 64, 16, NULL, "s1", salted), 4);
    for (int i = 0; i < 4; i++) ck_assert(base[i] != lora[i]);
    /* the salt seeds block 0 only, as vLLM salts block 0's extra keys only;
     * the rest differ through the chain under it */
    ck_assert(base[0] != salted[0]);
    for (int i = 1; i < 4; i++) ck_assert(base[i] == salted[i]);
    /* DESIGN §5 vector: [1,2,3,4] -> 14643705804678351452 */
    uint64_t four[] = {1, 2, 3, 4}, h;
    ck_assert_uint_eq(idx_prompt_hash(four, 4, 4, NULL, NULL, &h), 1);
    ck_assert_uint_eq(h, 14643705804678351452ull);
    ck_assert_uint_eq(idx_prompt_hash(four, 3, 4, NULL, NULL, &h), 0);

    idx_tree *t = tt_tree_new();
    uint64_t bh[4] = {11, 12, 13, 14}, lbh[4] = {21, 22, 23, 24};
    ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, base, bh, 4), IDX_EV_OK);
    ck_assert_int_eq(tt_store_bh(t, 2, 0, NULL, lora, lbh, 4), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, base, 4, 1, 0), 4);
    ck_assert_uint_eq(tt_score(t, base, 4, 2, 0), 0);
    ck_assert_uint_eq(tt_score(t, lora, 4, 2, 0), 4);
    ck_assert_uint_eq(tt_score(t, lora, 4, 1, 0), 0);
    ck_assert_uint_eq(tt_nscores(t, salted, 4), 0);
    idx_tree_free(t);
}
END_TEST

START_TEST(dump_and_restore_give_the_same_answers) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3, 4)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(1, 2, 5)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 1, 3, NULL, Q(9, 8)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 2, 0, U64S(100), Q(2, 3)),
                     IDX_EV_PARENT_NOT_FOUND);
    ck_assert_int_eq(tt_store(t, 2, 0, NULL, Q(1)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 2, 0, U64S(100), Q(2, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(400)), IDX_EV_OK);
    ck_assert_int_eq(tt_remove(t, 1, 0, Q(200)), IDX_EV_OK); /* 5 orphaned */

    size_t events, rejected;
    idx_tree *r = tt_restore(t, &events, &rejected);
    /* one event per (edge, worker of the child) */
    ck_assert_uint_eq(events, 3 + 2 + 2 + 0 + 1 + 1 + 1); /* 1,2,3,4,5,9,8 */
    /* worker 1 still holds 5 but no longer its parent 2: that event cannot
     * be restored, and could never score (a gap at block 1) */
    ck_assert_uint_eq(rejected, 1);
    const uint64_t qs[][4] = {
        {1, 2, 3, 4}, {1, 2, 5, 0}, {9, 8, 0, 0}, {1, 0, 0, 0}, {2, 3, 0, 0}};
    for (size_t i = 0; i < 5; i++) tt_same_answers(t, r, qs[i], 4);
    tt_tree_done(r);
    idx_tree_free(t);
}
END_TEST

START_TEST(duplicate_stores_are_idempotent) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(2, 3)), IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 3);
    ck_assert_uint_eq(tt_nodes(t), 3);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 3);
    /* one removal is enough: there are no per-copy counts in the index */
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(300)), IDX_EV_OK);
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(300)), IDX_EV_BLOCK_NOT_FOUND);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 2);
    tt_tree_done(t);
}
END_TEST

START_TEST(a_node_losing_its_last_worker_detaches_its_children) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(1)), IDX_EV_OK);
    /* node 1 keeps worker 1: its children stay */
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(100)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 1, 0), 1);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 0); /* gap at block 0 */
    ck_assert_uint_eq(tt_nscores(t, Q(1, 2, 3)), 1);
    /* now empty: 2 and 3 are cut off, but worker 0 still maps them */
    ck_assert_int_eq(tt_remove(t, 1, 0, Q(100)), IDX_EV_OK);
    ck_assert_uint_eq(tt_nscores(t, Q(1, 2, 3)), 0);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 2);
    tt_check(t, true);
    /* re-storing 1 reuses the emptied node; the children stay cut off */
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3), 0, 0), 1);
    /* a store may hang below a detached node: its parent is in the map */
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(300), Q(4)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3, 4), 0, 0), 1);
    /* storing 2 under 1 re-links the detached node with its subtree */
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(2)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3, 4), 0, 0), 4);
    ck_assert_uint_eq(tt_nodes(t), 4);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 4);
    tt_tree_done(t);
}
END_TEST

START_TEST(remove_mid_chain_then_restore) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3, 4)), IDX_EV_OK);
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(200)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3, 4), 0, 0), 1);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 3);
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(2)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3, 4), 0, 0), 2);
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(200), Q(3, 4)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 2, 3, 4), 0, 0), 4);
    ck_assert_uint_eq(tt_nodes(t), 4);
    tt_check(t, true);
    /* removing everything deepest first leaves the first node, empty, under
     * the root (as Dynamo does) */
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(400, 300, 200, 100)), IDX_EV_OK);
    ck_assert_uint_eq(tt_pairs(t), 0);
    ck_assert_uint_eq(tt_nodes(t), 1);
    ck_assert_uint_eq(tt_nscores(t, Q(1)), 0);
    tt_tree_done(t);
}
END_TEST

/* Many workers on one chain: worker sets grow through every size class and
 * shrink back; lookup entries move between inline and alias forms. */
START_TEST(worker_sets_grow_and_shrink) {
    idx_tree *t = tt_tree_new();
    for (uint64_t w = 0; w < 70; w++) {
        ck_assert_int_eq(
            tt_store(t, w * 7919 % 101, (uint32_t)(w % 3), NULL, Q(1, 2, 3)),
            IDX_EV_OK);
        tt_check(t, true);
    }
    ck_assert_uint_eq(tt_nscores(t, Q(1, 2, 3)), 70);
    ck_assert_uint_eq(tt_pairs(t), 210);
    for (uint64_t w = 0; w < 70; w++) {
        uint64_t wid = (w * 37) % 70 * 7919 % 101;
        uint32_t rank = (uint32_t)((w * 37) % 70 % 3);
        ck_assert_int_eq(tt_remove(t, wid, rank, Q(300, 200)), IDX_EV_OK);
        tt_check(t, true);
    }
    ck_assert_uint_eq(tt_nscores(t, Q(1)), 70);
    ck_assert_uint_eq(tt_nscores(t, Q(1, 2)), 70);
    for (uint64_t w = 0; w < 70; w++) {
        ck_assert_int_eq(
            tt_remove(t, w * 7919 % 101, (uint32_t)(w % 3), Q(100)), IDX_EV_OK);
        tt_check(t, true);
    }
    ck_assert_uint_eq(tt_pairs(t), 0);
    ck_assert_uint_eq(tt_nodes(t), 1);
    idx_tree_free(t);
}
END_TEST

/* A node named by 600 lookup entries (one worker storing many block hashes
 * with the same tokens under one parent: more than a lean meta word
 * counts) is freed only when the last of them goes. */
START_TEST(a_node_counts_hundreds_of_references) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1)), IDX_EV_OK);
    for (uint64_t i = 0; i < 600; i++) {
        uint64_t bh = 1000 + i;
        ck_assert_int_eq(tt_store_bh(t, 0, 0, U64S(100), U64S(7), &bh, 1),
                         IDX_EV_OK);
    }
    idx_counters c;
    idx_tree_counters(t, &c);
    ck_assert_uint_eq(c.hash_mismatch, 599);
    ck_assert_uint_eq(tt_blocks(t, 0, 0), 601);
    ck_assert_uint_eq(tt_nodes(t), 2);
    tt_check(t, true);
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(100)), IDX_EV_OK); /* detach */
    ck_assert_uint_eq(tt_nodes(t), 2);
    for (uint64_t i = 0; i < 600; i++) {
        uint64_t bh = 1000 + (i * 7) % 600;
        ck_assert_int_eq(tt_remove(t, 0, 0, &bh, 1), IDX_EV_OK);
        if (i % 50 == 0) tt_check(t, true);
    }
    ck_assert_uint_eq(tt_nodes(t), 1);
    tt_tree_done(t);
}
END_TEST

/* A node's word moves between its forms as the tree changes around it:
 * a branch (a sibling, a parent elsewhere) makes it far, a second worker
 * fat, and a detach that cuts a far node's links makes it lean again; its
 * fields survive each move (idx_tree_check after every step). */
START_TEST(a_branch_node_moves_between_lean_far_and_fat) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_uint_eq(t->fat_live, 0); /* a chain: lean all along */
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(4, 5)), IDX_EV_OK);
    ck_assert(meta_far(META(t, 4))); /* parent 1, sibling 2 */
    ck_assert_uint_eq(t->far.len, 1);
    ck_assert(!(META(t, 5) & M_FAT) && !meta_far(META(t, 5)));
    ck_assert_uint_eq(tt_score(t, Q(1, 4, 5), 0, 0), 3);
    tt_check(t, true);

    /* a second worker on node 4: fat, its links taken from the far record */
    ck_assert_int_eq(tt_store(t, 1, 0, NULL, Q(1, 4)), IDX_EV_OK);
    ck_assert(META(t, 4) & M_FAT);
    ck_assert_uint_eq(t->far.len, 0);
    ck_assert_uint_eq(nd_parent(t, 4), 1);
    ck_assert_uint_eq(nd_next(t, 4), 2);
    ck_assert_uint_eq(tt_score(t, Q(1, 4, 5), 0, 0), 3);
    ck_assert_uint_eq(tt_score(t, Q(1, 4, 5), 1, 0), 2);
    tt_check(t, true);
    tt_tree_done(t);

    /* a far node cut from its parent: lean again, its record back */
    t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1, 2, 3)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(4)), IDX_EV_OK);
    ck_assert(meta_far(META(t, 4)));
    ck_assert_int_eq(tt_remove(t, 0, 0, Q(100)), IDX_EV_OK); /* detach */
    ck_assert(!(META(t, 4) & M_FAT) && !meta_far(META(t, 4)));
    ck_assert_uint_eq(nd_parent(t, 4), NIL);
    ck_assert_uint_eq(t->far.len, 0);
    tt_check(t, true);
    /* stored again under a new block 1: far again, and found */
    ck_assert_int_eq(tt_store(t, 0, 0, NULL, Q(1)), IDX_EV_OK);
    ck_assert_int_eq(tt_store(t, 0, 0, U64S(100), Q(4)), IDX_EV_OK);
    ck_assert_uint_eq(tt_score(t, Q(1, 4), 0, 0), 2);
    tt_check(t, true);
    tt_tree_done(t);
}
END_TEST

/* A probe of the edges table compares a candidate's tokens_hash only: a
 * tag match must then mean the same parent, so for one tokens_hash no two
 * parents may share a tag (edge_hash). Checked over the first 2^20 parent
 * indexes of a few tokens hashes. */
static int u32_cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

START_TEST(edge_tags_tell_parents_apart) {
    enum { PARENTS = 1 << 20 };
    const uint64_t toks[] = {0, 1, 0x9E3779B97F4A7C15ull, ~0ull};
    uint32_t *tags = malloc(PARENTS * sizeof(uint32_t));
    ck_assert_ptr_nonnull(tags);
    for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
        for (uint32_t p = 0; p < PARENTS; p++)
            tags[p] = tab_hash_tag(edge_hash(toks[k], p));
        qsort(tags, PARENTS, sizeof(uint32_t), u32_cmp);
        for (uint32_t i = 1; i < PARENTS; i++)
            ck_assert_msg(tags[i] != tags[i - 1],
                          "tokens_hash %016llx: two parents share tag %08x",
                          (unsigned long long)toks[k], tags[i]);
    }
    free(tags);
}
END_TEST

/* Keys crafted to share one hash (idx_tree.c mixes the worker slot in as
 * bh ^ slot * 0x9E3779B97F4A7C15, so these collide exactly): both buckets
 * fill, the rest goes to the stash, and every answer stays right while the
 * table grows around them. */
START_TEST(colliding_keys_overflow_into_the_stash) {
    idx_tree *t = tt_tree_new();
    const uint64_t X = 0x0123456789abcdefull;
    for (uint64_t k = 0; k < 40; k++) {
        uint64_t bh = X ^ (k * 0x9E3779B97F4A7C15ull);
        ck_assert_int_eq(tt_store_bh(t, 100 + k, 0, NULL, U64S(5), &bh, 1),
                         IDX_EV_OK);
        tt_check(t, true);
    }
    /* grow the table past the colliding keys */
    for (uint64_t i = 0; i < 3000; i++) {
        uint64_t bh = 777000 + i;
        ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, U64S(6 + i), &bh, 1),
                         IDX_EV_OK);
    }
    tt_check(t, true);
    ck_assert_uint_eq(tt_nscores(t, Q(5)), 40);
    for (uint64_t k = 0; k < 40; k += 2) {
        uint64_t bh = X ^ (k * 0x9E3779B97F4A7C15ull);
        ck_assert_int_eq(tt_remove(t, 100 + k, 0, &bh, 1), IDX_EV_OK);
        ck_assert_int_eq(tt_remove(t, 100 + k, 0, &bh, 1),
                         IDX_EV_BLOCK_NOT_FOUND);
        tt_check(t, true);
    }
    ck_assert_uint_eq(tt_nscores(t, Q(5)), 20);
    for (uint64_t k = 1; k < 40; k += 2) {
        ck_assert_uint_eq(tt_score(t, Q(5), 100 + k, 0), 1);
        ck_assert_uint_eq(tt_blocks(t, 100 + k, 0), 1);
    }
    for (uint64_t k = 1; k < 40; k += 2)
        ck_assert_int_eq(tt_clear(t, 100 + k, 0), IDX_EV_OK);
    tt_check(t, true);
    ck_assert_uint_eq(tt_nscores(t, Q(5)), 0);
    ck_assert_uint_eq(tt_pairs(t), 3000);
    idx_tree_free(t);
}
END_TEST

static uint64_t splitmix(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ z >> 27) * 0x94D049BB133111EBull;
    return z ^ z >> 31;
}

/* Tables at real sizes (several in-place growths, kicks, spills): an
 * engine-like stream of prompts sharing prefixes over 32 workers, removed
 * deepest first, with clears; the walker at checkpoints, and the tree
 * answers like its own dump restored. */
START_TEST(large_streams_keep_every_invariant) {
    idx_tree *t = tt_tree_new();
    uint64_t rs = 99;
    enum { PROMPTS = 3000, LEN = 48 };
    static uint64_t tok[PROMPTS][LEN], bh[PROMPTS][LEN];
    for (int p = 0; p < PROMPTS; p++) {
        int shared = p >= 40 && p % 5 ? (int)(splitmix(&rs) % 24) : 0;
        uint64_t parent = 0;
        for (int d = 0; d < LEN; d++) {
            tok[p][d] = d < shared ? tok[p % 40][d] : splitmix(&rs);
            bh[p][d] =
                d < shared ? bh[p % 40][d] : (parent * 31 + tok[p][d]) | 1;
            parent = bh[p][d];
        }
    }
    static uint8_t held[32][PROMPTS];
    uint64_t ops = 0, next_check = 20000;
    while (ops < 400000) {
        uint64_t w = splitmix(&rs) % 32;
        int p = (int)(splitmix(&rs) % PROMPTS);
        uint64_t r = splitmix(&rs) % 100;
        if (r < 60) {
            ck_assert_int_eq(tt_store_bh(t, w / 2, (uint32_t)(w % 2), NULL,
                                         tok[p], bh[p], LEN),
                             IDX_EV_OK);
            held[w][p] = 1;
            ops += LEN;
        } else if (r < 99) {
            uint64_t rev[LEN];
            for (int d = 0; d < LEN; d++) rev[d] = bh[p][LEN - 1 - d];
            tt_remove(t, w / 2, (uint32_t)(w % 2), rev, LEN);
            for (int q = p % 40; q < PROMPTS; q += 40)
                held[w][q] = 0; /* shared prefixes */
            ops += LEN;
        } else {
            ck_assert_int_eq(tt_clear(t, w / 2, (uint32_t)(w % 2)), IDX_EV_OK);
            memset(held[w], 0, PROMPTS);
        }
        if (ops >= next_check) {
            next_check += 40000;
            tt_check(t, true);
            idx_tree *restored = tt_restore(t, NULL, NULL);
            tt_check(restored, true);
            for (int q = 0; q < 200; q++) {
                int qp = (int)(splitmix(&rs) % PROMPTS);
                tt_same_answers(t, restored, tok[qp], LEN);
                /* a worker that stored the prompt and has not removed or
                 * cleared it scores all of it, whatever others removed */
                for (uint64_t ww = 0; ww < 32; ww++)
                    if (held[ww][qp])
                        ck_assert_msg(tt_score(t, tok[qp], LEN, ww / 2,
                                               (uint32_t)(ww % 2)) == LEN,
                                      "worker %llu lost prompt %d",
                                      (unsigned long long)ww, qp);
            }
            idx_tree_free(restored);
        }
    }
    idx_tree_free(t);
}
END_TEST

static kvo_status collect2(void *ctx, const idx_block *b) {
    idx_block *v = ctx;
    size_t i = v[0].block_hash == 0 ? 0 : 1; /* the test's blocks are != 0 */
    ck_assert_uint_lt(i, 2);
    v[i] = *b;
    return KVO_OK;
}

/* The oracle's views: a worker's blocks with their parents, and who else
 * holds a block, listed by worker id whatever order the workers came in;
 * a parent that loses its last worker leaves its child parentless. */
START_TEST(worker_views_give_parents_and_other_holders) {
    idx_tree *t = tt_tree_new();
    for (uint64_t w = 12; w-- > 0;) /* slots in descending worker order */
        ck_assert_int_eq(tt_store(t, 100 + w, 0, NULL, U64S(1, 2), 2),
                         IDX_EV_OK);
    idx_block_info in;
    ck_assert_int_eq(idx_tree_block_info(t, 105, 0, 200, &in), KVO_OK);
    ck_assert(in.held && in.in_set);
    ck_assert_uint_eq(in.block.block_hash, 200);
    ck_assert_uint_eq(in.block.tokens_hash, 2);
    ck_assert(in.block.has_parent);
    ck_assert_uint_eq(in.block.parent_block_hash, 100);
    ck_assert_uint_eq(in.node_block_hash, 200);
    ck_assert_uint_eq(in.others, 11);
    ck_assert_uint_eq(in.listed, IDX_INFO_OTHERS);
    const uint64_t want[IDX_INFO_OTHERS] = {100, 101, 102, 103,
                                            104, 106, 107, 108};
    for (int i = 0; i < IDX_INFO_OTHERS; i++) {
        ck_assert_uint_eq(in.other[i].worker_id, want[i]);
        ck_assert_uint_eq(in.other[i].dp_rank, 0);
    }
    ck_assert_int_eq(idx_tree_block_info(t, 105, 1, 200, &in), KVO_OK);
    ck_assert(!in.held); /* another rank */
    ck_assert_int_eq(idx_tree_block_info(t, 105, 0, 300, &in), KVO_OK);
    ck_assert(!in.held);

    idx_block b[2];
    memset(b, 0, sizeof(b));
    ck_assert_int_eq(
        idx_tree_worker_blocks(t, 105, 0, WIRE_TIER_DEVICE, collect2, b),
        KVO_OK);
    if (b[0].block_hash == 200) {
        idx_block x = b[0];
        b[0] = b[1];
        b[1] = x;
    }
    ck_assert_uint_eq(b[0].block_hash, 100);
    ck_assert_uint_eq(b[0].tokens_hash, 1);
    ck_assert(!b[0].has_parent); /* a child of the root */
    ck_assert_uint_eq(b[1].block_hash, 200);
    ck_assert(b[1].has_parent);
    ck_assert_uint_eq(b[1].parent_block_hash, 100);

    for (uint64_t w = 0; w < 12; w++) /* block 100 loses every worker */
        ck_assert_int_eq(tt_remove(t, 100 + w, 0, U64S(100), 1), IDX_EV_OK);
    ck_assert_int_eq(idx_tree_block_info(t, 105, 0, 200, &in), KVO_OK);
    ck_assert(in.held && !in.block.has_parent); /* detached */
    ck_assert_uint_eq(in.block.parent_block_hash, 0);
    ck_assert_uint_eq(in.others, 11);
    tt_tree_done(t);
}
END_TEST

/* Past HUGE_BYTES (2 MiB) the node slabs grow by huge pages and the tables
 * are mapped memory (idx_mem_alloc), not kvo_malloc'd: a tree of 2,400
 * prompts x 128 blocks (307,200 nodes: slabs of 6 MiB, a lookup table over
 * 2 MiB) answers every prompt in full, keeps every invariant, and empties
 * down to the root's emptied children. */
START_TEST(large_trees_live_in_mapped_memory) {
    idx_tree *t = tt_tree_new();
    enum { PROMPTS = 2400, LEN = 128 };
    uint64_t rs = 7, tok[LEN], bh[LEN];
    for (int p = 0; p < PROMPTS; p++) {
        for (int d = 0; d < LEN; d++) {
            tok[d] = splitmix(&rs);
            bh[d] = splitmix(&rs);
        }
        ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, tok, bh, LEN), IDX_EV_OK);
    }
    idx_stats st;
    idx_tree_stats(t, &st);
    ck_assert_uint_eq(st.nodes, (uint64_t)PROMPTS * LEN);
    ck_assert_uint_gt(st.bytes, (uint64_t)6 << 20); /* 3 x HUGE_BYTES */
    tt_check(t, true);
    rs = 7;
    for (int p = 0; p < PROMPTS; p++) {
        for (int d = 0; d < LEN; d++) {
            tok[d] = splitmix(&rs);
            bh[LEN - 1 - d] = splitmix(&rs);
        }
        ck_assert_uint_eq(tt_score(t, tok, LEN, 1, 0), LEN);
        ck_assert_int_eq(tt_remove(t, 1, 0, bh, LEN), IDX_EV_OK);
    }
    ck_assert_uint_eq(tt_pairs(t), 0);
    /* Dynamo: an emptied child of the root stays under it, with no worker */
    ck_assert_uint_eq(tt_nodes(t), PROMPTS);
    tt_tree_done(t);
}
END_TEST

/* A tree of one block holds a few pages, not a huge page per slab: the
 * slabs grow by pages (doubling) up to 2 MiB. */
START_TEST(a_small_tree_holds_a_few_pages) {
    idx_tree *t = tt_tree_new();
    uint64_t tok = 7, bh = 8;
    ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, &tok, &bh, 1), IDX_EV_OK);
    idx_stats st;
    idx_tree_stats(t, &st);
    ck_assert_uint_lt(st.bytes, (uint64_t)64 << 10);
    tt_tree_done(t);
}
END_TEST

/* Freed nodes are taken back lowest first, so chains stored into a tree
 * emptied in any order lie in consecutive nodes again (a query walks them
 * as runs), and the tree does not grow. 4,000 chains of 80 blocks under a
 * shared block span every level of the free bitmap (its top level has a
 * bit per 2^18 nodes). */
START_TEST(freed_nodes_are_reused_lowest_first) {
    enum { CHAINS = 4000, LEN = 80 };
    idx_tree *t = tt_tree_new();
    uint64_t top_tok = 1, top = 100, tok[LEN], bh[LEN];
    for (int pass = 0; pass < 2; pass++) {
        ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, &top_tok, &top, 1),
                         IDX_EV_OK);
        for (uint32_t c = 0; c < CHAINS; c++) {
            uint32_t k = pass ? (c * 7919u) % CHAINS : c; /* another order */
            for (uint32_t i = 0; i < LEN; i++) {
                tok[i] = 2 + (uint64_t)k * LEN + i;
                bh[i] = tok[i] * 100;
            }
            ck_assert_int_eq(tt_store_bh(t, 1, 0, &top, tok, bh, LEN),
                             IDX_EV_OK);
        }
        ck_assert_uint_eq(t->nd_len, 2 + CHAINS * LEN);
        for (uint32_t n = 1; n < t->nd_len; n++) {
            uint32_t child = nd_child(t, n);
            if (child == NIL || (child & TAG) || nd_next(t, child) != NIL)
                continue; /* not one child */
            ck_assert_msg(child == n + 1, "pass %d: node %u's child is %u",
                          pass, n, child);
        }
        /* records: the shared block's (4,000 children: fat) and those of
         * the chains' first blocks but one (siblings: far); every other
         * node is lean, its links in its word */
        ck_assert_uint_eq(t->fat_live, 1);
        ck_assert_uint_eq(t->far.len, CHAINS - 1);
        tt_check(t, true);
        /* empty it block i of every chain at a time, first blocks first
         * (each detaches its chain's rest), and the shared block last */
        for (uint32_t i = 0; i < LEN; i++)
            for (uint32_t c = 0; c < CHAINS; c++) {
                uint64_t b = (2 + (uint64_t)c * LEN + i) * 100;
                ck_assert_int_eq(tt_remove(t, 1, 0, &b, 1), IDX_EV_OK);
            }
        ck_assert_int_eq(tt_remove(t, 1, 0, &top, 1), IDX_EV_OK);
        ck_assert_uint_eq(tt_pairs(t), 0);
        ck_assert_uint_eq(tt_nodes(t), 1); /* the shared block, empty */
    }
    tt_tree_done(t);
}
END_TEST

/* The process's address space now, in bytes (VmSize), or 0. */
static unsigned long long vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmSize: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb << 10;
}

/* Under a ulimit -v a tree still works: its slabs (tens of GiB of address
 * space each when they can have it) reserve what the kernel gives. In a
 * child process, so that the limit stays there; exit codes say what
 * failed. */
START_TEST(a_tree_works_under_an_address_space_limit) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        unsigned long long vm = vm_size();
        struct rlimit rl = {vm + (1ull << 30), vm + (1ull << 30)};
        if (!vm || setrlimit(RLIMIT_AS, &rl)) _exit(2);
        idx_tree *t = NULL;
        if (idx_tree_new(&t) != KVO_OK) _exit(3);
        enum { LEN = 1000 };
        uint64_t tok[LEN], bh[LEN];
        for (int i = 0; i < LEN; i++) {
            tok[i] = 1000 + (uint64_t)i;
            bh[i] = 5000 + (uint64_t)i;
        }
        if (tt_store_bh(t, 1, 0, NULL, tok, bh, LEN) != IDX_EV_OK) _exit(4);
        if (tt_score(t, tok, LEN, 1, 0) != LEN) _exit(5);
        idx_tree_free(t);
        _exit(0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child: %s %d (2: no limit set, 3: no tree, 4: store "
                  "failed, 5: wrong score)",
                  WIFEXITED(status) ? "exit" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}
END_TEST

/* Allocation failures at every point of a sequence: never a crash, the
 * tree stays consistent, and a failed event is not counted. */
START_TEST(allocation_failures_leave_a_consistent_tree) {
    uint64_t tok[40], bh[40];
    for (int i = 0; i < 40; i++) {
        tok[i] = (uint64_t)i % 5 + 1;
        bh[i] = 5000 + (uint64_t)i;
    }
    for (long k = 0; k < 120; k++) {
        idx_tree *t = NULL;
        kvo_alloc_fail_after(k);
        kvo_status s = idx_tree_new(&t);
        if (s != KVO_OK) {
            kvo_alloc_fail_after(-1);
            ck_assert_int_eq(s, KVO_ENOMEM);
            continue;
        }
        for (int round = 0; round < 4; round++) {
            for (uint64_t w = 0; w < 6; w++) {
                wire_rblock b[40];
                for (int i = 0; i < 40; i++)
                    b[i] = (wire_rblock){bh[i], tok[i]};
                wire_revent ev = {.worker_id = w,
                                  .type = WIRE_R_STORED,
                                  .n_blocks = 40,
                                  .blocks = b};
                idx_evstatus st;
                s = idx_tree_apply(t, &ev, &st);
                ck_assert(s == KVO_OK || s == KVO_ENOMEM);
                uint64_t rm[3] = {bh[39 - w], bh[20], 77};
                wire_revent r = {.worker_id = w,
                                 .type = WIRE_R_REMOVED,
                                 .n_removed = 3,
                                 .removed = rm};
                s = idx_tree_apply(t, &r, &st);
                ck_assert(s == KVO_OK || s == KVO_ENOMEM);
                if (w == 3) {
                    wire_revent c = {.worker_id = 1, .type = WIRE_R_CLEARED};
                    s = idx_tree_apply(t, &c, &st);
                    ck_assert(s == KVO_OK || s == KVO_ENOMEM);
                }
                idx_scores sc;
                idx_scores_init(&sc);
                s = idx_tree_query(t, tok, 40, &sc);
                ck_assert(s == KVO_OK || s == KVO_ENOMEM);
                idx_scores_fini(&sc);
            }
        }
        kvo_alloc_fail_after(-1);
        tt_check(t, true);
        idx_tree_free(t);
    }
}
END_TEST

/* One event of (wid, rank) in tier (bh[i] = tok[i] * 100 for stores). */
static idx_evstatus tier_ev(idx_tree *t, wire_rtype type, uint64_t wid,
                            uint32_t rank, wire_tier tier,
                            const uint64_t *parent, const uint64_t *tok,
                            size_t n) {
    wire_rblock b[8];
    uint64_t rm[8];
    ck_assert_uint_le(n, 8);
    for (size_t i = 0; i < n; i++) {
        b[i] = (wire_rblock){tok[i] * 100, tok[i]};
        rm[i] = tok[i] * 100;
    }
    wire_revent ev = {.worker_id = wid,
                      .dp_rank = rank,
                      .tier = tier,
                      .type = type,
                      .has_parent = parent != NULL,
                      .parent_hash = parent ? *parent : 0,
                      .n_blocks = type == WIRE_R_STORED ? (uint32_t)n : 0,
                      .blocks = b,
                      .n_removed = type == WIRE_R_REMOVED ? (uint32_t)n : 0,
                      .removed = rm};
    idx_evstatus st = IDX_EV_STATUS_COUNT;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    return st;
}

/* The entry of (wid, rank) in a query's answer (zeroed when absent). */
static idx_score tier_score(idx_tree *t, const uint64_t *q, size_t n,
                            uint64_t wid, uint32_t rank) {
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, q, n, &s), KVO_OK);
    idx_score r = {0};
    for (size_t i = 0; i < s.n; i++)
        if (s.v[i].worker_id == wid && s.v[i].dp_rank == rank) r = s.v[i];
    idx_scores_fini(&s);
    return r;
}

typedef struct tier_list {
    size_t n;
    idx_block v[8];
} tier_list;

static kvo_status tier_collect(void *ctx, const idx_block *b) {
    tier_list *l = ctx;
    ck_assert_uint_lt(l->n, 8);
    l->v[l->n++] = *b;
    return KVO_OK;
}

/* Worker 1 rank 0: the GPU holds blocks 1..4 (block hashes 100..400),
 * and blocks 3 and 4 are offloaded to the CPU while the GPU still holds
 * them (3's parent, 200, is on the GPU only). */
static void gpu_1_to_4_cpu_3_and_4(idx_tree *t) {
    const wire_tier D = WIRE_TIER_DEVICE, C = WIRE_TIER_HOST_PINNED;
    ck_assert_int_eq(
        tier_ev(t, WIRE_R_STORED, 1, 0, D, NULL, U64S(1, 2, 3, 4), 4),
        IDX_EV_OK);
    ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 1, 0, C, U64S(200), U64S(3), 1),
                     IDX_EV_OK);
    ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 1, 0, C, U64S(300), U64S(4), 1),
                     IDX_EV_OK);
}

/* A block offloaded before its GPU copy is freed keeps its node, its parent
 * and its place in the query's path: the query scores the GPU run, then
 * the CPU run after it, per rank. */
START_TEST(offloaded_blocks_score_through_the_cpu_tier) {
    const wire_tier D = WIRE_TIER_DEVICE, C = WIRE_TIER_HOST_PINNED;
    idx_tree *t = tt_tree_new();
    const uint64_t q[] = {1, 2, 3, 4, 5};
    gpu_1_to_4_cpu_3_and_4(t);
    /* a parent in no tier of the rank */
    ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 1, 0, C, U64S(900), U64S(9), 1),
                     IDX_EV_PARENT_NOT_FOUND);
    idx_score s = tier_score(t, q, 5, 1, 0);
    ck_assert_uint_eq(s.blocks, 4);
    ck_assert_uint_eq(s.lower, 1u << (C - 1));
    ck_assert_uint_eq(s.through[C - 1], 4);
    ck_assert_uint_eq(s.through[WIRE_TIER_DISK - 1], 4);
    /* the GPU frees 4 then 3: both nodes keep their CPU holder */
    ck_assert_int_eq(tier_ev(t, WIRE_R_REMOVED, 1, 0, D, NULL, U64S(4, 3), 2),
                     IDX_EV_OK);
    s = tier_score(t, q, 5, 1, 0);
    ck_assert_uint_eq(s.blocks, 2);
    ck_assert_uint_eq(s.through[C - 1], 4);
    ck_assert_uint_eq(tt_score(t, q, 5, 1, 0), 2);
    /* a rank holding only CPU blocks scores 0 on the device tier */
    ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 2, 0, C, NULL, U64S(1), 1),
                     IDX_EV_OK);
    s = tier_score(t, q, 5, 2, 0);
    ck_assert(s.worker_id == 2 && s.blocks == 0 && s.through[C - 1] == 1);
    /* and is nobody's other holder on the device tier */
    idx_block_info bi;
    ck_assert_int_eq(idx_tree_block_info(t, 1, 0, 100, &bi), KVO_OK);
    ck_assert(bi.held && bi.in_set);
    ck_assert_uint_eq(bi.others, 0);
    ck_assert_int_eq(idx_tree_block_info(t, 1, 0, 300, &bi), KVO_OK);
    ck_assert(!bi.held);
    /* the tier's own block list, with the parents */
    tier_list l = {0};
    ck_assert_int_eq(idx_tree_worker_blocks(t, 1, 0, C, tier_collect, &l),
                     KVO_OK);
    ck_assert_uint_eq(l.n, 2);
    for (size_t i = 0; i < 2; i++) {
        ck_assert(l.v[i].has_parent);
        ck_assert_uint_eq(l.v[i].parent_block_hash, l.v[i].block_hash - 100);
    }
    /* one entry per rank, whatever its tiers */
    idx_worker *w;
    size_t nw;
    ck_assert_int_eq(idx_tree_workers(t, &w, &nw), KVO_OK);
    ck_assert_uint_eq(nw, 2);
    ck_assert(w[0].worker_id == 1 && w[0].blocks == 2 &&
              w[0].lower_blocks == 2);
    ck_assert(w[1].worker_id == 2 && w[1].blocks == 0 &&
              w[1].lower_blocks == 1);
    kvo_free(w);
    /* a dump restores every tier */
    idx_tree *r = tt_restore(t, NULL, NULL);
    tt_same_answers(t, r, q, 5);
    tt_tree_done(r);
    /* cleared drops its own tier only; a lower tier's creates no slot */
    ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, D, NULL, NULL, 0),
                     IDX_EV_OK);
    s = tier_score(t, q, 5, 1, 0);
    ck_assert(s.blocks == 0 && s.through[C - 1] == 0); /* 1, 2 were GPU */
    ck_assert_uint_eq(tt_pairs(t), 3);
    ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 7, 0, C, NULL, NULL, 0),
                     IDX_EV_OK);
    ck_assert_uint_eq(tt_blocks(t, 7, 0), UINT64_MAX);
    /* the GPU recomputes 1, 2, 3: 3's offloaded node (detached when 2 lost
     * its last holder) is linked again, and the CPU run follows it */
    ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 1, 0, D, NULL, U64S(1, 2, 3), 3),
                     IDX_EV_OK);
    s = tier_score(t, q, 5, 1, 0);
    ck_assert(s.blocks == 3 && s.through[C - 1] == 4);
    ck_assert_uint_eq(tt_nodes(t), 4);
    ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, D, NULL, NULL, 0),
                     IDX_EV_OK);
    ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, C, NULL, NULL, 0),
                     IDX_EV_OK);
    ck_assert_uint_eq(tt_pairs(t), 1);
    /* a rank cleared whole */
    ck_assert_int_eq(idx_tree_rank_clear(t, 2, 0), KVO_OK);
    ck_assert_uint_eq(tt_pairs(t), 0);
    ck_assert_uint_eq(tt_blocks(t, 2, 0), 0);
    tt_tree_done(t);
}
END_TEST

/* An engine reset empties the GPU and keeps the CPU tier: the offloaded
 * blocks under a GPU-only parent are cut off (Dynamo's detach), and come
 * back under it when the GPU computes that parent again. */
START_TEST(offloaded_blocks_cut_by_a_gpu_reset_come_back_with_their_parent) {
    const wire_tier D = WIRE_TIER_DEVICE, C = WIRE_TIER_HOST_PINNED;
    idx_tree *t = tt_tree_new();
    const uint64_t q[] = {1, 2, 3, 4};
    gpu_1_to_4_cpu_3_and_4(t);
    ck_assert_int_eq(tier_ev(t, WIRE_R_REMOVED, 1, 0, D, NULL, U64S(4, 3), 2),
                     IDX_EV_OK);
    ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, D, NULL, NULL, 0),
                     IDX_EV_OK);
    idx_score s = tier_score(t, q, 4, 1, 0);
    ck_assert(s.blocks == 0 && s.through[C - 1] == 0);
    tier_list l = {0};
    ck_assert_int_eq(idx_tree_worker_blocks(t, 1, 0, C, tier_collect, &l),
                     KVO_OK);
    ck_assert_uint_eq(l.n, 2); /* 3 is cut from 2, 4 still under 3 */
    /* the GPU computes 1 and 2 again: 3 and 4 follow from the CPU */
    ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 1, 0, D, NULL, U64S(1, 2), 2),
                     IDX_EV_OK);
    s = tier_score(t, q, 4, 1, 0);
    ck_assert(s.blocks == 2 && s.through[C - 1] == 4);
    l.n = 0;
    ck_assert_int_eq(idx_tree_worker_blocks(t, 1, 0, C, tier_collect, &l),
                     KVO_OK);
    for (size_t i = 0; i < l.n; i++) {
        ck_assert(l.v[i].has_parent);
        ck_assert_uint_eq(l.v[i].parent_block_hash, l.v[i].block_hash - 100);
    }
    /* a record of a block that left the tier is dropped, not relinked */
    ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, D, NULL, NULL, 0),
                     IDX_EV_OK);
    ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, C, NULL, NULL, 0),
                     IDX_EV_OK);
    ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 1, 0, D, NULL, U64S(1, 2), 2),
                     IDX_EV_OK);
    ck_assert_uint_eq(tt_nodes(t), 2);
    tt_tree_done(t);
}
END_TEST

/* A cut block whose record cannot be allocated is counted (orphans_lost)
 * and stays cut when its parent comes back, as in Dynamo: the reset is
 * applied with the k-th allocation failing, for every k until it runs
 * through with the record lost. */
START_TEST(an_orphan_record_lost_to_allocation_failure_is_counted) {
    const wire_tier D = WIRE_TIER_DEVICE, C = WIRE_TIER_HOST_PINNED;
    const uint64_t q[] = {1, 2, 3, 4};
    bool lost = false;
    for (long k = 0; k < 50 && !lost; k++) {
        idx_tree *t = tt_tree_new();
        gpu_1_to_4_cpu_3_and_4(t);
        ck_assert_int_eq(
            tier_ev(t, WIRE_R_REMOVED, 1, 0, D, NULL, U64S(4, 3), 2),
            IDX_EV_OK);
        wire_revent reset = {.worker_id = 1, .tier = D, .type = WIRE_R_CLEARED};
        idx_evstatus st;
        kvo_alloc_fail_after(k);
        kvo_status s = idx_tree_apply(t, &reset, &st);
        kvo_alloc_fail_after(-1);
        idx_counters c;
        idx_tree_counters(t, &c);
        if (s == KVO_OK && c.orphans_lost == 1) {
            lost = true;
            ck_assert_int_eq(
                tier_ev(t, WIRE_R_STORED, 1, 0, D, NULL, U64S(1, 2), 2),
                IDX_EV_OK);
            idx_score sc = tier_score(t, q, 4, 1, 0);
            ck_assert(sc.blocks == 2 && sc.through[C - 1] == 2);
        }
        tt_tree_done(t);
    }
    ck_assert_msg(lost, "no allocation failure lost the record");
}
END_TEST

/* Records of cut blocks that never come back (their parent is never stored
 * again, and the CPU dropped them) are swept: memory stays flat (one
 * shared first block, so the root's emptied children do not pile up). */
START_TEST(orphan_records_of_blocks_gone_are_swept) {
    const wire_tier D = WIRE_TIER_DEVICE, C = WIRE_TIER_HOST_PINNED;
    idx_tree *t = tt_tree_new();
    uint64_t bytes_half = 0;
    for (uint64_t i = 0; i < 20000; i++) {
        uint64_t a = 1, b = 2 * i + 2, c = b + 1, pb = b * 100;
        ck_assert_int_eq(tier_ev(t, WIRE_R_STORED, 1, 0, D, NULL,
                                 (const uint64_t[]){a, b}, 2),
                         IDX_EV_OK);
        ck_assert_int_eq(
            tier_ev(t, WIRE_R_STORED, 1, 0, C, &pb, (const uint64_t[]){c}, 1),
            IDX_EV_OK);
        /* b's node empties: c is cut (a record), then the CPU drops it */
        ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, D, NULL, NULL, 0),
                         IDX_EV_OK);
        ck_assert_int_eq(tier_ev(t, WIRE_R_CLEARED, 1, 0, C, NULL, NULL, 0),
                         IDX_EV_OK);
        if (i == 9999) {
            idx_stats st;
            idx_tree_stats(t, &st);
            bytes_half = st.bytes;
        }
    }
    idx_stats st;
    idx_tree_stats(t, &st);
    ck_assert_uint_eq(st.pairs, 0);
    ck_assert_uint_eq(st.bytes, bytes_half);
    tt_tree_done(t);
}
END_TEST

/* The key of table ref v, for the table test: its hash. */
static uint64_t key_hash(const void *owner, uint32_t v) {
    (void)owner;
    return kvo_mix64(v);
}

static bool key_is(const void *owner, uint32_t v, uint64_t a, uint32_t b) {
    (void)owner;
    (void)b;
    return v == a;
}

/* Every key 1..n is found, and the table keeps I7. */
static void table_holds(const tab *r, uint32_t n) {
    for (uint32_t v = 1; v <= n; v++)
        ck_assert_msg(tab_find_h(r, kvo_mix64(v), key_is, NULL, v, 0) != NIL,
                      "key %u lost", v);
    char msg[256];
    ck_assert_msg(idx_tab_check(r, key_hash, NULL, "t", msg, sizeof(msg)), "%s",
                  msg);
}

/* A table growing into huge pages finds them faulted in ahead: from 7/8 of
 * the way to the growth, a page at a time in step with the fill (counted
 * in the table's bytes). The growth takes that memory, and its keys move
 * there a few old buckets per key inserted afterwards, found all along;
 * no event faults 4 MiB or moves the whole table. */
START_TEST(a_table_grows_into_pages_faulted_ahead_a_few_buckets_at_a_time) {
    tab r;
    memset(&r, 0, sizeof(r));
    const uint32_t nb = (uint32_t)(HUGE_BYTES / sizeof(bucket)); /* 2 MiB */
    const uint64_t cap = (uint64_t)nb * BW * 15 / 16, from = cap - cap / 8;
    void *ahead = NULL;
    bool saw_half = false;
    uint32_t v = 1;
    for (;; v++) {
        uint32_t nb0 = r.nb;
        ck_assert_int_eq(idx_tab_reserve(&r, 1), KVO_OK);
        if (nb0 == nb && r.nb != nb0) { /* the growth: into what was ahead */
            ck_assert_ptr_nonnull(ahead);
            ck_assert_ptr_eq(r.bk_mem, ahead);
            ck_assert_ptr_null(r.next_mem);
            ck_assert_uint_eq(r.next_touched, 0);
            ck_assert_uint_eq(r.onb, nb); /* nothing moved yet */
            ck_assert_uint_eq(r.moved, 0);
            break;
        }
        if (r.nb == nb && !r.onb) {
            uint64_t fill = (uint64_t)r.len + 1;
            ck_assert_uint_eq(r.next_mem != NULL, fill > from);
            ck_assert_uint_eq(idx_tab_bytes(&r),
                              (uint64_t)nb * (sizeof(bucket) + 1) +
                                  (uint64_t)r.stash_cap * 8 +
                                  (uint64_t)r.next_touched * HUGE_BYTES);
            saw_half |= r.next_touched == 1; /* 2 pages: paced, not at once */
            ahead = r.next_mem;
        }
        idx_tab_put(&r, tab_hash_tag(kvo_mix64(v)), v);
    }
    ck_assert(saw_half);
    idx_tab_put(&r, tab_hash_tag(kvo_mix64(v)), v);
    table_holds(&r, v); /* all in the old buckets */
    uint32_t during = 0;
    while (r.onb) { /* insert on: the move goes on, two buckets a key */
        v++;
        ck_assert_int_eq(idx_tab_reserve(&r, 1), KVO_OK);
        idx_tab_put(&r, tab_hash_tag(kvo_mix64(v)), v);
        if (++during == nb / 4) table_holds(&r, v); /* half-way */
    }
    ck_assert_uint_eq(r.nb, 2 * nb); /* done long before the next growth */
    ck_assert_uint_le(during, nb / 2);
    table_holds(&r, v);
    idx_tab_fini(&r);
}
END_TEST

/* Keys 1..32 share tag T1, 33..64 tag T2 (their buckets overflow into the
 * stash); the others hash as kvo_mix64. */
#define T1 0x12345678u
#define T2 0x9ABCDEF0u
static uint32_t crowd_tag(uint32_t v) {
    return v <= 32 ? T1 : v <= 64 ? T2 : tab_hash_tag(kvo_mix64(v));
}

static uint64_t crowd_hash(const void *owner, uint32_t v) {
    (void)owner;
    return (uint64_t)crowd_tag(v) << 32;
}

/* A reservation holds while a growth moves keys into the stash: room for
 * 64 crowded keys is taken, then later reservations (of none) move the
 * old buckets, whose crowded keys land in the stash; the 64 keys still all
 * go in (a move that ate the reserved stash room loses some of them). */
START_TEST(a_moving_growth_keeps_the_stash_room_reserved) {
    tab r;
    memset(&r, 0, sizeof(r));
    uint32_t v = 65; /* others until 64 buckets, all moved */
    for (; r.nb < 64 || r.onb; v++) {
        ck_assert_int_eq(idx_tab_reserve(&r, 1), KVO_OK);
        idx_tab_put(&r, crowd_tag(v), v);
    }
    for (uint32_t u = 1; u <= 64; u++) { /* the crowds */
        ck_assert_int_eq(idx_tab_reserve(&r, 1), KVO_OK);
        idx_tab_put(&r, crowd_tag(u), u);
    }
    for (; !r.onb; v++) { /* others until a growth starts */
        ck_assert_int_eq(idx_tab_reserve(&r, 1), KVO_OK);
        idx_tab_put(&r, crowd_tag(v), v);
    }
    ck_assert(tab_b1(&r, T1) != tab_b2(&r, T1));
    ck_assert(tab_b1(&r, T2) != tab_b2(&r, T2));
    ck_assert_int_eq(idx_tab_reserve(&r, 64), KVO_OK);
    while (r.onb) ck_assert_int_eq(idx_tab_reserve(&r, 0), KVO_OK);
    ck_assert_uint_gt(r.nstash, 0); /* the move did use the stash */
    uint32_t last = v - 1;
    for (uint32_t i = 0; i < 64; i++) { /* 32 more of each crowd */
        uint32_t w = 1000000 + i;
        idx_tab_put(&r, i < 32 ? T1 : T2, w);
    }
    for (uint32_t u = 1; u <= last; u++)
        ck_assert_msg(tab_find_h(&r, crowd_hash(NULL, u), key_is, NULL, u, 0) !=
                          NIL,
                      "key %u lost", u);
    for (uint32_t i = 0; i < 64; i++)
        ck_assert_msg(tab_find_h(&r, (uint64_t)(i < 32 ? T1 : T2) << 32, key_is,
                                 NULL, 1000000 + i, 0) != NIL,
                      "reserved key %u lost", i);
    ck_assert_uint_eq(r.len, last + 64);
    idx_tab_fini(&r);
}
END_TEST

Suite *suite_tree(void) {
    Suite *s = suite_create("tree");
    TCase *tc = tcase_create("dynamo");
    tcase_add_test(tc, two_workers_share_a_prefix);
    tcase_add_test(tc, unknown_parent_rejects_the_whole_store);
    tcase_add_test(tc, unknown_removed_hashes_are_skipped_and_counted);
    tcase_add_test(
        tc, self_referencing_block_is_invalid_and_keeps_dynamos_self_edge);
    tcase_add_test(tc, cleared_drops_every_block_of_the_worker);
    tcase_add_test(tc, remove_worker_forgets_every_rank);
    tcase_add_test(tc, dp_ranks_are_independent_workers);
    tcase_add_test(tc, lora_and_base_prompts_do_not_collide);
    tcase_add_test(tc, dump_and_restore_give_the_same_answers);
    tcase_add_test(tc, duplicate_stores_are_idempotent);
    tcase_add_test(tc, a_node_losing_its_last_worker_detaches_its_children);
    tcase_add_test(tc, remove_mid_chain_then_restore);
    tcase_add_test(tc, worker_views_give_parents_and_other_holders);
    tcase_add_test(tc, offloaded_blocks_score_through_the_cpu_tier);
    tcase_add_test(
        tc, offloaded_blocks_cut_by_a_gpu_reset_come_back_with_their_parent);
    tcase_add_test(tc, orphan_records_of_blocks_gone_are_swept);
    tcase_add_test(tc, an_orphan_record_lost_to_allocation_failure_is_counted);
    suite_add_tcase(s, tc);
    TCase *tl = tcase_create("layout");
    tcase_set_timeout(tl, 600);
    tcase_add_test(tl, worker_sets_grow_and_shrink);
    tcase_add_test(tl, a_node_counts_hundreds_of_references);
    tcase_add_test(tl, edge_tags_tell_parents_apart);
    tcase_add_test(tl, a_branch_node_moves_between_lean_far_and_fat);
    tcase_add_test(tl, colliding_keys_overflow_into_the_stash);
    tcase_add_test(tl, large_streams_keep_every_invariant);
    tcase_add_test(tl, large_trees_live_in_mapped_memory);
    tcase_add_test(tl, a_small_tree_holds_a_few_pages);
    tcase_add_test(tl, freed_nodes_are_reused_lowest_first);
    tcase_add_test(tl, a_tree_works_under_an_address_space_limit);
    tcase_add_test(
        tl, a_table_grows_into_pages_faulted_ahead_a_few_buckets_at_a_time);
    tcase_add_test(tl, a_moving_growth_keeps_the_stash_room_reserved);
    tcase_add_test(tl, allocation_failures_leave_a_consistent_tree);
    suite_add_tcase(s, tl);
    return s;
}
