/* check_http.c -- every HTTP call kvo-check makes, and the reading of the
 * answers (contracts: COMMON.md, DESIGN §9).
 *
 *   engine   GET  /kvo/state           last_seq per rank (kvo-mocker)
 *            GET  /kvo/event_sources   ZMQ endpoints per rank (kvo-mocker)
 *            POST /kvo/probe           hit blocks per rank, no side effects
 *            POST /v1/completions      usage.prompt_tokens_details.cached_tokens
 *            GET  /v1/models           model id for real engines
 *   indexer  POST /query_by_hash       scores per (worker_id, dp_rank)
 *            GET  /watermark           zmq_seq_last per publisher
 *            GET  /metrics             counters (Prometheus text)
 *   indexer, --indexer-api dynamo (Dynamo's standalone indexer API):
 *            POST /register, /unregister   one engine rank, at start / end
 *            POST /query_by_hash       signed block_hashes; scores in tokens
 *            GET  /watermark           kvo's extension: zmq_seq_last per
 *                                      (instance_id, dp_rank)
 *   relay    GET  /metrics, /stats     counters, source state
 *
 * Request bodies are written by hand (numbers only, and the prompt JSON is
 * built once per request by the driver; a kv_transfer_params object passed
 * on goes through json-c's writer). The answers come from services under
 * test, which may be wrong or hostile, so each is read in two steps:
 *
 *   1 parse   base's strict reader (kvo_json.h): exactly one JSON value,
 *             exact integers, valid UTF-8, at most ANSWER_MEM_MAX bytes of
 *             tree whatever the answer's size;
 *   2 fields  every field kvo-check uses is checked for its type and its
 *             range: a count or id that does not fit where it goes is
 *             refused, never clamped or wrapped.
 *
 * Whatever is wrong becomes one error naming the call, the place in the
 * answer and what was there:
 *
 *   GET http://127.0.0.1:4001/watermark: bad JSON answer: trailing
 *       characters after the JSON value (byte 41, near "...}]} x")
 *   POST http://127.0.0.1:4002/kvo/probe: ranks[1].hit_blocks: expected an
 *       integer in [0, 2147483647], got -3
 *
 * An answer and its parse live in the call's json_call, on the stack of the
 * calling thread, for that call only: a hostile answer's memory is gone
 * when the call returns. The outputs (hits, scores, a watermark, a
 * completion, an engine's ranks, counters) are written only once the whole
 * answer has passed: a call that fails leaves them as they were.
 */
#include "check_int.h"
#include "kvo_json.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Nesting a JSON answer may have; bytes of an answer quoted in an error
 * (the body of an HTTP error; around the place where a parse failed, from
 * NEAR_BEFORE bytes before it). */
enum {
    ANSWER_DEPTH_MAX = 64,
    ERROR_QUOTE = 200,
    NEAR_QUOTE = 60,
    NEAR_BEFORE = 30
};
/* Bytes the parse of one answer may take (tree and parse stacks). Every
 * answer kvo-check reads is kilobytes; one that needs more is refused, so
 * a hostile service costs the body the client holds (up to 1 GiB, its own
 * cap) plus this, never a multiple of the body. */
#define ANSWER_MEM_MAX ((size_t)64 << 20)
/* Decimal digits of the largest u64. */
enum { U64_DIGITS = 20 };
/* A field the readers below look for: may it be absent (or null)? */
enum { OPTIONAL = 0, REQUIRED = 1 };
/* rank_entry: the entry speaks of a rank the engine does not have. */
#define NO_RANK UINT32_MAX

/* One call with a JSON answer: json_call_init (names the URL and where
 * errors go), json_call_send, then json_call_fini whatever happened. */
typedef struct json_call {
    const char *method; /* "GET" or "POST" */
    char url[256];      /* named in every error message */
    kvo_err *err;       /* the caller's (may be NULL) */
    kvo_http_resp resp; /* the raw answer */
    kvo_json doc;       /* its parse */
    const kvo_jv *root; /* once sent and parsed; NULL before */
} json_call;

static void json_call_init(json_call *c, kvo_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void json_call_init(json_call *c, kvo_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->url, sizeof(c->url), fmt, ap);
    va_end(ap);
    c->method = "GET";
    c->err = err;
    kvo_http_resp_init(&c->resp);
    kvo_json_init(&c->doc);
    c->root = NULL;
}

static void json_call_fini(json_call *c) {
    kvo_json_fini(&c->doc);
    kvo_http_resp_fini(&c->resp);
    c->root = NULL;
}

/* The error "METHOD URL: what" into c->err; returns st. */
static kvo_status answer_err(const json_call *c, kvo_status st, const char *fmt,
                             ...) __attribute__((format(printf, 3, 4)));
static kvo_status answer_err(const json_call *c, kvo_status st, const char *fmt,
                             ...) {
    char what[sizeof c->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return kvo_err_set(c->err, st, KVO_ERR_NO_OFFSET, "%s %s: %s", c->method,
                       c->url, what);
}

/* Up to max bytes of p[0, n) for an error message, into out (4 * max + 4
 * bytes): printable ASCII as it is, every other byte as \xNN (an answer
 * may hold anything; the message goes to a terminal and into the JSON
 * report), "..." when cut. */
static const char *quote(char *out, size_t outsz, const uint8_t *p, size_t n,
                         size_t max) {
    size_t o = 0, i = 0;
    for (; i < n && i < max && o + 5 <= outsz; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f)
            out[o++] = (char)p[i];
        else
            o += (size_t)snprintf(out + o, outsz - o, "\\x%02x", p[i]);
    }
    if (i < n && o + 4 <= outsz) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

/* GET (body NULL) or POST the JSON body to c->url; a 200 answer is then
 * parsed into c->root. */
static kvo_status json_call_send(json_call *c, kvo_http_client *h,
                                 const kvo_buf *body) {
    c->method = body ? "POST" : "GET";
    kvo_status st = body ? kvo_http_post(h, c->url, "application/json",
                                         body->data, body->len, &c->resp)
                         : kvo_http_get(h, c->url, &c->resp);
    if (st != KVO_OK)
        return answer_err(c, st, "%s (%s)", kvo_strerror(st),
                          kvo_http_client_error(h));
    const uint8_t *text =
        c->resp.body.data ? c->resp.body.data : (const uint8_t *)"";
    size_t len = c->resp.body.len;
    char q[4 * ERROR_QUOTE + 4];
    /* 404: the service lacks the endpoint; /register answers 201 */
    if (c->resp.status < 200 || c->resp.status > 299)
        return answer_err(c, c->resp.status == 404 ? KVO_ENOTFOUND : KVO_EHTTP,
                          "HTTP %ld: %s", c->resp.status,
                          quote(q, sizeof(q), text, len, ERROR_QUOTE));
    kvo_json_limits lim = {.max_depth = ANSWER_DEPTH_MAX,
                           .max_mem = ANSWER_MEM_MAX};
    kvo_err perr;
    st = kvo_json_parse(&c->doc, text, len, &lim, &perr);
    if (st != KVO_OK) {
        size_t at = perr.offset < len ? perr.offset : len;
        size_t from = at > NEAR_BEFORE ? at - NEAR_BEFORE : 0;
        return answer_err(
            c, st, "bad JSON answer: %s (byte %zu, near \"%s\")", perr.msg, at,
            quote(q, sizeof(q), text + from, len - from, NEAR_QUOTE));
    }
    c->root = c->doc.root;
    return KVO_OK;
}

/* ---- Reading fields ----------------------------------------------------------
 * where: the place of the object in the answer ("ranks[2]", "usage"), NULL
 * for the root; it only names the field in errors. Each reader takes a NULL
 * obj as an object without members. */

/* What the answer held where a value was expected ("-3", "a string"). */
static const char *describe(const kvo_jv *v, char *buf, size_t n) {
    if (!v) return "nothing";
    switch (v->type) {
    case KVO_JSON_NULL: return "null";
    case KVO_JSON_BOOL: return v->v.b ? "true" : "false";
    case KVO_JSON_INT:
        if (v->neg)
            snprintf(buf, n, "-%" PRIu64, 0 - v->v.u);
        else
            snprintf(buf, n, "%" PRIu64, v->v.u);
        return buf;
    case KVO_JSON_REAL: snprintf(buf, n, "%g", v->v.d); return buf;
    case KVO_JSON_STR: return "a string";
    case KVO_JSON_ARR: return "an array";
    default: return "an object";
    }
}

static const char *type_name(kvo_jtype t) {
    switch (t) {
    case KVO_JSON_BOOL: return "true or false";
    case KVO_JSON_STR: return "a string";
    case KVO_JSON_ARR: return "an array";
    default: return "an object";
    }
}

/* "where.key" into buf; a name too long for it ends in "..." */
static const char *field_name(char *buf, size_t n, const char *where,
                              const char *key) {
    int k =
        snprintf(buf, n, "%s%s%s", where ? where : "", where ? "." : "", key);
    if (k >= 0 && (size_t)k >= n && n > 3) memcpy(buf + n - 4, "...", 4);
    return buf;
}

/* Member key of obj of type t into *out. Absent or null: an error when
 * need, else KVO_OK with *out = NULL. */
static kvo_status get_typed(const json_call *c, const kvo_jv *obj,
                            const char *where, const char *key, kvo_jtype t,
                            int need, const kvo_jv **out) {
    const kvo_jv *v = kvo_json_get(obj, key);
    *out = NULL;
    if (kvo_json_is(v, t)) {
        *out = v;
        return KVO_OK;
    }
    if (!need && (!v || v->type == KVO_JSON_NULL)) return KVO_OK;
    char name[96], got[32];
    return answer_err(c, KVO_EPROTO, "%s: expected %s%s, got %s",
                      field_name(name, sizeof(name), where, key),
                      need ? "" : "null or ", type_name(t),
                      describe(v, got, sizeof(got)));
}

/* Integer member key of obj in [0, max] into *out. Absent or null: an
 * error when need, else KVO_OK with *out untouched. */
static kvo_status get_uint(const json_call *c, const kvo_jv *obj,
                           const char *where, const char *key, uint64_t max,
                           int need, uint64_t *out) {
    const kvo_jv *v = kvo_json_get(obj, key);
    if (!need && (!v || v->type == KVO_JSON_NULL)) return KVO_OK;
    uint64_t u;
    if (kvo_json_u64(v, &u) && u <= max) {
        *out = u;
        return KVO_OK;
    }
    char name[96], got[32];
    return answer_err(
        c, KVO_EPROTO, "%s: expected %san integer in [0, %" PRIu64 "], got %s",
        field_name(name, sizeof(name), where, key), need ? "" : "null or ", max,
        describe(v, got, sizeof(got)));
}

/* String member key of obj copied into dst[dstsz]; one that does not fit
 * is an error (never cut). Absent or null: an error when need, else dst
 * untouched. */
static kvo_status get_str_into(const json_call *c, const kvo_jv *obj,
                               const char *where, const char *key, int need,
                               char *dst, size_t dstsz) {
    const kvo_jv *v;
    kvo_status st = get_typed(c, obj, where, key, KVO_JSON_STR, need, &v);
    if (st != KVO_OK || !v) return st;
    if (v->len >= dstsz) {
        char name[96];
        return answer_err(c, KVO_ETOOBIG, "%s: %u bytes, at most %zu",
                          field_name(name, sizeof(name), where, key), v->len,
                          dstsz - 1);
    }
    memcpy(dst, v->v.s, (size_t)v->len + 1);
    return KVO_OK;
}

/* Element i of arr, which must be an object, into *out; name gets its
 * place ("ranks[3]", or "[3]" with arr_name ""). */
static kvo_status elem_obj(const json_call *c, const kvo_jv *arr,
                           const char *arr_name, size_t i, kvo_jv *out,
                           char *name, size_t namesz) {
    snprintf(name, namesz, "%s[%zu]", arr_name, i);
    if (kvo_json_at(arr, i, out) && out->type == KVO_JSON_OBJ) return KVO_OK;
    char got[32];
    return answer_err(c, KVO_EPROTO, "%s: expected an object, got %s", name,
                      describe(out, got, sizeof(got)));
}

/* v rebuilt as json-c objects (*out; NULL is JSON's null); false when out
 * of memory. */
static bool to_json_c(const kvo_jv *v, json_object **out) {
    json_object *o = NULL;
    switch (v->type) {
    case KVO_JSON_NULL: *out = NULL; return true;
    case KVO_JSON_BOOL: o = json_object_new_boolean(v->v.b); break;
    case KVO_JSON_INT:
        o = v->neg ? json_object_new_int64((int64_t)v->v.u)
                   : json_object_new_uint64(v->v.u);
        break;
    case KVO_JSON_REAL: o = json_object_new_double(v->v.d); break;
    case KVO_JSON_STR:
        o = json_object_new_string_len(v->v.s, (int)v->len);
        break;
    case KVO_JSON_ARR:
        o = json_object_new_array_ext((int)v->len);
        for (uint32_t i = 0; o && i < v->len; i++) {
            kvo_jv e;
            json_object *x = NULL;
            if (!kvo_json_at(v, i, &e) || !to_json_c(&e, &x) ||
                json_object_array_add(o, x) != 0) {
                json_object_put(x);
                json_object_put(o);
                o = NULL;
            }
        }
        break;
    case KVO_JSON_OBJ:
        o = json_object_new_object();
        for (uint32_t i = 0; o && i < v->len; i++) {
            const kvo_jmember *m = &v->v.members[i];
            json_object *x = NULL;
            if (!to_json_c(&m->value, &x) ||
                json_object_object_add(o, m->key, x) != 0) {
                json_object_put(x);
                json_object_put(o);
                o = NULL;
            }
        }
        break;
    }
    *out = o;
    return o != NULL;
}

/* v as JSON text, through json-c's writer (kvo-check writes its JSON with
 * json-c): malloc'd, NULL when out of memory. */
static char *json_text(const kvo_jv *v) {
    json_object *j;
    if (!to_json_c(v, &j)) return NULL;
    const char *s = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN);
    char *copy = s ? kvo_strdup(s) : NULL;
    json_object_put(j);
    return copy;
}

/* ---- Engines --------------------------------------------------------------*/

/* Entry i of a "ranks" array (name gets "ranks[i]") and the index in
 * e->ranks of the rank it speaks of ("dp_rank", else its position):
 * *k = NO_RANK when e has no such rank. */
static kvo_status rank_entry(const json_call *c, const chk_engine *e,
                             const kvo_jv *ranks, size_t i, kvo_jv *entry,
                             char *name, size_t namesz, uint32_t *k) {
    *k = NO_RANK;
    kvo_status st = elem_obj(c, ranks, "ranks", i, entry, name, namesz);
    uint64_t rank = i;
    if (st == KVO_OK)
        st = get_uint(c, entry, name, "dp_rank", UINT32_MAX, OPTIONAL, &rank);
    for (uint32_t r = 0; st == KVO_OK && r < e->n_ranks; r++)
        if (e->ranks[r].dp_rank == rank) *k = r;
    return st;
}

/* A cached set's "<prefix>_distinct" and "<prefix>_digest" (both or
 * neither) into *has, *count, *digest. */
static kvo_status get_set(const json_call *c, const kvo_jv *obj,
                          const char *where, const char *prefix, bool *has,
                          uint64_t *count, uint64_t *digest) {
    char kc[32], kd[32];
    snprintf(kc, sizeof(kc), "%s_distinct", prefix);
    snprintf(kd, sizeof(kd), "%s_digest", prefix);
    uint64_t cnt = UINT64_MAX, dig = 0;
    kvo_status st = get_uint(c, obj, where, kc, INT64_MAX, OPTIONAL, &cnt);
    if (st == KVO_OK)
        st = get_uint(c, obj, where, kd, UINT64_MAX,
                      cnt == UINT64_MAX ? OPTIONAL : REQUIRED, &dig);
    *has = cnt != UINT64_MAX;
    *count = *has ? cnt : 0;
    *digest = dig;
    return st;
}

kvo_status chk_engine_state(chk_engine *e, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/kvo/state", e->url);
    int64_t seq[CHK_MAX_DP];
    bool has_set[CHK_MAX_DP], has_cpu[CHK_MAX_DP];
    uint64_t set_count[CHK_MAX_DP], set_digest[CHK_MAX_DP];
    uint64_t cpu_count[CHK_MAX_DP], cpu_digest[CHK_MAX_DP];
    for (uint32_t k = 0; k < e->n_ranks; k++) {
        seq[k] = e->ranks[k].last_seq;
        has_set[k] = e->ranks[k].has_set;
        set_count[k] = e->ranks[k].set_count;
        set_digest[k] = e->ranks[k].set_digest;
        has_cpu[k] = e->ranks[k].has_cpu_set;
        cpu_count[k] = e->ranks[k].cpu_set_count;
        cpu_digest[k] = e->ranks[k].cpu_set_digest;
    }
    const kvo_jv *ranks = NULL;
    kvo_status st = json_call_send(&jc, e->http, NULL);
    if (st == KVO_OK)
        st = get_typed(&jc, jc.root, NULL, "ranks", KVO_JSON_ARR, REQUIRED,
                       &ranks);
    for (size_t i = 0; st == KVO_OK && i < ranks->len; i++) {
        kvo_jv r;
        char name[32];
        uint32_t k;
        uint64_t last = UINT64_MAX; /* null or absent: nothing published */
        st = rank_entry(&jc, e, ranks, i, &r, name, sizeof(name), &k);
        if (st != KVO_OK || k == NO_RANK) continue;
        st = get_uint(&jc, &r, name, "last_seq", INT64_MAX, OPTIONAL, &last);
        seq[k] = last == UINT64_MAX ? -1 : (int64_t)last;
        /* the cached set's size and digest (kvo-mocker >= issue 11), and
         * the CPU tier's when it has one (--cpu-offload-blocks) */
        if (st == KVO_OK)
            st = get_set(&jc, &r, name, "cached", &has_set[k], &set_count[k],
                         &set_digest[k]);
        if (st == KVO_OK)
            st = get_set(&jc, &r, name, "cpu_cached", &has_cpu[k],
                         &cpu_count[k], &cpu_digest[k]);
    }
    if (st == KVO_OK) {
        for (uint32_t k = 0; k < e->n_ranks; k++) {
            e->ranks[k].last_seq = seq[k];
            e->ranks[k].has_set = has_set[k];
            e->ranks[k].set_count = set_count[k];
            e->ranks[k].set_digest = set_digest[k];
            e->ranks[k].has_cpu_set = has_cpu[k];
            e->ranks[k].cpu_set_count = cpu_count[k];
            e->ranks[k].cpu_set_digest = cpu_digest[k];
        }
        e->dirty = false;
    }
    json_call_fini(&jc);
    return st;
}

/* The counters of one entry of /kvo/state's "ranks" into stage: every
 * numeric leaf of its "counters" object, and its counts. */
static kvo_status rank_counters(const json_call *c, const kvo_jv *r,
                                const char *where, const char *stage,
                                check_counters *out) {
    const kvo_jv *obj;
    kvo_status st =
        get_typed(c, r, where, "counters", KVO_JSON_OBJ, OPTIONAL, &obj);
    if (st == KVO_OK && obj) st = check_counters_parse_json(out, stage, obj);
    static const char *const counts[] = {"resident_blocks", "free_blocks",
                                         "requests_finished", "last_seq"};
    for (size_t k = 0; k < KVO_ARRAY_LEN(counts) && st == KVO_OK; k++) {
        uint64_t v = UINT64_MAX; /* absent or null */
        st = get_uint(c, r, where, counts[k], INT64_MAX, OPTIONAL, &v);
        if (st == KVO_OK && v != UINT64_MAX)
            st = check_counters_set(out, stage, counts[k], (double)v);
    }
    return st;
}

kvo_status chk_engine_counters(chk_engine *e, check_counters *c, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/kvo/state", e->url);
    check_counters got; /* c takes them once the whole answer passed */
    check_counters_init(&got);
    const kvo_jv *ranks = NULL;
    kvo_status st = json_call_send(&jc, e->http, NULL);
    /* an answer without ranks has no counters to read */
    if (st == KVO_OK)
        st = get_typed(&jc, jc.root, NULL, "ranks", KVO_JSON_ARR, OPTIONAL,
                       &ranks);
    for (size_t i = 0; st == KVO_OK && ranks && i < ranks->len; i++) {
        kvo_jv r;
        char name[32], stage[48];
        uint64_t rank = i;
        st = elem_obj(&jc, ranks, "ranks", i, &r, name, sizeof(name));
        if (st == KVO_OK)
            st =
                get_uint(&jc, &r, name, "dp_rank", UINT32_MAX, OPTIONAL, &rank);
        if (st != KVO_OK) break;
        snprintf(stage, sizeof(stage), "%s %u.%" PRIu64,
                 e->decode ? "decode engine" : "engine", e->worker_id, rank);
        st = rank_counters(&jc, &r, name, stage, &got);
    }
    for (size_t i = 0; st == KVO_OK && i < got.n; i++)
        st = check_counters_set(c, got.items[i].stage, got.items[i].name,
                                got.items[i].value);
    check_counters_fini(&got);
    json_call_fini(&jc);
    return st;
}

/* Source i of /kvo/event_sources into out (dp_rank, zmq, replay, topic). */
static kvo_status source_entry(const json_call *c, size_t i, chk_rank *out) {
    kvo_jv s;
    char name[32];
    uint64_t rank = i;
    out->replay[0] = out->topic[0] = '\0';
    kvo_status st = elem_obj(c, c->root, "", i, &s, name, sizeof(name));
    if (st == KVO_OK)
        st = get_uint(c, &s, name, "data_parallel_rank", CHK_MAX_DP - 1,
                      OPTIONAL, &rank);
    if (st == KVO_OK)
        st = get_str_into(c, &s, name, "endpoint", REQUIRED, out->zmq,
                          sizeof(out->zmq));
    if (st == KVO_OK)
        st = get_str_into(c, &s, name, "replay_endpoint", OPTIONAL, out->replay,
                          sizeof(out->replay));
    if (st == KVO_OK)
        st = get_str_into(c, &s, name, "topic", OPTIONAL, out->topic,
                          sizeof(out->topic));
    out->dp_rank = (uint32_t)rank;
    return st;
}

kvo_status chk_engine_sources(chk_engine *e, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/kvo/event_sources", e->url);
    chk_rank got[CHK_MAX_DP];
    size_t n = 0;
    kvo_status st = json_call_send(&jc, e->http, NULL);
    if (st != KVO_OK) goto done;
    if (!kvo_json_is(jc.root, KVO_JSON_ARR)) {
        char what[32];
        st = answer_err(&jc, KVO_EPROTO, "expected an array of sources, got %s",
                        describe(jc.root, what, sizeof(what)));
        goto done;
    }
    n = jc.root->len;
    if (n > CHK_MAX_DP) {
        st = answer_err(&jc, KVO_ETOOBIG, "%zu sources (at most %d)", n,
                        CHK_MAX_DP);
        goto done;
    }
    for (size_t i = 0; i < n && st == KVO_OK; i++)
        st = source_entry(&jc, i, &got[i]);
    if (st != KVO_OK) goto done;
    for (size_t i = 0; i < n; i++) {
        chk_rank *r = &e->ranks[i];
        r->dp_rank = got[i].dp_rank;
        memcpy(r->zmq, got[i].zmq, sizeof(r->zmq));
        memcpy(r->replay, got[i].replay, sizeof(r->replay));
        memcpy(r->topic, got[i].topic, sizeof(r->topic));
    }
    e->n_ranks = (uint32_t)n;
done:
    json_call_fini(&jc);
    return st;
}

/* ,"key":"value" with value JSON-quoted. */
static kvo_status str_member(kvo_buf *body, const char *key, const char *name) {
    json_object *j = json_object_new_string(name);
    if (!j) return KVO_ENOMEM;
    kvo_status st = kvo_buf_printf(
        body, ",\"%s\":%s", key,
        json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    json_object_put(j);
    return st;
}

/* The body of a POST /kvo/probe of p: {"trace"|"token_ids": ...}, its
 * adapter and keys, and the flags given. */
static kvo_status probe_body(kvo_buf *body, const chk_prompt *p, bool warm,
                             bool detail) {
    kvo_status st =
        kvo_buf_printf(body, "{\"%s\":", p->trace_form ? "trace" : "token_ids");
    if (st == KVO_OK) st = kvo_buf_append(body, p->json, p->len);
    if (st == KVO_OK && warm && p->trace_form)
        st = CHK_BUF_LIT(body, ",\"warm\":true");
    if (st == KVO_OK && p->lora && p->lora[0])
        st = str_member(body, "lora_name", p->lora);
    if (st == KVO_OK && p->extra_len)
        st = kvo_buf_append(body, p->extra, p->extra_len);
    if (st == KVO_OK && detail) st = CHK_BUF_LIT(body, ",\"detail\":true");
    if (st == KVO_OK) st = CHK_BUF_LIT(body, "}");
    return st;
}

kvo_status chk_engine_probe(chk_engine *e, const chk_prompt *p,
                            uint32_t block_size, bool warm, int32_t *hits,
                            int32_t *cache_hits, int32_t *cpu, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/kvo/probe", e->url);
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st = probe_body(&body, p, warm, false);
    if (st != KVO_OK) goto done;
    st = json_call_send(&jc, e->probe_http, &body);
    if (st != KVO_OK) goto done;
    uint64_t bs = 0;
    st = get_uint(&jc, jc.root, NULL, "block_size", UINT32_MAX, REQUIRED, &bs);
    if (st != KVO_OK) goto done;
    if (bs != block_size) {
        st = answer_err(&jc, KVO_EPROTO,
                        "engine block size %" PRIu64 ", expected %u "
                        "(--block-size)",
                        bs, block_size);
        goto done;
    }
    const kvo_jv *ranks;
    st = get_typed(&jc, jc.root, NULL, "ranks", KVO_JSON_ARR, REQUIRED, &ranks);
    if (st != KVO_OK) goto done;
    int32_t got[CHK_MAX_DP], own[CHK_MAX_DP], run[CHK_MAX_DP];
    for (uint32_t k = 0; k < e->n_ranks; k++) got[k] = own[k] = run[k] = -1;
    for (size_t i = 0; st == KVO_OK && i < ranks->len; i++) {
        kvo_jv r;
        char name[32];
        uint32_t k;
        uint64_t h = 0, full = UINT64_MAX, gpu = UINT64_MAX, c = UINT64_MAX;
        st = rank_entry(&jc, e, ranks, i, &r, name, sizeof(name), &k);
        if (st != KVO_OK || k == NO_RANK) continue;
        st = get_uint(&jc, &r, name, "hit_blocks", INT32_MAX, REQUIRED, &h);
        if (st == KVO_OK)
            st = get_uint(&jc, &r, name, "full_blocks", INT32_MAX, OPTIONAL,
                          &full);
        if (st == KVO_OK)
            st = get_uint(&jc, &r, name, "gpu", INT32_MAX, OPTIONAL, &gpu);
        /* a tiered probe gives both runs: the CPU tier is judged on them */
        if (st == KVO_OK)
            st = get_uint(&jc, &r, name, "cpu", INT32_MAX,
                          gpu == UINT64_MAX ? OPTIONAL : REQUIRED, &c);
        own[k] = (int32_t)h;
        got[k] = full != UINT64_MAX  ? (int32_t)full
                 : gpu != UINT64_MAX ? (int32_t)gpu
                                     : (int32_t)h;
        run[k] = gpu != UINT64_MAX ? (int32_t)c : -1;
    }
    if (st == KVO_OK) {
        memcpy(hits, got, e->n_ranks * sizeof(*hits));
        memcpy(cache_hits, own, e->n_ranks * sizeof(*cache_hits));
        if (cpu) memcpy(cpu, run, e->n_ranks * sizeof(*cpu));
    }
done:
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

/* A boolean member key of obj into *out (required). */
static kvo_status get_bool(const json_call *c, const kvo_jv *obj,
                           const char *where, const char *key, bool *out) {
    const kvo_jv *v;
    kvo_status st = get_typed(c, obj, where, key, KVO_JSON_BOOL, REQUIRED, &v);
    if (st == KVO_OK) *out = v->v.b;
    return st;
}

/* A hash member that may be null into *has and *out. */
static kvo_status get_opt_hash(const json_call *c, const kvo_jv *obj,
                               const char *where, const char *key, bool *has,
                               uint64_t *out) {
    uint64_t v = UINT64_MAX;
    const kvo_jv *j = kvo_json_get(obj, key);
    *has = j && j->type != KVO_JSON_NULL;
    kvo_status st = get_uint(c, obj, where, key, UINT64_MAX, OPTIONAL, &v);
    *out = *has ? v : 0;
    return st;
}

kvo_status chk_engine_chain(chk_engine *e, const chk_prompt *p, uint32_t rank,
                            uint32_t k, check_chain_block *out, uint32_t *n,
                            kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/kvo/probe", e->url);
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st = probe_body(&body, p, false, true);
    if (st == KVO_OK) st = json_call_send(&jc, e->probe_http, &body);
    const kvo_jv *ranks = NULL, *chain = NULL;
    if (st == KVO_OK)
        st = get_typed(&jc, jc.root, NULL, "ranks", KVO_JSON_ARR, REQUIRED,
                       &ranks);
    char name[48];
    for (size_t i = 0; st == KVO_OK && !chain && i < ranks->len; i++) {
        kvo_jv r;
        uint32_t at;
        st = rank_entry(&jc, e, ranks, i, &r, name, sizeof(name), &at);
        if (st == KVO_OK && at != NO_RANK && e->ranks[at].dp_rank == rank)
            st = get_typed(&jc, &r, name, "chain", KVO_JSON_ARR, REQUIRED,
                           &chain);
    }
    if (st == KVO_OK && !chain)
        st = answer_err(&jc, KVO_ENOTFOUND,
                        "no chain for rank %u (an "
                        "engine without the probe's detail form)",
                        rank);
    uint32_t got = 0;
    for (size_t i = 0; st == KVO_OK && got < *n && i < chain->len; i++) {
        kvo_jv b;
        uint64_t index = 0, copies = 0;
        char an[64], bn[96]; /* the array's name, the element's */
        snprintf(an, sizeof(an), "%s.chain", name);
        st = elem_obj(&jc, chain, an, i, &b, bn, sizeof(bn));
        if (st == KVO_OK)
            st = get_uint(&jc, &b, bn, "index", UINT32_MAX, REQUIRED, &index);
        if (st != KVO_OK || index != (uint64_t)k + got) continue;
        check_chain_block c = {0};
        st = get_uint(&jc, &b, bn, "hash", UINT64_MAX, REQUIRED, &c.hash);
        if (st == KVO_OK)
            st = get_opt_hash(&jc, &b, bn, "parent", &c.has_parent, &c.parent);
        if (st == KVO_OK) st = get_bool(&jc, &b, bn, "cached", &c.cached);
        if (st == KVO_OK)
            st = get_uint(&jc, &b, bn, "copies", UINT32_MAX, REQUIRED, &copies);
        if (st == KVO_OK)
            st = get_uint(&jc, &b, bn, "tokens_hash", UINT64_MAX, REQUIRED,
                          &c.tokens_hash);
        c.copies = (uint32_t)copies;
        if (st == KVO_OK) out[got++] = c;
    }
    if (st == KVO_OK && !got)
        st = answer_err(&jc, KVO_ENOTFOUND,
                        "rank %u's chain stops before "
                        "block %u",
                        rank, k);
    if (st == KVO_OK) *n = got;
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

/* Entry i of a /lookup answer's "blocks" (for hash) into *out. */
static kvo_status lookup_entry(const json_call *c, const kvo_jv *blocks,
                               size_t i, uint64_t hash, check_lookup *out) {
    kvo_jv b;
    char bn[32];
    kvo_status st = elem_obj(c, blocks, "blocks", i, &b, bn, sizeof(bn));
    check_lookup l = {0};
    bool has_th = false;
    uint64_t h = 0;
    const kvo_jv *holders = NULL;
    if (st == KVO_OK)
        st = get_uint(c, &b, bn, "block_hash", UINT64_MAX, REQUIRED, &h);
    if (st == KVO_OK && h != hash)
        st = answer_err(c, KVO_EPROTO,
                        "%s: block_hash %" PRIu64 ", asked "
                        "%" PRIu64,
                        bn, h, hash);
    if (st == KVO_OK) st = get_bool(c, &b, bn, "held", &l.held);
    if (st == KVO_OK)
        st = get_opt_hash(c, &b, bn, "parent_hash", &l.has_parent, &l.parent);
    if (st == KVO_OK)
        st = get_opt_hash(c, &b, bn, "tokens_hash", &has_th, &l.tokens_hash);
    if (st == KVO_OK && l.held && !has_th)
        st = answer_err(c, KVO_EPROTO, "%s: held without a tokens_hash", bn);
    if (st == KVO_OK)
        st = get_uint(c, &b, bn, "others", UINT32_MAX, REQUIRED, &l.others);
    if (st == KVO_OK)
        st = get_typed(c, &b, bn, "other_holders", KVO_JSON_ARR, REQUIRED,
                       &holders);
    for (size_t j = 0;
         st == KVO_OK && j < holders->len && l.n_holders < CHECK_LOOKUP_HOLDERS;
         j++) {
        kvo_jv pair, w, r;
        uint64_t wv, rv;
        if (!kvo_json_at(holders, j, &pair) || pair.type != KVO_JSON_ARR ||
            pair.len != 2 || !kvo_json_at(&pair, 0, &w) ||
            !kvo_json_u64(&w, &wv) || wv > UINT32_MAX ||
            !kvo_json_at(&pair, 1, &r) || !kvo_json_u64(&r, &rv) ||
            rv > UINT32_MAX)
            return answer_err(c, KVO_EPROTO,
                              "%s.other_holders[%zu]: "
                              "expected [worker_id, dp_rank]",
                              bn, j);
        l.holders[l.n_holders++] =
            (check_slot_info){(uint32_t)wv, (uint32_t)rv};
    }
    if (st == KVO_OK && l.others < l.n_holders)
        st = answer_err(c, KVO_EPROTO,
                        "%s: %u holders listed, others "
                        "says %" PRIu64,
                        bn, l.n_holders, l.others);
    const kvo_jv *tf = NULL, *under = NULL;
    if (st == KVO_OK)
        st = get_typed(c, &b, bn, "tokens_found", KVO_JSON_OBJ, OPTIONAL, &tf);
    if (st == KVO_OK && tf) {
        char tn[48];
        snprintf(tn, sizeof(tn), "%s.tokens_found", bn);
        if ((st = get_typed(c, tf, tn, "under", KVO_JSON_STR, REQUIRED,
                            &under)) == KVO_OK &&
            (st = get_uint(c, tf, tn, "block_hash", UINT64_MAX, REQUIRED,
                           &l.found_hash)) == KVO_OK) {
            if (strcmp(under->v.s, "parent") == 0)
                l.found = CHECK_FOUND_UNDER_PARENT;
            else if (strcmp(under->v.s, "root") == 0)
                l.found = CHECK_FOUND_UNDER_ROOT;
            else
                st =
                    answer_err(c, KVO_EPROTO,
                               "%s.under: expected \"parent\" or \"root\"", tn);
        }
    }
    if (st == KVO_OK) *out = l;
    return st;
}

kvo_status chk_index_lookup(chk_env *env, uint32_t worker, uint32_t dp_rank,
                            const check_chain_block *b, uint32_t n,
                            check_lookup *out, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/lookup", env->indexer_url);
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st = kvo_buf_printf(&body,
                                   "{\"worker_id\":%u,\"dp_rank\":%u,"
                                   "\"block_hashes\":[",
                                   worker, dp_rank);
    for (uint32_t i = 0; st == KVO_OK && i < n; i++)
        st = kvo_buf_printf(&body, "%s%" PRIu64, i ? "," : "", b[i].hash);
    if (st == KVO_OK)
        st = CHK_BUF_LIT(&body, "],\"chain\":{\"tokens_hashes\":[");
    for (uint32_t i = 0; st == KVO_OK && i < n; i++)
        st =
            kvo_buf_printf(&body, "%s%" PRIu64, i ? "," : "", b[i].tokens_hash);
    if (st == KVO_OK && n && b[0].has_parent)
        st = kvo_buf_printf(&body, "],\"first_parent\":%" PRIu64 "}}",
                            b[0].parent);
    else if (st == KVO_OK)
        st = CHK_BUF_LIT(&body, "],\"first_parent\":null}}");
    if (st == KVO_OK) st = json_call_send(&jc, env->idx_http, &body);
    const kvo_jv *blocks = NULL;
    if (st == KVO_OK)
        st = get_typed(&jc, jc.root, NULL, "blocks", KVO_JSON_ARR, REQUIRED,
                       &blocks);
    if (st == KVO_OK && blocks->len != n)
        st = answer_err(&jc, KVO_EPROTO, "%u blocks answered, %u asked",
                        (unsigned)blocks->len, n);
    for (uint32_t i = 0; st == KVO_OK && i < n; i++)
        st = lookup_entry(&jc, blocks, i, b[i].hash, &out[i]);
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

/* What kvo-check reads of a completion's answer, into out (written only
 * when all of it is right; out->kv_transfer_params is then owned). */
static kvo_status read_completion(const json_call *c, chk_completion *out) {
    const kvo_jv *usage, *details = NULL, *kvo = NULL;
    /* UINT64_MAX: absent or null (every field's range ends below it) */
    uint64_t prompt = UINT64_MAX, cached = UINT64_MAX, rank = UINT64_MAX,
             seq = UINT64_MAX;
    kvo_status st =
        get_typed(c, c->root, NULL, "usage", KVO_JSON_OBJ, OPTIONAL, &usage);
    if (st == KVO_OK)
        st = get_uint(c, usage, "usage", "prompt_tokens", INT64_MAX, OPTIONAL,
                      &prompt);
    if (st == KVO_OK)
        st = get_typed(c, usage, "usage", "prompt_tokens_details", KVO_JSON_OBJ,
                       OPTIONAL, &details);
    if (st == KVO_OK)
        st = get_uint(c, details, "usage.prompt_tokens_details",
                      "cached_tokens", INT64_MAX, OPTIONAL, &cached);
    if (st == KVO_OK)
        st = get_typed(c, c->root, NULL, "kvo", KVO_JSON_OBJ, OPTIONAL, &kvo);
    if (st == KVO_OK)
        st = get_uint(c, kvo, "kvo", "dp_rank", UINT32_MAX, OPTIONAL, &rank);
    if (st == KVO_OK)
        st = get_uint(c, kvo, "kvo", "last_seq", INT64_MAX, OPTIONAL, &seq);
    if (st != KVO_OK) return st;
    const kvo_jv *kv = kvo_json_get(c->root, "kv_transfer_params");
    char *params = NULL;
    if (kv && kv->type != KVO_JSON_NULL && !(params = json_text(kv)))
        return KVO_ENOMEM;
    out->prompt_tokens = prompt == UINT64_MAX ? -1 : (int64_t)prompt;
    out->cached_tokens = cached == UINT64_MAX ? -1 : (int64_t)cached;
    out->kvo = rank != UINT64_MAX;
    out->dp_rank = out->kvo ? (int64_t)rank : -1;
    out->last_seq = seq == UINT64_MAX ? -1 : (int64_t)seq;
    out->kv_transfer_params = params;
    return KVO_OK;
}

kvo_status chk_engine_complete(chk_engine *e, const char *model,
                               const chk_prompt *p, uint32_t max_tokens,
                               int dp_rank, const char *kv_params,
                               chk_completion *out, kvo_err *err) {
    return chk_engine_complete_via(e->http, e, model, p, max_tokens, dp_rank,
                                   kv_params, out, err);
}

kvo_status chk_engine_complete_via(kvo_http_client *h, const chk_engine *e,
                                   const char *model, const chk_prompt *p,
                                   uint32_t max_tokens, int dp_rank,
                                   const char *kv_params, chk_completion *out,
                                   kvo_err *err) {
    memset(out, 0, sizeof(*out));
    out->cached_tokens = out->prompt_tokens = out->dp_rank = out->last_seq = -1;
    json_call jc;
    json_call_init(&jc, err, "%s/v1/completions", e->url);
    kvo_buf body;
    kvo_buf_init(&body);
    /* an adapter is named as the model, as vLLM's OpenAI server takes it */
    json_object *mj =
        json_object_new_string(p->lora && p->lora[0] ? p->lora : model);
    kvo_status st = kvo_buf_printf(
        &body,
        "{\"model\":%s,\"max_tokens\":%u,\"ignore_eos\":true,"
        "\"stream\":false,\"%s\":",
        json_object_to_json_string_ext(mj, JSON_C_TO_STRING_PLAIN), max_tokens,
        p->trace_form ? "trace" : "prompt");
    json_object_put(mj);
    if (st == KVO_OK) st = kvo_buf_append(&body, p->json, p->len);
    if (st == KVO_OK && dp_rank >= 0)
        st = kvo_buf_printf(&body, ",\"data_parallel_rank\":%d", dp_rank);
    if (st == KVO_OK && kv_params)
        st = kvo_buf_printf(&body, ",\"kv_transfer_params\":%s", kv_params);
    if (st == KVO_OK && p->extra_len)
        st = kvo_buf_append(&body, p->extra, p->extra_len);
    if (st == KVO_OK) st = CHK_BUF_LIT(&body, "}");
    if (st == KVO_OK) st = json_call_send(&jc, h, &body);
    if (st == KVO_OK) st = read_completion(&jc, out);
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

kvo_status chk_engine_reset(chk_engine *e, kvo_err *err) {
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    char url[sizeof(e->url) + 32];
    snprintf(url, sizeof(url), "%s/reset_prefix_cache", e->url);
    kvo_status st =
        kvo_http_post(e->http, url, "application/json", "", 0, &resp);
    if (st != KVO_OK)
        kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "POST %s: %s (%s)", url,
                    kvo_strerror(st), kvo_http_client_error(e->http));
    else if (resp.status != 200) /* vLLM answers 200 and no body */
        st = kvo_err_set(err, KVO_EHTTP, KVO_ERR_NO_OFFSET,
                         "POST %s: HTTP %ld: %.200s", url, resp.status,
                         resp.body.data ? (const char *)resp.body.data : "");
    kvo_http_resp_fini(&resp);
    return st;
}

kvo_status chk_engine_model(chk_engine *e, char *model, size_t modelsz,
                            kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/v1/models", e->url);
    kvo_status st = json_call_send(&jc, e->http, NULL);
    if (st != KVO_OK) goto done;
    kvo_jv first;
    const kvo_jv *id = NULL;
    if (kvo_json_at(kvo_json_get(jc.root, "data"), 0, &first))
        id = kvo_json_get(&first, "id");
    if (!kvo_json_is(id, KVO_JSON_STR)) {
        st = answer_err(&jc, KVO_EPROTO, "no model listed (use --model)");
        goto done;
    }
    st = get_str_into(&jc, &first, "data[0]", "id", REQUIRED, model, modelsz);
done:
    json_call_fini(&jc);
    return st;
}

/* ---- Indexer ----------------------------------------------------------------*/

/* The indexer's answers are read twice: once to check every field, then
 * (nothing was wrong) to write the outputs; out NULL = check only. */

/* An entry's optional "tiers": {"host_pinned": N} (obj, named where)
 * into *host (N, cumulative: at least the device run b) and *has; other
 * tiers are not judged. */
static kvo_status read_entry_tiers(const json_call *c, const kvo_jv *obj,
                                   const char *where, uint64_t b,
                                   uint64_t *host, bool *has) {
    const kvo_jv *t;
    char tn[48];
    *host = b;
    *has = false;
    kvo_status st =
        get_typed(c, obj, where, "tiers", KVO_JSON_OBJ, OPTIONAL, &t);
    if (st != KVO_OK || !t) return st;
    *has = true;
    field_name(tn, sizeof(tn), where, "tiers");
    st = get_uint(c, t, tn, "host_pinned", UINT32_MAX, OPTIONAL, host);
    if (st == KVO_OK && *host < b)
        st = answer_err(c, KVO_EPROTO,
                        "%s.host_pinned: %" PRIu64 ", below the device run "
                        "%" PRIu64 " (a tier's score counts the device run "
                        "too)",
                        tn, *host, b);
    return st;
}

/* {"scores": [{"worker_id", "dp_rank", "blocks", "tiers"?}, ...]} of a
 * query answer into scores per slot, and (tiers not NULL) the host_pinned
 * scores; workers that are not ours (a shared NATS) are not compared. */
static kvo_status read_scores(const chk_env *env, const json_call *c,
                              uint32_t *scores, chk_tiers *tiers) {
    const kvo_jv *arr;
    kvo_status st =
        get_typed(c, c->root, NULL, "scores", KVO_JSON_ARR, REQUIRED, &arr);
    uint32_t n = env->n_workers * env->dp_size;
    for (uint32_t s = 0; scores && s < n; s++) scores[s] = 0;
    for (uint32_t s = 0; tiers && s < n; s++) tiers->host[s] = 0;
    if (tiers) tiers->answered = false;
    for (size_t i = 0; st == KVO_OK && i < arr->len; i++) {
        kvo_jv o;
        char name[32];
        uint64_t w = 0, r = 0, b = 0, host = 0;
        bool has = false;
        st = elem_obj(c, arr, "scores", i, &o, name, sizeof(name));
        if (st == KVO_OK)
            st = get_uint(c, &o, name, "worker_id", UINT64_MAX, REQUIRED, &w);
        if (st == KVO_OK)
            st = get_uint(c, &o, name, "dp_rank", UINT32_MAX, REQUIRED, &r);
        if (st == KVO_OK)
            st = get_uint(c, &o, name, "blocks", UINT32_MAX, REQUIRED, &b);
        if (st == KVO_OK) st = read_entry_tiers(c, &o, name, b, &host, &has);
        if (st != KVO_OK || w >= env->n_workers || r >= env->dp_size) continue;
        if (scores) scores[w * env->dp_size + r] = (uint32_t)b;
        if (tiers) {
            tiers->host[w * env->dp_size + r] = (uint32_t)host;
            tiers->answered |= has;
        }
    }
    return st;
}

/* {"<worker_id>": {"<dp_rank>": tokens}} (obj, named where) into blocks
 * per slot (tokens / block_size; tokens that are not whole blocks are
 * refused); workers and ranks that are not ours are not compared. */
static kvo_status read_token_map(const chk_env *env, const json_call *c,
                                 const kvo_jv *obj, const char *where,
                                 const char *inner, uint32_t *blocks) {
    for (uint32_t s = 0; s < env->n_workers * env->dp_size; s++) blocks[s] = 0;
    kvo_status st = KVO_OK;
    for (uint32_t i = 0; st == KVO_OK && i < obj->len; i++) {
        const kvo_jmember *w = &obj->v.members[i];
        uint64_t wid, rank, tokens = 0;
        char wname[64], name[96];
        snprintf(wname, sizeof(wname), "%s.%.24s", where, w->key);
        snprintf(name, sizeof(name), "%s%s%s", wname, inner ? "." : "",
                 inner ? inner : "");
        const kvo_jv *ranks = &w->value;
        if (kvo_parse_u64(w->key, &wid) != KVO_OK)
            return answer_err(c, KVO_EPROTO,
                              "%s: key \"%.40s\" is not a worker id", where,
                              w->key);
        if (inner && (st = get_typed(c, ranks, wname, inner, KVO_JSON_OBJ,
                                     REQUIRED, &ranks)) != KVO_OK)
            return st;
        if (!kvo_json_is(ranks, KVO_JSON_OBJ))
            return answer_err(c, KVO_EPROTO, "%s: expected an object", name);
        for (uint32_t k = 0; st == KVO_OK && k < ranks->len; k++) {
            const kvo_jmember *r = &ranks->v.members[k];
            if (kvo_parse_u64(r->key, &rank) != KVO_OK || rank > UINT32_MAX)
                return answer_err(c, KVO_EPROTO,
                                  "%s: key \"%.40s\" is not a dp rank", name,
                                  r->key);
            st =
                get_uint(c, ranks, name, r->key, UINT32_MAX, REQUIRED, &tokens);
            if (st == KVO_OK && tokens % env->block_size)
                return answer_err(c, KVO_EPROTO,
                                  "%s.%s: %" PRIu64 " tokens is not a whole "
                                  "number of %u-token blocks",
                                  name, r->key, tokens, env->block_size);
            if (st == KVO_OK && wid < env->n_workers && rank < env->dp_size)
                blocks[wid * env->dp_size + rank] =
                    (uint32_t)(tokens / env->block_size);
        }
    }
    return st;
}

/* A Dynamo query answer into blocks per slot: {"scores": {"<worker_id>":
 * {"<dp_rank>": tokens}}, "instances": {"<worker_id>": {"dp":
 * {"<dp_rank>": tokens}, "gpu", "cpu", "disk", ...}}}. Either may be
 * missing (RFC #1403's per-instance, per-tier shape has only the second);
 * when both are there they must agree, or the answer is refused. */
static kvo_status read_dynamo_scores(const chk_env *env, const json_call *c,
                                     uint32_t *scores) {
    const kvo_jv *sc, *in;
    uint32_t a[CHK_MAX_ENGINES * CHK_MAX_DP], b[CHK_MAX_ENGINES * CHK_MAX_DP];
    kvo_status st;
    if ((st = get_typed(c, c->root, NULL, "scores", KVO_JSON_OBJ, OPTIONAL,
                        &sc)) != KVO_OK ||
        (st = get_typed(c, c->root, NULL, "instances", KVO_JSON_OBJ, OPTIONAL,
                        &in)) != KVO_OK)
        return st;
    if (!sc && !in)
        return answer_err(c, KVO_EPROTO,
                          "neither \"scores\" nor "
                          "\"instances\" in the answer");
    if (sc && (st = read_token_map(env, c, sc, "scores", NULL, a)) != KVO_OK)
        return st;
    if (in && (st = read_token_map(env, c, in, "instances", "dp", b)) != KVO_OK)
        return st;
    uint32_t n = env->n_workers * env->dp_size;
    for (uint32_t s = 0; sc && in && s < n; s++)
        if (a[s] != b[s])
            return answer_err(c, KVO_EPROTO,
                              "scores and instances disagree: worker %u rank "
                              "%u has %u blocks in one, %u in the other",
                              s / env->dp_size, s % env->dp_size, a[s], b[s]);
    if (scores) memcpy(scores, sc ? a : b, n * sizeof(*scores));
    return KVO_OK;
}

/* {"publishers": [{"publisher_id", "zmq_seq_last"}, ...]} of obj (at
 * where) into w (raw untouched); with dynamo, the Dynamo listener's
 * {"instances": [{"instance_id", "dp_rank", "zmq_seq_last"}, ...]}, each
 * under the publisher chk_rank_key(instance_id, dp_rank). */
static kvo_status read_watermark(const json_call *c, const kvo_jv *obj,
                                 const char *where, bool dynamo,
                                 chk_watermark *w) {
    const kvo_jv *pubs;
    char arr_name[48];
    const char *arr = dynamo ? "instances" : "publishers";
    field_name(arr_name, sizeof(arr_name), where, arr);
    kvo_status st =
        get_typed(c, obj, where, arr, KVO_JSON_ARR, REQUIRED, &pubs);
    if (st != KVO_OK) return st;
    size_t n = pubs->len;
    if (w) {
        uint64_t *p = kvo_realloc(w->publisher, (n ? n : 1) * sizeof(*p));
        if (p) w->publisher = p;
        int64_t *z = kvo_realloc(w->zmq_last, (n ? n : 1) * sizeof(*z));
        if (z) w->zmq_last = z;
        if (!p || !z) return KVO_ENOMEM;
        w->n = n;
    }
    for (size_t i = 0; st == KVO_OK && i < n; i++) {
        kvo_jv o;
        char name[64];
        uint64_t id = 0, rank = 0, last = UINT64_MAX; /* null: none applied */
        st = elem_obj(c, pubs, arr_name, i, &o, name, sizeof(name));
        if (st == KVO_OK && !dynamo)
            st = get_uint(c, &o, name, "publisher_id", UINT64_MAX, REQUIRED,
                          &id);
        if (st == KVO_OK && dynamo &&
            (st = get_uint(c, &o, name, "instance_id", UINT32_MAX, REQUIRED,
                           &id)) == KVO_OK &&
            (st = get_uint(c, &o, name, "dp_rank", UINT32_MAX, REQUIRED,
                           &rank)) == KVO_OK)
            id = chk_rank_key((uint32_t)id, (uint32_t)rank);
        if (st == KVO_OK)
            st = get_uint(c, &o, name, "zmq_seq_last", INT64_MAX, OPTIONAL,
                          &last);
        if (st == KVO_OK && w) {
            w->publisher[i] = id;
            w->zmq_last[i] = last == UINT64_MAX ? -1 : (int64_t)last;
        }
    }
    return st;
}

/* A waited query's "covered" and "watermark" into *covered and wm.
 * KVO_EUNSUPPORTED when the answer has neither: the indexer ignored the
 * wait. */
static kvo_status read_wait(const json_call *c, chk_watermark *wm,
                            bool *covered) {
    const kvo_jv *w = kvo_json_get(c->root, "watermark");
    const kvo_jv *cov = kvo_json_get(c->root, "covered");
    if (!w || !cov)
        return answer_err(c, KVO_EUNSUPPORTED,
                          "the indexer does not wait for watermarks");
    kvo_status st;
    if ((st = get_typed(c, c->root, NULL, "covered", KVO_JSON_BOOL, REQUIRED,
                        &cov)) != KVO_OK ||
        (st = get_typed(c, c->root, NULL, "watermark", KVO_JSON_OBJ, REQUIRED,
                        &w)) != KVO_OK ||
        (st = read_watermark(c, w, "watermark", false, wm)) != KVO_OK)
        return st;
    if (wm) {
        *covered = cov->v.b;
        kvo_buf_reset(&wm->raw);
    }
    return KVO_OK;
}

/* The indexer's /metrics text that came with a query into metrics. */
static kvo_status read_metrics(const json_call *c, kvo_buf *metrics) {
    const kvo_jv *m;
    kvo_status st =
        get_typed(c, c->root, NULL, "metrics", KVO_JSON_STR, OPTIONAL, &m);
    if (st == KVO_OK && !m)
        st = answer_err(c, KVO_EUNSUPPORTED,
                        "the indexer does not return its metrics with a "
                        "query");
    if (st != KVO_OK || !metrics) return st;
    kvo_buf_reset(metrics);
    return kvo_buf_append(metrics, m->v.s, m->len);
}

/* Dynamo's POST /query_by_hash {"block_hashes": [i64...], "model_name"}:
 * the same 64 bits as signed integers (Dynamo's LocalBlockHash on the
 * wire). No wait, no metrics: the callers ask for neither in this mode. */
static kvo_status dynamo_query(kvo_http_client *h, const chk_env *env,
                               const uint64_t *hashes, size_t n, json_call *jc,
                               kvo_buf *body, uint32_t *scores) {
    kvo_status st = CHK_BUF_LIT(body, "{\"block_hashes\":[");
    for (size_t i = 0; st == KVO_OK && i < n; i++)
        st = kvo_buf_printf(body, "%s%" PRId64, i ? "," : "",
                            (int64_t)hashes[i]);
    if (st == KVO_OK) st = CHK_BUF_LIT(body, "]");
    if (st == KVO_OK) st = str_member(body, "model_name", env->model_name);
    if (st == KVO_OK) st = CHK_BUF_LIT(body, "}");
    if (st == KVO_OK) st = json_call_send(jc, h, body);
    if (st == KVO_OK) st = read_dynamo_scores(env, jc, NULL);
    if (st == KVO_OK) st = read_dynamo_scores(env, jc, scores);
    return st;
}

/* POST /register of one engine rank with a Dynamo indexer: {instance_id:
 * the worker, dp_rank, model_name, endpoint, replay_endpoint?, block_size};
 * or /unregister of the whole engine: {instance_id, model_name} (Dynamo
 * honours a dp_rank there only with a routing_group). */
kvo_status chk_index_dynamo_register(chk_env *env, const chk_engine *e,
                                     const chk_rank *rk, bool on,
                                     kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/%s", env->indexer_url,
                   on ? "register" : "unregister");
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st = kvo_buf_printf(&body, "{\"instance_id\":%u", e->worker_id);
    if (st == KVO_OK) st = str_member(&body, "model_name", env->model_name);
    if (st == KVO_OK && on) {
        st = kvo_buf_printf(&body, ",\"dp_rank\":%u", rk->dp_rank);
        if (st == KVO_OK) st = str_member(&body, "endpoint", rk->zmq);
        if (st == KVO_OK && rk->replay[0])
            st = str_member(&body, "replay_endpoint", rk->replay);
        if (st == KVO_OK)
            st = kvo_buf_printf(&body, ",\"block_size\":%u", env->block_size);
    }
    if (st == KVO_OK) st = CHK_BUF_LIT(&body, "}");
    if (st == KVO_OK) st = json_call_send(&jc, env->idx_http, &body);
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

kvo_status chk_index_query(chk_env *env, const uint64_t *hashes, size_t n,
                           uint32_t *scores, chk_tiers *tiers, kvo_err *err) {
    return chk_index_query_via(env->idx_http, env, hashes, n, NULL, 0, -1,
                               scores, tiers, NULL, NULL, NULL, err);
}

kvo_status chk_index_query_wait(chk_env *env, const uint64_t *hashes, size_t n,
                                const uint64_t *pairs, size_t npairs,
                                long timeout_ms, uint32_t *scores,
                                chk_tiers *tiers, chk_watermark *wm,
                                bool *covered, kvo_buf *metrics, kvo_err *err) {
    return chk_index_query_via(env->idx_http, env, hashes, n, pairs, npairs,
                               timeout_ms, scores, tiers, wm, covered, metrics,
                               err);
}

kvo_status chk_index_query_via(kvo_http_client *h, const chk_env *env,
                               const uint64_t *hashes, size_t n,
                               const uint64_t *pairs, size_t npairs,
                               long timeout_ms, uint32_t *scores,
                               chk_tiers *tiers, chk_watermark *wm,
                               bool *covered, kvo_buf *metrics, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/query_by_hash", env->indexer_url);
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st;
    if (env->cfg->indexer_api == CHECK_API_DYNAMO) {
        st = dynamo_query(h, env, hashes, n, &jc, &body, scores);
        /* Dynamo's answer has its tiers per instance ("cpu"), not per
         * rank: the device scores stand for them */
        if (st == KVO_OK && tiers && scores) {
            memcpy(tiers->host, scores,
                   (size_t)env->n_workers * env->dp_size * sizeof(*scores));
            tiers->answered = false;
        }
        json_call_fini(&jc);
        kvo_buf_fini(&body);
        return st;
    }
    st = CHK_BUF_LIT(&body, "{\"tokens_hashes\":");
    if (st == KVO_OK) st = chk_json_u64s(&body, hashes, n);
    if (st == KVO_OK && wm) {
        st =
            kvo_buf_printf(&body, ",\"wait\":{\"timeout_ms\":%ld,\"zmq_seq\":[",
                           timeout_ms < 0 ? 0 : timeout_ms);
        for (size_t i = 0; st == KVO_OK && i < npairs; i++)
            st = kvo_buf_printf(&body, "%s[%" PRIu64 ",%" PRIu64 "]",
                                i ? "," : "", pairs[2 * i], pairs[2 * i + 1]);
        if (st == KVO_OK) st = CHK_BUF_LIT(&body, "]}");
    }
    if (st == KVO_OK && metrics) st = CHK_BUF_LIT(&body, ",\"metrics\":true");
    if (st == KVO_OK) st = CHK_BUF_LIT(&body, "}");
    if (st == KVO_OK) st = json_call_send(&jc, h, &body);
    for (int write = 0; write < 2 && st == KVO_OK; write++) {
        st = read_scores(env, &jc, write ? scores : NULL, write ? tiers : NULL);
        if (st == KVO_OK && wm) st = read_wait(&jc, write ? wm : NULL, covered);
        if (st == KVO_OK && metrics)
            st = read_metrics(&jc, write ? metrics : NULL);
    }
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

void chk_watermark_fini(chk_watermark *w) {
    kvo_free(w->publisher);
    kvo_free(w->zmq_last);
    kvo_buf_fini(&w->raw);
    memset(w, 0, sizeof(*w));
}

kvo_status chk_index_watermark(chk_env *env, chk_watermark *w, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/watermark", env->indexer_url);
    bool dynamo = env->cfg->indexer_api == CHECK_API_DYNAMO;
    kvo_status st = json_call_send(&jc, env->idx_http, NULL);
    if (st == KVO_OK) st = read_watermark(&jc, jc.root, NULL, dynamo, NULL);
    if (st == KVO_OK) st = read_watermark(&jc, jc.root, NULL, dynamo, w);
    if (st == KVO_OK) {
        kvo_buf_reset(&w->raw);
        st = kvo_buf_append(&w->raw, jc.resp.body.data, jc.resp.body.len);
    }
    json_call_fini(&jc);
    return st;
}

kvo_status chk_index_settle_view(chk_env *env, const uint64_t *hashes, size_t n,
                                 chk_watermark *w, kvo_err *err) {
    if (env->cfg->indexer_api != CHECK_API_DYNAMO || env->dynamo_watermark)
        return chk_index_watermark(env, w, err);
    json_call jc;
    json_call_init(&jc, err, "%s/query_by_hash", env->indexer_url);
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st =
        dynamo_query(env->idx_http, env, hashes, n, &jc, &body, NULL);
    if (st == KVO_OK) {
        kvo_buf_reset(&w->raw);
        st = kvo_buf_append(&w->raw, jc.resp.body.data, jc.resp.body.len);
    }
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

int64_t chk_watermark_get(const chk_watermark *w, uint64_t publisher,
                          bool *present) {
    for (size_t i = 0; i < w->n; i++)
        if (w->publisher[i] == publisher) {
            if (present) *present = true;
            return w->zmq_last[i];
        }
    if (present) *present = false;
    return -1;
}

kvo_status chk_metrics_fetch(kvo_http_client *c, const char *url,
                             kvo_http_resp *resp, kvo_err *err) {
    kvo_status st = kvo_http_get(c, url, resp);
    if (st != KVO_OK) {
        kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "GET %s: %s (%s)", url,
                    kvo_strerror(st), kvo_http_client_error(c));
    } else if (resp->status != 200) {
        st = kvo_err_set(err, KVO_EHTTP, KVO_ERR_NO_OFFSET, "GET %s: HTTP %ld",
                         url, resp->status);
    }
    return st;
}

/* GET url's Prometheus text into counters under stage (NULL: the
 * indexer's, check_counters_parse_indexer). */
static kvo_status read_prom(kvo_http_client *c, const char *url,
                            const char *stage, check_counters *counters,
                            kvo_err *err) {
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    kvo_status st = chk_metrics_fetch(c, url, &resp, err);
    const char *text = (const char *)resp.body.data;
    if (st == KVO_OK)
        st = stage
                 ? check_counters_parse_prom(counters, stage, text,
                                             resp.body.len)
                 : check_counters_parse_indexer(counters, text, resp.body.len);
    kvo_http_resp_fini(&resp);
    return st;
}

kvo_status chk_json_u64s(kvo_buf *b, const uint64_t *v, size_t n) {
    /* each number and its comma, and the brackets */
    kvo_status st = kvo_buf_reserve(b, n * (U64_DIGITS + 1) + 2);
    if (st != KVO_OK) return st;
    char *p = (char *)b->data + b->len;
    *p++ = '[';
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233"
        "34353637383940414243444546474849505152535455565758596061626364656667"
        "6869707172737475767778798081828384858687888990919293949596979899";
    for (size_t i = 0; i < n; i++) {
        if (i) *p++ = ',';
        char tmp[U64_DIGITS];
        int k = U64_DIGITS;
        uint64_t x = v[i];
        while (x >= 100) { /* two digits per division */
            unsigned d = (unsigned)(x % 100) * 2;
            x /= 100;
            tmp[--k] = pairs[d + 1];
            tmp[--k] = pairs[d];
        }
        if (x >= 10) {
            tmp[--k] = pairs[x * 2 + 1];
            tmp[--k] = pairs[x * 2];
        } else {
            tmp[--k] = (char)('0' + x);
        }
        memcpy(p, tmp + k, (size_t)(U64_DIGITS - k));
        p += U64_DIGITS - k;
    }
    *p++ = ']';
    b->len = (size_t)(p - (char *)b->data);
    return KVO_OK;
}

kvo_status chk_counters_relay(chk_relay *r, check_counters *c, kvo_err *err) {
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/metrics", r->metrics_port);
    return read_prom(r->http, url, r->stage, c, err);
}

kvo_status chk_counters_indexer(chk_env *env, check_counters *c, kvo_err *err) {
    char url[256];
    snprintf(url, sizeof(url), "%s/metrics", env->indexer_url);
    return read_prom(env->idx_metrics, url, NULL, c, err);
}

kvo_status chk_index_health(chk_env *env, char *status, size_t statussz,
                            char *nats, size_t natssz, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, err, "%s/health", env->indexer_url);
    kvo_status st = json_call_send(&jc, env->idx_http, NULL);
    if (st == KVO_OK)
        st = get_str_into(&jc, jc.root, NULL, "status", REQUIRED, status,
                          statussz);
    if (st == KVO_OK) {
        snprintf(nats, natssz, "?");
        st = get_str_into(&jc, jc.root, NULL, "nats", OPTIONAL, nats, natssz);
    }
    json_call_fini(&jc);
    return st;
}

kvo_status chk_relay_live(chk_relay *r, bool *live) {
    json_call jc;
    json_call_init(&jc, NULL, "http://127.0.0.1:%u/stats", r->metrics_port);
    const kvo_jv *srcs = NULL;
    kvo_status st = json_call_send(&jc, r->http, NULL);
    if (st == KVO_OK)
        st = get_typed(&jc, jc.root, NULL, "sources", KVO_JSON_ARR, REQUIRED,
                       &srcs);
    bool all = st == KVO_OK && srcs->len > 0;
    for (size_t i = 0; all && i < srcs->len; i++) {
        kvo_jv s;
        char name[32];
        const kvo_jv *state = NULL;
        st = elem_obj(&jc, srcs, "sources", i, &s, name, sizeof(name));
        if (st == KVO_OK)
            st = get_typed(&jc, &s, name, "state", KVO_JSON_STR, REQUIRED,
                           &state);
        all = st == KVO_OK && strcmp(state->v.s, "live") == 0;
    }
    *live = all;
    json_call_fini(&jc);
    return st;
}

void chk_relay_where(chk_relay *r, uint32_t dp_rank, int64_t seq, char *out,
                     size_t n) {
    json_call jc;
    kvo_err err = {0};
    json_call_init(&jc, &err, "http://127.0.0.1:%u/stats", r->metrics_port);
    const kvo_jv *srcs = NULL, *state = NULL, *conn = NULL, *nats = NULL;
    uint64_t last = UINT64_MAX, buffered = 0;
    bool found = false;
    kvo_status st = json_call_send(&jc, r->http, NULL);
    if (st == KVO_OK)
        st = get_typed(&jc, jc.root, NULL, "sources", KVO_JSON_ARR, REQUIRED,
                       &srcs);
    if (st == KVO_OK)
        st = get_typed(&jc, jc.root, NULL, "nats_connected", KVO_JSON_BOOL,
                       REQUIRED, &nats);
    if (st == KVO_OK)
        st = get_uint(&jc, jc.root, NULL, "nats_buffered", UINT64_MAX, OPTIONAL,
                      &buffered);
    for (size_t i = 0; st == KVO_OK && !found && i < srcs->len; i++) {
        kvo_jv s;
        char name[32];
        uint64_t rank = 0;
        st = elem_obj(&jc, srcs, "sources", i, &s, name, sizeof(name));
        if (st == KVO_OK)
            st =
                get_uint(&jc, &s, name, "dp_rank", UINT32_MAX, REQUIRED, &rank);
        if (st != KVO_OK || rank != dp_rank) continue;
        found = true;
        if ((st = get_typed(&jc, &s, name, "state", KVO_JSON_STR, REQUIRED,
                            &state)) == KVO_OK &&
            (st = get_typed(&jc, &s, name, "connected", KVO_JSON_BOOL, REQUIRED,
                            &conn)) == KVO_OK)
            st =
                get_uint(&jc, &s, name, "last_seq", INT64_MAX, OPTIONAL, &last);
    }
    if (st != KVO_OK)
        snprintf(out, n,
                 "relay %s: its /stats did not say where seq %lld "
                 "is (%.200s)",
                 r->stage, (long long)seq, err.msg);
    else if (!found)
        snprintf(out, n, "relay %s has no source for rank %u", r->stage,
                 dp_rank);
    else if (last == UINT64_MAX || (int64_t)last < seq)
        snprintf(out, n,
                 "relay %s has not received seq %lld from the engine: its "
                 "last is %s%lld (source %s, ZMQ %s)",
                 r->stage, (long long)seq, last == UINT64_MAX ? "none " : "",
                 last == UINT64_MAX ? -1LL : (long long)last, state->v.s,
                 conn->v.b ? "connected" : "disconnected");
    else if (!nats->v.b)
        snprintf(out, n,
                 "relay %s received seq %lld but its NATS connection is "
                 "down (%" PRIu64 " messages buffered)",
                 r->stage, (long long)seq, buffered);
    else
        snprintf(out, n,
                 "relay %s received seq %lld (its last is %lld) and is "
                 "connected to NATS: it was lost between NATS and the "
                 "indexer, or the indexer did not apply it",
                 r->stage, (long long)seq, (long long)last);
    json_call_fini(&jc);
}

/* ---- Cached block sets (checkpoints) -------------------------------------------
 * kvo-mocker GET /kvo/blocks?rank=R[&after=H]
 *   {"rank", "count", "digest", "blocks": [[hash, parent|null], ...],
 *    "next": H|null}
 * kvo-indexer GET /blocks?worker_id=W&dp_rank=R[&after=H][&digest_only=1]
 *   {"worker_id", "dp_rank", "count", "digest", "blocks": [...], "next"?}
 * count and digest cover the whole set, blocks one page of it; the pages
 * are followed until "next" is absent or null. A set that changes between
 * two pages (another count or digest) is an error: the side was not
 * quiet. */

void chk_blocks_init(chk_blocks *b) { memset(b, 0, sizeof(*b)); }

void chk_blocks_fini(chk_blocks *b) {
    kvo_free(b->v);
    memset(b, 0, sizeof(*b));
}

/* Entry i of the "blocks" array: [hash, parent|null] into *out. */
static kvo_status block_entry(const json_call *c, const kvo_jv *arr, size_t i,
                              check_block *out) {
    kvo_jv e, h, p;
    char got[32];
    if (!kvo_json_at(arr, i, &e) || e.type != KVO_JSON_ARR || e.len != 2)
        return answer_err(c, KVO_EPROTO,
                          "blocks[%zu]: expected [hash, parent|null], got %s",
                          i, describe(&e, got, sizeof(got)));
    uint64_t hash, parent = 0;
    if (!kvo_json_at(&e, 0, &h) || !kvo_json_u64(&h, &hash))
        return answer_err(c, KVO_EPROTO,
                          "blocks[%zu][0]: expected a block hash (an integer "
                          "in [0, 2^64)), got %s",
                          i, describe(&h, got, sizeof(got)));
    if (!kvo_json_at(&e, 1, &p) ||
        (p.type != KVO_JSON_NULL && !kvo_json_u64(&p, &parent)))
        return answer_err(c, KVO_EPROTO,
                          "blocks[%zu][1]: expected a parent hash or null, "
                          "got %s",
                          i, describe(&p, got, sizeof(got)));
    out->hash = hash;
    out->has_parent = p.type != KVO_JSON_NULL;
    out->parent = parent;
    return KVO_OK;
}

/* One page into out (count, digest, blocks appended); *more and *next: the
 * page after. list false: a digest-only answer (no blocks needed). */
static kvo_status read_block_page(const json_call *c, bool list, bool first,
                                  chk_blocks *out, bool *more, uint64_t *next) {
    uint64_t count = 0, digest = 0, nx = UINT64_MAX;
    const kvo_jv *arr = NULL;
    bool has_next = false;
    kvo_status st =
        get_uint(c, c->root, NULL, "count", INT64_MAX, REQUIRED, &count);
    if (st == KVO_OK)
        st =
            get_uint(c, c->root, NULL, "digest", UINT64_MAX, REQUIRED, &digest);
    if (st == KVO_OK)
        st = get_typed(c, c->root, NULL, "blocks", KVO_JSON_ARR,
                       list ? REQUIRED : OPTIONAL, &arr);
    if (st == KVO_OK && list) {
        const kvo_jv *n = kvo_json_get(c->root, "next");
        has_next = n && n->type != KVO_JSON_NULL;
        if (has_next)
            st = get_uint(c, c->root, NULL, "next", UINT64_MAX, REQUIRED, &nx);
    }
    if (st != KVO_OK) return st;
    if (!first && (count != out->count || digest != out->digest))
        return answer_err(c, KVO_ESTATE,
                          "the set changed while it was listed (count %" PRIu64
                          " digest %" PRIu64 ", the first page said %" PRIu64
                          " and %" PRIu64 ")",
                          count, digest, out->count, out->digest);
    size_t n = list ? arr->len : 0;
    if (n > count || out->n + n > count)
        return answer_err(c, KVO_EPROTO,
                          "%zu blocks listed, more than the count %" PRIu64,
                          out->n + n, count);
    if (list && has_next && n == 0)
        return answer_err(c, KVO_EPROTO, "an empty page with a next page");
    check_block *v = NULL;
    if (n) {
        if ((st = kvo_grow(&out->v, &out->cap, out->n + n, sizeof(*out->v),
                           1024)) != KVO_OK)
            return st;
        v = out->v + out->n;
    }
    for (size_t i = 0; i < n; i++)
        if ((st = block_entry(c, arr, i, &v[i])) != KVO_OK) return st;
    out->n += n;
    out->count = count;
    out->digest = digest;
    *more = has_next;
    *next = nx;
    return KVO_OK;
}

/* Every page of base (a URL with its query, to which "&after=H" is added)
 * into out, replaced. tiered: base names a tier, and a 400 answer is
 * KVO_EUNSUPPORTED (a service that does not know the parameter). */
static kvo_status read_blocks(kvo_http_client *h, const char *base, bool list,
                              bool tiered, chk_blocks *out, kvo_err *err) {
    chk_blocks got;
    chk_blocks_init(&got);
    kvo_status st = KVO_OK;
    bool more = true, first = true;
    uint64_t after = 0;
    while (st == KVO_OK && more) {
        json_call jc;
        if (first)
            json_call_init(&jc, err, "%s", base);
        else
            json_call_init(&jc, err, "%s&after=%" PRIu64, base, after);
        st = json_call_send(&jc, h, NULL);
        if (st == KVO_EHTTP && tiered && jc.resp.status == 400) {
            char q[4 * ERROR_QUOTE + 4];
            const uint8_t *b = jc.resp.body.data;
            st = answer_err(&jc, KVO_EUNSUPPORTED, "HTTP 400: %s",
                            quote(q, sizeof(q), b ? b : (const uint8_t *)"",
                                  jc.resp.body.len, ERROR_QUOTE));
        }
        if (st == KVO_OK)
            st = read_block_page(&jc, list, first, &got, &more, &after);
        json_call_fini(&jc);
        first = false;
        if (!list) more = false;
    }
    if (st == KVO_OK && list && got.n != got.count) {
        st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                         "GET %s: %zu blocks listed in all, the count says "
                         "%" PRIu64,
                         base, got.n, got.count);
    }
    if (st == KVO_OK) {
        chk_blocks_fini(out);
        *out = got;
    } else {
        chk_blocks_fini(&got);
    }
    return st;
}

kvo_status chk_engine_blocks(chk_engine *e, uint32_t dp_rank, wire_tier tier,
                             chk_blocks *out, kvo_err *err) {
    if (tier != WIRE_TIER_DEVICE && tier != WIRE_TIER_HOST_PINNED)
        return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                           "kvo-mocker has no %s tier", wire_tier_name(tier));
    char base[256];
    /* the GPU pool's set is asked for as before (engines without tiers) */
    snprintf(base, sizeof(base), "%s/kvo/blocks?rank=%u%s", e->url, dp_rank,
             tier == WIRE_TIER_HOST_PINNED ? "&tier=cpu" : "");
    return read_blocks(e->http, base, true, false, out, err);
}

kvo_status chk_index_blocks(chk_env *env, uint32_t worker, uint32_t dp_rank,
                            wire_tier tier, bool list, chk_blocks *out,
                            kvo_err *err) {
    char base[256], t[32] = "";
    /* the device set is asked for as before (indexers without tiers) */
    if (tier != WIRE_TIER_DEVICE)
        snprintf(t, sizeof(t), "&tier=%s", wire_tier_name(tier));
    snprintf(base, sizeof(base), "%s/blocks?worker_id=%u&dp_rank=%u%s%s",
             env->indexer_url, worker, dp_rank, t,
             list ? "" : "&digest_only=1");
    return read_blocks(env->idx_http, base, list, tier != WIRE_TIER_DEVICE, out,
                       err);
}
