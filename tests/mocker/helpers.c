/* helpers.c -- see mt.h. */
#include "mt.h"

#include <string.h>

void mt_on_output(void *user, const mock_output *o) {
    mt_out *out = user;
    out->callbacks++;
    if (o->has_token && o->n_output <= 4096) out->tokens[o->n_output - 1] = o->token;
    out->n_output = o->n_output;
    out->cached = o->cached_tokens;
    if (o->finish != MOCK_FINISH_NONE) {
        out->finish = o->finish;
        out->n_blocks_at_finish = o->n_blocks;
    }
}

void mt_cfg(mock_cfg *c, uint32_t block_size, uint32_t num_gpu_blocks) {
    mock_cfg_default(c);
    c->block_size = block_size;
    c->num_gpu_blocks = num_gpu_blocks;
}

void mt_eng_init(mt_eng *m, const mock_cfg *c, uint32_t rank) {
    memset(m, 0, sizeof(*m));
    m->cfg = *c;
    ck_assert_int_eq(mock_hasher_new(&m->h, c->hash_algo, c->hash_seed,
                                     c->hash_memo_log2), KVO_OK);
    ck_assert_int_eq(mock_engine_new(&m->e, &m->cfg, rank, m->h), KVO_OK);
    ck_assert_int_eq(mock_render_new(&m->r, &m->cfg), KVO_OK);
    wire_batch_init(&m->last);
}

void mt_eng_fini(mt_eng *m) {
    mock_engine_free(m->e);
    mock_render_free(m->r);
    mock_hasher_free(m->h);
    wire_batch_fini(&m->last);
}

uint64_t mt_add(mt_eng *m, const uint64_t *tok, uint32_t n, uint32_t max_tokens,
                mt_out *out) {
    mock_req_in in = {.tokens = tok, .n_tokens = n, .max_tokens = max_tokens,
                      .on_output = mt_on_output, .user = out};
    uint64_t id = 0;
    ck_assert_int_eq(mock_engine_add(m->e, &in, &id), KVO_OK);
    return id;
}

bool mt_step(mt_eng *m, mock_step *st) {
    mock_step local;
    if (!st) st = &local;
    ck_assert_int_eq(mock_engine_schedule(m->e, 1760000000.5, st), KVO_OK);
    m->last_set = false;
    m->last_ms = st->duration_ms;
    if (st->batch) {
        const kvo_buf *pay;
        uint32_t n;
        ck_assert_int_eq(mock_render_batch(m->r, st->batch, st->aux, &pay, &n), KVO_OK);
        ck_assert_uint_eq(n, 1);
        wire_error err;
        ck_assert_msg(wire_batch_decode(pay[0].data, pay[0].len, NULL, &m->last,
                                        &err) == KVO_OK,
                      "published batch does not decode: %s", err.msg);
        m->last_set = true;
    }
    mock_engine_complete(m->e);
    return m->last_set;
}

uint32_t mt_run(mt_eng *m, mt_batch_fn fn, void *ctx) {
    uint32_t steps = 0;
    while (mock_engine_has_work(m->e) || mock_engine_has_events(m->e)) {
        ck_assert_msg(steps < 1000000, "engine never goes idle");
        if (mt_step(m, NULL) && fn) fn(ctx, &m->last);
        steps++;
    }
    return steps;
}

void mt_iota(uint64_t *t, uint32_t n, uint64_t first) {
    for (uint32_t i = 0; i < n; i++) t[i] = first + i;
}

void mt_record(void *ctx, const wire_batch *b) {
    mt_rec *r = ctx;
    for (uint32_t i = 0; i < b->n_events && r->n < 256; i++) {
        const wire_event *e = &b->events[i];
        r->type[r->n] = e->type;
        r->nh[r->n] = e->n_hashes;
        r->key[r->n] = e->n_hashes ? e->hashes[0].key : 0;
        r->has_parent[r->n] = e->parent.kind != WIRE_HASH_NONE;
        r->parent[r->n] = e->parent.key;
        r->n++;
    }
}
