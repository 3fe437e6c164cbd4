/* The publisher: PUB frames, the ROUTER replay protocol (vLLM >= 0.26 form)
 * with a real DEALER client, and capture files. Real ZeroMQ sockets on
 * loopback ports picked by the kernel. */
#include "mt.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

Suite *suite_pub(void);

typedef struct env {
    void *ctx;
    mock_pub *pub;
    mock_replay_served served; /* summed over every serve call */
} env;

/* One mock_pub_replay_serve, its report added to e->served. */
static void serve_once(env *e) {
    mock_replay_served d;
    memset(&d, 0xff, sizeof(d)); /* every field must be written */
    mock_pub_replay_serve(e->pub, &d);
    e->served.requests += d.requests;
    e->served.bad_requests += d.bad_requests;
    e->served.cut += d.cut;
    e->served.batches += d.batches;
}

static void env_init_mut(env *e, const char *topic, uint32_t ring,
                         wire_cap_writer *rec, unsigned mut) {
    memset(e, 0, sizeof(*e));
    e->ctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(e->ctx);
    mock_pub_cfg pc = {.zmq_ctx = e->ctx,
                       .endpoint = "tcp://127.0.0.1:*",
                       .replay_endpoint = "tcp://127.0.0.1:*",
                       .topic = topic,
                       .hwm = 1000,
                       .ring = ring,
                       .record = rec,
                       .mutations = mut};
    char err[256];
    ck_assert_msg(mock_pub_new(&e->pub, &pc, err, sizeof(err)) == KVO_OK, "%s",
                  err);
    ck_assert(strncmp(mock_pub_endpoint(e->pub), "tcp://127.0.0.1:", 16) == 0);
    ck_assert(
        strncmp(mock_pub_replay_endpoint(e->pub), "tcp://127.0.0.1:", 16) == 0);
}

static void env_init(env *e, const char *topic, uint32_t ring,
                     wire_cap_writer *rec) {
    env_init_mut(e, topic, ring, rec, 0);
}

static void env_fini(env *e) {
    mock_pub_free(e->pub);
    zmq_ctx_term(e->ctx);
}

/* One multipart message; returns the frame count (frames copied). */
static int recv_msg(void *s, uint8_t fr[][256], size_t len[], int max) {
    int n = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        ck_assert_msg(zmq_msg_recv(&m, s, 0) >= 0, "recv: %s",
                      zmq_strerror(zmq_errno()));
        if (n < max) {
            len[n] = zmq_msg_size(&m) < 256 ? zmq_msg_size(&m) : 256;
            memcpy(fr[n], zmq_msg_data(&m), len[n]);
        }
        n++;
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (!more) return n;
    }
}

/* Serve the ROUTER until a reply is waiting at the dealer. */
static void serve(env *e, void *dealer) {
    zmq_pollitem_t it = {dealer, 0, ZMQ_POLLIN, 0};
    for (int i = 0; i < 500; i++) {
        serve_once(e);
        if (zmq_poll(&it, 1, 10) > 0) return;
    }
    ck_abort_msg("no replay reply");
}

/* A replay client of e's ROUTER. */
static void *dealer(env *e) {
    return mt_zsock(e->ctx, ZMQ_DEALER, mock_pub_replay_endpoint(e->pub), 5000,
                    0);
}

/* A replay client that asked for every batch from start on; its reply is
 * waiting. */
static void *replay_from(env *e, uint64_t start) {
    void *d = dealer(e);
    mt_replay_request(d, start);
    serve(e, d);
    return d;
}

START_TEST(pub_sends_topic_sequence_and_payload_frames) {
    env e;
    env_init(&e, "kv-events", 100, NULL);
    void *sub = mt_zsock(e.ctx, ZMQ_SUB, mock_pub_endpoint(e.pub), 5000, 0);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv", 2); /* a prefix match */
    int tmo = 50;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    /* Slow joiner: publish until the subscription is live. */
    uint8_t fr[4][256];
    size_t len[4];
    uint64_t sent = 0;
    int n = 0;
    for (int tries = 0; tries < 200 && n == 0; tries++) {
        mock_pub_send(e.pub, (const uint8_t *)"payload", 7);
        sent++;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sub, 0) >= 0) {
            len[0] = zmq_msg_size(&m);
            memcpy(fr[0], zmq_msg_data(&m), len[0]);
            n = 1;
            while (zmq_msg_more(&m)) {
                zmq_msg_close(&m);
                zmq_msg_init(&m);
                zmq_msg_recv(&m, sub, 0);
                len[n] = zmq_msg_size(&m);
                memcpy(fr[n], zmq_msg_data(&m), len[n]);
                n++;
            }
        }
        zmq_msg_close(&m);
    }
    ck_assert_int_eq(n, 3);
    ck_assert(len[0] == 9 && memcmp(fr[0], "kv-events", 9) == 0);
    ck_assert_uint_eq(len[1], 8);
    uint64_t first = mt_seq(fr[1], len[1]);
    ck_assert_uint_lt(first, sent);
    ck_assert(len[2] == 7 && memcmp(fr[2], "payload", 7) == 0);
    /* The next ones follow with seq + 1. */
    tmo = 5000;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    uint64_t end = sent + 3;
    for (uint64_t k = first + 1; k < end; k++) {
        if (k >= sent) {
            mock_pub_send(e.pub, (const uint8_t *)"x", 1);
            sent++;
        }
        ck_assert_int_eq(recv_msg(sub, fr, len, 4), 3);
        ck_assert_uint_eq(mt_seq(fr[1], len[1]), k);
    }
    uint64_t last;
    ck_assert(mock_pub_last_seq(e.pub, &last));
    ck_assert_uint_eq(last, sent - 1);
    zmq_close(sub);
    env_fini(&e);
}
END_TEST

START_TEST(replay_sends_every_buffered_batch_from_start_then_the_end_marker) {
    env e;
    env_init(&e, "kv-events", 100, NULL);
    char body[32];
    for (int i = 0; i < 6; i++) {
        snprintf(body, sizeof(body), "batch-%d", i);
        mock_pub_send(e.pub, (const uint8_t *)body, strlen(body));
    }
    void *d = replay_from(&e, 2);
    uint8_t fr[8][256];
    size_t len[8];
    for (uint64_t k = 2; k < 6; k++) {
        /* DEALER view: ["", topic, seq, payload] */
        ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
        ck_assert_uint_eq(len[0], 0);
        ck_assert(len[1] == 9 && memcmp(fr[1], "kv-events", 9) == 0);
        ck_assert_uint_eq(mt_seq(fr[2], len[2]), k);
        snprintf(body, sizeof(body), "batch-%d", (int)k);
        ck_assert(len[3] == strlen(body) && memcmp(fr[3], body, len[3]) == 0);
    }
    /* End marker: ["", "", FF x 8, ""] */
    ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
    ck_assert(len[0] == 0 && len[1] == 0 && len[3] == 0);
    ck_assert_uint_eq(mt_seq(fr[2], len[2]), WIRE_REPLAY_END);
    /* A start beyond the last batch: just the end marker. */
    mt_replay_request(d, 99);
    serve(&e, d);
    ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
    ck_assert_uint_eq(mt_seq(fr[2], len[2]), WIRE_REPLAY_END);
    mock_pub_stats ps;
    mock_pub_stats_get(e.pub, &ps);
    ck_assert_uint_eq(ps.replay_requests, 2);
    ck_assert_uint_eq(ps.replay_batches, 4);
    zmq_close(d);
    env_fini(&e);
}
END_TEST

/* replay-drops-topic (vllm#45174): the pre-0.26 reply, ["", seq,
 * payload], and the end marker ["", FF x 8, ""]; replay-drops-tail
 * (sglang#38945): the last two batches and the end marker never come. */
START_TEST(replay_mutants_drop_the_topic_frame_or_the_tail_and_end_marker) {
    env e;
    env_init_mut(&e, "kv-events", 100, NULL, MOCK_MUT_REPLAY_DROPS_TOPIC);
    for (int i = 0; i < 4; i++) mock_pub_send(e.pub, (const uint8_t *)"b", 1);
    void *d = replay_from(&e, 1);
    uint8_t fr[8][256];
    size_t len[8];
    for (uint64_t k = 1; k < 4; k++) {
        ck_assert_int_eq(recv_msg(d, fr, len, 8), 3);
        ck_assert_uint_eq(len[0], 0);
        ck_assert_uint_eq(mt_seq(fr[1], len[1]), k);
        ck_assert(len[2] == 1 && fr[2][0] == 'b');
    }
    ck_assert_int_eq(recv_msg(d, fr, len, 8), 3);
    ck_assert_uint_eq(mt_seq(fr[1], len[1]), WIRE_REPLAY_END);
    ck_assert_uint_eq(len[2], 0);
    zmq_close(d);
    env_fini(&e);

    env_init_mut(&e, "kv-events", 100, NULL, MOCK_MUT_REPLAY_DROPS_TAIL);
    for (int i = 0; i < 6; i++) mock_pub_send(e.pub, (const uint8_t *)"b", 1);
    d = replay_from(&e, 1);
    int tmo = 300;
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    for (uint64_t k = 1; k < 4; k++) { /* 1..5 wanted: 4 and 5 are lost */
        ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
        ck_assert_uint_eq(mt_seq(fr[2], len[2]), k);
    }
    serve_once(&e);
    zmq_msg_t m;
    zmq_msg_init(&m);
    ck_assert_int_lt(zmq_msg_recv(&m, d, 0),
                     0); /* nothing more, no end marker */
    zmq_msg_close(&m);
    /* only the last batch wanted: it and the end marker are lost */
    mt_replay_request(d, 5);
    for (int i = 0; i < 5; i++) serve_once(&e);
    zmq_msg_init(&m);
    ck_assert_int_lt(zmq_msg_recv(&m, d, 0), 0);
    zmq_msg_close(&m);
    zmq_close(d);
    env_fini(&e);
}
END_TEST

START_TEST(replay_older_than_the_ring_silently_begins_at_the_oldest_batch) {
    env e;
    env_init(&e, "", 3, NULL);
    for (int i = 0; i < 8; i++) mock_pub_send(e.pub, (const uint8_t *)"b", 1);
    void *d = replay_from(&e, 0);
    uint8_t fr[8][256];
    size_t len[8];
    uint64_t want[] = {5, 6, 7, WIRE_REPLAY_END};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
        ck_assert_uint_eq(len[1], 0); /* the empty default topic */
        ck_assert_uint_eq(mt_seq(fr[2], len[2]), want[i]);
    }
    zmq_close(d);
    env_fini(&e);
}
END_TEST

START_TEST(malformed_replay_requests_are_counted_and_ignored) {
    env e;
    env_init(&e, "t", 10, NULL);
    mock_pub_send(e.pub, (const uint8_t *)"b", 1);
    void *d = dealer(&e);
    /* No delimiter; a 3-byte seq; too many frames. */
    zmq_send(d, "\0\0\0\0\0\0\0\0", 8, 0);
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, "abc", 3, 0);
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, "\0\0\0\0\0\0\0\0", 8, ZMQ_SNDMORE);
    zmq_send(d, "x", 1, 0);
    mt_replay_request(d, 0); /* then a good one */
    serve(&e, d);
    uint8_t fr[8][256];
    size_t len[8];
    ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
    ck_assert_uint_eq(mt_seq(fr[2], len[2]), 0);
    ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
    ck_assert_uint_eq(mt_seq(fr[2], len[2]), WIRE_REPLAY_END);
    mock_pub_stats ps;
    mock_pub_stats_get(e.pub, &ps);
    ck_assert_uint_eq(ps.bad_requests, 3);
    ck_assert_uint_eq(ps.replay_requests, 1);
    /* The calls said so themselves. */
    ck_assert_uint_eq(e.served.bad_requests, 3);
    ck_assert_uint_eq(e.served.requests, 1);
    ck_assert_uint_eq(e.served.batches, 1);
    ck_assert_uint_eq(e.served.cut, 0);
    zmq_close(d);
    env_fini(&e);
}
END_TEST

/* A client that asks for replays over and over and never reads gets a
 * bounded queue: the replies that do not fit are cut short and counted
 * (without a bound, libzmq would queue all 100 replays, 50 MB here), and a
 * client that reads still gets every batch and the end marker. */
START_TEST(
    a_client_that_never_reads_its_replays_has_them_cut_short_and_counted) {
    env e;
    env_init(&e, "t", 8, NULL);
    static uint8_t big[64 << 10];
    for (int i = 0; i < 8; i++) mock_pub_send(e.pub, big, sizeof(big));
    void *idle = dealer(&e);
    for (int i = 0; i < 100; i++) mt_replay_request(idle, 0);
    mock_pub_stats ps = {0};
    for (int i = 0; i < 1000 && ps.replay_requests < 100; i++) {
        serve_once(&e);
        mock_pub_stats_get(e.pub, &ps);
        usleep(5000);
    }
    ck_assert_uint_eq(ps.replay_requests, 100);
    ck_assert_msg(ps.replay_cut > 0,
                  "all 100 replays queued for a client that never reads");
    ck_assert_uint_eq(e.served.requests, 100);
    ck_assert_uint_eq(e.served.cut, ps.replay_cut);
    ck_assert_uint_eq(e.served.batches, ps.replay_batches);
    void *d = replay_from(&e, 0);
    uint8_t fr[8][256];
    size_t len[8];
    for (uint64_t want = 0; want < 8; want++) {
        ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
        ck_assert_uint_eq(mt_seq(fr[2], len[2]), want);
    }
    ck_assert_int_eq(recv_msg(d, fr, len, 8), 4);
    ck_assert_uint_eq(mt_seq(fr[2], len[2]), WIRE_REPLAY_END);
    zmq_close(d);
    zmq_close(idle);
    env_fini(&e);
}
END_TEST

START_TEST(record_writes_every_published_message_as_three_frames) {
    char *dir = kt_tmpdir("pubrec");
    char path[600];
    snprintf(path, sizeof(path), "%s/cap.kvocap", dir);
    wire_cap_writer *w;
    ck_assert_int_eq(wire_cap_create(&w, path), KVO_OK);
    /* No sockets at all: still numbered, buffered and recorded. */
    mock_pub_cfg pc = {.topic = "kv", .ring = 4, .record = w};
    mock_pub *p;
    ck_assert_int_eq(mock_pub_new(&p, &pc, NULL, 0), KVO_OK);
    ck_assert_str_eq(mock_pub_endpoint(p), "");
    ck_assert_ptr_null(mock_pub_replay_socket(p));
    uint64_t last;
    ck_assert(!mock_pub_last_seq(p, &last));
    for (int i = 0; i < 5; i++)
        mock_pub_send(p, (const uint8_t *)"abcdef", (size_t)i + 1);
    mock_pub_free(p);
    wire_cap_close(w);
    wire_cap_reader *r;
    ck_assert_int_eq(wire_cap_open(&r, path, NULL), KVO_OK);
    wire_cap_record rec;
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(wire_cap_next(r, &rec, NULL), KVO_OK);
        ck_assert_uint_eq(rec.n_frames, 3);
        ck_assert(rec.frames[0].len == 2 &&
                  memcmp(rec.frames[0].data, "kv", 2) == 0);
        ck_assert_uint_eq(mt_seq(rec.frames[1].data, rec.frames[1].len),
                          (uint64_t)i);
        ck_assert_uint_eq(rec.frames[2].len, (size_t)i + 1);
    }
    ck_assert_int_eq(wire_cap_next(r, &rec, NULL), KVO_EOF);
    wire_cap_free(r);
    remove(path);
    rmdir(dir);
    kvo_free(dir);
}
END_TEST

START_TEST(a_port_in_use_fails_the_bind_with_a_message) {
    env e;
    env_init(&e, "", 10, NULL);
    mock_pub_cfg pc = {.zmq_ctx = e.ctx, .endpoint = mock_pub_endpoint(e.pub)};
    mock_pub *p2 = NULL;
    char err[256];
    ck_assert_int_eq(mock_pub_new(&p2, &pc, err, sizeof(err)), KVO_ENET);
    ck_assert_ptr_null(p2);
    ck_assert_msg(strstr(err, "bind") != NULL, "%s", err);
    env_fini(&e);
}
END_TEST

Suite *suite_pub(void) {
    const TTest *tests[] = {
        pub_sends_topic_sequence_and_payload_frames,
        replay_sends_every_buffered_batch_from_start_then_the_end_marker,
        replay_older_than_the_ring_silently_begins_at_the_oldest_batch,
        replay_mutants_drop_the_topic_frame_or_the_tail_and_end_marker,
        malformed_replay_requests_are_counted_and_ignored,
        a_client_that_never_reads_its_replays_has_them_cut_short_and_counted,
        record_writes_every_published_message_as_three_frames,
        a_port_in_use_fails_the_bind_with_a_message,
    };
    return mt_suite(suite_create("pub"), 60, tests, KVO_ARRAY_LEN(tests));
}
