/* test_recover: the recovery core (idx_recover.c) without NATS -- a feed
 * with a fake io that records the requests it sends, fed live envelopes,
 * announces and answers as a relay following docs/recovery.md would send
 * them, with the clock set by hand. */
#include "idx_test.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define PUB 7    /* the relay's publisher id */
#define WORKER 3 /* its worker */
#define STARTED 1764619200000ull
#define ASKS_MAX 64

typedef struct fake {
    size_t n;
    idx_rec_ask ask[ASKS_MAX];
    char subject[ASKS_MAX][128];
    size_t notes[IDX_REC_RESTART + 1];
} fake;

static void fake_ask(void *ctx, const idx_rec_ask *a) {
    fake *k = ctx;
    ck_assert_uint_lt(k->n, ASKS_MAX);
    k->ask[k->n] = *a;
    snprintf(k->subject[k->n], sizeof(k->subject[0]), "%s",
             a->subject ? a->subject : "(none)");
    k->ask[k->n].subject = k->subject[k->n];
    k->n++;
}

static void fake_note(void *ctx, const idx_rec_note *n) {
    fake *k = ctx;
    ck_assert_int_le(n->what, IDX_REC_RESTART);
    k->notes[n->what]++;
}

/* A feed with recovery on (cfg may be NULL), at clock 1000. */
static idx_feed *rec_feed(fake *k, const idx_feed_cfg *cfg) {
    memset(k, 0, sizeof(*k));
    idx_feed *f = NULL;
    ck_assert_int_eq(idx_feed_new(&f, cfg), KVO_OK);
    idx_rec_io io = {.ask = fake_ask, .note = fake_note, .ctx = k};
    idx_feed_recovery(f, &io);
    idx_feed_set_clock(f, 1000);
    return f;
}

static const idx_rec_ask *last_ask(const fake *k) {
    ck_assert_uint_gt(k->n, 0);
    return &k->ask[k->n - 1];
}

static idx_feed_counters counters(const idx_feed *f) {
    idx_feed_counters c;
    idx_feed_counters_get(f, &c);
    return c;
}

/* ---- Envelopes -----------------------------------------------------------*/

/* An envelope of PUB around evs[0, n). kvo_free the bytes. */
static uint8_t *envelope(uint64_t seq, const wire_revent *evs, uint32_t n,
                         size_t *len) {
    return tt_plane(PUB, seq, 1700000000000ull + seq, evs, n, len);
}

/* A store by (WORKER, rank) of block hash bh (tokens hash bh + 1) under
 * parent (0 = the root). */
static wire_revent store(uint32_t rank, uint64_t parent, wire_rblock *b,
                         uint64_t bh) {
    *b = (wire_rblock){bh, bh + 1};
    return (wire_revent){.worker_id = WORKER,
                         .dp_rank = rank,
                         .event_id = bh,
                         .type = WIRE_R_STORED,
                         .has_parent = parent != 0,
                         .parent_hash = parent,
                         .n_blocks = 1,
                         .blocks = b};
}

/* The live envelope seq of PUB: one block, hash 1000 + seq, stored by
 * (WORKER, 0) under the root. */
static kvo_status live(idx_feed *f, uint64_t seq, const char *hdr,
                       idx_feed_result *r) {
    wire_rblock b;
    wire_revent ev = store(0, 0, &b, 1000 + seq);
    size_t len;
    uint8_t *body = envelope(seq, &ev, 1, &len);
    kvo_status s =
        idx_feed_live(f, "namespace.dynamo.component.backend.kv-events", body,
                      len, hdr, r, NULL);
    kvo_free(body);
    return s;
}

/* A spoofed envelope: PUB's id, sequence seq, a block nobody stored. */
static kvo_status spoof(idx_feed *f, uint64_t seq, idx_feed_result *r) {
    wire_rblock b;
    wire_revent ev = store(0, 0, &b, 666);
    size_t len;
    uint8_t *body = envelope(seq, &ev, 1, &len);
    kvo_status s = idx_feed_live(f, NULL, body, len, NULL, r, NULL);
    kvo_free(body);
    return s;
}

/* Does (WORKER, rank) hold block bh? */
static bool holds(idx_feed *f, uint32_t rank, uint64_t bh) {
    idx_block_info in;
    ck_assert_int_eq(
        idx_tree_block_info(idx_feed_tree(f), WORKER, rank, bh, &in), KVO_OK);
    return in.held;
}

/* ---- Answers -------------------------------------------------------------*/

static kvo_status reply(idx_feed *f, const idx_rec_ask *a, const char *kind,
                        const char *hdr, const void *body, size_t len) {
    return idx_feed_reply(f, PUB, a->id, kind, hdr, body, len, false, NULL);
}

/* The envelope seq as the live one, through an events answer. */
static kvo_status events_reply(idx_feed *f, const idx_rec_ask *a,
                               uint64_t seq) {
    wire_rblock b;
    wire_revent ev = store(0, 0, &b, 1000 + seq);
    size_t len;
    uint8_t *body = envelope(seq, &ev, 1, &len);
    kvo_status s = reply(f, a, "events", NULL, body, len);
    kvo_free(body);
    return s;
}

static kvo_status end_reply(idx_feed *f, const idx_rec_ask *a, bool dump,
                            uint64_t sent, const char *as_of, uint64_t blocks) {
    char body[160];
    snprintf(body, sizeof(body),
             "{\"sent\": %" PRIu64 ", \"kind\": \"%s\", \"as_of\": %s, "
             "\"blocks\": %" PRIu64 "}",
             sent, dump ? "dump" : "events", as_of, blocks);
    return reply(f, a, "end", NULL, body, strlen(body));
}

static kvo_status too_new_reply(idx_feed *f, const idx_rec_ask *a,
                                const char *last) {
    char body[80];
    snprintf(body, sizeof(body), "{\"last_sequence\": %s}", last);
    return reply(f, a, "too_new", NULL, body, strlen(body));
}

/* A dump as of as_of of ranks [0, ranks): a cleared per rank, then a chain
 * of `blocks` blocks (hashes 5001, 5002, ...) on rank 0, cut into `parts`
 * envelopes (the first holds the cleareds); the last carries zmq. Returns
 * the envelopes sent. */
static uint64_t dump_reply(idx_feed *f, const idx_rec_ask *a, uint64_t as_of,
                           uint32_t ranks, uint32_t blocks, uint32_t parts,
                           const char *zmq) {
    size_t nev = ranks + blocks;
    wire_revent *ev = kvo_calloc(nev, sizeof(*ev));
    wire_rblock *b = kvo_calloc(blocks ? blocks : 1, sizeof(*b));
    for (uint32_t r = 0; r < ranks; r++)
        ev[r] = (wire_revent){
            .worker_id = WORKER, .dp_rank = r, .type = WIRE_R_CLEARED};
    for (uint32_t i = 0; i < blocks; i++)
        ev[ranks + i] = store(0, i ? 5000 + i : 0, &b[i], 5001 + i);
    size_t per = (blocks + parts - 1) / parts, at = 0;
    for (uint32_t p = 0; p < parts; p++) {
        size_t n = p == 0 ? ranks + (per < blocks ? per : blocks)
                          : (nev - at < per ? nev - at : per);
        size_t len;
        uint8_t *body = envelope(as_of, ev + at, (uint32_t)n, &len);
        ck_assert_int_eq(
            reply(f, a, "dump", p == parts - 1 ? zmq : NULL, body, len),
            KVO_OK);
        kvo_free(body);
        at += n;
    }
    ck_assert_uint_eq(at, nev);
    kvo_free(ev);
    kvo_free(b);
    return parts;
}

static kvo_status announce(idx_feed *f, const char *last, uint64_t started,
                           const char *ranks) {
    char body[400];
    snprintf(body, sizeof(body),
             "{\"publisher_id\": %d, \"worker_id\": %d, \"dp_ranks\": %s, "
             "\"recovery_subject\": \"namespace.dynamo.component.backend."
             "kv-recovery.%d\", \"last_sequence\": %s, \"started_at\": %" PRIu64
             ", \"heartbeat_ms\": 1000}",
             PUB, WORKER, ranks, PUB, last, started);
    return idx_feed_announce(f, body, strlen(body), NULL);
}

/* Live envelopes 0..n-1 applied. */
static void live_upto(idx_feed *f, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        idx_feed_result r;
        ck_assert_int_eq(live(f, i, NULL, &r), KVO_OK);
        ck_assert(r.applied && !r.held);
    }
}

static uint64_t last_sequence(const idx_feed *f) {
    idx_publisher *p;
    size_t n;
    ck_assert_int_eq(idx_feed_publishers(f, &p, &n), KVO_OK);
    uint64_t r = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (p[i].publisher_id == PUB) r = p[i].last_sequence;
    kvo_free(p);
    return r;
}

/* ---- Tests -------------------------------------------------------------*/

/* A relay that was running before the indexer: its announce asks for a
 * dump; live envelopes arriving meanwhile wait; the dump is applied, those
 * at or below as_of are dropped (covered), the rest applied after it. */
START_TEST(live_envelopes_wait_while_a_dump_applies) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    idx_feed_discovering(f, 1500);
    ck_assert(idx_feed_is_recovering(f));
    ck_assert_int_eq(announce(f, "10", STARTED, "[0, 1]"), KVO_OK);
    ck_assert_uint_eq(k.n, 1);
    const idx_rec_ask *a = last_ask(&k);
    ck_assert(a->req.dump);
    ck_assert_uint_eq(a->publisher_id, PUB);
    ck_assert_str_eq(a->subject,
                     "namespace.dynamo.component.backend.kv-recovery.7");
    idx_feed_set_clock(f, 1600); /* the window is over; the dump is not */
    ck_assert(idx_feed_is_recovering(f));
    idx_feed_result r;
    const uint64_t arrive[] = {11, 9, 12, 10}; /* live, meanwhile */
    for (size_t i = 0; i < KVO_ARRAY_LEN(arrive); i++) {
        ck_assert_int_eq(live(f, arrive[i], NULL, &r), KVO_OK);
        ck_assert(r.held && !r.applied);
    }
    ck_assert(!holds(f, 0, 1011));
    uint64_t sent = dump_reply(f, a, 10, 2, 3, 1, "40-52");
    ck_assert(holds(f, 0, 5003)); /* applied as it comes */
    ck_assert(!holds(f, 0, 1011));
    idx_feed_set_clock(f, 1650);
    ck_assert_int_eq(end_reply(f, a, true, sent, "10", 3), KVO_OK);
    ck_assert(!idx_feed_is_recovering(f));
    ck_assert(holds(f, 0, 1011) && holds(f, 0, 1012));
    ck_assert(!holds(f, 0, 1009) && !holds(f, 0, 1010));
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), WORKER, 0), 5);
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), WORKER, 1), 0);
    ck_assert_uint_eq(last_sequence(f), 12);
    uint64_t zmq;
    ck_assert(idx_feed_zmq_last(f, PUB, &zmq));
    ck_assert_uint_eq(zmq, 52);
    idx_feed_counters c = counters(f);
    ck_assert_uint_eq(c.recoveries_dump, 1);
    ck_assert_uint_eq(c.dumps_applied, 1);
    ck_assert_uint_eq(c.dump_blocks_applied, 3);
    ck_assert_uint_eq(c.envelopes_recovered, 1);
    ck_assert_uint_eq(c.live_held, 4);
    ck_assert_uint_eq(c.live_covered, 2);
    ck_assert_uint_eq(c.applied, 2);
    ck_assert_uint_eq(c.recovery_ms_total, 650); /* asked at 1000 */
    ck_assert_uint_eq(c.recovery_ms_max, 650);
    ck_assert_uint_eq(c.relays, 1);
    ck_assert_uint_eq(c.recovering + c.stale_publishers + c.gaps, 0);
    ck_assert_uint_eq(k.notes[IDX_REC_DONE], 1);
    /* the announce said 10, the dump made it 12: nothing more to ask */
    ck_assert_int_eq(announce(f, "12", STARTED, "[0, 1]"), KVO_OK);
    ck_assert_uint_eq(k.n, 1);
    tt_check(idx_feed_tree(f), true);
    idx_feed_free(f);
}
END_TEST

/* A dump larger than max_payload comes as several envelopes, all with
 * as_of, the watermark on the last; an end whose count differs from what
 * came (a message of the answer lost) asks again, and the second dump
 * rebuilds the state whole. */
START_TEST(a_dump_in_several_envelopes_and_one_lost) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    ck_assert_int_eq(announce(f, "3", STARTED, "[0]"), KVO_OK);
    const idx_rec_ask *a = last_ask(&k);
    uint64_t sent = dump_reply(f, a, 3, 1, 100, 4, "7-9");
    ck_assert_uint_eq(sent, 4);
    kvo_err err;
    const char *end =
        "{\"sent\":5,\"kind\":\"dump\",\"as_of\":3,\"blocks\":100}";
    ck_assert_int_eq(idx_feed_reply(f, PUB, a->id, "end", NULL, end,
                                    strlen(end), false, &err),
                     KVO_EPROTO);
    ck_assert_msg(strstr(err.msg, "end says 5 envelopes, 4 came"), "%s",
                  err.msg);
    ck_assert_uint_eq(k.n, 2); /* asked again */
    a = last_ask(&k);
    ck_assert(a->req.dump);
    ck_assert(idx_feed_is_recovering(f));
    /* the first answer's end, late, is a stray now */
    ck_assert_int_eq(
        idx_feed_reply(f, PUB, k.ask[0].id, "end", NULL, "{}", 2, false, NULL),
        KVO_OK);
    sent = dump_reply(f, a, 3, 1, 100, 4, "7-9");
    ck_assert_int_eq(end_reply(f, a, true, sent, "3", 100), KVO_OK);
    ck_assert(!idx_feed_is_recovering(f));
    ck_assert_uint_eq(tt_blocks(idx_feed_tree(f), WORKER, 0), 100);
    idx_feed_counters c = counters(f);
    ck_assert_uint_eq(c.recovery_retries, 1);
    ck_assert_uint_eq(c.recovery_bad, 1);
    ck_assert_uint_eq(c.recovery_stray, 1);
    ck_assert_uint_eq(c.recoveries_dump, 1);
    ck_assert_uint_eq(c.dumps_applied, 1);
    ck_assert_uint_eq(c.dump_blocks_applied, 200);
    ck_assert_uint_eq(c.envelopes_recovered, 8);
    /* envelopes of two sequences in one dump: malformed */
    ck_assert_int_eq(announce(f, "9", STARTED + 1, "[0]"),
                     KVO_OK); /* restart */
    a = last_ask(&k);
    ck_assert(a->req.dump);
    dump_reply(f, a, 4, 1, 2, 1, NULL);
    size_t len;
    wire_rblock b;
    wire_revent ev = store(0, 0, &b, 77);
    uint8_t *body = envelope(5, &ev, 1, &len);
    ck_assert_int_eq(reply(f, a, "dump", NULL, body, len), KVO_EPROTO);
    kvo_free(body);
    ck_assert_uint_eq(counters(f).recovery_bad, 2);
    ck_assert(last_ask(&k)->req.dump && last_ask(&k) != a);
    tt_check(idx_feed_tree(f), true);
    idx_feed_free(f);
}
END_TEST

/* The relay restarts in the middle of a dump: a new started_at in an
 * announce, or one of its envelopes back at sequence 0. Either way what is
 * held goes (a new run's sequences say nothing of the old run's), the
 * old answer is ignored from then on, and a dump of the new run is asked
 * for and rebuilds the state. */
START_TEST(a_relay_restart_during_a_dump_starts_over) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    ck_assert_int_eq(announce(f, "20", STARTED, "[0]"), KVO_OK);
    const idx_rec_ask *first = last_ask(&k);
    idx_feed_result r;
    ck_assert_int_eq(live(f, 21, NULL, &r), KVO_OK);
    ck_assert(r.held);
    dump_reply(f, first, 20, 1, 5, 2, NULL); /* part of it... */
    /* ...then the relay restarts: a new started_at */
    ck_assert_int_eq(announce(f, "0", STARTED + 5000, "[0]"), KVO_OK);
    ck_assert_uint_eq(k.n, 2);
    const idx_rec_ask *second = last_ask(&k);
    ck_assert(second->req.dump && second->id != first->id);
    ck_assert_uint_eq(k.notes[IDX_REC_RESTART], 1);
    ck_assert_uint_eq(counters(f).live_covered, 1); /* 21 of the old run */
    /* the new run publishes 0, 1 (held); the old answer's end is a stray */
    ck_assert_int_eq(live(f, 0, NULL, &r), KVO_OK);
    ck_assert(r.held);
    ck_assert_int_eq(live(f, 1, NULL, &r), KVO_OK);
    ck_assert(r.held);
    ck_assert_int_eq(end_reply(f, first, true, 2, "20", 5), KVO_OK);
    ck_assert_uint_eq(counters(f).recovery_stray, 1);
    ck_assert(idx_feed_is_recovering(f));
    /* its heartbeat again: the same run, nothing new to ask */
    ck_assert_int_eq(announce(f, "1", STARTED + 5000, "[0]"), KVO_OK);
    ck_assert_uint_eq(k.n, 2);
    uint64_t sent = dump_reply(f, second, 0, 1, 2, 1, NULL);
    ck_assert_int_eq(end_reply(f, second, true, sent, "0", 2), KVO_OK);
    ck_assert(!idx_feed_is_recovering(f));
    ck_assert_uint_eq(last_sequence(f), 1);
    ck_assert(holds(f, 0, 5001) && holds(f, 0, 5002) && holds(f, 0, 1001));
    ck_assert(!holds(f, 0, 5003) && !holds(f, 0, 1000) && !holds(f, 0, 1021));

    /* an envelope back at 0 in the middle of an events recovery: whole at
     * 1, a gap (4 after 1) asks for 2.., then 0 comes with another body */
    ck_assert_int_eq(live(f, 4, NULL, &r), KVO_OK);
    ck_assert(r.held);
    const idx_rec_ask *third = last_ask(&k);
    ck_assert(!third->req.dump);
    ck_assert_uint_eq(third->req.from_sequence, 2);
    wire_rblock b;
    wire_revent ev = store(0, 0, &b, 4242);
    size_t len;
    uint8_t *body = envelope(0, &ev, 1, &len);
    ck_assert_int_eq(idx_feed_live(f, NULL, body, len, NULL, &r, NULL), KVO_OK);
    kvo_free(body);
    ck_assert(r.held && r.restart);
    const idx_rec_ask *fourth = last_ask(&k);
    ck_assert(fourth->req.dump && fourth->id != third->id);
    ck_assert_uint_eq(k.notes[IDX_REC_RESTART], 2);
    ck_assert_uint_eq(counters(f).live_covered, 3); /* 4 of the old run */
    /* the new run: 1 comes (held: no old sequence counts now) */
    ck_assert_int_eq(live(f, 1, NULL, &r), KVO_OK);
    ck_assert(r.held && !r.duplicate);
    sent = dump_reply(f, fourth, 0, 1, 1, 1, NULL);
    ck_assert_int_eq(end_reply(f, fourth, true, sent, "0", 1), KVO_OK);
    ck_assert(holds(f, 0, 1001) && !holds(f, 0, 4242) && holds(f, 0, 5001));
    ck_assert_uint_eq(last_sequence(f), 1);
    ck_assert_uint_eq(counters(f).recoveries_dump, 2);
    tt_check(idx_feed_tree(f), true);
    idx_feed_free(f);
}
END_TEST

/* An envelope with the relay's publisher id and a sequence 1,000 ahead
 * (spoofed, or corrupt): it waits, the relay answers too_new (it never
 * sent that sequence), it is dropped as impossible, and the genuine
 * envelopes behind it -- held meanwhile -- and after it all apply. Old
 * code moved the sequence to the jump and took every genuine envelope
 * after it for a duplicate. */
START_TEST(a_spoofed_jump_never_hides_genuine_envelopes) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    live_upto(f, 6); /* 0..5 */
    idx_feed_result r;
    ck_assert_int_eq(spoof(f, 1005, &r), KVO_OK);
    ck_assert(r.held && !r.applied);
    ck_assert_uint_eq(r.missed, 999);
    const idx_rec_ask *a = last_ask(&k);
    ck_assert(!a->req.dump);
    ck_assert_uint_eq(a->req.from_sequence, 6);
    ck_assert_str_eq(a->subject, "(none)"); /* no announce, no subject */
    ck_assert_int_eq(live(f, 6, NULL, &r), KVO_OK);
    ck_assert(r.held);
    ck_assert_int_eq(too_new_reply(f, a, "5"), KVO_OK);
    ck_assert(!idx_feed_is_recovering(f));
    ck_assert(holds(f, 0, 1006) && !holds(f, 0, 666));
    for (uint64_t s = 7; s < 10; s++) {
        ck_assert_int_eq(live(f, s, NULL, &r), KVO_OK);
        ck_assert(r.applied && !r.duplicate && !r.held);
    }
    ck_assert_uint_eq(last_sequence(f), 9);
    idx_feed_counters c = counters(f);
    ck_assert_uint_eq(c.impossible_sequences, 1);
    ck_assert_uint_eq(c.recoveries_too_new, 1);
    ck_assert_uint_eq(c.duplicates, 0);
    ck_assert_uint_eq(c.applied, 10);
    ck_assert_uint_eq(k.notes[IDX_REC_IMPOSSIBLE], 1);

    /* the race: the relay went on meanwhile, so it answers the missing
     * ones (10, 11) instead of too_new; the spoofed one is then a gap of
     * its own, answered too_new */
    ck_assert_int_eq(spoof(f, 2000, &r), KVO_OK);
    a = last_ask(&k);
    ck_assert_uint_eq(a->req.from_sequence, 10);
    ck_assert_int_eq(live(f, 10, NULL, &r), KVO_OK);
    ck_assert_int_eq(events_reply(f, a, 10), KVO_OK);
    ck_assert_int_eq(events_reply(f, a, 11), KVO_OK);
    ck_assert_int_eq(end_reply(f, a, false, 2, "11", 0), KVO_OK);
    ck_assert(idx_feed_is_recovering(f)); /* 2000 asks again */
    a = last_ask(&k);
    ck_assert_uint_eq(a->req.from_sequence, 12);
    ck_assert_int_eq(too_new_reply(f, a, "11"), KVO_OK);
    ck_assert(!idx_feed_is_recovering(f));
    ck_assert(holds(f, 0, 1011) && !holds(f, 0, 666));
    ck_assert_int_eq(live(f, 12, NULL, &r), KVO_OK);
    ck_assert(r.applied);
    c = counters(f);
    ck_assert_uint_eq(c.impossible_sequences, 2);
    ck_assert_uint_eq(c.recoveries_events, 1);
    ck_assert_uint_eq(c.duplicates, 1); /* live 10, also recovered */
    ck_assert_uint_eq(last_sequence(f), 12);
    tt_check(idx_feed_tree(f), true);
    idx_feed_free(f);
}
END_TEST

/* A gap (live 6 after 3) asks for 4..; the answer's envelopes apply in
 * order, then the held 6; an announce ahead of what was applied (the tail
 * was lost, no later envelope shows it) asks too. */
START_TEST(a_gap_is_repaired_by_events) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    ck_assert_int_eq(announce(f, "null", STARTED, "[0]"), KVO_OK);
    ck_assert_uint_eq(k.n, 0); /* nothing published yet: nothing to ask */
    live_upto(f, 4);
    idx_feed_result r;
    ck_assert_int_eq(live(f, 6, "60-61", &r), KVO_OK);
    ck_assert(r.held);
    ck_assert_uint_eq(r.missed, 2);
    const idx_rec_ask *a = last_ask(&k);
    ck_assert(!a->req.dump);
    ck_assert_uint_eq(a->req.from_sequence, 4);
    ck_assert_int_eq(events_reply(f, a, 4), KVO_OK);
    ck_assert_int_eq(events_reply(f, a, 5), KVO_OK);
    ck_assert(holds(f, 0, 1005) && !holds(f, 0, 1006));
    ck_assert_int_eq(end_reply(f, a, false, 2, "5", 0), KVO_OK);
    ck_assert(holds(f, 0, 1006));
    ck_assert_uint_eq(last_sequence(f), 6);
    uint64_t zmq;
    ck_assert(idx_feed_zmq_last(f, PUB, &zmq));
    ck_assert_uint_eq(zmq, 61);
    idx_feed_counters c = counters(f);
    ck_assert_uint_eq(c.recoveries_events, 1);
    ck_assert_uint_eq(c.envelopes_recovered, 2);
    ck_assert_uint_eq(c.gaps, 1);
    ck_assert_uint_eq(c.applied, 5);
    /* the tail: the relay published 7 and 8, which never came */
    ck_assert_int_eq(announce(f, "8", STARTED, "[0]"), KVO_OK);
    a = last_ask(&k);
    ck_assert_uint_eq(a->req.from_sequence, 7);
    ck_assert_int_eq(events_reply(f, a, 7), KVO_OK);
    ck_assert_int_eq(events_reply(f, a, 8), KVO_OK);
    ck_assert_int_eq(end_reply(f, a, false, 2, "8", 0), KVO_OK);
    ck_assert(holds(f, 0, 1008));
    ck_assert_uint_eq(counters(f).recoveries_events, 2);
    /* a hole inside an events answer: asked again for a dump */
    ck_assert_int_eq(live(f, 11, NULL, &r), KVO_OK);
    a = last_ask(&k);
    ck_assert_uint_eq(a->req.from_sequence, 9);
    ck_assert_int_eq(events_reply(f, a, 10), KVO_EPROTO);
    ck_assert(last_ask(&k)->req.dump);
    ck_assert_uint_eq(counters(f).recovery_bad, 1);
    tt_check(idx_feed_tree(f), true);
    idx_feed_free(f);
}
END_TEST

/* No end within the timeout (the relay is gone): the publisher's (worker,
 * rank)s -- its announce's and those the tree knows of its worker -- are
 * cleared and listed stale (watermark, health), and counted; its held
 * envelopes apply (no more asking) until its next announce asks for a
 * dump, which rebuilds it and clears stale. NATS's no-responders fails at
 * once. */
START_TEST(recovery_timeout_clears_and_marks_stale) {
    fake k;
    idx_feed_cfg cfg = {.recovery_timeout_ms = 300};
    idx_feed *f = rec_feed(&k, &cfg);
    ck_assert_int_eq(announce(f, "null", STARTED, "[0, 1]"), KVO_OK);
    live_upto(f, 3);
    idx_tree *t = idx_feed_tree(f);
    ck_assert_int_eq(tt_store_bh(t, WORKER, 2, NULL, U64S(9), U64S(9), 1),
                     IDX_EV_OK); /* rank 2 of the worker, known to the tree */
    idx_feed_result r;
    ck_assert_int_eq(live(f, 5, NULL, &r), KVO_OK);
    ck_assert(r.held);
    idx_feed_set_clock(f, 1299);
    ck_assert_uint_eq(idx_feed_tick(f), 0);
    ck_assert_int_eq(live(f, 6, NULL, &r), KVO_OK);
    ck_assert(r.held);
    idx_feed_set_clock(f, 1300);
    ck_assert_uint_eq(idx_feed_tick(f), 1);
    ck_assert(!idx_feed_is_recovering(f));
    /* cleared, then the held 5 and 6 applied */
    ck_assert(!holds(f, 0, 1000) && !holds(f, 0, 1002) && !holds(f, 2, 9));
    ck_assert(holds(f, 0, 1005) && holds(f, 0, 1006));
    ck_assert_uint_eq(tt_blocks(t, WORKER, 1), 0);
    idx_feed_counters c = counters(f);
    ck_assert_uint_eq(c.recovery_failures, 1);
    ck_assert_uint_eq(c.stale_publishers, 1);
    ck_assert_uint_eq(k.notes[IDX_REC_FAILED], 1);
    json_object *h = json_object_new_object();
    ck_assert(idx_json_recovery(f, h));
    tt_json_eq(h, "{\"recovering\":[],\"stale\":[{\"publisher_id\":7,"
                  "\"worker_id\":3,\"dp_rank\":0},{\"publisher_id\":7,"
                  "\"worker_id\":3,\"dp_rank\":1},{\"publisher_id\":7,"
                  "\"worker_id\":3,\"dp_rank\":2}],\"stale_count\":3}");
    json_object *w = idx_json_watermark(f, NULL);
    json_object *p0 = json_object_array_get_idx(tt_json_at(w, "publishers"), 0);
    ck_assert(json_object_get_boolean(tt_json_at(p0, "stale")));
    json_object_put(w);
    /* stale: a gap is counted, not asked */
    size_t asked = k.n;
    ck_assert_int_eq(live(f, 9, NULL, &r), KVO_OK);
    ck_assert(r.applied && r.missed == 2);
    ck_assert_uint_eq(k.n, asked);
    /* the relay is back: a dump heals it */
    ck_assert_int_eq(announce(f, "9", STARTED, "[0, 1]"), KVO_OK);
    const idx_rec_ask *a = last_ask(&k);
    ck_assert(a->req.dump);
    uint64_t sent = dump_reply(f, a, 9, 2, 4, 1, NULL);
    ck_assert_int_eq(end_reply(f, a, true, sent, "9", 4), KVO_OK);
    ck_assert_uint_eq(counters(f).stale_publishers, 0);
    h = json_object_new_object();
    ck_assert(idx_json_recovery(f, h));
    tt_json_eq(h, "{\"recovering\":[],\"stale\":[],\"stale_count\":0}");
    /* nobody listening on the subject: failed at once */
    ck_assert_int_eq(live(f, 12, NULL, &r), KVO_OK);
    a = last_ask(&k);
    ck_assert_int_eq(
        idx_feed_reply(f, PUB, a->id, NULL, NULL, "", 0, true, NULL), KVO_OK);
    ck_assert_uint_eq(counters(f).recovery_failures, 2);
    ck_assert_uint_eq(counters(f).stale_publishers, 1);
    ck_assert(holds(f, 0, 1012) && !holds(f, 0, 5001));
    tt_check(t, true);
    idx_feed_free(f);
}
END_TEST

/* Answers that cannot be used are counted and asked again (for a dump),
 * three requests at most; then the recovery fails. */
START_TEST(malformed_answers_are_counted_and_asked_again) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    live_upto(f, 2);
    idx_feed_result r;
    ck_assert_int_eq(live(f, 4, NULL, &r), KVO_OK);
    const idx_rec_ask *a = last_ask(&k);
    /* no KVO-Recovery header */
    ck_assert_int_eq(reply(f, a, NULL, NULL, "{}", 2), KVO_EPROTO);
    ck_assert_uint_eq(k.n, 2);
    a = last_ask(&k);
    ck_assert(a->req.dump);
    /* an envelope of another publisher */
    size_t len;
    uint8_t *body = tt_envelope(8, 0, WORKER, WIRE_TIER_DEVICE, 1, &len);
    ck_assert_int_eq(reply(f, a, "dump", NULL, body, len), KVO_EPROTO);
    kvo_free(body);
    ck_assert_uint_eq(k.n, 3);
    a = last_ask(&k);
    /* a broken end: the third request was the last */
    ck_assert_int_eq(reply(f, a, "end", NULL, "{\"sent\": -1}", 12),
                     KVO_EPROTO);
    ck_assert_uint_eq(k.n, 3);
    ck_assert(!idx_feed_is_recovering(f));
    idx_feed_counters c = counters(f);
    ck_assert_uint_eq(c.recovery_bad, 3);
    ck_assert_uint_eq(c.recovery_retries, 2);
    ck_assert_uint_eq(c.recovery_failures, 1);
    ck_assert_uint_eq(c.recovery_requests, 3);
    ck_assert(holds(f, 0, 1004) && !holds(f, 0, 1001));
    /* garbage announces are counted */
    ck_assert_int_ne(idx_feed_announce(f, "{", 1, NULL), KVO_OK);
    ck_assert_int_ne(idx_feed_announce(f, "{\"publisher_id\": 1}", 19, NULL),
                     KVO_OK);
    c = counters(f);
    ck_assert_uint_eq(c.announces_bad, 2);
    ck_assert_uint_eq(c.announces, 2);
    idx_feed_free(f);
}
END_TEST

/* The hold is bounded: an envelope that does not fit is counted, and when
 * the held ones are released the hole it left is one more gap, asked for
 * again (nothing is lost for good). */
START_TEST(the_hold_is_bounded) {
    fake k;
    idx_feed_cfg cfg = {.held_max_msgs = 2};
    idx_feed *f = rec_feed(&k, &cfg);
    live_upto(f, 1);
    idx_feed_result r;
    ck_assert_int_eq(live(f, 3, NULL, &r), KVO_OK); /* held: asks 1.. */
    ck_assert(r.held);
    ck_assert_int_eq(live(f, 4, NULL, &r), KVO_OK);
    ck_assert(r.held);
    ck_assert_int_eq(live(f, 5, NULL, &r), KVO_OK);
    ck_assert(!r.held && r.held_dropped && !r.applied);
    const idx_rec_ask *a = last_ask(&k);
    ck_assert_uint_eq(a->req.from_sequence, 1);
    ck_assert_int_eq(events_reply(f, a, 1), KVO_OK);
    ck_assert_int_eq(events_reply(f, a, 2), KVO_OK);
    ck_assert_int_eq(end_reply(f, a, false, 2, "2", 0), KVO_OK);
    ck_assert(holds(f, 0, 1004));
    ck_assert_int_eq(live(f, 6, NULL, &r), KVO_OK); /* 5 is missing */
    ck_assert(r.held);
    a = last_ask(&k);
    ck_assert_uint_eq(a->req.from_sequence, 5);
    ck_assert_int_eq(events_reply(f, a, 5), KVO_OK);
    ck_assert_int_eq(end_reply(f, a, false, 1, "5", 0), KVO_OK);
    ck_assert(holds(f, 0, 1005) && holds(f, 0, 1006));
    idx_feed_counters c = counters(f);
    ck_assert_uint_eq(c.live_held_dropped, 1);
    ck_assert_uint_eq(c.live_held, 3);
    ck_assert_uint_eq(c.recoveries_events, 2);
    idx_feed_free(f);
}
END_TEST

/* A publisher first heard above 0 missed its beginning: a dump (to the
 * recovery subject derived from the subject its envelopes came on). */
START_TEST(first_heard_above_zero_asks_for_a_dump) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    idx_feed_result r;
    ck_assert_int_eq(live(f, 40, NULL, &r), KVO_OK);
    ck_assert(r.held);
    ck_assert_uint_eq(r.missed, 40);
    const idx_rec_ask *a = last_ask(&k);
    ck_assert(a->req.dump);
    ck_assert_str_eq(a->subject,
                     "namespace.dynamo.component.backend.kv-recovery.7");
    uint64_t sent = dump_reply(f, a, 41, 1, 2, 1, "0-99");
    ck_assert_int_eq(end_reply(f, a, true, sent, "41", 2), KVO_OK);
    ck_assert(!holds(f, 0, 1040) && holds(f, 0, 5002));
    ck_assert_uint_eq(last_sequence(f), 41);
    ck_assert_int_eq(live(f, 42, NULL, &r), KVO_OK);
    ck_assert(r.applied);
    ck_assert_uint_eq(counters(f).live_covered, 1);
    /* without recovery (replay, --no-recovery): applied as before */
    idx_feed *g = tt_feed_new();
    ck_assert_int_eq(live(g, 40, NULL, &r), KVO_OK);
    ck_assert(r.applied && !r.held);
    idx_feed_free(g);
    idx_feed_free(f);
}
END_TEST

/* An announce is no proof: one naming a real worker under a publisher id
 * that never fed it, whose recovery fails, lists the worker stale but
 * clears nothing of it. */
START_TEST(a_spoofed_announce_clears_nothing) {
    fake k;
    idx_feed *f = rec_feed(&k, NULL);
    live_upto(f, 2); /* PUB feeds (WORKER, 0) */
    const char *body =
        "{\"publisher_id\": 99, \"worker_id\": 3, \"dp_ranks\": [0],"
        " \"recovery_subject\": \"x\", \"last_sequence\": 5,"
        " \"started_at\": 1, \"heartbeat_ms\": 1000}";
    ck_assert_int_eq(idx_feed_announce(f, body, strlen(body), NULL), KVO_OK);
    const idx_rec_ask *a = last_ask(&k);
    ck_assert_uint_eq(a->publisher_id, 99);
    ck_assert_str_eq(a->subject, "x");
    ck_assert_int_eq(
        idx_feed_reply(f, 99, a->id, NULL, NULL, "", 0, true, NULL), KVO_OK);
    ck_assert_uint_eq(counters(f).recovery_failures, 1);
    ck_assert(holds(f, 0, 1000) && holds(f, 0, 1001));
    json_object *h = json_object_new_object();
    ck_assert(idx_json_recovery(f, h));
    tt_json_eq(h, "{\"recovering\":[],\"stale\":[{\"publisher_id\":99,"
                  "\"worker_id\":3,\"dp_rank\":0}],\"stale_count\":1}");
    idx_feed_free(f);
}
END_TEST

Suite *suite_recover(void) {
    Suite *s = suite_create("recover");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, live_envelopes_wait_while_a_dump_applies);
    tcase_add_test(tc, a_dump_in_several_envelopes_and_one_lost);
    tcase_add_test(tc, a_relay_restart_during_a_dump_starts_over);
    tcase_add_test(tc, a_spoofed_jump_never_hides_genuine_envelopes);
    tcase_add_test(tc, a_gap_is_repaired_by_events);
    tcase_add_test(tc, recovery_timeout_clears_and_marks_stale);
    tcase_add_test(tc, malformed_answers_are_counted_and_asked_again);
    tcase_add_test(tc, the_hold_is_bounded);
    tcase_add_test(tc, first_heard_above_zero_asks_for_a_dump);
    tcase_add_test(tc, a_spoofed_announce_clears_nothing);
    suite_add_tcase(s, tc);
    return s;
}
