/* test_views: GET /blocks's and POST /lookup's answers (idx_views.c) built
 * from a tree, without HTTP: the digest against its definition, pages that
 * add up to the set, the cache following the feed's generation, and who
 * else holds a block. */
#include "idx_test.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* The answer of idx_blocks_json as JSON (put by the caller). */
static json_object *page(const idx_blockset *bs, bool has_after, uint64_t after,
                         size_t limit, bool digest_only) {
    idx_page pg = {.has_after = has_after, .after = after, .limit = limit};
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(idx_blocks_json(bs, &pg, digest_only, &b), KVO_OK);
    kvo_buf_cstr(&b);
    json_object *j = json_tokener_parse((const char *)b.data);
    ck_assert_msg(j, "not JSON: %s", (const char *)b.data);
    kvo_buf_fini(&b);
    return j;
}

START_TEST(blocks_digest_is_the_sum_of_its_definition) {
    idx_feed *f = tt_feed_new();
    idx_tree *t = idx_feed_tree(f);
    /* worker (1, 0): a chain 10 -> 20 -> 30 and a root block 7; worker
     * (1, 1): 10 only; worker (2, 0): 10 -> 20 */
    ck_assert_int_eq(
        tt_store_bh(t, 1, 0, NULL, U64S(1, 2, 3), U64S(10, 20, 30), 3),
        IDX_EV_OK);
    ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, U64S(9), U64S(7), 1),
                     IDX_EV_OK);
    ck_assert_int_eq(tt_store_bh(t, 1, 1, NULL, U64S(1), U64S(10), 1),
                     IDX_EV_OK);
    ck_assert_int_eq(tt_store_bh(t, 2, 0, NULL, U64S(1, 2), U64S(10, 20), 2),
                     IDX_EV_OK);
    /* the definition, spelled out once */
    ck_assert_uint_eq(idx_block_digest(20, 10),
                      kvo_mix64(20 ^ kvo_mix64(10 + 0x9E3779B97F4A7C15ull)));
    uint64_t want = idx_block_digest(10, 0) + idx_block_digest(20, 10) +
                    idx_block_digest(30, 20) + idx_block_digest(7, 0);
    uint64_t n, d;
    ck_assert_int_eq(idx_blocks_digest(t, 1, 0, WIRE_TIER_DEVICE, &n, &d),
                     KVO_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(d, want);
    idx_blockset bs;
    idx_blockset_init(&bs);
    ck_assert_int_eq(idx_blockset_load(&bs, t, idx_feed_generation(f), 1, 0,
                                       WIRE_TIER_DEVICE),
                     KVO_OK);
    char exact[256];
    snprintf(exact, sizeof(exact),
             "{\"worker_id\":1,\"dp_rank\":0,\"count\":4,\"digest\":%" PRIu64
             ",\"blocks\":[[7,null],[10,null],[20,10],[30,20]]}",
             want);
    tt_json_eq(page(&bs, false, 0, 0, false), exact);
    /* the order of stores does not change it: (1, 1) and (2, 0) */
    ck_assert_int_eq(idx_blocks_digest(t, 1, 1, WIRE_TIER_DEVICE, &n, &d),
                     KVO_OK);
    ck_assert_uint_eq(d, idx_block_digest(10, 0));
    ck_assert_int_eq(idx_blocks_digest(t, 2, 0, WIRE_TIER_DEVICE, &n, &d),
                     KVO_OK);
    ck_assert_uint_eq(d, idx_block_digest(10, 0) + idx_block_digest(20, 10));
    /* unknown: nothing */
    ck_assert_int_eq(idx_blocks_digest(t, 5, 0, WIRE_TIER_DEVICE, &n, &d),
                     KVO_OK);
    ck_assert_uint_eq(n + d, 0);
    ck_assert_int_eq(idx_blockset_load(&bs, t, idx_feed_generation(f), 5, 0,
                                       WIRE_TIER_DEVICE),
                     KVO_OK);
    tt_json_eq(page(&bs, false, 0, 0, false),
               "{\"worker_id\":5,\"dp_rank\":0,\"count\":0,\"digest\":0,"
               "\"blocks\":[]}");
    idx_blockset_fini(&bs);
    idx_feed_free(f);
}
END_TEST

/* 250 blocks in pages of 100: 100, 100, 50, sorted, "next" on all but the
 * last, adding up to the count and the digest; a reload when the feed
 * changed the tree. */
START_TEST(blocks_pages_add_up_and_follow_the_feed) {
    idx_feed *f = tt_feed_new();
    size_t len;
    uint8_t *b = tt_envelope(1, 0, 4, WIRE_TIER_DEVICE, 250, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, NULL, NULL, NULL), KVO_OK);
    kvo_free(b);
    idx_blockset bs;
    idx_blockset_init(&bs);
    ck_assert_int_eq(idx_blockset_load(&bs, idx_feed_tree(f),
                                       idx_feed_generation(f), 4, 0,
                                       WIRE_TIER_DEVICE),
                     KVO_OK);
    uint64_t digest = 0, seen = 0, after = 0, total = 0;
    bool has_after = false;
    for (int p = 0; p < 3; p++) {
        json_object *j = page(&bs, has_after, after, 100, false);
        json_object *a = tt_json_at(j, "blocks"), *next;
        ck_assert_uint_eq(json_object_array_length(a), p < 2 ? 100 : 50);
        for (size_t i = 0; i < json_object_array_length(a); i++, seen++) {
            json_object *e = json_object_array_get_idx(a, i);
            uint64_t h =
                json_object_get_uint64(json_object_array_get_idx(e, 0));
            json_object *pj = json_object_array_get_idx(e, 1);
            ck_assert_uint_eq(h, 100 * (seen + 1));
            digest += idx_block_digest(h, pj ? json_object_get_uint64(pj) : 0);
        }
        ck_assert(json_object_object_get_ex(j, "next", &next) == (p < 2));
        if (p < 2) ck_assert_uint_eq(tt_json_u64(j, "next"), 100 * seen);
        total = tt_json_u64(j, "digest");
        has_after = true;
        after = 100 * seen;
        json_object_put(j);
    }
    ck_assert_uint_eq(seen, 250);
    ck_assert_uint_eq(digest, total);
    /* past the last: an empty page, no "next" */
    json_object *j = page(&bs, true, after, 100, false), *next;
    ck_assert_uint_eq(json_object_array_length(tt_json_at(j, "blocks")), 0);
    ck_assert(!json_object_object_get_ex(j, "next", &next));
    json_object_put(j);
    /* digest only: the head alone */
    char exact[160];
    snprintf(exact, sizeof(exact),
             "{\"worker_id\":4,\"dp_rank\":0,\"count\":250,\"digest\":%" PRIu64
             "}",
             total);
    tt_json_eq(page(&bs, false, 0, 0, true), exact);
    /* the feed changes the tree: the same (worker, rank) loads again */
    uint64_t gen = idx_feed_generation(f);
    b = tt_envelope(1, 1, 4, WIRE_TIER_DEVICE, 260, &len);
    ck_assert_int_eq(idx_feed_message(f, b, len, NULL, NULL, NULL), KVO_OK);
    kvo_free(b);
    ck_assert_uint_ne(idx_feed_generation(f), gen);
    ck_assert_int_eq(
        idx_blockset_load(&bs, idx_feed_tree(f), gen, 4, 0, WIRE_TIER_DEVICE),
        KVO_OK);
    ck_assert_uint_eq(bs.n, 250); /* the cached one: same generation asked */
    ck_assert_int_eq(idx_blockset_load(&bs, idx_feed_tree(f),
                                       idx_feed_generation(f), 4, 0,
                                       WIRE_TIER_DEVICE),
                     KVO_OK);
    ck_assert_uint_eq(bs.n, 260);
    idx_blockset_fini(&bs);
    idx_feed_free(f);
}
END_TEST

/* POST /lookup's answer for (w, r) and hashes; tokens (NULL: no chain)
 * with the first block's parent (NULL: none). */
static json_object *lookup(const idx_tree *t, uint64_t w, uint32_t r,
                           const uint64_t *hashes, size_t n,
                           const uint64_t *tokens, const uint64_t *parent) {
    idx_request q;
    memset(&q, 0, sizeof(q));
    q.kind = IDX_REQ_LOOKUP;
    q.worker_id = w;
    q.dp_rank = r;
    q.v = hashes;
    q.n = n;
    q.tokens = tokens;
    q.has_first_parent = parent != NULL;
    q.first_parent = parent ? *parent : 0;
    return idx_json_lookup(t, &q);
}

/* Who holds a block: ten workers hold one chain, the first 8 others are
 * listed (sorted), the count is whole; for a worker that does not hold
 * it, the holders; for a hash nobody holds, none. */
START_TEST(lookup_says_who_else_holds_a_block) {
    idx_tree *t = tt_tree_new();
    for (uint64_t w = 10; w > 0; w--) /* stored in reverse order */
        ck_assert_int_eq(
            tt_store_bh(t, w, 0, NULL, U64S(1, 2), U64S(100, 200), 2),
            IDX_EV_OK);
    json_object *j = lookup(t, 1, 0, U64S(200, 300), 2, NULL, NULL);
    tt_json_eq(j, "{\"blocks\":[{\"block_hash\":200,\"held\":true,"
                  "\"tokens_hash\":2,\"parent_hash\":100,\"in_set\":true,"
                  "\"others\":9,\"other_holders\":[[2,0],[3,0],[4,0],[5,0],"
                  "[6,0],[7,0],[8,0],[9,0]]},{\"block_hash\":300,"
                  "\"held\":false,\"tokens_hash\":null,\"parent_hash\":null,"
                  "\"in_set\":false,\"others\":0,\"other_holders\":[]}]}");
    j = lookup(t, 11, 3, U64S(100), 1, NULL, NULL);
    tt_json_eq(j, "{\"blocks\":[{\"block_hash\":100,\"held\":false,"
                  "\"tokens_hash\":null,\"parent_hash\":null,\"in_set\":false,"
                  "\"others\":10,\"other_holders\":[[1,0],[2,0],[3,0],[4,0],"
                  "[5,0],[6,0],[7,0],[8,0]]}]}");
    tt_json_eq(lookup(t, 1, 0, NULL, 0, NULL, NULL), "{\"blocks\":[]}");
    tt_tree_done(t);
}
END_TEST

/* Where a worker holds a block's tokens under another hash: under the
 * engine's parent (the engine published another hash for the same
 * tokens), or under the root (the store lost its parent). */
START_TEST(lookup_finds_the_tokens_under_another_hash) {
    idx_tree *t = tt_tree_new();
    ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, U64S(1, 2), U64S(100, 200), 2),
                     IDX_EV_OK);
    ck_assert_int_eq(tt_store_bh(t, 1, 0, NULL, U64S(3), U64S(350), 1),
                     IDX_EV_OK);
    /* the engine's chain: 100, 201 (tokens 2), 300 (tokens 3) */
    json_object *j =
        lookup(t, 1, 0, U64S(100, 201, 300), 3, U64S(1, 2, 3), NULL);
    json_object *b = tt_json_at(j, "blocks");
    tt_json_eq(json_object_get(json_object_array_get_idx(b, 0)),
               "{\"block_hash\":100,\"held\":true,\"tokens_hash\":1,"
               "\"parent_hash\":null,\"in_set\":true,\"others\":0,"
               "\"other_holders\":[],\"tokens_found\":null}");
    tt_json_eq(json_object_get(
                   tt_json_at(json_object_array_get_idx(b, 1), "tokens_found")),
               "{\"under\":\"parent\",\"block_hash\":200}");
    /* 300's parent is 201, which worker 1 does not hold: the root has it */
    tt_json_eq(json_object_get(
                   tt_json_at(json_object_array_get_idx(b, 2), "tokens_found")),
               "{\"under\":\"root\",\"block_hash\":350}");
    json_object_put(j);
    /* another worker holds none of it; a first block with a parent */
    j = lookup(t, 2, 0, U64S(201), 1, U64S(2), U64S(100));
    json_object *tf = (json_object *)1;
    ck_assert(json_object_object_get_ex(
        json_object_array_get_idx(tt_json_at(j, "blocks"), 0), "tokens_found",
        &tf));
    ck_assert_ptr_null(tf);
    json_object_put(j);
    j = lookup(t, 1, 0, U64S(201), 1, U64S(2), U64S(100));
    tt_json_eq(json_object_get(tt_json_at(
                   json_object_array_get_idx(tt_json_at(j, "blocks"), 0),
                   "tokens_found")),
               "{\"under\":\"parent\",\"block_hash\":200}");
    json_object_put(j);
    tt_tree_done(t);
}
END_TEST

Suite *suite_views(void) {
    Suite *s = suite_create("views");
    TCase *tc = tcase_create("views");
    tcase_add_test(tc, blocks_digest_is_the_sum_of_its_definition);
    tcase_add_test(tc, blocks_pages_add_up_and_follow_the_feed);
    tcase_add_test(tc, lookup_says_who_else_holds_a_block);
    tcase_add_test(tc, lookup_finds_the_tokens_under_another_hash);
    suite_add_tcase(s, tc);
    return s;
}
