/* The vLLM batch codec against the shared wire vectors (DESIGN §4): decode
 * equals each vector's "fields", re-encoding gives its bytes, JSON round
 * trips, hash normalization, and the variants the vectors do not spell out
 * (map32 headers, extra batch elements, unknown keys, SGLang metadata, int
 * widths of token ids, unknown event types). */
#include "kt.h"
#include "wire.h"
#include "wire_test.h"

#include <string.h>

Suite *suite_batch(void);

#define VECTORS "tests/data/vectors/wire/vectors.json"

/* ---- Shared helpers (declared in wire_test.h) ---------------------------*/

bool wt_json_int(json_object *j, bool *neg, uint64_t *v) {
    if (!json_object_is_type(j, json_type_int)) return false;
    int64_t s = json_object_get_int64(j);
    *neg = s < 0;
    *v = *neg ? (uint64_t)s : json_object_get_uint64(j);
    return true;
}

/* Equality of JSON values where an absent object key equals null. Writes
 * the path of the first difference to why. */
bool wt_json_same(json_object *a, json_object *b, char *why, size_t n,
                  const char *path) {
    if (!a || !b) {
        if (a == b) return true;
        snprintf(why, n, "%s: null vs %s", path,
                 json_object_to_json_string(a ? a : b));
        return false;
    }
    json_type ta = json_object_get_type(a), tb = json_object_get_type(b);
    if (ta != tb) {
        snprintf(why, n, "%s: %s vs %s", path, json_object_to_json_string(a),
                 json_object_to_json_string(b));
        return false;
    }
    char sub[512];
    switch (ta) {
    case json_type_int: {
        bool na = false, nb = false;
        uint64_t va = 0, vb = 0;
        wt_json_int(a, &na, &va);
        wt_json_int(b, &nb, &vb);
        if (na == nb && va == vb) return true;
        break;
    }
    case json_type_double:
        if (json_object_get_double(a) == json_object_get_double(b)) return true;
        break;
    case json_type_boolean:
        if (json_object_get_boolean(a) == json_object_get_boolean(b))
            return true;
        break;
    case json_type_string:
        if (json_object_get_string_len(a) == json_object_get_string_len(b) &&
            memcmp(json_object_get_string(a), json_object_get_string(b),
                   (size_t)json_object_get_string_len(a)) == 0)
            return true;
        break;
    case json_type_array: {
        size_t la = json_object_array_length(a),
               lb = json_object_array_length(b);
        if (la != lb) {
            snprintf(why, n, "%s: %zu vs %zu elements", path, la, lb);
            return false;
        }
        for (size_t i = 0; i < la; i++) {
            snprintf(sub, sizeof(sub), "%s[%zu]", path, i);
            if (!wt_json_same(json_object_array_get_idx(a, i),
                              json_object_array_get_idx(b, i), why, n, sub))
                return false;
        }
        return true;
    }
    case json_type_object: {
        json_object_object_foreach(a, ka, va) {
            snprintf(sub, sizeof(sub), "%s.%s", path, ka);
            if (!wt_json_same(va, json_object_object_get(b, ka), why, n, sub))
                return false;
        }
        json_object_object_foreach(b, kb, vb) {
            snprintf(sub, sizeof(sub), "%s.%s", path, kb);
            if (!wt_json_same(json_object_object_get(a, kb), vb, why, n, sub))
                return false;
        }
        return true;
    }
    default:
        return true;
    }
    snprintf(why, n, "%s: %s vs %s", path, json_object_to_json_string(a),
             json_object_to_json_string(b));
    return false;
}

uint8_t *wt_vector_bytes(json_object *c, size_t *len) {
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/vectors/wire/%s",
             json_object_get_string(json_object_object_get(c, "file")));
    char *path = kt_src_path(rel);
    uint8_t *b = kt_read_file(path, len);
    kvo_free(path);
    return b;
}

const char *wt_name(json_object *c) {
    return json_object_get_string(json_object_object_get(c, "name"));
}

wire_format wt_format(json_object *c) {
    wire_format f;
    const char *p =
        json_object_get_string(json_object_object_get(c, "profile"));
    ck_assert_msg(wire_format_parse(p, &f) == KVO_OK, "profile %s", p);
    return f;
}

START_TEST(json_comparison_treats_absent_keys_as_null_and_nothing_else) {
    static const struct {
        const char *a, *b;
        bool same;
    } cases_[] = {
        {"{\"a\": 1, \"b\": null}", "{\"a\": 1}", true},
        {"{\"a\": 1}", "{\"a\": 2}", false},
        {"{\"a\": 18446744073709551615}", "{\"a\": -1}", false},
        {"{\"a\": [1, 2]}", "{\"a\": [1]}", false},
        {"{\"a\": [null]}", "{\"a\": []}", false},
        {"{\"a\": \"x\"}", "{\"a\": null}", false},
        {"{\"a\": 1.5}", "{\"a\": 1.25}", false},
        {"{\"a\": {\"bin\": \"00\"}}", "{\"a\": {\"bin\": \"00\"}}", true},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases_); i++) {
        json_object *a = json_tokener_parse(cases_[i].a);
        json_object *b = json_tokener_parse(cases_[i].b);
        char why[256];
        ck_assert_msg(
            wt_json_same(a, b, why, sizeof(why), "") == cases_[i].same &&
                wt_json_same(b, a, why, sizeof(why), "") == cases_[i].same,
            "%s vs %s", cases_[i].a, cases_[i].b);
        json_object_put(a);
        json_object_put(b);
    }
}
END_TEST

/* ---- Vectors --------------------------------------------------------------*/

static json_object *cases;

static void load_cases(void) {
    json_object *all = kt_load_json(VECTORS);
    cases = json_object_get(json_object_object_get(all, "cases"));
    json_object_put(all);
}

static void put_cases(void) {
    json_object_put(cases);
}

static void assert_fields(const wire_batch *b, json_object *c) {
    json_object *got;
    ck_assert(wire_batch_to_json(b, &got) == KVO_OK);
    char why[512] = "";
    bool same = wt_json_same(got, json_object_object_get(c, "fields"), why,
                             sizeof(why), "");
    ck_assert_msg(same, "%s: decoded view differs at %s\n  got %s", wt_name(c),
                  why, json_object_to_json_string(got));
    json_object_put(got);
}

START_TEST(every_wire_vector_decodes_to_its_fields) {
    size_t n = json_object_array_length(cases);
    ck_assert_uint_ge(n, 31);
    wire_batch b;
    wire_batch_init(&b);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        wire_error err;
        kvo_status st = wire_batch_decode(buf, len, NULL, &b, &err);
        char es[256];
        ck_assert_msg(st == KVO_OK, "%s: %s", wt_name(c),
                      wire_error_str(&err, es, sizeof(es)));
        assert_fields(&b, c);
        kvo_free(buf);
    }
    wire_batch_fini(&b);
}
END_TEST

START_TEST(every_wire_vector_reencodes_to_its_bytes) {
    size_t n = json_object_array_length(cases);
    wire_batch b;
    wire_batch_init(&b);
    kvo_buf out;
    kvo_buf_init(&out);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        ck_assert(wire_batch_decode(buf, len, NULL, &b, NULL) == KVO_OK);
        kvo_buf_reset(&out);
        ck_assert(wire_batch_encode(&b, wt_format(c), 0, &out) == KVO_OK);
        ck_assert_msg(out.len == len && memcmp(out.data, buf, len) == 0,
                      "%s: re-encoding as %s differs (%zu vs %zu bytes)",
                      wt_name(c), wire_format_name(wt_format(c)), out.len, len);
        kvo_free(buf);
    }
    kvo_buf_fini(&out);
    wire_batch_fini(&b);
}
END_TEST

START_TEST(every_wire_vector_encodes_from_its_fields_json) {
    /* The kvo-wire encode path: the "fields" view -> bytes. */
    size_t n = json_object_array_length(cases);
    wire_batch b;
    wire_batch_init(&b);
    kvo_buf out;
    kvo_buf_init(&out);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        wire_error err;
        char es[256];
        kvo_status st =
            wire_batch_from_json(json_object_object_get(c, "fields"), &b, &err);
        ck_assert_msg(st == KVO_OK, "%s: %s", wt_name(c),
                      wire_error_str(&err, es, sizeof(es)));
        kvo_buf_reset(&out);
        ck_assert(wire_batch_encode(&b, wt_format(c), 0, &out) == KVO_OK);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        ck_assert_msg(out.len == len && memcmp(out.data, buf, len) == 0,
                      "%s: encoding the fields as %s differs", wt_name(c),
                      wire_format_name(wt_format(c)));
        /* and the view of what from_json built is the same view */
        assert_fields(&b, c);
        kvo_free(buf);
    }
    kvo_buf_fini(&out);
    wire_batch_fini(&b);
}
END_TEST

/* The normalized key, computed independently from the JSON view. */
static uint64_t key_of_json(json_object *h, wire_hash_kind *kind) {
    bool neg;
    uint64_t v;
    if (wt_json_int(h, &neg, &v)) {
        *kind = neg ? WIRE_HASH_INT : WIRE_HASH_UINT;
        return v;
    }
    const char *hex = json_object_get_string(json_object_object_get(h, "bin"));
    size_t n = strlen(hex);
    const char *last = n > 16 ? hex + n - 16 : hex;
    *kind = WIRE_HASH_BYTES;
    return strtoull(last, NULL, 16);
}

START_TEST(hashes_normalize_to_their_u64_key) {
    size_t n = json_object_array_length(cases);
    wire_batch b;
    wire_batch_init(&b);
    size_t checked = 0, kinds[4] = {0};
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        ck_assert(wire_batch_decode(buf, len, NULL, &b, NULL) == KVO_OK);
        json_object *evs = json_object_object_get(
            json_object_object_get(c, "fields"), "events");
        for (uint32_t e = 0; e < b.n_events; e++) {
            json_object *je = json_object_array_get_idx(evs, e);
            json_object *hs = json_object_object_get(je, "block_hashes");
            const wire_event *ev = &b.events[e];
            for (uint32_t k = 0; k < ev->n_hashes; k++) {
                wire_hash_kind kind;
                uint64_t key =
                    key_of_json(json_object_array_get_idx(hs, k), &kind);
                ck_assert_msg(
                    ev->hashes[k].key == key && ev->hashes[k].kind == kind,
                    "%s: events[%u].block_hashes[%u]", wt_name(c), e, k);
                kinds[kind]++;
                checked++;
            }
            json_object *p = json_object_object_get(je, "parent_block_hash");
            if (p) {
                wire_hash_kind kind;
                ck_assert(ev->parent.key == key_of_json(p, &kind));
                ck_assert(ev->parent.kind == kind);
            } else {
                ck_assert(ev->parent.kind == WIRE_HASH_NONE);
                ck_assert(ev->parent.key == 0);
            }
        }
        kvo_free(buf);
    }
    ck_assert_uint_gt(checked, 40);
    /* the vectors cover every kind */
    ck_assert(kinds[WIRE_HASH_UINT] && kinds[WIRE_HASH_INT] &&
              kinds[WIRE_HASH_BYTES]);
    wire_batch_fini(&b);
}
END_TEST

/* ---- Building payloads by hand --------------------------------------------*/

static int sb_write(void *data, const char *p, size_t n) {
    return kvo_buf_append(data, p, n) == KVO_OK ? 0 : -1;
}

void wt_mp_init(wt_mp *m) {
    kvo_buf_init(&m->b);
    msgpack_packer_init(&m->pk, &m->b, sb_write);
}

void wt_mp_str(wt_mp *m, const char *s) {
    msgpack_pack_str_with_body(&m->pk, s, strlen(s));
}

void wt_mp_raw(wt_mp *m, const void *p, size_t n) {
    ck_assert(kvo_buf_append(&m->b, p, n) == KVO_OK);
}

void wt_mp_batch_head(wt_mp *m, uint32_t batch_len, uint32_t n_events) {
    msgpack_pack_array(&m->pk, batch_len);
    msgpack_pack_double(&m->pk, 1.5);
    msgpack_pack_array(&m->pk, n_events);
}

typedef wt_mp mp;
#define mp_init wt_mp_init
#define mp_str wt_mp_str
#define mp_raw wt_mp_raw
#define mp_batch_head wt_mp_batch_head

static kvo_status decode_mp(mp *m, wire_batch *b, wire_error *err) {
    return wire_batch_decode(m->b.data, m->b.len, NULL, b, err);
}

START_TEST(map32_headers_extra_batch_elements_and_unknown_keys_are_accepted) {
    mp m;
    mp_init(&m);
    mp_batch_head(&m, 5, 1);
    /* map32 header, an unknown key before and after "type" */
    const uint8_t map32[] = {0xdf, 0, 0, 0, 5};
    mp_raw(&m, map32, sizeof(map32));
    mp_str(&m, "future_field");
    msgpack_pack_map(&m.pk, 1);
    mp_str(&m, "x");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 2);
    mp_str(&m, "block_hashes");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 7);
    mp_str(&m, "type");
    mp_str(&m, "BlockRemoved");
    mp_str(&m, "another");
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "medium");
    mp_str(&m, "DISK");
    msgpack_pack_int(&m.pk, 2); /* rank */
    mp_str(&m, "extra batch element");
    msgpack_pack_map(&m.pk, 0);
    wire_batch b;
    wire_batch_init(&b);
    wire_error err;
    ck_assert(decode_mp(&m, &b, &err) == KVO_OK);
    ck_assert_uint_eq(b.batch_len, 5);
    ck_assert(b.dp_rank.set && b.dp_rank.v == 2);
    ck_assert_uint_eq(b.n_events, 1);
    ck_assert(b.events[0].type == WIRE_EV_REMOVED);
    ck_assert(b.events[0].layout == WIRE_LAYOUT_MAP);
    ck_assert_uint_eq(b.events[0].map_len, 5);
    ck_assert_uint_eq(b.events[0].n_hashes, 1);
    ck_assert(b.events[0].hashes[0].key == 7);
    ck_assert_str_eq(b.events[0].medium.p, "DISK");
    wire_batch_fini(&b);
    kvo_buf_fini(&m.b);
}
END_TEST

START_TEST(sglang_metadata_map_in_slot_eight_is_kept_verbatim) {
    mp m;
    mp_init(&m);
    mp_batch_head(&m, 3, 1);
    msgpack_pack_array(&m.pk, 8);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int64(&m.pk, -5);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 2);
    msgpack_pack_int(&m.pk, 2);
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "GPU");
    size_t meta_at = m.b.len;
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "priority");
    msgpack_pack_int(&m.pk, 3);
    mp_str(&m, "tags");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_bin_with_body(&m.pk, "\x01\xff", 2);
    size_t meta_len = m.b.len - meta_at;
    msgpack_pack_nil(&m.pk);

    wire_batch b;
    wire_batch_init(&b);
    ck_assert(decode_mp(&m, &b, NULL) == KVO_OK);
    const wire_event *e = &b.events[0];
    ck_assert_ptr_null(e->lora_name.p);
    ck_assert_uint_eq(e->metadata.len, meta_len);
    ck_assert(memcmp(e->metadata.p, m.b.data + meta_at, meta_len) == 0);
    ck_assert(e->metadata.p != m.b.data + meta_at); /* a copy */
    ck_assert(e->hashes[0].kind == WIRE_HASH_INT);
    ck_assert(e->hashes[0].key == (uint64_t)-5);

    json_object *j;
    ck_assert(wire_batch_to_json(&b, &j) == KVO_OK);
    json_object *ev =
        json_object_array_get_idx(json_object_object_get(j, "events"), 0);
    ck_assert_str_eq(
        json_object_to_json_string_ext(json_object_object_get(ev, "metadata"),
                                       JSON_C_TO_STRING_PLAIN),
        "{\"priority\":3,\"tags\":[{\"bin\":\"01ff\"}]}");
    ck_assert_ptr_null(json_object_object_get(ev, "lora_name"));

    /* exact bytes back, from the batch and from its JSON view */
    kvo_buf out;
    kvo_buf_init(&out);
    ck_assert(wire_batch_encode(&b, WIRE_FMT_ARRAY_V0_14, 0, &out) == KVO_OK);
    ck_assert(out.len == m.b.len && memcmp(out.data, m.b.data, out.len) == 0);
    wire_batch b2;
    wire_batch_init(&b2);
    ck_assert(wire_batch_from_json(j, &b2, NULL) == KVO_OK);
    kvo_buf_reset(&out);
    ck_assert(wire_batch_encode(&b2, WIRE_FMT_ARRAY_V0_14, 0, &out) == KVO_OK);
    ck_assert(out.len == m.b.len && memcmp(out.data, m.b.data, out.len) == 0);
    json_object_put(j);
    kvo_buf_fini(&out);
    wire_batch_fini(&b2);
    wire_batch_fini(&b);
    kvo_buf_fini(&m.b);
}
END_TEST

/* A BlockStored array event whose token_ids are given as raw msgpack. */
static void mp_store_with_tokens(mp *m, const uint8_t *tok, size_t n,
                                 uint32_t count) {
    mp_batch_head(m, 3, 1);
    msgpack_pack_array(&m->pk, 6);
    mp_str(m, "BlockStored");
    msgpack_pack_array(&m->pk, 1);
    msgpack_pack_uint64(&m->pk, 1);
    msgpack_pack_nil(&m->pk);
    msgpack_pack_array(&m->pk, count);
    mp_raw(m, tok, n);
    msgpack_pack_int(&m->pk, 16);
    msgpack_pack_nil(&m->pk);
    msgpack_pack_nil(&m->pk);
}

START_TEST(token_ids_of_any_int_width_are_read_and_negatives_rejected) {
    /* 5 as fixint, uint8..uint64 and int8..int64 */
    const uint8_t tok[] = {
        0x05, 0xcc, 0x05, 0xcd, 0x00, 0x05, 0xce, 0,    0,    0,    5,    0xcf,
        0,    0,    0,    0,    0,    0,    0,    5,    0xd0, 0x05, 0xd1, 0x00,
        0x05, 0xd2, 0,    0,    0,    5,    0xd3, 0,    0,    0,    0,    0,
        0,    0,    5,    0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    mp m;
    mp_init(&m);
    mp_store_with_tokens(&m, tok, sizeof(tok), 10);
    wire_batch b;
    wire_batch_init(&b);
    wire_error err;
    ck_assert(decode_mp(&m, &b, &err) == KVO_OK);
    ck_assert_uint_eq(b.events[0].n_tokens, 10);
    for (int i = 0; i < 9; i++)
        ck_assert(b.events[0].token_ids[i] == 5);
    ck_assert(b.events[0].token_ids[9] == UINT64_MAX);
    kvo_buf_fini(&m.b);

    const uint8_t neg[] = {0x01, 0xd1, 0xff, 0x00};
    mp_init(&m);
    mp_store_with_tokens(&m, neg, sizeof(neg), 2);
    ck_assert(decode_mp(&m, &b, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "events[0].token_ids[1]") != NULL, "%s",
                  err.msg);
    ck_assert_uint_eq(m.b.data[err.offset], 0xd1); /* points at the value */
    ck_assert_uint_eq(b.n_events, 0);              /* failed decode: reset */
    wire_batch_fini(&b);
    kvo_buf_fini(&m.b);
}
END_TEST

START_TEST(unknown_event_type_rejects_the_batch_naming_it) {
    mp m;
    mp_init(&m);
    mp_batch_head(&m, 3, 2);
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "AllBlocksCleared");
    msgpack_pack_map(&m.pk, 1);
    mp_str(&m, "type");
    mp_str(&m, "BlockMoved");
    msgpack_pack_nil(&m.pk);
    wire_batch b;
    wire_batch_init(&b);
    wire_error err;
    ck_assert(decode_mp(&m, &b, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "events[1]") && strstr(err.msg, "BlockMoved"),
                  "%s", err.msg);
    char s[256];
    wire_error_str(&err, s, sizeof(s));
    ck_assert_msg(strncmp(s, "EPROTO at byte ", 15) == 0, "%s", s);
    wire_batch_fini(&b);
    kvo_buf_fini(&m.b);
}
END_TEST

START_TEST(bytes_hashes_of_any_length_normalize_to_last_eight_bytes) {
    const char *bins[] = {"01", "0102030405060708", "ff0102030405060708",
                          "00112233445566778899aabbccddeeff"};
    const uint64_t keys[] = {0x01, 0x0102030405060708ull, 0x0102030405060708ull,
                             0x8899aabbccddeeffull};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bins); i++) {
        size_t n;
        uint8_t *raw = kt_unhex(bins[i], &n);
        mp m;
        mp_init(&m);
        mp_batch_head(&m, 3, 1);
        msgpack_pack_array(&m.pk, 3);
        mp_str(&m, "BlockRemoved");
        msgpack_pack_array(&m.pk, 2);
        msgpack_pack_bin_with_body(&m.pk, raw, n);
        msgpack_pack_str_with_body(&m.pk, (const char *)raw, n); /* str too */
        msgpack_pack_nil(&m.pk);
        msgpack_pack_nil(&m.pk);
        wire_batch b;
        wire_batch_init(&b);
        ck_assert(decode_mp(&m, &b, NULL) == KVO_OK);
        for (int k = 0; k < 2; k++) {
            const wire_hash *h = &b.events[0].hashes[k];
            ck_assert(h->kind == WIRE_HASH_BYTES);
            ck_assert_uint_eq(h->len, n);
            ck_assert(memcmp(h->bytes, raw, n) == 0);
            ck_assert_msg(h->key == keys[i], "%s", bins[i]);
        }
        wire_batch_fini(&b);
        kvo_buf_fini(&m.b);
        kvo_free(raw);
    }
}
END_TEST

START_TEST(decoded_batch_does_not_point_into_the_input) {
    size_t n = json_object_array_length(cases);
    wire_batch b;
    wire_batch_init(&b);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        ck_assert(wire_batch_decode(buf, len, NULL, &b, NULL) == KVO_OK);
        memset(buf, 0xc1, len); /* scribble, then free the input */
        kvo_free(buf);
        assert_fields(&b, c); /* the view is still right */
    }
    wire_batch_fini(&b);
}
END_TEST

START_TEST(reversed_map_keys_decode_to_the_same_view) {
    size_t n = json_object_array_length(cases);
    wire_batch b, b2;
    wire_batch_init(&b);
    wire_batch_init(&b2);
    kvo_buf out;
    kvo_buf_init(&out);
    int reversed = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        wire_format f = wt_format(c);
        if (f != WIRE_FMT_MAP && f != WIRE_FMT_MAP_NEXT) continue;
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        ck_assert(wire_batch_decode(buf, len, NULL, &b, NULL) == KVO_OK);
        kvo_buf_reset(&out);
        ck_assert(wire_batch_encode(&b, f, WIRE_ENC_REVERSE_KEYS, &out) ==
                  KVO_OK);
        ck_assert_uint_eq(out.len, len);
        if (b.n_events && b.events[0].type != WIRE_EV_CLEARED) {
            ck_assert_msg(memcmp(out.data, buf, len) != 0, "%s", wt_name(c));
            reversed++;
        }
        ck_assert(wire_batch_decode(out.data, out.len, NULL, &b2, NULL) ==
                  KVO_OK);
        assert_fields(&b2, c);
        kvo_free(buf);
    }
    ck_assert_int_gt(reversed, 10);
    kvo_buf_fini(&out);
    wire_batch_fini(&b);
    wire_batch_fini(&b2);
}
END_TEST

START_TEST(every_vector_converts_between_formats_without_loss) {
    /* Encode each vector in every format and decode it back: the fields
     * that format carries survive (the hashes, tokens, parent and rank
     * always do). */
    size_t n = json_object_array_length(cases);
    wire_batch b, b2;
    wire_batch_init(&b);
    wire_batch_init(&b2);
    kvo_buf out;
    kvo_buf_init(&out);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        ck_assert(wire_batch_decode(buf, len, NULL, &b, NULL) == KVO_OK);
        for (int f = 0; f < WIRE_FMT_COUNT; f++) {
            kvo_buf_reset(&out);
            ck_assert(wire_batch_encode(&b, (wire_format)f, 0, &out) == KVO_OK);
            ck_assert_msg(
                wire_batch_decode(out.data, out.len, NULL, &b2, NULL) == KVO_OK,
                "%s as %s", wt_name(c), wire_format_name((wire_format)f));
            ck_assert_uint_eq(b2.n_events, b.n_events);
            ck_assert(b2.ts == b.ts);
            if (f != WIRE_FMT_ARRAY_V0_9_0)
                ck_assert(b2.dp_rank.set == b.dp_rank.set &&
                          b2.dp_rank.v == b.dp_rank.v);
            for (uint32_t e = 0; e < b.n_events; e++) {
                const wire_event *x = &b.events[e], *y = &b2.events[e];
                ck_assert(x->type == y->type);
                ck_assert_uint_eq(x->n_hashes, y->n_hashes);
                for (uint32_t k = 0; k < x->n_hashes; k++)
                    ck_assert(x->hashes[k].key == y->hashes[k].key &&
                              x->hashes[k].kind == y->hashes[k].kind);
                ck_assert(x->parent.key == y->parent.key);
                ck_assert_uint_eq(x->n_tokens, y->n_tokens);
                if (x->n_tokens)
                    ck_assert(memcmp(x->token_ids, y->token_ids,
                                     x->n_tokens * sizeof(uint64_t)) == 0);
            }
        }
        kvo_free(buf);
    }
    kvo_buf_fini(&out);
    wire_batch_fini(&b);
    wire_batch_fini(&b2);
}
END_TEST

START_TEST(formats_and_sequence_frames_round_trip) {
    for (int f = 0; f < WIRE_FMT_COUNT; f++) {
        wire_format g;
        ck_assert(wire_format_parse(wire_format_name((wire_format)f), &g) ==
                  KVO_OK);
        ck_assert_int_eq(g, f);
    }
    wire_format g;
    ck_assert(wire_format_parse("vllm-array-v0.10.2", &g) == KVO_OK);
    ck_assert_int_eq(g, WIRE_FMT_ARRAY_V0_10_2);
    ck_assert(wire_format_parse("array-v0.11", &g) == KVO_EINVAL);
    ck_assert(wire_format_parse(NULL, &g) == KVO_EINVAL);

    uint8_t s[8];
    uint64_t v;
    wire_seq_put(s, 0x0102030405060708ull);
    ck_assert(s[0] == 1 && s[7] == 8);
    ck_assert(wire_seq_get(s, 8, &v) == KVO_OK && v == 0x0102030405060708ull);
    wire_seq_put(s, WIRE_REPLAY_END);
    ck_assert(wire_seq_get(s, 8, &v) == KVO_OK && v == UINT64_MAX);
    ck_assert(wire_seq_get(s, 7, &v) == KVO_EPROTO);
    ck_assert(wire_seq_get(s, 9, &v) == KVO_EPROTO);
}
END_TEST

START_TEST(from_json_rejects_bad_views_naming_the_field) {
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"[]", "batch"},
        {"{\"events\": []}", "ts"},
        {"{\"ts\": 1.0}", "events"},
        {"{\"ts\": 1.0, \"events\": [], \"data_parallel_rank\": \"x\"}",
         "data_parallel_rank"},
        {"{\"ts\": 1.0, \"events\": [{\"type\": \"Nope\"}]}", "events[0].type"},
        {"{\"ts\": 1.0, \"events\": [{\"type\": \"BlockRemoved\"}]}",
         "block_hashes"},
        {"{\"ts\": 1.0, \"events\": [{\"type\": \"BlockRemoved\", "
         "\"block_hashes\": [1.5]}]}",
         "events[0].block_hashes[0]"},
        {"{\"ts\": 1.0, \"events\": [{\"type\": \"BlockStored\", "
         "\"block_hashes\": [1], \"token_ids\": [1, -2]}]}",
         "events[0].token_ids[1]"},
        {"{\"ts\": 1.0, \"events\": [{\"type\": \"BlockStored\", "
         "\"block_hashes\": [{\"bin\": \"0g\"}], \"token_ids\": []}]}",
         "block_hashes[0]"},
        {"{\"ts\": 1.0, \"events\": [{\"type\": \"BlockStored\", "
         "\"block_hashes\": [], \"token_ids\": [], \"medium\": 3}]}",
         "events[0].medium"},
        {"{\"ts\": 1.0, \"events\": [{\"type\": \"BlockStored\", "
         "\"block_hashes\": [], \"token_ids\": [], \"blok_size\": 3}]}",
         "blok_size"},
    };
    wire_batch b;
    wire_batch_init(&b);
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        json_object *j = json_tokener_parse(bad[i].json);
        ck_assert_ptr_nonnull(j);
        wire_error err;
        ck_assert_msg(wire_batch_from_json(j, &b, &err) == KVO_EPROTO, "%s",
                      bad[i].json);
        ck_assert_msg(strstr(err.msg, bad[i].needle), "%s -> %s", bad[i].json,
                      err.msg);
        ck_assert_uint_eq(b.n_events, 0);
        json_object_put(j);
    }
    wire_batch_fini(&b);
}
END_TEST

Suite *suite_batch(void) {
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("vectors");
    tcase_add_unchecked_fixture(tc, load_cases, put_cases);
    tcase_add_test(tc,
                   json_comparison_treats_absent_keys_as_null_and_nothing_else);
    tcase_add_test(tc, every_wire_vector_decodes_to_its_fields);
    tcase_add_test(tc, every_wire_vector_reencodes_to_its_bytes);
    tcase_add_test(tc, every_wire_vector_encodes_from_its_fields_json);
    tcase_add_test(tc, hashes_normalize_to_their_u64_key);
    tcase_add_test(tc, decoded_batch_does_not_point_into_the_input);
    tcase_add_test(tc, reversed_map_keys_decode_to_the_same_view);
    tcase_add_test(tc, every_vector_converts_between_formats_without_loss);
    suite_add_tcase(s, tc);
    tc = tcase_create("variants");
    tcase_add_test(
        tc, map32_headers_extra_batch_elements_and_unknown_keys_are_accepted);
    tcase_add_test(tc, sglang_metadata_map_in_slot_eight_is_kept_verbatim);
    tcase_add_test(tc,
                   token_ids_of_any_int_width_are_read_and_negatives_rejected);
    tcase_add_test(tc, unknown_event_type_rejects_the_batch_naming_it);
    tcase_add_test(tc,
                   bytes_hashes_of_any_length_normalize_to_last_eight_bytes);
    tcase_add_test(tc, formats_and_sequence_frames_round_trip);
    tcase_add_test(tc, from_json_rejects_bad_views_naming_the_field);
    suite_add_tcase(s, tc);
    return s;
}
