/* Capture files (DESIGN §3): write/read round trip, exact byte layout,
 * truncated files (every cut), garbage, huge declared counts and lengths,
 * a record completed by a live writer after a truncated read. */
#include "kt.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Suite *suite_capture(void);

static char *cap_path(const char *tag) {
    char *dir = kt_tmpdir(tag);
    char *p = malloc(strlen(dir) + 16);
    sprintf(p, "%s/cap.kvocap", dir);
    free(dir);
    return p;
}

static void write_file(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Three records: a ZMQ message (3 frames), a NATS message (2 frames, one
 * empty), a record with no frames. */
static const char *z_topic = "kv",
                  *z_payload =
                      "\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\xc0";
static const uint8_t z_seq[8] = {0, 0, 0, 0, 0, 0, 0, 5};

static void write_sample(const char *path) {
    wire_cap_writer *w;
    ck_assert(wire_cap_create(&w, path) == KVO_OK);
    wire_frame zmq[3] = {{(const uint8_t *)z_topic, 2},
                         {z_seq, 8},
                         {(const uint8_t *)z_payload, 12}};
    wire_frame nats[2] = {{(const uint8_t *)"subj.x", 6}, {NULL, 0}};
    ck_assert(wire_cap_write(w, 1700000000123456789ull, zmq, 3) == KVO_OK);
    ck_assert(wire_cap_write(w, 2, nats, 2) == KVO_OK);
    ck_assert(wire_cap_write(w, UINT64_MAX, NULL, 0) == KVO_OK);
    ck_assert(wire_cap_flush(w) == KVO_OK);
    wire_cap_close(w);
}

/* Offsets of the sample's records and its total size. */
enum {
    REC0 = 8,
    REC1 = REC0 + 12 + 4 + 2 + 4 + 8 + 4 + 12,
    REC2 = REC1 + 12 + 4 + 6 + 4 + 0,
    SAMPLE_END = REC2 + 12
};

START_TEST(records_round_trip_with_exact_layout) {
    char *path = cap_path("cap-rt");
    write_sample(path);
    size_t n;
    uint8_t *bytes = kt_read_file(path, &n);
    ck_assert_uint_eq(n, SAMPLE_END);
    ck_assert(memcmp(bytes, "KVOCAP1\n", 8) == 0);
    /* unix ns big-endian, then the frame count, then [len BE][bytes]. */
    const uint8_t rec0[] = {0x17, 0x97, 0x9c, 0xfe, 0x3d, 0x85, 0xcd, 0x15,
                            0,    0,    0,    3,    0,    0,    0,    2,
                            'k',  'v',  0,    0,    0,    8};
    ck_assert(memcmp(bytes + REC0, rec0, sizeof(rec0)) == 0);
    free(bytes);

    wire_cap_reader *r;
    ck_assert(wire_cap_open(&r, path, NULL) == KVO_OK);
    wire_cap_record rec;
    kvo_err err;
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_OK);
    ck_assert(rec.unix_ns == 1700000000123456789ull && rec.n_frames == 3);
    ck_assert_uint_eq(rec.offset, REC0);
    ck_assert(rec.frames[0].len == 2 &&
              memcmp(rec.frames[0].data, "kv", 2) == 0);
    ck_assert(rec.frames[1].len == 8 &&
              memcmp(rec.frames[1].data, z_seq, 8) == 0);
    ck_assert(rec.frames[2].len == 12 &&
              memcmp(rec.frames[2].data, z_payload, 12) == 0);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_OK);
    ck_assert(rec.unix_ns == 2 && rec.n_frames == 2 && rec.offset == REC1);
    ck_assert(rec.frames[0].len == 6 &&
              memcmp(rec.frames[0].data, "subj.x", 6) == 0);
    ck_assert(rec.frames[1].len == 0 && rec.frames[1].data != NULL);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_OK);
    ck_assert(rec.unix_ns == UINT64_MAX && rec.n_frames == 0 &&
              rec.offset == REC2);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_EOF);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_EOF);
    wire_cap_free(r);
    free(path);
}
END_TEST

START_TEST(big_frames_and_sixteen_frames_round_trip_reusing_one_buffer) {
    char *path = cap_path("cap-big");
    size_t big = 3u << 20 | 12345; /* spans several read steps */
    uint8_t *data = malloc(big);
    for (size_t i = 0; i < big; i++) data[i] = (uint8_t)(i * 31 + 7);
    wire_cap_writer *w;
    ck_assert(wire_cap_create(&w, path) == KVO_OK);
    wire_frame f16[WIRE_CAP_MAX_FRAMES];
    for (int i = 0; i < WIRE_CAP_MAX_FRAMES; i++) {
        f16[i].data = data + i;
        f16[i].len = (size_t)i * 1000;
    }
    wire_frame one = {data, big};
    ck_assert(wire_cap_write(w, 1, &one, 1) == KVO_OK);
    for (int k = 0; k < 50; k++)
        ck_assert(wire_cap_write(w, 2 + (uint64_t)k, f16, 16) == KVO_OK);
    wire_frame too_many[WIRE_CAP_MAX_FRAMES + 1];
    memset(too_many, 0, sizeof(too_many));
    ck_assert(wire_cap_write(w, 0, too_many, WIRE_CAP_MAX_FRAMES + 1) ==
              KVO_EINVAL);
    wire_cap_close(w);

    wire_cap_reader *r;
    ck_assert(wire_cap_open(&r, path, NULL) == KVO_OK);
    wire_cap_record rec;
    kvo_err err;
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_OK);
    ck_assert(rec.n_frames == 1 && rec.frames[0].len == big);
    ck_assert(memcmp(rec.frames[0].data, data, big) == 0);
    /* Smaller records reuse the buffer: no allocation from here on. */
    kvo_alloc_fail_after(0);
    kvo_status st = KVO_OK;
    int seen = 0;
    while ((st = wire_cap_next(r, &rec, &err)) == KVO_OK) {
        if (rec.n_frames != 16 || rec.unix_ns != 2 + (uint64_t)seen) break;
        bool same = true;
        for (int i = 0; i < 16; i++)
            same = same && rec.frames[i].len == (size_t)i * 1000 &&
                   memcmp(rec.frames[i].data, data + i, rec.frames[i].len) == 0;
        if (!same) break;
        seen++;
    }
    kvo_alloc_fail_after(-1);
    ck_assert_int_eq(st, KVO_EOF);
    ck_assert_int_eq(seen, 50);
    wire_cap_free(r);
    free(data);
    free(path);
}
END_TEST

START_TEST(every_cut_of_a_file_reads_whole_records_then_etrunc_or_eof) {
    char *path = cap_path("cap-cut");
    write_sample(path);
    size_t n;
    uint8_t *bytes = kt_read_file(path, &n);
    const size_t recs[] = {REC0, REC1, REC2, SAMPLE_END};
    for (size_t cut = 0; cut < n; cut++) {
        write_file(path, bytes, cut);
        wire_cap_reader *r;
        kvo_status st = wire_cap_open(&r, path, NULL);
        if (cut < 8) {
            ck_assert_msg(st == (cut == 0 ? KVO_EPROTO : KVO_ETRUNC),
                          "cut %zu: %s", cut, kvo_status_name(st));
            continue;
        }
        ck_assert(st == KVO_OK);
        wire_cap_record rec;
        kvo_err err;
        size_t whole = 0;
        while ((st = wire_cap_next(r, &rec, &err)) == KVO_OK) {
            ck_assert_uint_eq(rec.offset, recs[whole]);
            whole++;
        }
        /* Records that end at or before the cut are read; then EOF when
         * the cut is on a boundary, else ETRUNC naming the partial record. */
        size_t expect_whole = 0;
        while (expect_whole < 3 && recs[expect_whole + 1] <= cut)
            expect_whole++;
        ck_assert_uint_eq(whole, expect_whole);
        if (cut == recs[whole]) {
            ck_assert_msg(st == KVO_EOF, "cut %zu: %s", cut,
                          kvo_status_name(st));
        } else {
            ck_assert_msg(st == KVO_ETRUNC, "cut %zu: %s", cut,
                          kvo_status_name(st));
            ck_assert_uint_eq(err.offset, recs[whole]);
            ck_assert(err.status == KVO_ETRUNC && err.msg[0]);
        }
        wire_cap_free(r);
    }
    free(bytes);
    free(path);
}
END_TEST

START_TEST(a_truncated_record_is_read_once_a_live_writer_completes_it) {
    char *path = cap_path("cap-live");
    write_sample(path);
    size_t n;
    uint8_t *bytes = kt_read_file(path, &n);
    write_file(path, bytes, REC1 + 15); /* second record cut in a frame */
    wire_cap_reader *r;
    ck_assert(wire_cap_open(&r, path, NULL) == KVO_OK);
    wire_cap_record rec;
    kvo_err err;
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_OK);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_ETRUNC);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_ETRUNC);
    FILE *f = fopen(path, "ab");
    fwrite(bytes + REC1 + 15, 1, n - (REC1 + 15), f);
    fclose(f);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_OK);
    ck_assert(rec.offset == REC1 && rec.n_frames == 2 &&
              memcmp(rec.frames[0].data, "subj.x", 6) == 0);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_OK);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_EOF);
    wire_cap_free(r);
    free(bytes);
    free(path);
}
END_TEST

START_TEST(garbage_and_missing_files_are_refused_at_open) {
    char *path = cap_path("cap-garbage");
    const char *junk[] = {"KVOCAP2\n", "\x85\xac publisher", "kvocap1\nxxxx",
                          "KVOCAP"};
    const kvo_status want[] = {KVO_EPROTO, KVO_EPROTO, KVO_EPROTO, KVO_ETRUNC};
    for (size_t i = 0; i < KVO_ARRAY_LEN(junk); i++) {
        write_file(path, (const uint8_t *)junk[i], strlen(junk[i]));
        wire_cap_reader *r = NULL;
        ck_assert_msg(wire_cap_open(&r, path, NULL) == want[i], "%zu", i);
        ck_assert_ptr_null(r);
    }
    wire_cap_reader *r;
    ck_assert(wire_cap_open(&r, "/nonexistent/dir/cap", NULL) == KVO_ENOTFOUND);
    wire_cap_writer *w;
    ck_assert(wire_cap_create(&w, "/nonexistent/dir/cap") == KVO_ENOTFOUND);
    free(path);
}
END_TEST

START_TEST(huge_frame_lengths_and_counts_are_refused_without_allocating) {
    char *path = cap_path("cap-huge");
    /* magic, ts, 1 frame, length 0xffffffff, 3 bytes */
    uint8_t huge_len[] = {'K', 'V', 'O',  'C',  'A',  'P',  '1', '\n', 0,
                          0,   0,   0,    0,    0,    0,    1,   0,    0,
                          0,   1,   0xff, 0xff, 0xff, 0xff, 1,   2,    3};
    write_file(path, huge_len, sizeof(huge_len));
    wire_cap_reader *r;
    ck_assert(wire_cap_open(&r, path, NULL) == KVO_OK);
    wire_cap_record rec;
    kvo_err err;
    kvo_alloc_fail_after(0);
    kvo_status st = wire_cap_next(r, &rec, &err);
    kvo_alloc_fail_after(-1);
    ck_assert_int_eq(st, KVO_ETOOBIG);
    ck_assert_uint_eq(err.offset, 20);
    /* Framing is lost: the error sticks. */
    memset(&err, 0, sizeof(err));
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_ETOOBIG);
    ck_assert_uint_eq(err.offset, 20);
    wire_cap_free(r);

    /* 17 frames. */
    huge_len[19] = 17;
    write_file(path, huge_len, sizeof(huge_len));
    ck_assert(wire_cap_open(&r, path, NULL) == KVO_OK);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_ETOOBIG);
    ck_assert_uint_eq(err.offset, 16);
    wire_cap_free(r);

    /* A length within a raised limit, but the file holds 3 bytes of it:
     * ETRUNC (the reader grows its buffer only as bytes arrive). */
    huge_len[19] = 1;
    write_file(path, huge_len, sizeof(huge_len));
    wire_limits lim;
    wire_limits_default(&lim);
    lim.max_bytes = UINT32_MAX;
    ck_assert(wire_cap_open(&r, path, &lim) == KVO_OK);
    ck_assert(wire_cap_next(r, &rec, &err) == KVO_ETRUNC);
    ck_assert_uint_eq(err.offset, 8);
    wire_cap_free(r);
    free(path);
}
END_TEST

Suite *suite_capture(void) {
    Suite *s = suite_create("capture");
    TCase *tc = tcase_create("capture");
    tcase_add_test(tc, records_round_trip_with_exact_layout);
    tcase_add_test(tc,
                   big_frames_and_sixteen_frames_round_trip_reusing_one_buffer);
    tcase_add_test(tc,
                   every_cut_of_a_file_reads_whole_records_then_etrunc_or_eof);
    tcase_add_test(tc,
                   a_truncated_record_is_read_once_a_live_writer_completes_it);
    tcase_add_test(tc, garbage_and_missing_files_are_refused_at_open);
    tcase_add_test(
        tc, huge_frame_lengths_and_counts_are_refused_without_allocating);
    suite_add_tcase(s, tc);
    return s;
}
