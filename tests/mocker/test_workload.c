/* A long random workload with chunked prefill, preemption, eviction,
 * duplicate copies, LoRA and a prefix-cache reset, its published events
 * carried the way kvo-relay carries them (DESIGN §6: router hashes, a
 * reference count per block hash so only a hash's last copy going away is
 * forwarded) into the indexer's radix tree. Model-based, seeded (printed):
 *   - the tree rejects nothing (no unknown parent, no unknown block);
 *   - after every step, for sampled prompts, the engine's hit blocks
 *     (/kvo/probe's answer) equal the index's score capped at
 *     (n - 1) // block_size: the events describe the cache exactly;
 *   - after every step, the engine's cached set (distinct hashes and their
 *     digest) equals the one the events describe (a checkpoint's
 *     comparison, with the digest kept as the relay's counts move). */
#include "mt.h"
#include "idx_int.h" /* idx_tree_check */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Suite *suite_workload(void);

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The relay's dedup (a reference count per engine hash) and the set the
 * events describe, in one copy-counted set. */
typedef struct relay_model {
    mt_set set;
    uint64_t event_id;
    idx_tree *tree;
    uint32_t bs;
    uint64_t stores, removes_forwarded, removes_held, cleared;
} relay_model;

static void apply(relay_model *m, wire_revent *ev) {
    ev->worker_id = 7;
    ev->dp_rank = 0;
    ev->tier = WIRE_TIER_DEVICE;
    ev->event_id = ++m->event_id;
    idx_evstatus st;
    ck_assert_int_eq(idx_tree_apply(m->tree, ev, &st), KVO_OK);
    ck_assert_msg(st == IDX_EV_OK, "event %llu (%s) rejected: %s",
                  (unsigned long long)ev->event_id, idx_rtype_name(ev->type),
                  idx_evstatus_name(st));
}

static void on_batch(void *ctx, const wire_batch *b) {
    relay_model *m = ctx;
    for (uint32_t i = 0; i < b->n_events; i++) {
        const wire_event *e = &b->events[i];
        wire_revent ev;
        memset(&ev, 0, sizeof(ev));
        if (e->type == WIRE_EV_CLEARED) {
            mt_set_clear(&m->set);
            ev.type = WIRE_R_CLEARED;
            apply(m, &ev);
            m->cleared++;
            continue;
        }
        if (e->type == WIRE_EV_STORED) {
            ck_assert_uint_eq(e->n_tokens, e->n_hashes * m->bs);
            wire_rblock blocks[512];
            ck_assert_uint_le(e->n_hashes, 512);
            /* The relay's router seed: the event's LoRA name (no salt here). */
            uint64_t seed =
                wire_router_seed(e->lora_name.p, e->lora_name.len, NULL, 0);
            for (uint32_t k = 0; k < e->n_hashes; k++) {
                blocks[k].block_hash = e->hashes[k].key;
                blocks[k].tokens_hash = wire_router_hash(
                    e->token_ids + (size_t)k * m->bs, m->bs, seed);
                if (k)
                    mt_set_add(&m->set, e->hashes[k].key, true,
                               e->hashes[k - 1].key);
                else
                    mt_set_add(&m->set, e->hashes[k].key,
                               e->parent.kind != WIRE_HASH_NONE, e->parent.key);
            }
            ev.type = WIRE_R_STORED;
            ev.has_parent = e->parent.kind != WIRE_HASH_NONE;
            ev.parent_hash = e->parent.key;
            ev.n_blocks = e->n_hashes;
            ev.blocks = blocks;
            apply(m, &ev);
            m->stores += e->n_hashes;
            continue;
        }
        for (uint32_t k = 0; k < e->n_hashes; k++) {
            uint64_t h = e->hashes[k].key;
            if (mt_set_del(&m->set, h) > 0) {
                m->removes_held++;
                continue;
            }
            ev.type = WIRE_R_REMOVED;
            ev.n_removed = 1;
            ev.removed = &h;
            apply(m, &ev);
            m->removes_forwarded++;
        }
    }
}

#define N_PROMPTS 400
typedef struct prompt {
    uint64_t tok[96];
    uint32_t n;
    bool lora;
} prompt;

static void make_prompts(prompt *p) {
    uint64_t prefix[6][24];
    for (int g = 0; g < 6; g++)
        for (int i = 0; i < 24; i++) prefix[g][i] = 1 + rnd() % 60;
    for (int i = 0; i < N_PROMPTS; i++) {
        int g = (int)(rnd() % 6);
        uint32_t plen = (uint32_t)(rnd() % 25);
        uint32_t tail = 1 + (uint32_t)(rnd() % 60);
        if (i > 0 && rnd() % 5 == 0) { /* a longer version of an earlier one */
            const prompt *q = &p[rnd() % (uint64_t)i];
            memcpy(p[i].tok, q->tok, q->n * sizeof(uint64_t));
            p[i].n = q->n;
            p[i].lora = q->lora;
            uint32_t more = (uint32_t)(rnd() % 20);
            for (uint32_t k = 0; k < more && p[i].n < 96; k++)
                p[i].tok[p[i].n++] = 1 + rnd() % 60;
            continue;
        }
        memcpy(p[i].tok, prefix[g], plen * sizeof(uint64_t));
        p[i].n = plen;
        for (uint32_t k = 0; k < tail && p[i].n < 96; k++)
            p[i].tok[p[i].n++] = 1 + rnd() % 60;
        p[i].lora = rnd() % 8 == 0;
    }
}

static void check_prompts(mt_eng *m, relay_model *rm, prompt *p, idx_scores *sc,
                          uint32_t samples) {
    uint32_t bs = m->cfg.block_size;
    for (uint32_t s = 0; s < samples; s++) {
        const prompt *q = &p[rnd() % N_PROMPTS];
        mock_hash hs[96];
        uint32_t nb = q->n / bs;
        ck_assert_int_eq(mock_hasher_blocks(m->h, q->tok, bs, 0, nb, NULL,
                                            q->lora ? "L1" : NULL, NULL, NULL,
                                            hs),
                         KVO_OK);
        uint32_t engine = mock_engine_probe(m->e, hs, q->n);
        uint64_t rh[96];
        size_t n =
            idx_prompt_hash(q->tok, q->n, bs, q->lora ? "L1" : NULL, NULL, rh);
        ck_assert_int_eq(idx_tree_query(rm->tree, rh, n, sc), KVO_OK);
        uint32_t index = sc->n ? sc->v[0].blocks : 0;
        uint32_t cap = (q->n - 1) / bs;
        if (index > cap) index = cap;
        ck_assert_msg(
            engine == index,
            "prompt of %u tokens: engine holds %u leading blocks, the "
            "index %u (seed %llu)",
            q->n, engine, index, (unsigned long long)rng_state);
    }
}

static void run_workload(uint64_t seed, uint32_t blocks, uint32_t budget,
                         uint32_t n_requests) {
    rng_state = seed;
    fprintf(stderr, "workload seed %llu, %u blocks, budget %u\n",
            (unsigned long long)seed, blocks, budget);
    prompt *p = kvo_calloc(N_PROMPTS, sizeof(*p));
    make_prompts(p);
    mock_cfg c;
    mt_cfg(&c, 4, blocks);
    c.max_num_batched_tokens = budget;
    c.max_num_seqs = 12;
    c.hash_algo = WIRE_ALGO_XXHASH;
    c.seed = seed;
    mt_eng m;
    mt_eng_init(&m, &c, 0);
    relay_model *rm = kvo_calloc(1, sizeof(*rm));
    rm->bs = 4;
    ck_assert_int_eq(idx_tree_new(&rm->tree), KVO_OK);
    idx_scores sc;
    idx_scores_init(&sc);
    mt_out *outs = kvo_calloc(n_requests, sizeof(mt_out));
    uint32_t added = 0, steps = 0;
    bool reset_done = false;
    while (added < n_requests || mock_engine_has_work(m.e)) {
        uint32_t k = (uint32_t)(rnd() % 3);
        bool draining = !reset_done && added >= n_requests / 2;
        for (uint32_t i = 0; i < k && added < n_requests && !draining; i++) {
            const prompt *q = &p[rnd() % N_PROMPTS];
            mock_req_in in = {.tokens = q->tok,
                              .n_tokens = q->n,
                              .max_tokens = 1 + (uint32_t)(rnd() % 24),
                              .lora_name = q->lora ? "L1" : NULL,
                              .on_output = mt_on_output,
                              .user = &outs[added]};
            ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
            added++;
        }
        if (draining && !mock_engine_has_work(m.e)) { /* idle: reset */
            ck_assert(mock_engine_reset_prefix_cache(m.e));
            reset_done = true;
        }
        if (mt_step(&m, NULL)) on_batch(rm, &m.last);
        steps++;
        check_prompts(&m, rm, p, &sc, 4);
        mock_engine_stats es = mt_stats(&m);
        ck_assert_msg(
            es.cached_distinct == rm->set.distinct &&
                es.cached_digest == rm->set.digest,
            "step %u: the engine caches %llu hashes (digest %016llx), the "
            "events say %llu (%016llx)",
            steps, (unsigned long long)es.cached_distinct,
            (unsigned long long)es.cached_digest,
            (unsigned long long)rm->set.distinct,
            (unsigned long long)rm->set.digest);
    }
    mock_engine_stats st;
    mock_engine_stats_get(m.e, &st);
    fprintf(stderr,
            "  %u steps, %llu preemptions, %llu blocks stored, %llu removed "
            "(%llu held back as other copies remained), %llu cleared\n",
            steps, (unsigned long long)st.preemptions,
            (unsigned long long)st.blocks_stored,
            (unsigned long long)st.blocks_removed,
            (unsigned long long)rm->removes_held,
            (unsigned long long)rm->cleared);
    ck_assert_uint_eq(st.requests_finished, n_requests);
    /* The workload exercised what it claims to. */
    ck_assert_uint_gt(st.preemptions, 0);
    ck_assert_uint_gt(st.blocks_removed, 1000);
    ck_assert_uint_gt(rm->removes_held, 0);
    ck_assert_uint_eq(rm->cleared, 1);
    idx_counters ic;
    idx_tree_counters(rm->tree, &ic);
    for (int t = 1; t <= 3; t++)
        for (int s = 1; s < IDX_EV_STATUS_COUNT; s++)
            ck_assert_uint_eq(ic.events[t][s], 0);
    ck_assert_uint_eq(ic.blocks_not_found, 0);
    char msg[256];
    ck_assert_msg(idx_tree_check(rm->tree, NULL, msg, sizeof(msg)) == KVO_OK,
                  "%s", msg);
    check_prompts(&m, rm, p, &sc, N_PROMPTS);
    idx_scores_fini(&sc);
    idx_tree_free(rm->tree);
    kvo_free(rm);
    kvo_free(outs);
    kvo_free(p);
    mt_eng_fini(&m);
}

START_TEST(random_workload_events_rebuild_the_cache_exactly_in_the_index) {
    run_workload(20261130, 48, 24, 3000);
}
END_TEST

START_TEST(random_workload_with_a_roomier_pool_and_bigger_chunks) {
    run_workload(7, 160, 64, 3000);
}
END_TEST

Suite *suite_workload(void) {
    const TTest *tests[] = {
        random_workload_events_rebuild_the_cache_exactly_in_the_index,
        random_workload_with_a_roomier_pool_and_bigger_chunks,
    };
    return mt_suite(suite_create("workload"), 600, tests, KVO_ARRAY_LEN(tests));
}
