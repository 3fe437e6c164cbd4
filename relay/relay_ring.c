/* relay_ring.c -- the relay's last envelopes, kept for recovery requests
 * (docs/recovery.md): each one's bytes exactly as published and the
 * KVO-Zmq-Seq header it went with.
 *
 *   e[0..cap): a circular array; e[head] is the oldest of the n held, and
 *   their sequences run without a hole from e[head].seq to the newest.
 *
 * Bounded twice: at most max_n envelopes and max_bytes of bodies; the oldest
 * go first. An envelope the ring cannot keep (larger than max_bytes alone,
 * out of memory, or not the one after the newest) empties it, so whatever
 * the ring holds is always a whole run up to the last envelope pushed:
 * "holds s" means it can send s and everything after it.
 */
#include "relay_int.h"

#include <string.h>

#define ENTRIES_FIRST_CAP 64u

typedef struct ring_slot {
    relay_ring_env env;
    uint8_t *body;   /* owned; env.body points here */
    size_t body_cap; /* its allocated size */
} ring_slot;

struct relay_ring {
    ring_slot *e;
    size_t cap;     /* slots allocated (<= max_n) */
    size_t head, n; /* oldest, and how many are held */
    size_t bytes;   /* body bytes held */
    size_t max_n;
    size_t max_bytes;
    /* The body of the last envelope dropped, kept for the next push: a
     * full ring drops one for each it keeps, and envelopes are large
     * (a fresh allocation of each was mapped and faulted in page by
     * page, a third of the relay's time on a busy engine). */
    uint8_t *spare;
    size_t spare_cap;
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

static void drop_oldest(relay_ring *r) {
    ring_slot *s = slot(r, 0);
    r->bytes -= s->env.len;
    if (s->body_cap >= r->spare_cap) { /* keep the larger one */
        kvo_free(r->spare);
        r->spare = s->body;
        r->spare_cap = s->body_cap;
    } else {
        kvo_free(s->body);
    }
    s->body = NULL;
    s->body_cap = 0;
    r->head = (r->head + 1) % r->cap;
    r->n--;
}

void relay_ring_clear(relay_ring *r) {
    while (r->n) drop_oldest(r);
    r->head = 0;
}

void relay_ring_free(relay_ring *r) {
    if (!r) return;
    relay_ring_clear(r);
    kvo_free(r->spare);
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

bool relay_ring_push(relay_ring *r, const relay_ring_env *env) {
    if (r->n && env->seq != slot(r, r->n - 1)->env.seq + 1) relay_ring_clear(r);
    if (r->max_n == 0 || env->len > r->max_bytes) goto lost;
    while (r->n && (r->n == r->max_n || r->bytes + env->len > r->max_bytes))
        drop_oldest(r);
    if (r->n == r->cap && grow(r) != KVO_OK) goto lost;
    size_t need = env->len ? env->len : 1;
    if (r->spare_cap < need) {
        uint8_t *grown = kvo_realloc(r->spare, need);
        if (!grown) goto lost;
        r->spare = grown;
        r->spare_cap = need;
    }
    uint8_t *copy = r->spare;
    memcpy(copy, env->body, env->len);
    ring_slot *s = &r->e[(r->head + r->n) % r->cap];
    s->env = *env;
    s->env.body = copy;
    s->body = copy;
    s->body_cap = r->spare_cap;
    r->spare = NULL;
    r->spare_cap = 0;
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
