/* idx_dynamo.c -- kvo-indexer as a drop-in for Dynamo's standalone KV
 * indexer (lib/kv-router/src/services/indexer/server.rs in ai-dynamo/dynamo):
 * its routes, JSON shapes, status codes and integer signedness, on a
 * listener of its own (--dynamo-http).
 *
 *   POST /register ---> worker (instance_id) ---> listener per dp_rank
 *                         |  in one partition       relay_pipe + relay_source
 *                         v                         (ZMQ SUB, replay DEALER)
 *   partition (model_name, routing_group): block_size, an idx_feed (tree)
 *                         ^                             |
 *                         +-- envelopes (publish) ------+
 *   POST /query, /query_by_hash: the partition's tree -> scores in tokens
 *
 * Each listener is the relay's own pipeline (relay_int.h: decode,
 * validation, sequences and replay, dedup, batching), one source per pipe,
 * publishing into its partition's feed instead of NATS, under a publisher
 * id of its own; so a deployment needs no relay process. The pipe starts
 * with a replay from sequence 0 when a replay endpoint was given (what the
 * engine published before the SUB joined is not lost).
 *
 * Invariants:
 *   D1 a worker belongs to exactly one partition and has >= 1 listener;
 *   D2 a partition exists while some worker belongs to it (Dynamo drops an
 *      empty one: its queries are 404 again);
 *   D3 listeners in all <= max_listeners (a register beyond is 503);
 *   D4 a listener's pipe exists for its whole life; its source only when
 *      the sockets could be made (else its status is "failed").
 *
 * Status codes (axum's, as Dynamo's server gets them): a body that is not
 * JSON 400; JSON of the wrong shape (missing field, wrong type, integer out
 * of range, repeated key) 422; no application/json Content-Type 415; a
 * body over 8 MiB on /query, 2 MiB elsewhere, 413. Bodies are read by the
 * strict kvo_json reader; every error answer is JSON {"error": "..."}.
 * Unknown members are ignored, as serde does.
 */
#include "idx_int.h"
#include "kvo_prom.h"
#include "relay_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zmq.h>

#define QUERY_BODY_MAX (8u << 20) /* Dynamo's /query limit */
#define BODY_MAX (2u << 20)       /* axum's default for the other routes */
#define NAME_MAX_BYTES 4096       /* model, group, endpoint strings */
#define DEFAULT_GROUP "default"
#define DUMP_MAX_EVENTS 100000 /* per partition in GET /dump */
#define DRAIN_PER_SOCKET 256   /* messages read per socket per round */
#define DRAIN_ROUNDS 16
#define LINK_EVENTS_PER_TURN 64
#define ITEMS_PER_LISTENER 4 /* SUB, its monitor, DEALER, its monitor */
/* A listener's pipe: live batches held during a replay, bounded smaller
 * than a relay's (there are up to max_listeners pipes in one process). */
#define PIPE_BUFFER_BATCHES 16384u
#define PIPE_BUFFER_BYTES (16u << 20)
#define ZMQ_HWM 100000
#define ZMQ_MAX_MSG_BYTES (64ll << 20)
#define ZMQ_LINGER_MS 0
#define SUBJECT "kvo-indexer.dynamo" /* the pipes' envelopes go nowhere */
#define NS_PER_MS 1000000u

typedef enum lstatus { L_PENDING = 0, L_ACTIVE, L_PAUSED, L_FAILED } lstatus;
static const char *const lstatus_names[] = {"pending", "active", "paused",
                                            "failed"};

struct part;
struct idx_dyn;

typedef struct listener {
    struct idx_dyn *d;
    struct part *part;
    uint64_t instance_id;
    uint32_t dp_rank;
    uint64_t publisher_id; /* its pipe's envelopes, in the partition's feed */
    char *endpoint, *replay;
    lstatus status;
    char *last_error;
    relay_pipe *pipe;
    relay_source *src; /* NULL when failed */
} listener;

typedef struct worker {
    uint64_t instance_id;
    struct part *part;
    listener **ls; /* sorted by dp_rank */
    size_t n, cap;
} worker;

typedef struct part {
    char *model, *group;
    uint32_t block_size;
    idx_feed *feed;
} part;

/* The routes, and the per-route counters of /metrics. The last three are
 * kvo's extensions (Dynamo has no such routes): the watermark that lets a
 * client wait exactly, and kvo-indexer's read-only views (GET /blocks,
 * POST /lookup, the same as on its own listener) for full-state
 * checkpoints and diagnosis. */
#define ROUTES(X)                                                              \
    X(REGISTER, "/register", true)                                             \
    X(UNREGISTER, "/unregister", true)                                         \
    X(WORKERS, "/workers", false)                                              \
    X(QUERY, "/query", true)                                                   \
    X(QUERY_BY_HASH, "/query_by_hash", true)                                   \
    X(DUMP, "/dump", false)                                                    \
    X(HEALTH, "/health", false)                                                \
    X(METRICS, "/metrics", false)                                              \
    X(WATERMARK, "/watermark", false)                                          \
    X(BLOCKS, "/blocks", false)                                                \
    X(LOOKUP, "/lookup", true)
typedef enum route {
#define X(id, path, post) R_##id,
    ROUTES(X)
#undef X
        R_UNKNOWN,
    R_COUNT
} route;
static const char *const route_paths[] = {
#define X(id, path, post) path,
    ROUTES(X)
#undef X
        "unknown"};
static const bool route_post[] = {
#define X(id, path, post) post,
    ROUTES(X)
#undef X
        false};

struct idx_dyn {
    idx_dyn_cfg cfg;
    kvo_http_server *http;
    void *zctx;
    part **parts;
    size_t nparts, cap_parts;
    worker **workers; /* sorted by instance_id */
    size_t nworkers, cap_workers;
    size_t nlisteners;
    uint64_t next_publisher;
    relay_rx rx;
    idx_scores scores;
    kvo_json doc;
    idx_tree *empty;     /* GET /blocks, POST /lookup of an unknown worker */
    idx_blockset blocks; /* GET /blocks's cache */
    uint64_t bad_views;  /* their 400s */
    relay_stats gone;    /* counters of listeners already freed */
    uint64_t requests[R_COUNT][2]; /* [route][GET 0 | POST 1] */
    uint64_t errors[R_COUNT][2];   /* [route][4xx 0 | 5xx 1] */
    size_t next_worker;            /* where idx_dyn_run starts reading */
    uint64_t apply_pauses;         /* runs that stopped reading for HTTP */
    kvo_ratelimit rl_note, rl_link;
};

/* An answer that is not 2xx. */
typedef struct dyn_err {
    unsigned code;
    char msg[600];
} dyn_err;

static bool fail(dyn_err *e, unsigned code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool fail(dyn_err *e, unsigned code, const char *fmt, ...) {
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return false;
}

/* ======================================================================== */
/* Listeners: a relay pipe and its sockets                                   */
/* ======================================================================== */

static void relay_stats_add(relay_stats *to, const relay_stats *s) {
#define ADD(name, help) to->name += s->name;
    RELAY_COUNTERS(ADD)
#undef ADD
    for (int i = 0; i < RELAY_BAD_MSG_COUNT; i++)
        to->bad_msgs[i] += s->bad_msgs[i];
    for (int i = 0; i < KVO_STATUS_COUNT; i++)
        to->decode_errors[i] += s->decode_errors[i];
    for (int i = 0; i < RELAY_REJECT_COUNT; i++)
        to->rejects[i] += s->rejects[i];
    for (int i = 0; i < RELAY_REPLAY_FAIL_COUNT; i++)
        to->replay_failures[i] += s->replay_failures[i];
}

/* The pipe's envelope, into the partition's feed (as idx_service does
 * with one from NATS, with its KVO-Zmq-Seq header). */
static kvo_status on_publish(void *ctx, const char *subject, bool has_range,
                             uint64_t first, uint64_t last, const uint8_t *body,
                             size_t len) {
    (void)subject;
    listener *l = ctx;
    char hdr[48];
    if (has_range)
        snprintf(hdr, sizeof(hdr), "%" PRIu64 "-%" PRIu64, first, last);
    kvo_err err;
    memset(&err, 0, sizeof(err));
    idx_feed_result res;
    kvo_status st = idx_feed_message(l->part->feed, body, len,
                                     has_range ? hdr : NULL, &res, &err);
    if (st == KVO_EEXIST) st = KVO_OK; /* cannot happen: one publisher each */
    return st;
}

static kvo_status on_replay_request(void *ctx, uint32_t src, uint64_t from) {
    (void)src;
    listener *l = ctx;
    return l->src ? relay_source_replay_request(l->src, from) : KVO_ENET;
}

static void on_replay_abort(void *ctx, uint32_t src) {
    (void)src;
    listener *l = ctx;
    if (l->src) relay_source_replay_abort(l->src);
}

static void on_note(void *ctx, kvo_level lvl, const char *kind,
                    const char *msg) {
    listener *l = ctx;
    kvo_log_limited(&l->d->rl_note, lvl,
                    "dynamo listener %" PRIu64 "/%u (%s): %s", l->instance_id,
                    l->dp_rank, kind, msg);
}

static void listener_free(listener *l) {
    if (!l) return;
    if (l->pipe) {
        relay_pipe_flush(l->pipe);
        relay_stats_add(&l->d->gone, relay_pipe_stats(l->pipe));
    }
    relay_source_free(l->src);
    relay_pipe_free(l->pipe);
    kvo_free(l->endpoint);
    kvo_free(l->replay);
    kvo_free(l->last_error);
    kvo_free(l);
}

/* A listener for (instance_id, dp_rank) of p: the pipe, then the sockets
 * (a failure there leaves it "failed", with why in last_error). */
static kvo_status listener_new(idx_dyn *d, part *p, uint64_t instance_id,
                               uint32_t dp_rank, const char *endpoint,
                               const char *replay, listener **out) {
    listener *l = kvo_calloc(1, sizeof(*l));
    if (!l) return KVO_ENOMEM;
    l->d = d;
    l->part = p;
    l->instance_id = instance_id;
    l->dp_rank = dp_rank;
    l->endpoint = kvo_strdup(endpoint);
    l->replay = replay ? kvo_strdup(replay) : NULL;
    kvo_status st = KVO_ENOMEM;
    if (!l->endpoint || (replay && !l->replay)) goto done;
    relay_pipe_cfg pc = {
        .worker_id = instance_id,
        .block_size = p->block_size,
        .publisher_id = l->publisher_id = ++d->next_publisher,
        .subject = SUBJECT,
        .replay_from_set = replay != NULL,
        .replay_from = 0,
        .buffer_max_batches = PIPE_BUFFER_BATCHES,
        .buffer_max_bytes = PIPE_BUFFER_BYTES,
        .ring_max_envelopes = 1, /* nobody asks a listener to recover */
        .ring_max_bytes = 1,
    };
    relay_out o = {.ctx = l,
                   .publish = on_publish,
                   .replay_request = on_replay_request,
                   .replay_abort = on_replay_abort,
                   .note = on_note};
    if ((st = relay_pipe_new(&l->pipe, &pc, &o)) != KVO_OK ||
        (st = relay_pipe_source_add(l->pipe, dp_rank, replay != NULL, NULL)) !=
            KVO_OK)
        goto done;
    if (!d->zctx && !(d->zctx = zmq_ctx_new())) {
        st = KVO_ENET;
        goto done;
    }
    relay_source_cfg sc = {.endpoint = endpoint,
                           .topic = "",
                           .replay_endpoint = replay,
                           .hwm = ZMQ_HWM,
                           .max_msg_bytes = ZMQ_MAX_MSG_BYTES,
                           .linger_ms = ZMQ_LINGER_MS};
    if (relay_source_new(&l->src, d->zctx, &sc) != KVO_OK) {
        char why[256];
        snprintf(why, sizeof(why), "cannot connect to %s%s%s: %s", endpoint,
                 replay ? " / " : "", replay ? replay : "",
                 zmq_strerror(zmq_errno()));
        l->src = NULL;
        l->status = L_FAILED;
        l->last_error = kvo_strdup(why);
        kvo_warn("dynamo listener %" PRIu64 "/%u: %s", instance_id, dp_rank,
                 why);
    } else {
        relay_pipe_start(l->pipe, kvo_now_ns());
    }
    *out = l;
    return KVO_OK;
done:
    listener_free(l);
    return st;
}

/* Should reading stop for HTTP? As soon as a request waits, or once the
 * apply budget has passed since HTTP was last served: a message read is
 * applied at once (a full batch of the pipe publishes into the feed), so a
 * backlog of thousands of them would otherwise hold a router's query for
 * tens of milliseconds. */
static bool http_due(idx_dyn *d) {
    return kvo_http_server_due(d->http, d->cfg.apply_budget_us);
}

/* What the listener's sockets hold, to its pipe, until HTTP is due (one
 * message at least, so that a client polling in a loop cannot stop the
 * apply); true when both were found empty (dry), false when some had
 * something or reading stopped for HTTP. */
static bool listener_drain(idx_dyn *d, listener *l) {
    bool got = false;
    for (int k = 0; k < DRAIN_PER_SOCKET; k++) {
        if (relay_source_recv_dealer(l->src, &d->rx) != KVO_OK) break;
        relay_pipe_replay(l->pipe, 0, d->rx.frames, d->rx.n, kvo_now_ns());
        got = true;
        if (http_due(d)) return false;
    }
    for (int k = 0; k < DRAIN_PER_SOCKET; k++) {
        if (relay_source_recv_sub(l->src, &d->rx) != KVO_OK) break;
        relay_pipe_live(l->pipe, 0, d->rx.frames, d->rx.n, kvo_now_ns());
        got = true;
        if (http_due(d)) return false;
    }
    return !got;
}

/* What the sockets' monitors said: to the pipe, and to the status. */
static void listener_links(idx_dyn *d, listener *l) {
    for (int k = 0; k < LINK_EVENTS_PER_TURN; k++) {
        relay_link what;
        kvo_err err;
        kvo_status st = relay_source_event(l->src, kvo_now_ns(), &what, &err);
        if (st == KVO_EAGAIN) break;
        if (st != KVO_OK) {
            char buf[600];
            kvo_log_limited(&d->rl_link, KVO_LOG_WARN,
                            "dynamo listener %" PRIu64 "/%u: %s",
                            l->instance_id, l->dp_rank,
                            kvo_err_str(&err, buf, sizeof(buf)));
            break;
        }
        if (what == RELAY_LINK_SUB_UP) l->status = L_ACTIVE;
        if (what == RELAY_LINK_REPLAY_DOWN) listener_drain(d, l);
        relay_pipe_link(l->pipe, 0, what, kvo_now_ns());
    }
}

/* ======================================================================== */
/* The registry                                                              */
/* ======================================================================== */

static part *part_find(const idx_dyn *d, const char *model, const char *group) {
    for (size_t i = 0; i < d->nparts; i++)
        if (strcmp(d->parts[i]->model, model) == 0 &&
            strcmp(d->parts[i]->group, group) == 0)
            return d->parts[i];
    return NULL;
}

static void part_free(part *p) {
    if (!p) return;
    idx_feed_free(p->feed);
    kvo_free(p->model);
    kvo_free(p->group);
    kvo_free(p);
}

static kvo_status part_new(idx_dyn *d, const char *model, const char *group,
                           uint32_t block_size, part **out) {
    kvo_status st =
        kvo_grow(&d->parts, &d->cap_parts, d->nparts + 1, sizeof(*d->parts), 8);
    if (st != KVO_OK) return st;
    part *p = kvo_calloc(1, sizeof(*p));
    if (!p) return KVO_ENOMEM;
    p->model = kvo_strdup(model);
    p->group = kvo_strdup(group);
    p->block_size = block_size;
    if (!p->model || !p->group ||
        (st = idx_feed_new(&p->feed, &d->cfg.feed)) != KVO_OK) {
        part_free(p);
        return st == KVO_OK ? KVO_ENOMEM : st;
    }
    idx_feed_set_clock(p->feed, kvo_now_ns() / NS_PER_MS);
    d->parts[d->nparts++] = p;
    kvo_info("dynamo: new partition model=%s routing_group=%s block_size=%u",
             model, group, block_size);
    *out = p;
    return KVO_OK;
}

/* D2: drop p when no worker is in it. */
static void part_drop_if_empty(idx_dyn *d, part *p) {
    for (size_t i = 0; i < d->nworkers; i++)
        if (d->workers[i]->part == p) return;
    for (size_t i = 0; i < d->nparts; i++)
        if (d->parts[i] == p) {
            d->parts[i] = d->parts[--d->nparts];
            break;
        }
    kvo_info("dynamo: partition model=%s routing_group=%s is empty: dropped",
             p->model, p->group);
    d->blocks.loaded = false; /* it may hold blocks of p's tree */
    part_free(p);
}

static size_t worker_pos(const idx_dyn *d, uint64_t id) {
    size_t lo = 0, hi = d->nworkers;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (d->workers[mid]->instance_id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static worker *worker_find(const idx_dyn *d, uint64_t id) {
    size_t i = worker_pos(d, id);
    return i < d->nworkers && d->workers[i]->instance_id == id ? d->workers[i]
                                                               : NULL;
}

static listener *worker_listener(const worker *w, uint32_t rank, size_t *pos) {
    size_t i = 0;
    while (i < w->n && w->ls[i]->dp_rank < rank) i++;
    if (pos) *pos = i;
    return i < w->n && w->ls[i]->dp_rank == rank ? w->ls[i] : NULL;
}

/* Stop and forget listener i of w (its blocks stay: the caller removes
 * them). */
static void worker_drop_listener(idx_dyn *d, worker *w, size_t i) {
    listener_free(w->ls[i]);
    memmove(&w->ls[i], &w->ls[i + 1], (w->n - i - 1) * sizeof(*w->ls));
    w->n--;
    d->nlisteners--;
}

/* Stop every listener of w, remove its blocks from its partition, forget
 * it, drop the partition when empty. */
static void worker_remove(idx_dyn *d, worker *w) {
    while (w->n) worker_drop_listener(d, w, w->n - 1);
    part *p = w->part;
    idx_tree_worker_remove(idx_feed_tree(p->feed), w->instance_id);
    size_t i = worker_pos(d, w->instance_id);
    memmove(&d->workers[i], &d->workers[i + 1],
            (d->nworkers - i - 1) * sizeof(*d->workers));
    d->nworkers--;
    kvo_free(w->ls);
    kvo_free(w);
    part_drop_if_empty(d, p);
}

/* ======================================================================== */
/* Request bodies                                                            */
/* ======================================================================== */

/* Is ct application/json or application/<x>+json (axum's rule)? */
static bool json_ctype(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, ";");
    while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
    static const char app[] = "application/";
    size_t k = sizeof(app) - 1;
    if (n <= k || strncasecmp(ct, app, k) != 0) return false;
    const char *sub = ct + k;
    size_t sn = n - k;
    if (sn == 4 && strncasecmp(sub, "json", 4) == 0) return true;
    return sn > 5 && strncasecmp(sub + sn - 5, "+json", 5) == 0;
}

/* The body as a JSON object into d->doc. Not JSON: 400; an integer beyond
 * every integer type or a repeated key: 422 (serde's data errors); not an
 * object: 422. */
static bool body_parse(idx_dyn *d, kvo_http_req *r, route rt, dyn_err *e) {
    if (!json_ctype(kvo_http_req_header(r, "Content-Type")))
        return fail(e, 415,
                    "expected a request with Content-Type: application/json");
    size_t len;
    const uint8_t *body = kvo_http_req_body(r, &len);
    size_t max = rt == R_QUERY ? QUERY_BODY_MAX : BODY_MAX;
    if (len > max) return fail(e, 413, "request body over %zu bytes", max);
    kvo_err err;
    memset(&err, 0, sizeof(err));
    kvo_status st = kvo_json_parse(&d->doc, body, len, NULL, &err);
    if (st == KVO_ENOMEM) return fail(e, 500, "out of memory");
    if (st != KVO_OK) {
        bool data =
            strstr(err.msg, "out of range") || strstr(err.msg, "duplicate key");
        return fail(e, data ? 422 : 400, "failed to parse the JSON body: %s",
                    err.msg);
    }
    if (!kvo_json_is(d->doc.root, KVO_JSON_OBJ))
        return fail(e, 422, "invalid type: expected a JSON object");
    return true;
}

static bool f_u64(const kvo_jv *o, const char *key, uint64_t *out, dyn_err *e) {
    const kvo_jv *v = kvo_json_get(o, key);
    if (!v) return fail(e, 422, "missing field `%s`", key);
    if (!kvo_json_u64(v, out))
        return fail(e, 422,
                    "%s: expected an integer in 0..18446744073709551615", key);
    return true;
}

/* u32; absent or null is *has = false when opt. */
static bool f_u32(const kvo_jv *o, const char *key, bool opt, bool *has,
                  uint32_t *out, dyn_err *e) {
    const kvo_jv *v = kvo_json_get(o, key);
    if (has) *has = false;
    if (!v || (opt && v->type == KVO_JSON_NULL)) {
        if (opt) return true;
        return fail(e, 422, "missing field `%s`", key);
    }
    if (!kvo_json_u32(v, out))
        return fail(e, 422, "%s: expected an integer in 0..4294967295", key);
    if (has) *has = true;
    return true;
}

/* A string: required (def NULL, !opt), with a default (def), or optional
 * (opt: absent or null -> NULL). */
static bool f_str(const kvo_jv *o, const char *key, const char *def, bool opt,
                  const char **out, dyn_err *e) {
    const kvo_jv *v = kvo_json_get(o, key);
    if (!v || (opt && v->type == KVO_JSON_NULL)) {
        *out = def;
        if (!opt && !def) return fail(e, 422, "missing field `%s`", key);
        return true;
    }
    size_t n;
    const char *s = kvo_json_str(v, &n);
    if (!s) return fail(e, 422, "%s: expected a string", key);
    if (n > NAME_MAX_BYTES)
        return fail(e, 400, "%s: longer than %d bytes", key, NAME_MAX_BYTES);
    *out = s;
    return true;
}

/* Dynamo's rule for a ZMQ endpoint: tcp://HOST:PORT (HOST not empty,
 * bracketed when IPv6), ipc://... or inproc://... */
static bool endpoint_ok(const char *ep, const char *what, dyn_err *e) {
    const char *sep = strstr(ep, "://");
    if (!sep) return fail(e, 400, "invalid %s `%s`: no scheme", what, ep);
    const char *addr = sep + 3;
    size_t slen = (size_t)(sep - ep);
    if (!*addr) return fail(e, 400, "invalid %s `%s`: no address", what, ep);
    if ((slen == 3 && strncmp(ep, "ipc", 3) == 0) ||
        (slen == 6 && strncmp(ep, "inproc", 6) == 0))
        return true;
    if (!(slen == 3 && strncmp(ep, "tcp", 3) == 0))
        return fail(e, 400, "invalid %s `%s`: scheme `%.*s` not supported",
                    what, ep, (int)slen, ep);
    const char *colon = strrchr(addr, ':');
    if (!colon) return fail(e, 400, "invalid %s `%s`: no TCP port", what, ep);
    size_t hlen = (size_t)(colon - addr);
    if (!hlen) return fail(e, 400, "invalid %s `%s`: no TCP host", what, ep);
    if (addr[0] == '[') {
        if (addr[hlen - 1] != ']')
            return fail(e, 400, "invalid %s `%s`: no closing `]`", what, ep);
    } else if (memchr(addr, ':', hlen)) {
        return fail(e, 400, "invalid %s `%s`: no TCP port", what, ep);
    }
    const char *port = colon + 1;
    if (*port == '+') port++; /* as Rust's u16 parse */
    uint32_t v = 0;
    size_t digits = strspn(port, "0123456789");
    if (!digits || port[digits] != '\0' || digits > 5 ||
        (v = (uint32_t)strtoul(port, NULL, 10)) > UINT16_MAX)
        return fail(e, 400, "invalid %s `%s`: bad TCP port", what, ep);
    return true;
}

/* ======================================================================== */
/* Routes                                                                    */
/* ======================================================================== */

static json_object *status_ok(void) {
    json_object *o = json_object_new_object();
    if (o) json_object_object_add(o, "status", json_object_new_string("ok"));
    return o;
}

static bool do_register(idx_dyn *d, kvo_http_req *r, dyn_err *e,
                        json_object **out) {
    if (!body_parse(d, r, R_REGISTER, e)) return false;
    const kvo_jv *o = d->doc.root;
    uint64_t id;
    uint32_t block_size, rank = 0;
    bool has_rank;
    const char *ep, *model, *group, *replay, *tenant, *salt, *salt2;
    if (!f_u64(o, "instance_id", &id, e) ||
        !f_str(o, "endpoint", NULL, false, &ep, e) ||
        !f_str(o, "model_name", NULL, false, &model, e) ||
        !f_str(o, "routing_group", DEFAULT_GROUP, false, &group, e) ||
        !f_str(o, "tenant_id", DEFAULT_GROUP, false, &tenant, e) ||
        !f_u32(o, "block_size", false, NULL, &block_size, e) ||
        !f_u32(o, "dp_rank", true, &has_rank, &rank, e) ||
        !f_str(o, "replay_endpoint", NULL, true, &replay, e) ||
        !f_str(o, "additional_salt", NULL, true, &salt, e) ||
        !f_str(o, "additionalsalt", NULL, true, &salt2, e))
        return false;
    if (kvo_json_get(o, "additional_salt") && kvo_json_get(o, "additionalsalt"))
        return fail(e, 422, "duplicate field `additional_salt`");
    if (!endpoint_ok(ep, "endpoint", e) ||
        (replay && !endpoint_ok(replay, "replay endpoint", e)))
        return false;
    if (block_size == 0) return fail(e, 400, "block_size must be at least 1");
    worker *w = worker_find(d, id);
    if (w && (strcmp(w->part->model, model) || strcmp(w->part->group, group)))
        return fail(e, 409,
                    "instance %" PRIu64 " is already registered for model=%s "
                    "routing_group=%s",
                    id, w->part->model, w->part->group);
    size_t pos = 0;
    if (w && worker_listener(w, rank, &pos))
        return fail(e, 409,
                    "instance %" PRIu64 " dp_rank %u already registered", id,
                    rank);
    part *p = part_find(d, model, group);
    if (p && p->block_size != block_size)
        return fail(e, 409,
                    "block_size mismatch for model=%s routing_group=%s: "
                    "existing=%u, requested=%u",
                    model, group, p->block_size, block_size);
    if (d->nlisteners >= d->cfg.max_listeners)
        return fail(e, 503, "%zu listeners registered already (the most)",
                    d->nlisteners);
    /* room first, so nothing below fails half-way */
    bool new_part = !p;
    if (new_part && part_new(d, model, group, block_size, &p) != KVO_OK)
        return fail(e, 500, "out of memory");
    worker *nw = NULL;
    if (!w) {
        nw = kvo_calloc(1, sizeof(*nw));
        if (!nw || kvo_grow(&d->workers, &d->cap_workers, d->nworkers + 1,
                            sizeof(*d->workers), 8) != KVO_OK)
            goto oom;
        nw->instance_id = id;
        nw->part = p;
    }
    worker *t = w ? w : nw;
    listener *l = NULL;
    if (kvo_grow(&t->ls, &t->cap, t->n + 1, sizeof(*t->ls), 2) != KVO_OK ||
        listener_new(d, p, id, rank, ep, replay, &l) != KVO_OK)
        goto oom;
    memmove(&t->ls[pos + 1], &t->ls[pos], (t->n - pos) * sizeof(*t->ls));
    t->ls[pos] = l;
    t->n++;
    d->nlisteners++;
    if (nw) {
        size_t i = worker_pos(d, id);
        memmove(&d->workers[i + 1], &d->workers[i],
                (d->nworkers - i) * sizeof(*d->workers));
        d->workers[i] = nw;
        d->nworkers++;
    }
    kvo_info("dynamo: registered instance %" PRIu64 " dp_rank %u (%s%s%s) for "
             "model=%s routing_group=%s",
             id, rank, ep, replay ? ", replay " : "", replay ? replay : "",
             model, group);
    *out = status_ok();
    return true;
oom:
    if (nw) {
        kvo_free(nw->ls);
        kvo_free(nw);
    }
    if (new_part) part_drop_if_empty(d, p);
    return fail(e, 500, "out of memory");
}

static bool do_unregister(idx_dyn *d, kvo_http_req *r, dyn_err *e,
                          json_object **out) {
    if (!body_parse(d, r, R_UNREGISTER, e)) return false;
    const kvo_jv *o = d->doc.root;
    uint64_t id;
    uint32_t rank = 0;
    bool has_rank;
    const char *model, *group, *tenant;
    if (!f_u64(o, "instance_id", &id, e) ||
        !f_str(o, "model_name", NULL, false, &model, e) ||
        !f_str(o, "routing_group", NULL, true, &group, e) ||
        !f_str(o, "tenant_id", NULL, true, &tenant, e) ||
        !f_u32(o, "dp_rank", true, &has_rank, &rank, e))
        return false;
    worker *w = worker_find(d, id);
    if (!w) return fail(e, 404, "instance %" PRIu64 " not found", id);
    /* no routing_group: every group of the model (an instance is in one) */
    if (strcmp(w->part->model, model) != 0 ||
        (group && strcmp(w->part->group, group) != 0))
        return fail(e, 404,
                    "instance %" PRIu64 " is registered for model=%s "
                    "routing_group=%s",
                    id, w->part->model, w->part->group);
    if (group && has_rank) {
        size_t pos;
        if (!worker_listener(w, rank, &pos))
            return fail(e, 404, "instance %" PRIu64 " dp_rank %u not found", id,
                        rank);
        if (w->n > 1) {
            /* the others stay: drop this rank's blocks only */
            idx_tree *t = idx_feed_tree(w->part->feed);
            worker_drop_listener(d, w, pos);
            idx_tree_rank_clear(t, id, rank);
            kvo_info("dynamo: unregistered instance %" PRIu64 " dp_rank %u", id,
                     rank);
            *out = status_ok();
            return true;
        }
    }
    kvo_info("dynamo: unregistered instance %" PRIu64 " (%zu listener(s))", id,
             w->n);
    worker_remove(d, w);
    *out = status_ok();
    return true;
}

static json_object *listener_json(const listener *l) {
    json_object *o = json_object_new_object();
    if (!o) return NULL;
    json_object_object_add(o, "endpoint", json_object_new_string(l->endpoint));
    json_object_object_add(o, "status",
                           json_object_new_string(lstatus_names[l->status]));
    if (l->last_error)
        json_object_object_add(o, "last_error",
                               json_object_new_string(l->last_error));
    return o;
}

/* Dynamo's aggregate: failed > pending > active > paused. */
static lstatus worker_status(const worker *w) {
    bool pending = false, active = false;
    for (size_t i = 0; i < w->n; i++) {
        if (w->ls[i]->status == L_FAILED) return L_FAILED;
        pending |= w->ls[i]->status == L_PENDING;
        active |= w->ls[i]->status == L_ACTIVE;
    }
    return pending ? L_PENDING : active ? L_ACTIVE : L_PAUSED;
}

static bool do_workers(idx_dyn *d, kvo_http_req *r, dyn_err *e,
                       json_object **out) {
    const char *model = kvo_http_req_arg(r, "model_name");
    const char *group = kvo_http_req_arg(r, "routing_group");
    json_object *a = json_object_new_array();
    if (!a) return fail(e, 500, "out of memory");
    for (size_t i = 0; i < d->nworkers; i++) {
        const worker *w = d->workers[i];
        if ((model && strcmp(w->part->model, model) != 0) ||
            (group && strcmp(w->part->group, group) != 0) || !w->n)
            continue;
        json_object *o = json_object_new_object(),
                    *eps = json_object_new_object(),
                    *ls = json_object_new_object();
        if (!o || !eps || !ls) {
            json_object_put(o);
            json_object_put(eps);
            json_object_put(ls);
            json_object_put(a);
            return fail(e, 500, "out of memory");
        }
        json_object_object_add(o, "instance_id",
                               json_object_new_uint64(w->instance_id));
        json_object_object_add(o, "source", json_object_new_string("zmq"));
        json_object_object_add(
            o, "status",
            json_object_new_string(lstatus_names[worker_status(w)]));
        json_object_object_add(o, "model_name",
                               json_object_new_string(w->part->model));
        json_object_object_add(o, "routing_group",
                               json_object_new_string(w->part->group));
        json_object_object_add(o, "block_size",
                               json_object_new_int64(w->part->block_size));
        for (size_t k = 0; k < w->n; k++) {
            char rk[16];
            snprintf(rk, sizeof(rk), "%u", w->ls[k]->dp_rank);
            json_object_object_add(eps, rk,
                                   json_object_new_string(w->ls[k]->endpoint));
            json_object_object_add(ls, rk, listener_json(w->ls[k]));
        }
        json_object_object_add(o, "endpoints", eps);
        json_object_object_add(o, "listeners", ls);
        json_object_array_add(a, o);
    }
    *out = a;
    return true;
}

/* A query's partition names (read with the rest of the body: a shape
 * error is 422 before anything else is looked at). */
static bool query_names(const kvo_jv *o, const char **model, const char **group,
                        dyn_err *e) {
    const char *tenant;
    return f_str(o, "model_name", NULL, false, model, e) &&
           f_str(o, "routing_group", DEFAULT_GROUP, false, group, e) &&
           f_str(o, "tenant_id", DEFAULT_GROUP, false, &tenant, e);
}

/* The partition of a query: 404 when none. */
static part *query_part(idx_dyn *d, const char *model, const char *group,
                        dyn_err *e) {
    part *p = part_find(d, model, group);
    if (!p)
        fail(e, 404, "no indexer for model=%s routing_group=%s", model, group);
    return p;
}

/* {"scores": {"<worker_id>": {"<dp_rank>": tokens}}, "frequencies": [],
 * "instances": {"<worker_id>": {"longest_matched", "gpu", "dp":
 * {"<dp_rank>": tokens}, "cpu", "disk"}}}. Tokens = blocks x block_size: a
 * u32 that wraps in "scores" and saturates in "instances", as Dynamo's
 * (release) arithmetic does. cpu and disk are cumulative through the
 * tiers before them (idx_score.through: host_pinned, then disk), the
 * longest over the worker's ranks; a rank scoring 0 on the device tier is
 * left out of scores and dp, as Dynamo leaves out workers scoring 0.
 * longest_matched is the longest of them all. frequencies:
 * Dynamo fills it only when its tree tracks recent uses (an expiry), which
 * its standalone indexer does not turn on. */
/* blocks x block_size in tokens, saturated at u32. */
static uint32_t sat_tokens(uint32_t blocks, uint32_t block_size) {
    uint64_t t = (uint64_t)blocks * block_size;
    return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

static json_object *scores_json(const idx_scores *s, uint32_t block_size) {
    json_object *o = json_object_new_object(), *sc = json_object_new_object(),
                *fr = json_object_new_array(), *in = json_object_new_object();
    if (!o || !sc || !fr || !in) {
        json_object_put(o);
        json_object_put(sc);
        json_object_put(fr);
        json_object_put(in);
        return NULL;
    }
    json_object_object_add(o, "scores", sc);
    json_object_object_add(o, "frequencies", fr);
    json_object_object_add(o, "instances", in);
    for (size_t i = 0; i < s->n;) {
        uint64_t wid = s->v[i].worker_id;
        char wk[24];
        snprintf(wk, sizeof(wk), "%" PRIu64, wid);
        json_object *ranks = json_object_new_object(),
                    *inst = json_object_new_object(),
                    *dp = json_object_new_object();
        if (!ranks || !inst || !dp) {
            json_object_put(ranks);
            json_object_put(inst);
            json_object_put(dp);
            json_object_put(o);
            return NULL;
        }
        uint32_t gpu = 0, cpu = 0, disk = 0, longest = 0;
        for (; i < s->n && s->v[i].worker_id == wid; i++) {
            const idx_score *v = &s->v[i];
            uint32_t c = sat_tokens(v->through[WIRE_TIER_HOST_PINNED - 1],
                                    block_size),
                     k = sat_tokens(v->through[WIRE_TIER_DISK - 1], block_size);
            uint32_t l =
                sat_tokens(v->through[IDX_LOWER_TIERS - 1], block_size);
            if (c > cpu) cpu = c;
            if (k > disk) disk = k;
            if (l > longest) longest = l;
            if (v->blocks == 0) continue;
            char rk[16];
            snprintf(rk, sizeof(rk), "%u", v->dp_rank);
            uint64_t t = (uint64_t)v->blocks * block_size;
            uint32_t sat = sat_tokens(v->blocks, block_size);
            json_object_object_add(ranks, rk,
                                   json_object_new_int64((uint32_t)t));
            json_object_object_add(dp, rk, json_object_new_int64(sat));
            if (sat > gpu) gpu = sat;
        }
        json_object_object_add(sc, wk, ranks);
        json_object_object_add(inst, "longest_matched",
                               json_object_new_int64(longest));
        json_object_object_add(inst, "gpu", json_object_new_int64(gpu));
        json_object_object_add(inst, "dp", dp);
        json_object_object_add(inst, "cpu", json_object_new_int64(cpu));
        json_object_object_add(inst, "disk", json_object_new_int64(disk));
        json_object_object_add(in, wk, inst);
    }
    return o;
}

static bool run_query(idx_dyn *d, part *p, const uint64_t *hashes, size_t n,
                      dyn_err *e, json_object **out) {
    static const uint64_t none[1];
    if (idx_tree_query(idx_feed_tree(p->feed), n ? hashes : none, n,
                       &d->scores) != KVO_OK ||
        !(*out = scores_json(&d->scores, p->block_size)))
        return fail(e, 500, "out of memory");
    return true;
}

static bool do_query(idx_dyn *d, kvo_http_req *r, dyn_err *e,
                     json_object **out) {
    if (!body_parse(d, r, R_QUERY, e)) return false;
    const kvo_jv *o = d->doc.root, *ids = kvo_json_get(o, "token_ids");
    const char *lora, *salt;
    if (!ids) return fail(e, 422, "missing field `token_ids`");
    const uint64_t *v;
    size_t n;
    kvo_err err;
    if (!kvo_json_is(ids, KVO_JSON_ARR))
        return fail(e, 422, "token_ids: expected an array");
    if (kvo_json_u64s(ids, &v, &n, &err) != KVO_OK)
        return fail(e, 422, "token_ids%s", err.msg);
    for (size_t i = 0; i < n; i++)
        if (v[i] > UINT32_MAX)
            return fail(e, 422,
                        "token_ids[%zu]: expected an integer in "
                        "0..4294967295",
                        i);
    const char *model, *group;
    if (!f_str(o, "lora_name", NULL, true, &lora, e) ||
        !f_str(o, "cache_salt", NULL, true, &salt, e) ||
        !query_names(o, &model, &group, e))
        return false;
    part *p = query_part(d, model, group, e);
    if (!p) return false;
    size_t nb = n / p->block_size;
    uint64_t *hashes = kvo_malloc((nb ? nb : 1) * sizeof(uint64_t));
    if (!hashes) return fail(e, 500, "out of memory");
    nb = idx_prompt_hash(n ? v : hashes, n, p->block_size, lora, salt, hashes);
    bool ok = run_query(d, p, hashes, nb, e, out);
    kvo_free(hashes);
    return ok;
}

static bool do_query_by_hash(idx_dyn *d, kvo_http_req *r, dyn_err *e,
                             json_object **out) {
    if (!body_parse(d, r, R_QUERY_BY_HASH, e)) return false;
    const kvo_jv *o = d->doc.root, *hs = kvo_json_get(o, "block_hashes");
    const char *salt;
    if (!hs) return fail(e, 422, "missing field `block_hashes`");
    if (!kvo_json_is(hs, KVO_JSON_ARR))
        return fail(e, 422, "block_hashes: expected an array");
    const int64_t *v;
    size_t n;
    kvo_err err;
    if (kvo_json_i64s(hs, &v, &n, &err) != KVO_OK)
        return fail(e, 422, "block_hashes%s", err.msg);
    const char *model, *group;
    if (!f_str(o, "cache_salt", NULL, true, &salt, e) ||
        !query_names(o, &model, &group, e))
        return false;
    if (salt)
        return fail(e, 400,
                    "cache_salt is not accepted by /query_by_hash: "
                    "block_hashes must already include the salt");
    part *p = query_part(d, model, group, e);
    if (!p) return false;
    /* i64 -> LocalBlockHash: the same 64 bits */
    return run_query(d, p, (const uint64_t *)v, n, e, out);
}

typedef struct dump_ctx {
    json_object *events;
    size_t n;
} dump_ctx;

static kvo_status dump_one(void *ctx, const wire_revent *ev) {
    dump_ctx *c = ctx;
    if (c->n >= DUMP_MAX_EVENTS) return KVO_ETOOBIG;
    json_object *j = idx_json_revent(ev);
    if (!j) return KVO_ENOMEM;
    json_object_array_add(c->events, j);
    c->n++;
    return KVO_OK;
}

/* {"<model>:<group>": {"block_size", "events": [RouterEvent, ...]}}; a
 * partition over DUMP_MAX_EVENTS is {"error": "..."} instead (Dynamo's
 * shape for a partition whose dump failed). */
static bool do_dump(idx_dyn *d, dyn_err *e, json_object **out) {
    json_object *o = json_object_new_object();
    if (!o) return fail(e, 500, "out of memory");
    for (size_t i = 0; i < d->nparts; i++) {
        const part *p = d->parts[i];
        char key[2 * NAME_MAX_BYTES + 2];
        snprintf(key, sizeof(key), "%s:%s", p->model, p->group);
        dump_ctx c = {json_object_new_array(), 0};
        json_object *v = json_object_new_object();
        kvo_status st =
            c.events && v ? idx_tree_dump(idx_feed_tree(p->feed), dump_one, &c)
                          : KVO_ENOMEM;
        if (st == KVO_ENOMEM) {
            json_object_put(c.events);
            json_object_put(v);
            json_object_put(o);
            return fail(e, 500, "out of memory");
        }
        if (st == KVO_OK) {
            json_object_object_add(v, "block_size",
                                   json_object_new_int64(p->block_size));
            json_object_object_add(v, "events", c.events);
        } else {
            json_object_put(c.events);
            char msg[128];
            snprintf(msg, sizeof(msg), "more than %d events: too large to dump",
                     DUMP_MAX_EVENTS);
            json_object_object_add(v, "error", json_object_new_string(msg));
        }
        json_object_object_add(o, key, v);
    }
    *out = o;
    return true;
}

/* kvo's extension, not Dynamo's: {"instances": [{"instance_id",
 * "dp_rank", "zmq_seq_last": S | null}, ...]}, every listener by instance
 * and rank: the last ZMQ sequence of that engine rank the index has applied
 * (null: none yet). A client that knows what an engine published waits on
 * it instead of for a quiet period (kvo-check's exact mode). */
static bool do_watermark(idx_dyn *d, dyn_err *e, json_object **out) {
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    if (!o || !a) {
        json_object_put(o);
        json_object_put(a);
        return fail(e, 500, "out of memory");
    }
    json_object_object_add(o, "instances", a);
    for (size_t i = 0; i < d->nworkers; i++)
        for (size_t k = 0; k < d->workers[i]->n; k++) {
            const listener *l = d->workers[i]->ls[k];
            json_object *w = json_object_new_object();
            if (!w) {
                json_object_put(o);
                return fail(e, 500, "out of memory");
            }
            uint64_t z;
            bool has = idx_feed_zmq_last(l->part->feed, l->publisher_id, &z);
            json_object_object_add(w, "instance_id",
                                   json_object_new_uint64(l->instance_id));
            json_object_object_add(w, "dp_rank",
                                   json_object_new_int64(l->dp_rank));
            json_object_object_add(w, "zmq_seq_last",
                                   has ? json_object_new_uint64(z) : NULL);
            json_object_array_add(a, w);
        }
    *out = o;
    return true;
}

/* Every listener's pipe counters, with those of the listeners gone. */
static void pipes_stats(idx_dyn *d, relay_stats *st) {
    *st = d->gone;
    for (size_t i = 0; i < d->nworkers; i++)
        for (size_t k = 0; k < d->workers[i]->n; k++)
            relay_stats_add(st, relay_pipe_stats(d->workers[i]->ls[k]->pipe));
    st->n_src = 0;
}

/* kvo-indexer's own kvo_indexer_* index families, summed over the
 * partitions (what the trees and feeds did: parent_not_found, ...). */
static kvo_status index_prom(idx_dyn *d, kvo_buf *b) {
    idx_counters c = {0}, c1;
    idx_stats st = {0}, st1;
    idx_feed_counters f = {0}, f1;
    for (size_t i = 0; i < d->nparts; i++) {
        idx_feed *feed = d->parts[i]->feed;
        idx_tree_counters(idx_feed_tree(feed), &c1);
        idx_tree_stats(idx_feed_tree(feed), &st1);
        idx_feed_counters_get(feed, &f1);
        for (size_t t = 0; t < KVO_ARRAY_LEN(c.events); t++)
            for (int k = 0; k < IDX_EV_STATUS_COUNT; k++)
                c.events[t][k] += c1.events[t][k];
        c.blocks_stored += c1.blocks_stored;
        c.blocks_removed += c1.blocks_removed;
        c.blocks_not_found += c1.blocks_not_found;
        c.hash_mismatch += c1.hash_mismatch;
        c.orphans_lost += c1.orphans_lost;
        st.held += st1.held; /* the sizes idx_prom_index writes */
        st.nodes += st1.nodes;
        st.pairs += st1.pairs;
        st.workers += st1.workers;
        st.bytes += st1.bytes;
#define SUM(field, key, prom, type, help) f.field += f1.field;
        IDX_FEED_COUNTERS(SUM)
#undef SUM
    }
    kvo_prom p;
    kvo_prom_init(&p, b, "kvo_indexer_");
    idx_prom_index(&p, &c, &st, &f);
    kvo_prom_counter(&p, "apply_pauses_total",
                     "Times reading the listeners stopped to serve HTTP (a "
                     "request waited, or the apply outlasted "
                     "--apply-budget-us).",
                     d->apply_pauses);
    return kvo_prom_status(&p);
}

/* Dynamo's dynamo_kvindexer_* families, then kvo-indexer's index families
 * (kvo_indexer_*, summed over the partitions), then the in-process relay
 * pipelines' counters (kvo_relay_*, summed over every listener so far). */
static void do_metrics(idx_dyn *d, kvo_http_req *r) {
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_prom p;
    kvo_prom_init(&p, &b, "dynamo_kvindexer_");
    kvo_prom_family(&p, "requests_total", "counter", "Total HTTP requests");
    for (int i = 0; i < R_COUNT; i++)
        for (int m = 0; m < 2; m++)
            if (d->requests[i][m])
                kvo_prom_u64(&p, "requests_total", d->requests[i][m],
                             "endpoint=\"%s\",method=\"%s\"", route_paths[i],
                             m ? "POST" : "GET");
    kvo_prom_family(&p, "errors_total", "counter",
                    "HTTP error responses (4xx/5xx)");
    for (int i = 0; i < R_COUNT; i++)
        for (int c = 0; c < 2; c++)
            if (d->errors[i][c])
                kvo_prom_u64(&p, "errors_total", d->errors[i][c],
                             "endpoint=\"%s\",status_class=\"%s\"",
                             route_paths[i], c ? "5xx" : "4xx");
    kvo_prom_gauge(&p, "models",
                   "Number of active model+routing-group indexers", d->nparts);
    kvo_prom_gauge(&p, "workers", "Number of registered worker instances",
                   d->nworkers);
    uint64_t by[4] = {0};
    for (size_t i = 0; i < d->nworkers; i++)
        for (size_t k = 0; k < d->workers[i]->n; k++)
            by[d->workers[i]->ls[k]->status]++;
    kvo_prom_family(&p, "listeners", "gauge",
                    "Number of ZMQ listeners by status");
    for (int s = 0; s < 4; s++)
        kvo_prom_u64(&p, "listeners", by[s], "status=\"%s\"", lstatus_names[s]);
    kvo_status st = kvo_prom_status(&p);
    if (st == KVO_OK) st = index_prom(d, &b);
    if (st == KVO_OK) {
        relay_stats rs;
        pipes_stats(d, &rs);
        st = relay_stats_to_prom(&rs, &b);
    }
    if (st != KVO_OK)
        kvo_http_respond_error(r, 500, kvo_strerror(st));
    else
        kvo_http_respond(r, 200, KVO_PROM_CTYPE, b.data, b.len);
    kvo_buf_fini(&b);
}

static void count(idx_dyn *d, route rt, bool post, unsigned code) {
    d->requests[rt][post]++;
    if (code >= 400) d->errors[rt][code >= 500]++;
}

/* The tree of worker_id's partition (the empty one for a worker nobody
 * registered). */
static const idx_tree *tree_of(void *ctx, uint64_t worker_id, uint64_t *gen) {
    idx_dyn *d = ctx;
    const worker *w = worker_find(d, worker_id);
    *gen = w ? idx_feed_generation(w->part->feed) : 0;
    return w ? idx_feed_tree(w->part->feed) : d->empty;
}

static void handler(void *ctx, kvo_http_req *r) {
    idx_dyn *d = ctx;
    const char *m = kvo_http_req_method(r), *path = kvo_http_req_path(r);
    bool post = strcmp(m, "POST") == 0, get = strcmp(m, "GET") == 0;
    route rt = 0;
    while (rt < R_UNKNOWN && strcmp(path, route_paths[rt]) != 0) rt++;
    if (rt == R_UNKNOWN) {
        count(d, rt, post, 404);
        kvo_http_respond_error(r, 404, "no such endpoint");
        return;
    }
    if (route_post[rt] ? !post : !get) {
        count(d, rt, post, 405);
        kvo_http_respond_error(r, 405, route_post[rt] ? "use POST" : "use GET");
        return;
    }
    if (rt == R_METRICS) {
        count(d, rt, post, 200);
        do_metrics(d, r);
        return;
    }
    if (rt == R_BLOCKS || rt == R_LOOKUP) {
        uint64_t bad = d->bad_views;
        if (rt == R_BLOCKS)
            idx_http_blocks(r, tree_of, d, &d->blocks, &d->bad_views);
        else
            idx_http_lookup(r, tree_of, d, &d->bad_views);
        count(d, rt, post, d->bad_views == bad ? 200 : 400);
        return;
    }
    if (rt == R_HEALTH) {
        count(d, rt, post, 200);
        kvo_http_respond(r, 200, NULL, "", 0);
        return;
    }
    dyn_err e = {0, ""};
    json_object *out = NULL;
    bool ok;
    unsigned code = 200;
    switch (rt) {
    case R_REGISTER:
        ok = do_register(d, r, &e, &out);
        code = 201;
        break;
    case R_UNREGISTER: ok = do_unregister(d, r, &e, &out); break;
    case R_WORKERS: ok = do_workers(d, r, &e, &out); break;
    case R_QUERY: ok = do_query(d, r, &e, &out); break;
    case R_QUERY_BY_HASH: ok = do_query_by_hash(d, r, &e, &out); break;
    case R_WATERMARK: ok = do_watermark(d, &e, &out); break;
    default: ok = do_dump(d, &e, &out); break;
    }
    if (ok && !out) ok = fail(&e, 500, "out of memory");
    count(d, rt, post, ok ? code : e.code);
    if (ok)
        kvo_http_respond_json(r, code, out);
    else
        kvo_http_respond_error(r, e.code, e.msg);
}

/* ======================================================================== */
/* Life and loop                                                             */
/* ======================================================================== */

kvo_status idx_dyn_new(idx_dyn **out, const idx_dyn_cfg *cfg) {
    idx_dyn *d = kvo_calloc(1, sizeof(*d));
    if (!d) return KVO_ENOMEM;
    d->cfg = *cfg;
    if (!d->cfg.max_listeners) d->cfg.max_listeners = IDX_DYN_MAX_LISTENERS;
    idx_scores_init(&d->scores);
    kvo_json_init(&d->doc);
    idx_blockset_init(&d->blocks);
    kvo_http_server_cfg hc = {.host = cfg->host,
                              .port = cfg->port,
                              .max_body = QUERY_BODY_MAX,
                              .handler = handler,
                              .ctx = d};
    kvo_status st = idx_tree_new(&d->empty);
    if (st == KVO_OK) st = kvo_http_server_new(&d->http, &hc);
    if (st != KVO_OK) {
        idx_dyn_free(d);
        return st;
    }
    *out = d;
    return KVO_OK;
}

void idx_dyn_free(idx_dyn *d) {
    if (!d) return;
    kvo_http_server_free(d->http);
    while (d->nworkers) worker_remove(d, d->workers[d->nworkers - 1]);
    kvo_free(d->workers);
    for (size_t i = 0; i < d->nparts; i++) part_free(d->parts[i]);
    kvo_free(d->parts);
    if (d->zctx) zmq_ctx_term(d->zctx);
    idx_scores_fini(&d->scores);
    kvo_json_fini(&d->doc);
    idx_blockset_fini(&d->blocks);
    idx_tree_free(d->empty);
    kvo_free(d);
}

uint16_t idx_dyn_port(const idx_dyn *d) {
    return kvo_http_server_port(d->http);
}

size_t idx_dyn_max_items(const idx_dyn *d) {
    return 1 + ITEMS_PER_LISTENER * (size_t)d->cfg.max_listeners;
}

size_t idx_dyn_pollitems(idx_dyn *d, void *items, size_t max) {
    zmq_pollitem_t *it = items;
    size_t n = 0;
    if (n < max)
        it[n++] =
            (zmq_pollitem_t){NULL, kvo_http_server_fd(d->http), ZMQ_POLLIN, 0};
    for (size_t i = 0; i < d->nworkers; i++)
        for (size_t k = 0; k < d->workers[i]->n; k++) {
            relay_source *s = d->workers[i]->ls[k]->src;
            if (!s || n + ITEMS_PER_LISTENER > max) continue;
            it[n++] = (zmq_pollitem_t){relay_source_sub(s), 0, ZMQ_POLLIN, 0};
            it[n++] =
                (zmq_pollitem_t){relay_source_sub_monitor(s), 0, ZMQ_POLLIN, 0};
            void *dl = relay_source_dealer(s),
                 *dm = relay_source_dealer_monitor(s);
            if (dl) it[n++] = (zmq_pollitem_t){dl, 0, ZMQ_POLLIN, 0};
            if (dm) it[n++] = (zmq_pollitem_t){dm, 0, ZMQ_POLLIN, 0};
        }
    return n;
}

long idx_dyn_timeout_ms(const idx_dyn *d) {
    long t = kvo_http_server_timeout_ms(d->http);
    uint64_t now = kvo_now_ns(), dl = 0;
    for (size_t i = 0; i < d->nworkers; i++)
        for (size_t k = 0; k < d->workers[i]->n; k++) {
            const listener *l = d->workers[i]->ls[k];
            uint64_t a = relay_pipe_deadline(l->pipe),
                     b = l->src ? relay_source_deadline(l->src) : 0;
            if (a && (!dl || a < dl)) dl = a;
            if (b && (!dl || b < dl)) dl = b;
        }
    if (dl) {
        long ms = dl > now ? (long)((dl - now) / NS_PER_MS) + 1 : 0;
        if (t < 0 || ms < t) t = ms;
    }
    return t;
}

void idx_dyn_run(idx_dyn *d) {
    uint64_t now_ms = kvo_now_ns() / NS_PER_MS;
    for (size_t i = 0; i < d->nparts; i++) {
        idx_feed_set_clock(d->parts[i]->feed, now_ms);
        idx_feed_expire(d->parts[i]->feed);
    }
    for (size_t j = 0; j < d->nworkers; j++) {
        size_t i = (d->next_worker + j) % d->nworkers;
        bool due = false;
        for (size_t k = 0; k < d->workers[i]->n; k++) {
            listener *l = d->workers[i]->ls[k];
            if (!l->src) continue;
            bool dry = false;
            for (int round = 0; round < DRAIN_ROUNDS && !dry && !due; round++) {
                dry = listener_drain(d, l);
                due = !dry && http_due(d);
            }
            listener_links(d, l);
            relay_pipe_tick(l->pipe, kvo_now_ns());
            /* nothing more to read now: apply what is pending, so a query
             * right after sees it */
            if (dry) relay_pipe_flush(l->pipe);
        }
        if (due) { /* the rest waits in the sockets; the next run goes on */
            d->next_worker = (i + 1) % d->nworkers;
            d->apply_pauses++;
            break;
        }
    }
    kvo_http_server_run(d->http);
}
