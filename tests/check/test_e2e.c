/* kvo-check end to end: the real binary drives real nats-server, kvo-mocker,
 * kvo-relay and kvo-indexer processes. Each test asserts the exit code and
 * reads the JSON report; a failing one prints kvo-check's output (and, on
 * FAIL, kvo-check itself printed where the process logs are).
 *
 * Traces are shortened under sanitizers (every process is several times
 * slower there); every scenario still exercises what it is about. */
#include "kvo_check.h"
#include "kvo_http.h"
#include "tc.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

Suite *suite_e2e(void);

static char *trace1000(void) {
    return kt_src_path("traces/mooncake_conversation_1000.jsonl");
}

static const char *summary_str(const tc_run *r, const char *key) {
    json_object *v;
    if (!r->summary || !json_object_object_get_ex(r->summary, key, &v) || !v)
        return "";
    return json_object_get_string(v);
}

static double regime(const tc_run *r, const char *name);

/* FAIL (exit 1) with a cause that starts with cause_prefix (NULL: any). */
static void assert_fail(const tc_run *r, const char *cause_prefix) {
    if (r->exit_code != 1) tc_dump(r);
    ck_assert_int_eq(r->exit_code, 1);
    ck_assert_str_eq(summary_str(r, "verdict"), "FAIL");
    if (cause_prefix)
        ck_assert_msg(strncmp(summary_str(r, "cause"), cause_prefix,
                              strlen(cause_prefix)) == 0,
                      "cause: %s", summary_str(r, "cause"));
}

/* PASS with zero divergences, every planned request checked. */
static void assert_pass(const tc_run *r, size_t requests) {
    if (r->exit_code != 0 || !r->summary) tc_dump(r);
    ck_assert_msg(r->exit_code == 0, "kvo-check exited %d: %s", r->exit_code,
                  summary_str(r, "cause"));
    ck_assert_ptr_nonnull(r->summary);
    ck_assert_str_eq(summary_str(r, "verdict"), "PASS");
    ck_assert_int_eq(tc_int(r->summary, "divergent_prompts"), 0);
    ck_assert_int_eq(tc_int(r->summary, "requests"), (int64_t)requests);
    ck_assert_uint_eq(json_object_array_length(r->lines), requests);
}

START_TEST(the_quick_start_run_passes_with_evictions_and_renders) {
    /* scripts/run: 4 workers, block size 16, a cache that evicts, dynamo
     * routing under load */
    char *trace = trace1000();
    const char *limit = TC_SANITIZED ? "250" : "1000";
    const char *args[] = {
        "--spawn",   "--trace", trace,          "--limit", limit,
        "--workers", "4",       "--block-size", "16",      "--num-gpu-blocks",
        "32768",     "--load",  "--speedup",    "0",       "--policy",
        "dynamo",    NULL};
    tc_run r;
    tc_check(&r, "quick", args, 900);
    assert_pass(&r, (size_t)atoi(limit));
    ck_assert_str_eq(summary_str(&r, "mode"), "load");
    ck_assert_msg(strstr(summary_str(&r, "config"), "policy=dynamo"), "%s",
                  summary_str(&r, "config"));
    /* the cache really evicted, and the index followed */
    double removed = tc_counter(&r, "engine ", "blocks_removed");
    ck_assert_msg(removed > 1000, "only %.0f evictions", removed);
    ck_assert_msg(tc_counter(&r, "relay", "removes_forwarded") > 0,
                  "no "
                  "remove reached the index");
    /* the cache served something, and every checkpoint was exact */
    double hit = json_object_get_double(
        json_object_object_get(r.summary, "engine_hit_rate"));
    ck_assert_msg(hit > 0.01, "engine hit rate %.4f", hit);
    json_object *cks = json_object_object_get(r.summary, "checkpoints");
    ck_assert_uint_ge(json_object_array_length(cks), 2);
    for (size_t i = 0; i < json_object_array_length(cks); i++)
        ck_assert(json_object_get_boolean(json_object_object_get(
            json_object_array_get_idx(cks, i), "passed")));
    /* what the router saw, for every request; the load was real */
    json_object *st = json_object_object_get(r.summary, "staleness");
    ck_assert_int_eq(tc_int(st, "requests"), atoi(limit));
    ck_assert_msg(regime(&r, "steps_multi") > 0, "no step ran two requests");
    /* the HTML report, in a real browser when there is one */
    char why[256] = "";
    int rendered = tc_html_renders(r.html, why, sizeof(why));
    if (rendered < 0)
        printf("NOTICE: /usr/bin/chromium not installed: the HTML report was "
               "not rendered\n");
    else
        ck_assert_msg(rendered == 1, "%s", why);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* A trace written by the test. */
static char *write_trace(const char *dir, const char *const lines[]) {
    char *path = kvo_malloc(600);
    snprintf(path, 600, "%s/trace.jsonl", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (size_t i = 0; lines[i]; i++) fprintf(f, "%s\n", lines[i]);
    fclose(f);
    return path;
}

START_TEST(a_measured_prompt_goes_from_miss_to_hit_to_evicted) {
    /* One worker, 199 usable blocks. P = 1024 tokens = 64 blocks. */
    char *dir = kt_tmpdir("measured");
    const char *lines[] = {
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,"
        "\"hash_ids\":[9001,9002]}", /* P: never seen */
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,"
        "\"hash_ids\":[9001,9002]}", /* P again: cached */
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,"
        "\"hash_ids\":[7001,7002]}", /* fillers evict P ... */
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,"
        "\"hash_ids\":[7003,7004]}",
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,"
        "\"hash_ids\":[7005,7006]}",
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,"
        "\"hash_ids\":[7007,7008]}",
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,"
        "\"hash_ids\":[9001,9002]}", /* P after its eviction */
        NULL};
    char *trace = write_trace(dir, lines);
    const char *args[] = {"--spawn", "--trace",          trace, "--workers",
                          "1",       "--num-gpu-blocks", "200", NULL};
    tc_run r;
    tc_check(&r, "measured", args, 300);
    assert_pass(&r, 7);
    /* index hit as Dynamo reports it (uncapped score / prompt blocks) */
    int64_t before = tc_int(tc_line(&r, 0), "index_raw_blocks");
    int64_t cached = tc_int(tc_line(&r, 1), "index_raw_blocks");
    int64_t evicted = tc_int(tc_line(&r, 6), "index_raw_blocks");
    ck_assert_int_eq(tc_int(tc_line(&r, 1), "prompt_blocks"), 64);
    ck_assert_msg(before == 0 && cached == 64 && evicted == 0,
                  "index hit before/cached/evicted: %lld/%lld/%lld of 64",
                  (long long)before, (long long)cached, (long long)evicted);
    /* and the engine agreed each time (its hit is capped at 63) */
    ck_assert_int_eq(tc_int(tc_line(&r, 0), "engine_hit_blocks"), 0);
    ck_assert_int_eq(tc_int(tc_line(&r, 1), "engine_hit_blocks"), 63);
    ck_assert_int_eq(tc_int(tc_line(&r, 6), "engine_hit_blocks"), 0);
    tc_free(&r, false);
    unlink(trace);
    kvo_free(trace);
    rmdir(dir);
    kvo_free(dir);
}
END_TEST

START_TEST(disaggregated_prefill_publishes_and_decode_does_not) {
    char *trace = trace1000();
    const char *limit = TC_SANITIZED ? "40" : "150";
    const char *args[] = {"--spawn", "--trace",
                          trace,     "--limit",
                          limit,     "--workers",
                          "2",       "--decode-workers",
                          "2",       "--num-gpu-blocks",
                          "8192",    "--policy",
                          "kv",      NULL};
    tc_run r;
    tc_check(&r, "disagg", args, 600);
    assert_pass(&r, (size_t)atoi(limit));
    /* only the prefill workers are index slots ... */
    json_object *slots = json_object_object_get(r.summary, "slots");
    ck_assert_uint_eq(json_object_array_length(slots), 2);
    /* ... every request was decoded elsewhere, and the decode workers
     * published nothing */
    ck_assert_double_eq(tc_counter(&r, "decode engine", "requests_finished"),
                        atof(limit));
    ck_assert_double_eq(tc_counter(&r, "decode engine", "published_batches"),
                        0);
    ck_assert(tc_counter(&r, "engine ", "published_batches") > 0);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

START_TEST(dp_size_2_ranks_are_checked_separately) {
    char *trace = trace1000();
    const char *limit = TC_SANITIZED ? "60" : "200";
    const char *args[] = {"--spawn", "--trace",          trace,  "--limit",
                          limit,     "--workers",        "2",    "--dp-size",
                          "2",       "--num-gpu-blocks", "8192", NULL};
    tc_run r;
    tc_check(&r, "dp2", args, 600);
    assert_pass(&r, (size_t)atoi(limit));
    json_object *l3 = tc_line(&r, 3); /* request 3 -> worker 1 rank 1 */
    ck_assert_int_eq(tc_int(l3, "worker"), 1);
    ck_assert_int_eq(tc_int(l3, "dp_rank"), 1);
    ck_assert_uint_eq(
        json_object_array_length(json_object_object_get(l3, "index_scores")),
        4);
    /* both ranks of both workers published */
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < 2; k++) {
            char stage[32];
            snprintf(stage, sizeof(stage), "engine %d.%d", w, k);
            ck_assert_msg(tc_counter(&r, stage, "published_batches") > 0,
                          "%s published nothing", stage);
        }
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

START_TEST(token_id_prompts_agree_with_the_trace_extension) {
    /* the engine gets the prompt as token ids (as a real vLLM would) and is
     * probed with token_ids: the same tokens, the same verdict */
    char *trace = trace1000();
    const char *args[] = {
        "--spawn", "--trace",       trace,    "--limit",
        "25",      "--workers",     "2",      "--num-gpu-blocks",
        "8192",    "--prompt-form", "tokens", NULL};
    tc_run r;
    tc_check(&r, "tokens", args, 300);
    assert_pass(&r, 25);
    ck_assert_msg(strstr(summary_str(&r, "config"), "prompts=tokens"), "%s",
                  summary_str(&r, "config"));
    /* prompt 4 shares trace block 0 with earlier prompts: a real hit */
    ck_assert_int_eq(tc_int(tc_line(&r, 4), "engine_hit_blocks"), 32);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* summary.traffic.<name> (-1 when absent). */
static int64_t traffic(const tc_run *r, const char *name) {
    json_object *t, *v;
    if (!r->summary || !json_object_object_get_ex(r->summary, "traffic", &t) ||
        !t || !json_object_object_get_ex(t, name, &v))
        return -1;
    return json_object_get_int64(v);
}

/* Engine hit blocks summed over the run's prompts. */
static int64_t engine_hits(const tc_run *r) {
    int64_t sum = 0;
    for (size_t i = 0; i < json_object_array_length(r->lines); i++)
        sum +=
            tc_int(json_object_array_get_idx(r->lines, i), "engine_hit_blocks");
    return sum;
}

START_TEST(lora_tenants_and_images_together_pass) {
    /* every request salted by one of 3 tenants, half naming one of 2
     * adapters, half with an image, a CPU tier behind the GPU pool: equal
     * tokens under other keys must not
     * share router blocks (the index would score them where the engine
     * misses), the keyed prompts that do share must (hits happen), and the
     * relays verify every engine hash */
    char *trace = trace1000();
    const char *limit = TC_SANITIZED ? "60" : "120";
    const char *args[] = {"--spawn",
                          "--trace",
                          trace,
                          "--limit",
                          limit,
                          "--workers",
                          "2",
                          "--num-gpu-blocks",
                          "8192",
                          "--lora-adapters",
                          "2",
                          "--lora-fraction",
                          "0.5",
                          "--salt-tenants",
                          "3",
                          "--mm-fraction",
                          "0.5",
                          "--verify-engine-hash",
                          "--seed",
                          "7",
                          "--cpu-offload-blocks",
                          "8192",
                          NULL};
    tc_run r;
    tc_check(&r, "keys", args, 600);
    assert_pass(&r, (size_t)atoi(limit));
    int64_t n = atoi(limit);
    ck_assert_int_eq(traffic(&r, "salted"), n);
    ck_assert_int_gt(traffic(&r, "lora"), n / 4);
    ck_assert_int_lt(traffic(&r, "lora"), n * 3 / 4);
    ck_assert_int_gt(traffic(&r, "mm"), n / 4);
    ck_assert_msg(
        strstr(summary_str(&r, "config"), "lora=2@0.5 salt_tenants=3 mm=0.5"),
        "%s", summary_str(&r, "config"));
    ck_assert_int_gt(engine_hits(&r), 0);
    ck_assert(tc_counter(&r, "relay 0.0", "hash_verified") > 0);
    /* the CPU tier was used: evicted blocks went there, prefixes came back
     * from it (the index is judged on the GPU run and on the GPU+CPU hit,
     * the response on both), and the final checkpoint compared every
     * rank's CPU set with the index's host_pinned set */
    ck_assert(tc_counter(&r, "engine ", "cpu_stored") > 0);
    ck_assert(tc_counter(&r, "engine ", "cpu_hits") > 0);
    ck_assert_int_ge(tc_int(r.summary, "checkpoints_cpu_sets_compared"), 1);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

START_TEST(keyed_traffic_under_load_passes_its_checkpoints) {
    char *trace = trace1000();
    const char *args[] = {"--spawn",
                          "--load",
                          "--trace",
                          trace,
                          "--limit",
                          TC_SANITIZED ? "40" : "80",
                          "--workers",
                          "2",
                          "--num-gpu-blocks",
                          "8192",
                          "--checkpoint-every",
                          "20",
                          "--lora-adapters",
                          "3",
                          "--lora-fraction",
                          "0.3",
                          "--salt-tenants",
                          "2",
                          "--mm-fraction",
                          "0.3",
                          NULL};
    tc_run r;
    tc_check(&r, "keys-load", args, 600);
    if (r.exit_code != 0) tc_dump(&r);
    ck_assert_int_eq(r.exit_code, 0);
    ck_assert_str_eq(summary_str(&r, "verdict"), "PASS");
    ck_assert_int_gt(traffic(&r, "lora"), 0);
    ck_assert_int_gt(traffic(&r, "mm"), 0);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

START_TEST(a_reset_of_idle_engines_reaches_the_index) {
    /* before request 30 every engine drops its cache; the checkpoint right
     * after must find the index empty too, and later prompts start cold */
    char *trace = trace1000();
    const char *args[] = {"--spawn", "--trace",    trace, "--limit",
                          "60",      "--workers",  "2",   "--num-gpu-blocks",
                          "8192",    "--reset-at", "30",  NULL};
    tc_run r;
    tc_check(&r, "reset", args, 600);
    assert_pass(&r, 60);
    json_object *ck = json_object_object_get(r.summary, "checkpoints");
    ck_assert_uint_ge(json_object_array_length(ck), 2);
    ck_assert(tc_counter(&r, "relay 0.0", "revents_cleared") >= 2);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* Requests of a fault run, and the one its fault hits ("@" in its options):
 * fewer under sanitizers, every process being slower there. */
#define FAULT_LIMIT (TC_SANITIZED ? 50 : 120)
#define FAULT_AT (FAULT_LIMIT / 2)
/* A fault's options in place: FAULT_OPTS("--nats-kill-at", "@"). */
#define FAULT_OPTS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A spawned run with one fault that must PASS exactly: 2 workers of 8,192
 * blocks, FAULT_LIMIT requests, then `fault` (NULL-terminated; "@" stands
 * for FAULT_AT). */
static void fault_run_passes(tc_run *r, const char *tag,
                             const char *const fault[]) {
    char *trace = trace1000();
    char limit[16], at[16];
    snprintf(limit, sizeof(limit), "%d", FAULT_LIMIT);
    snprintf(at, sizeof(at), "%d", FAULT_AT);
    const char *args[24];
    size_t n = 0;
    const char *base[] = {"--spawn", "--trace",   trace, "--limit",
                          limit,     "--workers", "2",   "--num-gpu-blocks",
                          "8192"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(base); i++) args[n++] = base[i];
    for (size_t i = 0; fault[i] && n + 1 < KVO_ARRAY_LEN(args); i++)
        args[n++] = strcmp(fault[i], "@") == 0 ? at : fault[i];
    args[n] = NULL;
    tc_check(r, tag, args, 600);
    kvo_free(trace);
    assert_pass(r, FAULT_LIMIT);
}

START_TEST(a_relay_killed_mid_trace_is_replaced_and_the_check_passes) {
    tc_run r;
    fault_run_passes(&r, "restart", FAULT_OPTS("--relay-restart-at", "@"));
    /* the old relay's last counters are kept under a retired name; the new
     * one rebuilt worker 0 from a replay from seq 0 */
    ck_assert(tc_counter(&r, "relay 0.0 #", "batches_applied") > 0);
    ck_assert(tc_counter(&r, "relay 0.0", "replays_applied") > 0);
    tc_free(&r, false);
}
END_TEST

/* The summary's faults array: fault i, checked done and of `kind`. */
static json_object *fault_at(const tc_run *r, size_t i, const char *kind) {
    json_object *fs = json_object_object_get(r->summary, "faults");
    ck_assert_msg(fs && json_object_array_length(fs) > i, "no fault %zu", i);
    json_object *f = json_object_array_get_idx(fs, i);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(f, "kind")),
                     kind);
    ck_assert(json_object_get_boolean(json_object_object_get(f, "done")));
    ck_assert_ptr_nonnull(json_object_object_get(f, "heal_ms"));
    return f;
}

static double fault_rec(json_object *f, const char *name) {
    json_object *rec = json_object_object_get(f, "indexer_recovery");
    ck_assert_ptr_nonnull(rec);
    return json_object_get_double(json_object_object_get(rec, name));
}

START_TEST(an_indexer_restarted_mid_run_rebuilds_from_dumps_and_passes) {
    tc_run r;
    fault_run_passes(&r, "idx-restart",
                     FAULT_OPTS("--indexer-restart-at", "@"));
    /* the killed indexer's counters kept; the new one applied a dump of
     * every relay, and nothing else was lost */
    ck_assert(tc_counter(&r, "indexer #", "messages_applied") > 0);
    json_object *f = fault_at(&r, 0, "indexer");
    ck_assert_int_eq(tc_int(f, "before_request"), FAULT_AT);
    ck_assert_msg(fault_rec(f, "dumps_applied") >= 2, "dumps %.0f",
                  fault_rec(f, "dumps_applied"));
    ck_assert(fault_rec(f, "dump_blocks_applied") > 0);
    ck_assert(fault_rec(f, "recovery_failures") == 0);
    tc_free(&r, false);
}
END_TEST

START_TEST(an_engine_restarted_mid_run_is_cleared_in_the_index_and_passes) {
    tc_run r;
    /* two ranks: the engine comes back with each rank on its ports */
    fault_run_passes(&r, "engine-restart",
                     FAULT_OPTS("--engine-restart-at", "20", "--dp-size", "2"));
    fault_at(&r, 0, "engine");
    /* its relays saw the restart and cleared worker 0: request 20 (to
     * worker 0, round-robin) found both its ranks empty in the index, as in
     * the engine */
    json_object *p = tc_line(&r, 20);
    ck_assert_int_eq(tc_int(p, "worker"), 0);
    ck_assert_int_eq(tc_int(p, "engine_hit_blocks"), 0);
    json_object *scores = json_object_object_get(p, "index_scores");
    for (int s = 0; s < 2; s++)
        ck_assert_int_eq(
            json_object_get_int64(json_object_array_get_idx(scores, s)), 0);
    ck_assert(tc_counter(&r, "relay 0.0", "kvo_relay_restarts") >= 1);
    ck_assert(tc_counter(&r, "relay 0.1", "kvo_relay_restarts") >= 1);
    ck_assert(tc_counter(&r, "engine 0.0 #", "blocks_stored") > 0);
    ck_assert(tc_counter(&r, "engine 0.1 #", "blocks_stored") > 0);
    tc_free(&r, false);
}
END_TEST

START_TEST(a_nats_server_killed_mid_run_is_survived_exactly) {
    tc_run r;
    fault_run_passes(
        &r, "nats-kill",
        FAULT_OPTS("--nats-kill-at", "@", "--nats-down-ms", "300"));
    json_object *f = fault_at(&r, 0, "nats");
    ck_assert(json_object_get_double(json_object_object_get(f, "down_ms")) >=
              300);
    ck_assert(fault_rec(f, "recovery_failures") == 0);
    tc_free(&r, false);
}
END_TEST

/* Three clustered nats-servers; the relays' node is killed and comes back:
 * the relays reconnect to another node, the indexer never lost its own,
 * and the check stays exact. */
START_TEST(a_cluster_node_killed_mid_run_is_survived_exactly) {
    tc_run r;
    fault_run_passes(&r, "nats-cluster",
                     FAULT_OPTS("--nats-cluster", "3", "--nats-kill-at", "@",
                                "--nats-kill-node", "relay"));
    json_object *f = fault_at(&r, 0, "nats");
    ck_assert_str_eq(
        json_object_get_string(json_object_object_get(f, "target")),
        "nats-server[1]");
    ck_assert(fault_rec(f, "recovery_failures") == 0);
    /* three servers ran (their CPU is reported per node) */
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof(name), "nats-server[%d]", i);
        ck_assert_msg(!isnan(tc_counter(&r, "cpu", name)), "no %s", name);
    }
    tc_free(&r, false);
}
END_TEST

/* Chaos: a relay, the indexer and nats-server killed in a seeded order;
 * every kind at least once, and the check stays exact. */
START_TEST(a_chaos_run_with_every_kind_of_fault_passes) {
    char *trace = trace1000();
    const char *limit = TC_SANITIZED ? "90" : "300";
    const char *every = TC_SANITIZED ? "20" : "50";
    const char *args[] = {"--spawn", "--trace",   trace, "--limit",
                          limit,     "--workers", "2",   "--num-gpu-blocks",
                          "8192",    "--chaos",   "12",  "--chaos-every",
                          every,     NULL};
    tc_run r;
    tc_check(&r, "chaos", args, 900);
    assert_pass(&r, (size_t)atoi(limit));
    json_object *fs = json_object_object_get(r.summary, "faults");
    size_t n = json_object_array_length(fs);
    ck_assert_uint_ge(n, 3);
    bool relay = false, indexer = false, nats = false;
    for (size_t i = 0; i < n; i++) {
        json_object *f = json_object_array_get_idx(fs, i);
        const char *k =
            json_object_get_string(json_object_object_get(f, "kind"));
        relay |= strcmp(k, "relay") == 0;
        indexer |= strcmp(k, "indexer") == 0;
        nats |= strcmp(k, "nats") == 0;
        ck_assert(json_object_get_boolean(json_object_object_get(f, "done")));
    }
    ck_assert(relay && indexer && nats);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* Faults turn the clean-only rules off, never the check: a killed-expected
 * mutant still fails under chaos. */
START_TEST(a_killed_mutant_under_chaos_still_fails) {
    char *trace = trace1000();
    const char *args[] = {
        "--spawn", "--trace",       trace,        "--limit",
        "120",     "--workers",     "2",          "--num-gpu-blocks",
        "8192",    "--mutate",      "drop-store", "--chaos",
        "3",       "--chaos-every", "30",         NULL};
    tc_run r;
    tc_check(&r, "chaos-mutant", args, 600);
    assert_fail(&r, NULL);
    ck_assert_uint_ge(
        json_object_array_length(json_object_object_get(r.summary, "faults")),
        1);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

START_TEST(a_dropped_batch_is_recovered_by_replay) {
    char *trace = trace1000();
    const char *args[] = {"--spawn", "--trace",   trace, "--limit",
                          "20",      "--workers", "1",   "--drop-seq",
                          "3",       NULL};
    tc_run r;
    tc_check(&r, "drop-replay", args, 300);
    assert_pass(&r, 20);
    ck_assert(tc_counter(&r, "relay 0.0", "kvo_relay_gaps") >= 1);
    ck_assert(tc_counter(&r, "relay 0.0", "replays_applied") >= 1);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

START_TEST(a_dropped_batch_without_replay_fails_as_a_seq_gap) {
    char *trace = trace1000();
    const char *args[] = {"--spawn", "--trace",     trace, "--limit",
                          "20",      "--workers",   "1",   "--drop-seq",
                          "3",       "--no-replay", NULL};
    tc_run r;
    tc_check(&r, "drop-noreplay", args, 300);
    assert_fail(&r, "seq gap:");
    /* the process logs were kept and their place printed */
    char *out = tc_slurp(r.log);
    ck_assert_msg(out && strstr(out, "logs of every process are in"), "%s",
                  out ? out : "");
    ck_assert_msg(strstr(out, "kvo-check: FAIL: seq gap"), "%s", out);
    kvo_free(out);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* A block no prompt reaches: the forwarder adds a child the engine never
 * computed to one store batch. Judging prompts cannot see it; the
 * checkpoint's block sets must, naming the stale block. */
START_TEST(a_block_the_engine_never_stored_fails_at_a_checkpoint) {
    char *trace = trace1000();
    const char *args[] = {"--spawn", "--trace",
                          trace,     "--limit",
                          "30",      "--workers",
                          "1",       "--extra-block-seq",
                          "3",       "--checkpoint-every",
                          "10",      NULL};
    tc_run r;
    tc_check(&r, "extra-block", args, 300);
    assert_fail(&r, "stale block:");
    ck_assert_msg(strstr(summary_str(&r, "cause"),
                         "1 blocks in the index but not the engine") ||
                      strstr(summary_str(&r, "cause"),
                             "1 block in the index but not the engine"),
                  "cause: %s", summary_str(&r, "cause"));
    ck_assert_msg(
        strcmp(summary_str(&r, "caught_at"), "checkpoint 1: block sets") == 0,
        "caught at: %s", summary_str(&r, "caught_at"));
    ck_assert_int_eq(tc_int(r.summary, "divergent_prompts"), 0);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* Issue 13's repro: chained stores published without their parent. Every
 * divergent prompt must say "wrong parent" with the evidence (the parent
 * the engine chains the block under, and the index's: the root), not the
 * "missed store" its direction alone suggests. */
START_TEST(divergences_are_classified_from_the_evidence) {
    char *trace = trace1000();
    const char *args[] = {"--spawn",
                          "--trace",
                          trace,
                          "--limit",
                          TC_SANITIZED ? "60" : "100",
                          "--workers",
                          "4",
                          "--num-gpu-blocks",
                          "8192",
                          "--mutate",
                          "wrong-parent",
                          NULL};
    tc_run r;
    tc_check(&r, "diagnosis", args, 600);
    assert_fail(&r, "wrong parent:");
    size_t divergent = 0;
    for (size_t i = 0; i < json_object_array_length(r.lines); i++) {
        json_object *l = tc_line(&r, i), *v;
        if (!json_object_object_get_ex(l, "diverged", &v) ||
            !json_object_get_boolean(v))
            continue;
        divergent++;
        json_object_object_get_ex(l, "reason", &v);
        ck_assert_str_eq(json_object_get_string(v), "wrong parent");
        ck_assert(json_object_object_get_ex(l, "evidence", &v) && v);
        const char *ev = json_object_get_string(v);
        ck_assert_msg(strstr(ev, "the engine chains it under parent") &&
                          strstr(ev, "the index holds it under no parent"),
                      "evidence: %s", ev);
    }
    ck_assert_uint_gt(divergent, 0);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* The start of m's row: "not run" when the matrix has no scenario that
 * shows it (in this mode), else the expected outcome, observed. */
/* The matrix tests' --limit (shorter under sanitizers). */
#define MATRIX_LIMIT (TC_SANITIZED ? 60 : 120)
#define MATRIX_LIMIT_ARG (TC_SANITIZED ? "60" : "120")

/* The matrix's base: `kvo-check mutants [--load] --limit MATRIX_LIMIT`
 * (its cache: 8,192 GPU blocks). */
static check_cfg matrix_cfg(bool load) {
    check_cfg c;
    check_cfg_defaults(&c);
    c.load = load;
    c.limit = MATRIX_LIMIT;
    c.num_gpu_blocks = 8192;
    return c;
}

static void mutant_row(const check_mutant *m, bool load, char *row,
                       size_t size) {
    char opts[160];
    check_cfg base = matrix_cfg(load);
    if (!check_mutant_scenario(m, &base, opts, sizeof(opts)))
        snprintf(row, size, "\n%-18s %-8s %-8s -", m->name,
                 m->killed ? "killed" : "benign", "not run");
    else
        snprintf(row, size, "\n%-18s %-8s %-8s ok ", m->name,
                 m->killed ? "killed" : "benign",
                 m->killed ? "killed" : "passed");
}

/* The row of m names its incident (and the options of its scenario). */
static void assert_row_tells(const char *out, const check_mutant *m,
                             bool load) {
    char row[96], opts[160], tail[200];
    mutant_row(m, load, row, sizeof(row));
    const char *at = strstr(out, row);
    ck_assert_msg(at, "no row '%s' in:\n%s", row + 1, out);
    const char *eol = strchr(at + 1, '\n');
    size_t len = eol ? (size_t)(eol - at) : strlen(at);
    if (m->incident) {
        snprintf(tail, sizeof(tail), "[%s]", m->incident);
        ck_assert_msg(memmem(at, len, tail, strlen(tail)), "%.*s", (int)len,
                      at);
    }
    check_cfg base = matrix_cfg(load);
    if (check_mutant_scenario(m, &base, opts, sizeof(opts)) && opts[0]) {
        snprintf(tail, sizeof(tail), "{%s}", opts);
        ck_assert_msg(memmem(at, len, tail, strlen(tail)), "%.*s", (int)len,
                      at);
    }
}

START_TEST(mutants_matrix_kills_every_killed_mutant_and_spares_the_benign) {
    char *trace = trace1000();
    const char *args[] = {"mutants", "--trace",        trace,
                          "--limit", MATRIX_LIMIT_ARG, NULL};
    tc_run r;
    tc_check(&r, "mutants", args, 1500);
    char *out = tc_slurp(r.log);
    if (r.exit_code != 0) tc_dump(&r);
    ck_assert_int_eq(r.exit_code, 0);
    size_t n;
    const check_mutant *m = check_mutants(&n);
    for (size_t i = 0; i < n; i++) assert_row_tells(out, &m[i], false);
    ck_assert_ptr_nonnull(strstr(out, "every mutant behaved as expected"));
    kvo_free(out);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* ---- load mode -------------------------------------------------------------*/

/* summary.regime.<name> (-1 when absent). */
static double regime(const tc_run *r, const char *name) {
    json_object *g, *v;
    if (!r->summary || !json_object_object_get_ex(r->summary, "regime", &g) ||
        !g || !json_object_object_get_ex(g, name, &v))
        return -1;
    return json_object_get_double(v);
}

/* A trace of n requests that cannot all fit a 150-block cache: each has a
 * 512-token prompt (32 blocks; one trace block of 10, so prompts repeat)
 * and generates 512 tokens (32 blocks more). Four prompts fit at once;
 * four running requests outgrow the cache after 6 blocks each. */
static char *write_crowd_trace(const char *dir, int n) {
    char *path = kvo_malloc(600);
    snprintf(path, 600, "%s/crowd.jsonl", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++)
        fprintf(f,
                "{\"timestamp\":%d,\"input_length\":512,"
                "\"output_length\":512,\"hash_ids\":[%d]}\n",
                i * 50, 9000 + i % 10);
    fclose(f);
    return path;
}

START_TEST(a_closed_loop_load_run_batches_preempts_and_passes) {
    /* 8 requests in flight against one engine whose cache holds four
     * prompts: whatever the machine's speed, the requests in the engine
     * share steps, and four growing ones must preempt (each lives for 512
     * decode steps of real time, speedup 20, far longer than kvo-check
     * takes to send eight) */
    char *dir = kt_tmpdir("crowd");
    char *trace = write_crowd_trace(dir, 24);
    const char *args[] = {"--spawn",
                          "--trace",
                          trace,
                          "--workers",
                          "1",
                          "--num-gpu-blocks",
                          "150",
                          "--load",
                          "--concurrency",
                          "8",
                          "--speedup",
                          "20",
                          "--policy",
                          "dynamo",
                          "--checkpoint-every",
                          "8",
                          "--checkpoint-sweep",
                          "3",
                          NULL};
    tc_run r;
    tc_check(&r, "crowd", args, 600);
    assert_pass(&r, 24);
    ck_assert_str_eq(summary_str(&r, "mode"), "load");
    ck_assert_msg(regime(&r, "preemptions") > 0 &&
                      regime(&r, "steps_multi") > 0 &&
                      regime(&r, "max_running") >= 2,
                  "preemptions %.0f, multi-request steps %.0f, most running "
                  "%.0f",
                  regime(&r, "preemptions"), regime(&r, "steps_multi"),
                  regime(&r, "max_running"));
    /* checkpoints after 8 and 16 requests, and at the end: each exact;
     * the first two re-check a sample of 3 distinct prompts, the last one
     * every distinct prompt of the run (10) */
    json_object *cks = json_object_object_get(r.summary, "checkpoints");
    ck_assert_uint_eq(json_object_array_length(cks), 3);
    for (size_t i = 0; i < 3; i++) {
        json_object *c = json_object_array_get_idx(cks, i);
        ck_assert_int_eq(tc_int(c, "after_requests"), (int64_t)(8 * (i + 1)));
        ck_assert(json_object_get_boolean(json_object_object_get(c, "passed")));
        ck_assert_int_eq(tc_int(c, "sweep_prompts"), i < 2 ? 3 : 10);
    }
    /* every request says what the router saw */
    for (size_t i = 0; i < 24; i++) {
        json_object *l = tc_line(&r, i);
        ck_assert_int_eq(tc_int(l, "id"), (int64_t)i); /* trace order */
        ck_assert(tc_int(l, "inflight_at_route") < 8);
        (void)tc_int(l, "routed_index_blocks");
    }
    tc_free(&r, false);
    unlink(trace);
    kvo_free(trace);
    rmdir(dir);
    kvo_free(dir);
}
END_TEST

/* A load run against encoder mutant `mutant`: it must FAIL, its cause
 * starting with one of the '|'-separated prefixes (none: any cause). */
static void load_mutant_fails(const char *mutant, const char *causes) {
    char *trace = trace1000();
    const char *args[] = {"--spawn",
                          "--trace",
                          trace,
                          "--limit",
                          TC_SANITIZED ? "60" : "150",
                          "--workers",
                          "2",
                          "--num-gpu-blocks",
                          "8192",
                          "--load",
                          "--speedup",
                          "0",
                          "--checkpoint-every",
                          "50",
                          "--mutate",
                          mutant,
                          NULL};
    tc_run r;
    tc_check(&r, mutant, args, 600);
    assert_fail(&r, NULL);
    const char *cause = summary_str(&r, "cause");
    bool ok = !causes;
    for (const char *p = causes; p && *p && !ok;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        ok = strncmp(cause, p, len) == 0;
        p = bar ? bar + 1 : p + len;
    }
    ck_assert_msg(ok, "%s: cause: %s", mutant, cause);
    tc_free(&r, false);
    kvo_free(trace);
}

START_TEST(a_duplicate_store_under_load_fails) {
    /* a second BlockStored for one copy: the relay's count never reaches
     * zero, the index keeps evicted blocks */
    load_mutant_fails("dup-store", NULL);
}
END_TEST

START_TEST(a_dropped_store_under_load_fails) {
    load_mutant_fails("drop-store", NULL);
}
END_TEST

/* The pid of the first child of parent whose command is name, 0 if none. */
static size_t children_of(pid_t pid, pid_t *out, size_t max);
static pid_t child_named(pid_t parent, const char *name);

START_TEST(an_engine_dying_under_load_ends_the_run_naming_it) {
    /* SIGKILL one spawned kvo-mocker while requests are in flight: the run
     * ends -- no hang, no vague timeout -- with a FAIL naming it */
    char *trace = trace1000();
    char *dir = kt_tmpdir("dying");
    char out[600], logs[600], json[600];
    snprintf(out, sizeof(out), "%s/kvo-check.out", dir);
    snprintf(logs, sizeof(logs), "%s/logs", dir);
    snprintf(json, sizeof(json), "%s/report.jsonl", dir);
    char *exe = kt_bin_path("kvo-check");
    char *argv[] = {
        exe, "--spawn",          "--trace", trace,       "--workers",
        "2", "--num-gpu-blocks", "8192",    "--load",    "--speedup",
        "1", "--report-json",    json,      "--log-dir", logs,
        NULL};
    kvo_proc p;
    memset(&p, 0, sizeof(p));
    ck_assert_int_eq(kvo_proc_spawn(&p, "kvo-check", argv, out), KVO_OK);
    /* once both engines and both relays run, requests are on their way */
    pid_t victim = 0;
    uint64_t deadline = kvo_now_ns() + 120 * 1000000000ull;
    while (kvo_proc_alive(&p) && kvo_now_ns() < deadline) {
        pid_t kids[32];
        if (children_of(p.pid, kids, 32) >= 6 &&
            (victim = child_named(p.pid, "kvo-mocker")) != 0)
            break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(victim > 0, "no kvo-mocker appeared");
    struct timespec settle = {1, 0}; /* real time: requests take seconds */
    nanosleep(&settle, NULL);
    kill(victim, SIGKILL);
    deadline = kvo_now_ns() + 120 * 1000000000ull;
    while (kvo_proc_alive(&p) && kvo_now_ns() < deadline) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    if (kvo_proc_alive(&p)) {
        kvo_proc_stop(&p, 1000);
        ck_abort_msg("kvo-check did not end after its engine died");
    }
    char *text = tc_slurp(out);
    ck_assert_msg(p.exit_status == 1, "exit %d:\n%s", p.exit_status, text);
    ck_assert_msg(
        strstr(text, "kvo-check: FAIL: ") &&
            (strstr(text, "kvo-mocker[") || strstr(text, "/v1/completions")),
        "%s", text);
    kvo_free(text);
    kvo_free(exe);
    kvo_free(trace);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* a leftover temp dir only */
    }
    kvo_free(dir);
}
END_TEST

START_TEST(mutants_under_load_are_caught_at_a_checkpoint) {
    /* the matrix in load mode: every killed mutant killed at a checkpoint
     * (by its block sets, its counters or its sweep), the benign pass */
    char *trace = trace1000();
    const char *args[] = {"mutants",
                          "--load",
                          "--trace",
                          trace,
                          "--limit",
                          MATRIX_LIMIT_ARG,
                          "--checkpoint-every",
                          TC_SANITIZED ? "20" : "40",
                          NULL};
    tc_run r;
    tc_check(&r, "mutants-load", args, 1500);
    char *out = tc_slurp(r.log);
    if (r.exit_code != 0) tc_dump(&r);
    ck_assert_int_eq(r.exit_code, 0);
    size_t n;
    const check_mutant *m = check_mutants(&n);
    for (size_t i = 0; i < n; i++) {
        char row[96];
        mutant_row(&m[i], true, row, sizeof(row));
        assert_row_tells(out, &m[i], true);
        const char *at = strstr(out, row);
        ck_assert_msg(at, "no row '%s' in:\n%s", row + 1, out);
        if (strstr(row, "not run")) continue;
        /* "... ok   1.2s  checkpoint 1: counters  ..." */
        const char *where = strstr(at + strlen(row), "s  ");
        ck_assert_ptr_nonnull(where);
        where += 3;
        if (m[i].killed)
            ck_assert_msg(strncmp(where, "checkpoint ", 11) == 0, "%.120s",
                          at + 1);
        else
            ck_assert_msg(where[0] == '-', "%.120s", at + 1);
    }
    ck_assert_ptr_nonnull(strstr(out, "every mutant behaved as expected"));
    kvo_free(out);
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* A kvo-mocker started by the test; returns its base URL (malloc'd). */
static char *start_mocker(kt_proc *m, const char *blocks) {
    uint16_t port;
    ck_assert_int_eq(kvo_free_port(&port), KVO_OK);
    char ps[16], url[96];
    snprintf(ps, sizeof(ps), "%u", port);
    const char *args[] = {"--port",
                          ps,
                          "--zmq-port",
                          "0",
                          "--replay-port",
                          "0",
                          "--num-gpu-blocks",
                          blocks,
                          "--log-level",
                          "warn",
                          NULL};
    kt_proc_start(m, "kvo-mocker", args);
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/health", port);
    kt_proc_wait_http(m, url, 20000);
    snprintf(url, sizeof(url), "http://127.0.0.1:%u", port);
    return kvo_strdup(url);
}

START_TEST(running_mockers_are_checked_with_exact_watermarks) {
    /* --engines: the engines run already; kvo-check brings NATS, the
     * relays (from /kvo/event_sources) and the indexer */
    kt_proc m0, m1;
    char *u0 = start_mocker(&m0, "8192"), *u1 = start_mocker(&m1, "8192");
    char engines[256];
    snprintf(engines, sizeof(engines), "%s,%s", u0, u1);
    char *trace = trace1000();
    const char *args[] = {"--engines", engines,   "--trace",
                          trace,       "--limit", TC_SANITIZED ? "20" : "60",
                          NULL};
    tc_run r;
    tc_check(&r, "attach", args, 600);
    assert_pass(&r, TC_SANITIZED ? 20 : 60);
    ck_assert_msg(strstr(summary_str(&r, "config"), "attach workers=2") &&
                      strstr(summary_str(&r, "config"), "watermark=exact"),
                  "%s", summary_str(&r, "config"));
    tc_free(&r, false);
    ck_assert_int_eq(kt_proc_stop(&m0), 0);
    ck_assert_int_eq(kt_proc_stop(&m1), 0);
    kvo_free(u0);
    kvo_free(u1);
    kvo_free(trace);
}
END_TEST

/* GET base+path as JSON (the caller puts it). */
static json_object *get_json(const char *base, const char *path) {
    char url[256];
    snprintf(url, sizeof(url), "%s%s", base, path);
    kvo_http_client *h;
    ck_assert_int_eq(kvo_http_client_new(&h, 10000), KVO_OK);
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    ck_assert_int_eq(kvo_http_get(h, url, &resp), KVO_OK);
    ck_assert_int_eq(resp.status, 200);
    ck_assert_int_eq(kvo_buf_cstr(&resp.body), KVO_OK);
    json_object *j = json_tokener_parse((const char *)resp.body.data);
    ck_assert_msg(j != NULL, "%s: not JSON", url);
    kvo_http_resp_fini(&resp);
    kvo_http_client_free(h);
    return j;
}

/* counters.replay_bad_requests of rank 0 in an engine's /kvo/state. */
static int64_t bad_replay_requests(const char *engine) {
    json_object *st = get_json(engine, "/kvo/state"), *ranks, *c, *v;
    ck_assert(json_object_object_get_ex(st, "ranks", &ranks));
    json_object *r0 = json_object_array_get_idx(ranks, 0);
    ck_assert(json_object_object_get_ex(r0, "counters", &c) &&
              json_object_object_get_ex(c, "replay_bad_requests", &v));
    int64_t n = json_object_get_int64(v);
    json_object_put(st);
    return n;
}

START_TEST(an_engine_error_counter_fails_an_otherwise_clean_run) {
    /* A stray client sends a running kvo-mocker a replay request it cannot
     * read (no delimiter, no seq): the engine counts it in
     * replay_bad_requests. Every prompt then agrees, but an engine error
     * counter moved: FAIL, naming the engine, its rank and the counter. */
    kt_proc m;
    char *engine = start_mocker(&m, "8192");
    json_object *srcs = get_json(engine, "/kvo/event_sources"), *ep;
    ck_assert(json_object_object_get_ex(json_object_array_get_idx(srcs, 0),
                                        "replay_endpoint", &ep));
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_connect(d, json_object_get_string(ep)), 0);
    ck_assert_int_eq(zmq_send(d, "abc", 3, 0), 3);
    json_object_put(srcs);
    /* until the engine has read it (its loop serves replays as they come) */
    for (int i = 0; i < 1000 && bad_replay_requests(engine) == 0; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(bad_replay_requests(engine), 1);
    zmq_close(d);
    zmq_ctx_term(ctx);

    char *trace = trace1000();
    const char *args[] = {"--engines", engine, "--trace", trace,
                          "--limit",   "5",    NULL};
    tc_run r;
    tc_check(&r, "engine-error", args, 300);
    assert_fail(&r, "engine error: engine 0.0 replay_bad_requests = 1,");
    ck_assert_int_eq(tc_int(r.summary, "divergent_prompts"), 0);
    tc_free(&r, false);
    ck_assert_int_eq(kt_proc_stop(&m), 0);
    kvo_free(engine);
    kvo_free(trace);
}
END_TEST

START_TEST(an_external_pipeline_is_checked_after_a_quiet_period) {
    /* Everything runs already -- engine, relay, NATS, indexer -- as a
     * user's own deployment would: kvo-check only drives and compares, and
     * without a watermark of its own relays it waits for quiet. */
    kt_nats nats;
    kt_nats_start(&nats);
    kt_proc idx, relay, m;
    uint16_t ip, rp;
    ck_assert_int_eq(kvo_free_port(&ip), KVO_OK);
    char ihost[32], iurl[96];
    snprintf(ihost, sizeof(ihost), "127.0.0.1:%u", ip);
    const char *iargs[] = {"--nats", nats.url, "--http", ihost, NULL};
    kt_proc_start(&idx, "kvo-indexer", iargs);
    snprintf(iurl, sizeof(iurl), "http://%s/health", ihost);
    kt_proc_wait_http(&idx, iurl, 20000);
    snprintf(iurl, sizeof(iurl), "http://%s", ihost);
    char *engine = start_mocker(&m, "8192");
    ck_assert_int_eq(kvo_free_port(&rp), KVO_OK);
    char rhost[32], rurl[96];
    snprintf(rhost, sizeof(rhost), "127.0.0.1:%u", rp);
    const char *rargs[] = {"--discover",    engine,        "--nats",
                           nats.url,        "--worker-id", "0",
                           "--replay-from", "0",           "--metrics-listen",
                           rhost,           NULL};
    kt_proc_start(&relay, "kvo-relay", rargs);
    snprintf(rurl, sizeof(rurl), "http://%s/health", rhost);
    kt_proc_wait_http(&relay, rurl, 20000);
    char *trace = trace1000();
    const char *args[] = {"--engines", engine,    "--indexer",   iurl,
                          "--nats",    nats.url,  "--no-relays", "--settle-ms",
                          "200",       "--trace", trace,         "--limit",
                          "12",        NULL};
    tc_run r;
    tc_check(&r, "external", args, 600);
    assert_pass(&r, 12);
    ck_assert_msg(strstr(summary_str(&r, "config"), "watermark=settle"), "%s",
                  summary_str(&r, "config"));
    /* the user's processes are left running: kvo-check stops only its own */
    ck_assert(kvo_proc_alive(&relay.proc) && kvo_proc_alive(&idx.proc) &&
              kvo_proc_alive(&m.proc));
    tc_free(&r, false);
    ck_assert_int_eq(kt_proc_stop(&relay), 0);
    ck_assert_int_eq(kt_proc_stop(&m), 0);
    ck_assert_int_eq(kt_proc_stop(&idx), 0);
    kt_nats_stop(&nats);
    kvo_free(engine);
    kvo_free(trace);
}
END_TEST

/* ---- Dynamo's standalone-indexer API --------------------------------------*/

/* Every checkpoint of r passed, and block sets were compared at each
 * (compared) or at none. */
static void assert_checkpoints(const tc_run *r, bool compared) {
    json_object *cks = json_object_object_get(r->summary, "checkpoints");
    ck_assert_uint_ge(json_object_array_length(cks), 1);
    for (size_t i = 0; i < json_object_array_length(cks); i++) {
        json_object *c = json_object_array_get_idx(cks, i);
        ck_assert(json_object_get_boolean(json_object_object_get(c, "passed")));
        ck_assert_int_eq(json_object_get_boolean(
                             json_object_object_get(c, "block_sets_compared")),
                         compared);
    }
}

START_TEST(a_dynamo_indexer_is_checked_through_its_own_api) {
    /* kvo-indexer --dynamo-http reads every engine rank's ZMQ itself, as
     * registered by kvo-check: no relay, no NATS on the way; kvo's
     * watermark extension keeps it exact, its views give full checkpoints */
    char *trace = trace1000();
    const char *limit = TC_SANITIZED ? "200" : "1000";
    const char *args[] = {"--spawn",
                          "--indexer-api",
                          "dynamo",
                          "--trace",
                          trace,
                          "--limit",
                          limit,
                          "--workers",
                          "4",
                          "--dp-size",
                          "2",
                          "--num-gpu-blocks",
                          "8192",
                          "--policy",
                          "kv",
                          "--model-name",
                          "m-under-test",
                          NULL};
    tc_run r;
    tc_check(&r, "dynamo", args, 900);
    assert_pass(&r, (size_t)atoi(limit));
    const char *cfg = summary_str(&r, "config");
    ck_assert_msg(strstr(cfg, "indexer_api=dynamo model_name=m-under-test") &&
                      strstr(cfg, "watermark=exact"),
                  "%s", cfg);
    assert_checkpoints(&r, true);
    /* eight ranks registered, queried by hash; evictions followed */
    ck_assert_int_eq(
        (int)tc_counter(
            &r, "indexer",
            "dynamo_kvindexer_requests_total{endpoint=\"/register\""),
        8);
    ck_assert(tc_counter(&r, "indexer",
                         "dynamo_kvindexer_requests_total{endpoint=\"/query_"
                         "by_hash\"") >= atoi(limit));
    ck_assert_msg(tc_counter(&r, "engine ", "blocks_removed") > 1000,
                  "the caches did not evict");
    ck_assert(tc_counter(&r, "relay (indexer)", "kvo_relay_removes_forwarded") >
              0);
    tc_free(&r, false);

    /* an encoder bug is caught the same way in this mode */
    const char *bad[] = {
        "--spawn", "--indexer-api", "dynamo",     "--trace",
        trace,     "--limit",       "60",         "--workers",
        "2",       "--dp-size",     "2",          "--num-gpu-blocks",
        "8192",    "--mutate",      "drop-store", NULL};
    tc_check(&r, "dynamo-mutant", bad, 600);
    assert_fail(&r, "unknown parent");
    tc_free(&r, false);
    kvo_free(trace);
}
END_TEST

/* A stand-in for Dynamo's own indexer: kvo-indexer's Dynamo listener
 * behind a proxy that answers 404 to kvo's extensions (GET /watermark,
 * GET /blocks, POST /lookup), as Dynamo does. */
typedef struct dyn_proxy {
    kvo_http_server *srv;
    kvo_http_client *up;
    char upstream[96];
    pthread_t thr;
    volatile bool stop;
} dyn_proxy;

static void dyn_proxy_handler(void *ctx, kvo_http_req *req) {
    dyn_proxy *p = ctx;
    const char *path = kvo_http_req_path(req);
    if (!strcmp(path, "/watermark") || !strcmp(path, "/blocks") ||
        !strcmp(path, "/lookup")) {
        kvo_http_respond_error(req, 404, "no such endpoint");
        return;
    }
    char url[256];
    snprintf(url, sizeof(url), "%s%s", p->upstream, path);
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    size_t len;
    const uint8_t *body = kvo_http_req_body(req, &len);
    kvo_status st =
        strcmp(kvo_http_req_method(req), "POST") == 0
            ? kvo_http_post(p->up, url, "application/json", body, len, &resp)
            : kvo_http_get(p->up, url, &resp);
    if (st != KVO_OK)
        kvo_http_respond_error(req, 502, kvo_strerror(st));
    else
        kvo_http_respond(req, (unsigned)resp.status,
                         strcmp(path, "/metrics") ? "application/json"
                                                  : "text/plain",
                         resp.body.data, resp.body.len);
    kvo_http_resp_fini(&resp);
}

static void *dyn_proxy_main(void *arg) {
    dyn_proxy *p = arg;
    kt_http_serve(p->srv, &p->stop);
    return NULL;
}

START_TEST(a_dynamo_indexer_without_a_watermark_is_checked_in_settle_mode) {
    kt_proc idx, m0, m1;
    uint16_t dp;
    ck_assert_int_eq(kvo_free_port(&dp), KVO_OK);
    char dhost[32], url[128];
    snprintf(dhost, sizeof(dhost), "127.0.0.1:%u", dp);
    const char *iargs[] = {"--http", "127.0.0.1:0", "--dynamo-http", dhost,
                           NULL};
    kt_proc_start(&idx, "kvo-indexer", iargs);
    snprintf(url, sizeof(url), "http://%s/health", dhost);
    kt_proc_wait_http(&idx, url, 20000);
    dyn_proxy p;
    memset(&p, 0, sizeof(p));
    snprintf(p.upstream, sizeof(p.upstream), "http://%s", dhost);
    kvo_http_server_cfg hc = {.handler = dyn_proxy_handler, .ctx = &p};
    ck_assert_int_eq(kvo_http_server_new(&p.srv, &hc), KVO_OK);
    ck_assert_int_eq(kvo_http_client_new(&p.up, 10000), KVO_OK);
    ck_assert_int_eq(pthread_create(&p.thr, NULL, dyn_proxy_main, &p), 0);
    char proxy[64];
    snprintf(proxy, sizeof(proxy), "http://127.0.0.1:%u",
             kvo_http_server_port(p.srv));
    char *u0 = start_mocker(&m0, "8192"), *u1 = start_mocker(&m1, "8192");
    char engines[256];
    snprintf(engines, sizeof(engines), "%s,%s", u0, u1);
    char *trace = trace1000();
    const char *args[] = {
        "--engines", engines,       "--indexer", proxy,     "--indexer-api",
        "dynamo",    "--settle-ms", "100",       "--trace", trace,
        "--limit",   "12",          NULL};
    tc_run r;
    tc_check(&r, "dynamo-settle", args, 600);
    assert_pass(&r, 12);
    ck_assert_msg(strstr(summary_str(&r, "config"), "watermark=settle"), "%s",
                  summary_str(&r, "config"));
    /* what it could not check is said, not skipped silently */
    assert_checkpoints(&r, false);
    json_object *ck0 = json_object_array_get_idx(
        json_object_object_get(r.summary, "checkpoints"), 0);
    ck_assert_msg(strstr(json_object_get_string(
                             json_object_object_get(ck0, "block_sets_note")),
                         "GET /blocks"),
                  "%s", json_object_to_json_string(ck0));
    tc_free(&r, false);
    /* registered at the start, unregistered at the end */
    json_object *w = get_json(p.upstream, "/workers");
    ck_assert_str_eq(json_object_to_json_string(w), "[ ]");
    json_object_put(w);
    p.stop = true;
    pthread_join(p.thr, NULL);
    kvo_http_server_free(p.srv);
    kvo_http_client_free(p.up);
    ck_assert_int_eq(kt_proc_stop(&m0), 0);
    ck_assert_int_eq(kt_proc_stop(&m1), 0);
    ck_assert_int_eq(kt_proc_stop(&idx), 0);
    kvo_free(u0);
    kvo_free(u1);
    kvo_free(trace);
}
END_TEST

/* Children of pid (from /proc), for the Ctrl-C test. */
static size_t children_of(pid_t pid, pid_t *out, size_t max) {
    DIR *d = opendir("/proc");
    size_t n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL && n < max) {
        char path[300], buf[512];
        snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *rp = strrchr(buf, ')'); /* comm may hold spaces */
        int ppid = 0;
        char state;
        if (rp && sscanf(rp + 2, "%c %d", &state, &ppid) == 2 && ppid == pid)
            out[n++] = (pid_t)atoi(de->d_name);
    }
    if (d) closedir(d);
    return n;
}

static pid_t child_named(pid_t parent, const char *name) {
    pid_t kids[64];
    size_t n = children_of(parent, kids, 64);
    for (size_t i = 0; i < n; i++) {
        char path[64], comm[64] = "";
        snprintf(path, sizeof(path), "/proc/%d/comm", (int)kids[i]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof(comm), f)) comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        if (strcmp(comm, name) == 0) return kids[i];
    }
    return 0;
}

START_TEST(ctrl_c_stops_every_process_it_started) {
    char *trace = trace1000();
    char *dir = kt_tmpdir("sigint");
    char log[600];
    snprintf(log, sizeof(log), "%s/kvo-check.out", dir);
    char *exe = kt_bin_path("kvo-check");
    char logs[600];
    snprintf(logs, sizeof(logs), "%s/logs", dir); /* kept: interrupted */
    char *argv[] = {
        exe, "--spawn",          "--trace", trace,       "--workers",
        "2", "--num-gpu-blocks", "8192",    "--log-dir", logs,
        NULL};
    kvo_proc p;
    memset(&p, 0, sizeof(p));
    ck_assert_int_eq(kvo_proc_spawn(&p, "kvo-check", argv, log), KVO_OK);
    /* nats-server, indexer, 2 mockers, 2 relays */
    pid_t kids[32];
    size_t nk = 0;
    uint64_t deadline = kvo_now_ns() + 60 * 1000000000ull;
    while ((nk = children_of(p.pid, kids, 32)) < 6 && kvo_proc_alive(&p) &&
           kvo_now_ns() < deadline) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(nk >= 6, "only %zu children appeared", nk);
    kill(p.pid, SIGINT);
    deadline = kvo_now_ns() + 60 * 1000000000ull;
    while (kvo_proc_alive(&p) && kvo_now_ns() < deadline) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    if (kvo_proc_alive(&p)) {
        kvo_proc_stop(&p, 1000);
        ck_abort_msg("kvo-check did not stop on SIGINT");
    }
    ck_assert_int_eq(p.exit_status, 2);
    /* every child is gone (reaped by kvo-check, so not even a zombie) */
    for (size_t i = 0; i < nk; i++)
        ck_assert_msg(kill(kids[i], 0) != 0, "child %d still exists",
                      (int)kids[i]);
    char *out = tc_slurp(log);
    ck_assert_msg(out && strstr(out, "interrupted"), "%s", out ? out : "");
    kvo_free(out);
    kvo_free(exe);
    kvo_free(trace);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* a leftover temp dir only */
    }
    kvo_free(dir);
}
END_TEST

START_TEST(usage_errors_exit_2_and_help_exits_0) {
    const char *none[] = {"--trace", "x.jsonl", NULL};
    tc_run r;
    tc_check(&r, "usage", none, 60);
    ck_assert_int_eq(r.exit_code, 2);
    tc_free(&r, false);
    const char *badpol[] = {"--spawn", "--trace", "x", "--policy", "lru", NULL};
    tc_check(&r, "usage", badpol, 60);
    ck_assert_int_eq(r.exit_code, 2);
    tc_free(&r, false);
    const char *missing[] = {"--spawn", "--trace", "/nonexistent.jsonl", NULL};
    tc_check(&r, "usage", missing, 60);
    ck_assert_int_eq(r.exit_code, 2);
    char *out = tc_slurp(r.log);
    ck_assert_msg(strstr(out, "/nonexistent.jsonl"), "%s", out);
    kvo_free(out);
    tc_free(&r, false);
    /* a prompt longer than the spawned engines can hold: said before
     * anything starts, not as an HTTP 400 in the middle of the run */
    char *trace = trace1000();
    const char *small[] = {"--spawn", "--trace",          trace,  "--limit",
                           "20",      "--num-gpu-blocks", "1000", NULL};
    tc_check(&r, "usage", small, 60);
    ck_assert_int_eq(r.exit_code, 2);
    out = tc_slurp(r.log);
    ck_assert_msg(strstr(out, "use --num-gpu-blocks 1448 or more"), "%s", out);
    ck_assert_msg(!strstr(out, "kvo-mocker"), "spawned anyway: %s", out);
    kvo_free(out);
    tc_free(&r, false);
    kvo_free(trace);
    /* faults: lockstep and --spawn only */
    const char *const bad_faults[][12] = {
        {"--spawn", "--trace", "x", "--chaos-every", "0", NULL},
        {"--spawn", "--trace", "x", "--load", "--indexer-restart-at", "3",
         NULL},
        {"--engines", "http://127.0.0.1:1", "--trace", "x", "--nats-kill-at",
         "3", NULL},
        {"--spawn", "--trace", "x", "--nats-down-ms", "-1", NULL},
        {"--spawn", "--trace", "x", "--chaos", "x1", NULL},
        {"--spawn", "--trace", "x", "--nats-cluster", "0", NULL},
        {"--spawn", "--trace", "x", "--nats-cluster", "6", NULL},
        {"--spawn", "--trace", "x", "--nats-kill-node", "engine", NULL},
        {"--spawn", "--trace", "x", "--nats", "nats://127.0.0.1:1",
         "--nats-cluster", "3", NULL},
        /* the schema's traffic: reset in lockstep, fractions in [0, 1] */
        {"--spawn", "--load", "--trace", "x", "--reset-at", "3", NULL},
        {"--spawn", "--trace", "x", "--lora-fraction", "0.5", NULL},
        {"--spawn", "--trace", "x", "--mm-fraction", "1.5", NULL},
        /* Dynamo's API: no relays and no NATS to fault or to name */
        {"--spawn", "--trace", "x", "--indexer-api", "dynamo",
         "--relay-restart-at", "3", NULL},
        {"--spawn", "--trace", "x", "--indexer-api", "dynamo", "--nats",
         "nats://127.0.0.1:1", NULL},
        {"--spawn", "--trace", "x", "--indexer-api", "grpc", NULL},
        {"--spawn", "--trace", "x", "--model-name", "m", NULL},
        /* what the run keeps in fixed fields is refused when longer */
        {"--spawn", "--trace", "x", "--model",
         ("mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm"
          "mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm"),
         NULL}};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad_faults); i++) {
        tc_check(&r, "usage", bad_faults[i], 60);
        ck_assert_msg(r.exit_code == 2, "case %zu exited %d", i, r.exit_code);
        tc_free(&r, false);
    }
    const char *help[] = {"--help", NULL};
    tc_check(&r, "usage", help, 60);
    ck_assert_int_eq(r.exit_code, 0);
    out = tc_slurp(r.log);
    ck_assert_ptr_nonnull(strstr(out, "--report-html"));
    ck_assert_ptr_nonnull(strstr(out, "--indexer-restart-at"));
    ck_assert_ptr_nonnull(strstr(out, "--chaos SEED"));
    kvo_free(out);
    tc_free(&r, false);
}
END_TEST

Suite *suite_e2e(void) {
    Suite *s = suite_create("e2e");
    TCase *tc = tcase_create("runs");
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, usage_errors_exit_2_and_help_exits_0);
    tcase_add_test(tc, the_quick_start_run_passes_with_evictions_and_renders);
    tcase_add_test(tc, a_measured_prompt_goes_from_miss_to_hit_to_evicted);
    tcase_add_test(tc, disaggregated_prefill_publishes_and_decode_does_not);
    tcase_add_test(tc, dp_size_2_ranks_are_checked_separately);
    tcase_add_test(tc, token_id_prompts_agree_with_the_trace_extension);
    tcase_add_test(tc,
                   a_relay_killed_mid_trace_is_replaced_and_the_check_passes);
    tcase_add_test(tc,
                   an_indexer_restarted_mid_run_rebuilds_from_dumps_and_passes);
    tcase_add_test(
        tc, an_engine_restarted_mid_run_is_cleared_in_the_index_and_passes);
    tcase_add_test(tc, a_nats_server_killed_mid_run_is_survived_exactly);
    tcase_add_test(tc, a_cluster_node_killed_mid_run_is_survived_exactly);
    tcase_add_test(tc, a_chaos_run_with_every_kind_of_fault_passes);
    tcase_add_test(tc, a_killed_mutant_under_chaos_still_fails);
    tcase_add_test(tc, a_dropped_batch_is_recovered_by_replay);
    tcase_add_test(tc, a_dropped_batch_without_replay_fails_as_a_seq_gap);
    tcase_add_test(tc, a_block_the_engine_never_stored_fails_at_a_checkpoint);
    tcase_add_test(tc, divergences_are_classified_from_the_evidence);
    tcase_add_test(tc, lora_tenants_and_images_together_pass);
    tcase_add_test(tc, a_reset_of_idle_engines_reaches_the_index);
    tcase_add_test(tc, ctrl_c_stops_every_process_it_started);
    tcase_add_test(tc, running_mockers_are_checked_with_exact_watermarks);
    tcase_add_test(tc, an_engine_error_counter_fails_an_otherwise_clean_run);
    tcase_add_test(tc, an_external_pipeline_is_checked_after_a_quiet_period);
    suite_add_tcase(s, tc);
    tc = tcase_create("load");
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, a_closed_loop_load_run_batches_preempts_and_passes);
    tcase_add_test(tc, a_duplicate_store_under_load_fails);
    tcase_add_test(tc, a_dropped_store_under_load_fails);
    tcase_add_test(tc, keyed_traffic_under_load_passes_its_checkpoints);
    tcase_add_test(tc, an_engine_dying_under_load_ends_the_run_naming_it);
    suite_add_tcase(s, tc);
    tc = tcase_create("mutants");
    tcase_set_timeout(tc, 1800);
    tcase_add_test(
        tc, mutants_matrix_kills_every_killed_mutant_and_spares_the_benign);
    tcase_add_test(tc, mutants_under_load_are_caught_at_a_checkpoint);
    suite_add_tcase(s, tc);
    /* Dynamo's standalone-indexer API (--indexer-api dynamo) */
    tc = tcase_create("dynamo");
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, a_dynamo_indexer_is_checked_through_its_own_api);
    tcase_add_test(
        tc, a_dynamo_indexer_without_a_watermark_is_checked_in_settle_mode);
    suite_add_tcase(s, tc);
    return s;
}
