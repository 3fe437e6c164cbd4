/* check_html.c -- the HTML report: one self-contained page (inline CSS,
 * inline SVG drawn here, a few lines of inline JS for hover details), no
 * network, readable by a person debugging a falling hit rate.
 *
 * Page: verdict banner · summary table · hit rate over the trace (rolling
 * window, engine vs index, all requests, then one small chart per slot) with
 * divergences marked in red · the list of divergences with reasons · the
 * worst prompts · counters per stage · where the time went.
 *
 * Plot geometry: x = position of the request in the run (trace order), y =
 * hit rate in % of prompt tokens over the last W requests (token-weighted).
 * The engine line is drawn wide and light, the index line thin and dashed on
 * top of it, so a correct pipeline shows one line and a drift shows two.
 */
#include "check_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void esc(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static double pct(uint64_t a, uint64_t b) {
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

static const char CSS[] =
    "body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,"
    "sans-serif;margin:24px auto;max-width:1000px;color:#222;padding:0 12px}"
    "h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;"
    "border-bottom:1px solid #ddd;padding-bottom:4px}"
    ".verdict{padding:10px 14px;border-radius:6px;font-weight:600;"
    "font-size:16px}.pass{background:#e6f4ea;color:#1e6b34}"
    ".fail{background:#fdecea;color:#a1261c}"
    ".cause{font-weight:400;font-size:14px;margin-top:4px}"
    "table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px;"
    "border-bottom:1px solid #eee;text-align:left;vertical-align:top}"
    "th{background:#f6f6f6;font-weight:600}td.n{text-align:right;"
    "font-variant-numeric:tabular-nums}tr.div td{background:#fff3f2}"
    ".stage{display:inline-block;vertical-align:top;margin:0 18px 10px 0}"
    ".bad{color:#a1261c;font-weight:600}.muted{color:#777}"
    "table.chain{margin:.3em 0;font-size:90%}table.chain td{font-family:"
    "monospace}"
    "svg text{font:11px system-ui,sans-serif;fill:#555}"
    ".legend span{display:inline-block;margin-right:16px}"
    ".sw{display:inline-block;width:22px;height:4px;vertical-align:middle;"
    "margin-right:5px}"
    "#tip{position:fixed;pointer-events:none;background:#222;color:#fff;"
    "padding:6px 8px;border-radius:4px;font-size:12px;display:none;"
    "white-space:pre}"
    ".small{display:inline-block;margin:0 10px 10px 0}";

enum {
    PLOT_W = 940,
    PLOT_H = 250,
    SMALL_W = 460,
    SMALL_H = 150,
    MAX_POINTS = 900
};
/* The rolling window: a WINDOW_SPANS-th of the run, within WINDOW_MIN and
 * WINDOW_MAX requests (a slot's chart: its share, at least
 * SLOT_WINDOW_MIN). Past MANY_MARKS divergence marks a chart draws them
 * fainter so its lines stay readable. */
enum {
    WINDOW_SPANS = 50,
    WINDOW_MIN = 10,
    WINDOW_MAX = 200,
    SLOT_WINDOW_MIN = 5,
    MANY_MARKS = 50
};
/* Rows of the divergence list (the JSON report has them all) and of the
 * worst-prompts table. */
enum { DIVERGENCE_ROWS = 2000, WORST_ROWS = 20 };

/* Rolling token-weighted rates over the prompts whose slot matches (slot <
 * 0: all), evaluated at each such prompt. Writes (position, engine %,
 * index %) triples; returns how many. */
static size_t rolling(const check_result *r, long slot, size_t window,
                      double *pos, double *eng, double *idx) {
    size_t n = 0, head = 0;
    uint64_t tok = 0, e = 0, i = 0;
    size_t *members =
        kvo_calloc(r->n_prompts ? r->n_prompts : 1, sizeof(*members));
    if (!members) return 0;
    size_t nm = 0;
    for (size_t k = 0; k < r->n_prompts; k++) {
        const check_prompt *p = &r->prompts[k];
        if (slot >= 0 && p->slot != (uint32_t)slot) continue;
        members[nm++] = k;
        tok += p->prompt_tokens;
        if (p->engine_hit_blocks > 0)
            e += (uint64_t)p->engine_hit_blocks * r->block_size;
        i += (uint64_t)p->index_hit_blocks * r->block_size;
        if (nm - head > window) {
            const check_prompt *o = &r->prompts[members[head++]];
            tok -= o->prompt_tokens;
            if (o->engine_hit_blocks > 0)
                e -= (uint64_t)o->engine_hit_blocks * r->block_size;
            i -= (uint64_t)o->index_hit_blocks * r->block_size;
        }
        pos[n] = (double)k;
        eng[n] = pct(e, tok);
        idx[n] = pct(i, tok);
        n++;
    }
    kvo_free(members);
    return n;
}

static void polyline(FILE *f, const double *pos, const double *val, size_t n,
                     double x0, double xs, double y0, double ys,
                     const char *attrs) {
    if (n == 0) return;
    size_t step = n > MAX_POINTS ? (n + MAX_POINTS - 1) / MAX_POINTS : 1;
    fprintf(f, "<polyline fill=\"none\" %s points=\"", attrs);
    for (size_t k = 0; k < n; k += step)
        fprintf(f, "%.1f,%.1f ", x0 + pos[k] * xs, y0 - val[k] * ys);
    if ((n - 1) % step)
        fprintf(f, "%.1f,%.1f", x0 + pos[n - 1] * xs, y0 - val[n - 1] * ys);
    fputs("\"/>\n", f);
}

/* One chart: frame, grid, the two lines, divergence marks. */
static void chart(FILE *f, const check_result *r, long slot, size_t window,
                  int w, int h, const char *id, const char *title) {
    const double ml = 38, mr = 10, mt = 22, mb = 24;
    double pw = w - ml - mr, ph = h - mt - mb;
    size_t n = r->n_prompts;
    double *pos = kvo_calloc(n ? n : 1, sizeof(double));
    double *eng = kvo_calloc(n ? n : 1, sizeof(double));
    double *idx = kvo_calloc(n ? n : 1, sizeof(double));
    if (!pos || !eng || !idx) goto done;
    size_t m = rolling(r, slot, window, pos, eng, idx);
    double xs = pw / (double)(n > 1 ? n - 1 : 1), ys = ph / 100.0;
    double y0 = mt + ph;
    fprintf(f,
            "<svg %s%s%s class=\"plot\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" role=\"img\" data-slot=\"%ld\" "
            "data-xs=\"%.6f\" data-ml=\"%.0f\">\n",
            id ? "id=\"" : "", id ? id : "", id ? "\"" : "", w, h, w, h, slot,
            xs, ml);
    fprintf(f, "<text x=\"%.0f\" y=\"14\" style=\"font-weight:600\">", ml);
    esc(f, title);
    fputs("</text>\n", f);
    for (int g = 0; g <= 100; g += 25) {
        fprintf(f,
                "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"%s\"/><text x=\"%.0f\" y=\"%.1f\" "
                "text-anchor=\"end\">%d%%</text>\n",
                ml, ml + pw, y0 - g * ys, y0 - g * ys, g ? "#eee" : "#999",
                ml - 4, y0 - g * ys + 4, g);
    }
    for (int t = 0; t <= 4 && n > 0; t++) {
        size_t k = (size_t)((double)(n - 1) * t / 4);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">"
                "%llu</text>\n",
                ml + (double)k * xs, (double)h - 6,
                (unsigned long long)r->prompts[k].id);
    }
    size_t marks = 0;
    for (size_t k = 0; k < n; k++) marks += r->prompts[k].diverged;
    /* many marks: fainter, so the lines stay readable */
    double opacity = marks > MANY_MARKS ? 0.18 : 0.55;
    for (size_t k = 0; k < n; k++) {
        const check_prompt *p = &r->prompts[k];
        if (!p->diverged) continue;
        if (slot >= 0 && p->slot != (uint32_t)slot && p->divergent_slot != slot)
            continue;
        fprintf(f,
                "<line class=\"divmark\" x1=\"%.1f\" x2=\"%.1f\" "
                "y1=\"%.0f\" y2=\"%.1f\" stroke=\"#d93025\" "
                "stroke-opacity=\"%.2f\"><title>prompt %llu: %s</title>"
                "</line>\n",
                ml + (double)k * xs, ml + (double)k * xs, mt, y0, opacity,
                (unsigned long long)p->id, check_reason_name(p->reason));
    }
    polyline(f, pos, eng, m, ml, xs, y0, ys,
             "class=\"engine\" stroke=\"#4a90d9\" stroke-width=\"4\" "
             "stroke-opacity=\"0.45\"");
    polyline(f, pos, idx, m, ml, xs, y0, ys,
             "class=\"index\" stroke=\"#c4540a\" stroke-width=\"1.4\" "
             "stroke-dasharray=\"5 3\"");
    fputs("</svg>\n", f);
done:
    kvo_free(pos);
    kvo_free(eng);
    kvo_free(idx);
}

static void summary_row(FILE *f, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void summary_row(FILE *f, const char *k, const char *fmt, ...) {
    char v[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof(v), fmt, ap);
    va_end(ap);
    fputs("<tr><th>", f);
    esc(f, k);
    fputs("</th><td class=\"n\">", f);
    esc(f, v);
    fputs("</td></tr>\n", f);
}

/* A hash cell: "-" when absent, marked bad when it differs from the
 * other side's. */
static void hash_cell(FILE *f, bool has, uint64_t v, bool bad) {
    if (!has)
        fprintf(f, "<td%s>&ndash;</td>", bad ? " class=\"bad\"" : "");
    else
        fprintf(f, "<td%s>%llu</td>", bad ? " class=\"bad\"" : "",
                (unsigned long long)v);
}

/* The evidence of a divergence side by side: per block of the chain, the
 * engine's (hash, parent, tokens_hash, copies) and the index's (held,
 * parent, tokens_hash, other holders); what disagrees is marked. */
static void chain_panel(FILE *f, const check_prompt *p) {
    fprintf(f,
            "<details><summary>engine and index, block by block (from "
            "block %u)</summary><table class=\"chain\">"
            "<tr><th rowspan=\"2\">block</th><th colspan=\"4\">engine "
            "(probe)</th><th colspan=\"4\">index (/lookup)</th></tr><tr>"
            "<th>hash</th><th>parent</th><th>tokens_hash</th><th>copies</th>"
            "<th>held</th><th>parent</th><th>tokens_hash</th><th>other "
            "holders</th></tr>\n",
            p->rows[0].block);
    for (uint32_t i = 0; i < p->n_rows; i++) {
        const check_chain_block *e = &p->rows[i].engine;
        const check_lookup *x = &p->rows[i].index;
        bool held_bad = e->cached != x->held;
        bool parent_bad =
            x->held && (x->has_parent != e->has_parent ||
                        (x->has_parent && x->parent != e->parent));
        bool tok_bad = x->held && x->tokens_hash != e->tokens_hash;
        fprintf(f, "<tr><td class=\"n\">%u</td>", p->rows[i].block);
        hash_cell(f, true, e->hash, false);
        hash_cell(f, e->has_parent, e->parent, parent_bad);
        hash_cell(f, true, e->tokens_hash, tok_bad);
        fprintf(f, "<td class=\"n%s\">%u</td><td%s>%s</td>",
                held_bad ? " bad" : "", e->copies,
                held_bad ? " class=\"bad\"" : "", x->held ? "yes" : "no");
        hash_cell(f, x->held && x->has_parent, x->parent, parent_bad);
        hash_cell(f, x->held, x->tokens_hash, tok_bad);
        fputs("<td>", f);
        for (uint32_t h = 0; h < x->n_holders; h++)
            fprintf(f, "%s%u.%u", h ? ", " : "", x->holders[h].worker,
                    x->holders[h].dp_rank);
        if (x->others > x->n_holders)
            fprintf(f, " (+%llu)",
                    (unsigned long long)(x->others - x->n_holders));
        fputs("</td></tr>\n", f);
    }
    fputs("</table></details>", f);
}

static void prompt_row(FILE *f, const check_prompt *p) {
    fprintf(f,
            "<tr%s><td class=\"n\">%llu</td><td class=\"n\">%u</td>"
            "<td class=\"n\">%u</td><td class=\"n\">%u</td>"
            "<td class=\"n\">%u</td><td class=\"n\">%d</td>"
            "<td class=\"n\">%u</td><td class=\"n\">",
            p->diverged ? " class=\"div\"" : "", (unsigned long long)p->id,
            p->worker, p->dp_rank, p->prompt_tokens, p->prompt_blocks,
            p->engine_hit_blocks, p->index_hit_blocks);
    if (p->diverged)
        fprintf(f, "%d", p->first_divergent_block);
    else
        fputs("&ndash;", f);
    fputs("</td><td>", f);
    if (p->diverged) {
        fputs("<b>", f);
        esc(f, check_reason_name(p->reason));
        fputs("</b> ", f);
        esc(f, p->detail);
        if (p->evidence) {
            fputs("<br><small>", f);
            esc(f, p->evidence);
            fputs("</small>", f);
        }
        if (p->n_rows) chain_panel(f, p);
    }
    fputs("</td></tr>\n", f);
}

static const char PROMPT_HEAD[] =
    "<tr><th>id</th><th>worker</th><th>rank</th><th>tokens</th>"
    "<th>blocks</th><th>engine hit</th><th>index hit</th><th>first "
    "divergent block</th><th>likely reason</th></tr>\n";

static void counters_tables(FILE *f, const check_result *r) {
    const check_counters *c = &r->counters;
    if (c->n == 0) {
        fputs("<p class=\"muted\">No counters were read.</p>\n", f);
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        size_t k;
        for (k = 0; k < i; k++)
            if (strcmp(c->items[k].stage, c->items[i].stage) == 0) break;
        if (k < i) continue;
        fputs("<div class=\"stage\"><table><tr><th colspan=\"2\">", f);
        esc(f, c->items[i].stage);
        fputs("</th></tr>\n", f);
        for (size_t j = i; j < c->n; j++) {
            const check_counter *it = &c->items[j];
            if (strcmp(it->stage, c->items[i].stage) != 0) continue;
            if (strstr(it->name, "_bucket")) continue;
            bool rule = it->rule != NULL;
            bool bad = rule && it->value > 0;
            fprintf(f, "<tr><td%s>", bad ? " class=\"bad\"" : "");
            esc(f, it->name);
            fprintf(f, "%s</td><td class=\"n%s\">%.15g</td></tr>\n",
                    rule ? " <span class=\"muted\" title=\"must stay 0\">"
                           "(must be 0)</span>"
                         : "",
                    bad ? " bad" : "", it->value);
        }
        fputs("</table></div>\n", f);
    }
}

static void time_bar(FILE *f, const check_result *r) {
    static const char *colors[CHECK_STAGE_COUNT] = {
        "#8e6bbf", "#bbbbbb", "#c4540a", "#4a90d9", "#2e9e5b",
        "#e0b040", "#dddddd", "#d93025", "#7fb3e0"};
    double sum = 0;
    for (int s = 0; s < CHECK_STAGE_COUNT; s++) sum += r->stage_s[s];
    if (sum <= 0) {
        fputs("<p class=\"muted\">No timing.</p>\n", f);
        return;
    }
    fprintf(f, "<svg id=\"time-bar\" width=\"%d\" height=\"34\">\n", PLOT_W);
    double x = 0;
    for (int s = 0; s < CHECK_STAGE_COUNT; s++) {
        double w = (PLOT_W - 2) * r->stage_s[s] / sum;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"2\" width=\"%.1f\" height=\"30\" "
                "fill=\"%s\"><title>%s: %.2f s (%.1f%%)</title></rect>\n",
                x + 1, w, colors[s], check_stage_name((check_stage)s),
                r->stage_s[s], 100 * r->stage_s[s] / sum);
        x += w;
    }
    fputs("</svg>\n<p class=\"legend\">", f);
    for (int s = 0; s < CHECK_STAGE_COUNT; s++)
        fprintf(f,
                "<span><i class=\"sw\" style=\"background:%s\"></i>%s "
                "%.2f s (%.1f%%)</span>",
                colors[s], check_stage_name((check_stage)s), r->stage_s[s],
                100 * r->stage_s[s] / sum);
    fputs("</p>\n", f);
}

/* ---- What the router saw (load mode) ----------------------------------------*/

/* Histogram buckets of (routing-time index score - engine hit), blocks. */
static const struct {
    int64_t lo, hi;
    const char *label;
} STALE_BINS[] = {
    {INT64_MIN, -65, "< -64"},
    {-64, -17, "-64..-17"},
    {-16, -5, "-16..-5"},
    {-4, -2, "-4..-2"},
    {-1, -1, "-1"},
    {0, 0, "0"},
    {1, 1, "+1"},
    {2, 4, "+2..+4"},
    {5, 16, "+5..+16"},
    {17, 64, "+17..+64"},
    {65, INT64_MAX, "> +64"},
};
enum {
    STALE_BINS_N = sizeof(STALE_BINS) / sizeof(STALE_BINS[0]),
    HIST_W = 620,
    HIST_H = 200,
    OVER_H = 200
};

static int64_t staleness(const check_prompt *p) {
    return (int64_t)p->routed_index_blocks - p->engine_hit_blocks;
}

/* Bars on a log scale (exact dominates), each labelled with its count. */
static void stale_histogram(FILE *f, const check_result *r) {
    uint64_t n[STALE_BINS_N] = {0}, most = 0;
    for (size_t i = 0; i < r->n_prompts; i++) {
        const check_prompt *p = &r->prompts[i];
        if (p->engine_hit_blocks < 0) continue;
        int64_t d = staleness(p);
        for (int b = 0; b < STALE_BINS_N; b++)
            if (d >= STALE_BINS[b].lo && d <= STALE_BINS[b].hi) n[b]++;
    }
    for (int b = 0; b < STALE_BINS_N; b++)
        if (n[b] > most) most = n[b];
    const double ml = 10, mt = 20, mb = 34;
    double pw = HIST_W - 2 * ml, ph = HIST_H - mt - mb;
    double bw = pw / STALE_BINS_N, top = log10(1.0 + (double)most);
    fprintf(f,
            "<svg id=\"stale-hist\" width=\"%d\" height=\"%d\" role=\"img\">"
            "\n",
            HIST_W, HIST_H);
    for (int b = 0; b < STALE_BINS_N; b++) {
        double h = top > 0 ? ph * log10(1.0 + (double)n[b]) / top : 0;
        double x = ml + b * bw;
        const char *color = STALE_BINS[b].lo > 0   ? "#d93025"
                            : STALE_BINS[b].hi < 0 ? "#4a90d9"
                                                   : "#2e9e5b";
        fprintf(f,
                "<rect class=\"bin\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                "height=\"%.1f\" fill=\"%s\"><title>%s: %llu requests"
                "</title></rect>\n",
                x + 2, mt + ph - h, bw - 4, h, color, STALE_BINS[b].label,
                (unsigned long long)n[b]);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%llu"
                "</text><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
                "%s</text>\n",
                x + bw / 2, mt + ph - h - 4, (unsigned long long)n[b],
                x + bw / 2, (double)HIST_H - 14, STALE_BINS[b].label);
    }
    fputs("</svg>\n", f);
}

/* Per window of requests (trace order): the largest over- and
 * under-estimate as a bar up and down from 0, and the share of exact
 * scores as a line (right axis, %). */
static void stale_over_trace(FILE *f, const check_result *r) {
    size_t n = r->n_prompts;
    if (!n) return;
    size_t win = (n + MAX_POINTS - 1) / MAX_POINTS;
    int64_t ymax = 4;
    for (size_t i = 0; i < n; i++) {
        if (r->prompts[i].engine_hit_blocks < 0) continue;
        int64_t d = staleness(&r->prompts[i]);
        if (llabs(d) > ymax) ymax = llabs(d);
    }
    const double ml = 48, mr = 40, mt = 14, mb = 24;
    double pw = PLOT_W - ml - mr, ph = OVER_H - mt - mb, y0 = mt + ph / 2;
    double xs = pw / (double)(n > 1 ? n - 1 : 1), ys = ph / 2 / (double)ymax;
    fprintf(f,
            "<svg id=\"stale-trace\" width=\"%d\" height=\"%d\" "
            "role=\"img\">\n",
            PLOT_W, OVER_H);
    fprintf(f,
            "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#999\"/>\n<text x=\"%.0f\" y=\"%.1f\" "
            "text-anchor=\"end\">+%lld</text><text x=\"%.0f\" y=\"%.1f\" "
            "text-anchor=\"end\">0</text><text x=\"%.0f\" y=\"%.1f\" "
            "text-anchor=\"end\">-%lld</text>\n",
            ml, ml + pw, y0, y0, ml - 4, mt + 8, (long long)ymax, ml - 4,
            y0 + 4, ml - 4, mt + ph, (long long)ymax);
    fputs("<path class=\"exact\" fill=\"none\" stroke=\"#2e9e5b\" "
          "stroke-width=\"1.4\" d=\"",
          f);
    for (size_t i = 0; i < n; i += win) {
        size_t known = 0, exact = 0;
        for (size_t k = i; k < n && k < i + win; k++) {
            if (r->prompts[k].engine_hit_blocks < 0) continue;
            known++;
            exact += staleness(&r->prompts[k]) == 0;
        }
        double pc = known ? 100.0 * (double)exact / (double)known : 100;
        fprintf(f, "%s%.1f,%.1f", i ? " L" : "M", ml + (double)i * xs,
                mt + ph - pc / 100 * ph);
    }
    fputs("\"/>\n", f);
    for (size_t i = 0; i < n; i += win) {
        int64_t hi = 0, lo = 0;
        for (size_t k = i; k < n && k < i + win; k++) {
            if (r->prompts[k].engine_hit_blocks < 0) continue;
            int64_t d = staleness(&r->prompts[k]);
            if (d > hi) hi = d;
            if (d < lo) lo = d;
        }
        double x = ml + (double)i * xs;
        if (hi > 0)
            fprintf(f,
                    "<line class=\"over\" x1=\"%.1f\" x2=\"%.1f\" "
                    "y1=\"%.1f\" y2=\"%.1f\" stroke=\"#d93025\"/>\n",
                    x, x, y0, y0 - (double)hi * ys);
        if (lo < 0)
            fprintf(f,
                    "<line class=\"under\" x1=\"%.1f\" x2=\"%.1f\" "
                    "y1=\"%.1f\" y2=\"%.1f\" stroke=\"#4a90d9\"/>\n",
                    x, x, y0, y0 - (double)lo * ys);
    }
    fprintf(f,
            "<text x=\"%.0f\" y=\"%.1f\">100%% exact</text>"
            "<text x=\"%.0f\" y=\"%.1f\">0%%</text>\n",
            ml + pw + 2, mt + 8, ml + pw + 2, mt + ph);
    fputs("</svg>\n", f);
}

static void router_view(FILE *f, const check_result *r) {
    check_staleness s;
    if (check_result_staleness(r, &s) != KVO_OK || !s.requests) return;
    fputs("<h2>What the router saw</h2>\n<p class=\"muted\">Per request, the "
          "chosen worker's index score when it was routed (capped like the "
          "engine) minus the engine's hit: positive, the index claimed blocks "
          "the engine no longer had (or not yet); negative, it lagged the "
          "engine's stores. Reported, not judged: exactness is checked at "
          "the checkpoints.</p>\n<table id=\"staleness\">\n",
          f);
    summary_row(f, "requests", "%llu", (unsigned long long)s.requests);
    summary_row(f, "exact", "%.1f %%", pct(s.exact, s.requests));
    summary_row(f, "index above the engine",
                "%.1f %% (p50 %u, p99 %u, max %u "
                "blocks)",
                pct(s.over, s.requests), s.over_p50, s.over_p99, s.over_max);
    summary_row(f, "index below the engine",
                "%.1f %% (p50 %u, p99 %u, max %u "
                "blocks)",
                pct(s.under, s.requests), s.under_p50, s.under_p99,
                s.under_max);
    summary_row(f, "|difference|", "p50 %u, p99 %u, max %u blocks", s.abs_p50,
                s.abs_p99, s.abs_max);
    summary_row(f, "hit rate promised / achieved", "%.2f %% / %.2f %%",
                pct(s.promised_tokens, s.prompt_tokens),
                pct(s.achieved_tokens, s.prompt_tokens));
    fputs("</table>\n<h3>Staleness histogram (blocks, log scale)</h3>\n", f);
    stale_histogram(f, r);
    fputs("<h3>Staleness over the trace</h3>\n<p class=\"legend\"><span><i "
          "class=\"sw\" style=\"background:#d93025\"></i>largest "
          "over-estimate</span><span><i class=\"sw\" style=\"background:"
          "#4a90d9\"></i>largest under-estimate</span><span><i class=\"sw\" "
          "style=\"background:#2e9e5b\"></i>exact (%, right axis)</span> per "
          "window of requests in trace order</p>\n",
          f);
    stale_over_trace(f, r);
}

/* ---- Faults, checkpoints and the regime -------------------------------------*/

/* The faults injected (--*-restart-at, --nats-kill-at, --chaos): when,
 * what, how long the part was down, when the index was exact again, and
 * what the indexer's recovery did. */
static void faults_table(FILE *f, const check_result *r) {
    if (!r->n_faults) return;
    fputs("<h2>Faults</h2>\n<p class=\"muted\">Each process was killed "
          "(SIGKILL) before the request named and started again; the run "
          "went on once it was ready, and every prompt after it was judged "
          "as any other.</p>\n<table id=\"faults\"><tr><th>before "
          "request</th><th>fault</th><th>back (ms)</th><th>index exact "
          "again (ms)</th><th>what happened</th></tr>\n",
          f);
    for (size_t i = 0; i < r->n_faults; i++) {
        const check_fault *x = &r->faults[i];
        char line[400];
        check_fault_text(x, line, sizeof(line));
        fprintf(f, "<tr%s><td class=\"n\">%llu</td><td>",
                x->done && x->heal_ms >= 0 ? "" : " class=\"div\"",
                (unsigned long long)x->at);
        esc(f, check_fault_kind_name(x->kind));
        fputs(" ", f);
        esc(f, x->target[0] ? x->target : "(not done)");
        if (x->done)
            fprintf(f, "</td><td class=\"n\">%.0f</td>", x->down_ms);
        else
            fputs("</td><td class=\"n\">&ndash;</td>", f);
        if (x->heal_ms >= 0)
            fprintf(f, "<td class=\"n\">%.0f</td><td>", x->heal_ms);
        else
            fputs("<td class=\"n bad\">never</td><td>", f);
        esc(f, line);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

/* One tier's block sets in a checkpoint row: equal, or the differences. */
static void sets_cell(FILE *f, const check_set_diff *d) {
    if (d->n[0] + d->n[1] + d->n[2] == 0)
        fputs("equal", f);
    else
        fprintf(f, "%llu engine only, %llu index only, %llu parent",
                (unsigned long long)d->n[CHECK_DIFF_ENGINE_ONLY],
                (unsigned long long)d->n[CHECK_DIFF_INDEX_ONLY],
                (unsigned long long)d->n[CHECK_DIFF_PARENT]);
}

static void checkpoints_table(FILE *f, const check_result *r) {
    if (!r->n_ckpts) return;
    fputs("<h2>Checkpoints</h2>\n<p class=\"muted\">Traffic stopped, every "
          "request answered, the index synced; then every (worker, rank)'s "
          "cached block set (hashes and parents) against the index's (lists "
          "fetched only where the digests differ), and recent prompts "
          "re-checked on every worker.</p>\n<table id=\"checkpoints\"><tr>"
          "<th>#</th><th>after</th><th>block sets</th><th>engine / index "
          "blocks</th><th>lists</th><th>re-checked</th><th>time (s)</th>"
          "<th>result</th></tr>\n",
          f);
    for (size_t i = 0; i < r->n_ckpts; i++) {
        const check_checkpoint *c = &r->ckpts[i];
        bool bad = check_checkpoint_failed(c);
        uint64_t eb = 0, ib = 0, lists = 0;
        for (uint32_t s = 0; s < r->n_slots; s++) {
            eb += c->slots[s].engine_blocks;
            ib += c->slots[s].index_blocks;
            lists += c->slots[s].listed;
        }
        lists += c->cpu.listed;
        fprintf(f,
                "<tr%s><td class=\"n\">%u%s</td><td class=\"n\">%llu</td>"
                "<td>",
                bad ? " class=\"div\"" : "", c->number,
                c->final ? " (end)" : "", (unsigned long long)c->after);
        if (!c->sets)
            esc(f, c->sets_note);
        else
            sets_cell(f, &c->diff);
        if (c->cpu.ranks) { /* the CPU tier's, on a line of its own */
            fputs("<br>tier cpu: ", f);
            if (c->cpu.note[0]) {
                fprintf(f, "%u of %u ranks compared: ", c->cpu.compared,
                        c->cpu.ranks);
                esc(f, c->cpu.note);
            } else {
                sets_cell(f, &c->cpu.diff);
            }
        }
        fprintf(f,
                "</td><td class=\"n\">%llu / %llu</td><td class=\"n\">%llu"
                "</td><td class=\"n\">%llu (%llu divergent)</td><td "
                "class=\"n\">%.3f</td><td>",
                (unsigned long long)eb, (unsigned long long)ib,
                (unsigned long long)lists, (unsigned long long)c->sweep_prompts,
                (unsigned long long)c->sweep_divergent,
                c->drain_s + c->sync_s + c->sets_s + c->sweep_s);
        if (bad) {
            char cause[400];
            check_checkpoint_cause(r, c, cause, sizeof(cause));
            fputs("<b class=\"bad\">FAIL</b> ", f);
            esc(f, cause);
            for (size_t k = 0; k < c->diff.n_first; k++) {
                char d[300];
                check_block_diff_text(r, &c->diff.first[k], d, sizeof(d));
                fputs("<br>", f);
                esc(f, d);
            }
            for (size_t k = 0; k < c->cpu.diff.n_first; k++) {
                char d[300];
                check_block_diff_text(r, &c->cpu.diff.first[k], d, sizeof(d));
                fputs("<br>tier cpu: ", f);
                esc(f, d);
            }
        } else {
            fputs("ok", f);
        }
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void regime_table(FILE *f, const check_result *r) {
    check_regime g;
    check_result_regime(r, &g);
    if (!g.known) return;
    fputs("<h2>Engine regime</h2>\n<table id=\"regime\">\n", f);
    for (int k = 0; k < CHECK_REGIME_COUNT; k++)
        summary_row(f, check_regime_what((check_regime_item)k), "%.0f", g.v[k]);
    fputs("</table>\n", f);
}

/* Hover: the nearest request under the mouse, from a compact table; and a
 * marker proving the page was laid out (tests read it from the DOM). */
static const char JS[] =
    "(function(){var P=JSON.parse(document.getElementById('pdata')"
    ".textContent);var R=JSON.parse(document.getElementById('rnames')"
    ".textContent);var tip=document.getElementById('tip');"
    "document.querySelectorAll('svg.plot').forEach(function(s){"
    "s.addEventListener('mousemove',function(ev){var "
    "b=s.getBoundingClientRect();"
    "var xs=+s.dataset.xs,ml=+s.dataset.ml;var k=Math.round((ev.clientX-b.left"
    "-ml)/xs);if(k<0||k>=P.length){tip.style.display='none';return;}"
    "var p=P[k];tip.textContent='prompt '+p[0]+'  worker '+p[1]+' rank '+p[2]"
    "+'\\ntokens '+p[3]+'  engine hit '+p[4]+'  index hit '+p[5]+' blocks'"
    "+(p[6]?'\\nDIVERGED: '+R[p[6]]:'');tip.style.display='block';"
    "tip.style.left=(ev.clientX+12)+'px';tip.style.top=(ev.clientY+12)+'px';});"
    "s.addEventListener('mouseleave',function(){tip.style.display='none';});});"
    "var main=document.querySelector('#hit-plot polyline.engine');"
    "var ok=main&&main.getBBox().width>0&&document.getElementById('summary')"
    ".getBoundingClientRect().height>0;"
    "document.body.setAttribute('data-rendered',ok?'ok':'empty');"
    "document.body.setAttribute('data-prompts',String(P.length));})();";

kvo_status check_report_html(FILE *f, const check_result *r) {
    check_totals t;
    check_result_totals(r, &t);
    fprintf(f,
            "<!doctype html>\n<html lang=\"en\"><head><meta "
            "charset=\"utf-8\"><title>kvo-check report</title>\n<style>%s"
            "</style></head>\n<body>\n<h1>kvo-check report</h1>\n",
            CSS);
    fprintf(f, "<div id=\"verdict\" class=\"verdict %s\">%s",
            r->verdict.pass ? "pass" : "fail",
            r->verdict.pass ? "PASS &mdash; the index matched the engines on "
                              "every prompt"
                            : "FAIL");
    if (!r->verdict.pass) {
        fputs("<div class=\"cause\">", f);
        esc(f, r->verdict.cause);
        fputs("</div>", f);
    }
    fputs("</div>\n", f);

    /* Summary */
    fputs("<h2>Summary</h2>\n<table id=\"summary\">\n", f);
    summary_row(f, "requests", "%llu of %llu", (unsigned long long)t.requests,
                (unsigned long long)r->planned);
    summary_row(f, "slots (worker x dp rank)", "%u (dp size %u)", r->n_slots,
                r->dp_size);
    summary_row(f, "block size", "%u", r->block_size);
    summary_row(f, "prompt tokens", "%llu (%llu blocks)",
                (unsigned long long)t.prompt_tokens,
                (unsigned long long)t.prompt_blocks);
    summary_row(f, "engine hit rate", "%.2f %%",
                pct(t.engine_hit_tokens, t.prompt_tokens));
    summary_row(f, "index hit rate (capped like the engine)", "%.2f %%",
                pct(t.index_hit_tokens, t.prompt_tokens));
    summary_row(f, "index score rate (uncapped)", "%.2f %%",
                pct(t.index_raw_blocks, t.prompt_blocks));
    summary_row(f, "divergent prompts", "%llu",
                (unsigned long long)t.divergent);
    if (r->n_sweep)
        summary_row(f, "re-checked after the run (sweep)",
                    "%zu prompts, %zu divergent", r->n_sweep,
                    r->sweep_divergent);
    if (r->wall_s > 0)
        summary_row(f, "wall time", "%.2f s (%.1f requests/s)", r->wall_s,
                    (double)t.requests / r->wall_s);
    summary_row(f, "mode", "%s", r->load.on ? "load" : "lockstep");
    if (r->load.on)
        summary_row(f, "load", "%s %u, speedup %g, at most %u in flight",
                    r->load.arrival == CHECK_ARRIVAL_TRACE
                        ? "trace arrivals, at most"
                        : "closed loop, concurrency",
                    r->load.concurrency, r->load.speedup, r->load.max_inflight);
    if (r->n_ckpts) {
        size_t failed = 0;
        for (size_t i = 0; i < r->n_ckpts; i++)
            failed += check_checkpoint_failed(&r->ckpts[i]);
        summary_row(f, "checkpoints", "%zu, %zu failed", r->n_ckpts, failed);
    }
    if (r->config[0]) summary_row(f, "configuration", "%s", r->config);
    fputs("</table>\n", f);

    /* Plots */
    size_t n = r->n_prompts;
    size_t window = n / WINDOW_SPANS;
    if (window < WINDOW_MIN) window = WINDOW_MIN;
    if (window > WINDOW_MAX) window = WINDOW_MAX;
    fprintf(f,
            "<h2>Hit rate over the trace</h2>\n<p class=\"legend\">"
            "<span><i class=\"sw\" style=\"background:#4a90d9;opacity:.5\">"
            "</i>engine (cached tokens)</span><span><i class=\"sw\" "
            "style=\"background:#c4540a\"></i>index (capped)</span><span>"
            "<i class=\"sw\" style=\"background:#d93025;width:3px;"
            "height:12px\"></i>divergent prompt</span> rolling window of "
            "%zu requests, token-weighted; hover for details</p>\n",
            window);
    chart(f, r, -1, window, PLOT_W, PLOT_H, "hit-plot", "all requests");
    fputs("<div id=\"slot-plots\">\n", f);
    size_t sw = window / (r->n_slots ? r->n_slots : 1);
    if (sw < SLOT_WINDOW_MIN) sw = SLOT_WINDOW_MIN;
    for (uint32_t s = 0; s < r->n_slots; s++) {
        char title[64];
        snprintf(title, sizeof(title), "worker %u rank %u", r->slots[s].worker,
                 r->slots[s].dp_rank);
        fputs("<div class=\"small\">", f);
        chart(f, r, s, sw, SMALL_W, SMALL_H, NULL, title);
        fputs("</div>\n", f);
    }
    fputs("</div>\n", f);

    /* Divergences */
    char classes[512];
    check_totals_classes(&t, classes, sizeof(classes));
    fprintf(f,
            "<h2>Divergences (%llu during the run, %llu re-checked at "
            "checkpoints)</h2>\n",
            (unsigned long long)t.divergent,
            (unsigned long long)t.sweep_divergent);
    if (classes[0]) {
        fputs("<p>By class: ", f);
        esc(f, classes);
        fputs("</p>\n", f);
    }
    if (t.divergent == 0 && r->sweep_divergent == 0) {
        fputs("<p id=\"divergences\">None: on every prompt, every worker's "
              "index score (capped) equals the engine's hit blocks.</p>\n",
              f);
    } else {
        fprintf(f, "<table id=\"divergences\">\n%s", PROMPT_HEAD);
        size_t shown = 0;
        for (size_t k = 0; k < n && shown < DIVERGENCE_ROWS; k++)
            if (r->prompts[k].diverged) {
                prompt_row(f, &r->prompts[k]);
                shown++;
            }
        for (size_t k = 0; k < r->n_sweep && shown < DIVERGENCE_ROWS; k++)
            if (r->sweep[k].diverged) {
                if (shown++ == t.divergent)
                    fputs("<tr><th colspan=\"9\">re-checked after the run "
                          "(sweep): no request sent, every worker probed"
                          "</th></tr>\n",
                          f);
                prompt_row(f, &r->sweep[k]);
            }
        fputs("</table>\n", f);
        if (shown < t.divergent + r->sweep_divergent)
            fprintf(f,
                    "<p class=\"muted\">first %zu shown; all are in the "
                    "JSON report</p>\n",
                    shown);
    }
    if (r->n_trips) {
        fputs("<h2>Counters that must stay 0</h2>\n<table id=\"trips\"><tr>"
              "<th>stage</th><th>counter</th><th>value</th><th>first seen "
              "before prompt</th><th>meaning</th></tr>\n",
              f);
        for (size_t i = 0; i < r->n_trips; i++) {
            const check_trip *tp = &r->trips[i];
            fputs("<tr><td>", f);
            esc(f, tp->stage);
            fputs("</td><td class=\"bad\">", f);
            esc(f, tp->name);
            fprintf(f, "</td><td class=\"n\">%.15g</td><td class=\"n\">",
                    tp->value);
            if (tp->before_prompt >= 0)
                fprintf(f, "%lld", (long long)tp->before_prompt);
            else
                fputs("end", f);
            fputs("</td><td>", f);
            esc(f, check_reason_name(tp->rule->reason));
            fputs(": ", f);
            esc(f, tp->rule->what);
            fputs("</td></tr>\n", f);
        }
        fputs("</table>\n", f);
    }

    faults_table(f, r);
    checkpoints_table(f, r);
    if (r->load.on) router_view(f, r);
    regime_table(f, r);

    /* Worst prompts */
    fputs("<h2>Worst prompts</h2>\n<p class=\"muted\">Divergent first, then "
          "the lowest engine hit rate.</p>\n<table id=\"worst\">\n",
          f);
    fputs(PROMPT_HEAD, f);
    const check_prompt *worst[WORST_ROWS];
    size_t nw = check_result_worst(r, worst, KVO_ARRAY_LEN(worst));
    for (size_t k = 0; k < nw; k++) prompt_row(f, worst[k]);
    fputs("</table>\n", f);

    fputs("<h2>Counters per stage</h2>\n<div id=\"counters\">\n", f);
    counters_tables(f, r);
    fputs("</div>\n<h2>Where the time went</h2>\n", f);
    time_bar(f, r);

    /* Data for the hover, then the script. */
    fputs("<div id=\"tip\"></div>\n<script type=\"application/json\" "
          "id=\"rnames\">[",
          f);
    for (int k = 0; k < CHECK_REASON_COUNT; k++)
        fprintf(f, "%s\"%s\"", k ? "," : "",
                check_reason_name((check_reason)k));
    fputs("]</script>\n<script type=\"application/json\" id=\"pdata\">[", f);
    for (size_t k = 0; k < n; k++) {
        const check_prompt *p = &r->prompts[k];
        fprintf(f, "%s[%llu,%u,%u,%u,%d,%u,%d]", k ? "," : "",
                (unsigned long long)p->id, p->worker, p->dp_rank,
                p->prompt_tokens, p->engine_hit_blocks, p->index_hit_blocks,
                p->diverged ? (int)p->reason : 0);
    }
    fprintf(f, "]</script>\n<script>%s</script>\n</body></html>\n", JS);
    return ferror(f) ? KVO_EIO : KVO_OK;
}
