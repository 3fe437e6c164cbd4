/* Hashes (DESIGN §5): every shared vector, router and engine; LoRA and salt
 * semantics; the pickle and CBOR serializers on edge values; big blocks
 * across pickle frame boundaries; no allocation in steady state.
 *
 * Values marked "CPython 3.11" were produced with the interpreter's own C
 * pickler and hashlib, e.g.
 *   pickle.dumps((bytes(range(32)), (1, 2, 3), ("lora", "salt")), 5).hex()
 *   hashlib.sha256(pickle.dumps(obj, protocol=5)).hexdigest()
 * CBOR expectations are written out by hand from RFC 8949 (shortest heads). */
#include "kt.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

Suite *suite_hash(void);

/* ---- helpers --------------------------------------------------------------*/

static char *hex_of(const uint8_t *p, size_t n) {
    char *s = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) sprintf(s + 2 * i, "%02x", p[i]);
    s[2 * n] = '\0';
    return s;
}

static void assert_digest_hex(const wire_digest *d, const char *hex,
                              const char *what) {
    char *h = hex_of(d->b, d->len);
    ck_assert_msg(strcmp(h, hex) == 0, "%s: got %s want %s", what, h, hex);
    free(h);
}

static uint64_t u64_of(json_object *j) {
    uint64_t v = 0;
    if (json_object_is_type(j, json_type_string))
        ck_assert(kvo_parse_u64(json_object_get_string(j), &v) == KVO_OK);
    else
        v = json_object_get_uint64(j);
    return v;
}

static const char *str_or_null(json_object *c, const char *key) {
    json_object *v = json_object_object_get(c, key);
    return v && json_object_is_type(v, json_type_string)
               ? json_object_get_string(v)
               : NULL;
}

static uint64_t *tokens_of(json_object *c, size_t *n) {
    json_object *t = json_object_object_get(c, "token_ids");
    *n = json_object_array_length(t);
    uint64_t *v = malloc((*n ? *n : 1) * sizeof(*v));
    for (size_t i = 0; i < *n; i++)
        v[i] = u64_of(json_object_array_get_idx(t, i));
    return v;
}

/* The 32 bytes 00 01 .. 1f, the parent used by the serializer tests. */
static wire_digest parent_0_31(void) {
    wire_digest d = {.len = 32};
    for (int i = 0; i < 32; i++) d.b[i] = (uint8_t)i;
    return d;
}

static void assert_serialized(wire_algo a, const uint64_t *tok, size_t n,
                              const char *lora, const char *salt,
                              const char *want_hex) {
    wire_digest p = parent_0_31();
    wire_extra x = {lora, salt};
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert(wire_engine_serialize(a, &p, tok, n, &x, &b) == KVO_OK);
    char *h = hex_of(b.data, b.len);
    ck_assert_msg(strcmp(h, want_hex) == 0, "%s n=%zu:\n got %s\nwant %s",
                  wire_algo_name(a), n, h, want_hex);
    free(h);
    kvo_buf_fini(&b);
}

/* ---- shared vectors ------------------------------------------------------*/

START_TEST(engine_hash_vectors_match_root_digest_and_low64_per_block) {
    json_object *root =
        kt_load_json("tests/data/vectors/hash/hash_vectors.json");
    json_object *cases = json_object_object_get(root, "engine_hash_cases");
    size_t nc = json_object_array_length(cases);
    ck_assert_uint_ge(nc, 36);
    kvo_buf scratch;
    kvo_buf_init(&scratch);
    size_t checked = 0;
    for (size_t ci = 0; ci < nc; ci++) {
        json_object *c = json_object_array_get_idx(cases, ci);
        const char *name = str_or_null(c, "name");
        wire_algo a;
        ck_assert_msg(wire_algo_parse(str_or_null(c, "algo"), &a) == KVO_OK,
                      "%s: algo", name);
        uint32_t bs = (uint32_t)json_object_get_int(
            json_object_object_get(c, "block_size"));
        const char *lora = str_or_null(c, "lora_name");
        const char *salt = str_or_null(c, "cache_salt");
        size_t n;
        uint64_t *tok = tokens_of(c, &n);

        wire_digest parent;
        ck_assert(wire_engine_root(a, str_or_null(c, "seed"), &parent) ==
                  KVO_OK);
        assert_digest_hex(&parent, str_or_null(c, "root_digest"), name);

        json_object *blocks = json_object_object_get(c, "blocks");
        size_t nb = json_object_array_length(blocks);
        ck_assert_uint_eq(nb, n / bs);
        for (size_t i = 0; i < nb; i++) {
            json_object *bj = json_object_array_get_idx(blocks, i);
            /* The salt belongs to the first block of a prompt only. */
            wire_extra x = {lora, i == 0 ? salt : NULL};
            wire_digest d;
            ck_assert(wire_engine_block(a, &parent, tok + i * bs, bs, &x,
                                        &scratch, &d) == KVO_OK);
            char what[160];
            snprintf(what, sizeof(what), "%s block %zu", name, i);
            assert_digest_hex(&d, str_or_null(bj, "digest"), what);
            ck_assert_msg(wire_digest_low64(&d) ==
                              u64_of(json_object_object_get(bj, "low64")),
                          "%s low64", what);
            parent = d;
            checked++;
        }
        free(tok);
    }
    ck_assert_uint_ge(checked, 92); /* 4 algos x 23 blocks */
    kvo_buf_fini(&scratch);
    json_object_put(root);
}
END_TEST

/* extra_keys_vectors.json: blocks whose extra keys hold a LoRA name,
 * multimodal (identifier, offset) pairs and a salt, in vLLM's order; every
 * block's digest from the keys listed beside it. */
START_TEST(engine_hash_extra_key_vectors_match_lora_mm_and_salt_blocks) {
    json_object *root =
        kt_load_json("tests/data/vectors/hash/extra_keys_vectors.json");
    json_object *cases = json_object_object_get(root, "cases");
    size_t nc = json_object_array_length(cases);
    ck_assert_uint_ge(nc, 36);
    kvo_buf scratch;
    kvo_buf_init(&scratch);
    size_t checked = 0, with_mm = 0;
    for (size_t ci = 0; ci < nc; ci++) {
        json_object *c = json_object_array_get_idx(cases, ci);
        const char *name = str_or_null(c, "name");
        wire_algo a;
        ck_assert(wire_algo_parse(str_or_null(c, "algo"), &a) == KVO_OK);
        uint32_t bs = (uint32_t)json_object_get_int(
            json_object_object_get(c, "block_size"));
        size_t n;
        uint64_t *tok = tokens_of(c, &n);
        wire_digest parent;
        ck_assert(wire_engine_root(a, str_or_null(c, "seed"), &parent) ==
                  KVO_OK);
        assert_digest_hex(&parent, str_or_null(c, "root_digest"), name);
        json_object *blocks = json_object_object_get(c, "blocks");
        for (size_t i = 0; i < json_object_array_length(blocks); i++) {
            json_object *bj = json_object_array_get_idx(blocks, i);
            json_object *ek = json_object_object_get(bj, "extra_keys");
            wire_extra x = {NULL, NULL};
            wire_mm_key mm[8];
            uint32_t n_mm = 0;
            bool none = !ek || json_object_is_type(ek, json_type_null);
            if (!none) {
                x.lora_name = str_or_null(ek, "lora_name");
                x.cache_salt = str_or_null(ek, "cache_salt");
                json_object *ml = json_object_object_get(ek, "mm");
                n_mm = (uint32_t)json_object_array_length(ml);
                ck_assert_uint_le(n_mm, 8);
                for (uint32_t k = 0; k < n_mm; k++) {
                    json_object *pair = json_object_array_get_idx(ml, k);
                    mm[k].id = json_object_get_string(
                        json_object_array_get_idx(pair, 0));
                    mm[k].offset = json_object_get_int64(
                        json_object_array_get_idx(pair, 1));
                }
                with_mm += n_mm > 0;
            }
            wire_digest d;
            ck_assert(wire_engine_block_mm(a, &parent, tok + i * bs, bs,
                                           none ? NULL : &x, mm, n_mm, &scratch,
                                           &d) == KVO_OK);
            char what[160];
            snprintf(what, sizeof(what), "%s block %zu", name, i);
            assert_digest_hex(&d, str_or_null(bj, "digest"), what);
            ck_assert(wire_digest_low64(&d) ==
                      u64_of(json_object_object_get(bj, "low64")));
            parent = d;
            checked++;
        }
        free(tok);
    }
    ck_assert_uint_ge(checked, 100);
    ck_assert_uint_ge(with_mm, 36);
    kvo_buf_fini(&scratch);
    json_object_put(root);
}
END_TEST

START_TEST(router_hash_vectors_match_seed_and_every_full_block) {
    json_object *root =
        kt_load_json("tests/data/vectors/hash/hash_vectors.json");
    json_object *cases = json_object_object_get(root, "router_hash_cases");
    size_t nc = json_object_array_length(cases);
    ck_assert_uint_ge(nc, 9);
    for (size_t ci = 0; ci < nc; ci++) {
        json_object *c = json_object_array_get_idx(cases, ci);
        const char *name = str_or_null(c, "name");
        const char *lora = str_or_null(c, "lora_name");
        const char *salt = str_or_null(c, "cache_salt");
        uint64_t seed = wire_router_seed(lora, lora ? strlen(lora) : 0, salt,
                                         salt ? strlen(salt) : 0);
        ck_assert_msg(seed == u64_of(json_object_object_get(c, "seed")),
                      "%s: seed", name);
        uint32_t bs = (uint32_t)json_object_get_int(
            json_object_object_get(c, "block_size"));
        size_t n;
        uint64_t *tok = tokens_of(c, &n);
        json_object *want = json_object_object_get(c, "tokens_hashes");
        uint64_t out[64];
        size_t nb = wire_router_hash_blocks(tok, n, bs, seed, out);
        ck_assert_uint_eq(nb, json_object_array_length(want));
        for (size_t i = 0; i < nb; i++)
            ck_assert_msg(out[i] == u64_of(json_object_array_get_idx(want, i)),
                          "%s block %zu", name, i);
        free(tok);
    }
    json_object_put(root);
}
END_TEST

/* ---- router semantics ----------------------------------------------------*/

START_TEST(router_hash_is_dynamo_local_block_hash) {
    const uint64_t t[4] = {1, 2, 3, 4};
    ck_assert(wire_router_hash(t, 4, WIRE_ROUTER_SEED) ==
              14643705804678351452ull);
    ck_assert(wire_router_seed(NULL, 0, NULL, 0) == WIRE_ROUTER_SEED);
    /* Token ids are u32 on the router side: the high half is dropped. */
    const uint64_t wide[4] = {1 + (1ull << 32), 2, 3 + (7ull << 40), 4};
    ck_assert(wire_router_hash(wide, 4, WIRE_ROUTER_SEED) ==
              14643705804678351452ull);
}
END_TEST

START_TEST(router_lora_and_salt_move_the_seed_not_the_bytes) {
    const uint64_t t[4] = {1, 2, 3, 4};
    uint64_t s_l = wire_router_seed("my-lora", 7, NULL, 0);
    uint64_t s_s = wire_router_seed(NULL, 0, "tenant-a", 8);
    uint64_t s_ls = wire_router_seed("my-lora", 7, "tenant-a", 8);
    ck_assert(s_l == WIRE_ROUTER_SEED + XXH3_64bits_withSeed("my-lora", 7, 0));
    ck_assert(s_s == WIRE_ROUTER_SEED + XXH3_64bits_withSeed("tenant-a", 8, 1));
    /* Wrapping sum: the two contributions are independent. */
    ck_assert(s_ls == s_l + s_s - WIRE_ROUTER_SEED);
    /* The same name as lora or as salt gives different seeds. */
    ck_assert(wire_router_seed("x", 1, NULL, 0) !=
              wire_router_seed(NULL, 0, "x", 1));
    ck_assert(wire_router_hash(t, 4, s_l) != wire_router_hash(t, 4, s_s));
    ck_assert(
        wire_router_hash(t, 4, s_l) ==
        XXH3_64bits_withSeed("\1\0\0\0\2\0\0\0\3\0\0\0\4\0\0\0", 16, s_l));
}
END_TEST

START_TEST(router_hash_of_big_blocks_equals_one_shot_xxh3) {
    /* Blocks above the one-shot chunk are streamed; the value must not
     * depend on that. */
    size_t sizes[] = {1023, 1024, 1025, 4096, 8192, 10000};
    for (size_t s = 0; s < KVO_ARRAY_LEN(sizes); s++) {
        size_t n = sizes[s];
        uint64_t *t = malloc(n * sizeof(*t));
        uint32_t *le = malloc(n * sizeof(*le));
        for (size_t i = 0; i < n; i++) {
            t[i] = (uint64_t)i * 2654435761u + 17;
            le[i] = (uint32_t)t[i]; /* x86: host order is little-endian */
        }
        ck_assert_msg(wire_router_hash(t, n, 99) ==
                          XXH3_64bits_withSeed(le, n * 4, 99),
                      "n=%zu", n);
        free(t);
        free(le);
    }
}
END_TEST

START_TEST(router_hash_blocks_ignores_the_partial_tail) {
    uint64_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, out[3] = {0, 0, 0};
    ck_assert_uint_eq(wire_router_hash_blocks(t, 10, 4, 1337, out), 2);
    ck_assert(out[0] == wire_router_hash(t, 4, 1337));
    ck_assert(out[1] == wire_router_hash(t + 4, 4, 1337));
    ck_assert(out[2] == 0);
    ck_assert_uint_eq(wire_router_hash_blocks(t, 3, 4, 1337, out), 0);
    ck_assert_uint_eq(wire_router_hash_blocks(t, 10, 0, 1337, out), 0);
}
END_TEST

/* ---- algorithms and digests ----------------------------------------------*/

START_TEST(algo_names_round_trip_and_unknown_names_are_rejected) {
    for (int a = 0; a < WIRE_ALGO_COUNT; a++) {
        wire_algo back;
        ck_assert(wire_algo_parse(wire_algo_name((wire_algo)a), &back) ==
                  KVO_OK);
        ck_assert_int_eq(back, a);
    }
    wire_algo x = WIRE_ALGO_XXHASH;
    ck_assert(wire_algo_parse("sha256_cbor", &x) == KVO_OK &&
              x == WIRE_ALGO_SHA256_CBOR);
    ck_assert(wire_algo_parse("SHA256", &x) != KVO_OK);
    ck_assert(wire_algo_parse("sha256 ", &x) != KVO_OK);
    ck_assert(wire_algo_parse("", &x) != KVO_OK);
    ck_assert(wire_algo_parse(NULL, &x) != KVO_OK);
    ck_assert(x == WIRE_ALGO_SHA256_CBOR); /* untouched on failure */
}
END_TEST

START_TEST(low64_is_the_last_eight_digest_bytes_big_endian) {
    wire_digest d = parent_0_31();
    ck_assert(wire_digest_low64(&d) == 0x18191a1b1c1d1e1full);
    d.len = 16;
    ck_assert(wire_digest_low64(&d) == 0x08090a0b0c0d0e0full);
}
END_TEST

START_TEST(engine_extra_keys_order_and_salt_change_the_digest) {
    wire_digest root, plain, lora, salt, both, swapped;
    const uint64_t t[4] = {1, 2, 3, 4};
    for (int a = 0; a < WIRE_ALGO_COUNT; a++) {
        ck_assert(wire_engine_root((wire_algo)a, "0", &root) == KVO_OK);
        ck_assert_uint_eq(
            root.len,
            a == WIRE_ALGO_SHA256 || a == WIRE_ALGO_SHA256_CBOR ? 32 : 16);
        wire_extra none = {NULL, NULL}, xl = {"a", NULL}, xs = {NULL, "a"},
                   xb = {"a", "b"}, xw = {"b", "a"};
        ck_assert(wire_engine_block(a, &root, t, 4, &none, NULL, &plain) == 0);
        ck_assert(wire_engine_block(a, &root, t, 4, &xl, NULL, &lora) == 0);
        ck_assert(wire_engine_block(a, &root, t, 4, &xs, NULL, &salt) == 0);
        ck_assert(wire_engine_block(a, &root, t, 4, &xb, NULL, &both) == 0);
        ck_assert(wire_engine_block(a, &root, t, 4, &xw, NULL, &swapped) == 0);
        /* (a,) as lora or as salt serializes the same: extra_keys is just
         * the tuple. NULL extra = None. */
        ck_assert(memcmp(lora.b, salt.b, lora.len) == 0);
        wire_digest nul;
        ck_assert(wire_engine_block(a, &root, t, 4, NULL, NULL, &nul) == 0);
        ck_assert(memcmp(nul.b, plain.b, nul.len) == 0);
        ck_assert(memcmp(plain.b, lora.b, plain.len) != 0);
        ck_assert(memcmp(both.b, swapped.b, both.len) != 0);
        ck_assert(memcmp(both.b, lora.b, both.len) != 0);
    }
}
END_TEST

/* ---- pickle serializer ---------------------------------------------------*/

START_TEST(pickle_ints_take_the_smallest_opcode_cpython_uses) {
    /* CPython 3.11: (P, (0, 255, 256, 65535, 65536, 2**31-1, 2**31, 2**32-1,
     * 2**32, 2**40, 2**63-1, 2**63, 2**64-1), None) */
    const uint64_t t[] = {0,          255,           256,         65535,
                          65536,      0x7fffffffull, 0x80000000u, 0xffffffffu,
                          1ull << 32, 1ull << 40,    INT64_MAX,   1ull << 63,
                          UINT64_MAX};
    assert_serialized(
        WIRE_ALGO_SHA256, t, KVO_ARRAY_LEN(t), NULL, NULL,
        "8005957b000000000000004320000102030405060708090a0b0c0d0e0f1011121314"
        "15161718191a1b1c1d1e1f94284b004bff4d00014dffff4a000001004affffff7f8a"
        "0500000080008a05ffffffff008a0500000000018a060000000000018a08ffffffff"
        "ffffff7f8a090000000000000080008a09ffffffffffffffff0074944e87942e");
}
END_TEST

START_TEST(pickle_tuples_use_empty_tuple1_2_3_and_mark_forms) {
    const uint64_t t[] = {1, 2, 3, 4};
    /* CPython 3.11: (P, (), None) */
    assert_serialized(WIRE_ALGO_XXHASH, t, 0, NULL, NULL,
                      "800595280000000000000043200001020304050607"
                      "08090a0b0c0d0e0f101112131415161718191a1b1c"
                      "1d1e1f94294e87942e");
    /* (P, (7,), ("lora",)) */
    const uint64_t seven = 7;
    assert_serialized(WIRE_ALGO_SHA256, &seven, 1, "lora", NULL,
                      "800595330000000000000043200001020304050607"
                      "08090a0b0c0d0e0f101112131415161718191a1b1c"
                      "1d1e1f944b0785948c046c6f726194859487942e");
    /* (P, (1, 2, 3), ("lora", "salt")) */
    assert_serialized(WIRE_ALGO_SHA256, t, 3, "lora", "salt",
                      "8005953e0000000000000043200001020304050607"
                      "08090a0b0c0d0e0f101112131415161718191a1b1c"
                      "1d1e1f944b014b024b0387948c046c6f7261948c04"
                      "73616c7494869487942e");
    /* (P, (1, 2, 3, 4), ("s",)) */
    assert_serialized(WIRE_ALGO_SHA256, t, 4, NULL, "s",
                      "800595370000000000000043200001020304050607"
                      "08090a0b0c0d0e0f101112131415161718191a1b1c"
                      "1d1e1f94284b014b024b034b0474948c017394859487942e");
}
END_TEST

/* A multimodal key is a (str, int) pair between the LoRA name and the
 * salt; its offset is negative for an item begun in an earlier block
 * (CPython 3.11 and cbor2 5.4: pickle.dumps(o, 5), cbor2.dumps(o,
 * canonical=True) of (bytes(range(32)), (1, 2, 3), ("lora", ("img", -2),
 * "salt")) and of (bytes(range(32)), (7,), (("i", -2**31 - 1),))). */
START_TEST(multimodal_keys_serialize_as_pairs_with_signed_offsets) {
    const uint64_t t[3] = {1, 2, 3}, seven = 7;
    wire_mm_key img = {"img", -2}, far = {"i", -2147483649ll};
    wire_digest p = parent_0_31();
    struct {
        wire_algo a;
        const uint64_t *tok;
        size_t n;
        wire_extra x;
        const wire_mm_key *mm;
        const char *hex;
    } cases[] = {
        {WIRE_ALGO_SHA256,
         t,
         3,
         {"lora", "salt"},
         &img,
         "8005954b000000000000004320000102030405060708090a0b0c0d0e0f10111213141"
         "5"
         "161718191a1b1c1d1e1f944b014b024b0387948c046c6f7261948c03696d67944afef"
         "f"
         "ffff86948c0473616c7494879487942e"},
        {WIRE_ALGO_SHA256_CBOR,
         t,
         3,
         {"lora", "salt"},
         &img,
         "835820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1"
         "f"
         "8301020383646c6f72618263696d67216473616c74"},
        {WIRE_ALGO_XXHASH,
         &seven,
         1,
         {NULL, NULL},
         &far,
         "80059539000000000000004320000102030405060708090a0b0c0d0e0f10111213141"
         "5"
         "161718191a1b1c1d1e1f944b0785948c0169948a05ffffff7fff8694859487942e"},
        {WIRE_ALGO_XXHASH_CBOR,
         &seven,
         1,
         {NULL, NULL},
         &far,
         "835820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1"
         "f"
         "8107818261693a80000000"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        kvo_buf b;
        kvo_buf_init(&b);
        ck_assert(wire_engine_serialize_mm(cases[i].a, &p, cases[i].tok,
                                           cases[i].n, &cases[i].x, cases[i].mm,
                                           1, &b) == KVO_OK);
        char *h = hex_of(b.data, b.len);
        ck_assert_msg(strcmp(h, cases[i].hex) == 0,
                      "case %zu:\n got %s\nwant %s", i, h, cases[i].hex);
        free(h);
        kvo_buf_fini(&b);
    }
    /* n_mm without items is a caller bug, refused */
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert(wire_engine_serialize_mm(WIRE_ALGO_SHA256, &p, t, 3, NULL, NULL,
                                       1, &b) == KVO_EINVAL);
    kvo_buf_fini(&b);
}
END_TEST

START_TEST(pickle_strings_are_utf8_with_short_and_long_headers) {
    const uint64_t one = 1;
    /* (P, (1,), ("é",)) */
    assert_serialized(WIRE_ALGO_SHA256, &one, 1, NULL, "\xc3\xa9",
                      "800595310000000000000043200001020304050607"
                      "08090a0b0c0d0e0f101112131415161718191a1b1c"
                      "1d1e1f944b0185948c02c3a994859487942e");
    /* (P, (1,), ("L" * 256,)): BINUNICODE with a u32 length. */
    char lora[257];
    memset(lora, 'L', 256);
    lora[256] = '\0';
    kvo_buf want;
    kvo_buf_init(&want);
    kvo_buf_printf(&want, "%s",
                   "800595320100000000000043200001020304050607"
                   "08090a0b0c0d0e0f101112131415161718191a1b1c"
                   "1d1e1f944b0185945800010000");
    for (int i = 0; i < 256; i++) kvo_buf_printf(&want, "4c");
    kvo_buf_printf(&want, "94859487942e");
    kvo_buf_cstr(&want);
    assert_serialized(WIRE_ALGO_SHA256, &one, 1, lora, NULL,
                      (const char *)want.data);
    kvo_buf_fini(&want);
}
END_TEST

static void assert_block_sha256(const uint64_t *t, size_t n, const char *lora,
                                const char *salt, const char *want) {
    wire_digest p = parent_0_31(), d;
    wire_extra x = {lora, salt};
    kvo_buf scratch;
    kvo_buf_init(&scratch);
    ck_assert(wire_engine_block(WIRE_ALGO_SHA256, &p, t, n, &x, &scratch, &d) ==
              KVO_OK);
    char what[64];
    snprintf(what, sizeof(what), "n=%zu", n);
    assert_digest_hex(&d, want, what);
    kvo_buf_fini(&scratch);
}

START_TEST(pickle_frames_split_at_64k_where_cpython_splits_them) {
    /* (P, tuple(range(70000, 70000 + n)), ("ab",)): 5-byte BININTs put the
     * 64 KiB boundary right after int 13,100 (CPython 3.11 digests). */
    const size_t ns[] = {13099, 13100, 13101};
    const char *want[] = {
        "460796b9d7f4e0bc1cb3cb030622cdec2e82bdfcb9688d7551844551e540dbf1",
        "e2463d8aaaa8b1591349a7cc0533f8563222522f7715713b71ea2d8896473ae0",
        "6482b0bc04d493aad6ec02c47b3bd6335fa889fc7e8d8fbe033896fec4e11f50"};
    uint64_t *t = malloc(13101 * sizeof(*t));
    for (size_t i = 0; i < 13101; i++) t[i] = 70000 + i;
    for (size_t k = 0; k < 3; k++)
        assert_block_sha256(t, ns[k], "ab", NULL, want[k]);
    free(t);

    /* (P, (1, 2) + tuple(range(70000, 70000 + 13100)), ("ab",)): the frame
     * holds 65,535 bytes before the last int, one short of the target, so
     * it must not split there (CPython: frames of 65,542 and 10 bytes). */
    uint64_t *t2 = malloc(13102 * sizeof(*t2));
    t2[0] = 1;
    t2[1] = 2;
    for (size_t i = 0; i < 13100; i++) t2[2 + i] = 70000 + i;
    assert_block_sha256(
        t2, 13102, "ab", NULL,
        "0decb7227ec37eb5382ec0b8a6d693c16739ab3d510f0e3616cbca7565e3c925");
    free(t2);

    /* Block size 8192 of ids >= 2^63 (9-byte LONG1s, 73 KiB, two frames):
     * (P, tuple(2**63 + i for i in range(8192)), None) */
    uint64_t *big = malloc(8192 * sizeof(*big));
    for (size_t i = 0; i < 8192; i++) big[i] = (1ull << 63) + i;
    assert_block_sha256(
        big, 8192, NULL, NULL,
        "d1c530d66f19a6cae1d31e60bb90b089d91185be81590a6e91eba1016d0fbbca");
    /* Self-consistency for the other algorithms: same input, same digest;
     * scratch and no scratch agree. */
    for (int a = 0; a < WIRE_ALGO_COUNT; a++) {
        wire_digest p = parent_0_31(), d1, d2;
        kvo_buf s;
        kvo_buf_init(&s);
        ck_assert(wire_engine_block(a, &p, big, 8192, NULL, &s, &d1) == 0);
        ck_assert(wire_engine_block(a, &p, big, 8192, NULL, NULL, &d2) == 0);
        ck_assert(memcmp(d1.b, d2.b, sizeof(d1.b)) == 0 && d1.len == d2.len);
        kvo_buf_fini(&s);
    }
    free(big);
}
END_TEST

START_TEST(pickle_payloads_of_64k_and_more_are_written_outside_frames) {
    /* (P, (1, 2), ("x" * 70000, "y" * 65536)) */
    char *x = malloc(70001), *y = malloc(65537);
    memset(x, 'x', 70000);
    x[70000] = '\0';
    memset(y, 'y', 65536);
    y[65536] = '\0';
    const uint64_t t[2] = {1, 2};
    assert_block_sha256(
        t, 2, x, y,
        "21226b8ab69ae88750700aa8f5555afb55a540b19c7ddd44873a45c44136861b");
    free(x);
    free(y);
}
END_TEST

START_TEST(pickle_root_seed_strings_of_every_header_size) {
    struct {
        size_t n;
        const char *sha;
    } cases[] = {
        /* hashlib.sha256(pickle.dumps("s" * n, protocol=5)) */
        {0, "3279c4b947f331d055c47442171c9ea17712596bd7fe094c31d4a5d432b42d68"},
        {300,
         "2b711bc62cb1e211c9d3ca5c41635662fdb84f7e1a2adac99d838824df265e0c"},
        {65535,
         "bdded84786d264a6147835be09eaab1400af0408da66fc6b8771b9e215007b5e"},
        {70000,
         "cab5007181919a68f31e6013fb7168f78cbc5eb85c469ea773b5c253c2059e85"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        char *s = malloc(cases[i].n + 1);
        memset(s, 's', cases[i].n);
        s[cases[i].n] = '\0';
        wire_digest d;
        ck_assert(wire_engine_root(WIRE_ALGO_SHA256, s, &d) == KVO_OK);
        assert_digest_hex(&d, cases[i].sha, "seed");
        free(s);
    }
}
END_TEST

/* ---- CBOR serializer -----------------------------------------------------*/

START_TEST(cbor_uses_shortest_heads_for_every_int_width) {
    const uint64_t t[] = {0,     23,    24,          255,        256,
                          65535, 65536, 0xffffffffu, 1ull << 32, UINT64_MAX};
    /* [h'00..1f', [ints], null] */
    assert_serialized(WIRE_ALGO_SHA256_CBOR, t, KVO_ARRAY_LEN(t), NULL, NULL,
                      "835820000102030405060708090a0b0c0d0e0f10111213141516"
                      "1718191a1b1c1d1e1f8a"
                      "00"                 /* 0 */
                      "17"                 /* 23 */
                      "1818"               /* 24 */
                      "18ff"               /* 255 */
                      "190100"             /* 256 */
                      "19ffff"             /* 65535 */
                      "1a00010000"         /* 65536 */
                      "1affffffff"         /* 2^32-1 */
                      "1b0000000100000000" /* 2^32 */
                      "1bffffffffffffffff" /* 2^64-1 */
                      "f6");
}
END_TEST

START_TEST(cbor_arrays_strings_and_long_heads) {
    const uint64_t one = 1;
    /* [P, [], ["lora", "é"]] */
    assert_serialized(WIRE_ALGO_XXHASH_CBOR, &one, 0, "lora", "\xc3\xa9",
                      "835820000102030405060708090a0b0c0d0e0f10111213141516"
                      "1718191a1b1c1d1e1f80"
                      "82646c6f726162c3a9");
    /* 24 tokens: array head 98 18; a 24-byte string: 78 18. */
    uint64_t t[24];
    for (int i = 0; i < 24; i++) t[i] = 1;
    char s[25];
    memset(s, 'a', 24);
    s[24] = '\0';
    kvo_buf want;
    kvo_buf_init(&want);
    kvo_buf_printf(&want, "835820000102030405060708090a0b0c0d0e0f10111213141516"
                          "1718191a1b1c1d1e1f9818");
    for (int i = 0; i < 24; i++) kvo_buf_printf(&want, "01");
    kvo_buf_printf(&want, "817818");
    for (int i = 0; i < 24; i++) kvo_buf_printf(&want, "61");
    kvo_buf_cstr(&want);
    assert_serialized(WIRE_ALGO_SHA256_CBOR, t, 24, s, NULL,
                      (const char *)want.data);
    kvo_buf_fini(&want);
}
END_TEST

/* ---- allocation and argument checks --------------------------------------*/

START_TEST(engine_block_with_scratch_does_not_allocate_in_steady_state) {
    uint64_t t[16];
    for (int i = 0; i < 16; i++) t[i] = 100000 + (uint64_t)i * 977;
    kvo_buf scratch;
    kvo_buf_init(&scratch);
    wire_extra x = {"lora", "salt"};
    for (int a = 0; a < WIRE_ALGO_COUNT; a++) {
        wire_digest p, d;
        ck_assert(wire_engine_root(a, "0", &p) == KVO_OK);
        ck_assert(wire_engine_block(a, &p, t, 16, &x, &scratch, &d) == 0);
        kvo_alloc_fail_after(0); /* any allocation now fails */
        for (int i = 0; i < 100; i++) {
            kvo_status st = wire_engine_block(a, &p, t, 16, &x, &scratch, &d);
            if (st != KVO_OK) {
                kvo_alloc_fail_after(-1);
                ck_abort_msg("%s allocated", wire_algo_name(a));
            }
            p = d;
        }
        kvo_alloc_fail_after(-1);
    }
    kvo_buf_fini(&scratch);
}
END_TEST

START_TEST(engine_hash_reports_allocation_failure_and_bad_arguments) {
    wire_digest p = parent_0_31(), d;
    const uint64_t t[4] = {1, 2, 3, 4};
    kvo_alloc_fail_after(0);
    kvo_status st =
        wire_engine_block(WIRE_ALGO_SHA256, &p, t, 4, NULL, NULL, &d);
    kvo_status st2 = wire_engine_root(WIRE_ALGO_SHA256, "0", &d);
    kvo_alloc_fail_after(-1);
    ck_assert(st == KVO_ENOMEM);
    ck_assert(st2 == KVO_ENOMEM);
    ck_assert(wire_engine_block(WIRE_ALGO_COUNT, &p, t, 4, NULL, NULL, &d) ==
              KVO_EINVAL);
    ck_assert(wire_engine_block(WIRE_ALGO_SHA256, NULL, t, 4, NULL, NULL, &d) ==
              KVO_EINVAL);
    ck_assert(wire_engine_block(WIRE_ALGO_SHA256, &p, NULL, 4, NULL, NULL,
                                &d) == KVO_EINVAL);
    ck_assert(wire_engine_root(WIRE_ALGO_SHA256, NULL, &d) == KVO_EINVAL);
}
END_TEST

START_TEST(router_prompt_salts_block_0_and_items_move_only_their_blocks) {
    uint64_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = 500 + (uint64_t)i;
    uint64_t base[4], salted[4], lora[4], img_a[4], img_b[4], want[4];
    ck_assert_uint_eq(
        wire_router_hash_prompt(tok, 64, 16, NULL, NULL, NULL, 0, base), 4);
    ck_assert_uint_eq(
        wire_router_hash_blocks(tok, 64, 16, WIRE_ROUTER_SEED, want), 4);
    ck_assert_mem_eq(base, want, sizeof(base));
    /* the salt is in block 0's seed only (vLLM salts block 0 only) */
    wire_router_hash_prompt(tok, 64, 16, NULL, "t1", NULL, 0, salted);
    ck_assert(salted[0] ==
              wire_router_hash(tok, 16, wire_router_seed(NULL, 0, "t1", 2)));
    ck_assert(salted[0] != base[0]);
    ck_assert_mem_eq(salted + 1, base + 1, 3 * sizeof(uint64_t));
    /* the adapter is in every block's seed */
    wire_router_hash_prompt(tok, 64, 16, "ad", NULL, NULL, 0, lora);
    for (int i = 0; i < 4; i++) ck_assert(lora[i] != base[i]);
    /* an item over tokens 20..39 moves blocks 1 and 2 only, with its
     * offset from each block's start (4, then -12) */
    wire_mm_span a = {20, 20, "img-a"}, b = {20, 20, "img-b"};
    wire_router_hash_prompt(tok, 64, 16, NULL, NULL, &a, 1, img_a);
    wire_router_hash_prompt(tok, 64, 16, NULL, NULL, &b, 1, img_b);
    ck_assert(img_a[0] == base[0] && img_a[3] == base[3]);
    wire_mm_key k1 = {"img-a", 4}, k2 = {"img-a", -12};
    ck_assert(img_a[1] ==
              wire_router_hash_mm(tok + 16, 16, WIRE_ROUTER_SEED, &k1, 1));
    ck_assert(img_a[2] ==
              wire_router_hash_mm(tok + 32, 16, WIRE_ROUTER_SEED, &k2, 1));
    ck_assert(img_a[1] != base[1] && img_a[2] != base[2]);
    ck_assert(img_a[1] != img_b[1] && img_a[2] != img_b[2]);
    ck_assert(wire_router_hash_mm(tok, 16, WIRE_ROUTER_SEED, NULL, 0) ==
              base[0]);
}
END_TEST

Suite *suite_hash(void) {
    Suite *s = suite_create("hash");
    TCase *tc = tcase_create("vectors");
    tcase_add_test(tc,
                   engine_hash_vectors_match_root_digest_and_low64_per_block);
    tcase_add_test(tc, router_hash_vectors_match_seed_and_every_full_block);
    tcase_add_test(tc,
                   engine_hash_extra_key_vectors_match_lora_mm_and_salt_blocks);
    suite_add_tcase(s, tc);

    tc = tcase_create("router");
    tcase_add_test(tc, router_hash_is_dynamo_local_block_hash);
    tcase_add_test(tc, router_lora_and_salt_move_the_seed_not_the_bytes);
    tcase_add_test(tc, router_hash_of_big_blocks_equals_one_shot_xxh3);
    tcase_add_test(tc, router_hash_blocks_ignores_the_partial_tail);
    tcase_add_test(
        tc, router_prompt_salts_block_0_and_items_move_only_their_blocks);
    suite_add_tcase(s, tc);

    tc = tcase_create("engine");
    tcase_add_test(tc, algo_names_round_trip_and_unknown_names_are_rejected);
    tcase_add_test(tc, low64_is_the_last_eight_digest_bytes_big_endian);
    tcase_add_test(tc, engine_extra_keys_order_and_salt_change_the_digest);
    tcase_add_test(tc,
                   engine_block_with_scratch_does_not_allocate_in_steady_state);
    tcase_add_test(tc,
                   engine_hash_reports_allocation_failure_and_bad_arguments);
    suite_add_tcase(s, tc);

    tc = tcase_create("pickle");
    tcase_add_test(tc, pickle_ints_take_the_smallest_opcode_cpython_uses);
    tcase_add_test(tc, pickle_tuples_use_empty_tuple1_2_3_and_mark_forms);
    tcase_add_test(tc, pickle_strings_are_utf8_with_short_and_long_headers);
    tcase_add_test(tc, multimodal_keys_serialize_as_pairs_with_signed_offsets);
    tcase_add_test(tc, pickle_frames_split_at_64k_where_cpython_splits_them);
    tcase_add_test(tc,
                   pickle_payloads_of_64k_and_more_are_written_outside_frames);
    tcase_add_test(tc, pickle_root_seed_strings_of_every_header_size);
    suite_add_tcase(s, tc);

    tc = tcase_create("cbor");
    tcase_add_test(tc, cbor_uses_shortest_heads_for_every_int_width);
    tcase_add_test(tc, cbor_arrays_strings_and_long_heads);
    suite_add_tcase(s, tc);
    return s;
}
