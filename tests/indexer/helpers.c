/* helpers.c -- fixtures, event builders and assertions for the indexer
 * suites (see idx_test.h). */
#include "idx_test.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

idx_tree *tt_tree_new(void) {
    idx_tree *t = NULL;
    ck_assert_int_eq(idx_tree_new(&t), KVO_OK);
    return t;
}

void tt_tree_done(idx_tree *t) {
    tt_check(t, true);
    idx_tree_free(t);
}

uint64_t tt_nodes(const idx_tree *t) {
    idx_stats st;
    idx_tree_stats(t, &st);
    return st.nodes;
}

uint64_t tt_pairs(const idx_tree *t) {
    idx_stats st;
    idx_tree_stats(t, &st);
    return st.pairs;
}

idx_evstatus tt_store_bh(idx_tree *t, uint64_t wid, uint32_t rank,
                         const uint64_t *parent, const uint64_t *tok,
                         const uint64_t *bh, size_t n) {
    wire_rblock *b = kvo_calloc(n ? n : 1, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n; i++) b[i] = (wire_rblock){bh[i], tok[i]};
    wire_revent ev = {.worker_id = wid,
                      .dp_rank = rank,
                      .type = WIRE_R_STORED,
                      .has_parent = parent != NULL,
                      .parent_hash = parent ? *parent : 0,
                      .n_blocks = (uint32_t)n,
                      .blocks = b};
    idx_evstatus st = IDX_EV_STATUS_COUNT;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    kvo_free(b);
    return st;
}

idx_evstatus tt_store(idx_tree *t, uint64_t wid, uint32_t rank,
                      const uint64_t *parent, const uint64_t *tok, size_t n) {
    uint64_t *bh = kvo_calloc(n ? n : 1, sizeof(uint64_t));
    ck_assert_ptr_nonnull(bh);
    for (size_t i = 0; i < n; i++) bh[i] = tok[i] * 100;
    idx_evstatus st = tt_store_bh(t, wid, rank, parent, tok, bh, n);
    kvo_free(bh);
    return st;
}

idx_evstatus tt_remove(idx_tree *t, uint64_t wid, uint32_t rank,
                       const uint64_t *bh, size_t n) {
    wire_revent ev = {.worker_id = wid,
                      .dp_rank = rank,
                      .type = WIRE_R_REMOVED,
                      .n_removed = (uint32_t)n,
                      .removed = (uint64_t *)bh};
    idx_evstatus st = IDX_EV_STATUS_COUNT;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    return st;
}

idx_evstatus tt_clear(idx_tree *t, uint64_t wid, uint32_t rank) {
    wire_revent ev = {
        .worker_id = wid, .dp_rank = rank, .type = WIRE_R_CLEARED};
    idx_evstatus st = IDX_EV_STATUS_COUNT;
    ck_assert_int_eq(idx_tree_apply(t, &ev, &st), KVO_OK);
    return st;
}

uint32_t tt_score(idx_tree *t, const uint64_t *q, size_t n, uint64_t wid,
                  uint32_t rank) {
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, q, n, &s), KVO_OK);
    uint32_t r = 0;
    for (size_t i = 0; i < s.n; i++) {
        ck_assert_uint_gt(s.v[i].blocks, 0);
        if (s.v[i].worker_id == wid && s.v[i].dp_rank == rank)
            r = s.v[i].blocks;
    }
    idx_scores_fini(&s);
    return r;
}

size_t tt_nscores(idx_tree *t, const uint64_t *q, size_t n) {
    idx_scores s;
    idx_scores_init(&s);
    ck_assert_int_eq(idx_tree_query(t, q, n, &s), KVO_OK);
    size_t k = s.n;
    idx_scores_fini(&s);
    return k;
}

uint64_t tt_blocks(const idx_tree *t, uint64_t wid, uint32_t rank) {
    idx_worker *w;
    size_t n;
    ck_assert_int_eq(idx_tree_workers(t, &w, &n), KVO_OK);
    uint64_t r = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (w[i].worker_id == wid && w[i].dp_rank == rank) r = w[i].blocks;
    kvo_free(w);
    return r;
}

void tt_check(const idx_tree *t, bool strict) {
    char msg[256] = "";
    uint64_t unreachable = 0;
    kvo_status s = idx_tree_check(t, &unreachable, msg, sizeof(msg));
    ck_assert_msg(s == KVO_OK, "invariant: %s", msg);
    if (strict)
        ck_assert_msg(unreachable == 0, "%llu unreachable nodes",
                      (unsigned long long)unreachable);
}

typedef struct restore {
    idx_tree *into;
    size_t events, rejected;
} restore;

static kvo_status restore_one(void *ctx, const wire_revent *ev) {
    restore *r = ctx;
    ck_assert_int_eq(ev->type, WIRE_R_STORED);
    ck_assert_int_lt(ev->tier, WIRE_TIER_COUNT);
    ck_assert_uint_eq(ev->n_blocks, 1);
    ck_assert_uint_eq(ev->event_id, r->events);
    r->events++;
    idx_evstatus st;
    ck_assert_int_eq(idx_tree_apply(r->into, ev, &st), KVO_OK);
    ck_assert(st == IDX_EV_OK || st == IDX_EV_PARENT_NOT_FOUND);
    r->rejected += st == IDX_EV_PARENT_NOT_FOUND;
    return KVO_OK;
}

idx_tree *tt_restore(const idx_tree *t, size_t *events, size_t *rejected) {
    restore r = {tt_tree_new(), 0, 0};
    ck_assert_int_eq(idx_tree_dump(t, restore_one, &r), KVO_OK);
    if (events) *events = r.events;
    if (rejected) *rejected = r.rejected;
    return r.into;
}

void tt_same_answers(idx_tree *a, idx_tree *b, const uint64_t *q, size_t n) {
    idx_scores x, y;
    idx_scores_init(&x);
    idx_scores_init(&y);
    ck_assert_int_eq(idx_tree_query(a, q, n, &x), KVO_OK);
    ck_assert_int_eq(idx_tree_query(b, q, n, &y), KVO_OK);
    ck_assert_uint_eq(x.isl_blocks, y.isl_blocks);
    ck_assert_uint_eq(x.n, y.n);
    if (x.n) ck_assert_mem_eq(x.v, y.v, x.n * sizeof(idx_score));
    idx_scores_fini(&x);
    idx_scores_fini(&y);
}

const char *const tt_plane_sequence[4] = {"stored_two_blocks", "removed_one",
                                          "cleared", "mixed_dp2"};

uint8_t *tt_vector(const char *name, size_t *len) {
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/vectors/event_plane/%s.bin", name);
    char *path = kt_src_path(rel);
    uint8_t *b = kt_read_file(path, len);
    kvo_free(path);
    return b;
}

uint8_t *tt_plane(uint64_t pub, uint64_t seq, uint64_t published_at,
                  const wire_revent *evs, uint32_t n, size_t *len) {
    wire_plane_msg m;
    wire_plane_init(&m);
    m.publisher_id = pub;
    m.sequence = seq;
    m.published_at = published_at;
    m.topic = (wire_str){"kv-events", 9};
    m.n_events = n;
    m.events = (wire_revent *)evs; /* read only */
    kvo_buf out;
    kvo_buf_init(&out);
    ck_assert_int_eq(wire_plane_encode(&m, &out), KVO_OK);
    m.events = NULL;
    m.n_events = 0;
    wire_plane_fini(&m);
    *len = out.len;
    return out.data;
}

uint8_t *tt_envelope(uint64_t pub, uint64_t seq, uint64_t worker,
                     wire_tier tier, uint32_t n, size_t *len) {
    wire_rblock *b = kvo_calloc(n ? n : 1, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    for (uint32_t i = 0; i < n; i++) b[i] = (wire_rblock){100 * (i + 1), i + 1};
    wire_revent ev = {.worker_id = worker,
                      .tier = tier,
                      .event_id = seq + 1,
                      .type = WIRE_R_STORED,
                      .n_blocks = n,
                      .blocks = b};
    uint8_t *out = tt_plane(pub, seq, 1700000000000ull + seq, &ev, 1, len);
    kvo_free(b);
    return out;
}

idx_feed *tt_feed_new(void) {
    idx_feed *f = NULL;
    ck_assert_int_eq(idx_feed_new(&f, NULL), KVO_OK);
    return f;
}

idx_feed *tt_feed_of(const char *name, ...) {
    idx_feed *f = tt_feed_new();
    va_list ap;
    va_start(ap, name);
    for (; name; name = va_arg(ap, const char *))
        ck_assert_msg(tt_feed_vector(f, name, NULL) == KVO_OK, "%s", name);
    va_end(ap);
    return f;
}

kvo_status tt_feed_vector(idx_feed *f, const char *name, const char *hdr) {
    size_t len;
    uint8_t *b = tt_vector(name, &len);
    kvo_err err;
    kvo_status s = idx_feed_message(f, b, len, hdr, NULL, &err);
    kvo_free(b);
    return s;
}

json_object *tt_json_at(json_object *o, const char *path) {
    char key[128];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ".");
        ck_assert_uint_lt(n, sizeof(key));
        memcpy(key, p, n);
        key[n] = '\0';
        json_object *v = NULL;
        ck_assert_msg(json_object_object_get_ex(o, key, &v) && v,
                      "%s: no member %s", path, key);
        o = v;
        p += n + (p[n] == '.');
    }
    return o;
}

uint64_t tt_json_u64(json_object *o, const char *path) {
    json_object *v = tt_json_at(o, path);
    ck_assert_msg(json_object_is_type(v, json_type_int), "%s: not an integer",
                  path);
    return json_object_get_uint64(v);
}

void tt_json_eq(json_object *j, const char *want) {
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN),
                     want);
    json_object_put(j);
}
