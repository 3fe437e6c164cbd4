/* test_dynamo: kvo-indexer --dynamo-http against the behaviour of Dynamo's
 * standalone indexer (lib/kv-router/src/services/indexer/server.rs, its
 * registry and its tests): every route, status code and JSON shape, then a
 * real kvo-mocker registered through /register whose blocks /query and
 * /query_by_hash find, in tokens, until /unregister empties it. */
#include "idx_test.h"
#include "kvo_http.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#define WAIT_POLLS 400 /* readiness polls (50 ms apart) before giving up */
#define POLL_US 50000

typedef struct dy {
    kt_nats nats;
    kt_proc idx;
    kvo_http_client *c;
    char base[64];
    kvo_http_resp resp;
} dy;

/* kvo-indexer with --dynamo-http, and the arguments of extra (NULL: none,
 * else NULL-terminated, at most 4). */
static void dy_start_with(dy *e, const char *const *extra) {
    memset(e, 0, sizeof(*e));
    kt_nats_start(&e->nats);
    const char *args[16] = {
        "--nats",        e->nats.url,   "--http",        "127.0.0.1:0",
        "--dynamo-http", "127.0.0.1:0", "--no-recovery", NULL};
    for (int i = 0; extra && extra[i]; i++) {
        ck_assert_int_lt(i, 4);
        args[7 + i] = extra[i];
    }
    kt_proc_start(&e->idx, "kvo-indexer", args);
    uint16_t port = kt_proc_logged_port(
        &e->idx, "dynamo API listening on http://127.0.0.1:");
    snprintf(e->base, sizeof(e->base), "http://127.0.0.1:%u", port);
    char url[128];
    snprintf(url, sizeof(url), "%s/health", e->base);
    kt_proc_wait_http(&e->idx, url, 10000);
    ck_assert_int_eq(kvo_http_client_new(&e->c, 10000), KVO_OK);
    kvo_http_resp_init(&e->resp);
}

static void dy_start(dy *e) { dy_start_with(e, NULL); }

static void dy_stop(dy *e) {
    kvo_http_resp_fini(&e->resp);
    kvo_http_client_free(e->c);
    ck_assert_int_eq(kt_proc_stop(&e->idx), 0);
    kt_nats_stop(&e->nats);
}

/* POST body (ctype NULL: none) or GET (body NULL); the status, the body
 * as text in e->resp. */
static long call(dy *e, const char *path, const char *ctype, const char *body,
                 size_t len) {
    char url[256];
    snprintf(url, sizeof(url), "%s%s", e->base, path);
    kvo_status st = body ? kvo_http_post(e->c, url, ctype, body, len, &e->resp)
                         : kvo_http_get(e->c, url, &e->resp);
    ck_assert_msg(st == KVO_OK, "%s: %s", path, kvo_strerror(st));
    kvo_buf_cstr(&e->resp.body);
    return e->resp.status;
}

static long post(dy *e, const char *path, const char *body) {
    return call(e, path, "application/json", body, strlen(body));
}

static const char *text(const dy *e) { return (const char *)e->resp.body.data; }

/* The answer is code with exactly the JSON want. */
static void expect(dy *e, const char *path, const char *body, long code,
                   const char *want) {
    long got = body ? post(e, path, body) : call(e, path, NULL, NULL, 0);
    ck_assert_msg(got == code, "%s %s -> %ld, not %ld: %s", path,
                  body ? body : "(GET)", got, code, text(e));
    tt_json_eq(json_tokener_parse(text(e)), want);
}

/* The answer is code with {"error": "..."}, the message naming what. */
static void expect_error(dy *e, const char *path, const char *body, long code,
                         const char *names) {
    long got = body ? post(e, path, body) : call(e, path, NULL, NULL, 0);
    ck_assert_msg(got == code, "%s %s -> %ld, not %ld: %s", path,
                  body ? body : "(GET)", got, code, text(e));
    json_object *j = json_tokener_parse(text(e)), *m;
    ck_assert_msg(j && json_object_object_get_ex(j, "error", &m) &&
                      json_object_is_type(m, json_type_string),
                  "%s: no {\"error\"} in %s", path, text(e));
    if (names)
        ck_assert_msg(strstr(json_object_get_string(m), names),
                      "%s: '%s' lacks %s", path, json_object_get_string(m),
                      names);
    json_object_put(j);
}

static json_object *get_json(dy *e, const char *path) {
    ck_assert_int_eq(call(e, path, NULL, NULL, 0), 200);
    json_object *j = json_tokener_parse(text(e));
    ck_assert_msg(j != NULL, "%s: not JSON: %s", path, text(e));
    return j;
}

static void reg(dy *e, uint64_t id, const char *ep, const char *model,
                const char *group, uint32_t bs, int rank) {
    char b[512];
    int n = snprintf(b, sizeof(b),
                     "{\"instance_id\": %" PRIu64 ", \"endpoint\": \"%s\", "
                     "\"model_name\": \"%s\", \"block_size\": %u",
                     id, ep, model, bs);
    if (group)
        n += snprintf(b + n, sizeof(b) - n, ", \"routing_group\": \"%s\"",
                      group);
    if (rank >= 0)
        n += snprintf(b + n, sizeof(b) - n, ", \"dp_rank\": %d", rank);
    snprintf(b + n, sizeof(b) - n, "}");
    expect(e, "/register", b, 201, "{\"status\":\"ok\"}");
}

/* ---- /register ------------------------------------------------------------*/

START_TEST(register_answers_201_then_409_for_each_conflict) {
    dy e;
    dy_start(&e);
    reg(&e, 20, "tcp://127.0.0.1:15590", "llama3", "acme", 4, -1);
    /* the same (instance, rank) again */
    expect_error(
        &e, "/register",
        "{\"instance_id\": 20, \"endpoint\": \"tcp://127.0.0.1:15591\", "
        "\"model_name\": \"llama3\", \"routing_group\": \"acme\", "
        "\"block_size\": 4, \"dp_rank\": 0}",
        409, "dp_rank 0");
    /* the instance under another model, or another group */
    expect_error(
        &e, "/register",
        "{\"instance_id\": 20, \"endpoint\": \"tcp://127.0.0.1:15591\", "
        "\"model_name\": \"mistral\", \"block_size\": 4, \"dp_rank\": 1}",
        409, "model=llama3");
    expect_error(
        &e, "/register",
        "{\"instance_id\": 20, \"endpoint\": \"tcp://127.0.0.1:15591\", "
        "\"model_name\": \"llama3\", \"block_size\": 4, \"dp_rank\": 1}",
        409, "routing_group=acme");
    /* another instance of the partition with another block size */
    expect_error(
        &e, "/register",
        "{\"instance_id\": 21, \"endpoint\": \"tcp://127.0.0.1:15591\", "
        "\"model_name\": \"llama3\", \"routing_group\": \"acme\", "
        "\"block_size\": 8}",
        409, "block_size");
    /* another rank of the same instance, and unknown members are ignored */
    expect(&e, "/register",
           "{\"instance_id\": 20, \"endpoint\": \"tcp://127.0.0.1:15591\", "
           "\"model_name\": \"llama3\", \"routing_group\": \"acme\", "
           "\"block_size\": 4, \"dp_rank\": 1, \"tenant_id\": \"t\", "
           "\"additional_salt\": null, \"something_new\": [1, {}]}",
           201, "{\"status\":\"ok\"}");
    /* endpoints Dynamo accepts: wildcard host, port 0, ipc, inproc */
    reg(&e, 30, "tcp://*:5558", "m", NULL, 16, -1);
    reg(&e, 31, "tcp://127.0.0.1:0", "m", NULL, 16, -1);
    reg(&e, 32, "ipc:///tmp/kvo-dynamo-test.sock", "m", NULL, 16, -1);
    reg(&e, 33, "inproc://listener", "m", NULL, 16, -1);
    dy_stop(&e);
}
END_TEST

START_TEST(register_refuses_bad_bodies_with_400_415_422_413) {
    dy e;
    dy_start(&e);
    static const char *const bad_endpoints[] = {
        "tcp://host", "tcp://:5558",      "udp://host:5558", "not-an-endpoint",
        "tcp://",     "tcp://host:99999", "tcp://::1:5",     "tcp://[::1:5"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad_endpoints); i++) {
        char b[256];
        snprintf(b, sizeof(b),
                 "{\"instance_id\": 1, \"endpoint\": \"%s\", \"model_name\": "
                 "\"m\", \"block_size\": 16}",
                 bad_endpoints[i]);
        expect_error(&e, "/register", b, 400, bad_endpoints[i]);
    }
    expect_error(&e, "/register",
                 "{\"instance_id\": 1, \"endpoint\": \"tcp://h:1\", "
                 "\"replay_endpoint\": \"tcp://h\", \"model_name\": \"m\", "
                 "\"block_size\": 16}",
                 400, "replay endpoint");
    /* JSON of the wrong shape: 422, naming the field */
    expect_error(&e, "/register",
                 "{\"endpoint\": \"tcp://h:1\", \"model_name\": \"m\", "
                 "\"block_size\": 16}",
                 422, "instance_id");
    expect_error(&e, "/register",
                 "{\"instance_id\": -1, \"endpoint\": \"tcp://h:1\", "
                 "\"model_name\": \"m\", \"block_size\": 16}",
                 422, "instance_id");
    expect_error(&e, "/register",
                 "{\"instance_id\": 1, \"endpoint\": \"tcp://h:1\", "
                 "\"model_name\": \"m\", \"block_size\": 4294967296}",
                 422, "block_size");
    expect_error(&e, "/register",
                 "{\"instance_id\": 1, \"endpoint\": \"tcp://h:1\", "
                 "\"model_name\": 5, \"block_size\": 16}",
                 422, "model_name");
    expect_error(&e, "/register",
                 "{\"instance_id\": 1, \"endpoint\": \"tcp://h:1\", "
                 "\"model_name\": \"m\", \"routing_group\": null, "
                 "\"block_size\": 16}",
                 422, "routing_group");
    expect_error(&e, "/register",
                 "{\"instance_id\": 1.5, \"endpoint\": \"tcp://h:1\", "
                 "\"model_name\": \"m\", \"block_size\": 16}",
                 422, "instance_id");
    expect_error(&e, "/register",
                 "{\"instance_id\": 18446744073709551616, \"endpoint\": "
                 "\"tcp://h:1\", \"model_name\": \"m\", \"block_size\": 16}",
                 422, NULL);
    expect_error(&e, "/register", "[1, 2]", 422, NULL);
    /* not JSON: 400 */
    expect_error(&e, "/register", "not json", 400, NULL);
    expect_error(&e, "/register", "{\"instance_id\": 1", 400, NULL);
    expect_error(&e, "/register", "{} {}", 400, NULL);
    /* no JSON content type: 415 */
    const char *ok = "{\"instance_id\": 1, \"endpoint\": \"tcp://h:1\", "
                     "\"model_name\": \"m\", \"block_size\": 16}";
    ck_assert_int_eq(call(&e, "/register", "text/plain", ok, strlen(ok)), 415);
    ck_assert_int_eq(call(&e, "/register", NULL, ok, strlen(ok)), 415);
    /* over axum's 2 MiB on /register (but not on /query: 8 MiB there) */
    size_t big = (2u << 20) + 64;
    char *b = malloc(big + 64);
    ck_assert_ptr_nonnull(b);
    int h = snprintf(b, 64, "{\"model_name\": \"m\", \"x\": \"");
    memset(b + h, 'a', big);
    strcpy(b + h + big, "\"}");
    ck_assert_int_eq(call(&e, "/register", "application/json", b, strlen(b)),
                     413);
    expect_error(&e, "/query", b, 422, "token_ids");
    free(b);
    /* nothing was registered by any of it */
    tt_json_eq(get_json(&e, "/workers"), "[]");
    dy_stop(&e);
}
END_TEST

/* ---- /workers -------------------------------------------------------------*/

START_TEST(workers_lists_registrations_with_their_filters) {
    dy e;
    dy_start(&e);
    tt_json_eq(get_json(&e, "/workers"), "[]");
    reg(&e, 21, "tcp://127.0.0.1:15591", "mistral", "other", 8, -1);
    reg(&e, 20, "tcp://127.0.0.1:15590", "llama3", "acme", 4, -1);
    reg(&e, 20, "tcp://127.0.0.1:15592", "llama3", "acme", 4, 3);
    json_object *all = get_json(&e, "/workers");
    ck_assert_uint_eq(json_object_array_length(all), 2);
    json_object *w = json_object_array_get_idx(all, 0); /* sorted by id */
    ck_assert_uint_eq(tt_json_u64(w, "instance_id"), 20);
    ck_assert_str_eq(json_object_get_string(tt_json_at(w, "model_name")),
                     "llama3");
    ck_assert_str_eq(json_object_get_string(tt_json_at(w, "routing_group")),
                     "acme");
    ck_assert_str_eq(json_object_get_string(tt_json_at(w, "source")), "zmq");
    ck_assert_uint_eq(tt_json_u64(w, "block_size"), 4);
    ck_assert(!json_object_object_get_ex(w, "tenant_id", NULL));
    ck_assert_str_eq(json_object_get_string(tt_json_at(w, "endpoints.3")),
                     "tcp://127.0.0.1:15592");
    ck_assert_str_eq(
        json_object_get_string(tt_json_at(w, "listeners.0.endpoint")),
        "tcp://127.0.0.1:15590");
    const char *st = json_object_get_string(tt_json_at(w, "status"));
    ck_assert_msg(!strcmp(st, "pending") || !strcmp(st, "active"), "%s", st);
    json_object_put(all);
    json_object *f = get_json(&e, "/workers?model_name=llama3");
    ck_assert_uint_eq(json_object_array_length(f), 1);
    ck_assert_uint_eq(
        tt_json_u64(json_object_array_get_idx(f, 0), "instance_id"), 20);
    json_object_put(f);
    f = get_json(&e, "/workers?routing_group=other");
    ck_assert_uint_eq(json_object_array_length(f), 1);
    ck_assert_uint_eq(
        tt_json_u64(json_object_array_get_idx(f, 0), "instance_id"), 21);
    json_object_put(f);
    f = get_json(&e, "/workers?tenant_id=acme"); /* not a filter */
    ck_assert_uint_eq(json_object_array_length(f), 2);
    json_object_put(f);
    tt_json_eq(get_json(&e, "/workers?model_name=nonexistent"), "[]");
    tt_json_eq(get_json(&e, "/workers?model_name=llama3&routing_group=other"),
               "[]");
    dy_stop(&e);
}
END_TEST

/* ---- /unregister ----------------------------------------------------------*/

START_TEST(unregister_answers_200_or_404_and_drops_empty_partitions) {
    dy e;
    dy_start(&e);
    const char *q = "{\"token_ids\": [1, 2, 3, 4], \"model_name\": \"m\", "
                    "\"routing_group\": \"g\"}";
    expect_error(&e, "/unregister",
                 "{\"instance_id\": 1, \"model_name\": \"m\"}", 404,
                 "not found");
    reg(&e, 1, "tcp://127.0.0.1:15590", "m", "g", 4, 0);
    reg(&e, 1, "tcp://127.0.0.1:15591", "m", "g", 4, 1);
    reg(&e, 2, "tcp://127.0.0.1:15592", "m", "g", 4, 0);
    expect_error(&e, "/unregister",
                 "{\"instance_id\": 1, \"model_name\": \"x\"}", 404, "model=m");
    expect_error(&e, "/unregister",
                 "{\"instance_id\": 1, \"model_name\": \"m\", "
                 "\"routing_group\": \"h\"}",
                 404, "routing_group=g");
    expect_error(&e, "/unregister",
                 "{\"instance_id\": 1, \"model_name\": \"m\", "
                 "\"routing_group\": \"g\", \"dp_rank\": 7}",
                 404, "dp_rank 7");
    expect_error(&e, "/unregister", "{\"model_name\": \"m\"}", 422,
                 "instance_id");
    expect_error(&e, "/unregister", "{\"instance_id\": 1}", 422, "model_name");
    /* one rank: the other stays */
    expect(&e, "/unregister",
           "{\"instance_id\": 1, \"model_name\": \"m\", \"routing_group\": "
           "\"g\", \"dp_rank\": 1}",
           200, "{\"status\":\"ok\"}");
    json_object *w = get_json(&e, "/workers?model_name=m");
    ck_assert_uint_eq(json_object_array_length(w), 2);
    json_object *ls = tt_json_at(json_object_array_get_idx(w, 0), "listeners");
    ck_assert_int_eq(json_object_object_length(ls), 1);
    json_object_put(w);
    /* no routing_group: every group of the model; no dp_rank: every rank */
    expect(&e, "/unregister", "{\"instance_id\": 1, \"model_name\": \"m\"}",
           200, "{\"status\":\"ok\"}");
    expect(&e, "/query", q, 200,
           "{\"scores\":{},\"frequencies\":[],\"instances\":{}}");
    expect(&e, "/unregister",
           "{\"instance_id\": 2, \"model_name\": \"m\", \"routing_group\": "
           "\"g\", \"dp_rank\": 0}",
           200, "{\"status\":\"ok\"}");
    /* the partition went with its last worker */
    expect_error(&e, "/query", q, 404, "model=m routing_group=g");
    tt_json_eq(get_json(&e, "/workers"), "[]");
    tt_json_eq(get_json(&e, "/dump"), "{}");
    dy_stop(&e);
}
END_TEST

/* ---- /query, /query_by_hash ----------------------------------------------*/

START_TEST(queries_check_their_partition_and_integer_types) {
    dy e;
    dy_start(&e);
    expect_error(&e, "/query", "{\"token_ids\": [1], \"model_name\": \"m\"}",
                 404, "no indexer for model=m routing_group=default");
    reg(&e, 5, "tcp://127.0.0.1:15590", "m", NULL, 4, -1);
    const char *empty = "{\"scores\":{},\"frequencies\":[],\"instances\":{}}";
    expect(&e, "/query",
           "{\"token_ids\": [1, 2, 3, 4, 5], \"model_name\": \"m\"}", 200,
           empty);
    expect(&e, "/query",
           "{\"token_ids\": [], \"model_name\": \"m\", \"routing_group\": "
           "\"default\", \"lora_name\": null, \"cache_salt\": \"s\"}",
           200, empty);
    expect_error(
        &e, "/query",
        "{\"token_ids\": [1], \"model_name\": \"m\", \"routing_group\": "
        "\"other\"}",
        404, "routing_group=other");
    /* token ids are u32 */
    expect_error(&e, "/query", "{\"token_ids\": [-1], \"model_name\": \"m\"}",
                 422, "token_ids");
    expect_error(&e, "/query",
                 "{\"token_ids\": [4294967296], \"model_name\": \"m\"}", 422,
                 "token_ids[0]");
    expect_error(&e, "/query", "{\"token_ids\": [1.0], \"model_name\": \"m\"}",
                 422, "token_ids");
    expect_error(&e, "/query", "{\"token_ids\": \"1\", \"model_name\": \"m\"}",
                 422, "token_ids");
    expect_error(&e, "/query", "{\"model_name\": \"m\"}", 422, "token_ids");
    expect_error(&e, "/query", "{\"token_ids\": [1]}", 422, "model_name");
    expect_error(
        &e, "/query",
        "{\"token_ids\": [1], \"model_name\": \"m\", \"lora_name\": 3}", 422,
        "lora_name");
    /* block hashes are i64: negative is fine, 2^63 is not */
    expect(&e, "/query_by_hash",
           "{\"block_hashes\": [-9223372036854775808, -1, 0, "
           "9223372036854775807], \"model_name\": \"m\", \"cache_salt\": null}",
           200, empty);
    expect_error(
        &e, "/query_by_hash",
        "{\"block_hashes\": [9223372036854775808], \"model_name\": \"m\"}", 422,
        "block_hashes");
    expect_error(&e, "/query_by_hash", "{\"model_name\": \"m\"}", 422,
                 "block_hashes");
    /* a cache salt is the caller's to fold in: 400, found before the 404 */
    expect_error(&e, "/query_by_hash",
                 "{\"block_hashes\": [1], \"model_name\": \"nope\", "
                 "\"cache_salt\": \"s\"}",
                 400, "cache_salt");
    expect_error(&e, "/query_by_hash",
                 "{\"block_hashes\": [1], \"model_name\": \"nope\"}", 404,
                 "model=nope");
    /* routes and methods */
    expect_error(&e, "/query", NULL, 405, NULL);
    expect_error(&e, "/workers", "{}", 405, NULL);
    expect_error(&e, "/nope", NULL, 404, NULL);
    expect_error(&e, "/counters", NULL, 404, NULL); /* kvo's API is elsewhere */
    expect_error(&e, "/watermark", "{}", 405, NULL);
    expect_error(&e, "/lookup", NULL, 405, NULL);
    dy_stop(&e);
}
END_TEST

/* ---- /health, /dump, /metrics, hostile bodies -----------------------------*/

START_TEST(health_dump_and_metrics_have_dynamos_shapes) {
    dy e;
    dy_start(&e);
    ck_assert_int_eq(call(&e, "/health", NULL, NULL, 0), 200);
    ck_assert_uint_eq(e.resp.body.len, 0);
    tt_json_eq(get_json(&e, "/dump"), "{}");
    reg(&e, 9, "tcp://127.0.0.1:15590", "llama3", "acme", 4, -1);
    tt_json_eq(get_json(&e, "/dump"),
               "{\"llama3:acme\":{\"block_size\":4,\"events\":[]}}");
    expect_error(&e, "/query", "{\"token_ids\": [-1], \"model_name\": \"m\"}",
                 422, NULL);
    ck_assert_int_eq(call(&e, "/metrics", NULL, NULL, 0), 200);
    const char *m = text(&e);
    ck_assert_ptr_nonnull(strstr(m, "dynamo_kvindexer_models 1\n"));
    ck_assert_ptr_nonnull(strstr(m, "dynamo_kvindexer_workers 1\n"));
    ck_assert_ptr_nonnull(strstr(m, "dynamo_kvindexer_requests_total{endpoint="
                                    "\"/register\",method=\"POST\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(m, "dynamo_kvindexer_errors_total{endpoint=\"/"
                                    "query\",status_class=\"4xx\"} 1\n"));
    ck_assert_ptr_nonnull(
        strstr(m, "dynamo_kvindexer_listeners{status=\"failed\"} 0\n"));
    ck_assert_ptr_nonnull(strstr(m, "kvo_relay_batches_applied_total"));
    /* hostile bodies: answered, never a crash */
    static const char *const hostile[] = {
        "",
        "{",
        "\"\\ud800\"",
        "{\"a\": \"\xff\"}",
        "{\"a\": 1, \"a\": 2}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
        "["
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
        "[",
        "{\"token_ids\": [1e400], \"model_name\": \"m\"}",
        "nul\0l"};
    static const char *const routes[] = {"/register", "/unregister", "/query",
                                         "/query_by_hash"};
    for (size_t r = 0; r < KVO_ARRAY_LEN(routes); r++)
        for (size_t i = 0; i < KVO_ARRAY_LEN(hostile); i++) {
            long c =
                call(&e, routes[r], "application/json", hostile[i],
                     i == KVO_ARRAY_LEN(hostile) - 1 ? 5 : strlen(hostile[i]));
            ck_assert_msg(c == 400 || c == 422, "%s %zu -> %ld", routes[r], i,
                          c);
        }
    ck_assert_int_eq(call(&e, "/health", NULL, NULL, 0), 200);
    dy_stop(&e);
}
END_TEST

/* ---- end to end: a real kvo-mocker ----------------------------------------*/

typedef struct mk {
    kt_proc p;
    uint16_t http, zmq, replay;
    char base[64];
} mk;

static void mk_start(mk *m) {
    memset(m, 0, sizeof(*m));
    ck_assert(kvo_free_port(&m->http) == KVO_OK);
    ck_assert(kvo_free_port(&m->zmq) == KVO_OK);
    ck_assert(kvo_free_port(&m->replay) == KVO_OK);
    char hp[8], zp[8], rp[8];
    snprintf(hp, sizeof(hp), "%u", m->http);
    snprintf(zp, sizeof(zp), "%u", m->zmq);
    snprintf(rp, sizeof(rp), "%u", m->replay);
    snprintf(m->base, sizeof(m->base), "http://127.0.0.1:%u", m->http);
    const char *args[] = {"--port",           hp,   "--zmq-port",       zp,
                          "--replay-port",    rp,   "--num-gpu-blocks", "64",
                          "--block-size",     "16", "--log-level",      "warn",
                          "--require-events", NULL};
    kt_proc_start(&m->p, "kvo-mocker", args);
    char url[96];
    snprintf(url, sizeof(url), "%s/health", m->base);
    kt_proc_wait_http(&m->p, url, 10000);
}

/* The worker's listener status, polled until it is want. */
static void wait_status(dy *e, const char *want) {
    for (int i = 0; i < WAIT_POLLS; i++) {
        json_object *w = get_json(e, "/workers");
        bool done = json_object_array_length(w) == 1 &&
                    !strcmp(json_object_get_string(tt_json_at(
                                json_object_array_get_idx(w, 0), "status")),
                            want);
        json_object_put(w);
        if (done) return;
        usleep(POLL_US);
    }
    ck_abort_msg("the listener never became %s", want);
}

/* The query's answer, polled until it is not empty (or fails the test). */
static void wait_answer(dy *e, const char *path, const char *body,
                        const char *want) {
    for (int i = 0; i < WAIT_POLLS; i++) {
        ck_assert_int_eq(post(e, path, body), 200);
        if (!strstr(text(e), "\"scores\":{}")) break;
        usleep(POLL_US);
    }
    tt_json_eq(json_tokener_parse(text(e)), want);
}

START_TEST(a_registered_mocker_is_indexed_until_unregistered) {
    dy e;
    dy_start(&e);
    mk m;
    mk_start(&m);
    char b[1024];
    snprintf(b, sizeof(b),
             "{\"instance_id\": 7, \"endpoint\": \"tcp://127.0.0.1:%u\", "
             "\"replay_endpoint\": \"tcp://127.0.0.1:%u\", \"model_name\": "
             "\"kvo-mock\", \"block_size\": 16}",
             m.zmq, m.replay);
    expect(&e, "/register", b, 201, "{\"status\":\"ok\"}");
    wait_status(&e, "active");
    /* 100 prompt tokens, 1 generated: the engine holds 6 full blocks */
    uint64_t tok[100];
    kvo_buf p, q, h;
    kvo_buf_init(&p);
    kvo_buf_init(&q);
    kvo_buf_init(&h);
    kvo_buf_printf(&p, "[");
    for (size_t i = 0; i < 100; i++) {
        tok[i] = 1000 + i * 7;
        kvo_buf_printf(&p, "%s%" PRIu64, i ? "," : "", tok[i]);
    }
    kvo_buf_printf(&p, "]");
    kvo_buf_cstr(&p);
    char *body = NULL;
    size_t blen = strlen((const char *)p.data) + 128;
    body = malloc(blen);
    snprintf(body, blen,
             "{\"model\": \"kvo-mock\", \"max_tokens\": 1, \"prompt\": %s}",
             (const char *)p.data);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    char url[128];
    snprintf(url, sizeof(url), "%s/v1/completions", m.base);
    ck_assert(kvo_http_post(e.c, url, "application/json", body, strlen(body),
                            &r) == KVO_OK);
    ck_assert_int_eq(r.status, 200);
    kvo_http_resp_fini(&r);
    free(body);
    const char *want =
        "{\"scores\":{\"7\":{\"0\":96}},\"frequencies\":[],"
        "\"instances\":{\"7\":{\"longest_matched\":96,\"gpu\":96,"
        "\"dp\":{\"0\":96},\"cpu\":96,\"disk\":96}}}";
    kvo_buf_printf(&q, "{\"token_ids\": %s, \"model_name\": \"kvo-mock\"}",
                   (const char *)p.data);
    kvo_buf_cstr(&q);
    wait_answer(&e, "/query", (const char *)q.data, want);
    /* the same blocks by their router hashes, as signed integers */
    uint64_t hs[6];
    ck_assert_uint_eq(idx_prompt_hash(tok, 100, 16, NULL, NULL, hs), 6);
    kvo_buf_printf(&h, "{\"model_name\": \"kvo-mock\", \"block_hashes\": [");
    bool neg = false;
    for (size_t i = 0; i < 6; i++) {
        kvo_buf_printf(&h, "%s%" PRId64, i ? "," : "", (int64_t)hs[i]);
        neg |= (int64_t)hs[i] < 0;
    }
    kvo_buf_printf(&h, "]}");
    kvo_buf_cstr(&h);
    ck_assert_msg(neg, "no hash above 2^63-1: the signed form goes untested");
    expect(&e, "/query_by_hash", (const char *)h.data, 200, want);
    /* a salted query is another prefix */
    kvo_buf_reset(&q);
    kvo_buf_printf(&q,
                   "{\"token_ids\": %s, \"model_name\": \"kvo-mock\", "
                   "\"cache_salt\": \"s\"}",
                   (const char *)p.data);
    kvo_buf_cstr(&q);
    expect(&e, "/query", (const char *)q.data, 200,
           "{\"scores\":{},\"frequencies\":[],\"instances\":{}}");
    json_object *d = get_json(&e, "/dump");
    ck_assert_uint_eq(
        json_object_array_length(tt_json_at(d, "kvo-mock:default.events")), 6);
    json_object_put(d);
    /* kvo's extensions: the rank's applied ZMQ sequence (a client waits on
     * it exactly), and the views of kvo-indexer's own listener */
    json_object *wm = get_json(&e, "/watermark");
    json_object *w0 = json_object_array_get_idx(tt_json_at(wm, "instances"), 0);
    ck_assert_uint_eq(json_object_array_length(tt_json_at(wm, "instances")), 1);
    ck_assert_uint_eq(tt_json_u64(w0, "instance_id"), 7);
    ck_assert_uint_eq(tt_json_u64(w0, "dp_rank"), 0);
    json_object *z = tt_json_at(w0, "zmq_seq_last");
    ck_assert_msg(z && json_object_is_type(z, json_type_int), "%s",
                  json_object_to_json_string(wm));
    json_object_put(wm);
    json_object *bs = get_json(&e, "/blocks?worker_id=7&dp_rank=0");
    ck_assert_uint_eq(tt_json_u64(bs, "count"), 6);
    ck_assert_uint_eq(json_object_array_length(tt_json_at(bs, "blocks")), 6);
    json_object_put(bs);
    tt_json_eq(get_json(&e, "/blocks?worker_id=8&dp_rank=0&digest_only=1"),
               "{\"worker_id\":8,\"dp_rank\":0,\"count\":0,\"digest\":0}");
    expect_error(&e, "/blocks?worker_id=7", NULL, 400, "dp_rank");
    bs = get_json(&e, "/blocks?worker_id=7&dp_rank=0&limit=1");
    char lk[160];
    snprintf(lk, sizeof(lk),
             "{\"worker_id\": 7, \"dp_rank\": 0, \"block_hashes\": [%" PRIu64
             "]}",
             json_object_get_uint64(json_object_array_get_idx(
                 json_object_array_get_idx(tt_json_at(bs, "blocks"), 0), 0)));
    json_object_put(bs);
    ck_assert_int_eq(post(&e, "/lookup", lk), 200);
    ck_assert_msg(strstr(text(&e), "\"held\":true"), "%s", text(&e));
    ck_assert_int_eq(call(&e, "/metrics", NULL, NULL, 0), 200);
    ck_assert_msg(strstr(text(&e), "kvo_indexer_blocks_total{op=\"stored\"} 6"),
                  "%s", text(&e));
    /* unregister empties it */
    expect(&e, "/unregister",
           "{\"instance_id\": 7, \"model_name\": \"kvo-mock\"}", 200,
           "{\"status\":\"ok\"}");
    expect_error(&e, "/query_by_hash", (const char *)h.data, 404, "kvo-mock");
    tt_json_eq(get_json(&e, "/dump"), "{}");
    /* registered again: the engine's blocks come back through its replay */
    expect(&e, "/register", b, 201, "{\"status\":\"ok\"}");
    wait_answer(&e, "/query_by_hash", (const char *)h.data, want);
    ck_assert_int_eq(call(&e, "/metrics", NULL, NULL, 0), 200);
    ck_assert_ptr_nonnull(
        strstr(text(&e), "kvo_relay_rejects_total{kind=\"token_count\"} 0"));
    kvo_buf_fini(&p);
    kvo_buf_fini(&q);
    kvo_buf_fini(&h);
    ck_assert_int_eq(kt_proc_stop(&m.p), 0);
    dy_stop(&e);
}
END_TEST

/* A counter of GET /metrics (the line "\n<name> <value>"). */
static uint64_t metric_u64(dy *e, const char *name) {
    ck_assert_int_eq(call(e, "/metrics", NULL, NULL, 0), 200);
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(text(e), key);
    ck_assert_msg(p != NULL, "no %s in /metrics", name);
    return strtoull(p + strlen(key), NULL, 10);
}

/* With an apply budget of 1 s (the most), requests that come while a
 * listener's backlog applies are still answered before the backlog is
 * read: reading stops as soon as one waits (fails when only the budget
 * lets HTTP in: apply_pauses_total stays 0). The test is the engine: an
 * XPUB that sends 20,000 batches of one 32-block store (640,000 blocks,
 * a tenth of a second or more to apply), then asks at once. */
START_TEST(a_request_is_answered_while_a_backlog_applies) {
    enum { BATCHES = 20000, BLOCKS = 32, BS = 16 };
    dy e;
    const char *extra[] = {"--apply-budget-us", "1000000", NULL};
    dy_start_with(&e, extra);
    void *zctx = zmq_ctx_new(), *xpub = zmq_socket(zctx, ZMQ_XPUB);
    int zero = 0, wait_ms = 10000;
    zmq_setsockopt(xpub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(xpub, ZMQ_SNDHWM, &zero, sizeof(zero)); /* none dropped */
    zmq_setsockopt(xpub, ZMQ_RCVTIMEO, &wait_ms, sizeof(wait_ms));
    ck_assert_int_eq(zmq_bind(xpub, "tcp://127.0.0.1:*"), 0);
    char ep[64], body[256];
    size_t eplen = sizeof(ep);
    zmq_getsockopt(xpub, ZMQ_LAST_ENDPOINT, ep, &eplen);
    snprintf(body, sizeof(body),
             "{\"instance_id\": 5, \"endpoint\": \"%s\", \"model_name\": "
             "\"m\", \"block_size\": %d}",
             ep, BS);
    expect(&e, "/register", body, 201, "{\"status\":\"ok\"}");
    uint8_t sub[64];
    ck_assert_msg(zmq_recv(xpub, sub, sizeof(sub), 0) >= 1,
                  "the listener never subscribed");
    wait_status(&e, "active");
    static uint64_t tok[BLOCKS * BS];
    wire_hash hs[BLOCKS];
    wire_event ev = {.type = WIRE_EV_STORED,
                     .layout = WIRE_LAYOUT_MAP,
                     .n_hashes = BLOCKS,
                     .hashes = hs,
                     .n_tokens = BLOCKS * BS,
                     .token_ids = tok,
                     .block_size = {true, BS}};
    wire_batch b;
    wire_batch_init(&b);
    kvo_buf out;
    kvo_buf_init(&out);
    for (uint64_t k = 0; k < BATCHES; k++) {
        for (uint64_t i = 0; i < BLOCKS * BS; i++) tok[i] = k * 1000 + i;
        for (uint64_t i = 0; i < BLOCKS; i++)
            hs[i] = (wire_hash){.kind = WIRE_HASH_UINT, .key = k * 100 + i + 1};
        b.ts = 1.0;
        b.batch_len = 3;
        b.n_events = 1;
        b.events = &ev;
        kvo_buf_reset(&out);
        ck_assert_int_eq(wire_batch_encode(&b, WIRE_FMT_MAP, 0, &out), KVO_OK);
        uint8_t seq[8];
        wire_seq_put(seq, k);
        ck_assert_int_ge(zmq_send(xpub, "", 0, ZMQ_SNDMORE), 0);
        ck_assert_int_ge(zmq_send(xpub, seq, 8, ZMQ_SNDMORE), 0);
        ck_assert_int_ge(zmq_send(xpub, out.data, out.len, 0), 0);
    }
    b.events = NULL; /* not the arena's */
    b.n_events = 0;
    wire_batch_fini(&b);
    kvo_buf_fini(&out);
    uint64_t all = (uint64_t)BATCHES * BLOCKS, pauses = 0, stored = 0;
    for (int polls = 0; polls < 100000; polls++) { /* each is a request */
        pauses = metric_u64(&e, "kvo_indexer_apply_pauses_total");
        stored = metric_u64(&e, "kvo_indexer_blocks_total{op=\"stored\"}");
        if (pauses || stored == all) break;
    }
    ck_assert_msg(pauses > 0,
                  "no request was answered while blocks applied (%llu of "
                  "%llu stored when the requests stopped)",
                  (unsigned long long)stored, (unsigned long long)all);
    /* and every block is there in the end: reading that stopped for HTTP
     * went on where it stopped */
    for (int i = 0; i < WAIT_POLLS && stored < all; i++) {
        usleep(POLL_US);
        stored = metric_u64(&e, "kvo_indexer_blocks_total{op=\"stored\"}");
    }
    ck_assert_uint_eq(stored, all);
    zmq_close(xpub);
    zmq_ctx_term(zctx);
    dy_stop(&e);
}
END_TEST

Suite *suite_dynamo(void) {
    Suite *s = suite_create("dynamo");
    TCase *t = tcase_create("api");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, register_answers_201_then_409_for_each_conflict);
    tcase_add_test(t, register_refuses_bad_bodies_with_400_415_422_413);
    tcase_add_test(t, workers_lists_registrations_with_their_filters);
    tcase_add_test(t, unregister_answers_200_or_404_and_drops_empty_partitions);
    tcase_add_test(t, queries_check_their_partition_and_integer_types);
    tcase_add_test(t, health_dump_and_metrics_have_dynamos_shapes);
    suite_add_tcase(s, t);
    TCase *e2e = tcase_create("mocker");
    tcase_set_timeout(e2e, 120);
    tcase_add_test(e2e, a_registered_mocker_is_indexed_until_unregistered);
    tcase_add_test(e2e, a_request_is_answered_while_a_backlog_applies);
    suite_add_tcase(s, e2e);
    return s;
}
