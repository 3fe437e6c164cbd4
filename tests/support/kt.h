/* kt.h -- test support shared by every test binary: paths to bundled data
 * and built executables, file and JSON loading, a real nats-server. */
#ifndef KT_H
#define KT_H

#include "kvo.h"
#include "kvo_http.h"
#include "kvo_proc.h"

#include <check.h>
#include <json-c/json.h>

/* Absolute path of a file in the source tree ("tests/data/vectors/...").
 * Returns a malloc'd string; the caller frees it. */
char *kt_src_path(const char *rel);
/* Absolute path of a built executable ("kvo-mocker"); malloc'd. */
char *kt_bin_path(const char *name);
/* Whole file; malloc'd; NULL (and a Check failure) when unreadable. */
uint8_t *kt_read_file(const char *path, size_t *len);
/* Parse a JSON file from the source tree; the caller puts it. */
json_object *kt_load_json(const char *rel);
/* Hex string -> malloc'd bytes. */
uint8_t *kt_unhex(const char *hex, size_t *len);
/* A fresh empty directory under $TMPDIR for one test; malloc'd path. */
char *kt_tmpdir(const char *tag);

/* Log guard. A failed ck_assert _exits the forked test process, so no
 * cleanup code runs after it. kt_guard_start forks a tiny watcher that
 * blocks on a pipe: kt_guard_release tells it "all well" and it exits
 * quietly; if the test process ends first (failed assertion, crash, or a
 * process nobody stopped) it prints the last 200 lines of p's log to stderr.
 * Processes started through kt_nats_* and kt_proc_* are guarded for you. */
typedef struct kt_guard {
    pid_t pid; /* watcher; 0 = none */
    int fd;    /* write end of its pipe */
} kt_guard;

void kt_guard_start(kt_guard *g, const kvo_proc *p);
void kt_guard_release(kt_guard *g); /* no-op when not started */

/* A real nats-server on a free loopback port, started and stopped by the
 * test; its log is printed if a test fails while it runs. */
typedef struct kt_nats {
    kvo_proc proc;
    uint16_t port;
    char url[64]; /* nats://127.0.0.1:<port> */
    char dir[512];
    kt_guard guard;
    const char *const *extra; /* more nats-server arguments, or NULL */
} kt_nats;

/* Start (ck_assert on failure: nats-server missing, not ready in time). */
void kt_nats_start(kt_nats *n);
/* The same with more nats-server arguments, NULL-terminated (e.g. {"--auth",
 * "T", NULL}); restarts use them too, so extra must outlive n. */
void kt_nats_start_args(kt_nats *n, const char *const extra[]);
/* Stop and start again on the same port (for reconnect tests). */
void kt_nats_restart(kt_nats *n);
/* Stop; prints the server's log first when KVO_TEST_LOGS is set (not "0"). */
void kt_nats_stop(kt_nats *n);
void kt_nats_dump_log(const kt_nats *n);

/* A built kvo executable run by a test: <builddir>/bin/<bin> with its
 * stdout+stderr in <dir>/<bin>.log (dir a fresh kt_tmpdir), guarded as above.
 *
 *   kt_proc idx;
 *   const char *args[] = {"--nats", nats.url, "--http", hostport, NULL};
 *   kt_proc_start(&idx, "kvo-indexer", args);
 *   kt_proc_wait_http(&idx, "http://127.0.0.1:PORT/watermark", 10000);
 *   ...
 *   ck_assert_int_eq(kt_proc_stop(&idx), 0);   // clean SIGTERM shutdown
 */
typedef struct kt_proc {
    kvo_proc proc;
    kt_guard guard;
    char dir[512];
} kt_proc;

/* args: NULL-terminated, without argv[0]. ck_assert on failure. */
void kt_proc_start(kt_proc *p, const char *bin, const char *const args[]);
/* Poll until GET url answers 200; dumps the log and fails the test when the
 * process dies or timeout_ms passes. Same for TCP with kt_proc_wait_tcp. */
void kt_proc_wait_http(kt_proc *p, const char *url, long timeout_ms);
void kt_proc_wait_tcp(kt_proc *p, uint16_t port, long timeout_ms);
/* The port p logged after prefix ("listening on http://127.0.0.1:"),
 * waiting for the line (the process picked a free port itself); fails the
 * test when p dies or never logs it. */
uint16_t kt_proc_logged_port(kt_proc *p, const char *prefix);
/* The peak resident memory of p so far (VmHWM), in KiB. */
uint64_t kt_proc_peak_kib(const kt_proc *p);
/* Serve s on the calling thread (a test's thread of its own) until *stop:
 * a fake service or a proxy the test runs in-process. */
void kt_http_serve(kvo_http_server *s, const volatile bool *stop);
/* SIGTERM, up to 10 s grace, SIGKILL. Returns the exit status (0 = clean
 * shutdown; 128+n = killed by signal n). Prints the log when KVO_TEST_LOGS
 * is set. */
int kt_proc_stop(kt_proc *p);

/* Runs fn (a fuzz target's check, which aborts on a broken invariant) over
 * every regular file in tests/fuzz/<sub> ("corpus/json", "crashes/json");
 * returns how many. */
size_t kt_fuzz_replay(const char *sub, int (*fn)(const uint8_t *, size_t));

/* ---- Running suites --------------------------------------------------------
 * Every test binary's main: kt_main(argc, argv, suites, n). With no argument
 * it runs every suite; with one (ctest passes it: one ctest per suite) only
 * the suite of that name. Exit: 0 all passed; 1 a test failed, or no test
 * ran (a misspelt suite must not pass); KT_SKIPPED when every test passed
 * and at least one called kt_skip (ctest reports the suite as skipped). */
typedef Suite *kt_suite_fn(void);
#define KT_SKIPPED 77
int kt_main(int argc, char **argv, kt_suite_fn *const suites[], size_t n);
/* Say that this test cannot run here and why (then return from the test):
 * printed, and turns the binary's exit status into KT_SKIPPED when nothing
 * failed. */
void kt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* KT_H */
