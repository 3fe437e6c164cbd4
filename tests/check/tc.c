/* tc.c -- see tc.h. */
#include "tc.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

char *tc_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    kvo_buf b;
    kvo_buf_init(&b);
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
        ck_assert(kvo_buf_append(&b, tmp, n) == KVO_OK);
    fclose(f);
    ck_assert(kvo_buf_cstr(&b) == KVO_OK);
    return (char *)b.data;
}

static void read_report(tc_run *r) {
    char *text = tc_slurp(r->json);
    r->lines = json_object_new_array();
    if (!text) return;
    char *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save)) {
        json_object *j = json_tokener_parse(l);
        ck_assert_msg(j != NULL, "report line is not JSON: %.200s", l);
        json_object *s;
        if (json_object_object_get_ex(j, "summary", &s)) {
            r->summary = json_object_get(s);
            json_object_put(j);
        } else {
            json_object_array_add(r->lines, j);
        }
    }
    kvo_free(text);
}

void tc_check(tc_run *r, const char *tag, const char *const args[],
              long timeout_s) {
    memset(r, 0, sizeof(*r));
    char *dir = kt_tmpdir(tag);
    snprintf(r->dir, sizeof(r->dir), "%s", dir);
    kvo_free(dir);
    snprintf(r->log, sizeof(r->log), "%s/kvo-check.out", r->dir);
    snprintf(r->json, sizeof(r->json), "%s/report.jsonl", r->dir);
    snprintf(r->html, sizeof(r->html), "%s/report.html", r->dir);
    char logs[600];
    snprintf(logs, sizeof(logs), "%s/logs", r->dir);

    char *exe = kt_bin_path("kvo-check");
    size_t n = 0;
    while (args[n]) n++;
    char **argv = kvo_calloc(n + 12, sizeof(char *));
    ck_assert_ptr_nonnull(argv);
    size_t k = 0;
    argv[k++] = exe;
    for (size_t i = 0; i < n; i++) argv[k++] = (char *)args[i];
    bool mutants = n > 0 && strcmp(args[0], "mutants") == 0;
    if (!mutants) {
        argv[k++] = "--report-json";
        argv[k++] = r->json;
        argv[k++] = "--report-html";
        argv[k++] = r->html;
    }
    argv[k++] = "--log-dir";
    argv[k++] = logs;
    argv[k] = NULL;
    kvo_proc p;
    memset(&p, 0, sizeof(p));
    ck_assert_int_eq(kvo_proc_spawn(&p, "kvo-check", argv, r->log), KVO_OK);
    kvo_free(argv);
    kvo_free(exe);
    kt_guard g;
    kt_guard_start(&g, &p);
    uint64_t deadline = kvo_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    while (kvo_proc_alive(&p)) {
        if (kvo_now_ns() > deadline) {
            kvo_proc_stop(&p, 5000);
            kvo_proc_dump_log(&p, 80);
            ck_abort_msg("kvo-check did not end within %ld s", timeout_s);
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    kt_guard_release(&g);
    r->exit_code = p.exit_status;
    if (!mutants) read_report(r);
}

void tc_dump(const tc_run *r) {
    char *text = tc_slurp(r->log);
    fprintf(stderr, "---- kvo-check output (%s) ----\n%s\n----\n", r->log,
            text ? text : "(none)");
    kvo_free(text);
}

static void rm_tree(const char *dir) {
    char cmd[1200];
    if (strchr(dir, '\'')) return;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

void tc_free(tc_run *r, bool keep) {
    json_object_put(r->lines);
    json_object_put(r->summary);
    r->lines = r->summary = NULL;
    if (!keep) rm_tree(r->dir);
}

double tc_counter(const tc_run *r, const char *stage_prefix,
                  const char *name_part) {
    json_object *counters;
    if (!r->summary ||
        !json_object_object_get_ex(r->summary, "counters", &counters))
        return NAN;
    double sum = 0;
    bool found = false;
    size_t pl = strlen(stage_prefix);
    json_object_object_foreach(counters, stage, vals) {
        if (strncmp(stage, stage_prefix, pl) != 0) continue;
        json_object_object_foreach(vals, name, v) {
            if (!strstr(name, name_part) || !v) continue;
            sum += json_object_get_double(v);
            found = true;
        }
    }
    return found ? sum : NAN;
}

json_object *tc_line(const tc_run *r, size_t i) {
    if (!r->lines || i >= json_object_array_length(r->lines)) return NULL;
    return json_object_array_get_idx(r->lines, i);
}

int64_t tc_int(json_object *o, const char *key) {
    json_object *v;
    ck_assert_msg(o && json_object_object_get_ex(o, key, &v), "missing key %s",
                  key);
    return json_object_get_int64(v);
}

int tc_html_renders(const char *html_path, char *why, size_t whysz) {
    const char *chromium = "/usr/bin/chromium";
    if (access(chromium, X_OK) != 0) return -1;
    char *dir = kt_tmpdir("chromium");
    char cmd[2400];
    snprintf(cmd, sizeof(cmd),
             "%s --headless --no-sandbox --disable-gpu --disable-quic "
             "--no-first-run --disable-background-networking "
             "--disable-component-update --disable-sync "
             "--user-data-dir=%s/profile --dump-dom 'file://%s' "
             ">%s/dom.html 2>%s/stderr.txt",
             chromium, dir, html_path, dir, dir);
    int rc = system(cmd);
    char path[600];
    snprintf(path, sizeof(path), "%s/dom.html", dir);
    char *dom = tc_slurp(path);
    int ok = 0;
    if (rc != 0 || !dom) {
        snprintf(why, whysz, "chromium exited with %d", rc);
    } else if (!strstr(dom, "data-rendered=\"ok\"")) {
        snprintf(why, whysz,
                 "rendered DOM lacks data-rendered=\"ok\" (the "
                 "script did not run or the plot has no size)");
    } else if (!strstr(dom, "id=\"summary\"") || !strstr(dom, "<polyline")) {
        snprintf(why, whysz, "rendered DOM lacks the summary or the plot");
    } else {
        ok = 1;
    }
    kvo_free(dom);
    rm_tree(dir);
    kvo_free(dir);
    return ok;
}
