/* check_run.c -- the lockstep driver (DESIGN §9).
 *
 * For request i of the trace, one at a time, each to completion (calls on
 * one line run concurrently on the task pool, check_pool.c):
 *
 *   A  sync+query ∥ probe   the engines answered request i-1, so their
 *                           caches are final: probe them for prompt i
 *                           while the index catches up and answers
 *   B  counters
 *   C  send, judge
 *
 *   sync      exact (kvo-mocker + our relays): each rank's last published
 *             ZMQ seq comes with the completion that produced it (kvo.
 *             last_seq: in lockstep the engine publishes nothing after its
 *             answer), else from a dirty engine's /kvo/state. The query
 *             carries them as a wait: kvo-indexer answers it once, for
 *             every publishing rank, last_seq <= zmq_seq_last of the
 *             publisher id we gave that rank's relay (slices of
 *             WAIT_SLICE_MS, so a dead process or Ctrl-C is noticed).
 *             Deadline --timeout-ms -> FAIL "watermark timeout" (never a
 *             hang). An indexer that cannot wait: poll its /watermark, then
 *             query (A sync ∥ probe, B query ∥ counters). Otherwise
 *             (settle): the indexer's /watermark unchanged for --settle-ms.
 *   counters  indexer /metrics, and /metrics of the relays whose engine got
 *             a request since the last read; what moved since request i-1.
 *   query     router hashes of the prompt -> POST /query_by_hash.
 *   probe     POST /kvo/probe on every publishing kvo-mocker.
 *   send      the policy picks a slot: round-robin (request i -> worker
 *             i mod N, rank (i div N) mod D) or kv (highest index score,
 *             ties to the least-used slot, then the lowest); POST
 *             /v1/completions with max_tokens = output_length (disaggregated:
 *             max_tokens 1 to the prefill worker, then the whole request
 *             with its kv_transfer_params to a decode worker, round-robin).
 *   judge     check_result_add -> JSON line, progress bar.
 *
 * After the last request: a final sync and a read of every counter (also
 * each engine's /kvo/state counters, whose error counters must stay 0 like
 * the relays' and the indexer's), the verdict, the reports.
 */
#include "check_int.h"
#include "mock.h"
#include "wire.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

void check_cfg_defaults(check_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->workers = 4;
    c->dp_size = 1;
    c->block_size = 16;
    c->hash_algo = "sha256";
    c->hash_seed = "0";
    c->seed = 0;
    c->drop_seq = -1;
    c->extra_block_seq = -1;
    c->relay_restart_at = -1;
    c->indexer_restart_at = -1;
    c->engine_restart_at = -1;
    c->nats_kill_at = -1;
    c->nats_down_ms = 500;
    c->nats_cluster = 1;
    c->chaos_every = 50;
    c->reset_at = -1;
    c->settle_ms = 500;
    c->timeout_ms = 30000;
    c->sweep = 1000;
    c->checkpoint_sweep = 50;
    c->policy = CHECK_POLICY_ROUND_ROBIN;
    c->overlap_weight = 1.0;
    c->router_temperature = 0;
    c->checkpoint_every = 200;
    c->speedup = -1;
    c->arrival = CHECK_ARRIVAL_CLOSED;
    c->prompt_form = CHECK_FORM_AUTO;
}

/* Between two looks at a watermark that does not cover yet, the driver
 * sleeps SYNC_BACKOFF_MIN_US, doubling up to SYNC_BACKOFF_MAX_US: the most
 * it can be late to notice that the index caught up. */
#define SYNC_BACKOFF_MIN_US 20
#define SYNC_BACKOFF_MAX_US 200
/* How long one query may wait in the indexer before we look at the world
 * (dead processes, Ctrl-C, our deadline) and ask again. */
#define WAIT_SLICE_MS 250
/* Settle mode: how often the indexer's /watermark is read while waiting
 * for it to stay unchanged for --settle-ms. */
#define SETTLE_POLL_US 10000
/* Threads of the task pool beside the driver's own. */
#define POOL_THREADS 1
/* The progress bar is redrawn at most once per this many ns. */
#define PROGRESS_EVERY_NS 100000000ull
/* Lines of each process's log printed when a part died or stalled. */
#define RUN_ERROR_LOG_LINES 15
#define NS_PER_MS 1000000ull

typedef chk_run run;

/* One concurrent call; the pool sees only .base. */
typedef struct rtask {
    chk_task base;
    run *r;
    chk_engine *e; /* probe */
    chk_relay *rl; /* metrics of a relay (NULL with is_indexer) */
    bool is_indexer;
    bool warm;           /* probe: this engine gets the prompt next */
    int64_t before;      /* sync */
    struct rtask *after; /* sync: metric reads to run once it is done */
    size_t n_after;
    kvo_status st;
    kvo_err err;
    int32_t hits[CHK_MAX_DP], cached[CHK_MAX_DP], cpu[CHK_MAX_DP];
    kvo_http_resp resp;
    double busy; /* seconds this call took */
} rtask;

double chk_secs(uint64_t t0) { return (double)(kvo_now_ns() - t0) / 1e9; }

/* The monotonic time ms from now, in ns. */
static uint64_t ns_after_ms(long ms) {
    return kvo_now_ns() + (uint64_t)ms * NS_PER_MS;
}

/* ---- sync -----------------------------------------------------------------*/

/* A restarted engine's rank (chk_rank.restarted) that published since:
 * the index's block set (count and digest) equals the engine's. In
 * lockstep the engine is idle when we sync, so its set is final. */
static bool restarted_synced(run *r, chk_engine *e, chk_rank *rk, char *why,
                             size_t whysz) {
    kvo_err er = {0};
    chk_blocks b;
    chk_blocks_init(&b);
    bool same = false;
    if (chk_engine_state(e, &er) != KVO_OK ||
        chk_index_blocks(&r->env, e->worker_id, rk->dp_rank, WIRE_TIER_DEVICE,
                         false, &b, &er) != KVO_OK)
        snprintf(why, whysz, "%.200s", er.msg);
    else if (!rk->has_set)
        snprintf(why, whysz,
                 "engine %u was restarted and does not tell its "
                 "block set",
                 e->worker_id);
    else if (!(same = b.count == rk->set_count && b.digest == rk->set_digest))
        snprintf(why, whysz,
                 "engine %u rank %u (restarted, so its sequences "
                 "began again under the same relay) holds %llu blocks, the "
                 "index %llu (or other ones)",
                 e->worker_id, rk->dp_rank, (unsigned long long)rk->set_count,
                 (unsigned long long)b.count);
    chk_blocks_fini(&b);
    return same;
}

/* The watermark's key of rank rk of engine e: its relay's publisher id
 * or, with --indexer-api dynamo, chk_rank_key; false when no watermark
 * follows it (no relay of ours). */
static bool rank_publisher(const run *r, const chk_engine *e,
                           const chk_rank *rk, uint64_t *pub) {
    if (r->cfg->indexer_api == CHECK_API_DYNAMO) {
        *pub = chk_rank_key(e->worker_id, rk->dp_rank);
        return e->mocker;
    }
    if (rk->relay < 0) return false;
    *pub = r->env.relays[rk->relay].publisher_id;
    return true;
}

/* Every publishing rank's last seq is covered by its relay's watermark?
 * Writes the first one that is not into why. A restarted engine's ranks
 * are compared by block sets instead (*by_sets: some was). */
static bool watermark_covers(run *r, char *why, size_t whysz, bool *by_sets) {
    if (by_sets) *by_sets = false;
    r->stalled_relay = -1;
    for (uint32_t i = 0; i < r->env.n_workers; i++) {
        chk_engine *e = &r->env.engines[i];
        for (uint32_t k = 0; k < e->n_ranks; k++) {
            chk_rank *rk = &e->ranks[k];
            uint64_t pub;
            if (rk->last_seq < 0 || !rank_publisher(r, e, rk, &pub)) continue;
            if (rk->restarted) {
                if (!restarted_synced(r, e, rk, why, whysz)) return false;
                if (by_sets) *by_sets = true;
                continue;
            }
            int64_t have = chk_watermark_get(&r->wm, pub, NULL);
            if (have < rk->last_seq) {
                r->stalled_relay = rk->relay;
                r->stalled_rank = rk->dp_rank;
                r->stalled_seq = rk->last_seq;
            }
            if (have < rk->last_seq && rk->relay >= 0) {
                snprintf(why, whysz,
                         "engine %u rank %u published seq %lld, "
                         "the index has %lld from its relay "
                         "(publisher %" PRIu64 ")",
                         i, rk->dp_rank, (long long)rk->last_seq,
                         (long long)have, pub);
                return false;
            }
            if (have < rk->last_seq) {
                snprintf(why, whysz,
                         "engine %u rank %u published seq %lld, the index "
                         "has applied %lld of its ZMQ stream",
                         i, rk->dp_rank, (long long)rk->last_seq,
                         (long long)have);
                return false;
            }
        }
    }
    return true;
}

/* The engines that published since they were last asked report their last
 * sequences: what the index must cover. */
static kvo_status engines_refresh(run *r, kvo_err *err) {
    for (uint32_t i = 0; i < r->env.n_workers; i++) {
        chk_engine *e = &r->env.engines[i];
        if (!e->dirty) continue;
        kvo_status st = chk_engine_state(e, err);
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

/* Between two looks at a watermark that does not cover yet: KVO_EINTR on
 * Ctrl-C; KVO_ETIMEDOUT (run error recorded) when a process died or the
 * deadline passed; KVO_OK to look again. */
static kvo_status sync_keep_waiting(run *r, int64_t before, uint64_t deadline,
                                    const char *why) {
    if (kvo_stop) return KVO_EINTR;
    char dead[600];
    if (chk_env_dead(&r->env, dead, sizeof(dead))) {
        check_result_error(r->res, before, "before prompt %lld: %s",
                           (long long)before, dead);
        return KVO_ETIMEDOUT;
    }
    if (kvo_now_ns() <= deadline) return KVO_OK;
    /* the stage that stalled, as far as the relay and the indexer tell it */
    char relay[400] = "";
    if (r->stalled_relay >= 0) {
        relay[0] = ';';
        relay[1] = ' ';
        chk_relay_where(&r->env.relays[r->stalled_relay], r->stalled_rank,
                        r->stalled_seq, relay + 2, sizeof(relay) - 2);
    }
    char status[32] = "", nats[32] = "", stage[128] = "";
    kvo_err e = {0};
    if (chk_index_health(&r->env, status, sizeof(status), nats, sizeof(nats),
                         &e) == KVO_OK)
        snprintf(stage, sizeof(stage),
                 "; the indexer's /health: %s%s, NATS "
                 "%s",
                 status,
                 strcmp(status, "recovering") == 0 ? " (recovery in progress)"
                 : strcmp(status, "stale") == 0    ? " (a recovery failed)"
                                                   : "",
                 nats);
    if (before >= 0)
        check_result_error(r->res, before,
                           "watermark timeout before prompt %lld (%ld ms): "
                           "%s%s%s",
                           (long long)before, r->cfg->timeout_ms, why, relay,
                           stage);
    else
        check_result_error(r->res, before,
                           "watermark timeout after the last prompt "
                           "(%ld ms): %s%s%s",
                           r->cfg->timeout_ms, why, relay, stage);
    return KVO_ETIMEDOUT;
}

/* KVO_OK synced; KVO_ETIMEDOUT (run error recorded); KVO_EINTR stopped;
 * other: setup/transport error (r->err). */
static kvo_status sync_exact(run *r, int64_t before, kvo_err *err) {
    kvo_status st = engines_refresh(r, err);
    if (st != KVO_OK) return st;
    uint64_t deadline = ns_after_ms(r->cfg->timeout_ms);
    char why[320] = "";
    for (long wait = SYNC_BACKOFF_MIN_US;;
         wait = wait < SYNC_BACKOFF_MAX_US ? wait * 2 : SYNC_BACKOFF_MAX_US) {
        st = chk_index_watermark(&r->env, &r->wm, err);
        if (st != KVO_OK) return st;
        if (watermark_covers(r, why, sizeof(why), NULL)) return KVO_OK;
        if ((st = sync_keep_waiting(r, before, deadline, why)) != KVO_OK)
            return st;
        kvo_sleep_us(wait);
    }
}

/* Exact sync and the query in one call: the indexer answers once its
 * watermark covers every publishing rank's last seq. Same outcomes as
 * sync_exact; KVO_EUNSUPPORTED: fall back to it (r->no_wait is set). */
static kvo_status sync_query(run *r, int64_t before, kvo_err *err) {
    kvo_status st = engines_refresh(r, err);
    if (st != KVO_OK) return st;
    uint64_t pairs[2 * CHK_MAX_ENGINES * CHK_MAX_DP];
    size_t np = 0;
    for (uint32_t i = 0; i < r->env.n_workers; i++) {
        chk_engine *e = &r->env.engines[i];
        for (uint32_t k = 0; k < e->n_ranks; k++) {
            chk_rank *rk = &e->ranks[k];
            uint64_t pub;
            if (rk->last_seq < 0 || !rank_publisher(r, e, rk, &pub) ||
                rk->restarted)
                continue;
            pairs[2 * np] = pub;
            pairs[2 * np + 1] = (uint64_t)rk->last_seq;
            np++;
        }
    }
    uint64_t deadline = ns_after_ms(r->cfg->timeout_ms);
    char why[320] = "";
    for (;;) {
        bool covered = false;
        st = chk_index_query_wait(&r->env, r->pb.hashes, r->pb.nb, pairs, np,
                                  WAIT_SLICE_MS, r->scores, &r->tiers, &r->wm,
                                  &covered, &r->idx_metrics, err);
        if (st == KVO_EUNSUPPORTED) r->no_wait = true;
        if (st != KVO_OK) return st;
        /* our own rule decides (and says why not) */
        bool by_sets = false;
        if (watermark_covers(r, why, sizeof(why), &by_sets)) {
            r->have_idx_metrics = true;
            /* the sets matched after that answer: ask again */
            return by_sets ? chk_index_query(&r->env, r->pb.hashes, r->pb.nb,
                                             r->scores, &r->tiers, err)
                           : KVO_OK;
        }
        if ((st = sync_keep_waiting(r, before, deadline, why)) != KVO_OK)
            return st;
        /* the indexer answers at once when it covered: then we wait */
        if (covered) kvo_sleep_us(SYNC_BACKOFF_MAX_US);
    }
}

/* Quiet period: the indexer's /watermark answer (without one, the answer
 * to the prompt's query) unchanged for settle_ms. */
static kvo_status sync_settle(run *r, int64_t before, kvo_err *err) {
    uint64_t deadline = ns_after_ms(r->cfg->timeout_ms);
    kvo_buf last;
    kvo_buf_init(&last);
    uint64_t quiet_since = kvo_now_ns();
    kvo_status st = KVO_OK;
    for (;;) {
        st =
            chk_index_settle_view(&r->env, r->pb.hashes, r->pb.nb, &r->wm, err);
        if (st != KVO_OK) break;
        if (last.len != r->wm.raw.len ||
            memcmp(last.data ? last.data : (uint8_t *)"",
                   r->wm.raw.data ? r->wm.raw.data : (uint8_t *)"",
                   last.len) != 0) {
            kvo_buf_reset(&last);
            if ((st = kvo_buf_append(&last, r->wm.raw.data, r->wm.raw.len)) !=
                KVO_OK)
                break;
            quiet_since = kvo_now_ns();
        }
        if (kvo_now_ns() - quiet_since >=
            (uint64_t)r->cfg->settle_ms * NS_PER_MS)
            break;
        if (kvo_stop) {
            st = KVO_EINTR;
            break;
        }
        if (kvo_now_ns() > deadline) {
            check_result_error(r->res, before,
                               "the index never settled for %ld ms within "
                               "%ld ms before prompt %lld",
                               r->cfg->settle_ms, r->cfg->timeout_ms,
                               (long long)before);
            st = KVO_ETIMEDOUT;
            break;
        }
        kvo_sleep_us(SETTLE_POLL_US);
    }
    kvo_buf_fini(&last);
    return st;
}

static kvo_status sync_index(run *r, int64_t before) {
    uint64_t t0 = kvo_now_ns();
    kvo_status st = r->env.exact ? sync_exact(r, before, &r->err)
                                 : sync_settle(r, before, &r->err);
    r->res->stage_s[CHECK_STAGE_SYNC] += chk_secs(t0);
    return st;
}

/* ---- concurrent calls ---------------------------------------------------------*/

static void task_sync(chk_task *base) {
    rtask *t = (rtask *)base;
    uint64_t t0 = kvo_now_ns();
    t->st = t->r->env.exact ? sync_exact(t->r, t->before, &t->err)
                            : sync_settle(t->r, t->before, &t->err);
    t->busy = chk_secs(t0);
}

static void task_metrics(chk_task *base);

/* The waited query, then (on this same thread, no second dispatch) the
 * relay counters that must be read after it. */
static void task_sync_query(chk_task *base) {
    rtask *t = (rtask *)base;
    uint64_t t0 = kvo_now_ns();
    t->st = sync_query(t->r, t->before, &t->err);
    t->busy = chk_secs(t0);
    for (size_t i = 0; t->st == KVO_OK && i < t->n_after; i++)
        task_metrics(&t->after[i].base);
}

static void task_probe(chk_task *base) {
    rtask *t = (rtask *)base;
    uint64_t t0 = kvo_now_ns();
    run *r = t->r;
    chk_prompt p = chk_pbuf_prompt(r, &r->pb);
    t->st = chk_engine_probe(t->e, &p, r->env.block_size, t->warm, t->hits,
                             t->cached, t->cpu, &t->err);
    t->busy = chk_secs(t0);
}

static void task_query(chk_task *base) {
    rtask *t = (rtask *)base;
    uint64_t t0 = kvo_now_ns();
    t->st = chk_index_query(&t->r->env, t->r->pb.hashes, t->r->pb.nb,
                            t->r->scores, &t->r->tiers, &t->err);
    t->busy = chk_secs(t0);
}

static void task_metrics(chk_task *base) {
    rtask *t = (rtask *)base;
    uint64_t t0 = kvo_now_ns();
    char url[256];
    kvo_http_client *c;
    if (t->is_indexer) {
        snprintf(url, sizeof(url), "%s/metrics", t->r->env.indexer_url);
        c = t->r->env.idx_metrics;
    } else {
        snprintf(url, sizeof(url), "http://127.0.0.1:%u/metrics",
                 t->rl->metrics_port);
        c = t->rl->http;
    }
    t->st = chk_metrics_fetch(c, url, &t->resp, &t->err);
    t->busy = chk_secs(t0);
}

/* Room for the largest batch of concurrent calls: the sync (or the query),
 * a probe per publishing engine, and a /metrics read of the indexer and of
 * every live relay. A relay restart appends a relay and retires the old
 * one (which is no longer read), so the relays at the start are as many as
 * will ever be read at once. */
static size_t tasks_cap(const chk_env *env) {
    return 2 + (size_t)env->n_workers + env->n_relays;
}

/* A fresh task slot of the batch being built; NULL past tasks_cap, which
 * tasks_status then reports (the batch is not run short silently). */
static rtask *task_add(run *r, size_t *n, void (*fn)(chk_task *)) {
    if (*n >= r->cap_tasks) {
        r->tasks_overflow = true;
        return NULL;
    }
    rtask *t = &r->tasks[(*n)++];
    kvo_http_resp keep = t->resp; /* its buffer is reused */
    memset(t, 0, sizeof(*t));
    t->resp = keep;
    t->base.fn = fn;
    t->r = r;
    return t;
}

/* Room for tasks_cap(env) tasks, their answer buffers reused from batch to
 * batch. */
static kvo_status tasks_init(run *r) {
    r->cap_tasks = tasks_cap(&r->env);
    r->tasks = kvo_calloc(r->cap_tasks, sizeof(*r->tasks));
    r->task_ptrs = kvo_calloc(r->cap_tasks, sizeof(*r->task_ptrs));
    if (!r->tasks || !r->task_ptrs) return KVO_ENOMEM;
    for (size_t i = 0; i < r->cap_tasks; i++)
        kvo_http_resp_init(&r->tasks[i].resp);
    return KVO_OK;
}

static void tasks_fini(run *r) {
    for (size_t i = 0; r->tasks && i < r->cap_tasks; i++)
        kvo_http_resp_fini(&r->tasks[i].resp);
    kvo_free(r->tasks);
    kvo_free(r->task_ptrs);
    r->tasks = NULL;
    r->task_ptrs = NULL;
}

static void tasks_run(run *r, size_t n) {
    for (size_t i = 0; i < n; i++) r->task_ptrs[i] = &r->tasks[i].base;
    chk_pool_run(r->pool, r->task_ptrs, n);
}

/* The first failed task's status and message (KVO_OK if none). */
static kvo_status tasks_status(run *r, size_t n) {
    if (r->tasks_overflow)
        return kvo_err_set(&r->err, KVO_ESTATE, KVO_ERR_NO_OFFSET,
                           "a batch of concurrent calls outgrew its %zu "
                           "slots",
                           r->cap_tasks);
    for (size_t i = 0; i < n; i++)
        if (r->tasks[i].st != KVO_OK) {
            r->err = r->tasks[i].err;
            return r->tasks[i].st;
        }
    return KVO_OK;
}

/* Probes of every publishing kvo-mocker for the prompt in r->pb; warm:
 * the worker the prompt goes to next (or -1). */
static void add_probes(run *r, size_t *n, int64_t warm) {
    for (uint32_t w = 0; w < r->env.n_workers; w++) {
        chk_engine *e = &r->env.engines[w];
        if (!e->mocker) continue;
        rtask *t = task_add(r, n, task_probe);
        if (t) {
            t->e = e;
            t->warm = (int64_t)w == warm;
        }
    }
}

/* Probe results into r->probes; the slowest probe's time into the stage. */
static bool merge_probes(run *r, size_t n) {
    bool probed = false;
    double busy = 0;
    for (uint32_t s = 0; s < r->n_slots; s++)
        r->probes[s] = r->cached[s] = r->cpu[s] = -1;
    for (size_t i = 0; i < n; i++) {
        rtask *t = &r->tasks[i];
        if (t->base.fn != task_probe) continue;
        for (uint32_t k = 0; k < t->e->n_ranks; k++) {
            r->probes[t->e->ranks[k].slot] = t->hits[k];
            r->cached[t->e->ranks[k].slot] = t->cached[k];
            r->cpu[t->e->ranks[k].slot] = t->cpu[k];
        }
        probed = true;
        if (t->busy > busy) busy = t->busy;
    }
    r->res->stage_s[CHECK_STAGE_PROBE] += busy;
    return probed;
}

/* ---- counters ---------------------------------------------------------------*/

/* Metric fetches of the indexer and of every relay whose engine got a
 * request since its last read (all of them with `all`). */
static void add_metrics(run *r, size_t *n, bool all, bool no_indexer) {
    rtask *t;
    if (!no_indexer && !r->have_idx_metrics &&
        (t = task_add(r, n, task_metrics)) != NULL)
        t->is_indexer = true;
    for (uint32_t i = 0; i < r->env.n_relays; i++) {
        chk_relay *rl = &r->env.relays[i];
        if (rl->retired || (!all && !rl->dirty)) continue;
        if ((t = task_add(r, n, task_metrics)) != NULL) t->rl = rl;
        rl->dirty = false;
    }
}

/* Fetched metrics into r->cur, what moved into r->moved, trips. */
static kvo_status merge_metrics(run *r, size_t n, int64_t before) {
    uint64_t t0 = kvo_now_ns();
    kvo_status st = KVO_OK;
    double busy = 0;
    if (r->have_idx_metrics) /* came with the waited query */
        st = check_counters_parse_indexer(
            &r->cur, (const char *)r->idx_metrics.data, r->idx_metrics.len);
    r->have_idx_metrics = false;
    for (size_t i = 0; i < n && st == KVO_OK; i++) {
        rtask *t = &r->tasks[i];
        if (t->base.fn != task_metrics) continue;
        if (t->busy > busy) busy = t->busy;
        const char *text = (const char *)t->resp.body.data;
        st = t->is_indexer
                 ? check_counters_parse_indexer(&r->cur, text, t->resp.body.len)
                 : check_counters_parse_prom(&r->cur, t->rl->stage, text,
                                             t->resp.body.len);
    }
    if (st == KVO_OK) st = check_counters_moved(&r->moved, &r->prev, &r->cur);
    if (st == KVO_OK) st = check_counters_copy(&r->prev, &r->cur);
    if (st == KVO_OK) st = check_result_trips(r->res, &r->cur, before);
    r->res->stage_s[CHECK_STAGE_COUNTERS] += busy + chk_secs(t0);
    return st;
}

/* Read every counter now (serially; start and end of the run). */
static kvo_status read_counters(run *r, int64_t before, bool all) {
    size_t n = 0;
    add_metrics(r, &n, all, false);
    tasks_run(r, n);
    kvo_status st = tasks_status(r, n);
    if (st == KVO_OK) st = merge_metrics(r, n, before);
    return st;
}

/* ---- one request -------------------------------------------------------------*/

/* Router hashes of a trace prompt from a memo of trace blocks: a router
 * hash covers one block's tokens only (no chaining), and the tokens of trace
 * block h are mock_trace_token(h, j), so the hashes of the full blocks
 * inside trace block h are a function of h alone (block size dividing
 * MOCK_TRACE_BLOCK).
 * Direct-mapped rows keyed by h: the same values wire_router_hash_blocks
 * gives over the synthesized tokens, without synthesizing them again. */
#define RH_ROWS_LOG2 14

static void rh_memo_fini(chk_rh_memo *m) {
    kvo_free(m->keys);
    kvo_free(m->used);
    kvo_free(m->rows);
    memset(m, 0, sizeof(*m));
}

static bool rh_memo_hashes(run *r, const check_request *q, chk_pbuf *pb) {
    uint32_t bs = r->env.block_size;
    if (bs == 0 || MOCK_TRACE_BLOCK % bs != 0) return false;
    uint32_t per = MOCK_TRACE_BLOCK / bs;
    chk_rh_memo *m = &r->rh;
    if (!m->rows) {
        size_t rows = (size_t)1 << RH_ROWS_LOG2;
        m->keys = kvo_malloc(rows * sizeof(*m->keys));
        m->used = kvo_calloc(rows, sizeof(*m->used));
        m->rows = kvo_malloc(rows * per * sizeof(*m->rows));
        if (!m->keys || !m->used || !m->rows) {
            rh_memo_fini(m); /* hash the tokens instead */
            return false;
        }
    }
    size_t nb = q->input_length / bs, k = 0;
    for (uint32_t t = 0; t < q->n_hash_ids && k < nb; t++) {
        uint64_t h = q->hash_ids[t];
        size_t slot = (size_t)(kvo_mix64(h) >> (64 - RH_ROWS_LOG2));
        uint64_t *row = m->rows + slot * per;
        if (!m->used[slot] || m->keys[slot] != h) {
            uint64_t tok[MOCK_TRACE_BLOCK];
            for (uint32_t j = 0; j < MOCK_TRACE_BLOCK; j++)
                tok[j] = mock_trace_token(h, j);
            wire_router_hash_blocks(tok, MOCK_TRACE_BLOCK, bs, WIRE_ROUTER_SEED,
                                    row);
            m->keys[slot] = h;
            m->used[slot] = 1;
        }
        size_t take = nb - k < per ? nb - k : per;
        memcpy(pb->hashes + k, row, take * sizeof(uint64_t));
        k += take;
    }
    pb->nb = k;
    return true;
}

void chk_pbuf_init(chk_pbuf *pb) {
    memset(pb, 0, sizeof(*pb));
    kvo_buf_init(&pb->tokens);
    kvo_buf_init(&pb->json);
    kvo_buf_init(&pb->extra);
}

void chk_pbuf_fini(chk_pbuf *pb) {
    kvo_buf_fini(&pb->tokens);
    kvo_buf_fini(&pb->json);
    kvo_buf_fini(&pb->extra);
    kvo_free(pb->hashes);
    kvo_free(pb->seq);
    memset(pb, 0, sizeof(*pb));
}

/* The prompt: its router hashes and its JSON (tokens only when the JSON or
 * the hashes need them), and the sequence hashes routing weighs. */
kvo_status chk_run_prompt(run *r, const check_request *q, chk_pbuf *pb) {
    kvo_status st = KVO_OK;
    size_t n = q->input_length;
    size_t blocks = n / r->env.block_size;
    if (blocks > pb->cap) {
        uint64_t *h = kvo_realloc(pb->hashes, blocks * sizeof(*h));
        if (h) pb->hashes = h;
        uint64_t *sq = kvo_realloc(pb->seq, blocks * sizeof(*sq));
        if (sq) pb->seq = sq;
        if (!h || !sq) return KVO_ENOMEM;
        pb->cap = blocks;
    }
    const uint64_t *tok = NULL;
    check_keys_of(r->cfg, q, &pb->keys);
    const check_keys *k = &pb->keys;
    bool keyed = k->lora[0] || k->salt[0] || k->has_mm;
    if ((st = check_keys_json(k, &pb->extra)) != KVO_OK) return st;
    if (!r->trace_form || keyed || !rh_memo_hashes(r, q, pb)) {
        if ((st = check_request_tokens(q, &pb->tokens)) != KVO_OK) return st;
        tok = (const uint64_t *)pb->tokens.data;
        /* what the relay derives from the engine's events (DESIGN §5) */
        pb->nb = wire_router_hash_prompt(
            tok, n, r->env.block_size, k->lora[0] ? k->lora : NULL,
            k->salt[0] ? k->salt : NULL, k->has_mm ? &k->mm : NULL,
            k->has_mm ? 1 : 0, pb->hashes);
    }
    if (r->cfg->policy == CHECK_POLICY_DYNAMO)
        check_seq_hashes(pb->hashes, pb->nb, pb->seq);
    kvo_buf_reset(&pb->json);
    if (r->trace_form) {
        st = CHK_BUF_LIT(&pb->json, "{\"hash_ids\":");
        if (st == KVO_OK)
            st = chk_json_u64s(&pb->json, q->hash_ids, q->n_hash_ids);
        if (st == KVO_OK)
            st = kvo_buf_printf(&pb->json, ",\"input_length\":%u}",
                                q->input_length);
    } else {
        st = chk_json_u64s(&pb->json, tok, n);
    }
    return st;
}

chk_prompt chk_pbuf_prompt(const run *r, const chk_pbuf *pb) {
    return (chk_prompt){.trace_form = r->trace_form,
                        .json = (const char *)pb->json.data,
                        .len = pb->json.len,
                        .lora = pb->keys.lora,
                        .extra = (const char *)pb->extra.data,
                        .extra_len = pb->extra.len};
}

const uint64_t *chk_run_held(const run *r, const chk_pbuf *pb, size_t *nb) {
    bool dyn = r->cfg->policy == CHECK_POLICY_DYNAMO;
    *nb = dyn ? pb->nb : 0;
    return dyn ? pb->seq : NULL;
}

/* The sweep's step: the prompt, then the index's scores ∥ every engine's
 * probe, into r->scores / r->probes. */
static kvo_status observe(run *r, const check_request *q, bool *probed) {
    kvo_status st = chk_run_prompt(r, q, &r->pb);
    if (st != KVO_OK) return st;
    size_t n = 0;
    task_add(r, &n, task_query);
    add_probes(r, &n, -1);
    tasks_run(r, n);
    if ((st = tasks_status(r, n)) != KVO_OK) return st;
    *probed = merge_probes(r, n);
    return KVO_OK;
}

bool chk_run_answer_ok(run *r, const check_request *q, uint32_t rank,
                       const chk_completion *c, bool probed) {
    long long id = (long long)q->line;
    /* the engine must have seen the prompt we meant */
    if (c->prompt_tokens >= 0 && c->prompt_tokens != q->input_length) {
        check_result_error(r->res, id,
                           "prompt %lld: the engine counted %lld "
                           "prompt tokens, the trace has %u",
                           id, (long long)c->prompt_tokens, q->input_length);
        return false;
    }
    if (c->dp_rank >= 0 && c->dp_rank != (int64_t)rank) {
        check_result_error(r->res, id,
                           "prompt %lld: sent to rank %u, the "
                           "engine ran it on rank %lld",
                           id, rank, (long long)c->dp_rank);
        return false;
    }
    if (c->cached_tokens < 0 && !probed) {
        check_result_error(r->res, id,
                           "prompt %lld: the engine reports no "
                           "usage.prompt_tokens_details."
                           "cached_tokens (vLLM: start it with "
                           "--enable-prompt-tokens-details)",
                           id);
        return false;
    }
    return true;
}

/* ---- evidence of a divergence (check_diag.c) -------------------------------*/

/* A store missing on one rank of e while its siblings hold the block:
 * compare the sizes of e's ranks' cached sets on both sides, which show
 * stores credited to the wrong rank (check_diagnose_ranks). */
static kvo_status diag_ranks(run *r, chk_engine *e, uint32_t rank) {
    uint64_t eng[CHK_MAX_DP], idx[CHK_MAX_DP];
    kvo_err err = {0};
    kvo_status st = chk_engine_state(e, &err);
    for (uint32_t i = 0; st == KVO_OK && i < e->n_ranks; i++) {
        chk_blocks bl;
        chk_blocks_init(&bl);
        st = e->ranks[i].has_set
                 ? chk_index_blocks(&r->env, e->worker_id, e->ranks[i].dp_rank,
                                    WIRE_TIER_DEVICE, false, &bl, &err)
                 : KVO_ENOTFOUND;
        eng[e->ranks[i].dp_rank % CHK_MAX_DP] = e->ranks[i].set_count;
        idx[e->ranks[i].dp_rank % CHK_MAX_DP] = bl.count;
        chk_blocks_fini(&bl);
    }
    if (st == KVO_ENOMEM) return st;
    if (st == KVO_OK)
        check_diagnose_ranks(eng, idx, e->n_ranks, e->worker_id, rank,
                             &r->diag);
    return KVO_OK;
}

/* The CPU tier's part of o: the probes' CPU runs and the index's
 * host_pinned scores -- not with Dynamo's API, whose answer has its tiers
 * per instance, not per rank: that mode judges the GPU tier only. */
static void obs_tiers(run *r, check_obs *o) {
    r->tiers_seen |= r->tiers.answered;
    o->probe_cpu = r->cpu;
    o->index_host_scores =
        r->cfg->indexer_api == CHECK_API_DYNAMO ? NULL : r->tiers.host;
    o->index_tiered = r->tiers_seen;
}

/* Judge o ahead (the probes against the index; o->cached_tokens -1) and,
 * when it diverges, read the evidence at its first divergent block now,
 * while the state the probe saw is still there: the engine's block there
 * and what the index holds of it. Only a failed read of the run's own
 * memory is an error; a service that cannot say is noted in diag_why. */
static kvo_status diag_gather(run *r, const check_obs *o, const chk_prompt *p) {
    r->diag_slot = r->diag_block = -1;
    r->diag_why[0] = '\0';
    if (!o->probe_hits) return KVO_OK;
    uint32_t bs = o->block_size;
    uint32_t cap = o->prompt_tokens ? (o->prompt_tokens - 1) / bs : 0;
    bool any = false;
    for (uint32_t s = 0; s < o->n_slots && !any; s++) {
        uint32_t i = o->index_scores[s] < cap ? o->index_scores[s] : cap;
        any = o->probe_hits[s] >= 0 && (uint32_t)o->probe_hits[s] != i;
    }
    if (!any) return KVO_OK; /* the common case: nothing to explain */
    check_obs pre = *o;
    pre.cached_tokens = -1;
    check_prompt jp;
    kvo_arena_reset(&r->diag_arena);
    kvo_status st = check_prompt_judge(&pre, &r->diag_arena, &jp);
    if (st != KVO_OK || !jp.diverged) return st;
    uint32_t slot = (uint32_t)jp.divergent_slot;
    uint32_t k = (uint32_t)jp.first_divergent_block;
    r->diag_slot = slot;
    r->diag_block = k;
    chk_engine *e = &r->env.engines[slot / r->env.dp_size];
    chk_rank *rk = NULL;
    for (uint32_t i = 0; i < e->n_ranks; i++)
        if (e->ranks[i].slot == slot) rk = &e->ranks[i];
    if (!e->mocker || !rk) {
        snprintf(r->diag_why, sizeof(r->diag_why),
                 "the engine has no probe detail form");
        return KVO_OK;
    }
    /* index behind: the blocks the engine holds from k on (where a store
     * credited to another slot shows); ahead: block k */
    bool behind = (uint32_t)jp.engine_hits[slot] > k;
    uint32_t n = behind ? (uint32_t)jp.engine_hits[slot] - k : 1;
    if (n > CHECK_DIAG_BLOCKS) n = CHECK_DIAG_BLOCKS;
    check_chain_block b[CHECK_DIAG_BLOCKS];
    check_lookup l[CHECK_DIAG_BLOCKS];
    kvo_err err = {0};
    st = chk_engine_chain(e, p, rk->dp_rank, k, b, &n, &err);
    if (st == KVO_OK)
        st =
            chk_index_lookup(&r->env, e->worker_id, rk->dp_rank, b, n, l, &err);
    if (st == KVO_ENOMEM) return st;
    if (st != KVO_OK) {
        snprintf(r->diag_why, sizeof(r->diag_why), "%s", err.msg);
        return KVO_OK;
    }
    for (uint32_t i = 0; i < n; i++) /* holders by right: their engines */
        for (uint32_t h = 0; h < l[i].n_holders; h++) {
            const check_slot_info *who = &l[i].holders[h];
            uint64_t hs = (uint64_t)who->worker * r->env.dp_size + who->dp_rank;
            l[i].holder_cached[h] = who->dp_rank < r->env.dp_size &&
                                    hs < r->n_slots &&
                                    o->probe_hits[hs] > (int32_t)(k + i);
        }
    check_diagnose(b, l, n, k, behind, e->worker_id, rk->dp_rank, &r->diag);
    if (r->diag.reason == CHECK_REASON_MISSED_STORE && l[0].others &&
        e->n_ranks > 1)
        return diag_ranks(r, e, rk->dp_rank);
    return KVO_OK;
}

/* The evidence gathered for p (a diverged prompt) onto it, when it is
 * about p's first divergence. */
static kvo_status diag_apply(run *r, check_prompt *p) {
    if (!p->diverged) return KVO_OK;
    if (p->tier_cpu) /* /kvo/probe detail and /lookup speak of the GPU */
        return check_prompt_unexplained(
            p, "the CPU tier is not looked up block by block", &r->res->arena);
    if (r->diag_slot != p->divergent_slot ||
        r->diag_block != p->first_divergent_block)
        return check_prompt_unexplained(
            p, "the engine's answer differs from its probe", &r->res->arena);
    if (r->diag_why[0])
        return check_prompt_unexplained(p, r->diag_why, &r->res->arena);
    bool keep = r->res->n_panels < CHECK_PANELS_MAX;
    r->res->n_panels += keep && r->diag.n_rows;
    return check_prompt_explain(p, &r->diag, keep, &r->res->arena);
}

/* KVO_OK: prompt judged (or a run error recorded and the run must stop:
 * *stop); other: a setup/transport error in r->err. */
static kvo_status do_request(run *r, uint64_t i, const check_request *q,
                             bool *stop) {
    uint64_t t_start = kvo_now_ns();
    int64_t id = (int64_t)q->line;
    kvo_status st;
    *stop = false;

    /* the faults planned before this request (the index was synced before
     * request i-1's query; that request's events may still be in flight:
     * recovery must cover them too) */
    check_result *res = r->res;
    while (r->next_fault < res->n_faults &&
           res->faults[r->next_fault].at == i) {
        check_fault *f = &res->faults[r->next_fault++];
        kvo_err e2 = {0};
        /* the base of its recovery: the indexer's counters now (a
         * restarted indexer starts from nothing) */
        if (f->kind != CHECK_FAULT_INDEXER &&
            chk_counters_indexer(&r->env, &r->cur, &e2) == KVO_OK)
            check_fault_base(f, &r->cur);
        else
            check_fault_base(f, NULL);
        st = chk_env_fault(&r->env, f, &r->cur, &r->err);
        if (st == KVO_ETIMEDOUT || st == KVO_ESTATE) { /* it did not heal */
            check_result_error(res, id, "before prompt %lld: %s fault: %s",
                               (long long)id, check_fault_kind_name(f->kind),
                               r->err.msg);
            *stop = true;
            return KVO_OK;
        }
        if (st != KVO_OK) return st;
        check_counters_copy(&r->prev, &r->cur);
    }
    uint64_t t0 = kvo_now_ns();
    if ((st = chk_run_prompt(r, q, &r->pb)) != KVO_OK) return st;
    r->res->stage_s[CHECK_STAGE_OTHER] += chk_secs(t0);

    /* A: wait for the index (and query it, when it can hold the query for
     * the watermark) ∥ probe the engines (their caches are final) */
    bool merged = r->env.exact && !r->no_wait;
    /* round-robin knows the next worker already: its engine may hash the
     * prompt while we wait (kv decides only once the index has answered) */
    int64_t next =
        r->cfg->policy == CHECK_POLICY_ROUND_ROBIN && !r->env.n_decode
            ? (int64_t)(check_router_pick(&r->router, i, r->scores,
                                          q->input_length, NULL, 0) /
                        r->env.dp_size)
            : -1;
    size_t n = 0;
    rtask *ts = task_add(r, &n, merged ? task_sync_query : task_sync);
    ts->before = id;
    add_probes(r, &n, next);
    size_t batch = n;
    if (merged) { /* the relays' counters follow the wait on its thread */
        add_metrics(r, &n, i == 0, true);
        ts->after = &r->tasks[batch];
        ts->n_after = n - batch;
    }
    tasks_run(r, batch);
    if (merged &&
        ts->st == KVO_EUNSUPPORTED) { /* an indexer that cannot wait */
        kvo_info("%s; polling /watermark instead", ts->err.msg);
        for (uint32_t k = 0; k < r->env.n_relays; k++) /* not read after all */
            r->env.relays[k].dirty = true;
        n = 0;
        ts = task_add(r, &n, task_sync);
        ts->before = id;
        add_probes(r, &n, -1);
        tasks_run(r, n);
        merged = false;
    }
    r->res->stage_s[CHECK_STAGE_SYNC] += ts->busy; /* merged: incl. the query */
    if (ts->st == KVO_ETIMEDOUT) {                 /* a run error is recorded */
        *stop = true;
        return KVO_OK;
    }
    if ((st = tasks_status(r, n)) != KVO_OK) return st;
    bool probed = merge_probes(r, n);
    uint64_t synced_ns = kvo_now_ns();

    /* B: query the index and read what moved in the counters (merged: done
     * in A already, they only need merging) */
    if (!merged) {
        n = 0;
        rtask *tq = task_add(r, &n, task_query);
        add_metrics(r, &n, i == 0, false);
        tasks_run(r, n);
        if ((st = tasks_status(r, n)) != KVO_OK) return st;
        r->res->stage_s[CHECK_STAGE_QUERY] += tq->busy;
    }
    if ((st = merge_metrics(r, n, id)) != KVO_OK) return st;
    /* the faults before it healed: the index synced, its recovery read */
    for (size_t k = 0; k < r->next_fault; k++) {
        check_fault *f = &res->faults[k];
        if (!f->done || f->has_recovery) continue;
        f->heal_ms = (double)(synced_ns - f->killed_ns) / 1e6;
        check_fault_recovery(f, &r->cur);
        char line[400];
        check_fault_text(f, line, sizeof(line));
        kvo_info("fault %s", line);
    }

    /* C: send */
    chk_prompt p = chk_pbuf_prompt(r, &r->pb);
    size_t nh;
    const uint64_t *hs = chk_run_held(r, &r->pb, &nh);
    uint32_t slot =
        check_router_pick(&r->router, i, r->scores, q->input_length, hs, nh);
    if ((st = check_router_start(&r->router, slot, hs, nh)) != KVO_OK)
        return st;
    check_obs pre = {.id = q->line,
                     .prompt_tokens = q->input_length,
                     .block_size = r->env.block_size,
                     .n_slots = r->n_slots,
                     .dp_size = r->env.dp_size,
                     .chosen = slot,
                     .index_seen = r->seen,
                     .index_scores = r->scores,
                     .probe_hits = probed ? r->probes : NULL,
                     .probe_cache_hits = r->cached,
                     .cached_tokens = -1};
    obs_tiers(r, &pre);
    if ((st = diag_gather(r, &pre, &p)) != KVO_OK) {
        check_router_finish(&r->router, slot, hs, nh);
        return st;
    }
    uint32_t dp = r->env.dp_size;
    chk_engine *e = &r->env.engines[slot / dp];
    uint32_t rank = slot % dp;
    bool disagg = r->env.n_decode > 0;
    t0 = kvo_now_ns();
    chk_completion c;
    st = chk_engine_complete(e, r->env.model, &p, disagg ? 1 : q->output_length,
                             (e->mocker || dp > 1) ? (int)rank : -1, NULL, &c,
                             &r->err);
    if (st == KVO_OK && disagg) {
        chk_engine *d =
            &r->env.engines[r->env.n_workers +
                            (uint32_t)(r->decode_rr++ % r->env.n_decode)];
        chk_completion dc;
        st = chk_engine_complete(
            d, r->env.model, &p, q->output_length, -1,
            c.kv_transfer_params ? c.kv_transfer_params : "{}", &dc, &r->err);
        kvo_free(dc.kv_transfer_params);
    }
    kvo_free(c.kv_transfer_params);
    check_router_finish(&r->router, slot, hs, nh);
    r->res->stage_s[CHECK_STAGE_COMPLETE] += chk_secs(t0);
    if (st != KVO_OK) return st;
    /* kvo-mocker says what it had published when it answered; in lockstep
     * nothing follows the answer, so that is the rank's last seq (no
     * /kvo/state round trip). Any other engine: read its state. */
    if (e->mocker && c.kvo && c.dp_rank == (int64_t)rank && !disagg) {
        for (uint32_t k = 0; k < e->n_ranks; k++)
            if (e->ranks[k].dp_rank == rank) e->ranks[k].last_seq = c.last_seq;
    } else {
        e->dirty = true;
    }
    for (uint32_t k = 0; k < r->env.n_relays; k++)
        if (r->env.relays[k].engine == slot / dp) r->env.relays[k].dirty = true;

    if (!chk_run_answer_ok(r, q, rank, &c, probed)) {
        *stop = true;
        return KVO_OK;
    }

    t0 = kvo_now_ns();
    for (uint32_t s = 0; s < r->n_slots; s++) r->seen[s] |= r->scores[s] > 0;
    check_obs o = {.id = q->line,
                   .prompt_tokens = q->input_length,
                   .block_size = r->env.block_size,
                   .n_slots = r->n_slots,
                   .dp_size = dp,
                   .chosen = slot,
                   .index_seen = r->seen,
                   .index_scores = r->scores,
                   .probe_hits = probed ? r->probes : NULL,
                   .probe_cache_hits = r->cached,
                   .cached_tokens = c.cached_tokens,
                   .moved = &r->moved,
                   .total = &r->cur,
                   .ms = chk_secs(t_start) * 1000};
    obs_tiers(r, &o);
    const check_prompt *pr = NULL;
    if ((st = chk_run_record(r, &o, &pr)) != KVO_OK) return st;
    if (pr->diverged)
        kvo_debug("prompt %llu diverged: %s: %s", (unsigned long long)pr->id,
                  check_reason_name(pr->reason), pr->detail);
    if (r->cfg->fail_fast && (pr->diverged || r->res->n_trips)) *stop = true;
    r->res->stage_s[CHECK_STAGE_OTHER] += chk_secs(t0);
    return KVO_OK;
}

/* --reset-at: before request i, every engine idle (lockstep), reset its
 * prefix cache, then a checkpoint: the index must have dropped every block
 * -- an idle engine's AllBlocksCleared must reach it without a later step
 * to carry it (aibrix#2287). The engines published something: their
 * sequences are read again. */
static kvo_status reset_engines(run *r, uint64_t i, bool *stopped) {
    for (uint32_t w = 0; w < r->env.n_engines; w++) {
        kvo_status st = chk_engine_reset(&r->env.engines[w], &r->err);
        if (st != KVO_OK) return st;
        r->env.engines[w].dirty = true;
    }
    kvo_info("reset the prefix cache of every engine before request %llu",
             (unsigned long long)i);
    return chk_checkpoint(r, (size_t)i, false, 0, stopped);
}

/* ---- recording a prompt ----------------------------------------------------*/

kvo_status chk_run_record(run *r, const check_obs *o,
                          const check_prompt **out) {
    const check_prompt *pr = NULL;
    kvo_status st = check_result_add(r->res, o, &pr);
    if (st != KVO_OK) return st;
    if (out) *out = pr;
    if (o->unjudged) return KVO_OK; /* load: written in trace order later */
    if ((st = diag_apply(r, &r->res->prompts[r->res->n_prompts - 1])) != KVO_OK)
        return st;
    r->json_to = r->res->n_prompts;
    if (r->json && check_report_json_prompt(r->json, r->res, pr) != KVO_OK)
        return kvo_err_set(&r->err, KVO_EIO, KVO_ERR_NO_OFFSET,
                           "cannot write %s", r->cfg->report_json);
    return KVO_OK;
}

static int prompt_id_cmp(const void *a, const void *b) {
    const check_prompt *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

kvo_status chk_run_flush(run *r) {
    check_result *res = r->res;
    if (r->json_to >= res->n_prompts) return KVO_OK;
    /* answers come back in any order; the report keeps the trace's */
    qsort(res->prompts + r->json_to, res->n_prompts - r->json_to,
          sizeof(*res->prompts), prompt_id_cmp);
    for (; r->json_to < res->n_prompts; r->json_to++)
        if (r->json && check_report_json_prompt(
                           r->json, res, &res->prompts[r->json_to]) != KVO_OK)
            return kvo_err_set(&r->err, KVO_EIO, KVO_ERR_NO_OFFSET,
                               "cannot write %s", r->cfg->report_json);
    return KVO_OK;
}

/* ---- the sweep -------------------------------------------------------------------*/

/* At a checkpoint (synced, nothing running, probes side-effect free): the
 * last `want` distinct prompts of requests [from, to), in trace order,
 * compared on every slot. Stale blocks that no later request happened to
 * touch (a missed remove), and router hashes the block sets cannot see
 * (a token mutated on the wire), show up here. */
kvo_status chk_run_sweep(run *r, size_t from, size_t to, size_t want,
                         check_checkpoint *c) {
    c->sweep_first = -1;
    if (want == 0 || to <= from) return KVO_OK;
    bool any = false;
    for (uint32_t w = 0; w < r->env.n_workers; w++)
        any |= r->env.engines[w].mocker;
    if (!any) return KVO_OK; /* no probe, no truth for unchosen workers */
    uint64_t t0 = kvo_now_ns();
    double before[CHECK_STAGE_COUNT];
    memcpy(before, r->res->stage_s, sizeof(before));
    if (want > to - from) want = to - from;
    /* an open-addressing set of prompt fingerprints, at most half full */
    size_t cap = 1;
    while (cap < 2 * want + 2) cap <<= 1;
    uint64_t *seen = kvo_calloc(cap, sizeof(*seen)); /* 0 = empty */
    size_t *pick = kvo_calloc(want, sizeof(*pick));
    kvo_status st = seen && pick ? KVO_OK : KVO_ENOMEM;
    size_t n = 0;
    for (size_t i = to; i-- > from && n < want && st == KVO_OK;) {
        const check_request *q = &r->trace.reqs[i];
        uint64_t fp =
            XXH3_64bits_withSeed(q->hash_ids, q->n_hash_ids * sizeof(uint64_t),
                                 q->input_length) |
            1;
        size_t h = (size_t)fp & (cap - 1);
        while (seen[h] && seen[h] != fp) h = (h + 1) & (cap - 1);
        if (seen[h]) continue;
        seen[h] = fp;
        pick[n++] = i;
    }
    for (size_t k = n; k-- > 0 && st == KVO_OK;) { /* trace order */
        if (kvo_stop) {
            st = KVO_EINTR;
            break;
        }
        const check_request *q = &r->trace.reqs[pick[k]];
        bool probed = false;
        if ((st = observe(r, q, &probed)) != KVO_OK) break;
        for (uint32_t s = 0; s < r->n_slots; s++)
            r->seen[s] |= r->scores[s] > 0;
        check_obs o = {.id = q->line,
                       .prompt_tokens = q->input_length,
                       .block_size = r->env.block_size,
                       .n_slots = r->n_slots,
                       .dp_size = r->env.dp_size,
                       .chosen = 0,
                       .index_seen = r->seen,
                       .index_scores = r->scores,
                       .probe_hits = r->probes,
                       .probe_cache_hits = r->cached,
                       .cached_tokens = -1,
                       .moved = NULL,
                       .total = &r->cur,
                       .checkpoint = c->number};
        obs_tiers(r, &o);
        chk_prompt p = chk_pbuf_prompt(r, &r->pb);
        if ((st = diag_gather(r, &o, &p)) != KVO_OK) break;
        const check_prompt *pr = NULL;
        if ((st = check_result_add_sweep(r->res, &o, &pr)) != KVO_OK) break;
        if ((st = diag_apply(r, &r->res->sweep[r->res->n_sweep - 1])) != KVO_OK)
            break;
        c->sweep_prompts++;
        if (pr->diverged) {
            if (c->sweep_first < 0)
                c->sweep_first = (int64_t)(r->res->n_sweep - 1);
            c->sweep_divergent++;
        }
        if (pr->diverged && r->json &&
            check_report_json_sweep(r->json, r->res, pr) != KVO_OK) {
            st = kvo_err_set(&r->err, KVO_EIO, KVO_ERR_NO_OFFSET,
                             "cannot write %s", r->cfg->report_json);
        }
        if (pr->diverged && r->cfg->fail_fast) break;
    }
    kvo_free(seen);
    kvo_free(pick);
    /* observe() charged its parts to query/probe: the sweep owns them */
    memcpy(r->res->stage_s, before, sizeof(before));
    c->sweep_s = chk_secs(t0);
    r->res->stage_s[CHECK_STAGE_SWEEP] += c->sweep_s;
    return st;
}

kvo_status chk_run_sync(run *r, int64_t before) {
    return sync_index(r, before);
}

kvo_status chk_run_counters(run *r, int64_t before, bool all) {
    if (all)
        for (uint32_t i = 0; i < r->env.n_relays; i++)
            r->env.relays[i].dirty = true;
    return read_counters(r, before, all);
}

/* ---- the run -------------------------------------------------------------------*/

/* st, with the detail a callee left in e, for our caller. */
static kvo_status err_pass(kvo_err *err, kvo_status st, const kvo_err *e) {
    return kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "%s", e->msg);
}

static bool first_divergent(const check_result *res) {
    for (size_t i = 0; i < res->n_prompts; i++)
        if (res->prompts[i].diverged) return true;
    return false;
}

static const char *policy_name(check_policy p) {
    switch (p) {
    case CHECK_POLICY_KV: return "kv";
    case CHECK_POLICY_DYNAMO: return "dynamo";
    default: return "round-robin";
    }
}

static void describe(run *r) {
    const check_cfg *c = r->cfg;
    char blocks[32] = "default", mode[96] = "lockstep", pol[96];
    if (c->num_gpu_blocks)
        snprintf(blocks, sizeof(blocks), "%llu",
                 (unsigned long long)c->num_gpu_blocks);
    if (c->load)
        snprintf(mode, sizeof(mode), "load(%s %u, speedup %g)",
                 c->arrival == CHECK_ARRIVAL_TRACE ? "arrival trace, at most"
                                                   : "closed loop",
                 r->res->load.concurrency, r->res->load.speedup);
    snprintf(pol, sizeof(pol), "%s", policy_name(c->policy));
    if (c->policy == CHECK_POLICY_DYNAMO)
        snprintf(pol, sizeof(pol), "dynamo(w=%g,T=%g)", c->overlap_weight,
                 c->router_temperature);
    char traffic[200] = "";
    size_t tl = 0;
#define TRAFFIC(...)                                                           \
    tl += (size_t)snprintf(traffic + tl,                                       \
                           tl < sizeof(traffic) ? sizeof(traffic) - tl : 0,    \
                           __VA_ARGS__)
    if (c->lora_adapters)
        TRAFFIC(" lora=%u@%g", c->lora_adapters, c->lora_fraction);
    if (c->salt_tenants) TRAFFIC(" salt_tenants=%u", c->salt_tenants);
    if (c->mm_fraction > 0) TRAFFIC(" mm=%g", c->mm_fraction);
    if (c->reset_at >= 0) TRAFFIC(" reset_at=%lld", (long long)c->reset_at);
    if (c->kv_groups) TRAFFIC(" kv_groups=%s", c->kv_groups);
    if (c->cpu_offload_blocks)
        TRAFFIC(" cpu_blocks=%llu", (unsigned long long)c->cpu_offload_blocks);
    if (c->indexer_api == CHECK_API_DYNAMO)
        TRAFFIC(" indexer_api=dynamo model_name=%.60s", r->env.model_name);
#undef TRAFFIC
    snprintf(
        r->res->config, sizeof(r->res->config),
        "%s workers=%u%s dp=%u block_size=%u gpu_blocks=%s mode=%s "
        "policy=%s checkpoint_every=%llu hash=%s format=%s mutate=%s "
        "prompts=%s%s%s%s%s%s watermark=%s",
        c->spawn ? "spawn" : "attach", r->env.n_workers,
        r->env.n_decode ? "+decode" : "", r->env.dp_size, r->env.block_size,
        blocks, mode, pol, (unsigned long long)c->checkpoint_every,
        c->hash_algo, c->event_format ? c->event_format : "map",
        c->mutate && *c->mutate ? c->mutate : "none",
        r->trace_form ? "trace" : "tokens", c->no_replay ? " no-replay" : "",
        c->drop_seq >= 0 ? " drop-seq" : "",
        c->extra_block_seq >= 0 ? " extra-block" : "",
        r->res->n_faults ? " faults" : "", traffic,
        r->env.exact ? "exact" : "settle");
}

static void progress(run *r, uint64_t done, uint64_t total, uint64_t t_run,
                     uint64_t *last) {
    if (!r->cfg->progress) return;
    uint64_t now = kvo_now_ns();
    if (done != total && now - *last < PROGRESS_EVERY_NS) return;
    *last = now;
    check_report_progress(stderr, r->res, done, total, chk_secs(t_run));
    if (done == total) fputc('\n', stderr);
}

static kvo_status write_reports(run *r) {
    kvo_status st = KVO_OK;
    if (r->json) {
        if (check_report_json_summary(r->json, r->res) != KVO_OK) st = KVO_EIO;
        if (fclose(r->json) != 0) st = KVO_EIO;
        r->json = NULL;
    }
    if (r->cfg->report_html) {
        FILE *f = fopen(r->cfg->report_html, "w");
        if (!f || check_report_html(f, r->res) != KVO_OK) st = KVO_EIO;
        if (f && fclose(f) != 0) st = KVO_EIO;
    }
    return st;
}

/* Spawned kvo-mockers refuse a prompt longer than their max_model_len
 * ((num_gpu_blocks - 1) x block_size), as vLLM does; say so before
 * starting anything rather than failing mid-run on an HTTP 400. */
static kvo_status fits_spawned_engines(const check_cfg *cfg,
                                       const check_trace *t, kvo_err *err) {
    mock_cfg mc;
    mock_cfg_default(&mc);
    mc.block_size = cfg->block_size;
    if (cfg->num_gpu_blocks) mc.num_gpu_blocks = (uint32_t)cfg->num_gpu_blocks;
    uint32_t limit = mock_cfg_max_model_len(&mc);
    for (size_t i = 0; i < t->n; i++) {
        const check_request *q = &t->reqs[i];
        if (q->input_length <= limit) continue;
        uint64_t need =
            (q->input_length + cfg->block_size - 1) / cfg->block_size + 1;
        return kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                           "trace line %" PRIu64 " has a %u-token prompt, "
                           "more than the engines can hold (max_model_len "
                           "%u = (num_gpu_blocks %u - 1) x block size %u): "
                           "use --num-gpu-blocks %" PRIu64 " or more, or "
                           "--limit the trace",
                           q->line, q->input_length, limit, mc.num_gpu_blocks,
                           cfg->block_size, need);
    }
    return KVO_OK;
}

kvo_status check_run(const check_cfg *cfg, check_result *out, kvo_err *err) {
    run r;
    memset(&r, 0, sizeof(r));
    kvo_arena_init(&r.diag_arena);
    r.cfg = cfg;
    r.res = out;
    chk_pbuf_init(&r.pb);
    kvo_buf_init(&r.idx_metrics);
    check_counters_init(&r.prev);
    check_counters_init(&r.cur);
    check_counters_init(&r.moved);
    bool env_up = false, failed_setup = true;
    kvo_status st;

    if (!cfg->trace) {
        st = kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                         "--trace FILE is required");
        goto done;
    }
    if (cfg->block_size == 0 || cfg->dp_size == 0 ||
        cfg->dp_size > CHK_MAX_DP ||
        (cfg->spawn &&
         (cfg->workers == 0 ||
          cfg->workers + cfg->decode_workers > CHK_MAX_ENGINES))) {
        st = kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                         "bad sizes: workers 1..%d, dp size 1..%d, block size "
                         "> 0",
                         CHK_MAX_ENGINES, CHK_MAX_DP);
        goto done;
    }
    st = check_trace_load(&r.trace, cfg->trace, cfg->limit, &r.err);
    if (st != KVO_OK) {
        err_pass(err, st, &r.err);
        goto done;
    }
    if (r.trace.rejected)
        kvo_warn("%llu malformed trace lines skipped (first: %s)",
                 (unsigned long long)r.trace.rejected, r.trace.first_rejected);
    if (r.trace.n == 0) {
        st = kvo_err_set(err, KVO_EINVAL, KVO_ERR_NO_OFFSET,
                         "%s: no request in the trace", cfg->trace);
        goto done;
    }
    if (cfg->spawn && (st = fits_spawned_engines(cfg, &r.trace, err)) != KVO_OK)
        goto done;
    if (cfg->report_json) {
        r.json = fopen(cfg->report_json, "w");
        if (!r.json) {
            st = kvo_err_set(err, KVO_EIO, KVO_ERR_NO_OFFSET, "cannot write %s",
                             cfg->report_json);
            goto done;
        }
    }
    st = chk_env_start(&r.env, cfg, &r.trace, &r.err);
    if (st != KVO_OK) {
        if (kvo_stop)
            st = kvo_err_set(err, KVO_EINTR, KVO_ERR_NO_OFFSET, "interrupted");
        else
            err_pass(err, st, &r.err);
        goto done;
    }
    env_up = true;
    /* Dynamo's query cannot wait for a watermark: poll it */
    r.no_wait = cfg->indexer_api == CHECK_API_DYNAMO;
    r.stalled_relay = -1;
    r.trace_form =
        cfg->prompt_form == CHECK_FORM_TRACE ||
        (cfg->prompt_form == CHECK_FORM_AUTO && r.env.engines[0].mocker);
    r.n_slots = r.env.n_workers * r.env.dp_size;
    r.scores = kvo_calloc(r.n_slots, sizeof(*r.scores));
    r.probes = kvo_calloc(r.n_slots, sizeof(*r.probes));
    r.cached = kvo_calloc(r.n_slots, sizeof(*r.cached));
    r.cpu = kvo_calloc(r.n_slots, sizeof(*r.cpu));
    r.tiers.host = kvo_calloc(r.n_slots, sizeof(*r.tiers.host));
    r.seen = kvo_calloc(r.n_slots, sizeof(*r.seen));
    if (!r.scores || !r.probes || !r.cached || !r.cpu || !r.tiers.host ||
        !r.seen ||
        check_result_slots(out, r.env.n_workers, r.env.dp_size,
                           r.env.block_size) != KVO_OK) {
        st = KVO_ENOMEM;
        goto done;
    }
    st = check_router_init(&r.router, cfg->policy, r.env.n_workers,
                           r.env.dp_size, r.env.block_size, cfg->overlap_weight,
                           cfg->router_temperature, cfg->seed);
    if (st != KVO_OK) {
        st = kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                         "bad routing: --overlap-weight %g, "
                         "--router-temperature %g (each finite and >= 0)",
                         cfg->overlap_weight, cfg->router_temperature);
        goto done;
    }
    out->load.on = cfg->load;
    out->load.arrival = cfg->arrival;
    out->load.concurrency = chk_concurrency(cfg, r.env.n_workers);
    out->load.speedup = chk_speedup(cfg);
    out->load.time_scale = cfg->time_scale > 0     ? cfg->time_scale
                           : out->load.speedup > 0 ? out->load.speedup
                                                   : 1;
    out->faulted = check_cfg_faulted(cfg);
    st = check_faults_plan(cfg, r.trace.n, r.env.n_workers, r.env.dp_size,
                           &out->faults, &out->n_faults);
    if (st != KVO_OK) {
        st = kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                         "cannot plan the faults: "
                         "%s",
                         kvo_strerror(st));
        goto done;
    }
    if ((st = tasks_init(&r)) != KVO_OK) goto done;
    /* One worker beside the driver: the index wait runs on one thread
     * while the other probes the engines one after the other. */
    if ((st = chk_pool_new(&r.pool, POOL_THREADS)) != KVO_OK) goto done;
    out->planned = r.trace.n;
    out->verbose = cfg->verbose;
    check_traffic_count(cfg, r.trace.reqs, r.trace.n, &out->traffic);
    describe(&r);
    kvo_info("%s", out->config);
    kvo_info("trace %s: %zu requests; logs in %s", cfg->trace, r.trace.n,
             r.env.log_dir);
    failed_setup = false;

    uint64_t t_run = kvo_now_ns(), last_bar = 0;
    for (uint32_t i = 0; i < r.env.n_workers; i++)
        r.env.engines[i].dirty = true;
    bool stopped = false;
    size_t sent = 0;
    if (cfg->load) {
        st = chk_load_run(&r, &sent, &stopped);
        if (st != KVO_OK) goto transport;
    }
    for (size_t i = 0; !cfg->load && i < r.trace.n && !stopped; i++) {
        if (kvo_stop) break;
        if (i > 0 && cfg->checkpoint_every && i % cfg->checkpoint_every == 0) {
            st = chk_checkpoint(&r, i, false, 0, &stopped);
            if (st != KVO_OK) goto transport;
            if (stopped) break;
        }
        if (cfg->reset_at >= 0 && (uint64_t)cfg->reset_at == i) {
            st = reset_engines(&r, i, &stopped);
            if (st != KVO_OK) goto transport;
            if (stopped) break;
        }
        const check_request *q = &r.trace.reqs[i];
        st = do_request(&r, i, q, &stopped);
        if (st != KVO_OK) goto transport;
        sent = i + 1;
        progress(&r, i + 1, r.trace.n, t_run, &last_bar);
    }
    if (kvo_stop) {
        st = kvo_err_set(err, KVO_EINTR, KVO_ERR_NO_OFFSET, "interrupted");
        goto done;
    }
    /* the last checkpoint: the events of the last request count too */
    if (!stopped && !out->error[0] &&
        !(cfg->fail_fast && (out->n_trips || first_divergent(out)))) {
        st = chk_checkpoint(&r, sent, true, 0, &stopped);
        if (st != KVO_OK) goto transport;
    }
    st = KVO_OK;
    goto finish;
transport:
    if (st == KVO_EINTR || kvo_stop) {
        st = kvo_err_set(err, KVO_EINTR, KVO_ERR_NO_OFFSET, "interrupted");
        goto done;
    }
    /* a part stopped answering: that is a FAIL of the run, with its cause */
    {
        char dead[600];
        if (chk_env_dead(&r.env, dead, sizeof(dead)))
            check_result_error(out, (int64_t)out->n_prompts, "%s", dead);
        else
            check_result_error(out, (int64_t)out->n_prompts, "%s", r.err.msg);
    }
    st = KVO_OK;
finish:
    out->wall_s = chk_secs(t_run);
    {
        kvo_err e2 = {0};
        for (uint32_t i = 0; i < r.env.n_relays; i++)
            r.env.relays[i].dirty = true;
        if (read_counters(&r, -1, true) != KVO_OK)
            kvo_warn("final counters: %s", r.err.msg);
        for (uint32_t i = 0; i < r.env.n_engines; i++)
            if (r.env.engines[i].mocker &&
                chk_engine_counters(&r.env.engines[i], &r.cur, &e2) != KVO_OK)
                kvo_warn("engine counters: %s", e2.msg);
        /* the engines' error counters, read only now, trip like the rest */
        if (check_result_trips(out, &r.cur, -1) != KVO_OK)
            check_result_error(out, -1, "recording the engines' counters: %s",
                               kvo_strerror(KVO_ENOMEM));
        if (chk_env_cpu(&r.env, &r.cur) != KVO_OK)
            kvo_warn("cpu times: out of memory");
        check_counters_copy(&out->counters, &r.cur);
    }
    check_verdict_decide(out, &out->verdict);
    if (write_reports(&r) != KVO_OK) {
        st = kvo_err_set(err, KVO_EIO, KVO_ERR_NO_OFFSET,
                         "cannot write the reports");
    }
done:
    if (r.json) fclose(r.json);
    if (env_up) {
        bool keep = cfg->keep_logs ||
                    (!cfg->discard_logs &&
                     (failed_setup || !out->verdict.pass || st != KVO_OK));
        /* a part that died or stalled: show why at once */
        if (out->error[0] && st == KVO_OK)
            chk_env_dump_logs(&r.env, RUN_ERROR_LOG_LINES);
        chk_env_stop(&r.env, keep);
    }
    chk_pool_free(r.pool);
    tasks_fini(&r);
    check_trace_fini(&r.trace);
    chk_pbuf_fini(&r.pb);
    kvo_buf_fini(&r.idx_metrics);
    rh_memo_fini(&r.rh);
    check_router_fini(&r.router);
    mock_hasher_free(r.hasher);
    kvo_free(r.scores);
    kvo_free(r.probes);
    kvo_free(r.cached);
    kvo_free(r.cpu);
    kvo_free(r.tiers.host);
    kvo_free(r.seen);
    kvo_arena_fini(&r.diag_arena);
    chk_watermark_fini(&r.wm);
    check_counters_fini(&r.prev);
    check_counters_fini(&r.cur);
    check_counters_fini(&r.moved);
    return st;
}
