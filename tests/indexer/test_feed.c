/* test_feed: event-plane messages into the tree -- the shared vectors,
 * publisher dedup, gaps, restarts, KVO-Zmq-Seq watermarks, tiers, hostile
 * bytes -- and the JSON shapes and query parsing the service and replay
 * share. */
#include "idx_test.h"

#include <stdlib.h>
#include <string.h>

/* Feed f one tt_envelope(pub, seq, worker, tier, n) with header hdr (may be
 * NULL); *r (may be NULL) gets the result. */
static kvo_status feed_envelope(idx_feed *f, uint64_t pub, uint64_t seq,
                                uint64_t worker, wire_tier tier, uint32_t n,
                                const char *hdr, idx_feed_result *r) {
    size_t len;
    uint8_t *b = tt_envelope(pub, seq, worker, tier, n, &len);
    kvo_status s = idx_feed_message(f, b, len, hdr, r, NULL);
    kvo_free(b);
    return s;
}

/* The feed's publishers (kvo_free), which must be n. */
static idx_publisher *publishers(const idx_feed *f, size_t n) {
    idx_publisher *p;
    size_t got;
    ck_assert_int_eq(idx_feed_publishers(f, &p, &got), KVO_OK);
    ck_assert_uint_eq(got, n);
    return p;
}

START_TEST(shared_vectors_apply_in_order) {
    idx_feed *f = tt_feed_new();
    idx_tree *t = idx_feed_tree(f);
    ck_assert_int_eq(tt_feed_vector(f, "stored_two_blocks", NULL), KVO_OK);
    ck_assert_uint_eq(tt_blocks(t, 7, 0), 2);
    /* tokens [1,2,3,4] hash to the vector's first tokens_hash */
    uint64_t q[] = {14643705804678351452ull, 16777012769546811212ull};
    ck_assert_uint_eq(tt_score(t, q, 2, 7, 0), 2);
    ck_assert_int_eq(tt_feed_vector(f, "removed_one", NULL), KVO_OK);
    ck_assert_uint_eq(tt_score(t, q, 2, 7, 0), 1);
    ck_assert_int_eq(tt_feed_vector(f, "cleared", NULL), KVO_OK);
    ck_assert_uint_eq(tt_blocks(t, 7, 0), 0);
    ck_assert_int_eq(tt_feed_vector(f, "mixed_dp2", NULL), KVO_OK);
    ck_assert_uint_eq(tt_blocks(t, 9, 2), 0);
    idx_counters c;
    idx_tree_counters(t, &c);
    ck_assert_uint_eq(c.events[WIRE_R_STORED][IDX_EV_OK], 3);
    ck_assert_uint_eq(c.events[WIRE_R_REMOVED][IDX_EV_OK], 2);
    ck_assert_uint_eq(c.events[WIRE_R_CLEARED][IDX_EV_OK], 1);
    ck_assert_uint_eq(c.blocks_stored, 4);
    ck_assert_uint_eq(c.blocks_removed, 3);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.messages, 4);
    ck_assert_uint_eq(k.applied, 4);
    ck_assert_uint_eq(k.gaps + k.duplicates + k.undecodable, 0);
    /* the single-RouterEvent form (older Dynamo) from another publisher */
    idx_feed *g = tt_feed_of("legacy_single_event", NULL);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(g), 7, 0), 2);
    idx_feed_free(g);
    tt_check(t, true);
    idx_feed_free(f);
}
END_TEST

START_TEST(duplicates_are_dropped_gaps_and_restarts_counted) {
    idx_feed *f = tt_feed_of("stored_two_blocks", "removed_one", NULL);
    /* the same (publisher, sequence, body) again: dropped */
    ck_assert_int_eq(tt_feed_vector(f, "removed_one", NULL), KVO_EEXIST);
    ck_assert_int_eq(tt_feed_vector(f, "stored_two_blocks", NULL), KVO_EEXIST);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), 7, 0), 1);
    /* sequence 2 is skipped */
    ck_assert_int_eq(tt_feed_vector(f, "mixed_dp2", NULL), KVO_OK);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.duplicates, 2);
    ck_assert_uint_eq(k.gaps, 1);
    ck_assert_uint_eq(k.missed, 1);
    /* sequence 0 again with another body: the publisher restarted */
    ck_assert_int_eq(tt_feed_vector(f, "legacy_single_event", NULL), KVO_OK);
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.restarts, 1);
    ck_assert_uint_eq(k.applied, 4);
    idx_publisher *p = publishers(f, 1);
    ck_assert_uint_eq(p[0].publisher_id, 42);
    ck_assert_uint_eq(p[0].last_sequence, 0);
    ck_assert_uint_eq(p[0].messages, 4);
    ck_assert_uint_eq(p[0].duplicates, 2);
    ck_assert_uint_eq(p[0].gaps, 1);
    kvo_free(p);
    /* a publisher first heard at sequence 5 missed 0..4 */
    ck_assert_int_eq(
        feed_envelope(f, 77, 5, 1, WIRE_TIER_DEVICE, 1, NULL, NULL), KVO_OK);
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.gaps, 2);
    ck_assert_uint_eq(k.missed, 6);
    idx_feed_free(f);
}
END_TEST

/* The result names what became of each message, as the counters count
 * it: the service logs from it. */
START_TEST(message_result_says_what_happened) {
    idx_feed *f = tt_feed_new();
    idx_feed_result r;
    ck_assert_int_eq(feed_envelope(f, 5, 0, 1, WIRE_TIER_DEVICE, 2, "1-2", &r),
                     KVO_OK);
    ck_assert(r.applied && !r.duplicate && !r.undecodable && !r.restart &&
              !r.bad_header);
    ck_assert_uint_eq(r.publisher_id, 5);
    ck_assert_uint_eq(r.sequence, 0);
    ck_assert_uint_eq(r.missed + r.other_tier + r.lost, 0);
    ck_assert_int_eq(feed_envelope(f, 5, 0, 1, WIRE_TIER_DEVICE, 2, NULL, &r),
                     KVO_EEXIST);
    ck_assert(r.duplicate && !r.applied);
    ck_assert_uint_eq(r.publisher_id, 5);
    /* sequence 4 after 0: 1..3 missed; and a malformed header */
    ck_assert_int_eq(feed_envelope(f, 5, 4, 1, WIRE_TIER_DEVICE, 1, "x", &r),
                     KVO_OK);
    ck_assert(r.applied && r.bad_header && !r.restart);
    ck_assert_uint_eq(r.sequence, 4);
    ck_assert_uint_eq(r.missed, 3);
    /* sequence 0 again with another body: a restart, applied */
    ck_assert_int_eq(feed_envelope(f, 5, 0, 2, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert(r.applied && r.restart && !r.duplicate);
    ck_assert_uint_eq(r.missed, 0);
    ck_assert_int_eq(
        feed_envelope(f, 5, 1, 1, WIRE_TIER_HOST_PINNED, 1, NULL, &r), KVO_OK);
    ck_assert(r.applied);
    ck_assert_uint_eq(r.other_tier, 1);
    const uint8_t junk[] = {0x93, 0x01, 0x02};
    kvo_err err;
    ck_assert_int_ne(idx_feed_message(f, junk, sizeof(junk), NULL, &r, &err),
                     KVO_OK);
    ck_assert(r.undecodable && !r.applied);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.messages, 6);
    ck_assert_uint_eq(k.applied, 4);
    uint64_t once[] = {k.duplicates,  k.restarts,   k.gaps,
                       k.bad_headers, k.other_tier, k.undecodable};
    for (size_t i = 0; i < KVO_ARRAY_LEN(once); i++)
        ck_assert_uint_eq(once[i], 1);
    ck_assert_uint_eq(k.missed, 3);
    idx_feed_free(f);

    /* allocation failures: nothing applied, or applied with events lost */
    bool lost = false;
    size_t len;
    uint8_t *b = tt_envelope(6, 0, 1, WIRE_TIER_DEVICE, 3, &len);
    for (long n = 0; n < 200; n++) {
        f = tt_feed_new();
        kvo_alloc_fail_after(n);
        kvo_status s = idx_feed_message(f, b, len, NULL, &r, NULL);
        kvo_alloc_fail_after(-1);
        ck_assert(!r.duplicate && !r.undecodable);
        if (s == KVO_OK)
            ck_assert(r.applied && r.lost == 0);
        else
            ck_assert(s == KVO_ENOMEM && (r.applied == (r.lost == 1)));
        idx_feed_counters_get(f, &k);
        ck_assert_uint_eq(k.enomem, r.lost);
        lost |= r.lost > 0;
        idx_feed_free(f);
        if (s == KVO_OK) break;
    }
    ck_assert(lost);
    kvo_free(b);
}
END_TEST

START_TEST(zmq_seq_headers_make_the_watermark) {
    idx_feed *f = tt_feed_new();
    ck_assert_int_eq(
        feed_envelope(f, 5, 0, 1, WIRE_TIER_DEVICE, 2, "10-14", NULL), KVO_OK);
    ck_assert_int_eq(
        feed_envelope(f, 5, 1, 1, WIRE_TIER_DEVICE, 2, "15-15", NULL), KVO_OK);
    const char *bad[] = {
        "x-1", "9-3", "15", "-3", "1-", "1-2-3", "99999999999999999999-1", ""};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++)
        ck_assert_int_eq(
            feed_envelope(f, 5, 2 + i, 1, WIRE_TIER_DEVICE, 1, bad[i], NULL),
            KVO_OK);
    ck_assert_int_eq(feed_envelope(f, 6, 0, 2, WIRE_TIER_DEVICE, 1, NULL, NULL),
                     KVO_OK);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.bad_headers, KVO_ARRAY_LEN(bad));
    tt_json_eq(idx_json_watermark(f, NULL),
               "{\"publishers\":[{\"publisher_id\":5,\"last_sequence\":9,"
               "\"messages\":10,\"gaps\":0,\"missed\":0,\"duplicates\":0,"
               "\"restarts\":0,\"zmq_seq_first\":10,\"zmq_seq_last\":15,"
               "\"stale\":false},"
               "{\"publisher_id\":6,\"last_sequence\":0,\"messages\":1,"
               "\"gaps\":0,\"missed\":0,\"duplicates\":0,\"restarts\":0,"
               "\"zmq_seq_first\":null,\"zmq_seq_last\":null,"
               "\"stale\":false}]}");
    idx_feed_free(f);
}
END_TEST

/* What the pause hook saw between two events of an envelope. */
typedef struct pause_log {
    idx_feed *f;
    int calls;
    uint64_t pairs[4], zmq_last[4], gen[4];
} pause_log;

static void log_pause(void *ctx) {
    pause_log *l = ctx;
    ck_assert_int_lt(l->calls, 4);
    idx_stats st;
    idx_tree_stats(idx_feed_tree(l->f), &st);
    l->pairs[l->calls] = st.pairs;
    ck_assert(idx_feed_zmq_last(l->f, 5, &l->zmq_last[l->calls]));
    l->gen[l->calls] = idx_feed_generation(l->f);
    l->calls++;
}

/* The service answers queries between two events of a long envelope: the
 * feed pauses there with the first events in the tree, a generation that
 * moved (readers' caches), and the KVO-Zmq-Seq watermark still where it
 * was, so a query waiting for the envelope's watermark is not answered
 * from half of it. */
START_TEST(a_pause_between_events_sees_the_old_watermark) {
    idx_feed *f = tt_feed_new();
    pause_log l = {.f = f};
    idx_feed_set_pause(f, log_pause, &l);
    ck_assert_int_eq(
        feed_envelope(f, 5, 0, 1, WIRE_TIER_DEVICE, 1, "10-14", NULL), KVO_OK);
    ck_assert_int_eq(l.calls, 0); /* one event: nothing between */
    wire_rblock b[3] = {{900, 9}, {901, 10}, {902, 11}};
    wire_revent ev[3];
    for (int i = 0; i < 3; i++)
        ev[i] = (wire_revent){.worker_id = 1,
                              .event_id = 10 + (uint64_t)i,
                              .type = WIRE_R_STORED,
                              .has_parent = i > 0,
                              .parent_hash = i > 0 ? b[i - 1].block_hash : 0,
                              .n_blocks = 1,
                              .blocks = &b[i]};
    size_t len;
    uint8_t *body = tt_plane(5, 1, 1700000000001ull, ev, 3, &len);
    uint64_t gen0 = idx_feed_generation(f);
    ck_assert_int_eq(idx_feed_message(f, body, len, "15-17", NULL, NULL),
                     KVO_OK);
    kvo_free(body);
    ck_assert_int_eq(l.calls, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_uint_eq(l.pairs[i], 2 + (uint64_t)i);
        ck_assert_uint_eq(l.zmq_last[i], 14);
        ck_assert_uint_gt(l.gen[i], i ? l.gen[i - 1] : gen0);
    }
    uint64_t last;
    ck_assert(idx_feed_zmq_last(f, 5, &last));
    ck_assert_uint_eq(last, 17);
    idx_stats st;
    idx_tree_stats(idx_feed_tree(f), &st);
    ck_assert_uint_eq(st.pairs, 4);
    idx_feed_free(f);
}
END_TEST

/* A restart (sequence 0 again, another body) restarts the KVO-Zmq-Seq
 * watermark too: the highest end seen before it belongs to the old run. */
START_TEST(a_restart_restarts_the_zmq_watermark) {
    idx_feed *f = tt_feed_new();
    ck_assert_int_eq(
        feed_envelope(f, 5, 0, 1, WIRE_TIER_DEVICE, 2, "10-14", NULL), KVO_OK);
    ck_assert_int_eq(
        feed_envelope(f, 5, 1, 1, WIRE_TIER_DEVICE, 2, "15-20", NULL), KVO_OK);
    idx_feed_result r;
    ck_assert_int_eq(feed_envelope(f, 5, 0, 2, WIRE_TIER_DEVICE, 1, "0-3", &r),
                     KVO_OK);
    ck_assert(r.restart);
    uint64_t last;
    ck_assert(idx_feed_zmq_last(f, 5, &last));
    ck_assert_uint_eq(last, 3);
    /* a restart without a header: no watermark until one comes */
    ck_assert_int_eq(feed_envelope(f, 5, 0, 3, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert(r.restart);
    ck_assert(!idx_feed_zmq_last(f, 5, &last));
    tt_json_eq(idx_json_watermark(f, NULL),
               "{\"publishers\":[{\"publisher_id\":5,\"last_sequence\":0,"
               "\"messages\":4,\"gaps\":0,\"missed\":0,\"duplicates\":0,"
               "\"restarts\":2,\"zmq_seq_first\":null,\"zmq_seq_last\":null,"
               "\"stale\":false}]}");
    idx_feed_free(f);
}
END_TEST

/* One spoofed (or corrupt) sequence far ahead, header and all: the next
 * genuine message goes on below it, is applied, and the sequence and the
 * watermark follow it (old code: every later message was a "duplicate"). */
START_TEST(a_bogus_jump_is_undone_by_the_next_message) {
    idx_feed *f = tt_feed_new();
    idx_tree *t = idx_feed_tree(f);
    idx_feed_result r;
    const char *hdr[] = {"0-0", "1-1", "2-2"};
    for (uint64_t i = 0; i < 3; i++)
        ck_assert_int_eq(
            feed_envelope(f, 9, i, 1, WIRE_TIER_DEVICE, 1, hdr[i], NULL),
            KVO_OK);
    const uint64_t far = 1000000000000ull;
    ck_assert_int_eq(feed_envelope(f, 9, far, 1, WIRE_TIER_DEVICE, 1,
                                   "3-18446744073709551615", &r),
                     KVO_OK);
    ck_assert_uint_eq(r.missed, far - 3);
    ck_assert_int_eq(feed_envelope(f, 9, 3, 2, WIRE_TIER_DEVICE, 1, "3-3", &r),
                     KVO_OK);
    ck_assert(r.applied && r.rewind && !r.duplicate && !r.restart);
    ck_assert_uint_eq(r.jumped_from, far);
    ck_assert_uint_eq(r.missed, 0);
    ck_assert_uint_eq(tt_blocks(t, 2, 0), 1);
    ck_assert_int_eq(feed_envelope(f, 9, 4, 3, WIRE_TIER_DEVICE, 1, "4-4", &r),
                     KVO_OK);
    ck_assert(r.applied && !r.rewind);
    ck_assert_uint_eq(r.missed, 0);
    ck_assert_uint_eq(tt_blocks(t, 3, 0), 1);
    uint64_t last;
    ck_assert(idx_feed_zmq_last(f, 9, &last));
    ck_assert_uint_eq(last, 4);
    /* duplicates stay duplicates */
    ck_assert_int_eq(feed_envelope(f, 9, 3, 2, WIRE_TIER_DEVICE, 1, "3-3", &r),
                     KVO_EEXIST);
    /* a genuine gap confirmed by the next message: an old sequence after
     * it is an old duplicate again, not a rewind */
    ck_assert_int_eq(feed_envelope(f, 9, 10, 4, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert_uint_eq(r.missed, 5);
    ck_assert_int_eq(feed_envelope(f, 9, 11, 4, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert_int_eq(feed_envelope(f, 9, 7, 5, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_EEXIST);
    ck_assert_uint_eq(tt_blocks(t, 5, 0), UINT64_MAX);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.rewinds, 1);
    ck_assert_uint_eq(k.gaps, 2);
    ck_assert_uint_eq(k.duplicates, 2);
    idx_publisher *p = publishers(f, 1);
    ck_assert_uint_eq(p[0].last_sequence, 11);
    kvo_free(p);
    idx_feed_free(f);
}
END_TEST

/* Counters saturate: a publisher first heard at 2^64-1 counts 2^64-1
 * missed, and the next gap elsewhere leaves the total there (old code
 * wrapped it to 2). Its next genuine message, at 5, is applied. */
START_TEST(counters_saturate_instead_of_wrapping) {
    idx_feed *f = tt_feed_new();
    idx_feed_result r;
    ck_assert_int_eq(
        feed_envelope(f, 1, UINT64_MAX, 1, WIRE_TIER_DEVICE, 1, NULL, &r),
        KVO_OK);
    ck_assert_uint_eq(r.missed, UINT64_MAX);
    ck_assert_int_eq(feed_envelope(f, 1, 5, 2, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert(r.applied && r.rewind);
    ck_assert_uint_eq(r.missed, 0);
    ck_assert_int_eq(feed_envelope(f, 1, 6, 2, WIRE_TIER_DEVICE, 2, NULL, &r),
                     KVO_OK);
    ck_assert(r.applied && !r.rewind);
    ck_assert_int_eq(feed_envelope(f, 2, 3, 3, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert_uint_eq(r.missed, 3);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.missed, UINT64_MAX);
    ck_assert_uint_eq(k.gaps, 2);
    ck_assert_uint_eq(k.applied, 4);
    idx_publisher *p = publishers(f, 2);
    ck_assert_uint_eq(p[0].missed, UINT64_MAX);
    ck_assert_uint_eq(p[0].last_sequence, 6);
    ck_assert_uint_eq(p[1].missed, 3);
    kvo_free(p);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), 2, 0), 2);
    idx_feed_free(f);
}
END_TEST

static idx_feed *feed_with(uint32_t max_publishers, uint64_t idle_ms) {
    idx_feed *f = NULL;
    idx_feed_cfg cfg = {.max_publishers = max_publishers,
                        .publisher_idle_ms = idle_ms};
    ck_assert_int_eq(idx_feed_new(&f, &cfg), KVO_OK);
    return f;
}

/* 5,000 publishers into a table of 100: the table stays at 100, every
 * message still applies, and the 4,900 untracked ones are counted. */
START_TEST(a_full_publisher_table_applies_untracked_and_counts) {
    idx_feed *f = feed_with(100, 0);
    idx_feed_result r;
    for (uint64_t i = 0; i < 5000; i++) {
        ck_assert_int_eq(
            feed_envelope(f, 1000 + i, 3, i, WIRE_TIER_DEVICE, 1, "1-2", &r),
            KVO_OK);
        ck_assert(r.applied);
        ck_assert(r.untracked == (i >= 100));
        ck_assert_uint_eq(r.missed, i < 100 ? 3 : 0);
    }
    /* untracked: no dedup either, the message applies again */
    ck_assert_int_eq(
        feed_envelope(f, 5999, 3, 4999, WIRE_TIER_DEVICE, 1, NULL, &r), KVO_OK);
    ck_assert(r.untracked && r.applied);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.publishers, 100);
    ck_assert_uint_eq(k.publishers_refused, 4901);
    ck_assert_uint_eq(k.applied, 5001);
    ck_assert_uint_eq(k.gaps, 100);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), 4999, 0), 1);
    idx_publisher *p = publishers(f, 100);
    ck_assert_uint_eq(p[0].publisher_id, 1000);
    ck_assert_uint_eq(p[99].publisher_id, 1099);
    kvo_free(p);
    uint64_t last;
    ck_assert(!idx_feed_zmq_last(f, 1100, &last));
    /* the watermark in pages of 30: 30, 30, 30, 10; "next" until the end */
    idx_page pg = {.limit = 30};
    uint64_t seen = 0;
    for (int page = 0; page < 4; page++) {
        json_object *w = idx_json_watermark(f, &pg);
        json_object *a = tt_json_at(w, "publishers");
        size_t len = json_object_array_length(a);
        ck_assert_uint_eq(len, page < 3 ? 30 : 10);
        for (size_t i = 0; i < len; i++)
            ck_assert_uint_eq(
                tt_json_u64(json_object_array_get_idx(a, i), "publisher_id"),
                1000 + seen++);
        json_object *next;
        ck_assert(json_object_object_get_ex(w, "next", &next) == (page < 3));
        if (page < 3)
            ck_assert_uint_eq(tt_json_u64(w, "next"), 1000 + seen - 1);
        pg.has_after = true;
        pg.after = 1000 + seen - 1;
        json_object_put(w);
    }
    /* after the last one: an empty page */
    tt_json_eq(idx_json_watermark(f, &pg), "{\"publishers\":[]}");
    idx_feed_free(f);
}
END_TEST

/* Publishers idle for publisher_idle_ms are forgotten -- their sequence
 * state, never their blocks -- and one that comes back goes on from the
 * sequence it had, without a false gap. */
START_TEST(idle_publishers_are_forgotten_not_their_blocks) {
    idx_feed *f = feed_with(2, 1000);
    idx_tree *t = idx_feed_tree(f);
    idx_feed_result r;
    idx_feed_set_clock(f, 10);
    for (uint64_t i = 0; i < 3; i++)
        ck_assert_int_eq(
            feed_envelope(f, 1, i, 1, WIRE_TIER_DEVICE, 2, NULL, NULL), KVO_OK);
    ck_assert_int_eq(feed_envelope(f, 2, 0, 2, WIRE_TIER_DEVICE, 1, NULL, NULL),
                     KVO_OK);
    idx_feed_set_clock(f, 500);
    ck_assert_int_eq(feed_envelope(f, 2, 1, 2, WIRE_TIER_DEVICE, 1, NULL, NULL),
                     KVO_OK);
    idx_feed_set_clock(f, 1009);
    ck_assert_uint_eq(idx_feed_expire(f), 0);
    idx_feed_set_clock(f, 1010);
    ck_assert_uint_eq(idx_feed_expire(f), 1); /* 1, heard at 10 */
    ck_assert_uint_eq(idx_feed_expire(f), 0);
    uint64_t last;
    ck_assert(!idx_feed_zmq_last(f, 1, &last));
    ck_assert_uint_eq(tt_blocks(t, 1, 0), 2); /* the blocks stay */
    ck_assert_int_eq(feed_envelope(f, 3, 0, 3, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert(!r.untracked);
    /* 1 comes back, full table: 2 (heard at 500) makes room; 1 goes on */
    idx_feed_set_clock(f, 1600);
    ck_assert_int_eq(feed_envelope(f, 1, 3, 1, WIRE_TIER_DEVICE, 3, "7-7", &r),
                     KVO_OK);
    ck_assert(r.applied && !r.untracked && !r.restart);
    ck_assert_uint_eq(r.expired, 1);
    ck_assert_uint_eq(r.missed, 0);
    ck_assert_int_eq(feed_envelope(f, 1, 2, 1, WIRE_TIER_DEVICE, 2, NULL, &r),
                     KVO_EEXIST); /* old: a duplicate, as before */
    /* full, nobody idle (1 at 1600, 3 at 1010): untracked */
    ck_assert_int_eq(feed_envelope(f, 4, 0, 4, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert(r.untracked && r.applied);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.publishers_expired, 2);
    ck_assert_uint_eq(k.publishers_refused, 1);
    ck_assert_uint_eq(k.publishers, 2);
    ck_assert_uint_eq(k.gaps, 0);
    tt_json_eq(idx_json_watermark(f, NULL),
               "{\"publishers\":[{\"publisher_id\":1,\"last_sequence\":3,"
               "\"messages\":1,\"gaps\":0,\"missed\":0,\"duplicates\":1,"
               "\"restarts\":0,\"zmq_seq_first\":7,\"zmq_seq_last\":7,"
               "\"stale\":false},"
               "{\"publisher_id\":3,\"last_sequence\":0,\"messages\":1,"
               "\"gaps\":0,\"missed\":0,\"duplicates\":0,\"restarts\":0,"
               "\"zmq_seq_first\":null,\"zmq_seq_last\":null,"
               "\"stale\":false}]}");
    idx_feed_free(f);

    /* the memory of the forgotten is bounded too (max_publishers of them):
     * with room for one, the oldest forgotten is forgotten whole */
    f = feed_with(1, 10);
    for (uint64_t p = 1; p <= 3; p++) {
        idx_feed_set_clock(f, 20 * p);
        ck_assert_int_eq(
            feed_envelope(f, p, 0, p, WIRE_TIER_DEVICE, 1, NULL, &r), KVO_OK);
    }
    idx_feed_set_clock(f, 80);
    /* 2 is still remembered (sequence 0): no gap; 1 is not: first heard */
    ck_assert_int_eq(feed_envelope(f, 2, 1, 2, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert_uint_eq(r.missed, 0);
    idx_feed_set_clock(f, 100);
    ck_assert_int_eq(feed_envelope(f, 1, 1, 1, WIRE_TIER_DEVICE, 1, NULL, &r),
                     KVO_OK);
    ck_assert_uint_eq(r.missed, 1);
    idx_feed_free(f);
}
END_TEST

/* Request bodies: one strict reading (kvo_json) for every endpoint and for
 * replay; errors name where. Each of these was accepted (json-c clamped
 * 2^64 and 20-digit numbers, took 01, passed invalid UTF-8) or refused
 * without a place before. */
START_TEST(request_bodies_are_read_strictly) {
    static const struct {
        const char *body;
        unsigned accept;
        const char *why; /* NULL: accepted */
    } cases[] = {
        {"{\"tokens_hashes\":[18446744073709551615]}", IDX_REQ_HASHES, NULL},
        {"{\"tokens_hashes\":[18446744073709551616]}", IDX_REQ_HASHES,
         "bad JSON at tokens_hashes[0]: integer out of range"},
        {"{ \"tokens_hashes\" : [1, 2, 99999999999999999999] }", IDX_REQ_HASHES,
         "bad JSON at tokens_hashes[2]: integer out of range"},
        {"{\"tokens_hashes\":[1,01]}", IDX_REQ_HASHES,
         "bad JSON at tokens_hashes[1]: a number has a leading zero"},
        {"{\"tokens_hashes\":[1]} x", IDX_REQ_HASHES,
         "bad JSON: trailing characters after the JSON value"},
        {"{\"tokens_hashes\":[1]}{}", IDX_REQ_HASHES, "trailing characters"},
        {"{\"tokens_hashes\":[1]}\n\t ", IDX_REQ_HASHES, NULL},
        {"{\"token_ids\":[1],\"lora_name\":\"\xff\"}", IDX_REQ_TOKENS,
         "bad JSON at lora_name: invalid UTF-8"},
        {"{\"token_ids\":[1],\"cache_salt\":\"\xed\xa0\x80\"}", IDX_REQ_TOKENS,
         "bad JSON at cache_salt: invalid UTF-8"},
        {"{\"token_ids\":[1],\"lora_name\":\"\\u0000\"}", IDX_REQ_TOKENS,
         "lora_name"},
        {"{\"tokens_hashes\":[1],\"tokens_hashes\":[2]}", IDX_REQ_HASHES,
         "duplicate key"},
        {"{\"tokens_hashes\":[1],\"wait\":{\"zmq_seq\":[[1,"
         "18446744073709551616]]}}",
         IDX_REQ_HASHES,
         "bad JSON at wait.zmq_seq[0][1]: integer out of range"},
        {"{\"tokens_hashes\":[1],\"wait\":{\"zmq_seq\":[[1]]}}", IDX_REQ_HASHES,
         "wait.zmq_seq[0] must be"},
        {"{\"tokens_hashes\":[1],\"wait\":{\"zmq_seq\":[],\"timeout_ms\":"
         "600001}}",
         IDX_REQ_HASHES, "wait.timeout_ms must be 0..600000"},
        {"{\"tokens_hashes\":[1],\"wait\":null}", IDX_REQ_HASHES,
         "wait must be"},
        {"{\"tokens_hashes\":[1],\"metrics\":1}", IDX_REQ_HASHES,
         "metrics: expected true or false"},
        {"{\"tokens_hashes\":[1,-1]}", IDX_REQ_HASHES,
         "tokens_hashes[1]: expected an integer >= 0"},
        {"{\"token_ids\":[4294967296]}", IDX_REQ_TOKENS,
         "token_ids[0]: expected an integer in 0..4294967295"},
        {"{\"tokens_hashes\":[1", IDX_REQ_HASHES, "bad JSON at tokens_hashes:"},
        {"", IDX_REQ_HASHES, "empty body"},
        {"{\"apply\":-1}", IDX_REQ_APPLY, "apply: expected a count"},
        {"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
         "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
         IDX_REQ_HASHES, "nesting deeper than 64"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        idx_request q;
        idx_request_init(&q);
        kvo_err err;
        kvo_status st = idx_request_parse(
            &q, cases[i].body, strlen(cases[i].body), cases[i].accept, &err);
        if (!cases[i].why)
            ck_assert_msg(st == KVO_OK, "%s: %s", cases[i].body, err.msg);
        else
            ck_assert_msg(st != KVO_OK && strstr(err.msg, cases[i].why),
                          "%s: %s (want %s)", cases[i].body,
                          st == KVO_OK ? "accepted" : err.msg, cases[i].why);
        idx_request_fini(&q);
    }
    /* a NUL inside the body is not its end */
    idx_request q;
    idx_request_init(&q);
    ck_assert_int_eq(idx_request_parse(&q, "{\"tokens_hashes\":[1]}\0x", 23,
                                       IDX_REQ_HASHES, NULL),
                     KVO_EPROTO);
    /* what a request holds, pointing into its tree */
    const char *body =
        "{\"token_ids\":[1,2,3],\"lora_name\":\"l\",\"metrics\":true,"
        "\"wait\":{\"zmq_seq\":[[7,8],[9,10]]}}";
    ck_assert_int_eq(
        idx_request_parse(&q, body, strlen(body), IDX_REQ_TOKENS, NULL),
        KVO_OK);
    ck_assert_int_eq(q.kind, IDX_REQ_TOKENS);
    ck_assert_uint_eq(q.n, 3);
    ck_assert_uint_eq(q.v[2], 3);
    ck_assert_str_eq(q.lora, "l");
    ck_assert_ptr_null(q.salt);
    ck_assert(q.metrics && q.wait);
    ck_assert_uint_eq(q.timeout_ms, IDX_WAIT_DEFAULT_MS);
    ck_assert_uint_eq(q.n_pairs, 2);
    ck_assert_uint_eq(q.pairs[3], 10);
    idx_request_fini(&q);
}
END_TEST

START_TEST(lower_tiers_are_counted_and_indexed) {
    idx_feed *f = tt_feed_new();
    ck_assert_int_eq(
        feed_envelope(f, 1, 0, 3, WIRE_TIER_HOST_PINNED, 2, NULL, NULL),
        KVO_OK);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.other_tier, 1);
    idx_worker *w;
    size_t n;
    ck_assert_int_eq(idx_tree_workers(idx_feed_tree(f), &w, &n), KVO_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert(w[0].worker_id == 3 && w[0].dp_rank == 0);
    ck_assert_uint_eq(w[0].blocks, 0); /* on the device tier */
    ck_assert_uint_eq(w[0].lower_blocks, 2);
    kvo_free(w);
    idx_feed_free(f);
}
END_TEST

/* A rank's lower tiers answer as "tiers": blocks through each, cumulative;
 * a rank holding only offloaded blocks answers with blocks 0. */
START_TEST(scores_json_gives_the_tiers) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store(t, 7, 0, NULL, U64S(1, 2), 2), IDX_EV_OK);
    wire_rblock b[] = {{300, 3}, {100, 1}};
    wire_revent ev = {.worker_id = 7,
                      .tier = WIRE_TIER_HOST_PINNED,
                      .type = WIRE_R_STORED,
                      .has_parent = true,
                      .parent_hash = 200,
                      .n_blocks = 1,
                      .blocks = &b[0]};
    idx_evstatus st;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    ck_assert_int_eq(st, IDX_EV_OK);
    ev = (wire_revent){.worker_id = 8,
                       .tier = WIRE_TIER_HOST_PINNED,
                       .type = WIRE_R_STORED,
                       .n_blocks = 1,
                       .blocks = &b[1]};
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, U64S(1, 2, 3, 4), 4, &s), KVO_OK);
    tt_json_eq(idx_json_scores(&s),
               "{\"isl_blocks\":4,\"scores\":["
               "{\"worker_id\":7,\"dp_rank\":0,\"blocks\":2,"
               "\"tiers\":{\"host_pinned\":3}},"
               "{\"worker_id\":8,\"dp_rank\":0,\"blocks\":0,"
               "\"tiers\":{\"host_pinned\":1}}]}");
    idx_scores_fini(&s);
    tt_tree_done(t);
}
END_TEST

START_TEST(hostile_bytes_are_counted_and_never_crash) {
    idx_feed *f = tt_feed_new();
    size_t len;
    uint8_t *b = tt_vector("mixed_dp2", &len);
    uint64_t undecodable = 0;
    for (size_t cut = 0; cut < len; cut++) {
        kvo_err err;
        kvo_status s = idx_feed_message(f, b, cut, NULL, NULL, &err);
        ck_assert_msg(s != KVO_OK, "prefix of %zu bytes applied", cut);
        undecodable++;
    }
    const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_ne(idx_feed_message(f, huge, sizeof(huge), NULL, NULL, NULL),
                     KVO_OK);
    undecodable++;
    /* flipped bytes: whatever decodes applies, the rest is counted */
    uint8_t *m = kvo_malloc(len);
    uint64_t seed = 7;
    for (int i = 0; i < 2000; i++) {
        memcpy(m, b, len);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        m[(seed >> 33) % len] ^= (uint8_t)(1u << ((seed >> 20) & 7));
        idx_feed_message(f, m, len, "1-2", NULL, NULL);
    }
    kvo_free(m);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_ge(k.undecodable, undecodable);
    ck_assert_uint_eq(k.messages, undecodable + 2000);
    tt_check(idx_feed_tree(f), false);
    kvo_free(b);
    idx_feed_free(f);
}
END_TEST

/* The request in json, parsed as a request of the kinds in accept and run
 * on t (block size 4); err gets the reason of a failure. */
static kvo_status query(idx_tree *t, const char *json, unsigned accept,
                        idx_scores *s, char *err) {
    idx_request q;
    idx_request_init(&q);
    kvo_err e;
    kvo_status st = idx_request_parse(&q, json, strlen(json), accept, &e);
    if (st == KVO_OK)
        st = idx_request_query(t, 4, &q, s);
    else
        snprintf(err, 200, "%.199s", e.msg);
    idx_request_fini(&q);
    return st;
}

#define TOK IDX_REQ_TOKENS
#define HASH IDX_REQ_HASHES
#define EITHER (IDX_REQ_TOKENS | IDX_REQ_HASHES)

START_TEST(query_json_answers_and_rejects) {
    idx_feed *f = tt_feed_of("stored_two_blocks", NULL);
    idx_tree *t = idx_feed_tree(f);
    idx_scores s;
    idx_scores_init(&s);
    char err[200];
    /* tokens [1,2,3,4] with block size 4 hash to the first block */
    ck_assert_int_eq(query(t, "{\"token_ids\": [1,2,3,4,5,6]}", TOK, &s, err),
                     KVO_OK);
    ck_assert_uint_eq(s.isl_blocks, 2);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_uint_eq(s.v[0].worker_id, 7);
    ck_assert_uint_eq(s.v[0].blocks, 1);
    ck_assert_int_eq(query(t,
                           "{\"token_ids\": [1,2,3,4], \"lora_name\": \"x\"}",
                           TOK, &s, err),
                     KVO_OK);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_int_eq(query(t,
                           "{\"token_ids\": [1,2,3,4], \"lora_name\": null,"
                           " \"cache_salt\": null}",
                           EITHER, &s, err),
                     KVO_OK);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_int_eq(query(t,
                           "{\"tokens_hashes\": [14643705804678351452, "
                           "16777012769546811212, 5]}",
                           HASH, &s, err),
                     KVO_OK);
    ck_assert_uint_eq(s.isl_blocks, 3);
    ck_assert_uint_eq(s.v[0].blocks, 2);
    tt_json_eq(idx_json_scores(&s),
               "{\"isl_blocks\":3,\"scores\":[{\"worker_id\":7,"
               "\"dp_rank\":0,\"blocks\":2}]}");
    const char *bad[][2] = {
        {"[1,2]", "expected a JSON object"},
        {"{}", "missing token_ids"},
        {"{\"token_ids\": [1, -2]}", "token_ids[1]"},
        {"{\"token_ids\": [1, 2.5]}", "token_ids[1]"},
        {"{\"token_ids\": [4294967296]}", "token_ids[0]"},
        {"{\"token_ids\": 5}", "token_ids: expected an array"},
        {"{\"token_ids\": [1], \"lora_name\": 3}", "lora_name"},
        {"{\"token_ids\": [1], \"cache_salt\": []}", "cache_salt"},
        {"{\"tokens_hashes\": [1]}", "missing token_ids"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        ck_assert_int_eq(query(t, bad[i][0], TOK, &s, err), KVO_EPROTO);
        ck_assert_msg(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    ck_assert_int_eq(query(t, "{\"tokens_hashes\": [-1]}", HASH, &s, err),
                     KVO_EPROTO);
    ck_assert_int_eq(query(t, "{\"tokens_hashes\": [\"1\"]}", HASH, &s, err),
                     KVO_EPROTO);
    ck_assert_int_eq(query(t, "{\"tokens_hashes\": [1], \"token_ids\": [1]}",
                           EITHER, &s, err),
                     KVO_EPROTO);
    idx_scores_fini(&s);
    idx_feed_free(f);
}
END_TEST

START_TEST(json_shapes_of_counters_workers_and_events) {
    idx_feed *f = tt_feed_of("stored_two_blocks", "mixed_dp2", NULL);
    json_object *c = idx_json_counters(f);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(tt_json_u64(c, "events.stored.ok"), 3);
    ck_assert_uint_eq(tt_json_u64(c, "events.stored.parent_not_found"), 0);
    ck_assert_uint_eq(tt_json_u64(c, "gaps"), 1);
    ck_assert_uint_eq(tt_json_u64(c, "pairs"), 2);
    json_object_put(c);
    tt_json_eq(idx_json_workers(idx_feed_tree(f)),
               "[{\"worker_id\":7,\"dp_rank\":0,\"blocks\":2},"
               "{\"worker_id\":9,\"dp_rank\":2,\"blocks\":0}]");
    wire_rblock b = {18446744073709551615ull, 1};
    wire_revent e = {.worker_id = 3,
                     .dp_rank = 1,
                     .event_id = 4,
                     .type = WIRE_R_STORED,
                     .has_parent = true,
                     .parent_hash = 9,
                     .n_blocks = 1,
                     .blocks = &b};
    tt_json_eq(idx_json_revent(&e),
               "{\"worker_id\":3,\"storage_tier\":\"device\",\"event\":"
               "{\"event_id\":4,\"data\":{\"stored\":{\"parent_hash\":9,"
               "\"start_position\":null,\"blocks\":[{\"block_hash\":"
               "18446744073709551615,\"tokens_hash\":1,\"mm_extra_info\":"
               "null}]}},\"dp_rank\":1}}");
    idx_feed_free(f);
}
END_TEST

Suite *suite_feed(void) {
    Suite *s = suite_create("feed");
    TCase *tc = tcase_create("feed");
    tcase_add_test(tc, shared_vectors_apply_in_order);
    tcase_add_test(tc, duplicates_are_dropped_gaps_and_restarts_counted);
    tcase_add_test(tc, message_result_says_what_happened);
    tcase_add_test(tc, zmq_seq_headers_make_the_watermark);
    tcase_add_test(tc, a_pause_between_events_sees_the_old_watermark);
    tcase_add_test(tc, a_restart_restarts_the_zmq_watermark);
    tcase_add_test(tc, a_bogus_jump_is_undone_by_the_next_message);
    tcase_add_test(tc, counters_saturate_instead_of_wrapping);
    tcase_add_test(tc, a_full_publisher_table_applies_untracked_and_counts);
    tcase_add_test(tc, idle_publishers_are_forgotten_not_their_blocks);
    tcase_add_test(tc, request_bodies_are_read_strictly);
    tcase_add_test(tc, lower_tiers_are_counted_and_indexed);
    tcase_add_test(tc, scores_json_gives_the_tiers);
    tcase_add_test(tc, hostile_bytes_are_counted_and_never_crash);
    tcase_add_test(tc, query_json_answers_and_rejects);
    tcase_add_test(tc, json_shapes_of_counters_workers_and_events);
    suite_add_tcase(s, tc);
    return s;
}
