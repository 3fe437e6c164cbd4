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

/* Whether the matrix's runs send the traffic a mutant needs to be seen
 * (check_mutant.needs). Every run replays (each relay starts with one);
 * the other dimensions have no scenario in the matrix yet, and their
 * mutants are listed as not run rather than as passed. */
static bool scenario_runs(const char *needs) {
    return !needs || strcmp(needs, "replay") == 0;
}

/* One row: run, then print. Returns whether it behaved as expected. */
static bool one(const check_cfg *base, const char *name, bool killed, FILE *f,
                kvo_status *setup) {
    check_cfg cfg = *base;
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
    const char *observed, *where = "";
    char how[480];
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
        if (res->verdict.pass)
            snprintf(how, sizeof(how), "%zu prompts, no divergence, no "
                                       "rejected event", res->n_prompts);
        else
            snprintf(how, sizeof(how), "%s", res->verdict.cause);
    }
    fprintf(f, "%-18s %-8s %-8s %-4s %5.1fs  %-28s %.300s\n",
            name ? name : "(none)", killed ? "killed" : "benign", observed,
            ok ? "ok" : "BAD", s, where[0] ? where : "-", how);
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
            for (i = 0; i < n && strcmp(m[i].name, p) != 0; i++) {}
            if (i == n && strcmp(p, "none") != 0) {
                fprintf(stderr, "kvo-check: unknown mutant '%s'\n", p);
                kvo_free(list);
                return KVO_EINVAL;
            }
        }
        kvo_free(list);
    }
    fprintf(f, "%-18s %-8s %-8s %-4s %6s  %-28s %s\n", "mutant", "expected",
            "observed", "", "time", "caught at", "how (first cause)");
    kvo_status setup = KVO_OK;
    *ok = one(base, NULL, false, f, &setup);
    if (setup != KVO_OK) return setup; /* nothing runs: say so once */
    for (size_t i = 0; i < n && !kvo_stop; i++) {
        if (!wanted(only, m[i].name)) continue;
        if (!scenario_runs(m[i].needs)) {
            fprintf(f, "%-18s %-8s %-8s %-4s %6s  %-28s needs %s traffic, "
                       "which the matrix does not send yet\n",
                    m[i].name, m[i].killed ? "killed" : "benign", "not run",
                    "-", "-", "-", m[i].needs);
            continue;
        }
        *ok &= one(base, m[i].name, m[i].killed, f, &setup);
    }
    if (kvo_stop) return KVO_EINTR;
    return KVO_OK;
}
