/* test_service: the built kvo-indexer against a real nats-server: the
 * shared event-plane vectors published with nats.c (with and without
 * KVO-Zmq-Seq headers, a duplicate, a gap, garbage), then every HTTP
 * endpoint, 4xx answers, and a clean SIGTERM shutdown. */
#include "idx_test.h"
#include "kvo_http.h"

#include <nats/nats.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SUBJECT "namespace.dynamo.component.backend.kv-events"
#define H1 14643705804678351452ull
#define H2 16777012769546811212ull

typedef struct env {
    kt_nats nats;
    kt_proc idx;
    natsConnection *nc;
    kvo_http_client *http;
    char base[64];
    kvo_http_resp resp;
} env;

/* kvo-indexer on e's nats-server (--http on a free port, --block-size 4,
 * the token, then extra), ready to answer. */
static void env_indexer(env *e, const char *token, const char *const extra[]) {
    const char *args[16] = {"--nats",      e->nats.url,    "--http",
                            "127.0.0.1:0", "--block-size", "4"};
    int n = 6;
    if (token) {
        args[n++] = "--nats-token";
        args[n++] = token;
    }
    for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    kt_proc_start(&e->idx, "kvo-indexer", args);
    uint16_t port =
        kt_proc_logged_port(&e->idx, "listening on http://127.0.0.1:");
    snprintf(e->base, sizeof(e->base), "http://127.0.0.1:%u", port);
    char url[128];
    snprintf(url, sizeof(url), "%s/health", e->base);
    kt_proc_wait_http(&e->idx, url, 10000);
}

/* nats-server (wanting token, when not NULL); the test's own NATS
 * connection and HTTP client. */
static void env_nats(env *e, const char *token) {
    memset(e, 0, sizeof(*e));
    const char *auth[] = {"--auth", token, NULL};
    if (token)
        kt_nats_start_args(&e->nats, auth);
    else
        kt_nats_start(&e->nats);
    natsOptions *o;
    ck_assert_int_eq(natsOptions_Create(&o), NATS_OK);
    ck_assert_int_eq(natsOptions_SetURL(o, e->nats.url), NATS_OK);
    if (token) ck_assert_int_eq(natsOptions_SetToken(o, token), NATS_OK);
    ck_assert_int_eq(natsConnection_Connect(&e->nc, o), NATS_OK);
    natsOptions_Destroy(o);
    ck_assert_int_eq(kvo_http_client_new(&e->http, 5000), KVO_OK);
    kvo_http_resp_init(&e->resp);
}

/* Both: nats-server, then kvo-indexer on it. */
static void env_start(env *e, const char *token, const char *const extra[]) {
    env_nats(e, token);
    env_indexer(e, token, extra);
}

static int env_stop(env *e) {
    kvo_http_resp_fini(&e->resp);
    kvo_http_client_free(e->http);
    natsConnection_Destroy(e->nc);
    int rc = kt_proc_stop(&e->idx);
    kt_nats_stop(&e->nats);
    return rc;
}

static void publish(env *e, const uint8_t *b, size_t len, const char *hdr) {
    natsMsg *m;
    ck_assert_int_eq(
        natsMsg_Create(&m, SUBJECT, NULL, (const char *)b, (int)len), NATS_OK);
    if (hdr)
        ck_assert_int_eq(natsMsgHeader_Set(m, "KVO-Zmq-Seq", hdr), NATS_OK);
    ck_assert_int_eq(natsConnection_PublishMsg(e->nc, m), NATS_OK);
    natsMsg_Destroy(m);
    ck_assert_int_eq(natsConnection_FlushTimeout(e->nc, 5000), NATS_OK);
}

static void publish_vector(env *e, const char *name, const char *hdr) {
    size_t len;
    uint8_t *b = tt_vector(name, &len);
    publish(e, b, len, hdr);
    kvo_free(b);
}

static json_object *get_json(env *e, const char *path) {
    char url[256];
    snprintf(url, sizeof(url), "%s%s", e->base, path);
    ck_assert_int_eq(kvo_http_get(e->http, url, &e->resp), KVO_OK);
    ck_assert_msg(e->resp.status == 200, "GET %s: %ld", path, e->resp.status);
    kvo_buf_cstr(&e->resp.body);
    json_object *j = json_tokener_parse((const char *)e->resp.body.data);
    ck_assert_msg(j != NULL, "GET %s: not JSON", path);
    return j;
}

static long post(env *e, const char *path, const char *body, char **out) {
    char url[256];
    snprintf(url, sizeof(url), "%s%s", e->base, path);
    ck_assert_int_eq(kvo_http_post(e->http, url, "application/json", body,
                                   strlen(body), &e->resp),
                     KVO_OK);
    kvo_buf_cstr(&e->resp.body);
    *out = (char *)e->resp.body.data;
    return e->resp.status;
}

static uint64_t counter(env *e, const char *key) {
    json_object *j = get_json(e, "/counters");
    uint64_t r = tt_json_u64(j, key);
    json_object_put(j);
    return r;
}

/* Blocks of worker (7, 0) per GET /workers. */
static uint64_t tt_blocks_http(env *e) {
    json_object *j = get_json(e, "/workers");
    uint64_t r = UINT64_MAX;
    for (size_t i = 0; i < json_object_array_length(j); i++) {
        json_object *w = json_object_array_get_idx(j, i);
        if (tt_json_u64(w, "worker_id") == 7 && tt_json_u64(w, "dp_rank") == 0)
            r = tt_json_u64(w, "blocks");
    }
    json_object_put(j);
    return r;
}

/* Poll until counter key reaches want (no timing assertion: the deadline
 * only bounds a failure). */
static void wait_counter(env *e, const char *key, uint64_t want) {
    for (int i = 0; i < 2000; i++) {
        if (counter(e, key) >= want) return;
        usleep(5000);
    }
    kvo_proc_dump_log(&e->idx.proc, 50);
    ck_abort_msg("counter %s never reached %llu", key,
                 (unsigned long long)want);
}

static void wait_messages(env *e, uint64_t n) {
    wait_counter(e, "messages", n);
}

START_TEST(service_indexes_the_event_plane_and_answers_http) {
    env e;
    const char *extra[] = {"--no-recovery", NULL}; /* the gap stays a gap */
    env_start(&e, NULL, extra);
    char *out, q[256];
    snprintf(q, sizeof(q), "{\"tokens_hashes\": [%llu, %llu, 3]}",
             (unsigned long long)H1, (unsigned long long)H2);

    publish_vector(&e, "stored_two_blocks", "10-12");
    wait_messages(&e, 1);
    ck_assert_int_eq(post(&e, "/query_by_hash", q, &out), 200);
    ck_assert_str_eq(out, "{\"isl_blocks\":3,\"scores\":[{\"worker_id\":7,"
                          "\"dp_rank\":0,\"blocks\":2}]}");
    /* tokens [1,2,3,4] (block size 4) hash to H1; 6 tokens = 2 blocks */
    ck_assert_int_eq(post(&e, "/query", "{\"token_ids\": [1,2,3,4,5,6]}", &out),
                     200);
    ck_assert_str_eq(out, "{\"isl_blocks\":2,\"scores\":[{\"worker_id\":7,"
                          "\"dp_rank\":0,\"blocks\":1}]}");
    ck_assert_int_eq(post(&e, "/query",
                          "{\"token_ids\": [1,2,3,4], \"cache_salt\": \"s\"}",
                          &out),
                     200);
    ck_assert_str_eq(out, "{\"isl_blocks\":1,\"scores\":[]}");

    publish_vector(&e, "removed_one", NULL);
    publish_vector(&e, "removed_one", NULL);  /* duplicate */
    publish_vector(&e, "mixed_dp2", "13-20"); /* sequence 2 skipped */
    const uint8_t junk[] = {0x93, 0x01, 0x02};
    publish(&e, junk, sizeof(junk), NULL);
    wait_messages(&e, 5);
    ck_assert_int_eq(post(&e, "/query_by_hash", q, &out), 200);
    ck_assert_str_eq(out, "{\"isl_blocks\":3,\"scores\":[{\"worker_id\":7,"
                          "\"dp_rank\":0,\"blocks\":1}]}");
    ck_assert_uint_eq(counter(&e, "duplicates"), 1);
    ck_assert_uint_eq(counter(&e, "gaps"), 1);
    ck_assert_uint_eq(counter(&e, "undecodable"), 1);
    ck_assert_uint_eq(counter(&e, "applied"), 3);

    tt_json_eq(get_json(&e, "/watermark"),
               "{\"publishers\":[{\"publisher_id\":42,\"last_sequence\":3,"
               "\"messages\":3,\"gaps\":1,\"missed\":1,\"duplicates\":1,"
               "\"restarts\":0,\"zmq_seq_first\":10,\"zmq_seq_last\":20,"
               "\"stale\":false}]}");
    tt_json_eq(get_json(&e, "/workers"),
               "[{\"worker_id\":7,\"dp_rank\":0,\"blocks\":1},"
               "{\"worker_id\":9,\"dp_rank\":2,\"blocks\":0}]");
    tt_json_eq(get_json(&e, "/dump"),
               "[{\"worker_id\":7,\"storage_tier\":\"device\",\"event\":"
               "{\"event_id\":0,\"data\":{\"stored\":{\"parent_hash\":null,"
               "\"start_position\":null,\"blocks\":[{\"block_hash\":"
               "14643705804678351452,\"tokens_hash\":14643705804678351452,"
               "\"mm_extra_info\":null}]}},\"dp_rank\":0}}]");
    json_object *w = get_json(&e, "/health");
    ck_assert_str_eq(json_object_get_string(tt_json_at(w, "nats")),
                     "connected");
    json_object_put(w);

    char url[256];
    snprintf(url, sizeof(url), "%s/metrics", e.base);
    ck_assert_int_eq(kvo_http_get(e.http, url, &e.resp), KVO_OK);
    ck_assert_int_eq(e.resp.status, 200);
    kvo_buf_cstr(&e.resp.body);
    const char *m = (const char *)e.resp.body.data;
    const char *want[] = {
        "kvo_indexer_events_total{type=\"stored\",status=\"ok\"} 3\n",
        "kvo_indexer_events_total{type=\"removed\",status=\"ok\"} 2\n",
        "kvo_indexer_events_total{type=\"cleared\",status=\"ok\"} 0\n",
        "kvo_indexer_duplicates_total 1\n",
        "kvo_indexer_gaps_total 1\n",
        "kvo_indexer_undecodable_total 1\n",
        "kvo_indexer_pairs 1\n",
        "kvo_indexer_resident_blocks 1\n",
        "kvo_indexer_workers 2\n",
        "kvo_indexer_query_seconds_count 4\n",
        "# TYPE kvo_indexer_query_seconds histogram\n"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(want); i++)
        ck_assert_msg(strstr(m, want[i]), "metrics lack %s", want[i]);

    /* bad requests: a JSON error with a 4xx */
    ck_assert_int_eq(post(&e, "/query", "{\"token_ids\": [1,", &out), 400);
    ck_assert_msg(strstr(out, "\"error\""), "%s", out);
    ck_assert_int_eq(post(&e, "/query", "[1]", &out), 400);
    ck_assert_int_eq(post(&e, "/query", "{\"tokens_hashes\": [1]}", &out), 400);
    ck_assert_int_eq(post(&e, "/query_by_hash", "{\"token_ids\": [1]}", &out),
                     400);
    ck_assert_int_eq(post(&e, "/query", "{\"token_ids\": [-1]}", &out), 400);
    ck_assert_int_eq(post(&e, "/query", "{} x", &out), 400);
    ck_assert_int_eq(post(&e, "/query", "", &out), 400);
    ck_assert_int_eq(post(&e, "/nope", "{}", &out), 404);
    ck_assert_int_eq(post(&e, "/workers", "{}", &out), 405);
    snprintf(url, sizeof(url), "%s/query", e.base);
    ck_assert_int_eq(kvo_http_get(e.http, url, &e.resp), KVO_OK);
    ck_assert_int_eq(e.resp.status, 405);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* Credentials reach nats.c: against a server that wants a token, the
 * indexer given --nats-token connects and indexes what a publisher with
 * the same token sends; --nats-user without --nats-password is a usage
 * error. */
START_TEST(service_passes_nats_credentials_through) {
    env e;
    env_start(&e, "s3cret", NULL);
    /* publish until the indexer, once subscribed, has applied one */
    for (int i = 0; i < 400 && counter(&e, "applied") == 0; i++) {
        publish_vector(&e, "stored_two_blocks", NULL);
        usleep(10000);
    }
    ck_assert_uint_ge(counter(&e, "applied"), 1);
    ck_assert_uint_eq(tt_blocks_http(&e), 2);

    kt_proc p;
    const char *bad[] = {"--nats", e.nats.url, "--nats-user", "u", NULL};
    kt_proc_start(&p, "kvo-indexer", bad);
    for (int i = 0; i < 500 && kvo_proc_alive(&p.proc); i++) usleep(10000);
    ck_assert(!kvo_proc_alive(&p.proc));
    ck_assert_int_eq(p.proc.exit_status, 2);
    kt_proc_stop(&p);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* Publish n envelopes (tt_envelope(pub0 + i, seq, worker0 + i, device,
 * blocks)) with one flush at the end. */
static void publish_many(env *e, uint64_t pub0, uint64_t seq, uint64_t worker0,
                         uint32_t blocks, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t len;
        uint8_t *b = tt_envelope(pub0 + i, seq, worker0 + i, WIRE_TIER_DEVICE,
                                 blocks, &len);
        ck_assert_int_eq(natsConnection_Publish(e->nc, SUBJECT, b, (int)len),
                         NATS_OK);
        kvo_free(b);
    }
    ck_assert_int_eq(natsConnection_FlushTimeout(e->nc, 10000), NATS_OK);
}

/* GET path: status and body (NUL-terminated, in e->resp). */
static long get(env *e, const char *path, const char **out) {
    char url[256];
    snprintf(url, sizeof(url), "%s%s", e->base, path);
    ck_assert_int_eq(kvo_http_get(e->http, url, &e->resp), KVO_OK);
    kvo_buf_cstr(&e->resp.body);
    *out = (const char *)e->resp.body.data;
    return e->resp.status;
}

/* The error text of a JSON error answer (borrowed from j). */
static const char *error_of(json_object *j) {
    return json_object_get_string(tt_json_at(j, "error"));
}

/* The /dump events, unpaged or in pages of limit, as one JSON array text
 * (kvo_free'd by the caller); *pages gets the number of requests. */
static char *dump_all(env *e, size_t limit, size_t *pages) {
    kvo_buf all;
    kvo_buf_init(&all);
    kvo_buf_append(&all, "[", 1);
    char path[128];
    bool more = true, first = true;
    uint64_t after = 0;
    *pages = 0;
    while (more) {
        if (first)
            snprintf(path, sizeof(path), "/dump?limit=%zu", limit);
        else
            snprintf(path, sizeof(path), "/dump?after=%llu&limit=%zu",
                     (unsigned long long)after, limit);
        json_object *j = get_json(e, path);
        json_object *ev = tt_json_at(j, "events"), *next;
        size_t n = json_object_array_length(ev);
        ck_assert_uint_le(n, limit);
        for (size_t i = 0; i < n; i++) {
            const char *t = json_object_to_json_string_ext(
                json_object_array_get_idx(ev, i), JSON_C_TO_STRING_PLAIN);
            if (!(first && i == 0)) kvo_buf_append(&all, ",", 1);
            kvo_buf_append(&all, t, strlen(t));
        }
        more = json_object_object_get_ex(j, "next", &next);
        if (more) {
            ck_assert_uint_eq(n, limit);
            after = tt_json_u64(j, "next");
            /* the cursor is the last event's position = its event_id */
            ck_assert_uint_eq(after,
                              tt_json_u64(json_object_array_get_idx(ev, n - 1),
                                          "event.event_id"));
        }
        first = false;
        (*pages)++;
        json_object_put(j);
    }
    kvo_buf_append(&all, "]", 1);
    kvo_buf_cstr(&all);
    return (char *)all.data;
}

/* 5,000 publishers into --max-publishers 100: the table stays at 100,
 * every message applies and the 4,900 untracked are counted; /watermark
 * and /dump answer in pages, and an unpaged /dump too large is refused
 * with a reason instead of built whole. */
START_TEST(service_bounds_publishers_and_pages_long_answers) {
    env e;
    const char *extra[] = {"--max-publishers", "100", NULL};
    env_start(&e, NULL, extra);
    publish_many(&e, 1000, 0, 0, 1, 5000);
    wait_messages(&e, 5000);
    ck_assert_uint_eq(counter(&e, "publishers"), 100);
    ck_assert_uint_eq(counter(&e, "publishers_refused"), 4900);
    ck_assert_uint_eq(counter(&e, "applied"), 5000);

    /* the watermark: all 100 at once, or pages of 30 with a cursor */
    json_object *w = get_json(&e, "/watermark");
    ck_assert_uint_eq(json_object_array_length(tt_json_at(w, "publishers")),
                      100);
    ck_assert(!json_object_object_get_ex(w, "next", NULL));
    json_object_put(w);
    uint64_t seen = 0;
    char path[128] = "/watermark?limit=30";
    for (int page = 0;; page++) {
        w = get_json(&e, path);
        json_object *a = tt_json_at(w, "publishers"), *next;
        for (size_t i = 0; i < json_object_array_length(a); i++)
            ck_assert_uint_eq(
                tt_json_u64(json_object_array_get_idx(a, i), "publisher_id"),
                1000 + seen++);
        bool more = json_object_object_get_ex(w, "next", &next);
        if (more)
            snprintf(path, sizeof(path), "/watermark?after=%llu&limit=30",
                     (unsigned long long)tt_json_u64(w, "next"));
        json_object_put(w);
        ck_assert_int_le(page, 3);
        if (!more) break;
    }
    ck_assert_uint_eq(seen, 100);
    const char *out;
    static const char *const bad[] = {
        "/watermark?limit=0", "/watermark?limit=1001", "/watermark?after=x",
        "/dump?limit=10001", "/dump?after=-1"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        ck_assert_int_eq(get(&e, bad[i], &out), 400);
        json_object *j = json_tokener_parse(out);
        ck_assert_msg(j && error_of(j), "%s: %s", bad[i], out);
        json_object_put(j);
    }

    /* the dump (5,000 events): whole, and in pages that add up to it */
    ck_assert_int_eq(get(&e, "/dump", &out), 200);
    char *whole = kvo_malloc(strlen(out) + 1);
    strcpy(whole, out);
    size_t pages;
    char *paged = dump_all(&e, 2000, &pages);
    ck_assert_uint_eq(pages, 3);
    ck_assert_str_eq(paged, whole);
    kvo_free(paged);
    kvo_free(whole);

    /* 10 chains of 1,000 blocks: 14,990 events, more than one answer */
    publish_many(&e, 1000, 1, 0, 1000, 10);
    wait_messages(&e, 5010);
    ck_assert_int_eq(get(&e, "/dump", &out), 400);
    json_object *j = json_tokener_parse(out);
    ck_assert_msg(j && strstr(error_of(j), "page it"), "%s", out);
    json_object_put(j);
    paged = dump_all(&e, 10000, &pages);
    ck_assert_uint_eq(pages, 2);
    json_object *events = json_tokener_parse(paged);
    ck_assert_uint_eq(json_object_array_length(events), 14990);
    json_object_put(events);
    kvo_free(paged);

    ck_assert_int_eq(get(&e, "/metrics", &out), 200);
    ck_assert_msg(
        strstr(out, "kvo_indexer_publishers 100\n") &&
            strstr(out, "kvo_indexer_publishers_refused_total 4900\n") &&
            strstr(out, "kvo_indexer_http_connections_total "),
        "%s", out);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* Publishers not heard from for --publisher-idle-ms are forgotten (their
 * sequence state: the blocks stay), and one that comes back goes on
 * without a false gap. */
START_TEST(service_forgets_idle_publishers) {
    env e;
    const char *extra[] = {"--publisher-idle-ms", "50", NULL};
    env_start(&e, NULL, extra);
    publish_many(&e, 1, 0, 7, 2, 3);
    wait_messages(&e, 3);
    for (int i = 0; i < 2000 && counter(&e, "publishers_expired") < 3; i++)
        usleep(5000);
    ck_assert_uint_eq(counter(&e, "publishers_expired"), 3);
    ck_assert_uint_eq(counter(&e, "publishers"), 0);
    tt_json_eq(get_json(&e, "/watermark"), "{\"publishers\":[]}");
    ck_assert_uint_eq(tt_blocks_http(&e), 2);
    publish_many(&e, 1, 1, 7, 2, 1);
    wait_messages(&e, 4);
    ck_assert_uint_eq(counter(&e, "gaps"), 0);
    ck_assert_uint_eq(counter(&e, "duplicates"), 0);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* Every body goes through one strict reader: numbers out of u64, leading
 * zeros, trailing bytes and invalid UTF-8 are 400s in JSON naming where
 * (json-c clamped, took or passed them); valid answers are unchanged; a
 * body over --max-body is a 413. */
START_TEST(service_reads_request_bodies_strictly) {
    env e;
    const char *extra[] = {"--max-body", "4096", NULL};
    env_start(&e, NULL, extra);
    publish_vector(&e, "stored_two_blocks", "10-12");
    wait_messages(&e, 1);
    static const struct {
        const char *path, *body, *error;
    } bad[] = {
        {"/query_by_hash", "{\"tokens_hashes\": [18446744073709551616]}",
         "bad JSON at tokens_hashes[0]: integer out of range"},
        {"/query_by_hash", "{\"tokens_hashes\":[1,2,3,100000000000000000000]}",
         "bad JSON at tokens_hashes[3]: integer out of range"},
        {"/query_by_hash", "{\"tokens_hashes\":[01]}",
         "bad JSON at tokens_hashes[0]: a number has a leading zero"},
        {"/query_by_hash", "{\"tokens_hashes\":[1]}garbage",
         "bad JSON: trailing characters after the JSON value"},
        {"/query", "{\"token_ids\":[1],\"lora_name\":\"a\xc0\xaf\"}",
         "bad JSON at lora_name: invalid UTF-8 in a string"},
        {"/query_by_hash",
         "{\"tokens_hashes\":[1],\"wait\":{\"zmq_seq\":[[42,-1]]}}",
         "wait.zmq_seq[0] must be [publisher_id, seq] (integers >= 0)"},
    };
    char *out;
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        ck_assert_int_eq(post(&e, bad[i].path, bad[i].body, &out), 400);
        json_object *j = json_tokener_parse(out);
        ck_assert_msg(j != NULL, "%s: not JSON: %s", bad[i].body, out);
        ck_assert_str_eq(error_of(j), bad[i].error);
        json_object_put(j);
    }
    ck_assert_uint_eq(counter(&e, "bad_requests"), KVO_ARRAY_LEN(bad));
    /* --max-body: a longer body is refused before it is read */
    char big[5000];
    memset(big, ' ', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    memcpy(big, "{\"tokens_hashes\":[]}", 20);
    ck_assert_int_eq(post(&e, "/query_by_hash", big, &out), 413);
    ck_assert_msg(strstr(out, "\"error\""), "%s", out);
    /* kvo-check's compact shape and a spaced one answer alike */
    static const char *const same[] = {
        "{\"tokens_hashes\":[14643705804678351452,16777012769546811212,3]}",
        " { \"tokens_hashes\" : [ 14643705804678351452 , 16777012769546811212 ,"
        " 3 ] , \"other\" : {\"x\": [1.5, null]} }\n"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(same); i++) {
        ck_assert_int_eq(post(&e, "/query_by_hash", same[i], &out), 200);
        ck_assert_str_eq(out, "{\"isl_blocks\":3,\"scores\":[{\"worker_id\":7,"
                              "\"dp_rank\":0,\"blocks\":2}]}");
    }
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* GET /metrics's text, every line of it (the memory gauge only by its
 * name: it follows the tree's growth policy): the names, HELP and TYPE
 * lines, labels and values kvo-check and Prometheus read. */
START_TEST(metrics_text_is_pinned_line_by_line) {
    idx_feed *f = tt_feed_of("stored_two_blocks", "removed_one", NULL);
    ck_assert_int_eq(tt_feed_vector(f, "removed_one", NULL), KVO_EEXIST);
    ck_assert_int_eq(tt_feed_vector(f, "mixed_dp2", "13-20"), KVO_OK);
    ck_assert_int_eq(tt_feed_vector(f, "legacy_single_event", "x"), KVO_OK);
    const uint8_t junk[] = {0x93, 0x01, 0x02};
    ck_assert_int_ne(idx_feed_message(f, junk, sizeof(junk), NULL, NULL, NULL),
                     KVO_OK);
    idx_service_stats st = {.slow_consumer_drops = 3,
                            .inbox_drops = 2,
                            .nats_disconnects = 1,
                            .bad_requests = 4,
                            .apply_pauses = 9,
                            .http = {.conns = 5,
                                     .head_timeouts = 6,
                                     .body_timeouts = 7,
                                     .busy_refused = 8},
                            .lat_count = {1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1},
                            .lat_sum = 0.000123456};
    static const char *const want[] = {
        "# HELP kvo_indexer_events_total RouterEvents applied, by type and "
        "status.",
        "# TYPE kvo_indexer_events_total counter",
        "kvo_indexer_events_total{type=\"stored\",status=\"ok\"} 4",
        "kvo_indexer_events_total{type=\"stored\",status=\"parent_not_found\"} "
        "0",
        "kvo_indexer_events_total{type=\"stored\",status=\"block_not_found\"} "
        "0",
        "kvo_indexer_events_total{type=\"stored\",status=\"invalid_block\"} 0",
        "kvo_indexer_events_total{type=\"removed\",status=\"ok\"} 2",
        "kvo_indexer_events_total{type=\"removed\",status=\"parent_not_found\"}"
        " 0",
        "kvo_indexer_events_total{type=\"removed\",status=\"block_not_found\"} "
        "0",
        "kvo_indexer_events_total{type=\"removed\",status=\"invalid_block\"} 0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"ok\"} 0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"parent_not_found\"}"
        " 0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"block_not_found\"} "
        "0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"invalid_block\"} 0",
        "# HELP kvo_indexer_blocks_total Block operations, by outcome.",
        "# TYPE kvo_indexer_blocks_total counter",
        "kvo_indexer_blocks_total{op=\"stored\"} 6",
        "kvo_indexer_blocks_total{op=\"removed\"} 3",
        "kvo_indexer_blocks_total{op=\"not_found\"} 0",
        "kvo_indexer_blocks_total{op=\"hash_mismatch\"} 0",
        "kvo_indexer_blocks_total{op=\"orphan_lost\"} 0",
        "# HELP kvo_indexer_resident_blocks Blocks (tree nodes) held by at "
        "least one worker.",
        "# TYPE kvo_indexer_resident_blocks gauge",
        "kvo_indexer_resident_blocks 2",
        "# HELP kvo_indexer_tree_nodes Tree nodes, including emptied ones "
        "Dynamo's rules keep.",
        "# TYPE kvo_indexer_tree_nodes gauge",
        "kvo_indexer_tree_nodes 2",
        "# HELP kvo_indexer_pairs (block, worker) pairs: entries of the "
        "workers' lookups.",
        "# TYPE kvo_indexer_pairs gauge",
        "kvo_indexer_pairs 2",
        "# HELP kvo_indexer_workers Known (worker_id, dp_rank) pairs.",
        "# TYPE kvo_indexer_workers gauge",
        "kvo_indexer_workers 2",
        "# HELP kvo_indexer_memory_bytes Memory held by the tree.",
        "# TYPE kvo_indexer_memory_bytes gauge",
        "kvo_indexer_memory_bytes ",
        "# HELP kvo_indexer_messages_total Event-plane messages received.",
        "# TYPE kvo_indexer_messages_total counter",
        "kvo_indexer_messages_total 6",
        "# HELP kvo_indexer_messages_applied_total Messages decoded and "
        "applied.",
        "# TYPE kvo_indexer_messages_applied_total counter",
        "kvo_indexer_messages_applied_total 4",
        "# HELP kvo_indexer_duplicates_total Exact duplicates dropped.",
        "# TYPE kvo_indexer_duplicates_total counter",
        "kvo_indexer_duplicates_total 1",
        "# HELP kvo_indexer_restarts_total Publisher restarts seen.",
        "# TYPE kvo_indexer_restarts_total counter",
        "kvo_indexer_restarts_total 1",
        "# HELP kvo_indexer_gaps_total Sequence gaps.",
        "# TYPE kvo_indexer_gaps_total counter",
        "kvo_indexer_gaps_total 1",
        "# HELP kvo_indexer_missed_total Messages missed in gaps.",
        "# TYPE kvo_indexer_missed_total counter",
        "kvo_indexer_missed_total 1",
        "# HELP kvo_indexer_rewinds_total Sequence jumps undone by the next "
        "message (bogus sequences).",
        "# TYPE kvo_indexer_rewinds_total counter",
        "kvo_indexer_rewinds_total 0",
        "# HELP kvo_indexer_undecodable_total Undecodable messages.",
        "# TYPE kvo_indexer_undecodable_total counter",
        "kvo_indexer_undecodable_total 1",
        "# HELP kvo_indexer_bad_headers_total Malformed KVO-Zmq-Seq headers.",
        "# TYPE kvo_indexer_bad_headers_total counter",
        "kvo_indexer_bad_headers_total 1",
        "# HELP kvo_indexer_other_tier_total RouterEvents of lower tiers "
        "(indexed per tier).",
        "# TYPE kvo_indexer_other_tier_total counter",
        "kvo_indexer_other_tier_total 0",
        "# HELP kvo_indexer_enomem_total RouterEvents lost to allocation "
        "failure.",
        "# TYPE kvo_indexer_enomem_total counter",
        "kvo_indexer_enomem_total 0",
        "# HELP kvo_indexer_publishers Publishers whose sequences are tracked.",
        "# TYPE kvo_indexer_publishers gauge",
        "kvo_indexer_publishers 1",
        "# HELP kvo_indexer_publishers_refused_total Messages applied "
        "untracked: the publisher table was full.",
        "# TYPE kvo_indexer_publishers_refused_total counter",
        "kvo_indexer_publishers_refused_total 0",
        "# HELP kvo_indexer_publishers_expired_total Publishers forgotten "
        "after being idle.",
        "# TYPE kvo_indexer_publishers_expired_total counter",
        "kvo_indexer_publishers_expired_total 0",
        "# HELP kvo_indexer_announces_total Relay announces received (start, "
        "heartbeat, discover answers).",
        "# TYPE kvo_indexer_announces_total counter",
        "kvo_indexer_announces_total 0",
        "# HELP kvo_indexer_announces_bad_total Announces that could not be "
        "read.",
        "# TYPE kvo_indexer_announces_bad_total counter",
        "kvo_indexer_announces_bad_total 0",
        "# HELP kvo_indexer_relays Tracked publishers that announced "
        "themselves as relays.",
        "# TYPE kvo_indexer_relays gauge",
        "kvo_indexer_relays 0",
        "# HELP kvo_indexer_recovering Publishers with a recovery request in "
        "flight.",
        "# TYPE kvo_indexer_recovering gauge",
        "kvo_indexer_recovering 0",
        "# HELP kvo_indexer_stale_publishers Publishers whose last recovery "
        "failed (their workers were cleared).",
        "# TYPE kvo_indexer_stale_publishers gauge",
        "kvo_indexer_stale_publishers 0",
        "# HELP kvo_indexer_recovery_requests_total Recovery requests sent "
        "(retries included).",
        "# TYPE kvo_indexer_recovery_requests_total counter",
        "kvo_indexer_recovery_requests_total 0",
        "# HELP kvo_indexer_recoveries_events_total Recoveries answered with "
        "the missing envelopes.",
        "# TYPE kvo_indexer_recoveries_events_total counter",
        "kvo_indexer_recoveries_events_total 0",
        "# HELP kvo_indexer_recoveries_dump_total Recoveries answered with a "
        "dump of the relay's state.",
        "# TYPE kvo_indexer_recoveries_dump_total counter",
        "kvo_indexer_recoveries_dump_total 0",
        "# HELP kvo_indexer_recoveries_too_new_total Recoveries answered "
        "too_new: nothing was missing.",
        "# TYPE kvo_indexer_recoveries_too_new_total counter",
        "kvo_indexer_recoveries_too_new_total 0",
        "# HELP kvo_indexer_recovery_failures_total Recoveries that failed "
        "(relay gone, timeout, no valid answer).",
        "# TYPE kvo_indexer_recovery_failures_total counter",
        "kvo_indexer_recovery_failures_total 0",
        "# HELP kvo_indexer_recovery_retries_total Requests sent again after "
        "an incomplete or malformed answer.",
        "# TYPE kvo_indexer_recovery_retries_total counter",
        "kvo_indexer_recovery_retries_total 0",
        "# HELP kvo_indexer_recovery_bad_total Malformed or inconsistent "
        "recovery answers.",
        "# TYPE kvo_indexer_recovery_bad_total counter",
        "kvo_indexer_recovery_bad_total 0",
        "# HELP kvo_indexer_recovery_stray_total Recovery answers to no "
        "request in flight (late, or abandoned).",
        "# TYPE kvo_indexer_recovery_stray_total counter",
        "kvo_indexer_recovery_stray_total 0",
        "# HELP kvo_indexer_envelopes_recovered_total Envelopes received in "
        "recovery answers (events and dumps).",
        "# TYPE kvo_indexer_envelopes_recovered_total counter",
        "kvo_indexer_envelopes_recovered_total 0",
        "# HELP kvo_indexer_dumps_applied_total Dumps applied whole.",
        "# TYPE kvo_indexer_dumps_applied_total counter",
        "kvo_indexer_dumps_applied_total 0",
        "# HELP kvo_indexer_dump_blocks_applied_total Blocks stored from "
        "dumps.",
        "# TYPE kvo_indexer_dump_blocks_applied_total counter",
        "kvo_indexer_dump_blocks_applied_total 0",
        "# HELP kvo_indexer_impossible_sequences_total Envelopes dropped: "
        "their relay never sent that sequence (too_new).",
        "# TYPE kvo_indexer_impossible_sequences_total counter",
        "kvo_indexer_impossible_sequences_total 0",
        "# HELP kvo_indexer_live_held_total Live envelopes held while their "
        "publisher recovered.",
        "# TYPE kvo_indexer_live_held_total counter",
        "kvo_indexer_live_held_total 0",
        "# HELP kvo_indexer_live_held_dropped_total Live envelopes not held: "
        "the hold was full (recovered later).",
        "# TYPE kvo_indexer_live_held_dropped_total counter",
        "kvo_indexer_live_held_dropped_total 0",
        "# HELP kvo_indexer_live_covered_total Held live envelopes a dump "
        "covered (dropped).",
        "# TYPE kvo_indexer_live_covered_total counter",
        "kvo_indexer_live_covered_total 0",
        "# HELP kvo_indexer_recovery_ms_total Milliseconds spent recovering, "
        "summed over finished recoveries.",
        "# TYPE kvo_indexer_recovery_ms_total counter",
        "kvo_indexer_recovery_ms_total 0",
        "# HELP kvo_indexer_recovery_ms_max Longest finished recovery, "
        "milliseconds.",
        "# TYPE kvo_indexer_recovery_ms_max gauge",
        "kvo_indexer_recovery_ms_max 0",
        "# HELP kvo_indexer_slow_consumer_drops_total Messages nats.c dropped "
        "(slow consumer).",
        "# TYPE kvo_indexer_slow_consumer_drops_total counter",
        "kvo_indexer_slow_consumer_drops_total 3",
        "# HELP kvo_indexer_inbox_dropped_total Messages dropped for want of "
        "memory before the loop saw them.",
        "# TYPE kvo_indexer_inbox_dropped_total counter",
        "kvo_indexer_inbox_dropped_total 2",
        "# HELP kvo_indexer_nats_disconnects_total NATS disconnects.",
        "# TYPE kvo_indexer_nats_disconnects_total counter",
        "kvo_indexer_nats_disconnects_total 1",
        "# HELP kvo_indexer_bad_requests_total HTTP requests answered 4xx.",
        "# TYPE kvo_indexer_bad_requests_total counter",
        "kvo_indexer_bad_requests_total 4",
        "# HELP kvo_indexer_apply_pauses_total Times HTTP was served between "
        "two events of one envelope (a request waited, or its apply outlasted "
        "--apply-budget-us).",
        "# TYPE kvo_indexer_apply_pauses_total counter",
        "kvo_indexer_apply_pauses_total 9",
        "# HELP kvo_indexer_http_connections_total TCP connections accepted.",
        "# TYPE kvo_indexer_http_connections_total counter",
        "kvo_indexer_http_connections_total 5",
        "# HELP kvo_indexer_http_head_timeouts_total Connections closed: no "
        "complete request head in time.",
        "# TYPE kvo_indexer_http_head_timeouts_total counter",
        "kvo_indexer_http_head_timeouts_total 6",
        "# HELP kvo_indexer_http_body_timeouts_total Connections closed: no "
        "complete request body in time.",
        "# TYPE kvo_indexer_http_body_timeouts_total counter",
        "kvo_indexer_http_body_timeouts_total 7",
        "# HELP kvo_indexer_http_busy_refused_total Requests answered 503: "
        "request bodies in flight over the cap.",
        "# TYPE kvo_indexer_http_busy_refused_total counter",
        "kvo_indexer_http_busy_refused_total 8",
        "# HELP kvo_indexer_query_seconds Query latency (parse excluded, "
        "hashing included).",
        "# TYPE kvo_indexer_query_seconds histogram",
        "kvo_indexer_query_seconds_bucket{le=\"1e-06\"} 1",
        "kvo_indexer_query_seconds_bucket{le=\"2.5e-06\"} 1",
        "kvo_indexer_query_seconds_bucket{le=\"5e-06\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"1e-05\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"2.5e-05\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"5e-05\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.0001\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.00025\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.001\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.01\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.1\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"+Inf\"} 4",
        "kvo_indexer_query_seconds_sum 0.000123456",
        "kvo_indexer_query_seconds_count 4",
    };
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(idx_metrics_text(f, &st, &b), KVO_OK);
    ck_assert_int_eq(kvo_buf_cstr(&b), KVO_OK);
    const char *line = (const char *)b.data;
    for (size_t i = 0; i < KVO_ARRAY_LEN(want); i++) {
        const char *nl = strchr(line, '\n');
        ck_assert_msg(nl, "line %zu missing: %s", i + 1, want[i]);
        size_t len = strlen(want[i]);
        if (strcmp(want[i], "kvo_indexer_memory_bytes ") == 0)
            ck_assert_msg(strncmp(line, want[i], len) == 0 &&
                              strspn(line + len, "0123456789") ==
                                  (size_t)(nl - line) - len,
                          "line %zu: %.*s", i + 1, (int)(nl - line), line);
        else
            ck_assert_msg((size_t)(nl - line) == len &&
                              strncmp(line, want[i], len) == 0,
                          "line %zu: %.*s, want %s", i + 1, (int)(nl - line),
                          line, want[i]);
        line = nl + 1;
    }
    ck_assert_str_eq(line, "");
    kvo_buf_fini(&b);
    idx_feed_free(f);
}
END_TEST

/* GET /blocks?...&digest_only=1 of (worker, 0): count and digest. */
static uint64_t blocks_digest_of(env *e, uint64_t worker, uint64_t *count) {
    char path[96];
    snprintf(path, sizeof(path),
             "/blocks?worker_id=%llu&dp_rank=0&digest_only=1",
             (unsigned long long)worker);
    json_object *j = get_json(e, path);
    uint64_t d = tt_json_u64(j, "digest");
    *count = tt_json_u64(j, "count");
    json_object_put(j);
    return d;
}

/* GET /blocks and POST /lookup over HTTP: pages that add up to the set
 * and its digest, an unknown worker, digest_only, 4xx answers. */
START_TEST(service_answers_blocks_and_lookup) {
    env e;
    env_start(&e, NULL, NULL);
    publish_many(&e, 1, 0, 7, 5, 1); /* worker 7: the chain 100..500 */
    publish_many(&e, 2, 0, 8, 2, 1); /* worker 8: 100, 200 (same nodes) */
    wait_messages(&e, 2);
    char path[160] = "/blocks?worker_id=7&dp_rank=0&limit=2";
    uint64_t digest = 0, seen = 0, prev = 0, want = 0, pages = 0;
    for (bool more = true; more; pages++) {
        json_object *j = get_json(&e, path);
        json_object *a = tt_json_at(j, "blocks"), *next;
        for (size_t i = 0; i < json_object_array_length(a); i++, seen++) {
            json_object *b = json_object_array_get_idx(a, i);
            uint64_t h =
                json_object_get_uint64(json_object_array_get_idx(b, 0));
            json_object *pj = json_object_array_get_idx(b, 1);
            ck_assert(seen == 0 || h > prev);
            ck_assert_uint_eq(h, 100 * (seen + 1));
            ck_assert(pj ? json_object_get_uint64(pj) == h - 100 : h == 100);
            digest += idx_block_digest(h, pj ? json_object_get_uint64(pj) : 0);
            prev = h;
        }
        ck_assert_uint_eq(tt_json_u64(j, "count"), 5);
        want = tt_json_u64(j, "digest");
        more = json_object_object_get_ex(j, "next", &next);
        if (more)
            snprintf(path, sizeof(path),
                     "/blocks?worker_id=7&dp_rank=0&limit=2&after=%llu",
                     (unsigned long long)tt_json_u64(j, "next"));
        json_object_put(j);
    }
    ck_assert_uint_eq(pages, 3);
    ck_assert_uint_eq(seen, 5);
    ck_assert_uint_eq(digest, want);
    uint64_t n;
    ck_assert_uint_eq(blocks_digest_of(&e, 7, &n), want);
    ck_assert_uint_eq(n, 5);
    tt_json_eq(get_json(&e, "/blocks?worker_id=99&dp_rank=0"),
               "{\"worker_id\":99,\"dp_rank\":0,\"count\":0,\"digest\":0,"
               "\"blocks\":[]}");
    tt_json_eq(get_json(&e, "/blocks?worker_id=7&dp_rank=0&tier=host_pinned"),
               "{\"worker_id\":7,\"dp_rank\":0,\"tier\":\"host_pinned\","
               "\"count\":0,\"digest\":0,\"blocks\":[]}");
    static const char *const bad[] = {
        "/blocks?worker_id=7&dp_rank=0&tier=gpu",
        "/blocks?dp_rank=0",
        "/blocks?worker_id=7&dp_rank=4294967296",
        "/blocks?worker_id=7&dp_rank=0&limit=0",
        "/blocks?worker_id=7&dp_rank=0&limit=100001",
        "/blocks?worker_id=7&dp_rank=0&digest_only=x",
        "/blocks?worker_id=-1&dp_rank=0"};
    const char *out;
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        ck_assert_int_eq(get(&e, bad[i], &out), 400);
        json_object *j = json_tokener_parse(out);
        ck_assert_msg(j && error_of(j), "%s: %s", bad[i], out);
        json_object_put(j);
    }
    char *o;
    ck_assert_int_eq(post(&e, "/lookup",
                          "{\"worker_id\": 8, \"dp_rank\": 0, "
                          "\"block_hashes\": [100, 300, 999]}",
                          &o),
                     200);
    ck_assert_str_eq(o, "{\"blocks\":[{\"block_hash\":100,\"held\":true,"
                        "\"tokens_hash\":1,\"parent_hash\":null,"
                        "\"in_set\":true,\"others\":1,"
                        "\"other_holders\":[[7,0]]},"
                        "{\"block_hash\":300,\"held\":false,"
                        "\"tokens_hash\":null,\"parent_hash\":null,"
                        "\"in_set\":false,\"others\":1,"
                        "\"other_holders\":[[7,0]]},"
                        "{\"block_hash\":999,\"held\":false,"
                        "\"tokens_hash\":null,\"parent_hash\":null,"
                        "\"in_set\":false,\"others\":0,"
                        "\"other_holders\":[]}]}");
    ck_assert_int_eq(
        post(&e, "/lookup", "{\"worker_id\": 8, \"block_hashes\": []}", &o),
        400);
    ck_assert_msg(strstr(o, "dp_rank"), "%s", o);
    kvo_buf big;
    kvo_buf_init(&big);
    kvo_buf_printf(&big, "{\"worker_id\":8,\"dp_rank\":0,\"block_hashes\":[0");
    for (int i = 1; i <= IDX_LOOKUP_MAX; i++) kvo_buf_printf(&big, ",%d", i);
    kvo_buf_printf(&big, "]}");
    kvo_buf_cstr(&big);
    ck_assert_int_eq(post(&e, "/lookup", (const char *)big.data, &o), 400);
    ck_assert_msg(strstr(o, "at most 4096"), "%s", o);
    kvo_buf_fini(&big);
    ck_assert_int_eq(get(&e, "/lookup", &out), 405);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* ---- Recovery with a fake relay (docs/recovery.md) ---------------------- */

#define RPUB 7    /* the fake relay's publisher id */
#define RWORKER 3 /* and worker */

/* Block i (from 0) of chain c: its hash, tokens hash and parent. */
static uint64_t chain_bh(uint64_t c, uint64_t i) { return c * 1000 + i + 1; }
static uint64_t chain_th(uint64_t c, uint64_t i) { return c * 100000 + i + 1; }

/* The relay stores chain c, blocks [from, to). */
static void relay_chain(fake_relay *r, uint64_t c, uint64_t from, uint64_t to,
                        bool publish) {
    for (uint64_t i = from; i < to; i++)
        fake_relay_store(r, i ? chain_bh(c, i - 1) : 0, chain_bh(c, i),
                         chain_th(c, i), publish);
}

/* The answer to /query_by_hash of chain c's first n blocks, with the
 * members `more` (NULL: none) after the hashes (kvo_free). */
static char *chain_query(env *e, uint64_t c, uint64_t n, const char *more) {
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_buf_printf(&b, "{\"tokens_hashes\": [");
    for (uint64_t i = 0; i < n; i++)
        kvo_buf_printf(&b, "%s%llu", i ? "," : "",
                       (unsigned long long)chain_th(c, i));
    kvo_buf_printf(&b, "]%s%s}", more ? ", " : "", more ? more : "");
    kvo_buf_cstr(&b);
    char *out;
    ck_assert_int_eq(post(e, "/query_by_hash", (const char *)b.data, &out),
                     200);
    kvo_buf_fini(&b);
    char *copy = kvo_malloc(strlen(out) + 1);
    strcpy(copy, out);
    return copy;
}

/* The score chain c's n-block query gets for (RWORKER, 0). */
static uint64_t chain_score(env *e, uint64_t c, uint64_t n) {
    char *a = chain_query(e, c, n, NULL);
    json_object *j = json_tokener_parse(a);
    kvo_free(a);
    json_object *sc = tt_json_at(j, "scores");
    uint64_t r = 0;
    for (size_t i = 0; i < json_object_array_length(sc); i++) {
        json_object *x = json_object_array_get_idx(sc, i);
        if (tt_json_u64(x, "worker_id") == RWORKER)
            r = tt_json_u64(x, "blocks");
    }
    json_object_put(j);
    return r;
}

/* Publish envelopes first..first+n-1 from publisher MID_PUB, each of
 * MID_EVENTS stored events of worker MID_WORKER: event j of envelope k is
 * chain k * MID_EVENTS + j, of MID_BLOCKS blocks; envelope k carries
 * KVO-Zmq-Seq k-k. */
enum { MID_EVENTS = 64, MID_BLOCKS = 64, MID_PUB = 9, MID_WORKER = 7 };
static void publish_chain_envelopes(env *e, uint64_t first, uint64_t n) {
    static wire_rblock b[MID_EVENTS][MID_BLOCKS];
    wire_revent ev[MID_EVENTS];
    for (uint64_t k = first; k < first + n; k++) {
        for (uint64_t j = 0; j < MID_EVENTS; j++) {
            uint64_t c = k * MID_EVENTS + j;
            for (uint64_t i = 0; i < MID_BLOCKS; i++)
                b[j][i] = (wire_rblock){chain_bh(c, i), chain_th(c, i)};
            ev[j] = (wire_revent){.worker_id = MID_WORKER,
                                  .event_id = c,
                                  .type = WIRE_R_STORED,
                                  .n_blocks = MID_BLOCKS,
                                  .blocks = b[j]};
        }
        size_t len;
        uint8_t *body =
            tt_plane(MID_PUB, k, 1700000000000ull + k, ev, MID_EVENTS, &len);
        natsMsg *m;
        ck_assert_int_eq(
            natsMsg_Create(&m, SUBJECT, NULL, (const char *)body, (int)len),
            NATS_OK);
        char hdr[48];
        snprintf(hdr, sizeof(hdr), "%llu-%llu", (unsigned long long)k,
                 (unsigned long long)k);
        ck_assert_int_eq(natsMsgHeader_Set(m, "KVO-Zmq-Seq", hdr), NATS_OK);
        ck_assert_int_eq(natsConnection_PublishMsg(e->nc, m), NATS_OK);
        natsMsg_Destroy(m);
        kvo_free(body);
    }
    ck_assert_int_eq(natsConnection_FlushTimeout(e->nc, 10000), NATS_OK);
}

/* A counter of GET /metrics (the line "\n<name> <value>"). */
static uint64_t metric_u64(env *e, const char *name) {
    const char *m;
    ck_assert_int_eq(get(e, "/metrics", &m), 200);
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(m, key);
    ck_assert_msg(p != NULL, "no %s in /metrics", name);
    return strtoull(p + strlen(key), NULL, 10);
}

/* Envelopes of many events, with --apply-budget-us 1: the loop serves
 * HTTP between their events (apply_pauses_total moves), and a query whose
 * KVO-Zmq-Seq wait an envelope covers sees all of that envelope, never a
 * part (fails when the watermark moves before the events are applied). */
START_TEST(service_answers_queries_in_the_middle_of_an_envelope) {
    enum { ENVS = 8 };
    env e;
    const char *extra[] = {"--apply-budget-us", "1", "--no-recovery", NULL};
    env_start(&e, NULL, extra);
    publish_chain_envelopes(&e, 0, ENVS);
    /* While they apply: ask for the last chain of envelope k as soon as
     * its watermark is there (timeout 0: answered at once, covered or
     * not). Covered must mean all of it, whenever the question lands. */
    uint64_t k = 0;
    for (int polls = 0; k < ENVS && polls < 100000; polls++) {
        char wait[128];
        snprintf(wait, sizeof(wait),
                 "\"wait\": {\"zmq_seq\": [[%d, %llu]], \"timeout_ms\": 0}",
                 MID_PUB, (unsigned long long)k);
        char *out =
            chain_query(&e, k * MID_EVENTS + MID_EVENTS - 1, MID_BLOCKS, wait);
        json_object *j = json_tokener_parse(out);
        ck_assert_ptr_nonnull(j);
        if (json_object_get_boolean(tt_json_at(j, "covered"))) {
            json_object *sc = tt_json_at(j, "scores");
            ck_assert_msg(json_object_array_length(sc) == 1 &&
                              tt_json_u64(json_object_array_get_idx(sc, 0),
                                          "blocks") == MID_BLOCKS,
                          "envelope %llu covered, but its last chain is not "
                          "all there: %s",
                          (unsigned long long)k, out);
            k++;
        }
        json_object_put(j);
        kvo_free(out);
    }
    ck_assert_msg(k == ENVS,
                  "envelope %llu's watermark never came (100,000 polls)",
                  (unsigned long long)k);
    wait_messages(&e, ENVS);
    json_object *c = get_json(&e, "/counters");
    ck_assert_uint_eq(tt_json_u64(tt_json_at(c, "blocks"), "stored"),
                      (uint64_t)ENVS * MID_EVENTS * MID_BLOCKS);
    json_object_put(c);
    ck_assert_uint_gt(metric_u64(&e, "kvo_indexer_apply_pauses_total"), 0);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* With an apply budget of 1 s (the most), requests that come while envelopes apply
 * are still answered between two of their events: an apply looks for
 * waiting requests as it goes, not only when its budget is spent (fails
 * then: apply_pauses_total stays 0). The envelopes (4,096 blocks each,
 * about half a millisecond to apply) keep coming while the requests are
 * asked, so the indexer has a backlog whenever one lands. */
START_TEST(service_answers_a_request_waiting_behind_a_long_apply) {
    enum { AHEAD = 32, ENVS = 256 };
    env e;
    const char *extra[] = {"--apply-budget-us", "1000000", "--no-recovery",
                           NULL};
    env_start(&e, NULL, extra);
    publish_chain_envelopes(&e, 0, AHEAD);
    uint64_t all = (uint64_t)ENVS * MID_EVENTS * MID_BLOCKS, pauses = 0;
    uint64_t stored = 0;
    for (uint64_t k = AHEAD; k < ENVS; k += 4) {
        publish_chain_envelopes(&e, k, 4);
        pauses = metric_u64(&e, "kvo_indexer_apply_pauses_total");
    }
    for (int polls = 0; polls < 100000 && !pauses && stored < all; polls++) {
        stored = metric_u64(&e, "kvo_indexer_blocks_total{op=\"stored\"}");
        pauses = metric_u64(&e, "kvo_indexer_apply_pauses_total");
    }
    ck_assert_msg(pauses > 0,
                  "no request was answered while blocks applied (%llu of "
                  "%llu stored when the requests stopped)",
                  (unsigned long long)stored, (unsigned long long)all);
    wait_messages(&e, ENVS);
    ck_assert_uint_eq(metric_u64(&e, "kvo_indexer_blocks_total{op=\"stored\"}"),
                      all);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

static const char *health_status(env *e) {
    static char st[32];
    json_object *h = get_json(e, "/health");
    snprintf(st, sizeof(st), "%s",
             json_object_get_string(tt_json_at(h, "status")));
    json_object_put(h);
    return st;
}

/* Poll until /health says want (the deadline only bounds a failure). */
static void wait_health(env *e, const char *want) {
    for (int i = 0; i < 2000; i++) {
        if (strcmp(health_status(e), want) == 0) return;
        usleep(5000);
    }
    kvo_proc_dump_log(&e->idx.proc, 50);
    ck_abort_msg("/health never said %s (%s)", want, health_status(e));
}

/* Publisher pub's zmq_seq_last in /watermark (UINT64_MAX: none yet). */
static uint64_t zmq_last_of(env *e, uint64_t pub) {
    json_object *w = get_json(e, "/watermark");
    json_object *a = tt_json_at(w, "publishers");
    uint64_t r = UINT64_MAX;
    for (size_t i = 0; i < json_object_array_length(a); i++) {
        json_object *p = json_object_array_get_idx(a, i);
        json_object *z = NULL; /* null until a header was seen */
        json_object_object_get_ex(p, "zmq_seq_last", &z);
        if (tt_json_u64(p, "publisher_id") == pub && z &&
            json_object_is_type(z, json_type_int))
            r = json_object_get_uint64(z);
    }
    json_object_put(w);
    return r;
}

static void wait_zmq(env *e, uint64_t pub, uint64_t want) {
    for (int i = 0; i < 2000; i++) {
        uint64_t z = zmq_last_of(e, pub);
        if (z != UINT64_MAX && z >= want) return;
        usleep(5000);
    }
    kvo_proc_dump_log(&e->idx.proc, 50);
    ck_abort_msg("publisher %llu's watermark never reached %llu",
                 (unsigned long long)pub, (unsigned long long)want);
}

/* The digest of the relay's forwarded state, as GET /blocks computes it. */
static uint64_t relay_digest(fake_relay *r) {
    uint64_t d = 0;
    for (size_t i = 0; i < r->nstate; i++)
        d += idx_block_digest(r->state[i].bh, r->state[i].parent);
    return d;
}

/* kvo-indexer started after the relay rebuilds the index from its dump;
 * killed and started again, it gets back the same index -- the same
 * answers, the same block set -- plus what was published while it was
 * down. */
START_TEST(service_recovers_its_index_from_the_relay_after_a_restart) {
    env e;
    env_nats(&e, NULL);
    fake_relay r;
    fake_relay_start(&r, e.nats.url, RPUB, RWORKER);
    r.dump_blocks = 7; /* several envelopes per dump */
    relay_chain(&r, 1, 0, 10, true);
    relay_chain(&r, 2, 0, 10, true); /* 0..19, nobody listening */
    env_indexer(&e, NULL, NULL);
    wait_zmq(&e, RPUB, 19);
    wait_health(&e, "ok");
    ck_assert_uint_eq(chain_score(&e, 1, 10), 10);
    ck_assert_uint_eq(chain_score(&e, 2, 10), 10);
    relay_chain(&r, 3, 0, 10, true); /* live: 20..29 */
    wait_zmq(&e, RPUB, 29);
    char *before[3];
    for (uint64_t c = 1; c <= 3; c++)
        before[c - 1] = chain_query(&e, c, 12, NULL);
    uint64_t n1, d1 = blocks_digest_of(&e, RWORKER, &n1);
    ck_assert_uint_eq(n1, 30);
    ck_assert_uint_eq(d1, relay_digest(&r));
    ck_assert_uint_eq(counter(&e, "recoveries_dump"), 1);
    ck_assert_uint_eq(counter(&e, "dumps_applied"), 1);
    ck_assert_uint_eq(counter(&e, "dump_blocks_applied"), 20);
    ck_assert_uint_eq(counter(&e, "envelopes_recovered"), 3);
    ck_assert_uint_eq(counter(&e, "gaps") + counter(&e, "recovery_failures"),
                      0);

    ck_assert_int_eq(kt_proc_stop(&e.idx), 0);
    relay_chain(&r, 4, 0, 5, true); /* while it is down: 30..34 */
    env_indexer(&e, NULL, NULL);
    wait_zmq(&e, RPUB, 34);
    wait_health(&e, "ok");
    for (uint64_t c = 1; c <= 3; c++) {
        char *after = chain_query(&e, c, 12, NULL);
        ck_assert_str_eq(after, before[c - 1]);
        kvo_free(after);
        kvo_free(before[c - 1]);
    }
    ck_assert_uint_eq(chain_score(&e, 4, 5), 5);
    uint64_t n2, d2 = blocks_digest_of(&e, RWORKER, &n2);
    ck_assert_uint_eq(n2, 35);
    ck_assert_uint_eq(d2, relay_digest(&r));
    ck_assert_uint_eq(counter(&e, "recoveries_dump"), 1);
    ck_assert_uint_eq(counter(&e, "dump_blocks_applied"), 35);
    pthread_mutex_lock(&r.mu);
    ck_assert_uint_eq(r.dumps, 2);
    pthread_mutex_unlock(&r.mu);
    fake_relay_stop(&r);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* Envelopes lost on the way: the next one shows the gap, the relay sends
 * the missing ones, all apply in order; a lost tail shows in the relay's
 * heartbeat. */
START_TEST(service_repairs_a_gap_with_events) {
    env e;
    env_start(&e, NULL, NULL);
    fake_relay r;
    fake_relay_start(&r, e.nats.url, RPUB, RWORKER);
    wait_health(&e, "ok");           /* the discovery window is over */
    relay_chain(&r, 1, 0, 5, true);  /* 0..4 */
    relay_chain(&r, 1, 5, 7, false); /* 5, 6 lost */
    relay_chain(&r, 1, 7, 8, true);  /* 7 shows the gap */
    /* the answer's end comes after its envelopes: the counters settle
     * only then */
    wait_counter(&e, "recoveries_events", 1);
    wait_zmq(&e, RPUB, 7);
    ck_assert_uint_eq(chain_score(&e, 1, 8), 8);
    ck_assert_uint_eq(counter(&e, "recoveries_events"), 1);
    /* 5..7: the relay sends all it has from 5; the held 7 is then a
     * duplicate */
    ck_assert_uint_eq(counter(&e, "envelopes_recovered"), 3);
    ck_assert_uint_eq(counter(&e, "gaps"), 1);
    ck_assert_uint_eq(counter(&e, "live_held"), 1);
    ck_assert_uint_eq(counter(&e, "duplicates"), 1);
    ck_assert_uint_eq(counter(&e, "applied"), 5);
    relay_chain(&r, 1, 8, 10, false); /* 8, 9 lost: nothing shows it... */
    fake_relay_announce(&r);          /* ...but the heartbeat */
    wait_counter(&e, "recoveries_events", 2);
    wait_zmq(&e, RPUB, 9);
    ck_assert_uint_eq(chain_score(&e, 1, 10), 10);
    ck_assert_uint_eq(counter(&e, "recoveries_events"), 2);
    ck_assert_str_eq(health_status(&e), "ok");
    uint64_t n, d = blocks_digest_of(&e, RWORKER, &n);
    ck_assert_uint_eq(n, 10);
    ck_assert_uint_eq(d, relay_digest(&r));
    fake_relay_stop(&r);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

/* A relay that takes the request and never answers: after
 * --recovery-timeout-ms its worker is cleared and listed stale (/health,
 * /watermark), counted; its next heartbeat asks for a dump, which heals. */
START_TEST(service_marks_a_silent_relay_stale_then_heals) {
    env e;
    const char *extra[] = {"--recovery-timeout-ms", "1000", NULL};
    env_start(&e, NULL, extra);
    fake_relay r;
    fake_relay_start(&r, e.nats.url, RPUB, RWORKER);
    wait_health(&e, "ok");
    relay_chain(&r, 1, 0, 3, true);
    wait_zmq(&e, RPUB, 2);
    pthread_mutex_lock(&r.mu);
    r.silent = true;
    pthread_mutex_unlock(&r.mu);
    relay_chain(&r, 1, 3, 4, false);
    relay_chain(&r, 1, 4, 5, true); /* a gap nobody answers */
    wait_counter(&e, "recovery_failures", 1);
    wait_health(&e, "stale");
    json_object *h = get_json(&e, "/health");
    tt_json_eq(json_object_get(tt_json_at(h, "stale")),
               "[{\"publisher_id\":7,\"worker_id\":3,\"dp_rank\":0}]");
    tt_json_eq(json_object_get(tt_json_at(h, "recovering")), "[]");
    json_object_put(h);
    json_object *w = get_json(&e, "/watermark");
    json_object *p = json_object_array_get_idx(tt_json_at(w, "publishers"), 0);
    ck_assert(json_object_get_boolean(tt_json_at(p, "stale")));
    json_object_put(w);
    ck_assert_uint_eq(chain_score(&e, 1, 5), 0); /* cleared; 4 has no parent */
    pthread_mutex_lock(&r.mu);
    r.silent = false;
    pthread_mutex_unlock(&r.mu);
    fake_relay_announce(&r);
    wait_health(&e, "ok");
    ck_assert_uint_eq(chain_score(&e, 1, 5), 5);
    ck_assert_uint_eq(counter(&e, "recoveries_dump"), 1);
    ck_assert_uint_eq(counter(&e, "stale_publishers"), 0);
    fake_relay_stop(&r);
    ck_assert_int_eq(env_stop(&e), 0);
}
END_TEST

Suite *suite_service(void) {
    Suite *s = suite_create("service");
    TCase *tc = tcase_create("nats");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, service_indexes_the_event_plane_and_answers_http);
    tcase_add_test(tc, service_passes_nats_credentials_through);
    tcase_add_test(tc, service_bounds_publishers_and_pages_long_answers);
    tcase_add_test(tc, service_forgets_idle_publishers);
    tcase_add_test(tc, service_answers_queries_in_the_middle_of_an_envelope);
    tcase_add_test(tc, service_answers_a_request_waiting_behind_a_long_apply);
    tcase_add_test(tc, service_reads_request_bodies_strictly);
    suite_add_tcase(s, tc);
    TCase *tv = tcase_create("views");
    tcase_set_timeout(tv, 120);
    tcase_add_test(tv, service_answers_blocks_and_lookup);
    suite_add_tcase(s, tv);
    TCase *tm = tcase_create("metrics");
    tcase_add_test(tm, metrics_text_is_pinned_line_by_line);
    suite_add_tcase(s, tm);
    return s;
}

Suite *suite_heal(void) {
    Suite *s = suite_create("heal");
    TCase *tc = tcase_create("relay");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc,
                   service_recovers_its_index_from_the_relay_after_a_restart);
    tcase_add_test(tc, service_repairs_a_gap_with_events);
    tcase_add_test(tc, service_marks_a_silent_relay_stale_then_heals);
    suite_add_tcase(s, tc);
    return s;
}
