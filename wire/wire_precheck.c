/* wire_precheck.c -- limits, errors, the structural pre-check every wire/
 * decoder runs before allocating anything, and the out-of-line parts of the
 * msgpack cursor (see wire_int.h).
 *
 * The walk keeps, per open container, the number of values still to read:
 *
 *     left[0] = 1                      the top-level value
 *     left[1] = n of the outer array   (maps: 2 * pairs)
 *     ...
 *     left[d] = values left in the innermost open container
 *
 * Each step reads one header, decrements left[d], and either skips a scalar
 * payload (after checking it fits) or pushes a container. Finished levels
 * are popped before the next header. Nothing is allocated; the stack is
 * WIRE_DEPTH_CEILING + 1 counters. wire_walk is that loop for one value
 * anywhere in a message (the batch decoder skips unknown and raw values with
 * it); wire_precheck is wire_walk over a whole buffer.
 */
#include "wire_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void wire_limits_default(wire_limits *lim) {
    lim->max_bytes = 64u << 20;
    lim->max_elems = 1u << 20;
    lim->max_total = 1u << 22;
    lim->max_depth = 32;
    lim->max_str = 1u << 20;
}

const char *wire_mp_type_name(uint8_t b) {
    if (b <= 0x7f || b >= 0xe0) return "int";
    if (b <= 0x8f) return "map";
    if (b <= 0x9f) return "array";
    if (b <= 0xbf) return "str";
    /* clang-format off */
    switch (b) {
    case 0xc0: return "nil";
    case 0xc1: return "reserved byte 0xc1";
    case 0xc2: case 0xc3: return "bool";
    case 0xc4: case 0xc5: case 0xc6: return "bin";
    case 0xc7: case 0xc8: case 0xc9: return "ext";
    case 0xca: case 0xcb: return "float";
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: return "ext";
    case 0xd9: case 0xda: case 0xdb: return "str";
    case 0xdc: case 0xdd: return "array";
    case 0xde: case 0xdf: return "map";
    default: return "int"; /* 0xcc..0xd3 */
    }
    /* clang-format on */
}

/* What one header byte announces. */
typedef struct mp_head {
    unsigned len_bytes; /* big-endian length/count bytes after the tag */
    unsigned fixed;     /* fixed payload bytes (ints, floats, ext type) */
    uint32_t count;     /* fix* length/count carried in the tag itself */
    enum { H_SCALAR, H_BLOB, H_ARRAY, H_MAP, H_BAD } kind;
} mp_head;

static mp_head head_of(uint8_t b) {
    mp_head h = {0, 0, 0, H_SCALAR};
    if (b <= 0x7f || b >= 0xe0) return h;
    if (b <= 0x8f) return (mp_head){0, 0, b & 0x0fu, H_MAP};
    if (b <= 0x9f) return (mp_head){0, 0, b & 0x0fu, H_ARRAY};
    if (b <= 0xbf) return (mp_head){0, 0, b & 0x1fu, H_BLOB};
    /* clang-format off */
    switch (b) {
    case 0xc0: case 0xc2: case 0xc3: return h;
    case 0xc1: h.kind = H_BAD; return h;
    case 0xc4: case 0xd9: return (mp_head){1, 0, 0, H_BLOB};
    case 0xc5: case 0xda: return (mp_head){2, 0, 0, H_BLOB};
    case 0xc6: case 0xdb: return (mp_head){4, 0, 0, H_BLOB};
    case 0xc7: return (mp_head){1, 1, 0, H_BLOB}; /* ext: + type byte */
    case 0xc8: return (mp_head){2, 1, 0, H_BLOB};
    case 0xc9: return (mp_head){4, 1, 0, H_BLOB};
    case 0xca: h.fixed = 4; return h;
    case 0xcb: h.fixed = 8; return h;
    case 0xcc: case 0xd0: h.fixed = 1; return h;
    case 0xcd: case 0xd1: h.fixed = 2; return h;
    case 0xce: case 0xd2: h.fixed = 4; return h;
    case 0xcf: case 0xd3: h.fixed = 8; return h;
    case 0xd4: h.fixed = 2; return h; /* fixext: type + data */
    case 0xd5: h.fixed = 3; return h;
    case 0xd6: h.fixed = 5; return h;
    case 0xd7: h.fixed = 9; return h;
    case 0xd8: h.fixed = 17; return h;
    case 0xdc: return (mp_head){2, 0, 0, H_ARRAY};
    case 0xdd: return (mp_head){4, 0, 0, H_ARRAY};
    case 0xde: return (mp_head){2, 0, 0, H_MAP};
    default: return (mp_head){4, 0, 0, H_MAP}; /* 0xdf */
    }
    /* clang-format on */
}

kvo_status wire_walk(const uint8_t *buf, size_t avail, size_t *at_pos,
                     unsigned depth, uint64_t *total, const wire_limits *lim,
                     kvo_status short_st, kvo_err *err) {
    uint32_t max_depth = lim->max_depth < WIRE_DEPTH_CEILING
                             ? lim->max_depth
                             : WIRE_DEPTH_CEILING;
    uint64_t left[WIRE_DEPTH_CEILING + 1];
    unsigned d = 0; /* levels opened by this walk; depth + d in all */
    size_t pos = *at_pos;
    left[0] = 1;

    for (;;) {
        while (left[d] == 0) {
            if (d == 0) goto finished;
            d--;
        }
        left[d]--;
        size_t at = pos;
        if (pos >= avail)
            return kvo_err_set(err, short_st, at,
                               "input ends where a value should start");
        uint8_t b = buf[pos++];
        /* Fast paths for what batches are made of: fixints and ints. */
        if (b <= 0x7f || b >= 0xe0) continue;
        if (b >= 0xcc && b <= 0xd3) {
            unsigned w = 1u << ((b - 0xcc) & 3);
            if (w > avail - pos)
                return kvo_err_set(err, short_st, at,
                                   "int needs %u bytes but only %zu remain", w,
                                   avail - pos);
            pos += w;
            continue;
        }
        mp_head h = head_of(b);
        if (h.kind == H_BAD)
            return kvo_err_set(err, KVO_EPROTO, at, "reserved byte 0xc1");
        if (h.len_bytes > avail - pos)
            return kvo_err_set(err, short_st, at,
                               "input ends inside a %s header",
                               wire_mp_type_name(b));
        uint32_t n =
            h.len_bytes ? (uint32_t)wire_be_w(buf + pos, h.len_bytes) : h.count;
        pos += h.len_bytes;

        if (h.kind == H_ARRAY || h.kind == H_MAP) {
            const char *what = h.kind == H_MAP ? "map" : "array";
            if (n > lim->max_elems)
                return kvo_err_set(err, KVO_ETOOBIG, at,
                                   "%s of %" PRIu32
                                   " elements exceeds limit %" PRIu32,
                                   what, n, lim->max_elems);
            *total += n;
            if (*total > lim->max_total)
                return kvo_err_set(err, KVO_ETOOBIG, at,
                                   "message holds more than %" PRIu64
                                   " elements in all",
                                   lim->max_total);
            if (depth + d + 1 > max_depth)
                return kvo_err_set(err, KVO_ETOOBIG, at,
                                   "nesting deeper than %" PRIu32, max_depth);
            uint64_t items = h.kind == H_MAP ? 2 * (uint64_t)n : n;
            if (items > avail - pos)
                return kvo_err_set(err, short_st, at,
                                   "%s declares %" PRIu32
                                   " elements but only %zu bytes remain",
                                   what, n, avail - pos);
            left[++d] = items;
            continue;
        }
        uint64_t payload = h.fixed;
        if (h.kind == H_BLOB) {
            if (n > lim->max_str)
                return kvo_err_set(err, KVO_ETOOBIG, at,
                                   "%s of %" PRIu32
                                   " bytes exceeds limit %" PRIu32,
                                   wire_mp_type_name(b), n, lim->max_str);
            payload += n;
        }
        if (payload > avail - pos)
            return kvo_err_set(err, short_st, at,
                               "%s needs %" PRIu64 " bytes but only %zu remain",
                               wire_mp_type_name(b), payload, avail - pos);
        pos += (size_t)payload;
    }

finished:
    *at_pos = pos;
    return KVO_OK;
}

kvo_status wire_precheck(const uint8_t *buf, size_t len, const wire_limits *lim,
                         size_t *end, kvo_err *err) {
    wire_limits def;
    if (!lim) {
        wire_limits_default(&def);
        lim = &def;
    }
    /* Only max_bytes of the input may belong to the value. When the input
     * is longer, running out of the allowed bytes is ETOOBIG, not ETRUNC. */
    size_t avail = len;
    bool clipped = false;
    if (avail > lim->max_bytes) {
        if (!end)
            return kvo_err_set(err, KVO_ETOOBIG, 0,
                               "message of %zu bytes exceeds limit %zu", len,
                               lim->max_bytes);
        avail = lim->max_bytes;
        clipped = true;
    }
    size_t pos = 0;
    uint64_t total = 0;
    kvo_status st = wire_walk(buf, avail, &pos, 0, &total, lim,
                              clipped ? KVO_ETOOBIG : KVO_ETRUNC, err);
    if (st != KVO_OK) return st;
    if (end) {
        *end = pos;
    } else if (pos != len) {
        return kvo_err_set(err, KVO_EPROTO, pos,
                           "%zu trailing bytes after the value", len - pos);
    }
    return KVO_OK;
}

/* ---- Cursor: the parts too big to inline ---------------------------------*/

kvo_status wire_rd_double(wire_rd *r, double *out) {
    if (r->pos >= r->len) return KVO_ETRUNC;
    uint8_t b = r->buf[r->pos];
    if (b == 0xcb || b == 0xca) {
        unsigned n = b == 0xcb ? 8 : 4;
        if (r->len - r->pos - 1 < n) return KVO_ETRUNC;
        uint64_t bits = wire_be_w(r->buf + r->pos + 1, n);
        if (n == 8) {
            double d;
            memcpy(&d, &bits, sizeof(d));
            *out = d;
        } else {
            uint32_t b32 = (uint32_t)bits;
            float f;
            memcpy(&f, &b32, sizeof(f));
            *out = f;
        }
        r->pos += 1 + n;
        return KVO_OK;
    }
    bool neg;
    uint64_t v;
    kvo_status st = wire_rd_int(r, &neg, &v);
    if (st != KVO_OK) return st;
    *out = neg ? (double)(int64_t)v : (double)v;
    return KVO_OK;
}

kvo_status wire_rd_skip(wire_rd *r) {
    /* Values still to skip; a container adds its elements. Every step
     * consumes at least one byte, so this ends within len steps. */
    uint64_t pending = 1;
    size_t pos = r->pos;
    while (pending) {
        pending--;
        if (pos >= r->len) return KVO_ETRUNC;
        uint8_t b = r->buf[pos++];
        mp_head h = head_of(b);
        if (h.kind == H_BAD) return KVO_EPROTO;
        if (h.len_bytes > r->len - pos) return KVO_ETRUNC;
        uint32_t n = h.len_bytes
                         ? (uint32_t)wire_be_w(r->buf + pos, h.len_bytes)
                         : h.count;
        pos += h.len_bytes;
        if (h.kind == H_ARRAY || h.kind == H_MAP) {
            uint64_t items = h.kind == H_MAP ? 2 * (uint64_t)n : n;
            if (items > r->len - pos) return KVO_ETRUNC;
            pending += items;
            continue;
        }
        uint64_t payload = h.fixed + (h.kind == H_BLOB ? n : 0);
        if (payload > r->len - pos) return KVO_ETRUNC;
        pos += (size_t)payload;
    }
    r->pos = pos;
    return KVO_OK;
}
