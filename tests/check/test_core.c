/* The oracle's pure core: counters, rules, the per-prompt judge and the
 * verdict, driven by hand-made observations. */
#include "check_int.h"
#include "kt.h"

#include <math.h>
#include <string.h>

Suite *suite_core(void);

/* A 2-worker x 2-rank observation builder, and the arena its judged
 * prompts' per-slot arrays live in (until fix_fini). */
typedef struct obs_fix {
    uint32_t scores[4];
    int32_t probes[4];
    check_obs o;
    kvo_arena arena;
} obs_fix;

static void fix_init(obs_fix *f, uint32_t tokens, uint32_t chosen,
                     int64_t cached) {
    memset(f, 0, sizeof(*f));
    kvo_arena_init(&f->arena);
    f->o.id = 7;
    f->o.prompt_tokens = tokens;
    f->o.block_size = 16;
    f->o.n_slots = 4;
    f->o.dp_size = 2;
    f->o.chosen = chosen;
    f->o.index_scores = f->scores;
    f->o.probe_hits = f->probes;
    f->o.cached_tokens = cached;
}

static void fix_fini(obs_fix *f) { kvo_arena_fini(&f->arena); }

static void judge(obs_fix *f, check_prompt *p) {
    ck_assert_int_eq(check_prompt_judge(&f->o, &f->arena, p), KVO_OK);
}

START_TEST(agreeing_prompt_is_not_divergent) {
    obs_fix f;
    fix_init(&f, 100, 2, 3 * 16);
    uint32_t sc[4] = {0, 5, 3, 0};
    int32_t pr[4] = {0, 5, 3, 0};
    memcpy(f.scores, sc, sizeof(sc));
    memcpy(f.probes, pr, sizeof(pr));
    check_prompt p;
    judge(&f, &p);
    ck_assert(!p.diverged);
    ck_assert_int_eq(p.first_divergent_block, -1);
    ck_assert_uint_eq(p.worker, 1);
    ck_assert_uint_eq(p.dp_rank, 0);
    ck_assert_uint_eq(p.prompt_blocks, 7); /* ceil(100/16) */
    ck_assert_uint_eq(p.cap, 6);           /* (100-1)//16 */
    ck_assert_int_eq(p.engine_hit_blocks, 3);
    ck_assert_uint_eq(p.index_hit_blocks, 3);
    ck_assert_int_eq(p.reason, CHECK_REASON_NONE);
    fix_fini(&f);
}
END_TEST

START_TEST(index_score_is_capped_like_the_engine_before_comparing) {
    /* 64 tokens = 4 full blocks; the engine never serves the last one. */
    obs_fix f;
    fix_init(&f, 64, 0, 3 * 16);
    f.scores[0] = 4;
    f.probes[0] = 3;
    f.scores[3] = 4;
    f.probes[3] = 3;
    check_prompt p;
    judge(&f, &p);
    ck_assert(!p.diverged);
    ck_assert_uint_eq(p.index_hit_blocks, 3);
    ck_assert_uint_eq(p.index_raw_blocks, 4);
    fix_fini(&f);
}
END_TEST

START_TEST(index_behind_engine_is_a_missed_store_at_the_index_depth) {
    obs_fix f;
    fix_init(&f, 200, 1, 10 * 16);
    f.scores[1] = 4;
    f.probes[1] = 10;
    check_prompt p;
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert_int_eq(p.first_divergent_block, 4);
    ck_assert_int_eq(p.divergent_slot, 1);
    ck_assert_int_eq(p.reason, CHECK_REASON_MISSED_STORE);
    ck_assert_msg(strstr(p.detail, "worker 0 rank 1: engine 10 blocks, "
                                   "index 4") != NULL,
                  "%s", p.detail);
    fix_fini(&f);
}
END_TEST

START_TEST(index_ahead_of_engine_on_an_unchosen_worker_is_a_stale_block) {
    obs_fix f;
    fix_init(&f, 200, 0, 0);
    f.scores[2] = 6; /* worker 1 rank 0: index claims 6, engine evicted */
    f.probes[2] = 2;
    check_prompt p;
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert_int_eq(p.divergent_slot, 2);
    ck_assert_int_eq(p.first_divergent_block, 2);
    ck_assert_int_eq(p.reason, CHECK_REASON_STALE_BLOCK);
    fix_fini(&f);
}
END_TEST

START_TEST(blocks_on_the_sibling_rank_are_a_wrong_rank) {
    obs_fix f;
    fix_init(&f, 200, 3, 5 * 16);
    f.probes[3] = 5; /* engine: worker 1 rank 1 holds 5 */
    f.scores[3] = 0; /* index: not there ... */
    f.scores[2] = 5; /* ... but on rank 0 */
    f.probes[2] = 0;
    check_prompt p;
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert_int_eq(p.reason, CHECK_REASON_WRONG_RANK);
    ck_assert_int_eq(p.first_divergent_block, 0);
    fix_fini(&f);
}
END_TEST

START_TEST(a_rank_the_index_never_scored_is_a_wrong_rank) {
    /* both ranks share the prefix, so no sibling is in excess; but the
     * index never saw rank 1 at all (its events carried no rank) */
    obs_fix f;
    fix_init(&f, 200, 1, 2 * 16);
    f.probes[0] = 2;
    f.scores[0] = 2;
    f.probes[1] = 2; /* worker 0 rank 1 */
    f.scores[1] = 0;
    uint8_t seen[4] = {1, 0, 1, 1};
    check_prompt p;
    judge(&f, &p);
    ck_assert_int_eq(p.reason, CHECK_REASON_MISSED_STORE); /* no evidence */
    f.o.index_seen = seen;
    judge(&f, &p);
    ck_assert_int_eq(p.reason, CHECK_REASON_WRONG_RANK);
    ck_assert_msg(strstr(p.detail, "never scored rank 1"), "%s", p.detail);
    seen[1] = 1; /* it did score rank 1 before: a plain missed store */
    judge(&f, &p);
    ck_assert_int_eq(p.reason, CHECK_REASON_MISSED_STORE);
    fix_fini(&f);
}
END_TEST

START_TEST(a_rule_counter_that_moved_names_the_reason) {
    check_counters moved, total;
    check_counters_init(&moved);
    check_counters_init(&total);
    ck_assert_int_eq(check_counters_set(&moved, "indexer",
                                        "kvo_indexer_events_total{type=\""
                                        "stored\",status=\"parent_not_found\"}",
                                        2),
                     KVO_OK);
    ck_assert_int_eq(
        check_counters_set(&moved, "relay 0.0", "kvo_relay_hash_mismatches", 3),
        KVO_OK);
    obs_fix f;
    fix_init(&f, 200, 0, 8 * 16);
    f.probes[0] = 8;
    f.scores[0] = 1;
    f.o.moved = &moved;
    f.o.total = &total;
    check_prompt p;
    judge(&f, &p);
    /* both moved: the rule table puts hash mismatches first */
    ck_assert_int_eq(p.reason, CHECK_REASON_HASH_MISMATCH);
    ck_assert_msg(strstr(p.detail, "kvo_relay_hash_mismatches +3"), "%s",
                  p.detail);
    check_counters_clear(&moved);
    /* nothing moved now, but the total remembers an earlier unknown parent */
    ck_assert_int_eq(check_counters_set(&total, "indexer",
                                        "kvo_indexer_parent_not_found_total",
                                        1),
                     KVO_OK);
    judge(&f, &p);
    ck_assert_int_eq(p.reason, CHECK_REASON_UNKNOWN_PARENT);
    ck_assert_msg(strstr(p.detail, "earlier: 1"), "%s", p.detail);
    check_counters_fini(&moved);
    check_counters_fini(&total);
    fix_fini(&f);
}
END_TEST

START_TEST(
    probe_disagreeing_with_the_response_is_the_engine_contradicting_itself) {
    obs_fix f;
    fix_init(&f, 200, 0, 4 * 16);
    f.probes[0] = 6;
    f.scores[0] = 4;
    check_prompt p;
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert_int_eq(p.reason, CHECK_REASON_ENGINE);
    ck_assert_int_eq(p.first_divergent_block, 4);
    fix_fini(&f);
}
END_TEST

START_TEST(a_split_probe_judges_the_index_by_what_a_router_sees) {
    /* A hybrid model (or a tiered cache): the engine hits 3 blocks (every
     * group agrees; or GPU then CPU), a router indexing the full-attention
     * group (the GPU tier) must score 5 (2). The response tells the former. */
    obs_fix f;
    fix_init(&f, 200, 0, 3 * 16);
    int32_t own[4] = {3, 0, 0, 0};
    f.o.probe_cache_hits = own;
    f.probes[0] = 5;
    f.scores[0] = 5;
    check_prompt p;
    judge(&f, &p);
    ck_assert(!p.diverged);
    ck_assert_int_eq(p.engine_hit_blocks, 3);
    f.scores[0] = 3; /* the index followed the engine's hit: wrong */
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert_int_eq(p.reason, CHECK_REASON_MISSED_STORE);
    ck_assert_int_eq(p.first_divergent_block, 3);
    f.scores[0] = 5;
    own[0] = 4; /* the response contradicts the engine's own probe */
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert_int_eq(p.reason, CHECK_REASON_ENGINE);
    ck_assert_msg(strstr(p.detail, "probe 4 blocks"), "%s", p.detail);
    fix_fini(&f);
}
END_TEST

/* A tiered cache on every slot: the probe gives each rank's GPU run
 * (f->probes), its CPU run after it (cpu) and the GPU+CPU hit (own); the
 * index its device scores (f->scores) and host_pinned scores (host). */
typedef struct tier_fix {
    int32_t own[4], cpu[4];
    uint32_t host[4];
} tier_fix;

/* Slot s: GPU run g, CPU run c (the hit capped at cap), index device
 * score d and host_pinned score h. */
static void tier_slot(obs_fix *f, tier_fix *t, uint32_t s, int32_t g, int32_t c,
                      uint32_t d, uint32_t h) {
    int32_t cap = (int32_t)((f->o.prompt_tokens - 1) / f->o.block_size);
    f->probes[s] = g;
    t->cpu[s] = c;
    t->own[s] = g + c < cap ? g + c : cap;
    f->scores[s] = d;
    t->host[s] = h;
}

static void tier_init(obs_fix *f, tier_fix *t) {
    memset(t, 0, sizeof(*t));
    f->o.probe_cache_hits = t->own;
    f->o.probe_cpu = t->cpu;
    f->o.index_host_scores = t->host;
    f->o.index_tiered = true;
}

START_TEST(tiered_probes_agreeing_on_both_tiers_are_not_divergent) {
    obs_fix f;
    fix_init(&f, 200, 0, 7 * 16); /* cap 12 */
    tier_fix t;
    tier_init(&f, &t);
    tier_slot(&f, &t, 0, 3, 4, 3, 7);    /* GPU 3, then 4 from the CPU */
    tier_slot(&f, &t, 1, 0, 0, 0, 0);    /* nothing */
    tier_slot(&f, &t, 2, 12, 3, 13, 16); /* both capped at 12 */
    tier_slot(&f, &t, 3, 0, 2, 0, 2);    /* a CPU run only: blocks 0 */
    check_prompt p;
    judge(&f, &p);
    ck_assert_msg(!p.diverged, "%s", p.detail);
    ck_assert_int_eq(p.engine_hit_blocks, 7); /* the response: GPU+CPU */
    ck_assert_int_eq(p.engine_hits[0], 3);    /* the router's truth: GPU */
    ck_assert_uint_eq(p.index_hit_blocks, 3);
    /* the same probes with the CPU tier not judged (Dynamo's API) */
    f.o.index_host_scores = NULL;
    t.host[3] = 0;
    judge(&f, &p);
    ck_assert(!p.diverged);
    fix_fini(&f);
}
END_TEST

START_TEST(an_index_that_ignores_the_cpu_tier_is_behind_where_it_has_a_run) {
    /* vllm#43468's index: CPU stores dropped, so its host_pinned score is
     * its device score everywhere (no "tiers" in any answer) */
    obs_fix f;
    fix_init(&f, 200, 0, 7 * 16);
    tier_fix t;
    tier_init(&f, &t);
    f.o.index_tiered = false;
    tier_slot(&f, &t, 0, 3, 4, 3, 3);
    tier_slot(&f, &t, 2, 5, 0, 5, 5);
    tier_slot(&f, &t, 3, 1, 2, 1, 1);
    check_prompt p;
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert(p.tier_cpu);
    /* the shallowest of the tier's divergences: slot 3 at block 1 */
    ck_assert_int_eq(p.divergent_slot, 3);
    ck_assert_int_eq(p.first_divergent_block, 1);
    ck_assert_int_eq(p.reason, CHECK_REASON_MISSED_STORE);
    ck_assert_str_eq(p.detail,
                     "worker 1 rank 1 tier cpu: engine 3 blocks (gpu 1 + cpu "
                     "2), index 1 (the index never answered a tier: it "
                     "ignores the CPU tier)");
    ck_assert_int_eq(p.tier_engine_blocks, 3);
    ck_assert_uint_eq(p.tier_index_blocks, 1);
    /* an index that answers tiers but missed this run says no more */
    f.o.index_tiered = true;
    judge(&f, &p);
    ck_assert_str_eq(p.detail, "worker 1 rank 1 tier cpu: engine 3 blocks "
                               "(gpu 1 + cpu 2), index 1");
    /* an untiered probe on that slot (-1): not compared there */
    t.cpu[3] = -1;
    judge(&f, &p);
    ck_assert(p.diverged && p.divergent_slot == 0);
    ck_assert_int_eq(p.first_divergent_block, 3);
    fix_fini(&f);
}
END_TEST

START_TEST(an_index_over_claiming_the_cpu_tier_is_a_stale_block) {
    obs_fix f;
    fix_init(&f, 200, 0, 7 * 16);
    tier_fix t;
    tier_init(&f, &t);
    tier_slot(&f, &t, 0, 3, 4, 3, 9); /* the CPU evicted 2 the index keeps */
    check_prompt p;
    judge(&f, &p);
    ck_assert(p.diverged && p.tier_cpu);
    ck_assert_int_eq(p.divergent_slot, 0);
    ck_assert_int_eq(p.first_divergent_block, 7);
    ck_assert_int_eq(p.reason, CHECK_REASON_STALE_BLOCK);
    ck_assert_str_eq(p.detail, "worker 0 rank 0 tier cpu: engine 7 blocks "
                               "(gpu 3 + cpu 4), index 9");
    /* a sibling rank short the other way: the blocks went to the wrong
     * rank */
    tier_slot(&f, &t, 1, 0, 2, 0, 0);
    judge(&f, &p);
    ck_assert_int_eq(p.divergent_slot, 1); /* block 0: the shallowest */
    ck_assert_int_eq(p.reason, CHECK_REASON_WRONG_RANK);
    tier_slot(&f, &t, 1, 0, 0, 0, 0);
    /* a GPU divergence anywhere comes first, whatever its depth: the GPU
     * is what a router scores, and what the evidence speaks of */
    tier_slot(&f, &t, 2, 10, 0, 11, 11);
    judge(&f, &p);
    ck_assert(p.diverged && !p.tier_cpu);
    ck_assert_int_eq(p.divergent_slot, 2);
    ck_assert_int_eq(p.first_divergent_block, 10);
    tier_slot(&f, &t, 2, 0, 0, 0, 0);
    /* a response that disagrees with the GPU+CPU hit: the engine */
    f.o.cached_tokens = 6 * 16;
    judge(&f, &p);
    ck_assert_int_eq(p.reason, CHECK_REASON_ENGINE);
    ck_assert(!p.tier_cpu);
    f.o.cached_tokens = 7 * 16;
    /* re-checked at a checkpoint: the entry shows the tier's two sides */
    check_result *r;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 2, 2, 16), KVO_OK);
    f.o.cached_tokens = -1;
    const check_prompt *sp;
    ck_assert_int_eq(check_result_add_sweep(r, &f.o, &sp), KVO_OK);
    ck_assert(sp->diverged && sp->tier_cpu);
    ck_assert_int_eq(sp->engine_hit_blocks, 7);
    ck_assert_uint_eq(sp->index_hit_blocks, 9);
    check_result_free(r);
    fix_fini(&f);
}
END_TEST

START_TEST(unprobed_slots_are_not_compared_and_response_alone_is_truth) {
    obs_fix f;
    fix_init(&f, 200, 1, 3 * 16);
    f.o.probe_hits = NULL; /* a real vLLM: no probe */
    f.scores[0] = 9;       /* other workers cannot be checked */
    f.scores[1] = 3;
    check_prompt p;
    judge(&f, &p);
    ck_assert(!p.diverged);
    ck_assert_int_eq(p.engine_hits[0], -1);
    f.scores[1] = 2;
    judge(&f, &p);
    ck_assert(p.diverged);
    ck_assert_int_eq(p.first_divergent_block, 2);
    fix_fini(&f);
}
END_TEST

START_TEST(first_divergent_block_is_the_shallowest_over_all_slots) {
    obs_fix f;
    fix_init(&f, 400, 0, 9 * 16);
    f.probes[0] = 9;
    f.scores[0] = 7; /* diverges at 7 */
    f.probes[2] = 3;
    f.scores[2] = 5; /* diverges at 3 */
    check_prompt p;
    judge(&f, &p);
    ck_assert_int_eq(p.first_divergent_block, 3);
    ck_assert_int_eq(p.divergent_slot, 2);
    fix_fini(&f);
}
END_TEST

START_TEST(judge_refuses_nonsense_observations) {
    obs_fix f;
    fix_init(&f, 100, 4, 0); /* chosen out of range */
    check_prompt p;
    ck_assert_int_eq(check_prompt_judge(&f.o, &f.arena, &p), KVO_EINVAL);
    fix_fini(&f);
    fix_init(&f, 100, 0, 0);
    f.o.block_size = 0;
    ck_assert_int_eq(check_prompt_judge(&f.o, &f.arena, &p), KVO_EINVAL);
    fix_fini(&f);
}
END_TEST

START_TEST(prometheus_text_becomes_counters_with_labels_verbatim) {
    const char *text =
        "# HELP kvo_relay_gaps sequence gaps seen\n"
        "# TYPE kvo_relay_gaps counter\n"
        "kvo_relay_gaps 3\n"
        "kvo_relay_rejects{kind=\"block size\"} 2 1700000000000\n"
        "kvo_idx_latency_bucket{le=\"+Inf\"} 10\n"
        "weird{a=\"}\\\"x\"} NaN\n"
        "garbage line without value\n"
        "  \n"
        "kvo_relay_gaps 4\n";
    check_counters c;
    check_counters_init(&c);
    ck_assert_int_eq(
        check_counters_parse_prom(&c, "relay 0.0", text, strlen(text)), KVO_OK);
    ck_assert(check_counters_get(&c, "relay 0.0", "kvo_relay_gaps") == 4);
    ck_assert(check_counters_get(&c, "relay 0.0",
                                 "kvo_relay_rejects{kind=\"block size\"}") ==
              2);
    ck_assert(
        isnan(check_counters_get(&c, "relay 0.0", "weird{a=\"}\\\"x\"}")));
    ck_assert(check_counters_get(&c, "relay 0.0", "weird{a=\"}\\\"x\"}") != 0);
    ck_assert(isnan(check_counters_get(&c, "relay 0.1", "kvo_relay_gaps")));
    ck_assert_uint_eq(c.n, 4);
    check_counters_fini(&c);
}
END_TEST

START_TEST(json_counters_are_flattened_by_dotted_path) {
    static const char text[] =
        "{\"gaps\": 1, \"rejects\": {\"token_count\": 2}, \"ok\": true,"
        " \"name\": \"x\", \"list\": [5, {\"y\": 6}], \"big\": "
        "18446744073709551615, \"neg\": -3, \"ints\": [7, 8]}";
    kvo_json j;
    kvo_json_init(&j);
    ck_assert_int_eq(kvo_json_parse(&j, text, sizeof(text) - 1, NULL, NULL),
                     KVO_OK);
    check_counters c;
    check_counters_init(&c);
    ck_assert_int_eq(check_counters_parse_json(&c, "relay 1.0", j.root),
                     KVO_OK);
    ck_assert(check_counters_get(&c, "relay 1.0", "gaps") == 1);
    ck_assert(check_counters_get(&c, "relay 1.0", "rejects.token_count") == 2);
    ck_assert(check_counters_get(&c, "relay 1.0", "ok") == 1);
    ck_assert(check_counters_get(&c, "relay 1.0", "list.1.y") == 6);
    ck_assert(check_counters_get(&c, "relay 1.0", "big") > 1.8e19);
    ck_assert(isnan(check_counters_get(&c, "relay 1.0", "name")));
    /* a negative leaf, and a packed array of integers (no nodes) */
    ck_assert(check_counters_get(&c, "relay 1.0", "neg") == -3);
    ck_assert(check_counters_get(&c, "relay 1.0", "ints.1") == 8);
    kvo_json_fini(&j);
    check_counters_fini(&c);
}
END_TEST

START_TEST(moved_keeps_only_increases_and_rename_moves_a_stage) {
    check_counters a, b, m;
    check_counters_init(&a);
    check_counters_init(&b);
    check_counters_init(&m);
    check_counters_set(&a, "indexer", "x", 1);
    check_counters_set(&a, "indexer", "y", 5);
    check_counters_set(&b, "indexer", "x", 3);
    check_counters_set(&b, "indexer", "y", 5);
    check_counters_set(&b, "relay 0.0", "z", 2);
    ck_assert_int_eq(check_counters_moved(&m, &a, &b), KVO_OK);
    ck_assert_uint_eq(m.n, 2);
    ck_assert(check_counters_get(&m, "indexer", "x") == 2);
    ck_assert(check_counters_get(&m, "relay 0.0", "z") == 2);
    ck_assert(check_counters_sum(&b, "relay", "z") == 2);
    ck_assert(check_counters_sum(&b, "indexer", "x|y") == 8);
    ck_assert_int_eq(
        check_counters_rename_stage(&b, "relay 0.0", "relay 0.0 #1"), KVO_OK);
    ck_assert(check_counters_get(&b, "relay 0.0 #1", "z") == 2);
    check_counters_fini(&a);
    check_counters_fini(&b);
    check_counters_fini(&m);
}
END_TEST

START_TEST(rules_catch_rejections_but_not_healthy_counters) {
    ck_assert_ptr_nonnull(
        check_rule_find("relay 0.0", "kvo_relay_hash_mismatches"));
    ck_assert_ptr_nonnull(
        check_rule_find("relay 0.1", "kvo_relay_rejects{kind=\"block_size\"}"));
    ck_assert_ptr_nonnull(check_rule_find(
        "relay 0.1", "kvo_relay_replay_failures{kind=\"no_endpoint\"}"));
    ck_assert_ptr_nonnull(check_rule_find("relay 2.0", "rejects.token_count"));
    ck_assert_ptr_nonnull(check_rule_find(
        "indexer", "kvo_indexer_events_total{type=\"stored\",status=\""
                   "parent_not_found\"}"));
    /* recovered gaps, duplicates, ok statuses and histograms are fine */
    ck_assert_ptr_null(check_rule_find("relay 0.0", "kvo_relay_gaps"));
    ck_assert_ptr_null(
        check_rule_find("relay 0.0", "kvo_relay_duplicates_dropped"));
    ck_assert_ptr_null(check_rule_find(
        "indexer", "kvo_indexer_events_total{type=\"stored\",status=\"ok\"}"));
    ck_assert_ptr_null(check_rule_find(
        "indexer", "kvo_indexer_query_seconds_bucket{le=\"0.001\"}"));
    ck_assert_ptr_null(check_rule_find("check", "hash_mismatches"));
    /* an engine's errors, not its activity (kvo-mocker's /kvo/state) */
    static const char *const engine_errors[] = {
        "render_errors", "send_errors", "replay_cut", "replay_bad_requests"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(engine_errors); i++)
        ck_assert_msg(check_rule_find("engine 0.1", engine_errors[i]), "%s",
                      engine_errors[i]);
    static const char *const engine_activity[] = {
        "requests_added",    "requests_finished",
        "requests_aborted",  "requests_running",
        "requests_waiting",  "steps",
        "preemptions",       "prompt_tokens",
        "generated_tokens",  "computed_tokens",
        "prefix_queries",    "prefix_hits",
        "batches",           "events",
        "blocks_stored",     "blocks_removed",
        "cleared",           "used_blocks",
        "published_batches", "published_bytes",
        "replay_requests",   "replay_batches",
        "replay_buffered",   "record_errors",
        "resident_blocks",   "free_blocks",
        "last_seq"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(engine_activity); i++)
        ck_assert_msg(!check_rule_find("engine 0.1", engine_activity[i]), "%s",
                      engine_activity[i]);
    ck_assert_ptr_null(check_rule_find("decode engine 1.0", "render_errors"));
}
END_TEST

/* A result with three prompts on one slot. */
static check_result *three_prompts(bool diverge_at_2) {
    check_result *r = NULL;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 1, 1, 16), KVO_OK);
    for (uint64_t id = 0; id < 3; id++) {
        uint32_t score = id == 2 && diverge_at_2 ? 1 : 2;
        int32_t probe = 2;
        check_obs o = {.id = id,
                       .prompt_tokens = 100,
                       .block_size = 16,
                       .n_slots = 1,
                       .dp_size = 1,
                       .chosen = 0,
                       .index_scores = &score,
                       .probe_hits = &probe,
                       .cached_tokens = 32};
        ck_assert_int_eq(check_result_add(r, &o, NULL), KVO_OK);
    }
    return r;
}

START_TEST(verdict_passes_only_a_clean_run) {
    check_result *r = three_prompts(false);
    check_verdict_decide(r, &r->verdict);
    ck_assert(r->verdict.pass);
    ck_assert_str_eq(r->verdict.cause, "");
    const char *cause = NULL;
    ck_assert(check_result_passed(r, &cause));
    ck_assert_str_eq(cause, "");
    check_result_free(r);

    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert(!r->verdict.pass); /* nothing checked is not a pass */
    ck_assert(!check_result_passed(r, &cause));
    ck_assert_str_eq(cause, "no request was checked");
    check_result_free(r);
}
END_TEST

START_TEST(verdict_names_the_first_cause_in_trace_order) {
    check_result *r = three_prompts(true);
    check_verdict_decide(r, &r->verdict);
    ck_assert(!r->verdict.pass);
    ck_assert_msg(strstr(r->verdict.cause, "missed store: prompt 2 diverged "
                                           "at block 1"),
                  "%s", r->verdict.cause);

    /* a counter that tripped before prompt 1 came first */
    check_counters c;
    check_counters_init(&c);
    check_counters_set(&c, "relay 0.0", "kvo_relay_rejects{kind=\"medium\"}",
                       1);
    check_counters_set(&c, "relay 0.0", "kvo_relay_gaps", 9);
    ck_assert_int_eq(check_result_trips(r, &c, 1), KVO_OK);
    ck_assert_uint_eq(r->n_trips, 1);
    check_counters_set(&c, "relay 0.0", "kvo_relay_rejects{kind=\"medium\"}",
                       4);
    ck_assert_int_eq(check_result_trips(r, &c, 2), KVO_OK);
    ck_assert_uint_eq(r->n_trips, 1);
    ck_assert(r->trips[0].value == 4);
    ck_assert_int_eq(r->trips[0].before_prompt, 1);
    check_verdict_decide(r, &r->verdict);
    ck_assert_msg(strstr(r->verdict.cause, "rejected event: relay 0.0 "
                                           "kvo_relay_rejects") &&
                      strstr(r->verdict.cause, "before prompt 1"),
                  "%s", r->verdict.cause);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_REJECTED);

    /* a run error before prompt 0 beats both */
    check_result_error(r, 0, "watermark timeout before prompt 0");
    check_result_error(r, 1, "second error is ignored");
    check_verdict_decide(r, &r->verdict);
    ck_assert_str_eq(r->verdict.cause, "watermark timeout before prompt 0");
    check_counters_fini(&c);
    check_result_free(r);
}
END_TEST

/* A batch over the relay's --zmq-max-msg-bytes is lost (the relay counts
 * it as oversize and clears the rank); the index then refuses stores that
 * chain from it and the relay sees removes of blocks it never forwarded.
 * All trip at the same read: the verdict names the oversize batch. The
 * relay's connection counters are activity, not errors. */
START_TEST(an_oversize_batch_is_named_before_what_it_causes) {
    ck_assert_ptr_nonnull(check_rule_find("relay 0.0", "oversize"));
    ck_assert_ptr_nonnull(check_rule_find(
        "relay 1.0", "kvo_relay_source_oversize_total{source=\"0\"}"));
    static const char *const activity[] = {
        "kvo_relay_zmq_disconnects_total", "kvo_relay_zmq_reconnects_total",
        "kvo_relay_zmq_sockets_reopened_total",
        "kvo_relay_source_zmq_disconnects_total{source=\"0\"}"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(activity); i++)
        ck_assert_msg(!check_rule_find("relay 0.0", activity[i]), "%s",
                      activity[i]);
    check_result *r = three_prompts(false);
    check_counters c;
    check_counters_init(&c);
    check_counters_set(&c, "indexer",
                       "kvo_indexer_events_total{type=\"stored\",status=\""
                       "parent_not_found\"}",
                       1914);
    check_counters_set(&c, "relay 0.0", "kvo_relay_removes_unknown_total", 7);
    check_counters_set(&c, "relay 0.0", "kvo_relay_zmq_disconnects_total", 3);
    check_counters_set(&c, "relay 0.0", "kvo_relay_oversize_total", 2);
    ck_assert_int_eq(check_result_trips(r, &c, 1), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert(!r->verdict.pass);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_SEQ_GAP);
    ck_assert_msg(strstr(r->verdict.cause,
                         "relay 0.0 kvo_relay_oversize_total"
                         " = 2, first seen before prompt 1") &&
                      strstr(r->verdict.cause, "--zmq-max-msg-bytes"),
                  "%s", r->verdict.cause);
    check_counters_fini(&c);
    check_result_free(r);
}
END_TEST

/* r's verdict once c's rule counters are recorded, as read at the end. */
static void decide_at_end(check_result *r, const check_counters *c) {
    ck_assert_int_eq(check_result_trips(r, c, -1), KVO_OK);
    check_verdict_decide(r, &r->verdict);
}

START_TEST(counters_tripped_at_the_end_still_fail_the_run) {
    check_result *r = three_prompts(false);
    check_counters c;
    check_counters_init(&c);
    check_counters_set(&c, "indexer", "kvo_indexer_block_not_found_total", 2);
    decide_at_end(r, &c);
    ck_assert(!r->verdict.pass);
    ck_assert_msg(strstr(r->verdict.cause, "at the end"), "%s",
                  r->verdict.cause);
    check_counters_fini(&c);
    check_result_free(r);
}
END_TEST

/* The no-fault rule: a run with no injected fault must see no gap and no
 * recovery at all; under faults they are the expected answer, but a
 * recovery that failed is not. */
START_TEST(a_recovery_without_an_injected_fault_fails_the_run) {
    static const char *const clean_only[] = {
        "kvo_indexer_recoveries_dump_total",
        "kvo_indexer_recoveries_events_total",
        "kvo_indexer_recovery_requests_total",
        "kvo_indexer_gaps_total",
        "kvo_indexer_impossible_sequences_total",
        "kvo_indexer_live_held_dropped_total"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(clean_only); i++) {
        for (int faulted = 0; faulted < 2; faulted++) {
            check_result *r = three_prompts(false);
            r->faulted = faulted;
            check_counters c;
            check_counters_init(&c);
            check_counters_set(&c, "indexer", clean_only[i], 1);
            decide_at_end(r, &c);
            ck_assert_msg(r->verdict.pass == (bool)faulted, "%s faulted %d: %s",
                          clean_only[i], faulted, r->verdict.cause);
            if (!faulted) {
                ck_assert_msg(strstr(r->verdict.cause, clean_only[i]) &&
                                  strstr(r->verdict.cause,
                                         "recovery must never hide a bug"),
                              "%s", r->verdict.cause);
            }
            check_counters_fini(&c);
            check_result_free(r);
        }
    }
    /* an envelope NATS refused is recovered from the relay's ring: a fault
     * may cause it, a clean run may not */
    for (int faulted = 0; faulted < 2; faulted++) {
        check_result *r = three_prompts(false);
        r->faulted = faulted;
        check_counters c;
        check_counters_init(&c);
        check_counters_set(&c, "relay 1.0", "kvo_relay_publish_dropped_total",
                           1);
        decide_at_end(r, &c);
        ck_assert_msg(r->verdict.pass == (bool)faulted, "faulted %d: %s",
                      faulted, r->verdict.cause);
        check_counters_fini(&c);
        check_result_free(r);
    }
    /* a failed recovery (a stale relay) fails under faults too */
    check_result *r = three_prompts(false);
    r->faulted = true;
    check_counters c;
    check_counters_init(&c);
    check_counters_set(&c, "indexer #1", "kvo_indexer_recovery_failures_total",
                       1);
    decide_at_end(r, &c);
    ck_assert_msg(!r->verdict.pass &&
                      strstr(r->verdict.cause, "recovery_failures"),
                  "%s", r->verdict.cause);
    check_counters_fini(&c);
    check_result_free(r);
    /* recovery activity that is no recovery stays free */
    ck_assert_ptr_null(
        check_rule_find("indexer", "kvo_indexer_announces_total"));
    ck_assert_ptr_null(check_rule_find("indexer", "kvo_indexer_relays"));
    ck_assert_ptr_null(check_rule_find("indexer", "kvo_indexer_recovering"));
}
END_TEST

START_TEST(the_fault_plan_is_seeded_and_covers_every_kind_each_round) {
    check_cfg c;
    check_cfg_defaults(&c);
    check_fault *f = NULL;
    size_t n = 99;
    ck_assert(!check_cfg_faulted(&c));
    ck_assert_int_eq(check_faults_plan(&c, 300, 2, 1, &f, &n), KVO_OK);
    ck_assert_ptr_null(f);
    ck_assert_uint_eq(n, 0);
    c.chaos = true;
    c.chaos_seed = 7;
    c.chaos_every = 50;
    c.indexer_restart_at = 10;
    c.nats_kill_at = 400; /* beyond the run: not planned */
    ck_assert(check_cfg_faulted(&c));
    ck_assert_int_eq(check_faults_plan(&c, 300, 2, 2, &f, &n), KVO_OK);
    ck_assert_uint_eq(n, 6); /* 10, then 50 .. 250 */
    ck_assert_uint_eq(f[0].at, 10);
    ck_assert_int_eq(f[0].kind, CHECK_FAULT_INDEXER);
    bool seen[CHECK_FAULT_KIND_COUNT] = {false};
    for (size_t i = 1; i < n; i++) {
        ck_assert_uint_eq(f[i].at, 50 * i);
        ck_assert_int_ne(f[i].kind, CHECK_FAULT_ENGINE);
        ck_assert_uint_lt(f[i].worker, 2);
        ck_assert_uint_lt(f[i].rank, 2);
        ck_assert(!f[i].done);
        if (i <= 3) seen[f[i].kind] = true;
    }
    ck_assert(seen[CHECK_FAULT_RELAY] && seen[CHECK_FAULT_INDEXER] &&
              seen[CHECK_FAULT_NATS]);
    /* the same seed, the same plan; another seed, another one somewhere */
    check_fault *g = NULL;
    size_t m = 0;
    ck_assert_int_eq(check_faults_plan(&c, 300, 2, 2, &g, &m), KVO_OK);
    ck_assert_uint_eq(m, n);
    for (size_t i = 0; i < n; i++)
        ck_assert(g[i].kind == f[i].kind && g[i].worker == f[i].worker &&
                  g[i].rank == f[i].rank);
    kvo_free(g);
    bool differs = false;
    for (uint64_t seed = 8; seed < 40 && !differs; seed++) {
        c.chaos_seed = seed;
        ck_assert_int_eq(check_faults_plan(&c, 300, 2, 2, &g, &m), KVO_OK);
        for (size_t i = 0; i < m; i++)
            differs |= g[i].kind != f[i].kind || g[i].worker != f[i].worker;
        kvo_free(g);
    }
    ck_assert(differs);
    kvo_free(f);
    c.chaos_every = 0;
    ck_assert_int_eq(check_faults_plan(&c, 300, 2, 2, &f, &n), KVO_EINVAL);
}
END_TEST

START_TEST(a_fault_reports_its_recovery_as_counter_deltas) {
    check_fault f = {.at = 60,
                     .kind = CHECK_FAULT_INDEXER,
                     .done = true,
                     .down_ms = 412,
                     .heal_ms = -1};
    snprintf(f.target, sizeof(f.target), "kvo-indexer");
    check_counters before, after;
    check_counters_init(&before);
    check_counters_init(&after);
    check_counters_set(&before, "indexer", "kvo_indexer_dumps_applied_total",
                       3);
    check_counters_set(&after, "indexer", "kvo_indexer_dumps_applied_total", 5);
    check_counters_set(&after, "indexer",
                       "kvo_indexer_dump_blocks_applied_total", 3120);
    check_fault_base(&f, &before);
    check_fault_recovery(&f, &after);
    ck_assert(f.rec[CHECK_FAULT_REC_dumps_applied] == 2);
    ck_assert(f.rec[CHECK_FAULT_REC_dump_blocks_applied] == 3120);
    char line[400];
    check_fault_text(&f, line, sizeof(line));
    ck_assert_msg(strstr(line, "before request 60: indexer restart "
                               "kvo-indexer, back in 412 ms, no sync") &&
                      strstr(line, "dumps_applied +2, dump_blocks_applied "
                                   "+3120"),
                  "%s", line);
    check_fault_base(&f, NULL); /* a restarted indexer counts from 0 */
    check_fault_recovery(&f, &after);
    ck_assert(f.rec[CHECK_FAULT_REC_dumps_applied] == 5);
    check_counters_fini(&before);
    check_counters_fini(&after);
}
END_TEST

START_TEST(an_engine_error_counter_that_moved_fails_the_run) {
    /* kvo-mocker's /kvo/state counters, read after the last request, of an
     * otherwise clean run */
    check_result *r = three_prompts(false);
    check_counters c;
    check_counters_init(&c);
    /* activity, however much of it, is no cause; nor is a decode engine,
     * which publishes nothing the index holds */
    static const struct {
        const char *stage, *name;
        double value;
    } fine[] = {{"engine 1.0", "requests_aborted", 3},
                {"engine 1.0", "replay_requests", 5},
                {"engine 1.0", "replay_batches", 50},
                {"engine 1.0", "preemptions", 7},
                {"engine 1.0", "blocks_removed", 900},
                {"engine 1.0", "record_errors", 1},
                {"decode engine 2.0", "render_errors", 4}};
    for (size_t i = 0; i < KVO_ARRAY_LEN(fine); i++)
        check_counters_set(&c, fine[i].stage, fine[i].name, fine[i].value);
    decide_at_end(r, &c);
    ck_assert_msg(r->verdict.pass, "%s", r->verdict.cause);
    /* worker 1 rank 0 could not encode two batches: their events never
     * left it, whatever the index then shows */
    check_counters_set(&c, "engine 1.0", "render_errors", 2);
    decide_at_end(r, &c);
    ck_assert(!r->verdict.pass);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_ENGINE_ERROR);
    ck_assert_msg(strstr(r->verdict.cause, "engine error: engine 1.0 "
                                           "render_errors = 2, at the end"),
                  "%s", r->verdict.cause);
    check_counters_fini(&c);
    check_result_free(r);
}
END_TEST

START_TEST(a_stale_block_found_by_the_sweep_fails_the_run_last) {
    check_result *r = three_prompts(false);
    /* after the run, prompt 1 re-checked: worker 0 holds 2 blocks in the
     * index but the engine evicted them */
    uint32_t score = 2;
    int32_t probe = 0;
    check_obs o = {.id = 1,
                   .prompt_tokens = 100,
                   .block_size = 16,
                   .n_slots = 1,
                   .dp_size = 1,
                   .chosen = 0,
                   .index_scores = &score,
                   .probe_hits = &probe,
                   .cached_tokens = 32};
    ck_assert_int_eq(check_result_add_sweep(r, &o, NULL), KVO_EINVAL);
    o.cached_tokens = -1; /* a sweep sends no request */
    const check_prompt *p = NULL;
    ck_assert_int_eq(check_result_add_sweep(r, &o, &p), KVO_OK);
    ck_assert(p->diverged);
    ck_assert_int_eq(p->reason, CHECK_REASON_STALE_BLOCK);
    ck_assert_uint_eq(r->sweep_divergent, 1);
    check_verdict_decide(r, &r->verdict);
    ck_assert(!r->verdict.pass);
    ck_assert_msg(strstr(r->verdict.cause, "stale block: re-checked after the "
                                           "run, prompt 1 diverged at block 0"),
                  "%s", r->verdict.cause);
    /* a divergence during the run comes first */
    uint32_t bad = 0;
    int32_t two = 2;
    check_obs o2 = {.id = 3,
                    .prompt_tokens = 100,
                    .block_size = 16,
                    .n_slots = 1,
                    .dp_size = 1,
                    .chosen = 0,
                    .index_scores = &bad,
                    .probe_hits = &two,
                    .cached_tokens = 32};
    ck_assert_int_eq(check_result_add(r, &o2, NULL), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_msg(strstr(r->verdict.cause, "prompt 3 diverged"), "%s",
                  r->verdict.cause);
    check_result_free(r);
}
END_TEST

START_TEST(totals_and_worst_prompts) {
    check_result *r = three_prompts(true);
    check_totals t;
    check_result_totals(r, &t);
    ck_assert_uint_eq(t.requests, 3);
    ck_assert_uint_eq(t.prompt_tokens, 300);
    ck_assert_uint_eq(t.engine_hit_tokens, 96);
    ck_assert_uint_eq(t.index_hit_tokens, 5 * 16);
    ck_assert_uint_eq(t.divergent, 1);
    const check_prompt *w[5];
    ck_assert_uint_eq(check_result_worst(r, w, 5), 3);
    ck_assert_uint_eq(w[0]->id, 2);
    check_result_free(r);
}
END_TEST

START_TEST(a_command_line_keeps_every_argument_whole) {
    /* 200 arguments of 300 characters: none dropped, none cut short */
    char big[301];
    memset(big, 'x', 300);
    big[300] = '\0';
    chk_args a;
    chk_args_init(&a);
    ck_assert_int_eq(chk_args_set_port(&a, 1), KVO_EINVAL); /* no port yet */
    for (int i = 0; i < 200; i++) chk_arg(&a, "%d-%s", i, big);
    chk_arg_port(&a, "127.0.0.1:");
    ck_assert_int_eq(a.st, KVO_OK);
    ck_assert_uint_eq(a.n, 201);
    ck_assert_ptr_null(a.v[201]);
    for (int i = 0; i < 200; i++) {
        char want[320];
        snprintf(want, sizeof(want), "%d-%s", i, big);
        ck_assert_str_eq(a.v[i], want);
    }
    /* the port argument is rewritten on every try */
    ck_assert_int_eq(chk_args_set_port(&a, 4222), KVO_OK);
    ck_assert_str_eq(a.v[200], "127.0.0.1:4222");
    ck_assert_int_eq(chk_args_set_port(&a, 65535), KVO_OK);
    ck_assert_str_eq(a.v[200], "127.0.0.1:65535");
    chk_args_fini(&a);
}
END_TEST

START_TEST(a_command_line_out_of_memory_fails_instead_of_dropping) {
    bool failed = false, whole = false;
    for (long budget = 0; budget < 80; budget++) {
        chk_args a;
        chk_args_init(&a);
        kvo_alloc_fail_after(budget);
        for (int i = 0; i < 40; i++) chk_arg(&a, "--arg-%d", i);
        kvo_alloc_fail_after(-1);
        if (a.st == KVO_OK) {
            ck_assert_uint_eq(a.n, 40);
            whole = true;
        } else {
            /* the failure sticks: what came after it was not added */
            ck_assert_int_eq(a.st, KVO_ENOMEM);
            ck_assert_uint_lt(a.n, 40);
            ck_assert_int_eq(chk_args_set_port(&a, 1), KVO_EINVAL);
            failed = true;
        }
        chk_args_fini(&a);
    }
    ck_assert(failed && whole);
}
END_TEST

Suite *suite_core(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("judge");
    tcase_add_test(tc, agreeing_prompt_is_not_divergent);
    tcase_add_test(tc, index_score_is_capped_like_the_engine_before_comparing);
    tcase_add_test(tc,
                   index_behind_engine_is_a_missed_store_at_the_index_depth);
    tcase_add_test(
        tc, index_ahead_of_engine_on_an_unchosen_worker_is_a_stale_block);
    tcase_add_test(tc, blocks_on_the_sibling_rank_are_a_wrong_rank);
    tcase_add_test(tc, a_rank_the_index_never_scored_is_a_wrong_rank);
    tcase_add_test(tc, a_rule_counter_that_moved_names_the_reason);
    tcase_add_test(
        tc,
        probe_disagreeing_with_the_response_is_the_engine_contradicting_itself);
    tcase_add_test(tc,
                   unprobed_slots_are_not_compared_and_response_alone_is_truth);
    tcase_add_test(tc, a_split_probe_judges_the_index_by_what_a_router_sees);
    tcase_add_test(tc, tiered_probes_agreeing_on_both_tiers_are_not_divergent);
    tcase_add_test(
        tc, an_index_that_ignores_the_cpu_tier_is_behind_where_it_has_a_run);
    tcase_add_test(tc, an_index_over_claiming_the_cpu_tier_is_a_stale_block);
    tcase_add_test(tc, first_divergent_block_is_the_shallowest_over_all_slots);
    tcase_add_test(tc, judge_refuses_nonsense_observations);
    suite_add_tcase(s, tc);
    tc = tcase_create("counters");
    tcase_add_test(tc, prometheus_text_becomes_counters_with_labels_verbatim);
    tcase_add_test(tc, json_counters_are_flattened_by_dotted_path);
    tcase_add_test(tc, moved_keeps_only_increases_and_rename_moves_a_stage);
    tcase_add_test(tc, rules_catch_rejections_but_not_healthy_counters);
    suite_add_tcase(s, tc);
    tc = tcase_create("verdict");
    tcase_add_test(tc, verdict_passes_only_a_clean_run);
    tcase_add_test(tc, verdict_names_the_first_cause_in_trace_order);
    tcase_add_test(tc, an_oversize_batch_is_named_before_what_it_causes);
    tcase_add_test(tc, counters_tripped_at_the_end_still_fail_the_run);
    tcase_add_test(tc, an_engine_error_counter_that_moved_fails_the_run);
    tcase_add_test(tc, a_recovery_without_an_injected_fault_fails_the_run);
    tcase_add_test(tc,
                   the_fault_plan_is_seeded_and_covers_every_kind_each_round);
    tcase_add_test(tc, a_fault_reports_its_recovery_as_counter_deltas);
    tcase_add_test(tc, a_stale_block_found_by_the_sweep_fails_the_run_last);
    tcase_add_test(tc, totals_and_worst_prompts);
    suite_add_tcase(s, tc);
    tc = tcase_create("argv");
    tcase_add_test(tc, a_command_line_keeps_every_argument_whole);
    tcase_add_test(tc, a_command_line_out_of_memory_fails_instead_of_dropping);
    suite_add_tcase(s, tc);
    return s;
}
