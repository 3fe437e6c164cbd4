/* Rendering and the mutation catalog: every mutation changes exactly what
 * it claims in the published bytes and nothing else. Each case decodes the
 * clean and the mutated payloads and compares them field by field. */
#include "mt.h"

#include <string.h>

Suite *suite_mutate(void);

/* A clean step batch as the engine builds it, with its aux arrays:
 *   0 BlockRemoved(A), A's parent P      1 BlockRemoved(B), B is a root
 *   2 BlockStored [S1 S2] parent nil      3 BlockStored [S3] parent S2, decode
 *   4 AllBlocksCleared */
typedef struct fixture {
    mock_hash A, P, B, S[3];
    mock_hash *stored[5], *removed[5];
    mock_hash removed_parent[5], parent[5];
    bool decode[5];
    wire_hash h[8];
    uint64_t tok[12];
    wire_event ev[5];
    wire_batch b;
    mock_step_aux aux;
} fixture;

static void mkhash(mock_hash *h, uint8_t seed) {
    memset(h, 0, sizeof(*h));
    h->d.len = 32;
    for (int i = 0; i < 32; i++) h->d.b[i] = (uint8_t)(seed * 31 + i * 7 + 1);
    h->key = wire_digest_low64(&h->d);
}

static void int_form(wire_hash *w, const mock_hash *h) {
    memset(w, 0, sizeof(*w));
    w->kind = WIRE_HASH_UINT;
    w->key = h->key;
}

static const uint8_t nil2[] = {0x92, 0xc0, 0xc0}, nil1[] = {0x91, 0xc0};

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof(*f));
    mkhash(&f->A, 1);
    mkhash(&f->P, 2);
    mkhash(&f->B, 3);
    for (int i = 0; i < 3; i++) mkhash(&f->S[i], (uint8_t)(4 + i));
    for (int i = 0; i < 12; i++) f->tok[i] = 1000 + (uint64_t)i * 977;
    int_form(&f->h[0], &f->A);
    int_form(&f->h[1], &f->B);
    int_form(&f->h[2], &f->S[0]);
    int_form(&f->h[3], &f->S[1]);
    int_form(&f->h[4], &f->S[2]);
    for (int i = 0; i < 4; i++) {
        f->ev[i].layout = WIRE_LAYOUT_MAP;
        f->ev[i].medium = (wire_str){"GPU", 3};
        f->ev[i].group_idx = (wire_int){true, 0};
    }
    f->ev[0].type = f->ev[1].type = WIRE_EV_REMOVED;
    f->ev[0].n_hashes = f->ev[1].n_hashes = 1;
    f->ev[0].hashes = &f->h[0];
    f->ev[1].hashes = &f->h[1];
    f->removed[0] = &f->A;
    f->removed[1] = &f->B;
    f->removed_parent[0] = f->P;
    for (int i = 2; i < 4; i++) {
        wire_event *e = &f->ev[i];
        e->type = WIRE_EV_STORED;
        e->block_size = (wire_int){true, 4};
        e->kv_cache_spec_kind = (wire_str){"full_attention", 14};
    }
    f->ev[2].n_hashes = 2;
    f->ev[2].hashes = &f->h[2];
    f->ev[2].token_ids = f->tok;
    f->ev[2].n_tokens = 8;
    f->ev[2].extra_keys = (wire_raw){nil2, 3};
    f->stored[2] = &f->S[0];
    f->ev[3].n_hashes = 1;
    f->ev[3].hashes = &f->h[4];
    f->ev[3].token_ids = f->tok + 8;
    f->ev[3].n_tokens = 4;
    int_form(&f->ev[3].parent, &f->S[1]);
    f->ev[3].extra_keys = (wire_raw){nil1, 2};
    f->stored[3] = &f->S[2];
    f->parent[3] = f->S[1];
    f->decode[3] = true;
    f->ev[4].type = WIRE_EV_CLEARED;
    f->b.ts = 1760000123.5;
    f->b.batch_len = 3;
    f->b.dp_rank = (wire_int){true, 2};
    f->b.n_events = 5;
    f->b.events = f->ev;
    f->aux = (mock_step_aux){f->removed_parent, f->decode, f->stored, f->parent,
                             f->removed,        NULL,      NULL,      NULL};
}

/* Render with a mutation mask (fresh renderer) and decode every payload. */
static uint32_t render(fixture *f, unsigned mut, bool bytes, wire_batch *out,
                       uint32_t max, kvo_buf *raw) {
    mock_cfg c;
    mock_cfg_default(&c);
    c.mutations = mut;
    c.hash_bytes = bytes;
    mock_render *r;
    ck_assert_int_eq(mock_render_new(&r, &c), KVO_OK);
    const kvo_buf *pay;
    uint32_t n;
    ck_assert_int_eq(mock_render_batch(r, &f->b, &f->aux, &pay, &n), KVO_OK);
    ck_assert_uint_le(n, max);
    for (uint32_t i = 0; i < n; i++) {
        kvo_err err;
        ck_assert_msg(wire_batch_decode(pay[i].data, pay[i].len, NULL, &out[i],
                                        &err) == KVO_OK,
                      "mutated payload does not decode: %s", err.msg);
    }
    if (raw) {
        kvo_buf_reset(raw);
        kvo_buf_append(raw, pay[0].data, pay[0].len);
    }
    mock_render_free(r);
    return n;
}

static bool hash_eq(const wire_hash *a, const wire_hash *b) {
    if (a->kind != b->kind || a->key != b->key || a->len != b->len)
        return false;
    return a->kind != WIRE_HASH_BYTES ||
           memcmp(a->bytes, b->bytes, a->len) == 0;
}

static bool str_eq(wire_str a, wire_str b) {
    if (!a.p || !b.p) return !a.p && !b.p;
    return a.len == b.len && memcmp(a.p, b.p, a.len) == 0;
}

static bool int_eq(wire_int a, wire_int b) {
    return a.set == b.set && (!a.set || a.v == b.v);
}

/* Field-by-field comparison; `skip` names fields allowed to differ. */
enum {
    F_HASHES = 1,
    F_PARENT = 2,
    F_TOKENS = 4,
    F_BLOCK_SIZE = 8,
    F_LAYOUT = 16
};

static void ev_eq(const wire_event *a, const wire_event *b, unsigned skip,
                  const char *what) {
    ck_assert_msg(a->type == b->type, "%s: type", what);
    if (!(skip & F_LAYOUT)) {
        ck_assert_msg(a->layout == b->layout && a->array_len == b->array_len &&
                          a->map_len == b->map_len,
                      "%s: layout", what);
    }
    if (!(skip & F_HASHES)) {
        ck_assert_msg(a->n_hashes == b->n_hashes, "%s: n_hashes", what);
        for (uint32_t i = 0; i < a->n_hashes; i++)
            ck_assert_msg(hash_eq(&a->hashes[i], &b->hashes[i]), "%s: hash %u",
                          what, i);
    }
    if (!(skip & F_PARENT))
        ck_assert_msg(hash_eq(&a->parent, &b->parent), "%s: parent", what);
    if (!(skip & F_TOKENS)) {
        ck_assert_msg(a->n_tokens == b->n_tokens, "%s: n_tokens", what);
        for (uint32_t i = 0; i < a->n_tokens; i++)
            ck_assert_msg(a->token_ids[i] == b->token_ids[i], "%s: token %u",
                          what, i);
    }
    if (!(skip & F_BLOCK_SIZE))
        ck_assert_msg(int_eq(a->block_size, b->block_size), "%s: block_size",
                      what);
    ck_assert_msg(int_eq(a->lora_id, b->lora_id), "%s: lora_id", what);
    ck_assert_msg(str_eq(a->lora_name, b->lora_name), "%s: lora_name", what);
    ck_assert_msg(str_eq(a->medium, b->medium), "%s: medium", what);
    ck_assert_msg(int_eq(a->group_idx, b->group_idx), "%s: group_idx", what);
    ck_assert_msg(str_eq(a->kv_cache_spec_kind, b->kv_cache_spec_kind),
                  "%s: kind", what);
    ck_assert_msg(
        a->extra_keys.len == b->extra_keys.len &&
            (!a->extra_keys.len ||
             memcmp(a->extra_keys.p, b->extra_keys.p, a->extra_keys.len) == 0),
        "%s: extra_keys", what);
}

static void batch_meta_eq(const wire_batch *a, const wire_batch *b) {
    ck_assert(a->ts == b->ts);
    ck_assert(int_eq(a->dp_rank, b->dp_rank));
}

typedef struct pair {
    fixture f;
    wire_batch clean[8], mut[8];
    uint32_t n_clean, n_mut;
} pair;

static pair *pair_new(unsigned mut) {
    pair *p = kvo_calloc(1, sizeof(*p));
    fixture_init(&p->f);
    for (int i = 0; i < 8; i++) {
        wire_batch_init(&p->clean[i]);
        wire_batch_init(&p->mut[i]);
    }
    p->n_clean = render(&p->f, 0, false, p->clean, 8, NULL);
    p->n_mut = render(&p->f, mut, false, p->mut, 8, NULL);
    ck_assert_uint_eq(p->n_clean, 1);
    return p;
}

static void pair_free(pair *p) {
    for (int i = 0; i < 8; i++) {
        wire_batch_fini(&p->clean[i]);
        wire_batch_fini(&p->mut[i]);
    }
    kvo_free(p);
}

START_TEST(clean_rendering_publishes_the_engine_batch_as_is) {
    pair *p = pair_new(0);
    const wire_batch *c = &p->clean[0];
    batch_meta_eq(c, &p->f.b);
    ck_assert_uint_eq(c->n_events, 5);
    for (int i = 0; i < 5; i++)
        ev_eq(&c->events[i], &p->f.ev[i], F_LAYOUT, "clean");
    pair_free(p);
}
END_TEST

START_TEST(flip_stored_hash_xors_one_into_stored_block_hashes_only) {
    pair *p = pair_new(MOCK_MUT_FLIP_STORED_HASH);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    batch_meta_eq(c, m);
    ck_assert_uint_eq(m->n_events, 5);
    for (int i = 0; i < 5; i++) {
        bool st = c->events[i].type == WIRE_EV_STORED;
        ev_eq(&m->events[i], &c->events[i], st ? F_HASHES : 0, "flip");
        for (uint32_t k = 0; st && k < c->events[i].n_hashes; k++)
            ck_assert(m->events[i].hashes[k].key ==
                      (c->events[i].hashes[k].key ^ 1));
    }
    pair_free(p);
}
END_TEST

START_TEST(drop_removed_publishes_no_block_removed) {
    pair *p = pair_new(MOCK_MUT_DROP_REMOVED);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    batch_meta_eq(c, m);
    ck_assert_uint_eq(m->n_events, 3);
    for (int i = 0; i < 3; i++)
        ev_eq(&m->events[i], &c->events[i + 2], 0, "drop-removed");
    pair_free(p);
}
END_TEST

START_TEST(token_plus_one_adds_one_to_every_stored_token) {
    pair *p = pair_new(MOCK_MUT_TOKEN_PLUS_ONE);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    for (int i = 0; i < 5; i++) {
        ev_eq(&m->events[i], &c->events[i], F_TOKENS, "token+1");
        ck_assert_uint_eq(m->events[i].n_tokens, c->events[i].n_tokens);
        for (uint32_t k = 0; k < c->events[i].n_tokens; k++)
            ck_assert_uint_eq(m->events[i].token_ids[k],
                              c->events[i].token_ids[k] + 1);
    }
    pair_free(p);
}
END_TEST

START_TEST(wrong_parent_nils_the_parent_of_chained_stores) {
    pair *p = pair_new(MOCK_MUT_WRONG_PARENT);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    for (int i = 0; i < 5; i++)
        ev_eq(&m->events[i], &c->events[i], i == 3 ? F_PARENT : 0, "wp");
    ck_assert_int_eq(c->events[3].parent.kind, WIRE_HASH_UINT);
    ck_assert_int_eq(m->events[3].parent.kind, WIRE_HASH_NONE);
    pair_free(p);
}
END_TEST

START_TEST(drop_dp_rank_nils_the_batch_rank_only) {
    pair *p = pair_new(MOCK_MUT_DROP_DP_RANK);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    ck_assert(c->dp_rank.set && !m->dp_rank.set);
    ck_assert(m->ts == c->ts && m->batch_len == 3);
    for (int i = 0; i < 5; i++)
        ev_eq(&m->events[i], &c->events[i], 0, "drop-dp");
    pair_free(p);
}
END_TEST

START_TEST(drop_store_drops_every_fiftieth_stored_event) {
    fixture f;
    fixture_init(&f);
    mock_cfg c;
    mock_cfg_default(&c);
    c.mutations = MOCK_MUT_DROP_STORE;
    mock_render *r;
    ck_assert_int_eq(mock_render_new(&r, &c), KVO_OK);
    wire_batch b;
    wire_batch_init(&b);
    /* 2 stores per batch: stores 50 and 100 are the 2nd of batches 25, 50. */
    for (int k = 1; k <= 60; k++) {
        const kvo_buf *pay;
        uint32_t n;
        ck_assert_int_eq(mock_render_batch(r, &f.b, &f.aux, &pay, &n), KVO_OK);
        ck_assert_uint_eq(n, 1);
        ck_assert_int_eq(
            wire_batch_decode(pay[0].data, pay[0].len, NULL, &b, NULL), KVO_OK);
        bool drop = k == 25 || k == 50;
        ck_assert_uint_eq(b.n_events, drop ? 4 : 5);
        ck_assert_int_eq(b.events[2].type, WIRE_EV_STORED);
        ck_assert(b.events[2].hashes[0].key == f.S[0].key);
        ck_assert_int_eq(b.events[3].type,
                         drop ? WIRE_EV_CLEARED : WIRE_EV_STORED);
    }
    wire_batch_fini(&b);
    mock_render_free(r);
}
END_TEST

START_TEST(block_size_off_declares_one_more) {
    pair *p = pair_new(MOCK_MUT_BLOCK_SIZE_OFF);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    for (int i = 0; i < 5; i++) {
        bool st = c->events[i].type == WIRE_EV_STORED;
        ev_eq(&m->events[i], &c->events[i], st ? F_BLOCK_SIZE : 0, "bs+1");
        if (st) ck_assert_int_eq(m->events[i].block_size.v, 5);
    }
    pair_free(p);
}
END_TEST

START_TEST(truncate_tokens_drops_the_last_token_of_each_store) {
    pair *p = pair_new(MOCK_MUT_TRUNCATE_TOKENS);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    for (int i = 0; i < 5; i++) {
        ev_eq(&m->events[i], &c->events[i], F_TOKENS, "truncate");
        if (c->events[i].type != WIRE_EV_STORED) continue;
        ck_assert_uint_eq(m->events[i].n_tokens, c->events[i].n_tokens - 1);
        for (uint32_t k = 0; k < m->events[i].n_tokens; k++)
            ck_assert_uint_eq(m->events[i].token_ids[k],
                              c->events[i].token_ids[k]);
    }
    pair_free(p);
}
END_TEST

START_TEST(swap_removed_hash_names_the_parent_of_a_non_root_block) {
    pair *p = pair_new(MOCK_MUT_SWAP_REMOVED_HASH);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    for (int i = 0; i < 5; i++)
        ev_eq(&m->events[i], &c->events[i], i == 0 ? F_HASHES : 0, "swap");
    ck_assert(c->events[0].hashes[0].key == p->f.A.key);
    ck_assert(m->events[0].hashes[0].key == p->f.P.key);
    ck_assert(m->events[1].hashes[0].key ==
              p->f.B.key); /* a root keeps its own */
    pair_free(p);
}
END_TEST

START_TEST(skip_decode_stores_drops_stores_made_while_decoding) {
    pair *p = pair_new(MOCK_MUT_SKIP_DECODE_STORES);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    ck_assert_uint_eq(m->n_events, 4);
    for (int i = 0; i < 3; i++)
        ev_eq(&m->events[i], &c->events[i], 0, "skip-decode");
    ev_eq(&m->events[3], &c->events[4], 0, "skip-decode");
    pair_free(p);
}
END_TEST

static uint64_t first8(const mock_hash *h) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | h->d.b[i];
    return v;
}

START_TEST(int_hash_first8_takes_the_first_eight_digest_bytes_everywhere) {
    pair *p = pair_new(MOCK_MUT_INT_HASH_FIRST8);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    const fixture *f = &p->f;
    for (int i = 0; i < 5; i++)
        ev_eq(&m->events[i], &c->events[i], F_HASHES | F_PARENT, "first8");
    ck_assert(m->events[0].hashes[0].key == first8(&f->A));
    ck_assert(m->events[1].hashes[0].key == first8(&f->B));
    ck_assert(m->events[2].hashes[0].key == first8(&f->S[0]));
    ck_assert(m->events[2].hashes[1].key == first8(&f->S[1]));
    ck_assert(m->events[3].hashes[0].key == first8(&f->S[2]));
    ck_assert(m->events[3].parent.key == first8(&f->S[1]));
    ck_assert_int_eq(m->events[2].parent.kind, WIRE_HASH_NONE);
    ck_assert(first8(&f->A) != f->A.key);
    pair_free(p);
}
END_TEST

START_TEST(dup_store_publishes_each_store_twice_in_a_row) {
    pair *p = pair_new(MOCK_MUT_DUP_STORE);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    ck_assert_uint_eq(m->n_events, 7);
    static const int from[] = {0, 1, 2, 2, 3, 3, 4};
    for (int i = 0; i < 7; i++)
        ev_eq(&m->events[i], &c->events[from[i]], 0, "dup");
    pair_free(p);
}
END_TEST

START_TEST(reorder_keys_changes_bytes_but_not_one_decoded_field) {
    fixture f;
    fixture_init(&f);
    wire_batch c, m;
    wire_batch_init(&c);
    wire_batch_init(&m);
    kvo_buf rc, rm;
    kvo_buf_init(&rc);
    kvo_buf_init(&rm);
    render(&f, 0, false, &c, 1, &rc);
    render(&f, MOCK_MUT_REORDER_KEYS, false, &m, 1, &rm);
    ck_assert_uint_eq(rc.len, rm.len);
    ck_assert(memcmp(rc.data, rm.data, rc.len) != 0);
    batch_meta_eq(&c, &m);
    for (int i = 0; i < 5; i++) ev_eq(&m.events[i], &c.events[i], 0, "reorder");
    wire_batch_fini(&c);
    wire_batch_fini(&m);
    kvo_buf_fini(&rc);
    kvo_buf_fini(&rm);
}
END_TEST

START_TEST(legacy_array_encodes_events_as_array_late) {
    pair *p = pair_new(MOCK_MUT_LEGACY_ARRAY);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    batch_meta_eq(c, m);
    for (int i = 0; i < 5; i++) {
        ev_eq(&m->events[i], &c->events[i], F_LAYOUT, "legacy");
        ck_assert_int_eq(m->events[i].layout, WIRE_LAYOUT_ARRAY);
    }
    ck_assert_uint_eq(m->events[2].array_len, 12);
    ck_assert_uint_eq(m->events[0].array_len, 4);
    pair_free(p);
}
END_TEST

START_TEST(bytes_hash_publishes_raw_digests_with_the_same_keys) {
    pair *p = pair_new(MOCK_MUT_BYTES_HASH);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    const mock_hash *full[5][2] = {
        {&p->f.A}, {&p->f.B}, {&p->f.S[0], &p->f.S[1]}, {&p->f.S[2]}};
    for (int i = 0; i < 5; i++) {
        ev_eq(&m->events[i], &c->events[i], F_HASHES | F_PARENT, "bytes");
        for (uint32_t k = 0; k < c->events[i].n_hashes; k++) {
            const wire_hash *h = &m->events[i].hashes[k];
            ck_assert_int_eq(h->kind, WIRE_HASH_BYTES);
            ck_assert_uint_eq(h->len, 32);
            ck_assert(memcmp(h->bytes, full[i][k]->d.b, 32) == 0);
            ck_assert(h->key == c->events[i].hashes[k].key);
        }
    }
    ck_assert_int_eq(m->events[3].parent.kind, WIRE_HASH_BYTES);
    ck_assert(m->events[3].parent.key == p->f.S[1].key);
    pair_free(p);
}
END_TEST

START_TEST(split_batches_gives_one_event_per_batch_in_order) {
    pair *p = pair_new(MOCK_MUT_SPLIT_BATCHES);
    ck_assert_uint_eq(p->n_mut, 5);
    for (int i = 0; i < 5; i++) {
        batch_meta_eq(&p->mut[i], &p->clean[0]);
        ck_assert_uint_eq(p->mut[i].n_events, 1);
        ev_eq(&p->mut[i].events[0], &p->clean[0].events[i], 0, "split");
    }
    pair_free(p);
}
END_TEST

START_TEST(merge_removes_folds_consecutive_removals_into_one_event) {
    pair *p = pair_new(MOCK_MUT_MERGE_REMOVES);
    const wire_batch *c = &p->clean[0], *m = &p->mut[0];
    ck_assert_uint_eq(m->n_events, 4);
    ev_eq(&m->events[0], &c->events[0], F_HASHES, "merge");
    ck_assert_uint_eq(m->events[0].n_hashes, 2);
    ck_assert(hash_eq(&m->events[0].hashes[0], &c->events[0].hashes[0]));
    ck_assert(hash_eq(&m->events[0].hashes[1], &c->events[1].hashes[0]));
    for (int i = 1; i < 4; i++)
        ev_eq(&m->events[i], &c->events[i + 1], 0, "merge");
    pair_free(p);
}
END_TEST

/* One BlockRemoved names one medium and one group: removals of the CPU
 * tier, or of another group, stay events of their own. */
START_TEST(merge_removes_keeps_removals_of_another_medium_or_group_apart) {
    for (int v = 0; v < 2; v++) {
        fixture f;
        fixture_init(&f);
        if (v == 0)
            f.ev[1].medium = (wire_str){"CPU", 3};
        else
            f.ev[1].group_idx = (wire_int){true, 1};
        wire_batch clean[2], mut[2];
        wire_batch_init(&clean[0]);
        wire_batch_init(&mut[0]);
        ck_assert_uint_eq(render(&f, 0, false, clean, 2, NULL), 1);
        ck_assert_uint_eq(
            render(&f, MOCK_MUT_MERGE_REMOVES, false, mut, 2, NULL), 1);
        ck_assert_uint_eq(mut[0].n_events, 5);
        for (int i = 0; i < 5; i++)
            ev_eq(&mut[0].events[i], &clean[0].events[i], 0, "merge apart");
        wire_batch_fini(&clean[0]);
        wire_batch_fini(&mut[0]);
    }
}
END_TEST

START_TEST(catalog_parses_names_and_rejects_unknown_ones) {
    const mock_mutation_info *m = mock_mutations();
    unsigned all = 0;
    int killed = 0;
    for (unsigned i = 0; i < MOCK_MUT_COUNT; i++) {
        ck_assert_uint_eq(m[i].bit, 1u << i);
        all |= m[i].bit;
        killed += m[i].killed;
        unsigned mask;
        ck_assert_int_eq(mock_mutate_parse(m[i].name, &mask, NULL, 0), KVO_OK);
        ck_assert_uint_eq(mask, m[i].bit);
    }
    ck_assert_int_eq(killed, 20);
    ck_assert_uint_eq(all, (1u << MOCK_MUT_COUNT) - 1);
    /* the incidents carry their reference; only the classic ones are seen
     * in any run without naming what they need */
    static const char *const incidents[] = {
        "salt-ignored",       "lora-in-mm-slot",   "lora-same-hash",
        "group-collision",    "cpu-tier-dropped",  "reset-not-published",
        "replay-drops-topic", "replay-drops-tail",
    };
    for (size_t k = 0; k < KVO_ARRAY_LEN(incidents); k++) {
        unsigned i;
        for (i = 0; i < MOCK_MUT_COUNT && strcmp(m[i].name, incidents[k]) != 0;
             i++) {
        }
        ck_assert_msg(i < MOCK_MUT_COUNT, "%s is missing", incidents[k]);
        ck_assert_msg(m[i].incident && m[i].needs, "%s: incident and needs",
                      incidents[k]);
        ck_assert_uint_eq(m[i].killed,
                          strcmp(incidents[k], "replay-drops-topic") != 0);
    }
    for (unsigned i = 0; i < 17; i++) ck_assert(!m[i].incident && !m[i].needs);
    unsigned mask;
    ck_assert_int_eq(
        mock_mutate_parse("drop-removed,,bytes-hash", &mask, NULL, 0), KVO_OK);
    ck_assert_uint_eq(mask, MOCK_MUT_DROP_REMOVED | MOCK_MUT_BYTES_HASH);
    char bad[32];
    ck_assert_int_eq(
        mock_mutate_parse("dup-store,flip", &mask, bad, sizeof(bad)),
        KVO_EINVAL);
    ck_assert_str_eq(bad, "flip");
}
END_TEST

START_TEST(hash_bytes_option_publishes_digests_without_any_mutation) {
    fixture f;
    fixture_init(&f);
    wire_batch m;
    wire_batch_init(&m);
    render(&f, 0, true, &m, 1, NULL);
    ck_assert_int_eq(m.events[2].hashes[1].kind, WIRE_HASH_BYTES);
    ck_assert(memcmp(m.events[2].hashes[1].bytes, f.S[1].d.b, 32) == 0);
    wire_batch_fini(&m);
}
END_TEST

Suite *suite_mutate(void) {
    const TTest *tests[] = {
        clean_rendering_publishes_the_engine_batch_as_is,
        flip_stored_hash_xors_one_into_stored_block_hashes_only,
        drop_removed_publishes_no_block_removed,
        token_plus_one_adds_one_to_every_stored_token,
        wrong_parent_nils_the_parent_of_chained_stores,
        drop_dp_rank_nils_the_batch_rank_only,
        drop_store_drops_every_fiftieth_stored_event,
        block_size_off_declares_one_more,
        truncate_tokens_drops_the_last_token_of_each_store,
        swap_removed_hash_names_the_parent_of_a_non_root_block,
        skip_decode_stores_drops_stores_made_while_decoding,
        int_hash_first8_takes_the_first_eight_digest_bytes_everywhere,
        dup_store_publishes_each_store_twice_in_a_row,
        reorder_keys_changes_bytes_but_not_one_decoded_field,
        legacy_array_encodes_events_as_array_late,
        bytes_hash_publishes_raw_digests_with_the_same_keys,
        split_batches_gives_one_event_per_batch_in_order,
        merge_removes_folds_consecutive_removals_into_one_event,
        merge_removes_keeps_removals_of_another_medium_or_group_apart,
        catalog_parses_names_and_rejects_unknown_ones,
        hash_bytes_option_publishes_digests_without_any_mutation,
    };
    return mt_suite(suite_create("mutate"), 0, tests, KVO_ARRAY_LEN(tests));
}
