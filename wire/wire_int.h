/* wire_int.h -- internals shared by the wire/ decoders and encoders (not a
 * public API): the structural pre-check, a bounds-checked msgpack cursor,
 * and the writers of msgpack into reserved room (at the end).
 *
 * wire_precheck: the structural pre-check wire/ decoders run on bytes from a
 * socket or a file BEFORE anything is allocated for them (msgpack-c's
 * unpacker, for one, trusts declared lengths: the 5 bytes `dd ff ff ff ff`
 * make it try to allocate ~128 GiB of objects). The batch decoder, the hot
 * one, makes the same checks as it reads instead (wire_walk below; the
 * argument is in wire_batch.c's header).
 *
 * It walks one msgpack value iteratively (no recursion, no allocation) and
 * checks, against a wire_limits (NULL = wire_limits_default):
 *   - the buffer is at most max_bytes long;
 *   - every array/map count <= max_elems (maps count pairs), and the sum of
 *     all container counts <= max_total;
 *   - nesting depth <= max_depth (a top-level container is depth 1);
 *   - every str/bin/ext length <= max_str;
 *   - every declared length fits in the bytes that remain (a container of n
 *     elements needs at least n bytes, a map of n pairs 2n bytes), so nothing
 *     later can read past the end or size an allocation from a lie;
 *   - no reserved byte (0xc1).
 * A value that passes can be handed to msgpack_unpack_next() or read with
 * the wire_rd_* helpers below: every count is bounded by the bytes that back
 * it, so sizing an allocation from a count is safe.
 *
 * Statuses: KVO_ETRUNC (the input ends inside the value: every strict prefix
 * of a valid message gets this unless a limit fires first), KVO_ETOOBIG (a
 * limit), KVO_EPROTO (reserved byte, trailing bytes). err gets the byte
 * offset of the offending header and a one-line reason.
 *
 * Usage (event-plane decoder, capture reader, anything msgpack):
 *     size_t end;
 *     st = wire_precheck(buf, len, lim, NULL, err);   // exactly one value
 *     st = wire_precheck(buf, len, lim, &end, err);   // one value + more
 * With end == NULL, bytes after the value are an error (KVO_EPROTO).
 */
#ifndef WIRE_INT_H
#define WIRE_INT_H

#include "wire.h"

#include <endian.h>
#include <string.h>

/* Hard ceiling on nesting whatever the limits say (the walk keeps one
 * counter per level on the stack). */
#define WIRE_DEPTH_CEILING 512u

kvo_status wire_precheck(const uint8_t *buf, size_t len, const wire_limits *lim,
                         size_t *end, kvo_err *err);

/* The pre-check's walk over one value starting at buf[*pos], for decoders
 * that check structure as they go: `depth` is the nesting of the container
 * holding the value (0 = top level), *total the container sizes counted so
 * far in this message (added to). Same checks and statuses as wire_precheck
 * (short_st when the input ends: KVO_ETRUNC, or KVO_ETOOBIG when avail was
 * clipped by max_bytes); lim must not be NULL. On success *pos is just past
 * the value. Nothing is allocated. */
kvo_status wire_walk(const uint8_t *buf, size_t avail, size_t *pos,
                     unsigned depth, uint64_t *total, const wire_limits *lim,
                     kvo_status short_st, kvo_err *err);

/* Human name of the msgpack type whose first byte is b ("int", "str",
 * "map", ...), for "expected X, got Y" messages. */
const char *wire_mp_type_name(uint8_t b);

/* "BlockStored", "BlockRemoved", "AllBlocksCleared"; "unknown" otherwise. */
const char *wire_ev_type_name(wire_ev_type t);

/* ---- A bounds-checked msgpack cursor -------------------------------------
 * Reads one value at a time from buf[pos..len). Every helper checks the
 * bytes it needs; on failure it returns KVO_EPROTO (the next value has
 * another type) or KVO_ETRUNC (input ends) and leaves pos where it was, so
 * the caller can name the field and the type found (wire_mp_type_name of
 * buf[pos]) in its own error. Nothing is allocated; str/bin pointers point
 * into buf. */
typedef struct wire_rd {
    const uint8_t *buf;
    size_t len;
    size_t pos;
} wire_rd;

static inline uint64_t wire_be(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Big-endian 1, 2, 4 or 8 bytes (the msgpack widths), without a loop. */
static inline uint64_t wire_be_w(const uint8_t *p, unsigned n) {
    switch (n) {
    case 1: return p[0];
    case 2: return (uint64_t)p[0] << 8 | p[1];
    case 4:
        return (uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 |
               (uint64_t)p[2] << 8 | p[3];
    default:
        return (uint64_t)p[0] << 56 | (uint64_t)p[1] << 48 |
               (uint64_t)p[2] << 40 | (uint64_t)p[3] << 32 |
               (uint64_t)p[4] << 24 | (uint64_t)p[5] << 16 |
               (uint64_t)p[6] << 8 | p[7];
    }
}

/* Next byte without consuming it; -1 at the end. */
static inline int wire_rd_peek(const wire_rd *r) {
    return r->pos < r->len ? r->buf[r->pos] : -1;
}

/* Consumes a nil and returns true; otherwise leaves pos and returns false. */
static inline bool wire_rd_nil(wire_rd *r) {
    if (r->pos < r->len && r->buf[r->pos] == 0xc0) {
        r->pos++;
        return true;
    }
    return false;
}

/* Any msgpack int. *neg says whether it is negative; *v is its 64-bit
 * two's-complement pattern (so uint64 values keep all 64 bits). */
static inline kvo_status wire_rd_int(wire_rd *r, bool *neg, uint64_t *v) {
    if (r->pos >= r->len) return KVO_ETRUNC;
    uint8_t b = r->buf[r->pos];
    if (b <= 0x7f) {
        *neg = false;
        *v = b;
        r->pos++;
        return KVO_OK;
    }
    if (b >= 0xe0) {
        *neg = true;
        *v = (uint64_t)(int64_t)(int8_t)b;
        r->pos++;
        return KVO_OK;
    }
    if (b < 0xcc || b > 0xd3) return KVO_EPROTO;
    unsigned n = 1u << ((b - 0xcc) & 3); /* cc..cf, d0..d3: 1, 2, 4, 8 */
    if (r->len - r->pos - 1 < n) return KVO_ETRUNC;
    uint64_t x = wire_be_w(r->buf + r->pos + 1, n);
    if (b >= 0xd0) { /* signed: sign-extend from n bytes */
        unsigned shift = 64 - 8 * n;
        x = (uint64_t)((int64_t)(x << shift) >> shift);
        *neg = (int64_t)x < 0;
    } else {
        *neg = false;
    }
    *v = x;
    r->pos += 1 + n;
    return KVO_OK;
}

/* Array or map header (map: n = pairs). */
static inline kvo_status wire_rd_container(wire_rd *r, bool map, uint32_t *n) {
    if (r->pos >= r->len) return KVO_ETRUNC;
    uint8_t b = r->buf[r->pos];
    uint8_t fix = map ? 0x80 : 0x90, b16 = map ? 0xde : 0xdc;
    if ((b & 0xf0) == fix) {
        *n = b & 0x0fu;
        r->pos++;
        return KVO_OK;
    }
    unsigned w = b == b16 ? 2 : b == b16 + 1 ? 4 : 0;
    if (!w) return KVO_EPROTO;
    if (r->len - r->pos - 1 < w) return KVO_ETRUNC;
    *n = (uint32_t)wire_be_w(r->buf + r->pos + 1, w);
    r->pos += 1 + w;
    return KVO_OK;
}

static inline kvo_status wire_rd_array(wire_rd *r, uint32_t *n) {
    return wire_rd_container(r, false, n);
}

static inline kvo_status wire_rd_map(wire_rd *r, uint32_t *n) {
    return wire_rd_container(r, true, n);
}

/* str (bin = false) or bin (bin = true): pointer into buf and length. */
static inline kvo_status wire_rd_blob(wire_rd *r, bool bin, const uint8_t **p,
                                      uint32_t *n) {
    if (r->pos >= r->len) return KVO_ETRUNC;
    uint8_t b = r->buf[r->pos];
    unsigned w;
    uint32_t len = 0;
    if (!bin && (b & 0xe0) == 0xa0) {
        w = 0;
        len = b & 0x1fu;
    } else if (b == (bin ? 0xc4 : 0xd9)) {
        w = 1;
    } else if (b == (bin ? 0xc5 : 0xda)) {
        w = 2;
    } else if (b == (bin ? 0xc6 : 0xdb)) {
        w = 4;
    } else {
        return KVO_EPROTO;
    }
    size_t room = r->len - r->pos - 1;
    if (room < w) return KVO_ETRUNC;
    if (w) len = (uint32_t)wire_be_w(r->buf + r->pos + 1, w);
    if (room - w < len) return KVO_ETRUNC;
    *p = r->buf + r->pos + 1 + w;
    *n = len;
    r->pos += 1 + w + len;
    return KVO_OK;
}

static inline kvo_status wire_rd_str(wire_rd *r, const uint8_t **p,
                                     uint32_t *n) {
    return wire_rd_blob(r, false, p, n);
}

static inline kvo_status wire_rd_bin(wire_rd *r, const uint8_t **p,
                                     uint32_t *n) {
    return wire_rd_blob(r, true, p, n);
}

/* float64, float32 or any int, as a double. */
kvo_status wire_rd_double(wire_rd *r, double *out);

/* Skip one whole value (iterative; bounded by the input). */
kvo_status wire_rd_skip(wire_rd *r);

/* ---- Writing msgpack into reserved room ----------------------------------
 * The encoders (wire_batch.c, wire_plane.c) reserve an upper bound of what
 * they write once per message and then write through a bare cursor with
 * these: no checks, no calls. Each returns the cursor past what it wrote.
 * The forms are the ones msgpack-c's packer and rmp-serde choose (so the
 * bytes equal theirs): ints in the shortest form, non-negative ones always
 * unsigned (fixint, cc, cd, ce, cf), negative ones negative fixint or
 * d0..d3; str as fixstr, str8, str16, str32; bin as bin8, bin16, bin32;
 * array/map as fix, 16, 32. Most bytes each needs: ints 9, headers 5. */
/* The low n bytes of v, big-endian; n is 1, 2, 4 or 8 (the msgpack
 * widths): one store each (a loop over the bytes stayed a loop at -O2, and
 * byte stores were merged with their neighbours into shift-and-or code). */
static inline uint8_t *wire_put_be(uint8_t *p, uint64_t v, unsigned n) {
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    switch (n) {
    case 1: p[0] = (uint8_t)v; break;
    case 2:
        v16 = htobe16((uint16_t)v);
        memcpy(p, &v16, 2);
        break;
    case 4:
        v32 = htobe32((uint32_t)v);
        memcpy(p, &v32, 4);
        break;
    default:
        v64 = htobe64(v);
        memcpy(p, &v64, 8);
        break;
    }
    return p + n;
}

static inline uint8_t *wire_put_uint(uint8_t *p, uint64_t v) {
    if (v < 0x80) {
        *p = (uint8_t)v;
        return p + 1;
    }
    if (v <= 0xff) {
        *p = 0xcc;
        return wire_put_be(p + 1, v, 1);
    }
    if (v <= 0xffff) {
        *p = 0xcd;
        return wire_put_be(p + 1, v, 2);
    }
    if (v <= 0xffffffffu) {
        *p = 0xce;
        return wire_put_be(p + 1, v, 4);
    }
    *p = 0xcf;
    return wire_put_be(p + 1, v, 8);
}

static inline uint8_t *wire_put_int(uint8_t *p, int64_t v) {
    if (v >= 0) return wire_put_uint(p, (uint64_t)v);
    if (v >= -32) {
        *p = (uint8_t)v;
        return p + 1;
    }
    if (v >= INT8_MIN) {
        *p = 0xd0;
        return wire_put_be(p + 1, (uint64_t)v, 1);
    }
    if (v >= INT16_MIN) {
        *p = 0xd1;
        return wire_put_be(p + 1, (uint64_t)v, 2);
    }
    if (v >= INT32_MIN) {
        *p = 0xd2;
        return wire_put_be(p + 1, (uint64_t)v, 4);
    }
    *p = 0xd3;
    return wire_put_be(p + 1, (uint64_t)v, 8);
}

/* Array (map = false) or map header; n is pairs for a map. */
static inline uint8_t *wire_put_container(uint8_t *p, bool map, uint32_t n) {
    if (n < 16) {
        *p = (uint8_t)((map ? 0x80 : 0x90) | n);
        return p + 1;
    }
    if (n <= 0xffff) {
        *p = map ? 0xde : 0xdc;
        return wire_put_be(p + 1, n, 2);
    }
    *p = map ? 0xdf : 0xdd;
    return wire_put_be(p + 1, n, 4);
}

/* str (bin = false) or bin: header, then the n bytes of s. */
static inline uint8_t *wire_put_blob(uint8_t *p, bool bin, const void *s,
                                     uint32_t n) {
    if (!bin && n < 32) {
        *p++ = (uint8_t)(0xa0 | n);
    } else if (n <= 0xff) {
        *p++ = bin ? 0xc4 : 0xd9;
        p = wire_put_be(p, n, 1);
    } else if (n <= 0xffff) {
        *p++ = bin ? 0xc5 : 0xda;
        p = wire_put_be(p, n, 2);
    } else {
        *p++ = bin ? 0xc6 : 0xdb;
        p = wire_put_be(p, n, 4);
    }
    if (n) memcpy(p, s, n);
    return p + n;
}

/* A constant key or name of fewer than 32 bytes, as a fixstr. */
#define WIRE_PUT_KEY(p, lit)                                                   \
    ((p)[0] = (uint8_t)(0xa0 | (sizeof(lit) - 1)),                             \
     memcpy((p) + 1, lit, sizeof(lit) - 1), (p) += sizeof(lit))

#endif /* WIRE_INT_H */
