/* check_route.c -- where a request goes: the routing policies and the
 * in-flight state the dynamo policy weighs. Pure: the driver gives the
 * index's scores and the prompt's block hashes, and says when a request
 * starts and ends; no sockets, no clocks.
 *
 *   round-robin  request i -> worker i mod N, rank (i div N) mod D
 *   kv           highest index score; ties: the slot used least, then the
 *                lowest
 *   dynamo       Dynamo's KV-router cost, per slot s:
 *
 *                  cost(s) = W * prefill(s) + decode(s)
 *                  prefill(s) = ceil(tokens / bs) - score(s)
 *                  decode(s)  = | active(s) ∪ blocks(prompt) |
 *
 *                active(s) is the set of blocks held by the requests in
 *                flight on s, each block named by its sequence hash (its
 *                router hash chained with its prefix's), counted once
 *                however many requests share it -- Dynamo's ActiveSequences.
 *                A request's full blocks enter active(s) when it is routed
 *                and leave when it is answered (reference counts).
 *                T = 0: the lowest cost; ties: the fewest requests in
 *                flight, then the lowest slot. T > 0: slot s with
 *                probability exp(-cost(s)/T) / sum, from a seeded
 *                splitmix64 (costs shifted by their minimum first).
 *
 * Where this differs from Dynamo's router (0.4 .. 0.8):
 *   - Dynamo's prefill term also counts the prompts of its in-flight
 *     requests that have not produced a first token yet; kvo-check sends
 *     non-streaming completions and sees no first token, so its prefill
 *     term is the incoming prompt's uncached blocks only.
 *   - Dynamo counts prefill in tokens / block size (a fraction); kvo-check
 *     in whole blocks, ceil(tokens / bs): the same offset on every slot,
 *     so the same order.
 *   - Dynamo's softmax normalizes the costs (min-max) before dividing by
 *     T; here T is in blocks.
 *   - Dynamo breaks ties at random; here ties are deterministic.
 *   - Output blocks are not tracked (Dynamo's --router-track-output-blocks
 *     is off by default too).
 */
#include "check_int.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

/* Dynamo's sequence hashes chain with this seed (LocalBlockHash's). */
#define SEQ_HASH_SEED 1337

void check_seq_hashes(const uint64_t *router_hashes, size_t n, uint64_t *out) {
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t pair[2] = {prev, router_hashes[i]};
        out[i] = i == 0
                     ? router_hashes[0]
                     : XXH3_64bits_withSeed(pair, sizeof(pair), SEQ_HASH_SEED);
        prev = out[i];
    }
}

kvo_status check_router_init(check_router *rt, check_policy policy,
                             uint32_t n_workers, uint32_t dp_size,
                             uint32_t block_size, double overlap_weight,
                             double temperature, uint64_t seed) {
    memset(rt, 0, sizeof(*rt));
    if (n_workers == 0 || dp_size == 0 || block_size == 0 ||
        (uint64_t)n_workers * dp_size > UINT32_MAX / 2 ||
        !(overlap_weight >= 0) || !isfinite(overlap_weight) ||
        !(temperature >= 0) || !isfinite(temperature))
        return KVO_EINVAL;
    rt->policy = policy;
    rt->n_workers = n_workers;
    rt->dp_size = dp_size;
    rt->n_slots = n_workers * dp_size;
    rt->block_size = block_size;
    rt->overlap_weight = overlap_weight;
    rt->temperature = temperature;
    rt->rng = seed;
    rt->used = kvo_calloc(rt->n_slots, sizeof(*rt->used));
    rt->inflight = kvo_calloc(rt->n_slots, sizeof(*rt->inflight));
    rt->active = kvo_calloc(rt->n_slots, sizeof(*rt->active));
    rt->cost = kvo_calloc(rt->n_slots, sizeof(*rt->cost));
    if (!rt->used || !rt->inflight || !rt->active || !rt->cost) {
        check_router_fini(rt);
        return KVO_ENOMEM;
    }
    for (uint32_t s = 0; s < rt->n_slots; s++) kvo_map_init(&rt->active[s]);
    return KVO_OK;
}

void check_router_fini(check_router *rt) {
    for (uint32_t s = 0; rt->active && s < rt->n_slots; s++)
        kvo_map_fini(&rt->active[s]);
    kvo_free(rt->used);
    kvo_free(rt->inflight);
    kvo_free(rt->active);
    kvo_free(rt->cost);
    memset(rt, 0, sizeof(*rt));
}

/* |active(s) ∪ seq|: the blocks slot s would hold with this prompt. */
static uint64_t decode_blocks(check_router *rt, uint32_t s, const uint64_t *seq,
                              size_t nb) {
    kvo_map *m = &rt->active[s];
    uint64_t n = m->len;
    for (size_t i = 0; i < nb; i++)
        if (!kvo_map_get(m, seq[i])) n++;
    return n;
}

/* Is a better than b at equal cost (fewer in flight, then lower)? */
static bool tie_better(const check_router *rt, uint32_t a, uint32_t b) {
    if (rt->inflight[a] != rt->inflight[b])
        return rt->inflight[a] < rt->inflight[b];
    return a < b;
}

/* A uniform double in [0, 1) from the router's generator. */
static double uniform(check_router *rt) {
    return (double)(kvo_splitmix64(&rt->rng) >> 11) * 0x1.0p-53;
}

static uint32_t pick_dynamo(check_router *rt, const uint32_t *scores,
                            uint32_t prompt_tokens, const uint64_t *seq,
                            size_t nb) {
    uint32_t blocks = (prompt_tokens + rt->block_size - 1) / rt->block_size;
    uint32_t best = 0;
    for (uint32_t s = 0; s < rt->n_slots; s++) {
        uint32_t hit = scores[s] < blocks ? scores[s] : blocks;
        rt->cost[s] = rt->overlap_weight * (double)(blocks - hit) +
                      (double)decode_blocks(rt, s, seq, nb);
        if (s && (rt->cost[s] < rt->cost[best] ||
                  (rt->cost[s] == rt->cost[best] && tie_better(rt, s, best))))
            best = s;
    }
    if (rt->temperature <= 0) return best;
    /* softmax over -cost/T, shifted by the lowest cost (weights <= 1) */
    double sum = 0;
    for (uint32_t s = 0; s < rt->n_slots; s++)
        sum += exp(-(rt->cost[s] - rt->cost[best]) / rt->temperature);
    double x = uniform(rt) * sum;
    for (uint32_t s = 0; s < rt->n_slots; s++) {
        double w = exp(-(rt->cost[s] - rt->cost[best]) / rt->temperature);
        if (x < w) return s;
        x -= w;
    }
    return best; /* rounding left x just above the total */
}

uint32_t check_router_pick(check_router *rt, uint64_t i, const uint32_t *scores,
                           uint32_t prompt_tokens, const uint64_t *seq,
                           size_t nb) {
    uint32_t nw = rt->n_workers, dp = rt->dp_size;
    switch (rt->policy) {
    case CHECK_POLICY_ROUND_ROBIN:
        return (uint32_t)(i % nw) * dp + (uint32_t)((i / nw) % dp);
    case CHECK_POLICY_DYNAMO:
        return pick_dynamo(rt, scores, prompt_tokens, seq, nb);
    case CHECK_POLICY_KV:
    default: break;
    }
    uint32_t best = 0;
    for (uint32_t s = 1; s < rt->n_slots; s++) {
        if (scores[s] != scores[best]) {
            if (scores[s] > scores[best]) best = s;
        } else if (rt->used[s] < rt->used[best]) {
            best = s;
        }
    }
    return best;
}

kvo_status check_router_start(check_router *rt, uint32_t slot,
                              const uint64_t *seq, size_t nb) {
    if (slot >= rt->n_slots) return KVO_EINVAL;
    kvo_map *m = &rt->active[slot];
    for (size_t i = 0; i < nb; i++) {
        uint64_t *v = kvo_map_put(m, seq[i], NULL);
        if (!v) { /* undo what this call added */
            for (size_t k = 0; k < i; k++) kvo_map_dec(m, seq[k]);
            return KVO_ENOMEM;
        }
        (*v)++;
    }
    rt->used[slot]++;
    rt->inflight[slot]++;
    return KVO_OK;
}

void check_router_finish(check_router *rt, uint32_t slot, const uint64_t *seq,
                         size_t nb) {
    if (slot >= rt->n_slots) return;
    for (size_t i = 0; i < nb; i++) kvo_map_dec(&rt->active[slot], seq[i]);
    if (rt->inflight[slot]) rt->inflight[slot]--;
}

uint64_t check_router_active_blocks(const check_router *rt, uint32_t slot) {
    return slot < rt->n_slots ? rt->active[slot].len : 0;
}
