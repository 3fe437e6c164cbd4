/* Event plane (DESIGN §6): every shared vector decodes to its JSON and
 * re-encodes to the same bytes; the single-RouterEvent payload; hostile
 * input (every strict prefix, huge declared lengths, wrong types, missing
 * and duplicate keys); tiers; no allocation in steady state. */
#include "kt.h"
#include "wire.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

Suite *suite_plane(void);

/* ---- helpers --------------------------------------------------------------*/

static uint8_t *vector_bytes(json_object *c, size_t *len) {
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/vectors/event_plane/%s",
             json_object_get_string(json_object_object_get(c, "file")));
    char *path = kt_src_path(rel);
    uint8_t *b = kt_read_file(path, len);
    free(path);
    return b;
}

static void assert_json_eq(json_object *got, json_object *want,
                           const char *what) {
    ck_assert_msg(json_object_equal(got, want), "%s:\n got %s\nwant %s", what,
                  json_object_to_json_string(got),
                  json_object_to_json_string(want));
}

static kvo_status decode(const uint8_t *b, size_t n, wire_plane_msg *m,
                         kvo_err *err) {
    memset(err, 0, sizeof(*err));
    return wire_plane_decode(b, n, NULL, m, err);
}

/* msgpack-c packer into an sbuffer, for hand-made hostile messages. */
typedef struct mk {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mk;

static void mk_init(mk *k) {
    msgpack_sbuffer_init(&k->sb);
    msgpack_packer_init(&k->pk, &k->sb, msgpack_sbuffer_write);
}

static void mk_str(mk *k, const char *s) {
    msgpack_pack_str(&k->pk, strlen(s));
    msgpack_pack_str_body(&k->pk, s, strlen(s));
}

/* Envelope {publisher_id 1, sequence 2, published_at 3, topic, payload}
 * around arbitrary payload bytes, plus `extra` unknown keys first. */
static void mk_envelope(mk *k, const void *payload, size_t plen, int extra) {
    mk_init(k);
    msgpack_pack_map(&k->pk, 5 + (uint32_t)extra);
    for (int i = 0; i < extra; i++) {
        mk_str(k, i ? "zzz_future" : "trace_id");
        msgpack_pack_array(&k->pk, 2);
        msgpack_pack_int(&k->pk, -1);
        msgpack_pack_str(&k->pk, 1);
        msgpack_pack_str_body(&k->pk, "x", 1);
    }
    mk_str(k, "publisher_id");
    msgpack_pack_uint64(&k->pk, 1);
    mk_str(k, "sequence");
    msgpack_pack_uint64(&k->pk, 2);
    mk_str(k, "published_at");
    msgpack_pack_uint64(&k->pk, 3);
    mk_str(k, "topic");
    mk_str(k, "kv-events");
    mk_str(k, "payload");
    msgpack_pack_bin(&k->pk, plen);
    msgpack_pack_bin_body(&k->pk, payload, plen);
}

/* One RouterEvent as a payload array, "data" given as raw msgpack bytes,
 * with optional overrides. */
static void mk_one_event(mk *k, const char *tier, const void *data, size_t dlen,
                         int64_t worker, uint64_t dp_rank) {
    mk_init(k);
    msgpack_pack_array(&k->pk, 1);
    msgpack_pack_map(&k->pk, 3);
    mk_str(k, "worker_id");
    msgpack_pack_int64(&k->pk, worker);
    mk_str(k, "storage_tier");
    mk_str(k, tier);
    mk_str(k, "event");
    msgpack_pack_map(&k->pk, 3);
    mk_str(k, "event_id");
    msgpack_pack_uint64(&k->pk, 1);
    mk_str(k, "data");
    msgpack_sbuffer_write(&k->sb, data, dlen);
    mk_str(k, "dp_rank");
    msgpack_pack_uint64(&k->pk, dp_rank);
}

static kvo_status decode_event(const char *tier, const char *data_hex,
                               int64_t worker, uint64_t dp_rank,
                               wire_plane_msg *m, kvo_err *err) {
    size_t dlen;
    uint8_t *data = kt_unhex(data_hex, &dlen);
    mk p, e;
    mk_one_event(&p, tier, data, dlen, worker, dp_rank);
    mk_envelope(&e, p.sb.data, p.sb.size, 0);
    kvo_status st = decode((uint8_t *)e.sb.data, e.sb.size, m, err);
    msgpack_sbuffer_destroy(&p.sb);
    msgpack_sbuffer_destroy(&e.sb);
    free(data);
    return st;
}

/* "cleared" */
#define DATA_CLEARED "a7636c6561726564"

/* ---- vectors -------------------------------------------------------------*/

START_TEST(every_vector_decodes_to_its_json_and_reencodes_identically) {
    json_object *root =
        kt_load_json("tests/data/vectors/event_plane/vectors.json");
    json_object *cases = json_object_object_get(root, "cases");
    size_t nc = json_object_array_length(cases);
    ck_assert_uint_ge(nc, 5);
    wire_plane_msg m;
    wire_plane_init(&m);
    kvo_buf out;
    kvo_buf_init(&out);
    for (size_t i = 0; i < nc; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        const char *name =
            json_object_get_string(json_object_object_get(c, "name"));
        size_t len, hlen;
        uint8_t *bin = vector_bytes(c, &len);
        uint8_t *hex = kt_unhex(
            json_object_get_string(json_object_object_get(c, "hex")), &hlen);
        ck_assert_msg(hlen == len && memcmp(hex, bin, len) == 0,
                      "%s: .bin and hex differ", name);

        kvo_err err;
        kvo_status st = decode(bin, len, &m, &err);
        char eb[256];
        ck_assert_msg(st == KVO_OK, "%s: %s", name,
                      kvo_err_str(&err, eb, sizeof(eb)));
        ck_assert_int_eq(m.single_form,
                         json_object_object_get(c, "payload_form") != NULL);
        ck_assert_uint_eq(m.topic.len, 9);
        ck_assert(memcmp(m.topic.p, "kv-events", 9) == 0);

        json_object *j;
        ck_assert(wire_plane_to_json(&m, &j) == KVO_OK);
        const char *scalars[] = {"publisher_id", "sequence", "published_at",
                                 "router_events"};
        for (size_t k = 0; k < KVO_ARRAY_LEN(scalars); k++) {
            char what[128];
            snprintf(what, sizeof(what), "%s.%s", name, scalars[k]);
            assert_json_eq(json_object_object_get(j, scalars[k]),
                           json_object_object_get(c, scalars[k]), what);
        }
        json_object_put(j);

        kvo_buf_reset(&out);
        ck_assert(wire_plane_encode(&m, &out) == KVO_OK);
        ck_assert_msg(out.len == len && memcmp(out.data, bin, len) == 0,
                      "%s: re-encoded bytes differ (%zu vs %zu)", name, out.len,
                      len);
        free(bin);
        free(hex);
    }
    kvo_buf_fini(&out);
    wire_plane_fini(&m);
    json_object_put(root);
}
END_TEST

START_TEST(single_event_payload_is_the_same_event_as_a_one_element_array) {
    char *p1 =
        kt_src_path("tests/data/vectors/event_plane/legacy_single_event.bin");
    char *p2 =
        kt_src_path("tests/data/vectors/event_plane/stored_two_blocks.bin");
    size_t n1, n2;
    uint8_t *single = kt_read_file(p1, &n1), *array = kt_read_file(p2, &n2);
    wire_plane_msg a, b;
    wire_plane_init(&a);
    wire_plane_init(&b);
    kvo_err err;
    ck_assert(decode(single, n1, &a, &err) == KVO_OK);
    ck_assert(decode(array, n2, &b, &err) == KVO_OK);
    ck_assert(a.single_form && !b.single_form);
    ck_assert_uint_eq(a.n_events, 1);
    json_object *ja, *jb;
    wire_plane_to_json(&a, &ja);
    wire_plane_to_json(&b, &jb);
    assert_json_eq(ja, jb, "single vs array");
    json_object_put(ja);
    json_object_put(jb);
    /* Encoding the single-form message in array form gives the array
     * vector's bytes. */
    a.single_form = false;
    kvo_buf out;
    kvo_buf_init(&out);
    ck_assert(wire_plane_encode(&a, &out) == KVO_OK);
    ck_assert(out.len == n2 && memcmp(out.data, array, n2) == 0);
    kvo_buf_fini(&out);
    wire_plane_fini(&a);
    wire_plane_fini(&b);
    free(single);
    free(array);
    free(p1);
    free(p2);
}
END_TEST

START_TEST(every_strict_prefix_of_every_vector_is_rejected) {
    json_object *root =
        kt_load_json("tests/data/vectors/event_plane/vectors.json");
    json_object *cases = json_object_object_get(root, "cases");
    wire_plane_msg m;
    wire_plane_init(&m);
    for (size_t i = 0; i < json_object_array_length(cases); i++) {
        size_t len;
        uint8_t *bin = vector_bytes(json_object_array_get_idx(cases, i), &len);
        for (size_t n = 0; n < len; n++) {
            /* A heap copy of exactly n bytes, so ASan sees any over-read. */
            uint8_t *pre = malloc(n ? n : 1);
            memcpy(pre, bin, n);
            kvo_err err;
            kvo_status st = decode(pre, n, &m, &err);
            ck_assert_msg(st == KVO_ETRUNC, "case %zu prefix %zu: %s", i, n,
                          kvo_status_name(st));
            ck_assert_uint_le(err.offset, n);
            ck_assert_uint_eq(m.n_events, 0);
            free(pre);
        }
        free(bin);
    }
    wire_plane_fini(&m);
    json_object_put(root);
}
END_TEST

/* ---- hostile input -------------------------------------------------------*/

START_TEST(huge_declared_lengths_are_refused_before_allocating) {
    const char *hostile[] = {
        "ddffffffff", /* array32 of 4G elements */
        "dfffffffff", /* map32 of 4G pairs */
        "81a7"
        "7061796c6f6164"
        "c6ffffffff",   /* payload bin32 4 GiB */
        "81dbffffffff", /* str32 4 GiB key */
        "dc1000",       /* array16 of 4096 in 3 bytes */
    };
    wire_plane_msg m;
    wire_plane_init(&m);
    for (size_t i = 0; i < KVO_ARRAY_LEN(hostile); i++) {
        size_t n;
        uint8_t *b = kt_unhex(hostile[i], &n);
        kvo_err err;
        kvo_alloc_fail_after(0); /* nothing may be allocated for these */
        kvo_status st = decode(b, n, &m, &err);
        kvo_alloc_fail_after(-1);
        ck_assert_msg(st == KVO_ETRUNC || st == KVO_ETOOBIG, "%s: %s",
                      hostile[i], kvo_status_name(st));
        free(b);
    }

    /* Inside the payload: an array32 claiming 4G events. */
    const uint8_t big[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x00};
    mk e;
    mk_envelope(&e, big, sizeof(big), 0);
    kvo_err err;
    kvo_status st = decode((uint8_t *)e.sb.data, e.sb.size, &m, &err);
    ck_assert(st == KVO_ETRUNC || st == KVO_ETOOBIG);
    ck_assert_uint_ge(err.offset, e.sb.size - sizeof(big)); /* in the bin */
    msgpack_sbuffer_destroy(&e.sb);

    /* 200 one-byte elements pass the pre-check but cannot be 200 events. */
    uint8_t many[203] = {0xdc, 0x00, 200};
    mk_envelope(&e, many, sizeof(many), 0);
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "cannot fit"), "%s", err.msg);
    msgpack_sbuffer_destroy(&e.sb);
    wire_plane_fini(&m);
}
END_TEST

START_TEST(deep_nesting_in_an_unknown_key_is_refused) {
    uint8_t payload[600];
    payload[0] = 0x91; /* [ */
    payload[1] = 0x82;
    size_t n = 2;
    /* {"x": [[[[...]]]] ...} : deeper than the default 32 */
    payload[n++] = 0xa1;
    payload[n++] = 'x';
    for (int i = 0; i < 100; i++) payload[n++] = 0x91;
    payload[n++] = 0xc0;
    mk e;
    mk_envelope(&e, payload, n, 0);
    wire_plane_msg m;
    wire_plane_init(&m);
    kvo_err err;
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_ETOOBIG);
    msgpack_sbuffer_destroy(&e.sb);
    wire_plane_fini(&m);
}
END_TEST

START_TEST(wrong_types_are_refused_with_field_and_offset) {
    wire_plane_msg m;
    wire_plane_init(&m);
    kvo_err err;
    /* Negative worker id. */
    ck_assert(decode_event("device", DATA_CLEARED, -5, 0, &m, &err) ==
              KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "worker_id"), "%s", err.msg);
    ck_assert_uint_gt(err.offset, 0);
    /* Unknown tier. */
    ck_assert(decode_event("gpu0", DATA_CLEARED, 1, 0, &m, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "storage_tier"), "%s", err.msg);
    /* Unknown event kind, as a string and as a map key. */
    ck_assert(decode_event("device", "a3626164", 1, 0, &m, &err) == KVO_EPROTO);
    ck_assert(decode_event("device", "81a362616480", 1, 0, &m, &err) ==
              KVO_EPROTO);
    /* data with two keys. */
    ck_assert(decode_event("device", "82a772656d6f76656480a673746f72656480", 1,
                           0, &m, &err) == KVO_EPROTO);
    /* dp_rank beyond u32. */
    ck_assert(decode_event("device", DATA_CLEARED, 1, 1ull << 32, &m, &err) ==
              KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "dp_rank"), "%s", err.msg);
    /* removed: block_hashes of strings; block_hashes missing. */
    ck_assert(decode_event("device",
                           "81a772656d6f76656481ac626c6f636b5f686173686573"
                           "91a178",
                           1, 0, &m, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "block_hashes"), "%s", err.msg);
    ck_assert(decode_event("device", "81a772656d6f76656480", 1, 0, &m, &err) ==
              KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "missing"), "%s", err.msg);
    /* stored: a block without tokens_hash (but long enough to be one). */
    ck_assert(decode_event("device",
                           "81a673746f72656481a6626c6f636b739182aa626c6f636b5f"
                           "6861736801ad6d6d5f65787472615f696e666fc0",
                           1, 0, &m, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "tokens_hash"), "%s", err.msg);
    ck_assert_uint_eq(m.n_events, 0); /* failed decode leaves it empty */

    /* Envelope: payload as str instead of bin; publisher_id as str. */
    mk e;
    mk_init(&e);
    msgpack_pack_map(&e.pk, 1);
    mk_str(&e, "payload");
    mk_str(&e, "x");
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "payload") && strstr(err.msg, "bin"), "%s",
                  err.msg);
    msgpack_sbuffer_destroy(&e.sb);
    mk_init(&e);
    msgpack_pack_map(&e.pk, 1);
    mk_str(&e, "publisher_id");
    mk_str(&e, "7");
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_EPROTO);
    ck_assert_uint_eq(err.offset, 14); /* 81, a c "publisher_id" */
    msgpack_sbuffer_destroy(&e.sb);
    /* Not a map at all; a non-str key; trailing bytes. */
    const char *bad[] = {"93010203", "8101c0", "80c0"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        size_t n;
        uint8_t *b = kt_unhex(bad[i], &n);
        ck_assert_msg(decode(b, n, &m, &err) == KVO_EPROTO, "%s", bad[i]);
        free(b);
    }
    wire_plane_fini(&m);
}
END_TEST

START_TEST(missing_and_duplicate_envelope_keys_are_refused) {
    const uint8_t empty_array = 0x90;
    mk e;
    mk_envelope(&e, &empty_array, 1, 0);
    wire_plane_msg m;
    wire_plane_init(&m);
    kvo_err err;
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_OK);
    ck_assert_uint_eq(m.n_events, 0);
    ck_assert(m.publisher_id == 1 && m.sequence == 2 && m.published_at == 3);
    /* Drop the leading map header's count by one: "payload" goes missing
     * (it is last) and its key becomes trailing garbage -> re-pack. */
    msgpack_sbuffer_destroy(&e.sb);
    mk_init(&e);
    msgpack_pack_map(&e.pk, 2);
    mk_str(&e, "publisher_id");
    msgpack_pack_uint64(&e.pk, 1);
    mk_str(&e, "sequence");
    msgpack_pack_uint64(&e.pk, 2);
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "missing key \"published_at\""), "%s",
                  err.msg);
    msgpack_sbuffer_destroy(&e.sb);
    mk_init(&e);
    msgpack_pack_map(&e.pk, 2);
    mk_str(&e, "sequence");
    msgpack_pack_uint64(&e.pk, 1);
    mk_str(&e, "sequence");
    msgpack_pack_uint64(&e.pk, 2);
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "duplicate"), "%s", err.msg);
    msgpack_sbuffer_destroy(&e.sb);
    wire_plane_fini(&m);
}
END_TEST

START_TEST(unknown_keys_are_skipped_at_every_level) {
    /* Array payload, one stored event; every map has a leading unknown key
     * holding a nested value. */
    mk p;
    mk_init(&p);
    msgpack_pack_array(&p.pk, 1);
    msgpack_pack_map(&p.pk, 4);
    mk_str(&p, "future");
    msgpack_pack_map(&p.pk, 1);
    mk_str(&p, "a");
    msgpack_pack_array(&p.pk, 0);
    mk_str(&p, "event");
    msgpack_pack_map(&p.pk, 4);
    mk_str(&p, "data");
    msgpack_pack_map(&p.pk, 1);
    mk_str(&p, "stored");
    msgpack_pack_map(&p.pk, 3);
    mk_str(&p, "blocks");
    msgpack_pack_array(&p.pk, 1);
    msgpack_pack_map(&p.pk, 4);
    mk_str(&p, "mm_extra_info");
    msgpack_pack_map(&p.pk, 1);
    mk_str(&p, "mm_hash");
    msgpack_pack_uint64(&p.pk, 5);
    mk_str(&p, "tokens_hash");
    msgpack_pack_uint64(&p.pk, 22);
    mk_str(&p, "block_hash");
    msgpack_pack_uint64(&p.pk, UINT64_MAX);
    mk_str(&p, "x");
    msgpack_pack_true(&p.pk);
    mk_str(&p, "start_position");
    msgpack_pack_uint64(&p.pk, 16);
    mk_str(&p, "parent_hash");
    msgpack_pack_uint64(&p.pk, 9);
    mk_str(&p, "dp_rank");
    msgpack_pack_uint64(&p.pk, 3);
    mk_str(&p, "event_id");
    msgpack_pack_uint64(&p.pk, 77);
    mk_str(&p, "extra");
    msgpack_pack_double(&p.pk, 1.5);
    mk_str(&p, "storage_tier");
    mk_str(&p, "host_pinned");
    mk_str(&p, "worker_id");
    msgpack_pack_uint64(&p.pk, 4);
    mk e;
    mk_envelope(&e, p.sb.data, p.sb.size, 2);
    wire_plane_msg m;
    wire_plane_init(&m);
    kvo_err err;
    char eb[256];
    ck_assert_msg(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_OK,
                  "%s", kvo_err_str(&err, eb, sizeof(eb)));
    ck_assert_uint_eq(m.n_events, 1);
    wire_revent *ev = &m.events[0];
    ck_assert(ev->type == WIRE_R_STORED && ev->worker_id == 4 &&
              ev->tier == WIRE_TIER_HOST_PINNED && ev->event_id == 77 &&
              ev->dp_rank == 3 && ev->has_parent && ev->parent_hash == 9);
    ck_assert_uint_eq(ev->n_blocks, 1);
    ck_assert(ev->blocks[0].block_hash == UINT64_MAX &&
              ev->blocks[0].tokens_hash == 22);
    msgpack_sbuffer_destroy(&p.sb);
    msgpack_sbuffer_destroy(&e.sb);
    wire_plane_fini(&m);
}
END_TEST

START_TEST(optional_router_event_fields_take_older_dynamo_defaults) {
    /* {"worker_id": 3, "event": {"event_id": 1, "data": "cleared"}} as a
     * single-event payload. */
    mk p;
    mk_init(&p);
    msgpack_pack_map(&p.pk, 2);
    mk_str(&p, "worker_id");
    msgpack_pack_uint64(&p.pk, 3);
    mk_str(&p, "event");
    msgpack_pack_map(&p.pk, 2);
    mk_str(&p, "event_id");
    msgpack_pack_uint64(&p.pk, 1);
    mk_str(&p, "data");
    mk_str(&p, "cleared");
    ck_assert_uint_eq(p.sb.size, 42); /* the smallest RouterEvent */
    mk e;
    mk_envelope(&e, p.sb.data, p.sb.size, 0);
    wire_plane_msg m;
    wire_plane_init(&m);
    kvo_err err;
    ck_assert(decode((uint8_t *)e.sb.data, e.sb.size, &m, &err) == KVO_OK);
    ck_assert(m.single_form && m.n_events == 1);
    ck_assert(m.events[0].tier == WIRE_TIER_DEVICE &&
              m.events[0].dp_rank == 0 && m.events[0].type == WIRE_R_CLEARED);
    /* {"cleared": null} is accepted as well. */
    ck_assert(decode_event("device", "81a7636c6561726564c0", 1, 0, &m, &err) ==
              KVO_OK);
    ck_assert(m.events[0].type == WIRE_R_CLEARED);
    msgpack_sbuffer_destroy(&p.sb);
    msgpack_sbuffer_destroy(&e.sb);
    wire_plane_fini(&m);
}
END_TEST

/* ---- round trips and tiers -----------------------------------------------*/

START_TEST(big_messages_round_trip_through_bin16_and_bin32_payloads) {
    size_t sizes[] = {0, 3, 20, 3000};
    for (size_t s = 0; s < KVO_ARRAY_LEN(sizes); s++) {
        size_t nb = sizes[s];
        wire_rblock *blocks = calloc(nb ? nb : 1, sizeof(*blocks));
        uint64_t *rm = calloc(nb ? nb : 1, sizeof(*rm));
        for (size_t i = 0; i < nb; i++) {
            blocks[i].block_hash = UINT64_MAX - i;
            blocks[i].tokens_hash = i * 0x9E3779B97F4A7C15ull;
            rm[i] = i;
        }
        wire_revent ev[3] = {
            {.worker_id = UINT64_MAX,
             .tier = WIRE_TIER_DISK,
             .event_id = 5,
             .dp_rank = UINT32_MAX,
             .type = WIRE_R_STORED,
             .has_parent = true,
             .parent_hash = 0,
             .n_blocks = (uint32_t)nb,
             .blocks = blocks},
            {.worker_id = 0,
             .tier = WIRE_TIER_EXTERNAL,
             .event_id = 6,
             .type = WIRE_R_REMOVED,
             .n_removed = (uint32_t)nb,
             .removed = rm},
            {.worker_id = 1,
             .tier = WIRE_TIER_HOST_PINNED,
             .event_id = 7,
             .type = WIRE_R_CLEARED},
        };
        wire_plane_msg in = {.publisher_id = 1ull << 63,
                             .sequence = 0,
                             .published_at = 1700000000000ull,
                             .n_events = 3,
                             .events = ev};
        kvo_buf out;
        kvo_buf_init(&out);
        kvo_buf_append(&out, "prefix", 6); /* encode appends */
        ck_assert(wire_plane_encode(&in, &out) == KVO_OK);
        ck_assert(memcmp(out.data, "prefix", 6) == 0);
        wire_plane_msg m;
        wire_plane_init(&m);
        kvo_err err;
        char eb[256];
        ck_assert_msg(decode(out.data + 6, out.len - 6, &m, &err) == KVO_OK,
                      "%zu: %s", nb, kvo_err_str(&err, eb, sizeof(eb)));
        json_object *a, *b;
        in.topic = m.topic; /* "kv-events" is the default on encode */
        wire_plane_to_json(&in, &a);
        wire_plane_to_json(&m, &b);
        assert_json_eq(b, a, "round trip");
        json_object_put(a);
        json_object_put(b);
        kvo_buf_fini(&out);
        wire_plane_fini(&m);
        free(blocks);
        free(rm);
    }
}
END_TEST

START_TEST(tiers_have_dynamo_names_and_vllm_media_map_onto_them) {
    for (int t = 0; t < WIRE_TIER_COUNT; t++) {
        const char *n = wire_tier_name((wire_tier)t);
        wire_tier back;
        ck_assert(wire_tier_parse(n, strlen(n), &back) == KVO_OK);
        ck_assert_int_eq(back, t);
    }
    wire_tier x = WIRE_TIER_DISK;
    ck_assert(wire_tier_parse("devic", 5, &x) != KVO_OK);
    ck_assert(wire_tier_parse("device!", 7, &x) != KVO_OK);
    ck_assert(wire_tier_parse("Device", 6, &x) != KVO_OK);
    ck_assert(x == WIRE_TIER_DISK);
    ck_assert(wire_tier_parse("device!", 6, &x) == KVO_OK); /* by length */
    ck_assert_str_eq(wire_tier_name(WIRE_TIER_HOST_PINNED), "host_pinned");

    struct {
        const char *medium;
        wire_tier tier;
    } m[] = {{NULL, WIRE_TIER_DEVICE},
             {"GPU", WIRE_TIER_DEVICE},
             {"gpu", WIRE_TIER_DEVICE},
             {"CPU", WIRE_TIER_HOST_PINNED},
             {"CPU_PINNED", WIRE_TIER_HOST_PINNED},
             {"DISK", WIRE_TIER_DISK},
             {"STORAGE", WIRE_TIER_EXTERNAL},
             {"GPUX", WIRE_TIER_EXTERNAL},
             {"", WIRE_TIER_EXTERNAL},
             {"LMCACHE", WIRE_TIER_EXTERNAL}};
    for (size_t i = 0; i < KVO_ARRAY_LEN(m); i++) {
        wire_str s = {m[i].medium,
                      m[i].medium ? (uint32_t)strlen(m[i].medium) : 0};
        ck_assert_msg(wire_tier_from_medium(s) == m[i].tier, "%s",
                      m[i].medium ? m[i].medium : "nil");
    }
    /* A medium that is not NUL-terminated: only len bytes count. */
    wire_str cut = {"DISKETTE", 4};
    ck_assert(wire_tier_from_medium(cut) == WIRE_TIER_DISK);
}
END_TEST

START_TEST(decoding_into_a_reused_message_does_not_allocate) {
    char *path = kt_src_path("tests/data/vectors/event_plane/mixed_dp2.bin");
    size_t len;
    uint8_t *bin = kt_read_file(path, &len);
    wire_plane_msg m;
    wire_plane_init(&m);
    kvo_err err;
    ck_assert(decode(bin, len, &m, &err) == KVO_OK);
    kvo_alloc_fail_after(0);
    kvo_status st = KVO_OK;
    for (int i = 0; i < 1000 && st == KVO_OK; i++)
        st = decode(bin, len, &m, &err);
    kvo_alloc_fail_after(-1);
    ck_assert_msg(st == KVO_OK, "%s", kvo_status_name(st));
    ck_assert_uint_eq(m.n_events, 3);
    /* Decoded data lives in the message, not in the input. */
    memset(bin, 0, len);
    ck_assert(m.events[2].removed[1] == 14643705804678351452ull);
    ck_assert(memcmp(m.topic.p, "kv-events", 9) == 0);
    wire_plane_fini(&m);
    free(bin);
    free(path);
}
END_TEST

START_TEST(encode_rejects_inconsistent_messages) {
    wire_revent ev = {.type = WIRE_R_STORED, .n_blocks = 2, .blocks = NULL};
    wire_plane_msg m = {.n_events = 1, .events = &ev};
    kvo_buf out;
    kvo_buf_init(&out);
    ck_assert(wire_plane_encode(&m, &out) == KVO_EINVAL);
    ev.type = 0;
    ev.n_blocks = 0;
    ck_assert(wire_plane_encode(&m, &out) == KVO_EINVAL);
    ev.type = WIRE_R_CLEARED;
    ev.tier = WIRE_TIER_COUNT;
    ck_assert(wire_plane_encode(&m, &out) == KVO_EINVAL);
    ck_assert_uint_eq(out.len, 0);
    kvo_buf_fini(&out);
}
END_TEST

Suite *suite_plane(void) {
    Suite *s = suite_create("plane");
    TCase *tc = tcase_create("vectors");
    tcase_add_test(tc,
                   every_vector_decodes_to_its_json_and_reencodes_identically);
    tcase_add_test(
        tc, single_event_payload_is_the_same_event_as_a_one_element_array);
    tcase_add_test(tc, every_strict_prefix_of_every_vector_is_rejected);
    suite_add_tcase(s, tc);

    tc = tcase_create("hostile");
    tcase_add_test(tc, huge_declared_lengths_are_refused_before_allocating);
    tcase_add_test(tc, deep_nesting_in_an_unknown_key_is_refused);
    tcase_add_test(tc, wrong_types_are_refused_with_field_and_offset);
    tcase_add_test(tc, missing_and_duplicate_envelope_keys_are_refused);
    tcase_add_test(tc, unknown_keys_are_skipped_at_every_level);
    tcase_add_test(tc, optional_router_event_fields_take_older_dynamo_defaults);
    suite_add_tcase(s, tc);

    tc = tcase_create("roundtrip");
    tcase_add_test(tc,
                   big_messages_round_trip_through_bin16_and_bin32_payloads);
    tcase_add_test(tc, tiers_have_dynamo_names_and_vllm_media_map_onto_them);
    tcase_add_test(tc, decoding_into_a_reused_message_does_not_allocate);
    tcase_add_test(tc, encode_rejects_inconsistent_messages);
    suite_add_tcase(s, tc);
    return s;
}
