/* test_conn: kvo_nats against a real nats-server: credentials reach it, the
 * connection state follows the server (down, back, not there yet), and a
 * close while a reconnect attempt hangs on a mute peer is confirmed. */
#include "kvo_nats.h"
#include "tn.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

Suite *suite_conn(void);

#define WAIT_MS 15000

/* A client of url (user and password, or NULL), reconnecting every 50 ms;
 * connect says want (err shown otherwise). */
static kvo_nats *nats_connect(const char *url, const char *user,
                              const char *password, kvo_status want) {
    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    c.url = url;
    c.user = user;
    c.password = password;
    c.reconnect_wait_ms = 50;
    kvo_nats *n = NULL;
    char err[512] = "";
    ck_assert_msg(kvo_nats_new(&n, &c, "kvo-test", err, sizeof(err)) == KVO_OK,
                  "kvo_nats_new: %s", err);
    kvo_status st = kvo_nats_connect(n, err, sizeof(err));
    ck_assert_msg(st == want, "connect: %s, not %s (%s)", kvo_strerror(st),
                  kvo_strerror(want), err);
    return n;
}

/* Poll until n's state is up (and has counted reconnects) or not. */
static void wait_state(kvo_nats *n, bool up, uint64_t disconnects,
                       uint64_t reconnects) {
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull;
    while (kvo_nats_up(n) != up || kvo_nats_disconnects(n) < disconnects ||
           kvo_nats_reconnects(n) < reconnects) {
        ck_assert_msg(kvo_now_ns() < end,
                      "state: up %d (want %d), disconnects %llu (want %llu), "
                      "reconnects %llu (want %llu)",
                      kvo_nats_up(n), up,
                      (unsigned long long)kvo_nats_disconnects(n),
                      (unsigned long long)disconnects,
                      (unsigned long long)kvo_nats_reconnects(n),
                      (unsigned long long)reconnects);
        usleep(10000);
    }
}

/* One message through the server and back on n's own connection. */
static void round_trip(kvo_nats *n) {
    natsConnection *nc = kvo_nats_conn(n);
    natsSubscription *sub = NULL;
    natsMsg *m = NULL;
    ck_assert_int_eq(natsConnection_SubscribeSync(&sub, nc, "kvo.test"),
                     NATS_OK);
    ck_assert_int_eq(natsConnection_PublishString(nc, "kvo.test", "hi"),
                     NATS_OK);
    ck_assert_int_eq(natsSubscription_NextMsg(&m, sub, WAIT_MS), NATS_OK);
    ck_assert_str_eq(natsMsg_GetData(m), "hi");
    natsMsg_Destroy(m);
    natsSubscription_Destroy(sub);
}

/* Until the file at path contains needle (ck_assert within WAIT_MS). */
static void wait_in_file(const char *path, const char *needle) {
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull;
    for (;;) {
        size_t len = 0;
        char *text = (char *)kt_read_file(path, &len);
        bool found = text && memmem(text, len, needle, strlen(needle));
        kvo_free(text);
        if (found) return;
        ck_assert_msg(kvo_now_ns() < end, "no '%s' in %s", needle, path);
        usleep(20000);
    }
}

/* User and password go to the server: the right ones connect; with a wrong
 * password the server refuses the attempt (its log says so) and nats.c
 * keeps retrying, never up. */
START_TEST(credentials_reach_the_server) {
    static const char *const auth[] = {"--user", "kvo", "--pass", "s3cret",
                                       NULL};
    kt_nats ns;
    kt_nats_start_args(&ns, auth);
    kvo_nats *n = nats_connect(ns.url, "kvo", "s3cret", KVO_OK);
    ck_assert(kvo_nats_up(n));
    round_trip(n);
    ck_assert(kvo_nats_close(n, 1000));
    ck_assert(!kvo_nats_up(n));
    kvo_nats_free(n);
    n = nats_connect(ns.url, "kvo", "wrong", KVO_EAGAIN);
    char log[600];
    snprintf(log, sizeof(log), "%s/nats-server.log", ns.dir);
    wait_in_file(log, "authentication error");
    ck_assert(!kvo_nats_up(n));
    ck_assert_uint_eq(kvo_nats_reconnects(n), 0);
    kvo_nats_free(n);
    kt_nats_stop(&ns);
}
END_TEST

/* Not there yet (connect says EAGAIN, nats.c keeps trying), then up; the
 * server stops (down, one disconnect) and comes back (up, one reconnect).
 * Only nats.c's callbacks tell: kvo_nats_up takes no lock. */
START_TEST(the_state_follows_the_server) {
    kt_nats ns;
    kt_nats_start(&ns);
    kt_nats_stop(&ns);
    kvo_nats *n = nats_connect(ns.url, NULL, NULL, KVO_EAGAIN);
    ck_assert_ptr_nonnull(kvo_nats_conn(n));
    ck_assert(!kvo_nats_up(n));
    kt_nats_restart(&ns);
    wait_state(n, true, 0, 0);
    round_trip(n);
    kt_nats_stop(&ns);
    wait_state(n, false, 1, 0);
    ck_assert_uint_eq(kvo_nats_reconnects(n), 0);
    kt_nats_restart(&ns);
    wait_state(n, true, 1, 1);
    round_trip(n);
    ck_assert_uint_eq(kvo_nats_disconnects(n), 1);
    ck_assert(kvo_nats_close(n, 1000));
    ck_assert(kvo_nats_close(n, 1000)); /* idempotent */
    kvo_nats_free(n);
    kt_nats_stop(&ns);
}
END_TEST

/* The server is gone and its port answers TCP but never speaks: nats.c's
 * reconnect attempt holds the connection lock in the handshake. A close
 * then (no flush: not up) still gets nats.c's closed callback. */
START_TEST(a_close_during_a_hung_reconnect_is_confirmed) {
    kt_nats ns;
    kt_nats_start(&ns);
    kvo_nats *n = nats_connect(ns.url, NULL, NULL, KVO_OK);
    kt_nats_stop(&ns);
    int lfd = tn_mute_listen(ns.port);
    int cfd = tn_mute_accept(lfd, WAIT_MS);
    wait_state(n, false, 1, 0);
    ck_assert(kvo_nats_close(n, 2000));
    kvo_nats_free(n);
    close(cfd);
    close(lfd);
}
END_TEST

Suite *suite_conn(void) {
    Suite *s = suite_create("conn");
    TCase *tc = tcase_create("server");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, credentials_reach_the_server);
    tcase_add_test(tc, the_state_follows_the_server);
    tcase_add_test(tc, a_close_during_a_hung_reconnect_is_confirmed);
    suite_add_tcase(s, tc);
    return s;
}
