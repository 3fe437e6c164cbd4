/* test_feed: event-plane messages into the tree -- the shared vectors,
 * publisher dedup, gaps, restarts, KVO-Zmq-Seq watermarks, tiers, hostile
 * bytes -- and the JSON shapes and query parsing the service and replay
 * share. */
#include "idx_test.h"

#include <stdlib.h>
#include <string.h>

static uint8_t *vector(const char *name, size_t *len) {
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/vectors/event_plane/%s.bin", name);
    char *path = kt_src_path(rel);
    uint8_t *b = kt_read_file(path, len);
    kvo_free(path);
    return b;
}

static kvo_status feed_vector(idx_feed *f, const char *name, const char *hdr) {
    size_t len;
    uint8_t *b = vector(name, &len);
    kvo_err err;
    kvo_status s = idx_feed_message(f, b, len, hdr, NULL, &err);
    kvo_free(b);
    return s;
}

/* An envelope around one stored RouterEvent of n blocks (tokens_hash i+1,
 * block_hash 100 (i+1)), encoded with the codec. */
static uint8_t *envelope(uint64_t pub, uint64_t seq, uint64_t worker,
                         wire_tier tier, uint32_t n, size_t *len) {
    wire_rblock b[8];
    for (uint32_t i = 0; i < n; i++) b[i] = (wire_rblock){100 * (i + 1), i + 1};
    wire_revent ev = {.worker_id = worker, .tier = tier, .event_id = seq + 1,
                      .type = WIRE_R_STORED, .n_blocks = n, .blocks = b};
    wire_plane_msg m;
    wire_plane_init(&m);
    m.publisher_id = pub;
    m.sequence = seq;
    m.published_at = 1700000000000ull + seq;
    m.topic = (wire_str){"kv-events", 9};
    m.n_events = 1;
    m.events = &ev;
    kvo_buf out;
    kvo_buf_init(&out);
    ck_assert_int_eq(wire_plane_encode(&m, &out), KVO_OK);
    m.events = NULL;
    m.n_events = 0;
    wire_plane_fini(&m);
    *len = out.len;
    return out.data;
}

static idx_feed *feed_new(void) {
    idx_feed *f = NULL;
    ck_assert_int_eq(idx_feed_new(&f), KVO_OK);
    return f;
}

START_TEST(shared_vectors_apply_in_order) {
    idx_feed *f = feed_new();
    idx_tree *t = idx_feed_tree(f);
    ck_assert_int_eq(feed_vector(f, "stored_two_blocks", NULL), KVO_OK);
    ck_assert_uint_eq(tt_blocks(t, 7, 0), 2);
    /* tokens [1,2,3,4] hash to the vector's first tokens_hash */
    uint64_t q[] = {14643705804678351452ull, 16777012769546811212ull};
    ck_assert_uint_eq(tt_score(t, q, 2, 7, 0), 2);
    ck_assert_int_eq(feed_vector(f, "removed_one", NULL), KVO_OK);
    ck_assert_uint_eq(tt_score(t, q, 2, 7, 0), 1);
    ck_assert_int_eq(feed_vector(f, "cleared", NULL), KVO_OK);
    ck_assert_uint_eq(tt_blocks(t, 7, 0), 0);
    ck_assert_int_eq(feed_vector(f, "mixed_dp2", NULL), KVO_OK);
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
    idx_feed *g = feed_new();
    ck_assert_int_eq(feed_vector(g, "legacy_single_event", NULL), KVO_OK);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(g), 7, 0), 2);
    idx_feed_free(g);
    tt_check(t, true);
    idx_feed_free(f);
}
END_TEST

START_TEST(duplicates_are_dropped_gaps_and_restarts_counted) {
    idx_feed *f = feed_new();
    ck_assert_int_eq(feed_vector(f, "stored_two_blocks", NULL), KVO_OK);
    ck_assert_int_eq(feed_vector(f, "removed_one", NULL), KVO_OK);
    /* the same (publisher, sequence, body) again: dropped */
    ck_assert_int_eq(feed_vector(f, "removed_one", NULL), KVO_EEXIST);
    ck_assert_int_eq(feed_vector(f, "stored_two_blocks", NULL), KVO_EEXIST);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), 7, 0), 1);
    /* sequence 2 is skipped */
    ck_assert_int_eq(feed_vector(f, "mixed_dp2", NULL), KVO_OK);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.duplicates, 2);
    ck_assert_uint_eq(k.gaps, 1);
    ck_assert_uint_eq(k.missed, 1);
    /* sequence 0 again with another body: the publisher restarted */
    ck_assert_int_eq(feed_vector(f, "legacy_single_event", NULL), KVO_OK);
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.restarts, 1);
    ck_assert_uint_eq(k.applied, 4);
    idx_publisher *p;
    size_t n;
    ck_assert_int_eq(idx_feed_publishers(f, &p, &n), KVO_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(p[0].publisher_id, 42);
    ck_assert_uint_eq(p[0].last_sequence, 0);
    ck_assert_uint_eq(p[0].messages, 4);
    ck_assert_uint_eq(p[0].duplicates, 2);
    ck_assert_uint_eq(p[0].gaps, 1);
    kvo_free(p);
    /* a publisher first heard at sequence 5 missed 0..4 */
    size_t len;
    uint8_t *b = envelope(77, 5, 1, WIRE_TIER_DEVICE, 1, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, NULL, NULL, NULL), KVO_OK);
    kvo_free(b);
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.gaps, 2);
    ck_assert_uint_eq(k.missed, 6);
    idx_feed_free(f);
}
END_TEST

/* The result names what became of each message, as the counters count
 * it: the service logs from it. */
START_TEST(message_result_says_what_happened) {
    idx_feed *f = feed_new();
    idx_feed_result r;
    size_t len;
    uint8_t *b = envelope(5, 0, 1, WIRE_TIER_DEVICE, 2, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, "1-2", &r, NULL), KVO_OK);
    ck_assert(r.applied && !r.duplicate && !r.undecodable && !r.restart &&
              !r.bad_header);
    ck_assert_uint_eq(r.publisher_id, 5);
    ck_assert_uint_eq(r.sequence, 0);
    ck_assert_uint_eq(r.missed + r.other_tier + r.lost, 0);
    ck_assert_int_eq(idx_feed_message(f, b, len, NULL, &r, NULL), KVO_EEXIST);
    ck_assert(r.duplicate && !r.applied);
    ck_assert_uint_eq(r.publisher_id, 5);
    kvo_free(b);
    /* sequence 4 after 0: 1..3 missed; and a malformed header */
    b = envelope(5, 4, 1, WIRE_TIER_DEVICE, 1, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, "x", &r, NULL), KVO_OK);
    ck_assert(r.applied && r.bad_header && !r.restart);
    ck_assert_uint_eq(r.sequence, 4);
    ck_assert_uint_eq(r.missed, 3);
    kvo_free(b);
    /* sequence 0 again with another body: a restart, applied */
    b = envelope(5, 0, 2, WIRE_TIER_DEVICE, 1, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, NULL, &r, NULL), KVO_OK);
    ck_assert(r.applied && r.restart && !r.duplicate);
    ck_assert_uint_eq(r.missed, 0);
    kvo_free(b);
    b = envelope(5, 1, 1, WIRE_TIER_HOST_PINNED, 1, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, NULL, &r, NULL), KVO_OK);
    ck_assert(r.applied);
    ck_assert_uint_eq(r.other_tier, 1);
    kvo_free(b);
    const uint8_t junk[] = {0x93, 0x01, 0x02};
    kvo_err err;
    ck_assert_int_ne(idx_feed_message(f, junk, sizeof(junk), NULL, &r, &err),
                     KVO_OK);
    ck_assert(r.undecodable && !r.applied);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.messages, 6);
    ck_assert_uint_eq(k.applied, 4);
    ck_assert_uint_eq(k.duplicates + k.restarts + k.gaps + k.bad_headers +
                          k.other_tier + k.undecodable, 6);
    ck_assert_uint_eq(k.missed, 3);
    idx_feed_free(f);

    /* allocation failures: nothing applied, or applied with events lost */
    bool lost = false;
    b = envelope(6, 0, 1, WIRE_TIER_DEVICE, 3, &len);
    for (long n = 0; n < 200; n++) {
        f = feed_new();
        kvo_alloc_fail_after(n);
        kvo_status s = idx_feed_message(f, b, len, NULL, &r, NULL);
        kvo_alloc_fail_after(-1);
        ck_assert(!r.duplicate && !r.undecodable);
        if (s == KVO_OK) ck_assert(r.applied && r.lost == 0);
        else ck_assert(s == KVO_ENOMEM && (r.applied == (r.lost == 1)));
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
    idx_feed *f = feed_new();
    size_t len;
    uint8_t *b0 = envelope(5, 0, 1, WIRE_TIER_DEVICE, 2, &len);
    ck_assert_int_eq(idx_feed_message(f, b0, len, "10-14", NULL, NULL), KVO_OK);
    kvo_free(b0);
    uint8_t *b1 = envelope(5, 1, 1, WIRE_TIER_DEVICE, 2, &len);
    ck_assert_int_eq(idx_feed_message(f, b1, len, "15-15", NULL, NULL), KVO_OK);
    kvo_free(b1);
    const char *bad[] = {"x-1", "9-3", "15", "-3", "1-", "1-2-3",
                         "99999999999999999999-1", ""};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        uint8_t *b = envelope(5, 2 + i, 1, WIRE_TIER_DEVICE, 1, &len);
        ck_assert_int_eq(idx_feed_message(f, b, len, bad[i], NULL, NULL), KVO_OK);
        kvo_free(b);
    }
    uint8_t *b2 = envelope(6, 0, 2, WIRE_TIER_DEVICE, 1, &len);
    ck_assert_int_eq(idx_feed_message(f, b2, len, NULL, NULL, NULL), KVO_OK);
    kvo_free(b2);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.bad_headers, KVO_ARRAY_LEN(bad));
    json_object *w = idx_json_watermark(f);
    ck_assert_ptr_nonnull(w);
    const char *s = json_object_to_json_string_ext(w, JSON_C_TO_STRING_PLAIN);
    ck_assert_str_eq(s,
                     "{\"publishers\":[{\"publisher_id\":5,\"last_sequence\":9,"
                     "\"messages\":10,\"gaps\":0,\"missed\":0,\"duplicates\":0,"
                     "\"restarts\":0,\"zmq_seq_first\":10,\"zmq_seq_last\":15},"
                     "{\"publisher_id\":6,\"last_sequence\":0,\"messages\":1,"
                     "\"gaps\":0,\"missed\":0,\"duplicates\":0,\"restarts\":0,"
                     "\"zmq_seq_first\":null,\"zmq_seq_last\":null}]}");
    json_object_put(w);
    idx_feed_free(f);
}
END_TEST

START_TEST(lower_tiers_are_counted_not_indexed) {
    idx_feed *f = feed_new();
    size_t len;
    uint8_t *b = envelope(1, 0, 3, WIRE_TIER_HOST_PINNED, 2, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, NULL, NULL, NULL), KVO_OK);
    kvo_free(b);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
    ck_assert_uint_eq(k.other_tier, 1);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), 3, 0), UINT64_MAX);
    idx_feed_free(f);
}
END_TEST

START_TEST(hostile_bytes_are_counted_and_never_crash) {
    idx_feed *f = feed_new();
    size_t len;
    uint8_t *b = vector("mixed_dp2", &len);
    uint64_t undecodable = 0;
    for (size_t cut = 0; cut < len; cut++) {
        kvo_err err;
        kvo_status s = idx_feed_message(f, b, cut, NULL, NULL, &err);
        ck_assert_msg(s != KVO_OK, "prefix of %zu bytes applied", cut);
        undecodable++;
    }
    const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_ne(idx_feed_message(f, huge, sizeof(huge), NULL, NULL, NULL), KVO_OK);
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

/* GET /metrics's text, every line of it (the memory gauge only by its
 * name: it follows the tree's growth policy): the names, HELP and TYPE
 * lines, labels and values kvo-check and Prometheus read. */
START_TEST(metrics_text_is_pinned_line_by_line) {
    idx_feed *f = feed_new();
    ck_assert_int_eq(feed_vector(f, "stored_two_blocks", NULL), KVO_OK);
    ck_assert_int_eq(feed_vector(f, "removed_one", NULL), KVO_OK);
    ck_assert_int_eq(feed_vector(f, "removed_one", NULL), KVO_EEXIST);
    ck_assert_int_eq(feed_vector(f, "mixed_dp2", "13-20"), KVO_OK);
    ck_assert_int_eq(feed_vector(f, "legacy_single_event", "x"), KVO_OK);
    const uint8_t junk[] = {0x93, 0x01, 0x02};
    ck_assert_int_ne(idx_feed_message(f, junk, sizeof(junk), NULL, NULL, NULL),
                     KVO_OK);
    idx_service_stats st = {.slow_consumer_drops = 3, .inbox_drops = 2,
                            .nats_disconnects = 1, .bad_requests = 4,
                            .lat_count = {1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1},
                            .lat_sum = 0.000123456};
    static const char *const want[] = {
        "# HELP kvo_indexer_events_total RouterEvents applied, by type and status.",
        "# TYPE kvo_indexer_events_total counter",
        "kvo_indexer_events_total{type=\"stored\",status=\"ok\"} 4",
        "kvo_indexer_events_total{type=\"stored\",status=\"parent_not_found\"} 0",
        "kvo_indexer_events_total{type=\"stored\",status=\"block_not_found\"} 0",
        "kvo_indexer_events_total{type=\"stored\",status=\"invalid_block\"} 0",
        "kvo_indexer_events_total{type=\"removed\",status=\"ok\"} 2",
        "kvo_indexer_events_total{type=\"removed\",status=\"parent_not_found\"} 0",
        "kvo_indexer_events_total{type=\"removed\",status=\"block_not_found\"} 0",
        "kvo_indexer_events_total{type=\"removed\",status=\"invalid_block\"} 0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"ok\"} 0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"parent_not_found\"} 0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"block_not_found\"} 0",
        "kvo_indexer_events_total{type=\"cleared\",status=\"invalid_block\"} 0",
        "# HELP kvo_indexer_blocks_total Block operations, by outcome.",
        "# TYPE kvo_indexer_blocks_total counter",
        "kvo_indexer_blocks_total{op=\"stored\"} 6",
        "kvo_indexer_blocks_total{op=\"removed\"} 3",
        "kvo_indexer_blocks_total{op=\"not_found\"} 0",
        "kvo_indexer_blocks_total{op=\"hash_mismatch\"} 0",
        "# HELP kvo_indexer_resident_blocks Blocks (tree nodes) held by at least one worker.",
        "# TYPE kvo_indexer_resident_blocks gauge",
        "kvo_indexer_resident_blocks 2",
        "# HELP kvo_indexer_tree_nodes Tree nodes, including emptied ones Dynamo's rules keep.",
        "# TYPE kvo_indexer_tree_nodes gauge",
        "kvo_indexer_tree_nodes 2",
        "# HELP kvo_indexer_pairs (block, worker) pairs: entries of the workers' lookups.",
        "# TYPE kvo_indexer_pairs gauge",
        "kvo_indexer_pairs 2",
        "# HELP kvo_indexer_workers Known (worker_id, dp_rank) pairs.",
        "# TYPE kvo_indexer_workers gauge",
        "kvo_indexer_workers 2",
        "# HELP kvo_indexer_memory_bytes Memory held by the tree.",
        "# TYPE kvo_indexer_memory_bytes gauge",
        "kvo_indexer_memory_bytes ",
        "# HELP kvo_indexer_messages_total Event-plane messages received.",
        "# TYPE kvo_indexer_messages_total counter",
        "kvo_indexer_messages_total 6",
        "# HELP kvo_indexer_messages_applied_total Messages decoded and applied.",
        "# TYPE kvo_indexer_messages_applied_total counter",
        "kvo_indexer_messages_applied_total 4",
        "# HELP kvo_indexer_duplicates_total Exact duplicates dropped.",
        "# TYPE kvo_indexer_duplicates_total counter",
        "kvo_indexer_duplicates_total 1",
        "# HELP kvo_indexer_restarts_total Publisher restarts seen.",
        "# TYPE kvo_indexer_restarts_total counter",
        "kvo_indexer_restarts_total 1",
        "# HELP kvo_indexer_gaps_total Sequence gaps.",
        "# TYPE kvo_indexer_gaps_total counter",
        "kvo_indexer_gaps_total 1",
        "# HELP kvo_indexer_missed_total Messages missed in gaps.",
        "# TYPE kvo_indexer_missed_total counter",
        "kvo_indexer_missed_total 1",
        "# HELP kvo_indexer_undecodable_total Undecodable messages.",
        "# TYPE kvo_indexer_undecodable_total counter",
        "kvo_indexer_undecodable_total 1",
        "# HELP kvo_indexer_bad_headers_total Malformed KVO-Zmq-Seq headers.",
        "# TYPE kvo_indexer_bad_headers_total counter",
        "kvo_indexer_bad_headers_total 1",
        "# HELP kvo_indexer_other_tier_total RouterEvents of non-device tiers (not indexed).",
        "# TYPE kvo_indexer_other_tier_total counter",
        "kvo_indexer_other_tier_total 0",
        "# HELP kvo_indexer_enomem_total RouterEvents lost to allocation failure.",
        "# TYPE kvo_indexer_enomem_total counter",
        "kvo_indexer_enomem_total 0",
        "# HELP kvo_indexer_slow_consumer_drops_total Messages nats.c dropped (slow consumer).",
        "# TYPE kvo_indexer_slow_consumer_drops_total counter",
        "kvo_indexer_slow_consumer_drops_total 3",
        "# HELP kvo_indexer_inbox_dropped_total Messages dropped for want of memory before the loop saw them.",
        "# TYPE kvo_indexer_inbox_dropped_total counter",
        "kvo_indexer_inbox_dropped_total 2",
        "# HELP kvo_indexer_nats_disconnects_total NATS disconnects.",
        "# TYPE kvo_indexer_nats_disconnects_total counter",
        "kvo_indexer_nats_disconnects_total 1",
        "# HELP kvo_indexer_bad_requests_total HTTP requests answered 4xx.",
        "# TYPE kvo_indexer_bad_requests_total counter",
        "kvo_indexer_bad_requests_total 4",
        "# HELP kvo_indexer_query_seconds Query latency (parse excluded, hashing included).",
        "# TYPE kvo_indexer_query_seconds histogram",
        "kvo_indexer_query_seconds_bucket{le=\"1e-06\"} 1",
        "kvo_indexer_query_seconds_bucket{le=\"2.5e-06\"} 1",
        "kvo_indexer_query_seconds_bucket{le=\"5e-06\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"1e-05\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"2.5e-05\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"5e-05\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.0001\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.00025\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.001\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.01\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"0.1\"} 3",
        "kvo_indexer_query_seconds_bucket{le=\"+Inf\"} 4",
        "kvo_indexer_query_seconds_sum 0.000123456",
        "kvo_indexer_query_seconds_count 4",
    };
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(idx_metrics_text(f, &st, &b), KVO_OK);
    ck_assert_int_eq(kvo_buf_cstr(&b), KVO_OK);
    const char *line = (const char *)b.data;
    for (size_t i = 0; i < KVO_ARRAY_LEN(want); i++) {
        const char *nl = strchr(line, '\n');
        ck_assert_msg(nl, "line %zu missing: %s", i + 1, want[i]);
        size_t len = strlen(want[i]);
        if (strcmp(want[i], "kvo_indexer_memory_bytes ") == 0)
            ck_assert_msg(strncmp(line, want[i], len) == 0 &&
                              strspn(line + len, "0123456789") ==
                                  (size_t)(nl - line) - len,
                          "line %zu: %.*s", i + 1, (int)(nl - line), line);
        else
            ck_assert_msg((size_t)(nl - line) == len &&
                              strncmp(line, want[i], len) == 0,
                          "line %zu: %.*s, want %s", i + 1, (int)(nl - line),
                          line, want[i]);
        line = nl + 1;
    }
    ck_assert_str_eq(line, "");
    kvo_buf_fini(&b);
    idx_feed_free(f);
}
END_TEST

static kvo_status query(idx_tree *t, const char *json, int want, idx_scores *s,
                        char *err) {
    json_object *j = json_tokener_parse(json);
    ck_assert_ptr_nonnull(j);
    kvo_status st = idx_query_json(t, 4, j, want, s, err, 200);
    json_object_put(j);
    return st;
}

START_TEST(query_json_answers_and_rejects) {
    idx_feed *f = feed_new();
    ck_assert_int_eq(feed_vector(f, "stored_two_blocks", NULL), KVO_OK);
    idx_tree *t = idx_feed_tree(f);
    idx_scores s;
    idx_scores_init(&s);
    char err[200];
    /* tokens [1,2,3,4] with block size 4 hash to the first block */
    ck_assert_int_eq(query(t, "{\"token_ids\": [1,2,3,4,5,6]}", 1, &s, err), KVO_OK);
    ck_assert_uint_eq(s.isl_blocks, 2);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_uint_eq(s.v[0].worker_id, 7);
    ck_assert_uint_eq(s.v[0].blocks, 1);
    ck_assert_int_eq(query(t, "{\"token_ids\": [1,2,3,4], \"lora_name\": \"x\"}",
                           1, &s, err), KVO_OK);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_int_eq(query(t, "{\"token_ids\": [1,2,3,4], \"lora_name\": null,"
                              " \"cache_salt\": null}", -1, &s, err), KVO_OK);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_int_eq(query(t, "{\"tokens_hashes\": [14643705804678351452, "
                              "16777012769546811212, 5]}", 0, &s, err), KVO_OK);
    ck_assert_uint_eq(s.isl_blocks, 3);
    ck_assert_uint_eq(s.v[0].blocks, 2);
    json_object *j = idx_json_scores(&s);
    ck_assert_str_eq(json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN),
                     "{\"isl_blocks\":3,\"scores\":[{\"worker_id\":7,"
                     "\"dp_rank\":0,\"blocks\":2}]}");
    json_object_put(j);
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
        ck_assert_int_eq(query(t, bad[i][0], 1, &s, err), KVO_EPROTO);
        ck_assert_msg(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    ck_assert_int_eq(query(t, "{\"tokens_hashes\": [-1]}", 0, &s, err), KVO_EPROTO);
    ck_assert_int_eq(query(t, "{\"tokens_hashes\": [\"1\"]}", 0, &s, err), KVO_EPROTO);
    ck_assert_int_eq(query(t, "{\"tokens_hashes\": [1], \"token_ids\": [1]}", -1, &s, err),
                     KVO_EPROTO);
    idx_scores_fini(&s);
    idx_feed_free(f);
}
END_TEST

START_TEST(json_shapes_of_counters_workers_and_events) {
    idx_feed *f = feed_new();
    ck_assert_int_eq(feed_vector(f, "stored_two_blocks", NULL), KVO_OK);
    ck_assert_int_eq(feed_vector(f, "mixed_dp2", NULL), KVO_OK);
    json_object *c = idx_json_counters(f);
    ck_assert_ptr_nonnull(c);
    json_object *ev, *st, *v;
    ck_assert(json_object_object_get_ex(c, "events", &ev));
    ck_assert(json_object_object_get_ex(ev, "stored", &st));
    ck_assert(json_object_object_get_ex(st, "ok", &v));
    ck_assert_uint_eq(json_object_get_uint64(v), 3);
    ck_assert(json_object_object_get_ex(st, "parent_not_found", &v));
    ck_assert(json_object_object_get_ex(c, "gaps", &v));
    ck_assert_uint_eq(json_object_get_uint64(v), 1);
    ck_assert(json_object_object_get_ex(c, "pairs", &v));
    ck_assert_uint_eq(json_object_get_uint64(v), 2);
    json_object_put(c);
    json_object *w = idx_json_workers(idx_feed_tree(f));
    ck_assert_str_eq(json_object_to_json_string_ext(w, JSON_C_TO_STRING_PLAIN),
                     "[{\"worker_id\":7,\"dp_rank\":0,\"blocks\":2},"
                     "{\"worker_id\":9,\"dp_rank\":2,\"blocks\":0}]");
    json_object_put(w);
    wire_rblock b = {18446744073709551615ull, 1};
    wire_revent e = {.worker_id = 3, .dp_rank = 1, .event_id = 4,
                     .type = WIRE_R_STORED, .has_parent = true,
                     .parent_hash = 9, .n_blocks = 1, .blocks = &b};
    json_object *j = idx_json_revent(&e);
    ck_assert_str_eq(json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN),
                     "{\"worker_id\":3,\"storage_tier\":\"device\",\"event\":"
                     "{\"event_id\":4,\"data\":{\"stored\":{\"parent_hash\":9,"
                     "\"start_position\":null,\"blocks\":[{\"block_hash\":"
                     "18446744073709551615,\"tokens_hash\":1,\"mm_extra_info\":"
                     "null}]}},\"dp_rank\":1}}");
    json_object_put(j);
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
    tcase_add_test(tc, lower_tiers_are_counted_not_indexed);
    tcase_add_test(tc, hostile_bytes_are_counted_and_never_crash);
    tcase_add_test(tc, query_json_answers_and_rejects);
    tcase_add_test(tc, json_shapes_of_counters_workers_and_events);
    tcase_add_test(tc, metrics_text_is_pinned_line_by_line);
    suite_add_tcase(s, tc);
    return s;
}
