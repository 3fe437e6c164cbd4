/* mock_run.c -- trace mode: replay a Mooncake trace through the ranks with
 * no HTTP, as a discrete-event simulation on a model clock (ms).
 *
 *   events, in time order:  a trace request arrives (its timestamp; it goes
 *                           to rank i mod dp_size)
 *                           a rank's step ends (it began at the model time
 *                           its previous step ended, or when work arrived,
 *                           and lasts the modeled duration)
 *   at equal times arrivals come first; a rank that has work starts its
 *   next step as soon as it is free.
 *
 * --speedup 0: the model clock is virtual -- the machine runs as fast as it
 * can and batch timestamps are model seconds since the trace start (so a
 * capture is byte-identical for a seed). --speedup X: event at model time T
 * happens at wall time start + T / X (the mocker never runs ahead; when it
 * falls behind it catches up without sleeping), batch timestamps are wall
 * clock. Replay requests on the ROUTER sockets are served throughout.
 */
#include "mock_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* The progress bar: redrawn at most every PROGRESS_INTERVAL_NS, BAR_WIDTH
 * characters wide. */
#define PROGRESS_INTERVAL_NS 200000000ull
#define BAR_WIDTH 30
/* Real time: the longest wait between two looks at replay requests. */
#define WAIT_SLICE_MS 100
/* Virtual time: replay requests (and the bar) are looked at once every
 * SERVE_EVERY_LOOPS events (a power of two). */
#define SERVE_EVERY_LOOPS 1024
/* count_lines' read size. */
#define COUNT_CHUNK (64u << 10)

typedef struct trace_run {
    const mock_cfg *cfg;
    mock_node node;
    uint64_t started, finished, rejected, clamped, malformed;
    uint64_t prompt_tokens, cached_tokens, generated;
    uint64_t finished_prompt_tokens; /* the hit rate's denominator */
    uint64_t total_lines;
    uint64_t wall0;
    uint64_t last_progress;
    bool tty;
    zmq_pollitem_t *items; /* one per rank: the replay ROUTERs to poll */
} trace_run;

static void on_output(void *user, const mock_output *o) {
    trace_run *t = user;
    if (o->finish == MOCK_FINISH_NONE) return;
    t->finished++;
    t->finished_prompt_tokens += o->n_prompt;
    t->cached_tokens += o->cached_tokens;
    t->generated += o->n_output;
}

static uint64_t count_lines(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[COUNT_CHUNK];
    size_t n;
    uint64_t lines = 0;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        for (char *p = buf; (p = memchr(p, '\n', (size_t)(buf + n - p))); p++)
            lines++;
    fclose(f);
    return lines;
}

static void progress(trace_run *t, bool final) {
    if (!t->tty) return;
    uint64_t now = kvo_now_ns();
    if (!final && now - t->last_progress < PROGRESS_INTERVAL_NS) return;
    t->last_progress = now;
    uint64_t total = t->total_lines ? t->total_lines : 1;
    double frac = (double)t->finished / (double)total;
    if (frac > 1) frac = 1;
    char bar[BAR_WIDTH + 1];
    int fill = (int)(frac * BAR_WIDTH);
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    double secs = (double)(now - t->wall0) / 1e9;
    fprintf(stderr, "\r[%s] %llu/%llu requests  %.1f%% cached  %.1f s%s", bar,
            (unsigned long long)t->finished, (unsigned long long)total,
            t->finished_prompt_tokens ? 100.0 * (double)t->cached_tokens /
                                            (double)t->finished_prompt_tokens
                                      : 0.0,
            secs, final ? "\n" : "");
    fflush(stderr);
}

static void serve_replays(trace_run *t, long timeout_ms) {
    int n = 0;
    for (uint32_t r = 0; r < t->node.n_ranks; r++) {
        void *s = mock_pub_replay_socket(t->node.ranks[r].pub);
        if (s) t->items[n++] = (zmq_pollitem_t){s, 0, ZMQ_POLLIN, 0};
    }
    if (n == 0) {
        kvo_sleep_us(timeout_ms * 1000L);
        return;
    }
    if (zmq_poll(t->items, n, timeout_ms) <= 0) return;
    for (uint32_t r = 0; r < t->node.n_ranks; r++)
        node_replay_serve(&t->node, r);
}

/* Real time: wait until model time T is due on the wall clock. */
static void wait_until(trace_run *t, double model_ms) {
    if (t->cfg->speedup <= 0) return;
    for (;;) {
        if (kvo_stop) return;
        double due_ns = model_ms / t->cfg->speedup * 1e6;
        double now_ns = (double)(kvo_now_ns() - t->wall0);
        if (now_ns >= due_ns) return;
        double left_ms = (due_ns - now_ns) / 1e6;
        serve_replays(t, left_ms > WAIT_SLICE_MS ? WAIT_SLICE_MS
                                                 : (long)ceil(left_ms));
    }
}

static double batch_ts(const trace_run *t, double model_ms) {
    if (t->cfg->speedup <= 0) return model_ms / 1000.0;
    return (double)kvo_unix_ns() / 1e9;
}

static void summary(trace_run *t, double model_ms, bool interrupted) {
    const mock_cfg *c = t->cfg;
    double wall = (double)(kvo_now_ns() - t->wall0) / 1e9;
    mock_engine_stats tot;
    memset(&tot, 0, sizeof(tot));
    uint64_t pub_batches = 0;
    for (uint32_t r = 0; r < t->node.n_ranks; r++) {
        mock_engine_stats s;
        mock_engine_stats_get(t->node.ranks[r].eng, &s);
        tot.steps += s.steps;
        tot.preemptions += s.preemptions;
        tot.batches += s.batches;
        tot.events += s.events;
        tot.blocks_stored += s.blocks_stored;
        tot.blocks_removed += s.blocks_removed;
        mock_pub_stats ps;
        mock_pub_stats_get(t->node.ranks[r].pub, &ps);
        pub_batches += ps.batches;
    }
    mock_hasher_stats hs;
    mock_hasher_stats_get(t->node.hasher, &hs);
    double hit =
        t->finished_prompt_tokens
            ? (double)t->cached_tokens / (double)t->finished_prompt_tokens
            : 0.0;
    double hash_s = (double)hs.ns / 1e9;
    if (c->summary_json) {
        printf(
            "{\"trace\":\"%s\",\"interrupted\":%s,\"dp_size\":%u,"
            "\"block_size\":%u,\"num_gpu_blocks\":%u,\"hash_algo\":\"%s\","
            "\"requests\":%llu,\"finished\":%llu,\"rejected\":%llu,"
            "\"clamped\":%llu,\"malformed\":%llu,\"prompt_tokens\":%llu,"
            "\"cached_tokens\":%llu,\"hit_rate\":%.6f,\"generated_tokens\":%"
            "llu,"
            "\"steps\":%llu,\"preemptions\":%llu,\"batches\":%llu,"
            "\"published_batches\":%llu,\"events\":%llu,"
            "\"blocks_stored\":%llu,\"blocks_removed\":%llu,"
            "\"blocks_hashed\":%llu,\"memo_hits\":%llu,\"hash_seconds\":%.6f,"
            "\"model_seconds\":%.3f,\"wall_seconds\":%.6f}\n",
            c->trace, interrupted ? "true" : "false", c->dp_size, c->block_size,
            c->num_gpu_blocks, wire_algo_name(c->hash_algo),
            (unsigned long long)t->started, (unsigned long long)t->finished,
            (unsigned long long)t->rejected, (unsigned long long)t->clamped,
            (unsigned long long)t->malformed,
            (unsigned long long)t->prompt_tokens,
            (unsigned long long)t->cached_tokens, hit,
            (unsigned long long)t->generated, (unsigned long long)tot.steps,
            (unsigned long long)tot.preemptions,
            (unsigned long long)tot.batches, (unsigned long long)pub_batches,
            (unsigned long long)tot.events,
            (unsigned long long)tot.blocks_stored,
            (unsigned long long)tot.blocks_removed,
            (unsigned long long)hs.computed, (unsigned long long)hs.memo_hits,
            hash_s, model_ms / 1000.0, wall);
        fflush(stdout);
        return;
    }
    printf("kvo-mocker trace summary%s\n", interrupted ? " (interrupted)" : "");
    printf("  trace           %s\n", c->trace);
    printf("  requests        %llu finished of %llu started (%llu rejected, "
           "%llu clamped, %llu malformed lines)\n",
           (unsigned long long)t->finished, (unsigned long long)t->started,
           (unsigned long long)t->rejected, (unsigned long long)t->clamped,
           (unsigned long long)t->malformed);
    printf(
        "  prompt tokens   %llu started, %llu finished, cached %llu (hit rate "
        "%.2f%% of finished)\n",
        (unsigned long long)t->prompt_tokens,
        (unsigned long long)t->finished_prompt_tokens,
        (unsigned long long)t->cached_tokens, 100.0 * hit);
    printf("  generated       %llu tokens\n", (unsigned long long)t->generated);
    printf("  steps           %llu (%llu preemptions)\n",
           (unsigned long long)tot.steps, (unsigned long long)tot.preemptions);
    printf("  events          %llu in %llu batches (%llu published), blocks "
           "stored %llu, removed %llu\n",
           (unsigned long long)tot.events, (unsigned long long)tot.batches,
           (unsigned long long)pub_batches,
           (unsigned long long)tot.blocks_stored,
           (unsigned long long)tot.blocks_removed);
    printf(
        "  hashing         %s: %llu blocks hashed + %llu memo hits in %.2f s "
        "(%.0f blocks/s, %.1f%% of wall)\n",
        wire_algo_name(c->hash_algo), (unsigned long long)hs.computed,
        (unsigned long long)hs.memo_hits, hash_s,
        hash_s > 0 ? (double)hs.computed / hash_s : 0.0,
        wall > 0 ? 100.0 * hash_s / wall : 0.0);
    printf("  model time      %.1f s (%s)\n", model_ms / 1000.0,
           c->speedup > 0 ? "real time / speedup" : "virtual");
    printf("  wall time       %.2f s (%.0f requests/s, %.0f events/s)\n", wall,
           wall > 0 ? (double)t->finished / wall : 0.0,
           wall > 0 ? (double)tot.events / wall : 0.0);
    fflush(stdout);
}

kvo_status mock_run_trace(const mock_cfg *cfg) {
    trace_run t;
    memset(&t, 0, sizeof(t));
    t.cfg = cfg;
    mock_trace *tr = NULL;
    kvo_status st = mock_trace_open(&tr, cfg->trace);
    if (st != KVO_OK) {
        kvo_error("--trace %s: %s", cfg->trace, kvo_strerror(st));
        return st;
    }
    double now = 0; /* model ms */
    if ((st = node_init(&t.node, cfg, true)) != KVO_OK) goto done;
    if (!(t.items = kvo_calloc(t.node.n_ranks, sizeof(*t.items)))) {
        st = KVO_ENOMEM;
        goto done;
    }
    t.tty = cfg->progress && isatty(2);
    if (t.tty) t.total_lines = count_lines(cfg->trace);
    uint32_t max_len = mock_cfg_max_model_len(cfg);
    kvo_ratelimit rl_bad = {0}, rl_rej = {0};
    t.wall0 = kvo_now_ns();

    double t0_trace = -1; /* first timestamp: the model clock's origin */
    mock_trace_req req;
    bool have_req = false, eof = false;
    uint64_t rr = 0, loops = 0;
    char msg[256];

    while (!kvo_stop) {
        if (!have_req && !eof) {
            st = mock_trace_next(tr, &req, msg, sizeof(msg));
            if (st == KVO_OK) {
                have_req = true;
                if (t0_trace < 0) t0_trace = req.timestamp_ms;
            } else if (st == KVO_EOF) {
                eof = true;
            } else if (st == KVO_EIO) {
                kvo_error("--trace %s: read error", cfg->trace);
                eof = true;
            } else {
                kvo_log_limited(&rl_bad, KVO_LOG_WARN, "trace: %s (skipped)",
                                msg);
                continue;
            }
        }
        /* Idle ranks with work start a step now. */
        for (uint32_t r = 0; r < t.node.n_ranks; r++) {
            node_rank *nr = &t.node.ranks[r];
            if (nr->in_step) continue;
            if (!mock_engine_has_work(nr->eng) &&
                !mock_engine_has_events(nr->eng))
                continue;
            mock_step s;
            if ((st = node_step_begin(&t.node, r, batch_ts(&t, now), &s)) !=
                KVO_OK) {
                kvo_error("rank %u: step: %s", r, kvo_strerror(st));
                goto done;
            }
            if (!s.idle) {
                nr->in_step = true;
                nr->step_end = now + s.duration_ms;
            } else if (mock_engine_has_work(nr->eng)) {
                kvo_error("rank %u: work that can never be scheduled", r);
                st = KVO_ESTATE;
                goto done;
            }
        }
        double next_done = INFINITY;
        uint32_t done_rank = 0;
        for (uint32_t r = 0; r < t.node.n_ranks; r++) {
            node_rank *nr = &t.node.ranks[r];
            if (nr->in_step && nr->step_end < next_done) {
                next_done = nr->step_end;
                done_rank = r;
            }
        }
        double next_arr = have_req ? req.timestamp_ms - t0_trace : INFINITY;
        if (isinf(next_done) && isinf(next_arr)) break; /* all done */
        if ((++loops & (SERVE_EVERY_LOOPS - 1)) == 0) {
            serve_replays(&t, 0);
            progress(&t, false);
        }
        if (next_arr <= next_done) {
            if (next_arr > now) now = next_arr;
            wait_until(&t, now);
            have_req = false;
            uint32_t max_tokens = req.output_length;
            if (req.input_length >= max_len) {
                t.rejected++;
                kvo_log_limited(&rl_rej, KVO_LOG_WARN,
                                "trace line %llu: %u prompt tokens exceed "
                                "max_model_len %u (rejected)",
                                (unsigned long long)req.line, req.input_length,
                                max_len);
                continue;
            }
            if ((uint64_t)req.input_length + max_tokens > max_len) {
                max_tokens = max_len - req.input_length;
                t.clamped++;
            }
            uint32_t r = (uint32_t)(rr++ % t.node.n_ranks);
            mock_req_in in = {.tokens = NULL, /* synthesized at admission */
                              .n_tokens = req.input_length,
                              .max_tokens = max_tokens,
                              .trace = {req.hash_ids, req.n_hash_ids},
                              .on_output = on_output,
                              .user = &t};
            st = mock_engine_add(t.node.ranks[r].eng, &in, NULL);
            if (st != KVO_OK) {
                t.rejected++;
                kvo_log_limited(&rl_rej, KVO_LOG_WARN,
                                "trace line %llu: rejected: %s",
                                (unsigned long long)req.line, kvo_strerror(st));
                continue;
            }
            t.started++;
            t.prompt_tokens += req.input_length;
        } else {
            now = next_done;
            wait_until(&t, now);
            t.node.ranks[done_rank].in_step = false;
            node_step_end(&t.node, done_rank);
        }
    }
    st = KVO_OK;
done:
    t.malformed = mock_trace_malformed(tr);
    progress(&t, true);
    if (st == KVO_OK) summary(&t, now, kvo_stop != 0);
    mock_trace_free(tr);
    node_fini(&t.node);
    kvo_free(t.items);
    return st;
}
