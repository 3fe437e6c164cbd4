/* The services under fire (issue 10): real processes -- nats-server,
 * kvo-indexer, kvo-mocker with its kvo-relay, and a second kvo-relay fed by
 * a ZMQ publisher this test controls -- started once, then, one test after
 * another: garbage and oversized ZMQ frames, token ids out of range, 2,000
 * half-open connections, concurrent large uploads, garbage on the NATS
 * subject, spoofed publisher ids and sequences. After each, the services
 * still answer correctly and their counters name what was refused; at the
 * end every process is alive and its peak memory is under a stated bound.
 *
 *   [test XPUB] --ZMQ--> kvo-relay B (pub 7700, worker 77) --\
 *   kvo-mocker --ZMQ--> kvo-relay A (pub 100, worker 1) -------+--NATS--> kvo-indexer
 *   [test NATS client] -- garbage and spoofed envelopes -------/
 */
#include "kt.h"
#include "kvo_http.h"
#include "kvo_json.h"
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

Suite *suite_services(void);

/* Peak resident memory each process may reach through all of this, KiB:
 * the indexer and relays hold small state (measured: 16 MiB, 34 under
 * ASan); kvo-mocker holds at most 256 MiB of bodies in flight and parses
 * one at a time (measured: 525 MiB, 714 under ASan; json-c's parse alone
 * took 1.8 GiB for one 50 MB prompt). */
#define PEAK_INDEXER_KIB (128u << 10)
#define PEAK_RELAY_KIB (128u << 10)
#define PEAK_MOCKER_KIB (1024u << 10)

#define RELAY_B_MAX_MSG 4096 /* relay B's --zmq-max-msg-bytes */
#define PUB_A 100u           /* relay A's publisher id and worker id */
#define WORKER_A 1u
#define PUB_B 7700u
#define WORKER_B 77u
#define HALF_OPEN 2000
#define UPLOADS 16
#define UPLOAD_BYTES (24u << 20)  /* 16 x 24 MiB: past the 256 MiB cap */
#define UPLOAD_TIMEOUT_MS 300000L /* a sanitizer build parses slowly */
#define WAIT_MS 20000L

static kt_nats nats;
static kt_proc indexer, mocker, relay_a, relay_b;
static char idx_url[64], mock_url[64], relay_a_url[64], relay_b_url[64];
static void *zctx, *xpub;
static char xpub_ep[64];
static uint64_t xpub_seq;

/* ---- helpers -------------------------------------------------------------*/

/* GET or POST (body != NULL) url + path: status and parsed answer into doc
 * (root NULL when it is not JSON). */
static long call(const char *base, const char *path, const char *body,
                 size_t len, kvo_json *doc) {
    kvo_http_client *c;
    ck_assert_int_eq(kvo_http_client_new(&c, 20000), KVO_OK);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    char url[256];
    snprintf(url, sizeof(url), "%s%s", base, path);
    kvo_status st =
        body ? kvo_http_post(c, url, "application/json", body, len, &r)
             : kvo_http_get(c, url, &r);
    ck_assert_msg(st == KVO_OK, "%s: %s", url, kvo_strerror(st));
    if (doc && kvo_json_parse(doc, r.body.data ? r.body.data : (uint8_t *)"",
                              r.body.len, NULL, NULL) != KVO_OK)
        doc->root = NULL;
    long status = r.status;
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    return status;
}

/* A counter from a JSON answer, by a dotted path ("rejects.token_range"). */
static uint64_t counter(const char *base, const char *path, const char *key) {
    kvo_json d;
    kvo_json_init(&d);
    ck_assert_int_eq(call(base, path, NULL, 0, &d), 200);
    const kvo_jv *v = d.root;
    char k[128];
    snprintf(k, sizeof(k), "%s", key);
    for (char *part = strtok(k, "."); part; part = strtok(NULL, "."))
        v = kvo_json_get(v, part);
    uint64_t n = 0;
    ck_assert_msg(kvo_json_u64(v, &n), "%s%s has no counter %s", base, path,
                  key);
    kvo_json_fini(&d);
    return n;
}

/* Waits (bounded) until counter(...) >= want. */
static void wait_counter(const char *base, const char *path, const char *key,
                         uint64_t want) {
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull, n = 0;
    while ((n = counter(base, path, key)) < want && kvo_now_ns() < end)
        usleep(20000);
    ck_assert_msg(n >= want, "%s%s %s = %" PRIu64 ", want >= %" PRIu64, base,
                  path, key, n, want);
}

static void all_healthy(void) {
    ck_assert_int_eq(call(idx_url, "/health", NULL, 0, NULL), 200);
    ck_assert_int_eq(call(mock_url, "/health", NULL, 0, NULL), 200);
    ck_assert_int_eq(call(relay_a_url, "/health", NULL, 0, NULL), 200);
    ck_assert_int_eq(call(relay_b_url, "/health", NULL, 0, NULL), 200);
}

/* The index's score for the given router hashes, for worker w (0 if it
 * does not score). */
static uint64_t index_score(const uint64_t *h, size_t n, uint64_t w) {
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_buf_printf(&b, "{\"tokens_hashes\":[");
    for (size_t i = 0; i < n; i++)
        kvo_buf_printf(&b, "%s%" PRIu64, i ? "," : "", h[i]);
    kvo_buf_printf(&b, "]}");
    kvo_json d;
    kvo_json_init(&d);
    ck_assert_int_eq(call(idx_url, "/query_by_hash", (char *)b.data, b.len, &d),
                     200);
    const kvo_jv *scores = kvo_json_get(d.root, "scores");
    uint64_t got = 0;
    kvo_jv s;
    for (size_t i = 0; kvo_json_at(scores, i, &s); i++) {
        uint64_t wid = 0, blocks = 0;
        kvo_json_u64(kvo_json_get(&s, "worker_id"), &wid);
        kvo_json_u64(kvo_json_get(&s, "blocks"), &blocks);
        if (wid == w) got = blocks;
    }
    kvo_json_fini(&d);
    kvo_buf_fini(&b);
    return got;
}

/* ---- the test's ZMQ publisher (relay B's engine) ---------------------------*/

static void zsend_frames(const void *const *f, const size_t *n, int count) {
    for (int i = 0; i < count; i++)
        ck_assert_int_ge(
            zmq_send(xpub, f[i], n[i], i + 1 < count ? ZMQ_SNDMORE : 0), 0);
}

/* A well-formed message with the next sequence. */
static void zsend(const void *payload, size_t len) {
    uint8_t seq[8];
    wire_seq_put(seq, xpub_seq++);
    const void *f[] = {"", seq, payload};
    size_t n[] = {0, 8, len};
    zsend_frames(f, n, 3);
}

/* A batch storing one block (block hash h, parent none) whose tokens are
 * 16 copies of token; its router hash into *th. */
static void zsend_store(uint64_t h, uint64_t token, uint64_t *th) {
    wire_batch b;
    wire_batch_init(&b);
    wire_event ev = {.type = WIRE_EV_STORED, .layout = WIRE_LAYOUT_MAP};
    wire_hash hash = {.kind = WIRE_HASH_UINT, .key = h};
    uint64_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = token;
    ev.n_hashes = 1;
    ev.hashes = &hash;
    ev.n_tokens = 16;
    ev.token_ids = tok;
    ev.block_size = (wire_int){true, 16};
    b.ts = 1.0;
    b.batch_len = 3;
    b.n_events = 1;
    b.events = &ev;
    kvo_buf out;
    kvo_buf_init(&out);
    ck_assert_int_eq(wire_batch_encode(&b, WIRE_FMT_MAP, 0, &out), KVO_OK);
    b.events = NULL; /* not the arena's */
    b.n_events = 0;
    wire_batch_fini(&b);
    zsend(out.data, out.len);
    kvo_buf_fini(&out);
    if (th) *th = wire_router_hash(tok, 16, WIRE_ROUTER_SEED);
}

/* ---- setup, once for the suite (an unchecked fixture: the processes live
 * in the runner and every test uses them) ------------------------------------*/

static void start_all(void) {
    kt_nats_start(&nats);
    const char *ia[] = {"--nats",           nats.url, "--http", "127.0.0.1:0",
                        "--max-publishers", "100",    NULL};
    kt_proc_start(&indexer, "kvo-indexer", ia);
    snprintf(idx_url, sizeof(idx_url), "http://127.0.0.1:%u",
             kt_proc_logged_port(&indexer, "listening on http://127.0.0.1:"));
    const char *ma[] = {
        "--port",           "0",   "--zmq-port", "0", "--replay-port", "0",
        "--num-gpu-blocks", "256", NULL};
    kt_proc_start(&mocker, "kvo-mocker", ma);
    snprintf(mock_url, sizeof(mock_url), "http://127.0.0.1:%u",
             kt_proc_logged_port(&mocker, "listening on http://127.0.0.1:"));
    char pub_a[16], wid_a[16], pub_b[16], wid_b[16], maxmsg[16];
    snprintf(pub_a, sizeof(pub_a), "%u", PUB_A);
    snprintf(wid_a, sizeof(wid_a), "%u", WORKER_A);
    snprintf(pub_b, sizeof(pub_b), "%u", PUB_B);
    snprintf(wid_b, sizeof(wid_b), "%u", WORKER_B);
    snprintf(maxmsg, sizeof(maxmsg), "%d", RELAY_B_MAX_MSG);
    const char *ra[] = {"--discover",
                        mock_url,
                        "--nats",
                        nats.url,
                        "--worker-id",
                        wid_a,
                        "--publisher-id",
                        pub_a,
                        "--replay-from",
                        "0",
                        "--metrics-listen",
                        "127.0.0.1:0",
                        NULL};
    kt_proc_start(&relay_a, "kvo-relay", ra);
    snprintf(relay_a_url, sizeof(relay_a_url), "http://127.0.0.1:%u",
             kt_proc_logged_port(&relay_a, "metrics on http://127.0.0.1:"));

    zctx = zmq_ctx_new();
    xpub = zmq_socket(zctx, ZMQ_XPUB);
    int linger = 0;
    zmq_setsockopt(xpub, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_bind(xpub, "tcp://127.0.0.1:*"), 0);
    size_t eplen = sizeof(xpub_ep);
    zmq_getsockopt(xpub, ZMQ_LAST_ENDPOINT, xpub_ep, &eplen);
    const char *rb[] = {"--zmq",
                        xpub_ep,
                        "--nats",
                        nats.url,
                        "--worker-id",
                        wid_b,
                        "--publisher-id",
                        pub_b,
                        "--zmq-max-msg-bytes",
                        maxmsg,
                        "--metrics-listen",
                        "127.0.0.1:0",
                        NULL};
    kt_proc_start(&relay_b, "kvo-relay", rb);
    snprintf(relay_b_url, sizeof(relay_b_url), "http://127.0.0.1:%u",
             kt_proc_logged_port(&relay_b, "metrics on http://127.0.0.1:"));
    /* relay B is subscribed once XPUB hears the subscription */
    uint8_t sub[64];
    ck_assert_int_ge(zmq_recv(xpub, sub, sizeof(sub), 0), 1);
    all_healthy();
}

static void stop_all(void) {
    kt_proc_stop(&relay_b);
    kt_proc_stop(&relay_a);
    kt_proc_stop(&mocker);
    kt_proc_stop(&indexer);
    zmq_close(xpub);
    zmq_ctx_term(zctx);
    kt_nats_stop(&nats);
}

/* ---- the attacks -----------------------------------------------------------*/

START_TEST(malformed_and_oversized_frames_are_counted_and_the_stream_goes_on) {
    uint64_t frames0 = counter(relay_b_url, "/stats", "bad_msgs.frames");
    uint64_t dec0 = counter(relay_b_url, "/stats", "decode_errors_total");
    /* two frames only; a 7-byte sequence; msgpack declaring 4 G elements;
     * bytes that are no batch */
    const void *f2[] = {"", "12345678"};
    size_t n2[] = {0, 8};
    zsend_frames(f2, n2, 2);
    const void *f3[] = {"", "1234567", "\x93"};
    size_t n3[] = {0, 7, 1};
    zsend_frames(f3, n3, 3);
    zsend("\xdd\xff\xff\xff\xff", 5);
    zsend("not a batch at all", 18);
    /* a BlockStored whose token ids do not fit 32 bits */
    zsend_store(0xB0B0, 1ull << 32, NULL);
    /* an oversized frame: libzmq drops relay B's connection */
    static uint8_t big[RELAY_B_MAX_MSG * 4];
    memset(big, 0x90, sizeof(big));
    zsend(big, sizeof(big));
    /* then good batches: the stream goes on (the SUB is recreated; PUB
     * keeps nothing for it meanwhile, so send until one arrives) */
    uint64_t th, h = 0xC0DE0000;
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull;
    do {
        ck_assert_msg(kvo_now_ns() < end, "relay B never forwarded again");
        zsend_store(++h, 4242, &th);
        usleep(50000);
    } while (index_score(&th, 1, WORKER_B) == 0);
    ck_assert_uint_ge(counter(relay_b_url, "/stats", "bad_msgs.frames"),
                      frames0 + 1);
    ck_assert_uint_ge(counter(relay_b_url, "/stats", "bad_msgs.seq"), 1);
    ck_assert_uint_ge(counter(relay_b_url, "/stats", "decode_errors_total"),
                      dec0 + 2);
    ck_assert_uint_eq(counter(relay_b_url, "/stats", "rejects.token_range"), 1);
    ck_assert_uint_ge(counter(relay_b_url, "/stats", "zmq_disconnects"), 1);
    ck_assert_uint_ge(counter(relay_b_url, "/stats", "zmq_sockets_reopened"),
                      1);
    all_healthy();
}
END_TEST

START_TEST(token_ids_and_hashes_out_of_range_are_refused) {
    kvo_json d;
    kvo_json_init(&d);
    const char *prompt = "{\"prompt\":[1,2,4294967296],\"max_tokens\":1}";
    ck_assert_int_eq(
        call(mock_url, "/v1/completions", prompt, strlen(prompt), &d), 400);
    const char *msg = kvo_json_str(kvo_json_get(d.root, "message"), NULL);
    ck_assert_ptr_nonnull(msg); /* vLLM's error shape */
    ck_assert_msg(strstr(msg, "vocab"), "%s", msg);
    const char *q = "{\"tokens_hashes\":[1,18446744073709551616]}";
    ck_assert_int_eq(call(idx_url, "/query_by_hash", q, strlen(q), &d), 400);
    ck_assert_ptr_nonnull(kvo_json_str(kvo_json_get(d.root, "error"), NULL));
    const char *tq = "{\"token_ids\":[4294967296]}";
    ck_assert_int_eq(call(idx_url, "/query", tq, strlen(tq), &d), 400);
    const char *trailing = "{\"tokens_hashes\":[1]} garbage";
    ck_assert_int_eq(
        call(idx_url, "/query_by_hash", trailing, strlen(trailing), &d), 400);
    const char *bad_utf8 = "{\"prompt\":\"\xc0\x80\",\"max_tokens\":1}";
    ck_assert_int_eq(
        call(mock_url, "/v1/completions", bad_utf8, strlen(bad_utf8), &d), 400);
    kvo_json_fini(&d);
    all_healthy();
}
END_TEST

/* A connection from 127.0.0.2 that sends half a request head. */
static int half_open(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in me = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(0x7f000002)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&me, sizeof(me)), 0);
    struct sockaddr_in to = {.sin_family = AF_INET,
                             .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&to, sizeof(to)) != 0) {
        close(fd);
        return -1; /* refused: as good as cut */
    }
    send(fd, "GET /health HTTP/1.1\r\nHo", 24, MSG_NOSIGNAL);
    return fd;
}

START_TEST(half_open_connections_do_not_block_health_or_queries) {
    static int fds[HALF_OPEN];
    uint16_t ports[] = {(uint16_t)atoi(strrchr(idx_url, ':') + 1),
                        (uint16_t)atoi(strrchr(mock_url, ':') + 1)};
    for (int i = 0; i < HALF_OPEN; i++) fds[i] = half_open(ports[i % 2]);
    /* with every one of them held, both services answer */
    for (int k = 0; k < 5; k++) all_healthy();
    uint64_t th = 1;
    index_score(&th, 1, WORKER_A); /* a query answers 200 too */
    for (int i = 0; i < HALF_OPEN; i++)
        if (fds[i] >= 0) close(fds[i]);
    all_healthy();
}
END_TEST

typedef struct upload {
    pthread_t th;
    const char *body;
    long status;
    char why[256]; /* the client's error when there was no answer */
} upload;

static void *do_upload(void *arg) {
    upload *u = arg;
    kvo_http_client *c;
    if (kvo_http_client_new(&c, UPLOAD_TIMEOUT_MS) != KVO_OK) return NULL;
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    char url[128];
    snprintf(url, sizeof(url), "%s/v1/completions", mock_url);
    if (kvo_http_post(c, url, "application/json", u->body, strlen(u->body),
                      &r) == KVO_OK)
        u->status = r.status;
    else
        snprintf(u->why, sizeof(u->why), "%s", kvo_http_client_error(c));
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
    return NULL;
}

/* {"prompt":[1,1,...],"max_tokens":1} of about n bytes: far beyond any
 * max_model_len. */
static char *huge_prompt(size_t n) {
    char *body = kvo_malloc(n + 64);
    ck_assert_ptr_nonnull(body);
    size_t k = (size_t)snprintf(body, 64, "{\"prompt\":[1");
    while (k + 2 < n) {
        body[k++] = ',';
        body[k++] = '1';
    }
    snprintf(body + k, 64, "],\"max_tokens\":1}");
    return body;
}

START_TEST(concurrent_large_uploads_are_answered_within_bounded_memory) {
    char *body = huge_prompt(UPLOAD_BYTES);
    upload u[UPLOADS];
    memset(u, 0, sizeof(u));
    for (int i = 0; i < UPLOADS; i++) {
        u[i].body = body;
        ck_assert_int_eq(pthread_create(&u[i].th, NULL, do_upload, &u[i]), 0);
    }
    for (int i = 0; i < UPLOADS; i++) pthread_join(u[i].th, NULL);
    kvo_free(body);
    int refused = 0;
    for (int i = 0; i < UPLOADS; i++) {
        /* each is refused: too long a prompt (400), or no room (503) */
        ck_assert_msg(u[i].status == 400 || u[i].status == 503,
                      "upload %d: HTTP %ld %s", i, u[i].status, u[i].why);
        refused += u[i].status == 503;
    }
    ck_assert_uint_le(kt_proc_peak_kib(&mocker), PEAK_MOCKER_KIB);
    if (refused)
        ck_assert_uint_ge(
            counter(mock_url, "/kvo/state", "counters.http_busy_refused"), 1);
    all_healthy();
}
END_TEST

static natsConnection *nats_connect(void) {
    natsConnection *nc;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats.url), NATS_OK);
    return nc;
}

static void envelope(kvo_buf *out, uint64_t pub, uint64_t seq, uint64_t wid,
                     uint64_t block, uint64_t th) {
    wire_rblock b = {.block_hash = block, .tokens_hash = th};
    wire_revent ev = {.worker_id = wid,
                      .tier = WIRE_TIER_DEVICE,
                      .event_id = seq + 1,
                      .type = WIRE_R_STORED,
                      .n_blocks = 1,
                      .blocks = &b};
    wire_plane_msg m;
    wire_plane_init(&m);
    m.publisher_id = pub;
    m.sequence = seq;
    m.published_at = 1;
    m.topic = (wire_str){"kv-events", 9};
    m.n_events = 1;
    m.events = &ev;
    kvo_buf_reset(out);
    ck_assert_int_eq(wire_plane_encode(&m, out), KVO_OK);
    m.events = NULL;
    m.n_events = 0;
    wire_plane_fini(&m);
}

START_TEST(garbage_on_the_nats_subject_is_counted) {
    natsConnection *nc = nats_connect();
    char subj[128];
    wire_subject(subj, sizeof(subj), "dynamo", "backend", WIRE_SUBJ_EVENTS, 0);
    uint64_t before = counter(idx_url, "/counters", "undecodable");
    static const char *const junk[] = {"", "\xc1", "\xdd\xff\xff\xff\xff",
                                       "{\"json\": true}", "\x85\xa1x\x01"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(junk); i++)
        ck_assert_int_eq(
            natsConnection_Publish(nc, subj, junk[i], (int)strlen(junk[i])),
            NATS_OK);
    natsConnection_Flush(nc);
    wait_counter(idx_url, "/counters", "undecodable",
                 before + KVO_ARRAY_LEN(junk));
    natsConnection_Destroy(nc);
    all_healthy();
}
END_TEST

START_TEST(spoofed_publishers_and_sequences_do_not_stop_genuine_ones) {
    natsConnection *nc = nats_connect();
    char subj[128];
    wire_subject(subj, sizeof(subj), "dynamo", "backend", WIRE_SUBJ_EVENTS, 0);
    kvo_buf b;
    kvo_buf_init(&b);
    /* 5,000 publisher ids nobody runs: the table stays at its bound */
    for (uint64_t p = 0; p < 5000; p++) {
        envelope(&b, 900000 + p, 0, 900000 + p, 0xABC00000 + p, 77777);
        ck_assert_int_eq(natsConnection_Publish(nc, subj, b.data, (int)b.len),
                         NATS_OK);
    }
    natsConnection_Flush(nc);
    wait_counter(idx_url, "/counters", "publishers_refused", 1);
    ck_assert_uint_le(counter(idx_url, "/counters", "publishers"), 100);
    /* relay B's id, a sequence 1,000 ahead of it */
    uint64_t next = counter(relay_b_url, "/stats", "messages_published");
    envelope(&b, PUB_B, next + 1000, WORKER_B, 0xBAD0BAD0, 55555);
    ck_assert_int_eq(natsConnection_Publish(nc, subj, b.data, (int)b.len),
                     NATS_OK);
    natsConnection_Flush(nc);
    /* relay B's genuine envelopes still reach the index */
    uint64_t th = 0;
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull;
    uint64_t h = 0xD0D00000;
    do {
        ck_assert_msg(kvo_now_ns() < end,
                      "genuine envelopes stopped after a spoofed sequence");
        zsend_store(++h, 31337, &th);
        usleep(50000);
    } while (index_score(&th, 1, WORKER_B) == 0);
    kvo_buf_fini(&b);
    natsConnection_Destroy(nc);
    all_healthy();
}
END_TEST

START_TEST(every_process_stayed_alive_and_within_its_memory_bound) {
    all_healthy();
    printf("peak memory, KiB: indexer %" PRIu64 ", relays %" PRIu64
           " / %" PRIu64 ", mocker %" PRIu64 "\n",
           kt_proc_peak_kib(&indexer), kt_proc_peak_kib(&relay_a),
           kt_proc_peak_kib(&relay_b), kt_proc_peak_kib(&mocker));
    ck_assert_uint_le(kt_proc_peak_kib(&indexer), PEAK_INDEXER_KIB);
    ck_assert_uint_le(kt_proc_peak_kib(&relay_a), PEAK_RELAY_KIB);
    ck_assert_uint_le(kt_proc_peak_kib(&relay_b), PEAK_RELAY_KIB);
    ck_assert_uint_le(kt_proc_peak_kib(&mocker), PEAK_MOCKER_KIB);
}
END_TEST

Suite *suite_services(void) {
    Suite *s = suite_create("services");
    TCase *tc = tcase_create("under_fire");
    tcase_set_timeout(tc, 600);
    tcase_add_unchecked_fixture(tc, start_all, stop_all);
    tcase_add_test(
        tc, malformed_and_oversized_frames_are_counted_and_the_stream_goes_on);
    tcase_add_test(tc, token_ids_and_hashes_out_of_range_are_refused);
    tcase_add_test(tc, half_open_connections_do_not_block_health_or_queries);
    tcase_add_test(tc,
                   concurrent_large_uploads_are_answered_within_bounded_memory);
    tcase_add_test(tc, garbage_on_the_nats_subject_is_counted);
    tcase_add_test(tc,
                   spoofed_publishers_and_sequences_do_not_stop_genuine_ones);
    tcase_add_test(tc, every_process_stayed_alive_and_within_its_memory_bound);
    suite_add_tcase(s, tc);
    return s;
}
