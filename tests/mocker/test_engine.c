/* The engine core: vLLM v1 BlockPool and Scheduler semantics (DESIGN §8). */
#include "mt.h"

#include <math.h>
#include <stdio.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

Suite *suite_engine(void);

static const uint64_t H0 = 10362225831949560093ull; /* sha256 seed 0 bs 4, */
static const uint64_t H1 = 12472515041799373675ull; /* tokens 1..12 (hash */
static const uint64_t H2 = 8105927037106591648ull;  /* vectors)           */

static uint32_t free_queue(mt_eng *m, uint32_t *ids) {
    return mock_engine_free_queue(m->e, ids, 4096);
}

static uint32_t copies(mt_eng *m, uint64_t key) {
    uint32_t ids[64];
    return mock_engine_copies(m->e, key, ids, 64);
}

/* An engine for c, and t = tokens 1..12 (with block size 4: the three full
 * blocks H0, H1, H2). */
static void start_with(mt_eng *m, const mock_cfg *c, uint64_t t[12]) {
    mt_eng_init(m, c, 0);
    mt_iota(t, 12, 1);
}

/* The engine most cases use: block size 4, blocks blocks. */
static void start(mt_eng *m, uint32_t blocks, uint64_t t[12]) {
    mock_cfg c;
    mt_cfg(&c, 4, blocks);
    start_with(m, &c, t);
}

START_TEST(fresh_pool_queues_every_block_but_the_null_block_in_id_order) {
    mt_eng m;
    mt_eng_start(&m, 4, 10);
    uint32_t ids[16];
    ck_assert_uint_eq(free_queue(&m, ids), 9);
    for (uint32_t i = 0; i < 9; i++) ck_assert_uint_eq(ids[i], i + 1);
    ck_assert(!mt_block(&m, 0).in_free_queue);
    mock_engine_stats st = mt_stats(&m);
    ck_assert_uint_eq(st.free_blocks, 9);
    ck_assert(st.usage == 0.0);
    mt_eng_fini(&m);
}
END_TEST

START_TEST(prefill_stores_every_full_block_with_the_vllm_fields) {
    mt_eng m;
    uint64_t t[12];
    start(&m, 10, t);
    mt_out out = {0};
    mt_add(&m, t, 12, 1, &out);
    ck_assert(mt_step(&m, NULL));
    ck_assert(!mock_engine_has_work(m.e));
    const wire_batch *b = &m.last;
    ck_assert(b->dp_rank.set && b->dp_rank.v == 0);
    ck_assert_uint_eq(b->n_events, 1);
    const wire_event *ev = &b->events[0];
    ck_assert_int_eq(ev->type, WIRE_EV_STORED);
    ck_assert_uint_eq(ev->n_hashes, 3);
    ck_assert(ev->hashes[0].kind == WIRE_HASH_UINT && ev->hashes[0].key == H0);
    ck_assert(ev->hashes[1].key == H1 && ev->hashes[2].key == H2);
    ck_assert_int_eq(ev->parent.kind, WIRE_HASH_NONE);
    ck_assert_uint_eq(ev->n_tokens, 12);
    for (uint32_t i = 0; i < 12; i++)
        ck_assert_uint_eq(ev->token_ids[i], i + 1);
    ck_assert(ev->block_size.set && ev->block_size.v == 4);
    ck_assert(!ev->lora_id.set && ev->lora_name.p == NULL);
    ck_assert(ev->medium.len == 3 && memcmp(ev->medium.p, "GPU", 3) == 0);
    ck_assert(ev->group_idx.set && ev->group_idx.v == 0);
    ck_assert(ev->kv_cache_spec_kind.len == 14);
    static const uint8_t nil3[] = {0x93, 0xc0, 0xc0, 0xc0};
    ck_assert(ev->extra_keys.len == 4 &&
              memcmp(ev->extra_keys.p, nil3, 4) == 0);
    /* Finished: freed tail first, so the deepest block is next to go. */
    ck_assert_int_eq(out.finish, MOCK_FINISH_LENGTH);
    ck_assert_uint_eq(out.cached, 0);
    uint32_t ids[16];
    ck_assert_uint_eq(free_queue(&m, ids), 9);
    static const uint32_t want[] = {4, 5, 6, 7, 8, 9, 3, 2, 1};
    for (uint32_t i = 0; i < 9; i++) ck_assert_uint_eq(ids[i], want[i]);
    ck_assert(mt_block(&m, 3).cached && mt_block(&m, 3).hash.key == H2);
    mt_eng_fini(&m);
}
END_TEST

START_TEST(hit_is_capped_so_a_fully_cached_prompt_stores_a_second_copy) {
    mt_eng m;
    uint64_t t[12];
    start(&m, 10, t);
    mt_out o1 = {0}, o2 = {0};
    mt_add_run(&m, t, 12, 1, &o1, NULL);
    mock_hash hs[3];
    mt_hash(&m, t, 3, hs);
    ck_assert_uint_eq(mock_engine_probe(m.e, hs, 12), 2); /* (12-1)//4 */
    ck_assert_uint_eq(mock_engine_probe(m.e, hs, 13), 3);
    mt_add(&m, t, 12, 1, &o2);
    mock_step st;
    ck_assert(mt_step(&m, &st));
    ck_assert_uint_eq(o2.cached, 8);
    ck_assert_uint_eq(m.last.n_events, 1);
    const wire_event *ev = &m.last.events[0];
    ck_assert_uint_eq(ev->n_hashes, 1);
    ck_assert(ev->hashes[0].key == H2);
    ck_assert(ev->parent.kind == WIRE_HASH_UINT && ev->parent.key == H1);
    ck_assert_uint_eq(ev->n_tokens, 4);
    ck_assert_uint_eq(ev->token_ids[0], 9);
    /* Two physical copies of H2: block 3 (oldest, what lookups return) and
     * the new block 4 popped from the queue head. */
    uint32_t ids[8];
    ck_assert_uint_eq(mock_engine_copies(m.e, H2, ids, 8), 2);
    ck_assert_uint_eq(ids[0], 3);
    ck_assert_uint_eq(ids[1], 4);
    ck_assert_uint_eq(copies(&m, H0), 1);
    mock_engine_stats s = mt_stats(&m);
    ck_assert_uint_eq(s.prefix_queries, 24);
    ck_assert_uint_eq(s.prefix_hits, 8);
    mt_eng_fini(&m);
}
END_TEST

START_TEST(hit_blocks_are_touched_and_leave_the_free_queue_until_released) {
    mt_eng m;
    uint64_t t[12];
    start(&m, 10, t);
    mt_out o1 = {0}, o2 = {0}, o3 = {0};
    mt_add_run(&m, t, 12, 1, &o1, NULL);
    ck_assert_uint_eq(mt_block(&m, 1).ref, 0);
    ck_assert(mt_block(&m, 1).in_free_queue);
    /* Two requests sharing the prefix run at once. */
    mt_add(&m, t, 12, 3, &o2);
    mt_add(&m, t, 12, 3, &o3);
    mt_step(&m, NULL);
    ck_assert_uint_eq(mt_block(&m, 1).ref, 2);
    ck_assert_uint_eq(mt_block(&m, 2).ref, 2);
    ck_assert(!mt_block(&m, 1).in_free_queue);
    ck_assert(!mt_block(&m, 2).in_free_queue);
    mt_run(&m, NULL, NULL);
    ck_assert_uint_eq(mt_block(&m, 1).ref, 0);
    ck_assert(mt_block(&m, 1).in_free_queue);
    ck_assert_uint_eq(o2.cached, 8);
    ck_assert_uint_eq(o3.cached, 8);
    mock_engine_stats s = mt_stats(&m);
    ck_assert_uint_eq(s.used_blocks, 0);
    ck_assert_uint_eq(s.free_blocks, 9);
    mt_eng_fini(&m);
}
END_TEST

START_TEST(eviction_pops_the_queue_head_deepest_first_one_removed_per_copy) {
    mt_eng m;
    mt_eng_start(&m, 4, 10);
    uint64_t t[12], u[40];
    mt_iota(t, 12, 1);
    mt_iota(u, 40, 1000);
    mt_out o[4] = {{0}};
    mt_add_run(&m, t, 12, 1, &o[0], NULL);
    mt_add(&m, t, 12, 1, &o[1]); /* second copy of H2 in block 4 */
    mt_run(&m, NULL, NULL);
    uint32_t ids[16];
    free_queue(&m, ids);
    static const uint32_t q[] = {5, 6, 7, 8, 9, 3, 4, 2, 1};
    for (uint32_t i = 0; i < 9; i++) ck_assert_uint_eq(ids[i], q[i]);
    /* 6 fresh blocks: 5..9 are empty, then block 3 (H2, oldest copy). */
    mt_rec r = {0};
    mt_add_run(&m, u, 23, 1, &o[2], &r);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_int_eq(r.type[0], WIRE_EV_REMOVED);
    ck_assert(r.key[0] == H2 && r.nh[0] == 1);
    ck_assert_int_eq(r.type[1], WIRE_EV_STORED);
    ck_assert_uint_eq(r.nh[1], 5);
    /* The other copy stays cached and still serves hits. */
    ck_assert_uint_eq(copies(&m, H2), 1);
    mock_hash hs[3];
    mt_hash(&m, t, 3, hs);
    ck_assert_uint_eq(mock_engine_probe(m.e, hs, 13), 3);
    /* Everything: removals of the remaining chain come deepest first, all
     * before the step's store. */
    memset(&r, 0, sizeof(r));
    mt_add_run(&m, u + 1, 35, 1, &o[3], &r);
    uint32_t k = 0;
    while (k < r.n && r.type[k] == WIRE_EV_REMOVED) k++;
    ck_assert_uint_eq(k, r.n - 1);
    ck_assert_int_eq(r.type[r.n - 1], WIRE_EV_STORED);
    /* The last store's queue order put block 4 (H2) before 2 (H1), 1 (H0). */
    int i2 = -1, i1 = -1, i0 = -1;
    for (uint32_t i = 0; i < k; i++) {
        if (r.key[i] == H2) i2 = (int)i;
        if (r.key[i] == H1) i1 = (int)i;
        if (r.key[i] == H0) i0 = (int)i;
    }
    ck_assert(i2 >= 0 && i1 > i2 && i0 > i1);
    ck_assert_uint_eq(copies(&m, H0), 0);
    mt_eng_fini(&m);
}
END_TEST

/* A loaded step. Block size 4, 12 usable blocks, 16 tokens a step: W (44
 * tokens, prefilled in three chunks) leaves 11 cached blocks in the free
 * queue deepest first, block 12 empty before them; then P (20 tokens) is
 * prefilled in two chunks, and its second chunk shares a step with X (8
 * tokens) and Y's first 4 of 8, each evicting W's blocks and storing its
 * own. The two steps' events go to r (NULL: not kept); h* get the
 * requests' block hashes. */
typedef struct loaded {
    mt_eng m;
    uint64_t w[44], p[20], x[8], y[8];
    mock_hash hw[11], hp[5], hx[2], hy[2];
    mt_out o[4];
    mock_step st1, st2;
} loaded;

static void loaded_steps(loaded *l, mt_rec *r) {
    mock_cfg c;
    mt_cfg(&c, 4, 13);
    c.max_num_batched_tokens = 16;
    memset(l, 0, sizeof(*l));
    mt_eng_init(&l->m, &c, 0);
    mt_iota(l->w, 44, 1000);
    mt_iota(l->p, 20, 2000);
    mt_iota(l->x, 8, 3000);
    mt_iota(l->y, 8, 4000);
    mt_hash(&l->m, l->w, 11, l->hw);
    mt_hash(&l->m, l->p, 5, l->hp);
    mt_hash(&l->m, l->x, 2, l->hx);
    mt_hash(&l->m, l->y, 2, l->hy);
    mt_add_run(&l->m, l->w, 44, 1, &l->o[0], NULL);
    /* step 1: P's first 16 tokens take block 12 (empty) and W's 10, 9, 8 */
    mt_add(&l->m, l->p, 20, 1, &l->o[1]);
    ck_assert(mt_step(&l->m, &l->st1));
    if (r) mt_record(r, &l->m.last);
    /* step 2: P's last 4 tokens, X whole, Y's first 4 */
    mt_add(&l->m, l->x, 8, 1, &l->o[2]);
    mt_add(&l->m, l->y, 8, 1, &l->o[3]);
    ck_assert(mt_step(&l->m, &l->st2));
    ck_assert_uint_eq(l->st2.n_scheduled, 3);
    if (r) mt_record(r, &l->m.last);
}

/* DESIGN §8: per request the step allocates for (running first, then the
 * newly scheduled, in scheduling order), the BlockRemoved of the blocks its
 * allocation evicted, then its BlockStored -- not every removal first. */
START_TEST(a_steps_events_go_request_by_request_removals_before_stores) {
    loaded l;
    mt_rec r = {0};
    loaded_steps(&l, &r);
    static const struct {
        wire_ev_type type;
        char who;     /* w, p, x, y: whose hashes */
        int first, n; /* hashes [first, first + n) */
        int parent;   /* index of the parent in who's hashes, -1 none */
    } want[] = {
        /* step 1: one request */
        {WIRE_EV_REMOVED, 'w', 10, 1, 0},
        {WIRE_EV_REMOVED, 'w', 9, 1, 0},
        {WIRE_EV_REMOVED, 'w', 8, 1, 0},
        {WIRE_EV_STORED, 'p', 0, 4, -1},
        /* step 2: P (running) first, then X and Y in scheduling order */
        {WIRE_EV_REMOVED, 'w', 7, 1, 0},
        {WIRE_EV_STORED, 'p', 4, 1, 3},
        {WIRE_EV_REMOVED, 'w', 6, 1, 0},
        {WIRE_EV_REMOVED, 'w', 5, 1, 0},
        {WIRE_EV_STORED, 'x', 0, 2, -1},
        {WIRE_EV_REMOVED, 'w', 4, 1, 0},
        {WIRE_EV_STORED, 'y', 0, 1, -1},
    };
    ck_assert_uint_eq(r.n, KVO_ARRAY_LEN(want));
    for (uint32_t i = 0; i < r.n; i++) {
        const mock_hash *h = want[i].who == 'w'   ? l.hw
                             : want[i].who == 'p' ? l.hp
                             : want[i].who == 'x' ? l.hx
                                                  : l.hy;
        ck_assert_msg(r.type[i] == want[i].type, "event %u: type %d", i,
                      r.type[i]);
        ck_assert_msg(r.key[i] == h[want[i].first].key, "event %u: hash", i);
        ck_assert_uint_eq(r.nh[i], (uint32_t)want[i].n);
        if (want[i].type == WIRE_EV_STORED) {
            ck_assert(r.has_parent[i] == (want[i].parent >= 0));
            if (want[i].parent >= 0)
                ck_assert(r.parent[i] == h[want[i].parent].key);
        }
    }
    mt_eng_fini(&l.m);
}
END_TEST

/* The regime counters prove a load was real: the loaded steps above, then
 * a step that evicts without storing. */
START_TEST(regime_counters_count_batched_chunked_and_evicting_steps) {
    loaded l;
    loaded_steps(&l, NULL);
    ck_assert_uint_eq(l.st1.evicted, 3);
    ck_assert_uint_eq(l.st1.stored, 4);
    ck_assert_uint_eq(l.st2.evicted, 4);
    ck_assert_uint_eq(l.st2.stored, 4);
    mock_engine_stats s = mt_stats(&l.m);
    ck_assert_uint_eq(s.steps, 5);       /* W's three chunks, then two */
    ck_assert_uint_eq(s.steps_multi, 1); /* P, X and Y */
    ck_assert_uint_eq(s.max_running, 3);
    ck_assert_uint_eq(s.prefills_split, 3); /* W, P, Y */
    ck_assert_uint_eq(s.evictions_in_store_steps, 7);
    ck_assert_uint_eq(s.max_inflight, 3); /* P running, X and Y waiting */
    ck_assert_uint_eq(s.preemptions, 0);
    mt_run(&l.m, NULL,
           NULL); /* Y's last 4 tokens: one more eviction, a store */
    s = mt_stats(&l.m);
    ck_assert_uint_eq(s.evictions_in_store_steps, 8);
    /* 3 tokens fill no block: the step evicts W's next block, stores none */
    uint64_t z[3] = {7, 8, 9};
    mt_out oz = {0};
    mt_add(&l.m, z, 3, 1, &oz);
    mock_step st;
    ck_assert(mt_step(&l.m, &st));
    ck_assert_uint_eq(st.evicted, 1);
    ck_assert_uint_eq(st.stored, 0);
    s = mt_stats(&l.m);
    ck_assert_uint_eq(s.evictions_in_store_steps, 8);
    ck_assert_uint_eq(s.blocks_removed, 9);
    ck_assert_uint_eq(s.steps_multi, 1);
    ck_assert_uint_eq(s.prefills_split, 3);
    ck_assert_uint_eq(s.max_inflight, 3);
    mt_eng_fini(&l.m);
}
END_TEST

START_TEST(decode_stores_each_block_its_tokens_fill_with_the_parent) {
    mt_eng m;
    mt_eng_start(&m, 4, 32);
    uint64_t t[6];
    mt_iota(t, 6, 1);
    mt_out out = {0};
    mt_add(&m, t, 6, 8, &out);
    mt_rec r = {0};
    uint32_t steps = 0;
    bool stored_at[16] = {0};
    while (mock_engine_has_work(m.e)) {
        mock_step st;
        uint32_t before = r.n;
        if (mt_step(&m, &st)) mt_record(&r, &m.last);
        stored_at[steps++] = r.n > before;
        if (steps == 1)
            ck_assert_uint_eq(st.decode_reqs, 0);
        else
            ck_assert_uint_eq(st.decode_reqs, 1);
    }
    ck_assert_uint_eq(steps, 8); /* 1 prefill + 7 decodes */
    ck_assert(stored_at[0] && stored_at[2] && stored_at[6]);
    ck_assert_uint_eq(r.n, 3);
    /* The full sequence: prompt + 8 generated; KV for 6 + 8 - 1 = 13. */
    ck_assert_uint_eq(out.n_output, 8);
    ck_assert_uint_eq(out.n_blocks_at_finish, 4); /* ceil(13 / 4) */
    uint64_t all[14];
    memcpy(all, t, sizeof(t));
    memcpy(all + 6, out.tokens, 8 * sizeof(uint64_t));
    mock_hash hs[3];
    mt_hash(&m, all, 3, hs);
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert(r.key[i] == hs[i].key);
        ck_assert_uint_eq(r.nh[i], 1);
        ck_assert(i == 0 ? !r.has_parent[i] : r.parent[i] == hs[i - 1].key);
    }
    mt_eng_fini(&m);
}
END_TEST

START_TEST(chunked_prefill_stores_each_chunk_chained_to_the_previous) {
    mock_cfg c;
    mt_cfg(&c, 4, 64);
    c.max_num_batched_tokens = 8;
    mt_eng m;
    mt_eng_init(&m, &c, 0);
    uint64_t t[20];
    mt_iota(t, 20, 1);
    mock_hash hs[5];
    mt_hash(&m, t, 5, hs);
    mt_out out = {0};
    mt_add(&m, t, 20, 1, &out);
    uint32_t want_n[] = {2, 2, 1}, first[] = {0, 2, 4};
    for (int s = 0; s < 3; s++) {
        mock_step st;
        ck_assert(mt_step(&m, &st));
        ck_assert_uint_eq(st.prefill_tokens, s < 2 ? 8 : 4);
        ck_assert(fabs(st.duration_ms -
                       (4.209989e-7 * st.prefill_tokens * st.prefill_tokens +
                        0.01518344 * st.prefill_tokens + 16.50142)) < 1e-9);
        ck_assert_uint_eq(m.last.n_events, 1);
        const wire_event *ev = &m.last.events[0];
        ck_assert_uint_eq(ev->n_hashes, want_n[s]);
        ck_assert(ev->hashes[0].key == hs[first[s]].key);
        if (s == 0)
            ck_assert_int_eq(ev->parent.kind, WIRE_HASH_NONE);
        else
            ck_assert(ev->parent.key == hs[first[s] - 1].key);
        ck_assert_uint_eq(out.n_output,
                          s < 2 ? 0 : 1); /* no sample mid-prefill */
    }
    ck_assert(!mock_engine_has_work(m.e));
    mt_eng_fini(&m);
}
END_TEST

/* Two requests that outgrow the pool: the newest one is preempted, its
 * blocks freed, and it is recomputed later -- generating exactly what it
 * generates when nothing is preempted. */
static void run_pair(uint32_t blocks, mt_out *a, mt_out *b, uint64_t *preempt) {
    mock_cfg c;
    mt_cfg(&c, 4, blocks);
    c.max_model_len = 24;
    c.seed = 7;
    mt_eng m;
    mt_eng_init(&m, &c, 0);
    uint64_t ta[8], tb[8];
    mt_iota(ta, 8, 1);
    mt_iota(tb, 8, 101);
    mt_add(&m, ta, 8, 12, a);
    uint64_t idb = mt_add(&m, tb, 8, 12, b);
    bool seen = false;
    while (mock_engine_has_work(m.e)) {
        mock_step st;
        mt_step(&m, &st);
        if (st.preempted && !seen) {
            seen = true;
            ck_assert_uint_eq(st.preempted, 1);
            const uint32_t *ids;
            uint32_t n;
            /* The newest (B) left the running list with no blocks. */
            ck_assert_int_eq(mock_engine_req_blocks(m.e, idb, &ids, &n),
                             KVO_ENOTFOUND);
        }
    }
    mock_engine_stats s = mt_stats(&m);
    *preempt = s.preemptions;
    ck_assert_uint_eq(s.used_blocks, 0);
    mt_eng_fini(&m);
}

START_TEST(preemption_recomputes_the_newest_request_from_scratch) {
    mt_out a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0};
    uint64_t p1, p2;
    run_pair(7, &a1, &b1, &p1);
    run_pair(64, &a2, &b2, &p2);
    ck_assert_uint_ge(p1, 1);
    ck_assert_uint_eq(p2, 0);
    ck_assert_uint_eq(a1.n_output, 12);
    ck_assert_uint_eq(b1.n_output, 12);
    ck_assert(memcmp(a1.tokens, a2.tokens, 12 * 8) == 0);
    ck_assert(memcmp(b1.tokens, b2.tokens, 12 * 8) == 0);
    ck_assert_uint_eq(b1.cached,
                      0); /* num_cached_tokens of the first schedule */
}
END_TEST

START_TEST(data_parallel_ranks_are_independent_and_stamp_their_rank) {
    mock_cfg c;
    mt_cfg(&c, 4, 16);
    mock_hasher *h;
    ck_assert_int_eq(mock_hasher_new(&h, c.hash_algo, c.hash_seed, 0), KVO_OK);
    mock_engine *e0, *e1;
    ck_assert_int_eq(mock_engine_new(&e0, &c, 0, h), KVO_OK);
    ck_assert_int_eq(mock_engine_new(&e1, &c, 1, h), KVO_OK);
    ck_assert_uint_eq(mock_engine_rank(e1), 1);
    uint64_t t[12];
    mt_iota(t, 12, 1);
    mt_out o = {0};
    mock_req_in in = mt_req(t, 12, 1, &o);
    ck_assert_int_eq(mock_engine_add(e1, &in, NULL), KVO_OK);
    mock_step st;
    ck_assert_int_eq(mock_engine_schedule(e1, 0, &st), KVO_OK);
    ck_assert_ptr_nonnull(st.batch);
    ck_assert(st.batch->dp_rank.set && st.batch->dp_rank.v == 1);
    ck_assert(st.batch->events[0].hashes[0].key == H0);
    mock_engine_complete(e1);
    ck_assert_int_eq(mock_engine_schedule(e0, 0, &st), KVO_OK);
    ck_assert(st.idle && st.batch == NULL);
    mock_hash hs[3];
    mock_hasher_blocks(h, t, 4, 0, 3, NULL, NULL, NULL, NULL, hs);
    ck_assert_uint_eq(mock_engine_probe(e1, hs, 13), 3);
    ck_assert_uint_eq(mock_engine_probe(e0, hs, 13), 0);
    mock_engine_free(e0);
    mock_engine_free(e1);
    mock_hasher_free(h);
}
END_TEST

START_TEST(reset_prefix_cache_clears_only_when_no_block_is_in_use) {
    mt_eng m;
    uint64_t t[12];
    start(&m, 16, t);
    mt_out o = {0};
    mt_add(&m, t, 12, 3, &o);
    mt_step(&m, NULL);
    ck_assert(!mock_engine_reset_prefix_cache(m.e)); /* running */
    ck_assert(!mock_engine_has_events(m.e));
    mt_run(&m, NULL, NULL);
    ck_assert(mock_engine_reset_prefix_cache(m.e));
    ck_assert(mock_engine_has_events(m.e));
    mock_step st;
    ck_assert(mt_step(&m, &st));
    ck_assert(st.idle);
    ck_assert_uint_eq(m.last.n_events, 1);
    ck_assert_int_eq(m.last.events[0].type, WIRE_EV_CLEARED);
    mock_engine_stats s = mt_stats(&m);
    ck_assert_uint_eq(s.resident_blocks, 0);
    /* Nothing is evicted afterwards: the hashes are gone. */
    mt_rec r = {0};
    mt_add_run(&m, t, 12, 1, &o, &r);
    ck_assert_uint_eq(o.cached, 0);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_int_eq(r.type[0], WIRE_EV_STORED);
    mt_eng_fini(&m);
}
END_TEST

START_TEST(without_prefix_caching_nothing_hits_and_nothing_is_published) {
    mock_cfg c;
    mt_cfg(&c, 4, 16);
    c.prefix_caching = false;
    mt_eng m;
    uint64_t t[12];
    start_with(&m, &c, t);
    mt_out o1 = {0}, o2 = {0};
    mt_rec r = {0};
    mt_add_run(&m, t, 12, 2, &o1, &r);
    mt_add_run(&m, t, 12, 2, &o2, &r);
    ck_assert_uint_eq(r.n, 0);
    ck_assert_uint_eq(o2.cached, 0);
    ck_assert_uint_eq(o2.n_output, 2);
    ck_assert(!mock_engine_reset_prefix_cache(m.e) ||
              !mock_engine_has_events(m.e));
    mt_eng_fini(&m);
}
END_TEST

START_TEST(roles_prefill_caps_at_one_token_decode_publishes_nothing) {
    mock_cfg c;
    mt_cfg(&c, 4, 16);
    c.role = MOCK_ROLE_PREFILL;
    mt_eng m;
    uint64_t t[12];
    start_with(&m, &c, t);
    mt_out o = {0};
    mt_rec r = {0};
    mt_add_run(&m, t, 12, 50, &o, &r);
    ck_assert_uint_eq(o.n_output, 1);
    ck_assert_uint_eq(o.n_blocks_at_finish, 3);
    ck_assert_uint_eq(r.n, 1);
    mt_eng_fini(&m);

    c.role = MOCK_ROLE_DECODE;
    c.kv_transfer_ms_per_block = 2.5;
    mt_eng_init(&m, &c, 0);
    memset(&r, 0, sizeof(r));
    mt_out o2 = {0}, o3 = {0};
    mock_req_in in = {.tokens = t,
                      .n_tokens = 12,
                      .max_tokens = 2,
                      .remote_prefill = true,
                      .on_output = mt_on_output,
                      .user = &o2};
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
    mock_step st;
    ck_assert(!mt_step(&m, &st));
    ck_assert_uint_eq(st.prefill_tokens, 0);
    ck_assert(fabs(st.duration_ms - 3 * 2.5) < 1e-9); /* 12 tokens = 3 blocks */
    mt_run(&m, mt_record, &r);
    mt_add_run(&m, t, 12, 2, &o3, &r);
    ck_assert_uint_eq(r.n, 0);
    ck_assert_uint_eq(o3.cached, 8); /* it still caches, silently */
    mt_eng_fini(&m);
}
END_TEST

START_TEST(generated_tokens_depend_on_the_seed_only) {
    mock_cfg c;
    mt_cfg(&c, 4, 64);
    uint64_t t[10];
    mt_iota(t, 10, 1);
    mt_out o[3] = {{0}};
    for (int i = 0; i < 3; i++) {
        c.seed = i == 2 ? 99 : 5;
        mt_eng m;
        mt_eng_init(&m, &c, 0);
        mt_add_run(&m, t, 10, 20, &o[i], NULL);
        mt_eng_fini(&m);
    }
    ck_assert(memcmp(o[0].tokens, o[1].tokens, 20 * 8) == 0);
    ck_assert(memcmp(o[0].tokens, o[2].tokens, 20 * 8) != 0);
    for (int i = 0; i < 20; i++) ck_assert_uint_lt(o[0].tokens[i], 32000);
}
END_TEST

START_TEST(decode_step_duration_follows_the_usage_model) {
    mt_eng m;
    mt_eng_start(&m, 4, 11);
    uint64_t t[8];
    mt_iota(t, 8, 1);
    mt_out o = {0};
    mt_add(&m, t, 8, 3, &o);
    mt_step(&m, NULL);
    mock_step st;
    mt_step(&m, &st); /* decode: token 9 needs a third block: 3 of 10 used */
    double u = 0.3;
    double want = -25.74 * u * u + 54.01 * u + 5.74;
    ck_assert(fabs(st.duration_ms - want) < 1e-9);
    ck_assert(fabs(m.last_ms - want) < 1e-9);
    mt_eng_fini(&m);
}
END_TEST

START_TEST(published_hashes_match_every_engine_hash_vector) {
    json_object *v = kt_load_json("tests/data/vectors/hash/hash_vectors.json");
    json_object *cases = json_object_object_get(v, "engine_hash_cases");
    for (size_t i = 0; i < json_object_array_length(cases); i++) {
        json_object *cs = json_object_array_get_idx(cases, i);
        const char *name =
            json_object_get_string(json_object_object_get(cs, "name"));
        mock_cfg c;
        mt_cfg(&c,
               (uint32_t)json_object_get_int(
                   json_object_object_get(cs, "block_size")),
               64);
        ck_assert_int_eq(
            wire_algo_parse(
                json_object_get_string(json_object_object_get(cs, "algo")),
                &c.hash_algo),
            KVO_OK);
        c.hash_seed =
            json_object_get_string(json_object_object_get(cs, "seed"));
        json_object *toks = json_object_object_get(cs, "token_ids");
        uint32_t n = (uint32_t)json_object_array_length(toks);
        uint64_t t[64];
        for (uint32_t k = 0; k < n; k++)
            t[k] = json_object_get_uint64(json_object_array_get_idx(toks, k));
        json_object *lo = json_object_object_get(cs, "lora_name");
        json_object *sa = json_object_object_get(cs, "cache_salt");
        json_object *blocks = json_object_object_get(cs, "blocks");
        for (int bytes = 0; bytes < 2; bytes++) {
            c.hash_bytes = bytes;
            mt_eng m;
            mt_eng_init(&m, &c, 0);
            mt_out o = {0};
            mock_req_in in = {
                .tokens = t,
                .n_tokens = n,
                .max_tokens = 1,
                .lora_name = lo ? json_object_get_string(lo) : NULL,
                .cache_salt = sa ? json_object_get_string(sa) : NULL,
                .on_output = mt_on_output,
                .user = &o};
            ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
            ck_assert(mt_step(&m, NULL));
            const wire_event *ev = &m.last.events[0];
            ck_assert_uint_eq(ev->n_hashes, json_object_array_length(blocks));
            for (uint32_t k = 0; k < ev->n_hashes; k++) {
                json_object *bk = json_object_array_get_idx(blocks, k);
                uint64_t low;
                kvo_parse_u64(
                    json_object_get_string(json_object_object_get(bk, "low64")),
                    &low);
                ck_assert_msg(ev->hashes[k].key == low, "%s block %u", name, k);
                if (bytes) {
                    size_t dl;
                    uint8_t *d =
                        kt_unhex(json_object_get_string(
                                     json_object_object_get(bk, "digest")),
                                 &dl);
                    ck_assert_int_eq(ev->hashes[k].kind, WIRE_HASH_BYTES);
                    ck_assert_uint_eq(ev->hashes[k].len, dl);
                    ck_assert_msg(memcmp(ev->hashes[k].bytes, d, dl) == 0, "%s",
                                  name);
                    kvo_free(d);
                } else {
                    ck_assert_int_eq(ev->hashes[k].kind, WIRE_HASH_UINT);
                }
            }
            if (lo) {
                ck_assert(ev->lora_id.set && ev->lora_id.v == 1);
                ck_assert(ev->lora_name.len ==
                          strlen(json_object_get_string(lo)));
            }
            /* extra_keys: (lora[, salt]) on block 0, (lora,) after; None
             * without either. Rebuild it with msgpack-c's own packer. */
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            msgpack_packer pk;
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            msgpack_pack_array(&pk, ev->n_hashes);
            for (uint32_t k = 0; k < ev->n_hashes; k++) {
                const char *keys[2];
                int nk = 0;
                if (lo) keys[nk++] = json_object_get_string(lo);
                if (sa && k == 0) keys[nk++] = json_object_get_string(sa);
                if (!nk) {
                    msgpack_pack_nil(&pk);
                    continue;
                }
                msgpack_pack_array(&pk, (size_t)nk);
                for (int x = 0; x < nk; x++) {
                    msgpack_pack_str(&pk, strlen(keys[x]));
                    msgpack_pack_str_body(&pk, keys[x], strlen(keys[x]));
                }
            }
            ck_assert_uint_eq(ev->extra_keys.len, sb.size);
            ck_assert_msg(memcmp(ev->extra_keys.p, sb.data, sb.size) == 0, "%s",
                          name);
            msgpack_sbuffer_destroy(&sb);
            mt_eng_fini(&m);
        }
    }
    json_object_put(v);
}
END_TEST

START_TEST(trace_hash_memo_gives_the_hashes_plain_hashing_gives) {
    char *path = kt_src_path("traces/mooncake_conversation_1000.jsonl");
    mock_trace *t;
    ck_assert_int_eq(mock_trace_open(&t, path), KVO_OK);
    mock_hasher *plain, *memo;
    ck_assert_int_eq(mock_hasher_new(&plain, WIRE_ALGO_XXHASH, "0", 0), KVO_OK);
    ck_assert_int_eq(mock_hasher_new(&memo, WIRE_ALGO_XXHASH, "0", 6), KVO_OK);
    uint64_t *tok = kvo_malloc(200000 * sizeof(uint64_t));
    mock_hash *a = kvo_malloc(12500 * sizeof(mock_hash));
    mock_hash *b = kvo_malloc(12500 * sizeof(mock_hash));
    mock_trace_req r;
    for (int i = 0; i < 300; i++) {
        ck_assert_int_eq(mock_trace_next(t, &r, NULL, 0), KVO_OK);
        mock_trace_tokens(r.hash_ids, r.n_hash_ids, r.input_length, tok);
        uint32_t nb = r.input_length / 16;
        mock_trace_ref tr = {r.hash_ids, r.n_hash_ids};
        ck_assert_int_eq(mock_hasher_blocks(plain, tok, 16, 0, nb, NULL, NULL,
                                            NULL, NULL, a),
                         KVO_OK);
        /* In uneven chunks, as /kvo/probe asks (rows start mid-way too). */
        for (uint32_t done = 0, ch = 7; done < nb;
             done += ch, ch = ch * 2 + 1) {
            uint32_t k = nb - done < ch ? nb - done : ch;
            ck_assert_int_eq(mock_hasher_blocks(memo, tok, 16, done, k,
                                                done ? &b[done - 1] : NULL,
                                                NULL, NULL, &tr, b + done),
                             KVO_OK);
        }
        for (uint32_t k = 0; k < nb; k++)
            ck_assert(memcmp(&a[k], &b[k], sizeof(mock_hash)) == 0);
    }
    mock_hasher_stats s;
    mock_hasher_stats_get(memo, &s);
    ck_assert_uint_gt(s.memo_hits, 0);
    /* The same prompt under a LoRA never comes from the memo. */
    mock_trace_ref tr = {r.hash_ids, r.n_hash_ids};
    uint64_t hits = s.memo_hits;
    mock_hasher_blocks(memo, tok, 16, 0, 32, NULL, "lora", NULL, &tr, b);
    mock_hasher_stats_get(memo, &s);
    ck_assert_uint_eq(s.memo_hits, hits);
    ck_assert(b[0].key != a[0].key);
    kvo_free(tok);
    kvo_free(a);
    kvo_free(b);
    mock_hasher_free(plain);
    mock_hasher_free(memo);
    mock_trace_free(t);
    kvo_free(path);
}
END_TEST

START_TEST(requests_beyond_max_model_len_are_refused) {
    mock_cfg c;
    mt_cfg(&c, 4, 4); /* 3 usable blocks: 12 tokens */
    mt_eng m;
    mt_eng_init(&m, &c, 0);
    uint64_t t[12];
    mt_iota(t, 12, 1);
    mt_out o = {0};
    mock_req_in in = mt_req(t, 12, 1, &o);
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_ETOOBIG);
    in.n_tokens = 11;
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
    in.n_tokens = 0;
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_EINVAL);
    in.n_tokens = 4;
    in.max_tokens = 0;
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_EINVAL);
    mt_run(&m, NULL, NULL);
    ck_assert_uint_eq(o.n_output, 1);
    mt_eng_fini(&m);
}
END_TEST

START_TEST(aborted_requests_release_their_blocks) {
    mt_eng m;
    uint64_t t[12];
    start(&m, 64, t);
    mt_out o1 = {0}, o2 = {0};
    uint64_t a = mt_add(&m, t, 12, 100, &o1);
    uint64_t b = mt_add(&m, t, 12, 100, &o2);
    mt_step(&m, NULL);
    ck_assert_int_eq(mock_engine_abort(m.e, a), KVO_OK);
    ck_assert_int_eq(o1.finish, MOCK_FINISH_ABORTED);
    /* Aborting inside an open step defers to complete(). */
    mock_step st;
    ck_assert_int_eq(mock_engine_schedule(m.e, 0, &st), KVO_OK);
    ck_assert_int_eq(mock_engine_abort(m.e, b), KVO_OK);
    ck_assert_int_eq(o2.finish, MOCK_FINISH_NONE);
    mock_engine_complete(m.e);
    ck_assert_int_eq(o2.finish, MOCK_FINISH_ABORTED);
    ck_assert_int_eq(mock_engine_abort(m.e, b), KVO_ENOTFOUND);
    mock_engine_stats s = mt_stats(&m);
    ck_assert_uint_eq(s.used_blocks, 0);
    ck_assert(!mock_engine_has_work(m.e));
    mt_eng_fini(&m);
}
END_TEST

/* The digest of a list of cached blocks, recomputed from scratch. */
static uint64_t digest_of(const mock_cached_block *b, uint32_t n) {
    uint64_t d = 0;
    for (uint32_t i = 0; i < n; i++)
        d += kvo_block_digest(b[i].hash, b[i].has_parent, b[i].parent);
    return d;
}

/* Every page of the cached set, max at a time, into all (returns the
 * count); each page sorted and continuing the previous one. */
static uint32_t list_all(mt_eng *m, uint32_t max, mock_cached_block *all) {
    uint32_t total = 0, n;
    bool more = true, has_after = false;
    uint64_t after = 0;
    while (more) {
        ck_assert_int_eq(mock_engine_cached_blocks(m->e, has_after, after,
                                                   all + total, max, &n, &more),
                         KVO_OK);
        ck_assert(more ? n == max : n <= max);
        for (uint32_t i = 0; i < n; i++)
            ck_assert(total + i == 0 ||
                      all[total + i - 1].hash < all[total + i].hash);
        total += n;
        if (n) {
            after = all[total - 1].hash;
            has_after = true;
        }
    }
    return total;
}

START_TEST(the_cached_set_counts_copies_once_with_parents_and_its_digest) {
    mt_eng m;
    uint64_t t[12];
    start(&m, 10, t);
    mt_out o[3] = {{0}};
    mock_cached_block b[16];
    mock_engine_stats s = mt_stats(&m);
    ck_assert_uint_eq(s.cached_distinct, 0);
    ck_assert(s.cached_digest == 0);
    /* H0 <- H1 <- H2, then a second copy of H2 */
    mt_add_run(&m, t, 12, 1, &o[0], NULL);
    mt_add_run(&m, t, 12, 1, &o[1], NULL);
    ck_assert_uint_eq(copies(&m, H2), 2);
    s = mt_stats(&m);
    ck_assert_uint_eq(s.resident_blocks, 4);
    ck_assert_uint_eq(s.cached_distinct, 3);
    ck_assert_uint_eq(list_all(&m, 100, b), 3);
    const uint64_t hs[3] = {H0, H1, H2};
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t k = 0; /* H_k is b[i] */
        while (hs[k] != b[i].hash) k++;
        ck_assert(b[i].has_parent == (k > 0));
        if (k) ck_assert(b[i].parent == hs[k - 1]);
    }
    ck_assert(s.cached_digest == digest_of(b, 3));
    ck_assert(s.cached_digest != 0);
    /* pages of one and of two give the same list */
    mock_cached_block p1[16], p2[16];
    ck_assert_uint_eq(list_all(&m, 1, p1), 3);
    ck_assert_uint_eq(list_all(&m, 2, p2), 3);
    ck_assert(memcmp(p1, b, 3 * sizeof(*b)) == 0 &&
              memcmp(p2, b, 3 * sizeof(*b)) == 0);
    uint32_t n;
    bool more;
    ck_assert_int_eq(
        mock_engine_cached_blocks(m.e, true, b[2].hash, p1, 8, &n, &more),
        KVO_OK);
    ck_assert(n == 0 && !more);
    /* Evictions: u's 6 blocks pop 5..9 (empty) and 3, H2's oldest copy (H2
     * stays: block 4 holds it); a longer prompt then takes the rest. */
    uint64_t u[32];
    mt_iota(u, 32, 500);
    mt_add(&m, u, 23, 1, &o[2]); /* 6 blocks: 5..9 and block 3 */
    mock_step st;
    mt_step(&m, &st);
    s = mt_stats(&m);
    ck_assert_uint_eq(copies(&m, H2), 1);
    uint32_t k = list_all(&m, 100, b);
    ck_assert_uint_eq(k, s.cached_distinct);
    ck_assert_uint_eq(k, 3 + 5); /* H0..H2 and u's 5 full blocks */
    ck_assert(s.cached_digest == digest_of(b, k));
    mt_run(&m, NULL, NULL);
    mt_add_run(&m, u + 1, 31, 1, &o[2], NULL); /* evicts H2's last copy */
    ck_assert_uint_eq(copies(&m, H2), 0);
    s = mt_stats(&m);
    k = list_all(&m, 100, b);
    ck_assert_uint_eq(k, s.cached_distinct);
    for (uint32_t i = 0; i < k; i++) ck_assert(b[i].hash != H2);
    ck_assert(s.cached_digest == digest_of(b, k));
    /* a reset empties it */
    ck_assert(mock_engine_reset_prefix_cache(m.e));
    s = mt_stats(&m);
    ck_assert(s.cached_distinct == 0 && s.cached_digest == 0);
    ck_assert_uint_eq(list_all(&m, 100, b), 0);
    mt_eng_fini(&m);
}
END_TEST

Suite *suite_engine(void) {
    const TTest *tests[] = {
        fresh_pool_queues_every_block_but_the_null_block_in_id_order,
        prefill_stores_every_full_block_with_the_vllm_fields,
        hit_is_capped_so_a_fully_cached_prompt_stores_a_second_copy,
        hit_blocks_are_touched_and_leave_the_free_queue_until_released,
        eviction_pops_the_queue_head_deepest_first_one_removed_per_copy,
        a_steps_events_go_request_by_request_removals_before_stores,
        regime_counters_count_batched_chunked_and_evicting_steps,
        decode_stores_each_block_its_tokens_fill_with_the_parent,
        chunked_prefill_stores_each_chunk_chained_to_the_previous,
        preemption_recomputes_the_newest_request_from_scratch,
        data_parallel_ranks_are_independent_and_stamp_their_rank,
        reset_prefix_cache_clears_only_when_no_block_is_in_use,
        without_prefix_caching_nothing_hits_and_nothing_is_published,
        roles_prefill_caps_at_one_token_decode_publishes_nothing,
        generated_tokens_depend_on_the_seed_only,
        decode_step_duration_follows_the_usage_model,
        published_hashes_match_every_engine_hash_vector,
        trace_hash_memo_gives_the_hashes_plain_hashing_gives,
        requests_beyond_max_model_len_are_refused,
        aborted_requests_release_their_blocks,
        the_cached_set_counts_copies_once_with_parents_and_its_digest,
    };
    return mt_suite(suite_create("engine"), 120, tests, KVO_ARRAY_LEN(tests));
}
