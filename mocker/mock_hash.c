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
 * id), nor with LoRA or salt, nor when the block size does not divide 512.
 */
#include "mock_int.h"

#include <string.h>

typedef struct memo_row {
    uint64_t hid;
    uint64_t parent; /* key of the hash before the row */
    uint32_t n;      /* valid digests; 0 = empty */
    uint32_t pad;
    mock_hash h[];   /* row_len */
} memo_row;

struct mock_hasher {
    wire_algo algo;
    mock_hash root;
    uint8_t *memo;       /* rows of row_size bytes */
    uint32_t memo_log2;
    uint32_t memo_bs;    /* block size the rows were made for */
    uint32_t row_len;    /* 512 / memo_bs */
    size_t row_size;
    bool memo_failed;
    kvo_buf scratch;
    mock_hasher_stats st;
};

kvo_status mock_hasher_new(mock_hasher **out, wire_algo algo,
                           const char *seed, uint32_t memo_log2) {
    if (!out || !seed || (unsigned)algo >= WIRE_ALGO_COUNT || memo_log2 > MOCK_MEMO_LOG2_MAX)
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

static kvo_status hash_one(mock_hasher *h, const mock_hash *parent,
                           const uint64_t *tokens, uint32_t bs,
                           const wire_extra *extra, mock_hash *out) {
    kvo_status st = wire_engine_block(h->algo, &parent->d, tokens, bs, extra,
                                      &h->scratch, &out->d);
    if (st != KVO_OK) return st;
    out->key = wire_digest_low64(&out->d);
    h->st.computed++;
    return KVO_OK;
}

kvo_status mock_hasher_blocks(mock_hasher *h, const uint64_t *tokens,
                              uint32_t block_size, uint32_t first, uint32_t n,
                              const mock_hash *parent, const char *lora,
                              const char *salt, const mock_trace_ref *trace,
                              mock_hash *out) {
    if (!h || block_size == 0 || (n && (!tokens || !out))) return KVO_EINVAL;
    if (n == 0) return KVO_OK;
    uint64_t t0 = kvo_now_ns();
    kvo_status st = KVO_OK;
    bool use_memo = trace && trace->hash_ids && !lora && !salt &&
                    memo_ready(h, block_size);
    const mock_hash *prev = parent ? parent : &h->root;
    uint32_t k = 0;
    while (k < n) {
        uint32_t blk = first + k;
        uint64_t start = (uint64_t)blk * block_size;
        uint64_t t = start / MOCK_TRACE_BLOCK;
        if (use_memo && start % MOCK_TRACE_BLOCK == 0 && t < trace->n_hash_ids) {
            /* A row: the blocks of trace block t that are wanted. */
            uint32_t want = n - k < h->row_len ? n - k : h->row_len;
            uint64_t hid = trace->hash_ids[t];
            memo_row *row = memo_slot(h, hid, prev->key);
            uint32_t have = 0;
            if (row->n && row->hid == hid && row->parent == prev->key) {
                have = row->n < want ? row->n : want;
                memcpy(&out[k], row->h, have * sizeof(mock_hash));
                h->st.memo_hits += have;
            } else {
                row->hid = hid;
                row->parent = prev->key;
                row->n = 0;
            }
            for (uint32_t j = have; j < want; j++) {
                const mock_hash *pj = j ? &out[k + j - 1] : prev;
                st = hash_one(h, pj, tokens + start + (uint64_t)j * block_size,
                              block_size, NULL, &out[k + j]);
                if (st != KVO_OK) goto done;
            }
            if (want > row->n) { /* extend the row with what was computed */
                memcpy(&row->h[row->n], &out[k + row->n],
                       (want - row->n) * sizeof(mock_hash));
                row->n = want;
            }
            k += want;
            prev = &out[k - 1];
            continue;
        }
        wire_extra extra = {lora, blk == 0 ? salt : NULL};
        st = hash_one(h, prev, tokens + start, block_size,
                      (lora || (blk == 0 && salt)) ? &extra : NULL, &out[k]);
        if (st != KVO_OK) break;
        prev = &out[k];
        k++;
    }
done:
    h->st.ns += kvo_now_ns() - t0;
    return st;
}

kvo_status mock_hasher_block_next(mock_hasher *h, const uint64_t *tokens,
                                  uint32_t block_size, uint32_t blk,
                                  const mock_hash *prev, const char *lora,
                                  const char *salt, const mock_trace_ref *trace,
                                  mock_hash *out) {
    if (!h || block_size == 0 || !tokens || !out || (blk && !prev))
        return KVO_EINVAL;
    kvo_status st = KVO_OK;
    const mock_hash *parent = blk ? &prev[blk - 1] : &h->root;
    uint64_t start = (uint64_t)blk * block_size;
    uint64_t t = start / MOCK_TRACE_BLOCK;
    memo_row *row = NULL;
    uint32_t j = 0;
    if (trace && trace->hash_ids && !lora && !salt && memo_ready(h, block_size) &&
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
    wire_extra extra = {lora, blk == 0 ? salt : NULL};
    uint64_t t0 = kvo_now_ns(); /* digests only: a memo hit is not hashing */
    st = hash_one(h, parent, tokens, block_size,
                  (lora || (blk == 0 && salt)) ? &extra : NULL, out);
    h->st.ns += kvo_now_ns() - t0;
    if (st == KVO_OK && row && row->n == j) { /* in order: extend the row */
        row->h[j] = *out;
        row->n = j + 1;
    }
    return st;
}
