/* The recovery extension's subjects and control messages
 * (docs/recovery.md): round trips, the exact text, and refusals. */
#include "kt.h"
#include "kvo_json.h"
#include "wire.h"

#include <string.h>

Suite *suite_recovery(void);

static kvo_json doc;
static kvo_buf buf;
static kvo_err err;

static void setup(void) {
    kvo_json_init(&doc);
    kvo_buf_init(&buf);
}

static void teardown(void) {
    kvo_json_fini(&doc);
    kvo_buf_fini(&buf);
}

START_TEST(subjects_are_built_under_the_event_plane_prefix) {
    char s[128];
    ck_assert_int_eq(
        wire_subject(s, sizeof(s), "dynamo", "backend", WIRE_SUBJ_EVENTS, 0),
        KVO_OK);
    ck_assert_str_eq(s, "namespace.dynamo.component.backend.kv-events");
    ck_assert_int_eq(wire_subject(s, sizeof(s), "ns", "c", WIRE_SUBJ_RELAYS, 0),
                     KVO_OK);
    ck_assert_str_eq(s, "namespace.ns.component.c.kv-relays");
    ck_assert_int_eq(
        wire_subject(s, sizeof(s), "ns", "c", WIRE_SUBJ_DISCOVER, 0), KVO_OK);
    ck_assert_str_eq(s, "namespace.ns.component.c.kv-relays.discover");
    ck_assert_int_eq(wire_subject(s, sizeof(s), "ns", "c", WIRE_SUBJ_RECOVERY,
                                  18446744073709551615ull),
                     KVO_OK);
    ck_assert_str_eq(
        s, "namespace.ns.component.c.kv-recovery.18446744073709551615");
    ck_assert_int_eq(wire_subject(s, 20, "ns", "c", WIRE_SUBJ_EVENTS, 0),
                     KVO_ETOOBIG);
    static const char *const bad[] = {"", "a.b", "a*", ">", "a b"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++)
        ck_assert_int_eq(
            wire_subject(s, sizeof(s), bad[i], "c", WIRE_SUBJ_EVENTS, 0),
            KVO_EINVAL);
}
END_TEST

START_TEST(announce_round_trips_and_reads_as_documented) {
    const uint64_t ranks[] = {0, 1, 4294967295ull};
    wire_announce a = {.publisher_id = 7,
                       .worker_id = 3,
                       .n_ranks = 3,
                       .ranks = ranks,
                       .recovery_subject =
                           "namespace.dynamo.component.backend.kv-recovery.7",
                       .has_last = true,
                       .last_sequence = 1234,
                       .started_at_ms = 1764619200000ull,
                       .heartbeat_ms = 1000};
    ck_assert_int_eq(wire_announce_encode(&a, &buf), KVO_OK);
    ck_assert_int_eq(kvo_buf_cstr(&buf), KVO_OK);
    ck_assert_str_eq((char *)buf.data,
                     "{\"publisher_id\":7,\"worker_id\":3,\"dp_ranks\":[0,1,"
                     "4294967295],\"recovery_subject\":\"namespace.dynamo."
                     "component.backend.kv-recovery.7\",\"last_sequence\":1234,"
                     "\"started_at\":1764619200000,\"heartbeat_ms\":1000}");
    wire_announce b;
    ck_assert_int_eq(wire_announce_decode(&doc, buf.data, buf.len, &b, &err),
                     KVO_OK);
    ck_assert_uint_eq(b.publisher_id, 7);
    ck_assert_uint_eq(b.worker_id, 3);
    ck_assert_uint_eq(b.n_ranks, 3);
    ck_assert_uint_eq(b.ranks[2], 4294967295ull);
    ck_assert_str_eq(b.recovery_subject, a.recovery_subject);
    ck_assert(b.has_last && b.last_sequence == 1234);
    ck_assert_uint_eq(b.started_at_ms, 1764619200000ull);
    ck_assert_uint_eq(b.heartbeat_ms, 1000);
    /* before the first envelope; unknown keys ignored */
    const char *fresh = "{\"publisher_id\":1,\"worker_id\":2,\"dp_ranks\":[],"
                        "\"recovery_subject\":\"x\",\"last_sequence\":null,"
                        "\"started_at\":5,\"heartbeat_ms\":10,\"later\":[1]}";
    ck_assert_int_eq(wire_announce_decode(&doc, fresh, strlen(fresh), &b, &err),
                     KVO_OK);
    ck_assert(!b.has_last);
    ck_assert_uint_eq(b.n_ranks, 0);
}
END_TEST

START_TEST(bad_announces_name_the_field) {
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"[]", "expected a JSON object"},
        {"{\"worker_id\":2}", "\"publisher_id\""},
        {"{\"publisher_id\":-1,\"worker_id\":2}", "\"publisher_id\""},
        {"{\"publisher_id\":1,\"worker_id\":2,\"last_sequence\":\"x\","
         "\"started_at\":5,\"heartbeat_ms\":10}",
         "\"last_sequence\""},
        {"{\"publisher_id\":1,\"worker_id\":2,\"started_at\":5,"
         "\"heartbeat_ms\":10,\"dp_ranks\":[4294967296],"
         "\"recovery_subject\":\"x\"}",
         "\"dp_ranks\""},
        {"{\"publisher_id\":1,\"worker_id\":2,\"started_at\":5,"
         "\"heartbeat_ms\":10,\"dp_ranks\":[0]}",
         "\"recovery_subject\""},
        {"{\"publisher_id\":1} x", "trailing"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        wire_announce a;
        ck_assert_int_ne(wire_announce_decode(&doc, cases[i].body,
                                              strlen(cases[i].body), &a, &err),
                         KVO_OK);
        ck_assert_msg(strstr(err.msg, cases[i].want), "case %zu: %s", i,
                      err.msg);
    }
}
END_TEST

START_TEST(requests_and_ends_round_trip) {
    wire_recovery_req r = {.from_sequence = 99}, q;
    ck_assert_int_eq(wire_recovery_req_encode(&r, &buf), KVO_OK);
    ck_assert_int_eq(
        wire_recovery_req_decode(&doc, buf.data, buf.len, &q, &err), KVO_OK);
    ck_assert(!q.dump && q.from_sequence == 99);
    kvo_buf_reset(&buf);
    r = (wire_recovery_req){.dump = true};
    ck_assert_int_eq(wire_recovery_req_encode(&r, &buf), KVO_OK);
    ck_assert_int_eq(
        wire_recovery_req_decode(&doc, buf.data, buf.len, &q, &err), KVO_OK);
    ck_assert(q.dump);
    ck_assert_int_eq(wire_recovery_req_decode(&doc, "{}", 2, &q, &err),
                     KVO_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "from_sequence"));

    wire_reply_end e = {.kind = WIRE_REPLY_DUMP,
                        .sent = 3,
                        .has_as_of = true,
                        .as_of = 41,
                        .blocks = 1000},
                   f;
    kvo_buf_reset(&buf);
    ck_assert_int_eq(wire_reply_end_encode(WIRE_REPLY_END, &e, &buf), KVO_OK);
    ck_assert_int_eq(wire_reply_end_decode(&doc, WIRE_REPLY_END, buf.data,
                                           buf.len, &f, &err),
                     KVO_OK);
    ck_assert(f.kind == WIRE_REPLY_DUMP && f.sent == 3 && f.has_as_of &&
              f.as_of == 41 && f.blocks == 1000);
    kvo_buf_reset(&buf);
    e = (wire_reply_end){.has_as_of = false};
    ck_assert_int_eq(wire_reply_end_encode(WIRE_REPLY_TOO_NEW, &e, &buf),
                     KVO_OK);
    ck_assert_int_eq(kvo_buf_cstr(&buf), KVO_OK);
    ck_assert_str_eq((char *)buf.data, "{\"last_sequence\":null}");
    ck_assert_int_eq(wire_reply_end_decode(&doc, WIRE_REPLY_TOO_NEW, buf.data,
                                           buf.len, &f, &err),
                     KVO_OK);
    ck_assert(!f.has_as_of);
    const char *odd = "{\"kind\":\"end\",\"sent\":1}";
    ck_assert_int_eq(
        wire_reply_end_decode(&doc, WIRE_REPLY_END, odd, strlen(odd), &f, &err),
        KVO_EPROTO);
    wire_reply_kind k;
    ck_assert_int_eq(wire_reply_kind_parse("too_new", &k), KVO_OK);
    ck_assert_int_eq(k, WIRE_REPLY_TOO_NEW);
    ck_assert_int_eq(wire_reply_kind_parse("Dump", &k), KVO_EPROTO);
    ck_assert_int_eq(wire_reply_kind_parse(NULL, &k), KVO_EPROTO);
}
END_TEST

Suite *suite_recovery(void) {
    Suite *s = suite_create("recovery");
    TCase *tc = tcase_create("messages");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, subjects_are_built_under_the_event_plane_prefix);
    tcase_add_test(tc, announce_round_trips_and_reads_as_documented);
    tcase_add_test(tc, bad_announces_name_the_field);
    tcase_add_test(tc, requests_and_ends_round_trip);
    suite_add_tcase(s, tc);
    return s;
}
