/* idx_int.h -- what the indexer's own files share, and its test seams.
 * Users call idx.h; nothing outside indexer/ and its tests includes this.
 */
#ifndef IDX_INT_H
#define IDX_INT_H

#include "idx.h"

/* ---- Feed internals ------------------------------------------------------ */

/* Per publisher; what GET /watermark shows. */
typedef struct idx_publisher {
    uint64_t publisher_id;
    uint64_t last_sequence;
    uint64_t messages; /* applied */
    uint64_t gaps;
    uint64_t missed; /* sequences jumped over */
    uint64_t duplicates;
    uint64_t restarts;
    bool has_zmq;       /* a KVO-Zmq-Seq header was seen */
    uint64_t zmq_first; /* lowest header start seen */
    uint64_t zmq_last;  /* highest header end seen */
} idx_publisher;

/* Publishers sorted by publisher_id; *out kvo_malloc'd (caller frees). */
kvo_status idx_feed_publishers(const idx_feed *f, idx_publisher **out,
                               size_t *n);
/* The highest KVO-Zmq-Seq end seen from one publisher: false when the
 * publisher or its header is unknown so far. No allocation. */
bool idx_feed_zmq_last(const idx_feed *f, uint64_t publisher_id,
                       uint64_t *zmq_last);

/* ---- JSON shapes (json-c; the caller owns what is returned) -------------
 * counters:  {"events": {"stored"|"removed"|"cleared": {"ok": n,
 *             "parent_not_found": n, "block_not_found": n,
 *             "invalid_block": n}}, "blocks": {"stored": n, "removed": n,
 *             "not_found": n, "hash_mismatch": n}, "messages": n,
 *             "applied": n, "duplicates": n, "restarts": n, "gaps": n,
 *             "missed": n, "undecodable": n, "bad_headers": n,
 *             "other_tier": n, "enomem": n, "nodes": n,
 *             "resident_blocks": n, "pairs": n, "workers": n}
 * workers:   [{"worker_id", "dp_rank", "blocks"}] sorted
 * scores:    {"isl_blocks": n, "scores": [{"worker_id", "dp_rank",
 *             "blocks"}]} sorted
 * watermark: {"publishers": [{"publisher_id", "last_sequence", "messages",
 *             "gaps", "missed", "duplicates", "restarts", "zmq_seq_first",
 *             "zmq_seq_last"}]} (zmq_* null until a KVO-Zmq-Seq header was
 *             seen; first = lowest start, last = highest end)
 * NULL return = out of memory. */
json_object *idx_json_counters(const idx_feed *f);
json_object *idx_json_workers(const idx_tree *t);
json_object *idx_json_scores(const idx_scores *s);
json_object *idx_json_watermark(const idx_feed *f);
/* One stored RouterEvent in the event-plane JSON shape of the vectors. */
json_object *idx_json_revent(const wire_revent *ev);

/* text (len bytes) as exactly one JSON value, followed by nothing but
 * whitespace (json-c alone stops after the first value and ignores the
 * rest). NULL with err = "bad JSON: ..." otherwise (or out of memory). */
json_object *idx_json_parse(const char *text, size_t len, char *err,
                            size_t errsz);

/* Run a JSON query: {"token_ids": [...], "lora_name"?, "cache_salt"?} or
 * {"tokens_hashes": [...]}. want_tokens: 1 = token_ids required, 0 =
 * tokens_hashes required, -1 = either. KVO_EPROTO (err says why) for a bad
 * request, KVO_ENOMEM. */
kvo_status idx_query_json(idx_tree *t, uint32_t block_size, json_object *req,
                          int want_tokens, idx_scores *out, char *err,
                          size_t errsz);

/* ---- Test seam: the invariant walker -------------------------------------- */

/* Walk every structure and check every invariant of idx_tree.c's header.
 * KVO_OK, or KVO_ESTATE with the first violation in msg. *unreachable (may
 * be NULL) gets the number of live nodes reachable neither from the root
 * nor from a lookup entry (only cycles fed by inconsistent hashes make
 * them, as in Dynamo). For tests: O(size of the tree). */
kvo_status idx_tree_check(const idx_tree *t, uint64_t *unreachable,
                          char *msg, size_t msgsz);

#endif /* IDX_INT_H */
