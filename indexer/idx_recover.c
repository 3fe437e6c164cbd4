/* idx_recover.c -- the indexer's side of event-plane recovery
 * (docs/recovery.md): relays are the source of truth for their workers, and
 * the feed asks them for what it missed. A pure core: no sockets, no clock
 * (the feed's clock is the time), requests leave through io.ask and the
 * caller hands back announces, reply messages and ticks.
 *
 * Per tracked publisher (idx_pub), on top of the sequence state of
 * idx_feed.c (last, seen, whole, the ring of bodies):
 *
 *            gap, first heard above 0,             +------------------+
 *            announce ahead or restarted,          |   asking (id)    |
 *   idle ------- stale + announce --- ask ------->| live envelopes   |
 *    ^  ^                                         |   are held       |
 *    |  |       end (events | dump) / too_new     +------------------+
 *    |  +---------- done: release held <------------|  |  |
 *    |                                               |  |  | short, malformed
 *    |        no end in time / nobody answers        |  |  +-- ask a dump
 *    +-- stale <- clear the slots, release held <----+  |     (3 requests at
 *                                                       |      most, then fail)
 *            relay restarted (new started_at, or an     |
 *            envelope back at 0 / another body) --------+-- drop held, ask a
 *                                                          dump, hold all
 *
 * Live envelope rule (idx_rec_live), sequence s, last applied L:
 *   asking            s <= L (not a restart episode): a duplicate is
 *                     dropped, 0 or a remembered other body is a restart
 *                     (above); anything else is held, in arrival order
 *   first heard, 0    applied: the publisher is whole from 0
 *   first heard, > 0  a gap (0..s-1 missed): held, ask a dump
 *   s == L + 1        applied
 *   s > L + 1         a gap: held (the jumped envelope), ask from L + 1
 *                     (a dump when the publisher is not whole)
 *   s <= L            idx_feed.c's rule: duplicate, or restart (applied)
 * So a jump never moves L: nothing genuine behind it is taken for a
 * duplicate. The hold is bounded (held_max_msgs per publisher,
 * held_max_bytes in all); an envelope that does not fit is counted
 * (live_held_dropped) and shows up as a gap when the held ones are
 * released, which asks again.
 *
 * Answers (idx_feed_reply), each resetting the timeout:
 *   events    the next sequence, applied through the sequence rule
 *   dump      applied as it comes (it starts with a cleared per rank);
 *             every envelope carries as_of; the last one's KVO-Zmq-Seq is
 *             the watermark
 *   end       sent must equal the envelopes received, else the answer lost
 *             messages: ask a dump. A dump's end rebases the publisher:
 *             L = as_of, whole, a fresh ring; held envelopes at or below
 *             as_of are covered (live_covered), the rest released
 *   too_new   nothing was missed: the jumped envelope is impossible
 *             (dropped, counted), the rest released
 * Released envelopes go through the live rule again in sequence order (a
 * bogus jump sorts last), so a second gap among them asks again.
 *
 * Failure (no answer for recovery_timeout_ms, or NATS says nobody listens
 * on the subject): every (worker, rank) of the publisher -- its announce's
 * worker and ranks, and the ranks the tree knows of the worker ids its
 * envelopes named -- is listed stale, and those of workers its envelopes
 * fed are cleared (a spoofed announce alone clears nothing); held
 * envelopes are
 * released under idx_feed.c's rule (no more asking) until an announce
 * shows the relay again, which asks a dump; a dump applied whole clears
 * stale.
 */
#include "idx_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define REC_ATTEMPTS 3 /* requests per episode before it fails */
#define HELD_FIRST_CAP 16
#define SUBJECT_MAX 512 /* longest recovery subject kept */
static const char events_suffix[] = ".kv-events";

static uint64_t sat_add(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static void note(idx_feed *f, idx_rec_note n) {
    if (f->io.note) f->io.note(f->io.ctx, &n);
}

void idx_feed_recovery(idx_feed *f, const idx_rec_io *io) {
    f->recovery = io && io->ask;
    if (f->recovery)
        f->io = *io;
    else
        memset(&f->io, 0, sizeof(f->io));
}

void idx_feed_discovering(idx_feed *f, uint64_t until_ms) {
    f->discover_until_ms = until_ms;
}

bool idx_feed_is_recovering(const idx_feed *f) {
    if (f->now_ms < f->discover_until_ms) return true;
    for (size_t i = 0; i < f->npubs; i++)
        if (f->pubs[i]->rec.asking) return true;
    return false;
}

/* ---- The hold -------------------------------------------------------------*/

static void held_drop(idx_feed *f, idx_rec *rc, size_t i) {
    f->held_bytes -= rc->held[i].len;
    rc->held_bytes -= rc->held[i].len;
    kvo_free(rc->held[i].body);
}

/* Drop every held envelope; returns how many. */
static size_t held_clear(idx_feed *f, idx_rec *rc) {
    size_t n = rc->n_held;
    for (size_t i = 0; i < n; i++) held_drop(f, rc, i);
    rc->n_held = 0;
    return n;
}

void idx_rec_fini(idx_feed *f, idx_pub *p) {
    held_clear(f, &p->rec);
    kvo_free(p->rec.held);
    p->rec.held = NULL;
    p->rec.cap_held = 0;
}

/* Keep a copy of a live envelope; false (counted) when it does not fit. */
static bool hold(idx_feed *f, idx_pub *p, uint64_t seq, const uint8_t *body,
                 size_t len, const char *hdr, bool released,
                 idx_feed_result *r) {
    idx_rec *rc = &p->rec;
    uint8_t *copy = NULL;
    if (rc->n_held >= f->held_max_msgs ||
        len > f->held_max_bytes - f->held_bytes ||
        kvo_grow(&rc->held, &rc->cap_held, rc->n_held + 1, sizeof(*rc->held),
                 HELD_FIRST_CAP) != KVO_OK ||
        !(copy = kvo_malloc(len ? len : 1))) {
        f->c.live_held_dropped++;
        r->held_dropped = true;
        return false;
    }
    memcpy(copy, body, len);
    idx_held *h = &rc->held[rc->n_held++];
    memset(h, 0, sizeof(*h));
    h->seq = seq;
    h->order = rc->held_order++;
    h->body = copy;
    h->len = len;
    if (hdr) {
        h->has_hdr = true;
        if (strlen(hdr) < sizeof(h->hdr))
            strcpy(h->hdr, hdr);
        else
            strcpy(h->hdr, "x"); /* too long to be "A-B": malformed */
    }
    rc->held_bytes += len;
    f->held_bytes += len;
    if (!released) f->c.live_held++;
    r->held = true;
    return true;
}

static int by_seq(const void *a, const void *b) {
    const idx_held *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Put the held envelopes through the live rule again, in sequence order;
 * when covered, those at or below upto are dropped: a dump covered them. */
static void release(idx_feed *f, idx_pub *p, bool covered, uint64_t upto) {
    idx_rec *rc = &p->rec;
    idx_held *v = rc->held;
    size_t n = rc->n_held;
    rc->held = NULL;
    rc->n_held = rc->cap_held = rc->held_bytes = 0;
    rc->held_order = 0;
    if (n > 1) qsort(v, n, sizeof(*v), by_seq);
    for (size_t i = 0; i < n; i++) {
        idx_held *h = &v[i];
        f->held_bytes -= h->len;
        if (covered && h->seq <= upto) {
            f->c.live_covered++;
        } else {
            idx_feed_result r;
            memset(&r, 0, sizeof(r));
            if (wire_plane_decode(h->body, h->len, &f->lim, &f->msg, NULL) ==
                KVO_OK)
                idx_feed_live_decoded(f, NULL, h->body, h->len,
                                      h->has_hdr ? h->hdr : NULL, true, &r);
            else
                f->c.enomem++; /* it decoded once: only memory fails now */
        }
        kvo_free(h->body);
    }
    kvo_free(v);
}

/* ---- Episodes ----------------------------------------------------------*/

static void set_asking(idx_pub *p, bool on) {
    p->rec.asking = on;
    p->p.recovering = on;
}

static void ask(idx_feed *f, idx_pub *p, bool dump, uint64_t from) {
    idx_rec *rc = &p->rec;
    set_asking(p, true);
    rc->dump = dump;
    rc->from = from;
    rc->id = ++f->next_id;
    rc->got = 0;
    rc->has_as_of = rc->has_zmq = false;
    rc->attempts++;
    rc->deadline_ms = f->now_ms + f->rec_timeout_ms;
    f->c.recovery_requests++;
    idx_rec_ask a = {.publisher_id = p->p.publisher_id,
                     .id = rc->id,
                     .subject = p->relay.subject,
                     .req = {.dump = dump, .from_sequence = from}};
    note(f, (idx_rec_note){.what = IDX_REC_ASKED,
                           .publisher_id = p->p.publisher_id,
                           .kind = dump ? WIRE_REPLY_DUMP : WIRE_REPLY_EVENTS,
                           .sequence = from});
    f->io.ask(f->io.ctx, &a);
}

/* A new episode (p is not asking). */
static void begin(idx_feed *f, idx_pub *p, bool dump, uint64_t from,
                  bool restarting) {
    idx_rec *rc = &p->rec;
    rc->begun_ms = f->now_ms;
    rc->attempts = 0;
    rc->restarting = restarting;
    rc->has_jump = false;
    ask(f, p, dump, from);
}

/* The recovery subject derived from the subject p's envelopes came on:
 * <p>.kv-events -> <p>.kv-recovery.<publisher_id> (kept unless an announce
 * said better). */
static void derive_subject(idx_pub *p, const char *subject) {
    if (p->relay.subject || !subject) return;
    size_t n = strlen(subject), k = sizeof(events_suffix) - 1;
    if (n <= k || n > SUBJECT_MAX || strcmp(subject + n - k, events_suffix))
        return;
    char buf[SUBJECT_MAX + 64];
    int w = snprintf(buf, sizeof(buf), "%.*s.kv-recovery.%" PRIu64,
                     (int)(n - k), subject, p->p.publisher_id);
    if (w < 0 || (size_t)w >= sizeof(buf)) return;
    p->relay.subject = kvo_malloc((size_t)w + 1);
    if (p->relay.subject) memcpy(p->relay.subject, buf, (size_t)w + 1);
}

static void ring_reset(idx_pub *p) {
    for (int i = 0; i < IDX_RING; i++) p->ring_seq[i] = UINT64_MAX;
}

/* The relay restarted: its sequences start again, so nothing held or
 * remembered means anything; a dump of the new run rebuilds it. */
static void restart(idx_feed *f, idx_pub *p) {
    f->c.live_covered += held_clear(f, &p->rec);
    p->seen = p->whole = false;
    p->jump = IDX_JUMP_NONE;
    ring_reset(p);
    set_asking(p, false); /* the old request's answers are strays now */
    note(f, (idx_rec_note){.what = IDX_REC_RESTART,
                           .publisher_id = p->p.publisher_id});
    begin(f, p, true, 0, true);
}

static void finish(idx_feed *f, idx_pub *p, wire_reply_kind how) {
    idx_rec *rc = &p->rec;
    uint64_t ms = f->now_ms - rc->begun_ms;
    set_asking(p, false);
    f->c.recovery_ms_total = sat_add(f->c.recovery_ms_total, ms);
    if (ms > f->c.recovery_ms_max) f->c.recovery_ms_max = ms;
    if (how == WIRE_REPLY_EVENTS)
        f->c.recoveries_events++;
    else if (how == WIRE_REPLY_DUMP)
        f->c.recoveries_dump++;
    else
        f->c.recoveries_too_new++;
    note(f, (idx_rec_note){.what = IDX_REC_DONE,
                           .publisher_id = p->p.publisher_id,
                           .kind = how,
                           .sequence = rc->as_of,
                           .count = rc->got,
                           .ms = ms});
    bool dump = how == WIRE_REPLY_DUMP;
    release(f, p, dump && p->seen, p->p.last_sequence);
}

/* Did p's own envelopes name worker_id? */
static bool fed(const idx_pub *p, uint64_t worker_id) {
    for (uint32_t k = 0; k < p->n_workers; k++)
        if (p->workers[k] == worker_id) return true;
    return false;
}

/* Add (w, r) to v unless there. */
static kvo_status slot_add(idx_slot **v, size_t *n, size_t *cap, uint64_t w,
                           uint32_t r) {
    for (size_t i = 0; i < *n; i++)
        if ((*v)[i].worker_id == w && (*v)[i].dp_rank == r) return KVO_OK;
    kvo_status s = kvo_grow(v, cap, *n + 1, sizeof(**v), 8);
    if (s == KVO_OK) (*v)[(*n)++] = (idx_slot){w, r};
    return s;
}

/* p's (worker, rank)s: its announce's, and the ranks the tree knows of the
 * worker ids its envelopes named. */
static size_t slots_of(const idx_feed *f, const idx_pub *p, idx_slot **out) {
    idx_slot *v = NULL;
    size_t n = 0, cap = 0;
    if (p->relay.announced)
        for (uint32_t i = 0; i < p->relay.n_ranks; i++)
            slot_add(&v, &n, &cap, p->relay.worker_id, p->relay.ranks[i]);
    idx_worker *w = NULL;
    size_t nw = 0;
    if (idx_tree_workers(f->tree, &w, &nw) == KVO_OK) {
        for (size_t i = 0; i < nw; i++) {
            if (fed(p, w[i].worker_id) ||
                (p->relay.announced && w[i].worker_id == p->relay.worker_id))
                slot_add(&v, &n, &cap, w[i].worker_id, w[i].dp_rank);
        }
        kvo_free(w);
    }
    *out = v;
    return n;
}

/* Every slot of p is listed stale; only those of workers its own
 * envelopes fed are cleared (an announce alone, which anyone can send,
 * never clears a worker). */
static void fail(idx_feed *f, idx_pub *p, const char *why) {
    set_asking(p, false);
    f->c.recovery_failures++;
    idx_slot *v;
    size_t n = slots_of(f, p, &v);
    for (size_t i = 0; i < n; i++) {
        if (!fed(p, v[i].worker_id)) continue;
        if (idx_tree_rank_clear(f->tree, v[i].worker_id, v[i].dp_rank) !=
            KVO_OK)
            f->c.enomem++;
    }
    f->gen++;
    kvo_free(p->stale);
    p->stale = v;
    p->n_stale = n;
    p->p.stale = true;
    p->whole = false;
    note(f, (idx_rec_note){.what = IDX_REC_FAILED,
                           .publisher_id = p->p.publisher_id,
                           .count = n,
                           .why = why});
    release(f, p, false, 0);
}

/* An answer that cannot be used: ask again for a dump (which rebuilds
 * whatever part of the answer was applied), or fail after REC_ATTEMPTS. */
static void retry(idx_feed *f, idx_pub *p, const char *why) {
    if (p->rec.attempts >= REC_ATTEMPTS) {
        fail(f, p, why);
        return;
    }
    f->c.recovery_retries++;
    note(f, (idx_rec_note){.what = IDX_REC_RETRY,
                           .publisher_id = p->p.publisher_id,
                           .kind = WIRE_REPLY_DUMP,
                           .why = why});
    ask(f, p, true, 0);
}

static kvo_status bad(idx_feed *f, idx_pub *p, kvo_status s, kvo_err *err,
                      const char *why) {
    f->c.recovery_bad++;
    if (s == KVO_OK)
        s = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "%s", why);
    retry(f, p, why);
    return s;
}

/* ---- Live envelopes -------------------------------------------------------*/

static idx_rec_act held_act(idx_feed *f, idx_pub *p, uint64_t seq,
                            const uint8_t *body, size_t len, const char *hdr,
                            bool released, idx_feed_result *r) {
    hold(f, p, seq, body, len, hdr, released, r);
    return IDX_REC_HOLD;
}

static void gap(idx_pub *p, uint64_t missed, idx_feed_result *r) {
    r->missed = missed;
    p->p.gaps++;
    p->p.missed = sat_add(p->p.missed, missed);
}

idx_rec_act idx_rec_live(idx_feed *f, idx_pub *p, bool fresh, uint64_t seq,
                         uint64_t hash, const uint8_t *body, size_t len,
                         const char *zmq_seq, const char *subject,
                         bool released, idx_feed_result *r) {
    idx_rec *rc = &p->rec;
    uint64_t last = p->p.last_sequence;
    p->heard_ms = f->now_ms;
    fresh = fresh || !p->seen;
    if (rc->asking) {
        if (!fresh && !rc->restarting && seq <= last) {
            bool remembered = p->ring_seq[seq % IDX_RING] == seq;
            if (remembered && p->ring_hash[seq % IDX_RING] == hash) {
                p->p.duplicates++;
                r->duplicate = true;
                return IDX_REC_DROP;
            }
            if (remembered || seq == 0) { /* another run's envelope */
                p->p.restarts++;
                r->restart = true;
                restart(f, p);
                return held_act(f, p, seq, body, len, zmq_seq, released, r);
            }
            p->p.duplicates++; /* an old one */
            r->duplicate = true;
            return IDX_REC_DROP;
        }
        return held_act(f, p, seq, body, len, zmq_seq, released, r);
    }
    if (fresh) {
        if (seq == 0)
            return idx_feed_track(f, p, true, seq, hash, r) ? IDX_REC_APPLY
                                                            : IDX_REC_DROP;
        gap(p, seq, r);
        derive_subject(p, subject);
        begin(f, p, true, 0, false);
        return held_act(f, p, seq, body, len, zmq_seq, released, r);
    }
    if (seq > last && seq - last > 1) {
        gap(p, seq - last - 1, r);
        derive_subject(p, subject);
        begin(f, p, !p->whole, last + 1, false);
        rc->has_jump = true;
        rc->jump_seq = seq;
        return held_act(f, p, seq, body, len, zmq_seq, released, r);
    }
    return idx_feed_track(f, p, false, seq, hash, r) ? IDX_REC_APPLY
                                                     : IDX_REC_DROP;
}

/* ---- Announces ------------------------------------------------------------*/

/* What the announce says of the relay into p->relay; false out of
 * memory (then p->relay is as it was). */
static bool relay_update(idx_pub *p, const wire_announce *a) {
    idx_relay *rl = &p->relay;
    if (rl->n_ranks != a->n_ranks) {
        uint32_t *r = NULL;
        if (a->n_ranks && !(r = kvo_malloc(a->n_ranks * sizeof(*r))))
            return false;
        kvo_free(rl->ranks);
        rl->ranks = r;
        rl->n_ranks = a->n_ranks;
    }
    for (uint32_t i = 0; i < a->n_ranks; i++)
        rl->ranks[i] = (uint32_t)a->ranks[i];
    size_t n = strlen(a->recovery_subject);
    if (n <= SUBJECT_MAX &&
        (!rl->subject || strcmp(rl->subject, a->recovery_subject) != 0)) {
        char *s = kvo_malloc(n + 1);
        if (!s) return false;
        memcpy(s, a->recovery_subject, n + 1);
        kvo_free(rl->subject);
        rl->subject = s;
    }
    rl->worker_id = a->worker_id;
    return true;
}

kvo_status idx_feed_announce(idx_feed *f, const void *body, size_t len,
                             kvo_err *err) {
    f->c.announces++;
    wire_announce a;
    kvo_status s = wire_announce_decode(&f->doc, body, len, &a, err);
    if (s != KVO_OK) {
        f->c.announces_bad++;
        return s;
    }
    if (!f->recovery) return KVO_OK;
    idx_pub *p;
    bool fresh;
    if ((s = idx_feed_pub_get(f, a.publisher_id, &p, &fresh)) != KVO_OK)
        return s;
    if (!p) { /* the table is full: this relay goes untracked */
        f->c.publishers_refused++;
        return KVO_OK;
    }
    p->heard_ms = f->now_ms;
    idx_relay *rl = &p->relay;
    bool first = !rl->announced;
    if (!first && a.started_at_ms < rl->started_at_ms) return KVO_OK; /* late */
    if (!relay_update(p, &a)) return KVO_ENOMEM;
    rl->announced = true;
    if (!first && a.started_at_ms > rl->started_at_ms) {
        rl->started_at_ms = a.started_at_ms;
        p->p.restarts++;
        f->c.restarts++;
        if (!(p->rec.asking && p->rec.restarting)) restart(f, p);
        return KVO_OK;
    }
    rl->started_at_ms = a.started_at_ms;
    if (p->rec.asking) return KVO_OK;
    if (p->p.stale)
        begin(f, p, true, 0, false);
    else if (!a.has_last)
        return KVO_OK;
    else if (!p->seen || !p->whole)
        begin(f, p, true, 0, false);
    else if (a.last_sequence > p->p.last_sequence)
        begin(f, p, false, p->p.last_sequence + 1, false);
    return KVO_OK;
}

/* ---- Answers --------------------------------------------------------------*/

/* Count what applying a recovered envelope did (it is no live message:
 * messages and applied stay as they were). */
static void count_recovered(idx_feed *f, const idx_feed_result *r) {
    f->c.other_tier += r->other_tier;
    f->c.enomem += r->lost;
    f->c.bad_headers += r->bad_header;
}

static kvo_status got_event(idx_feed *f, idx_pub *p, const void *body,
                            size_t len, const char *zmq_seq, kvo_err *err) {
    idx_rec *rc = &p->rec;
    uint64_t seq = f->msg.sequence, last = p->p.last_sequence;
    if (p->seen && seq <= last) return KVO_OK; /* had it already */
    if (p->seen ? seq - last != 1 : seq != rc->from)
        return bad(f, p, KVO_OK, err, "a hole in an events answer");
    idx_feed_result r;
    memset(&r, 0, sizeof(r));
    idx_feed_track(f, p, false, seq, XXH3_64bits(body, len), &r);
    kvo_status s = idx_feed_apply_events(f, p, &r, NULL);
    if (zmq_seq) idx_feed_zmq_header(p, zmq_seq, &r); /* after: pauses */
    count_recovered(f, &r);
    return s;
}

static kvo_status got_dump(idx_feed *f, idx_pub *p, const char *zmq_seq,
                           kvo_err *err) {
    idx_rec *rc = &p->rec;
    uint64_t seq = f->msg.sequence;
    if (rc->has_as_of && seq != rc->as_of)
        return bad(f, p, KVO_OK, err, "dump envelopes of different sequences");
    rc->has_as_of = true;
    rc->as_of = seq;
    idx_feed_result r;
    memset(&r, 0, sizeof(r));
    if (zmq_seq) {
        uint64_t a, b;
        if (idx_feed_parse_zmq(zmq_seq, &a, &b)) {
            rc->has_zmq = true;
            rc->zmq_first = a;
            rc->zmq_last = b;
        } else {
            r.bad_header = true;
        }
    }
    uint64_t blocks = 0;
    kvo_status s = idx_feed_apply_events(f, p, &r, &blocks);
    f->c.dump_blocks_applied += blocks;
    count_recovered(f, &r);
    return s;
}

/* The dump is whole: p is as of its as_of (none: the relay had published
 * nothing, and the next envelope is 0). */
static void rebase(idx_feed *f, idx_pub *p, bool has_as_of, uint64_t as_of) {
    idx_rec *rc = &p->rec;
    p->seen = has_as_of;
    p->p.last_sequence = has_as_of ? as_of : 0;
    p->whole = true;
    p->jump = IDX_JUMP_NONE;
    ring_reset(p);
    if (rc->has_zmq) {
        p->p.has_zmq = true;
        p->p.zmq_first = rc->zmq_first;
        p->p.zmq_last = rc->zmq_last;
    }
    rc->as_of = as_of;
    kvo_free(p->stale);
    p->stale = NULL;
    p->n_stale = 0;
    p->p.stale = false;
    f->c.dumps_applied++;
}

/* too_new: the jumped envelope that started the episode was never sent. */
static void drop_impossible(idx_feed *f, idx_pub *p) {
    idx_rec *rc = &p->rec;
    if (!rc->has_jump) return;
    size_t k = 0;
    for (size_t i = 0; i < rc->n_held; i++) {
        if (rc->held[i].seq == rc->jump_seq) {
            held_drop(f, rc, i);
            f->c.impossible_sequences++;
            note(f, (idx_rec_note){.what = IDX_REC_IMPOSSIBLE,
                                   .publisher_id = p->p.publisher_id,
                                   .sequence = rc->jump_seq});
            continue;
        }
        rc->held[k++] = rc->held[i];
    }
    rc->n_held = k;
}

static kvo_status got_end(idx_feed *f, idx_pub *p, wire_reply_kind k,
                          const void *body, size_t len, kvo_err *err) {
    idx_rec *rc = &p->rec;
    wire_reply_end e;
    kvo_status s = wire_reply_end_decode(&f->doc, k, body, len, &e, err);
    if (s != KVO_OK) return bad(f, p, s, err, "an unreadable end of answer");
    if (k == WIRE_REPLY_TOO_NEW) {
        if (rc->dump)
            return bad(f, p, KVO_OK, err, "too_new answering a dump request");
        drop_impossible(f, p);
        finish(f, p, WIRE_REPLY_TOO_NEW);
        return KVO_OK;
    }
    if ((e.kind == WIRE_REPLY_DUMP) != rc->dump)
        return bad(f, p, KVO_OK, err, "an end of another kind of answer");
    if (e.sent != rc->got) {
        kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                    "end says %" PRIu64 " envelopes, %" PRIu64 " came", e.sent,
                    rc->got);
        f->c.recovery_bad++;
        retry(f, p, "messages of the answer were lost (end's sent differs)");
        return KVO_EPROTO;
    }
    if (!rc->dump) {
        finish(f, p, WIRE_REPLY_EVENTS);
        return KVO_OK;
    }
    if (rc->has_as_of && (!e.has_as_of || e.as_of != rc->as_of))
        return bad(f, p, KVO_OK, err, "a dump's end with another as_of");
    rebase(f, p, e.has_as_of, e.as_of);
    finish(f, p, WIRE_REPLY_DUMP);
    return KVO_OK;
}

kvo_status idx_feed_reply(idx_feed *f, uint64_t publisher_id, uint64_t id,
                          const char *kind, const char *zmq_seq,
                          const void *body, size_t len, bool no_responders,
                          kvo_err *err) {
    idx_pub *p = idx_feed_pub(f, publisher_id);
    if (!p || !p->rec.asking || p->rec.id != id) {
        f->c.recovery_stray++;
        return KVO_OK;
    }
    idx_rec *rc = &p->rec;
    rc->deadline_ms = f->now_ms + f->rec_timeout_ms;
    p->heard_ms = f->now_ms;
    if (no_responders) {
        fail(f, p, "nobody listens on its recovery subject");
        return KVO_OK;
    }
    wire_reply_kind k;
    if (!kind || wire_reply_kind_parse(kind, &k) != KVO_OK)
        return bad(f, p, KVO_OK, err,
                   "a reply without a valid KVO-Recovery header");
    if (k == WIRE_REPLY_END || k == WIRE_REPLY_TOO_NEW)
        return got_end(f, p, k, body, len, err);
    if ((k == WIRE_REPLY_DUMP) != rc->dump)
        return bad(f, p, KVO_OK, err, "an envelope of another kind of answer");
    f->c.envelopes_recovered++;
    rc->got++;
    kvo_status s = wire_plane_decode(body, len, &f->lim, &f->msg, err);
    if (s != KVO_OK)
        return bad(f, p, s, err, "an undecodable envelope in an answer");
    if (f->msg.publisher_id != publisher_id)
        return bad(f, p, KVO_OK, err,
                   "an envelope of another publisher in an answer");
    return k == WIRE_REPLY_EVENTS ? got_event(f, p, body, len, zmq_seq, err)
                                  : got_dump(f, p, zmq_seq, err);
}

size_t idx_feed_tick(idx_feed *f) {
    if (!f->recovery) return 0;
    size_t n = 0;
    for (size_t i = 0; i < f->npubs; i++) {
        idx_pub *p = f->pubs[i];
        if (p->rec.asking && f->now_ms >= p->rec.deadline_ms) {
            fail(f, p, "no answer within the recovery timeout");
            n++;
        }
    }
    return n;
}
