/* mock.h -- kvo-mocker, a mock vLLM engine (DESIGN §8): what its users call.
 *
 *   mocker_main.c   mock_cfg, then mock_run_server or mock_run_trace
 *   kvo-check       the trace reader and mock_trace_token/_tokens (it builds
 *                   the prompts the mocker builds), the mutation catalog,
 *                   mock_cfg's defaults
 *   benchmarks      the engine hasher
 *
 * The engine, scheduler, pool, renderer, publisher and server are internal
 * (mock_int.h). Ownership: objects are X_new/X_free (or open/free); what an
 * accessor returns stays valid until the next call on the same object.
 */
#ifndef MOCK_H
#define MOCK_H

#include "kvo.h"
#include "wire.h"

/* ---- Configuration --------------------------------------------------------*/

typedef enum mock_role {
    MOCK_ROLE_AGGREGATED = 0, /* prefill + decode, publishes events */
    MOCK_ROLE_PREFILL,        /* max_tokens capped at 1, kv_transfer_params */
    MOCK_ROLE_DECODE          /* publishes no KV events; KV-transfer latency */
} mock_role;

kvo_status mock_role_parse(const char *s, mock_role *out);
const char *mock_role_name(mock_role r);

/* Mutations (DESIGN §9): the published bytes corrupted in one documented
 * way each; mock_mutations()[i] has bit 1 << i. */
#define MOCK_MUT_COUNT 26
typedef struct mock_mutation_info {
    const char *name; /* "flip-stored-hash" */
    unsigned bit;
    bool killed;          /* expected outcome: the check must fail */
    const char *what;     /* one line for --help and the README */
    const char *incident; /* the field incident it reproduces
                             ("sglang#24568"), NULL for the classic ones */
    const char *needs;    /* what a run must exercise for it to be seen:
                           NULL (any run), "salt", "lora", "kv-groups",
                           "cpu-offload", "reset", "replay" */
} mock_mutation_info;
/* The catalog, MOCK_MUT_COUNT entries in bit order; static. */
const mock_mutation_info *mock_mutations(void);
/* "a,b" -> mask; KVO_EINVAL naming the bad one in bad (may be NULL). */
kvo_status mock_mutate_parse(const char *list, unsigned *mask, char *bad,
                             size_t badsz);

/* A hybrid model's KV-cache groups (vLLM's hybrid allocator): group 0 is
 * full attention, later ones sliding-window attention over `window`
 * tokens. Same block size and one shared pool. */
#define MOCK_MAX_GROUPS 4
typedef struct mock_group_spec {
    bool sliding;
    uint32_t window; /* tokens (sliding) */
} mock_group_spec;

typedef struct mock_cfg {
    /* engine (per rank) */
    uint32_t block_size;             /* 16 */
    uint32_t num_gpu_blocks;         /* 16384, incl. vLLM's null block 0 */
    uint32_t max_num_seqs;           /* 256 */
    uint32_t max_num_batched_tokens; /* 8192 */
    uint32_t max_model_len;          /* 0 = (num_gpu_blocks - 1) * block_size */
    bool prefix_caching;             /* true; false = no cache, no events */
    uint32_t cpu_offload_blocks;     /* second tier: CPU blocks (0 = none) */
    uint32_t n_groups;               /* KV-cache groups (--kv-groups); 0 or
                                        1 = one full-attention group */
    mock_group_spec groups[MOCK_MAX_GROUPS];
    mock_role role;
    double kv_transfer_ms_per_block; /* decode role: per received block */
    wire_algo hash_algo;             /* sha256 */
    const char *hash_seed;           /* "0" (PYTHONHASHSEED) */
    uint64_t seed;                   /* generated tokens */
    uint64_t vocab_size;             /* token ids of a request must be
                                        below it: 2^32 (what a router hashes
                                        as u32); at least MOCK_TRACE_VOCAB */
    uint32_t hash_memo_log2;         /* trace-prompt memo: 2^n rows (14); 0 off;
                                        at most MOCK_MEMO_LOG2_MAX */
    /* events */
    bool hash_bytes;          /* publish raw digests */
    wire_format event_format; /* map */
    unsigned mutations;       /* mask from mock_mutate_parse */
    /* process */
    uint32_t dp_size;             /* 1 */
    double speedup;               /* 0 = virtual time */
    const char *model;            /* "kvo-mock" (served model name) */
    const char *lora_modules;     /* "name[=path],..." (vLLM's
                                        --lora-modules): the adapters a
                                        request's "model" may name, lora_int_id
                                        1, 2, ... in this order; NULL none */
    const char *host;             /* HTTP bind, 127.0.0.1 */
    uint16_t port;                /* 8000; 0 = pick */
    const char *zmq_host;         /* 127.0.0.1 */
    uint16_t zmq_port;            /* 5557 (+ rank); 0 = pick */
    const char *zmq_endpoint;     /* overrides zmq_host:zmq_port (rank 0;
                                        ranks > 0 need a tcp port to add to) */
    uint16_t replay_port;         /* 5558 (+ rank); 0 = pick */
    bool replay;                  /* false = --no-replay */
    const char *advertise_host;   /* host in advertised endpoints */
    const char *topic;            /* "" (vLLM's default) */
    uint32_t replay_buffer;       /* 10000 batches */
    uint64_t replay_buffer_bytes; /* cap on buffered payload bytes; 0 none */
    int zmq_hwm;                  /* 100000 (vLLM's publisher default) */
    bool require_events;          /* publisher failure is fatal */
    const char *record;           /* capture file or NULL */
    const char *trace;            /* trace mode when set */
    bool progress;                /* progress bar (trace mode, on a tty) */
    bool summary_json;            /* trace summary as one JSON line */
} mock_cfg;

/* Largest hash_memo_log2: 2^20 rows of one trace block's digests (about
 * 1.6 GB at block size 16) bound the memo's memory. */
#define MOCK_MEMO_LOG2_MAX 20

void mock_cfg_default(mock_cfg *c);
/* --kv-groups: "full[,sliding:W]..." into c->groups / n_groups (the first
 * group full attention, at most MOCK_MAX_GROUPS, W >= 1). KVO_EINVAL
 * leaves c unchanged. */
kvo_status mock_groups_parse(const char *s, mock_cfg *c);
/* Groups the engine keeps (n_groups, at least 1). */
uint32_t mock_cfg_groups(const mock_cfg *c);
/* The 1-based position of adapter name in c->lora_modules, 0 when it is
 * not listed. */
uint32_t mock_cfg_lora_module(const mock_cfg *c, const char *name);
/* The i-th (0-based) adapter name of c->lora_modules into buf (NUL-
 * terminated, cut to bufsz); false past the last. */
bool mock_cfg_lora_module_at(const mock_cfg *c, uint32_t i, char *buf,
                             size_t bufsz);
/* KVO_EINVAL when c->lora_modules has an empty or over-long (> 255 bytes)
 * name, a name listed twice, or more than 4096 names. */
kvo_status mock_cfg_lora_modules_check(const mock_cfg *c);
/* Effective max_model_len. */
uint32_t mock_cfg_max_model_len(const mock_cfg *c);

/* ---- Engine hashes --------------------------------------------------------*/

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

/* A multimodal item of a request (a kvo extension of the completions body,
 * "mm_items"): the prompt's placeholder tokens [offset, offset + length) and
 * the item's identifier (vLLM's mm_feature.identifier, its mm hash). */
typedef struct mock_mm_item {
    uint32_t offset, length; /* length >= 1 */
    const char *id;          /* NUL-terminated, non-empty */
} mock_mm_item;

/* What goes into a request's blocks' extra keys besides the tokens (vLLM's
 * generate_block_hash_extra_keys): the LoRA adapter's name (every block),
 * the multimodal items a block overlaps, the cache salt (block 0 only).
 * mm sorted by offset, not overlapping (mock_keys_check). All NULL/0 = no
 * extra keys. */
typedef struct mock_keys {
    const char *lora;
    const char *salt;
    const mock_mm_item *mm;
    uint32_t n_mm;
} mock_keys;

/* KVO_OK when mm is sorted, its items non-empty, disjoint and inside a
 * prompt of n_tokens, each with an identifier; else KVO_EINVAL with the
 * index of the first bad item in *bad (may be NULL). */
kvo_status mock_mm_check(const mock_mm_item *mm, uint32_t n_mm,
                         uint32_t n_tokens, uint32_t *bad);

typedef struct mock_hasher mock_hasher;

kvo_status mock_hasher_new(mock_hasher **out, wire_algo algo, const char *seed,
                           uint32_t memo_log2);
void mock_hasher_free(mock_hasher *h);
/* Hash full blocks [first, first + n) of a token sequence, chaining from
 * parent (NULL = root; must be block first - 1's hash). lora/salt may be
 * NULL; trace may be NULL. */
kvo_status mock_hasher_blocks(mock_hasher *h, const uint64_t *tokens,
                              uint32_t block_size, uint32_t first, uint32_t n,
                              const mock_hash *parent, const char *lora,
                              const char *salt, const mock_trace_ref *trace,
                              mock_hash *out);
/* The same with every extra key (k may be NULL): one call of vLLM's
 * request_block_hasher, whose multimodal scan starts at the first item when
 * first == 0 and at the last item otherwise (a block completed by generated
 * tokens), then moves on from block to block. */
kvo_status mock_hasher_blocks_keys(mock_hasher *h, const uint64_t *tokens,
                                   uint32_t block_size, uint32_t first,
                                   uint32_t n, const mock_hash *parent,
                                   const mock_keys *k,
                                   const mock_trace_ref *trace, mock_hash *out);

/* ---- The cached set --------------------------------------------------------
 * A checkpoint compares an engine's cached blocks with an index's, per
 * (worker, rank), by digest first: the sum mod 2^64, over every distinct
 * cached block hash h (the published u64 key, low 64 bits; copies once),
 * of
 *     kvo_mix64(h ^ kvo_mix64(parent_or_0 + 0x9E3779B97F4A7C15))
 * where parent_or_0 is the parent block's hash, 0 for a first block. Any
 * holder of the same (hash, parent) set gets the same digest, whatever the
 * order it gained and lost them in; kvo-mocker keeps it incrementally
 * (/kvo/state cached_digest), the indexer computes it over its blocks;
 * each term is kvo_block_digest (kvo.h). */
typedef struct mock_cached_block {
    uint64_t hash;
    uint64_t parent; /* when has_parent */
    bool has_parent;
} mock_cached_block;

/* ---- Mooncake traces ------------------------------------------------------*/

typedef struct mock_trace mock_trace;

/* Token j of trace block h in a 32,000-token vocabulary (DESIGN §8):
 * kvo-mocker and kvo-check both call it, so they synthesize identical
 * prompts. */
#define MOCK_TRACE_BLOCK 512u
#define MOCK_TRACE_VOCAB 32000u
/* --vocab-size's default: ids a router's u32 token hash holds exactly. */
#define MOCK_DEFAULT_VOCAB (1ull << 32)
uint32_t mock_trace_token(uint64_t hash_id, uint32_t j);

typedef struct mock_trace_req {
    uint64_t line; /* 1-based line number */
    double timestamp_ms;
    uint32_t input_length;
    uint32_t output_length;
    uint32_t n_hash_ids;
    uint64_t *hash_ids; /* owned by the reader; valid until next */
} mock_trace_req;

#define MOCK_TRACE_MAX_LINE (4u << 20) /* longer lines are malformed */
#define MOCK_TRACE_MAX_IDS (1u << 16)  /* 32M-token prompts */

kvo_status mock_trace_open(mock_trace **out, const char *path);
/* KVO_OK: *req filled. KVO_EOF: end. KVO_EPROTO / KVO_ETOOBIG: this line is
 * malformed and skipped (counted; msg says why and where); call again. */
kvo_status mock_trace_next(mock_trace *t, mock_trace_req *req, char *msg,
                           size_t msgsz);
uint64_t mock_trace_malformed(const mock_trace *t);
void mock_trace_free(mock_trace *t);
/* The prompt (DESIGN §8): input_length tokens into out. */
void mock_trace_tokens(const uint64_t *hash_ids, uint32_t n_ids,
                       uint32_t input_length, uint64_t *out);

/* ---- Modes ----------------------------------------------------------------*/

/* HTTP + ZMQ service until kvo_stop. Returns KVO_OK on a clean stop. */
kvo_status mock_run_server(const mock_cfg *cfg);
/* Replay cfg->trace; prints the summary on stdout. */
kvo_status mock_run_trace(const mock_cfg *cfg);

#endif /* MOCK_H */
