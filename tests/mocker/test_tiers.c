/* The CPU tier (--cpu-offload-blocks) and the incident mutants that need
 * the engine's own events (issue 15): offload on GPU eviction with vLLM's
 * self-describing CPU events, each before the GPU removal of its block;
 * LRU eviction and the touch order of a hit; loading a prefix back as
 * cached tokens; reset with and without reset_external; then salt-ignored,
 * lora-in-mm-slot, lora-same-hash, cpu-tier-dropped, reset-not-published,
 * resurrect-removed and group-collision, each on the bytes they corrupt. */
#include "mt.h"

#include <msgpack.h>
#include <stdio.h>
#include <string.h>

Suite *suite_tiers(void);

static bool is_medium(const wire_event *e, const char *m) {
    size_t n = strlen(m);
    return e->medium.p && e->medium.len == n && memcmp(e->medium.p, m, n) == 0;
}

/* An engine of block size 4 with `gpu` blocks (incl. the null block) and a
 * CPU tier of `cpu` blocks; mutations mut. */
static void start(mt_eng *m, uint32_t gpu, uint32_t cpu, unsigned mut) {
    mock_cfg c;
    mt_cfg(&c, 4, gpu);
    c.cpu_offload_blocks = cpu;
    c.mutations = mut;
    mt_eng_init(m, &c, 0);
}

/* Steps until idle; every batch's events appended to rec (decoded copies
 * kept in bs[], at most max batches). */
typedef struct seen {
    wire_batch b[64];
    uint32_t n;
} seen;

static void keep(void *ctx, const wire_batch *b) {
    seen *s = ctx;
    ck_assert_uint_lt(s->n, 64);
    /* re-decode from a fresh encode: m->last is reused by the next step */
    kvo_buf buf;
    kvo_buf_init(&buf);
    ck_assert_int_eq(wire_batch_encode(b, WIRE_FMT_MAP, 0, &buf), KVO_OK);
    wire_batch_init(&s->b[s->n]);
    ck_assert_int_eq(
        wire_batch_decode(buf.data, buf.len, NULL, &s->b[s->n], NULL), KVO_OK);
    s->n++;
    kvo_buf_fini(&buf);
}

static void seen_fini(seen *s) {
    for (uint32_t i = 0; i < s->n; i++) wire_batch_fini(&s->b[i]);
    s->n = 0;
}

/* Two blocks of A are cached; a filler takes every other block, and B's
 * allocation then evicts A's (deepest first): each block's CPU store, with
 * its parent, tokens and block size, comes before its GPU removal (the copy
 * exists before the GPU frees its block), then B's store. */
START_TEST(
    a_gpu_eviction_offloads_the_block_with_its_tokens_before_removing_it) {
    mt_eng m;
    start(&m, 9, 8, 0);
    uint64_t a[8], f[24], b[8];
    mt_iota(a, 8, 100);
    mt_iota(f, 24, 300);
    mt_iota(b, 8, 500);
    mt_out o = {0};
    mock_hash ha[2];
    mt_hash(&m, a, 2, ha);
    mt_add_run(&m, a, 8, 1, &o, NULL);
    mt_add_run(&m, f, 24, 1, &o, NULL);
    mt_add(&m, b, 8, 1, &o);
    ck_assert(mt_step(&m, NULL));
    const wire_batch *w = &m.last;
    ck_assert_uint_eq(w->n_events, 5);
    const wire_event *c1 = &w->events[0], *c0 = &w->events[2];
    ck_assert(c1->type == WIRE_EV_STORED && is_medium(c1, "CPU"));
    ck_assert(c1->n_hashes == 1 && c1->hashes[0].key == ha[1].key);
    ck_assert(c1->parent.kind != WIRE_HASH_NONE && c1->parent.key == ha[0].key);
    ck_assert(c1->block_size.set && c1->block_size.v == 4);
    ck_assert_uint_eq(c1->n_tokens, 4);
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(c1->token_ids[i], a[4 + i]);
    ck_assert(c1->group_idx.set && c1->group_idx.v == 0);
    ck_assert(!c1->lora_name.p);
    ck_assert(w->events[1].type == WIRE_EV_REMOVED &&
              is_medium(&w->events[1], "GPU"));
    ck_assert(w->events[1].hashes[0].key == ha[1].key);
    ck_assert(c0->type == WIRE_EV_STORED && is_medium(c0, "CPU"));
    ck_assert(c0->hashes[0].key == ha[0].key);
    ck_assert_int_eq(c0->parent.kind, WIRE_HASH_NONE);
    ck_assert(w->events[3].type == WIRE_EV_REMOVED &&
              is_medium(&w->events[3], "GPU") &&
              w->events[3].hashes[0].key == ha[0].key);
    ck_assert(w->events[4].type == WIRE_EV_STORED &&
              is_medium(&w->events[4], "GPU"));
    mock_engine_stats st = mt_stats(&m);
    ck_assert_uint_eq(st.cpu_stored, 2);
    ck_assert_uint_eq(st.cpu_cached_distinct, 2);
    ck_assert_uint_eq(st.cpu_cached_digest,
                      kvo_block_digest(ha[0].key, false, 0) +
                          kvo_block_digest(ha[1].key, true, ha[0].key));
    ck_assert(mock_engine_cpu_cached(m.e, ha[0].key) &&
              mock_engine_cpu_cached(m.e, ha[1].key));
    mt_run(&m, NULL, NULL);
    mt_eng_fini(&m);
}
END_TEST

/* event e is (type, medium, hash) */
static void ev_is(const wire_event *e, wire_ev_type type, const char *medium,
                  uint64_t key, const char *what) {
    ck_assert_msg(e->type == type && is_medium(e, medium) && e->n_hashes == 1 &&
                      e->hashes[0].key == key,
                  "%s", what);
}

/* A GPU eviction into a full tier: for each evicted block X, the tier's
 * LRU block leaves first (CPU BlockRemoved), then X is stored in the tier
 * (CPU BlockStored), then the GPU removes X -- a copy of X is held at every
 * point of the batch. */
START_TEST(
    an_eviction_into_a_full_tier_removes_its_lru_then_stores_then_frees) {
    mt_eng m;
    start(&m, 5, 2, 0); /* four GPU blocks, two CPU blocks */
    uint64_t t[4][8];
    mock_hash h[4][2];
    mt_out o = {0};
    for (int i = 0; i < 4; i++) {
        mt_iota(t[i], 8, 1000 * (uint64_t)(i + 1));
        mt_hash(&m, t[i], 2, h[i]);
    }
    mt_add_run(&m, t[0], 8, 1, &o, NULL);
    mt_add_run(&m, t[1], 8, 1, &o, NULL);
    mt_add_run(&m, t[2], 8, 1, &o, NULL); /* t0 offloaded: the tier is full */
    ck_assert_uint_eq(mt_stats(&m).cpu_cached_distinct, 2);
    mt_add(&m, t[3], 8, 1, &o); /* evicts t1's blocks, deepest first */
    ck_assert(mt_step(&m, NULL));
    const wire_event *e = m.last.events;
    ck_assert_uint_eq(m.last.n_events, 7);
    /* the tier's LRU block is t0's deepest (offloaded first) */
    ev_is(&e[0], WIRE_EV_REMOVED, "CPU", h[0][1].key, "CPU remove t0.1");
    ev_is(&e[1], WIRE_EV_STORED, "CPU", h[1][1].key, "CPU store t1.1");
    ck_assert(e[1].parent.key == h[1][0].key);
    ev_is(&e[2], WIRE_EV_REMOVED, "GPU", h[1][1].key, "GPU remove t1.1");
    ev_is(&e[3], WIRE_EV_REMOVED, "CPU", h[0][0].key, "CPU remove t0.0");
    ev_is(&e[4], WIRE_EV_STORED, "CPU", h[1][0].key, "CPU store t1.0");
    ev_is(&e[5], WIRE_EV_REMOVED, "GPU", h[1][0].key, "GPU remove t1.0");
    ck_assert(e[6].type == WIRE_EV_STORED && is_medium(&e[6], "GPU") &&
              e[6].hashes[0].key == h[3][0].key);
    mt_run(&m, NULL, NULL);
    mt_eng_fini(&m);
}
END_TEST

/* A hit on a run in the tier touches it last block first (vLLM's
 * LRUOffloadingManager.touch walks the hashes in reverse): the run's first
 * block ends most recent, so the tier then evicts the run's last block
 * before its first -- after the block that was more recent than the run
 * before the hit. */
START_TEST(a_cpu_hit_touches_the_run_so_its_last_block_is_evicted_first) {
    mt_eng m;
    start(&m, 17, 4, 0); /* sixteen GPU blocks, four CPU blocks */
    uint64_t a[13], f[52], b[16];
    mt_iota(a, 13, 100);
    mt_iota(f, 52, 300);
    mt_iota(b, 16, 500);
    mock_hash ha[3], hf[13];
    mt_hash(&m, a, 3, ha);
    mt_hash(&m, f, 13, hf);
    mt_out o = {0};
    mt_add_run(&m, a, 12, 1, &o, NULL); /* A0..A2 */
    mt_add_run(&m, f, 52, 1, &o, NULL); /* F0..F12: the GPU is full */
    mt_add_run(&m, b, 16, 1, &o, NULL); /* evicts A2, A1, A0, F12 */
    for (int i = 0; i < 3; i++) {
        ck_assert(mock_engine_cpu_cached(m.e, ha[i].key));
        ck_assert(!mock_engine_cached(m.e, ha[i].key));
    }
    ck_assert(mock_engine_cpu_cached(m.e, hf[12].key));
    uint64_t hits0 = mt_stats(&m).cpu_hits;
    /* A again, one token more: the three blocks load back from the tier;
     * its four new GPU blocks evict F11..F8, whose offloads evict the
     * tier's four blocks in LRU order */
    mt_out o2 = {0};
    mt_add(&m, a, 13, 1, &o2);
    ck_assert(mt_step(&m, NULL));
    uint64_t gone[8];
    uint32_t n_gone = 0;
    for (uint32_t i = 0; i < m.last.n_events; i++) {
        const wire_event *e = &m.last.events[i];
        if (e->type == WIRE_EV_REMOVED && is_medium(e, "CPU")) {
            ck_assert_uint_lt(n_gone, 8);
            gone[n_gone++] = e->hashes[0].key;
        }
    }
    ck_assert_uint_eq(n_gone, 4);
    ck_assert(gone[0] == hf[12].key); /* less recent than the touched run */
    ck_assert(gone[1] == ha[2].key);
    ck_assert(gone[2] == ha[1].key);
    ck_assert(gone[3] == ha[0].key);
    mt_run(&m, NULL, NULL);
    ck_assert_uint_eq(o2.cached, 12);
    ck_assert_uint_eq(mt_stats(&m).cpu_hits - hits0, 12); /* a run of 3 */
    mt_eng_fini(&m);
}
END_TEST

/* A prefix the GPU lost but the CPU tier holds is loaded back: it counts
 * in cached_tokens as vLLM counts a connector's tokens (a whole-prompt
 * hit recomputes its last token), the loaded blocks are stored on the GPU
 * again, and the tier's lookups and hits are counted. */
START_TEST(a_prefix_in_the_cpu_tier_loads_back_as_cached_tokens) {
    mt_eng m;
    start(&m, 9, 16, 0);
    uint64_t a[9], f[24], b[8], g[28];
    mt_iota(a, 9, 100);
    mt_iota(f, 24, 300);
    mt_iota(b, 8, 500);
    mt_iota(g, 28, 700);
    mt_out o = {0};
    mt_add_run(&m, a, 8, 1, &o, NULL);  /* A0, A1 cached */
    mt_add_run(&m, f, 24, 1, &o, NULL); /* the other six blocks */
    mt_add_run(&m, b, 8, 1, &o, NULL);  /* evicts A1, A0 into the CPU tier */
    mock_hash ha[2];
    mt_hash(&m, a, 2, ha);
    ck_assert_uint_eq(mock_engine_probe(m.e, ha, 8), 0);
    uint64_t hits0 = mt_stats(&m).prefix_hits;
    mt_out o2 = {0};
    mt_add(&m, a, 9, 1, &o2); /* 9 tokens: both blocks loaded, 8 cached */
    ck_assert(mt_step(&m, NULL));
    uint32_t gpu_stored = 0;
    for (uint32_t i = 0; i < m.last.n_events; i++) {
        const wire_event *e = &m.last.events[i];
        if (e->type == WIRE_EV_STORED && is_medium(e, "GPU")) {
            ck_assert_uint_eq(e->n_hashes, 2);
            ck_assert(e->hashes[0].key == ha[0].key &&
                      e->hashes[1].key == ha[1].key);
            gpu_stored++;
        }
    }
    ck_assert_uint_eq(gpu_stored, 1);
    mt_run(&m, NULL, NULL);
    ck_assert_uint_eq(o2.cached, 8);
    mock_engine_stats st = mt_stats(&m);
    ck_assert_uint_eq(st.cpu_hits, 8);
    ck_assert_uint_ge(st.cpu_queries, 9);
    ck_assert_uint_eq(st.prefix_hits, hits0); /* the GPU counter is the GPU's */
    /* seven blocks of another prompt leave only A0 on the GPU (the last
     * freed); A1 is in the tier: A's 8 tokens then hit whole, 7 cached */
    mt_add_run(&m, g, 28, 1, &o, NULL);
    ck_assert_uint_eq(mock_engine_probe(m.e, ha, 8), 1);
    ck_assert(mock_engine_cpu_cached(m.e, ha[1].key));
    mt_out o3 = {0};
    mt_add_run(&m, a, 8, 1, &o3, NULL);
    ck_assert_uint_eq(o3.cached, 7);
    mt_eng_fini(&m);
}
END_TEST

/* A full tier evicts its least recently used block (BlockRemoved, medium
 * CPU); reset keeps the tier, reset_external empties it, and neither
 * publishes a CPU event. */
START_TEST(the_cpu_tier_evicts_its_lru_block_and_reset_external_empties_it) {
    mt_eng m;
    start(&m, 5, 2, 0); /* four GPU blocks, two CPU blocks */
    uint64_t t[4][8];
    mock_hash h[4][2];
    mt_out o = {0};
    for (int i = 0; i < 4; i++) {
        mt_iota(t[i], 8, 1000 * (uint64_t)(i + 1));
        mt_hash(&m, t[i], 2, h[i]);
    }
    mt_add_run(&m, t[0], 8, 1, &o, NULL);
    mt_add_run(&m, t[1], 8, 1, &o, NULL);
    mt_add_run(&m, t[2], 8, 1, &o,
               NULL); /* evicts t0's blocks: the tier is full */
    ck_assert(mock_engine_cpu_cached(m.e, h[0][0].key));
    ck_assert(mock_engine_cpu_cached(m.e, h[0][1].key));
    seen s = {0};
    mt_add(&m, t[3], 8, 1, &o); /* t1's blocks offloaded: t0's evicted */
    mt_run(&m, keep, &s);
    uint32_t cpu_removed = 0;
    for (uint32_t k = 0; k < s.n; k++)
        for (uint32_t i = 0; i < s.b[k].n_events; i++) {
            const wire_event *e = &s.b[k].events[i];
            if (e->type == WIRE_EV_REMOVED && is_medium(e, "CPU")) {
                ck_assert(e->hashes[0].key == h[0][1].key ||
                          e->hashes[0].key == h[0][0].key);
                cpu_removed++;
            }
        }
    ck_assert_uint_eq(cpu_removed, 2);
    seen_fini(&s);
    ck_assert(!mock_engine_cpu_cached(m.e, h[0][0].key));
    ck_assert(mock_engine_cpu_cached(m.e, h[1][0].key));
    ck_assert_uint_eq(mt_stats(&m).cpu_removed, 2);
    ck_assert(mock_engine_reset_cache(m.e, false));
    ck_assert(mock_engine_cpu_cached(m.e, h[1][0].key));
    ck_assert(mt_step(&m, NULL));
    ck_assert_uint_eq(m.last.n_events, 1);
    ck_assert_int_eq(m.last.events[0].type, WIRE_EV_CLEARED);
    ck_assert(mock_engine_reset_cache(m.e, true));
    ck_assert(!mock_engine_cpu_cached(m.e, h[1][0].key));
    ck_assert_uint_eq(mt_stats(&m).cpu_cached_distinct, 0);
    ck_assert(mt_step(&m, NULL));
    ck_assert_uint_eq(m.last.n_events, 1);
    mt_eng_fini(&m);
}
END_TEST

/* A reset on an idle engine publishes AllBlocksCleared in the very next
 * step, which has no request (aibrix#2287 is the engine that does not). */
START_TEST(a_reset_on_an_idle_engine_publishes_all_blocks_cleared_at_once) {
    mt_eng m;
    mt_eng_start(&m, 4, 16);
    uint64_t t[8];
    mt_iota(t, 8, 3);
    mt_out o = {0};
    mt_add_run(&m, t, 8, 1, &o, NULL);
    ck_assert(!mock_engine_has_work(m.e));
    ck_assert(!mock_engine_has_events(m.e));
    ck_assert(mock_engine_reset_prefix_cache(m.e));
    ck_assert(mock_engine_has_events(m.e));
    mock_step st;
    ck_assert(mt_step(&m, &st));
    ck_assert(st.idle);
    ck_assert_uint_eq(m.last.n_events, 1);
    ck_assert_int_eq(m.last.events[0].type, WIRE_EV_CLEARED);
    ck_assert(!mock_engine_has_events(m.e));
    mt_eng_fini(&m);
}
END_TEST

/* Render one clean step batch with mut (a fresh renderer unless r given);
 * the payloads decoded into out (returns how many). */
static uint32_t render(mock_render *r, const mock_step *st, wire_batch *out,
                       uint32_t max) {
    const kvo_buf *pay;
    uint32_t n;
    ck_assert_int_eq(mock_render_batch(r, st->batch, st->aux, &pay, &n),
                     KVO_OK);
    ck_assert_uint_le(n, max);
    for (uint32_t i = 0; i < n; i++) {
        wire_batch_init(&out[i]);
        ck_assert_int_eq(
            wire_batch_decode(pay[i].data, pay[i].len, NULL, &out[i], NULL),
            KVO_OK);
    }
    return n;
}

static mock_render *renderer(unsigned mut) {
    mock_cfg c;
    mt_cfg(&c, 4, 16);
    c.mutations = mut;
    mock_render *r;
    ck_assert_int_eq(mock_render_new(&r, &c), KVO_OK);
    return r;
}

/* extra_keys of block i as msgpack-decoded text ("" = nil). */
static void ek_text(const wire_event *e, uint32_t i, char *out, size_t n) {
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    out[0] = '\0';
    ck_assert(msgpack_unpack_next(&up, (const char *)e->extra_keys.p,
                                  e->extra_keys.len,
                                  &off) == MSGPACK_UNPACK_SUCCESS);
    msgpack_object *b = &up.data.via.array.ptr[i];
    if (b->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t j = 0; j < b->via.array.size; j++) {
            msgpack_object *x = &b->via.array.ptr[j];
            size_t l = strlen(out);
            if (x->type == MSGPACK_OBJECT_STR)
                snprintf(out + l, n - l, "%s%.*s", j ? "|" : "",
                         (int)x->via.str.size, x->via.str.ptr);
            else
                snprintf(out + l, n - l, "%s(%.*s)", j ? "|" : "",
                         (int)x->via.array.ptr[0].via.str.size,
                         x->via.array.ptr[0].via.str.ptr);
        }
    }
    msgpack_unpacked_destroy(&up);
}

/* salt-ignored drops the salt from block 0; lora-same-hash the adapter
 * from fields and keys; lora-in-mm-slot moves it to a multimodal item.
 * The hashes stay the engine's. */
START_TEST(key_mutants_rewrite_lora_fields_and_extra_keys_only) {
    mt_eng m;
    mt_eng_start(&m, 4, 16);
    uint64_t t[9];
    mt_iota(t, 9, 40);
    mt_out o = {0};
    mock_req_in in = mt_req(t, 9, 1, &o);
    in.lora_name = "ad";
    in.cache_salt = "tn";
    ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
    mock_step st;
    ck_assert_int_eq(mock_engine_schedule(m.e, 1.0, &st), KVO_OK);
    ck_assert_ptr_nonnull(st.batch);
    struct {
        unsigned mut;
        const char *k0, *k1;
        bool lora_fields;
    } v[] = {{0, "ad|tn", "ad", true},
             {MOCK_MUT_SALT_IGNORED, "ad", "ad", true},
             {MOCK_MUT_LORA_SAME_HASH, "tn", "", false},
             {MOCK_MUT_LORA_IN_MM_SLOT, "(ad)|tn", "(ad)", false}};
    for (size_t i = 0; i < KVO_ARRAY_LEN(v); i++) {
        mock_render *r = renderer(v[i].mut);
        wire_batch out[2];
        ck_assert_uint_eq(render(r, &st, out, 2), 1);
        const wire_event *e = &out[0].events[0];
        char k[64];
        ek_text(e, 0, k, sizeof(k));
        ck_assert_msg(strcmp(k, v[i].k0) == 0, "mutant %zu block 0: %s", i, k);
        ek_text(e, 1, k, sizeof(k));
        ck_assert_msg(strcmp(k, v[i].k1) == 0, "mutant %zu block 1: %s", i, k);
        ck_assert((e->lora_name.p != NULL) == v[i].lora_fields);
        ck_assert(e->lora_id.set == v[i].lora_fields);
        ck_assert(e->hashes[0].key == st.batch->events[0].hashes[0].key);
        wire_batch_fini(&out[0]);
        mock_render_free(r);
    }
    mock_engine_complete(m.e);
    mt_run(&m, NULL, NULL);
    mt_eng_fini(&m);
}
END_TEST

/* cpu-tier-dropped: CPU stores become the old placeholder (block_size 0,
 * no tokens, no parent); resurrect-removed: each GPU removal is followed
 * by a store of the same block, its parent and tokens; GPU stores are
 * untouched. */
START_TEST(tier_mutants_empty_cpu_stores_and_resurrect_removed_blocks) {
    mt_eng m;
    start(&m, 9, 8, MOCK_MUT_RESURRECT_REMOVED);
    uint64_t a[8], f[24], b[8];
    mt_iota(a, 8, 100);
    mt_iota(f, 24, 300);
    mt_iota(b, 8, 500);
    mt_out o = {0};
    mock_hash ha[2];
    mt_hash(&m, a, 2, ha);
    mt_add_run(&m, a, 8, 1, &o, NULL);
    mt_add_run(&m, f, 24, 1, &o, NULL);
    mt_add(&m, b, 8, 1, &o);
    mock_step st;
    ck_assert_int_eq(mock_engine_schedule(m.e, 1.0, &st), KVO_OK);
    /* CPU store A1, GPU remove A1, CPU store A0, GPU remove A0, store B */
    ck_assert_uint_eq(st.batch->n_events, 5);
    mock_render *r = renderer(MOCK_MUT_CPU_TIER_DROPPED);
    wire_batch out[2];
    ck_assert_uint_eq(render(r, &st, out, 2), 1);
    ck_assert_uint_eq(out[0].n_events, 5);
    for (int i = 0; i < 4; i += 2) {
        const wire_event *e = &out[0].events[i];
        ck_assert(is_medium(e, "CPU") && e->type == WIRE_EV_STORED);
        ck_assert(e->block_size.set && e->block_size.v == 0);
        ck_assert_uint_eq(e->n_tokens, 0);
        ck_assert_int_eq(e->parent.kind, WIRE_HASH_NONE);
    }
    ck_assert(is_medium(&out[0].events[4], "GPU"));
    ck_assert_uint_eq(out[0].events[4].n_tokens,
                      8); /* the GPU store keeps them */
    wire_batch_fini(&out[0]);
    mock_render_free(r);
    r = renderer(MOCK_MUT_RESURRECT_REMOVED);
    ck_assert_uint_eq(render(r, &st, out, 2), 1);
    ck_assert_uint_eq(out[0].n_events, 7);
    const wire_event *e = out[0].events;
    ck_assert(is_medium(&e[0], "CPU") && is_medium(&e[3], "CPU"));
    ck_assert(e[1].type == WIRE_EV_REMOVED && e[2].type == WIRE_EV_STORED);
    ck_assert(e[2].hashes[0].key == ha[1].key && e[2].parent.key == ha[0].key);
    ck_assert(is_medium(&e[2], "GPU") && e[2].n_tokens == 4 &&
              e[2].token_ids[0] == a[4]);
    ck_assert(e[4].type == WIRE_EV_REMOVED && e[5].type == WIRE_EV_STORED);
    ck_assert(e[5].hashes[0].key == ha[0].key &&
              e[5].parent.kind == WIRE_HASH_NONE);
    ck_assert(is_medium(&e[5], "GPU"));
    wire_batch_fini(&out[0]);
    mock_render_free(r);
    mock_engine_complete(m.e);
    mt_run(&m, NULL, NULL);
    mt_eng_fini(&m);
}
END_TEST

/* reset-not-published: a batch of nothing but AllBlocksCleared publishes
 * nothing; the next batch with other events leads with it. */
START_TEST(reset_not_published_holds_the_idle_clear_until_the_next_step) {
    mt_eng m;
    mt_eng_start(&m, 4, 16);
    mock_render *r = renderer(MOCK_MUT_RESET_NOT_PUBLISHED);
    ck_assert(mock_engine_reset_prefix_cache(m.e));
    mock_step st;
    ck_assert_int_eq(mock_engine_schedule(m.e, 1.0, &st), KVO_OK);
    wire_batch out[2];
    ck_assert_uint_eq(render(r, &st, out, 2), 0);
    mock_engine_complete(m.e);
    uint64_t t[5];
    mt_iota(t, 5, 9);
    mt_out o = {0};
    mt_add(&m, t, 5, 1, &o);
    ck_assert_int_eq(mock_engine_schedule(m.e, 1.0, &st), KVO_OK);
    ck_assert_uint_eq(render(r, &st, out, 2), 1);
    ck_assert_uint_eq(out[0].n_events, 2);
    ck_assert_int_eq(out[0].events[0].type, WIRE_EV_CLEARED);
    ck_assert_int_eq(out[0].events[1].type, WIRE_EV_STORED);
    wire_batch_fini(&out[0]);
    mock_engine_complete(m.e);
    mt_run(&m, NULL, NULL);
    mock_render_free(r);
    mt_eng_fini(&m);
}
END_TEST

/* --kv-groups: "full,sliding:W" and what is refused. */
START_TEST(kv_groups_parse_a_full_group_then_sliding_windows) {
    mock_cfg c;
    mock_cfg_default(&c);
    ck_assert_int_eq(mock_groups_parse("full,sliding:8,sliding:128", &c),
                     KVO_OK);
    ck_assert_uint_eq(c.n_groups, 3);
    ck_assert(!c.groups[0].sliding && c.groups[2].sliding &&
              c.groups[2].window == 128);
    ck_assert_uint_eq(mock_cfg_groups(&c), 3);
    static const char *const bad[] = {
        "sliding:8,full",
        "full,full",
        "full,sliding:0",
        "full,sliding:x",
        "full,,sliding:4",
        "",
        "full,sliding:1,sliding:2,sliding:3,sliding:4"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++) {
        mock_cfg d = c;
        ck_assert_msg(mock_groups_parse(bad[i], &d) == KVO_EINVAL, "%s",
                      bad[i]);
        ck_assert_uint_eq(d.n_groups, 3); /* unchanged */
    }
    mock_cfg_default(&c);
    ck_assert_uint_eq(mock_cfg_groups(&c), 1);
}
END_TEST

static void start_groups(mt_eng *m, uint32_t gpu, const char *groups) {
    mock_cfg c;
    mt_cfg(&c, 4, gpu);
    ck_assert_int_eq(mock_groups_parse(groups, &c), KVO_OK);
    mt_eng_init(m, &c, 0);
}

/* A prefill stores its blocks in each group, group 0 first, the sliding
 * group's event saying so; as decoding moves on, the sliding group frees
 * the blocks that left its window (they stay cached, ref 0). */
START_TEST(each_group_stores_its_blocks_and_the_window_frees_what_it_left) {
    mt_eng m;
    start_groups(&m, 64, "full,sliding:8");
    uint64_t t[16];
    mt_iota(t, 16, 70);
    mock_hash h[4];
    mt_hash(&m, t, 4, h);
    mt_out o = {0};
    uint64_t id = mt_add(&m, t, 16, 3, &o);
    ck_assert(mt_step(&m, NULL));
    ck_assert_uint_eq(m.last.n_events, 2);
    const wire_event *e0 = &m.last.events[0], *e1 = &m.last.events[1];
    ck_assert(e0->group_idx.set && e0->group_idx.v == 0);
    ck_assert(e0->kv_cache_spec_kind.len == 14 &&
              memcmp(e0->kv_cache_spec_kind.p, "full_attention", 14) == 0);
    ck_assert(!e0->kv_cache_spec_sliding_window.set);
    ck_assert(e1->group_idx.set && e1->group_idx.v == 1);
    ck_assert(e1->kv_cache_spec_kind.len == 14 &&
              memcmp(e1->kv_cache_spec_kind.p, "sliding_window", 14) == 0);
    ck_assert(e1->kv_cache_spec_sliding_window.set &&
              e1->kv_cache_spec_sliding_window.v == 8);
    ck_assert_uint_eq(e1->n_hashes, 4);
    ck_assert_uint_eq(e1->n_tokens, 16);
    for (int i = 0; i < 4; i++)
        ck_assert(e0->hashes[i].key == h[i].key &&
                  e1->hashes[i].key == h[i].key);
    for (int i = 0; i < 4; i++) {
        ck_assert(mock_engine_group_cached(m.e, 0, h[i].key));
        ck_assert(mock_engine_group_cached(m.e, 1, h[i].key));
    }
    mt_step(&m, NULL); /* a decode step: 16 computed, the window is 8 */
    const mock_req *r = sched_find_running(&m.e->sched, id);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->grp[0].blocks[0],
                      0); /* (16 + 1 - 8) / 4 = 2 skipped */
    ck_assert_uint_eq(r->grp[0].blocks[1], 0);
    ck_assert_uint_ne(r->grp[0].blocks[2], 0);
    ck_assert(
        mock_engine_group_cached(m.e, 1, h[0].key)); /* still cached, free */
    uint64_t dn, dg;
    mock_engine_group_set(m.e, 1, &dn, &dg);
    ck_assert_uint_eq(dn, 4);
    ck_assert_uint_eq(dg, kvo_block_digest(h[0].key, false, 0) +
                              kvo_block_digest(h[1].key, true, h[0].key) +
                              kvo_block_digest(h[2].key, true, h[1].key) +
                              kvo_block_digest(h[3].key, true, h[2].key));
    mt_run(&m, NULL, NULL);
    mt_eng_fini(&m);
}
END_TEST

/* The hybrid hit: within the full group's run, a sliding group of window 8
 * (two blocks at block size 4) needs the two blocks before the hit's end;
 * without such a pair, only its own leading run. */
START_TEST(
    a_hybrid_hit_needs_the_window_before_its_end_in_every_sliding_group) {
    mt_eng m;
    start_groups(&m, 64, "full,sliding:8");
    uint64_t t[20];
    mt_iota(t, 20, 900);
    mock_hash h[5];
    mt_hash(&m, t, 5, h);
    mock_pool *p = &m.e->sched.pool;
    for (uint32_t k = 0; k < 5; k++)
        ck_assert_int_eq(
            pool_cache_g(p, 1 + k, &h[k], k ? &h[k - 1] : NULL, NULL, 0),
            KVO_OK);
    /* group 1 holds blocks 0, 2 and 3 */
    ck_assert_int_eq(pool_cache_g(p, 10, &h[0], NULL, NULL, 1), KVO_OK);
    ck_assert_int_eq(pool_cache_g(p, 12, &h[2], &h[1], NULL, 1), KVO_OK);
    ck_assert_int_eq(pool_cache_g(p, 13, &h[3], &h[2], NULL, 1), KVO_OK);
    ck_assert_uint_eq(mock_engine_hybrid_hit(m.e, h, 5), 4); /* window [2, 4) */
    ck_assert_uint_eq(mock_engine_hybrid_hit(m.e, h, 3), 1); /* only block 0 */
    ck_assert_uint_eq(mock_engine_hybrid_hit(m.e, h, 0), 0);
    /* a prompt of those 20 tokens: hit 4 blocks (cap 4), 16 cached */
    mt_out o = {0};
    mt_add_run(&m, t, 20, 1, &o, NULL);
    ck_assert_uint_eq(o.cached, 16);
    mt_eng_fini(&m);
}
END_TEST

/* A sliding-group block evicted is removed with its group_idx;
 * group-collision publishes every group as group 0 (full attention). */
START_TEST(evictions_carry_their_group_and_group_collision_erases_it) {
    mt_eng m;
    start_groups(&m, 13, "full,sliding:4"); /* 12 blocks, 6 per group */
    uint64_t a[8], b[23];
    mt_iota(a, 8, 10);
    mt_iota(b, 23, 50);
    mt_out o = {0};
    mt_add_run(&m, a, 8, 1, &o, NULL);
    mt_add(&m, b, 23, 1, &o); /* every block: a's of both groups evicted */
    mock_step st;
    ck_assert_int_eq(mock_engine_schedule(m.e, 1.0, &st), KVO_OK);
    bool removed_g1 = false, stored_g1 = false;
    for (uint32_t i = 0; i < st.batch->n_events; i++) {
        const wire_event *e = &st.batch->events[i];
        if (e->type == WIRE_EV_REMOVED && e->group_idx.v == 1)
            removed_g1 = true;
        if (e->type == WIRE_EV_STORED && e->group_idx.v == 1) stored_g1 = true;
    }
    ck_assert(removed_g1 && stored_g1);
    mock_render *r = renderer(MOCK_MUT_GROUP_COLLISION);
    wire_batch out[2];
    ck_assert_uint_eq(render(r, &st, out, 2), 1);
    ck_assert_uint_eq(out[0].n_events, st.batch->n_events);
    for (uint32_t i = 0; i < out[0].n_events; i++) {
        const wire_event *e = &out[0].events[i];
        ck_assert(e->group_idx.set && e->group_idx.v == 0);
        if (e->type == WIRE_EV_STORED) {
            ck_assert(e->kv_cache_spec_kind.len == 14 &&
                      memcmp(e->kv_cache_spec_kind.p, "full_attention", 14) ==
                          0);
            ck_assert(!e->kv_cache_spec_sliding_window.set);
        }
    }
    wire_batch_fini(&out[0]);
    mock_render_free(r);
    mock_engine_complete(m.e);
    mt_run(&m, NULL, NULL);
    mt_eng_fini(&m);
}
END_TEST

/* sets[0..MOCK_MAX_GROUPS) per group, sets[MOCK_MAX_GROUPS] the CPU tier */
static void sets_apply(void *ctx, const wire_batch *b) {
    mt_set *sets = ctx;
    for (uint32_t i = 0; i < b->n_events; i++) {
        const wire_event *e = &b->events[i];
        ck_assert_int_ne(e->type, WIRE_EV_CLEARED);
        mt_set *m = is_medium(e, "CPU") ? &sets[MOCK_MAX_GROUPS]
                                        : &sets[e->group_idx.v];
        for (uint32_t k = 0; k < e->n_hashes; k++) {
            if (e->type == WIRE_EV_REMOVED) {
                mt_set_del(m, e->hashes[k].key);
            } else if (k) {
                mt_set_add(m, e->hashes[k].key, true, e->hashes[k - 1].key);
            } else {
                mt_set_add(m, e->hashes[0].key,
                           e->parent.kind != WIRE_HASH_NONE, e->parent.key);
            }
        }
    }
}

/* Random prompts over shared prefixes on a small pool, step by step: the
 * events of each group (and of the CPU tier) always add up to that group's
 * (tier's) cached set, count and digest. Seed printed. */
static void truthful_run(const char *groups, uint32_t cpu, uint64_t seed) {
    mt_eng m;
    mock_cfg c;
    mt_cfg(&c, 4, 40);
    c.cpu_offload_blocks = cpu;
    if (groups) ck_assert_int_eq(mock_groups_parse(groups, &c), KVO_OK);
    mt_eng_init(&m, &c, 0);
    static mt_set sets[MOCK_MAX_GROUPS + 1];
    memset(sets, 0, sizeof(sets));
    uint64_t rng = seed;
    fprintf(stderr, "truthful_run(%s, %u): seed %llu\n", groups ? groups : "-",
            cpu, (unsigned long long)seed);
    mt_out outs[64];
    uint32_t max_len = mock_cfg_max_model_len(&c);
    for (int r = 0; r < 64; r++) {
        uint64_t tok[64];
        uint32_t n = 5 + (uint32_t)(kvo_splitmix64(&rng) % 40);
        if (n + 8 > max_len) n = max_len - 8;
        uint64_t fam = kvo_splitmix64(&rng) % 5;
        for (uint32_t i = 0; i < n; i++)
            tok[i] = i < 12 ? fam * 100 + i : kvo_splitmix64(&rng) % 1000;
        memset(&outs[r], 0, sizeof(outs[r]));
        mock_req_in in =
            mt_req(tok, n, 1 + (uint32_t)(kvo_splitmix64(&rng) % 6), &outs[r]);
        if (cpu && r % 3 == 1) in.lora_name = "l1";
        if (cpu && r % 4 == 2) in.cache_salt = "s";
        mock_mm_item mm = {1, 6, "img"};
        if (cpu && r % 5 == 3 && n >= 7) {
            in.mm = &mm;
            in.n_mm = 1;
        }
        ck_assert_int_eq(mock_engine_add(m.e, &in, NULL), KVO_OK);
        for (int k = 0; k < 3 && (mock_engine_has_work(m.e)); k++) {
            if (mt_step(&m, NULL)) sets_apply(sets, &m.last);
            for (uint32_t g = 0; g < mock_cfg_groups(&c); g++) {
                uint64_t dn, dg;
                mock_engine_group_set(m.e, g, &dn, &dg);
                ck_assert_msg(dn == sets[g].distinct && dg == sets[g].digest,
                              "group %u after request %d: engine %llu blocks, "
                              "events %llu",
                              g, r, (unsigned long long)dn,
                              (unsigned long long)sets[g].distinct);
            }
            mock_engine_stats st = mt_stats(&m);
            ck_assert(st.cpu_cached_distinct ==
                          sets[MOCK_MAX_GROUPS].distinct &&
                      st.cpu_cached_digest == sets[MOCK_MAX_GROUPS].digest);
        }
    }
    mt_run(&m, sets_apply, sets);
    mock_engine_stats st = mt_stats(&m);
    ck_assert_uint_gt(st.blocks_removed, 20); /* the pool was under pressure */
    if (cpu) ck_assert_uint_gt(st.cpu_hits, 0);
    mt_eng_fini(&m);
}

START_TEST(every_group_and_tier_is_published_truthfully_under_pressure) {
    truthful_run("full,sliding:8", 0, 20261201);
    truthful_run("full,sliding:4,sliding:13", 0, 7);
    truthful_run(NULL, 24, 99);
}
END_TEST

Suite *suite_tiers(void) {
    const TTest *tests[] = {
        a_gpu_eviction_offloads_the_block_with_its_tokens_before_removing_it,
        an_eviction_into_a_full_tier_removes_its_lru_then_stores_then_frees,
        a_cpu_hit_touches_the_run_so_its_last_block_is_evicted_first,
        a_prefix_in_the_cpu_tier_loads_back_as_cached_tokens,
        the_cpu_tier_evicts_its_lru_block_and_reset_external_empties_it,
        a_reset_on_an_idle_engine_publishes_all_blocks_cleared_at_once,
        key_mutants_rewrite_lora_fields_and_extra_keys_only,
        tier_mutants_empty_cpu_stores_and_resurrect_removed_blocks,
        reset_not_published_holds_the_idle_clear_until_the_next_step,
        kv_groups_parse_a_full_group_then_sliding_windows,
        each_group_stores_its_blocks_and_the_window_frees_what_it_left,
        a_hybrid_hit_needs_the_window_before_its_end_in_every_sliding_group,
        evictions_carry_their_group_and_group_collision_erases_it,
        every_group_and_tier_is_published_truthfully_under_pressure,
    };
    return mt_suite(suite_create("tiers"), 60, tests, KVO_ARRAY_LEN(tests));
}
