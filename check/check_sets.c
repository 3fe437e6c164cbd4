/* check_sets.c -- the pure part of a checkpoint, and what load mode
 * reports: block sets compared, the staleness of routing-time scores, the
 * regime the engines ran in. No sockets, no clocks: the tests feed it lists
 * and prompts by hand.
 *
 * A checkpoint compares, per (worker, rank), the engine's cached block set
 * with the index's. Both sides keep an order-independent digest of their
 * set (check_block_digest summed mod 2^64 over distinct hashes) and its
 * size, so a clean slot costs two small answers; only a slot whose digests
 * or sizes differ has its two lists fetched and compared here:
 *
 *   engine  (sorted by hash, copies once)   h1/p1  h2/-   h4/p2
 *   index   (the same)                      h1/p1  h2/p9   h3/p2
 *                                                  │       │    └ index only
 *                                                  │       └ engine only (h4)
 *                                                  └ wrong parent (h2)
 *
 * A difference in the engine but not the index is a missed store, one in
 * the index but not the engine a stale block, one under another parent a
 * wrong parent.
 */
#include "check_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Block sets ------------------------------------------------------------*/

uint64_t check_block_digest(const check_block *b) {
    return kvo_block_digest(b->hash, b->has_parent, b->parent);
}

static int block_cmp(const void *a, const void *b) {
    const check_block *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    if (x->has_parent != y->has_parent) return x->has_parent ? 1 : -1;
    if (x->parent != y->parent) return x->parent < y->parent ? -1 : 1;
    return 0;
}

static bool same_block(const check_block *x, const check_block *y) {
    return block_cmp(x, y) == 0;
}

size_t check_blocks_normalize(check_block *v, size_t n) {
    if (n < 2) return n;
    qsort(v, n, sizeof(*v), block_cmp);
    size_t k = 1;
    for (size_t i = 1; i < n; i++)
        if (!same_block(&v[i], &v[k - 1])) v[k++] = v[i];
    return k;
}

uint64_t check_blocks_digest(const check_block *v, size_t n) {
    uint64_t d = 0;
    for (size_t i = 0; i < n; i++) d += check_block_digest(&v[i]);
    return d;
}

const char *check_diff_name(check_diff_kind k) {
    static const char *names[CHECK_DIFF_COUNT] = {
        [CHECK_DIFF_ENGINE_ONLY] = "in the engine but not the index",
        [CHECK_DIFF_INDEX_ONLY] = "in the index but not the engine",
        [CHECK_DIFF_PARENT] = "under a different parent",
    };
    return (unsigned)k < CHECK_DIFF_COUNT ? names[k] : "?";
}

check_reason check_diff_reason(check_diff_kind k) {
    switch (k) {
    case CHECK_DIFF_ENGINE_ONLY: return CHECK_REASON_MISSED_STORE;
    case CHECK_DIFF_INDEX_ONLY: return CHECK_REASON_STALE_BLOCK;
    case CHECK_DIFF_PARENT: return CHECK_REASON_WRONG_PARENT;
    default: return CHECK_REASON_NONE;
    }
}

/* Keep a one-sided hash for check_set_diff_misplaced (bounded). */
static void keep_one_sided(check_set_diff *d, check_diff_kind kind,
                           uint32_t slot, uint64_t hash) {
    if (!d->collect || d->one_sided_cut) return;
    if (d->n_one_sided == CHECK_ONE_SIDED_MAX ||
        kvo_grow(&d->one_sided, &d->cap_one_sided, d->n_one_sided + 1,
                 sizeof(*d->one_sided), 1024) != KVO_OK) {
        d->one_sided_cut = true;
        return;
    }
    d->one_sided[d->n_one_sided++] = (check_one_sided){hash, slot, kind};
}

static void note(check_set_diff *d, check_diff_kind kind, uint32_t slot,
                 const check_block *eng, const check_block *idx) {
    d->n[kind]++;
    if (kind != CHECK_DIFF_PARENT)
        keep_one_sided(d, kind, slot, eng ? eng->hash : idx->hash);
    if (d->n_first >= CHECK_DIFFS_SHOWN) return;
    check_block_diff *x = &d->first[d->n_first++];
    memset(x, 0, sizeof(*x));
    x->kind = kind;
    x->slot = slot;
    if (eng) x->engine = *eng;
    if (idx) x->index = *idx;
    x->prompt = -1;
    x->depth = -1;
}

/* The run [*i, end) of v holding one hash. */
static size_t run_end(const check_block *v, size_t n, size_t i) {
    size_t j = i + 1;
    while (j < n && v[j].hash == v[i].hash) j++;
    return j;
}

/* The entry of hash in a normalized list, or NULL. */
static const check_block *block_find(const check_block *v, size_t n,
                                     uint64_t hash) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v[mid].hash < hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && v[lo].hash == hash ? &v[lo] : NULL;
}

/* The engine's entry of idx's parent-less block b when it has a parent the
 * tier itself does not hold, or NULL. */
static const check_block *cut_candidate(const check_block *eng, size_t ne,
                                        const check_block *b) {
    if (b->has_parent) return NULL;
    const check_block *e = block_find(eng, ne, b->hash);
    return e && e->has_parent && !block_find(eng, ne, e->parent) ? e : NULL;
}

size_t check_blocks_cut(const check_block *eng, size_t ne,
                        const check_block *idx, size_t ni) {
    size_t n = 0;
    for (size_t j = 0; j < ni; j++)
        n += cut_candidate(eng, ne, &idx[j]) != NULL;
    return n;
}

size_t check_blocks_uncut(const check_block *eng, size_t ne,
                          const check_block *other, size_t no, check_block *idx,
                          size_t ni) {
    size_t cut = 0;
    for (size_t j = 0; j < ni; j++) {
        const check_block *e = cut_candidate(eng, ne, &idx[j]);
        if (!e || block_find(other, no, e->parent)) continue;
        idx[j].has_parent = true;
        idx[j].parent = e->parent;
        cut++;
    }
    return cut;
}

void check_blocks_compare(const check_block *eng, size_t ne,
                          const check_block *idx, size_t ni, uint32_t slot,
                          check_set_diff *d) {
    size_t i = 0, j = 0;
    while (i < ne || j < ni) {
        if (j == ni || (i < ne && eng[i].hash < idx[j].hash)) {
            note(d, CHECK_DIFF_ENGINE_ONLY, slot, &eng[i], NULL);
            i = run_end(eng, ne, i);
        } else if (i == ne || idx[j].hash < eng[i].hash) {
            note(d, CHECK_DIFF_INDEX_ONLY, slot, NULL, &idx[j]);
            j = run_end(idx, ni, j);
        } else { /* one hash on both sides: its parents must be the same */
            size_t ie = run_end(eng, ne, i), je = run_end(idx, ni, j);
            bool same = ie - i == je - j;
            for (size_t k = 0; same && k < ie - i; k++)
                same = same_block(&eng[i + k], &idx[j + k]);
            if (!same) note(d, CHECK_DIFF_PARENT, slot, &eng[i], &idx[j]);
            i = ie;
            j = je;
        }
    }
}

static int one_sided_cmp(const void *a, const void *b) {
    const check_one_sided *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

void check_set_diff_misplaced(check_set_diff *d) {
    if (d->n_one_sided > 1)
        qsort(d->one_sided, d->n_one_sided, sizeof(*d->one_sided),
              one_sided_cmp);
    /* runs of one hash: engine-only entries first, then index-only */
    for (size_t i = 0, j; i < d->n_one_sided; i = j) {
        const check_one_sided *e = &d->one_sided[i];
        for (j = i + 1; j < d->n_one_sided && d->one_sided[j].hash == e->hash;)
            j++;
        if (e->kind != CHECK_DIFF_ENGINE_ONLY ||
            d->one_sided[j - 1].kind != CHECK_DIFF_INDEX_ONLY)
            continue;
        if (!d->misplaced++) {
            d->misplaced_hash = e->hash;
            d->misplaced_engine_slot = e->slot;
            d->misplaced_index_slot = d->one_sided[j - 1].slot;
        }
    }
    kvo_free(d->one_sided);
    d->one_sided = NULL;
    d->n_one_sided = d->cap_one_sided = 0;
    d->collect = false;
}

check_reason check_set_diff_reason(const check_set_diff *d, uint32_t dp_size) {
    if (d->misplaced)
        return dp_size && d->misplaced_engine_slot / dp_size ==
                              d->misplaced_index_slot / dp_size
                   ? CHECK_REASON_WRONG_RANK
                   : CHECK_REASON_WRONG_WORKER;
    int top = 0;
    for (int k = 1; k < CHECK_DIFF_COUNT; k++)
        if (d->n[k] > d->n[top]) top = k;
    return check_diff_reason((check_diff_kind)top);
}

/* ---- Checkpoints in the result -----------------------------------------*/

kvo_status check_result_checkpoint(check_result *r, const check_checkpoint *c,
                                   const check_slot_sets *slots) {
    kvo_status st = kvo_grow(&r->ckpts, &r->cap_ckpts, r->n_ckpts + 1,
                             sizeof(*r->ckpts), 16);
    if (st != KVO_OK) return st;
    check_slot_sets *copy = NULL;
    if (r->n_slots) {
        copy = kvo_arena_alloc(&r->arena, r->n_slots * sizeof(*copy));
        if (!copy) return KVO_ENOMEM;
        if (slots)
            memcpy(copy, slots, r->n_slots * sizeof(*copy));
        else
            memset(copy, 0, r->n_slots * sizeof(*copy));
    }
    r->ckpts[r->n_ckpts] = *c;
    r->ckpts[r->n_ckpts].slots = copy;
    r->n_ckpts++;
    return KVO_OK;
}

static uint64_t diff_total(const check_set_diff *d) {
    uint64_t t = 0;
    for (int k = 0; k < CHECK_DIFF_COUNT; k++) t += d->n[k];
    return t;
}

bool check_checkpoint_sets_differ(const check_checkpoint *c) {
    return diff_total(&c->diff) > 0 || diff_total(&c->cpu.diff) > 0;
}

bool check_checkpoint_failed(const check_checkpoint *c) {
    return check_checkpoint_sets_differ(c) || c->sweep_divergent > 0;
}

static void slot_name(const check_result *r, uint32_t slot, char *out,
                      size_t n) {
    if (r->slots && slot < r->n_slots)
        snprintf(out, n, "worker %u rank %u", r->slots[slot].worker,
                 r->slots[slot].dp_rank);
    else
        snprintf(out, n, "slot %u", slot);
}

static void block_text(const check_block *b, char *out, size_t n) {
    if (b->has_parent)
        snprintf(out, n, "%llu (parent %llu)", (unsigned long long)b->hash,
                 (unsigned long long)b->parent);
    else
        snprintf(out, n, "%llu (no parent)", (unsigned long long)b->hash);
}

void check_block_diff_text(const check_result *r, const check_block_diff *d,
                           char *out, size_t outsz) {
    char where[48], what[120], blk[64], p1[32], p2[32];
    slot_name(r, d->slot, where, sizeof(where));
    switch (d->kind) {
    case CHECK_DIFF_ENGINE_ONLY:
        block_text(&d->engine, blk, sizeof(blk));
        snprintf(what, sizeof(what), "block %s in the engine, not the index",
                 blk);
        break;
    case CHECK_DIFF_INDEX_ONLY:
        block_text(&d->index, blk, sizeof(blk));
        snprintf(what, sizeof(what), "block %s in the index, not the engine",
                 blk);
        break;
    default:
        snprintf(p1, sizeof(p1), "%llu", (unsigned long long)d->engine.parent);
        snprintf(p2, sizeof(p2), "%llu", (unsigned long long)d->index.parent);
        snprintf(what, sizeof(what),
                 "block %llu: parent %s in the engine, %s in the index",
                 (unsigned long long)d->engine.hash,
                 d->engine.has_parent ? p1 : "none",
                 d->index.has_parent ? p2 : "none");
        break;
    }
    if (d->prompt >= 0)
        snprintf(out, outsz, "%s: %s (prompt %lld block %d)", where, what,
                 (long long)d->prompt, d->depth);
    else
        snprintf(out, outsz, "%s: %s (no prompt of the run reaches it)", where,
                 what);
}

/* "checkpoint 2 after 400 requests" / "the final checkpoint after 1000
 * requests" */
static void ckpt_name(const check_checkpoint *c, char *out, size_t n) {
    snprintf(out, n, "%scheckpoint %u after %llu requests",
             c->final ? "the final " : "", c->number,
             (unsigned long long)c->after);
}

/* d's differences in words, appended at out[len] (len < outsz): the
 * misplaced blocks, the count of each kind, the first difference; returns
 * the new length (at most outsz). */
static size_t diff_words(const check_result *r, const check_set_diff *d,
                         char *out, size_t len, size_t outsz) {
#define ADD(...)                                                               \
    do {                                                                       \
        if (len < outsz) {                                                     \
            int k_ = snprintf(out + len, outsz - len, __VA_ARGS__);            \
            len = k_ < 0 ? outsz : len + (size_t)k_;                           \
        }                                                                      \
    } while (0)
    const char *sep = " ";
    if (d->misplaced && r->slots && d->misplaced_engine_slot < r->n_slots &&
        d->misplaced_index_slot < r->n_slots) {
        const check_slot_info *e = &r->slots[d->misplaced_engine_slot],
                              *i = &r->slots[d->misplaced_index_slot];
        ADD(" %llu blocks cached by one (worker, rank) are in the index on "
            "another whose engine lacks them (first: block %llu of worker %u "
            "rank %u, in the index on worker %u rank %u);",
            (unsigned long long)d->misplaced,
            (unsigned long long)d->misplaced_hash, e->worker, e->dp_rank,
            i->worker, i->dp_rank);
    }
    for (int k = 0; k < CHECK_DIFF_COUNT; k++) {
        if (!d->n[k]) continue;
        ADD("%s%llu blocks %s", sep, (unsigned long long)d->n[k],
            check_diff_name((check_diff_kind)k));
        sep = ", ";
    }
    if (d->n_first) {
        char first[256];
        check_block_diff_text(r, &d->first[0], first, sizeof(first));
        ADD("; first: %s", first);
    }
#undef ADD
    return len < outsz ? len : outsz;
}

void check_checkpoint_cause(const check_result *r, const check_checkpoint *c,
                            char *out, size_t outsz) {
    out[0] = '\0';
    if (!check_checkpoint_failed(c)) return;
    char name[96];
    ckpt_name(c, name, sizeof(name));
    if (!check_checkpoint_sets_differ(c)) { /* only the sweep found it */
        const check_prompt *sp =
            c->sweep_first >= 0 && (size_t)c->sweep_first < r->n_sweep
                ? &r->sweep[c->sweep_first]
                : NULL;
        if (sp)
            snprintf(out, outsz,
                     "%s: %s, prompt %llu re-checked diverged at block %d "
                     "(%s)%s%s",
                     check_reason_name(sp->reason), name,
                     (unsigned long long)sp->id, sp->first_divergent_block,
                     sp->detail, sp->evidence ? "; " : "",
                     sp->evidence ? sp->evidence : "");
        else
            snprintf(out, outsz, "%s, a re-checked prompt diverged", name);
        return;
    }
    /* the GPU sets' differences, then the CPU tier's */
    bool gpu = diff_total(&c->diff) > 0, cpu = diff_total(&c->cpu.diff) > 0;
    const check_set_diff *lead = gpu ? &c->diff : &c->cpu.diff;
    int k = snprintf(out, outsz, "%s: %s:",
                     check_reason_name(check_set_diff_reason(lead, r->dp_size)),
                     name);
    size_t len = k < 0 ? outsz : (size_t)k;
    if (gpu && len < outsz) len = diff_words(r, &c->diff, out, len, outsz);
    if (cpu && len < outsz) {
        k = snprintf(out + len, outsz - len, "%s tier cpu:", gpu ? ";" : "");
        len = k < 0 ? outsz : len + (size_t)k;
        if (len < outsz) diff_words(r, &c->cpu.diff, out, len, outsz);
    }
}

/* ---- Staleness ---------------------------------------------------------*/

static int u32_cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest rank: the smallest value with at least q of them at or below. */
static uint32_t pctl(const uint32_t *v, size_t n, double q) {
    if (!n) return 0;
    size_t rank = (size_t)ceil(q * (double)n);
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return v[rank - 1];
}

static void spread(uint32_t *v, size_t n, uint32_t *p50, uint32_t *p99,
                   uint32_t *max) {
    qsort(v, n, sizeof(*v), u32_cmp);
    *p50 = pctl(v, n, 0.50);
    *p99 = pctl(v, n, 0.99);
    *max = n ? v[n - 1] : 0;
}

kvo_status check_result_staleness(const check_result *r, check_staleness *out) {
    memset(out, 0, sizeof(*out));
    size_t n = r->n_prompts ? r->n_prompts : 1;
    uint32_t *all = kvo_malloc(n * sizeof(*all));
    uint32_t *over = kvo_malloc(n * sizeof(*over));
    uint32_t *under = kvo_malloc(n * sizeof(*under));
    kvo_status st = all && over && under ? KVO_OK : KVO_ENOMEM;
    size_t na = 0, no = 0, nu = 0;
    for (size_t i = 0; st == KVO_OK && i < r->n_prompts; i++) {
        const check_prompt *p = &r->prompts[i];
        if (p->engine_hit_blocks < 0) continue;
        int64_t d = (int64_t)p->routed_index_blocks - p->engine_hit_blocks;
        out->requests++;
        out->prompt_tokens += p->prompt_tokens;
        out->promised_tokens +=
            (uint64_t)p->routed_index_blocks * r->block_size;
        out->achieved_tokens += (uint64_t)p->engine_hit_blocks * r->block_size;
        uint32_t a = (uint32_t)(d < 0 ? -d : d);
        all[na++] = a;
        if (d > 0) {
            out->over++;
            over[no++] = a;
        } else if (d < 0) {
            out->under++;
            under[nu++] = a;
        } else {
            out->exact++;
        }
    }
    if (st == KVO_OK) {
        spread(all, na, &out->abs_p50, &out->abs_p99, &out->abs_max);
        spread(over, no, &out->over_p50, &out->over_p99, &out->over_max);
        spread(under, nu, &out->under_p50, &out->under_p99, &out->under_max);
    } else {
        memset(out, 0, sizeof(*out));
    }
    kvo_free(all);
    kvo_free(over);
    kvo_free(under);
    return st;
}

/* ---- Regime --------------------------------------------------------------*/

static const struct {
    const char *name;
    check_agg agg;
    const char *what;
} REGIME[CHECK_REGIME_COUNT] = {
#define X(name, agg, what) {#name, agg, what},
    CHECK_REGIME(X)
#undef X
};

const char *check_regime_name(check_regime_item i) {
    return (unsigned)i < CHECK_REGIME_COUNT ? REGIME[i].name : "?";
}

const char *check_regime_what(check_regime_item i) {
    return (unsigned)i < CHECK_REGIME_COUNT ? REGIME[i].what : "?";
}

void check_result_regime(const check_result *r, check_regime *out) {
    memset(out, 0, sizeof(*out));
    const check_counters *c = &r->counters;
    for (size_t i = 0; i < c->n; i++) {
        const check_counter *it = &c->items[i];
        /* "engine W.R" (a decode engine publishes nothing the index holds
         * and does not count) */
        if (strncmp(it->stage, "engine ", 7) != 0 || isnan(it->value)) continue;
        for (int k = 0; k < CHECK_REGIME_COUNT; k++) {
            if (strcmp(it->name, REGIME[k].name) != 0) continue;
            out->known = true;
            if (REGIME[k].agg == CHECK_AGG_SUM)
                out->v[k] += it->value;
            else if (it->value > out->v[k])
                out->v[k] = it->value;
        }
    }
}
