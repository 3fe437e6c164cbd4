/* The vLLM batch codec against the shared wire vectors (DESIGN §4): decode
 * equals each vector's "fields", re-encoding gives its bytes, JSON round
 * trips, hash normalization, and the variants the vectors do not spell out
 * (map32 headers, extra batch elements, unknown keys, SGLang metadata, int
 * widths of token ids, unknown event types). */
#include "kt.h"
#include "wire.h"
#include "wire_test.h"

#include <inttypes.h>
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
    default: return true;
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

static void put_cases(void) { json_object_put(cases); }

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
        kvo_err err;
        kvo_status st = wire_batch_decode(buf, len, NULL, &b, &err);
        char es[256];
        ck_assert_msg(st == KVO_OK, "%s: %s", wt_name(c),
                      kvo_err_str(&err, es, sizeof(es)));
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
        kvo_err err;
        char es[256];
        kvo_status st =
            wire_batch_from_json(json_object_object_get(c, "fields"), &b, &err);
        ck_assert_msg(st == KVO_OK, "%s: %s", wt_name(c),
                      kvo_err_str(&err, es, sizeof(es)));
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

static kvo_status decode_mp(mp *m, wire_batch *b, kvo_err *err) {
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
    kvo_err err;
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
    kvo_err err;
    ck_assert(decode_mp(&m, &b, &err) == KVO_OK);
    ck_assert_uint_eq(b.events[0].n_tokens, 10);
    for (int i = 0; i < 9; i++) ck_assert(b.events[0].token_ids[i] == 5);
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
    kvo_err err;
    ck_assert(decode_mp(&m, &b, &err) == KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "events[1]") && strstr(err.msg, "BlockMoved"),
                  "%s", err.msg);
    char s[256];
    kvo_err_str(&err, s, sizeof(s));
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

START_TEST(encoder_refuses_a_bytes_parent_without_its_bytes) {
    /* The block hashes were checked; a parent that claims bytes it does
     * not have was copied from NULL. */
    wire_hash h = {WIRE_HASH_UINT, 0, 7, NULL};
    wire_event e = {.type = WIRE_EV_STORED,
                    .n_hashes = 1,
                    .hashes = &h,
                    .parent = {WIRE_HASH_BYTES, 32, 0, NULL}};
    wire_batch b = {.batch_len = 3, .n_events = 1, .events = &e};
    kvo_buf out;
    kvo_buf_init(&out);
    ck_assert(kvo_buf_append(&out, "x", 1) == KVO_OK);
    for (int f = 0; f < WIRE_FMT_COUNT; f++)
        ck_assert_int_eq(wire_batch_encode(&b, (wire_format)f, 0, &out),
                         KVO_EINVAL);
    ck_assert_uint_eq(out.len, 1); /* nothing appended */
    static const uint8_t digest[32] = {1};
    e.parent.bytes = digest;
    ck_assert_int_eq(wire_batch_encode(&b, WIRE_FMT_MAP, 0, &out), KVO_OK);
    kvo_buf_fini(&out);
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
        kvo_err err;
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

/* ---- The former encoder, as the reference --------------------------------
 * wire_batch_encode writes msgpack directly; before, it called msgpack-c's
 * packer once per value. That encoder lives on here only, as the reference
 * the direct writer must equal byte for byte on random batches. Fields in
 * the order of the array layouts (BlockStored position = index; 0 is the
 * tag); the map orders and required counts are those of vLLM's structs. */
enum {
    R_TYPE,
    R_HASHES,
    R_PARENT,
    R_TOKENS,
    R_BLOCK_SIZE,
    R_LORA_ID,
    R_MEDIUM,
    R_LORA_NAME,
    R_EXTRA_KEYS,
    R_GROUP_IDX,
    R_SPEC_KIND,
    R_SPEC_WINDOW,
    R_LOCALITY,
    R_OWNERSHIP,
    R_SESSION_ID,
    R_CACHE_SALT,
    R_ORIGIN,
    R_COUNT
};
static const char *const ref_keys[R_COUNT] = {"type",
                                              "block_hashes",
                                              "parent_block_hash",
                                              "token_ids",
                                              "block_size",
                                              "lora_id",
                                              "medium",
                                              "lora_name",
                                              "extra_keys",
                                              "group_idx",
                                              "kv_cache_spec_kind",
                                              "kv_cache_spec_sliding_window",
                                              "locality",
                                              "ownership",
                                              "session_id",
                                              "cache_salt",
                                              "origin"};
static const int ref_removed_pos[] = {R_TYPE, R_HASHES, R_MEDIUM, R_GROUP_IDX};
static const int ref_map_removed[] = {R_TYPE,      R_HASHES,   R_MEDIUM,
                                      R_GROUP_IDX, R_LOCALITY, R_OWNERSHIP};

typedef struct ref_enc {
    msgpack_packer pk;
    kvo_buf *out;
    wire_format fmt;
} ref_enc;

static int ref_write(void *data, const char *p, size_t n) {
    return kvo_buf_append(data, p, n) == KVO_OK ? 0 : -1;
}

static void ref_cstr(ref_enc *w, const char *s) {
    msgpack_pack_str_with_body(&w->pk, s, strlen(s));
}

static void ref_str(ref_enc *w, wire_str s) {
    if (!s.p) {
        msgpack_pack_nil(&w->pk);
        return;
    }
    msgpack_pack_str(&w->pk, s.len);
    msgpack_pack_str_body(&w->pk, s.p, s.len);
}

static void ref_int(ref_enc *w, wire_int v) {
    if (v.set)
        msgpack_pack_int64(&w->pk, v.v);
    else
        msgpack_pack_nil(&w->pk);
}

static void ref_raw(ref_enc *w, wire_raw v) {
    if (v.p)
        ck_assert(kvo_buf_append(w->out, v.p, v.len) == KVO_OK);
    else
        msgpack_pack_nil(&w->pk);
}

static void ref_hash(ref_enc *w, const wire_hash *h) {
    if (h->kind == WIRE_HASH_UINT) {
        msgpack_pack_uint64(&w->pk, h->key);
    } else if (h->kind == WIRE_HASH_INT) {
        msgpack_pack_int64(&w->pk, (int64_t)h->key);
    } else if (h->kind == WIRE_HASH_BYTES) {
        msgpack_pack_bin(&w->pk, h->len);
        msgpack_pack_bin_body(&w->pk, h->bytes, h->len);
    } else {
        msgpack_pack_nil(&w->pk);
    }
}

static void ref_field(ref_enc *w, const wire_event *e, int f) {
    static const char *const types[] = {"", "BlockStored", "BlockRemoved",
                                        "AllBlocksCleared"};
    switch (f) {
    case R_TYPE: ref_cstr(w, types[e->type]); break;
    case R_HASHES:
        msgpack_pack_array(&w->pk, e->n_hashes);
        for (uint32_t i = 0; i < e->n_hashes; i++) ref_hash(w, &e->hashes[i]);
        break;
    case R_PARENT: ref_hash(w, &e->parent); break;
    case R_TOKENS:
        msgpack_pack_array(&w->pk, e->n_tokens);
        for (uint32_t i = 0; i < e->n_tokens; i++)
            msgpack_pack_uint64(&w->pk, e->token_ids[i]);
        break;
    case R_BLOCK_SIZE: ref_int(w, e->block_size); break;
    case R_LORA_ID: ref_int(w, e->lora_id); break;
    case R_MEDIUM: ref_str(w, e->medium); break;
    case R_LORA_NAME:
        if (e->metadata.p && w->fmt >= WIRE_FMT_ARRAY_V0_9_0)
            ref_raw(w, e->metadata);
        else
            ref_str(w, e->lora_name);
        break;
    case R_EXTRA_KEYS: ref_raw(w, e->extra_keys); break;
    case R_GROUP_IDX: ref_int(w, e->group_idx); break;
    case R_SPEC_KIND: ref_str(w, e->kv_cache_spec_kind); break;
    case R_SPEC_WINDOW: ref_int(w, e->kv_cache_spec_sliding_window); break;
    case R_LOCALITY: ref_str(w, e->locality); break;
    case R_OWNERSHIP: ref_str(w, e->ownership); break;
    case R_SESSION_ID: ref_str(w, e->session_id); break;
    case R_CACHE_SALT: ref_str(w, e->cache_salt); break;
    default: ref_str(w, e->origin); break;
    }
}

static bool ref_set(const wire_event *e, int f) {
    switch (f) {
    case R_EXTRA_KEYS: return e->extra_keys.p;
    case R_GROUP_IDX: return e->group_idx.set;
    case R_SPEC_KIND: return e->kv_cache_spec_kind.p;
    case R_SPEC_WINDOW: return e->kv_cache_spec_sliding_window.set;
    case R_LOCALITY: return e->locality.p;
    case R_OWNERSHIP: return e->ownership.p;
    case R_SESSION_ID: return e->session_id.p;
    case R_CACHE_SALT: return e->cache_salt.p;
    case R_ORIGIN: return e->origin.p;
    default: return true;
    }
}

static void ref_map_event(ref_enc *w, const wire_event *e, unsigned flags) {
    int all[R_COUNT], keys[R_COUNT];
    size_t n_all = 1, n_req = 1;
    all[0] = R_TYPE;
    if (e->type == WIRE_EV_STORED) {
        for (int f = 0; f < R_COUNT; f++) all[f] = f;
        n_all = R_COUNT, n_req = 8;
    } else if (e->type == WIRE_EV_REMOVED) {
        memcpy(all, ref_map_removed, sizeof(ref_map_removed));
        n_all = KVO_ARRAY_LEN(ref_map_removed), n_req = 3;
    }
    uint32_t n = 0;
    for (size_t i = 0; i < n_all; i++)
        if (i < n_req || ref_set(e, all[i])) keys[n++] = all[i];
    if (w->fmt == WIRE_FMT_MAP_NEXT && e->type == WIRE_EV_STORED) {
        uint8_t h[3] = {0xde, (uint8_t)(n >> 8), (uint8_t)n};
        ck_assert(kvo_buf_append(w->out, h, 3) == KVO_OK);
    } else {
        msgpack_pack_map(&w->pk, n);
    }
    for (uint32_t i = 0; i < n; i++) {
        int f = flags & WIRE_ENC_REVERSE_KEYS ? keys[n - 1 - i] : keys[i];
        ref_cstr(w, ref_keys[f]);
        ref_field(w, e, f);
    }
}

static void ref_array_event(ref_enc *w, const wire_event *e) {
    uint32_t n_stored = 12, n_removed = 4;
    if (w->fmt <= WIRE_FMT_ARRAY_V0_9_1)
        n_stored = 6, n_removed = 2;
    else if (w->fmt == WIRE_FMT_ARRAY_V0_10_2)
        n_stored = 7, n_removed = 3;
    else if (w->fmt == WIRE_FMT_ARRAY_V0_14)
        n_stored = 8, n_removed = 3;
    uint32_t n = e->type == WIRE_EV_STORED    ? n_stored
                 : e->type == WIRE_EV_REMOVED ? n_removed
                                              : 1;
    msgpack_pack_array(&w->pk, n);
    for (uint32_t i = 0; i < n; i++)
        ref_field(w, e,
                  e->type == WIRE_EV_REMOVED ? ref_removed_pos[i] : (int)i);
}

static bool ref_valid(const wire_batch *b) {
    if (b->n_events && !b->events) return false;
    for (uint32_t i = 0; i < b->n_events; i++) {
        const wire_event *e = &b->events[i];
        if (e->type < WIRE_EV_STORED || e->type > WIRE_EV_CLEARED) return false;
        if (e->type == WIRE_EV_CLEARED) continue;
        if (e->n_hashes && !e->hashes) return false;
        for (uint32_t k = 0; k < e->n_hashes; k++)
            if (e->hashes[k].kind == WIRE_HASH_NONE ||
                (e->hashes[k].kind == WIRE_HASH_BYTES && e->hashes[k].len &&
                 !e->hashes[k].bytes))
                return false;
        if (e->type == WIRE_EV_STORED && e->n_tokens && !e->token_ids)
            return false;
    }
    return true;
}

/* What the former encoder returned and appended. */
static kvo_status ref_encode(const wire_batch *b, wire_format f, unsigned flags,
                             kvo_buf *out) {
    if (!ref_valid(b)) return KVO_EINVAL;
    ref_enc w = {.out = out, .fmt = f};
    msgpack_packer_init(&w.pk, out, ref_write);
    msgpack_pack_array(&w.pk, f == WIRE_FMT_ARRAY_V0_9_0 ? 2 : 3);
    msgpack_pack_double(&w.pk, b->ts);
    msgpack_pack_array(&w.pk, b->n_events);
    bool map = f == WIRE_FMT_MAP || f == WIRE_FMT_MAP_NEXT;
    for (uint32_t i = 0; i < b->n_events; i++) {
        if (map)
            ref_map_event(&w, &b->events[i], flags);
        else
            ref_array_event(&w, &b->events[i]);
    }
    if (f != WIRE_FMT_ARRAY_V0_9_0) ref_int(&w, b->dp_rank);
    return KVO_OK;
}

/* ---- Random batches covering every msgpack form the encoder writes ------*/

static uint64_t diff_rng;
static uint64_t diff_next(void) {
    uint64_t z = (diff_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ z >> 27) * 0x94D049BB133111EBull;
    return z ^ z >> 31;
}

static bool one_in(uint64_t n) { return diff_next() % n == 0; }

/* lo, hi, or anything between (boundaries a third of the time each). */
static uint64_t in_range(uint64_t lo, uint64_t hi) {
    uint64_t r = diff_next();
    if (r % 3 == 0) return lo;
    if (r % 3 == 1) return hi;
    uint64_t span = hi - lo;
    return span == UINT64_MAX ? diff_next() : lo + diff_next() % (span + 1);
}

/* A u64 of every msgpack width: fixint, cc, cd, ce, cf below and above
 * 2^63. */
static uint64_t any_u64(void) {
    static const uint64_t lo[] = {
        0, 0x80, 0x100, 0x10000, 0x100000000ull, 0x8000000000000000ull};
    static const uint64_t hi[] = {
        0x7f, 0xff, 0xffff, 0xffffffffull, 0x7fffffffffffffffull, UINT64_MAX};
    size_t c = diff_next() % KVO_ARRAY_LEN(lo);
    return in_range(lo[c], hi[c]);
}

/* An i64 of every width, negative (negative fixint, d0..d3) or not. */
static int64_t any_i64(void) {
    static const int64_t lo[] = {-32, -128, -32768, INT32_MIN, INT64_MIN};
    static const int64_t hi[] = {-1, -33, -129, -32769, (int64_t)INT32_MIN - 1};
    if (one_in(2)) return (int64_t)any_u64();
    size_t c = diff_next() % KVO_ARRAY_LEN(lo);
    return (int64_t)in_range((uint64_t)lo[c], (uint64_t)hi[c]);
}

/* Bytes to point strings, bins and raw values at. */
#define POOL_BYTES 70000u
static uint8_t diff_pool[POOL_BYTES];

typedef struct diff_seen {
    long str8, str16, str32, bin8, bin16, bin32, arr16, arr32, invalid;
} diff_seen;

/* A length of every str/bin header width: fix (str only), 8, 16 and 32
 * bits, at and around the boundaries; long ones rare. */
static uint32_t any_len(bool bin, diff_seen *seen) {
    uint64_t r = diff_next() % 1000;
    uint32_t n;
    if (r < 700)
        n = (uint32_t)in_range(0, 31);
    else if (r < 950)
        n = (uint32_t)in_range(32, 255);
    else if (r < 995)
        n = (uint32_t)in_range(256, 65535);
    else
        n = (uint32_t)in_range(65536, POOL_BYTES);
    long *c[] = {bin ? &seen->bin8 : NULL, bin ? &seen->bin8 : &seen->str8,
                 bin ? &seen->bin16 : &seen->str16,
                 bin ? &seen->bin32 : &seen->str32};
    long *k = c[n < 32 ? 0 : n < 256 ? 1 : n < 65536 ? 2 : 3];
    if (k) (*k)++;
    return n;
}

static const uint8_t *pool_at(uint32_t n) {
    return diff_pool + diff_next() % (POOL_BYTES - n + 1);
}

static wire_str any_str(diff_seen *seen) {
    if (one_in(3)) return (wire_str){NULL, 0};
    uint32_t n = any_len(false, seen);
    return (wire_str){(const char *)pool_at(n), n};
}

static wire_int any_int(void) {
    if (one_in(3)) return (wire_int){false, 0};
    return (wire_int){true, any_i64()};
}

/* Raw values are copied verbatim: any bytes do. */
static wire_raw any_raw(void) {
    if (one_in(2)) return (wire_raw){NULL, 0};
    uint32_t n = (uint32_t)(one_in(20) ? in_range(0, 600) : in_range(0, 40));
    return (wire_raw){pool_at(n), n};
}

/* Hash kinds with any key: the writer packs UINT unsigned and INT signed
 * whatever the value. */
static wire_hash any_hash(bool nil_ok, bool short_bins, diff_seen *seen) {
    uint64_t r = diff_next() % 8;
    if (nil_ok && r == 0) return (wire_hash){WIRE_HASH_NONE, 0, 0, NULL};
    if (r < 4) return (wire_hash){WIRE_HASH_UINT, 0, any_u64(), NULL};
    if (r < 6) return (wire_hash){WIRE_HASH_INT, 0, (uint64_t)any_i64(), NULL};
    uint32_t n = short_bins ? (uint32_t)in_range(0, 40) : any_len(true, seen);
    return (wire_hash){WIRE_HASH_BYTES, n, diff_next(), pool_at(n)};
}

/* A count of every array header width (fix, 16, 32), mostly small. */
static uint32_t any_count(uint32_t small, diff_seen *seen) {
    uint64_t r = diff_next() % 1000;
    uint32_t n = r < 990   ? (uint32_t)in_range(0, small)
                 : r < 998 ? (uint32_t)in_range(16, 70)
                           : (uint32_t)in_range(65535, 65537);
    if (n >= 16 && n <= 0xffff) seen->arr16++;
    if (n > 0xffff) seen->arr32++;
    return n;
}

static void random_event(wire_batch *b, wire_event *e, diff_seen *seen) {
    memset(e, 0, sizeof(*e));
    e->type = (wire_ev_type)(1 + diff_next() % 3);
    e->n_hashes = any_count(17, seen);
    e->hashes =
        kvo_arena_alloc(&b->arena, (e->n_hashes + 1) * sizeof(wire_hash));
    ck_assert_ptr_nonnull(e->hashes);
    for (uint32_t i = 0; i < e->n_hashes; i++)
        e->hashes[i] = any_hash(false, e->n_hashes > 64, seen);
    e->parent = any_hash(true, false, seen);
    e->n_tokens = any_count(48, seen);
    e->token_ids =
        kvo_arena_alloc(&b->arena, (e->n_tokens + 1) * sizeof(uint64_t));
    ck_assert_ptr_nonnull(e->token_ids);
    bool vocab = one_in(2); /* a real vocabulary, or every width */
    for (uint32_t i = 0; i < e->n_tokens; i++)
        e->token_ids[i] = vocab ? diff_next() % 151936 : any_u64();
    e->block_size = any_int();
    e->lora_id = any_int();
    e->medium = any_str(seen);
    e->lora_name = any_str(seen);
    e->metadata = one_in(4) ? any_raw() : (wire_raw){NULL, 0};
    e->extra_keys = any_raw();
    e->group_idx = any_int();
    e->kv_cache_spec_kind = any_str(seen);
    e->kv_cache_spec_sliding_window = any_int();
    e->locality = any_str(seen);
    e->ownership = any_str(seen);
    e->session_id = any_str(seen);
    e->cache_salt = any_str(seen);
    e->origin = any_str(seen);
    /* Now and then something the encoder must refuse. */
    if (one_in(200)) {
        seen->invalid++;
        switch (diff_next() % 5) {
        case 0: e->type = (wire_ev_type)(one_in(2) ? 0 : 4); break;
        case 1:
            e->n_hashes = 1 + e->n_hashes,
            e->hashes[e->n_hashes - 1] =
                (wire_hash){WIRE_HASH_NONE, 0, 0, NULL};
            break;
        case 2: e->n_hashes = 1, e->hashes = NULL; break;
        case 3:
            e->n_hashes = 1,
            e->hashes[0] = (wire_hash){WIRE_HASH_BYTES, 3, 0, NULL};
            break;
        default: e->n_tokens = 1, e->token_ids = NULL; break;
        }
    }
}

START_TEST(encoder_equals_msgpack_c_packer_on_random_batches) {
    const uint64_t seed = 20260419;
    diff_rng = seed;
    fprintf(stderr, "batch: encoder differential seed %" PRIu64 "\n", seed);
    for (size_t i = 0; i < POOL_BYTES; i++) diff_pool[i] = (uint8_t)diff_next();
    diff_seen seen = {0};
    long formats[WIRE_FMT_COUNT] = {0}, reversed = 0, map16 = 0;
    wire_batch b;
    wire_batch_init(&b);
    kvo_buf got, want;
    kvo_buf_init(&got);
    kvo_buf_init(&want);
    for (int round = 0; round < 20000; round++) {
        wire_batch_reset(&b);
        uint64_t bits = diff_next();
        if (one_in(2))
            memcpy(&b.ts, &bits, sizeof(bits)); /* NaNs too */
        else
            b.ts = (double)(bits >> 11) / 1024.0;
        b.dp_rank = any_int();
        b.n_events =
            one_in(500) ? (uint32_t)in_range(16, 40) : (uint32_t)in_range(0, 4);
        b.events =
            kvo_arena_alloc(&b.arena, (b.n_events + 1) * sizeof(wire_event));
        ck_assert_ptr_nonnull(b.events);
        for (uint32_t e = 0; e < b.n_events; e++)
            random_event(&b, &b.events[e], &seen);
        wire_format f = (wire_format)(diff_next() % WIRE_FMT_COUNT);
        unsigned flags = one_in(3) ? WIRE_ENC_REVERSE_KEYS : 0;
        /* Both append after what the buffer already holds. */
        uint32_t pre = (uint32_t)(diff_next() % 8);
        kvo_buf_reset(&got);
        kvo_buf_reset(&want);
        ck_assert(kvo_buf_append(&got, diff_pool, pre) == KVO_OK);
        ck_assert(kvo_buf_append(&want, diff_pool, pre) == KVO_OK);
        kvo_status st_want = ref_encode(&b, f, flags, &want);
        kvo_status st_got = wire_batch_encode(&b, f, flags, &got);
        ck_assert_msg(st_got == st_want, "round %d: status %s, want %s", round,
                      kvo_strerror(st_got), kvo_strerror(st_want));
        if (st_want != KVO_OK) {
            ck_assert_uint_eq(got.len, pre); /* nothing appended */
            continue;
        }
        size_t at = 0;
        while (at < got.len && at < want.len && got.data[at] == want.data[at])
            at++;
        ck_assert_msg(got.len == want.len && at == got.len,
                      "round %d (%s%s): %zu vs %zu bytes, first difference "
                      "at %zu",
                      round, wire_format_name(f), flags ? ", reversed" : "",
                      got.len, want.len, at);
        formats[f]++;
        if (flags) reversed++;
        for (uint32_t e = 0; e < b.n_events; e++)
            if (f == WIRE_FMT_MAP_NEXT && b.events[e].type == WIRE_EV_STORED)
                map16++;
    }
    for (int f = 0; f < WIRE_FMT_COUNT; f++) ck_assert_int_gt(formats[f], 1000);
    ck_assert_int_gt(reversed, 1000);
    ck_assert_int_gt(map16, 1000);
    ck_assert_int_gt(seen.str8, 0);
    ck_assert_int_gt(seen.str16, 0);
    ck_assert_int_gt(seen.str32, 0);
    ck_assert_int_gt(seen.bin8, 0);
    ck_assert_int_gt(seen.bin16, 0);
    ck_assert_int_gt(seen.bin32, 0);
    ck_assert_int_gt(seen.arr16, 0);
    ck_assert_int_gt(seen.arr32, 0);
    ck_assert_int_gt(seen.invalid, 10);
    kvo_buf_fini(&got);
    kvo_buf_fini(&want);
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
    tcase_add_test(tc, encoder_refuses_a_bytes_parent_without_its_bytes);
    tcase_add_test(tc, from_json_rejects_bad_views_naming_the_field);
    suite_add_tcase(s, tc);
    tc = tcase_create("encoder");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, encoder_equals_msgpack_c_packer_on_random_batches);
    suite_add_tcase(s, tc);
    return s;
}
