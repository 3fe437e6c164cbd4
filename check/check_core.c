/* check_core.c -- the pure part of the oracle: counters of every stage, the
 * rules that say which counters must stay 0, the per-prompt judge and the
 * verdict. No sockets, no clocks, no logging: the tests feed it by hand.
 *
 * Judging one prompt of n tokens, block size bs, cap = (n-1)//bs:
 *
 *   slot s:   index says  i[s] = min(score[s], cap)
 *             engine says e[s] = probe hit blocks (already capped by it)
 *   chosen c: engine says cached_tokens / bs   (must equal e[c] when probed)
 *
 * Where a router by design sees less than the engine hits (a hybrid
 * model's full-attention group, the GPU tier of a tiered cache), the probe
 * gives both: e[s] is what the router must score, and the engine's own hit
 * (probe_cache_hits) is what the response must agree with.
 *
 *   diverged  <=>  some slot has i[s] != e[s]   (or the chosen one differs
 *                  from the response)
 *   first divergent block = min(i[s], e[s]) over diverging slots: the first
 *                  block one side holds and the other does not.
 *
 * A tiered cache is judged on its CPU tier too, once every GPU run agrees
 * (the GPU view first: it is what a router scores, and the evidence speaks
 * of it):
 *
 *   slot s:   index says  h[s] = min(host_pinned score[s], cap)  (the
 *                         device run plus the host_pinned run after it;
 *                         the device score where the index gave no tiers)
 *             engine says c[s] = GPU run + the CPU run after it, capped
 *                         (probe_cache_hits: what vLLM loads back)
 *   diverged  <=>  some tiered slot has h[s] != c[s]; first divergent
 *                  block = min(h[s], c[s]). An index that ignores the
 *                  tier diverges wherever the engine has a CPU run.
 *
 * The likely reason, most specific first: the engine contradicting itself;
 * a sibling rank of the same worker holding what this rank lacks (wrong
 * rank); a rule counter that moved since the previous prompt (hash mismatch,
 * unknown parent, seq gap, rejected event...); one that tripped earlier; and
 * else the direction: index behind = missed store, index ahead = stale block.
 */
#include "check_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- Counters ------------------------------------------------------------*/

/* A Prometheus sample's name with its labels, and its value's text: longer
 * ones are skipped, not cut (a cut name would be another counter). */
#define PROM_NAME_MAX 512
#define PROM_VALUE_MAX 64
/* A JSON counter object: nesting levels flattened, and the length of a
 * leaf's dotted path; deeper or longer leaves are skipped. */
#define JSON_DEPTH_MAX 16
#define JSON_PATH_MAX 512

void check_counters_init(check_counters *c) { memset(c, 0, sizeof(*c)); }

void check_counters_clear(check_counters *c) {
    for (size_t i = 0; i < c->n; i++) {
        kvo_free(c->items[i].stage);
        kvo_free(c->items[i].name);
    }
    c->n = 0;
    c->hint = 0;
}

void check_counters_fini(check_counters *c) {
    check_counters_clear(c);
    kvo_free(c->items);
    memset(c, 0, sizeof(*c));
}

static uint64_t counter_key(const char *stage, const char *name) {
    uint64_t h = XXH3_64bits(stage, strlen(stage));
    return XXH3_64bits_withSeed(name, strlen(name), h);
}

static long find_key(const check_counters *c, uint64_t key, const char *stage,
                     const char *name) {
    size_t n = c->n;
    for (size_t k = 0; k < n; k++) {
        size_t i = (c->hint + k) % n;
        if (c->items[i].key == key && strcmp(c->items[i].name, name) == 0 &&
            strcmp(c->items[i].stage, stage) == 0)
            return (long)i;
    }
    return -1;
}

static long counters_find(const check_counters *c, const char *stage,
                          const char *name) {
    return find_key(c, counter_key(stage, name), stage, name);
}

/* Owned copies of a counter's stage and name: both, or neither and
 * KVO_ENOMEM. */
static kvo_status names_dup(const check_counter *src, char **stage,
                            char **name) {
    *stage = kvo_strdup(src->stage);
    *name = kvo_strdup(src->name);
    if (*stage && *name) return KVO_OK;
    kvo_free(*stage);
    kvo_free(*name);
    return KVO_ENOMEM;
}

/* Append a counter whose key and rule are known (no lookup). */
static kvo_status counters_push(check_counters *c, const check_counter *src,
                                double value) {
    kvo_status st =
        kvo_grow(&c->items, &c->cap, c->n + 1, sizeof(*c->items), 64);
    if (st != KVO_OK) return st;
    check_counter *it = &c->items[c->n];
    if ((st = names_dup(src, &it->stage, &it->name)) != KVO_OK) return st;
    it->value = value;
    it->key = src->key;
    it->rule = src->rule;
    c->n++;
    c->hint = 0;
    return KVO_OK;
}

kvo_status check_counters_set(check_counters *c, const char *stage,
                              const char *name, double value) {
    uint64_t key = counter_key(stage, name);
    long i = find_key(c, key, stage, name);
    if (i >= 0) {
        c->items[i].value = value;
        c->hint = ((size_t)i + 1) % c->n;
        return KVO_OK;
    }
    check_counter it = {.stage = (char *)stage,
                        .name = (char *)name,
                        .key = key,
                        .rule = check_rule_find(stage, name)};
    return counters_push(c, &it, value);
}

double check_counters_get(const check_counters *c, const char *stage,
                          const char *name) {
    long i = counters_find(c, stage, name);
    return i < 0 ? NAN : c->items[i].value;
}

/* Does s contain any of the '|'-separated alternatives of pat? */
static bool contains_any(const char *s, const char *pat) {
    const char *p = pat;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len > 0) {
            for (const char *q = s; *q; q++)
                if (strncmp(q, p, len) == 0) return true;
        }
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

double check_counters_sum(const check_counters *c, const char *stage_prefix,
                          const char *match) {
    double sum = 0;
    size_t pl = strlen(stage_prefix);
    for (size_t i = 0; i < c->n; i++)
        if (strncmp(c->items[i].stage, stage_prefix, pl) == 0 &&
            contains_any(c->items[i].name, match) && !isnan(c->items[i].value))
            sum += c->items[i].value;
    return sum;
}

kvo_status check_counters_copy(check_counters *dst, const check_counters *src) {
    /* Fast path, once per prompt in the driver: same names, same order. */
    bool same = dst->n == src->n;
    for (size_t i = 0; same && i < src->n; i++)
        same = dst->items[i].key == src->items[i].key;
    if (same) {
        for (size_t i = 0; i < src->n; i++)
            dst->items[i].value = src->items[i].value;
        return KVO_OK;
    }
    check_counters_clear(dst);
    for (size_t i = 0; i < src->n; i++) {
        kvo_status st = check_counters_set(
            dst, src->items[i].stage, src->items[i].name, src->items[i].value);
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

kvo_status check_counters_rename_stage(check_counters *c, const char *from,
                                       const char *to) {
    for (size_t i = 0; i < c->n; i++) {
        if (strcmp(c->items[i].stage, from) != 0) continue;
        char *s = kvo_strdup(to);
        if (!s) return KVO_ENOMEM;
        kvo_free(c->items[i].stage);
        c->items[i].stage = s;
        c->items[i].key = counter_key(s, c->items[i].name);
        c->items[i].rule = check_rule_find(s, c->items[i].name);
    }
    return KVO_OK;
}

kvo_status check_counters_moved(check_counters *out, const check_counters *prev,
                                const check_counters *cur) {
    check_counters_clear(out);
    for (size_t i = 0; i < cur->n; i++) {
        const check_counter *it = &cur->items[i];
        double before;
        if (i < prev->n && prev->items[i].key == it->key) {
            before = prev->items[i].value; /* same layout: no search */
        } else {
            long k = find_key(prev, it->key, it->stage, it->name);
            before = k < 0 ? NAN : prev->items[k].value;
        }
        if (isnan(before)) before = 0;
        if (!(it->value > before)) continue;
        kvo_status st = counters_push(out, it, it->value - before);
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

/* Samples whose name starts with relay_prefix (when not NULL) go to
 * relay_stage instead of stage. */
static kvo_status parse_prom(check_counters *c, const char *stage,
                             const char *relay_prefix, const char *relay_stage,
                             const char *text, size_t len) {
    const char *p = text, *end = text + len;
    char name[PROM_NAME_MAX];
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *q = p;
        while (q < eol && (*q == ' ' || *q == '\t')) q++;
        if (q < eol && *q != '#') {
            /* name{labels} value [timestamp]: the key runs to the first
             * blank outside the braces. */
            const char *k = q;
            int depth = 0;
            bool quoted = false;
            while (k < eol) {
                if (quoted) {
                    if (*k == '\\' && k + 1 < eol)
                        k++;
                    else if (*k == '"')
                        quoted = false;
                } else if (*k == '"') {
                    quoted = true;
                } else if (*k == '{') {
                    depth++;
                } else if (*k == '}') {
                    depth--;
                } else if ((*k == ' ' || *k == '\t') && depth == 0) {
                    break;
                }
                k++;
            }
            size_t nl = (size_t)(k - q);
            while (k < eol && (*k == ' ' || *k == '\t')) k++;
            if (nl > 0 && nl < sizeof(name) && k < eol) {
                char num[PROM_VALUE_MAX];
                size_t vl = 0;
                while (k + vl < eol && k[vl] != ' ' && k[vl] != '\t' &&
                       k[vl] != '\r' && vl + 1 < sizeof(num))
                    vl++;
                memcpy(num, k, vl);
                num[vl] = '\0';
                double v;
                if (kvo_parse_double(num, &v) == KVO_OK ||
                    (strcmp(num, "NaN") == 0 && (v = NAN, true)) ||
                    (strcmp(num, "+Inf") == 0 && (v = INFINITY, true))) {
                    memcpy(name, q, nl);
                    name[nl] = '\0';
                    bool relay =
                        relay_prefix &&
                        strncmp(name, relay_prefix, strlen(relay_prefix)) == 0;
                    kvo_status st = check_counters_set(
                        c, relay ? relay_stage : stage, name, v);
                    if (st != KVO_OK) return st;
                }
            }
        }
        p = eol + 1;
    }
    return KVO_OK;
}

kvo_status check_counters_parse_prom(check_counters *c, const char *stage,
                                     const char *text, size_t len) {
    return parse_prom(c, stage, NULL, NULL, text, len);
}

kvo_status check_counters_parse_indexer(check_counters *c, const char *text,
                                        size_t len) {
    return parse_prom(c, "indexer", "kvo_relay_", CHECK_STAGE_INDEXER_PIPES,
                      text, len);
}

static kvo_status parse_json_rec(check_counters *c, const char *stage,
                                 const kvo_jv *j, char *path, size_t plen,
                                 size_t cap, int depth) {
    if (depth > JSON_DEPTH_MAX) return KVO_OK;
    kvo_status st = KVO_OK;
    double v;
    bool b;
    switch (j->type) {
    case KVO_JSON_INT:
    case KVO_JSON_REAL:
        if (plen && kvo_json_num(j, &v))
            st = check_counters_set(c, stage, path, v);
        break;
    case KVO_JSON_BOOL:
        if (plen && kvo_json_bool(j, &b))
            st = check_counters_set(c, stage, path, b ? 1 : 0);
        break;
    case KVO_JSON_OBJ:
        for (uint32_t i = 0; i < j->len && st == KVO_OK; i++) {
            const kvo_jmember *m = &j->v.members[i];
            int n = snprintf(path + plen, cap - plen, "%s%s", plen ? "." : "",
                             m->key);
            if (n >= 0 && (size_t)n < cap - plen)
                st = parse_json_rec(c, stage, &m->value, path, plen + (size_t)n,
                                    cap, depth + 1);
            path[plen] = '\0';
        }
        break;
    case KVO_JSON_ARR:
        for (uint32_t i = 0; i < j->len && st == KVO_OK; i++) {
            kvo_jv e;
            int n =
                snprintf(path + plen, cap - plen, "%s%u", plen ? "." : "", i);
            if (n >= 0 && (size_t)n < cap - plen && kvo_json_at(j, i, &e))
                st = parse_json_rec(c, stage, &e, path, plen + (size_t)n, cap,
                                    depth + 1);
            path[plen] = '\0';
        }
        break;
    default: break;
    }
    return st;
}

kvo_status check_counters_parse_json(check_counters *c, const char *stage,
                                     const kvo_jv *j) {
    char path[JSON_PATH_MAX] = "";
    return parse_json_rec(c, stage, j, path, 0, sizeof(path), 0);
}

/* ---- Reasons and rules ---------------------------------------------------*/

const char *check_reason_name(check_reason r) {
    static const char *names[CHECK_REASON_COUNT] = {
        [CHECK_REASON_NONE] = "",
        [CHECK_REASON_MISSED_STORE] = "missed store",
        [CHECK_REASON_STALE_BLOCK] = "stale block",
        [CHECK_REASON_HASH_MISMATCH] = "hash mismatch",
        [CHECK_REASON_UNKNOWN_PARENT] = "unknown parent",
        [CHECK_REASON_WRONG_RANK] = "wrong rank",
        [CHECK_REASON_SEQ_GAP] = "seq gap",
        [CHECK_REASON_REJECTED] = "rejected event",
        [CHECK_REASON_ENGINE] = "engine inconsistent",
        [CHECK_REASON_ENGINE_ERROR] = "engine error",
        [CHECK_REASON_WRONG_PARENT] = "wrong parent",
        [CHECK_REASON_TOKEN_MISMATCH] = "token mismatch",
        [CHECK_REASON_WRONG_WORKER] = "wrong worker",
        [CHECK_REASON_UNEXPLAINED] = "unexplained",
    };
    return (unsigned)r < CHECK_REASON_COUNT ? names[r] : "?";
}

/* Counters that must stay 0 on a correct pipeline, most telling first. The
 * names are matched loosely (substrings) so that a stage may label its
 * metrics as it likes; samples that are not counts (histograms, config) are
 * excluded explicitly. */
static const check_rule RULES[] = {
    /* kvo-mocker: the per-rank counters of GET /kvo/state, stage "engine
     * <worker>.<rank>" (read after the last request). First in the table:
     * an engine that failed to publish is the cause of whatever the relay
     * and the index show next. Errors, not activity:
     *   render_errors        step batches it could not encode (never sent)
     *   send_errors          batches its ZMQ PUB socket refused
     *   replay_cut           replays cut short (the relay's gap stays open)
     *   replay_bad_requests  replay requests it could not read
     *   ...lost...           events counted as lost (no kvo-mocker counter
     *                        today; an engine that keeps one trips it)
     * Activity may move freely: requests_aborted (a client went away),
     * preemptions, replay_requests and replay_batches (recovery that
     * worked), cleared, blocks_removed, ... . record_errors counts writes to
     * a --record capture file, beside the event stream, not in it. A decode
     * engine (stage "decode engine ...") publishes nothing the index holds,
     * so "engine" as a stage prefix leaves it out. */
    {"engine", "render_errors", NULL, CHECK_REASON_ENGINE_ERROR,
     "step batches the engine could not encode: their events were never "
     "published",
     false},
    {"engine", "send_errors", NULL, CHECK_REASON_ENGINE_ERROR,
     "batches the engine's ZMQ socket refused to publish", false},
    {"engine", "replay_cut|replay_bad_requests", NULL,
     CHECK_REASON_ENGINE_ERROR,
     "replays the engine cut short, or replay requests it could not read",
     false},
    {"engine", "lost", NULL, CHECK_REASON_ENGINE_ERROR,
     "events the engine counted as lost", false},
    /* kvo-relay: kvo_relay_<name> on /metrics, <name> in /stats JSON */
    {"relay", "hash_mismatches", NULL, CHECK_REASON_HASH_MISMATCH,
     "engine hashes that are not H(parent, tokens) (--verify-engine-hash)",
     false},
    {"relay", "oversize", NULL, CHECK_REASON_SEQ_GAP,
     "batches over the relay's --zmq-max-msg-bytes: lost (the rank was "
     "cleared)",
     false},
    {"relay", "replay_failures", NULL, CHECK_REASON_SEQ_GAP,
     "gaps the relay could not replay (the rank was cleared)", false},
    {"relay", "buffer_dropped", NULL, CHECK_REASON_SEQ_GAP,
     "live batches the relay had to drop while it replayed", false},
    /* An envelope NATS refused (a publish into a connection dying before
     * nats.c noticed) stays in the relay's ring: the indexer sees the gap
     * and recovers it, and the prompts judge what it rebuilt. Without an
     * injected fault nothing may be lost at all. */
    {"relay", "publish_dropped", NULL, CHECK_REASON_SEQ_GAP,
     "envelopes NATS refused in a run with no injected fault (each kept in "
     "the relay's ring for the indexer's recovery)",
     true},
    {"relay", "bad_msgs|bad_messages|decode_errors", NULL,
     CHECK_REASON_REJECTED, "ZMQ messages the relay could not decode", false},
    {"relay", "rejects", NULL, CHECK_REASON_REJECTED,
     "events the relay refused (block size, token count, medium, rank)", false},
    {"relay", "removes_unknown", NULL, CHECK_REASON_MISSED_STORE,
     "removes of hashes the relay never saw stored", false},
    /* kvo-relay, clean runs only: a relay answers recovery requests only
     * when an indexer lost something */
    {"relay", "recovery_requests", NULL, CHECK_REASON_SEQ_GAP,
     "recovery requests in a run with no injected fault: recovery must "
     "never hide a bug",
     true},
    /* kvo-indexer */
    {"indexer", "parent_not_found", NULL, CHECK_REASON_UNKNOWN_PARENT,
     "stores whose parent the index does not hold", false},
    /* a recovery that failed leaves workers cleared: with or without
     * faults (the docs' "stale"; gauges, so seen while they last) */
    {"indexer", "recovery_failures|stale_publishers", NULL,
     CHECK_REASON_SEQ_GAP,
     "recoveries that failed: the relay's workers were cleared and marked "
     "stale",
     false},
    /* Clean runs only (check_fault.c): a run with no injected fault sees
     * no gap and no recovery at all. A kill makes them the expected
     * answer, and the prompts and checkpoints judge what they rebuilt.
     * In a clean --spawn run the indexer starts before every relay and
     * hears each from its sequence 0: it asks nobody for a dump. */
    {"indexer", "gap|missed", NULL, CHECK_REASON_SEQ_GAP,
     "event-plane sequence gaps (lost NATS messages) in a run with no "
     "injected fault: recovery must never hide a bug",
     true},
    {"indexer", "recovery_requests|recoveries_|impossible_sequences|live_held",
     NULL, CHECK_REASON_SEQ_GAP,
     "recoveries in a run with no injected fault: something was lost or "
     "jumped, and recovery must never hide a bug",
     true},
    {"indexer", "dropped|slow_consumer", NULL, CHECK_REASON_SEQ_GAP,
     "NATS messages the indexer dropped in a run with no injected fault: "
     "recovery must never hide a bug",
     true},
    {"indexer",
     "invalid_block|decode_error|undecodable|malformed|bad_header|enomem", NULL,
     CHECK_REASON_REJECTED, "messages or blocks the indexer refused", false},
    {"indexer", "block_not_found|blocks_not_found|not_found", NULL,
     CHECK_REASON_MISSED_STORE, "removes of blocks the index never held",
     false},
};

const check_rule *check_rules(size_t *n) {
    *n = KVO_ARRAY_LEN(RULES);
    return RULES;
}

const check_rule *check_rule_find(const char *stage, const char *name) {
    for (size_t i = 0; i < KVO_ARRAY_LEN(RULES); i++) {
        const check_rule *r = &RULES[i];
        if (strncmp(stage, r->stage_prefix, strlen(r->stage_prefix)) != 0)
            continue;
        /* Histogram and summary samples are never rule counters. */
        if (contains_any(name, "_bucket|_sum{|_count{|_seconds")) continue;
        if (contains_any(name, "status=\"ok\"")) continue;
        if (!contains_any(name, r->match)) continue;
        if (r->except && contains_any(name, r->except)) continue;
        return r;
    }
    return NULL;
}

/* ---- Judge -----------------------------------------------------------------*/

/* The first tripped rule among the counters of c (rule-table order). */
static const check_counter *first_rule_counter(const check_counters *c,
                                               const check_rule **rule) {
    const check_counter *best = NULL;
    const check_rule *best_rule = NULL;
    if (!c) return NULL;
    for (size_t i = 0; i < c->n; i++) {
        if (!(c->items[i].value > 0)) continue;
        const check_rule *r = c->items[i].rule;
        if (!r) continue;
        if (!best_rule || r < best_rule) {
            best = &c->items[i];
            best_rule = r;
        }
    }
    *rule = best_rule;
    return best;
}

/* One comparison the judge makes on every slot: the GPU tier (what a
 * router scores against the run the engine holds there) or, with a CPU
 * tier, the engine's GPU+CPU hit against the index's host_pinned score. */
typedef struct view {
    const check_obs *o;
    const uint32_t *scores; /* the GPU view's index side */
    const int32_t *hits;    /* the GPU view's engine side */
    int32_t chosen_truth;   /* the GPU view's chosen slot */
    uint32_t cap;
    bool cpu;
} view;

/* Slot s gave a tiered probe, and the index side is known. */
static bool tiered(const check_obs *o, uint32_t s) {
    return o->probe_hits && o->probe_cache_hits && o->probe_cpu &&
           o->index_host_scores && o->probe_cpu[s] >= 0 &&
           o->probe_hits[s] >= 0 && o->probe_cache_hits[s] >= 0;
}

/* What the engine holds on slot s in view v (-1: not known). */
static int32_t view_engine(const view *v, uint32_t s) {
    if (v->cpu) return tiered(v->o, s) ? v->o->probe_cache_hits[s] : -1;
    return s == v->o->chosen ? v->chosen_truth : v->hits[s];
}

/* What the index scores on slot s in view v, capped like the engine. */
static uint32_t view_index(const view *v, uint32_t s) {
    uint32_t i = v->cpu ? v->o->index_host_scores[s] : v->scores[s];
    return i < v->cap ? i : v->cap;
}

/* The first divergence of view v: the slot (-1: none) and its block (the
 * smaller side; the shallowest over the slots, the chosen one on a tie).
 * In the GPU view the chosen slot also diverges when its probe differs
 * from the response. */
static long view_first(const view *v, long *first_block) {
    const check_obs *o = v->o;
    long first_slot = -1;
    *first_block = -1;
    for (uint32_t s = 0; s < o->n_slots; s++) {
        int32_t e = view_engine(v, s);
        if (e < 0) continue;
        uint32_t i = view_index(v, s);
        bool probe_off =
            !v->cpu && s == o->chosen && v->hits[s] >= 0 && v->hits[s] != e;
        if ((uint32_t)e == i && !probe_off) continue;
        long b = (uint32_t)e < i ? e : (long)i;
        if (probe_off && v->hits[s] < b) b = v->hits[s];
        if (first_slot < 0 || b < *first_block ||
            (b == *first_block && s == o->chosen)) {
            *first_block = b;
            first_slot = s;
        }
    }
    return first_slot;
}

/* The likely reason of p's divergence on slot ds in view v (engine de,
 * index di there), its words after tail: 2. a sibling rank of the same
 * worker off the other way, or (GPU) a rank the index never scored while
 * a sibling covers it; 3. a rule counter that moved since the previous
 * prompt, 4. or one that tripped earlier; 5. the direction. */
static void view_reason(const view *v, check_prompt *p, uint32_t ds, int32_t de,
                        uint32_t di, char *tail, size_t room) {
    const check_obs *o = v->o;
    uint32_t w = ds / o->dp_size;
    bool never = !v->cpu && o->index_seen && !o->index_seen[ds];
    for (uint32_t r = 0; r < o->dp_size; r++) {
        uint32_t s = w * o->dp_size + r;
        if (s == ds) continue;
        int32_t e = view_engine(v, s);
        uint32_t i = view_index(v, s);
        if (e >= 0 && (((uint32_t)de > di && i > (uint32_t)e) ||
                       ((uint32_t)de < di && i < (uint32_t)e))) {
            p->reason = CHECK_REASON_WRONG_RANK;
            snprintf(tail, room, "; rank %u: engine %d, index %u", r, e, i);
            return;
        }
        if (never && (uint32_t)de > di && i >= (uint32_t)de) {
            p->reason = CHECK_REASON_WRONG_RANK;
            snprintf(tail, room,
                     "; the index never scored rank %u, rank %u "
                     "holds %u",
                     ds % o->dp_size, r, i);
            return;
        }
    }
    const check_rule *rule = NULL;
    const check_counter *c = first_rule_counter(o->moved, &rule);
    const char *when = "+";
    if (!c) {
        c = first_rule_counter(o->total, &rule);
        when = "earlier: ";
    }
    if (c) {
        p->reason = rule->reason;
        snprintf(tail, room, "; %s %s %s%.0f", c->stage, c->name, when,
                 c->value);
        return;
    }
    p->reason = (uint32_t)de > di ? CHECK_REASON_MISSED_STORE
                                  : CHECK_REASON_STALE_BLOCK;
}

kvo_status check_prompt_judge(const check_obs *o, kvo_arena *a,
                              check_prompt *p) {
    if (!o || !p || o->block_size == 0 || o->n_slots == 0 ||
        o->chosen >= o->n_slots || o->dp_size == 0 || !o->index_scores)
        return KVO_EINVAL;
    uint32_t n = o->n_slots, bs = o->block_size;
    uint32_t *scores = kvo_arena_alloc(a, n * sizeof(*scores));
    int32_t *hits = kvo_arena_alloc(a, n * sizeof(*hits));
    if (!scores || !hits) return KVO_ENOMEM;

    memset(p, 0, sizeof(*p));
    p->id = o->id;
    p->slot = o->chosen;
    p->worker = o->chosen / o->dp_size;
    p->dp_rank = o->chosen % o->dp_size;
    p->prompt_tokens = o->prompt_tokens;
    p->prompt_blocks = (o->prompt_tokens + bs - 1) / bs;
    p->cap = o->prompt_tokens ? (o->prompt_tokens - 1) / bs : 0;
    p->index_scores = scores;
    p->engine_hits = hits;
    p->first_divergent_block = -1;
    p->divergent_slot = -1;
    p->ms = o->ms;
    p->judged = !o->unjudged;
    p->inflight_at_route = o->inflight_at_route;
    p->checkpoint = o->checkpoint;
    for (uint32_t s = 0; s < n; s++) {
        scores[s] = o->index_scores[s];
        hits[s] = o->probe_hits ? o->probe_hits[s] : -1;
        if (hits[s] < -1) hits[s] = -1;
    }
    uint32_t cap = p->cap;
    view gpu = {.o = o, .scores = scores, .hits = hits, .cap = cap};
    p->index_raw_blocks = scores[o->chosen];
    p->index_hit_blocks = view_index(&gpu, o->chosen);
    p->routed_index_blocks = p->index_hit_blocks;
    if (o->unjudged) { /* load mode: what the router saw, and the engine */
        int64_t blocks = o->cached_tokens >= 0 ? o->cached_tokens / bs : -1;
        p->engine_hit_blocks = blocks > INT32_MAX ? INT32_MAX : (int32_t)blocks;
        return KVO_OK;
    }

    /* The chosen slot's truth is the response; a probe that disagrees with
     * it means the engine contradicts itself. With a split probe the
     * response is the engine's own hit, and the router's truth the probe. */
    const int32_t *cache = o->probe_hits ? o->probe_cache_hits : NULL;
    int32_t probed_hit = cache ? cache[o->chosen] : hits[o->chosen];
    bool engine_bad = false;
    if (o->cached_tokens >= 0) {
        int64_t blocks = o->cached_tokens / bs;
        p->engine_hit_blocks = blocks > INT32_MAX ? INT32_MAX : (int32_t)blocks;
        if (o->cached_tokens % bs != 0 ||
            (probed_hit >= 0 && probed_hit != p->engine_hit_blocks))
            engine_bad = true;
    } else {
        p->engine_hit_blocks = probed_hit;
    }
    gpu.chosen_truth = cache ? hits[o->chosen] : p->engine_hit_blocks;

    /* Divergence per slot on the GPU tier (the chosen slot by the response
     * unless the probe is split); only where every GPU run agrees, the CPU
     * tier's: the engine's GPU+CPU hit (which the response told, engine_bad
     * otherwise) against the index's host_pinned score. */
    view cpu = gpu;
    cpu.cpu = true;
    const view *v = &gpu;
    long first_block;
    long first_slot = view_first(&gpu, &first_block);
    if (first_slot < 0 && !engine_bad) {
        first_slot = view_first(&cpu, &first_block);
        v = &cpu;
    }
    if (first_slot < 0 && !engine_bad) return KVO_OK;
    p->diverged = true;
    if (first_slot < 0) { /* only the engine's two answers differ */
        first_slot = o->chosen;
        first_block = p->engine_hit_blocks < probed_hit ? p->engine_hit_blocks
                                                        : probed_hit;
    }
    p->first_divergent_block = (int32_t)first_block;
    p->divergent_slot = (int32_t)first_slot;

    uint32_t ds = (uint32_t)first_slot;
    int32_t de = view_engine(v, ds);
    uint32_t di = view_index(v, ds);
    int len;
    if (v->cpu) {
        p->tier_cpu = true;
        p->tier_engine_blocks = de;
        p->tier_index_blocks = di;
        len = snprintf(p->detail, sizeof(p->detail),
                       "worker %u rank %u tier cpu: engine %d blocks (gpu %d "
                       "+ cpu %d), index %u%s",
                       ds / o->dp_size, ds % o->dp_size, de, hits[ds],
                       de - hits[ds], di,
                       o->index_tiered ? ""
                                       : " (the index never answered a "
                                         "tier: it ignores the CPU tier)");
    } else {
        len = snprintf(p->detail, sizeof(p->detail),
                       "worker %u rank %u: engine %d blocks, index %u",
                       ds / o->dp_size, ds % o->dp_size, de, di);
    }
    if (len < 0 || (size_t)len >= sizeof(p->detail)) len = 0;
    size_t room = sizeof(p->detail) - (size_t)len;
    char *tail = p->detail + len;

    /* 1. The engine contradicts itself. */
    if (engine_bad) {
        p->reason = CHECK_REASON_ENGINE;
        snprintf(tail, room,
                 "; response says %lld cached tokens, probe %d "
                 "blocks",
                 (long long)o->cached_tokens, probed_hit);
        return KVO_OK;
    }
    view_reason(v, p, ds, de, di, tail, room);
    return KVO_OK;
}

/* ---- Result ----------------------------------------------------------------*/

kvo_status check_result_new(check_result **out) {
    check_result *r = kvo_calloc(1, sizeof(*r));
    if (!r) return KVO_ENOMEM;
    kvo_arena_init(&r->arena);
    check_counters_init(&r->counters);
    r->error_prompt = -1;
    *out = r;
    return KVO_OK;
}

void check_result_free(check_result *r) {
    if (!r) return;
    kvo_free(r->slots);
    kvo_free(r->prompts);
    kvo_free(r->sweep);
    kvo_free(r->ckpts);
    kvo_free(r->faults);
    kvo_arena_fini(&r->arena);
    check_counters_fini(&r->counters);
    for (size_t i = 0; i < r->n_trips; i++) {
        kvo_free(r->trips[i].stage);
        kvo_free(r->trips[i].name);
    }
    kvo_free(r->trips);
    kvo_free(r);
}

/* Slots (workers x ranks) a result accepts: bounds its per-slot arrays,
 * far above what the driver can start (CHK_MAX_ENGINES x CHK_MAX_DP). */
#define SLOTS_MAX 65536

kvo_status check_result_slots(check_result *r, uint32_t n_workers,
                              uint32_t dp_size, uint32_t block_size) {
    if (n_workers == 0 || dp_size == 0 || block_size == 0 ||
        (uint64_t)n_workers * dp_size > SLOTS_MAX)
        return KVO_EINVAL;
    check_slot_info *s = kvo_calloc((size_t)n_workers * dp_size, sizeof(*s));
    if (!s) return KVO_ENOMEM;
    for (uint32_t i = 0; i < n_workers * dp_size; i++) {
        s[i].worker = i / dp_size;
        s[i].dp_rank = i % dp_size;
    }
    kvo_free(r->slots);
    r->slots = s;
    r->n_slots = n_workers * dp_size;
    r->dp_size = dp_size;
    r->block_size = block_size;
    return KVO_OK;
}

kvo_status check_result_add(check_result *r, const check_obs *o,
                            const check_prompt **out) {
    if (o->n_slots != r->n_slots || o->block_size != r->block_size)
        return KVO_EINVAL;
    kvo_status st = kvo_grow(&r->prompts, &r->cap_prompts, r->n_prompts + 1,
                             sizeof(*r->prompts), 256);
    if (st != KVO_OK) return st;
    check_prompt *p = &r->prompts[r->n_prompts];
    st = check_prompt_judge(o, &r->arena, p);
    if (st != KVO_OK) return st;
    r->n_prompts++;
    if (out) *out = p;
    return KVO_OK;
}

kvo_status check_result_add_sweep(check_result *r, const check_obs *o,
                                  const check_prompt **out) {
    if (o->n_slots != r->n_slots || o->block_size != r->block_size ||
        o->cached_tokens >= 0)
        return KVO_EINVAL;
    kvo_status st = kvo_grow(&r->sweep, &r->cap_sweep, r->n_sweep + 1,
                             sizeof(*r->sweep), 64);
    if (st != KVO_OK) return st;
    check_prompt *p = &r->sweep[r->n_sweep];
    st = check_prompt_judge(o, &r->arena, p);
    if (st != KVO_OK) return st;
    r->n_sweep++;
    r->sweep_divergent += p->diverged;
    if (p->diverged) { /* no request went anywhere: show the divergent slot */
        uint32_t ds = (uint32_t)p->divergent_slot;
        uint32_t cap = p->cap;
        p->slot = ds;
        p->worker = ds / o->dp_size;
        p->dp_rank = ds % o->dp_size;
        p->engine_hit_blocks = p->engine_hits[ds];
        p->index_raw_blocks = p->index_scores[ds];
        p->index_hit_blocks =
            p->index_scores[ds] < cap ? p->index_scores[ds] : cap;
        if (p->tier_cpu) { /* the two sides that differ */
            p->engine_hit_blocks = p->tier_engine_blocks;
            p->index_hit_blocks = p->tier_index_blocks;
        }
    }
    if (out) *out = p;
    return KVO_OK;
}

kvo_status check_result_trips(check_result *r, const check_counters *total,
                              int64_t before_prompt) {
    for (size_t i = 0; i < total->n; i++) {
        const check_counter *c = &total->items[i];
        if (!(c->value > 0)) continue;
        const check_rule *rule = c->rule;
        if (!rule || (rule->clean_only && r->faulted)) continue;
        size_t k;
        for (k = 0; k < r->n_trips; k++)
            if (strcmp(r->trips[k].stage, c->stage) == 0 &&
                strcmp(r->trips[k].name, c->name) == 0)
                break;
        if (k < r->n_trips) {
            r->trips[k].value = c->value;
            continue;
        }
        kvo_status st = kvo_grow(&r->trips, &r->cap_trips, r->n_trips + 1,
                                 sizeof(*r->trips), 8);
        if (st != KVO_OK) return st;
        check_trip *t = &r->trips[r->n_trips];
        if ((st = names_dup(c, &t->stage, &t->name)) != KVO_OK) return st;
        t->value = c->value;
        t->before_prompt = before_prompt;
        t->rule = rule;
        r->n_trips++;
    }
    return KVO_OK;
}

void check_result_error(check_result *r, int64_t prompt, const char *fmt, ...) {
    if (r->error[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof(r->error), fmt, ap);
    va_end(ap);
    r->error_prompt = prompt;
}

void check_result_totals(const check_result *r, check_totals *t) {
    memset(t, 0, sizeof(*t));
    for (size_t i = 0; i < r->n_prompts; i++) {
        const check_prompt *p = &r->prompts[i];
        t->requests++;
        t->prompt_tokens += p->prompt_tokens;
        t->prompt_blocks += p->prompt_blocks;
        if (p->engine_hit_blocks > 0)
            t->engine_hit_tokens +=
                (uint64_t)p->engine_hit_blocks * r->block_size;
        t->index_hit_tokens += (uint64_t)p->index_hit_blocks * r->block_size;
        t->index_raw_blocks += p->index_raw_blocks;
        if (p->diverged) {
            t->divergent++;
            t->by_reason[p->reason < CHECK_REASON_COUNT ? p->reason : 0]++;
        }
    }
    for (size_t i = 0; i < r->n_sweep; i++) {
        const check_prompt *p = &r->sweep[i];
        if (!p->diverged) continue;
        t->sweep_divergent++;
        t->by_reason[p->reason < CHECK_REASON_COUNT ? p->reason : 0]++;
    }
}

size_t check_totals_classes(const check_totals *t, char *out, size_t n) {
    size_t len = 0;
    out[0] = '\0';
    for (int k = 1; k < CHECK_REASON_COUNT && len < n; k++)
        if (t->by_reason[k])
            len += (size_t)snprintf(out + len, n - len, "%s%s %llu",
                                    len ? ", " : "",
                                    check_reason_name((check_reason)k),
                                    (unsigned long long)t->by_reason[k]);
    return len;
}

/* Worst first: divergent ones (by how far apart), then the lowest engine hit
 * rate against what a cache could have served, then the longest. */
static int worst_cmp(const void *a, const void *b) {
    const check_prompt *x = *(const check_prompt *const *)a;
    const check_prompt *y = *(const check_prompt *const *)b;
    if (x->diverged != y->diverged) return x->diverged ? -1 : 1;
    if (x->diverged) {
        long dx = labs((long)x->engine_hit_blocks - (long)x->index_hit_blocks);
        long dy = labs((long)y->engine_hit_blocks - (long)y->index_hit_blocks);
        if (dx != dy) return dx > dy ? -1 : 1;
    } else {
        double hx = x->cap ? (double)x->engine_hit_blocks / x->cap : 1;
        double hy = y->cap ? (double)y->engine_hit_blocks / y->cap : 1;
        if (hx != hy) return hx < hy ? -1 : 1;
        if (x->prompt_tokens != y->prompt_tokens)
            return x->prompt_tokens > y->prompt_tokens ? -1 : 1;
    }
    return x->id < y->id ? -1 : x->id > y->id;
}

size_t check_result_worst(const check_result *r, const check_prompt **out,
                          size_t n) {
    if (!n || !r->n_prompts) return 0;
    const check_prompt **v = kvo_calloc(r->n_prompts, sizeof(*v));
    if (!v) return 0;
    for (size_t i = 0; i < r->n_prompts; i++) v[i] = &r->prompts[i];
    qsort(v, r->n_prompts, sizeof(*v), worst_cmp);
    if (n > r->n_prompts) n = r->n_prompts;
    memcpy(out, v, n * sizeof(*v));
    kvo_free(v);
    return n;
}

/* ---- Verdict ---------------------------------------------------------------*/

void check_verdict_decide(const check_result *r, check_verdict *out) {
    memset(out, 0, sizeof(*out));
    /* Candidates ordered by (request, kind): a run error at request x
     * happened before its counters were read (kind 0), a tripped counter
     * before its query (1), a checkpoint before request x ran after those
     * counters were read (2: a counter names a cause more exactly than the
     * blocks it left behind), a divergence at the query (3). "At the end"
     * sorts after every request. */
    enum { KINDS = 4 };
#define POS(req, kind)                                                         \
    ((req) < 0 ? UINT64_MAX - KINDS + (kind) : (uint64_t)(req)*KINDS + (kind))
    const uint64_t none = UINT64_MAX;
    uint64_t err_pos = r->error[0] ? POS(r->error_prompt, 0) : none;
    const check_trip *tp = NULL;
    uint64_t trip_pos = none;
    for (size_t i = 0; i < r->n_trips; i++) {
        /* counters first seen at the same read: the rule table's order is
         * the causal one (a gap before the unknown parents it causes) */
        uint64_t pos = POS(r->trips[i].before_prompt, 1);
        if (pos < trip_pos ||
            (pos == trip_pos && r->trips[i].rule < tp->rule)) {
            trip_pos = pos;
            tp = &r->trips[i];
        }
    }
    const check_checkpoint *cp = NULL;
    uint64_t ckpt_pos = none;
    for (size_t i = 0; i < r->n_ckpts && !cp; i++)
        if (check_checkpoint_failed(&r->ckpts[i])) { /* in order */
            cp = &r->ckpts[i];
            ckpt_pos = POS(cp->before_prompt, 2);
        }
    const check_prompt *dp = NULL;
    uint64_t div_pos = none;
    for (size_t i = 0; i < r->n_prompts && !dp; i++)
        if (r->prompts[i].diverged) { /* trace order: the first is enough */
            dp = &r->prompts[i];
            div_pos = POS((int64_t)dp->id, 3);
        }
#undef POS
    /* a divergent sweep entry of no recorded checkpoint (the run stopped
     * inside that checkpoint, or a caller's own sweep) */
    const check_prompt *sp = NULL;
    for (size_t i = 0; i < r->n_sweep && !sp; i++) {
        const check_prompt *e = &r->sweep[i];
        if (e->diverged && !(e->checkpoint && e->checkpoint <= r->n_ckpts))
            sp = e;
    }
    uint64_t first = err_pos;
    if (trip_pos < first) first = trip_pos;
    if (ckpt_pos < first) first = ckpt_pos;
    if (div_pos < first) first = div_pos;
    if (err_pos != none && err_pos == first) {
        snprintf(out->cause, sizeof(out->cause), "%s", r->error);
        snprintf(out->where, sizeof(out->where), "run error");
    } else if (tp && trip_pos == first) {
        /* read at a checkpoint (load mode reads counters only there) */
        const check_checkpoint *at = NULL;
        for (size_t i = 0; i < r->n_ckpts && !at; i++)
            if (r->ckpts[i].before_prompt == tp->before_prompt)
                at = &r->ckpts[i];
        if (at && r->load.on)
            snprintf(out->where, sizeof(out->where), "checkpoint %u: counters",
                     at->number);
        else if (tp->before_prompt >= 0)
            snprintf(out->where, sizeof(out->where),
                     "counters before prompt %lld",
                     (long long)tp->before_prompt);
        else
            snprintf(out->where, sizeof(out->where), "counters at the end");
        char when[48] = "at the end";
        if (tp->before_prompt >= 0)
            snprintf(when, sizeof(when), "first seen before prompt %lld",
                     (long long)tp->before_prompt);
        snprintf(out->cause, sizeof(out->cause), "%s: %s %s = %.0f, %s (%s)",
                 check_reason_name(tp->rule->reason), tp->stage, tp->name,
                 tp->value, when, tp->rule->what);
        out->reason = tp->rule->reason;
    } else if (cp && ckpt_pos == first) {
        check_checkpoint_cause(r, cp, out->cause, sizeof(out->cause));
        bool gpu = cp->diff.n[0] + cp->diff.n[1] + cp->diff.n[2] > 0;
        snprintf(out->where, sizeof(out->where), "checkpoint %u: %s",
                 cp->number,
                 gpu                                ? "block sets"
                 : check_checkpoint_sets_differ(cp) ? "block sets (tier cpu)"
                                                    : "sweep");
        if (check_checkpoint_sets_differ(cp))
            out->reason = check_set_diff_reason(gpu ? &cp->diff : &cp->cpu.diff,
                                                r->dp_size);
        else if (cp->sweep_first >= 0 && (size_t)cp->sweep_first < r->n_sweep)
            out->reason = r->sweep[cp->sweep_first].reason;
    } else if (dp) {
        snprintf(out->cause, sizeof(out->cause),
                 "%s: prompt %llu diverged at block %d (%s)%s%s",
                 check_reason_name(dp->reason), (unsigned long long)dp->id,
                 dp->first_divergent_block, dp->detail,
                 dp->evidence ? "; " : "", dp->evidence ? dp->evidence : "");
        snprintf(out->where, sizeof(out->where), "prompt %llu",
                 (unsigned long long)dp->id);
        out->reason = dp->reason;
    } else if (sp || (r->sweep_divergent && !r->n_ckpts)) {
        snprintf(out->where, sizeof(out->where), "sweep after the run");
        if (!sp) { /* counted but not kept: still a FAIL */
            snprintf(out->cause, sizeof(out->cause),
                     "re-checked after the run, a prompt diverged");
        } else {
            snprintf(out->cause, sizeof(out->cause),
                     "%s: re-checked after the run, prompt %llu diverged at "
                     "block %d (%s)%s%s",
                     check_reason_name(sp->reason), (unsigned long long)sp->id,
                     sp->first_divergent_block, sp->detail,
                     sp->evidence ? "; " : "",
                     sp->evidence ? sp->evidence : "");
            out->reason = sp->reason;
        }
    } else if (r->n_prompts == 0) {
        snprintf(out->cause, sizeof(out->cause), "no request was checked");
        snprintf(out->where, sizeof(out->where), "nothing ran");
    } else {
        out->pass = true;
    }
}

bool check_result_passed(const check_result *r, const char **cause) {
    if (cause) *cause = r->verdict.cause;
    return r->verdict.pass;
}

const char *check_stage_name(check_stage s) {
    static const char *names[CHECK_STAGE_COUNT] = {
        "watermark wait", "counters",    "index query",
        "engine probes",  "completion",  "sweep",
        "other",          "checkpoints", "load traffic"};
    return (unsigned)s < CHECK_STAGE_COUNT ? names[s] : "?";
}
