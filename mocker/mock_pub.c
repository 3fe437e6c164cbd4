/* mock_pub.c -- one rank's event publisher, as vLLM's ZmqEventPublisher:
 *
 *   PUB     [topic][seq u64 BE][payload] per batch, seq from 0, +1 per batch
 *   ROUTER  replay: request [identity]["" ][start seq u64 BE] (what a DEALER
 *           sending ["", seq] or a REQ sending [seq] looks like); reply, for
 *           every buffered batch with seq >= start, [identity]["" ][topic]
 *           [seq][payload] (vLLM >= 0.26), then the end marker [identity]
 *           ["" ][""][FF x 8][""]. A start older than the ring silently
 *           begins at the oldest batch it still holds.
 *   ring    the last `ring` batches (and at most ring_bytes of payload),
 *           oldest dropped first.
 *   record  every published message, 3 frames, to a capture file.
 *
 * Two mutants live here, not in the renderer: replay-drops-topic (replies
 * [id]["" ][seq][payload], the end marker [id]["" ][FF x 8][""]) and
 * replay-drops-tail (the last REPLAY_TAIL_DROPPED batches of every reply and
 * its end marker are never sent).
 *
 * Without a ZMQ context the publisher still numbers, buffers and records
 * (trace mode with --record when no port could be bound). Sockets set
 * ZMQ_LINGER. The ROUTER's send high-water mark holds REPLAY_QUEUED whole
 * replays per client: one replay is never cut short (as by libzmq's default
 * of 1000 messages), and a client that asks again and again without reading
 * costs a bounded queue. With ZMQ_ROUTER_MANDATORY a reply that does not fit
 * (or whose client is gone) is cut short and counted (replay_cut) instead
 * of vanishing; the client sees no end marker.
 *
 * A payload is copied once, into a reference-counted block that the ring,
 * the PUB frame and every replay of it share (zmq_msg_init_data: libzmq's
 * I/O thread drops its reference when the frame is on the wire), instead of
 * once for the ring and once more inside each zmq_send.
 */
#include "mock_int.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

/* replay-drops-tail: batches lost from the end of every replay. */
#define REPLAY_TAIL_DROPPED 2
/* Whole replays (ring + end marker) the ROUTER queues per client. */
#define REPLAY_QUEUED 4
/* How long a closing PUB may still send queued batches; a ROUTER's
 * replies are dropped at once. */
#define PUB_LINGER_MS 500
#define ROUTER_LINGER_MS 0
/* PUB send high-water mark when none is configured (vLLM's publisher
 * default): batches queued per subscriber before ZeroMQ drops them. */
#define PUB_HWM_DEFAULT 100000

/* One published payload, shared by the ring and libzmq's I/O thread. */
typedef struct payload {
    atomic_uint refs;
    size_t len;
    uint8_t data[];
} payload;

static void payload_unref(payload *p) {
    if (p && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
        kvo_free(p);
}

/* libzmq's free callback (its I/O thread): the frame has gone. */
static void payload_sent(void *data, void *hint) {
    (void)data;
    payload_unref(hint);
}

typedef struct ring_ent {
    uint64_t seq;
    payload *p;
} ring_ent;

struct mock_pub {
    void *pub;
    void *router;
    char endpoint[256];
    char replay_endpoint[256];
    char *topic;
    size_t topic_len;
    uint64_t next_seq;
    ring_ent *ring;
    uint32_t ring_cap, ring_head, ring_n;
    uint64_t ring_bytes, ring_bytes_max;
    wire_cap_writer *record;
    bool drop_topic, drop_tail; /* replay mutants */
    mock_pub_stats st;
};

static void close_socket(void **s) {
    if (*s) zmq_close(*s);
    *s = NULL;
}

static kvo_status bind_socket(void *ctx, int type, const char *endpoint,
                              int linger, int sndhwm, void **out, char *bound,
                              size_t boundsz, char *err, size_t errsz) {
    void *s = zmq_socket(ctx, type);
    if (!s) {
        snprintf(err, errsz, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        return KVO_ENET;
    }
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s, ZMQ_SNDHWM, &sndhwm, sizeof(sndhwm));
    if (zmq_bind(s, endpoint) != 0) {
        snprintf(err, errsz, "bind %s: %s", endpoint,
                 zmq_strerror(zmq_errno()));
        zmq_close(s);
        return KVO_ENET;
    }
    size_t n = boundsz;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, bound, &n) != 0)
        snprintf(bound, boundsz, "%s", endpoint);
    *out = s;
    return KVO_OK;
}

kvo_status mock_pub_new(mock_pub **out, const mock_pub_cfg *cfg, char *err,
                        size_t errsz) {
    char dummy[8];
    if (!err || !errsz) {
        err = dummy;
        errsz = sizeof(dummy);
    }
    err[0] = '\0';
    if (!out || !cfg) return KVO_EINVAL;
    mock_pub *p = kvo_calloc(1, sizeof(*p));
    if (!p) return KVO_ENOMEM;
    kvo_status st = KVO_ENOMEM;
    const char *topic = cfg->topic ? cfg->topic : "";
    p->topic_len = strlen(topic);
    p->topic = kvo_strdup(topic);
    p->ring_cap = cfg->ring;
    p->ring_bytes_max = cfg->ring_bytes ? cfg->ring_bytes : UINT64_MAX;
    p->record = cfg->record;
    p->drop_topic = cfg->mutations & MOCK_MUT_REPLAY_DROPS_TOPIC;
    p->drop_tail = cfg->mutations & MOCK_MUT_REPLAY_DROPS_TAIL;
    if (!p->topic) goto fail;
    if (p->ring_cap && !(p->ring = kvo_calloc(p->ring_cap, sizeof(ring_ent))))
        goto fail;
    if (cfg->zmq_ctx && cfg->endpoint) {
        st = bind_socket(cfg->zmq_ctx, ZMQ_PUB, cfg->endpoint, PUB_LINGER_MS,
                         cfg->hwm > 0 ? cfg->hwm : PUB_HWM_DEFAULT, &p->pub,
                         p->endpoint, sizeof(p->endpoint), err, errsz);
        if (st != KVO_OK) goto fail;
        if (cfg->replay_endpoint) {
            uint64_t hwm = REPLAY_QUEUED * ((uint64_t)p->ring_cap + 1);
            st = bind_socket(cfg->zmq_ctx, ZMQ_ROUTER, cfg->replay_endpoint,
                             ROUTER_LINGER_MS,
                             hwm < INT_MAX ? (int)hwm : INT_MAX, &p->router,
                             p->replay_endpoint, sizeof(p->replay_endpoint),
                             err, errsz);
            if (st != KVO_OK) goto fail;
            int mandatory = 1;
            zmq_setsockopt(p->router, ZMQ_ROUTER_MANDATORY, &mandatory,
                           sizeof(mandatory));
        }
    }
    *out = p;
    return KVO_OK;
fail:
    mock_pub_free(p);
    return st;
}

void mock_pub_free(mock_pub *p) {
    if (!p) return;
    close_socket(&p->pub);
    close_socket(&p->router);
    for (uint32_t i = 0; i < p->ring_n; i++)
        payload_unref(p->ring[(p->ring_head + i) % p->ring_cap].p);
    kvo_free(p->ring);
    kvo_free(p->topic);
    kvo_free(p);
}

const char *mock_pub_endpoint(const mock_pub *p) { return p->endpoint; }
const char *mock_pub_replay_endpoint(const mock_pub *p) {
    return p->replay_endpoint;
}
void *mock_pub_replay_socket(const mock_pub *p) { return p->router; }

bool mock_pub_last_seq(const mock_pub *p, uint64_t *seq) {
    if (p->next_seq == 0) return false;
    *seq = p->next_seq - 1;
    return true;
}

void mock_pub_stats_get(const mock_pub *p, mock_pub_stats *out) {
    *out = p->st;
    out->ring_len = p->ring_n;
}

static void ring_drop_oldest(mock_pub *p) {
    ring_ent *e = &p->ring[p->ring_head];
    p->ring_bytes -= e->p->len;
    payload_unref(e->p);
    e->p = NULL;
    p->ring_head = (p->ring_head + 1) % p->ring_cap;
    p->ring_n--;
}

/* Keep pl (one reference, given) for replay; pl NULL (no memory for the
 * copy): the ring is emptied, so replay never skips a batch silently in
 * the middle (a client sees the first seq it gets back). */
static void ring_push(mock_pub *p, uint64_t seq, payload *pl, size_t len) {
    if (!p->ring_cap) {
        payload_unref(pl);
        return;
    }
    if (!pl || len > p->ring_bytes_max) { /* cannot be kept */
        while (p->ring_n) ring_drop_oldest(p);
        payload_unref(pl);
        return;
    }
    while (p->ring_n && (p->ring_n == p->ring_cap ||
                         p->ring_bytes + len > p->ring_bytes_max))
        ring_drop_oldest(p);
    ring_ent *e = &p->ring[(p->ring_head + p->ring_n) % p->ring_cap];
    e->seq = seq;
    e->p = pl;
    p->ring_n++;
    p->ring_bytes += len;
}

/* The payload frame: zero-copy from pl when there is one (a reference
 * goes to libzmq), else copied by zmq_send. */
static int send_payload(void *s, payload *pl, const uint8_t *data, size_t len) {
    if (!pl) return zmq_send(s, data, len, ZMQ_DONTWAIT);
    zmq_msg_t m;
    atomic_fetch_add_explicit(&pl->refs, 1, memory_order_relaxed);
    if (zmq_msg_init_data(&m, pl->data, len, payload_sent, pl) != 0) {
        payload_unref(pl);
        return zmq_send(s, data, len, ZMQ_DONTWAIT);
    }
    int rc = zmq_msg_send(&m, s, ZMQ_DONTWAIT);
    if (rc < 0) zmq_msg_close(&m); /* not sent: drops libzmq's reference */
    return rc;
}

kvo_status mock_pub_send(mock_pub *p, const uint8_t *data, size_t len) {
    uint64_t seq = p->next_seq++;
    uint8_t seqb[8];
    wire_seq_put(seqb, seq);
    p->st.batches++;
    p->st.bytes += len;
    payload *pl = NULL;
    if (p->ring_cap && len <= p->ring_bytes_max &&
        (pl = kvo_malloc(sizeof(*pl) + (len ? len : 1))) != NULL) {
        atomic_init(&pl->refs, 1); /* the ring's */
        pl->len = len;
        memcpy(pl->data, data, len);
    }
    if (p->pub) {
        if (zmq_send(p->pub, p->topic, p->topic_len,
                     ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(p->pub, seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            send_payload(p->pub, pl, data, len) < 0)
            p->st.send_errors++;
    }
    if (p->record) {
        wire_frame fr[3] = {
            {(const uint8_t *)p->topic, p->topic_len}, {seqb, 8}, {data, len}};
        if (wire_cap_write(p->record, kvo_unix_ns(), fr, 3) != KVO_OK)
            p->st.record_errors++;
    }
    ring_push(p, seq, pl, len); /* gives the ring its reference */
    return KVO_OK;
}

void mock_pub_skip(mock_pub *p) {
    p->next_seq++;
    p->st.skipped++;
    ring_push(p, 0, NULL, 0); /* empties the ring */
}

/* One replay request from the ROUTER, all its frames; false when none. */
static bool recv_request(void *s, zmq_msg_t *frames, int max, int *n) {
    *n = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return *n > 0;
        }
        bool more = zmq_msg_more(&m);
        if (*n < max)
            frames[(*n)++] = m;
        else {
            zmq_msg_close(&m);
            (*n)++; /* counted, too many frames */
        }
        if (!more) return true;
    }
}

/* [id]["" ][topic][seq][pl's block] to one client, or with pl NULL the
 * end marker's [id]["" ][""][seq][""]. False when the client's queue is
 * full or the client is gone (ROUTER_MANDATORY refuses the first frame;
 * once that is taken, the rest of the message is too). */
static bool send_reply(mock_pub *p, zmq_msg_t *id, const uint8_t seqb[8],
                       payload *pl) {
    void *s = p->router;
    if (zmq_send(s, zmq_msg_data(id), zmq_msg_size(id),
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return false;
    zmq_send(s, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (!p->drop_topic) /* replay-drops-topic: the pre-0.26 reply */
        zmq_send(s, p->topic, pl ? p->topic_len : 0,
                 ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(s, seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (pl)
        send_payload(s, pl, pl->data, pl->len);
    else
        zmq_send(s, "", 0, ZMQ_DONTWAIT);
    return true;
}

void mock_pub_replay_serve(mock_pub *p, mock_replay_served *out) {
    mock_replay_served done = {0};
    if (out) *out = done;
    if (!p->router) return;
    for (;;) {
        zmq_msg_t fr[4];
        int n;
        if (!recv_request(p->router, fr, 4, &n)) break;
        int kept = n < 4 ? n : 4;
        uint64_t start = 0;
        bool ok = n == 3 && zmq_msg_size(&fr[1]) == 0 &&
                  wire_seq_get(zmq_msg_data(&fr[2]), zmq_msg_size(&fr[2]),
                               &start) == KVO_OK;
        if (!ok) {
            p->st.bad_requests++;
            done.bad_requests++;
        } else {
            p->st.replay_requests++;
            done.requests++;
            uint8_t seqb[8];
            bool sent = true;
            /* replay-drops-tail: the last REPLAY_TAIL_DROPPED batches and
             * the end marker go missing, as from a ROUTER at its HWM */
            uint32_t last = p->ring_n;
            if (p->drop_tail) {
                uint32_t want = 0;
                for (uint32_t i = 0; i < p->ring_n; i++)
                    want +=
                        p->ring[(p->ring_head + i) % p->ring_cap].seq >= start;
                uint32_t drop =
                    want < REPLAY_TAIL_DROPPED ? want : REPLAY_TAIL_DROPPED;
                last = p->ring_n - drop; /* the wanted batches end the ring */
            }
            for (uint32_t i = 0; sent && i < last; i++) {
                ring_ent *e = &p->ring[(p->ring_head + i) % p->ring_cap];
                if (e->seq < start) continue;
                wire_seq_put(seqb, e->seq);
                if ((sent = send_reply(p, &fr[0], seqb, e->p))) {
                    p->st.replay_batches++;
                    done.batches++;
                }
            }
            wire_seq_put(seqb, WIRE_REPLAY_END);
            if (p->drop_tail) {
                /* no end marker: the client waits in vain */
            } else if (!sent || !send_reply(p, &fr[0], seqb, NULL)) {
                p->st.replay_cut++;
                done.cut++;
            }
        }
        for (int i = 0; i < kept; i++) zmq_msg_close(&fr[i]);
    }
    if (out) *out = done;
}
