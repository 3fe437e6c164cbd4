/* mock_request.c -- the request bodies kvo-mocker reads, as pure functions:
 * bytes in, a parsed request (or a kvo_err saying why not) out. No sockets,
 * no engine, no clock: the handlers in mock_server.c call them, and so do
 * the fuzz targets fuzz_completions and fuzz_probe.
 *
 * One reader, base's strict kvo_json: exactly one JSON value then
 * whitespace, exact integers, valid UTF-8, memory bounded by the body's
 * size. What comes out points into the parsed tree or the body's arena,
 * never into per-token objects:
 *
 *   "prompt": [int, ...]          tok -> the tree's packed integers
 *   "prompt": "text" / messages   tok -> the arena (one id per byte)
 *   "trace": {"hash_ids": [...]}  trace_ids -> the tree; no tokens
 *
 * The checks, in the order a request meets them (the first failure is the
 * answer): the body is a JSON object; its prompt(s) -- shape, at most
 * MOCK_MAX_PROMPTS, each 1..max_len tokens, every token id an integer
 * below vocab_size; max_tokens; model, lora_name and cache_salt; the flags;
 * data_parallel_rank; mm_items (one prompt only: sorted, disjoint, inside
 * it); each prompt + max_tokens within max_len.
 * Unknown members are ignored (OpenAI clients send many); a member that is
 * null counts as absent.
 */
#include "mock_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* OpenAI's (and vLLM's) max_tokens when a request names none. */
#define DEFAULT_MAX_TOKENS 16

#define ENGINE_LIMIT "this engine's limit (max_model_len) is"
#define PROBE_LIMIT "probes take at most"

/* Failing parsers fill err; the status says what kind of failure (EPROTO:
 * wrong shape, ETOOBIG: over a limit, EINVAL: a value out of range,
 * ENOMEM). */

static kvo_status oom(kvo_err *err) {
    return kvo_err_set(err, KVO_ENOMEM, KVO_ERR_NO_OFFSET, "out of memory");
}

static kvo_status too_many_tokens(kvo_err *err, uint64_t n,
                                  const char *limit_what, uint32_t max_len) {
    return kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                       "the prompt has %" PRIu64 " tokens; %s %u", n,
                       limit_what, max_len);
}

/* The body's one JSON object into doc. */
static kvo_status parse_object(kvo_json *doc, const void *body, size_t len,
                               kvo_err *err) {
    kvo_err jerr;
    kvo_status st = kvo_json_parse(doc, body, len, NULL, &jerr);
    if (st == KVO_ENOMEM) return oom(err);
    if (st != KVO_OK) {
        if (jerr.offset == KVO_ERR_NO_OFFSET)
            return kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                               "cannot read the body as JSON (%s)", jerr.msg);
        return kvo_err_set(err, st, jerr.offset,
                           "cannot read the body as JSON (byte %zu: %s)",
                           jerr.offset, jerr.msg);
    }
    if (!kvo_json_is(doc->root, KVO_JSON_OBJ))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "body must be a JSON object");
    return KVO_OK;
}

/* Member key of obj, NULL when absent or null. */
static const kvo_jv *member(const kvo_jv *obj, const char *key) {
    const kvo_jv *v = kvo_json_get(obj, key);
    return kvo_json_is(v, KVO_JSON_NULL) ? NULL : v;
}

/* Optional boolean member (def when absent or null). */
static kvo_status get_bool(const kvo_jv *obj, const char *key, bool def,
                           bool *out, kvo_err *err) {
    const kvo_jv *v = member(obj, key);
    *out = def;
    if (v && !kvo_json_bool(v, out))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "%s must be true or false", key);
    return KVO_OK;
}

/* lora_name and cache_salt: strings; absent, null or "" is none (NULL). */
static kvo_status get_lora_salt(const kvo_jv *obj, const char **lora,
                                const char **salt, kvo_err *err) {
    const kvo_jv *l = member(obj, "lora_name"), *s = member(obj, "cache_salt");
    if ((l && !kvo_json_is(l, KVO_JSON_STR)) ||
        (s && !kvo_json_is(s, KVO_JSON_STR)))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "lora_name and cache_salt must be strings");
    *lora = l && l->len ? l->v.s : NULL;
    *salt = s && s->len ? s->v.s : NULL;
    return KVO_OK;
}

/* "mm_items": [{"offset": o, "length": n, "hash": "id"}, ...] into the
 * arena, checked against a prompt of n_tokens (mock_mm_check); absent or
 * null = none. */
static kvo_status get_mm_items(const kvo_jv *obj, uint32_t n_tokens,
                               kvo_arena *arena, mock_mm_item **out,
                               uint32_t *n_out, kvo_err *err) {
    const kvo_jv *a = member(obj, "mm_items");
    *out = NULL;
    *n_out = 0;
    if (!a) return KVO_OK;
    if (!kvo_json_is(a, KVO_JSON_ARR))
        return kvo_err_set(
            err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
            "mm_items must be a list of {\"offset\", \"length\", "
            "\"hash\"}");
    if (a->len > MOCK_MAX_MM_ITEMS)
        return kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                           "too many mm_items (at most %u)", MOCK_MAX_MM_ITEMS);
    if (a->len == 0) return KVO_OK;
    mock_mm_item *mm = kvo_arena_alloc(arena, a->len * sizeof(*mm));
    if (!mm) return oom(err);
    for (size_t i = 0; i < a->len; i++) {
        kvo_jv e;
        kvo_json_at(a, i, &e);
        const kvo_jv *o = kvo_json_get(&e, "offset"),
                     *l = kvo_json_get(&e, "length"),
                     *h = kvo_json_get(&e, "hash");
        uint64_t off, len;
        if (!kvo_json_is(&e, KVO_JSON_OBJ) || !kvo_json_u64(o, &off) ||
            !kvo_json_u64(l, &len) || !kvo_json_is(h, KVO_JSON_STR))
            return kvo_err_set(
                err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                "mm_items[%zu] must be {\"offset\": int, \"length\": "
                "int, \"hash\": str}",
                i);
        if (h->len == 0 || h->len > MOCK_MM_ID_MAX || strlen(h->v.s) != h->len)
            return kvo_err_set(
                err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                "mm_items[%zu].hash must be 1 to %u bytes (no NUL)", i,
                MOCK_MM_ID_MAX);
        if (off > UINT32_MAX || len == 0 || len > UINT32_MAX)
            return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                               "mm_items[%zu]: offset or length out of range",
                               i);
        mm[i] = (mock_mm_item){(uint32_t)off, (uint32_t)len, h->v.s};
    }
    uint32_t bad;
    if (mock_mm_check(mm, (uint32_t)a->len, n_tokens, &bad) != KVO_OK)
        return kvo_err_set(
            err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
            "mm_items[%u] must lie inside the prompt (%u tokens), "
            "after the item before it",
            bad, n_tokens);
    *out = mm;
    *n_out = (uint32_t)a->len;
    return KVO_OK;
}

/* A token list (where: "prompt[3]" for the messages) into p, pointing into
 * the tree. */
static kvo_status token_list(const kvo_jv *a, const char *where,
                             const mock_req_limits *lim, const char *limit_what,
                             mock_prompt *p, kvo_err *err) {
    const uint64_t *tok;
    size_t n;
    if (!kvo_json_is(a, KVO_JSON_ARR) || a->len == 0)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "a prompt has no tokens");
    if (a->len > lim->max_len)
        return too_many_tokens(err, a->len, limit_what, lim->max_len);
    kvo_err jerr;
    if (kvo_json_u64s(a, &tok, &n, &jerr) != KVO_OK)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "token ids must be integers >= 0 (%s%s)", where,
                           jerr.msg);
    for (size_t i = 0; i < n; i++)
        if (tok[i] >= lim->vocab_size)
            return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                               "token id %" PRIu64 " at %s[%zu] is outside the "
                               "vocabulary (--vocab-size %" PRIu64 ")",
                               tok[i], where, i, lim->vocab_size);
    p->tok = tok;
    p->n = (uint32_t)n;
    return KVO_OK;
}

/* Text (len bytes, NUL-terminated) into p: one token per byte, in arena. */
static kvo_status text_prompt(const char *text, size_t len, uint32_t max_len,
                              kvo_arena *arena, mock_prompt *p, kvo_err *err) {
    if (len == 0)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "a prompt has no tokens");
    if (len > max_len) return too_many_tokens(err, len, ENGINE_LIMIT, max_len);
    uint64_t *tok = kvo_arena_alloc(arena, len * sizeof(uint64_t));
    if (!tok) return oom(err);
    p->n = mock_tokenize(text, len, tok);
    p->tok = tok;
    return KVO_OK;
}

/* {"hash_ids": [...], "input_length": n} into p (ids, n; no tokens), n at
 * most lim->max_len; a longer prompt is refused naming the limit. */
static kvo_status trace_prompt(const kvo_jv *t, const mock_req_limits *lim,
                               const char *limit_what, mock_prompt *p,
                               kvo_err *err) {
    const kvo_jv *ids = kvo_json_get(t, "hash_ids"),
                 *len = kvo_json_get(t, "input_length");
    if (!kvo_json_is(t, KVO_JSON_OBJ) || !kvo_json_is(ids, KVO_JSON_ARR) ||
        !kvo_json_is(len, KVO_JSON_INT))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "trace must be {\"hash_ids\": [...], "
                           "\"input_length\": n}");
    int64_t n;
    if (ids->len == 0 || ids->len > MOCK_TRACE_MAX_IDS ||
        !kvo_json_i64(len, &n) || n <= 0)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "trace: hash_ids must not be empty and input_length "
                           "must be >= 1");
    if (n > (int64_t)lim->max_len)
        return too_many_tokens(err, (uint64_t)n, limit_what, lim->max_len);
    const uint64_t *v;
    size_t k;
    if (kvo_json_u64s(ids, &v, &k, NULL) != KVO_OK)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "trace: hash_ids must be integers >= 0");
    if (mock_trace_validate(v, (uint32_t)k, (uint32_t)n) != KVO_OK)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "trace: input_length must be within (512*(k-1), "
                           "512*k] for k hash_ids");
    /* no tokens: the engine makes them from the ids at admission, in its
     * own array; a probe's walk makes each block's tokens when it gets
     * there */
    p->trace_ids = v;
    p->n_trace = (uint32_t)k;
    p->n = (uint32_t)n;
    return KVO_OK;
}

/* "prompt": str | [int] | [str] | [[int]], or "trace": {...}. */
static kvo_status parse_prompts(mock_completion_req *c, const kvo_jv *body,
                                const mock_req_limits *lim, kvo_err *err) {
    const kvo_jv *t = member(body, "trace"), *p = member(body, "prompt");
    kvo_jv first = {0};
    size_t n = 1;
    if (!t && !p)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "prompt is required");
    if (!t && !kvo_json_is(p, KVO_JSON_STR)) {
        if (!kvo_json_at(p, 0, &first)) /* not an array, or empty */
            return kvo_err_set(
                err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                "prompt must be a string, a token list or a list "
                "of them");
        if (first.type != KVO_JSON_INT) n = p->len; /* a list of prompts */
        if (n > MOCK_MAX_PROMPTS)
            return kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                               "too many prompts (at most %u)",
                               MOCK_MAX_PROMPTS);
    }
    c->prompts = kvo_arena_alloc(&c->arena, n * sizeof(mock_prompt));
    if (!c->prompts) return oom(err);
    memset(c->prompts, 0, n * sizeof(mock_prompt));
    c->n_prompts = (uint32_t)n;
    if (t) return trace_prompt(t, lim, ENGINE_LIMIT, &c->prompts[0], err);
    if (kvo_json_is(p, KVO_JSON_STR))
        return text_prompt(p->v.s, p->len, lim->max_len, &c->arena,
                           &c->prompts[0], err);
    if (first.type == KVO_JSON_INT)
        return token_list(p, "prompt", lim, ENGINE_LIMIT, &c->prompts[0], err);
    for (size_t i = 0; i < n; i++) {
        kvo_jv e;
        kvo_json_at(p, i, &e);
        char where[32];
        snprintf(where, sizeof(where), "prompt[%zu]", i);
        kvo_status st;
        if (e.type == KVO_JSON_STR)
            st = text_prompt(e.v.s, e.len, lim->max_len, &c->arena,
                             &c->prompts[i], err);
        else if (e.type == KVO_JSON_ARR)
            st = token_list(&e, where, lim, ENGINE_LIMIT, &c->prompts[i], err);
        else
            st =
                kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                            "prompt list items must be strings or token lists");
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

/* The chat template's text of "messages", tokenized, as the one prompt. */
static kvo_status parse_messages(mock_completion_req *c, const kvo_jv *body,
                                 uint32_t max_len, kvo_err *err) {
    const kvo_jv *m = kvo_json_get(body, "messages");
    if (!kvo_json_is(m, KVO_JSON_ARR))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "messages is required");
    kvo_status st = mock_chat_template(m, &c->text);
    if (st == KVO_ENOMEM) return oom(err);
    if (st != KVO_OK)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "messages must be [{\"role\": str, \"content\": "
                           "str|parts}]");
    c->prompts = kvo_arena_alloc(&c->arena, sizeof(mock_prompt));
    if (!c->prompts) return oom(err);
    memset(c->prompts, 0, sizeof(mock_prompt));
    c->n_prompts = 1;
    return text_prompt((const char *)c->text.data, c->text.len, max_len,
                       &c->arena, &c->prompts[0], err);
}

void mock_completion_req_init(mock_completion_req *c) {
    memset(c, 0, sizeof(*c));
    kvo_json_init(&c->doc);
    kvo_arena_init(&c->arena);
    kvo_buf_init(&c->text);
}

void mock_completion_req_fini(mock_completion_req *c) {
    kvo_json_fini(&c->doc);
    kvo_arena_fini(&c->arena);
    kvo_buf_fini(&c->text);
    memset(c, 0, sizeof(*c));
}

/* Whatever a previous parse left in c goes; the storage stays for reuse. */
static void completion_reset(mock_completion_req *c) {
    kvo_arena_reset(&c->arena);
    kvo_buf_reset(&c->text);
    c->prompts = NULL;
    c->n_prompts = 0;
    c->max_tokens = 0;
    c->lora = c->salt = c->model = NULL;
    c->mm = NULL;
    c->n_mm = 0;
    c->stream = c->include_usage = c->return_token_ids = false;
    c->remote_prefill = c->has_rank = false;
    c->rank = 0;
}

static kvo_status completion_parse(mock_completion_req *c, const void *body,
                                   size_t len, bool chat,
                                   const mock_req_limits *lim, kvo_err *err) {
    kvo_status st = parse_object(&c->doc, body, len, err);
    if (st != KVO_OK) return st;
    const kvo_jv *o = c->doc.root, *v;
    st = chat ? parse_messages(c, o, lim->max_len, err)
              : parse_prompts(c, o, lim, err);
    if (st != KVO_OK) return st;
    c->max_tokens = DEFAULT_MAX_TOKENS;
    if ((v = member(o, "max_tokens")) ||
        (v = member(o, "max_completion_tokens"))) {
        if (!kvo_json_u64(v, &c->max_tokens) || c->max_tokens < 1)
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "max_tokens must be an integer >= 1");
    }
    if ((v = member(o, "model"))) {
        if (!kvo_json_is(v, KVO_JSON_STR))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "model must be a string");
        c->model = v->len ? v->v.s : NULL;
    }
    if ((st = get_lora_salt(o, &c->lora, &c->salt, err)) != KVO_OK ||
        (st = get_bool(o, "stream", false, &c->stream, err)) != KVO_OK ||
        (st = get_bool(o, "return_token_ids", false, &c->return_token_ids,
                       err)) != KVO_OK)
        return st;
    if ((v = member(o, "stream_options"))) {
        if (!kvo_json_is(v, KVO_JSON_OBJ))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "stream_options must be an object");
        if ((st = get_bool(v, "include_usage", false, &c->include_usage,
                           err)) != KVO_OK)
            return st;
    }
    if ((v = member(o, "kv_transfer_params"))) {
        if (!kvo_json_is(v, KVO_JSON_OBJ))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "kv_transfer_params must be an object");
        if ((st = get_bool(v, "do_remote_prefill", false, &c->remote_prefill,
                           err)) != KVO_OK)
            return st;
    }
    if ((v = member(o, "data_parallel_rank"))) {
        uint64_t r;
        if (!kvo_json_u64(v, &r) || r >= lim->n_ranks)
            return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                               "data_parallel_rank out of range");
        c->has_rank = true;
        c->rank = (uint32_t)r;
    }
    if (member(o, "mm_items")) {
        if (c->n_prompts != 1)
            return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                               "mm_items go with one prompt");
        if ((st = get_mm_items(o, c->prompts[0].n, &c->arena, &c->mm, &c->n_mm,
                               err)) != KVO_OK)
            return st;
    }
    for (uint32_t i = 0; i < c->n_prompts; i++) {
        uint32_t n = c->prompts[i].n;
        if (c->max_tokens > lim->max_len || n > lim->max_len - c->max_tokens)
            return kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                               "this engine's maximum context length "
                               "(max_model_len) is %u tokens; the request asks "
                               "for %u prompt + %" PRIu64 " completion",
                               lim->max_len, n, c->max_tokens);
    }
    return KVO_OK;
}

kvo_status mock_completion_parse(mock_completion_req *c, const void *body,
                                 size_t len, bool chat,
                                 const mock_req_limits *lim, kvo_err *err) {
    completion_reset(c);
    kvo_status st = completion_parse(c, body, len, chat, lim, err);
    if (st != KVO_OK) completion_reset(c); /* a refused body leaves nothing */
    return st;
}

void mock_probe_req_init(mock_probe_req *p) {
    memset(p, 0, sizeof(*p));
    kvo_json_init(&p->doc);
    kvo_arena_init(&p->arena);
}

void mock_probe_req_fini(mock_probe_req *p) {
    kvo_json_fini(&p->doc);
    kvo_arena_fini(&p->arena);
    memset(p, 0, sizeof(*p));
}

static void probe_reset(mock_probe_req *p) {
    kvo_arena_reset(&p->arena);
    memset(&p->prompt, 0, sizeof(p->prompt));
    p->lora = p->salt = NULL;
    p->mm = NULL;
    p->n_mm = 0;
    p->warm = p->detail = false;
}

static kvo_status probe_parse(mock_probe_req *p, const void *body, size_t len,
                              const mock_req_limits *lim, kvo_err *err) {
    kvo_status st = parse_object(&p->doc, body, len, err);
    if (st != KVO_OK) return st;
    const kvo_jv *o = p->doc.root, *t = member(o, "trace"),
                 *ids = kvo_json_get(o, "token_ids");
    if (t)
        st = trace_prompt(t, lim, PROBE_LIMIT, &p->prompt, err);
    else if (kvo_json_is(ids, KVO_JSON_ARR))
        st = token_list(ids, "token_ids", lim, PROBE_LIMIT, &p->prompt, err);
    else
        st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                         "token_ids or trace is required");
    if (st != KVO_OK) return st;
    if ((st = get_lora_salt(o, &p->lora, &p->salt, err)) != KVO_OK ||
        (st = get_mm_items(o, p->prompt.n, &p->arena, &p->mm, &p->n_mm, err)) !=
            KVO_OK ||
        (st = get_bool(o, "warm", false, &p->warm, err)) != KVO_OK)
        return st;
    return get_bool(o, "detail", false, &p->detail, err);
}

kvo_status mock_probe_parse(mock_probe_req *p, const void *body, size_t len,
                            const mock_req_limits *lim, kvo_err *err) {
    probe_reset(p);
    kvo_status st = probe_parse(p, body, len, lim, err);
    if (st != KVO_OK) probe_reset(p); /* a refused body leaves nothing */
    return st;
}

kvo_status mock_reset_parse(const void *body, size_t len, kvo_err *err) {
    const uint8_t *b = body;
    size_t i = 0;
    while (i < len &&
           (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    if (i == len) return KVO_OK;
    kvo_json doc;
    kvo_json_init(&doc);
    kvo_status st = parse_object(&doc, body, len, err);
    kvo_json_fini(&doc);
    return st;
}
