/* The request body parsers (mock_request.c) without sockets: what they read
 * and where it points, what they refuse, and the fuzz corpora of
 * fuzz_completions and fuzz_probe replayed. */
#include "mt.h"

#include <stdio.h>
#include <string.h>

#define KVO_FUZZ_REPLAY
#include "../fuzz/fuzz_completions.c"
#include "../fuzz/fuzz_probe.c"

Suite *suite_request(void);

static const mock_req_limits lim = {
    .max_len = 100, .vocab_size = 1000, .n_ranks = 2};

static kvo_status parse(mock_completion_req *c, const char *body, bool chat,
                        kvo_err *err) {
    return mock_completion_parse(c, body, strlen(body), chat, &lim, err);
}

/* A token prompt is read in place: its ids are the tree's packed integers,
 * and the arena holds only the prompt list, never a copy per token. */
START_TEST(a_token_prompt_is_read_in_place_without_per_token_copies) {
    size_t n = 90, cap = n * 8 + 64;
    char *body = kvo_malloc(cap);
    size_t len = (size_t)snprintf(body, cap, "{\"prompt\": [");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(body + len, cap - len, "%s%zu", i ? "," : "",
                                900 + i % 100);
    snprintf(body + len, cap - len, "], \"max_tokens\": 10}");
    mock_completion_req c;
    mock_completion_req_init(&c);
    kvo_err err;
    ck_assert_msg(parse(&c, body, false, &err) == KVO_OK, "%s", err.msg);
    ck_assert_uint_eq(c.n_prompts, 1);
    ck_assert_uint_eq(c.prompts[0].n, 90);
    const kvo_jv *arr = kvo_json_get(c.doc.root, "prompt");
    ck_assert(arr->packed);
    ck_assert_ptr_eq(c.prompts[0].tok, arr->v.ints);
    ck_assert_uint_le(c.arena.used_total, 64); /* the one mock_prompt */
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(c.prompts[0].tok[i], 900 + i % 100);
    mock_completion_req_fini(&c);
    kvo_free(body);
}
END_TEST

START_TEST(every_prompt_form_reads_as_the_engine_needs_it) {
    mock_completion_req c;
    mock_completion_req_init(&c);
    kvo_err err;
    ck_assert_int_eq(parse(&c, "{\"prompt\": \"ab\"}", false, &err), KVO_OK);
    ck_assert(c.n_prompts == 1 && c.prompts[0].n == 2 &&
              c.prompts[0].tok[1] == 'b');
    ck_assert_uint_eq(c.max_tokens, 16); /* OpenAI's default */
    ck_assert_int_eq(
        parse(&c,
              "{\"prompt\": [\"a\", [7, 8]], \"max_completion_tokens\": 3, "
              "\"lora_name\": \"\", \"cache_salt\": \"s\", \"stream\": null, "
              "\"data_parallel_rank\": 1}",
              false, &err),
        KVO_OK);
    ck_assert(c.n_prompts == 2 && c.prompts[1].n == 2 &&
              c.prompts[1].tok[0] == 7);
    ck_assert(c.max_tokens == 3 && !c.lora && c.salt &&
              strcmp(c.salt, "s") == 0);
    ck_assert(!c.stream && c.has_rank && c.rank == 1);
    ck_assert_int_eq(
        parse(&c,
              "{\"trace\": {\"hash_ids\": [4, 5], \"input_length\": 600}, "
              "\"max_tokens\": 1}",
              false, &err),
        KVO_ETOOBIG);
    ck_assert_str_eq(err.msg, "the prompt has 600 tokens; this engine's limit "
                              "(max_model_len) is 100");
    ck_assert_int_eq(
        parse(&c,
              "{\"trace\": {\"hash_ids\": [4], \"input_length\": 99}, "
              "\"max_tokens\": 1}",
              false, &err),
        KVO_OK);
    ck_assert(!c.prompts[0].tok && c.prompts[0].n_trace == 1 &&
              c.prompts[0].trace_ids[0] == 4);
    ck_assert_int_eq(
        parse(&c,
              "{\"messages\": [{\"role\": \"u\", \"content\": [{\"text\": "
              "\"x\"}, {\"image\": 1}]}, {\"role\": \"s\"}]}",
              true, &err),
        KVO_OK);
    static const char tmpl[] = "<|u|>\nx\n<|s|>\n\n<|assistant|>\n";
    ck_assert_uint_eq(c.prompts[0].n, sizeof(tmpl) - 1);
    for (uint32_t i = 0; i < c.prompts[0].n; i++)
        ck_assert_uint_eq(c.prompts[0].tok[i], (uint8_t)tmpl[i]);
    mock_completion_req_fini(&c);
}
END_TEST

/* Refusals name the limit or the place: the vocabulary (with where the id
 * sits), the context, the rank, strict JSON. */
START_TEST(refusals_say_which_limit_and_where) {
    static const struct {
        const char *body;
        bool chat;
        kvo_status st;
        const char *msg;
    } cases[] = {
        {"{\"prompt\": [1, 1000]}", false, KVO_EINVAL,
         "token id 1000 at prompt[1] is outside the vocabulary (--vocab-size "
         "1000)"},
        {"{\"prompt\": [[1], [2, 3, 4, 999, 1001]]}", false, KVO_EINVAL,
         "token id 1001 at prompt[1][4] is outside the vocabulary "
         "(--vocab-size 1000)"},
        {"{\"prompt\": [1], \"max_tokens\": 100}", false, KVO_ETOOBIG,
         "this engine's maximum context length (max_model_len) is 100 tokens; "
         "the "
         "request asks for 1 prompt + 100 completion"},
        {"{\"prompt\": [1], \"max_tokens\": 18446744073709551615}", false,
         KVO_ETOOBIG,
         "this engine's maximum context length (max_model_len) is 100 tokens; "
         "the "
         "request asks for 1 prompt + 18446744073709551615 completion"},
        {"{\"prompt\": [1], \"data_parallel_rank\": 2}", false, KVO_EINVAL,
         "data_parallel_rank out of range"},
        {"{\"prompt\": [1]}\n\n{}", false, KVO_EPROTO,
         "cannot read the body as JSON (byte 17: trailing characters after the "
         "JSON "
         "value)"},
        {"{\"prompt\": [1], \"kv_transfer_params\": true}", false, KVO_EPROTO,
         "kv_transfer_params must be an object"},
        {"{\"messages\": [{\"role\": \"u\", \"content\": 5}]}", true,
         KVO_EPROTO,
         "messages must be [{\"role\": str, \"content\": str|parts}]"},
        {"{\"messages\": [{\"role\": \"u\", \"content\": \"x\"}], "
         "\"max_tokens\": 90}",
         true, KVO_ETOOBIG, NULL},
    };
    mock_completion_req c;
    mock_completion_req_init(&c);
    for (size_t i = 0; i < KVO_ARRAY_LEN(cases); i++) {
        kvo_err err;
        kvo_status st = parse(&c, cases[i].body, cases[i].chat, &err);
        ck_assert_msg(st == cases[i].st, "case %zu: %s", i,
                      kvo_status_name(st));
        ck_assert_int_eq(err.status, st);
        if (cases[i].msg) ck_assert_str_eq(err.msg, cases[i].msg);
    }
    mock_completion_req_fini(&c);
    mock_probe_req p;
    mock_probe_req_init(&p);
    kvo_err err;
    static const char p1[] = "{\"token_ids\": [0, 1000]}";
    static const char p2[] = "{\"token_ids\": [1, 2], \"warm\": true}";
    ck_assert_int_eq(mock_probe_parse(&p, p1, sizeof(p1) - 1, &lim, &err),
                     KVO_EINVAL);
    ck_assert_str_eq(
        err.msg,
        "token id 1000 at token_ids[1] is outside the vocabulary (--vocab-size "
        "1000)");
    ck_assert_int_eq(mock_probe_parse(&p, p2, sizeof(p2) - 1, &lim, &err),
                     KVO_OK);
    ck_assert(p.warm && p.prompt.n == 2);
    mock_probe_req_fini(&p);
    ck_assert_int_eq(mock_reset_parse("", 0, NULL), KVO_OK);
    ck_assert_int_eq(mock_reset_parse(" \n", 2, NULL), KVO_OK);
    ck_assert_int_eq(mock_reset_parse("{}", 2, NULL), KVO_OK);
    ck_assert_int_eq(mock_reset_parse("[]", 2, NULL), KVO_EPROTO);
    ck_assert_int_eq(mock_reset_parse("{}x", 3, NULL), KVO_EPROTO);
}
END_TEST

/* Out of memory anywhere in a parse: ENOMEM, never a crash or a leak. */
START_TEST(out_of_memory_mid_parse_is_a_status) {
    static const char body[] = "{\"prompt\": [\"abc\", [1, 2], \"de\"], "
                               "\"lora_name\": \"l\", \"max_tokens\": 2}";
    static const char chat[] =
        "{\"messages\": [{\"role\": \"u\", \"content\": \"abc\"}]}";
    for (long k = 0; k < 12; k++) {
        mock_completion_req c;
        mock_completion_req_init(&c);
        kvo_alloc_fail_after(k);
        kvo_status a = mock_completion_parse(&c, body, sizeof(body) - 1, false,
                                             &lim, NULL);
        kvo_status b =
            mock_completion_parse(&c, chat, sizeof(chat) - 1, true, &lim, NULL);
        kvo_alloc_fail_after(-1);
        ck_assert(a == KVO_OK || a == KVO_ENOMEM);
        ck_assert(b == KVO_OK || b == KVO_ENOMEM);
        mock_completion_req_fini(&c);
    }
}
END_TEST

/* "model", "mm_items" and the probe's "detail": read as given, refused
 * when malformed, with the item and the rule named. */
START_TEST(model_mm_items_and_detail_are_read_and_checked) {
    mock_completion_req c;
    mock_completion_req_init(&c);
    kvo_err err;
    ck_assert_int_eq(
        parse(&c,
              "{\"model\": \"ad-1\", \"prompt\": [1,2,3,4,5,6], "
              "\"mm_items\": [{\"offset\": 1, \"length\": 2, \"hash\": "
              "\"img\"}, {\"offset\": 3, \"length\": 3, \"hash\": \"i2\"}]}",
              false, &err),
        KVO_OK);
    ck_assert_str_eq(c.model, "ad-1");
    ck_assert_uint_eq(c.n_mm, 2);
    ck_assert(c.mm[1].offset == 3 && c.mm[1].length == 3 &&
              strcmp(c.mm[1].id, "i2") == 0);
    static const struct {
        const char *body, *msg;
    } bad[] = {
        {"{\"prompt\": [1,2], \"mm_items\": {}}", "mm_items must be a list"},
        {"{\"prompt\": [1,2], \"mm_items\": [{\"offset\": 0, \"length\": 1}]}",
         "mm_items[0] must be"},
        {"{\"prompt\": [1,2], \"mm_items\": [{\"offset\": 0, \"length\": 3, "
         "\"hash\": \"x\"}]}",
         "mm_items[0] must lie inside the prompt (2 tokens)"},
        {"{\"prompt\": [1,2,3], \"mm_items\": [{\"offset\": 1, \"length\": 1, "
         "\"hash\": \"x\"}, {\"offset\": 0, \"length\": 1, \"hash\": \"y\"}]}",
         "mm_items[1] must lie inside"},
        {"{\"prompt\": [1,2], \"mm_items\": [{\"offset\": 0, \"length\": 0, "
         "\"hash\": \"x\"}]}",
         "offset or length out of range"},
        {"{\"prompt\": [1,2], \"mm_items\": [{\"offset\": 0, \"length\": 1, "
         "\"hash\": \"\"}]}",
         "hash must be 1 to 256 bytes"},
        {"{\"prompt\": [[1,2], [3]], \"mm_items\": []}",
         "mm_items go with one prompt"},
        {"{\"prompt\": [1,2], \"model\": 3}", "model must be a string"},
    };
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        ck_assert_int_ne(parse(&c, bad[i].body, false, &err), KVO_OK);
        ck_assert_msg(strstr(err.msg, bad[i].msg), "%s -> %s", bad[i].body,
                      err.msg);
        ck_assert_uint_eq(c.n_mm, 0);
    }
    mock_completion_req_fini(&c);
    mock_probe_req p;
    mock_probe_req_init(&p);
    static const char probe[] =
        "{\"token_ids\": [1,2,3,4,5], \"detail\": true, "
        "\"mm_items\": [{\"offset\": 4, \"length\": 1, "
        "\"hash\": \"z\"}]}";
    ck_assert_int_eq(mock_probe_parse(&p, probe, sizeof(probe) - 1, &lim, &err),
                     KVO_OK);
    ck_assert(p.detail && p.n_mm == 1 && strcmp(p.mm[0].id, "z") == 0);
    static const char probe_bad[] = "{\"token_ids\": [1], \"detail\": 1}";
    ck_assert_int_eq(
        mock_probe_parse(&p, probe_bad, sizeof(probe_bad) - 1, &lim, &err),
        KVO_EPROTO);
    ck_assert(!p.detail && p.n_mm == 0);
    mock_probe_req_fini(&p);
}
END_TEST

START_TEST(fuzz_corpora_and_crashes_replay_cleanly) {
    ck_assert_uint_ge(
        kt_fuzz_replay("corpus/completions", kvo_fuzz_completions), 20);
    ck_assert_uint_ge(kt_fuzz_replay("corpus/probe", kvo_fuzz_probe), 10);
    kt_fuzz_replay("crashes/completions", kvo_fuzz_completions);
    kt_fuzz_replay("crashes/probe", kvo_fuzz_probe);
}
END_TEST

Suite *suite_request(void) {
    const TTest *tests[] = {
        a_token_prompt_is_read_in_place_without_per_token_copies,
        every_prompt_form_reads_as_the_engine_needs_it,
        refusals_say_which_limit_and_where,
        out_of_memory_mid_parse_is_a_status,
        model_mm_items_and_detail_are_read_and_checked,
        fuzz_corpora_and_crashes_replay_cleanly,
    };
    return mt_suite(suite_create("request"), 120, tests, KVO_ARRAY_LEN(tests));
}
