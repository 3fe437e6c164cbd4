/* kvo.h -- what every kvoracle module shares: the status enum, allocation
 * macros, logging, a growable buffer, an arena, clocks, option parsing and
 * signal handling.
 *
 * Libraries return a kvo_status and never log; executables and service loops
 * log through kvo_log() (stderr, one line: time, program, level, message).
 */
#ifndef KVO_H
#define KVO_H

#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVO_VERSION "0.1.0"

/* ---- Status codes --------------------------------------------------------
 * One table, so names and messages never drift (libuv style). */
#define KVO_STATUS_MAP(X)                                                      \
    X(OK, "success")                     /* nothing wrong */                   \
    X(ENOMEM, "out of memory")           /* allocation failed */               \
    X(EINVAL, "invalid argument")        /* caller/usage bug */                \
    X(EPROTO, "malformed input")         /* bad bytes/JSON */                  \
    X(ETRUNC, "truncated input")         /* input ends early */                \
    X(ETOOBIG, "input exceeds a limit")  /* size/count/depth */                \
    X(EUNSUPPORTED, "unsupported value") /* known-unknown */                   \
    X(EIO, "I/O error")                  /* file or pipe */                    \
    X(EOF, "end of input")               /* clean end */                       \
    X(ENOTFOUND, "not found")            /* lookup miss */                     \
    X(EEXIST, "already exists")          /* duplicate */                       \
    X(ETIMEDOUT, "timed out")            /* deadline passed */                 \
    X(EAGAIN, "try again")               /* not ready yet */                   \
    X(EINTR, "interrupted")              /* stop requested */                  \
    X(ENET, "network error")             /* zmq/socket */                      \
    X(ENATS, "NATS error")               /* nats.c failure */                  \
    X(EHTTP, "HTTP error")               /* MHD/curl failure */                \
    X(ESTATE, "invalid state")           /* wrong lifecycle */                 \
    X(ECHECK, "check failed")            /* oracle verdict */

typedef enum kvo_status {
#define KVO_STATUS_ENUM(name, msg) KVO_##name,
    KVO_STATUS_MAP(KVO_STATUS_ENUM)
#undef KVO_STATUS_ENUM
        KVO_STATUS_COUNT
} kvo_status;

/* Static message for a status ("malformed input"). Never NULL. */
const char *kvo_strerror(kvo_status s);
/* Static name for a status ("EPROTO"). Never NULL. */
const char *kvo_status_name(kvo_status s);

/* ---- Error detail ---------------------------------------------------------
 * The one way a failing call says why, beside its kvo_status: a one-line
 * message and, for input read from bytes, the offset where it went wrong.
 * Callers that do not care pass NULL. */
#define KVO_ERR_NO_OFFSET SIZE_MAX
typedef struct kvo_err {
    kvo_status status; /* same as the call's return value */
    size_t offset;     /* byte offset in the input, or KVO_ERR_NO_OFFSET */
    char msg[512];     /* "events[2].token_ids: expected int, got str" */
} kvo_err;

/* Fill *e (when not NULL) and return st, so a failure is one line:
 *     return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET, "bad %s", x); */
kvo_status kvo_err_set(kvo_err *e, kvo_status st, size_t offset,
                       const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "EPROTO at byte 17: <msg>" (or "EPROTO: <msg>") into buf; returns buf. */
const char *kvo_err_str(const kvo_err *e, char *buf, size_t n);

/* ---- Allocation ----------------------------------------------------------
 * All allocation goes through these so tests can inject failures:
 * kvo_alloc_fail_after(n) makes the (n+1)-th allocation from now fail;
 * kvo_alloc_fail_after(-1) turns injection off. */
void *kvo_malloc(size_t n);
void *kvo_calloc(size_t count, size_t size);
void *kvo_realloc(void *p, size_t n);
char *kvo_strdup(const char *s);
char *kvo_strndup(const char *s, size_t n);
void kvo_free(void *p);
void kvo_alloc_fail_after(long n);
/* For memory that is not kvo_malloc'd (pages mapped by hand): ask here
 * before taking it, so an injected failure reaches it too. Counts as one
 * allocation; false when it is to fail. */
bool kvo_alloc_ok(void);

/* ---- Growable byte buffer (caller-owned storage) ------------------------ */
typedef struct kvo_buf {
    uint8_t *data; /* owned; NULL until the first append */
    size_t len;
    size_t cap;
} kvo_buf;

void kvo_buf_init(kvo_buf *b);
void kvo_buf_fini(kvo_buf *b);
void kvo_buf_reset(kvo_buf *b); /* len = 0, keeps memory */
kvo_status kvo_buf_reserve(kvo_buf *b, size_t extra);
kvo_status kvo_buf_append(kvo_buf *b, const void *p, size_t n);
kvo_status kvo_buf_printf(kvo_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* NUL-terminates without counting the NUL in len. */
kvo_status kvo_buf_cstr(kvo_buf *b);

/* ---- Growable arrays -------------------------------------------------------
 * Make room for `need` items in the array *items_pp (any T **, pointing to
 * an array of *cap items of elem_size bytes, or to NULL with *cap == 0):
 * when need > *cap, the new capacity is first_cap (> 0) or *cap, doubled
 * until it holds need. KVO_ENOMEM (allocation failed or the size would
 * overflow) leaves the array and *cap unchanged. Typical push:
 *     if ((st = kvo_grow(&v->items, &v->cap, v->n + 1, sizeof(*v->items),
 *                        64)) != KVO_OK) return st;
 *     v->items[v->n++] = x; */
kvo_status kvo_grow(void *items_pp, size_t *cap, size_t need, size_t elem_size,
                    size_t first_cap);

/* ---- Arena (bump allocator, caller-owned storage) ------------------------
 * Everything allocated from an arena lives until kvo_arena_reset() or
 * kvo_arena_fini(). reset keeps the largest chunk, so a decoder that reuses
 * one arena per message stops allocating after warm-up. */
typedef struct kvo_arena_chunk kvo_arena_chunk;
typedef struct kvo_arena {
    kvo_arena_chunk *head;
    size_t used_total; /* bytes handed out since the last reset */
} kvo_arena;

void kvo_arena_init(kvo_arena *a);
void kvo_arena_fini(kvo_arena *a);
void kvo_arena_reset(kvo_arena *a);
/* 16-byte aligned; NULL when out of memory. */
void *kvo_arena_alloc(kvo_arena *a, size_t n);
void *kvo_arena_memdup(kvo_arena *a, const void *p, size_t n);

/* ---- Clocks ---------------------------------------------------------------*/
uint64_t kvo_now_ns(void);  /* CLOCK_MONOTONIC */
uint64_t kvo_unix_ns(void); /* CLOCK_REALTIME */
/* Sleep us microseconds (<= 0: not at all). A signal ends it early once
 * kvo_stop is set, so loops that poll kvo_stop see it at once; other
 * signals do not shorten it. */
void kvo_sleep_us(long us);

/* ---- Mixing and pseudo-random numbers -------------------------------------
 * splitmix64 (Steele, Lea, Flood): kvo_mix64 is its finalizer, a bijection
 * that spreads neighbouring inputs; kvo_splitmix64 advances *state by the
 * golden-ratio increment and returns the mixed value. Deterministic, not
 * for secrets. */
static inline uint64_t kvo_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t kvo_splitmix64(uint64_t *state) {
    return kvo_mix64(*state += 0x9E3779B97F4A7C15ull);
}

/* One block's term of a cached-block-set digest: the engine (kvo-mocker's
 * /kvo/state cached_digest) and the index (kvo-indexer's /blocks digest)
 * each sum it, mod 2^64, over their distinct blocks, so kvo-check compares
 * two numbers before it compares two lists. parent: the block's parent
 * hash, or none (has_parent false: a first block). */
static inline uint64_t kvo_block_digest(uint64_t hash, bool has_parent,
                                        uint64_t parent) {
    return kvo_mix64(
        hash ^ kvo_mix64((has_parent ? parent : 0) + 0x9E3779B97F4A7C15ull));
}

/* ---- Logging --------------------------------------------------------------*/
typedef enum kvo_level {
    KVO_LOG_ERROR = 0,
    KVO_LOG_WARN,
    KVO_LOG_INFO,
    KVO_LOG_DEBUG
} kvo_level;

void kvo_log_init(const char *program, kvo_level level);
kvo_status kvo_log_level_parse(const char *s, kvo_level *out);
kvo_level kvo_log_level(void);
void kvo_log(kvo_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* One log line per interval per site; the lines swallowed in between are
 * counted and reported on the next line that gets through. */
typedef struct kvo_ratelimit {
    uint64_t interval_ns; /* 0 = 10 s */
    uint64_t last_ns;
    uint64_t suppressed;
} kvo_ratelimit;

void kvo_log_limited(kvo_ratelimit *rl, kvo_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define kvo_error(...) kvo_log(KVO_LOG_ERROR, __VA_ARGS__)
#define kvo_warn(...) kvo_log(KVO_LOG_WARN, __VA_ARGS__)
#define kvo_info(...) kvo_log(KVO_LOG_INFO, __VA_ARGS__)
#define kvo_debug(...) kvo_log(KVO_LOG_DEBUG, __VA_ARGS__)

/* ---- Number parsing (whole string must match) -----------------------------*/
kvo_status kvo_parse_u64(const char *s, uint64_t *out);
kvo_status kvo_parse_i64(const char *s, int64_t *out);
kvo_status kvo_parse_u32(const char *s, uint32_t *out);
kvo_status kvo_parse_double(const char *s, double *out);
/* "host:port" or ":port" or "port" -> host (default 127.0.0.1) and port. */
kvo_status kvo_parse_hostport(const char *s, char *host, size_t hostsz,
                              uint16_t *port);

/* ---- Options --------------------------------------------------------------
 * kvo_getopt runs getopt_long over argv after applying environment
 * fallbacks: for every long option "--foo-bar" the variable KVO_FOO_BAR, when
 * set, is passed to set() first (flags: any value but "0" or "" sets them).
 * set() returns KVO_OK, or prints its own message and returns a failure.
 * Options that act instead of configuring (--help, --version) never read
 * the environment: KVO_HELP=1 must not turn every program into its help.
 * Returns optind (index of the first operand) or -1 on a usage error. */
typedef kvo_status (*kvo_opt_setter)(void *ctx, int code, const char *arg);
int kvo_getopt(int argc, char **argv, const struct option *longopts,
               kvo_opt_setter set, void *ctx);

/* ---- Signals --------------------------------------------------------------
 * SIGINT/SIGTERM set kvo_stop; SIGPIPE is ignored. Loops poll kvo_stop. */
extern volatile sig_atomic_t kvo_stop;
void kvo_signals_init(void);

/* Standard exit codes (DESIGN §3). */
enum { KVO_EXIT_OK = 0, KVO_EXIT_FAIL = 1, KVO_EXIT_USAGE = 2 };

#define KVO_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif /* KVO_H */
