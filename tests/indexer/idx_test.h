/* idx_test.h -- helpers shared by the indexer test suites. */
#ifndef IDX_TEST_H
#define IDX_TEST_H

#include "idx_int.h"
#include "kt.h"

Suite *suite_tree(void);
Suite *suite_model(void);
Suite *suite_feed(void);
Suite *suite_replay(void);
Suite *suite_service(void);

/* Events as Dynamo's test_utils build them: block i of a store has
 * tokens_hash = tok[i] and block_hash = tok[i] * 100; a parent is given as
 * its block_hash (NULL = root). */
idx_evstatus tt_store(idx_tree *t, uint64_t wid, uint32_t rank,
                      const uint64_t *parent, const uint64_t *tok, size_t n);
/* Explicit block hashes. */
idx_evstatus tt_store_bh(idx_tree *t, uint64_t wid, uint32_t rank,
                         const uint64_t *parent, const uint64_t *tok,
                         const uint64_t *bh, size_t n);
idx_evstatus tt_remove(idx_tree *t, uint64_t wid, uint32_t rank,
                       const uint64_t *bh, size_t n);
idx_evstatus tt_clear(idx_tree *t, uint64_t wid, uint32_t rank);
/* Score of (wid, rank) for the query, 0 when absent. */
uint32_t tt_score(idx_tree *t, const uint64_t *q, size_t n, uint64_t wid,
                  uint32_t rank);
/* Number of scoring workers. */
size_t tt_nscores(idx_tree *t, const uint64_t *q, size_t n);
/* Lookup size of (wid, rank); UINT64_MAX when the worker is unknown. */
uint64_t tt_blocks(const idx_tree *t, uint64_t wid, uint32_t rank);
/* The invariant walker must pass (and, if strict, leave nothing
 * unreachable). */
void tt_check(const idx_tree *t, bool strict);

#define U64S(...) ((const uint64_t[]){__VA_ARGS__})
#define NARGS(...) (sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t))

#endif
