/* idx_test.h -- fixtures and helpers shared by the indexer test suites. */
#ifndef IDX_TEST_H
#define IDX_TEST_H

#include "idx_int.h"
#include "kt.h"

#include <nats/nats.h>
#include <pthread.h>

Suite *suite_tree(void);
Suite *suite_model(void);
Suite *suite_feed(void);
Suite *suite_replay(void);
Suite *suite_service(void);
Suite *suite_fuzz_query(void);
Suite *suite_recover(void);
Suite *suite_heal(void);
Suite *suite_views(void);
Suite *suite_dynamo(void);

/* ---- Trees ---------------------------------------------------------------- */

idx_tree *tt_tree_new(void); /* an empty tree */
/* The invariant walker passes and leaves nothing unreachable; then free. */
void tt_tree_done(idx_tree *t);
uint64_t tt_nodes(const idx_tree *t); /* idx_stats.nodes */
uint64_t tt_pairs(const idx_tree *t); /* idx_stats.pairs */

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

/* A new tree restored from t's dump. Every dumped event is a one-block
 * store numbered from 0 and restores as ok or parent_not_found;
 * *events and *rejected (may be NULL) get the counts. */
idx_tree *tt_restore(const idx_tree *t, size_t *events, size_t *rejected);
/* a and b give the same scores, in the same order, to the query. */
void tt_same_answers(idx_tree *a, idx_tree *b, const uint64_t *q, size_t n);

/* ---- Event-plane messages ------------------------------------------------- */

/* The shared vector tests/data/vectors/event_plane/NAME.bin (kvo_free). */
uint8_t *tt_vector(const char *name, size_t *len);
/* The vectors of one publisher (42), sequences 0..3 in order: two blocks
 * stored by worker (7, 0), one removed, the worker cleared, then a message
 * of two dp ranks. Suites replay them through the feed, a capture, NATS. */
extern const char *const tt_plane_sequence[4];

/* The envelope (pub, seq, published_at) around evs[0, n). kvo_free the
 * bytes. */
uint8_t *tt_plane(uint64_t pub, uint64_t seq, uint64_t published_at,
                  const wire_revent *evs, uint32_t n, size_t *len);
/* An envelope (publisher pub, sequence seq) around one stored RouterEvent
 * of worker (worker, 0) and tier: a chain of n blocks from the root, block
 * i with tokens_hash i+1 and block_hash 100 (i+1). kvo_free the bytes. */
uint8_t *tt_envelope(uint64_t pub, uint64_t seq, uint64_t worker,
                     wire_tier tier, uint32_t n, size_t *len);

idx_feed *tt_feed_new(void); /* an empty feed */
/* A feed fed the named vectors in order (NULL-terminated), each applied. */
idx_feed *tt_feed_of(const char *name, ...) __attribute__((sentinel));
/* idx_feed_message of a vector, with an optional KVO-Zmq-Seq header. */
kvo_status tt_feed_vector(idx_feed *f, const char *name, const char *hdr);

/* ---- A fake relay (fake_relay.c): docs/recovery.md's relay side ---------- */

typedef struct fake_block {
    uint64_t bh, parent, th; /* parent 0: the root */
} fake_block;

typedef struct fake_sent {
    uint8_t *body;
    size_t len;
    char hdr[48]; /* its KVO-Zmq-Seq: "seq-seq" */
} fake_sent;

/* Publisher pub of (worker, rank 0) under namespace.dynamo.component.
 * backend, on its own NATS connection. Answers on nats.c's threads; the
 * fields under mu (counts, knobs) may be read or set by the test while it
 * holds mu. */
typedef struct fake_relay {
    natsConnection *nc;
    natsSubscription *disc, *rec;
    pthread_mutex_t mu;
    uint64_t pub, worker;
    uint32_t rank;
    uint64_t started_at;
    fake_sent *sent; /* every envelope published (or lost), by sequence */
    size_t n, cap_sent;
    fake_block *state; /* forwarded state, store order */
    size_t nstate, cap_state;
    uint64_t ring_first; /* from_sequence below this: a dump */
    size_t dump_blocks;  /* blocks per dump envelope (0: all in one) */
    bool silent;         /* take requests, answer nothing */
    uint64_t requests, events, dumps, too_new; /* what it answered */
} fake_relay;

void fake_relay_start(fake_relay *r, const char *url, uint64_t pub,
                      uint64_t worker);
void fake_relay_stop(fake_relay *r);
/* Store block bh (tokens hash th) under parent (0: the root): its next
 * envelope, published unless !publish (lost on the way). */
void fake_relay_store(fake_relay *r, uint64_t parent, uint64_t bh, uint64_t th,
                      bool publish);
/* Publish an announce on <p>.kv-relays (a heartbeat). */
void fake_relay_announce(fake_relay *r);

/* ---- JSON ------------------------------------------------------------------ */

/* The member at a dotted path ("counters.events.stored.ok"), which must be
 * there; borrowed from o. */
json_object *tt_json_at(json_object *o, const char *path);
uint64_t tt_json_u64(json_object *o, const char *path);
/* j (non-NULL) prints as want (json-c's plain form); j is put. */
void tt_json_eq(json_object *j, const char *want);

#define U64S(...) ((const uint64_t[]){__VA_ARGS__})
#define NARGS(...) (sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t))

#endif
