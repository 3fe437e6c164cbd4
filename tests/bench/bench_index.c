/* bench_index.c -- kvo-bench-index: the index workloads of BENCH.md (W1)
 * and of issue 3, one thread, each call timed with a monotonic clock.
 *
 *   kvo-bench-index [w1|w1-1m|one-worker-1m]   (default w1)
 *
 * w1             BENCH.md W1 exactly: 8 workers, 64 prefix groups of 32
 *                shared blocks + 96 unique blocks per prompt, 1,024 prompts
 *                per worker, 20,000 queries, then removal of everything.
 * w1-1m          the same shape grown to about 1M resident blocks (1,302
 *                prompts per worker): 128-block prompt latency at 1M blocks
 *                over 8 workers (issue 3).
 * one-worker-1m  one worker, 10,396 prompts: about 1M resident blocks,
 *                for bytes per (block, worker) pair (issue 3).
 *
 * Output: human lines, plus "metric NAME VALUE" lines for tests/bench/index.sh.
 * Inputs are generated before the timed calls; each event / query / removal
 * is built into a reused buffer outside its timed call.
 */
#include "idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define GROUPS 64
#define PRE 32
#define SUF 96
#define BLOCKS (PRE + SUF)
#define QUERIES 20000

typedef struct wl {
    const char *name;
    int workers, prompts;
    uint64_t s;  /* splitmix64 state */
    uint64_t cs; /* checksum */
    uint64_t pre_tok[GROUPS][PRE], pre_blk[GROUPS][PRE];
    uint64_t *suf_tok, *suf_blk; /* [workers][prompts][SUF] */
} wl;

static uint64_t next(wl *w) {
    w->s += 0x9E3779B97F4A7C15ull;
    uint64_t z = w->s;
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ z >> 27) * 0x94D049BB133111EBull;
    return z ^ z >> 31;
}

static uint64_t gen(wl *w) {
    uint64_t v = next(w);
    w->cs = (w->cs << 5 | w->cs >> 59) ^ v;
    return v;
}

static size_t sidx(const wl *w, int wk, int i, int d) {
    return ((size_t)wk * (size_t)w->prompts + (size_t)i) * SUF + (size_t)d;
}

static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %lu kB", (unsigned long *)&kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

/* CPU time of this thread: a diagnostic next to wall time, which other
 * processes sharing the CPU inflate. */
static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static int u64cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct_us(uint64_t *v, size_t n, int p) {
    if (n == 0) return 0;
    qsort(v, n, sizeof(*v), u64cmp);
    size_t i = n * (size_t)p / 100;
    if (i >= n) i = n - 1;
    return (double)v[i] / 1e3;
}

static void metric(const char *name, double v) {
    printf("metric %s %.6g\n", name, v);
}

static int die(const char *what, kvo_status s) {
    fprintf(stderr, "kvo-bench-index: %s: %s\n", what, kvo_strerror(s));
    return 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "w1";
    static wl W;
    wl *w = &W;
    w->s = 1;
    w->name = mode;
    if (!strcmp(mode, "w1")) {
        w->workers = 8;
        w->prompts = 1024;
    } else if (!strcmp(mode, "w1-1m")) {
        w->workers = 8;
        w->prompts = 1302;
    } else if (!strcmp(mode, "one-worker-1m")) {
        w->workers = 1;
        w->prompts = 10396;
    } else {
        fprintf(stderr, "usage: kvo-bench-index [w1|w1-1m|one-worker-1m]\n");
        return 2;
    }

    /* ---- Workload (BENCH.md W1 generation order) ---- */
    uint64_t first[3] = {next(w), next(w), next(w)};
    if (first[0] != 0x910a2dec89025cc1ull || first[1] != 0xbeeb8da1658eec67ull ||
        first[2] != 0xf893a2eefb32555eull) {
        fprintf(stderr, "kvo-bench-index: splitmix64 does not match BENCH.md\n");
        return 1;
    }
    w->s = 1;
    size_t nsuf = (size_t)w->workers * (size_t)w->prompts * SUF;
    w->suf_tok = malloc(nsuf * sizeof(uint64_t));
    w->suf_blk = malloc(nsuf * sizeof(uint64_t));
    if (!w->suf_tok || !w->suf_blk) return die("workload", KVO_ENOMEM);
    for (int g = 0; g < GROUPS; g++)
        for (int d = 0; d < PRE; d++) {
            w->pre_tok[g][d] = gen(w);
            w->pre_blk[g][d] = gen(w);
        }
    for (int wk = 0; wk < w->workers; wk++)
        for (int i = 0; i < w->prompts; i++)
            for (int d = 0; d < SUF; d++) {
                w->suf_tok[sidx(w, wk, i, d)] = gen(w);
                w->suf_blk[sidx(w, wk, i, d)] = gen(w);
            }
    printf("workload %s: %d workers, %d prefix groups x %d shared blocks + %d "
           "unique blocks per prompt, %d prompts per worker, %d queries\n",
           mode, w->workers, GROUPS, PRE, SUF, w->prompts, QUERIES);
    printf("workload checksum 0x%016llx%s\n", (unsigned long long)w->cs,
           !strcmp(mode, "w1") ? (w->cs == 0xfdd340d89e42c5ebull
                                      ? " (BENCH.md: 0xfdd340d89e42c5eb, same)"
                                      : " (BENCH.md: 0xfdd340d89e42c5eb, DIFFERENT)")
                               : "");

    idx_tree *t = NULL;
    kvo_status s = idx_tree_new(&t);
    if (s != KVO_OK) return die("tree", s);
    wire_rblock blk[BLOCKS];
    uint64_t hashes[BLOCKS];
    idx_evstatus st;
    idx_scores sc;
    idx_scores_init(&sc);

    /* ---- Apply ---- */
    uint64_t rss0 = rss_bytes();
    long flt0 = minor_faults();
    uint64_t cpu0 = cpu_ns();
    uint64_t apply_ns = 0, ops = 0, events = 0;
    for (int i = 0; i < w->prompts; i++)
        for (int wk = 0; wk < w->workers; wk++) {
            int g = i % GROUPS;
            bool has_prefix = i >= GROUPS; /* w stored g's prefix at i = g */
            uint32_t n = 0;
            if (!has_prefix)
                for (int d = 0; d < PRE; d++)
                    blk[n++] = (wire_rblock){w->pre_blk[g][d], w->pre_tok[g][d]};
            for (int d = 0; d < SUF; d++)
                blk[n++] = (wire_rblock){w->suf_blk[sidx(w, wk, i, d)],
                                         w->suf_tok[sidx(w, wk, i, d)]};
            wire_revent ev = {.worker_id = (uint64_t)wk, .type = WIRE_R_STORED,
                              .has_parent = has_prefix,
                              .parent_hash = w->pre_blk[g][PRE - 1],
                              .n_blocks = n, .blocks = blk};
            uint64_t t0 = kvo_now_ns();
            s = idx_tree_apply(t, &ev, &st);
            apply_ns += kvo_now_ns() - t0;
            if (s != KVO_OK) return die("apply", s);
            if (st != IDX_EV_OK) {
                fprintf(stderr, "kvo-bench-index: event rejected: %s\n",
                        idx_evstatus_name(st));
                return 1;
            }
            ops += n;
            events++;
        }
    uint64_t cpu1 = cpu_ns();
    uint64_t rss1 = rss_bytes();
    long flt1 = minor_faults();
    idx_stats ist;
    idx_tree_stats(t, &ist);
    printf("apply: %llu events, %llu block ops in %.1f ms: %.2f M block-ops/s "
           "(%ld page faults; thread CPU time %.1f ms)\n",
           (unsigned long long)events, (unsigned long long)ops, apply_ns / 1e6,
           ops / (apply_ns / 1e9) / 1e6, flt1 - flt0, (cpu1 - cpu0) / 1e6);
    printf("resident: %llu (block, worker) pairs, %llu nodes, %llu shared nodes\n",
           (unsigned long long)ist.pairs, (unsigned long long)ist.nodes,
           (unsigned long long)ist.sets);
    double bpp = (double)(rss1 - rss0) / (double)ist.pairs;
    printf("memory: RSS +%.1f MB = %.1f B per pair (tree's own accounting "
           "%.1f B per pair)\n",
           (rss1 - rss0) / 1048576.0, bpp, (double)ist.bytes / (double)ist.pairs);
    metric("apply_mops", ops / (apply_ns / 1e9) / 1e6);
    metric("apply_cpu_mops", ops / ((cpu1 - cpu0) / 1e9) / 1e6);
    metric("pairs", (double)ist.pairs);
    metric("bytes_per_pair", bpp);

    /* ---- Queries (the RNG continues) ---- */
    uint64_t *lat[3];
    size_t nlat[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) lat[k] = malloc(QUERIES * sizeof(uint64_t));
    uint64_t q_ns = 0, entries = 0, sum = 0;
    for (int q = 0; q < QUERIES; q++) {
        uint64_t kind = next(w) % 4;
        int k;
        if (kind <= 1) {
            int wk = (int)(next(w) % (uint64_t)w->workers);
            int i = (int)(next(w) % (uint64_t)w->prompts);
            memcpy(hashes, w->pre_tok[i % GROUPS], PRE * sizeof(uint64_t));
            memcpy(hashes + PRE, &w->suf_tok[sidx(w, wk, i, 0)],
                   SUF * sizeof(uint64_t));
            k = 0;
        } else if (kind == 2) {
            int g = (int)(next(w) % GROUPS);
            memcpy(hashes, w->pre_tok[g], PRE * sizeof(uint64_t));
            for (int d = PRE; d < BLOCKS; d++) hashes[d] = next(w);
            k = 1;
        } else {
            for (int d = 0; d < BLOCKS; d++) hashes[d] = next(w);
            k = 2;
        }
        uint64_t t0 = kvo_now_ns();
        s = idx_tree_query(t, hashes, BLOCKS, &sc);
        uint64_t dt = kvo_now_ns() - t0;
        if (s != KVO_OK) return die("query", s);
        q_ns += dt;
        lat[k][nlat[k]++] = dt;
        entries += sc.n;
        for (size_t j = 0; j < sc.n; j++) sum += sc.v[j].blocks;
    }
    printf("queries: %zu hit / %zu prefix / %zu random, %llu score entries, "
           "score sum %llu%s\n",
           nlat[0], nlat[1], nlat[2], (unsigned long long)entries,
           (unsigned long long)sum,
           !strcmp(mode, "w1") ? (sum == 4760992 && entries == 119192
                                      ? " (BENCH.md: 119,192 / 4,760,992, same)"
                                      : " (BENCH.md: 119,192 / 4,760,992, DIFFERENT)")
                               : "");
    const char *kname[3] = {"hit", "prefix", "random"};
    for (int k = 0; k < 3; k++) {
        double p50 = pct_us(lat[k], nlat[k], 50), p99 = pct_us(lat[k], nlat[k], 99);
        printf("query %-6s p50 %.2f us, p99 %.2f us\n", kname[k], p50, p99);
        char m[64];
        snprintf(m, sizeof(m), "%s_p50_us", kname[k]);
        metric(m, p50);
        snprintf(m, sizeof(m), "%s_p99_us", kname[k]);
        metric(m, p99);
    }
    printf("queries/s: %.0f k\n", QUERIES / (q_ns / 1e9) / 1e3);
    metric("queries_kps", QUERIES / (q_ns / 1e9) / 1e3);
    metric("score_sum", (double)sum);
    metric("score_entries", (double)entries);

    /* ---- Remove: suffixes deepest first, then prefixes ---- */
    uint64_t rm_ns = 0, removed = 0;
    for (int i = 0; i < w->prompts; i++)
        for (int wk = 0; wk < w->workers; wk++) {
            for (int d = 0; d < SUF; d++)
                hashes[d] = w->suf_blk[sidx(w, wk, i, SUF - 1 - d)];
            wire_revent ev = {.worker_id = (uint64_t)wk, .type = WIRE_R_REMOVED,
                              .n_removed = SUF, .removed = hashes};
            uint64_t t0 = kvo_now_ns();
            s = idx_tree_apply(t, &ev, &st);
            rm_ns += kvo_now_ns() - t0;
            if (s != KVO_OK || st != IDX_EV_OK) return die("remove", s);
            removed += SUF;
        }
    for (int g = 0; g < GROUPS; g++)
        for (int wk = 0; wk < w->workers; wk++) {
            for (int d = 0; d < PRE; d++) hashes[d] = w->pre_blk[g][PRE - 1 - d];
            wire_revent ev = {.worker_id = (uint64_t)wk, .type = WIRE_R_REMOVED,
                              .n_removed = PRE, .removed = hashes};
            uint64_t t0 = kvo_now_ns();
            s = idx_tree_apply(t, &ev, &st);
            rm_ns += kvo_now_ns() - t0;
            if (s != KVO_OK || st != IDX_EV_OK) return die("remove", s);
            removed += PRE;
        }
    idx_tree_stats(t, &ist);
    printf("remove: %llu blocks in %.1f ms: %.2f M blocks/s; pairs left %llu, "
           "nodes left %llu\n",
           (unsigned long long)removed, rm_ns / 1e6,
           removed / (rm_ns / 1e9) / 1e6, (unsigned long long)ist.pairs,
           (unsigned long long)ist.nodes);
    metric("remove_mbps", removed / (rm_ns / 1e9) / 1e6);
    metric("pairs_left", (double)ist.pairs);
    uint64_t peak = peak_rss_bytes();
    printf("peak RSS: %.1f MB (workload arrays %.1f MB of it)\n",
           peak / 1048576.0, 2.0 * nsuf * 8 / 1048576.0);
    metric("peak_rss_mb", peak / 1048576.0);

    idx_scores_fini(&sc);
    for (int k = 0; k < 3; k++) free(lat[k]);
    idx_tree_free(t);
    free(w->suf_tok);
    free(w->suf_blk);
    return ist.pairs == 0 ? 0 : 1;
}
