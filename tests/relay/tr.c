/* tr.c -- relay test helpers (see tr.h). */
#include "tr.h"

#include "kvo_json.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

/* ---- the pipeline seam ---------------------------------------------------*/

static kvo_status cap_publish(void *ctx, const char *subject, bool has_range,
                              uint64_t first, uint64_t last,
                              const uint8_t *body, size_t len) {
    tr *t = ctx;
    if (t->n == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        tr_env *n = kvo_realloc(t->msgs, ncap * sizeof(*n));
        ck_assert_ptr_nonnull(n);
        t->msgs = n;
        t->cap = ncap;
    }
    tr_env *m = &t->msgs[t->n];
    memset(m, 0, sizeof(*m));
    snprintf(m->subject, sizeof(m->subject), "%s", subject);
    m->has_range = has_range;
    m->first = first;
    m->last = last;
    wire_plane_init(&m->m);
    kvo_buf_init(&m->raw);
    ck_assert_int_eq(kvo_buf_append(&m->raw, body, len), KVO_OK);
    kvo_err err;
    kvo_status st = wire_plane_decode(body, len, NULL, &m->m, &err);
    char buf[256];
    ck_assert_msg(st == KVO_OK, "published envelope does not decode: %s",
                  kvo_err_str(&err, buf, sizeof(buf)));
    t->n++;
    return KVO_OK;
}

static kvo_status cap_request(void *ctx, uint32_t src, uint64_t from) {
    tr *t = ctx;
    ck_assert_uint_lt(t->nreq, KVO_ARRAY_LEN(t->req));
    t->req[t->nreq] = from;
    t->req_src[t->nreq] = src;
    t->nreq++;
    return t->fail_requests ? KVO_ENET : KVO_OK;
}

static void cap_abort(void *ctx, uint32_t src) {
    tr *t = ctx;
    (void)src;
    t->aborts++;
}

static void cap_note(void *ctx, kvo_level lvl, const char *kind,
                     const char *msg) {
    tr *t = ctx;
    (void)lvl;
    (void)kind;
    (void)msg;
    t->notes++;
}

void tr_cfg_default(relay_pipe_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->worker_id = 7;
    c->block_size = 16;
    c->publisher_id = 42;
    c->subject = "namespace.dynamo.component.backend.kv-events";
    c->replay_timeout_ms = 1000;
}

void tr_init(tr *t, const relay_pipe_cfg *cfg, uint32_t nsrc, bool replay) {
    memset(t, 0, sizeof(*t));
    relay_pipe_cfg def;
    if (!cfg) {
        tr_cfg_default(&def);
        cfg = &def;
    }
    relay_out out = {.ctx = t,
                     .publish = cap_publish,
                     .replay_request = cap_request,
                     .replay_abort = cap_abort,
                     .note = cap_note};
    ck_assert_int_eq(relay_pipe_new(&t->p, cfg, &out), KVO_OK);
    kvo_buf_init(&t->batch);
    for (uint32_t i = 0; i < nsrc; i++)
        ck_assert_int_eq(relay_pipe_source_add(t->p, i, replay, NULL), KVO_OK);
    t->now = 1000000000ull;
}

void tr_fini(tr *t) {
    relay_pipe_free(t->p);
    for (size_t i = 0; i < t->n; i++) {
        wire_plane_fini(&t->msgs[i].m);
        kvo_buf_fini(&t->msgs[i].raw);
    }
    kvo_free(t->msgs);
    kvo_buf_fini(&t->batch);
    memset(t, 0, sizeof(*t));
}

void tr_live(tr *t, uint32_t src, uint64_t seq, const kvo_buf *payload) {
    uint8_t s[8];
    wire_seq_put(s, seq);
    wire_frame f[3] = {{(const uint8_t *)"kv-events", 9},
                       {s, 8},
                       {payload->data, payload->len}};
    relay_pipe_live(t->p, src, f, 3, t->now);
}

void tr_reply(tr *t, uint32_t src, uint64_t seq, const kvo_buf *payload,
              bool with_topic) {
    uint8_t s[8];
    wire_seq_put(s, seq);
    wire_frame f[4] = {{(const uint8_t *)"", 0},
                       {(const uint8_t *)"kv-events", 9},
                       {s, 8},
                       {payload->data, payload->len}};
    if (with_topic) {
        relay_pipe_replay(t->p, src, f, 4, t->now);
    } else {
        f[1] = f[2];
        f[2] = f[3];
        relay_pipe_replay(t->p, src, f, 3, t->now);
    }
}

void tr_end(tr *t, uint32_t src, bool with_topic) {
    uint8_t s[8];
    wire_seq_put(s, WIRE_REPLAY_END);
    wire_frame f[4] = {{(const uint8_t *)"", 0},
                       {(const uint8_t *)"", 0},
                       {s, 8},
                       {(const uint8_t *)"", 0}};
    if (with_topic) {
        relay_pipe_replay(t->p, src, f, 4, t->now);
    } else {
        f[1] = f[2];
        f[2] = f[3];
        relay_pipe_replay(t->p, src, f, 3, t->now);
    }
}

void tr_flush(tr *t) { relay_pipe_flush(t->p); }

size_t tr_events(tr *t, const wire_revent **out, size_t max) {
    size_t k = 0;
    for (size_t i = 0; i < t->n; i++)
        for (uint32_t j = 0; j < t->msgs[i].m.n_events; j++) {
            ck_assert_uint_lt(k, max);
            out[k++] = &t->msgs[i].m.events[j];
        }
    return k;
}

relay_stats *tr_stats(tr *t) { return relay_pipe_stats(t->p); }

bool tr_watermark(const tr *t, uint64_t *last) {
    bool any = false;
    for (size_t i = 0; i < t->n; i++)
        if (t->msgs[i].has_range) {
            *last = t->msgs[i].last;
            any = true;
        }
    return any;
}

/* ---- recovery replies --------------------------------------------------------*/

void tr_replies_init(tr_replies *r) {
    memset(r, 0, sizeof(*r));
    r->fail_at = SIZE_MAX;
}

void tr_replies_reset(tr_replies *r) {
    for (size_t i = 0; i < r->n; i++) {
        wire_plane_fini(&r->v[i].m);
        kvo_buf_fini(&r->v[i].raw);
    }
    r->n = 0;
}

void tr_replies_fini(tr_replies *r) {
    tr_replies_reset(r);
    kvo_free(r->v);
    memset(r, 0, sizeof(*r));
}

kvo_status tr_reply_keep(void *ctx, wire_reply_kind kind, bool has_range,
                         uint64_t first, uint64_t last, const uint8_t *body,
                         size_t len) {
    tr_replies *r = ctx;
    if (r->n == r->fail_at) return KVO_EAGAIN;
    ck_assert_int_eq(kvo_grow(&r->v, &r->cap, r->n + 1, sizeof(*r->v), 16),
                     KVO_OK);
    tr_rmsg *m = &r->v[r->n++];
    memset(m, 0, sizeof(*m));
    m->kind = kind;
    m->has_range = has_range;
    m->first = first;
    m->last = last;
    kvo_buf_init(&m->raw);
    ck_assert_int_eq(kvo_buf_append(&m->raw, body, len), KVO_OK);
    ck_assert_int_eq(kvo_buf_cstr(&m->raw), KVO_OK); /* JSON as a string */
    wire_plane_init(&m->m);
    kvo_err err;
    char buf[256];
    if (kind == WIRE_REPLY_EVENTS || kind == WIRE_REPLY_DUMP) {
        kvo_status st = wire_plane_decode(body, len, NULL, &m->m, &err);
        ck_assert_msg(st == KVO_OK, "reply envelope: %s",
                      kvo_err_str(&err, buf, sizeof(buf)));
    } else {
        kvo_json doc;
        kvo_json_init(&doc);
        kvo_status st =
            wire_reply_end_decode(&doc, kind, body, len, &m->end, &err);
        ck_assert_msg(st == KVO_OK, "reply end: %s",
                      kvo_err_str(&err, buf, sizeof(buf)));
        kvo_json_fini(&doc);
    }
    return KVO_OK;
}

kvo_status tr_recover(tr *t, const char *request, size_t max_payload,
                      tr_replies *r, relay_recovery *out) {
    tr_replies_reset(r);
    kvo_err err;
    return relay_pipe_recover(t->p, "_INBOX.t", (const uint8_t *)request,
                              strlen(request), max_payload, tr_reply_keep, r,
                              out, &err);
}

/* ---- indexes built from envelopes ------------------------------------------*/

void tr_tree_apply(idx_tree *t, const wire_plane_msg *m) {
    for (uint32_t i = 0; i < m->n_events; i++) {
        if (m->events[i].tier != WIRE_TIER_DEVICE) continue;
        idx_evstatus es;
        ck_assert_int_eq(idx_tree_apply(t, &m->events[i], &es), KVO_OK);
        ck_assert_msg(es == IDX_EV_OK, "event %u: %s", i,
                      idx_evstatus_name(es));
    }
}

typedef struct row {
    uint64_t worker, parent, hash, tokens;
    uint32_t rank;
    bool has_parent;
} row;

typedef struct rows {
    row *v;
    size_t n, cap;
} rows;

static kvo_status keep_row(void *ctx, const wire_revent *ev) {
    rows *r = ctx;
    ck_assert_int_eq(kvo_grow(&r->v, &r->cap, r->n + 1, sizeof(*r->v), 64),
                     KVO_OK);
    r->v[r->n++] = (row){ev->worker_id,
                         ev->parent_hash,
                         ev->blocks[0].block_hash,
                         ev->blocks[0].tokens_hash,
                         ev->dp_rank,
                         ev->has_parent};
    return KVO_OK;
}

static int row_cmp(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    if (x->has_parent != y->has_parent) return x->has_parent ? 1 : -1;
    if (x->parent != y->parent) return x->parent < y->parent ? -1 : 1;
    return 0;
}

size_t tr_same_trees(idx_tree *a, idx_tree *b) {
    rows ra = {0}, rb = {0};
    ck_assert_int_eq(idx_tree_dump(a, keep_row, &ra), KVO_OK);
    ck_assert_int_eq(idx_tree_dump(b, keep_row, &rb), KVO_OK);
    ck_assert_uint_eq(ra.n, rb.n);
    if (ra.n) qsort(ra.v, ra.n, sizeof(row), row_cmp);
    if (rb.n) qsort(rb.v, rb.n, sizeof(row), row_cmp);
    for (size_t i = 0; i < ra.n; i++)
        ck_assert_msg(row_cmp(&ra.v[i], &rb.v[i]) == 0 &&
                          ra.v[i].tokens == rb.v[i].tokens &&
                          ra.v[i].worker == rb.v[i].worker,
                      "edge %zu differs: rank %u block %" PRIu64
                      " vs rank %u block %" PRIu64,
                      i, ra.v[i].rank, ra.v[i].hash, rb.v[i].rank,
                      rb.v[i].hash);
    idx_worker *wa, *wb;
    size_t na, nb;
    ck_assert_int_eq(idx_tree_workers(a, &wa, &na), KVO_OK);
    ck_assert_int_eq(idx_tree_workers(b, &wb, &nb), KVO_OK);
    ck_assert_uint_eq(na, nb);
    for (size_t i = 0; i < na; i++) {
        ck_assert_uint_eq(wa[i].dp_rank, wb[i].dp_rank);
        ck_assert_uint_eq(wa[i].blocks, wb[i].blocks);
    }
    kvo_free(wa);
    kvo_free(wb);
    size_t n = ra.n;
    kvo_free(ra.v);
    kvo_free(rb.v);
    return n;
}

void tr_live_tag(tr *t, uint32_t src, uint64_t seq, uint64_t tag) {
    tb_tagged(&t->batch, tag, 0);
    tr_live(t, src, seq, &t->batch);
}

void tr_reply_tag(tr *t, uint32_t src, uint64_t seq, uint64_t tag,
                  bool with_topic) {
    tb_tagged(&t->batch, tag, 0);
    tr_reply(t, src, seq, &t->batch, with_topic);
}

void tr_live_seqs(tr *t, uint32_t src, uint64_t first, uint64_t last) {
    for (uint64_t seq = first; seq <= last; seq++)
        tr_live_tag(t, src, seq, seq);
}

void tr_reply_seqs(tr *t, uint32_t src, uint64_t first, uint64_t last,
                   bool with_topic) {
    for (uint64_t seq = first; seq <= last; seq++)
        tr_reply_tag(t, src, seq, seq, with_topic);
}

void tr_live_tb(tr *t, uint32_t src, uint64_t seq, tb *b, int rank) {
    tb_end(b, rank, &t->batch);
    tr_live(t, src, seq, &t->batch);
}

/* Every RouterEvent published so far, for the counting helpers below. */
#define TR_MAX_EVENTS 20000
static const wire_revent *all_events[TR_MAX_EVENTS];

size_t tr_stored(tr *t, uint64_t *out, size_t max) {
    size_t n = tr_events(t, all_events, TR_MAX_EVENTS), k = 0;
    for (size_t i = 0; i < n; i++)
        if (all_events[i]->type == WIRE_R_STORED)
            for (uint32_t j = 0; j < all_events[i]->n_blocks; j++) {
                ck_assert_uint_lt(k, max);
                out[k++] = all_events[i]->blocks[j].block_hash;
            }
    return k;
}

size_t tr_count(tr *t, wire_rtype type) {
    size_t n = tr_events(t, all_events, TR_MAX_EVENTS), k = 0;
    for (size_t i = 0; i < n; i++) k += all_events[i]->type == type;
    return k;
}

void tr_expect_tags_(tr *t, const uint64_t *tags, size_t n) {
    uint64_t got[256];
    ck_assert_uint_le(n, KVO_ARRAY_LEN(got));
    size_t k = tr_stored(t, got, KVO_ARRAY_LEN(got));
    ck_assert_msg(k == n, "%zu blocks stored, expected %zu", k, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == TB_TAG_BLOCK + tags[i],
                      "stored block %zu is %" PRIu64 ", expected tag %" PRIu64,
                      i, got[i], tags[i]);
}

/* ---- batch payloads --------------------------------------------------------*/

void tb_tagged(kvo_buf *out, uint64_t tag, int rank) {
    tb b;
    tb_begin(&b);
    uint64_t h = TB_TAG_BLOCK + tag;
    tb_store(&b, false, 0, &h, 1);
    tb_end(&b, rank, out);
}

uint64_t tb_token(uint64_t h, uint32_t j) {
    return ((h ^ (h >> 29)) * 2654435761u + j * 7919u) % 150000u;
}

uint64_t tb_tokens_hash(uint64_t h, uint32_t bs) {
    uint64_t tok[64];
    ck_assert_uint_le(bs, 64);
    for (uint32_t j = 0; j < bs; j++) tok[j] = tb_token(h, j);
    return wire_router_hash(tok, bs, WIRE_ROUTER_SEED);
}

void tb_begin(tb *b) {
    kvo_buf_init(&b->j);
    b->n = 0;
    ck_assert(kvo_buf_printf(&b->j, "{\"ts\": 1.5, \"events\": [") == KVO_OK);
}

static void sep(tb *b) {
    if (b->n++) ck_assert(kvo_buf_printf(&b->j, ",") == KVO_OK);
}

void tb_raw(tb *b, const char *json_event) {
    sep(b);
    ck_assert(kvo_buf_printf(&b->j, "%s", json_event) == KVO_OK);
}

void tb_store(tb *b, bool has_parent, uint64_t parent, const uint64_t *h,
              uint32_t n) {
    tb_store_in(b, "GPU", has_parent, parent, h, n, NULL);
}

void tb_store_in(tb *b, const char *medium, bool has_parent, uint64_t parent,
                 const uint64_t *h, uint32_t n, const char *extra_keys) {
    sep(b);
    kvo_buf *j = &b->j;
    ck_assert(
        kvo_buf_printf(j, "{\"type\": \"BlockStored\", \"block_hashes\": [") ==
        KVO_OK);
    for (uint32_t i = 0; i < n; i++)
        ck_assert(kvo_buf_printf(j, "%s%" PRIu64, i ? "," : "", h[i]) ==
                  KVO_OK);
    if (has_parent)
        ck_assert(kvo_buf_printf(j, "], \"parent_block_hash\": %" PRIu64,
                                 parent) == KVO_OK);
    else
        ck_assert(kvo_buf_printf(j, "], \"parent_block_hash\": null") ==
                  KVO_OK);
    ck_assert(kvo_buf_printf(j, ", \"token_ids\": [") == KVO_OK);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < 16; k++)
            ck_assert(kvo_buf_printf(j, "%s%" PRIu64, i || k ? "," : "",
                                     tb_token(h[i], k)) == KVO_OK);
    ck_assert(kvo_buf_printf(j,
                             "], \"block_size\": 16, \"lora_id\": null, "
                             "\"medium\": \"%s\"",
                             medium) == KVO_OK);
    if (extra_keys)
        ck_assert(kvo_buf_printf(j, ", \"extra_keys\": %s", extra_keys) ==
                  KVO_OK);
    ck_assert(kvo_buf_printf(j, "}") == KVO_OK);
}

void tb_remove(tb *b, const uint64_t *h, uint32_t n) {
    tb_remove_in(b, "GPU", h, n);
}

void tb_remove_in(tb *b, const char *medium, const uint64_t *h, uint32_t n) {
    sep(b);
    kvo_buf *j = &b->j;
    ck_assert(
        kvo_buf_printf(j, "{\"type\": \"BlockRemoved\", \"block_hashes\": [") ==
        KVO_OK);
    for (uint32_t i = 0; i < n; i++)
        ck_assert(kvo_buf_printf(j, "%s%" PRIu64, i ? "," : "", h[i]) ==
                  KVO_OK);
    ck_assert(kvo_buf_printf(j, "], \"medium\": \"%s\"}", medium) == KVO_OK);
}

void tb_cleared(tb *b) { tb_raw(b, "{\"type\": \"AllBlocksCleared\"}"); }

void tb_end(tb *b, int rank, kvo_buf *out) {
    if (rank < 0)
        ck_assert(kvo_buf_printf(&b->j, "], \"data_parallel_rank\": null}") ==
                  KVO_OK);
    else
        ck_assert(kvo_buf_printf(&b->j, "], \"data_parallel_rank\": %d}",
                                 rank) == KVO_OK);
    ck_assert(kvo_buf_cstr(&b->j) == KVO_OK);
    json_object *jo = json_tokener_parse((const char *)b->j.data);
    ck_assert_msg(jo != NULL, "bad test JSON: %s", (const char *)b->j.data);
    wire_batch batch;
    wire_batch_init(&batch);
    kvo_err err;
    char ebuf[256];
    kvo_status st = wire_batch_from_json(jo, &batch, &err);
    ck_assert_msg(st == KVO_OK, "from_json: %s",
                  kvo_err_str(&err, ebuf, sizeof(ebuf)));
    kvo_buf_reset(out);
    ck_assert_int_eq(wire_batch_encode(&batch, WIRE_FMT_MAP, 0, out), KVO_OK);
    wire_batch_fini(&batch);
    json_object_put(jo);
    kvo_buf_fini(&b->j);
}

/* ---- a real ZMQ publisher ----------------------------------------------------*/

typedef struct ring_item {
    uint64_t seq;
    uint8_t *data;
    size_t len;
} ring_item;

struct tpub {
    void *zctx;
    void *pub;    /* XPUB: test thread only */
    void *router; /* replay thread only */
    bool with_topic;
    char ep[64], rep[64];
    pthread_t thr;
    pthread_mutex_t mu;
    ring_item *ring;
    size_t n, cap;
    uint64_t next_seq;
    uint64_t requests;
    volatile int stop;
};

static void send_frames(void *sock, const void *const *data, const size_t *len,
                        int n) {
    for (int i = 0; i < n; i++)
        zmq_send(sock, data[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0);
}

static void *replay_thread(void *arg) {
    tpub *p = arg;
    while (!p->stop) {
        zmq_pollitem_t it = {p->router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        uint8_t id[256], f[3][64];
        int idn = zmq_recv(p->router, id, sizeof(id), 0);
        int nf = 0;
        int more = 1;
        size_t ml = sizeof(more);
        int lens[3] = {0};
        zmq_getsockopt(p->router, ZMQ_RCVMORE, &more, &ml);
        while (more) {
            int l = zmq_recv(p->router, nf < 3 ? f[nf] : f[2], 64, 0);
            if (nf < 3) lens[nf] = l;
            nf++;
            zmq_getsockopt(p->router, ZMQ_RCVMORE, &more, &ml);
        }
        uint64_t start;
        if (idn <= 0 || nf != 2 || lens[0] != 0 ||
            wire_seq_get(f[1], (size_t)lens[1], &start) != KVO_OK)
            continue;
        pthread_mutex_lock(&p->mu);
        p->requests++;
        for (size_t i = 0; i < p->n; i++) {
            ring_item *r = &p->ring[i];
            if (r->seq < start) continue;
            uint8_t s[8];
            wire_seq_put(s, r->seq);
            const void *d[5] = {id, "", "kv-events", s, r->data};
            size_t l[5] = {(size_t)idn, 0, 9, 8, r->len};
            if (p->with_topic) {
                send_frames(p->router, d, l, 5);
            } else {
                const void *d2[4] = {id, "", s, r->data};
                size_t l2[4] = {(size_t)idn, 0, 8, r->len};
                send_frames(p->router, d2, l2, 4);
            }
        }
        pthread_mutex_unlock(&p->mu);
        uint8_t e[8];
        wire_seq_put(e, WIRE_REPLAY_END);
        if (p->with_topic) {
            const void *d[5] = {id, "", "", e, ""};
            size_t l[5] = {(size_t)idn, 0, 0, 8, 0};
            send_frames(p->router, d, l, 5);
        } else {
            const void *d[4] = {id, "", e, ""};
            size_t l[4] = {(size_t)idn, 0, 8, 0};
            send_frames(p->router, d, l, 4);
        }
    }
    return NULL;
}

static void bind_free(void *sock, char *ep, size_t n) {
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_bind(sock, "tcp://127.0.0.1:*"), 0);
    size_t l = n;
    ck_assert_int_eq(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &l), 0);
}

tpub *tpub_new(bool with_topic) {
    tpub *p = kvo_calloc(1, sizeof(*p));
    ck_assert_ptr_nonnull(p);
    p->with_topic = with_topic;
    p->zctx = zmq_ctx_new();
    p->pub = zmq_socket(p->zctx, ZMQ_XPUB);
    p->router = zmq_socket(p->zctx, ZMQ_ROUTER);
    int hwm = 0; /* unlimited: tests never want silent PUB drops */
    zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    bind_free(p->pub, p->ep, sizeof(p->ep));
    bind_free(p->router, p->rep, sizeof(p->rep));
    pthread_mutex_init(&p->mu, NULL);
    ck_assert_int_eq(pthread_create(&p->thr, NULL, replay_thread, p), 0);
    return p;
}

void tpub_free(tpub *p) {
    if (!p) return;
    p->stop = 1;
    pthread_join(p->thr, NULL);
    zmq_close(p->pub);
    zmq_close(p->router);
    zmq_ctx_term(p->zctx);
    for (size_t i = 0; i < p->n; i++) kvo_free(p->ring[i].data);
    kvo_free(p->ring);
    pthread_mutex_destroy(&p->mu);
    kvo_free(p);
}

const char *tpub_endpoint(const tpub *p) { return p->ep; }
const char *tpub_replay_endpoint(const tpub *p) { return p->rep; }

bool tpub_wait_subscriber(tpub *p, long timeout_ms) {
    uint64_t end = kvo_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (kvo_now_ns() < end) {
        zmq_pollitem_t it = {p->pub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        uint8_t b[256];
        int n = zmq_recv(p->pub, b, sizeof(b), 0);
        if (n >= 1 && b[0] == 1) return true;
    }
    return false;
}

uint64_t tpub_send(tpub *p, const kvo_buf *payload, bool drop) {
    pthread_mutex_lock(&p->mu);
    uint64_t seq = p->next_seq++;
    if (p->n == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 64;
        p->ring = kvo_realloc(p->ring, ncap * sizeof(*p->ring));
        ck_assert_ptr_nonnull(p->ring);
        p->cap = ncap;
    }
    ring_item *r = &p->ring[p->n++];
    r->seq = seq;
    r->len = payload->len;
    r->data = kvo_malloc(payload->len ? payload->len : 1);
    memcpy(r->data, payload->data, payload->len);
    pthread_mutex_unlock(&p->mu);
    if (!drop) {
        uint8_t s[8];
        wire_seq_put(s, seq);
        const void *d[3] = {"kv-events", s, payload->data};
        size_t l[3] = {9, 8, payload->len};
        send_frames(p->pub, d, l, 3);
    }
    return seq;
}

void tpub_restart(tpub *p) {
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++) kvo_free(p->ring[i].data);
    p->n = 0;
    p->next_seq = 0;
    pthread_mutex_unlock(&p->mu);
}

void tpub_trim(tpub *p, uint64_t keep_from) {
    pthread_mutex_lock(&p->mu);
    size_t k = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (p->ring[i].seq < keep_from)
            kvo_free(p->ring[i].data);
        else
            p->ring[k++] = p->ring[i];
    }
    p->n = k;
    pthread_mutex_unlock(&p->mu);
}

uint64_t tpub_requests(tpub *p) {
    pthread_mutex_lock(&p->mu);
    uint64_t r = p->requests;
    pthread_mutex_unlock(&p->mu);
    return r;
}

/* ---- a ZMQ forwarder that loses chosen sequences -----------------------------*/

struct tfwd {
    void *zctx, *sub, *pub;
    char ep[64];
    uint64_t drop[16];
    size_t ndrop;
    atomic_uint_fast64_t dropped;
    atomic_bool stop;
    pthread_t thr;
};

static void *fwd_thread(void *arg) {
    tfwd *f = arg;
    zmq_msg_t part[3];
    for (int i = 0; i < 3; i++) zmq_msg_init(&part[i]);
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t it[2] = {{f->sub, 0, ZMQ_POLLIN, 0},
                                {f->pub, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, 50) <= 0) continue;
        if (it[1].revents) { /* subscriptions from the relay: not needed */
            char b[256];
            zmq_recv(f->pub, b, sizeof(b), ZMQ_DONTWAIT);
        }
        if (!it[0].revents) continue;
        int k = 0;
        bool more = true;
        while (more) {
            zmq_msg_t *m = &part[k < 3 ? k : 2];
            if (zmq_msg_recv(m, f->sub, 0) < 0) break;
            more = zmq_msg_more(m);
            k++;
        }
        uint64_t seq;
        if (k != 3 || wire_seq_get(zmq_msg_data(&part[1]),
                                   zmq_msg_size(&part[1]), &seq) != KVO_OK)
            continue;
        bool drop = false;
        for (size_t i = 0; i < f->ndrop; i++) drop |= f->drop[i] == seq;
        if (drop) {
            atomic_fetch_add(&f->dropped, 1);
            continue;
        }
        for (int i = 0; i < 3; i++)
            zmq_send(f->pub, zmq_msg_data(&part[i]), zmq_msg_size(&part[i]),
                     i < 2 ? ZMQ_SNDMORE : 0);
    }
    for (int i = 0; i < 3; i++) zmq_msg_close(&part[i]);
    return NULL;
}

tfwd *tfwd_new(const char *upstream, const uint64_t *drop, size_t ndrop) {
    tfwd *f = kvo_calloc(1, sizeof(*f));
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_le(ndrop, 16);
    memcpy(f->drop, drop, ndrop * sizeof(*drop));
    f->ndrop = ndrop;
    f->zctx = zmq_ctx_new();
    f->sub = zmq_socket(f->zctx, ZMQ_SUB);
    f->pub = zmq_socket(f->zctx, ZMQ_XPUB);
    int linger = 0, hwm = 0;
    zmq_setsockopt(f->sub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(f->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(f->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(f->sub, ZMQ_SUBSCRIBE, "", 0);
    ck_assert_int_eq(zmq_connect(f->sub, upstream), 0);
    bind_free(f->pub, f->ep, sizeof(f->ep));
    ck_assert_int_eq(pthread_create(&f->thr, NULL, fwd_thread, f), 0);
    return f;
}

void tfwd_free(tfwd *f) {
    if (!f) return;
    atomic_store(&f->stop, true);
    pthread_join(f->thr, NULL);
    zmq_close(f->sub);
    zmq_close(f->pub);
    zmq_ctx_term(f->zctx);
    kvo_free(f);
}

const char *tfwd_endpoint(const tfwd *f) { return f->ep; }
uint64_t tfwd_dropped(tfwd *f) { return atomic_load(&f->dropped); }

/* ---- a gated TCP proxy -----------------------------------------------------------*/

#define PROXY_PAIRS 16

struct tproxy {
    int lfd;
    uint16_t port, target;
    atomic_bool open;
    atomic_bool stop;
    int fd[PROXY_PAIRS][2]; /* client, upstream; -1 = free */
    pthread_t thr;
};

static void pair_close(tproxy *p, int i) {
    for (int k = 0; k < 2; k++)
        if (p->fd[i][k] >= 0) close(p->fd[i][k]);
    p->fd[i][0] = p->fd[i][1] = -1;
}

static int connect_local(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
        return fd;
    if (fd >= 0) close(fd);
    return -1;
}

static void *proxy_thread(void *arg) {
    tproxy *p = arg;
    while (!atomic_load(&p->stop)) {
        struct pollfd pf[1 + 2 * PROXY_PAIRS];
        int map[1 + 2 * PROXY_PAIRS][2];
        int n = 0;
        pf[n++] = (struct pollfd){p->lfd, POLLIN, 0};
        for (int i = 0; i < PROXY_PAIRS; i++)
            for (int k = 0; k < 2 && p->fd[i][0] >= 0; k++) {
                map[n][0] = i;
                map[n][1] = k;
                pf[n++] = (struct pollfd){p->fd[i][k], POLLIN, 0};
            }
        if (poll(pf, (nfds_t)n, 50) <= 0) continue;
        if (pf[0].revents & POLLIN) {
            int c = accept(p->lfd, NULL, NULL);
            int u =
                c >= 0 && atomic_load(&p->open) ? connect_local(p->target) : -1;
            int slot = -1;
            for (int i = 0; i < PROXY_PAIRS && slot < 0; i++)
                if (p->fd[i][0] < 0) slot = i;
            if (c >= 0 && u >= 0 && slot >= 0) {
                p->fd[slot][0] = c;
                p->fd[slot][1] = u;
            } else {
                if (c >= 0) close(c);
                if (u >= 0) close(u);
            }
        }
        for (int j = 1; j < n; j++) {
            if (!pf[j].revents) continue;
            int i = map[j][0], k = map[j][1];
            if (p->fd[i][0] < 0) continue;
            char buf[65536];
            ssize_t r = read(p->fd[i][k], buf, sizeof(buf));
            bool ok = r > 0;
            for (ssize_t off = 0; ok && off < r;) {
                ssize_t w =
                    write(p->fd[i][1 - k], buf + off, (size_t)(r - off));
                if (w <= 0 && errno != EINTR) ok = false;
                if (w > 0) off += w;
            }
            if (!ok) pair_close(p, i);
        }
    }
    for (int i = 0; i < PROXY_PAIRS; i++) pair_close(p, i);
    return NULL;
}

tproxy *tproxy_new(uint16_t target_port) {
    tproxy *p = kvo_calloc(1, sizeof(*p));
    ck_assert_ptr_nonnull(p);
    for (int i = 0; i < PROXY_PAIRS; i++) p->fd[i][0] = p->fd[i][1] = -1;
    p->target = target_port;
    atomic_store(&p->open, true);
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(p->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(p->lfd, 16), 0);
    socklen_t al = sizeof(a);
    getsockname(p->lfd, (struct sockaddr *)&a, &al);
    p->port = ntohs(a.sin_port);
    ck_assert_int_eq(pthread_create(&p->thr, NULL, proxy_thread, p), 0);
    return p;
}

void tproxy_free(tproxy *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    pthread_join(p->thr, NULL);
    close(p->lfd);
    kvo_free(p);
}

uint16_t tproxy_port(const tproxy *p) { return p->port; }
void tproxy_gate(tproxy *p, bool open) { atomic_store(&p->open, open); }

/* ---- a NATS subscriber ---------------------------------------------------------*/

void tsub_start(tsub *s, const char *url, const char *subject) {
    memset(s, 0, sizeof(*s));
    natsOptions *o = NULL;
    ck_assert(natsOptions_Create(&o) == NATS_OK);
    natsOptions_SetURL(o, url);
    natsOptions_SetMaxReconnect(o, -1);
    natsOptions_SetReconnectWait(o, 50);
    natsStatus st = natsConnection_Connect(&s->nc, o);
    natsOptions_Destroy(o);
    ck_assert_msg(st == NATS_OK, "NATS connect %s: %s", url,
                  natsStatus_GetText(st));
    st = natsConnection_SubscribeSync(&s->sub, s->nc, subject);
    ck_assert(st == NATS_OK);
    natsSubscription_SetPendingLimits(s->sub, -1, -1);
    ck_assert(natsConnection_Flush(s->nc) == NATS_OK);
}

void tsub_wait_connected(tsub *s, long timeout_ms) {
    uint64_t end = kvo_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (natsConnection_Status(s->nc) != NATS_CONN_STATUS_CONNECTED) {
        ck_assert_msg(kvo_now_ns() < end, "subscriber did not reconnect");
        nats_Sleep(10);
    }
    ck_assert(natsConnection_FlushTimeout(s->nc, timeout_ms) == NATS_OK);
}

void tsub_stop(tsub *s) {
    natsSubscription_Destroy(s->sub);
    natsConnection_Destroy(s->nc);
    memset(s, 0, sizeof(*s));
}

bool tsub_next(tsub *s, long timeout_ms, wire_plane_msg *m, bool *has_range,
               uint64_t *first, uint64_t *last) {
    natsMsg *msg = NULL;
    if (natsSubscription_NextMsg(&msg, s->sub, timeout_ms) != NATS_OK)
        return false;
    kvo_err err;
    char buf[256];
    kvo_status st =
        wire_plane_decode((const uint8_t *)natsMsg_GetData(msg),
                          (size_t)natsMsg_GetDataLength(msg), NULL, m, &err);
    ck_assert_msg(st == KVO_OK, "envelope: %s",
                  kvo_err_str(&err, buf, sizeof(buf)));
    const char *v = NULL;
    *has_range = natsMsgHeader_Get(msg, "KVO-Zmq-Seq", &v) == NATS_OK && v;
    if (*has_range)
        ck_assert_int_eq(sscanf(v, "%" SCNu64 "-%" SCNu64, first, last), 2);
    natsMsg_Destroy(msg);
    return true;
}

/* ---- a recovery requester --------------------------------------------------------*/

bool treq_recover(natsConnection *nc, const char *subject, const char *body,
                  long timeout_ms, tr_replies *out) {
    tr_replies_reset(out);
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    ck_assert(natsInbox_Create(&inbox) == NATS_OK);
    ck_assert(natsConnection_SubscribeSync(&sub, nc, inbox) == NATS_OK);
    natsSubscription_SetPendingLimits(sub, -1, -1);
    ck_assert(natsConnection_PublishRequestString(nc, subject, inbox, body) ==
              NATS_OK);
    ck_assert(natsConnection_Flush(nc) == NATS_OK);
    bool ended = false;
    uint64_t end = kvo_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (!ended && kvo_now_ns() < end) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, sub, 50) != NATS_OK) continue;
        const char *kind = NULL, *range = NULL;
        ck_assert_msg(natsMsgHeader_Get(m, WIRE_HDR_RECOVERY, &kind) == NATS_OK,
                      "a reply without %s", WIRE_HDR_RECOVERY);
        wire_reply_kind k;
        ck_assert_msg(wire_reply_kind_parse(kind, &k) == KVO_OK, "%s: %s",
                      WIRE_HDR_RECOVERY, kind);
        uint64_t first = 0, last = 0;
        bool hr = natsMsgHeader_Get(m, WIRE_HDR_ZMQ_SEQ, &range) == NATS_OK;
        if (hr)
            ck_assert_int_eq(
                sscanf(range, "%" SCNu64 "-%" SCNu64, &first, &last), 2);
        tr_reply_keep(out, k, hr, first, last,
                      (const uint8_t *)natsMsg_GetData(m),
                      (size_t)natsMsg_GetDataLength(m));
        ended = k == WIRE_REPLY_END || k == WIRE_REPLY_TOO_NEW;
        natsMsg_Destroy(m);
    }
    natsSubscription_Destroy(sub);
    natsInbox_Destroy(inbox);
    return ended;
}

/* ---- a kvo-relay process ---------------------------------------------------------*/

void trelay_start(trelay *r, const char *const *args) {
    memset(r, 0, sizeof(*r));
    uint16_t port;
    ck_assert(kvo_free_port(&port) == KVO_OK);
    char listen[32];
    snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
    snprintf(r->base, sizeof(r->base), "http://%s", listen);
    const char *all[64];
    size_t n = 0;
    for (; args[n]; n++) {
        ck_assert_uint_lt(n, 58);
        all[n] = args[n];
    }
    all[n++] = "--metrics-listen";
    all[n++] = listen;
    all[n++] = "--stats-interval-ms";
    all[n++] = "1000";
    all[n] = NULL;
    kt_proc_start(&r->p, "kvo-relay", all);
    char url[128];
    snprintf(url, sizeof(url), "%s/health", r->base);
    kt_proc_wait_http(&r->p, url, 15000);
    ck_assert(kvo_http_client_new(&r->http, 5000) == KVO_OK);
}

int trelay_stop(trelay *r) {
    int st = kt_proc_stop(&r->p);
    kvo_http_client_free(r->http);
    r->http = NULL;
    return st;
}

void trelay_get(trelay *r, const char *path, kvo_http_resp *resp) {
    char url[128];
    snprintf(url, sizeof(url), "%s%s", r->base, path);
    kvo_http_resp_init(resp);
    ck_assert(kvo_http_get(r->http, url, resp) == KVO_OK);
    ck_assert_msg(resp->status == 200, "GET %s: %ld", path, resp->status);
}

json_object *trelay_stats(trelay *r) {
    kvo_http_resp resp;
    trelay_get(r, "/stats", &resp);
    json_object *j = json_tokener_parse((const char *)resp.body.data);
    ck_assert_ptr_nonnull(j);
    kvo_http_resp_fini(&resp);
    return j;
}

uint64_t tr_json_u64(json_object *j, const char *name) {
    json_object *v;
    ck_assert_msg(json_object_object_get_ex(j, name, &v), "no stat %s", name);
    return json_object_get_uint64(v);
}

uint64_t trelay_stat(trelay *r, const char *name) {
    json_object *j = trelay_stats(r);
    uint64_t x = tr_json_u64(j, name);
    json_object_put(j);
    return x;
}

void trelay_wait_stat(trelay *r, const char *name, uint64_t atleast) {
    uint64_t end = kvo_now_ns() + 20000 * 1000000ull;
    while (trelay_stat(r, name) < atleast) {
        if (kvo_now_ns() > end) {
            kvo_proc_dump_log(&r->p.proc, 60);
            ck_abort_msg("stat %s never reached %" PRIu64, name, atleast);
        }
        usleep(20000);
    }
}

void trelay_wait_nats_down(trelay *r) {
    uint64_t end = kvo_now_ns() + 20000 * 1000000ull;
    for (;;) {
        json_object *j = trelay_stats(r), *v;
        ck_assert(json_object_object_get_ex(j, "nats_connected", &v));
        bool up = json_object_get_boolean(v);
        json_object_put(j);
        if (!up) return;
        ck_assert_msg(kvo_now_ns() < end, "relay never noticed NATS down");
        usleep(20000);
    }
}

/* ---- NATS between a relay and a subscriber -------------------------------------*/

void tnet_start(tnet *n, const char *subject) {
    memset(n, 0, sizeof(*n));
    kt_nats_start(&n->nats);
    n->proxy = tproxy_new(n->nats.port);
    snprintf(n->relay_url, sizeof(n->relay_url), "nats://127.0.0.1:%u",
             tproxy_port(n->proxy));
    tsub_start(&n->sub, n->nats.url, subject);
}

void tnet_stop(tnet *n) {
    tsub_stop(&n->sub);
    tproxy_free(n->proxy);
    kt_nats_stop(&n->nats);
}

void tnet_down(tnet *n, trelay *r) {
    tproxy_gate(n->proxy, false);
    kt_guard_release(&n->nats.guard);
    kvo_proc_stop(&n->nats.proc, 5000);
    trelay_wait_nats_down(r);
}

void tnet_up(tnet *n, long timeout_ms) {
    kt_nats_restart(&n->nats);
    tsub_wait_connected(&n->sub, timeout_ms);
    tproxy_gate(n->proxy, true);
}

void tr_wait_log(const kvo_proc *p, const char *needle, long timeout_ms) {
    uint64_t end = kvo_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        size_t len;
        uint8_t *log = kt_read_file(p->log_path, &len);
        bool found = memmem(log, len, needle, strlen(needle)) != NULL;
        kvo_free(log);
        if (found) return;
        if (kvo_now_ns() > end) {
            kvo_proc_dump_log(p, 60);
            ck_abort_msg("the log never said '%s'", needle);
        }
        usleep(20000);
    }
}

/* ---- the index a subscriber would build ---------------------------------------*/

void tmodel_init(tmodel *m) { memset(m, 0, sizeof(*m)); }

void tmodel_fini(tmodel *m) {
    for (int i = 0; i < TMODEL_RANKS; i++) {
        kvo_free(m->r[i].bh);
        kvo_free(m->r[i].th);
    }
    memset(m, 0, sizeof(*m));
}

static size_t mslot(uint64_t k, size_t cap) {
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static void mput(tmodel *m, uint32_t rank, uint64_t bh, uint64_t th) {
    ck_assert_uint_lt(rank, TMODEL_RANKS);
    ck_assert_uint_ne(bh, 0);
    tmodel_rank *t = &m->r[rank];
    if ((t->n + 1) * 2 > t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 1024;
        uint64_t *nb = kvo_calloc(ncap, 8), *nt = kvo_calloc(ncap, 8);
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->bh[i]) continue;
            size_t j = mslot(t->bh[i], ncap);
            while (nb[j]) j = (j + 1) & (ncap - 1);
            nb[j] = t->bh[i];
            nt[j] = t->th[i];
        }
        kvo_free(t->bh);
        kvo_free(t->th);
        t->bh = nb;
        t->th = nt;
        t->cap = ncap;
    }
    size_t j = mslot(bh, t->cap);
    while (t->bh[j] && t->bh[j] != bh) j = (j + 1) & (t->cap - 1);
    if (!t->bh[j]) t->n++;
    t->bh[j] = bh;
    t->th[j] = th;
}

/* Delete by rebuilding the probe run after the hole (tests are small). */
static void mdel(tmodel *m, uint32_t rank, uint64_t bh) {
    tmodel_rank *t = &m->r[rank];
    if (!t->cap) return;
    size_t j = mslot(bh, t->cap);
    while (t->bh[j] && t->bh[j] != bh) j = (j + 1) & (t->cap - 1);
    if (!t->bh[j]) return;
    t->bh[j] = 0;
    t->n--;
    for (size_t k = (j + 1) & (t->cap - 1); t->bh[k];
         k = (k + 1) & (t->cap - 1)) {
        uint64_t b = t->bh[k], h = t->th[k];
        t->bh[k] = 0;
        t->n--;
        mput(m, rank, b, h);
    }
}

void tmodel_apply(tmodel *m, const wire_plane_msg *msg) {
    for (uint32_t i = 0; i < msg->n_events; i++) {
        const wire_revent *e = &msg->events[i];
        ck_assert_uint_lt(e->dp_rank, TMODEL_RANKS);
        if (e->tier != WIRE_TIER_DEVICE) continue;
        if (e->type == WIRE_R_CLEARED) {
            tmodel_rank *t = &m->r[e->dp_rank];
            if (t->cap) {
                memset(t->bh, 0, t->cap * 8);
                memset(t->th, 0, t->cap * 8);
            }
            t->n = 0;
            m->cleared++;
        }
        for (uint32_t k = 0; e->type == WIRE_R_STORED && k < e->n_blocks; k++)
            mput(m, e->dp_rank, e->blocks[k].block_hash,
                 e->blocks[k].tokens_hash);
        for (uint32_t k = 0; e->type == WIRE_R_REMOVED && k < e->n_removed; k++)
            mdel(m, e->dp_rank, e->removed[k]);
    }
}

uint32_t tmodel_hits(const tmodel *m, uint32_t rank, const uint64_t *tokens,
                     size_t n, uint32_t bs) {
    const tmodel_rank *t = &m->r[rank];
    uint32_t hits = 0;
    for (size_t b = 0; (b + 1) * bs <= n; b++) {
        uint64_t th = wire_router_hash(tokens + b * bs, bs, WIRE_ROUTER_SEED);
        bool found = false;
        for (size_t i = 0; i < t->cap && !found; i++)
            found = t->bh[i] && t->th[i] == th;
        if (!found) break;
        hits++;
    }
    return hits;
}

void tmodel_collect(tmodel *m, tsub *s, uint64_t wm, long timeout_ms) {
    wire_plane_msg msg;
    wire_plane_init(&msg);
    while (!(m->has_wm && m->wm >= wm)) {
        bool hr;
        uint64_t first, last;
        ck_assert_msg(tsub_next(s, timeout_ms, &msg, &hr, &first, &last),
                      "no envelope within %ld ms (watermark %" PRIu64
                      ", want %" PRIu64 ")",
                      timeout_ms, m->has_wm ? m->wm : 0, wm);
        ck_assert_uint_eq(msg.sequence, m->next_sequence);
        m->next_sequence++;
        tmodel_apply(m, &msg);
        if (hr) {
            m->has_wm = true;
            m->wm = last;
        }
    }
    wire_plane_fini(&msg);
}
