/* tc.h -- helpers shared by the oracle's test files: run the kvo-check
 * binary as a child, read its JSON-lines report, render HTML in chromium. */
#ifndef TC_H
#define TC_H

#include "kt.h"

/* Under a sanitizer every process is several times slower: the end-to-end
 * tests shorten their traces. */
#if defined(__SANITIZE_ADDRESS__)
#define TC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TC_SANITIZED 1
#endif
#endif
#ifndef TC_SANITIZED
#define TC_SANITIZED 0
#endif

typedef struct tc_run {
    char dir[512];        /* fresh per run: log, reports, process logs */
    char log[600];        /* kvo-check's stdout+stderr */
    char json[600];       /* --report-json */
    char html[600];       /* --report-html */
    int exit_code;        /* 128+n when killed by signal n */
    json_object *lines;   /* array of the report's per-prompt objects */
    json_object *summary; /* the "summary" object (NULL if none) */
} tc_run;

/* Run kvo-check with args (NULL-terminated, without argv[0]) plus
 * --report-json/--report-html/--log-dir in r->dir, to its end. Fails the
 * test if it does not end within timeout_s. Reads the report (if any). */
void tc_check(tc_run *r, const char *tag, const char *const args[],
              long timeout_s);
/* Prints kvo-check's output (for a failing assertion's context). */
void tc_dump(const tc_run *r);
/* Frees what tc_check read; removes the directory unless keep. */
void tc_free(tc_run *r, bool keep);
/* Whole file into a malloc'd NUL-terminated string. */
char *tc_slurp(const char *path);
/* Number in the summary's counters: counters[stage][name] (NaN if absent).
 * stage_prefix matches the start of the stage name; values are summed. */
double tc_counter(const tc_run *r, const char *stage_prefix,
                  const char *name_part);
/* Per-prompt line i (by position), or NULL. */
json_object *tc_line(const tc_run *r, size_t i);
int64_t tc_int(json_object *o, const char *key);

/* 1 rendered fine, 0 not (why says), -1 chromium not installed. */
int tc_html_renders(const char *html_path, char *why, size_t whysz);

#endif /* TC_H */
