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
 * the loop. */
#include "relay_int.h"

#include <stdio.h>
#include <string.h>

#define FLUSH_MS 2000 /* at exit, while connected */

struct relay_nats {
    kvo_nats *k;
    uint64_t held;       /* published while down, waiting for ... */
    uint64_t held_epoch; /* ... the reconnect after this many reconnects */
    uint64_t held_total; /* every message that went through the buffer */
    uint64_t told_disconnects, told_reconnects; /* by relay_nats_watch */
};

kvo_status relay_nats_new(relay_nats **out, const relay_cfg *cfg, char *err,
                          size_t errsz) {
    relay_nats *n = kvo_calloc(1, sizeof(*n));
    if (!n) {
        snprintf(err, errsz, "%s", kvo_strerror(KVO_ENOMEM));
        return KVO_ENOMEM;
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
    kvo_nats_close(n->k, FLUSH_MS);
    kvo_nats_free(n->k);
    kvo_free(n);
}

bool relay_nats_connected(relay_nats *n) { return kvo_nats_up(n->k); }

kvo_status relay_nats_publish(relay_nats *n, const char *subject,
                              bool has_range, uint64_t first, uint64_t last,
                              const uint8_t *body, size_t len) {
    if (len > INT32_MAX) return KVO_ETOOBIG;
    natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subject, NULL, (const char *)body,
                                  (int)len);
    if (s == NATS_OK && has_range) {
        char v[48]; /* "<u64>-<u64>": 41 bytes at most */
        snprintf(v, sizeof(v), "%" PRIu64 "-%" PRIu64, first, last);
        s = natsMsgHeader_Set(m, "KVO-Zmq-Seq", v);
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

void relay_nats_stats(relay_nats *n, relay_stats *st) {
    st->nats_disconnects = kvo_nats_disconnects(n->k);
    st->nats_reconnects = kvo_nats_reconnects(n->k);
    st->nats_connected = relay_nats_connected(n);
    st->nats_buffered = n->held_epoch == st->nats_reconnects ? n->held : 0;
    st->nats_buffered_total = n->held_total;
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
