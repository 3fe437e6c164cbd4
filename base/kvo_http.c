/* kvo_http.c -- HTTP server (libmicrohttpd, external epoll) and client
 * (libcurl) glue.
 *
 * Server: one kvo_http_req per HTTP request, owned by two sides at once:
 *
 *   MHD side  from the first access callback until MHD's request-completed
 *             callback (r->conn != NULL meanwhile);
 *   app side  from the handler call until kvo_http_respond* or
 *             kvo_http_stream_end (r->app_holds).
 *
 * The request is freed when both have let go, so an owner holding a stream
 * whose client vanished still has a valid pointer (writes are dropped).
 *
 *   access cb #1        create r; Content-Length > max_body -> 413 at once
 *   access cb #2..n     body chunks -> r->body (over max_body: discard, 413)
 *   access cb (final)   handler(ctx, r)
 *                         answered inside the handler -> queued at once
 *                         not answered -> MHD_suspend_connection (deferred)
 *   kvo_http_respond    (deferred) response parked in r, connection resumed;
 *                       MHD calls the access callback again, which queues it
 *   completed cb        MHD side lets go
 *
 * Streams: the response body is a content reader over r->out. When the
 * reader finds nothing to send and the stream is still open it suspends the
 * connection from inside the reader (allowed by the MHD docs; returning 0
 * without suspending would make MHD call it again on every run: a busy
 * loop) and stream_write/stream_end resume it. A suspended connection does
 * not notice a client that went away; the next write resumes it, the send
 * fails, MHD completes the request with an error, and stream_closed turns
 * true.
 *
 * Hostile clients. Every connection has a record (its MHD socket context)
 * in one of three phases; the run reaps, with shutdown(2), those that stay
 * too long in the first two, so half-open connections cannot pile up:
 *
 *   HEAD  connected or between keep-alive requests, headers not complete:
 *         at most head_timeout_ms
 *   BODY  headers complete, body being read: body_timeout_ms, plus the
 *         time the body received so far takes at MIN_BODY_RATE (a large
 *         body arriving steadily is never cut; one trickling is)
 *   APP   the handler has the request (deferred answers and streams wait
 *         as long as the owner likes): never reaped
 *
 * The deadlines run on the server's own clock, which advances with the
 * time between runs, but by at most RUN_GAP_MAX_MS per run: while the
 * owner's loop is busy elsewhere (parsing a large body, applying events)
 * nobody's bytes are read, and a client must not be cut for the server's
 * slowness.
 *
 * One client address holds at most max_client_conns connections (MHD's
 * per-IP limit), and the bodies of all requests not yet freed hold at most
 * max_inflight bytes: over it a request is answered 503. Protocol errors
 * libmicrohttpd answers itself (a malformed request line, headers beyond
 * CONN_MEMORY, a bad Content-Length) carry its own compiled-in bodies: MHD
 * 0.9.x has no hook to replace them. Everything this file answers is JSON.
 */
#include "kvo_http.h"

#include <curl/curl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define DEFAULT_MAX_BODY (64u << 20)
#define STREAM_MAX_PENDING (64u << 20) /* unsent stream bytes per request */
#define STREAM_BLOCK (32u << 10)       /* content reader buffer size */
#define DEFAULT_MAX_CONNS 2048u
#define DEFAULT_MAX_CLIENT_CONNS 256u
#define DEFAULT_MAX_INFLIGHT (256u << 20) /* body bytes of live requests */
#define DEFAULT_HEAD_TIMEOUT_MS 10000L
#define DEFAULT_BODY_TIMEOUT_MS 10000L
#define REAP_EVERY_MS 250L        /* how often phase deadlines are checked */
#define RUN_GAP_MAX_MS 500L       /* most a run advances the deadline clock */
#define MIN_BODY_RATE (64u << 10) /* bytes/s a body earns more time at */
#define FD_HEADROOM 64u           /* descriptors beyond connections */
#define CONN_MEMORY (128u << 10)  /* per-connection pool: headers + buffers */
/* MHD's own idle timeout, a backstop behind the phase deadlines. */
#define CONN_IDLE_TIMEOUT_S 300u
#define SHUTDOWN_DRAIN_MS 1000
#define CLIENT_MAX_BODY ((size_t)1 << 30)
#define CLIENT_CONNECT_MS 5000L
#define EXPECT_MIN_BODY (64u << 10)

/* A connection's record, MHD's socket context for it. */
typedef enum conn_phase { PHASE_HEAD, PHASE_BODY, PHASE_APP } conn_phase;
typedef struct conn_rec {
    struct conn_rec *prev, *next; /* srv->conn_recs */
    int fd;
    conn_phase phase;
    uint64_t since;      /* the deadline clock when the phase began */
    uint64_t body_bytes; /* BODY: received so far */
    bool reaped;         /* shutdown(2) done; MHD will close it */
} conn_rec;

struct kvo_http_req {
    kvo_http_server *srv;
    struct MHD_Connection *conn; /* NULL once MHD completed the request */
    kvo_http_req *prev, *next;   /* srv->reqs: every live request */
    char *method;
    char *path;
    kvo_buf body;
    bool too_big;    /* body over max_body: 413, handler not called */
    bool busy;       /* bodies in flight over max_inflight: 503 */
    size_t charged;  /* body bytes counted in srv->inflight */
    bool body_oom;   /* body could not be stored: 500 */
    bool handled;    /* the handler has been called */
    bool in_handler; /* inside the access callback: queue directly */
    bool app_holds;  /* the owner still has to answer / end the stream */
    bool answered;   /* the owner answered (response queued or parked) */
    bool queued;     /* MHD accepted a response for this request */
    bool suspended;  /* MHD_suspend_connection in effect */
    bool drain;      /* answered by server_free; wait for it to be sent */
    struct MHD_Response *parked; /* answer waiting for the access callback */
    unsigned parked_status;
    /* streaming */
    bool streaming, stream_ended, stream_closed, stream_broken;
    kvo_buf out;    /* bytes written and not yet handed to MHD */
    size_t out_off; /* first unsent byte in out */
};

struct kvo_http_server {
    struct MHD_Daemon *d;
    kvo_http_handler handler;
    void *ctx;
    size_t max_body, max_inflight, inflight;
    uint64_t head_timeout_ns, body_timeout_ns, next_reap;
    uint64_t clock_ns, last_run_ns; /* the deadline clock (see the header) */
    uint64_t peeked_ns;             /* kvo_http_server_due's last look */
    bool waiting; /* it saw a request waiting (until the next run) */
    uint16_t port;
    int fd;
    bool resumed; /* a connection was resumed since the last run */
    kvo_http_server_stats st;
    kvo_http_req *reqs;
    conn_rec *conn_recs;
    kvo_ratelimit log_rl, reap_rl, busy_rl;
};

/* ---- Request bookkeeping ------------------------------------------------- */

static kvo_http_req *req_new(kvo_http_server *s, struct MHD_Connection *conn,
                             const char *method, const char *url) {
    kvo_http_req *r = kvo_calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->method = kvo_strdup(method ? method : "");
    r->path = kvo_strdup(url ? url : "");
    if (!r->method || !r->path) {
        kvo_free(r->method);
        kvo_free(r->path);
        kvo_free(r);
        return NULL;
    }
    r->srv = s;
    r->conn = conn;
    kvo_buf_init(&r->body);
    kvo_buf_init(&r->out);
    r->next = s->reqs;
    if (s->reqs) s->reqs->prev = r;
    s->reqs = r;
    return r;
}

static void req_free(kvo_http_req *r) {
    kvo_http_server *s = r->srv;
    s->inflight -= r->charged;
    if (r->prev)
        r->prev->next = r->next;
    else
        s->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    if (r->parked) MHD_destroy_response(r->parked);
    kvo_buf_fini(&r->body);
    kvo_buf_fini(&r->out);
    kvo_free(r->method);
    kvo_free(r->path);
    kvo_free(r);
}

/* Frees r once neither MHD nor the owner can reach it any more. */
static void req_release_if_done(kvo_http_req *r) {
    if (!r->app_holds && !r->conn) req_free(r);
}

static void req_resume(kvo_http_req *r) {
    if (!r->suspended || !r->conn) return;
    r->suspended = false;
    r->srv->resumed = true;
    MHD_resume_connection(r->conn);
}

/* Hands resp (may be NULL after an allocation failure: the connection is
 * then closed) to MHD now, or parks it for the access callback when the
 * connection is suspended. */
static void req_answer(kvo_http_req *r, unsigned status,
                       struct MHD_Response *resp) {
    r->answered = true;
    if (!r->conn) { /* client gone, nothing to send to */
        if (resp) MHD_destroy_response(resp);
        return;
    }
    if (r->in_handler) {
        if (resp) {
            r->queued = MHD_queue_response(r->conn, status, resp) == MHD_YES;
            MHD_destroy_response(resp);
        }
        return;
    }
    r->parked = resp;
    r->parked_status = status;
    req_resume(r);
}

static struct MHD_Response *make_response(const char *ctype, const void *body,
                                          size_t len) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, (void *)(len ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (resp && ctype)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    return resp;
}

static struct MHD_Response *make_error(const char *msg) {
    json_object *j = json_object_new_object();
    if (!j) return NULL;
    json_object_object_add(j, "error", json_object_new_string(msg));
    const char *txt = json_object_to_json_string_ext(
        j, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    struct MHD_Response *resp =
        make_response("application/json", txt, strlen(txt));
    json_object_put(j);
    return resp;
}

/* ---- MHD callbacks ------------------------------------------------------- */

static enum MHD_Result queue_now(struct MHD_Connection *conn, unsigned status,
                                 struct MHD_Response *resp) {
    if (!resp) return MHD_NO; /* out of memory: close the connection */
    enum MHD_Result ret = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void too_big_msg(const kvo_http_server *s, char *buf, size_t n) {
    snprintf(buf, n, "request body exceeds %zu bytes", s->max_body);
}

static void busy_msg(kvo_http_server *s, char *buf, size_t n) {
    snprintf(buf, n,
             "server busy: request bodies in flight would exceed %zu "
             "bytes; retry later",
             s->max_inflight);
    s->st.busy_refused++;
    kvo_log_limited(&s->busy_rl, KVO_LOG_WARN, "http: %s", buf);
}

static conn_rec *rec_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void rec_phase(kvo_http_server *s, struct MHD_Connection *conn,
                      conn_phase phase) {
    conn_rec *c = rec_of(conn);
    if (!c) return;
    c->phase = phase;
    c->since = s->clock_ns;
    c->body_bytes = 0;
}

/* Charge n more body bytes of r against the in-flight cap. */
static bool charge_body(kvo_http_req *r, size_t n) {
    kvo_http_server *s = r->srv;
    if (n > s->max_inflight - s->inflight) return false;
    s->inflight += n;
    r->charged += n;
    return true;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn,
                                 const char *url, const char *method,
                                 const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    kvo_http_server *s = cls;
    kvo_http_req *r = *con_cls;
    char msg[96];

    if (!r) { /* headers complete, body (if any) not read yet */
        r = req_new(s, conn, method, url);
        if (!r) return MHD_NO;
        *con_cls = r;
        rec_phase(s, conn, PHASE_BODY);
        const char *cl = MHD_lookup_connection_value(
            conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        uint64_t n;
        if (cl && kvo_parse_u64(cl, &n) == KVO_OK && n > s->max_body) {
            /* Refuse before reading: MHD skips the body and closes. */
            r->too_big = r->handled = r->answered = r->queued = true;
            too_big_msg(s, msg, sizeof(msg));
            return queue_now(conn, 413, make_error(msg));
        }
        if (cl && n > s->max_inflight - s->inflight) {
            r->busy = r->handled = r->answered = r->queued = true;
            busy_msg(s, msg, sizeof(msg));
            return queue_now(conn, 503, make_error(msg));
        }
        return MHD_YES;
    }

    if (*upload_size) { /* a piece of the body */
        conn_rec *c = rec_of(conn);
        if (c) c->body_bytes += *upload_size;
        if (!r->too_big && !r->body_oom && !r->busy) {
            if (*upload_size > s->max_body - r->body.len) {
                r->too_big = true; /* keep reading, keep nothing */
            } else if (!charge_body(r, *upload_size)) {
                r->busy = true;
            } else if (kvo_buf_append(&r->body, upload, *upload_size) !=
                       KVO_OK) {
                r->body_oom = true;
            }
            if (r->too_big || r->busy || r->body_oom) {
                kvo_buf_fini(&r->body);
                s->inflight -= r->charged;
                r->charged = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }

    if (r->parked) { /* answer given while suspended: send it now */
        struct MHD_Response *resp = r->parked;
        r->parked = NULL;
        r->queued = true;
        return queue_now(conn, r->parked_status, resp);
    }
    if (r->handled) {
        /* Answered but nothing could be queued (out of memory): close. */
        if (r->answered) return r->queued ? MHD_YES : MHD_NO;
        /* Resumed without an answer: only a stream reader suspends and
         * resumes; a plain request has nothing to do but wait again. */
        r->suspended = true;
        MHD_suspend_connection(conn);
        return MHD_YES;
    }

    r->handled = true;
    rec_phase(s, conn, PHASE_APP);
    if (r->too_big) {
        too_big_msg(s, msg, sizeof(msg));
        r->answered = r->queued = true;
        return queue_now(conn, 413, make_error(msg));
    }
    if (r->busy) {
        busy_msg(s, msg, sizeof(msg));
        r->answered = r->queued = true;
        return queue_now(conn, 503, make_error(msg));
    }
    if (r->body_oom || kvo_buf_cstr(&r->body) != KVO_OK) {
        r->answered = r->queued = true;
        return queue_now(conn, 500, make_error("out of memory"));
    }
    r->app_holds = true;
    r->in_handler = true;
    s->handler(s->ctx, r);
    r->in_handler = false;
    if (!r->answered) { /* deferred: wait for kvo_http_respond */
        r->suspended = true;
        MHD_suspend_connection(conn);
    }
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    rec_phase(cls, conn, PHASE_HEAD); /* the next request's head, if any */
    kvo_http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    r->conn = NULL;
    r->suspended = false;
    if (r->streaming &&
        !(r->stream_ended && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK))
        r->stream_closed = true;
    req_release_if_done(r);
}

static void on_connection(void *cls, struct MHD_Connection *conn,
                          void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe) {
    kvo_http_server *s = cls;
    conn_rec *c = *socket_ctx;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (!c) return;
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conn_recs = c->next;
        if (c->next) c->next->prev = c->prev;
        kvo_free(c);
        *socket_ctx = NULL;
        return;
    }
    s->st.conns++;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c = ci ? kvo_calloc(1, sizeof(*c)) : NULL;
    if (!c) return; /* not tracked: MHD's idle timeout still applies */
    c->fd = ci->connect_fd;
    c->phase = PHASE_HEAD;
    c->since = s->clock_ns;
    c->next = s->conn_recs;
    if (c->next) c->next->prev = c;
    s->conn_recs = c;
    *socket_ctx = c;
}

/* Shut down connections that stayed too long reading headers or a body;
 * MHD sees the end of the stream and closes them. */
static void reap(kvo_http_server *s) {
    uint64_t now = s->clock_ns;
    if (now < s->next_reap) return;
    s->next_reap = now + REAP_EVERY_MS * 1000000ull;
    for (conn_rec *c = s->conn_recs; c; c = c->next) {
        if (c->reaped || c->phase == PHASE_APP) continue;
        uint64_t limit = c->phase == PHASE_HEAD
                             ? s->head_timeout_ns
                             : s->body_timeout_ns + c->body_bytes *
                                                        1000000000ull /
                                                        MIN_BODY_RATE;
        if (now - c->since <= limit) continue;
        c->reaped = true;
        if (c->phase == PHASE_HEAD) /* counted before the client can see */
            s->st.head_timeouts++;
        else
            s->st.body_timeouts++;
        shutdown(c->fd, SHUT_RDWR);
        kvo_log_limited(&s->reap_rl, KVO_LOG_WARN,
                        "http: closed a connection that sent no complete "
                        "%s within %llu ms",
                        c->phase == PHASE_HEAD ? "request head" : "body",
                        (unsigned long long)(limit / 1000000));
    }
}

/* Let this process hold max_conns connections (plus its other
 * descriptors): raise the soft descriptor limit toward the hard one. */
static void fd_room(unsigned max_conns) {
    struct rlimit rl;
    rlim_t want = (rlim_t)max_conns + FD_HEADROOM;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) return;
    rl.rlim_cur =
        rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral" /* MHD's own formats */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    kvo_http_server *s = cls;
    char line[256];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    kvo_log_limited(&s->log_rl, KVO_LOG_DEBUG, "libmicrohttpd: %s", line);
}
#pragma GCC diagnostic pop

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    kvo_http_req *r = cls;
    if (r->stream_broken) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t avail = r->out.len - r->out_off;
    if (avail) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, r->out.data + r->out_off, n);
        r->out_off += n;
        if (r->out_off == r->out.len) r->out.len = r->out_off = 0;
        return (ssize_t)n;
    }
    if (r->stream_ended) return MHD_CONTENT_READER_END_OF_STREAM;
    r->suspended = true; /* wait for stream_write / stream_end */
    MHD_suspend_connection(r->conn);
    return 0;
}

/* ---- Server -------------------------------------------------------------- */

kvo_status kvo_http_server_new(kvo_http_server **out,
                               const kvo_http_server_cfg *cfg) {
    if (!out || !cfg || !cfg->handler) return KVO_EINVAL;
    kvo_status st = KVO_OK;
    struct addrinfo *ai = NULL;
    kvo_http_server *s = kvo_calloc(1, sizeof(*s));
    if (!s) return KVO_ENOMEM;
    s->handler = cfg->handler;
    s->ctx = cfg->ctx;
    s->max_body = cfg->max_body ? cfg->max_body : DEFAULT_MAX_BODY;
    s->max_inflight =
        cfg->max_inflight ? cfg->max_inflight : DEFAULT_MAX_INFLIGHT;
    if (s->max_inflight < s->max_body) s->max_inflight = s->max_body;
    long head_ms = cfg->head_timeout_ms > 0 ? cfg->head_timeout_ms
                                            : DEFAULT_HEAD_TIMEOUT_MS;
    long body_ms = cfg->body_timeout_ms > 0 ? cfg->body_timeout_ms
                                            : DEFAULT_BODY_TIMEOUT_MS;
    s->head_timeout_ns = (uint64_t)head_ms * 1000000u;
    s->body_timeout_ns = (uint64_t)body_ms * 1000000u;
    unsigned max_conns = cfg->max_conns ? cfg->max_conns : DEFAULT_MAX_CONNS;
    unsigned per_client = cfg->max_client_conns ? cfg->max_client_conns
                                                : DEFAULT_MAX_CLIENT_CONNS;
    fd_room(max_conns);
    s->last_run_ns = kvo_now_ns();
    s->fd = -1;

    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    if (getaddrinfo(cfg->host ? cfg->host : "127.0.0.1", port, &hints, &ai) !=
            0 ||
        !ai) {
        st = KVO_EINVAL;
        goto done;
    }
    unsigned flags =
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(
        flags, cfg->port, NULL, NULL, on_access, s, MHD_OPTION_SOCK_ADDR,
        ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_CONNECTION_LIMIT, max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_IDLE_TIMEOUT_S,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_END);
    if (!s->d) {
        st = KVO_EHTTP; /* typically: address in use */
        goto done;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
    s->fd = info ? info->epoll_fd : -1;
    if (s->fd < 0 || s->port == 0) st = KVO_EHTTP;

done:
    if (ai) freeaddrinfo(ai);
    if (st != KVO_OK) {
        if (s->d) MHD_stop_daemon(s->d);
        kvo_free(s);
        return st;
    }
    *out = s;
    return KVO_OK;
}

static bool drain_pending(const kvo_http_server *s) {
    for (const kvo_http_req *r = s->reqs; r; r = r->next)
        if (r->drain) return true;
    return false;
}

void kvo_http_server_free(kvo_http_server *s) {
    if (!s) return;
    kvo_http_req *next;
    for (kvo_http_req *r = s->reqs; r; r = next) {
        next = r->next;
        if (!r->app_holds) continue;
        r->drain = r->conn != NULL;
        if (r->streaming)
            kvo_http_stream_end(r);
        else
            kvo_http_respond_error(r, 503, "server shutting down");
    }
    /* Give the answers a moment to reach their clients. */
    uint64_t deadline = kvo_now_ns() + SHUTDOWN_DRAIN_MS * 1000000ull;
    do {
        struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
        long t = kvo_http_server_timeout_ms(s);
        poll(&pfd, 1, t < 0 || t > 10 ? 10 : (int)t);
        kvo_http_server_run(s);
    } while (drain_pending(s) && kvo_now_ns() < deadline);
    MHD_stop_daemon(s->d); /* completes (and so frees) every request left */
    while (s->reqs) req_free(s->reqs); /* none expected; never leak */
    kvo_free(s);
}

uint16_t kvo_http_server_port(const kvo_http_server *s) { return s->port; }

int kvo_http_server_fd(const kvo_http_server *s) { return s->fd; }

uint64_t kvo_http_server_conn_count(const kvo_http_server *s) {
    return s->st.conns;
}

void kvo_http_server_stats_get(const kvo_http_server *s,
                               kvo_http_server_stats *out) {
    *out = s->st;
}

long kvo_http_server_timeout_ms(const kvo_http_server *s) {
    if (s->resumed) return 0;
    long reap_ms = -1; /* the reaper wakes while connections can expire */
    for (const conn_rec *c = s->conn_recs; c && reap_ms < 0; c = c->next)
        if (!c->reaped && c->phase != PHASE_APP) reap_ms = REAP_EVERY_MS;
    MHD_UNSIGNED_LONG_LONG t;
    if (MHD_get_timeout(s->d, &t) != MHD_YES) return reap_ms;
    long mhd = t > (MHD_UNSIGNED_LONG_LONG)LONG_MAX ? LONG_MAX : (long)t;
    return reap_ms >= 0 && reap_ms < mhd ? reap_ms : mhd;
}

void kvo_http_server_run(kvo_http_server *s) {
    uint64_t now = kvo_now_ns(), gap = now - s->last_run_ns;
    s->clock_ns +=
        gap < RUN_GAP_MAX_MS * 1000000ull ? gap : RUN_GAP_MAX_MS * 1000000ull;
    s->last_run_ns = now;
    s->resumed = s->waiting = false;
    MHD_run(s->d);
    reap(s);
}

bool kvo_http_server_due(kvo_http_server *s, uint64_t budget_us) {
    if (s->waiting || s->resumed) return true;
    uint64_t now = kvo_now_ns();
    if (now - s->last_run_ns >= budget_us * 1000u) return true;
    if (now - s->peeked_ns < KVO_HTTP_PEEK_US * 1000u) return false;
    s->peeked_ns = now;
    struct pollfd p = {.fd = s->fd, .events = POLLIN};
    s->waiting = poll(&p, 1, 0) > 0;
    return s->waiting;
}

/* ---- Request accessors --------------------------------------------------- */

const char *kvo_http_req_method(const kvo_http_req *r) { return r->method; }
const char *kvo_http_req_path(const kvo_http_req *r) { return r->path; }

const char *kvo_http_req_arg(const kvo_http_req *r, const char *name) {
    if (!r->conn) return NULL;
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *kvo_http_req_header(const kvo_http_req *r, const char *name) {
    if (!r->conn) return NULL;
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const uint8_t *kvo_http_req_body(const kvo_http_req *r, size_t *len) {
    if (len) *len = r->body.len;
    return r->body.data ? r->body.data : (const uint8_t *)"";
}

/* ---- Answers ------------------------------------------------------------- */

void kvo_http_respond(kvo_http_req *r, unsigned status, const char *ctype,
                      const void *body, size_t len) {
    if (!r->app_holds || r->answered) return; /* caller bug: ignore */
    req_answer(r, status, make_response(ctype, body, len));
    r->app_holds = false;
    req_release_if_done(r);
}

void kvo_http_respond_json(kvo_http_req *r, unsigned status, json_object *j) {
    const char *txt =
        j ? json_object_to_json_string_ext(
                j, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
          : "null";
    kvo_http_respond(r, status, "application/json", txt, strlen(txt));
    json_object_put(j);
}

void kvo_http_respond_error(kvo_http_req *r, unsigned status, const char *msg) {
    if (!r->app_holds || r->answered) return;
    req_answer(r, status, make_error(msg ? msg : ""));
    r->app_holds = false;
    req_release_if_done(r);
}

void kvo_http_stream_start(kvo_http_req *r, unsigned status,
                           const char *ctype) {
    if (!r->app_holds || r->answered) return;
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, r, NULL);
    if (resp) {
        if (ctype)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
                                "no-cache");
    } else {
        r->stream_closed = true; /* the connection will be dropped */
    }
    r->streaming = true;
    req_answer(r, status, resp);
}

void kvo_http_stream_write(kvo_http_req *r, const void *data, size_t len) {
    if (!r->streaming || r->stream_ended || r->stream_closed || !len) return;
    size_t pending = r->out.len - r->out_off;
    if (r->out_off && r->out_off >= r->out.len / 2) { /* compact */
        memmove(r->out.data, r->out.data + r->out_off, pending);
        r->out.len = pending;
        r->out_off = 0;
    }
    if (len > STREAM_MAX_PENDING - pending ||
        kvo_buf_append(&r->out, data, len) != KVO_OK) {
        /* The client does not keep up (or no memory): give up on it. */
        r->stream_broken = r->stream_closed = true;
    }
    req_resume(r);
}

void kvo_http_stream_end(kvo_http_req *r) {
    if (!r->streaming || r->stream_ended) return;
    r->stream_ended = true;
    r->app_holds = false;
    req_resume(r);
    req_release_if_done(r);
}

bool kvo_http_stream_closed(const kvo_http_req *r) { return r->stream_closed; }

/* ---- Client -------------------------------------------------------------- */

struct kvo_http_client {
    CURL *h;
    kvo_http_resp *cur; /* response being filled */
    bool overflow;
    const volatile sig_atomic_t *abort_flag; /* kvo_http_client_abort_on */
    char err[CURL_ERROR_SIZE];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;

static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_ALL);
}

void kvo_http_resp_init(kvo_http_resp *r) {
    r->status = 0;
    kvo_buf_init(&r->body);
}

void kvo_http_resp_fini(kvo_http_resp *r) {
    kvo_buf_fini(&r->body);
    r->status = 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *cls) {
    kvo_http_client *c = cls;
    size_t len = size * n;
    if (len > CLIENT_MAX_BODY - c->cur->body.len) {
        c->overflow = true;
        return 0; /* aborts the transfer */
    }
    if (kvo_buf_append(&c->cur->body, p, len) != KVO_OK) return 0;
    return len;
}

kvo_status kvo_http_client_new(kvo_http_client **out, long timeout_ms) {
    if (!out) return KVO_EINVAL;
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) return KVO_EHTTP;
    kvo_http_client *c = kvo_calloc(1, sizeof(*c));
    if (!c) return KVO_ENOMEM;
    c->h = curl_easy_init();
    if (!c->h) {
        kvo_free(c);
        return KVO_EHTTP;
    }
    long connect_ms = timeout_ms > 0 && timeout_ms < CLIENT_CONNECT_MS
                          ? timeout_ms
                          : CLIENT_CONNECT_MS;
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS,
                     timeout_ms > 0 ? timeout_ms : 0L);
    curl_easy_setopt(c->h, CURLOPT_PROXY, ""); /* loopback services: no proxy */
    curl_easy_setopt(c->h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, c->err);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
    *out = c;
    return KVO_OK;
}

void kvo_http_client_free(kvo_http_client *c) {
    if (!c) return;
    curl_easy_cleanup(c->h);
    kvo_free(c);
}

const char *kvo_http_client_error(const kvo_http_client *c) { return c->err; }

static int on_progress(void *ctx, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un) {
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    const kvo_http_client *c = ctx;
    return c->abort_flag && *c->abort_flag ? 1 : 0;
}

void kvo_http_client_abort_on(kvo_http_client *c,
                              const volatile sig_atomic_t *flag) {
    c->abort_flag = flag;
    curl_easy_setopt(c->h, CURLOPT_XFERINFOFUNCTION, flag ? on_progress : NULL);
    curl_easy_setopt(c->h, CURLOPT_XFERINFODATA, c);
    curl_easy_setopt(c->h, CURLOPT_NOPROGRESS, flag ? 0L : 1L);
}

static kvo_status perform(kvo_http_client *c, const char *url,
                          kvo_http_resp *resp) {
    kvo_buf_reset(&resp->body);
    resp->status = 0;
    c->cur = resp;
    c->overflow = false;
    c->err[0] = '\0';
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    CURLcode rc = curl_easy_perform(c->h);
    c->cur = NULL;
    if (rc == CURLE_OPERATION_TIMEDOUT) return KVO_ETIMEDOUT;
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
        snprintf(c->err, sizeof(c->err), "interrupted");
        return KVO_EAGAIN;
    }
    if (c->overflow) {
        snprintf(c->err, sizeof(c->err), "response body over %zu bytes",
                 CLIENT_MAX_BODY);
        return KVO_ETOOBIG;
    }
    if (rc != CURLE_OK) {
        if (!c->err[0])
            snprintf(c->err, sizeof(c->err), "%s", curl_easy_strerror(rc));
        return rc == CURLE_OUT_OF_MEMORY ? KVO_ENOMEM : KVO_EHTTP;
    }
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &resp->status);
    if (kvo_buf_cstr(&resp->body) != KVO_OK) return KVO_ENOMEM;
    return KVO_OK;
}

kvo_status kvo_http_get(kvo_http_client *c, const char *url,
                        kvo_http_resp *resp) {
    curl_easy_setopt(c->h, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, NULL);
    return perform(c, url, resp);
}

kvo_status kvo_http_post(kvo_http_client *c, const char *url, const char *ctype,
                         const void *body, size_t len, kvo_http_resp *resp) {
    char ct[256];
    snprintf(ct, sizeof(ct), "Content-Type: %s",
             ctype ? ctype : "application/octet-stream");
    struct curl_slist *hdrs = curl_slist_append(NULL, ct);
    /* Small bodies go with the headers (no round trip for 100 Continue);
     * large ones wait for it, so a server that refuses them (413) can say
     * so before we push megabytes into a socket it is about to close. */
    const char *expect =
        len > EXPECT_MIN_BODY ? "Expect: 100-continue" : "Expect:";
    struct curl_slist *h2 = hdrs ? curl_slist_append(hdrs, expect) : NULL;
    if (!h2) {
        curl_slist_free_all(hdrs);
        return KVO_ENOMEM;
    }
    hdrs = h2;
    curl_easy_setopt(c->h, CURLOPT_POST, 1L);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, len ? body : "");
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, hdrs);
    kvo_status st = perform(c, url, resp);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, NULL);
    curl_slist_free_all(hdrs);
    return st;
}
