/* kvo_nats.c -- the shared NATS client setup (see kvo_nats.h).
 *
 * Connection state from nats.c's callbacks, as counters: "up" is
 * connects + reconnects > disconnects (every disconnect follows a connect
 * or a reconnect), which holds whatever order the callbacks and
 * kvo_nats_connect's own count arrive in. "closed" is nats.c's last
 * callback: n must outlive it.
 */
#include "kvo_nats.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define CLOSE_WAIT_S 5 /* for the closed callback once Close returned */

struct kvo_nats {
    natsOptions *opts;
    natsConnection *nc;
    atomic_uint_fast64_t connects, disconnects, reconnects;
    pthread_mutex_t mu; /* closed, subs_open */
    pthread_cond_t cv;
    bool closed;   /* nats.c's closed callback ran */
    int subs_open; /* kvo_nats_subscribe's, their on-complete not run */
    bool close_called;
    bool close_confirmed;
};

/* ---- Configuration ---------------------------------------------------------*/

void kvo_nats_cfg_default(kvo_nats_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->url = KVO_NATS_DEFAULT_URL;
    c->reconnect_wait_ms = 250;
}

/* "nats://a:4222, nats://b:4222" -> servers (NULL: count only). Leading
 * blanks are dropped, empty entries skipped. Returns the count, -1 when out
 * of memory. */
static int split_servers(const char *list, char **servers) {
    int n = 0;
    for (const char *p = list; *p;) {
        while (*p == ' ') p++;
        size_t len = strcspn(p, ",");
        if (len) {
            if (servers && !(servers[n] = kvo_strndup(p, len))) return -1;
            n++;
        }
        p += len;
        if (*p == ',') p++;
    }
    return n;
}

kvo_status kvo_nats_cfg_check(const kvo_nats_cfg *c, char *err, size_t errsz) {
    if ((c->user != NULL) != (c->password != NULL)) {
        snprintf(err, errsz, "--nats-user and --nats-password go together");
        return KVO_EINVAL;
    }
    if (!c->url || split_servers(c->url, NULL) == 0) {
        snprintf(err, errsz, "--nats: no server URL in '%s'",
                 c->url ? c->url : "");
        return KVO_EINVAL;
    }
    return KVO_OK;
}

const char *kvo_nats_cfg_auth(const kvo_nats_cfg *c) {
    return c->creds ? "creds" : c->token ? "token" : c->user ? "user" : "none";
}

static bool tls_wanted(const kvo_nats_cfg *c) {
    return c->tls || c->tls_ca || c->tls_cert || c->tls_skip_verify;
}

const char *kvo_nats_cfg_tls(const kvo_nats_cfg *c) {
    if (!tls_wanted(c)) return "off";
    return c->tls_skip_verify ? "on (no verify)" : "on";
}

/* ---- Command line ----------------------------------------------------------*/

static const struct {
    int code;
    const char *name;
} opt_names[] = {
    {KVO_NATS_OPT_URL, "nats"},
    {KVO_NATS_OPT_USER, "nats-user"},
    {KVO_NATS_OPT_PASSWORD, "nats-password"},
    {KVO_NATS_OPT_TOKEN, "nats-token"},
    {KVO_NATS_OPT_CREDS, "nats-creds"},
    {KVO_NATS_OPT_TLS, "nats-tls"},
    {KVO_NATS_OPT_TLS_CA, "nats-tls-ca"},
    {KVO_NATS_OPT_TLS_CERT, "nats-tls-cert"},
    {KVO_NATS_OPT_TLS_KEY, "nats-tls-key"},
    {KVO_NATS_OPT_TLS_SKIP_VERIFY, "nats-tls-skip-verify"},
    {KVO_NATS_OPT_RECONNECT_WAIT, "nats-reconnect-wait-ms"},
};

const char *kvo_nats_opt_name(int code) {
    for (size_t i = 0; i < KVO_ARRAY_LEN(opt_names); i++)
        if (opt_names[i].code == code) return opt_names[i].name;
    return NULL;
}

int kvo_nats_opt_set(kvo_nats_cfg *c, int code, const char *arg) {
    uint32_t u32;
    switch (code) {
    case KVO_NATS_OPT_URL: c->url = arg; break;
    case KVO_NATS_OPT_USER: c->user = arg; break;
    case KVO_NATS_OPT_PASSWORD: c->password = arg; break;
    case KVO_NATS_OPT_TOKEN: c->token = arg; break;
    case KVO_NATS_OPT_CREDS: c->creds = arg; break;
    case KVO_NATS_OPT_TLS: c->tls = true; break;
    case KVO_NATS_OPT_TLS_CA: c->tls_ca = arg; break;
    case KVO_NATS_OPT_TLS_CERT: c->tls_cert = arg; break;
    case KVO_NATS_OPT_TLS_KEY: c->tls_key = arg; break;
    case KVO_NATS_OPT_TLS_SKIP_VERIFY: c->tls_skip_verify = true; break;
    case KVO_NATS_OPT_RECONNECT_WAIT:
        if (kvo_parse_u32(arg, &u32) || u32 > INT32_MAX)
            return KVO_NATS_OPT_BAD;
        c->reconnect_wait_ms = (int)u32;
        break;
    default: return KVO_NATS_OPT_OTHER;
    }
    return KVO_NATS_OPT_OK;
}

/* ---- nats.c callbacks (its threads) ----------------------------------------*/

static void on_connected(natsConnection *nc, void *closure) {
    (void)nc;
    atomic_fetch_add(&((kvo_nats *)closure)->connects, 1);
}

static void on_disconnected(natsConnection *nc, void *closure) {
    (void)nc;
    atomic_fetch_add(&((kvo_nats *)closure)->disconnects, 1);
}

static void on_reconnected(natsConnection *nc, void *closure) {
    (void)nc;
    atomic_fetch_add(&((kvo_nats *)closure)->reconnects, 1);
}

static void on_closed(natsConnection *nc, void *closure) {
    (void)nc;
    kvo_nats *n = closure;
    pthread_mutex_lock(&n->mu);
    n->closed = true;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

/* nats.c is done with a closed subscription (its handler will not run
 * again, its close went through its delivery thread). */
static void on_sub_done(void *closure) {
    kvo_nats *n = closure;
    pthread_mutex_lock(&n->mu);
    n->subs_open--;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

natsStatus kvo_nats_subscribe(kvo_nats *n, natsSubscription **sub,
                              const char *subject, natsMsgHandler cb,
                              void *closure) {
    natsStatus s = natsConnection_Subscribe(sub, n->nc, subject, cb, closure);
    if (s != NATS_OK) return s;
    s = natsSubscription_SetOnCompleteCB(*sub, on_sub_done, n);
    if (s == NATS_OK) {
        pthread_mutex_lock(&n->mu);
        n->subs_open++;
        pthread_mutex_unlock(&n->mu);
    }
    return s;
}

/* ---- The connection --------------------------------------------------------*/

static kvo_status nats_fail(natsStatus s, const char *what, char *err,
                            size_t errsz) {
    const char *last = nats_GetLastError(NULL);
    snprintf(err, errsz, "%s: %s (%s)", what, natsStatus_GetText(s),
             last ? last : "");
    return KVO_ENATS;
}

static natsStatus set_options(kvo_nats *n, const kvo_nats_cfg *c,
                              const char *name, char **servers, int nservers) {
    natsOptions *o = n->opts;
    natsStatus s = natsOptions_SetServers(o, (const char **)servers, nservers);
    /* the servers are tried in the order given: the first is the client's
     * home node in a cluster (nats.c would shuffle them) */
    if (s == NATS_OK) s = natsOptions_SetNoRandomize(o, true);
    if (s == NATS_OK) s = natsOptions_SetName(o, name);
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(o, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(
            o, c->reconnect_wait_ms > 0 ? c->reconnect_wait_ms : 250);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, KVO_NATS_CONNECT_TIMEOUT_MS);
    if (s == NATS_OK && c->buffer_bytes > 0)
        s = natsOptions_SetReconnectBufSize(o, c->buffer_bytes);
    if (s == NATS_OK)
        s = natsOptions_SetRetryOnFailedConnect(o, true, on_connected, n);
    if (s == NATS_OK) s = natsOptions_SetDisconnectedCB(o, on_disconnected, n);
    if (s == NATS_OK) s = natsOptions_SetReconnectedCB(o, on_reconnected, n);
    if (s == NATS_OK) s = natsOptions_SetClosedCB(o, on_closed, n);
    if (s == NATS_OK && c->user)
        s = natsOptions_SetUserInfo(o, c->user, c->password);
    if (s == NATS_OK && c->token) s = natsOptions_SetToken(o, c->token);
    if (s == NATS_OK && c->creds)
        s = natsOptions_SetUserCredentialsFromFiles(o, c->creds, NULL);
    if (s == NATS_OK && tls_wanted(c)) s = natsOptions_SetSecure(o, true);
    if (s == NATS_OK && c->tls_ca)
        s = natsOptions_LoadCATrustedCertificates(o, c->tls_ca);
    if (s == NATS_OK && c->tls_cert)
        s = natsOptions_LoadCertificatesChain(o, c->tls_cert, c->tls_key);
    if (s == NATS_OK && c->tls_skip_verify)
        s = natsOptions_SkipServerVerification(o, true);
    return s;
}

kvo_status kvo_nats_new(kvo_nats **out, const kvo_nats_cfg *c,
                        const char *client_name, char *err, size_t errsz) {
    kvo_status st = KVO_OK;
    char **servers = NULL;
    int nservers = c->url ? split_servers(c->url, NULL) : 0;
    kvo_nats *n = kvo_calloc(1, sizeof(*n));
    if (!n) return KVO_ENOMEM;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    if (nservers <= 0) {
        snprintf(err, errsz, "bad --nats server list '%s'",
                 c->url ? c->url : "");
        st = KVO_EINVAL;
        goto done;
    }
    servers = kvo_calloc((size_t)nservers, sizeof(char *));
    if (!servers || split_servers(c->url, servers) != nservers) {
        snprintf(err, errsz, "%s", kvo_strerror(KVO_ENOMEM));
        st = KVO_ENOMEM;
        goto done;
    }
    natsStatus s = natsOptions_Create(&n->opts);
    if (s == NATS_OK) s = set_options(n, c, client_name, servers, nservers);
    if (s != NATS_OK) st = nats_fail(s, "NATS options", err, errsz);
done:
    for (int i = 0; servers && i < nservers; i++) kvo_free(servers[i]);
    kvo_free(servers);
    if (st != KVO_OK) {
        kvo_nats_free(n);
        return st;
    }
    *out = n;
    return KVO_OK;
}

natsOptions *kvo_nats_options(kvo_nats *n) { return n->opts; }
natsConnection *kvo_nats_conn(kvo_nats *n) { return n->nc; }

kvo_status kvo_nats_connect(kvo_nats *n, char *err, size_t errsz) {
    natsStatus s = natsConnection_Connect(&n->nc, n->opts);
    if (s == NATS_OK) {
        atomic_fetch_add(&n->connects, 1);
        return KVO_OK;
    }
    if (s == NATS_NOT_YET_CONNECTED) return KVO_EAGAIN;
    n->nc = NULL;
    return nats_fail(s, "NATS connect", err, errsz);
}

bool kvo_nats_up(kvo_nats *n) {
    uint64_t ups = atomic_load(&n->connects) + atomic_load(&n->reconnects);
    return !n->close_called && ups > atomic_load(&n->disconnects);
}

uint64_t kvo_nats_disconnects(kvo_nats *n) {
    return atomic_load(&n->disconnects);
}

uint64_t kvo_nats_reconnects(kvo_nats *n) {
    return atomic_load(&n->reconnects);
}

bool kvo_nats_close(kvo_nats *n, int flush_ms) {
    if (!n || !n->nc) return true;
    if (n->close_called) return n->close_confirmed;
    if (flush_ms > 0 && kvo_nats_up(n))
        natsConnection_FlushTimeout(n->nc, flush_ms);
    n->close_called = true;
    natsConnection_Close(n->nc);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += CLOSE_WAIT_S;
    /* the close reaches each subscription through its delivery thread:
     * wait for that too, so no handler runs once the caller frees what it
     * uses and nats.c has consumed its close messages (else they are still
     * queued when the program exits) */
    pthread_mutex_lock(&n->mu);
    while (!n->closed || n->subs_open > 0)
        if (pthread_cond_timedwait(&n->cv, &n->mu, &dl) != 0) break;
    n->close_confirmed = n->closed && n->subs_open == 0;
    int open = n->subs_open;
    pthread_mutex_unlock(&n->mu);
    if (open)
        kvo_warn("%d NATS subscription(s) not closed by nats.c within %d s",
                 open, CLOSE_WAIT_S);
    return n->close_confirmed;
}

void kvo_nats_shutdown(void) {
    natsStatus s = nats_CloseAndWait(KVO_NATS_SHUTDOWN_MS);
    if (s != NATS_OK)
        kvo_warn("nats.c's threads did not stop within %d ms: %s",
                 KVO_NATS_SHUTDOWN_MS, natsStatus_GetText(s));
}

void kvo_nats_free(kvo_nats *n) {
    if (!n) return;
    bool confirmed = kvo_nats_close(n, 0);
    natsConnection_Destroy(n->nc);
    n->nc = NULL;
    if (!confirmed) return; /* leak n rather than risk a late callback */
    natsOptions_Destroy(n->opts);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    kvo_free(n);
}
