/* check_report.c -- the terminal report (progress bar, summary, counters of
 * every stage, the worst prompts) and the JSON lines report (one line per
 * prompt, then one summary line). Pure writers over a check_result. */
#include "check_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double pct(uint64_t a, uint64_t b) {
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

void check_report_progress(FILE *f, const check_result *r, uint64_t done,
                           uint64_t total, double elapsed_s) {
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    size_t fill = total ? (size_t)((double)WIDTH * (double)done /
                                   (double)total)
                        : 0;
    if (fill > WIDTH) fill = WIDTH;
    memset(bar, '#', fill);
    memset(bar + fill, '.', WIDTH - fill);
    bar[WIDTH] = '\0';
    uint64_t div = 0;
    for (size_t i = 0; i < r->n_prompts; i++) div += r->prompts[i].diverged;
    double rate = elapsed_s > 0 ? (double)done / elapsed_s : 0;
    fprintf(f, "\r[%s] %llu/%llu requests  %.0f req/s  %llu divergent ", bar,
            (unsigned long long)done, (unsigned long long)total, rate,
            (unsigned long long)div);
    fflush(f);
}

/* A stage's name takes STAGE_W columns, and its counters wrap past
 * WRAP_COL. */
enum { STAGE_W = 14, WRAP_COL = 110 };

/* Histogram samples and zero values are noise in a terminal summary. */
static bool counter_shown(const check_counter *c) {
    if (strstr(c->name, "_bucket") || strstr(c->name, "_sum") ||
        strstr(c->name, "_count") || strstr(c->name, "quantile"))
        return false;
    return c->value != 0 && !isnan(c->value);
}

static void print_counters(FILE *f, const check_result *r) {
    const check_counters *c = &r->counters;
    fprintf(f, "counters (non-zero; ! = must stay 0):\n");
    for (size_t i = 0; i < c->n; i++) {
        /* Each stage once, in first-seen order. */
        size_t k;
        for (k = 0; k < i; k++)
            if (strcmp(c->items[k].stage, c->items[i].stage) == 0) break;
        if (k < i) continue;
        const char *stage = c->items[i].stage;
        size_t col = (size_t)fprintf(f, "  %-*s", STAGE_W, stage);
        size_t shown = 0;
        for (size_t j = i; j < c->n; j++) {
            const check_counter *it = &c->items[j];
            if (strcmp(it->stage, stage) != 0 || !counter_shown(it)) continue;
            bool rule = it->rule != NULL;
            char item[320];
            int n = snprintf(item, sizeof(item), " %s%s=%.15g",
                             rule ? "!" : "", it->name, it->value);
            if (n < 0) continue;
            if (col + (size_t)n > WRAP_COL && shown) {
                col = (size_t)fprintf(f, "\n  %-*s", STAGE_W, "") - 1;
            }
            fputs(item, f);
            col += (size_t)n;
            shown++;
        }
        if (!shown) fputs(" (all zero)", f);
        fputc('\n', f);
    }
}

void check_report_summary(FILE *f, const check_result *r, size_t worst) {
    check_totals t;
    check_result_totals(r, &t);
    fprintf(f, "\nkvo-check: %llu of %llu requests, %u slot%s "
               "(worker x dp rank), block size %u\n",
            (unsigned long long)t.requests, (unsigned long long)r->planned,
            r->n_slots, r->n_slots == 1 ? "" : "s", r->block_size);
    if (r->config[0]) fprintf(f, "  config             %s\n", r->config);
    fprintf(f, "  prompt tokens      %llu (%llu blocks)\n",
            (unsigned long long)t.prompt_tokens,
            (unsigned long long)t.prompt_blocks);
    fprintf(f, "  engine hit rate    %6.2f %%  (cached tokens / prompt tokens)\n",
            pct(t.engine_hit_tokens, t.prompt_tokens));
    fprintf(f, "  index hit rate     %6.2f %%  (chosen worker, capped at "
               "(n-1)//bs like the engine)\n",
            pct(t.index_hit_tokens, t.prompt_tokens));
    fprintf(f, "  index score rate   %6.2f %%  (uncapped score / prompt "
               "blocks, Dynamo's router_kv_hit_rate)\n",
            pct(t.index_raw_blocks, t.prompt_blocks));
    fprintf(f, "  divergent prompts  %llu\n", (unsigned long long)t.divergent);
    if (r->n_sweep)
        fprintf(f, "  sweep              %zu earlier prompts re-checked on every "
                   "worker after the run, %zu divergent\n",
                r->n_sweep, r->sweep_divergent);
    double stored = check_counters_sum(&r->counters, "relay",
                                       "blocks_forwarded");
    double removed = check_counters_sum(&r->counters, "relay",
                                        "removes_forwarded");
    double evicted = check_counters_sum(&r->counters, "engine ",
                                        "blocks_removed");
    if (stored + removed > 0)
        fprintf(f, "  pipeline blocks    %.0f stored + %.0f removed forwarded "
                   "by the relays (engines evicted %.0f)\n",
                stored, removed, evicted);
    if (r->wall_s > 0) {
        fprintf(f, "  wall time          %.2f s (%.1f requests/s, %.0f "
                   "pipeline blocks/s)\n",
                r->wall_s, (double)t.requests / r->wall_s,
                (stored + removed) / r->wall_s);
        double sum = 0;
        for (int s = 0; s < CHECK_STAGE_COUNT; s++) sum += r->stage_s[s];
        fprintf(f, "  time per stage    ");
        for (int s = 0; s < CHECK_STAGE_COUNT; s++)
            fprintf(f, " %s %.1f%%", check_stage_name((check_stage)s),
                    sum > 0 ? 100 * r->stage_s[s] / sum : 0);
        fputc('\n', f);
    }
    print_counters(f, r);

    if (worst && r->n_prompts) {
        const check_prompt **v = kvo_calloc(worst, sizeof(*v));
        if (v) {
            size_t n = check_result_worst(r, v, worst);
            fprintf(f, "worst prompts (divergent first, then lowest engine "
                       "hit rate):\n");
            fprintf(f, "  %6s %6s %4s %7s %6s %6s %6s %5s  %s\n", "id",
                    "worker", "rank", "tokens", "blocks", "engine", "index",
                    "first", "reason");
            for (size_t i = 0; i < n; i++) {
                const check_prompt *p = v[i];
                char first[16] = "-";
                if (p->diverged)
                    snprintf(first, sizeof(first), "%d",
                             p->first_divergent_block);
                fprintf(f, "  %6llu %6u %4u %7u %6u %6d %6u %5s  %s%s%s\n",
                        (unsigned long long)p->id, p->worker, p->dp_rank,
                        p->prompt_tokens, p->prompt_blocks,
                        p->engine_hit_blocks, p->index_hit_blocks, first,
                        p->diverged ? check_reason_name(p->reason) : "",
                        p->diverged ? ": " : "", p->diverged ? p->detail : "");
            }
            kvo_free(v);
        }
    }
    if (r->verdict.pass)
        fprintf(f, "verdict: PASS\n");
    else
        fprintf(f, "verdict: FAIL: %s\n", r->verdict.cause);
}

/* ---- JSON lines ------------------------------------------------------------*/

static kvo_status put_line(FILE *f, json_object *j) {
    if (!j) return KVO_ENOMEM;
    const char *s = json_object_to_json_string_ext(
        j, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    kvo_status st = KVO_OK;
    if (!s || fputs(s, f) < 0 || fputc('\n', f) == EOF) st = KVO_EIO;
    json_object_put(j);
    return st;
}

/* A number printed with `decimals` decimals (json-c's own %.17g shows
 * 0.0359 as 0.035900000000000001). */
static json_object *jnum(double v, int decimals) {
    char txt[64];
    snprintf(txt, sizeof(txt), "%.*f", decimals, v);
    return json_object_new_double_s(v, txt);
}

static json_object *jstr_or_null(const char *s) {
    return s && *s ? json_object_new_string(s) : NULL;
}

static kvo_status json_prompt(FILE *f, const check_result *r,
                              const check_prompt *p, bool sweep) {
    json_object *j = json_object_new_object();
    if (!j) return KVO_ENOMEM;
    if (sweep) json_object_object_add(j, "sweep", json_object_new_boolean(1));
    json_object_object_add(j, "id", json_object_new_uint64(p->id));
    json_object_object_add(j, "worker", json_object_new_int64(p->worker));
    json_object_object_add(j, "dp_rank", json_object_new_int64(p->dp_rank));
    json_object_object_add(j, "prompt_tokens",
                           json_object_new_int64(p->prompt_tokens));
    json_object_object_add(j, "prompt_blocks",
                           json_object_new_int64(p->prompt_blocks));
    json_object_object_add(j, "hit_cap", json_object_new_int64(p->cap));
    json_object_object_add(j, "engine_hit_blocks",
                           json_object_new_int64(p->engine_hit_blocks));
    json_object_object_add(j, "index_hit_blocks",
                           json_object_new_int64(p->index_hit_blocks));
    json_object_object_add(j, "index_raw_blocks",
                           json_object_new_int64(p->index_raw_blocks));
    json_object *sc = json_object_new_array();
    json_object *eh = json_object_new_array();
    for (uint32_t s = 0; s < r->n_slots; s++) {
        json_object_array_add(sc, json_object_new_int64(p->index_scores[s]));
        json_object_array_add(eh, p->engine_hits[s] < 0
                                      ? NULL
                                      : json_object_new_int64(
                                            p->engine_hits[s]));
    }
    json_object_object_add(j, "index_scores", sc);
    json_object_object_add(j, "engine_hits", eh);
    json_object_object_add(j, "diverged", json_object_new_boolean(p->diverged));
    json_object_object_add(j, "first_divergent_block",
                           p->diverged ? json_object_new_int64(
                                             p->first_divergent_block)
                                       : NULL);
    json_object_object_add(j, "reason",
                           p->diverged ? jstr_or_null(check_reason_name(
                                             p->reason))
                                       : NULL);
    json_object_object_add(j, "detail",
                           p->diverged ? jstr_or_null(p->detail) : NULL);
    if (!sweep) json_object_object_add(j, "ms", jnum(p->ms, 3));
    return put_line(f, j);
}

kvo_status check_report_json_prompt(FILE *f, const check_result *r,
                                    const check_prompt *p) {
    return json_prompt(f, r, p, false);
}

kvo_status check_report_json_sweep(FILE *f, const check_result *r,
                                   const check_prompt *p) {
    return json_prompt(f, r, p, true);
}

static json_object *rate(uint64_t a, uint64_t b) {
    return jnum(b ? (double)a / (double)b : 0, 6);
}

/* {"indexer": {"name": value, ...}, "relay 0.0": {...}} */
static json_object *counters_json(const check_counters *c) {
    json_object *o = json_object_new_object();
    for (size_t i = 0; i < c->n; i++) {
        json_object *st = NULL;
        if (!json_object_object_get_ex(o, c->items[i].stage, &st)) {
            st = json_object_new_object();
            json_object_object_add(o, c->items[i].stage, st);
        }
        double v = c->items[i].value;
        json_object *jv =
            isnan(v) || isinf(v) ? NULL
            : (v == floor(v) && fabs(v) < 9e15)
                ? json_object_new_int64((int64_t)v)
                : jnum(v, 6);
        json_object_object_add(st, c->items[i].name, jv);
    }
    return o;
}

kvo_status check_report_json_summary(FILE *f, const check_result *r) {
    check_totals t;
    check_result_totals(r, &t);
    json_object *s = json_object_new_object();
    if (!s) return KVO_ENOMEM;
    json_object_object_add(s, "requests", json_object_new_uint64(t.requests));
    json_object_object_add(s, "planned", json_object_new_uint64(r->planned));
    json_object_object_add(s, "prompt_tokens",
                           json_object_new_uint64(t.prompt_tokens));
    json_object_object_add(s, "prompt_blocks",
                           json_object_new_uint64(t.prompt_blocks));
    json_object_object_add(s, "engine_hit_tokens",
                           json_object_new_uint64(t.engine_hit_tokens));
    json_object_object_add(s, "index_hit_tokens",
                           json_object_new_uint64(t.index_hit_tokens));
    json_object_object_add(s, "engine_hit_rate",
                           rate(t.engine_hit_tokens, t.prompt_tokens));
    json_object_object_add(s, "index_hit_rate",
                           rate(t.index_hit_tokens, t.prompt_tokens));
    json_object_object_add(s, "index_score_rate",
                           rate(t.index_raw_blocks, t.prompt_blocks));
    json_object_object_add(s, "divergent_prompts",
                           json_object_new_uint64(t.divergent));
    json_object_object_add(s, "sweep_prompts",
                           json_object_new_uint64(r->n_sweep));
    json_object_object_add(s, "sweep_divergent",
                           json_object_new_uint64(r->sweep_divergent));
    json_object_object_add(
        s, "pipeline_blocks",
        json_object_new_int64((int64_t)(
            check_counters_sum(&r->counters, "relay", "blocks_forwarded") +
            check_counters_sum(&r->counters, "relay", "removes_forwarded"))));
    json_object_object_add(s, "block_size",
                           json_object_new_int64(r->block_size));
    json_object_object_add(s, "dp_size", json_object_new_int64(r->dp_size));
    json_object *slots = json_object_new_array();
    for (uint32_t i = 0; i < r->n_slots; i++) {
        json_object *so = json_object_new_object();
        json_object_object_add(so, "worker",
                               json_object_new_int64(r->slots[i].worker));
        json_object_object_add(so, "dp_rank",
                               json_object_new_int64(r->slots[i].dp_rank));
        json_object_array_add(slots, so);
    }
    json_object_object_add(s, "slots", slots);
    json_object_object_add(s, "wall_s", jnum(r->wall_s, 3));
    json_object_object_add(
        s, "requests_per_s",
        jnum(r->wall_s > 0 ? (double)t.requests / r->wall_s : 0, 1));
    json_object *st = json_object_new_object();
    for (int i = 0; i < CHECK_STAGE_COUNT; i++)
        json_object_object_add(st, check_stage_name((check_stage)i),
                               jnum(r->stage_s[i], 3));
    json_object_object_add(s, "stage_s", st);
    json_object_object_add(s, "counters", counters_json(&r->counters));
    json_object *trips = json_object_new_array();
    for (size_t i = 0; i < r->n_trips; i++) {
        json_object *to = json_object_new_object();
        json_object_object_add(to, "stage",
                               json_object_new_string(r->trips[i].stage));
        json_object_object_add(to, "counter",
                               json_object_new_string(r->trips[i].name));
        json_object_object_add(to, "value", jnum(r->trips[i].value, 0));
        json_object_object_add(
            to, "first_seen_before_prompt",
            r->trips[i].before_prompt < 0
                ? NULL
                : json_object_new_int64(r->trips[i].before_prompt));
        json_object_object_add(
            to, "reason",
            json_object_new_string(check_reason_name(r->trips[i].rule->reason)));
        json_object_array_add(trips, to);
    }
    json_object_object_add(s, "tripped_counters", trips);
    json_object_object_add(s, "error", jstr_or_null(r->error));
    json_object_object_add(s, "config", jstr_or_null(r->config));
    json_object_object_add(s, "verdict", json_object_new_string(
                                             r->verdict.pass ? "PASS"
                                                             : "FAIL"));
    json_object_object_add(s, "cause", r->verdict.pass
                                           ? NULL
                                           : jstr_or_null(r->verdict.cause));
    json_object *j = json_object_new_object();
    json_object_object_add(j, "summary", s);
    return put_line(f, j);
}
