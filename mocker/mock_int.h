/* mock_int.h -- the mocker's internals: what its files share, and the
 * seams tests/mocker drives (the engine without sockets, the renderer, the
 * publisher). Nothing outside mocker/ and tests/mocker includes it.
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
 *   mock_render   clean engine batch -> the batch(es) as published: hash form
 *                 (low-64 int or raw digest) and the --mutate catalog.
 *   mock_pub      one rank's ZMQ PUB + ROUTER replay ring (+ capture file).
 *   mock_node     the ranks of one process with their renderers and
 *                 publishers; mock_server.c and mock_run.c drive it.
 *
 * One rank = one mock_engine (mock_engine.c draws how its parts depend on
 * each other):
 *
 *   mock_engine
 *     sched     mock_sched: the requests and the pool
 *       pool      mock_pool: blocks[0..N) (block 0 = vLLM's null block,
 *                 never free), the free queue (doubly linked through
 *                 blocks, head = next to evict) and the cached map (key,
 *                 group) -> copies (doubly linked through blocks in
 *                 insertion order; lookups return the oldest copy, as
 *                 vLLM's BlockHashToBlockMap); with --cpu-offload-blocks or
 *                 resurrect-removed each cached block keeps its tokens
 *       cpu       mock_cpu: the CPU tier (LRU), fed by the pool's
 *                 evictions, read at admission (a prefix loaded back)
 *       groups    with --kv-groups every request has one block table per
 *                 group (mock_req.grp), sliding groups null the positions
 *                 that left their window
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

#include "kvo_json.h"
#include "kvo_map.h"
#include "mock.h"

/* ======================================================================== */
/* Internal API: used across the mocker's files and by tests/mocker          */
/* ======================================================================== */

/* Mutation bits (mock.h has the catalog). */
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
    /* the field's incidents (issue 15) */
    MOCK_MUT_SALT_IGNORED = 1u << 17,
    MOCK_MUT_LORA_IN_MM_SLOT = 1u << 18,
    MOCK_MUT_LORA_SAME_HASH = 1u << 19,
    MOCK_MUT_GROUP_COLLISION = 1u << 20,
    MOCK_MUT_CPU_TIER_DROPPED = 1u << 21,
    MOCK_MUT_RESET_NOT_PUBLISHED = 1u << 22,
    MOCK_MUT_REPLAY_DROPS_TOPIC = 1u << 23,
    MOCK_MUT_REPLAY_DROPS_TAIL = 1u << 24,
    MOCK_MUT_RESURRECT_REMOVED = 1u << 25
};
_Static_assert(MOCK_MUT_RESURRECT_REMOVED == 1u << (MOCK_MUT_COUNT - 1),
               "MOCK_MUT_COUNT counts every mutation bit");
_Static_assert(MOCK_MUT_COUNT <= 32, "the mask is an unsigned");

/* ---- Hasher extras (mock_hash.c) -----------------------------------------*/

/* Hash block blk alone, for walks that stop at the first miss (the
 * probe): prev = the hashes of blocks 0..blk-1 (the parent is prev[blk-1];
 * the memo also needs the hash before the block's trace row), tokens = that
 * block's block_size tokens. Uses and extends the trace memo like
 * mock_hasher_blocks, so a probe leaves it warm for the completion. */
kvo_status mock_hasher_block_next(mock_hasher *h, const uint64_t *tokens,
                                  uint32_t block_size, uint32_t blk,
                                  const mock_hash *prev, const mock_keys *k,
                                  const mock_trace_ref *trace, mock_hash *out);

/* vLLM's _gen_mm_extra_hash_keys for the block [start, end): the pairs of
 * the items it overlaps into out (room for n_mm), their count returned.
 * *idx is the item the scan starts at (-1: the last one) and, on return,
 * where the next block's scan starts: items the block has passed are
 * skipped, one it overlaps is taken and passed when the block reaches its
 * end; nothing when the last item ended at or before start. The ids point
 * into mm. */
uint32_t mock_mm_block_keys(const mock_mm_item *mm, uint32_t n_mm,
                            uint64_t start, uint64_t end, int64_t *idx,
                            wire_mm_key *out);

typedef struct mock_hasher_stats {
    uint64_t computed;  /* digests computed */
    uint64_t memo_hits; /* digests served by the memo */
    uint64_t ns;        /* time spent computing digests */
} mock_hasher_stats;
void mock_hasher_stats_get(const mock_hasher *h, mock_hasher_stats *out);

/* ---- Engine, one rank (mock_engine.c) ------------------------------------*/

typedef struct mock_engine mock_engine;

typedef enum mock_finish {
    MOCK_FINISH_NONE = 0,
    MOCK_FINISH_LENGTH, /* max_tokens reached ("length") */
    MOCK_FINISH_ABORTED /* mock_engine_abort / shutdown */
} mock_finish;

/* Delivered by mock_engine_complete (and abort) for each request that
 * produced a token or ended. */
typedef struct mock_output {
    uint64_t req_id;
    uint64_t token; /* the new token (valid when has_token) */
    bool has_token;
    uint32_t n_output;      /* tokens generated so far */
    mock_finish finish;     /* != NONE: last callback for this request */
    uint32_t cached_tokens; /* vLLM's num_cached_tokens (first schedule) */
    uint32_t n_prompt;
    const uint32_t *block_ids; /* the request's blocks (n_blocks), valid in
                                  the callback only (kv_transfer_params) */
    uint32_t n_blocks;
} mock_output;

typedef void (*mock_output_fn)(void *user, const mock_output *o);

typedef struct mock_req_in {
    const uint64_t *tokens; /* prompt (copied); NULL: the trace prompt of
                                trace.hash_ids cut to n_tokens */
    uint32_t n_tokens;
    uint32_t max_tokens;    /* >= 1 (the prefill role caps it at 1) */
    const char *lora_name;  /* NULL = none */
    const char *cache_salt; /* NULL = none */
    mock_trace_ref trace;   /* the prompt's trace hash ids (enables the
                                hash memo), or {NULL, 0} */
    bool remote_prefill;    /* decode role: the prompt's KV is received */
    mock_output_fn on_output;
    void *user;
    const mock_mm_item *mm; /* multimodal items (copied; mock_mm_check), */
    uint32_t n_mm;          /* or none */
} mock_req_in;

/* What a cached block holds besides its hash, when the pool keeps it (a
 * CPU tier or resurrect-removed needs it after the block is evicted). */
typedef struct mock_block_meta {
    const uint64_t *tokens; /* block_size tokens; NULL: not kept */
    int64_t lora_id;        /* 0: no adapter */
    const char *lora_name;  /* NULL: no adapter */
    uint32_t group;         /* its KV-cache group */
} mock_block_meta;

/* The step's events as the engine produced them (ground truth, before any
 * mutation), with what mutations need to know per event. */
typedef struct mock_step_aux {
    mock_hash *removed_parent;     /* per event: BlockRemoved's block's parent
                                  (key 0, d.len 0 = root) */
    bool *decode_store;            /* per event: BlockStored made at decode */
    mock_hash **stored;            /* per event: BlockStored's full hashes */
    mock_hash *parent;             /* per event: BlockStored's parent (len 0) */
    mock_hash **removed;           /* per event: BlockRemoved's full hashes */
    mock_block_meta *removed_meta; /* per event: BlockRemoved's block's
                                  tokens and adapter (tokens NULL when not
                                  kept) */
    mock_keys *keys;               /* per event: GPU BlockStored's request keys
                                  (all NULL for other events) */
    uint32_t *first;               /* per event: GPU BlockStored's first block
                                  index in its request */
} mock_step_aux;

typedef struct mock_step {
    bool idle;               /* nothing was scheduled */
    double duration_ms;      /* modeled, before --speedup */
    uint32_t n_scheduled;    /* requests in the step */
    uint32_t prefill_tokens; /* new prompt tokens computed */
    uint32_t decode_reqs;    /* requests decoding one token */
    uint32_t preempted;      /* requests preempted in this step */
    uint32_t evicted;        /* cached blocks its allocations evicted */
    uint32_t stored;         /* blocks it cached (BlockStored's hashes) */
    uint32_t events_lost;    /* events that could not be queued (out of
                                  memory): the batch lacks them */
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
    /* The regime (how loaded the engine was): steps that scheduled >= 2
     * requests; the most requests running after one step's scheduling;
     * requests whose prefill took several steps (chunked prefill, counted
     * once each); blocks evicted in steps that also stored blocks; the
     * most requests in the engine (running + waiting) at once. */
    uint64_t steps_multi, max_running, prefills_split;
    uint64_t evictions_in_store_steps, max_inflight;
    uint64_t prompt_tokens, generated_tokens, computed_tokens;
    uint64_t prefix_queries, prefix_hits; /* tokens, as vLLM's counters */
    uint64_t batches, events, blocks_stored, blocks_removed, cleared;
    uint64_t events_lost_enomem; /* events lost to out of memory */
    /* The CPU tier (--cpu-offload-blocks): blocks offloaded into it and
     * evicted from it, ever; prompt tokens looked up in it and found
     * (vLLM's connector prefix-cache stats, external_prefix_cache_*);
     * its cached set (distinct blocks, digest) */
    uint64_t cpu_stored, cpu_removed, cpu_queries, cpu_hits;
    uint64_t cpu_cached_distinct, cpu_cached_digest;
    uint64_t resident_blocks; /* blocks holding a hash (cached) */
    uint64_t free_blocks;     /* in the free queue (cached or not) */
    uint64_t used_blocks;     /* ref > 0 */
    double usage;             /* vLLM's kv_cache_usage (0..1) */
    /* The cached set: distinct hashes (copies once) and their digest
     * (kvo_block_digest, summed mod 2^64) */
    uint64_t cached_distinct;
    uint64_t cached_digest;
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
/* The same; reset_external also empties the CPU tier (vLLM's
 * reset_prefix_cache with reset_connector, POST /reset_prefix_cache
 * ?reset_external=true). Either way the step publishes one AllBlocksCleared
 * (vLLM's block pool does; the CPU tier publishes nothing). */
bool mock_engine_reset_cache(mock_engine *e, bool reset_external);
/* The CPU tier: is a block with this key in it; its size (0: none); its
 * cached set, as mock_engine_cached_blocks. No side effects. */
bool mock_engine_cpu_cached(const mock_engine *e, uint64_t key);
uint32_t mock_engine_cpu_blocks(const mock_engine *e);
kvo_status mock_engine_cpu_cached_blocks(const mock_engine *e, bool has_after,
                                         uint64_t after, mock_cached_block *out,
                                         uint32_t max, uint32_t *n, bool *more);
/* Physical GPU copies of a hash (0: not cached). */
uint32_t mock_engine_copies_count(const mock_engine *e, uint64_t key);
/* With KV-cache groups: the hit of a prompt whose full-attention group
 * holds its leading n_full blocks (sched_hybrid_hit); group g's cached
 * set (mock_engine_cached_blocks) and its count and digest; whether group
 * g caches key. */
uint32_t mock_engine_hybrid_hit(const mock_engine *e, const mock_hash *bh,
                                uint32_t n_full);
kvo_status mock_engine_group_blocks(const mock_engine *e, uint32_t g,
                                    bool has_after, uint64_t after,
                                    mock_cached_block *out, uint32_t max,
                                    uint32_t *n, bool *more);
void mock_engine_group_set(const mock_engine *e, uint32_t g, uint64_t *distinct,
                           uint64_t *digest);
bool mock_engine_group_cached(const mock_engine *e, uint32_t g, uint64_t key);
/* Queued events that the next schedule will publish even if idle. */
bool mock_engine_has_events(const mock_engine *e);

void mock_engine_stats_get(const mock_engine *e, mock_engine_stats *out);

/* Inspection (tests, /kvo/state). */
typedef struct mock_block_info {
    uint32_t ref;
    bool cached; /* holds a hash */
    bool in_free_queue;
    mock_hash hash; /* when cached */
} mock_block_info;
kvo_status mock_engine_block(const mock_engine *e, uint32_t block_id,
                             mock_block_info *out);
/* Free queue from head (evicted first); returns the count written. */
uint32_t mock_engine_free_queue(const mock_engine *e, uint32_t *ids,
                                uint32_t max);
/* Physical copies of a hash, in lookup order; returns the count. */
uint32_t mock_engine_copies(const mock_engine *e, uint64_t key, uint32_t *ids,
                            uint32_t max);
/* The engine's cached set (its own hashes: --mutate changes only what is
 * published): distinct hashes above after (all when !has_after), sorted,
 * with their parents; the first max into out (*n), *more when more
 * remain. KVO_ENOMEM leaves out unwritten. */
kvo_status mock_engine_cached_blocks(const mock_engine *e, bool has_after,
                                     uint64_t after, mock_cached_block *out,
                                     uint32_t max, uint32_t *n, bool *more);
/* A request's blocks (req_to_blocks); KVO_ENOTFOUND when not running. */
kvo_status mock_engine_req_blocks(const mock_engine *e, uint64_t req_id,
                                  const uint32_t **ids, uint32_t *n);

/* ---- Rendering and mutations (mock_mutate.c) -----------------------------*/

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

/* ---- Publisher, one rank (mock_pub.c) ------------------------------------*/

typedef struct mock_pub mock_pub;

typedef struct mock_pub_cfg {
    void *zmq_ctx;               /* NULL: no sockets (seq, ring, record only) */
    const char *endpoint;        /* PUB bind endpoint ("tcp://127.0.0.1:0") */
    const char *replay_endpoint; /* ROUTER bind endpoint or NULL */
    const char *topic;
    int hwm;
    uint32_t ring; /* batches kept for replay */
    uint64_t ring_bytes;
    wire_cap_writer *record; /* shared, not owned; NULL = none */
    unsigned mutations;      /* replay-drops-topic, replay-drops-tail */
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
/* What one mock_pub_replay_serve call did (the totals are in the stats). */
typedef struct mock_replay_served {
    uint32_t requests;     /* well-formed requests answered */
    uint32_t bad_requests; /* malformed requests, ignored */
    uint32_t cut;          /* replies cut short: client's queue full or gone */
    uint64_t batches;      /* buffered batches sent */
} mock_replay_served;
/* Serve every pending replay request (non-blocking); out (may be NULL)
 * says what was done. */
void mock_pub_replay_serve(mock_pub *p, mock_replay_served *out);
/* The batch that should have had the next sequence number is lost (it
 * could not be rendered): the number is used up, so subscribers see a gap,
 * and the replay ring is emptied, so no replay bridges the gap either (a
 * replay then starts after the request: the client sees the loss). */
void mock_pub_skip(mock_pub *p);
/* Last sequence number used (published, or skipped for a lost batch);
 * false when none yet. */
bool mock_pub_last_seq(const mock_pub *p, uint64_t *seq);

typedef struct mock_pub_stats {
    uint64_t batches, bytes, replay_requests, replay_batches, bad_requests,
        send_errors, record_errors, ring_len;
    uint64_t replay_cut; /* replies cut short: client's queue full or gone */
    uint64_t skipped;    /* sequence numbers of batches lost (mock_pub_skip) */
} mock_pub_stats;
void mock_pub_stats_get(const mock_pub *p, mock_pub_stats *out);

/* ---- Trace extras (mock_trace.c) -----------------------------------------*/

/* Check a request's shape (input_length within (512(k-1), 512k] for k hash
 * ids, both >= 1). */
kvo_status mock_trace_validate(const uint64_t *hash_ids, uint32_t n_ids,
                               uint32_t input_length);
/* Tokens [first, first + n) of the prompt mock_trace_tokens makes, into
 * out (a block the probe walks to); first + n must not pass 512 tokens per
 * hash id. */
void mock_trace_tokens_at(const uint64_t *hash_ids, uint64_t first, uint32_t n,
                          uint64_t *out);

/* ---- Text (mock_text.c) --------------------------------------------------*/

/* The mock tokenizer: one token per UTF-8 byte (token id = byte value), so
 * a shared text prefix is a shared token prefix. Returns the count. */
uint32_t mock_tokenize(const char *text, size_t len, uint64_t *out);
/* Text for generated tokens: " t<id>" per token, appended to b. */
kvo_status mock_detokenize(const uint64_t *tokens, uint32_t n, kvo_buf *b);
/* The chat template: for each message "<|role|>\n" content "\n", then
 * "<|assistant|>\n". Appends to b. KVO_EINVAL when messages is not
 * [{"role": str, "content": str | null | [part, ...]}, ...] (the text
 * parts' "text" are concatenated, other parts skipped); KVO_ENOMEM. */
kvo_status mock_chat_template(const kvo_jv *messages, kvo_buf *b);

/* ---- Request bodies (mock_request.c) -------------------------------------
 * Pure: body bytes -> a parsed request or a kvo_err (KVO_EPROTO wrong
 * shape, KVO_ETOOBIG over a limit, KVO_EINVAL a value out of range, all
 * answered 400; KVO_ENOMEM, 503). Every pointer in a parsed request points
 * into its own storage (the tree of the body, an arena): valid until its
 * _fini or the next parse into it. A refused body leaves the request empty
 * (no prompts, every field zero). */

/* Prompts one completion request may carry (its choices). */
#define MOCK_MAX_PROMPTS 1024u
/* Multimodal items one request may carry, and the longest identifier
 * (vLLM's are 64 hex digits or a client's uuid). */
#define MOCK_MAX_MM_ITEMS 1024u
#define MOCK_MM_ID_MAX 256u

typedef struct mock_req_limits {
    uint32_t max_len;    /* tokens of one prompt (with max_tokens) */
    uint64_t vocab_size; /* token ids must be below it */
    uint32_t n_ranks;    /* data_parallel_rank must be below it */
} mock_req_limits;

typedef struct mock_prompt {
    const uint64_t *tok;       /* n token ids; NULL in the trace form */
    uint32_t n;                /* tokens (the trace form's input_length) */
    const uint64_t *trace_ids; /* the trace form's hash ids, else NULL */
    uint32_t n_trace;
} mock_prompt;

/* POST /v1/completions and /v1/chat/completions. */
typedef struct mock_completion_req {
    kvo_json doc;         /* the body's tree */
    kvo_arena arena;      /* prompts[], tokens made from text */
    kvo_buf text;         /* the chat template's text */
    mock_prompt *prompts; /* 1..MOCK_MAX_PROMPTS */
    uint32_t n_prompts;
    uint64_t max_tokens;     /* >= 1; 16 when absent */
    const char *lora, *salt; /* NULL: none (absent, null or "") */
    const char *model;       /* "model", NULL when absent, null or "" */
    mock_mm_item *mm;        /* "mm_items" (in the arena), one prompt */
    uint32_t n_mm;
    bool stream, include_usage, return_token_ids, remote_prefill;
    bool has_rank; /* "data_parallel_rank" given: rank */
    uint32_t rank;
} mock_completion_req;

void mock_completion_req_init(mock_completion_req *c);
void mock_completion_req_fini(mock_completion_req *c);
/* chat: "messages" through mock_chat_template instead of "prompt". */
kvo_status mock_completion_parse(mock_completion_req *c, const void *body,
                                 size_t len, bool chat,
                                 const mock_req_limits *lim, kvo_err *err);

/* POST /kvo/probe: {"token_ids": [...]} or {"trace": {...}}, with
 * "lora_name", "cache_salt", "mm_items", "warm", "detail". */
typedef struct mock_probe_req {
    kvo_json doc;
    kvo_arena arena; /* mm[] */
    mock_prompt prompt;
    const char *lora, *salt;
    mock_mm_item *mm;
    uint32_t n_mm;
    bool warm;
    bool detail; /* the chain, block by block (issue 13) */
} mock_probe_req;

void mock_probe_req_init(mock_probe_req *p);
void mock_probe_req_fini(mock_probe_req *p);
kvo_status mock_probe_parse(mock_probe_req *p, const void *body, size_t len,
                            const mock_req_limits *lim, kvo_err *err);

/* POST /reset_prefix_cache: an empty body, or a JSON object (its members
 * are ignored). */
kvo_status mock_reset_parse(const void *body, size_t len, kvo_err *err);

/* ======================================================================== */
/* Internals of the files                                                    */
/* ======================================================================== */

#define MOCK_NIL UINT32_MAX

/* ---- Lists threaded through an array by index -----------------------------
 * The pool's free queue, a hash's copies and the CPU tier's LRU: each
 * element holds a mock_link (MOCK_NIL at the ends), the list its ends.
 * Elements are found as links + i * stride, links pointing at element 0's
 * mock_link: MOCK_LINKS(array, member). */
typedef struct mock_link {
    uint32_t prev, next;
} mock_link;
typedef struct mock_list {
    uint32_t head, tail;
} mock_list;
#define MOCK_LIST_EMPTY ((mock_list){MOCK_NIL, MOCK_NIL})
#define MOCK_LINKS(array, member) (&(array)[0].member), sizeof((array)[0])

static inline mock_link *mock_link_at(mock_link *links, size_t stride,
                                      uint32_t i) {
    return (mock_link *)((char *)links + (size_t)i * stride);
}

static inline void mock_list_unlink(mock_list *l, mock_link *links,
                                    size_t stride, uint32_t i) {
    mock_link *e = mock_link_at(links, stride, i);
    if (e->prev != MOCK_NIL)
        mock_link_at(links, stride, e->prev)->next = e->next;
    else
        l->head = e->next;
    if (e->next != MOCK_NIL)
        mock_link_at(links, stride, e->next)->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = MOCK_NIL;
}

static inline void mock_list_append(mock_list *l, mock_link *links,
                                    size_t stride, uint32_t i) {
    mock_link *e = mock_link_at(links, stride, i);
    e->prev = l->tail;
    e->next = MOCK_NIL;
    if (l->tail != MOCK_NIL)
        mock_link_at(links, stride, l->tail)->next = i;
    else
        l->head = i;
    l->tail = i;
}

/* ---- Block pool (mock_pool.c) --------------------------------------------*/

/* Hot fields only (32 bytes): the digests live in cold arrays. */
typedef struct pool_block {
    uint64_t key; /* hash key when cached */
    uint32_t ref;
    mock_link q;      /* free queue */
    mock_link copies; /* copies of the same hash, oldest first */
    bool cached;
    bool in_free;
    uint8_t group; /* the KV-cache group it was cached for */
} pool_block;

/* A cached block is being evicted: its hash, its parent's (d.len 0 =
 * root) and what else it holds, valid during the call only. */
typedef void (*pool_evict_fn)(void *ctx, const mock_hash *hash,
                              const mock_hash *parent,
                              const mock_block_meta *meta);

typedef struct mock_pool {
    uint32_t n; /* num_gpu_blocks */
    pool_block *blocks;
    mock_hash *hash;   /* per block, when cached */
    mock_hash *parent; /* per block: parent's hash (d.len 0 = root) */
    uint64_t *tok;     /* per block: its bs tokens, when kept (else NULL) */
    int64_t *lora_id;  /* ... and its adapter */
    const char **lora_name;
    uint32_t bs;
    mock_list free_q;
    uint32_t n_free;
    bool caching;
    kvo_map map;         /* (hash key, group) -> copies (mock_pool.c) */
    uint32_t n_cached;   /* blocks holding a hash */
    uint32_t n_distinct; /* group 0's keys (copies counted once) */
    uint64_t digest;     /* sum of their kvo_block_digest terms */
    uint32_t g_distinct[MOCK_MAX_GROUPS]; /* the same per group */
    uint64_t g_digest[MOCK_MAX_GROUPS];
    uint64_t evicted; /* cached blocks popped for reuse, ever */
    pool_evict_fn on_evict;
    void *evict_ctx;
} mock_pool;

/* keep_bs > 0: every cached block keeps its tokens (keep_bs of them) and
 * adapter, for the evict callback's meta. */
kvo_status pool_init(mock_pool *p, uint32_t n, bool caching, uint32_t keep_bs);
void pool_fini(mock_pool *p);
/* Oldest cached copy of key (group 0), or MOCK_NIL. */
uint32_t pool_lookup(const mock_pool *p, uint64_t key);
/* The same in group g (vLLM's BlockHashWithGroupId). */
uint32_t pool_lookup_g(const mock_pool *p, uint64_t key, uint32_t g);
/* ref + 1; leaves the free queue when ref was 0. */
void pool_touch(mock_pool *p, const uint32_t *ids, uint32_t n);
/* Pop n blocks from the free-queue head (caller checked n <= n_free);
 * cached ones are evicted first (on_evict per block, in pop order).
 * Returns how many were evicted. */
uint32_t pool_alloc(mock_pool *p, uint32_t n, uint32_t *out);
/* Mark a full block cached under h (appended to its copies). KVO_ENOMEM
 * (the map could not grow) leaves the pool unchanged. */
kvo_status pool_cache(mock_pool *p, uint32_t id, const mock_hash *h,
                      const mock_hash *parent, const mock_block_meta *meta);
/* The same for group g (meta may be NULL when the pool keeps no tokens). */
kvo_status pool_cache_g(mock_pool *p, uint32_t id, const mock_hash *h,
                        const mock_hash *parent, const mock_block_meta *meta,
                        uint32_t g);
/* ref - 1 for each, in order; blocks reaching 0 join the queue tail in
 * that order (so the first given is evicted first). */
void pool_release(mock_pool *p, const uint32_t *ids, uint32_t n);
/* vLLM reset_prefix_cache: false unless every block but the null block is
 * free; drops every hash. */
bool pool_reset(mock_pool *p);
/* The cached set above after (every key when !has_after), sorted by key:
 * the first max into out, *n of them; *more when keys remain past those.
 * KVO_ENOMEM (a scratch array of n_distinct keys) writes nothing. */
kvo_status pool_list(const mock_pool *p, bool has_after, uint64_t after,
                     mock_cached_block *out, uint32_t max, uint32_t *n,
                     bool *more);
/* The same for group g. */
kvo_status pool_list_g(const mock_pool *p, uint32_t g, bool has_after,
                       uint64_t after, mock_cached_block *out, uint32_t max,
                       uint32_t *n, bool *more);
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
    uint64_t *tokens; /* prompt then generated */
    uint32_t n_tokens, cap_tokens, n_prompt;
    uint32_t max_tokens;
    uint32_t num_computed;
    int64_t num_cached_tokens; /* -1 until first scheduled */
    mock_hash *bh;             /* hashes of full token blocks (vLLM's
                                request.block_hashes) */
    uint32_t n_bh, cap_bh;
    uint32_t *blocks; /* req_to_blocks (group 0) */
    uint32_t n_blocks, cap_blocks;
    uint32_t num_cached_block;
    struct req_group {     /* groups 1.. (--kv-groups): their tables, */
        uint32_t *blocks;  /* cap_blocks each; block 0 (the null block) */
        uint32_t n_blocks; /* where a sliding window skipped one, and   */
        uint32_t num_cached_block; /* the hit ids while waiting          */
    } grp[MOCK_MAX_GROUPS - 1];
    uint32_t n_grp;      /* groups beyond group 0 */
    uint32_t n_hit_ids;  /* waiting: blocks[0..n) = last prefix hit */
    bool materialized;   /* tokens and bh filled (req_materialize) */
    uint64_t *trace_ids; /* trace prompt: hash ids until materialized */
    uint32_t n_trace;
    char *lora;
    const char *lora_tab; /* the engine's copy of lora (lives as long as
                                the engine: blocks keep it) */
    char *salt;
    mock_mm_item *mm; /* multimodal items, ids in the same block */
    uint32_t n_mm;
    int64_t lora_id; /* set by the engine (its LoRA table) */
    bool remote_prefill;
    uint32_t num_preemptions;
    uint64_t rng;
    uint32_t sched_tokens; /* tokens scheduled in the current step */
    bool sched_decode;     /* the current step is a decode for it */
    bool started;
    bool split;   /* a step left its prefill partial (counted) */
    bool aborted; /* abort requested during an open step */
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
                   uint32_t rank, uint32_t n_groups);
void req_free(mock_req *r);
/* Fill the prompt tokens (trace form) and the prompt's block hashes, once. */
kvo_status req_materialize(mock_req *r, const mock_cfg *cfg, mock_hasher *h);
/* Append a generated token; hash the block it completes. */
kvo_status req_append_token(mock_req *r, const mock_cfg *cfg, mock_hasher *h,
                            uint64_t tok);
uint64_t req_sample_token(mock_req *r);
/* The request's extra-key sources (pointing into r). */
mock_keys req_keys(const mock_req *r);
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
    mock_hash *removed_hash; /* per event: a BlockRemoved's one hash */
    wire_hash *removed_wire; /* per event: its int form */
    mock_block_meta *removed_meta;
    mock_keys *keys;
    uint32_t *first;
    uint32_t n, cap;
    kvo_arena arena;
    wire_batch batch; /* points at ev; its own arena unused */
    mock_step_aux aux;
} ev_builder;

typedef struct step_events {
    bool enabled;      /* publish KV events (caching on, not decode role) */
    ev_builder ev;     /* the step's batch, in occurrence order */
    kvo_buf extra_buf; /* msgpack scratch for extra_keys */
    wire_mm_key *mmk;  /* one block's multimodal keys */
    size_t cap_mmk;
    uint32_t block_size;
    uint32_t step_lost;   /* events (GPU removals, CPU-tier events) lost to
                             out of memory, this step */
    uint64_t lost_enomem; /* ... and ever */
} step_events;

void events_init(step_events *s, bool enabled, uint32_t block_size);
void events_fini(step_events *s);
/* Start a step's batch (empty). */
void events_begin(step_events *s);
kvo_status events_cleared(step_events *s);
/* One GPU BlockRemoved (meta kept for the renderer). */
void events_on_evict(step_events *s, const mock_hash *hash,
                     const mock_hash *parent, const mock_block_meta *meta);
/* CPU-tier events, into the batch at the moment the tier acts: for one GPU
 * eviction of X, [BlockRemoved of the tier's LRU block] [BlockStored X],
 * then X's GPU BlockRemoved (the copy exists before the GPU frees its
 * block). A BlockStored of one block with its tokens (copied), parent and
 * adapter; a BlockRemoved. Lost to out of memory: counted as events_lost. */
void events_cpu_stored(step_events *s, const mock_hash *hash,
                       const mock_hash *parent, const mock_block_meta *meta,
                       uint32_t block_size);
void events_cpu_removed(step_events *s, const mock_hash *hash,
                        const mock_hash *parent);
/* One BlockStored: request r's blocks [first, first + n), pointing into r. */
kvo_status events_stored(step_events *s, const mock_req *r, uint32_t first,
                         uint32_t n, uint32_t block_size, bool decode);
/* The same for KV-cache group g, a sliding window of `window` tokens when
 * not 0 (group_idx, kv_cache_spec_kind and _sliding_window say so). */
kvo_status events_stored_g(step_events *s, const mock_req *r, uint32_t first,
                           uint32_t n, uint32_t block_size, bool decode,
                           uint32_t g, uint32_t window);
/* extra_keys of blocks [first, first + n) of a request with keys k, as
 * vLLM's cache_full_blocks lists them, msgpack into b (replaced): per block
 * nil, or [lora_name, [mm_id, offset]..., cache_salt (block 0 only)]; the
 * multimodal scan starts at the first item for the first block and moves on
 * (for a block filled by generated tokens the hash's own scan started at
 * the last item: vLLM lists what this scan finds). lora_as_mm writes the
 * adapter as an [name, 0] pair instead (mutant lora-in-mm-slot). mmk is
 * scratch (grown to k->n_mm). */
kvo_status events_extra_keys(kvo_buf *b, wire_mm_key **mmk, size_t *cap_mmk,
                             uint32_t first, uint32_t n, uint32_t bs,
                             const mock_keys *k, bool lora_as_mm);
/* Close the batch: *batch NULL when it holds no event; both valid until the
 * next events_begin. */
kvo_status events_finish(step_events *s, double ts, uint32_t rank,
                         const wire_batch **batch, const mock_step_aux **aux);

/* ---- The CPU tier (mock_cpu.c) -------------------------------------------*/

typedef struct cpu_slot {
    mock_hash hash, parent; /* parent d.len 0 = a first block */
    int64_t lora_id;
    const char *lora_name;
    mock_link lru;
} cpu_slot;

typedef struct mock_cpu {
    uint32_t cap, n, bs; /* cap 0: no tier */
    cpu_slot *slots;
    uint64_t *tok;   /* cap * bs */
    kvo_map map;     /* key -> slot */
    mock_list lru;   /* head evicted first */
    uint64_t digest; /* kvo_block_digest terms, summed */
    uint64_t stored, removed;
} mock_cpu;

kvo_status cpu_init(mock_cpu *c, uint32_t cap, uint32_t block_size);
void cpu_fini(mock_cpu *c);
bool cpu_has(const mock_cpu *c, uint64_t key);
/* A lookup hit: the block becomes the most recently used. */
void cpu_touch(mock_cpu *c, uint64_t key);
/* A block evicted from the GPU: stored (evicting the LRU block when full),
 * or touched when held; its events into ev. Nothing without tokens. */
kvo_status cpu_offload(mock_cpu *c, const mock_hash *h, const mock_hash *parent,
                       const mock_block_meta *meta, step_events *ev);
/* Drop every block, no events (AllBlocksCleared covers them). */
void cpu_reset(mock_cpu *c);
/* As pool_list. */
kvo_status cpu_list(const mock_cpu *c, bool has_after, uint64_t after,
                    mock_cached_block *out, uint32_t max, uint32_t *n,
                    bool *more);

/* ---- The scheduler (mock_sched.c) ----------------------------------------*/

typedef struct mock_sched {
    const mock_cfg *cfg; /* the engine's copy */
    uint32_t max_model_len;
    mock_hasher *hasher;   /* shared, not owned */
    step_events *ev;       /* where stores (and, via the pool, removals)
                               go; the engine's */
    mock_engine_stats *st; /* the engine's counters this code keeps */
    mock_pool pool;
    mock_cpu cpu; /* the second tier (cap 0: none) */
    req_vec running;
    req_deque waiting;
    req_vec scheduled; /* this step, in schedule order */
    void **started;    /* users first scheduled this step */
    uint32_t n_started;
    size_t cap_started;
    bool step_open; /* schedule done, complete pending */
} mock_sched;

kvo_status sched_init(mock_sched *s, const mock_cfg *cfg,
                      uint32_t max_model_len, mock_hasher *hasher,
                      step_events *ev, mock_engine_stats *st);
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
/* vLLM's hybrid coordinator on a prompt's hashes bh whose full-attention
 * group holds the leading n_full blocks: the hit every group agrees on
 * (each sliding-window group needs the window's blocks before the hit's
 * end); n_full with one group. No side effects. */
uint32_t sched_hybrid_hit(const mock_sched *s, const mock_hash *bh,
                          uint32_t n_full);

/* ---- The engine (mock_engine.c) ------------------------------------------*/

struct mock_engine {
    mock_cfg cfg;
    uint32_t rank;
    uint32_t max_model_len;
    mock_hasher *hasher;
    mock_sched sched;
    step_events ev;
    bool pending_clear; /* AllBlocksCleared queued */
    uint64_t next_id;
    char **loras; /* lora name -> id (index + 1) */
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
    uint64_t render_errors; /* batches lost unrendered (sequence skipped) */
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
/* GET /metrics for every rank, vLLM's names (mock_metrics.c), appended
 * to out. KVO_ENOMEM / KVO_ETOOBIG (labels too long: a huge model name)
 * when the text could not be written; out then holds a partial text. */
kvo_status node_metrics_write(const mock_node *n, const char *model,
                              kvo_buf *out);
/* Host written in advertised endpoints. */
const char *node_advertise_host(const mock_node *n);

#endif /* MOCK_INT_H */
