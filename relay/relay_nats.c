/* relay_nats.c -- the NATS side: connect with every option nats.c offers,
 * reconnect forever with a bounded reconnect buffer, publish envelopes with
 * the KVO-Zmq-Seq header.
 *
 * nats.c calls the connection callbacks from its own threads; they only bump
 * atomic counters that the loop folds into the stats (relay_nats_poll).
 * nats.c 3.4 does not expose its buffer size, so "buffered" counts the
 * messages accepted while the connection was down (they sit in the
 * reconnect buffer until the reconnect flushes them). */
#include "relay_int.h"

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct relay_nats {
    natsConnection *nc;
    natsOptions *opts;
    atomic_uint_fast64_t disconnects;
    atomic_uint_fast64_t reconnects;
    atomic_bool connected_once;
    char err[256];
    char **servers;
    int nservers;
    pthread_mutex_t mu; /* closed: the last callback nats.c will make */
    pthread_cond_t cv;
    bool closed;
    uint64_t held;       /* published while down, since the last reconnect */
    uint64_t held_total; /* every message that went through the buffer */
    uint64_t seen_reconnects;
};

static void on_disconnected(natsConnection *nc, void *closure) {
    (void)nc;
    relay_nats *n = closure;
    atomic_fetch_add(&n->disconnects, 1);
}

static void on_reconnected(natsConnection *nc, void *closure) {
    (void)nc;
    relay_nats *n = closure;
    atomic_fetch_add(&n->reconnects, 1);
    atomic_store(&n->connected_once, true);
}

static void on_connected(natsConnection *nc, void *closure) {
    (void)nc;
    relay_nats *n = closure;
    atomic_store(&n->connected_once, true);
}

static void on_closed(natsConnection *nc, void *closure) {
    (void)nc;
    relay_nats *n = closure;
    pthread_mutex_lock(&n->mu);
    n->closed = true;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

static kvo_status fail(relay_nats *n, natsStatus s, const char *what) {
    snprintf(n->err, sizeof(n->err), "%s: %s (%s)", what,
             natsStatus_GetText(s), nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
    return KVO_ENATS;
}

/* "nats://a:4222,nats://b:4222" -> servers[] */
static kvo_status split_servers(relay_nats *n, const char *list) {
    char *copy = kvo_strdup(list);
    if (!copy) return KVO_ENOMEM;
    int cap = 1;
    for (const char *c = list; *c; c++) cap += *c == ',';
    n->servers = kvo_calloc((size_t)cap, sizeof(char *));
    if (!n->servers) {
        kvo_free(copy);
        return KVO_ENOMEM;
    }
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (!*tok) continue;
        n->servers[n->nservers] = kvo_strdup(tok);
        if (!n->servers[n->nservers]) {
            kvo_free(copy);
            return KVO_ENOMEM;
        }
        n->nservers++;
    }
    kvo_free(copy);
    return n->nservers ? KVO_OK : KVO_EINVAL;
}

kvo_status relay_nats_new(relay_nats **out, const relay_cfg *cfg) {
    relay_nats *n = kvo_calloc(1, sizeof(*n));
    if (!n) return KVO_ENOMEM;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    kvo_status st = split_servers(n, cfg->nats ? cfg->nats
                                               : "nats://127.0.0.1:4222");
    if (st != KVO_OK) {
        snprintf(n->err, sizeof(n->err), "bad --nats server list");
        goto done;
    }
    natsStatus s = natsOptions_Create(&n->opts);
    if (s == NATS_OK)
        s = natsOptions_SetServers(n->opts, (const char **)n->servers,
                                   n->nservers);
    if (s == NATS_OK) s = natsOptions_SetName(n->opts, "kvo-relay");
    if (s == NATS_OK) s = natsOptions_SetNoRandomize(n->opts, true);
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(n->opts, -1);
    /* Write each envelope at once instead of waiting for nats.c's flusher
     * thread (~1 ms): envelopes are already batched, and lockstep drivers
     * (kvo-check) wait on every watermark. */
    if (s == NATS_OK) s = natsOptions_SetSendAsap(n->opts, true);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(
            n->opts, cfg->nats_reconnect_wait_ms > 0
                         ? cfg->nats_reconnect_wait_ms
                         : 250);
    if (s == NATS_OK && cfg->nats_buffer_bytes > 0)
        s = natsOptions_SetReconnectBufSize(n->opts, cfg->nats_buffer_bytes);
    if (s == NATS_OK)
        s = natsOptions_SetRetryOnFailedConnect(n->opts, true, on_connected,
                                                n);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(n->opts, on_disconnected, n);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(n->opts, on_reconnected, n);
    if (s == NATS_OK) s = natsOptions_SetClosedCB(n->opts, on_closed, n);
    if (s == NATS_OK && cfg->nats_user)
        s = natsOptions_SetUserInfo(n->opts, cfg->nats_user,
                                    cfg->nats_password);
    if (s == NATS_OK && cfg->nats_token)
        s = natsOptions_SetToken(n->opts, cfg->nats_token);
    if (s == NATS_OK && cfg->nats_creds)
        s = natsOptions_SetUserCredentialsFromFiles(n->opts, cfg->nats_creds,
                                                    NULL);
    bool tls = cfg->nats_tls || cfg->nats_tls_ca || cfg->nats_tls_cert ||
               cfg->nats_tls_skip_verify;
    if (s == NATS_OK && tls) s = natsOptions_SetSecure(n->opts, true);
    if (s == NATS_OK && cfg->nats_tls_ca)
        s = natsOptions_LoadCATrustedCertificates(n->opts, cfg->nats_tls_ca);
    if (s == NATS_OK && cfg->nats_tls_cert)
        s = natsOptions_LoadCertificatesChain(n->opts, cfg->nats_tls_cert,
                                              cfg->nats_tls_key);
    if (s == NATS_OK && cfg->nats_tls_skip_verify)
        s = natsOptions_SkipServerVerification(n->opts, true);
    if (s != NATS_OK) {
        st = fail(n, s, "NATS options");
        goto done;
    }
    s = natsConnection_Connect(&n->nc, n->opts);
    if (s == NATS_OK) {
        atomic_store(&n->connected_once, true);
    } else if (s != NATS_NOT_YET_CONNECTED) {
        st = fail(n, s, "NATS connect");
        goto done;
    }
    *out = n;
    return KVO_OK;
done:
    relay_nats_free(n);
    return st;
}

void relay_nats_free(relay_nats *n) {
    if (!n) return;
    if (n->nc) {
        if (natsConnection_Status(n->nc) == NATS_CONN_STATUS_CONNECTED)
            natsConnection_FlushTimeout(n->nc, 2000);
        natsConnection_Close(n->nc);
        /* Callbacks run on nats.c's own thread and may still be queued
         * (a disconnect just before the close): n must outlive them, and
         * "closed" is the last one. */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 5;
        pthread_mutex_lock(&n->mu);
        while (!n->closed)
            if (pthread_cond_timedwait(&n->cv, &n->mu, &dl) != 0) break;
        bool closed = n->closed;
        pthread_mutex_unlock(&n->mu);
        natsConnection_Destroy(n->nc);
        if (!closed) return; /* leak rather than risk a late callback */
    }
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    natsOptions_Destroy(n->opts);
    for (int i = 0; i < n->nservers; i++) kvo_free(n->servers[i]);
    kvo_free(n->servers);
    kvo_free(n);
}

bool relay_nats_connected(relay_nats *n) {
    return n->nc && natsConnection_Status(n->nc) == NATS_CONN_STATUS_CONNECTED;
}

kvo_status relay_nats_publish(relay_nats *n, const char *subject,
                              bool has_range, uint64_t first, uint64_t last,
                              const uint8_t *body, size_t len) {
    if (len > INT32_MAX) return KVO_ETOOBIG;
    natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subject, NULL, (const char *)body,
                                  (int)len);
    if (s == NATS_OK && has_range) {
        char v[48];
        snprintf(v, sizeof(v), "%" PRIu64 "-%" PRIu64, first, last);
        s = natsMsgHeader_Set(m, "KVO-Zmq-Seq", v);
    }
    bool down = natsConnection_Status(n->nc) != NATS_CONN_STATUS_CONNECTED;
    if (s == NATS_OK) s = natsConnection_PublishMsg(n->nc, m);
    natsMsg_Destroy(m);
    if (s == NATS_OK) {
        if (down) {
            n->held++;
            n->held_total++;
        }
        return KVO_OK;
    }
    fail(n, s, "NATS publish");
    return s == NATS_INSUFFICIENT_BUFFER ? KVO_EAGAIN : KVO_ENATS;
}

void relay_nats_poll(relay_nats *n, relay_stats *st) {
    st->nats_disconnects = atomic_load(&n->disconnects);
    st->nats_reconnects = atomic_load(&n->reconnects);
    st->nats_connected = relay_nats_connected(n);
    if (st->nats_connected && n->seen_reconnects != st->nats_reconnects) {
        n->seen_reconnects = st->nats_reconnects;
        n->held = 0; /* flushed to the server on reconnect */
    }
    st->nats_buffered = n->held;
    st->nats_buffered_total = n->held_total;
}

const char *relay_nats_last_error(relay_nats *n) { return n->err; }
