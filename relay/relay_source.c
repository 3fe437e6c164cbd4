/* relay_source.c -- one ZMQ publisher: a SUB socket for live batches and,
 * when the publisher has a replay ROUTER, a DEALER opened on demand.
 *
 * The DEALER is closed when a replay is abandoned (timeout, restart), so the
 * late replies of an old request can never be mistaken for a new one. */
#include "relay_int.h"

#include <errno.h>
#include <string.h>
#include <zmq.h>

struct relay_source {
    void *zctx;
    relay_source_cfg cfg;
    char *endpoint, *topic, *replay_endpoint;
    void *sub;
    void *dealer;
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

static void close_sock(void **sock) {
    if (*sock) zmq_close(*sock);
    *sock = NULL;
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
    st = KVO_ENET;
    s->sub = zmq_socket(zctx, ZMQ_SUB);
    if (!s->sub || set_common(s->sub, &s->cfg) != KVO_OK) goto fail;
    if (zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic)) != 0)
        goto fail;
    int rc = cfg->bind ? zmq_bind(s->sub, s->endpoint)
                       : zmq_connect(s->sub, s->endpoint);
    if (rc != 0) {
        st = errno == EINVAL || errno == EPROTONOSUPPORT ? KVO_EINVAL
                                                          : KVO_ENET;
        goto fail;
    }
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
    close_sock(&s->sub);
    close_sock(&s->dealer);
    kvo_free(s->endpoint);
    kvo_free(s->topic);
    kvo_free(s->replay_endpoint);
    kvo_free(s);
}

void *relay_source_sub(relay_source *s) { return s->sub; }
void *relay_source_dealer(relay_source *s) { return s->dealer; }

kvo_status relay_source_replay_request(relay_source *s, uint64_t from_seq) {
    if (!s->replay_endpoint) return KVO_ENOTFOUND;
    if (!s->dealer) {
        s->dealer = zmq_socket(s->zctx, ZMQ_DEALER);
        if (!s->dealer || set_common(s->dealer, &s->cfg) != KVO_OK ||
            zmq_connect(s->dealer, s->replay_endpoint) != 0) {
            close_sock(&s->dealer);
            return KVO_ENET;
        }
    }
    uint8_t seq[8];
    wire_seq_put(seq, from_seq);
    /* DONTWAIT: a DEALER with no peer yet queues (up to its HWM); a full
     * queue means the request cannot go out now, which the pipe counts. */
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) != 0 ||
        zmq_send(s->dealer, seq, sizeof(seq), ZMQ_DONTWAIT) != (int)sizeof(seq))
        return KVO_ENET;
    return KVO_OK;
}

void relay_source_replay_abort(relay_source *s) { close_sock(&s->dealer); }

static kvo_status recv_multipart(relay_source *s, void *sock, relay_rx *rx) {
    parts_close(s);
    rx->n = 0;
    if (!sock) return KVO_EAGAIN;
    for (;;) {
        zmq_msg_t tmp;
        zmq_msg_t *m = s->nparts < WIRE_CAP_MAX_FRAMES ? &s->parts[s->nparts]
                                                       : &tmp;
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
    return recv_multipart(s, s->sub, rx);
}

kvo_status relay_source_recv_dealer(relay_source *s, relay_rx *rx) {
    return recv_multipart(s, s->dealer, rx);
}
