/* check_load.c -- load mode (DESIGN §9): the trace through the pipeline
 * with many requests in flight, routed as a router routes them, exact at
 * checkpoints (check_ckpt.c).
 *
 *   dispatcher (the caller's thread)            senders (N threads, one
 *                                               request each at a time)
 *   admit request i to an idle sender:
 *     closed loop: N in flight at all times
 *     --arrival trace: at t0 + ts(i)/scale
 *     (the prompt built into its slot) ───────▶ POST /query_by_hash (no
 *                                               wait: the index as it is)
 *                                               lock: the policy picks a
 *                                                 slot from those scores
 *                                                 and the requests in
 *                                                 flight; count it; unlock
 *                                               POST /v1/completions
 *   collect the answers ◀───────────────────── lock: un-count it; done
 *     record what the router saw against the
 *     engine's hit (reported, not judged)
 *   every K admitted: stop admitting, wait for
 *     every answer (drain), write their JSON
 *     lines in trace order, checkpoint
 *   watch (every WATCH_MS): Ctrl-C, a dead process, no answer for
 *     --timeout-ms while requests are in flight: each aborts every call in
 *     flight, and the run ends with the cause (never a hang)
 *
 * The dispatcher alone touches the result, the prompt memo and the sweep;
 * senders share the router (under mu) and nothing else. In open loop the
 * clock stops during a checkpoint: the request after it is due at once and
 * the trace's spacing resumes from there.
 */
#include "check_int.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

typedef chk_run run;

/* The dispatcher looks at the world (Ctrl-C, dead processes, the
 * watchdog, the progress bar) at least this often. */
#define WATCH_MS 50
/* The progress bar is redrawn at most this often. */
#define LOAD_PROGRESS_NS 100000000ull
#define NS_PER_MS 1000000ull

typedef enum sstate { S_IDLE, S_WORK, S_DONE } sstate;

typedef struct load load;

typedef struct sender {
    load *L;
    pthread_t thread;
    pthread_cond_t go;
    bool started;
    sstate state;     /* under L->mu */
    size_t idx;       /* the request: its place in the trace */
    chk_pbuf pb;      /* its prompt */
    uint32_t *scores; /* the index's scores when it was routed */
    uint32_t slot, inflight_at_route;
    chk_completion c;
    kvo_status st; /* the calls' outcome */
    kvo_err err;
    uint64_t t_admit;
    kvo_http_client *idx_http, *eng_http;
} sender;

struct load {
    run *r;
    pthread_mutex_t mu;
    pthread_cond_t done; /* a sender finished */
    bool quit;
    volatile sig_atomic_t abort; /* every call in flight gives up */
    sender *s;
    uint32_t n;
    uint32_t inflight; /* routed and not answered (under mu) */
    uint64_t routed;   /* requests routed: round-robin's count */
};

/* ---- a sender ---------------------------------------------------------------*/

/* The request in s: query, route, complete, un-route. */
static void serve(sender *s) {
    load *L = s->L;
    run *r = L->r;
    const check_request *q = &r->trace.reqs[s->idx];
    uint32_t dp = r->env.dp_size;
    s->st =
        chk_index_query_via(s->idx_http, &r->env, s->pb.hashes, s->pb.nb, NULL,
                            0, -1, s->scores, NULL, NULL, NULL, NULL, &s->err);
    if (s->st != KVO_OK) return;
    size_t nh;
    const uint64_t *hs = chk_run_held(r, &s->pb, &nh);
    pthread_mutex_lock(&L->mu);
    s->inflight_at_route = L->inflight;
    s->slot = check_router_pick(&r->router, L->routed++, s->scores,
                                q->input_length, hs, nh);
    s->st = check_router_start(&r->router, s->slot, hs, nh);
    if (s->st == KVO_OK && ++L->inflight > r->res->load.max_inflight)
        r->res->load.max_inflight = L->inflight;
    pthread_mutex_unlock(&L->mu);
    if (s->st != KVO_OK) {
        kvo_err_set(&s->err, s->st, KVO_ERR_NO_OFFSET, "routing: %s",
                    kvo_strerror(s->st));
        return;
    }
    chk_engine *e = &r->env.engines[s->slot / dp];
    uint32_t rank = s->slot % dp;
    bool disagg = r->env.n_decode > 0;
    chk_prompt p = chk_pbuf_prompt(r, &s->pb);
    s->st = chk_engine_complete_via(
        s->eng_http, e, r->env.model, &p, disagg ? 1 : q->output_length,
        (e->mocker || dp > 1) ? (int)rank : -1, NULL, &s->c, &s->err);
    if (s->st == KVO_OK && disagg) { /* then the decode, round-robin */
        pthread_mutex_lock(&L->mu);
        uint32_t d =
            r->env.n_workers + (uint32_t)(r->decode_rr++ % r->env.n_decode);
        pthread_mutex_unlock(&L->mu);
        chk_completion dc;
        s->st = chk_engine_complete_via(
            s->eng_http, &r->env.engines[d], r->env.model, &p, q->output_length,
            -1, s->c.kv_transfer_params ? s->c.kv_transfer_params : "{}", &dc,
            &s->err);
        kvo_free(dc.kv_transfer_params);
    }
    kvo_free(s->c.kv_transfer_params);
    s->c.kv_transfer_params = NULL;
    pthread_mutex_lock(&L->mu);
    check_router_finish(&r->router, s->slot, hs, nh);
    L->inflight--;
    pthread_mutex_unlock(&L->mu);
}

static void *sender_main(void *arg) {
    sender *s = arg;
    load *L = s->L;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (!L->quit && s->state != S_WORK)
            pthread_cond_wait(&s->go, &L->mu);
        if (L->quit) break;
        pthread_mutex_unlock(&L->mu);
        serve(s);
        pthread_mutex_lock(&L->mu);
        s->state = S_DONE;
        pthread_cond_signal(&L->done);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* ---- set-up and tear-down ---------------------------------------------------*/

static void load_fini(load *L) {
    if (!L->s) return;
    pthread_mutex_lock(&L->mu);
    L->quit = true;
    for (uint32_t i = 0; i < L->n; i++) pthread_cond_signal(&L->s[i].go);
    pthread_mutex_unlock(&L->mu);
    for (uint32_t i = 0; i < L->n; i++) {
        sender *s = &L->s[i];
        if (s->started) pthread_join(s->thread, NULL);
        pthread_cond_destroy(&s->go);
        chk_pbuf_fini(&s->pb);
        kvo_free(s->scores);
        kvo_http_client_free(s->idx_http);
        kvo_http_client_free(s->eng_http);
    }
    kvo_free(L->s);
    L->s = NULL;
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->done);
}

static kvo_status load_init(load *L, run *r, uint32_t n) {
    memset(L, 0, sizeof(*L));
    L->r = r;
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->done, NULL);
    L->s = kvo_calloc(n, sizeof(*L->s));
    if (!L->s) {
        pthread_mutex_destroy(&L->mu);
        pthread_cond_destroy(&L->done);
        return KVO_ENOMEM;
    }
    L->n = n;
    kvo_status st = KVO_OK;
    for (uint32_t i = 0; i < n; i++) {
        sender *s = &L->s[i];
        s->L = L;
        pthread_cond_init(&s->go, NULL);
        chk_pbuf_init(&s->pb);
        s->scores = kvo_calloc(r->n_slots, sizeof(*s->scores));
        if (!s->scores) st = KVO_ENOMEM;
        /* an index query is bounded by --timeout-ms; a completion by the
         * watchdog (no answer at all for --timeout-ms) */
        if (st == KVO_OK)
            st = kvo_http_client_new(&s->idx_http, r->cfg->timeout_ms);
        if (st == KVO_OK) st = kvo_http_client_new(&s->eng_http, 0);
        if (st != KVO_OK) break;
        kvo_http_client_abort_on(s->idx_http, &L->abort);
        kvo_http_client_abort_on(s->eng_http, &L->abort);
        if (pthread_create(&s->thread, NULL, sender_main, s) != 0) {
            st = KVO_ENOMEM;
            break;
        }
        s->started = true;
    }
    if (st != KVO_OK) load_fini(L);
    return st;
}

/* ---- the dispatcher -------------------------------------------------------*/

typedef struct disp {
    load *L;
    run *r;
    size_t next;    /* requests admitted */
    size_t ckpt_at; /* where the last checkpoint was (0: none yet) */
    size_t answered;
    uint32_t busy; /* senders working or done, not yet collected */
    bool failed;   /* a run error: admit nothing more */
    uint64_t t_run, last_answer, last_bar, last_watch;
    uint64_t pause_ns; /* open loop: the clock stopped at checkpoints */
    bool blocked;      /* open loop: next was due with every sender busy */
} disp;

/* When request i is due (open loop), monotonic ns. */
static uint64_t due_ns(const disp *d, size_t i) {
    const check_trace *t = &d->r->trace;
    double ms = (t->reqs[i].timestamp_ms - t->reqs[0].timestamp_ms) /
                d->r->res->load.time_scale;
    if (ms < 0) ms = 0;
    return d->t_run + d->pause_ns + (uint64_t)(ms * (double)NS_PER_MS);
}

/* A finished sender's request into the result; the sender becomes idle.
 * Called with mu held. */
static kvo_status collect(disp *d, sender *s) {
    run *r = d->r;
    const check_request *q = &r->trace.reqs[s->idx];
    kvo_status st = KVO_OK;
    s->state = S_IDLE;
    d->busy--;
    d->answered++;
    d->last_answer = kvo_now_ns();
    if (s->st != KVO_OK) {
        /* aborted calls fail too: only the first real cause is kept, and a
         * process that died is the cause of the calls that failed with it */
        char dead[600];
        if (d->L->abort)
            ;
        else if (chk_env_dead(&r->env, dead, sizeof(dead)))
            check_result_error(r->res, (int64_t)q->line, "%s", dead);
        else
            check_result_error(r->res, (int64_t)q->line, "prompt %llu: %s",
                               (unsigned long long)q->line, s->err.msg);
        d->failed = true;
        return KVO_OK;
    }
    if (!chk_run_answer_ok(r, q, s->slot % r->env.dp_size, &s->c, false)) {
        d->failed = true;
        return KVO_OK;
    }
    for (uint32_t k = 0; k < r->n_slots; k++) r->seen[k] |= s->scores[k] > 0;
    check_obs o = {.id = q->line,
                   .prompt_tokens = q->input_length,
                   .block_size = r->env.block_size,
                   .n_slots = r->n_slots,
                   .dp_size = r->env.dp_size,
                   .chosen = s->slot,
                   .index_seen = r->seen,
                   .index_scores = s->scores,
                   .cached_tokens = s->c.cached_tokens,
                   .unjudged = true,
                   .inflight_at_route = s->inflight_at_route,
                   .ms = (double)(d->last_answer - s->t_admit) / 1e6};
    st = chk_run_record(r, &o, NULL);
    return st;
}

/* Hand request next to an idle sender. Called with mu held; *ok false when
 * none is idle. */
static kvo_status admit(disp *d, bool *ok) {
    load *L = d->L;
    sender *s = NULL;
    *ok = false;
    for (uint32_t i = 0; i < L->n && !s; i++)
        if (L->s[i].state == S_IDLE) s = &L->s[i];
    if (!s) return KVO_OK;
    run *r = d->r;
    kvo_status st = chk_run_prompt(r, &r->trace.reqs[d->next], &s->pb);
    if (st != KVO_OK) return st;
    uint64_t now = kvo_now_ns();
    if (d->blocked) { /* due while every sender was busy */
        double late = (double)(now - due_ns(d, d->next)) / 1e6;
        r->res->load.late++;
        if (late > r->res->load.late_max_ms) r->res->load.late_max_ms = late;
        d->blocked = false;
    }
    if (d->busy == 0) d->last_answer = now; /* the watchdog starts now */
    s->idx = d->next++;
    s->t_admit = now;
    s->st = KVO_OK;
    memset(&s->err, 0, sizeof(s->err));
    s->state = S_WORK;
    d->busy++;
    pthread_cond_signal(&s->go);
    *ok = true;
    return KVO_OK;
}

/* The oldest request in flight, for the watchdog's message. */
static const sender *oldest(const load *L) {
    const sender *o = NULL;
    for (uint32_t i = 0; i < L->n; i++)
        if (L->s[i].state == S_WORK && (!o || L->s[i].t_admit < o->t_admit))
            o = &L->s[i];
    return o;
}

/* Ctrl-C, a dead process, or no answer for --timeout-ms: abort (a run
 * error recorded, except on Ctrl-C). Called with mu held. */
static void watch(disp *d) {
    run *r = d->r;
    uint64_t now = kvo_now_ns();
    if (r->cfg->progress && now - d->last_bar >= LOAD_PROGRESS_NS) {
        d->last_bar = now;
        check_report_progress(stderr, r->res, d->answered, r->trace.n,
                              chk_secs(d->t_run));
    }
    if (d->L->abort) return;
    if (kvo_stop) {
        d->L->abort = 1;
        return;
    }
    if (now - d->last_watch < (uint64_t)WATCH_MS * NS_PER_MS) return;
    d->last_watch = now;
    char why[600];
    if (chk_env_dead(&r->env, why, sizeof(why))) {
        check_result_error(
            r->res, (int64_t)r->trace.reqs[d->next ? d->next - 1 : 0].line,
            "%s", why);
        d->failed = true;
        d->L->abort = 1;
        return;
    }
    uint64_t quiet = now - d->last_answer;
    if (d->busy && quiet > (uint64_t)r->cfg->timeout_ms * NS_PER_MS) {
        const sender *o = oldest(d->L);
        if (o) {
            const check_request *q = &r->trace.reqs[o->idx];
            check_result_error(
                r->res, (int64_t)q->line,
                "no request answered for %ld ms with %u in flight (--timeout-"
                "ms); the oldest, prompt %llu, was sent %.0f ms ago",
                r->cfg->timeout_ms, d->busy, (unsigned long long)q->line,
                (double)(now - o->t_admit) / 1e6);
        } else {
            check_result_error(r->res, -1, "no request answered for %ld ms",
                               r->cfg->timeout_ms);
        }
        d->failed = true;
        d->L->abort = 1;
    }
}

/* Wait on done until deadline_ns (monotonic) at the latest. */
static void wait_until(load *L, uint64_t deadline_ns) {
    /* condition variables time out on the realtime clock */
    uint64_t now = kvo_now_ns();
    if (deadline_ns <= now) return;
    uint64_t at = kvo_unix_ns() + (deadline_ns - now);
    struct timespec ts = {(time_t)(at / 1000000000ull),
                          (long)(at % 1000000000ull)};
    int rc = pthread_cond_timedwait(&L->done, &L->mu, &ts);
    (void)rc; /* a timeout or a signal: the caller looks again */
}

kvo_status chk_load_run(run *r, size_t *sent, bool *stop) {
    const check_cfg *cfg = r->cfg;
    check_result *res = r->res;
    *sent = 0;
    *stop = false;
    load L;
    kvo_status st = load_init(&L, r, res->load.concurrency);
    if (st != KVO_OK)
        return kvo_err_set(&r->err, st, KVO_ERR_NO_OFFSET,
                           "starting %u sender threads: %s",
                           res->load.concurrency, kvo_strerror(st));
    disp d = {.L = &L, .r = r, .t_run = kvo_now_ns()};
    d.last_answer = d.last_watch = d.t_run;
    bool open = cfg->arrival == CHECK_ARRIVAL_TRACE;
    size_t n = r->trace.n, k = cfg->checkpoint_every;
    uint64_t t_drain = 0, t_phase = d.t_run;
    pthread_mutex_lock(&L.mu);
    for (;;) {
        for (uint32_t i = 0; i < L.n && st == KVO_OK; i++)
            if (L.s[i].state == S_DONE) st = collect(&d, &L.s[i]);
        if (st != KVO_OK) {
            d.failed = true;
            L.abort = 1;
        }
        watch(&d);
        bool ending = d.failed || L.abort;
        if (ending && d.busy == 0) break;
        size_t target = k ? d.ckpt_at + k : n; /* the next checkpoint */
        if (target > n) target = n;
        if (!ending && d.next == target && d.busy == 0) {
            if (d.next == n) break; /* the caller runs the final one */
            /* a checkpoint: the traffic stopped and drained */
            double drain = t_drain ? chk_secs(t_drain) : 0;
            res->stage_s[CHECK_STAGE_TRAFFIC] += chk_secs(t_phase) - drain;
            pthread_mutex_unlock(&L.mu);
            st = chk_run_flush(r);
            if (st == KVO_OK)
                st = chk_checkpoint(r, d.next, false, drain, stop);
            pthread_mutex_lock(&L.mu);
            if (st != KVO_OK || *stop) break;
            if (open) { /* the next request is due now, then the trace's
                           spacing */
                uint64_t now = kvo_now_ns(), due = due_ns(&d, d.next);
                if (due < now) d.pause_ns += now - due;
            }
            d.ckpt_at = d.next;
            t_drain = 0;
            t_phase = kvo_now_ns();
            d.last_answer = t_phase;
            continue;
        }
        /* admit what may go now */
        uint64_t wake = kvo_now_ns() + (uint64_t)WATCH_MS * NS_PER_MS;
        while (!ending && d.next < target) {
            if (open) {
                uint64_t due = due_ns(&d, d.next);
                if (due > kvo_now_ns()) {
                    if (due < wake) wake = due;
                    break;
                }
            }
            bool ok = false;
            if ((st = admit(&d, &ok)) != KVO_OK) break;
            if (!ok) {
                d.blocked = open;
                break;
            }
            if (d.next == target) t_drain = kvo_now_ns();
        }
        if (st != KVO_OK) {
            d.failed = true;
            L.abort = 1;
            continue;
        }
        wait_until(&L, wake);
    }
    pthread_mutex_unlock(&L.mu);
    res->stage_s[CHECK_STAGE_TRAFFIC] += chk_secs(t_phase);
    if (cfg->progress) {
        check_report_progress(stderr, res, d.answered, n, chk_secs(d.t_run));
        fputc('\n', stderr);
    }
    load_fini(&L);
    kvo_status fl = chk_run_flush(r);
    if (st == KVO_OK) st = fl;
    *sent = d.answered;
    if (st == KVO_OK && kvo_stop) st = KVO_EINTR;
    if (d.failed) *stop = true;
    return st;
}
