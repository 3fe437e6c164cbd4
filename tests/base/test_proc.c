/* kvo_proc and the process helpers of kt: real children (sh, sleep,
 * nats-server), real sockets. */
#include "kt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

Suite *suite_proc(void);

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static char *path_in(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = kvo_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static char *read_text(const char *path) {
    size_t len;
    uint8_t *d = kt_read_file(path, &len);
    char *s = kvo_realloc(d, len + 1);
    s[len] = '\0';
    return s;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Waits (bounded) until the child has ended; reaps it. */
static void wait_exit(kvo_proc *p) {
    for (int i = 0; i < 1000 && kvo_proc_alive(p); i++) sleep_ms(10);
    ck_assert_msg(!kvo_proc_alive(p), "%s still running", p->name);
}

/* True once pid is gone or a zombie (an orphan may wait for init). */
static bool pid_gone(pid_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return true;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return true;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static bool wait_pid_gone(pid_t pid) {
    for (int i = 0; i < 500; i++) {
        if (pid_gone(pid)) return true;
        sleep_ms(10);
    }
    return false;
}

static pid_t read_pid_file(const char *path) {
    for (int i = 0; i < 500; i++) {
        FILE *f = fopen(path, "r");
        int pid = 0;
        if (f) {
            int ok = fscanf(f, "%d", &pid);
            fclose(f);
            if (ok == 1 && pid > 0) return (pid_t)pid;
        }
        sleep_ms(10);
    }
    ck_abort_msg("no pid in %s", path);
    return 0;
}

START_TEST(spawn_appends_stdout_and_stderr_to_the_log) {
    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "sh.log");
    char *argv[] = {"sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3",
                    NULL};
    kvo_proc p;
    ck_assert_int_eq(kvo_proc_spawn(&p, "sh[0]", argv, log), KVO_OK);
    ck_assert_int_gt(p.pid, 0);
    ck_assert_str_eq(p.name, "sh[0]");
    ck_assert_int_eq(getpgid(p.pid), p.pid); /* leads its own group */
    wait_exit(&p);
    ck_assert(p.exited);
    ck_assert_int_eq(p.exit_status, 3);
    ck_assert_int_eq(p.pid, 0);

    char *argv2[] = {"sh", "-c", "echo second-run", NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "sh[1]", argv2, log), KVO_OK);
    wait_exit(&p);
    ck_assert_int_eq(p.exit_status, 0);
    char *text = read_text(log);
    ck_assert_str_eq(text, "to-stdout\nto-stderr\nsecond-run\n");
    kvo_free(text);

    /* Signals the parent ignores (SIGPIPE, by kvo_signals_init) are back to
     * their defaults in the child: a writer into a closed pipe dies of it. */
    kvo_signals_init();
    char *argv3[] = {"sh", "-c", "kill -PIPE $$; echo survived", NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "sh[2]", argv3, log), KVO_OK);
    wait_exit(&p);
    ck_assert_int_eq(p.exit_status, 128 + SIGPIPE);
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

START_TEST(spawn_and_find_report_missing_executables) {
    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "x.log");
    kvo_proc p;
    memset(&p, 0, sizeof(p));
    char *argv[] = {"kvo-no-such-program", NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "x", argv, log), KVO_ENOTFOUND);
    char *argv2[] = {"/nonexistent/dir/prog", NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "x", argv2, log), KVO_ENOTFOUND);
    ck_assert_int_eq(p.pid, 0);
    char *argv3[] = {NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "x", argv3, log), KVO_EINVAL);
    /* A log file that cannot be created. */
    char *argv4[] = {"true", NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "x", argv4, "/nonexistent/dir/log"),
                     KVO_EIO);

    char out[1024];
    ck_assert_int_eq(kvo_find_exe("sh", out, sizeof(out)), KVO_OK);
    ck_assert_int_eq(access(out, X_OK), 0);
    ck_assert_ptr_nonnull(strstr(out, "/sh"));
    ck_assert_int_eq(kvo_find_exe("kvo-no-such-program", out, sizeof(out)),
                     KVO_ENOTFOUND);
    ck_assert_int_eq(kvo_find_exe("/bin/sh", out, sizeof(out)), KVO_OK);
    ck_assert_str_eq(out, "/bin/sh");
    ck_assert_int_eq(kvo_find_exe("sh", out, 3), KVO_ENOTFOUND); /* too small */
    /* sbin directories are searched even when PATH lacks them. */
    char *saved = kvo_strdup(getenv("PATH") ? getenv("PATH") : "");
    setenv("PATH", "/bin", 1);
    kvo_status st = kvo_find_exe("nats-server", out, sizeof(out));
    setenv("PATH", saved, 1);
    kvo_free(saved);
    ck_assert_int_eq(st, KVO_OK);
    ck_assert_ptr_nonnull(strstr(out, "sbin/nats-server"));
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

START_TEST(stop_terminates_politely_then_kills_the_whole_group) {
    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "stop.log");
    kvo_proc p;

    char *polite[] = {"sleep", "300", NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "sleep", polite, log), KVO_OK);
    ck_assert(kvo_proc_alive(&p));
    kvo_proc_stop(&p, 5000);
    ck_assert(!kvo_proc_alive(&p));
    ck_assert_int_eq(p.exit_status, 128 + SIGTERM);
    kvo_proc_stop(&p, 5000); /* no-op once stopped */
    kvo_proc_kill(&p);

    /* A shell that ignores SIGTERM, with a background child of its own that
     * ignores it too: both go at the end of the grace period. */
    char *pidfile = path_in(dir, "bg.pid");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "trap '' TERM; sleep 300 & echo $! > %s; echo started; wait",
             pidfile);
    char *stubborn[] = {"sh", "-c", cmd, NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "stubborn", stubborn, log), KVO_OK);
    pid_t bg = read_pid_file(pidfile);
    ck_assert(!pid_gone(bg));
    kvo_proc_stop(&p, 200);
    ck_assert_int_eq(p.exit_status, 128 + SIGKILL);
    ck_assert_msg(wait_pid_gone(bg), "background child %d survived", (int)bg);

    char *victim[] = {"sleep", "300", NULL};
    ck_assert_int_eq(kvo_proc_spawn(&p, "victim", victim, log), KVO_OK);
    kvo_proc_kill(&p);
    ck_assert(!kvo_proc_alive(&p));
    ck_assert_int_eq(p.exit_status, 128 + SIGKILL);
    kvo_free(pidfile);
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

START_TEST(children_die_with_their_parent) {
    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "orphan.log");
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t mid = fork();
    ck_assert_int_ge(mid, 0);
    if (mid == 0) { /* a parent that spawns, reports the pid, and dies */
        kvo_proc p;
        char *argv[] = {"sleep", "300", NULL};
        kvo_status st = kvo_proc_spawn(&p, "orphan", argv, log);
        kvo_free(log); /* keeps valgrind's report of this child clean */
        kvo_free(dir);
        if (st != KVO_OK) _exit(1);
        ssize_t w = write(fds[1], &p.pid, sizeof(p.pid));
        _exit(w == sizeof(p.pid) ? 0 : 1);
    }
    close(fds[1]);
    pid_t child = 0;
    ck_assert_int_eq(read(fds[0], &child, sizeof(child)), sizeof(child));
    close(fds[0]);
    int ws;
    ck_assert_int_eq(waitpid(mid, &ws, 0), mid);
    ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    ck_assert_int_gt(child, 0);
    ck_assert_msg(wait_pid_gone(child), "orphan %d outlived its parent",
                  (int)child);
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

START_TEST(children_do_not_inherit_the_parents_sockets) {
    /* A listener opened without SOCK_CLOEXEC (as some libraries do) must
     * stop listening when the parent closes it, child or no child. */
    uint16_t port;
    ck_assert_int_eq(kvo_free_port(&port), KVO_OK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(fd, 8), 0);
    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "fds.log");
    char *argv[] = {"sleep", "300", NULL};
    kvo_proc p;
    ck_assert_int_eq(kvo_proc_spawn(&p, "sleeper", argv, log), KVO_OK);
    close(fd);
    ck_assert_int_eq(kvo_wait_tcp(NULL, "127.0.0.1", port, 200), KVO_ETIMEDOUT);
    kvo_proc_stop(&p, 5000);
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

START_TEST(wait_tcp_sees_a_real_listener_and_a_dead_child) {
    uint16_t port;
    ck_assert_int_eq(kvo_free_port(&port), KVO_OK);
    ck_assert_int_ne(port, 0);
    ck_assert_int_eq(kvo_wait_tcp(NULL, "127.0.0.1", port, 100), KVO_ETIMEDOUT);

    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(fd, 8), 0);
    ck_assert_int_eq(kvo_wait_tcp(NULL, "127.0.0.1", port, 5000), KVO_OK);
    ck_assert_int_eq(kvo_wait_tcp(NULL, "localhost", port, 5000), KVO_OK);
    close(fd);

    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "dies.log");
    char *argv[] = {"sh", "-c", "echo giving up; exit 2", NULL};
    kvo_proc p;
    ck_assert_int_eq(kvo_proc_spawn(&p, "dies", argv, log), KVO_OK);
    ck_assert_int_eq(kvo_wait_tcp(&p, "127.0.0.1", port, 30000), KVO_ESTATE);
    ck_assert_int_eq(p.exit_status, 2);
    ck_assert_int_eq(kvo_wait_http(&p, "http://127.0.0.1:1/", 30000),
                     KVO_ESTATE);
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

START_TEST(wait_http_polls_a_real_server_until_200) {
    /* nats-server's monitoring endpoint is a real HTTP server in a real
     * child process. */
    uint16_t port, mport;
    ck_assert_int_eq(kvo_free_port(&port), KVO_OK);
    ck_assert_int_eq(kvo_free_port(&mport), KVO_OK);
    char ps[8], ms[8];
    snprintf(ps, sizeof(ps), "%u", port);
    snprintf(ms, sizeof(ms), "%u", mport);
    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "nats-mon.log");
    char *argv[] = {"nats-server", "-a", "127.0.0.1", "-p", ps, "-m", ms, NULL};
    kvo_proc p;
    ck_assert_int_eq(kvo_proc_spawn(&p, "nats-mon", argv, log), KVO_OK);
    kt_guard g;
    kt_guard_start(&g, &p);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/varz", mport);
    ck_assert_int_eq(kvo_wait_http(&p, url, 15000), KVO_OK);
    /* A path that answers 404 never counts as ready. */
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/no-such-page", mport);
    ck_assert_int_eq(kvo_wait_http(&p, url, 300), KVO_ETIMEDOUT);
    kt_guard_release(&g);
    kvo_proc_stop(&p, 5000);
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

START_TEST(dump_log_prints_the_last_lines_with_the_name) {
    char *dir = kt_tmpdir("proc");
    char *log = path_in(dir, "ten.log");
    write_text(log, "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\nl9\nl10\n");
    kvo_proc p;
    memset(&p, 0, sizeof(p));
    snprintf(p.name, sizeof(p.name), "ten");
    snprintf(p.log_path, sizeof(p.log_path), "%s", log);
    char *out = path_in(dir, "stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    kvo_proc_dump_log(&p, 3);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *text = read_text(out);
    ck_assert_ptr_nonnull(strstr(text, "[ten] l8\n[ten] l9\n[ten] l10\n"));
    ck_assert_ptr_null(strstr(text, "l7"));
    kvo_free(text);
    kvo_free(out);
    kvo_free(log);
    kvo_free(dir);
}
END_TEST

/* A forked process (standing in for a test) guards a log and then either
 * releases the guard or just _exits like a failed ck_assert. Returns what
 * reached its stderr, read until every writer (the watcher too) is gone. */
static char *guarded_child_output(const char *dir, bool release) {
    char *log = path_in(dir, "server.log");
    write_text(log, "booting\nlistening\nmarker-line-xyz\n");
    int errp[2];
    ck_assert_int_eq(pipe(errp), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(errp[1], 2);
        close(errp[0]);
        close(errp[1]);
        kvo_proc p;
        memset(&p, 0, sizeof(p));
        snprintf(p.name, sizeof(p.name), "server");
        snprintf(p.log_path, sizeof(p.log_path), "%s", log);
        kvo_free(log);
        kt_guard g;
        kt_guard_start(&g, &p);
        if (release) kt_guard_release(&g);
        _exit(1); /* what a failed ck_assert does */
    }
    close(errp[1]);
    kvo_buf b;
    kvo_buf_init(&b);
    char tmp[4096];
    ssize_t k;
    while ((k = read(errp[0], tmp, sizeof(tmp))) > 0)
        kvo_buf_append(&b, tmp, (size_t)k);
    close(errp[0]);
    waitpid(pid, NULL, 0);
    kvo_buf_cstr(&b);
    kvo_free(log);
    return (char *)b.data;
}

START_TEST(guard_prints_the_log_only_when_the_test_dies_first) {
    char *dir = kt_tmpdir("guard");
    char *text = guarded_child_output(dir, false);
    ck_assert_msg(strstr(text, "[server] marker-line-xyz") != NULL, "got: %s",
                  text);
    kvo_free(text);
    text = guarded_child_output(dir, true);
    ck_assert_str_eq(text, "");
    kvo_free(text);
    kvo_free(dir);
}
END_TEST

/* Reads the INFO line a NATS server sends on connect; speaks PING/PONG. */
static char *nats_hello(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    kvo_buf b;
    kvo_buf_init(&b);
    char tmp[4096];
    bool pinged = false;
    for (;;) {
        ssize_t k = recv(fd, tmp, sizeof(tmp), 0);
        ck_assert_int_gt(k, 0);
        kvo_buf_append(&b, tmp, (size_t)k);
        kvo_buf_cstr(&b);
        if (!pinged && strstr((char *)b.data, "\r\n")) {
            const char ping[] = "CONNECT {\"verbose\":false}\r\nPING\r\n";
            ck_assert_int_eq(send(fd, ping, strlen(ping), MSG_NOSIGNAL),
                             (ssize_t)strlen(ping));
            pinged = true;
        }
        if (strstr((char *)b.data, "PONG\r\n")) break;
    }
    close(fd);
    ck_assert(!strncmp((char *)b.data, "INFO {", 6));
    return (char *)b.data;
}

static void server_id(const char *info, char *out, size_t n) {
    const char *p = strstr(info, "\"server_id\":\"");
    ck_assert_ptr_nonnull(p);
    p += strlen("\"server_id\":\"");
    size_t len = strcspn(p, "\"");
    ck_assert_uint_lt(len, n);
    memcpy(out, p, len);
    out[len] = '\0';
}

START_TEST(kt_nats_starts_restarts_on_the_same_port_and_stops) {
    kt_nats n;
    kt_nats_start(&n);
    char want[64];
    snprintf(want, sizeof(want), "nats://127.0.0.1:%u", n.port);
    ck_assert_str_eq(n.url, want);
    char *info = nats_hello(n.port);
    char before[128], after[128];
    server_id(info, before, sizeof(before));
    kvo_free(info);

    uint16_t port = n.port;
    kt_nats_restart(&n);
    ck_assert_uint_eq(n.port, port);
    info = nats_hello(n.port);
    server_id(info, after, sizeof(after));
    kvo_free(info);
    ck_assert_str_ne(before, after); /* a new server process */

    kt_nats_stop(&n);
    ck_assert(!kvo_proc_alive(&n.proc));
    ck_assert_int_eq(kvo_wait_tcp(NULL, "127.0.0.1", port, 100), KVO_ETIMEDOUT);
}
END_TEST

Suite *suite_proc(void) {
    Suite *s = suite_create("proc");
    TCase *tc = tcase_create("proc");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, spawn_appends_stdout_and_stderr_to_the_log);
    tcase_add_test(tc, spawn_and_find_report_missing_executables);
    tcase_add_test(tc, stop_terminates_politely_then_kills_the_whole_group);
    tcase_add_test(tc, children_die_with_their_parent);
    tcase_add_test(tc, children_do_not_inherit_the_parents_sockets);
    tcase_add_test(tc, wait_tcp_sees_a_real_listener_and_a_dead_child);
    tcase_add_test(tc, wait_http_polls_a_real_server_until_200);
    tcase_add_test(tc, dump_log_prints_the_last_lines_with_the_name);
    tcase_add_test(tc, guard_prints_the_log_only_when_the_test_dies_first);
    tcase_add_test(tc, kt_nats_starts_restarts_on_the_same_port_and_stops);
    suite_add_tcase(s, tc);
    return s;
}
