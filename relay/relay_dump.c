/* relay_dump.c -- a dump of the forwarded state as a reply stream
 * (docs/recovery.md): envelopes that rebuild the state in an empty index,
 * then the end.
 *
 *   [cleared r0 device][cleared r0 host_pinned]...[cleared r1 device]...
 *   [stored ...]...                                    envelope 1 .. k-1
 *   [stored ...]                    + KVO-Zmq-Seq      envelope k
 *   end {"kind": "dump", "sent": k, "as_of": S, "blocks": B}
 *
 * Each rank is cleared in every tier (an index clears only the tier a
 * cleared names), since the dump then restates every tier's blocks.
 * Every envelope carries the relay's publisher id and sequence as_of (the
 * last envelope published before the dump) and is cut so that the whole
 * message (envelope plus headers) stays under max_payload: the room is
 * counted with upper bounds per envelope, event and block (wire_plane.c's
 * encoder bounds, repeated below), and an envelope is checked once encoded.
 * Stored events follow relay_state_walk (parents first); consecutive blocks
 * merge into one event while the chain continues, as the live stream does,
 * and within DESIGN §6's 128 events / 8192 blocks per envelope. Dump events
 * carry the worker's last event id: they restate events, they are not new
 * ones.
 *
 * One encoded envelope is held back until the next exists, so the last one
 * is known when it is sent and gets the watermark header. Pure: no sockets.
 */
#include "relay_int.h"

#include <string.h>

/* Upper bounds of the encoding (wire_plane.c's ENC_*): an envelope without
 * its events (and with the topic "kv-events"), a RouterEvent without its
 * blocks, a stored block. */
#define BOUND_ENVELOPE (96u + 16u)
#define BOUND_EVENT 160u
#define BOUND_BLOCK 57u

static const char envelope_topic[] = "kv-events";

typedef struct dump {
    const relay_dump_cfg *c;
    relay_reply_fn reply;
    void *ctx;
    size_t budget;    /* bytes an envelope may take */
    wire_revent *ev;  /* c->max_events */
    wire_rblock *blk; /* c->max_blocks */
    uint32_t nev, nblk;
    size_t room;        /* bound of the envelope being filled */
    kvo_buf held, next; /* the encoded envelope held back, and scratch */
    bool has_held;
    relay_dump_result *res;
} dump;

/* Send the envelope held back (the last one gets the watermark). */
static kvo_status send_held(dump *d, bool last) {
    if (!d->has_held) return KVO_OK;
    const relay_dump_cfg *c = d->c;
    bool hr = last && c->has_wm;
    kvo_status st = d->reply(d->ctx, WIRE_REPLY_DUMP, hr, hr ? c->wm_first : 0,
                             hr ? c->wm_last : 0, d->held.data, d->held.len);
    if (st != KVO_OK) return st;
    d->has_held = false;
    d->res->sent++;
    return KVO_OK;
}

/* Encode the envelope being filled, send the one held back, hold this. */
static kvo_status cut(dump *d) {
    if (d->nev == 0) return KVO_OK;
    const relay_dump_cfg *c = d->c;
    wire_plane_msg m;
    memset(&m, 0, sizeof(m));
    m.publisher_id = c->publisher_id;
    m.sequence = c->as_of;
    m.published_at = c->published_at_ms;
    m.topic.p = envelope_topic;
    m.topic.len = sizeof(envelope_topic) - 1;
    m.n_events = d->nev;
    m.events = d->ev;
    kvo_buf_reset(&d->next);
    kvo_status st = wire_plane_encode(&m, &d->next);
    if (st != KVO_OK) return st;
    if (d->next.len > d->budget) return KVO_ETOOBIG; /* a bound is wrong */
    if ((st = send_held(d, false)) != KVO_OK) return st;
    kvo_buf t = d->held;
    d->held = d->next;
    d->next = t;
    d->has_held = true;
    d->nev = d->nblk = 0;
    d->room = BOUND_ENVELOPE;
    return KVO_OK;
}

static wire_revent *new_event(dump *d, wire_rtype type, uint32_t rank,
                              wire_tier tier) {
    wire_revent *e = &d->ev[d->nev++];
    memset(e, 0, sizeof(*e));
    e->worker_id = d->c->worker_id;
    e->tier = tier;
    e->event_id = d->c->event_id;
    e->dp_rank = rank;
    e->type = type;
    d->room += BOUND_EVENT;
    return e;
}

static kvo_status add_cleared(dump *d, uint32_t rank, wire_tier tier) {
    if (d->nev == d->c->max_events || d->room + BOUND_EVENT > d->budget) {
        kvo_status st = cut(d);
        if (st != KVO_OK) return st;
    }
    new_event(d, WIRE_R_CLEARED, rank, tier);
    return KVO_OK;
}

static kvo_status add_block(void *ctx, const relay_state_block *b) {
    dump *d = ctx;
    bool has_parent = b->has_parent && !b->orphan;
    for (;;) {
        wire_revent *last = d->nev ? &d->ev[d->nev - 1] : NULL;
        bool merge = last && last->type == WIRE_R_STORED &&
                     last->dp_rank == b->rank && last->tier == b->tier &&
                     has_parent &&
                     last->blocks[last->n_blocks - 1].block_hash == b->parent;
        size_t need = BOUND_BLOCK + (merge ? 0 : BOUND_EVENT);
        bool full = d->nblk == d->c->max_blocks ||
                    (!merge && d->nev == d->c->max_events) ||
                    d->room + need > d->budget;
        if (full) {
            if (d->nev == 0) return KVO_ETOOBIG; /* one block cannot fit */
            kvo_status st = cut(d);
            if (st != KVO_OK) return st;
            continue;
        }
        if (!merge) {
            last = new_event(d, WIRE_R_STORED, b->rank, b->tier);
            last->has_parent = has_parent;
            last->parent_hash = has_parent ? b->parent : 0;
            last->blocks = &d->blk[d->nblk];
        }
        d->blk[d->nblk++] = (wire_rblock){b->hash, b->tokens_hash};
        last->n_blocks++;
        d->room += BOUND_BLOCK;
        d->res->blocks++;
        d->res->orphans += b->orphan;
        return KVO_OK;
    }
}

kvo_status relay_dump_send(const relay_dump_cfg *c, relay_state *state,
                           relay_reply_fn reply, void *ctx,
                           relay_dump_result *res) {
    memset(res, 0, sizeof(*res));
    dump d = {
        .c = c, .reply = reply, .ctx = ctx, .res = res, .room = BOUND_ENVELOPE};
    size_t need =
        BOUND_ENVELOPE + BOUND_EVENT + BOUND_BLOCK + RELAY_REPLY_HEADER_ROOM;
    if (c->max_payload < need || c->max_events == 0 || c->max_blocks == 0)
        return KVO_ETOOBIG;
    d.budget = c->max_payload - RELAY_REPLY_HEADER_ROOM;
    kvo_buf_init(&d.held);
    kvo_buf_init(&d.next);
    d.ev = kvo_calloc(c->max_events, sizeof(*d.ev));
    d.blk = kvo_calloc(c->max_blocks, sizeof(*d.blk));
    kvo_status st = d.ev && d.blk ? KVO_OK : KVO_ENOMEM;
    for (size_t i = 0; i < c->n_ranks && st == KVO_OK; i++)
        for (int t = 0; t < WIRE_TIER_COUNT && st == KVO_OK; t++)
            st = add_cleared(&d, c->ranks[i], (wire_tier)t);
    if (st == KVO_OK) st = relay_state_walk(state, add_block, &d);
    if (st == KVO_OK) st = cut(&d);
    if (st == KVO_OK) st = send_held(&d, true);
    kvo_buf_fini(&d.held);
    kvo_buf_fini(&d.next);
    kvo_free(d.ev);
    kvo_free(d.blk);
    return st;
}
