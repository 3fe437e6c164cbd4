/* kvo.c -- shared basics: status table, allocation with failure injection,
 * buffers, arenas, clocks, logging, number parsing, options, signals. */
#include "kvo.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- Status --------------------------------------------------------------*/

static const char *const status_msg[] = {
#define KVO_STATUS_MSG(name, msg) msg,
    KVO_STATUS_MAP(KVO_STATUS_MSG)
#undef KVO_STATUS_MSG
};

static const char *const status_name[] = {
#define KVO_STATUS_NAME(name, msg) #name,
    KVO_STATUS_MAP(KVO_STATUS_NAME)
#undef KVO_STATUS_NAME
};

const char *kvo_strerror(kvo_status s) {
    if ((unsigned)s >= KVO_STATUS_COUNT) return "unknown status";
    return status_msg[s];
}

const char *kvo_status_name(kvo_status s) {
    if ((unsigned)s >= KVO_STATUS_COUNT) return "UNKNOWN";
    return status_name[s];
}

/* ---- Error detail --------------------------------------------------------*/

kvo_status kvo_err_set(kvo_err *e, kvo_status st, size_t offset,
                       const char *fmt, ...) {
    if (!e) return st;
    e->status = st;
    e->offset = offset;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return st;
}

const char *kvo_err_str(const kvo_err *e, char *buf, size_t n) {
    if (!buf || n == 0) return "";
    if (!e) {
        snprintf(buf, n, "no error");
        return buf;
    }
    const char *msg = e->msg[0] ? e->msg : kvo_strerror(e->status);
    if (e->offset == KVO_ERR_NO_OFFSET)
        snprintf(buf, n, "%s: %s", kvo_status_name(e->status), msg);
    else
        snprintf(buf, n, "%s at byte %zu: %s", kvo_status_name(e->status),
                 e->offset, msg);
    return buf;
}

/* ---- Allocation ----------------------------------------------------------*/

static long alloc_budget = -1; /* -1 = no injection */

static bool alloc_should_fail(void) {
    if (alloc_budget < 0) return false;
    if (alloc_budget == 0) return true;
    alloc_budget--;
    return false;
}

void kvo_alloc_fail_after(long n) { alloc_budget = n; }

bool kvo_alloc_ok(void) { return !alloc_should_fail(); }

void *kvo_malloc(size_t n) {
    if (alloc_should_fail()) return NULL;
    return malloc(n ? n : 1);
}

void *kvo_calloc(size_t count, size_t size) {
    if (alloc_should_fail()) return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *kvo_realloc(void *p, size_t n) {
    if (alloc_should_fail()) return NULL;
    return realloc(p, n ? n : 1);
}

char *kvo_strdup(const char *s) { return kvo_strndup(s, strlen(s)); }

char *kvo_strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = kvo_malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void kvo_free(void *p) { free(p); }

/* ---- Buffer --------------------------------------------------------------*/

void kvo_buf_init(kvo_buf *b) { memset(b, 0, sizeof(*b)); }

void kvo_buf_fini(kvo_buf *b) {
    kvo_free(b->data);
    memset(b, 0, sizeof(*b));
}

void kvo_buf_reset(kvo_buf *b) { b->len = 0; }

kvo_status kvo_buf_reserve(kvo_buf *b, size_t extra) {
    if (extra > SIZE_MAX - b->len - 1) return KVO_ENOMEM;
    size_t need = b->len + extra + 1; /* room for kvo_buf_cstr's NUL */
    if (need <= b->cap) return KVO_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *d = kvo_realloc(b->data, cap);
    if (!d) return KVO_ENOMEM;
    b->data = d;
    b->cap = cap;
    return KVO_OK;
}

kvo_status kvo_buf_append(kvo_buf *b, const void *p, size_t n) {
    kvo_status st = kvo_buf_reserve(b, n);
    if (st != KVO_OK) return st;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return KVO_OK;
}

/* Formats once into the room already there; only text that does not fit
 * is formatted a second time, after the buffer grew. */
kvo_status kvo_buf_printf(kvo_buf *b, const char *fmt, ...) {
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(room ? (char *)b->data + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) return KVO_EINVAL;
    if ((size_t)n >= room) {
        kvo_status st = kvo_buf_reserve(b, (size_t)n);
        if (st != KVO_OK) return st;
        va_start(ap, fmt);
        vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
    return KVO_OK;
}

kvo_status kvo_buf_cstr(kvo_buf *b) {
    kvo_status st = kvo_buf_reserve(b, 0);
    if (st != KVO_OK) return st;
    b->data[b->len] = '\0';
    return KVO_OK;
}

/* ---- Growable arrays -----------------------------------------------------*/

kvo_status kvo_grow(void *items_pp, size_t *cap, size_t need, size_t elem_size,
                    size_t first_cap) {
    assert(first_cap > 0 && elem_size > 0);
    if (need <= *cap) return KVO_OK;
    size_t n = *cap ? *cap : first_cap;
    while (n < need) {
        if (n > SIZE_MAX / 2) return KVO_ENOMEM;
        n *= 2;
    }
    if (n > SIZE_MAX / elem_size) return KVO_ENOMEM;
    /* items_pp is a T **: copy the pointer by its bytes (object pointers
     * share one representation on every platform we build for), as a store
     * through a void ** would break strict aliasing */
    void *items;
    memcpy(&items, items_pp, sizeof(items));
    items = kvo_realloc(items, n * elem_size);
    if (!items) return KVO_ENOMEM;
    memcpy(items_pp, &items, sizeof(items));
    *cap = n;
    return KVO_OK;
}

/* ---- Arena ---------------------------------------------------------------
 * A list of chunks, newest first; allocation bumps inside the head chunk and
 * adds a chunk (at least double the last) when it does not fit. */

struct kvo_arena_chunk {
    kvo_arena_chunk *next;
    size_t size; /* usable bytes in data[] */
    size_t used;
    _Alignas(16) uint8_t data[];
};

#define ARENA_FIRST_CHUNK 4096u

void kvo_arena_init(kvo_arena *a) { memset(a, 0, sizeof(*a)); }

void kvo_arena_fini(kvo_arena *a) {
    kvo_arena_chunk *c = a->head;
    while (c) {
        kvo_arena_chunk *next = c->next;
        kvo_free(c);
        c = next;
    }
    memset(a, 0, sizeof(*a));
}

void kvo_arena_reset(kvo_arena *a) {
    /* Keep the largest chunk (the head is always the largest). */
    kvo_arena_chunk *c = a->head;
    if (c) {
        kvo_arena_chunk *rest = c->next;
        while (rest) {
            kvo_arena_chunk *next = rest->next;
            kvo_free(rest);
            rest = next;
        }
        c->next = NULL;
        c->used = 0;
    }
    a->used_total = 0;
}

void *kvo_arena_alloc(kvo_arena *a, size_t n) {
    size_t need = (n + 15u) & ~(size_t)15u;
    if (need < n) return NULL;
    kvo_arena_chunk *c = a->head;
    if (!c || c->size - c->used < need) {
        size_t size = c ? c->size * 2 : ARENA_FIRST_CHUNK;
        while (size < need) {
            if (size > SIZE_MAX / 2) return NULL;
            size *= 2;
        }
        kvo_arena_chunk *nc = kvo_malloc(sizeof(*nc) + size);
        if (!nc) return NULL;
        nc->next = c;
        nc->size = size;
        nc->used = 0;
        a->head = c = nc;
    }
    void *p = c->data + c->used;
    c->used += need;
    a->used_total += need;
    return p;
}

void *kvo_arena_memdup(kvo_arena *a, const void *p, size_t n) {
    void *d = kvo_arena_alloc(a, n);
    if (d && n) memcpy(d, p, n);
    return d;
}

/* ---- Clocks --------------------------------------------------------------*/

static uint64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvo_now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
uint64_t kvo_unix_ns(void) { return clock_ns(CLOCK_REALTIME); }

void kvo_sleep_us(long us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !kvo_stop) {
    }
}

/* ---- Logging -------------------------------------------------------------*/

static char log_program[64] = "kvo";
static kvo_level log_level = KVO_LOG_INFO;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

void kvo_log_init(const char *program, kvo_level level) {
    snprintf(log_program, sizeof(log_program), "%s", program);
    log_level = level;
}

kvo_level kvo_log_level(void) { return log_level; }

kvo_status kvo_log_level_parse(const char *s, kvo_level *out) {
    for (unsigned i = 0; i < KVO_ARRAY_LEN(level_names); i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (kvo_level)i;
            return KVO_OK;
        }
    }
    if (strcmp(s, "warning") == 0) {
        *out = KVO_LOG_WARN;
        return KVO_OK;
    }
    return KVO_EINVAL;
}

__attribute__((format(printf, 3, 0))) static void
log_line(kvo_level level, const char *suffix, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    /* One fprintf per line so concurrent writers do not interleave. */
    fprintf(stderr, "%s.%03ldZ %s %s: %s%s\n", when, ts.tv_nsec / 1000000,
            log_program, level_names[level], msg, suffix);
}

void kvo_log(kvo_level level, const char *fmt, ...) {
    if (level > log_level) return;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, "", fmt, ap);
    va_end(ap);
}

void kvo_log_limited(kvo_ratelimit *rl, kvo_level level, const char *fmt, ...) {
    if (level > log_level) return;
    uint64_t now = kvo_now_ns();
    uint64_t interval = rl->interval_ns ? rl->interval_ns : 10000000000ull;
    if (rl->last_ns && now - rl->last_ns < interval) {
        rl->suppressed++;
        return;
    }
    char suffix[64] = "";
    if (rl->suppressed)
        snprintf(suffix, sizeof(suffix), " (%" PRIu64 " similar suppressed)",
                 rl->suppressed);
    rl->last_ns = now;
    rl->suppressed = 0;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, suffix, fmt, ap);
    va_end(ap);
}

/* ---- Number parsing ------------------------------------------------------*/

kvo_status kvo_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return KVO_EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return KVO_EINVAL;
    *out = (uint64_t)v;
    return KVO_OK;
}

kvo_status kvo_parse_i64(const char *s, int64_t *out) {
    if (!s || !*s || *s == ' ') return KVO_EINVAL;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (errno || *end) return KVO_EINVAL;
    *out = (int64_t)v;
    return KVO_OK;
}

kvo_status kvo_parse_u32(const char *s, uint32_t *out) {
    uint64_t v;
    if (kvo_parse_u64(s, &v) != KVO_OK || v > UINT32_MAX) return KVO_EINVAL;
    *out = (uint32_t)v;
    return KVO_OK;
}

kvo_status kvo_parse_double(const char *s, double *out) {
    if (!s || !*s || *s == ' ') return KVO_EINVAL;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return KVO_EINVAL;
    *out = v;
    return KVO_OK;
}

kvo_status kvo_parse_hostport(const char *s, char *host, size_t hostsz,
                              uint16_t *port) {
    const char *colon = strrchr(s, ':');
    const char *p = colon ? colon + 1 : s;
    uint32_t v;
    if (kvo_parse_u32(p, &v) != KVO_OK || v > 65535) return KVO_EINVAL;
    size_t hlen = colon ? (size_t)(colon - s) : 0;
    if (hlen >= hostsz) return KVO_EINVAL;
    if (hlen == 0) {
        snprintf(host, hostsz, "127.0.0.1");
    } else {
        memcpy(host, s, hlen);
        host[hlen] = '\0';
    }
    *port = (uint16_t)v;
    return KVO_OK;
}

/* ---- Options -------------------------------------------------------------*/

static void env_name(const char *longname, char *out, size_t n) {
    size_t j = 0;
    const char prefix[] = "KVO_";
    for (size_t i = 0; prefix[i] && j + 1 < n; i++) out[j++] = prefix[i];
    for (size_t i = 0; longname[i] && j + 1 < n; i++) {
        char c = longname[i];
        out[j++] = c == '-' ? '_' : (char)(c >= 'a' && c <= 'z' ? c - 32 : c);
    }
    out[j] = '\0';
}

int kvo_getopt(int argc, char **argv, const struct option *longopts,
               kvo_opt_setter set, void *ctx) {
    for (const struct option *o = longopts; o->name; o++) {
        if (o->flag || strcmp(o->name, "help") == 0 ||
            strcmp(o->name, "version") == 0)
            continue;
        char name[128];
        env_name(o->name, name, sizeof(name));
        const char *v = getenv(name);
        if (!v) continue;
        if (o->has_arg == no_argument) {
            if (!*v || strcmp(v, "0") == 0) continue;
            v = NULL;
        }
        if (set(ctx, o->val, v) != KVO_OK) {
            fprintf(stderr, "%s: bad value in environment %s\n", argv[0], name);
            return -1;
        }
    }
    /* Build a short-option string from the table ("h" for help etc.). */
    char shortopts[128] = "+";
    size_t k = 1;
    for (const struct option *o = longopts; o->name; o++) {
        if (o->flag || o->val <= 0 || o->val > 127 ||
            k + 3 >= sizeof(shortopts))
            continue;
        shortopts[k++] = (char)o->val;
        if (o->has_arg == required_argument) shortopts[k++] = ':';
        if (o->has_arg == optional_argument) {
            shortopts[k++] = ':';
            shortopts[k++] = ':';
        }
    }
    shortopts[k] = '\0';
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (c == '?' || c == ':') return -1;
        if (c == 0) continue;
        if (set(ctx, c, optarg) != KVO_OK) return -1;
    }
    return optind;
}

/* ---- Signals -------------------------------------------------------------*/

volatile sig_atomic_t kvo_stop = 0;

static void on_stop_signal(int sig) {
    (void)sig;
    kvo_stop = 1;
}

void kvo_signals_init(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}
