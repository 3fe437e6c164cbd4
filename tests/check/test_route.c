/* Routing: the policies and the in-flight blocks the dynamo policy weighs,
 * driven by hand (check_route.c is pure). */
#include "check_int.h"
#include "kt.h"

#include <math.h>
#include <string.h>

Suite *suite_route(void);

/* n router hashes 1000+base.. and their sequence hashes into seq. */
static void prompt_seq(uint64_t base, size_t n, uint64_t *seq) {
    uint64_t h[64];
    ck_assert_uint_le(n, 64);
    for (size_t i = 0; i < n; i++) h[i] = 1000 + base + i;
    check_seq_hashes(h, n, seq);
}

START_TEST(round_robin_walks_the_workers_then_the_ranks) {
    check_router rt;
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_ROUND_ROBIN, 2, 2, 16, 1, 0, 0),
        KVO_OK);
    uint32_t scores[4] = {0, 9, 0, 0};
    static const uint32_t want[8] = {0, 2, 1, 3, 0, 2, 1, 3};
    for (uint64_t i = 0; i < 8; i++)
        ck_assert_uint_eq(check_router_pick(&rt, i, scores, 100, NULL, 0),
                          want[i]);
    check_router_fini(&rt);
}
END_TEST

START_TEST(kv_takes_the_highest_score_ties_to_the_least_used) {
    check_router rt;
    ck_assert_int_eq(check_router_init(&rt, CHECK_POLICY_KV, 3, 1, 16, 1, 0, 0),
                     KVO_OK);
    uint32_t scores[3] = {2, 5, 5};
    ck_assert_uint_eq(check_router_pick(&rt, 0, scores, 100, NULL, 0), 1);
    ck_assert_int_eq(check_router_start(&rt, 1, NULL, 0), KVO_OK);
    check_router_finish(&rt, 1, NULL, 0);
    /* slot 1 was used once: the tie goes to slot 2 */
    ck_assert_uint_eq(check_router_pick(&rt, 1, scores, 100, NULL, 0), 2);
    check_router_fini(&rt);
}
END_TEST

START_TEST(dynamo_weighs_uncached_blocks_against_blocks_in_flight) {
    /* 2 slots, block size 16; the prompt: 160 tokens = 10 blocks */
    check_router rt;
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1.0, 0, 0),
        KVO_OK);
    uint64_t seq[10], other[20];
    prompt_seq(0, 10, seq);
    prompt_seq(500, 20, other);
    uint32_t scores[2] = {6, 0};
    /* idle: cost = 1 x (10 - score) + 10 blocks it would hold */
    ck_assert_uint_eq(check_router_pick(&rt, 0, scores, 160, seq, 10), 0);
    ck_assert(rt.cost[0] == 14 && rt.cost[1] == 20);
    /* 20 other blocks in flight on slot 0 outweigh its 6 cached ones */
    ck_assert_int_eq(check_router_start(&rt, 0, other, 20), KVO_OK);
    ck_assert_uint_eq(check_router_pick(&rt, 1, scores, 160, seq, 10), 1);
    ck_assert(rt.cost[0] == 34 && rt.cost[1] == 20);
    /* a weight of 4 makes the cached blocks worth it again */
    rt.overlap_weight = 4;
    ck_assert_uint_eq(check_router_pick(&rt, 2, scores, 160, seq, 10), 0);
    ck_assert(rt.cost[0] == 46 && rt.cost[1] == 50);
    /* answered: slot 0 holds nothing again */
    check_router_finish(&rt, 0, other, 20);
    ck_assert_uint_eq(check_router_active_blocks(&rt, 0), 0);
    ck_assert_uint_eq(rt.inflight[0], 0);
    check_router_fini(&rt);
}
END_TEST

START_TEST(blocks_shared_by_requests_in_flight_count_once) {
    check_router rt;
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1.0, 0, 0),
        KVO_OK);
    uint64_t a[8], b[8];
    prompt_seq(0, 8, a);
    /* b shares a's first 5 blocks, then differs */
    uint64_t h[8];
    for (uint64_t i = 0; i < 8; i++) h[i] = i < 5 ? 1000 + i : 7000 + i;
    check_seq_hashes(h, 8, b);
    for (int i = 0; i < 5; i++) ck_assert_uint_eq(a[i], b[i]);
    for (int i = 5; i < 8; i++) ck_assert_uint_ne(a[i], b[i]);
    ck_assert_int_eq(check_router_start(&rt, 0, a, 8), KVO_OK);
    ck_assert_int_eq(check_router_start(&rt, 0, a, 8), KVO_OK);
    ck_assert_uint_eq(check_router_active_blocks(&rt, 0), 8);
    ck_assert_uint_eq(rt.inflight[0], 2);
    /* b would add only its 3 blocks of its own to slot 0 */
    uint32_t scores[2] = {0, 0};
    check_router_pick(&rt, 0, scores, 128, b, 8);
    ck_assert(rt.cost[0] == 8 + 11 && rt.cost[1] == 8 + 8);
    check_router_finish(&rt, 0, a, 8);
    ck_assert_uint_eq(check_router_active_blocks(&rt, 0), 8); /* still held */
    check_router_finish(&rt, 0, a, 8);
    ck_assert_uint_eq(check_router_active_blocks(&rt, 0), 0);
    check_router_fini(&rt);
}
END_TEST

START_TEST(dynamo_ties_go_to_the_fewest_in_flight_then_the_lowest_slot) {
    check_router rt;
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 3, 1, 16, 1.0, 0, 0),
        KVO_OK);
    uint64_t seq[4];
    prompt_seq(0, 4, seq);
    uint32_t scores[3] = {0, 0, 0};
    ck_assert_uint_eq(check_router_pick(&rt, 0, scores, 64, seq, 4), 0);
    /* a request holding no full block: in flight on 0, same costs */
    ck_assert_int_eq(check_router_start(&rt, 0, NULL, 0), KVO_OK);
    ck_assert_uint_eq(check_router_pick(&rt, 1, scores, 64, seq, 4), 1);
    ck_assert_int_eq(check_router_start(&rt, 1, NULL, 0), KVO_OK);
    ck_assert_uint_eq(check_router_pick(&rt, 2, scores, 64, seq, 4), 2);
    check_router_fini(&rt);
}
END_TEST

START_TEST(a_temperature_samples_the_softmax_from_a_seeded_generator) {
    /* slot 0 costs 4 blocks less than slot 1: at T = 4 it is picked with
     * probability 1 / (1 + e^-1) = 0.731 */
    uint64_t seq[10];
    prompt_seq(0, 10, seq);
    uint32_t scores[2] = {4, 0};
    uint32_t first[64];
    for (int round = 0; round < 2; round++) {
        check_router rt;
        ck_assert_int_eq(
            check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1.0, 4.0, 42),
            KVO_OK);
        int zero = 0;
        for (int i = 0; i < 4000; i++) {
            uint32_t s =
                check_router_pick(&rt, (uint64_t)i, scores, 160, seq, 10);
            if (i < 64) {
                if (round == 0)
                    first[i] = s;
                else
                    ck_assert_uint_eq(s, first[i]); /* same seed, same draws */
            }
            zero += s == 0;
        }
        ck_assert_msg(zero > 2800 && zero < 3050, "%d of 4000 to slot 0", zero);
        check_router_fini(&rt);
    }
    /* another seed draws otherwise */
    check_router rt;
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1.0, 4.0, 43),
        KVO_OK);
    bool differs = false;
    for (int i = 0; i < 64; i++)
        differs |= check_router_pick(&rt, (uint64_t)i, scores, 160, seq, 10) !=
                   first[i];
    ck_assert(differs);
    check_router_fini(&rt);
    /* T = 0: always the lowest cost */
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1.0, 0, 42),
        KVO_OK);
    for (int i = 0; i < 100; i++)
        ck_assert_uint_eq(
            check_router_pick(&rt, (uint64_t)i, scores, 160, seq, 10), 0);
    check_router_fini(&rt);
}
END_TEST

START_TEST(nonsense_weights_are_refused_and_a_failed_start_changes_nothing) {
    check_router rt;
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, -1, 0, 0),
        KVO_EINVAL);
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1, NAN, 0),
        KVO_EINVAL);
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1, INFINITY, 0),
        KVO_EINVAL);
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 0, 1, 16, 1, 0, 0),
        KVO_EINVAL);
    ck_assert_int_eq(
        check_router_init(&rt, CHECK_POLICY_DYNAMO, 2, 1, 16, 1, 0, 0), KVO_OK);
    uint64_t seq[40];
    prompt_seq(0, 40, seq);
    /* allocation failures at each growth of the slot's table, the later
     * ones after some blocks were added: each is undone */
    int failed = 0;
    uint64_t used = 0;
    for (long budget = 0; budget < 8; budget++) {
        kvo_map_clear(&rt.active[1]); /* grow from empty every time */
        kvo_map_fini(&rt.active[1]);
        kvo_alloc_fail_after(budget);
        kvo_status st = check_router_start(&rt, 1, seq, 40);
        kvo_alloc_fail_after(-1);
        if (st == KVO_OK) {
            used++;
            check_router_finish(&rt, 1, seq, 40);
            continue;
        }
        ck_assert_int_eq(st, KVO_ENOMEM);
        ck_assert_uint_eq(check_router_active_blocks(&rt, 1), 0);
        ck_assert_uint_eq(rt.inflight[1], 0);
        ck_assert_uint_eq(rt.used[1], used);
        failed++;
    }
    ck_assert_int_ge(failed, 2);
    check_router_fini(&rt);
}
END_TEST

Suite *suite_route(void) {
    Suite *s = suite_create("route");
    TCase *tc = tcase_create("policies");
    tcase_add_test(tc, round_robin_walks_the_workers_then_the_ranks);
    tcase_add_test(tc, kv_takes_the_highest_score_ties_to_the_least_used);
    tcase_add_test(tc, dynamo_weighs_uncached_blocks_against_blocks_in_flight);
    tcase_add_test(tc, blocks_shared_by_requests_in_flight_count_once);
    tcase_add_test(tc,
                   dynamo_ties_go_to_the_fewest_in_flight_then_the_lowest_slot);
    tcase_add_test(tc,
                   a_temperature_samples_the_softmax_from_a_seeded_generator);
    tcase_add_test(
        tc, nonsense_weights_are_refused_and_a_failed_start_changes_nothing);
    suite_add_tcase(s, tc);
    return s;
}
