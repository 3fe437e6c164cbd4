/* idx.h -- the radix index (DESIGN §7): which worker holds which prefix.
 *
 *   idx_tree     a pure data structure (no sockets, clocks, logging or I/O):
 *                RouterEvents in, per-worker leading-block scores out, with
 *                Dynamo's radix-tree semantics (lib/kv-router/src/radix_tree.rs);
 *                layout and invariants are drawn in idx_tree.c.
 *   idx_feed     event-plane messages (DESIGN §6) into a tree: envelope
 *                decoding, per-publisher dedup, gaps and watermarks, counters;
 *                with recovery on (idx_int.h, idx_recover.c), what a gap
 *                missed is asked of the relay (docs/recovery.md).
 *   kvo-indexer  idx_service_run (NATS subscriber + HTTP API) and
 *                idx_replay_run (offline: a capture file and JSON-lines queries).
 *
 * Workers are (worker_id, dp_rank) pairs; scores are always sorted by
 * worker_id, then dp_rank. What the module's own files share (JSON shapes,
 * the tables, the invariant walker) is in idx_int.h.
 */
#ifndef IDX_H
#define IDX_H

#include "kvo.h"
#include "wire.h"

#include <stdio.h>

/* ---- Tree ---------------------------------------------------------------- */

typedef struct idx_tree idx_tree;

/* Outcome of one RouterEvent (Dynamo's KvCacheEventError, plus ok). */
typedef enum idx_evstatus {
    IDX_EV_OK = 0,           /* "ok": applied in full */
    IDX_EV_PARENT_NOT_FOUND, /* "parent_not_found": store rejected whole */
    IDX_EV_BLOCK_NOT_FOUND,  /* "block_not_found": some removed hashes were
                                unknown to the worker (the rest applied) */
    IDX_EV_INVALID_BLOCK,    /* "invalid_block": a stored block is its own
                                parent; blocks before it stay applied */
    IDX_EV_STATUS_COUNT
} idx_evstatus;

const char *idx_evstatus_name(idx_evstatus s); /* "ok", ... (static) */
/* "stored" / "removed" / "cleared" (static; "?" when out of range). */
const char *idx_rtype_name(wire_rtype t);

typedef struct idx_counters {
    /* events[type][status], type = wire_rtype (index 0 unused) */
    uint64_t events[4][IDX_EV_STATUS_COUNT];
    uint64_t blocks_stored;    /* (block, worker) stores applied */
    uint64_t blocks_removed;   /* removed hashes found and removed */
    uint64_t blocks_not_found; /* removed hashes unknown to the worker */
    uint64_t hash_mismatch;    /* stored block met a node stored under a
                                  different block_hash (Dynamo warns) */
    uint64_t orphans_lost;     /* offloaded blocks a detach cut that could
                                  not be remembered for relinking (out of
                                  memory): they stay cut, as in Dynamo */
} idx_counters;

typedef struct idx_stats {
    uint64_t nodes;      /* live tree nodes, root excluded */
    uint64_t held;       /* nodes some worker holds (resident blocks) */
    uint64_t pairs;      /* (block hash, worker) lookup entries */
    uint64_t workers;    /* known worker slots: (worker_id, dp_rank, tier) */
    uint64_t edge_alias; /* extra parent edges (a node under two parents) */
    uint64_t look_alias; /* lookup entries not inlined in their node */
    uint64_t sets;       /* nodes held by two workers or more */
    uint64_t bytes;      /* memory held by the tree (capacities) */
} idx_stats;

/* Lower tiers: a (worker_id, dp_rank) holds blocks per storage tier, each
 * tier in its own worker slot. A query's device score is its leading run
 * on the device tier; through[k - 1] extends it, cumulatively, by the run
 * of blocks held in tier k right after the run through the tiers above
 * (what vLLM loads back: the GPU hit, then the offloaded continuation). */
#define IDX_LOWER_TIERS (WIRE_TIER_COUNT - 1)

typedef struct idx_score {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t blocks; /* leading blocks of the query the worker holds on
                         the device tier */
    uint32_t lower;  /* bit k - 1: the worker has a slot in tier k */
    uint32_t through[IDX_LOWER_TIERS]; /* blocks through tier k (k >= 1),
                                          cumulative; = blocks without */
} idx_score;

/* Query result, caller-owned and reusable (init once, fini once). */
typedef struct idx_scores {
    uint32_t isl_blocks; /* blocks in the query */
    size_t n; /* entries in v (workers scoring 0 on every tier are absent) */
    size_t cap;
    idx_score *v; /* owned */
} idx_scores;

void idx_scores_init(idx_scores *s);
void idx_scores_fini(idx_scores *s);

typedef struct idx_worker {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t blocks;       /* entries in the worker's block_hash -> node map
                        (device tier) */
    uint64_t lower_blocks; /* the same, summed over its lower tiers */
} idx_worker;

kvo_status idx_tree_new(idx_tree **out);
void idx_tree_free(idx_tree *t); /* NULL is a no-op */

/* Apply one RouterEvent to the slot of its (worker_id, dp_rank, tier).
 * A lower tier's store whose parent its slot lacks takes the parent from
 * the same rank's tiers above it (an offloaded block's parent is usually
 * still on the GPU); cleared drops that one tier (a lower tier's cleared
 * creates no slot). *st gets the event's outcome, also counted. Returns KVO_OK, or
 * KVO_ENOMEM or KVO_ETOOBIG (a size limit of the tree: about 2^31 nodes,
 * 2^24 workers): then the blocks before the failing one are applied, the
 * tree is consistent and the event is not counted. KVO_EINVAL: not a
 * stored/removed/cleared event. */
kvo_status idx_tree_apply(idx_tree *t, const wire_revent *ev, idx_evstatus *st);

/* Scores of a query given as router hashes (tokens_hash per block): per
 * worker, the number of leading blocks it holds, counted from block 0 with
 * no gap, exact. out is replaced; KVO_ENOMEM leaves it empty. */
kvo_status idx_tree_query(idx_tree *t, const uint64_t *hashes, size_t n,
                          idx_scores *out);

/* Drop every block of every dp_rank of worker_id and forget the worker. */
kvo_status idx_tree_worker_remove(idx_tree *t, uint64_t worker_id);

/* Drop every block of (worker_id, dp_rank), every tier (a source whose
 * stream can no longer be trusted). */
kvo_status idx_tree_rank_clear(idx_tree *t, uint64_t worker_id,
                               uint32_t dp_rank);

/* Known (worker_id, dp_rank) pairs, each once whatever its tiers, sorted
 * by worker_id, dp_rank: *out is kvo_malloc'd (NULL when there are none),
 * the caller frees it with kvo_free. */
kvo_status idx_tree_workers(const idx_tree *t, idx_worker **out, size_t *n);

void idx_tree_counters(const idx_tree *t, idx_counters *out);
void idx_tree_stats(const idx_tree *t, idx_stats *out);

/* The tree as stored events, breadth first from the root: one event per
 * (edge, worker holding the child), one block each, event_id counting from
 * 0, tier device. Replaying them into an empty tree gives the same query
 * answers. fn gets an event valid during the call; a status other than
 * KVO_OK stops the dump and is returned. */
typedef kvo_status (*idx_dump_fn)(void *ctx, const wire_revent *ev);
kvo_status idx_tree_dump(const idx_tree *t, idx_dump_fn fn, void *ctx);

/* ---- Per-worker views (read-only: checkpoints and diagnosis) -------------
 * A block a worker holds is an entry of its block_hash -> node map. Its
 * node's tokens_hash and parent are those of the node's primary edge, the
 * first edge that linked it and still does: has_parent is false for a child
 * of the root and for a node detached from its parent (Dynamo's corner: its
 * parent lost its last worker), and parent_block_hash is then 0. After
 * inconsistent streams a node can also hang under other parents (alias
 * edges); they are not reported. */
typedef struct idx_block {
    uint64_t block_hash;  /* the key the worker stored it under */
    uint64_t tokens_hash; /* the node's */
    bool has_parent;
    uint64_t parent_block_hash; /* the parent node's block_hash */
} idx_block;

/* fn gets one block valid during the call; a status other than KVO_OK
 * stops the walk and is returned. */
typedef kvo_status (*idx_block_fn)(void *ctx, const idx_block *b);

/* Every block (worker_id, dp_rank) holds in tier, in no particular order;
 * nothing (KVO_OK) for an unknown worker. O(the worker's blocks). fn must
 * not change the tree. */
kvo_status idx_tree_worker_blocks(const idx_tree *t, uint64_t worker_id,
                                  uint32_t dp_rank, wire_tier tier,
                                  idx_block_fn fn, void *ctx);

#define IDX_INFO_OTHERS 8 /* other holders listed by idx_tree_block_info */

typedef struct idx_block_info {
    bool held;       /* the worker's map has block_hash; the rest of the
                          struct is zero when it does not */
    idx_block block; /* as idx_tree_worker_blocks gives it */
    uint64_t node_block_hash; /* the node's own block_hash: differs from
                                 block.block_hash only after a hash
                                 mismatch (Dynamo warns) */
    bool in_set;              /* the worker is in the node's worker set (false
                          only after inconsistent streams) */
    uint32_t others;          /* other (worker_id, dp_rank) in the node's set */
    uint32_t listed; /* min(others, IDX_INFO_OTHERS): entries in other */
    struct {
        uint64_t worker_id;
        uint32_t dp_rank;
    } other[IDX_INFO_OTHERS]; /* the first of them, sorted by worker_id,
                                 dp_rank */
} idx_block_info;

/* Does (worker_id, dp_rank) hold block_hash on the device tier (the
 * diagnosis views read the device tier), and at which node: *out is
 * filled (held = false when not). KVO_EINVAL for NULL t or out; no
 * allocation. */
kvo_status idx_tree_block_info(const idx_tree *t, uint64_t worker_id,
                               uint32_t dp_rank, uint64_t block_hash,
                               idx_block_info *out);

/* Where (worker_id, dp_rank) holds a block's tokens under another block
 * hash than the engine's: the child tokens_hash of the node it holds as
 * parent_hash (has_parent; else the root), then the root's child
 * tokens_hash. IDX_FOUND_NONE when neither is in its worker set; else
 * *block_hash is that node's. No allocation. */
typedef enum idx_found {
    IDX_FOUND_NONE = 0,
    IDX_FOUND_UNDER_PARENT, /* under the engine's parent (or the root, for
                               a block without one) */
    IDX_FOUND_UNDER_ROOT    /* under the root, its parent being a block */
} idx_found;
idx_found idx_tree_find_tokens(const idx_tree *t, uint64_t worker_id,
                               uint32_t dp_rank, bool has_parent,
                               uint64_t parent_hash, uint64_t tokens_hash,
                               uint64_t *block_hash);

/* Router hashes of a prompt (DESIGN §5): one per full block, the LoRA
 * seed on every block, the salt's on block 0 only (wire_router_hash_prompt:
 * vLLM salts block 0 only). lora/salt NULL = none. Returns the number of
 * blocks written. */
size_t idx_prompt_hash(const uint64_t *tokens, size_t n, uint32_t block_size,
                       const char *lora, const char *salt, uint64_t *out);

/* ---- Feed: event-plane messages -> tree ----------------------------------- */

typedef struct idx_feed idx_feed;

typedef struct idx_feed_counters {
    uint64_t messages;    /* received, whatever became of them */
    uint64_t applied;     /* decoded and applied */
    uint64_t duplicates;  /* dropped: (publisher, sequence) already applied
                             with the same body */
    uint64_t restarts;    /* sequence went back with a new body: the
                             publisher restarted (applied, counted) */
    uint64_t gaps;        /* sequence jumps (first message above 0 too) */
    uint64_t missed;      /* sequences jumped over (saturates at 2^64-1) */
    uint64_t rewinds;     /* a jump undone: the next message went back
                             into the jumped-over range (see below) */
    uint64_t undecodable; /* not an event-plane message */
    uint64_t bad_headers; /* malformed KVO-Zmq-Seq (message still applied) */
    uint64_t other_tier;  /* RouterEvents of a lower tier (indexed in
                             their tier's slots) */
    uint64_t enomem;      /* RouterEvents lost to allocation failure (or a
                             size limit of the tree) */
    uint64_t publishers;  /* a gauge: publishers tracked now */
    uint64_t publishers_refused; /* messages from a new publisher that the
                                    full table could not take: applied
                                    untracked (no dedup, gaps, watermark) */
    uint64_t publishers_expired; /* publishers forgotten for being idle */
    /* recovery (docs/recovery.md): idx_int.h's IDX_REC_COUNTERS says what
     * each counts */
    uint64_t announces, announces_bad, relays, recovering, stale_publishers;
    uint64_t recovery_requests, recoveries_events, recoveries_dump,
        recoveries_too_new, recovery_failures, recovery_retries, recovery_bad,
        recovery_stray;
    uint64_t envelopes_recovered, dumps_applied, dump_blocks_applied,
        impossible_sequences;
    uint64_t live_held, live_held_dropped, live_covered;
    uint64_t recovery_ms_total, recovery_ms_max;
} idx_feed_counters;

/* The publisher table: at most max_publishers tracked at once, each with
 * its sequence state (last sequence, the last 256 bodies' hashes, the
 * KVO-Zmq-Seq watermark, its counters: about 4 KiB). A publisher not heard
 * from for publisher_idle_ms is forgotten: its sequence state and counters
 * go, never the index's blocks (those belong to workers, not publishers).
 * Its last sequence is kept in a memory of the last max_publishers
 * forgotten ones (16 bytes each), so one that comes back continues its
 * sequence (no false gap) with fresh counters. When the table is full and
 * nobody is idle, a new publisher's messages are still applied -- the
 * index must not drift from the engines -- but untracked, and counted
 * (publishers_refused): established publishers keep their state, however
 * many ids a flood brings. */
#define IDX_MAX_PUBLISHERS_DEFAULT 4096
#define IDX_PUBLISHER_IDLE_MS_DEFAULT 600000 /* 10 minutes */

#define IDX_RECOVERY_TIMEOUT_MS_DEFAULT 5000
#define IDX_HELD_MAX_MSGS_DEFAULT 16384        /* per publisher */
#define IDX_HELD_MAX_BYTES_DEFAULT (64u << 20) /* all publishers */

typedef struct idx_feed_cfg {
    uint32_t max_publishers;    /* 0 = IDX_MAX_PUBLISHERS_DEFAULT */
    uint64_t publisher_idle_ms; /* 0 = never forget */
    /* recovery (when turned on: idx_int.h) */
    uint64_t recovery_timeout_ms; /* a relay silent this long in the middle
                                     of an answer has failed; 0 = default */
    uint32_t held_max_msgs;       /* live envelopes held per publisher while
                                   it recovers; 0 = default */
    size_t held_max_bytes;        /* and their bytes, all publishers; 0 =
                                   default */
} idx_feed_cfg;

/* With an empty tree; cfg NULL = the defaults, never forgetting (the
 * feed's clock stands at 0 until idx_feed_set_clock). */
kvo_status idx_feed_new(idx_feed **out, const idx_feed_cfg *cfg);
void idx_feed_free(idx_feed *f);      /* NULL is a no-op */
idx_tree *idx_feed_tree(idx_feed *f); /* owned by the feed */

/* The feed reads no clock: the caller says what time it is (monotonic ms,
 * never going back), and messages from then on are stamped with it. */
void idx_feed_set_clock(idx_feed *f, uint64_t now_ms);
/* Forget the publishers idle for publisher_idle_ms at the feed's clock;
 * returns how many (also counted). Cheap when nobody can be idle yet. */
size_t idx_feed_expire(idx_feed *f);

/* What idx_feed_message did with one message (also counted in
 * idx_feed_counters), for a caller that logs it. */
typedef struct idx_feed_result {
    uint64_t publisher_id, sequence; /* the envelope's (0 if undecodable) */
    bool applied;                    /* decoded and applied (see lost) */
    bool duplicate;                  /* an exact duplicate: dropped */
    bool undecodable; /* not an event-plane message (err says why) */
    bool restart;     /* the sequence went back with a new body */
    bool rewind;      /* the sequence went back into the range the previous
                         message jumped over: that jump is undone */
    bool untracked;   /* the publisher table is full: applied, untracked */
    bool bad_header;  /* malformed KVO-Zmq-Seq (the message still applied) */
    uint64_t missed;  /* a gap: sequences jumped over before this one */
    uint64_t jumped_from; /* rewind: the sequence the undone jump reached */
    uint32_t other_tier;  /* RouterEvents of a lower tier */
    uint32_t lost;        /* RouterEvents lost to KVO_ENOMEM / KVO_ETOOBIG */
    uint32_t expired;     /* idle publishers forgotten to make room */
    bool held;            /* recovery: held until its publisher recovers */
    bool held_dropped;    /* recovery: to be held, but the hold was full */
} idx_feed_result;

/* One NATS message body; zmq_seq is the KVO-Zmq-Seq header value ("A-B")
 * or NULL. Messages apply in arrival order. A sequence at or below the
 * publisher's last one is an exact duplicate (dropped) when its body matches
 * the one seen with that sequence (the last 256 are remembered), else a
 * publisher restart (applied); one too old to be remembered is taken for a
 * duplicate, unless it is 0 (a restart). One exception: right after a jump
 * (a gap, or a first message above 0), a message that goes back into the
 * jumped-over range is no duplicate -- nothing was seen there -- but the
 * stream going on where it was: the jump is taken for bogus (one spoofed
 * or corrupt sequence), the message applies and the sequence follows it
 * (a rewind; the jump's gap stays counted). A restart or a rewind also
 * restarts the KVO-Zmq-Seq watermark (zmq_seq_first/last) at this
 * message's header: otherwise the highest end seen is kept, so a bogus
 * header end holds until the publisher restarts or is forgotten.
 * Returns KVO_OK (applied), KVO_EEXIST
 * (duplicate, dropped), a decode status (undecodable; err says why),
 * KVO_ENOMEM, or the tree's KVO_ENOMEM / KVO_ETOOBIG (applied but for the
 * events lost). A malformed header is counted; the message still applies.
 * *res (may be NULL) says what happened, whatever the return. With
 * recovery on, idx_recover.c's rule comes first: a jump is held, never
 * applied (so the rewind above never happens), and res->held says so. */
kvo_status idx_feed_message(idx_feed *f, const uint8_t *body, size_t len,
                            const char *zmq_seq, idx_feed_result *res,
                            kvo_err *err);

void idx_feed_counters_get(const idx_feed *f, idx_feed_counters *out);

/* ---- kvo-indexer ---------------------------------------------------------- */

struct kvo_nats_cfg; /* kvo_nats.h */

#define IDX_BLOCK_SIZE_DEFAULT 16 /* tokens per block of a token query */

typedef struct idx_service_cfg {
    const struct kvo_nats_cfg *nats; /* the --nats* options, owned by the
                                        caller (NULL: kvo_nats_cfg_default's;
                                        buffer_bytes unused: the indexer
                                        publishes nothing) */
    const char *subject;      /* default namespace.*.component.*.kv-events */
    const char *http;         /* host:port, default 127.0.0.1:8090 (0 = any) */
    uint32_t block_size;      /* default 16 */
    idx_feed_cfg feed;        /* the publisher table; default 4096 publishers,
                            forgotten after 10 minutes idle */
    size_t max_body;          /* request body bytes, default 16 MiB */
    bool no_recovery;         /* count gaps only: never ask relays
                            (docs/recovery.md) */
    uint64_t discover_ms;     /* the discovery window at start, default 500 */
    uint32_t apply_budget_us; /* apply for at most this long between two
                                 turns of the HTTP server (pausing
                                 between two events of an envelope if need
                                 be); default 500 */
    const char *dynamo_http;  /* host:port of a second listener speaking
                                Dynamo's standalone-indexer API (its
                                /register consumes engines' ZMQ streams
                                in-process); NULL = none */
    uint32_t dynamo_max_listeners; /* (engine, dp_rank)s registered at
                                      once through it; default 256 */
} idx_service_cfg;

void idx_service_cfg_default(idx_service_cfg *cfg); /* nats = NULL */
/* Serve until kvo_stop. Logs "listening on http://HOST:PORT" once bound.
 * KVO_OK on a clean stop; a setup error (NATS, HTTP bind) otherwise. */
kvo_status idx_service_run(const idx_service_cfg *cfg);

typedef struct idx_replay_cfg {
    const char *events;  /* capture file of event-plane messages */
    const char *queries; /* JSON lines, or NULL */
    uint32_t block_size; /* default 16 */
} idx_replay_cfg;

/* Offline mode (DESIGN §3, issue 3): writes JSON lines to out. KVO_OK, or
 * an input error with a one-line reason in err. */
kvo_status idx_replay_run(const idx_replay_cfg *cfg, FILE *out, char *err,
                          size_t errsz);

#endif /* IDX_H */
