/* check_spawn.c -- the processes of a check: start (or attach to) them,
 * wait until each is ready, restart a relay, stop them all.
 *
 * Start order, so that nothing published is missed:
 *   nats-server -> kvo-indexer (subscribed once /health answers)
 *   -> kvo-mocker x N (discovery: /kvo/event_sources)
 *   -> kvo-relay per (engine, rank) with --replay-from 0: the relay first
 *      publishes `cleared` (so the indexer lists its publisher id: proof
 *      that relay -> NATS -> indexer works) and replays from 0; ready when
 *      its /stats shows every source live.
 * Ports: picked free (kvo_free_port) and retried when another process took
 * one in between; ZMQ ports are picked by the mocker itself (port 0) and
 * read back from discovery.
 *
 * --drop-seq N puts a forwarder between engine 0 rank 0 and its relay that
 * drops the live batch with ZMQ sequence N (the replay endpoint stays
 * direct, so a relay with replay recovers it and one without cannot).
 * --extra-block-seq N makes the same forwarder add, to the first batch from
 * sequence N on that stores blocks, a well-formed child of the last block
 * stored: block_size tokens outside any prompt's vocabulary under a hash
 * the engine never computed. The relay and the index take it; no prompt's
 * path ever reaches it; only a checkpoint's block sets can see it.
 */
#include "check_int.h"
#include "wire.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* A child gets READY_MS to answer; SPAWN_TRIES free ports are tried when
 * another process takes one first. While waiting for a relay, the longest
 * sleep between two looks is READY_POLL_MAX_MS. */
enum { READY_MS = 20000, SPAWN_TRIES = 5, READY_POLL_MAX_MS = 50 };
/* Grace between SIGTERM and SIGKILL for a child we stop, and for one that
 * never got ready. */
enum { STOP_GRACE_MS = 3000, NOT_READY_GRACE_MS = 2000 };
/* Lines of each process's log printed when the set-up failed. */
enum { SETUP_LOG_LINES = 20 };
/* The drop-seq forwarder notices it must stop within PROXY_POLL_MS. A
 * KV-event message has 3 frames: one of more than PROXY_MAX_FRAMES is not
 * one and is dropped whole. */
enum { PROXY_POLL_MS = 50, PROXY_MAX_FRAMES = 8 };
/* Replay buffers, in batches per rank: never fewer than REPLAY_MIN; for a
 * whole run (--relay-restart-at) REPLAY_PER_REQUEST per request (a
 * generous bound on what a Mooncake request publishes), at most
 * REPLAY_MAX. REQUESTS_UNKNOWN: the run's length when neither a trace nor
 * --limit says it. */
#define REPLAY_MIN 10000
#define REPLAY_PER_REQUEST 64
#define REPLAY_MAX 4000000
#define REQUESTS_UNKNOWN 20000
/* Under --load a relay may lag its engine by more than one request's
 * batches; a gap is filled from this many. */
#define REPLAY_LOAD 100000
/* Publisher ids of a run: a random 31-bit base shifted left by
 * PUBLISHER_RUN_BITS, so a run's relays (numbered from the base) never
 * reach another run's range and every id stays below 2^51, exact even
 * where a JSON reader keeps numbers as doubles. */
#define PUBLISHER_BASE_MASK 0x7fffffffull
#define PUBLISHER_RUN_BITS 20

/* out = dir/name when that fits and is an executable. */
static bool exe_in(const char *dir, const char *name, char *out, size_t outsz) {
    int n = snprintf(out, outsz, "%s/%s", dir, name);
    return n > 0 && (size_t)n < outsz && access(out, X_OK) == 0;
}

/* A sibling executable: bin_dir, then next to /proc/self/exe, then PATH. */
static kvo_status find_bin(const char *bin_dir, const char *name, char *out,
                           size_t outsz) {
    if (bin_dir && *bin_dir && exe_in(bin_dir, name, out, outsz)) return KVO_OK;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            if (exe_in(self, name, out, outsz)) return KVO_OK;
        }
    }
    return kvo_find_exe(name, out, outsz);
}

/* ---- The drop-seq forwarder --------------------------------------------- */

struct chk_proxy {
    void *ctx;
    void *sub, *xpub;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    atomic_bool subscribed; /* the relay's SUB reached us */
    int64_t drop_seq;       /* -1: none */
    int64_t extra_seq;      /* -1: none; else add a block from here on */
    bool extra_done;
    uint32_t block_size;
    kvo_buf payload;    /* the re-encoded batch */
    char endpoint[128]; /* where the relay connects */
};

/* Hashes and tokens of the block --extra-block-seq adds: no prompt has
 * these tokens (the trace vocabulary is 32,000 ids). */
#define EXTRA_HASH_SALT 0x6B766F2D65787472ull
#define EXTRA_TOKEN_BASE 4000000000ull

/* payload with a child block added after its first BlockStored's last
 * block, re-encoded (map format) into p->payload; false: nothing to add to
 * (no store, or not decodable) -- it goes on unchanged. */
static bool add_extra_block(chk_proxy *p, const uint8_t *payload, size_t len) {
    wire_batch b;
    wire_batch_init(&b);
    bool done = false;
    if (wire_batch_decode(payload, len, NULL, &b, NULL) != KVO_OK) goto out;
    const wire_event *st = NULL;
    for (uint32_t i = 0; i < b.n_events && !st; i++)
        if (b.events[i].type == WIRE_EV_STORED && b.events[i].n_hashes)
            st = &b.events[i];
    if (!st) goto out;
    wire_event *ev = kvo_arena_alloc(&b.arena, (b.n_events + 1) * sizeof(*ev));
    wire_hash *h = kvo_arena_alloc(&b.arena, sizeof(*h));
    uint64_t *tok = kvo_arena_alloc(&b.arena, p->block_size * sizeof(*tok));
    if (!ev || !h || !tok) goto out;
    memcpy(ev, b.events, b.n_events * sizeof(*ev));
    wire_event *x = &ev[b.n_events];
    memset(x, 0, sizeof(*x));
    x->type = WIRE_EV_STORED;
    x->layout = WIRE_LAYOUT_MAP;
    x->parent = st->hashes[st->n_hashes - 1];
    h->kind = WIRE_HASH_UINT;
    h->key = kvo_mix64(x->parent.key ^ EXTRA_HASH_SALT);
    x->n_hashes = 1;
    x->hashes = h;
    for (uint32_t j = 0; j < p->block_size; j++) tok[j] = EXTRA_TOKEN_BASE + j;
    x->n_tokens = p->block_size;
    x->token_ids = tok;
    x->block_size = (wire_int){true, p->block_size};
    b.events = ev;
    b.n_events++;
    kvo_buf_reset(&p->payload);
    done = wire_batch_encode(&b, WIRE_FMT_MAP, 0, &p->payload) == KVO_OK;
out:
    wire_batch_fini(&b);
    return done;
}

static void *proxy_main(void *arg) {
    chk_proxy *p = arg;
    zmq_pollitem_t items[2] = {{p->sub, 0, ZMQ_POLLIN, 0},
                               {p->xpub, 0, ZMQ_POLLIN, 0}};
    zmq_msg_t frames[PROXY_MAX_FRAMES];
    while (!atomic_load(&p->stop)) {
        if (zmq_poll(items, 2, PROXY_POLL_MS) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) { /* subscription messages */
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, p->xpub, ZMQ_DONTWAIT) >= 0 &&
                zmq_msg_size(&m) > 0 &&
                ((const uint8_t *)zmq_msg_data(&m))[0] == 1)
                atomic_store(&p->subscribed, true);
            zmq_msg_close(&m);
        }
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        for (;;) { /* drain: one multipart message at a time */
            int nf = 0, more = 1;
            bool ok = true;
            while (more) {
                if (nf == PROXY_MAX_FRAMES) { /* not a KV-event message */
                    zmq_msg_t skip;
                    zmq_msg_init(&skip);
                    zmq_msg_recv(&skip, p->sub, 0);
                    more = zmq_msg_more(&skip);
                    zmq_msg_close(&skip);
                    ok = false;
                    continue;
                }
                zmq_msg_init(&frames[nf]);
                if (zmq_msg_recv(&frames[nf], p->sub,
                                 nf == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                    zmq_msg_close(&frames[nf]);
                    break;
                }
                more = zmq_msg_more(&frames[nf]);
                nf++;
            }
            if (nf == 0) break;
            bool drop = false, extra = false;
            uint64_t seq;
            if (ok && nf == 3 && zmq_msg_size(&frames[1]) == 8 &&
                wire_seq_get(zmq_msg_data(&frames[1]), 8, &seq) == KVO_OK) {
                drop = p->drop_seq >= 0 && seq == (uint64_t)p->drop_seq;
                if (!drop && p->extra_seq >= 0 && !p->extra_done &&
                    seq >= (uint64_t)p->extra_seq &&
                    add_extra_block(p, zmq_msg_data(&frames[2]),
                                    zmq_msg_size(&frames[2])))
                    extra = p->extra_done = true;
            }
            for (int i = 0; i < nf; i++) {
                if (ok && !drop && extra && i == 2)
                    zmq_send(p->xpub, p->payload.data, p->payload.len, 0);
                else if (ok && !drop)
                    zmq_msg_send(&frames[i], p->xpub,
                                 i + 1 < nf ? ZMQ_SNDMORE : 0);
                zmq_msg_close(&frames[i]);
            }
        }
    }
    return NULL;
}

static void proxy_free(chk_proxy *p) {
    if (!p) return;
    if (p->started) {
        atomic_store(&p->stop, true);
        pthread_join(p->thread, NULL);
    }
    if (p->sub) zmq_close(p->sub);
    if (p->xpub) zmq_close(p->xpub);
    if (p->ctx) zmq_ctx_term(p->ctx);
    kvo_buf_fini(&p->payload);
    kvo_free(p);
}

static kvo_status proxy_new(chk_proxy **out, const char *upstream,
                            const char *topic, const check_cfg *cfg,
                            kvo_err *err) {
    chk_proxy *p = kvo_calloc(1, sizeof(*p));
    if (!p) return KVO_ENOMEM;
    p->drop_seq = cfg->drop_seq;
    p->extra_seq = cfg->extra_block_seq;
    p->block_size = cfg->block_size;
    kvo_buf_init(&p->payload);
    int linger = 0, hwm = 0;
    size_t len = sizeof(p->endpoint);
    p->ctx = zmq_ctx_new();
    if (!p->ctx) goto fail;
    p->sub = zmq_socket(p->ctx, ZMQ_SUB);
    p->xpub = zmq_socket(p->ctx, ZMQ_XPUB);
    if (!p->sub || !p->xpub) goto fail;
    zmq_setsockopt(p->sub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(p->xpub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(p->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(p->xpub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (zmq_setsockopt(p->sub, ZMQ_SUBSCRIBE, topic, strlen(topic)) != 0 ||
        zmq_connect(p->sub, upstream) != 0 ||
        zmq_bind(p->xpub, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(p->xpub, ZMQ_LAST_ENDPOINT, p->endpoint, &len) != 0)
        goto fail;
    if (pthread_create(&p->thread, NULL, proxy_main, p) != 0) goto fail;
    p->started = true;
    *out = p;
    return KVO_OK;
fail:
    kvo_err_set(err, KVO_ENET, KVO_ERR_NO_OFFSET,
                "the wire-fault forwarder: %s", zmq_strerror(zmq_errno()));
    proxy_free(p);
    return KVO_ENET;
}

/* ---- Processes ------------------------------------------------------------ */

/* A child's command line (check_int.h). */
void chk_args_init(chk_args *a) {
    memset(a, 0, sizeof(*a));
    a->port_at = SIZE_MAX;
    a->port_prefix = "";
}

void chk_args_fini(chk_args *a) {
    for (size_t i = 0; i < a->n; i++) kvo_free(a->v[i]);
    kvo_free(a->v);
    chk_args_init(a);
}

/* fmt and ap as a heap string (NULL: out of memory). */
static char *vformat(const char *fmt, va_list ap)
    __attribute__((format(printf, 1, 0)));
static char *vformat(const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    char *s = len < 0 ? NULL : kvo_malloc((size_t)len + 1);
    if (s) vsnprintf(s, (size_t)len + 1, fmt, again);
    va_end(again);
    return s;
}

void chk_arg(chk_args *a, const char *fmt, ...) {
    if (a->st != KVO_OK) return;
    a->st = kvo_grow(&a->v, &a->cap, a->n + 2, sizeof(*a->v), 16);
    if (a->st != KVO_OK) return;
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    if (!s) {
        a->st = KVO_ENOMEM;
        return;
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

void chk_arg_port(chk_args *a, const char *prefix) {
    if (a->st != KVO_OK) return;
    a->port_at = a->n;
    a->port_prefix = prefix;
    chk_arg(a, "%s0", prefix);
}

kvo_status chk_args_set_port(chk_args *a, uint16_t port) {
    if (a->st != KVO_OK || a->port_at >= a->n) return KVO_EINVAL;
    char buf[16];
    int len = snprintf(buf, sizeof(buf), "%u", port);
    char *s = kvo_malloc(strlen(a->port_prefix) + (size_t)len + 1);
    if (!s) return KVO_ENOMEM;
    strcpy(s, a->port_prefix);
    strcat(s, buf);
    kvo_free(a->v[a->port_at]);
    a->v[a->port_at] = s;
    return KVO_OK;
}

/* A sibling binary (find_bin), or KVO_ENOTFOUND with err saying so. */
static kvo_status find_sibling(const chk_env *env, const char *name, char *exe,
                               size_t exesz, kvo_err *err) {
    if (find_bin(env->bin_dir, name, exe, exesz) == KVO_OK) return KVO_OK;
    return kvo_err_set(err, KVO_ENOTFOUND, KVO_ERR_NO_OFFSET,
                       "%s not found next to kvo-check nor in PATH", name);
}

/* Spawn with its log in env's log dir as `file`, then wait until it
 * listens on 127.0.0.1:port (http: GET /health answers 200; else a TCP
 * accept). */
static kvo_status spawn_ready_log(kvo_proc *p, const char *name,
                                  const chk_args *a, const char *log,
                                  uint16_t port, bool http, kvo_err *err);

static kvo_status spawn_ready(const chk_env *env, kvo_proc *p, const char *name,
                              const chk_args *a, const char *file,
                              uint16_t port, bool http, kvo_err *err) {
    char log[1024];
    snprintf(log, sizeof(log), "%s/%s", env->log_dir, file);
    return spawn_ready_log(p, name, a, log, port, http, err);
}

/* The same with the log's whole path (appended to: a process started
 * again after a kill continues its log). */
static kvo_status spawn_ready_log(kvo_proc *p, const char *name,
                                  const chk_args *a, const char *log,
                                  uint16_t port, bool http, kvo_err *err) {
    kvo_status st = kvo_proc_spawn(p, name, a->v, log);
    if (st != KVO_OK) {
        return kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                           "cannot start %s (%s): %s", name, a->v[0],
                           kvo_strerror(st));
    }
    if (http) {
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%u/health", port);
        st = kvo_wait_http(p, url, READY_MS);
    } else {
        st = kvo_wait_tcp(p, "127.0.0.1", port, READY_MS);
    }
    if (st != KVO_OK) {
        kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                    "%s not ready (%s): %s; log: %s", name, kvo_strerror(st),
                    p->exited ? "it exited" : "still starting", log);
        kvo_proc_stop(p, NOT_READY_GRACE_MS);
    }
    return st;
}

/* Start a child that listens on a free loopback port: pick one, write it
 * into a's port argument, spawn_ready. Another process may take the port
 * between the pick and the child's bind (the child then dies at once), so
 * up to SPAWN_TRIES ports are tried. *port = the one it listens on. */
static kvo_status spawn_on_free_port(const chk_env *env, kvo_proc *p,
                                     const char *name, chk_args *a,
                                     const char *file, bool http,
                                     uint16_t *port, kvo_err *err) {
    if (a->st != KVO_OK)
        return kvo_err_set(err, a->st, KVO_ERR_NO_OFFSET,
                           "the command line of %s: %s", name,
                           kvo_strerror(a->st));
    kvo_status st = KVO_ENET;
    for (int t = 0; t < SPAWN_TRIES && st != KVO_OK; t++) {
        if ((st = kvo_free_port(port)) != KVO_OK) break;
        if ((st = chk_args_set_port(a, *port)) != KVO_OK)
            return kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                               "the command line of %s: %s", name,
                               kvo_strerror(st));
        st = spawn_ready(env, p, name, a, file, *port, http, err);
    }
    return st;
}

/* The servers as a client list, node `first` first, then the others in
 * order (kvo_nats tries them in the order given). */
static void nats_list(const chk_env *env, uint32_t first, char *out, size_t n) {
    size_t len = 0;
    out[0] = '\0';
    for (uint32_t k = 0; k < env->n_nats && len < n; k++) {
        uint32_t i = (first + k) % env->n_nats;
        len += (size_t)snprintf(out + len, n - len, "%snats://127.0.0.1:%u",
                                k ? "," : "", env->nats_port[i]);
    }
}

/* Whether the node behind monitor_url (its /routez) has routes to at
 * least `want` distinct other nodes (a pair may be connected twice for a
 * while before the duplicate is closed). */
static bool node_routes(const char *monitor_url, uint32_t want) {
    kvo_http_client *h = NULL;
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    kvo_json doc;
    kvo_json_init(&doc);
    const char *ids[CHECK_NATS_MAX];
    uint32_t n = 0;
    if (kvo_http_client_new(&h, 1000) == KVO_OK &&
        kvo_http_get(h, monitor_url, &resp) == KVO_OK && resp.status == 200 &&
        kvo_json_parse(&doc, resp.body.data, resp.body.len, NULL, NULL) ==
            KVO_OK) {
        const kvo_jv *routes = kvo_json_get(doc.root, "routes");
        kvo_jv r;
        for (size_t i = 0; n < CHECK_NATS_MAX && kvo_json_at(routes, i, &r);
             i++) {
            const char *id = kvo_json_str(kvo_json_get(&r, "remote_id"), NULL);
            uint32_t j = 0;
            while (id && j < n && strcmp(ids[j], id) != 0) j++;
            if (id && j == n) ids[n++] = id;
        }
    }
    kvo_json_fini(&doc);
    kvo_http_resp_fini(&resp);
    kvo_http_client_free(h);
    return n >= want;
}

/* One nats-server: a single one, or cluster node i of n listening for
 * routes on cport[i] with routes to the others (monitoring on mport[i]). */
static kvo_status start_nats_node(chk_env *env, const char *exe, uint32_t i,
                                  const uint16_t *cport, const uint16_t *mport,
                                  kvo_err *err) {
    uint32_t n = env->cfg->nats_cluster;
    chk_args *a = &env->nats_args[i];
    chk_arg(a, "%s", exe);
    chk_arg(a, "-a");
    chk_arg(a, "127.0.0.1");
    chk_arg(a, "-p");
    chk_arg_port(a, "");
    if (n > 1) {
        char routes[256] = "";
        size_t len = 0;
        for (uint32_t j = 0; j < n; j++)
            if (j != i && len < sizeof(routes))
                len += (size_t)snprintf(routes + len, sizeof(routes) - len,
                                        "%snats://127.0.0.1:%u", len ? "," : "",
                                        cport[j]);
        chk_arg(a, "-m");
        chk_arg(a, "%u", mport[i]);
        chk_arg(a, "--cluster_name");
        chk_arg(a, "kvo");
        chk_arg(a, "--cluster");
        chk_arg(a, "nats://127.0.0.1:%u", cport[i]);
        chk_arg(a, "--routes");
        chk_arg(a, "%s", routes);
    }
    char name[32], file[48];
    snprintf(name, sizeof(name), n > 1 ? "nats-server[%u]" : "nats-server", i);
    snprintf(file, sizeof(file),
             n > 1 ? "nats-server-%u.log" : "nats-server.log", i);
    return spawn_on_free_port(env, &env->nats[i], name, a, file, false,
                              &env->nats_port[i], err);
}

/* nats-server, or --nats-cluster N of them with routes on loopback; a
 * cluster is ready once every node has a route to every other (before,
 * a message published on one node could miss another's subscribers). */
static kvo_status start_nats(chk_env *env, kvo_err *err) {
    const check_cfg *c = env->cfg;
    if (c->nats) {
        snprintf(env->nats_url, sizeof(env->nats_url), "%s", c->nats);
        snprintf(env->relay_nats_url, sizeof(env->relay_nats_url), "%s",
                 c->nats);
        return KVO_OK;
    }
    char exe[PATH_MAX];
    if (kvo_find_exe("nats-server", exe, sizeof(exe)) != KVO_OK) {
        return kvo_err_set(err, KVO_ENOTFOUND, KVO_ERR_NO_OFFSET,
                           "nats-server not found in PATH or /usr/sbin: "
                           "install it (apt-get install nats-server) or "
                           "pass --nats URL");
    }
    uint32_t n = c->nats_cluster ? c->nats_cluster : 1;
    uint16_t cport[CHECK_NATS_MAX] = {0}, mport[CHECK_NATS_MAX] = {0};
    kvo_status st = KVO_OK;
    for (uint32_t i = 0; n > 1 && i < n && st == KVO_OK; i++)
        if ((st = kvo_free_port(&cport[i])) == KVO_OK)
            st = kvo_free_port(&mport[i]);
    for (uint32_t i = 0; i < n && st == KVO_OK; i++) {
        st = start_nats_node(env, exe, i, cport, mport, err);
        if (st == KVO_OK) env->n_nats = i + 1;
    }
    if (st != KVO_OK) return st;
    for (uint32_t i = 0; n > 1 && i < n; i++) {
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%u/routez", mport[i]);
        uint64_t end = kvo_now_ns() + (uint64_t)READY_MS * 1000000;
        while (!node_routes(url, n - 1)) {
            if (kvo_stop) return KVO_EINTR;
            if (kvo_now_ns() > end)
                return kvo_err_set(err, KVO_ETIMEDOUT, KVO_ERR_NO_OFFSET,
                                   "nats-server[%u] has no route to every "
                                   "other node within %d ms; log: %s",
                                   i, READY_MS, env->nats[i].log_path);
            kvo_sleep_us(20000);
        }
    }
    nats_list(env, 0, env->nats_url, sizeof(env->nats_url));
    nats_list(env, n > 1 ? 1 : 0, env->relay_nats_url,
              sizeof(env->relay_nats_url));
    return KVO_OK;
}

/* Every HTTP client of the run gives up its request in flight on Ctrl-C /
 * SIGTERM, so kvo-check stops within about a second even while an engine
 * is busy (then stops what it started). */
static kvo_status client_new(kvo_http_client **out, long timeout_ms) {
    kvo_status st = kvo_http_client_new(out, timeout_ms);
    if (st == KVO_OK) kvo_http_client_abort_on(*out, &kvo_stop);
    return st;
}

static kvo_status start_indexer(chk_env *env, kvo_err *err) {
    const check_cfg *c = env->cfg;
    kvo_status st = client_new(&env->idx_http, c->timeout_ms);
    if (st == KVO_OK) st = client_new(&env->idx_metrics, c->timeout_ms);
    if (st != KVO_OK) return st;
    if (c->indexer) {
        snprintf(env->indexer_url, sizeof(env->indexer_url), "%s", c->indexer);
        size_t l = strlen(env->indexer_url);
        if (l && env->indexer_url[l - 1] == '/') env->indexer_url[l - 1] = 0;
        return KVO_OK;
    }
    char exe[PATH_MAX];
    if (find_sibling(env, "kvo-indexer", exe, sizeof(exe), err) != KVO_OK)
        return KVO_ENOTFOUND;
    chk_args *a = &env->idx_args;
    chk_arg(a, "%s", exe);
    chk_arg(a, "--nats");
    chk_arg(a, "%s", env->nats_url);
    if (c->indexer_api == CHECK_API_DYNAMO) {
        /* its own API on a port nobody asks; Dynamo's on ours */
        chk_arg(a, "--http");
        chk_arg(a, "127.0.0.1:0");
        chk_arg(a, "--dynamo-http");
    } else {
        chk_arg(a, "--http");
    }
    chk_arg_port(a, "127.0.0.1:");
    chk_arg(a, "--block-size");
    chk_arg(a, "%u", env->block_size);
    uint16_t port = 0;
    st = spawn_on_free_port(env, &env->indexer, "kvo-indexer", a,
                            "kvo-indexer.log", true, &port, err);
    if (st == KVO_OK) {
        env->idx_port = port;
        snprintf(env->indexer_url, sizeof(env->indexer_url),
                 "http://127.0.0.1:%u", port);
    }
    return st;
}

/* Replay buffer (batches per rank). A relay restarted mid-run rebuilds the
 * index from seq 0, so with --relay-restart-at the whole run must stay
 * replayable: ~40 batches per request on one rank is a generous bound for
 * Mooncake prompts (prefill chunks + a store every 16 generated tokens),
 * spread over the ranks round-robin. Otherwise a replay only ever fills a
 * gap, and in lockstep a relay can be behind by one request's batches at
 * most (the next request waits for its watermark): a step publishes only
 * when it allocates or fills blocks, so one request makes at most two
 * batches per block of prompt and output. */
static uint64_t replay_buffer_for(const check_cfg *c, const check_trace *t,
                                  uint64_t requests) {
    if (c->replay_buffer) return c->replay_buffer;
    if (c->load) /* many requests share each step: a step's batch per step
                    of the requests in flight, for a checkpoint's worth */
        return REPLAY_LOAD;
    if (c->relay_restart_at < 0 && !c->chaos && t && t->n && c->block_size) {
        uint64_t most = 0;
        for (size_t i = 0; i < t->n; i++) {
            uint64_t toks =
                (uint64_t)t->reqs[i].input_length + t->reqs[i].output_length;
            uint64_t b = 2 * ((toks + c->block_size - 1) / c->block_size) + 2;
            if (b > most) most = b;
        }
        uint64_t b = 2 * most; /* and a margin as large again */
        return b < REPLAY_MIN ? REPLAY_MIN : b;
    }
    uint64_t b = requests * REPLAY_PER_REQUEST + REPLAY_MIN;
    return b > REPLAY_MAX ? REPLAY_MAX : b;
}

static kvo_status start_mocker(chk_env *env, chk_engine *e, uint32_t index,
                               const char *role, uint64_t requests,
                               kvo_err *err) {
    const check_cfg *c = env->cfg;
    char exe[PATH_MAX];
    if (find_sibling(env, "kvo-mocker", exe, sizeof(exe), err) != KVO_OK)
        return KVO_ENOTFOUND;
    snprintf(e->name, sizeof(e->name), "kvo-mocker[%u]", index);
    char file[64];
    snprintf(file, sizeof(file), "kvo-mocker-%u.log", index);
    chk_args *a = &e->args;
    chk_arg(a, "%s", exe);
    chk_arg(a, "--port");
    chk_arg_port(a, "");
    chk_arg(a, "--zmq-port");
    chk_arg(a, "0");
    chk_arg(a, "--replay-port");
    chk_arg(a, "0");
    chk_arg(a, "--speedup");
    chk_arg(a, "%g", chk_speedup(c));
    chk_arg(a, "--replay-buffer");
    chk_arg(a, "%llu",
            (unsigned long long)replay_buffer_for(c, env->trace, requests));
    chk_arg(a, "--block-size");
    chk_arg(a, "%u", c->block_size);
    if (c->num_gpu_blocks) {
        chk_arg(a, "--num-gpu-blocks");
        chk_arg(a, "%llu", (unsigned long long)c->num_gpu_blocks);
    }
    chk_arg(a, "--dp-size");
    chk_arg(a, "%u", c->dp_size);
    chk_arg(a, "--hash-algo");
    chk_arg(a, "%s", c->hash_algo);
    chk_arg(a, "--hash-seed");
    chk_arg(a, "%s", c->hash_seed);
    if (c->event_format) {
        chk_arg(a, "--event-format");
        chk_arg(a, "%s", c->event_format);
    }
    chk_arg(a, "--seed");
    chk_arg(a, "%llu", (unsigned long long)(c->seed + index));
    if (c->mutate && *c->mutate) {
        chk_arg(a, "--mutate");
        chk_arg(a, "%s", c->mutate);
    }
    if (c->lora_adapters) { /* the names check_keys_of gives requests */
        kvo_buf names;
        kvo_buf_init(&names);
        kvo_status ls = KVO_OK;
        for (uint32_t k = 1; ls == KVO_OK && k <= c->lora_adapters; k++)
            ls = kvo_buf_printf(&names, "%skvo-lora-%u", k > 1 ? "," : "", k);
        if (ls == KVO_OK) ls = kvo_buf_append(&names, "", 1);
        if (ls != KVO_OK) {
            kvo_buf_fini(&names);
            return KVO_ENOMEM; /* a is e's: freed with it */
        }
        chk_arg(a, "--lora-modules");
        chk_arg(a, "%s", (const char *)names.data);
        kvo_buf_fini(&names);
    }
    if (c->kv_groups) {
        chk_arg(a, "--kv-groups");
        chk_arg(a, "%s", c->kv_groups);
    }
    if (c->cpu_offload_blocks) {
        chk_arg(a, "--cpu-offload-blocks");
        chk_arg(a, "%llu", (unsigned long long)c->cpu_offload_blocks);
    }
    if (role) {
        chk_arg(a, "--role");
        chk_arg(a, "%s", role);
    }
    uint16_t port = 0;
    kvo_status st =
        spawn_on_free_port(env, &e->proc, e->name, a, file, true, &port, err);
    if (st == KVO_OK) {
        e->port = port;
        snprintf(e->url, sizeof(e->url), "http://127.0.0.1:%u", port);
    }
    return st;
}

static kvo_status relay_spawn(chk_env *env, chk_relay *r, const chk_rank *rk,
                              const char *zmq_ep, kvo_err *err) {
    const check_cfg *c = env->cfg;
    char exe[PATH_MAX];
    if (find_sibling(env, "kvo-relay", exe, sizeof(exe), err) != KVO_OK)
        return KVO_ENOTFOUND;
    char file[96], name[64];
    snprintf(file, sizeof(file), "kvo-relay-%u.%u-%llx.log", r->engine,
             r->dp_rank, (unsigned long long)r->publisher_id);
    snprintf(name, sizeof(name), "kvo-relay[%u.%u]", r->engine, r->dp_rank);
    chk_args a;
    chk_args_init(&a);
    chk_arg(&a, "%s", exe);
    chk_arg(&a, "--zmq");
    chk_arg(&a, "%s", zmq_ep);
    if (!c->no_replay && rk->replay[0]) {
        chk_arg(&a, "--replay");
        chk_arg(&a, "%s", rk->replay);
        chk_arg(&a, "--replay-from");
        chk_arg(&a, "0");
    }
    chk_arg(&a, "--topic");
    chk_arg(&a, "%s", rk->topic);
    chk_arg(&a, "--nats");
    chk_arg(&a, "%s", env->relay_nats_url);
    chk_arg(&a, "--worker-id");
    chk_arg(&a, "%u", env->engines[r->engine].worker_id);
    chk_arg(&a, "--publisher-id");
    chk_arg(&a, "%llu", (unsigned long long)r->publisher_id);
    chk_arg(&a, "--block-size");
    chk_arg(&a, "%u", env->block_size);
    chk_arg(&a, "--metrics-listen");
    chk_arg_port(&a, "127.0.0.1:");
    if (c->verify_engine_hash) {
        chk_arg(&a, "--verify-engine-hash");
        chk_arg(&a, "%s", c->hash_algo);
        chk_arg(&a, "--hash-seed");
        chk_arg(&a, "%s", c->hash_seed);
    }
    uint16_t port = 0;
    kvo_status st =
        spawn_on_free_port(env, &r->proc, name, &a, file, true, &port, err);
    chk_args_fini(&a);
    if (st == KVO_OK) r->metrics_port = port;
    return st;
}

/* Ready: with --replay-from the relay's `cleared` reached the indexer (its
 * publisher is listed) and every source is live (the replay ended). */
static kvo_status relay_wait_ready(chk_env *env, chk_relay *r, kvo_err *err) {
    const check_cfg *c = env->cfg;
    const chk_engine *e = &env->engines[r->engine];
    bool needs_cleared = false;
    for (uint32_t k = 0; k < e->n_ranks; k++)
        if (e->ranks[k].dp_rank == r->dp_rank)
            needs_cleared = !c->no_replay && e->ranks[k].replay[0];
    uint64_t deadline = kvo_now_ns() + (uint64_t)READY_MS * 1000000;
    chk_watermark w;
    memset(&w, 0, sizeof(w));
    kvo_status st = KVO_OK;
    for (long wait = 1;;
         wait = wait < READY_POLL_MAX_MS ? wait * 2 : READY_POLL_MAX_MS) {
        if (kvo_stop) {
            st = KVO_EINTR;
            break;
        }
        if (!kvo_proc_alive(&r->proc)) {
            st = kvo_err_set(err, KVO_ESTATE, KVO_ERR_NO_OFFSET,
                             "%s exited (status %d); log: %s", r->proc.name,
                             r->proc.exit_status, r->proc.log_path);
            break;
        }
        bool listed = true, live = false;
        if (needs_cleared) {
            if (chk_index_watermark(env, &w, NULL) == KVO_OK)
                chk_watermark_get(&w, r->publisher_id, &listed);
            else
                listed = false;
        }
        if (listed) chk_relay_live(r, &live);
        if (listed && live &&
            (!env->proxy || atomic_load(&env->proxy->subscribed)))
            break;
        if (kvo_now_ns() > deadline) {
            st = kvo_err_set(err, KVO_ETIMEDOUT, KVO_ERR_NO_OFFSET,
                             "%s not ready after %d ms (%s); log: %s",
                             r->proc.name, READY_MS,
                             !listed ? "its `cleared` never reached the indexer"
                                     : "its sources are not live",
                             r->proc.log_path);
            break;
        }
        kvo_sleep_us(wait * 1000L);
    }
    chk_watermark_fini(&w);
    return st;
}

static kvo_status start_relay(chk_env *env, uint32_t engine, uint32_t rank,
                              kvo_err *err) {
    kvo_status st = kvo_grow(&env->relays, &env->cap_relays, env->n_relays + 1,
                             sizeof(*env->relays), 16);
    if (st != KVO_OK) return st;
    chk_relay *r = &env->relays[env->n_relays];
    memset(r, 0, sizeof(*r));
    r->engine = engine;
    r->dp_rank = env->engines[engine].ranks[rank].dp_rank;
    r->publisher_id = env->publisher_base + env->publishers_made++;
    r->dirty = true;
    snprintf(r->stage, sizeof(r->stage), "relay %u.%u",
             env->engines[engine].worker_id, r->dp_rank);
    st = client_new(&r->http, env->cfg->timeout_ms);
    if (st != KVO_OK) return st;
    chk_rank *rk = &env->engines[engine].ranks[rank];
    const char *ep = rk->zmq;
    if ((env->cfg->drop_seq >= 0 || env->cfg->extra_block_seq >= 0) &&
        engine == 0 && rank == 0 && !env->proxy) {
        st = proxy_new(&env->proxy, rk->zmq, rk->topic, env->cfg, err);
        if (st != KVO_OK) goto fail;
    }
    if (env->proxy && engine == 0 && rank == 0) ep = env->proxy->endpoint;
    st = relay_spawn(env, r, rk, ep, err);
    if (st != KVO_OK) goto fail;
    env->n_relays++;
    rk->relay = (int)(env->n_relays - 1);
    st = relay_wait_ready(env, r, err);
    return st;
fail:
    kvo_http_client_free(r->http);
    r->http = NULL;
    return st;
}

/* ---- Faults (check_fault.c): kill, start again, wait until ready ---------- */

/* Counters of `stage` (and of stages starting with "stage.": an engine's
 * ranks) move to "<stage> #n": a killed process keeps its last ones. */
static void retire_stage(check_counters *c, const char *stage, uint32_t n) {
    char to[96];
    snprintf(to, sizeof(to), "%s #%u", stage, n);
    check_counters_rename_stage(c, stage, to);
}

/* The relay of (engine, rank index): killed, a fresh one started. */
static kvo_status relay_restart(chk_env *env, uint32_t engine, uint32_t rank,
                                check_counters *counters, check_fault *f,
                                kvo_err *err) {
    if (engine >= env->n_workers || rank >= env->engines[engine].n_ranks ||
        env->engines[engine].ranks[rank].relay < 0) {
        return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                           "engine %u rank %u has no relay", engine, rank);
    }
    chk_rank *rk = &env->engines[engine].ranks[rank];
    chk_relay *old = &env->relays[rk->relay];
    snprintf(f->target, sizeof(f->target), "%s", old->proc.name);
    /* its final counters stay in the report under a retired name */
    if (counters) {
        chk_counters_relay(old, counters, NULL);
        char stage[sizeof(old->stage)];
        snprintf(stage, sizeof(stage), "%.40s #%u", old->stage,
                 env->publishers_made);
        check_counters_rename_stage(counters, old->stage, stage);
        snprintf(old->stage, sizeof(old->stage), "%s", stage);
    }
    kvo_info("SIGKILL %s (publisher %llu) and start a fresh relay",
             old->proc.name, (unsigned long long)old->publisher_id);
    f->killed_ns = kvo_now_ns();
    kvo_proc_kill(&old->proc);
    old->retired = true;
    return start_relay(env, engine, rank, err);
}

/* SIGKILL p, then start its command line a again (same ports, same log). */
static kvo_status respawn(kvo_proc *p, const chk_args *a, uint16_t port,
                          bool http, uint64_t down_ms, check_fault *f,
                          kvo_err *err) {
    char name[sizeof(p->name)], log[sizeof(p->log_path)];
    snprintf(name, sizeof(name), "%s", p->name);
    snprintf(log, sizeof(log), "%s", p->log_path);
    snprintf(f->target, sizeof(f->target), "%s", name);
    kvo_info("SIGKILL %s and start it again on port %u", name, port);
    f->killed_ns = kvo_now_ns();
    kvo_proc_kill(p);
    /* down for a while (interrupted by Ctrl-C) */
    for (uint64_t end = kvo_now_ns() + down_ms * 1000000;
         !kvo_stop && kvo_now_ns() < end;)
        kvo_sleep_us(10000);
    return spawn_ready_log(p, name, a, log, port, http, err);
}

/* Poll until done(env, arg) or timeout_ms; why(env, arg) names what is
 * still missing. KVO_EINTR on Ctrl-C. */
static kvo_status wait_until(chk_env *env, long timeout_ms,
                             bool (*done)(chk_env *, void *, char *, size_t),
                             void *arg, const char *what, kvo_err *err) {
    uint64_t deadline = kvo_now_ns() + (uint64_t)timeout_ms * 1000000;
    char why[256] = "";
    for (long wait = 1;;
         wait = wait < READY_POLL_MAX_MS ? wait * 2 : READY_POLL_MAX_MS) {
        if (kvo_stop) return KVO_EINTR;
        if (done(env, arg, why, sizeof(why))) return KVO_OK;
        char dead[600];
        if (chk_env_dead(env, dead, sizeof(dead)))
            return kvo_err_set(err, KVO_ESTATE, KVO_ERR_NO_OFFSET, "%s", dead);
        if (kvo_now_ns() > deadline)
            return kvo_err_set(err, KVO_ETIMEDOUT, KVO_ERR_NO_OFFSET,
                               "%s not within %ld ms: %s", what, timeout_ms,
                               why);
        kvo_sleep_us(wait * 1000L);
    }
}

/* The restarted indexer rebuilt the index: /health says "ok". */
static bool indexer_ok(chk_env *env, void *arg, char *why, size_t whysz) {
    (void)arg;
    char status[32] = "", nats[32] = "";
    kvo_err e = {0};
    if (chk_index_health(env, status, sizeof(status), nats, sizeof(nats), &e) !=
        KVO_OK) {
        snprintf(why, whysz, "%s", e.msg);
        return false;
    }
    snprintf(why, whysz, "/health says \"%s\" (nats %s)", status, nats);
    return strcmp(status, "ok") == 0;
}

/* The restarted engine's ranks hold nothing in the index. */
static bool engine_cleared(chk_env *env, void *arg, char *why, size_t whysz) {
    const chk_engine *e = arg;
    bool all = true;
    for (uint32_t k = 0; k < e->n_ranks && all; k++) {
        chk_blocks b;
        chk_blocks_init(&b);
        kvo_err er = {0};
        if (chk_index_blocks(env, e->worker_id, e->ranks[k].dp_rank,
                             WIRE_TIER_DEVICE, false, &b, &er) != KVO_OK) {
            snprintf(why, whysz, "%s", er.msg);
            all = false;
        } else if (b.count) {
            snprintf(why, whysz,
                     "the index still holds %llu blocks of worker "
                     "%u rank %u (its relay never cleared them)",
                     (unsigned long long)b.count, e->worker_id,
                     e->ranks[k].dp_rank);
            all = false;
        }
        chk_blocks_fini(&b);
    }
    return all;
}

/* "tcp://127.0.0.1:5557" -> 5557; 0 when there is none. */
static uint16_t endpoint_port(const char *ep) {
    const char *colon = strrchr(ep, ':');
    uint32_t port;
    if (!colon || kvo_parse_u32(colon + 1, &port) != KVO_OK ||
        port > UINT16_MAX)
        return 0;
    return (uint16_t)port;
}

/* The argument after `opt` in a becomes the number v. */
static kvo_status args_set_after(chk_args *a, const char *opt, unsigned v) {
    for (size_t i = 0; i + 1 < a->n; i++)
        if (strcmp(a->v[i], opt) == 0) {
            char buf[16];
            snprintf(buf, sizeof(buf), "%u", v);
            char *s = kvo_strdup(buf);
            if (!s) return KVO_ENOMEM;
            kvo_free(a->v[i + 1]);
            a->v[i + 1] = s;
            return KVO_OK;
        }
    return KVO_EINVAL;
}

/* kvo-mocker e again on the ZMQ ports it had picked: its relays' SUBs
 * reconnect to the new engine. */
static kvo_status engine_restart(chk_env *env, chk_engine *e,
                                 check_counters *counters, check_fault *f,
                                 kvo_err *err) {
    if (!e->proc.pid || e->n_ranks == 0)
        return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                           "%s is not a spawned engine that publishes",
                           e->name);
    /* port 0 made the mocker pick consecutive ports: rank r's are rank
     * 0's + r, which --zmq-port / --replay-port give it back */
    uint16_t zp = endpoint_port(e->ranks[0].zmq);
    uint16_t rp = endpoint_port(e->ranks[0].replay);
    if (!zp || args_set_after(&e->args, "--zmq-port", zp) != KVO_OK ||
        (rp && args_set_after(&e->args, "--replay-port", rp) != KVO_OK))
        return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                           "%s: cannot tell its ZMQ ports (%s, %s)", e->name,
                           e->ranks[0].zmq, e->ranks[0].replay);
    if (counters && chk_engine_counters(e, counters, NULL) == KVO_OK)
        for (uint32_t k = 0; k < e->n_ranks; k++) {
            char stage[48];
            snprintf(stage, sizeof(stage), "engine %u.%u", e->worker_id,
                     e->ranks[k].dp_rank);
            retire_stage(counters, stage, ++env->restarts);
        }
    kvo_status st = respawn(&e->proc, &e->args, e->port, true, 0, f, err);
    if (st != KVO_OK) return st;
    /* a fresh engine: nothing published (its sequences start again) */
    if ((st = chk_engine_state(e, err)) != KVO_OK) return st;
    for (uint32_t k = 0; k < e->n_ranks; k++) {
        e->ranks[k].last_seq = -1;
        e->ranks[k].restarted = true;
    }
    e->dirty = false;
    return wait_until(env, env->cfg->timeout_ms, engine_cleared, e,
                      "the restarted engine's blocks cleared from the index",
                      err);
}

kvo_status chk_env_fault(chk_env *env, check_fault *f, check_counters *counters,
                         kvo_err *err) {
    const check_cfg *c = env->cfg;
    kvo_status st;
    switch (f->kind) {
    case CHECK_FAULT_RELAY:
        st = relay_restart(env, f->worker, f->rank, counters, f, err);
        break;
    case CHECK_FAULT_INDEXER:
        if (!env->indexer.pid) goto not_ours;
        if (counters && chk_counters_indexer(env, counters, NULL) == KVO_OK)
            retire_stage(counters, "indexer", ++env->restarts);
        st = respawn(&env->indexer, &env->idx_args, env->idx_port, true, 0, f,
                     err);
        if (st == KVO_OK)
            st = wait_until(env, c->timeout_ms, indexer_ok, NULL,
                            "the restarted indexer's recovery", err);
        break;
    case CHECK_FAULT_ENGINE:
        if (f->worker >= env->n_workers) goto not_ours;
        st = engine_restart(env, &env->engines[f->worker], counters, f, err);
        break;
    case CHECK_FAULT_NATS: {
        /* the indexer's node (0), or the relays' (1 in a cluster) */
        uint32_t i = c->nats_kill_relay_node && env->n_nats > 1 ? 1 : 0;
        if (!env->nats[i].pid) goto not_ours;
        st = respawn(&env->nats[i], &env->nats_args[i], env->nats_port[i],
                     false, c->nats_down_ms, f, err);
        break;
    }
    default: goto not_ours;
    }
    if (st == KVO_OK) {
        f->done = true;
        f->down_ms = (double)(kvo_now_ns() - f->killed_ns) / 1e6;
    }
    return st;
not_ours:
    return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                       "cannot inject a %s fault: kvo-check did not start "
                       "that process",
                       check_fault_kind_name(f->kind));
}

/* ---- Engines ---------------------------------------------------------------*/

static kvo_status attach_engines(chk_env *env, kvo_err *err) {
    const check_cfg *c = env->cfg;
    char *list = kvo_strdup(c->engines);
    if (!list) return KVO_ENOMEM;
    uint32_t n = 0;
    for (char *p = list; *p; p++) n += *p == ',';
    env->engines = kvo_calloc(n + 1, sizeof(chk_engine));
    kvo_status st = env->engines ? KVO_OK : KVO_ENOMEM;
    char *save = NULL;
    for (char *u = strtok_r(list, ",", &save); u && st == KVO_OK;
         u = strtok_r(NULL, ",", &save)) {
        chk_engine *e = &env->engines[env->n_engines];
        snprintf(e->url, sizeof(e->url), "%s", u);
        size_t l = strlen(e->url);
        while (l && e->url[l - 1] == '/') e->url[--l] = '\0';
        snprintf(e->name, sizeof(e->name), "engine[%u]", env->n_engines);
        e->worker_id = env->n_engines;
        st = client_new(&e->http, c->timeout_ms);
        if (st == KVO_OK) st = client_new(&e->probe_http, c->timeout_ms);
        if (st != KVO_OK) break;
        env->n_engines++;
    }
    kvo_free(list);
    if (st == KVO_OK && env->n_engines == 0) {
        st = kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                         "--engines lists no URL");
    }
    return st;
}

/* Discovery of one engine: kvo-mocker tells its sources and ranks; any
 * other engine is taken as cfg->dp_size ranks with unknown sources. */
static kvo_status discover(chk_env *env, chk_engine *e, kvo_err *err) {
    kvo_err e2 = {0};
    kvo_status st = chk_engine_sources(e, &e2);
    for (uint32_t k = 0; k < CHK_MAX_DP; k++) {
        e->ranks[k].relay = -1;
        e->ranks[k].last_seq = -1;
        e->ranks[k].slot = UINT32_MAX;
    }
    if (st == KVO_OK) {
        e->mocker = true;
        if (e->n_ranks == 0) e->decode = true; /* publishes nothing */
        return chk_engine_state(e, err);
    }
    /* Only an engine without the endpoint (404) is a real engine; a
     * kvo-mocker that answers it badly, or not at all, is an error. */
    if (env->cfg->spawn || st != KVO_ENOTFOUND)
        return kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "%s", e2.msg);
    /* a real engine */
    e->mocker = false;
    e->n_ranks = env->cfg->dp_size;
    for (uint32_t k = 0; k < e->n_ranks; k++) e->ranks[k].dp_rank = k;
    return KVO_OK;
}

/* --indexer-api dynamo: every publishing rank of a kvo-mocker engine is
 * registered with the indexer (the ZMQ and replay endpoints it advertises);
 * a real engine's, whose endpoints kvo-check does not know, are the user's
 * to register. Exact mode when the indexer also answers kvo's GET
 * /watermark extension (kvo-indexer does); else settle. */
static kvo_status dynamo_register(chk_env *env, bool all_mockers,
                                  kvo_err *err) {
    for (uint32_t i = 0; i < env->n_workers; i++) {
        chk_engine *e = &env->engines[i];
        if (!e->mocker) {
            kvo_info("engine %u (%s) does not tell its ZMQ endpoints: register "
                     "it with the indexer as instance %u yourself",
                     i, e->url, e->worker_id);
            continue;
        }
        for (uint32_t k = 0; k < e->n_ranks; k++) {
            kvo_status st =
                chk_index_dynamo_register(env, e, &e->ranks[k], true, err);
            if (st != KVO_OK) return st;
            env->registered = true;
        }
    }
    chk_watermark wm = {0};
    kvo_err e2 = {0};
    kvo_status st = chk_index_watermark(env, &wm, &e2);
    chk_watermark_fini(&wm);
    env->dynamo_watermark = st == KVO_OK;
    env->exact = all_mockers && st == KVO_OK;
    if (st != KVO_OK)
        kvo_info("%s: no exact watermark, so settle mode (a quiet period of "
                 "%ld ms before each query)",
                 e2.msg, env->cfg->settle_ms);
    return KVO_OK;
}

/* --indexer-api dynamo: the ranks registered at the start, unregistered
 * (a failure is logged: the run is over). */
static void dynamo_unregister(chk_env *env) {
    for (uint32_t i = 0; env->registered && i < env->n_workers; i++) {
        chk_engine *e = &env->engines[i];
        kvo_err e2 = {0};
        if (e->mocker &&
            chk_index_dynamo_register(env, e, NULL, false, &e2) != KVO_OK)
            kvo_warn("unregistering engine %u: %s", i, e2.msg);
    }
    env->registered = false;
}

kvo_status chk_env_start(chk_env *env, const check_cfg *cfg,
                         const check_trace *trace, kvo_err *err) {
    memset(env, 0, sizeof(*env));
    for (uint32_t i = 0; i < CHECK_NATS_MAX; i++)
        chk_args_init(&env->nats_args[i]);
    chk_args_init(&env->idx_args);
    env->cfg = cfg;
    env->trace = trace;
    env->block_size = cfg->block_size;
    if (cfg->bin_dir)
        snprintf(env->bin_dir, sizeof(env->bin_dir), "%s", cfg->bin_dir);
    uint64_t rnd = kvo_unix_ns() ^ ((uint64_t)getpid() << 40);
    env->publisher_base = (rnd & PUBLISHER_BASE_MASK) << PUBLISHER_RUN_BITS;
    kvo_status st;
    if (cfg->log_dir) {
        snprintf(env->log_dir, sizeof(env->log_dir), "%s", cfg->log_dir);
        if (mkdir(env->log_dir, 0755) != 0 && errno != EEXIST) {
            return kvo_err_set(err, KVO_EIO, KVO_ERR_NO_OFFSET,
                               "cannot create log dir %s: %s", env->log_dir,
                               strerror(errno));
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(env->log_dir, sizeof(env->log_dir), "%s/kvo-check-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(env->log_dir)) {
            return kvo_err_set(err, KVO_EIO, KVO_ERR_NO_OFFSET,
                               "cannot create a log dir: %s", strerror(errno));
        }
        env->own_log_dir = true;
    }

    /* engines: spawned or attached */
    uint64_t requests = trace && trace->n ? trace->n
                        : cfg->limit      ? cfg->limit
                                          : REQUESTS_UNKNOWN;
    if (cfg->spawn) {
        env->n_engines = cfg->workers + cfg->decode_workers;
        env->engines = kvo_calloc(env->n_engines, sizeof(chk_engine));
        if (!env->engines) return KVO_ENOMEM;
        for (uint32_t i = 0; i < env->n_engines; i++)
            chk_args_init(&env->engines[i].args);
    } else {
        if ((st = attach_engines(env, err)) != KVO_OK) goto fail;
    }
    /* NATS and the indexer before any engine publishes */
    bool dynamo = cfg->indexer_api == CHECK_API_DYNAMO;
    bool need_relays =
        !dynamo && (cfg->spawn || !cfg->indexer || !cfg->no_relays);
    if (cfg->spawn || !cfg->indexer || need_relays)
        if ((st = start_nats(env, err)) != KVO_OK) goto fail;
    if ((st = start_indexer(env, err)) != KVO_OK) goto fail;

    if (cfg->spawn) {
        for (uint32_t i = 0; i < env->n_engines; i++) {
            chk_engine *e = &env->engines[i];
            e->worker_id = i;
            const char *role = cfg->decode_workers == 0 ? NULL
                               : i < cfg->workers       ? "prefill"
                                                        : "decode";
            if ((st = client_new(&e->http, cfg->timeout_ms)) != KVO_OK ||
                (st = client_new(&e->probe_http, cfg->timeout_ms)) != KVO_OK)
                goto fail;
            st = start_mocker(env, e, i, role, requests, err);
            if (st != KVO_OK) goto fail;
        }
    }
    for (uint32_t i = 0; i < env->n_engines; i++)
        if ((st = discover(env, &env->engines[i], err)) != KVO_OK) goto fail;
    if (cfg->spawn && cfg->decode_workers)
        for (uint32_t i = cfg->workers; i < env->n_engines; i++)
            env->engines[i].decode = true;

    /* publishing engines first: they are the workers the index knows */
    for (uint32_t i = 0; i < env->n_engines; i++) {
        chk_engine *e = &env->engines[i];
        if (e->decode) {
            env->n_decode++;
            continue;
        }
        if (i != env->n_workers) {
            st = kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                             "engine %u publishes events but comes after "
                             "one that does not: list publishing engines "
                             "first",
                             i);
            goto fail;
        }
        if (env->n_workers == 0) env->dp_size = e->n_ranks;
        if (e->n_ranks != env->dp_size) {
            st = kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                             "engine %u has %u ranks, engine 0 has %u: "
                             "every engine needs the same dp size",
                             i, e->n_ranks, env->dp_size);
            goto fail;
        }
        e->worker_id = env->n_workers++;
        for (uint32_t k = 0; k < e->n_ranks; k++)
            e->ranks[k].slot =
                e->worker_id * env->dp_size + e->ranks[k].dp_rank;
    }
    if (env->n_workers == 0) {
        st = kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                         "no engine publishes KV events");
        goto fail;
    }
    for (uint32_t i = 0; i < env->n_workers; i++)
        for (uint32_t k = 0; k < env->engines[i].n_ranks; k++)
            if (env->engines[i].ranks[k].dp_rank >= env->dp_size) {
                st =
                    kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                                "engine %u lists rank %u with dp size %u", i,
                                env->engines[i].ranks[k].dp_rank, env->dp_size);
                goto fail;
            }

    /* relays, one per publishing rank */
    bool spawn_relays = !cfg->no_relays && !dynamo;
    bool all_mockers = true;
    for (uint32_t i = 0; i < env->n_workers; i++) {
        chk_engine *e = &env->engines[i];
        all_mockers &= e->mocker;
        if (!spawn_relays || !e->mocker) continue;
        for (uint32_t k = 0; k < e->n_ranks; k++)
            if ((st = start_relay(env, i, k, err)) != KVO_OK) goto fail;
    }
    env->exact = all_mockers && spawn_relays;

    /* model name (dynamo: also the index's partition) */
    if (cfg->model)
        snprintf(env->model, sizeof(env->model), "%s", cfg->model);
    else if (env->engines[0].mocker)
        snprintf(env->model, sizeof(env->model), "kvo-mock");
    if (!cfg->model) {
        kvo_err e2 = {0};
        if (chk_engine_model(&env->engines[0], env->model, sizeof(env->model),
                             &e2) != KVO_OK &&
            !env->engines[0].mocker) {
            st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "%s", e2.msg);
            goto fail;
        }
    }
    snprintf(env->model_name, sizeof(env->model_name), "%s",
             cfg->model_name ? cfg->model_name : env->model);
    if (dynamo && (st = dynamo_register(env, all_mockers, err)) != KVO_OK)
        goto fail;
    return KVO_OK;
fail:
    chk_env_dump_logs(env, SETUP_LOG_LINES);
    chk_env_stop(env, true);
    return st;
}

/* utime + stime of a live child, in seconds (-1 when unreadable). */
static double proc_cpu(const kvo_proc *p) {
    if (!p->pid || p->exited) return -1;
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)p->pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')'); /* the name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (!rp || sscanf(rp + 2,
                      "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                      "%lu %lu",
                      &ut, &st) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(ut + st) / (double)hz : -1;
}

/* Process i of the ones we may have started, in start order: nats-server,
 * kvo-indexer, the engines, the relays (*retired: killed and replaced);
 * NULL past the last. One not started has pid 0 and has not exited. */
static kvo_proc *env_proc(chk_env *env, size_t i, bool *retired) {
    *retired = false;
    if (i < env->n_nats) return &env->nats[i];
    i -= env->n_nats;
    if (i == 0) return &env->indexer;
    i -= 1;
    if (i < env->n_engines) return &env->engines[i].proc;
    i -= env->n_engines;
    if (i >= env->n_relays) return NULL;
    *retired = env->relays[i].retired;
    return &env->relays[i].proc;
}

kvo_status chk_env_cpu(chk_env *env, check_counters *c) {
    kvo_status st = KVO_OK;
    bool retired;
    kvo_proc *p;
    for (size_t i = 0; st == KVO_OK && (p = env_proc(env, i, &retired)); i++) {
        double s = proc_cpu(p);
        if (s >= 0) st = check_counters_set(c, "cpu", p->name, s);
    }
    struct rusage ru;
    if (st == KVO_OK && getrusage(RUSAGE_SELF, &ru) == 0)
        st = check_counters_set(
            c, "cpu", "kvo-check",
            (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    return st;
}

void chk_env_dump_logs(chk_env *env, int lines) {
    bool retired;
    kvo_proc *p;
    for (size_t i = 0; (p = env_proc(env, i, &retired)) != NULL; i++)
        if (p->pid || p->exited) kvo_proc_dump_log(p, lines);
}

bool chk_env_dead(chk_env *env, char *why, size_t whysz) {
    bool retired;
    kvo_proc *p;
    for (size_t i = 0; (p = env_proc(env, i, &retired)) != NULL; i++)
        if (!retired && p->pid && !kvo_proc_alive(p)) {
            snprintf(why, whysz, "%s exited (status %d); log: %s", p->name,
                     p->exit_status, p->log_path);
            return true;
        }
    return false;
}

/* Stop p. Exit 1 is a verdict of the tool itself (kvo-relay exits 1 when
 * --verify-engine-hash found mismatches); anything else but 0 -- a signal,
 * a hang killed after the grace, LeakSanitizer's 23 -- is worth a line. */
static void stop_one(kvo_proc *p, bool *unclean) {
    if (!p->pid) return;
    bool was_running = kvo_proc_alive(p);
    kvo_proc_stop(p, STOP_GRACE_MS);
    if (p->exit_status != 0 && p->exit_status != 1) {
        kvo_warn("%s %s with status %d%s; log: %s", p->name,
                 was_running ? "stopped" : "had exited", p->exit_status,
                 p->exit_status == 128 + SIGKILL ? " (killed after the grace)"
                                                 : "",
                 p->log_path);
        *unclean = true;
    }
}

void chk_env_stop(chk_env *env, bool keep_logs) {
    /* relays first (they flush their exit JSON), then engines, indexer,
     * NATS: the reverse of the start. */
    bool unclean = false;
    if (env->idx_http) dynamo_unregister(env);
    for (uint32_t i = env->n_relays; i-- > 0;) {
        if (!env->relays[i].retired) stop_one(&env->relays[i].proc, &unclean);
        kvo_http_client_free(env->relays[i].http);
    }
    proxy_free(env->proxy);
    env->proxy = NULL;
    for (uint32_t i = env->n_engines; i-- > 0;) {
        stop_one(&env->engines[i].proc, &unclean);
        chk_args_fini(&env->engines[i].args);
        kvo_http_client_free(env->engines[i].http);
        kvo_http_client_free(env->engines[i].probe_http);
    }
    stop_one(&env->indexer, &unclean);
    kvo_http_client_free(env->idx_http);
    kvo_http_client_free(env->idx_metrics);
    for (uint32_t i = env->n_nats; i-- > 0;) {
        kvo_proc_stop(&env->nats[i], STOP_GRACE_MS); /* exits 1 on SIGTERM */
        chk_args_fini(&env->nats_args[i]);
    }
    chk_args_fini(&env->idx_args);
    if (unclean) keep_logs = true;
    kvo_free(env->relays);
    kvo_free(env->engines);
    env->relays = NULL;
    env->engines = NULL;
    env->n_relays = env->n_engines = 0;
    env->idx_http = env->idx_metrics = NULL;
    if (!env->log_dir[0]) return;
    if (keep_logs) {
        fprintf(stderr, "kvo-check: logs of every process are in %s\n",
                env->log_dir);
    } else if (env->own_log_dir) {
        /* flat: one log file per process */
        DIR *d = opendir(env->log_dir);
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') continue;
            char path[1024];
            snprintf(path, sizeof(path), "%s/%s", env->log_dir, de->d_name);
            unlink(path);
        }
        if (d) closedir(d);
        if (rmdir(env->log_dir) != 0)
            kvo_warn("could not remove %s: %s", env->log_dir, strerror(errno));
    }
    env->log_dir[0] = '\0';
}
