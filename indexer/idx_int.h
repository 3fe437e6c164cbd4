/* idx_int.h -- what the indexer's own files share, and its test seams
 * (idx_tree_check). Users call idx.h; only indexer/'s files and tests
 * include this.
 */
#ifndef IDX_INT_H
#define IDX_INT_H

#include "idx.h"
#include "kvo_http.h"
#include "kvo_json.h"
#include "kvo_map.h"
#include "kvo_prom.h"

/* ---- Feed internals (idx_feed.c, idx_recover.c) -------------------------- */

/* Per publisher; what GET /watermark shows. */
typedef struct idx_publisher {
    uint64_t publisher_id;
    uint64_t last_sequence;
    uint64_t messages; /* applied */
    uint64_t gaps;
    uint64_t missed; /* sequences jumped over (saturating) */
    uint64_t duplicates;
    uint64_t restarts;
    bool has_zmq;       /* a KVO-Zmq-Seq header was seen (since the last
                           restart, rewind or dump) */
    uint64_t zmq_first; /* lowest header start seen */
    uint64_t zmq_last;  /* highest header end seen */
    bool stale;         /* a recovery failed: its (worker, rank)s were
                           cleared and are not known to be whole again */
    bool recovering;    /* a recovery request is in flight */
} idx_publisher;

/* idx_feed_counters, one row each and in this order everywhere: the
 * field, its key in the counters JSON, its /metrics name (after
 * "kvo_indexer_"), kvo_prom_counter or kvo_prom_gauge, and the help text. */
#define IDX_FEED_COUNTERS(X)                                                   \
    X(messages, "messages", "messages_total", counter,                         \
      "Event-plane messages received.")                                        \
    X(applied, "applied", "messages_applied_total", counter,                   \
      "Messages decoded and applied.")                                         \
    X(duplicates, "duplicates", "duplicates_total", counter,                   \
      "Exact duplicates dropped.")                                             \
    X(restarts, "restarts", "restarts_total", counter,                         \
      "Publisher restarts seen.")                                              \
    X(gaps, "gaps", "gaps_total", counter, "Sequence gaps.")                   \
    X(missed, "missed", "missed_total", counter, "Messages missed in gaps.")   \
    X(rewinds, "rewinds", "rewinds_total", counter,                            \
      "Sequence jumps undone by the next message (bogus sequences).")          \
    X(undecodable, "undecodable", "undecodable_total", counter,                \
      "Undecodable messages.")                                                 \
    X(bad_headers, "bad_headers", "bad_headers_total", counter,                \
      "Malformed KVO-Zmq-Seq headers.")                                        \
    X(other_tier, "other_tier", "other_tier_total", counter,                   \
      "RouterEvents of lower tiers (indexed per tier).")                       \
    X(enomem, "enomem", "enomem_total", counter,                               \
      "RouterEvents lost to allocation failure.")                              \
    X(publishers, "publishers", "publishers", gauge,                           \
      "Publishers whose sequences are tracked.")                               \
    X(publishers_refused, "publishers_refused", "publishers_refused_total",    \
      counter, "Messages applied untracked: the publisher table was full.")    \
    X(publishers_expired, "publishers_expired", "publishers_expired_total",    \
      counter, "Publishers forgotten after being idle.")                       \
    IDX_REC_COUNTERS(X)

/* The recovery's rows (docs/recovery.md; idx_recover.c). */
#define IDX_REC_COUNTERS(X)                                                    \
    X(announces, "announces", "announces_total", counter,                      \
      "Relay announces received (start, heartbeat, discover answers).")        \
    X(announces_bad, "announces_bad", "announces_bad_total", counter,          \
      "Announces that could not be read.")                                     \
    X(relays, "relays", "relays", gauge,                                       \
      "Tracked publishers that announced themselves as relays.")               \
    X(recovering, "recovering", "recovering", gauge,                           \
      "Publishers with a recovery request in flight.")                         \
    X(stale_publishers, "stale_publishers", "stale_publishers", gauge,         \
      "Publishers whose last recovery failed (their workers were cleared).")   \
    X(recovery_requests, "recovery_requests", "recovery_requests_total",       \
      counter, "Recovery requests sent (retries included).")                   \
    X(recoveries_events, "recoveries_events", "recoveries_events_total",       \
      counter, "Recoveries answered with the missing envelopes.")              \
    X(recoveries_dump, "recoveries_dump", "recoveries_dump_total", counter,    \
      "Recoveries answered with a dump of the relay's state.")                 \
    X(recoveries_too_new, "recoveries_too_new", "recoveries_too_new_total",    \
      counter, "Recoveries answered too_new: nothing was missing.")            \
    X(recovery_failures, "recovery_failures", "recovery_failures_total",       \
      counter,                                                                 \
      "Recoveries that failed (relay gone, timeout, no valid answer).")        \
    X(recovery_retries, "recovery_retries", "recovery_retries_total", counter, \
      "Requests sent again after an incomplete or malformed answer.")          \
    X(recovery_bad, "recovery_bad", "recovery_bad_total", counter,             \
      "Malformed or inconsistent recovery answers.")                           \
    X(recovery_stray, "recovery_stray", "recovery_stray_total", counter,       \
      "Recovery answers to no request in flight (late, or abandoned).")        \
    X(envelopes_recovered, "envelopes_recovered", "envelopes_recovered_total", \
      counter, "Envelopes received in recovery answers (events and dumps).")   \
    X(dumps_applied, "dumps_applied", "dumps_applied_total", counter,          \
      "Dumps applied whole.")                                                  \
    X(dump_blocks_applied, "dump_blocks_applied", "dump_blocks_applied_total", \
      counter, "Blocks stored from dumps.")                                    \
    X(impossible_sequences, "impossible_sequences",                            \
      "impossible_sequences_total", counter,                                   \
      "Envelopes dropped: their relay never sent that sequence (too_new).")    \
    X(live_held, "live_held", "live_held_total", counter,                      \
      "Live envelopes held while their publisher recovered.")                  \
    X(live_held_dropped, "live_held_dropped", "live_held_dropped_total",       \
      counter,                                                                 \
      "Live envelopes not held: the hold was full (recovered later).")         \
    X(live_covered, "live_covered", "live_covered_total", counter,             \
      "Held live envelopes a dump covered (dropped).")                         \
    X(recovery_ms_total, "recovery_ms_total", "recovery_ms_total", counter,    \
      "Milliseconds spent recovering, summed over finished recoveries.")       \
    X(recovery_ms_max, "recovery_ms_max", "recovery_ms_max", gauge,            \
      "Longest finished recovery, milliseconds.")

/* Publishers sorted by publisher_id; *out kvo_malloc'd (caller frees). */
kvo_status idx_feed_publishers(const idx_feed *f, idx_publisher **out,
                               size_t *n);
/* The highest KVO-Zmq-Seq end seen from one publisher: false when the
 * publisher or its header is unknown so far. No allocation. */
bool idx_feed_zmq_last(const idx_feed *f, uint64_t publisher_id,
                       uint64_t *zmq_last);
/* A counter that moves whenever the feed changes the tree (for caches of
 * what was read from it). */
uint64_t idx_feed_generation(const idx_feed *f);
/* Call fn(ctx) between two events of one envelope (NULL: never). The tree
 * then holds the envelope's first events and not yet the rest, and the
 * publisher's KVO-Zmq-Seq watermark still stands where it was before the
 * envelope (it moves once the envelope is applied), so a query that waits
 * for the watermark never sees half an envelope. fn may read the feed and
 * the tree (answer queries), never change them. The service uses it so
 * that a query does not wait behind an envelope of thousands of events. */
typedef void (*idx_feed_pause_fn)(void *ctx);
void idx_feed_set_pause(idx_feed *f, idx_feed_pause_fn fn, void *ctx);

/* ---- Recovery: the pure core (idx_recover.c draws the state machine) -----
 * docs/recovery.md, the indexer's side. No sockets and no clock: the feed's
 * clock (idx_feed_set_clock) is the time, requests go out through io.ask,
 * and the caller hands back what comes in: announces, reply messages (by
 * publisher and request id), and ticks for the timeouts. */

/* One recovery request to send. */
typedef struct idx_rec_ask {
    uint64_t publisher_id;
    uint64_t id;         /* unique; its replies come back with it */
    const char *subject; /* the relay's recovery_subject, or one derived
                             from the subject its envelopes came on; NULL:
                             unknown (the caller derives it) */
    wire_recovery_req req;
} idx_rec_ask;

/* What became of a recovery, for the caller's log. */
typedef enum idx_rec_what {
    IDX_REC_ASKED = 0,  /* a request went out (also io.ask) */
    IDX_REC_DONE,       /* recovered (kind: events, dump, too_new) */
    IDX_REC_FAILED,     /* gave up: why says why; slots cleared, stale */
    IDX_REC_RETRY,      /* an answer was incomplete or malformed: asked again */
    IDX_REC_IMPOSSIBLE, /* a jumped envelope nobody sent: dropped */
    IDX_REC_RESTART,    /* the relay restarted: a dump was asked */
} idx_rec_what;

typedef struct idx_rec_note {
    idx_rec_what what;
    uint64_t publisher_id;
    wire_reply_kind kind; /* DONE: how (EVENTS, DUMP, TOO_NEW); ASKED,
                             RETRY: DUMP or EVENTS */
    uint64_t sequence;    /* ASKED events: from_sequence; IMPOSSIBLE: the
                             dropped sequence; DONE dump: as_of */
    uint64_t count;       /* DONE: envelopes received; FAILED: (worker,
                             rank)s cleared */
    uint64_t ms;          /* DONE: time to recover */
    const char *why;      /* FAILED, RETRY: static text */
} idx_rec_note;

/* The feed calls these on the caller's thread, from within the feed's own
 * calls: they must not call the feed back. ask's failure to send is not
 * reported: the request times out. note may be NULL. */
typedef struct idx_rec_io {
    void (*ask)(void *ctx, const idx_rec_ask *a);
    void (*note)(void *ctx, const idx_rec_note *n);
    void *ctx;
} idx_rec_io;

/* Turn recovery on (io.ask not NULL) for every publisher from now on. */
void idx_feed_recovery(idx_feed *f, const idx_rec_io *io);
/* One live message, like idx_feed_message, with the subject it came on
 * (NULL: unknown), from which a recovery subject can be derived. With
 * recovery on, res->held says it was held (applied or dropped later). */
kvo_status idx_feed_live(idx_feed *f, const char *subject, const uint8_t *body,
                         size_t len, const char *zmq_seq, idx_feed_result *res,
                         kvo_err *err);
/* An announce (JSON). KVO_OK, or a decode status (counted). */
kvo_status idx_feed_announce(idx_feed *f, const void *body, size_t len,
                             kvo_err *err);
/* A message of a reply stream to request id of publisher_id: kind is its
 * KVO-Recovery header (NULL when absent), zmq_seq its KVO-Zmq-Seq header.
 * no_responders: NATS said nobody listens on the request's subject (the
 * relay is gone). Replies to no request in flight are counted and ignored.
 * KVO_OK, or the status that made it malformed (counted). */
kvo_status idx_feed_reply(idx_feed *f, uint64_t publisher_id, uint64_t id,
                          const char *kind, const char *zmq_seq,
                          const void *body, size_t len, bool no_responders,
                          kvo_err *err);
/* Fail the recoveries whose relay has been silent for the timeout, at the
 * feed's clock; returns how many. Cheap when nothing is in flight. */
size_t idx_feed_tick(idx_feed *f);
/* Say "recovering" until until_ms (the feed's clock): the discovery
 * window, while relays answer the discover request. */
void idx_feed_discovering(idx_feed *f, uint64_t until_ms);
/* Recovering now: in the discovery window, or a request in flight. */
bool idx_feed_is_recovering(const idx_feed *f);

/* A (worker, rank) pair. */
typedef struct idx_slot {
    uint64_t worker_id;
    uint32_t dp_rank;
} idx_slot;

/* ---- The feed's state (idx_feed.c draws it; idx_recover.c shares it) ---- */

#define IDX_RING 256      /* bodies remembered per publisher */
#define IDX_HDR_MAX 48    /* a held KVO-Zmq-Seq header ("A-B": <= 41) */
#define IDX_PUB_WORKERS 8 /* worker ids remembered per publisher */

/* A live envelope held while its publisher recovers: a copy. */
typedef struct idx_held {
    uint64_t seq;
    uint64_t order; /* arrival, among the publisher's held */
    uint8_t *body;  /* kvo_malloc'd */
    size_t len;
    bool has_hdr;
    char hdr[IDX_HDR_MAX]; /* "x" when too long to be well formed */
} idx_held;

/* What a relay said of itself (its announces). */
typedef struct idx_relay {
    bool announced;
    uint64_t worker_id;
    uint64_t started_at_ms;
    uint32_t n_ranks;
    uint32_t *ranks; /* kvo_malloc'd */
    char *subject;   /* recovery subject, kvo_malloc'd (or derived) */
} idx_relay;

/* One recovery episode: from the first request to done or failed. */
typedef struct idx_rec {
    bool asking;       /* a request in flight */
    bool dump;         /* it asked for a dump */
    bool restarting;   /* begun at a relay restart: hold everything */
    bool has_jump;     /* begun by an envelope that jumped ahead */
    bool has_as_of;    /* dump: its envelopes' sequence is known */
    bool has_zmq;      /* dump: a KVO-Zmq-Seq header came with it */
    uint32_t attempts; /* requests of this episode */
    uint64_t id;       /* the request in flight */
    uint64_t from;     /* events: from_sequence */
    uint64_t jump_seq; /* has_jump: the jumped envelope's sequence */
    uint64_t as_of;
    uint64_t zmq_first, zmq_last;
    uint64_t got; /* envelopes received for the request */
    uint64_t begun_ms, deadline_ms;
    idx_held *held; /* live envelopes held, in arrival order */
    size_t n_held, cap_held, held_bytes;
    uint64_t held_order;
} idx_rec;

typedef enum idx_jump {
    IDX_JUMP_NONE = 0,
    IDX_JUMP_FROM,  /* jumped ahead from jump_from */
    IDX_JUMP_FIRST, /* first heard above 0 */
} idx_jump;

typedef struct idx_pub {
    idx_publisher p;
    uint64_t heard_ms; /* the feed's clock at its last message */
    bool seen;         /* an envelope was tracked: p.last_sequence holds */
    bool whole;        /* every envelope up to last_sequence is reflected
                           (first heard at 0, or rebuilt by a dump) */
    idx_jump jump;
    uint64_t jump_from; /* IDX_JUMP_FROM: last_sequence before the jump */
    uint32_t n_workers; /* worker ids its applied envelopes named */
    uint64_t workers[IDX_PUB_WORKERS];
    idx_slot *stale; /* stale: the (worker, rank)s cleared, kvo_malloc'd */
    size_t n_stale;
    idx_relay relay;
    idx_rec rec;
    uint64_t ring_seq[IDX_RING];
    uint64_t ring_hash[IDX_RING];
} idx_pub;

typedef struct idx_gone {
    uint64_t id, last_sequence;
} idx_gone;

struct idx_feed {
    idx_tree *tree;
    wire_plane_msg msg;
    wire_limits lim;
    idx_feed_counters c;
    idx_pub **pubs; /* sorted by publisher_id */
    size_t npubs, cap;
    size_t max_pubs;
    uint64_t idle_ms; /* 0 = never forget */
    uint64_t now_ms, oldest_ms;
    idx_gone *gone; /* max_pubs slots, allocated at the first expiry */
    size_t gone_len, gone_head;
    kvo_map gone_at;         /* id -> position in gone + 1 */
    uint64_t gen;            /* idx_feed_generation */
    idx_feed_pause_fn pause; /* idx_feed_set_pause */
    void *pause_ctx;
    /* recovery (idx_recover.c) */
    bool recovery; /* io.ask is set */
    idx_rec_io io;
    uint64_t rec_timeout_ms;
    size_t held_max_msgs, held_max_bytes, held_bytes;
    uint64_t next_id;
    uint64_t discover_until_ms;
    kvo_json doc; /* announces and reply ends */
};

/* idx_feed.c, for idx_recover.c. */
idx_pub *idx_feed_pub(const idx_feed *f, uint64_t id);
/* The publisher of id, added when new (fresh: added now, never heard;
 * NULL with KVO_OK: the table is full). */
kvo_status idx_feed_pub_get(idx_feed *f, uint64_t id, idx_pub **out,
                            bool *fresh);
/* The sequence rule without recovery (idx_feed.c's header): false when
 * seq is a duplicate. hash: the body's. */
bool idx_feed_track(idx_feed *f, idx_pub *p, bool fresh, uint64_t seq,
                    uint64_t hash, idx_feed_result *r);
/* Apply f->msg's device-tier events (p may be NULL: untracked): counts
 * other tiers and losses in r; *blocks (may be NULL) gets the stored
 * blocks applied. The first failing tree status, or KVO_OK. */
kvo_status idx_feed_apply_events(idx_feed *f, idx_pub *p, idx_feed_result *r,
                                 uint64_t *blocks);
/* "A-B" (decimal, A <= B). */
bool idx_feed_parse_zmq(const char *s, uint64_t *a, uint64_t *b);
/* An applied message's KVO-Zmq-Seq header into p's watermark (p may be
 * NULL: untracked); a malformed one sets r->bad_header. */
void idx_feed_zmq_header(idx_pub *p, const char *zmq_seq, idx_feed_result *r);
/* The live path after decoding, for a released held envelope too. */
kvo_status idx_feed_live_decoded(idx_feed *f, const char *subject,
                                 const uint8_t *body, size_t len,
                                 const char *zmq_seq, bool released,
                                 idx_feed_result *r);
void idx_feed_pub_free(idx_feed *f, idx_pub *p);

/* idx_recover.c, for idx_feed.c. */
typedef enum idx_rec_act {
    IDX_REC_APPLY = 0, /* tracked: apply it */
    IDX_REC_HOLD,      /* held (or not, when the hold is full) */
    IDX_REC_DROP,      /* a duplicate */
} idx_rec_act;
/* The recovery's sequence rule for a live envelope of a tracked
 * publisher (idx_recover.c's header). */
idx_rec_act idx_rec_live(idx_feed *f, idx_pub *p, bool fresh, uint64_t seq,
                         uint64_t hash, const uint8_t *body, size_t len,
                         const char *zmq_seq, const char *subject,
                         bool released, idx_feed_result *r);
/* Free what a publisher's recovery holds. */
void idx_rec_fini(idx_feed *f, idx_pub *p);

/* ---- Pages of a long answer (GET /watermark, GET /dump) ------------------
 * ?after=K&limit=N: the entries whose key is above K (all when has_after
 * is false), at most limit of them. */
typedef struct idx_page {
    bool has_after;
    uint64_t after;
    size_t limit;
} idx_page;

#define IDX_WATERMARK_PAGE 1000 /* default and largest /watermark limit */

/* ---- JSON shapes (json-c; the caller owns what is returned) -------------
 * counters:  {"events": {"stored"|"removed"|"cleared": {"ok": n,
 *             "parent_not_found": n, "block_not_found": n,
 *             "invalid_block": n}}, "blocks": {"stored": n, "removed": n,
 *             "not_found": n, "hash_mismatch": n}, "messages": n,
 *             "applied": n, "duplicates": n, "restarts": n, "gaps": n,
 *             "missed": n, "rewinds": n, "undecodable": n,
 *             "bad_headers": n, "other_tier": n, "enomem": n,
 *             "publishers": n, "publishers_refused": n,
 *             "publishers_expired": n, "nodes": n, "resident_blocks": n,
 *             "pairs": n, "workers": n}
 * workers:   [{"worker_id", "dp_rank", "blocks"}] sorted
 * scores:    {"isl_blocks": n, "scores": [{"worker_id", "dp_rank",
 *             "blocks"}]} sorted
 * watermark: {"publishers": [{"publisher_id", "last_sequence", "messages",
 *             "gaps", "missed", "duplicates", "restarts", "zmq_seq_first",
 *             "zmq_seq_last"}], "next": id} (zmq_* null until a
 *             KVO-Zmq-Seq header was seen; first = lowest start, last =
 *             highest end), sorted by publisher_id, the page's publishers
 *             only; "next" (the last publisher_id listed) only when more
 *             publishers follow: ask again with ?after=next; each
 *             publisher also has "stale": true when its last recovery
 *             failed (its (worker, rank)s were cleared), else false
 * recovery:  idx_json_recovery adds to o (GET /health's object)
 *             "recovering": [publisher_id, ...] (a request in flight),
 *             "stale": [{"publisher_id", "worker_id", "dp_rank"}, ...]
 *             (the first IDX_HEALTH_STALE_MAX) and "stale_count": n;
 *             false when out of memory
 * NULL return = out of memory. */
json_object *idx_json_counters(const idx_feed *f);
json_object *idx_json_workers(const idx_tree *t);
json_object *idx_json_scores(const idx_scores *s);
json_object *idx_json_watermark(const idx_feed *f, const idx_page *page);
/* One stored RouterEvent in the event-plane JSON shape of the vectors. */
json_object *idx_json_revent(const wire_revent *ev);
#define IDX_HEALTH_STALE_MAX 1000
bool idx_json_recovery(const idx_feed *f, json_object *o);

/* ---- Per-worker views: GET /blocks, POST /lookup (idx_views.c) -----------
 * GET /blocks?worker_id=W&dp_rank=R[&after=H&limit=N][&digest_only=1]:
 *   {"worker_id", "dp_rank", "count": C, "digest": D, "blocks":
 *    [[block_hash, parent_hash|null], ...], "next": H'}
 * the blocks sorted by block_hash, those above after, at most limit
 * (1..IDX_BLOCKS_PAGE, default IDX_BLOCKS_PAGE); "next" (the last listed)
 * only while more follow; digest_only: no "blocks" (nor "next"). C and D
 * are the whole set's. D = the sum mod 2^64 over the blocks of
 * idx_block_digest(block_hash, parent) (parent 0 when it has none): the
 * same as kvo-mocker's over its cached blocks. */
#define IDX_BLOCKS_PAGE 100000

static inline uint64_t idx_block_digest(uint64_t block_hash,
                                        uint64_t parent_or_0) {
    return kvo_mix64(block_hash ^
                     kvo_mix64(parent_or_0 + 0x9E3779B97F4A7C15ull));
}

/* One worker's blocks, sorted by block_hash: a cache that is reloaded only
 * when the (worker, rank) or the feed's generation changes, so the pages
 * of one listing cost O(page) each. */
typedef struct idx_blockset {
    bool loaded;
    const idx_tree *tree; /* the tree they were read from */
    uint64_t worker_id;
    uint32_t dp_rank;
    wire_tier tier;
    uint64_t gen;
    uint64_t digest;
    size_t n, cap;
    idx_block *v; /* kvo_malloc'd, sorted by block_hash */
} idx_blockset;

void idx_blockset_init(idx_blockset *bs);
void idx_blockset_fini(idx_blockset *bs);
/* (worker_id, dp_rank)'s blocks in tier of t as of generation gen into bs
 * (kept when bs holds them already). KVO_ENOMEM leaves bs empty. */
kvo_status idx_blockset_load(idx_blockset *bs, const idx_tree *t, uint64_t gen,
                             uint64_t worker_id, uint32_t dp_rank,
                             wire_tier tier);
/* The views on HTTP, for either listener. tree_of gives the tree that
 * holds worker_id (an empty one when none does) and its generation. Bad
 * arguments are a 400, counted in *bad_requests. */
typedef const idx_tree *(*idx_tree_of_fn)(void *ctx, uint64_t worker_id,
                                          uint64_t *generation);
void idx_http_blocks(kvo_http_req *r, idx_tree_of_fn tree_of, void *ctx,
                     idx_blockset *cache, uint64_t *bad_requests);
void idx_http_lookup(kvo_http_req *r, idx_tree_of_fn tree_of, void *ctx,
                     uint64_t *bad_requests);
/* ?after=K&limit=N into pg (limit 1..max, default max). false with a
 * message in err when either is malformed. */
bool idx_http_page_args(kvo_http_req *r, size_t max, idx_page *pg, char *err,
                        size_t errsz);
/* Count and digest of (worker_id, dp_rank)'s blocks, walking them once
 * (no allocation). */
kvo_status idx_blocks_digest(const idx_tree *t, uint64_t worker_id,
                             uint32_t dp_rank, wire_tier tier, uint64_t *count,
                             uint64_t *digest);
/* GET /blocks's answer for the page pg of bs (digest_only: no list),
 * appended to out. */
kvo_status idx_blocks_json(const idx_blockset *bs, const idx_page *pg,
                           bool digest_only, kvo_buf *out);
/* The digest-only answer from idx_blocks_digest's values. */
kvo_status idx_blocks_digest_json(uint64_t worker_id, uint32_t dp_rank,
                                  wire_tier tier, uint64_t count,
                                  uint64_t digest, kvo_buf *out);

/* POST /lookup {"worker_id": W, "dp_rank": R, "block_hashes": [h, ...]
 *   [, "chain": {"tokens_hashes": [t, ...], "first_parent": p|null}]}
 * (at most IDX_LOOKUP_MAX hashes; idx_request_parse reads it) ->
 *   {"blocks": [{"block_hash": h, "held": bool, "tokens_hash": t|null,
 *     "parent_hash": p|null, "in_set": bool, "others": n,
 *     "other_holders": [[worker_id, dp_rank], ...]
 *     [, "tokens_found": {"under": "parent"|"root", "block_hash": x}|null]},
 *    ...]}
 * "chain" says the hashes are consecutive blocks of one chain (the first's
 * parent first_parent, each next one's the one before) with those router
 * hashes: for a hash (W, R) does not hold, tokens_found tells where it
 * holds the same tokens under another block hash (idx_tree_find_tokens).
 * in the order asked. held: (W, R)'s lookup has h (tokens_hash and
 * parent_hash are then its node's, parent null at the root or when
 * detached; in_set: (W, R) is in the node's worker set). others: how many
 * other (worker, rank)s hold the node ((W, R) held it) or hold h (it did
 * not: the node some other worker maps h to), the first IDX_INFO_OTHERS
 * of them listed in other_holders, sorted. */
#define IDX_LOOKUP_MAX 4096
struct idx_request;
json_object *idx_json_lookup(const idx_tree *t, const struct idx_request *q);

/* ---- Requests: query bodies (idx_request.c) ------------------------------
 * The one reading path of POST /query, POST /query_by_hash and replay's
 * query lines: kvo_json (strict: one value, exact integers, valid UTF-8,
 * memory proportional to the body), then the shape:
 *   {"token_ids": [u32...], "lora_name"?: str|null, "cache_salt"?: str|null}
 *   {"tokens_hashes": [u64...]}
 *   {"apply": K}                               (replay lines only)
 *   {"worker_id": u64, "dp_rank": u32, "block_hashes": [u64...]}
 *                                              (POST /lookup; at most
 *                                              IDX_LOOKUP_MAX hashes; no
 *                                              "metrics" or "wait")
 * each with optional "metrics": bool|null and "wait": {"zmq_seq":
 * [[publisher_id, seq], ...], "timeout_ms"?: 0..600000 (default 30000)}.
 * Other members are ignored. Pure: no tree, clock or socket. */
typedef enum idx_req_kind {
    IDX_REQ_TOKENS = 1, /* accept-mask bits too */
    IDX_REQ_HASHES = 2,
    IDX_REQ_APPLY = 4,
    IDX_REQ_LOOKUP = 8, /* POST /lookup */
} idx_req_kind;

#define IDX_WAIT_MAX_PAIRS 4096   /* (publisher, seq) pairs per wait */
#define IDX_WAIT_MAX_MS 600000    /* longest wait a query may ask for */
#define IDX_WAIT_DEFAULT_MS 30000 /* a wait without "timeout_ms" */

/* Everything points into doc: valid until the next parse or fini. */
typedef struct idx_request {
    idx_req_kind kind;
    const uint64_t *v;      /* TOKENS: token ids (each < 2^32); HASHES: tokens
                           hashes; n of them (v may be NULL when n is 0) */
    size_t n;               /* LOOKUP: v/n are the block hashes */
    uint64_t worker_id;     /* LOOKUP */
    uint32_t dp_rank;       /* LOOKUP */
    const uint64_t *tokens; /* LOOKUP "chain": tokens_hashes (n), or NULL */
    bool has_first_parent;  /* LOOKUP "chain": first_parent not null */
    uint64_t first_parent;
    const char *lora, *salt; /* TOKENS: NULL = none */
    uint64_t apply;          /* APPLY: records to apply */
    bool metrics;            /* "metrics": true */
    bool wait;               /* a "wait" clause was given */
    uint32_t timeout_ms;     /* wait: how long at most */
    size_t n_pairs;
    const uint64_t *pairs; /* wait: n_pairs x (publisher_id, zmq seq) */
    kvo_json doc;
} idx_request;

void idx_request_init(idx_request *q);
void idx_request_fini(idx_request *q);
/* body[0, len) into q, which must be one of the kinds in accept (a mask
 * of idx_req_kind). KVO_OK; KVO_EPROTO / KVO_ETRUNC / KVO_ETOOBIG (a bad
 * request: err->msg names where, "bad JSON at tokens_hashes[3]: integer
 * out of range", "token_ids[0]: expected an integer in 0..4294967295");
 * KVO_ENOMEM. A failed parse leaves q empty (kind 0). */
kvo_status idx_request_parse(idx_request *q, const void *body, size_t len,
                             unsigned accept, kvo_err *err);

/* Run a TOKENS or HASHES request on t: out gets the scores and isl_blocks
 * (tokens: ceil(tokens / block_size), like Dynamo's hit rate). KVO_OK,
 * KVO_ENOMEM, KVO_EINVAL (block_size 0 or another kind). */
kvo_status idx_request_query(idx_tree *t, uint32_t block_size,
                             const idx_request *q, idx_scores *out);

/* ---- The service's /metrics text ---------------------------------------- */

#define IDX_LAT_BOUNDS 11 /* query latency histogram bounds (idx_service.c) */

/* What the service counts beside the feed, for /metrics. */
typedef struct idx_service_stats {
    uint64_t slow_consumer_drops; /* messages nats.c dropped */
    uint64_t inbox_drops; /* dropped for want of memory before the loop */
    uint64_t nats_disconnects;
    uint64_t bad_requests;      /* HTTP requests answered 4xx */
    uint64_t apply_pauses;      /* HTTP served mid-envelope (mid_envelope) */
    kvo_http_server_stats http; /* what the HTTP server refused or cut */
    uint64_t lat_count[IDX_LAT_BOUNDS + 1]; /* queries per latency bucket;
                                               the last: above every bound */
    double lat_sum;                         /* seconds */
} idx_service_stats;

/* The index's kvo_indexer_* families (tree and feed), both listeners. */
void idx_prom_index(kvo_prom *p, const idx_counters *c, const idx_stats *st,
                    const idx_feed_counters *f);
/* GET /metrics's Prometheus text for f and st, appended to out. */
kvo_status idx_metrics_text(idx_feed *f, const idx_service_stats *st,
                            kvo_buf *out);

/* ---- Dynamo's standalone-indexer API (idx_dynamo.c) ----------------------
 * A listener of its own (--dynamo-http) with Dynamo's routes, shapes and
 * status codes (lib/kv-router/src/services/indexer/server.rs), partitions
 * by (model_name, routing_group), each an idx_feed of its own; every
 * registered (instance, dp_rank) is a relay pipeline (relay_int.h) with its
 * ZMQ sockets, whose envelopes go into its partition's feed. Driven by the
 * service's loop: it polls idx_dyn_pollitems with its other fds, then calls
 * idx_dyn_run. */
typedef struct idx_dyn idx_dyn;

typedef struct idx_dyn_cfg {
    const char *host;         /* bind address */
    uint16_t port;            /* 0 = pick one */
    uint32_t max_listeners;   /* 0 = IDX_DYN_MAX_LISTENERS */
    uint32_t apply_budget_us; /* apply at most this long before serving
                                 HTTP (sooner when a request waits) */
    idx_feed_cfg feed;        /* each partition's feed */
} idx_dyn_cfg;

#define IDX_DYN_MAX_LISTENERS 256

/* Binds the listener. KVO_OK, or the HTTP server's status. */
kvo_status idx_dyn_new(idx_dyn **out, const idx_dyn_cfg *cfg);
/* Stops every listener, answers what is held, frees. NULL no-op. */
void idx_dyn_free(idx_dyn *d);
uint16_t idx_dyn_port(const idx_dyn *d);
/* The most poll items idx_dyn_pollitems can fill. */
size_t idx_dyn_max_items(const idx_dyn *d);
/* Fill items[0..] (zmq_pollitem_t, for zmq_poll) with the HTTP fd and the
 * listeners' sockets; returns how many (at most idx_dyn_max_items). */
size_t idx_dyn_pollitems(idx_dyn *d, void *items, size_t max);
/* Milliseconds until idx_dyn_run is due again (-1 = no deadline). */
long idx_dyn_timeout_ms(const idx_dyn *d);
/* Read the sockets, tell the pipes what their links did and the time,
 * publish what is pending, serve HTTP. Never blocks. Stops reading once
 * HTTP is due (kvo_http_server_due) and serves it: what is left stays in
 * the sockets for the next run, which starts at the next worker. */
void idx_dyn_run(idx_dyn *d);

/* ---- Test seam: the invariant walker -------------------------------------- */

/* Walk every structure and check every invariant of idx_tree.c's header.
 * KVO_OK, or KVO_ESTATE with the first violation in msg. *unreachable (may
 * be NULL) gets the number of live nodes reachable neither from the root
 * nor from a lookup entry (only cycles fed by inconsistent hashes make
 * them, as in Dynamo). For tests: O(size of the tree). */
kvo_status idx_tree_check(const idx_tree *t, uint64_t *unreachable, char *msg,
                          size_t msgsz);

/* ======================================================================== */
/* The tree's layout: only for the files that define IDX_TREE_LAYOUT before  */
/* including this header (idx_tree.c, idx_table.c, idx_verify.c), so that    */
/* its short names (node, tab, NIL, TAG, mix...) stay out of everyone else's */
/* ======================================================================== */
#ifdef IDX_TREE_LAYOUT

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* ---- Tables (idx_table.c draws them) ------------------------------------ */

#define NIL 0xFFFFFFFFu /* no node, edge, slot, set or table position */
#define BW 8            /* slots per table bucket */
#define CACHE_LINE 64   /* bytes: one bucket */
#define BUCKET_ALL ((1u << BW) - 1) /* a mask with every slot of a bucket */

/* One cache line: the tags first, so a probe compares all 8 at once. */
typedef struct bucket {
    uint32_t tag[BW];
    uint32_t ref[BW]; /* 0 = empty (ref 0, the root, is never stored) */
} __attribute__((aligned(CACHE_LINE))) bucket;
_Static_assert(sizeof(bucket) == CACHE_LINE, "a bucket is one cache line");

typedef struct tab {
    bucket *bk; /* nb, cache-line aligned inside bk_mem */
    void *bk_mem;
    uint8_t *spill;   /* nb: keys of primary bucket b kept in their
                        secondary (saturates at 255, then sticks) */
    uint64_t *stash;  /* tag << 32 | ref: keys no bucket could take */
    uint32_t nb, len; /* len counts the stash too */
    uint32_t nstash, stash_cap;
    uint32_t rng;     /* displacement choices */
    void *next_mem;   /* the next growth's buckets, mapped ahead (NULL: */
    uint32_t next_nb; /* none) for next_nb buckets; its first next_touched */
    uint32_t next_touched; /* huge pages are faulted in (tab_prefault) */
    /* A growth under way (idx_table.c, tab_move): the old buckets [moved,
     * onb) still hold keys, placed by the old size; onb = 0: none. */
    bucket *obk;
    void *obk_mem;
    uint8_t *ospill; /* onb: spill[] of the old buckets (stays an upper
                        bound while keys move out) */
    uint32_t onb, moved;
    bool by2; /* grows by 2 at every size (a table of few keys, where a
                 growth by 4 would leave most of it empty) */
} tab;

/* The owner's view of its keys: does ref v name the key (a, b)? and the
 * 64-bit hash of the key v names. The table stores neither keys nor
 * hashes, only the top half of the hash (the tag). */
typedef bool (*tab_eq_fn)(const void *owner, uint32_t v, uint64_t a,
                          uint32_t b);
typedef uint64_t (*tab_hash_fn)(const void *owner, uint32_t v);

/* Insert (tag, v), an absent key whose first bucket is full (idx_tab_put,
 * below, is the whole insert). */
void idx_tab_put_displacing(tab *r, uint32_t tag, uint32_t v);
/* Clear the entry at position pos. */
void idx_tab_del(tab *r, uint32_t pos);
/* Room for `more` insertions (and a step of a growth under way); on
 * KVO_ENOMEM or KVO_ETOOBIG every key is still there. */
kvo_status idx_tab_reserve(tab *r, uint32_t more);
void idx_tab_fini(tab *r);            /* frees; the table is empty again */
uint64_t idx_tab_bytes(const tab *r); /* memory held (capacities) */
/* Invariant I7 of idx_tree.c: tags match their keys' hashes, keys sit in
 * one of their two buckets (or the stash, or an old bucket not moved yet),
 * spill counts are exact (or stuck; old ones an upper bound). false with
 * the first violation in msg, prefixed with name. */
bool idx_tab_check(const tab *r, tab_hash_fn hash, const void *owner,
                   const char *name, char *msg, size_t msgsz);

static inline uint32_t tab_hash_tag(uint64_t h) { return (uint32_t)(h >> 32); }

/* The tag is the hash's top half. The primary bucket is fastrange(tag),
 * the secondary a scramble of it, so neither growing nor displacing ever
 * reads a key; tags also filter probes (bucket-mates share only the bits
 * that chose the bucket). */
static inline uint32_t bucket1(uint32_t tag, uint32_t nb) {
    return (uint32_t)(((uint64_t)tag * nb) >> 32);
}

static inline uint32_t bucket2(uint32_t tag, uint32_t nb) {
    uint32_t x = tag * 0x9E3779B1u;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    return (uint32_t)(((uint64_t)x * nb) >> 32);
}

static inline uint32_t tab_b1(const tab *r, uint32_t tag) {
    return bucket1(tag, r->nb);
}

static inline uint32_t tab_b2(const tab *r, uint32_t tag) {
    return bucket2(tag, r->nb);
}

/* Positions: bucket * BW + slot; then nb * BW + i for stash entry i; then,
 * while a growth is under way, nb * BW + nstash + old bucket * BW + slot.
 * Every entry sits below tab_positions; a position holds until the table
 * next changes. */
static inline uint32_t tab_positions(const tab *r) {
    return r->nb * BW + r->nstash + r->onb * BW;
}

/* The slot at pos (NULL: a stash entry, *si its index). */
static inline uint32_t *tab_slot(const tab *r, uint32_t pos, uint32_t *tag,
                                 uint32_t *si) {
    uint32_t n = r->nb * BW;
    if (pos < n) {
        *tag = r->bk[pos / BW].tag[pos % BW];
        return &r->bk[pos / BW].ref[pos % BW];
    }
    if (pos - n < r->nstash) {
        *si = pos - n;
        *tag = (uint32_t)(r->stash[*si] >> 32);
        return NULL;
    }
    pos -= n + r->nstash;
    *tag = r->obk[pos / BW].tag[pos % BW];
    return &r->obk[pos / BW].ref[pos % BW];
}

static inline uint32_t tab_ref(const tab *r, uint32_t pos) {
    uint32_t tag, si, *s = tab_slot(r, pos, &tag, &si);
    return s ? *s : (uint32_t)r->stash[si];
}

static inline uint32_t tab_tag(const tab *r, uint32_t pos) {
    uint32_t tag, si;
    tab_slot(r, pos, &tag, &si);
    return tag;
}

/* Point the entry at pos at another ref with the same key. */
static inline void tab_ref_set(tab *r, uint32_t pos, uint32_t v) {
    uint32_t tag, si, *s = tab_slot(r, pos, &tag, &si);
    if (s)
        *s = v;
    else
        r->stash[si] = (uint64_t)tag << 32 | v;
}

/* Always inlined: gcc takes a function that only prefetches for one
 * without effects (ipa-pure-const) and drops its calls. */
static inline __attribute__((always_inline)) void tab_prefetch(const tab *r,
                                                               uint64_t h) {
    if (!r->nb) return;
    uint32_t b = tab_b1(r, tab_hash_tag(h));
    __builtin_prefetch(&r->bk[b]);
    __builtin_prefetch(&r->spill[b]);
}

/* Bit i set when tag[i] == tag (match) or ref[i] == 0 (hole). */
static inline unsigned bucket_match(const bucket *b, uint32_t tag) {
#ifdef __SSE2__
    __m128i k = _mm_set1_epi32((int)tag);
    __m128i lo = _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->tag), k);
    __m128i hi =
        _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->tag + 1), k);
    return (unsigned)(_mm_movemask_ps(_mm_castsi128_ps(lo)) |
                      _mm_movemask_ps(_mm_castsi128_ps(hi)) << 4);
#else
    unsigned m = 0;
    for (unsigned i = 0; i < BW; i++) m |= (unsigned)(b->tag[i] == tag) << i;
    return m;
#endif
}

static inline unsigned bucket_holes(const bucket *b) {
#ifdef __SSE2__
    __m128i z = _mm_setzero_si128();
    __m128i lo = _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->ref), z);
    __m128i hi =
        _mm_cmpeq_epi32(_mm_load_si128((const __m128i *)b->ref + 1), z);
    return (unsigned)(_mm_movemask_ps(_mm_castsi128_ps(lo)) |
                      _mm_movemask_ps(_mm_castsi128_ps(hi)) << 4);
#else
    unsigned m = 0;
    for (unsigned i = 0; i < BW; i++) m |= (unsigned)(b->ref[i] == 0) << i;
    return m;
#endif
}

/* The second stage, some work after tab_prefetch(h), when the first
 * bucket and its spill count are in: the key's second bucket, when the
 * first has spilled keys there (a find looks there) or is full (an insert
 * goes there), so that neither waits. */
static inline __attribute__((always_inline)) void
tab_prefetch_second(const tab *r, uint64_t h) {
    if (!r->nb) return;
    uint32_t tag = tab_hash_tag(h), b1 = tab_b1(r, tag);
    if (r->spill[b1] || !bucket_holes(&r->bk[b1]))
        __builtin_prefetch(&r->bk[tab_b2(r, tag)]);
}

/* Insert (tag, v), an absent key. idx_tab_reserve must have made room (a
 * failed displacement walk parks its last key in the stash). Inline for
 * the common case, a hole in the key's first bucket. */
static inline void idx_tab_put(tab *r, uint32_t tag, uint32_t v) {
    bucket *b = &r->bk[tab_b1(r, tag)];
    unsigned h = bucket_holes(b);
    if (!h) {
        idx_tab_put_displacing(r, tag, v);
        return;
    }
    unsigned i = (unsigned)__builtin_ctz(h);
    b->tag[i] = tag;
    b->ref[i] = v;
    r->len++;
}

/* The position (first + slot) of key (a, b) with this tag in bucket k, or
 * NIL. Always inlined, with eq a constant at each use, so that the compare
 * is a direct (and inlined) call. */
static inline __attribute__((always_inline)) uint32_t
tab_scan(const bucket *k, uint32_t first, uint32_t tag, tab_eq_fn eq,
         const void *owner, uint64_t a, uint32_t b) {
    for (unsigned m = bucket_match(k, tag) & ~bucket_holes(k); m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctz(m);
        if (eq(owner, k->ref[i], a, b)) return first + i;
    }
    return NIL;
}

/* The key's position among the old buckets not moved yet, or NIL. */
static inline __attribute__((always_inline)) uint32_t
tab_find_old(const tab *r, uint32_t tag, tab_eq_fn eq, const void *owner,
             uint64_t a, uint32_t b) {
    uint32_t base = r->nb * BW + r->nstash, pos;
    uint32_t b1 = bucket1(tag, r->onb);
    if (b1 >= r->moved && (pos = tab_scan(&r->obk[b1], base + b1 * BW, tag, eq,
                                          owner, a, b)) != NIL)
        return pos;
    if (!r->ospill[b1]) return NIL;
    uint32_t b2 = bucket2(tag, r->onb);
    if (b2 == b1 || b2 < r->moved) return NIL;
    return tab_scan(&r->obk[b2], base + b2 * BW, tag, eq, owner, a, b);
}

/* Position of key (a, b) whose hash is h, or NIL. */
static inline __attribute__((always_inline)) uint32_t
tab_find_h(const tab *r, uint64_t h, tab_eq_fn eq, const void *owner,
           uint64_t a, uint32_t b) {
    if (r->len == 0) return NIL;
    uint32_t tag = tab_hash_tag(h);
    uint32_t b1 = tab_b1(r, tag);
    uint32_t pos = tab_scan(&r->bk[b1], b1 * BW, tag, eq, owner, a, b);
    if (pos != NIL) return pos;
    if (r->spill[b1]) {
        uint32_t b2 = tab_b2(r, tag);
        if (b2 != b1 &&
            (pos = tab_scan(&r->bk[b2], b2 * BW, tag, eq, owner, a, b)) != NIL)
            return pos;
    }
    for (uint32_t j = 0; j < r->nstash; j++)
        if ((uint32_t)(r->stash[j] >> 32) == tag &&
            eq(owner, (uint32_t)r->stash[j], a, b))
            return r->nb * BW + j;
    return r->onb ? tab_find_old(r, tag, eq, owner, a, b) : NIL;
}

/* ---- Memory that never moves (idx_table.c) ------------------------------
 * Large blocks (HUGE_BYTES and more) are mapped 2 MiB-aligned and advised
 * as transparent huge pages: one fault per 2 MiB instead of 512, and far
 * fewer TLB misses when probes land at random. Smaller ones come from
 * kvo_malloc (so tests can make them fail). Nothing is ever realloc'd:
 * glibc grows a large block by mremap, and on this kind of machine each
 * 4 KiB page moved that way costs ~5 us again at its next first touch. */
#define HUGE_BYTES ((size_t)2 << 20)

void *idx_mem_alloc(size_t bytes);        /* NULL when out of memory */
void idx_mem_free(void *p, size_t bytes); /* the size given to alloc */

/* A slab: element i at base + i * elem, in one address range reserved
 * whole when the slab first grows (address space, not memory: the memory
 * comes at first touch), so an element never moves and is one
 * multiply-add away. Its first 64 KiB are small pages (a small tree stays
 * small; more when small is set), the rest huge pages. It grows in pieces,
 * whole huge pages from HUGE_BYTES on and pages (doubling) below: the
 * capacity counted, and under strict overcommit (where a writable range
 * is charged whole) what is opened. Where address space is short the
 * range is what the kernel gave, and the slab cannot grow past it. */
typedef struct slab {
    /* A pointer type, not an integer: a store to a node's u64 field then
     * cannot alias it, so the compiler keeps it in a register. */
    char *base;      /* NULL: nothing reserved yet */
    size_t reserved; /* bytes of the range */
    size_t usable;   /* bytes usable from base (page multiple) */
    uint32_t cap;    /* elements usable */
    bool open;       /* the whole range is writable (else opened up to
                        usable, by mprotect: strict overcommit) */
    size_t small;    /* bytes after the first 64 KiB on small pages too,
                        until the slab grows past them: then they are
                        collapsed into huge pages (a multiple of 2 MiB, set
                        before the first reserve) */
} slab;

static inline void *slab_at(const slab *v, uint32_t i, size_t elem) {
    return v->base + (size_t)i * elem;
}
/* Room for need elements of at most max (the range is reserved for max):
 * KVO_OK, KVO_ETOOBIG (need > max), KVO_ENOMEM (no address space or no
 * memory left; also an injected failure, kvo_alloc_fail_after). A failure
 * changes nothing. */
kvo_status idx_slab_reserve(slab *v, uint32_t need, uint32_t max, size_t elem);
void idx_slab_fini(slab *v); /* unmaps; empty again */

/* ---- The tree (idx_tree.c draws it; idx_verify.c walks it) -------------- */

#define DEAD 0xFFFFFFFEu
#define TAG 0x80000000u
#define ROOT 0u
#define SET_CLASSES 26     /* class c = a block of 4 << c words */
#define SET_MIN_WORDS 4    /* words of class 0: a header and 3 slots */
#define SET_CLASS_SHIFT 24 /* set header word: class << 24 | count */
#define SET_MAX_COUNT 0xFFFFFFu

/* A node is 20 bytes at one u32 index, in three slabs: its two hashes,
 * tok[] and blk[] (u64), and a meta word, meta[] (u32), which holds the
 * node's links, worker set and reference count in place ("lean"; "far"
 * when only the parent and next sibling do not fit: they go to a record)
 * or, when another field does not fit, as the index of a fat record:
 *
 *   lean  31 30 29 28 27   24 23                                   0
 *         +--+-----+--+------+--------------------------------------+
 *         | 0|par. |ch| refs |  wset: one slot; M_WSET: none        |
 *         +--+-----+--+------+--------------------------------------+
 *   fat   | 1|            index into fats[]                         |
 *         +--+------------------------------------------------------+
 *
 *   par.  the parent: P_NIL none, P_PREV n - 1, P_DEAD free or being freed
 *         (next is NIL for these three); P_FAR: the parent and next are in
 *         a farrec that the table `far` finds by n ("far" nodes)
 *   ch    the first child edge is n + 1 (else none)
 *
 * A chain stored in one event is n, n + 1, ... (the lowest free indexes),
 * each the lone child of the one before and held by one worker: lean all
 * along. A node with siblings or a parent elsewhere (where a prompt
 * branches off) is far: what a query reads of it (worker, child) stays in
 * the word, and only edits look up its links; it turns lean again when
 * they fit. Fat are the nodes with two workers or more, a child
 * elsewhere, or more than M_REFS_MAX references; a node stays fat until
 * it is freed. */
#define M_FAT 0x80000000u
#define M_PARENT_SHIFT 29
#define M_PARENT (3u << M_PARENT_SHIFT)
#define P_NIL 0u
#define P_PREV 1u
#define P_DEAD 2u
#define P_FAR 3u
#define M_CHILD 0x10000000u
#define M_REFS_SHIFT 24
#define M_REFS_MAX 15u
#define M_REFS (M_REFS_MAX << M_REFS_SHIFT)
#define M_WSET 0x00FFFFFFu /* slots are below MAX_SLOTS < M_WSET */
#define M_NEW (P_NIL << M_PARENT_SHIFT | M_WSET) /* no link, worker, ref */

/* A far node's links (its other fields are in its word). */
typedef struct farrec {
    uint32_t node; /* NIL: a free record (next links the free list) */
    uint32_t parent;
    uint32_t next;
} farrec;

typedef struct fat {
    uint32_t parent; /* NIL: none; DEAD: free or being freed */
    uint32_t child;  /* first edge of the child list */
    uint32_t next;   /* following edge in the parent's list */
    uint32_t wset;   /* NIL, a slot, or TAG|offset of a pooled set; DEAD:
                        a free record (next links the free list) */
    uint32_t refs;   /* lookup entries + alias edges naming the node */
} fat;

typedef struct ealias {
    uint64_t tokens_hash;
    uint32_t parent; /* DEAD when free */
    uint32_t child;
    uint32_t next; /* list link, or free-list link */
    uint32_t spare;
} ealias;

typedef struct lalias {
    uint64_t block_hash;
    uint32_t slot; /* NIL when free */
    uint32_t node; /* or free-list link */
} lalias;

typedef struct orphan {
    uint64_t parent_hash; /* the block_hash it was cut from */
    uint64_t block_hash;  /* the node's, when it was cut */
    uint32_t node;        /* NIL: a free record */
    uint32_t next; /* the parent's next orphan, or the free list: NIL ends */
} orphan;

typedef struct wslot {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint8_t present; /* known to the tree (Dynamo: has a lookup map) */
    uint8_t tier;    /* the wire_tier whose blocks this slot holds */
    uint64_t blocks; /* lookup entries */
    tab look;        /* this worker's lookup: block_hash -> lookup ref */
} wslot;

#define FREE_LEVELS 3 /* a bit per node, per word, per word of words */

struct idx_tree {
    slab tok;  /* u64 tokens_hash, by node index */
    slab blk;  /* u64 block_hash, by node index; same capacity as tok */
    slab meta; /* u32 meta word, by node index; same capacity as tok */
    /* The free node indexes: a bitmap of FREE_LEVELS levels of u64 words
     * (idx_tree.c, "Free nodes"); no index below nd_low is free. */
    slab free[FREE_LEVELS];
    uint32_t nd_len, nd_cap, nd_low, nd_live; /* nd_live excludes root */

    ealias *ea;
    uint32_t ea_len, ea_cap, ea_free, ea_live;
    lalias *la;
    uint32_t la_len, la_cap, la_free, la_live;

    uint32_t *sp;
    uint32_t sp_len, sp_cap, sp_live;
    uint32_t sp_step; /* words one set growth may take */
    uint32_t sp_free[SET_CLASSES];

    slab fats; /* fat node records; free ones link through next */
    uint32_t fat_len, fat_free, fat_live;
    slab fars; /* far node records (farrec); free ones link through next */
    tab far;   /* far node -> 1 + its record in fars */
    uint32_t far_len, far_free;

    tab edges;

    wslot *ws;
    uint32_t ws_len, ws_cap;
    uint32_t *wmap; /* power of two, NIL = empty */
    uint32_t wmap_cap;

    uint32_t *act;        /* query scratch, ws_cap entries */
    uint32_t *path;       /* query scratch: the nodes of a query's path */
    size_t path_cap;      /* (used only while lower-tier slots exist) */
    uint32_t lower_slots; /* slots of a tier below device */
    /* Orphans: offloaded blocks a detach cut from their parent, by the
     * parent's block_hash -> 1 + the first record of a list in orph[],
     * relinked when a store brings that block back (idx_tree.c) */
    kvo_map orphans;
    struct orphan *orph;
    uint32_t orph_len, orph_cap, orph_free, orph_live;
    uint64_t orph_sweep_at; /* orph_live that triggers the next sweep */
    uint32_t dying;
    uint64_t pairs;
    uint64_t held; /* live nodes with a non-empty worker set */
    idx_counters c;
};

#define TOK(t, n) (*(uint64_t *)slab_at(&(t)->tok, (n), sizeof(uint64_t)))
#define BLK(t, n) (*(uint64_t *)slab_at(&(t)->blk, (n), sizeof(uint64_t)))
#define META(t, n) (*(uint32_t *)slab_at(&(t)->meta, (n), sizeof(uint32_t)))
#define FAT(t, i) (*(fat *)slab_at(&(t)->fats, (i), sizeof(fat)))
#define FAR(t, i) (*(farrec *)slab_at(&(t)->fars, (i), sizeof(farrec)))

/* The hash of the tables' keys (and of the worker map's). */
static inline uint64_t mix(uint64_t a, uint32_t b) {
    uint64_t x =
        a ^ ((uint64_t)b * 0x9E3779B97F4A7C15ull) ^ 0x2545F4914F6CDD1Dull;
    x ^= x >> 32;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    return x;
}

/* ---- A node's fields, read through its meta word (lean, far or fat) ---- */

static inline const fat *fat_of(const idx_tree *t, uint32_t m) {
    return &FAT(t, m & ~M_FAT);
}

/* A far node's record: the table `far` maps the node to 1 + its index
 * (a ref is never 0). */
static inline uint64_t far_hash(uint32_t n) { return mix(n, 0); }
static inline bool far_eq(const void *owner, uint32_t v, uint64_t n,
                          uint32_t unused) {
    (void)unused;
    return FAR((const idx_tree *)owner, v - 1).node == (uint32_t)n;
}
static inline uint32_t far_pos(const idx_tree *t, uint32_t n) {
    return tab_find_h(&t->far, far_hash(n), far_eq, t, n, 0);
}
static inline uint32_t far_index(const idx_tree *t, uint32_t n) {
    return tab_ref(&t->far, far_pos(t, n)) - 1;
}
static inline bool meta_far(uint32_t m) {
    return !(m & M_FAT) && (m & M_PARENT) == P_FAR << M_PARENT_SHIFT;
}

static inline uint32_t nd_parent(const idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n), k = (m & M_PARENT) >> M_PARENT_SHIFT;
    if (m & M_FAT) return fat_of(t, m)->parent;
    if (k == P_FAR) return FAR(t, far_index(t, n)).parent;
    return k == P_PREV ? n - 1 : k == P_DEAD ? DEAD : NIL;
}
static inline uint32_t nd_child(const idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (m & M_FAT) return fat_of(t, m)->child;
    return (m & M_CHILD) ? n + 1 : NIL;
}
static inline uint32_t nd_next(const idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (m & M_FAT) return fat_of(t, m)->next;
    return meta_far(m) ? FAR(t, far_index(t, n)).next : NIL;
}
static inline uint32_t nd_wset(const idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    if (m & M_FAT) return fat_of(t, m)->wset;
    return (m & M_WSET) == M_WSET ? NIL : (m & M_WSET);
}
static inline uint32_t nd_refs(const idx_tree *t, uint32_t n) {
    uint32_t m = META(t, n);
    return (m & M_FAT) ? fat_of(t, m)->refs : (m & M_REFS) >> M_REFS_SHIFT;
}

/* The words level k of the free-node bitmap needs to cover n nodes. */
static inline uint32_t free_words(uint32_t n, int k) {
    uint32_t shift = 6 * (uint32_t)(k + 1);
    return (uint32_t)(((uint64_t)n + (1ull << shift) - 1) >> shift);
}
/* Word i of level k of the free-node bitmap. */
static inline uint64_t *free_word(const idx_tree *t, int k, uint32_t i) {
    return (uint64_t *)slab_at(&t->free[k], i, sizeof(uint64_t));
}

/* ---- Edge refs: n = n's primary edge, TAG|i = alias edge ea[i] ---------- */

static inline uint32_t edge_next(const idx_tree *t, uint32_t e) {
    return (e & TAG) ? t->ea[e & ~TAG].next : nd_next(t, e);
}
static inline uint64_t edge_key(const idx_tree *t, uint32_t e) {
    return (e & TAG) ? t->ea[e & ~TAG].tokens_hash : TOK(t, e);
}
static inline uint32_t edge_child(const idx_tree *t, uint32_t e) {
    return (e & TAG) ? t->ea[e & ~TAG].child : e;
}
static inline uint32_t edge_parent(const idx_tree *t, uint32_t e) {
    return (e & TAG) ? t->ea[e & ~TAG].parent : nd_parent(t, e);
}

/* The hash of the edge key (tokens_hash th, parent p). Its top half, the
 * table's tag, is a hash of th XOR a bijection of p: for one th, two
 * parents never share a tag. */
static inline uint64_t edge_hash(uint64_t th, uint32_t p) {
    uint32_t x = p * 0x9E3779B1u;
    x ^= x >> 15;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    uint64_t k = mix(th, 0);
    return ((k >> 32) ^ x) << 32 | (uint32_t)k;
}

/* Does edge ref v, whose tag matched the key's (the table compares tags
 * first), name the key (tokens_hash th, parent p)? An equal tokens_hash
 * is enough (edge_hash): a probe never reads the parent, which a node
 * with siblings keeps in its far record. */
static inline bool edge_eq(const void *owner, uint32_t v, uint64_t th,
                           uint32_t p) {
    const idx_tree *t = owner;
    (void)p;
    return edge_key(t, v) == th;
}

static inline uint32_t edge_find(const idx_tree *t, uint32_t p, uint64_t th) {
    return tab_find_h(&t->edges, edge_hash(th, p), edge_eq, t, th, p);
}

/* ---- Lookup refs: n = inline entry of node n, TAG|i = la[i] ------------ */

static inline uint32_t look_node(const idx_tree *t, uint32_t v) {
    return (v & TAG) ? t->la[v & ~TAG].node : v;
}
static inline uint64_t look_block_hash(const idx_tree *t, uint32_t v) {
    return (v & TAG) ? t->la[v & ~TAG].block_hash : BLK(t, v);
}
/* Does lookup ref v, an entry of slot w's table, name block_hash bh? (Every
 * entry of ws[w].look is w's: the table says the slot.) */
static inline bool look_eq(const void *owner, uint32_t v, uint64_t bh,
                           uint32_t w) {
    (void)w;
    return look_block_hash(owner, v) == bh;
}

/* The position of (w, bh) in look, whose hash h = mix(bh, w), or NIL. */
static inline __attribute__((always_inline)) uint32_t
look_find_h(const idx_tree *t, uint32_t w, uint64_t bh, uint64_t h) {
    return tab_find_h(&t->ws[w].look, h, look_eq, t, bh, w);
}

static inline uint32_t look_find(const idx_tree *t, uint32_t w, uint64_t bh) {
    return look_find_h(t, w, bh, mix(bh, w));
}

/* ---- Worker sets: header word = class << 24 | count, then the slots ---- */

static inline uint32_t set_count(const uint32_t *s) {
    return s[0] & SET_MAX_COUNT;
}
static inline uint32_t set_class(const uint32_t *s) {
    return s[0] >> SET_CLASS_SHIFT;
}
static inline uint32_t class_words(uint32_t cls) {
    return SET_MIN_WORDS << cls;
}
static inline uint32_t class_items(uint32_t cls) {
    return class_words(cls) - 1;
}

/* ---- Worker map: (worker_id, dp_rank, tier) -> slot, linear probing ----- */

static inline uint32_t wmap_home(const idx_tree *t, uint64_t wid, uint32_t rank,
                                 uint32_t tier) {
    return (uint32_t)(mix(wid, rank) + tier) & (t->wmap_cap - 1);
}

static inline uint32_t slot_find(const idx_tree *t, uint64_t wid, uint32_t rank,
                                 uint32_t tier) {
    if (!t->wmap_cap) return NIL;
    for (uint32_t i = wmap_home(t, wid, rank, tier);;
         i = (i + 1) & (t->wmap_cap - 1)) {
        uint32_t s = t->wmap[i];
        if (s == NIL) return NIL;
        if (t->ws[s].worker_id == wid && t->ws[s].dp_rank == rank &&
            t->ws[s].tier == tier)
            return s;
    }
}

#endif /* IDX_TREE_LAYOUT */

#endif /* IDX_INT_H */
