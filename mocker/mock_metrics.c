/* mock_metrics.c -- GET /metrics: vLLM's metric names for every rank, in
 * the Prometheus text format through base's kvo_prom writer.
 *
 * One table, one row per family: vLLM's name (after "vllm:"), its type and
 * help, the sample's name (counters add _total), the engine counter it
 * shows and any label between engine and model_name. Each family gets its
 * HELP and TYPE lines, then one sample per rank:
 *
 *   vllm:<sample>{engine="<rank>",[<label>,]model_name="<model>"} <value>
 */
#include "mock_int.h"
#include "kvo_prom.h"

#include <stddef.h>
#include <string.h>

typedef struct vllm_metric {
    const char *family, *type, *help, *sample;
    size_t field;      /* offsetof(mock_engine_stats, ...) */
    bool usage;        /* the double kv-cache usage, not a uint64_t */
    const char *label; /* "k=\"v\"," before model_name, or "" */
} vllm_metric;

#define U64(f) offsetof(mock_engine_stats, f), false
#define USAGE offsetof(mock_engine_stats, usage), true

static const vllm_metric metrics[] = {
    {"num_requests_running", "gauge",
     "Number of requests in model execution batches.", "num_requests_running",
     U64(requests_running), ""},
    {"num_requests_waiting", "gauge",
     "Number of requests waiting to be processed.", "num_requests_waiting",
     U64(requests_waiting), ""},
    {"kv_cache_usage_perc", "gauge",
     "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage_perc", USAGE,
     ""},
    {"gpu_cache_usage_perc", "gauge",
     "GPU KV-cache usage. 1 means 100 percent usage (deprecated name).",
     "gpu_cache_usage_perc", USAGE, ""},
    {"prefix_cache_queries", "counter",
     "Prefix cache queries, in terms of number of queried tokens.",
     "prefix_cache_queries_total", U64(prefix_queries), ""},
    {"prefix_cache_hits", "counter",
     "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits_total", U64(prefix_hits), ""},
    {"num_preemptions", "counter", "Cumulative number of preemptions.",
     "num_preemptions_total", U64(preemptions), ""},
    {"prompt_tokens", "counter", "Number of prefill tokens processed.",
     "prompt_tokens_total", U64(prompt_tokens), ""},
    {"generation_tokens", "counter", "Number of generation tokens processed.",
     "generation_tokens_total", U64(generated_tokens), ""},
    {"request_success", "counter", "Count of successfully processed requests.",
     "request_success_total", U64(requests_finished),
     "finished_reason=\"length\","},
};

#undef U64
#undef USAGE

#define LABELS "engine=\"%u\",%smodel_name=\"%s\""

/* A usage sample with six decimals, as vLLM's exporter (and this server
 * before kvo_prom) writes it; kvo_prom_f64 writes %.17g. Goes through the
 * writer's sticky status like every other line. */
static void usage_sample(kvo_prom *p, const char *name, double v, uint32_t r,
                         const char *label, const char *model) {
    if (p->st != KVO_OK) return;
    p->st = kvo_buf_printf(p->out, "%s%s{" LABELS "} %.6f\n", p->prefix, name,
                           r, label, model, v);
}

kvo_status node_metrics_write(const mock_node *n, const char *model,
                              kvo_buf *out) {
    kvo_prom p;
    kvo_prom_init(&p, out, "vllm:");
    for (size_t i = 0; i < KVO_ARRAY_LEN(metrics); i++) {
        const vllm_metric *m = &metrics[i];
        kvo_prom_family(&p, m->family, m->type, m->help);
        for (uint32_t r = 0; r < n->n_ranks; r++) {
            mock_engine_stats st;
            mock_engine_stats_get(n->ranks[r].eng, &st);
            const char *f = (const char *)&st + m->field;
            if (m->usage) {
                double v;
                memcpy(&v, f, sizeof(v));
                usage_sample(&p, m->sample, v, r, m->label, model);
            } else {
                uint64_t v;
                memcpy(&v, f, sizeof(v));
                kvo_prom_u64(&p, m->sample, v, LABELS, r, m->label, model);
            }
        }
    }
    return kvo_prom_status(&p);
}
