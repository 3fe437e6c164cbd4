/* The process layer around the engines without sockets: the node's
 * /metrics text and its failure, what a step and a replay serve report,
 * and the publisher's sequence when a batch cannot be rendered. */
#include "mt.h"

#include <stdlib.h>
#include <string.h>

Suite *suite_node(void);

/* A socketless node of ranks ranks (block size 4, 10 blocks). */
static void node_start(mock_node *n, mock_cfg *c, uint32_t ranks) {
    mt_cfg(c, 4, 10);
    c->dp_size = ranks;
    c->model = "m";
    ck_assert_int_eq(node_init(n, c, false), KVO_OK);
}

/* The port of a bound tcp endpoint. */
static unsigned ep_port(const char *ep) {
    return (unsigned)strtoul(strrchr(ep, ':') + 1, NULL, 10);
}

/* Port 0 with several ranks: each socket kind on consecutive ports, so a
 * restarted engine given --zmq-port P gets the same endpoints back; a
 * port of the block already taken moves the whole block. */
START_TEST(port_0_gives_the_ranks_consecutive_ports) {
    mock_cfg c;
    mock_node n;
    mt_cfg(&c, 4, 10);
    c.dp_size = 3;
    c.zmq_port = 0;
    c.replay_port = 0;
    ck_assert_int_eq(node_init(&n, &c, true), KVO_OK);
    unsigned p0 = ep_port(mock_pub_endpoint(n.ranks[0].pub));
    unsigned q0 = ep_port(mock_pub_replay_endpoint(n.ranks[0].pub));
    for (uint32_t r = 1; r < 3; r++) {
        ck_assert_uint_eq(ep_port(mock_pub_endpoint(n.ranks[r].pub)), p0 + r);
        ck_assert_uint_eq(ep_port(mock_pub_replay_endpoint(n.ranks[r].pub)),
                          q0 + r);
    }
    node_fini(&n);
    /* the same ports again, as a restart asks for them */
    c.zmq_port = (uint16_t)p0;
    c.replay_port = (uint16_t)q0;
    ck_assert_int_eq(node_init(&n, &c, true), KVO_OK);
    ck_assert_uint_eq(ep_port(mock_pub_endpoint(n.ranks[2].pub)), p0 + 2);
    /* while they are held, port 0 finds another block */
    mock_node m;
    c.zmq_port = 0;
    c.replay_port = 0;
    ck_assert_int_eq(node_init(&m, &c, true), KVO_OK);
    unsigned p1 = ep_port(mock_pub_endpoint(m.ranks[0].pub));
    ck_assert(p1 + 2 < p0 || p1 > p0 + 2);
    ck_assert_uint_eq(ep_port(mock_pub_endpoint(m.ranks[2].pub)), p1 + 2);
    node_fini(&m);
    node_fini(&n);
}
END_TEST

START_TEST(metrics_text_is_vllms_names_one_sample_per_rank) {
    mock_cfg c;
    mock_node n;
    node_start(&n, &c, 2);
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(node_metrics_write(&n, c.model, &b), KVO_OK);
    kvo_buf_cstr(&b);
    static const char want[] =
        "# HELP vllm:num_requests_running Number of requests in model "
        "execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be "
        "processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent "
        "usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.000000\n"
        "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.000000\n"
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 "
        "percent "
        "usage (deprecated name).\n"
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.000000\n"
        "vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.000000\n"
        "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of "
        "number of "
        "queried tokens.\n"
        "# TYPE vllm:prefix_cache_queries counter\n"
        "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 0\n"
        "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 0\n"
        "# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number "
        "of cached "
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
        "# HELP vllm:request_success Count of successfully processed "
        "requests.\n"
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

/* One step of rank 0 with a request of n tokens (ids from first), run to
 * its end; returns node_step_begin's status. */
static kvo_status node_step_with(mock_node *n, uint32_t tokens, uint64_t first,
                                 mt_out *out, long fail_after) {
    uint64_t t[256];
    ck_assert_uint_le(tokens, 256);
    mt_iota(t, tokens, first);
    mock_req_in in = {.tokens = t,
                      .n_tokens = tokens,
                      .max_tokens = 1,
                      .on_output = mt_on_output,
                      .user = out};
    ck_assert_int_eq(mock_engine_add(n->ranks[0].eng, &in, NULL), KVO_OK);
    mock_step st;
    kvo_alloc_fail_after(fail_after);
    kvo_status rc = node_step_begin(n, 0, 1.0, &st);
    kvo_alloc_fail_after(-1);
    if (rc == KVO_OK) node_step_end(n, 0);
    return rc;
}

/* A batch that cannot be rendered is lost, and the relay must be able to
 * tell: its sequence number is used up (the next batch comes one later),
 * the replay ring is emptied (no replay bridges the hole), and the loss is
 * counted. Every allocation of a step whose payload outgrows the render
 * buffer is failed in turn; the ones that hit the renderer are checked. */
START_TEST(a_batch_that_cannot_be_rendered_still_uses_up_its_sequence_number) {
    uint32_t render_failures = 0;
    for (long k = 0; k < 64; k++) {
        mock_cfg c;
        mock_node n;
        mt_cfg(&c, 4, 128);
        ck_assert_int_eq(node_init(&n, &c, false), KVO_OK);
        node_rank *nr = &n.ranks[0];
        mt_out o[3] = {{0}};
        ck_assert_int_eq(node_step_with(&n, 4, 1, &o[0], -1),
                         KVO_OK); /* seq 0 */
        kvo_status rc = node_step_with(&n, 240, 1000, &o[1], k);
        mock_pub_stats ps;
        mock_pub_stats_get(nr->pub, &ps);
        uint64_t last = 99;
        ck_assert(mock_pub_last_seq(nr->pub, &last));
        if (rc != KVO_OK || nr->render_errors == 0) { /* the engine failed, or
                                                         nothing did */
            ck_assert_uint_eq(ps.skipped, 0);
            node_fini(&n);
            continue;
        }
        render_failures++;
        ck_assert_uint_eq(nr->render_errors, 1);
        ck_assert_uint_eq(ps.batches, 1); /* only the first went out */
        ck_assert_uint_eq(ps.skipped, 1);
        ck_assert_uint_eq(last, 1);        /* ... but seq 1 is used up */
        ck_assert_uint_eq(ps.ring_len, 0); /* and no replay bridges it */
        ck_assert_int_eq(node_step_with(&n, 8, 5000, &o[2], -1), KVO_OK);
        mock_pub_stats_get(nr->pub, &ps);
        ck_assert(mock_pub_last_seq(nr->pub, &last));
        ck_assert_uint_eq(last, 2);
        ck_assert_uint_eq(ps.batches, 2);
        ck_assert_uint_eq(ps.ring_len, 1);
        node_fini(&n);
    }
    ck_assert_msg(render_failures > 0,
                  "no injected failure reached the renderer");
}
END_TEST

/* A BlockRemoved that cannot be queued (out of memory) is counted, for the
 * step and in total, and the batch holds the events that could be. */
START_TEST(an_eviction_event_lost_to_out_of_memory_is_counted) {
    step_events ev;
    events_init(&ev, true, 4);
    events_begin(&ev);
    mock_hash a = {.key = 11}, b = {.key = 12}, root = {0};
    kvo_alloc_fail_after(0);
    events_on_evict(&ev, &a, &root, NULL);
    kvo_alloc_fail_after(-1);
    ck_assert_uint_eq(ev.step_lost, 1);
    ck_assert_uint_eq(ev.lost_enomem, 1);
    events_on_evict(&ev, &b, &root, NULL);
    const wire_batch *batch;
    const mock_step_aux *aux;
    ck_assert_int_eq(events_finish(&ev, 1.0, 0, &batch, &aux), KVO_OK);
    ck_assert_ptr_nonnull(batch);
    ck_assert_uint_eq(batch->n_events, 1);
    ck_assert_int_eq(batch->events[0].type, WIRE_EV_REMOVED);
    ck_assert(batch->events[0].hashes[0].key == 12);
    events_begin(&ev); /* the next step starts clean; the total stays */
    ck_assert_uint_eq(ev.step_lost, 0);
    ck_assert_uint_eq(ev.lost_enomem, 1);
    events_fini(&ev);
}
END_TEST

Suite *suite_node(void) {
    const TTest *tests[] = {
        metrics_text_is_vllms_names_one_sample_per_rank,
        metrics_report_a_failed_write_instead_of_a_partial_text,
        a_batch_that_cannot_be_rendered_still_uses_up_its_sequence_number,
        an_eviction_event_lost_to_out_of_memory_is_counted,
        port_0_gives_the_ranks_consecutive_ports,
    };
    return mt_suite(suite_create("node"), 0, tests, KVO_ARRAY_LEN(tests));
}
