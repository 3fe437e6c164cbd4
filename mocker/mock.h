/* mock.h -- kvo-mocker: a mock vLLM engine (DESIGN §8) and its interfaces.
 *
 *   mock_engine   one data-parallel rank: vLLM v1's BlockPool (physical
 *                 blocks, free queue in eviction order, hash -> copies map)
 *                 and Scheduler (running first, then waiting; token budget;
 *                 chunked prefill; recompute preemption). Pure: no sockets,
 *                 no clocks, no logging. A step is two calls:
 *                   mock_engine_schedule()  allocate, evict, cache, build the
 *                                           step's KV events (vLLM publishes
 *                                           here), model the step's duration
 *                   mock_engine_complete()  sample one token per request whose
 *                                           prompt is computed, finish and
 *                                           free (tail first)
 *   mock_hasher   engine block hashes (wire_engine_*) with a memo for trace
 *                 prompts; shared by the ranks of one process.
 *   mock_render   clean engine batch -> the batch(es) as published: hash form
 *                 (low-64 int or raw digest) and the --mutate catalog.
 *   mock_pub      one rank's ZMQ PUB + ROUTER replay ring (+ capture file).
 *   mock_trace    Mooncake JSONL reader and prompt synthesis (kvo-check
 *                 uses it to build the same prompts).
 *   mock_run_*    the two modes of kvo-mocker: HTTP server, trace replay.
 *
 * Ownership: objects are X_new/X_free; pointers returned by accessors stay
 * valid until the next call that mutates the object unless said otherwise.
 */
#ifndef MOCK_H
#define MOCK_H

#include "kvo.h"
#include "wire.h"

/* ======================================================================== */
/* Configuration                                                             */
/* ======================================================================== */

typedef enum mock_role {
    MOCK_ROLE_AGGREGATED = 0, /* prefill + decode, publishes events */
    MOCK_ROLE_PREFILL,        /* max_tokens capped at 1, kv_transfer_params */
    MOCK_ROLE_DECODE          /* publishes no KV events; KV-transfer latency */
} mock_role;

kvo_status mock_role_parse(const char *s, mock_role *out);
const char *mock_role_name(mock_role r);

/* Mutations (DESIGN §9). Bit i = mock_mutations()[i]. */
enum {
    MOCK_MUT_FLIP_STORED_HASH = 1u << 0,
    MOCK_MUT_DROP_REMOVED = 1u << 1,
    MOCK_MUT_TOKEN_PLUS_ONE = 1u << 2,
    MOCK_MUT_WRONG_PARENT = 1u << 3,
    MOCK_MUT_DROP_DP_RANK = 1u << 4,
    MOCK_MUT_DROP_STORE = 1u << 5,
    MOCK_MUT_BLOCK_SIZE_OFF = 1u << 6,
    MOCK_MUT_TRUNCATE_TOKENS = 1u << 7,
    MOCK_MUT_SWAP_REMOVED_HASH = 1u << 8,
    MOCK_MUT_SKIP_DECODE_STORES = 1u << 9,
    MOCK_MUT_INT_HASH_FIRST8 = 1u << 10,
    MOCK_MUT_DUP_STORE = 1u << 11,
    MOCK_MUT_REORDER_KEYS = 1u << 12,
    MOCK_MUT_LEGACY_ARRAY = 1u << 13,
    MOCK_MUT_BYTES_HASH = 1u << 14,
    MOCK_MUT_SPLIT_BATCHES = 1u << 15,
    MOCK_MUT_MERGE_REMOVES = 1u << 16,
    MOCK_MUT_COUNT = 17
};

typedef struct mock_mutation_info {
    const char *name;   /* "flip-stored-hash" */
    unsigned bit;
    bool killed;        /* expected outcome: the check must fail */
    const char *what;   /* one line for --help and the README */
} mock_mutation_info;

/* The catalog, MOCK_MUT_COUNT entries in bit order. */
const mock_mutation_info *mock_mutations(void);
/* "a,b" -> mask; KVO_EINVAL naming the bad one in bad (may be NULL). */
kvo_status mock_mutate_parse(const char *list, unsigned *mask, char *bad,
                             size_t badsz);

typedef struct mock_cfg {
    /* engine (per rank) */
    uint32_t block_size;             /* 16 */
    uint32_t num_gpu_blocks;         /* 16384, incl. vLLM's null block 0 */
    uint32_t max_num_seqs;           /* 256 */
    uint32_t max_num_batched_tokens; /* 8192 */
    uint32_t max_model_len;          /* 0 = (num_gpu_blocks - 1) * block_size */
    bool prefix_caching;             /* true; false = no cache, no events */
    mock_role role;
    double kv_transfer_ms_per_block; /* decode role: per received block */
    wire_algo hash_algo;             /* sha256 */
    const char *hash_seed;           /* "0" (PYTHONHASHSEED) */
    uint64_t seed;                   /* generated tokens */
    uint32_t hash_memo_log2;         /* trace-prompt memo: 2^n rows (14); 0 off */
    /* events */
    bool hash_bytes;                 /* publish raw digests */
    wire_format event_format;        /* map */
    unsigned mutations;              /* MOCK_MUT_* */
    /* process */
    uint32_t dp_size;                /* 1 */
    double speedup;                  /* 0 = virtual time */
    const char *model;               /* "kvo-mock" (served model name) */
    const char *host;                /* HTTP bind, 127.0.0.1 */
    uint16_t port;                   /* 8000; 0 = pick */
    const char *zmq_host;            /* 127.0.0.1 */
    uint16_t zmq_port;               /* 5557 (+ rank); 0 = pick */
    const char *zmq_endpoint;        /* overrides zmq_host:zmq_port (rank 0;
                                        ranks > 0 need a tcp port to add to) */
    uint16_t replay_port;            /* 5558 (+ rank); 0 = pick */
    bool replay;                     /* false = --no-replay */
    const char *advertise_host;      /* host in advertised endpoints */
    const char *topic;               /* "" (vLLM's default) */
    uint32_t replay_buffer;          /* 10000 batches */
    uint64_t replay_buffer_bytes;    /* cap on buffered payload bytes; 0 none */
    int zmq_hwm;                     /* 100000 (vLLM's publisher default) */
    bool require_events;             /* publisher failure is fatal */
    const char *record;              /* capture file or NULL */
    const char *trace;               /* trace mode when set */
    bool progress;                   /* progress bar (trace mode, on a tty) */
    bool summary_json;               /* trace summary as one JSON line */
} mock_cfg;

void mock_cfg_default(mock_cfg *c);
/* Effective max_model_len. */
uint32_t mock_cfg_max_model_len(const mock_cfg *c);

/* ======================================================================== */
/* Engine hashes                                                             */
/* ======================================================================== */

/* A block hash: the full digest and the low 64 bits (the int form). */
typedef struct mock_hash {
    uint64_t key; /* wire_digest_low64 */
    wire_digest d;
} mock_hash;

/* Which trace blocks a prompt came from, so the hasher can use its memo:
 * the engine hash of a block lying inside one 512-token trace block depends
 * only on (trace hash id, offset in the trace block, parent hash) when the
 * request has no LoRA and no salt -- the tokens are mock_trace_token(id, j).
 * Never given for arbitrary token prompts. */
typedef struct mock_trace_ref {
    const uint64_t *hash_ids;
    uint32_t n_hash_ids;
} mock_trace_ref;

typedef struct mock_hasher mock_hasher;

kvo_status mock_hasher_new(mock_hasher **out, wire_algo algo,
                           const char *seed, uint32_t memo_log2);
void mock_hasher_free(mock_hasher *h);
/* Hash full blocks [first, first + n) of a token sequence, chaining from
 * parent (NULL = root; must be block first - 1's hash). lora/salt may be
 * NULL; trace may be NULL. */
kvo_status mock_hasher_blocks(mock_hasher *h, const uint64_t *tokens,
                              uint32_t block_size, uint32_t first, uint32_t n,
                              const mock_hash *parent, const char *lora,
                              const char *salt, const mock_trace_ref *trace,
                              mock_hash *out);

/* Hash block blk alone, for walks that stop at the first miss (the
 * probe): prev = the hashes of blocks 0..blk-1 (the parent is prev[blk-1];
 * the memo also needs the hash before the block's trace row), tokens = that
 * block's block_size tokens. Uses and extends the trace memo like
 * mock_hasher_blocks, so a probe leaves it warm for the completion. */
kvo_status mock_hasher_block_next(mock_hasher *h, const uint64_t *tokens,
                                  uint32_t block_size, uint32_t blk,
                                  const mock_hash *prev, const char *lora,
                                  const char *salt, const mock_trace_ref *trace,
                                  mock_hash *out);

typedef struct mock_hasher_stats {
    uint64_t computed;    /* digests computed */
    uint64_t memo_hits;   /* digests served by the memo */
    uint64_t ns;          /* time spent computing digests */
} mock_hasher_stats;
void mock_hasher_stats_get(const mock_hasher *h, mock_hasher_stats *out);

/* ======================================================================== */
/* Engine (one rank)                                                         */
/* ======================================================================== */

typedef struct mock_engine mock_engine;

typedef enum mock_finish {
    MOCK_FINISH_NONE = 0,
    MOCK_FINISH_LENGTH,  /* max_tokens reached ("length") */
    MOCK_FINISH_ABORTED  /* mock_engine_abort / shutdown */
} mock_finish;

/* Delivered by mock_engine_complete (and abort) for each request that
 * produced a token or ended. */
typedef struct mock_output {
    uint64_t req_id;
    uint64_t token;          /* the new token (valid when has_token) */
    bool has_token;
    uint32_t n_output;       /* tokens generated so far */
    mock_finish finish;      /* != NONE: last callback for this request */
    uint32_t cached_tokens;  /* vLLM's num_cached_tokens (first schedule) */
    uint32_t n_prompt;
    const uint32_t *block_ids; /* the request's blocks (n_blocks), valid in
                                  the callback only (kv_transfer_params) */
    uint32_t n_blocks;
} mock_output;

typedef void (*mock_output_fn)(void *user, const mock_output *o);

typedef struct mock_req_in {
    const uint64_t *tokens;  /* prompt (copied); NULL: the trace prompt of
                                trace.hash_ids cut to n_tokens */
    uint32_t n_tokens;
    uint32_t max_tokens;     /* >= 1 (the prefill role caps it at 1) */
    const char *lora_name;   /* NULL = none */
    const char *cache_salt;  /* NULL = none */
    mock_trace_ref trace;    /* the prompt's trace hash ids (enables the
                                hash memo), or {NULL, 0} */
    bool remote_prefill;     /* decode role: the prompt's KV is received */
    mock_output_fn on_output;
    void *user;
} mock_req_in;

/* The step's events as the engine produced them (ground truth, before any
 * mutation), with what mutations need to know per event. */
typedef struct mock_step_aux {
    mock_hash *removed_parent; /* per event: BlockRemoved's block's parent
                                  (key 0, d.len 0 = root) */
    bool *decode_store;        /* per event: BlockStored made at decode */
    mock_hash **stored;        /* per event: BlockStored's full hashes */
    mock_hash *parent;         /* per event: BlockStored's parent (len 0) */
    mock_hash **removed;       /* per event: BlockRemoved's full hashes */
} mock_step_aux;

typedef struct mock_step {
    bool idle;                 /* nothing was scheduled */
    double duration_ms;        /* modeled, before --speedup */
    uint32_t n_scheduled;      /* requests in the step */
    uint32_t prefill_tokens;   /* new prompt tokens computed */
    uint32_t decode_reqs;      /* requests decoding one token */
    uint32_t preempted;        /* requests preempted in this step */
    /* Events (NULL when none); hashes are rendered as low-64 ints and
     * dp rank set. Valid until mock_engine_complete (stored tokens and
     * hashes point into the requests). */
    const wire_batch *batch;
    const mock_step_aux *aux;
    /* user pointers of requests scheduled for the first time */
    void *const *started;
    uint32_t n_started;
} mock_step;

typedef struct mock_engine_stats {
    uint64_t requests_added, requests_finished, requests_aborted;
    uint64_t requests_running, requests_waiting;
    uint64_t steps, preemptions;
    uint64_t prompt_tokens, generated_tokens, computed_tokens;
    uint64_t prefix_queries, prefix_hits; /* tokens, as vLLM's counters */
    uint64_t batches, events, blocks_stored, blocks_removed, cleared;
    uint64_t resident_blocks; /* blocks holding a hash (cached) */
    uint64_t free_blocks;     /* in the free queue (cached or not) */
    uint64_t used_blocks;     /* ref > 0 */
    double usage;             /* vLLM's kv_cache_usage (0..1) */
} mock_engine_stats;

/* hasher is shared, not owned (must outlive the engine). */
kvo_status mock_engine_new(mock_engine **out, const mock_cfg *cfg,
                           uint32_t dp_rank, mock_hasher *hasher);
void mock_engine_free(mock_engine *e);
uint32_t mock_engine_rank(const mock_engine *e);

/* Queue a request (WAITING). KVO_EINVAL: empty prompt, max_tokens 0, or no
 * tokens and no valid trace; KVO_ETOOBIG: prompt + max_tokens >
 * max_model_len. Tokens and hashes are computed when the request first
 * competes for admission. */
kvo_status mock_engine_add(mock_engine *e, const mock_req_in *in,
                           uint64_t *req_id);
/* Drop a request wherever it is (its callback gets FINISH_ABORTED). */
kvo_status mock_engine_abort(mock_engine *e, uint64_t req_id);
bool mock_engine_has_work(const mock_engine *e);

kvo_status mock_engine_schedule(mock_engine *e, double ts, mock_step *out);
/* Finish the scheduled step: sample, deliver outputs, free finished. */
void mock_engine_complete(mock_engine *e);

/* Leading cached blocks of a prompt, capped at (n-1)//block_size; no side
 * effects. hashes: the prompt's full-block hashes (n_tokens/block_size). */
uint32_t mock_engine_probe(const mock_engine *e, const mock_hash *hashes,
                           uint32_t n_tokens);
/* Is a block with this hash cached (prefix caching on)? No side effects. */
bool mock_engine_cached(const mock_engine *e, uint64_t key);
/* vLLM's reset_prefix_cache: true (and AllBlocksCleared queued for the next
 * step) only when no block is in use. */
bool mock_engine_reset_prefix_cache(mock_engine *e);
/* Queued events that the next schedule will publish even if idle. */
bool mock_engine_has_events(const mock_engine *e);

void mock_engine_stats_get(const mock_engine *e, mock_engine_stats *out);

/* Inspection (tests, /kvo/state). */
typedef struct mock_block_info {
    uint32_t ref;
    bool cached;      /* holds a hash */
    bool in_free_queue;
    mock_hash hash;   /* when cached */
} mock_block_info;
kvo_status mock_engine_block(const mock_engine *e, uint32_t block_id,
                             mock_block_info *out);
/* Free queue from head (evicted first); returns the count written. */
uint32_t mock_engine_free_queue(const mock_engine *e, uint32_t *ids,
                                uint32_t max);
/* Physical copies of a hash, in lookup order; returns the count. */
uint32_t mock_engine_copies(const mock_engine *e, uint64_t key,
                            uint32_t *ids, uint32_t max);
/* A request's blocks (req_to_blocks); KVO_ENOTFOUND when not running. */
kvo_status mock_engine_req_blocks(const mock_engine *e, uint64_t req_id,
                                  const uint32_t **ids, uint32_t *n);

/* ======================================================================== */
/* Rendering and mutations                                                   */
/* ======================================================================== */

/* Renders one rank's clean step batches as published. Keeps per-rank
 * mutation state (the drop-store counter). */
typedef struct mock_render mock_render;

kvo_status mock_render_new(mock_render **out, const mock_cfg *cfg);
void mock_render_free(mock_render *r);
/* Payloads for one clean batch: *out = an array of *n_out buffers
 * (split-batches gives one per event; a batch whose events were all dropped
 * gives none). The buffers belong to r and stay valid until the next call. */
kvo_status mock_render_batch(mock_render *r, const wire_batch *clean,
                             const mock_step_aux *aux, const kvo_buf **out,
                             uint32_t *n_out);

/* ======================================================================== */
/* Publisher (one rank)                                                      */
/* ======================================================================== */

typedef struct mock_pub mock_pub;

typedef struct mock_pub_cfg {
    void *zmq_ctx;            /* NULL: no sockets (seq, ring, record only) */
    const char *endpoint;     /* PUB bind endpoint ("tcp://127.0.0.1:0") */
    const char *replay_endpoint; /* ROUTER bind endpoint or NULL */
    const char *topic;
    int hwm;
    uint32_t ring;            /* batches kept for replay */
    uint64_t ring_bytes;
    wire_cap_writer *record;  /* shared, not owned; NULL = none */
} mock_pub_cfg;

/* KVO_ENET when a bind fails (the message says which endpoint in err). */
kvo_status mock_pub_new(mock_pub **out, const mock_pub_cfg *cfg, char *err,
                        size_t errsz);
void mock_pub_free(mock_pub *p);
/* The bound endpoints ("tcp://127.0.0.1:41234"), "" when none. */
const char *mock_pub_endpoint(const mock_pub *p);
const char *mock_pub_replay_endpoint(const mock_pub *p);
/* ROUTER socket to poll (NULL when none). */
void *mock_pub_replay_socket(const mock_pub *p);
kvo_status mock_pub_send(mock_pub *p, const uint8_t *payload, size_t len);
/* Serve every pending replay request (non-blocking). */
void mock_pub_replay_serve(mock_pub *p);
/* Last sequence published; false when none yet. */
bool mock_pub_last_seq(const mock_pub *p, uint64_t *seq);

typedef struct mock_pub_stats {
    uint64_t batches, bytes, replay_requests, replay_batches, bad_requests,
        send_errors, record_errors, ring_len;
    uint64_t replay_cut; /* replies cut short: client's queue full or gone */
} mock_pub_stats;
void mock_pub_stats_get(const mock_pub *p, mock_pub_stats *out);

/* ======================================================================== */
/* Mooncake traces                                                           */
/* ======================================================================== */

typedef struct mock_trace mock_trace;

/* Token j of trace block h in a 32,000-token vocabulary (DESIGN §8):
 * kvo-mocker and kvo-check both call it, so they synthesize identical
 * prompts. */
#define MOCK_TRACE_BLOCK 512u
#define MOCK_TRACE_VOCAB 32000u
uint32_t mock_trace_token(uint64_t hash_id, uint32_t j);

typedef struct mock_trace_req {
    uint64_t line;        /* 1-based line number */
    double timestamp_ms;
    uint32_t input_length;
    uint32_t output_length;
    uint32_t n_hash_ids;
    uint64_t *hash_ids;   /* owned by the reader; valid until next */
} mock_trace_req;

#define MOCK_TRACE_MAX_LINE (4u << 20)   /* longer lines are malformed */
#define MOCK_TRACE_MAX_IDS (1u << 16)    /* 32M-token prompts */

kvo_status mock_trace_open(mock_trace **out, const char *path);
/* KVO_OK: *req filled. KVO_EOF: end. KVO_EPROTO / KVO_ETOOBIG: this line is
 * malformed and skipped (counted; msg says why and where); call again. */
kvo_status mock_trace_next(mock_trace *t, mock_trace_req *req, char *msg,
                           size_t msgsz);
uint64_t mock_trace_malformed(const mock_trace *t);
void mock_trace_free(mock_trace *t);

/* Check a request's shape (input_length within (512(k-1), 512k] for k hash
 * ids, both >= 1). */
kvo_status mock_trace_validate(const uint64_t *hash_ids, uint32_t n_ids,
                               uint32_t input_length);
/* The prompt (DESIGN §8): input_length tokens into out. */
void mock_trace_tokens(const uint64_t *hash_ids, uint32_t n_ids,
                       uint32_t input_length, uint64_t *out);
/* Tokens [first, first + n) of that prompt into out (a block the probe
 * walks to); first + n must not pass 512 tokens per hash id. */
void mock_trace_tokens_at(const uint64_t *hash_ids, uint64_t first, uint32_t n,
                          uint64_t *out);

/* ======================================================================== */
/* Text                                                                      */
/* ======================================================================== */

/* The mock tokenizer: one token per UTF-8 byte (token id = byte value), so
 * a shared text prefix is a shared token prefix. Returns the count. */
uint32_t mock_tokenize(const char *text, size_t len, uint64_t *out);
/* Text for generated tokens: " t<id>" per token, appended to b. */
kvo_status mock_detokenize(const uint64_t *tokens, uint32_t n, kvo_buf *b);
/* The chat template: for each message "<|role|>\n" content "\n", then
 * "<|assistant|>\n". Appends to b. */
kvo_status mock_chat_template(json_object *messages, kvo_buf *b);

/* ======================================================================== */
/* Modes                                                                     */
/* ======================================================================== */

/* HTTP + ZMQ service until kvo_stop. Returns KVO_OK on a clean stop. */
kvo_status mock_run_server(const mock_cfg *cfg);
/* Replay cfg->trace; prints the summary on stdout. */
kvo_status mock_run_trace(const mock_cfg *cfg);

#endif /* MOCK_H */
