/* kvo_http.h -- the HTTP server (libmicrohttpd) and client (libcurl) glue
 * that every kvoracle service shares.
 *
 * Server: single-threaded. libmicrohttpd runs in external-poll (epoll) mode;
 * the owner adds kvo_http_server_fd() to its zmq_poll set and calls
 * kvo_http_server_run() when it is readable or the timeout expires. The
 * handler runs on the owner's thread, so it may touch the owner's state.
 *
 *   loop:  zmq_poll({zmq sockets..., {fd = kvo_http_server_fd(s)}}, timeout)
 *          kvo_http_server_run(s)      -> handler(ctx, req) per complete request
 *
 * A handler answers at once (kvo_http_respond*) or keeps the request and
 * answers later, from the same thread: the connection is suspended until
 * then. Streaming responses (SSE) are written with kvo_http_stream_*.
 * Request bodies larger than max_body get 413 without reaching the handler.
 *
 * The poll MUST be bounded by kvo_http_server_timeout_ms(): MHD's epoll is
 * edge-triggered, and answering a deferred request or writing a stream from
 * the owner's thread does not make the fd readable -- both show up only as a
 * 0 timeout (run again at once). The loop:
 *
 *   kvo_http_server *srv;
 *   kvo_http_server_cfg cfg = {.port = 8090, .handler = on_req, .ctx = app};
 *   if (kvo_http_server_new(&srv, &cfg) != KVO_OK) return KVO_EXIT_USAGE;
 *   zmq_pollitem_t items[] = {{sub, 0, ZMQ_POLLIN, 0},
 *                             {NULL, kvo_http_server_fd(srv), ZMQ_POLLIN, 0}};
 *   while (!kvo_stop) {
 *       long t = kvo_http_server_timeout_ms(srv);        // -1 = none
 *       if (t < 0 || t > 100) t = 100;                    // own deadlines
 *       zmq_poll(items, 2, t);
 *       if (items[0].revents) drain_sub(app);   // may answer deferred reqs
 *       kvo_http_server_run(srv);               // always; never blocks
 *   }
 *   kvo_http_server_free(srv);   // pending requests get 503
 *
 * Limits (kvo_http_server_cfg; 0 = the default): max_conns connections
 * (2048), max_client_conns from one client address (256), 128 KiB of
 * request line + headers per connection; a connection that has not sent a
 * complete request head within head_timeout_ms (10 s, counted from its
 * start or its previous answer, so idle keep-alive connections too) or a
 * complete body within body_timeout_ms (10 s) is closed; request bodies of
 * all live requests together at most max_inflight bytes (256 MiB; a request
 * beyond it gets 503); at most 64 MiB of unsent stream data per request
 * (beyond that the stream is dropped and reported closed). Requests the
 * handler holds (deferred, streams) never time out. Error answers are JSON
 * {"error": msg}, except the protocol errors libmicrohttpd answers itself.
 * Not thread-safe: every call on one server and its requests comes from
 * one thread.
 */
#ifndef KVO_HTTP_H
#define KVO_HTTP_H

#include "kvo.h"

#include <json-c/json.h>

typedef struct kvo_http_server kvo_http_server;
typedef struct kvo_http_req kvo_http_req; /* one in-flight request */

typedef void (*kvo_http_handler)(void *ctx, kvo_http_req *req);

typedef struct kvo_http_server_cfg {
    const char *host; /* bind address; NULL = 127.0.0.1 */
    uint16_t port;    /* 0 = pick a free port */
    size_t max_body;  /* 0 = 64 MiB */
    kvo_http_handler handler;
    void *ctx;
    size_t max_inflight;       /* bodies of live requests; 0 = 256 MiB */
    unsigned max_conns;        /* 0 = 2048 */
    unsigned max_client_conns; /* per client address; 0 = 256 */
    long head_timeout_ms;      /* 0 = 10 s */
    long body_timeout_ms;      /* 0 = 10 s */
} kvo_http_server_cfg;

/* What the server refused or cut, for a service's /metrics. */
typedef struct kvo_http_server_stats {
    uint64_t conns;         /* TCP connections accepted */
    uint64_t head_timeouts; /* closed: no complete request head in time */
    uint64_t body_timeouts; /* closed: no complete body in time */
    uint64_t busy_refused;  /* 503: bodies in flight over max_inflight */
} kvo_http_server_stats;

kvo_status kvo_http_server_new(kvo_http_server **out,
                               const kvo_http_server_cfg *cfg);
/* Answers requests still held by the owner (deferred: 503; streams: ended),
 * lets those answers go out for up to 1 s, stops listening, frees. Every
 * kvo_http_req pointer is invalid afterwards. NULL no-op. */
void kvo_http_server_free(kvo_http_server *s);
uint16_t kvo_http_server_port(const kvo_http_server *s); /* bound port */
int kvo_http_server_fd(const kvo_http_server *s);        /* for zmq_poll */
/* TCP connections accepted so far (tests: keep-alive reuse; metrics). */
uint64_t kvo_http_server_conn_count(const kvo_http_server *s);
void kvo_http_server_stats_get(const kvo_http_server *s,
                               kvo_http_server_stats *out);
/* Milliseconds until the server wants to run again (-1 = no deadline). */
long kvo_http_server_timeout_ms(const kvo_http_server *s);
/* Process whatever is ready; never blocks. */
void kvo_http_server_run(kvo_http_server *s);
/* For an owner that works between runs (an index applying a burst): should
 * it stop and run the server now? true once budget_us has passed since the
 * server last ran, or as soon as a request is waiting, looked for every
 * KVO_HTTP_PEEK_US (one poll of the fd, ~1 us on a VM where reading the
 * clock is 26 ns: at most 2 % of the work when no one asks). Then a
 * request waits for the piece of work under way, not for the budget. */
#define KVO_HTTP_PEEK_US 50
bool kvo_http_server_due(kvo_http_server *s, uint64_t budget_us);

/* Request accessors; strings valid until the request is answered. */
const char *kvo_http_req_method(const kvo_http_req *r);
const char *kvo_http_req_path(const kvo_http_req *r);
/* Query-string argument value, NULL when absent. */
const char *kvo_http_req_arg(const kvo_http_req *r, const char *name);
/* Request header value (name case-insensitive), NULL when absent. */
const char *kvo_http_req_header(const kvo_http_req *r, const char *name);
/* The whole body (never NULL; NUL-terminated after len bytes, so JSON text
 * can be parsed in place). */
const uint8_t *kvo_http_req_body(const kvo_http_req *r, size_t *len);

/* Answer (copies body). After this, r is invalid. */
void kvo_http_respond(kvo_http_req *r, unsigned status, const char *ctype,
                      const void *body, size_t len);
/* Serializes j (plain, no spaces) as application/json; takes j's
 * reference (json_object_put is done here). */
void kvo_http_respond_json(kvo_http_req *r, unsigned status, json_object *j);
/* {"error": msg} with the given 4xx/5xx status. */
void kvo_http_respond_error(kvo_http_req *r, unsigned status, const char *msg);

/* Streaming: start, write any number of chunks, end. Chunks are sent as
 * they are written. After stream_end, r is invalid. If the client goes away,
 * writes are discarded and kvo_http_stream_closed() turns true (noticed when
 * a write fails to go out, i.e. a run or two after a write; r stays valid
 * and must still be ended with stream_end). While nothing is written the
 * connection is suspended: an idle stream costs no CPU. */
void kvo_http_stream_start(kvo_http_req *r, unsigned status, const char *ctype);
void kvo_http_stream_write(kvo_http_req *r, const void *data, size_t len);
void kvo_http_stream_end(kvo_http_req *r);
bool kvo_http_stream_closed(const kvo_http_req *r);

/* ---- Client ---------------------------------------------------------------
 * A reusable connection (keep-alive) for one thread. */
typedef struct kvo_http_client kvo_http_client;

typedef struct kvo_http_resp {
    long status; /* HTTP status; 0 if no response */
    kvo_buf body;
} kvo_http_resp;

void kvo_http_resp_init(kvo_http_resp *r);
void kvo_http_resp_fini(kvo_http_resp *r);

kvo_status kvo_http_client_new(kvo_http_client **out, long timeout_ms);
void kvo_http_client_free(kvo_http_client *c);
/* KVO_OK when a response arrived (any status: check resp->status);
 * KVO_ETIMEDOUT / KVO_EHTTP otherwise (KVO_ETOOBIG: body over 1 GiB).
 * resp->body is replaced and NUL-terminated (not counted in len). */
/* timeout_ms bounds each whole request (<= 0: none); connecting is bounded
 * by min(timeout_ms, 5 s). Proxy settings from the environment are ignored.
 * The connection is kept alive and reused by the next request. */
kvo_status kvo_http_get(kvo_http_client *c, const char *url,
                        kvo_http_resp *resp);
kvo_status kvo_http_post(kvo_http_client *c, const char *url, const char *ctype,
                         const void *body, size_t len, kvo_http_resp *resp);
/* curl's text for the last failure ("" after a success); valid until the
 * next request on c. */
const char *kvo_http_client_error(const kvo_http_client *c);
/* Give up a request in flight once *flag turns nonzero (a stop flag, e.g.
 * &kvo_stop): the call returns KVO_EAGAIN within about a second (libcurl
 * looks at it between reads and at least once a second). NULL (the
 * default): requests only end by answer, error or timeout. */
void kvo_http_client_abort_on(kvo_http_client *c,
                              const volatile sig_atomic_t *flag);

#endif /* KVO_HTTP_H */
