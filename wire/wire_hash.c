/* wire_hash.c -- the router hash and the engine block hash (DESIGN §5).
 *
 * Router hash (Dynamo's LocalBlockHash): XXH3-64 over the block's token ids
 * as u32 little-endian; LoRA name and cache salt move the seed:
 *     seed = 1337 + xxh3_64(lora, 0) + xxh3_64(salt, 1)   (mod 2^64)
 *
 * Engine hash (vLLM's hash_block_tokens):
 *     NONE_HASH = H(seed_string)
 *     block     = H((parent_digest_bytes, tuple(token_ids), extra_keys))
 *     extra_keys = None | (lora_name?, (mm_id, mm_offset)..., cache_salt?)
 * where H(x) = SHA-256 or XXH3-128 (canonical, big-endian) of x serialized by
 * CPython's pickle protocol 5 or by cbor2's canonical CBOR. Only the shapes
 * above are serialized, so both serializers are written out by hand (there
 * is no C library for either); they must match CPython and cbor2 byte for
 * byte.
 *
 * Pickle protocol 5, as CPython's C pickler (Modules/_pickle.c) writes it:
 *
 *   80 05                         PROTO 5 (never inside a frame)
 *   95 <u64 LE len> ...           FRAME: every later opcode lives in frames
 *   43 20 <32 digest bytes> 94    SHORT_BINBYTES + MEMOIZE (the parent)
 *   28 <ints> 74 94               MARK ... TUPLE + MEMOIZE   (n >= 4)
 *   <ints> 85|86|87 94            TUPLE1/2/3 + MEMOIZE       (n = 1..3)
 *   29                            EMPTY_TUPLE, not memoized  (n = 0)
 *   4e | <items> 85|86|87 94      None | (lora?, mm pairs..., salt?)
 *   (28 <items> 74 94             ... with MARK when more than 3 items)
 *   <str> <int> 86 94             one multimodal (identifier, offset) pair
 *   87 94 2e                      TUPLE3 + MEMOIZE, STOP
 *
 * ints: K <u8> below 256, M <u16 LE> below 65536, J <i32 LE> below 2^31
 * (and negative ones down to -2^31: a multimodal offset), else LONG1 <n>
 * <n bytes LE two's complement>, n = bit_length / 8 + 1.
 * strs: 8c <u8 len> | 58 <u32 LE len> | 8d <u64 LE len>, UTF-8, + MEMOIZE;
 * bytes likewise with 43 | 42 | 8e.
 *
 * Framing: at the start of every object it saves, the pickler closes the
 * current frame when it holds >= 64 KiB, and opens a new one on the next
 * write. A str/bytes payload of >= 64 KiB is written outside any frame
 * (header included). A frame that ends up shorter than 4 bytes loses its
 * header. (Checked against CPython 3.11: blocks of 13,099..13,101 five-byte
 * ints put the split exactly there.)
 *
 * Canonical CBOR (cbor2 canonical=True) of the same shapes: tuples are
 * arrays (major 4), bytes major 2, str major 3, ints major 0 (negative
 * ones major 1), None f6, all
 * heads in their shortest form. Canonical ordering only concerns maps and
 * sets, which never occur here.
 *
 * Cost: serialization goes into the caller's scratch buffer, reserved once
 * for the worst case, then digested in one call: no allocation in steady
 * state. SHA-256 uses OpenSSL's SHA256_Init/Update/Final on a stack context:
 * OpenSSL 3's one-shot SHA256() and EVP_Digest() fetch the algorithm (and
 * allocate a context) on every call, several times the cost of the digest
 * itself for a 16-token block.
 */
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init & co., see above */

#include "wire.h"

#include <openssl/sha.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* Unaligned 32-bit stores in a fixed byte order. */
static inline void store32le(uint8_t *p, uint32_t v) {
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

static inline void store32be(uint8_t *p, uint32_t v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

/* ======================================================================== */
/* Router hash                                                               */
/* ======================================================================== */

uint64_t wire_router_seed(const char *lora, size_t lora_len, const char *salt,
                          size_t salt_len) {
    uint64_t seed = WIRE_ROUTER_SEED;
    if (lora) seed += XXH3_64bits_withSeed(lora, lora_len, 0);
    if (salt) seed += XXH3_64bits_withSeed(salt, salt_len, 1);
    return seed;
}

/* Tokens converted per step; blocks up to this size hash in one call. */
#define ROUTER_CHUNK 1024

static void tokens_to_u32_le(uint8_t *dst, const uint64_t *tokens, size_t n) {
    for (size_t i = 0; i < n; i++) store32le(dst + 4 * i, (uint32_t)tokens[i]);
}

uint64_t wire_router_hash(const uint64_t *tokens, size_t n, uint64_t seed) {
    uint8_t le[4 * ROUTER_CHUNK];
    if (n <= ROUTER_CHUNK) {
        tokens_to_u32_le(le, tokens, n);
        return XXH3_64bits_withSeed(le, 4 * n, seed);
    }
    /* Streaming gives the same value as the one-shot call over all bytes. */
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    for (size_t i = 0; i < n; i += ROUTER_CHUNK) {
        size_t k = n - i < ROUTER_CHUNK ? n - i : ROUTER_CHUNK;
        tokens_to_u32_le(le, tokens + i, k);
        XXH3_64bits_update(&st, le, 4 * k);
    }
    return XXH3_64bits_digest(&st);
}

size_t wire_router_hash_blocks(const uint64_t *tokens, size_t n,
                               uint32_t block_size, uint64_t seed,
                               uint64_t *out) {
    if (block_size == 0) return 0;
    size_t nb = n / block_size;
    for (size_t i = 0; i < nb; i++)
        out[i] = wire_router_hash(tokens + i * block_size, block_size, seed);
    return nb;
}

/* The running router hash of a block: its tokens, then its items. */
static void router_tokens_begin(XXH3_state_t *st, const uint64_t *tokens,
                                size_t n, uint64_t seed) {
    uint8_t le[4 * ROUTER_CHUNK];
    XXH3_INITSTATE(st);
    XXH3_64bits_reset_withSeed(st, seed);
    for (size_t i = 0; i < n; i += ROUTER_CHUNK) {
        size_t k = n - i < ROUTER_CHUNK ? n - i : ROUTER_CHUNK;
        tokens_to_u32_le(le, tokens + i, k);
        XXH3_64bits_update(st, le, 4 * k);
    }
}

static void router_item(XXH3_state_t *st, const char *id, int64_t offset) {
    uint64_t h = XXH3_64bits_withSeed(id, strlen(id), 0);
    uint64_t off = (uint64_t)offset;
    uint8_t b[16];
    for (int k = 0; k < 8; k++) {
        b[k] = (uint8_t)(h >> (8 * k));
        b[8 + k] = (uint8_t)(off >> (8 * k));
    }
    XXH3_64bits_update(st, b, sizeof(b));
}

uint64_t wire_router_hash_mm(const uint64_t *tokens, size_t n, uint64_t seed,
                             const wire_mm_key *mm, uint32_t n_mm) {
    if (n_mm == 0) return wire_router_hash(tokens, n, seed);
    XXH3_state_t st;
    router_tokens_begin(&st, tokens, n, seed);
    for (uint32_t j = 0; j < n_mm; j++)
        router_item(&st, mm[j].id, mm[j].offset);
    return XXH3_64bits_digest(&st);
}

size_t wire_router_hash_prompt(const uint64_t *tokens, size_t n,
                               uint32_t block_size, const char *lora,
                               const char *salt, const wire_mm_span *mm,
                               uint32_t n_mm, uint64_t *out) {
    if (block_size == 0) return 0;
    size_t ll = lora ? strlen(lora) : 0;
    uint64_t seed = wire_router_seed(lora, ll, NULL, 0);
    uint64_t seed0 = wire_router_seed(lora, ll, salt, salt ? strlen(salt) : 0);
    size_t nb = n / block_size;
    uint32_t first = 0; /* the first item not wholly before this block */
    for (size_t b = 0; b < nb; b++) {
        const uint64_t *t = tokens + b * block_size;
        uint64_t s = b == 0 ? seed0 : seed;
        uint64_t start = (uint64_t)b * block_size, end = start + block_size;
        while (first < n_mm && mm[first].offset + mm[first].length <= start)
            first++;
        if (first == n_mm || mm[first].offset >= end) {
            out[b] = wire_router_hash(t, block_size, s);
            continue;
        }
        XXH3_state_t st;
        router_tokens_begin(&st, t, block_size, s);
        for (uint32_t j = first; j < n_mm && mm[j].offset < end; j++)
            router_item(&st, mm[j].id, (int64_t)mm[j].offset - (int64_t)start);
        out[b] = XXH3_64bits_digest(&st);
    }
    return nb;
}

/* ======================================================================== */
/* Algorithms and digests                                                    */
/* ======================================================================== */

static const char *const algo_names[WIRE_ALGO_COUNT] = {
    [WIRE_ALGO_SHA256] = "sha256",
    [WIRE_ALGO_SHA256_CBOR] = "sha256_cbor",
    [WIRE_ALGO_XXHASH] = "xxhash",
    [WIRE_ALGO_XXHASH_CBOR] = "xxhash_cbor",
};

kvo_status wire_algo_parse(const char *name, wire_algo *out) {
    if (!name) return KVO_EINVAL;
    for (int a = 0; a < WIRE_ALGO_COUNT; a++) {
        if (strcmp(name, algo_names[a]) == 0) {
            *out = (wire_algo)a;
            return KVO_OK;
        }
    }
    return KVO_EINVAL;
}

const char *wire_algo_name(wire_algo a) {
    if ((unsigned)a >= WIRE_ALGO_COUNT) return "unknown";
    return algo_names[a];
}

uint64_t wire_digest_low64(const wire_digest *d) {
    uint64_t v = 0;
    size_t start = d->len > 8 ? (size_t)d->len - 8 : 0;
    for (size_t i = start; i < d->len; i++) v = (v << 8) | d->b[i];
    return v;
}

static bool algo_is_cbor(wire_algo a) {
    return a == WIRE_ALGO_SHA256_CBOR || a == WIRE_ALGO_XXHASH_CBOR;
}

static void digest_bytes(wire_algo a, const uint8_t *p, size_t n,
                         wire_digest *out) {
    memset(out, 0, sizeof(*out));
    if (a == WIRE_ALGO_SHA256 || a == WIRE_ALGO_SHA256_CBOR) {
        SHA256_CTX c;
        SHA256_Init(&c);
        SHA256_Update(&c, p, n);
        SHA256_Final(out->b, &c);
        out->len = 32;
    } else {
        XXH128_canonical_t canon;
        XXH128_canonicalFromHash(&canon, XXH3_128bits(p, n));
        memcpy(out->b, canon.digest, 16);
        out->len = 16;
    }
}

/* ======================================================================== */
/* Pickle protocol 5 writer                                                  */
/* ======================================================================== */

enum {
    PK_MARK = 0x28,
    PK_STOP = 0x2e,
    PK_BININT = 0x4a,
    PK_BININT1 = 0x4b,
    PK_BININT2 = 0x4d,
    PK_NONE = 0x4e,
    PK_BINUNICODE = 0x58,
    PK_TUPLE = 0x74,
    PK_EMPTY_TUPLE = 0x29,
    PK_BINBYTES = 0x42,
    PK_SHORT_BINBYTES = 0x43,
    PK_PROTO = 0x80,
    PK_TUPLE1 = 0x85,
    PK_LONG1 = 0x8a,
    PK_SHORT_BINUNICODE = 0x8c,
    PK_BINUNICODE8 = 0x8d,
    PK_BINBYTES8 = 0x8e,
    PK_MEMOIZE = 0x94,
    PK_FRAME = 0x95,
};

#define PK_FRAME_TARGET (64u * 1024u)
#define PK_FRAME_MIN 4u
#define PK_FRAME_HDR 9u

/* Writes into memory reserved up front (pk_bound); a frame is always open
 * except while a large payload is written outside frames. */
typedef struct pk {
    uint8_t *base;
    size_t len;
    size_t frame; /* offset of the open frame's header */
} pk;

static void pk_byte(pk *w, uint8_t v) { w->base[w->len++] = v; }

static void pk_mem(pk *w, const void *p, size_t n) {
    if (n) memcpy(w->base + w->len, p, n);
    w->len += n;
}

static void pk_le(pk *w, uint64_t v, unsigned nbytes) {
    for (unsigned i = 0; i < nbytes; i++)
        w->base[w->len++] = (uint8_t)(v >> (8 * i));
}

static void pk_frame_open(pk *w) {
    w->frame = w->len;
    w->len += PK_FRAME_HDR;
}

static void pk_frame_commit(pk *w) {
    size_t flen = w->len - w->frame - PK_FRAME_HDR;
    uint8_t *h = w->base + w->frame;
    if (flen >= PK_FRAME_MIN) {
        h[0] = PK_FRAME;
        for (unsigned i = 0; i < 8; i++)
            h[1 + i] = (uint8_t)((uint64_t)flen >> (8 * i));
    } else {
        memmove(h, h + PK_FRAME_HDR, flen);
        w->len -= PK_FRAME_HDR;
    }
}

/* What save() does first for every object. */
static void pk_save_begin(pk *w) {
    if (w->len - w->frame - PK_FRAME_HDR >= PK_FRAME_TARGET) {
        pk_frame_commit(w);
        pk_frame_open(w);
    }
}

/* Token ids vary in width at random from one to the next, so the common
 * widths are written without branches: the opcode from a table, always 4
 * value bytes stored (the reserve leaves room), the length advanced by the
 * width actually used. */
static void pk_int(pk *w, uint64_t v) {
    static const uint8_t op[3] = {PK_BININT1, PK_BININT2, PK_BININT};
    pk_save_begin(w);
    if (v < 0x80000000u) {
        unsigned cls = (unsigned)(v >= 0x100) + (unsigned)(v >= 0x10000);
        uint8_t *p = w->base + w->len;
        p[0] = op[cls];
        store32le(p + 1, (uint32_t)v);
        w->len += 1 + (1u << cls);
        return;
    }
    /* LONG1: positive two's complement needs one bit more than
     * bit_length. */
    unsigned nbytes = (unsigned)(64 - __builtin_clzll(v)) / 8 + 1;
    pk_byte(w, PK_LONG1);
    pk_byte(w, (uint8_t)nbytes);
    pk_le(w, v, nbytes < 8 ? nbytes : 8);
    if (nbytes == 9) pk_byte(w, 0);
}

/* str (is_str) or bytes, then MEMOIZE. */
static void pk_blob(pk *w, bool is_str, const void *p, size_t n) {
    pk_save_begin(w);
    uint8_t hdr[9];
    size_t hn;
    if (n < 0x100) {
        hdr[0] = is_str ? PK_SHORT_BINUNICODE : PK_SHORT_BINBYTES;
        hdr[1] = (uint8_t)n;
        hn = 2;
    } else if ((uint64_t)n <= 0xffffffffu) {
        hdr[0] = is_str ? PK_BINUNICODE : PK_BINBYTES;
        for (unsigned i = 0; i < 4; i++) hdr[1 + i] = (uint8_t)(n >> (8 * i));
        hn = 5;
    } else {
        hdr[0] = is_str ? PK_BINUNICODE8 : PK_BINBYTES8;
        for (unsigned i = 0; i < 8; i++)
            hdr[1 + i] = (uint8_t)((uint64_t)n >> (8 * i));
        hn = 9;
    }
    if (n >= PK_FRAME_TARGET) {
        /* Large payloads bypass framing, header included. */
        pk_frame_commit(w);
        pk_mem(w, hdr, hn);
        pk_mem(w, p, n);
        pk_frame_open(w);
    } else {
        pk_mem(w, hdr, hn);
        pk_mem(w, p, n);
    }
    pk_byte(w, PK_MEMOIZE);
}

/* The parent digest: SHORT_BINBYTES + MEMOIZE, like pk_blob, but copying a
 * fixed 32 bytes (the cursor advances by len only): a constant-size copy
 * compiles to a few moves, a variable one to `rep movs`, which cost a
 * quarter of the serialization time. */
static void pk_digest(pk *w, const wire_digest *d) {
    pk_save_begin(w);
    uint8_t *p = w->base + w->len;
    p[0] = PK_SHORT_BINBYTES;
    p[1] = d->len;
    memcpy(p + 2, d->b, sizeof(d->b));
    p[2 + d->len] = PK_MEMOIZE;
    w->len += 3u + d->len;
}

/* Opcode closing a tuple of n >= 1 items (after its items). */
static void pk_tuple_end(pk *w, size_t n) {
    pk_byte(w, n <= 3 ? (uint8_t)(PK_TUPLE1 + n - 1) : PK_TUPLE);
    pk_byte(w, PK_MEMOIZE);
}

static void pk_begin(pk *w, uint8_t *base) {
    w->base = base;
    w->len = 0;
    pk_byte(w, PK_PROTO);
    pk_byte(w, 5);
    pk_frame_open(w);
}

static size_t pk_end(pk *w) {
    pk_byte(w, PK_STOP);
    pk_frame_commit(w);
    return w->len;
}

/* Upper bound of a pickle whose payload (opcodes and data) is n bytes:
 * PROTO, STOP, one frame header per 64 KiB plus one around each of up to
 * four out-of-frame payloads. */
static size_t pk_bound(size_t n) {
    return 3 + n + PK_FRAME_HDR * (n / PK_FRAME_TARGET + 6);
}

/* ======================================================================== */
/* Canonical CBOR writer                                                     */
/* ======================================================================== */

/* Shortest head; up to 32-bit arguments without branches (see pk_int):
 * class 0..3 = immediate, 1, 2 or 4 argument bytes, stored big-endian. */
static uint8_t *cb_head(uint8_t *p, unsigned major, uint64_t v) {
    static const uint8_t info[4] = {0, 24, 25, 26}, width[4] = {0, 1, 2, 4};
    uint8_t m = (uint8_t)(major << 5);
    if (v <= 0xffffffffu) {
        unsigned cls = (unsigned)(v >= 24) + (unsigned)(v >= 0x100) +
                       (unsigned)(v >= 0x10000);
        unsigned n = width[cls];
        p[0] = (uint8_t)(m | (cls ? info[cls] : v));
        store32be(p + 1, (uint32_t)(v << (32 - 8 * n)));
        return p + 1 + n;
    }
    *p++ = m | 27;
    for (unsigned i = 8; i-- > 0;) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *cb_blob(uint8_t *p, unsigned major, const void *d, size_t n) {
    p = cb_head(p, major, n);
    if (n) memcpy(p, d, n);
    return p + n;
}

enum { CB_UINT = 0, CB_NEGINT = 1, CB_BYTES = 2, CB_TEXT = 3, CB_ARRAY = 4 };
#define CB_NULL 0xf6
#define CB_HEAD_MAX 9

/* ======================================================================== */
/* Engine hash                                                               */
/* ======================================================================== */

/* The extra keys' items: each a string (LoRA name, salt) or a
 * multimodal (identifier, offset) pair, in vLLM's order. */
typedef struct extra_item {
    const char *s; /* the string, or the multimodal identifier */
    size_t n;
    bool mm; /* a (s, off) pair */
    int64_t off;
} extra_item;

/* The items of x and mm into it (caller-sized: 2 + n_mm); 0 = None. */
static size_t extra_items(const wire_extra *x, const wire_mm_key *mm,
                          uint32_t n_mm, extra_item *it) {
    size_t n = 0;
    if (x && x->lora_name)
        it[n++] = (extra_item){x->lora_name, strlen(x->lora_name), false, 0};
    for (uint32_t i = 0; i < n_mm; i++)
        it[n++] = (extra_item){mm[i].id, strlen(mm[i].id), true, mm[i].offset};
    if (x && x->cache_salt)
        it[n++] = (extra_item){x->cache_salt, strlen(x->cache_salt), false, 0};
    return n;
}

/* A signed int as CPython's save_long writes it: non-negative ones as
 * pk_int; negative ones BININT (4 bytes LE two's complement) down to
 * -2^31, else LONG1 with the fewest two's-complement bytes. */
static void pk_sint(pk *w, int64_t v) {
    if (v >= 0) {
        pk_int(w, (uint64_t)v);
        return;
    }
    pk_save_begin(w);
    if (v >= INT32_MIN) {
        pk_byte(w, PK_BININT);
        pk_le(w, (uint64_t)v, 4);
        return;
    }
    unsigned nbytes = 8; /* drop sign bytes while the next keeps the sign */
    while (nbytes > 1 && (uint8_t)((uint64_t)v >> (8 * (nbytes - 1))) == 0xff &&
           ((uint64_t)v >> (8 * (nbytes - 2)) & 0x80))
        nbytes--;
    pk_byte(w, PK_LONG1);
    pk_byte(w, (uint8_t)nbytes);
    pk_le(w, (uint64_t)v, nbytes);
}

/* CBOR's shortest head for a signed int: major 0, or major 1 of -1 - v. */
static uint8_t *cb_sint(uint8_t *p, int64_t v) {
    if (v >= 0) return cb_head(p, CB_UINT, (uint64_t)v);
    return cb_head(p, CB_NEGINT, (uint64_t)(-(v + 1)));
}

/* Serialize one block's tuple into out (replacing its contents). */
static kvo_status serialize_block(wire_algo a, const wire_digest *parent,
                                  const uint64_t *tokens, size_t n,
                                  const wire_extra *extra,
                                  const wire_mm_key *mm, uint32_t n_mm,
                                  kvo_buf *out) {
    extra_item stack_items[16]; /* lora, salt and 14 items: no allocation */
    extra_item *it = stack_items;
    size_t cap_items = 2 + (size_t)n_mm;
    if (cap_items > KVO_ARRAY_LEN(stack_items) &&
        !(it = kvo_malloc(cap_items * sizeof(*it))))
        return KVO_ENOMEM;
    size_t nk = extra_items(extra, mm, n_mm, it);
    kvo_status st = KVO_OK;
    /* Payload bound: 9 bytes per int or head, plus the blobs, plus a
     * handful of opcodes per container. */
    if (n > (SIZE_MAX / 2) / 9) {
        st = KVO_ETOOBIG;
        goto done;
    }
    size_t payload = 64 + (size_t)parent->len + 9 * n;
    for (size_t i = 0; i < nk; i++) {
        if (it[i].n > SIZE_MAX / 4 - payload) {
            st = KVO_ETOOBIG;
            goto done;
        }
        payload += it[i].n + 32;
    }
    kvo_buf_reset(out);
    if ((st = kvo_buf_reserve(out, pk_bound(payload))) != KVO_OK) goto done;

    if (algo_is_cbor(a)) {
        uint8_t *p = out->data;
        p = cb_head(p, CB_ARRAY, 3);
        p = cb_head(p, CB_BYTES, parent->len);
        memcpy(p, parent->b, sizeof(parent->b)); /* fixed size: see pk_digest */
        p += parent->len;
        p = cb_head(p, CB_ARRAY, n);
        for (size_t i = 0; i < n; i++) p = cb_head(p, CB_UINT, tokens[i]);
        if (nk == 0) {
            *p++ = CB_NULL;
        } else {
            p = cb_head(p, CB_ARRAY, nk);
            for (size_t i = 0; i < nk; i++) {
                if (it[i].mm) p = cb_head(p, CB_ARRAY, 2);
                p = cb_blob(p, CB_TEXT, it[i].s, it[i].n);
                if (it[i].mm) p = cb_sint(p, it[i].off);
            }
        }
        out->len = (size_t)(p - out->data);
        goto done;
    }

    pk w;
    pk_begin(&w, out->data);
    pk_save_begin(&w); /* the outer tuple (3 items: no MARK) */
    pk_digest(&w, parent);
    pk_save_begin(&w); /* tuple(tokens) */
    if (n == 0) {
        pk_byte(&w, PK_EMPTY_TUPLE);
    } else {
        if (n > 3) pk_byte(&w, PK_MARK);
        for (size_t i = 0; i < n; i++) pk_int(&w, tokens[i]);
        pk_tuple_end(&w, n);
    }
    pk_save_begin(&w); /* extra_keys */
    if (nk == 0) {
        pk_byte(&w, PK_NONE);
    } else {
        if (nk > 3) pk_byte(&w, PK_MARK);
        for (size_t i = 0; i < nk; i++) {
            if (it[i].mm) pk_save_begin(&w); /* the (identifier, offset) pair */
            pk_blob(&w, true, it[i].s, it[i].n);
            if (it[i].mm) {
                pk_sint(&w, it[i].off);
                pk_tuple_end(&w, 2);
            }
        }
        pk_tuple_end(&w, nk);
    }
    pk_tuple_end(&w, 3);
    out->len = pk_end(&w);
done:
    if (it != stack_items) kvo_free(it);
    return st;
}

kvo_status wire_engine_serialize_mm(wire_algo a, const wire_digest *parent,
                                    const uint64_t *tokens, size_t n,
                                    const wire_extra *extra,
                                    const wire_mm_key *mm, uint32_t n_mm,
                                    kvo_buf *out) {
    if ((unsigned)a >= WIRE_ALGO_COUNT || !parent || (n && !tokens) || !out ||
        parent->len > sizeof(parent->b) || (n_mm && !mm))
        return KVO_EINVAL;
    kvo_buf tmp;
    kvo_buf_init(&tmp);
    kvo_status st =
        serialize_block(a, parent, tokens, n, extra, mm, n_mm, &tmp);
    if (st == KVO_OK) st = kvo_buf_append(out, tmp.data, tmp.len);
    kvo_buf_fini(&tmp);
    return st;
}

kvo_status wire_engine_serialize(wire_algo a, const wire_digest *parent,
                                 const uint64_t *tokens, size_t n,
                                 const wire_extra *extra, kvo_buf *out) {
    return wire_engine_serialize_mm(a, parent, tokens, n, extra, NULL, 0, out);
}

kvo_status wire_engine_root(wire_algo a, const char *seed, wire_digest *out) {
    if ((unsigned)a >= WIRE_ALGO_COUNT || !seed || !out) return KVO_EINVAL;
    size_t n = strlen(seed);
    if (n > SIZE_MAX / 4) return KVO_ETOOBIG;
    kvo_buf b;
    kvo_buf_init(&b);
    kvo_status st = kvo_buf_reserve(&b, pk_bound(n + 16));
    if (st != KVO_OK) goto done;
    if (algo_is_cbor(a)) {
        b.len = (size_t)(cb_blob(b.data, CB_TEXT, seed, n) - b.data);
    } else {
        pk w;
        pk_begin(&w, b.data);
        pk_blob(&w, true, seed, n);
        b.len = pk_end(&w);
    }
    digest_bytes(a, b.data, b.len, out);
done:
    kvo_buf_fini(&b);
    return st;
}

kvo_status wire_engine_block_mm(wire_algo a, const wire_digest *parent,
                                const uint64_t *tokens, size_t n,
                                const wire_extra *extra, const wire_mm_key *mm,
                                uint32_t n_mm, kvo_buf *scratch,
                                wire_digest *out) {
    if ((unsigned)a >= WIRE_ALGO_COUNT || !parent || (n && !tokens) || !out ||
        parent->len > sizeof(parent->b) || (n_mm && !mm))
        return KVO_EINVAL;
    kvo_buf local;
    kvo_buf_init(&local);
    kvo_buf *b = scratch ? scratch : &local;
    kvo_status st = serialize_block(a, parent, tokens, n, extra, mm, n_mm, b);
    if (st == KVO_OK) digest_bytes(a, b->data, b->len, out);
    kvo_buf_fini(&local);
    return st;
}

kvo_status wire_engine_block(wire_algo a, const wire_digest *parent,
                             const uint64_t *tokens, size_t n,
                             const wire_extra *extra, kvo_buf *scratch,
                             wire_digest *out) {
    return wire_engine_block_mm(a, parent, tokens, n, extra, NULL, 0, scratch,
                                out);
}
