/* kvo_check.h -- kvo-check, the oracle (DESIGN §9): drives a trace through
 * engines, relays and an indexer, one request at a time, and asserts prompt
 * by prompt that the index matches the engines' caches.
 *
 *   trace (check_trace.c)
 *     │ request r
 *     ▼
 *   driver (check_run.c), per request:
 *     1 sync      every engine rank's last published ZMQ seq <= the index's
 *                 watermark for that rank's relay (or: quiet for settle-ms)
 *     2 counters  indexer /metrics, relays /metrics (what moved since r-1)
 *     3 index     POST /query_by_hash           -> index_scores[slot]
 *     4 truth     POST /kvo/probe on every engine -> probe_hits[slot]
 *     5 send      policy picks a slot; POST /v1/completions -> cached_tokens
 *     │ check_obs
 *     ▼
 *   judge (check_core.c, pure):  per slot  min(score, (n-1)//bs)  vs  hits
 *     │ check_prompt (diverged, first divergent block, likely reason)
 *     ▼
 *   check_result ──▶ verdict (check_core.c) ──▶ reports (check_report.c:
 *                    terminal + JSON lines; check_html.c: one HTML file)
 *
 * A "slot" is one (worker_id, dp_rank) pair the index can score: one engine
 * rank that publishes events. slot = worker * dp_size + dp_rank.
 *
 * Processes (check_spawn.c): nats-server, kvo-mocker per worker, kvo-relay
 * per (worker, rank), kvo-indexer; free loopback ports, readiness by polling,
 * stopped on every path (also Ctrl-C); logs kept on failure.
 *
 * The judge, the verdict, the counters and the report writers are pure: they
 * see only what the index said, what the engines said and the counters, so
 * the unit tests drive them with hand-made observations.
 */
#ifndef KVO_CHECK_H
#define KVO_CHECK_H

#include "kvo.h"

#include <json-c/json.h>
#include <stdio.h>

/* ======================================================================== */
/* Counters of every stage                                                   */
/* ======================================================================== */

/* One sample as a stage exposes it: stage "indexer", "relay 1.0"
 * (worker.rank), "check"; name = the metric with its labels, verbatim
 * ("kvo_indexer_events_total{type=\"stored\",status=\"ok\"}"). */
typedef struct check_rule check_rule;

typedef struct check_counter {
    char *stage; /* owned */
    char *name;  /* owned */
    double value;
    uint64_t key;            /* hash of (stage, name): lookups compare it */
    const check_rule *rule;  /* check_rule_find(stage, name), cached */
} check_counter;

typedef struct check_counters {
    check_counter *items; /* owned; in insertion order */
    size_t n, cap;
    size_t hint; /* where the next lookup starts (re-parses keep order) */
} check_counters;

void check_counters_init(check_counters *c);
void check_counters_fini(check_counters *c);
void check_counters_clear(check_counters *c);
kvo_status check_counters_set(check_counters *c, const char *stage,
                              const char *name, double value);
/* NAN when absent. */
double check_counters_get(const check_counters *c, const char *stage,
                          const char *name);
/* Sum of every counter of stages starting with stage_prefix whose name
 * contains match (0 when none). */
double check_counters_sum(const check_counters *c, const char *stage_prefix,
                          const char *match);
kvo_status check_counters_copy(check_counters *dst, const check_counters *src);
/* Renames every counter of stage `from` to stage `to` (a relay that was
 * replaced keeps its final counters under "relay 0.0 #1"). */
kvo_status check_counters_rename_stage(check_counters *c, const char *from,
                                       const char *to);
/* out = every counter of cur that is larger than in prev (absent in prev =
 * 0), valued by the increase. */
kvo_status check_counters_moved(check_counters *out, const check_counters *prev,
                                const check_counters *cur);
/* Prometheus text exposition: every sample line becomes a counter of stage
 * (replacing an earlier value). Comments and malformed lines are skipped. */
kvo_status check_counters_parse_prom(check_counters *c, const char *stage,
                                     const char *text, size_t len);
/* A JSON object: every numeric (or boolean) leaf, named by its dotted path
 * ("nats.dropped", "gaps.0"). */
kvo_status check_counters_parse_json(check_counters *c, const char *stage,
                                     json_object *j);

/* ======================================================================== */
/* Reasons and the rules that turn counters into causes                      */
/* ======================================================================== */

typedef enum check_reason {
    CHECK_REASON_NONE = 0,
    CHECK_REASON_MISSED_STORE,   /* "missed store": index behind the engine */
    CHECK_REASON_STALE_BLOCK,    /* "stale block": index holds evicted blocks */
    CHECK_REASON_HASH_MISMATCH,  /* "hash mismatch": engine hash not H(tokens) */
    CHECK_REASON_UNKNOWN_PARENT, /* "unknown parent": store rejected */
    CHECK_REASON_WRONG_RANK,     /* "wrong rank": blocks on a sibling rank */
    CHECK_REASON_SEQ_GAP,        /* "seq gap": events lost in transport */
    CHECK_REASON_REJECTED,       /* "rejected event": decode/validation */
    CHECK_REASON_ENGINE,         /* "engine inconsistent": probe != response */
    CHECK_REASON_COUNT
} check_reason;

/* "missed store", ... ("" for NONE). */
const char *check_reason_name(check_reason r);

/* A counter that must stay 0 on a correct pipeline. Matched against a
 * counter by stage prefix and by substrings of its name (all of `match`,
 * separated by '|' meaning "any of", none of `except`). */
struct check_rule {
    const char *stage_prefix; /* "indexer", "relay" */
    const char *match;        /* "parent_not_found" or "a|b" */
    const char *except;       /* NULL or "a|b" */
    check_reason reason;
    const char *what;         /* "events with an unknown parent" */
};

/* The rule a counter falls under, NULL if it may move freely. The table is
 * in priority order: when several tripped counters moved, the first rule
 * names the reason. */
const check_rule *check_rule_find(const char *stage, const char *name);
const check_rule *check_rules(size_t *n);

/* ======================================================================== */
/* One prompt: observation in, judgement out                                 */
/* ======================================================================== */

/* What the driver saw for one request. Arrays have n_slots entries. */
typedef struct check_obs {
    uint64_t id;                 /* 0-based trace line */
    uint32_t prompt_tokens;
    uint32_t block_size;
    uint32_t n_slots;
    uint32_t dp_size;            /* slots per worker (worker = slot / dp) */
    uint32_t chosen;             /* slot the request went to */
    const uint32_t *index_scores; /* as the index answered (uncapped) */
    const int32_t *probe_hits;   /* engine truth before the request, already
                                    capped; NULL or -1 = not probed */
    int64_t cached_tokens;       /* from the response; -1 = unknown */
    const uint8_t *index_seen;   /* per slot: the index ever scored it
                                    (NULL = unknown) */
    const check_counters *moved; /* rule counters that moved since the
                                    previous prompt (NULL = none known) */
    const check_counters *total; /* all counters so far (NULL = none) */
    double ms;                   /* wall time spent on this prompt */
} check_obs;

typedef struct check_prompt {
    uint64_t id;
    uint32_t slot, worker, dp_rank; /* where the request went */
    uint32_t prompt_tokens;
    uint32_t prompt_blocks;      /* ceil(tokens / block_size) */
    uint32_t cap;                /* (tokens - 1) // block_size */
    int32_t engine_hit_blocks;   /* chosen slot: cached_tokens / bs (or the
                                    probe when the response had none) */
    uint32_t index_hit_blocks;   /* chosen slot, capped */
    uint32_t index_raw_blocks;   /* chosen slot, uncapped (Dynamo's score) */
    uint32_t *index_scores;      /* per slot, uncapped (result-owned) */
    int32_t *engine_hits;        /* per slot, -1 unknown (result-owned) */
    bool diverged;
    int32_t first_divergent_block; /* -1 when not diverged */
    int32_t divergent_slot;        /* slot of the first divergence, -1 */
    check_reason reason;
    char detail[200];            /* "worker 1 rank 0: engine 12, index 8; ..." */
    double ms;
} check_prompt;

/* ======================================================================== */
/* A whole run                                                                */
/* ======================================================================== */

/* Where the driver's wall time went. */
typedef enum check_stage {
    CHECK_STAGE_SYNC = 0, /* waiting for the watermark / settle */
    CHECK_STAGE_COUNTERS, /* reading /metrics of the indexer and relays */
    CHECK_STAGE_QUERY,    /* index query */
    CHECK_STAGE_PROBE,    /* /kvo/probe of every engine */
    CHECK_STAGE_COMPLETE, /* the completion itself */
    CHECK_STAGE_SWEEP,    /* re-checking earlier prompts after the run */
    CHECK_STAGE_OTHER,    /* prompt synthesis, hashing, judging, reports */
    CHECK_STAGE_COUNT
} check_stage;

const char *check_stage_name(check_stage s);

/* A rule counter that became non-zero, and when it was first seen. */
typedef struct check_trip {
    char *stage, *name; /* owned */
    double value;       /* latest value */
    int64_t before_prompt; /* seen before this prompt's query; -1 = at end */
    const check_rule *rule;
} check_trip;

typedef struct check_slot_info {
    uint32_t worker;
    uint32_t dp_rank;
} check_slot_info;

typedef struct check_verdict {
    bool pass;
    char cause[400]; /* "" when pass */
    check_reason reason;
} check_verdict;

typedef struct check_result {
    /* set up by the driver before the first prompt */
    uint32_t block_size;
    uint32_t n_slots, dp_size;
    check_slot_info *slots; /* owned */
    uint64_t planned;       /* requests the run meant to send */
    char config[512];       /* one line: the effective configuration */

    check_prompt *prompts;  /* owned, in trace order */
    size_t n_prompts, cap_prompts;
    /* The sweep: after the last request, earlier prompts re-checked on
     * every slot (no request sent; truth = the probes). */
    check_prompt *sweep;    /* owned */
    size_t n_sweep, cap_sweep, sweep_divergent;
    kvo_arena arena;        /* per-slot arrays of the prompts */

    check_counters counters; /* latest value of every counter, all stages */
    check_trip *trips;
    size_t n_trips, cap_trips;

    char error[320];        /* a run error that stopped it (timeout...) */
    int64_t error_prompt;   /* where it happened, -1 none */

    double wall_s;
    double stage_s[CHECK_STAGE_COUNT];
    check_verdict verdict;  /* by check_verdict_decide */
} check_result;

void check_result_init(check_result *r);
void check_result_fini(check_result *r);
/* Declare the slots (before any prompt). */
kvo_status check_result_slots(check_result *r, uint32_t n_workers,
                              uint32_t dp_size, uint32_t block_size);
/* Judge o and append the prompt; *out (may be NULL) points at it until the
 * next append. */
kvo_status check_result_add(check_result *r, const check_obs *o,
                            const check_prompt **out);
/* Judge o as a sweep entry (o->cached_tokens must be -1: no request). */
kvo_status check_result_add_sweep(check_result *r, const check_obs *o,
                                  const check_prompt **out);
/* Record every rule counter of `total` that is non-zero and not yet
 * recorded, as first seen before prompt `before_prompt` (-1 = at end). */
kvo_status check_result_trips(check_result *r, const check_counters *total,
                              int64_t before_prompt);
/* Record a run error (first one wins). */
void check_result_error(check_result *r, int64_t prompt, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The pure judge behind check_result_add: fills *p (index_scores and
 * engine_hits point into a, which must outlive p). */
kvo_status check_prompt_judge(const check_obs *o, kvo_arena *a,
                              check_prompt *p);

/* PASS only when no prompt diverged (during the run or in the sweep), no
 * rule counter tripped and no run error happened; otherwise the first cause
 * in trace order (the sweep comes last). */
void check_verdict_decide(const check_result *r, check_verdict *out);

/* Aggregates over the prompts. */
typedef struct check_totals {
    uint64_t requests, prompt_tokens, prompt_blocks;
    uint64_t engine_hit_tokens; /* sum of engine_hit_blocks * bs */
    uint64_t index_hit_tokens;  /* sum of index_hit_blocks * bs (capped) */
    uint64_t index_raw_blocks;  /* sum of uncapped chosen scores */
    uint64_t divergent;
} check_totals;

void check_result_totals(const check_result *r, check_totals *t);
/* The n worst prompts into out (divergent first, by distance; then the
 * lowest engine hit rate). Returns how many were written. Pointers are valid
 * until the next check_result_add. */
size_t check_result_worst(const check_result *r, const check_prompt **out,
                          size_t n);

/* ======================================================================== */
/* Reports                                                                    */
/* ======================================================================== */

/* One progress line ("\r[####....] 523/1000 ..."), for a terminal. */
void check_report_progress(FILE *f, const check_result *r, uint64_t done,
                           uint64_t total, double elapsed_s);
/* Summary, counters of every stage, verdict, and the worst prompts. */
void check_report_summary(FILE *f, const check_result *r, size_t worst);
/* One JSON line for prompt p / the final summary line. */
kvo_status check_report_json_prompt(FILE *f, const check_result *r,
                                    const check_prompt *p);
kvo_status check_report_json_summary(FILE *f, const check_result *r);
/* A divergent sweep entry: a prompt line with "sweep": true. */
kvo_status check_report_json_sweep(FILE *f, const check_result *r,
                                   const check_prompt *p);
/* One self-contained HTML page (inline CSS, inline SVG, a little inline JS
 * for hover details; no network). */
kvo_status check_report_html(FILE *f, const check_result *r);

/* ======================================================================== */
/* Trace (Mooncake JSONL) and prompts                                        */
/* ======================================================================== */

typedef struct check_request {
    uint64_t line;          /* 0-based line of the trace */
    uint32_t input_length;  /* prompt tokens */
    uint32_t output_length; /* max_tokens */
    uint32_t n_hash_ids;
    const uint64_t *hash_ids;
} check_request;

typedef struct check_trace {
    check_request *reqs; /* owned */
    size_t n;
    uint64_t rejected;   /* lines the reader refused */
    void *impl;          /* the reader's own storage */
} check_trace;

/* Load at most limit requests (0 = all). err gets a one-line reason. */
kvo_status check_trace_load(check_trace *t, const char *path, uint64_t limit,
                            char *err, size_t errsz);
void check_trace_fini(check_trace *t);
/* The prompt tokens of DESIGN §8 into tokens (u64 each; replaced). */
kvo_status check_request_tokens(const check_request *r, kvo_buf *tokens);

/* ======================================================================== */
/* The driver                                                                 */
/* ======================================================================== */

typedef enum check_policy {
    CHECK_POLICY_ROUND_ROBIN = 0,
    CHECK_POLICY_KV
} check_policy;

typedef enum check_prompt_form {
    CHECK_FORM_AUTO = 0, /* trace form against kvo-mocker, tokens otherwise */
    CHECK_FORM_TRACE,
    CHECK_FORM_TOKENS
} check_prompt_form;

typedef struct check_cfg {
    const char *trace;
    uint64_t limit;            /* 0 = whole trace */
    /* --spawn */
    bool spawn;
    uint32_t workers;          /* engines (prefill engines when disagg) */
    uint32_t decode_workers;   /* > 0: disaggregated (decode engines) */
    uint32_t dp_size;
    uint32_t block_size;
    uint64_t num_gpu_blocks;   /* 0 = mocker default */
    const char *hash_algo;     /* "sha256" */
    const char *hash_seed;     /* "0" */
    const char *event_format;  /* NULL = mocker default */
    const char *mutate;        /* NULL = none */
    uint64_t seed;
    uint64_t replay_buffer;    /* 0 = sized for the run */
    bool verify_engine_hash;
    bool no_replay;            /* relays without replay (fault injection) */
    int64_t drop_seq;          /* drop ZMQ seq N of worker 0 rank 0, -1 */
    int64_t relay_restart_at;  /* SIGKILL+restart relay 0.0 before this
                                  request, -1 = never */
    const char *log_dir;       /* NULL = a fresh temp dir */
    bool keep_logs;
    bool discard_logs;         /* remove them even on FAIL (mutants) */
    const char *bin_dir;       /* NULL = next to /proc/self/exe, then PATH */
    /* running parts */
    const char *engines;       /* "URL,URL" */
    const char *indexer;       /* URL */
    const char *nats;          /* URL */
    const char *model;         /* NULL = first of /v1/models */
    bool no_relays;            /* events reach NATS through the user's
                                  relays: no exact watermark, settle */
    long settle_ms;            /* quiet period when there is no watermark */
    /* both */
    check_policy policy;
    check_prompt_form prompt_form;
    long timeout_ms;           /* one watermark wait / one HTTP call */
    bool fail_fast;            /* stop at the first failure */
    uint64_t sweep;            /* after the run, re-check the last N
                                  distinct prompts on every slot (0 = off;
                                  needs probes: kvo-mocker engines) */
    bool progress;             /* progress bar on stderr */
    const char *report_json;
    const char *report_html;
} check_cfg;

void check_cfg_defaults(check_cfg *c);

/* Run the check. KVO_OK when the run happened (the verdict, PASS or FAIL, is
 * in out->verdict and the reports are written); another status is a setup
 * error (err says what), or KVO_EAGAIN when interrupted (kvo_stop). */
kvo_status check_run(const check_cfg *cfg, check_result *out, char *err,
                     size_t errsz);

/* Find a sibling executable: bin_dir, then next to /proc/self/exe, then PATH. */
kvo_status check_find_bin(const char *bin_dir, const char *name, char *out,
                          size_t outsz);

/* ======================================================================== */
/* Mutation testing                                                           */
/* ======================================================================== */

typedef struct check_mutant {
    const char *name;  /* kvo-mocker --mutate NAME */
    bool killed;       /* expected: the check must fail (else: must pass) */
    const char *what;  /* one line */
} check_mutant;

const check_mutant *check_mutants(size_t *n);

/* Run base once per mutant (only `only` when non-NULL: "a,b") and print the
 * matrix to f. *ok = every mutant behaved as expected. A setup error of one
 * run is reported in its row and counts as unexpected. */
kvo_status check_mutants_run(const check_cfg *base, const char *only, FILE *f,
                             bool *ok);

#endif /* KVO_CHECK_H */
