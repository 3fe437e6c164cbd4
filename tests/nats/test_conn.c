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

static kvo_nats *nats_new(const kvo_nats_cfg *c) {
    kvo_nats *n = NULL;
    char err[512] = "";
    ck_assert_msg(kvo_nats_new(&n, c, "kvo-test", err, sizeof(err)) == KVO_OK,
                  "kvo_nats_new: %s", err);
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
    ck_assert_int_eq(natsConnection_SubscribeSync(&sub, nc, "kvo.test"), NATS_OK);
    ck_assert_int_eq(natsConnection_PublishString(nc, "kvo.test", "hi"), NATS_OK);
    ck_assert_int_eq(natsSubscription_NextMsg(&m, sub, WAIT_MS), NATS_OK);
    ck_assert_str_eq(natsMsg_GetData(m), "hi");
    natsMsg_Destroy(m);
    natsSubscription_Destroy(sub);
}

/* User and password go to the server: right ones connect, a wrong password
 * never gets the connection up. */
START_TEST(credentials_reach_the_server) {
    uint16_t port;
    ck_assert_int_eq(kvo_free_port(&port), KVO_OK);
    char exe[512], ps[16], url[64], log[700];
    ck_assert_int_eq(kvo_find_exe("nats-server", exe, sizeof(exe)), KVO_OK);
    snprintf(ps, sizeof(ps), "%u", port);
    snprintf(url, sizeof(url), "nats://127.0.0.1:%u", port);
    char *dir = kt_tmpdir("nats-user");
    snprintf(log, sizeof(log), "%s/nats-server.log", dir);
    char *const argv[] = {exe, "-a", "127.0.0.1", "-p", ps, "--user", "kvo",
                          "--pass", "s3cret", NULL};
    kvo_proc ns;
    ck_assert_int_eq(kvo_proc_spawn(&ns, "nats-server", argv, log), KVO_OK);
    kt_guard g;
    kt_guard_start(&g, &ns);
    ck_assert_int_eq(kvo_wait_tcp(&ns, "127.0.0.1", port, WAIT_MS), KVO_OK);

    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    c.url = url;
    c.user = "kvo";
    c.password = "s3cret";
    kvo_nats *n = nats_new(&c);
    char err[512] = "";
    ck_assert_msg(kvo_nats_connect(n, err, sizeof(err)) == KVO_OK, "%s", err);
    ck_assert(kvo_nats_up(n));
    round_trip(n);
    ck_assert(kvo_nats_close(n, 1000));
    ck_assert(!kvo_nats_up(n));
    kvo_nats_free(n);

    c.password = "wrong";
    n = nats_new(&c);
    kvo_status st = kvo_nats_connect(n, err, sizeof(err));
    ck_assert_int_ne(st, KVO_OK);
    ck_assert(!kvo_nats_up(n));
    if (st == KVO_ENATS) ck_assert_ptr_nonnull(strstr(err, "NATS connect"));
    ck_assert(kvo_nats_close(n, 1000));
    kvo_nats_free(n);

    kt_guard_release(&g);
    kvo_proc_stop(&ns, 5000);
    kvo_free(dir);
}
END_TEST

/* Not there yet (connect says EAGAIN, nats.c keeps trying), then up; the
 * server stops (down, one disconnect) and comes back (up, one reconnect).
 * Only nats.c's callbacks tell: kvo_nats_up takes no lock. */
START_TEST(the_state_follows_the_server) {
    kt_nats ns;
    kt_nats_start(&ns);
    kt_nats_stop(&ns);
    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    c.url = ns.url;
    c.reconnect_wait_ms = 50;
    kvo_nats *n = nats_new(&c);
    char err[512] = "";
    ck_assert_int_eq(kvo_nats_connect(n, err, sizeof(err)), KVO_EAGAIN);
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
    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    c.url = ns.url;
    c.reconnect_wait_ms = 50;
    kvo_nats *n = nats_new(&c);
    char err[512] = "";
    ck_assert_msg(kvo_nats_connect(n, err, sizeof(err)) == KVO_OK, "%s", err);
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
