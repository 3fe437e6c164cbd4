/* wire_test.h -- helpers shared by the wire codec tests (test_batch.c,
 * test_hostile.c, test_tool.c, test_fuzz_replay.c); defined in
 * test_batch.c. */
#ifndef WIRE_TEST_H
#define WIRE_TEST_H

#include "kt.h"
#include "wire.h"

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

#endif /* WIRE_TEST_H */
