/* wire_int.h -- internals shared by the wire/ decoders (not a public API).
 *
 * wire_precheck: the structural pre-check every wire/ decoder runs on bytes
 * from a socket or a file BEFORE anything is allocated for them (msgpack-c's
 * unpacker, for one, trusts declared lengths: the 5 bytes `dd ff ff ff ff`
 * make it try to allocate ~128 GiB of objects).
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
 * the wire_rd_* helpers below without further size worries: every count is
 * bounded by the bytes that back it.
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

/* Hard ceiling on nesting whatever the limits say (the walk keeps one
 * counter per level on the stack). */
#define WIRE_DEPTH_CEILING 512u

kvo_status wire_precheck(const uint8_t *buf, size_t len,
                         const wire_limits *lim, size_t *end,
                         wire_error *err);

/* Fill err (if non-NULL) with status, offset and a printf-style reason;
 * returns status so callers can `return wire_fail(...)`. */
kvo_status wire_fail(wire_error *err, kvo_status status, size_t offset,
                     const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Human name of the msgpack type whose first byte is b ("int", "str",
 * "map", ...), for "expected X, got Y" messages. */
const char *wire_mp_type_name(uint8_t b);

#endif /* WIRE_INT_H */
