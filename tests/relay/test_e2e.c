/* kvo-relay as a process: a real ZMQ publisher (PUB + replay ROUTER, in this
 * test), a real nats-server, a NATS subscriber decoding what arrives. */
#include "kvo_http.h"
#include "kvo_json.h"
#include "tr.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

Suite *suite_e2e(void);

#define SUBJECT "namespace.dynamo.component.backend.kv-events"
#define RECOVERY "namespace.dynamo.component.backend.kv-recovery.9"
#define RELAYS "namespace.dynamo.component.backend.kv-relays"
#define DISCOVER "namespace.dynamo.component.backend.kv-relays.discover"
#define WAIT_MS 15000

typedef struct e2e {
    tnet net;
    tpub *pub;
    trelay rel;
    char stats_path[600];
    char cap_path[600];
} e2e;

/* extra: more relay arguments (NULL-terminated) or NULL. */
static void e2e_start(e2e *e, const char *const *extra) {
    memset(e, 0, sizeof(*e));
    tnet_start(&e->net, SUBJECT);
    e->pub = tpub_new(true);
    char *dir = kt_tmpdir("relay-e2e");
    snprintf(e->stats_path, sizeof(e->stats_path), "%s/exit.json", dir);
    snprintf(e->cap_path, sizeof(e->cap_path), "%s/relay.kvocap", dir);
    kvo_free(dir);
    const char *args[48] = {"--zmq",
                            tpub_endpoint(e->pub),
                            "--replay",
                            tpub_replay_endpoint(e->pub),
                            "--nats",
                            e->net.relay_url,
                            "--publisher-id",
                            "9",
                            "--worker-id",
                            "3",
                            "--replay-timeout-ms",
                            "5000",
                            "--nats-reconnect-wait-ms",
                            "100",
                            "--stats-json",
                            e->stats_path,
                            "--record",
                            e->cap_path};
    size_t n = 0;
    while (args[n]) n++;
    for (size_t i = 0; extra && extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    trelay_start(&e->rel, args);
    ck_assert_msg(tpub_wait_subscriber(e->pub, WAIT_MS),
                  "kvo-relay never subscribed");
}

static void e2e_stop(e2e *e) {
    ck_assert_int_eq(trelay_stop(&e->rel), 0);
    tpub_free(e->pub);
    tnet_stop(&e->net);
}

/* Tagged batches first..last (rank 0) to the publisher; drop(seq) says which
 * never reach the SUB socket (NULL: none). */
static void send_tags(e2e *e, uint64_t first, uint64_t last,
                      bool (*drop)(uint64_t seq)) {
    kvo_buf p;
    kvo_buf_init(&p);
    for (uint64_t i = first; i <= last; i++) {
        tb_tagged(&p, i, 0);
        tpub_send(e->pub, &p, drop && drop(i));
    }
    kvo_buf_fini(&p);
}

/* What arrived on NATS, at block level (merging does not change it). */
typedef struct blk {
    wire_rtype type;
    uint32_t rank;
    uint64_t hash, tokens_hash;
} blk;

typedef struct got {
    blk b[4096];
    size_t n;
    uint64_t next_sequence; /* envelope sequences must be 0, 1, 2, ... */
    bool has_wm;
    uint64_t wm;
} got;

static void add_events(got *g, const wire_revent *ev, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const wire_revent *e = &ev[i];
        if (e->type == WIRE_R_CLEARED) {
            ck_assert_uint_lt(g->n, 4096);
            g->b[g->n++] = (blk){WIRE_R_CLEARED, e->dp_rank, 0, 0};
        }
        for (uint32_t k = 0; e->type == WIRE_R_STORED && k < e->n_blocks; k++) {
            ck_assert_uint_lt(g->n, 4096);
            g->b[g->n++] =
                (blk){WIRE_R_STORED, e->dp_rank, e->blocks[k].block_hash,
                      e->blocks[k].tokens_hash};
        }
        for (uint32_t k = 0; e->type == WIRE_R_REMOVED && k < e->n_removed;
             k++) {
            ck_assert_uint_lt(g->n, 4096);
            g->b[g->n++] = (blk){WIRE_R_REMOVED, e->dp_rank, e->removed[k], 0};
        }
    }
}

/* Read envelopes until the watermark reaches wm. */
static void collect(e2e *e, got *g, uint64_t wm) {
    wire_plane_msg m;
    wire_plane_init(&m);
    while (!(g->has_wm && g->wm >= wm)) {
        bool hr;
        uint64_t first, last;
        if (!tsub_next(&e->net.sub, WAIT_MS, &m, &hr, &first, &last)) {
            kvo_proc_dump_log(&e->rel.p.proc, 80);
            ck_abort_msg("no envelope within %d ms (watermark %" PRIu64
                         " wanted %" PRIu64 ")",
                         WAIT_MS, g->has_wm ? g->wm : 0, wm);
        }
        ck_assert_uint_eq(m.publisher_id, 9);
        ck_assert_uint_eq(m.sequence, g->next_sequence);
        g->next_sequence++;
        for (uint32_t i = 0; i < m.n_events; i++)
            ck_assert_uint_eq(m.events[i].worker_id, 3);
        add_events(g, m.events, m.n_events);
        if (hr) {
            ck_assert_uint_le(first, last);
            g->has_wm = true;
            g->wm = last;
        }
    }
    wire_plane_fini(&m);
}

static size_t stored_of(const got *g, uint64_t *h, size_t max) {
    size_t k = 0;
    for (size_t i = 0; i < g->n; i++)
        if (g->b[i].type == WIRE_R_STORED && k < max) h[k++] = g->b[i].hash;
    return k;
}

/* ---- tests -------------------------------------------------------------------*/

START_TEST(every_vector_arrives_on_nats_as_the_pipeline_converts_it) {
    json_object *root = kt_load_json("tests/data/vectors/wire/vectors.json");
    json_object *cases;
    json_object_object_get_ex(root, "cases", &cases);
    size_t nc = json_object_array_length(cases);
    /* The reference: the same batches through the pipeline seam. */
    relay_pipe_cfg cfg;
    tr_cfg_default(&cfg);
    cfg.worker_id = 3;
    cfg.publisher_id = 9;
    tr ref;
    tr_init(&ref, &cfg, 1, true);
    e2e e;
    e2e_start(&e, NULL);
    for (size_t c = 0; c < nc; c++) {
        json_object *f;
        json_object_object_get_ex(json_object_array_get_idx(cases, c), "file",
                                  &f);
        char rel[256];
        snprintf(rel, sizeof(rel), "tests/data/vectors/wire/%s",
                 json_object_get_string(f));
        char *path = kt_src_path(rel);
        size_t len;
        uint8_t *bytes = kt_read_file(path, &len);
        kvo_free(path);
        kvo_buf p = {bytes, len, len};
        uint64_t seq = tpub_send(e.pub, &p, false);
        tr_live(&ref, 0, seq, &p);
        kvo_free(bytes);
    }
    tr_flush(&ref);
    got *g = kvo_calloc(1, sizeof(*g));
    collect(&e, g, nc - 1);
    got *want = kvo_calloc(1, sizeof(*want));
    for (size_t i = 0; i < ref.n; i++)
        add_events(want, ref.msgs[i].m.events, ref.msgs[i].m.n_events);
    ck_assert_uint_gt(want->n, 30);
    ck_assert_uint_eq(g->n, want->n);
    for (size_t i = 0; i < g->n; i++) {
        ck_assert_msg(g->b[i].type == want->b[i].type &&
                          g->b[i].rank == want->b[i].rank &&
                          g->b[i].hash == want->b[i].hash &&
                          g->b[i].tokens_hash == want->b[i].tokens_hash,
                      "block %zu differs from the pipeline's conversion", i);
    }
    /* /metrics and /stats agree with what was seen */
    json_object *st = trelay_stats(&e.rel);
    ck_assert_uint_eq(tr_json_u64(st, "batches_applied"), nc);
    ck_assert_uint_eq(tr_json_u64(st, "gaps"), 0);
    ck_assert_uint_eq(tr_json_u64(st, "publisher_id"), 9);
    ck_assert_uint_eq(tr_json_u64(st, "rejects_total"),
                      relay_stats_rejects(tr_stats(&ref)));
    json_object_put(st);
    kvo_http_resp r;
    trelay_get(&e.rel, "/metrics", &r);
    char line[96];
    snprintf(line, sizeof(line), "\nkvo_relay_batches_applied_total %zu\n", nc);
    ck_assert_ptr_nonnull(strstr((const char *)r.body.data, line));
    kvo_http_resp_fini(&r);
    e2e_stop(&e);
    /* The exit JSON and the capture. */
    json_object *ex = json_object_from_file(e.stats_path);
    ck_assert_ptr_nonnull(ex);
    ck_assert_uint_eq(tr_json_u64(ex, "batches_applied"), nc);
    ck_assert_uint_eq(tr_json_u64(ex, "messages_published"), g->next_sequence);
    json_object_put(ex);
    wire_cap_reader *cr;
    ck_assert(wire_cap_open(&cr, e.cap_path, NULL) == KVO_OK);
    wire_cap_record rec;
    size_t zmq_recs = 0, nats_recs = 0;
    kvo_status cs;
    while ((cs = wire_cap_next(cr, &rec, NULL)) == KVO_OK) {
        if (rec.n_frames == 3) zmq_recs++;
        if (rec.n_frames == 2) {
            nats_recs++;
            ck_assert(rec.frames[0].len == strlen(SUBJECT) &&
                      !memcmp(rec.frames[0].data, SUBJECT, strlen(SUBJECT)));
        }
    }
    ck_assert_int_eq(cs, KVO_EOF);
    wire_cap_free(cr);
    ck_assert_uint_eq(zmq_recs, nc);
    ck_assert_uint_eq(nats_recs, g->next_sequence);
    kvo_free(g);
    kvo_free(want);
    tr_fini(&ref);
    json_object_put(root);
}
END_TEST

static bool drop_4_and_5(uint64_t tag) { return tag == 4 || tag == 5; }

START_TEST(a_dropped_sequence_is_recovered_by_replay) {
    e2e e;
    e2e_start(&e, NULL);
    send_tags(&e, 0, 11, drop_4_and_5); /* 4, 5 never reach the SUB */
    got *g = kvo_calloc(1, sizeof(*g));
    collect(&e, g, 11);
    uint64_t h[32];
    ck_assert_uint_eq(stored_of(g, h, 32), 12);
    for (uint64_t i = 0; i < 12; i++) ck_assert_uint_eq(h[i], 1000 + i);
    ck_assert_uint_eq(trelay_stat(&e.rel, "gaps"), 1);
    ck_assert_uint_eq(trelay_stat(&e.rel, "replays_completed"), 1);
    ck_assert_uint_eq(trelay_stat(&e.rel, "cleared_emitted"), 0);
    ck_assert_uint_eq(trelay_stat(&e.rel, "replay_failures_total"), 0);
    ck_assert_uint_ge(tpub_requests(e.pub), 1);
    kvo_free(g);
    e2e_stop(&e);
}
END_TEST

static bool drop_100_and_101(uint64_t tag) { return tag < 102; }

START_TEST(a_publisher_restart_clears_and_resyncs) {
    e2e e;
    e2e_start(&e, NULL);
    send_tags(&e, 0, 4, NULL);
    got *g = kvo_calloc(1, sizeof(*g));
    collect(&e, g, 4);
    /* The engine restarts: its sequence starts over at 0, and the relay
     * misses 0 and 1 of the new process (tagged 100 + seq). */
    tpub_restart(e.pub);
    send_tags(&e, 100, 103, drop_100_and_101);
    g->has_wm = false;
    collect(&e, g, 3);
    size_t cleared_at = g->n, cleared = 0;
    for (size_t i = 0; i < g->n; i++)
        if (g->b[i].type == WIRE_R_CLEARED) {
            if (cleared_at == g->n) cleared_at = i;
            cleared++;
        }
    ck_assert_uint_eq(cleared_at, 5); /* after the first 5 stores */
    /* the rank forgotten: one cleared per tier, together */
    ck_assert_uint_eq(cleared, WIRE_TIER_COUNT);
    for (size_t i = 0; i < WIRE_TIER_COUNT; i++)
        ck_assert_int_eq(g->b[cleared_at + i].type, WIRE_R_CLEARED);
    uint64_t h[32];
    ck_assert_uint_eq(stored_of(g, h, 32), 9);
    for (uint64_t i = 0; i < 4; i++) ck_assert_uint_eq(h[5 + i], 1100 + i);
    ck_assert_uint_eq(trelay_stat(&e.rel, "restarts"), 1);
    ck_assert_uint_eq(trelay_stat(&e.rel, "cleared_emitted"), 1);
    ck_assert_uint_eq(trelay_stat(&e.rel, "replays_completed"), 1);
    kvo_free(g);
    e2e_stop(&e);
}
END_TEST

START_TEST(a_nats_server_restart_loses_nothing_that_fit_in_the_buffer) {
    e2e e;
    e2e_start(&e, NULL);
    send_tags(&e, 0, 4, NULL);
    got *g = kvo_calloc(1, sizeof(*g));
    collect(&e, g, 4);
    /* Server down; the relay keeps converting into its reconnect buffer. */
    tnet_down(&e.net, &e.rel);
    send_tags(&e, 5, 24, NULL);
    trelay_wait_stat(&e.rel, "batches_applied", 25);
    ck_assert_uint_ge(trelay_stat(&e.rel, "nats_buffered"), 1);
    tnet_up(&e.net, WAIT_MS);
    collect(&e, g, 24);
    uint64_t h[64];
    ck_assert_uint_eq(stored_of(g, h, 64), 25);
    for (uint64_t i = 0; i < 25; i++) ck_assert_uint_eq(h[i], 1000 + i);
    ck_assert_uint_eq(trelay_stat(&e.rel, "publish_dropped"), 0);
    /* nats.c reports the reconnect after flushing: wait, do not assume */
    trelay_wait_stat(&e.rel, "nats_reconnects", 1);
    ck_assert_uint_eq(trelay_stat(&e.rel, "nats_buffered"),
                      0); /* all flushed */
    /* and the loop logged both */
    tr_wait_log(&e.rel.p.proc, "NATS disconnected: buffering", WAIT_MS);
    tr_wait_log(&e.rel.p.proc, "NATS reconnected (", WAIT_MS);
    kvo_free(g);
    e2e_stop(&e);
}
END_TEST

START_TEST(a_nats_outage_beyond_the_buffer_is_counted_as_dropped) {
    const char *extra[] = {"--nats-buffer-bytes", "2048", NULL};
    e2e e;
    e2e_start(&e, extra);
    send_tags(&e, 0, 0, NULL);
    got *g = kvo_calloc(1, sizeof(*g));
    collect(&e, g, 0);
    tnet_down(&e.net, &e.rel);
    /* one envelope per batch: wait for each before sending the next */
    for (uint64_t i = 1; i < 40; i++) {
        send_tags(&e, i, i, NULL);
        trelay_wait_stat(&e.rel, "batches_applied", i + 1);
    }
    trelay_wait_stat(&e.rel, "publish_dropped", 1);
    json_object *st = trelay_stats(&e.rel);
    uint64_t dropped = tr_json_u64(st, "publish_dropped");
    uint64_t published = tr_json_u64(st, "messages_published");
    json_object_put(st);
    tnet_up(&e.net, WAIT_MS);
    /* What was buffered arrives; the next envelope's sequence shows the
     * hole the dropped ones left (the indexer counts it as a gap). */
    trelay_wait_stat(&e.rel, "nats_reconnects", 1);
    send_tags(&e, 40, 40, NULL);
    wire_plane_msg m;
    wire_plane_init(&m);
    bool hr = false;
    uint64_t f, l = 0, received = 0, last_seq = 0;
    while (!(hr && l == 40)) {
        ck_assert_msg(tsub_next(&e.net.sub, WAIT_MS, &m, &hr, &f, &l),
                      "batch 40 never arrived");
        received++;
        last_seq = m.sequence;
    }
    wire_plane_fini(&m);
    ck_assert_uint_gt(dropped, 0);
    ck_assert_uint_eq(received, published); /* 1..published-1, then 40 */
    ck_assert_uint_eq(last_seq, published + dropped);
    /* Nothing lost stays lost: the ring gives the dropped envelopes back to
     * whoever asks from the first missing sequence (docs/recovery.md). */
    natsConnection *nc = NULL;
    ck_assert(natsConnection_ConnectTo(&nc, e.net.nats.url) == NATS_OK);
    tr_replies rep;
    tr_replies_init(&rep);
    char req[64];
    snprintf(req, sizeof(req), "{\"from_sequence\": %" PRIu64 "}", published);
    ck_assert(treq_recover(nc, RECOVERY, req, WAIT_MS, &rep));
    ck_assert_uint_eq(rep.n, dropped + 2); /* the dropped, 40's, the end */
    for (uint64_t i = 0; i <= dropped; i++) {
        ck_assert_int_eq(rep.v[i].kind, WIRE_REPLY_EVENTS);
        ck_assert_uint_eq(rep.v[i].m.sequence, published + i);
        ck_assert(rep.v[i].has_range);
    }
    ck_assert_uint_eq(rep.v[dropped].last, 40);
    ck_assert_int_eq(rep.v[dropped + 1].kind, WIRE_REPLY_END);
    ck_assert_uint_eq(rep.v[dropped + 1].end.sent, dropped + 1);
    tr_replies_fini(&rep);
    natsConnection_Destroy(nc);
    kvo_free(g);
    e2e_stop(&e);
}
END_TEST

/* ---- recovery (docs/recovery.md) ---------------------------------------------------*/

/* Batch seq of rank 0: a chain of 3 under the middle of batch seq-1's, a
 * second copy of its first block now and then, and the leaf of batch
 * seq-3 removed. */
static void chain_batch(kvo_buf *out, uint64_t seq) {
    tb b;
    tb_begin(&b);
    uint64_t h[3] = {7000 + 3 * seq, 7001 + 3 * seq, 7002 + 3 * seq};
    if (seq >= 3) {
        uint64_t old = 7002 + 3 * (seq - 3);
        tb_remove(&b, &old, 1);
    }
    bool hp = seq > 0;
    uint64_t parent = hp ? 7001 + 3 * (seq - 1) : 0;
    tb_store(&b, hp, parent, h, 3);
    if (seq % 4 == 1) tb_store(&b, hp, parent, h, 1);
    tb_end(&b, 0, out);
}

/* Every envelope on the event subject until the watermark reaches wm,
 * kept as a reply stream of "events" (raw bytes and decoded). */
static void collect_raw(e2e *e, tr_replies *live, uint64_t wm) {
    for (;;) {
        natsMsg *m = NULL;
        ck_assert_msg(natsSubscription_NextMsg(&m, e->net.sub.sub, WAIT_MS) ==
                          NATS_OK,
                      "no envelope within %d ms", WAIT_MS);
        const char *v = NULL;
        uint64_t f = 0, l = 0;
        bool hr = natsMsgHeader_Get(m, WIRE_HDR_ZMQ_SEQ, &v) == NATS_OK;
        if (hr) ck_assert_int_eq(sscanf(v, "%" SCNu64 "-%" SCNu64, &f, &l), 2);
        tr_reply_keep(live, WIRE_REPLY_EVENTS, hr, f, l,
                      (const uint8_t *)natsMsg_GetData(m),
                      (size_t)natsMsg_GetDataLength(m));
        natsMsg_Destroy(m);
        ck_assert_uint_eq(live->v[live->n - 1].m.sequence, live->n - 1);
        if (hr && l >= wm) return;
    }
}

START_TEST(recovery_answers_events_a_dump_and_too_new_over_nats) {
    const char *extra[] = {"--recovery-buffer", "8", NULL};
    e2e e;
    e2e_start(&e, extra);
    /* one envelope per batch: each is sent once the last one arrived */
    kvo_buf p;
    kvo_buf_init(&p);
    tr_replies live;
    tr_replies_init(&live);
    for (uint64_t seq = 0; seq < 30; seq++) {
        chain_batch(&p, seq);
        tpub_send(e.pub, &p, false);
        collect_raw(&e, &live, seq);
    }
    kvo_buf_fini(&p);
    uint64_t last = live.n - 1;
    ck_assert_uint_eq(last, 29);
    natsConnection *nc = NULL;
    ck_assert(natsConnection_ConnectTo(&nc, e.net.nats.url) == NATS_OK);
    json_object *st = trelay_stats(&e.rel), *v;
    ck_assert(json_object_object_get_ex(st, "recovery_subject", &v));
    ck_assert_str_eq(json_object_get_string(v), RECOVERY);
    json_object_put(st);
    tr_replies rep;
    tr_replies_init(&rep);
    char req[64];

    /* a recent sequence: the envelopes from it on, byte for byte */
    snprintf(req, sizeof(req), "{\"from_sequence\": %" PRIu64 "}", last - 3);
    ck_assert(treq_recover(nc, RECOVERY, req, WAIT_MS, &rep));
    ck_assert_uint_eq(rep.n, 5);
    for (size_t i = 0; i < 4; i++) {
        tr_rmsg *back = &rep.v[i], *want = &live.v[last - 3 + i];
        ck_assert_int_eq(back->kind, WIRE_REPLY_EVENTS);
        ck_assert_uint_eq(back->raw.len, want->raw.len);
        ck_assert_int_eq(memcmp(back->raw.data, want->raw.data, back->raw.len),
                         0);
        ck_assert(back->has_range == want->has_range);
        ck_assert_uint_eq(back->last, want->last);
    }
    ck_assert_int_eq(rep.v[4].kind, WIRE_REPLY_END);
    ck_assert_int_eq(rep.v[4].end.kind, WIRE_REPLY_EVENTS);
    ck_assert_uint_eq(rep.v[4].end.sent, 4);

    /* an old one: a dump, which rebuilds in an empty index what a
     * subscriber of every envelope built */
    ck_assert(
        treq_recover(nc, RECOVERY, "{\"from_sequence\": 0}", WAIT_MS, &rep));
    idx_tree *want, *dumped;
    ck_assert_int_eq(idx_tree_new(&want), KVO_OK);
    ck_assert_int_eq(idx_tree_new(&dumped), KVO_OK);
    for (size_t i = 0; i < live.n; i++) tr_tree_apply(want, &live.v[i].m);
    ck_assert_uint_ge(rep.n, 2);
    tr_rmsg *end = &rep.v[rep.n - 1];
    ck_assert_int_eq(end->kind, WIRE_REPLY_END);
    ck_assert_int_eq(end->end.kind, WIRE_REPLY_DUMP);
    ck_assert_uint_eq(end->end.sent, rep.n - 1);
    ck_assert(end->end.has_as_of);
    ck_assert_uint_eq(end->end.as_of, last);
    for (size_t i = 0; i + 1 < rep.n; i++) {
        ck_assert_int_eq(rep.v[i].kind, WIRE_REPLY_DUMP);
        ck_assert_uint_eq(rep.v[i].m.sequence, last);
        ck_assert_uint_eq(rep.v[i].m.publisher_id, 9);
        tr_tree_apply(dumped, &rep.v[i].m);
    }
    ck_assert(rep.v[rep.n - 2].has_range);
    ck_assert_uint_eq(rep.v[rep.n - 2].last, 29);
    ck_assert_uint_ge(tr_same_trees(want, dumped), 60);
    ck_assert_uint_eq(end->end.blocks, trelay_stat(&e.rel, "state_blocks"));
    idx_tree_free(want);
    idx_tree_free(dumped);

    /* beyond the last: too_new */
    snprintf(req, sizeof(req), "{\"from_sequence\": %" PRIu64 "}", last + 5);
    ck_assert(treq_recover(nc, RECOVERY, req, WAIT_MS, &rep));
    ck_assert_uint_eq(rep.n, 1);
    ck_assert_int_eq(rep.v[0].kind, WIRE_REPLY_TOO_NEW);
    ck_assert_uint_eq(rep.v[0].end.as_of, last);

    /* nonsense: counted, no answer */
    ck_assert(natsConnection_PublishRequestString(nc, RECOVERY, "_INBOX.x",
                                                  "nonsense") == NATS_OK);
    trelay_wait_stat(&e.rel, "recovery_bad_requests", 1);
    st = trelay_stats(&e.rel);
    ck_assert(json_object_object_get_ex(st, "recovery_requests", &v));
    ck_assert_uint_eq(tr_json_u64(v, "events"), 1);
    ck_assert_uint_eq(tr_json_u64(v, "dump"), 1);
    ck_assert_uint_eq(tr_json_u64(v, "too_new"), 1);
    ck_assert_uint_eq(tr_json_u64(st, "dumps_sent"), 1);
    ck_assert_uint_eq(tr_json_u64(st, "ring_envelopes"), 8);
    ck_assert_uint_gt(tr_json_u64(st, "state_bytes"), 0);
    json_object_put(st);
    kvo_http_resp r;
    trelay_get(&e.rel, "/metrics", &r);
    ck_assert_ptr_nonnull(strstr((const char *)r.body.data,
                                 "\nkvo_relay_recovery_requests_total{kind="
                                 "\"dump\"} 1\n"));
    kvo_http_resp_fini(&r);
    tr_wait_log(&e.rel.p.proc, "recovery request from _INBOX.x not understood",
                WAIT_MS);
    tr_replies_fini(&rep);
    tr_replies_fini(&live);
    natsConnection_Destroy(nc);
    e2e_stop(&e);
}
END_TEST

/* Requests faster than the relay answers them: each is answered or
 * counted as dropped, none is held without bound, and the relay answers
 * afterwards as before. */
START_TEST(a_storm_of_requests_is_answered_or_counted) {
    e2e e;
    e2e_start(&e, NULL);
    send_tags(&e, 0, 3, NULL);
    got *g = kvo_calloc(1, sizeof(*g));
    collect(&e, g, 3);
    natsConnection *nc = NULL;
    ck_assert(natsConnection_ConnectTo(&nc, e.net.nats.url) == NATS_OK);
    const uint64_t n = 5000;
    for (uint64_t i = 0; i < n; i++)
        ck_assert(natsConnection_PublishRequestString(
                      nc, RECOVERY, "_INBOX.nobody",
                      i % 2 ? "{\"dump\": true}" : "{\"from_sequence\": 0}") ==
                  NATS_OK);
    ck_assert(natsConnection_Flush(nc) == NATS_OK);
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull, answered, dropped;
    for (;;) {
        json_object *st = trelay_stats(&e.rel);
        answered = tr_json_u64(st, "recovery_requests_total");
        dropped = tr_json_u64(st, "recovery_requests_dropped");
        json_object_put(st);
        if (answered + dropped == n) break;
        ck_assert_msg(kvo_now_ns() < end,
                      "%" PRIu64 " answered + %" PRIu64 " dropped != %" PRIu64,
                      answered, dropped, n);
        usleep(20000);
    }
    printf("a storm of %" PRIu64 " requests: %" PRIu64 " answered, %" PRIu64
           " dropped\n",
           n, answered, dropped);
    tr_replies rep;
    tr_replies_init(&rep);
    ck_assert(
        treq_recover(nc, RECOVERY, "{\"from_sequence\": 0}", WAIT_MS, &rep));
    ck_assert_uint_eq(rep.n, g->next_sequence + 1);
    ck_assert_uint_eq(trelay_stat(&e.rel, "recovery_bad_requests"), 0);
    tr_replies_fini(&rep);
    natsConnection_Destroy(nc);
    kvo_free(g);
    e2e_stop(&e);
}
END_TEST

/* An announce as received; doc must outlive a. */
static void announce_of(natsMsg *m, kvo_json *doc, wire_announce *a) {
    kvo_err err;
    char buf[256];
    ck_assert_msg(wire_announce_decode(doc, natsMsg_GetData(m),
                                       (size_t)natsMsg_GetDataLength(m), a,
                                       &err) == KVO_OK,
                  "announce: %s", kvo_err_str(&err, buf, sizeof(buf)));
    ck_assert_uint_eq(a->publisher_id, 9);
    ck_assert_uint_eq(a->worker_id, 3);
    ck_assert_uint_eq(a->n_ranks, 1);
    ck_assert_uint_eq(a->ranks[0], 0);
    ck_assert_str_eq(a->recovery_subject, RECOVERY);
    ck_assert_uint_eq(a->heartbeat_ms, 100);
}

START_TEST(the_relay_announces_itself_and_answers_discover) {
    uint64_t t0 = kvo_unix_ns() / 1000000u;
    natsConnection *nc = NULL;
    natsSubscription *beats = NULL;
    const char *extra[] = {"--heartbeat-ms", "100", NULL};
    e2e e;
    memset(&e, 0, sizeof(e));
    e2e_start(&e, extra);
    ck_assert(natsConnection_ConnectTo(&nc, e.net.nats.url) == NATS_OK);
    ck_assert(natsConnection_SubscribeSync(&beats, nc, RELAYS) == NATS_OK);
    kvo_json doc;
    kvo_json_init(&doc);
    wire_announce a;
    natsMsg *m = NULL;
    ck_assert(natsSubscription_NextMsg(&m, beats, WAIT_MS) == NATS_OK);
    announce_of(m, &doc, &a);
    ck_assert(!a.has_last); /* nothing published yet */
    ck_assert_uint_ge(a.started_at_ms, t0);
    ck_assert_uint_le(a.started_at_ms, kvo_unix_ns() / 1000000u);
    uint64_t started = a.started_at_ms;
    natsMsg_Destroy(m);
    send_tags(&e, 0, 2, NULL);
    got *g = kvo_calloc(1, sizeof(*g));
    collect(&e, g, 2);
    /* a later heartbeat says the last envelope */
    for (;;) {
        ck_assert(natsSubscription_NextMsg(&m, beats, WAIT_MS) == NATS_OK);
        announce_of(m, &doc, &a);
        natsMsg_Destroy(m);
        if (a.has_last) break;
    }
    ck_assert_uint_eq(a.last_sequence, g->next_sequence - 1);
    ck_assert_uint_eq(a.started_at_ms, started);
    /* who is there? */
    ck_assert(natsConnection_RequestString(&m, nc, DISCOVER, "{}", WAIT_MS) ==
              NATS_OK);
    announce_of(m, &doc, &a);
    ck_assert(a.has_last);
    ck_assert_uint_eq(a.last_sequence, g->next_sequence - 1);
    natsMsg_Destroy(m);
    json_object *st = trelay_stats(&e.rel);
    ck_assert_uint_eq(tr_json_u64(st, "discover_requests"), 1);
    ck_assert_uint_ge(tr_json_u64(st, "announces_sent"), 3);
    ck_assert_uint_eq(tr_json_u64(st, "started_at"), started);
    json_object_put(st);
    kvo_json_fini(&doc);
    natsSubscription_Destroy(beats);
    natsConnection_Destroy(nc);
    kvo_free(g);
    e2e_stop(&e);
}
END_TEST

/* ---- discovery -----------------------------------------------------------------*/

typedef struct disco {
    kvo_http_server *srv;
    char body[8192];
    volatile bool stop;
    volatile int hits;
    pthread_t thr;
} disco;

static void disco_handler(void *ctx, kvo_http_req *req) {
    disco *d = ctx;
    d->hits++;
    if (strcmp(kvo_http_req_path(req), "/kvo/event_sources") != 0 ||
        d->hits < 3) { /* the engine is "not up" for the first two tries */
        kvo_http_respond_error(req, 503, "starting");
        return;
    }
    kvo_http_respond(req, 200, "application/json", d->body, strlen(d->body));
}

static void *disco_thread(void *arg) {
    disco *d = arg;
    kt_http_serve(d->srv, &d->stop);
    return NULL;
}

START_TEST(discovery_relays_every_listed_rank) {
    kt_nats nats;
    kt_nats_start(&nats);
    tpub *pub[2] = {tpub_new(true), tpub_new(false)};
    disco d;
    memset(&d, 0, sizeof(d));
    kvo_http_server_cfg hc = {.handler = disco_handler, .ctx = &d};
    ck_assert(kvo_http_server_new(&d.srv, &hc) == KVO_OK);
    /* rank 1 listed with a wildcard host, as an engine binding 0.0.0.0 */
    const char *ep1 = strrchr(tpub_endpoint(pub[1]), ':');
    const char *rep1 = strrchr(tpub_replay_endpoint(pub[1]), ':');
    snprintf(d.body, sizeof(d.body),
             "[{\"transport\": \"zmq\", \"endpoint\": \"%s\", "
             "\"replay_endpoint\": \"%s\", \"topic\": \"kv-events\", "
             "\"data_parallel_rank\": 0, \"encoding\": \"msgpack\"},"
             "{\"transport\": \"zmq\", \"endpoint\": \"tcp://0.0.0.0%s\", "
             "\"replay_endpoint\": \"tcp://*%s\", \"topic\": \"kv-events\", "
             "\"data_parallel_rank\": 1, \"encoding\": \"msgpack\"}]",
             tpub_endpoint(pub[0]), tpub_replay_endpoint(pub[0]), ep1, rep1);
    ck_assert_int_eq(pthread_create(&d.thr, NULL, disco_thread, &d), 0);
    tsub sub;
    tsub_start(&sub, nats.url, SUBJECT);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u",
             kvo_http_server_port(d.srv));
    const char *args[] = {"--discover",          url, "--nats",      nats.url,
                          "--publisher-id",      "9", "--worker-id", "3",
                          "--stats-interval-ms", "0", NULL};
    kt_proc relay;
    kt_proc_start(&relay, "kvo-relay", args);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(tpub_wait_subscriber(pub[i], WAIT_MS),
                      "rank %d never subscribed", i);
    kvo_buf p;
    kvo_buf_init(&p);
    /* batches without a rank: the discovered rank applies; rank 1 also loses
     * a batch, recovered through its (older-layout) replay socket */
    for (int i = 0; i < 2; i++)
        for (uint64_t k = 0; k < 3; k++) {
            tb_tagged(&p, (uint64_t)i * 100 + k, -1);
            tpub_send(pub[i], &p, i == 1 && k == 1);
        }
    wire_plane_msg m;
    wire_plane_init(&m);
    int seen[2] = {0, 0};
    uint64_t end = kvo_now_ns() + WAIT_MS * 1000000ull;
    while ((seen[0] < 3 || seen[1] < 3) && kvo_now_ns() < end) {
        bool hr;
        uint64_t f, l;
        if (!tsub_next(&sub, 1000, &m, &hr, &f, &l)) continue;
        for (uint32_t i = 0; i < m.n_events; i++) {
            const wire_revent *ev = &m.events[i];
            if (ev->type != WIRE_R_STORED) continue;
            ck_assert_uint_le(ev->dp_rank, 1);
            for (uint32_t k = 0; k < ev->n_blocks; k++) {
                uint64_t tag = ev->blocks[k].block_hash - 1000;
                ck_assert_uint_eq(tag / 100, ev->dp_rank);
                ck_assert_uint_eq(tag % 100, (uint64_t)seen[ev->dp_rank]);
                seen[ev->dp_rank]++;
            }
        }
    }
    wire_plane_fini(&m);
    if (seen[0] < 3 || seen[1] < 3) kvo_proc_dump_log(&relay.proc, 60);
    ck_assert_int_eq(seen[0], 3);
    ck_assert_int_eq(seen[1], 3);
    ck_assert_int_eq(kt_proc_stop(&relay), 0);
    d.stop = 1;
    pthread_join(d.thr, NULL);
    kvo_http_server_free(d.srv);
    kvo_buf_fini(&p);
    tsub_stop(&sub);
    tpub_free(pub[0]);
    tpub_free(pub[1]);
    kt_nats_stop(&nats);
}
END_TEST

/* An engine listing more sources than a relay serves is refused whole (exit
 * 2, said in the log), never served in part. */
START_TEST(discovery_refuses_more_sources_than_it_serves) {
    disco d;
    memset(&d, 0, sizeof(d));
    kvo_http_server_cfg hc = {.handler = disco_handler, .ctx = &d};
    ck_assert(kvo_http_server_new(&d.srv, &hc) == KVO_OK);
    size_t off = 0;
    d.body[off++] = '[';
    for (int i = 0; i <= RELAY_MAX_SOURCES; i++)
        off += (size_t)snprintf(d.body + off, sizeof(d.body) - off,
                                "%s{\"transport\": \"zmq\", \"endpoint\": "
                                "\"tcp://127.0.0.1:%d\"}",
                                i ? "," : "", 20000 + i);
    ck_assert_uint_lt(off + 2, sizeof(d.body));
    d.body[off++] = ']';
    ck_assert_int_eq(pthread_create(&d.thr, NULL, disco_thread, &d), 0);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u",
             kvo_http_server_port(d.srv));
    const char *args[] = {
        "--discover",          url, "--nats", "nats://127.0.0.1:1",
        "--stats-interval-ms", "0", NULL};
    kt_proc relay;
    kt_proc_start(&relay, "kvo-relay", args);
    while (kvo_proc_alive(&relay.proc)) usleep(10000);
    ck_assert_int_eq(relay.proc.exit_status, 2);
    tr_wait_log(&relay.proc, "lists more than 64 ZMQ sources", WAIT_MS);
    kt_proc_stop(&relay);
    d.stop = 1;
    pthread_join(d.thr, NULL);
    kvo_http_server_free(d.srv);
}
END_TEST

START_TEST(usage_errors_exit_2_and_help_exits_0) {
    /* a subject that would not fit is refused, not cut */
    char long_ns[600];
    memset(long_ns, 'n', sizeof(long_ns) - 1);
    long_ns[sizeof(long_ns) - 1] = '\0';
    const char *bad[][4] = {
        {NULL},
        {"--zmq", "tcp://127.0.0.1:1", "--namespace", "a.b"},
        {"--zmq", "tcp://127.0.0.1:1", "--recovery-buffer", "0"},
        {"--zmq", "tcp://127.0.0.1:1", "--heartbeat-ms", "0"},
        {"--zmq", "tcp://127.0.0.1:1", "--discover", "x"},
        {"--zmq", "tcp://127.0.0.1:1", "--block-size", "0"},
        {"--zmq", "tcp://127.0.0.1:1", "--verify-engine-hash", "md5"},
        {"--zmq", "tcp://127.0.0.1:1", "--namespace", long_ns}};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        const char *args[6] = {NULL};
        for (int k = 0; k < 4 && bad[i][k]; k++) args[k] = bad[i][k];
        kt_proc pr;
        kt_proc_start(&pr, "kvo-relay", args);
        while (kvo_proc_alive(&pr.proc)) usleep(10000);
        ck_assert_int_eq(pr.proc.exit_status, 2);
        kt_proc_stop(&pr);
    }
    const char *help[] = {"--help", NULL};
    kt_proc pr;
    kt_proc_start(&pr, "kvo-relay", help);
    while (kvo_proc_alive(&pr.proc)) usleep(10000);
    ck_assert_int_eq(pr.proc.exit_status, 0);
    kt_proc_stop(&pr);
}
END_TEST

Suite *suite_e2e(void) {
    Suite *s = suite_create("e2e");
    TCase *tc = tcase_create("relay_process");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc,
                   every_vector_arrives_on_nats_as_the_pipeline_converts_it);
    tcase_add_test(tc, a_dropped_sequence_is_recovered_by_replay);
    tcase_add_test(tc, a_publisher_restart_clears_and_resyncs);
    tcase_add_test(tc,
                   a_nats_server_restart_loses_nothing_that_fit_in_the_buffer);
    tcase_add_test(tc, a_nats_outage_beyond_the_buffer_is_counted_as_dropped);
    tcase_add_test(tc, recovery_answers_events_a_dump_and_too_new_over_nats);
    tcase_add_test(tc, the_relay_announces_itself_and_answers_discover);
    tcase_add_test(tc, a_storm_of_requests_is_answered_or_counted);
    tcase_add_test(tc, discovery_relays_every_listed_rank);
    tcase_add_test(tc, discovery_refuses_more_sources_than_it_serves);
    tcase_add_test(tc, usage_errors_exit_2_and_help_exits_0);
    suite_add_tcase(s, tc);
    return s;
}
