/* relay_ring.c -- the relay's last envelopes, kept for recovery requests
 * (docs/recovery.md): each one's bytes exactly as published and the
 * KVO-Zmq-Seq header it went with.
 *
 *   e[0..cap): a circular array of slots; e[head] is the oldest of the n
 *   held, and their sequences run without a hole from e[head].seq to the
 *   newest.
 *
 *   buf[0..buf_cap): the bodies, each in one piece (a reply sends it as
 *   is), one after the other in the order pushed, in passes from 0:
 *
 *     0                     wr                                   buf_cap
 *     | this pass ... newest | free | oldest ... (last pass) | unused |
 *
 *   The next body goes at wr, over the oldest ones it meets. One that
 *   does not fit before buf_cap starts a new pass at 0: what is left of
 *   the last pass (from wr on) is dropped, and the end of this one stays
 *   unused. Until the first pass ends, buf doubles instead, up to
 *   max_bytes.
 *
 * Bounded twice: at most max_n envelopes and max_bytes of bodies, buf
 * itself included (the tail a pass leaves unused counts against it); the
 * oldest go first. An envelope the ring cannot keep (larger than max_bytes
 * alone, out of memory, or not the one after the newest) empties it, so
 * whatever the ring holds is always a whole run up to the last envelope
 * pushed: "holds s" means it can send s and everything after it.
 *
 * One buffer written over in place: a push copies the body and allocates
 * nothing once the buffer has grown. A buffer per body (even reusing the
 * one of an envelope dropped) had the relay allocate, realloc or fault in
 * fresh pages for most envelopes, costing more than the copy itself
 * (docs/performance.md).
 */
#include "relay_int.h"

#include <string.h>

#define ENTRIES_FIRST_CAP 64u
#define BUF_FIRST_CAP (64u << 10)

typedef struct ring_slot {
    relay_ring_env env; /* env.body == buf + off */
    size_t off;
} ring_slot;

struct relay_ring {
    ring_slot *e;
    size_t cap;     /* slots allocated (<= max_n) */
    size_t head, n; /* oldest, and how many are held */
    size_t bytes;   /* body bytes held */
    size_t max_n;
    size_t max_bytes;
    uint8_t *buf;
    size_t buf_cap; /* <= max_bytes */
    size_t wr;      /* where the next body goes */
};

kvo_status relay_ring_new(relay_ring **out, size_t max_n, size_t max_bytes) {
    relay_ring *r = kvo_calloc(1, sizeof(*r));
    if (!r) return KVO_ENOMEM;
    r->max_n = max_n;
    r->max_bytes = max_bytes;
    *out = r;
    return KVO_OK;
}

static ring_slot *slot(const relay_ring *r, size_t k) {
    return &r->e[(r->head + k) % r->cap];
}

/* Bytes a body takes in buf: an empty one takes 1, so that every body
 * starts before wr and ends after the one before it. */
static size_t room_of(size_t len) { return len ? len : 1; }

static void drop_oldest(relay_ring *r) {
    r->bytes -= slot(r, 0)->env.len;
    r->head = (r->head + 1) % r->cap;
    r->n--;
}

void relay_ring_clear(relay_ring *r) { r->n = r->head = r->bytes = r->wr = 0; }

void relay_ring_free(relay_ring *r) {
    if (!r) return;
    kvo_free(r->buf);
    kvo_free(r->e);
    kvo_free(r);
}

/* Room for one more slot while fewer than max_n are allocated: a larger
 * array with the held ones in order from 0. */
static kvo_status grow(relay_ring *r) {
    size_t ncap = r->cap ? 2 * r->cap : ENTRIES_FIRST_CAP;
    if (ncap > r->max_n) ncap = r->max_n;
    ring_slot *e = kvo_calloc(ncap, sizeof(*e));
    if (!e) return KVO_ENOMEM;
    for (size_t k = 0; k < r->n; k++) e[k] = *slot(r, k);
    kvo_free(r->e);
    r->e = e;
    r->cap = ncap;
    r->head = 0;
    return KVO_OK;
}

/* buf doubled (at least to need, at most to max_bytes); the bodies held
 * keep their offsets. */
static kvo_status buf_grow(relay_ring *r, size_t need) {
    size_t ncap = r->buf_cap ? r->buf_cap : BUF_FIRST_CAP;
    while (ncap < need && ncap <= r->max_bytes / 2) ncap *= 2;
    if (ncap < need || ncap > r->max_bytes) ncap = r->max_bytes;
    uint8_t *b = kvo_realloc(r->buf, ncap);
    if (!b) return KVO_ENOMEM;
    r->buf = b;
    r->buf_cap = ncap;
    for (size_t k = 0; k < r->n; k++)
        slot(r, k)->env.body = b + slot(r, k)->off;
    return KVO_OK;
}

/* The oldest body lies in [at, at + room). */
static bool oldest_in(const relay_ring *r, size_t at, size_t room) {
    const ring_slot *s = slot(r, 0);
    return s->off < at + room && at < s->off + room_of(s->env.len);
}

bool relay_ring_push(relay_ring *r, const relay_ring_env *env) {
    if (r->n && env->seq != slot(r, r->n - 1)->env.seq + 1) relay_ring_clear(r);
    size_t room = room_of(env->len);
    if (r->max_n == 0 || room > r->max_bytes) goto lost;
    if (r->wr + room > r->buf_cap && r->buf_cap < r->max_bytes &&
        buf_grow(r, r->wr + room) != KVO_OK)
        goto lost;
    size_t at = r->wr;
    if (at + room > r->buf_cap) { /* a new pass */
        while (r->n && slot(r, 0)->off >= r->wr) drop_oldest(r);
        at = 0;
    }
    while (r->n && (r->n == r->max_n || oldest_in(r, at, room))) drop_oldest(r);
    if (r->n == r->cap && grow(r) != KVO_OK) goto lost;
    if (env->len) memcpy(r->buf + at, env->body, env->len);
    ring_slot *s = &r->e[(r->head + r->n) % r->cap];
    s->env = *env;
    s->env.body = r->buf + at;
    s->off = at;
    r->wr = at + room;
    r->n++;
    r->bytes += env->len;
    return true;
lost:
    relay_ring_clear(r);
    return false;
}

bool relay_ring_holds(const relay_ring *r, uint64_t seq) {
    return r->n && seq >= slot(r, 0)->env.seq &&
           seq <= slot(r, r->n - 1)->env.seq;
}

const relay_ring_env *relay_ring_get(const relay_ring *r, uint64_t seq) {
    if (!relay_ring_holds(r, seq)) return NULL;
    return &slot(r, (size_t)(seq - slot(r, 0)->env.seq))->env;
}

void relay_ring_size(const relay_ring *r, uint64_t *envelopes,
                     uint64_t *bytes) {
    *envelopes = r->n;
    *bytes = r->bytes;
}
