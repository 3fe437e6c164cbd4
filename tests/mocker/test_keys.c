/* Extra keys in the engine (issue 15): LoRA adapters, cache salts and
 * multimodal items change a block's engine hash exactly as vLLM's
 * kv_cache_utils.py does (checked against extra_keys_vectors.json, made
 * with CPython's pickler), and BlockStored carries lora_id, lora_name and
 * each block's extra_keys as vLLM's block pool lists them. */
#include "mt.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

Suite *suite_keys(void);

static const char *jstr(json_object *o, const char *k) {
    json_object *v = json_object_object_get(o, k);
    return v && json_object_is_type(v, json_type_string)
               ? json_object_get_string(v)
               : NULL;
}

static uint64_t ju64(json_object *o) {
    uint64_t v;
    ck_assert(kvo_parse_u64(json_object_get_string(o), &v) == KVO_OK);
    return v;
}

/* Every case of the vectors through the mocker's hasher the way a request
 * is hashed: its prompt's blocks in one call, then each block generated
 * tokens complete in a call of its own. */
START_TEST(request_hashes_follow_vllms_extra_key_rules_on_every_vector) {
    json_object *root =
        kt_load_json("tests/data/vectors/hash/extra_keys_vectors.json");
    json_object *cases = json_object_object_get(root, "cases");
    size_t checked = 0;
    for (size_t ci = 0; ci < json_object_array_length(cases); ci++) {
        json_object *c = json_object_array_get_idx(cases, ci);
        const char *name = jstr(c, "name");
        wire_algo a;
        ck_assert(wire_algo_parse(jstr(c, "algo"), &a) == KVO_OK);
        mock_hasher *h;
        ck_assert_int_eq(mock_hasher_new(&h, a, jstr(c, "seed"), 0), KVO_OK);
        uint32_t bs = (uint32_t)json_object_get_int(
            json_object_object_get(c, "block_size"));
        uint32_t plen = (uint32_t)json_object_get_int(
            json_object_object_get(c, "prompt_len"));
        json_object *tj = json_object_object_get(c, "token_ids");
        uint32_t n = (uint32_t)json_object_array_length(tj);
        uint64_t tok[64];
        ck_assert_uint_le(n, 64);
        for (uint32_t i = 0; i < n; i++)
            tok[i] = (uint64_t)json_object_get_int64(
                json_object_array_get_idx(tj, i));
        json_object *mj = json_object_object_get(c, "mm_items");
        mock_mm_item mm[8];
        uint32_t n_mm = (uint32_t)json_object_array_length(mj);
        for (uint32_t i = 0; i < n_mm; i++) {
            json_object *it = json_object_array_get_idx(mj, i);
            mm[i] = (mock_mm_item){(uint32_t)json_object_get_int(
                                       json_object_object_get(it, "offset")),
                                   (uint32_t)json_object_get_int(
                                       json_object_object_get(it, "length")),
                                   jstr(it, "hash")};
        }
        ck_assert_int_eq(mock_mm_check(mm, n_mm, plen, NULL), KVO_OK);
        mock_keys k = {jstr(c, "lora_name"), jstr(c, "cache_salt"), mm, n_mm};
        mock_hash out[16];
        uint32_t nb = n / bs, np = plen / bs;
        ck_assert_int_eq(
            mock_hasher_blocks_keys(h, tok, bs, 0, np, NULL, &k, NULL, out),
            KVO_OK);
        for (uint32_t b = np; b < nb; b++)
            ck_assert_int_eq(mock_hasher_blocks_keys(h, tok, bs, b, 1,
                                                     b ? &out[b - 1] : NULL, &k,
                                                     NULL, &out[b]),
                             KVO_OK);
        json_object *blocks = json_object_object_get(c, "blocks");
        ck_assert_uint_eq(json_object_array_length(blocks), nb);
        for (uint32_t b = 0; b < nb; b++) {
            json_object *bj = json_object_array_get_idx(blocks, b);
            ck_assert_msg(out[b].key ==
                              ju64(json_object_object_get(bj, "low64")),
                          "%s block %u", name, b);
            checked++;
        }
        mock_hasher_free(h);
    }
    ck_assert_uint_ge(checked, 100);
    json_object_put(root);
}
END_TEST

/* The multimodal scan, rule by rule (vLLM's _gen_mm_extra_hash_keys). */
START_TEST(mm_block_keys_take_overlapping_items_with_offsets_from_the_block) {
    mock_mm_item mm[3] = {{2, 9, "a"}, {11, 2, "b"}, {16, 4, "c"}};
    wire_mm_key k[3];
    int64_t idx = 0;
    /* block [0,4): a at +2 */
    ck_assert_uint_eq(mock_mm_block_keys(mm, 3, 0, 4, &idx, k), 1);
    ck_assert_str_eq(k[0].id, "a");
    ck_assert_int_eq(k[0].offset, 2);
    ck_assert_int_eq(idx, 0);
    /* block [8,12): a ends in it (-6) and b starts (+3) */
    ck_assert_uint_eq(mock_mm_block_keys(mm, 3, 8, 12, &idx, k), 2);
    ck_assert_int_eq(k[0].offset, -6);
    ck_assert_str_eq(k[1].id, "b");
    ck_assert_int_eq(k[1].offset, 3);
    ck_assert_int_eq(idx, 1);
    /* block [12,16): b's tail (-1); c not reached */
    ck_assert_uint_eq(mock_mm_block_keys(mm, 3, 12, 16, &idx, k), 1);
    ck_assert_int_eq(k[0].offset, -1);
    ck_assert_int_eq(idx, 2);
    /* a block after every item: nothing, index kept (-1 stays -1) */
    idx = -1;
    ck_assert_uint_eq(mock_mm_block_keys(mm, 3, 20, 24, &idx, k), 0);
    ck_assert_int_eq(idx, -1);
    /* from the last item (-1): a block over a and c sees only c */
    idx = -1;
    ck_assert_uint_eq(mock_mm_block_keys(mm, 3, 0, 20, &idx, k), 1);
    ck_assert_str_eq(k[0].id, "c");
    ck_assert_int_eq(k[0].offset, 16);
    /* a fresh scan from item 0 over [12,16) skips a (passed) */
    idx = 0;
    ck_assert_uint_eq(mock_mm_block_keys(mm, 3, 12, 16, &idx, k), 1);
    ck_assert_str_eq(k[0].id, "b");
    /* the checks */
    uint32_t bad = 99;
    ck_assert_int_eq(mock_mm_check(mm, 3, 20, NULL), KVO_OK);
    ck_assert_int_eq(mock_mm_check(mm, 3, 19, &bad), KVO_EINVAL);
    ck_assert_uint_eq(bad, 2);
    mock_mm_item overlap[2] = {{0, 4, "a"}, {3, 1, "b"}};
    ck_assert_int_eq(mock_mm_check(overlap, 2, 10, &bad), KVO_EINVAL);
    ck_assert_uint_eq(bad, 1);
    mock_mm_item empty[1] = {{0, 0, "a"}}, noid[1] = {{0, 1, ""}};
    ck_assert_int_eq(mock_mm_check(empty, 1, 10, NULL), KVO_EINVAL);
    ck_assert_int_eq(mock_mm_check(noid, 1, 10, NULL), KVO_EINVAL);
}
END_TEST

/* extra_keys of the event's n blocks, decoded: out[i] gets block i's list
 * rendered as text, e.g. "lora|(img,2)|salt", "" for nil. */
static void extra_keys_text(const wire_event *e, char out[][128], uint32_t n) {
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    ck_assert(msgpack_unpack_next(&up, (const char *)e->extra_keys.p,
                                  e->extra_keys.len,
                                  &off) == MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(up.data.type, MSGPACK_OBJECT_ARRAY);
    ck_assert_uint_eq(up.data.via.array.size, n);
    for (uint32_t i = 0; i < n; i++) {
        msgpack_object *b = &up.data.via.array.ptr[i];
        out[i][0] = '\0';
        if (b->type == MSGPACK_OBJECT_NIL) continue;
        ck_assert_int_eq(b->type, MSGPACK_OBJECT_ARRAY);
        for (uint32_t j = 0; j < b->via.array.size; j++) {
            msgpack_object *x = &b->via.array.ptr[j];
            size_t l = strlen(out[i]);
            if (x->type == MSGPACK_OBJECT_STR) {
                snprintf(out[i] + l, 128 - l, "%s%.*s", j ? "|" : "",
                         (int)x->via.str.size, x->via.str.ptr);
            } else {
                ck_assert_int_eq(x->type, MSGPACK_OBJECT_ARRAY);
                ck_assert_uint_eq(x->via.array.size, 2);
                msgpack_object *id = &x->via.array.ptr[0],
                               *o = &x->via.array.ptr[1];
                ck_assert_int_eq(id->type, MSGPACK_OBJECT_STR);
                int64_t v = o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER
                                ? o->via.i64
                                : (int64_t)o->via.u64;
                snprintf(out[i] + l, 128 - l, "%s(%.*s,%lld)", j ? "|" : "",
                         (int)id->via.str.size, id->via.str.ptr, (long long)v);
            }
        }
    }
    msgpack_unpacked_destroy(&up);
}

/* A request with an adapter, a salt and two images: one BlockStored with
 * vLLM's lora_id/lora_name and, per block, the key tuple its hash used;
 * its hashes are the hasher's for the same keys. */
START_TEST(stored_events_carry_lora_fields_and_each_blocks_extra_keys) {
    mock_cfg c;
    mt_cfg(&c, 4, 64);
    c.lora_modules = "alpha=/x,beta";
    mt_eng m;
    mt_eng_init(&m, &c, 0);
    uint64_t tok[13];
    mt_iota(tok, 13, 100);
    mock_mm_item mm[2] = {{2, 5, "img-1"}, {8, 2, "img-2"}};
    mt_out out = {0};
    mock_req_in in = mt_req(tok, 13, 1, &out);
    in.lora_name = "beta";
    in.cache_salt = "tenant";
    in.mm = mm;
    in.n_mm = 2;
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
    ck_assert(mt_step(&m, NULL));
    ck_assert_uint_eq(m.last.n_events, 1);
    const wire_event *e = &m.last.events[0];
    ck_assert_int_eq(e->type, WIRE_EV_STORED);
    ck_assert_uint_eq(e->n_hashes, 3);
    ck_assert(e->lora_id.set &&
              e->lora_id.v == 2); /* beta, the second module */
    ck_assert(e->lora_name.len == 4 && memcmp(e->lora_name.p, "beta", 4) == 0);
    char ek[3][128];
    extra_keys_text(e, ek, 3);
    ck_assert_str_eq(ek[0], "beta|(img-1,2)|tenant");
    ck_assert_str_eq(ek[1], "beta|(img-1,-2)");
    ck_assert_str_eq(ek[2], "beta|(img-2,0)");
    mock_keys k = {"beta", "tenant", mm, 2};
    mock_hash h[3];
    ck_assert_int_eq(
        mock_hasher_blocks_keys(m.h, tok, 4, 0, 3, NULL, &k, NULL, h), KVO_OK);
    for (int i = 0; i < 3; i++) ck_assert(e->hashes[i].key == h[i].key);
    mt_eng_fini(&m);
}
END_TEST

/* The same tokens with no keys, another adapter, a salt or an image share
 * no block: each is a miss for the others, and all are published apart. */
START_TEST(equal_tokens_under_other_keys_never_share_a_block) {
    mt_eng m;
    mt_eng_start(&m, 4, 256);
    uint64_t tok[9];
    mt_iota(tok, 9, 7);
    mock_mm_item img = {0, 8, "img"}, img2 = {0, 8, "img2"},
                 shifted = {1, 7, "img"};
    struct {
        const char *lora, *salt;
        const mock_mm_item *mm;
    } v[] = {{NULL, NULL, NULL},  {"a", NULL, NULL},     {"b", NULL, NULL},
             {NULL, "s", NULL},   {"a", "s", NULL},      {NULL, NULL, &img},
             {NULL, NULL, &img2}, {NULL, NULL, &shifted}};
    enum { NV = sizeof(v) / sizeof(v[0]) };
    mock_hash h[NV][2];
    for (int i = 0; i < NV; i++) {
        mock_keys k = {v[i].lora, v[i].salt, v[i].mm, v[i].mm ? 1 : 0};
        ck_assert_int_eq(
            mock_hasher_blocks_keys(m.h, tok, 4, 0, 2, NULL, &k, NULL, h[i]),
            KVO_OK);
        for (int j = 0; j < i; j++)
            for (int b = 0; b < 2; b++)
                ck_assert_msg(h[i][b].key != h[j][b].key,
                              "variants %d and %d, block %d", j, i, b);
    }
    /* run variant 1 (adapter a): only its own hashes are cached */
    mt_out out = {0};
    mock_req_in in = mt_req(tok, 9, 1, &out);
    in.lora_name = "a";
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
    mt_run(&m, NULL, NULL);
    for (int i = 0; i < NV; i++)
        ck_assert_uint_eq(mock_engine_probe(m.e, h[i], 9), i == 1 ? 2 : 0);
    /* a second request under adapter a hits both blocks */
    mt_out o2 = {0};
    in.user = &o2;
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
    mt_run(&m, NULL, NULL);
    ck_assert_uint_eq(o2.cached, 8);
    mt_eng_fini(&m);
}
END_TEST

/* An adapter first named by a request gets the next id after the listed
 * modules; items that overlap or leave the prompt are refused. */
START_TEST(
    lora_ids_follow_the_modules_then_first_use_and_bad_items_are_refused) {
    mock_cfg c;
    mt_cfg(&c, 4, 64);
    c.lora_modules = "x,y=/p";
    ck_assert_uint_eq(mock_cfg_lora_module(&c, "y"), 2);
    ck_assert_uint_eq(mock_cfg_lora_module(&c, "z"), 0);
    ck_assert_int_eq(mock_cfg_lora_modules_check(&c), KVO_OK);
    mock_cfg bad = c;
    bad.lora_modules = "x,,y";
    ck_assert_int_eq(mock_cfg_lora_modules_check(&bad), KVO_EINVAL);
    bad.lora_modules = "x,y=1,x=2";
    ck_assert_int_eq(mock_cfg_lora_modules_check(&bad), KVO_EINVAL);
    mt_eng m;
    mt_eng_init(&m, &c, 0);
    uint64_t tok[5];
    mt_iota(tok, 5, 1);
    mt_out out = {0};
    mock_req_in in = mt_req(tok, 5, 1, &out);
    in.lora_name = "z";
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
    ck_assert(mt_step(&m, NULL));
    ck_assert(m.last.events[0].lora_id.set && m.last.events[0].lora_id.v == 3);
    mt_run(&m, NULL, NULL);
    mock_mm_item over[1] = {{3, 3, "i"}};
    in.lora_name = NULL;
    in.mm = over;
    in.n_mm = 1;
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_EINVAL);
    in.mm = NULL;
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL),
                     KVO_EINVAL); /* n_mm, no items */
    mt_eng_fini(&m);
}
END_TEST

Suite *suite_keys(void) {
    const TTest *tests[] = {
        request_hashes_follow_vllms_extra_key_rules_on_every_vector,
        mm_block_keys_take_overlapping_items_with_offsets_from_the_block,
        stored_events_carry_lora_fields_and_each_blocks_extra_keys,
        equal_tokens_under_other_keys_never_share_a_block,
        lora_ids_follow_the_modules_then_first_use_and_bad_items_are_refused,
    };
    return mt_suite(suite_create("keys"), 60, tests, KVO_ARRAY_LEN(tests));
}
