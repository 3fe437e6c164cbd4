/* kvo_prom.c -- Prometheus text writer (see kvo_prom.h). */
#include "kvo_prom.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

void kvo_prom_init(kvo_prom *p, kvo_buf *out, const char *prefix) {
    p->out = out;
    p->prefix = prefix ? prefix : "";
    p->st = KVO_OK;
}

void kvo_prom_family(kvo_prom *p, const char *name, const char *type,
                     const char *help) {
    if (p->st != KVO_OK) return;
    p->st = kvo_buf_printf(p->out, "# HELP %s%s %s\n# TYPE %s%s %s\n",
                           p->prefix, name, help, p->prefix, name, type);
}

/* <prefix><name>[{labels}] then the value, which the caller appends. */
static void head(kvo_prom *p, const char *name, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void head(kvo_prom *p, const char *name, const char *fmt, va_list ap) {
    if (p->st != KVO_OK) return;
    p->st = kvo_buf_printf(p->out, "%s%s", p->prefix, name);
    if (p->st != KVO_OK || !fmt || !*fmt) return;
    char labels[512];
    int n = vsnprintf(labels, sizeof(labels), fmt, ap);
    if (n < 0 || (size_t)n >= sizeof(labels)) {
        p->st = KVO_ETOOBIG; /* a caller bug: labels are short */
        return;
    }
    p->st = kvo_buf_printf(p->out, "{%s}", labels);
}

void kvo_prom_u64(kvo_prom *p, const char *name, uint64_t v,
                  const char *labels_fmt, ...) {
    va_list ap;
    va_start(ap, labels_fmt);
    head(p, name, labels_fmt, ap);
    va_end(ap);
    if (p->st == KVO_OK) p->st = kvo_buf_printf(p->out, " %" PRIu64 "\n", v);
}

void kvo_prom_f64(kvo_prom *p, const char *name, double v,
                  const char *labels_fmt, ...) {
    va_list ap;
    va_start(ap, labels_fmt);
    head(p, name, labels_fmt, ap);
    va_end(ap);
    if (p->st == KVO_OK) p->st = kvo_buf_printf(p->out, " %.17g\n", v);
}

void kvo_prom_counter(kvo_prom *p, const char *name, const char *help,
                      uint64_t v) {
    kvo_prom_family(p, name, "counter", help);
    kvo_prom_u64(p, name, v, NULL);
}

void kvo_prom_gauge(kvo_prom *p, const char *name, const char *help,
                    uint64_t v) {
    kvo_prom_family(p, name, "gauge", help);
    kvo_prom_u64(p, name, v, NULL);
}

kvo_status kvo_prom_status(const kvo_prom *p) { return p->st; }
