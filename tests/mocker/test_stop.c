/* SIGTERM stops the real kvo-mocker binary cleanly -- exit 0, well within
 * kvo_proc_stop's grace, no SIGKILL needed -- whatever it is doing: idle,
 * with clients connected to every socket, with a completion and a stream in
 * flight, with a replay request and a subscriber that never read, and in the
 * middle of a trace replay. Each moment is tried a few times: a hang that
 * needs an unlucky interleaving still shows up. */
#include "mt.h"
#include "kvo_http.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

Suite *suite_stop(void);

#define ROUNDS 3
#define GRACE_MS 5000

typedef struct srv {
    kt_proc p;
    uint16_t port;
    char url[64];
    char pub[160], replay[160]; /* advertised endpoints */
} srv;

static void srv_start(srv *s, const char *const extra[]) {
    const char *args[32];
    int n = 0;
    memset(s, 0, sizeof(*s));
    args[n++] = "--zmq-port";
    args[n++] = "0";
    args[n++] = "--replay-port";
    args[n++] = "0";
    args[n++] = "--block-size";
    args[n++] = "4";
    args[n++] = "--log-level";
    args[n++] = "debug";
    for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    s->port = mt_mocker_spawn(&s->p, args);
    snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%u", s->port);
    char url[128];
    /* the advertised endpoints */
    kvo_http_client *c;
    kvo_http_resp r;
    ck_assert_int_eq(kvo_http_client_new(&c, 10000), KVO_OK);
    kvo_http_resp_init(&r);
    snprintf(url, sizeof(url), "%s/kvo/event_sources", s->url);
    ck_assert_int_eq(kvo_http_get(c, url, &r), KVO_OK);
    json_object *j = json_tokener_parse((const char *)r.body.data);
    json_object *src = json_object_array_get_idx(j, 0), *v;
    ck_assert_ptr_nonnull(src);
    ck_assert(json_object_object_get_ex(src, "endpoint", &v));
    snprintf(s->pub, sizeof(s->pub), "%s", json_object_get_string(v));
    ck_assert(json_object_object_get_ex(src, "replay_endpoint", &v));
    snprintf(s->replay, sizeof(s->replay), "%s", json_object_get_string(v));
    json_object_put(j);
    kvo_http_resp_fini(&r);
    kvo_http_client_free(c);
}

/* SIGTERM p: it must end by itself, with status 0, within the grace. */
static void stop_clean(kt_proc *p, const char *moment) {
    kt_guard_release(&p->guard);
    kvo_proc_stop(&p->proc, GRACE_MS);
    if (p->proc.killed || p->proc.exit_status != 0)
        kvo_proc_dump_log(&p->proc, 60);
    ck_assert_msg(!p->proc.killed,
                  "%s: kvo-mocker still ran %d ms after SIGTERM (killed)",
                  moment, GRACE_MS);
    ck_assert_msg(p->proc.exit_status == 0, "%s: kvo-mocker exited with %d",
                  moment, p->proc.exit_status);
}

/* Receive timeout of the test's ZeroMQ clients. */
#define ZMQ_TMO_MS 10000

static void post_ok(kvo_http_client *c, const srv *s, const char *path,
                    const char *body) {
    char url[128];
    snprintf(url, sizeof(url), "%s%s", s->url, path);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    ck_assert_int_eq(
        kvo_http_post(c, url, "application/json", body, strlen(body), &r),
        KVO_OK);
    ck_assert_msg(r.status == 200, "%s -> %ld", path, r.status);
    kvo_http_resp_fini(&r);
}

/* Completions until sub sees a batch (the slow joiner: a SUB misses what
 * was published before its connection was up). */
static void sub_joined(void *sub, kvo_http_client *c, const srv *s) {
    int tmo = 200;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    char body[128];
    for (int k = 0; k < 100; k++) {
        snprintf(body, sizeof(body),
                 "{\"prompt\": [%d,1,2,3,4,5,6,7,8], \"max_tokens\": 2}",
                 k + 1000);
        post_ok(c, s, "/v1/completions", body);
        zmq_msg_t m;
        zmq_msg_init(&m);
        int got = zmq_msg_recv(&m, sub, 0);
        zmq_msg_close(&m);
        if (got >= 0) return;
    }
    ck_abort_msg("the subscriber never got a batch");
}

START_TEST(sigterm_stops_an_idle_server_at_once) {
    for (int i = 0; i < ROUNDS; i++) {
        srv s;
        srv_start(&s, NULL);
        stop_clean(&s.p, "idle");
    }
}
END_TEST

START_TEST(sigterm_stops_a_server_with_a_client_on_every_socket) {
    for (int i = 0; i < ROUNDS; i++) {
        srv s;
        srv_start(&s, NULL);
        void *ctx = zmq_ctx_new();
        void *sub = mt_zsock(ctx, ZMQ_SUB, s.pub, ZMQ_TMO_MS, 0);
        zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
        void *dealer = mt_zsock(ctx, ZMQ_DEALER, s.replay, ZMQ_TMO_MS, 0);
        kvo_http_client *c; /* keep-alive: stays connected, idle */
        ck_assert_int_eq(kvo_http_client_new(&c, 10000), KVO_OK);
        sub_joined(sub, c, &s); /* connected for real */
        stop_clean(&s.p, "clients connected");
        kvo_http_client_free(c);
        zmq_close(sub);
        zmq_close(dealer);
        zmq_ctx_term(ctx);
    }
}
END_TEST

START_TEST(sigterm_stops_a_server_with_a_completion_and_a_stream_in_flight) {
    /* Real time (--speedup 1): 4000 decode steps take far longer than the
     * test, so both requests are still running when SIGTERM lands. */
    for (int i = 0; i < ROUNDS; i++) {
        srv s;
        srv_start(&s, MT_ARGS("--speedup", "1"));
        /* raw requests whose answers are never read: the server holds them */
        int a = mt_raw_post(
            s.port, "/v1/completions", NULL,
            "{\"prompt\": [1,2,3,4,5,6,7,8,9], \"max_tokens\": 4000}");
        int b = mt_raw_post(s.port, "/v1/completions", NULL,
                            "{\"prompt\": [9,8,7,6,5], \"max_tokens\": 4000, "
                            "\"stream\": true}");
        usleep(100000 * (useconds_t)(i + 1));
        stop_clean(&s.p, "completion and stream in flight");
        close(a);
        close(b);
    }
}
END_TEST

START_TEST(sigterm_stops_a_server_whose_replay_and_pub_clients_never_read) {
    for (int i = 0; i < ROUNDS; i++) {
        srv s;
        srv_start(&s, NULL);
        void *ctx = zmq_ctx_new();
        void *sub = mt_zsock(ctx, ZMQ_SUB, s.pub, ZMQ_TMO_MS, 1);
        zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
        kvo_http_client *c;
        ck_assert_int_eq(kvo_http_client_new(&c, 10000), KVO_OK);
        sub_joined(sub, c, &s);
        /* batches for the ring and for the subscriber's full queue */
        char body[256];
        for (int k = 0; k < 60; k++) {
            snprintf(body, sizeof(body),
                     "{\"prompt\": [%d,2,3,4,5,6,7,8,9,10,11,12,13], "
                     "\"max_tokens\": 64}",
                     k + 100);
            post_ok(c, &s, "/v1/completions", body);
        }
        void *dealer = mt_zsock(ctx, ZMQ_DEALER, s.replay, ZMQ_TMO_MS, 1);
        mt_replay_request(dealer, 0);
        /* the reply has begun (then its socket fills up: never read) */
        zmq_msg_t m;
        zmq_msg_init(&m);
        ck_assert_int_ge(zmq_msg_recv(&m, dealer, 0), 0);
        zmq_msg_close(&m);
        stop_clean(&s.p, "replay and PUB clients not reading");
        kvo_http_client_free(c);
        zmq_close(sub);
        zmq_close(dealer);
        zmq_ctx_term(ctx);
    }
}
END_TEST

/* The PUB endpoint rank 0 logged ("rank 0: publishing on tcp://H:P"). */
static void logged_endpoint(kt_proc *p, char *ep, size_t epsz) {
    for (int i = 0; i < 2000; i++) {
        FILE *f = fopen(p->proc.log_path, "rb");
        if (f) {
            char buf[8192];
            size_t len = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[len] = '\0';
            const char *at = strstr(buf, "rank 0: publishing on ");
            if (at && sscanf(at + strlen("rank 0: publishing on "), "%63[^,]",
                             ep) == 1) {
                (void)epsz;
                return;
            }
        }
        ck_assert_msg(kvo_proc_alive(&p->proc),
                      "kvo-mocker exited before publishing");
        usleep(5000);
    }
    kvo_proc_dump_log(&p->proc, 40);
    ck_abort_msg("kvo-mocker never logged its PUB endpoint");
}

/* Trace mode on the whole conversation trace: SIGTERM once events flow. */
static void trace_stop(const char *speedup, const char *moment) {
    char ep[64];
    char *trace = kt_src_path("traces/mooncake_conversation.jsonl");
    const char *args[] = {"--trace",
                          trace,
                          "--zmq-port",
                          "0",
                          "--replay-port",
                          "0",
                          "--speedup",
                          speedup,
                          "--no-progress",
                          "--require-events",
                          NULL};
    kt_proc p;
    kt_proc_start(&p, "kvo-mocker", args);
    logged_endpoint(&p, ep, sizeof(ep));
    void *ctx = zmq_ctx_new();
    void *sub = mt_zsock(ctx, ZMQ_SUB, ep, ZMQ_TMO_MS, 0);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    zmq_msg_t m;
    zmq_msg_init(&m);
    int got = zmq_msg_recv(&m, sub, 0);
    zmq_msg_close(&m);
    if (got < 0) kvo_proc_dump_log(&p.proc, 40);
    ck_assert_msg(got >= 0, "%s: no batch from the trace replay", moment);
    ck_assert(kvo_proc_alive(&p.proc)); /* mid-trace indeed */
    stop_clean(&p, moment);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    kvo_free(trace);
}

START_TEST(sigterm_stops_a_trace_replay_midway) {
    for (int i = 0; i < ROUNDS; i++) {
        trace_stop("0", "mid-trace, virtual time");
        trace_stop("5", "mid-trace, real time");
    }
}
END_TEST

/* kvo_proc_spawn forks with every signal blocked: a stop signal sent to
 * the spawner's process group while a child is between fork and exec must
 * not run the spawner's handler in the child (where it would set the
 * child's copy of kvo_stop, which exec discards: the signal would be lost
 * and the program would run on, deaf to it). In a process group of its own
 * (the spray must hit nobody else), a thread sprays SIGUSR1 at the group
 * while the main thread spawns; the handler reports every run in a pid
 * other than the spawner's. Without the blocking, most spawns show it. */
static int race_pipe[2] = {-1, -1};
static pid_t race_owner;
static volatile sig_atomic_t race_stop;

static void race_handler(int sig) {
    (void)sig;
    if (getpid() != race_owner) {
        char c = 'x';
        ssize_t k = write(race_pipe[1], &c, 1);
        (void)k;
    }
}

static void *race_spray(void *arg) {
    (void)arg;
    while (!race_stop) {
        kill(0, SIGUSR1);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* The spawner: exit 0 clean, 1 a child ran our handler, 2 setup failed. */
static void race_spawner(const char *log) {
    if (setpgid(0, 0) != 0) _exit(2);
    race_owner = getpid();
    if (pipe2(race_pipe, O_CLOEXEC | O_NONBLOCK) != 0) _exit(2);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = race_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) _exit(2);
    pthread_t th;
    if (pthread_create(&th, NULL, race_spray, NULL) != 0) _exit(2);
    char *argv[] = {"true", NULL};
    int hits = 0;
    for (int i = 0; i < 150; i++) {
        kvo_proc p;
        if (kvo_proc_spawn(&p, "true", argv, log) != KVO_OK) _exit(2);
        kvo_proc_stop(&p, 5000);
        char c;
        while (read(race_pipe[0], &c, 1) == 1) hits++;
    }
    race_stop = 1;
    pthread_join(th, NULL);
    _exit(hits ? 1 : 0);
}

START_TEST(a_stop_signal_to_the_spawner_group_is_never_swallowed_by_a_child) {
    char *dir = kt_tmpdir("spawnrace");
    char log[600];
    snprintf(log, sizeof(log), "%s/true.log", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) race_spawner(log);
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    ck_assert_msg(WIFEXITED(ws), "the spawner died (status %d)", ws);
    ck_assert_msg(WEXITSTATUS(ws) != 2, "the spawner could not set up");
    ck_assert_msg(WEXITSTATUS(ws) == 0,
                  "a child ran the spawner's signal handler before exec");
    kvo_free(dir);
}
END_TEST

Suite *suite_stop(void) {
    const TTest *tests[] = {
        sigterm_stops_an_idle_server_at_once,
        sigterm_stops_a_server_with_a_client_on_every_socket,
        sigterm_stops_a_server_with_a_completion_and_a_stream_in_flight,
        sigterm_stops_a_server_whose_replay_and_pub_clients_never_read,
        sigterm_stops_a_trace_replay_midway,
        a_stop_signal_to_the_spawner_group_is_never_swallowed_by_a_child,
    };
    return mt_suite(suite_create("stop"), 180, tests, KVO_ARRAY_LEN(tests));
}
