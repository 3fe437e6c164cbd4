/* kvo-bench-hash -- hash throughput (DESIGN §5, §11), each next to its
 * baseline measured in the same run:
 *
 *   router  wire_router_hash_blocks over u64 token ids (converted to u32 LE
 *           on the fly) vs raw XXH3-64 over the same bytes already in u32 LE
 *           form vs memcpy of those bytes; GB/s of token bytes (4 per token).
 *   engine  wire_engine_block, chained like a prompt (parent = previous
 *           digest), 16-token blocks of realistic ids (uniform below
 *           151,936, a Qwen-sized vocabulary), ns per block for each
 *           algorithm vs the raw digest (SHA-256 / XXH3-128) over the same
 *           serialized bytes, so the serialization cost is the difference.
 *           One more row: SHA-256 through OpenSSL 3's EVP_Digest, the API
 *           wire_hash.c avoids (it fetches the algorithm on every call).
 *
 * Times are this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): the machine
 * is shared, and wall time would count the moments another process held
 * the CPU. Every figure is the median of --runs runs. A checksum over all results
 * proves the work was done and that two runs did the same work.
 */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "mock.h"
#include "wire.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

typedef struct cfg {
    size_t router_tokens;
    size_t engine_blocks;
    int runs;
} cfg;

static uint64_t rng_state = 1;
static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t checksum;

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- router -------------------------------------------------------------*/

static void bench_router(const cfg *c, uint32_t bs) {
    size_t n = c->router_tokens / bs * bs, nb = n / bs;
    uint64_t *tok = malloc(n * sizeof(*tok));
    uint32_t *le = malloc(n * sizeof(*le)), *copy = malloc(n * sizeof(*le));
    uint64_t *out = malloc(nb * sizeof(*out));
    if (!tok || !le || !copy || !out) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++) {
        tok[i] = mock_trace_token(i / MOCK_TRACE_BLOCK, (uint32_t)(i % 512));
        le[i] = (uint32_t)tok[i]; /* x86: host order is little-endian */
    }
    double t_wire[16], t_raw[16], t_cpy[16];
    double gb = (double)n * 4 / 1e9;
    for (int r = 0; r < c->runs; r++) {
        uint64_t t0 = cpu_ns();
        wire_router_hash_blocks(tok, n, bs, WIRE_ROUTER_SEED, out);
        uint64_t t1 = cpu_ns();
        uint64_t x = 0;
        for (size_t b = 0; b < nb; b++)
            x ^= XXH3_64bits_withSeed(le + b * bs, 4 * (size_t)bs,
                                      WIRE_ROUTER_SEED);
        uint64_t t2 = cpu_ns();
        memcpy(copy, le, n * sizeof(*le));
        uint64_t t3 = cpu_ns();
        uint64_t y = 0;
        for (size_t b = 0; b < nb; b++) y ^= out[b];
        if (x != y) {
            fprintf(stderr, "router hash differs from raw XXH3-64\n");
            exit(1);
        }
        checksum ^= y ^ copy[n / 2];
        t_wire[r] = gb / ((double)(t1 - t0) / 1e9);
        t_raw[r] = gb / ((double)(t2 - t1) / 1e9);
        t_cpy[r] = gb / ((double)(t3 - t2) / 1e9);
    }
    double w = median(t_wire, c->runs), raw = median(t_raw, c->runs),
           cp = median(t_cpy, c->runs);
    printf("router  bs=%-5u %9zu blocks  wire %6.2f GB/s (%5.1f ns/block)  "
           "raw XXH3-64 %6.2f GB/s  memcpy %6.2f GB/s  wire/raw %.2f\n",
           bs, nb, w, (double)bs * 4 / w, raw, cp, w / raw);
    free(tok);
    free(le);
    free(copy);
    free(out);
}

/* ---- engine -------------------------------------------------------------*/

enum { BS = 16 };

static void digest_raw(wire_algo a, const uint8_t *p, size_t n, uint8_t *out) {
    if (a == WIRE_ALGO_SHA256 || a == WIRE_ALGO_SHA256_CBOR) {
        SHA256_CTX c;
        SHA256_Init(&c);
        SHA256_Update(&c, p, n);
        SHA256_Final(out, &c);
    } else {
        XXH128_canonical_t canon;
        XXH128_canonicalFromHash(&canon, XXH3_128bits(p, n));
        memcpy(out, canon.digest, 16);
    }
}

static void bench_engine(const cfg *c, wire_algo a, const uint64_t *tok,
                         bool evp) {
    size_t nb = c->engine_blocks;
    kvo_buf scratch, ser;
    kvo_buf_init(&scratch);
    kvo_buf_init(&ser);
    /* The serialized bytes of every block (the raw baseline digests them). */
    size_t *off = malloc((nb + 1) * sizeof(*off));
    wire_digest root, d;
    wire_engine_root(a, "0", &root);
    d = root;
    for (size_t i = 0; i < nb; i++) {
        off[i] = ser.len;
        if (wire_engine_serialize(a, &d, tok + i * BS, BS, NULL, &ser) ||
            wire_engine_block(a, &d, tok + i * BS, BS, NULL, &scratch, &d)) {
            fprintf(stderr, "engine hash failed\n");
            exit(1);
        }
    }
    off[nb] = ser.len;
    const EVP_MD *md = evp ? EVP_sha256() : NULL;
    double t_wire[16], t_raw[16], t_evp[16];
    for (int r = 0; r < c->runs; r++) {
        uint64_t t0 = cpu_ns();
        d = root;
        for (size_t i = 0; i < nb; i++)
            wire_engine_block(a, &d, tok + i * BS, BS, NULL, &scratch, &d);
        uint64_t t1 = cpu_ns();
        uint8_t out[32];
        uint64_t x = 0;
        for (size_t i = 0; i < nb; i++) {
            digest_raw(a, ser.data + off[i], off[i + 1] - off[i], out);
            x ^= out[31] ^ out[15];
        }
        uint64_t t2 = cpu_ns();
        if (evp) {
            for (size_t i = 0; i < nb; i++) {
                unsigned int olen;
                EVP_Digest(ser.data + off[i], off[i + 1] - off[i], out, &olen,
                           md, NULL);
                x ^= out[31];
            }
        }
        uint64_t t3 = cpu_ns();
        checksum ^= wire_digest_low64(&d) ^ x;
        t_wire[r] = (double)(t1 - t0) / (double)nb;
        t_raw[r] = (double)(t2 - t1) / (double)nb;
        t_evp[r] = (double)(t3 - t2) / (double)nb;
    }
    double w = median(t_wire, c->runs), raw = median(t_raw, c->runs);
    printf("engine  %-11s %8zu blocks of %d  wire %7.1f ns/block  raw digest "
           "%7.1f ns  serialization %6.1f ns  (%.0f B/block)\n",
           wire_algo_name(a), nb, BS, w, raw, w - raw,
           (double)ser.len / (double)nb);
    if (evp)
        printf("engine  sha256 via EVP_Digest one-shot (not used): %7.1f "
               "ns/block over the same bytes\n",
               median(t_evp, c->runs));
    free(off);
    kvo_buf_fini(&scratch);
    kvo_buf_fini(&ser);
}

/* ---- main ---------------------------------------------------------------*/

enum {
    OPT_HELP = 'h',
    OPT_VERSION = 'V',
    OPT_TOKENS = 1000,
    OPT_BLOCKS,
    OPT_RUNS
};

static const struct option longopts[] = {
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {"router-tokens", required_argument, NULL, OPT_TOKENS},
    {"engine-blocks", required_argument, NULL, OPT_BLOCKS},
    {"runs", required_argument, NULL, OPT_RUNS},
    {NULL, 0, NULL, 0}};

static kvo_status set_opt(void *ctx, int code, const char *arg) {
    cfg *c = ctx;
    uint64_t v;
    switch (code) {
    case OPT_HELP:
        printf("usage: kvo-bench-hash [--router-tokens N] [--engine-blocks N] "
               "[--runs R]\nRouter and engine hash throughput next to raw "
               "XXH3/SHA-256 and memcpy baselines.\n");
        exit(0);
    case OPT_VERSION: printf("kvo-bench-hash %s\n", KVO_VERSION); exit(0);
    case OPT_TOKENS:
    case OPT_BLOCKS:
    case OPT_RUNS:
        if (kvo_parse_u64(arg, &v) != KVO_OK || v == 0 ||
            (code == OPT_RUNS && v > 16)) {
            fprintf(stderr, "kvo-bench-hash: bad value '%s'\n", arg);
            return KVO_EINVAL;
        }
        if (code == OPT_TOKENS) c->router_tokens = (size_t)v;
        if (code == OPT_BLOCKS) c->engine_blocks = (size_t)v;
        if (code == OPT_RUNS) c->runs = (int)v;
        return KVO_OK;
    default: return KVO_EINVAL;
    }
}

int main(int argc, char **argv) {
    cfg c = {.router_tokens = 16u << 20, .engine_blocks = 1u << 20, .runs = 5};
    int first = kvo_getopt(argc, argv, longopts, set_opt, &c);
    if (first < 0 || first != argc) {
        if (first >= 0) fprintf(stderr, "kvo-bench-hash: no operands\n");
        return KVO_EXIT_USAGE;
    }
    printf("kvo-bench-hash %s: %zu router tokens, %zu engine blocks, median "
           "of %d runs\n",
           KVO_VERSION, c.router_tokens, c.engine_blocks, c.runs);
    bench_router(&c, 16);
    bench_router(&c, 64);
    bench_router(&c, 1024);

    uint64_t *tok = malloc(c.engine_blocks * BS * sizeof(*tok));
    if (!tok) return KVO_EXIT_USAGE;
    for (size_t i = 0; i < c.engine_blocks * BS; i++)
        tok[i] = rng_next() % 151936;
    for (int a = 0; a < WIRE_ALGO_COUNT; a++)
        bench_engine(&c, (wire_algo)a, tok, a == WIRE_ALGO_SHA256);
    free(tok);
    printf("checksum %016" PRIx64 "\n", checksum);
    return KVO_EXIT_OK;
}
