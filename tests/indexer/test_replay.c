/* test_replay: `kvo-indexer replay EVENTS [QUERIES]` through the built
 * binary, on captures written with the codec's capture writer from the
 * shared event-plane vectors. */
#include "idx_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define SUBJECT "namespace.dynamo.component.backend.kv-events"
#define H1 "14643705804678351452"
#define H2 "16777012769546811212"

static void cap_add_vector(wire_cap_writer *w, const char *name) {
    size_t len;
    uint8_t *b = tt_vector(name, &len);
    wire_frame f[2] = {{(const uint8_t *)SUBJECT, strlen(SUBJECT)}, {b, len}};
    ck_assert_int_eq(wire_cap_write(w, 1700000000000000000ull, f, 2), KVO_OK);
    kvo_free(b);
}

/* tt_plane_sequence with a 3-frame (ZMQ) record after its first message:
 * 5 records, 4 messages. */
static char *make_capture(const char *dir) {
    char *path = kvo_malloc(600);
    snprintf(path, 600, "%s/events.cap", dir);
    wire_cap_writer *w;
    ck_assert_int_eq(wire_cap_create(&w, path), KVO_OK);
    for (size_t i = 0; i < KVO_ARRAY_LEN(tt_plane_sequence); i++) {
        cap_add_vector(w, tt_plane_sequence[i]);
        if (i == 0) { /* a ZMQ message: counted and skipped */
            wire_frame z[3] = {{(const uint8_t *)"", 0},
                               {(const uint8_t *)"\0\0\0\0\0\0\0\0", 8},
                               {(const uint8_t *)"\x93", 1}};
            ck_assert_int_eq(wire_cap_write(w, 1, z, 3), KVO_OK);
        }
    }
    wire_cap_close(w);
    return path;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static char *slurp(const char *path) {
    size_t len;
    uint8_t *b = kt_read_file(path, &len);
    char *s = kvo_realloc(b, len + 1);
    s[len] = '\0';
    return s;
}

/* Every test: a fresh directory holding make_capture's capture. */
static char *dir, *cap;

static void replay_setup(void) {
    dir = kt_tmpdir("replay");
    cap = make_capture(dir);
}

static void replay_teardown(void) {
    kvo_free(cap);
    kvo_free(dir);
    cap = dir = NULL;
}

/* What a run of kvo-indexer printed. */
typedef struct ran {
    int code;
    char *out, *err; /* kvo_free'd by ran_free */
} ran;

/* Run kvo-indexer with args (shell words), its output kept in dir. */
static ran run(const char *args) {
    char *bin = kt_bin_path("kvo-indexer");
    char cmd[4096], o[600], e[600];
    snprintf(o, sizeof(o), "%s/stdout", dir);
    snprintf(e, sizeof(e), "%s/stderr", dir);
    snprintf(cmd, sizeof(cmd), "%s %s >%s 2>%s", bin, args, o, e);
    int rc = system(cmd);
    kvo_free(bin);
    ck_assert_msg(rc != -1 && WIFEXITED(rc), "cannot run: %s", cmd);
    return (ran){WEXITSTATUS(rc), slurp(o), slurp(e)};
}

static void ran_free(ran *r) {
    kvo_free(r->out);
    kvo_free(r->err);
}

/* A run that exits with code, its stdout holding out_has and its stderr
 * err_has (NULL: anything). */
static void expect_run(const char *args, int code, const char *out_has,
                       const char *err_has) {
    ran r = run(args);
    ck_assert_msg(r.code == code, "%s: exit %d, want %d; stderr: %s", args,
                  r.code, code, r.err);
    if (out_has)
        ck_assert_msg(strstr(r.out, out_has), "%s: stdout %s", args, r.out);
    if (err_has)
        ck_assert_msg(strstr(r.err, err_has), "%s: stderr %s", args, r.err);
    ran_free(&r);
}

START_TEST(replay_prints_final_counters) {
    char args[1024];
    snprintf(args, sizeof(args), "replay %s", cap);
    ran r = run(args);
    ck_assert_int_eq(r.code, 0);
    json_object *j = json_tokener_parse(r.out);
    ck_assert_msg(j != NULL, "stdout: %s", r.out);
    ck_assert_uint_eq(tt_json_u64(j, "counters.events.stored.ok"), 3);
    ck_assert_uint_eq(tt_json_u64(j, "counters.events.removed.ok"), 2);
    ck_assert_uint_eq(tt_json_u64(j, "counters.events.cleared.ok"), 1);
    ck_assert_uint_eq(tt_json_u64(j, "counters.records"), 5);
    ck_assert_uint_eq(tt_json_u64(j, "counters.skipped_records"), 1);
    ck_assert_uint_eq(tt_json_u64(j, "counters.applied"), 4);
    ck_assert_str_eq(json_object_to_json_string_ext(tt_json_at(j, "workers"),
                                                    JSON_C_TO_STRING_PLAIN),
                     "[{\"worker_id\":7,\"dp_rank\":0,\"blocks\":0},"
                     "{\"worker_id\":9,\"dp_rank\":2,\"blocks\":0}]");
    ck_assert_uint_eq(tt_json_u64(j, "pairs"), 0);
    /* exactly one line */
    ck_assert_ptr_eq(strchr(r.out, '\n'), r.out + strlen(r.out) - 1);
    json_object_put(j);
    ran_free(&r);
}
END_TEST

START_TEST(replay_interleaves_applies_and_queries) {
    char q[600];
    snprintf(q, sizeof(q), "%s/queries.jsonl", dir);
    write_file(q, "{\"tokens_hashes\": [" H1 "]}\n"
                  "{\"apply\": 1}\n"
                  "{\"tokens_hashes\": [" H1 ", " H2 ", 3]}\n"
                  "\n"
                  "{\"apply\": 2}\n"
                  "{\"token_ids\": [1, 2, 3, 4, 5, 6]}\n"
                  "{\"token_ids\": [1, 2, 3, 4], \"lora_name\": \"l\"}\n"
                  "{\"apply\": 1}\n"
                  "{\"tokens_hashes\": [" H1 "]}\n");
    char args[2048];
    snprintf(args, sizeof(args), "replay %s %s --block-size 4", cap, q);
    ran r = run(args);
    ck_assert_int_eq(r.code, 0);
    const char *out = r.out;
    const char *want = "{\"query\":0,\"isl_blocks\":1,\"scores\":[]}\n"
                       "{\"query\":1,\"isl_blocks\":3,\"scores\":[{\"worker_"
                       "id\":7,\"dp_rank\":0,"
                       "\"blocks\":2}]}\n"
                       "{\"query\":2,\"isl_blocks\":2,\"scores\":[{\"worker_"
                       "id\":7,\"dp_rank\":0,"
                       "\"blocks\":1}]}\n"
                       "{\"query\":3,\"isl_blocks\":1,\"scores\":[]}\n"
                       "{\"query\":4,\"isl_blocks\":1,\"scores\":[]}\n";
    ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "stdout:\n%s", out);
    const char *last = out + strlen(want);
    ck_assert_msg(strncmp(last, "{\"counters\":", 12) == 0, "final: %s", last);
    ck_assert(strstr(last, "\"pairs\":0}\n"));
    ran_free(&r);
}
END_TEST

START_TEST(replay_rejects_bad_input_with_a_reason) {
    char args[2048], path[600];

    expect_run("replay /nonexistent/events.cap", 1, NULL,
               "/nonexistent/events.cap");

    snprintf(path, sizeof(path), "%s/not-a-capture", dir);
    write_file(path, "hello\n");
    snprintf(args, sizeof(args), "replay %s", path);
    expect_run(args, 1, NULL, "not a capture");

    snprintf(path, sizeof(path), "%s/bad.jsonl", dir);
    snprintf(args, sizeof(args), "replay %s %s", cap, path);
    write_file(path, "{\"apply\": 1}\n{\"tokens_hashes\": [-1]}\n");
    expect_run(args, 1, NULL, "bad.jsonl:2: tokens_hashes[0]");
    write_file(path, "{\"apply\": 1}\nnot json\n");
    expect_run(args, 1, NULL, "bad.jsonl:2:");
    write_file(path, "{\"oops\": 1}\n");
    expect_run(args, 1, NULL, "bad.jsonl:1:");
    /* json-c alone would take the first object and drop the rest */
    write_file(path, "{\"apply\": 1}\n{\"apply\": 1}{\"apply\": 2}\n");
    expect_run(args, 1, NULL, "bad.jsonl:2: bad JSON: trailing characters");
    write_file(path, "{\"tokens_hashes\": [1]} x\n");
    expect_run(args, 1, NULL, "bad.jsonl:1: bad JSON: trailing characters");
    /* one strict reader, as the service's: json-c clamped 2^64, took 01
     * and passed invalid UTF-8 */
    write_file(path,
               "{\"apply\": 1}\n{\"tokens_hashes\": [18446744073709551616]}\n");
    expect_run(
        args, 1, NULL,
        "bad.jsonl:2: bad JSON at tokens_hashes[0]: integer out of range");
    write_file(path, "{\"tokens_hashes\": [01]}\n");
    expect_run(args, 1, NULL,
               "bad.jsonl:1: bad JSON at tokens_hashes[0]: a "
               "number has a leading zero");
    write_file(path, "{\"token_ids\": [1], \"lora_name\": \"\xff\"}\n");
    expect_run(args, 1, NULL,
               "bad.jsonl:1: bad JSON at lora_name: invalid UTF-8");
    write_file(path, "{\"apply\": 18446744073709551616}\n");
    expect_run(args, 1, NULL,
               "bad.jsonl:1: bad JSON at apply: integer out of range");

    /* a capture cut short: what was read is applied and reported */
    size_t len;
    uint8_t *b = kt_read_file(cap, &len);
    snprintf(path, sizeof(path), "%s/cut.cap", dir);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, len - 7, f);
    fclose(f);
    kvo_free(b);
    snprintf(args, sizeof(args), "replay %s", path);
    expect_run(args, 1, "\"capture_error\"", "damaged after 4 records");

    expect_run("replay", 2, NULL, NULL);
    snprintf(args, sizeof(args), "replay %s a b", cap);
    expect_run(args, 2, NULL, NULL);
    snprintf(args, sizeof(args), "replay %s --block-size 0", cap);
    expect_run(args, 2, NULL, NULL);
    expect_run("replay --help", 0, "usage: kvo-indexer", NULL);
    expect_run("--version", 0, "kvo-indexer " KVO_VERSION, NULL);
    expect_run("--no-such-option", 2, NULL, NULL);
    /* the service's bounds refuse values that would unbound them */
    expect_run("--max-publishers 0", 2, NULL, "--max-publishers");
    expect_run("--max-publishers 1048577", 2, NULL, "--max-publishers");
    expect_run("--publisher-idle-ms -1", 2, NULL, "--publisher-idle-ms");
    expect_run("--max-body 0", 2, NULL, "--max-body");
    expect_run("--max-body 1073741825", 2, NULL, "--max-body");
    expect_run("--recovery-timeout-ms 0", 2, NULL, "--recovery-timeout-ms");
    expect_run("--recovery-timeout-ms 3600001", 2, NULL,
               "--recovery-timeout-ms");
    expect_run("--discover-ms x", 2, NULL, "--discover-ms");
    expect_run("--apply-budget-us 0", 2, NULL, "--apply-budget-us");
    expect_run("--apply-budget-us 1000001", 2, NULL, "--apply-budget-us");
}
END_TEST

Suite *suite_replay(void) {
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("binary");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, replay_setup, replay_teardown);
    tcase_add_test(tc, replay_prints_final_counters);
    tcase_add_test(tc, replay_interleaves_applies_and_queries);
    tcase_add_test(tc, replay_rejects_bad_input_with_a_reason);
    suite_add_tcase(s, tc);
    return s;
}
