/* check_ckpt.c -- a full-state checkpoint (DESIGN §9), in lockstep and
 * under load, once the traffic stopped and every request was answered (the
 * engines are idle: nothing they hold can change until the next request):
 *
 *   1 sync      every kvo-mocker's /kvo/state (last seqs; each rank's
 *               cached-set size and digest), then the exact watermark wait
 *               (or the quiet period)
 *   2 counters  the relays', the indexer's and the engines' counters:
 *               whatever must stay 0 trips here, before the next request
 *   3 sets      per (worker, rank): the engine's size and digest against
 *               the index's (GET /blocks?digest_only=1: two small answers);
 *               only where they differ, both lists, compared block by
 *               block (check_sets.c); the first differences are named with
 *               a prompt of the run whose path holds them. A rank with a
 *               CPU tier (/kvo/state's cpu_cached_*) the same way again:
 *               its CPU set (/kvo/blocks?tier=cpu) against the index's
 *               host_pinned set (/blocks?tier=host_pinned)
 *   4 sweep     the distinct prompts since the previous checkpoint (the
 *               final one: the run's last --sweep) on every slot
 *   5 record    check_result_checkpoint; a failure ends the run with
 *               --fail-fast
 *
 * A checkpoint on a correct pipeline never differs, whatever the timing:
 * the engines are idle and the index has applied everything they published
 * (step 1) before anything is compared.
 */
#include "check_int.h"
#include "mock.h"

#include <inttypes.h>
#include <string.h>

typedef chk_run run;

/* Prompts searched, latest first, for one holding a differing block: a
 * bound on the engine hashing a failed checkpoint costs (~750 blocks per
 * Mooncake prompt). */
#define NAME_PROMPTS_MAX 1000
/* Rows of the engine hasher's trace memo (2^n). */
#define NAME_MEMO_LOG2 12

/* The first differences' prompts, in each of the nd diffs: the latest
 * prompt of requests [0, sent) whose path holds each hash, and the block's
 * place in it. Best effort: a block filled by generated tokens, or a hash
 * the engine never made, stays unnamed. */
static void name_prompts(run *r, size_t sent, check_set_diff *const *ds,
                         size_t nd) {
    size_t open = 0;
    for (size_t j = 0; j < nd; j++)
        for (size_t i = 0; i < ds[j]->n_first; i++)
            open += ds[j]->first[i].prompt < 0;
    if (!open || !sent) return;
    if (!r->hasher) {
        wire_algo algo;
        if (wire_algo_parse(r->cfg->hash_algo, &algo) != KVO_OK ||
            mock_hasher_new(&r->hasher, algo, r->cfg->hash_seed,
                            NAME_MEMO_LOG2) != KVO_OK)
            return;
    }
    uint32_t bs = r->env.block_size;
    kvo_buf tokens;
    kvo_buf_init(&tokens);
    mock_hash *h = NULL;
    size_t cap = 0;
    for (size_t i = sent, seen = 0; i-- > 0 && open && seen < NAME_PROMPTS_MAX;
         seen++) {
        const check_request *q = &r->trace.reqs[i];
        uint32_t nb = q->input_length / bs;
        if (nb == 0) continue;
        if (nb > cap) {
            mock_hash *g = kvo_realloc(h, nb * sizeof(*h));
            if (!g) break;
            h = g;
            cap = nb;
        }
        mock_trace_ref tr = {q->hash_ids, q->n_hash_ids};
        if (check_request_tokens(q, &tokens) != KVO_OK ||
            mock_hasher_blocks(r->hasher, (const uint64_t *)tokens.data, bs, 0,
                               nb, NULL, NULL, NULL, &tr, h) != KVO_OK)
            break;
        for (size_t j = 0; j < nd; j++)
            for (size_t k = 0; k < ds[j]->n_first; k++) {
                check_block_diff *x = &ds[j]->first[k];
                if (x->prompt >= 0) continue;
                uint64_t want = x->kind == CHECK_DIFF_INDEX_ONLY
                                    ? x->index.hash
                                    : x->engine.hash;
                for (uint32_t b = 0; b < nb; b++)
                    if (h[b].key == want) {
                        x->prompt = (int64_t)q->line;
                        x->depth = (int32_t)b;
                        open--;
                        break;
                    }
            }
    }
    kvo_free(h);
    kvo_buf_fini(&tokens);
}

/* A side's list whose own digest is not the one it announced: the side is
 * inconsistent, and nothing compared against it would mean anything. */
static kvo_status check_listed(run *r, const char *side, uint32_t w,
                               uint32_t rank, chk_blocks *b) {
    b->n = check_blocks_normalize(b->v, b->n);
    uint64_t d = check_blocks_digest(b->v, b->n);
    if (d == b->digest && b->n == b->count) return KVO_OK;
    return kvo_err_set(&r->err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                       "%s of worker %u rank %u: the %zu distinct blocks it "
                       "lists have digest %" PRIu64 ", it announced %" PRIu64
                       " for %" PRIu64,
                       side, w, rank, b->n, d, b->digest, b->count);
}

/* The CPU tier's blocks the index's tree cut from a parent the engine holds
 * in neither tier (check_blocks_uncut): the engine's GPU list is read only
 * when the index lists a CPU block without the parent the engine gives. */
static kvo_status uncut(run *r, chk_engine *e, const chk_rank *rk,
                        const chk_blocks *eb, chk_blocks *ib, uint64_t *cut) {
    if (check_blocks_cut(eb->v, eb->n, ib->v, ib->n) == 0) return KVO_OK;
    chk_blocks gpu;
    chk_blocks_init(&gpu);
    kvo_status st =
        chk_engine_blocks(e, rk->dp_rank, WIRE_TIER_DEVICE, &gpu, &r->err);
    if (st == KVO_OK)
        st = check_listed(r, "kvo-mocker /kvo/blocks", e->worker_id,
                          rk->dp_rank, &gpu);
    if (st == KVO_OK)
        *cut = check_blocks_uncut(eb->v, eb->n, gpu.v, gpu.n, ib->v, ib->n);
    chk_blocks_fini(&gpu);
    return st;
}

/* One tier of one (worker, rank): the engine's set size and digest
 * (count, digest, from /kvo/state) against the index's; only where they
 * differ, both lists (eb, ib: scratch), compared into d. x gets the sizes,
 * digests and the differences of each kind, listed the block entries
 * fetched. An indexer without the route or the tier: KVO_ENOTFOUND or
 * KVO_EUNSUPPORTED, x untouched (r->err says it). */
static kvo_status compare_tier(run *r, chk_engine *e, const chk_rank *rk,
                               wire_tier tier, uint64_t count, uint64_t digest,
                               chk_blocks *eb, chk_blocks *ib,
                               check_set_diff *d, check_slot_sets *x,
                               uint64_t *listed) {
    bool cpu = tier != WIRE_TIER_DEVICE;
    kvo_status st = chk_index_blocks(&r->env, e->worker_id, rk->dp_rank, tier,
                                     false, ib, &r->err);
    if (st != KVO_OK) return st;
    x->compared = true;
    x->engine_blocks = count;
    x->engine_digest = digest;
    x->index_blocks = ib->count;
    x->index_digest = ib->digest;
    if (count == ib->count && digest == ib->digest) return KVO_OK;
    /* they differ: both lists, block by block */
    x->listed = true;
    if ((st = chk_engine_blocks(e, rk->dp_rank, tier, eb, &r->err)) != KVO_OK ||
        (st = chk_index_blocks(&r->env, e->worker_id, rk->dp_rank, tier, true,
                               ib, &r->err)) != KVO_OK ||
        (st = check_listed(r,
                           cpu ? "kvo-mocker /kvo/blocks?tier=cpu"
                               : "kvo-mocker /kvo/blocks",
                           e->worker_id, rk->dp_rank, eb)) != KVO_OK ||
        (st = check_listed(r,
                           cpu ? "kvo-indexer /blocks?tier=host_pinned"
                               : "kvo-indexer /blocks",
                           e->worker_id, rk->dp_rank, ib)) != KVO_OK)
        return st;
    *listed += eb->n + ib->n;
    if (cpu && (st = uncut(r, e, rk, eb, ib, &x->cut)) != KVO_OK) return st;
    x->engine_blocks = eb->count;
    x->engine_digest = eb->digest;
    x->index_blocks = ib->count;
    x->index_digest = ib->digest;
    uint64_t before[CHECK_DIFF_COUNT];
    memcpy(before, d->n, sizeof(before));
    check_blocks_compare(eb->v, eb->n, ib->v, ib->n, rk->slot, d);
    for (int k = 0; k < CHECK_DIFF_COUNT; k++) x->n[k] = d->n[k] - before[k];
    return KVO_OK;
}

kvo_status chk_compare_sets(run *r, size_t sent, check_checkpoint *c,
                            check_slot_sets *ss) {
    chk_blocks eb, ib;
    chk_blocks_init(&eb);
    chk_blocks_init(&ib);
    kvo_status st = KVO_OK;
    c->sets = true;
    c->diff.collect = true;
    c->cpu.diff.collect = true;
    for (uint32_t w = 0; w < r->env.n_workers; w++)
        for (uint32_t k = 0; k < r->env.engines[w].n_ranks; k++)
            c->cpu.ranks += r->env.engines[w].ranks[k].has_cpu_set;
    /* the indexer takes the tier; Dynamo's API judges the GPU tier only
     * (its tiers are per instance, not per rank) */
    bool cpu_on = r->cfg->indexer_api != CHECK_API_DYNAMO;
    if (!cpu_on && c->cpu.ranks)
        snprintf(c->cpu.note, sizeof(c->cpu.note),
                 "--indexer-api dynamo judges the GPU tier only");
    for (uint32_t w = 0; w < r->env.n_workers && st == KVO_OK && c->sets; w++) {
        chk_engine *e = &r->env.engines[w];
        for (uint32_t k = 0; k < e->n_ranks && st == KVO_OK; k++) {
            chk_rank *rk = &e->ranks[k];
            if (!e->mocker || !rk->has_set) {
                c->sets = false;
                snprintf(c->sets_note, sizeof(c->sets_note),
                         "%s does not tell its cached block set (kvo-mocker "
                         "with /kvo/blocks does)",
                         e->name);
                break;
            }
            st = compare_tier(r, e, rk, WIRE_TIER_DEVICE, rk->set_count,
                              rk->set_digest, &eb, &ib, &c->diff, &ss[rk->slot],
                              &c->listed_blocks);
            if (st == KVO_ENOTFOUND) {
                st = KVO_OK;
                c->sets = false;
                snprintf(c->sets_note, sizeof(c->sets_note),
                         "the indexer has no GET /blocks");
                break;
            }
            if (st != KVO_OK || !rk->has_cpu_set || !cpu_on) continue;
            check_slot_sets x;
            memset(&x, 0, sizeof(x));
            st = compare_tier(r, e, rk, WIRE_TIER_HOST_PINNED,
                              rk->cpu_set_count, rk->cpu_set_digest, &eb, &ib,
                              &c->cpu.diff, &x, &c->listed_blocks);
            if (st == KVO_EUNSUPPORTED || st == KVO_ENOTFOUND) {
                /* an indexer of the device tier only: said, never passed
                 * over in silence (its queries fail the CPU tier's
                 * prompts anyway) */
                kvo_info("CPU block sets not compared: %s", r->err.msg);
                snprintf(c->cpu.note, sizeof(c->cpu.note),
                         "the indexer refuses GET /blocks?tier=host_pinned "
                         "(HTTP %s): an indexer of the device tier only",
                         st == KVO_ENOTFOUND ? "404" : "400");
                cpu_on = false;
                st = KVO_OK;
                continue;
            }
            if (st != KVO_OK) break;
            c->cpu.compared++;
            c->cpu.listed += x.listed;
            c->cpu.engine_blocks += x.engine_blocks;
            c->cpu.index_blocks += x.index_blocks;
            c->cpu.cut += x.cut;
        }
    }
    if (c->cpu.compared < c->cpu.ranks && !c->cpu.note[0])
        snprintf(c->cpu.note, sizeof(c->cpu.note), "%s", c->sets_note);
    chk_blocks_fini(&eb);
    chk_blocks_fini(&ib);
    check_set_diff_misplaced(&c->diff);
    check_set_diff_misplaced(&c->cpu.diff);
    check_set_diff *ds[] = {&c->diff, &c->cpu.diff};
    if (st == KVO_OK) name_prompts(r, sent, ds, 2);
    return st;
}

/* Step 2: every counter now, the engines' too; trips before `before`. */
static kvo_status read_all_counters(run *r, int64_t before) {
    kvo_status st = chk_run_counters(r, before, true);
    for (uint32_t i = 0; st == KVO_OK && i < r->env.n_engines; i++)
        if (r->env.engines[i].mocker)
            st = chk_engine_counters(&r->env.engines[i], &r->cur, &r->err);
    if (st == KVO_OK) st = check_result_trips(r->res, &r->cur, before);
    if (st == KVO_OK) st = check_counters_copy(&r->prev, &r->cur);
    return st;
}

kvo_status chk_checkpoint(run *r, size_t sent, bool final, double drain_s,
                          bool *stop) {
    check_result *res = r->res;
    uint64_t t0 = kvo_now_ns();
    double stages[CHECK_STAGE_COUNT];
    memcpy(stages, res->stage_s, sizeof(stages));
    check_checkpoint c;
    memset(&c, 0, sizeof(c));
    c.number = (uint32_t)res->n_ckpts + 1;
    c.after = sent;
    c.final = final;
    c.before_prompt =
        !final && sent < r->trace.n ? (int64_t)r->trace.reqs[sent].line : -1;
    c.drain_s = drain_s;
    c.sweep_first = -1;
    *stop = false;
    check_slot_sets *ss = kvo_calloc(r->n_slots ? r->n_slots : 1, sizeof(*ss));
    if (!ss) return KVO_ENOMEM;

    /* 1 every kvo-mocker's state, then the index catches up with it */
    for (uint32_t i = 0; i < r->env.n_workers; i++)
        if (r->env.engines[i].mocker) r->env.engines[i].dirty = true;
    kvo_status st = chk_run_sync(r, c.before_prompt);
    c.sync_s = chk_secs(t0);
    if (st == KVO_ETIMEDOUT) { /* a run error is recorded */
        *stop = true;
        st = KVO_OK;
        goto done;
    }
    if (st != KVO_OK) goto done;
    /* 2 counters, 3 block sets */
    uint64_t t1 = kvo_now_ns();
    if ((st = read_all_counters(r, c.before_prompt)) != KVO_OK) goto done;
    if ((st = chk_compare_sets(r, sent, &c, ss)) != KVO_OK) goto done;
    c.sets_s = chk_secs(t1);
    /* 4 the sweep (it charges its own stage) */
    size_t from = final ? 0 : r->swept_to;
    st = chk_run_sweep(
        r, from, sent,
        (size_t)(final ? r->cfg->sweep : r->cfg->checkpoint_sweep), &c);
    r->swept_to = sent;
    if (st != KVO_OK) goto done;
    /* 5 */
    if ((st = check_result_checkpoint(res, &c, ss)) != KVO_OK) goto done;
    if (check_checkpoint_failed(&c)) {
        char cause[400];
        check_checkpoint_cause(res, &c, cause, sizeof(cause));
        kvo_info("%s", cause); /* the verdict says it again */
        if (r->cfg->fail_fast) *stop = true;
    } else {
        kvo_debug("checkpoint %u after %zu requests: block sets %s, CPU "
                  "sets of %u of %u ranks, %llu prompts re-checked, %.3f s",
                  c.number, sent, c.sets ? "equal" : c.sets_note,
                  c.cpu.compared, c.cpu.ranks,
                  (unsigned long long)c.sweep_prompts,
                  c.drain_s + c.sync_s + c.sets_s + c.sweep_s);
    }
    if (r->cfg->fail_fast && res->n_trips) *stop = true;
done:
    /* what the sync and counters charged belongs to the checkpoint */
    {
        double sweep =
            res->stage_s[CHECK_STAGE_SWEEP] - stages[CHECK_STAGE_SWEEP];
        memcpy(res->stage_s, stages, sizeof(stages));
        res->stage_s[CHECK_STAGE_SWEEP] += sweep;
        res->stage_s[CHECK_STAGE_CHECKPOINT] += chk_secs(t0) - sweep + drain_s;
    }
    kvo_free(ss);
    return st;
}
