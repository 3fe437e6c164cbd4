/* check_mutants.c -- `kvo-check mutants [--load]`: the check once per
 * encoder mutant of kvo-mocker (DESIGN §9), in a scenario where each can
 * be observed, and a matrix of expected vs observed with what caught each
 * (a prompt, counters, or under --load, which checkpoint and how).
 *
 * The catalog (names, expected outcome, one-line description) is the
 * mocker's own (mock_mutations()), so the two never disagree. A baseline run
 * without any mutant comes first: if it fails, the matrix means nothing.
 * Killed mutants run with fail-fast (the first divergence or tripped
 * counter ends the run); benign ones run the whole shortened trace.
 */
#include "check_int.h"
#include "mock.h"

#include <string.h>

const check_mutant *check_mutants(size_t *n) {
    static check_mutant list[MOCK_MUT_COUNT];
    static bool filled;
    if (!filled) {
        const mock_mutation_info *m = mock_mutations();
        for (size_t i = 0; i < MOCK_MUT_COUNT; i++) {
            list[i].name = m[i].name;
            list[i].killed = m[i].killed;
            list[i].what = m[i].what;
            list[i].incident = m[i].incident;
            list[i].needs = m[i].needs;
        }
        filled = true;
    }
    *n = MOCK_MUT_COUNT;
    return list;
}

static bool wanted(const char *only, const char *name) {
    if (!only || !*only) return true;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (!comma) break;
        p = comma + 1;
    }
    return false;
}

/* The true class of each killed mutant, from what it does (issue 13), and
 * the classes a stage upstream may name first when it catches the mutant
 * before any prompt (the relay's engine-hash verification, its
 * validation, the indexer's parent check). A killed mutant diagnosed as
 * anything else is a wrong diagnosis; one not listed is not judged. */
static const struct {
    const char *name;
    check_reason reasons[3];
} DIAGNOSES[] = {
    {"flip-stored-hash", {CHECK_REASON_HASH_MISMATCH}},
    {"drop-removed", {CHECK_REASON_STALE_BLOCK}},
    {"token-plus-one",
     {CHECK_REASON_TOKEN_MISMATCH, CHECK_REASON_HASH_MISMATCH,
      CHECK_REASON_REJECTED}},
    {"wrong-parent", {CHECK_REASON_WRONG_PARENT, CHECK_REASON_HASH_MISMATCH}},
    {"drop-dp-rank", {CHECK_REASON_WRONG_RANK}},
    {"drop-store", {CHECK_REASON_MISSED_STORE, CHECK_REASON_UNKNOWN_PARENT}},
    {"block-size-off", {CHECK_REASON_REJECTED}},
    {"truncate-tokens", {CHECK_REASON_TOKEN_MISMATCH, CHECK_REASON_REJECTED}},
    /* the parent goes instead of the block: the block stays (stale), its
     * parent is gone (its children's stores are refused) */
    {"swap-removed-hash",
     {CHECK_REASON_STALE_BLOCK, CHECK_REASON_MISSED_STORE,
      CHECK_REASON_UNKNOWN_PARENT}},
    {"skip-decode-stores", {CHECK_REASON_MISSED_STORE}},
    {"int-hash-first8", {CHECK_REASON_HASH_MISMATCH}},
    {"dup-store", {CHECK_REASON_STALE_BLOCK}},
    {"replay-drops-tail", {CHECK_REASON_SEQ_GAP}},
    {"resurrect-removed", {CHECK_REASON_STALE_BLOCK}},
    /* the sliding window's stores and removals land on the indexed group:
     * blocks the full group lacks, and holes in what it holds */
    {"group-collision", {CHECK_REASON_STALE_BLOCK, CHECK_REASON_MISSED_STORE}},
    {"cpu-tier-dropped", {CHECK_REASON_REJECTED}},
};

/* Whether reason is a right diagnosis of mutant name (true when the
 * matrix has no expectation for it). */
static bool diagnosis_ok(const char *name, check_reason reason) {
    for (size_t i = 0; i < KVO_ARRAY_LEN(DIAGNOSES); i++) {
        if (strcmp(DIAGNOSES[i].name, name) != 0) continue;
        for (size_t k = 0; k < KVO_ARRAY_LEN(DIAGNOSES[i].reasons); k++)
            if (DIAGNOSES[i].reasons[k] == reason &&
                reason != CHECK_REASON_NONE)
                return true;
        return false;
    }
    return true;
}

/* The traffic a mutant needs to be seen (check_mutant.needs), added to the
 * matrix's scenario: the options that show it into cfg and, as typed on a
 * command line, into opts. false: the matrix has no such scenario (yet, or
 * not in this mode); its row says "not run" rather than "passed". Every
 * run replays (each relay starts with one), so "replay" needs nothing. */
static bool scenario_for(const char *needs, check_cfg *cfg, char *opts,
                         size_t n) {
    opts[0] = '\0';
    if (!needs || strcmp(needs, "replay") == 0) return true;
    if (strcmp(needs, "salt") == 0 || strcmp(needs, "lora") == 0) {
        /* one traffic for both: adapters, tenants and images together */
        cfg->lora_adapters = 2;
        cfg->lora_fraction = 0.5;
        cfg->salt_tenants = 3;
        cfg->mm_fraction = 0.25;
        snprintf(opts, n,
                 "--lora-adapters 2 --lora-fraction 0.5 "
                 "--salt-tenants 3 --mm-fraction 0.25");
        return true;
    }
    if (strcmp(needs, "kv-groups") == 0) {
        /* full attention beside a sliding window: the pool is shared by
         * the groups, so twice the blocks hold the trace's prompts */
        cfg->kv_groups = "full,sliding:64";
        int w = snprintf(opts, n, "--kv-groups full,sliding:64");
        if (cfg->num_gpu_blocks && w > 0 && (size_t)w < n) {
            cfg->num_gpu_blocks *= 2;
            snprintf(opts + w, n - (size_t)w, " --num-gpu-blocks %llu",
                     (unsigned long long)cfg->num_gpu_blocks);
        }
        return true;
    }
    if (strcmp(needs, "cpu-offload") == 0) {
        /* a CPU tier as large as the GPU pool: evictions go there */
        cfg->cpu_offload_blocks =
            cfg->num_gpu_blocks ? cfg->num_gpu_blocks : 8192;
        snprintf(opts, n, "--cpu-offload-blocks %llu",
                 (unsigned long long)cfg->cpu_offload_blocks);
        return true;
    }
    if (strcmp(needs, "reset") == 0 && !cfg->load) {
        /* halfway, engines idle (lockstep only) */
        cfg->reset_at = cfg->limit ? (int64_t)(cfg->limit / 2) : 60;
        snprintf(opts, n, "--reset-at %lld", (long long)cfg->reset_at);
        return true;
    }
    return false;
}

bool check_mutant_scenario(const check_mutant *m, const check_cfg *base,
                           char *opts, size_t n) {
    check_cfg cfg = *base;
    return scenario_for(m->needs, &cfg, opts, n);
}

/* One row: run, then print. Returns whether it behaved as expected. */
static bool one(const check_cfg *base, const char *name, bool killed,
                const char *needs, const char *incident, FILE *f,
                kvo_status *setup) {
    check_cfg cfg = *base;
    char opts[160];
    scenario_for(needs, &cfg, opts, sizeof(opts));
    cfg.mutate = name;
    cfg.fail_fast = killed;
    cfg.report_json = NULL;
    cfg.report_html = NULL;
    cfg.progress = false;
    cfg.discard_logs = killed; /* an expected FAIL needs no logs */
    check_result *res = NULL;
    kvo_err err = {0};
    uint64_t t0 = kvo_now_ns();
    kvo_status st = check_result_new(&res);
    if (st == KVO_OK) st = check_run(&cfg, res, &err);
    double s = (double)(kvo_now_ns() - t0) / 1e9;
    bool ok;
    const char *observed, *where = "", *diagnosis = "-";
    char how[sizeof res->verdict.cause + 16];
    if (st != KVO_OK) {
        ok = false;
        observed = "error";
        snprintf(how, sizeof(how), "setup: %.400s",
                 err.msg[0] ? err.msg : kvo_strerror(st));
        *setup = st;
    } else {
        observed = res->verdict.pass ? "passed" : "killed";
        where = res->verdict.where;
        ok = res->verdict.pass != killed;
        if (!res->verdict.pass) {
            diagnosis = check_reason_name(res->verdict.reason);
            if (!*diagnosis) diagnosis = "(none)";
            if (killed && name && !diagnosis_ok(name, res->verdict.reason)) {
                ok = false;
                observed = "misnamed";
            }
        }
        if (res->verdict.pass)
            snprintf(how, sizeof(how),
                     "%zu prompts, no divergence, no "
                     "rejected event",
                     res->n_prompts);
        else
            snprintf(how, sizeof(how), "%s", res->verdict.cause);
    }
    fprintf(f, "%-18s %-8s %-8s %-4s %5.1fs  %-28s %-19s %.300s",
            name ? name : "(none)", killed ? "killed" : "benign", observed,
            ok ? "ok" : "BAD", s, where[0] ? where : "-", diagnosis, how);
    if (incident) fprintf(f, "  [%s]", incident);
    if (opts[0]) fprintf(f, "  {%s}", opts);
    fputc('\n', f);
    fflush(f);
    check_result_free(res);
    return ok;
}

kvo_status check_mutants_run(const check_cfg *base, const char *only, FILE *f,
                             bool *ok) {
    size_t n;
    const check_mutant *m = check_mutants(&n);
    if (only && *only) { /* every name must exist */
        char *list = kvo_strdup(only);
        if (!list) return KVO_ENOMEM;
        char *save = NULL;
        for (char *p = strtok_r(list, ",", &save); p;
             p = strtok_r(NULL, ",", &save)) {
            size_t i;
            for (i = 0; i < n && strcmp(m[i].name, p) != 0; i++) {
            }
            if (i == n && strcmp(p, "none") != 0) {
                fprintf(stderr, "kvo-check: unknown mutant '%s'\n", p);
                kvo_free(list);
                return KVO_EINVAL;
            }
        }
        kvo_free(list);
    }
    fprintf(f, "%-18s %-8s %-8s %-4s %6s  %-28s %-19s %s\n", "mutant",
            "expected", "observed", "", "time", "caught at", "diagnosis",
            "how (first cause)");
    kvo_status setup = KVO_OK;
    *ok = one(base, NULL, false, NULL, NULL, f, &setup);
    if (setup != KVO_OK) return setup; /* nothing runs: say so once */
    /* a scenario's own baseline before its first mutant: a mutant killed
     * where the correct engine fails too would prove nothing */
    char baselined[8][160];
    size_t nb = 0;
    for (size_t i = 0; i < n && !kvo_stop; i++) {
        if (!wanted(only, m[i].name)) continue;
        check_cfg probe = *base;
        char opts[160];
        if (!scenario_for(m[i].needs, &probe, opts, sizeof(opts))) {
            fprintf(f,
                    "%-18s %-8s %-8s %-4s %6s  %-28s %-19s needs %s "
                    "traffic, which the matrix does not send%s  [%s]\n",
                    m[i].name, m[i].killed ? "killed" : "benign", "not run",
                    "-", "-", "-", "-", m[i].needs,
                    base->load ? " under --load" : " yet",
                    m[i].incident ? m[i].incident : "-");
            continue;
        }
        size_t k;
        for (k = 0; k < nb && strcmp(baselined[k], opts) != 0; k++) {
        }
        if (opts[0] && k == nb && nb < KVO_ARRAY_LEN(baselined)) {
            snprintf(baselined[nb++], sizeof(baselined[0]), "%s", opts);
            *ok &= one(base, NULL, false, m[i].needs, NULL, f, &setup);
        }
        *ok &= one(base, m[i].name, m[i].killed, m[i].needs, m[i].incident, f,
                   &setup);
    }
    if (kvo_stop) return KVO_EINTR;
    return KVO_OK;
}
