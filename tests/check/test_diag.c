/* Diagnosis from evidence (check_diag.c): each class from what the engine
 * and the index hold at the first divergent block, the evidence beside
 * it, when the evidence wins over the judge's reason, and the checkpoints'
 * misplaced blocks (check_sets.c). */
#include "check_int.h"
#include "kt.h"

#include <string.h>

Suite *suite_diag(void);

/* Engine block k: hash 100 + k under 100 + k - 1 (block 0 under the root),
 * cached, tokens_hash 500 + k. */
static check_chain_block eb(uint32_t k) {
    return (check_chain_block){.hash = 100 + k,
                               .parent = 99 + k,
                               .has_parent = k > 0,
                               .cached = true,
                               .copies = 1,
                               .tokens_hash = 500 + k};
}

/* The index holds engine block k exactly as the engine does. */
static check_lookup held_as(uint32_t k) {
    return (check_lookup){.held = true,
                          .has_parent = k > 0,
                          .parent = 99 + k,
                          .tokens_hash = 500 + k};
}

static check_diag diag1(const check_chain_block *b, const check_lookup *l,
                        bool behind) {
    check_diag d;
    memset(&d, 0x55, sizeof(d));
    check_diagnose(b, l, 1, 3, behind, 0, 1, &d);
    return d;
}

START_TEST(a_block_held_under_another_parent_is_a_wrong_parent) {
    check_chain_block b = eb(3);
    check_lookup l = held_as(3);
    l.has_parent = false; /* under the root, as wrong-parent publishes */
    check_diag d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_WRONG_PARENT);
    ck_assert_msg(strstr(d.evidence, "under parent 102") &&
                      strstr(d.evidence, "under no parent (under the root)"),
                  "%s", d.evidence);
    l.has_parent = true;
    l.parent = 7;
    d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_WRONG_PARENT);
    ck_assert_ptr_nonnull(strstr(d.evidence, "under parent 7"));
}
END_TEST

START_TEST(a_block_held_with_other_tokens_is_a_token_mismatch) {
    check_chain_block b = eb(3);
    check_lookup l = held_as(3);
    l.tokens_hash = 42;
    check_diag d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_TOKEN_MISMATCH);
    ck_assert_msg(strstr(d.evidence, "tokens_hash 42") &&
                      strstr(d.evidence, "give 503"),
                  "%s", d.evidence);
    /* held exactly as the engine holds it: nothing explains it */
    l = held_as(3);
    d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_UNEXPLAINED);
}
END_TEST

START_TEST(a_block_nobody_holds_is_a_missed_store) {
    check_chain_block b = eb(3);
    check_lookup l = {0};
    check_diag d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_MISSED_STORE);
    ck_assert_ptr_nonnull(strstr(d.evidence, "no (worker, rank) of the index"));
    /* others hold it, but their engines do too: still missed here */
    l.others = 1;
    l.n_holders = 1;
    l.holders[0] = (check_slot_info){2, 0};
    l.holder_cached[0] = true;
    d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_MISSED_STORE);
    ck_assert_ptr_nonnull(
        strstr(d.evidence, "worker 2 rank 0 (its engine too)"));
}
END_TEST

/* Not held by its hash, but its tokens are: where the engine chains it
 * (another hash was published for them), or under the root. */
START_TEST(tokens_held_under_another_hash_name_the_hash_or_the_parent) {
    check_chain_block b = eb(3);
    check_lookup l = {.found = CHECK_FOUND_UNDER_PARENT, .found_hash = 77};
    check_diag d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_HASH_MISMATCH);
    ck_assert_msg(strstr(d.evidence, "as hash 103 (parent 102)") &&
                      strstr(d.evidence, "there as hash 77"),
                  "%s", d.evidence);
    l.found = CHECK_FOUND_UNDER_ROOT;
    d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_WRONG_PARENT);
    ck_assert_msg(strstr(d.evidence, "under the root, as hash 77"), "%s",
                  d.evidence);
    l.found = CHECK_FOUND_NONE;
    d = diag1(&b, &l, true);
    ck_assert_int_eq(d.reason, CHECK_REASON_MISSED_STORE);
}
END_TEST

START_TEST(a_block_credited_to_a_slot_whose_engine_lacks_it_is_misplaced) {
    /* blocks 3 and 4: block 3 is shared (rank 0's engine has it too),
     * block 4 only this rank's engine holds, and the index credits it to
     * rank 0 of the same worker */
    check_chain_block b[2] = {eb(3), eb(4)};
    check_lookup l[2] = {{.others = 1, .n_holders = 1},
                         {.others = 1, .n_holders = 1}};
    l[0].holders[0] = l[1].holders[0] = (check_slot_info){0, 0};
    l[0].holder_cached[0] = true;
    check_diag d;
    check_diagnose(b, l, 2, 3, true, 0, 1, &d);
    ck_assert_int_eq(d.reason, CHECK_REASON_WRONG_RANK);
    ck_assert_msg(strstr(d.evidence, "block 4 (hash 104)") &&
                      strstr(d.evidence, "on worker 0 rank 0"),
                  "%s", d.evidence);
    /* only one block looked at: the shared one says nothing more */
    check_diagnose(b, l, 1, 3, true, 0, 1, &d);
    ck_assert_int_eq(d.reason, CHECK_REASON_MISSED_STORE);
    /* another worker */
    l[1].holders[0] = (check_slot_info){5, 1};
    check_diagnose(b, l, 2, 3, true, 0, 1, &d);
    ck_assert_int_eq(d.reason, CHECK_REASON_WRONG_WORKER);
    ck_assert_ptr_nonnull(strstr(d.evidence, "worker 5 rank 1"));
}
END_TEST

START_TEST(an_index_ahead_holding_the_block_is_a_stale_block) {
    check_chain_block b = eb(3);
    b.cached = false;
    b.copies = 0;
    check_lookup l = held_as(3);
    check_diag d = diag1(&b, &l, false);
    ck_assert_int_eq(d.reason, CHECK_REASON_STALE_BLOCK);
    ck_assert_ptr_nonnull(strstr(d.evidence, "the engine holds no copy"));
    l.held = false;
    d = diag1(&b, &l, false);
    ck_assert_int_eq(d.reason, CHECK_REASON_UNEXPLAINED);
}
END_TEST

START_TEST(rank_sets_show_stores_credited_to_a_sibling) {
    uint64_t eng[2] = {450, 500}, idx[2] = {950, 0};
    check_diag d;
    ck_assert(check_diagnose_ranks(eng, idx, 2, 0, 1, &d));
    ck_assert_int_eq(d.reason, CHECK_REASON_WRONG_RANK);
    ck_assert_msg(strstr(d.evidence, "caches 500 blocks, the index credits "
                                     "it with 0"),
                  "%s", d.evidence);
    /* the sibling holds no more than its engine: nothing to say */
    idx[0] = 450;
    ck_assert(!check_diagnose_ranks(eng, idx, 2, 0, 1, &d));
    /* this rank is not short */
    idx[0] = 950;
    idx[1] = 500;
    ck_assert(!check_diagnose_ranks(eng, idx, 2, 0, 1, &d));
}
END_TEST

START_TEST(evidence_names_the_class_unless_a_counter_already_does) {
    kvo_arena a;
    kvo_arena_init(&a);
    check_prompt p = {.diverged = true, .reason = CHECK_REASON_MISSED_STORE};
    check_diag d = {.reason = CHECK_REASON_WRONG_PARENT};
    snprintf(d.evidence, sizeof(d.evidence), "the evidence");
    ck_assert_int_eq(check_prompt_explain(&p, &d, true, &a), KVO_OK);
    ck_assert_int_eq(p.reason, CHECK_REASON_WRONG_PARENT);
    ck_assert_str_eq(p.evidence, "the evidence");
    /* a counter said how the store was lost: a bare "missed" keeps it */
    p.reason = CHECK_REASON_REJECTED;
    d.reason = CHECK_REASON_MISSED_STORE;
    ck_assert_int_eq(check_prompt_explain(&p, &d, true, &a), KVO_OK);
    ck_assert_int_eq(p.reason, CHECK_REASON_REJECTED);
    /* a specific class wins over the counter */
    d.reason = CHECK_REASON_TOKEN_MISMATCH;
    ck_assert_int_eq(check_prompt_explain(&p, &d, true, &a), KVO_OK);
    ck_assert_int_eq(p.reason, CHECK_REASON_TOKEN_MISMATCH);
    /* the engine contradicting itself stays */
    p.reason = CHECK_REASON_ENGINE;
    ck_assert_int_eq(check_prompt_explain(&p, &d, true, &a), KVO_OK);
    ck_assert_int_eq(p.reason, CHECK_REASON_ENGINE);
    /* no evidence: the reason is called a guess */
    p.reason = CHECK_REASON_STALE_BLOCK;
    ck_assert_int_eq(check_prompt_unexplained(&p, "HTTP 404", &a), KVO_OK);
    ck_assert_int_eq(p.reason, CHECK_REASON_STALE_BLOCK);
    ck_assert_msg(strstr(p.evidence, "no evidence (HTTP 404)") &&
                      strstr(p.evidence, "guess"),
                  "%s", p.evidence);
    p.diverged = false;
    ck_assert_int_eq(check_prompt_explain(&p, &d, true, &a), KVO_EINVAL);
    kvo_arena_fini(&a);
}
END_TEST

#define B(h, p) ((check_block){.hash = (h), .parent = (p), .has_parent = true})
#define ROOT(h) ((check_block){.hash = (h)})

START_TEST(a_checkpoint_finds_blocks_credited_to_another_slot) {
    /* slot 1 (worker 0 rank 1) caches 10 and 20; the index has both on
     * slot 0 (worker 0 rank 0), whose engine caches 10 only; slot 2
     * (worker 1 rank 0) misses 30, which nobody else has */
    check_block e0[] = {ROOT(10)}, i0[] = {ROOT(10), B(20, 10)};
    check_block e1[] = {ROOT(10), B(20, 10)};
    check_block e2[] = {ROOT(30)};
    check_set_diff d;
    memset(&d, 0, sizeof(d));
    d.collect = true;
    check_blocks_compare(e0, 1, i0, 2, 0, &d);
    check_blocks_compare(e1, 2, NULL, 0, 1, &d);
    check_blocks_compare(e2, 1, NULL, 0, 2, &d);
    check_set_diff_misplaced(&d);
    ck_assert_ptr_null(d.one_sided);
    ck_assert_uint_eq(d.misplaced, 1); /* 20: 10 is slot 0's by right */
    ck_assert_uint_eq(d.misplaced_hash, 20);
    ck_assert_uint_eq(d.misplaced_engine_slot, 1);
    ck_assert_uint_eq(d.misplaced_index_slot, 0);
    ck_assert_int_eq(check_set_diff_reason(&d, 2), CHECK_REASON_WRONG_RANK);
    ck_assert_int_eq(check_set_diff_reason(&d, 1), CHECK_REASON_WRONG_WORKER);
    /* without collecting, the most numerous kind names it */
    memset(&d, 0, sizeof(d));
    check_blocks_compare(e1, 2, NULL, 0, 1, &d);
    check_blocks_compare(e0, 1, i0, 2, 0, &d);
    check_set_diff_misplaced(&d);
    ck_assert_uint_eq(d.misplaced, 0);
    ck_assert_int_eq(check_set_diff_reason(&d, 2), CHECK_REASON_MISSED_STORE);
}
END_TEST

Suite *suite_diag(void) {
    Suite *s = suite_create("diag");
    TCase *tc = tcase_create("classes");
    tcase_add_test(tc, a_block_held_under_another_parent_is_a_wrong_parent);
    tcase_add_test(tc, a_block_held_with_other_tokens_is_a_token_mismatch);
    tcase_add_test(tc, a_block_nobody_holds_is_a_missed_store);
    tcase_add_test(tc,
                   tokens_held_under_another_hash_name_the_hash_or_the_parent);
    tcase_add_test(
        tc, a_block_credited_to_a_slot_whose_engine_lacks_it_is_misplaced);
    tcase_add_test(tc, an_index_ahead_holding_the_block_is_a_stale_block);
    tcase_add_test(tc, rank_sets_show_stores_credited_to_a_sibling);
    tcase_add_test(tc, evidence_names_the_class_unless_a_counter_already_does);
    suite_add_tcase(s, tc);
    tc = tcase_create("checkpoints");
    tcase_add_test(tc, a_checkpoint_finds_blocks_credited_to_another_slot);
    suite_add_tcase(s, tc);
    return s;
}
