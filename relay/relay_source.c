/* relay_source.c -- one ZMQ publisher: a SUB socket for live batches and,
 * when the publisher has a replay ROUTER, a DEALER opened on demand.
 *
 * The DEALER is closed when a replay is abandoned (timeout, restart), so the
 * late replies of an old request can never be mistaken for a new one.
 *
 * Each socket is watched through libzmq's socket monitor (an inproc PAIR
 * per socket, closed with it). The events become relay_link values:
 *
 *   SUB     HANDSHAKE_SUCCEEDED -> SUB_UP     DISCONNECTED -> SUB_DOWN
 *   DEALER  DISCONNECTED after a HANDSHAKE_SUCCEEDED -> REPLAY_DOWN
 *   either  HANDSHAKE_FAILED_{PROTOCOL,AUTH,NO_DETAIL} -> HANDSHAKE_FAILED
 *
 * A DEALER connection that never finished its handshake carried no reply,
 * so its end is no REPLAY_DOWN (the pipe would take it for a batch that
 * breaks the connection): the replay waits, and times out if nothing
 * comes.
 *
 * libzmq reconnects a connecting socket after a connection error (the
 * monitor then says CONNECT_RETRIED right after DISCONNECTED), but not after
 * a protocol error, and a frame over ZMQ_MAXMSGSIZE is one: that SUB would
 * stay silent for ever. So a connecting SUB that said DISCONNECTED and not
 * CONNECT_RETRIED within RELAY_SOURCE_REOPEN_MS is made anew (SUB_REOPENED).
 * A bound SUB needs no such care: the publisher's side reconnects. */
#include "relay_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

/* The monitor events asked for (the rest would only be read and ignored). */
#define MONITOR_EVENTS                                                         \
    (ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED |                      \
     ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |    \
     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
/* A monitor event's first frame: u16 event, u32 value (host order). */
#define MONITOR_HEAD_BYTES 6
/* Longest inproc endpoint name of a monitor. */
#define MONITOR_EP_MAX 64

/* A socket and the PAIR that receives its monitor events. */
typedef struct watched {
    void *sock;
    void *mon;
    bool up; /* a handshake succeeded since the last DISCONNECTED */
} watched;

struct relay_source {
    void *zctx;
    relay_source_cfg cfg;
    char *endpoint, *topic, *replay_endpoint;
    watched sub;
    watched dealer;
    uint64_t sub_lost_at; /* connecting SUB: DISCONNECTED and no retry since
                           * (monotonic ns; 0 = connected or retrying) */
    uint64_t reopen_at;   /* when to try a failed reopen again (0 = none) */
    uint32_t monitors;    /* numbers the monitors' inproc endpoints */
    int open_errno;       /* zmq_errno of the last failed sub_open */
    zmq_msg_t parts[WIRE_CAP_MAX_FRAMES];
    uint32_t nparts; /* initialised zmq_msg_t in parts */
};

static kvo_status set_common(void *sock, const relay_source_cfg *cfg) {
    int linger = cfg->linger_ms;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0)
        return KVO_ENET;
    if (cfg->hwm >= 0 &&
        (zmq_setsockopt(sock, ZMQ_RCVHWM, &cfg->hwm, sizeof(cfg->hwm)) != 0 ||
         zmq_setsockopt(sock, ZMQ_SNDHWM, &cfg->hwm, sizeof(cfg->hwm)) != 0))
        return KVO_ENET;
    if (cfg->max_msg_bytes != 0 &&
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &cfg->max_msg_bytes,
                       sizeof(cfg->max_msg_bytes)) != 0)
        return KVO_ENET;
    return KVO_OK;
}

/* Close w's socket and its monitor (events not read yet go with it). */
static void unwatch(watched *w) {
    if (w->sock && w->mon) zmq_socket_monitor(w->sock, NULL, 0);
    if (w->mon) zmq_close(w->mon);
    if (w->sock) zmq_close(w->sock);
    w->sock = w->mon = NULL;
    w->up = false;
}

/* A socket of type with the common options and a monitor, not connected
 * yet (so the monitor sees every connection). */
static kvo_status watch_new(relay_source *s, int type, watched *out) {
    watched w = {zmq_socket(s->zctx, type), NULL, false};
    if (!w.sock || set_common(w.sock, &s->cfg) != KVO_OK) goto fail;
    char ep[MONITOR_EP_MAX];
    snprintf(ep, sizeof(ep), "inproc://kvo-relay-monitor-%p-%u", (void *)s,
             s->monitors++);
    if (zmq_socket_monitor(w.sock, ep, MONITOR_EVENTS) != 0) goto fail;
    w.mon = zmq_socket(s->zctx, ZMQ_PAIR);
    int zero = 0;
    if (!w.mon || zmq_setsockopt(w.mon, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_connect(w.mon, ep) != 0)
        goto fail;
    *out = w;
    return KVO_OK;
fail:
    s->open_errno = zmq_errno(); /* before the closes below change it */
    unwatch(&w);
    return KVO_ENET;
}

/* A new SUB, subscribed and connected (or bound); *out untouched on
 * failure. */
static kvo_status sub_open(relay_source *s, watched *out) {
    watched w;
    kvo_status st = watch_new(s, ZMQ_SUB, &w);
    if (st != KVO_OK) return st;
    int rc = zmq_setsockopt(w.sock, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic));
    if (rc == 0)
        rc = s->cfg.bind ? zmq_bind(w.sock, s->endpoint)
                         : zmq_connect(w.sock, s->endpoint);
    if (rc != 0) {
        s->open_errno = zmq_errno();
        st = s->open_errno == EINVAL || s->open_errno == EPROTONOSUPPORT
                 ? KVO_EINVAL
                 : KVO_ENET;
        unwatch(&w);
        return st;
    }
    *out = w;
    return KVO_OK;
}

kvo_status relay_source_new(relay_source **out, void *zctx,
                            const relay_source_cfg *cfg) {
    if (!cfg->endpoint) return KVO_EINVAL;
    kvo_status st = KVO_ENOMEM;
    relay_source *s = kvo_calloc(1, sizeof(*s));
    if (!s) return KVO_ENOMEM;
    s->zctx = zctx;
    s->cfg = *cfg;
    s->endpoint = kvo_strdup(cfg->endpoint);
    s->topic = kvo_strdup(cfg->topic ? cfg->topic : "");
    if (cfg->replay_endpoint)
        s->replay_endpoint = kvo_strdup(cfg->replay_endpoint);
    if (!s->endpoint || !s->topic ||
        (cfg->replay_endpoint && !s->replay_endpoint))
        goto fail;
    s->cfg.endpoint = s->endpoint;
    s->cfg.topic = s->topic;
    s->cfg.replay_endpoint = s->replay_endpoint;
    st = sub_open(s, &s->sub);
    if (st != KVO_OK) goto fail;
    *out = s;
    return KVO_OK;
fail:
    relay_source_free(s);
    return st;
}

static void parts_close(relay_source *s) {
    for (uint32_t i = 0; i < s->nparts; i++) zmq_msg_close(&s->parts[i]);
    s->nparts = 0;
}

void relay_source_free(relay_source *s) {
    if (!s) return;
    parts_close(s);
    unwatch(&s->sub);
    unwatch(&s->dealer);
    kvo_free(s->endpoint);
    kvo_free(s->topic);
    kvo_free(s->replay_endpoint);
    kvo_free(s);
}

void *relay_source_sub(relay_source *s) { return s->sub.sock; }
void *relay_source_dealer(relay_source *s) { return s->dealer.sock; }
void *relay_source_sub_monitor(relay_source *s) { return s->sub.mon; }
void *relay_source_dealer_monitor(relay_source *s) { return s->dealer.mon; }

kvo_status relay_source_replay_request(relay_source *s, uint64_t from_seq) {
    if (!s->replay_endpoint) return KVO_ENOTFOUND;
    if (!s->dealer.sock) {
        if (watch_new(s, ZMQ_DEALER, &s->dealer) != KVO_OK) return KVO_ENET;
        if (zmq_connect(s->dealer.sock, s->replay_endpoint) != 0) {
            unwatch(&s->dealer);
            return KVO_ENET;
        }
    }
    uint8_t seq[8];
    wire_seq_put(seq, from_seq);
    /* DONTWAIT: a DEALER with no peer yet queues (up to its HWM); a full
     * queue means the request cannot go out now, which the pipe counts. */
    if (zmq_send(s->dealer.sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) != 0 ||
        zmq_send(s->dealer.sock, seq, sizeof(seq), ZMQ_DONTWAIT) !=
            (int)sizeof(seq))
        return KVO_ENET;
    return KVO_OK;
}

void relay_source_replay_abort(relay_source *s) { unwatch(&s->dealer); }

/* One monitor event of w: true with its kind, false when none is waiting. */
static bool monitor_next(watched *w, uint16_t *event) {
    if (!w->mon) return false;
    for (;;) {
        zmq_msg_t head, addr;
        zmq_msg_init(&head);
        if (zmq_msg_recv(&head, w->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&head);
            return false;
        }
        bool ok = zmq_msg_size(&head) == MONITOR_HEAD_BYTES;
        if (ok) memcpy(event, zmq_msg_data(&head), sizeof(*event));
        /* The second frame (the endpoint) is said nowhere: skip it. */
        bool more = zmq_msg_more(&head);
        zmq_msg_close(&head);
        while (more) {
            zmq_msg_init(&addr);
            if (zmq_msg_recv(&addr, w->mon, 0) < 0)
                more = false;
            else
                more = zmq_msg_more(&addr);
            zmq_msg_close(&addr);
        }
        if (ok) return true;
    }
}

static bool handshake_failed(uint16_t ev) {
    return ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
           ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
           ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
}

kvo_status relay_source_event(relay_source *s, uint64_t now_ns,
                              relay_link *what, kvo_err *err) {
    uint16_t ev;
    while (monitor_next(&s->sub, &ev)) {
        if (ev == ZMQ_EVENT_DISCONNECTED) {
            if (!s->cfg.bind && !s->sub_lost_at) s->sub_lost_at = now_ns;
            *what = RELAY_LINK_SUB_DOWN;
            return KVO_OK;
        }
        if (ev == ZMQ_EVENT_CONNECT_RETRIED) s->sub_lost_at = 0;
        if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            s->sub_lost_at = 0;
            *what = RELAY_LINK_SUB_UP;
            return KVO_OK;
        }
        if (handshake_failed(ev)) {
            *what = RELAY_LINK_HANDSHAKE_FAILED;
            return KVO_OK;
        }
    }
    while (monitor_next(&s->dealer, &ev)) {
        if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) s->dealer.up = true;
        if (ev == ZMQ_EVENT_DISCONNECTED && s->dealer.up) {
            s->dealer.up = false;
            *what = RELAY_LINK_REPLAY_DOWN;
            return KVO_OK;
        }
        if (handshake_failed(ev)) {
            *what = RELAY_LINK_HANDSHAKE_FAILED;
            return KVO_OK;
        }
    }
    uint64_t due = relay_source_deadline(s);
    if (!due || now_ns < due) return KVO_EAGAIN;
    /* libzmq gave this SUB up: a new one (the old one holds nothing more,
     * its connection is gone). */
    watched fresh;
    kvo_status st = sub_open(s, &fresh);
    if (st != KVO_OK) {
        s->reopen_at = now_ns + RELAY_SOURCE_REOPEN_MS * RELAY_NS_PER_MS;
        return kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                           "cannot make a new SUB for %s: %s", s->endpoint,
                           zmq_strerror(s->open_errno));
    }
    unwatch(&s->sub);
    s->sub = fresh;
    s->sub_lost_at = 0;
    s->reopen_at = 0;
    *what = RELAY_LINK_SUB_REOPENED;
    return KVO_OK;
}

uint64_t relay_source_deadline(const relay_source *s) {
    if (!s->sub_lost_at) return 0;
    if (s->reopen_at) return s->reopen_at;
    return s->sub_lost_at + RELAY_SOURCE_REOPEN_MS * RELAY_NS_PER_MS;
}

static kvo_status recv_multipart(relay_source *s, void *sock, relay_rx *rx) {
    parts_close(s);
    rx->n = 0;
    if (!sock) return KVO_EAGAIN;
    for (;;) {
        zmq_msg_t tmp;
        zmq_msg_t *m =
            s->nparts < WIRE_CAP_MAX_FRAMES ? &s->parts[s->nparts] : &tmp;
        zmq_msg_init(m);
        int flags = rx->n == 0 ? ZMQ_DONTWAIT : 0;
        if (zmq_msg_recv(m, sock, flags) < 0) {
            int e = errno;
            zmq_msg_close(m);
            if (rx->n == 0 && e == EAGAIN) return KVO_EAGAIN;
            if (e == EINTR && rx->n == 0) return KVO_EAGAIN;
            return KVO_ENET;
        }
        bool more = zmq_msg_more(m);
        if (m == &tmp) {
            zmq_msg_close(m);
        } else {
            rx->frames[s->nparts].data = zmq_msg_data(m);
            rx->frames[s->nparts].len = zmq_msg_size(m);
            s->nparts++;
        }
        rx->n++;
        if (!more) break;
    }
    return KVO_OK;
}

kvo_status relay_source_recv_sub(relay_source *s, relay_rx *rx) {
    return recv_multipart(s, s->sub.sock, rx);
}

kvo_status relay_source_recv_dealer(relay_source *s, relay_rx *rx) {
    return recv_multipart(s, s->dealer.sock, rx);
}
