/* tr.h -- relay test helpers:
 *   tr_*     the pipeline behind its seam: fake frames in, decoded envelopes
 *            and replay requests captured; tagged batches in, and the
 *            stored blocks checked by tag (tr_expect_tags);
 *   tb_*     KVEventBatch payloads built from the JSON field view;
 *   tpub_*   a small real ZMQ publisher (XPUB + ROUTER replay, vLLM
 *            protocol) for the integration tests;
 *   tfwd_*, tproxy_*  a lossy ZMQ forwarder and a gated TCP proxy;
 *   tsub_*   a NATS subscriber that decodes envelopes;
 *   treq_*   a recovery requester (docs/recovery.md), as an indexer asks;
 *   trelay_* a kvo-relay process and its /stats;
 *   tnet_*   nats-server + proxy + subscriber, with server outages;
 *   tmodel_* the block-level index a subscriber would build.
 */
#ifndef TR_H
#define TR_H

#include "idx.h"
#include "kt.h"
#include "kvo_http.h"
#include "relay_int.h"

#include <nats/nats.h>
#include <pthread.h>

/* ---- the pipeline seam ---------------------------------------------------*/

typedef struct tr_env {
    char subject[160];
    bool has_range;
    uint64_t first, last;
    wire_plane_msg m; /* decoded body */
    kvo_buf raw;      /* the body's bytes */
} tr_env;

typedef struct tr {
    relay_pipe *p;
    tr_env *msgs;
    size_t n, cap;
    uint64_t req[256]; /* replay requests: from seq */
    uint32_t req_src[256];
    size_t nreq;
    size_t aborts;
    size_t notes;
    bool fail_requests; /* replay_request returns KVO_ENET */
    uint64_t now;       /* monotonic ns handed to the pipe */
    kvo_buf batch;      /* payload scratch of the tr_*_seqs/tag/tb calls */
} tr;

/* Sensible defaults for tests (worker 7, block size 16, publisher 42). */
void tr_cfg_default(relay_pipe_cfg *c);
/* nsrc sources, fallback rank = source index. cfg NULL = defaults. */
void tr_init(tr *t, const relay_pipe_cfg *cfg, uint32_t nsrc, bool replay);
void tr_fini(tr *t);
void tr_live(tr *t, uint32_t src, uint64_t seq, const kvo_buf *payload);
/* A replay reply in the >= 0.26 layout (or the older one). */
void tr_reply(tr *t, uint32_t src, uint64_t seq, const kvo_buf *payload,
              bool with_topic);
void tr_end(tr *t, uint32_t src, bool with_topic);
void tr_flush(tr *t);
/* All RouterEvents published so far, in order (pointers into msgs). */
size_t tr_events(tr *t, const wire_revent **out, size_t max);
relay_stats *tr_stats(tr *t);
/* The last KVO-Zmq-Seq end published (false when none). */
bool tr_watermark(const tr *t, uint64_t *last);

/* ---- recovery replies ------------------------------------------------------
 * A relay_reply_fn that keeps every message of a reply stream, decoded. */
typedef struct tr_rmsg {
    wire_reply_kind kind;
    bool has_range;
    uint64_t first, last;
    kvo_buf raw;
    wire_plane_msg m;   /* EVENTS, DUMP */
    wire_reply_end end; /* END, TOO_NEW */
} tr_rmsg;

typedef struct tr_replies {
    tr_rmsg *v;
    size_t n, cap;
    size_t fail_at; /* the reply with this index fails (SIZE_MAX: none) */
} tr_replies;

void tr_replies_init(tr_replies *r);
void tr_replies_fini(tr_replies *r);
void tr_replies_reset(tr_replies *r);
kvo_status tr_reply_keep(void *ctx, wire_reply_kind kind, bool has_range,
                         uint64_t first, uint64_t last, const uint8_t *body,
                         size_t len);
/* relay_pipe_recover of the JSON request with reply inbox "_INBOX.t",
 * replies into r (reset first). */
kvo_status tr_recover(tr *t, const char *request, size_t max_payload,
                      tr_replies *r, relay_recovery *out);

/* ---- indexes built from envelopes ---------------------------------------- */

/* Apply m's device-tier events as an indexer would (each must apply). */
void tr_tree_apply(idx_tree *t, const wire_plane_msg *m);
/* The two trees hold the same (worker, block under parent) edges, and
 * their workers the same numbers of blocks. Returns the edges. */
size_t tr_same_trees(idx_tree *a, idx_tree *b);

/* Tagged batches (tb_tagged, rank 0) without payload bookkeeping: live
 * batch (or replay reply) seq of src holding tag; live batches (replies)
 * first..last of src, each holding its own seq as tag. */
void tr_live_tag(tr *t, uint32_t src, uint64_t seq, uint64_t tag);
void tr_reply_tag(tr *t, uint32_t src, uint64_t seq, uint64_t tag,
                  bool with_topic);
void tr_live_seqs(tr *t, uint32_t src, uint64_t first, uint64_t last);
void tr_reply_seqs(tr *t, uint32_t src, uint64_t first, uint64_t last,
                   bool with_topic);
/* Stored block hashes forwarded so far, in order (ck_assert when more than
 * max); forwarded RouterEvents of one type. */
size_t tr_stored(tr *t, uint64_t *out, size_t max);
size_t tr_count(tr *t, wire_rtype type);
/* The blocks stored so far are exactly those of the tagged batches given,
 * in this order: tr_expect_tags(&t, 0, 1, 2, 7). */
#define tr_expect_tags(t, ...)                                                 \
    tr_expect_tags_((t), (const uint64_t[]){__VA_ARGS__},                      \
                    sizeof((const uint64_t[]){__VA_ARGS__}) /                  \
                        sizeof(uint64_t))
void tr_expect_tags_(tr *t, const uint64_t *tags, size_t n);

/* ---- batch payloads --------------------------------------------------------*/

/* Token j of the block whose engine hash is h: a fixed function, so tests
 * know every block's tokens from its hash. */
uint64_t tb_token(uint64_t h, uint32_t j);
/* tokens_hash the relay must compute for block h (block size bs, no LoRA). */
uint64_t tb_tokens_hash(uint64_t h, uint32_t bs);

typedef struct tb {
    kvo_buf j;
    int n;
} tb;

/* A tagged batch: one root GPU store of block TB_TAG_BLOCK + tag, so a test
 * can tell batches apart by the blocks forwarded. rank < 0 = nil. */
#define TB_TAG_BLOCK 1000u
void tb_tagged(kvo_buf *out, uint64_t tag, int rank);

void tb_begin(tb *b);
/* GPU store of n blocks (tokens from tb_token, block size 16). */
void tb_store(tb *b, bool has_parent, uint64_t parent, const uint64_t *h,
              uint32_t n);
/* The same in medium ("CPU", ...), with extra_keys (JSON: a list, one
 * entry per block) unless NULL. */
void tb_store_in(tb *b, const char *medium, bool has_parent, uint64_t parent,
                 const uint64_t *h, uint32_t n, const char *extra_keys);
/* Anything: raw JSON of one event. */
void tb_raw(tb *b, const char *json_event);
void tb_remove(tb *b, const uint64_t *h, uint32_t n);
void tb_remove_in(tb *b, const char *medium, const uint64_t *h, uint32_t n);
void tb_cleared(tb *b);
/* Finish: rank < 0 = nil; encodes the map format into out (reset first). */
void tb_end(tb *b, int rank, kvo_buf *out);
/* Finish b with rank and hand it to t's pipe as live batch seq of src. */
void tr_live_tb(tr *t, uint32_t src, uint64_t seq, tb *b, int rank);

/* ---- a real ZMQ publisher ----------------------------------------------------*/

typedef struct tpub tpub;

/* Binds XPUB and ROUTER on free loopback ports; a thread answers replay
 * requests from the ring of every batch sent (vLLM protocol). */
tpub *tpub_new(bool with_topic);
void tpub_free(tpub *p);
const char *tpub_endpoint(const tpub *p);
const char *tpub_replay_endpoint(const tpub *p);
/* Wait until a subscriber has subscribed (XPUB sees it). */
bool tpub_wait_subscriber(tpub *p, long timeout_ms);
/* Assign the next sequence, keep it for replay, send it unless drop. */
uint64_t tpub_send(tpub *p, const kvo_buf *payload, bool drop);
/* The publisher process "restarts": sequence back to 0, ring emptied. */
void tpub_restart(tpub *p);
/* Forget ring entries older than seq (replay window). */
void tpub_trim(tpub *p, uint64_t keep_from);
uint64_t tpub_requests(tpub *p);

/* ---- a ZMQ forwarder that loses chosen sequences ---------------------------
 * SUB (connected upstream) -> XPUB (bound here): every message but the
 * dropped sequences, like a lossy network between engine and relay. */
typedef struct tfwd tfwd;

tfwd *tfwd_new(const char *upstream, const uint64_t *drop, size_t ndrop);
void tfwd_free(tfwd *f);
const char *tfwd_endpoint(const tfwd *f);
uint64_t tfwd_dropped(tfwd *f);

/* ---- a gated TCP proxy ---------------------------------------------------------
 * Between the relay and nats-server, so a test decides when the relay may
 * reconnect after a server restart (the subscriber must be back first, or
 * core NATS delivers the flushed buffer to nobody). Closed gate: new
 * connections are accepted and closed at once. */
typedef struct tproxy tproxy;

tproxy *tproxy_new(uint16_t target_port);
void tproxy_free(tproxy *p);
uint16_t tproxy_port(const tproxy *p);
void tproxy_gate(tproxy *p, bool open);

/* ---- a NATS subscriber ---------------------------------------------------------*/

typedef struct tsub {
    natsConnection *nc;
    natsSubscription *sub;
} tsub;

/* Reconnects forever (50 ms wait) and resubscribes after a server restart. */
void tsub_start(tsub *s, const char *url, const char *subject);
/* After a server restart: wait until reconnected and the subscription is
 * registered again (ck_assert on timeout). */
void tsub_wait_connected(tsub *s, long timeout_ms);
void tsub_stop(tsub *s);
/* Next envelope within timeout_ms: true and *m decoded (m reset first),
 * range from the header. */
bool tsub_next(tsub *s, long timeout_ms, wire_plane_msg *m, bool *has_range,
               uint64_t *first, uint64_t *last);

/* ---- a recovery requester (as an indexer would ask) ------------------------------
 * Publish body on subject with a fresh inbox and keep the reply stream
 * (decoded, by its KVO-Recovery header) in out (reset first) until an end
 * or too_new: true; false when nothing ended it within timeout_ms. */
bool treq_recover(natsConnection *nc, const char *subject, const char *body,
                  long timeout_ms, tr_replies *out);

/* ---- a kvo-relay process ---------------------------------------------------------*/

typedef struct trelay {
    kt_proc p;
    char base[64]; /* http://127.0.0.1:<metrics port> */
    kvo_http_client *http;
} trelay;

/* Starts bin/kvo-relay with args plus --metrics-listen (free port) and
 * --stats-interval-ms 1000; waits for /health. */
void trelay_start(trelay *r, const char *const *args);
/* SIGTERM; returns the exit status. */
int trelay_stop(trelay *r);
/* GET path, which must answer 200 (resp initialised by the call; the
 * caller finis it). */
void trelay_get(trelay *r, const char *path, kvo_http_resp *resp);
/* GET /stats (caller puts). */
json_object *trelay_stats(trelay *r);
uint64_t trelay_stat(trelay *r, const char *name);
/* Member name of a stats object as u64 (ck_assert when absent). */
uint64_t tr_json_u64(json_object *j, const char *name);
void trelay_wait_stat(trelay *r, const char *name, uint64_t atleast);
/* Wait until the relay reports NATS down. */
void trelay_wait_nats_down(trelay *r);

/* ---- NATS between a relay and a subscriber ---------------------------------
 * A real nats-server, a gated proxy in front of it for the relay and a
 * subscriber. tnet_down stops the server and waits until the relay has
 * noticed (what it wrote before may sit in a dead socket: core NATS loses
 * that); tnet_up starts it again on the same port, lets the subscriber back
 * first, then the relay (or core NATS would deliver the relay's flushed
 * buffer to nobody). */
typedef struct tnet {
    kt_nats nats;
    tproxy *proxy;
    tsub sub;
    char relay_url[64]; /* the relay's --nats: through the proxy */
} tnet;

void tnet_start(tnet *n, const char *subject);
void tnet_stop(tnet *n);
void tnet_down(tnet *n, trelay *r);
void tnet_up(tnet *n, long timeout_ms);

/* Wait until p's log holds needle (dumps the log and fails after
 * timeout_ms). */
void tr_wait_log(const kvo_proc *p, const char *needle, long timeout_ms);

/* ---- the index a subscriber would build (block level) -------------------------
 * Per dp rank: stored block hash -> tokens hash, exactly as an indexer applies
 * stored / removed / cleared; enough to ask "how many leading blocks of this
 * prompt does rank r hold" and compare with the engine's probe. */
#define TMODEL_RANKS 4
typedef struct tmodel_rank {
    uint64_t *bh, *th; /* open addressing on bh (0 = empty) */
    size_t cap, n;
} tmodel_rank;

typedef struct tmodel {
    tmodel_rank r[TMODEL_RANKS];
    uint64_t next_sequence; /* envelope sequences seen: 0, 1, ... */
    bool has_wm;
    uint64_t wm;
    uint64_t cleared;
} tmodel;

void tmodel_init(tmodel *m);
void tmodel_fini(tmodel *m);
void tmodel_apply(tmodel *m, const wire_plane_msg *msg);
/* Leading full blocks of tokens held by rank (router hash chain). */
uint32_t tmodel_hits(const tmodel *m, uint32_t rank, const uint64_t *tokens,
                     size_t n, uint32_t bs);
/* Read envelopes from s into m until the watermark reaches wm. */
void tmodel_collect(tmodel *m, tsub *s, uint64_t wm, long timeout_ms);

#endif /* TR_H */
