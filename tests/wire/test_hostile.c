/* Hostile input to the batch decoder (DESIGN §10, STYLE "Hostile input"):
 * strict prefixes, huge declared lengths, deep nesting, a 64 MiB token
 * array claimed in 6 bytes, wrong types in every field, limits, allocation
 * failures and random mutations. Every rejection must be a status with an
 * offset inside the input and a reason, the batch left empty, nothing
 * allocated before the pre-check has passed. */
#include "kt.h"
#include "wire.h"
#include "wire_test.h"

#include <stdlib.h>
#include <string.h>

Suite *suite_hostile(void);

#define VECTORS "tests/data/vectors/wire/vectors.json"

static json_object *cases;

static void load_cases(void) {
    json_object *all = kt_load_json(VECTORS);
    cases = json_object_get(json_object_object_get(all, "cases"));
    json_object_put(all);
}

static void put_cases(void) { json_object_put(cases); }

/* Decode from an exact-size heap copy, so ASan sees any over-read, and
 * check the shape of a rejection. Returns the status. */
static kvo_status decode_copy(const uint8_t *p, size_t n,
                              const wire_limits *lim, wire_batch *b,
                              kvo_err *err) {
    uint8_t *copy = kvo_malloc(n);
    ck_assert_ptr_nonnull(copy);
    if (n) memcpy(copy, p, n);
    memset(err, 0, sizeof(*err));
    kvo_status st = wire_batch_decode(copy, n, lim, b, err);
    kvo_free(copy);
    if (st != KVO_OK) {
        ck_assert_int_eq(err->status, st);
        ck_assert_msg(err->offset <= n, "offset %zu beyond %zu bytes",
                      err->offset, n);
        ck_assert_msg(err->msg[0] != '\0', "no reason given");
        ck_assert_uint_eq(b->n_events, 0);
        ck_assert_ptr_null(b->events);
    }
    return st;
}

/* Decode with every allocation failing: a rejection must come before the
 * decoder allocates anything. */
static kvo_status decode_no_alloc(const uint8_t *p, size_t n,
                                  const wire_limits *lim, kvo_err *err) {
    wire_batch b;
    wire_batch_init(&b);
    kvo_alloc_fail_after(0);
    kvo_status st = wire_batch_decode(p, n, lim, &b, err);
    kvo_alloc_fail_after(-1);
    wire_batch_fini(&b);
    return st;
}

START_TEST(every_strict_prefix_of_every_vector_is_rejected_as_truncated) {
    size_t n = json_object_array_length(cases);
    wire_batch b;
    wire_batch_init(&b);
    size_t prefixes = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        for (size_t k = 0; k < len; k++) {
            kvo_err err;
            kvo_status st = decode_copy(buf, k, NULL, &b, &err);
            ck_assert_msg(st == KVO_ETRUNC, "%s: prefix of %zu bytes: %s",
                          wt_name(c), k, kvo_status_name(st));
            prefixes++;
        }
        /* and the whole thing still decodes into the same batch object */
        kvo_err err;
        ck_assert(decode_copy(buf, len, NULL, &b, &err) == KVO_OK);
        kvo_free(buf);
    }
    ck_assert_uint_gt(prefixes, 5000);
    wire_batch_fini(&b);
}
END_TEST

START_TEST(empty_and_null_input_is_rejected) {
    wire_batch b;
    wire_batch_init(&b);
    kvo_err err;
    ck_assert(wire_batch_decode(NULL, 0, NULL, &b, &err) == KVO_ETRUNC);
    ck_assert(wire_batch_decode(NULL, 5, NULL, &b, &err) == KVO_EINVAL);
    ck_assert(wire_batch_decode((const uint8_t *)"", 0, NULL, &b, NULL) ==
              KVO_ETRUNC);
    const uint8_t trailing[] = {0x92, 0x00, 0x90, 0x00};
    ck_assert(decode_copy(trailing, sizeof(trailing), NULL, &b, &err) ==
              KVO_EPROTO);
    ck_assert_uint_eq(err.offset, 3);
    const uint8_t reserved[] = {0x92, 0xc1, 0x90};
    ck_assert(decode_copy(reserved, sizeof(reserved), NULL, &b, &err) ==
              KVO_EPROTO);
    ck_assert_uint_eq(err.offset, 1);
    wire_batch_fini(&b);
}
END_TEST

/* Headers declaring the largest length of each width. */
static const struct {
    const char *name;
    uint8_t bytes[6];
    size_t len;
} huge[] = {
    {"array16", {0xdc, 0xff, 0xff}, 3},
    {"array32", {0xdd, 0xff, 0xff, 0xff, 0xff}, 5},
    {"map16", {0xde, 0xff, 0xff}, 3},
    {"map32", {0xdf, 0xff, 0xff, 0xff, 0xff}, 5},
    {"str8", {0xd9, 0xff}, 2},
    {"str16", {0xda, 0xff, 0xff}, 3},
    {"str32", {0xdb, 0xff, 0xff, 0xff, 0xff}, 5},
    {"bin8", {0xc4, 0xff}, 2},
    {"bin16", {0xc5, 0xff, 0xff}, 3},
    {"bin32", {0xc6, 0xff, 0xff, 0xff, 0xff}, 5},
    {"ext8", {0xc7, 0xff, 0x01}, 3},
    {"ext16", {0xc8, 0xff, 0xff, 0x01}, 4},
    {"ext32", {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}, 6},
    {"fixarray", {0x9f}, 1},
    {"fixmap", {0x8f}, 1},
    {"fixstr", {0xbf}, 1},
};

/* A BlockStored map event cut right before the value of `key`, then the
 * given bytes and a few more. */
static void stored_until(wt_mp *m, const char *key, const uint8_t *tail,
                         size_t n) {
    wt_mp_init(m);
    wt_mp_batch_head(m, 3, 1);
    msgpack_pack_map(&m->pk, 4);
    wt_mp_str(m, "type");
    wt_mp_str(m, "BlockStored");
    wt_mp_str(m, "block_hashes");
    if (strcmp(key, "block_hashes") != 0) {
        msgpack_pack_array(&m->pk, 1);
        msgpack_pack_uint64(&m->pk, 1);
        wt_mp_str(m, "token_ids");
    }
    wt_mp_raw(m, tail, n);
    wt_mp_raw(m, "\x01\x02\x03\x04", 4);
}

START_TEST(huge_declared_lengths_are_refused_before_any_allocation) {
    wire_batch b;
    wire_batch_init(&b);
    for (size_t i = 0; i < KVO_ARRAY_LEN(huge); i++) {
        const uint8_t *h = huge[i].bytes;
        size_t n = huge[i].len;
        kvo_err err;
        /* alone, as the whole payload */
        kvo_status st = decode_copy(h, n, NULL, &b, &err);
        ck_assert_msg(st == KVO_ETOOBIG || st == KVO_ETRUNC, "%s alone: %s",
                      huge[i].name, kvo_status_name(st));
        ck_assert_int_eq(decode_no_alloc(h, n, NULL, &err), st);
        /* in place of block_hashes and of token_ids, deep in a batch */
        const char *keys[] = {"block_hashes", "token_ids"};
        for (size_t k = 0; k < 2; k++) {
            wt_mp m;
            stored_until(&m, keys[k], h, n);
            st = decode_copy(m.b.data, m.b.len, NULL, &b, &err);
            ck_assert_msg(st == KVO_ETOOBIG || st == KVO_ETRUNC, "%s in %s: %s",
                          huge[i].name, keys[k], kvo_status_name(st));
            size_t at = m.b.len - 4 - n; /* where the huge header starts */
            ck_assert_msg(err.offset == at,
                          "%s in %s: offset %zu, header at %zu", huge[i].name,
                          keys[k], err.offset, at);
            ck_assert_int_eq(decode_no_alloc(m.b.data, m.b.len, NULL, &err),
                             st);
            kvo_buf_fini(&m.b);
        }
    }
    /* The 5 bytes that make msgpack-c try to allocate ~128 GiB. */
    kvo_err err;
    const uint8_t dd[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    ck_assert(decode_copy(dd, sizeof(dd), NULL, &b, &err) == KVO_ETOOBIG);
    ck_assert_msg(strstr(err.msg, "4294967295"), "%s", err.msg);
    wire_batch_fini(&b);
}
END_TEST

START_TEST(a_64_MiB_token_array_claimed_in_6_bytes_is_refused) {
    const uint8_t claim[] = {0xdd, 0x04, 0x00, 0x00, 0x00, 0x00};
    wire_batch b;
    wire_batch_init(&b);
    kvo_err err;
    ck_assert(decode_copy(claim, sizeof(claim), NULL, &b, &err) == KVO_ETOOBIG);
    ck_assert(decode_no_alloc(claim, sizeof(claim), NULL, &err) == KVO_ETOOBIG);

    wt_mp m;
    stored_until(&m, "token_ids", claim, sizeof(claim));
    ck_assert(decode_copy(m.b.data, m.b.len, NULL, &b, &err) == KVO_ETOOBIG);
    ck_assert_msg(strstr(err.msg, "67108864"), "%s", err.msg);
    /* Limits raised past the claim: still nothing allocated, the claim
     * does not fit the bytes that follow. */
    wire_limits lim;
    wire_limits_default(&lim);
    lim.max_elems = 1u << 27;
    lim.max_total = 1u << 28;
    ck_assert(decode_copy(m.b.data, m.b.len, &lim, &b, &err) == KVO_ETRUNC);
    ck_assert(decode_no_alloc(m.b.data, m.b.len, &lim, &err) == KVO_ETRUNC);
    kvo_buf_fini(&m.b);
    wire_batch_fini(&b);
}
END_TEST

/* A complete store whose extra_keys nest `depth` arrays deep. */
static void nested_extra_keys(wt_mp *m, unsigned depth) {
    wt_mp_init(m);
    wt_mp_batch_head(m, 3, 1);
    msgpack_pack_map(&m->pk, 4);
    wt_mp_str(m, "type");
    wt_mp_str(m, "BlockStored");
    wt_mp_str(m, "block_hashes");
    msgpack_pack_array(&m->pk, 0);
    wt_mp_str(m, "token_ids");
    msgpack_pack_array(&m->pk, 0);
    wt_mp_str(m, "extra_keys");
    for (unsigned i = 0; i < depth; i++) msgpack_pack_array(&m->pk, 1);
    msgpack_pack_nil(&m->pk);
    msgpack_pack_nil(&m->pk); /* rank */
}

START_TEST(nesting_100_deep_is_refused_unless_the_limit_allows_it) {
    wire_batch b;
    wire_batch_init(&b);
    kvo_err err;
    wt_mp m;
    nested_extra_keys(&m, 100);
    ck_assert(decode_copy(m.b.data, m.b.len, NULL, &b, &err) == KVO_ETOOBIG);
    ck_assert_msg(strstr(err.msg, "nesting"), "%s", err.msg);
    ck_assert(decode_no_alloc(m.b.data, m.b.len, NULL, &err) == KVO_ETOOBIG);
    wire_limits lim;
    wire_limits_default(&lim);
    lim.max_depth = 103; /* batch, events, event, 100 arrays */
    ck_assert(decode_copy(m.b.data, m.b.len, &lim, &b, &err) == KVO_OK);
    ck_assert_uint_eq(b.events[0].extra_keys.len, 101);
    lim.max_depth = 102;
    ck_assert(decode_copy(m.b.data, m.b.len, &lim, &b, &err) == KVO_ETOOBIG);
    kvo_buf_fini(&m.b);

    /* 100 deep at the top, and far deeper than any limit may allow */
    uint8_t deep[4097];
    memset(deep, 0x91, sizeof(deep) - 1);
    deep[sizeof(deep) - 1] = 0xc0;
    ck_assert(decode_copy(deep + sizeof(deep) - 101, 101, NULL, &b, &err) ==
              KVO_ETOOBIG);
    lim.max_depth = UINT32_MAX;
    ck_assert(decode_copy(deep, sizeof(deep), &lim, &b, &err) == KVO_ETOOBIG);
    wire_batch_fini(&b);
}
END_TEST

/* ---- Wrong types in every field -------------------------------------------*/

typedef struct bad_field {
    const char *key;     /* field (map key) */
    const char *bad_hex; /* msgpack bytes of a wrong value */
    const char *path;    /* expected in the error message */
} bad_field;

static const bad_field bad_fields[] = {
    {"type", "05", "events[0].type"},
    {"type", "c0", "events[0].type"},
    {"block_hashes", "a178", "events[0].block_hashes"},
    {"block_hashes", "c0", "events[0].block_hashes"},
    {"block_hashes", "91c0", "events[0].block_hashes[0]"},
    {"block_hashes", "9201cb3ff8000000000000", "events[0].block_hashes[1]"},
    {"block_hashes", "91c3", "events[0].block_hashes[0]"},
    {"block_hashes", "9181a16101", "events[0].block_hashes[0]"},
    {"parent_block_hash", "90", "events[0].parent_block_hash"},
    {"parent_block_hash", "c2", "events[0].parent_block_hash"},
    {"token_ids", "a178", "events[0].token_ids"},
    {"token_ids", "9201c3", "events[0].token_ids[1]"},
    {"token_ids", "9301ff03", "events[0].token_ids[1]"},
    {"token_ids", "91ff", "events[0].token_ids[0]"},
    {"token_ids", "91d3ffffffffffffffff", "events[0].token_ids[0]"},
    {"token_ids", "91ca3f800000", "events[0].token_ids[0]"},
    {"block_size", "a23136", "events[0].block_size"},
    {"block_size", "cfffffffffffffffff", "events[0].block_size"},
    {"block_size", "90", "events[0].block_size"},
    {"lora_id", "a178", "events[0].lora_id"},
    {"medium", "05", "events[0].medium"},
    {"medium", "c403475055", "events[0].medium"},
    {"lora_name", "05", "events[0].lora_name"},
    {"group_idx", "a130", "events[0].group_idx"},
    {"kv_cache_spec_kind", "01", "events[0].kv_cache_spec_kind"},
    {"kv_cache_spec_sliding_window", "a178",
     "events[0].kv_cache_spec_sliding_window"},
    {"locality", "01", "events[0].locality"},
    {"ownership", "90", "events[0].ownership"},
    {"session_id", "c3", "events[0].session_id"},
    {"cache_salt", "01", "events[0].cache_salt"},
    {"origin", "80", "events[0].origin"},
};

static const char *const stored_keys[] = {
    "type",    "block_hashes", "parent_block_hash", "token_ids", "block_size",
    "lora_id", "medium",       "lora_name"};

/* A valid BlockStored map with one field's value replaced (or appended). */
static void stored_map_with(wt_mp *m, const char *key, const uint8_t *bad,
                            size_t n, size_t *bad_at) {
    wt_mp_init(m);
    wt_mp_batch_head(m, 3, 1);
    bool replaced = false;
    for (size_t i = 0; i < KVO_ARRAY_LEN(stored_keys); i++)
        replaced |= strcmp(stored_keys[i], key) == 0;
    msgpack_pack_map(&m->pk, KVO_ARRAY_LEN(stored_keys) + (replaced ? 0 : 1));
    for (size_t i = 0; i < KVO_ARRAY_LEN(stored_keys); i++) {
        const char *k = stored_keys[i];
        wt_mp_str(m, k);
        if (strcmp(k, key) == 0) {
            *bad_at = m->b.len;
            wt_mp_raw(m, bad, n);
        } else if (strcmp(k, "type") == 0) {
            wt_mp_str(m, "BlockStored");
        } else if (strcmp(k, "block_hashes") == 0) {
            msgpack_pack_array(&m->pk, 1);
            msgpack_pack_uint64(&m->pk, 1);
        } else if (strcmp(k, "token_ids") == 0) {
            msgpack_pack_array(&m->pk, 2);
            msgpack_pack_int(&m->pk, 1);
            msgpack_pack_int(&m->pk, 2);
        } else if (strcmp(k, "block_size") == 0) {
            msgpack_pack_int(&m->pk, 2);
        } else if (strcmp(k, "medium") == 0) {
            wt_mp_str(m, "GPU");
        } else {
            msgpack_pack_nil(&m->pk);
        }
    }
    if (!replaced) {
        wt_mp_str(m, key);
        *bad_at = m->b.len;
        wt_mp_raw(m, bad, n);
    }
    msgpack_pack_int(&m->pk, 0); /* rank */
}

/* The same as an array event of the latest array layout, where the field
 * has a position. Returns false when it has none. */
static bool stored_array_with(wt_mp *m, const char *key, const uint8_t *bad,
                              size_t n, size_t *bad_at) {
    static const char *const pos[] = {
        "type",      "block_hashes",       "parent_block_hash",
        "token_ids", "block_size",         "lora_id",
        "medium",    "lora_name",          "extra_keys",
        "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"};
    size_t at = KVO_ARRAY_LEN(pos);
    for (size_t i = 0; i < KVO_ARRAY_LEN(pos); i++)
        if (strcmp(pos[i], key) == 0) at = i;
    if (at == KVO_ARRAY_LEN(pos)) return false;
    wt_mp_init(m);
    wt_mp_batch_head(m, 3, 1);
    msgpack_pack_array(&m->pk, KVO_ARRAY_LEN(pos));
    for (size_t i = 0; i < KVO_ARRAY_LEN(pos); i++) {
        if (i == at) {
            *bad_at = m->b.len;
            wt_mp_raw(m, bad, n);
        } else if (i == 0) {
            wt_mp_str(m, "BlockStored");
        } else if (i == 1) {
            msgpack_pack_array(&m->pk, 1);
            msgpack_pack_uint64(&m->pk, 1);
        } else if (i == 3) {
            msgpack_pack_array(&m->pk, 0);
        } else {
            msgpack_pack_nil(&m->pk);
        }
    }
    msgpack_pack_int(&m->pk, 0);
    return true;
}

START_TEST(wrong_types_in_every_field_are_rejected_naming_the_field) {
    wire_batch b;
    wire_batch_init(&b);
    int array_cases = 0;
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad_fields); i++) {
        const bad_field *f = &bad_fields[i];
        size_t n;
        uint8_t *bad = kt_unhex(f->bad_hex, &n);
        for (int layout = 0; layout < 2; layout++) {
            wt_mp m;
            size_t bad_at = 0;
            if (layout == 0) {
                stored_map_with(&m, f->key, bad, n, &bad_at);
            } else if (!stored_array_with(&m, f->key, bad, n, &bad_at)) {
                continue;
            } else {
                array_cases++;
            }
            kvo_err err;
            kvo_status st = decode_copy(m.b.data, m.b.len, NULL, &b, &err);
            ck_assert_msg(st == KVO_EPROTO, "%s = %s (%s): %s", f->key,
                          f->bad_hex, layout ? "array" : "map",
                          kvo_status_name(st));
            ck_assert_msg(strstr(err.msg, f->path), "%s = %s (%s): \"%s\"",
                          f->key, f->bad_hex, layout ? "array" : "map",
                          err.msg);
            ck_assert_msg(err.offset >= bad_at && err.offset < bad_at + n,
                          "%s = %s (%s): offset %zu, value at %zu", f->key,
                          f->bad_hex, layout ? "array" : "map", err.offset,
                          bad_at);
            kvo_buf_fini(&m.b);
        }
        kvo_free(bad);
    }
    ck_assert_int_gt(array_cases, 20);
    wire_batch_fini(&b);
}
END_TEST

START_TEST(malformed_batches_and_events_are_rejected_with_a_reason) {
    static const struct {
        const char *hex, *needle;
    } bad[] = {
        {"c0", "batch"},                      /* not an array */
        {"91cb3ff0000000000000", "batch"},    /* 1 element */
        {"92a17890", "ts"},                   /* ts a str */
        {"92cb3ff000000000000080", "events"}, /* events a map */
        {"93cb3ff000000000000090a178", "data_parallel_rank"},
        {"93cb3ff000000000000090cfffffffffffffffff", "out of range"},
        {"92cb3ff00000000000009105", "events[0]"},   /* event an int */
        {"92cb3ff00000000000009190", "events[0]"},   /* empty array */
        {"92cb3ff0000000000000918105c0", "key"},     /* int map key */
        {"92cb3ff00000000000009181c40178c0", "key"}, /* bin map key */
        {"92cb3ff00000000000009181a17803", "type"},  /* no type */
        /* BlockStored map without token_ids */
        {"92cb3ff00000000000009182a474797065ab426c6f636b53746f726564"
         "ac626c6f636b5f68617368657390",
         "token_ids"},
        /* BlockRemoved map without block_hashes */
        {"92cb3ff00000000000009181a474797065ac426c6f636b52656d6f766564",
         "block_hashes"},
        /* BlockStored array of 3 elements */
        {"92cb3ff00000000000009193ab426c6f636b53746f72656490c0", "at least"},
        /* events declaring more than their bytes could hold */
        {"92cb3ff0000000000000dc0100"
         "9191919191919191919191919191919191",
         "declares 256"},
    };
    wire_batch b;
    wire_batch_init(&b);
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        size_t n;
        uint8_t *p = kt_unhex(bad[i].hex, &n);
        kvo_err err;
        kvo_status st = decode_copy(p, n, NULL, &b, &err);
        ck_assert_msg(st != KVO_OK, "%s decoded", bad[i].hex);
        ck_assert_msg(strstr(err.msg, bad[i].needle), "%s: \"%s\"", bad[i].hex,
                      err.msg);
        kvo_free(p);
    }
    wire_batch_fini(&b);
}
END_TEST

START_TEST(limits_are_configurable_and_enforced) {
    wire_limits lim;
    wire_limits_default(&lim);
    ck_assert_uint_eq(lim.max_bytes, 64u << 20);
    ck_assert_uint_eq(lim.max_elems, 1u << 20);
    ck_assert_uint_eq(lim.max_total, 1u << 22);
    ck_assert_uint_eq(lim.max_depth, 32);
    ck_assert_uint_eq(lim.max_str, 1u << 20);

    /* store_root: 239 bytes; containers [3] [1] {11} [1] [16] [1] = 33
     * elements; depth 4 (batch, events, event, its arrays); longest str
     * 18 bytes ("kv_cache_spec_kind"). */
    char *path = kt_src_path("tests/data/vectors/wire/store_root.bin");
    size_t len;
    uint8_t *buf = kt_read_file(path, &len);
    kvo_free(path);
    ck_assert_uint_eq(len, 239);
    static const struct {
        size_t field; /* offset in wire_limits */
        uint64_t ok;  /* the smallest value that passes */
    } tight[] = {
        {offsetof(wire_limits, max_bytes), 239},
        {offsetof(wire_limits, max_elems), 16},
        {offsetof(wire_limits, max_total), 33},
        {offsetof(wire_limits, max_depth), 4},
        {offsetof(wire_limits, max_str), 18},
    };
    wire_batch b;
    wire_batch_init(&b);
    for (size_t i = 0; i < KVO_ARRAY_LEN(tight); i++) {
        for (int over = 0; over < 2; over++) {
            wire_limits_default(&lim);
            uint64_t v = tight[i].ok - (over ? 0 : 1);
            void *fp = (char *)&lim + tight[i].field;
            if (tight[i].field == offsetof(wire_limits, max_bytes))
                *(size_t *)fp = (size_t)v;
            else if (tight[i].field == offsetof(wire_limits, max_total))
                *(uint64_t *)fp = v;
            else
                *(uint32_t *)fp = (uint32_t)v;
            kvo_err err;
            kvo_status st = decode_copy(buf, len, &lim, &b, &err);
            ck_assert_msg(st == (over ? KVO_OK : KVO_ETOOBIG),
                          "limit %zu = %" PRIu64 ": %s", i, v,
                          kvo_status_name(st));
        }
    }
    wire_batch_fini(&b);
    kvo_free(buf);
}
END_TEST

START_TEST(allocation_failures_never_crash_or_leak) {
    size_t n = json_object_array_length(cases);
    kvo_buf out;
    kvo_buf_init(&out);
    long injected = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        /* decode: fail the k-th allocation for every k until it succeeds */
        for (long k = 0;; k++) {
            wire_batch b;
            wire_batch_init(&b);
            kvo_err err;
            kvo_alloc_fail_after(k);
            kvo_status st = wire_batch_decode(buf, len, NULL, &b, &err);
            kvo_alloc_fail_after(-1);
            if (st == KVO_OK) {
                ck_assert_uint_gt(b.n_events, 0);
                wire_batch_fini(&b);
                break;
            }
            ck_assert_msg(st == KVO_ENOMEM, "%s: %s", wt_name(c),
                          kvo_status_name(st));
            ck_assert_uint_eq(b.n_events, 0);
            injected++;
            wire_batch_fini(&b);
        }
        /* to_json, from_json, encode */
        wire_batch b;
        wire_batch_init(&b);
        ck_assert(wire_batch_decode(buf, len, NULL, &b, NULL) == KVO_OK);
        for (long k = 0;; k++) {
            json_object *j = NULL;
            kvo_alloc_fail_after(k);
            kvo_status st = wire_batch_to_json(&b, &j);
            kvo_alloc_fail_after(-1);
            if (st == KVO_OK) {
                json_object_put(j);
                break;
            }
            ck_assert_int_eq(st, KVO_ENOMEM);
            injected++;
        }
        json_object *fields = json_object_object_get(c, "fields");
        for (long k = 0;; k++) {
            wire_batch b2;
            wire_batch_init(&b2);
            kvo_alloc_fail_after(k);
            kvo_status st = wire_batch_from_json(fields, &b2, NULL);
            kvo_alloc_fail_after(-1);
            wire_batch_fini(&b2);
            if (st == KVO_OK) break;
            ck_assert_int_eq(st, KVO_ENOMEM);
            injected++;
        }
        for (long k = 0;; k++) {
            kvo_buf_fini(&out);
            kvo_alloc_fail_after(k);
            kvo_status st = wire_batch_encode(&b, wt_format(c), 0, &out);
            kvo_alloc_fail_after(-1);
            if (st == KVO_OK) {
                ck_assert_uint_eq(out.len, len);
                break;
            }
            ck_assert_int_eq(st, KVO_ENOMEM);
            ck_assert_uint_eq(out.len, 0); /* a failed encode appends nothing */
            injected++;
        }
        wire_batch_fini(&b);
        kvo_free(buf);
    }
    ck_assert_int_gt(injected, 100);
    kvo_buf_fini(&out);
}
END_TEST

/* splitmix64, for mutations reproducible from the printed seed */
static uint64_t rng;
static uint64_t next_rand(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ z >> 27) * 0x94D049BB133111EBull;
    return z ^ z >> 31;
}

START_TEST(random_mutations_of_the_vectors_never_crash) {
    const uint64_t seed = 20261130;
    rng = seed;
    fprintf(stderr, "hostile: mutation seed %" PRIu64 "\n", seed);
    size_t n = json_object_array_length(cases);
    wire_batch b, b2;
    wire_batch_init(&b);
    wire_batch_init(&b2);
    kvo_buf out;
    kvo_buf_init(&out);
    long decoded = 0, rejected = 0;
    for (int round = 0; round < 20000; round++) {
        json_object *c = json_object_array_get_idx(cases, next_rand() % n);
        size_t len;
        uint8_t *buf = wt_vector_bytes(c, &len);
        int flips = 1 + (int)(next_rand() % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = next_rand() % len;
            uint64_t r = next_rand();
            buf[at] = (r & 1) ? (uint8_t)(r >> 8)
                              : buf[at] ^ (uint8_t)(1u << (r >> 8) % 8);
        }
        kvo_err err;
        if (decode_copy(buf, len, NULL, &b, &err) == KVO_OK) {
            /* what decodes re-encodes and decodes again */
            kvo_buf_reset(&out);
            ck_assert(wire_batch_encode(&b, WIRE_FMT_MAP, 0, &out) == KVO_OK);
            ck_assert(wire_batch_decode(out.data, out.len, NULL, &b2, NULL) ==
                      KVO_OK);
            ck_assert_uint_eq(b2.n_events, b.n_events);
            json_object *j;
            ck_assert(wire_batch_to_json(&b, &j) == KVO_OK);
            json_object_put(j);
            decoded++;
        } else {
            rejected++;
        }
        kvo_free(buf);
    }
    ck_assert_int_gt(decoded, 100);
    ck_assert_int_gt(rejected, 1000);
    kvo_buf_fini(&out);
    wire_batch_fini(&b);
    wire_batch_fini(&b2);
}
END_TEST

Suite *suite_hostile(void) {
    Suite *s = suite_create("hostile");
    TCase *tc = tcase_create("hostile");
    tcase_set_timeout(tc, 300);
    tcase_add_unchecked_fixture(tc, load_cases, put_cases);
    tcase_add_test(
        tc, every_strict_prefix_of_every_vector_is_rejected_as_truncated);
    tcase_add_test(tc, empty_and_null_input_is_rejected);
    tcase_add_test(tc, huge_declared_lengths_are_refused_before_any_allocation);
    tcase_add_test(tc, a_64_MiB_token_array_claimed_in_6_bytes_is_refused);
    tcase_add_test(tc, nesting_100_deep_is_refused_unless_the_limit_allows_it);
    tcase_add_test(tc,
                   wrong_types_in_every_field_are_rejected_naming_the_field);
    tcase_add_test(tc, malformed_batches_and_events_are_rejected_with_a_reason);
    tcase_add_test(tc, limits_are_configurable_and_enforced);
    tcase_add_test(tc, allocation_failures_never_crash_or_leak);
    tcase_add_test(tc, random_mutations_of_the_vectors_never_crash);
    suite_add_tcase(s, tc);
    return s;
}
