/* idx_views.c -- read-only views of one (worker, rank) for kvo-check:
 * its whole block set with a digest (GET /blocks, full-state checkpoints)
 * and what the index knows of given block hashes (POST /lookup,
 * diagnosis). idx_int.h draws both answers. Pure: a tree in, JSON out;
 * at the end, the two HTTP routes both listeners serve them on.
 *
 * The digest is a sum of a mixed value per block, so it does not depend on
 * any order and the engine side (kvo-mocker) computes the same number from
 * its cached blocks without sorting them.
 */
#include "idx_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define BLOCKS_FIRST_CAP 1024

void idx_blockset_init(idx_blockset *bs) { memset(bs, 0, sizeof(*bs)); }

void idx_blockset_fini(idx_blockset *bs) {
    kvo_free(bs->v);
    memset(bs, 0, sizeof(*bs));
}

static uint64_t digest_of(const idx_block *b) {
    return idx_block_digest(b->block_hash,
                            b->has_parent ? b->parent_block_hash : 0);
}

typedef struct collect {
    idx_blockset *bs;
} collect;

static kvo_status collect_one(void *ctx, const idx_block *b) {
    idx_blockset *bs = ((collect *)ctx)->bs;
    kvo_status s =
        kvo_grow(&bs->v, &bs->cap, bs->n + 1, sizeof(*bs->v), BLOCKS_FIRST_CAP);
    if (s != KVO_OK) return s;
    bs->v[bs->n++] = *b;
    bs->digest += digest_of(b);
    return KVO_OK;
}

static int by_hash(const void *a, const void *b) {
    uint64_t x = ((const idx_block *)a)->block_hash;
    uint64_t y = ((const idx_block *)b)->block_hash;
    return (x > y) - (x < y);
}

kvo_status idx_blockset_load(idx_blockset *bs, const idx_tree *t, uint64_t gen,
                             uint64_t worker_id, uint32_t dp_rank,
                             wire_tier tier) {
    if (bs->loaded && bs->tree == t && bs->gen == gen &&
        bs->worker_id == worker_id && bs->dp_rank == dp_rank &&
        bs->tier == tier)
        return KVO_OK;
    bs->loaded = false;
    bs->n = 0;
    bs->digest = 0;
    collect c = {bs};
    kvo_status s =
        idx_tree_worker_blocks(t, worker_id, dp_rank, tier, collect_one, &c);
    if (s != KVO_OK) {
        bs->n = 0;
        bs->digest = 0;
        return s;
    }
    if (bs->n > 1) qsort(bs->v, bs->n, sizeof(*bs->v), by_hash);
    bs->loaded = true;
    bs->tree = t;
    bs->gen = gen;
    bs->worker_id = worker_id;
    bs->dp_rank = dp_rank;
    bs->tier = tier;
    return KVO_OK;
}

typedef struct sum {
    uint64_t count, digest;
} sum;

static kvo_status sum_one(void *ctx, const idx_block *b) {
    sum *s = ctx;
    s->count++;
    s->digest += digest_of(b);
    return KVO_OK;
}

kvo_status idx_blocks_digest(const idx_tree *t, uint64_t worker_id,
                             uint32_t dp_rank, wire_tier tier, uint64_t *count,
                             uint64_t *digest) {
    sum s = {0, 0};
    kvo_status st =
        idx_tree_worker_blocks(t, worker_id, dp_rank, tier, sum_one, &s);
    if (st != KVO_OK) return st;
    *count = s.count;
    *digest = s.digest;
    return KVO_OK;
}

/* The answer's head; "tier" only for a lower tier (the device answer kept
 * its shape). */
static kvo_status head(kvo_buf *out, uint64_t w, uint32_t r, wire_tier tier,
                       uint64_t count, uint64_t digest) {
    kvo_status s = kvo_buf_printf(
        out, "{\"worker_id\":%" PRIu64 ",\"dp_rank\":%" PRIu32, w, r);
    if (s == KVO_OK && tier != WIRE_TIER_DEVICE)
        s = kvo_buf_printf(out, ",\"tier\":\"%s\"", wire_tier_name(tier));
    if (s != KVO_OK) return s;
    return kvo_buf_printf(out, ",\"count\":%" PRIu64 ",\"digest\":%" PRIu64,
                          count, digest);
}

kvo_status idx_blocks_digest_json(uint64_t worker_id, uint32_t dp_rank,
                                  wire_tier tier, uint64_t count,
                                  uint64_t digest, kvo_buf *out) {
    kvo_status s = head(out, worker_id, dp_rank, tier, count, digest);
    return s == KVO_OK ? kvo_buf_append(out, "}", 1) : s;
}

/* The first position of bs->v above h. */
static size_t above(const idx_blockset *bs, uint64_t h) {
    size_t lo = 0, hi = bs->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (bs->v[mid].block_hash <= h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

kvo_status idx_blocks_json(const idx_blockset *bs, const idx_page *pg,
                           bool digest_only, kvo_buf *out) {
    kvo_status s =
        head(out, bs->worker_id, bs->dp_rank, bs->tier, bs->n, bs->digest);
    if (s != KVO_OK || digest_only)
        return s == KVO_OK ? kvo_buf_append(out, "}", 1) : s;
    size_t from = pg && pg->has_after ? above(bs, pg->after) : 0;
    size_t limit = pg && pg->limit ? pg->limit : IDX_BLOCKS_PAGE;
    size_t to = bs->n - from > limit ? from + limit : bs->n;
    /* at most 46 bytes a block: [20 digits,20 digits], */
    if ((s = kvo_buf_reserve(out, (to - from) * 46 + 64)) != KVO_OK) return s;
    s = kvo_buf_append(out, ",\"blocks\":[", 11);
    for (size_t i = from; s == KVO_OK && i < to; i++) {
        const idx_block *b = &bs->v[i];
        if (b->has_parent)
            s = kvo_buf_printf(out, "%s[%" PRIu64 ",%" PRIu64 "]",
                               i > from ? "," : "", b->block_hash,
                               b->parent_block_hash);
        else
            s = kvo_buf_printf(out, "%s[%" PRIu64 ",null]", i > from ? "," : "",
                               b->block_hash);
    }
    if (s == KVO_OK) s = kvo_buf_append(out, "]", 1);
    if (s == KVO_OK && to < bs->n && to > from)
        s = kvo_buf_printf(out, ",\"next\":%" PRIu64, bs->v[to - 1].block_hash);
    if (s == KVO_OK) s = kvo_buf_append(out, "}", 1);
    return s;
}

/* ---- POST /lookup ---------------------------------------------------------*/

typedef struct holder {
    uint64_t worker_id;
    uint32_t dp_rank;
} holder;

static int by_slot(const void *a, const void *b) {
    const holder *x = a, *y = b;
    if (x->worker_id != y->worker_id)
        return x->worker_id < y->worker_id ? -1 : 1;
    return (x->dp_rank > y->dp_rank) - (x->dp_rank < y->dp_rank);
}

static json_object *u64(uint64_t v) { return json_object_new_uint64(v); }

static bool add(json_object *o, const char *k, json_object *v) {
    if (json_object_object_add(o, k, v) == 0) return true;
    json_object_put(v);
    return false;
}

/* One entry of the answer; ws: the known workers (for a hash w does not
 * hold: who else does). */
static json_object *entry(const idx_tree *t, uint64_t w, uint32_t r, uint64_t h,
                          const idx_worker *ws, size_t nw) {
    idx_block_info in;
    if (idx_tree_block_info(t, w, r, h, &in) != KVO_OK) return NULL;
    holder list[IDX_INFO_OTHERS + 1];
    size_t listed = 0;
    uint64_t others = 0;
    if (in.held) {
        others = in.others;
        for (uint32_t i = 0; i < in.listed; i++)
            list[listed++] =
                (holder){in.other[i].worker_id, in.other[i].dp_rank};
    } else {
        for (size_t j = 0; j < nw; j++) {
            if (ws[j].worker_id == w && ws[j].dp_rank == r) continue;
            idx_block_info o;
            if (idx_tree_block_info(t, ws[j].worker_id, ws[j].dp_rank, h, &o) !=
                    KVO_OK ||
                !o.held)
                continue;
            others = (uint64_t)o.others + 1;
            list[listed++] = (holder){ws[j].worker_id, ws[j].dp_rank};
            for (uint32_t i = 0; i < o.listed; i++)
                if (o.other[i].worker_id != w || o.other[i].dp_rank != r)
                    list[listed++] =
                        (holder){o.other[i].worker_id, o.other[i].dp_rank};
                else
                    others--; /* w is in the set without holding h */
            qsort(list, listed, sizeof(*list), by_slot);
            if (listed > IDX_INFO_OTHERS) listed = IDX_INFO_OTHERS;
            break;
        }
    }
    json_object *e = json_object_new_object(), *a = json_object_new_array();
    if (!e || !a) {
        json_object_put(e);
        json_object_put(a);
        return NULL;
    }
    bool ok = add(e, "block_hash", u64(h)) &&
              add(e, "held", json_object_new_boolean(in.held));
    ok = ok && (in.held ? add(e, "tokens_hash", u64(in.block.tokens_hash))
                        : json_object_object_add(e, "tokens_hash", NULL) == 0);
    ok = ok && (in.held && in.block.has_parent
                    ? add(e, "parent_hash", u64(in.block.parent_block_hash))
                    : json_object_object_add(e, "parent_hash", NULL) == 0);
    ok = ok &&
         add(e, "in_set", json_object_new_boolean(in.held && in.in_set)) &&
         add(e, "others", u64(others));
    for (size_t i = 0; ok && i < listed; i++) {
        json_object *pair = json_object_new_array_ext(2);
        ok = pair && json_object_array_add(pair, u64(list[i].worker_id)) == 0 &&
             json_object_array_add(pair, u64(list[i].dp_rank)) == 0 &&
             json_object_array_add(a, pair) == 0;
        if (!ok) json_object_put(pair);
    }
    if (!ok || !add(e, "other_holders", a)) {
        if (!ok) json_object_put(a);
        json_object_put(e);
        return NULL;
    }
    return e;
}

/* Entry e (block i) of a lookup with a chain: where (W, R) holds block
 * i's tokens under another hash, when e says it does not hold its hash. */
static bool add_found(json_object *e, const idx_tree *t, const idx_request *q,
                      size_t i) {
    bool held = json_object_get_boolean(json_object_object_get(e, "held"));
    uint64_t bh = 0;
    bool has_parent = i ? true : q->has_first_parent;
    uint64_t parent = i ? q->v[i - 1] : q->first_parent;
    idx_found f =
        held ? IDX_FOUND_NONE
             : idx_tree_find_tokens(t, q->worker_id, q->dp_rank, has_parent,
                                    parent, q->tokens[i], &bh);
    if (f == IDX_FOUND_NONE)
        return json_object_object_add(e, "tokens_found", NULL) == 0;
    json_object *o = json_object_new_object();
    if (!o) return false;
    bool ok = add(o, "under",
                  json_object_new_string(
                      f == IDX_FOUND_UNDER_ROOT ? "root" : "parent")) &&
              add(o, "block_hash", u64(bh));
    if (!ok || !add(e, "tokens_found", o)) {
        json_object_put(o);
        return false;
    }
    return true;
}

json_object *idx_json_lookup(const idx_tree *t, const idx_request *q) {
    idx_worker *ws = NULL;
    size_t nw = 0;
    if (idx_tree_workers(t, &ws, &nw) != KVO_OK) return NULL;
    json_object *o = json_object_new_object();
    json_object *a = json_object_new_array_ext((int)q->n);
    bool ok = o && a;
    for (size_t i = 0; ok && i < q->n; i++) {
        json_object *e = entry(t, q->worker_id, q->dp_rank, q->v[i], ws, nw);
        ok = e && (!q->tokens || add_found(e, t, q, i)) &&
             json_object_array_add(a, e) == 0;
        if (e && !ok) json_object_put(e);
    }
    kvo_free(ws);
    if (ok && add(o, "blocks", a)) return o;
    if (!ok) json_object_put(a);
    json_object_put(o);
    return NULL;
}

/* ---- The views on HTTP (both listeners) -----------------------------------*/

/* ?after=K&limit=N into pg (limit 1..max, default max). false with a
 * message in err when either is malformed. */
bool idx_http_page_args(kvo_http_req *r, size_t max, idx_page *pg, char *err,
                        size_t errsz) {
    const char *a = kvo_http_req_arg(r, "after"),
               *l = kvo_http_req_arg(r, "limit");
    uint64_t n = max;
    memset(pg, 0, sizeof(*pg));
    if (a && kvo_parse_u64(a, &pg->after) != KVO_OK) {
        snprintf(err, errsz, "after must be an integer in 0..%" PRIu64,
                 UINT64_MAX);
        return false;
    }
    if (l && (kvo_parse_u64(l, &n) != KVO_OK || n == 0 || n > max)) {
        snprintf(err, errsz, "limit must be 1..%zu", max);
        return false;
    }
    pg->has_after = a != NULL;
    pg->limit = (size_t)n;
    return true;
}

/* A required query argument: an integer in 0..max. */
static bool arg_u64(kvo_http_req *r, const char *name, uint64_t max,
                    uint64_t *out, char *err, size_t errsz) {
    const char *a = kvo_http_req_arg(r, name);
    if (!a || kvo_parse_u64(a, out) != KVO_OK || *out > max) {
        snprintf(err, errsz, "%s must be an integer in 0..%" PRIu64, name, max);
        return false;
    }
    return true;
}

/* GET /blocks?worker_id=W&dp_rank=R[&tier=T][&after=H&limit=N]
 * [&digest_only=1] (idx_int.h draws the answer; T a storage_tier name,
 * device by default). */
void idx_http_blocks(kvo_http_req *r, idx_tree_of_fn tree_of, void *ctx,
                     idx_blockset *cache, uint64_t *bad_requests) {
    char err[160];
    uint64_t w, rank;
    idx_page pg;
    const char *d = kvo_http_req_arg(r, "digest_only");
    bool digest_only = d && (strcmp(d, "1") == 0 || strcmp(d, "true") == 0);
    const char *ta = kvo_http_req_arg(r, "tier");
    wire_tier tier = WIRE_TIER_DEVICE;
    if ((ta && wire_tier_parse(ta, strlen(ta), &tier) != KVO_OK &&
         snprintf(err, sizeof(err),
                  "tier must be device, host_pinned, disk or external") > 0) ||
        !arg_u64(r, "worker_id", UINT64_MAX, &w, err, sizeof(err)) ||
        !arg_u64(r, "dp_rank", UINT32_MAX, &rank, err, sizeof(err)) ||
        !idx_http_page_args(r, IDX_BLOCKS_PAGE, &pg, err, sizeof(err)) ||
        (d && !digest_only && strcmp(d, "0") != 0 && strcmp(d, "false") != 0 &&
         snprintf(err, sizeof(err), "digest_only must be 1 or 0") > 0)) {
        (*bad_requests)++;
        kvo_http_respond_error(r, 400, err);
        return;
    }
    kvo_buf b;
    kvo_buf_init(&b);
    uint64_t gen;
    const idx_tree *t = tree_of(ctx, w, &gen);
    kvo_status st;
    if (digest_only) {
        uint64_t count, digest;
        st = idx_blocks_digest(t, w, (uint32_t)rank, tier, &count, &digest);
        if (st == KVO_OK)
            st = idx_blocks_digest_json(w, (uint32_t)rank, tier, count, digest,
                                        &b);
    } else {
        st = idx_blockset_load(cache, t, gen, w, (uint32_t)rank, tier);
        if (st == KVO_OK) st = idx_blocks_json(cache, &pg, false, &b);
    }
    if (st != KVO_OK)
        kvo_http_respond_error(r, 500, kvo_strerror(st));
    else
        kvo_http_respond(r, 200, "application/json", b.data, b.len);
    kvo_buf_fini(&b);
}

/* POST /lookup {"worker_id", "dp_rank", "block_hashes": [...]}. */
void idx_http_lookup(kvo_http_req *r, idx_tree_of_fn tree_of, void *ctx,
                     uint64_t *bad_requests) {
    size_t blen;
    const uint8_t *body = kvo_http_req_body(r, &blen);
    idx_request q;
    idx_request_init(&q);
    kvo_err err;
    kvo_status st = idx_request_parse(&q, body, blen, IDX_REQ_LOOKUP, &err);
    if (st != KVO_OK) {
        if (st != KVO_ENOMEM) (*bad_requests)++;
        kvo_http_respond_error(r, st == KVO_ENOMEM ? 500 : 400, err.msg);
    } else {
        uint64_t gen;
        json_object *o = idx_json_lookup(tree_of(ctx, q.worker_id, &gen), &q);
        if (!o)
            kvo_http_respond_error(r, 500, "out of memory");
        else
            kvo_http_respond_json(r, 200, o);
    }
    idx_request_fini(&q);
}
