/* wire_batch.c -- vLLM KVEventBatch payloads (the third ZMQ frame, DESIGN §4):
 * decoder, encoder, formats, the sequence frame.
 *
 * Decoding is one pass over the payload, without recursion, with the wire_rd
 * cursor (wire_int.h) straight into the caller's wire_batch: strings, bins,
 * hashes, tokens and raw values (extra_keys, SGLang metadata) are copied
 * into the batch's arena, so nothing points into the input.
 *
 * Bounded allocation without a separate pre-check pass. The decoder checks
 * what wire_precheck checks, at the header it is about to use:
 *   - every array/map header: count <= max_elems, running sum of counts <=
 *     max_total, nesting <= max_depth, and count (maps: 2 x pairs) <= the
 *     bytes that remain (every element takes at least one byte);
 *   - every str/bin it reads: length <= max_str and <= the bytes that remain;
 *   - values it does not interpret (unknown keys, extra_keys and metadata
 *     kept raw, extra array elements, batch extras) are skipped with
 *     wire_walk, the pre-check's own loop, at their real depth and adding
 *     to the same sum, so nesting below them is bounded too;
 *   - the payload is at most max_bytes, with no trailing bytes.
 * Every allocation is sized from a count or length that has already passed
 * the "fits in the bytes that remain" check: hashes 24 B and tokens 8 B per
 * declared element (each >= 1 input byte), copies of str/bin/raw spans of
 * the input, and the event table, sized min(declared count, bytes left / 15
 * + 1) events (no event decodes in fewer than 15 bytes: ["BlockRemoved",
 * []], so a table that size always has the slot the next event needs). So
 * the arena stays within ~40 bytes per input byte whatever the header claims
 * (`dd ff ff ff ff` costs nothing: 2^32 elements do not fit in 0 bytes).
 * A message the decoder accepts therefore passes wire_precheck too: the two
 * check the same things over the same values.
 *
 * Error precedence: when decoding fails (wrong type, unknown event, out of
 * memory, or a structural check), wire_precheck runs over the whole input
 * and, if it finds something, its error is reported instead. Errors are
 * then exactly those of the former two-pass decoder (a structural problem
 * anywhere outranks a wrong type before it, and an allocation failure on a
 * message that could never decode reports why it could not), and that pass
 * only costs anything on bad input.
 *
 * Why not msgpack-c's unpacker: its object tree is an intermediate copy (24
 * bytes per token) we would have to walk and copy again, it trusts declared
 * lengths, and it drops the byte spans we need to keep extra_keys and
 * metadata verbatim (re-packing an object is canonical, not exact); the
 * one pass is also the faster (docs/performance.md has the measurements).
 * msgpack-c still turns raw values into JSON (wire_json.c).
 *
 * Batch  = [ts, events, data_parallel_rank?, ...extras ignored]
 * Event  = map {"type": ..., named fields}   (vLLM >= 0.24, SGLang maps)
 *        | array ["BlockStored", positional fields...]   (older layouts)
 * dispatched per event on its msgpack type. Array positions are those of
 * the latest array layout; shorter arrays simply stop earlier (every older
 * layout is a prefix of it). Map keys may come in any order; a map's fields
 * are read into the event whatever its type, and fields that do not belong
 * to the type are cleared once the type is known.
 *
 * Encoding writes msgpack directly: room for the whole batch is reserved
 * once, from upper bounds (event_room), and every value is then stored
 * through a bare cursor with wire_int.h's wire_put_* -- the forms
 * msgpack-c's packer chooses, so the bytes are the packer's (a test
 * compares with the former packer-based encoder on random batches of every
 * form); raw values (extra_keys, metadata) are copied verbatim.
 *
 * Why not msgpack-c's packer: it calls its write callback once per value;
 * even with room reserved up front and a callback that only copies, it
 * stays several times slower than writing through a cursor, and the
 * encoder is a large share of kvo-mocker's trace mode (docs/performance.md).
 */
#include "wire_int.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ======================================================================== */
/* Lifecycle                                                                 */
/* ======================================================================== */

void wire_batch_init(wire_batch *b) {
    memset(b, 0, sizeof(*b));
    kvo_arena_init(&b->arena);
}

void wire_batch_fini(wire_batch *b) {
    kvo_arena_fini(&b->arena);
    memset(b, 0, sizeof(*b));
}

void wire_batch_reset(wire_batch *b) {
    kvo_arena arena = b->arena;
    kvo_arena_reset(&arena);
    memset(b, 0, sizeof(*b));
    b->arena = arena;
}

/* ======================================================================== */
/* Names                                                                     */
/* ======================================================================== */

static const char *const format_names[WIRE_FMT_COUNT] = {
    [WIRE_FMT_MAP] = "map",
    [WIRE_FMT_MAP_NEXT] = "map-next",
    [WIRE_FMT_ARRAY_V0_9_0] = "array-v0.9.0",
    [WIRE_FMT_ARRAY_V0_9_1] = "array-v0.9.1",
    [WIRE_FMT_ARRAY_V0_10_2] = "array-v0.10.2",
    [WIRE_FMT_ARRAY_V0_14] = "array-v0.14",
    [WIRE_FMT_ARRAY_LATE] = "array-late",
};

/* Accepts the DESIGN §3 names and the vectors' profile names ("vllm-map"). */
kvo_status wire_format_parse(const char *name, wire_format *out) {
    if (!name) return KVO_EINVAL;
    if (strncmp(name, "vllm-", 5) == 0) name += 5;
    for (int f = 0; f < WIRE_FMT_COUNT; f++) {
        if (strcmp(name, format_names[f]) == 0) {
            *out = (wire_format)f;
            return KVO_OK;
        }
    }
    return KVO_EINVAL;
}

const char *wire_format_name(wire_format f) {
    if ((unsigned)f >= WIRE_FMT_COUNT) return "unknown";
    return format_names[f];
}

static const char *const type_names[] = {
    [WIRE_EV_STORED] = "BlockStored",
    [WIRE_EV_REMOVED] = "BlockRemoved",
    [WIRE_EV_CLEARED] = "AllBlocksCleared",
};

const char *wire_ev_type_name(wire_ev_type t) {
    if (t < WIRE_EV_STORED || t > WIRE_EV_CLEARED) return "unknown";
    return type_names[t];
}

/* ======================================================================== */
/* ZMQ sequence frame                                                        */
/* ======================================================================== */

void wire_seq_put(uint8_t out[8], uint64_t seq) {
    for (int i = 7; i >= 0; i--) {
        out[i] = (uint8_t)seq;
        seq >>= 8;
    }
}

kvo_status wire_seq_get(const uint8_t *p, size_t len, uint64_t *seq) {
    if (!p || len != 8) return KVO_EPROTO;
    *seq = wire_be(p, 8);
    return KVO_OK;
}

/* ======================================================================== */
/* Decoder                                                                   */
/* ======================================================================== */

/* The smallest event that decodes: ["BlockRemoved", []] (an array event of
 * BlockRemoved needs its tag and its hashes). The event table is sized from
 * the declared count, but never beyond what the bytes left could hold. */
#define MIN_EVENT_BYTES 15u

/* Map keys and array positions share one field list. Array position of a
 * BlockStored field = its index (0 is the tag); BlockRemoved has its own
 * positions (removed_pos). The order is also the order writers put map keys
 * in, which the key lookup exploits. */
typedef enum field {
    F_TYPE = 0,
    F_HASHES,
    F_PARENT,
    F_TOKENS,
    F_BLOCK_SIZE,
    F_LORA_ID,
    F_MEDIUM,
    F_LORA_NAME,
    F_EXTRA_KEYS,
    F_GROUP_IDX,
    F_SPEC_KIND,
    F_SPEC_WINDOW,
    F_LOCALITY,
    F_OWNERSHIP,
    F_SESSION_ID,
    F_CACHE_SALT,
    F_ORIGIN,
    F_COUNT
} field;

static const struct {
    const char *name;
    uint8_t len;
} field_names[F_COUNT] = {
#define K(s)                                                                   \
    { s, sizeof(s) - 1 }
    [F_TYPE] = K("type"),
    [F_HASHES] = K("block_hashes"),
    [F_PARENT] = K("parent_block_hash"),
    [F_TOKENS] = K("token_ids"),
    [F_BLOCK_SIZE] = K("block_size"),
    [F_LORA_ID] = K("lora_id"),
    [F_MEDIUM] = K("medium"),
    [F_LORA_NAME] = K("lora_name"),
    [F_EXTRA_KEYS] = K("extra_keys"),
    [F_GROUP_IDX] = K("group_idx"),
    [F_SPEC_KIND] = K("kv_cache_spec_kind"),
    [F_SPEC_WINDOW] = K("kv_cache_spec_sliding_window"),
    [F_LOCALITY] = K("locality"),
    [F_OWNERSHIP] = K("ownership"),
    [F_SESSION_ID] = K("session_id"),
    [F_CACHE_SALT] = K("cache_salt"),
    [F_ORIGIN] = K("origin"),
#undef K
};

/* Array layouts: BlockStored positions 1..11 are F_HASHES..F_SPEC_WINDOW;
 * BlockRemoved's are these. */
static const field removed_pos[] = {F_TYPE, F_HASHES, F_MEDIUM, F_GROUP_IDX};
#define STORED_ARRAY_FIELDS 12u /* tag + 11 */

/* Fields a type does not have (cleared once the type is known). */
#define BIT(f) (1u << (f))
#define STORED_ONLY                                                            \
    (BIT(F_PARENT) | BIT(F_TOKENS) | BIT(F_BLOCK_SIZE) | BIT(F_LORA_ID) |      \
     BIT(F_LORA_NAME) | BIT(F_EXTRA_KEYS) | BIT(F_SPEC_KIND) |                 \
     BIT(F_SPEC_WINDOW) | BIT(F_SESSION_ID) | BIT(F_CACHE_SALT) |              \
     BIT(F_ORIGIN))
#define REMOVED_FIELDS                                                         \
    (BIT(F_HASHES) | BIT(F_MEDIUM) | BIT(F_GROUP_IDX) | BIT(F_LOCALITY) |      \
     BIT(F_OWNERSHIP))

/* Nesting of what the decoder reads (the batch itself is depth 1). */
enum { DEPTH_BATCH = 1, DEPTH_EVENTS, DEPTH_EVENT, DEPTH_FIELD };

typedef struct dec {
    wire_rd r;
    wire_batch *b;
    kvo_err *err;
    uint32_t ev; /* index of the event being decoded */
    const wire_limits *lim;
    uint64_t total; /* container sizes so far (lim->max_total) */
} dec;

static const char *found_name(const dec *d) {
    int c = wire_rd_peek(&d->r);
    return c < 0 ? "end of input" : wire_mp_type_name((uint8_t)c);
}

/* "events[3].token_ids[17]: expected int, got str". idx < 0: no index. */
static kvo_status fail_field(dec *d, kvo_status st, field f, long idx,
                             const char *what) {
    char path[96];
    int n = snprintf(path, sizeof(path), "events[%" PRIu32 "].%s", d->ev,
                     field_names[f].name);
    if (idx >= 0 && n > 0 && (size_t)n < sizeof(path))
        snprintf(path + n, sizeof(path) - (size_t)n, "[%ld]", idx);
    if (st == KVO_ETRUNC)
        return kvo_err_set(d->err, st, d->r.pos, "%s: input ends", path);
    if (st == KVO_ETOOBIG)
        return kvo_err_set(d->err, st, d->r.pos, "%s: over a limit", path);
    if (!what)
        return kvo_err_set(d->err, st, d->r.pos, "%s: unexpected %s", path,
                           found_name(d));
    return kvo_err_set(d->err, st, d->r.pos, "%s: expected %s, got %s", path,
                       what, found_name(d));
}

static kvo_status nomem(dec *d) {
    return kvo_err_set(d->err, KVO_ENOMEM, d->r.pos, "out of memory");
}

/* ---- Structure, checked as it is read ------------------------------------
 * What wire_precheck checks, at the point the decoder reaches it: a
 * container's count against max_elems, max_total and the bytes left, its
 * depth against max_depth; a str/bin length against max_str (the cursor
 * checks it fits). Values the decoder does not interpret (unknown keys, raw
 * values, extra elements) are walked with wire_walk, which applies the same
 * checks below them. So every allocation is sized from a count already
 * proven to fit in the input. */

/* Why a container header read at `at` failed its checks (cold path). */
static kvo_status container_fail(dec *d, size_t at, bool map, uint32_t n,
                                 unsigned depth) {
    const wire_limits *lim = d->lim;
    const char *what = map ? "map" : "array";
    kvo_status st = KVO_OK;
    if (n > lim->max_elems)
        st = kvo_err_set(d->err, KVO_ETOOBIG, at,
                         "%s of %" PRIu32 " elements exceeds limit %" PRIu32,
                         what, n, lim->max_elems);
    else if (d->total > lim->max_total)
        st = kvo_err_set(d->err, KVO_ETOOBIG, at,
                         "message holds more than %" PRIu64 " elements in all",
                         lim->max_total);
    else if (depth > lim->max_depth)
        st = kvo_err_set(d->err, KVO_ETOOBIG, at,
                         "nesting deeper than %" PRIu32, lim->max_depth);
    else
        st = kvo_err_set(d->err, KVO_ETRUNC, at,
                         "%s declares %" PRIu32
                         " elements but only %zu bytes remain",
                         what, n, d->r.len - d->r.pos);
    d->r.pos = at;
    return st;
}

/* Array (map = false) or map header at the cursor, at nesting depth. On
 * failure pos is unchanged and err says why (callers may say it better). */
static inline kvo_status rd_container(dec *d, bool map, unsigned depth,
                                      uint32_t *n) {
    size_t at = d->r.pos;
    kvo_status st = wire_rd_container(&d->r, map, n);
    if (st != KVO_OK)
        return kvo_err_set(d->err, st, at, "expected %s, got %s",
                           map ? "map" : "array", found_name(d));
    const wire_limits *lim = d->lim;
    d->total += *n;
    uint64_t items = map ? 2 * (uint64_t)*n : *n;
    if (*n > lim->max_elems || d->total > lim->max_total ||
        depth > lim->max_depth || items > d->r.len - d->r.pos)
        return container_fail(d, at, map, *n, depth);
    return KVO_OK;
}

/* str or bin that is not a short str, or any failure (cold path). */
static kvo_status blob_slow(dec *d, bool bin, const uint8_t **p, uint32_t *n) {
    size_t at = d->r.pos;
    const char *what = bin ? "bin" : "str";
    kvo_status st = wire_rd_blob(&d->r, bin, p, n);
    if (st != KVO_OK)
        return kvo_err_set(d->err, st, at, "expected %s, got %s", what,
                           found_name(d));
    if (*n > d->lim->max_str) {
        d->r.pos = at;
        return kvo_err_set(d->err, KVO_ETOOBIG, at,
                           "%s of %" PRIu32 " bytes exceeds limit %" PRIu32,
                           what, *n, d->lim->max_str);
    }
    return KVO_OK;
}

/* str (bin = false) or bin, pointing into the input; errors as above.
 * Keys, type names and media are fixstr: read inline. */
static inline kvo_status rd_blob(dec *d, bool bin, const uint8_t **p,
                                 uint32_t *n) {
    size_t pos = d->r.pos;
    if (!bin && pos < d->r.len) {
        uint8_t b = d->r.buf[pos];
        uint32_t len = b & 0x1fu;
        if ((b & 0xe0) == 0xa0 && len < d->r.len - pos &&
            len <= d->lim->max_str) {
            *p = d->r.buf + pos + 1;
            *n = len;
            d->r.pos = pos + 1 + len;
            return KVO_OK;
        }
    }
    return blob_slow(d, bin, p, n);
}

/* Skip one value held by a container at `depth`. */
static kvo_status skip_value(dec *d, unsigned depth) {
    return wire_walk(d->r.buf, d->r.len, &d->r.pos, depth, &d->total, d->lim,
                     KVO_ETRUNC, d->err);
}

/* n bytes of input equal a name of n bytes: for the short names here, two
 * overlapping loads per side instead of a memcmp call. */
static inline bool same_name(const uint8_t *k, const char *name, uint32_t n) {
    if (n >= 8 && n <= 16) {
        uint64_t a, b, c, e;
        memcpy(&a, k, 8);
        memcpy(&b, name, 8);
        memcpy(&c, k + n - 8, 8);
        memcpy(&e, name + n - 8, 8);
        return a == b && c == e;
    }
    if (n >= 4 && n < 8) {
        uint32_t a, b, c, e;
        memcpy(&a, k, 4);
        memcpy(&b, name, 4);
        memcpy(&c, k + n - 4, 4);
        memcpy(&e, name + n - 4, 4);
        return a == b && c == e;
    }
    return memcmp(k, name, n) == 0;
}

/* ---- Fields --------------------------------------------------------------*/

/* A block hash: any int (two's-complement key) or bin/str bytes (last 8
 * bytes big-endian). nil only when nil_ok. */
static kvo_status get_hash(dec *d, field f, long idx, bool nil_ok,
                           wire_hash *h) {
    memset(h, 0, sizeof(*h));
    if (nil_ok && wire_rd_nil(&d->r)) return KVO_OK;
    bool neg;
    uint64_t v;
    kvo_status st = wire_rd_int(&d->r, &neg, &v);
    if (st == KVO_OK) {
        h->kind = neg ? WIRE_HASH_INT : WIRE_HASH_UINT;
        h->key = v;
        return KVO_OK;
    }
    const uint8_t *p = NULL;
    uint32_t n = 0;
    if (st == KVO_EPROTO) {
        st = rd_blob(d, true, &p, &n);
        if (st == KVO_EPROTO) st = rd_blob(d, false, &p, &n);
    }
    if (st != KVO_OK)
        return fail_field(d, st, f, idx,
                          nil_ok ? "int, bin or nil" : "int or bin");
    uint8_t *copy = kvo_arena_memdup(&d->b->arena, p, n);
    if (!copy) return nomem(d);
    h->kind = WIRE_HASH_BYTES;
    h->len = n;
    h->bytes = copy;
    h->key = wire_be(p + (n > 8 ? n - 8 : 0), n > 8 ? 8 : n);
    return KVO_OK;
}

static kvo_status get_hashes(dec *d, wire_event *e) {
    uint32_t n = 0;
    kvo_status st = rd_container(d, false, DEPTH_FIELD, &n);
    if (st != KVO_OK) return fail_field(d, st, F_HASHES, -1, "array");
    wire_hash *hs = kvo_arena_alloc(&d->b->arena, (size_t)n * sizeof(*hs));
    if (!hs) return nomem(d);
    for (uint32_t i = 0; i < n; i++) {
        st = get_hash(d, F_HASHES, (long)i, false, &hs[i]);
        if (st != KVO_OK) return st;
    }
    e->hashes = hs;
    e->n_hashes = n;
    return KVO_OK;
}

/* Token ids: non-negative ints of any width. The hot loop of the decoder:
 * it keeps the cursor in locals (stores to t[] could alias r->pos) and
 * reads the widths vocabularies use (fixint, uint16, uint32) inline. */
static kvo_status get_tokens(dec *d, wire_event *e) {
    uint32_t n = 0;
    kvo_status st = rd_container(d, false, DEPTH_FIELD, &n);
    if (st != KVO_OK) return fail_field(d, st, F_TOKENS, -1, "array");
    uint64_t *t = kvo_arena_alloc(&d->b->arena, (size_t)n * sizeof(*t));
    if (!t) return nomem(d);
    const uint8_t *buf = d->r.buf;
    size_t pos = d->r.pos, len = d->r.len;
    size_t fast_end = len > 4 ? len - 4 : 0; /* pos < fast_end: 5 bytes */
    uint32_t i = 0;
    while (i < n) {
        /* A run of uint16 ids (all of a vocabulary under 65,536 but the
         * first 128): its headers sit 3 bytes apart, so they are found
         * with loads that do not wait on each other, and read the same. */
        uint32_t run = 0;
        while (i + run < n && 3 * (size_t)(run + 1) <= len - pos &&
               buf[pos + 3 * (size_t)run] == 0xcd)
            run++;
        for (uint32_t k = 0; k < run; k++)
            t[i + k] = wire_be_w(buf + pos + 3 * (size_t)k + 1, 2);
        i += run;
        pos += 3 * (size_t)run;
        while (i < n && pos < fast_end) {
            uint8_t b = buf[pos];
            if (b <= 0x7f) {
                t[i++] = b;
                pos += 1;
            } else if ((uint8_t)(b - 0xcd) < 2) {
                /* uint16 and uint32 mix at random in real prompts: read
                 * both without a data-dependent branch (4 bytes, shifted
                 * for cd), the next position one add away from b. */
                unsigned wide = (unsigned)(b - 0xcd); /* cd 0, ce 1 */
                t[i++] = wire_be_w(buf + pos + 1, 4) >> (16 - 16 * wide);
                pos += 3 + 2 * wide;
            } else {
                break;
            }
        }
        if (i == n) break;
        d->r.pos = pos; /* anything else, and the last bytes */
        bool neg;
        st = wire_rd_int(&d->r, &neg, &t[i]);
        if (st != KVO_OK) return fail_field(d, st, F_TOKENS, (long)i, "int");
        if (neg) {
            d->r.pos = pos; /* point the error at the value */
            return fail_field(d, KVO_EPROTO, F_TOKENS, (long)i,
                              "non-negative int");
        }
        pos = d->r.pos;
        i++;
    }
    d->r.pos = pos;
    e->token_ids = t;
    e->n_tokens = n;
    return KVO_OK;
}

static kvo_status get_opt_int(dec *d, field f, wire_int *out) {
    out->set = false;
    out->v = 0;
    if (wire_rd_nil(&d->r)) return KVO_OK;
    size_t at = d->r.pos;
    bool neg;
    uint64_t v;
    kvo_status st = wire_rd_int(&d->r, &neg, &v);
    if (st != KVO_OK) return fail_field(d, st, f, -1, "int or nil");
    if (!neg && v > (uint64_t)INT64_MAX) {
        d->r.pos = at;
        return fail_field(d, KVO_EPROTO, f, -1, "int in signed 64-bit range");
    }
    out->set = true;
    out->v = (int64_t)v;
    return KVO_OK;
}

static kvo_status get_opt_str(dec *d, field f, wire_str *out) {
    out->p = NULL;
    out->len = 0;
    if (wire_rd_nil(&d->r)) return KVO_OK;
    const uint8_t *p = NULL;
    uint32_t n = 0;
    kvo_status st = rd_blob(d, false, &p, &n);
    if (st != KVO_OK) return fail_field(d, st, f, -1, "str or nil");
    char *s = kvo_arena_alloc(&d->b->arena, (size_t)n + 1);
    if (!s) return nomem(d);
    memcpy(s, p, n);
    s[n] = '\0'; /* convenience; len is what counts */
    out->p = s;
    out->len = n;
    return KVO_OK;
}

/* Any value, kept as its exact bytes; nil = absent. */
static kvo_status get_raw(dec *d, field f, wire_raw *out) {
    out->p = NULL;
    out->len = 0;
    if (wire_rd_nil(&d->r)) return KVO_OK;
    size_t at = d->r.pos;
    kvo_status st = skip_value(d, DEPTH_EVENT);
    if (st != KVO_OK) return st;
    size_t n = d->r.pos - at;
    uint8_t *p = kvo_arena_memdup(&d->b->arena, d->r.buf + at, n);
    if (!p) return nomem(d);
    out->p = p;
    out->len = (uint32_t)n;
    return KVO_OK;
}

static kvo_status get_type(dec *d, wire_ev_type *out) {
    const uint8_t *p = NULL;
    uint32_t n = 0;
    size_t at = d->r.pos;
    kvo_status st = rd_blob(d, false, &p, &n);
    if (st != KVO_OK) return fail_field(d, st, F_TYPE, -1, "str");
    /* The three names differ in length. */
    wire_ev_type t = n == 11   ? WIRE_EV_STORED
                     : n == 12 ? WIRE_EV_REMOVED
                     : n == 16 ? WIRE_EV_CLEARED
                               : (wire_ev_type)0;
    if (t && same_name(p, type_names[t], n)) {
        *out = t;
        return KVO_OK;
    }
    /* Skipping an event type we do not know would lose events silently. */
    return kvo_err_set(d->err, KVO_EPROTO, at,
                       "events[%" PRIu32 "]: unknown event type \"%.*s\"",
                       d->ev, (int)(n > 40 ? 40 : n), (const char *)p);
}

/* One field value at the cursor into e. */
static kvo_status get_field(dec *d, field f, wire_event *e) {
    /* clang-format off */
    switch (f) {
    case F_TYPE: return get_type(d, &e->type);
    case F_HASHES: return get_hashes(d, e);
    case F_PARENT: return get_hash(d, F_PARENT, -1, true, &e->parent);
    case F_TOKENS: return get_tokens(d, e);
    case F_BLOCK_SIZE: return get_opt_int(d, f, &e->block_size);
    case F_LORA_ID: return get_opt_int(d, f, &e->lora_id);
    case F_MEDIUM: return get_opt_str(d, f, &e->medium);
    case F_LORA_NAME:
        /* SGLang puts a metadata map in this slot; decide by type. */
        if (e->layout == WIRE_LAYOUT_ARRAY) {
            int c = wire_rd_peek(&d->r);
            if (c >= 0 && (((c & 0xf0) == 0x80) || c == 0xde || c == 0xdf))
                return get_raw(d, f, &e->metadata);
        }
        return get_opt_str(d, f, &e->lora_name);
    case F_EXTRA_KEYS: return get_raw(d, f, &e->extra_keys);
    case F_GROUP_IDX: return get_opt_int(d, f, &e->group_idx);
    case F_SPEC_KIND: return get_opt_str(d, f, &e->kv_cache_spec_kind);
    case F_SPEC_WINDOW:
        return get_opt_int(d, f, &e->kv_cache_spec_sliding_window);
    case F_LOCALITY: return get_opt_str(d, f, &e->locality);
    case F_OWNERSHIP: return get_opt_str(d, f, &e->ownership);
    case F_SESSION_ID: return get_opt_str(d, f, &e->session_id);
    case F_CACHE_SALT: return get_opt_str(d, f, &e->cache_salt);
    case F_ORIGIN: return get_opt_str(d, f, &e->origin);
    default: return KVO_EINVAL;
    }
    /* clang-format on */
}

/* Keep only the fields the event's type has. */
static void clear_foreign_fields(wire_event *e) {
    wire_event keep = *e;
    memset(e, 0, sizeof(*e));
    e->type = keep.type;
    e->layout = keep.layout;
    e->array_len = keep.array_len;
    e->map_len = keep.map_len;
    if (keep.type == WIRE_EV_CLEARED) return;
    e->n_hashes = keep.n_hashes;
    e->hashes = keep.hashes;
    e->medium = keep.medium;
    e->group_idx = keep.group_idx;
    e->locality = keep.locality;
    e->ownership = keep.ownership;
    if (keep.type == WIRE_EV_REMOVED) return;
    *e = keep;
}

/* The field a map key names, F_COUNT if none. The search starts at the
 * field writers put next (key_after) and usually hits at once; length and
 * first byte settle every other candidate (no two names share both). */
static field find_field(const uint8_t *k, uint32_t n, unsigned from) {
    for (unsigned i = 0; i < F_COUNT; i++) {
        unsigned j = from + i < F_COUNT ? from + i : from + i - F_COUNT;
        if (field_names[j].len == n && field_names[j].name[0] == k[0] &&
            same_name(k, field_names[j].name, n))
            return (field)j;
    }
    return F_COUNT;
}

/* The key writers put after f: the next field (the encoder's map_stored
 * order is field order), except that BlockRemoved has only its own. */
static unsigned key_after(wire_ev_type t, field f) {
    if (t == WIRE_EV_REMOVED) {
        /* clang-format off */
        switch (f) {
        case F_HASHES: return F_MEDIUM;
        case F_MEDIUM: return F_GROUP_IDX;
        case F_GROUP_IDX: return F_LOCALITY;
        default: break;
        }
        /* clang-format on */
    }
    return f + 1 < F_COUNT ? f + 1 : 0;
}

static kvo_status decode_map_event(dec *d, size_t start, wire_event *e) {
    uint32_t n = 0;
    kvo_status st = rd_container(d, true, DEPTH_EVENT, &n);
    if (st != KVO_OK) return st;
    e->layout = WIRE_LAYOUT_MAP;
    e->map_len = n;
    uint32_t seen = 0;
    unsigned next = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *k = NULL;
        uint32_t klen = 0;
        st = rd_blob(d, false, &k, &klen);
        if (st != KVO_OK)
            return kvo_err_set(d->err, st, d->r.pos,
                               "events[%" PRIu32 "]: expected str key, got %s",
                               d->ev, found_name(d));
        field f = klen ? find_field(k, klen, next) : F_COUNT;
        if (f == F_COUNT) { /* unknown keys are ignored */
            st = skip_value(d, DEPTH_EVENT);
            if (st != KVO_OK) return st;
            continue;
        }
        st = get_field(d, f, e);
        if (st != KVO_OK) return st;
        seen |= BIT(f);
        next = key_after(e->type, f);
    }
    if (!(seen & BIT(F_TYPE)))
        return kvo_err_set(d->err, KVO_EPROTO, start,
                           "events[%" PRIu32 "]: map without \"type\"", d->ev);
    const char *missing = NULL;
    if (e->type != WIRE_EV_CLEARED && !(seen & BIT(F_HASHES)))
        missing = "block_hashes";
    else if (e->type == WIRE_EV_STORED && !(seen & BIT(F_TOKENS)))
        missing = "token_ids";
    if (missing)
        return kvo_err_set(d->err, KVO_EPROTO, start,
                           "events[%" PRIu32 "]: %s without %s", d->ev,
                           type_names[e->type], missing);
    uint32_t own = e->type == WIRE_EV_STORED    ? ~0u
                   : e->type == WIRE_EV_REMOVED ? BIT(F_TYPE) | REMOVED_FIELDS
                                                : BIT(F_TYPE);
    if (seen & ~own) clear_foreign_fields(e);
    return KVO_OK;
}

static kvo_status decode_array_event(dec *d, size_t start, wire_event *e) {
    uint32_t n = 0;
    kvo_status st = rd_container(d, false, DEPTH_EVENT, &n);
    if (st != KVO_OK) return st;
    e->layout = WIRE_LAYOUT_ARRAY;
    e->array_len = n;
    if (n == 0)
        return kvo_err_set(d->err, KVO_EPROTO, start,
                           "events[%" PRIu32 "]: empty array", d->ev);
    st = get_type(d, &e->type);
    if (st != KVO_OK) return st;
    uint32_t known = 1, need = 1;
    if (e->type == WIRE_EV_STORED) {
        known = STORED_ARRAY_FIELDS;
        need = 1 + F_TOKENS; /* tag, hashes, parent, tokens */
    } else if (e->type == WIRE_EV_REMOVED) {
        known = KVO_ARRAY_LEN(removed_pos);
        need = 2; /* tag, hashes */
    }
    if (n < need)
        return kvo_err_set(d->err, KVO_EPROTO, start,
                           "events[%" PRIu32 "]: %s array of %" PRIu32
                           " elements, need at least %" PRIu32,
                           d->ev, type_names[e->type], n, need);
    for (uint32_t i = 1; i < n; i++) {
        if (i >= known) { /* newer fields we do not know: ignored */
            st = skip_value(d, DEPTH_EVENT);
            if (st != KVO_OK) return st;
            continue;
        }
        field f = e->type == WIRE_EV_STORED ? (field)i : removed_pos[i];
        st = get_field(d, f, e);
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

static kvo_status decode_event(dec *d, wire_event *e) {
    size_t start = d->r.pos;
    int c = wire_rd_peek(&d->r);
    if (c >= 0 && ((c & 0xf0) == 0x80 || c == 0xde || c == 0xdf))
        return decode_map_event(d, start, e);
    if (c >= 0 && ((c & 0xf0) == 0x90 || c == 0xdc || c == 0xdd))
        return decode_array_event(d, start, e);
    return kvo_err_set(d->err, c < 0 ? KVO_ETRUNC : KVO_EPROTO, start,
                       "events[%" PRIu32 "]: expected map or array, got %s",
                       d->ev, found_name(d));
}

static kvo_status decode_batch(dec *d) {
    wire_batch *b = d->b;
    wire_rd *r = &d->r;
    uint32_t n = 0;
    kvo_status st = rd_container(d, false, DEPTH_BATCH, &n);
    if (st == KVO_EPROTO || (st == KVO_OK && n < 2))
        return kvo_err_set(d->err, KVO_EPROTO, 0,
                           "batch: expected an array of at least 2 elements "
                           "[ts, events, dp_rank], got %s",
                           st == KVO_OK ? "a shorter array" : found_name(d));
    if (st != KVO_OK) return st;
    b->batch_len = n;
    st = wire_rd_double(r, &b->ts);
    if (st != KVO_OK)
        return kvo_err_set(d->err, st, r->pos, "ts: expected float, got %s",
                           found_name(d));
    size_t at = r->pos;
    uint32_t n_ev = 0;
    st = rd_container(d, false, DEPTH_EVENTS, &n_ev);
    if (st != KVO_OK)
        return kvo_err_set(d->err, st, at, "events: expected array, got %s",
                           found_name(d));
    /* Room for every event the bytes left could hold (see MIN_EVENT_BYTES):
     * the declared count in a real batch, never more than ~20 bytes of
     * table per input byte for a lying one. */
    size_t cap = (r->len - r->pos) / MIN_EVENT_BYTES + 1;
    if (cap > n_ev) cap = n_ev;
    wire_event *evs = NULL;
    if (cap) {
        /* One memset for the table: per event, its start-up cost was a
         * quarter of the decoder's own time on small events. */
        evs = kvo_arena_alloc(&b->arena, cap * sizeof(*evs));
        if (!evs) return nomem(d);
        memset(evs, 0, cap * sizeof(*evs));
    }
    for (d->ev = 0; d->ev < n_ev; d->ev++) {
        if (d->ev == cap) /* more events than bytes: cannot happen */
            return kvo_err_set(d->err, KVO_EPROTO, r->pos,
                               "events[%" PRIu32 "]: past the end", d->ev);
        st = decode_event(d, &evs[d->ev]);
        if (st != KVO_OK) return st;
    }
    b->events = evs;
    b->n_events = n_ev;
    if (n >= 3) {
        at = r->pos;
        bool neg;
        uint64_t v;
        if (!wire_rd_nil(r)) {
            st = wire_rd_int(r, &neg, &v);
            if (st != KVO_OK)
                return kvo_err_set(d->err, st, at,
                                   "data_parallel_rank: expected int or nil, "
                                   "got %s",
                                   found_name(d));
            if (!neg && v > (uint64_t)INT64_MAX)
                return kvo_err_set(
                    d->err, KVO_EPROTO, at,
                    "data_parallel_rank: %" PRIu64 " out of range", v);
            b->dp_rank.set = true;
            b->dp_rank.v = (int64_t)v;
        }
    }
    for (uint32_t i = 3; i < n; i++) { /* extras of future versions */
        st = skip_value(d, DEPTH_BATCH);
        if (st != KVO_OK) return st;
    }
    if (r->pos != r->len)
        return kvo_err_set(d->err, KVO_EPROTO, r->pos,
                           "%zu trailing bytes after the value",
                           r->len - r->pos);
    return KVO_OK;
}

kvo_status wire_batch_decode(const uint8_t *buf, size_t len,
                             const wire_limits *lim, wire_batch *b,
                             kvo_err *err) {
    wire_batch_reset(b);
    if (!buf && len) return kvo_err_set(err, KVO_EINVAL, 0, "no input");
    wire_limits def;
    if (!lim) {
        wire_limits_default(&def);
        lim = &def;
    }
    kvo_status st = KVO_ETOOBIG;
    if (len <= lim->max_bytes) {
        dec d = {.r = {buf, len, 0}, .b = b, .err = err, .lim = lim};
        st = decode_batch(&d);
    }
    if (st != KVO_OK) {
        wire_batch_reset(b);
        /* Report what the structural pre-check finds first, as if it had
         * run before decoding: a broken structure anywhere outranks what the
         * decoder tripped over (a wrong type, an allocation failure). */
        kvo_err pre;
        if (wire_precheck(buf, len, lim, NULL, &pre) != KVO_OK) {
            if (err) *err = pre;
            st = pre.status;
        }
    }
    return st;
}

/* ======================================================================== */
/* Encoder                                                                   */
/* ======================================================================== */

/* Room (see the file header): ROOM_FIELD bounds one field apart from its
 * variable bytes -- key (<= 1 + 28) plus an int (9), a str/bin/array header
 * (5) or a type name (17) -- and also the writes that go past what they
 * keep (a key or type name is one 32-byte copy; a token id, 9 bytes of
 * room, is one 5-byte write), so no write leaves the reserved room. */
#define ROOM_FIELD 48u
#define ROOM_BATCH 32u /* array header, ts, events header, dp_rank */

typedef struct enc {
    wire_format fmt;
    unsigned flags;
} enc;

static inline uint8_t *put_nil(uint8_t *p) {
    *p = 0xc0;
    return p + 1;
}

static uint8_t *put_str(uint8_t *p, wire_str s) {
    return s.p ? wire_put_blob(p, false, s.p, s.len) : put_nil(p);
}

static uint8_t *put_int(uint8_t *p, wire_int v) {
    return v.set ? wire_put_int(p, v.v) : put_nil(p);
}

static uint8_t *put_raw(uint8_t *p, wire_raw v) {
    if (!v.p) return put_nil(p);
    if (v.len) memcpy(p, v.p, v.len);
    return p + v.len;
}

/* wire_put_uint for token ids. Ids of a 100k+ vocabulary take 2 or 4 bytes
 * at random, and a branch between the two forms mispredicts half the time,
 * so that choice is made without one (the rest -- ids below 256 or above
 * 32 bits -- is rare). Writes 5 bytes whatever the form (room: 9). */
static inline uint8_t *put_token(uint8_t *p, uint64_t v) {
    if (v - 0x100 > 0xffffffffu - 0x100) return wire_put_uint(p, v);
    unsigned wide = v > 0xffff; /* ce, else cd */
    p[0] = (uint8_t)(0xcd + wide);
    wire_put_be(p + 1, v << (wide ? 0 : 16), 4); /* cd: 2 bytes, then 0s */
    return p + 3 + 2 * wide;
}

static inline uint8_t *put_hash(uint8_t *p, const wire_hash *h) {
    /* clang-format off */
    switch (h->kind) {
    case WIRE_HASH_UINT: return wire_put_uint(p, h->key);
    case WIRE_HASH_INT: return wire_put_int(p, (int64_t)h->key);
    case WIRE_HASH_BYTES: return wire_put_blob(p, true, h->bytes, h->len);
    default: return put_nil(p);
    }
    /* clang-format on */
}

/* Map keys and type names as written: fixstr header and name, padded to 32
 * bytes so that each is one fixed-size copy (a copy of the name's own
 * length became a rep movs whose start-up cost more than the rest of the
 * key). The room of a field covers the padding. */
/* clang-format off */
static const char key_bytes[F_COUNT][32] = {
    [F_TYPE] = "\xa4" "type",
    [F_HASHES] = "\xac" "block_hashes",
    [F_PARENT] = "\xb1" "parent_block_hash",
    [F_TOKENS] = "\xa9" "token_ids",
    [F_BLOCK_SIZE] = "\xaa" "block_size",
    [F_LORA_ID] = "\xa7" "lora_id",
    [F_MEDIUM] = "\xa6" "medium",
    [F_LORA_NAME] = "\xa9" "lora_name",
    [F_EXTRA_KEYS] = "\xaa" "extra_keys",
    [F_GROUP_IDX] = "\xa9" "group_idx",
    [F_SPEC_KIND] = "\xb2" "kv_cache_spec_kind",
    [F_SPEC_WINDOW] = "\xbc" "kv_cache_spec_sliding_window",
    [F_LOCALITY] = "\xa8" "locality",
    [F_OWNERSHIP] = "\xa9" "ownership",
    [F_SESSION_ID] = "\xaa" "session_id",
    [F_CACHE_SALT] = "\xaa" "cache_salt",
    [F_ORIGIN] = "\xa6" "origin",
};
static const char type_bytes[][32] = {
    [WIRE_EV_STORED] = "\xab" "BlockStored",
    [WIRE_EV_REMOVED] = "\xac" "BlockRemoved",
    [WIRE_EV_CLEARED] = "\xb0" "AllBlocksCleared",
};
/* clang-format on */

static inline uint8_t *put_fixstr32(uint8_t *p, const char s[32]) {
    memcpy(p, s, 32);
    return p + 1 + (s[0] & 0x1f);
}

static uint8_t *put_field(uint8_t *p, const enc *w, const wire_event *e,
                          field f) {
    /* clang-format off */
    switch (f) {
    case F_TYPE: return put_fixstr32(p, type_bytes[e->type]);
    case F_HASHES:
        p = wire_put_container(p, false, e->n_hashes);
        for (uint32_t i = 0; i < e->n_hashes; i++)
            p = put_hash(p, &e->hashes[i]);
        return p;
    case F_PARENT: return put_hash(p, &e->parent);
    case F_TOKENS: { /* locals: p's byte stores may alias *e */
        const uint64_t *t = e->token_ids;
        uint32_t n = e->n_tokens;
        p = wire_put_container(p, false, n);
        for (uint32_t i = 0; i < n; i++)
            p = put_token(p, t[i]);
        return p;
    }
    case F_BLOCK_SIZE: return put_int(p, e->block_size);
    case F_LORA_ID: return put_int(p, e->lora_id);
    case F_MEDIUM: return put_str(p, e->medium);
    case F_LORA_NAME:
        /* Array formats: SGLang's metadata map takes the lora_name slot. */
        return e->metadata.p && w->fmt >= WIRE_FMT_ARRAY_V0_9_0
                   ? put_raw(p, e->metadata)
                   : put_str(p, e->lora_name);
    case F_EXTRA_KEYS: return put_raw(p, e->extra_keys);
    case F_GROUP_IDX: return put_int(p, e->group_idx);
    case F_SPEC_KIND: return put_str(p, e->kv_cache_spec_kind);
    case F_SPEC_WINDOW: return put_int(p, e->kv_cache_spec_sliding_window);
    case F_LOCALITY: return put_str(p, e->locality);
    case F_OWNERSHIP: return put_str(p, e->ownership);
    case F_SESSION_ID: return put_str(p, e->session_id);
    case F_CACHE_SALT: return put_str(p, e->cache_salt);
    case F_ORIGIN: return put_str(p, e->origin);
    default: return p; /* not reached: f comes from the tables below */
    }
    /* clang-format on */
}

/* Map layout (vLLM >= 0.24), declaration order. Required keys always; the
 * rest only when set (msgspec omit_defaults: their defaults are all None).
 * cache_salt (SGLang's map form) and origin (map-next) are written when set
 * in either map format. SGLang's array-only metadata has no map key and is
 * not written. */
static const field map_stored[] = {
    F_TYPE,       F_HASHES,      F_PARENT,    F_TOKENS,     F_BLOCK_SIZE,
    F_LORA_ID,    F_MEDIUM,      F_LORA_NAME, F_EXTRA_KEYS, F_GROUP_IDX,
    F_SPEC_KIND,  F_SPEC_WINDOW, F_LOCALITY,  F_OWNERSHIP,  F_SESSION_ID,
    F_CACHE_SALT, F_ORIGIN};
#define MAP_STORED_REQUIRED                                                    \
    (BIT(F_TYPE) | BIT(F_HASHES) | BIT(F_PARENT) | BIT(F_TOKENS) |             \
     BIT(F_BLOCK_SIZE) | BIT(F_LORA_ID) | BIT(F_MEDIUM) | BIT(F_LORA_NAME))
static const field map_removed[] = {F_TYPE,      F_HASHES,   F_MEDIUM,
                                    F_GROUP_IDX, F_LOCALITY, F_OWNERSHIP};
#define MAP_REMOVED_REQUIRED (BIT(F_TYPE) | BIT(F_HASHES) | BIT(F_MEDIUM))
static const field map_cleared[] = {F_TYPE};

/* The optional fields that carry a value, as field bits. */
static unsigned fields_set(const wire_event *e) {
    return (unsigned)(e->extra_keys.p != NULL) << F_EXTRA_KEYS |
           (unsigned)e->group_idx.set << F_GROUP_IDX |
           (unsigned)(e->kv_cache_spec_kind.p != NULL) << F_SPEC_KIND |
           (unsigned)e->kv_cache_spec_sliding_window.set << F_SPEC_WINDOW |
           (unsigned)(e->locality.p != NULL) << F_LOCALITY |
           (unsigned)(e->ownership.p != NULL) << F_OWNERSHIP |
           (unsigned)(e->session_id.p != NULL) << F_SESSION_ID |
           (unsigned)(e->cache_salt.p != NULL) << F_CACHE_SALT |
           (unsigned)(e->origin.p != NULL) << F_ORIGIN;
}

static uint8_t *encode_map_event(uint8_t *p, const enc *w,
                                 const wire_event *e) {
    const field *all = map_cleared;
    size_t n_all = 1;
    unsigned keep = BIT(F_TYPE); /* the keys written */
    if (e->type == WIRE_EV_STORED) {
        all = map_stored;
        n_all = KVO_ARRAY_LEN(map_stored);
        keep = MAP_STORED_REQUIRED | fields_set(e);
    } else if (e->type == WIRE_EV_REMOVED) {
        all = map_removed;
        n_all = KVO_ARRAY_LEN(map_removed);
        keep = MAP_REMOVED_REQUIRED | (fields_set(e) & REMOVED_FIELDS);
    }
    uint32_t n = (uint32_t)__builtin_popcount(keep);
    /* msgspec sizes the header by the fields a struct could have: the
     * map-next BlockStored has 16, so it gets a map16 header always. */
    if (w->fmt == WIRE_FMT_MAP_NEXT && e->type == WIRE_EV_STORED) {
        *p = 0xde;
        p = wire_put_be(p + 1, n, 2);
    } else {
        p = wire_put_container(p, true, n);
    }
    bool reverse = w->flags & WIRE_ENC_REVERSE_KEYS;
    for (size_t i = 0; i < n_all; i++) {
        field f = all[reverse ? n_all - 1 - i : i];
        if (!(keep & BIT(f))) continue;
        p = put_fixstr32(p, key_bytes[f]);
        p = put_field(p, w, e, f);
    }
    return p;
}

/* Array layouts: element counts (incl. the tag) per format. */
static void array_lens(wire_format f, uint32_t *stored, uint32_t *removed) {
    /* clang-format off */
    switch (f) {
    case WIRE_FMT_ARRAY_V0_9_0:
    case WIRE_FMT_ARRAY_V0_9_1: *stored = 6, *removed = 2; break;
    case WIRE_FMT_ARRAY_V0_10_2: *stored = 7, *removed = 3; break;
    case WIRE_FMT_ARRAY_V0_14: *stored = 8, *removed = 3; break;
    default: *stored = STORED_ARRAY_FIELDS, *removed = 4; break;
    }
    /* clang-format on */
}

static uint8_t *encode_array_event(uint8_t *p, const enc *w,
                                   const wire_event *e) {
    uint32_t n_stored, n_removed;
    array_lens(w->fmt, &n_stored, &n_removed);
    uint32_t n = e->type == WIRE_EV_STORED    ? n_stored
                 : e->type == WIRE_EV_REMOVED ? n_removed
                                              : 1;
    p = wire_put_container(p, false, n);
    for (uint32_t i = 0; i < n; i++) {
        field f = e->type == WIRE_EV_REMOVED ? removed_pos[i] : (field)i;
        p = put_field(p, w, e, f);
    }
    return p;
}

/* Checks an event and adds the most bytes it can take to *room: a
 * ROOM_FIELD per field its type can have, plus the variable bytes. */
static kvo_status event_room(const wire_event *e, size_t *room) {
    size_t r;
    /* clang-format off */
    switch (e->type) {
    case WIRE_EV_CLEARED: *room += 5 + ROOM_FIELD; return KVO_OK;
    case WIRE_EV_REMOVED:
        r = 5 + KVO_ARRAY_LEN(map_removed) * ROOM_FIELD + e->medium.len +
            e->locality.len + e->ownership.len;
        break;
    case WIRE_EV_STORED:
        if ((e->n_tokens && !e->token_ids) ||
            (e->parent.kind == WIRE_HASH_BYTES && e->parent.len &&
             !e->parent.bytes))
            return KVO_EINVAL;
        r = 5 + KVO_ARRAY_LEN(map_stored) * ROOM_FIELD +
            9 * (size_t)e->n_tokens + e->parent.len + e->medium.len +
            e->lora_name.len + e->metadata.len + e->extra_keys.len +
            e->kv_cache_spec_kind.len + e->locality.len + e->ownership.len +
            e->session_id.len + e->cache_salt.len + e->origin.len;
        break;
    default: return KVO_EINVAL;
    }
    /* clang-format on */
    if (e->n_hashes && !e->hashes) return KVO_EINVAL;
    for (uint32_t i = 0; i < e->n_hashes; i++) {
        const wire_hash *h = &e->hashes[i];
        if (h->kind == WIRE_HASH_NONE ||
            (h->kind == WIRE_HASH_BYTES && h->len && !h->bytes))
            return KVO_EINVAL;
        r += h->kind == WIRE_HASH_BYTES ? 5u + h->len : 9u;
    }
    *room += r;
    return KVO_OK;
}

kvo_status wire_batch_encode(const wire_batch *b, wire_format f, unsigned flags,
                             kvo_buf *out) {
    if (!b || !out || (unsigned)f >= WIRE_FMT_COUNT) return KVO_EINVAL;
    if (b->n_events && !b->events) return KVO_EINVAL;
    size_t room = ROOM_BATCH;
    for (uint32_t i = 0; i < b->n_events; i++)
        if (event_room(&b->events[i], &room) != KVO_OK) return KVO_EINVAL;
    if (kvo_buf_reserve(out, room) != KVO_OK) return KVO_ENOMEM;
    enc w = {.fmt = f, .flags = flags};
    bool is_map = f == WIRE_FMT_MAP || f == WIRE_FMT_MAP_NEXT;
    uint8_t *start = out->data + out->len, *p = start;
    /* vLLM 0.9.0's batch had no rank: [ts, events]. */
    p = wire_put_container(p, false, f == WIRE_FMT_ARRAY_V0_9_0 ? 2 : 3);
    uint64_t ts;
    memcpy(&ts, &b->ts, sizeof(ts));
    *p = 0xcb;
    p = wire_put_be(p + 1, ts, 8);
    p = wire_put_container(p, false, b->n_events);
    for (uint32_t i = 0; i < b->n_events; i++)
        p = is_map ? encode_map_event(p, &w, &b->events[i])
                   : encode_array_event(p, &w, &b->events[i]);
    if (f != WIRE_FMT_ARRAY_V0_9_0) p = put_int(p, b->dp_rank);
    assert((size_t)(p - start) <= room);
    out->len += (size_t)(p - start);
    return KVO_OK;
}
