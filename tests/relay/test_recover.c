/* What the relay keeps for recovery, behind the pipe's seam: the forwarded
 * state (against a reference model), the ring, dumps, and the answers to
 * recovery requests (docs/recovery.md). No sockets. */
#include "tr.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Suite *suite_recover(void);

#define BIG_PAYLOAD (1u << 20) /* nats-server's default max_payload */

/* ---- helpers -----------------------------------------------------------------*/

typedef struct walked {
    relay_state_block *v;
    size_t n, cap;
} walked;

static kvo_status keep_block(void *ctx, const relay_state_block *b) {
    walked *w = ctx;
    ck_assert_int_eq(kvo_grow(&w->v, &w->cap, w->n + 1, sizeof(*w->v), 64),
                     KVO_OK);
    w->v[w->n++] = *b;
    return KVO_OK;
}

/* Position of (rank, tier, hash) in the walk, or SIZE_MAX. */
static size_t walked_at(const walked *w, uint32_t rank, wire_tier tier,
                        uint64_t hash) {
    for (size_t i = 0; i < w->n; i++)
        if (w->v[i].rank == rank && w->v[i].tier == tier &&
            w->v[i].hash == hash)
            return i;
    return SIZE_MAX;
}

static relay_state *state_new(void) {
    relay_state *s;
    ck_assert_int_eq(relay_state_new(&s), KVO_OK);
    return s;
}

static relay_state_rank *rank_of(relay_state *s, uint32_t rank) {
    relay_state_rank *r = NULL;
    ck_assert_int_eq(relay_state_rank_get(s, rank, &r), KVO_OK);
    return r;
}

/* ---- the forwarded state -----------------------------------------------------*/

START_TEST(a_block_stays_until_its_last_copy_is_removed) {
    relay_state *s = state_new();
    relay_state_rank *r0 = rank_of(s, 0), *r1 = rank_of(s, 1);
    ck_assert_int_eq(relay_state_store(r0, WIRE_TIER_DEVICE, 10, false, 0, 100),
                     KVO_OK);
    ck_assert_int_eq(relay_state_store(r0, WIRE_TIER_DEVICE, 11, true, 10, 101),
                     KVO_OK);
    /* a second physical copy, and the same hash on another tier and rank */
    ck_assert_int_eq(relay_state_store(r0, WIRE_TIER_DEVICE, 11, true, 10, 101),
                     KVO_OK);
    ck_assert_int_eq(
        relay_state_store(r0, WIRE_TIER_HOST_PINNED, 11, true, 10, 101),
        KVO_OK);
    ck_assert_int_eq(relay_state_store(r1, WIRE_TIER_DEVICE, 11, false, 0, 9),
                     KVO_OK);
    ck_assert_uint_eq(relay_state_copies(r0, WIRE_TIER_DEVICE, 11), 2);
    ck_assert_uint_eq(relay_state_copies(r0, WIRE_TIER_HOST_PINNED, 11), 1);
    uint64_t blocks, bytes;
    relay_state_size(s, &blocks, &bytes);
    ck_assert_uint_eq(blocks, 4);
    ck_assert_uint_gt(bytes, 0);
    ck_assert_int_eq(relay_state_remove(r0, WIRE_TIER_DEVICE, 11),
                     KVO_MAP_HELD);
    ck_assert_int_eq(relay_state_remove(r0, WIRE_TIER_DEVICE, 11),
                     KVO_MAP_GONE);
    ck_assert_int_eq(relay_state_remove(r0, WIRE_TIER_DEVICE, 11),
                     KVO_MAP_ABSENT);
    ck_assert_uint_eq(relay_state_copies(r0, WIRE_TIER_HOST_PINNED, 11), 1);
    /* the record freed is used again */
    ck_assert_int_eq(relay_state_store(r0, WIRE_TIER_DEVICE, 12, true, 10, 102),
                     KVO_OK);
    relay_state_size(s, &blocks, &bytes);
    ck_assert_uint_eq(blocks, 4);
    /* cleared: every tier of the rank, no other rank */
    relay_state_clear(s, 0);
    relay_state_size(s, &blocks, &bytes);
    ck_assert_uint_eq(blocks, 1);
    ck_assert_uint_eq(relay_state_copies(r0, WIRE_TIER_HOST_PINNED, 11), 0);
    ck_assert_uint_eq(relay_state_copies(r1, WIRE_TIER_DEVICE, 11), 1);
    uint32_t ranks[4];
    ck_assert_uint_eq(relay_state_ranks(s, ranks, 4), 2);
    ck_assert_uint_eq(ranks[0], 0);
    ck_assert_uint_eq(ranks[1], 1);
    relay_state_free(s);
}
END_TEST

START_TEST(ranks_beyond_the_table_are_refused) {
    relay_state *s = state_new();
    relay_state_rank *r;
    /* added out of order: kept ascending */
    for (uint32_t i = 0; i < RELAY_STATE_MAX_RANKS; i++)
        ck_assert_int_eq(
            relay_state_rank_get(s, (i * 7919u) % RELAY_STATE_MAX_RANKS, &r),
            KVO_OK);
    ck_assert_int_eq(relay_state_rank_get(s, RELAY_STATE_MAX_RANKS, &r),
                     KVO_ETOOBIG);
    ck_assert_int_eq(relay_state_rank_get(s, 5, &r), KVO_OK);
    uint32_t ranks[RELAY_STATE_MAX_RANKS];
    ck_assert_uint_eq(relay_state_ranks(s, ranks, RELAY_STATE_MAX_RANKS),
                      RELAY_STATE_MAX_RANKS);
    for (uint32_t i = 0; i < RELAY_STATE_MAX_RANKS; i++)
        ck_assert_uint_eq(ranks[i], i);
    relay_state_free(s);
}
END_TEST

START_TEST(a_walk_sends_parents_first_and_orphans_under_the_root) {
    relay_state *s = state_new();
    relay_state_rank *r = rank_of(s, 3);
    wire_tier d = WIRE_TIER_DEVICE;
    /* a chain stored child first: 3 under 2 under 1 under the root */
    relay_state_store(r, d, 3, true, 2, 33);
    relay_state_store(r, d, 2, true, 1, 22);
    relay_state_store(r, d, 1, false, 0, 11);
    /* 5 under 4, which is not held */
    relay_state_store(r, d, 5, true, 4, 55);
    /* a loop of hashes: 7 under 6, 6 under 7; and 8 under itself */
    relay_state_store(r, d, 6, true, 7, 66);
    relay_state_store(r, d, 7, true, 6, 77);
    relay_state_store(r, d, 8, true, 8, 88);
    /* hash 0 is a hash like any other */
    relay_state_store(r, d, 0, true, 3, 99);
    walked w = {0};
    ck_assert_int_eq(relay_state_walk(s, keep_block, &w), KVO_OK);
    ck_assert_uint_eq(w.n, 8);
    size_t orphans = 0;
    for (size_t i = 0; i < w.n; i++) {
        const relay_state_block *b = &w.v[i];
        ck_assert_uint_eq(b->rank, 3);
        ck_assert_uint_eq(b->tokens_hash, b->hash ? b->hash * 11 : 99);
        ck_assert_uint_eq(walked_at(&w, 3, d, b->hash), i); /* once */
        orphans += b->orphan;
        if (b->has_parent && !b->orphan)
            ck_assert_uint_lt(walked_at(&w, 3, d, b->parent), i);
    }
    ck_assert_uint_eq(orphans, 3); /* 5, one of 6 and 7, and 8 */
    ck_assert(w.v[walked_at(&w, 3, d, 5)].orphan);
    ck_assert(w.v[walked_at(&w, 3, d, 8)].orphan);
    ck_assert(!w.v[walked_at(&w, 3, d, 1)].orphan);
    ck_assert(!w.v[walked_at(&w, 3, d, 1)].has_parent);
    /* A second walk sends the same (the marks of the first do not count). */
    walked w2 = {0};
    ck_assert_int_eq(relay_state_walk(s, keep_block, &w2), KVO_OK);
    ck_assert_uint_eq(w2.n, w.n);
    kvo_free(w.v);
    kvo_free(w2.v);
    relay_state_free(s);
}
END_TEST

/* The reference: one entry per held (rank, tier, hash). */
typedef struct mblock {
    uint32_t rank;
    wire_tier tier;
    uint64_t hash, parent, tokens;
    bool has_parent;
    uint32_t copies;
} mblock;

#define M_MAX 4096

static mblock *m_find(mblock *m, size_t n, uint32_t rank, wire_tier tier,
                      uint64_t hash) {
    for (size_t i = 0; i < n; i++)
        if (m[i].rank == rank && m[i].tier == tier && m[i].hash == hash)
            return &m[i];
    return NULL;
}

/* Following parents from b (held ones only) comes back to b. */
static bool m_on_cycle(mblock *m, size_t n, const mblock *b) {
    const mblock *x = b;
    for (size_t steps = 0; steps <= n; steps++) {
        if (!x->has_parent) return false;
        x = m_find(m, n, b->rank, b->tier, x->parent);
        if (!x) return false;
        if (x == b) return true;
    }
    return false; /* a cycle further up, not through b */
}

static void m_check_walk(relay_state *s, mblock *m, size_t n) {
    walked w = {0};
    ck_assert_int_eq(relay_state_walk(s, keep_block, &w), KVO_OK);
    ck_assert_uint_eq(w.n, n);
    for (size_t i = 0; i < w.n; i++) {
        const relay_state_block *b = &w.v[i];
        mblock *x = m_find(m, n, b->rank, b->tier, b->hash);
        ck_assert_ptr_nonnull(x);
        ck_assert_uint_eq(walked_at(&w, b->rank, b->tier, b->hash), i);
        ck_assert(b->has_parent == x->has_parent);
        ck_assert_uint_eq(b->tokens_hash, x->tokens);
        if (!b->has_parent) {
            ck_assert(!b->orphan);
            continue;
        }
        ck_assert_uint_eq(b->parent, x->parent);
        mblock *up = m_find(m, n, b->rank, b->tier, b->parent);
        if (!b->orphan) {
            ck_assert_ptr_nonnull(up);
            ck_assert_uint_lt(walked_at(&w, b->rank, b->tier, b->parent), i);
        } else {
            ck_assert(up == NULL || m_on_cycle(m, n, x));
        }
    }
    kvo_free(w.v);
}

/* Random stores, removes and clears against the reference, checked after
 * every step; the walk every 64 steps. */
START_TEST(the_state_follows_a_reference_model) {
    const uint64_t seed = 20240612;
    printf("the_state_follows_a_reference_model: seed %" PRIu64 "\n", seed);
    uint64_t rng = seed;
    relay_state *s = state_new();
    static mblock m[M_MAX];
    size_t n = 0;
    for (int step = 0; step < 20000; step++) {
        uint64_t x = kvo_splitmix64(&rng);
        uint32_t rank = (uint32_t)(x % 3);
        wire_tier tier = (wire_tier)((x >> 8) % 2);
        uint64_t hash = (x >> 16) % 300;
        relay_state_rank *r = rank_of(s, rank);
        unsigned op = (unsigned)((x >> 40) % 100);
        if (op < 55) {
            bool hp = (x >> 50) % 4 != 0;
            uint64_t parent = hp ? (x >> 52) % 300 : 0;
            ck_assert_int_eq(relay_state_store(r, tier, hash, hp, parent,
                                               hash * 31 + parent),
                             KVO_OK);
            mblock *b = m_find(m, n, rank, tier, hash);
            if (!b) {
                ck_assert_uint_lt(n, M_MAX);
                b = &m[n++];
                *b = (mblock){rank, tier, hash, 0, 0, false, 0};
            }
            b->copies++;
            b->has_parent = hp;
            b->parent = parent;
            b->tokens = hash * 31 + parent;
        } else if (op < 99) {
            mblock *b = m_find(m, n, rank, tier, hash);
            kvo_map_dec_result want = !b              ? KVO_MAP_ABSENT
                                      : b->copies > 1 ? KVO_MAP_HELD
                                                      : KVO_MAP_GONE;
            ck_assert_int_eq(relay_state_remove(r, tier, hash), want);
            if (b && --b->copies == 0) *b = m[--n];
        } else {
            relay_state_clear(s, rank);
            for (size_t i = n; i-- > 0;)
                if (m[i].rank == rank) m[i] = m[--n];
        }
        mblock *b = m_find(m, n, rank, tier, hash);
        ck_assert_uint_eq(relay_state_copies(r, tier, hash), b ? b->copies : 0);
        uint64_t blocks, bytes;
        relay_state_size(s, &blocks, &bytes);
        ck_assert_uint_eq(blocks, n);
        if (step % 64 == 0) m_check_walk(s, m, n);
    }
    m_check_walk(s, m, n);
    relay_state_free(s);
}
END_TEST

/* What one forwarded block costs, for the report: the state of 100000
 * blocks in chains of 10. */
START_TEST(the_state_costs_a_bounded_number_of_bytes_per_block) {
    relay_state *s = state_new();
    relay_state_rank *r = rank_of(s, 0);
    for (uint64_t i = 1; i <= 100000; i++)
        ck_assert_int_eq(relay_state_store(r, WIRE_TIER_DEVICE, i, i % 10 != 1,
                                           i - 1, i * 3),
                         KVO_OK);
    uint64_t blocks, bytes;
    relay_state_size(s, &blocks, &bytes);
    ck_assert_uint_eq(blocks, 100000);
    printf("forwarded state: %" PRIu64 " blocks in %" PRIu64
           " bytes = %.1f bytes per block\n",
           blocks, bytes, (double)bytes / (double)blocks);
    /* the map's slots (16 bytes at a load of 1/8 to 1/4) and a 32-byte
     * record (pools double) */
    ck_assert_uint_le(bytes / blocks, 16 * 8 + 32 * 2);
    relay_state_free(s);
}
END_TEST

/* ---- the ring ----------------------------------------------------------------*/

/* The bytes of envelope seq: a function of seq and the position. */
static uint8_t body_byte(uint64_t seq, size_t i) {
    return (uint8_t)(seq * 131u + i * 7u + (i >> 8));
}

static void ring_push(relay_ring *r, uint64_t seq, size_t len, bool want) {
    static uint8_t body[1u << 18];
    ck_assert_uint_le(len, sizeof(body));
    for (size_t i = 0; i < len; i++) body[i] = body_byte(seq, i);
    relay_ring_env e = {seq, seq % 2 == 0, seq * 10, seq * 10 + 3, body, len};
    ck_assert(relay_ring_push(r, &e) == want);
}

/* Envelope seq is held, len bytes, each the one pushed. */
static void ring_check(const relay_ring *r, uint64_t seq, size_t len) {
    const relay_ring_env *e = relay_ring_get(r, seq);
    ck_assert_ptr_nonnull(e);
    ck_assert_uint_eq(e->seq, seq);
    ck_assert_uint_eq(e->len, len);
    size_t bad = 0;
    for (size_t i = 0; i < len; i++) bad += e->body[i] != body_byte(seq, i);
    ck_assert_uint_eq(bad, 0);
}

START_TEST(the_ring_keeps_the_last_envelopes_within_count_and_bytes) {
    relay_ring *r;
    ck_assert_int_eq(relay_ring_new(&r, 100, 1000), KVO_OK);
    ck_assert(!relay_ring_holds(r, 0));
    for (uint64_t s = 0; s < 250; s++) ring_push(r, s, 5, true);
    /* by count: the last 100 */
    ck_assert(!relay_ring_holds(r, 149));
    ck_assert(relay_ring_holds(r, 150));
    ck_assert(relay_ring_holds(r, 249));
    ck_assert(!relay_ring_holds(r, 250));
    const relay_ring_env *e = relay_ring_get(r, 200);
    ring_check(r, 200, 5);
    ck_assert(e->has_range);
    ck_assert_uint_eq(e->first, 2000);
    ck_assert_uint_eq(e->last, 2003);
    ck_assert(!relay_ring_get(r, 201)->has_range);
    uint64_t n, bytes;
    relay_ring_size(r, &n, &bytes);
    ck_assert_uint_eq(n, 100);
    ck_assert_uint_eq(bytes, 500);
    /* by bytes: 200-byte envelopes, 1000 bytes at most (four only while
     * the 5-byte ones leave their offsets out of step) */
    for (uint64_t s = 250; s < 260; s++) ring_push(r, s, 200, true);
    relay_ring_size(r, &n, &bytes);
    ck_assert_uint_eq(n, 5);
    ck_assert_uint_eq(bytes, 1000);
    ck_assert(!relay_ring_holds(r, 254));
    for (uint64_t s = 255; s < 260; s++) ring_check(r, s, 200);
    relay_ring_free(r);
}
END_TEST

START_TEST(an_envelope_the_ring_cannot_keep_empties_it) {
    relay_ring *r;
    ck_assert_int_eq(relay_ring_new(&r, 10, 1u << 17), KVO_OK);
    for (uint64_t s = 0; s < 5; s++) ring_push(r, s, 10, true);
    ring_push(r, 5, (1u << 17) + 1, false); /* larger than the ring */
    ck_assert(!relay_ring_holds(r, 4));
    ck_assert(!relay_ring_holds(r, 5));
    ring_push(r, 6, 10, true);
    ck_assert(relay_ring_holds(r, 6));
    ring_push(r, 9, 10, true); /* 7 and 8 never came: a run again from 9 */
    ck_assert(!relay_ring_holds(r, 6));
    ck_assert(relay_ring_holds(r, 9));
    /* out of memory: the bodies outgrow what is allocated for them */
    kvo_alloc_fail_after(0);
    bool kept = true;
    static uint8_t b[1u << 17]; /* more than the 64 KiB allocated first */
    relay_ring_env e = {10, false, 0, 0, b, sizeof(b)};
    kept = relay_ring_push(r, &e);
    kvo_alloc_fail_after(-1);
    ck_assert(!kept);
    ck_assert(!relay_ring_holds(r, 9));
    ring_push(r, 11, 10, true);
    ring_check(r, 11, 10);
    relay_ring_free(r);
}
END_TEST

/* Against a model: envelopes of random sizes (empty ones, and ones as
 * large as a quarter of the ring) pushed through many passes over the
 * ring's buffer; after each push the ring holds a run up to the newest,
 * every envelope byte for byte, within max_n and max_bytes, and it let
 * an envelope go only when keeping it would not have fit (it wastes less
 * than the largest envelope at the end of a pass). */
START_TEST(the_ring_follows_a_model_through_many_passes) {
    enum { PUSHES = 4000, MAX_N = 40, MAX_BYTES = 1u << 16 };
    const size_t max_len = MAX_BYTES / 4;
    const uint64_t seed = 20240715;
    printf("the_ring_follows_a_model_through_many_passes: seed %" PRIu64 "\n",
           seed);
    uint64_t rng = seed;
    static size_t lens[PUSHES];
    relay_ring *r;
    ck_assert_int_eq(relay_ring_new(&r, MAX_N, MAX_BYTES), KVO_OK);
    uint64_t lo = 0; /* the oldest held */
    for (uint64_t seq = 0; seq < PUSHES; seq++) {
        uint64_t x = kvo_splitmix64(&rng);
        lens[seq] = x % 10 == 0   ? 0
                    : x % 10 == 1 ? max_len - (size_t)(x >> 40) % 64
                                  : (size_t)(x >> 8) % 4000;
        ring_push(r, seq, lens[seq], true);
        uint64_t n, bytes;
        relay_ring_size(r, &n, &bytes);
        ck_assert_uint_ge(n, 1);
        ck_assert_uint_le(n, MAX_N);
        ck_assert_uint_le(bytes, MAX_BYTES);
        ck_assert_uint_ge(seq + 1 - n, lo); /* nothing comes back */
        lo = seq + 1 - n;
        if (lo > 0) {
            ck_assert(!relay_ring_holds(r, lo - 1));
            if (n < MAX_N) /* empty ones take a byte */
                ck_assert_uint_gt(bytes + n + lens[lo - 1] + 1 + max_len,
                                  MAX_BYTES);
        }
        ck_assert(relay_ring_holds(r, lo));
        ck_assert(!relay_ring_holds(r, seq + 1));
        uint64_t sum = 0;
        for (uint64_t k = lo; k <= seq; k++) {
            ring_check(r, k, lens[k]);
            sum += lens[k];
        }
        ck_assert_uint_eq(sum, bytes);
    }
    relay_ring_free(r);
}
END_TEST

/* ---- dumps -------------------------------------------------------------------*/

/* A state of rank 0 and 1 with chains, dumped under max_payload. */
static void dump_of(relay_state *s, size_t max_payload, uint32_t max_events,
                    tr_replies *out, relay_dump_result *res, kvo_status want) {
    static const uint32_t ranks[] = {0, 1, 2};
    relay_dump_cfg c = {
        .publisher_id = 42,
        .worker_id = 7,
        .event_id = 500,
        .as_of = 99,
        .published_at_ms = 1,
        .has_wm = true,
        .wm_first = 30,
        .wm_last = 31,
        .ranks = ranks,
        .n_ranks = 3,
        .max_payload = max_payload,
        .max_events = max_events,
        .max_blocks = 8192,
    };
    tr_replies_reset(out);
    ck_assert_int_eq(relay_dump_send(&c, s, tr_reply_keep, out, res), want);
}

static relay_state *chains(uint32_t nchains, uint32_t len) {
    relay_state *s = state_new();
    for (uint32_t k = 0; k < nchains; k++) {
        relay_state_rank *r = rank_of(s, k % 2);
        for (uint32_t i = 0; i < len; i++) {
            uint64_t h = 1000u * (k + 1) + i;
            ck_assert_int_eq(relay_state_store(r, WIRE_TIER_DEVICE, h, i > 0,
                                               h - 1, tb_tokens_hash(h, 16)),
                             KVO_OK);
        }
    }
    return s;
}

START_TEST(a_dump_is_cut_under_max_payload_and_the_last_has_the_watermark) {
    relay_state *s = chains(20, 30);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_dump_result res;
    const size_t max = 2000;
    dump_of(s, max, 128, &rep, &res, KVO_OK);
    ck_assert_uint_eq(res.blocks, 600);
    ck_assert_uint_eq(res.orphans, 0);
    ck_assert_uint_eq(res.sent, rep.n);
    ck_assert_uint_gt(rep.n, 20); /* ~25 blocks per envelope */
    idx_tree *t;
    ck_assert_int_eq(idx_tree_new(&t), KVO_OK);
    size_t cleared = 0, blocks = 0;
    for (size_t i = 0; i < rep.n; i++) {
        tr_rmsg *m = &rep.v[i];
        ck_assert_int_eq(m->kind, WIRE_REPLY_DUMP);
        ck_assert_uint_le(m->raw.len + RELAY_REPLY_HEADER_ROOM, max);
        ck_assert_uint_eq(m->m.publisher_id, 42);
        ck_assert_uint_eq(m->m.sequence, 99);
        ck_assert(m->has_range == (i == rep.n - 1));
        for (uint32_t k = 0; k < m->m.n_events; k++) {
            const wire_revent *e = &m->m.events[k];
            ck_assert_uint_eq(e->worker_id, 7);
            ck_assert_uint_eq(e->event_id, 500);
            if (e->type == WIRE_R_CLEARED) {
                ck_assert_uint_eq(blocks, 0); /* every cleared first */
                /* each rank in every tier, device first */
                ck_assert_uint_eq(e->dp_rank, cleared / WIRE_TIER_COUNT);
                ck_assert_int_eq(e->tier, cleared % WIRE_TIER_COUNT);
                cleared++;
            } else {
                ck_assert_int_eq(e->type, WIRE_R_STORED);
                blocks += e->n_blocks;
            }
        }
        tr_tree_apply(t, &m->m); /* every store finds its parent */
    }
    ck_assert_uint_eq(cleared, 3 * WIRE_TIER_COUNT);
    ck_assert_uint_eq(blocks, 600);
    ck_assert_uint_eq(rep.v[rep.n - 1].first, 30);
    ck_assert_uint_eq(rep.v[rep.n - 1].last, 31);
    idx_worker *w;
    size_t nw;
    ck_assert_int_eq(idx_tree_workers(t, &w, &nw), KVO_OK);
    ck_assert_uint_eq(nw, 3); /* rank 2: cleared, nothing stored */
    ck_assert_uint_eq(w[0].blocks, 300);
    ck_assert_uint_eq(w[1].blocks, 300);
    ck_assert_uint_eq(w[2].blocks, 0);
    kvo_free(w);
    /* With the whole payload, stores merge along their chains: one event
     * per chain. */
    dump_of(s, BIG_PAYLOAD, 128, &rep, &res, KVO_OK);
    ck_assert_uint_eq(rep.n, 1);
    ck_assert_uint_eq(rep.v[0].m.n_events, 3 * WIRE_TIER_COUNT + 20);
    /* At most max_events per envelope. */
    dump_of(s, BIG_PAYLOAD, 4, &rep, &res, KVO_OK);
    ck_assert_uint_eq(rep.n, (3 * WIRE_TIER_COUNT + 20 + 3) / 4);
    for (size_t i = 0; i < rep.n; i++)
        ck_assert_uint_le(rep.v[i].m.n_events, 4);
    idx_tree_free(t);
    tr_replies_fini(&rep);
    relay_state_free(s);
}
END_TEST

START_TEST(a_dump_that_cannot_fit_a_block_or_be_sent_stops) {
    relay_state *s = chains(2, 3);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_dump_result res;
    dump_of(s, 400, 128, &rep, &res, KVO_ETOOBIG);
    ck_assert_uint_eq(rep.n, 0);
    rep.fail_at = 0;
    dump_of(s, BIG_PAYLOAD, 128, &rep, &res, KVO_EAGAIN);
    ck_assert_uint_eq(res.sent, 0);
    tr_replies_fini(&rep);
    relay_state_free(s);
}
END_TEST

/* ---- answers through the pipe --------------------------------------------------*/

/* Batches from..from+n-1 of a stream with branching chains, removes and
 * second copies, over two ranks; each batch published on its own. */
static void traffic(tr *t, uint64_t from, uint64_t n) {
    for (uint64_t seq = from; seq < from + n; seq++) {
        tb b;
        tb_begin(&b);
        uint64_t h[3] = {5000 + 3 * seq, 5001 + 3 * seq, 5002 + 3 * seq};
        if (seq >= 4 && seq % 4 == 3) {
            /* drop the tail (a leaf) of the chain of 4 batches ago */
            uint64_t old = 5002 + 3 * (seq - 4);
            tb_remove(&b, &old, 1);
        }
        /* under the middle of the chain 2 batches ago (the same rank) */
        bool hp = seq >= 2;
        uint64_t parent = hp ? 5001 + 3 * (seq - 2) : 0;
        tb_store(&b, hp, parent, h, 3);
        if (seq % 5 == 1) tb_store(&b, hp, parent, h, 1); /* a second copy */
        tr_live_tb(t, 0, seq, &b, (int)(seq % 2));
        tr_flush(t);
    }
}

START_TEST(too_new_before_the_first_envelope_and_beyond_the_last) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    ck_assert_int_eq(
        tr_recover(&t, "{\"from_sequence\": 0}", BIG_PAYLOAD, &rep, &out),
        KVO_OK);
    ck_assert_int_eq(out.kind, WIRE_REPLY_TOO_NEW);
    ck_assert_uint_eq(rep.n, 1);
    ck_assert_int_eq(rep.v[0].kind, WIRE_REPLY_TOO_NEW);
    ck_assert(!rep.v[0].end.has_as_of); /* last_sequence: null */
    traffic(&t, 0, 3);
    ck_assert_int_eq(
        tr_recover(&t, "{\"from_sequence\": 3}", BIG_PAYLOAD, &rep, &out),
        KVO_OK);
    ck_assert_int_eq(out.kind, WIRE_REPLY_TOO_NEW);
    ck_assert(rep.v[0].end.has_as_of);
    ck_assert_uint_eq(rep.v[0].end.as_of, 2);
    ck_assert_str_eq((const char *)rep.v[0].raw.data, "{\"last_sequence\":2}");
    ck_assert_uint_eq(tr_stats(&t)->recovery_requests[RELAY_too_new], 2);
    ck_assert_uint_eq(relay_stats_recovery_requests(tr_stats(&t)), 2);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

START_TEST(events_are_the_ring_envelopes_byte_for_byte) {
    tr t;
    tr_init(&t, NULL, 1, true);
    traffic(&t, 0, 12);
    ck_assert_uint_eq(t.n, 12);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    ck_assert_int_eq(
        tr_recover(&t, "{\"from_sequence\": 7}", BIG_PAYLOAD, &rep, &out),
        KVO_OK);
    ck_assert_int_eq(out.kind, WIRE_REPLY_EVENTS);
    ck_assert_uint_eq(out.sent, 5);
    ck_assert_uint_eq(rep.n, 6);
    for (size_t i = 0; i < 5; i++) {
        tr_rmsg *m = &rep.v[i];
        tr_env *live = &t.msgs[7 + i];
        ck_assert_int_eq(m->kind, WIRE_REPLY_EVENTS);
        ck_assert_uint_eq(m->raw.len, live->raw.len);
        ck_assert_int_eq(memcmp(m->raw.data, live->raw.data, m->raw.len), 0);
        ck_assert(m->has_range == live->has_range);
        ck_assert_uint_eq(m->first, live->first);
        ck_assert_uint_eq(m->last, live->last);
    }
    tr_rmsg *end = &rep.v[5];
    ck_assert_int_eq(end->kind, WIRE_REPLY_END);
    ck_assert_int_eq(end->end.kind, WIRE_REPLY_EVENTS);
    ck_assert_uint_eq(end->end.sent, 5);
    ck_assert_uint_eq(end->end.as_of, 11);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->recovery_requests[RELAY_events], 1);
    ck_assert_uint_eq(s->recovery_envelopes_sent, 5);
    ck_assert_uint_eq(s->ring_envelopes, 12);
    ck_assert_uint_gt(s->ring_bytes, 0);
    /* the last one alone */
    ck_assert_int_eq(
        tr_recover(&t, "{\"from_sequence\": 11}", BIG_PAYLOAD, &rep, &out),
        KVO_OK);
    ck_assert_uint_eq(out.sent, 1);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

/* A batch of one root chain of n blocks of its own, on rank 0. */
static void wide(tr *t, uint64_t seq, uint32_t n) {
    static uint64_t h[512];
    ck_assert_uint_le(n, KVO_ARRAY_LEN(h));
    for (uint32_t i = 0; i < n; i++) h[i] = 1000000 + seq * 1000 + i;
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, h, n);
    tr_live_tb(t, 0, seq, &b, 0);
    tr_flush(t);
}

/* With a ring of 48 KiB and envelopes from a few hundred bytes to 17 KB,
 * its buffer is written over many times; after each round the envelopes it
 * answers with are still the ones published, byte for byte, and the one
 * before them is gone (a dump answers). */
START_TEST(events_stay_byte_for_byte_while_the_ring_wraps) {
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.ring_max_bytes = 48u << 10;
    tr t;
    tr_init(&t, &c, 1, true);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    uint64_t seq = 0;
    for (uint32_t round = 0; round < 60; round++) {
        traffic(&t, seq, 3);
        seq += 3;
        wide(&t, seq++, 1 + (round * 97) % 300);
        ck_assert_uint_eq(t.n, seq);
        uint64_t held = tr_stats(&t)->ring_envelopes;
        ck_assert_uint_ge(held, 3);
        uint64_t from = seq - held;
        char req[64];
        snprintf(req, sizeof(req), "{\"from_sequence\": %" PRIu64 "}", from);
        ck_assert_int_eq(tr_recover(&t, req, BIG_PAYLOAD, &rep, &out), KVO_OK);
        ck_assert_int_eq(out.kind, WIRE_REPLY_EVENTS);
        ck_assert_uint_eq(out.sent, held);
        for (uint64_t i = 0; i < out.sent; i++) {
            const tr_rmsg *m = &rep.v[i];
            const tr_env *live = &t.msgs[from + i];
            ck_assert_uint_eq(m->raw.len, live->raw.len);
            ck_assert_int_eq(memcmp(m->raw.data, live->raw.data, m->raw.len),
                             0);
            ck_assert(m->has_range == live->has_range);
            ck_assert_uint_eq(m->last, live->last);
        }
        if (from > 0) {
            snprintf(req, sizeof(req), "{\"from_sequence\": %" PRIu64 "}",
                     from - 1);
            ck_assert_int_eq(tr_recover(&t, req, BIG_PAYLOAD, &rep, &out),
                             KVO_OK);
            ck_assert_int_eq(out.kind, WIRE_REPLY_DUMP);
        }
    }
    ck_assert_uint_le(tr_stats(&t)->ring_bytes, 48u << 10);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

/* The index a subscriber of every envelope built, against the one a dump
 * builds in an empty tree. */
static void dump_rebuilds(tr *t, const char *request, size_t max_payload) {
    idx_tree *live, *dumped;
    ck_assert_int_eq(idx_tree_new(&live), KVO_OK);
    ck_assert_int_eq(idx_tree_new(&dumped), KVO_OK);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    ck_assert_int_eq(tr_recover(t, request, max_payload, &rep, &out), KVO_OK);
    for (size_t i = 0; i < t->n; i++) tr_tree_apply(live, &t->msgs[i].m);
    ck_assert_int_eq(out.kind, WIRE_REPLY_DUMP);
    ck_assert(out.has_as_of);
    ck_assert_uint_eq(out.as_of, t->n - 1);
    ck_assert_uint_eq(rep.n, out.sent + 1);
    for (size_t i = 0; i < out.sent; i++) {
        ck_assert_int_eq(rep.v[i].kind, WIRE_REPLY_DUMP);
        ck_assert_uint_eq(rep.v[i].m.sequence, out.as_of);
        tr_tree_apply(dumped, &rep.v[i].m);
    }
    tr_rmsg *end = &rep.v[out.sent];
    ck_assert_int_eq(end->kind, WIRE_REPLY_END);
    ck_assert_int_eq(end->end.kind, WIRE_REPLY_DUMP);
    ck_assert_uint_eq(end->end.sent, out.sent);
    ck_assert_uint_eq(end->end.as_of, out.as_of);
    ck_assert_uint_eq(end->end.blocks, out.blocks);
    ck_assert_uint_gt(tr_same_trees(live, dumped), 10);
    uint64_t wm;
    ck_assert(tr_watermark(t, &wm));
    ck_assert(rep.v[out.sent - 1].has_range);
    ck_assert_uint_eq(rep.v[out.sent - 1].last, wm);
    ck_assert_uint_eq(out.blocks, tr_stats(t)->state_blocks);
    tr_replies_fini(&rep);
    idx_tree_free(live);
    idx_tree_free(dumped);
}

START_TEST(an_evicted_sequence_or_a_dump_request_gets_a_dump_of_the_index) {
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.ring_max_envelopes = 8;
    tr t;
    tr_init(&t, &c, 1, true);
    traffic(&t, 0, 40);
    dump_rebuilds(&t, "{\"from_sequence\": 31}", BIG_PAYLOAD); /* evicted */
    dump_rebuilds(&t, "{\"dump\": true}", BIG_PAYLOAD);
    dump_rebuilds(&t, "{\"dump\": true, \"from_sequence\": 39}", 1500);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->recovery_requests[RELAY_dump], 3);
    ck_assert_uint_eq(s->dumps_sent, 3);
    ck_assert_uint_eq(s->dump_blocks_sent, 3 * s->state_blocks);
    ck_assert_uint_eq(s->dump_orphans, 0);
    ck_assert_uint_eq(s->ring_envelopes, 8);
    /* the state after cleared: the ranks only */
    tb b;
    tb_begin(&b);
    tb_cleared(&b);
    tr_live_tb(&t, 0, 40, &b, 0);
    dump_rebuilds(&t, "{\"dump\": true}", BIG_PAYLOAD);
    tr_fini(&t);
}
END_TEST

/* A dump answers between two envelopes: a batch still pending is published
 * first, and as_of is its envelope. A dump before the first envelope sends
 * only its end. */
START_TEST(a_dump_publishes_what_is_pending_first) {
    tr t;
    tr_init(&t, NULL, 2, true);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    ck_assert_int_eq(
        tr_recover(&t, "{\"dump\": true}", BIG_PAYLOAD, &rep, &out), KVO_OK);
    ck_assert_uint_eq(rep.n, 1);
    ck_assert_int_eq(rep.v[0].kind, WIRE_REPLY_END);
    ck_assert(!rep.v[0].end.has_as_of);
    ck_assert_str_eq((const char *)rep.v[0].raw.data,
                     "{\"kind\":\"dump\",\"sent\":0,\"as_of\":null,"
                     "\"blocks\":0}");
    tr_live_tag(&t, 1, 0, 1);
    tr_live_tag(&t, 1, 1, 2);
    ck_assert_uint_eq(t.n, 0); /* pending */
    ck_assert_int_eq(
        tr_recover(&t, "{\"dump\": true}", BIG_PAYLOAD, &rep, &out), KVO_OK);
    ck_assert_uint_eq(t.n, 1);
    ck_assert_uint_eq(out.as_of, 0);
    ck_assert_uint_eq(out.blocks, 2);
    ck_assert_uint_eq(rep.n, 2);
    /* cleared for both sources' ranks (0 and 1), each in every tier, then
     * the two stores */
    const wire_plane_msg *m = &rep.v[0].m;
    ck_assert_uint_eq(m->n_events, 2 * WIRE_TIER_COUNT + 2);
    for (uint32_t k = 0; k < 2 * WIRE_TIER_COUNT; k++) {
        ck_assert_int_eq(m->events[k].type, WIRE_R_CLEARED);
        ck_assert_uint_eq(m->events[k].dp_rank, k / WIRE_TIER_COUNT);
        ck_assert_int_eq(m->events[k].tier, k % WIRE_TIER_COUNT);
    }
    ck_assert_uint_eq(m->events[2 * WIRE_TIER_COUNT].blocks[0].block_hash,
                      TB_TAG_BLOCK + 1);
    ck_assert(rep.v[0].has_range);
    ck_assert_uint_eq(rep.v[0].last, 1);
    uint32_t ranks[RELAY_PIPE_MAX_RANKS];
    ck_assert_uint_eq(relay_pipe_ranks(t.p, ranks, RELAY_PIPE_MAX_RANKS), 2);
    uint64_t last;
    ck_assert(relay_pipe_last_sequence(t.p, &last));
    ck_assert_uint_eq(last, 0);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

/* A store whose parent was removed since is dumped under the root and
 * counted. */
START_TEST(a_block_whose_parent_is_gone_is_dumped_under_the_root) {
    tr t;
    tr_init(&t, NULL, 1, true);
    uint64_t a = 1, bc[2] = {2, 3};
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, &a, 1);
    tb_store(&b, true, a, bc, 2);
    tr_live_tb(&t, 0, 0, &b, 0);
    tb_begin(&b);
    tb_remove(&b, &a, 1);
    tr_live_tb(&t, 0, 1, &b, 0);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    ck_assert_int_eq(
        tr_recover(&t, "{\"dump\": true}", BIG_PAYLOAD, &rep, &out), KVO_OK);
    ck_assert_uint_eq(out.blocks, 2);
    ck_assert_uint_eq(out.orphans, 1);
    ck_assert_uint_eq(tr_stats(&t)->dump_orphans, 1);
    const wire_plane_msg *m = &rep.v[0].m;
    /* cleared (one per tier), then 2 -> 3 */
    ck_assert_uint_eq(m->n_events, WIRE_TIER_COUNT + 1);
    const wire_revent *st = &m->events[WIRE_TIER_COUNT];
    ck_assert_int_eq(st->type, WIRE_R_STORED);
    ck_assert(!st->has_parent);
    ck_assert_uint_eq(st->n_blocks, 2);
    ck_assert_uint_eq(st->blocks[0].block_hash, 2);
    ck_assert_uint_eq(st->blocks[1].block_hash, 3);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

/* An index clears only the tier a cleared names: a dump clears each rank
 * in every tier, then restates every tier's blocks, the lower tiers' with
 * the tokens_hash they were forwarded with. */
START_TEST(a_dump_clears_every_tier_and_restates_the_lower_tiers) {
    tr t;
    tr_init(&t, NULL, 1, true);
    uint64_t a = 41, c = 42;
    tb b;
    tb_begin(&b);
    tb_store_in(&b, "GPU", false, 0, &a, 1, "[[\"tenant-1\"]]");
    tb_store_in(&b, "CPU", false, 0, &a, 1, NULL); /* the GPU's hash */
    tb_store_in(&b, "CPU", true, a, &c, 1, NULL);
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    ck_assert_int_eq(
        tr_recover(&t, "{\"dump\": true}", BIG_PAYLOAD, &rep, &out), KVO_OK);
    ck_assert_uint_eq(out.blocks, 3);
    ck_assert_uint_eq(out.orphans, 0);
    const wire_revent *live = &t.msgs[0].m.events[0];
    ck_assert_int_eq(live->tier, WIRE_TIER_DEVICE);
    ck_assert_uint_ne(live->blocks[0].tokens_hash, tb_tokens_hash(a, 16));
    const wire_plane_msg *m = &rep.v[0].m;
    ck_assert_uint_eq(m->n_events, WIRE_TIER_COUNT + 2);
    for (int k = 0; k < WIRE_TIER_COUNT; k++) {
        ck_assert_int_eq(m->events[k].type, WIRE_R_CLEARED);
        ck_assert_int_eq(m->events[k].tier, k);
        ck_assert_uint_eq(m->events[k].dp_rank, 0);
    }
    const wire_revent *gpu = &m->events[WIRE_TIER_COUNT],
                      *cpu = &m->events[WIRE_TIER_COUNT + 1];
    ck_assert_int_eq(gpu->tier, WIRE_TIER_DEVICE);
    ck_assert_uint_eq(gpu->n_blocks, 1);
    ck_assert_uint_eq(gpu->blocks[0].tokens_hash, live->blocks[0].tokens_hash);
    ck_assert_int_eq(cpu->tier, WIRE_TIER_HOST_PINNED);
    ck_assert_uint_eq(cpu->n_blocks, 2);
    ck_assert_uint_eq(cpu->blocks[0].block_hash, a);
    ck_assert_uint_eq(cpu->blocks[0].tokens_hash, live->blocks[0].tokens_hash);
    ck_assert_uint_eq(cpu->blocks[1].block_hash, c);
    ck_assert_uint_eq(cpu->blocks[1].tokens_hash, tb_tokens_hash(c, 16));
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

/* An envelope that could not even be encoded took a sequence but is in no
 * ring: a request from before it gets a dump, never a short run. */
START_TEST(a_sequence_missing_from_the_ring_is_answered_with_a_dump) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_tag(&t, 0, 0, 0);
    tr_flush(&t); /* envelope 0 */
    uint64_t h[200];
    for (uint64_t i = 0; i < 200; i++) h[i] = 9000 + i;
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, h, 200); /* larger than envelope 0's buffer */
    tr_live_tb(&t, 0, 1, &b, 0);
    kvo_alloc_fail_after(0);
    tr_flush(&t); /* envelope 1: not encoded */
    kvo_alloc_fail_after(-1);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->publish_dropped, 1);
    ck_assert_uint_eq(s->ring_envelopes, 1);
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    ck_assert_int_eq(
        tr_recover(&t, "{\"from_sequence\": 0}", BIG_PAYLOAD, &rep, &out),
        KVO_OK);
    ck_assert_int_eq(out.kind, WIRE_REPLY_DUMP);
    ck_assert_uint_eq(out.as_of, 1);
    ck_assert_uint_eq(out.blocks, 201);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

START_TEST(bad_requests_are_counted_and_get_no_answer) {
    tr t;
    tr_init(&t, NULL, 1, true);
    traffic(&t, 0, 2);
    static const char *const bad[] = {
        "",
        "{",
        "[]",
        "{\"from_sequence\": -1}",
        "{\"from_sequence\": 1.5}",
        "{\"dump\": 1}",
        "{}",
        "{\"from_sequence\": 18446744073709551616}",
        "{\"from_sequence\": 1} x"};
    tr_replies rep;
    tr_replies_init(&rep);
    relay_recovery out;
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        kvo_status st = tr_recover(&t, bad[i], BIG_PAYLOAD, &rep, &out);
        ck_assert_msg(st != KVO_OK, "'%s' was taken", bad[i]);
        ck_assert_uint_eq(rep.n, 0);
    }
    /* no inbox to answer to, and a body far longer than any request */
    kvo_err err;
    const char *ok = "{\"dump\": true}";
    ck_assert_int_eq(relay_pipe_recover(t.p, NULL, (const uint8_t *)ok,
                                        strlen(ok), BIG_PAYLOAD, tr_reply_keep,
                                        &rep, &out, &err),
                     KVO_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "inbox"));
    static char huge[RELAY_RECOVERY_REQUEST_MAX + 2];
    memset(huge, ' ', sizeof(huge) - 1);
    huge[0] = '{';
    huge[sizeof(huge) - 2] = '}';
    ck_assert_int_eq(tr_recover(&t, huge, BIG_PAYLOAD, &rep, &out),
                     KVO_ETOOBIG);
    ck_assert_uint_eq(rep.n, 0);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->recovery_bad_requests, KVO_ARRAY_LEN(bad) + 2);
    ck_assert_uint_eq(relay_stats_recovery_requests(s), 0);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

START_TEST(a_reply_that_cannot_be_sent_abandons_the_stream) {
    tr t;
    tr_init(&t, NULL, 1, true);
    traffic(&t, 0, 6);
    tr_replies rep;
    tr_replies_init(&rep);
    rep.fail_at = 2;
    relay_recovery out;
    ck_assert_int_eq(
        tr_recover(&t, "{\"from_sequence\": 0}", BIG_PAYLOAD, &rep, &out),
        KVO_EAGAIN);
    ck_assert_uint_eq(rep.n, 2); /* no end */
    ck_assert_uint_eq(out.sent, 2);
    rep.fail_at = 1;
    ck_assert_int_eq(tr_recover(&t, "{\"dump\": true}", 1200, &rep, &out),
                     KVO_EAGAIN);
    ck_assert_uint_eq(rep.n, 1);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->recovery_replies_failed, 2);
    ck_assert_uint_eq(s->dumps_sent, 0);
    tr_replies_fini(&rep);
    tr_fini(&t);
}
END_TEST

Suite *suite_recover(void) {
    Suite *s = suite_create("recover");
    TCase *tc = tcase_create("state");
    tcase_add_test(tc, a_block_stays_until_its_last_copy_is_removed);
    tcase_add_test(tc, ranks_beyond_the_table_are_refused);
    tcase_add_test(tc, a_walk_sends_parents_first_and_orphans_under_the_root);
    tcase_add_test(tc, the_state_follows_a_reference_model);
    tcase_add_test(tc, the_state_costs_a_bounded_number_of_bytes_per_block);
    suite_add_tcase(s, tc);
    tc = tcase_create("ring");
    tcase_add_test(tc,
                   the_ring_keeps_the_last_envelopes_within_count_and_bytes);
    tcase_add_test(tc, an_envelope_the_ring_cannot_keep_empties_it);
    tcase_add_test(tc, the_ring_follows_a_model_through_many_passes);
    suite_add_tcase(s, tc);
    tc = tcase_create("dump");
    tcase_add_test(
        tc, a_dump_is_cut_under_max_payload_and_the_last_has_the_watermark);
    tcase_add_test(tc, a_dump_that_cannot_fit_a_block_or_be_sent_stops);
    suite_add_tcase(s, tc);
    tc = tcase_create("answers");
    tcase_add_test(tc, too_new_before_the_first_envelope_and_beyond_the_last);
    tcase_add_test(tc, events_are_the_ring_envelopes_byte_for_byte);
    tcase_add_test(tc, events_stay_byte_for_byte_while_the_ring_wraps);
    tcase_add_test(
        tc, an_evicted_sequence_or_a_dump_request_gets_a_dump_of_the_index);
    tcase_add_test(tc, a_dump_publishes_what_is_pending_first);
    tcase_add_test(tc, a_block_whose_parent_is_gone_is_dumped_under_the_root);
    tcase_add_test(tc, a_dump_clears_every_tier_and_restates_the_lower_tiers);
    tcase_add_test(tc,
                   a_sequence_missing_from_the_ring_is_answered_with_a_dump);
    tcase_add_test(tc, bad_requests_are_counted_and_get_no_answer);
    tcase_add_test(tc, a_reply_that_cannot_be_sent_abandons_the_stream);
    suite_add_tcase(s, tc);
    return s;
}
