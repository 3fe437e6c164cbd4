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
 *   merge-removes       consecutive BlockRemoved events of a batch (of one
 *                       medium and group) become one BlockRemoved carrying
 *                       all their hashes in order.
 *
 * The field's incidents (issue 15), each with what a correct router would
 * hold, hence the expected outcome, and the traffic that shows it:
 *
 *   salt-ignored        KILLED (salt). sglang#24568. Block 0's extra_keys
 *                       lose the cache_salt -- the only place vLLM publishes
 *                       it -- so a router hashes every tenant's prefix with
 *                       the unsalted seed: the salted queries find nothing
 *                       where the engine hits (and the tenants' blocks merge).
 *   lora-in-mm-slot     KILLED (lora). llm-d-router#2927. A LoRA BlockStored
 *                       names no adapter (lora_id, lora_name nil) and lists
 *                       the adapter's name where multimodal keys go, as an
 *                       [name, 0] item: a correct router indexes base-model
 *                       blocks with an image, so the adapter's requests never
 *                       match.
 *   lora-same-hash      KILLED (lora). dynamo#6517. The adapter vanishes from
 *                       LoRA BlockStored (fields and extra_keys): the router
 *                       holds adapter blocks under the base model's hashes,
 *                       base and LoRA collide, LoRA queries miss.
 *   group-collision     KILLED (kv-groups). Infera#98. Every event says
 *                       group 0 (the full-attention group, its spec): the
 *                       sliding-window group's stores and its removals of
 *                       blocks that left the window land on the group a router
 *                       indexes, which then loses prefixes the engine holds.
 *   cpu-tier-dropped    KILLED (cpu-offload). sglang#39108, vllm#43468. CPU
 *                       BlockStored as the offloading connector once wrote it:
 *                       block_size 0, no token_ids, no parent, no adapter. A
 *                       correct relay cannot hash such a block and refuses it:
 *                       the CPU tier never reaches the index while the engine
 *                       loads prefixes from it.
 *   reset-not-published KILLED (reset). aibrix#2287. The AllBlocksCleared of
 *                       a reset on an idle engine is held back until a later
 *                       step has other events (vLLM once flushed its event
 *                       queue only from inside a step): meanwhile the router
 *                       holds every block the engine dropped.
 *   replay-drops-topic  BENIGN (replay). vllm#45174. Replay replies
 *                       ["", seq, payload] and an end marker ["", FF x 8,
 *                       ""]: the pre-0.26 form DESIGN §4 makes relays accept;
 *                       a relay replays one source, so the topic adds nothing
 *                       and the same batches are recovered.
 *   replay-drops-tail   KILLED (replay). sglang#38945. Every replay loses its
 *                       last two batches and the end marker (a ROUTER at its
 *                       high-water mark): the relay never sees the replay end,
 *                       the gap stays open -- an unrecovered gap, never a
 *                       silent hole.
 *   resurrect-removed   KILLED (any run that evicts). Every GPU BlockRemoved is
 *                       followed by a BlockStored of the same block (hash,
 *                       parent, tokens, adapter) that nothing computed: the
 *                       router holds a block the engine evicted (stale block).
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
     "XOR 1 into every BlockStored block hash", NULL, NULL},
    {"drop-removed", MOCK_MUT_DROP_REMOVED, true, "publish no BlockRemoved",
     NULL, NULL},
    {"token-plus-one", MOCK_MUT_TOKEN_PLUS_ONE, true,
     "every BlockStored token id + 1", NULL, NULL},
    {"wrong-parent", MOCK_MUT_WRONG_PARENT, true,
     "nil parent_block_hash on chained BlockStored", NULL, NULL},
    {"drop-dp-rank", MOCK_MUT_DROP_DP_RANK, true,
     "nil data_parallel_rank in every batch", NULL, NULL},
    {"drop-store", MOCK_MUT_DROP_STORE, true,
     "drop every 50th BlockStored event", NULL, NULL},
    {"block-size-off", MOCK_MUT_BLOCK_SIZE_OFF, true,
     "BlockStored declares block_size + 1", NULL, NULL},
    {"truncate-tokens", MOCK_MUT_TRUNCATE_TOKENS, true,
     "BlockStored token_ids lose their last token", NULL, NULL},
    {"swap-removed-hash", MOCK_MUT_SWAP_REMOVED_HASH, true,
     "BlockRemoved names the evicted block's parent", NULL, NULL},
    {"skip-decode-stores", MOCK_MUT_SKIP_DECODE_STORES, true,
     "drop BlockStored of blocks filled while decoding", NULL, NULL},
    {"int-hash-first8", MOCK_MUT_INT_HASH_FIRST8, true,
     "int hashes from the first 8 digest bytes, not the last 8", NULL, NULL},
    {"dup-store", MOCK_MUT_DUP_STORE, true, "publish every BlockStored twice",
     NULL, NULL},
    {"reorder-keys", MOCK_MUT_REORDER_KEYS, false,
     "map event keys in reverse order", NULL, NULL},
    {"legacy-array", MOCK_MUT_LEGACY_ARRAY, false,
     "events in the array-late encoding", NULL, NULL},
    {"bytes-hash", MOCK_MUT_BYTES_HASH, false, "hashes as raw digests (bin)",
     NULL, NULL},
    {"split-batches", MOCK_MUT_SPLIT_BATCHES, false, "one event per batch",
     NULL, NULL},
    {"merge-removes", MOCK_MUT_MERGE_REMOVES, false,
     "consecutive BlockRemoved merged into one", NULL, NULL},
    /* the field's incidents (issue 15): where each is seen, and why */
    {"salt-ignored", MOCK_MUT_SALT_IGNORED, true,
     "cache_salt dropped from block 0's extra_keys: tenants' salted "
     "prefixes get one router hash",
     "sglang#24568", "salt"},
    {"lora-in-mm-slot", MOCK_MUT_LORA_IN_MM_SLOT, true,
     "adapter name published as a multimodal key, lora_id/lora_name nil: "
     "LoRA requests never match",
     "llm-d-router#2927", "lora"},
    {"lora-same-hash", MOCK_MUT_LORA_SAME_HASH, true,
     "adapter dropped from LoRA BlockStored (fields and extra_keys): base "
     "and LoRA blocks collide",
     "dynamo#6517", "lora"},
    {"group-collision", MOCK_MUT_GROUP_COLLISION, true,
     "every KV-cache group published as group 0 (full attention): the "
     "groups collide in the router",
     "Infera#98", "kv-groups"},
    {"cpu-tier-dropped", MOCK_MUT_CPU_TIER_DROPPED, true,
     "CPU BlockStored with block_size 0, no tokens, no parent (the old "
     "offloading placeholder)",
     "sglang#39108, vllm#43468", "cpu-offload"},
    {"reset-not-published", MOCK_MUT_RESET_NOT_PUBLISHED, true,
     "an idle engine's AllBlocksCleared held back until the next step with "
     "other events",
     "aibrix#2287", "reset"},
    {"replay-drops-topic", MOCK_MUT_REPLAY_DROPS_TOPIC, false,
     "replay replies without the topic frame ([\"\", seq, payload], the "
     "pre-0.26 form)",
     "vllm#45174", "replay"},
    {"replay-drops-tail", MOCK_MUT_REPLAY_DROPS_TAIL, true,
     "every replay loses its last two batches and the end marker",
     "sglang#38945", "replay"},
    {"resurrect-removed", MOCK_MUT_RESURRECT_REMOVED, true,
     "a BlockStored re-announces every removed GPU block, nothing "
     "computed",
     NULL, NULL},
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
    uint32_t block_size;
    bool pending_clear; /* reset-not-published: an AllBlocksCleared held */
    kvo_buf ek;         /* extra_keys scratch */
    wire_mm_key *mmk;
    size_t cap_mmk;
    bool bytes; /* raw digests (--hash-bytes or bytes-hash) */
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
    r->block_size = cfg->block_size;
    r->bytes = cfg->hash_bytes || (r->mut & MOCK_MUT_BYTES_HASH);
    r->fmt = (r->mut & MOCK_MUT_LEGACY_ARRAY) ? WIRE_FMT_ARRAY_LATE
                                              : cfg->event_format;
    r->flags = (r->mut & MOCK_MUT_REORDER_KEYS) ? WIRE_ENC_REVERSE_KEYS : 0;
    kvo_arena_init(&r->arena);
    kvo_buf_init(&r->ek);
    *out = r;
    return KVO_OK;
}

void mock_render_free(mock_render *r) {
    if (!r) return;
    kvo_free(r->ev);
    kvo_free(r->mmk);
    kvo_buf_fini(&r->ek);
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

static bool is_cpu(const wire_event *e) {
    return e->medium.p && e->medium.len == 3 &&
           memcmp(e->medium.p, "CPU", 3) == 0;
}

static wire_event *push_ev(mock_render *r, uint32_t *n) {
    if (kvo_grow(&r->ev, &r->cap_ev, *n + 1, sizeof(*r->ev),
                 MUT_EV_FIRST_CAP) != KVO_OK)
        return NULL;
    return &r->ev[(*n)++];
}

static kvo_status render_stored(mock_render *r, const wire_event *src,
                                const mock_step_aux *aux, uint32_t i,
                                wire_event *dst) {
    kvo_status st;
    *dst = *src;
    wire_hash *hs =
        kvo_arena_alloc(&r->arena, src->n_hashes * sizeof(wire_hash));
    if (!hs) return KVO_ENOMEM;
    bool flip = r->mut & MOCK_MUT_FLIP_STORED_HASH;
    for (uint32_t k = 0; k < src->n_hashes; k++) {
        if (aux && aux->stored && aux->stored[i]) {
            if ((st = render_hash(r, &aux->stored[i][k], flip, &hs[k])) !=
                KVO_OK)
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
            if ((st = render_hash(r, &aux->parent[i], false, &dst->parent)) !=
                KVO_OK)
                return st;
        }
    }
    if (r->mut & (MOCK_MUT_TOKEN_PLUS_ONE | MOCK_MUT_TRUNCATE_TOKENS)) {
        uint32_t n = src->n_tokens;
        if ((r->mut & MOCK_MUT_TRUNCATE_TOKENS) && n > 0) n--;
        uint64_t *t = kvo_arena_alloc(&r->arena, (size_t)n * sizeof(uint64_t));
        if (!t) return KVO_ENOMEM;
        for (uint32_t k = 0; k < n; k++)
            t[k] = src->token_ids[k] +
                   ((r->mut & MOCK_MUT_TOKEN_PLUS_ONE) ? 1 : 0);
        dst->token_ids = t;
        dst->n_tokens = n;
    }
    if ((r->mut & MOCK_MUT_BLOCK_SIZE_OFF) && src->block_size.set)
        dst->block_size.v = src->block_size.v + 1;
    /* the incidents that rewrite a GPU store's keys */
    const mock_keys *k = aux && aux->keys ? &aux->keys[i] : NULL;
    if (k && src->block_size.set && src->block_size.v > 0) {
        mock_keys kk = *k;
        bool lora_mm = false, rewrite = false;
        if ((r->mut & MOCK_MUT_SALT_IGNORED) && kk.salt) {
            kk.salt = NULL;
            rewrite = true;
        }
        if ((r->mut & (MOCK_MUT_LORA_IN_MM_SLOT | MOCK_MUT_LORA_SAME_HASH)) &&
            kk.lora) {
            dst->lora_id = (wire_int){false, 0};
            dst->lora_name = (wire_str){NULL, 0};
            lora_mm = r->mut & MOCK_MUT_LORA_IN_MM_SLOT;
            if (!lora_mm) kk.lora = NULL;
            rewrite = true;
        }
        if (rewrite) {
            st = events_extra_keys(&r->ek, &r->mmk, &r->cap_mmk, aux->first[i],
                                   src->n_hashes, (uint32_t)src->block_size.v,
                                   &kk, lora_mm);
            if (st != KVO_OK) return st;
            void *ek = kvo_arena_memdup(&r->arena, r->ek.data, r->ek.len);
            if (!ek) return KVO_ENOMEM;
            dst->extra_keys = (wire_raw){ek, (uint32_t)r->ek.len};
        }
    }
    if ((r->mut & MOCK_MUT_CPU_TIER_DROPPED) && is_cpu(src)) {
        /* the offloading connector's old placeholder */
        memset(&dst->parent, 0, sizeof(dst->parent));
        dst->token_ids = NULL;
        dst->n_tokens = 0;
        dst->block_size = (wire_int){true, 0};
        dst->lora_id = (wire_int){false, 0};
        dst->lora_name = (wire_str){NULL, 0};
        dst->kv_cache_spec_kind = (wire_str){NULL, 0};
    }
    return KVO_OK;
}

/* resurrect-removed: a BlockStored of the block a GPU BlockRemoved named,
 * from what the engine kept of it (nothing when it kept no tokens). */
static kvo_status render_resurrect(mock_render *r, const wire_event *removed,
                                   const mock_step_aux *aux, uint32_t i,
                                   uint32_t *n) {
    if (!aux || !aux->removed_meta || !aux->removed_meta[i].tokens ||
        !aux->removed || !aux->removed[i] || is_cpu(removed))
        return KVO_OK;
    const mock_block_meta *m = &aux->removed_meta[i];
    wire_event *dst = push_ev(r, n);
    if (!dst) return KVO_ENOMEM;
    memset(dst, 0, sizeof(*dst));
    dst->type = WIRE_EV_STORED;
    dst->layout = WIRE_LAYOUT_MAP;
    dst->medium = (wire_str){"GPU", 3};
    dst->group_idx = removed->group_idx;
    wire_hash *h = kvo_arena_alloc(&r->arena, sizeof(wire_hash));
    if (!h) return KVO_ENOMEM;
    kvo_status st = render_hash(r, aux->removed[i], false, h);
    if (st != KVO_OK) return st;
    dst->hashes = h;
    dst->n_hashes = 1;
    if (aux->removed_parent && aux->removed_parent[i].d.len &&
        (st = render_hash(r, &aux->removed_parent[i], false, &dst->parent)) !=
            KVO_OK)
        return st;
    dst->token_ids = (uint64_t *)m->tokens;
    dst->n_tokens = r->block_size;
    dst->block_size = (wire_int){true, r->block_size};
    if (m->lora_name) {
        dst->lora_id = (wire_int){true, m->lora_id};
        dst->lora_name =
            (wire_str){m->lora_name, (uint32_t)strlen(m->lora_name)};
    }
    dst->kv_cache_spec_kind = (wire_str){"full_attention", 14};
    return KVO_OK;
}

static kvo_status render_removed(mock_render *r, const wire_event *src,
                                 const mock_step_aux *aux, uint32_t i,
                                 wire_event *dst) {
    kvo_status st;
    *dst = *src;
    wire_hash *hs =
        kvo_arena_alloc(&r->arena, src->n_hashes * sizeof(wire_hash));
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

/* Can removal b join removal a's event? Only of the same medium and group:
 * one event names one of each, and with a CPU tier a GPU removal is often
 * followed by the next offload's CPU removal (mock_events.c). */
static bool same_place(const wire_event *a, const wire_event *b) {
    return a->medium.len == b->medium.len &&
           (a->medium.len == 0 ||
            memcmp(a->medium.p, b->medium.p, a->medium.len) == 0) &&
           a->group_idx.set == b->group_idx.set &&
           a->group_idx.v == b->group_idx.v;
}

/* Consecutive BlockRemoved events of one medium and group -> one event
 * with all their hashes. */
static kvo_status merge_removes(mock_render *r, uint32_t *n) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < *n;) {
        wire_event *e = &r->ev[i];
        uint32_t j = i + 1;
        uint32_t total = e->n_hashes;
        while (e->type == WIRE_EV_REMOVED && j < *n &&
               r->ev[j].type == WIRE_EV_REMOVED && same_place(e, &r->ev[j])) {
            total += r->ev[j].n_hashes;
            j++;
        }
        if (j > i + 1) {
            wire_hash *hs =
                kvo_arena_alloc(&r->arena, total * sizeof(wire_hash));
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
        if ((st = wire_batch_encode(clean, r->fmt, r->flags, &r->out[0])) !=
            KVO_OK)
            return st;
        *out = r->out;
        *n_out = 1;
        return KVO_OK;
    }
    uint32_t n = 0;
    if (r->mut & MOCK_MUT_RESET_NOT_PUBLISHED) {
        /* a batch of nothing but AllBlocksCleared (an idle engine's reset)
         * is held back; the next batch with other events leads with it */
        bool only_cleared = true;
        for (uint32_t i = 0; i < clean->n_events; i++)
            only_cleared &= clean->events[i].type == WIRE_EV_CLEARED;
        if (only_cleared) {
            r->pending_clear = clean->n_events > 0;
            return KVO_OK;
        }
        if (r->pending_clear) {
            wire_event *dst = push_ev(r, &n);
            if (!dst) return KVO_ENOMEM;
            memset(dst, 0, sizeof(*dst));
            dst->type = WIRE_EV_CLEARED;
            dst->layout = WIRE_LAYOUT_MAP;
            r->pending_clear = false;
        }
    }
    for (uint32_t i = 0; i < clean->n_events; i++) {
        const wire_event *src = &clean->events[i];
        if (src->type == WIRE_EV_STORED) {
            r->stores_seen++;
            if ((r->mut & MOCK_MUT_DROP_STORE) &&
                r->stores_seen % DROP_STORE_EVERY == 0)
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
            if ((r->mut & MOCK_MUT_RESURRECT_REMOVED) &&
                (st = render_resurrect(r, src, aux, i, &n)) != KVO_OK)
                return st;
        } else {
            wire_event *dst = push_ev(r, &n);
            if (!dst) return KVO_ENOMEM;
            *dst = *src;
        }
    }
    if ((r->mut & MOCK_MUT_MERGE_REMOVES) &&
        (st = merge_removes(r, &n)) != KVO_OK)
        return st;
    if (r->mut & MOCK_MUT_GROUP_COLLISION) { /* every group says group 0 */
        for (uint32_t k = 0; k < n; k++) {
            wire_event *e = &r->ev[k];
            if (e->type == WIRE_EV_CLEARED || !e->group_idx.set) continue;
            e->group_idx.v = 0;
            if (e->type == WIRE_EV_STORED) {
                e->kv_cache_spec_kind = (wire_str){"full_attention", 14};
                e->kv_cache_spec_sliding_window = (wire_int){false, 0};
            }
        }
    }
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
        if ((st = wire_batch_encode(&b, r->fmt, r->flags, &r->out[k])) !=
            KVO_OK)
            return st;
    }
    *out = r->out;
    *n_out = n_batches;
    return KVO_OK;
}
