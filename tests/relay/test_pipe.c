/* The relay pipeline behind its seam: fake frames in, decoded envelopes and
 * replay requests out. No sockets, no clocks but the ones the test hands in. */
#include "tr.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

Suite *suite_pipe(void);

#define MAXEV 20000

/* ev[0..WIRE_TIER_COUNT) are the cleared the relay emits when it forgets
 * rank: one per tier, device first. */
static void expect_cleared_tiers(const wire_revent *const *ev, uint32_t rank) {
    for (int k = 0; k < WIRE_TIER_COUNT; k++) {
        ck_assert_int_eq(ev[k]->type, WIRE_R_CLEARED);
        ck_assert_int_eq(ev[k]->tier, k);
        ck_assert_uint_eq(ev[k]->dp_rank, rank);
    }
}

/* ---- every wire vector -----------------------------------------------------*/

static uint64_t json_key(json_object *v) {
    if (json_object_is_type(v, json_type_object)) {
        json_object *hx;
        ck_assert(json_object_object_get_ex(v, "bin", &hx));
        size_t n;
        uint8_t *b = kt_unhex(json_object_get_string(hx), &n);
        uint64_t k = 0;
        size_t from = n > 8 ? n - 8 : 0;
        for (size_t i = from; i < n; i++) k = k << 8 | b[i];
        kvo_free(b);
        return k;
    }
    ck_assert(json_object_is_type(v, json_type_int));
    const char *s = json_object_to_json_string(v);
    if (s[0] == '-') return (uint64_t)json_object_get_int64(v);
    return json_object_get_uint64(v);
}

static wire_tier json_tier(json_object *e) {
    json_object *m;
    if (!json_object_object_get_ex(e, "medium", &m) || !m)
        return WIRE_TIER_DEVICE;
    const char *s = json_object_get_string(m);
    if (!strcmp(s, "GPU")) return WIRE_TIER_DEVICE;
    if (!strcmp(s, "CPU") || !strcmp(s, "CPU_PINNED"))
        return WIRE_TIER_HOST_PINNED;
    if (!strcmp(s, "DISK")) return WIRE_TIER_DISK;
    return WIRE_TIER_EXTERNAL;
}

/* The expected RouterEvents of one vector, built from its "fields" view by
 * the rules of DESIGN §6 (independent of the decoder). */
typedef struct xev {
    wire_rtype type;
    uint32_t rank;
    wire_tier tier;
    bool has_parent;
    uint64_t parent;
    uint32_t n;
    uint64_t bh[64], th[64];
} xev;

static uint32_t expect_vector(json_object *fields, uint32_t fallback, xev *x,
                              uint32_t *rejected) {
    json_object *evs, *rank;
    ck_assert(json_object_object_get_ex(fields, "events", &evs));
    uint32_t r = fallback;
    if (json_object_object_get_ex(fields, "data_parallel_rank", &rank) && rank)
        r = (uint32_t)json_object_get_int64(rank);
    uint32_t nx = 0;
    *rejected = 0;
    for (size_t i = 0; i < json_object_array_length(evs); i++) {
        json_object *e = json_object_array_get_idx(evs, i), *v, *hs, *toks;
        json_object_object_get_ex(e, "type", &v);
        const char *type = json_object_get_string(v);
        xev *last = nx ? &x[nx - 1] : NULL;
        if (!strcmp(type, "AllBlocksCleared")) {
            x[nx++] = (xev){.type = WIRE_R_CLEARED, .rank = r};
            continue;
        }
        json_object_object_get_ex(e, "block_hashes", &hs);
        wire_tier tier = json_tier(e);
        uint32_t nh = (uint32_t)json_object_array_length(hs);
        json_object *g = NULL;
        json_object_object_get_ex(e, "group_idx", &g);
        if (g && json_object_get_int64(g) != 0)
            continue; /* a group other than full attention: not indexed */
        if (!strcmp(type, "BlockRemoved")) {
            if (!(last && last->type == WIRE_R_REMOVED && last->tier == tier)) {
                x[nx++] =
                    (xev){.type = WIRE_R_REMOVED, .rank = r, .tier = tier};
                last = &x[nx - 1];
            }
            for (uint32_t k = 0; k < nh; k++)
                last->bh[last->n++] =
                    json_key(json_object_array_get_idx(hs, k));
            continue;
        }
        json_object_object_get_ex(e, "token_ids", &toks);
        json_object *bs;
        json_object_object_get_ex(e, "block_size", &bs);
        size_t nt = toks ? json_object_array_length(toks) : 0;
        if (json_object_get_int64(bs) != 16 || nt != (size_t)nh * 16) {
            (*rejected)++;
            continue;
        }
        bool wide = false; /* a token id the u32 router hash cannot take */
        for (size_t k = 0; k < nt; k++)
            wide |= json_object_get_uint64(json_object_array_get_idx(toks, k)) >
                    UINT32_MAX;
        if (wide) {
            (*rejected)++;
            continue;
        }
        json_object *par, *lora;
        json_object_object_get_ex(e, "parent_block_hash", &par);
        const char *ln = NULL;
        if (json_object_object_get_ex(e, "lora_name", &lora) && lora)
            ln = json_object_get_string(lora);
        uint64_t seed = wire_router_seed(ln, ln ? strlen(ln) : 0, NULL, 0);
        json_object *ek = NULL;
        json_object_object_get_ex(e, "extra_keys", &ek);
        bool hp = par != NULL;
        uint64_t pk = hp ? json_key(par) : 0;
        bool merge = last && last->type == WIRE_R_STORED && hp &&
                     last->tier == tier && last->bh[last->n - 1] == pk;
        if (!merge) {
            x[nx++] = (xev){.type = WIRE_R_STORED,
                            .rank = r,
                            .tier = tier,
                            .has_parent = hp,
                            .parent = pk};
            last = &x[nx - 1];
        }
        for (uint32_t k = 0; k < nh; k++) {
            uint64_t tk[16];
            for (int j = 0; j < 16; j++)
                tk[j] = json_object_get_uint64(
                    json_object_array_get_idx(toks, k * 16 + (size_t)j));
            /* DESIGN §5 from the block's extra keys: the adapter's
             * seed, block 0's salt in its seed, (id, offset) pairs after
             * the tokens */
            json_object *bk = ek ? json_object_array_get_idx(ek, k) : NULL;
            wire_mm_key mm[4];
            uint32_t nm = 0;
            uint64_t s = seed;
            for (size_t j = 0; bk && j < json_object_array_length(bk); j++) {
                json_object *it = json_object_array_get_idx(bk, j);
                if (json_object_is_type(it, json_type_array)) {
                    ck_assert_uint_lt(nm, 4);
                    mm[nm++] =
                        (wire_mm_key){json_object_get_string(
                                          json_object_array_get_idx(it, 0)),
                                      json_object_get_int64(
                                          json_object_array_get_idx(it, 1))};
                } else if (!(ln && j == 0) && !hp && k == 0) {
                    const char *salt = json_object_get_string(it);
                    s = wire_router_seed(ln, ln ? strlen(ln) : 0, salt,
                                         strlen(salt));
                }
            }
            last->bh[last->n] = json_key(json_object_array_get_idx(hs, k));
            last->th[last->n++] = wire_router_hash_mm(tk, 16, s, mm, nm);
        }
    }
    return nx;
}

START_TEST(every_wire_vector_converts_to_the_event_plane) {
    json_object *root = kt_load_json("tests/data/vectors/wire/vectors.json");
    json_object *cases;
    ck_assert(json_object_object_get_ex(root, "cases", &cases));
    size_t ncases = json_object_array_length(cases);
    ck_assert_uint_ge(ncases, 30);
    static xev x[64];
    static const wire_revent *ev[MAXEV];
    uint64_t total_blocks = 0;
    for (size_t c = 0; c < ncases; c++) {
        json_object *cs = json_object_array_get_idx(cases, c), *f, *fields;
        json_object_object_get_ex(cs, "file", &f);
        json_object_object_get_ex(cs, "fields", &fields);
        const char *name = json_object_get_string(f);
        char rel[256];
        snprintf(rel, sizeof(rel), "tests/data/vectors/wire/%s", name);
        char *path = kt_src_path(rel);
        size_t len;
        uint8_t *bytes = kt_read_file(path, &len);
        kvo_free(path);

        tr t;
        tr_init(&t, NULL, 2, true);
        kvo_buf payload = {bytes, len, len};
        tr_live(&t, 1, 5, &payload); /* source 1: fallback rank 1 */
        tr_flush(&t);
        uint32_t rejected;
        uint32_t nx = expect_vector(fields, 1, x, &rejected);
        size_t n = tr_events(&t, ev, MAXEV);
        ck_assert_msg(n == nx, "%s: %zu router events, expected %u", name, n,
                      nx);
        ck_assert_msg(relay_stats_rejects(tr_stats(&t)) == rejected,
                      "%s: rejects", name);
        ck_assert_uint_eq(relay_stats_decode_errors(tr_stats(&t)), 0);
        /* the sliding-window group's store is counted, not indexed */
        ck_assert_msg((tr_stats(&t)->blocks_other_group > 0) ==
                          (strcmp(name, "store_sliding_window.bin") == 0),
                      "%s: blocks_other_group %" PRIu64, name,
                      tr_stats(&t)->blocks_other_group);
        for (size_t i = 0; i < n; i++) {
            const wire_revent *e = ev[i];
            ck_assert_msg(e->type == x[i].type, "%s: event %zu type", name, i);
            ck_assert_uint_eq(e->worker_id, 7);
            ck_assert_uint_eq(e->event_id, i + 1);
            ck_assert_msg(e->dp_rank == x[i].rank, "%s: rank %u != %u", name,
                          e->dp_rank, x[i].rank);
            if (e->type == WIRE_R_CLEARED) continue;
            ck_assert_msg(e->tier == x[i].tier, "%s: tier", name);
            if (e->type == WIRE_R_REMOVED) {
                ck_assert_uint_eq(e->n_removed, x[i].n);
                for (uint32_t k = 0; k < x[i].n; k++)
                    ck_assert_uint_eq(e->removed[k], x[i].bh[k]);
                continue;
            }
            ck_assert(e->has_parent == x[i].has_parent);
            if (e->has_parent) ck_assert_uint_eq(e->parent_hash, x[i].parent);
            ck_assert_uint_eq(e->n_blocks, x[i].n);
            for (uint32_t k = 0; k < x[i].n; k++) {
                ck_assert_msg(e->blocks[k].block_hash == x[i].bh[k],
                              "%s: block %u hash", name, k);
                ck_assert_msg(e->blocks[k].tokens_hash == x[i].th[k],
                              "%s: block %u tokens_hash", name, k);
            }
            total_blocks += x[i].n;
        }
        /* The envelope: subject, publisher, sequences, watermark header. */
        ck_assert_uint_ge(t.n, 1);
        for (size_t i = 0; i < t.n; i++) {
            ck_assert_str_eq(t.msgs[i].subject,
                             "namespace.dynamo.component.backend.kv-events");
            ck_assert_uint_eq(t.msgs[i].m.publisher_id, 42);
            ck_assert_uint_eq(t.msgs[i].m.sequence, i);
            ck_assert(t.msgs[i].m.topic.len == 9 &&
                      !memcmp(t.msgs[i].m.topic.p, "kv-events", 9));
        }
        ck_assert(t.msgs[t.n - 1].has_range);
        ck_assert_uint_eq(t.msgs[t.n - 1].first, 5);
        ck_assert_uint_eq(t.msgs[t.n - 1].last, 5);
        tr_fini(&t);
        kvo_free(bytes);
    }
    ck_assert_uint_gt(total_blocks, 20);
    json_object_put(root);
}
END_TEST

/* The known router hash value of DESIGN §5 reaches the wire. */
START_TEST(tokens_hash_is_the_dynamo_router_hash) {
    tr t;
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.block_size = 4;
    tr_init(&t, &c, 1, false);
    tb b;
    tb_begin(&b);
    tb_raw(&b, "{\"type\": \"BlockStored\", \"block_hashes\": [99], "
               "\"parent_block_hash\": null, \"token_ids\": [1,2,3,4], "
               "\"block_size\": 4, \"medium\": \"GPU\"}");
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_flush(&t);
    const wire_revent *ev[4];
    ck_assert_uint_eq(tr_events(&t, ev, 4), 1);
    ck_assert_uint_eq(ev[0]->blocks[0].tokens_hash, 14643705804678351452ull);
    ck_assert_uint_eq(ev[0]->blocks[0].block_hash, 99);
    tr_fini(&t);
}
END_TEST

/* ---- sequences ---------------------------------------------------------------*/

START_TEST(gap_requests_replay_and_applies_in_order) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_seqs(&t, 0, 0, 1);
    tr_live_tag(&t, 0, 4, 4); /* 2 and 3 lost */
    ck_assert_uint_eq(t.nreq, 1);
    ck_assert_uint_eq(t.req[0], 2);
    tr_live_tag(&t, 0, 5, 5); /* buffered while the replay runs */
    tr_flush(&t);
    uint64_t wm;
    ck_assert(tr_watermark(&t, &wm));
    ck_assert_uint_eq(wm, 1); /* nothing past the gap is claimed */
    tr_reply_seqs(&t, 0, 2, 5, true);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 6, 6);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 5, 6);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->gaps, 1);
    ck_assert_uint_eq(s->replays_requested, 1);
    ck_assert_uint_eq(s->replays_completed, 1);
    ck_assert_uint_eq(s->replays_applied, 4);
    ck_assert_uint_eq(s->duplicates_dropped, 2); /* buffered 4 and 5 */
    ck_assert_uint_eq(s->cleared_emitted, 0);
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    ck_assert(tr_watermark(&t, &wm));
    ck_assert_uint_eq(wm, 6);
    tr_fini(&t);
}
END_TEST

START_TEST(older_replay_layout_without_topic_is_understood) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_tag(&t, 0, 0, 0);
    tr_live_tag(&t, 0, 3, 3);
    tr_reply_seqs(&t, 0, 1, 2, false);
    tr_end(&t, 0, false);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3);
    ck_assert_uint_eq(tr_stats(&t)->replays_completed, 1);
    tr_fini(&t);
}
END_TEST

START_TEST(replay_window_exceeded_publishes_cleared) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_seqs(&t, 0, 0, 2);
    tr_live_tag(&t, 0, 10, 10);
    ck_assert_uint_eq(t.req[0], 3);
    tr_reply_seqs(&t, 0, 7, 10, true);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 11, 11);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->replay_failures[RELAY_window_exceeded], 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    /* stored 0,1,2 | cleared (no header) | stored 7..11 */
    static const wire_revent *ev[64];
    size_t n = tr_events(&t, ev, 64);
    size_t ci = n;
    for (size_t i = 0; i < n; i++)
        if (ev[i]->type == WIRE_R_CLEARED) ci = i;
    ck_assert_uint_lt(ci, n);
    ck_assert_uint_eq(ev[ci]->dp_rank, 0);
    ck_assert_uint_eq(ev[ci]->worker_id, 7);
    tr_expect_tags(&t, 0, 1, 2, 7, 8, 9, 10, 11);
    for (size_t i = 0; i < t.n; i++)
        for (uint32_t j = 0; j < t.msgs[i].m.n_events; j++)
            if (t.msgs[i].m.events[j].type == WIRE_R_CLEARED)
                ck_assert(!t.msgs[i].has_range);
    tr_fini(&t);
}
END_TEST

START_TEST(publisher_restart_clears_and_replays_from_zero) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_seqs(&t, 0, 0, 5);
    /* New process (its batches tagged 100 + seq): seq 0 and 1 were missed,
     * 2 arrives. */
    tr_live_tag(&t, 0, 2, 102);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(t.nreq, 1);
    ck_assert_uint_eq(t.req[0], 0);
    for (uint64_t i = 0; i < 3; i++) tr_reply_tag(&t, 0, i, 100 + i, true);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 3, 103);
    /* Dedup counts were reset: a remove of a pre-restart block is unknown. */
    tb b;
    tb_begin(&b);
    uint64_t old = TB_TAG_BLOCK + 3;
    tb_remove(&b, &old, 1);
    tr_live_tb(&t, 0, 4, &b, 0);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 5, 100, 101, 102, 103);
    ck_assert_uint_eq(s->duplicates_dropped, 1);
    ck_assert_uint_eq(s->removes_unknown, 1);
    /* one restart: the rank forgotten, so one cleared per tier */
    ck_assert_uint_eq(tr_count(&t, WIRE_R_CLEARED), WIRE_TIER_COUNT);
    ck_assert_uint_eq(s->revents_cleared, WIRE_TIER_COUNT);
    tr_fini(&t);
}
END_TEST

START_TEST(replayed_duplicates_are_dropped_and_counted) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_seqs(&t, 0, 0, 2);
    tr_live_tag(&t, 0, 4, 4);
    ck_assert_uint_eq(t.req[0], 3);
    /* A publisher that replays from further back than asked, and up to what
     * it published meanwhile (5, 6 still queued on the SUB socket). */
    tr_reply_seqs(&t, 0, 1, 6, true);
    tr_end(&t, 0, true);
    tr_live_seqs(&t, 0, 5, 7);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 5, 6, 7);
    relay_stats *s = tr_stats(&t);
    /* replies 1, 2; buffered 4; live 5, 6 */
    ck_assert_uint_eq(s->duplicates_dropped, 5);
    ck_assert_uint_eq(s->restarts, 0);
    ck_assert_uint_eq(s->cleared_emitted, 0);
    tr_fini(&t);
}
END_TEST

START_TEST(gap_without_replay_endpoint_clears_and_goes_on) {
    tr t;
    tr_init(&t, NULL, 1, false);
    tr_live_tag(&t, 0, 0, 0);
    tr_live_seqs(&t, 0, 3, 4);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(t.nreq, 0);
    ck_assert_uint_eq(s->gaps, 1);
    ck_assert_uint_eq(s->replay_failures[RELAY_no_endpoint], 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    tr_expect_tags(&t, 0, 3, 4);
    tr_fini(&t);
}
END_TEST

START_TEST(replay_timeout_clears_and_drains_the_buffer) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_tag(&t, 0, 0, 0);
    tr_live_seqs(&t, 0, 3, 4);
    t.now += 500 * 1000000ull;
    relay_pipe_tick(t.p, t.now); /* not yet */
    ck_assert_uint_eq(tr_stats(&t)->replay_failures[RELAY_timeout], 0);
    ck_assert_uint_ne(relay_pipe_deadline(t.p), 0);
    t.now += 600 * 1000000ull;
    relay_pipe_tick(t.p, t.now);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->replay_failures[RELAY_timeout], 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(t.aborts, 1);
    ck_assert_uint_eq(relay_pipe_deadline(t.p), 0);
    tr_expect_tags(&t, 0, 3, 4);
    /* A late reply is stray, never applied. */
    tr_reply_tag(&t, 0, 1, 1, true);
    ck_assert_uint_eq(tr_stats(&t)->replay_stray, 1);
    tr_expect_tags(&t, 0, 3, 4);
    tr_fini(&t);
}
END_TEST

/* A replay request the transport refuses: counted, cleared, and the batch
 * after the hole is taken at once (never held for a replay that will not
 * come). */
START_TEST(a_replay_request_that_cannot_be_sent_clears_and_goes_on) {
    tr t;
    tr_init(&t, NULL, 1, true);
    t.fail_requests = true;
    tr_live_tag(&t, 0, 0, 0);
    tr_live_seqs(&t, 0, 3, 4);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(t.nreq, 1);
    ck_assert_uint_eq(s->replay_failures[RELAY_request_failed], 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(s->live_buffered, 0);
    ck_assert_uint_eq(t.aborts, 1);
    ck_assert_uint_eq(relay_pipe_deadline(t.p), 0);
    tr_expect_tags(&t, 0, 3, 4);
    tr_fini(&t);
}
END_TEST

START_TEST(replay_from_start_publishes_cleared_then_replays) {
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.replay_from_set = true;
    c.replay_from = 0;
    tr t;
    tr_init(&t, &c, 1, true);
    relay_pipe_start(t.p, t.now);
    ck_assert_uint_eq(t.n, 1); /* cleared, before anything else */
    ck_assert_uint_eq(t.msgs[0].m.n_events, WIRE_TIER_COUNT); /* every tier */
    const wire_revent *cl[WIRE_TIER_COUNT];
    ck_assert_uint_eq(tr_events(&t, cl, WIRE_TIER_COUNT), WIRE_TIER_COUNT);
    expect_cleared_tiers(cl, 0);
    ck_assert(!t.msgs[0].has_range);
    ck_assert_uint_eq(t.nreq, 1);
    ck_assert_uint_eq(t.req[0], 0);
    tr_live_tag(&t, 0, 3, 3); /* live while replaying: buffered */
    tr_flush(&t);
    ck_assert_uint_eq(t.n, 1);
    tr_reply_seqs(&t, 0, 0, 3, true);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 4, 4);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    tr_fini(&t);
}
END_TEST

/* Everything so far came through the start replay (the SUB joined late):
 * a live batch behind next is the same batch late only if its bytes are
 * those applied; other bytes mean the publisher started over. */
START_TEST(a_live_batch_behind_a_replay_is_a_restart_unless_it_is_the_same) {
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.replay_from_set = true;
    c.replay_from = 0;
    tr t;
    tr_init(&t, &c, 1, true);
    relay_pipe_start(t.p, t.now);
    tr_reply_seqs(&t, 0, 0, 9, true);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 9, 9); /* the same batch 9, late: a duplicate */
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 0);
    ck_assert_uint_eq(s->duplicates_dropped, 1);
    tr_live_tag(&t, 0, 2, 1002); /* seq 2 again, other bytes: a restart */
    tr_flush(&t);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(s->cleared_emitted, 2);
    ck_assert_uint_eq(t.req[t.nreq - 1], 0); /* replays the new run */
    tr_fini(&t);
}
END_TEST

/* A cleared says nothing new when nothing was forwarded since the last one:
 * a start replay that times out before any batch publishes no second. */
START_TEST(a_failure_with_nothing_forwarded_publishes_no_second_cleared) {
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.replay_from_set = true;
    tr t;
    tr_init(&t, &c, 1, true);
    relay_pipe_start(t.p, t.now);
    t.now += 2000 * 1000000ull;
    relay_pipe_tick(t.p, t.now);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->replay_failures[RELAY_timeout], 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    /* once something was forwarded, the next failure clears again */
    tr_live_tag(&t, 0, 0, 0);
    tr_live_tag(&t, 0, 2, 0);
    t.now += 2000 * 1000000ull;
    relay_pipe_tick(t.p, t.now);
    ck_assert_uint_eq(s->replay_failures[RELAY_timeout], 2);
    ck_assert_uint_eq(s->cleared_emitted, 2);
    tr_fini(&t);
}
END_TEST

START_TEST(full_live_buffer_drops_then_replays_the_rest) {
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.buffer_max_batches = 2;
    tr t;
    tr_init(&t, &c, 1, true);
    tr_live_tag(&t, 0, 0, 0);
    tr_live_seqs(&t, 0, 5, 8);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->buffer_dropped, 2); /* 7 and 8 */
    ck_assert_uint_eq(t.req[0], 1);
    tr_reply_seqs(&t, 0, 1, 4, true);
    tr_end(&t, 0, true); /* drains 5, 6; asks again from 7 */
    ck_assert_uint_eq(t.nreq, 2);
    ck_assert_uint_eq(t.req[1], 7);
    tr_reply_seqs(&t, 0, 7, 8, true);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 9, 9);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    ck_assert_uint_eq(s->cleared_emitted, 0);
    tr_fini(&t);
}
END_TEST

/* ---- the sockets' news (relay_pipe_link) -------------------------------------*/

static void tell(tr *t, uint32_t src, relay_link what) {
    relay_pipe_link(t->p, src, what, t->now);
}

/* A PUB drops what a gone subscriber would have got, and in lockstep
 * nothing may come after the lost batches to show the gap: a SUB that comes
 * back replays at once, from the last batch applied (the same bytes: the
 * same engine). Its first connection is no reconnect and asks nothing. */
START_TEST(a_sub_back_after_a_loss_replays_from_the_last_batch_applied) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tell(&t, 0, RELAY_LINK_SUB_UP);
    ck_assert_uint_eq(t.nreq, 0);
    tr_live_seqs(&t, 0, 0, 2);
    tell(&t, 0, RELAY_LINK_SUB_DOWN);
    relay_src_info info;
    relay_pipe_source_info(t.p, 0, &info);
    ck_assert(!info.connected);
    tell(&t, 0, RELAY_LINK_SUB_UP);
    relay_pipe_source_info(t.p, 0, &info);
    ck_assert(info.connected);
    ck_assert_int_eq(info.state, RELAY_SRC_REPLAYING);
    ck_assert_uint_eq(t.nreq, 1);
    ck_assert_uint_eq(t.req[0], 2);
    /* 3 and 4 were published while the SUB was down; 5 arrives live */
    tr_live_tag(&t, 0, 5, 5);
    tr_reply_seqs(&t, 0, 2, 5, true);
    tr_end(&t, 0, true);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 5);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 0);
    ck_assert_uint_eq(s->duplicates_dropped, 2); /* reply 2, buffered 5 */
    ck_assert_uint_eq(s->zmq_disconnects, 1);
    ck_assert_uint_eq(s->zmq_reconnects, 1);
    ck_assert_uint_eq(s->src[0].zmq_disconnects, 1);
    ck_assert_uint_eq(s->src[0].zmq_reconnects, 1);
    ck_assert_uint_eq(s->gaps, 0);
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    ck_assert_uint_eq(s->cleared_emitted, 0);
    tr_fini(&t);
}
END_TEST

/* A SUB that was replaying when it lost its connection asks again from
 * where the replay got to (from the last batch applied, to check the
 * engine): the first request was sent before the loss and cannot hold what
 * was published during it. The buffer is kept. */
START_TEST(a_sub_back_during_a_replay_asks_again_and_keeps_the_buffer) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tell(&t, 0, RELAY_LINK_SUB_UP);
    tr_live_tag(&t, 0, 0, 0);
    tr_live_tag(&t, 0, 2, 2); /* gap: replay from 1, 2 held */
    ck_assert_uint_eq(t.nreq, 1);
    tell(&t, 0, RELAY_LINK_SUB_DOWN);
    tell(&t, 0, RELAY_LINK_SUB_UP);
    ck_assert_uint_eq(t.aborts, 1);
    ck_assert_uint_eq(t.nreq, 2);
    ck_assert_uint_eq(t.req[1], 0);
    tr_live_tag(&t, 0, 4, 4); /* 3 was lost while the SUB was down */
    tr_reply_seqs(&t, 0, 0, 3, true);
    tr_end(&t, 0, true);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4);
    ck_assert_uint_eq(relay_stats_replay_failures(tr_stats(&t)), 0);
    ck_assert_uint_eq(tr_stats(&t)->cleared_emitted, 0);
    tr_fini(&t);
}
END_TEST

/* libzmq drops a connection on a frame over ZMQ_MAXMSGSIZE, the DEALER's
 * as the SUB's. A replay that drops twice right before the same batch can
 * never deliver it: the batch is counted as oversize, the rank cleared,
 * the watermark moved past it, and the replay asked from the next one. */
START_TEST(
    a_batch_that_breaks_the_replay_twice_is_oversize_cleared_and_passed) {
    tr t;
    tr_init(&t, NULL, 2, true);
    tell(&t, 1, RELAY_LINK_SUB_UP);
    tr_live_seqs(&t, 1, 0, 1);
    /* batch 2 is too big: the SUB is dropped for good and made anew */
    tell(&t, 1, RELAY_LINK_SUB_DOWN);
    tell(&t, 1, RELAY_LINK_SUB_REOPENED);
    tell(&t, 1, RELAY_LINK_SUB_UP);
    ck_assert_uint_eq(t.nreq, 1);
    ck_assert_uint_eq(t.req[0], 1);
    tr_reply_tag(&t, 1, 1, 1, true); /* the last batch applied: the same */
    /* the replay's next reply is 2 again: dropped, asked again */
    tell(&t, 1, RELAY_LINK_REPLAY_DOWN);
    ck_assert_uint_eq(t.aborts, 1);
    ck_assert_uint_eq(t.nreq, 2);
    ck_assert_uint_eq(t.req[1], 2);
    ck_assert_uint_eq(tr_stats(&t)->oversize, 0);
    tell(&t, 1, RELAY_LINK_REPLAY_DOWN);
    ck_assert_uint_eq(t.aborts, 2);
    ck_assert_uint_eq(t.nreq, 3);
    ck_assert_uint_eq(t.req[2], 3);
    tr_flush(&t);
    uint64_t wm;
    ck_assert(tr_watermark(&t, &wm));
    ck_assert_uint_eq(wm, 2);
    tr_reply_seqs(&t, 1, 3, 4, true);
    tr_end(&t, 1, true);
    tr_flush(&t);
    ck_assert(tr_watermark(&t, &wm));
    ck_assert_uint_eq(wm, 4);
    const wire_revent *ev[16];
    size_t n = tr_events(&t, ev, 16);
    /* 0, 1, cleared (one per tier), 3, 4 */
    ck_assert_uint_eq(n, 4 + WIRE_TIER_COUNT);
    expect_cleared_tiers(&ev[2], 0); /* the rank its batches carried */
    tr_expect_tags(&t, 0, 1, 3, 4);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->oversize, 1);
    ck_assert_uint_eq(s->src[1].oversize, 1);
    ck_assert_uint_eq(s->src[0].oversize, 0);
    ck_assert_uint_eq(s->src[1].zmq_disconnects, 3);
    ck_assert_uint_eq(s->src[1].zmq_sockets_reopened, 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    ck_assert_uint_eq(s->batches_applied, 4);
    /* both views: the total, and per source */
    json_object *j = relay_stats_to_json(s), *v;
    ck_assert(json_object_object_get_ex(j, "oversize", &v));
    ck_assert_uint_eq(json_object_get_uint64(v), 1);
    json_object_put(j);
    j = json_object_new_object();
    relay_src_stats_to_json(&s->src[1], j);
    ck_assert(json_object_object_get_ex(j, "oversize", &v));
    ck_assert_uint_eq(json_object_get_uint64(v), 1);
    ck_assert(json_object_object_get_ex(j, "zmq_sockets_reopened", &v));
    ck_assert_uint_eq(json_object_get_uint64(v), 1);
    json_object_put(j);
    kvo_buf prom;
    kvo_buf_init(&prom);
    ck_assert_int_eq(relay_stats_to_prom(s, &prom), KVO_OK);
    ck_assert_int_eq(kvo_buf_cstr(&prom), KVO_OK);
    const char *text = (const char *)prom.data;
    ck_assert_ptr_nonnull(strstr(text, "\nkvo_relay_oversize_total 1\n"));
    ck_assert_ptr_nonnull(
        strstr(text, "\nkvo_relay_source_oversize_total{source=\"0\"} 0\n"
                     "kvo_relay_source_oversize_total{source=\"1\"} 1\n"));
    kvo_buf_fini(&prom);
    tr_fini(&t);
}
END_TEST

/* ---- engines that restart while idle: the probe ------------------------------
 * Batches 0..4 applied live, then the SUB is lost and comes back: the
 * replay is asked from 4, the last batch applied. */
static void probed(tr *t) {
    tr_init(t, NULL, 1, true);
    tell(t, 0, RELAY_LINK_SUB_UP);
    tr_live_seqs(t, 0, 0, 4);
    tell(t, 0, RELAY_LINK_SUB_DOWN);
    tell(t, 0, RELAY_LINK_SUB_UP);
    ck_assert_uint_eq(t->nreq, 1);
    ck_assert_uint_eq(t->req[0], 4);
}

/* The cleared is the first event after the old run's stores. */
static void cleared_after(tr *t, size_t stores_before) {
    static const wire_revent *ev[64];
    size_t n = tr_events(t, ev, 64);
    ck_assert_uint_gt(n, stores_before);
    for (size_t i = 0; i < stores_before; i++)
        ck_assert_int_eq(ev[i]->type, WIRE_R_STORED);
    ck_assert_uint_ge(n, stores_before + WIRE_TIER_COUNT);
    expect_cleared_tiers(&ev[stores_before], 0);
}

/* A new engine that published nothing yet answers with the end marker at
 * once: a restart, said (cleared) before any new batch. */
START_TEST(an_engine_that_restarted_while_idle_and_holds_nothing_is_cleared) {
    tr t;
    probed(&t);
    size_t aborts = t.aborts;
    tr_end(&t, 0, true);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    cleared_after(&t, 5);
    ck_assert_uint_eq(t.nreq, 2);
    ck_assert_uint_eq(t.req[1], 0); /* the new run, from its start */
    ck_assert_uint_gt(t.aborts, aborts);
    /* The new run's first batch comes live while its replay runs. */
    tr_live_tag(&t, 0, 0, 100);
    tr_reply_tag(&t, 0, 0, 100, true);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 1, 101);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 100, 101);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(tr_stats(&t)->state_blocks, 2); /* gauges: read now */
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    tr_fini(&t);
}
END_TEST

/* A new engine that has published since answers with its own batch under
 * the seq asked: other bytes, a restart. */
START_TEST(an_engine_that_restarted_and_published_answers_other_bytes) {
    tr t;
    probed(&t);
    tr_reply_tag(&t, 0, 4, 104, true);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(t.nreq, 2);
    ck_assert_uint_eq(t.req[1], 0);
    for (uint64_t i = 0; i <= 6; i++) tr_reply_tag(&t, 0, i, 100 + i, true);
    tr_end(&t, 0, true);
    tr_flush(&t);
    cleared_after(&t, 5);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 100, 101, 102, 103, 104, 105, 106);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    tr_fini(&t);
}
END_TEST

/* The engine's buffer starts right after the last batch applied: nothing
 * was lost. Further on, batches were lost: a window exceeded, cleared, not
 * counted as a restart. */
START_TEST(a_first_reply_past_the_last_batch_applied_is_no_restart) {
    tr t;
    probed(&t);
    tr_reply_seqs(&t, 0, 5, 6, true);
    tr_end(&t, 0, true);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 5, 6);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 0);
    ck_assert_uint_eq(s->cleared_emitted, 0);
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    tr_fini(&t);
    probed(&t);
    tr_reply_seqs(&t, 0, 8, 9, true);
    tr_end(&t, 0, true);
    tr_flush(&t);
    s = tr_stats(&t);
    cleared_after(&t, 5);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 8, 9);
    ck_assert_uint_eq(s->restarts, 0);
    ck_assert_uint_eq(s->replay_failures[RELAY_window_exceeded], 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    tr_fini(&t);
}
END_TEST

/* The batch asked for was received once, so a replay that breaks twice on
 * it is another engine's. Once is the connection: asked again. */
START_TEST(a_probe_whose_replay_breaks_twice_is_a_restart) {
    tr t;
    probed(&t);
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN);
    ck_assert_uint_eq(t.nreq, 2);
    ck_assert_uint_eq(t.req[1], 4);
    ck_assert_uint_eq(tr_stats(&t)->restarts, 0);
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(s->oversize, 0);
    ck_assert_uint_eq(t.nreq, 3);
    ck_assert_uint_eq(t.req[2], 0);
    cleared_after(&t, 5);
    /* once, then the same batch: the same engine after all */
    tr_fini(&t);
    probed(&t);
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN);
    tr_reply_seqs(&t, 0, 4, 5, true);
    tr_end(&t, 0, true);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 5);
    ck_assert_uint_eq(tr_stats(&t)->restarts, 0);
    ck_assert_uint_eq(tr_stats(&t)->cleared_emitted, 0);
    tr_fini(&t);
}
END_TEST

/* The new run's first batch can come live before the probe is answered:
 * the restart is seen there, once, and the probe's answer is stray. */
START_TEST(a_new_run_seen_live_during_a_probe_is_one_restart) {
    tr t;
    probed(&t);
    tr_live_tag(&t, 0, 0, 100);
    tr_end(&t, 0, true);
    tr_live_tag(&t, 0, 1, 101);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->restarts, 1);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(s->replay_stray, 1);
    cleared_after(&t, 5);
    tr_expect_tags(&t, 0, 1, 2, 3, 4, 100, 101);
    tr_fini(&t);
}
END_TEST

/* Without the last batch applied in the seen ring (an oversize batch was
 * passed over), there is nothing to compare: the replay is asked from next
 * as before. */
START_TEST(without_the_last_batch_applied_the_replay_starts_at_next) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tell(&t, 0, RELAY_LINK_SUB_UP);
    tr_live_seqs(&t, 0, 0, 1);
    tell(&t, 0, RELAY_LINK_SUB_DOWN);
    tell(&t, 0, RELAY_LINK_SUB_UP);
    tr_reply_tag(&t, 0, 1, 1, true);
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN); /* batch 2, twice: oversize */
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN);
    ck_assert_uint_eq(tr_stats(&t)->oversize, 1);
    ck_assert_uint_eq(t.req[t.nreq - 1], 3);
    tr_end(&t, 0, true);
    tell(&t, 0, RELAY_LINK_SUB_DOWN);
    tell(&t, 0, RELAY_LINK_SUB_UP);
    ck_assert_uint_eq(t.req[t.nreq - 1], 3);
    tr_reply_tag(&t, 0, 3, 3, true);
    tr_end(&t, 0, true);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 3);
    ck_assert_uint_eq(tr_stats(&t)->restarts, 0);
    tr_fini(&t);
}
END_TEST

/* Progress between two drops means the connection, not a batch, failed:
 * asked again each time, nothing lost, nothing counted as oversize. */
START_TEST(a_replay_that_drops_after_progress_is_asked_again_not_oversize) {
    tr t;
    tr_init(&t, NULL, 1, true);
    tr_live_tag(&t, 0, 0, 0);
    tr_live_tag(&t, 0, 3, 3); /* replay from 1 */
    tr_reply_tag(&t, 0, 1, 1, true);
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN);
    ck_assert_uint_eq(t.req[t.nreq - 1], 2);
    tr_reply_tag(&t, 0, 2, 2, true);
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN);
    ck_assert_uint_eq(t.nreq, 3);
    ck_assert_uint_eq(t.req[2], 3);
    tr_end(&t, 0, true);
    tr_flush(&t);
    tr_expect_tags(&t, 0, 1, 2, 3);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->oversize, 0);
    ck_assert_uint_eq(s->zmq_disconnects, 2);
    ck_assert_uint_eq(s->cleared_emitted, 0);
    ck_assert_uint_eq(relay_stats_replay_failures(s), 0);
    /* a drop outside a replay only closes the DEALER (reopened on demand),
     * and a failed handshake is counted */
    size_t aborts = t.aborts;
    tell(&t, 0, RELAY_LINK_REPLAY_DOWN);
    tell(&t, 0, RELAY_LINK_HANDSHAKE_FAILED);
    ck_assert_uint_eq(t.aborts, aborts + 1);
    ck_assert_uint_eq(t.nreq, 3);
    ck_assert_uint_eq(tr_stats(&t)->zmq_protocol_errors, 1);
    ck_assert_uint_eq(tr_stats(&t)->src[0].zmq_protocol_errors, 1);
    tr_fini(&t);
}
END_TEST

/* ---- dedup -------------------------------------------------------------------*/

START_TEST(two_copies_need_two_removes_before_one_is_forwarded) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t h = 777, other = 778;
    tb b;
    /* store, store (a second physical copy), remove, remove */
    for (int step = 0; step < 4; step++) {
        tb_begin(&b);
        if (step < 2)
            tb_store(&b, false, 0, &h, 1);
        else
            tb_remove(&b, &h, 1);
        tr_live_tb(&t, 0, (uint64_t)step, &b, 0);
        tr_flush(&t);
    }
    /* a remove of a hash never stored: forwarded, counted */
    tb_begin(&b);
    tb_remove(&b, &other, 1);
    tr_live_tb(&t, 0, 4, &b, 0);
    tr_flush(&t);
    static const wire_revent *ev[16];
    size_t n = tr_events(&t, ev, 16);
    ck_assert_uint_eq(n, 4);
    ck_assert(ev[2]->type == WIRE_R_REMOVED);
    ck_assert_uint_eq(ev[2]->n_removed, 1);
    ck_assert_uint_eq(ev[2]->removed[0], 777);
    ck_assert_uint_eq(ev[3]->removed[0], 778);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->dedup_suppressed, 1);
    ck_assert_uint_eq(s->removes_unknown, 1);
    /* the suppressed remove still advanced the watermark: one envelope per
     * flush, the third one empty */
    ck_assert_uint_eq(t.n, 5);
    ck_assert_uint_eq(t.msgs[2].m.n_events, 0);
    ck_assert(t.msgs[2].has_range);
    ck_assert_uint_eq(t.msgs[2].first, 2);
    ck_assert_uint_eq(t.msgs[2].last, 2);
    ck_assert_uint_eq(s->watermark_messages, 1);
    tr_fini(&t);
}
END_TEST

START_TEST(dedup_counts_are_per_rank_and_tier_and_reset_by_cleared) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t h = 555;
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, &h, 1);
    tr_live_tb(&t, 0, 0, &b, 0);
    tb_begin(&b);
    tb_store(&b, false, 0, &h, 1);
    tr_live_tb(&t, 0, 1, &b, 1); /* same hash, other rank */
    tb_begin(&b);
    tb_store(&b, false, 0, &h, 1);
    tb_cleared(&b); /* rank 0: counts reset */
    tb_remove(&b, &h, 1);
    tr_live_tb(&t, 0, 2, &b, 0);
    tb_begin(&b);
    tb_remove(&b, &h, 1);
    tr_live_tb(&t, 0, 3, &b, 1);
    /* two copies on the GPU; a remove from the CPU tier is not one of them */
    uint64_t g = 556;
    tb_begin(&b);
    tb_store(&b, false, 0, &g, 1);
    tb_store(&b, false, 0, &g, 1);
    tb_raw(&b, "{\"type\": \"BlockRemoved\", \"block_hashes\": [556], "
               "\"medium\": \"CPU\"}");
    tr_live_tb(&t, 0, 4, &b, 1);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->dedup_suppressed, 0);
    /* rank 0 after cleared; the CPU remove */
    ck_assert_uint_eq(s->removes_unknown, 2);
    ck_assert_uint_eq(tr_count(&t, WIRE_R_REMOVED), 3);
    tr_fini(&t);
}
END_TEST

/* ---- tiers -------------------------------------------------------------------*/

/* vLLM's offloading (and kvo-mocker's CPU tier) stores a block on the CPU
 * without extra_keys, while its GPU copy is still cached: the relay takes
 * the tokens_hash the device tier holds (the salt and the multimodal keys
 * in it), not the hash of the tokens alone, which no router query for the
 * request would find. */
START_TEST(an_offloaded_keyed_block_keeps_the_device_tiers_tokens_hash) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t h[2] = {801, 802}, gone[2] = {802, 801};
    tb b;
    tb_begin(&b);
    tb_store_in(&b, "GPU", false, 0, h, 2,
                "[[\"tenant-1\"], [[\"kvo-img-1\", 5]]]");
    tr_live_tb(&t, 0, 0, &b, 0);
    /* offloaded, then evicted from the GPU: the engine's order */
    tb_begin(&b);
    tb_store_in(&b, "CPU", false, 0, &h[0], 1, NULL);
    tb_store_in(&b, "CPU", true, h[0], &h[1], 1, NULL);
    tb_remove(&b, gone, 2);
    tr_live_tb(&t, 0, 1, &b, 0);
    tr_flush(&t);
    const wire_revent *ev[8];
    ck_assert_uint_eq(tr_events(&t, ev, 8), 3); /* GPU, CPU (merged), rm */
    const wire_revent *gpu = ev[0], *cpu = ev[1];
    ck_assert_int_eq(gpu->tier, WIRE_TIER_DEVICE);
    ck_assert_int_eq(cpu->tier, WIRE_TIER_HOST_PINNED);
    ck_assert_uint_eq(cpu->n_blocks, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_uint_eq(cpu->blocks[i].block_hash, h[i]);
        /* the keys count: the tokens alone hash to something else */
        ck_assert_uint_ne(gpu->blocks[i].tokens_hash, tb_tokens_hash(h[i], 16));
        ck_assert_uint_eq(cpu->blocks[i].tokens_hash,
                          gpu->blocks[i].tokens_hash);
    }
    ck_assert_int_eq(ev[2]->type, WIRE_R_REMOVED);
    ck_assert_int_eq(ev[2]->tier, WIRE_TIER_DEVICE);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->tier_hash_reused, 2);
    ck_assert_uint_eq(s->tier_hash_computed, 0);
    ck_assert_uint_eq(s->state_blocks, 2); /* the CPU copies */
    tr_fini(&t);
}
END_TEST

/* Only the same rank's device tier lends its hash; a block it does not
 * hold is hashed from its tokens (counted), and a lower tier's store that
 * carries its own extra_keys is hashed from them. */
START_TEST(a_lower_tier_store_the_device_tier_does_not_hold_is_hashed) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t a = 811, c = 812;
    tb b;
    tb_begin(&b);
    tb_store_in(&b, "GPU", false, 0, &a, 1, "[[\"tenant-1\"]]");
    tb_store_in(&b, "CPU", false, 0, &c, 1, NULL); /* never on the GPU */
    tb_store_in(&b, "CPU", false, 0, &a, 1, "[[\"tenant-2\"]]");
    tr_live_tb(&t, 0, 0, &b, 0);
    tb_begin(&b);
    tb_store_in(&b, "CPU", false, 0, &a, 1, NULL); /* rank 1's GPU: empty */
    tr_live_tb(&t, 0, 1, &b, 1);
    tr_flush(&t);
    const wire_revent *ev[8];
    ck_assert_uint_eq(tr_events(&t, ev, 8), 4);
    uint64_t salted = ev[0]->blocks[0].tokens_hash;
    ck_assert_uint_ne(salted, tb_tokens_hash(a, 16));
    ck_assert_uint_eq(ev[1]->blocks[0].tokens_hash, tb_tokens_hash(c, 16));
    uint64_t own = ev[2]->blocks[0].tokens_hash;
    ck_assert_uint_ne(own, salted);
    ck_assert_uint_ne(own, tb_tokens_hash(a, 16));
    ck_assert_uint_eq(ev[3]->dp_rank, 1);
    ck_assert_uint_eq(ev[3]->blocks[0].tokens_hash, tb_tokens_hash(a, 16));
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->tier_hash_reused, 0);
    ck_assert_uint_eq(s->tier_hash_computed, 2);
    tr_fini(&t);
}
END_TEST

/* vLLM's reset_prefix_cache clears the GPU prefix cache; an offloading
 * engine keeps its CPU blocks and removes them later, one by one. */
START_TEST(an_engines_cleared_clears_only_the_device_tier) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t a = 821, c = 822;
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, &a, 1);
    tb_store_in(&b, "CPU", false, 0, &a, 1, NULL);
    tb_store(&b, false, 0, &c, 1);
    tr_live_tb(&t, 0, 0, &b, 0);
    tb_begin(&b);
    tb_cleared(&b);
    tr_live_tb(&t, 0, 1, &b, 0);
    tb_begin(&b);
    tb_remove_in(&b, "CPU", &a, 1); /* still held */
    tb_remove(&b, &c, 1);           /* gone with the cleared */
    tr_live_tb(&t, 0, 2, &b, 0);
    tr_flush(&t);
    const wire_revent *ev[16];
    size_t n = tr_events(&t, ev, 16);
    size_t cleared = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i]->type != WIRE_R_CLEARED) continue;
        cleared++;
        ck_assert_int_eq(ev[i]->tier, WIRE_TIER_DEVICE);
        ck_assert_uint_eq(ev[i]->dp_rank, 0);
    }
    ck_assert_uint_eq(cleared, 1);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->removes_unknown, 1); /* c only */
    ck_assert_uint_eq(s->dedup_suppressed, 0);
    ck_assert_uint_eq(s->cleared_emitted, 0);
    ck_assert_uint_eq(s->revents_cleared, 1);
    ck_assert_uint_eq(s->state_blocks, 0);
    tr_fini(&t);
}
END_TEST

/* A cleared the relay emits (here: a gap with no replay endpoint) says it
 * forgot the rank: one cleared per tier in one message, and every tier of
 * its state is gone. */
START_TEST(a_cleared_the_relay_emits_clears_every_tier_of_the_rank) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t a = 831;
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, &a, 1);
    tb_store_in(&b, "CPU", false, 0, &a, 1, NULL);
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_flush(&t);
    ck_assert_uint_eq(tr_stats(&t)->state_blocks, 2);
    tb_begin(&b);
    tb_remove_in(&b, "CPU", &a, 1);
    tb_remove(&b, &a, 1);
    tr_live_tb(&t, 0, 2, &b, 0); /* 1 lost */
    tr_flush(&t);
    ck_assert_uint_eq(t.n, 3);
    ck_assert_uint_eq(t.msgs[1].m.n_events, WIRE_TIER_COUNT);
    const wire_revent *ev[16];
    ck_assert_uint_eq(tr_events(&t, ev, 16), 2 + WIRE_TIER_COUNT + 2);
    expect_cleared_tiers(&ev[2], 0);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->cleared_emitted, 1);
    ck_assert_uint_eq(s->revents_cleared, WIRE_TIER_COUNT);
    ck_assert_uint_eq(s->removes_unknown, 2); /* both tiers forgotten */
    ck_assert_uint_eq(s->state_blocks, 0);
    tr_fini(&t);
}
END_TEST

/* ---- batching ----------------------------------------------------------------*/

START_TEST(messages_hold_at_most_128_events) {
    tr t;
    tr_init(&t, NULL, 1, false);
    tb b;
    tb_begin(&b);
    for (uint64_t i = 0; i < 200; i++) {
        uint64_t h = 5000 + i;
        tb_store(&b, false, 0, &h, 1); /* roots: no chain, no merge */
    }
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_flush(&t);
    ck_assert_uint_eq(t.n, 2);
    ck_assert_uint_eq(t.msgs[0].m.n_events, 128);
    ck_assert_uint_eq(t.msgs[1].m.n_events, 72);
    ck_assert(!t.msgs[0].has_range); /* batch 0 not complete yet */
    ck_assert(t.msgs[1].has_range);
    ck_assert_uint_eq(t.msgs[1].first, 0);
    ck_assert_uint_eq(t.msgs[1].last, 0);
    tr_fini(&t);
}
END_TEST

START_TEST(messages_hold_at_most_8192_blocks_and_chains_continue) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint32_t n = 10000;
    uint64_t *h = kvo_malloc(n * sizeof(*h));
    for (uint32_t i = 0; i < n; i++) h[i] = 900000 + i;
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, h, n);
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_flush(&t);
    ck_assert_uint_eq(t.n, 2);
    const wire_revent *a = &t.msgs[0].m.events[0], *c = &t.msgs[1].m.events[0];
    ck_assert_uint_eq(a->n_blocks, 8192);
    ck_assert(!a->has_parent);
    ck_assert_uint_eq(c->n_blocks, n - 8192);
    ck_assert(c->has_parent);
    ck_assert_uint_eq(c->parent_hash, h[8191]);
    ck_assert_uint_eq(c->blocks[0].block_hash, h[8192]);
    ck_assert_uint_eq(c->blocks[0].tokens_hash, tb_tokens_hash(h[8192], 16));
    /* removes are split the same way */
    tb_begin(&b);
    tb_remove(&b, h, n);
    tr_live_tb(&t, 0, 1, &b, 0);
    tr_flush(&t);
    ck_assert_uint_eq(t.n, 4);
    ck_assert_uint_eq(t.msgs[2].m.events[0].n_removed, 8192);
    ck_assert_uint_eq(t.msgs[3].m.events[0].n_removed, n - 8192);
    kvo_free(h);
    tr_fini(&t);
}
END_TEST

START_TEST(stores_merge_only_while_the_chain_continues) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t a[2] = {11, 12}, c[1] = {13}, d[1] = {21}, e[1] = {22};
    tb b;
    tb_begin(&b);
    tb_store(&b, false, 0, a, 2);
    tb_store(&b, true, 12, c, 1); /* continues 11,12 -> merged */
    tb_store(&b, false, 0, d, 1); /* new root -> new event */
    tb_store(&b, true, 12, e, 1); /* parent is not the last block -> new */
    tr_live_tb(&t, 0, 0, &b, 0);
    /* a second batch continuing the chain merges across batches */
    uint64_t f = 23;
    tb_begin(&b);
    tb_store(&b, true, 22, &f, 1);
    tr_live_tb(&t, 0, 1, &b, 0);
    tr_flush(&t);
    static const wire_revent *ev[16];
    size_t n = tr_events(&t, ev, 16);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ev[0]->n_blocks, 3);
    ck_assert_uint_eq(ev[0]->blocks[2].block_hash, 13);
    ck_assert_uint_eq(ev[1]->n_blocks, 1);
    ck_assert(!ev[1]->has_parent);
    ck_assert_uint_eq(ev[2]->n_blocks, 2);
    ck_assert_uint_eq(ev[2]->parent_hash, 12);
    ck_assert_uint_eq(ev[2]->blocks[1].block_hash, 23);
    ck_assert_uint_eq(t.n, 1);
    ck_assert_uint_eq(t.msgs[0].first, 0);
    ck_assert_uint_eq(t.msgs[0].last, 1);
    tr_fini(&t);
}
END_TEST

START_TEST(removes_merge_and_cleared_flushes) {
    tr t;
    tr_init(&t, NULL, 1, false);
    uint64_t r1 = 31, r2 = 32, r3 = 33, s1 = 40, s2 = 41;
    tb b;
    tb_begin(&b);
    tb_remove(&b, &r1, 1);
    tb_remove(&b, &r2, 1);
    tb_remove(&b, &r3, 1);
    tb_store(&b, false, 0, &s1, 1);
    tb_cleared(&b);
    tb_store(&b, false, 0, &s2, 1);
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_flush(&t);
    ck_assert_uint_eq(t.n, 2);
    ck_assert_uint_eq(t.msgs[0].m.n_events, 2); /* removed x3, stored */
    ck_assert(t.msgs[0].m.events[0].type == WIRE_R_REMOVED);
    ck_assert_uint_eq(t.msgs[0].m.events[0].n_removed, 3);
    ck_assert_uint_eq(t.msgs[0].m.events[0].removed[2], 33);
    ck_assert(t.msgs[0].m.events[1].type == WIRE_R_STORED);
    ck_assert_uint_eq(t.msgs[1].m.n_events, 2); /* cleared, stored */
    ck_assert(t.msgs[1].m.events[0].type == WIRE_R_CLEARED);
    ck_assert(t.msgs[1].m.events[1].type == WIRE_R_STORED);
    ck_assert(!t.msgs[0].has_range && t.msgs[1].has_range);
    ck_assert_uint_eq(t.msgs[1].m.events[1].event_id, 4);
    tr_fini(&t);
}
END_TEST

/* ---- bad input ---------------------------------------------------------------*/

START_TEST(malformed_batches_are_counted_and_the_stream_goes_on) {
    tr t;
    tr_init(&t, NULL, 1, true);
    static const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t junk[] = {0x93, 0xcb, 0x41};
    kvo_buf bad1 = {(uint8_t *)huge, sizeof(huge), sizeof(huge)};
    kvo_buf bad2 = {(uint8_t *)junk, sizeof(junk), sizeof(junk)};
    tr_live_tag(&t, 0, 0, 0);
    tr_live(&t, 0, 1, &bad1);
    tr_live_tag(&t, 0, 2, 2);
    tr_live(&t, 0, 3, &bad2);
    tr_live_tag(&t, 0, 4, 3);
    /* wrong framing, around a good payload: skipped without consuming a
     * sequence */
    uint8_t s[8];
    wire_seq_put(s, 5);
    const kvo_buf *good = &t.batch; /* tag 3 */
    wire_frame two[2] = {{s, 8}, {good->data, good->len}};
    relay_pipe_live(t.p, 0, two, 2, t.now);
    wire_frame shortseq[3] = {
        {(const uint8_t *)"", 0}, {s, 4}, {good->data, good->len}};
    relay_pipe_live(t.p, 0, shortseq, 3, t.now);
    tr_flush(&t);
    relay_stats *st = tr_stats(&t);
    ck_assert_uint_eq(relay_stats_decode_errors(st), 2);
    ck_assert_uint_eq(st->bad_msgs[RELAY_frames], 1);
    ck_assert_uint_eq(st->bad_msgs[RELAY_seq], 1);
    ck_assert_uint_eq(st->gaps, 0);
    ck_assert_uint_eq(t.nreq, 0);
    tr_expect_tags(&t, 0, 2, 3);
    uint64_t wm;
    ck_assert(tr_watermark(&t, &wm));
    ck_assert_uint_eq(wm, 4); /* undecodable batches still count */
    tr_fini(&t);
}
END_TEST

START_TEST(invalid_events_are_rejected_by_kind_never_forwarded) {
    tr t;
    tr_init(&t, NULL, 1, false);
    tb b;
    tb_begin(&b);
    /* token count != blocks x block size */
    tb_raw(&b, "{\"type\": \"BlockStored\", \"block_hashes\": [1, 2], "
               "\"parent_block_hash\": null, \"token_ids\": [1,2,3], "
               "\"block_size\": 16, \"medium\": \"GPU\"}");
    /* block size != --block-size */
    tb_raw(&b, "{\"type\": \"BlockStored\", \"block_hashes\": [3], "
               "\"parent_block_hash\": null, \"token_ids\": [1,2,3,4,5,6,7,8], "
               "\"block_size\": 8, \"medium\": \"GPU\"}");
    /* unknown medium */
    tb_raw(&b, "{\"type\": \"BlockRemoved\", \"block_hashes\": [4], "
               "\"medium\": \"TAPE\"}");
    /* offload store without tokens */
    tb_raw(&b, "{\"type\": \"BlockStored\", \"block_hashes\": [5], "
               "\"parent_block_hash\": null, \"token_ids\": [], "
               "\"block_size\": 16, \"medium\": \"CPU\"}");
    /* no hashes */
    tb_raw(&b, "{\"type\": \"BlockRemoved\", \"block_hashes\": [], "
               "\"medium\": \"GPU\"}");
    uint64_t good = 6;
    tb_store(&b, false, 0, &good, 1);
    tr_live_tb(&t, 0, 0, &b, 0);
    /* a rank that does not fit u32 */
    json_object *jo = json_tokener_parse(
        "{\"ts\": 1.0, \"events\": [{\"type\": \"AllBlocksCleared\"}], "
        "\"data_parallel_rank\": 1099511627776}");
    wire_batch wb;
    wire_batch_init(&wb);
    ck_assert_int_eq(wire_batch_from_json(jo, &wb, NULL), KVO_OK);
    kvo_buf p;
    kvo_buf_init(&p);
    ck_assert_int_eq(wire_batch_encode(&wb, WIRE_FMT_MAP, 0, &p), KVO_OK);
    wire_batch_fini(&wb);
    json_object_put(jo);
    tr_live(&t, 0, 1, &p);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->rejects[RELAY_token_count], 1);
    ck_assert_uint_eq(s->rejects[RELAY_block_size], 1);
    ck_assert_uint_eq(s->rejects[RELAY_medium], 1);
    ck_assert_uint_eq(s->rejects[RELAY_no_tokens], 1);
    ck_assert_uint_eq(s->rejects[RELAY_empty], 1);
    ck_assert_uint_eq(s->rejects[RELAY_dp_rank], 1);
    static const wire_revent *ev[8];
    ck_assert_uint_eq(tr_events(&t, ev, 8), 1);
    ck_assert_uint_eq(ev[0]->blocks[0].block_hash, 6);
    kvo_buf_fini(&p);
    tr_fini(&t);
}
END_TEST

/* Every distinct rank costs a table of dedup counts: a publisher cycling
 * through ranks gets its batches past the 1024th rank rejected, and the
 * ranks already known go on. */
/* DESIGN §5 hashes token ids as u32: an id that does not fit would be
 * hashed truncated (and collide with its low 32 bits), so the store is
 * refused and counted; the largest u32 id still converts. */
START_TEST(token_ids_beyond_u32_are_rejected_never_truncated) {
    tr t;
    relay_pipe_cfg c;
    tr_cfg_default(&c);
    c.block_size = 4;
    tr_init(&t, &c, 1, false);
    tb b;
    tb_begin(&b);
    /* 2^32 + 1 would hash as 1 */
    tb_raw(&b, "{\"type\": \"BlockStored\", \"block_hashes\": [98], "
               "\"parent_block_hash\": null, "
               "\"token_ids\": [4294967297,2,3,4], "
               "\"block_size\": 4, \"medium\": \"GPU\"}");
    tb_raw(&b, "{\"type\": \"BlockStored\", \"block_hashes\": [99], "
               "\"parent_block_hash\": null, "
               "\"token_ids\": [1,2,3,4294967295], "
               "\"block_size\": 4, \"medium\": \"GPU\"}");
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->rejects[RELAY_token_range], 1);
    ck_assert_uint_eq(relay_stats_rejects(s), 1);
    const wire_revent *ev[4];
    ck_assert_uint_eq(tr_events(&t, ev, 4), 1);
    ck_assert_uint_eq(ev[0]->n_blocks, 1);
    ck_assert_uint_eq(ev[0]->blocks[0].block_hash, 99);
    uint64_t want[4] = {1, 2, 3, 4294967295u};
    ck_assert_uint_eq(ev[0]->blocks[0].tokens_hash,
                      wire_router_hash(want, 4, WIRE_ROUTER_SEED));
    tr_fini(&t);
}
END_TEST

START_TEST(ranks_beyond_the_table_are_rejected_not_allocated) {
    tr t;
    tr_init(&t, NULL, 1, false);
    for (int r = 0; r <= 1024; r++) { /* batch r: rank r, tag r */
        tb_tagged(&t.batch, (uint64_t)r, r);
        tr_live(&t, 0, (uint64_t)r, &t.batch);
    }
    tr_live_tag(&t, 0, 1025, 2000); /* rank 0 */
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->rejects[RELAY_dp_rank], 1);
    static uint64_t h[2048];
    ck_assert_uint_eq(tr_stored(&t, h, 2048), 1025);
    ck_assert_uint_eq(h[1023], TB_TAG_BLOCK + 1023);
    ck_assert_uint_eq(h[1024], TB_TAG_BLOCK + 2000);
    uint64_t wm;
    ck_assert(tr_watermark(&t, &wm));
    ck_assert_uint_eq(wm, 1025);
    tr_fini(&t);
}
END_TEST

/* ---- engine-hash verification ------------------------------------------------*/

static uint64_t low64_hex(const char *hex) {
    size_t n;
    uint8_t *b = kt_unhex(hex, &n);
    uint64_t k = 0;
    for (size_t i = n - 8; i < n; i++) k = k << 8 | b[i];
    kvo_free(b);
    return k;
}

static uint64_t first64_hex(const char *hex) {
    size_t n;
    uint8_t *b = kt_unhex(hex, &n);
    uint64_t k = 0;
    for (size_t i = 0; i < 8; i++) k = k << 8 | b[i];
    kvo_free(b);
    return k;
}

typedef enum { H_LOW64, H_FIRST8, H_BYTES } hform;

/* One hash-vector case as two stores (block 0, then the rest chained), the
 * salt carried in vLLM's extra_keys list. */
static void vector_stream(json_object *cs, hform form, kvo_buf *out0,
                          kvo_buf *out1) {
    json_object *toks, *blocks, *bsz, *lora, *salt;
    json_object_object_get_ex(cs, "token_ids", &toks);
    json_object_object_get_ex(cs, "blocks", &blocks);
    json_object_object_get_ex(cs, "block_size", &bsz);
    json_object_object_get_ex(cs, "lora_name", &lora);
    json_object_object_get_ex(cs, "cache_salt", &salt);
    int bs = json_object_get_int(bsz);
    size_t nb = json_object_array_length(blocks);
    for (int part = 0; part < 2; part++) {
        size_t from = part ? 1 : 0, to = part ? nb : 1;
        kvo_buf j;
        kvo_buf_init(&j);
        kvo_buf_printf(&j, "{\"ts\": 1.0, \"events\": [{\"type\": "
                           "\"BlockStored\", \"block_hashes\": [");
        char hx[2][80];
        for (size_t i = from; i < to; i++) {
            json_object *d;
            json_object_object_get_ex(json_object_array_get_idx(blocks, i),
                                      "digest", &d);
            const char *dh = json_object_get_string(d);
            if (form == H_BYTES)
                kvo_buf_printf(&j, "%s{\"bin\": \"%s\"}", i > from ? "," : "",
                               dh);
            else
                kvo_buf_printf(&j, "%s%" PRIu64, i > from ? "," : "",
                               form == H_LOW64 ? low64_hex(dh)
                                               : first64_hex(dh));
            if (i == 0) snprintf(hx[0], sizeof(hx[0]), "%s", dh);
        }
        if (part == 0) {
            kvo_buf_printf(&j, "], \"parent_block_hash\": null");
        } else {
            if (form == H_BYTES)
                kvo_buf_printf(
                    &j, "], \"parent_block_hash\": {\"bin\": \"%s\"}", hx[0]);
            else
                kvo_buf_printf(&j, "], \"parent_block_hash\": %" PRIu64,
                               form == H_LOW64 ? low64_hex(hx[0])
                                               : first64_hex(hx[0]));
        }
        kvo_buf_printf(&j, ", \"token_ids\": [");
        for (size_t k = from * (size_t)bs; k < to * (size_t)bs; k++)
            kvo_buf_printf(
                &j, "%s%" PRIu64, k > from * (size_t)bs ? "," : "",
                json_object_get_uint64(json_object_array_get_idx(toks, k)));
        kvo_buf_printf(&j, "], \"block_size\": %d, \"medium\": \"GPU\"", bs);
        if (lora)
            kvo_buf_printf(&j, ", \"lora_name\": \"%s\"",
                           json_object_get_string(lora));
        kvo_buf_printf(&j, ", \"extra_keys\": [");
        for (size_t i = from; i < to; i++) {
            const char *sep = i > from ? "," : "";
            bool s = salt && i == 0;
            if (!lora && !s)
                kvo_buf_printf(&j, "%snull", sep);
            else if (lora && s)
                kvo_buf_printf(&j, "%s[\"%s\", \"%s\"]", sep,
                               json_object_get_string(lora),
                               json_object_get_string(salt));
            else
                kvo_buf_printf(&j, "%s[\"%s\"]", sep,
                               json_object_get_string(lora ? lora : salt));
        }
        kvo_buf_printf(&j, "]}], \"data_parallel_rank\": 0}");
        kvo_buf_cstr(&j);
        json_object *jo = json_tokener_parse((const char *)j.data);
        ck_assert_ptr_nonnull(jo);
        wire_batch b;
        wire_batch_init(&b);
        kvo_err err;
        char eb[200];
        ck_assert_msg(wire_batch_from_json(jo, &b, &err) == KVO_OK, "%s",
                      kvo_err_str(&err, eb, sizeof(eb)));
        kvo_buf *out = part ? out1 : out0;
        kvo_buf_reset(out);
        ck_assert_int_eq(wire_batch_encode(&b, WIRE_FMT_MAP, 0, out), KVO_OK);
        wire_batch_fini(&b);
        json_object_put(jo);
        kvo_buf_fini(&j);
    }
}

/* A store whose hash is not H(parent, tokens): a mismatch on the GPU; on
 * the CPU tier without extra_keys (vLLM's offloading tracker defers them,
 * so the keys a salted or multimodal block's hash took are unknown) it
 * cannot be verified, and is counted so, never as a mismatch. */
START_TEST(a_lower_tiers_store_without_extra_keys_is_not_verifiable) {
    relay_pipe_cfg cfg;
    tr_cfg_default(&cfg);
    cfg.verify = true;
    tr t;
    tr_init(&t, &cfg, 1, false);
    tb b;
    uint64_t h = 901; /* not what sha256 over its tokens gives */
    tb_begin(&b);
    tb_store(&b, false, 0, &h, 1);
    tr_live_tb(&t, 0, 0, &b, 0);
    char cpu[1024];
    int w = snprintf(cpu, sizeof(cpu),
                     "{\"type\": \"BlockStored\", \"block_hashes\": [902], "
                     "\"parent_block_hash\": null, \"token_ids\": [");
    for (uint32_t k = 0; k < 16; k++)
        w += snprintf(cpu + w, sizeof(cpu) - (size_t)w, "%s%" PRIu64,
                      k ? "," : "", tb_token(902, k));
    snprintf(cpu + w, sizeof(cpu) - (size_t)w,
             "], \"block_size\": 16, \"medium\": \"CPU\"}");
    tb_begin(&b);
    tb_raw(&b, cpu);
    tr_live_tb(&t, 0, 1, &b, 0);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->hash_verified, 1);
    ck_assert_uint_eq(s->hash_mismatches, 1);
    ck_assert_uint_eq(s->hash_unsupported, 1);
    ck_assert_uint_eq(tr_count(&t, WIRE_R_STORED), 2); /* both forwarded */
    tr_fini(&t);
}
END_TEST

START_TEST(engine_hash_verification_passes_good_streams_and_catches_first8) {
    json_object *root =
        kt_load_json("tests/data/vectors/hash/hash_vectors.json");
    json_object *cases;
    json_object_object_get_ex(root, "engine_hash_cases", &cases);
    size_t checked = 0;
    for (size_t c = 0; c < json_object_array_length(cases); c++) {
        json_object *cs = json_object_array_get_idx(cases, c), *v;
        json_object_object_get_ex(cs, "blocks", &v);
        size_t nb = json_object_array_length(v);
        if (nb < 2) continue;
        json_object_object_get_ex(cs, "algo", &v);
        relay_pipe_cfg cfg;
        tr_cfg_default(&cfg);
        cfg.verify = true;
        ck_assert_int_eq(
            wire_algo_parse(json_object_get_string(v), &cfg.verify_algo),
            KVO_OK);
        json_object_object_get_ex(cs, "seed", &v);
        cfg.hash_seed = json_object_get_string(v);
        json_object_object_get_ex(cs, "block_size", &v);
        cfg.block_size = (uint32_t)json_object_get_int(v);
        json_object_object_get_ex(cs, "name", &v);
        const char *name = json_object_get_string(v);
        for (int form = H_LOW64; form <= H_BYTES; form++) {
            kvo_buf a, b;
            kvo_buf_init(&a);
            kvo_buf_init(&b);
            vector_stream(cs, (hform)form, &a, &b);
            tr t;
            tr_init(&t, &cfg, 1, false);
            tr_live(&t, 0, 0, &a);
            tr_live(&t, 0, 1, &b);
            tr_flush(&t);
            relay_stats *s = tr_stats(&t);
            ck_assert_msg(s->hash_verified == nb,
                          "%s form %d: verified %" PRIu64, name, form,
                          s->hash_verified);
            ck_assert_uint_eq(s->hash_unknown_parent, 0);
            ck_assert_uint_eq(s->hash_unsupported, 0);
            if (form == H_FIRST8) {
                ck_assert_msg(s->hash_mismatches == nb, "%s: first-8 ints pass",
                              name);
                ck_assert(s->has_mismatch);
                ck_assert_uint_eq(s->first_mismatch.seq, 0);
                ck_assert_uint_eq(s->first_mismatch.event, 0);
                ck_assert_uint_eq(s->first_mismatch.block, 0);
            } else {
                ck_assert_msg(s->hash_mismatches == 0, "%s form %d: mismatch",
                              name, form);
            }
            tr_fini(&t);
            kvo_buf_fini(&a);
            kvo_buf_fini(&b);
        }
        checked++;
    }
    ck_assert_uint_ge(checked, 20);
    json_object_put(root);
}
END_TEST

START_TEST(unknown_parent_digest_is_counted_not_a_mismatch) {
    relay_pipe_cfg cfg;
    tr_cfg_default(&cfg);
    cfg.verify = true;
    cfg.verify_algo = WIRE_ALGO_SHA256;
    cfg.hash_seed = "0";
    tr t;
    tr_init(&t, &cfg, 1, false);
    uint64_t h = 4242;
    tb b;
    tb_begin(&b);
    tb_store(&b, true, 1234, &h, 1);
    tr_live_tb(&t, 0, 0, &b, 0);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    ck_assert_uint_eq(s->hash_unknown_parent, 1);
    ck_assert_uint_eq(s->hash_mismatches, 0);
    ck_assert_uint_eq(s->hash_verified, 0);
    tr_fini(&t);
}
END_TEST

/* ---- stats views ---------------------------------------------------------------*/

START_TEST(stats_render_as_json_and_prometheus) {
    tr t;
    tr_init(&t, NULL, 1, false);
    tr_live_tag(&t, 0, 0, 1);
    tr_live_tag(&t, 0, 2, 1);
    tr_flush(&t);
    relay_stats *s = tr_stats(&t);
    json_object *j = relay_stats_to_json(s), *v, *k;
    ck_assert(json_object_object_get_ex(j, "gaps", &v));
    ck_assert_uint_eq(json_object_get_uint64(v), 1);
    ck_assert(json_object_object_get_ex(j, "replay_failures", &v));
    ck_assert(json_object_object_get_ex(v, "no_endpoint", &k));
    ck_assert_uint_eq(json_object_get_uint64(k), 1);
    ck_assert(json_object_object_get_ex(j, "first_mismatch", &v));
    ck_assert_ptr_null(v);
    json_object_put(j);
    kvo_buf prom;
    kvo_buf_init(&prom);
    ck_assert_int_eq(relay_stats_to_prom(s, &prom), KVO_OK);
    kvo_buf_cstr(&prom);
    ck_assert_ptr_nonnull(
        strstr((char *)prom.data, "\nkvo_relay_gaps_total 1\n"));
    ck_assert_ptr_nonnull(
        strstr((char *)prom.data,
               "kvo_relay_replay_failures_total{kind=\"no_endpoint\"} 1\n"));
    ck_assert_ptr_nonnull(
        strstr((char *)prom.data, "kvo_relay_cleared_emitted_total 1\n"));
    kvo_buf_fini(&prom);
    tr_fini(&t);
}
END_TEST

/* The /metrics text is a contract (dashboards, kvo-check): its first
 * family, a labelled family and the last gauge, line for line, and one
 * HELP/TYPE pair per family. An append that fails fails the whole call. */
START_TEST(prometheus_text_keeps_its_lines) {
    relay_stats s;
    memset(&s, 0, sizeof(s));
    s.batches_live = 3;
    s.decode_errors[KVO_ENOMEM] = 2;
    s.rejects[RELAY_medium] = 5;
    s.nats_connected = true;
    s.ring_bytes = 77;
    kvo_buf prom;
    kvo_buf_init(&prom);
    ck_assert_int_eq(relay_stats_to_prom(&s, &prom), KVO_OK);
    ck_assert_int_eq(kvo_buf_cstr(&prom), KVO_OK);
    const char *text = (const char *)prom.data;
    static const char first[] =
        "# HELP kvo_relay_batches_live_total batches received on the SUB "
        "socket\n"
        "# TYPE kvo_relay_batches_live_total counter\n"
        "kvo_relay_batches_live_total 3\n"
        "# HELP kvo_relay_batches_replayed_total batches received as replay "
        "replies\n";
    ck_assert_int_eq(strncmp(text, first, strlen(first)), 0);
    ck_assert_ptr_nonnull(strstr(
        text, "\n# HELP kvo_relay_decode_errors_total undecodable batches by "
              "status\n"
              "# TYPE kvo_relay_decode_errors_total counter\n"
              "kvo_relay_decode_errors_total{kind=\"ENOMEM\"} 2\n"
              "kvo_relay_decode_errors_total{kind=\"EINVAL\"} 0\n"));
    ck_assert_ptr_nonnull(
        strstr(text, "\nkvo_relay_rejects_total{kind=\"block_size\"} 0\n"
                     "kvo_relay_rejects_total{kind=\"medium\"} 5\n"));
    ck_assert_ptr_nonnull(
        strstr(text, "\n# HELP kvo_relay_nats_connected 1 when NATS is up\n"
                     "# TYPE kvo_relay_nats_connected gauge\n"
                     "kvo_relay_nats_connected 1\n"));
    static const char last[] =
        "\n# HELP kvo_relay_ring_bytes envelope bytes kept for recovery "
        "requests\n"
        "# TYPE kvo_relay_ring_bytes gauge\n"
        "kvo_relay_ring_bytes 77\n";
    ck_assert_uint_gt(prom.len, strlen(last));
    ck_assert_str_eq(text + prom.len - strlen(last), last);
    size_t families = 0, helps = 0;
    for (const char *c = text; (c = strstr(c, "# TYPE ")); c++) families++;
    for (const char *c = text; (c = strstr(c, "# HELP ")); c++) helps++;
    size_t counters = 0, per_source = 0, gauges = 0;
#define COUNT(name, help) counters++;
    RELAY_COUNTERS(COUNT)
#undef COUNT
#define COUNT(name, help) gauges++;
    RELAY_GAUGES(COUNT)
#undef COUNT
#define COUNT(name, help) per_source++;
    RELAY_SOURCE_COUNTERS(COUNT)
#undef COUNT
    /* totals, per source, labelled by kind, gauges (4 written by hand) */
    ck_assert_uint_eq(families, counters + per_source + 5 + 4 + gauges);
    ck_assert_uint_eq(helps, families);
    kvo_buf_fini(&prom);
    kvo_buf_init(&prom);
    kvo_alloc_fail_after(3);
    kvo_status st = relay_stats_to_prom(&s, &prom);
    kvo_alloc_fail_after(-1);
    ck_assert_int_eq(st, KVO_ENOMEM);
    kvo_buf_fini(&prom);
}
END_TEST

/* RELAY_STATS_LINE_MAX holds the log line with every counter at its
 * largest: the last field is whole. */
START_TEST(the_stats_line_fits_its_buffer_at_the_largest_counts) {
    relay_stats s;
    memset(&s, 0xff, sizeof(s));
    s.n_src = 0;
    for (int i = 0; i < KVO_STATUS_COUNT; i++) s.decode_errors[i] = 0;
    for (int i = 0; i < RELAY_REJECT_COUNT; i++) s.rejects[i] = 0;
    for (int i = 0; i < RELAY_REPLAY_FAIL_COUNT; i++) s.replay_failures[i] = 0;
    for (int i = 0; i < RELAY_RECOVERY_COUNT; i++) s.recovery_requests[i] = 0;
    s.decode_errors[KVO_EPROTO] = UINT64_MAX;
    s.recovery_requests[RELAY_dump] = UINT64_MAX;
    s.rejects[RELAY_medium] = UINT64_MAX;
    s.replay_failures[RELAY_timeout] = UINT64_MAX;
    char line[RELAY_STATS_LINE_MAX];
    relay_stats_line(&s, line, sizeof(line));
    static const char tail[] = " state_blocks=18446744073709551615";
    size_t n = strlen(line);
    ck_assert_uint_gt(n, strlen(tail));
    ck_assert_str_eq(line + n - strlen(tail), tail);
}
END_TEST

Suite *suite_pipe(void) {
    Suite *s = suite_create("pipe");
    TCase *tc = tcase_create("convert");
    tcase_add_test(tc, every_wire_vector_converts_to_the_event_plane);
    tcase_add_test(tc, tokens_hash_is_the_dynamo_router_hash);
    suite_add_tcase(s, tc);
    tc = tcase_create("sequence");
    tcase_add_test(tc, gap_requests_replay_and_applies_in_order);
    tcase_add_test(tc, older_replay_layout_without_topic_is_understood);
    tcase_add_test(tc, replay_window_exceeded_publishes_cleared);
    tcase_add_test(tc, publisher_restart_clears_and_replays_from_zero);
    tcase_add_test(tc, replayed_duplicates_are_dropped_and_counted);
    tcase_add_test(tc, gap_without_replay_endpoint_clears_and_goes_on);
    tcase_add_test(tc, replay_timeout_clears_and_drains_the_buffer);
    tcase_add_test(tc, a_replay_request_that_cannot_be_sent_clears_and_goes_on);
    tcase_add_test(tc, replay_from_start_publishes_cleared_then_replays);
    tcase_add_test(tc, full_live_buffer_drops_then_replays_the_rest);
    tcase_add_test(
        tc, a_failure_with_nothing_forwarded_publishes_no_second_cleared);
    tcase_add_test(
        tc, a_live_batch_behind_a_replay_is_a_restart_unless_it_is_the_same);
    suite_add_tcase(s, tc);
    tc = tcase_create("link");
    tcase_add_test(tc,
                   a_sub_back_after_a_loss_replays_from_the_last_batch_applied);
    tcase_add_test(tc,
                   a_sub_back_during_a_replay_asks_again_and_keeps_the_buffer);
    tcase_add_test(
        tc,
        a_batch_that_breaks_the_replay_twice_is_oversize_cleared_and_passed);
    tcase_add_test(
        tc, a_replay_that_drops_after_progress_is_asked_again_not_oversize);
    tcase_add_test(
        tc, an_engine_that_restarted_while_idle_and_holds_nothing_is_cleared);
    tcase_add_test(tc,
                   an_engine_that_restarted_and_published_answers_other_bytes);
    tcase_add_test(tc, a_first_reply_past_the_last_batch_applied_is_no_restart);
    tcase_add_test(tc, a_probe_whose_replay_breaks_twice_is_a_restart);
    tcase_add_test(tc, a_new_run_seen_live_during_a_probe_is_one_restart);
    tcase_add_test(tc,
                   without_the_last_batch_applied_the_replay_starts_at_next);
    suite_add_tcase(s, tc);
    tc = tcase_create("dedup");
    tcase_add_test(tc, two_copies_need_two_removes_before_one_is_forwarded);
    tcase_add_test(tc, dedup_counts_are_per_rank_and_tier_and_reset_by_cleared);
    suite_add_tcase(s, tc);
    tc = tcase_create("tiers");
    tcase_add_test(tc,
                   an_offloaded_keyed_block_keeps_the_device_tiers_tokens_hash);
    tcase_add_test(tc,
                   a_lower_tier_store_the_device_tier_does_not_hold_is_hashed);
    tcase_add_test(tc, an_engines_cleared_clears_only_the_device_tier);
    tcase_add_test(tc, a_cleared_the_relay_emits_clears_every_tier_of_the_rank);
    suite_add_tcase(s, tc);
    tc = tcase_create("batching");
    tcase_add_test(tc, messages_hold_at_most_128_events);
    tcase_add_test(tc, messages_hold_at_most_8192_blocks_and_chains_continue);
    tcase_add_test(tc, stores_merge_only_while_the_chain_continues);
    tcase_add_test(tc, removes_merge_and_cleared_flushes);
    suite_add_tcase(s, tc);
    tc = tcase_create("bad_input");
    tcase_add_test(tc, malformed_batches_are_counted_and_the_stream_goes_on);
    tcase_add_test(tc, invalid_events_are_rejected_by_kind_never_forwarded);
    tcase_add_test(tc, ranks_beyond_the_table_are_rejected_not_allocated);
    tcase_add_test(tc, token_ids_beyond_u32_are_rejected_never_truncated);
    suite_add_tcase(s, tc);
    tc = tcase_create("verify");
    tcase_add_test(
        tc, engine_hash_verification_passes_good_streams_and_catches_first8);
    tcase_add_test(tc,
                   a_lower_tiers_store_without_extra_keys_is_not_verifiable);
    tcase_add_test(tc, unknown_parent_digest_is_counted_not_a_mismatch);
    suite_add_tcase(s, tc);
    tc = tcase_create("stats");
    tcase_add_test(tc, stats_render_as_json_and_prometheus);
    tcase_add_test(tc, prometheus_text_keeps_its_lines);
    tcase_add_test(tc, the_stats_line_fits_its_buffer_at_the_largest_counts);
    suite_add_tcase(s, tc);
    return s;
}
