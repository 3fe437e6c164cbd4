/* relay_run.c -- the kvo-relay service: sources (from --zmq or --discover),
 * the NATS publisher, the metrics HTTP server, the capture file and the
 * pipeline, driven by one zmq_poll loop:
 *
 *   wait for NATS (serving HTTP) -> listen for requests (recovery,
 *   discover) -> relay_pipe_start -> announce
 *   loop: zmq_poll(SUBs, DEALERs, their monitors, the requests' eventfd,
 *         HTTP fd; timeout = nearest deadline)
 *         read every socket until none has anything -> relay_pipe_flush
 *         the sockets' monitor events -> relay_pipe_link
 *         relay_pipe_tick (replay timeouts), requests (at most
 *         REQUESTS_PER_TURN: relay_pipe_recover, or the announce for a
 *         discover), the heartbeat announce, HTTP, periodic stats line
 *   exit: flush, stats JSON (stdout or --stats-json), close everything.
 *
 * Requests are answered on this thread, between two envelopes, so a dump
 * is exactly the state as of its as_of (docs/recovery.md).
 */
#include "kvo_http.h"
#include "relay_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <zmq.h>

/* Defaults of relay_cfg (relay_main.c's --help says the same numbers):
 * messages a ZMQ socket queues before it drops; the largest ZMQ message
 * accepted (one batch); how long closing a socket may wait to send; the
 * bytes nats.c buffers while NATS is down; vLLM's block size; the time
 * between periodic stats lines. */
#define DEFAULT_ZMQ_HWM 100000
#define DEFAULT_ZMQ_MAX_MSG_BYTES (64ll << 20)
#define DEFAULT_LINGER_MS 100
#define DEFAULT_NATS_BUFFER_BYTES (64 << 20)
#define DEFAULT_BLOCK_SIZE 16
#define DEFAULT_STATS_INTERVAL_MS 10000
#define DEFAULT_RECOVERY_BUFFER_MB 64
#define DEFAULT_HEARTBEAT_MS 1000

/* The loop's longest zmq_poll (how late kvo_stop is seen); how often NATS
 * is checked at start-up while HTTP is served; the wait between GETs of the
 * engine's sources, and the timeout of one. */
#define LOOP_POLL_MS 100
#define NATS_WAIT_POLL_MS 50
#define DISCOVERY_RETRY_MS 250
#define DISCOVERY_TIMEOUT_MS 2000
/* drain_sockets' bounds: messages read from one socket in a pass (a flooding
 * source cannot starve the others), and passes before HTTP, the replay
 * timeouts and the stats line get their turn. */
#define DRAIN_PER_SOCKET 256
#define DRAIN_ROUNDS 64
/* Monitor events taken from one source per loop turn (a flapping
 * connection cannot starve the rest of the loop). */
#define LINK_EVENTS_PER_TURN 64
/* Requests answered per loop turn (a dump walks the whole state: a storm
 * of them must leave the sockets their turn). */
#define REQUESTS_PER_TURN 8
/* Longest subject (namespace.<ns>.component.<c>.kv-events) and discovery
 * URL; longer ones are refused at start. */
#define SUBJECT_MAX 512
#define DISCOVERY_URL_MAX 1024

/* Log rate limits, one per note kind. */
static const char *const note_kinds[] = {
    "decode",    "reject",   "cleared",  "gap",    "replay",   "restart",
    "frames",    "buffer",   "publish",  "hash",   "link",     "reopen",
    "handshake", "oversize", "recovery", "answer", "announce", "other"};
#define N_KINDS (sizeof(note_kinds) / sizeof(note_kinds[0]))

typedef struct src_desc {
    char *endpoint;
    char *replay; /* NULL = none */
    uint32_t rank;
} src_desc;

typedef struct runner {
    const relay_cfg *cfg;
    void *zctx;
    src_desc desc[RELAY_MAX_SOURCES];
    relay_source *src[RELAY_MAX_SOURCES];
    uint32_t nsrc;
    relay_nats *nats;
    relay_pipe *pipe;
    kvo_http_server *http;
    wire_cap_writer *cap;
    bool cap_zmq, cap_nats;
    uint64_t cap_errors;
    kvo_ratelimit rl[N_KINDS];
    uint64_t publisher_id;
    char subject[SUBJECT_MAX];
    char relays_subject[SUBJECT_MAX];
    char listen[RELAY_REQ_COUNT][SUBJECT_MAX]; /* by relay_req_kind */
    uint64_t started_at_ms;
    uint64_t announces, discovers; /* announces_sent, discover_requests */
    kvo_buf announce;
    relay_rx rx;
} runner;

void relay_cfg_default(relay_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->topic = "";
    c->zmq_hwm = DEFAULT_ZMQ_HWM;
    c->zmq_max_msg_bytes = DEFAULT_ZMQ_MAX_MSG_BYTES;
    c->linger_ms = DEFAULT_LINGER_MS;
    kvo_nats_cfg_default(&c->nats);
    c->nats.buffer_bytes = DEFAULT_NATS_BUFFER_BYTES;
    c->ns = "dynamo";
    c->component = "backend";
    c->block_size = DEFAULT_BLOCK_SIZE;
    c->replay_timeout_ms = RELAY_PIPE_REPLAY_TIMEOUT_MS;
    c->buffer_max_batches = RELAY_PIPE_BUFFER_BATCHES;
    c->verify_algo = WIRE_ALGO_SHA256;
    c->hash_seed = "0";
    c->stats_interval_ms = DEFAULT_STATS_INTERVAL_MS;
    c->recovery_buffer = RELAY_PIPE_RING_ENVELOPES;
    c->recovery_buffer_mb = DEFAULT_RECOVERY_BUFFER_MB;
    c->heartbeat_ms = DEFAULT_HEARTBEAT_MS;
}

/* ---- callbacks from the pipe ---------------------------------------------*/

static kvo_status on_publish(void *ctx, const char *subject, bool has_range,
                             uint64_t first, uint64_t last, const uint8_t *body,
                             size_t len) {
    runner *r = ctx;
    if (r->cap && r->cap_nats) {
        wire_frame f[2] = {{(const uint8_t *)subject, strlen(subject)},
                           {body, len}};
        if (wire_cap_write(r->cap, kvo_unix_ns(), f, 2) != KVO_OK)
            r->cap_errors++;
    }
    return relay_nats_publish(r->nats, subject, has_range, first, last, body,
                              len);
}

static kvo_status on_replay_request(void *ctx, uint32_t src, uint64_t from) {
    runner *r = ctx;
    return relay_source_replay_request(r->src[src], from);
}

static void on_replay_abort(void *ctx, uint32_t src) {
    runner *r = ctx;
    relay_source_replay_abort(r->src[src]);
}

/* The rate limit of a note kind ("other" for one not listed). */
static kvo_ratelimit *limit_of(runner *r, const char *kind) {
    size_t k = N_KINDS - 1;
    for (size_t i = 0; i < N_KINDS; i++)
        if (strcmp(kind, note_kinds[i]) == 0) k = i;
    return &r->rl[k];
}

static void on_note(void *ctx, kvo_level lvl, const char *kind,
                    const char *msg) {
    runner *r = ctx;
    if (lvl <= KVO_LOG_WARN)
        kvo_log_limited(limit_of(r, kind), lvl, "%s", msg);
    else
        kvo_log(lvl, "%s", msg);
}

/* ---- stats ---------------------------------------------------------------*/

static relay_stats *stats_now(runner *r) {
    relay_stats *st = relay_pipe_stats(r->pipe);
    relay_nats_stats(r->nats, st);
    st->announces_sent = r->announces;
    st->discover_requests = r->discovers;
    return st;
}

static json_object *stats_json(runner *r) {
    relay_stats *st = stats_now(r);
    json_object *o = relay_stats_to_json(st);
    json_object_object_add(o, "version", json_object_new_string(KVO_VERSION));
    json_object_object_add(o, "publisher_id",
                           json_object_new_uint64(r->publisher_id));
    json_object_object_add(o, "worker_id",
                           json_object_new_uint64(r->cfg->worker_id));
    json_object_object_add(o, "subject", json_object_new_string(r->subject));
    json_object_object_add(
        o, "recovery_subject",
        json_object_new_string(r->listen[RELAY_REQ_RECOVERY]));
    json_object_object_add(o, "started_at",
                           json_object_new_uint64(r->started_at_ms));
    json_object_object_add(o, "capture_errors",
                           json_object_new_uint64(r->cap_errors));
    json_object *arr = json_object_new_array();
    for (uint32_t i = 0; i < r->nsrc; i++) {
        relay_src_info info;
        relay_pipe_source_info(r->pipe, i, &info);
        json_object *s = json_object_new_object();
        json_object_object_add(s, "endpoint",
                               json_object_new_string(r->desc[i].endpoint));
        json_object_object_add(s, "replay_endpoint",
                               r->desc[i].replay
                                   ? json_object_new_string(r->desc[i].replay)
                                   : NULL);
        json_object_object_add(s, "dp_rank",
                               json_object_new_uint64(info.dp_rank));
        json_object_object_add(
            s, "state",
            json_object_new_string(info.state == RELAY_SRC_LIVE ? "live"
                                                                : "replaying"));
        json_object_object_add(s, "last_seq",
                               info.has_next && info.next_seq > 0
                                   ? json_object_new_uint64(info.next_seq - 1)
                                   : NULL);
        json_object_object_add(s, "buffered",
                               json_object_new_uint64(info.buffered));
        json_object_object_add(s, "connected",
                               json_object_new_boolean(info.connected));
        relay_src_stats_to_json(&st->src[i], s);
        json_object_array_add(arr, s);
    }
    json_object_object_add(o, "sources", arr);
    return o;
}

static void on_http(void *ctx, kvo_http_req *req) {
    runner *r = ctx;
    const char *path = kvo_http_req_path(req);
    if (strcmp(kvo_http_req_method(req), "GET") != 0) {
        kvo_http_respond_error(req, 405, "only GET");
    } else if (strcmp(path, "/metrics") == 0) {
        kvo_buf b;
        kvo_buf_init(&b);
        if (!r->pipe || relay_stats_to_prom(stats_now(r), &b) != KVO_OK)
            kvo_http_respond_error(req, 500, "out of memory");
        else
            kvo_http_respond(req, 200, "text/plain; version=0.0.4", b.data,
                             b.len);
        kvo_buf_fini(&b);
    } else if (strcmp(path, "/health") == 0) {
        bool up = r->pipe && relay_nats_connected(r->nats);
        json_object *o = json_object_new_object();
        json_object_object_add(o, "status",
                               json_object_new_string(up ? "ok" : "starting"));
        json_object_object_add(o, "nats_connected",
                               json_object_new_boolean(up));
        kvo_http_respond_json(req, 200, o);
    } else if (strcmp(path, "/stats") == 0) {
        if (!r->pipe)
            kvo_http_respond_error(req, 503, "starting");
        else
            kvo_http_respond_json(req, 200, stats_json(r));
    } else {
        kvo_http_respond_error(req, 404, "not found");
    }
}

/* ---- discovery -----------------------------------------------------------*/

/* An engine that binds everywhere lists a wildcard host (*, 0.0.0.0, [::]):
 * connect to the host we discovered it through instead. */
static char *endpoint_for(const char *ep, const char *base_url) {
    const char *hs = strstr(ep, "://");
    if (!hs) return kvo_strdup(ep);
    hs += 3;
    const char *colon = strrchr(hs, ':');
    if (!colon) return kvo_strdup(ep);
    size_t hl = (size_t)(colon - hs);
    bool wildcard = (hl == 1 && hs[0] == '*') ||
                    (hl == 7 && memcmp(hs, "0.0.0.0", 7) == 0) ||
                    (hl == 4 && memcmp(hs, "[::]", 4) == 0);
    if (!wildcard) return kvo_strdup(ep);
    const char *bh = strstr(base_url, "://");
    bh = bh ? bh + 3 : base_url;
    size_t bl = strcspn(bh, ":/");
    kvo_buf b;
    kvo_buf_init(&b);
    if (kvo_buf_printf(&b, "%.*s%.*s%s", (int)(hs - ep), ep, (int)bl, bh,
                       colon) != KVO_OK ||
        kvo_buf_cstr(&b) != KVO_OK) {
        kvo_buf_fini(&b);
        return NULL;
    }
    return (char *)b.data;
}

/* Forget every source description (the slot past the last may hold half
 * of one). */
static void desc_clear(runner *r) {
    for (uint32_t i = 0; i < RELAY_MAX_SOURCES; i++) {
        kvo_free(r->desc[i].endpoint);
        kvo_free(r->desc[i].replay);
        memset(&r->desc[i], 0, sizeof(r->desc[i]));
    }
    r->nsrc = 0;
}

/* The sources an engine lists; on failure none (a retry starts afresh). */
static kvo_status parse_sources(runner *r, const char *body, const char *base) {
    json_object *j = json_tokener_parse(body);
    kvo_status st = KVO_EPROTO;
    if (!j || !json_object_is_type(j, json_type_array)) goto done;
    size_t n = json_object_array_length(j);
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(j, i), *v;
        if (!json_object_is_type(e, json_type_object)) continue;
        if (json_object_object_get_ex(e, "transport", &v) &&
            strcmp(json_object_get_string(v), "zmq") != 0)
            continue;
        if (!json_object_object_get_ex(e, "endpoint", &v) ||
            !json_object_is_type(v, json_type_string))
            continue;
        if (r->nsrc == RELAY_MAX_SOURCES) {
            st = KVO_ETOOBIG; /* refused whole: never a silent subset */
            goto done;
        }
        src_desc *d = &r->desc[r->nsrc];
        memset(d, 0, sizeof(*d));
        d->endpoint = endpoint_for(json_object_get_string(v), base);
        if (json_object_object_get_ex(e, "replay_endpoint", &v) &&
            json_object_is_type(v, json_type_string))
            d->replay = endpoint_for(json_object_get_string(v), base);
        d->rank = r->cfg->dp_rank;
        if (json_object_object_get_ex(e, "data_parallel_rank", &v) &&
            json_object_is_type(v, json_type_int) &&
            json_object_get_int64(v) >= 0)
            d->rank = (uint32_t)json_object_get_int64(v);
        if (!d->endpoint) {
            st = KVO_ENOMEM;
            goto done;
        }
        r->nsrc++;
    }
    st = r->nsrc ? KVO_OK : KVO_ENOTFOUND;
done:
    if (st != KVO_OK) desc_clear(r);
    json_object_put(j);
    return st;
}

static void serve_http(runner *r, long wait_ms) {
    if (!r->http) {
        zmq_poll(NULL, 0, wait_ms);
        return;
    }
    zmq_pollitem_t it = {NULL, kvo_http_server_fd(r->http), ZMQ_POLLIN, 0};
    long t = kvo_http_server_timeout_ms(r->http);
    if (t < 0 || t > wait_ms) t = wait_ms;
    zmq_poll(&it, 1, t);
    kvo_http_server_run(r->http);
}

static kvo_status discover(runner *r) {
    const char *base = r->cfg->discover;
    char url[DISCOVERY_URL_MAX];
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/') bl--;
    int ul =
        snprintf(url, sizeof(url), "%.*s/kvo/event_sources", (int)bl, base);
    if (ul < 0 || (size_t)ul >= sizeof(url)) {
        kvo_error("--discover URL longer than %d bytes", DISCOVERY_URL_MAX);
        return KVO_EINVAL;
    }
    kvo_http_client *c = NULL;
    kvo_status st = kvo_http_client_new(&c, DISCOVERY_TIMEOUT_MS);
    if (st != KVO_OK) return st;
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    bool said = false;
    st = KVO_ETIMEDOUT;
    while (!kvo_stop) {
        kvo_status g = kvo_http_get(c, url, &resp);
        if (g == KVO_OK && resp.status == 200) {
            st = parse_sources(r, resp.body.data ? (char *)resp.body.data : "",
                               base);
            if (st == KVO_OK) break;
            if (st == KVO_ETOOBIG) {
                kvo_error("discovery: %s lists more than %d ZMQ sources", url,
                          RELAY_MAX_SOURCES);
                break;
            }
            kvo_warn("discovery: %s lists no usable ZMQ source (%s)", url,
                     kvo_strerror(st));
        } else if (!said) {
            kvo_info("discovery: waiting for %s (%s)", url,
                     g == KVO_OK ? "not 200" : kvo_http_client_error(c));
            said = true;
        }
        serve_http(r, DISCOVERY_RETRY_MS);
    }
    kvo_http_resp_fini(&resp);
    kvo_http_client_free(c);
    return kvo_stop ? KVO_ETIMEDOUT : st;
}

/* ---- the loop ------------------------------------------------------------*/

static void record_rx(runner *r, const relay_rx *rx, bool reply) {
    if (!r->cap || !r->cap_zmq) return;
    const wire_frame *f = rx->frames;
    uint32_t n = rx->n < WIRE_CAP_MAX_FRAMES ? rx->n : WIRE_CAP_MAX_FRAMES;
    wire_frame three[3];
    if (reply) {
        /* Replies as the 3 frames a SUB would have seen; end markers are
         * protocol, not batches. */
        if (n == 4 && f[0].len == 0) {
            memcpy(three, f + 1, sizeof(three));
        } else if (n == 3 && f[0].len == 0) {
            three[0] = (wire_frame){(const uint8_t *)"", 0};
            three[1] = f[1];
            three[2] = f[2];
        } else {
            return;
        }
        if (three[2].len == 0) return;
        f = three;
        n = 3;
    }
    if (wire_cap_write(r->cap, kvo_unix_ns(), f, n) != KVO_OK) r->cap_errors++;
}

/* Hand every reply the DEALER of source i holds to the pipe (at most
 * DRAIN_PER_SOCKET); true when there was one. */
static bool drain_replies(runner *r, uint32_t i) {
    bool any = false;
    for (int k = 0; k < DRAIN_PER_SOCKET; k++) {
        if (relay_source_recv_dealer(r->src[i], &r->rx) != KVO_OK) break;
        record_rx(r, &r->rx, true);
        relay_pipe_replay(r->pipe, i, r->rx.frames, r->rx.n, kvo_now_ns());
        any = true;
    }
    return any;
}

/* Read what is waiting on every socket, replies first (they fill the hole
 * the live batches wait on). Returns true when every socket ran dry; false
 * when it stopped after a bounded amount of work so HTTP and the stats line
 * are served under a flood too. */
static bool drain_sockets(runner *r) {
    for (int round = 0; round < DRAIN_ROUNDS && !kvo_stop; round++) {
        bool more = false;
        for (uint32_t i = 0; i < r->nsrc; i++) {
            more |= drain_replies(r, i);
            for (int k = 0; k < DRAIN_PER_SOCKET; k++) {
                kvo_status s = relay_source_recv_sub(r->src[i], &r->rx);
                if (s != KVO_OK) break;
                record_rx(r, &r->rx, false);
                relay_pipe_live(r->pipe, i, r->rx.frames, r->rx.n,
                                kvo_now_ns());
                more = true;
            }
        }
        if (!more) return true;
    }
    return false;
}

/* What the sockets' monitors said, to the pipe. Runs after drain_sockets:
 * a dropped connection's last batches are read before its loss is told. */
static void watch_links(runner *r) {
    for (uint32_t i = 0; i < r->nsrc; i++) {
        for (int k = 0; k < LINK_EVENTS_PER_TURN; k++) {
            relay_link what;
            kvo_err err;
            kvo_status st =
                relay_source_event(r->src[i], kvo_now_ns(), &what, &err);
            if (st == KVO_EAGAIN) break;
            if (st != KVO_OK) {
                char buf[600];
                kvo_log_limited(limit_of(r, "reopen"), KVO_LOG_ERROR,
                                "source %u: %s; trying again", i,
                                kvo_err_str(&err, buf, sizeof(buf)));
                break;
            }
            /* libzmq may say "disconnected" just before it hands over the
             * last replies it read: take them first. */
            if (what == RELAY_LINK_REPLAY_DOWN) drain_replies(r, i);
            relay_pipe_link(r->pipe, i, what, kvo_now_ns());
        }
    }
}

/* ---- recovery: requests and announces (docs/recovery.md) -----------------*/

/* Publish the announce on subject (the relays subject, or a discover
 * request's inbox). */
static void announce(runner *r, const char *subject) {
    uint32_t ranks[RELAY_PIPE_MAX_RANKS];
    uint64_t wide[RELAY_PIPE_MAX_RANKS];
    size_t n = relay_pipe_ranks(r->pipe, ranks, KVO_ARRAY_LEN(ranks));
    for (size_t i = 0; i < n; i++) wide[i] = ranks[i];
    wire_announce a = {
        .publisher_id = r->publisher_id,
        .worker_id = r->cfg->worker_id,
        .n_ranks = (uint32_t)n,
        .ranks = wide,
        .recovery_subject = r->listen[RELAY_REQ_RECOVERY],
        .started_at_ms = r->started_at_ms,
        .heartbeat_ms = r->cfg->heartbeat_ms,
    };
    a.has_last = relay_pipe_last_sequence(r->pipe, &a.last_sequence);
    kvo_buf_reset(&r->announce);
    kvo_status st = wire_announce_encode(&a, &r->announce);
    if (st == KVO_OK)
        st = relay_nats_publish(r->nats, subject, false, 0, 0, r->announce.data,
                                r->announce.len);
    if (st != KVO_OK) {
        kvo_log_limited(limit_of(r, "announce"), KVO_LOG_WARN,
                        "announce on %s not sent (%zu dp ranks): %s", subject,
                        n, kvo_strerror(st));
        return;
    }
    r->announces++;
}

typedef struct reply_to {
    relay_nats *nats;
    const char *inbox;
} reply_to;

static kvo_status on_reply(void *ctx, wire_reply_kind kind, bool has_range,
                           uint64_t first, uint64_t last, const uint8_t *body,
                           size_t len) {
    reply_to *t = ctx;
    return relay_nats_reply(t->nats, t->inbox, kind, has_range, first, last,
                            body, len);
}

static void answer_recovery(runner *r, const relay_req *q) {
    reply_to to = {r->nats, q->reply};
    relay_recovery out;
    kvo_err err;
    kvo_status st = relay_pipe_recover(r->pipe, q->reply, q->body, q->len,
                                       relay_nats_max_payload(r->nats),
                                       on_reply, &to, &out, &err);
    char buf[600];
    if (st != KVO_OK) {
        kvo_log_limited(limit_of(r, "recovery"), KVO_LOG_WARN,
                        "recovery request%s%s %s: %s", q->reply ? " from " : "",
                        q->reply ? q->reply : "",
                        out.bad ? "not understood" : "not answered",
                        kvo_err_str(&err, buf, sizeof(buf)));
        return;
    }
    char as_of[24] = "null";
    if (out.has_as_of) snprintf(as_of, sizeof(as_of), "%" PRIu64, out.as_of);
    /* Dumps are rare and heavy, worth a line (rate-limited: a storm of
     * them is one line per interval); the rest at debug. */
    if (out.kind == WIRE_REPLY_DUMP || kvo_log_level() >= KVO_LOG_DEBUG)
        kvo_log_limited(
            limit_of(r, "answer"),
            out.kind == WIRE_REPLY_DUMP ? KVO_LOG_INFO : KVO_LOG_DEBUG,
            "recovery request from %s: %s, %" PRIu64 " envelopes, %" PRIu64
            " blocks (%" PRIu64 " orphans), as of %s",
            q->reply, wire_reply_kind_name(out.kind), out.sent, out.blocks,
            out.orphans, as_of);
}

/* Answer what is waiting (at most REQUESTS_PER_TURN). */
static void serve_requests(runner *r) {
    relay_req q;
    for (int k = 0; k < REQUESTS_PER_TURN && relay_nats_req_next(r->nats, &q);
         k++) {
        if (q.kind == RELAY_REQ_RECOVERY) {
            answer_recovery(r, &q);
        } else if (q.reply && *q.reply) {
            r->discovers++;
            announce(r, q.reply);
        } else {
            relay_pipe_stats(r->pipe)->recovery_bad_requests++;
            kvo_log_limited(limit_of(r, "recovery"), KVO_LOG_WARN,
                            "discover request without a reply inbox");
        }
        relay_nats_req_done(&q);
    }
}

static void loop(runner *r) {
    zmq_pollitem_t items[4 * RELAY_MAX_SOURCES + 2];
    uint64_t interval = r->cfg->stats_interval_ms * RELAY_NS_PER_MS;
    uint64_t next_stats = interval ? kvo_now_ns() + interval : 0;
    uint64_t beat = (uint64_t)r->cfg->heartbeat_ms * RELAY_NS_PER_MS;
    uint64_t next_beat = kvo_now_ns() + beat;
    while (!kvo_stop) {
        int n = 0;
        for (uint32_t i = 0; i < r->nsrc; i++) {
            items[n++] =
                (zmq_pollitem_t){relay_source_sub(r->src[i]), 0, ZMQ_POLLIN, 0};
            items[n++] = (zmq_pollitem_t){relay_source_sub_monitor(r->src[i]),
                                          0, ZMQ_POLLIN, 0};
            void *d = relay_source_dealer(r->src[i]);
            if (d) items[n++] = (zmq_pollitem_t){d, 0, ZMQ_POLLIN, 0};
            void *dm = relay_source_dealer_monitor(r->src[i]);
            if (dm) items[n++] = (zmq_pollitem_t){dm, 0, ZMQ_POLLIN, 0};
        }
        items[n++] =
            (zmq_pollitem_t){NULL, relay_nats_wake_fd(r->nats), ZMQ_POLLIN, 0};
        long t = relay_nats_req_waiting(r->nats) ? 0 : LOOP_POLL_MS;
        if (r->http) {
            items[n++] = (zmq_pollitem_t){NULL, kvo_http_server_fd(r->http),
                                          ZMQ_POLLIN, 0};
            long ht = kvo_http_server_timeout_ms(r->http);
            if (ht >= 0 && ht < t) t = ht;
        }
        uint64_t now = kvo_now_ns();
        uint64_t dl = relay_pipe_deadline(r->pipe);
        if (!dl || next_beat < dl) dl = next_beat;
        for (uint32_t i = 0; i < r->nsrc; i++) {
            uint64_t sd = relay_source_deadline(r->src[i]);
            if (sd && (!dl || sd < dl)) dl = sd;
        }
        if (dl) {
            long dt = dl > now ? (long)((dl - now) / RELAY_NS_PER_MS) + 1 : 0;
            if (dt < t) t = dt;
        }
        if (zmq_poll(items, n, t) < 0 && zmq_errno() != EINTR &&
            zmq_errno() != ETERM) {
            kvo_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        bool dry = drain_sockets(r);
        watch_links(r);
        now = kvo_now_ns();
        relay_pipe_tick(r->pipe, now);
        /* Nothing more to read right now: publish what is pending, so a
         * lockstep driver never waits on a batching timer. */
        if (dry) relay_pipe_flush(r->pipe);
        serve_requests(r);
        /* No announce while NATS is down: the reconnect buffer is for
         * envelopes (one goes out as soon as it is back, below). */
        if (now >= next_beat) {
            if (relay_nats_connected(r->nats)) announce(r, r->relays_subject);
            next_beat = now + beat;
        }
        if (r->http) kvo_http_server_run(r->http);
        relay_nats_news news = relay_nats_watch(r->nats);
        if (news.went_down)
            kvo_warn("NATS disconnected: buffering up to %d bytes while "
                     "reconnecting",
                     r->cfg->nats.buffer_bytes);
        if (news.came_back) {
            kvo_info("NATS reconnected (%" PRIu64 " reconnects, %" PRIu64
                     " envelopes dropped so far)",
                     news.reconnects,
                     relay_pipe_stats(r->pipe)->publish_dropped);
            announce(r, r->relays_subject);
            next_beat = now + beat;
        }
        if (next_stats && now >= next_stats) {
            char line[RELAY_STATS_LINE_MAX];
            relay_stats_line(stats_now(r), line, sizeof(line));
            kvo_info("stats: %s", line);
            next_stats = now + interval;
        }
    }
    relay_pipe_flush(r->pipe);
}

/* ---- setup and teardown --------------------------------------------------*/

static void log_config(const runner *r) {
    const relay_cfg *c = r->cfg;
    kvo_info("kvo-relay %s", KVO_VERSION);
    kvo_info("config: zmq=%s%s topic='%s' replay=%s discover=%s dp_rank=%u "
             "hwm=%d max_msg_bytes=%" PRId64 " linger_ms=%d",
             c->zmq ? c->zmq : "-", c->zmq_bind ? " (bind)" : "", c->topic,
             c->replay ? c->replay : "-", c->discover ? c->discover : "-",
             c->dp_rank, c->zmq_hwm, c->zmq_max_msg_bytes, c->linger_ms);
    kvo_info("config: nats=%s buffer_bytes=%d reconnect_wait_ms=%d auth=%s "
             "tls=%s subject=%s worker_id=%" PRIu64 " publisher_id=%" PRIu64
             " block_size=%u",
             c->nats.url, c->nats.buffer_bytes, c->nats.reconnect_wait_ms,
             kvo_nats_cfg_auth(&c->nats), kvo_nats_cfg_tls(&c->nats),
             r->subject, c->worker_id, r->publisher_id, c->block_size);
    char from[32] = "-";
    if (c->replay_from_set)
        snprintf(from, sizeof(from), "%" PRIu64, c->replay_from);
    kvo_info("config: replay_from=%s replay_timeout_ms=%" PRIu64
             " buffer_max_batches=%u verify=%s hash_seed=%s metrics=%s "
             "stats_interval_ms=%" PRIu64 " record=%s",
             from, c->replay_timeout_ms, c->buffer_max_batches,
             c->verify ? wire_algo_name(c->verify_algo) : "off",
             c->verify ? c->hash_seed : "-",
             c->metrics_listen ? c->metrics_listen : "off",
             c->stats_interval_ms, c->record ? c->record : "-");
    kvo_info("config: recovery_buffer=%u recovery_buffer_mb=%u "
             "heartbeat_ms=%u",
             c->recovery_buffer, c->recovery_buffer_mb, c->heartbeat_ms);
}

static kvo_status write_exit_json(runner *r) {
    json_object *o = stats_json(r);
    const char *text =
        json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
    kvo_status st = KVO_OK;
    if (r->cfg->stats_json) {
        FILE *f = fopen(r->cfg->stats_json, "w");
        if (!f || fprintf(f, "%s\n", text) < 0) st = KVO_EIO;
        if (f && fclose(f) != 0) st = KVO_EIO;
        if (st != KVO_OK) kvo_error("cannot write %s", r->cfg->stats_json);
    } else {
        printf("%s\n", text);
        fflush(stdout);
    }
    json_object_put(o);
    return st;
}

static kvo_status setup_sources(runner *r) {
    const relay_cfg *c = r->cfg;
    if (c->discover) {
        kvo_status st = discover(r);
        if (st != KVO_OK) return st;
    } else {
        r->desc[0].endpoint = kvo_strdup(c->zmq);
        r->desc[0].replay = c->replay ? kvo_strdup(c->replay) : NULL;
        r->desc[0].rank = c->dp_rank;
        if (!r->desc[0].endpoint || (c->replay && !r->desc[0].replay))
            return KVO_ENOMEM;
        r->nsrc = 1;
    }
    for (uint32_t i = 0; i < r->nsrc; i++) {
        relay_source_cfg sc = {
            .endpoint = r->desc[i].endpoint,
            .bind = c->zmq_bind && !c->discover,
            .topic = c->topic,
            .replay_endpoint = r->desc[i].replay,
            .hwm = c->zmq_hwm,
            .max_msg_bytes = c->zmq_max_msg_bytes,
            .linger_ms = c->linger_ms,
        };
        kvo_status st = relay_source_new(&r->src[i], r->zctx, &sc);
        if (st != KVO_OK) {
            kvo_error("ZMQ source %s: %s", r->desc[i].endpoint,
                      zmq_strerror(zmq_errno()));
            return st;
        }
        kvo_info("source %u: %s%s replay=%s dp_rank=%u", i, r->desc[i].endpoint,
                 sc.bind ? " (bind)" : "",
                 r->desc[i].replay ? r->desc[i].replay : "-", r->desc[i].rank);
        st = relay_pipe_source_add(r->pipe, r->desc[i].rank,
                                   r->desc[i].replay != NULL, NULL);
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

static kvo_status wait_nats(runner *r) {
    bool said = false;
    while (!kvo_stop && !relay_nats_connected(r->nats)) {
        if (!said) kvo_info("waiting for NATS at %s", r->cfg->nats.url);
        said = true;
        serve_http(r, NATS_WAIT_POLL_MS);
    }
    if (kvo_stop) return KVO_ETIMEDOUT;
    kvo_info("NATS connected");
    return KVO_OK;
}

kvo_status relay_run(const relay_cfg *cfg) {
    if ((!cfg->zmq && !cfg->discover) || (cfg->zmq && cfg->discover))
        return KVO_EINVAL;
    runner r;
    memset(&r, 0, sizeof(r));
    r.cfg = cfg;
    kvo_status st = KVO_OK;
    r.publisher_id = cfg->publisher_id;
    if (!cfg->publisher_id_set) {
        if (getrandom(&r.publisher_id, sizeof(r.publisher_id), 0) !=
            (ssize_t)sizeof(r.publisher_id))
            r.publisher_id = kvo_unix_ns() ^ ((uint64_t)getpid() << 32);
        r.publisher_id &= (uint64_t)INT64_MAX;
    }
    r.started_at_ms = kvo_unix_ns() / RELAY_NS_PER_MS;
    kvo_buf_init(&r.announce);
    kvo_status sl = KVO_OK;
    struct {
        char *out;
        wire_subject_kind kind;
    } subjects[] = {{r.subject, WIRE_SUBJ_EVENTS},
                    {r.relays_subject, WIRE_SUBJ_RELAYS},
                    {r.listen[RELAY_REQ_RECOVERY], WIRE_SUBJ_RECOVERY},
                    {r.listen[RELAY_REQ_DISCOVER], WIRE_SUBJ_DISCOVER}};
    for (size_t i = 0; i < KVO_ARRAY_LEN(subjects) && sl == KVO_OK; i++)
        sl = wire_subject(subjects[i].out, SUBJECT_MAX, cfg->ns, cfg->component,
                          subjects[i].kind, r.publisher_id);
    log_config(&r);
    if (sl != KVO_OK) {
        kvo_error(sl == KVO_ETOOBIG
                      ? "subjects for --namespace and --component longer "
                        "than %d bytes"
                      : "--namespace and --component must each be one NATS "
                        "token (no '.', '*', '>' or white space; %d bytes at "
                        "most)",
                  SUBJECT_MAX - 1);
        st = KVO_EINVAL;
        goto done;
    }

    if (cfg->metrics_listen) {
        char host[256];
        uint16_t port;
        if (kvo_parse_hostport(cfg->metrics_listen, host, sizeof(host),
                               &port) != KVO_OK) {
            kvo_error("bad --metrics-listen '%s'", cfg->metrics_listen);
            st = KVO_EINVAL;
            goto done;
        }
        kvo_http_server_cfg hc = {
            .host = host, .port = port, .handler = on_http, .ctx = &r};
        st = kvo_http_server_new(&r.http, &hc);
        if (st != KVO_OK) {
            kvo_error("metrics server on %s: %s", cfg->metrics_listen,
                      kvo_strerror(st));
            goto done;
        }
        kvo_info("metrics on http://%s:%u/metrics", host,
                 kvo_http_server_port(r.http));
    }
    if (cfg->record) {
        st = wire_cap_create(&r.cap, cfg->record);
        if (st != KVO_OK) {
            kvo_error("cannot create capture %s: %s", cfg->record,
                      kvo_strerror(st));
            goto done;
        }
        r.cap_zmq = cfg->record_what != RELAY_RECORD_NATS;
        r.cap_nats = cfg->record_what != RELAY_RECORD_ZMQ;
    }
    char err[512];
    st = relay_nats_new(&r.nats, cfg, err, sizeof(err));
    if (st != KVO_OK) {
        kvo_error("%s (servers %s)", err, cfg->nats.url);
        goto done;
    }
    relay_pipe_cfg pc = {
        .worker_id = cfg->worker_id,
        .block_size = cfg->block_size,
        .publisher_id = r.publisher_id,
        .subject = r.subject,
        .replay_from_set = cfg->replay_from_set,
        .replay_from = cfg->replay_from,
        .replay_timeout_ms = cfg->replay_timeout_ms,
        .buffer_max_batches = cfg->buffer_max_batches,
        .verify = cfg->verify,
        .verify_algo = cfg->verify_algo,
        .hash_seed = cfg->hash_seed,
        .ring_max_envelopes = cfg->recovery_buffer,
        .ring_max_bytes = (size_t)cfg->recovery_buffer_mb << 20,
    };
    relay_out out = {.ctx = &r,
                     .publish = on_publish,
                     .replay_request = on_replay_request,
                     .replay_abort = on_replay_abort,
                     .note = on_note};
    st = relay_pipe_new(&r.pipe, &pc, &out);
    if (st != KVO_OK) {
        kvo_error("pipeline: %s", kvo_strerror(st));
        goto done;
    }
    r.zctx = zmq_ctx_new();
    if (!r.zctx) {
        st = KVO_ENET;
        goto done;
    }
    st = setup_sources(&r);
    if (st != KVO_OK) {
        if (kvo_stop) st = KVO_OK; /* stopped while discovering */
        goto done;
    }
    if (wait_nats(&r) == KVO_OK) {
        const char *listen[RELAY_REQ_COUNT];
        for (int i = 0; i < RELAY_REQ_COUNT; i++) listen[i] = r.listen[i];
        st = relay_nats_listen(r.nats, listen, err, sizeof(err));
        if (st != KVO_OK) {
            kvo_error("%s", err);
            goto done;
        }
        kvo_info("answering recovery requests on %s, discover requests on "
                 "%s; announcing on %s every %u ms",
                 r.listen[RELAY_REQ_RECOVERY], r.listen[RELAY_REQ_DISCOVER],
                 r.relays_subject, cfg->heartbeat_ms);
        relay_pipe_start(r.pipe, kvo_now_ns());
        announce(&r, r.relays_subject);
        loop(&r);
    }
    char line[RELAY_STATS_LINE_MAX];
    relay_stats_line(stats_now(&r), line, sizeof(line));
    kvo_info("final: %s", line);
    if (write_exit_json(&r) != KVO_OK) st = KVO_EIO;
    if (st == KVO_OK && cfg->verify &&
        relay_pipe_stats(r.pipe)->hash_mismatches)
        st = KVO_ECHECK;
done:
    for (uint32_t i = 0; i < RELAY_MAX_SOURCES; i++)
        relay_source_free(r.src[i]);
    desc_clear(&r);
    if (r.zctx) zmq_ctx_term(r.zctx);
    relay_nats_free(r.nats);
    relay_pipe_free(r.pipe);
    wire_cap_close(r.cap);
    kvo_http_server_free(r.http);
    kvo_buf_fini(&r.announce);
    return st;
}
