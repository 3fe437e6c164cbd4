/* relay_source against real ZMQ sockets: what libzmq's socket monitor says
 * becomes relay_link events, and a SUB that libzmq gives up for good is
 * made anew. No relay process: the source alone. */
#include "tr.h"

#include <stdio.h>
#include <string.h>
#include <zmq.h>

Suite *suite_source(void);

#define WAIT_MS 15000
#define MAX_MSG 100 /* --zmq-max-msg-bytes of the sources under test */

/* The next link event of s within timeout_ms (false when none came). */
static bool next_link(relay_source *s, long timeout_ms, relay_link *what) {
    uint64_t end = kvo_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        kvo_err err;
        kvo_status st = relay_source_event(s, kvo_now_ns(), what, &err);
        if (st == KVO_OK) return true;
        ck_assert_int_eq(st, KVO_EAGAIN);
        if (kvo_now_ns() > end) return false;
        zmq_pollitem_t it[2] = {
            {relay_source_sub_monitor(s), 0, ZMQ_POLLIN, 0},
            {relay_source_dealer_monitor(s), 0, ZMQ_POLLIN, 0}};
        zmq_poll(it, it[1].socket ? 2 : 1, 20);
    }
}

/* The next link event other than ignore. */
static relay_link expect_link(relay_source *s, relay_link ignore) {
    relay_link w;
    do {
        ck_assert_msg(next_link(s, WAIT_MS, &w), "no link event in %d ms",
                      WAIT_MS);
    } while (w == ignore);
    return w;
}

/* [topic][seq][payload of len bytes] on pub. */
static void pub_send(void *pub, size_t len) {
    static uint8_t payload[4 * MAX_MSG];
    ck_assert_uint_le(len, sizeof(payload));
    uint8_t seq[8];
    wire_seq_put(seq, 0);
    zmq_send(pub, "t", 1, ZMQ_SNDMORE);
    zmq_send(pub, seq, sizeof(seq), ZMQ_SNDMORE);
    zmq_send(pub, payload, len, 0);
}

/* Small messages on pub until s's SUB receives one (a new subscriber
 * misses what is sent before its subscription arrives). */
static void sub_gets_through(void *pub, relay_source *s) {
    relay_rx rx;
    uint64_t end = kvo_now_ns() + (uint64_t)WAIT_MS * 1000000u;
    while (kvo_now_ns() < end) {
        pub_send(pub, 10);
        zmq_pollitem_t it = {relay_source_sub(s), 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 20);
        if (relay_source_recv_sub(s, &rx) == KVO_OK) {
            ck_assert_uint_eq(rx.n, 3);
            while (relay_source_recv_sub(s, &rx) == KVO_OK) {
            }
            return;
        }
    }
    ck_abort_msg("the SUB never received a message");
}

static void *pub_bind(void *zctx, const char *ep) {
    void *pub = zmq_socket(zctx, ZMQ_PUB);
    int zero = 0;
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
    uint64_t end = kvo_now_ns() + (uint64_t)WAIT_MS * 1000000u;
    while (zmq_bind(pub, ep) != 0) { /* the port may linger a moment */
        ck_assert_msg(kvo_now_ns() < end, "cannot bind %s", ep);
        zmq_poll(NULL, 0, 20);
    }
    return pub;
}

static relay_source *source_new(void *zctx, const char *ep,
                                const char *replay) {
    relay_source_cfg cfg = {.endpoint = ep,
                            .topic = "",
                            .replay_endpoint = replay,
                            .hwm = 1000,
                            .max_msg_bytes = MAX_MSG,
                            .linger_ms = 0};
    relay_source *s = NULL;
    ck_assert_int_eq(relay_source_new(&s, zctx, &cfg), KVO_OK);
    return s;
}

/* A frame over ZMQ_MAXMSGSIZE is a protocol error: libzmq drops the
 * connection and never reconnects that SUB. The source says so, makes a
 * new SUB after RELAY_SOURCE_REOPEN_MS, and the new one receives. */
/* A PUB on a free port and a source subscribed to it, connected and
 * receiving. */
typedef struct live {
    void *zctx;
    void *pub;
    char ep[128];
    relay_source *s;
} live;

static void live_start(live *l) {
    l->zctx = zmq_ctx_new();
    l->pub = pub_bind(l->zctx, "tcp://127.0.0.1:*");
    size_t el = sizeof(l->ep);
    ck_assert_int_eq(zmq_getsockopt(l->pub, ZMQ_LAST_ENDPOINT, l->ep, &el), 0);
    l->s = source_new(l->zctx, l->ep, NULL);
    ck_assert_int_eq(expect_link(l->s, RELAY_LINK_COUNT), RELAY_LINK_SUB_UP);
    sub_gets_through(l->pub, l->s);
}

static void live_stop(live *l) {
    relay_source_free(l->s);
    zmq_close(l->pub);
    zmq_ctx_term(l->zctx);
}

START_TEST(a_sub_dropped_for_an_oversize_frame_is_made_anew) {
    live l;
    live_start(&l);
    void *old = relay_source_sub(l.s);
    pub_send(l.pub, 2 * MAX_MSG);
    ck_assert_int_eq(expect_link(l.s, RELAY_LINK_COUNT), RELAY_LINK_SUB_DOWN);
    ck_assert_uint_ne(relay_source_deadline(l.s), 0);
    ck_assert_int_eq(expect_link(l.s, RELAY_LINK_COUNT),
                     RELAY_LINK_SUB_REOPENED);
    ck_assert_ptr_ne(relay_source_sub(l.s), old);
    ck_assert_uint_eq(relay_source_deadline(l.s), 0);
    ck_assert_int_eq(expect_link(l.s, RELAY_LINK_COUNT), RELAY_LINK_SUB_UP);
    sub_gets_through(l.pub, l.s);
    live_stop(&l);
}
END_TEST

/* A publisher that goes away and comes back is libzmq's to reconnect (its
 * monitor says "retrying"): down, then up again on the same SUB. */
START_TEST(a_sub_whose_publisher_comes_back_is_left_to_libzmq) {
    live l;
    live_start(&l);
    void *sub = relay_source_sub(l.s);
    zmq_close(l.pub);
    ck_assert_int_eq(expect_link(l.s, RELAY_LINK_COUNT), RELAY_LINK_SUB_DOWN);
    l.pub = pub_bind(l.zctx, l.ep);
    ck_assert_int_eq(expect_link(l.s, RELAY_LINK_COUNT), RELAY_LINK_SUB_UP);
    ck_assert_ptr_eq(relay_source_sub(l.s), sub);
    sub_gets_through(l.pub, l.s);
    live_stop(&l);
}
END_TEST

/* The replay DEALER is down only when a connection that finished its
 * handshake drops (then a reply may have been lost: a batch over
 * ZMQ_MAXMSGSIZE breaks it like the SUB's). A peer that closes every
 * connection during the handshake makes failed handshakes, no REPLAY_DOWN
 * (the pipe would count the batch it waits for as oversize). */
START_TEST(a_replay_connection_is_down_only_after_its_handshake) {
    void *zctx = zmq_ctx_new();
    tpub *p = tpub_new(true);
    kvo_buf big;
    kvo_buf_init(&big);
    for (int i = 0; i < 2 * MAX_MSG; i++) kvo_buf_printf(&big, "x");
    tpub_send(p, &big, true); /* in the replay ring only */
    tproxy *shut = tproxy_new(1);
    tproxy_gate(shut, false); /* accepts and closes at once */
    char rep[64];
    snprintf(rep, sizeof(rep), "tcp://127.0.0.1:%u", tproxy_port(shut));
    relay_source *a = source_new(zctx, tpub_endpoint(p), rep);
    ck_assert_int_eq(relay_source_replay_request(a, 0), KVO_OK);
    for (int failed = 0; failed < 2;) {
        relay_link w = expect_link(a, RELAY_LINK_SUB_UP);
        ck_assert_int_eq(w, RELAY_LINK_HANDSHAKE_FAILED);
        failed++;
    }
    relay_source *b =
        source_new(zctx, tpub_endpoint(p), tpub_replay_endpoint(p));
    ck_assert_int_eq(relay_source_replay_request(b, 0), KVO_OK);
    ck_assert_int_eq(expect_link(b, RELAY_LINK_SUB_UP), RELAY_LINK_REPLAY_DOWN);
    relay_source_free(a);
    relay_source_free(b);
    tproxy_free(shut);
    kvo_buf_fini(&big);
    tpub_free(p);
    zmq_ctx_term(zctx);
}
END_TEST

Suite *suite_source(void) {
    Suite *s = suite_create("source");
    TCase *tc = tcase_create("monitor");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, a_sub_dropped_for_an_oversize_frame_is_made_anew);
    tcase_add_test(tc, a_sub_whose_publisher_comes_back_is_left_to_libzmq);
    tcase_add_test(tc, a_replay_connection_is_down_only_after_its_handshake);
    suite_add_tcase(s, tc);
    return s;
}
