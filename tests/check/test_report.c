/* The report writers: terminal summary, JSON lines, HTML (also rendered in a
 * real headless chromium when one is installed). */
#include "check_int.h"
#include "tc.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

Suite *suite_report(void);
Suite *suite_browser(void);

/* 2 workers x 1 rank, n prompts; prompt `bad` diverges (stale block). */
static check_result *make_result(uint64_t n, int64_t bad) {
    check_result *r = NULL;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 2, 1, 16), KVO_OK);
    r->planned = n;
    snprintf(r->config, sizeof(r->config), "workers=2 <policy>=kv");
    for (uint64_t id = 0; id < n; id++) {
        uint32_t hit = (uint32_t)(id % 7);
        uint32_t scores[2] = {hit, id == (uint64_t)bad ? hit + 3 : hit};
        int32_t probes[2] = {(int32_t)hit, (int32_t)hit};
        check_obs o = {.id = id,
                       .prompt_tokens = 200,
                       .block_size = 16,
                       .n_slots = 2,
                       .dp_size = 1,
                       .chosen = (uint32_t)(id % 2),
                       .index_scores = scores,
                       .probe_hits = probes,
                       .cached_tokens = (int64_t)hit * 16,
                       .ms = 1.5};
        ck_assert_int_eq(check_result_add(r, &o, NULL), KVO_OK);
    }
    if (bad >= 0) { /* its evidence: the index holds block h+1 under 77 */
        check_prompt *p = &r->prompts[bad];
        uint32_t k = (uint32_t)p->first_divergent_block;
        check_diag d = {.reason = CHECK_REASON_STALE_BLOCK, .n_rows = 2};
        snprintf(d.evidence, sizeof(d.evidence), "the evidence");
        d.rows[0] = (check_evidence_row){k,
                                         {.hash = 5005,
                                          .parent = 4004,
                                          .has_parent = true,
                                          .tokens_hash = 9009},
                                         {.held = true,
                                          .has_parent = true,
                                          .parent = 77,
                                          .tokens_hash = 9009,
                                          .others = 1,
                                          .n_holders = 1,
                                          .holders = {{1, 0}}}};
        d.rows[1] = (check_evidence_row){
            k + 1, {.hash = 6006, .has_parent = true, .parent = 5005}, {0}};
        ck_assert_int_eq(check_prompt_explain(p, &d, true, &r->arena), KVO_OK);
    }
    check_counters_set(&r->counters, "indexer",
                       "kvo_indexer_events_total{status=\"ok\"}", 42);
    check_counters_set(&r->counters, "relay 0.0", "kvo_relay_gaps", 1);
    r->wall_s = 2.0;
    r->stage_s[CHECK_STAGE_SYNC] = 0.5;
    r->stage_s[CHECK_STAGE_COMPLETE] = 1.0;
    check_verdict_decide(r, &r->verdict);
    return r;
}

/* What fn writes to a FILE, as a malloc'd string (through a temp file:
 * open_memstream's out-pointer upsets gcc 12's dangling-pointer check). */
static char *capture(void (*fn)(FILE *, void *), void *arg, size_t *len) {
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fn(f, arg);
    long n = ftell(f);
    ck_assert(n >= 0);
    char *buf = kvo_malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    rewind(f);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

static void do_summary(FILE *f, void *arg) { check_report_summary(f, arg, 5); }

START_TEST(terminal_summary_has_rates_counters_verdict_and_worst_prompts) {
    check_result *r = make_result(10, 3);
    char *s = capture(do_summary, r, NULL);
    ck_assert_msg(strstr(s, "10 of 10 requests"), "%s", s);
    ck_assert_msg(strstr(s, "engine hit rate"), "%s", s);
    ck_assert_msg(strstr(s, "divergent prompts  1"), "%s", s);
    ck_assert_msg(strstr(s, "kvo_relay_gaps=1"), "%s", s);
    ck_assert_msg(strstr(s, "verdict: FAIL: stale block: prompt 3"), "%s", s);
    /* the worst prompt table starts with the divergent one */
    char *w = strstr(s, "worst prompts");
    ck_assert_ptr_nonnull(w);
    ck_assert_msg(strstr(w, "      3      1"), "%s", w);
    kvo_free(s);
    check_result_free(r);
}
END_TEST

START_TEST(a_pass_summary_fits_a_screen_unless_verbose) {
    check_result *r = make_result(10, 3);
    char *s = capture(do_summary, r, NULL);
    ck_assert_msg(strstr(s, "by class           stale block 1"), "%s", s);
    kvo_free(s);
    r->verdict.pass = true; /* as if it had passed: no counters, no table */
    s = capture(do_summary, r, NULL);
    ck_assert_msg(!strstr(s, "counters (non-zero") && !strstr(s, "worst"), "%s",
                  s);
    ck_assert_msg(strstr(s, "verdict: PASS"), "%s", s);
    kvo_free(s);
    r->verbose = true;
    s = capture(do_summary, r, NULL);
    ck_assert_msg(strstr(s, "kvo_relay_gaps=1") && strstr(s, "worst prompts"),
                  "%s", s);
    kvo_free(s);
    check_result_free(r);
}
END_TEST

static void do_json(FILE *f, void *arg) {
    check_result *r = arg;
    for (size_t i = 0; i < r->n_prompts; i++)
        ck_assert_int_eq(check_report_json_prompt(f, r, &r->prompts[i]),
                         KVO_OK);
    ck_assert_int_eq(check_report_json_summary(f, r), KVO_OK);
}

START_TEST(json_lines_have_every_field_and_a_final_summary) {
    check_result *r = make_result(4, 3);
    char *s = capture(do_json, r, NULL);
    char *save = NULL;
    int line = 0;
    for (char *l = strtok_r(s, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save), line++) {
        json_object *j = json_tokener_parse(l);
        ck_assert_msg(j != NULL, "line %d is not JSON: %s", line, l);
        if (line < 4) {
            static const char *keys[] = {"id",
                                         "worker",
                                         "dp_rank",
                                         "prompt_tokens",
                                         "prompt_blocks",
                                         "engine_hit_blocks",
                                         "index_hit_blocks",
                                         "index_scores",
                                         "diverged",
                                         "first_divergent_block",
                                         "divergent_tier",
                                         "reason"};
            for (size_t k = 0; k < KVO_ARRAY_LEN(keys); k++)
                ck_assert_msg(json_object_object_get_ex(j, keys[k], NULL),
                              "missing %s in %s", keys[k], l);
            json_object *v;
            json_object_object_get_ex(j, "id", &v);
            ck_assert_int_eq(json_object_get_int(v), line);
            json_object_object_get_ex(j, "index_scores", &v);
            ck_assert_uint_eq(json_object_array_length(v), 2);
            json_object_object_get_ex(j, "diverged", &v);
            ck_assert(json_object_get_boolean(v) == (line == 3));
            json_object_object_get_ex(j, "reason", &v);
            if (line == 3)
                ck_assert_str_eq(json_object_get_string(v), "stale block");
            else
                ck_assert_ptr_null(v);
            json_object_object_get_ex(j, "first_divergent_block", &v);
            if (line == 3) ck_assert_int_eq(json_object_get_int(v), 3);
            json_object_object_get_ex(j, "divergent_tier", &v);
            if (line == 3)
                ck_assert_str_eq(json_object_get_string(v), "gpu");
            else
                ck_assert_ptr_null(v);
            /* the evidence block by block, on the divergent line only */
            json_object *ch = NULL;
            ck_assert(json_object_object_get_ex(j, "evidence_chain", &ch) ==
                      (line == 3));
            if (line == 3) {
                ck_assert_uint_eq(json_object_array_length(ch), 2);
                ck_assert_str_eq(json_object_to_json_string_ext(
                                     json_object_array_get_idx(ch, 0),
                                     JSON_C_TO_STRING_PLAIN),
                                 "{\"block\":3,\"engine\":{\"hash\":5005,"
                                 "\"parent\":4004,\"tokens_hash\":9009,"
                                 "\"cached\":false,\"copies\":0},\"index\":{"
                                 "\"held\":true,\"parent\":77,\"tokens_hash\":"
                                 "9009,\"others\":1,\"holders\":[[1,0]]}}");
            }
        } else {
            json_object *sum, *v;
            ck_assert(json_object_object_get_ex(j, "summary", &sum));
            ck_assert(json_object_object_get_ex(sum, "verdict", &v));
            ck_assert_str_eq(json_object_get_string(v), "FAIL");
            ck_assert(json_object_object_get_ex(sum, "cause", &v));
            ck_assert_msg(strstr(json_object_get_string(v), "prompt 3"), "%s",
                          json_object_get_string(v));
            ck_assert(json_object_object_get_ex(sum, "divergent_prompts", &v));
            ck_assert_int_eq(json_object_get_int(v), 1);
            ck_assert(json_object_object_get_ex(sum, "counters", &v));
            json_object *relay, *gaps;
            ck_assert(json_object_object_get_ex(v, "relay 0.0", &relay));
            ck_assert(
                json_object_object_get_ex(relay, "kvo_relay_gaps", &gaps));
            ck_assert_int_eq(json_object_get_int(gaps), 1);
        }
        json_object_put(j);
    }
    ck_assert_int_eq(line, 5);
    kvo_free(s);
    check_result_free(r);
}
END_TEST

static void do_html(FILE *f, void *arg) {
    ck_assert_int_eq(check_report_html(f, arg), KVO_OK);
}

static size_t count(const char *s, const char *needle) {
    size_t n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

START_TEST(html_is_self_contained_with_plots_divergences_and_counters) {
    check_result *r = make_result(300, 120);
    char *s = capture(do_html, r, NULL);
    ck_assert(strncmp(s, "<!doctype html>", 15) == 0);
    ck_assert_ptr_nonnull(strstr(s, "id=\"summary\""));
    ck_assert_ptr_nonnull(strstr(s, "id=\"hit-plot\""));
    /* all requests + one chart per slot, two lines each */
    ck_assert_uint_eq(count(s, "<polyline"), 2 * (1 + 2));
    /* the divergence: marked on the main plot and its slot's, and listed */
    ck_assert_uint_ge(count(s, "class=\"divmark\""), 2);
    ck_assert_ptr_nonnull(strstr(s, "<b>stale block</b>"));
    /* its evidence side by side: the index's parent is not the engine's */
    ck_assert_ptr_nonnull(strstr(s, "engine and index, block by block"));
    ck_assert_ptr_nonnull(strstr(s, "<td class=\"bad\">77</td>"));
    ck_assert_ptr_nonnull(strstr(s, "<td class=\"bad\">4004</td>"));
    ck_assert_ptr_nonnull(strstr(s, "<td>1.0</td>"));
    ck_assert_ptr_null(strstr(s, "id=\"faults\"")); /* none injected */
    ck_assert_ptr_nonnull(strstr(s, "kvo_relay_gaps"));
    /* escaped, and nothing fetched from the network */
    ck_assert_ptr_nonnull(strstr(s, "&lt;policy&gt;"));
    ck_assert_ptr_null(strstr(s, "<policy>"));
    ck_assert_ptr_null(strstr(s, "http://"));
    ck_assert_ptr_null(strstr(s, "https://"));
    ck_assert_ptr_null(strstr(s, " src="));
    ck_assert_ptr_nonnull(strstr(s, "</html>"));
    kvo_free(s);
    check_result_free(r);
}
END_TEST

/* A load-mode run: n prompts routed on stale scores now and then, two
 * checkpoints (the second found 2 stale blocks), the engines' regime. */
static check_result *make_load_result(uint64_t n) {
    check_result *r = NULL;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 2, 1, 16), KVO_OK);
    r->planned = n;
    r->load.on = true;
    r->load.concurrency = 16;
    r->load.max_inflight = 16;
    for (uint64_t id = 0; id < n; id++) {
        uint32_t hit = (uint32_t)(id % 7);
        /* every 5th: the index had 2 blocks more than the engine */
        uint32_t scores[2] = {id % 5 ? hit : hit + 2, 0};
        check_obs o = {.id = id,
                       .prompt_tokens = 200,
                       .block_size = 16,
                       .n_slots = 2,
                       .dp_size = 1,
                       .chosen = 0,
                       .index_scores = scores,
                       .unjudged = true,
                       .cached_tokens = (int64_t)hit * 16,
                       .inflight_at_route = (uint32_t)(id % 16),
                       .ms = 3};
        ck_assert_int_eq(check_result_add(r, &o, NULL), KVO_OK);
    }
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.after = n / 2;
    c.before_prompt = (int64_t)(n / 2);
    c.sets = true;
    c.sweep_first = -1;
    c.sweep_prompts = 7;
    c.sync_s = 0.25;
    ck_assert_int_eq(check_result_checkpoint(r, &c, NULL), KVO_OK);
    c.number = 2;
    c.after = n;
    c.before_prompt = -1;
    c.final = true;
    check_block stale[2] = {{.hash = 41},
                            {.hash = 42, .parent = 41, .has_parent = true}};
    check_blocks_compare(NULL, 0, stale, 2, 1, &c.diff);
    c.diff.first[0].prompt = 3;
    c.diff.first[0].depth = 0;
    ck_assert_int_eq(check_result_checkpoint(r, &c, NULL), KVO_OK);
    check_counters_set(&r->counters, "engine 0.0", "steps_multi", 120);
    check_counters_set(&r->counters, "engine 0.0", "preemptions", 4);
    check_counters_set(&r->counters, "engine 1.0", "max_running", 9);
    r->wall_s = 2.0;
    r->stage_s[CHECK_STAGE_TRAFFIC] = 1.5;
    r->stage_s[CHECK_STAGE_CHECKPOINT] = 0.5;
    check_verdict_decide(r, &r->verdict);
    return r;
}

START_TEST(a_load_run_reports_what_the_router_saw_and_its_checkpoints) {
    check_result *r = make_load_result(100);
    ck_assert(!r->verdict.pass);
    ck_assert_msg(strstr(r->verdict.cause, "stale block: the final checkpoint "
                                           "2 after 100 requests: 2 blocks in "
                                           "the index but not the engine"),
                  "%s", r->verdict.cause);
    /* the terminal */
    char *s = capture(do_summary, r, NULL);
    ck_assert_msg(strstr(s, "router's view      100 requests: 80.0 % exact; "
                            "index over the engine 20.0 % (p50 2, p99 2, max "
                            "2 blocks)"),
                  "%s", s);
    ck_assert_msg(strstr(s, "checkpoints        2, 1 failed; block sets "
                            "compared at 2 of them"),
                  "%s", s);
    ck_assert_msg(strstr(s, "worker 1 rank 0: block 41 (no parent) in the "
                            "index, not the engine (prompt 3 block 0)"),
                  "%s", s);
    ck_assert_msg(strstr(s, "steps with >= 2 requests 120, most requests "
                            "running in one step 9"),
                  "%s", s);
    ck_assert_msg(strstr(s, "preemptions (recompute) 4"), "%s", s);
    kvo_free(s);
    /* the JSON lines */
    s = capture(do_json, r, NULL);
    char *save = NULL;
    size_t line = 0;
    for (char *l = strtok_r(s, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save), line++) {
        json_object *j = json_tokener_parse(l), *v, *sum;
        ck_assert_ptr_nonnull(j);
        if (line < 100) {
            ck_assert(json_object_object_get_ex(j, "routed_index_blocks", &v));
            ck_assert_int_eq(json_object_get_int(v),
                             (int)(line % 7) + (line % 5 ? 0 : 2));
            ck_assert(json_object_object_get_ex(j, "inflight_at_route", &v));
            ck_assert_int_eq(json_object_get_int(v), (int)(line % 16));
            ck_assert(json_object_object_get_ex(j, "judged", &v));
            ck_assert(!json_object_get_boolean(v));
        } else {
            ck_assert(json_object_object_get_ex(j, "summary", &sum));
            ck_assert(json_object_object_get_ex(sum, "mode", &v));
            ck_assert_str_eq(json_object_get_string(v), "load");
            ck_assert(json_object_object_get_ex(sum, "staleness", &v));
            json_object *x;
            ck_assert(json_object_object_get_ex(v, "over", &x));
            ck_assert_int_eq(json_object_get_int(x), 20);
            ck_assert(json_object_object_get_ex(v, "promised_hit_rate", &x));
            ck_assert(json_object_object_get_ex(sum, "regime", &v));
            ck_assert(json_object_object_get_ex(v, "preemptions", &x));
            ck_assert_int_eq(json_object_get_int(x), 4);
            ck_assert(json_object_object_get_ex(sum, "load", &v));
            ck_assert(json_object_object_get_ex(v, "concurrency", &x));
            ck_assert_int_eq(json_object_get_int(x), 16);
            ck_assert(json_object_object_get_ex(sum, "checkpoint_s", &v));
            ck_assert(json_object_object_get_ex(sum, "checkpoints", &v));
            ck_assert_uint_eq(json_object_array_length(v), 2);
            json_object *c2 = json_object_array_get_idx(v, 1), *d;
            ck_assert(json_object_object_get_ex(c2, "index_only", &x));
            ck_assert_int_eq(json_object_get_int(x), 2);
            ck_assert(json_object_object_get_ex(c2, "passed", &x));
            ck_assert(!json_object_get_boolean(x));
            ck_assert(json_object_object_get_ex(c2, "differences", &d));
            ck_assert_uint_eq(json_object_array_length(d), 2);
            /* no CPU tier */
            ck_assert(json_object_object_get_ex(c2, "cpu_sets", &x));
            ck_assert_ptr_null(x);
            ck_assert(json_object_object_get_ex(
                sum, "checkpoints_cpu_sets_compared", &x));
            ck_assert_int_eq(json_object_get_int(x), 0);
            json_object *d0 = json_object_array_get_idx(d, 0);
            ck_assert(json_object_object_get_ex(d0, "kind", &x));
            ck_assert_str_eq(json_object_get_string(x), "index_only");
            ck_assert(json_object_object_get_ex(d0, "prompt", &x));
            ck_assert_int_eq(json_object_get_int(x), 3);
            ck_assert(json_object_object_get_ex(d0, "worker", &x));
            ck_assert_int_eq(json_object_get_int(x), 1);
        }
        json_object_put(j);
    }
    ck_assert_uint_eq(line, 101);
    kvo_free(s);
    /* the page: the histogram, staleness over the trace, the checkpoints */
    s = capture(do_html, r, NULL);
    ck_assert_ptr_nonnull(strstr(s, "id=\"stale-hist\""));
    ck_assert_uint_eq(count(s, "class=\"bin\""), 11);
    ck_assert_ptr_nonnull(strstr(s, "<title>0: 80 requests</title>"));
    ck_assert_ptr_nonnull(strstr(s, "<title>+2..+4: 20 requests</title>"));
    ck_assert_ptr_nonnull(strstr(s, "id=\"stale-trace\""));
    ck_assert_uint_ge(count(s, "class=\"over\""), 1);
    ck_assert_ptr_nonnull(strstr(s, "id=\"checkpoints\""));
    ck_assert_ptr_nonnull(strstr(s, "2 blocks in the index but not the "
                                    "engine"));
    ck_assert_ptr_nonnull(strstr(s, "id=\"regime\""));
    kvo_free(s);
    check_result_free(r);
}
END_TEST

/* A checkpoint's CPU tier in every report: compared or not, its
 * differences named with the tier. */
START_TEST(reports_show_the_cpu_tier_of_each_checkpoint) {
    check_result *r;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 2, 1, 16), KVO_OK);
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.after = 10;
    c.before_prompt = 10;
    c.sets = true;
    c.sweep_first = -1;
    c.cpu.ranks = c.cpu.compared = 2;
    c.cpu.listed = 1;
    c.cpu.engine_blocks = 4;
    c.cpu.index_blocks = 3;
    c.cpu.cut = 2;
    check_block eng[] = {{.hash = 70}};
    check_blocks_compare(eng, 1, NULL, 0, 1, &c.cpu.diff);
    ck_assert_int_eq(check_result_checkpoint(r, &c, NULL), KVO_OK);
    memset(&c, 0, sizeof(c)); /* the second: an indexer without tiers */
    c.number = 2;
    c.after = 20;
    c.before_prompt = -1;
    c.final = true;
    c.sets = true;
    c.sweep_first = -1;
    c.cpu.ranks = 2;
    snprintf(c.cpu.note, sizeof(c.cpu.note), "the indexer refuses it");
    ck_assert_int_eq(check_result_checkpoint(r, &c, NULL), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    ck_assert_int_eq(r->verdict.reason, CHECK_REASON_MISSED_STORE);
    char *s = capture(do_summary, r, NULL);
    ck_assert_msg(strstr(s, "checkpoints        2, 1 failed; block sets "
                            "compared at 2 of them, the CPU tier's at 1 of "
                            "2\n") &&
                      strstr(s, "CPU tier not compared: the indexer refuses "
                                "it") &&
                      strstr(s, "    tier cpu: worker 1 rank 0: block 70 (no "
                                "parent) in the engine, not the index"),
                  "%s", s);
    kvo_free(s);
    s = capture(do_json, r, NULL);
    char *last = strrchr(s, '{');
    while (last > s && strncmp(last, "{\"summary\"", 10) != 0) last--;
    json_object *j = json_tokener_parse(last), *sum, *v, *c0, *cpu, *x;
    ck_assert_ptr_nonnull(j);
    ck_assert(json_object_object_get_ex(j, "summary", &sum));
    ck_assert(
        json_object_object_get_ex(sum, "checkpoints_cpu_sets_compared", &v));
    ck_assert_int_eq(json_object_get_int(v), 1);
    ck_assert(json_object_object_get_ex(sum, "checkpoints", &v));
    c0 = json_object_array_get_idx(v, 0);
    ck_assert(json_object_object_get_ex(c0, "cpu_sets", &cpu));
    ck_assert(json_object_object_get_ex(cpu, "engine_only", &x));
    ck_assert_int_eq(json_object_get_int(x), 1);
    ck_assert(json_object_object_get_ex(cpu, "engine_blocks", &x));
    ck_assert_int_eq(json_object_get_int(x), 4);
    ck_assert(json_object_object_get_ex(cpu, "blocks_cut", &x));
    ck_assert_int_eq(json_object_get_int(x), 2);
    ck_assert(json_object_object_get_ex(cpu, "differences", &x));
    ck_assert_uint_eq(json_object_array_length(x), 1);
    ck_assert(json_object_object_get_ex(c0, "cause", &x));
    ck_assert_str_eq(json_object_get_string(x),
                     "missed store: checkpoint 1 after 10 requests: tier cpu: "
                     "1 blocks in the engine but not the index; first: worker "
                     "1 rank 0: block 70 (no parent) in the engine, not the "
                     "index (no prompt of the run reaches it)");
    ck_assert(json_object_object_get_ex(json_object_array_get_idx(v, 1),
                                        "cpu_sets", &cpu));
    ck_assert(json_object_object_get_ex(cpu, "note", &x));
    ck_assert_str_eq(json_object_get_string(x), "the indexer refuses it");
    json_object_put(j);
    kvo_free(s);
    s = capture(do_html, r, NULL);
    ck_assert_ptr_nonnull(strstr(s, "<br>tier cpu: 1 engine only, 0 index "
                                    "only, 0 parent"));
    ck_assert_ptr_nonnull(
        strstr(s, "<br>tier cpu: 0 of 2 ranks compared: the indexer refuses "
                  "it"));
    kvo_free(s);
    check_result_free(r);
}
END_TEST

/* Injected faults get a table: what was killed, when it was back, when
 * the index was exact again; one that never healed is marked. */
START_TEST(html_lists_the_faults_and_how_each_healed) {
    check_result *r = make_result(100, -1);
    r->faults = kvo_calloc(2, sizeof(*r->faults));
    ck_assert_ptr_nonnull(r->faults);
    r->n_faults = 2;
    r->faults[0] = (check_fault){.at = 30,
                                 .kind = CHECK_FAULT_INDEXER,
                                 .done = true,
                                 .target = "kvo-indexer",
                                 .down_ms = 412,
                                 .heal_ms = 430};
    r->faults[1] = (check_fault){.at = 60,
                                 .kind = CHECK_FAULT_NATS,
                                 .done = true,
                                 .target = "nats-server[0]",
                                 .down_ms = 501,
                                 .heal_ms = -1};
    char *s = capture(do_html, r, NULL);
    ck_assert_ptr_nonnull(strstr(s, "id=\"faults\""));
    ck_assert_ptr_nonnull(strstr(s, "kvo-indexer</td><td class=\"n\">412</td>"
                                    "<td class=\"n\">430</td>"));
    ck_assert_ptr_nonnull(strstr(s, "<td class=\"n bad\">never</td>"));
    kvo_free(s);
    check_result_free(r);
}
END_TEST

START_TEST(html_of_an_empty_run_is_still_a_page) {
    check_result *r = NULL;
    ck_assert_int_eq(check_result_new(&r), KVO_OK);
    ck_assert_int_eq(check_result_slots(r, 1, 1, 16), KVO_OK);
    check_verdict_decide(r, &r->verdict);
    char *s = capture(do_html, r, NULL);
    ck_assert_ptr_nonnull(strstr(s, "no request was checked"));
    ck_assert_ptr_nonnull(strstr(s, "</html>"));
    kvo_free(s);
    check_result_free(r);
}
END_TEST

START_TEST(html_renders_in_headless_chromium) {
    if (access("/usr/bin/chromium", X_OK) != 0) {
        kt_skip("/usr/bin/chromium not installed: the HTML report is not "
                "rendered in a browser");
        return;
    }
    check_result *r = make_result(500, 250);
    char *dir = kt_tmpdir("html");
    char path[600];
    snprintf(path, sizeof(path), "%s/report.html", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(check_report_html(f, r), KVO_OK);
    fclose(f);
    char why[256] = "";
    ck_assert_msg(tc_html_renders(path, why, sizeof(why)) == 1, "%s", why);
    /* and a load run's page, with its staleness plots */
    check_result_free(r);
    r = make_load_result(500);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(check_report_html(f, r), KVO_OK);
    fclose(f);
    ck_assert_msg(tc_html_renders(path, why, sizeof(why)) == 1, "%s", why);
    unlink(path);
    rmdir(dir);
    kvo_free(dir);
    check_result_free(r);
}
END_TEST

Suite *suite_report(void) {
    Suite *s = suite_create("report");
    TCase *tc = tcase_create("writers");
    tcase_add_test(
        tc, terminal_summary_has_rates_counters_verdict_and_worst_prompts);
    tcase_add_test(tc, a_pass_summary_fits_a_screen_unless_verbose);
    tcase_add_test(tc, json_lines_have_every_field_and_a_final_summary);
    tcase_add_test(tc,
                   html_is_self_contained_with_plots_divergences_and_counters);
    tcase_add_test(tc, html_lists_the_faults_and_how_each_healed);
    tcase_add_test(tc, html_of_an_empty_run_is_still_a_page);
    tcase_add_test(tc,
                   a_load_run_reports_what_the_router_saw_and_its_checkpoints);
    tcase_add_test(tc, reports_show_the_cpu_tier_of_each_checkpoint);
    suite_add_tcase(s, tc);
    return s;
}

/* A suite of its own, so that a machine without Chromium reports it as
 * skipped, not passed. */
Suite *suite_browser(void) {
    Suite *s = suite_create("browser");
    TCase *tc = tcase_create("chromium");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, html_renders_in_headless_chromium);
    suite_add_tcase(s, tc);
    return s;
}
