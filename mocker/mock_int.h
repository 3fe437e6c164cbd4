/* mock_int.h -- internals shared by the mocker's files (not public).
 *
 * One rank = one mock_engine (mock_engine.c draws how its parts depend on
 * each other):
 *
 *   mock_engine
 *     sched     mock_sched: the requests and the pool
 *       pool      mock_pool: blocks[0..N) (block 0 = vLLM's null block,
 *                 never free), the free queue (doubly linked through
 *                 blocks, head = next to evict) and the cached map key ->
 *                 copies (doubly linked through blocks in insertion order;
 *                 lookups return the oldest copy, as vLLM's
 *                 BlockHashToBlockMap).
 *       running   requests in admission order (preemption pops the last)
 *       waiting   deque (preempted requests go back to the front)
 *     ev        step_events: the step's events being built (wire_event +
 *               aux arrays)
 *
 * Invariants: a block is in the free queue iff ref == 0 (and it is not the
 * null block); a block is in the cached map iff cached; every block of a
 * running request has ref >= 1.
 */
#ifndef MOCK_INT_H
#define MOCK_INT_H

#include "mock.h"

#define MOCK_NIL UINT32_MAX

/* ---- Block pool (mock_pool.c) --------------------------------------------*/

/* Hot fields only (32 bytes): the digests live in cold arrays. */
typedef struct pool_block {
    uint64_t key;          /* hash key when cached */
    uint32_t ref;
    uint32_t prev, next;   /* free queue links; MOCK_NIL at the ends */
    uint32_t cprev, cnext; /* copies of the same hash, oldest first */
    bool cached;
    bool in_free;
} pool_block;

typedef struct pool_slot {
    uint64_t key;
    uint32_t head, tail; /* head == MOCK_NIL: empty slot */
} pool_slot;

/* A cached block is being evicted: its hash and its parent's (d.len 0 =
 * root), valid during the call only. */
typedef void (*pool_evict_fn)(void *ctx, const mock_hash *hash,
                              const mock_hash *parent);

typedef struct mock_pool {
    uint32_t n;          /* num_gpu_blocks */
    pool_block *blocks;
    mock_hash *hash;     /* per block, when cached */
    mock_hash *parent;   /* per block: parent's hash (d.len 0 = root) */
    uint32_t head, tail; /* free queue */
    uint32_t n_free;
    bool caching;
    pool_slot *map;
    uint32_t map_mask;
    uint32_t n_cached;   /* blocks holding a hash */
    uint64_t evicted;    /* cached blocks popped for reuse, ever */
    pool_evict_fn on_evict;
    void *evict_ctx;
} mock_pool;

kvo_status pool_init(mock_pool *p, uint32_t n, bool caching);
void pool_fini(mock_pool *p);
/* Oldest cached copy of key, or MOCK_NIL. */
uint32_t pool_lookup(const mock_pool *p, uint64_t key);
/* ref + 1; leaves the free queue when ref was 0. */
void pool_touch(mock_pool *p, const uint32_t *ids, uint32_t n);
/* Pop n blocks from the free-queue head (caller checked n <= n_free);
 * cached ones are evicted first (on_evict per block, in pop order). */
void pool_alloc(mock_pool *p, uint32_t n, uint32_t *out);
/* Mark a full block cached under h (appended to its copies). */
void pool_cache(mock_pool *p, uint32_t id, const mock_hash *h,
                const mock_hash *parent);
/* ref - 1 for each, in order; blocks reaching 0 join the queue tail in
 * that order (so the first given is evicted first). */
void pool_release(mock_pool *p, const uint32_t *ids, uint32_t n);
/* vLLM reset_prefix_cache: false unless every block but the null block is
 * free; drops every hash. */
bool pool_reset(mock_pool *p);
double pool_usage(const mock_pool *p);

/* ---- Requests (mock_req.c) -----------------------------------------------*/

typedef enum req_status {
    REQ_WAITING = 0,
    REQ_RUNNING,
    REQ_PREEMPTED,
    REQ_FINISHED
} req_status;

typedef struct mock_req {
    uint64_t id;
    req_status status;
    uint64_t *tokens;        /* prompt then generated */
    uint32_t n_tokens, cap_tokens, n_prompt;
    uint32_t max_tokens;
    uint32_t num_computed;
    int64_t num_cached_tokens; /* -1 until first scheduled */
    mock_hash *bh;           /* hashes of full token blocks (vLLM's
                                request.block_hashes) */
    uint32_t n_bh, cap_bh;
    uint32_t *blocks;        /* req_to_blocks */
    uint32_t n_blocks, cap_blocks;
    uint32_t num_cached_block;
    uint32_t n_hit_ids;      /* waiting: blocks[0..n) = last prefix hit */
    bool materialized;       /* tokens and bh filled (req_materialize) */
    uint64_t *trace_ids;     /* trace prompt: hash ids until materialized */
    uint32_t n_trace;
    char *lora;
    char *salt;
    int64_t lora_id;         /* set by the engine (its LoRA table) */
    bool remote_prefill;
    uint32_t num_preemptions;
    uint64_t rng;
    uint32_t sched_tokens;   /* tokens scheduled in the current step */
    bool sched_decode;       /* the current step is a decode for it */
    bool started;
    bool aborted;            /* abort requested during an open step */
    mock_output_fn on_output;
    void *user;
} mock_req;

typedef struct req_vec {
    mock_req **v;
    uint32_t n;
    size_t cap;
} req_vec;

/* Waiting deque: ring buffer. */
typedef struct req_deque {
    mock_req **v;
    uint32_t head, n, cap;
} req_deque;

/* A WAITING request for in (prompt copied), capped at max_tokens, with id
 * and its token rng seeded from (seed, rank, id); freed with req_free. The
 * caller has validated in. */
kvo_status req_new(mock_req **out, const mock_req_in *in, uint32_t max_tokens,
                   uint32_t block_size, uint64_t id, uint64_t seed,
                   uint32_t rank);
void req_free(mock_req *r);
/* Fill the prompt tokens (trace form) and the prompt's block hashes, once. */
kvo_status req_materialize(mock_req *r, const mock_cfg *cfg, mock_hasher *h);
/* Append a generated token; hash the block it completes. */
kvo_status req_append_token(mock_req *r, const mock_cfg *cfg, mock_hasher *h,
                            uint64_t tok);
uint64_t req_sample_token(mock_req *r);
/* FINISH_ABORTED to the request's callback, then free it. */
void req_abort_deliver(mock_req *r);

kvo_status req_vec_push(req_vec *v, mock_req *r);
kvo_status req_deque_push(req_deque *d, mock_req *r, bool front);
/* The i-th request from the front (i < n). */
mock_req *req_deque_at(const req_deque *d, uint32_t i);
mock_req *req_deque_pop_front(req_deque *d);
/* Remove the i-th request from the front, keeping the order. */
void req_deque_remove(req_deque *d, uint32_t i);

/* ---- The step's events (mock_events.c) -----------------------------------*/

typedef struct ev_builder {
    wire_event *ev;
    mock_hash *removed_parent;
    bool *decode_store;
    mock_hash **stored;
    mock_hash *parent;
    mock_hash **removed;
    mock_hash *removed_hash;  /* per event: a BlockRemoved's one hash */
    wire_hash *removed_wire;  /* per event: its int form */
    uint32_t n, cap;
    kvo_arena arena;
    wire_batch batch;   /* points at ev; its own arena unused */
    mock_step_aux aux;
} ev_builder;

typedef struct step_events {
    bool enabled;      /* publish KV events (caching on, not decode role) */
    ev_builder ev;     /* the step's batch: cleared, removals, then */
    ev_builder stores; /* the stores, appended when the step ends */
    kvo_buf extra_buf; /* msgpack scratch for extra_keys */
} step_events;

void events_init(step_events *s, bool enabled);
void events_fini(step_events *s);
/* Start a step's batch (empty). */
void events_begin(step_events *s);
kvo_status events_cleared(step_events *s);
/* pool_evict_fn (ctx = the step_events): one BlockRemoved. */
void events_on_evict(void *ctx, const mock_hash *hash, const mock_hash *parent);
/* One BlockStored: request r's blocks [first, first + n), pointing into r. */
kvo_status events_stored(step_events *s, const mock_req *r, uint32_t first,
                         uint32_t n, uint32_t block_size, bool decode);
/* Close the batch: *batch NULL when it holds no event; both valid until the
 * next events_begin. */
kvo_status events_finish(step_events *s, double ts, uint32_t rank,
                         const wire_batch **batch, const mock_step_aux **aux);

/* ---- The scheduler (mock_sched.c) ----------------------------------------*/

typedef struct mock_sched {
    const mock_cfg *cfg;    /* the engine's copy */
    uint32_t max_model_len;
    mock_hasher *hasher;    /* shared, not owned */
    step_events *ev;        /* where stores (and, via the pool, removals)
                               go; the engine's */
    mock_engine_stats *st;  /* the engine's counters this code keeps */
    mock_pool pool;
    req_vec running;
    req_deque waiting;
    req_vec scheduled;      /* this step, in schedule order */
    void **started;         /* users first scheduled this step */
    uint32_t n_started;
    size_t cap_started;
    bool step_open;         /* schedule done, complete pending */
} mock_sched;

kvo_status sched_init(mock_sched *s, const mock_cfg *cfg, uint32_t max_model_len,
                      mock_hasher *hasher, step_events *ev,
                      mock_engine_stats *st);
/* Frees every queued request (no callbacks) and the pool. */
void sched_fini(mock_sched *s);
/* Queue r (WAITING, at the back); the scheduler owns it on KVO_OK. */
kvo_status sched_add(mock_sched *s, mock_req *r);
bool sched_has_work(const mock_sched *s);
const mock_req *sched_find_running(const mock_sched *s, uint64_t req_id);
kvo_status sched_step(mock_sched *s, mock_step *out);
void sched_complete(mock_sched *s);
/* Drop a request wherever it is (deferred to complete() inside an open
 * step); KVO_ENOTFOUND when unknown. */
kvo_status sched_abort(mock_sched *s, uint64_t req_id);

/* ---- The engine (mock_engine.c) ------------------------------------------*/

struct mock_engine {
    mock_cfg cfg;
    uint32_t rank;
    uint32_t max_model_len;
    mock_hasher *hasher;
    mock_sched sched;
    step_events ev;
    bool pending_clear;    /* AllBlocksCleared queued */
    uint64_t next_id;
    char **loras;          /* lora name -> id (index + 1) */
    uint32_t n_loras;
    mock_engine_stats st;
};

/* ---- The process: ranks with their publishers (mock_node.c) -------------*/

typedef struct node_rank {
    mock_engine *eng;
    mock_render *render;
    mock_pub *pub;          /* always set; socketless without a source */
    bool source;            /* PUB bound: advertised in event_sources */
    bool in_step;           /* scheduled, complete() pending (real time) */
    double step_end;        /* model ms when the open step ends */
    uint64_t render_errors;
} node_rank;

typedef struct mock_node {
    const mock_cfg *cfg;
    mock_hasher *hasher;
    void *zctx;
    wire_cap_writer *rec;
    node_rank *ranks;
    uint32_t n_ranks;
} mock_node;

/* Hasher, capture file, ZMQ context (when sockets), ranks. A publisher
 * that cannot bind is logged and the rank serves without a source, unless
 * cfg->require_events (then KVO_ENET). */
kvo_status node_init(mock_node *n, const mock_cfg *cfg, bool sockets);
void node_fini(mock_node *n);
/* Schedule one step of rank r at batch time ts and publish its events. */
kvo_status node_step_begin(mock_node *n, uint32_t r, double ts, mock_step *st);
void node_step_end(mock_node *n, uint32_t r);
/* Serve rank r's pending replay requests; malformed requests and replies
 * cut short (counted by the publisher) get a rate-limited log line. */
void node_replay_serve(mock_node *n, uint32_t r);
/* Host written in advertised endpoints. */
const char *node_advertise_host(const mock_node *n);

#endif /* MOCK_INT_H */
