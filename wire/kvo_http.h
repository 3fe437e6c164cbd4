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
 */
#ifndef KVO_HTTP_H
#define KVO_HTTP_H

#include "kvo.h"

#include <json-c/json.h>

typedef struct kvo_http_server kvo_http_server;
typedef struct kvo_http_req kvo_http_req; /* one in-flight request */

typedef void (*kvo_http_handler)(void *ctx, kvo_http_req *req);

typedef struct kvo_http_server_cfg {
    const char *host;        /* bind address; NULL = 127.0.0.1 */
    uint16_t port;           /* 0 = pick a free port */
    size_t max_body;         /* 0 = 64 MiB */
    kvo_http_handler handler;
    void *ctx;
} kvo_http_server_cfg;

kvo_status kvo_http_server_new(kvo_http_server **out,
                               const kvo_http_server_cfg *cfg);
/* Stops listening, answers pending requests with 503, frees. NULL no-op. */
void kvo_http_server_free(kvo_http_server *s);
uint16_t kvo_http_server_port(const kvo_http_server *s); /* bound port */
int kvo_http_server_fd(const kvo_http_server *s);        /* for zmq_poll */
/* Milliseconds until libmicrohttpd wants to run again (-1 = no deadline). */
long kvo_http_server_timeout_ms(const kvo_http_server *s);
/* Process whatever is ready; never blocks. */
void kvo_http_server_run(kvo_http_server *s);

/* Request accessors; strings valid until the request is answered. */
const char *kvo_http_req_method(const kvo_http_req *r);
const char *kvo_http_req_path(const kvo_http_req *r);
/* Query-string argument value, NULL when absent. */
const char *kvo_http_req_arg(const kvo_http_req *r, const char *name);
const uint8_t *kvo_http_req_body(const kvo_http_req *r, size_t *len);

/* Answer (copies body). After this, r is invalid. */
void kvo_http_respond(kvo_http_req *r, unsigned status, const char *ctype,
                      const void *body, size_t len);
/* Serializes j (plain, no spaces) as application/json; takes j's
 * reference (json_object_put is done here). */
void kvo_http_respond_json(kvo_http_req *r, unsigned status, json_object *j);
/* {"error": msg} with the given 4xx/5xx status. */
void kvo_http_respond_error(kvo_http_req *r, unsigned status,
                            const char *msg);

/* Streaming: start, write any number of chunks, end. Chunks are sent as
 * they are written. After stream_end, r is invalid. If the client goes away,
 * writes are discarded and kvo_http_stream_closed() turns true. */
void kvo_http_stream_start(kvo_http_req *r, unsigned status,
                           const char *ctype);
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
 * KVO_ETIMEDOUT / KVO_EHTTP otherwise. resp->body is replaced. */
kvo_status kvo_http_get(kvo_http_client *c, const char *url,
                        kvo_http_resp *resp);
kvo_status kvo_http_post(kvo_http_client *c, const char *url,
                         const char *ctype, const void *body, size_t len,
                         kvo_http_resp *resp);

#endif /* KVO_HTTP_H */
