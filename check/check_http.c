/* check_http.c -- every HTTP call kvo-check makes, and the parsing of the
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
 *   relay    GET  /metrics, /stats     counters, source state
 *
 * Request bodies are written by hand (numbers only, and the prompt JSON is
 * built once per request by the driver); answers are parsed with json-c,
 * which keeps u64 exact.
 */
#include "check_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Nesting a JSON answer may have; characters of an answer quoted in an
 * error (the body of an HTTP error, an answer that is not JSON). */
enum { ANSWER_DEPTH_MAX = 64, ERROR_QUOTE = 200, NOT_JSON_QUOTE = 120 };
/* Decimal digits of the largest u64. */
enum { U64_DIGITS = 20 };

/* One call with a JSON answer: json_call_init (names the URL),
 * json_call_send, then json_call_fini whatever happened in between. */
typedef struct json_call {
    char url[256];      /* also named in every error message */
    kvo_http_resp resp; /* the raw answer */
    json_object *j;     /* its parse (owned); NULL until sent and parsed */
} json_call;

static void json_call_init(json_call *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void json_call_init(json_call *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->url, sizeof(c->url), fmt, ap);
    va_end(ap);
    kvo_http_resp_init(&c->resp);
    c->j = NULL;
}

static void json_call_fini(json_call *c) {
    json_object_put(c->j);
    c->j = NULL;
    kvo_http_resp_fini(&c->resp);
}

/* GET (body NULL) or POST the JSON body to c->url, then parse the answer
 * into c->j (status 200 required). */
static kvo_status json_call_send(json_call *c, kvo_http_client *h,
                                 const kvo_buf *body, kvo_err *err) {
    const char *method = body ? "POST" : "GET";
    kvo_status st = body ? kvo_http_post(h, c->url, "application/json",
                                         body->data, body->len, &c->resp)
                         : kvo_http_get(h, c->url, &c->resp);
    if (st != KVO_OK) {
        return kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "%s %s: %s (%s)", method,
                           c->url, kvo_strerror(st), kvo_http_client_error(h));
    }
    const char *text = c->resp.body.data ? (const char *)c->resp.body.data : "";
    if (c->resp.status != 200) {
        return kvo_err_set(err, KVO_EHTTP, KVO_ERR_NO_OFFSET,
                           "%s %s: HTTP %ld: %.*s", method, c->url,
                           c->resp.status, ERROR_QUOTE, text);
    }
    json_tokener *tok = json_tokener_new_ex(ANSWER_DEPTH_MAX);
    if (!tok) return KVO_ENOMEM;
    json_object *j = json_tokener_parse_ex(tok, text, (int)c->resp.body.len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    json_tokener_free(tok);
    if (!j || je != json_tokener_success) {
        json_object_put(j);
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "%s: answer is not JSON: %.*s", c->url,
                           NOT_JSON_QUOTE, text);
    }
    c->j = j;
    return KVO_OK;
}

static json_object *get_key(json_object *o, const char *k) {
    json_object *v = NULL;
    if (!o || !json_object_is_type(o, json_type_object) ||
        !json_object_object_get_ex(o, k, &v))
        return NULL;
    return v;
}

/* An integer field (null/absent/wrong type: false). */
static bool get_i64(json_object *o, const char *k, int64_t *out) {
    json_object *v = get_key(o, k);
    if (!v || !json_object_is_type(v, json_type_int)) return false;
    *out = json_object_get_int64(v);
    return true;
}

static bool get_u64(json_object *o, const char *k, uint64_t *out) {
    json_object *v = get_key(o, k);
    if (!v || !json_object_is_type(v, json_type_int)) return false;
    *out = json_object_get_uint64(v);
    return true;
}

/* The array j[key] of an answer from url; NULL (and err says so) when
 * there is none. */
static json_object *array_of(json_object *j, const char *key, const char *url,
                             kvo_err *err) {
    json_object *a = get_key(j, key);
    if (a && json_object_is_type(a, json_type_array)) return a;
    kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "%s: no \"%s\" array",
                url, key);
    return NULL;
}

/* ---- Engines --------------------------------------------------------------*/

/* Entry i of a "ranks" array, and e's rank it speaks of ("dp_rank", else
 * its position): NULL when e has no such rank. */
static chk_rank *rank_entry(chk_engine *e, json_object *ranks, size_t i,
                            json_object **entry) {
    *entry = json_object_array_get_idx(ranks, i);
    int64_t rank = (int64_t)i;
    get_i64(*entry, "dp_rank", &rank);
    for (uint32_t k = 0; k < e->n_ranks; k++)
        if (e->ranks[k].dp_rank == (uint64_t)rank) return &e->ranks[k];
    return NULL;
}

kvo_status chk_engine_state(chk_engine *e, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, "%s/kvo/state", e->url);
    kvo_status st = json_call_send(&jc, e->http, NULL, err);
    json_object *ranks = NULL;
    if (st == KVO_OK && !(ranks = array_of(jc.j, "ranks", jc.url, err)))
        st = KVO_EPROTO;
    for (size_t i = 0; ranks && i < json_object_array_length(ranks); i++) {
        json_object *r;
        chk_rank *rk = rank_entry(e, ranks, i, &r);
        uint64_t seq;
        if (rk) rk->last_seq = get_u64(r, "last_seq", &seq) ? (int64_t)seq : -1;
    }
    if (st == KVO_OK) e->dirty = false;
    json_call_fini(&jc);
    return st;
}

kvo_status chk_engine_counters(chk_engine *e, check_counters *c, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, "%s/kvo/state", e->url);
    kvo_status st = json_call_send(&jc, e->http, NULL, err);
    /* an answer without ranks has no counters to read */
    json_object *ranks =
        st == KVO_OK ? array_of(jc.j, "ranks", jc.url, NULL) : NULL;
    for (size_t i = 0;
         ranks && i < json_object_array_length(ranks) && st == KVO_OK; i++) {
        json_object *r = json_object_array_get_idx(ranks, i);
        int64_t rank = (int64_t)i;
        get_i64(r, "dp_rank", &rank);
        char stage[48];
        snprintf(stage, sizeof(stage), "%s %u.%lld",
                 e->decode ? "decode engine" : "engine", e->worker_id,
                 (long long)rank);
        static const char *keys[] = {"counters", "resident_blocks",
                                     "free_blocks", "requests_finished",
                                     "last_seq"};
        for (size_t k = 0; k < KVO_ARRAY_LEN(keys) && st == KVO_OK; k++) {
            json_object *v = get_key(r, keys[k]);
            if (!v) continue;
            if (json_object_is_type(v, json_type_object)) {
                st = check_counters_parse_json(c, stage, v);
            } else if (json_object_is_type(v, json_type_int)) {
                st = check_counters_set(c, stage, keys[k],
                                        (double)json_object_get_int64(v));
            }
        }
    }
    json_call_fini(&jc);
    return st;
}

kvo_status chk_engine_sources(chk_engine *e, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, "%s/kvo/event_sources", e->url);
    kvo_status st = json_call_send(&jc, e->http, NULL, err);
    if (st != KVO_OK) goto done;
    if (!json_object_is_type(jc.j, json_type_array)) {
        st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                         "%s: not a JSON array", jc.url);
        goto done;
    }
    size_t n = json_object_array_length(jc.j);
    if (n > CHK_MAX_DP) {
        st = kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                         "%s: %zu sources (at most %d)", jc.url, n, CHK_MAX_DP);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *s = json_object_array_get_idx(jc.j, i);
        json_object *ep = get_key(s, "endpoint");
        json_object *rep = get_key(s, "replay_endpoint");
        json_object *topic = get_key(s, "topic");
        int64_t rank = (int64_t)i;
        get_i64(s, "data_parallel_rank", &rank);
        if (!ep || !json_object_is_type(ep, json_type_string) || rank < 0 ||
            rank >= CHK_MAX_DP) {
            st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                             "%s: source %zu has no endpoint or a bad rank",
                             jc.url, i);
            goto done;
        }
        chk_rank *r = &e->ranks[i];
        r->dp_rank = (uint32_t)rank;
        snprintf(r->zmq, sizeof(r->zmq), "%s", json_object_get_string(ep));
        r->replay[0] = '\0';
        if (rep && json_object_is_type(rep, json_type_string))
            snprintf(r->replay, sizeof(r->replay), "%s",
                     json_object_get_string(rep));
        r->topic[0] = '\0';
        if (topic && json_object_is_type(topic, json_type_string))
            snprintf(r->topic, sizeof(r->topic), "%s",
                     json_object_get_string(topic));
    }
    e->n_ranks = (uint32_t)n;
done:
    json_call_fini(&jc);
    return st;
}

kvo_status chk_engine_probe(chk_engine *e, const chk_prompt *p,
                            uint32_t block_size, bool warm, int32_t *hits,
                            kvo_err *err) {
    json_call jc;
    json_call_init(&jc, "%s/kvo/probe", e->url);
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st = kvo_buf_printf(&body, "{\"%s\":",
                                   p->trace_form ? "trace" : "token_ids");
    if (st == KVO_OK) st = kvo_buf_append(&body, p->json, p->len);
    if (st == KVO_OK && warm && p->trace_form)
        st = CHK_BUF_LIT(&body, ",\"warm\":true");
    if (st == KVO_OK) st = CHK_BUF_LIT(&body, "}");
    if (st != KVO_OK) goto done;
    st = json_call_send(&jc, e->probe_http, &body, err);
    if (st != KVO_OK) goto done;
    int64_t bs = -1;
    get_i64(jc.j, "block_size", &bs);
    if (bs != (int64_t)block_size) {
        st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                         "%s: engine block size %lld, expected %u "
                         "(--block-size)",
                         jc.url, (long long)bs, block_size);
        goto done;
    }
    json_object *ranks = array_of(jc.j, "ranks", jc.url, err);
    if (!ranks) {
        st = KVO_EPROTO;
        goto done;
    }
    for (uint32_t k = 0; k < e->n_ranks; k++) hits[k] = -1;
    for (size_t i = 0; i < json_object_array_length(ranks); i++) {
        json_object *r;
        chk_rank *rk = rank_entry(e, ranks, i, &r);
        int64_t h = -1;
        if (!rk || !get_i64(r, "hit_blocks", &h) || h < 0 || h > INT32_MAX)
            continue;
        hits[rk - e->ranks] = (int32_t)h;
    }
done:
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

kvo_status chk_engine_complete(chk_engine *e, const char *model,
                               const chk_prompt *p, uint32_t max_tokens,
                               int dp_rank, const char *kv_params,
                               chk_completion *out, kvo_err *err) {
    memset(out, 0, sizeof(*out));
    out->cached_tokens = out->prompt_tokens = out->dp_rank = out->last_seq =
        -1;
    json_call jc;
    json_call_init(&jc, "%s/v1/completions", e->url);
    kvo_buf body;
    kvo_buf_init(&body);
    json_object *mj = json_object_new_string(model);
    kvo_status st = kvo_buf_printf(
        &body, "{\"model\":%s,\"max_tokens\":%u,\"ignore_eos\":true,"
               "\"stream\":false,\"%s\":",
        json_object_to_json_string_ext(mj, JSON_C_TO_STRING_PLAIN), max_tokens,
        p->trace_form ? "trace" : "prompt");
    json_object_put(mj);
    if (st == KVO_OK) st = kvo_buf_append(&body, p->json, p->len);
    if (st == KVO_OK && dp_rank >= 0)
        st = kvo_buf_printf(&body, ",\"data_parallel_rank\":%d", dp_rank);
    if (st == KVO_OK && kv_params)
        st = kvo_buf_printf(&body, ",\"kv_transfer_params\":%s", kv_params);
    if (st == KVO_OK) st = CHK_BUF_LIT(&body, "}");
    if (st != KVO_OK) goto done;
    st = json_call_send(&jc, e->http, &body, err);
    if (st != KVO_OK) goto done;
    json_object *usage = get_key(jc.j, "usage");
    get_i64(usage, "prompt_tokens", &out->prompt_tokens);
    get_i64(get_key(usage, "prompt_tokens_details"), "cached_tokens",
            &out->cached_tokens);
    json_object *kvo = get_key(jc.j, "kvo");
    out->kvo = get_i64(kvo, "dp_rank", &out->dp_rank);
    uint64_t seq;
    if (get_u64(kvo, "last_seq", &seq)) out->last_seq = (int64_t)seq;
    json_object *kv = get_key(jc.j, "kv_transfer_params");
    if (kv && !json_object_is_type(kv, json_type_null)) {
        out->kv_transfer_params = kvo_strdup(
            json_object_to_json_string_ext(kv, JSON_C_TO_STRING_PLAIN));
        if (!out->kv_transfer_params) st = KVO_ENOMEM;
    }
done:
    json_call_fini(&jc);
    kvo_buf_fini(&body);
    return st;
}

kvo_status chk_engine_model(chk_engine *e, char *model, size_t modelsz,
                            kvo_err *err) {
    json_call jc;
    json_call_init(&jc, "%s/v1/models", e->url);
    kvo_status st = json_call_send(&jc, e->http, NULL, err);
    if (st != KVO_OK) goto done;
    json_object *data = get_key(jc.j, "data");
    json_object *id = NULL;
    if (data && json_object_is_type(data, json_type_array) &&
        json_object_array_length(data) > 0)
        id = get_key(json_object_array_get_idx(data, 0), "id");
    if (!id || !json_object_is_type(id, json_type_string)) {
        st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                         "%s: no model listed (use --model)", jc.url);
        goto done;
    }
    snprintf(model, modelsz, "%s", json_object_get_string(id));
done:
    json_call_fini(&jc);
    return st;
}

/* ---- Indexer ----------------------------------------------------------------*/

/* {"scores": [...]} of a query answer into scores per slot. */
static kvo_status parse_scores(chk_env *env, json_object *j, const char *url,
                               uint32_t *scores, kvo_err *err) {
    kvo_status st = KVO_OK;
    uint32_t slots = env->n_workers * env->dp_size;
    for (uint32_t s = 0; s < slots; s++) scores[s] = 0;
    json_object *arr = array_of(j, "scores", url, err);
    if (!arr) {
        st = KVO_EPROTO;
        goto done;
    }
    size_t m = json_object_array_length(arr);
    for (size_t i = 0; i < m; i++) {
        json_object *o = json_object_array_get_idx(arr, i);
        uint64_t w, r, b;
        if (!get_u64(o, "worker_id", &w) || !get_u64(o, "dp_rank", &r) ||
            !get_u64(o, "blocks", &b))
            continue;
        /* workers that are not ours (a shared NATS) are not compared */
        if (w >= env->n_workers || r >= env->dp_size) continue;
        scores[w * env->dp_size + r] = b > UINT32_MAX ? UINT32_MAX
                                                      : (uint32_t)b;
    }
done:
    return st;
}

static kvo_status parse_watermark(json_object *j, const char *url,
                                  chk_watermark *w, kvo_err *err);

kvo_status chk_index_query(chk_env *env, const uint64_t *hashes, size_t n,
                           uint32_t *scores, kvo_err *err) {
    return chk_index_query_wait(env, hashes, n, NULL, 0, -1, scores, NULL, NULL,
                                NULL, err);
}

kvo_status chk_index_query_wait(chk_env *env, const uint64_t *hashes, size_t n,
                                const uint64_t *pairs, size_t npairs,
                                long timeout_ms, uint32_t *scores,
                                chk_watermark *wm, bool *covered,
                                kvo_buf *metrics, kvo_err *err) {
    json_call jc;
    json_call_init(&jc, "%s/query_by_hash", env->indexer_url);
    kvo_buf body;
    kvo_buf_init(&body);
    kvo_status st = CHK_BUF_LIT(&body, "{\"tokens_hashes\":");
    if (st == KVO_OK) st = chk_json_u64s(&body, hashes, n);
    if (st == KVO_OK && wm) {
        st = kvo_buf_printf(&body, ",\"wait\":{\"timeout_ms\":%ld,\"zmq_seq\":[",
                            timeout_ms < 0 ? 0 : timeout_ms);
        for (size_t i = 0; st == KVO_OK && i < npairs; i++)
            st = kvo_buf_printf(&body, "%s[%" PRIu64 ",%" PRIu64 "]",
                                i ? "," : "", pairs[2 * i], pairs[2 * i + 1]);
        if (st == KVO_OK) st = CHK_BUF_LIT(&body, "]}");
    }
    if (st == KVO_OK && metrics)
        st = CHK_BUF_LIT(&body, ",\"metrics\":true");
    if (st == KVO_OK) st = CHK_BUF_LIT(&body, "}");
    if (st != KVO_OK) goto done;
    st = json_call_send(&jc, env->idx_http, &body, err);
    if (st != KVO_OK) goto done;
    if ((st = parse_scores(env, jc.j, jc.url, scores, err)) != KVO_OK)
        goto done;
    if (wm) {
        json_object *w = get_key(jc.j, "watermark");
        json_object *c = get_key(jc.j, "covered");
        if (!w || !c || !json_object_is_type(c, json_type_boolean)) {
            st = kvo_err_set(err, KVO_EUNSUPPORTED, KVO_ERR_NO_OFFSET,
                             "%s: the indexer does not wait for watermarks",
                             jc.url);
            goto done;
        }
        *covered = json_object_get_boolean(c);
        kvo_buf_reset(&wm->raw);
        st = parse_watermark(w, jc.url, wm, err);
    }
    if (st == KVO_OK && metrics) {
        json_object *m = get_key(jc.j, "metrics");
        if (!m || !json_object_is_type(m, json_type_string)) {
            st = kvo_err_set(err, KVO_EUNSUPPORTED, KVO_ERR_NO_OFFSET,
                             "%s: the indexer does not return its metrics "
                             "with a query",
                             jc.url);
            goto done;
        }
        kvo_buf_reset(metrics);
        st = kvo_buf_append(metrics, json_object_get_string(m),
                            (size_t)json_object_get_string_len(m));
    }
done:
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
    json_call_init(&jc, "%s/watermark", env->indexer_url);
    kvo_status st = json_call_send(&jc, env->idx_http, NULL, err);
    if (st != KVO_OK) goto done;
    kvo_buf_reset(&w->raw);
    st = kvo_buf_append(&w->raw, jc.resp.body.data, jc.resp.body.len);
    if (st == KVO_OK) st = parse_watermark(jc.j, jc.url, w, err);
done:
    json_call_fini(&jc);
    return st;
}

/* {"publishers": [...]} into w (raw untouched). */
static kvo_status parse_watermark(json_object *j, const char *url,
                                  chk_watermark *w, kvo_err *err) {
    kvo_status st = KVO_OK;
    json_object *pubs = array_of(j, "publishers", url, err);
    if (!pubs) {
        st = KVO_EPROTO;
        goto done;
    }
    size_t n = json_object_array_length(pubs);
    uint64_t *p = kvo_realloc(w->publisher, (n ? n : 1) * sizeof(*p));
    if (!p) {
        st = KVO_ENOMEM;
        goto done;
    }
    w->publisher = p;
    int64_t *z = kvo_realloc(w->zmq_last, (n ? n : 1) * sizeof(*z));
    if (!z) {
        st = KVO_ENOMEM;
        goto done;
    }
    w->zmq_last = z;
    w->n = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_array_get_idx(pubs, i);
        uint64_t id, last;
        if (!get_u64(o, "publisher_id", &id)) continue;
        w->publisher[w->n] = id;
        w->zmq_last[w->n] = get_u64(o, "zmq_seq_last", &last) &&
                                    last <= INT64_MAX
                                ? (int64_t)last
                                : -1;
        w->n++;
    }
done:
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

static kvo_status read_prom(kvo_http_client *c, const char *url,
                            const char *stage, check_counters *counters,
                            kvo_err *err) {
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    kvo_status st = chk_metrics_fetch(c, url, &resp, err);
    if (st == KVO_OK)
        st = check_counters_parse_prom(counters, stage,
                                       (const char *)resp.body.data,
                                       resp.body.len);
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

kvo_status chk_relay_live(chk_relay *r, bool *live) {
    json_call jc;
    json_call_init(&jc, "http://127.0.0.1:%u/stats", r->metrics_port);
    *live = false;
    kvo_status st = json_call_send(&jc, r->http, NULL, NULL);
    if (st == KVO_OK) {
        json_object *srcs = get_key(jc.j, "sources");
        bool all = srcs && json_object_is_type(srcs, json_type_array) &&
                   json_object_array_length(srcs) > 0;
        for (size_t i = 0; all && i < json_object_array_length(srcs); i++) {
            json_object *state =
                get_key(json_object_array_get_idx(srcs, i), "state");
            all = state && json_object_is_type(state, json_type_string) &&
                  strcmp(json_object_get_string(state), "live") == 0;
        }
        *live = all;
    }
    json_call_fini(&jc);
    return st;
}
