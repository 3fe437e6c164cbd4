/* The real kvo-mocker binary over real sockets: the OpenAI API shapes (incl.
 * SSE), the ground-truth API, discovery, events on the advertised PUB and
 * replay endpoints, reset, errors, roles, publisher failure, clean exit. */
#include "mt.h"
#include "kvo_http.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

Suite *suite_http(void);

typedef struct mocker {
    kt_proc p;
    uint16_t port;
    char url[64];
    kvo_http_client *c;
    kvo_http_resp r;
} mocker;

static void mocker_start(mocker *m, const char *const extra[]) {
    const char *args[40];
    int n = 0;
    args[n++] = "--zmq-port";
    args[n++] = "0";
    args[n++] = "--replay-port";
    args[n++] = "0";
    for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    m->port = mt_mocker_spawn(&m->p, args);
    snprintf(m->url, sizeof(m->url), "http://127.0.0.1:%u", m->port);
    ck_assert_int_eq(kvo_http_client_new(&m->c, 20000), KVO_OK);
    kvo_http_resp_init(&m->r);
}

static int mocker_stop(mocker *m) {
    kvo_http_resp_fini(&m->r);
    kvo_http_client_free(m->c);
    return kt_proc_stop(&m->p);
}

/* POST the len bytes of body (or GET: body NULL); returns the parsed JSON
 * (caller puts) or NULL when the answer is not JSON; *status gets the HTTP
 * status. */
static json_object *call_n(mocker *m, const char *path, const char *body,
                           size_t len, long *status) {
    char url[256];
    snprintf(url, sizeof(url), "%s%s", m->url, path);
    kvo_status st =
        body ? kvo_http_post(m->c, url, "application/json", body, len, &m->r)
             : kvo_http_get(m->c, url, &m->r);
    ck_assert_msg(st == KVO_OK, "%s: %s", path, kvo_strerror(st));
    if (status) *status = m->r.status;
    return json_tokener_parse((const char *)m->r.body.data);
}

/* call_n of a C string (or GET). */
static json_object *call(mocker *m, const char *path, const char *body,
                         long *status) {
    return call_n(m, path, body, body ? strlen(body) : 0, status);
}

static json_object *ok(mocker *m, const char *path, const char *body) {
    long status;
    json_object *j = call(m, path, body, &status);
    ck_assert_msg(status == 200, "%s -> %ld: %s", path, status,
                  (const char *)m->r.body.data);
    ck_assert_ptr_nonnull(j);
    return j;
}

static json_object *at(json_object *o, const char *path) {
    /* "a.b.0.c" */
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ".", &save); tok && o;
         tok = strtok_r(NULL, ".", &save)) {
        if (json_object_is_type(o, json_type_array))
            o = json_object_array_get_idx(o, (size_t)atoi(tok));
        else if (!json_object_object_get_ex(o, tok, &o))
            return NULL;
    }
    return o;
}

static int64_t num(json_object *o, const char *path) {
    json_object *v = at(o, path);
    ck_assert_msg(v && json_object_is_type(v, json_type_int),
                  "%s: not an integer", path);
    return json_object_get_int64(v);
}

static const char *str(json_object *o, const char *path) {
    json_object *v = at(o, path);
    ck_assert_msg(v && json_object_is_type(v, json_type_string),
                  "%s: not a string", path);
    return json_object_get_string(v);
}

static const char prompt13[] = "[1,2,3,4,5,6,7,8,9,10,11,12,13]";

START_TEST(completions_report_cached_tokens_and_the_kvo_object) {
    mocker m;
    mocker_start(&m, MT_ARGS("--block-size", "4", "--dp-size", "2"));
    char body[256];
    snprintf(body, sizeof(body),
             "{\"prompt\": %s, \"max_tokens\": 3, \"data_parallel_rank\": 1}",
             prompt13);
    json_object *j = ok(&m, "/v1/completions", body);
    ck_assert_str_eq(str(j, "object"), "text_completion");
    ck_assert_str_eq(str(j, "model"), "kvo-mock");
    ck_assert(strncmp(str(j, "id"), "cmpl-", 5) == 0);
    ck_assert_str_eq(str(j, "choices.0.finish_reason"), "length");
    const char *text = str(j, "choices.0.text");
    int words = 0;
    for (const char *p = text; (p = strstr(p, " t")); p += 2) words++;
    ck_assert_int_eq(words, 3);
    ck_assert_int_eq(num(j, "usage.prompt_tokens"), 13);
    ck_assert_int_eq(num(j, "usage.completion_tokens"), 3);
    ck_assert_int_eq(num(j, "usage.total_tokens"), 16);
    ck_assert_int_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 0);
    ck_assert_int_eq(num(j, "kvo.dp_rank"), 1);
    ck_assert_int_eq(num(j, "kvo.prefill_seq"), 0);
    ck_assert_int_eq(num(j, "kvo.last_seq"), 0);
    json_object_put(j);
    /* Again: (13 - 1) // 4 = 3 blocks hit, nothing new stored. */
    j = ok(&m, "/v1/completions", body);
    ck_assert_int_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 12);
    ck_assert_int_eq(num(j, "kvo.last_seq"), 0);
    json_object_put(j);
    /* The rank from the header; rank 0 has nothing cached. */
    char url[128];
    snprintf(url, sizeof(url), "%s/v1/completions", m.url);
    snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": 2}",
             prompt13);
    /* kvo_http has no header setter: send it raw. */
    int fd =
        mt_raw_post(m.port, "/v1/completions",
                    "Connection: close\r\nX-data-parallel-rank: 0\r\n", body);
    kvo_buf resp;
    kvo_buf_init(&resp);
    char chunk[4096];
    ssize_t got;
    while ((got = read(fd, chunk, sizeof(chunk))) > 0)
        kvo_buf_append(&resp, chunk, (size_t)got);
    close(fd);
    kvo_buf_cstr(&resp);
    ck_assert(strstr((char *)resp.data, "200 OK") != NULL);
    ck_assert_msg(strstr((char *)resp.data, "\"kvo\":{\"dp_rank\":0") != NULL,
                  "%s", (char *)resp.data);
    ck_assert(strstr((char *)resp.data, "\"cached_tokens\":0") != NULL);
    kvo_buf_fini(&resp);
    /* Ground truth agrees. */
    j = ok(&m, "/kvo/probe",
           "{\"token_ids\": [1,2,3,4,5,6,7,8,9,10,11,12,13]}");
    ck_assert_int_eq(num(j, "block_size"), 4);
    ck_assert_int_eq(num(j, "prompt_blocks"), 4);
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 3);
    ck_assert_int_eq(num(j, "ranks.1.hit_blocks"), 3);
    json_object_put(j);
    j = ok(&m, "/kvo/probe", "{\"token_ids\": [1,2,3,4,5,6,7,8,9,10,11,12]}");
    ck_assert_int_eq(num(j, "ranks.1.hit_blocks"), 2); /* capped */
    json_object_put(j);
    j = ok(&m, "/kvo/state", NULL);
    ck_assert_str_eq(str(j, "worker.role"), "aggregated");
    ck_assert_int_eq(num(j, "worker.block_size"), 4);
    ck_assert_int_eq(num(j, "worker.num_gpu_blocks"), 16384);
    ck_assert_str_eq(str(j, "worker.hash_algo"), "sha256");
    ck_assert_str_eq(str(j, "worker.event_format"), "map");
    ck_assert_int_eq(num(j, "ranks.1.dp_rank"), 1);
    ck_assert_int_eq(num(j, "ranks.1.last_seq"), 0);
    ck_assert_int_eq(num(j, "ranks.0.last_seq"), 0);
    ck_assert_int_eq(num(j, "ranks.1.resident_blocks"), 3);
    ck_assert_int_eq(num(j, "ranks.1.free_blocks"), 16383);
    ck_assert_int_eq(num(j, "ranks.1.requests_finished"), 2);
    ck_assert_int_eq(num(j, "ranks.1.counters.prefix_hits"), 12);
    /* the regime counters (one request at a time: no load) */
    ck_assert_int_eq(num(j, "ranks.1.counters.steps_multi"), 0);
    ck_assert_int_eq(num(j, "ranks.1.counters.max_running"), 1);
    ck_assert_int_eq(num(j, "ranks.1.counters.prefills_split"), 0);
    ck_assert_int_eq(num(j, "ranks.1.counters.preemptions"), 0);
    ck_assert_int_eq(num(j, "ranks.1.counters.evictions_in_store_steps"), 0);
    ck_assert_int_eq(num(j, "ranks.1.counters.max_inflight"), 1);
    /* losses are counted where a reader of the state sees them */
    ck_assert_int_eq(num(j, "ranks.1.counters.events_lost_enomem"), 0);
    ck_assert_int_eq(num(j, "ranks.1.counters.render_errors"), 0);
    ck_assert_int_eq(num(j, "ranks.1.counters.skipped_seqs"), 0);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

START_TEST(every_prompt_form_chat_and_token_ids) {
    mocker m;
    mocker_start(&m, MT_ARGS("--block-size", "4"));
    json_object *j =
        ok(&m, "/v1/completions", "{\"prompt\": \"hello world!\"}");
    ck_assert_int_eq(num(j, "usage.prompt_tokens"),
                     12); /* one token per byte */
    ck_assert_int_eq(num(j, "usage.completion_tokens"),
                     16); /* default max_tokens */
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": [[5,6,7,8,9], [5,6,7,8,9,10]], \"max_tokens\": 2, "
           "\"return_token_ids\": true}");
    ck_assert_int_eq(num(j, "choices.0.index"), 0);
    ck_assert_int_eq(num(j, "choices.1.index"), 1);
    ck_assert_int_eq(
        (int64_t)json_object_array_length(at(j, "choices.1.token_ids")), 2);
    ck_assert_int_eq(num(j, "usage.prompt_tokens"), 11);
    ck_assert_int_eq(num(j, "usage.completion_tokens"), 4);
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": [\"abcdefgh\", \"abcdefghi\"], \"max_tokens\": 1}");
    ck_assert_int_eq((int64_t)json_object_array_length(at(j, "choices")), 2);
    json_object_put(j);
    /* The trace extension: the same tokens kvo-check synthesizes. */
    j = ok(&m, "/v1/completions",
           "{\"trace\": {\"hash_ids\": [11, 12], \"input_length\": 600}, "
           "\"max_tokens\": 1}");
    ck_assert_int_eq(num(j, "usage.prompt_tokens"), 600);
    json_object_put(j);
    j = ok(&m, "/kvo/probe",
           "{\"trace\": {\"hash_ids\": [11, 12], \"input_length\": 600}}");
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 149);
    ck_assert_int_eq(num(j, "prompt_blocks"), 150);
    json_object_put(j);
    char ids[8192] = "{\"token_ids\": [";
    size_t len = strlen(ids);
    for (uint32_t k = 0; k < 600; k++)
        len +=
            (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%u", k ? "," : "",
                             mock_trace_token(k < 512 ? 11 : 12, k % 512));
    snprintf(ids + len, sizeof(ids) - len, "]}");
    j = ok(&m, "/kvo/probe", ids);
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 149);
    json_object_put(j);
    /* Chat, through the fixed template. */
    j = ok(&m, "/v1/chat/completions",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
           "\"max_tokens\": 2}");
    ck_assert_str_eq(str(j, "object"), "chat.completion");
    ck_assert_str_eq(str(j, "choices.0.message.role"), "assistant");
    ck_assert(strlen(str(j, "choices.0.message.content")) > 0);
    ck_assert_int_eq(num(j, "usage.prompt_tokens"),
                     26); /* <|user|>\nhi\n<|assistant|>\n */
    json_object_put(j);
    /* LoRA and salt change the hashes: no hit across them. */
    j = ok(&m, "/v1/completions",
           "{\"prompt\": \"0123456789abcdef\", \"max_tokens\": 1}");
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": \"0123456789abcdef\", \"max_tokens\": 1, "
           "\"lora_name\": \"a\"}");
    ck_assert_int_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 0);
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": \"0123456789abcdef\", \"max_tokens\": 1, "
           "\"cache_salt\": \"s\"}");
    ck_assert_int_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 0);
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": \"0123456789abcdef\", \"max_tokens\": 1, "
           "\"lora_name\": \"a\"}");
    ck_assert_int_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 12);
    json_object_put(j);
    j = ok(&m, "/kvo/probe",
           "{\"token_ids\": [48,49,50,51,52,53,54,55,56,57,97,98,99,"
           "100,101,102], \"cache_salt\": \"s\"}");
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 3);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

START_TEST(stream_sends_server_sent_events_then_done) {
    mocker m;
    mocker_start(&m, NULL);
    long status;
    json_object *j =
        call(&m, "/v1/completions",
             "{\"prompt\": [1,2,3], \"max_tokens\": 4, \"stream\": true, "
             "\"stream_options\": {\"include_usage\": true}}",
             &status);
    ck_assert_ptr_null(j);
    ck_assert_int_eq(status, 200);
    kvo_buf_cstr(&m.r.body);
    char *body = (char *)m.r.body.data;
    int chunks = 0, tokens = 0, finish = 0, usage = 0;
    bool done = false;
    char *save = NULL;
    for (char *line = strtok_r(body, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        ck_assert_msg(strncmp(line, "data: ", 6) == 0,
                      "not an SSE data line: %s", line);
        ck_assert(!done);
        if (strcmp(line + 6, "[DONE]") == 0) {
            done = true;
            continue;
        }
        json_object *c = json_tokener_parse(line + 6);
        ck_assert_ptr_nonnull(c);
        chunks++;
        ck_assert_str_eq(str(c, "object"), "text_completion");
        json_object *ch = at(c, "choices");
        if (json_object_array_length(ch) == 0) {
            usage++;
            ck_assert_int_eq(num(c, "usage.completion_tokens"), 4);
            ck_assert_int_eq(
                num(c, "usage.prompt_tokens_details.cached_tokens"), 0);
            ck_assert_int_eq(num(c, "kvo.dp_rank"), 0);
        } else if (json_object_get_type(at(c, "choices.0.finish_reason")) ==
                   json_type_null) {
            tokens++;
            ck_assert(strncmp(str(c, "choices.0.text"), " t", 2) == 0);
        } else {
            finish++;
            ck_assert_str_eq(str(c, "choices.0.finish_reason"), "length");
        }
        json_object_put(c);
    }
    ck_assert(done);
    ck_assert_int_eq(tokens, 4);
    ck_assert_int_eq(finish, 1);
    ck_assert_int_eq(usage, 1);
    ck_assert_int_eq(chunks, 6);
    /* Chat streams deltas, the role first. */
    j = call(&m, "/v1/chat/completions",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
             "\"max_tokens\": 2, "
             "\"stream\": true}",
             &status);
    ck_assert_int_eq(status, 200);
    kvo_buf_cstr(&m.r.body);
    ck_assert(strstr((char *)m.r.body.data,
                     "\"delta\":{\"role\":\"assistant\",\"content\":") != NULL);
    ck_assert(strstr((char *)m.r.body.data, "chat.completion.chunk") != NULL);
    ck_assert(strstr((char *)m.r.body.data, "data: [DONE]\n\n") != NULL);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

START_TEST(models_health_and_vllm_metric_names) {
    mocker m;
    mocker_start(&m, MT_ARGS("--model", "my-model", "--dp-size", "2"));
    json_object *j = ok(&m, "/v1/models", NULL);
    ck_assert_str_eq(str(j, "object"), "list");
    ck_assert_str_eq(str(j, "data.0.id"), "my-model");
    ck_assert_str_eq(str(j, "data.0.object"), "model");
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18], "
           "\"data_parallel_rank\": 1}");
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18], "
           "\"data_parallel_rank\": 1}");
    json_object_put(j);
    long status;
    call(&m, "/metrics", NULL, &status);
    ck_assert_int_eq(status, 200);
    kvo_buf_cstr(&m.r.body);
    const char *t = (const char *)m.r.body.data;
    static const char *const want[] = {
        "# TYPE vllm:num_requests_running gauge",
        "vllm:num_requests_running{engine=\"1\",model_name=\"my-model\"} 0",
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"my-model\"} 0",
        "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"my-model\"} 0",
        "vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"my-model\"}",
        "# TYPE vllm:prefix_cache_queries counter",
        ("vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"my-"
         "model\"} 36"),
        "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"my-model\"} 16",
        "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"my-model\"} 0",
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(want); i++)
        ck_assert_msg(strstr(t, want[i]) != NULL, "missing '%s' in\n%s",
                      want[i], t);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* kvo_prom refuses labels it cannot hold (a 600-character model name):
 * /metrics answers 500 with vLLM's JSON error, never a cut text. */
START_TEST(metrics_that_cannot_be_written_answer_500_with_a_json_error) {
    static char model[600];
    memset(model, 'x', sizeof(model) - 1);
    mocker m;
    mocker_start(&m, MT_ARGS("--model", model));
    long status;
    json_object *j = call(&m, "/metrics", NULL, &status);
    ck_assert_int_eq(status, 500);
    ck_assert_msg(j != NULL, "not JSON: %s", (const char *)m.r.body.data);
    ck_assert_str_eq(str(j, "object"), "error");
    ck_assert_int_eq(num(j, "code"), 500);
    ck_assert_msg(strstr(str(j, "message"), "metrics") != NULL, "%s",
                  str(j, "message"));
    json_object_put(j);
    json_object_put(ok(&m, "/kvo/state", NULL)); /* still serving */
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

START_TEST(event_sources_advertise_endpoints_that_carry_the_events_and_replay) {
    mocker m;
    mocker_start(&m, MT_ARGS("--block-size", "4", "--dp-size", "2", "--topic",
                             "kv", "--advertise-host", "localhost"));
    json_object *src = ok(&m, "/kvo/event_sources", NULL);
    ck_assert_int_eq((int64_t)json_object_array_length(src), 2);
    ck_assert_str_eq(str(src, "1.transport"), "zmq");
    ck_assert_str_eq(str(src, "1.encoding"), "msgpack");
    ck_assert_str_eq(str(src, "1.topic"), "kv");
    ck_assert_int_eq(num(src, "1.data_parallel_rank"), 1);
    const char *ep = str(src, "1.endpoint"),
               *rep = str(src, "1.replay_endpoint");
    ck_assert(strncmp(ep, "tcp://localhost:", 16) == 0);
    ck_assert(strncmp(rep, "tcp://localhost:", 16) == 0);
    void *ctx = zmq_ctx_new();
    void *sub = mt_zsock(ctx, ZMQ_SUB, ep, 200, 0);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    /* Slow joiner: send distinct prompts until one is seen. */
    uint8_t *fr[4];
    size_t len[4];
    int n = -1;
    uint32_t base = 0;
    for (int tries = 0; tries < 100 && n < 0; tries++) {
        base = 1000 + (uint32_t)tries * 10;
        char body[256];
        snprintf(body, sizeof(body),
                 "{\"prompt\": [%u,%u,%u,%u,%u], \"max_tokens\": 1, "
                 "\"data_parallel_rank\": 1}",
                 base, base + 1, base + 2, base + 3, base + 4);
        json_object_put(ok(&m, "/v1/completions", body));
        n = mt_recv_frames(sub, fr, len, 4);
    }
    ck_assert_int_eq(n, 3);
    ck_assert(len[0] == 2 && memcmp(fr[0], "kv", 2) == 0);
    wire_batch b;
    wire_batch_init(&b);
    ck_assert_int_eq(wire_batch_decode(fr[2], len[2], NULL, &b, NULL), KVO_OK);
    ck_assert(b.dp_rank.set && b.dp_rank.v == 1);
    ck_assert_int_eq(b.events[0].type, WIRE_EV_STORED);
    /* The published hash is the engine hash of the prompt's first block. */
    mock_hasher *h;
    ck_assert_int_eq(mock_hasher_new(&h, WIRE_ALGO_SHA256, "0", 0), KVO_OK);
    uint64_t toks[4] = {base, base + 1, base + 2, base + 3};
    mock_hash hs;
    mock_hasher_blocks(h, toks, 4, 0, 1, NULL, NULL, NULL, NULL, &hs);
    ck_assert(b.events[0].hashes[0].key == hs.key);
    uint64_t seq = mt_seq(fr[1], len[1]);
    for (int i = 0; i < 3; i++) kvo_free(fr[i]);
    /* Replay from 0 on the advertised ROUTER gives every batch so far. */
    void *d = mt_zsock(ctx, ZMQ_DEALER, rep, 5000, 0);
    mt_replay_request(d, 0);
    uint64_t want = 0;
    for (;;) {
        ck_assert_int_eq(mt_recv_frames(d, fr, len, 4), 4);
        uint64_t s = mt_seq(fr[2], len[2]);
        bool end = s == WIRE_REPLAY_END;
        if (!end) {
            ck_assert_uint_eq(s, want++);
            ck_assert(len[1] == 2 && memcmp(fr[1], "kv", 2) == 0);
        } else {
            ck_assert(len[1] == 0 && len[3] == 0);
        }
        for (int i = 0; i < 4; i++) kvo_free(fr[i]);
        if (end) break;
    }
    ck_assert_uint_eq(want, seq + 1);
    /* reset_prefix_cache: success when idle; AllBlocksCleared follows. */
    json_object *j = ok(&m, "/reset_prefix_cache", "");
    ck_assert(json_object_get_boolean(at(j, "success")));
    json_object_put(j);
    ck_assert_int_eq(mt_recv_frames(sub, fr, len, 4), 3);
    ck_assert_int_eq(wire_batch_decode(fr[2], len[2], NULL, &b, NULL), KVO_OK);
    ck_assert_uint_eq(b.n_events, 1);
    ck_assert_int_eq(b.events[0].type, WIRE_EV_CLEARED);
    for (int i = 0; i < 3; i++) kvo_free(fr[i]);
    j = ok(&m, "/kvo/state", NULL);
    ck_assert_int_eq(num(j, "ranks.1.resident_blocks"), 0);
    json_object_put(j);
    wire_batch_fini(&b);
    mock_hasher_free(h);
    zmq_close(sub);
    zmq_close(d);
    zmq_ctx_term(ctx);
    json_object_put(src);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

START_TEST(reset_prefix_cache_fails_while_a_request_holds_blocks) {
    mocker m;
    mocker_start(&m, MT_ARGS("--speedup", "1"));
    /* A real-time request of 100 tokens (>= 100 decode steps of >= 1 ms),
     * sent raw so this thread does not wait for it. */
    int fd = mt_raw_post(
        m.port, "/v1/completions", "Connection: close\r\n",
        "{\"prompt\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18], "
        "\"max_tokens\": 100, \"stream\": true}");
    /* Wait for its first token: from then on it holds blocks. */
    char buf[4096];
    ssize_t got = 0;
    size_t total = 0;
    buf[0] = '\0';
    while (!strstr(buf, "data: ") && total + 1 < sizeof(buf) &&
           (got = read(fd, buf + total, sizeof(buf) - 1 - total)) > 0) {
        total += (size_t)got;
        buf[total] = '\0';
    }
    ck_assert_msg(strstr(buf, "data: ") != NULL, "no token streamed: %s", buf);
    long status;
    json_object *j = call(&m, "/reset_prefix_cache", "", &status);
    ck_assert_int_eq(status, 409);
    ck_assert(!json_object_get_boolean(at(j, "success")));
    json_object_put(j);
    while ((got = read(fd, buf, sizeof(buf))) > 0) {
    }
    close(fd);
    j = call(&m, "/reset_prefix_cache", "", &status);
    ck_assert_int_eq(status, 200);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

START_TEST(bad_requests_get_vllm_style_errors) {
    mocker m;
    mocker_start(&m, MT_ARGS("--dp-size", "2", "--num-gpu-blocks", "10",
                             "--block-size", "4"));
    /* message: the exact answer text, where one is pinned (NULL: any). */
    static const struct {
        const char *path, *body;
        long status;
        const char *message;
    } cases[] = {
        {"/v1/completions", "{not json", 400,
         "cannot read the body as JSON (byte 1: expected a key string)"},
        {"/v1/completions", "[1,2]", 400, "body must be a JSON object"},
        /* strict: one value then whitespace only, exact integers, UTF-8 */
        {"/v1/completions", "{\"prompt\": [1,2,3]} x", 400,
         "cannot read the body as JSON (byte 20: trailing characters after the "
         "JSON "
         "value)"},
        {"/v1/completions", "{\"prompt\": [18446744073709551616]}", 400,
         "cannot read the body as JSON (byte 12: integer out of range)"},
        {"/v1/completions", "{\"prompt\": \"\xff\"}", 400, NULL},
        {"/v1/completions", "{\"prompt\": [1], \"prompt\": [2]}", 400, NULL},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": "
         "\"\xc0\xaf\"}]}",
         400, NULL},
        /* token ids inside the vocabulary (--vocab-size, 2^32 by default) */
        {"/v1/completions", "{\"prompt\": [1, 4294967296]}", 400,
         "token id 4294967296 at prompt[1] is outside the vocabulary "
         "(--vocab-size "
         "4294967296)"},
        {"/v1/completions", "{\"prompt\": [[1], [2, 3, 4294967297]]}", 400,
         "token id 4294967297 at prompt[1][2] is outside the vocabulary "
         "(--vocab-size "
         "4294967296)"},
        {"/v1/completions", "{\"prompt\": [4294967295], \"max_tokens\": 1}",
         200, NULL},
        {"/kvo/probe", "{\"token_ids\": [5, 18446744073709551615]}", 400,
         "token id 18446744073709551615 at token_ids[1] is outside the "
         "vocabulary "
         "(--vocab-size 4294967296)"},
        {"/v1/completions", "{\"prompt\": [1], \"stream\": 1}", 400,
         "stream must be true or false"},
        {"/v1/completions", "{\"prompt\": [1], \"stream_options\": []}", 400,
         "stream_options must be an object"},
        {"/reset_prefix_cache", "x", 400,
         "cannot read the body as JSON (byte 0: expected a JSON value)"},
        {"/reset_prefix_cache", "{} {}", 400, NULL},
        {"/v1/completions", "{\"max_tokens\": 3}", 400, "prompt is required"},
        {"/v1/completions", "{\"prompt\": [1, -2]}", 400,
         "token ids must be integers >= 0 (prompt[1]: expected an integer >= "
         "0)"},
        {"/v1/completions", "{\"prompt\": [1, \"a\"]}", 400, NULL},
        {"/v1/completions", "{\"prompt\": []}", 400,
         "prompt must be a string, a token list or a list of them"},
        {"/v1/completions", "{\"prompt\": [[1], []]}", 400,
         "a prompt has no tokens"},
        {"/v1/completions", "{\"prompt\": [[1], 5]}", 400,
         "prompt list items must be strings or token lists"},
        {"/v1/completions", "{\"prompt\": [1], \"max_tokens\": 0}", 400,
         "max_tokens must be an integer >= 1"},
        {"/v1/completions", "{\"prompt\": [1], \"data_parallel_rank\": 2}", 400,
         "data_parallel_rank out of range"},
        {"/v1/completions", "{\"prompt\": [1], \"lora_name\": 5}", 400,
         "lora_name and cache_salt must be strings"},
        {"/v1/completions",
         "{\"prompt\": \"0123456789012345678901234567890123456\"}", 400,
         "the prompt has 37 tokens; this engine's limit (max_model_len) is 36"},
        {"/v1/completions", "{\"prompt\": [1,2,3], \"max_tokens\": 34}", 400,
         "this engine's maximum context length (max_model_len) is 36 tokens; "
         "the "
         "request asks for 3 prompt + 34 completion"},
        {"/v1/completions",
         "{\"trace\": {\"hash_ids\": [1], \"input_length\": 600}}", 400,
         "the prompt has 600 tokens; this engine's limit (max_model_len) is "
         "36"},
        {"/v1/completions",
         "{\"trace\": {\"hash_ids\": [1], \"input_length\": 6}}", 200, NULL},
        {"/v1/completions",
         "{\"trace\": {\"hash_ids\": [1, 2], \"input_length\": 6}}", 400,
         "trace: input_length must be within (512*(k-1), 512*k] for k "
         "hash_ids"},
        {"/v1/completions", "{\"trace\": 5}", 400,
         "trace must be {\"hash_ids\": [...], \"input_length\": n}"},
        {"/v1/chat/completions", "{\"messages\": \"hi\"}", 400,
         "messages is required"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": 5}]}", 400,
         "messages must be [{\"role\": str, \"content\": str|parts}]"},
        {"/kvo/probe", "{\"tokens\": [1]}", 400,
         "token_ids or trace is required"},
        {"/kvo/probe",
         "{\"trace\": {\"hash_ids\": [1], \"input_length\": 6000000}}", 400,
         "the prompt has 6000000 tokens; probes take at most 4194304"},
        {"/kvo/probe", "{\"token_ids\": [1], \"warm\": \"yes\"}", 400,
         "warm must be true or false"},
        {"/no/such/path", NULL, 404, "no route for GET /no/such/path"},
        {"/v1/completions", NULL, 404, NULL}, /* GET */
    };
    int64_t errors = 0;
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        long status;
        json_object *j = call(&m, cases[i].path, cases[i].body, &status);
        ck_assert_msg(status == cases[i].status, "case %zu: %ld", i, status);
        ck_assert_msg(j && json_object_is_type(j, json_type_object), "case %zu",
                      i);
        if (status != 200) {
            errors++;
            ck_assert_str_eq(str(j, "object"), "error");
            ck_assert(strlen(str(j, "message")) > 0);
            ck_assert_int_eq(num(j, "code"), cases[i].status);
            if (cases[i].message)
                ck_assert_str_eq(str(j, "message"), cases[i].message);
        }
        json_object_put(j);
    }
    /* Nothing after a NUL byte is ignored: a body is all its bytes. */
    static const char nul[] = "{\"prompt\": [1,2,3]}\0garbage";
    long status;
    json_object *j =
        call_n(&m, "/v1/completions", nul, sizeof(nul) - 1, &status);
    ck_assert_int_eq(status, 400);
    ck_assert_str_eq(str(j, "message"),
                     "cannot read the body as JSON (byte 19: trailing "
                     "characters after the JSON value)");
    json_object_put(j);
    /* A max_tokens beyond the context is refused naming the limit. */
    j = call(&m, "/v1/completions",
             "{\"prompt\": [1], \"max_tokens\": 99999999999}", &status);
    ck_assert_int_eq(status, 400);
    ck_assert_msg(strstr(str(j, "message"), "max_model_len) is 36"), "%s",
                  str(j, "message"));
    json_object_put(j);
    /* Still serving. */
    json_object_put(
        ok(&m, "/v1/completions", "{\"prompt\": [1,2,3], \"max_tokens\": 33}"));
    /* The process's counters: every error answer, and base's HTTP server
     * stats (one keep-alive connection, nothing refused or timed out). */
    j = ok(&m, "/kvo/state", NULL);
    ck_assert_int_eq(num(j, "counters.http_errors"), errors + 2);
    ck_assert_int_gt(num(j, "counters.http_requests"),
                     (int64_t)KVO_ARRAY_LEN(cases) + 3);
    ck_assert_int_ge(num(j, "counters.http_conns"), 1);
    ck_assert_int_eq(num(j, "counters.http_head_timeouts"), 0);
    ck_assert_int_eq(num(j, "counters.http_body_timeouts"), 0);
    ck_assert_int_eq(num(j, "counters.http_busy_refused"), 0);
    json_object_put(j);
    int fd =
        mt_raw_post(m.port, "/reset_prefix_cache", "Connection: close\r\n", "");
    char buf[256];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
    int64_t conns = 0;
    j = ok(&m, "/kvo/state", NULL);
    conns = num(j, "counters.http_conns");
    json_object_put(j);
    j = ok(&m, "/kvo/state", NULL); /* the same keep-alive connection */
    ck_assert_int_eq(num(j, "counters.http_conns"), conns);
    json_object_put(j);
    ck_assert_int_ge(conns, 2);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* --vocab-size bounds the token ids a request may carry (prompts and
 * probes), naming itself in the refusal; below the trace vocabulary it is
 * a usage error. */
START_TEST(vocab_size_bounds_token_ids_and_not_below_the_trace_vocabulary) {
    mocker m;
    mocker_start(&m, MT_ARGS("--vocab-size", "50000"));
    json_object *j = ok(&m, "/kvo/state", NULL);
    ck_assert_int_eq(num(j, "worker.vocab_size"), 50000);
    json_object_put(j);
    json_object_put(ok(&m, "/v1/completions",
                       "{\"prompt\": [49999, 3], \"max_tokens\": 1}"));
    json_object_put(ok(&m, "/kvo/probe", "{\"token_ids\": [49999, 3]}"));
    long status;
    j = call(&m, "/v1/completions", "{\"prompt\": [[1], [7, 50000]]}", &status);
    ck_assert_int_eq(status, 400);
    ck_assert_str_eq(str(j, "message"),
                     "token id 50000 at prompt[1][1] is outside the "
                     "vocabulary (--vocab-size 50000)");
    json_object_put(j);
    j = call(&m, "/kvo/probe", "{\"token_ids\": [50000]}", &status);
    ck_assert_int_eq(status, 400);
    ck_assert_str_eq(str(j, "message"),
                     "token id 50000 at token_ids[0] is outside the "
                     "vocabulary (--vocab-size 50000)");
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
    kt_proc p;
    const char *args[] = {"--port", "0", "--vocab-size", "31999", NULL};
    kt_proc_start(&p, "kvo-mocker", args);
    for (int i = 0; i < 500 && kvo_proc_alive(&p.proc); i++) usleep(10000);
    ck_assert(!kvo_proc_alive(&p.proc));
    ck_assert_int_eq(p.proc.exit_status, 2);
    kt_guard_release(&p.guard);
}
END_TEST

START_TEST(roles_prefill_returns_transfer_params_decode_advertises_no_source) {
    mocker m;
    mocker_start(&m, MT_ARGS("--role", "prefill", "--block-size", "4"));
    json_object *j =
        ok(&m, "/v1/completions",
           "{\"prompt\": [1,2,3,4,5,6,7,8,9], \"max_tokens\": 50}");
    ck_assert_int_eq(num(j, "usage.completion_tokens"), 1);
    ck_assert(
        json_object_get_boolean(at(j, "kv_transfer_params.do_remote_prefill")));
    ck_assert_int_eq((int64_t)json_object_array_length(
                         at(j, "kv_transfer_params.remote_block_ids")),
                     3);
    json_object_put(j);
    j = ok(&m, "/kvo/event_sources", NULL);
    ck_assert_int_eq((int64_t)json_object_array_length(j), 1);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);

    mocker_start(
        &m, MT_ARGS("--role", "decode", "--kv-transfer-ms-per-block", "1"));
    j = ok(&m, "/kvo/event_sources", NULL);
    ck_assert_int_eq((int64_t)json_object_array_length(j), 0);
    json_object_put(j);
    j = ok(&m, "/v1/completions",
           "{\"prompt\": [1,2,3,4,5,6,7,8,9], \"max_tokens\": 3, "
           "\"kv_transfer_params\": {\"do_remote_prefill\": true}}");
    ck_assert_int_eq(num(j, "usage.completion_tokens"), 3);
    ck_assert_int_eq(json_object_get_type(at(j, "kvo.last_seq")),
                     json_type_null);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);

    mocker_start(&m, MT_ARGS("--no-enable-prefix-caching"));
    j = ok(&m, "/kvo/event_sources", NULL);
    ck_assert_int_eq((int64_t)json_object_array_length(j), 0);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

START_TEST(a_taken_event_port_serves_without_a_source_unless_required) {
    /* Hold a port with a bound PUB socket. */
    void *ctx = zmq_ctx_new();
    void *hold = zmq_socket(ctx, ZMQ_PUB);
    int linger = 0;
    zmq_setsockopt(hold, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_bind(hold, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t n = sizeof(ep);
    zmq_getsockopt(hold, ZMQ_LAST_ENDPOINT, ep, &n);
    const char *taken = strrchr(ep, ':') + 1;
    mocker m;
    mocker_start(&m, MT_ARGS("--zmq-port", taken));
    json_object *j = ok(&m, "/kvo/event_sources", NULL);
    ck_assert_int_eq((int64_t)json_object_array_length(j), 0);
    json_object_put(j);
    json_object_put(
        ok(&m, "/v1/completions", "{\"prompt\": [1,2,3], \"max_tokens\": 2}"));
    ck_assert_int_eq(mocker_stop(&m), 0);
    /* --require-events: a setup error, exit 2. */
    kt_proc p;
    uint16_t port;
    kvo_free_port(&port);
    char ps[16];
    snprintf(ps, sizeof(ps), "%u", port);
    const char *args[] = {"--port",           ps,  "--zmq-port", taken,
                          "--require-events", NULL};
    kt_proc_start(&p, "kvo-mocker", args);
    for (int i = 0; i < 500 && kvo_proc_alive(&p.proc); i++) usleep(10000);
    ck_assert(!kvo_proc_alive(&p.proc));
    ck_assert_int_eq(p.proc.exit_status, 2);
    kt_guard_release(&p.guard);
    zmq_close(hold);
    zmq_ctx_term(ctx);
}
END_TEST

/* kvo-mocker --trace on the first 150 requests, twice: the summary, and two
 * captures whose every batch is identical (timestamps are model time with
 * --speedup 0), numbered 0.. per rank, decodable, stamped with its rank. */
static void run_trace(const char *dir, const char *trace, const char *cap,
                      char *summary, size_t sz) {
    char *exe = kt_bin_path("kvo-mocker");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s --trace %s --dp-size 2 --seed 3 --record %s --zmq-port 0 "
             "--replay-port 0 --summary-json --log-level warn 2>%s/log",
             exe, trace, cap, dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(summary, 1, sz - 1, p);
    summary[n] = '\0';
    ck_assert_msg(pclose(p) == 0, "kvo-mocker --trace failed: %s", summary);
    kvo_free(exe);
}

START_TEST(trace_mode_is_deterministic_and_records_every_batch) {
    char *dir = kt_tmpdir("tracemode");
    char trace[600], cap1[600], cap2[600];
    snprintf(trace, sizeof(trace), "%s/t.jsonl", dir);
    snprintf(cap1, sizeof(cap1), "%s/1.kvocap", dir);
    snprintf(cap2, sizeof(cap2), "%s/2.kvocap", dir);
    char *src = kt_src_path("traces/mooncake_conversation_1000.jsonl");
    FILE *in = fopen(src, "r"), *out = fopen(trace, "w");
    char line[65536];
    for (int i = 0; i < 150 && fgets(line, sizeof(line), in); i++)
        fputs(line, out);
    fputs("this line is not JSON\n", out);
    fclose(in);
    fclose(out);
    kvo_free(src);
    char s1[4096], s2[4096];
    run_trace(dir, trace, cap1, s1, sizeof(s1));
    run_trace(dir, trace, cap2, s2, sizeof(s2));
    json_object *j = json_tokener_parse(s1);
    ck_assert_msg(j != NULL, "summary is not JSON: %s", s1);
    ck_assert_int_eq(num(j, "requests"), 150);
    ck_assert_int_eq(num(j, "finished"), 150);
    ck_assert_int_eq(num(j, "malformed"), 1);
    ck_assert_int_eq(num(j, "dp_size"), 2);
    int64_t batches = num(j, "published_batches");
    ck_assert_int_gt(batches, 0);
    ck_assert_int_gt(num(j, "blocks_stored"), 0);
    json_object_put(j);
    wire_cap_reader *r1, *r2;
    ck_assert_int_eq(wire_cap_open(&r1, cap1, NULL), KVO_OK);
    ck_assert_int_eq(wire_cap_open(&r2, cap2, NULL), KVO_OK);
    wire_cap_record a, b;
    wire_batch wb;
    wire_batch_init(&wb);
    uint64_t next[2] = {0, 0};
    int64_t n = 0;
    for (;;) {
        kvo_status sa = wire_cap_next(r1, &a, NULL),
                   sb = wire_cap_next(r2, &b, NULL);
        ck_assert_int_eq(sa, sb);
        if (sa == KVO_EOF) break;
        ck_assert_int_eq(sa, KVO_OK);
        ck_assert_uint_eq(a.n_frames, 3);
        for (int f = 0; f < 3; f++) {
            ck_assert_uint_eq(a.frames[f].len, b.frames[f].len);
            ck_assert(memcmp(a.frames[f].data, b.frames[f].data,
                             a.frames[f].len) == 0);
        }
        ck_assert_int_eq(wire_batch_decode(a.frames[2].data, a.frames[2].len,
                                           NULL, &wb, NULL),
                         KVO_OK);
        ck_assert(wb.dp_rank.set && wb.dp_rank.v >= 0 && wb.dp_rank.v < 2);
        uint64_t seq = mt_seq(a.frames[1].data, a.frames[1].len);
        ck_assert_uint_eq(seq, next[wb.dp_rank.v]++);
        n++;
    }
    ck_assert_int_eq(n, batches);
    wire_batch_fini(&wb);
    wire_cap_free(r1);
    wire_cap_free(r2);
    kvo_free(dir);
}
END_TEST

/* /kvo/probe stops at the first block no rank holds; its answer must stay
 * exactly the engine's: for a stream of trace prompts sharing prefixes (and
 * evicting: a small cache), on two ranks, the probe of each prompt -- in the
 * trace form (memo-backed, tokens made block by block) and in the token form
 * (plain hashing) -- equals the cached tokens the engine then reports for
 * it on the rank it goes to, and the other rank's probe equals what that
 * rank reports when the same prompt goes there next. */
static void probe_bodies(const uint64_t *ids, uint32_t k, uint32_t n,
                         const char *extra, char *trace, size_t tsz,
                         char **tokens) {
    size_t len = (size_t)snprintf(trace, tsz, "{\"trace\": {\"hash_ids\": [");
    for (uint32_t i = 0; i < k; i++)
        len += (size_t)snprintf(trace + len, tsz - len, "%s%llu", i ? "," : "",
                                (unsigned long long)ids[i]);
    snprintf(trace + len, tsz - len, "], \"input_length\": %u}%s}", n, extra);
    uint64_t *tok = kvo_malloc(n * sizeof(uint64_t));
    ck_assert_ptr_nonnull(tok);
    mock_trace_tokens(ids, k, n, tok);
    size_t cap = (size_t)n * 8 + 64 + strlen(extra);
    char *b = kvo_malloc(cap);
    ck_assert_ptr_nonnull(b);
    len = (size_t)snprintf(b, cap, "{\"token_ids\": [");
    for (uint32_t i = 0; i < n; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s%llu", i ? "," : "",
                                (unsigned long long)tok[i]);
    snprintf(b + len, cap - len, "]%s}", extra);
    kvo_free(tok);
    *tokens = b;
}

static int64_t probe_rank(mocker *m, const char *body, int rank) {
    json_object *j = ok(m, "/kvo/probe", body);
    char path[32];
    snprintf(path, sizeof(path), "ranks.%d.hit_blocks", rank);
    int64_t h = num(j, path);
    json_object_put(j);
    return h;
}

START_TEST(probe_stops_at_the_first_miss_and_equals_the_engine_hit) {
    mocker m;
    mocker_start(&m, MT_ARGS("--dp-size", "2", "--num-gpu-blocks", "400",
                             "--seed", "5"));
    uint64_t rng = 0x1234;
    uint64_t stats[3] = {0, 0, 0}; /* zero hits, partial, full */
    char trace[2048];
    for (int i = 0; i < 120; i++) {
        /* 1-3 trace blocks from a small id space: prefixes shared often */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t k = 1 + (uint32_t)(rng >> 33) % 3;
        uint64_t ids[3];
        for (uint32_t b = 0; b < k; b++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ids[b] = b == 0 ? (rng >> 40) % 4 : 10 * b + (rng >> 40) % 3;
        }
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t n = 512 * (k - 1) + 1 + (uint32_t)(rng >> 33) % 512;
        const char *lora = i % 7 == 3 ? ", \"lora_name\": \"l1\"" : "";
        char *tokens;
        probe_bodies(ids, k, n, lora, trace, sizeof(trace), &tokens);
        int rank = i % 2;
        int64_t pt[2], pk[2];
        /* kvo-check's compact shape when there is no LoRA */
        char compact[2048];
        size_t cl = (size_t)snprintf(compact, sizeof(compact),
                                     "{\"trace\":{\"hash_ids\":[");
        for (uint32_t b = 0; b < k; b++)
            cl += (size_t)snprintf(compact + cl, sizeof(compact) - cl, "%s%llu",
                                   b ? "," : "", (unsigned long long)ids[b]);
        snprintf(compact + cl, sizeof(compact) - cl, "],\"input_length\":%u}}",
                 n);
        for (int r = 0; r < 2; r++) {
            pt[r] = probe_rank(&m, trace, r);
            pk[r] = probe_rank(&m, tokens, r);
            ck_assert_msg(pt[r] == pk[r],
                          "prompt %d rank %d: trace form %lld, token form %lld",
                          i, r, (long long)pt[r], (long long)pk[r]);
            if (!*lora) {
                int64_t pc = probe_rank(&m, compact, r);
                ck_assert_msg(pc == pt[r],
                              "prompt %d rank %d: compact %lld, spaced %lld", i,
                              r, (long long)pc, (long long)pt[r]);
            }
        }
        char body[2400];
        snprintf(body, sizeof(body),
                 "%.*s, \"max_tokens\": %u, \"data_parallel_rank\": %d}",
                 (int)strlen(trace) - 1, trace, 1 + (unsigned)(rng >> 50) % 40,
                 rank);
        json_object *j = ok(&m, "/v1/completions", body);
        int64_t cached = num(j, "usage.prompt_tokens_details.cached_tokens");
        json_object_put(j);
        ck_assert_msg(cached == pt[rank] * 16,
                      "prompt %d: probe %lld blocks, engine %lld tokens", i,
                      (long long)pt[rank], (long long)cached);
        /* the other rank, unchanged by that request: its probe is its truth */
        int other = 1 - rank;
        snprintf(body, sizeof(body),
                 "%.*s, \"max_tokens\": 1, \"data_parallel_rank\": %d}",
                 (int)strlen(trace) - 1, trace, other);
        j = ok(&m, "/v1/completions", body);
        cached = num(j, "usage.prompt_tokens_details.cached_tokens");
        json_object_put(j);
        ck_assert_msg(cached == pt[other] * 16,
                      "prompt %d rank %d: probe %lld blocks, engine "
                      "%lld tokens",
                      i, other, (long long)pt[other], (long long)cached);
        uint32_t cap = (n - 1) / 16;
        stats[pt[rank] == 0 ? 0 : (uint32_t)pt[rank] == cap ? 2 : 1]++;
        kvo_free(tokens);
    }
    /* the workload exercised every case */
    ck_assert_msg(stats[0] && stats[1] && stats[2],
                  "zero %llu, partial %llu, full %llu",
                  (unsigned long long)stats[0], (unsigned long long)stats[1],
                  (unsigned long long)stats[2]);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* One reader for every probe body: kvo-check's compact shape and the same
 * body with a space get the same status, and the same answer when it is
 * 200 (a fast path for the compact shape once answered differently). */
START_TEST(a_probe_answers_alike_with_or_without_whitespace) {
    mocker m;
    mocker_start(&m, MT_ARGS("--dp-size", "2"));
    json_object_put(
        ok(&m, "/v1/completions",
           "{\"trace\": {\"hash_ids\": [11, 12], \"input_length\": 600}, "
           "\"max_tokens\": 1, \"data_parallel_rank\": 1}"));
    static const struct {
        const char *body;
        long status;
    } cases[] = {
        {"{\"trace\":{\"hash_ids\":[11,12],\"input_length\":600}}", 200},
        {"{\"trace\":{\"hash_ids\":[11,12],\"input_length\":1024}}", 200},
        {"{\"trace\":{\"hash_ids\":[11,13],\"input_length\":513}}", 200},
        {"{\"trace\":{\"hash_ids\":[11],\"input_length\":1}}", 200},
        {"{\"trace\":{\"hash_ids\":[0],\"input_length\":16}}", 200},
        {"{\"trace\":{\"hash_ids\":[18446744073709551615],\"input_length\":17}"
         "}",
         200},
        {"{\"trace\":{\"hash_ids\":[11,12],\"input_length\":600}}  \n", 200},
        {"{\"trace\":{\"hash_ids\":[11],\"input_length\":5},\"lora_name\":"
         "\"a\"}",
         200},
        {"{\"trace\":{\"hash_ids\":[11,12],\"input_length\":600},\"warm\":"
         "true}",
         200},
        {"{\"trace\":{\"hash_ids\":[11,12],\"input_length\":1025}}", 400},
        {"{\"trace\":{\"hash_ids\":[11,12],\"input_length\":512}}", 400},
        {"{\"trace\":{\"hash_ids\":[11,12],\"input_length\":0}}", 400},
        {"{\"trace\":{\"hash_ids\":[],\"input_length\":5}}", 400},
        {"{\"trace\":{\"hash_ids\":[011],\"input_length\":5}}", 400},
        {"{\"trace\":{\"hash_ids\":[-11],\"input_length\":5}}", 400},
        {"{\"trace\":{\"hash_ids\":[18446744073709551616],\"input_length\":5}}",
         400},
        {"{\"trace\":{\"hash_ids\":[11],\"input_length\":5}} x", 400},
        {"{\"trace\":{\"hash_ids\":[11],\"input_length\":5.0}}", 400},
        {"{\"trace\":{\"hash_ids\":[11],\"input_length\":99999999}}", 400},
        {"{\"trace\":{\"hash_ids\":[11,],\"input_length\":5}}", 400},
        {"{\"trace\":{\"hash_ids\":[11],\"input_length\":5},\"warm\":1}", 400},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        /* the same request with one space */
        char spaced[512];
        snprintf(spaced, sizeof(spaced), "{ %s", cases[i].body + 1);
        long sa, sb;
        json_object *a = call(&m, "/kvo/probe", cases[i].body, &sa);
        char ta[1024];
        snprintf(ta, sizeof(ta), "%s",
                 a ? json_object_to_json_string(a) : "null");
        json_object *b = call(&m, "/kvo/probe", spaced, &sb);
        const char *tb = b ? json_object_to_json_string(b) : "null";
        ck_assert_msg(sa == cases[i].status && sb == sa,
                      "%s -> %ld %s\n%s -> %ld %s", cases[i].body, sa, ta,
                      spaced, sb, tb);
        ck_assert_msg(a && b, "%s: an answer that is not JSON", cases[i].body);
        if (sa == 200)
            ck_assert_msg(strcmp(ta, tb) == 0, "%s -> %s\n%s -> %s",
                          cases[i].body, ta, spaced, tb);
        else
            ck_assert_str_eq(str(b, "object"), "error");
        json_object_put(a);
        json_object_put(b);
    }
    json_object *j = ok(&m, "/kvo/probe", cases[0].body);
    ck_assert_int_eq(num(j, "ranks.1.hit_blocks"), 37); /* (600-1)//16 */
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 0);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* Every batch rank 0 published so far, from its replay socket (seq 0 on),
 * decoded; the number of batches. */
static uint32_t replay_all(mocker *m, wire_batch *out, uint32_t max) {
    json_object *src = ok(m, "/kvo/event_sources", NULL);
    void *ctx = zmq_ctx_new();
    void *d =
        mt_zsock(ctx, ZMQ_DEALER, str(src, "0.replay_endpoint"), 10000, 0);
    json_object_put(src);
    mt_replay_request(d, 0);
    uint32_t n = 0;
    for (;;) {
        uint8_t *fr[4];
        size_t len[4];
        int k = mt_recv_frames(d, fr, len, 4);
        ck_assert_int_eq(k, 4); /* "", topic, seq, payload */
        bool end = len[3] == 0;
        if (!end) {
            ck_assert_uint_lt(n, max);
            wire_batch_init(&out[n]);
            ck_assert_int_eq(
                wire_batch_decode(fr[3], len[3], NULL, &out[n], NULL), KVO_OK);
            n++;
        }
        for (int i = 0; i < 4; i++) kvo_free(fr[i]);
        if (end) break;
    }
    zmq_close(d);
    zmq_ctx_term(ctx);
    return n;
}

/* "warm" on a probe only moves hashing earlier: two engines fed the same
 * prompts, one with every probe warmed, answer the same cached tokens and
 * publish the same events (hashes, parents, tokens), batch by batch. */
START_TEST(a_warmed_probe_changes_nothing_but_when_the_hashing_happens) {
    mocker a, b;
    mocker_start(&a, MT_ARGS("--num-gpu-blocks", "300", "--seed", "9"));
    mocker_start(&b, MT_ARGS("--num-gpu-blocks", "300", "--seed", "9"));
    uint64_t rng = 77;
    for (int i = 0; i < 40; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t k = 1 + (uint32_t)(rng >> 33) % 3;
        char ids[96] = "";
        size_t il = 0;
        for (uint32_t t = 0; t < k; t++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            il += (size_t)snprintf(
                ids + il, sizeof(ids) - il, "%s%llu", t ? "," : "",
                (unsigned long long)(t == 0 ? (rng >> 40) % 3
                                            : 10 * t + (rng >> 40) % 4));
        }
        uint32_t n = 512 * (k - 1) + 1 + (uint32_t)(rng >> 35) % 512;
        char probe[256], warm[256], body[320];
        snprintf(probe, sizeof(probe),
                 "{\"trace\":{\"hash_ids\":[%s],\"input_length\":%u}}", ids, n);
        snprintf(
            warm, sizeof(warm),
            "{\"trace\":{\"hash_ids\":[%s],\"input_length\":%u},\"warm\":true}",
            ids, n);
        snprintf(body, sizeof(body),
                 "{\"trace\":{\"hash_ids\":[%s],\"input_length\":%u},\"max_"
                 "tokens\":%u}",
                 ids, n, 1 + (unsigned)(rng >> 52) % 40);
        json_object *pa = ok(&a, "/kvo/probe", warm),
                    *pb = ok(&b, "/kvo/probe", probe);
        ck_assert_int_eq(num(pa, "ranks.0.hit_blocks"),
                         num(pb, "ranks.0.hit_blocks"));
        json_object_put(pa);
        json_object_put(pb);
        json_object *ca = ok(&a, "/v1/completions", body),
                    *cb = ok(&b, "/v1/completions", body);
        ck_assert_int_eq(num(ca, "usage.prompt_tokens_details.cached_tokens"),
                         num(cb, "usage.prompt_tokens_details.cached_tokens"));
        ck_assert_int_eq(num(ca, "kvo.last_seq"), num(cb, "kvo.last_seq"));
        json_object_put(ca);
        json_object_put(cb);
    }
    static wire_batch ba[4096], bb[4096];
    uint32_t na = replay_all(&a, ba, 4096), nb = replay_all(&b, bb, 4096);
    ck_assert_uint_eq(na, nb);
    ck_assert_uint_gt(na, 40);
    for (uint32_t i = 0; i < na; i++) {
        ck_assert_uint_eq(ba[i].n_events, bb[i].n_events);
        for (uint32_t e = 0; e < ba[i].n_events; e++) {
            const wire_event *x = &ba[i].events[e], *y = &bb[i].events[e];
            ck_assert_int_eq(x->type, y->type);
            ck_assert_uint_eq(x->n_hashes, y->n_hashes);
            for (uint32_t h = 0; h < x->n_hashes; h++)
                ck_assert(x->hashes[h].key == y->hashes[h].key);
            ck_assert(x->parent.key == y->parent.key &&
                      x->parent.kind == y->parent.kind);
            ck_assert_uint_eq(x->n_tokens, y->n_tokens);
            if (x->n_tokens)
                ck_assert(memcmp(x->token_ids, y->token_ids,
                                 x->n_tokens * sizeof(uint64_t)) == 0);
        }
        wire_batch_fini(&ba[i]);
        wire_batch_fini(&bb[i]);
    }
    ck_assert_int_eq(mocker_stop(&a), 0);
    ck_assert_int_eq(mocker_stop(&b), 0);
}
END_TEST

/* The process's peak resident memory (VmHWM), in bytes. */
static uint64_t peak_rss(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    uint64_t kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %" SCNu64 " kB", &kb) == 1) break;
    fclose(f);
    ck_assert_uint_gt(kb, 0);
    return kb << 10;
}

/* A 50 MB body of 25M one-digit token ids cost one heap object per token
 * before its 400 (1.8 GB); read in place by the strict reader it costs a
 * bounded multiple of its size (the reader's budget is 16 bytes per byte;
 * the server holds the body once more). Under AddressSanitizer freed
 * blocks wait in its quarantine (256 MB) and nothing grows in place, so
 * the bound there is looser (the json-c reader's peak was far above
 * either). */
#if defined(__SANITIZE_ADDRESS__) /* gcc */
#define PEAK_PER_BODY_BYTE 24
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang */
#define PEAK_PER_BODY_BYTE 24
#endif
#endif
#ifndef PEAK_PER_BODY_BYTE
#define PEAK_PER_BODY_BYTE 17
#endif
START_TEST(a_50_mb_token_array_costs_a_bounded_multiple_of_its_size) {
    mocker m;
    mocker_start(&m, NULL);
    /* a sanitizer build on a busy machine reads 50 MB slowly: no deadline
     * but the suite's */
    kvo_http_client_free(m.c);
    ck_assert_int_eq(kvo_http_client_new(&m.c, 0), KVO_OK);
    size_t len = (50u << 20) - 1; /* "[7,7,...,7]" */
    char *body = kvo_malloc(len);
    ck_assert_ptr_nonnull(body);
    body[0] = '[';
    for (size_t i = 1; i < len; i += 2) {
        body[i] = '7';
        body[i + 1] = ',';
    }
    body[len - 1] = ']';
    uint64_t before = peak_rss(m.p.proc.pid);
    long status;
    json_object *j = call_n(&m, "/v1/completions", body, len, &status);
    kvo_free(body);
    ck_assert_int_eq(status, 400);
    ck_assert_str_eq(str(j, "message"), "body must be a JSON object");
    json_object_put(j);
    uint64_t grew = peak_rss(m.p.proc.pid) - before;
    fprintf(stderr,
            "a %zu-byte token array: the mocker's peak grew by %" PRIu64
            " MB\n",
            len, grew >> 20);
    ck_assert_msg(grew < PEAK_PER_BODY_BYTE * (uint64_t)len,
                  "peak grew by %" PRIu64 " MB", grew >> 20);
    json_object_put(
        ok(&m, "/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 1}"));
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* The seq (index in batches) of the first batch storing hash key; -1. */
static int64_t seq_storing(const wire_batch *b, uint32_t n, uint64_t key) {
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t e = 0; e < b[i].n_events; e++) {
            const wire_event *ev = &b[i].events[e];
            if (ev->type != WIRE_EV_STORED) continue;
            for (uint32_t k = 0; k < ev->n_hashes; k++)
                if (ev->hashes[k].key == key) return i;
        }
    return -1;
}

/* Load, in real time: a long streamed request and a short one share
 * steps; the short one is answered while the long one still streams; each
 * answer's kvo block keeps its meaning (prefill_seq: the batch of its first
 * stores; last_seq: at or past every batch with its events), and the
 * regime counters show the overlap. */
START_TEST(concurrent_completions_share_steps_and_are_answered_as_they_finish) {
    mocker m;
    mocker_start(&m, MT_ARGS("--block-size", "4", "--speedup", "1"));
    /* A: 400 decode steps of >= 5 ms each (the timing model at low usage) */
    int fd = mt_raw_post(
        m.port, "/v1/completions", "Connection: close\r\n",
        "{\"prompt\": [1,2,3,4,5,6,7,8], \"max_tokens\": 400, "
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}}");
    kvo_buf a;
    kvo_buf_init(&a);
    char chunk[4096];
    ssize_t got;
    while ((a.len < 6 || !memmem(a.data, a.len, "data: ", 6)) &&
           (got = read(fd, chunk, sizeof(chunk))) > 0)
        kvo_buf_append(&a, chunk, (size_t)got);
    /* B, while A runs */
    json_object *b = ok(&m, "/v1/completions",
                        "{\"prompt\": [101,102,103,104,105,106,107,108,109], "
                        "\"max_tokens\": 2}");
    json_object *st = ok(&m, "/kvo/state", NULL);
    ck_assert_int_eq(num(st, "ranks.0.counters.requests_running"),
                     1); /* A, still */
    ck_assert_int_eq(num(st, "ranks.0.counters.requests_finished"), 1); /* B */
    ck_assert_int_ge(num(st, "ranks.0.counters.steps_multi"), 1);
    ck_assert_int_eq(num(st, "ranks.0.counters.max_running"), 2);
    ck_assert_int_eq(num(st, "ranks.0.counters.max_inflight"), 2);
    json_object_put(st);
    while ((got = read(fd, chunk, sizeof(chunk))) > 0)
        kvo_buf_append(&a, chunk, (size_t)got);
    close(fd);
    kvo_buf_cstr(&a);
    const char *u = strstr((const char *)a.data, "\"usage\"");
    ck_assert_msg(u != NULL, "no usage chunk: %.200s", (const char *)a.data);
    const char *line = u;
    while (line > (const char *)a.data && line[-1] != '\n') line--;
    ck_assert(strncmp(line, "data: ", 6) == 0);
    const char *eol = strchr(line, '\n');
    char *one = kvo_strndup(line + 6, (size_t)(eol - line - 6));
    json_object *au = json_tokener_parse(one);
    kvo_free(one);
    ck_assert_ptr_nonnull(au);
    ck_assert_int_eq(num(au, "usage.completion_tokens"), 400);
    static wire_batch batches[4096];
    uint32_t n = replay_all(&m, batches, 4096);
    mock_hasher *h;
    ck_assert_int_eq(mock_hasher_new(&h, WIRE_ALGO_SHA256, "0", 0), KVO_OK);
    uint64_t ta[4] = {1, 2, 3, 4}, tb[4] = {101, 102, 103, 104};
    mock_hash ha, hb;
    mock_hasher_blocks(h, ta, 4, 0, 1, NULL, NULL, NULL, NULL, &ha);
    mock_hasher_blocks(h, tb, 4, 0, 1, NULL, NULL, NULL, NULL, &hb);
    mock_hasher_free(h);
    int64_t sa = seq_storing(batches, n, ha.key),
            sb = seq_storing(batches, n, hb.key);
    ck_assert(sa == 0 && sb > sa);
    ck_assert_int_eq(num(au, "kvo.prefill_seq"), sa);
    ck_assert_int_eq(num(b, "kvo.prefill_seq"), sb);
    ck_assert_int_ge(num(b, "kvo.last_seq"), sb);
    /* A decoded on after B's answer: its stores went on past B's last_seq,
     * and A's answer came after every batch (nothing ran after it) */
    ck_assert_int_lt(num(b, "kvo.last_seq"), num(au, "kvo.last_seq"));
    ck_assert_int_eq(num(au, "kvo.last_seq"), (int64_t)n - 1);
    for (uint32_t i = 0; i < n; i++) wire_batch_fini(&batches[i]);
    json_object_put(au);
    json_object_put(b);
    kvo_buf_fini(&a);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

static uint64_t u64_at(json_object *o, const char *path) {
    json_object *v = at(o, path);
    ck_assert_msg(v && json_object_is_type(v, json_type_int),
                  "%s: not an integer", path);
    return json_object_get_uint64(v);
}

/* GET /kvo/blocks: the engine's own cached set (a --mutate'd publisher
 * corrupts only the events), sorted, paged, with the digest /kvo/state
 * shows; bad arguments get JSON errors. */
START_TEST(kvo_blocks_lists_the_engines_own_hashes_in_pages) {
    mocker m;
    mocker_start(&m, MT_ARGS("--block-size", "4", "--dp-size", "2", "--mutate",
                             "flip-stored-hash"));
    json_object_put(
        ok(&m, "/v1/completions",
           "{\"prompt\": [1,2,3,4,5,6,7,8,9,10,11,12,13], \"max_tokens\": 1, "
           "\"data_parallel_rank\": 1}"));
    mock_hasher *h;
    ck_assert_int_eq(mock_hasher_new(&h, WIRE_ALGO_SHA256, "0", 0), KVO_OK);
    uint64_t t[12];
    mt_iota(t, 12, 1);
    mock_hash hs[3];
    ck_assert_int_eq(
        mock_hasher_blocks(h, t, 4, 0, 3, NULL, NULL, NULL, NULL, hs), KVO_OK);
    mock_hasher_free(h);
    json_object *j = ok(&m, "/kvo/blocks?rank=1", NULL);
    ck_assert_int_eq(num(j, "rank"), 1);
    ck_assert_int_eq(num(j, "count"), 3);
    ck_assert_int_eq(json_object_get_type(at(j, "next")), json_type_null);
    json_object *blocks = at(j, "blocks");
    ck_assert_uint_eq(json_object_array_length(blocks), 3);
    uint64_t digest = 0, prev = 0;
    for (size_t i = 0; i < 3; i++) {
        char path[32];
        snprintf(path, sizeof(path), "blocks.%zu.0", i);
        uint64_t key = u64_at(j, path);
        ck_assert(i == 0 || key > prev);
        prev = key;
        int k = 0; /* the engine's hash, not the published (flipped) one */
        while (k < 3 && hs[k].key != key) k++;
        ck_assert_msg(k < 3, "%s: %llu is not an engine hash", path,
                      (unsigned long long)key);
        snprintf(path, sizeof(path), "blocks.%zu.1", i);
        if (k == 0) {
            ck_assert_int_eq(json_object_get_type(at(j, path)), json_type_null);
        } else {
            ck_assert(u64_at(j, path) == hs[k - 1].key);
        }
        digest += kvo_block_digest(key, k > 0, k > 0 ? hs[k - 1].key : 0);
    }
    ck_assert(u64_at(j, "digest") == digest);
    json_object *state = ok(&m, "/kvo/state", NULL);
    ck_assert(u64_at(state, "ranks.1.cached_digest") == digest);
    ck_assert_int_eq(num(state, "ranks.1.cached_distinct"), 3);
    ck_assert_int_eq(num(state, "ranks.0.cached_distinct"), 0);
    ck_assert(u64_at(state, "ranks.0.cached_digest") == 0);
    json_object_put(state);
    /* pages of one, each starting after the previous page's next */
    char path[96];
    snprintf(path, sizeof(path), "/kvo/blocks?rank=1&limit=1");
    for (size_t i = 0; i < 3; i++) {
        json_object *pg = ok(&m, path, NULL);
        ck_assert_int_eq(num(pg, "count"), 3);
        ck_assert_uint_eq(json_object_array_length(at(pg, "blocks")), 1);
        char want[32];
        snprintf(want, sizeof(want), "blocks.%zu.0", i);
        uint64_t key = u64_at(pg, "blocks.0.0");
        ck_assert(key == u64_at(j, want));
        if (i < 2) {
            ck_assert(u64_at(pg, "next") == key);
        } else {
            ck_assert_int_eq(json_object_get_type(at(pg, "next")),
                             json_type_null);
        }
        snprintf(path, sizeof(path), "/kvo/blocks?rank=1&limit=1&after=%llu",
                 (unsigned long long)key);
        json_object_put(pg);
    }
    json_object_put(j);
    j = ok(&m, "/kvo/blocks?rank=0", NULL);
    ck_assert_int_eq(num(j, "count"), 0);
    ck_assert_uint_eq(json_object_array_length(at(j, "blocks")), 0);
    json_object_put(j);
    static const char *const bad[] = {
        "/kvo/blocks",
        "/kvo/blocks?rank=2",
        "/kvo/blocks?rank=x",
        "/kvo/blocks?rank=0&limit=0",
        "/kvo/blocks?rank=0&limit=100001",
        "/kvo/blocks?rank=0&after=-1",
        "/kvo/blocks?rank=0&after=18446744073709551616",
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        long status;
        j = call(&m, bad[i], NULL, &status);
        ck_assert_msg(status == 400, "%s -> %ld", bad[i], status);
        ck_assert_msg(j != NULL, "%s: not JSON", bad[i]);
        ck_assert_str_eq(str(j, "object"), "error");
        json_object_put(j);
    }
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* "model" names a --lora-modules adapter (its blocks then hash under the
 * adapter: a probe with lora_name finds them, a base probe does not);
 * any other model is vLLM's 404; /v1/models lists the adapters. A prompt
 * with mm_items is cached under its items: the same tokens with another
 * identifier miss. */
START_TEST(model_names_an_adapter_and_mm_items_key_the_blocks) {
    mocker m;
    mocker_start(
        &m, MT_ARGS("--lora-modules", "alpha=/a,beta", "--block-size", "4"));
    json_object *j = ok(&m, "/v1/models", NULL);
    ck_assert_uint_eq(json_object_array_length(at(j, "data")), 3);
    ck_assert_str_eq(str(j, "data.2.id"), "beta");
    ck_assert_str_eq(str(j, "data.2.parent"), "kvo-mock");
    json_object_put(j);
    static const char tok[] = "[1,2,3,4,5,6,7,8,9]";
    char body[512];
    snprintf(body, sizeof(body),
             "{\"model\": \"beta\", \"prompt\": %s, \"max_tokens\": 1}", tok);
    json_object_put(ok(&m, "/v1/completions", body));
    snprintf(body, sizeof(body), "{\"token_ids\": %s, \"lora_name\": \"beta\"}",
             tok);
    ck_assert_int_eq(probe_rank(&m, body, 0), 2);
    snprintf(body, sizeof(body), "{\"token_ids\": %s}", tok);
    ck_assert_int_eq(probe_rank(&m, body, 0), 0);
    snprintf(body, sizeof(body),
             "{\"token_ids\": %s, \"lora_name\": \"alpha\"}", tok);
    ck_assert_int_eq(probe_rank(&m, body, 0), 0);
    /* the same adapter through model, again: a hit of both blocks */
    snprintf(body, sizeof(body),
             "{\"model\": \"beta\", \"prompt\": %s, \"max_tokens\": 1}", tok);
    j = ok(&m, "/v1/completions", body);
    ck_assert_int_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 8);
    json_object_put(j);
    long status;
    j = call(&m, "/v1/completions", "{\"model\": \"gamma\", \"prompt\": [1]}",
             &status);
    ck_assert_int_eq(status, 404);
    ck_assert_str_eq(str(j, "type"), "NotFoundError");
    ck_assert_str_eq(str(j, "message"), "The model `gamma` does not exist.");
    json_object_put(j);
    j = call(&m, "/v1/completions",
             "{\"model\": \"beta\", \"lora_name\": \"alpha\", \"prompt\": [1]}",
             &status);
    ck_assert_int_eq(status, 400);
    json_object_put(j);
    /* the base model by name is no adapter */
    snprintf(
        body, sizeof(body),
        "{\"model\": \"kvo-mock\", \"prompt\": %s, \"max_tokens\": 1, "
        "\"mm_items\": [{\"offset\": 1, \"length\": 6, \"hash\": \"img-1\"}]}",
        tok);
    json_object_put(ok(&m, "/v1/completions", body));
    snprintf(
        body, sizeof(body),
        "{\"token_ids\": %s, \"mm_items\": [{\"offset\": 1, \"length\": 6, "
        "\"hash\": \"img-1\"}]}",
        tok);
    ck_assert_int_eq(probe_rank(&m, body, 0), 2);
    snprintf(
        body, sizeof(body),
        "{\"token_ids\": %s, \"mm_items\": [{\"offset\": 1, \"length\": 6, "
        "\"hash\": \"img-2\"}]}",
        tok);
    ck_assert_int_eq(probe_rank(&m, body, 0), 0);
    snprintf(
        body, sizeof(body),
        "{\"token_ids\": %s, \"mm_items\": [{\"offset\": 2, \"length\": 5, "
        "\"hash\": \"img-1\"}]}",
        tok);
    ck_assert_int_eq(probe_rank(&m, body, 0), 0);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* With a CPU tier: a probe says per rank how many blocks each tier holds
 * (hit_blocks = what cached_tokens will be); /kvo/blocks?tier=cpu lists the
 * tier; /kvo/state counts it; the detail form (and /kvo/chain) gives the
 * chain to the first miss plus four blocks, with hashes, parents, copies,
 * tiers and router hashes; reset_external empties the tier. */
START_TEST(probe_tiers_detail_chain_blocks_and_state_see_the_cpu_tier) {
    mocker m;
    mocker_start(&m, MT_ARGS("--block-size", "4", "--num-gpu-blocks", "9",
                             "--cpu-offload-blocks", "16"));
    char body[1024];
    static const char a[] = "[1,2,3,4,5,6,7,8,9]";
    snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": 1}", a);
    json_object_put(ok(&m, "/v1/completions", body));
    /* a filler of six blocks, then another prompt: A's blocks go to the CPU */
    json_object_put(
        ok(&m, "/v1/completions",
           "{\"prompt\": [21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,"
           "37,38,39,40,41,42,43,44], \"max_tokens\": 1}"));
    json_object_put(
        ok(&m, "/v1/completions",
           "{\"prompt\": [51,52,53,54,55,56,57,58], \"max_tokens\": 1}"));
    snprintf(body, sizeof(body), "{\"token_ids\": %s, \"detail\": true}", a);
    json_object *j = ok(&m, "/kvo/probe", body);
    ck_assert_int_eq(num(j, "ranks.0.gpu"), 0);
    ck_assert_int_eq(num(j, "ranks.0.cpu"), 2);
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 2);
    json_object *chain = at(j, "ranks.0.chain");
    ck_assert_uint_eq(json_object_array_length(chain),
                      2); /* the prompt's blocks */
    ck_assert_int_eq(num(j, "ranks.0.chain.1.index"), 1);
    ck_assert(!json_object_get_boolean(at(j, "ranks.0.chain.0.cached")));
    ck_assert(json_object_get_boolean(at(j, "ranks.0.chain.0.cpu")));
    ck_assert_int_eq(num(j, "ranks.0.chain.0.copies"), 0);
    ck_assert_ptr_null(at(j, "ranks.0.chain.0.parent"));
    uint64_t h0 =
        (uint64_t)json_object_get_uint64(at(j, "ranks.0.chain.0.hash"));
    ck_assert(json_object_get_uint64(at(j, "ranks.0.chain.1.parent")) == h0);
    uint64_t t4[4] = {1, 2, 3, 4};
    ck_assert(json_object_get_uint64(at(j, "ranks.0.chain.0.tokens_hash")) ==
              wire_router_hash(t4, 4, WIRE_ROUTER_SEED));
    json_object_put(j);
    j = ok(&m, "/kvo/blocks?rank=0&tier=cpu", NULL);
    ck_assert_str_eq(str(j, "tier"), "cpu");
    ck_assert_int_eq(num(j, "count"), 2);
    bool found = false;
    for (size_t i = 0; i < 2; i++)
        found |= (uint64_t)json_object_get_uint64(json_object_array_get_idx(
                     json_object_array_get_idx(at(j, "blocks"), i), 0)) == h0;
    ck_assert(found);
    json_object_put(j);
    j = ok(&m, "/kvo/state", NULL);
    ck_assert_int_eq(num(j, "ranks.0.cpu_cached_distinct"), 2);
    ck_assert_int_eq(num(j, "ranks.0.counters.cpu_stored"), 2);
    ck_assert_int_eq(num(j, "worker.cpu_offload_blocks"), 16);
    json_object_put(j);
    /* loaded back: 8 cached tokens, and the GPU holds it again */
    snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": 1}", a);
    j = ok(&m, "/v1/completions", body);
    ck_assert_int_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 8);
    json_object_put(j);
    snprintf(body, sizeof(body), "{\"token_ids\": %s}", a);
    j = ok(&m, "/kvo/chain", body);
    ck_assert_int_eq(num(j, "ranks.0.gpu"), 2);
    ck_assert_int_eq(num(j, "ranks.0.chain.0.copies"), 1);
    json_object_put(j);
    long status;
    j = call(&m, "/kvo/blocks?rank=0&tier=disk", NULL, &status);
    ck_assert_int_eq(status, 400);
    json_object_put(j);
    json_object_put(ok(&m, "/reset_prefix_cache?reset_external=true", ""));
    j = ok(&m, "/kvo/blocks?rank=0&tier=cpu", NULL);
    ck_assert_int_eq(num(j, "count"), 0);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* Without a tier the detail form still lists each rank's chain: cached
 * blocks with their copies, then the first miss and up to four more. */
START_TEST(the_detail_form_lists_the_chain_past_the_first_miss) {
    mocker m;
    mocker_start(&m, MT_ARGS("--block-size", "4"));
    json_object_put(ok(&m, "/v1/completions",
                       "{\"prompt\": [1,2,3,4,5,6,7,8,9], \"max_tokens\": 1, "
                       "\"cache_salt\": \"s\"}"));
    static const char probe[] =
        "{\"token_ids\": "
        "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,"
        "23,24,25,26,27,28,29,30,31,32,33], \"cache_salt\": \"s\", \"detail\": "
        "true}";
    json_object *j = ok(&m, "/kvo/probe", probe);
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 2);
    ck_assert_ptr_null(at(j, "ranks.0.gpu")); /* no tier: today's fields */
    json_object *chain = at(j, "ranks.0.chain");
    ck_assert_uint_eq(json_object_array_length(chain), 7); /* 2 hits, miss, 4 */
    ck_assert(json_object_get_boolean(at(j, "ranks.0.chain.1.cached")));
    ck_assert(!json_object_get_boolean(at(j, "ranks.0.chain.2.cached")));
    ck_assert_ptr_null(at(j, "ranks.0.chain.2.cpu"));
    uint64_t t[4] = {1, 2, 3, 4};
    ck_assert(json_object_get_uint64(at(j, "ranks.0.chain.0.tokens_hash")) ==
              wire_router_hash(t, 4, wire_router_seed(NULL, 0, "s", 1)));
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

/* --kv-groups: the state lists each group's set, /kvo/blocks?group=G lists
 * it, a probe adds the full-attention run (full_blocks) beside the hit
 * every group agrees on. */
START_TEST(kv_groups_show_in_state_blocks_and_probe) {
    mocker m;
    mocker_start(&m,
                 MT_ARGS("--block-size", "4", "--kv-groups", "full,sliding:8"));
    static const char tok[] = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]";
    char body[256];
    snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": 1}", tok);
    json_object_put(ok(&m, "/v1/completions", body));
    json_object *j = ok(&m, "/kvo/state", NULL);
    ck_assert_int_eq(num(j, "worker.kv_groups"), 2);
    ck_assert_str_eq(str(j, "ranks.0.groups.1.kind"), "sliding_window");
    ck_assert_int_eq(num(j, "ranks.0.groups.1.sliding_window"), 8);
    ck_assert_int_eq(num(j, "ranks.0.groups.0.cached_distinct"), 4);
    ck_assert_int_eq(num(j, "ranks.0.groups.1.cached_distinct"), 4);
    ck_assert_int_eq(num(j, "ranks.0.cached_distinct"), 4);
    json_object_put(j);
    j = ok(&m, "/kvo/blocks?rank=0&group=1", NULL);
    ck_assert_int_eq(num(j, "group"), 1);
    ck_assert_int_eq(num(j, "count"), 4);
    json_object_put(j);
    snprintf(body, sizeof(body), "{\"token_ids\": %s}", tok);
    j = ok(&m, "/kvo/probe", body);
    ck_assert_int_eq(num(j, "ranks.0.hit_blocks"), 4);
    ck_assert_int_eq(num(j, "ranks.0.full_blocks"), 4);
    json_object_put(j);
    long status;
    j = call(&m, "/kvo/blocks?rank=0&group=2", NULL, &status);
    ck_assert_int_eq(status, 400);
    json_object_put(j);
    ck_assert_int_eq(mocker_stop(&m), 0);
}
END_TEST

Suite *suite_http(void) {
    const TTest *tests[] = {
        completions_report_cached_tokens_and_the_kvo_object,
        every_prompt_form_chat_and_token_ids,
        stream_sends_server_sent_events_then_done,
        models_health_and_vllm_metric_names,
        metrics_that_cannot_be_written_answer_500_with_a_json_error,
        event_sources_advertise_endpoints_that_carry_the_events_and_replay,
        reset_prefix_cache_fails_while_a_request_holds_blocks,
        bad_requests_get_vllm_style_errors,
        vocab_size_bounds_token_ids_and_not_below_the_trace_vocabulary,
        roles_prefill_returns_transfer_params_decode_advertises_no_source,
        a_taken_event_port_serves_without_a_source_unless_required,
        trace_mode_is_deterministic_and_records_every_batch,
        probe_stops_at_the_first_miss_and_equals_the_engine_hit,
        a_probe_answers_alike_with_or_without_whitespace,
        a_warmed_probe_changes_nothing_but_when_the_hashing_happens,
        kvo_blocks_lists_the_engines_own_hashes_in_pages,
        concurrent_completions_share_steps_and_are_answered_as_they_finish,
        a_50_mb_token_array_costs_a_bounded_multiple_of_its_size,
        model_names_an_adapter_and_mm_items_key_the_blocks,
        probe_tiers_detail_chain_blocks_and_state_see_the_cpu_tier,
        the_detail_form_lists_the_chain_past_the_first_miss,
        kv_groups_show_in_state_blocks_and_probe,
    };
    return mt_suite(suite_create("http"), 120, tests, KVO_ARRAY_LEN(tests));
}
