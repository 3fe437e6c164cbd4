/* check_int.h -- kvo-check's internals, shared by its files and by the
 * tests (kvo_check.h is what a user calls).
 *
 *   trace (check_trace.c)
 *     │ request r
 *     ▼
 *   driver (check_run.c), per request:
 *     1 sync      every engine rank's last published ZMQ seq <= the index's
 *                 watermark for that rank's relay (or: quiet for settle-ms)
 *     2 counters  indexer /metrics, relays /metrics (what moved since r-1)
 *     3 index     POST /query_by_hash           -> index_scores[slot]
 *                                                  (index_host_scores)
 *     4 truth     POST /kvo/probe on every engine -> probe_hits[slot]
 *     5 send      policy picks a slot; POST /v1/completions -> cached_tokens
 *     │ check_obs
 *     ▼
 *   judge (check_core.c, pure):  per slot  min(score, (n-1)//bs)  vs  hits
 *     │                          (a CPU tier: then min(host_pinned score,
 *     │                          (n-1)//bs) vs the GPU+CPU hit)
 *     │ check_prompt (diverged, first divergent block, likely reason)
 *     ▼
 *   check_result ──▶ verdict (check_core.c) ──▶ reports (check_report.c:
 *                    terminal + JSON lines; check_html.c: one HTML file)
 *
 * A "slot" is one (worker_id, dp_rank) pair the index can score: one engine
 * rank that publishes events. slot = worker * dp_size + dp_rank.
 *
 * Part 1, the pure core: the judge, the verdict, the counters and the report
 * writers see only what the index said, what the engines said and the
 * counters, so the unit tests drive them with hand-made observations.
 *
 * Part 2, the driver and the processes it talks to:
 *
 *   chk_env                          everything the run talks to
 *   ├─ nats-server   (spawned, or --nats)
 *   ├─ kvo-indexer   (spawned, or --indexer)        idx_http
 *   ├─ engines[e]    kvo-mocker (spawned) or --engines URL
 *   │    └─ ranks[r] last_seq, slot, publisher_id, relay
 *   └─ relays[k]     one kvo-relay per publishing (engine, rank); a restart
 *                    appends a new one and retires the old (generation)
 *
 * A rank is a slot (index-visible) when its engine publishes events:
 * slot = worker_id * dp_size + dp_rank, worker_id = engine index among the
 * publishing engines. Decode-role engines come last and have no slots.
 * Processes (check_spawn.c): nats-server, kvo-mocker per worker, kvo-relay
 * per (worker, rank), kvo-indexer; free loopback ports, readiness by
 * polling, stopped on every path (also Ctrl-C); logs kept on failure.
 */
#ifndef KVO_CHECK_INT_H
#define KVO_CHECK_INT_H

#include "kvo_check.h"
#include "kvo_http.h"
#include "kvo_json.h"
#include "kvo_map.h"
#include "kvo_proc.h"
#include "wire.h"

#include <json-c/json.h>

/* ######################################################################## */
/* Part 1: the pure core (check_core.c, check_report.c, check_html.c)       */
/* ######################################################################## */

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
    uint64_t key;           /* hash of (stage, name): lookups compare it */
    const check_rule *rule; /* check_rule_find(stage, name), cached */
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
/* The indexer's /metrics: stage "indexer", except the counters of relay
 * pipelines running inside it (kvo_relay_*: kvo-indexer --dynamo-http reads
 * the engines' ZMQ itself), which are a relay's and go to stage
 * CHECK_STAGE_INDEXER_PIPES, so the relays' rules judge them. */
#define CHECK_STAGE_INDEXER_PIPES "relay (indexer)"
kvo_status check_counters_parse_indexer(check_counters *c, const char *text,
                                        size_t len);
/* A JSON object (parsed by kvo_json): every numeric (or boolean) leaf,
 * named by its dotted path ("nats.dropped", "gaps.0"), members in key
 * order. */
kvo_status check_counters_parse_json(check_counters *c, const char *stage,
                                     const kvo_jv *j);

/* ======================================================================== */
/* Reasons and the rules that turn counters into causes                      */
/* ======================================================================== */

typedef enum check_reason {
    CHECK_REASON_NONE = 0,
    CHECK_REASON_MISSED_STORE,  /* "missed store": index behind the engine */
    CHECK_REASON_STALE_BLOCK,   /* "stale block": index holds evicted blocks */
    CHECK_REASON_HASH_MISMATCH, /* "hash mismatch": engine hash not H(tokens) */
    CHECK_REASON_UNKNOWN_PARENT, /* "unknown parent": store rejected */
    CHECK_REASON_WRONG_RANK,     /* "wrong rank": blocks on a sibling rank */
    CHECK_REASON_SEQ_GAP,        /* "seq gap": events lost in transport */
    CHECK_REASON_REJECTED,       /* "rejected event": decode/validation */
    CHECK_REASON_ENGINE,         /* "engine inconsistent": probe != response */
    CHECK_REASON_ENGINE_ERROR,   /* "engine error": it failed to publish */
    CHECK_REASON_WRONG_PARENT,   /* "wrong parent": a block under another
                                    parent in the index */
    CHECK_REASON_TOKEN_MISMATCH, /* "token mismatch": the index holds the
                                    block hash with another tokens_hash */
    CHECK_REASON_WRONG_WORKER,   /* "wrong worker": the block is held by
                                    another worker only */
    CHECK_REASON_UNEXPLAINED,    /* "unexplained": the evidence fits no
                                    class (it is shown) */
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
    const char *what; /* "events with an unknown parent" */
    bool clean_only;  /* only in a run with no injected fault: a gap
                                 or a recovery there is a bug recovery hid;
                                 under faults recovery is expected, and the
                                 prompts and checkpoints judge it */
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
    uint64_t id; /* 0-based trace line */
    uint32_t prompt_tokens;
    uint32_t block_size;
    uint32_t n_slots;
    uint32_t dp_size;                /* slots per worker (worker = slot / dp) */
    uint32_t chosen;                 /* slot the request went to */
    const uint32_t *index_scores;    /* as the index answered (uncapped) */
    const int32_t *probe_hits;       /* engine truth before the request, already
                                    capped; NULL or -1 = not probed */
    const int32_t *probe_cache_hits; /* NULL: the same; else probe_hits is
                                    what a router sees (a hybrid model's
                                    full-attention group, the GPU tier)
                                    and this the engine's own hit, which
                                    its response reports */
    const int32_t *probe_cpu;        /* per slot: the CPU run of a tiered
                                    probe (probe_hits its GPU run,
                                    probe_cache_hits the GPU+CPU hit);
                                    NULL or -1 = no CPU tier */
    const uint32_t *index_host_scores; /* per slot, uncapped: the device
                                    run plus the host_pinned run after it
                                    (cumulative; the device score where the
                                    index gave no tiers); NULL = the CPU
                                    tier is not judged */
    bool index_tiered;                 /* the index answered a tier at least
                                    once in the run (the detail says so
                                    when it never did) */
    int64_t cached_tokens;             /* from the response; -1 = unknown */
    const uint8_t *index_seen;         /* per slot: the index ever scored it
                                    (NULL = unknown) */
    const check_counters *moved;       /* rule counters that moved since the
                                    previous prompt (NULL = none known) */
    const check_counters *total;       /* all counters so far (NULL = none) */
    double ms;                         /* wall time spent on this prompt */
    /* Load mode: index_scores are what the router saw (no watermark wait)
     * and probe_hits is NULL: the prompt is recorded, not judged. */
    bool unjudged;
    uint32_t inflight_at_route; /* requests kvo-check had in flight (every
                                    slot) when this one was routed */
    uint32_t checkpoint;        /* sweep entries: the checkpoint (1..) */
} check_obs;

typedef struct check_prompt {
    uint64_t id;
    uint32_t slot, worker, dp_rank; /* where the request went */
    uint32_t prompt_tokens;
    uint32_t prompt_blocks;    /* ceil(tokens / block_size) */
    uint32_t cap;              /* (tokens - 1) // block_size */
    int32_t engine_hit_blocks; /* chosen slot: cached_tokens / bs (or the
                                    probe when the response had none) */
    uint32_t index_hit_blocks; /* chosen slot, capped */
    uint32_t index_raw_blocks; /* chosen slot, uncapped (Dynamo's score) */
    uint32_t *index_scores;    /* per slot, uncapped (result-owned) */
    int32_t *engine_hits;      /* per slot, -1 unknown (result-owned) */
    bool diverged;
    int32_t first_divergent_block; /* -1 when not diverged */
    int32_t divergent_slot;        /* slot of the first divergence, -1 */
    bool tier_cpu;                 /* that divergence is the CPU tier's:
                                    the GPU runs agreed everywhere, the
                                    GPU+CPU hit and the index's host_pinned
                                    score did not (detail names the tier) */
    int32_t tier_engine_blocks;    /* tier_cpu: the engine's GPU+CPU hit */
    uint32_t tier_index_blocks;    /*   and the index's, capped, there */
    check_reason reason;
    char detail[200];     /* "worker 1 rank 0: engine 12, index 8; ..." */
    const char *evidence; /* what the engine and the index hold at
                                    the first divergent block (result-owned;
                                    NULL: none gathered) */
    const struct check_evidence_row *rows; /* the same, block by block */
    uint32_t n_rows;                       /* (result-owned; 0: not kept) */
    double ms;
    bool judged;                  /* false in load mode: reported only */
    uint32_t routed_index_blocks; /* the chosen slot's index score when it
                                    was routed, capped (= index_hit_blocks) */
    uint32_t inflight_at_route;
    uint32_t checkpoint; /* sweep entries: which checkpoint, 1.. */
} check_prompt;

/* ======================================================================== */
/* A whole run                                                                */
/* ======================================================================== */

/* Where the driver's wall time went. */
typedef enum check_stage {
    CHECK_STAGE_SYNC = 0,   /* waiting for the watermark / settle */
    CHECK_STAGE_COUNTERS,   /* reading /metrics of the indexer and relays */
    CHECK_STAGE_QUERY,      /* index query */
    CHECK_STAGE_PROBE,      /* /kvo/probe of every engine */
    CHECK_STAGE_COMPLETE,   /* the completion itself */
    CHECK_STAGE_SWEEP,      /* re-checking earlier prompts at checkpoints */
    CHECK_STAGE_OTHER,      /* prompt synthesis, hashing, judging, reports */
    CHECK_STAGE_CHECKPOINT, /* checkpoints: drain, sync, block sets */
    CHECK_STAGE_TRAFFIC,    /* load mode: requests in flight */
    CHECK_STAGE_COUNT
} check_stage;

const char *check_stage_name(check_stage s);

/* A rule counter that became non-zero, and when it was first seen. */
typedef struct check_trip {
    char *stage, *name;    /* owned */
    double value;          /* latest value */
    int64_t before_prompt; /* seen before this prompt's query; -1 = at end */
    const check_rule *rule;
} check_trip;

typedef struct check_slot_info {
    uint32_t worker;
    uint32_t dp_rank;
} check_slot_info;

typedef struct check_verdict {
    bool pass;
    char cause[720]; /* "" when pass */
    check_reason reason;
    char where[64]; /* what caught it: "prompt 12", "checkpoint 2: block
                        sets", "checkpoint 1: counters", "counters before
                        prompt 7", "run error" ("" when pass) */
} check_verdict;

typedef struct check_checkpoint check_checkpoint; /* below */

/* ======================================================================== */
/* Faults the oracle injects (check_fault.c; the driver: check_spawn.c)     */
/* ======================================================================== */

typedef enum check_fault_kind {
    CHECK_FAULT_RELAY = 0, /* SIGKILL a relay, start a fresh one (new
                              publisher id, replay from 0) */
    CHECK_FAULT_INDEXER,   /* SIGKILL kvo-indexer, start it again on its
                              port: it rebuilds from the relays' dumps */
    CHECK_FAULT_ENGINE,    /* SIGKILL a kvo-mocker, start it again on its
                              ports: empty; its relays publish cleared */
    CHECK_FAULT_NATS,      /* SIGKILL nats-server, start it again on its
                              port after nats_down_ms */
    CHECK_FAULT_KIND_COUNT
} check_fault_kind;

/* "relay", "indexer", "engine", "nats". */
const char *check_fault_kind_name(check_fault_kind k);

/* The indexer's recovery counters a fault report shows, as deltas from
 * just before the kill to the first sync after it: field, /metrics name
 * (after "kvo_indexer_"). */
#define CHECK_FAULT_RECOVERY(X)                                                \
    X(gaps, "gaps_total")                                                      \
    X(recoveries_events, "recoveries_events_total")                            \
    X(recoveries_dump, "recoveries_dump_total")                                \
    X(envelopes_recovered, "envelopes_recovered_total")                        \
    X(dumps_applied, "dumps_applied_total")                                    \
    X(dump_blocks_applied, "dump_blocks_applied_total")                        \
    X(recovery_failures, "recovery_failures_total")                            \
    X(recovery_ms_total, "recovery_ms_total")

typedef enum check_fault_rec {
#define X(field, prom) CHECK_FAULT_REC_##field,
    CHECK_FAULT_RECOVERY(X)
#undef X
        CHECK_FAULT_REC_COUNT
} check_fault_rec;

const char *check_fault_rec_name(check_fault_rec i);

typedef struct check_fault {
    uint64_t at; /* before request `at` (0-based, trace order) */
    check_fault_kind kind;
    uint32_t worker, rank; /* relay: which; engine: worker */
    /* filled in by the driver */
    bool done;
    char target[64];    /* "kvo-relay[0.0]", "kvo-indexer", ... */
    uint64_t killed_ns; /* monotonic time of the SIGKILL */
    double down_ms;     /* SIGKILL -> the new process ready (the
                               indexer: /health "ok"; an engine: its
                               relays cleared it in the index) */
    double heal_ms;     /* SIGKILL -> the next exact sync of the index
                               (-1: none came) */
    bool has_recovery;  /* rec[] is known */
    double rec[CHECK_FAULT_REC_COUNT];      /* the indexer's deltas */
    double rec_base[CHECK_FAULT_REC_COUNT]; /* its values before the kill */
} check_fault;

/* The faults cfg asks for over a run of `requests` requests, with
 * `workers` x `dp` relays, ordered by `at` (kvo_malloc'd into *out, n
 * entries; NULL and 0 for none). --chaos: before every chaos_every-th
 * request (never the first), one fault; each round of three covers
 * relay, indexer and nats in an order drawn from kvo_splitmix64 seeded
 * with chaos_seed, a relay fault picking its (worker, rank) from the same
 * draws. KVO_EINVAL: chaos_every 0, no relay to restart. */
kvo_status check_faults_plan(const check_cfg *c, uint64_t requests,
                             uint32_t workers, uint32_t dp, check_fault **out,
                             size_t *n);
/* Did cfg inject any fault (a kill, or a forwarder's drop or block)? The
 * clean-only rules hold only when it did not. */
bool check_cfg_faulted(const check_cfg *c);
/* The indexer's recovery counters before the kill (stage "indexer" of
 * before; NULL: all 0, for an indexer that starts again from nothing),
 * then f->rec = those of after minus them. */
void check_fault_base(check_fault *f, const check_counters *before);
void check_fault_recovery(check_fault *f, const check_counters *after);
/* One line: "before request 60: indexer restart kvo-indexer, down 412 ms,
 * healed 430 ms; recoveries_dump +2, dump_blocks_applied +3120". */
void check_fault_text(const check_fault *f, char *out, size_t outsz);

/* Requests of a run that carry each dimension (the summary's "traffic"). */
typedef struct check_traffic_counts {
    uint64_t lora, salted, mm;
} check_traffic_counts;

struct check_result {
    /* set up by the driver before the first prompt */
    uint32_t block_size;
    uint32_t n_slots, dp_size;
    check_slot_info *slots; /* owned */
    uint64_t planned;       /* requests the run meant to send */
    char config[1024];      /* one line: the effective configuration */
    bool verbose;           /* the terminal summary shows every counter and
                               the worst prompts even on a PASS */
    check_traffic_counts traffic; /* requests with an adapter, salt, item */

    check_prompt *prompts; /* owned, in trace order */
    size_t n_prompts, cap_prompts;
    /* The sweep: after the last request, earlier prompts re-checked on
     * every slot (no request sent; truth = the probes). */
    check_prompt *sweep; /* owned */
    size_t n_sweep, cap_sweep, sweep_divergent;
    size_t n_panels; /* prompts whose evidence rows are kept */
    kvo_arena arena; /* per-slot arrays of the prompts */

    /* Checkpoints (check_sets.c), in order; their per-slot arrays live in
     * the arena. */
    check_checkpoint *ckpts;
    size_t n_ckpts, cap_ckpts;
    struct {     /* load mode (cfg.load) */
        bool on; /* prompts reported, not judged */
        check_arrival arrival;
        uint32_t concurrency;
        double time_scale, speedup;
        uint32_t max_inflight; /* most requests kvo-check had in flight */
        uint64_t late;         /* --arrival trace: admitted after their time
                               because `concurrency` were in flight */
        double late_max_ms;
    } load;

    /* faults injected (check_fault.c), in order; faulted: any fault at
     * all (also a forwarder's), which turns the clean-only rules off */
    check_fault *faults; /* owned */
    size_t n_faults;
    bool faulted;

    check_counters counters; /* latest value of every counter, all stages */
    check_trip *trips;
    size_t n_trips, cap_trips;

    char error[320];      /* a run error that stopped it (timeout...) */
    int64_t error_prompt; /* where it happened, -1 none */

    double wall_s;
    double stage_s[CHECK_STAGE_COUNT];
    check_verdict verdict; /* by check_verdict_decide */
};

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

/* ---- Diagnosis from evidence (check_diag.c) ------------------------------
 * The judge knows that a prompt diverged, where, and in which direction;
 * the evidence says why: the engine's chain of the prompt on that rank
 * (kvo-mocker's probe "detail") and what the index holds of the divergent
 * block (kvo-indexer's POST /lookup), both read before the request runs. */

/* One block of an engine's chain. */
typedef struct check_chain_block {
    uint64_t hash, parent, tokens_hash;
    bool has_parent;
    bool cached; /* at least one GPU copy */
    uint32_t copies;
} check_chain_block;

/* Where an index holds a block's tokens under another block hash (POST
 * /lookup's tokens_found). */
typedef enum check_found {
    CHECK_FOUND_NONE = 0,
    CHECK_FOUND_UNDER_PARENT, /* the engine's parent (the root for a first
                                 block) */
    CHECK_FOUND_UNDER_ROOT    /* the root, the engine's parent being a block */
} check_found;

/* What the index holds of one block hash for one (worker, rank). */
#define CHECK_LOOKUP_HOLDERS 4
typedef struct check_lookup {
    bool held;       /* by the (worker, rank) asked about */
    bool has_parent; /* held: its parent in the tree */
    uint64_t parent, tokens_hash;
    uint64_t others;    /* other (worker, rank)s holding it */
    uint32_t n_holders; /* listed of them */
    check_slot_info holders[CHECK_LOOKUP_HOLDERS];
    bool holder_cached[CHECK_LOOKUP_HOLDERS]; /* that holder's engine
                                 holds the block too (the caller fills it
                                 from its probes): a holder by right */
    check_found found;   /* not held: where the (worker, rank) holds the
                            block's tokens under another hash */
    uint64_t found_hash; /*   that hash */
} check_lookup;

/* Blocks of the chain the evidence covers from the divergent one on. */
#define CHECK_DIAG_BLOCKS 16
/* Divergent prompts whose evidence rows a result keeps (the reports' side
 * by side panels); later ones keep the text. */
#define CHECK_PANELS_MAX 200

/* Block `block` of the prompt's chain on the engine, and what the index
 * holds of its hash on the same (worker, rank). */
typedef struct check_evidence_row {
    uint32_t block;
    check_chain_block engine;
    check_lookup index;
} check_evidence_row;

typedef struct check_diag {
    check_reason reason;
    char evidence[320];
    uint32_t n_rows; /* the blocks the evidence was read from */
    check_evidence_row rows[CHECK_DIAG_BLOCKS];
} check_diag;
/* Classify the divergence of (worker, rank) at block k of a prompt: b[i]
 * is the engine's block k + i and l[i] what the index holds of its hash
 * there, i < n (n >= 1: the blocks the engine holds from k on when the
 * index is behind, else block k alone); index_behind: the engine holds
 * more than the index scores. */
void check_diagnose(const check_chain_block *b, const check_lookup *l,
                    uint32_t n, uint32_t k, bool index_behind, uint32_t worker,
                    uint32_t rank, check_diag *out);
/* Set-level evidence for a missed store on (worker, rank) of a worker
 * with dp ranks: engine[r] and index[r] are the sizes of each rank's
 * cached set on both sides. When this rank's index set is smaller than its
 * engine's while a sibling's is larger than its engine's, the stores went
 * to the wrong rank: out says so (wrong rank) and true is returned. */
bool check_diagnose_ranks(const uint64_t *engine, const uint64_t *index,
                          uint32_t dp, uint32_t worker, uint32_t rank,
                          check_diag *out);
/* Put d on p (a diverged prompt): its evidence always (its rows too with
 * keep_rows); its class unless
 * the judge's reason came from the engine contradicting itself, or the
 * evidence only says the index lacks the block (missed store, unexplained)
 * and a rule counter already says how it was lost (a rejection, a gap, a
 * hash mismatch...). */
kvo_status check_prompt_explain(check_prompt *p, const check_diag *d,
                                bool keep_rows, kvo_arena *a);
/* Evidence could not be gathered (why): p keeps the judge's reason, and
 * its evidence says it is a guess from the direction. */
kvo_status check_prompt_unexplained(check_prompt *p, const char *why,
                                    kvo_arena *a);

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
    uint64_t divergent;         /* prompts of the run */
    uint64_t sweep_divergent;   /* prompts re-checked at checkpoints */
    uint64_t by_reason[CHECK_REASON_COUNT]; /* both, by class */
} check_totals;

void check_result_totals(const check_result *r, check_totals *t);
/* "wrong parent 23, stale block 2" into out[n]: the divergences by class
 * (returns the length; "" when none). */
size_t check_totals_classes(const check_totals *t, char *out, size_t n);
/* The n worst prompts into out (divergent first, by distance; then the
 * lowest engine hit rate). Returns how many were written. Pointers are valid
 * until the next check_result_add. */
size_t check_result_worst(const check_result *r, const check_prompt **out,
                          size_t n);

/* ======================================================================== */
/* Routing (check_route.c)                                                   */
/* ======================================================================== */

/* The policies (kvo_check.h) and the in-flight state the dynamo policy
 * weighs; the file header draws the cost and says where it differs from
 * Dynamo. Not thread-safe: the driver holds its lock around every call. */
typedef struct check_router {
    check_policy policy;
    uint32_t n_workers, dp_size, n_slots, block_size;
    double overlap_weight, temperature;
    uint64_t rng;       /* splitmix64 state, from the seed */
    uint64_t *used;     /* requests routed to each slot */
    uint32_t *inflight; /* requests in flight on each slot */
    kvo_map *active;    /* per slot: sequence hash -> requests holding it */
    double *cost;       /* dynamo: each slot's cost at the last pick */
} check_router;

/* KVO_EINVAL: no slot, block size 0, a weight or temperature that is
 * negative or not finite. */
kvo_status check_router_init(check_router *rt, check_policy policy,
                             uint32_t n_workers, uint32_t dp_size,
                             uint32_t block_size, double overlap_weight,
                             double temperature, uint64_t seed);
void check_router_fini(check_router *rt);
/* The sequence hashes of a prompt's full blocks (out[i] names block i with
 * its whole prefix) from their router hashes; out has n entries. */
void check_seq_hashes(const uint64_t *router_hashes, size_t n, uint64_t *out);
/* The slot for the i-th request routed (0-based), from the index's
 * uncapped scores per slot and the prompt's sequence hashes (nb full
 * blocks). Dynamo: the costs stay in rt->cost until the next pick. */
uint32_t check_router_pick(check_router *rt, uint64_t i, const uint32_t *scores,
                           uint32_t prompt_tokens, const uint64_t *seq,
                           size_t nb);
/* The request went to slot: in flight there, its blocks held. KVO_ENOMEM
 * leaves rt as it was. */
kvo_status check_router_start(check_router *rt, uint32_t slot,
                              const uint64_t *seq, size_t nb);
/* It was answered: the same slot and hashes as its start. */
void check_router_finish(check_router *rt, uint32_t slot, const uint64_t *seq,
                         size_t nb);
/* |active(slot)|: distinct blocks of the requests in flight there. */
uint64_t check_router_active_blocks(const check_router *rt, uint32_t slot);

/* ======================================================================== */
/* Checkpoints: block sets, staleness, regime (check_sets.c)                */
/* ======================================================================== */

/* One cached block as a side lists it: its hash and its parent's. */
typedef struct check_block {
    uint64_t hash;
    uint64_t parent; /* when has_parent */
    bool has_parent; /* false: a first block (no parent) */
} check_block;

/* Its term of a set's digest, kvo_block_digest (the engine and the index
 * sum them mod 2^64 over their distinct blocks: equal sets give equal
 * digests, in any order). */
uint64_t check_block_digest(const check_block *b);
/* Sort by (hash, parent) and drop repeats in place (copies count once);
 * returns how many remain. */
size_t check_blocks_normalize(check_block *v, size_t n);
/* The digest of a normalized list. */
uint64_t check_blocks_digest(const check_block *v, size_t n);

typedef enum check_diff_kind {
    CHECK_DIFF_ENGINE_ONLY = 0, /* cached by the engine, not in the index */
    CHECK_DIFF_INDEX_ONLY,      /* in the index, not cached by the engine */
    CHECK_DIFF_PARENT,          /* in both, under different parents */
    CHECK_DIFF_COUNT
} check_diff_kind;

/* "in the engine but not the index", ... */
const char *check_diff_name(check_diff_kind k);
/* The reason a difference of this kind stands for (missed store, stale
 * block, wrong parent). */
check_reason check_diff_reason(check_diff_kind k);

/* Differences shown (in the cause and the reports) per checkpoint. */
#define CHECK_DIFFS_SHOWN 10

typedef struct check_block_diff {
    check_diff_kind kind;
    uint32_t slot;
    check_block engine, index; /* what each side lists (one side only for
                                  ENGINE_ONLY / INDEX_ONLY) */
    int64_t prompt;            /* a prompt of the run whose path holds the
                                  hash, -1 unknown */
    int32_t depth;             /* its block index in that prompt, -1 */
} check_block_diff;

/* A hash one side of a slot lists and the other does not. */
typedef struct check_one_sided {
    uint64_t hash;
    uint32_t slot;
    check_diff_kind kind; /* ENGINE_ONLY or INDEX_ONLY */
} check_one_sided;

/* One-sided hashes kept per checkpoint to find misplaced ones. */
#define CHECK_ONE_SIDED_MAX ((size_t)1 << 20)

typedef struct check_set_diff {
    uint64_t n[CHECK_DIFF_COUNT];
    check_block_diff first[CHECK_DIFFS_SHOWN]; /* in the order found */
    size_t n_first;
    /* Blocks one slot's engine caches that the index credits to another
     * slot whose engine lacks them (the same hash ENGINE_ONLY on one slot,
     * INDEX_ONLY on the other): stores credited to the wrong slot. */
    uint64_t misplaced;
    uint64_t misplaced_hash; /* the first */
    uint32_t misplaced_engine_slot, misplaced_index_slot;
    /* While comparing, when collect is set: the one-sided hashes (at most
     * CHECK_ONE_SIDED_MAX; one_sided_cut when more were seen or memory ran
     * out). Freed by check_set_diff_misplaced. */
    bool collect;
    check_one_sided *one_sided;
    size_t n_one_sided, cap_one_sided;
    bool one_sided_cut;
} check_set_diff;

/* A lower tier's blocks that the index lists without a parent while the
 * engine lists one it holds in neither of the rank's tiers (eng: the
 * tier's engine list, other: the engine's other tier; all normalized):
 * the index's tree cut them off when that parent's last holder left
 * (Dynamo's detach, kept on purpose; kvo-indexer links them again when the
 * parent comes back), and neither side can reach them meanwhile. Gives
 * them the engine's parent in idx, so they compare equal, and returns how
 * many. */
size_t check_blocks_uncut(const check_block *eng, size_t ne,
                          const check_block *other, size_t no, check_block *idx,
                          size_t ni);
/* How many of idx's blocks could be such (other not looked at): when none,
 * the engine's other tier need not be read. */
size_t check_blocks_cut(const check_block *eng, size_t ne,
                        const check_block *idx, size_t ni);
/* Adds slot's differences between two normalized lists to d (counts, and
 * the first ones while there is room). A hash both list under different
 * parents is one CHECK_DIFF_PARENT. */
void check_blocks_compare(const check_block *eng, size_t ne,
                          const check_block *idx, size_t ni, uint32_t slot,
                          check_set_diff *d);

/* After every slot was compared: count d's misplaced blocks from its
 * one-sided hashes, and free them. */
void check_set_diff_misplaced(check_set_diff *d);
/* The class of a checkpoint's block-set differences: wrong rank / wrong
 * worker when blocks were misplaced, else that of the most numerous
 * kind. */
check_reason check_set_diff_reason(const check_set_diff *d, uint32_t dp_size);

/* One (worker, rank) at a checkpoint. */
typedef struct check_slot_sets {
    bool compared; /* both sides answered with a digest */
    bool listed;   /* the digests differed: lists fetched */
    uint64_t engine_blocks, index_blocks; /* distinct hashes */
    uint64_t engine_digest, index_digest;
    uint64_t n[CHECK_DIFF_COUNT];
    uint64_t cut; /* CPU blocks the index's tree cut from a parent the
                     engine holds in no tier (check_blocks_uncut) */
} check_slot_sets;

/* A checkpoint's CPU tier: every rank whose engine tells a CPU set
 * (kvo-mocker --cpu-offload-blocks: /kvo/state's cpu_cached_*), that set
 * against the index's host_pinned set of the rank, compared as the GPU
 * sets are (digests, then lists where they differ). */
typedef struct check_tier_sets {
    uint32_t ranks;    /* ranks with a CPU tier (0: no CPU tier at all) */
    uint32_t compared; /* of them, compared (both sides gave a digest) */
    uint32_t listed;   /* of them, their lists fetched (digests differed) */
    char note[200];    /* why some were not compared ("" when all were) */
    uint64_t engine_blocks, index_blocks; /* distinct, compared ranks */
    uint64_t cut;        /* blocks compared under the engine's parent (the
                     index's tree cut them: check_blocks_uncut) */
    check_set_diff diff; /* over every compared rank */
} check_tier_sets;

struct check_checkpoint {
    uint32_t number;       /* 1, 2, ... */
    uint64_t after;        /* requests answered before it */
    int64_t before_prompt; /* id of the next request; -1 at the end */
    bool final;
    bool sets; /* block sets compared (else sets_note says
                               why not) */
    char sets_note[160];
    check_slot_sets *slots; /* n_slots entries (result-owned) */
    check_set_diff diff;    /* over every slot */
    check_tier_sets cpu;    /* the CPU tier's sets */
    uint64_t listed_blocks; /* block entries fetched (both sides, both
                               tiers) */
    uint64_t sweep_prompts, sweep_divergent;
    int64_t sweep_first; /* r->sweep index of its first divergence, -1 */
    double drain_s, sync_s, sets_s, sweep_s;
};

/* Append a copy of c (and of slots[n_slots]) to r. */
kvo_status check_result_checkpoint(check_result *r, const check_checkpoint *c,
                                   const check_slot_sets *slots);
/* Did checkpoint c find anything? */
bool check_checkpoint_failed(const check_checkpoint *c);
/* Did its block sets differ (either tier)? */
bool check_checkpoint_sets_differ(const check_checkpoint *c);
/* Its cause: "checkpoint 2 after 400 requests: 3 blocks in the index but
 * not the engine (worker 0 rank 1: 3); first: ..." (empty when clean);
 * the CPU tier's differences after "tier cpu: ". */
void check_checkpoint_cause(const check_result *r, const check_checkpoint *c,
                            char *out, size_t outsz);
/* One difference in words: "index only: block 123 (parent 45), prompt 7
 * block 3". */
void check_block_diff_text(const check_result *r, const check_block_diff *d,
                           char *out, size_t outsz);

/* What the router saw: per prompt with a known engine hit, the index's
 * capped score at routing time minus the engine's hit blocks. */
typedef struct check_staleness {
    uint64_t requests;           /* prompts counted */
    uint64_t exact, over, under; /* difference 0, > 0 (index claimed more),
                                   < 0 (index lagged stores) */
    uint32_t abs_p50, abs_p99, abs_max; /* |difference| in blocks */
    uint32_t over_p50, over_p99, over_max;
    uint32_t under_p50, under_p99, under_max;
    uint64_t prompt_tokens;
    uint64_t promised_tokens; /* routed_index_blocks * bs: the hit rate
                                   the routing-time scores promised */
    uint64_t achieved_tokens; /* engine hit tokens */
} check_staleness;

/* Nearest-rank percentiles. KVO_ENOMEM leaves out zeroed. */
kvo_status check_result_staleness(const check_result *r, check_staleness *out);

/* The regime the engines ran in, from their counters (stage "engine W.R"):
 * name, how ranks combine, what it means. One table, every view. */
#define CHECK_REGIME(X)                                                        \
    X(steps_multi, CHECK_AGG_SUM, "steps with >= 2 requests")                  \
    X(max_running, CHECK_AGG_MAX, "most requests running in one step")         \
    X(prefills_split, CHECK_AGG_SUM, "prefills split over several steps")      \
    X(preemptions, CHECK_AGG_SUM, "preemptions (recompute)")                   \
    X(evictions_in_store_steps, CHECK_AGG_SUM,                                 \
      "blocks evicted in a step that also stored")                             \
    X(max_inflight, CHECK_AGG_MAX, "most requests in flight at once")

typedef enum check_agg { CHECK_AGG_SUM, CHECK_AGG_MAX } check_agg;

typedef enum check_regime_item {
#define X(name, agg, what) CHECK_REGIME_##name,
    CHECK_REGIME(X)
#undef X
        CHECK_REGIME_COUNT
} check_regime_item;

typedef struct check_regime {
    bool known; /* some engine reported them */
    double v[CHECK_REGIME_COUNT];
} check_regime;

const char *check_regime_name(check_regime_item i);
const char *check_regime_what(check_regime_item i);
void check_result_regime(const check_result *r, check_regime *out);

/* ======================================================================== */
/* Reports written while the run goes (the rest: kvo_check.h)               */
/* ======================================================================== */

/* One progress line ("\r[####....] 523/1000 ..."), for a terminal. */
void check_report_progress(FILE *f, const check_result *r, uint64_t done,
                           uint64_t total, double elapsed_s);
/* One JSON line for prompt p. */
kvo_status check_report_json_prompt(FILE *f, const check_result *r,
                                    const check_prompt *p);
/* A divergent sweep entry: a prompt line with "sweep": true. */
kvo_status check_report_json_sweep(FILE *f, const check_result *r,
                                   const check_prompt *p);

/* ######################################################################## */
/* Part 2: the driver (check_trace.c, check_run.c, check_spawn.c,           */
/* check_http.c, check_pool.c)                                              */
/* ######################################################################## */

/* ======================================================================== */
/* Trace (Mooncake JSONL) and prompts                                        */
/* ======================================================================== */

typedef struct check_request {
    uint64_t line;          /* 0-based line of the trace */
    double timestamp_ms;    /* arrival in the trace (--arrival trace) */
    uint32_t input_length;  /* prompt tokens */
    uint32_t output_length; /* max_tokens */
    uint32_t n_hash_ids;
    const uint64_t *hash_ids;
} check_request;

/* ---- Traffic dimensions (check_traffic.c) ------------------------------------*/

/* What a request carries besides its tokens: the adapter it names, its
 * tenant's salt, its multimodal item ("" / has_mm false = none). */
typedef struct check_keys {
    char lora[24];
    char salt[24];
    char mm_id[24];
    bool has_mm;
    wire_mm_span mm; /* mm.id = mm_id */
} check_keys;

/* Whether any request may carry keys under c. */
bool check_traffic_any(const check_cfg *c);
/* The keys of q under c: a pure function of c->seed, q->line and the
 * options. */
void check_keys_of(const check_cfg *c, const check_request *q, check_keys *out);
/* The request-body members of k after the prompt (",\"cache_salt\":...,
 * \"mm_items\":[...]"), into out (reset first); "" when none. */
kvo_status check_keys_json(const check_keys *k, kvo_buf *out);
/* How many of the n requests carry each dimension. */
void check_traffic_count(const check_cfg *c, const check_request *reqs,
                         size_t n, check_traffic_counts *out);

typedef struct check_trace {
    check_request *reqs; /* owned */
    size_t n;
    uint64_t rejected;        /* lines the reader refused */
    char first_rejected[256]; /* why it refused the first one ("" none) */
    void *impl;               /* the reader's own storage */
} check_trace;

/* Load at most limit requests (0 = all); malformed lines are skipped and
 * counted. err gets a one-line reason. */
kvo_status check_trace_load(check_trace *t, const char *path, uint64_t limit,
                            kvo_err *err);
void check_trace_fini(check_trace *t);
/* The prompt tokens of DESIGN §8 into tokens (u64 each; replaced). */
kvo_status check_request_tokens(const check_request *r, kvo_buf *tokens);

/* Ranks per engine (chk_engine.ranks is an array of them) and engines per
 * run (--workers + --decode-workers) that kvo-check accepts. */
#define CHK_MAX_DP 16
#define CHK_MAX_ENGINES 256

/* A child's command line: heap strings in a growable array, NULL-terminated,
 * as many and as long as they come. The first failure (out of memory)
 * sticks in st and later chk_arg calls do nothing, so a builder looks at st
 * once, before it spawns. One argument may be the port the child listens
 * on, written by chk_args_set_port before each try. */
typedef struct chk_args {
    char **v; /* owned, each string too; v[n] == NULL */
    size_t n, cap;
    kvo_status st;           /* KVO_OK or the first failure */
    size_t port_at;          /* index of the port argument, SIZE_MAX none */
    const char *port_prefix; /* written before the port ("127.0.0.1:") */
} chk_args;

typedef struct chk_rank {
    uint32_t dp_rank;
    uint32_t slot;       /* UINT32_MAX: publishes nothing */
    int64_t last_seq;    /* last ZMQ seq the engine published, -1 none */
    bool has_set;        /* /kvo/state told its cached set: */
    uint64_t set_count;  /*   distinct cached hashes */
    uint64_t set_digest; /*   their digest (check_block_digest) */
    bool has_cpu_set;    /* and its CPU tier's (cpu_cached_*): */
    uint64_t cpu_set_count, cpu_set_digest;
    int relay;        /* index into env->relays, -1 none */
    bool restarted;   /* its engine was killed and started again:
                               sequences from 0 under the same relay, which
                               the index's watermark (a maximum) cannot
                               follow; synced by block sets instead */
    char zmq[160];    /* from /kvo/event_sources */
    char replay[160]; /* "" = none */
    char topic[128];
} chk_rank;

typedef struct chk_engine {
    char url[192]; /* http://127.0.0.1:PORT (no trailing slash) */
    char name[32]; /* "kvo-mocker[1]" */
    uint32_t worker_id;
    bool mocker; /* answers /kvo/state and /kvo/probe */
    bool decode; /* disaggregated decode worker: no events */
    bool dirty;  /* got a request since /kvo/state was read */
    uint32_t n_ranks;
    chk_rank ranks[CHK_MAX_DP];
    kvo_http_client *http;       /* state, sources, completions */
    kvo_http_client *probe_http; /* probes (they overlap the sync) */
    kvo_proc proc;               /* pid 0 when not spawned by us */
    chk_args args;               /* spawned: its command line (ports fixed), to
                               start it again after a kill */
    uint16_t port;               /* spawned: its HTTP port */
} chk_engine;

typedef struct chk_relay {
    kvo_proc proc;
    uint32_t engine, dp_rank;
    uint64_t publisher_id;
    uint16_t metrics_port;
    char stage[64]; /* counters stage: "relay 0.1" ("... #1" once
                               retired) */
    bool retired;   /* killed and replaced */
    bool dirty;     /* its counters may have moved */
    kvo_http_client *http;
} chk_relay;

typedef struct chk_proxy chk_proxy; /* --drop-seq: a ZMQ forwarder */

typedef struct chk_env {
    const check_cfg *cfg;
    const check_trace *trace; /* the run's requests (replay buffer size) */
    char log_dir[512];
    bool own_log_dir; /* created by us (removed on PASS) */
    char bin_dir[512];

    kvo_proc nats[CHECK_NATS_MAX]; /* spawned: one, or a cluster */
    uint32_t n_nats;
    char nats_url[256];       /* the indexer's servers, its node first */
    char relay_nats_url[256]; /* the relays': node 1 first in a cluster */
    chk_args nats_args[CHECK_NATS_MAX]; /* spawned: command lines (ports */
    uint16_t nats_port[CHECK_NATS_MAX]; /*   fixed), to start them again */
    kvo_proc indexer;
    char indexer_url[192];
    chk_args idx_args;
    uint16_t idx_port;
    kvo_http_client *idx_http;    /* watermark, query */
    kvo_http_client *idx_metrics; /* /metrics (overlaps the query) */

    chk_engine *engines; /* publishing ones first, then decode ones */
    uint32_t n_engines;
    uint32_t n_workers; /* publishing engines */
    uint32_t n_decode;
    uint32_t dp_size;
    uint32_t block_size;
    char model[CHECK_MODEL_MAX];      /* "model" of completions */
    char model_name[CHECK_MODEL_MAX]; /* --indexer-api dynamo: the index's
                                         partition */
    bool exact;      /* exact watermarks (kvo-mocker + our relays, or a Dynamo
                   indexer with kvo's GET /watermark) */
    bool registered; /* dynamo: the engine ranks were registered */
    bool dynamo_watermark; /* dynamo: it answers kvo's GET /watermark */

    chk_relay *relays;
    uint32_t n_relays;
    size_t cap_relays;
    uint64_t publisher_base;
    uint32_t publishers_made;
    uint32_t restarts; /* processes killed and started again (their
                               retired counters' "#n") */

    chk_proxy *proxy;
} chk_env;

/* ---- check_pool.c -----------------------------------------------------------*/

typedef struct chk_task chk_task;
struct chk_task {
    void (*fn)(chk_task *t); /* runs on any thread */
};
typedef struct chk_pool chk_pool;

/* threads: workers besides the caller (0 = run everything inline). */
kvo_status chk_pool_new(chk_pool **out, int threads);
void chk_pool_free(chk_pool *p);
/* Run every task once, concurrently; returns when all are done. */
void chk_pool_run(chk_pool *p, chk_task *const *tasks, size_t n);

/* ---- check_spawn.c --------------------------------------------------------*/

void chk_args_init(chk_args *a);
void chk_args_fini(chk_args *a);
void chk_arg(chk_args *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The port argument: prefix (borrowed, static) then the port. */
void chk_arg_port(chk_args *a, const char *prefix);
/* KVO_EINVAL: no port argument (or st failed); KVO_ENOMEM. */
kvo_status chk_args_set_port(chk_args *a, uint16_t port);

/* Start (or attach to) everything cfg asks for; err gets a one-line reason.
 * trace (may be NULL) sizes the engines' replay buffers. On failure
 * everything already started is stopped again. */
kvo_status chk_env_start(chk_env *env, const check_cfg *cfg,
                         const check_trace *trace, kvo_err *err);
/* Stop everything we started (reverse order). keep_logs: leave the log
 * directory and print where it is; else remove it when we created it. */
void chk_env_stop(chk_env *env, bool keep_logs);
/* Inject fault f (check_fault.c): SIGKILL its process and start it again,
 * as the kind says, and wait until the new one is ready (f->target,
 * killed_ns, down_ms, done). The killed process's last counters stay in
 * `counters` under a retired stage name ("relay 0.0 #1", "indexer #1",
 * "engine 0.0 #1"). A relay comes back as a fresh one (new publisher id,
 * --replay-from 0); the indexer on its port, ready once /health says "ok"
 * (its dumps applied); an engine on its ports, ready once the index holds
 * none of its blocks (its relays saw the restart and cleared it);
 * nats-server on its port after cfg->nats_down_ms. */
kvo_status chk_env_fault(chk_env *env, check_fault *f, check_counters *counters,
                         kvo_err *err);
/* CPU seconds (user + system) of every process we started, and of
 * kvo-check itself, into stage "cpu" ("kvo-mocker[0]" = 1.23). */
kvo_status chk_env_cpu(chk_env *env, check_counters *c);
/* Print the tail of every spawned process's log to stderr. */
void chk_env_dump_logs(chk_env *env, int lines);
/* A process that died: its name and exit status into why; false if all
 * live. */
bool chk_env_dead(chk_env *env, char *why, size_t whysz);

/* ---- check_http.c ----------------------------------------------------------*/

/* GET /kvo/state of e: every rank's last_seq (-1: nothing published) and,
 * when it tells them, its cached set's size and digest (has_set). */
kvo_status chk_engine_state(chk_engine *e, kvo_err *err);
/* GET /kvo/event_sources into e's ranks (zmq, replay, topic); n_ranks is
 * set from it; 0 sources = an engine that publishes nothing. */
kvo_status chk_engine_sources(chk_engine *e, kvo_err *err);
/* One prompt, serialized once for every call that carries it: the trace
 * object {"hash_ids": [...], "input_length": n} (kvo-mocker's extension) or
 * the token-id array [t0, t1, ...]. */
typedef struct chk_prompt {
    bool trace_form;
    const char *json; /* the object or the array */
    size_t len;
    const char *lora;  /* the adapter: the completion's model, the
                                probe's lora_name; NULL or "" = none */
    const char *extra; /* more body members (",\"cache_salt\":..."),
                                NULL = none */
    size_t extra_len;
} chk_prompt;
/* POST /kvo/probe for every rank of e: hits[rank], what a router must
 * score (a hybrid model's full_blocks, a tiered cache's gpu run, else
 * hit_blocks), cache_hits[rank], the engine's own hit (hit_blocks), and
 * cpu[rank] (cpu may be NULL), a tiered cache's CPU run (-1: no "gpu" in
 * the answer, no CPU tier). warm (trace form): the prompt goes to e next
 * -- kvo-mocker hashes it ahead, after answering. */
kvo_status chk_engine_probe(chk_engine *e, const chk_prompt *p,
                            uint32_t block_size, bool warm, int32_t *hits,
                            int32_t *cache_hits, int32_t *cpu, kvo_err *err);
/* POST /kvo/probe "detail": blocks [k, k + *n) of p's chain on the given
 * dp rank (hash, parent, copies, tokens_hash) into out; *n is cut to what
 * the chain holds. KVO_ENOTFOUND: an engine without the detail form, or a
 * chain that stops before k. */
kvo_status chk_engine_chain(chk_engine *e, const chk_prompt *p, uint32_t rank,
                            uint32_t k, check_chain_block *out, uint32_t *n,
                            kvo_err *err);
typedef struct chk_completion {
    int64_t cached_tokens;    /* -1: not reported */
    int64_t prompt_tokens;    /* -1: not reported */
    int64_t dp_rank;          /* kvo.dp_rank, -1 */
    int64_t last_seq;         /* kvo.last_seq, -1 (null: nothing published) */
    bool kvo;                 /* kvo-mocker's "kvo" object with its dp_rank */
    char *kv_transfer_params; /* JSON text (prefill role) or NULL; owned */
} chk_completion;
/* POST /v1/completions; dp_rank < 0: let the engine pick. kv_params: JSON
 * text to pass as kv_transfer_params (decode step) or NULL. */
kvo_status chk_engine_complete(chk_engine *e, const char *model,
                               const chk_prompt *p, uint32_t max_tokens,
                               int dp_rank, const char *kv_params,
                               chk_completion *out, kvo_err *err);
/* The same with the caller's client (one per thread; e is only read). */
kvo_status chk_engine_complete_via(kvo_http_client *h, const chk_engine *e,
                                   const char *model, const chk_prompt *p,
                                   uint32_t max_tokens, int dp_rank,
                                   const char *kv_params, chk_completion *out,
                                   kvo_err *err);
/* POST /reset_prefix_cache (the engine must be idle: vLLM refuses a reset
 * while blocks are in use). */
kvo_status chk_engine_reset(chk_engine *e, kvo_err *err);
/* GET /kvo/state: every rank's counters, resident and free blocks into
 * stage "engine <worker>.<rank>". */
kvo_status chk_engine_counters(chk_engine *e, check_counters *c, kvo_err *err);
/* GET /v1/models: the first model id. */
kvo_status chk_engine_model(chk_engine *e, char *model, size_t modelsz,
                            kvo_err *err);

/* --indexer-api dynamo: the watermark's key of (instance_id, dp_rank),
 * which kvo-check's relays' publisher ids (below 2^51) never equal. */
static inline uint64_t chk_rank_key(uint32_t worker, uint32_t dp_rank) {
    return (1ull << 63) | ((uint64_t)worker << 32) | dp_rank;
}
/* --indexer-api dynamo: POST /register of one engine rank (on), or
 * /unregister of engine e (rk unused); instance_id = e's worker id. */
kvo_status chk_index_dynamo_register(chk_env *env, const chk_engine *e,
                                     const chk_rank *rk, bool on, kvo_err *err);
/* What a kvo API answer says of the lower tiers, per slot: host[slot] =
 * the device run plus the host_pinned run after it (an entry's "tiers":
 * {"host_pinned": N}, cumulative; without one, its "blocks"). A Dynamo
 * answer has no per-rank tiers: host = the scores, answered false. */
typedef struct chk_tiers {
    uint32_t *host; /* n_slots entries, the caller's */
    bool answered;  /* some entry had "tiers" */
} chk_tiers;
/* Indexer: scores per slot for the prompt's router hashes, and (tiers
 * not NULL) its tiers. */
kvo_status chk_index_query(chk_env *env, const uint64_t *hashes, size_t n,
                           uint32_t *scores, chk_tiers *tiers, kvo_err *err);
/* Indexer GET /watermark: zmq_seq_last of publisher (-1 null or absent). */
typedef struct chk_watermark {
    size_t n;
    uint64_t *publisher;
    int64_t *zmq_last;
    kvo_buf raw; /* the body (settle mode compares it) */
} chk_watermark;
/* The same query, answered by kvo-indexer once its watermark reaches seq
 * for every (publisher, seq) in pairs, or after timeout_ms: scores, the
 * watermark at that moment into wm (raw left empty) and whether it covered
 * the pairs; metrics (if not NULL) gets the indexer's /metrics text read
 * at that moment. KVO_EUNSUPPORTED: the indexer ignored the wait (no
 * watermark or metrics in its answer): poll /watermark instead. */
kvo_status chk_index_query_wait(chk_env *env, const uint64_t *hashes, size_t n,
                                const uint64_t *pairs, size_t npairs,
                                long timeout_ms, uint32_t *scores,
                                chk_tiers *tiers, chk_watermark *wm,
                                bool *covered, kvo_buf *metrics, kvo_err *err);
/* Either query with the caller's client (one per thread). */
kvo_status chk_index_query_via(kvo_http_client *h, const chk_env *env,
                               const uint64_t *hashes, size_t n,
                               const uint64_t *pairs, size_t npairs,
                               long timeout_ms, uint32_t *scores,
                               chk_tiers *tiers, chk_watermark *wm,
                               bool *covered, kvo_buf *metrics, kvo_err *err);
void chk_watermark_fini(chk_watermark *w);
kvo_status chk_index_watermark(chk_env *env, chk_watermark *w, kvo_err *err);
/* What settle mode watches into w->raw: GET /watermark's answer (w filled
 * as by chk_index_watermark), or for a Dynamo indexer without one, the
 * answer to the query of hashes. */
kvo_status chk_index_settle_view(chk_env *env, const uint64_t *hashes, size_t n,
                                 chk_watermark *w, kvo_err *err);
int64_t chk_watermark_get(const chk_watermark *w, uint64_t publisher,
                          bool *present);
/* Counters: fetch a /metrics body (any thread), then parse it into a
 * stage (the caller's thread). */
kvo_status chk_metrics_fetch(kvo_http_client *c, const char *url,
                             kvo_http_resp *resp, kvo_err *err);
kvo_status chk_counters_relay(chk_relay *r, check_counters *c, kvo_err *err);
/* Append a string literal to b (its length counted by the compiler). */
#define CHK_BUF_LIT(b, lit) kvo_buf_append((b), "" lit, sizeof(lit) - 1)
/* Append "[n,n,...]" of u64s to b, fast (hash lists are long). */
kvo_status chk_json_u64s(kvo_buf *b, const uint64_t *v, size_t n);
/* A cached block set of one (worker, rank), as a side tells it: its size
 * and digest, and (when listed) its blocks, as listed (not normalized). */
typedef struct chk_blocks {
    uint64_t count, digest;
    check_block *v; /* owned */
    size_t n, cap;
} chk_blocks;
void chk_blocks_init(chk_blocks *b);
void chk_blocks_fini(chk_blocks *b);
/* kvo-mocker GET /kvo/blocks?rank=R, every page, into out (replaced; left
 * as it was on failure); tier WIRE_TIER_HOST_PINNED: the CPU tier's set
 * (&tier=cpu), DEVICE: the GPU pool's (KVO_EINVAL: another tier). */
kvo_status chk_engine_blocks(chk_engine *e, uint32_t dp_rank, wire_tier tier,
                             chk_blocks *out, kvo_err *err);
/* POST /lookup: what the index holds of each block of the engine's chain
 * b[0, n) (consecutive blocks) for (worker, dp_rank), into out[0, n),
 * with where it holds their tokens under another hash. KVO_ENOTFOUND: an
 * indexer without the endpoint. */
kvo_status chk_index_lookup(chk_env *env, uint32_t worker, uint32_t dp_rank,
                            const check_chain_block *b, uint32_t n,
                            check_lookup *out, kvo_err *err);
/* kvo-indexer GET /blocks?worker_id=W&dp_rank=R: with list, every page;
 * else the count and digest only (digest_only=1); a tier other than
 * DEVICE is asked for by name (&tier=host_pinned). KVO_ENOTFOUND: the
 * indexer has no such endpoint; KVO_EUNSUPPORTED: it refused the tier
 * (HTTP 400: an indexer of the device tier only). */
kvo_status chk_index_blocks(chk_env *env, uint32_t worker, uint32_t dp_rank,
                            wire_tier tier, bool list, chk_blocks *out,
                            kvo_err *err);
/* kvo-indexer GET /health: its "status" ("ok", "recovering", "stale")
 * and "nats" ("connected", "reconnecting", ...) into the buffers. */
kvo_status chk_index_health(chk_env *env, char *status, size_t statussz,
                            char *nats, size_t natssz, kvo_err *err);
/* kvo-indexer /metrics into stage "indexer" of c. */
kvo_status chk_counters_indexer(chk_env *env, check_counters *c, kvo_err *err);
/* Relay GET /stats: are all its sources live (initial replay done)? */
kvo_status chk_relay_live(chk_relay *r, bool *live);
/* Where a batch of seq that the index never applied stands at relay r
 * (its /stats, the source of dp_rank), in words into out: not received
 * from the engine (the last seq it has, its source's state and ZMQ
 * connection), received but its NATS connection down, or received and
 * sent (so lost between NATS and the indexer). What /stats did not say is
 * said too. */
void chk_relay_where(chk_relay *r, uint32_t dp_rank, int64_t seq, char *out,
                     size_t n);

/* ######################################################################## */
/* Part 3: the run (check_run.c: set-up, lockstep, the shared steps;        */
/* check_ckpt.c: checkpoints; check_load.c: load mode)                      */
/* ######################################################################## */

/* One prompt as the driver sends it. */
typedef struct chk_pbuf {
    kvo_buf tokens;   /* u64 prompt tokens, when needed */
    kvo_buf json;     /* the trace object or the token-id array */
    check_keys keys;  /* adapter, salt, item (check_keys_of) */
    kvo_buf extra;    /* their body members (check_keys_json) */
    uint64_t *hashes; /* router hashes of the full blocks */
    uint64_t *seq;    /* their sequence hashes (routing) */
    size_t cap, nb;   /* room, full blocks */
} chk_pbuf;

void chk_pbuf_init(chk_pbuf *pb);
void chk_pbuf_fini(chk_pbuf *pb);

/* Router hashes of trace blocks, memoized (check_run.c). */
typedef struct chk_rh_memo {
    uint64_t *keys; /* the trace hash id of a row */
    uint8_t *used;  /* the row holds keys' hashes */
    uint64_t *rows; /* MOCK_TRACE_BLOCK/block_size hashes per row */
} chk_rh_memo;

struct rtask; /* check_run.c's concurrent calls */
struct mock_hasher;

typedef struct chk_run {
    const check_cfg *cfg;
    chk_env env;
    check_trace trace;
    check_result *res;
    FILE *json; /* --report-json, NULL */
    uint32_t n_slots;
    chk_pbuf pb; /* lockstep's prompt, and the sweep's */
    chk_rh_memo rh;
    uint32_t *scores; /* per slot */
    int32_t *probes;  /* per slot: what the index must score */
    int32_t *cached;  /* per slot: the engine's own hit (the same unless a
                         hybrid model or a tiered cache) */
    int32_t *cpu;     /* per slot: a tiered probe's CPU run, -1 */
    chk_tiers tiers;  /* the last query's (tiers.host: per slot) */
    bool tiers_seen;  /* some query answered tiers */
    uint8_t *seen;    /* per slot: the index ever scored it */
    check_router router;
    uint64_t decode_rr;
    bool trace_form;
    bool no_wait;      /* the indexer cannot hold a query for a
                              watermark */
    int stalled_relay; /* the relay of the first rank the watermark did
                            not cover (-1: none known) */
    uint32_t stalled_rank;
    int64_t stalled_seq;
    kvo_buf idx_metrics; /* its /metrics text, read with the waited query */
    bool have_idx_metrics;
    check_counters prev, cur, moved;
    chk_watermark wm;
    chk_pool *pool;
    struct rtask *tasks;  /* cap_tasks of them */
    chk_task **task_ptrs; /* as many: what chk_pool_run takes */
    size_t cap_tasks;
    bool tasks_overflow; /* a batch outgrew cap_tasks (cannot happen) */
    size_t swept_to;     /* requests the last checkpoint's sweep covered */
    size_t next_fault;   /* res->faults[next_fault] is the next to inject */
    size_t json_to;      /* load: prompts whose JSON line is written */
    struct mock_hasher *hasher; /* engine hashes, to name a difference's
                                   prompt (made when first needed) */
    /* The evidence for the prompt about to be judged (check_diag.c), read
     * before its request ran: about slot diag_slot, block diag_block (-1:
     * no divergence showed); diag_why says why none could be read. */
    int64_t diag_slot, diag_block;
    check_diag diag;
    char diag_why[sizeof(((kvo_err *)0)->msg)];
    kvo_arena diag_arena; /* the pre-judgement's scratch */
    kvo_err err;
} chk_run;

double chk_secs(uint64_t t0);
/* The engines' --speedup: cfg's, or the mode's default (lockstep 0: as
 * fast as they go; load 1: real time). */
static inline double chk_speedup(const check_cfg *c) {
    return c->speedup >= 0 ? c->speedup : c->load ? 1.0 : 0.0;
}
/* Load mode's bound on requests in flight: cfg's, or 8 per worker. */
static inline uint32_t chk_concurrency(const check_cfg *c, uint32_t workers) {
    return c->concurrency ? c->concurrency : 8 * workers;
}
/* The prompt of q into pb: router and sequence hashes, JSON. Not
 * thread-safe (the memo is shared). */
kvo_status chk_run_prompt(chk_run *r, const check_request *q, chk_pbuf *pb);
/* Exact sync (or settle) before prompt `before` (-1 = the end): KVO_OK;
 * KVO_ETIMEDOUT (run error recorded); KVO_EINTR; other: r->err. */
kvo_status chk_run_sync(chk_run *r, int64_t before);
/* Every relay's and the indexer's counters now (all: also the relays not
 * marked dirty), trips recorded before `before`. */
kvo_status chk_run_counters(chk_run *r, int64_t before, bool all);
/* Re-check the last `want` distinct prompts of requests [from, to) on
 * every slot (probes and the index, synced), as sweep entries of
 * checkpoint c (its sweep counts and time filled in). */
kvo_status chk_run_sweep(chk_run *r, size_t from, size_t to, size_t want,
                         check_checkpoint *c);
/* Judge (or, unjudged, record) o into the result; lockstep writes its JSON
 * line at once. *out: the prompt, until the next add. */
kvo_status chk_run_record(chk_run *r, const check_obs *o,
                          const check_prompt **out);
/* Load: sort the prompts recorded since the last call into trace order
 * and write their JSON lines. */
kvo_status chk_run_flush(chk_run *r);
/* The answer to q, sent to rank `rank`, is the engine's to that prompt:
 * its prompt-token count, its rank, and a cached-token count (needed
 * unless probed). Otherwise a run error is recorded and false returned. */
bool chk_run_answer_ok(chk_run *r, const check_request *q, uint32_t rank,
                       const chk_completion *c, bool probed);
/* The sequence hashes the router holds for a request (the dynamo policy's
 * in-flight blocks; none for the others). */
/* The prompt of pb as the engine calls take it (points into pb). */
chk_prompt chk_pbuf_prompt(const chk_run *r, const chk_pbuf *pb);
const uint64_t *chk_run_held(const chk_run *r, const chk_pbuf *pb, size_t *nb);

/* A full-state checkpoint after `sent` requests (the engines idle: every
 * request answered); final: the one at the end. Records it in r->res;
 * *stop when the run must end (a run error, or a failure with
 * --fail-fast). KVO_OK otherwise; another status: r->err. */
kvo_status chk_checkpoint(chk_run *r, size_t sent, bool final, double drain_s,
                          bool *stop);

/* A checkpoint's block sets (its step 3): every (worker, rank)'s, GPU and
 * (a rank with one) CPU tier, engine against index, into c (sets, diff,
 * cpu, listed_blocks) and ss[n_slots] (the GPU tier's per slot); the
 * engines' /kvo/state must have been read. The first differences are
 * named with a prompt of requests [0, sent). A service that cannot say is
 * a note in c; another status than KVO_OK: r->err. */
kvo_status chk_compare_sets(chk_run *r, size_t sent, check_checkpoint *c,
                            check_slot_sets *ss);

/* Load mode (check_load.c): the trace through the pipeline with many
 * requests in flight, a checkpoint every cfg->checkpoint_every requests
 * (not the final one). *sent: requests answered; *stop: a run error or a
 * failed checkpoint ended it early. */
kvo_status chk_load_run(chk_run *r, size_t *sent, bool *stop);

#endif /* KVO_CHECK_INT_H */
