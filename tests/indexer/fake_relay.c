/* fake_relay.c -- the relay's side of docs/recovery.md, as small as a test
 * can make it (see idx_test.h): one publisher of one (worker, rank) that
 * stores blocks, publishes each store as an event-plane envelope (or
 * "loses" it), keeps every envelope it published and its forwarded state,
 * announces itself when asked (and when the test says so), and answers
 * recovery requests on nats.c's threads: the envelopes from
 * from_sequence, a dump (cut every dump_blocks blocks, the watermark on
 * the last), or too_new. */
#include "idx_test.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "namespace.dynamo.component.backend"

static void put_msg(fake_relay *r, const char *subj, const char *kind,
                    const char *zmq, const void *body, size_t len) {
    natsMsg *m;
    ck_assert_int_eq(natsMsg_Create(&m, subj, NULL, body, (int)len), NATS_OK);
    if (kind)
        ck_assert_int_eq(natsMsgHeader_Set(m, WIRE_HDR_RECOVERY, kind),
                         NATS_OK);
    if (zmq)
        ck_assert_int_eq(natsMsgHeader_Set(m, WIRE_HDR_ZMQ_SEQ, zmq), NATS_OK);
    ck_assert_int_eq(natsConnection_PublishMsg(r->nc, m), NATS_OK);
    natsMsg_Destroy(m);
}

/* The envelope (r->pub, seq) around evs[0, n). kvo_free the bytes. */
static uint8_t *encode(const fake_relay *r, uint64_t seq, wire_revent *evs,
                       uint32_t n, size_t *len) {
    return tt_plane(r->pub, seq, r->started_at + seq, evs, n, len);
}

static void announce_to(fake_relay *r, const char *subj) {
    char rec[160];
    snprintf(rec, sizeof(rec), PREFIX ".kv-recovery.%" PRIu64, r->pub);
    uint64_t rank = r->rank;
    wire_announce a = {.publisher_id = r->pub,
                       .worker_id = r->worker,
                       .n_ranks = 1,
                       .ranks = &rank,
                       .recovery_subject = rec,
                       .has_last = r->n > 0,
                       .last_sequence = r->n ? r->n - 1 : 0,
                       .started_at_ms = r->started_at,
                       .heartbeat_ms = 1000};
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(wire_announce_encode(&a, &b), KVO_OK);
    put_msg(r, subj, NULL, NULL, b.data, b.len);
    kvo_buf_fini(&b);
}

static void on_discover(natsConnection *nc, natsSubscription *sub, natsMsg *m,
                        void *closure) {
    (void)nc;
    (void)sub;
    fake_relay *r = closure;
    pthread_mutex_lock(&r->mu);
    if (natsMsg_GetReply(m)) announce_to(r, natsMsg_GetReply(m));
    pthread_mutex_unlock(&r->mu);
    natsMsg_Destroy(m);
}

static void end_to(fake_relay *r, const char *to, wire_reply_kind what,
                   const wire_reply_end *e) {
    kvo_buf b;
    kvo_buf_init(&b);
    ck_assert_int_eq(wire_reply_end_encode(what, e, &b), KVO_OK);
    put_msg(r, to, wire_reply_kind_name(what), NULL, b.data, b.len);
    kvo_buf_fini(&b);
}

/* The dump: a cleared of the rank, then the blocks in store order (parents
 * first), dump_blocks a envelope, all as of the last sequence. */
static void dump_to(fake_relay *r, const char *to) {
    uint64_t as_of = r->n ? r->n - 1 : 0;
    size_t per = r->dump_blocks ? r->dump_blocks
                 : r->nstate    ? r->nstate
                                : 1; /* all in one envelope */
    wire_revent *ev = kvo_calloc(per + 1, sizeof(*ev));
    wire_rblock *b = kvo_calloc(per, sizeof(*b));
    uint64_t sent = 0;
    size_t i = 0;
    do {
        uint32_t n = 0;
        if (i == 0)
            ev[n++] = (wire_revent){.worker_id = r->worker,
                                    .dp_rank = r->rank,
                                    .type = WIRE_R_CLEARED};
        for (size_t k = 0; k < per && i < r->nstate; k++, i++) {
            b[k] = (wire_rblock){r->state[i].bh, r->state[i].th};
            ev[n++] = (wire_revent){.worker_id = r->worker,
                                    .dp_rank = r->rank,
                                    .type = WIRE_R_STORED,
                                    .has_parent = r->state[i].parent != 0,
                                    .parent_hash = r->state[i].parent,
                                    .n_blocks = 1,
                                    .blocks = &b[k]};
        }
        size_t len;
        uint8_t *body = encode(r, as_of, ev, n, &len);
        char zmq[48];
        snprintf(zmq, sizeof(zmq), "0-%" PRIu64, r->n ? r->n - 1 : 0);
        put_msg(r, to, "dump", i == r->nstate && r->n ? zmq : NULL, body, len);
        kvo_free(body);
        sent++;
    } while (i < r->nstate);
    kvo_free(ev);
    kvo_free(b);
    wire_reply_end e = {.kind = WIRE_REPLY_DUMP,
                        .sent = sent,
                        .has_as_of = r->n > 0,
                        .as_of = as_of,
                        .blocks = r->nstate};
    end_to(r, to, WIRE_REPLY_END, &e);
    r->dumps++;
}

static void on_recovery(natsConnection *nc, natsSubscription *sub, natsMsg *m,
                        void *closure) {
    (void)nc;
    (void)sub;
    fake_relay *r = closure;
    const char *to = natsMsg_GetReply(m);
    kvo_json doc;
    kvo_json_init(&doc);
    wire_recovery_req q;
    kvo_status st = wire_recovery_req_decode(
        &doc, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &q, NULL);
    kvo_json_fini(&doc);
    pthread_mutex_lock(&r->mu);
    r->requests++;
    if (st != KVO_OK || !to || r->silent) {
        /* not answered */
    } else if (!q.dump && (r->n == 0 || q.from_sequence > r->n - 1)) {
        wire_reply_end e = {.kind = WIRE_REPLY_TOO_NEW,
                            .has_as_of = r->n > 0,
                            .as_of = r->n ? r->n - 1 : 0};
        end_to(r, to, WIRE_REPLY_TOO_NEW, &e);
        r->too_new++;
    } else if (q.dump || q.from_sequence < r->ring_first) {
        dump_to(r, to);
    } else {
        for (uint64_t s = q.from_sequence; s < r->n; s++)
            put_msg(r, to, "events", r->sent[s].hdr, r->sent[s].body,
                    r->sent[s].len);
        wire_reply_end e = {.kind = WIRE_REPLY_EVENTS,
                            .sent = r->n - q.from_sequence,
                            .has_as_of = true,
                            .as_of = r->n - 1};
        end_to(r, to, WIRE_REPLY_END, &e);
        r->events++;
    }
    pthread_mutex_unlock(&r->mu);
    natsMsg_Destroy(m);
}

void fake_relay_start(fake_relay *r, const char *url, uint64_t pub,
                      uint64_t worker) {
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    r->pub = pub;
    r->worker = worker;
    r->started_at = 1764619200000ull;
    natsOptions *o;
    ck_assert_int_eq(natsOptions_Create(&o), NATS_OK);
    ck_assert_int_eq(natsOptions_SetURL(o, url), NATS_OK);
    ck_assert_int_eq(natsConnection_Connect(&r->nc, o), NATS_OK);
    natsOptions_Destroy(o);
    char subj[160];
    ck_assert_int_eq(natsConnection_Subscribe(&r->disc, r->nc,
                                              PREFIX ".kv-relays.discover",
                                              on_discover, r),
                     NATS_OK);
    snprintf(subj, sizeof(subj), PREFIX ".kv-recovery.%" PRIu64, pub);
    ck_assert_int_eq(
        natsConnection_Subscribe(&r->rec, r->nc, subj, on_recovery, r),
        NATS_OK);
    ck_assert_int_eq(natsConnection_FlushTimeout(r->nc, 5000), NATS_OK);
}

void fake_relay_stop(fake_relay *r) {
    natsSubscription_Unsubscribe(r->disc);
    natsSubscription_Unsubscribe(r->rec);
    natsConnection_FlushTimeout(r->nc, 5000);
    natsSubscription_Destroy(r->disc);
    natsSubscription_Destroy(r->rec);
    natsConnection_Destroy(r->nc);
    for (uint64_t i = 0; i < r->n; i++) kvo_free(r->sent[i].body);
    kvo_free(r->sent);
    kvo_free(r->state);
    pthread_mutex_destroy(&r->mu);
}

void fake_relay_store(fake_relay *r, uint64_t parent, uint64_t bh, uint64_t th,
                      bool publish) {
    pthread_mutex_lock(&r->mu);
    ck_assert_int_eq(kvo_grow(&r->state, &r->cap_state, r->nstate + 1,
                              sizeof(*r->state), 64),
                     KVO_OK);
    r->state[r->nstate++] = (fake_block){bh, parent, th};
    ck_assert_int_eq(
        kvo_grow(&r->sent, &r->cap_sent, r->n + 1, sizeof(*r->sent), 64),
        KVO_OK);
    wire_rblock b = {bh, th};
    wire_revent ev = {.worker_id = r->worker,
                      .dp_rank = r->rank,
                      .event_id = r->n + 1,
                      .type = WIRE_R_STORED,
                      .has_parent = parent != 0,
                      .parent_hash = parent,
                      .n_blocks = 1,
                      .blocks = &b};
    fake_sent *s = &r->sent[r->n];
    s->body = encode(r, r->n, &ev, 1, &s->len);
    snprintf(s->hdr, sizeof(s->hdr), "%" PRIu64 "-%" PRIu64, r->n, r->n);
    r->n++;
    if (publish) put_msg(r, PREFIX ".kv-events", NULL, s->hdr, s->body, s->len);
    pthread_mutex_unlock(&r->mu);
    ck_assert_int_eq(natsConnection_FlushTimeout(r->nc, 5000), NATS_OK);
}

void fake_relay_announce(fake_relay *r) {
    pthread_mutex_lock(&r->mu);
    announce_to(r, PREFIX ".kv-relays");
    pthread_mutex_unlock(&r->mu);
    ck_assert_int_eq(natsConnection_FlushTimeout(r->nc, 5000), NATS_OK);
}
