/* mock_server.c -- kvo-mocker's service: the OpenAI HTTP API, the ground
 * truth API and the event loop, on one thread.
 *
 *   loop:  each rank: finish its step when due; start the next step when it
 *          has work (schedule -> render -> PUB; real time: complete() when
 *          the modeled duration has passed; --speedup 0: at once)
 *          abort requests whose stream client went away
 *          zmq_poll(HTTP fd + every replay ROUTER, timeout): 0 while virtual
 *          time has work, else the next step deadline, MHD's timeout, 100 ms
 *          serve replays; kvo_http_server_run (handlers run here)
 *
 * A completion is a `call` with one `choice` per prompt, each an engine
 * request whose callback (from mock_engine_complete) streams tokens or
 * collects them; the last choice to finish answers the call. Any number of
 * calls are in flight at once (a rank's step batches every running
 * request), each answered when its own last choice finishes, in whatever
 * order that happens. The answer's "kvo" block, per call:
 *   last_seq     the rank's last ZMQ sequence when the answer is made:
 *                every event of the call's requests is in a batch <= it
 *                (the final step published before it completed; under load
 *                later batches carry other requests' events)
 *   prefill_seq  the rank's last sequence after the step that first
 *                scheduled the request (the batch of its first stores when
 *                that step stored any; the latest over the choices); null
 *                while the rank has published nothing
 *
 * Request bodies are read by mock_request.c (pure parsers over base's
 * strict kvo_json); every error answer is vLLM's JSON error.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
 * GET /health, POST /reset_prefix_cache[?reset_external=true], GET /metrics,
 * GET /kvo/state, POST /kvo/probe, POST /kvo/chain, GET /kvo/blocks, GET
 * /kvo/event_sources. Request extensions: "trace" in place of "prompt",
 * "data_parallel_rank" (or header X-data-parallel-rank), "lora_name" (or
 * "model" naming a --lora-modules adapter), "cache_salt", "mm_items",
 * "kv_transfer_params" (decode role), "return_token_ids". Responses add "kvo": {"dp_rank",
 * "prefill_seq", "last_seq"} and usage.prompt_tokens_details.cached_tokens.
 */
#include "mock_int.h"
#include "kvo_http.h"
#include "kvo_prom.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

/* The loop's longest poll when nothing is due: how late a stop is seen. */
#define IDLE_POLL_MS 100
/* Most hashes one GET /kvo/blocks answer lists (and its default). */
#define BLOCKS_PAGE_MAX 100000u
/* The stream's last event. */
static const char sse_done[] = "data: [DONE]\n\n";
/* /kvo/probe answers for prompts the engine could not serve too (longer
 * than max_model_len: it simply cannot hold them); bounded all the same. */
#define PROBE_MAX_TOKENS (1u << 22)

typedef struct call call;

typedef struct choice {
    call *k;
    uint32_t index;
    uint64_t req_id;
    bool done;
    mock_finish finish;
    uint32_t n_prompt, n_output, cached;
    bool prefill_seq_set;
    uint64_t prefill_seq;
    kvo_buf text;     /* non-stream: generated text */
    kvo_buf tok;      /* generated token ids (uint64_t) when asked */
    uint32_t *blocks; /* prefill role: the request's blocks at finish */
    uint32_t n_blocks;
} choice;

typedef struct server server;

struct call {
    server *s;
    call *prev, *next;
    kvo_http_req *req;
    bool chat, stream, include_usage, return_token_ids;
    bool cancel, cancel_listed, remote_prefill;
    uint32_t rank;
    uint32_t n_choices, n_done;
    choice *choices;
    char id[48];
    long long created;
    call *cancel_next;
};

struct server {
    const mock_cfg *cfg;
    mock_node node;
    kvo_http_server *http;
    call *calls;   /* live calls */
    call *cancels; /* calls whose stream client went away */
    uint64_t rr;
    uint64_t next_call;
    uint64_t t0_ns;
    long long started_unix;
    uint64_t http_requests, http_errors; /* answered; of them errors */
    uint64_t finished_length, finished_aborted;
    bool answered;      /* a call was answered: let the loop send it */
    uint64_t *warm_ids; /* a probe's "warm" prompt (trace form), hashed */
    uint32_t warm_n_ids, warm_len; /* after the answer went out */
    kvo_buf scratch;
};

/* ---- small JSON helpers ---------------------------------------------------*/

static json_object *u64_or_null(bool set, uint64_t v) {
    return set ? json_object_new_uint64(v) : NULL;
}

static void respond_err(server *s, kvo_http_req *r, unsigned status,
                        const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* vLLM's error body: {"object": "error", "message", "type", "param", "code"};
 * counted in http_errors. */
static void respond_err(server *s, kvo_http_req *r, unsigned status,
                        const char *fmt, ...) {
    s->http_errors++;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_object *j = json_object_new_object();
    json_object_object_add(j, "object", json_object_new_string("error"));
    json_object_object_add(j, "message", json_object_new_string(msg));
    json_object_object_add(
        j, "type",
        json_object_new_string(status == 404  ? "NotFoundError"
                               : status < 500 ? "BadRequestError"
                                              : "InternalServerError"));
    json_object_object_add(j, "param", NULL);
    json_object_object_add(j, "code", json_object_new_int((int)status));
    kvo_http_respond_json(r, status, j);
}

/* ---- calls ----------------------------------------------------------------*/

static void call_free(call *k) {
    if (!k) return;
    for (uint32_t i = 0; i < k->n_choices; i++) {
        kvo_buf_fini(&k->choices[i].text);
        kvo_buf_fini(&k->choices[i].tok);
        kvo_free(k->choices[i].blocks);
    }
    kvo_free(k->choices);
    kvo_free(k);
}

static void call_unlink(call *k) {
    server *s = k->s;
    if (k->prev)
        k->prev->next = k->next;
    else
        s->calls = k->next;
    if (k->next) k->next->prev = k->prev;
}

static const char *finish_name(mock_finish f) {
    return f == MOCK_FINISH_LENGTH    ? "length"
           : f == MOCK_FINISH_ABORTED ? "abort"
                                      : NULL;
}

static json_object *usage_json(const call *k) {
    uint64_t p = 0, c = 0, cached = 0;
    for (uint32_t i = 0; i < k->n_choices; i++) {
        p += k->choices[i].n_prompt;
        c += k->choices[i].n_output;
        cached += k->choices[i].cached;
    }
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_uint64(p));
    json_object_object_add(u, "total_tokens", json_object_new_uint64(p + c));
    json_object_object_add(u, "completion_tokens", json_object_new_uint64(c));
    json_object *d = json_object_new_object();
    json_object_object_add(d, "cached_tokens", json_object_new_uint64(cached));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

static json_object *kvo_ext_json(const call *k) {
    server *s = k->s;
    bool pset = false;
    uint64_t pseq = 0, last = 0;
    for (uint32_t i = 0; i < k->n_choices; i++) {
        const choice *c = &k->choices[i];
        if (c->prefill_seq_set && (!pset || c->prefill_seq > pseq)) {
            pset = true;
            pseq = c->prefill_seq;
        }
    }
    bool lset = mock_pub_last_seq(s->node.ranks[k->rank].pub, &last);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "dp_rank", json_object_new_int((int)k->rank));
    json_object_object_add(o, "prefill_seq", u64_or_null(pset, pseq));
    json_object_object_add(o, "last_seq", u64_or_null(lset, last));
    return o;
}

static json_object *transfer_json(const call *k) {
    const server *s = k->s;
    const choice *c = &k->choices[0];
    json_object *o = json_object_new_object();
    json_object_object_add(o, "do_remote_prefill", json_object_new_boolean(1));
    json_object_object_add(o, "do_remote_decode", json_object_new_boolean(0));
    char eid[128];
    snprintf(eid, sizeof(eid), "%s-dp%u", s->cfg->model, k->rank);
    json_object_object_add(o, "remote_engine_id", json_object_new_string(eid));
    json_object *ids = json_object_new_array();
    for (uint32_t i = 0; i < c->n_blocks; i++)
        json_object_array_add(ids, json_object_new_int64(c->blocks[i]));
    json_object_object_add(o, "remote_block_ids", ids);
    json_object_object_add(
        o, "remote_host",
        json_object_new_string(node_advertise_host(&s->node)));
    json_object_object_add(o, "remote_port",
                           json_object_new_int(kvo_http_server_port(s->http)));
    json_object_object_add(o, "tp_size", json_object_new_int(1));
    return o;
}

static json_object *call_header(const call *k, const char *object) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(k->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(k->created));
    json_object_object_add(o, "model",
                           json_object_new_string(k->s->cfg->model));
    return o;
}

static json_object *token_ids_json(const choice *c) {
    json_object *a = json_object_new_array();
    const uint64_t *t = (const uint64_t *)c->tok.data;
    for (size_t i = 0; i < c->tok.len / sizeof(uint64_t); i++)
        json_object_array_add(a, json_object_new_uint64(t[i]));
    return a;
}

static void sse(call *k, json_object *o) {
    const char *js = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
    kvo_buf *b = &k->s->scratch;
    kvo_buf_reset(b);
    kvo_buf_printf(b, "data: %s\n\n", js);
    kvo_http_stream_write(k->req, b->data, b->len);
    json_object_put(o);
}

/* One streamed chunk: a token's text, or (text NULL) the finish. */
static void sse_chunk(call *k, const choice *c, const char *text,
                      const char *finish, bool first) {
    json_object *o =
        call_header(k, k->chat ? "chat.completion.chunk" : "text_completion");
    json_object *ch = json_object_new_object();
    json_object_object_add(ch, "index", json_object_new_int((int)c->index));
    if (k->chat) {
        json_object *d = json_object_new_object();
        if (first)
            json_object_object_add(d, "role",
                                   json_object_new_string("assistant"));
        if (text)
            json_object_object_add(d, "content", json_object_new_string(text));
        json_object_object_add(ch, "delta", d);
    } else {
        json_object_object_add(ch, "text",
                               json_object_new_string(text ? text : ""));
    }
    json_object_object_add(ch, "logprobs", NULL);
    json_object_object_add(ch, "finish_reason",
                           finish ? json_object_new_string(finish) : NULL);
    json_object *arr = json_object_new_array();
    json_object_array_add(arr, ch);
    json_object_object_add(o, "choices", arr);
    sse(k, o);
}

/* The last choice finished: answer, unlink, free. */
static void call_finish(call *k) {
    server *s = k->s;
    s->answered = true;
    if (k->stream) {
        if (k->include_usage && !k->cancel) {
            json_object *o = call_header(k, k->chat ? "chat.completion.chunk"
                                                    : "text_completion");
            json_object_object_add(o, "choices", json_object_new_array());
            json_object_object_add(o, "usage", usage_json(k));
            json_object_object_add(o, "kvo", kvo_ext_json(k));
            if (s->cfg->role == MOCK_ROLE_PREFILL)
                json_object_object_add(o, "kv_transfer_params",
                                       transfer_json(k));
            sse(k, o);
        }
        if (!k->cancel)
            kvo_http_stream_write(k->req, sse_done, sizeof(sse_done) - 1);
        kvo_http_stream_end(k->req);
    } else {
        json_object *o =
            call_header(k, k->chat ? "chat.completion" : "text_completion");
        json_object *arr = json_object_new_array();
        for (uint32_t i = 0; i < k->n_choices; i++) {
            choice *c = &k->choices[i];
            kvo_buf_cstr(&c->text);
            json_object *ch = json_object_new_object();
            json_object_object_add(ch, "index", json_object_new_int((int)i));
            const char *txt = c->text.data ? (const char *)c->text.data : "";
            if (k->chat) {
                json_object *m = json_object_new_object();
                json_object_object_add(m, "role",
                                       json_object_new_string("assistant"));
                json_object_object_add(m, "content",
                                       json_object_new_string(txt));
                json_object_object_add(ch, "message", m);
            } else {
                json_object_object_add(ch, "text", json_object_new_string(txt));
            }
            json_object_object_add(ch, "logprobs", NULL);
            const char *fr = finish_name(c->finish);
            json_object_object_add(ch, "finish_reason",
                                   fr ? json_object_new_string(fr) : NULL);
            json_object_object_add(ch, "stop_reason", NULL);
            if (k->return_token_ids)
                json_object_object_add(ch, "token_ids", token_ids_json(c));
            json_object_array_add(arr, ch);
        }
        json_object_object_add(o, "choices", arr);
        json_object_object_add(o, "usage", usage_json(k));
        json_object_object_add(o, "kvo", kvo_ext_json(k));
        if (s->cfg->role == MOCK_ROLE_PREFILL)
            json_object_object_add(o, "kv_transfer_params", transfer_json(k));
        kvo_http_respond_json(k->req, 200, o);
    }
    call_unlink(k);
    call_free(k);
}

static void on_choice_output(void *user, const mock_output *o) {
    choice *c = user;
    call *k = c->k;
    if (!k) return; /* a call that failed while queueing its choices */
    server *s = k->s;
    if (o->has_token) {
        if (k->return_token_ids)
            kvo_buf_append(&c->tok, &o->token, sizeof(o->token));
        if (k->stream) {
            if (!k->cancel && kvo_http_stream_closed(k->req)) {
                k->cancel = true;
                if (!k->cancel_listed) {
                    k->cancel_listed = true;
                    k->cancel_next = s->cancels;
                    s->cancels = k;
                }
            }
            if (!k->cancel) {
                char txt[32];
                snprintf(txt, sizeof(txt), " t%llu",
                         (unsigned long long)o->token);
                sse_chunk(k, c, txt, NULL, o->n_output == 1);
            }
        } else {
            mock_detokenize(&o->token, 1, &c->text);
        }
    }
    if (o->finish == MOCK_FINISH_NONE) return;
    c->done = true;
    c->finish = o->finish;
    c->n_prompt = o->n_prompt;
    c->n_output = o->n_output;
    c->cached = o->cached_tokens;
    if (o->finish == MOCK_FINISH_LENGTH)
        s->finished_length++;
    else
        s->finished_aborted++;
    if (s->cfg->role == MOCK_ROLE_PREFILL && o->n_blocks && !c->blocks) {
        c->blocks = kvo_malloc(o->n_blocks * sizeof(uint32_t));
        if (c->blocks) {
            memcpy(c->blocks, o->block_ids, o->n_blocks * sizeof(uint32_t));
            c->n_blocks = o->n_blocks;
        }
    }
    if (k->stream && !k->cancel)
        sse_chunk(k, c, NULL, finish_name(o->finish), false);
    if (++k->n_done == k->n_choices) call_finish(k);
}

/* Abort the engine requests of calls whose stream client went away. Runs
 * outside mock_engine_complete (abort must not run inside a callback). */
static void process_cancels(server *s) {
    while (s->cancels) {
        call *k = s->cancels;
        s->cancels = k->cancel_next;
        k->cancel_listed = false;
        uint64_t ids[MOCK_MAX_PROMPTS];
        uint32_t n = 0;
        for (uint32_t i = 0; i < k->n_choices; i++)
            if (!k->choices[i].done) ids[n++] = k->choices[i].req_id;
        mock_engine *e = s->node.ranks[k->rank].eng;
        /* The last abort finishes (and frees) the call. */
        for (uint32_t i = 0; i < n; i++) mock_engine_abort(e, ids[i]);
    }
}

/* ---- handlers -------------------------------------------------------------*/

/* The rank a completion goes to: its "data_parallel_rank", else the
 * X-data-parallel-rank header, else round robin. */
static bool pick_rank(server *s, kvo_http_req *req,
                      const mock_completion_req *c, uint32_t *rank) {
    const char *h = kvo_http_req_header(req, "X-data-parallel-rank");
    if (c->has_rank) {
        *rank = c->rank; /* the parser checked the range */
        return true;
    }
    if (h) {
        uint32_t r;
        if (kvo_parse_u32(h, &r) != KVO_OK || r >= s->node.n_ranks)
            return false;
        *rank = r;
        return true;
    }
    *rank = (uint32_t)(s->rr++ % s->node.n_ranks);
    return true;
}

/* What a request body may hold here. */
static mock_req_limits req_limits(const server *s, uint32_t max_len) {
    return (mock_req_limits){.max_len = max_len,
                             .vocab_size = s->cfg->vocab_size,
                             .n_ranks = s->node.n_ranks};
}

/* The answer's status for a failed parse or add. */
static unsigned err_code(kvo_status st) {
    return st == KVO_ENOMEM ? 503 : st == KVO_ENOTFOUND ? 404 : 400;
}

static void handle_completion(server *s, kvo_http_req *req, bool chat) {
    size_t len;
    const uint8_t *raw = kvo_http_req_body(req, &len);
    mock_completion_req c;
    call *k = NULL;
    kvo_err err;
    mock_completion_req_init(&c);
    mock_req_limits lim = req_limits(s, mock_cfg_max_model_len(s->cfg));
    kvo_status st = mock_completion_parse(&c, raw, len, chat, &lim, &err);
    if (st != KVO_OK) goto done;
    /* vLLM: "model" names the served model or a LoRA adapter of
     * --lora-modules (404 for any other name). Without --lora-modules the
     * name is not checked, as before; "lora_name" names an adapter too. */
    const char *lora = c.lora;
    if (c.model && strcmp(c.model, s->cfg->model) != 0 &&
        s->cfg->lora_modules) {
        if (!mock_cfg_lora_module(s->cfg, c.model)) {
            st = kvo_err_set(&err, KVO_ENOTFOUND, KVO_ERR_NO_OFFSET,
                             "The model `%.200s` does not exist.", c.model);
            goto done;
        }
        if (lora && strcmp(lora, c.model) != 0) {
            st =
                kvo_err_set(&err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                            "model names the LoRA adapter %.100s but lora_name "
                            "is %.100s",
                            c.model, lora);
            goto done;
        }
        lora = c.model;
    }
    k = kvo_calloc(1, sizeof(*k));
    if (!k || !(k->choices = kvo_calloc(c.n_prompts, sizeof(choice)))) {
        st = kvo_err_set(&err, KVO_ENOMEM, KVO_ERR_NO_OFFSET, "out of memory");
        goto done;
    }
    k->s = s;
    k->req = req;
    k->chat = chat;
    k->stream = c.stream;
    k->include_usage = c.include_usage;
    k->return_token_ids = c.return_token_ids;
    k->remote_prefill = c.remote_prefill;
    if (!pick_rank(s, req, &c, &k->rank)) {
        st = kvo_err_set(&err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                         "data_parallel_rank out of range");
        goto done;
    }
    k->n_choices = c.n_prompts;
    k->created = (long long)time(NULL);
    snprintf(k->id, sizeof(k->id), "%s-%016llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_call);
    for (uint32_t i = 0; i < c.n_prompts; i++) {
        choice *ch = &k->choices[i];
        ch->k = k;
        ch->index = i;
        kvo_buf_init(&ch->text);
        kvo_buf_init(&ch->tok);
    }
    /* All validated (max_tokens <= max_len too): queue every choice (cannot
     * fail half-way but for memory, and then the queued ones are aborted).
     * The engine copies the prompts out of the body. */
    mock_engine *e = s->node.ranks[k->rank].eng;
    for (uint32_t i = 0; i < c.n_prompts; i++) {
        choice *ch = &k->choices[i];
        const mock_prompt *pr = &c.prompts[i];
        mock_req_in in = {.tokens = pr->tok,
                          .n_tokens = pr->n,
                          .max_tokens = (uint32_t)c.max_tokens,
                          .lora_name = lora,
                          .cache_salt = c.salt,
                          .trace = {pr->trace_ids, pr->n_trace},
                          .remote_prefill = k->remote_prefill,
                          .on_output = on_choice_output,
                          .user = ch,
                          .mm = c.mm,
                          .n_mm = c.n_mm};
        st = mock_engine_add(e, &in, &ch->req_id);
        if (st != KVO_OK) {
            for (uint32_t j = 0; j < i; j++) {
                k->choices[j].k = NULL; /* its abort callback is ignored */
                mock_engine_abort(e, k->choices[j].req_id);
            }
            kvo_err_set(&err, st, KVO_ERR_NO_OFFSET, "%s", kvo_strerror(st));
            goto done;
        }
    }
    k->next = s->calls;
    if (s->calls) s->calls->prev = k;
    s->calls = k;
    if (k->stream) kvo_http_stream_start(req, 200, "text/event-stream");
    k = NULL; /* owned by the live list */
done:
    if (st != KVO_OK) respond_err(s, req, err_code(st), "%s", err.msg);
    call_free(k);
    mock_completion_req_fini(&c);
}

static void handle_models(server *s, kvo_http_req *req) {
    json_object *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(s->cfg->model));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created",
                           json_object_new_int64(s->started_unix));
    json_object_object_add(m, "owned_by", json_object_new_string("vllm"));
    json_object_object_add(m, "root", json_object_new_string(s->cfg->model));
    json_object_object_add(m, "parent", NULL);
    json_object_object_add(
        m, "max_model_len",
        json_object_new_int64(mock_cfg_max_model_len(s->cfg)));
    json_object_object_add(m, "permission", json_object_new_array());
    json_object *arr = json_object_new_array();
    json_object_array_add(arr, m);
    /* each --lora-modules adapter, as vLLM lists them after the base */
    char name[256];
    for (uint32_t i = 0; mock_cfg_lora_module_at(s->cfg, i, name, sizeof(name));
         i++) {
        json_object *l = json_object_new_object();
        json_object_object_add(l, "id", json_object_new_string(name));
        json_object_object_add(l, "object", json_object_new_string("model"));
        json_object_object_add(l, "created",
                               json_object_new_int64(s->started_unix));
        json_object_object_add(l, "owned_by", json_object_new_string("vllm"));
        json_object_object_add(l, "root", json_object_new_string(name));
        json_object_object_add(l, "parent",
                               json_object_new_string(s->cfg->model));
        json_object_object_add(l, "max_model_len", NULL);
        json_object_object_add(l, "permission", json_object_new_array());
        json_object_array_add(arr, l);
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", arr);
    kvo_http_respond_json(req, 200, o);
}

static void handle_reset(server *s, kvo_http_req *req) {
    size_t len;
    const uint8_t *raw = kvo_http_req_body(req, &len);
    kvo_err err;
    kvo_status rc = mock_reset_parse(raw, len, &err);
    if (rc != KVO_OK) {
        respond_err(s, req, err_code(rc), "%s", err.msg);
        return;
    }
    for (uint32_t r = 0; r < s->node.n_ranks; r++) {
        mock_engine_stats st;
        mock_engine_stats_get(s->node.ranks[r].eng, &st);
        if (st.used_blocks > 0) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "success", json_object_new_boolean(0));
            char msg[128];
            snprintf(
                msg, sizeof(msg),
                "failed to reset the prefix cache: rank %u has %llu blocks "
                "in use",
                r, (unsigned long long)st.used_blocks);
            json_object_object_add(o, "error", json_object_new_string(msg));
            kvo_http_respond_json(req, 409, o);
            return;
        }
    }
    /* vLLM's ?reset_external=true also empties the connector's tier */
    const char *ext = kvo_http_req_arg(req, "reset_external");
    bool external = ext && (strcmp(ext, "true") == 0 || strcmp(ext, "1") == 0);
    for (uint32_t r = 0; r < s->node.n_ranks; r++)
        mock_engine_reset_cache(s->node.ranks[r].eng, external);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "success", json_object_new_boolean(1));
    kvo_http_respond_json(req, 200, o);
}

static void handle_metrics(server *s, kvo_http_req *req) {
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_status st = node_metrics_write(&s->node, s->cfg->model, &b);
    if (st == KVO_OK)
        kvo_http_respond(req, 200, KVO_PROM_CTYPE, b.data, b.len);
    else
        respond_err(s, req, 500, "writing the metrics failed: %s",
                    kvo_strerror(st));
    kvo_buf_fini(&b);
}

/* A rank's counters; cpu_tier: the CPU tier's too. */
static json_object *counters_json(const mock_engine_stats *st,
                                  const mock_pub_stats *ps, uint64_t render_err,
                                  bool cpu_tier) {
    json_object *c = json_object_new_object();
#define C(name, v) json_object_object_add(c, name, json_object_new_uint64(v))
    C("requests_added", st->requests_added);
    C("requests_finished", st->requests_finished);
    C("requests_aborted", st->requests_aborted);
    C("requests_running", st->requests_running);
    C("requests_waiting", st->requests_waiting);
    C("steps", st->steps);
    C("preemptions", st->preemptions);
    C("steps_multi", st->steps_multi);
    C("max_running", st->max_running);
    C("prefills_split", st->prefills_split);
    C("evictions_in_store_steps", st->evictions_in_store_steps);
    C("max_inflight", st->max_inflight);
    C("prompt_tokens", st->prompt_tokens);
    C("generated_tokens", st->generated_tokens);
    C("computed_tokens", st->computed_tokens);
    C("prefix_queries", st->prefix_queries);
    C("prefix_hits", st->prefix_hits);
    C("batches", st->batches);
    C("events", st->events);
    C("blocks_stored", st->blocks_stored);
    C("blocks_removed", st->blocks_removed);
    C("cleared", st->cleared);
    C("used_blocks", st->used_blocks);
    C("published_batches", ps->batches);
    C("published_bytes", ps->bytes);
    C("replay_requests", ps->replay_requests);
    C("replay_batches", ps->replay_batches);
    C("replay_bad_requests", ps->bad_requests);
    C("replay_cut", ps->replay_cut);
    C("replay_buffered", ps->ring_len);
    C("send_errors", ps->send_errors);
    C("record_errors", ps->record_errors);
    C("render_errors", render_err);
    C("skipped_seqs", ps->skipped);
    C("events_lost_enomem", st->events_lost_enomem);
    if (cpu_tier) {
        C("cpu_stored", st->cpu_stored);
        C("cpu_removed", st->cpu_removed);
        C("cpu_queries", st->cpu_queries);
        C("cpu_hits", st->cpu_hits);
    }
#undef C
    return c;
}

/* The process's own counters (one HTTP server for every rank): base's
 * HTTP server stats and the requests this service answered. */
static json_object *process_counters_json(const server *s) {
    kvo_http_server_stats hs;
    kvo_http_server_stats_get(s->http, &hs);
    json_object *c = json_object_new_object();
#define C(name, v) json_object_object_add(c, name, json_object_new_uint64(v))
    C("http_conns", hs.conns);
    C("http_head_timeouts", hs.head_timeouts);
    C("http_body_timeouts", hs.body_timeouts);
    C("http_busy_refused", hs.busy_refused);
    C("http_requests", s->http_requests);
    C("http_errors", s->http_errors);
#undef C
    return c;
}

static void handle_state(server *s, kvo_http_req *req) {
    const mock_cfg *c = s->cfg;
    json_object *w = json_object_new_object();
    json_object_object_add(w, "role",
                           json_object_new_string(mock_role_name(c->role)));
    json_object_object_add(w, "block_size",
                           json_object_new_int64(c->block_size));
    json_object_object_add(w, "num_gpu_blocks",
                           json_object_new_int64(c->num_gpu_blocks));
    json_object_object_add(
        w, "hash_algo", json_object_new_string(wire_algo_name(c->hash_algo)));
    json_object_object_add(w, "hash_seed",
                           json_object_new_string(c->hash_seed));
    json_object_object_add(w, "hash_bytes",
                           json_object_new_boolean(c->hash_bytes));
    json_object_object_add(
        w, "event_format",
        json_object_new_string(wire_format_name(c->event_format)));
    json_object_object_add(w, "topic", json_object_new_string(c->topic));
    json_object_object_add(w, "dp_size", json_object_new_int64(c->dp_size));
    json_object_object_add(w, "model", json_object_new_string(c->model));
    json_object_object_add(w, "prefix_caching",
                           json_object_new_boolean(c->prefix_caching));
    json_object_object_add(w, "max_model_len",
                           json_object_new_int64(mock_cfg_max_model_len(c)));
    json_object_object_add(w, "vocab_size",
                           json_object_new_uint64(c->vocab_size));
    if (c->cpu_offload_blocks)
        json_object_object_add(w, "cpu_offload_blocks",
                               json_object_new_uint64(c->cpu_offload_blocks));
    if (c->lora_modules)
        json_object_object_add(w, "lora_modules",
                               json_object_new_string(c->lora_modules));
    if (mock_cfg_groups(c) > 1)
        json_object_object_add(w, "kv_groups",
                               json_object_new_int64(mock_cfg_groups(c)));
    json_object *muts = json_object_new_array();
    const mock_mutation_info *m = mock_mutations();
    for (unsigned i = 0; i < MOCK_MUT_COUNT; i++)
        if (c->mutations & m[i].bit)
            json_object_array_add(muts, json_object_new_string(m[i].name));
    json_object_object_add(w, "mutations", muts);
    json_object *ranks = json_object_new_array();
    for (uint32_t r = 0; r < s->node.n_ranks; r++) {
        node_rank *nr = &s->node.ranks[r];
        mock_engine_stats st;
        mock_pub_stats ps;
        mock_engine_stats_get(nr->eng, &st);
        mock_pub_stats_get(nr->pub, &ps);
        uint64_t last;
        bool lset = mock_pub_last_seq(nr->pub, &last);
        json_object *o = json_object_new_object();
        json_object_object_add(o, "dp_rank", json_object_new_int64(r));
        json_object_object_add(o, "last_seq", u64_or_null(lset, last));
        json_object_object_add(o, "resident_blocks",
                               json_object_new_uint64(st.resident_blocks));
        json_object_object_add(o, "cached_distinct",
                               json_object_new_uint64(st.cached_distinct));
        json_object_object_add(o, "cached_digest",
                               json_object_new_uint64(st.cached_digest));
        json_object_object_add(o, "free_blocks",
                               json_object_new_uint64(st.free_blocks));
        if (mock_cfg_groups(c) > 1) { /* each KV-cache group's cached set */
            json_object *ga = json_object_new_array();
            for (uint32_t g = 0; g < mock_cfg_groups(c); g++) {
                uint64_t dn, dg;
                mock_engine_group_set(nr->eng, g, &dn, &dg);
                json_object *go = json_object_new_object();
                json_object_object_add(go, "group", json_object_new_int64(g));
                json_object_object_add(
                    go, "kind",
                    json_object_new_string(c->groups[g].sliding
                                               ? "sliding_window"
                                               : "full_attention"));
                if (c->groups[g].sliding)
                    json_object_object_add(
                        go, "sliding_window",
                        json_object_new_int64(c->groups[g].window));
                json_object_object_add(go, "cached_distinct",
                                       json_object_new_uint64(dn));
                json_object_object_add(go, "cached_digest",
                                       json_object_new_uint64(dg));
                json_object_array_add(ga, go);
            }
            json_object_object_add(o, "groups", ga);
        }
        if (c->cpu_offload_blocks && c->prefix_caching) {
            json_object_object_add(
                o, "cpu_cached_distinct",
                json_object_new_uint64(st.cpu_cached_distinct));
            json_object_object_add(
                o, "cpu_cached_digest",
                json_object_new_uint64(st.cpu_cached_digest));
        }
        json_object_object_add(o, "requests_finished",
                               json_object_new_uint64(st.requests_finished));
        json_object_object_add(
            o, "counters",
            counters_json(&st, &ps, nr->render_errors,
                          c->cpu_offload_blocks && c->prefix_caching));
        json_object_array_add(ranks, o);
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "worker", w);
    json_object_object_add(o, "counters", process_counters_json(s));
    json_object_object_add(o, "ranks", ranks);
    kvo_http_respond_json(req, 200, o);
}

/* Blocks after a rank's first miss that the probe's detail form lists. */
#define DETAIL_AFTER 4

/* One rank's walk state in a probe. */
typedef struct probe_rank {
    uint32_t gpu, cpu; /* leading blocks found on the GPU, then in the CPU
                          tier after them */
    bool in_cpu;       /* the GPU run ended */
    bool dead;         /* the walk ended for this rank */
} probe_rank;

/* Block b's tokens of a probe's prompt (trace form: made into buf). */
static const uint64_t *probe_block_tokens(const mock_prompt *p, uint32_t b,
                                          uint32_t bs, uint64_t *buf) {
    if (!p->trace_ids) return p->tok + (size_t)b * bs;
    mock_trace_tokens_at(p->trace_ids, (uint64_t)b * bs, bs, buf);
    return buf;
}

/* Hash block b of a probe's prompt into h[b] (h[0..b) hashed before);
 * buf is scratch for a block's tokens. */
static kvo_status probe_hash(server *s, const mock_prompt *p,
                             const mock_keys *keys, uint32_t b, mock_hash *h,
                             uint64_t *buf, kvo_err *err) {
    uint32_t bs = s->cfg->block_size;
    mock_trace_ref tr = {p->trace_ids, p->n_trace};
    const uint64_t *tok = probe_block_tokens(p, b, bs, buf);
    kvo_status st = mock_hasher_block_next(s->node.hasher, tok, bs, b, h, keys,
                                           p->trace_ids ? &tr : NULL, &h[b]);
    if (st != KVO_OK)
        kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "%s", kvo_strerror(st));
    return st;
}

/* The detail form's chain of one rank: blocks 0 .. its first miss plus
 * DETAIL_AFTER, each with its engine hash, parent, GPU copies (and CPU
 * presence with a tier) and its router tokens_hash by the rule the relay
 * derives from the events (wire_router_hash_prompt's: the LoRA seed on
 * every block, the salt's on block 0 only, the items a block overlaps). */
static json_object *probe_chain(server *s, const mock_engine *e,
                                const mock_prompt *p, const mock_hash *h,
                                uint32_t nb, const mock_keys *k,
                                uint64_t *buf) {
    uint32_t bs = s->cfg->block_size;
    size_t ll = k->lora ? strlen(k->lora) : 0,
           sl = k->salt ? strlen(k->salt) : 0;
    uint64_t seed0 = wire_router_seed(k->lora, ll, k->salt, sl);
    uint64_t seed = wire_router_seed(k->lora, ll, NULL, 0);
    wire_mm_key keys[MOCK_MAX_MM_ITEMS];
    int64_t idx = 0; /* prompt blocks: the scan starts at the first item */
    json_object *chain = json_object_new_array();
    for (uint32_t b = 0; b < nb; b++) {
        json_object *o = json_object_new_object();
        uint32_t copies = mock_engine_copies_count(e, h[b].key);
        json_object_object_add(o, "index", json_object_new_int64(b));
        json_object_object_add(o, "hash", json_object_new_uint64(h[b].key));
        json_object_object_add(o, "parent",
                               b ? json_object_new_uint64(h[b - 1].key) : NULL);
        json_object_object_add(o, "cached",
                               json_object_new_boolean(copies > 0));
        json_object_object_add(o, "copies", json_object_new_int64(copies));
        if (mock_engine_cpu_blocks(e))
            json_object_object_add(
                o, "cpu",
                json_object_new_boolean(mock_engine_cpu_cached(e, h[b].key)));
        const uint64_t *tok = probe_block_tokens(p, b, bs, buf);
        uint32_t nk = mock_mm_block_keys(k->mm, k->n_mm, (uint64_t)b * bs,
                                         (uint64_t)(b + 1) * bs, &idx, keys);
        json_object_object_add(o, "tokens_hash",
                               json_object_new_uint64(wire_router_hash_mm(
                                   tok, bs, b ? seed : seed0, keys, nk)));
        json_object_array_add(chain, o);
    }
    return chain;
}

/* POST /kvo/probe: per rank, the leading cached blocks of the prompt -- what
 * the engine's prefix lookup would give, with no side effect:
 *   hit_blocks  blocks of cached_tokens (floor(cached_tokens / block_size)):
 *               the GPU run, capped at (n-1)//block_size, and with a CPU
 *               tier the run it holds after it (a full hit recomputes the
 *               last token)
 *   gpu, cpu    with a CPU tier: the two runs (blocks found per tier)
 *   full_blocks with --kv-groups: the full-attention group's run (what a
 *               router indexing that group scores); hit_blocks is then the
 *               hit every group agrees on (sliding windows cached)
 *   chain       with "detail": true (or at /kvo/chain): the prompt's
 *               chain to the first block not hit plus DETAIL_AFTER, per
 *               block {index, hash, parent, cached, copies, [cpu,]
 *               tokens_hash} (tokens_hash: the router hash with the LoRA
 *               and salt seed)
 * The walk goes block by block and stops at the first block no rank still
 * hits: a prompt that misses at block 0 costs one hash, whatever its length
 * (kvo-check probes every engine for every prompt). */
static void handle_probe(server *s, kvo_http_req *req, bool chain) {
    size_t len;
    const uint8_t *raw = kvo_http_req_body(req, &len);
    mock_probe_req pr;
    mock_hash *h = NULL;
    probe_rank *pk = NULL;
    uint64_t *blk_tok = NULL;
    kvo_err err;
    uint32_t bs = s->cfg->block_size;
    mock_probe_req_init(&pr);
    mock_req_limits lim = req_limits(s, PROBE_MAX_TOKENS);
    kvo_status st = mock_probe_parse(&pr, raw, len, &lim, &err);
    if (st != KVO_OK) goto done;
    bool detail = chain || pr.detail;
    const mock_prompt *p = &pr.prompt;
    uint32_t n = s->node.n_ranks;
    bool tier = s->cfg->cpu_offload_blocks > 0 && s->cfg->prefix_caching;
    uint32_t cap = (p->n - 1) / bs; /* the GPU run's limit */
    uint32_t full = p->n / bs;      /* the prompt's full blocks */
    uint32_t walk_max = tier ? full : cap;
    pk = kvo_calloc(n, sizeof(*pk));
    h = full ? kvo_malloc((size_t)full * sizeof(mock_hash)) : NULL;
    blk_tok = kvo_malloc(bs * sizeof(uint64_t));
    if (!pk || (full && !h) || !blk_tok) {
        st = kvo_err_set(&err, KVO_ENOMEM, KVO_ERR_NO_OFFSET, "out of memory");
        goto done;
    }
    mock_keys keys = {pr.lora, pr.salt, pr.mm, pr.n_mm};
    uint32_t hashed = 0;
    bool alive = s->cfg->prefix_caching;
    for (uint32_t b = 0; alive && b < walk_max; b++) {
        if ((st = probe_hash(s, p, &keys, b, h, blk_tok, &err)) != KVO_OK)
            goto done;
        hashed = b + 1;
        alive = false;
        for (uint32_t r = 0; r < n; r++) {
            probe_rank *q = &pk[r];
            const mock_engine *e = s->node.ranks[r].eng;
            if (q->dead) continue;
            if (!q->in_cpu && b < cap && mock_engine_cached(e, h[b].key)) {
                q->gpu++;
            } else if (tier && mock_engine_cpu_cached(e, h[b].key)) {
                q->in_cpu = true;
                q->cpu++;
            } else {
                q->dead = true;
                continue;
            }
            alive = true;
        }
    }
    /* the detail form's chains reach past every rank's first miss */
    uint32_t want = 0;
    for (uint32_t r = 0; detail && r < n; r++) {
        uint32_t w = pk[r].gpu + pk[r].cpu + 1 + DETAIL_AFTER;
        if (w > want) want = w;
    }
    if (want > full) want = full;
    if (!s->cfg->prefix_caching) want = 0;
    for (uint32_t b = hashed; b < want; b++)
        if ((st = probe_hash(s, p, &keys, b, h, blk_tok, &err)) != KVO_OK)
            goto done;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "block_size", json_object_new_int64(bs));
    json_object_object_add(o, "prompt_blocks",
                           json_object_new_int64((p->n + bs - 1) / bs));
    json_object *arr = json_object_new_array();
    bool groups = mock_cfg_groups(s->cfg) > 1;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t found = pk[r].gpu + pk[r].cpu;
        if (found > cap) found = cap;
        /* a hybrid model: what every group agrees on (the sliding windows) */
        if (groups)
            found = mock_engine_hybrid_hit(s->node.ranks[r].eng, h, pk[r].gpu);
        json_object *e = json_object_new_object();
        json_object_object_add(e, "dp_rank", json_object_new_int64(r));
        json_object_object_add(e, "hit_blocks", json_object_new_int64(found));
        if (groups) /* the full-attention group's run: what a router scores */
            json_object_object_add(e, "full_blocks",
                                   json_object_new_int64(pk[r].gpu));
        if (tier) {
            json_object_object_add(e, "gpu", json_object_new_int64(pk[r].gpu));
            json_object_object_add(e, "cpu", json_object_new_int64(pk[r].cpu));
        }
        if (detail) {
            uint32_t nb = found + 1 + DETAIL_AFTER;
            if (nb > want) nb = want;
            json_object_object_add(
                e, "chain",
                probe_chain(s, s->node.ranks[r].eng, p, h, nb, &keys, blk_tok));
        }
        json_object_array_add(arr, e);
    }
    json_object_object_add(o, "ranks", arr);
    kvo_http_respond_json(req, 200, o);
    /* "warm": this prompt comes next; hash it once the answer is out */
    if (pr.warm && p->trace_ids && !pr.lora && !pr.salt && !pr.n_mm &&
        s->cfg->prefix_caching) {
        uint64_t *ids = kvo_malloc((size_t)p->n_trace * sizeof(uint64_t));
        if (ids) { /* without it, only the memo stays cold */
            memcpy(ids, p->trace_ids, (size_t)p->n_trace * sizeof(uint64_t));
            kvo_free(s->warm_ids);
            s->warm_ids = ids;
            s->warm_n_ids = p->n_trace;
            s->warm_len = p->n;
        }
    }
done:
    if (st != KVO_OK) respond_err(s, req, err_code(st), "%s", err.msg);
    kvo_free(pk);
    kvo_free(h);
    kvo_free(blk_tok);
    mock_probe_req_fini(&pr);
}

/* The prompt a probe announced with "warm": its block hashes into the
 * trace memo now, while the client is busy elsewhere (kvo-check waits for
 * the index), so the completion that follows finds them computed. Changes
 * nothing but the memo: the same hashes, earlier. */
static void warm_memo(server *s) {
    if (!s->warm_ids) return;
    uint32_t bs = s->cfg->block_size, nb = s->warm_len / bs;
    uint64_t *tok =
        nb ? kvo_malloc((size_t)s->warm_len * sizeof(uint64_t)) : NULL;
    mock_hash *h = nb ? kvo_malloc((size_t)nb * sizeof(mock_hash)) : NULL;
    if (tok && h) {
        mock_trace_tokens(s->warm_ids, s->warm_n_ids, s->warm_len, tok);
        mock_trace_ref tr = {s->warm_ids, s->warm_n_ids};
        (void)mock_hasher_blocks(s->node.hasher, tok, bs, 0, nb, NULL, NULL,
                                 NULL, &tr,
                                 h); /* a failure only costs the memo */
    }
    kvo_free(tok);
    kvo_free(h);
    kvo_free(s->warm_ids);
    s->warm_ids = NULL;
}

/* GET /kvo/blocks?rank=R[&after=H][&limit=N][&tier=gpu|cpu][&group=G]: rank
 * R's cached set (the GPU pool's group G, default 0, the full-attention
 * one; or with tier=cpu the CPU tier's), the
 * engine's own hashes (--mutate corrupts only what is published), sorted:
 *   {"rank": R, "count": C, "digest": D,
 *    "blocks": [[block_hash, parent_hash|null], ...], "next": H|null}
 * count and digest cover the whole set (mock.h says how the digest is
 * made); blocks holds at most N (default and most BLOCKS_PAGE_MAX) hashes
 * above H; next, when more remain, is the after= of the next page. */
static void handle_blocks(server *s, kvo_http_req *req) {
    const char *rs = kvo_http_req_arg(req, "rank");
    const char *as = kvo_http_req_arg(req, "after");
    const char *ls = kvo_http_req_arg(req, "limit");
    const char *ts = kvo_http_req_arg(req, "tier");
    uint32_t rank, limit = BLOCKS_PAGE_MAX;
    uint64_t after = 0;
    if (!rs || kvo_parse_u32(rs, &rank) != KVO_OK || rank >= s->node.n_ranks) {
        respond_err(s, req, 400, "rank must be a data-parallel rank in [0, %u)",
                    s->node.n_ranks);
        return;
    }
    if (as && kvo_parse_u64(as, &after) != KVO_OK) {
        respond_err(s, req, 400,
                    "after must be a block hash (an integer in [0, 2^64))");
        return;
    }
    if (ls && (kvo_parse_u32(ls, &limit) != KVO_OK || limit == 0 ||
               limit > BLOCKS_PAGE_MAX)) {
        respond_err(s, req, 400, "limit must be an integer in [1, %u]",
                    BLOCKS_PAGE_MAX);
        return;
    }
    bool cpu = false;
    if (ts && strcmp(ts, "cpu") == 0)
        cpu = true;
    else if (ts && strcmp(ts, "gpu") != 0) {
        respond_err(s, req, 400, "tier must be gpu or cpu");
        return;
    }
    const char *gs = kvo_http_req_arg(req, "group");
    uint32_t group = 0, n_groups = mock_cfg_groups(s->cfg);
    if (gs && (kvo_parse_u32(gs, &group) != KVO_OK || group >= n_groups ||
               (cpu && group))) {
        respond_err(s, req, 400,
                    "group must be a KV-cache group in [0, %u) (GPU tier)",
                    n_groups);
        return;
    }
    const mock_engine *e = s->node.ranks[rank].eng;
    mock_engine_stats st;
    mock_engine_stats_get(e, &st);
    uint64_t count = cpu ? st.cpu_cached_distinct : st.cached_distinct;
    uint64_t digest = cpu ? st.cpu_cached_digest : st.cached_digest;
    if (group) mock_engine_group_set(e, group, &count, &digest);
    uint32_t cap = count < limit ? (uint32_t)count : limit;
    mock_cached_block *b = kvo_malloc(((size_t)cap + 1) * sizeof(*b));
    uint32_t n = 0;
    bool more = false;
    kvo_buf out;
    kvo_buf_init(&out);
    kvo_status rc = KVO_ENOMEM;
    if (b && cpu)
        rc = mock_engine_cpu_cached_blocks(e, as != NULL, after, b, cap, &n,
                                           &more);
    else if (b)
        rc = mock_engine_group_blocks(e, group, as != NULL, after, b, cap, &n,
                                      &more);
    if (rc == KVO_OK && gs) /* the group named back only when asked for */
        rc = kvo_buf_printf(&out,
                            "{\"rank\":%u,\"group\":%u,\"count\":%" PRIu64
                            ",\"digest\":%" PRIu64 ",\"blocks\":[",
                            rank, group, count, digest);
    else if (rc == KVO_OK && ts) /* the tier named back only when asked for */
        rc = kvo_buf_printf(&out,
                            "{\"rank\":%u,\"tier\":\"%s\",\"count\":%" PRIu64
                            ",\"digest\":%" PRIu64 ",\"blocks\":[",
                            rank, cpu ? "cpu" : "gpu", count, digest);
    else if (rc == KVO_OK)
        rc = kvo_buf_printf(&out,
                            "{\"rank\":%u,\"count\":%" PRIu64
                            ",\"digest\":%" PRIu64 ",\"blocks\":[",
                            rank, count, digest);
    for (uint32_t i = 0; i < n && rc == KVO_OK; i++) {
        if (b[i].has_parent)
            rc = kvo_buf_printf(&out, "%s[%" PRIu64 ",%" PRIu64 "]",
                                i ? "," : "", b[i].hash, b[i].parent);
        else
            rc = kvo_buf_printf(&out, "%s[%" PRIu64 ",null]", i ? "," : "",
                                b[i].hash);
    }
    if (rc == KVO_OK) {
        if (more)
            rc = kvo_buf_printf(&out, "],\"next\":%" PRIu64 "}", b[n - 1].hash);
        else
            rc = kvo_buf_printf(&out, "],\"next\":null}");
    }
    if (rc == KVO_OK)
        kvo_http_respond(req, 200, "application/json", out.data, out.len);
    else
        respond_err(s, req, 503, "listing the cached blocks: %s",
                    kvo_strerror(rc));
    kvo_buf_fini(&out);
    kvo_free(b);
}

/* tcp://bound-host:port -> tcp://advertise-host:port */
static json_object *advertised(server *s, const char *bound) {
    if (!bound || !*bound) return NULL;
    const char *colon = strrchr(bound, ':');
    if (strncmp(bound, "tcp://", 6) != 0 || !colon)
        return json_object_new_string(bound);
    char buf[320];
    snprintf(buf, sizeof(buf), "tcp://%s%s", node_advertise_host(&s->node),
             colon);
    return json_object_new_string(buf);
}

static void handle_sources(server *s, kvo_http_req *req) {
    json_object *arr = json_object_new_array();
    for (uint32_t r = 0; r < s->node.n_ranks; r++) {
        node_rank *nr = &s->node.ranks[r];
        if (!nr->source) continue;
        json_object *o = json_object_new_object();
        json_object_object_add(o, "transport", json_object_new_string("zmq"));
        json_object_object_add(o, "endpoint",
                               advertised(s, mock_pub_endpoint(nr->pub)));
        json_object_object_add(
            o, "replay_endpoint",
            advertised(s, mock_pub_replay_endpoint(nr->pub)));
        json_object_object_add(o, "topic",
                               json_object_new_string(s->cfg->topic));
        json_object_object_add(o, "data_parallel_rank",
                               json_object_new_int64(r));
        json_object_object_add(o, "encoding",
                               json_object_new_string("msgpack"));
        json_object_array_add(arr, o);
    }
    kvo_http_respond_json(req, 200, arr);
}

static void on_http(void *ctx, kvo_http_req *req) {
    server *s = ctx;
    s->http_requests++;
    const char *m = kvo_http_req_method(req);
    const char *p = kvo_http_req_path(req);
    bool get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0;
    if (strcmp(p, "/v1/completions") == 0 && post)
        handle_completion(s, req, false);
    else if (strcmp(p, "/v1/chat/completions") == 0 && post)
        handle_completion(s, req, true);
    else if (strcmp(p, "/health") == 0 && get)
        kvo_http_respond(req, 200, "text/plain", "", 0);
    else if (strcmp(p, "/v1/models") == 0 && get)
        handle_models(s, req);
    else if (strcmp(p, "/reset_prefix_cache") == 0 && post)
        handle_reset(s, req);
    else if (strcmp(p, "/metrics") == 0 && get)
        handle_metrics(s, req);
    else if (strcmp(p, "/kvo/state") == 0 && get)
        handle_state(s, req);
    else if (strcmp(p, "/kvo/probe") == 0 && post)
        handle_probe(s, req, false);
    else if (strcmp(p, "/kvo/chain") == 0 && post)
        handle_probe(s, req, true);
    else if (strcmp(p, "/kvo/blocks") == 0 && get)
        handle_blocks(s, req);
    else if (strcmp(p, "/kvo/event_sources") == 0 && get)
        handle_sources(s, req);
    else
        respond_err(s, req, 404, "no route for %s %s", m, p);
}

/* ---- the loop -------------------------------------------------------------*/

static double model_now(const server *s) {
    return (double)(kvo_now_ns() - s->t0_ns) / 1e6 * s->cfg->speedup;
}

/* Longest run of back-to-back virtual-time steps of one rank between two
 * looks at HTTP and replay requests. */
#define VIRT_SLICE_NS 2000000ull
#define VIRT_CLOCK_STEPS 8

/* Advance every rank; returns true when virtual time still has work. */
static kvo_status step_ranks(server *s, bool *busy, double *next_due_ms) {
    bool virt = s->cfg->speedup <= 0;
    *busy = false;
    *next_due_ms = -1;
    s->answered = false;
    for (uint32_t r = 0; r < s->node.n_ranks; r++) {
        node_rank *nr = &s->node.ranks[r];
        double now = virt ? 0 : model_now(s);
        if (nr->in_step) {
            if (now < nr->step_end) {
                double due = (nr->step_end - now) / s->cfg->speedup;
                if (*next_due_ms < 0 || due < *next_due_ms) *next_due_ms = due;
                continue;
            }
            nr->in_step = false;
            node_step_end(&s->node, r);
        }
        /* Virtual time: steps back to back for up to VIRT_SLICE_NS, then
         * the loop serves HTTP and replays again (one poll and one MHD run
         * per step cost more than a decode step itself). The clocks are
         * read every VIRT_CLOCK_STEPS steps: batch timestamps are wall
         * time to within those few steps. */
        uint64_t slice_end = virt ? kvo_now_ns() + VIRT_SLICE_NS : 0;
        double ts = (double)kvo_unix_ns() / 1e9;
        uint32_t steps = 0;
    again:
        if (!mock_engine_has_work(nr->eng) && !mock_engine_has_events(nr->eng))
            continue;
        mock_step st;
        kvo_status rc = node_step_begin(&s->node, r, ts, &st);
        if (rc != KVO_OK) return rc;
        uint64_t last;
        if (st.n_started && mock_pub_last_seq(nr->pub, &last)) {
            for (uint32_t i = 0; i < st.n_started; i++) {
                choice *c = st.started[i];
                c->prefill_seq_set = true;
                c->prefill_seq = last;
            }
        }
        if (st.idle) continue;
        if (virt) {
            node_step_end(&s->node, r);
            if (!mock_engine_has_work(nr->eng)) continue;
            if (kvo_stop || s->answered) {
                *busy = true;
                continue;
            }
            if (++steps % VIRT_CLOCK_STEPS != 0) goto again;
            ts = (double)kvo_unix_ns() / 1e9;
            if (kvo_now_ns() < slice_end) goto again;
            *busy = true;
        } else {
            nr->in_step = true;
            nr->step_end = now + st.duration_ms;
            double due = st.duration_ms / s->cfg->speedup;
            if (*next_due_ms < 0 || due < *next_due_ms) *next_due_ms = due;
        }
    }
    return KVO_OK;
}

kvo_status mock_run_server(const mock_cfg *cfg) {
    server *s = kvo_calloc(1, sizeof(*s));
    if (!s) return KVO_ENOMEM;
    zmq_pollitem_t *items = NULL; /* [0] HTTP, then every replay ROUTER */
    uint32_t *rank_of = NULL;     /* items[i]'s rank */
    uint32_t n_items = 0;
    s->cfg = cfg;
    s->t0_ns = kvo_now_ns();
    s->started_unix = (long long)time(NULL);
    kvo_buf_init(&s->scratch);
    /* HTTP first: its port is usually a fixed one the caller picked, and
     * the event sockets' "port 0" must not take it from us (requests wait
     * in the backlog until the loop runs) */
    kvo_http_server_cfg hc = {
        .host = cfg->host, .port = cfg->port, .handler = on_http, .ctx = s};
    kvo_status st = kvo_http_server_new(&s->http, &hc);
    if (st != KVO_OK) {
        kvo_error("HTTP server on %s:%u: %s", cfg->host, (unsigned)cfg->port,
                  kvo_strerror(st));
        goto done;
    }
    if ((st = node_init(&s->node, cfg, true)) != KVO_OK) goto done;
    items = kvo_calloc(s->node.n_ranks + 1, sizeof(*items));
    rank_of = kvo_calloc(s->node.n_ranks + 1, sizeof(*rank_of));
    if (!items || !rank_of) {
        st = KVO_ENOMEM;
        goto done;
    }
    kvo_info("listening on http://%s:%u", cfg->host,
             (unsigned)kvo_http_server_port(s->http));
    items[n_items++] =
        (zmq_pollitem_t){NULL, kvo_http_server_fd(s->http), ZMQ_POLLIN, 0};
    for (uint32_t r = 0; r < s->node.n_ranks; r++) {
        void *rs = mock_pub_replay_socket(s->node.ranks[r].pub);
        if (!rs) continue;
        rank_of[n_items] = r;
        items[n_items++] = (zmq_pollitem_t){rs, 0, ZMQ_POLLIN, 0};
    }
    while (!kvo_stop) {
        bool busy;
        double due;
        if ((st = step_ranks(s, &busy, &due)) != KVO_OK) {
            kvo_error("engine step: %s", kvo_strerror(st));
            break;
        }
        process_cancels(s);
        long timeout = IDLE_POLL_MS;
        if (busy)
            timeout = 0;
        else if (due >= 0 && due < timeout)
            timeout = (long)due + (due > (long)due);
        long ht = kvo_http_server_timeout_ms(s->http);
        if (ht >= 0 && ht < timeout) timeout = ht;
        int rc = zmq_poll(items, (int)n_items, timeout);
        if (rc > 0) {
            for (uint32_t i = 1; i < n_items; i++)
                if (items[i].revents & ZMQ_POLLIN)
                    node_replay_serve(&s->node, rank_of[i]);
        }
        kvo_http_server_run(s->http);
        warm_memo(s);
    }
    if (kvo_stop) st = KVO_OK;
    kvo_info("stopping: %llu HTTP requests, %llu finished, %llu aborted",
             (unsigned long long)s->http_requests,
             (unsigned long long)s->finished_length,
             (unsigned long long)s->finished_aborted);
done:
    kvo_http_server_free(s->http); /* pending requests get 503 */
    node_fini(&s->node);           /* engines drop requests, no callbacks */
    while (s->calls) {
        call *k = s->calls;
        s->calls = k->next;
        call_free(k);
    }
    kvo_free(items);
    kvo_free(rank_of);
    kvo_buf_fini(&s->scratch);
    kvo_free(s->warm_ids);
    kvo_free(s);
    return st;
}
