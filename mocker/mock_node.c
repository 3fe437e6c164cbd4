/* mock_node.c -- the process around the engines: one hasher shared by the
 * ranks, and per rank an engine, a renderer (hash form, mutations) and a
 * publisher (PUB + ROUTER replay, capture file). Both modes (HTTP server,
 * trace replay) step ranks through node_step_begin / node_step_end.
 *
 * Endpoints of rank r: PUB tcp://<zmq-host>:<zmq-port + r>, ROUTER
 * tcp://<zmq-host>:<replay-port + r>. Port 0 picks free ports, consecutive
 * ones when there are several ranks (rank 0 binds any free port P, rank r
 * then P + r; all again from a new P when one is taken), so that the same
 * --zmq-port P (--replay-port Q) gives a restarted engine the same
 * endpoints back. --zmq-endpoint replaces the PUB endpoint: a tcp
 * endpoint's port gets + r, any other endpoint gets "-r" appended for ranks
 * above 0.
 */
#include "mock_int.h"

#include <stdio.h>
#include <string.h>
#include <zmq.h>

static void tcp_endpoint(char *out, size_t n, const char *host, uint16_t port,
                         uint32_t r) {
    if (port == 0)
        snprintf(out, n, "tcp://%s:*", host);
    else
        snprintf(out, n, "tcp://%s:%u", host, (unsigned)(port + r));
}

/* Attempts at a block of consecutive free ports (port 0, several ranks). */
#define CONSECUTIVE_TRIES 32

/* The port after the last colon of a bound endpoint, 0 when none. */
static uint16_t bound_port(const char *ep) {
    const char *colon = strrchr(ep, ':');
    uint32_t port;
    return colon && kvo_parse_u32(colon + 1, &port) == KVO_OK &&
                   port <= UINT16_MAX
               ? (uint16_t)port
               : 0;
}

/* zmq_port: the --zmq-port, or the base port picked for port 0. */
static void pub_endpoint(const mock_cfg *c, uint16_t zmq_port, uint32_t r,
                         char *out, size_t n) {
    if (!c->zmq_endpoint) {
        tcp_endpoint(out, n, c->zmq_host, zmq_port, r);
        return;
    }
    const char *ep = c->zmq_endpoint;
    const char *colon = strrchr(ep, ':');
    uint32_t port;
    if (strncmp(ep, "tcp://", 6) == 0 && colon && colon > ep + 5 &&
        kvo_parse_u32(colon + 1, &port) == KVO_OK && port <= UINT16_MAX) {
        if (port == 0)
            snprintf(out, n, "%.*s:*", (int)(colon - ep), ep);
        else
            snprintf(out, n, "%.*s:%u", (int)(colon - ep), ep, port + r);
        return;
    }
    if (r == 0)
        snprintf(out, n, "%s", ep);
    else
        snprintf(out, n, "%s-%u", ep, r);
}

const char *node_advertise_host(const mock_node *n) {
    const mock_cfg *c = n->cfg;
    if (c->advertise_host && *c->advertise_host) return c->advertise_host;
    if (strcmp(c->zmq_host, "*") == 0 || strcmp(c->zmq_host, "0.0.0.0") == 0)
        return "127.0.0.1";
    return c->zmq_host;
}

/* Rank r's publisher on zp + r (PUB) and rp + r (replay ROUTER); port 0:
 * any. derived: those ports follow from ones picked for rank 0, and
 * KVO_EEXIST says one is taken (the caller tries another block). */
static kvo_status bind_rank(mock_node *n, uint32_t r, uint16_t zp, uint16_t rp,
                            bool derived) {
    const mock_cfg *cfg = n->cfg;
    node_rank *nr = &n->ranks[r];
    char ep[300], rep[300], err[400];
    pub_endpoint(cfg, zp, r, ep, sizeof(ep));
    tcp_endpoint(rep, sizeof(rep), cfg->zmq_host, rp, r);
    mock_pub_cfg pc = {.zmq_ctx = n->zctx,
                       .endpoint = ep,
                       .replay_endpoint = cfg->replay ? rep : NULL,
                       .topic = cfg->topic,
                       .hwm = cfg->zmq_hwm,
                       .ring = cfg->replay_buffer,
                       .ring_bytes = cfg->replay_buffer_bytes,
                       .record = n->rec,
                       .mutations = cfg->mutations};
    kvo_status st = mock_pub_new(&nr->pub, &pc, err, sizeof(err));
    if (st == KVO_OK) {
        nr->source = n->zctx != NULL;
        if (nr->source)
            kvo_info("rank %u: publishing on %s, replay on %s", r,
                     mock_pub_endpoint(nr->pub),
                     cfg->replay ? mock_pub_replay_endpoint(nr->pub) : "(off)");
        return KVO_OK;
    }
    if (st == KVO_ENET && derived) return KVO_EEXIST;
    if (st != KVO_ENET || cfg->require_events) {
        kvo_error("rank %u: event publisher: %s", r,
                  *err ? err : kvo_strerror(st));
        return st;
    }
    kvo_warn("rank %u: event publisher: %s; serving without an event "
             "source (--require-events makes this fatal)",
             r, err);
    pc.zmq_ctx = NULL;
    return mock_pub_new(&nr->pub, &pc, err, sizeof(err));
}

/* Every rank's publisher (port 0 with several ranks: consecutive ports,
 * see the top). */
static kvo_status bind_ranks(mock_node *n) {
    const mock_cfg *cfg = n->cfg;
    bool several = cfg->dp_size > 1 && n->zctx;
    bool pick_pub = several && cfg->zmq_port == 0 && !cfg->zmq_endpoint;
    bool pick_rep = several && cfg->replay && cfg->replay_port == 0;
    for (uint32_t tries = 1;; tries++) {
        uint16_t zp = cfg->zmq_port, rp = cfg->replay_port;
        kvo_status st = KVO_OK;
        for (uint32_t r = 0; r < cfg->dp_size && st == KVO_OK; r++) {
            st = bind_rank(n, r, zp, rp, r > 0 && (pick_pub || pick_rep));
            if (st != KVO_OK || r > 0 || !n->ranks[0].source) continue;
            if (pick_pub) zp = bound_port(mock_pub_endpoint(n->ranks[0].pub));
            if (pick_rep)
                rp = bound_port(mock_pub_replay_endpoint(n->ranks[0].pub));
        }
        if (st != KVO_EEXIST) return st;
        if (tries == CONSECUTIVE_TRIES) {
            kvo_error("no %u consecutive free ports found in %d tries",
                      cfg->dp_size, CONSECUTIVE_TRIES);
            return KVO_ENET;
        }
        for (uint32_t k = 0; k < cfg->dp_size; k++) { /* again, elsewhere */
            mock_pub_free(n->ranks[k].pub);
            n->ranks[k].pub = NULL;
            n->ranks[k].source = false;
        }
    }
}

kvo_status node_init(mock_node *n, const mock_cfg *cfg, bool sockets) {
    memset(n, 0, sizeof(*n));
    n->cfg = cfg;
    kvo_status st = mock_hasher_new(&n->hasher, cfg->hash_algo, cfg->hash_seed,
                                    cfg->hash_memo_log2);
    if (st != KVO_OK) {
        kvo_error("hasher: %s", kvo_strerror(st));
        goto fail;
    }
    if (cfg->record) {
        st = wire_cap_create(&n->rec, cfg->record);
        if (st != KVO_OK) {
            kvo_error("--record %s: %s", cfg->record, kvo_strerror(st));
            goto fail;
        }
    }
    bool events = cfg->prefix_caching && cfg->role != MOCK_ROLE_DECODE;
    if (sockets && events) {
        n->zctx = zmq_ctx_new();
        if (!n->zctx) {
            kvo_error("zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
            st = KVO_ENET;
            goto fail;
        }
    }
    n->ranks = kvo_calloc(cfg->dp_size, sizeof(node_rank));
    if (!n->ranks) {
        st = KVO_ENOMEM;
        goto fail;
    }
    n->n_ranks = cfg->dp_size;
    for (uint32_t r = 0; r < cfg->dp_size; r++) {
        node_rank *nr = &n->ranks[r];
        if ((st = mock_engine_new(&nr->eng, cfg, r, n->hasher)) != KVO_OK ||
            (st = mock_render_new(&nr->render, cfg)) != KVO_OK) {
            kvo_error("rank %u: %s", r, kvo_strerror(st));
            goto fail;
        }
    }
    if ((st = bind_ranks(n)) != KVO_OK) goto fail;
    return KVO_OK;
fail:
    node_fini(n);
    return st;
}

void node_fini(mock_node *n) {
    for (uint32_t r = 0; r < n->n_ranks; r++) {
        node_rank *nr = &n->ranks[r];
        mock_engine_free(nr->eng);
        mock_render_free(nr->render);
        mock_pub_free(nr->pub);
    }
    kvo_free(n->ranks);
    if (n->zctx) zmq_ctx_term(n->zctx);
    wire_cap_close(n->rec);
    mock_hasher_free(n->hasher);
    memset(n, 0, sizeof(*n));
}

kvo_status node_step_begin(mock_node *n, uint32_t r, double ts, mock_step *st) {
    static kvo_ratelimit rl_render, rl_lost;
    node_rank *nr = &n->ranks[r];
    kvo_status s = mock_engine_schedule(nr->eng, ts, st);
    if (s != KVO_OK) return s;
    if (st->events_lost) {
        mock_engine_stats es;
        mock_engine_stats_get(nr->eng, &es); /* the total, for the log line */
        kvo_log_limited(&rl_lost, KVO_LOG_ERROR,
                        "rank %u: %u KV event(s) lost to out of memory in a "
                        "step (%llu so far); the index will diverge",
                        r, st->events_lost,
                        (unsigned long long)es.events_lost_enomem);
    }
    if (!st->batch) return KVO_OK;
    const kvo_buf *pay;
    uint32_t np;
    s = mock_render_batch(nr->render, st->batch, st->aux, &pay, &np);
    if (s != KVO_OK) {
        /* The batch is lost: its sequence number goes unused, so the relay
         * sees a real gap (and no replay can fill it). */
        uint64_t lost = 0;
        nr->render_errors++;
        mock_pub_skip(nr->pub);
        mock_pub_last_seq(nr->pub, &lost);
        kvo_log_limited(&rl_render, KVO_LOG_ERROR,
                        "rank %u: encoding a batch: %s; the batch is lost, its "
                        "sequence %llu skipped",
                        r, kvo_strerror(s), (unsigned long long)lost);
        return KVO_OK;
    }
    for (uint32_t i = 0; i < np; i++)
        mock_pub_send(nr->pub, pay[i].data, pay[i].len);
    return KVO_OK;
}

void node_step_end(mock_node *n, uint32_t r) {
    mock_engine_complete(n->ranks[r].eng);
}

void node_replay_serve(mock_node *n, uint32_t r) {
    static kvo_ratelimit rl_bad, rl_cut;
    mock_pub *pub = n->ranks[r].pub;
    mock_replay_served done;
    mock_pub_replay_serve(pub, &done);
    if (!done.bad_requests && !done.cut) return;
    mock_pub_stats ps;
    mock_pub_stats_get(pub, &ps); /* the totals, for the log line */
    if (done.bad_requests)
        kvo_log_limited(&rl_bad, KVO_LOG_WARN,
                        "rank %u: malformed replay request ignored (want "
                        "[\"\", start seq u64 BE]); %llu so far",
                        r, (unsigned long long)ps.bad_requests);
    if (done.cut)
        kvo_log_limited(&rl_cut, KVO_LOG_WARN,
                        "rank %u: replay cut short (the client does not read "
                        "or is gone); %llu so far",
                        r, (unsigned long long)ps.replay_cut);
}
