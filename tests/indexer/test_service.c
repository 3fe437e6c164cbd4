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

/* The port the indexer logged ("listening on http://127.0.0.1:PORT"). */
static uint16_t logged_port(kt_proc *p) {
    for (int i = 0; i < 1000; i++) {
        size_t len;
        FILE *f = fopen(p->proc.log_path, "rb");
        if (f) {
            char buf[8192];
            len = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[len] = '\0';
            const char *at = strstr(buf, "listening on http://127.0.0.1:");
            if (at) return (uint16_t)atoi(at + strlen("listening on http://127.0.0.1:"));
        }
        ck_assert_msg(kvo_proc_alive(&p->proc), "kvo-indexer died");
        usleep(10000);
    }
    kvo_proc_dump_log(&p->proc, 50);
    ck_abort_msg("kvo-indexer never logged its port");
    return 0;
}

static void env_start(env *e, const char *const extra[]) {
    memset(e, 0, sizeof(*e));
    kt_nats_start(&e->nats);
    const char *args[16] = {"--nats", e->nats.url, "--http", "127.0.0.1:0",
                            "--block-size", "4"};
    int n = 6;
    for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    kt_proc_start(&e->idx, "kvo-indexer", args);
    uint16_t port = logged_port(&e->idx);
    snprintf(e->base, sizeof(e->base), "http://127.0.0.1:%u", port);
    char url[128];
    snprintf(url, sizeof(url), "%s/health", e->base);
    kt_proc_wait_http(&e->idx, url, 10000);
    ck_assert_int_eq(natsConnection_ConnectTo(&e->nc, e->nats.url), NATS_OK);
    ck_assert_int_eq(kvo_http_client_new(&e->http, 5000), KVO_OK);
    kvo_http_resp_init(&e->resp);
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
    ck_assert_int_eq(natsMsg_Create(&m, SUBJECT, NULL, (const char *)b, (int)len),
                     NATS_OK);
    if (hdr) ck_assert_int_eq(natsMsgHeader_Set(m, "KVO-Zmq-Seq", hdr), NATS_OK);
    ck_assert_int_eq(natsConnection_PublishMsg(e->nc, m), NATS_OK);
    natsMsg_Destroy(m);
    ck_assert_int_eq(natsConnection_FlushTimeout(e->nc, 5000), NATS_OK);
}

static void publish_vector(env *e, const char *name, const char *hdr) {
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/vectors/event_plane/%s.bin", name);
    char *path = kt_src_path(rel);
    size_t len;
    uint8_t *b = kt_read_file(path, &len);
    publish(e, b, len, hdr);
    kvo_free(b);
    kvo_free(path);
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
    json_object *j = get_json(e, "/counters"), *v;
    ck_assert_msg(json_object_object_get_ex(j, key, &v), "no counter %s", key);
    uint64_t r = json_object_get_uint64(v);
    json_object_put(j);
    return r;
}

/* Blocks of worker (7, 0) per GET /workers. */
static uint64_t tt_blocks_http(env *e) {
    json_object *j = get_json(e, "/workers");
    uint64_t r = UINT64_MAX;
    for (size_t i = 0; i < json_object_array_length(j); i++) {
        json_object *w = json_object_array_get_idx(j, i), *id, *rank, *b;
        json_object_object_get_ex(w, "worker_id", &id);
        json_object_object_get_ex(w, "dp_rank", &rank);
        json_object_object_get_ex(w, "blocks", &b);
        if (json_object_get_uint64(id) == 7 && json_object_get_uint64(rank) == 0)
            r = json_object_get_uint64(b);
    }
    json_object_put(j);
    return r;
}

/* Poll (no timing assertion: the deadline only bounds a failure). */
static void wait_messages(env *e, uint64_t n) {
    for (int i = 0; i < 2000; i++) {
        if (counter(e, "messages") >= n) return;
        usleep(5000);
    }
    kvo_proc_dump_log(&e->idx.proc, 50);
    ck_abort_msg("indexer never saw %llu messages", (unsigned long long)n);
}

START_TEST(service_indexes_the_event_plane_and_answers_http) {
    env e;
    env_start(&e, NULL);
    char *out, q[256];
    snprintf(q, sizeof(q), "{\"tokens_hashes\": [%llu, %llu, 3]}",
             (unsigned long long)H1, (unsigned long long)H2);

    publish_vector(&e, "stored_two_blocks", "10-12");
    wait_messages(&e, 1);
    ck_assert_int_eq(post(&e, "/query_by_hash", q, &out), 200);
    ck_assert_str_eq(out, "{\"isl_blocks\":3,\"scores\":[{\"worker_id\":7,"
                          "\"dp_rank\":0,\"blocks\":2}]}");
    /* tokens [1,2,3,4] (block size 4) hash to H1; 6 tokens = 2 blocks */
    ck_assert_int_eq(post(&e, "/query", "{\"token_ids\": [1,2,3,4,5,6]}", &out), 200);
    ck_assert_str_eq(out, "{\"isl_blocks\":2,\"scores\":[{\"worker_id\":7,"
                          "\"dp_rank\":0,\"blocks\":1}]}");
    ck_assert_int_eq(post(&e, "/query", "{\"token_ids\": [1,2,3,4], \"cache_salt\": \"s\"}",
                          &out), 200);
    ck_assert_str_eq(out, "{\"isl_blocks\":1,\"scores\":[]}");

    publish_vector(&e, "removed_one", NULL);
    publish_vector(&e, "removed_one", NULL); /* duplicate */
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

    json_object *w = get_json(&e, "/watermark");
    ck_assert_str_eq(json_object_to_json_string_ext(w, JSON_C_TO_STRING_PLAIN),
                     "{\"publishers\":[{\"publisher_id\":42,\"last_sequence\":3,"
                     "\"messages\":3,\"gaps\":1,\"missed\":1,\"duplicates\":1,"
                     "\"restarts\":0,\"zmq_seq_first\":10,\"zmq_seq_last\":20}]}");
    json_object_put(w);
    w = get_json(&e, "/workers");
    ck_assert_str_eq(json_object_to_json_string_ext(w, JSON_C_TO_STRING_PLAIN),
                     "[{\"worker_id\":7,\"dp_rank\":0,\"blocks\":1},"
                     "{\"worker_id\":9,\"dp_rank\":2,\"blocks\":0}]");
    json_object_put(w);
    w = get_json(&e, "/dump");
    ck_assert_str_eq(json_object_to_json_string_ext(w, JSON_C_TO_STRING_PLAIN),
                     "[{\"worker_id\":7,\"storage_tier\":\"device\",\"event\":"
                     "{\"event_id\":0,\"data\":{\"stored\":{\"parent_hash\":null,"
                     "\"start_position\":null,\"blocks\":[{\"block_hash\":"
                     "14643705804678351452,\"tokens_hash\":14643705804678351452,"
                     "\"mm_extra_info\":null}]}},\"dp_rank\":0}}]");
    json_object_put(w);
    w = get_json(&e, "/health");
    json_object *v;
    ck_assert(json_object_object_get_ex(w, "nats", &v));
    ck_assert_str_eq(json_object_get_string(v), "connected");
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
        "kvo_indexer_duplicates_total 1\n", "kvo_indexer_gaps_total 1\n",
        "kvo_indexer_undecodable_total 1\n", "kvo_indexer_pairs 1\n",
        "kvo_indexer_resident_blocks 1\n", "kvo_indexer_workers 2\n",
        "kvo_indexer_query_seconds_count 4\n",
        "# TYPE kvo_indexer_query_seconds histogram\n"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(want); i++)
        ck_assert_msg(strstr(m, want[i]), "metrics lack %s", want[i]);

    /* bad requests: a JSON error with a 4xx */
    ck_assert_int_eq(post(&e, "/query", "{\"token_ids\": [1,", &out), 400);
    ck_assert_msg(strstr(out, "\"error\""), "%s", out);
    ck_assert_int_eq(post(&e, "/query", "[1]", &out), 400);
    ck_assert_int_eq(post(&e, "/query", "{\"tokens_hashes\": [1]}", &out), 400);
    ck_assert_int_eq(post(&e, "/query_by_hash", "{\"token_ids\": [1]}", &out), 400);
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
    static const char *const token[] = {"--auth", "s3cret", NULL};
    kt_nats ns;
    kt_nats_start_args(&ns, token);
    const char *url = ns.url;

    env e;
    memset(&e, 0, sizeof(e));
    const char *args[] = {"--nats", url, "--nats-token", "s3cret", "--http",
                          "127.0.0.1:0", NULL};
    kt_proc_start(&e.idx, "kvo-indexer", args);
    snprintf(e.base, sizeof(e.base), "http://127.0.0.1:%u", logged_port(&e.idx));
    ck_assert_int_eq(kvo_http_client_new(&e.http, 5000), KVO_OK);
    kvo_http_resp_init(&e.resp);
    natsOptions *o;
    ck_assert_int_eq(natsOptions_Create(&o), NATS_OK);
    ck_assert_int_eq(natsOptions_SetURL(o, url), NATS_OK);
    ck_assert_int_eq(natsOptions_SetToken(o, "s3cret"), NATS_OK);
    ck_assert_int_eq(natsConnection_Connect(&e.nc, o), NATS_OK);
    natsOptions_Destroy(o);
    /* publish until the indexer, once subscribed, has applied one */
    for (int i = 0; i < 400 && counter(&e, "applied") == 0; i++) {
        publish_vector(&e, "stored_two_blocks", NULL);
        usleep(10000);
    }
    ck_assert_uint_ge(counter(&e, "applied"), 1);
    ck_assert_uint_eq(tt_blocks_http(&e), 2);
    kvo_http_resp_fini(&e.resp);
    kvo_http_client_free(e.http);
    natsConnection_Destroy(e.nc);
    ck_assert_int_eq(kt_proc_stop(&e.idx), 0);
    kt_nats_stop(&ns);

    kt_proc p;
    const char *bad[] = {"--nats", url, "--nats-user", "u", NULL};
    kt_proc_start(&p, "kvo-indexer", bad);
    for (int i = 0; i < 500 && kvo_proc_alive(&p.proc); i++) usleep(10000);
    ck_assert(!kvo_proc_alive(&p.proc));
    ck_assert_int_eq(p.proc.exit_status, 2);
    kt_proc_stop(&p);
}
END_TEST

Suite *suite_service(void) {
    Suite *s = suite_create("service");
    TCase *tc = tcase_create("nats");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, service_indexes_the_event_plane_and_answers_http);
    tcase_add_test(tc, service_passes_nats_credentials_through);
    suite_add_tcase(s, tc);
    return s;
}
