/* relay_nats.c -- the NATS side: the shared client setup (kvo_nats.h:
 * every --nats* option, reconnect forever, bounded close) plus the relay's
 * own (servers in the given order, each envelope written at once, a bounded
 * reconnect buffer), and envelopes published with the KVO-Zmq-Seq header.
 *
 * nats.c 3.4 does not expose its buffer size, so "buffered" counts the
 * messages accepted while the connection was down: they sit in the
 * reconnect buffer until the next reconnect flushes them. Each is counted
 * against the reconnect it waits for (held_epoch = the reconnect count when
 * it was published), so once that reconnect happened they are gone.
 *
 * kvo_nats says what the connection did only as counters bumped by nats.c's
 * threads; relay_nats_watch is the one place that turns them into news for
 * the loop.
 *
 * Requests (recovery, discover) arrive on nats.c's threads and are handed
 * to the loop, which alone touches the pipe:
 *
 *   nats.c thread --on_request--> queue (mutex, REQUESTS_MAX) --eventfd--+
 *                                                                        v
 *   loop: zmq_poll(..., eventfd) -> relay_nats_req_next -> answer -> done
 *
 * A full queue makes the callback wait (the loop is behind), so nats.c's
 * pending limits (PENDING_*, per subscription) take over and drop what
 * goes beyond them (counted as recovery_requests_dropped: the requester
 * times out and asks again). A storm of requests costs at most
 * REQUESTS_MAX messages here plus those limits.
 * The eventfd is written when the queue stops being empty and drained, under
 * the lock, when the loop finds it empty. */
#include "relay_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define FLUSH_MS 2000           /* at exit, while connected */
#define SUBSCRIBE_FLUSH_MS 2000 /* the server has the subscriptions */
#define REQUESTS_MAX 256        /* requests waiting for the loop */
#define PENDING_MSGS 4096       /* nats.c's pending limits per subscription */
#define PENDING_BYTES (4 << 20)
#define DEFAULT_MAX_PAYLOAD (1 << 20) /* when the server has not said */

/* What a subscription's callback gets: where to queue, and what it hears. */
typedef struct listener {
    relay_nats *n;
    relay_req_kind kind;
} listener;

typedef struct queued {
    natsMsg *m;
    relay_req_kind kind;
} queued;

struct relay_nats {
    kvo_nats *k;
    uint64_t held;       /* published while down, waiting for ... */
    uint64_t held_epoch; /* ... the reconnect after this many reconnects */
    uint64_t held_total; /* every message that went through the buffer */
    uint64_t told_disconnects, told_reconnects; /* by relay_nats_watch */

    /* requests: the subscriptions, and the queue nats.c's threads fill */
    natsSubscription *sub[RELAY_REQ_COUNT];
    listener who[RELAY_REQ_COUNT];
    uint64_t sub_dropped[RELAY_REQ_COUNT]; /* nats.c's counts, last read */
    pthread_mutex_t mu;
    pthread_cond_t room;        /* the queue has room, or stopping */
    queued queue[REQUESTS_MAX]; /* circular */
    size_t qhead, qlen;
    bool stopping;
    uint64_t dropped;
    int evfd;
};

kvo_status relay_nats_new(relay_nats **out, const relay_cfg *cfg, char *err,
                          size_t errsz) {
    relay_nats *n = kvo_calloc(1, sizeof(*n));
    if (!n) {
        snprintf(err, errsz, "%s", kvo_strerror(KVO_ENOMEM));
        return KVO_ENOMEM;
    }
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->room, NULL);
    n->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (n->evfd < 0) {
        snprintf(err, errsz, "eventfd: %s", strerror(errno));
        relay_nats_free(n);
        return KVO_EIO;
    }
    kvo_status st = kvo_nats_new(&n->k, &cfg->nats, "kvo-relay", err, errsz);
    natsOptions *o = st == KVO_OK ? kvo_nats_options(n->k) : NULL;
    natsStatus s = NATS_OK;
    if (o) s = natsOptions_SetNoRandomize(o, true);
    /* Write each envelope at once instead of waiting for nats.c's flusher
     * thread (~1 ms): envelopes are already batched, and lockstep drivers
     * (kvo-check) wait on every watermark. */
    if (o && s == NATS_OK) s = natsOptions_SetSendAsap(o, true);
    if (s != NATS_OK) {
        snprintf(err, errsz, "NATS options: %s", natsStatus_GetText(s));
        st = KVO_ENATS;
    }
    if (st == KVO_OK) st = kvo_nats_connect(n->k, err, errsz);
    if (st == KVO_EAGAIN) st = KVO_OK; /* nats.c keeps trying */
    if (st != KVO_OK) {
        relay_nats_free(n);
        return st;
    }
    *out = n;
    return KVO_OK;
}

void relay_nats_free(relay_nats *n) {
    if (!n) return;
    pthread_mutex_lock(&n->mu);
    n->stopping = true; /* later requests are dropped at once */
    pthread_cond_broadcast(&n->room);
    pthread_mutex_unlock(&n->mu);
    kvo_nats_close(n->k, FLUSH_MS);
    for (int i = 0; i < RELAY_REQ_COUNT; i++)
        natsSubscription_Destroy(n->sub[i]);
    kvo_nats_free(n->k);
    for (; n->qlen; n->qlen--, n->qhead = (n->qhead + 1) % REQUESTS_MAX)
        natsMsg_Destroy(n->queue[n->qhead].m);
    if (n->evfd >= 0) close(n->evfd);
    pthread_cond_destroy(&n->room);
    pthread_mutex_destroy(&n->mu);
    kvo_free(n);
}

bool relay_nats_connected(relay_nats *n) { return kvo_nats_up(n->k); }

/* One message, with a KVO-Recovery header when recovery is not NULL and
 * KVO-Zmq-Seq when has_range. */
static kvo_status send_msg(relay_nats *n, const char *subject,
                           const char *recovery, bool has_range, uint64_t first,
                           uint64_t last, const uint8_t *body, size_t len) {
    if (len > INT32_MAX) return KVO_ETOOBIG;
    natsMsg *m = NULL;
    natsStatus s =
        natsMsg_Create(&m, subject, NULL, (const char *)body, (int)len);
    if (s == NATS_OK && recovery)
        s = natsMsgHeader_Set(m, WIRE_HDR_RECOVERY, recovery);
    if (s == NATS_OK && has_range) {
        char v[48]; /* "<u64>-<u64>": 41 bytes at most */
        snprintf(v, sizeof(v), "%" PRIu64 "-%" PRIu64, first, last);
        s = natsMsgHeader_Set(m, WIRE_HDR_ZMQ_SEQ, v);
    }
    bool down = !kvo_nats_up(n->k);
    if (s == NATS_OK) s = natsConnection_PublishMsg(kvo_nats_conn(n->k), m);
    natsMsg_Destroy(m);
    if (s == NATS_OK) {
        if (down) {
            uint64_t epoch = kvo_nats_reconnects(n->k);
            if (epoch != n->held_epoch) n->held = 0; /* those were flushed */
            n->held_epoch = epoch;
            n->held++;
            n->held_total++;
        }
        return KVO_OK;
    }
    return s == NATS_INSUFFICIENT_BUFFER ? KVO_EAGAIN : KVO_ENATS;
}

kvo_status relay_nats_publish(relay_nats *n, const char *subject,
                              bool has_range, uint64_t first, uint64_t last,
                              const uint8_t *body, size_t len) {
    return send_msg(n, subject, NULL, has_range, first, last, body, len);
}

kvo_status relay_nats_reply(relay_nats *n, const char *to, wire_reply_kind kind,
                            bool has_range, uint64_t first, uint64_t last,
                            const uint8_t *body, size_t len) {
    return send_msg(n, to, wire_reply_kind_name(kind), has_range, first, last,
                    body, len);
}

size_t relay_nats_max_payload(relay_nats *n) {
    int64_t m = natsConnection_GetMaxPayload(kvo_nats_conn(n->k));
    return m > 0 ? (size_t)m : DEFAULT_MAX_PAYLOAD;
}

/* ---- requests --------------------------------------------------------------*/

/* nats.c's thread: queue the request for the loop (waiting for room), or
 * drop it when stopping. */
static void on_request(natsConnection *nc, natsSubscription *sub, natsMsg *m,
                       void *closure) {
    (void)nc;
    (void)sub;
    const listener *l = closure;
    relay_nats *n = l->n;
    pthread_mutex_lock(&n->mu);
    while (!n->stopping && n->qlen == REQUESTS_MAX)
        pthread_cond_wait(&n->room, &n->mu);
    bool keep = !n->stopping;
    if (keep)
        n->queue[(n->qhead + n->qlen++) % REQUESTS_MAX] = (queued){m, l->kind};
    else
        n->dropped++;
    bool wake = keep && n->qlen == 1;
    pthread_mutex_unlock(&n->mu);
    if (!keep) natsMsg_Destroy(m);
    if (wake) {
        uint64_t one = 1;
        ssize_t w = write(n->evfd, &one, sizeof(one));
        (void)w; /* a full eventfd counter still wakes the loop */
    }
}

kvo_status relay_nats_listen(relay_nats *n, const char *const *subjects,
                             char *err, size_t errsz) {
    natsConnection *nc = kvo_nats_conn(n->k);
    natsStatus s = NATS_OK;
    int i = 0;
    for (; i < RELAY_REQ_COUNT && s == NATS_OK; i++) {
        n->who[i] = (listener){n, (relay_req_kind)i};
        s = kvo_nats_subscribe(n->k, &n->sub[i], subjects[i], on_request,
                               &n->who[i]);
        if (s == NATS_OK)
            s = natsSubscription_SetPendingLimits(n->sub[i], PENDING_MSGS,
                                                  PENDING_BYTES);
    }
    if (s == NATS_OK) s = natsConnection_FlushTimeout(nc, SUBSCRIBE_FLUSH_MS);
    if (s != NATS_OK) {
        snprintf(err, errsz, "NATS subscribe to %s: %s", subjects[i - 1],
                 natsStatus_GetText(s));
        return KVO_ENATS;
    }
    return KVO_OK;
}

int relay_nats_wake_fd(const relay_nats *n) { return n->evfd; }

bool relay_nats_req_next(relay_nats *n, relay_req *r) {
    queued q = {NULL, RELAY_REQ_RECOVERY};
    pthread_mutex_lock(&n->mu);
    if (n->qlen) {
        q = n->queue[n->qhead];
        n->qhead = (n->qhead + 1) % REQUESTS_MAX;
        n->qlen--;
        pthread_cond_signal(&n->room);
    } else {
        uint64_t v;
        ssize_t got = read(n->evfd, &v, sizeof(v)); /* no wake pending */
        (void)got;
    }
    pthread_mutex_unlock(&n->mu);
    if (!q.m) return false;
    r->kind = q.kind;
    r->reply = natsMsg_GetReply(q.m);
    r->body = (const uint8_t *)natsMsg_GetData(q.m);
    r->len = (size_t)natsMsg_GetDataLength(q.m);
    r->msg = q.m;
    return true;
}

bool relay_nats_req_waiting(relay_nats *n) {
    pthread_mutex_lock(&n->mu);
    bool w = n->qlen > 0;
    pthread_mutex_unlock(&n->mu);
    return w;
}

void relay_nats_req_done(relay_req *r) {
    natsMsg_Destroy(r->msg);
    r->msg = NULL;
}

void relay_nats_stats(relay_nats *n, relay_stats *st) {
    st->nats_disconnects = kvo_nats_disconnects(n->k);
    st->nats_reconnects = kvo_nats_reconnects(n->k);
    st->nats_connected = relay_nats_connected(n);
    st->nats_buffered = n->held_epoch == st->nats_reconnects ? n->held : 0;
    st->nats_buffered_total = n->held_total;
    pthread_mutex_lock(&n->mu);
    uint64_t dropped = n->dropped;
    pthread_mutex_unlock(&n->mu);
    /* and what nats.c dropped before the callback (its pending limits;
     * the last count read stays when the subscription cannot say) */
    for (int i = 0; i < RELAY_REQ_COUNT; i++) {
        int64_t d = 0;
        if (n->sub[i] &&
            natsSubscription_GetDropped(n->sub[i], &d) == NATS_OK &&
            (uint64_t)d > n->sub_dropped[i])
            n->sub_dropped[i] = (uint64_t)d;
        dropped += n->sub_dropped[i];
    }
    st->recovery_requests_dropped = dropped;
}

relay_nats_news relay_nats_watch(relay_nats *n) {
    relay_nats_news news = {0};
    uint64_t d = kvo_nats_disconnects(n->k), r = kvo_nats_reconnects(n->k);
    news.went_down = d != n->told_disconnects;
    news.came_back = r != n->told_reconnects;
    news.reconnects = r;
    n->told_disconnects = d;
    n->told_reconnects = r;
    return news;
}
