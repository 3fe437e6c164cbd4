/* kvo-indexer's waiting query, the one round trip of kvo-check's exact
 * lockstep: a query with "wait" is held until the publishers' KVO-Zmq-Seq
 * watermarks reach the asked seqs, and then sees every event up to them;
 * an expired wait answers "covered": false with the watermark; a malformed
 * wait is a 400; kvo-check's compact query body, scanned by hand, gets the
 * answers the general JSON parse gives. Against the real binary and a real nats-server, the
 * messages published with nats.c as kvo-relay would. */
#include "tc.h"
#include "kvo_http.h"
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

Suite *suite_wait(void);

#define SUBJECT "namespace.dynamo.component.backend.kv-events"
#define PUB 777

typedef struct ienv {
    kt_nats nats;
    kt_proc idx;
    natsConnection *nc;
    uint16_t port;
    char base[64];
    kvo_http_client *http;
    uint64_t seq; /* next envelope sequence */
} ienv;

static void ienv_start(ienv *e) {
    memset(e, 0, sizeof(*e));
    kt_nats_start(&e->nats);
    ck_assert_int_eq(kvo_free_port(&e->port), KVO_OK);
    char http[32];
    snprintf(http, sizeof(http), "127.0.0.1:%u", e->port);
    const char *args[] = {"--nats",       e->nats.url, "--http", http,
                          "--block-size", "4",         NULL};
    kt_proc_start(&e->idx, "kvo-indexer", args);
    snprintf(e->base, sizeof(e->base), "http://127.0.0.1:%u", e->port);
    char url[128];
    snprintf(url, sizeof(url), "%s/health", e->base);
    kt_proc_wait_http(&e->idx, url, 10000);
    ck_assert_int_eq(natsConnection_ConnectTo(&e->nc, e->nats.url), NATS_OK);
    ck_assert_int_eq(kvo_http_client_new(&e->http, 10000), KVO_OK);
}

static void ienv_stop(ienv *e) {
    kvo_http_client_free(e->http);
    natsConnection_Destroy(e->nc);
    ck_assert_int_eq(kt_proc_stop(&e->idx), 0);
    kt_nats_stop(&e->nats);
}

/* One envelope from PUB with a stored chain of n blocks (tokens hashes
 * first..first+n-1, block hashes their negation; chained to block first-1
 * unless first is 100), header "a-b". */
static void publish_stored(ienv *e, uint64_t first, uint32_t n,
                           const char *hdr) {
    wire_plane_msg m;
    wire_plane_init(&m);
    wire_rblock blocks[16];
    for (uint32_t i = 0; i < n; i++)
        blocks[i] =
            (wire_rblock){.block_hash = ~(first + i), .tokens_hash = first + i};
    wire_revent ev = {.worker_id = 0,
                      .tier = WIRE_TIER_DEVICE,
                      .event_id = e->seq + 1,
                      .dp_rank = 0,
                      .type = WIRE_R_STORED,
                      .n_blocks = n,
                      .blocks = blocks,
                      .has_parent = first > 100,
                      .parent_hash = ~(first - 1)};
    m.publisher_id = PUB;
    m.sequence = e->seq++;
    m.published_at = 1;
    m.topic = (wire_str){"kv-events", 9};
    m.n_events = 1;
    m.events = &ev;
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(wire_plane_encode(&m, &b), KVO_OK);
    m.events = NULL;
    wire_plane_fini(&m);
    natsMsg *msg;
    ck_assert_int_eq(
        natsMsg_Create(&msg, SUBJECT, NULL, (const char *)b.data, (int)b.len),
        NATS_OK);
    ck_assert_int_eq(natsMsgHeader_Set(msg, "KVO-Zmq-Seq", hdr), NATS_OK);
    ck_assert_int_eq(natsConnection_PublishMsg(e->nc, msg), NATS_OK);
    natsMsg_Destroy(msg);
    ck_assert_int_eq(natsConnection_FlushTimeout(e->nc, 5000), NATS_OK);
    kvo_buf_fini(&b);
}

/* The publisher's zmq_seq_last as the indexer reports it now (-1: none). */
static int64_t zmq_last(ienv *e) {
    char url[128];
    snprintf(url, sizeof(url), "%s/watermark", e->base);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    ck_assert_int_eq(kvo_http_get(e->http, url, &r), KVO_OK);
    json_object *j = json_tokener_parse((const char *)r.body.data), *pubs, *v;
    int64_t last = -1;
    ck_assert(json_object_object_get_ex(j, "publishers", &pubs));
    for (size_t i = 0; i < json_object_array_length(pubs); i++) {
        json_object *p = json_object_array_get_idx(pubs, i);
        if (json_object_object_get_ex(p, "publisher_id", &v) &&
            json_object_get_uint64(v) == PUB &&
            json_object_object_get_ex(p, "zmq_seq_last", &v) && v)
            last = json_object_get_int64(v);
    }
    json_object_put(j);
    kvo_http_resp_fini(&r);
    return last;
}

/* Until the indexer has applied what was published (its watermark). */
static void applied_up_to(ienv *e, int64_t seq) {
    for (int i = 0; i < 1000 && zmq_last(e) < seq; i++) usleep(5000);
    ck_assert_int_eq(zmq_last(e), seq);
}

/* A query sent over a raw socket, answered whenever the indexer decides. */
static int send_query(ienv *e, const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(e->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    char req[2048];
    int n = snprintf(
        req, sizeof(req),
        "POST /query_by_hash HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
        strlen(body), body);
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    return fd;
}

/* Bytes already there (0: none yet), without waiting. */
static ssize_t peek_now(int fd) {
    char c;
    ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : k;
}

/* The whole answer (the connection closes after it); the JSON body. */
static json_object *read_answer(int fd, long *status) {
    static char buf[1 << 16];
    size_t n = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert_msg(poll(&p, 1, 20000) == 1, "no answer");
        ssize_t k = read(fd, buf + n, sizeof(buf) - 1 - n);
        ck_assert_int_ge(k, 0);
        if (k == 0) break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    close(fd);
    ck_assert(sscanf(buf, "HTTP/1.1 %ld", status) == 1);
    const char *body = strstr(buf, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    return json_tokener_parse(body + 4);
}

static int64_t get_int(json_object *o, const char *path) {
    char b[128];
    snprintf(b, sizeof(b), "%s", path);
    char *save = NULL;
    for (char *t = strtok_r(b, ".", &save); t && o;
         t = strtok_r(NULL, ".", &save)) {
        if (json_object_is_type(o, json_type_array))
            o = json_object_array_get_idx(o, (size_t)atoi(t));
        else if (!json_object_object_get_ex(o, t, &o))
            o = NULL;
    }
    ck_assert_msg(o != NULL, "no %s", path);
    return json_object_get_int64(o);
}

START_TEST(a_waiting_query_is_answered_when_the_watermark_arrives_and_sees_it) {
    ienv e;
    ienv_start(&e);
    publish_stored(&e, 100, 2, "0-1"); /* blocks 100, 101 */
    applied_up_to(&e, 1);
    int fd =
        send_query(&e, "{\"tokens_hashes\": [100, 101, 102, 103], \"wait\": "
                       "{\"timeout_ms\": 60000, \"zmq_seq\": [[777, 4]]}}");
    /* a message that does not reach seq 4: still held */
    publish_stored(&e, 102, 1, "2-2");
    applied_up_to(&e, 2);
    ck_assert_msg(peek_now(fd) == 0, "answered before its watermark");
    /* the one that does: answered, and the query sees its blocks */
    publish_stored(&e, 103, 1, "3-4");
    long status;
    json_object *j = read_answer(fd, &status);
    ck_assert_int_eq(status, 200);
    ck_assert_ptr_nonnull(j);
    json_object *c;
    ck_assert(json_object_object_get_ex(j, "covered", &c) &&
              json_object_get_boolean(c));
    ck_assert_int_eq(get_int(j, "scores.0.blocks"), 4);
    ck_assert_int_eq(get_int(j, "watermark.publishers.0.zmq_seq_last"), 4);
    json_object_put(j);
    /* already covered: answered at once */
    fd = send_query(
        &e, "{\"tokens_hashes\": [100], \"wait\": {\"zmq_seq\": [[777, 3]]}}");
    j = read_answer(fd, &status);
    ck_assert_int_eq(status, 200);
    ck_assert_int_eq(get_int(j, "scores.0.blocks"), 1);
    json_object_put(j);
    ienv_stop(&e);
}
END_TEST

START_TEST(an_expired_wait_answers_uncovered_with_the_watermark) {
    ienv e;
    ienv_start(&e);
    publish_stored(&e, 100, 1, "0-0");
    applied_up_to(&e, 0);
    /* an unknown publisher and a seq never reached */
    int fd = send_query(
        &e, "{\"tokens_hashes\": [100], \"wait\": {\"timeout_ms\": 50, "
            "\"zmq_seq\": [[777, 9], [5, 0]]}}");
    long status;
    json_object *j = read_answer(fd, &status);
    ck_assert_int_eq(status, 200);
    json_object *c;
    ck_assert(json_object_object_get_ex(j, "covered", &c) &&
              !json_object_get_boolean(c));
    ck_assert_int_eq(get_int(j, "watermark.publishers.0.zmq_seq_last"), 0);
    ck_assert_int_eq(get_int(j, "scores.0.blocks"), 1);
    json_object_put(j);
    ienv_stop(&e);
}
END_TEST

START_TEST(a_malformed_wait_is_a_bad_request) {
    ienv e;
    ienv_start(&e);
    static const char *bad[] = {
        "{\"tokens_hashes\": [1], \"wait\": 5}",
        "{\"tokens_hashes\": [1], \"wait\": {\"zmq_seq\": [[1]]}}",
        "{\"tokens_hashes\": [1], \"wait\": {\"zmq_seq\": [[1, -2]]}}",
        "{\"tokens_hashes\": [1], \"wait\": {\"zmq_seq\": [], \"timeout_ms\": "
        "-1}}",
        "{\"tokens_hashes\": [1], \"wait\": {\"zmq_seq\": [], \"timeout_ms\": "
        "1e9}}",
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        long status;
        json_object *j = read_answer(send_query(&e, bad[i]), &status);
        ck_assert_msg(status == 400, "%s -> %ld", bad[i], status);
        json_object_put(j);
    }
    ienv_stop(&e);
}
END_TEST

/* Status and body of a plain (non-waiting) query, over the client. */
static long post_query(ienv *e, const char *body, char *out, size_t outsz) {
    char url[128];
    snprintf(url, sizeof(url), "%s/query_by_hash", e->base);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    ck_assert_int_eq(
        kvo_http_post(e->http, url, "application/json", body, strlen(body), &r),
        KVO_OK);
    snprintf(out, outsz, "%s", r.body.data ? (const char *)r.body.data : "");
    long st = r.status;
    kvo_http_resp_fini(&r);
    return st;
}

START_TEST(the_hand_scanned_query_answers_as_the_general_parse) {
    ienv e;
    ienv_start(&e);
    publish_stored(&e, 100, 3, "0-0");
    publish_stored(&e, 103, 2, "1-1");
    applied_up_to(&e, 1);
    /* each compact body (kvo-check's shape, scanned by hand) next to the
     * same request with a space (json-c's way): same status, same answer */
    static const char *const pairs[][2] = {
        {"{\"tokens_hashes\":[100,101,102,103,104,7]}",
         "{ \"tokens_hashes\":[100,101,102,103,104,7]}"},
        {"{\"tokens_hashes\":[]}", "{ \"tokens_hashes\":[]}"},
        {"{\"tokens_hashes\":[0,100]}", "{ \"tokens_hashes\":[0,100]}"},
        {"{\"tokens_hashes\":[100,101],\"metrics\":false}",
         "{ \"tokens_hashes\":[100,101],\"metrics\":false}"},
        {"{\"tokens_hashes\":[18446744073709551615]}",
         "{ \"tokens_hashes\":[18446744073709551615]}"},
        /* not for the scanner: the general answers (400s included) */
        {"{\"tokens_hashes\":[18446744073709551616]}",
         "{ \"tokens_hashes\":[18446744073709551616]}"},
        {"{\"tokens_hashes\":[01]}", "{ \"tokens_hashes\":[01]}"},
        {"{\"tokens_hashes\":[-1]}", "{ \"tokens_hashes\":[-1]}"},
        {"{\"tokens_hashes\":[100],\"tokens_hashes\":[101]}",
         "{ \"tokens_hashes\":[100],\"tokens_hashes\":[101]}"},
        {"{\"tokens_hashes\":[100],\"token_ids\":[1]}",
         "{ \"tokens_hashes\":[100],\"token_ids\":[1]}"},
        {"{\"tokens_hashes\":[100]} x", "{ \"tokens_hashes\":[100]} x"},
        {"{\"tokens_hashes\":[100,]}", "{ \"tokens_hashes\":[100,]}"},
        {"{\"tokens_hashes\":[100", "{ \"tokens_hashes\":[100"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(pairs); i++) {
        char a[4096], b[4096];
        long sa = post_query(&e, pairs[i][0], a, sizeof(a));
        long sb = post_query(&e, pairs[i][1], b, sizeof(b));
        ck_assert_msg(sa == sb && strcmp(a, b) == 0,
                      "%s -> %ld %s\n%s -> %ld %s", pairs[i][0], sa, a,
                      pairs[i][1], sb, b);
    }
    char a[4096];
    ck_assert_int_eq(post_query(&e, pairs[0][0], a, sizeof(a)), 200);
    ck_assert_msg(strstr(a, "\"blocks\":5") != NULL, "%s", a);
    ienv_stop(&e);
}
END_TEST

Suite *suite_wait(void) {
    Suite *s = suite_create("wait");
    TCase *tc = tcase_create("wait");
    tcase_set_timeout(tc, 120);
    tcase_add_test(
        tc, a_waiting_query_is_answered_when_the_watermark_arrives_and_sees_it);
    tcase_add_test(tc, an_expired_wait_answers_uncovered_with_the_watermark);
    tcase_add_test(tc, a_malformed_wait_is_a_bad_request);
    tcase_add_test(tc, the_hand_scanned_query_answers_as_the_general_parse);
    suite_add_tcase(s, tc);
    return s;
}
