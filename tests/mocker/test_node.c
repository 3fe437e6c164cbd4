/* The process layer around the engines without sockets: the node's
 * /metrics text and its failure, what a step and a replay serve report,
 * and the publisher's sequence when a batch cannot be rendered. */
#include "mt.h"

#include <string.h>

Suite *suite_node(void);

/* A socketless node of ranks ranks (block size 4, 10 blocks). */
static void node_start(mock_node *n, mock_cfg *c, uint32_t ranks) {
    mt_cfg(c, 4, 10);
    c->dp_size = ranks;
    c->model = "m";
    ck_assert_int_eq(node_init(n, c, false), KVO_OK);
}

START_TEST(metrics_text_is_vllms_names_one_sample_per_rank) {
    mock_cfg c;
    mock_node n;
    node_start(&n, &c, 2);
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(node_metrics_write(&n, c.model, &b), KVO_OK);
    kvo_buf_cstr(&b);
    static const char want[] =
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.000000\n"
        "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.000000\n"
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent "
        "usage (deprecated name).\n"
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.000000\n"
        "vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.000000\n"
        "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of "
        "queried tokens.\n"
        "# TYPE vllm:prefix_cache_queries counter\n"
        "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached "
        "tokens.\n"
        "# TYPE vllm:prefix_cache_hits counter\n"
        "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:num_preemptions Cumulative number of preemptions.\n"
        "# TYPE vllm:num_preemptions counter\n"
        "vllm:num_preemptions_total{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:num_preemptions_total{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:prompt_tokens Number of prefill tokens processed.\n"
        "# TYPE vllm:prompt_tokens counter\n"
        "vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:prompt_tokens_total{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:generation_tokens Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens counter\n"
        "vllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:generation_tokens_total{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:request_success Count of successfully processed requests.\n"
        "# TYPE vllm:request_success counter\n"
        "vllm:request_success_total{engine=\"0\",finished_reason=\"length\","
        "model_name=\"m\"} 0\n"
        "vllm:request_success_total{engine=\"1\",finished_reason=\"length\","
        "model_name=\"m\"} 0\n";
    ck_assert_str_eq((const char *)b.data, want);
    kvo_buf_fini(&b);
    node_fini(&n);
}
END_TEST

START_TEST(metrics_report_a_failed_write_instead_of_a_partial_text) {
    mock_cfg c;
    mock_node n;
    node_start(&n, &c, 3);
    kvo_buf b;
    kvo_buf_init(&b);
    /* Every allocation the writer makes, failed in turn. */
    long k = 0;
    for (;; k++) {
        kvo_buf_fini(&b);
        kvo_buf_init(&b);
        kvo_alloc_fail_after(k);
        kvo_status st = node_metrics_write(&n, c.model, &b);
        kvo_alloc_fail_after(-1);
        if (st == KVO_OK) break;
        ck_assert_int_eq(st, KVO_ENOMEM);
        ck_assert_int_lt(k, 1000);
    }
    ck_assert_int_gt(k, 0);
    /* A label that cannot be written: refused, not cut. */
    char model[600];
    memset(model, 'x', sizeof(model) - 1);
    model[sizeof(model) - 1] = '\0';
    kvo_buf_reset(&b);
    ck_assert_int_eq(node_metrics_write(&n, model, &b), KVO_ETOOBIG);
    kvo_buf_fini(&b);
    node_fini(&n);
}
END_TEST

Suite *suite_node(void) {
    Suite *s = suite_create("node");
    TCase *tc = tcase_create("node");
    tcase_add_test(tc, metrics_text_is_vllms_names_one_sample_per_rank);
    tcase_add_test(tc, metrics_report_a_failed_write_instead_of_a_partial_text);
    suite_add_tcase(s, tc);
    return s;
}
