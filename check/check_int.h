/* check_int.h -- what the driver (check_run.c), the process set-up
 * (check_spawn.c) and the HTTP calls (check_http.c) share.
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
 */
#ifndef KVO_CHECK_INT_H
#define KVO_CHECK_INT_H

#include "kvo_check.h"
#include "kvo_http.h"
#include "kvo_proc.h"

#define CHK_MAX_DP 16
#define CHK_MAX_ENGINES 256

typedef struct chk_rank {
    uint32_t dp_rank;
    uint32_t slot;          /* UINT32_MAX: publishes nothing */
    int64_t last_seq;       /* last ZMQ seq the engine published, -1 none */
    int relay;              /* index into env->relays, -1 none */
    char zmq[160];          /* from /kvo/event_sources */
    char replay[160];       /* "" = none */
    char topic[128];
} chk_rank;

typedef struct chk_engine {
    char url[192];          /* http://127.0.0.1:PORT (no trailing slash) */
    char name[32];          /* "kvo-mocker[1]" */
    uint32_t worker_id;
    bool mocker;            /* answers /kvo/state and /kvo/probe */
    bool decode;            /* disaggregated decode worker: no events */
    bool dirty;             /* got a request since /kvo/state was read */
    uint32_t n_ranks;
    chk_rank ranks[CHK_MAX_DP];
    kvo_http_client *http;  /* state, sources, completions */
    kvo_http_client *probe_http; /* probes (they overlap the sync) */
    kvo_proc proc;          /* pid 0 when not spawned by us */
} chk_engine;

typedef struct chk_relay {
    kvo_proc proc;
    uint32_t engine, dp_rank;
    uint64_t publisher_id;
    uint16_t metrics_port;
    char stage[64];         /* counters stage: "relay 0.1" ("... #1" once
                               retired) */
    bool retired;           /* killed and replaced */
    bool dirty;             /* its counters may have moved */
    kvo_http_client *http;
} chk_relay;

typedef struct chk_proxy chk_proxy; /* --drop-seq: a ZMQ forwarder */

typedef struct chk_env {
    const check_cfg *cfg;
    const check_trace *trace; /* the run's requests (replay buffer size) */
    char log_dir[512];
    bool own_log_dir;       /* created by us (removed on PASS) */
    char bin_dir[512];

    kvo_proc nats;
    char nats_url[160];
    kvo_proc indexer;
    char indexer_url[192];
    kvo_http_client *idx_http;     /* watermark, query */
    kvo_http_client *idx_metrics;  /* /metrics (overlaps the query) */

    chk_engine *engines;    /* publishing ones first, then decode ones */
    uint32_t n_engines;
    uint32_t n_workers;     /* publishing engines */
    uint32_t n_decode;
    uint32_t dp_size;
    uint32_t block_size;
    char model[128];        /* "model" of completions */
    bool exact;             /* exact watermarks (kvo-mocker + our relays) */

    chk_relay *relays;
    uint32_t n_relays;
    size_t cap_relays;
    uint64_t publisher_base;
    uint32_t publishers_made;

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

/* Start (or attach to) everything cfg asks for; err gets a one-line reason.
 * trace (may be NULL) sizes the engines' replay buffers. On failure
 * everything already started is stopped again. */
kvo_status chk_env_start(chk_env *env, const check_cfg *cfg,
                         const check_trace *trace, char *err, size_t errsz);
/* Stop everything we started (reverse order). keep_logs: leave the log
 * directory and print where it is; else remove it when we created it. */
void chk_env_stop(chk_env *env, bool keep_logs);
/* SIGKILL the relay of (engine, rank) and start a fresh one (new publisher
 * id, --replay-from 0). Its last counters move to stage "<stage> #n". */
kvo_status chk_relay_restart(chk_env *env, uint32_t engine, uint32_t rank,
                             check_counters *counters, char *err,
                             size_t errsz);
/* CPU seconds (user + system) of every process we started, and of
 * kvo-check itself, into stage "cpu" ("kvo-mocker[0]" = 1.23). */
kvo_status chk_env_cpu(chk_env *env, check_counters *c);
/* Print the tail of every spawned process's log to stderr. */
void chk_env_dump_logs(const chk_env *env, int lines);
/* A process that died: its name and exit status into why; false if all
 * live. */
bool chk_env_dead(chk_env *env, char *why, size_t whysz);

/* ---- check_http.c ----------------------------------------------------------*/

/* GET /kvo/state of e: last_seq per rank (and rank count on first call). */
kvo_status chk_engine_state(chk_engine *e, char *err, size_t errsz);
/* GET /kvo/event_sources into e's ranks (zmq, replay, topic); n_ranks is
 * set from it; 0 sources = an engine that publishes nothing. */
kvo_status chk_engine_sources(chk_engine *e, char *err, size_t errsz);
/* One prompt, serialized once for every call that carries it: the trace
 * object {"hash_ids": [...], "input_length": n} (kvo-mocker's extension) or
 * the token-id array [t0, t1, ...]. */
typedef struct chk_prompt {
    bool trace_form;
    const char *json;        /* the object or the array */
    size_t len;
} chk_prompt;
/* POST /kvo/probe: hits[rank] for every rank of e. warm (trace form): the
 * prompt goes to e next -- kvo-mocker hashes it ahead, after answering. */
kvo_status chk_engine_probe(chk_engine *e, const chk_prompt *p,
                            uint32_t block_size, bool warm, int32_t *hits,
                            char *err, size_t errsz);
typedef struct chk_completion {
    int64_t cached_tokens;   /* -1: not reported */
    int64_t prompt_tokens;   /* -1: not reported */
    int64_t dp_rank;         /* kvo.dp_rank, -1 */
    int64_t last_seq;        /* kvo.last_seq, -1 (null: nothing published) */
    bool kvo;                /* kvo-mocker's "kvo" object with its dp_rank */
    char *kv_transfer_params; /* JSON text (prefill role) or NULL; owned */
} chk_completion;
/* POST /v1/completions; dp_rank < 0: let the engine pick. kv_params: JSON
 * text to pass as kv_transfer_params (decode step) or NULL. */
kvo_status chk_engine_complete(chk_engine *e, const char *model,
                               const chk_prompt *p, uint32_t max_tokens,
                               int dp_rank, const char *kv_params,
                               chk_completion *out, char *err, size_t errsz);
/* GET /kvo/state: every rank's counters, resident and free blocks into
 * stage "engine <worker>.<rank>". */
kvo_status chk_engine_counters(chk_engine *e, check_counters *c, char *err,
                               size_t errsz);
/* GET /v1/models: the first model id. */
kvo_status chk_engine_model(chk_engine *e, char *model, size_t modelsz,
                            char *err, size_t errsz);

/* Indexer: scores per slot for the prompt's router hashes. */
kvo_status chk_index_query(chk_env *env, const uint64_t *hashes, size_t n,
                           uint32_t *scores, char *err, size_t errsz);
/* Indexer GET /watermark: zmq_seq_last of publisher (-1 null or absent). */
typedef struct chk_watermark {
    size_t n;
    uint64_t *publisher;
    int64_t *zmq_last;
    kvo_buf raw;             /* the body (settle mode compares it) */
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
                                chk_watermark *wm, bool *covered,
                                kvo_buf *metrics, char *err, size_t errsz);
void chk_watermark_fini(chk_watermark *w);
kvo_status chk_index_watermark(chk_env *env, chk_watermark *w, char *err,
                               size_t errsz);
int64_t chk_watermark_get(const chk_watermark *w, uint64_t publisher,
                          bool *present);
/* Counters: fetch a /metrics body (any thread), then parse it into a
 * stage (the caller's thread). */
kvo_status chk_metrics_fetch(kvo_http_client *c, const char *url,
                             kvo_http_resp *resp, char *err, size_t errsz);
kvo_status chk_counters_relay(chk_relay *r, check_counters *c, char *err,
                              size_t errsz);
/* Append "[n,n,...]" of u64s to b, fast (hash lists are long). */
kvo_status chk_json_u64s(kvo_buf *b, const uint64_t *v, size_t n);
/* Relay GET /stats: are all its sources live (initial replay done)? */
kvo_status chk_relay_live(chk_relay *r, bool *live);

#endif /* KVO_CHECK_INT_H */
