/* The pure part of checkpoints and of load mode's reports: block sets
 * compared (copies, parents), their digests, a checkpoint's cause and its
 * place in the verdict, the staleness of routing-time scores, the regime
 * from the engines' counters. */
#include "check_int.h"
#include "kt.h"

#include <string.h>

Suite *suite_sets(void);

#define B(h, p) ((check_block){.hash = (h), .parent = (p), .has_parent = true})
#define ROOT(h) ((check_block){.hash = (h)})

START_TEST(copies_count_once_and_the_digest_ignores_order) {
    check_block a[] = {B(30, 20), ROOT(10), B(20, 10), B(30, 20), ROOT(10)};
    check_block b[] = {B(20, 10), B(30, 20), ROOT(10)};
    size_t na = check_blocks_normalize(a, KVO_ARRAY_LEN(a));
    size_t nb = check_blocks_normalize(b, KVO_ARRAY_LEN(b));
    ck_assert_uint_eq(na, 3);
    ck_assert_uint_eq(nb, 3);
    for (size_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(a[i].hash, b[i].hash);
        ck_assert_uint_eq(a[i].hash, (i + 1) * 10); /* sorted by hash */
    }
    uint64_t d = check_blocks_digest(a, na);
    ck_assert_uint_eq(d, check_blocks_digest(b, nb));
    /* the engine's and the index's own term, summed mod 2^64 */
    ck_assert_uint_eq(d, kvo_block_digest(10, false, 0) +
                             kvo_block_digest(20, true, 10) +
                             kvo_block_digest(30, true, 20));
    /* a parent is part of a block: another parent, another digest */
    check_block c[] = {ROOT(10), B(20, 11), B(30, 20)};
    ck_assert_uint_ne(check_blocks_digest(c, 3), d);
}
END_TEST

START_TEST(sets_differ_by_engine_only_index_only_and_parent) {
    /* engine: 10 20/10 30/20 40/30        index: 10 20/99 30/20 50/30 */
    check_block eng[] = {ROOT(10), B(20, 10), B(30, 20), B(40, 30)};
    check_block idx[] = {ROOT(10), B(20, 99), B(30, 20), B(50, 30)};
    check_set_diff d;
    memset(&d, 0, sizeof(d));
    check_blocks_compare(eng, 4, idx, 4, 3, &d);
    ck_assert_uint_eq(d.n[CHECK_DIFF_ENGINE_ONLY], 1);
    ck_assert_uint_eq(d.n[CHECK_DIFF_INDEX_ONLY], 1);
    ck_assert_uint_eq(d.n[CHECK_DIFF_PARENT], 1);
    ck_assert_uint_eq(d.n_first, 3);
    /* in hash order, each with the side(s) that hold it */
    ck_assert_int_eq(d.first[0].kind, CHECK_DIFF_PARENT);
    ck_assert_uint_eq(d.first[0].engine.parent, 10);
    ck_assert_uint_eq(d.first[0].index.parent, 99);
    ck_assert_int_eq(d.first[1].kind, CHECK_DIFF_ENGINE_ONLY);
    ck_assert_uint_eq(d.first[1].engine.hash, 40);
    ck_assert_int_eq(d.first[2].kind, CHECK_DIFF_INDEX_ONLY);
    ck_assert_uint_eq(d.first[2].index.hash, 50);
    ck_assert_uint_eq(d.first[2].slot, 3);
    ck_assert_int_eq(d.first[2].prompt, -1);
    /* a first block against the same hash under a parent -- even parent
     * hash 0, which the digest cannot tell from none (the lists can) */
    check_block e2[] = {ROOT(7)}, i2[] = {B(7, 1)}, i3[] = {B(7, 0)};
    memset(&d, 0, sizeof(d));
    check_blocks_compare(e2, 1, i2, 1, 0, &d);
    check_blocks_compare(e2, 1, i3, 1, 0, &d);
    ck_assert_uint_eq(d.n[CHECK_DIFF_PARENT], 2);
    ck_assert_uint_eq(check_blocks_digest(e2, 1), check_blocks_digest(i3, 1));
    /* equal sets: nothing */
    memset(&d, 0, sizeof(d));
    check_blocks_compare(eng, 4, eng, 4, 0, &d);
    ck_assert_uint_eq(d.n[0] + d.n[1] + d.n[2], 0);
    ck_assert_uint_eq(d.n_first, 0);
    /* empty sides */
    memset(&d, 0, sizeof(d));
    check_blocks_compare(NULL, 0, idx, 4, 0, &d);
    ck_assert_uint_eq(d.n[CHECK_DIFF_INDEX_ONLY], 4);
}
END_TEST

/* CPU blocks the index lists without a parent: the same set when the
 * engine's parent is in neither of its tiers (the tree cut them), a
 * difference when the engine still holds that parent. */
START_TEST(blocks_cut_from_a_parent_no_tier_holds_compare_equal) {
    /* engine CPU: 30/20 40/30 50/60; engine GPU: 60; index CPU: 30 40/30 50 */
    check_block eng[] = {B(30, 20), B(40, 30), B(50, 60)};
    check_block gpu[] = {ROOT(60)};
    check_block idx[] = {ROOT(30), B(40, 30), ROOT(50)};
    ck_assert_uint_eq(check_blocks_cut(eng, 3, idx, 3), 2);
    ck_assert_uint_eq(check_blocks_uncut(eng, 3, gpu, 1, idx, 3), 1);
    ck_assert(idx[0].has_parent && idx[0].parent == 20);
    ck_assert(!idx[2].has_parent); /* 60 is on the GPU: not cut */
    check_set_diff d;
    memset(&d, 0, sizeof(d));
    check_blocks_compare(eng, 3, idx, 3, 0, &d);
    ck_assert_uint_eq(d.n[CHECK_DIFF_PARENT], 1);
    ck_assert_uint_eq(d.first[0].engine.hash, 50);
    /* a parent the tier itself holds is no cut either */
    check_block e2[] = {B(30, 20), ROOT(20)}, i2[] = {ROOT(20), ROOT(30)};
    check_blocks_normalize(e2, 2);
    ck_assert_uint_eq(check_blocks_cut(e2, 2, i2, 2), 0);
    ck_assert_uint_eq(check_blocks_uncut(e2, 2, NULL, 0, i2, 2), 0);
}
END_TEST

START_TEST(the_first_ten_differences_are_kept_all_are_counted) {
    check_block eng[25];
    for (int i = 0; i < 25; i++) eng[i] = ROOT((uint64_t)i + 1);
    check_set_diff d;
    memset(&d, 0, sizeof(d));
    check_blocks_compare(eng, 25, NULL, 0, 1, &d);
    ck_assert_uint_eq(d.n[CHECK_DIFF_ENGINE_ONLY], 25);
    ck_assert_uint_eq(d.n_first, CHECK_DIFFS_SHOWN);
    ck_assert_uint_eq(d.first[9].engine.hash, 10);
}
END_TEST

/* A 2-worker result with n lockstep prompts (all agreeing). */
static check_result *clean_result(uint64_t n) {
    check_result *r = NULL;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 2, 1, 16), KVO_OK);
    for (uint64_t id = 0; id < n; id++) {
        uint32_t sc[2] = {1, 0};
        int32_t pr[2] = {1, 0};
        check_obs o = {.id = id,
                       .prompt_tokens = 100,
                       .block_size = 16,
                       .n_slots = 2,
                       .dp_size = 1,
                       .chosen = 0,
                       .index_scores = sc,
                       .probe_hits = pr,
                       .cached_tokens = 16};
        ck_assert_int_eq(check_result_add(r, &o, NULL), KVO_OK);
    }
    return r;
}

START_TEST(a_checkpoint_with_differences_fails_the_run_naming_them) {
    check_result *r = clean_result(10);
    check_slot_sets ss[2];
    memset(ss, 0, sizeof(ss));
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.after = 4;
    c.before_prompt = 4;
    c.sets = true;
    c.sweep_first = -1;
    ck_assert_int_eq(check_result_checkpoint(r, &c, ss), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_msg(r->verdict.pass, "%s", r->verdict.cause);
    /* the second: 3 stale blocks on worker 1, the first of prompt 6 */
    check_block idx[] = {ROOT(5), B(6, 5), B(7, 6)};
    c.number = 2;
    c.after = 8;
    c.before_prompt = 8;
    check_blocks_compare(NULL, 0, idx, 3, 1, &c.diff);
    c.diff.first[0].prompt = 6;
    c.diff.first[0].depth = 0;
    ss[1].listed = true;
    ck_assert_int_eq(check_result_checkpoint(r, &c, ss), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert(!r->verdict.pass);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_STALE_BLOCK);
    ck_assert_str_eq(r->verdict.cause,
                     "stale block: checkpoint 2 after 8 requests: 3 blocks in "
                     "the index but not the engine; first: worker 1 rank 0: "
                     "block 5 (no parent) in the index, not the engine (prompt "
                     "6 block 0)");
    /* the result keeps its own copy of the slots */
    ck_assert(r->ckpts[1].slots[1].listed && !r->ckpts[0].slots[1].listed);
    char t[256];
    check_block_diff_text(r, &r->ckpts[1].diff.first[2], t, sizeof(t));
    ck_assert_str_eq(t, "worker 1 rank 0: block 7 (parent 6) in the index, not "
                        "the engine (no prompt of the run reaches it)");
    /* a prompt diverging after it comes later ... */
    uint32_t sc[2] = {0, 0};
    int32_t pr[2] = {3, 0};
    check_obs o = {.id = 12,
                   .prompt_tokens = 100,
                   .block_size = 16,
                   .n_slots = 2,
                   .dp_size = 1,
                   .chosen = 1,
                   .index_scores = sc,
                   .probe_hits = pr,
                   .cached_tokens = 0};
    ck_assert_int_eq(check_result_add(r, &o, NULL), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_msg(strstr(r->verdict.cause, "checkpoint 2"), "%s",
                  r->verdict.cause);
    check_result_free(r);
    /* ... one before it (prompt 7, checkpoint before prompt 8) first */
    r = clean_result(7);
    o.id = 7;
    ck_assert_int_eq(check_result_add(r, &o, NULL), KVO_OK);
    ck_assert_int_eq(check_result_checkpoint(r, &c, ss), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_msg(strstr(r->verdict.cause, "prompt 7 diverged"), "%s",
                  r->verdict.cause);
    check_result_free(r);
}
END_TEST

START_TEST(a_cpu_tier_difference_is_named_after_the_gpu_ones) {
    check_result *r = clean_result(10);
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.after = 5;
    c.before_prompt = 5;
    c.sets = true;
    c.sweep_first = -1;
    /* the CPU tier alone: its reason, its words */
    check_block cpu_idx[] = {ROOT(8), B(9, 8)};
    check_blocks_compare(NULL, 0, cpu_idx, 2, 1, &c.cpu.diff);
    ck_assert(check_checkpoint_sets_differ(&c));
    ck_assert(check_checkpoint_failed(&c));
    char cause[720];
    check_checkpoint_cause(r, &c, cause, sizeof(cause));
    ck_assert_str_eq(cause, "stale block: checkpoint 1 after 5 requests: tier "
                            "cpu: 2 blocks in the index but not the engine; "
                            "first: worker 1 rank 0: block 8 (no parent) in "
                            "the index, not the engine (no prompt of the run "
                            "reaches it)");
    /* with the GPU's: those first, and their reason */
    check_block gpu_eng[] = {ROOT(1)};
    check_blocks_compare(gpu_eng, 1, NULL, 0, 0, &c.diff);
    check_checkpoint_cause(r, &c, cause, sizeof(cause));
    ck_assert_str_eq(cause, "missed store: checkpoint 1 after 5 requests: 1 "
                            "blocks in the engine but not the index; first: "
                            "worker 0 rank 0: block 1 (no parent) in the "
                            "engine, not the index (no prompt of the run "
                            "reaches it); tier cpu: 2 blocks in the index but "
                            "not the engine; first: worker 1 rank 0: block 8 "
                            "(no parent) in the index, not the engine (no "
                            "prompt of the run reaches it)");
    ck_assert_int_eq(check_result_checkpoint(r, &c, NULL), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_MISSED_STORE);
    ck_assert_str_eq(r->verdict.where, "checkpoint 1: block sets");
    /* a short buffer is cut, never overrun */
    char small[40];
    check_checkpoint_cause(r, &c, small, sizeof(small));
    ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
    check_result_free(r);
}
END_TEST

START_TEST(a_counter_read_at_the_checkpoint_names_the_cause_first) {
    check_result *r = clean_result(10);
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.after = 5;
    c.before_prompt = 5;
    c.sweep_first = -1;
    check_block eng[] = {ROOT(1), B(2, 1)};
    check_blocks_compare(eng, 2, NULL, 0, 0, &c.diff);
    ck_assert_int_eq(check_result_checkpoint(r, &c, NULL), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_MISSED_STORE);
    ck_assert_msg(strstr(r->verdict.cause, "missed store: checkpoint 1 after "
                                           "5 requests: 2 blocks in the engine "
                                           "but not the index"),
                  "%s", r->verdict.cause);
    /* the same read found the indexer rejecting stores: that is why */
    check_counters cs;
    check_counters_init(&cs);
    check_counters_set(&cs, "indexer",
                       "kvo_indexer_events_total{type=\"stored\",status="
                       "\"parent_not_found\"}",
                       2);
    ck_assert_int_eq(check_result_trips(r, &cs, 5), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_UNKNOWN_PARENT);
    check_counters_fini(&cs);
    check_result_free(r);
}
END_TEST

START_TEST(a_prompt_re_checked_at_a_checkpoint_fails_it) {
    check_result *r = clean_result(10);
    check_obs o = {.id = 3,
                   .prompt_tokens = 100,
                   .block_size = 16,
                   .n_slots = 2,
                   .dp_size = 1,
                   .chosen = 0,
                   .index_scores = (uint32_t[]){2, 0},
                   .probe_hits = (int32_t[]){0, 0},
                   .cached_tokens = -1,
                   .checkpoint = 1};
    const check_prompt *p = NULL;
    ck_assert_int_eq(check_result_add_sweep(r, &o, &p), KVO_OK);
    ck_assert(p->diverged);
    ck_assert_uint_eq(p->checkpoint, 1);
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.after = 5;
    c.before_prompt = 5;
    c.sets = true;
    c.sweep_prompts = 4;
    c.sweep_divergent = 1;
    c.sweep_first = 0;
    ck_assert_int_eq(check_result_checkpoint(r, &c, NULL), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert(!r->verdict.pass);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_STALE_BLOCK);
    ck_assert_msg(strstr(r->verdict.cause, "stale block: checkpoint 1 after 5 "
                                           "requests, prompt 3 re-checked "
                                           "diverged at block 0"),
                  "%s", r->verdict.cause);
    check_result_free(r);
}
END_TEST

/* A load-mode result: prompts with (routed, engine) hit blocks. */
static check_result *routed_result(const int32_t (*v)[2], size_t n) {
    check_result *r = NULL;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 1, 1, 16), KVO_OK);
    for (size_t i = 0; i < n; i++) {
        uint32_t sc = (uint32_t)v[i][0];
        check_obs o = {.id = i,
                       .prompt_tokens = 1600,
                       .block_size = 16,
                       .n_slots = 1,
                       .dp_size = 1,
                       .chosen = 0,
                       .index_scores = &sc,
                       .unjudged = true,
                       .cached_tokens = v[i][1] < 0 ? -1 : v[i][1] * 16,
                       .inflight_at_route = (uint32_t)i};
        const check_prompt *p;
        ck_assert_int_eq(check_result_add(r, &o, &p), KVO_OK);
        ck_assert(!p->diverged && !p->judged); /* reported, not judged */
        ck_assert_uint_eq(p->routed_index_blocks, sc < 99 ? sc : 99);
        ck_assert_uint_eq(p->inflight_at_route, i);
    }
    return r;
}

START_TEST(staleness_counts_exact_over_and_under_with_percentiles) {
    /* routed, engine: 4 exact, over by 3 and 10, under by 1, 2 and 5, one
     * unknown engine hit (not counted) */
    static const int32_t v[][2] = {{5, 5},  {0, 0}, {8, 8}, {2, 2}, {6, 3},
                                   {12, 2}, {4, 5}, {0, 2}, {1, 6}, {3, -1}};
    check_result *r = routed_result(v, KVO_ARRAY_LEN(v));
    check_staleness s;
    ck_assert_int_eq(check_result_staleness(r, &s), KVO_OK);
    ck_assert_uint_eq(s.requests, 9);
    ck_assert_uint_eq(s.exact, 4);
    ck_assert_uint_eq(s.over, 2);
    ck_assert_uint_eq(s.under, 3);
    /* |diff| sorted: 0 0 0 0 1 2 3 5 10 */
    ck_assert_uint_eq(s.abs_p50, 1);
    ck_assert_uint_eq(s.abs_p99, 10);
    ck_assert_uint_eq(s.abs_max, 10);
    ck_assert_uint_eq(s.over_p50, 3);
    ck_assert_uint_eq(s.over_max, 10);
    ck_assert_uint_eq(s.under_p50, 2);
    ck_assert_uint_eq(s.under_max, 5);
    /* promised 5+0+8+2+6+12+4+0+1 = 38 blocks, achieved 5+0+8+2+3+2+5+2+6
     * = 33, of 9 x 1600 tokens */
    ck_assert_uint_eq(s.promised_tokens, 38 * 16);
    ck_assert_uint_eq(s.achieved_tokens, 33 * 16);
    ck_assert_uint_eq(s.prompt_tokens, 9 * 1600);
    /* unjudged prompts never fail a run */
    check_verdict_decide(r, &r->verdict);
    ck_assert(r->verdict.pass);
    check_result_free(r);
}
END_TEST

START_TEST(the_regime_sums_counts_and_takes_the_largest_maxima) {
    check_result *r = clean_result(1);
    check_regime g;
    check_result_regime(r, &g);
    ck_assert(!g.known);
    check_counters_set(&r->counters, "engine 0.0", "steps_multi", 10);
    check_counters_set(&r->counters, "engine 1.0", "steps_multi", 5);
    check_counters_set(&r->counters, "engine 0.0", "max_running", 7);
    check_counters_set(&r->counters, "engine 1.0", "max_running", 9);
    check_counters_set(&r->counters, "engine 1.0", "preemptions", 3);
    /* a decode engine publishes nothing the index holds */
    check_counters_set(&r->counters, "decode engine 2.0", "preemptions", 50);
    check_result_regime(r, &g);
    ck_assert(g.known);
    ck_assert(g.v[CHECK_REGIME_steps_multi] == 15);
    ck_assert(g.v[CHECK_REGIME_max_running] == 9);
    ck_assert(g.v[CHECK_REGIME_preemptions] == 3);
    ck_assert(g.v[CHECK_REGIME_max_inflight] == 0);
    ck_assert_str_eq(check_regime_name(CHECK_REGIME_evictions_in_store_steps),
                     "evictions_in_store_steps");
    check_result_free(r);
}
END_TEST

Suite *suite_sets(void) {
    Suite *s = suite_create("sets");
    TCase *tc = tcase_create("blocks");
    tcase_add_test(tc, copies_count_once_and_the_digest_ignores_order);
    tcase_add_test(tc, sets_differ_by_engine_only_index_only_and_parent);
    tcase_add_test(tc, blocks_cut_from_a_parent_no_tier_holds_compare_equal);
    tcase_add_test(tc, the_first_ten_differences_are_kept_all_are_counted);
    suite_add_tcase(s, tc);
    tc = tcase_create("checkpoints");
    tcase_add_test(tc, a_checkpoint_with_differences_fails_the_run_naming_them);
    tcase_add_test(tc, a_cpu_tier_difference_is_named_after_the_gpu_ones);
    tcase_add_test(tc, a_counter_read_at_the_checkpoint_names_the_cause_first);
    tcase_add_test(tc, a_prompt_re_checked_at_a_checkpoint_fails_it);
    suite_add_tcase(s, tc);
    tc = tcase_create("load");
    tcase_add_test(tc, staleness_counts_exact_over_and_under_with_percentiles);
    tcase_add_test(tc, the_regime_sums_counts_and_takes_the_largest_maxima);
    suite_add_tcase(s, tc);
    return s;
}
