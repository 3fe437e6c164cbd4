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
    size_t fill =
        total ? (size_t)((double)WIDTH * (double)done / (double)total) : 0;
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
            int n = snprintf(item, sizeof(item), " %s%s=%.15g", rule ? "!" : "",
                             it->name, it->value);
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

/* Every fault injected, and what it took to heal; or that the run had
 * none, so no gap or recovery was allowed. */
static void print_faults(FILE *f, const check_result *r) {
    if (!r->n_faults) {
        fprintf(f, "  faults             %s\n",
                r->faulted ? "a forwarder's (--drop-seq / --extra-block-seq)"
                           : "none injected: no gap and no recovery allowed");
        return;
    }
    fprintf(f, "  faults             %zu injected\n", r->n_faults);
    for (size_t i = 0; i < r->n_faults; i++) {
        char line[400];
        check_fault_text(&r->faults[i], line, sizeof(line));
        fprintf(f, "                     %s\n", line);
    }
}

/* The checkpoints: how many, their cost, and every failing one with its
 * first differences. */
static void print_checkpoints(FILE *f, const check_result *r) {
    if (!r->n_ckpts) return;
    double drain = 0, sync = 0, sets = 0, sweep = 0;
    uint64_t listed = 0, lists = 0, failed = 0, compared = 0;
    uint64_t tiered = 0, cpu_compared = 0; /* checkpoints with a CPU tier */
    for (size_t i = 0; i < r->n_ckpts; i++) {
        const check_checkpoint *c = &r->ckpts[i];
        drain += c->drain_s;
        sync += c->sync_s;
        sets += c->sets_s;
        sweep += c->sweep_s;
        listed += c->listed_blocks;
        for (uint32_t s = 0; s < r->n_slots; s++) lists += c->slots[s].listed;
        lists += c->cpu.listed;
        failed += check_checkpoint_failed(c);
        compared += c->sets;
        tiered += c->cpu.ranks > 0;
        cpu_compared += c->cpu.ranks > 0 && c->cpu.compared == c->cpu.ranks;
    }
    double total = drain + sync + sets + sweep;
    fprintf(f,
            "  checkpoints        %zu, %llu failed; block sets compared at "
            "%llu of them",
            r->n_ckpts, (unsigned long long)failed,
            (unsigned long long)compared);
    if (tiered)
        fprintf(f, ", the CPU tier's at %llu of %llu",
                (unsigned long long)cpu_compared, (unsigned long long)tiered);
    fputc('\n', f);
    for (size_t i = 0; i < r->n_ckpts; i++)
        if (!r->ckpts[i].sets) { /* say once why not */
            fprintf(f, "                     not compared: %s\n",
                    r->ckpts[i].sets_note);
            break;
        }
    for (size_t i = 0; i < r->n_ckpts; i++)
        if (r->ckpts[i].cpu.note[0]) {
            fprintf(f, "                     CPU tier not compared: %s\n",
                    r->ckpts[i].cpu.note);
            break;
        }
    fprintf(f,
            "  checkpoint cost    %.2f s (%.1f%% of the wall time): drain "
            "%.2f, sync %.2f, block sets %.2f (%llu lists fetched, %llu "
            "blocks), sweep %.2f\n",
            total, r->wall_s > 0 ? 100 * total / r->wall_s : 0, drain, sync,
            sets, (unsigned long long)lists, (unsigned long long)listed, sweep);
    for (size_t i = 0; i < r->n_ckpts; i++) {
        const check_checkpoint *c = &r->ckpts[i];
        if (!check_checkpoint_failed(c)) continue;
        char cause[400];
        check_checkpoint_cause(r, c, cause, sizeof(cause));
        fprintf(f, "  FAILED %s\n", cause);
        for (size_t k = 0; k < c->diff.n_first; k++) {
            char d[300];
            check_block_diff_text(r, &c->diff.first[k], d, sizeof(d));
            fprintf(f, "    %s\n", d);
        }
        for (size_t k = 0; k < c->cpu.diff.n_first; k++) {
            char d[300];
            check_block_diff_text(r, &c->cpu.diff.first[k], d, sizeof(d));
            fprintf(f, "    tier cpu: %s\n", d);
        }
    }
}

static void print_regime(FILE *f, const check_result *r) {
    check_regime g;
    check_result_regime(r, &g);
    if (!g.known) return;
    fprintf(f, "  engine regime     ");
    for (int k = 0; k < CHECK_REGIME_COUNT; k++)
        fprintf(f, "%s %s %.0f", k ? "," : "",
                check_regime_what((check_regime_item)k), g.v[k]);
    fputc('\n', f);
}

/* What the router saw: routing-time scores against the engines' hits. */
static void print_staleness(FILE *f, const check_result *r) {
    check_staleness s;
    if (check_result_staleness(r, &s) != KVO_OK || !s.requests) return;
    fprintf(f,
            "  router's view      %llu requests: %.1f %% exact; index "
            "over the engine %.1f %% (p50 %u, p99 %u, max %u blocks), under "
            "%.1f %% (p50 %u, p99 %u, max %u); |diff| p50 %u p99 %u max "
            "%u\n",
            (unsigned long long)s.requests, pct(s.exact, s.requests),
            pct(s.over, s.requests), s.over_p50, s.over_p99, s.over_max,
            pct(s.under, s.requests), s.under_p50, s.under_p99, s.under_max,
            s.abs_p50, s.abs_p99, s.abs_max);
    fprintf(f,
            "  promised hit rate  %6.2f %%  (routing-time index scores, "
            "capped), achieved %.2f %%\n",
            pct(s.promised_tokens, s.prompt_tokens),
            pct(s.achieved_tokens, s.prompt_tokens));
}

void check_report_summary(FILE *f, const check_result *r, size_t worst) {
    check_totals t;
    check_result_totals(r, &t);
    fprintf(f,
            "\nkvo-check: %llu of %llu requests, %u slot%s "
            "(worker x dp rank), block size %u\n",
            (unsigned long long)t.requests, (unsigned long long)r->planned,
            r->n_slots, r->n_slots == 1 ? "" : "s", r->block_size);
    if (r->config[0]) fprintf(f, "  config             %s\n", r->config);
    if (r->traffic.lora || r->traffic.salted || r->traffic.mm)
        fprintf(f,
                "  traffic            %llu with a LoRA adapter, %llu salted, "
                "%llu with a multimodal item (of %llu planned)\n",
                (unsigned long long)r->traffic.lora,
                (unsigned long long)r->traffic.salted,
                (unsigned long long)r->traffic.mm,
                (unsigned long long)r->planned);
    fprintf(f, "  prompt tokens      %llu (%llu blocks)\n",
            (unsigned long long)t.prompt_tokens,
            (unsigned long long)t.prompt_blocks);
    fprintf(f,
            "  engine hit rate    %6.2f %%  (cached tokens / prompt tokens)\n",
            pct(t.engine_hit_tokens, t.prompt_tokens));
    fprintf(f,
            "  index hit rate     %6.2f %%  (chosen worker%s, capped at "
            "(n-1)//bs like the engine)\n",
            pct(t.index_hit_tokens, t.prompt_tokens),
            r->load.on ? " when routed" : "");
    fprintf(f,
            "  index score rate   %6.2f %%  (uncapped score / prompt "
            "blocks, Dynamo's router_kv_hit_rate)\n",
            pct(t.index_raw_blocks, t.prompt_blocks));
    if (r->load.on) {
        fprintf(f,
                "  load               %s %u, engines' speedup %g; at most "
                "%u requests were in flight\n",
                r->load.arrival == CHECK_ARRIVAL_TRACE
                    ? "trace arrivals, at most"
                    : "closed loop, concurrency",
                r->load.concurrency, r->load.speedup, r->load.max_inflight);
        if (r->load.arrival == CHECK_ARRIVAL_TRACE)
            fprintf(f,
                    "  arrivals           time scale %g; %llu admitted late "
                    "(every sender busy), by up to %.0f ms\n",
                    r->load.time_scale, (unsigned long long)r->load.late,
                    r->load.late_max_ms);
        print_staleness(f, r);
    } else {
        fprintf(f, "  divergent prompts  %llu\n",
                (unsigned long long)t.divergent);
    }
    if (r->n_sweep)
        fprintf(f,
                "  sweep              %zu earlier prompts re-checked on every "
                "worker at checkpoints, %zu divergent\n",
                r->n_sweep, r->sweep_divergent);
    char classes[512];
    if (check_totals_classes(&t, classes, sizeof(classes)))
        fprintf(f, "  by class           %s\n", classes);
    print_checkpoints(f, r);
    print_faults(f, r);
    print_regime(f, r);
    double stored =
        check_counters_sum(&r->counters, "relay", "blocks_forwarded");
    double removed =
        check_counters_sum(&r->counters, "relay", "removes_forwarded");
    double evicted =
        check_counters_sum(&r->counters, "engine ", "blocks_removed");
    if (stored + removed > 0)
        fprintf(f,
                "  pipeline blocks    %.0f stored + %.0f removed forwarded "
                "by the relays (engines evicted %.0f)\n",
                stored, removed, evicted);
    if (r->wall_s > 0) {
        fprintf(f,
                "  wall time          %.2f s (%.1f requests/s, %.0f "
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
    /* every counter when something failed, or when asked; a PASS shows
     * only what matters */
    if (!r->verdict.pass || r->verbose) print_counters(f, r);

    if (worst && r->n_prompts && (!r->verdict.pass || r->verbose)) {
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

/* A hash that may be absent. */
static json_object *opt_u64(bool has, uint64_t v) {
    return has ? json_object_new_uint64(v) : NULL;
}

/* The evidence block by block: [{"block", "engine": {"hash", "parent",
 * "tokens_hash", "cached", "copies"}, "index": {"held", "parent",
 * "tokens_hash", "others", "holders": [[worker, rank], ...]}}, ...]. */
static json_object *chain_json(const check_prompt *p) {
    json_object *a = json_object_new_array();
    for (uint32_t i = 0; a && i < p->n_rows; i++) {
        const check_evidence_row *w = &p->rows[i];
        json_object *row = json_object_new_object(),
                    *e = json_object_new_object(),
                    *x = json_object_new_object(),
                    *hs = json_object_new_array();
        json_object_object_add(row, "block", json_object_new_int64(w->block));
        json_object_object_add(e, "hash",
                               json_object_new_uint64(w->engine.hash));
        json_object_object_add(e, "parent",
                               opt_u64(w->engine.has_parent, w->engine.parent));
        json_object_object_add(e, "tokens_hash",
                               json_object_new_uint64(w->engine.tokens_hash));
        json_object_object_add(e, "cached",
                               json_object_new_boolean(w->engine.cached));
        json_object_object_add(e, "copies",
                               json_object_new_int64(w->engine.copies));
        json_object_object_add(x, "held",
                               json_object_new_boolean(w->index.held));
        json_object_object_add(
            x, "parent",
            opt_u64(w->index.held && w->index.has_parent, w->index.parent));
        json_object_object_add(x, "tokens_hash",
                               opt_u64(w->index.held, w->index.tokens_hash));
        json_object_object_add(x, "others",
                               json_object_new_uint64(w->index.others));
        for (uint32_t h = 0; h < w->index.n_holders; h++) {
            json_object *wr = json_object_new_array();
            json_object_array_add(
                wr, json_object_new_int64(w->index.holders[h].worker));
            json_object_array_add(
                wr, json_object_new_int64(w->index.holders[h].dp_rank));
            json_object_array_add(hs, wr);
        }
        json_object_object_add(x, "holders", hs);
        json_object_object_add(row, "engine", e);
        json_object_object_add(row, "index", x);
        json_object_array_add(a, row);
    }
    return a;
}

static json_object *jstr_or_null(const char *s) {
    return s && *s ? json_object_new_string(s) : NULL;
}

static json_object *faults_json(const check_result *r) {
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < r->n_faults; i++) {
        const check_fault *x = &r->faults[i];
        json_object *o = json_object_new_object();
        json_object_object_add(o, "before_request",
                               json_object_new_int64((int64_t)x->at));
        json_object_object_add(
            o, "kind", json_object_new_string(check_fault_kind_name(x->kind)));
        json_object_object_add(o, "target", jstr_or_null(x->target));
        json_object_object_add(o, "done", json_object_new_boolean(x->done));
        json_object_object_add(o, "down_ms",
                               x->done ? jnum(x->down_ms, 1) : NULL);
        json_object_object_add(o, "heal_ms",
                               x->heal_ms >= 0 ? jnum(x->heal_ms, 1) : NULL);
        json_object *rec = NULL;
        if (x->has_recovery) {
            rec = json_object_new_object();
            for (int k = 0; k < CHECK_FAULT_REC_COUNT; k++)
                json_object_object_add(rec,
                                       check_fault_rec_name((check_fault_rec)k),
                                       jnum(x->rec[k], 0));
        }
        json_object_object_add(o, "indexer_recovery", rec);
        json_object_array_add(a, o);
    }
    return a;
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
        json_object_array_add(eh,
                              p->engine_hits[s] < 0
                                  ? NULL
                                  : json_object_new_int64(p->engine_hits[s]));
    }
    json_object_object_add(j, "index_scores", sc);
    json_object_object_add(j, "engine_hits", eh);
    json_object_object_add(j, "diverged", json_object_new_boolean(p->diverged));
    json_object_object_add(
        j, "first_divergent_block",
        p->diverged ? json_object_new_int64(p->first_divergent_block) : NULL);
    json_object_object_add(
        j, "divergent_tier",
        p->diverged ? json_object_new_string(p->tier_cpu ? "cpu" : "gpu")
                    : NULL);
    json_object_object_add(
        j, "reason",
        p->diverged ? jstr_or_null(check_reason_name(p->reason)) : NULL);
    json_object_object_add(j, "detail",
                           p->diverged ? jstr_or_null(p->detail) : NULL);
    json_object_object_add(j, "evidence",
                           p->diverged ? jstr_or_null(p->evidence) : NULL);
    if (p->n_rows) json_object_object_add(j, "evidence_chain", chain_json(p));
    if (!sweep) {
        json_object_object_add(j, "routed_index_blocks",
                               json_object_new_int64(p->routed_index_blocks));
        json_object_object_add(j, "inflight_at_route",
                               json_object_new_int64(p->inflight_at_route));
        json_object_object_add(j, "judged", json_object_new_boolean(p->judged));
        json_object_object_add(j, "ms", jnum(p->ms, 3));
    } else {
        json_object_object_add(j, "checkpoint",
                               json_object_new_int64(p->checkpoint));
    }
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
        json_object *jv = isnan(v) || isinf(v) ? NULL
                          : (v == floor(v) && fabs(v) < 9e15)
                              ? json_object_new_int64((int64_t)v)
                              : jnum(v, 6);
        json_object_object_add(st, c->items[i].name, jv);
    }
    return o;
}

static json_object *load_json(const check_result *r) {
    json_object *o = json_object_new_object();
    json_object_object_add(
        o, "arrival",
        json_object_new_string(
            r->load.arrival == CHECK_ARRIVAL_TRACE ? "trace" : "closed"));
    json_object_object_add(o, "concurrency",
                           json_object_new_int64(r->load.concurrency));
    json_object_object_add(o, "speedup", jnum(r->load.speedup, 3));
    json_object_object_add(o, "time_scale", jnum(r->load.time_scale, 3));
    json_object_object_add(o, "max_inflight",
                           json_object_new_int64(r->load.max_inflight));
    json_object_object_add(o, "late_arrivals",
                           json_object_new_uint64(r->load.late));
    json_object_object_add(o, "late_max_ms", jnum(r->load.late_max_ms, 1));
    return o;
}

/* {"steps_multi": n, ...} from the engines' counters, or null. */
static json_object *regime_json(const check_result *r) {
    check_regime g;
    check_result_regime(r, &g);
    if (!g.known) return NULL;
    json_object *o = json_object_new_object();
    for (int k = 0; k < CHECK_REGIME_COUNT; k++)
        json_object_object_add(o, check_regime_name((check_regime_item)k),
                               json_object_new_int64((int64_t)g.v[k]));
    return o;
}

static json_object *staleness_json(const check_result *r) {
    check_staleness s;
    if (check_result_staleness(r, &s) != KVO_OK) return NULL;
    json_object *o = json_object_new_object();
#define U(k, v) json_object_object_add(o, k, json_object_new_uint64(v))
    U("requests", s.requests);
    U("exact", s.exact);
    U("over", s.over);
    U("under", s.under);
    json_object_object_add(o, "exact_rate", rate(s.exact, s.requests));
    U("abs_p50", s.abs_p50);
    U("abs_p99", s.abs_p99);
    U("abs_max", s.abs_max);
    U("over_p50", s.over_p50);
    U("over_p99", s.over_p99);
    U("over_max", s.over_max);
    U("under_p50", s.under_p50);
    U("under_p99", s.under_p99);
    U("under_max", s.under_max);
#undef U
    json_object_object_add(o, "promised_hit_rate",
                           rate(s.promised_tokens, s.prompt_tokens));
    json_object_object_add(o, "achieved_hit_rate",
                           rate(s.achieved_tokens, s.prompt_tokens));
    return o;
}

static json_object *block_json(const check_block *b, bool parent) {
    if (!parent) return json_object_new_uint64(b->hash);
    return b->has_parent ? json_object_new_uint64(b->parent) : NULL;
}

static const char *const DIFF_KINDS[CHECK_DIFF_COUNT] = {
    "engine_only", "index_only", "parent"};

/* The first differences of d, one object each. */
static json_object *diffs_json(const check_result *r, const check_set_diff *d) {
    json_object *diffs = json_object_new_array();
    for (size_t k = 0; k < d->n_first; k++) {
        const check_block_diff *x = &d->first[k];
        json_object *o = json_object_new_object();
        json_object_object_add(o, "kind",
                               json_object_new_string(DIFF_KINDS[x->kind]));
        json_object_object_add(o, "worker",
                               json_object_new_int64(r->slots[x->slot].worker));
        json_object_object_add(
            o, "dp_rank", json_object_new_int64(r->slots[x->slot].dp_rank));
        const check_block *b =
            x->kind == CHECK_DIFF_INDEX_ONLY ? &x->index : &x->engine;
        json_object_object_add(o, "block_hash", block_json(b, false));
        json_object_object_add(o, "engine_parent",
                               x->kind == CHECK_DIFF_INDEX_ONLY
                                   ? NULL
                                   : block_json(&x->engine, true));
        json_object_object_add(o, "index_parent",
                               x->kind == CHECK_DIFF_ENGINE_ONLY
                                   ? NULL
                                   : block_json(&x->index, true));
        json_object_object_add(o, "prompt",
                               x->prompt >= 0 ? json_object_new_int64(x->prompt)
                                              : NULL);
        json_object_object_add(o, "prompt_block",
                               x->prompt >= 0 ? json_object_new_int64(x->depth)
                                              : NULL);
        json_object_array_add(diffs, o);
    }
    return diffs;
}

/* A checkpoint's CPU tier; NULL (JSON null) when no rank has one. */
static json_object *cpu_sets_json(const check_result *r,
                                  const check_tier_sets *t) {
    if (!t->ranks) return NULL;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "ranks", json_object_new_int64(t->ranks));
    json_object_object_add(o, "compared", json_object_new_int64(t->compared));
    json_object_object_add(o, "note", jstr_or_null(t->note));
    json_object_object_add(o, "engine_blocks",
                           json_object_new_uint64(t->engine_blocks));
    json_object_object_add(o, "index_blocks",
                           json_object_new_uint64(t->index_blocks));
    json_object_object_add(o, "slots_listed", json_object_new_int64(t->listed));
    json_object_object_add(o, "blocks_cut", json_object_new_uint64(t->cut));
    for (int k = 0; k < CHECK_DIFF_COUNT; k++)
        json_object_object_add(o, DIFF_KINDS[k],
                               json_object_new_uint64(t->diff.n[k]));
    json_object_object_add(o, "differences", diffs_json(r, &t->diff));
    return o;
}

static json_object *checkpoints_json(const check_result *r) {
    json_object *arr = json_object_new_array();
    for (size_t i = 0; i < r->n_ckpts; i++) {
        const check_checkpoint *c = &r->ckpts[i];
        json_object *o = json_object_new_object();
        json_object_object_add(o, "number", json_object_new_int64(c->number));
        json_object_object_add(o, "after_requests",
                               json_object_new_uint64(c->after));
        json_object_object_add(o, "final", json_object_new_boolean(c->final));
        json_object_object_add(
            o, "passed", json_object_new_boolean(!check_checkpoint_failed(c)));
        char cause[400];
        check_checkpoint_cause(r, c, cause, sizeof(cause));
        json_object_object_add(o, "cause", jstr_or_null(cause));
        json_object_object_add(o, "block_sets_compared",
                               json_object_new_boolean(c->sets));
        json_object_object_add(o, "block_sets_note",
                               jstr_or_null(c->sets_note));
        uint64_t eb = 0, ib = 0, lists = 0;
        for (uint32_t s = 0; s < r->n_slots; s++) {
            eb += c->slots[s].engine_blocks;
            ib += c->slots[s].index_blocks;
            lists += c->slots[s].listed;
        }
        json_object_object_add(o, "engine_blocks", json_object_new_uint64(eb));
        json_object_object_add(o, "index_blocks", json_object_new_uint64(ib));
        json_object_object_add(o, "slots_listed",
                               json_object_new_uint64(lists));
        json_object_object_add(o, "listed_blocks",
                               json_object_new_uint64(c->listed_blocks));
        for (int k = 0; k < CHECK_DIFF_COUNT; k++)
            json_object_object_add(o, DIFF_KINDS[k],
                                   json_object_new_uint64(c->diff.n[k]));
        json_object_object_add(o, "differences", diffs_json(r, &c->diff));
        json_object_object_add(o, "cpu_sets", cpu_sets_json(r, &c->cpu));
        json_object_object_add(o, "sweep_prompts",
                               json_object_new_uint64(c->sweep_prompts));
        json_object_object_add(o, "sweep_divergent",
                               json_object_new_uint64(c->sweep_divergent));
        json_object_object_add(o, "drain_s", jnum(c->drain_s, 3));
        json_object_object_add(o, "sync_s", jnum(c->sync_s, 3));
        json_object_object_add(o, "sets_s", jnum(c->sets_s, 3));
        json_object_object_add(o, "sweep_s", jnum(c->sweep_s, 3));
        json_object_array_add(arr, o);
    }
    return arr;
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
    json_object *classes = json_object_new_object();
    for (int k = 1; k < CHECK_REASON_COUNT; k++)
        if (t.by_reason[k])
            json_object_object_add(classes, check_reason_name((check_reason)k),
                                   json_object_new_uint64(t.by_reason[k]));
    json_object_object_add(s, "divergent_by_class", classes);
    json_object_object_add(
        s, "pipeline_blocks",
        json_object_new_int64(
            (int64_t)(check_counters_sum(&r->counters, "relay",
                                         "blocks_forwarded") +
                      check_counters_sum(&r->counters, "relay",
                                         "removes_forwarded"))));
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
        json_object_object_add(to, "reason",
                               json_object_new_string(check_reason_name(
                                   r->trips[i].rule->reason)));
        json_object_array_add(trips, to);
    }
    json_object_object_add(s, "tripped_counters", trips);
    json_object_object_add(
        s, "mode", json_object_new_string(r->load.on ? "load" : "lockstep"));
    if (r->load.on) json_object_object_add(s, "load", load_json(r));
    json_object_object_add(s, "regime", regime_json(r));
    json_object_object_add(s, "staleness", staleness_json(r));
    json_object_object_add(s, "checkpoints", checkpoints_json(r));
    uint64_t cpu_compared = 0; /* checkpoints that compared every CPU set */
    for (size_t i = 0; i < r->n_ckpts; i++)
        cpu_compared += r->ckpts[i].cpu.ranks > 0 &&
                        r->ckpts[i].cpu.compared == r->ckpts[i].cpu.ranks;
    json_object_object_add(s, "checkpoints_cpu_sets_compared",
                           json_object_new_uint64(cpu_compared));
    json_object_object_add(s, "faulted", json_object_new_boolean(r->faulted));
    json_object_object_add(s, "faults", faults_json(r));
    double ck = 0;
    for (size_t i = 0; i < r->n_ckpts; i++)
        ck += r->ckpts[i].drain_s + r->ckpts[i].sync_s + r->ckpts[i].sets_s +
              r->ckpts[i].sweep_s;
    json_object_object_add(s, "checkpoint_s", jnum(ck, 3));
    json_object_object_add(s, "error", jstr_or_null(r->error));
    json_object_object_add(s, "config", jstr_or_null(r->config));
    json_object *tr = json_object_new_object();
    json_object_object_add(tr, "lora", json_object_new_uint64(r->traffic.lora));
    json_object_object_add(tr, "salted",
                           json_object_new_uint64(r->traffic.salted));
    json_object_object_add(tr, "mm", json_object_new_uint64(r->traffic.mm));
    json_object_object_add(s, "traffic", tr);
    json_object_object_add(
        s, "verdict",
        json_object_new_string(r->verdict.pass ? "PASS" : "FAIL"));
    json_object_object_add(
        s, "cause", r->verdict.pass ? NULL : jstr_or_null(r->verdict.cause));
    json_object_object_add(s, "caught_at",
                           r->verdict.pass ? NULL
                                           : jstr_or_null(r->verdict.where));
    json_object *j = json_object_new_object();
    json_object_object_add(j, "summary", s);
    return put_line(f, j);
}
