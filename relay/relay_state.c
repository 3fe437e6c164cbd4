/* relay_state.c -- what the relay has told the index and not taken back
 * (docs/recovery.md, "What a relay keeps"): per (dp_rank, tier), every block
 * forwarded as stored and not yet forwarded as removed or cleared. It is
 * also the dedup reference count of DESIGN §6 (vLLM can hold several
 * physical copies of one hash and removes each copy separately): a store
 * adds a copy, a remove takes one away, and only the last one's remove is
 * forwarded and takes the block out of the state.
 *
 *   relay_state
 *     ranks[]   sorted by rank (binary search), each allocated on its own so
 *               a handle stays valid while ranks are added; at most
 *               RELAY_STATE_MAX_RANKS
 *     rank r -> tier[t], per wire_tier:
 *       map     block_hash -> index into pool (base's kvo_map)
 *       pool    [ {hash, parent, tokens_hash, refs, bits} ]  32 bytes each
 *               refs = copies stored (0: the record is free); bits = 1 when
 *               the block was stored under a parent, plus the walk's mark
 *               (bits >> 1); a free record's parent is the next free one
 *
 * A record's index never changes while its block is held, so the map's
 * value is the whole link between the two. The parent and tokens_hash are
 * those of the latest store of the block (every store of one engine hash
 * carries the same ones unless the engine is broken). A cleared empties
 * the maps and pools of one tier of a rank (the engine's AllBlocksCleared:
 * its device tier) or of all its tiers (a cleared the relay emits itself);
 * memory is kept for the next run.
 *
 * The walk (relay_state_walk, what a dump is made of) goes through each
 * pool in index order -- roughly the order the blocks were stored, so the
 * chains of one store come out together -- and sends every block after its
 * parent: from a block not yet sent it climbs to the oldest ancestor not
 * yet sent (the marks say which: ON for the blocks of the climb, DONE for
 * blocks sent), then sends the climb top-down. The top of a climb goes
 * under the root when it had no parent, or when its parent is not held
 * (removed since, or never forwarded) or is on the climb itself (a hash
 * cycle): the last two are orphans. Marks carry an epoch per walk, so no
 * pass is needed to reset them.
 */
#include "kvo_map.h"
#include "relay_int.h"

#include <string.h>

#define NO_REC UINT32_MAX   /* end of a free list */
#define POOL_FIRST_CAP 64u  /* records of a pool's first allocation */
#define CLIMB_FIRST_CAP 64u /* the walk's climb stack */
#define BIT_PARENT 1u
/* The walk's marks: a record whose mark is neither of the current epoch's
 * is not yet visited. */
#define MARK_ON(e) (2u * (e))
#define MARK_DONE(e) (2u * (e) + 1u)
#define MARK_MAX_EPOCH ((UINT32_MAX >> 1) / 2u - 1u)

typedef struct fblock {
    uint64_t hash;
    uint64_t parent;
    uint64_t tokens_hash;
    uint32_t refs;
    uint32_t bits;
} fblock;

typedef struct ftier {
    kvo_map map; /* block_hash -> index into pool */
    fblock *pool;
    size_t cap;    /* records allocated */
    uint32_t len;  /* records ever handed out (high-water) */
    uint32_t free; /* first free record, NO_REC when none */
    uint32_t live; /* records held */
} ftier;

struct relay_state_rank {
    uint32_t rank;
    ftier tier[WIRE_TIER_COUNT];
};

struct relay_state {
    relay_state_rank **ranks; /* sorted by rank */
    uint32_t nranks;
    uint32_t epoch;  /* of the last walk */
    uint32_t *climb; /* the walk's stack of record indices */
    size_t climb_cap;
};

kvo_status relay_state_new(relay_state **out) {
    relay_state *s = kvo_calloc(1, sizeof(*s));
    if (!s) return KVO_ENOMEM;
    *out = s;
    return KVO_OK;
}

static void tier_fini(ftier *t) {
    kvo_map_fini(&t->map);
    kvo_free(t->pool);
}

void relay_state_free(relay_state *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->nranks; i++) {
        for (int t = 0; t < WIRE_TIER_COUNT; t++)
            tier_fini(&s->ranks[i]->tier[t]);
        kvo_free(s->ranks[i]);
    }
    kvo_free(s->ranks);
    kvo_free(s->climb);
    kvo_free(s);
}

/* Position of rank in the sorted table, or where it would go. */
static uint32_t rank_pos(const relay_state *s, uint32_t rank, bool *found) {
    uint32_t lo = 0, hi = s->nranks;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->ranks[mid]->rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < s->nranks && s->ranks[lo]->rank == rank;
    return lo;
}

kvo_status relay_state_rank_get(relay_state *s, uint32_t rank,
                                relay_state_rank **out) {
    bool found;
    uint32_t at = rank_pos(s, rank, &found);
    if (found) {
        *out = s->ranks[at];
        return KVO_OK;
    }
    if (s->nranks >= RELAY_STATE_MAX_RANKS) return KVO_ETOOBIG;
    relay_state_rank *r = kvo_calloc(1, sizeof(*r));
    relay_state_rank **n =
        r ? kvo_realloc(s->ranks, (s->nranks + 1) * sizeof(*n)) : NULL;
    if (!n) {
        kvo_free(r);
        return KVO_ENOMEM;
    }
    s->ranks = n;
    r->rank = rank;
    for (int t = 0; t < WIRE_TIER_COUNT; t++) {
        kvo_map_init(&r->tier[t].map);
        r->tier[t].free = NO_REC;
    }
    memmove(&s->ranks[at + 1], &s->ranks[at],
            (s->nranks - at) * sizeof(*s->ranks));
    s->ranks[at] = r;
    s->nranks++;
    *out = r;
    return KVO_OK;
}

/* A free record of t, or NO_REC when out of memory. */
static uint32_t rec_alloc(ftier *t) {
    if (t->free != NO_REC) {
        uint32_t i = t->free;
        t->free = (uint32_t)t->pool[i].parent;
        return i;
    }
    if (t->len == NO_REC ||
        kvo_grow(&t->pool, &t->cap, (size_t)t->len + 1, sizeof(*t->pool),
                 POOL_FIRST_CAP) != KVO_OK)
        return NO_REC;
    return t->len++;
}

static void rec_release(ftier *t, uint32_t i) {
    t->pool[i].refs = 0;
    t->pool[i].parent = t->free;
    t->free = i;
    t->live--;
}

kvo_status relay_state_store(relay_state_rank *r, wire_tier tier,
                             uint64_t block_hash, bool has_parent,
                             uint64_t parent, uint64_t tokens_hash) {
    ftier *t = &r->tier[tier];
    bool added;
    uint64_t *v = kvo_map_put(&t->map, block_hash, &added);
    if (!v) return KVO_ENOMEM;
    fblock *b;
    if (added) {
        uint32_t i = rec_alloc(t);
        if (i == NO_REC) {
            kvo_map_del_at(&t->map, v);
            return KVO_ENOMEM;
        }
        *v = i;
        b = &t->pool[i];
        b->hash = block_hash;
        b->refs = 0;
        b->bits = 0;
        t->live++;
    } else {
        b = &t->pool[*v];
    }
    if (b->refs < UINT32_MAX) b->refs++;
    b->parent = has_parent ? parent : 0;
    b->tokens_hash = tokens_hash;
    b->bits = (b->bits & ~BIT_PARENT) | (has_parent ? BIT_PARENT : 0);
    return KVO_OK;
}

kvo_map_dec_result relay_state_remove(relay_state_rank *r, wire_tier tier,
                                      uint64_t block_hash) {
    ftier *t = &r->tier[tier];
    uint64_t *v = kvo_map_get(&t->map, block_hash);
    if (!v) return KVO_MAP_ABSENT;
    uint32_t i = (uint32_t)*v;
    if (t->pool[i].refs > 1) {
        t->pool[i].refs--;
        return KVO_MAP_HELD;
    }
    kvo_map_del_at(&t->map, v);
    rec_release(t, i);
    return KVO_MAP_GONE;
}

static void tier_clear(ftier *t) {
    kvo_map_clear(&t->map);
    t->len = t->live = 0;
    t->free = NO_REC;
}

void relay_state_clear_tier(relay_state *s, uint32_t rank, wire_tier tier) {
    bool found;
    uint32_t at = rank_pos(s, rank, &found);
    if (found) tier_clear(&s->ranks[at]->tier[tier]);
}

void relay_state_clear(relay_state *s, uint32_t rank) {
    bool found;
    uint32_t at = rank_pos(s, rank, &found);
    if (!found) return;
    for (int k = 0; k < WIRE_TIER_COUNT; k++)
        tier_clear(&s->ranks[at]->tier[k]);
}

uint32_t relay_state_copies(relay_state_rank *r, wire_tier tier,
                            uint64_t block_hash) {
    ftier *t = &r->tier[tier];
    uint64_t *v = kvo_map_get(&t->map, block_hash);
    return v ? t->pool[*v].refs : 0;
}

bool relay_state_tokens_hash(relay_state_rank *r, wire_tier tier,
                             uint64_t block_hash, uint64_t *out) {
    ftier *t = &r->tier[tier];
    uint64_t *v = kvo_map_get(&t->map, block_hash);
    if (v) *out = t->pool[*v].tokens_hash;
    return v != NULL;
}

size_t relay_state_ranks(const relay_state *s, uint32_t *out, size_t max) {
    size_t n = s->nranks < max ? s->nranks : max;
    for (size_t i = 0; i < n; i++) out[i] = s->ranks[i]->rank;
    return n;
}

void relay_state_size(const relay_state *s, uint64_t *blocks, uint64_t *bytes) {
    uint64_t n = 0, b = sizeof(*s) + s->nranks * sizeof(*s->ranks) +
                        s->climb_cap * sizeof(*s->climb);
    for (uint32_t i = 0; i < s->nranks; i++) {
        b += sizeof(relay_state_rank);
        for (int k = 0; k < WIRE_TIER_COUNT; k++) {
            const ftier *t = &s->ranks[i]->tier[k];
            n += t->live;
            b += t->map.cap * sizeof(kvo_map_slot) + t->cap * sizeof(fblock);
        }
    }
    *blocks = n;
    *bytes = b;
}

/* ---- the walk ----------------------------------------------------------*/

static bool climb_push(relay_state *s, size_t n, uint32_t i) {
    if (kvo_grow(&s->climb, &s->climb_cap, n + 1, sizeof(*s->climb),
                 CLIMB_FIRST_CAP) != KVO_OK)
        return false;
    s->climb[n] = i;
    return true;
}

/* The held parent's record of b, or NO_REC. */
static uint32_t parent_of(ftier *t, const fblock *b) {
    if (!(b->bits & BIT_PARENT)) return NO_REC;
    uint64_t *v = kvo_map_get(&t->map, b->parent);
    return v ? (uint32_t)*v : NO_REC;
}

static void mark(fblock *b, uint32_t m) { b->bits = (b->bits & 1u) | m << 1; }
static uint32_t mark_of(const fblock *b) { return b->bits >> 1; }

static kvo_status walk_tier(relay_state *s, uint32_t rank, wire_tier tier,
                            ftier *t, relay_state_fn fn, void *ctx) {
    const uint32_t on = MARK_ON(s->epoch), done = MARK_DONE(s->epoch);
    for (uint32_t start = 0; start < t->len; start++) {
        fblock *b = &t->pool[start];
        if (b->refs == 0 || mark_of(b) == done) continue;
        /* Climb to the oldest ancestor not sent yet. */
        size_t n = 0;
        uint32_t cur = start;
        for (;;) {
            if (!climb_push(s, n, cur)) return KVO_ENOMEM;
            n++;
            mark(&t->pool[cur], on);
            uint32_t up = parent_of(t, &t->pool[cur]);
            if (up == NO_REC || mark_of(&t->pool[up]) == on ||
                mark_of(&t->pool[up]) == done)
                break;
            cur = up;
        }
        /* Send it top-down: each block's parent is sent just before it,
         * but the top's may be missing or on the climb. */
        for (size_t k = n; k-- > 0;) {
            fblock *x = &t->pool[s->climb[k]];
            relay_state_block out = {
                .rank = rank,
                .tier = tier,
                .hash = x->hash,
                .tokens_hash = x->tokens_hash,
                .has_parent = (x->bits & BIT_PARENT) != 0,
                .parent = x->parent,
            };
            if (k == n - 1 && out.has_parent) {
                uint32_t up = parent_of(t, x);
                out.orphan = up == NO_REC || mark_of(&t->pool[up]) != done;
            }
            mark(x, done);
            kvo_status st = fn(ctx, &out);
            if (st != KVO_OK) return st;
        }
    }
    return KVO_OK;
}

kvo_status relay_state_walk(relay_state *s, relay_state_fn fn, void *ctx) {
    if (s->epoch >= MARK_MAX_EPOCH) {
        /* Marks of old epochs could be taken for new ones: wipe them. */
        for (uint32_t i = 0; i < s->nranks; i++)
            for (int k = 0; k < WIRE_TIER_COUNT; k++) {
                ftier *t = &s->ranks[i]->tier[k];
                for (uint32_t j = 0; j < t->len; j++) mark(&t->pool[j], 0);
            }
        s->epoch = 0;
    }
    s->epoch++;
    kvo_status st = KVO_OK;
    for (uint32_t i = 0; i < s->nranks && st == KVO_OK; i++)
        for (int k = 0; k < WIRE_TIER_COUNT && st == KVO_OK; k++)
            st = walk_tier(s, s->ranks[i]->rank, (wire_tier)k,
                           &s->ranks[i]->tier[k], fn, ctx);
    /* The climb holds as much as the deepest chain: give it back. */
    kvo_free(s->climb);
    s->climb = NULL;
    s->climb_cap = 0;
    return st;
}
