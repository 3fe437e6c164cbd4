/* kvo-bench-relay -- BENCH.md W2: relay throughput against a raw pass-through.
 *
 *   kvo-bench-relay drive --capture FILE --bind EP --nats URL --subject S
 *                         --expect relay|raw [--lockstep N] [--limit N]
 *       Binds an XPUB (no drops: sends wait for the subscriber), waits for
 *       one subscriber, sends the capture's ZMQ records as fast as the socket
 *       takes them (or one at a time with --lockstep N, waiting for each to
 *       come out of NATS) and prints one JSON line with the numbers.
 *       relay: done when a KVO-Zmq-Seq header reaches the last sequence;
 *       raw:   done when one NATS message per batch arrived.
 *   kvo-bench-relay passthrough --zmq EP --nats URL --subject S [--send-asap]
 *       The baseline: SUB -> publish the same payload bytes, no decoding
 *       (--send-asap: write each message at once, for the latency runs;
 *       kvo-relay always does, its envelopes being batched already).
 *   kvo-bench-relay pipe --capture FILE [--limit N] [--rounds N]
 *       The relay's pure pipeline alone (relay_pipe_live on every record, a
 *       publish callback that only counts), and wire_batch_decode alone, on
 *       the same records in memory: this thread's CPU time per batch, median
 *       of --rounds (min-max), so other processes on the CPU do not count.
 *       Run it under `valgrind --tool=callgrind` with --limit for
 *       instruction counts.
 *   kvo-bench-relay synth --out FILE [--batches N]
 *       A synthetic capture (prefix-sharing stores, evictions) for when no
 *       kvo-mocker capture is at hand.
 */
#include "kvo.h"
#include "relay_int.h"
#include "wire.h"

#include <inttypes.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ---- the capture in memory ---------------------------------------------*/

typedef struct rec {
    uint64_t seq;
    uint8_t *topic;
    size_t topic_len;
    uint8_t *payload;
    size_t len;
} rec;

typedef struct capture {
    rec *r;
    size_t n;
    uint64_t events, blocks, bytes;
} capture;

static int load_capture(const char *path, size_t limit, capture *c) {
    wire_cap_reader *rd;
    if (wire_cap_open(&rd, path, NULL) != KVO_OK) {
        fprintf(stderr, "cannot open capture %s\n", path);
        return -1;
    }
    size_t cap = 0;
    wire_cap_record r;
    wire_batch b;
    wire_batch_init(&b);
    kvo_status st;
    while ((st = wire_cap_next(rd, &r, NULL)) == KVO_OK) {
        if (r.n_frames != 3) continue; /* NATS records, if any */
        uint64_t seq;
        if (wire_seq_get(r.frames[1].data, r.frames[1].len, &seq) != KVO_OK)
            continue;
        if (c->n == cap) {
            cap = cap ? cap * 2 : 4096;
            c->r = realloc(c->r, cap * sizeof(*c->r));
        }
        rec *x = &c->r[c->n++];
        x->seq = seq;
        x->topic_len = r.frames[0].len;
        x->topic = malloc(x->topic_len + 1);
        memcpy(x->topic, r.frames[0].data, x->topic_len);
        x->len = r.frames[2].len;
        x->payload = malloc(x->len + 1);
        memcpy(x->payload, r.frames[2].data, x->len);
        c->bytes += x->len;
        if (wire_batch_decode(x->payload, x->len, NULL, &b, NULL) == KVO_OK) {
            c->events += b.n_events;
            for (uint32_t i = 0; i < b.n_events; i++)
                c->blocks += b.events[i].n_hashes;
        }
        if (limit && c->n >= limit) break;
    }
    wire_batch_fini(&b);
    wire_cap_free(rd);
    if (st != KVO_OK && st != KVO_EOF) {
        fprintf(stderr, "capture %s damaged: %s\n", path, kvo_strerror(st));
        return -1;
    }
    return 0;
}

static void capture_free(capture *c) {
    for (size_t i = 0; i < c->n; i++) {
        free(c->r[i].topic);
        free(c->r[i].payload);
    }
    free(c->r);
}

/* ---- NATS receiver (callback thread -> counters) ------------------------*/

typedef struct rx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t msgs;
    bool has_wm;
    uint64_t wm;      /* last KVO-Zmq-Seq end */
    uint64_t last_ns; /* arrival of the latest message */
} rx;

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *m,
                   void *closure) {
    (void)nc;
    (void)sub;
    rx *x = closure;
    const char *v = NULL;
    uint64_t first, last;
    bool hr = natsMsgHeader_Get(m, "KVO-Zmq-Seq", &v) == NATS_OK && v &&
              sscanf(v, "%" SCNu64 "-%" SCNu64, &first, &last) == 2;
    uint64_t now = kvo_now_ns();
    pthread_mutex_lock(&x->mu);
    x->msgs++;
    if (hr) {
        x->has_wm = true;
        x->wm = last;
    }
    x->last_ns = now;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    natsMsg_Destroy(m);
}

/* Wait until the receiver has seen batch index i (seq) or timeout. */
static bool rx_wait(rx *x, bool relay, uint64_t seq, uint64_t nmsgs,
                    long timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    bool ok = true;
    pthread_mutex_lock(&x->mu);
    while (relay ? !(x->has_wm && x->wm >= seq) : x->msgs < nmsgs) {
        if (pthread_cond_timedwait(&x->cv, &x->mu, &dl) != 0) {
            ok = relay ? (x->has_wm && x->wm >= seq) : x->msgs >= nmsgs;
            break;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return ok;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int send_rec(void *pub, const rec *r) {
    uint8_t s[8];
    wire_seq_put(s, r->seq);
    const void *d[3] = {r->topic, s, r->payload};
    size_t l[3] = {r->topic_len, 8, r->len};
    for (int i = 0; i < 3; i++) {
        int flags = i < 2 ? ZMQ_SNDMORE : 0;
        while (zmq_send(pub, d[i], l[i], flags) < 0) {
            if (zmq_errno() != EAGAIN || kvo_stop) return -1;
            zmq_pollitem_t it = {pub, 0, ZMQ_POLLOUT, 0};
            zmq_poll(&it, 1, 10);
        }
    }
    return 0;
}

static int drive(int argc, char **argv) {
    const char *capture_path = NULL, *bind = NULL, *url = NULL, *subject = NULL,
               *expect = "relay";
    uint64_t lockstep = 0, limit = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--capture"))
            capture_path = argv[i + 1];
        else if (!strcmp(argv[i], "--bind"))
            bind = argv[i + 1];
        else if (!strcmp(argv[i], "--nats"))
            url = argv[i + 1];
        else if (!strcmp(argv[i], "--subject"))
            subject = argv[i + 1];
        else if (!strcmp(argv[i], "--expect"))
            expect = argv[i + 1];
        else if (!strcmp(argv[i], "--lockstep"))
            lockstep = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--limit"))
            limit = strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "drive: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!capture_path || !bind || !url || !subject) {
        fprintf(stderr, "drive: --capture --bind --nats --subject needed\n");
        return 2;
    }
    bool relay = strcmp(expect, "relay") == 0;
    if (lockstep && (!limit || lockstep < limit)) limit = lockstep;
    capture c = {0};
    if (load_capture(capture_path, limit, &c) != 0 || c.n == 0) return 2;

    rx x = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    if (natsConnection_ConnectTo(&nc, url) != NATS_OK ||
        natsConnection_Subscribe(&sub, nc, subject, on_msg, &x) != NATS_OK) {
        fprintf(stderr, "drive: NATS %s unavailable\n", url);
        return 2;
    }
    natsSubscription_SetPendingLimits(sub, -1, -1);
    natsConnection_Flush(nc);

    void *zctx = zmq_ctx_new();
    void *pub = zmq_socket(zctx, ZMQ_XPUB);
    int one = 1, linger = 0, hwm = 10000;
    zmq_setsockopt(pub, ZMQ_XPUB_NODROP, &one, sizeof(one));
    zmq_setsockopt(pub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (zmq_bind(pub, bind) != 0) {
        fprintf(stderr, "drive: bind %s: %s\n", bind,
                zmq_strerror(zmq_errno()));
        return 2;
    }
    /* Wait for the subscriber (XPUB shows its subscription). */
    for (;;) {
        uint8_t m[256];
        zmq_pollitem_t it = {pub, 0, ZMQ_POLLIN, 0};
        if (kvo_stop) return 2;
        if (zmq_poll(&it, 1, 100) > 0 && zmq_recv(pub, m, sizeof(m), 0) >= 1 &&
            m[0] == 1)
            break;
    }
    /* The subscriber's own start-up (NATS connect) must not count. */
    nats_Sleep(300);

    int rc = 0;
    uint64_t *lat = lockstep ? calloc(c.n, sizeof(uint64_t)) : NULL;
    uint64_t t0 = kvo_now_ns();
    for (size_t i = 0; i < c.n && !kvo_stop; i++) {
        uint64_t ts = kvo_now_ns();
        if (send_rec(pub, &c.r[i]) != 0) {
            rc = 1;
            break;
        }
        if (lockstep) {
            if (!rx_wait(&x, relay, c.r[i].seq, i + 1, 10000)) {
                fprintf(stderr,
                        "drive: batch %zu (seq %" PRIu64
                        ") did not come out within 10 s\n",
                        i, c.r[i].seq);
                rc = 1;
                break;
            }
            lat[i] = kvo_now_ns() - ts;
        }
    }
    if (rc == 0 && !lockstep &&
        !rx_wait(&x, relay, c.r[c.n - 1].seq, c.n, 120000)) {
        fprintf(stderr,
                "drive: not everything came out within 120 s "
                "(messages %" PRIu64 ")\n",
                x.msgs);
        rc = 1;
    }
    pthread_mutex_lock(&x.mu);
    uint64_t t1 = x.last_ns, msgs = x.msgs;
    pthread_mutex_unlock(&x.mu);
    if (rc == 0) {
        double secs = (double)(t1 - t0) / 1e9;
        printf("{\"expect\": \"%s\", \"batches\": %zu, \"events\": %" PRIu64
               ", \"blocks\": %" PRIu64 ", \"bytes\": %" PRIu64
               ", \"nats_messages\": %" PRIu64 ", \"seconds\": %.6f",
               expect, c.n, c.events, c.blocks, c.bytes, msgs, secs);
        if (lockstep) {
            qsort(lat, c.n, sizeof(*lat), cmp_u64);
            printf(", \"lat_p50_us\": %.1f, \"lat_p99_us\": %.1f",
                   (double)lat[c.n / 2] / 1e3,
                   (double)lat[(c.n * 99) / 100] / 1e3);
        } else {
            printf(", \"batches_per_s\": %.0f, \"events_per_s\": %.0f"
                   ", \"blocks_per_s\": %.0f, \"mb_per_s\": %.2f",
                   (double)c.n / secs, (double)c.events / secs,
                   (double)c.blocks / secs, (double)c.bytes / secs / 1e6);
        }
        printf("}\n");
    }
    free(lat);
    zmq_close(pub);
    zmq_ctx_term(zctx);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    capture_free(&c);
    return rc;
}

/* ---- the baseline ----------------------------------------------------------*/

static int passthrough(int argc, char **argv) {
    const char *ep = NULL, *url = NULL, *subject = NULL;
    bool asap = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--send-asap"))
            asap = true;
        else if (i + 1 >= argc)
            break;
        else if (!strcmp(argv[i], "--zmq"))
            ep = argv[++i];
        else if (!strcmp(argv[i], "--nats"))
            url = argv[++i];
        else if (!strcmp(argv[i], "--subject"))
            subject = argv[++i];
    }
    if (!ep || !url || !subject) {
        fprintf(stderr, "passthrough: --zmq --nats --subject needed\n");
        return 2;
    }
    natsConnection *nc = NULL;
    natsOptions *o = NULL;
    natsOptions_Create(&o);
    natsOptions_SetURL(o, url);
    natsOptions_SetSendAsap(o, asap); /* lockstep: no flusher delay */
    natsStatus ns = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (ns != NATS_OK) {
        fprintf(stderr, "passthrough: NATS %s unavailable\n", url);
        return 2;
    }
    void *zctx = zmq_ctx_new();
    void *sub = zmq_socket(zctx, ZMQ_SUB);
    int linger = 0, hwm = 100000;
    zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(sub, ep) != 0) return 2;
    uint64_t n = 0;
    zmq_msg_t part[3];
    for (int i = 0; i < 3; i++) zmq_msg_init(&part[i]);
    while (!kvo_stop) {
        zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        for (;;) {
            int k = 0;
            bool more = true;
            while (more && k < 3) {
                if (zmq_msg_recv(&part[k], sub, k ? 0 : ZMQ_DONTWAIT) < 0)
                    break;
                more = zmq_msg_more(&part[k]);
                k++;
            }
            if (k == 0) break;
            if (k == 3 && !more)
                natsConnection_Publish(nc, subject, zmq_msg_data(&part[2]),
                                       (int)zmq_msg_size(&part[2]));
            n++;
        }
    }
    for (int i = 0; i < 3; i++) zmq_msg_close(&part[i]);
    natsConnection_FlushTimeout(nc, 2000);
    fprintf(stderr, "passthrough: %" PRIu64 " messages\n", n);
    zmq_close(sub);
    zmq_ctx_term(zctx);
    natsConnection_Destroy(nc);
    return 0;
}

/* ---- the pipeline alone (CPU time) -----------------------------------------*/

typedef struct sink {
    uint64_t msgs, bytes, sum;
} sink;

static kvo_status sink_publish(void *ctx, const char *subject, bool has_range,
                               uint64_t first, uint64_t last,
                               const uint8_t *body, size_t len) {
    (void)subject;
    sink *k = ctx;
    k->msgs++;
    k->bytes += len;
    k->sum += len ? body[len / 2] : 0; /* touch the bytes */
    k->sum += has_range ? first ^ last : 0;
    return KVO_OK;
}

static kvo_status sink_replay(void *ctx, uint32_t src, uint64_t from) {
    (void)ctx;
    (void)src;
    (void)from;
    return KVO_EINVAL; /* the capture has no gaps */
}

static uint64_t thread_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *us, int rounds, double extra) {
    qsort(us, (size_t)rounds, sizeof(*us), cmp_double);
    printf("  %-22s %8.3f us/batch (%.3f-%.3f)", what, us[rounds / 2], us[0],
           us[rounds - 1]);
    if (extra > 0) printf("  %8.1f MB/s", extra / us[rounds / 2]);
    printf("\n");
}

static int pipe_cmd(int argc, char **argv) {
    const char *capture_path = NULL;
    uint64_t limit = 0;
    int rounds = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--capture"))
            capture_path = argv[i + 1];
        else if (!strcmp(argv[i], "--limit"))
            limit = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "pipe: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!capture_path || rounds < 1 || rounds > 99) {
        fprintf(stderr, "pipe: --capture FILE needed\n");
        return 2;
    }
    capture c = {0};
    if (load_capture(capture_path, limit, &c) != 0 || c.n == 0) return 2;
    printf("pipe: %zu batches, %" PRIu64 " events, %" PRIu64 " blocks, %" PRIu64
           " bytes; CPU time of this thread, median of "
           "%d (min-max)\n",
           c.n, c.events, c.blocks, c.bytes, rounds);
    double us_pipe[99], us_dec[99];
    sink k = {0};
    uint64_t dec_sum = 0;
    wire_batch b;
    wire_batch_init(&b);
    for (int r = 0; r < rounds; r++) {
        relay_pipe_cfg pc = {.worker_id = 1,
                             .block_size = 16,
                             .publisher_id = 1,
                             .subject = "namespace.dynamo.component.backend."
                                        "kv-events"};
        relay_out o = {
            .ctx = &k, .publish = sink_publish, .replay_request = sink_replay};
        relay_pipe *p;
        if (relay_pipe_new(&p, &pc, &o) != KVO_OK) return 2;
        uint32_t si;
        relay_pipe_source_add(p, 0, false, &si);
        memset(&k, 0, sizeof(k));
        uint64_t t0 = thread_ns();
        for (size_t i = 0; i < c.n; i++) {
            uint8_t s[8];
            wire_seq_put(s, c.r[i].seq);
            wire_frame f[3] = {{c.r[i].topic, c.r[i].topic_len},
                               {s, 8},
                               {c.r[i].payload, c.r[i].len}};
            relay_pipe_live(p, si, f, 3, 0);
        }
        relay_pipe_flush(p);
        uint64_t t1 = thread_ns();
        const relay_stats *st = relay_pipe_stats(p);
        if (relay_stats_decode_errors(st) || relay_stats_rejects(st) ||
            st->gaps) {
            fprintf(stderr, "pipe: decode errors, rejects or gaps\n");
            return 1;
        }
        relay_pipe_free(p);
        us_pipe[r] = (double)(t1 - t0) / 1e3 / (double)c.n;

        t0 = thread_ns();
        for (size_t i = 0; i < c.n; i++) {
            if (wire_batch_decode(c.r[i].payload, c.r[i].len, NULL, &b, NULL) !=
                KVO_OK)
                return 1;
            dec_sum += b.n_events;
        }
        t1 = thread_ns();
        us_dec[r] = (double)(t1 - t0) / 1e3 / (double)c.n;
    }
    wire_batch_fini(&b);
    double per = (double)c.bytes / (double)c.n; /* bytes/batch: B/us = MB/s */
    report("pipeline", us_pipe, rounds, per);
    report("wire_batch_decode", us_dec, rounds, per);
    printf("  envelopes %" PRIu64 ", envelope bytes %" PRIu64
           " (checksum %" PRIu64 ", %" PRIu64 ")\n",
           k.msgs, k.bytes, k.sum, dec_sum / (uint64_t)rounds);
    capture_free(&c);
    return 0;
}

/* ---- a synthetic capture ---------------------------------------------------*/

static uint64_t rng_state = 1;
static uint64_t rng(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int synth(int argc, char **argv) {
    const char *out = NULL;
    uint64_t nb = 20000;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
        else if (!strcmp(argv[i], "--batches"))
            nb = strtoull(argv[i + 1], NULL, 10);
    }
    if (!out) return 2;
    wire_cap_writer *w;
    if (wire_cap_create(&w, out) != KVO_OK) return 2;
    wire_batch b;
    wire_batch_init(&b);
    kvo_buf pay;
    kvo_buf_init(&pay);
    /* Each step: evict a few blocks of an old prompt, then store a prompt of
     * 4..64 blocks sharing a prefix with one of 64 groups. */
    uint64_t live[4096];
    size_t nlive = 0;
    for (uint64_t s = 0; s < nb; s++) {
        kvo_arena_reset(&b.arena);
        uint32_t nstore = 4 + (uint32_t)(rng() % 61);
        uint32_t nrem = nlive > 2048 ? 1 + (uint32_t)(rng() % 8) : 0;
        b.ts = (double)s;
        b.batch_len = 3;
        b.dp_rank = (wire_int){true, 0};
        b.n_events = nrem + 1;
        b.events = kvo_arena_alloc(&b.arena, b.n_events * sizeof(wire_event));
        memset(b.events, 0, b.n_events * sizeof(wire_event));
        for (uint32_t i = 0; i < nrem; i++) {
            wire_event *e = &b.events[i];
            e->type = WIRE_EV_REMOVED;
            e->n_hashes = 1;
            e->hashes = kvo_arena_alloc(&b.arena, sizeof(wire_hash));
            size_t k = (size_t)(rng() % nlive);
            e->hashes[0] = (wire_hash){WIRE_HASH_UINT, 0, live[k], NULL};
            live[k] = live[--nlive];
            e->medium = (wire_str){"GPU", 3};
        }
        wire_event *e = &b.events[nrem];
        e->type = WIRE_EV_STORED;
        e->n_hashes = nstore;
        e->hashes = kvo_arena_alloc(&b.arena, nstore * sizeof(wire_hash));
        e->n_tokens = nstore * 16;
        e->token_ids =
            kvo_arena_alloc(&b.arena, e->n_tokens * sizeof(uint64_t));
        e->block_size = (wire_int){true, 16};
        e->medium = (wire_str){"GPU", 3};
        for (uint32_t i = 0; i < nstore; i++) {
            uint64_t h = rng();
            e->hashes[i] = (wire_hash){WIRE_HASH_UINT, 0, h, NULL};
            if (nlive < 4096) live[nlive++] = h;
        }
        for (uint32_t i = 0; i < e->n_tokens; i++)
            e->token_ids[i] = rng() % 32000;
        kvo_buf_reset(&pay);
        if (wire_batch_encode(&b, WIRE_FMT_MAP, 0, &pay) != KVO_OK) return 2;
        uint8_t seq[8];
        wire_seq_put(seq, s);
        wire_frame f[3] = {
            {(const uint8_t *)"kv-events", 9}, {seq, 8}, {pay.data, pay.len}};
        if (wire_cap_write(w, kvo_unix_ns(), f, 3) != KVO_OK) return 2;
    }
    b.events = NULL;
    b.n_events = 0;
    wire_batch_fini(&b);
    kvo_buf_fini(&pay);
    wire_cap_close(w);
    return 0;
}

int main(int argc, char **argv) {
    kvo_signals_init();
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fputs("usage: kvo-bench-relay drive|passthrough|pipe|synth [options] "
              "(see the file header of tests/bench/bench_relay.c)\n",
              argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvo-bench-relay %s\n", KVO_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "drive")) return drive(argc, argv);
    if (!strcmp(argv[1], "passthrough")) return passthrough(argc, argv);
    if (!strcmp(argv[1], "pipe")) return pipe_cmd(argc, argv);
    if (!strcmp(argv[1], "synth")) return synth(argc, argv);
    fprintf(stderr, "kvo-bench-relay: unknown command %s\n", argv[1]);
    return 2;
}
