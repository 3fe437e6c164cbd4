/* The kvo-wire executable (DESIGN §3), run as a real process on the
 * vectors: decode/encode round trips through files and pipes, hash lines,
 * cat over a capture with a bad record, and the exit codes and the one
 * stderr line of bad input and bad usage. */
#include "kt.h"
#include "wire.h"
#include "wire_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

Suite *suite_tool(void);

static char *tool; /* path of kvo-wire */
static char *dir;  /* scratch directory of this test */

static void setup(void) {
    tool = kt_bin_path("kvo-wire");
    dir = kt_tmpdir("tool");
}

static void teardown(void) {
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
    kvo_free(tool);
    kvo_free(dir);
}

static char *tmp_path(const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = kvo_malloc(n);
    ck_assert_ptr_nonnull(p);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

typedef struct result {
    int code;     /* exit code; 128+signal when killed */
    uint8_t *out; /* stdout, NUL-terminated */
    size_t out_len;
    char *err; /* stderr, NUL-terminated */
    int err_lines;
} result;

static void result_free(result *r) {
    kvo_free(r->out);
    kvo_free(r->err);
}

/* Run "kvo-wire ARGS" through sh (ARGS may redirect stdin); capture
 * stdout and stderr in files. */
static result run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static result run(const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    char *out = tmp_path("stdout"), *err = tmp_path("stderr");
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "'%s' %s >'%s' 2>'%s'", tool, args, out, err);
    int st = system(cmd);
    ck_assert_msg(st != -1, "cannot run %s", cmd);
    result r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    uint8_t *o = kt_read_file(out, &r.out_len);
    r.out = kvo_realloc(o, r.out_len + 1);
    r.out[r.out_len] = '\0';
    size_t elen;
    uint8_t *e = kt_read_file(err, &elen);
    r.err = kvo_realloc(e, elen + 1);
    r.err[elen] = '\0';
    r.err_lines = 0;
    for (size_t i = 0; i < elen; i++) r.err_lines += r.err[i] == '\n';
    kvo_free(out);
    kvo_free(err);
    return r;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static json_object *wire_cases(void) {
    json_object *all = kt_load_json("tests/data/vectors/wire/vectors.json");
    json_object *c = json_object_get(json_object_object_get(all, "cases"));
    json_object_put(all);
    return c;
}

static char *vector_path(json_object *c) {
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/vectors/wire/%s",
             json_object_get_string(json_object_object_get(c, "file")));
    return kt_src_path(rel);
}

START_TEST(decode_and_encode_round_trip_every_vector_through_files) {
    json_object *cases = wire_cases();
    char *json_path = tmp_path("view.json"), *bin_path = tmp_path("out.bin");
    for (size_t i = 0; i < json_object_array_length(cases); i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        char *vec = vector_path(c);
        result r = run("decode '%s'", vec);
        ck_assert_msg(r.code == 0 && r.err_lines == 0, "%s: exit %d: %s",
                      wt_name(c), r.code, r.err);
        json_object *view = json_tokener_parse((const char *)r.out);
        ck_assert_msg(view != NULL, "%s: not JSON: %s", wt_name(c), r.out);
        char why[512];
        ck_assert_msg(wt_json_same(view, json_object_object_get(c, "fields"),
                                   why, sizeof(why), ""),
                      "%s: %s", wt_name(c), why);
        json_object_put(view);
        write_file(json_path, r.out, r.out_len);
        result_free(&r);

        const char *profile =
            json_object_get_string(json_object_object_get(c, "profile"));
        r = run("encode --format %s '%s'", profile, json_path);
        ck_assert_msg(r.code == 0 && r.err_lines == 0, "%s: exit %d: %s",
                      wt_name(c), r.code, r.err);
        size_t len;
        uint8_t *want = kt_read_file(vec, &len);
        ck_assert_msg(r.out_len == len && memcmp(r.out, want, len) == 0,
                      "%s: encode --format %s gave other bytes", wt_name(c),
                      profile);
        write_file(bin_path, r.out, r.out_len);
        kvo_free(want);
        result_free(&r);
        kvo_free(vec);
    }
    kvo_free(json_path);
    kvo_free(bin_path);
    json_object_put(cases);
}
END_TEST

START_TEST(stdin_and_options_after_operands_work) {
    json_object *cases = wire_cases();
    json_object *c = json_object_array_get_idx(cases, 0);
    char *vec = vector_path(c);
    char *json_path = tmp_path("view.json");
    result r = run("decode - < '%s'", vec);
    ck_assert_int_eq(r.code, 0);
    write_file(json_path, r.out, r.out_len);
    result_free(&r);
    /* FILE before --format, then from stdin with the default format */
    r = run("encode '%s' --format map", json_path);
    ck_assert_int_eq(r.code, 0);
    size_t len;
    uint8_t *want = kt_read_file(vec, &len);
    ck_assert(r.out_len == len && memcmp(r.out, want, len) == 0);
    result_free(&r);
    r = run("encode < '%s'", json_path);
    ck_assert_int_eq(r.code, 0);
    ck_assert(r.out_len == len && memcmp(r.out, want, len) == 0);
    result_free(&r);
    /* --reverse-keys changes the bytes, not the view */
    r = run("encode --reverse-keys - < '%s'", json_path);
    ck_assert_int_eq(r.code, 0);
    ck_assert(r.out_len == len && memcmp(r.out, want, len) != 0);
    result_free(&r);
    /* --pretty is the same JSON */
    r = run("decode --pretty '%s'", vec);
    ck_assert_int_eq(r.code, 0);
    ck_assert_ptr_nonnull(strchr((char *)r.out, '\n'));
    ck_assert(strchr((char *)r.out, '\n') < (char *)r.out + r.out_len - 1);
    json_object *view = json_tokener_parse((const char *)r.out);
    char why[256];
    ck_assert(wt_json_same(view, json_object_object_get(c, "fields"), why,
                           sizeof(why), ""));
    json_object_put(view);
    result_free(&r);
    kvo_free(want);
    kvo_free(vec);
    kvo_free(json_path);
    json_object_put(cases);
}
END_TEST

/* Exit 1, nothing on stdout, exactly one stderr line containing needle. */
static void assert_input_failure(result *r, const char *needle,
                                 const char *what) {
    ck_assert_msg(r->code == 1, "%s: exit %d", what, r->code);
    ck_assert_msg(r->out_len == 0, "%s: stdout not empty", what);
    ck_assert_msg(r->err_lines == 1, "%s: %d stderr lines: %s", what,
                  r->err_lines, r->err);
    ck_assert_msg(strstr(r->err, needle), "%s: \"%s\" lacks \"%s\"", what,
                  r->err, needle);
    ck_assert_msg(strncmp(r->err, "kvo-wire: ", 10) == 0, "%s: %s", what,
                  r->err);
}

START_TEST(bad_input_exits_1_with_one_line_naming_the_offset) {
    char *bad = tmp_path("bad.bin");
    /* a truncated vector */
    char *vec = kt_src_path("tests/data/vectors/wire/store_chain.bin");
    size_t len;
    uint8_t *buf = kt_read_file(vec, &len);
    write_file(bad, buf, 100);
    result r = run("decode '%s'", bad);
    wire_batch b;
    wire_batch_init(&b);
    kvo_err e;
    ck_assert(wire_batch_decode(buf, 100, NULL, &b, &e) == KVO_ETRUNC);
    wire_batch_fini(&b);
    char needle[256], es[200];
    snprintf(needle, sizeof(needle), "kvo-wire: decode: %s\n",
             kvo_err_str(&e, es, sizeof(es)));
    ck_assert_str_eq(r.err, needle); /* the library's reason, verbatim */
    assert_input_failure(&r, "ETRUNC at byte 86", "truncated");
    result_free(&r);
    /* the 5 bytes msgpack-c would allocate 128 GiB for */
    write_file(bad, "\xdd\xff\xff\xff\xff", 5);
    r = run("decode - < '%s'", bad);
    assert_input_failure(&r, "ETOOBIG at byte 0", "dd ff ff ff ff");
    result_free(&r);
    /* a wrong type deep inside: the 1st token (ce ...) made a str */
    size_t at = 0;
    for (size_t i = 0; i + 3 < len; i++)
        if (!memcmp(buf + i, "\xdc\x00\x20\xce", 4)) at = i + 3;
    ck_assert_uint_gt(at, 0);
    buf[at] = 0xa4;
    write_file(bad, buf, len);
    r = run("decode '%s'", bad);
    snprintf(needle, sizeof(needle),
             "EPROTO at byte %zu: events[0].token_ids[0]", at);
    assert_input_failure(&r, needle, "wrong type");
    result_free(&r);
    /* a limit given on the command line */
    r = run("decode --max-elems 8 '%s'", vec);
    assert_input_failure(&r, "ETOOBIG", "--max-elems");
    result_free(&r);
    /* empty input */
    write_file(bad, "", 0);
    r = run("decode '%s'", bad);
    assert_input_failure(&r, "ETRUNC at byte 0", "empty");
    result_free(&r);
    /* missing file */
    r = run("decode '%s/none.bin'", dir);
    assert_input_failure(&r, "cannot open", "missing file");
    result_free(&r);
    /* bad JSON, a bad view, trailing garbage */
    write_file(bad, "{\"ts\": 1.0, \"events\": [", 23);
    r = run("encode '%s'", bad);
    assert_input_failure(&r, "EPROTO at byte 23", "cut JSON");
    result_free(&r);
    const char *view = "{\"ts\": 1.0, \"events\": [{\"type\": \"BlockStored\", "
                       "\"block_hashes\": [1], \"token_ids\": [1, \"x\"]}]}";
    write_file(bad, view, strlen(view));
    r = run("encode '%s'", bad);
    assert_input_failure(&r, "events[0].token_ids[1]", "bad view");
    result_free(&r);
    write_file(bad, "{\"ts\": 1.0, \"events\": []} x", 28);
    r = run("encode '%s'", bad);
    assert_input_failure(&r, "trailing", "trailing");
    result_free(&r);
    /* extra_keys nested 40 deep: decodes with --max-depth 100, but its JSON
     * view (read under the default limits) cannot be built -- said so, not
     * reported as out of memory */
    static const char head[] = "\x93\xcb\x3f\xf0\0\0\0\0\0\0\x91\x85"
                               "\xa4type\xab"
                               "BlockStored\xac"
                               "block_hashes\x91\x01"
                               "\xb1parent_block_hash\xc0\xa9token_ids\x91\x01"
                               "\xaa"
                               "extra_keys";
    uint8_t deep[160];
    size_t dn = sizeof(head) - 1;
    memcpy(deep, head, dn);
    memset(deep + dn, 0x91, 40);
    dn += 40;
    deep[dn++] = 0x00;
    deep[dn++] = 0xc0; /* data_parallel_rank */
    write_file(bad, deep, dn);
    r = run("decode '%s'", bad);
    assert_input_failure(&r, "ETOOBIG", "deep extra_keys");
    result_free(&r);
    r = run("decode --max-depth 100 '%s'", bad);
    assert_input_failure(&r, "EPROTO: no JSON view", "deep extra_keys view");
    result_free(&r);
    kvo_free(buf);
    kvo_free(vec);
    kvo_free(bad);
}
END_TEST

START_TEST(usage_errors_exit_2_and_help_and_version_exit_0) {
    static const char *const usage_errors[] = {
        "",
        "frobnicate",
        "decode",
        "decode a b",
        "encode --format nope",
        "encode a b",
        "hash 1 2 3",
        "hash --algo sha256 1 2 3",
        "hash --algo md5 --block-size 2 1 2",
        "hash --algo router --block-size 2 1 x",
        "cat",
        "decode --no-such-option x",
        "decode --max-depth x y",
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(usage_errors); i++) {
        result r = run("%s", usage_errors[i]);
        ck_assert_msg(r.code == 2, "'%s': exit %d", usage_errors[i], r.code);
        ck_assert_msg(r.err_lines >= 1, "'%s': silent", usage_errors[i]);
        result_free(&r);
    }
    result r = run("--help");
    ck_assert_int_eq(r.code, 0);
    ck_assert(strstr((char *)r.out, "usage: kvo-wire") &&
              strstr((char *)r.out, "cat FILE"));
    result_free(&r);
    r = run("decode --help");
    ck_assert_int_eq(r.code, 0);
    ck_assert(strstr((char *)r.out, "usage: kvo-wire"));
    result_free(&r);
    r = run("--version");
    ck_assert_int_eq(r.code, 0);
    ck_assert_str_eq((char *)r.out, "kvo-wire " KVO_VERSION "\n");
    result_free(&r);
}
END_TEST

/* " 1 2 3" of a JSON array of ints. */
static void tokens_arg(json_object *toks, char *out, size_t n) {
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < json_object_array_length(toks) && k + 24 < n; i++)
        k += (size_t)snprintf(
            out + k, n - k, " %" PRIu64,
            json_object_get_uint64(json_object_array_get_idx(toks, i)));
}

static void opt_arg(json_object *c, const char *key, const char *opt, char *out,
                    size_t n) {
    json_object *v = json_object_object_get(c, key);
    out[0] = '\0';
    if (v) snprintf(out, n, " %s '%s'", opt, json_object_get_string(v));
}

START_TEST(hash_prints_one_line_per_full_block_like_the_vectors) {
    json_object *all =
        kt_load_json("tests/data/vectors/hash/hash_vectors.json");
    static char toks[65536];
    char lora[256], salt[256], expect[8192];
    int runs = 0;
    json_object *eng = json_object_object_get(all, "engine_hash_cases");
    for (size_t i = 0; i < json_object_array_length(eng); i++) {
        json_object *c = json_object_array_get_idx(eng, i);
        tokens_arg(json_object_object_get(c, "token_ids"), toks, sizeof(toks));
        opt_arg(c, "lora_name", "--lora", lora, sizeof(lora));
        opt_arg(c, "cache_salt", "--salt", salt, sizeof(salt));
        result r =
            run("hash --algo %s --seed '%s' --block-size %d%s%s --%s",
                json_object_get_string(json_object_object_get(c, "algo")),
                json_object_get_string(json_object_object_get(c, "seed")),
                json_object_get_int(json_object_object_get(c, "block_size")),
                lora, salt, toks);
        json_object *blocks = json_object_object_get(c, "blocks");
        size_t k = 0;
        expect[0] = '\0';
        for (size_t b = 0; b < json_object_array_length(blocks); b++) {
            json_object *blk = json_object_array_get_idx(blocks, b);
            k += (size_t)snprintf(
                expect + k, sizeof(expect) - k, "%s %s\n",
                json_object_get_string(json_object_object_get(blk, "digest")),
                json_object_get_string(json_object_object_get(blk, "low64")));
        }
        ck_assert_msg(r.code == 0, "%s: exit %d: %s",
                      json_object_get_string(json_object_object_get(c, "name")),
                      r.code, r.err);
        ck_assert_msg(strcmp((char *)r.out, expect) == 0, "%s:\n%s\nwant\n%s",
                      json_object_get_string(json_object_object_get(c, "name")),
                      r.out, expect);
        result_free(&r);
        runs++;
    }
    json_object *rt = json_object_object_get(all, "router_hash_cases");
    for (size_t i = 0; i < json_object_array_length(rt); i++) {
        json_object *c = json_object_array_get_idx(rt, i);
        tokens_arg(json_object_object_get(c, "token_ids"), toks, sizeof(toks));
        opt_arg(c, "lora_name", "--lora", lora, sizeof(lora));
        opt_arg(c, "cache_salt", "--salt", salt, sizeof(salt));
        result r =
            run("hash --algo router --block-size %d%s%s --%s",
                json_object_get_int(json_object_object_get(c, "block_size")),
                lora, salt, toks);
        json_object *hs = json_object_object_get(c, "tokens_hashes");
        size_t k = 0;
        expect[0] = '\0';
        for (size_t b = 0; b < json_object_array_length(hs); b++)
            k += (size_t)snprintf(
                expect + k, sizeof(expect) - k, "%s\n",
                json_object_get_string(json_object_array_get_idx(hs, b)));
        ck_assert_msg(r.code == 0 && strcmp((char *)r.out, expect) == 0,
                      "%s: exit %d:\n%s\nwant\n%s",
                      json_object_get_string(json_object_object_get(c, "name")),
                      r.code, r.out, expect);
        result_free(&r);
        runs++;
    }
    ck_assert_int_gt(runs, 40);
    json_object_put(all);
}
END_TEST

/* A capture: a batch, an event-plane message, a bad batch, a replay end
 * marker, a 1-frame record and another batch. */
static void write_capture(const char *path, size_t *n_records) {
    wire_cap_writer *w;
    ck_assert(wire_cap_create(&w, path) == KVO_OK);
    char *vp = kt_src_path("tests/data/vectors/wire/mixed_dp_set.bin");
    size_t vlen;
    uint8_t *v = kt_read_file(vp, &vlen);
    char *pp =
        kt_src_path("tests/data/vectors/event_plane/stored_two_blocks.bin");
    size_t plen;
    uint8_t *pl = kt_read_file(pp, &plen);
    uint8_t seq[8];
    wire_seq_put(seq, 41);
    wire_frame zmq[3] = {
        {(const uint8_t *)"kv-events", 9}, {seq, 8}, {v, vlen}};
    ck_assert(wire_cap_write(w, 1764495808123456789ull, zmq, 3) == KVO_OK);
    const char *subj = "namespace.dynamo.component.backend.kv-events";
    wire_frame nats[2] = {{(const uint8_t *)subj, strlen(subj)}, {pl, plen}};
    ck_assert(wire_cap_write(w, 1764495808123456790ull, nats, 2) == KVO_OK);
    wire_seq_put(seq, 42);
    zmq[2].len = vlen - 1; /* cut */
    ck_assert(wire_cap_write(w, 1764495808123456791ull, zmq, 3) == KVO_OK);
    wire_seq_put(seq, WIRE_REPLAY_END);
    wire_frame end[3] = {
        {(const uint8_t *)"", 0}, {seq, 8}, {(const uint8_t *)"", 0}};
    ck_assert(wire_cap_write(w, 1764495808123456792ull, end, 3) == KVO_OK);
    ck_assert(wire_cap_write(w, 1764495808123456793ull, zmq, 1) == KVO_OK);
    wire_seq_put(seq, 43);
    zmq[2].len = vlen;
    ck_assert(wire_cap_write(w, 1764495808123456794ull, zmq, 3) == KVO_OK);
    wire_cap_close(w);
    *n_records = 6;
    kvo_free(v);
    kvo_free(pl);
    kvo_free(vp);
    kvo_free(pp);
}

START_TEST(cat_prints_every_record_and_goes_on_past_a_bad_one) {
    char *cap = tmp_path("events.kvocap");
    size_t n;
    write_capture(cap, &n);
    result r = run("cat '%s'", cap);
    ck_assert_msg(r.code == 1, "exit %d", r.code);
    ck_assert_msg(r.err_lines == 1 &&
                      strstr(r.err, "2 of 6 records did not decode"),
                  "%s", r.err);
    json_object *rec[8] = {NULL};
    size_t lines = 0;
    for (char *save = NULL, *line = strtok_r((char *)r.out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        ck_assert_uint_lt(lines, 8);
        rec[lines] = json_tokener_parse(line);
        ck_assert_msg(rec[lines] != NULL, "not JSON: %s", line);
        lines++;
    }
    ck_assert_uint_eq(lines, n);
#define GET(i, k) json_object_object_get(rec[i], k)
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(json_object_get_uint64(GET(i, "record")), i);
    ck_assert_uint_eq(json_object_get_uint64(GET(0, "offset")), 8);
    ck_assert_str_eq(json_object_get_string(GET(0, "time")),
                     "2025-11-30T09:43:28.123456789Z");
    ck_assert_str_eq(json_object_get_string(GET(0, "transport")), "zmq");
    ck_assert_str_eq(json_object_get_string(GET(0, "topic")), "kv-events");
    ck_assert_uint_eq(json_object_get_uint64(GET(0, "seq")), 41);
    ck_assert_uint_eq(json_object_array_length(GET(0, "sizes")), 3);
    /* the decoded batch is the vector's view */
    json_object *cases = wire_cases(), *fields = NULL;
    for (size_t i = 0; i < json_object_array_length(cases); i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        if (!strcmp(wt_name(c), "mixed_dp_set"))
            fields = json_object_object_get(c, "fields");
    }
    char why[256];
    ck_assert_msg(wt_json_same(GET(0, "batch"), fields, why, sizeof(why), ""),
                  "%s", why);
    ck_assert_str_eq(json_object_get_string(GET(1, "transport")), "nats");
    ck_assert_str_eq(json_object_get_string(GET(1, "subject")),
                     "namespace.dynamo.component.backend.kv-events");
    ck_assert_uint_eq(json_object_get_uint64(json_object_object_get(
                          GET(1, "message"), "publisher_id")),
                      42);
    ck_assert_msg(
        strstr(json_object_get_string(GET(2, "error")), "ETRUNC at byte"), "%s",
        json_object_get_string(GET(2, "error")));
    ck_assert_ptr_null(GET(2, "batch"));
    ck_assert(json_object_get_boolean(GET(3, "end_of_replay")));
    ck_assert_ptr_nonnull(GET(4, "error"));
    ck_assert_uint_eq(json_object_get_uint64(GET(5, "seq")), 43);
    ck_assert(wt_json_same(GET(5, "batch"), fields, why, sizeof(why), ""));
#undef GET
    for (size_t i = 0; i < lines; i++) json_object_put(rec[i]);
    json_object_put(cases);
    result_free(&r);

    /* a capture cut inside a record: what is there, then one error line */
    size_t len;
    uint8_t *bytes = kt_read_file(cap, &len);
    write_file(cap, bytes, len - 3);
    r = run("cat '%s'", cap);
    ck_assert_int_eq(r.code, 1);
    ck_assert_msg(r.err_lines == 1 && strstr(r.err, "ETRUNC"), "%s", r.err);
    lines = 0;
    for (size_t i = 0; i < r.out_len; i++) lines += r.out[i] == '\n';
    ck_assert_uint_eq(lines, n - 1);
    result_free(&r);
    /* not a capture at all */
    write_file(cap, bytes + 8, 32);
    r = run("cat '%s'", cap);
    assert_input_failure(&r, "not a capture", "no magic");
    result_free(&r);
    kvo_free(bytes);
    kvo_free(cap);
}
END_TEST

Suite *suite_tool(void) {
    Suite *s = suite_create("tool");
    TCase *tc = tcase_create("kvo-wire");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, decode_and_encode_round_trip_every_vector_through_files);
    tcase_add_test(tc, stdin_and_options_after_operands_work);
    tcase_add_test(tc, bad_input_exits_1_with_one_line_naming_the_offset);
    tcase_add_test(tc, usage_errors_exit_2_and_help_and_version_exit_0);
    tcase_add_test(tc, hash_prints_one_line_per_full_block_like_the_vectors);
    tcase_add_test(tc, cat_prints_every_record_and_goes_on_past_a_bad_one);
    suite_add_tcase(s, tc);
    return s;
}
