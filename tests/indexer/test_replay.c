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
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/vectors/event_plane/%s.bin", name);
    char *path = kt_src_path(rel);
    size_t len;
    uint8_t *b = kt_read_file(path, &len);
    wire_frame f[2] = {{(const uint8_t *)SUBJECT, strlen(SUBJECT)}, {b, len}};
    ck_assert_int_eq(wire_cap_write(w, 1700000000000000000ull, f, 2), KVO_OK);
    kvo_free(b);
    kvo_free(path);
}

/* stored_two_blocks, a 3-frame (ZMQ) record, removed_one, cleared,
 * mixed_dp2: 5 records, 4 messages. */
static char *make_capture(const char *dir) {
    char *path = kvo_malloc(600);
    snprintf(path, 600, "%s/events.cap", dir);
    wire_cap_writer *w;
    ck_assert_int_eq(wire_cap_create(&w, path), KVO_OK);
    cap_add_vector(w, "stored_two_blocks");
    wire_frame z[3] = {{(const uint8_t *)"", 0},
                       {(const uint8_t *)"\0\0\0\0\0\0\0\0", 8},
                       {(const uint8_t *)"\x93", 1}};
    ck_assert_int_eq(wire_cap_write(w, 1, z, 3), KVO_OK);
    cap_add_vector(w, "removed_one");
    cap_add_vector(w, "cleared");
    cap_add_vector(w, "mixed_dp2");
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

/* Run kvo-indexer with args (shell words); returns the exit code and the
 * captured stdout / stderr (caller frees). */
static int run(const char *dir, const char *args, char **out, char **err) {
    char *bin = kt_bin_path("kvo-indexer");
    char cmd[4096], o[600], e[600];
    snprintf(o, sizeof(o), "%s/stdout", dir);
    snprintf(e, sizeof(e), "%s/stderr", dir);
    snprintf(cmd, sizeof(cmd), "%s %s >%s 2>%s", bin, args, o, e);
    int rc = system(cmd);
    kvo_free(bin);
    ck_assert_msg(rc != -1 && WIFEXITED(rc), "cannot run: %s", cmd);
    *out = slurp(o);
    *err = slurp(e);
    return WEXITSTATUS(rc);
}

START_TEST(replay_prints_final_counters) {
    char *dir = kt_tmpdir("replay");
    char *cap = make_capture(dir);
    char args[1024], *out, *err;
    snprintf(args, sizeof(args), "replay %s", cap);
    ck_assert_int_eq(run(dir, args, &out, &err), 0);
    json_object *j = json_tokener_parse(out);
    ck_assert_msg(j != NULL, "stdout: %s", out);
    json_object *c, *v, *ev, *t;
    ck_assert(json_object_object_get_ex(j, "counters", &c));
    ck_assert(json_object_object_get_ex(c, "events", &ev));
    ck_assert(json_object_object_get_ex(ev, "stored", &t));
    ck_assert(json_object_object_get_ex(t, "ok", &v));
    ck_assert_int_eq(json_object_get_int(v), 3);
    ck_assert(json_object_object_get_ex(ev, "removed", &t));
    ck_assert(json_object_object_get_ex(t, "ok", &v));
    ck_assert_int_eq(json_object_get_int(v), 2);
    ck_assert(json_object_object_get_ex(ev, "cleared", &t));
    ck_assert(json_object_object_get_ex(t, "ok", &v));
    ck_assert_int_eq(json_object_get_int(v), 1);
    ck_assert(json_object_object_get_ex(c, "records", &v));
    ck_assert_int_eq(json_object_get_int(v), 5);
    ck_assert(json_object_object_get_ex(c, "skipped_records", &v));
    ck_assert_int_eq(json_object_get_int(v), 1);
    ck_assert(json_object_object_get_ex(c, "applied", &v));
    ck_assert_int_eq(json_object_get_int(v), 4);
    ck_assert(json_object_object_get_ex(j, "workers", &v));
    ck_assert_str_eq(json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN),
                     "[{\"worker_id\":7,\"dp_rank\":0,\"blocks\":0},"
                     "{\"worker_id\":9,\"dp_rank\":2,\"blocks\":0}]");
    ck_assert(json_object_object_get_ex(j, "pairs", &v));
    ck_assert_int_eq(json_object_get_int(v), 0);
    /* exactly one line */
    ck_assert_ptr_eq(strchr(out, '\n'), out + strlen(out) - 1);
    json_object_put(j);
    kvo_free(out);
    kvo_free(err);
    kvo_free(cap);
    kvo_free(dir);
}
END_TEST

START_TEST(replay_interleaves_applies_and_queries) {
    char *dir = kt_tmpdir("replay");
    char *cap = make_capture(dir);
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
    char args[2048], *out, *err;
    snprintf(args, sizeof(args), "replay %s %s --block-size 4", cap, q);
    ck_assert_int_eq(run(dir, args, &out, &err), 0);
    const char *want =
        "{\"query\":0,\"isl_blocks\":1,\"scores\":[]}\n"
        "{\"query\":1,\"isl_blocks\":3,\"scores\":[{\"worker_id\":7,\"dp_rank\":0,"
        "\"blocks\":2}]}\n"
        "{\"query\":2,\"isl_blocks\":2,\"scores\":[{\"worker_id\":7,\"dp_rank\":0,"
        "\"blocks\":1}]}\n"
        "{\"query\":3,\"isl_blocks\":1,\"scores\":[]}\n"
        "{\"query\":4,\"isl_blocks\":1,\"scores\":[]}\n";
    ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "stdout:\n%s", out);
    const char *last = out + strlen(want);
    ck_assert_msg(strncmp(last, "{\"counters\":", 12) == 0, "final: %s", last);
    ck_assert(strstr(last, "\"pairs\":0}\n"));
    kvo_free(out);
    kvo_free(err);
    kvo_free(cap);
    kvo_free(dir);
}
END_TEST

START_TEST(replay_rejects_bad_input_with_a_reason) {
    char *dir = kt_tmpdir("replay");
    char *cap = make_capture(dir);
    char args[2048], path[600], *out, *err;

    ck_assert_int_eq(run(dir, "replay /nonexistent/events.cap", &out, &err), 1);
    ck_assert_msg(strstr(err, "/nonexistent/events.cap"), "%s", err);
    kvo_free(out);
    kvo_free(err);

    snprintf(path, sizeof(path), "%s/not-a-capture", dir);
    write_file(path, "hello\n");
    snprintf(args, sizeof(args), "replay %s", path);
    ck_assert_int_eq(run(dir, args, &out, &err), 1);
    ck_assert_msg(strstr(err, "not a capture"), "%s", err);
    kvo_free(out);
    kvo_free(err);

    snprintf(path, sizeof(path), "%s/bad.jsonl", dir);
    write_file(path, "{\"apply\": 1}\n{\"tokens_hashes\": [-1]}\n");
    snprintf(args, sizeof(args), "replay %s %s", cap, path);
    ck_assert_int_eq(run(dir, args, &out, &err), 1);
    ck_assert_msg(strstr(err, "bad.jsonl:2: tokens_hashes[0]"), "%s", err);
    kvo_free(out);
    kvo_free(err);

    write_file(path, "{\"apply\": 1}\nnot json\n");
    ck_assert_int_eq(run(dir, args, &out, &err), 1);
    ck_assert_msg(strstr(err, "bad.jsonl:2:"), "%s", err);
    kvo_free(out);
    kvo_free(err);

    write_file(path, "{\"oops\": 1}\n");
    ck_assert_int_eq(run(dir, args, &out, &err), 1);
    ck_assert_msg(strstr(err, "bad.jsonl:1:"), "%s", err);
    kvo_free(out);
    kvo_free(err);

    /* json-c alone would take the first object and drop the rest */
    write_file(path, "{\"apply\": 1}\n{\"apply\": 1}{\"apply\": 2}\n");
    ck_assert_int_eq(run(dir, args, &out, &err), 1);
    ck_assert_msg(strstr(err, "bad.jsonl:2: bad JSON: trailing bytes"), "%s", err);
    kvo_free(out);
    kvo_free(err);
    write_file(path, "{\"tokens_hashes\": [1]} x\n");
    ck_assert_int_eq(run(dir, args, &out, &err), 1);
    ck_assert_msg(strstr(err, "bad.jsonl:1: bad JSON: trailing bytes"), "%s", err);
    kvo_free(out);
    kvo_free(err);

    /* a capture cut short: what was read is applied and reported */
    size_t len;
    uint8_t *b = kt_read_file(cap, &len);
    snprintf(path, sizeof(path), "%s/cut.cap", dir);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, len - 7, f);
    fclose(f);
    kvo_free(b);
    snprintf(args, sizeof(args), "replay %s", path);
    ck_assert_int_eq(run(dir, args, &out, &err), 1);
    ck_assert_msg(strstr(err, "damaged after 4 records"), "%s", err);
    ck_assert_msg(strstr(out, "\"capture_error\""), "%s", out);
    kvo_free(out);
    kvo_free(err);

    ck_assert_int_eq(run(dir, "replay", &out, &err), 2);
    kvo_free(out);
    kvo_free(err);
    snprintf(args, sizeof(args), "replay %s a b", cap);
    ck_assert_int_eq(run(dir, args, &out, &err), 2);
    kvo_free(out);
    kvo_free(err);
    snprintf(args, sizeof(args), "replay %s --block-size 0", cap);
    ck_assert_int_eq(run(dir, args, &out, &err), 2);
    kvo_free(out);
    kvo_free(err);
    ck_assert_int_eq(run(dir, "replay --help", &out, &err), 0);
    ck_assert(strstr(out, "usage: kvo-indexer"));
    kvo_free(out);
    kvo_free(err);
    ck_assert_int_eq(run(dir, "--version", &out, &err), 0);
    ck_assert(strstr(out, "kvo-indexer " KVO_VERSION));
    kvo_free(out);
    kvo_free(err);
    ck_assert_int_eq(run(dir, "--no-such-option", &out, &err), 2);
    kvo_free(out);
    kvo_free(err);
    kvo_free(cap);
    kvo_free(dir);
}
END_TEST

Suite *suite_replay(void) {
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("binary");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, replay_prints_final_counters);
    tcase_add_test(tc, replay_interleaves_applies_and_queries);
    tcase_add_test(tc, replay_rejects_bad_input_with_a_reason);
    suite_add_tcase(s, tc);
    return s;
}
