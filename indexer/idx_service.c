/* idx_service.c -- kvo-indexer: NATS subscriber + HTTP API around a feed.
 *
 * One event loop owns the feed and the tree:
 *
 *   nats.c thread --on_msg--> inbox (mutex, bounded) --eventfd--+
 *                                                               v
 *   loop: poll({eventfd, kvo_http_server_fd})
 *         -> a slice of the inbox (until HTTP is due) -> the feed
 *              (between two events of an envelope, when HTTP is due:
 *               kvo_http_server_run)
 *         -> recovery timeouts -> waiting queries -> kvo_http_server_run
 *
 *   HTTP is due once a request waits (looked for every KVO_HTTP_PEEK_US of
 *   apply) or apply_budget_us has passed since HTTP was last served.
 *
 * nats.c runs its own threads; its callbacks only queue messages or bump
 * atomic counters. A full inbox (256k messages or 256 MiB, counting those
 * taken but not yet applied) makes on_msg wait (the loop is behind), so
 * nats.c's own pending limits take over and drop messages
 * (natsSubscription_GetDropped counts them; the loop logs every count that
 * rises). Messages apply in arrival order. The loop applies until HTTP is
 * due, serves HTTP and waiting queries, and comes back at once for the
 * rest, so a query never waits behind a whole inbox of large applies. Nor
 * behind one large envelope (128 events and 8,192 blocks from a relay take
 * milliseconds): the feed pauses between two of its events
 * (idx_feed_set_pause) and, when HTTP is due, the loop answers the
 * requests that came in (mid_envelope). Queries
 * then see the envelope's first events; the KVO-Zmq-Seq watermark moves
 * only when the envelope is whole, so a query waiting for it is held until
 * the end of the slice (serve_waiters) and never sees half an envelope.
 *
 * Recovery (docs/recovery.md; the state machine is the feed's, in
 * idx_recover.c; this file is its NATS glue). Subscriptions, all on one
 * connection whose messages nats.c delivers from one thread, so the inbox
 * keeps the server's order across them:
 *
 *   <p>.kv-events              the event plane (--subject)       first
 *   <p>.kv-relays              relays' announces and heartbeats
 *   _INBOX.<nuid>.d            answers to the discover request
 *   _INBOX.<nuid>.r.<pub>.<id> recovery answers, by publisher and request
 *
 * then a discover request on <p>.kv-relays.discover ('*' tokens of
 * --subject are taken as dynamo / backend there: a NATS subject to publish
 * on has no wildcards; relays elsewhere are heard by their heartbeats) and
 * a window of discover_ms in which /health says "recovering". The feed
 * asks through ask_relay (a request on the relay's recovery subject with
 * the reply inbox above); each loop turn ticks its timeouts. --no-recovery
 * subscribes to the event plane only.
 *
 * A query may wait for a watermark (kvo-check's lockstep): POST /query or
 * /query_by_hash with "wait": {"zmq_seq": [[publisher_id, seq], ...],
 * "timeout_ms": t} is answered once every listed publisher's KVO-Zmq-Seq
 * watermark has reached its seq (checked after each slice of the inbox),
 * or when t passes; the answer adds "covered" (which of the two) and
 * "watermark" (GET /watermark's object at that moment); "metrics": true
 * adds GET /metrics's text, read at the same moment. One round trip
 * instead of polling /watermark, querying and reading the counters, and no
 * poll interval to overshoot. At most WAIT_MAX queries (WAIT_MAX_BYTES of
 * request bodies and their parsed trees) wait at once; one more is
 * answered 503.
 *
 * Request bodies are read by idx_request_parse alone (kvo_json: strict, in
 * memory proportional to the body, arrays never copied); every error is a
 * JSON {"error": "..."} naming where. Long answers come in pages: GET
 * /watermark?after=ID&limit=N (IDX_WATERMARK_PAGE at most, "next" while
 * more follow), GET /dump?after=K&limit=N (DUMP_PAGE at most), GET
 * /blocks?...&after=H&limit=N (IDX_BLOCKS_PAGE at most); an unpaged /dump
 * larger than one page is refused, never built whole. Each loop turn sets
 * the feed's clock and forgets idle publishers (idx.h).
 */
#include "idx_int.h"
#include "kvo_http.h"
#include "kvo_nats.h"
#include "kvo_prom.h"

#include <errno.h>
#include <inttypes.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#define INBOX_MAX 262144         /* messages waiting for the loop */
#define INBOX_BYTES (256u << 20) /* and their bodies */
#define INBOX_FIRST_CAP 256      /* inbox slots allocated at first */
#define HDR_ZMQ_SEQ WIRE_HDR_ZMQ_SEQ
#define WAIT_MAX 1024              /* queries held for a watermark */
#define WAIT_MAX_BYTES (64u << 20) /* and their request bodies + parses */
#define DUMP_PAGE                                                              \
    10000 /* events in one /dump answer (the loop
                                  serves nothing else while it builds) */
/* nats.c's pending limits on each subscription: what it holds for on_msg
 * while the inbox is full, before it drops (and counts) messages */
#define NATS_PENDING_MSGS (1 << 20)
#define NATS_PENDING_BYTES (1 << 30)
#define NATS_FLUSH_MS 5000        /* wait for the server to confirm the SUB */
#define HTTP_MAX_BODY (16u << 20) /* default --max-body */
#define LOOP_POLL_MS                                                           \
    200                     /* longest poll: kvo_stop and nats.c's counters are
                            checked at least this often */
#define APPLY_BUDGET_US 500 /* default apply_budget_us */
#define DISCOVER_MS 500     /* default discover_ms */
#define SUBJECT_MAX 512     /* recovery subjects built here */
#define NS_PER_MS 1000000u
#define NS_PER_US 1000u
#define NS_PER_S 1e9
#define DEFAULT_NS "dynamo" /* a '*' namespace token, for discovery */
#define DEFAULT_COMPONENT "backend"

/* What a subscription delivers. */
typedef enum msg_kind {
    MSG_EVENT = 0,  /* an event-plane envelope */
    MSG_ANNOUNCE,   /* an announce on <p>.kv-relays */
    MSG_DISCOVERED, /* an announce answering the discover request */
    MSG_REPLY,      /* a message of a recovery answer */
    MSG_KINDS
} msg_kind;

typedef struct inmsg {
    natsMsg *m;
    msg_kind kind;
} inmsg;

struct svc;
typedef struct subctx {
    struct svc *s;
    msg_kind kind;
} subctx;

/* A query held until the watermark covers its pairs or its deadline. */
typedef struct waiter {
    struct waiter *next;
    kvo_http_req *r;
    idx_request q;     /* the parsed request, kept until answered */
    size_t cost;       /* body bytes + parse memory, counted in wait_bytes */
    uint64_t deadline; /* kvo_now_ns */
} waiter;

/* Query latency histogram bounds, seconds. */
static const double lat_bounds[IDX_LAT_BOUNDS] = {
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 1e-1};
#define NLAT IDX_LAT_BOUNDS

typedef struct svc {
    const idx_service_cfg *cfg;
    idx_feed *feed;
    kvo_http_server *http;
    idx_dyn *dyn;          /* --dynamo-http, or NULL */
    zmq_pollitem_t *items; /* the loop's poll set */
    size_t max_items;
    idx_scores scores;
    idx_blockset blocks; /* GET /blocks's cache */

    /* NATS (callbacks on nats.c threads) */
    kvo_nats_cfg nats_cfg; /* cfg->nats, or the defaults */
    kvo_nats *nats;
    natsSubscription *sub, *sub_relays, *sub_disc, *sub_reply;
    subctx subctx[MSG_KINDS];
    atomic_uint_fast64_t inbox_drops;

    pthread_mutex_t mu; /* inbox, work_left/work_bytes, stopping */
    pthread_cond_t cv;
    inmsg *inbox;
    size_t inbox_len, inbox_cap, inbox_bytes;
    size_t work_left, work_bytes; /* taken by the loop, not applied yet */
    bool stopping;
    int evfd;

    /* loop-only state */
    inmsg *work; /* the inbox taken, applied from work_i on */
    size_t work_n, work_i;
    waiter *waiters; /* queries waiting for a watermark, oldest first */
    size_t n_waiters, wait_bytes;
    uint64_t seen_disconnects, seen_reconnects, seen_nats_dropped,
        seen_inbox_drops;    /* other threads' counters, last polled values
                             (log_nats_changes) */
    uint64_t nats_dropped;   /* natsSubscription_GetDropped, last read */
    idx_service_stats stats; /* loop-owned parts: bad_requests, latency */
    uint64_t queries;
    bool recovery;                   /* on, and its subjects could be made */
    char relays_subj[SUBJECT_MAX];   /* <p>.kv-relays */
    char discover_subj[SUBJECT_MAX]; /* <p>.kv-relays.discover, concrete */
    char rec_prefix[SUBJECT_MAX];    /* <p> concrete: default recovery
                                        subjects */
    char *inbox_subj;                /* _INBOX.<nuid> */
    size_t inbox_subj_len;
    kvo_ratelimit rl_bad, rl_dup, rl_hdr, rl_mem, rl_drop, rl_gap, rl_restart,
        rl_rewind, rl_full, rl_expired, rl_announce, rl_reply, rl_ask, rl_held,
        rl_rec[IDX_REC_RESTART + 1];
} svc;

void idx_service_cfg_default(idx_service_cfg *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->subject = "namespace.*.component.*.kv-events";
    cfg->http = "127.0.0.1:8090";
    cfg->block_size = IDX_BLOCK_SIZE_DEFAULT;
    cfg->feed.max_publishers = IDX_MAX_PUBLISHERS_DEFAULT;
    cfg->feed.publisher_idle_ms = IDX_PUBLISHER_IDLE_MS_DEFAULT;
    cfg->feed.recovery_timeout_ms = IDX_RECOVERY_TIMEOUT_MS_DEFAULT;
    cfg->max_body = HTTP_MAX_BODY;
    cfg->discover_ms = DISCOVER_MS;
    cfg->apply_budget_us = APPLY_BUDGET_US;
    cfg->dynamo_max_listeners = IDX_DYN_MAX_LISTENERS;
}

/* ======================================================================== */
/* NATS callbacks (nats.c threads)                                           */
/* ======================================================================== */

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *m,
                   void *closure) {
    (void)nc;
    (void)sub;
    subctx *c = closure;
    svc *s = c->s;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping && (s->inbox_len + s->work_left >= INBOX_MAX ||
                            s->inbox_bytes + s->work_bytes >= INBOX_BYTES))
        pthread_cond_wait(&s->cv, &s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        natsMsg_Destroy(m);
        return;
    }
    if (kvo_grow(&s->inbox, &s->inbox_cap, s->inbox_len + 1, sizeof(*s->inbox),
                 INBOX_FIRST_CAP) != KVO_OK) {
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add(&s->inbox_drops, 1);
        natsMsg_Destroy(m);
        return;
    }
    s->inbox[s->inbox_len++] = (inmsg){m, c->kind};
    s->inbox_bytes += (size_t)natsMsg_GetDataLength(m);
    bool wake = s->inbox_len == 1;
    pthread_mutex_unlock(&s->mu);
    if (wake) {
        uint64_t one = 1;
        ssize_t w = write(s->evfd, &one, sizeof(one));
        (void)w; /* a full eventfd counter still wakes the loop */
    }
}

/* Messages nats.c dropped on the subscriptions (their pending limits were
 * reached). Its slow-consumer error callback fires once per episode, not
 * per message, so the count comes from the subscriptions. Only rises: a
 * failed read (subscription closing) keeps the last count. */
static uint64_t nats_dropped(svc *s) {
    natsSubscription *subs[] = {s->sub, s->sub_relays, s->sub_disc,
                                s->sub_reply};
    uint64_t sum = 0;
    for (size_t i = 0; i < KVO_ARRAY_LEN(subs); i++) {
        int64_t n;
        if (subs[i] && natsSubscription_GetDropped(subs[i], &n) == NATS_OK &&
            n > 0)
            sum += (uint64_t)n;
    }
    if (sum > s->nats_dropped) s->nats_dropped = sum;
    return s->nats_dropped;
}

/* ======================================================================== */
/* NATS setup                                                                */
/* ======================================================================== */

/* The recovery's subjects from --subject, <p>.kv-events: false (recovery
 * off) when it does not have that shape. A '*' namespace or component
 * token is dynamo / backend in the subjects published on (discover, and
 * the recovery subject of a relay not heard of). */
static bool recovery_subjects(svc *s) {
    const char *subj = s->cfg->subject;
    static const char suffix[] = ".kv-events";
    size_t n = strlen(subj), k = sizeof(suffix) - 1;
    if (n <= k || n - k + 32 > SUBJECT_MAX ||
        strcmp(subj + n - k, suffix) != 0 || strchr(subj, '>'))
        return false;
    int p = (int)(n - k);
    snprintf(s->relays_subj, sizeof(s->relays_subj), "%.*s.kv-relays", p, subj);
    /* the concrete prefix: tokens 1 and 3 of namespace.NS.component.C may
     * be '*'; no other may */
    char concrete[SUBJECT_MAX - 32]; /* room for the suffixes */
    size_t out = 0;
    int tok = 0;
    for (const char *t = subj; t < subj + p; tok++) {
        const char *dot = memchr(t, '.', (size_t)(subj + p - t));
        size_t len = dot ? (size_t)(dot - t) : (size_t)(subj + p - t);
        const char *use = t;
        size_t ulen = len;
        if (len == 1 && *t == '*') {
            if (tok == 1)
                use = DEFAULT_NS;
            else if (tok == 3)
                use = DEFAULT_COMPONENT;
            else
                return false;
            ulen = strlen(use);
        }
        if (out + ulen + 2 >= sizeof(concrete)) return false;
        if (tok) concrete[out++] = '.';
        memcpy(concrete + out, use, ulen);
        out += ulen;
        t += len + (dot != NULL);
        if (!dot) break;
    }
    concrete[out] = '\0';
    memcpy(s->rec_prefix, concrete, out + 1);
    memcpy(s->discover_subj, concrete, out);
    memcpy(s->discover_subj + out, ".kv-relays.discover",
           sizeof(".kv-relays.discover"));
    return true;
}

static natsStatus subscribe(svc *s, natsSubscription **sub, const char *subj,
                            msg_kind kind) {
    s->subctx[kind] = (subctx){s, kind};
    natsStatus n =
        kvo_nats_subscribe(s->nats, sub, subj, on_msg, &s->subctx[kind]);
    if (n == NATS_OK)
        n = natsSubscription_SetPendingLimits(*sub, NATS_PENDING_MSGS,
                                              NATS_PENDING_BYTES);
    if (n != NATS_OK)
        kvo_error("NATS subscribe to %s: %s (%s)", subj, natsStatus_GetText(n),
                  nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
    return n;
}

/* The recovery's subscriptions and the discover request (the event plane
 * is subscribed already). */
static natsStatus recovery_setup(svc *s) {
    natsInbox *inbox = NULL;
    natsStatus n = natsInbox_Create(&inbox);
    if (n != NATS_OK) return n;
    size_t len = strlen((const char *)inbox);
    s->inbox_subj = kvo_malloc(len + 1);
    if (!s->inbox_subj) {
        natsInbox_Destroy(inbox);
        return NATS_NO_MEMORY;
    }
    memcpy(s->inbox_subj, inbox, len + 1);
    s->inbox_subj_len = len;
    natsInbox_Destroy(inbox);
    char disc[SUBJECT_MAX], reply[SUBJECT_MAX];
    snprintf(disc, sizeof(disc), "%s.d", s->inbox_subj);
    snprintf(reply, sizeof(reply), "%s.r.>", s->inbox_subj);
    if ((n = subscribe(s, &s->sub_relays, s->relays_subj, MSG_ANNOUNCE)) !=
            NATS_OK ||
        (n = subscribe(s, &s->sub_disc, disc, MSG_DISCOVERED)) != NATS_OK ||
        (n = subscribe(s, &s->sub_reply, reply, MSG_REPLY)) != NATS_OK)
        return n;
    natsConnection *nc = kvo_nats_conn(s->nats);
    if (kvo_nats_up(s->nats) &&
        (n = natsConnection_FlushTimeout(nc, NATS_FLUSH_MS)) != NATS_OK)
        return n;
    n = natsConnection_PublishRequest(nc, s->discover_subj, disc, "{}", 2);
    if (n != NATS_OK) /* heartbeats will find the relays */
        kvo_warn("discover request on %s: %s", s->discover_subj,
                 natsStatus_GetText(n));
    idx_feed_discovering(s->feed,
                         kvo_now_ns() / NS_PER_MS + s->cfg->discover_ms);
    kvo_info("recovery on: announces on %s, discover on %s (%" PRIu64
             " ms window), answers on %s.>",
             s->relays_subj, s->discover_subj, s->cfg->discover_ms,
             s->inbox_subj);
    return NATS_OK;
}

static kvo_status nats_setup(svc *s) {
    const idx_service_cfg *c = s->cfg;
    char err[512];
    kvo_status st =
        kvo_nats_new(&s->nats, &s->nats_cfg, "kvo-indexer", err, sizeof(err));
    /* one delivery thread for every subscription of the connection (nats.c's
     * pool holds one by default): the inbox keeps the server's order
     * across subjects, so an announce comes after the envelopes its relay
     * published before it */
    if (st == KVO_OK && natsOptions_UseGlobalMessageDelivery(
                            kvo_nats_options(s->nats), true) != NATS_OK)
        st = KVO_ENATS;
    if (st == KVO_OK) st = kvo_nats_connect(s->nats, err, sizeof(err));
    if (st == KVO_EAGAIN) {
        kvo_warn("NATS %s not reachable yet; retrying in the background",
                 s->nats_cfg.url);
        st = KVO_OK;
    }
    if (st != KVO_OK) {
        kvo_error("%s (servers %s)", err, s->nats_cfg.url);
        return st;
    }
    natsConnection *nc = kvo_nats_conn(s->nats);
    natsStatus n = subscribe(s, &s->sub, c->subject, MSG_EVENT);
    if (n == NATS_OK && kvo_nats_up(s->nats))
        n = natsConnection_FlushTimeout(nc, NATS_FLUSH_MS);
    if (n == NATS_OK && s->recovery) n = recovery_setup(s);
    if (n != NATS_OK) {
        kvo_error("NATS setup: %s (%s)", natsStatus_GetText(n),
                  nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
        return KVO_ENATS;
    }
    return KVO_OK;
}

/* Stop deliveries, close (bounded: see kvo_nats.h), free. */
static void nats_teardown(svc *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true; /* on_msg waiting for inbox room gives up */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!s->nats) return;
    bool closed = kvo_nats_close(s->nats, 0);
    natsSubscription_Destroy(s->sub);
    natsSubscription_Destroy(s->sub_relays);
    natsSubscription_Destroy(s->sub_disc);
    natsSubscription_Destroy(s->sub_reply);
    kvo_nats_free(s->nats);
    if (!closed) kvo_warn("NATS did not confirm the close");
}

/* ======================================================================== */
/* Recovery glue: the feed's io                                              */
/* ======================================================================== */

/* The feed asks: publish {"dump": true} or {"from_sequence": N} on the
 * relay's recovery subject, answers to _INBOX.<nuid>.r.<pub>.<id>. Not
 * connected, or a failed publish: the request times out in the feed. */
static void ask_relay(void *ctx, const idx_rec_ask *a) {
    svc *s = ctx;
    char subj[SUBJECT_MAX + 64], reply[SUBJECT_MAX];
    const char *to = a->subject;
    if (!to) {
        snprintf(subj, sizeof(subj), "%s.kv-recovery.%" PRIu64, s->rec_prefix,
                 a->publisher_id);
        to = subj;
    }
    snprintf(reply, sizeof(reply), "%s.r.%" PRIu64 ".%" PRIu64, s->inbox_subj,
             a->publisher_id, a->id);
    kvo_buf b;
    kvo_buf_init(&b);
    natsStatus n = NATS_NO_MEMORY;
    if (wire_recovery_req_encode(&a->req, &b) == KVO_OK)
        n = kvo_nats_up(s->nats)
                ? natsConnection_PublishRequest(kvo_nats_conn(s->nats), to,
                                                reply, b.data, (int)b.len)
                : NATS_NOT_YET_CONNECTED;
    kvo_buf_fini(&b);
    if (n != NATS_OK)
        kvo_log_limited(&s->rl_ask, KVO_LOG_WARN,
                        "recovery request to %s not sent: %s (it will time "
                        "out)",
                        to, natsStatus_GetText(n));
}

static const char *kind_word(wire_reply_kind k) {
    return k == WIRE_REPLY_DUMP     ? "a dump"
           : k == WIRE_REPLY_EVENTS ? "the missing envelopes"
                                    : "too_new (nothing was missing)";
}

/* What the feed's recoveries did, one rate-limited line per kind. */
static void rec_note(void *ctx, const idx_rec_note *n) {
    svc *s = ctx;
    kvo_ratelimit *rl = &s->rl_rec[n->what];
    switch (n->what) {
    case IDX_REC_ASKED:
        if (n->kind == WIRE_REPLY_DUMP)
            kvo_log_limited(rl, KVO_LOG_INFO,
                            "asking the relay of publisher %" PRIu64
                            " for a dump",
                            n->publisher_id);
        else
            kvo_log_limited(rl, KVO_LOG_INFO,
                            "asking the relay of publisher %" PRIu64
                            " for its envelopes from sequence %" PRIu64,
                            n->publisher_id, n->sequence);
        break;
    case IDX_REC_DONE:
        kvo_log_limited(rl, KVO_LOG_INFO,
                        "publisher %" PRIu64 " recovered with %s (%" PRIu64
                        " envelope(s), %" PRIu64 " ms)",
                        n->publisher_id, kind_word(n->kind), n->count, n->ms);
        break;
    case IDX_REC_FAILED:
        kvo_log_limited(rl, KVO_LOG_WARN,
                        "recovery of publisher %" PRIu64
                        " failed: %s; its %" PRIu64
                        " (worker, rank)(s) were cleared and are stale",
                        n->publisher_id, n->why, n->count);
        break;
    case IDX_REC_RETRY:
        kvo_log_limited(rl, KVO_LOG_WARN,
                        "recovery of publisher %" PRIu64
                        ": %s; asking for a dump",
                        n->publisher_id, n->why);
        break;
    case IDX_REC_IMPOSSIBLE:
        kvo_log_limited(rl, KVO_LOG_WARN,
                        "publisher %" PRIu64
                        ": its relay never sent sequence %" PRIu64
                        " (too_new): that envelope was dropped",
                        n->publisher_id, n->sequence);
        break;
    case IDX_REC_RESTART:
        kvo_log_limited(rl, KVO_LOG_INFO,
                        "the relay of publisher %" PRIu64
                        " restarted: its held envelopes are dropped, a dump "
                        "rebuilds it",
                        n->publisher_id);
        break;
    }
}

/* ======================================================================== */
/* Messages                                                                  */
/* ======================================================================== */

static void log_expired(svc *s, size_t n) {
    kvo_log_limited(&s->rl_expired, KVO_LOG_INFO,
                    "forgot %zu publisher(s) not heard from for %" PRIu64
                    " ms (their sequence state; the index keeps their blocks)",
                    n, s->cfg->feed.publisher_idle_ms);
}

/* Apply one message and log what became of it (rate-limited: a publisher
 * can repeat any of it every message). */
static void apply_msg(svc *s, natsMsg *m) {
    const char *hdr = NULL;
    if (natsMsgHeader_Get(m, HDR_ZMQ_SEQ, &hdr) != NATS_OK) hdr = NULL;
    kvo_err werr;
    memset(&werr, 0, sizeof(werr));
    idx_feed_result res;
    const char *subject = natsMsg_GetSubject(m);
    kvo_status st =
        idx_feed_live(s->feed, subject, (const uint8_t *)natsMsg_GetData(m),
                      (size_t)natsMsg_GetDataLength(m), hdr, &res, &werr);
    if (res.duplicate) {
        kvo_log_limited(&s->rl_dup, KVO_LOG_INFO,
                        "duplicate message on %s dropped (publisher %" PRIu64
                        ", sequence %" PRIu64 ")",
                        subject, res.publisher_id, res.sequence);
    } else if (res.undecodable) {
        char buf[256];
        kvo_log_limited(&s->rl_bad, KVO_LOG_WARN,
                        "undecodable message on %s (%d bytes): %s", subject,
                        natsMsg_GetDataLength(m),
                        kvo_err_str(&werr, buf, sizeof(buf)));
    } else if (st != KVO_OK) { /* out of memory, or a size limit of the tree */
        kvo_log_limited(&s->rl_mem, KVO_LOG_ERROR,
                        "%s applying a message on %s (%u RouterEvent(s) lost)",
                        kvo_strerror(st), subject, res.lost);
    }
    if (res.bad_header)
        kvo_log_limited(&s->rl_hdr, KVO_LOG_WARN,
                        "malformed %s header '%s' on %s (message applied)",
                        HDR_ZMQ_SEQ, hdr ? hdr : "", subject);
    if (res.missed)
        kvo_log_limited(&s->rl_gap, KVO_LOG_WARN,
                        "sequence gap on %s: publisher %" PRIu64
                        " missed %" PRIu64
                        " message(s) before sequence %" PRIu64,
                        subject, res.publisher_id, res.missed, res.sequence);
    if (res.restart)
        kvo_log_limited(&s->rl_restart, KVO_LOG_WARN,
                        "publisher %" PRIu64 " restarted on %s (sequence went "
                        "back to %" PRIu64 ")",
                        res.publisher_id, subject, res.sequence);
    if (res.rewind)
        kvo_log_limited(
            &s->rl_rewind, KVO_LOG_WARN,
            "publisher %" PRIu64 " on %s went on at sequence %" PRIu64
            " after jumping to %" PRIu64 ": the jump is taken for "
            "bogus and the sequence follows the stream",
            res.publisher_id, subject, res.sequence, res.jumped_from);
    if (res.untracked) {
        idx_feed_counters k;
        idx_feed_counters_get(s->feed, &k);
        kvo_log_limited(
            &s->rl_full, KVO_LOG_WARN,
            "publisher table full (%" PRIu64 " publishers): a message "
            "of publisher %" PRIu64 " on %s applied without sequence "
            "tracking (counted in publishers_refused)",
            k.publishers, res.publisher_id, subject);
    }
    if (res.held_dropped)
        kvo_log_limited(&s->rl_held, KVO_LOG_WARN,
                        "publisher %" PRIu64 " is recovering and its hold is "
                        "full: sequence %" PRIu64 " was not held (it will be "
                        "asked for again; counted in live_held_dropped)",
                        res.publisher_id, res.sequence);
    if (res.expired) log_expired(s, res.expired);
}

/* An announce (on <p>.kv-relays, or answering the discover request). */
static void announce_msg(svc *s, natsMsg *m) {
    if (natsMsg_IsNoResponders(m)) return; /* discover: no relay there */
    kvo_err err;
    memset(&err, 0, sizeof(err));
    kvo_status st = idx_feed_announce(s->feed, natsMsg_GetData(m),
                                      (size_t)natsMsg_GetDataLength(m), &err);
    if (st != KVO_OK) {
        char buf[256];
        kvo_log_limited(
            &s->rl_announce, KVO_LOG_WARN,
            "announce on %s not taken (counted in announces_bad): %s",
            natsMsg_GetSubject(m), kvo_err_str(&err, buf, sizeof(buf)));
    }
}

/* A message of a recovery answer: _INBOX.<nuid>.r.<publisher>.<id>. */
static void reply_msg(svc *s, natsMsg *m) {
    const char *subj = natsMsg_GetSubject(m), *hdr = NULL, *kind = NULL;
    uint64_t pub = 0, id = 0;
    char extra;
    if (sscanf(subj + s->inbox_subj_len, ".r.%" SCNu64 ".%" SCNu64 "%c", &pub,
               &id, &extra) != 2)
        pub = id = 0; /* not one of ours: request id 0 is never in flight */
    bool gone = natsMsg_IsNoResponders(m);
    if (natsMsgHeader_Get(m, WIRE_HDR_RECOVERY, &kind) != NATS_OK) kind = NULL;
    if (natsMsgHeader_Get(m, HDR_ZMQ_SEQ, &hdr) != NATS_OK) hdr = NULL;
    kvo_err err;
    memset(&err, 0, sizeof(err));
    kvo_status st = idx_feed_reply(
        s->feed, pub, id, kind, hdr, (const uint8_t *)natsMsg_GetData(m),
        (size_t)natsMsg_GetDataLength(m), gone, &err);
    if (st != KVO_OK) {
        char buf[256];
        kvo_log_limited(&s->rl_reply, KVO_LOG_WARN,
                        "recovery answer on %s not taken (counted in "
                        "recovery_bad): %s",
                        subj, kvo_err_str(&err, buf, sizeof(buf)));
    }
}

static void process(svc *s, const inmsg *im) {
    switch (im->kind) {
    case MSG_EVENT: apply_msg(s, im->m); break;
    case MSG_ANNOUNCE:
    case MSG_DISCOVERED: announce_msg(s, im->m); break;
    default: reply_msg(s, im->m); break;
    }
}

/* Should an apply stop for HTTP? As soon as a request waits, or once
 * apply_budget_us has passed since HTTP was last served. */
static bool http_due(svc *s) {
    return kvo_http_server_due(s->http, s->cfg->apply_budget_us);
}

/* Between two events of an envelope: when HTTP is due, answer what came
 * in (handlers only read the feed and the tree; waiting queries stay held,
 * as the watermark has not moved). */
static void mid_envelope(void *ctx) {
    svc *s = ctx;
    if (!http_due(s)) return;
    s->stats.apply_pauses++;
    kvo_http_server_run(s->http);
}

/* Apply the inbox until HTTP is due (one message at least): take the inbox when the last one taken
 * is done, apply in order, and say how much is still taken (on_msg counts
 * it in the inbox's bound). true when messages are waiting: the loop
 * comes back without polling. */
static bool drain_inbox(svc *s) {
    uint64_t junk;
    ssize_t r = read(s->evfd, &junk, sizeof(junk));
    (void)r;
    if (s->work_i == s->work_n) {
        kvo_free(s->work);
        pthread_mutex_lock(&s->mu);
        s->work = s->inbox;
        s->work_n = s->inbox_len;
        s->work_left = s->inbox_len;
        s->work_bytes = s->inbox_bytes;
        s->inbox = NULL;
        s->inbox_len = s->inbox_cap = s->inbox_bytes = 0;
        pthread_mutex_unlock(&s->mu);
        s->work_i = 0;
    }
    size_t bytes = 0;
    while (s->work_i < s->work_n) {
        inmsg *im = &s->work[s->work_i++];
        bytes += (size_t)natsMsg_GetDataLength(im->m);
        process(s, im);
        natsMsg_Destroy(im->m);
        if (http_due(s)) break;
    }
    pthread_mutex_lock(&s->mu);
    s->work_left = s->work_n - s->work_i;
    s->work_bytes = s->work_bytes > bytes ? s->work_bytes - bytes : 0;
    bool more = s->work_left > 0 || s->inbox_len > 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return more;
}

/* ======================================================================== */
/* HTTP                                                                      */
/* ======================================================================== */

static void waiter_free(waiter *w) {
    if (!w) return;
    idx_request_fini(&w->q);
    kvo_free(w);
}

static kvo_status build_metrics(svc *s, kvo_buf *b);

/* Run the query q and answer r; with_wm: add "covered" and the watermark's
 * first page (a query that waited); "metrics": true adds GET /metrics's
 * text as "metrics" (counters read at the same moment). */
static void answer_query(svc *s, kvo_http_req *r, const idx_request *q,
                         bool with_wm, bool covered) {
    uint64_t t0 = kvo_now_ns();
    kvo_status st = idx_request_query(idx_feed_tree(s->feed),
                                      s->cfg->block_size, q, &s->scores);
    double dt = (double)(kvo_now_ns() - t0) / NS_PER_S;
    if (st != KVO_OK) {
        kvo_http_respond_error(r, 500, kvo_strerror(st));
        return;
    }
    s->queries++;
    s->stats.lat_sum += dt;
    size_t b = 0;
    while (b < NLAT && dt > lat_bounds[b]) b++;
    s->stats.lat_count[b]++;
    json_object *o = idx_json_scores(&s->scores);
    if (o && q->metrics) { /* /metrics, read with the answer */
        kvo_buf text;
        kvo_buf_init(&text);
        json_object *txt = NULL;
        if (build_metrics(s, &text) == KVO_OK)
            txt = json_object_new_string_len(
                text.data ? (const char *)text.data : "", (int)text.len);
        kvo_buf_fini(&text);
        if (!txt) {
            json_object_put(o);
            o = NULL;
        } else {
            json_object_object_add(o, "metrics", txt);
        }
    }
    if (o && with_wm) {
        idx_page first = {.limit = IDX_WATERMARK_PAGE};
        json_object *wm = idx_json_watermark(s->feed, &first);
        if (!wm) {
            json_object_put(o);
            o = NULL;
        } else {
            json_object_object_add(o, "covered",
                                   json_object_new_boolean(covered));
            json_object_object_add(o, "watermark", wm);
        }
    }
    if (!o)
        kvo_http_respond_error(r, 500, "out of memory");
    else
        kvo_http_respond_json(r, 200, o);
}

/* Every pair's publisher has a watermark at or past its seq? */
static bool wait_covered(const svc *s, const uint64_t *pairs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t last;
        if (!idx_feed_zmq_last(s->feed, pairs[2 * i], &last) ||
            last < pairs[2 * i + 1])
            return false;
    }
    return true;
}

/* POST /query (accept = IDX_REQ_TOKENS) or /query_by_hash (HASHES): the
 * body through idx_request_parse, then answered at once or held as a
 * waiter until its watermark or deadline. */
static void do_query(svc *s, kvo_http_req *r, unsigned accept) {
    size_t blen;
    const uint8_t *body = kvo_http_req_body(r, &blen);
    waiter *w = kvo_calloc(1, sizeof(*w));
    if (!w) {
        kvo_http_respond_error(r, 500, "out of memory");
        return;
    }
    idx_request_init(&w->q);
    kvo_err err;
    kvo_status st = idx_request_parse(&w->q, body, blen, accept, &err);
    if (st != KVO_OK) {
        if (st != KVO_ENOMEM) s->stats.bad_requests++;
        kvo_http_respond_error(r, st == KVO_ENOMEM ? 500 : 400, err.msg);
        waiter_free(w);
        return;
    }
    if (!w->q.wait) {
        answer_query(s, r, &w->q, false, false);
        waiter_free(w);
        return;
    }
    uint64_t now = kvo_now_ns();
    w->deadline = now + (uint64_t)w->q.timeout_ms * NS_PER_MS;
    bool covered = wait_covered(s, w->q.pairs, w->q.n_pairs);
    if (covered || now >= w->deadline) {
        answer_query(s, r, &w->q, true, covered);
        waiter_free(w);
        return;
    }
    w->cost = blen + w->q.doc.mem;
    if (s->n_waiters >= WAIT_MAX || w->cost > WAIT_MAX_BYTES - s->wait_bytes) {
        kvo_http_respond_error(r, 503, "too many queries waiting");
        waiter_free(w);
        return;
    }
    w->r = r; /* held: answered by serve_waiters */
    waiter **tail = &s->waiters;
    while (*tail) tail = &(*tail)->next;
    *tail = w;
    s->n_waiters++;
    s->wait_bytes += w->cost;
}

/* Answer the waiting queries whose watermark is there or whose time is
 * up, in arrival order. */
static void serve_waiters(svc *s) {
    if (!s->waiters) return;
    uint64_t now = kvo_now_ns();
    for (waiter **pp = &s->waiters; *pp;) {
        waiter *w = *pp;
        bool covered = wait_covered(s, w->q.pairs, w->q.n_pairs);
        if (!covered && now < w->deadline) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        s->n_waiters--;
        s->wait_bytes -= w->cost;
        answer_query(s, w->r, &w->q, true, covered);
        waiter_free(w);
    }
}

/* Milliseconds until the earliest waiting query times out (-1: none). */
static long waiters_timeout_ms(const svc *s) {
    if (!s->waiters) return -1;
    uint64_t now = kvo_now_ns(), first = UINT64_MAX;
    for (const waiter *w = s->waiters; w; w = w->next)
        if (w->deadline < first) first = w->deadline;
    return first <= now ? 0 : (long)((first - now) / NS_PER_MS) + 1;
}

static void do_watermark(svc *s, kvo_http_req *r) {
    idx_page pg;
    char err[128];
    if (!idx_http_page_args(r, IDX_WATERMARK_PAGE, &pg, err, sizeof(err))) {
        s->stats.bad_requests++;
        kvo_http_respond_error(r, 400, err);
        return;
    }
    json_object *o = idx_json_watermark(s->feed, &pg);
    if (!o)
        kvo_http_respond_error(r, 500, "out of memory");
    else
        kvo_http_respond_json(r, 200, o);
}

/* The dump's events at positions (from 0, in idx_tree_dump's order) above
 * after (all when !has_after), at most limit of them; more: one more
 * followed. */
typedef struct dumpctx {
    kvo_buf *b;
    idx_page pg;
    uint64_t pos; /* position of the next event */
    size_t written;
    bool more;
} dumpctx;

static kvo_status dump_one(void *ctx, const wire_revent *ev) {
    dumpctx *d = ctx;
    uint64_t pos = d->pos++;
    if (d->pg.has_after && pos <= d->pg.after) return KVO_OK;
    if (d->written == d->pg.limit) {
        d->more = true;
        return KVO_EOF; /* stops the dump */
    }
    json_object *j = idx_json_revent(ev);
    if (!j) return KVO_ENOMEM;
    const char *txt = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN);
    kvo_status s =
        kvo_buf_append(d->b, d->written ? "," : "", d->written ? 1 : 0);
    if (s == KVO_OK) s = kvo_buf_append(d->b, txt, strlen(txt));
    d->written++;
    json_object_put(j);
    return s;
}

/* GET /dump: the whole dump as a JSON array when it has at most
 * DUMP_PAGE events (a larger one must be paged); with ?after=K and/or
 * ?limit=N: {"events": [...], "next": K'} ("next", the position of the
 * last event listed, only when more follow). */
static void do_dump(svc *s, kvo_http_req *r) {
    dumpctx d = {0};
    char err[160];
    bool paged = kvo_http_req_arg(r, "after") || kvo_http_req_arg(r, "limit");
    if (!idx_http_page_args(r, DUMP_PAGE, &d.pg, err, sizeof(err))) {
        s->stats.bad_requests++;
        kvo_http_respond_error(r, 400, err);
        return;
    }
    kvo_buf b;
    kvo_buf_init(&b);
    d.b = &b;
    kvo_status st =
        kvo_buf_append(&b, paged ? "{\"events\":[" : "[", paged ? 11 : 1);
    if (st == KVO_OK) st = idx_tree_dump(idx_feed_tree(s->feed), dump_one, &d);
    if (st == KVO_EOF) st = KVO_OK;
    if (st == KVO_OK && d.more && !paged) {
        s->stats.bad_requests++;
        snprintf(err, sizeof(err),
                 "the dump holds more than %d events: page it with "
                 "/dump?limit=N&after=K",
                 DUMP_PAGE);
        kvo_http_respond_error(r, 400, err);
        kvo_buf_fini(&b);
        return;
    }
    if (st == KVO_OK) st = kvo_buf_append(&b, "]", 1);
    if (st == KVO_OK && paged && d.more)
        st = kvo_buf_printf(&b, ",\"next\":%" PRIu64, d.pos - 2);
    if (st == KVO_OK && paged) st = kvo_buf_append(&b, "}", 1);
    if (st != KVO_OK)
        kvo_http_respond_error(r, 500, kvo_strerror(st));
    else
        kvo_http_respond(r, 200, "application/json", b.data, b.len);
    kvo_buf_fini(&b);
}

/* From kvo_nats's callback state: natsConnection_Status waits for the
 * connection lock, which a hanging reconnect attempt holds for up to the
 * connect timeout -- and this loop is the only one serving queries. (The
 * connection is reconnected forever and closed only at shutdown.) */
static const char *nats_state(const svc *s) {
    if (!s->nats || !kvo_nats_conn(s->nats)) return "none";
    if (kvo_nats_up(s->nats)) return "connected";
    return kvo_nats_disconnects(s->nats) ? "reconnecting" : "connecting";
}

/* GET /health: always 200 while the loop runs (probes must not flap), the
 * state in the body: "status" is "recovering" (the discovery window, or a
 * recovery in flight), else "stale" (a recovery failed and nothing has
 * rebuilt those workers since), else "ok". */
static void do_health(svc *s, kvo_http_req *r) {
    json_object *o = json_object_new_object();
    idx_feed_counters k;
    idx_feed_counters_get(s->feed, &k);
    const char *status = idx_feed_is_recovering(s->feed) ? "recovering"
                         : k.stale_publishers            ? "stale"
                                                         : "ok";
    if (!o || !idx_json_recovery(s->feed, o)) {
        json_object_put(o);
        kvo_http_respond_error(r, 500, "out of memory");
        return;
    }
    json_object_object_add(o, "status", json_object_new_string(status));
    json_object_object_add(o, "nats", json_object_new_string(nats_state(s)));
    json_object_object_add(o, "subject",
                           json_object_new_string(s->cfg->subject));
    json_object_object_add(o, "recovery", json_object_new_boolean(s->recovery));
    kvo_http_respond_json(r, 200, o);
}

/* GET /blocks and POST /lookup: every worker is in the one tree. */
static const idx_tree *tree_of(void *ctx, uint64_t worker_id, uint64_t *gen) {
    (void)worker_id;
    svc *s = ctx;
    *gen = idx_feed_generation(s->feed);
    return idx_feed_tree(s->feed);
}

static void do_counters(svc *s, kvo_http_req *r) {
    json_object *o = idx_json_counters(s->feed);
    if (!o) {
        kvo_http_respond_error(r, 500, "out of memory");
        return;
    }
    json_object_object_add(o, "slow_consumer_drops",
                           json_object_new_uint64(nats_dropped(s)));
    json_object_object_add(
        o, "inbox_drops", json_object_new_uint64(atomic_load(&s->inbox_drops)));
    json_object_object_add(o, "queries", json_object_new_uint64(s->queries));
    json_object_object_add(o, "bad_requests",
                           json_object_new_uint64(s->stats.bad_requests));
    kvo_http_server_stats h;
    kvo_http_server_stats_get(s->http, &h);
    json_object_object_add(o, "http_connections",
                           json_object_new_uint64(h.conns));
    json_object_object_add(o, "http_head_timeouts",
                           json_object_new_uint64(h.head_timeouts));
    json_object_object_add(o, "http_body_timeouts",
                           json_object_new_uint64(h.body_timeouts));
    json_object_object_add(o, "http_busy_refused",
                           json_object_new_uint64(h.busy_refused));
    kvo_http_respond_json(r, 200, o);
}

/* The index's families: the tree's events, blocks and size, and the
 * feed's counters (kvo_indexer_* on both listeners). */
void idx_prom_index(kvo_prom *p, const idx_counters *c, const idx_stats *st,
                    const idx_feed_counters *f) {
    kvo_prom_family(p, "events_total", "counter",
                    "RouterEvents applied, by type and status.");
    for (int t = WIRE_R_STORED; t <= WIRE_R_CLEARED; t++)
        for (int k = 0; k < IDX_EV_STATUS_COUNT; k++)
            kvo_prom_u64(p, "events_total", c->events[t][k],
                         "type=\"%s\",status=\"%s\"",
                         idx_rtype_name((wire_rtype)t),
                         idx_evstatus_name((idx_evstatus)k));
    kvo_prom_family(p, "blocks_total", "counter",
                    "Block operations, by outcome.");
    kvo_prom_u64(p, "blocks_total", c->blocks_stored, "op=\"stored\"");
    kvo_prom_u64(p, "blocks_total", c->blocks_removed, "op=\"removed\"");
    kvo_prom_u64(p, "blocks_total", c->blocks_not_found, "op=\"not_found\"");
    kvo_prom_u64(p, "blocks_total", c->hash_mismatch, "op=\"hash_mismatch\"");
    kvo_prom_u64(p, "blocks_total", c->orphans_lost, "op=\"orphan_lost\"");
    kvo_prom_gauge(p, "resident_blocks",
                   "Blocks (tree nodes) held by at least one worker.",
                   st->held);
    kvo_prom_gauge(p, "tree_nodes",
                   "Tree nodes, including emptied ones Dynamo's rules keep.",
                   st->nodes);
    kvo_prom_gauge(p, "pairs",
                   "(block, worker) pairs: entries of the workers' lookups.",
                   st->pairs);
    kvo_prom_gauge(p, "workers", "Known (worker_id, dp_rank) pairs.",
                   st->workers);
    kvo_prom_gauge(p, "memory_bytes", "Memory held by the tree.", st->bytes);
#define IDX_PROM(field, key, prom, type, help)                                 \
    kvo_prom_##type(p, prom, help, f->field);
    IDX_FEED_COUNTERS(IDX_PROM)
#undef IDX_PROM
}

kvo_status idx_metrics_text(idx_feed *feed, const idx_service_stats *s,
                            kvo_buf *b) {
    idx_counters c;
    idx_stats st;
    idx_feed_counters f;
    idx_tree_counters(idx_feed_tree(feed), &c);
    idx_tree_stats(idx_feed_tree(feed), &st);
    idx_feed_counters_get(feed, &f);
    kvo_prom p;
    kvo_prom_init(&p, b, "kvo_indexer_");
    idx_prom_index(&p, &c, &st, &f);
    kvo_prom_counter(&p, "slow_consumer_drops_total",
                     "Messages nats.c dropped (slow consumer).",
                     s->slow_consumer_drops);
    kvo_prom_counter(&p, "inbox_dropped_total",
                     "Messages dropped for want of memory before the loop "
                     "saw them.",
                     s->inbox_drops);
    kvo_prom_counter(&p, "nats_disconnects_total", "NATS disconnects.",
                     s->nats_disconnects);
    kvo_prom_counter(&p, "bad_requests_total", "HTTP requests answered 4xx.",
                     s->bad_requests);
    kvo_prom_counter(&p, "apply_pauses_total",
                     "Times HTTP was served between two events of one "
                     "envelope (a request waited, or its apply outlasted "
                     "--apply-budget-us).",
                     s->apply_pauses);
    kvo_prom_counter(&p, "http_connections_total", "TCP connections accepted.",
                     s->http.conns);
    kvo_prom_counter(&p, "http_head_timeouts_total",
                     "Connections closed: no complete request head in time.",
                     s->http.head_timeouts);
    kvo_prom_counter(&p, "http_body_timeouts_total",
                     "Connections closed: no complete request body in time.",
                     s->http.body_timeouts);
    kvo_prom_counter(&p, "http_busy_refused_total",
                     "Requests answered 503: request bodies in flight over "
                     "the cap.",
                     s->http.busy_refused);
    kvo_prom_family(&p, "query_seconds", "histogram",
                    "Query latency (parse excluded, hashing included).");
    uint64_t cum = 0;
    for (size_t i = 0; i < NLAT; i++) {
        cum += s->lat_count[i];
        kvo_prom_u64(&p, "query_seconds_bucket", cum, "le=\"%g\"",
                     lat_bounds[i]);
    }
    cum += s->lat_count[NLAT];
    kvo_prom_u64(&p, "query_seconds_bucket", cum, "le=\"+Inf\"");
    /* The sum keeps its fixed nanosecond text (%.9f), which kvo_prom_f64
     * (%.17g) would change; it joins the writer's sticky status. */
    kvo_status e = kvo_prom_status(&p);
    if (e == KVO_OK)
        e = kvo_buf_printf(b, "kvo_indexer_query_seconds_sum %.9f\n",
                           s->lat_sum);
    if (e != KVO_OK) return e;
    kvo_prom_u64(&p, "query_seconds_count", cum, NULL);
    return kvo_prom_status(&p);
}

/* GET /metrics's Prometheus text into b, with the counters of nats.c's
 * threads read now. */
static kvo_status build_metrics(svc *s, kvo_buf *b) {
    s->stats.slow_consumer_drops = nats_dropped(s);
    s->stats.inbox_drops = atomic_load(&s->inbox_drops);
    s->stats.nats_disconnects = kvo_nats_disconnects(s->nats);
    kvo_http_server_stats_get(s->http, &s->stats.http);
    return idx_metrics_text(s->feed, &s->stats, b);
}

static void do_metrics(svc *s, kvo_http_req *r) {
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_status e = build_metrics(s, &b);
    if (e != KVO_OK)
        kvo_http_respond_error(r, 500, kvo_strerror(e));
    else
        kvo_http_respond(r, 200, "text/plain; version=0.0.4", b.data, b.len);
    kvo_buf_fini(&b);
}

static void handler(void *ctx, kvo_http_req *r) {
    svc *s = ctx;
    const char *m = kvo_http_req_method(r), *p = kvo_http_req_path(r);
    bool get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0;
    struct {
        const char *path;
        bool post;
    } routes[] = {{"/query", true},    {"/query_by_hash", true},
                  {"/dump", false},    {"/workers", false},
                  {"/health", false},  {"/watermark", false},
                  {"/metrics", false}, {"/blocks", false},
                  {"/lookup", true},   {"/counters", false}};
    size_t i = 0;
    while (i < KVO_ARRAY_LEN(routes) && strcmp(p, routes[i].path) != 0) i++;
    if (i == KVO_ARRAY_LEN(routes)) {
        s->stats.bad_requests++;
        kvo_http_respond_error(r, 404, "no such endpoint");
        return;
    }
    if (routes[i].post ? !post : !get) {
        s->stats.bad_requests++;
        kvo_http_respond_error(r, 405, routes[i].post ? "use POST" : "use GET");
        return;
    }
    json_object *o = NULL;
    switch (i) {
    case 0: do_query(s, r, IDX_REQ_TOKENS); return;
    case 1: do_query(s, r, IDX_REQ_HASHES); return;
    case 2: do_dump(s, r); return;
    case 3: o = idx_json_workers(idx_feed_tree(s->feed)); break;
    case 4: do_health(s, r); return;
    case 5: do_watermark(s, r); return;
    case 6: do_metrics(s, r); return;
    case 7:
        idx_http_blocks(r, tree_of, s, &s->blocks, &s->stats.bad_requests);
        return;
    case 8: idx_http_lookup(r, tree_of, s, &s->stats.bad_requests); return;
    default: do_counters(s, r); return;
    }
    if (!o)
        kvo_http_respond_error(r, 500, "out of memory");
    else
        kvo_http_respond_json(r, 200, o);
}

/* ======================================================================== */
/* Loop                                                                      */
/* ======================================================================== */

/* Connection changes, and messages dropped before the loop saw them.
 * These are counted on nats.c's threads (kvo_nats's connection callbacks,
 * on_msg's inbox drops, the subscription's own drop count), which must not
 * log or touch the loop's state: the loop polls them once per turn and logs
 * each that moved since its last look (the seen_* copies). This is polling
 * another thread's counters, the only way to hear of these events; what a
 * call of the loop's own did comes back from the call (idx_feed_result). */
static void log_nats_changes(svc *s) {
    uint64_t slow = nats_dropped(s), inbox = atomic_load(&s->inbox_drops);
    if (slow != s->seen_nats_dropped || inbox != s->seen_inbox_drops) {
        kvo_log_limited(&s->rl_drop, KVO_LOG_WARN,
                        "messages dropped before indexing: %" PRIu64
                        " by nats.c (slow consumer), %" PRIu64
                        " for want of memory (so far)",
                        slow, inbox);
        s->seen_nats_dropped = slow;
        s->seen_inbox_drops = inbox;
    }
    uint64_t d = kvo_nats_disconnects(s->nats),
             r = kvo_nats_reconnects(s->nats);
    if (d != s->seen_disconnects) {
        kvo_warn("NATS disconnected (%" PRIu64 " so far); reconnecting", d);
        s->seen_disconnects = d;
    }
    if (r != s->seen_reconnects) {
        kvo_info("NATS reconnected (%" PRIu64 " so far)", r);
        s->seen_reconnects = r;
    }
}

/* The second listener: Dynamo's standalone-indexer API (idx_dynamo.c). */
static kvo_status dynamo_setup(svc *s) {
    const idx_service_cfg *cfg = s->cfg;
    char host[256];
    uint16_t port;
    if (kvo_parse_hostport(cfg->dynamo_http, host, sizeof(host), &port) !=
        KVO_OK) {
        kvo_error("bad --dynamo-http '%s': expected HOST:PORT",
                  cfg->dynamo_http);
        return KVO_EINVAL;
    }
    idx_dyn_cfg dc = {.host = host,
                      .port = port,
                      .max_listeners = cfg->dynamo_max_listeners,
                      .apply_budget_us = cfg->apply_budget_us,
                      .feed = cfg->feed};
    kvo_status st = idx_dyn_new(&s->dyn, &dc);
    if (st != KVO_OK) {
        kvo_error("cannot listen on %s: %s", cfg->dynamo_http,
                  kvo_strerror(st));
        return st;
    }
    kvo_info("dynamo API listening on http://%s:%u", host,
             idx_dyn_port(s->dyn));
    return KVO_OK;
}

kvo_status idx_service_run(const idx_service_cfg *cfg) {
    svc s;
    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    if (cfg->nats)
        s.nats_cfg = *cfg->nats;
    else
        kvo_nats_cfg_default(&s.nats_cfg);
    s.evfd = -1;
    idx_scores_init(&s.scores);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    kvo_status st = KVO_OK;
    char host[256];
    uint16_t port;
    if (kvo_parse_hostport(cfg->http, host, sizeof(host), &port) != KVO_OK) {
        kvo_error("bad --http '%s': expected HOST:PORT", cfg->http);
        st = KVO_EINVAL;
        goto done;
    }
    if (cfg->block_size == 0) {
        kvo_error("--block-size must be at least 1");
        st = KVO_EINVAL;
        goto done;
    }
    s.evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s.evfd < 0) {
        kvo_error("eventfd: %s", strerror(errno));
        st = KVO_EIO;
        goto done;
    }
    if ((st = idx_feed_new(&s.feed, &cfg->feed)) != KVO_OK) goto done;
    idx_feed_set_clock(s.feed, kvo_now_ns() / NS_PER_MS);
    idx_blockset_init(&s.blocks);
    if (!cfg->no_recovery) {
        s.recovery = recovery_subjects(&s);
        if (!s.recovery)
            kvo_warn("--subject %s is not namespace.NS.component.C.kv-events: "
                     "recovery is off (gaps are counted only)",
                     cfg->subject);
    }
    if (s.recovery) {
        idx_rec_io io = {.ask = ask_relay, .note = rec_note, .ctx = &s};
        idx_feed_recovery(s.feed, &io);
    }
    if ((st = nats_setup(&s)) != KVO_OK) goto done;
    kvo_http_server_cfg hc = {.host = host,
                              .port = port,
                              .max_body =
                                  cfg->max_body ? cfg->max_body : HTTP_MAX_BODY,
                              .handler = handler,
                              .ctx = &s};
    if ((st = kvo_http_server_new(&s.http, &hc)) != KVO_OK) {
        kvo_error("cannot listen on %s: %s", cfg->http, kvo_strerror(st));
        goto done;
    }
    kvo_info("listening on http://%s:%u", host, kvo_http_server_port(s.http));
    idx_feed_set_pause(s.feed, mid_envelope, &s);
    if (cfg->dynamo_http && (st = dynamo_setup(&s)) != KVO_OK) goto done;
    s.max_items = 2 + (s.dyn ? idx_dyn_max_items(s.dyn) : 0);
    s.items = kvo_calloc(s.max_items, sizeof(*s.items));
    if (!s.items) {
        st = KVO_ENOMEM;
        goto done;
    }
    bool more = false; /* messages are waiting: do not sleep */
    while (!kvo_stop) {
        long t = kvo_http_server_timeout_ms(s.http);
        long timeout = t < 0 || t > LOOP_POLL_MS ? LOOP_POLL_MS : t;
        long wt = waiters_timeout_ms(&s);
        if (wt >= 0 && wt < timeout) timeout = wt;
        long dt = s.dyn ? idx_dyn_timeout_ms(s.dyn) : -1;
        if (dt >= 0 && dt < timeout) timeout = dt;
        if (more) timeout = 0;
        s.items[0] = (zmq_pollitem_t){NULL, s.evfd, ZMQ_POLLIN, 0};
        s.items[1] =
            (zmq_pollitem_t){NULL, kvo_http_server_fd(s.http), ZMQ_POLLIN, 0};
        size_t ni = 2;
        if (s.dyn) ni += idx_dyn_pollitems(s.dyn, s.items + 2, s.max_items - 2);
        int n = zmq_poll(s.items, (int)ni, timeout);
        if (n < 0 && zmq_errno() != EINTR) {
            kvo_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            st = KVO_EIO;
            break;
        }
        idx_feed_set_clock(s.feed, kvo_now_ns() / NS_PER_MS);
        if (more || (n > 0 && (s.items[0].revents & ZMQ_POLLIN)))
            more = drain_inbox(&s);
        if (s.dyn) idx_dyn_run(s.dyn);
        idx_feed_tick(s.feed);
        size_t gone = idx_feed_expire(s.feed);
        if (gone) log_expired(&s, gone);
        serve_waiters(&s);
        kvo_http_server_run(s.http);
        log_nats_changes(&s);
    }
    if (kvo_stop) kvo_info("stopping");
done:
    idx_dyn_free(s.dyn);
    kvo_free(s.items);
    kvo_http_server_free(s.http); /* held queries get 503 */
    while (s.waiters) {
        waiter *w = s.waiters;
        s.waiters = w->next;
        waiter_free(w);
    }
    nats_teardown(&s);
    for (size_t i = 0; i < s.inbox_len; i++) natsMsg_Destroy(s.inbox[i].m);
    kvo_free(s.inbox);
    for (size_t i = s.work_i; i < s.work_n; i++) natsMsg_Destroy(s.work[i].m);
    kvo_free(s.work);
    kvo_free(s.inbox_subj);
    idx_blockset_fini(&s.blocks);
    idx_feed_free(s.feed);
    idx_scores_fini(&s.scores);
    if (s.evfd >= 0) close(s.evfd);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    return st;
}
