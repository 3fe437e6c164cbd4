/* kvo_prom.h -- the Prometheus text exposition format (version 0.0.4), the
 * one writer every /metrics uses.
 *
 *   kvo_prom p;
 *   kvo_prom_init(&p, &buf, "kvo_relay_");
 *   kvo_prom_family(&p, "rejects_total", "counter", "events rejected");
 *   kvo_prom_u64(&p, "rejects_total", n, "kind=\"%s\"", kind);
 *   kvo_prom_counter(&p, "batches_total", "batches decoded", batches);
 *   st = kvo_prom_status(&p);
 *
 * Errors stick: after the first failed append every call is a no-op and
 * kvo_prom_status() returns that failure (KVO_ENOMEM), so writers need no
 * check per line. Names get the prefix; label text is written as given
 * (printf-style, NULL for none), so label values must not hold '"', '\' or
 * a newline.
 */
#ifndef KVO_PROM_H
#define KVO_PROM_H

#include "kvo.h"

#define KVO_PROM_CTYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct kvo_prom {
    kvo_buf *out;       /* appended to; owned by the caller */
    const char *prefix; /* put before every name ("" for none) */
    kvo_status st;      /* first failure, or KVO_OK */
} kvo_prom;

void kvo_prom_init(kvo_prom *p, kvo_buf *out, const char *prefix);
/* "# HELP <name> <help>" and "# TYPE <name> <type>" (counter, gauge,
 * histogram). */
void kvo_prom_family(kvo_prom *p, const char *name, const char *type,
                     const char *help);
/* One sample: <name>{<labels>} <v>. */
void kvo_prom_u64(kvo_prom *p, const char *name, uint64_t v,
                  const char *labels_fmt, ...)
    __attribute__((format(printf, 4, 5)));
void kvo_prom_f64(kvo_prom *p, const char *name, double v,
                  const char *labels_fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A family with one unlabelled sample. */
void kvo_prom_counter(kvo_prom *p, const char *name, const char *help,
                      uint64_t v);
void kvo_prom_gauge(kvo_prom *p, const char *name, const char *help,
                    uint64_t v);
kvo_status kvo_prom_status(const kvo_prom *p);

#endif /* KVO_PROM_H */
