/* kvo_check.h -- kvo-check, the oracle (DESIGN §9): drives a trace through
 * engines, relays and an indexer and passes only when the index matched
 * every engine's cache: prompt by prompt in lockstep (one request at a
 * time), and in both modes at every checkpoint (traffic stopped and
 * drained: every (worker, rank)'s cached block set, hashes and parents,
 * equals the index's, and recent prompts agree on every slot). --load
 * keeps many requests in flight between checkpoints.
 *
 *   check_cfg cfg;
 *   check_cfg_defaults(&cfg);
 *   cfg.spawn = true, cfg.trace = "trace.jsonl";
 *   check_result *res;
 *   kvo_err err;
 *   if (check_result_new(&res) == KVO_OK &&
 *       check_run(&cfg, res, &err) == KVO_OK) {
 *       check_report_summary(stdout, res, 10);
 *       const char *cause;
 *       bool pass = check_result_passed(res, &cause);
 *   }
 *   check_result_free(res);
 *
 * How a run works (driver, judge, counters, processes): check_int.h.
 */
#ifndef KVO_CHECK_H
#define KVO_CHECK_H

#include "kvo.h"

#include <stdio.h>

/* ---- Configuration --------------------------------------------------------*/

typedef enum check_policy {
    CHECK_POLICY_ROUND_ROBIN = 0, /* request i -> worker i mod N */
    CHECK_POLICY_KV,              /* highest index score */
    CHECK_POLICY_DYNAMO           /* Dynamo's KV-router cost (check_int.h) */
} check_policy;

/* Bytes of --model and --model-name, with the NUL. */
#define CHECK_MODEL_MAX 128

/* Requests in flight --load accepts (one thread each). */
#define CHECK_CONCURRENCY_MAX 4096

typedef enum check_arrival {
    CHECK_ARRIVAL_CLOSED =
        0,              /* --load: keep --concurrency requests in flight */
    CHECK_ARRIVAL_TRACE /* --load: at the trace's timestamps */
} check_arrival;

typedef enum check_prompt_form {
    CHECK_FORM_AUTO = 0, /* trace form against kvo-mocker, tokens otherwise */
    CHECK_FORM_TRACE,
    CHECK_FORM_TOKENS
} check_prompt_form;

/* The API kvo-check speaks to the indexer under test. */
typedef enum check_indexer_api {
    CHECK_API_KVO = 0, /* kvo-indexer's (events through relays and NATS) */
    CHECK_API_DYNAMO   /* Dynamo's standalone indexer: kvo-check registers
                          every engine rank, the indexer reads its ZMQ */
} check_indexer_api;

/* Strings are borrowed: they must outlive the run. */
/* The most nats-servers --nats-cluster starts. */
#define CHECK_NATS_MAX 5

typedef struct check_cfg {
    const char *trace;
    uint64_t limit; /* 0 = whole trace */
    /* --spawn */
    bool spawn;
    uint32_t workers;        /* engines (prefill engines when disagg) */
    uint32_t decode_workers; /* > 0: disaggregated (decode engines) */
    uint32_t dp_size;
    uint32_t block_size;
    uint64_t num_gpu_blocks;  /* 0 = mocker default */
    const char *hash_algo;    /* "sha256" */
    const char *hash_seed;    /* "0" */
    const char *event_format; /* NULL = mocker default */
    const char *mutate;       /* NULL = none */
    uint64_t seed;
    uint64_t replay_buffer; /* 0 = sized for the run */
    bool verify_engine_hash;
    bool no_replay;          /* relays without replay (fault injection) */
    int64_t drop_seq;        /* drop ZMQ seq N of worker 0 rank 0, -1 */
    int64_t extra_block_seq; /* from ZMQ seq N of worker 0 rank 0, add a
                                  block the engine never computed to a
                                  store batch, -1 */
    /* Faults (lockstep, --spawn): SIGKILL a process before request N and
     * start it again; -1 = never. check_int.h, check_fault.c. */
    int64_t relay_restart_at;   /* relay 0.0: a fresh one (new publisher) */
    int64_t indexer_restart_at; /* kvo-indexer: same port, same NATS */
    int64_t engine_restart_at;  /* kvo-mocker 0: same ports, same args */
    int64_t nats_kill_at;       /* nats-server: back on its port after */
    uint64_t nats_down_ms;      /*   this many ms (500) */
    uint32_t nats_cluster;      /* spawned nats-servers, clustered (1) */
    bool nats_kill_relay_node;  /* kill the relays' node, not the indexer's */
    bool chaos;                 /* a seeded schedule: before every */
    uint64_t chaos_seed;        /*   chaos_every-th request (50) one of */
    uint64_t chaos_every;       /*   {a relay, the indexer, nats-server} */
    const char *log_dir;        /* NULL = a fresh temp dir */
    bool keep_logs;
    bool discard_logs;   /* remove them even on FAIL (mutants) */
    const char *bin_dir; /* NULL = next to /proc/self/exe, then PATH */
    /* running parts */
    const char *engines; /* "URL,URL" */
    const char *indexer; /* URL */
    const char *nats;    /* URL */
    const char *model;   /* NULL = first of /v1/models */
    check_indexer_api indexer_api;
    const char *model_name; /* dynamo: the partition (NULL = the model) */
    bool no_relays;         /* events reach NATS through the user's
                                  relays: no exact watermark, settle */
    long settle_ms;         /* quiet period when there is no watermark */
    /* --load: many requests in flight, exact at checkpoints */
    bool load;
    check_arrival arrival;
    uint32_t concurrency; /* requests in flight at most (0 = 8 per
                                  worker) */
    double time_scale;    /* --arrival trace: timestamps divided by it
                                  (0 = the engines' speedup, or 1) */
    double speedup;       /* spawned engines' --speedup; < 0 = the
                                  mode's default (lockstep 0, load 1) */
    /* both */
    check_policy policy;
    double overlap_weight;     /* dynamo: 1.0 */
    double router_temperature; /* dynamo: 0 = lowest cost; T > 0 samples a
                                  softmax over -cost/T (seeded by seed) */
    uint64_t checkpoint_every; /* full-state checkpoint every K requests
                                  (200) and at the end; 0 = at the end */
    check_prompt_form prompt_form;
    /* the event schema's other dimensions (check_traffic.c), seeded */
    uint32_t lora_adapters;      /* spawned engines serve N LoRA adapters */
    double lora_fraction;        /* share of requests naming one */
    uint32_t salt_tenants;       /* every request salted by one of N tenants */
    double mm_fraction;          /* share of prompts with a multimodal item */
    int64_t reset_at;            /* reset every engine's prefix cache before
                                  this request, -1 = never */
    const char *kv_groups;       /* spawned engines' --kv-groups, NULL */
    uint64_t cpu_offload_blocks; /* spawned engines' CPU tier, 0 = none */
    long timeout_ms;             /* one watermark wait / one HTTP call */
    bool fail_fast;              /* stop at the first failure */
    bool verbose;                /* the full summary even on a PASS */
    uint64_t sweep;              /* at the last checkpoint, re-check the last
                                  N distinct prompts on every slot (0 =
                                  off; needs probes: kvo-mocker engines) */
    uint64_t checkpoint_sweep;   /* earlier checkpoints: the last N distinct
                                  prompts since the one before (50; 0 =
                                  off): a sample, the block sets being
                                  complete */
    bool progress;               /* progress bar on stderr */
    const char *report_json;
    const char *report_html;
} check_cfg;

void check_cfg_defaults(check_cfg *c);

/* ---- A run and its result -------------------------------------------------*/

/* Every prompt's judgement, the counters of every stage and the verdict. */
typedef struct check_result check_result;

kvo_status check_result_new(check_result **out);
void check_result_free(check_result *r); /* NULL: no-op */

/* Run the check into a fresh result. KVO_OK when the run happened (PASS or
 * FAIL: check_result_passed; the reports are written); KVO_EINTR when
 * interrupted (kvo_stop); another status is a setup error, err says what. */
kvo_status check_run(const check_cfg *cfg, check_result *out, kvo_err *err);

/* PASS? *cause (may be NULL) gets the first cause of a FAIL ("" on PASS),
 * owned by r. */
bool check_result_passed(const check_result *r, const char **cause);

/* ---- Reports (pure writers over a result) ---------------------------------*/

/* Summary, counters of every stage, verdict, and the worst prompts. */
void check_report_summary(FILE *f, const check_result *r, size_t worst);
/* The final JSON line (after one line per prompt, written by the run). */
kvo_status check_report_json_summary(FILE *f, const check_result *r);
/* One self-contained HTML page (inline CSS, inline SVG, a little inline JS
 * for hover details; no network). */
kvo_status check_report_html(FILE *f, const check_result *r);

/* ---- Mutation testing -----------------------------------------------------*/

typedef struct check_mutant {
    const char *name;     /* kvo-mocker --mutate NAME */
    bool killed;          /* expected: the check must fail (else: must pass) */
    const char *what;     /* one line */
    const char *incident; /* the field incident it reproduces, or NULL */
    const char *needs;    /* the traffic that shows it (NULL: any run) */
} check_mutant;

/* The catalog, static. */
const check_mutant *check_mutants(size_t *n);

/* Whether the matrix over base (its mode, limit, GPU blocks) runs m, and
 * with which options on top of base's, as typed on a command line, into
 * opts ("" = none). */
bool check_mutant_scenario(const check_mutant *m, const check_cfg *base,
                           char *opts, size_t n);

/* Run base once per mutant (only `only` when non-NULL: "a,b") and print the
 * matrix to f. *ok = every mutant behaved as expected. A setup error of one
 * run is reported in its row and counts as unexpected; KVO_EINTR when
 * interrupted. */
kvo_status check_mutants_run(const check_cfg *base, const char *only, FILE *f,
                             bool *ok);

#endif /* KVO_CHECK_H */
