/* test_stop: kvo-relay and kvo-indexer stop on SIGTERM, with exit 0 and
 * without needing SIGKILL, when NATS is gone: the server stopped (its port
 * refuses), or its port answers TCP but never speaks (a hung server: the
 * reconnect attempt in flight holds nats.c's connection lock until the
 * (re)connect timeout, KVO_NATS_CONNECT_TIMEOUT_MS).
 *
 * The grace is 2 s: kvo-check allows its children 3 s, and a hung attempt
 * used to hold a teardown for nats.c's default 2 s connect timeout (plus a
 * 2 s flush in kvo-relay when it still thought it was connected). */
#include "kvo_http.h"
#include "kvo_nats.h"
#include "tn.h"

#include <json-c/json.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

Suite *suite_stop(void);

#define GRACE_MS 2000
#define WAIT_MS 15000

typedef enum { RELAY, INDEXER } program;

typedef struct run {
    program prog;
    kt_nats ns;
    kt_proc p;
    char health[96];
    kvo_http_client *http;
} run;

static void run_start(run *r, program prog) {
    memset(r, 0, sizeof(*r));
    r->prog = prog;
    kt_nats_start(&r->ns);
    uint16_t hp, zp;
    ck_assert_int_eq(kvo_free_port(&hp), KVO_OK);
    ck_assert_int_eq(kvo_free_port(&zp), KVO_OK);
    char http[32], zmq[48];
    snprintf(http, sizeof(http), "127.0.0.1:%u", hp);
    snprintf(zmq, sizeof(zmq), "tcp://127.0.0.1:%u", zp); /* nobody there */
    snprintf(r->health, sizeof(r->health), "http://%s/health", http);
    if (prog == RELAY) {
        const char *args[] = {"--zmq",
                              zmq,
                              "--nats",
                              r->ns.url,
                              "--metrics-listen",
                              http,
                              "--nats-reconnect-wait-ms",
                              "50",
                              NULL};
        kt_proc_start(&r->p, "kvo-relay", args);
    } else {
        const char *args[] = {
            "--nats", r->ns.url, "--http", http, "--nats-reconnect-wait-ms",
            "50",     NULL};
        kt_proc_start(&r->p, "kvo-indexer", args);
    }
    kt_proc_wait_http(&r->p, r->health, WAIT_MS);
    ck_assert_int_eq(kvo_http_client_new(&r->http, 5000), KVO_OK);
}

/* Is the program connected to NATS, by its own /health? */
static bool nats_up(run *r) {
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    ck_assert_int_eq(kvo_http_get(r->http, r->health, &resp), KVO_OK);
    ck_assert_int_eq(resp.status, 200);
    kvo_buf_cstr(&resp.body);
    json_object *j = json_tokener_parse((const char *)resp.body.data), *v;
    ck_assert_ptr_nonnull(j);
    bool up;
    if (r->prog == RELAY) {
        ck_assert(json_object_object_get_ex(j, "nats_connected", &v));
        up = json_object_get_boolean(v);
    } else {
        ck_assert(json_object_object_get_ex(j, "nats", &v));
        up = strcmp(json_object_get_string(v), "connected") == 0;
    }
    json_object_put(j);
    kvo_http_resp_fini(&resp);
    return up;
}

static void wait_nats(run *r, bool up) {
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull;
    while (nats_up(r) != up) {
        if (kvo_now_ns() >= end) kvo_proc_dump_log(&r->p.proc, 40);
        ck_assert_msg(kvo_now_ns() < end, "%s never saw NATS %s",
                      r->p.proc.name, up ? "up" : "down");
        usleep(20000);
    }
}

/* SIGTERM: it must end by itself, with status 0, within the grace. */
static void stop_clean(run *r, const char *moment) {
    kvo_http_client_free(r->http);
    kt_guard_release(&r->p.guard);
    kvo_proc_stop(&r->p.proc, GRACE_MS);
    if (r->p.proc.killed || r->p.proc.exit_status != 0)
        kvo_proc_dump_log(&r->p.proc, 40);
    ck_assert_msg(!r->p.proc.killed, "%s, %s: still ran %d ms after SIGTERM",
                  r->p.proc.name, moment, GRACE_MS);
    ck_assert_msg(r->p.proc.exit_status == 0, "%s, %s: exit %d", r->p.proc.name,
                  moment, r->p.proc.exit_status);
}

static void stops_when_the_server_is_gone(program prog) {
    run r;
    run_start(&r, prog);
    wait_nats(&r, true);
    kt_nats_stop(&r.ns);
    wait_nats(&r, false);
    stop_clean(&r, "server gone");
}

static void stops_when_a_reconnect_hangs(program prog) {
    run r;
    run_start(&r, prog);
    wait_nats(&r, true);
    kt_nats_stop(&r.ns);
    int lfd = tn_mute_listen(r.ns.port);
    int cfd = tn_mute_accept(lfd, WAIT_MS); /* an attempt is in flight */
    stop_clean(&r, "reconnect hanging");
    close(cfd);
    close(lfd);
}

START_TEST(kvo_relay_stops_when_the_nats_server_is_gone) {
    stops_when_the_server_is_gone(RELAY);
}
END_TEST

START_TEST(kvo_relay_stops_while_a_reconnect_hangs) {
    stops_when_a_reconnect_hangs(RELAY);
}
END_TEST

START_TEST(kvo_indexer_stops_when_the_nats_server_is_gone) {
    stops_when_the_server_is_gone(INDEXER);
}
END_TEST

START_TEST(kvo_indexer_stops_while_a_reconnect_hangs) {
    stops_when_a_reconnect_hangs(INDEXER);
}
END_TEST

Suite *suite_stop(void) {
    Suite *s = suite_create("stop");
    TCase *tc = tcase_create("nats_gone");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, kvo_relay_stops_when_the_nats_server_is_gone);
    tcase_add_test(tc, kvo_relay_stops_while_a_reconnect_hangs);
    tcase_add_test(tc, kvo_indexer_stops_when_the_nats_server_is_gone);
    tcase_add_test(tc, kvo_indexer_stops_while_a_reconnect_hangs);
    suite_add_tcase(s, tc);
    return s;
}
