/* wire_test.h -- helpers shared by the wire codec tests (test_batch.c,
 * test_hostile.c, test_tool.c, test_fuzz_replay.c); defined in
 * test_batch.c. */
#ifndef WIRE_TEST_H
#define WIRE_TEST_H

#include "kt.h"
#include "wire.h"

#include <msgpack.h>

/* A JSON integer as (negative?, two's-complement bits). */
bool wt_json_int(json_object *j, bool *neg, uint64_t *v);
/* JSON equality where an absent object key equals null; the first
 * difference's path goes to why. */
bool wt_json_same(json_object *a, json_object *b, char *why, size_t n,
                  const char *path);
/* The .bin of a case of tests/data/vectors/wire/vectors.json (malloc'd). */
uint8_t *wt_vector_bytes(json_object *c, size_t *len);
const char *wt_name(json_object *c);
/* The case's profile as an encoder format. */
wire_format wt_format(json_object *c);

/* Writing msgpack by hand: msgpack-c's packer into a kvo_buf. */
typedef struct wt_mp {
    kvo_buf b;
    msgpack_packer pk;
} wt_mp;

void wt_mp_init(wt_mp *m);
void wt_mp_str(wt_mp *m, const char *s);
void wt_mp_raw(wt_mp *m, const void *p, size_t n);
/* [ts 1.5, [<n_events events the caller writes next>], ...]: the caller
 * also writes the elements after the events (batch_len - 2 of them). */
void wt_mp_batch_head(wt_mp *m, uint32_t batch_len, uint32_t n_events);

#endif /* WIRE_TEST_H */
