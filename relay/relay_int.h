/* relay_int.h -- the relay's internals: the pipeline (relay_pipe.c) with
 * its counters, the counters' views (relay_stats.c), and the pieces
 * relay_run.c glues together (ZMQ sources, the NATS publisher). Tests and
 * benchmarks of the relay include it; programs use relay.h.
 */
#ifndef RELAY_INT_H
#define RELAY_INT_H

#include "kvo.h"
#include "kvo_map.h"
#include "relay.h"
#include "wire.h"

/* ==== The pipeline =========================================================
 *
 * relay_pipe is the pure part of the relay: no sockets, no clocks of its
 * own, no logging. ZMQ frames go in (relay_pipe_live, relay_pipe_replay);
 * envelopes, replay requests and log lines come out through a relay_out
 * table; times are handed in by the caller. It depends on kvo.h and wire.h
 * only. The per-source state machine is drawn in relay_pipe.c.
 *
 *   relay_pipe_new -> relay_pipe_source_add (per publisher)
 *     -> relay_pipe_start (after the output is up)
 *     -> { relay_pipe_live | relay_pipe_replay }* relay_pipe_flush
 *        relay_pipe_tick (replay timeouts; relay_pipe_deadline says when)
 *     -> relay_pipe_free
 */

/* Most sources (ZMQ publishers) one pipe serves. */
#define RELAY_MAX_SOURCES 64

/* What a relay_pipe_cfg field left 0 becomes, and what it bounds:
 *   REPLAY_TIMEOUT_MS  a replay silent this long has failed;
 *   BUFFER_BATCHES/BYTES  live batches (and their payload bytes) held per
 *                      source while its replay runs;
 *   MAX_EVENTS         RouterEvents per envelope (DESIGN §6), and the most a
 *                      cfg may ask for;
 *   MAX_BLOCKS         stored blocks + removed hashes per envelope, likewise;
 *   VERIFY_BLOCKS      engine digests remembered for --verify-engine-hash;
 *   RING_ENVELOPES/BYTES  envelopes (and their bytes) kept for recovery
 *                      requests (--recovery-buffer, --recovery-buffer-mb). */
#define RELAY_PIPE_REPLAY_TIMEOUT_MS 5000u
#define RELAY_PIPE_BUFFER_BATCHES 100000u
#define RELAY_PIPE_BUFFER_BYTES (256u << 20)
#define RELAY_PIPE_MAX_EVENTS 128u
#define RELAY_PIPE_MAX_BLOCKS 8192u
#define RELAY_PIPE_VERIFY_BLOCKS (4u << 20)
#define RELAY_PIPE_RING_ENVELOPES 4096u
#define RELAY_PIPE_RING_BYTES (64u << 20)

/* Times handed to the pipe are nanoseconds; configured ones milliseconds. */
#define RELAY_NS_PER_MS 1000000u

/* ---- Counters ------------------------------------------------------------
 * Every counter is on GET /metrics (kvo_relay_<name>_total), in GET /stats
 * and the exit JSON (key <name>), the main ones in the periodic log line
 * (relay.h says what the service adds). */
#define RELAY_COUNTERS(X)                                                      \
    X(batches_live, "batches received on the SUB socket")                      \
    X(batches_replayed, "batches received as replay replies")                  \
    X(batches_applied, "batches applied in sequence order")                    \
    X(events_stored, "BlockStored events decoded")                             \
    X(events_removed, "BlockRemoved events decoded")                           \
    X(events_cleared, "AllBlocksCleared events decoded")                       \
    X(blocks_stored, "blocks in BlockStored events decoded")                   \
    X(blocks_removed, "hashes in BlockRemoved events decoded")                 \
    X(blocks_other_group, "blocks of KV-cache groups other than 0 (the full-"  \
                          "attention group a router indexes): not forwarded")  \
    X(gaps, "sequence gaps seen")                                              \
    X(replays_requested, "replay requests sent")                               \
    X(replays_completed, "replays that reached their end marker")              \
    X(replays_applied, "batches applied from replay replies")                  \
    X(replay_stray, "replay replies with no replay outstanding")               \
    X(restarts, "publisher restarts (sequence went back)")                     \
    X(cleared_emitted, "times the relay cleared a rank itself (start, "        \
                       "restart, unrecoverable gap): one cleared per tier")    \
    X(duplicates_dropped, "batches dropped because seq <= last applied")       \
    X(live_buffered, "live batches buffered while a replay ran")               \
    X(buffer_dropped, "live batches dropped: replay buffer full")              \
    X(buffer_discarded, "buffered batches discarded by a restart")             \
    X(dedup_suppressed, "removes held back: other copies still stored")        \
    X(removes_unknown, "removes of hashes with no stored copy (forwarded)")    \
    X(tier_hash_reused, "blocks of lower-tier stores without extra_keys that " \
                        "took the tokens_hash the rank's device tier holds "   \
                        "for them (with the salt and multimodal keys)")        \
    X(tier_hash_computed, "blocks of lower-tier stores without extra_keys "    \
                          "the device tier did not hold: tokens_hash from "    \
                          "token_ids alone (no salt, no multimodal keys)")     \
    X(revents_stored, "stored RouterEvents forwarded")                         \
    X(revents_removed, "removed RouterEvents forwarded")                       \
    X(revents_cleared, "cleared RouterEvents forwarded")                       \
    X(blocks_forwarded, "stored blocks forwarded")                             \
    X(removes_forwarded, "removed hashes forwarded")                           \
    X(messages_published, "envelopes published")                               \
    X(watermark_messages, "envelopes with an empty payload (watermark only)")  \
    X(bytes_published, "envelope bytes published")                             \
    X(publish_dropped, "envelopes NATS could not send or buffer")              \
    X(nats_disconnects, "NATS disconnections")                                 \
    X(nats_reconnects, "NATS reconnections")                                   \
    X(hash_verified, "stored blocks whose engine hash was recomputed")         \
    X(hash_mismatches, "stored blocks whose engine hash did not match")        \
    X(hash_unknown_parent, "blocks not verifiable: parent digest unknown")     \
    X(hash_unsupported, "blocks not verifiable: extra keys not lora/salt, "    \
                        "or deferred (a lower tier's store without them)")     \
    X(state_dropped, "forwarded blocks the state could not record (out of "    \
                     "memory): a dump would miss them")                        \
    X(recovery_envelopes_sent, "envelopes sent in recovery replies")           \
    X(dumps_sent, "dumps sent to their end")                                   \
    X(dump_blocks_sent, "blocks sent in dumps")                                \
    X(dump_orphans, "dumped blocks whose parent was no longer held (sent "     \
                    "under the root)")                                         \
    X(recovery_bad_requests, "requests not understood (no answer sent)")       \
    X(recovery_replies_failed, "replies abandoned before their end (a "        \
                               "message could not be sent)")                   \
    X(recovery_requests_dropped, "requests dropped: too many waiting")         \
    X(discover_requests, "discover requests answered with the announce")       \
    X(announces_sent, "announces published (start, heartbeat, discover)")      \
    RELAY_SOURCE_COUNTERS(X)

/* Counted per source as well (relay_stats.src[i]; the totals are in
 * RELAY_COUNTERS): each source's are in its /stats "sources" entry and on
 * /metrics as kvo_relay_source_<name>_total{source="<i>"}. What the ZMQ
 * sockets did comes from libzmq's socket monitor (relay_source_event). */
#define RELAY_SOURCE_COUNTERS(X)                                               \
    X(zmq_disconnects, "ZMQ connections lost (SUB or replay DEALER)")          \
    X(zmq_reconnects, "SUB connections back after a loss (then replayed)")     \
    X(zmq_protocol_errors, "ZMTP handshakes failed (protocol, auth, other)")   \
    X(zmq_sockets_reopened,                                                    \
      "SUBs recreated: libzmq dropped them for good (e.g. a frame over "       \
      "--zmq-max-msg-bytes)")                                                  \
    X(oversize, "batches lost: their frame broke the replay connection "       \
                "twice (over --zmq-max-msg-bytes); the rank was cleared")

/* Counted by kind (label "kind" on /metrics, an object in JSON). */
#define RELAY_BAD_MSG_KINDS(X)                                                 \
    X(frames, "not exactly 3 frames")                                          \
    X(seq, "sequence frame not 8 bytes")                                       \
    X(replay_frames, "replay reply with an unknown frame layout")

#define RELAY_REJECT_KINDS(X)                                                  \
    X(token_count, "token count != blocks x block_size")                       \
    X(token_range, "token id >= 2^32 (the router hashes u32 ids)")             \
    X(block_size, "block_size != --block-size")                                \
    X(medium, "unknown medium")                                                \
    X(no_tokens, "non-GPU store without tokens (cannot be hashed)")            \
    X(empty, "event without block hashes")                                     \
    X(extra_keys, "extra_keys the router hash cannot read (not one entry "     \
                  "per block of adapter, (mm id, offset) pairs, salt)")        \
    X(dp_rank, "data_parallel_rank out of range (or too many ranks)")

#define RELAY_REPLAY_FAIL_KINDS(X)                                             \
    X(no_endpoint, "no replay endpoint")                                       \
    X(window_exceeded, "first replayed seq > requested")                       \
    X(incomplete, "replay ended before the gap was covered")                   \
    X(timeout, "no replay reply within --replay-timeout-ms")                   \
    X(request_failed, "the replay request could not be sent")

/* Recovery requests by what answered them (label "kind"). */
#define RELAY_RECOVERY_KINDS(X)                                                \
    X(events, "answered with envelopes from the ring")                         \
    X(dump, "answered with a dump of the forwarded state")                     \
    X(too_new, "asked for a sequence beyond the last published")

/* Gauges: what the relay holds right now (/metrics, /stats). */
#define RELAY_GAUGES(X)                                                        \
    X(state_blocks, "blocks in the forwarded state")                           \
    X(state_bytes, "bytes the forwarded state holds")                          \
    X(ring_envelopes, "envelopes kept for recovery requests")                  \
    X(ring_bytes, "envelope bytes kept for recovery requests")

#define RELAY_ENUM_KIND(name, help) RELAY_##name,
typedef enum {
    RELAY_BAD_MSG_KINDS(RELAY_ENUM_KIND) RELAY_BAD_MSG_COUNT
} relay_bad_msg;
typedef enum {
    RELAY_REJECT_KINDS(RELAY_ENUM_KIND) RELAY_REJECT_COUNT
} relay_reject;
typedef enum {
    RELAY_REPLAY_FAIL_KINDS(RELAY_ENUM_KIND) RELAY_REPLAY_FAIL_COUNT
} relay_replay_fail;
typedef enum {
    RELAY_RECOVERY_KINDS(RELAY_ENUM_KIND) RELAY_RECOVERY_COUNT
} relay_recovery_kind;
#undef RELAY_ENUM_KIND

/* Bytes kept of a mismatching byte-string hash: a whole SHA-256 digest. */
#define RELAY_MISMATCH_BYTES 32

typedef struct relay_mismatch {
    uint64_t seq;   /* ZMQ sequence of the batch */
    uint32_t event; /* index of the event in the batch */
    uint32_t block; /* index of the block in the event */
    wire_digest expected;
    wire_hash got; /* bytes copied into got_bytes (the first
                        * RELAY_MISMATCH_BYTES; got.bytes is NULL) */
    uint8_t got_bytes[RELAY_MISMATCH_BYTES];
} relay_mismatch;

typedef struct relay_src_stats {
#define RELAY_FIELD(name, help) uint64_t name;
    RELAY_SOURCE_COUNTERS(RELAY_FIELD)
#undef RELAY_FIELD
} relay_src_stats;

typedef struct relay_stats {
#define RELAY_FIELD(name, help) uint64_t name;
    RELAY_COUNTERS(RELAY_FIELD)
#undef RELAY_FIELD
    uint32_t n_src; /* sources in src[] */
    relay_src_stats src[RELAY_MAX_SOURCES];
    uint64_t bad_msgs[RELAY_BAD_MSG_COUNT];
    uint64_t decode_errors[KVO_STATUS_COUNT]; /* by status (EPROTO...) */
    uint64_t rejects[RELAY_REJECT_COUNT];
    uint64_t replay_failures[RELAY_REPLAY_FAIL_COUNT];
    uint64_t recovery_requests[RELAY_RECOVERY_COUNT];
#define RELAY_FIELD(name, help) uint64_t name;
    RELAY_GAUGES(RELAY_FIELD)
#undef RELAY_FIELD
    /* Gauges, filled in by whoever owns the value. */
    uint64_t buffer_depth;        /* live batches waiting for replays */
    uint64_t nats_buffered;       /* messages in the reconnect buffer */
    uint64_t nats_buffered_total; /* messages that went through it */
    bool nats_connected;
    bool has_mismatch;
    relay_mismatch first_mismatch;
} relay_stats;

/* Sums over the labelled counters, for the JSON totals and the log line. */
uint64_t relay_stats_decode_errors(const relay_stats *s);
uint64_t relay_stats_rejects(const relay_stats *s);
uint64_t relay_stats_replay_failures(const relay_stats *s);
uint64_t relay_stats_recovery_requests(const relay_stats *s);

/* ---- The pipeline seam ---------------------------------------------------*/

/* Where the pipeline's output goes. Callbacks run inside pipe calls, on the
 * caller's thread; pointers they receive are valid during the call only. */
typedef struct relay_out {
    void *ctx;
    /* One envelope for subject. has_range: the message carries the header
     * KVO-Zmq-Seq: first-last. A non-OK status counts as publish_dropped. */
    kvo_status (*publish)(void *ctx, const char *subject, bool has_range,
                          uint64_t first, uint64_t last, const uint8_t *body,
                          size_t len);
    /* Ask source src's replay endpoint for every batch from seq on. */
    kvo_status (*replay_request)(void *ctx, uint32_t src, uint64_t from_seq);
    /* Forget an outstanding replay of src (its late replies must never
     * reach the pipe: e.g. reopen the DEALER). May be NULL. */
    void (*replay_abort)(void *ctx, uint32_t src);
    /* A line worth logging; kind names the site so the receiver can rate
     * limit per kind ("decode", "reject", "cleared", ...). May be NULL. */
    void (*note)(void *ctx, kvo_level level, const char *kind, const char *msg);
} relay_out;

typedef struct relay_pipe_cfg {
    uint64_t worker_id;
    uint32_t block_size; /* expected engine block size (16) */
    uint64_t publisher_id;
    const char *subject;  /* namespace.<ns>.component.<c>.kv-events */
    bool replay_from_set; /* --replay-from given */
    uint64_t replay_from;
    /* 0 below = the RELAY_PIPE_* default above */
    uint64_t replay_timeout_ms;  /* RELAY_PIPE_REPLAY_TIMEOUT_MS */
    uint32_t buffer_max_batches; /* RELAY_PIPE_BUFFER_BATCHES */
    size_t buffer_max_bytes;     /* RELAY_PIPE_BUFFER_BYTES */
    uint32_t max_events;         /* per message; RELAY_PIPE_MAX_EVENTS */
    uint32_t max_blocks;         /* per message; RELAY_PIPE_MAX_BLOCKS */
    bool verify;                 /* --verify-engine-hash */
    wire_algo verify_algo;
    const char *hash_seed;      /* PYTHONHASHSEED string ("0") */
    uint32_t verify_max_blocks; /* RELAY_PIPE_VERIFY_BLOCKS */
    size_t ring_max_envelopes;  /* RELAY_PIPE_RING_ENVELOPES */
    size_t ring_max_bytes;      /* RELAY_PIPE_RING_BYTES */
    const wire_limits *limits;  /* decoder limits; NULL = defaults */
} relay_pipe_cfg;

typedef struct relay_pipe relay_pipe;

typedef enum relay_src_state {
    RELAY_SRC_LIVE = 0,
    RELAY_SRC_REPLAYING
} relay_src_state;

/* What a source's ZMQ sockets did, as libzmq's socket monitor tells it
 * (relay_source_event reads it, relay_pipe_link acts on it). */
typedef enum relay_link {
    RELAY_LINK_SUB_UP = 0,       /* the SUB finished a handshake */
    RELAY_LINK_SUB_DOWN,         /* the SUB lost its connection */
    RELAY_LINK_SUB_REOPENED,     /* libzmq would not reconnect it: the SUB
                                  * was closed and made anew */
    RELAY_LINK_REPLAY_DOWN,      /* the replay DEALER lost its connection */
    RELAY_LINK_HANDSHAKE_FAILED, /* a handshake failed (either socket) */
    RELAY_LINK_COUNT
} relay_link;

/* Read-only view of one source (for /stats and tests). */
typedef struct relay_src_info {
    uint32_t dp_rank; /* last rank seen (or the fallback) */
    relay_src_state state;
    bool connected; /* the SUB is up, as the last link event said */
    bool has_next;
    uint64_t next_seq; /* next sequence expected */
    uint32_t buffered; /* live batches waiting */
} relay_src_info;

/* cfg and out are copied (strings must outlive the pipe). */
kvo_status relay_pipe_new(relay_pipe **out, const relay_pipe_cfg *cfg,
                          const relay_out *o);
void relay_pipe_free(relay_pipe *p);
/* Add a source (one ZMQ publisher). fallback_rank is used for batches that
 * carry no data_parallel_rank. Ids are 0, 1, ... in order; KVO_ETOOBIG
 * past RELAY_MAX_SOURCES. */
kvo_status relay_pipe_source_add(relay_pipe *p, uint32_t fallback_rank,
                                 bool has_replay, uint32_t *id);
/* Begin: with replay_from_set, publish cleared per source and request the
 * replay (live batches are buffered meanwhile). Call once, when publish
 * can deliver (the service: once NATS is up).
 * Times are monotonic nanoseconds (kvo_now_ns) supplied by the caller. */
void relay_pipe_start(relay_pipe *p, uint64_t now_ns);
/* One SUB message as frames (must be exactly 3: topic, seq, payload). */
void relay_pipe_live(relay_pipe *p, uint32_t src, const wire_frame *frames,
                     uint32_t n, uint64_t now_ns);
/* One DEALER message: ["", topic, seq, payload] or ["", seq, payload];
 * seq FF x 8 with an empty payload ends the replay. */
void relay_pipe_replay(relay_pipe *p, uint32_t src, const wire_frame *frames,
                       uint32_t n, uint64_t now_ns);
/* Publish what is pending (the caller's socket has nothing more to read). */
void relay_pipe_flush(relay_pipe *p);
/* What src's sockets did. A SUB that comes back after a loss may have
 * missed batches, and its engine may have restarted while idle: the pipe
 * replays from the last batch applied and compares it with what comes back
 * (relay_pipe.c draws the probe): other bytes, or nothing, is a restart
 * (cleared, replay from 0). A replay whose
 * connection drops is asked again from where it stopped; when it drops
 * twice right before the same batch, that batch cannot be received (libzmq
 * drops a connection on a frame over ZMQ_MAXMSGSIZE, on the DEALER as on
 * the SUB): it is counted as oversize, the rank cleared, the watermark
 * moved past it, and the replay goes on after it. */
void relay_pipe_link(relay_pipe *p, uint32_t src, relay_link what,
                     uint64_t now_ns);
/* Replay timeouts. */
void relay_pipe_tick(relay_pipe *p, uint64_t now_ns);
/* Earliest replay deadline (0 = none), for the poll timeout. */
uint64_t relay_pipe_deadline(const relay_pipe *p);

/* ---- Recovery (docs/recovery.md) -----------------------------------------
 * The pipe keeps a ring of its last envelopes (relay_ring) and its
 * forwarded state (relay_state, which is also the dedup counts), and
 * answers a recovery request with a reply stream. */

/* One message of a reply stream, for the request's inbox: its
 * KVO-Recovery kind, KVO-Zmq-Seq first-last when has_range, the body. A
 * non-OK status abandons the stream. */
typedef kvo_status (*relay_reply_fn)(void *ctx, wire_reply_kind kind,
                                     bool has_range, uint64_t first,
                                     uint64_t last, const uint8_t *body,
                                     size_t len);

/* Request bodies longer than this are bad requests (one is ~40 bytes). */
#define RELAY_RECOVERY_REQUEST_MAX 1024u
/* The most ranks relay_pipe_ranks can name. */
#define RELAY_PIPE_MAX_RANKS (RELAY_STATE_MAX_RANKS + 2u * RELAY_MAX_SOURCES)

/* What relay_pipe_recover answered. */
typedef struct relay_recovery {
    wire_reply_kind kind; /* EVENTS, DUMP or TOO_NEW */
    uint64_t sent;        /* envelopes sent before the end */
    bool has_as_of;       /* false: nothing published yet */
    uint64_t as_of;       /* the last envelope published before the answer */
    uint64_t blocks;      /* DUMP: blocks sent */
    uint64_t orphans;     /* DUMP: blocks sent under the root for want of
                             their parent */
    bool bad;             /* the request was not understood: no answer */
} relay_recovery;

/* Answer one recovery request (its JSON body; reply_to is the request's
 * inbox, only checked for presence) through reply. First publishes what is
 * pending, so the answer sits between two envelopes: too_new when
 * from_sequence is beyond the last envelope (or none was published);
 * events (the ring's envelopes from from_sequence on, byte for byte, then
 * the end) when the ring holds from_sequence; else a dump (relay_dump_send)
 * then the end. A dump before the first envelope sends no envelope (nothing
 * was forwarded): only the end, with as_of null. *out says what was done.
 * KVO_EPROTO / KVO_ETOOBIG: a bad request, nothing sent, err says why. A
 * reply that fails abandons the stream (no end): its status is returned,
 * err says after how many envelopes. Counted in the recovery counters. */
kvo_status relay_pipe_recover(relay_pipe *p, const char *reply_to,
                              const uint8_t *body, size_t len,
                              size_t max_payload, relay_reply_fn reply,
                              void *ctx, relay_recovery *out, kvo_err *err);
/* The dp ranks of the worker, ascending: every rank a batch carried, and
 * every source's fallback rank (at most max written). */
size_t relay_pipe_ranks(const relay_pipe *p, uint32_t *out, size_t max);
/* The sequence of the last envelope published; false before the first. */
bool relay_pipe_last_sequence(const relay_pipe *p, uint64_t *seq);

/* Valid until the next pipe call. */
relay_stats *relay_pipe_stats(relay_pipe *p);
uint32_t relay_pipe_source_count(const relay_pipe *p);
void relay_pipe_source_info(const relay_pipe *p, uint32_t src,
                            relay_src_info *out);

/* ==== What the relay keeps for recovery =====================================*/

/* ---- The forwarded state (relay_state.c) --------------------------------
 * Per (dp_rank, tier), every block forwarded as stored and not yet as
 * removed or cleared, with its parent (as stored), tokens_hash and number
 * of copies (the dedup count of DESIGN §6). Pure. */
#define RELAY_STATE_MAX_RANKS 1024u

typedef struct relay_state relay_state;
typedef struct relay_state_rank relay_state_rank; /* one rank's tables */

kvo_status relay_state_new(relay_state **out);
void relay_state_free(relay_state *s); /* NULL is a no-op */
/* The tables of rank, added on first sight (*out stays valid until
 * relay_state_free). KVO_ETOOBIG: RELAY_STATE_MAX_RANKS ranks are known
 * already (only a broken publisher sends that many); KVO_ENOMEM. */
kvo_status relay_state_rank_get(relay_state *s, uint32_t rank,
                                relay_state_rank **out);
/* A block forwarded as stored: one more copy; parent and tokens_hash are
 * those of this store. KVO_ENOMEM: not recorded (the state is unchanged). */
kvo_status relay_state_store(relay_state_rank *r, wire_tier tier,
                             uint64_t block_hash, bool has_parent,
                             uint64_t parent, uint64_t tokens_hash);
/* One copy removed: KVO_MAP_HELD (others remain: do not forward the
 * remove), KVO_MAP_GONE (the last one: it left the state), KVO_MAP_ABSENT
 * (not held). */
kvo_map_dec_result relay_state_remove(relay_state_rank *r, wire_tier tier,
                                      uint64_t block_hash);
/* Copies of block_hash held (0: not held). */
uint32_t relay_state_copies(relay_state_rank *r, wire_tier tier,
                            uint64_t block_hash);
/* The tokens_hash block_hash was last stored with in tier, into *out; false
 * (*out untouched) when tier does not hold it. */
bool relay_state_tokens_hash(relay_state_rank *r, wire_tier tier,
                             uint64_t block_hash, uint64_t *out);
/* A cleared of one tier: every block of rank in tier (memory is kept). */
void relay_state_clear_tier(relay_state *s, uint32_t rank, wire_tier tier);
/* Every block of rank, every tier: what the relay forgets when it emits
 * cleared itself (memory is kept). */
void relay_state_clear(relay_state *s, uint32_t rank);
/* Ranks with tables, ascending (at most max written). */
size_t relay_state_ranks(const relay_state *s, uint32_t *out, size_t max);
/* Blocks held, and the bytes the state holds (allocated capacities). */
void relay_state_size(const relay_state *s, uint64_t *blocks, uint64_t *bytes);

typedef struct relay_state_block {
    uint32_t rank;
    wire_tier tier;
    uint64_t hash, tokens_hash;
    bool has_parent; /* as stored */
    uint64_t parent;
    bool orphan; /* has a parent, but it is not held (or the chain
                        * loops back): it goes under the root */
} relay_state_block;

typedef kvo_status (*relay_state_fn)(void *ctx, const relay_state_block *b);
/* Every block held, ranks ascending, tier by tier, each after its parent
 * when the parent is held (relay_state.c says how). fn must not change the
 * state; a non-OK status stops the walk and is returned (KVO_ENOMEM: the
 * walk's own stack). */
kvo_status relay_state_walk(relay_state *s, relay_state_fn fn, void *ctx);

/* ---- The ring of envelopes (relay_ring.c) -------------------------------*/
typedef struct relay_ring relay_ring;

typedef struct relay_ring_env {
    uint64_t seq;   /* envelope sequence */
    bool has_range; /* its KVO-Zmq-Seq header: first-last */
    uint64_t first, last;
    const uint8_t *body; /* owned by the ring while it holds the envelope */
    size_t len;
} relay_ring_env;

/* Keeps at most max_n envelopes and max_bytes of their bodies (what it
 * allocates for bodies never exceeds max_bytes). */
kvo_status relay_ring_new(relay_ring **out, size_t max_n, size_t max_bytes);
void relay_ring_free(relay_ring *r); /* NULL is a no-op */
/* Keep a copy of env (the oldest go to make room). false: it could not be
 * kept (larger than max_bytes, out of memory): the ring is emptied, as it
 * is when env->seq does not follow the newest held. */
bool relay_ring_push(relay_ring *r, const relay_ring_env *env);
void relay_ring_clear(relay_ring *r);
/* The ring holds seq, and so every envelope from seq to the newest. */
bool relay_ring_holds(const relay_ring *r, uint64_t seq);
/* Envelope seq (valid until the next push or clear), or NULL. */
const relay_ring_env *relay_ring_get(const relay_ring *r, uint64_t seq);
void relay_ring_size(const relay_ring *r, uint64_t *envelopes, uint64_t *bytes);

/* ---- Dumps (relay_dump.c) ------------------------------------------------*/

/* Bytes a reply's NATS headers may take (KVO-Recovery, KVO-Zmq-Seq):
 * dump envelopes are cut to max_payload less this. */
#define RELAY_REPLY_HEADER_ROOM 256u

typedef struct relay_dump_cfg {
    uint64_t publisher_id, worker_id;
    uint64_t event_id; /* every dump event carries it */
    uint64_t as_of;    /* the envelopes' sequence */
    uint64_t published_at_ms;
    bool has_wm; /* KVO-Zmq-Seq of the last envelope */
    uint64_t wm_first, wm_last;
    const uint32_t *ranks; /* a cleared per tier for each, first */
    size_t n_ranks;
    size_t max_payload;              /* bytes one NATS message may hold */
    uint32_t max_events, max_blocks; /* per envelope */
} relay_dump_cfg;

typedef struct relay_dump_result {
    uint64_t sent;    /* envelopes sent */
    uint64_t blocks;  /* blocks in them */
    uint64_t orphans; /* of which sent under the root for want of parent */
} relay_dump_result;

/* The state as dump envelopes through reply (not the end: the caller sends
 * it). KVO_ETOOBIG: max_payload cannot hold one block; a reply's status
 * stops the dump and is returned. *res counts what was sent. */
kvo_status relay_dump_send(const relay_dump_cfg *c, relay_state *state,
                           relay_reply_fn reply, void *ctx,
                           relay_dump_result *res);

/* ==== Stats views (relay_stats.c) ==========================================*/

/* {"batches_live": n, ..., "bad_msgs": {...}, "decode_errors": {"EPROTO": n},
 *  "rejects": {...}, "replay_failures": {...}, "buffer_depth": n,
 *  "nats_buffered": n, "nats_buffered_total": n, "nats_connected": b,
 *  "first_mismatch": null | {"seq", "event", "block", "expected", "got"}}
 * Caller owns the object. */
json_object *relay_stats_to_json(const relay_stats *s);
/* Prometheus text exposition (kvo_relay_* names), appended to out. */
kvo_status relay_stats_to_prom(const relay_stats *s, kvo_buf *out);
/* One short line for the periodic log; a buffer of RELAY_STATS_LINE_MAX
 * holds it with every counter at its largest. */
#define RELAY_STATS_LINE_MAX 1024
void relay_stats_line(const relay_stats *s, char *buf, size_t n);
/* Adds one source's counters (RELAY_SOURCE_COUNTERS) to the object o. */
void relay_src_stats_to_json(const relay_src_stats *s, json_object *o);

/* ==== The service's parts ==================================================*/

/* ---- ZMQ sources (relay_source.c) ---------------------------------------*/
typedef struct relay_source relay_source;

typedef struct relay_source_cfg {
    const char *endpoint; /* SUB */
    bool bind;
    const char *topic;
    const char *replay_endpoint; /* NULL = none */
    int hwm;
    int64_t max_msg_bytes;
    int linger_ms;
} relay_source_cfg;

/* A connecting SUB that lost its connection and whose monitor has not said
 * "retrying" this long is given up by libzmq (a protocol error: it never
 * reconnects) and is made anew. libzmq says "retrying" right after the
 * disconnect, so this only bounds how late a dead SUB is noticed. */
#define RELAY_SOURCE_REOPEN_MS 500u

kvo_status relay_source_new(relay_source **out, void *zctx,
                            const relay_source_cfg *cfg);
void relay_source_free(relay_source *s);
void *relay_source_sub(relay_source *s);    /* for zmq_poll */
void *relay_source_dealer(relay_source *s); /* NULL when none open */
/* Send ["", seq u64 BE] on the DEALER (opened on demand). */
kvo_status relay_source_replay_request(relay_source *s, uint64_t from_seq);
/* Close the DEALER: replies to earlier requests are gone with it. */
void relay_source_replay_abort(relay_source *s);
/* The PAIR sockets that receive the SUB's and the DEALER's monitor events,
 * for zmq_poll (the DEALER's is NULL when no DEALER is open). */
void *relay_source_sub_monitor(relay_source *s);
void *relay_source_dealer_monitor(relay_source *s);
/* The next thing the sockets did: KVO_OK with *what, KVO_EAGAIN when
 * nothing is waiting. A connecting SUB given up by libzmq
 * (RELAY_SOURCE_REOPEN_MS) is made anew here (RELAY_LINK_SUB_REOPENED);
 * when that fails the old one is kept, the status and err say why, and a
 * call RELAY_SOURCE_REOPEN_MS later tries again. Read everything the SUB
 * holds before calling (a reopen drops it). */
kvo_status relay_source_event(relay_source *s, uint64_t now_ns,
                              relay_link *what, kvo_err *err);
/* When relay_source_event must be called again even if no monitor socket
 * is readable (monotonic ns; 0 = no such time). */
uint64_t relay_source_deadline(const relay_source *s);

/* One received multipart message; frames valid until the next recv. */
typedef struct relay_rx {
    uint32_t n; /* frames received (may exceed max) */
    wire_frame frames[WIRE_CAP_MAX_FRAMES];
} relay_rx;

/* Non-blocking receive: KVO_OK with a message, KVO_EAGAIN when nothing is
 * waiting, KVO_ENET on a socket error. Frames beyond WIRE_CAP_MAX_FRAMES
 * are read and dropped (n still counts them). */
kvo_status relay_source_recv_sub(relay_source *s, relay_rx *rx);
kvo_status relay_source_recv_dealer(relay_source *s, relay_rx *rx);

/* ---- NATS publisher (relay_nats.c) --------------------------------------*/
typedef struct relay_nats relay_nats;

/* Connect (retrying in the background when the server is not up yet). On
 * failure err says why. */
kvo_status relay_nats_new(relay_nats **out, const relay_cfg *cfg, char *err,
                          size_t errsz);
/* Flushes while connected (2 s at most), closes (bounded: kvo_nats.h). */
void relay_nats_free(relay_nats *n);
/* As nats.c's callbacks last said: never waits for nats.c's lock. */
bool relay_nats_connected(relay_nats *n);
/* Publish with an optional KVO-Zmq-Seq header. KVO_EAGAIN when the message
 * could not be sent or buffered (reconnect buffer full). */
kvo_status relay_nats_publish(relay_nats *n, const char *subject,
                              bool has_range, uint64_t first, uint64_t last,
                              const uint8_t *body, size_t len);
/* Fill st's NATS counters and gauges (nats_*, recovery_requests_dropped):
 * what nats.c's callbacks last said, read on the loop thread. No side
 * effects but remembering nats.c's drop counts (they never go down). */
void relay_nats_stats(relay_nats *n, relay_stats *st);

/* One message of a recovery reply stream to the inbox to: a KVO-Recovery
 * header naming kind, KVO-Zmq-Seq when has_range. KVO_EAGAIN as for
 * relay_nats_publish. */
kvo_status relay_nats_reply(relay_nats *n, const char *to, wire_reply_kind kind,
                            bool has_range, uint64_t first, uint64_t last,
                            const uint8_t *body, size_t len);
/* The largest message the server takes (its max_payload; 1 MiB before it
 * said). */
size_t relay_nats_max_payload(relay_nats *n);

/* Requests the relay answers, by the subject they came on. */
typedef enum relay_req_kind {
    RELAY_REQ_RECOVERY = 0, /* <p>.kv-recovery.<publisher_id> */
    RELAY_REQ_DISCOVER,     /* <p>.kv-relays.discover */
    RELAY_REQ_COUNT
} relay_req_kind;

typedef struct relay_req {
    relay_req_kind kind;
    const char *reply; /* the requester's inbox; NULL when none */
    const uint8_t *body;
    size_t len;
    void *msg; /* owned until relay_nats_req_done */
} relay_req;

/* Subscribe to subjects[RELAY_REQ_COUNT] (by relay_req_kind) and wait until
 * the server has the subscriptions. Requests are queued for the loop (at
 * most 256, then nats.c's pending limits: beyond them requests are dropped
 * and counted as recovery_requests_dropped). */
kvo_status relay_nats_listen(relay_nats *n, const char *const *subjects,
                             char *err, size_t errsz);
/* Readable (for zmq_poll) when a request may be waiting. */
int relay_nats_wake_fd(const relay_nats *n);
/* The oldest request waiting (true), valid until relay_nats_req_done. */
bool relay_nats_req_next(relay_nats *n, relay_req *r);
bool relay_nats_req_waiting(relay_nats *n);
void relay_nats_req_done(relay_req *r);

/* What the connection did since the previous relay_nats_watch, for the log.
 * Call it from one place only (the loop): each call takes the news. */
typedef struct relay_nats_news {
    bool went_down;      /* disconnected (once or more) */
    bool came_back;      /* reconnected (once or more) */
    uint64_t reconnects; /* reconnections so far */
} relay_nats_news;
relay_nats_news relay_nats_watch(relay_nats *n);

#endif /* RELAY_INT_H */
