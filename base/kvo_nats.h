/* kvo_nats.h -- the NATS client setup kvo-indexer and kvo-relay share: one
 * configuration, one set of --nats* options, one natsOptions recipe, the
 * connection state and a bounded close.
 *
 *   argv/env --KVO_NATS_OPTIONS, kvo_nats_opt_set--> kvo_nats_cfg
 *            --kvo_nats_cfg_check--> usage error, or
 *   kvo_nats_new: natsOptions with everything common set (servers, name,
 *            reconnect forever, reconnect wait, (re)connect timeout, retry
 *            on failed connect, auth, TLS, the state callbacks)
 *     -> caller adds its own through kvo_nats_options (error handler,
 *        SendAsap, NoRandomize, ...) -> kvo_nats_connect -> kvo_nats_conn
 *     -> kvo_nats_close (flush only while up; bounded) -> kvo_nats_free
 *
 * nats.c calls the state callbacks on its own threads; they only bump
 * atomic counters, so kvo_nats_up never takes nats.c's connection lock.
 * That lock is held by a reconnect attempt for as long as the attempt
 * lasts (TCP connect + handshake, up to the (re)connect timeout when the
 * peer accepts but never answers), and natsConnection_Status, Publish,
 * Flush and Close all wait for it. The timeout is therefore set to
 * KVO_NATS_CONNECT_TIMEOUT_MS (nats.c's default is 2 s): while not
 * connected, kvo_nats_close skips the flush and returns within about that.
 *
 * Its own library (kvo_nats, linking nats.c): kvo_wire users that do not
 * speak NATS (kvo-mocker, kvo-wire) do not link nats.c.
 */
#ifndef KVO_NATS_H
#define KVO_NATS_H

#include "kvo.h"

#include <nats/nats.h>

#define KVO_NATS_DEFAULT_URL "nats://127.0.0.1:4222"
#define KVO_NATS_CONNECT_TIMEOUT_MS 1000

typedef struct kvo_nats_cfg {
    const char *url;             /* comma-separated server URLs */
    const char *user, *password; /* both or neither */
    const char *token;
    const char *creds;    /* credentials file */
    bool tls;             /* require TLS (implied by the three below) */
    const char *tls_ca;   /* CA bundle */
    const char *tls_cert; /* client certificate, with tls_key */
    const char *tls_key;
    bool tls_skip_verify;  /* do not verify the server certificate */
    int reconnect_wait_ms; /* between reconnect rounds; 0 = 250 */
    int buffer_bytes;      /* reconnect buffer; 0 = nats.c's default */
} kvo_nats_cfg;

/* url = KVO_NATS_DEFAULT_URL, reconnect_wait_ms = 250, the rest 0/NULL. */
void kvo_nats_cfg_default(kvo_nats_cfg *c);
/* user without password (or the reverse), or no server URL in url:
 * KVO_EINVAL with a one-line reason in err. */
kvo_status kvo_nats_cfg_check(const kvo_nats_cfg *c, char *err, size_t errsz);
/* For the start-up log line: "creds" | "token" | "user" | "none", and
 * "off" | "on" | "on (no verify)". Static strings. */
const char *kvo_nats_cfg_auth(const kvo_nats_cfg *c);
const char *kvo_nats_cfg_tls(const kvo_nats_cfg *c);

/* ---- Command line ----------------------------------------------------------
 * Put KVO_NATS_OPTIONS in the program's struct option table (env fallbacks
 * KVO_NATS, KVO_NATS_USER, ... come with it through kvo_getopt), try
 * kvo_nats_opt_set in the setter, and print KVO_NATS_USAGE in --help. Codes
 * sit far above the programs' own (256 + n). */
enum {
    KVO_NATS_OPT_URL = 0x4e00,
    KVO_NATS_OPT_USER,
    KVO_NATS_OPT_PASSWORD,
    KVO_NATS_OPT_TOKEN,
    KVO_NATS_OPT_CREDS,
    KVO_NATS_OPT_TLS,
    KVO_NATS_OPT_TLS_CA,
    KVO_NATS_OPT_TLS_CERT,
    KVO_NATS_OPT_TLS_KEY,
    KVO_NATS_OPT_TLS_SKIP_VERIFY,
    KVO_NATS_OPT_RECONNECT_WAIT
};

#define KVO_NATS_OPTIONS                                                       \
    {"nats", required_argument, NULL, KVO_NATS_OPT_URL},                       \
        {"nats-user", required_argument, NULL, KVO_NATS_OPT_USER},             \
        {"nats-password", required_argument, NULL, KVO_NATS_OPT_PASSWORD},     \
        {"nats-token", required_argument, NULL, KVO_NATS_OPT_TOKEN},           \
        {"nats-creds", required_argument, NULL, KVO_NATS_OPT_CREDS},           \
        {"nats-tls", no_argument, NULL, KVO_NATS_OPT_TLS},                     \
        {"nats-tls-ca", required_argument, NULL, KVO_NATS_OPT_TLS_CA},         \
        {"nats-tls-cert", required_argument, NULL, KVO_NATS_OPT_TLS_CERT},     \
        {"nats-tls-key", required_argument, NULL, KVO_NATS_OPT_TLS_KEY},       \
        {"nats-tls-skip-verify", no_argument, NULL,                            \
         KVO_NATS_OPT_TLS_SKIP_VERIFY},                                        \
    {                                                                          \
        "nats-reconnect-wait-ms", required_argument, NULL,                     \
            KVO_NATS_OPT_RECONNECT_WAIT                                        \
    }

#define KVO_NATS_USAGE                                                         \
    "  --nats URL[,URL...]     servers, tried in this order "                  \
    "(default " KVO_NATS_DEFAULT_URL ")\n"                                     \
    "  --nats-user U --nats-password P | --nats-token T | --nats-creds FILE\n" \
    "  --nats-tls              require TLS\n"                                  \
    "  --nats-tls-ca FILE --nats-tls-cert FILE --nats-tls-key FILE\n"          \
    "  --nats-tls-skip-verify  do not verify the server certificate\n"         \
    "  --nats-reconnect-wait-ms N  (default 250)\n"

/* What kvo_nats_opt_set did with a code. */
enum { KVO_NATS_OPT_OK = 0, KVO_NATS_OPT_BAD = -1, KVO_NATS_OPT_OTHER = 1 };

/* Set the field for code (arg NULL for flags). KVO_NATS_OPT_BAD: arg is not
 * a valid value (the caller names kvo_nats_opt_name(code) in its message);
 * KVO_NATS_OPT_OTHER: not a NATS option. Strings are kept, not copied. */
int kvo_nats_opt_set(kvo_nats_cfg *c, int code, const char *arg);
/* "nats-user" for KVO_NATS_OPT_USER, ...; NULL for other codes. */
const char *kvo_nats_opt_name(int code);

/* ---- The connection ------------------------------------------------------*/

typedef struct kvo_nats kvo_nats;

/* Options with everything common set, for client_name (copied; c's strings
 * are copied by nats.c). Nothing connects yet. On failure err says why. */
kvo_status kvo_nats_new(kvo_nats **out, const kvo_nats_cfg *c,
                        const char *client_name, char *err, size_t errsz);
/* The options, to add what only this caller wants before kvo_nats_connect.
 * The state callbacks (connected, disconnected, reconnected, closed) belong
 * to kvo_nats: do not replace them. */
natsOptions *kvo_nats_options(kvo_nats *n);
/* Connect once. KVO_OK: connected. KVO_EAGAIN: no server answered yet and
 * nats.c keeps trying in the background (the connection exists). KVO_ENATS:
 * err says why. */
kvo_status kvo_nats_connect(kvo_nats *n, char *err, size_t errsz);
/* The connection (NULL before kvo_nats_connect succeeded); owned by n. */
natsConnection *kvo_nats_conn(kvo_nats *n);
/* Connected right now, as nats.c's callbacks last said (no lock). */
bool kvo_nats_up(kvo_nats *n);
uint64_t kvo_nats_disconnects(kvo_nats *n);
uint64_t kvo_nats_reconnects(kvo_nats *n);
/* An async subscription whose end kvo_nats_close waits for (nats.c's
 * natsConnection_Subscribe plus its on-complete callback). */
natsStatus kvo_nats_subscribe(kvo_nats *n, natsSubscription **sub,
                              const char *subject, natsMsgHandler cb,
                              void *closure);
/* Flush for up to flush_ms when up (0 = no flush), close, and wait (5 s at
 * most) for nats.c's last callback and for every kvo_nats_subscribe's
 * subscription to end (its handler will not run again). Not up: no flush, and the close waits
 * only for a reconnect attempt in flight (KVO_NATS_CONNECT_TIMEOUT_MS at
 * most). false: the close was not confirmed (kvo_nats_free then leaks n
 * rather than risk a late callback). Idempotent; NULL: true. */
bool kvo_nats_close(kvo_nats *n, int flush_ms);
/* Close (no flush) if not closed yet, destroy the connection and the
 * options, free. NULL is a no-op. Subscriptions on the connection must be
 * destroyed first (after kvo_nats_close). */
void kvo_nats_free(kvo_nats *n);
/* At the end of a program that used NATS, after every kvo_nats_free: stop
 * nats.c's own threads (its message collector frees destroyed messages
 * late) and wait for them, KVO_NATS_SHUTDOWN_MS at most; logs when they did
 * not finish in time. */
#define KVO_NATS_SHUTDOWN_MS 5000
void kvo_nats_shutdown(void);

#endif /* KVO_NATS_H */
