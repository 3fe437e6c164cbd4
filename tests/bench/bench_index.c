/* bench_index.c -- kvo-bench-index: the index workload of BENCH.md (W1) at
 * its three sizes, in both protocols, and the floor it is judged against.
 *
 *   kvo-bench-index [SIZE [PROTOCOL [floor]]]
 *
 *   SIZE      w1 (1,024 prompts per worker), w1x4 (4,096), w1x16 (16,384);
 *             also w1-1m (1,302: about 1M resident blocks over 8 workers)
 *             and one-worker-1m (1 worker, 10,396 prompts), issue 3's shapes
 *   PROTOCOL  cold: one pass in this fresh process, first touch of every
 *             page included (BENCH.md's protocol);
 *             warm: apply, query, remove, then the same again in the same
 *             process; the second pass is measured (its pages are resident)
 *   floor     instead of the tree, an open-addressing table of u64 keys
 *             (linear probing, load <= 3/4, doubling, keys mix(tokens_hash,
 *             worker)): one insert per (block, worker) pair for apply, 128
 *             lookups per query. What a block op cannot beat.
 *
 *   kvo-bench-index service SIZE NATS_URL HTTP_URL
 *             against a running kvo-indexer: one thread POSTs hit queries
 *             to HTTP_URL/query_by_hash in a closed loop while the main
 *             thread publishes SIZE's stored events to NATS_URL as
 *             event-plane messages (<= 128 events / 8,192 blocks each, as
 *             the relay batches them) as fast as nats.c takes them; query
 *             latency idle, while the apply streams in, and after it
 *             (GET /counters "applied" reaching the message count).
 *
 * Every workload value comes from BENCH.md's splitmix64 order; the workload
 * checksum and the query score sum are printed, and a run whose sums differ
 * from BENCH.md's exits 1 with "DIFFERENT" on stdout (the tree is wrong, or
 * the workload is not W1's). Inputs are built outside the timed calls; each
 * event, query and removal is timed alone with a monotonic clock. Besides
 * wall time each phase reports the thread's CPU time and its page faults:
 * on a shared machine wall time is inflated by others, CPU time much less.
 *
 * Output: human lines, plus "metric NAME VALUE" lines for tests/bench/index.sh.
 */
#include "idx.h"
#include "kvo_http.h"

#include <nats/nats.h>
#include <pthread.h>

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
#define KINDS 3 /* hit, prefix, random */

typedef struct size_def {
    const char *name;
    int workers, prompts;
    uint64_t score_sum; /* BENCH.md's, 0 = none given */
    uint64_t entries;   /* BENCH.md's score entries, 0 = none given */
    uint64_t checksum;  /* BENCH.md's workload checksum, 0 = none given */
} size_def;

static const size_def SIZES[] = {
    {"w1", 8, 1024, 4760992, 119192, 0xfdd340d89e42c5ebull},
    {"w1x4", 8, 4096, 4812832, 0, 0},
    {"w1x16", 8, 16384, 4777248, 0, 0},
    {"w1-1m", 8, 1302, 0, 0, 0},
    {"one-worker-1m", 1, 10396, 0, 0, 0},
};

typedef struct wl {
    const size_def *sz;
    int workers, prompts;
    uint64_t s;      /* splitmix64 state */
    uint64_t cs;     /* checksum */
    uint64_t q_seed; /* RNG state where the queries start */
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

/* ---- Process measurements -------------------------------------------------- */

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
    unsigned long kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

/* Transparent huge pages the process holds (smaps_rollup), bytes. */
static uint64_t thp_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    unsigned long kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

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

/* One phase: wall time of the timed calls, CPU time and faults around it. */
typedef struct phase {
    uint64_t wall_ns, cpu0, cpu_ns;
    long flt0, faults;
} phase;

static void phase_begin(phase *p) {
    memset(p, 0, sizeof(*p));
    p->flt0 = minor_faults();
    p->cpu0 = cpu_ns();
}

static void phase_end(phase *p) {
    p->cpu_ns = cpu_ns() - p->cpu0;
    p->faults = minor_faults() - p->flt0;
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

/* ---- The workload's streams -------------------------------------------------- */

/* The blocks of W1's store event (prompt i, worker wk) into blk; returns the
 * count and sets *has_parent. */
static uint32_t store_blocks(const wl *w, int i, int wk, wire_rblock *blk,
                             bool *has_parent) {
    int g = i % GROUPS;
    *has_parent = i >= GROUPS; /* wk stored g's prefix at i = g */
    uint32_t n = 0;
    if (!*has_parent)
        for (int d = 0; d < PRE; d++)
            blk[n++] = (wire_rblock){w->pre_blk[g][d], w->pre_tok[g][d]};
    for (int d = 0; d < SUF; d++)
        blk[n++] = (wire_rblock){w->suf_blk[sidx(w, wk, i, d)],
                                 w->suf_tok[sidx(w, wk, i, d)]};
    return n;
}

/* Query q's hashes into h (the RNG continues from *s); returns its kind and
 * the worker it targets (hit queries; 0 otherwise). */
static int query_make(wl *w, uint64_t *h, int *target) {
    uint64_t kind = next(w) % 4;
    *target = 0;
    if (kind <= 1) {
        int wk = (int)(next(w) % (uint64_t)w->workers);
        int i = (int)(next(w) % (uint64_t)w->prompts);
        memcpy(h, w->pre_tok[i % GROUPS], PRE * sizeof(uint64_t));
        memcpy(h + PRE, &w->suf_tok[sidx(w, wk, i, 0)], SUF * sizeof(uint64_t));
        *target = wk;
        return 0;
    }
    if (kind == 2) {
        int g = (int)(next(w) % GROUPS);
        memcpy(h, w->pre_tok[g], PRE * sizeof(uint64_t));
        for (int d = PRE; d < BLOCKS; d++) h[d] = next(w);
        return 1;
    }
    for (int d = 0; d < BLOCKS; d++) h[d] = next(w);
    return 2;
}

/* ---- What one pass measured ------------------------------------------------ */

typedef struct pass {
    phase apply, query, remove;
    uint64_t ops, events, removed;
    uint64_t apply_max_ns; /* the longest single event (a stall: growth) */
    uint64_t rss0, rss1;   /* around apply */
    uint64_t thp1;         /* huge pages held after apply */
    uint64_t pairs, pairs_left, nodes_left, tree_bytes;
    uint64_t *lat[KINDS];
    size_t nlat[KINDS];
    uint64_t entries, sum, hits;
} pass;

static void pass_init(pass *p) {
    memset(p, 0, sizeof(*p));
    for (int k = 0; k < KINDS; k++)
        p->lat[k] = malloc(QUERIES * sizeof(uint64_t));
}

static void pass_fini(pass *p) {
    for (int k = 0; k < KINDS; k++) free(p->lat[k]);
}

/* ---- The tree ---------------------------------------------------------------- */

static kvo_status tree_pass(wl *w, idx_tree *t, pass *p) {
    wire_rblock blk[BLOCKS];
    uint64_t hashes[BLOCKS];
    idx_evstatus st;
    kvo_status s = KVO_OK;
    idx_scores sc;
    idx_scores_init(&sc);

    p->rss0 = rss_bytes();
    phase_begin(&p->apply);
    for (int i = 0; i < w->prompts; i++)
        for (int wk = 0; wk < w->workers; wk++) {
            bool hp;
            uint32_t n = store_blocks(w, i, wk, blk, &hp);
            wire_revent ev = {.worker_id = (uint64_t)wk,
                              .type = WIRE_R_STORED,
                              .has_parent = hp,
                              .parent_hash = w->pre_blk[i % GROUPS][PRE - 1],
                              .n_blocks = n,
                              .blocks = blk};
            uint64_t t0 = kvo_now_ns();
            s = idx_tree_apply(t, &ev, &st);
            uint64_t dt = kvo_now_ns() - t0;
            p->apply.wall_ns += dt;
            if (dt > p->apply_max_ns) p->apply_max_ns = dt;
            if (s != KVO_OK) goto done;
            if (st != IDX_EV_OK) {
                fprintf(stderr, "kvo-bench-index: event rejected: %s\n",
                        idx_evstatus_name(st));
                s = KVO_ESTATE;
                goto done;
            }
            p->ops += n;
            p->events++;
        }
    phase_end(&p->apply);
    p->rss1 = rss_bytes();
    p->thp1 = thp_bytes();
    idx_stats ist;
    idx_tree_stats(t, &ist);
    p->pairs = ist.pairs;
    p->tree_bytes = ist.bytes;

    w->s = w->q_seed;
    phase_begin(&p->query);
    for (int q = 0; q < QUERIES; q++) {
        int target;
        int k = query_make(w, hashes, &target);
        uint64_t t0 = kvo_now_ns();
        s = idx_tree_query(t, hashes, BLOCKS, &sc);
        uint64_t dt = kvo_now_ns() - t0;
        if (s != KVO_OK) goto done;
        p->query.wall_ns += dt;
        p->lat[k][p->nlat[k]++] = dt;
        p->entries += sc.n;
        for (size_t j = 0; j < sc.n; j++) p->sum += sc.v[j].blocks;
    }
    phase_end(&p->query);

    phase_begin(&p->remove);
    for (int i = 0; i < w->prompts; i++)
        for (int wk = 0; wk < w->workers; wk++) {
            for (int d = 0; d < SUF; d++)
                hashes[d] = w->suf_blk[sidx(w, wk, i, SUF - 1 - d)];
            wire_revent ev = {.worker_id = (uint64_t)wk,
                              .type = WIRE_R_REMOVED,
                              .n_removed = SUF,
                              .removed = hashes};
            uint64_t t0 = kvo_now_ns();
            s = idx_tree_apply(t, &ev, &st);
            p->remove.wall_ns += kvo_now_ns() - t0;
            if (s != KVO_OK) goto done;
            if (st != IDX_EV_OK) {
                s = KVO_ESTATE;
                goto done;
            }
            p->removed += SUF;
        }
    for (int g = 0; g < GROUPS; g++)
        for (int wk = 0; wk < w->workers; wk++) {
            for (int d = 0; d < PRE; d++)
                hashes[d] = w->pre_blk[g][PRE - 1 - d];
            wire_revent ev = {.worker_id = (uint64_t)wk,
                              .type = WIRE_R_REMOVED,
                              .n_removed = PRE,
                              .removed = hashes};
            uint64_t t0 = kvo_now_ns();
            s = idx_tree_apply(t, &ev, &st);
            p->remove.wall_ns += kvo_now_ns() - t0;
            if (s != KVO_OK) goto done;
            if (st != IDX_EV_OK) {
                s = KVO_ESTATE;
                goto done;
            }
            p->removed += PRE;
        }
    phase_end(&p->remove);
    idx_tree_stats(t, &ist);
    p->pairs_left = ist.pairs;
    p->nodes_left = ist.nodes;
done:
    idx_scores_fini(&sc);
    return s;
}

/* ---- The floor: u64 keys, linear probing ------------------------------------ */

typedef struct floor_tab {
    uint64_t *k; /* 0 = empty */
    uint64_t mask, len;
} floor_tab;

static uint64_t floor_key(uint64_t th, int wk) {
    uint64_t k = kvo_mix64(th ^ (uint64_t)(wk + 1) * 0x9E3779B97F4A7C15ull);
    return k ? k : 1;
}

static void floor_put_raw(floor_tab *f, uint64_t k) {
    uint64_t i = k & f->mask;
    while (f->k[i] && f->k[i] != k) i = (i + 1) & f->mask;
    f->len += f->k[i] == 0;
    f->k[i] = k;
}

static kvo_status floor_put(floor_tab *f, uint64_t k) {
    if ((f->len + 1) * 4 > (f->mask + 1) * 3) {
        floor_tab g = {calloc((f->mask + 1) * 2, sizeof(uint64_t)),
                       (f->mask + 1) * 2 - 1, 0};
        if (!g.k) return KVO_ENOMEM;
        for (uint64_t i = 0; i <= f->mask; i++)
            if (f->k[i]) floor_put_raw(&g, f->k[i]);
        free(f->k);
        *f = g;
    }
    floor_put_raw(f, k);
    return KVO_OK;
}

static bool floor_has(const floor_tab *f, uint64_t k) {
    for (uint64_t i = k & f->mask;; i = (i + 1) & f->mask) {
        if (f->k[i] == k) return true;
        if (!f->k[i]) return false;
    }
}

static kvo_status floor_pass(wl *w, floor_tab *f, pass *p) {
    wire_rblock blk[BLOCKS];
    uint64_t hashes[BLOCKS];
    if (!f->k) {
        f->mask = 63;
        f->len = 0;
        f->k = calloc(f->mask + 1, sizeof(uint64_t));
        if (!f->k) return KVO_ENOMEM;
    }
    p->rss0 = rss_bytes();
    phase_begin(&p->apply);
    for (int i = 0; i < w->prompts; i++)
        for (int wk = 0; wk < w->workers; wk++) {
            bool hp;
            uint32_t n = store_blocks(w, i, wk, blk, &hp);
            uint64_t t0 = kvo_now_ns();
            for (uint32_t j = 0; j < n; j++) {
                kvo_status s = floor_put(f, floor_key(blk[j].tokens_hash, wk));
                if (s != KVO_OK) return s;
            }
            uint64_t dt = kvo_now_ns() - t0;
            p->apply.wall_ns += dt;
            if (dt > p->apply_max_ns) p->apply_max_ns = dt;
            p->ops += n;
            p->events++;
        }
    phase_end(&p->apply);
    p->rss1 = rss_bytes();
    p->pairs = f->len;
    p->tree_bytes = (f->mask + 1) * sizeof(uint64_t);

    w->s = w->q_seed;
    phase_begin(&p->query);
    for (int q = 0; q < QUERIES; q++) {
        int target;
        int k = query_make(w, hashes, &target);
        uint64_t t0 = kvo_now_ns();
        uint64_t hits = 0;
        for (int d = 0; d < BLOCKS; d++)
            hits += floor_has(f, floor_key(hashes[d], target));
        uint64_t dt = kvo_now_ns() - t0;
        p->query.wall_ns += dt;
        p->lat[k][p->nlat[k]++] = dt;
        p->hits += hits;
    }
    phase_end(&p->query);
    /* the next pass starts from an empty table of the same capacity, as a
     * tree keeps its capacity after removing everything */
    memset(f->k, 0, (f->mask + 1) * sizeof(uint64_t));
    f->len = 0;
    return KVO_OK;
}

/* ---- Report ------------------------------------------------------------------- */

static double mops(uint64_t n, uint64_t ns) {
    return ns ? n / (ns / 1e9) / 1e6 : 0;
}

static void report(const wl *w, pass *p, bool is_floor) {
    printf("apply: %llu events, %llu block ops in %.1f ms: %.2f M block-ops/s "
           "(thread CPU %.1f ms: %.2f M/s; %ld page faults; longest event "
           "%.0f us)\n",
           (unsigned long long)p->events, (unsigned long long)p->ops,
           p->apply.wall_ns / 1e6, mops(p->ops, p->apply.wall_ns),
           p->apply.cpu_ns / 1e6, mops(p->ops, p->apply.cpu_ns),
           p->apply.faults, p->apply_max_ns / 1e3);
    double bpp = p->pairs ? (double)(p->rss1 - p->rss0) / (double)p->pairs : 0;
    printf("memory: %llu pairs, RSS +%.1f MB = %.1f B per pair (own "
           "accounting %.1f B per pair; %.0f MB in huge pages)\n",
           (unsigned long long)p->pairs, (p->rss1 - p->rss0) / 1048576.0, bpp,
           p->pairs ? (double)p->tree_bytes / (double)p->pairs : 0,
           p->thp1 / 1048576.0);
    metric("apply_mops", mops(p->ops, p->apply.wall_ns));
    metric("apply_cpu_mops", mops(p->ops, p->apply.cpu_ns));
    metric("apply_faults", (double)p->apply.faults);
    metric("apply_max_us", p->apply_max_ns / 1e3);
    metric("pairs", (double)p->pairs);
    metric("bytes_per_pair", bpp);

    if (!is_floor) {
        const size_def *z = w->sz;
        bool same = (!z->score_sum || p->sum == z->score_sum) &&
                    (!z->entries || p->entries == z->entries);
        printf(
            "queries: %zu hit / %zu prefix / %zu random, %llu score entries, "
            "score sum %llu",
            p->nlat[0], p->nlat[1], p->nlat[2], (unsigned long long)p->entries,
            (unsigned long long)p->sum);
        if (z->score_sum)
            printf(" (BENCH.md: %llu, %s)\n", (unsigned long long)z->score_sum,
                   same ? "same" : "DIFFERENT");
        else
            printf("\n");
    } else {
        printf("queries: %zu hit / %zu prefix / %zu random, %llu of %d x 128 "
               "lookups found\n",
               p->nlat[0], p->nlat[1], p->nlat[2], (unsigned long long)p->hits,
               QUERIES);
    }
    const char *kname[KINDS] = {"hit", "prefix", "random"};
    for (int k = 0; k < KINDS; k++) {
        double p50 = pct_us(p->lat[k], p->nlat[k], 50);
        double p99 = pct_us(p->lat[k], p->nlat[k], 99);
        printf("query %-6s p50 %.2f us, p99 %.2f us\n", kname[k], p50, p99);
        char m[64];
        snprintf(m, sizeof(m), "%s_p50_us", kname[k]);
        metric(m, p50);
        snprintf(m, sizeof(m), "%s_p99_us", kname[k]);
        metric(m, p99);
    }
    printf("queries/s: %.0f k (thread CPU %.1f ms; %ld page faults)\n",
           QUERIES / (p->query.wall_ns / 1e9) / 1e3, p->query.cpu_ns / 1e6,
           p->query.faults);
    metric("queries_kps", QUERIES / (p->query.wall_ns / 1e9) / 1e3);
    metric("query_faults", (double)p->query.faults);
    if (is_floor) return;
    metric("score_sum", (double)p->sum);
    metric("score_entries", (double)p->entries);
    printf("remove: %llu blocks in %.1f ms: %.2f M blocks/s (thread CPU %.1f "
           "ms; %ld page faults); pairs left %llu, nodes left %llu\n",
           (unsigned long long)p->removed, p->remove.wall_ns / 1e6,
           mops(p->removed, p->remove.wall_ns), p->remove.cpu_ns / 1e6,
           p->remove.faults, (unsigned long long)p->pairs_left,
           (unsigned long long)p->nodes_left);
    metric("remove_mbps", mops(p->removed, p->remove.wall_ns));
    metric("remove_cpu_mbps", mops(p->removed, p->remove.cpu_ns));
    metric("remove_faults", (double)p->remove.faults);
}

/* ---- The service under a streaming apply ------------------------------------ */

typedef struct qloop {
    wl *w;
    const char *url; /* .../query_by_hash */
    volatile int stop;
    uint64_t *t0, *dt; /* start (monotonic ns) and latency of each query */
    size_t n, cap;
    uint64_t errors;
} qloop;

static void *query_loop(void *arg) {
    qloop *q = arg;
    kvo_http_client *c = NULL;
    if (kvo_http_client_new(&c, 10000) != KVO_OK) return NULL;
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    uint64_t rs = 12345;
    char *body = malloc(BLOCKS * 24 + 64);
    while (!q->stop && q->n < q->cap) {
        int wk = (int)(kvo_splitmix64(&rs) % (uint64_t)q->w->workers);
        int i = (int)(kvo_splitmix64(&rs) % (uint64_t)q->w->prompts);
        size_t len = (size_t)sprintf(body, "{\"tokens_hashes\":[");
        for (int d = 0; d < BLOCKS; d++)
            len += (size_t)sprintf(
                body + len, "%s%llu", d ? "," : "",
                (unsigned long long)(d < PRE ? q->w->pre_tok[i % GROUPS][d]
                                             : q->w->suf_tok[sidx(q->w, wk, i,
                                                                  d - PRE)]));
        len += (size_t)sprintf(body + len, "]}");
        uint64_t t0 = kvo_now_ns();
        kvo_status s =
            kvo_http_post(c, q->url, "application/json", body, len, &resp);
        uint64_t dt = kvo_now_ns() - t0;
        if (s != KVO_OK || resp.status != 200) {
            q->errors++;
            continue;
        }
        q->t0[q->n] = t0;
        q->dt[q->n++] = dt;
    }
    free(body);
    kvo_http_resp_fini(&resp);
    kvo_http_client_free(c);
    return NULL;
}

static uint64_t applied_messages(kvo_http_client *c, const char *base) {
    char url[512];
    snprintf(url, sizeof(url), "%s/counters", base);
    kvo_http_resp r;
    kvo_http_resp_init(&r);
    uint64_t n = 0;
    if (kvo_http_get(c, url, &r) == KVO_OK && r.status == 200) {
        const char *p = r.body.data
                            ? strstr((const char *)r.body.data, "\"applied\"")
                            : NULL;
        if (p) n = strtoull(strchr(p, ':') + 1, NULL, 10);
    }
    kvo_http_resp_fini(&r);
    return n;
}

static void lat_row(const char *name, qloop *q, uint64_t from, uint64_t to) {
    uint64_t *v = malloc((q->n ? q->n : 1) * sizeof(uint64_t));
    size_t k = 0;
    uint64_t mx = 0;
    for (size_t i = 0; i < q->n; i++)
        if (q->t0[i] >= from && q->t0[i] < to) {
            v[k++] = q->dt[i];
            if (q->dt[i] > mx) mx = q->dt[i];
        }
    double p50 = pct_us(v, k, 50), p99 = pct_us(v, k, 99);
    printf("query %-7s %6zu queries: p50 %.0f us, p99 %.0f us, max %.0f us\n",
           name, k, p50, p99, mx / 1e3);
    char m[64];
    snprintf(m, sizeof(m), "svc_%s_p50_us", name);
    metric(m, p50);
    snprintf(m, sizeof(m), "svc_%s_p99_us", name);
    metric(m, p99);
    snprintf(m, sizeof(m), "svc_%s_max_us", name);
    metric(m, mx / 1e3);
    free(v);
}

static int service_run(wl *w, const char *nats_url, const char *http) {
    /* every stored event, batched as the relay batches them */
    size_t nev = (size_t)w->workers * (size_t)w->prompts;
    wire_rblock *blk = malloc(nev * BLOCKS * sizeof(wire_rblock));
    wire_revent *ev = calloc(nev, sizeof(wire_revent));
    kvo_buf *msgs = calloc(nev, sizeof(kvo_buf));
    uint64_t *event_id = calloc((size_t)w->workers, sizeof(uint64_t));
    if (!blk || !ev || !msgs || !event_id) return die("service", KVO_ENOMEM);
    size_t k = 0, nmsg = 0, first = 0, blocks = 0;
    for (int i = 0; i < w->prompts; i++)
        for (int wk = 0; wk < w->workers; wk++) {
            bool hp;
            uint32_t n = store_blocks(w, i, wk, blk + k * BLOCKS, &hp);
            ev[k] =
                (wire_revent){.worker_id = (uint64_t)wk,
                              .tier = WIRE_TIER_DEVICE,
                              .event_id = ++event_id[wk],
                              .type = WIRE_R_STORED,
                              .has_parent = hp,
                              .parent_hash = w->pre_blk[i % GROUPS][PRE - 1],
                              .n_blocks = n,
                              .blocks = blk + k * BLOCKS};
            k++;
        }
    for (size_t e = 0; e <= nev; e++) {
        bool flush =
            e == nev || e - first == 128 || blocks + ev[e].n_blocks > 8192;
        if (flush && e > first) {
            wire_plane_msg m;
            wire_plane_init(&m);
            m.publisher_id = 1;
            m.sequence = nmsg;
            m.published_at = 0;
            m.topic.p = "kv-events";
            m.topic.len = 9;
            m.n_events = (uint32_t)(e - first);
            m.events = ev + first;
            kvo_buf_init(&msgs[nmsg]);
            kvo_status s = wire_plane_encode(&m, &msgs[nmsg]);
            m.events = NULL;
            m.n_events = 0;
            wire_plane_fini(&m);
            if (s != KVO_OK) return die("encode", s);
            nmsg++;
            first = e;
            blocks = 0;
        }
        if (e < nev) blocks += ev[e].n_blocks;
    }
    natsConnection *nc = NULL;
    if (natsConnection_ConnectTo(&nc, nats_url) != NATS_OK) {
        fprintf(stderr, "kvo-bench-index: cannot connect to %s\n", nats_url);
        return 2;
    }
    char qurl[512];
    snprintf(qurl, sizeof(qurl), "%s/query_by_hash", http);
    qloop q = {.w = w, .url = qurl, .cap = 2000000};
    q.t0 = malloc(q.cap * sizeof(uint64_t));
    q.dt = malloc(q.cap * sizeof(uint64_t));
    kvo_http_client *c = NULL;
    if (!q.t0 || !q.dt || kvo_http_client_new(&c, 10000) != KVO_OK)
        return die("service", KVO_ENOMEM);
    uint64_t applied0 = applied_messages(c, http);
    pthread_t th;
    pthread_create(&th, NULL, query_loop, &q);
    kvo_sleep_us(1000000); /* idle queries */
    uint64_t t_pub = kvo_now_ns();
    for (size_t i = 0; i < nmsg; i++)
        if (natsConnection_Publish(
                nc, "namespace.dynamo.component.backend.kv-events",
                msgs[i].data, (int)msgs[i].len) != NATS_OK)
            return die("publish", KVO_ENATS);
    natsConnection_Flush(nc);
    uint64_t t_flushed = kvo_now_ns();
    uint64_t t_done = 0;
    while (!t_done) {
        if (applied_messages(c, http) >= applied0 + nmsg)
            t_done = kvo_now_ns();
        else
            kvo_sleep_us(2000);
        if (kvo_now_ns() - t_pub > 600ull * 1000000000ull) {
            fprintf(stderr, "kvo-bench-index: the indexer did not apply every "
                            "message in 600 s\n");
            q.stop = 1;
            pthread_join(th, NULL);
            return 1;
        }
    }
    kvo_sleep_us(1000000); /* queries after the apply */
    uint64_t t_end = kvo_now_ns();
    q.stop = 1;
    pthread_join(th, NULL);
    printf(
        "service: %zu messages (%zu stored events, %llu blocks) published in "
        "%.0f ms, applied after %.0f ms; %llu query errors\n",
        nmsg, nev,
        (unsigned long long)((uint64_t)w->workers * (uint64_t)w->prompts * SUF +
                             (uint64_t)w->workers * GROUPS * PRE),
        (t_flushed - t_pub) / 1e6, (t_done - t_pub) / 1e6,
        (unsigned long long)q.errors);
    metric("svc_apply_ms", (t_done - t_pub) / 1e6);
    lat_row("idle", &q, 0, t_pub);
    lat_row("apply", &q, t_pub, t_done);
    lat_row("after", &q, t_done, t_end);
    kvo_http_client_free(c);
    natsConnection_Destroy(nc);
    for (size_t i = 0; i < nmsg; i++) kvo_buf_fini(&msgs[i]);
    free(msgs);
    free(ev);
    free(blk);
    free(event_id);
    free(q.t0);
    free(q.dt);
    return 0;
}

int main(int argc, char **argv) {
    bool service = argc > 1 && !strcmp(argv[1], "service");
    if (service) {
        if (argc != 5) {
            fprintf(stderr,
                    "usage: kvo-bench-index service SIZE NATS_URL HTTP_URL\n");
            return 2;
        }
        argv++;
        argc = 2;
    }
    const char *size = argc > 1 ? argv[1] : "w1";
    const char *proto = argc > 2 ? argv[2] : "cold";
    bool is_floor = argc > 3 && !strcmp(argv[3], "floor");
    bool warm = !strcmp(proto, "warm");
    static wl W;
    wl *w = &W;
    for (size_t i = 0; i < sizeof(SIZES) / sizeof(SIZES[0]); i++)
        if (!strcmp(size, SIZES[i].name)) w->sz = &SIZES[i];
    if (!w->sz || (!warm && strcmp(proto, "cold")) || (argc > 3 && !is_floor) ||
        argc > 4) {
        fprintf(stderr, "usage: kvo-bench-index [w1|w1x4|w1x16|w1-1m|"
                        "one-worker-1m [cold|warm [floor]]]\n");
        return 2;
    }
    w->workers = w->sz->workers;
    w->prompts = w->sz->prompts;

    /* ---- Workload (BENCH.md W1 generation order) ---- */
    w->s = 1;
    uint64_t first[3] = {next(w), next(w), next(w)};
    if (first[0] != 0x910a2dec89025cc1ull ||
        first[1] != 0xbeeb8da1658eec67ull ||
        first[2] != 0xf893a2eefb32555eull) {
        fprintf(stderr,
                "kvo-bench-index: splitmix64 does not match BENCH.md\n");
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
    w->q_seed = w->s;
    if (service) return service_run(w, argv[2], argv[3]);
    printf("workload %s, %s%s: %d workers, %d prefix groups x %d shared blocks "
           "+ %d unique blocks per prompt, %d prompts per worker, %d queries\n",
           size, proto, is_floor ? ", floor (u64 table)" : ", tree", w->workers,
           GROUPS, PRE, SUF, w->prompts, QUERIES);
    bool cs_ok = !w->sz->checksum || w->cs == w->sz->checksum;
    printf("workload checksum 0x%016llx", (unsigned long long)w->cs);
    if (w->sz->checksum)
        printf(" (BENCH.md: 0x%016llx, %s)",
               (unsigned long long)w->sz->checksum,
               cs_ok ? "same" : "DIFFERENT");
    printf("\n");

    pass p;
    pass_init(&p);
    kvo_status s = KVO_OK;
    int rc = 0;
    if (is_floor) {
        floor_tab f = {0};
        if (warm) {
            pass_fini(&p);
            pass_init(&p);
            if ((s = floor_pass(w, &f, &p)) != KVO_OK) return die("floor", s);
            pass_fini(&p);
            pass_init(&p);
        }
        if ((s = floor_pass(w, &f, &p)) != KVO_OK) return die("floor", s);
        report(w, &p, true);
        free(f.k);
    } else {
        idx_tree *t = NULL;
        if ((s = idx_tree_new(&t)) != KVO_OK) return die("tree", s);
        if (warm) {
            if ((s = tree_pass(w, t, &p)) != KVO_OK)
                return die("first pass", s);
            uint64_t sum = p.sum, entries = p.entries;
            pass_fini(&p);
            pass_init(&p);
            if ((s = tree_pass(w, t, &p)) != KVO_OK)
                return die("second pass", s);
            if (p.sum != sum || p.entries != entries) {
                printf(
                    "warm: second pass score sum %llu, first %llu: DIFFERENT\n",
                    (unsigned long long)p.sum, (unsigned long long)sum);
                rc = 1;
            }
        } else if ((s = tree_pass(w, t, &p)) != KVO_OK) {
            return die("pass", s);
        }
        report(w, &p, false);
        if (p.pairs_left != 0) {
            printf("remove left %llu pairs: DIFFERENT\n",
                   (unsigned long long)p.pairs_left);
            rc = 1;
        }
        if ((w->sz->score_sum && p.sum != w->sz->score_sum) ||
            (w->sz->entries && p.entries != w->sz->entries))
            rc = 1;
        idx_tree_free(t);
    }
    if (!cs_ok) rc = 1;
    uint64_t peak = peak_rss_bytes();
    printf("peak RSS: %.1f MB (workload arrays %.1f MB of it)\n",
           peak / 1048576.0, 2.0 * nsuf * 8 / 1048576.0);
    metric("peak_rss_mb", peak / 1048576.0);
    metric("workload_mb", 2.0 * nsuf * 8 / 1048576.0);
    pass_fini(&p);
    free(w->suf_tok);
    free(w->suf_blk);
    return rc;
}
