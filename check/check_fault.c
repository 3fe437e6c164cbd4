/* check_fault.c -- the faults kvo-check injects, as a pure plan and a
 * report; check_spawn.c does the killing (chk_env_fault), check_run.c
 * calls it before the planned request and measures the healing.
 *
 *   cfg --relay-restart-at / --indexer-restart-at / --engine-restart-at /
 *       --nats-kill-at / --chaos SEED --chaos-every K
 *     │ check_faults_plan (pure, seeded)
 *     ▼
 *   faults[] ordered by `at` ──▶ driver, before request `at`:
 *       read the indexer's counters (the base), SIGKILL, start again,
 *       wait until the new process is ready (down_ms)
 *     ──▶ request `at`'s exact sync: the index caught up (heal_ms), the
 *       indexer's recovery counters minus the base (rec[])
 *     ──▶ reports: one line per fault
 *
 * A run with any fault is "faulted": the clean-only counter rules
 * (check_core.c) are off, since a gap or a recovery is then the expected
 * answer to the fault; prompts and checkpoints still judge every request
 * exactly. A run with none must see no gap and no recovery at all.
 */
#include "check_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *check_fault_kind_name(check_fault_kind k) {
    static const char *names[CHECK_FAULT_KIND_COUNT] = {
        [CHECK_FAULT_RELAY] = "relay",
        [CHECK_FAULT_INDEXER] = "indexer",
        [CHECK_FAULT_ENGINE] = "engine",
        [CHECK_FAULT_NATS] = "nats"};
    return (unsigned)k < CHECK_FAULT_KIND_COUNT ? names[k] : "?";
}

const char *check_fault_rec_name(check_fault_rec i) {
    static const char *names[CHECK_FAULT_REC_COUNT] = {
#define X(field, prom) #field,
        CHECK_FAULT_RECOVERY(X)
#undef X
    };
    return (unsigned)i < CHECK_FAULT_REC_COUNT ? names[i] : "?";
}

bool check_cfg_faulted(const check_cfg *c) {
    return c->relay_restart_at >= 0 || c->indexer_restart_at >= 0 ||
           c->engine_restart_at >= 0 || c->nats_kill_at >= 0 || c->chaos ||
           c->drop_seq >= 0 || c->extra_block_seq >= 0;
}

static int fault_cmp(const void *a, const void *b) {
    const check_fault *x = a, *y = b;
    if (x->at != y->at) return x->at < y->at ? -1 : 1;
    return (int)x->kind - (int)y->kind;
}

kvo_status check_faults_plan(const check_cfg *c, uint64_t requests,
                             uint32_t workers, uint32_t dp, check_fault **out,
                             size_t *n) {
    *out = NULL;
    *n = 0;
    if (c->chaos && c->chaos_every == 0) return KVO_EINVAL;
    size_t cap = 4 + (c->chaos ? (size_t)(requests / c->chaos_every) : 0);
    check_fault *v = kvo_calloc(cap, sizeof(*v));
    if (!v) return KVO_ENOMEM;
    size_t k = 0;
    const int64_t at[] = {c->relay_restart_at, c->indexer_restart_at,
                          c->engine_restart_at, c->nats_kill_at};
    const check_fault_kind kinds[] = {CHECK_FAULT_RELAY, CHECK_FAULT_INDEXER,
                                      CHECK_FAULT_ENGINE, CHECK_FAULT_NATS};
    for (size_t i = 0; i < KVO_ARRAY_LEN(at); i++)
        if (at[i] >= 0 && (uint64_t)at[i] < requests)
            v[k++] = (check_fault){.at = (uint64_t)at[i], .kind = kinds[i]};
    if (c->chaos) {
        if (workers == 0 || dp == 0) {
            kvo_free(v);
            return KVO_EINVAL;
        }
        uint64_t rng = c->chaos_seed;
        check_fault_kind round[3];
        for (uint64_t i = c->chaos_every, j = 0; i < requests;
             i += c->chaos_every, j++) {
            if (j % 3 == 0) { /* a fresh order of the three kinds */
                round[0] = CHECK_FAULT_RELAY;
                round[1] = CHECK_FAULT_INDEXER;
                round[2] = CHECK_FAULT_NATS;
                for (int s = 2; s > 0; s--) {
                    int t = (int)(kvo_splitmix64(&rng) % (uint64_t)(s + 1));
                    check_fault_kind x = round[s];
                    round[s] = round[t];
                    round[t] = x;
                }
            }
            check_fault f = {.at = i, .kind = round[j % 3]};
            if (f.kind == CHECK_FAULT_RELAY) {
                uint64_t d = kvo_splitmix64(&rng);
                f.worker = (uint32_t)(d % workers);
                f.rank = (uint32_t)((d / workers) % dp);
            }
            v[k++] = f;
        }
    }
    if (k == 0) {
        kvo_free(v);
        return KVO_OK;
    }
    qsort(v, k, sizeof(*v), fault_cmp);
    for (size_t i = 0; i < k; i++) v[i].heal_ms = -1;
    *out = v;
    *n = k;
    return KVO_OK;
}

static const char *const REC_PROM[CHECK_FAULT_REC_COUNT] = {
#define X(field, name) "kvo_indexer_" name,
    CHECK_FAULT_RECOVERY(X)
#undef X
};

/* Counter i of stage "indexer" (0 when absent). */
static double rec_get(const check_counters *c, int i) {
    double v = c ? check_counters_get(c, "indexer", REC_PROM[i]) : 0;
    return isnan(v) ? 0 : v;
}

void check_fault_base(check_fault *f, const check_counters *before) {
    for (int i = 0; i < CHECK_FAULT_REC_COUNT; i++)
        f->rec_base[i] = rec_get(before, i);
}

void check_fault_recovery(check_fault *f, const check_counters *after) {
    for (int i = 0; i < CHECK_FAULT_REC_COUNT; i++)
        f->rec[i] = rec_get(after, i) - f->rec_base[i];
    f->has_recovery = true;
}

void check_fault_text(const check_fault *f, char *out, size_t outsz) {
    static const char *const verb[CHECK_FAULT_KIND_COUNT] = {
        [CHECK_FAULT_RELAY] = "relay restart",
        [CHECK_FAULT_INDEXER] = "indexer restart",
        [CHECK_FAULT_ENGINE] = "engine restart",
        [CHECK_FAULT_NATS] = "nats kill"};
    size_t len = 0;
    int w = snprintf(
        out, outsz, "before request %llu: %s %s", (unsigned long long)f->at,
        (unsigned)f->kind < CHECK_FAULT_KIND_COUNT ? verb[f->kind] : "?",
        f->target[0] ? f->target : "(not done)");
#define ADVANCE()                                                              \
    do {                                                                       \
        if (w < 0 || (size_t)w >= outsz - len) return;                         \
        len += (size_t)w;                                                      \
    } while (0)
    ADVANCE();
    if (!f->done) return;
    w = snprintf(out + len, outsz - len, ", back in %.0f ms", f->down_ms);
    ADVANCE();
    if (f->heal_ms >= 0)
        w = snprintf(out + len, outsz - len,
                     ", index synced %.0f ms after "
                     "the kill",
                     f->heal_ms);
    else
        w = snprintf(out + len, outsz - len, ", no sync after it");
    ADVANCE();
    if (!f->has_recovery) return;
    const char *sep = "; indexer ";
    for (int i = 0; i < CHECK_FAULT_REC_COUNT; i++) {
        if (f->rec[i] == 0) continue;
        w = snprintf(out + len, outsz - len, "%s%s %+.0f", sep,
                     check_fault_rec_name((check_fault_rec)i), f->rec[i]);
        ADVANCE();
        sep = ", ";
    }
    if (sep[0] == ';')
        snprintf(out + len, outsz - len, "; no recovery in the indexer");
#undef ADVANCE
}
