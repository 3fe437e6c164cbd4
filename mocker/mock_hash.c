/* mock_hash.c -- engine block hashes for the mocker, with a memo for trace
 * prompts.
 *
 * Hashing is the mocker's hot path: vLLM hashes every prompt block once per
 * request (request.block_hashes), and a Mooncake replay has ~9M of them.
 *
 * The memo: a trace hash id stands for its 512-token block *and everything
 * before it*, and the block's tokens are mock_trace_token(id, j). So, for a
 * request with no LoRA and no salt, the engine hashes of the full blocks
 * inside one trace block are a pure function of (trace hash id, block size,
 * hash of the block before the trace block). The memo keys a *row* -- the
 * digests of one trace block's blocks, in order -- by exactly that,
 * including the parent, so a trace that reuses an id under another prefix
 * still gets correct hashes, just no hit. A row is one memory access for
 * all the blocks of a trace block (32 at block size 16). It is
 * direct-mapped (a collision overwrites), so memory is fixed: 2^memo_log2
 * rows of 512/block_size digests. Its biggest win is a prompt
 * hashed twice in a row -- kvo-check's /kvo/probe, then the completion.
 * Never used for arbitrary token prompts (nothing ties their tokens to an
 * id), nor with LoRA, salt or multimodal items, nor when the block size
 * does not divide 512.
 *
 * Extra keys (vLLM's kv_cache_utils.py, >= 0.19.1): a block's key tuple is
 * (lora_name?, (mm_id, mm_offset)..., cache_salt?), None when empty; the
 * salt only on block 0; the multimodal pairs are the items the block
 * overlaps (mock_mm_block_keys, _gen_mm_extra_hash_keys).
 */
#include "mock_int.h"

#include <string.h>

typedef struct memo_row {
    uint64_t hid;
    uint64_t parent; /* key of the hash before the row */
    uint32_t n;      /* valid digests; 0 = empty */
    uint32_t pad;
    mock_hash h[]; /* row_len */
} memo_row;

struct mock_hasher {
    wire_algo algo;
    mock_hash root;
    uint8_t *memo; /* rows of row_size bytes */
    uint32_t memo_log2;
    uint32_t memo_bs; /* block size the rows were made for */
    uint32_t row_len; /* 512 / memo_bs */
    size_t row_size;
    bool memo_failed;
    kvo_buf scratch;
    wire_mm_key *mmk; /* one block's multimodal keys */
    size_t cap_mmk;
    mock_hasher_stats st;
};

kvo_status mock_hasher_new(mock_hasher **out, wire_algo algo, const char *seed,
                           uint32_t memo_log2) {
    if (!out || !seed || (unsigned)algo >= WIRE_ALGO_COUNT ||
        memo_log2 > MOCK_MEMO_LOG2_MAX)
        return KVO_EINVAL;
    mock_hasher *h = kvo_calloc(1, sizeof(*h));
    if (!h) return KVO_ENOMEM;
    h->algo = algo;
    kvo_buf_init(&h->scratch);
    kvo_status st = wire_engine_root(algo, seed, &h->root.d);
    if (st != KVO_OK) {
        kvo_free(h);
        return st;
    }
    h->root.key = wire_digest_low64(&h->root.d);
    h->memo_log2 = memo_log2;
    *out = h;
    return KVO_OK;
}

void mock_hasher_free(mock_hasher *h) {
    if (!h) return;
    kvo_free(h->memo);
    kvo_free(h->mmk);
    kvo_buf_fini(&h->scratch);
    kvo_free(h);
}

void mock_hasher_stats_get(const mock_hasher *h, mock_hasher_stats *out) {
    *out = h->st;
}

static memo_row *memo_slot(mock_hasher *h, uint64_t hid, uint64_t parent) {
    uint64_t z = kvo_mix64(hid * 0x9E3779B97F4A7C15ull ^ parent);
    size_t i = (size_t)(z & (((uint64_t)1 << h->memo_log2) - 1));
    return (memo_row *)(h->memo + i * h->row_size);
}

/* The memo is usable for this block size (allocating it on first use). */
static bool memo_ready(mock_hasher *h, uint32_t bs) {
    if (h->memo_log2 == 0 || h->memo_failed) return false;
    if (h->memo) return bs == h->memo_bs;
    if (bs == 0 || MOCK_TRACE_BLOCK % bs != 0) return false;
    h->memo_bs = bs;
    h->row_len = MOCK_TRACE_BLOCK / bs;
    h->row_size = sizeof(memo_row) + h->row_len * sizeof(mock_hash);
    h->memo = kvo_calloc((size_t)1 << h->memo_log2, h->row_size);
    if (!h->memo) h->memo_failed = true; /* hash without it */
    return h->memo != NULL;
}

kvo_status mock_mm_check(const mock_mm_item *mm, uint32_t n_mm,
                         uint32_t n_tokens, uint32_t *bad) {
    uint64_t end = 0;
    for (uint32_t i = 0; i < n_mm; i++) {
        const mock_mm_item *m = &mm[i];
        if (!m->id || !*m->id || m->length == 0 || m->offset < end ||
            (uint64_t)m->offset + m->length > n_tokens) {
            if (bad) *bad = i;
            return KVO_EINVAL;
        }
        end = (uint64_t)m->offset + m->length;
    }
    return KVO_OK;
}

uint32_t mock_mm_block_keys(const mock_mm_item *mm, uint32_t n_mm,
                            uint64_t start, uint64_t end, int64_t *idx,
                            wire_mm_key *out) {
    uint32_t n = 0;
    if (n_mm == 0) return 0;
    const mock_mm_item *last = &mm[n_mm - 1];
    if ((uint64_t)last->offset + last->length <= start) return 0;
    int64_t i = *idx < 0 ? (int64_t)n_mm + *idx : *idx;
    while (i >= 0 && i < (int64_t)n_mm) {
        const mock_mm_item *m = &mm[i];
        uint64_t m_end = (uint64_t)m->offset + m->length;
        if (end <= m->offset) break; /* not reached yet */
        if (start >= m_end) {        /* passed */
            i++;
            continue;
        }
        out[n++] = (wire_mm_key){m->id, (int64_t)m->offset - (int64_t)start};
        if (end >= m_end)
            i++; /* it ends here: the next may too */
        else
            break;
    }
    *idx = i;
    return n;
}

/* Room for every multimodal key of one block (at most the request's item
 * count). */
static kvo_status mmk_reserve(mock_hasher *h, uint32_t n_mm) {
    if (n_mm <= h->cap_mmk) return KVO_OK;
    return kvo_grow(&h->mmk, &h->cap_mmk, n_mm, sizeof(*h->mmk), 16);
}

/* One block's digest; its extra keys from k for the block at blk, the
 * multimodal scan threaded through *idx. */
static kvo_status hash_one(mock_hasher *h, const mock_hash *parent,
                           const uint64_t *tokens, uint32_t bs, uint32_t blk,
                           const mock_keys *k, int64_t *idx, mock_hash *out) {
    uint32_t nm = 0;
    if (k && k->n_mm) {
        uint64_t s = (uint64_t)blk * bs;
        nm = mock_mm_block_keys(k->mm, k->n_mm, s, s + bs, idx, h->mmk);
    }
    const char *salt = k && blk == 0 ? k->salt : NULL;
    wire_extra extra = {k ? k->lora : NULL, salt};
    bool any = extra.lora_name || salt || nm;
    kvo_status st = wire_engine_block_mm(h->algo, &parent->d, tokens, bs,
                                         any ? &extra : NULL, h->mmk, nm,
                                         &h->scratch, &out->d);
    if (st != KVO_OK) return st;
    out->key = wire_digest_low64(&out->d);
    h->st.computed++;
    return KVO_OK;
}

static bool keys_any(const mock_keys *k) {
    return k && (k->lora || k->salt || k->n_mm);
}

kvo_status mock_hasher_blocks(mock_hasher *h, const uint64_t *tokens,
                              uint32_t block_size, uint32_t first, uint32_t n,
                              const mock_hash *parent, const char *lora,
                              const char *salt, const mock_trace_ref *trace,
                              mock_hash *out) {
    mock_keys k = {lora, salt, NULL, 0};
    return mock_hasher_blocks_keys(h, tokens, block_size, first, n, parent, &k,
                                   trace, out);
}

kvo_status mock_hasher_blocks_keys(mock_hasher *h, const uint64_t *tokens,
                                   uint32_t block_size, uint32_t first,
                                   uint32_t n, const mock_hash *parent,
                                   const mock_keys *k,
                                   const mock_trace_ref *trace,
                                   mock_hash *out) {
    if (!h || block_size == 0 || (n && (!tokens || !out)) ||
        (k && k->n_mm && !k->mm))
        return KVO_EINVAL;
    if (n == 0) return KVO_OK;
    kvo_status st = mmk_reserve(h, k ? k->n_mm : 0);
    if (st != KVO_OK) return st;
    uint64_t t0 = kvo_now_ns();
    bool use_memo =
        trace && trace->hash_ids && !keys_any(k) && memo_ready(h, block_size);
    const mock_hash *prev = parent ? parent : &h->root;
    /* request_block_hasher: a call from token 0 scans from the first item,
     * a later one (a block completed by generated tokens) from the last */
    int64_t idx = first == 0 ? 0 : -1;
    uint32_t j0 = 0;
    while (j0 < n) {
        uint32_t blk = first + j0;
        uint64_t start = (uint64_t)blk * block_size;
        uint64_t t = start / MOCK_TRACE_BLOCK;
        if (use_memo && start % MOCK_TRACE_BLOCK == 0 &&
            t < trace->n_hash_ids) {
            /* A row: the blocks of trace block t that are wanted. */
            uint32_t want = n - j0 < h->row_len ? n - j0 : h->row_len;
            uint64_t hid = trace->hash_ids[t];
            memo_row *row = memo_slot(h, hid, prev->key);
            uint32_t have = 0;
            if (row->n && row->hid == hid && row->parent == prev->key) {
                have = row->n < want ? row->n : want;
                memcpy(&out[j0], row->h, have * sizeof(mock_hash));
                h->st.memo_hits += have;
            } else {
                row->hid = hid;
                row->parent = prev->key;
                row->n = 0;
            }
            for (uint32_t j = have; j < want; j++) {
                const mock_hash *pj = j ? &out[j0 + j - 1] : prev;
                st = hash_one(h, pj, tokens + start + (uint64_t)j * block_size,
                              block_size, blk + j, NULL, &idx, &out[j0 + j]);
                if (st != KVO_OK) goto done;
            }
            if (want > row->n) { /* extend the row with what was computed */
                memcpy(&row->h[row->n], &out[j0 + row->n],
                       (want - row->n) * sizeof(mock_hash));
                row->n = want;
            }
            j0 += want;
            prev = &out[j0 - 1];
            continue;
        }
        st = hash_one(h, prev, tokens + start, block_size, blk, k, &idx,
                      &out[j0]);
        if (st != KVO_OK) break;
        prev = &out[j0];
        j0++;
    }
done:
    h->st.ns += kvo_now_ns() - t0;
    return st;
}

kvo_status mock_hasher_block_next(mock_hasher *h, const uint64_t *tokens,
                                  uint32_t block_size, uint32_t blk,
                                  const mock_hash *prev, const mock_keys *k,
                                  const mock_trace_ref *trace, mock_hash *out) {
    if (!h || block_size == 0 || !tokens || !out || (blk && !prev) ||
        (k && k->n_mm && !k->mm))
        return KVO_EINVAL;
    kvo_status st = mmk_reserve(h, k ? k->n_mm : 0);
    if (st != KVO_OK) return st;
    const mock_hash *parent = blk ? &prev[blk - 1] : &h->root;
    uint64_t start = (uint64_t)blk * block_size;
    uint64_t t = start / MOCK_TRACE_BLOCK;
    memo_row *row = NULL;
    uint32_t j = 0;
    if (trace && trace->hash_ids && !keys_any(k) && memo_ready(h, block_size) &&
        t < trace->n_hash_ids) {
        j = (uint32_t)(start % MOCK_TRACE_BLOCK) / block_size;
        uint32_t row_first = blk - j; /* the row's first block */
        uint64_t row_parent = row_first ? prev[row_first - 1].key : h->root.key;
        uint64_t hid = trace->hash_ids[t];
        row = memo_slot(h, hid, row_parent);
        if (row->n && row->hid == hid && row->parent == row_parent) {
            if (row->n > j) {
                *out = row->h[j];
                h->st.memo_hits++;
                return KVO_OK;
            }
        } else if (j == 0) { /* claim the slot, as mock_hasher_blocks does */
            row->hid = hid;
            row->parent = row_parent;
            row->n = 0;
        } else {
            row = NULL; /* someone else's row: leave it */
        }
    }
    /* A prompt block: the hasher's one call from token 0 threads its scan
     * from the first item; a fresh scan from the first item finds the same
     * items (the ones it skips all ended before this block). */
    int64_t idx = 0;
    uint64_t t0 = kvo_now_ns(); /* digests only: a memo hit is not hashing */
    st = hash_one(h, parent, tokens, block_size, blk, k, &idx, out);
    h->st.ns += kvo_now_ns() - t0;
    if (st == KVO_OK && row && row->n == j) { /* in order: extend the row */
        row->h[j] = *out;
        row->n = j + 1;
    }
    return st;
}
