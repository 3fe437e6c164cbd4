/* mock_mutate.c -- what a rank publishes for a step's clean event batch:
 * the hash form, the encoding, and the mutation catalog.
 *
 * The engine's batch is ground truth and is never modified: rendering works
 * on a copy, so a mutation corrupts only the published bytes, never the
 * engine's state, /kvo/probe or the responses' cached_tokens.
 *
 * Mutation catalog (DESIGN §9; `kvo-mocker --mutate NAME[,NAME]`):
 *
 *   KILLED -- a correct oracle must fail the run:
 *   flip-stored-hash    every BlockStored block hash has its lowest bit
 *                       flipped (int: hash ^ 1; bytes: last byte ^ 1);
 *                       parents and removals keep the true hashes.
 *   drop-removed        no BlockRemoved is published.
 *   token-plus-one      every token id of every BlockStored is + 1.
 *   wrong-parent        BlockStored events that continue a chain publish a
 *                       nil parent_block_hash.
 *   drop-dp-rank        data_parallel_rank is nil in every batch.
 *   drop-store          every 50th BlockStored event of the rank (50th,
 *                       100th, ...) is not published.
 *   block-size-off      BlockStored declares block_size + 1.
 *   truncate-tokens     BlockStored token_ids lose their last token.
 *   swap-removed-hash   BlockRemoved names the evicted block's parent
 *                       instead of the block (a first block, which has no
 *                       parent, keeps its own hash).
 *   skip-decode-stores  BlockStored events made while the request decodes
 *                       (blocks filled by generated tokens) are dropped.
 *   int-hash-first8     every hash (stored, parent, removed) is published
 *                       as the int of the digest's FIRST 8 bytes instead of
 *                       the last 8 -- self-consistent, so only engine-hash
 *                       verification catches it (wins over bytes forms).
 *   dup-store           every BlockStored event is published twice in a row
 *                       (a second store for one physical copy: a relay's
 *                       reference count then never reaches zero).
 *
 *   BENIGN -- a correct oracle must pass the run:
 *   reorder-keys        map events with their keys in reverse order.
 *   legacy-array        events in the older array encoding (array-late,
 *                       the last array layout: every field kept).
 *   bytes-hash          hashes as raw digests (bin), like --hash-bytes.
 *   split-batches       one event per batch (each its own sequence number).
 *   merge-removes       consecutive BlockRemoved events of a batch become one
 *                       BlockRemoved carrying all their hashes in order.
 */
#include "mock_int.h"

#include <stdio.h>
#include <string.h>

/* drop-store drops the DROP_STORE_EVERY-th BlockStored, then the next ... */
#define DROP_STORE_EVERY 50
/* First capacity of the mutated event copy. */
#define MUT_EV_FIRST_CAP 64

static const mock_mutation_info catalog[MOCK_MUT_COUNT] = {
    {"flip-stored-hash", MOCK_MUT_FLIP_STORED_HASH, true,
     "XOR 1 into every BlockStored block hash"},
    {"drop-removed", MOCK_MUT_DROP_REMOVED, true,
     "publish no BlockRemoved"},
    {"token-plus-one", MOCK_MUT_TOKEN_PLUS_ONE, true,
     "every BlockStored token id + 1"},
    {"wrong-parent", MOCK_MUT_WRONG_PARENT, true,
     "nil parent_block_hash on chained BlockStored"},
    {"drop-dp-rank", MOCK_MUT_DROP_DP_RANK, true,
     "nil data_parallel_rank in every batch"},
    {"drop-store", MOCK_MUT_DROP_STORE, true,
     "drop every 50th BlockStored event"},
    {"block-size-off", MOCK_MUT_BLOCK_SIZE_OFF, true,
     "BlockStored declares block_size + 1"},
    {"truncate-tokens", MOCK_MUT_TRUNCATE_TOKENS, true,
     "BlockStored token_ids lose their last token"},
    {"swap-removed-hash", MOCK_MUT_SWAP_REMOVED_HASH, true,
     "BlockRemoved names the evicted block's parent"},
    {"skip-decode-stores", MOCK_MUT_SKIP_DECODE_STORES, true,
     "drop BlockStored of blocks filled while decoding"},
    {"int-hash-first8", MOCK_MUT_INT_HASH_FIRST8, true,
     "int hashes from the first 8 digest bytes, not the last 8"},
    {"dup-store", MOCK_MUT_DUP_STORE, true,
     "publish every BlockStored twice"},
    {"reorder-keys", MOCK_MUT_REORDER_KEYS, false,
     "map event keys in reverse order"},
    {"legacy-array", MOCK_MUT_LEGACY_ARRAY, false,
     "events in the array-late encoding"},
    {"bytes-hash", MOCK_MUT_BYTES_HASH, false,
     "hashes as raw digests (bin)"},
    {"split-batches", MOCK_MUT_SPLIT_BATCHES, false,
     "one event per batch"},
    {"merge-removes", MOCK_MUT_MERGE_REMOVES, false,
     "consecutive BlockRemoved merged into one"},
};

const mock_mutation_info *mock_mutations(void) { return catalog; }

kvo_status mock_mutate_parse(const char *list, unsigned *mask, char *bad,
                             size_t badsz) {
    if (!list || !mask) return KVO_EINVAL;
    unsigned m = 0;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > 0) {
            bool found = false;
            for (unsigned i = 0; i < MOCK_MUT_COUNT; i++) {
                if (strlen(catalog[i].name) == n &&
                    memcmp(catalog[i].name, p, n) == 0) {
                    m |= catalog[i].bit;
                    found = true;
                }
            }
            if (!found) {
                if (bad && badsz) snprintf(bad, badsz, "%.*s", (int)n, p);
                return KVO_EINVAL;
            }
        }
        p += n;
        if (*p == ',') p++;
    }
    *mask = m;
    return KVO_OK;
}

/* ---- rendering ------------------------------------------------------------*/

struct mock_render {
    unsigned mut;
    bool bytes;          /* raw digests (--hash-bytes or bytes-hash) */
    wire_format fmt;
    unsigned flags;
    uint64_t stores_seen; /* drop-store counter */
    wire_event *ev;       /* the mutated copy */
    size_t cap_ev;
    kvo_arena arena;
    kvo_buf *out;
    uint32_t cap_out;
};

kvo_status mock_render_new(mock_render **out, const mock_cfg *cfg) {
    if (!out || !cfg || (unsigned)cfg->event_format >= WIRE_FMT_COUNT)
        return KVO_EINVAL;
    mock_render *r = kvo_calloc(1, sizeof(*r));
    if (!r) return KVO_ENOMEM;
    r->mut = cfg->mutations;
    r->bytes = cfg->hash_bytes || (r->mut & MOCK_MUT_BYTES_HASH);
    r->fmt = (r->mut & MOCK_MUT_LEGACY_ARRAY) ? WIRE_FMT_ARRAY_LATE
                                              : cfg->event_format;
    r->flags = (r->mut & MOCK_MUT_REORDER_KEYS) ? WIRE_ENC_REVERSE_KEYS : 0;
    kvo_arena_init(&r->arena);
    *out = r;
    return KVO_OK;
}

void mock_render_free(mock_render *r) {
    if (!r) return;
    kvo_free(r->ev);
    kvo_arena_fini(&r->arena);
    for (uint32_t i = 0; i < r->cap_out; i++) kvo_buf_fini(&r->out[i]);
    kvo_free(r->out);
    kvo_free(r);
}

static uint64_t first8(const wire_digest *d) {
    uint64_t v = 0;
    for (unsigned i = 0; i < 8 && i < d->len; i++) v = (v << 8) | d->b[i];
    return v;
}

/* The published form of one hash; flip = XOR 1 into its lowest bit. */
static kvo_status render_hash(mock_render *r, const mock_hash *h, bool flip,
                              wire_hash *out) {
    memset(out, 0, sizeof(*out));
    if (r->mut & MOCK_MUT_INT_HASH_FIRST8) {
        out->kind = WIRE_HASH_UINT;
        out->key = first8(&h->d) ^ (flip ? 1u : 0u);
        return KVO_OK;
    }
    if (r->bytes && h->d.len) {
        uint8_t *b = kvo_arena_memdup(&r->arena, h->d.b, h->d.len);
        if (!b) return KVO_ENOMEM;
        if (flip) b[h->d.len - 1] ^= 1;
        out->kind = WIRE_HASH_BYTES;
        out->len = h->d.len;
        out->bytes = b;
        out->key = h->key ^ (flip ? 1u : 0u);
        return KVO_OK;
    }
    out->kind = WIRE_HASH_UINT;
    out->key = h->key ^ (flip ? 1u : 0u);
    return KVO_OK;
}

static wire_event *push_ev(mock_render *r, uint32_t *n) {
    if (kvo_grow(&r->ev, &r->cap_ev, *n + 1, sizeof(*r->ev), MUT_EV_FIRST_CAP) !=
        KVO_OK)
        return NULL;
    return &r->ev[(*n)++];
}

static kvo_status render_stored(mock_render *r, const wire_event *src,
                                const mock_step_aux *aux, uint32_t i,
                                wire_event *dst) {
    kvo_status st;
    *dst = *src;
    wire_hash *hs = kvo_arena_alloc(&r->arena, src->n_hashes * sizeof(wire_hash));
    if (!hs) return KVO_ENOMEM;
    bool flip = r->mut & MOCK_MUT_FLIP_STORED_HASH;
    for (uint32_t k = 0; k < src->n_hashes; k++) {
        if (aux && aux->stored && aux->stored[i]) {
            if ((st = render_hash(r, &aux->stored[i][k], flip, &hs[k])) != KVO_OK)
                return st;
        } else {
            hs[k] = src->hashes[k];
            if (flip) hs[k].key ^= 1;
        }
    }
    dst->hashes = hs;
    if (src->parent.kind != WIRE_HASH_NONE) {
        if (r->mut & MOCK_MUT_WRONG_PARENT) {
            memset(&dst->parent, 0, sizeof(dst->parent));
        } else if (aux && aux->parent && aux->parent[i].d.len) {
            if ((st = render_hash(r, &aux->parent[i], false, &dst->parent)) != KVO_OK)
                return st;
        }
    }
    if (r->mut & (MOCK_MUT_TOKEN_PLUS_ONE | MOCK_MUT_TRUNCATE_TOKENS)) {
        uint32_t n = src->n_tokens;
        if ((r->mut & MOCK_MUT_TRUNCATE_TOKENS) && n > 0) n--;
        uint64_t *t = kvo_arena_alloc(&r->arena, (size_t)n * sizeof(uint64_t));
        if (!t) return KVO_ENOMEM;
        for (uint32_t k = 0; k < n; k++)
            t[k] = src->token_ids[k] + ((r->mut & MOCK_MUT_TOKEN_PLUS_ONE) ? 1 : 0);
        dst->token_ids = t;
        dst->n_tokens = n;
    }
    if ((r->mut & MOCK_MUT_BLOCK_SIZE_OFF) && src->block_size.set)
        dst->block_size.v = src->block_size.v + 1;
    return KVO_OK;
}

static kvo_status render_removed(mock_render *r, const wire_event *src,
                                 const mock_step_aux *aux, uint32_t i,
                                 wire_event *dst) {
    kvo_status st;
    *dst = *src;
    wire_hash *hs = kvo_arena_alloc(&r->arena, src->n_hashes * sizeof(wire_hash));
    if (!hs) return KVO_ENOMEM;
    for (uint32_t k = 0; k < src->n_hashes; k++) {
        const mock_hash *h = NULL;
        if (aux && aux->removed && aux->removed[i]) h = &aux->removed[i][k];
        if (h && (r->mut & MOCK_MUT_SWAP_REMOVED_HASH) && aux->removed_parent &&
            aux->removed_parent[i].d.len)
            h = &aux->removed_parent[i];
        if (h) {
            if ((st = render_hash(r, h, false, &hs[k])) != KVO_OK) return st;
        } else {
            hs[k] = src->hashes[k];
        }
    }
    dst->hashes = hs;
    return KVO_OK;
}

/* Consecutive BlockRemoved events -> one event with all their hashes. */
static kvo_status merge_removes(mock_render *r, uint32_t *n) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < *n;) {
        wire_event *e = &r->ev[i];
        uint32_t j = i + 1;
        uint32_t total = e->n_hashes;
        while (e->type == WIRE_EV_REMOVED && j < *n &&
               r->ev[j].type == WIRE_EV_REMOVED) {
            total += r->ev[j].n_hashes;
            j++;
        }
        if (j > i + 1) {
            wire_hash *hs = kvo_arena_alloc(&r->arena, total * sizeof(wire_hash));
            if (!hs) return KVO_ENOMEM;
            uint32_t m = 0;
            for (uint32_t x = i; x < j; x++)
                for (uint32_t y = 0; y < r->ev[x].n_hashes; y++)
                    hs[m++] = r->ev[x].hashes[y];
            e->hashes = hs;
            e->n_hashes = total;
        }
        r->ev[k++] = *e;
        i = j;
    }
    *n = k;
    return KVO_OK;
}

static kvo_status out_reserve(mock_render *r, uint32_t n) {
    if (n <= r->cap_out) return KVO_OK;
    kvo_buf *o = kvo_realloc(r->out, n * sizeof(*o));
    if (!o) return KVO_ENOMEM;
    for (uint32_t i = r->cap_out; i < n; i++) kvo_buf_init(&o[i]);
    r->out = o;
    r->cap_out = n;
    return KVO_OK;
}

kvo_status mock_render_batch(mock_render *r, const wire_batch *clean,
                             const mock_step_aux *aux, const kvo_buf **out,
                             uint32_t *n_out) {
    if (!r || !clean || !out || !n_out) return KVO_EINVAL;
    *n_out = 0;
    kvo_arena_reset(&r->arena);
    kvo_status st;
    if (r->mut == 0 && !r->bytes && clean->n_events) {
        /* The engine's batch is already what vLLM publishes: encode it as
         * is (no per-event copy: a Mooncake replay has ~9M events). */
        if ((st = out_reserve(r, 1)) != KVO_OK) return st;
        kvo_buf_reset(&r->out[0]);
        if ((st = wire_batch_encode(clean, r->fmt, r->flags, &r->out[0])) != KVO_OK)
            return st;
        *out = r->out;
        *n_out = 1;
        return KVO_OK;
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < clean->n_events; i++) {
        const wire_event *src = &clean->events[i];
        if (src->type == WIRE_EV_STORED) {
            r->stores_seen++;
            if ((r->mut & MOCK_MUT_DROP_STORE) && r->stores_seen % DROP_STORE_EVERY == 0)
                continue;
            if ((r->mut & MOCK_MUT_SKIP_DECODE_STORES) && aux &&
                aux->decode_store && aux->decode_store[i])
                continue;
            wire_event *dst = push_ev(r, &n);
            if (!dst) return KVO_ENOMEM;
            if ((st = render_stored(r, src, aux, i, dst)) != KVO_OK) return st;
            if (r->mut & MOCK_MUT_DUP_STORE) {
                wire_event *dup = push_ev(r, &n);
                if (!dup) return KVO_ENOMEM;
                *dup = r->ev[n - 2];
            }
        } else if (src->type == WIRE_EV_REMOVED) {
            if (r->mut & MOCK_MUT_DROP_REMOVED) continue;
            wire_event *dst = push_ev(r, &n);
            if (!dst) return KVO_ENOMEM;
            if ((st = render_removed(r, src, aux, i, dst)) != KVO_OK) return st;
        } else {
            wire_event *dst = push_ev(r, &n);
            if (!dst) return KVO_ENOMEM;
            *dst = *src;
        }
    }
    if ((r->mut & MOCK_MUT_MERGE_REMOVES) && (st = merge_removes(r, &n)) != KVO_OK)
        return st;
    if (n == 0) return KVO_OK;
    bool split = r->mut & MOCK_MUT_SPLIT_BATCHES;
    uint32_t n_batches = split ? n : 1;
    if ((st = out_reserve(r, n_batches)) != KVO_OK) return st;
    wire_batch b = *clean;
    memset(&b.arena, 0, sizeof(b.arena));
    if (r->mut & MOCK_MUT_DROP_DP_RANK) b.dp_rank.set = false;
    for (uint32_t k = 0; k < n_batches; k++) {
        b.events = split ? &r->ev[k] : r->ev;
        b.n_events = split ? 1 : n;
        kvo_buf_reset(&r->out[k]);
        if ((st = wire_batch_encode(&b, r->fmt, r->flags, &r->out[k])) != KVO_OK)
            return st;
    }
    *out = r->out;
    *n_out = n_batches;
    return KVO_OK;
}
