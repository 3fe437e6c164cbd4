/* kvo_http: the libmicrohttpd server and the libcurl client against each
 * other over real loopback sockets.
 *
 * The server runs its loop on its own thread (as a service's main loop
 * would); the handler and a per-round tick(), which answers deferred requests
 * and writes streams, run on that thread. Clients (kvo_http, curl, raw
 * sockets) run on the test thread or on helper threads. */
#include "kt.h"
#include "kvo_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

Suite *suite_http(void);

#define MAX_HELD 8

typedef struct fix {
    kvo_http_server *s;
    pthread_t th;
    atomic_bool stop;
    atomic_int calls; /* handler calls */
    atomic_int held;  /* requests the handler kept */
    atomic_bool stream_closed_seen;
    atomic_int idle_ok, idle_bad;
    atomic_bool stream_done;
    atomic_bool wake_ok; /* timeout 0 right after a deferred answer */
    char base[64];
    /* server thread only */
    kvo_http_req *defer[MAX_HELD];
    int ndefer, defer_expect, defer_rounds;
    kvo_http_req *forever[MAX_HELD];
    int nforever;
    kvo_http_req *stream;
    enum { ST_COUNT, ST_ENDLESS, ST_IDLE, ST_HOLD, ST_FLOOD } stream_kind;
    int stream_n, stream_i, stream_round;
} fix;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (bounded) for a condition another thread makes true. */
#define WAIT_FOR(cond)                                                         \
    do {                                                                       \
        for (int w_ = 0; w_ < 6000 && !(cond); w_++) sleep_ms(5);              \
        ck_assert_msg((cond), "timed out waiting for " #cond);                 \
    } while (0)

static void on_req(void *ctx, kvo_http_req *r) {
    fix *f = ctx;
    atomic_fetch_add(&f->calls, 1);
    const char *path = kvo_http_req_path(r);
    if (!strcmp(path, "/hello")) {
        kvo_http_respond(r, 200, "text/plain", "hello", 5);
    } else if (!strcmp(path, "/json")) {
        json_object *j = json_object_new_object();
        const char *x = kvo_http_req_arg(r, "x");
        const char *h = kvo_http_req_header(r, "x-test");
        json_object_object_add(j, "method",
                               json_object_new_string(kvo_http_req_method(r)));
        json_object_object_add(j, "path", json_object_new_string(path));
        json_object_object_add(j, "x", x ? json_object_new_string(x) : NULL);
        json_object_object_add(j, "hdr", h ? json_object_new_string(h) : NULL);
        json_object_object_add(j, "big", json_object_new_uint64(UINT64_MAX));
        kvo_http_respond_json(r, 200, j);
    } else if (!strcmp(path, "/echo")) {
        size_t len;
        const uint8_t *b = kvo_http_req_body(r, &len);
        ck_assert_uint_eq(b[len], 0); /* NUL-terminated for parsers */
        const char *ct = kvo_http_req_header(r, "Content-Type");
        kvo_http_respond(r, 200, ct ? ct : "application/octet-stream", b, len);
    } else if (!strcmp(path, "/conns")) {
        json_object *j = json_object_new_object();
        json_object_object_add(
            j, "conns",
            json_object_new_uint64(kvo_http_server_conn_count(f->s)));
        kvo_http_respond_json(r, 200, j);
    } else if (!strcmp(path, "/defer") && f->ndefer < MAX_HELD) {
        f->defer[f->ndefer++] = r;
        atomic_fetch_add(&f->held, 1);
    } else if (!strcmp(path, "/forever") && f->nforever < MAX_HELD) {
        f->forever[f->nforever++] = r;
        atomic_fetch_add(&f->held, 1);
    } else if (!strncmp(path, "/sse", 4) && !f->stream) {
        const char *n = kvo_http_req_arg(r, "n");
        f->stream_n = n ? atoi(n) : 0;
        f->stream_i = f->stream_round = 0;
        f->stream_kind = !strcmp(path, "/sse-endless") ? ST_ENDLESS
                         : !strcmp(path, "/sse-idle")  ? ST_IDLE
                         : !strcmp(path, "/sse-hold")  ? ST_HOLD
                         : !strcmp(path, "/sse-flood") ? ST_FLOOD
                                                       : ST_COUNT;
        kvo_http_stream_start(r, 200, "text/event-stream");
        if (!strcmp(path, "/sse-inline")) { /* whole stream in the handler */
            kvo_http_stream_write(r, "data: a\n\n", 9);
            kvo_http_stream_write(r, "data: b\n\n", 9);
            kvo_http_stream_end(r);
            return;
        }
        f->stream = r;
        atomic_fetch_add(&f->held, 1);
    } else {
        kvo_http_respond_error(r, 404, "no such path");
    }
}

static void tick_defer(fix *f) {
    if (f->ndefer == 0 || f->ndefer < f->defer_expect) return;
    if (++f->defer_rounds < 5) return;
    for (int i = f->ndefer - 1; i >= 0; i--) { /* newest first */
        kvo_http_req *r = f->defer[i];
        const char *id = kvo_http_req_arg(r, "id");
        json_object *j = json_object_new_object();
        json_object_object_add(j, "id", json_object_new_string(id ? id : ""));
        json_object_object_add(j, "rounds",
                               json_object_new_int(f->defer_rounds));
        kvo_http_respond_json(r, 200, j);
    }
    /* Resuming does not make the fd readable; the 0 timeout is what wakes
     * the owner's poll. */
    atomic_store(&f->wake_ok, kvo_http_server_timeout_ms(f->s) == 0);
    f->ndefer = 0;
    f->defer_rounds = 0;
}

static void stream_finish(fix *f) {
    kvo_http_stream_end(f->stream);
    f->stream = NULL;
    atomic_store(&f->stream_done, true);
}

static void tick_stream(fix *f) {
    kvo_http_req *r = f->stream;
    if (!r) return;
    char line[600];
    int round = f->stream_round++;
    switch (f->stream_kind) {
    case ST_COUNT:
        if (round % 4 == 3) return; /* an idle round: the reader suspends */
        for (int k = 0; k < 3 && f->stream_i < f->stream_n; k++) {
            int n = snprintf(line, sizeof(line), "data: %d\n\n", f->stream_i++);
            kvo_http_stream_write(r, line, (size_t)n);
        }
        if (f->stream_i == f->stream_n) stream_finish(f);
        break;
    case ST_ENDLESS:
        if (kvo_http_stream_closed(r)) {
            atomic_store(&f->stream_closed_seen, true);
            kvo_http_stream_write(r, "dropped", 7); /* discarded, no crash */
            stream_finish(f);
        } else if (round < 200000) {
            memset(line, 'x', sizeof(line));
            memcpy(line, "data: ", 6);
            line[sizeof(line) - 2] = line[sizeof(line) - 1] = '\n';
            kvo_http_stream_write(r, line, sizeof(line));
        } else {
            stream_finish(f); /* the test fails on stream_closed_seen */
        }
        break;
    case ST_IDLE:
        if (round >= 10 && round < 40) {
            /* Headers went out and the reader found nothing: the server
             * must be quiet now, neither a readable fd nor a 0 timeout. */
            struct pollfd pfd = {.fd = kvo_http_server_fd(f->s),
                                 .events = POLLIN};
            bool quiet =
                kvo_http_server_timeout_ms(f->s) != 0 && poll(&pfd, 1, 0) == 0;
            atomic_fetch_add(quiet ? &f->idle_ok : &f->idle_bad, 1);
        } else if (round == 40) {
            kvo_http_stream_write(r, "data: done\n\n", 12);
            stream_finish(f);
        }
        break;
    case ST_HOLD: break;
    case ST_FLOOD: { /* 64 KiB a round to a client that never reads */
        static char chunk[64 * 1024];
        if (kvo_http_stream_closed(r)) {
            atomic_store(&f->stream_closed_seen, true);
            stream_finish(f);
        } else if (round < 4000) { /* 250 MiB: far past the 64 MiB cap */
            kvo_http_stream_write(r, chunk, sizeof(chunk));
        } else {
            stream_finish(f);
        }
        break;
    }
    }
}

static void *srv_loop(void *arg) {
    fix *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd pfd = {.fd = kvo_http_server_fd(f->s), .events = POLLIN};
        long t = kvo_http_server_timeout_ms(f->s);
        poll(&pfd, 1, t < 0 || t > 2 ? 2 : (int)t);
        kvo_http_server_run(f->s);
        tick_defer(f);
        tick_stream(f);
    }
    return NULL;
}

/* Start with cfg (host, port, handler and ctx are filled in here). */
static void fix_start_cfg(fix *f, kvo_http_server_cfg cfg) {
    memset(f, 0, sizeof(*f));
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.handler = on_req;
    cfg.ctx = f;
    ck_assert_int_eq(kvo_http_server_new(&f->s, &cfg), KVO_OK);
    ck_assert_uint_ne(kvo_http_server_port(f->s), 0);
    ck_assert_int_ge(kvo_http_server_fd(f->s), 0);
    snprintf(f->base, sizeof(f->base), "http://127.0.0.1:%u",
             (unsigned)kvo_http_server_port(f->s));
    ck_assert_int_eq(pthread_create(&f->th, NULL, srv_loop, f), 0);
}

static void fix_start(fix *f, size_t max_body) {
    fix_start_cfg(f, (kvo_http_server_cfg){.max_body = max_body});
}

static int held_count(fix *f) { return atomic_load(&f->held); }
static int handler_calls(fix *f) { return atomic_load(&f->calls); }

static void fix_halt(fix *f) {
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
}

static void fix_stop(fix *f) {
    fix_halt(f);
    kvo_http_server_free(f->s);
}

static char *url(const fix *f, const char *path) {
    static char buf[4][256];
    static int k;
    char *u = buf[k++ % 4];
    snprintf(u, 256, "%s%s", f->base, path);
    return u;
}

/* ---- Raw socket client --------------------------------------------------- */

/* A connection from another loopback address (127.0.0.2): another client
 * as far as per-client limits go. */
static int raw_connect_from(const fix *f, uint32_t src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in me = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(src)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&me, sizeof(me)), 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(kvo_http_server_port(f->s)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static int raw_connect(const fix *f) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(kvo_http_server_port(f->s)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void raw_send(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        ck_assert_int_gt(k, 0);
        s += k;
        n -= (size_t)k;
    }
}

/* Everything until the server closes (or 10 s pass); malloc'd, NUL-ended. */
static char *raw_read_all(int fd) {
    kvo_buf b;
    kvo_buf_init(&b);
    char tmp[4096];
    ssize_t k;
    while ((k = recv(fd, tmp, sizeof(tmp), 0)) > 0)
        ck_assert(kvo_buf_append(&b, tmp, (size_t)k) == KVO_OK);
    ck_assert(kvo_buf_cstr(&b) == KVO_OK);
    return (char *)b.data;
}

static char *raw_exchange(const fix *f, const char *req, size_t len) {
    int fd = raw_connect(f);
    raw_send(fd, req, len);
    char *resp = raw_read_all(fd);
    close(fd);
    return resp;
}

/* ---- Client threads ------------------------------------------------------ */

typedef struct get_job {
    pthread_t th;
    char url[256];
    long timeout_ms;
    kvo_status st;
    kvo_http_resp resp;
} get_job;

static void *get_run(void *arg) {
    get_job *j = arg;
    kvo_http_client *c = NULL;
    j->st = kvo_http_client_new(&c, j->timeout_ms);
    if (j->st == KVO_OK) j->st = kvo_http_get(c, j->url, &j->resp);
    kvo_http_client_free(c);
    return NULL;
}

static void get_start(get_job *j, const char *u, long timeout_ms) {
    memset(j, 0, sizeof(*j));
    snprintf(j->url, sizeof(j->url), "%s", u);
    j->timeout_ms = timeout_ms;
    kvo_http_resp_init(&j->resp);
    ck_assert_int_eq(pthread_create(&j->th, NULL, get_run, j), 0);
}

static void get_join(get_job *j) { pthread_join(j->th, NULL); }

static json_object *parse_body(const kvo_http_resp *r) {
    json_object *j = json_tokener_parse((const char *)r->body.data);
    ck_assert_msg(j != NULL, "not JSON: %s", (const char *)r->body.data);
    return j;
}

static const char *jstr(json_object *j, const char *key) {
    json_object *v;
    if (!json_object_object_get_ex(j, key, &v) || !v) return NULL;
    return json_object_get_string(v);
}

static int64_t jint(json_object *j, const char *key) {
    json_object *v;
    ck_assert(json_object_object_get_ex(j, key, &v));
    return json_object_get_int64(v);
}

/* ---- Tests --------------------------------------------------------------- */

START_TEST(get_post_json_and_404_round_trip) {
    fix f;
    fix_start(&f, 0);
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 5000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);

    ck_assert_int_eq(kvo_http_get(c, url(&f, "/hello"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.body.len, 5);
    ck_assert_str_eq((char *)r.body.data, "hello");

    ck_assert_int_eq(kvo_http_get(c, url(&f, "/json?x=a%20b&y=2"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    json_object *j = parse_body(&r);
    ck_assert_str_eq(jstr(j, "method"), "GET");
    ck_assert_str_eq(jstr(j, "path"), "/json");
    ck_assert_str_eq(jstr(j, "x"), "a b");
    ck_assert_ptr_null(jstr(j, "hdr"));
    json_object *big;
    ck_assert(json_object_object_get_ex(j, "big", &big));
    ck_assert_uint_eq(json_object_get_uint64(big), UINT64_MAX);
    json_object_put(j);

    const char msg[] = "{\"token_ids\": [1, 2, 3]}";
    ck_assert_int_eq(kvo_http_post(c, url(&f, "/echo"), "application/json", msg,
                                   strlen(msg), &r),
                     KVO_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.body.len, strlen(msg));
    ck_assert_mem_eq(r.body.data, msg, strlen(msg));

    /* An empty POST, then a GET on the same handle: no stale body. */
    ck_assert_int_eq(
        kvo_http_post(c, url(&f, "/echo"), "text/plain", NULL, 0, &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.body.len, 0);
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/json"), &r), KVO_OK);
    j = parse_body(&r);
    ck_assert_str_eq(jstr(j, "method"), "GET");
    json_object_put(j);

    /* A 1 MiB binary body survives the trip byte for byte. */
    size_t n = 1u << 20;
    uint8_t *big_body = kvo_malloc(n);
    for (size_t i = 0; i < n; i++) big_body[i] = (uint8_t)(i * 131 + (i >> 9));
    ck_assert_int_eq(kvo_http_post(c, url(&f, "/echo"),
                                   "application/octet-stream", big_body, n, &r),
                     KVO_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.body.len, n);
    ck_assert(memcmp(r.body.data, big_body, n) == 0);
    kvo_free(big_body);

    ck_assert_int_eq(kvo_http_get(c, url(&f, "/nope"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 404);
    j = parse_body(&r);
    ck_assert_str_eq(jstr(j, "error"), "no such path");
    json_object_put(j);

    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f);
}
END_TEST

START_TEST(request_headers_and_query_args_reach_the_handler) {
    fix f;
    fix_start(&f, 0);
    const char req[] = "GET /json?x=q%26r HTTP/1.1\r\nHost: t\r\n"
                       "X-Test: yes\r\nConnection: close\r\n\r\n";
    char *resp = raw_exchange(&f, req, strlen(req));
    ck_assert_msg(!strncmp(resp, "HTTP/1.1 200", 12), "%s", resp);
    ck_assert_ptr_nonnull(strstr(resp, "application/json"));
    ck_assert_ptr_nonnull(strstr(resp, "\"hdr\":\"yes\""));
    ck_assert_ptr_nonnull(strstr(resp, "\"x\":\"q&r\""));
    free(resp);
    fix_stop(&f);
}
END_TEST

START_TEST(oversized_body_gets_413_without_reaching_the_handler) {
    fix f;
    fix_start(&f, 1024);
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 5000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    char body[1025];
    memset(body, 'b', sizeof(body));

    ck_assert_int_eq(
        kvo_http_post(c, url(&f, "/echo"), "text/plain", body, 1024, &r),
        KVO_OK);
    ck_assert_int_eq(r.status, 200); /* exactly the limit is fine */
    ck_assert_uint_eq(r.body.len, 1024);
    ck_assert_int_eq(handler_calls(&f), 1);

    ck_assert_int_eq(
        kvo_http_post(c, url(&f, "/echo"), "text/plain", body, 1025, &r),
        KVO_OK);
    ck_assert_int_eq(r.status, 413);
    json_object *j = parse_body(&r);
    ck_assert_ptr_nonnull(strstr(jstr(j, "error"), "1024"));
    json_object_put(j);
    ck_assert_int_eq(handler_calls(&f), 1);

    /* Large bodies too: the client waits for 100 Continue, so the 413 is
     * not lost in a reset while it is still sending. */
    size_t big_n = 8u << 20;
    char *big_body = kvo_calloc(1, big_n);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(kvo_http_post(c, url(&f, "/echo"), "text/plain",
                                       big_body, big_n, &r),
                         KVO_OK);
        ck_assert_int_eq(r.status, 413);
    }
    kvo_free(big_body);
    ck_assert_int_eq(handler_calls(&f), 1);

    /* A declared length far beyond the limit is refused before any of the
     * body is read. */
    const char huge[] = "POST /echo HTTP/1.1\r\nHost: t\r\n"
                        "Content-Length: 1000000000000\r\n\r\nabc";
    char *resp = raw_exchange(&f, huge, strlen(huge));
    ck_assert_msg(!strncmp(resp, "HTTP/1.1 413", 12), "%s", resp);
    ck_assert_ptr_nonnull(strstr(resp, "{\"error\":"));
    free(resp);

    /* Chunked bodies have no declared length: counted as they arrive. */
    kvo_buf req;
    kvo_buf_init(&req);
    kvo_buf_printf(&req, "POST /echo HTTP/1.1\r\nHost: t\r\n"
                         "Transfer-Encoding: chunked\r\n"
                         "Connection: close\r\n\r\n");
    for (int i = 0; i < 10; i++) {
        kvo_buf_printf(&req, "200\r\n");
        kvo_buf_append(&req, body, 0x200);
        kvo_buf_printf(&req, "\r\n");
    }
    kvo_buf_printf(&req, "0\r\n\r\n");
    resp = raw_exchange(&f, (char *)req.data, req.len);
    ck_assert_msg(!strncmp(resp, "HTTP/1.1 413", 12), "%s", resp);
    free(resp);
    kvo_buf_fini(&req);
    ck_assert_int_eq(handler_calls(&f), 1);

    /* And the server still answers afterwards. */
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/hello"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);

    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f);
}
END_TEST

static kvo_http_server_stats stats_of(fix *f) {
    kvo_http_server_stats st;
    kvo_http_server_stats_get(f->s, &st); /* counters: a torn read is fine */
    return st;
}

/* 2,000 half-open connections from one client: the others are still
 * served at once, and the hostile ones are cut after the head deadline. */
/* kvo_http_server_due, for a loop that applies between runs: not due while
 * nothing waits and the budget lasts; due once a client waits (looked for
 * every KVO_HTTP_PEEK_US), and still due until the server runs; not due
 * again once that client is served (a false "due" would cut every apply
 * into 50 us pieces); due when the budget is spent. No thread runs the
 * server here: the test is the loop. */
START_TEST(due_says_when_a_request_waits_or_the_budget_is_spent) {
    enum { BUDGET_US = 60000000, PAST_PEEK_US = 4 * KVO_HTTP_PEEK_US };
    fix f;
    memset(&f, 0, sizeof(f));
    kvo_http_server_cfg cfg = {
        .host = "127.0.0.1", .handler = on_req, .ctx = &f};
    ck_assert_int_eq(kvo_http_server_new(&f.s, &cfg), KVO_OK);
    kvo_http_server_run(f.s);
    usleep(PAST_PEEK_US);
    ck_assert(!kvo_http_server_due(f.s, BUDGET_US));
    int fd = raw_connect(&f);
    const char *get = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, get, strlen(get));
    usleep(PAST_PEEK_US);
    ck_assert(kvo_http_server_due(f.s, BUDGET_US));
    ck_assert(kvo_http_server_due(f.s, BUDGET_US)); /* until it runs */
    for (int i = 0; i < 100 && handler_calls(&f) == 0; i++) {
        kvo_http_server_run(f.s);
        usleep(1000);
    }
    ck_assert_int_eq(handler_calls(&f), 1);
    char b[512];
    ck_assert_int_gt(recv(fd, b, sizeof(b), 0), 0); /* the answer */
    kvo_http_server_run(f.s);
    usleep(PAST_PEEK_US);
    ck_assert_msg(!kvo_http_server_due(f.s, BUDGET_US),
                  "due with nothing waiting: an idle keep-alive connection "
                  "makes the server's fd readable");
    usleep(2000);
    ck_assert(kvo_http_server_due(f.s, 1000)); /* 1 ms spent */
    close(fd);
    kvo_http_server_free(f.s);
}
END_TEST

START_TEST(half_open_connections_cannot_starve_other_clients) {
    enum { HOSTILE = 2000 };
    fix f;
    fix_start_cfg(&f, (kvo_http_server_cfg){.max_client_conns = 64,
                                            .head_timeout_ms = 1000});
    static int fds[HOSTILE];
    int opened = 0;
    for (int i = 0; i < HOSTILE; i++) {
        fds[i] = raw_connect_from(&f, 0x7f000002);         /* 127.0.0.2 */
        raw_send(fds[i], "GET /hello HTTP/1.1\r\nHo", 24); /* never ends */
        opened++;
    }
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 5000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    for (int i = 0; i < 20; i++) {
        ck_assert_int_eq(kvo_http_get(c, url(&f, "/hello"), &r), KVO_OK);
        ck_assert_int_eq(r.status, 200);
    }
    kvo_http_client_free(c); /* its idle keep-alive would be reaped too */
    /* every hostile connection ends: refused over the per-client cap, or
     * closed at the head deadline */
    for (int i = 0; i < opened; i++) {
        struct timeval tv = {10, 0};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        char b[256];
        ssize_t k;
        while ((k = recv(fds[i], b, sizeof(b), 0)) > 0) {
        }
        ck_assert_msg(k == 0 || errno == ECONNRESET,
                      "connection %d still "
                      "open (%s)",
                      i, strerror(errno));
        close(fds[i]);
    }
    ck_assert_uint_ge(stats_of(&f).head_timeouts, 1);
    ck_assert_uint_le(stats_of(&f).head_timeouts, 64);
    ck_assert_int_eq(kvo_http_client_new(&c, 5000), KVO_OK);
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/hello"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f);
}
END_TEST

/* A body that stops half-way is cut at the body deadline; the handler
 * never sees it. */
START_TEST(a_stalled_body_is_cut_at_its_deadline) {
    fix f;
    fix_start_cfg(&f, (kvo_http_server_cfg){.body_timeout_ms = 500});
    int fd = raw_connect(&f);
    const char head[] = "POST /echo HTTP/1.1\r\nHost: t\r\n"
                        "Content-Length: 100\r\n\r\n0123456789";
    raw_send(fd, head, strlen(head));
    char *resp = raw_read_all(fd); /* returns once the server closes */
    close(fd);
    ck_assert_str_eq(resp, "");
    free(resp);
    ck_assert_uint_eq(stats_of(&f).body_timeouts, 1);
    ck_assert_int_eq(handler_calls(&f), 0);
    fix_stop(&f);
}
END_TEST

/* Bodies in flight are capped per process: a request whose body would pass
 * the cap gets a JSON 503 while another body is still arriving. */
START_TEST(bodies_in_flight_are_capped_per_process) {
    fix f;
    fix_start_cfg(&f, (kvo_http_server_cfg){.max_body = 1 << 20,
                                            .max_inflight = 1 << 20});
    /* an upload of 1 MiB that stops 10 bytes short holds the whole cap */
    int slow = raw_connect(&f);
    kvo_buf req;
    kvo_buf_init(&req);
    kvo_buf_printf(&req,
                   "POST /echo HTTP/1.1\r\nHost: t\r\n"
                   "Content-Length: %d\r\n\r\n",
                   1 << 20);
    size_t head = req.len;
    ck_assert(kvo_buf_reserve(&req, 1 << 20) == KVO_OK);
    memset(req.data + head, 'x', 1 << 20);
    req.len = head + (1 << 20) - 10;
    raw_send(slow, (char *)req.data, req.len);
    WAIT_FOR(stats_of(&f).conns >= 1);
    /* the server has read it once a small request is answered behind it */
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 5000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    for (int tries = 0;; tries++) {
        ck_assert_int_eq(kvo_http_post(c, url(&f, "/echo"), "text/plain",
                                       "0123456789abcdef", 16, &r),
                         KVO_OK);
        if (r.status == 503) break;
        ck_assert_int_eq(r.status, 200); /* the slow body not read yet */
        ck_assert_int_lt(tries, 1000);
        sleep_ms(5);
    }
    json_object *j = parse_body(&r);
    ck_assert_ptr_nonnull(strstr(jstr(j, "error"), "server busy"));
    json_object_put(j);
    ck_assert_uint_ge(stats_of(&f).busy_refused, 1);
    /* the slow upload completes and is served; then there is room again */
    raw_send(slow, "xxxxxxxxxx", 10);
    char buf[64];
    ck_assert_int_gt(recv(slow, buf, sizeof(buf), 0), 0);
    ck_assert(!strncmp(buf, "HTTP/1.1 200", 12));
    close(slow);
    int calls = handler_calls(&f);
    for (int tries = 0;; tries++) {
        ck_assert_int_eq(kvo_http_post(c, url(&f, "/echo"), "text/plain",
                                       "0123456789abcdef", 16, &r),
                         KVO_OK);
        if (r.status == 200) break;
        ck_assert_int_lt(tries, 1000);
        sleep_ms(5);
    }
    ck_assert_int_gt(handler_calls(&f), calls);
    kvo_buf_fini(&req);
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f);
}
END_TEST

START_TEST(deferred_answers_arrive_after_several_rounds_in_any_order) {
    fix f;
    fix_start(&f, 0);
    f.defer_expect = 3; /* set before any request can arrive */
    get_job jobs[3];
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/defer?id=%d", i);
        get_start(&jobs[i], url(&f, path), 10000);
    }
    for (int i = 0; i < 3; i++) {
        get_join(&jobs[i]);
        ck_assert_int_eq(jobs[i].st, KVO_OK);
        ck_assert_int_eq(jobs[i].resp.status, 200);
        json_object *j = parse_body(&jobs[i].resp);
        char id[8];
        snprintf(id, sizeof(id), "%d", i);
        ck_assert_str_eq(jstr(j, "id"), id);
        ck_assert_int_ge(jint(j, "rounds"), 5);
        json_object_put(j);
        kvo_http_resp_fini(&jobs[i].resp);
    }
    bool woke = atomic_load(&f.wake_ok);
    ck_assert_msg(woke, "no 0 timeout after answering a deferred request");
    fix_stop(&f);
}
END_TEST

START_TEST(stream_delivers_many_chunks_in_order) {
    fix f;
    fix_start(&f, 0);
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 20000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/sse?n=500"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    kvo_buf want;
    kvo_buf_init(&want);
    for (int i = 0; i < 500; i++) kvo_buf_printf(&want, "data: %d\n\n", i);
    ck_assert_uint_eq(r.body.len, want.len);
    ck_assert(memcmp(r.body.data, want.data, want.len) == 0);
    kvo_buf_fini(&want);

    /* A stream written and ended inside the handler; then the same kept-alive
     * connection serves a plain request. */
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/sse-inline"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq((char *)r.body.data, "data: a\n\ndata: b\n\n");
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/hello"), &r), KVO_OK);
    ck_assert_str_eq((char *)r.body.data, "hello");

    /* The wire form: chunked, event-stream, not cached. */
    const char req[] = "GET /sse?n=2 HTTP/1.1\r\nHost: t\r\n"
                       "Connection: close\r\n\r\n";
    char *raw = raw_exchange(&f, req, strlen(req));
    ck_assert_ptr_nonnull(strstr(raw, "text/event-stream"));
    ck_assert_ptr_nonnull(strcasestr(raw, "Transfer-Encoding: chunked"));
    ck_assert_ptr_nonnull(strcasestr(raw, "Cache-Control: no-cache"));
    free(raw);

    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f);
}
END_TEST

START_TEST(idle_stream_suspends_instead_of_spinning) {
    fix f;
    fix_start(&f, 0);
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 20000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/sse-idle"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq((char *)r.body.data, "data: done\n\n");
    int quiet = atomic_load(&f.idle_ok), busy = atomic_load(&f.idle_bad);
    ck_assert_int_eq(quiet, 30);
    ck_assert_int_eq(busy, 0);
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f);
}
END_TEST

START_TEST(client_leaving_mid_stream_closes_it_and_frees_it) {
    fix f;
    fix_start(&f, 0);
    int fd = raw_connect(&f);
    const char req[] = "GET /sse-endless HTTP/1.1\r\nHost: t\r\n\r\n";
    raw_send(fd, req, strlen(req));
    char tmp[4096];
    size_t got = 0;
    while (got < 8192) { /* headers and a few events */
        ssize_t k = recv(fd, tmp, sizeof(tmp), 0);
        ck_assert_int_gt(k, 0);
        got += (size_t)k;
    }
    struct linger lg = {1, 0}; /* RST: the hardest way to leave */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
    WAIT_FOR(atomic_load(&f.stream_done));
    ck_assert(atomic_load(&f.stream_closed_seen));

    /* A polite close (FIN) is noticed too. */
    atomic_store(&f.stream_done, false);
    atomic_store(&f.stream_closed_seen, false);
    fd = raw_connect(&f);
    raw_send(fd, req, strlen(req));
    ck_assert_int_gt(recv(fd, tmp, sizeof(tmp), 0), 0);
    close(fd);
    WAIT_FOR(atomic_load(&f.stream_done));
    ck_assert(atomic_load(&f.stream_closed_seen));
    fix_stop(&f);
}
END_TEST

START_TEST(stream_to_a_client_that_never_reads_is_dropped_at_the_cap) {
    fix f;
    fix_start(&f, 0);
    int fd = raw_connect(&f);
    const char req[] = "GET /sse-flood HTTP/1.1\r\nHost: t\r\n\r\n";
    raw_send(fd, req, strlen(req));
    WAIT_FOR(atomic_load(&f.stream_done));
    bool closed = atomic_load(&f.stream_closed_seen);
    ck_assert_msg(closed, "unsent stream data grew past the cap");
    close(fd);
    fix_stop(&f);
}
END_TEST

START_TEST(server_free_answers_pending_requests_with_503) {
    fix f;
    fix_start(&f, 0);
    get_job a, b, s;
    get_start(&a, url(&f, "/forever"), 20000);
    get_start(&b, url(&f, "/forever"), 20000);
    get_start(&s, url(&f, "/sse-hold"), 20000);
    WAIT_FOR(held_count(&f) == 3);
    fix_halt(&f);
    kvo_http_server_free(f.s);
    get_join(&a);
    get_join(&b);
    get_join(&s);
    ck_assert_int_eq(a.st, KVO_OK);
    ck_assert_int_eq(a.resp.status, 503);
    json_object *j = parse_body(&a.resp);
    ck_assert_ptr_nonnull(jstr(j, "error"));
    json_object_put(j);
    ck_assert_int_eq(b.st, KVO_OK);
    ck_assert_int_eq(b.resp.status, 503);
    ck_assert_int_eq(s.st, KVO_OK); /* the stream is ended cleanly */
    ck_assert_int_eq(s.resp.status, 200);
    ck_assert_uint_eq(s.resp.body.len, 0);
    kvo_http_resp_fini(&a.resp);
    kvo_http_resp_fini(&b.resp);
    kvo_http_resp_fini(&s.resp);
}
END_TEST

START_TEST(client_reuses_its_connection) {
    fix f;
    fix_start(&f, 0);
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 5000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    int64_t first = -1;
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(kvo_http_get(c, url(&f, "/conns"), &r), KVO_OK);
        json_object *j = parse_body(&r);
        if (first < 0) first = jint(j, "conns");
        ck_assert_int_eq(jint(j, "conns"), first); /* no new connection */
        json_object_put(j);
        ck_assert_int_eq(
            kvo_http_post(c, url(&f, "/echo"), "text/plain", "x", 1, &r),
            KVO_OK);
    }
    ck_assert_int_ge(first, 1);
    /* A second client is a second connection: the counter can move. */
    kvo_http_client *c2;
    ck_assert_int_eq(kvo_http_client_new(&c2, 5000), KVO_OK);
    ck_assert_int_eq(kvo_http_get(c2, url(&f, "/conns"), &r), KVO_OK);
    json_object *j = parse_body(&r);
    ck_assert_int_eq(jint(j, "conns"), first + 1);
    json_object_put(j);
    kvo_http_client_free(c2);
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f);
}
END_TEST

START_TEST(client_reports_timeouts_and_refused_connections) {
    fix f;
    fix_start(&f, 0);
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 300), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/forever"), &r), KVO_ETIMEDOUT);
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_ne(kvo_http_client_error(c), "");
    /* The handle recovers: a new connection for the next request. */
    ck_assert_int_eq(kvo_http_get(c, url(&f, "/hello"), &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(kvo_http_client_error(c), "");

    uint16_t port;
    ck_assert_int_eq(kvo_free_port(&port), KVO_OK);
    char u[64];
    snprintf(u, sizeof(u), "http://127.0.0.1:%u/", (unsigned)port);
    ck_assert_int_eq(kvo_http_get(c, u, &r), KVO_EHTTP);
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_ne(kvo_http_client_error(c), "");
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    fix_stop(&f); /* the abandoned /forever request gets its 503 */
}
END_TEST

START_TEST(server_reports_bind_failures) {
    fix f;
    fix_start(&f, 0);
    kvo_http_server *s2 = NULL;
    kvo_http_server_cfg cfg = {
        .port = kvo_http_server_port(f.s), .handler = on_req, .ctx = &f};
    ck_assert_int_eq(kvo_http_server_new(&s2, &cfg), KVO_EHTTP);
    ck_assert_ptr_null(s2);
    cfg.port = 0;
    cfg.host = "not a host name";
    ck_assert_int_eq(kvo_http_server_new(&s2, &cfg), KVO_EINVAL);
    cfg.host = NULL;
    cfg.handler = NULL;
    ck_assert_int_eq(kvo_http_server_new(&s2, &cfg), KVO_EINVAL);
    kvo_http_server_free(NULL);
    kvo_http_client_free(NULL);
    fix_stop(&f);
}
END_TEST

Suite *suite_http(void) {
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("http");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, get_post_json_and_404_round_trip);
    tcase_add_test(tc, due_says_when_a_request_waits_or_the_budget_is_spent);
    tcase_add_test(tc, request_headers_and_query_args_reach_the_handler);
    tcase_add_test(tc, oversized_body_gets_413_without_reaching_the_handler);
    tcase_add_test(tc, half_open_connections_cannot_starve_other_clients);
    tcase_add_test(tc, a_stalled_body_is_cut_at_its_deadline);
    tcase_add_test(tc, bodies_in_flight_are_capped_per_process);
    tcase_add_test(tc,
                   deferred_answers_arrive_after_several_rounds_in_any_order);
    tcase_add_test(tc, stream_delivers_many_chunks_in_order);
    tcase_add_test(tc, idle_stream_suspends_instead_of_spinning);
    tcase_add_test(tc, client_leaving_mid_stream_closes_it_and_frees_it);
    tcase_add_test(tc,
                   stream_to_a_client_that_never_reads_is_dropped_at_the_cap);
    tcase_add_test(tc, server_free_answers_pending_requests_with_503);
    tcase_add_test(tc, client_reuses_its_connection);
    tcase_add_test(tc, client_reports_timeouts_and_refused_connections);
    tcase_add_test(tc, server_reports_bind_failures);
    suite_add_tcase(s, tc);
    return s;
}
