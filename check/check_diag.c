/* check_diag.c -- why a prompt diverged, from evidence (issue 13).
 *
 * The judge (check_core.c) finds the first divergent (worker, rank) and
 * block k of a prompt and the direction: the engine holds more than the
 * index scores (index behind) or less (index ahead). Before the request
 * runs, while the state the probe saw is still there, kvo-check reads the
 * engine's block k (hash H, parent P, copies, tokens_hash T: the probe's
 * detail form) and what the index holds of H (POST /lookup). Then:
 *
 *   index behind (the engine holds H):
 *     the index holds H under another parent       wrong parent
 *     the index holds H with another tokens_hash   token mismatch
 *     another rank of the worker holds H, though
 *     its engine does not                          wrong rank
 *     another worker holds H, though its engine
 *     does not                                     wrong worker
 *     no (worker, rank) holds H, or only those
 *     whose engines hold it too                    missed store
 *     held, same parent, same tokens_hash          unexplained
 *   index ahead (the engine holds no copy of H):
 *     the index holds H                            stale block
 *     it does not (the index matched these tokens
 *     under another block hash)                    unexplained
 *
 * Every class comes with its evidence; nothing is guessed. Pure: the
 * calls are check_run.c's. */
#include "check_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* "parent P" or "no parent (under the root)". */
static const char *parent_text(char *buf, size_t n, bool has, uint64_t p) {
    if (has)
        snprintf(buf, n, "parent %" PRIu64, p);
    else
        snprintf(buf, n, "no parent (under the root)");
    return buf;
}

/* The holders l lists, "worker 2 rank 0 (its engine too), worker 3 rank
 * 1 and 2 more". */
static const char *holders_text(char *buf, size_t n, const check_lookup *l) {
    size_t o = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < l->n_holders && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%sworker %u rank %u%s",
                              i ? ", " : "", l->holders[i].worker,
                              l->holders[i].dp_rank,
                              l->holder_cached[i] ? " (its engine too)" : "");
    if (l->others > l->n_holders && o < n)
        snprintf(buf + o, n - o, " and %" PRIu64 " more",
                 l->others - l->n_holders);
    return buf;
}

/* The first of the n blocks held in the index only by holders whose
 * engines lack it (a store credited to the wrong slot), or n. */
static uint32_t misplaced(const check_lookup *l, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t h = 0; !l[i].held && h < l[i].n_holders; h++)
            if (!l[i].holder_cached[h]) return i;
    return n;
}

void check_diagnose(const check_chain_block *b, const check_lookup *l,
                    uint32_t n, uint32_t k, bool index_behind, uint32_t worker,
                    uint32_t rank, check_diag *out) {
    out->n_rows = n < CHECK_DIAG_BLOCKS ? n : CHECK_DIAG_BLOCKS;
    for (uint32_t i = 0; i < out->n_rows; i++)
        out->rows[i] = (check_evidence_row){k + i, b[i], l[i]};
    char ep[64], ip[64], who[200];
    parent_text(ep, sizeof(ep), b->has_parent, b->parent);
    parent_text(ip, sizeof(ip), l->has_parent, l->parent);
    char *ev = out->evidence;
    size_t sz = sizeof(out->evidence);
    if (!index_behind) {
        if (l->held) {
            out->reason = CHECK_REASON_STALE_BLOCK;
            snprintf(ev, sz,
                     "block %u (hash %" PRIu64 "): the engine holds no copy; "
                     "the index still holds it on worker %u rank %u (%s)",
                     k, b->hash, worker, rank, ip);
        } else {
            out->reason = CHECK_REASON_UNEXPLAINED;
            snprintf(ev, sz,
                     "block %u (hash %" PRIu64 ", tokens_hash %" PRIu64 "): "
                     "the engine holds no copy and the index does not hold "
                     "this hash on worker %u rank %u, yet scored it",
                     k, b->hash, b->tokens_hash, worker, rank);
        }
        return;
    }
    if (l->held) {
        if (l->has_parent != b->has_parent ||
            (l->has_parent && l->parent != b->parent)) {
            out->reason = CHECK_REASON_WRONG_PARENT;
            snprintf(ev, sz,
                     "block %u (hash %" PRIu64 "): the engine chains it "
                     "under %s, the index holds it under %s",
                     k, b->hash, ep, ip);
        } else if (l->tokens_hash != b->tokens_hash) {
            out->reason = CHECK_REASON_TOKEN_MISMATCH;
            snprintf(ev, sz,
                     "block %u (hash %" PRIu64 "): the index holds it with "
                     "tokens_hash %" PRIu64
                     ", the engine's tokens give %" PRIu64,
                     k, b->hash, l->tokens_hash, b->tokens_hash);
        } else {
            out->reason = CHECK_REASON_UNEXPLAINED;
            snprintf(ev, sz,
                     "block %u (hash %" PRIu64 ", %s, tokens_hash %" PRIu64
                     "): "
                     "the index holds it as the engine does on worker %u "
                     "rank %u, yet scored less",
                     k, b->hash, ep, b->tokens_hash, worker, rank);
        }
        return;
    }
    /* Not held here. A holder whose engine lacks the block got it by
     * mistake: a store credited to the wrong slot. */
    uint32_t i = misplaced(l, n);
    if (i < n) {
        bool same_worker = false;
        for (uint32_t h = 0; h < l[i].n_holders; h++)
            same_worker |=
                !l[i].holder_cached[h] && l[i].holders[h].worker == worker;
        out->reason =
            same_worker ? CHECK_REASON_WRONG_RANK : CHECK_REASON_WRONG_WORKER;
        snprintf(ev, sz,
                 "block %u (hash %" PRIu64 "): cached on worker %u rank %u, "
                 "which the index does not credit with it; the index holds "
                 "it on %s",
                 k + i, b[i].hash, worker, rank,
                 holders_text(who, sizeof(who), &l[i]));
        return;
    }
    /* The index holds the tokens of block k under another hash: where the
     * engine chains it (it published another hash than it holds), or under
     * the root (the store lost its parent). */
    if (l->found == CHECK_FOUND_UNDER_PARENT) {
        out->reason = CHECK_REASON_HASH_MISMATCH;
        snprintf(ev, sz,
                 "block %u: the engine holds it as hash %" PRIu64 " (%s), "
                 "the index holds the same tokens (tokens_hash %" PRIu64
                 ") there as hash %" PRIu64
                 ": the engine published another hash than it holds",
                 k, b->hash, ep, b->tokens_hash, l->found_hash);
        return;
    }
    if (l->found == CHECK_FOUND_UNDER_ROOT) {
        out->reason = CHECK_REASON_WRONG_PARENT;
        snprintf(ev, sz,
                 "block %u (hash %" PRIu64 "): the engine chains it under "
                 "%s, the index holds its tokens (tokens_hash %" PRIu64
                 ") under the root, as hash %" PRIu64,
                 k, b->hash, ep, b->tokens_hash, l->found_hash);
        return;
    }
    out->reason = CHECK_REASON_MISSED_STORE;
    if (l->others)
        snprintf(ev, sz,
                 "block %u (hash %" PRIu64 ", %s): cached on worker %u rank "
                 "%u (%u copies), not in the index there; it holds it only "
                 "on %s",
                 k, b->hash, ep, worker, rank, b->copies,
                 holders_text(who, sizeof(who), l));
    else
        snprintf(ev, sz,
                 "block %u (hash %" PRIu64 ", %s, tokens_hash %" PRIu64 "): "
                 "cached on the engine (%u copies); no (worker, rank) of the "
                 "index holds it",
                 k, b->hash, ep, b->tokens_hash, b->copies);
}

bool check_diagnose_ranks(const uint64_t *engine, const uint64_t *index,
                          uint32_t dp, uint32_t worker, uint32_t rank,
                          check_diag *out) {
    if (rank >= dp || index[rank] >= engine[rank]) return false;
    for (uint32_t r = 0; r < dp; r++) {
        if (r == rank || index[r] <= engine[r]) continue;
        out->reason = CHECK_REASON_WRONG_RANK;
        snprintf(out->evidence, sizeof(out->evidence),
                 "worker %u rank %u: its engine caches %" PRIu64 " blocks, "
                 "the index credits it with %" PRIu64 "; rank %u: its engine "
                 "caches %" PRIu64 ", the index credits it with %" PRIu64,
                 worker, rank, engine[rank], index[rank], r, engine[r],
                 index[r]);
        return true;
    }
    return false;
}

/* A copy of s in a; NULL when out of memory. */
static const char *arena_str(kvo_arena *a, const char *s) {
    size_t n = strlen(s) + 1;
    char *c = kvo_arena_alloc(a, n);
    if (c) memcpy(c, s, n);
    return c;
}

/* The reasons the judge gives from the direction alone (the others come
 * from the engine contradicting itself or from a rule counter). */
static bool from_direction(check_reason r) {
    return r == CHECK_REASON_MISSED_STORE || r == CHECK_REASON_STALE_BLOCK ||
           r == CHECK_REASON_WRONG_RANK;
}

kvo_status check_prompt_explain(check_prompt *p, const check_diag *d,
                                bool keep_rows, kvo_arena *a) {
    if (!p->diverged) return KVO_EINVAL;
    if (!(p->evidence = arena_str(a, d->evidence))) return KVO_ENOMEM;
    if (keep_rows && d->n_rows) {
        if (!(p->rows =
                  kvo_arena_memdup(a, d->rows, d->n_rows * sizeof(*d->rows))))
            return KVO_ENOMEM;
        p->n_rows = d->n_rows;
    }
    bool lacks = d->reason == CHECK_REASON_MISSED_STORE ||
                 d->reason == CHECK_REASON_UNEXPLAINED;
    if (p->reason == CHECK_REASON_ENGINE) return KVO_OK;
    if (lacks && !from_direction(p->reason)) return KVO_OK;
    p->reason = d->reason;
    return KVO_OK;
}

kvo_status check_prompt_unexplained(check_prompt *p, const char *why,
                                    kvo_arena *a) {
    if (!p->diverged) return KVO_EINVAL;
    char ev[320];
    snprintf(ev, sizeof(ev),
             "no evidence (%s): the reason is a guess from "
             "the direction",
             why);
    return (p->evidence = arena_str(a, ev)) ? KVO_OK : KVO_ENOMEM;
}
