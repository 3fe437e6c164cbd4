/* kvo-check reading answers from services that answer wrong. A fake
 * service (a kvo_http server in a child process, so that what the client
 * side holds can be measured alone) answers each of kvo-check's calls with
 * a good answer, then with hostile ones: bytes after the JSON, invalid
 * UTF-8, integers beyond their range, 200 MB bodies. Every one must end in
 * an error naming the call (method and URL) and what was wrong, with the
 * memory kvo-check needed bounded by the answer's size, never a multiple.
 *
 * The fake is told what to answer over HTTP itself:
 *   POST /fake/answer?path=P[&status=S]
 *                                 body = the answer to give for path P
 *                                 (with HTTP status S, 200)
 *   POST /fake/huge?path=P&kind=K a 200 MB answer made in the child:
 *                                 K = number (one integer of that many
 *                                 digits) or array (that many bytes of
 *                                 "0,0,...")
 * Any other path gets its answer, or 404. P may be "path@H" (the page
 * after=H of path) or "path~T" (path asked with tier=T). */
#include "check_int.h"
#include "tc.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

Suite *suite_answers(void);

#define FAKE_ROUTES 16
#define HUGE_BYTES ((size_t)200 << 20)

/* ---- the fake service (child process) ---------------------------------------*/

typedef struct route {
    char path[64];
    uint8_t *body; /* owned */
    size_t len;
    char huge;   /* 0, 'n' (number) or 'a' (array) */
    long status; /* 0: 200 */
} route;

static route routes[FAKE_ROUTES]; /* the child's */

static route *route_for(const char *path, bool add) {
    for (size_t i = 0; i < FAKE_ROUTES; i++)
        if (strcmp(routes[i].path, path) == 0) return &routes[i];
    for (size_t i = 0; add && i < FAKE_ROUTES; i++)
        if (!routes[i].path[0]) {
            snprintf(routes[i].path, sizeof(routes[i].path), "%s", path);
            return &routes[i];
        }
    return NULL;
}

/* {"publishers":[{"publisher_id":<digits>}]} or {"publishers":[0,0,...]},
 * HUGE_BYTES long. */
static void answer_huge(kvo_http_req *req, char kind) {
    static const char num_head[] = "{\"publishers\":[{\"publisher_id\":";
    static const char num_tail[] = "}]}";
    static const char arr_head[] = "{\"publishers\":[";
    static const char arr_tail[] = "0]}";
    const char *head = kind == 'n' ? num_head : arr_head;
    const char *tail = kind == 'n' ? num_tail : arr_tail;
    size_t hl = strlen(head), tl = strlen(tail);
    char *b = malloc(HUGE_BYTES);
    if (!b) _exit(3);
    memcpy(b, head, hl);
    for (size_t i = hl; i < HUGE_BYTES - tl; i++)
        b[i] = kind == 'n' ? (char)('1' + i % 9) : (i - hl) % 2 ? ',' : '0';
    memcpy(b + HUGE_BYTES - tl, tail, tl);
    kvo_http_respond(req, 200, "application/json", b, HUGE_BYTES);
    free(b);
}

static void fake_on_req(void *ctx, kvo_http_req *req) {
    (void)ctx;
    const char *path = kvo_http_req_path(req);
    const char *for_path = kvo_http_req_arg(req, "path");
    if (strncmp(path, "/fake/", 6) == 0) {
        route *r = for_path ? route_for(for_path, true) : NULL;
        if (!r) {
            kvo_http_respond_error(req, 400, "no path or no room");
            return;
        }
        free(r->body);
        r->body = NULL;
        r->len = 0;
        r->huge = 0;
        const char *status = kvo_http_req_arg(req, "status");
        r->status = status ? atol(status) : 0;
        if (strcmp(path, "/fake/huge") == 0) {
            const char *kind = kvo_http_req_arg(req, "kind");
            r->huge = kind ? kind[0] : 'n';
        } else {
            size_t n;
            const uint8_t *b = kvo_http_req_body(req, &n);
            r->body = malloc(n ? n : 1);
            if (!r->body) _exit(3);
            memcpy(r->body, b, n);
            r->len = n;
        }
        kvo_http_respond(req, 200, "text/plain", "ok", 2);
        return;
    }
    /* a page: "P@H" answers P?...&after=H when it is set; a tier: "P~T"
     * answers P?...&tier=T (its pages P~T@H) */
    const char *after = kvo_http_req_arg(req, "after");
    const char *tier = kvo_http_req_arg(req, "tier");
    char base[64], key[96];
    snprintf(base, sizeof(base), "%s%s%s", path, tier ? "~" : "",
             tier ? tier : "");
    route *r = NULL;
    if (after) {
        snprintf(key, sizeof(key), "%s@%s", base, after);
        r = route_for(key, false);
    }
    if (!r) r = route_for(base, false);
    if (!r)
        kvo_http_respond_error(req, 404, "no such path");
    else if (r->huge)
        answer_huge(req, r->huge);
    else
        kvo_http_respond(req, r->status ? (unsigned)r->status : 200,
                         "application/json", r->body, r->len);
}

/* The child: serve until the parent closes ctl (or dies). */
static void fake_serve(int port_fd, int ctl_fd) {
    kvo_http_server *s;
    kvo_http_server_cfg cfg = {.host = "127.0.0.1", .handler = fake_on_req};
    if (kvo_http_server_new(&s, &cfg) != KVO_OK) _exit(2);
    uint16_t port = kvo_http_server_port(s);
    if (write(port_fd, &port, sizeof(port)) != (ssize_t)sizeof(port)) _exit(2);
    for (;;) {
        struct pollfd p[2] = {{kvo_http_server_fd(s), POLLIN, 0},
                              {ctl_fd, POLLIN, 0}};
        long t = kvo_http_server_timeout_ms(s);
        poll(p, 2, t < 0 || t > 20 ? 20 : (int)t);
        if (p[1].revents) break;
        kvo_http_server_run(s);
    }
    kvo_http_server_free(s);
    _exit(0);
}

/* ---- the test's side ---------------------------------------------------------*/

typedef struct fake {
    pid_t pid;
    int ctl; /* closing it stops the child */
    uint16_t port;
    char base[64];
    kvo_http_client *http; /* to set answers */
} fake;

static void fake_start(fake *f) {
    memset(f, 0, sizeof(*f));
    int port_pipe[2], ctl_pipe[2];
    ck_assert_int_eq(pipe(port_pipe), 0);
    ck_assert_int_eq(pipe(ctl_pipe), 0);
    f->pid = fork();
    ck_assert_int_ge(f->pid, 0);
    if (f->pid == 0) {
        close(port_pipe[0]);
        close(ctl_pipe[1]);
        fake_serve(port_pipe[1], ctl_pipe[0]);
    }
    close(port_pipe[1]);
    close(ctl_pipe[0]);
    f->ctl = ctl_pipe[1];
    struct pollfd p = {port_pipe[0], POLLIN, 0};
    ck_assert_msg(poll(&p, 1, 10000) == 1, "the fake service did not start");
    ck_assert_int_eq(read(port_pipe[0], &f->port, sizeof(f->port)),
                     (ssize_t)sizeof(f->port));
    close(port_pipe[0]);
    snprintf(f->base, sizeof(f->base), "http://127.0.0.1:%u", f->port);
    ck_assert_int_eq(kvo_http_client_new(&f->http, 60000), KVO_OK);
}

static void fake_stop(fake *f) {
    kvo_http_client_free(f->http);
    close(f->ctl);
    int status = 0;
    ck_assert_int_eq(waitpid(f->pid, &status, 0), f->pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the fake service ended with status %d", status);
}

/* POST /fake/<what>?path=<path><more> with body. */
static void fake_set(fake *f, const char *what, const char *path,
                     const char *more, const void *body, size_t len) {
    char url[256];
    snprintf(url, sizeof(url), "%s/fake/%s?path=%s%s", f->base, what, path,
             more);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    ck_assert_int_eq(
        kvo_http_post(f->http, url, "application/json", body, len, &r), KVO_OK);
    ck_assert_int_eq(r.status, 200);
    kvo_http_resp_fini(&r);
}

/* Answer path with a HUGE_BYTES answer of kind 'n' or 'a' (answer_huge). */
static void fake_huge(fake *f, const char *path, char kind) {
    char more[16];
    snprintf(more, sizeof(more), "&kind=%c", kind);
    fake_set(f, "huge", path, more, "", 0);
}

/* Answer path with text (NUL-terminated). */
static void fake_answer(fake *f, const char *path, const char *text) {
    fake_set(f, "answer", path, "", text, strlen(text));
}

/* The same with HTTP status code. */
static void fake_answer_status(fake *f, const char *path, int code,
                               const char *text) {
    char more[32];
    snprintf(more, sizeof(more), "&status=%d", code);
    fake_set(f, "answer", path, more, text, strlen(text));
}

/* What kvo-check calls, pointed at the fake: one engine with one rank, an
 * indexer, a relay whose /stats is the fake's. */
typedef struct target {
    check_cfg cfg;
    chk_engine e;
    chk_env env;
    chk_relay rl;
    kvo_http_client *http;
} target;

static void target_init(target *t, const fake *f) {
    memset(t, 0, sizeof(*t));
    check_cfg_defaults(&t->cfg);
    t->env.cfg = &t->cfg;
    t->env.block_size = 16;
    ck_assert_int_eq(kvo_http_client_new(&t->http, 60000), KVO_OK);
    snprintf(t->e.url, sizeof(t->e.url), "%s", f->base);
    t->e.http = t->e.probe_http = t->http;
    t->e.n_ranks = 1;
    t->e.ranks[0].last_seq = -1;
    snprintf(t->env.indexer_url, sizeof(t->env.indexer_url), "%s", f->base);
    t->env.idx_http = t->env.idx_metrics = t->http;
    t->env.n_workers = t->env.dp_size = 1;
    t->rl.http = t->http;
    t->rl.metrics_port = f->port;
}

static void target_fini(target *t) { kvo_http_client_free(t->http); }

static const chk_prompt PROMPT = {
    .trace_form = false, .json = "[1,2,3,4]", .len = 9};

/* Each call kvo-check makes, as it makes it; what it read goes into got. */
typedef struct reading {
    int32_t hits[CHK_MAX_DP], cached[CHK_MAX_DP], cpu[CHK_MAX_DP];
    chk_completion c;
    char model[128];
    check_counters counters;
    uint32_t scores[1], host[1];
    chk_tiers tiers;
    chk_watermark wm;
    bool covered, live;
    kvo_buf metrics;
    chk_blocks blocks;
} reading;

static void reading_init(reading *g) {
    memset(g, 0, sizeof(*g));
    g->tiers.host = g->host;
    check_counters_init(&g->counters);
    kvo_buf_init(&g->metrics);
    chk_blocks_init(&g->blocks);
}

static void reading_fini(reading *g) {
    kvo_free(g->c.kv_transfer_params);
    check_counters_fini(&g->counters);
    chk_watermark_fini(&g->wm);
    kvo_buf_fini(&g->metrics);
    chk_blocks_fini(&g->blocks);
}

typedef kvo_status call_fn(target *t, reading *g, kvo_err *err);

static kvo_status call_state(target *t, reading *g, kvo_err *err) {
    (void)g;
    return chk_engine_state(&t->e, err);
}
static kvo_status call_counters(target *t, reading *g, kvo_err *err) {
    return chk_engine_counters(&t->e, &g->counters, err);
}
static kvo_status call_sources(target *t, reading *g, kvo_err *err) {
    (void)g;
    return chk_engine_sources(&t->e, err);
}
static kvo_status call_probe(target *t, reading *g, kvo_err *err) {
    return chk_engine_probe(&t->e, &PROMPT, 16, false, g->hits, g->cached,
                            g->cpu, err);
}
static kvo_status call_complete(target *t, reading *g, kvo_err *err) {
    kvo_free(g->c.kv_transfer_params);
    return chk_engine_complete(&t->e, "m", &PROMPT, 1, 0, NULL, &g->c, err);
}
static kvo_status call_model(target *t, reading *g, kvo_err *err) {
    return chk_engine_model(&t->e, g->model, sizeof(g->model), err);
}
static kvo_status call_query(target *t, reading *g, kvo_err *err) {
    static const uint64_t hashes[] = {1, 2}, pairs[] = {7, 3};
    return chk_index_query_wait(&t->env, hashes, 2, pairs, 1, 10, g->scores,
                                &g->tiers, &g->wm, &g->covered, &g->metrics,
                                err);
}
static kvo_status call_watermark(target *t, reading *g, kvo_err *err) {
    return chk_index_watermark(&t->env, &g->wm, err);
}
static kvo_status call_engine_blocks(target *t, reading *g, kvo_err *err) {
    return chk_engine_blocks(&t->e, 0, WIRE_TIER_DEVICE, &g->blocks, err);
}
static kvo_status call_index_blocks(target *t, reading *g, kvo_err *err) {
    return chk_index_blocks(&t->env, 0, 0, WIRE_TIER_DEVICE, true, &g->blocks,
                            err);
}
/* The relay's readiness poll says only "not live" and the status. */
static kvo_status call_relay(target *t, reading *g, kvo_err *err) {
    (void)err;
    return chk_relay_live(&t->rl, &g->live);
}

typedef struct endpoint {
    const char *method, *path;
    const char *good; /* an answer the call reads without complaint */
    call_fn *call;
    const char *query; /* what the call adds to the path ("" or NULL: none) */
} endpoint;

static const endpoint ENDPOINTS[] = {
    {"GET", "/kvo/state",
     "{\"ranks\":[{\"dp_rank\":0,\"last_seq\":5,\"resident_blocks\":1,"
     "\"free_blocks\":2,\"requests_finished\":3,\"cached_distinct\":2,"
     "\"cached_digest\":18446744073709551615,"
     "\"counters\":{\"render_errors\":0,\"nested\":{\"x\":4}}}]}",
     call_state, NULL},
    {"GET", "/kvo/state", NULL, call_counters, NULL}, /* the same answer */
    {"GET", "/kvo/event_sources",
     "[{\"endpoint\":\"tcp://127.0.0.1:5557\",\"replay_endpoint\":null,"
     "\"topic\":\"kv\",\"data_parallel_rank\":0}]",
     call_sources, NULL},
    {"POST", "/kvo/probe",
     "{\"block_size\":16,\"ranks\":[{\"dp_rank\":0,\"hit_blocks\":3}]}",
     call_probe, NULL},
    {"POST", "/v1/completions",
     "{\"usage\":{\"prompt_tokens\":4,\"prompt_tokens_details\":"
     "{\"cached_tokens\":0}},\"kvo\":{\"dp_rank\":0,\"last_seq\":null},"
     "\"kv_transfer_params\":{\"ids\":[1,2],\"host\":\"h\\u00e9\","
     "\"on\":true,\"r\":0.5,\"n\":null}}",
     call_complete, NULL},
    {"GET", "/v1/models", "{\"data\":[{\"id\":\"m\"}]}", call_model, NULL},
    {"POST", "/query_by_hash",
     "{\"scores\":[{\"worker_id\":0,\"dp_rank\":0,\"blocks\":2},"
     "{\"worker_id\":9,\"dp_rank\":0,\"blocks\":7}],\"covered\":true,"
     "\"watermark\":{\"publishers\":[{\"publisher_id\":7,"
     "\"zmq_seq_last\":3}]},\"metrics\":\"x 1\\n\"}",
     call_query, NULL},
    {"GET", "/watermark",
     "{\"publishers\":[{\"publisher_id\":18446744073709551615,"
     "\"zmq_seq_last\":null},{\"publisher_id\":7,\"zmq_seq_last\":3}]}",
     call_watermark, NULL},
    {"GET", "/stats", "{\"sources\":[{\"state\":\"live\"}]}", call_relay, NULL},
    {"GET", "/kvo/blocks",
     "{\"rank\":0,\"count\":2,\"digest\":7,\"blocks\":[[5,null],"
     "[18446744073709551615,5]],\"next\":null}",
     call_engine_blocks, "?rank=0"},
    {"GET", "/blocks",
     "{\"worker_id\":0,\"dp_rank\":0,\"count\":2,\"digest\":7,"
     "\"blocks\":[[5,null],[18446744073709551615,5]]}",
     call_index_blocks, "?worker_id=0&dp_rank=0"},
};

static const char *good_answer(size_t i) {
    while (!ENDPOINTS[i].good) i--;
    return ENDPOINTS[i].good;
}

/* Every endpoint's answer, each made by how(good, out). */
static void answer_all(fake *f, void (*how)(const char *good, kvo_buf *out)) {
    for (size_t i = 0; i < KVO_ARRAY_LEN(ENDPOINTS); i++) {
        if (!ENDPOINTS[i].good) continue;
        kvo_buf b;
        kvo_buf_init(&b);
        how(ENDPOINTS[i].good, &b);
        fake_set(f, "answer", ENDPOINTS[i].path, "", b.data, b.len);
        kvo_buf_fini(&b);
    }
}

/* "METHOD http://127.0.0.1:PORT/path: " + what: the start of an error. */
static void expect_error(const fake *f, size_t i, kvo_status st,
                         const kvo_err *err, const char *what) {
    const endpoint *ep = &ENDPOINTS[i];
    ck_assert_msg(st != KVO_OK, "%s %s: accepted", ep->method, ep->path);
    if (ep->call == call_relay) return; /* no err to read */
    char want[512];
    snprintf(want, sizeof(want), "%s %s%s%s: %s", ep->method, f->base, ep->path,
             ep->query ? ep->query : "", what);
    ck_assert_msg(strncmp(err->msg, want, strlen(want)) == 0,
                  "want \"%s...\"\n got \"%s\"", want, err->msg);
    ck_assert_int_eq(err->status, st);
}

static void as_is(const char *good, kvo_buf *out) {
    kvo_buf_append(out, good, strlen(good));
}

START_TEST(good_answers_are_read_field_by_field) {
    fake f;
    fake_start(&f);
    answer_all(&f, as_is);
    target t;
    target_init(&t, &f);
    reading g;
    reading_init(&g);
    for (size_t i = 0; i < KVO_ARRAY_LEN(ENDPOINTS); i++) {
        kvo_err err = {0};
        kvo_status st = ENDPOINTS[i].call(&t, &g, &err);
        ck_assert_msg(st == KVO_OK, "%s: %s", ENDPOINTS[i].path, err.msg);
        if (ENDPOINTS[i].call == call_sources) {
            ck_assert_str_eq(t.e.ranks[0].zmq, "tcp://127.0.0.1:5557");
            ck_assert_str_eq(t.e.ranks[0].replay, "");
            ck_assert_str_eq(t.e.ranks[0].topic, "kv");
        }
    }
    ck_assert_int_eq(t.e.ranks[0].last_seq, 5);
    ck_assert(t.e.ranks[0].has_set);
    ck_assert_uint_eq(t.e.ranks[0].set_count, 2);
    ck_assert_uint_eq(t.e.ranks[0].set_digest, UINT64_MAX);
    /* the last read: the index's blocks, as listed */
    ck_assert_uint_eq(g.blocks.count, 2);
    ck_assert_uint_eq(g.blocks.digest, 7);
    ck_assert_uint_eq(g.blocks.n, 2);
    ck_assert(g.blocks.v[0].hash == 5 && !g.blocks.v[0].has_parent);
    ck_assert(g.blocks.v[1].hash == UINT64_MAX && g.blocks.v[1].has_parent &&
              g.blocks.v[1].parent == 5);
    ck_assert(check_counters_get(&g.counters, "engine 0.0", "render_errors") ==
              0);
    ck_assert(check_counters_get(&g.counters, "engine 0.0", "nested.x") == 4);
    ck_assert(check_counters_get(&g.counters, "engine 0.0",
                                 "requests_finished") == 3);
    ck_assert_int_eq(g.hits[0], 3);
    ck_assert_int_eq(g.cached[0], 3);
    ck_assert_int_eq(g.cpu[0], -1); /* no CPU tier */
    ck_assert(!t.e.ranks[0].has_cpu_set);
    /* a hybrid model's full-attention run, a tiered cache's GPU run: what
     * the router must score, beside the engine's own hit */
    kvo_err err = {0};
    fake_answer(&f, "/kvo/probe",
                "{\"block_size\":16,\"ranks\":[{\"dp_rank\":0,"
                "\"hit_blocks\":3,\"full_blocks\":5}]}");
    ck_assert_int_eq(call_probe(&t, &g, &err), KVO_OK);
    ck_assert(g.hits[0] == 5 && g.cached[0] == 3 && g.cpu[0] == -1);
    fake_answer(&f, "/kvo/probe",
                "{\"block_size\":16,\"ranks\":[{\"dp_rank\":0,"
                "\"hit_blocks\":7,\"gpu\":2,\"cpu\":5}]}");
    ck_assert_int_eq(call_probe(&t, &g, &err), KVO_OK);
    ck_assert(g.hits[0] == 2 && g.cached[0] == 7 && g.cpu[0] == 5);
    ck_assert_int_eq(g.c.prompt_tokens, 4);
    ck_assert_int_eq(g.c.cached_tokens, 0);
    ck_assert(g.c.kvo);
    ck_assert_int_eq(g.c.dp_rank, 0);
    ck_assert_int_eq(g.c.last_seq, -1);
    /* passed on as JSON (members in key order, the string re-escaped) */
    ck_assert_str_eq(g.c.kv_transfer_params,
                     "{\"host\":\"h\xc3\xa9\",\"ids\":[1,2],\"n\":null,"
                     "\"on\":true,\"r\":0.5}");
    ck_assert_str_eq(g.model, "m");
    ck_assert_uint_eq(g.scores[0], 2); /* worker 9 is not ours */
    ck_assert_uint_eq(g.host[0], 2);   /* no tiers: the device run */
    ck_assert(!g.tiers.answered);
    ck_assert(g.covered);
    ck_assert(g.metrics.len == 4 && memcmp(g.metrics.data, "x 1\n", 4) == 0);
    /* the last read: /watermark's */
    ck_assert_uint_eq(g.wm.n, 2);
    bool present;
    ck_assert_int_eq(chk_watermark_get(&g.wm, UINT64_MAX, &present), -1);
    ck_assert(present);
    ck_assert_int_eq(chk_watermark_get(&g.wm, 7, NULL), 3);
    ck_assert(g.live);
    reading_fini(&g);
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

/* Every call, its endpoint answering how(its good answer): each must fail
 * with error, its message quoting quoted(good) (the bytes near the fault,
 * as the error shows them). The relay's readiness poll has no message: it
 * must say "not live". */
static void every_call_refuses(void (*how)(const char *good, kvo_buf *out),
                               const char *error,
                               void (*quoted)(const char *good, char *out,
                                              size_t n)) {
    fake f;
    fake_start(&f);
    answer_all(&f, how);
    target t;
    target_init(&t, &f);
    for (size_t i = 0; i < KVO_ARRAY_LEN(ENDPOINTS); i++) {
        reading g;
        reading_init(&g);
        kvo_err err = {0};
        kvo_status st = ENDPOINTS[i].call(&t, &g, &err);
        expect_error(&f, i, st, &err, error);
        if (ENDPOINTS[i].call == call_relay) {
            ck_assert(!g.live);
        } else {
            char q[128];
            quoted(good_answer(i), q, sizeof(q));
            ck_assert_msg(strstr(err.msg, q), "no %s in %s", q, err.msg);
        }
        reading_fini(&g);
    }
    target_fini(&t);
    fake_stop(&f);
}

static void with_trailing_bytes(const char *good, kvo_buf *out) {
    kvo_buf_printf(out, "%s x", good);
}

static void trailing_quoted(const char *good, char *out, size_t n) {
    snprintf(out, n, "%s x\")", good + strlen(good) - 10);
}

START_TEST(bytes_after_the_json_are_an_error_naming_the_call) {
    every_call_refuses(with_trailing_bytes,
                       "bad JSON answer: trailing characters after the JSON "
                       "value (byte ",
                       trailing_quoted);
}
END_TEST

/* A string member "junk" (an element for an array answer) holding a byte
 * that is not UTF-8 (0xC3 then '(' : a lead byte without its follower). */
static void with_bad_utf8(const char *good, kvo_buf *out) {
    kvo_buf_printf(out, "%c%s\"\xc3(\",%s", good[0],
                   good[0] == '{' ? "\"junk\":" : "", good + 1);
}

/* the byte is quoted escaped: the message stays printable */
static void bad_utf8_quoted(const char *good, char *out, size_t n) {
    (void)good;
    snprintf(out, n, "\"\\xc3(\"");
}

START_TEST(invalid_utf8_in_an_answer_is_an_error_naming_the_call) {
    every_call_refuses(with_bad_utf8,
                       "bad JSON answer: invalid UTF-8 in a string (byte ",
                       bad_utf8_quoted);
}
END_TEST

/* One call, one answer, what the error must say after "METHOD URL: ". */
typedef struct bad_case {
    size_t endpoint; /* into ENDPOINTS */
    const char *answer;
    const char *error;
} bad_case;

enum {
    EP_STATE,
    EP_COUNTERS,
    EP_SOURCES,
    EP_PROBE,
    EP_COMPLETE,
    EP_MODEL,
    EP_QUERY,
    EP_WATERMARK,
    EP_RELAY,
    EP_EBLOCKS,
    EP_IBLOCKS
};

#define M16 "mmmmmmmmmmmmmmmm"

static const bad_case BAD[] = {
    /* a hash beyond u64 */
    {EP_WATERMARK,
     "{\"publishers\":[{\"publisher_id\":18446744073709551616,"
     "\"zmq_seq_last\":1}]}",
     "bad JSON answer: integer out of range (byte 31, near "},
    {EP_QUERY,
     "{\"scores\":[{\"worker_id\":99999999999999999999,\"dp_rank\":0,"
     "\"blocks\":1}]}",
     "bad JSON answer: integer out of range (byte 24, "},
    /* counts that do not fit where they go: refused, not clamped */
    {EP_QUERY,
     "{\"scores\":[{\"worker_id\":0,\"dp_rank\":0,\"blocks\":4294967296}]}",
     "scores[0].blocks: expected an integer in [0, 4294967295], got "
     "4294967296"},
    {EP_WATERMARK,
     "{\"publishers\":[{\"publisher_id\":1,"
     "\"zmq_seq_last\":9223372036854775808}]}",
     "publishers[0].zmq_seq_last: expected null or an integer in [0, "
     "9223372036854775807], got 9223372036854775808"},
    {EP_STATE,
     "{\"ranks\":[{\"dp_rank\":0,\"last_seq\":18446744073709551615}]}",
     "ranks[0].last_seq: expected null or an integer in [0, "
     "9223372036854775807], got 18446744073709551615"},
    {EP_PROBE,
     "{\"block_size\":16,\"ranks\":[{\"dp_rank\":0,\"hit_blocks\":-1}]}",
     "ranks[0].hit_blocks: expected an integer in [0, 2147483647], got -1"},
    {EP_PROBE,
     "{\"block_size\":16,\"ranks\":[{\"dp_rank\":0,"
     "\"hit_blocks\":2147483648}]}",
     "ranks[0].hit_blocks: expected an integer in [0, 2147483647], got "
     "2147483648"},
    {EP_PROBE, "{\"block_size\":16,\"ranks\":[{\"dp_rank\":0}]}",
     "ranks[0].hit_blocks: expected an integer in [0, 2147483647], got "
     "nothing"},
    {EP_PROBE, "{\"block_size\":16,\"ranks\":[{\"dp_rank\":4294967296}]}",
     "ranks[0].dp_rank: expected null or an integer in [0, 4294967295], got "
     "4294967296"},
    {EP_COMPLETE,
     "{\"usage\":{\"prompt_tokens\":4,\"prompt_tokens_details\":"
     "{\"cached_tokens\":-16}}}",
     "usage.prompt_tokens_details.cached_tokens: expected null or an "
     "integer in [0, 9223372036854775807], got -16"},
    {EP_COMPLETE, "{\"usage\":{\"prompt_tokens\":4.5}}",
     "usage.prompt_tokens: expected null or an integer in [0, "
     "9223372036854775807], got 4.5"},
    {EP_COMPLETE, "{\"usage\":[4]}",
     "usage: expected null or an object, got an array"},
    {EP_SOURCES, "[{\"endpoint\":\"tcp://h:1\",\"data_parallel_rank\":16}]",
     "[0].data_parallel_rank: expected null or an integer in [0, 15], got 16"},
    {EP_SOURCES, "[{\"endpoint\":5}]",
     "[0].endpoint: expected a string, got 5"},
    {EP_SOURCES, "[7]", "[0]: expected an object, got 7"},
    {EP_SOURCES, "{\"endpoint\":\"tcp://h:1\"}",
     "expected an array of sources, got an object"},
    {EP_COUNTERS, "{\"ranks\":[{\"resident_blocks\":-1}]}",
     "ranks[0].resident_blocks: expected null or an integer in [0, "
     "9223372036854775807], got -1"},
    {EP_COUNTERS, "{\"ranks\":[{\"counters\":[1]}]}",
     "ranks[0].counters: expected null or an object, got an array"},
    {EP_QUERY, "{\"scores\":[{\"worker_id\":0,\"blocks\":1}]}",
     "scores[0].dp_rank: expected an integer in [0, 4294967295], got "
     "nothing"},
    {EP_QUERY,
     "{\"scores\":[],\"covered\":1,\"watermark\":{\"publishers\":[]},"
     "\"metrics\":\"\"}",
     "covered: expected true or false, got 1"},
    {EP_QUERY,
     "{\"scores\":[],\"covered\":true,\"watermark\":{\"publishers\":"
     "[{\"zmq_seq_last\":1}]},\"metrics\":\"\"}",
     "watermark.publishers[0].publisher_id: expected an integer in [0, "
     "18446744073709551615], got nothing"},
    {EP_QUERY,
     "{\"scores\":[],\"covered\":true,\"watermark\":{\"publishers\":[]},"
     "\"metrics\":3}",
     "metrics: expected null or a string, got 3"},
    /* a repeated key: which one would count? */
    {EP_PROBE, "{\"block_size\":16,\"block_size\":32,\"ranks\":[]}",
     "bad JSON answer: duplicate key \"block_size\" in an object (byte 0, "},
    /* what does not fit kvo-check's fields is refused, not cut */
    {EP_MODEL, "{\"data\":[{\"id\":\"" M16 M16 M16 M16 M16 M16 M16 M16 "\"}]}",
     "data[0].id: 128 bytes, at most 127"},
    {EP_MODEL, "{\"data\":[]}", "no model listed (use --model)"},
    {EP_WATERMARK, "",
     "bad JSON answer: the input ends where a value should "
     "start (byte 0, near \"\")"},
    {EP_WATERMARK, "{\"publishers\":[{\"publisher_id\":1}",
     "bad JSON answer: the input ends inside an array (byte 14, "},
    /* a tiered probe gives both runs */
    {EP_PROBE,
     "{\"block_size\":16,\"ranks\":[{\"dp_rank\":0,\"hit_blocks\":3,"
     "\"gpu\":3}]}",
     "ranks[0].cpu: expected an integer in [0, 2147483647], got nothing"},
    /* a tier's score: an object, cumulative (never below the device run) */
    {EP_QUERY,
     "{\"scores\":[{\"worker_id\":0,\"dp_rank\":0,\"blocks\":1,"
     "\"tiers\":[2]}]}",
     "scores[0].tiers: expected null or an object, got an array"},
    {EP_QUERY,
     "{\"scores\":[{\"worker_id\":0,\"dp_rank\":0,\"blocks\":5,"
     "\"tiers\":{\"host_pinned\":3}}]}",
     "scores[0].tiers.host_pinned: 3, below the device run 5 (a tier's score "
     "counts the device run too)"},
    {EP_QUERY,
     "{\"scores\":[{\"worker_id\":0,\"dp_rank\":0,\"blocks\":5,"
     "\"tiers\":{\"host_pinned\":4294967296}}]}",
     "scores[0].tiers.host_pinned: expected null or an integer in [0, "
     "4294967295], got 4294967296"},
    {EP_STATE, "{\"ranks\":[{\"dp_rank\":0,\"cpu_cached_distinct\":3}]}",
     "ranks[0].cpu_cached_digest: expected an integer in [0, "
     "18446744073709551615], got nothing"},
    /* a cached set's size without its digest */
    {EP_STATE, "{\"ranks\":[{\"dp_rank\":0,\"cached_distinct\":3}]}",
     "ranks[0].cached_digest: expected an integer in [0, "
     "18446744073709551615], got nothing"},
    /* block lists: each entry [hash, parent|null], as many as counted */
    {EP_EBLOCKS,
     "{\"count\":2,\"digest\":1,\"blocks\":[[5,null],[9]],\"next\":null}",
     "blocks[1]: expected [hash, parent|null], got an array"},
    {EP_EBLOCKS, "{\"count\":1,\"digest\":1,\"blocks\":[[5,-1]],\"next\":null}",
     "blocks[0][1]: expected a parent hash or null, got -1"},
    {EP_EBLOCKS, "{\"count\":1,\"digest\":1,\"blocks\":[[\"5\",null]]}",
     "blocks[0][0]: expected a block hash (an integer in [0, 2^64)), got a "
     "string"},
    {EP_EBLOCKS, "{\"count\":1,\"digest\":1,\"blocks\":[[5,null],[6,5]]}",
     "2 blocks listed, more than the count 1"},
    {EP_EBLOCKS, "{\"count\":1,\"blocks\":[]}",
     "digest: expected an integer in [0, 18446744073709551615], got nothing"},
    {EP_IBLOCKS, "{\"count\":2,\"digest\":1,\"blocks\":[],\"next\":4}",
     "an empty page with a next page"},
    {EP_IBLOCKS, "{\"count\":2,\"digest\":1}",
     "blocks: expected an array, got nothing"},
};

START_TEST(values_out_of_their_range_are_errors_never_clamped) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    for (size_t i = 0; i < KVO_ARRAY_LEN(BAD); i++) {
        const bad_case *b = &BAD[i];
        fake_answer(&f, ENDPOINTS[b->endpoint].path, b->answer);
        reading g;
        reading_init(&g);
        for (int k = 0; k < CHK_MAX_DP; k++) g.hits[k] = g.cpu[k] = -7;
        g.scores[0] = g.host[0] = 77;
        kvo_err err = {0};
        kvo_status st = ENDPOINTS[b->endpoint].call(&t, &g, &err);
        expect_error(&f, b->endpoint, st, &err, b->error);
        /* a failed read leaves what it would have written as it was */
        ck_assert_int_eq(g.hits[0], -7);
        ck_assert_int_eq(g.cpu[0], -7);
        ck_assert_uint_eq(g.scores[0], 77);
        ck_assert_uint_eq(g.host[0], 77);
        ck_assert_uint_eq(g.wm.n, 0);
        ck_assert_ptr_null(g.c.kv_transfer_params);
        ck_assert_uint_eq(g.counters.n, 0);
        ck_assert_uint_eq(g.blocks.n + g.blocks.count, 0);
        ck_assert(!t.e.ranks[0].has_set && !t.e.ranks[0].has_cpu_set);
        reading_fini(&g);
    }
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

/* Resident set size now, and the most it has been, in KiB. */
static long rss_now_kib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%ld %ld", &pages, &resident), 2);
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static long rss_peak_kib(void) {
    struct rusage ru;
    ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

START_TEST(a_200_mb_answer_is_refused_in_memory_bounded_by_its_size) {
    /* The client takes up to 1 GiB of body; reading it must not need more
     * than about the body again (json-c needed ~30 bytes per byte of an
     * integer array). Under a sanitizer the allocator keeps freed blocks in
     * quarantine: the bound is looser there, still far below 30x. */
    const long bound_kib = (long)(HUGE_BYTES / 1024) * (TC_SANITIZED ? 4 : 2);
    static const struct {
        char kind;
        const char *error;
    } huge[] = {
        {'n', "bad JSON answer: integer out of range (byte 31, "},
        {'a', "bad JSON answer: the document needs more than 67108864 bytes "
              "(byte "},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(huge); i++) {
        fake f;
        fake_start(&f);
        fake_huge(&f, "/watermark", huge[i].kind);
        target t;
        target_init(&t, &f);
        reading g;
        reading_init(&g);
        long before = rss_now_kib();
        kvo_err err = {0};
        kvo_status st = call_watermark(&t, &g, &err);
        long grew = rss_peak_kib() - before;
        expect_error(&f, EP_WATERMARK, st, &err, huge[i].error);
        ck_assert_msg(grew < bound_kib,
                      "reading a %zu MiB answer took %ld MiB (at most %ld)",
                      HUGE_BYTES >> 20, grew / 1024, bound_kib / 1024);
        reading_fini(&g);
        target_fini(&t);
        fake_stop(&f);
    }
}
END_TEST

START_TEST(block_lists_are_read_page_by_page_and_must_hold_still) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    reading g;
    reading_init(&g);
    /* three pages: after=5 and after=9 follow the first */
    fake_answer(&f, "/kvo/blocks",
                "{\"rank\":0,\"count\":4,\"digest\":3,\"blocks\":"
                "[[1,null],[5,1]],\"next\":5}");
    fake_answer(&f, "/kvo/blocks@5",
                "{\"rank\":0,\"count\":4,\"digest\":3,\"blocks\":"
                "[[7,5]],\"next\":9}");
    fake_answer(&f, "/kvo/blocks@9",
                "{\"rank\":0,\"count\":4,\"digest\":3,\"blocks\":"
                "[[9,7]],\"next\":null}");
    kvo_err err = {0};
    ck_assert_msg(call_engine_blocks(&t, &g, &err) == KVO_OK, "%s", err.msg);
    ck_assert_uint_eq(g.blocks.n, 4);
    ck_assert_uint_eq(g.blocks.v[3].hash, 9);
    ck_assert_uint_eq(g.blocks.v[3].parent, 7);
    /* fewer in all than the count */
    fake_answer(&f, "/kvo/blocks@9",
                "{\"rank\":0,\"count\":4,\"digest\":3,\"blocks\":[],"
                "\"next\":null}");
    ck_assert_int_eq(call_engine_blocks(&t, &g, &err), KVO_EPROTO);
    char want[200];
    snprintf(want, sizeof(want),
             "GET %s/kvo/blocks?rank=0: 3 blocks listed "
             "in all, the count says 4",
             f.base);
    ck_assert_str_eq(err.msg, want);
    /* the set changed between two pages: the side was not quiet */
    fake_answer(&f, "/kvo/blocks@5",
                "{\"rank\":0,\"count\":5,\"digest\":3,\"blocks\":"
                "[[7,5]],\"next\":9}");
    ck_assert_int_eq(call_engine_blocks(&t, &g, &err), KVO_ESTATE);
    snprintf(want, sizeof(want),
             "GET %s/kvo/blocks?rank=0&after=5: the set "
             "changed while it was listed (count 5 digest "
             "3, the first page said 4 and 3)",
             f.base);
    ck_assert_str_eq(err.msg, want);
    /* the last good read stays */
    ck_assert_uint_eq(g.blocks.n, 4);
    /* the index's digest alone: no list needed */
    fake_answer(&f, "/blocks",
                "{\"worker_id\":0,\"dp_rank\":0,\"count\":12,"
                "\"digest\":99}");
    ck_assert_int_eq(chk_index_blocks(&t.env, 0, 0, WIRE_TIER_DEVICE, false,
                                      &g.blocks, &err),
                     KVO_OK);
    ck_assert(g.blocks.count == 12 && g.blocks.digest == 99 && g.blocks.n == 0);
    reading_fini(&g);
    target_fini(&t);
    fake_stop(&f);
    /* an indexer without /blocks (404): KVO_ENOTFOUND, and a checkpoint
     * says the sets were not compared */
    fake_start(&f);
    target_init(&t, &f);
    reading_init(&g);
    ck_assert_int_eq(call_index_blocks(&t, &g, &err), KVO_ENOTFOUND);
    reading_fini(&g);
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

START_TEST(kvo_check_stops_with_the_error_naming_the_call) {
    /* The user's view: an engine whose /kvo/state holds a sequence number
     * beyond u64 stops kvo-check at setup (exit 2) with the error on
     * stderr, naming the call. */
    fake f;
    fake_start(&f);
    fake_answer(
        &f, "/kvo/event_sources",
        "[{\"endpoint\":\"tcp://127.0.0.1:1\",\"data_parallel_rank\":0}]");
    fake_answer(&f, "/kvo/state",
                "{\"ranks\":[{\"dp_rank\":0,"
                "\"last_seq\":18446744073709551616}]}");
    char *trace = kt_src_path("traces/mooncake_conversation_1000.jsonl");
    const char *args[] = {"--engines", f.base, "--trace", trace,
                          "--limit",   "1",    NULL};
    tc_run r;
    tc_check(&r, "bad-answer", args, 120);
    char *out = tc_slurp(r.log);
    if (r.exit_code != 2) tc_dump(&r);
    ck_assert_int_eq(r.exit_code, 2);
    char want[256];
    snprintf(want, sizeof(want),
             "GET %s/kvo/state: bad JSON answer: integer out of range "
             "(byte 34, near ",
             f.base);
    ck_assert_msg(strstr(out, want), "want \"%s\" in:\n%s", want, out);
    kvo_free(out);
    kvo_free(trace);
    tc_free(&r, false);
    fake_stop(&f);
}
END_TEST

/* A kvo-mocker whose /kvo/event_sources answer is malformed is an error,
 * not a real engine: only a 404 (the endpoint does not exist) makes
 * kvo-check treat the engine as a real one. */
/* --indexer-api dynamo: Dynamo's query answer, per worker and rank in
 * tokens (its "scores", or the per-tier "instances" of RFC #1403's shape),
 * and the Dynamo listener's watermark extension. */
START_TEST(dynamo_answers_are_read_in_tokens_and_must_agree) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    t.cfg.indexer_api = CHECK_API_DYNAMO;
    t.env.dp_size = 2;
    static const struct {
        const char *answer;
        uint32_t want0, want1; /* blocks of rank 0 and 1 */
        const char *error;     /* NULL: read */
    } cases[] = {
        {"{\"scores\":{\"0\":{\"0\":32,\"1\":16},\"9\":{\"0\":48}},"
         "\"frequencies\":[],\"instances\":{\"0\":{\"longest_matched\":32,"
         "\"gpu\":32,\"dp\":{\"0\":32,\"1\":16},\"cpu\":32,\"disk\":32},"
         "\"9\":{\"dp\":{\"0\":48}}}}",
         2, 1, NULL},
        {"{\"instances\":{\"0\":{\"dp\":{\"1\":64}}}}", 0, 4, NULL},
        {"{\"scores\":{}}", 0, 0, NULL},
        {"{\"scores\":{\"0\":{\"0\":32}},\"instances\":{\"0\":{\"dp\":"
         "{\"0\":16}}}}",
         0, 0,
         "scores and instances disagree: worker 0 rank 0 has 2 blocks in one, "
         "1 in the other"},
        {"{\"scores\":{\"0\":{\"0\":30}}}", 0, 0,
         "scores.0.0: 30 tokens is not a whole number of 16-token blocks"},
        {"{\"scores\":{\"w0\":{\"0\":16}}}", 0, 0,
         "scores: key \"w0\" is not a worker id"},
        {"{\"scores\":{\"0\":{\"0\":-16}}}", 0, 0,
         "scores.0.0: expected an integer in [0, 4294967295], got -16"},
        {"{\"instances\":{\"0\":{\"gpu\":16}}}", 0, 0,
         "instances.0.dp: expected an object, got nothing"},
        {"{\"frequencies\":[]}", 0, 0,
         "neither \"scores\" nor \"instances\" in the answer"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        fake_answer(&f, "/query_by_hash", cases[i].answer);
        static const uint64_t hashes[] = {1, 1ull << 63};
        uint32_t sc[2] = {77, 77};
        kvo_err err = {0};
        uint32_t host[2] = {77, 77};
        chk_tiers tiers = {.host = host, .answered = true};
        kvo_status st = chk_index_query(&t.env, hashes, 2, sc, &tiers, &err);
        if (!cases[i].error) {
            ck_assert_msg(st == KVO_OK, "case %zu: %s", i, err.msg);
            ck_assert_uint_eq(sc[0], cases[i].want0);
            ck_assert_uint_eq(sc[1], cases[i].want1);
            /* per-rank tiers are not in Dynamo's answer: the scores */
            ck_assert(host[0] == sc[0] && host[1] == sc[1]);
            ck_assert(!tiers.answered);
            continue;
        }
        ck_assert_msg(st != KVO_OK && strstr(err.msg, cases[i].error),
                      "case %zu: want \"%s\", got \"%s\"", i, cases[i].error,
                      err.msg);
        ck_assert_uint_eq(sc[0], 77); /* left as it was */
    }
    /* the request: signed hashes, the model name */
    t.env.model_name[0] = 'm';
    fake_answer(&f, "/watermark",
                "{\"instances\":[{\"instance_id\":0,\"dp_rank\":1,"
                "\"zmq_seq_last\":4},{\"instance_id\":1,\"dp_rank\":0,"
                "\"zmq_seq_last\":null}]}");
    chk_watermark wm = {0};
    kvo_err err = {0};
    ck_assert_int_eq(chk_index_watermark(&t.env, &wm, &err), KVO_OK);
    ck_assert_int_eq(chk_watermark_get(&wm, chk_rank_key(0, 1), NULL), 4);
    bool present = false;
    ck_assert_int_eq(chk_watermark_get(&wm, chk_rank_key(1, 0), &present), -1);
    ck_assert(present);
    chk_watermark_get(&wm, chk_rank_key(0, 0), &present);
    ck_assert(!present);
    chk_watermark_fini(&wm);
    fake_answer(&f, "/watermark", "{\"publishers\":[]}");
    ck_assert_int_ne(chk_index_watermark(&t.env, &wm, &err), KVO_OK);
    ck_assert_msg(strstr(err.msg, "instances: expected an array"), "%s",
                  err.msg);
    chk_watermark_fini(&wm);
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

/* POST /lookup: the request carries the engine's chain, the answer says
 * where the tokens of a block not held are held under another hash. */
START_TEST(lookup_answers_tell_where_the_tokens_are) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    check_chain_block b[2] = {
        {.hash = 5, .tokens_hash = 50, .has_parent = true, .parent = 4},
        {.hash = 6, .tokens_hash = 60, .has_parent = true, .parent = 5}};
    check_lookup l[2];
    kvo_err err = {0};
    fake_answer(&f, "/lookup",
                "{\"blocks\":[{\"block_hash\":5,\"held\":true,"
                "\"tokens_hash\":50,\"parent_hash\":4,\"in_set\":true,"
                "\"others\":0,\"other_holders\":[],\"tokens_found\":null},"
                "{\"block_hash\":6,\"held\":false,\"tokens_hash\":null,"
                "\"parent_hash\":null,\"in_set\":false,\"others\":0,"
                "\"other_holders\":[],\"tokens_found\":{\"under\":"
                "\"parent\",\"block_hash\":61}}]}");
    ck_assert_int_eq(chk_index_lookup(&t.env, 0, 0, b, 2, l, &err), KVO_OK);
    ck_assert(l[0].held && l[0].found == CHECK_FOUND_NONE);
    ck_assert(!l[1].held && l[1].found == CHECK_FOUND_UNDER_PARENT &&
              l[1].found_hash == 61);
    fake_answer(&f, "/lookup",
                "{\"blocks\":[{\"block_hash\":5,\"held\":false,"
                "\"others\":0,\"other_holders\":[],\"tokens_found\":"
                "{\"under\":\"sideways\",\"block_hash\":1}}]}");
    ck_assert_int_ne(chk_index_lookup(&t.env, 0, 0, b, 1, l, &err), KVO_OK);
    ck_assert_msg(strstr(err.msg, "blocks[0].tokens_found.under: expected"),
                  "%s", err.msg);
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

/* A watermark that never came: the relay's /stats says at which stage the
 * batch stopped. */
START_TEST(a_stalled_batch_is_placed_by_the_relays_stats) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    snprintf(t.rl.stage, sizeof(t.rl.stage), "0.1");
    static const struct {
        const char *stats, *want;
    } cases[] = {
        {"{\"nats_connected\":true,\"nats_buffered\":0,\"sources\":[{"
         "\"dp_rank\":1,\"state\":\"replaying\",\"connected\":false,"
         "\"last_seq\":6}]}",
         "relay 0.1 has not received seq 9 from the engine: its last is 6 "
         "(source replaying, ZMQ disconnected)"},
        {"{\"nats_connected\":false,\"nats_buffered\":4,\"sources\":[{"
         "\"dp_rank\":1,\"state\":\"live\",\"connected\":true,"
         "\"last_seq\":9}]}",
         "relay 0.1 received seq 9 but its NATS connection is down (4 "
         "messages buffered)"},
        {"{\"nats_connected\":true,\"sources\":[{\"dp_rank\":1,"
         "\"state\":\"live\",\"connected\":true,\"last_seq\":12}]}",
         "relay 0.1 received seq 9 (its last is 12) and is connected to NATS: "
         "it was lost between NATS and the indexer"},
        {"{\"nats_connected\":true,\"sources\":[{\"dp_rank\":0,"
         "\"state\":\"live\",\"connected\":true,\"last_seq\":12}]}",
         "relay 0.1 has no source for rank 1"},
        {"{\"sources\":[]}", "relay 0.1: its /stats did not say where seq 9 "
                             "is"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        fake_answer(&f, "/stats", cases[i].stats);
        char out[400];
        chk_relay_where(&t.rl, 1, 9, out, sizeof(out));
        ck_assert_msg(strncmp(out, cases[i].want, strlen(cases[i].want)) == 0,
                      "case %zu:\n want %s\n got  %s", i, cases[i].want, out);
    }
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

START_TEST(a_malformed_sources_answer_is_not_a_real_engine) {
    fake f;
    fake_start(&f);
    fake_answer(&f, "/kvo/event_sources", "[{\"endpoint\": 5}] trailing");
    char *trace = kt_src_path("traces/mooncake_conversation_1000.jsonl");
    const char *args[] = {"--engines", f.base, "--trace", trace,
                          "--limit",   "1",    NULL};
    tc_run r;
    tc_check(&r, "bad-sources", args, 120);
    char *out = tc_slurp(r.log);
    if (r.exit_code != 2) tc_dump(&r);
    ck_assert_int_eq(r.exit_code, 2);
    char want[256];
    snprintf(want, sizeof(want), "GET %s/kvo/event_sources: bad JSON answer",
             f.base);
    ck_assert_msg(strstr(out, want), "want \"%s\" in:\n%s", want, out);
    kvo_free(out);
    kvo_free(trace);
    tc_free(&r, false);
    fake_stop(&f);
}
END_TEST

/* The kvo API's scores with the lower tiers: "tiers": {"host_pinned": N}
 * per (worker, rank), cumulative; without it the device run stands. */
START_TEST(query_answers_carry_each_ranks_host_pinned_score) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    t.env.dp_size = 2;
    static const struct {
        const char *answer;
        uint32_t sc0, sc1, host0, host1;
        bool answered;
    } cases[] = {
        /* a GPU run then a CPU run; a CPU run alone ("blocks": 0); a
         * worker that is not ours */
        {"{\"scores\":[{\"worker_id\":0,\"dp_rank\":0,\"blocks\":3,"
         "\"tiers\":{\"host_pinned\":7}},{\"worker_id\":0,\"dp_rank\":1,"
         "\"blocks\":0,\"tiers\":{\"host_pinned\":2}},{\"worker_id\":9,"
         "\"dp_rank\":0,\"blocks\":1,\"tiers\":{\"host_pinned\":4}}]}",
         3, 0, 7, 2, true},
        /* an index without tiers */
        {"{\"scores\":[{\"worker_id\":0,\"dp_rank\":1,\"blocks\":4}]}", 0, 4, 0,
         4, false},
        /* tiers, none of them host_pinned; and a null one */
        {"{\"scores\":[{\"worker_id\":0,\"dp_rank\":0,\"blocks\":2,"
         "\"tiers\":{\"disk\":5}},{\"worker_id\":0,\"dp_rank\":1,"
         "\"blocks\":1,\"tiers\":null}]}",
         2, 1, 2, 1, true},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        fake_answer(&f, "/query_by_hash", cases[i].answer);
        static const uint64_t hashes[] = {1, 2};
        uint32_t sc[2] = {77, 77}, host[2] = {77, 77};
        chk_tiers tiers = {.host = host, .answered = !cases[i].answered};
        kvo_err err = {0};
        ck_assert_msg(chk_index_query(&t.env, hashes, 2, sc, &tiers, &err) ==
                          KVO_OK,
                      "case %zu: %s", i, err.msg);
        ck_assert(sc[0] == cases[i].sc0 && sc[1] == cases[i].sc1);
        ck_assert_msg(host[0] == cases[i].host0 && host[1] == cases[i].host1,
                      "case %zu: host %u %u", i, host[0], host[1]);
        ck_assert(tiers.answered == cases[i].answered);
        /* a caller that does not want them */
        ck_assert_int_eq(chk_index_query(&t.env, hashes, 2, sc, NULL, &err),
                         KVO_OK);
    }
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

/* The CPU tier's block sets: kvo-mocker's /kvo/blocks?tier=cpu and
 * kvo-indexer's /blocks?tier=host_pinned; an indexer that refuses the
 * parameter says so (KVO_EUNSUPPORTED), for the tier only. */
START_TEST(block_sets_of_a_tier_are_asked_for_by_name) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    reading g;
    reading_init(&g);
    kvo_err err = {0};
    fake_answer(&f, "/kvo/blocks",
                "{\"rank\":0,\"count\":0,\"digest\":0,\"blocks\":[],"
                "\"next\":null}");
    fake_answer(&f, "/kvo/blocks~cpu",
                "{\"rank\":0,\"tier\":\"cpu\",\"count\":1,\"digest\":3,"
                "\"blocks\":[[9,null]],\"next\":null}");
    ck_assert_int_eq(
        chk_engine_blocks(&t.e, 0, WIRE_TIER_HOST_PINNED, &g.blocks, &err),
        KVO_OK);
    ck_assert(g.blocks.n == 1 && g.blocks.v[0].hash == 9);
    ck_assert_int_eq(
        chk_engine_blocks(&t.e, 0, WIRE_TIER_DEVICE, &g.blocks, &err), KVO_OK);
    ck_assert(g.blocks.n == 0);
    ck_assert_int_eq(
        chk_engine_blocks(&t.e, 0, WIRE_TIER_DISK, &g.blocks, &err),
        KVO_EINVAL);
    fake_answer(&f, "/kvo/blocks~cpu", "{\"count\":1}");
    ck_assert_int_ne(
        chk_engine_blocks(&t.e, 0, WIRE_TIER_HOST_PINNED, &g.blocks, &err),
        KVO_OK);
    char want[256];
    snprintf(want, sizeof(want), "GET %s/kvo/blocks?rank=0&tier=cpu: ", f.base);
    ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "%s", err.msg);
    /* the index's host_pinned set, digest only */
    fake_answer(&f, "/blocks~host_pinned",
                "{\"worker_id\":0,\"dp_rank\":0,\"tier\":\"host_pinned\","
                "\"count\":4,\"digest\":8}");
    ck_assert_int_eq(chk_index_blocks(&t.env, 0, 0, WIRE_TIER_HOST_PINNED,
                                      false, &g.blocks, &err),
                     KVO_OK);
    ck_assert(g.blocks.count == 4 && g.blocks.digest == 8);
    /* an indexer of the device tier only refuses it */
    fake_answer_status(&f, "/blocks~host_pinned", 400,
                       "{\"error\":\"unknown parameter tier\"}");
    ck_assert_int_eq(chk_index_blocks(&t.env, 0, 0, WIRE_TIER_HOST_PINNED,
                                      false, &g.blocks, &err),
                     KVO_EUNSUPPORTED);
    snprintf(want, sizeof(want),
             "GET %s/blocks?worker_id=0&dp_rank=0&tier=host_pinned&"
             "digest_only=1: HTTP 400: {\"error\":\"unknown parameter tier\"}",
             f.base);
    ck_assert_str_eq(err.msg, want);
    /* a 400 to the device set is an error like any other */
    fake_answer_status(&f, "/blocks", 400, "{}");
    ck_assert_int_eq(chk_index_blocks(&t.env, 0, 0, WIRE_TIER_DEVICE, false,
                                      &g.blocks, &err),
                     KVO_EHTTP);
    reading_fini(&g);
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

/* What fn writes to a FILE, as a malloc'd string. */
static char *capture_summary(const check_result *r) {
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    check_report_summary(f, r, 0);
    long n = ftell(f);
    ck_assert(n >= 0);
    char *buf = kvo_malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    rewind(f);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* "{"count":N,"digest":D,"blocks":[...],"next":null}" of v[0, n). */
static void set_answer(char *out, size_t outsz, const char *head,
                       check_block *v, size_t n) {
    size_t len = (size_t)snprintf(
        out, outsz,
        "{%s\"count\":%zu,\"digest\":"
        "%llu,\"blocks\":[",
        head, n, (unsigned long long)check_blocks_digest(v, n));
    for (size_t i = 0; i < n && len < outsz; i++) {
        if (v[i].has_parent)
            len += (size_t)snprintf(out + len, outsz - len, "%s[%llu,%llu]",
                                    i ? "," : "", (unsigned long long)v[i].hash,
                                    (unsigned long long)v[i].parent);
        else
            len +=
                (size_t)snprintf(out + len, outsz - len, "%s[%llu,null]",
                                 i ? "," : "", (unsigned long long)v[i].hash);
    }
    if (len < outsz) snprintf(out + len, outsz - len, "],\"next\":null}");
}

#define BLK(h, p)                                                              \
    ((check_block){.hash = (h), .parent = (p), .has_parent = true})
#define ROOT(h) ((check_block){.hash = (h)})

/* A checkpoint against the fake: the engine's /kvo/state tells a CPU set,
 * which is compared with the index's host_pinned set as the GPU set is --
 * digests, then lists where they differ -- and a difference fails the
 * checkpoint naming the tier. An indexer that refuses the tier leaves the
 * CPU sets not compared, and the summary says so. */
START_TEST(a_checkpoint_compares_the_cpu_tier_and_names_it) {
    fake f;
    fake_start(&f);
    target t;
    target_init(&t, &f);
    t.e.mocker = true;
    snprintf(t.e.name, sizeof(t.e.name), "kvo-mocker[0]");
    check_block gpu[] = {ROOT(1), BLK(2, 1)};
    check_block ecpu[] = {ROOT(5), BLK(6, 5)};
    check_block icpu[] = {ROOT(5), BLK(6, 5), BLK(7, 6)}; /* 7: stale */
    char a[512];
    snprintf(a, sizeof(a),
             "{\"ranks\":[{\"dp_rank\":0,\"last_seq\":4,\"cached_distinct\":2,"
             "\"cached_digest\":%llu,\"cpu_cached_distinct\":2,"
             "\"cpu_cached_digest\":%llu}]}",
             (unsigned long long)check_blocks_digest(gpu, 2),
             (unsigned long long)check_blocks_digest(ecpu, 2));
    fake_answer(&f, "/kvo/state", a);
    set_answer(a, sizeof(a), "", gpu, 2);
    fake_answer(&f, "/blocks", a);
    set_answer(a, sizeof(a), "\"tier\":\"cpu\",", ecpu, 2);
    fake_answer(&f, "/kvo/blocks~cpu", a);
    set_answer(a, sizeof(a), "", icpu, 3);
    fake_answer(&f, "/blocks~host_pinned", a);
    kvo_err err = {0};
    ck_assert_msg(chk_engine_state(&t.e, &err) == KVO_OK, "%s", err.msg);
    ck_assert(t.e.ranks[0].has_cpu_set && t.e.ranks[0].cpu_set_count == 2);

    chk_run r;
    memset(&r, 0, sizeof(r));
    r.cfg = &t.cfg;
    r.env = t.env;
    r.env.engines = &t.e;
    r.env.n_workers = r.env.n_engines = 1;
    r.n_slots = 1;
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.before_prompt = -1;
    c.final = true;
    c.sweep_first = -1;
    check_slot_sets ss[1];
    memset(ss, 0, sizeof(ss));
    ck_assert_msg(chk_compare_sets(&r, 0, &c, ss) == KVO_OK, "%s", r.err.msg);
    /* the GPU sets: equal by their digests, no list fetched */
    ck_assert(c.sets && ss[0].compared && !ss[0].listed);
    ck_assert_uint_eq(c.diff.n[0] + c.diff.n[1] + c.diff.n[2], 0);
    /* the CPU sets: listed, one block in the index only */
    ck_assert_uint_eq(c.cpu.ranks, 1);
    ck_assert_uint_eq(c.cpu.compared, 1);
    ck_assert_uint_eq(c.cpu.listed, 1);
    ck_assert(c.cpu.engine_blocks == 2 && c.cpu.index_blocks == 3);
    ck_assert_uint_eq(c.cpu.diff.n[CHECK_DIFF_INDEX_ONLY], 1);
    ck_assert_uint_eq(c.cpu.diff.first[0].index.hash, 7);
    ck_assert_uint_eq(c.listed_blocks, 5);
    ck_assert(check_checkpoint_failed(&c));
    check_result *res;
    ck_assert_int_eq(check_result_new(&res), KVO_OK);
    ck_assert_int_eq(check_result_slots(res, 1, 1, 16), KVO_OK);
    ck_assert_int_eq(check_result_checkpoint(res, &c, ss), KVO_OK);
    check_verdict_decide(res, &res->verdict);
    ck_assert(!res->verdict.pass);
    ck_assert_int_eq(res->verdict.reason, CHECK_REASON_STALE_BLOCK);
    ck_assert_str_eq(res->verdict.cause,
                     "stale block: the final checkpoint 1 after 0 requests: "
                     "tier cpu: 1 blocks in the index but not the engine; "
                     "first: worker 0 rank 0: block 7 (parent 6) in the "
                     "index, not the engine (no prompt of the run reaches "
                     "it)");
    ck_assert_str_eq(res->verdict.where, "checkpoint 1: block sets (tier cpu)");
    check_result_free(res);

    /* an indexer of the device tier only: not compared, and said */
    fake_answer_status(&f, "/blocks~host_pinned", 400,
                       "{\"error\":\"unknown parameter\"}");
    memset(&c, 0, sizeof(c));
    c.number = 1;
    c.before_prompt = -1;
    c.sweep_first = -1;
    memset(ss, 0, sizeof(ss));
    ck_assert_msg(chk_compare_sets(&r, 0, &c, ss) == KVO_OK, "%s", r.err.msg);
    ck_assert(c.sets && c.cpu.ranks == 1 && c.cpu.compared == 0);
    ck_assert_str_eq(c.cpu.note,
                     "the indexer refuses GET /blocks?tier=host_pinned (HTTP "
                     "400): an indexer of the device tier only");
    ck_assert(!check_checkpoint_failed(&c));
    ck_assert_int_eq(check_result_new(&res), KVO_OK);
    ck_assert_int_eq(check_result_slots(res, 1, 1, 16), KVO_OK);
    ck_assert_int_eq(check_result_checkpoint(res, &c, ss), KVO_OK);
    char *sum = capture_summary(res);
    ck_assert_msg(strstr(sum, "block sets compared at 1 of them, the CPU "
                              "tier's at 0 of 1\n") &&
                      strstr(sum, "CPU tier not compared: the indexer "
                                  "refuses GET /blocks?tier=host_pinned"),
                  "%s", sum);
    kvo_free(sum);
    check_result_free(res);
    /* Dynamo's API: the GPU tier only, and said */
    t.cfg.indexer_api = CHECK_API_DYNAMO;
    memset(&c, 0, sizeof(c));
    memset(ss, 0, sizeof(ss));
    ck_assert_msg(chk_compare_sets(&r, 0, &c, ss) == KVO_OK, "%s", r.err.msg);
    ck_assert(c.sets && ss[0].compared);
    ck_assert(c.cpu.ranks == 1 && c.cpu.compared == 0);
    ck_assert_str_eq(c.cpu.note,
                     "--indexer-api dynamo judges the GPU tier only");
    target_fini(&t);
    fake_stop(&f);
}
END_TEST

Suite *suite_answers(void) {
    Suite *s = suite_create("answers");
    TCase *tc = tcase_create("answers");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, good_answers_are_read_field_by_field);
    tcase_add_test(tc, bytes_after_the_json_are_an_error_naming_the_call);
    tcase_add_test(tc, invalid_utf8_in_an_answer_is_an_error_naming_the_call);
    tcase_add_test(tc, values_out_of_their_range_are_errors_never_clamped);
    tcase_add_test(tc, block_lists_are_read_page_by_page_and_must_hold_still);
    tcase_add_test(tc,
                   a_200_mb_answer_is_refused_in_memory_bounded_by_its_size);
    tcase_add_test(tc, kvo_check_stops_with_the_error_naming_the_call);
    tcase_add_test(tc, a_malformed_sources_answer_is_not_a_real_engine);
    tcase_add_test(tc, dynamo_answers_are_read_in_tokens_and_must_agree);
    tcase_add_test(tc, lookup_answers_tell_where_the_tokens_are);
    tcase_add_test(tc, a_stalled_batch_is_placed_by_the_relays_stats);
    tcase_add_test(tc, query_answers_carry_each_ranks_host_pinned_score);
    tcase_add_test(tc, block_sets_of_a_tier_are_asked_for_by_name);
    tcase_add_test(tc, a_checkpoint_compares_the_cpu_tier_and_names_it);
    suite_add_tcase(s, tc);
    return s;
}
