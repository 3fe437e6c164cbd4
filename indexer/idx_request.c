/* idx_request.c -- query bodies into requests (idx_int.h draws the shapes).
 *
 * The one reading path of POST /query, POST /query_by_hash, POST /lookup
 * and replay's query lines: bytes -> kvo_json's tree (strict, bounded: see
 * kvo_json.h) -> an idx_request whose arrays point into that tree (a token
 * array is never copied, and no per-element object is ever made). Pure: no
 * tree, clock or socket, so tests/fuzz/fuzz_query.c runs it alone.
 *
 * An error says where: kvo_json gives the byte offset of a malformed value,
 * and path_at turns it into the member path ("tokens_hashes[3]") by
 * re-reading the prefix, which the parser accepted up to that offset. The
 * messages hold no byte offsets, so one request's answer does not depend
 * on its whitespace.
 */
#include "idx_int.h"

#include <inttypes.h>
#include <string.h>

#define PATH_DEPTH 72   /* containers path_at follows (kvo_json allows 64) */
#define PATH_KEY_MAX 64 /* bytes of one key quoted in a path */
#define PATH_MAX_LEN 200

static const char wait_shape[] =
    "wait must be {\"zmq_seq\": [[publisher_id, seq], ...], \"timeout_ms\": n}";

typedef struct frame {
    bool obj;
    bool has_key; /* obj: the member being read has its key */
    size_t idx;   /* arr: element being read */
    size_t key, key_len;
} frame;

/* The member path of offset at in t[0, at), which parsed as the beginning
 * of a JSON value: "tokens_hashes[3]", "wait.zmq_seq[0][1]"; "" at the top. */
static void path_at(const uint8_t *t, size_t at, char *out, size_t outsz) {
    frame fr[PATH_DEPTH];
    size_t depth = 0; /* may exceed PATH_DEPTH: frames beyond are not kept */
    for (size_t i = 0; i < at; i++) {
        frame *top = depth && depth <= PATH_DEPTH ? &fr[depth - 1] : NULL;
        switch (t[i]) {
        case '"': {
            size_t s = ++i;
            while (i < at && t[i] != '"') i += t[i] == '\\' ? 2 : 1;
            if (top && top->obj && !top->has_key) {
                top->has_key = true;
                top->key = s;
                top->key_len = (i < at ? i : at) - s;
            }
            break;
        }
        case '{':
        case '[':
            if (++depth <= PATH_DEPTH)
                fr[depth - 1] = (frame){.obj = t[i] == '{'};
            break;
        case '}':
        case ']':
            if (depth) depth--;
            break;
        case ',':
            if (top && top->obj)
                top->has_key = false;
            else if (top)
                top->idx++;
            break;
        default: break;
        }
    }
    size_t n = 0;
    out[0] = '\0';
    for (size_t d = 0; d < depth && d < PATH_DEPTH && n < outsz; d++) {
        int w;
        if (!fr[d].obj)
            w = snprintf(out + n, outsz - n, "[%zu]", fr[d].idx);
        else if (fr[d].has_key)
            w = snprintf(out + n, outsz - n, "%s%.*s", n ? "." : "",
                         (int)(fr[d].key_len < PATH_KEY_MAX ? fr[d].key_len
                                                            : PATH_KEY_MAX),
                         (const char *)t + fr[d].key);
        else
            break; /* at a key: the object is the place */
        if (w < 0) break;
        n += (size_t)w;
    }
    if (n >= outsz) out[outsz - 1] = '\0';
}

static void clear(idx_request *q) {
    kvo_json doc = q->doc;
    memset(q, 0, sizeof(*q));
    q->doc = doc;
}

void idx_request_init(idx_request *q) {
    memset(q, 0, sizeof(*q));
    kvo_json_init(&q->doc);
}

void idx_request_fini(idx_request *q) {
    kvo_json_fini(&q->doc);
    clear(q);
}

/* A string member, or null / absent (NULL). */
static kvo_status opt_string(const kvo_jv *root, const char *name,
                             const char **out, kvo_err *err) {
    const kvo_jv *v = kvo_json_get(root, name);
    *out = NULL;
    if (!v || kvo_json_is(v, KVO_JSON_NULL)) return KVO_OK;
    if (!(*out = kvo_json_str(v, NULL)))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "%s: expected a string", name);
    return KVO_OK;
}

/* An array of integers >= 0, each at most max, named name in errors. */
static kvo_status u64_array(const kvo_jv *a, const char *name, uint64_t max,
                            const uint64_t **out, size_t *n, kvo_err *err) {
    kvo_err e;
    if (!kvo_json_is(a, KVO_JSON_ARR))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "%s: expected an array", name);
    if (kvo_json_u64s(a, out, n, &e) != KVO_OK)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "%s%s", name,
                           e.msg);
    for (size_t i = 0; i < *n; i++)
        if ((*out)[i] > max)
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "%s[%zu]: expected an integer in 0..%" PRIu64,
                               name, i, max);
    return KVO_OK;
}

/* "wait": {"zmq_seq": [[publisher_id, seq], ...], "timeout_ms"?: t}. */
static kvo_status read_wait(idx_request *q, const kvo_jv *w, kvo_err *err) {
    const kvo_jv *pairs = kvo_json_get(w, "zmq_seq");
    if (!kvo_json_is(pairs, KVO_JSON_ARR))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "%s",
                           wait_shape);
    uint64_t ms = IDX_WAIT_DEFAULT_MS;
    const kvo_jv *tmo = kvo_json_get(w, "timeout_ms");
    if (tmo && (!kvo_json_u64(tmo, &ms) || ms > IDX_WAIT_MAX_MS))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "wait.timeout_ms must be 0..%d", IDX_WAIT_MAX_MS);
    size_t n = pairs->len;
    if (n > IDX_WAIT_MAX_PAIRS)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "wait.zmq_seq: at most %d pairs",
                           IDX_WAIT_MAX_PAIRS);
    uint64_t *v = NULL;
    if (n && !(v = kvo_arena_alloc(&q->doc.arena, 2 * n * sizeof(*v))))
        return kvo_err_set(err, KVO_ENOMEM, KVO_ERR_NO_OFFSET, "out of memory");
    for (size_t i = 0; i < n; i++) {
        kvo_jv p, a, b;
        if (!kvo_json_at(pairs, i, &p) || !kvo_json_is(&p, KVO_JSON_ARR) ||
            p.len != 2 || !kvo_json_at(&p, 0, &a) || !kvo_json_at(&p, 1, &b) ||
            !kvo_json_u64(&a, &v[2 * i]) || !kvo_json_u64(&b, &v[2 * i + 1]))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "wait.zmq_seq[%zu] must be [publisher_id, seq] "
                               "(integers >= 0)",
                               i);
    }
    q->wait = true;
    q->timeout_ms = (uint32_t)ms;
    q->n_pairs = n;
    q->pairs = v;
    return KVO_OK;
}

/* {"worker_id": u64, "dp_rank": u32, "block_hashes": [u64...]}. */
static kvo_status read_lookup(idx_request *q, const kvo_jv *root,
                              kvo_err *err) {
    if (!kvo_json_u64(kvo_json_get(root, "worker_id"), &q->worker_id))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "worker_id: expected an integer >= 0");
    if (!kvo_json_u32(kvo_json_get(root, "dp_rank"), &q->dp_rank))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "dp_rank: expected an integer in 0..4294967295");
    const kvo_jv *h = kvo_json_get(root, "block_hashes");
    if (!h)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "missing block_hashes");
    kvo_status st = u64_array(h, "block_hashes", UINT64_MAX, &q->v, &q->n, err);
    if (st != KVO_OK) return st;
    if (q->n > IDX_LOOKUP_MAX)
        return kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                           "block_hashes: at most %d", IDX_LOOKUP_MAX);
    const kvo_jv *c = kvo_json_get(root, "chain");
    if (c && !kvo_json_is(c, KVO_JSON_NULL)) {
        if (!kvo_json_is(c, KVO_JSON_OBJ))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "chain: expected an object");
        const kvo_jv *th = kvo_json_get(c, "tokens_hashes"),
                     *fp = kvo_json_get(c, "first_parent");
        size_t nt;
        if (!th)
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "chain: missing tokens_hashes");
        st = u64_array(th, "chain.tokens_hashes", UINT64_MAX, &q->tokens, &nt,
                       err);
        if (st != KVO_OK) return st;
        if (nt != q->n)
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "chain.tokens_hashes: %zu, block_hashes: %zu",
                               nt, q->n);
        q->has_first_parent = fp && !kvo_json_is(fp, KVO_JSON_NULL);
        if (q->has_first_parent && !kvo_json_u64(fp, &q->first_parent))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "chain.first_parent: expected an integer >= 0 "
                               "or null");
    }
    q->kind = IDX_REQ_LOOKUP;
    return KVO_OK;
}

static kvo_status read_request(idx_request *q, unsigned accept, kvo_err *err) {
    const kvo_jv *root = q->doc.root;
    kvo_status st;
    if (!kvo_json_is(root, KVO_JSON_OBJ))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "expected a JSON object");
    if (accept & IDX_REQ_LOOKUP) return read_lookup(q, root, err);
    const kvo_jv *a = kvo_json_get(root, "apply");
    if ((accept & IDX_REQ_APPLY) && a) {
        if (!kvo_json_u64(a, &q->apply))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "apply: expected a count");
        q->kind = IDX_REQ_APPLY;
        return KVO_OK;
    }
    const kvo_jv *tok = kvo_json_get(root, "token_ids");
    const kvo_jv *hs = kvo_json_get(root, "tokens_hashes");
    if (!(accept & IDX_REQ_TOKENS)) tok = NULL;
    if (!(accept & IDX_REQ_HASHES)) hs = NULL;
    if (!tok && !hs)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "missing %s",
                           !(accept & IDX_REQ_HASHES) ? "token_ids"
                           : !(accept & IDX_REQ_TOKENS)
                               ? "tokens_hashes"
                               : "token_ids or tokens_hashes");
    if (tok && hs)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "token_ids and tokens_hashes are exclusive");
    if (hs) {
        q->kind = IDX_REQ_HASHES;
        st = u64_array(hs, "tokens_hashes", UINT64_MAX, &q->v, &q->n, err);
    } else {
        q->kind = IDX_REQ_TOKENS;
        if ((st = opt_string(root, "lora_name", &q->lora, err)) == KVO_OK &&
            (st = opt_string(root, "cache_salt", &q->salt, err)) == KVO_OK)
            st = u64_array(tok, "token_ids", UINT32_MAX, &q->v, &q->n, err);
    }
    if (st != KVO_OK) return st;
    const kvo_jv *m = kvo_json_get(root, "metrics");
    if (m && !kvo_json_is(m, KVO_JSON_NULL) && !kvo_json_bool(m, &q->metrics))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "metrics: expected true or false");
    const kvo_jv *w = kvo_json_get(root, "wait");
    if (w) {
        if (!kvo_json_is(w, KVO_JSON_OBJ))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "%s",
                               wait_shape);
        return read_wait(q, w, err);
    }
    return KVO_OK;
}

kvo_status idx_request_parse(idx_request *q, const void *body, size_t len,
                             unsigned accept, kvo_err *err) {
    clear(q);
    if (!len)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "empty body: expected a JSON object");
    kvo_err je;
    kvo_status st = kvo_json_parse(&q->doc, body, len, NULL, &je);
    if (st == KVO_ENOMEM)
        return kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "out of memory");
    if (st != KVO_OK) {
        char path[PATH_MAX_LEN] = "";
        if (je.offset != KVO_ERR_NO_OFFSET && je.offset <= len)
            path_at(body, je.offset, path, sizeof(path));
        return kvo_err_set(err, st, je.offset, "bad JSON%s%s: %s",
                           path[0] ? " at " : "", path, je.msg);
    }
    if ((st = read_request(q, accept, err)) != KVO_OK) clear(q);
    return st;
}
