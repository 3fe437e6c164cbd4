/* wire.h -- the codec: vLLM KV-event batches (DESIGN §4), the hashes (§5),
 * the Dynamo-compatible event plane (§6) and capture files (§3).
 *
 * Ownership: every decoder writes into a caller-owned object whose arena owns
 * all decoded data. Nothing decoded points into the input buffer. Objects are
 * reusable: decode again into the same object and the previous contents are
 * released (the arena keeps its memory, so steady-state decoding does not
 * allocate).
 *
 * Bad input: decoders return KVO_EPROTO / KVO_ETRUNC / KVO_ETOOBIG and fill a
 * kvo_err with the byte offset and a one-line reason. They never assert
 * on input and never allocate more than the limits allow.
 */
#ifndef WIRE_H
#define WIRE_H

#include "kvo.h"

#include <json-c/json.h>

/* ======================================================================== */
/* Limits and errors                                                         */
/* ======================================================================== */

/* Structural bounds checked before anything is allocated. Defaults
 * (wire_limits_default): payload 64 MiB, 1,048,576 elements per container,
 * 4,194,304 elements in the whole message, depth 32, strings/bins 1 MiB. */
typedef struct wire_limits {
    size_t max_bytes;   /* whole payload */
    uint32_t max_elems; /* one array or map (map: pairs) */
    uint64_t max_total; /* sum of all container sizes in one message */
    uint32_t max_depth; /* nesting; the batch itself is depth 1 */
    uint32_t max_str;   /* one str or bin */
} wire_limits;

void wire_limits_default(wire_limits *lim);

/* ======================================================================== */
/* vLLM KV-event batches (the third ZMQ frame)                               */
/* ======================================================================== */

typedef enum wire_ev_type {
    WIRE_EV_STORED = 1,  /* "BlockStored" */
    WIRE_EV_REMOVED = 2, /* "BlockRemoved" */
    WIRE_EV_CLEARED = 3  /* "AllBlocksCleared" */
} wire_ev_type;

/* A block hash as published, plus its normalized u64 key (DESIGN §4): ints
 * by their 64-bit two's-complement pattern, bytes by their last 8 bytes
 * big-endian (bytes shorter than 8 are left-padded with zeros). */
typedef enum wire_hash_kind {
    WIRE_HASH_NONE = 0, /* nil (only valid for parent_block_hash) */
    WIRE_HASH_UINT,     /* non-negative msgpack int */
    WIRE_HASH_INT,      /* negative msgpack int */
    WIRE_HASH_BYTES     /* bin (or str) bytes */
} wire_hash_kind;

typedef struct wire_hash {
    wire_hash_kind kind;
    uint32_t len;         /* BYTES: number of bytes */
    uint64_t key;         /* normalized key; 0 for NONE */
    const uint8_t *bytes; /* BYTES: len bytes (arena-owned when decoded) */
} wire_hash;

/* Nullable scalars. */
typedef struct wire_str {
    const char *p; /* NULL = nil; not NUL-terminated in general */
    uint32_t len;
} wire_str;

typedef struct wire_int {
    bool set; /* false = nil/absent */
    int64_t v;
} wire_int;

/* An opaque msgpack value kept as its exact bytes (extra_keys, SGLang's
 * metadata map). NULL = nil/absent. */
typedef struct wire_raw {
    const uint8_t *p;
    uint32_t len;
} wire_raw;

/* How an event was laid out on the wire. Array layouts are identified by
 * their element count (including the type tag). */
typedef enum wire_layout {
    WIRE_LAYOUT_MAP = 0,
    WIRE_LAYOUT_ARRAY = 1
} wire_layout;

typedef struct wire_event {
    wire_ev_type type;
    wire_layout layout;
    uint32_t array_len; /* ARRAY: element count incl. the tag */
    uint32_t map_len;   /* MAP: entries incl. "type" (informational) */

    /* BlockStored and BlockRemoved */
    uint32_t n_hashes;
    wire_hash *hashes;
    wire_str medium; /* nil = GPU */
    wire_int group_idx;
    wire_str locality;  /* map only */
    wire_str ownership; /* map only */

    /* BlockStored only */
    wire_hash parent; /* kind NONE = nil = root */
    uint32_t n_tokens;
    uint64_t *token_ids; /* any msgpack int width; negatives rejected */
    wire_int block_size;
    wire_int lora_id;
    wire_str lora_name;
    wire_raw metadata;   /* SGLang: a map in the lora_name slot (array[7]) */
    wire_raw extra_keys; /* per-block list, kept verbatim */
    wire_str kv_cache_spec_kind;
    wire_int kv_cache_spec_sliding_window;
    wire_str session_id;
    wire_str cache_salt; /* SGLang map form */
    wire_str origin;     /* map-next */
} wire_event;

typedef struct wire_batch {
    double ts;
    uint32_t batch_len; /* 2 (v0.9.0) or 3+ */
    wire_int dp_rank;   /* nil or absent = unset */
    uint32_t n_events;
    wire_event *events;
    kvo_arena arena; /* owns everything above when decoded */
} wire_batch;

void wire_batch_init(wire_batch *b);
void wire_batch_fini(wire_batch *b);
/* Empty the batch and release its arena contents (memory is kept). */
void wire_batch_reset(wire_batch *b);

/* Decode one KVEventBatch payload. On success *b holds the batch (previous
 * contents replaced). On failure *b is reset and err (if non-NULL) says what
 * and where. lim NULL = defaults.
 * Accepted: batches of >= 2 elements (extras ignored); map and array events
 * mixed (dispatch per event); unknown map keys and extra array elements
 * ignored; an unknown event type rejects the batch (KVO_EPROTO naming it:
 * skipping it would lose events silently). Memory: the arena grows by at
 * most ~40 bytes per input byte (a 1-byte hash becomes a 24-byte
 * wire_hash), so lim->max_bytes bounds it. */
kvo_status wire_batch_decode(const uint8_t *buf, size_t len,
                             const wire_limits *lim, wire_batch *b,
                             kvo_err *err);

/* Encoder layouts (DESIGN §3 names). */
typedef enum wire_format {
    WIRE_FMT_MAP = 0,       /* "map": vLLM >= 0.24 */
    WIRE_FMT_MAP_NEXT,      /* "map-next": + "origin" (map16 header) */
    WIRE_FMT_ARRAY_V0_9_0,  /* "array-v0.9.0" */
    WIRE_FMT_ARRAY_V0_9_1,  /* "array-v0.9.1" */
    WIRE_FMT_ARRAY_V0_10_2, /* "array-v0.10.2" */
    WIRE_FMT_ARRAY_V0_14,   /* "array-v0.14" */
    WIRE_FMT_ARRAY_LATE,    /* "array-late" */
    WIRE_FMT_COUNT
} wire_format;

kvo_status wire_format_parse(const char *name, wire_format *out);
const char *wire_format_name(wire_format f);

/* Encoder flags (used by the mocker's benign mutants). */
enum {
    WIRE_ENC_REVERSE_KEYS = 1u << 0 /* map events: keys in reverse order */
};

/* Append the msgpack payload of b in format f to out. Map format: required
 * keys always, optional keys only when set, in declaration order; array
 * formats: every field of the layout, nil when unset. cache_salt and origin
 * are written (when set) in both map formats; SGLang's metadata only in the
 * lora_name slot of array formats. On failure out is left as it was. */
kvo_status wire_batch_encode(const wire_batch *b, wire_format f, unsigned flags,
                             kvo_buf *out);

/* The normalized JSON view of DESIGN §3 / the vectors' "fields". Caller owns
 * the returned object (json_object_put). KVO_EPROTO when a raw value
 * (extra_keys, metadata) is not one msgpack value within the default
 * wire_limits (a batch decoded under wider limits can hold one). */
kvo_status wire_batch_to_json(const wire_batch *b, json_object **out);
/* The inverse: fills b (its arena owns the data). */
kvo_status wire_batch_from_json(json_object *j, wire_batch *b, kvo_err *err);

/* ======================================================================== */
/* Hashes (DESIGN §5)                                                        */
/* ======================================================================== */

#define WIRE_ROUTER_SEED 1337u

/* Router seed: 1337 + xxh3_64(lora, seed 0) + xxh3_64(salt, seed 1),
 * wrapping; NULL (or absent) lora/salt contribute nothing. */
uint64_t wire_router_seed(const char *lora, size_t lora_len, const char *salt,
                          size_t salt_len);
/* tokens_hash of one block: XXH3-64 over the tokens as u32 little-endian
 * (ids are truncated to 32 bits, as Dynamo's u32 token ids). */
uint64_t wire_router_hash(const uint64_t *tokens, size_t n, uint64_t seed);
/* Hashes every full block; returns the number of blocks written to out
 * (n / block_size). */
size_t wire_router_hash_blocks(const uint64_t *tokens, size_t n,
                               uint32_t block_size, uint64_t seed,
                               uint64_t *out);

/* A prompt's multimodal item: its placeholder token range and identifier
 * (vLLM's mm_hash, NUL-terminated). */
typedef struct wire_mm_span {
    uint64_t offset, length;
    const char *id;
} wire_mm_span;

typedef struct wire_mm_key wire_mm_key;

/* Router hash of one block that overlaps multimodal items, given as the
 * (identifier, offset) pairs vLLM puts in the block's extra keys:
 * XXH3-64 (seed) over the tokens as u32 LE, then per pair XXH3-64(id,
 * seed 0) and the offset (two's complement), 8 bytes LE each -- Dynamo's
 * mm_extra_info appended to the block's bytes. n_mm == 0 gives
 * wire_router_hash. */
uint64_t wire_router_hash_mm(const uint64_t *tokens, size_t n, uint64_t seed,
                             const wire_mm_key *mm, uint32_t n_mm);

/* Router hashes of a prompt's full blocks, as a relay derives them from the
 * engine's BlockStored events (the rule kvo-relay, kvo-indexer's /query and
 * kvo-check share): the LoRA seed on every block; the cache salt's seed on
 * block 0 only (vLLM salts block 0's extra keys only, and a router chains
 * the rest under it); the items (sorted by offset, disjoint) in every block
 * they overlap, as wire_router_hash_mm. lora/salt NULL = none. Returns the
 * number of blocks written to out (n / block_size). */
size_t wire_router_hash_prompt(const uint64_t *tokens, size_t n,
                               uint32_t block_size, const char *lora,
                               const char *salt, const wire_mm_span *mm,
                               uint32_t n_mm, uint64_t *out);

typedef enum wire_algo {
    WIRE_ALGO_SHA256 = 0,  /* "sha256": SHA-256 over pickle protocol 5 */
    WIRE_ALGO_SHA256_CBOR, /* "sha256_cbor": SHA-256 over canonical CBOR */
    WIRE_ALGO_XXHASH,      /* "xxhash": XXH3-128 over pickle protocol 5 */
    WIRE_ALGO_XXHASH_CBOR, /* "xxhash_cbor": XXH3-128 over canonical CBOR */
    WIRE_ALGO_COUNT
} wire_algo;

kvo_status wire_algo_parse(const char *name, wire_algo *out);
const char *wire_algo_name(wire_algo a);

typedef struct wire_digest {
    uint8_t len; /* 32 (sha256*) or 16 (xxhash*) */
    uint8_t b[32];
} wire_digest;

/* The int form vLLM publishes: the last 8 digest bytes, big-endian. */
uint64_t wire_digest_low64(const wire_digest *d);

/* The engine's extra keys for one block: lora_name then cache_salt, each
 * only when non-NULL; the salt belongs to the first block of a prompt only
 * (the caller passes salt = NULL for later blocks). Both NULL = None. */
typedef struct wire_extra {
    const char *lora_name;
    const char *cache_salt;
} wire_extra;

/* One multimodal item in a block's extra keys (vLLM >= 0.19.1,
 * kv_cache_utils.py _gen_mm_extra_hash_keys): the pair (identifier,
 * offset), offset = the item's first placeholder token minus the block's
 * first token (negative when the item began in an earlier block). In the
 * extra keys they come, in offset order, between the LoRA name and the
 * salt (generate_block_hash_extra_keys); a block with any of the three
 * has a tuple, else None. */
typedef struct wire_mm_key {
    const char *id; /* NUL-terminated UTF-8 */
    int64_t offset;
} wire_mm_key;

/* NONE_HASH = H(seed string), the parent of a prompt's first block. */
kvo_status wire_engine_root(wire_algo a, const char *seed, wire_digest *out);
/* H((parent_digest_bytes, tuple(tokens), extra_keys)). tokens may exceed
 * 2^32 (pickled as longs, CBOR as uint64). scratch is reused between calls
 * to avoid allocation (may be NULL). */
kvo_status wire_engine_block(wire_algo a, const wire_digest *parent,
                             const uint64_t *tokens, size_t n,
                             const wire_extra *extra, kvo_buf *scratch,
                             wire_digest *out);
/* wire_engine_block with the block's multimodal keys too: extra may be
 * NULL, mm holds n_mm pairs (NULL when 0). */
kvo_status wire_engine_block_mm(wire_algo a, const wire_digest *parent,
                                const uint64_t *tokens, size_t n,
                                const wire_extra *extra, const wire_mm_key *mm,
                                uint32_t n_mm, kvo_buf *scratch,
                                wire_digest *out);
/* The exact bytes wire_engine_block digests (pickle protocol 5 for sha256
 * and xxhash, canonical CBOR for the *_cbor algos), appended to out. For
 * tests and for debugging hash mismatches against a real engine. */
kvo_status wire_engine_serialize(wire_algo a, const wire_digest *parent,
                                 const uint64_t *tokens, size_t n,
                                 const wire_extra *extra, kvo_buf *out);
kvo_status wire_engine_serialize_mm(wire_algo a, const wire_digest *parent,
                                    const uint64_t *tokens, size_t n,
                                    const wire_extra *extra,
                                    const wire_mm_key *mm, uint32_t n_mm,
                                    kvo_buf *out);

/* ======================================================================== */
/* Event plane: relay -> indexer (DESIGN §6)                                 */
/* ======================================================================== */

typedef enum wire_tier {
    WIRE_TIER_DEVICE = 0,  /* "device" (GPU, nil medium) */
    WIRE_TIER_HOST_PINNED, /* "host_pinned" (CPU, CPU_PINNED) */
    WIRE_TIER_DISK,        /* "disk" (DISK) */
    WIRE_TIER_EXTERNAL,    /* "external" (STORAGE and anything else) */
    WIRE_TIER_COUNT
} wire_tier;

const char *wire_tier_name(wire_tier t);
kvo_status wire_tier_parse(const char *s, size_t len, wire_tier *out);
/* vLLM medium string (nil = GPU) -> tier. */
wire_tier wire_tier_from_medium(wire_str medium);

typedef enum wire_rtype {
    WIRE_R_STORED = 1,
    WIRE_R_REMOVED = 2,
    WIRE_R_CLEARED = 3
} wire_rtype;

typedef struct wire_rblock {
    uint64_t block_hash;  /* normalized engine hash */
    uint64_t tokens_hash; /* router hash */
} wire_rblock;

typedef struct wire_revent {
    uint64_t worker_id;
    wire_tier tier;
    uint64_t event_id; /* per worker, from 1 */
    uint32_t dp_rank;
    wire_rtype type;
    /* STORED */
    bool has_parent;
    uint64_t parent_hash;
    uint32_t n_blocks;
    wire_rblock *blocks;
    /* REMOVED */
    uint32_t n_removed;
    uint64_t *removed;
} wire_revent;

typedef struct wire_plane_msg {
    uint64_t publisher_id;
    uint64_t sequence;     /* per publisher, from 0 */
    uint64_t published_at; /* unix ms */
    wire_str topic;        /* "kv-events" */
    bool single_form;      /* payload was one RouterEvent map, not an array */
    uint32_t n_events;
    wire_revent *events;
    kvo_arena arena; /* owns everything above when decoded */
} wire_plane_msg;

void wire_plane_init(wire_plane_msg *m);
void wire_plane_fini(wire_plane_msg *m);
void wire_plane_reset(wire_plane_msg *m);

/* Decode an envelope and its RouterEvent payload (array or single map). */
kvo_status wire_plane_decode(const uint8_t *buf, size_t len,
                             const wire_limits *lim, wire_plane_msg *m,
                             kvo_err *err);
/* Encode envelope + payload (array form, or single form when
 * m->single_form and n_events == 1); byte-identical to the vectors. */
kvo_status wire_plane_encode(const wire_plane_msg *m, kvo_buf *out);
/* JSON view: {"publisher_id", "sequence", "published_at", "topic",
 * "router_events": [...]} with the vectors' RouterEvent shape. */
kvo_status wire_plane_to_json(const wire_plane_msg *m, json_object **out);

/* ======================================================================== */
/* Event-plane recovery (docs/recovery.md)                                   */
/* ======================================================================== */

/* Subjects under namespace.<ns>.component.<component>. */
typedef enum wire_subject_kind {
    WIRE_SUBJ_EVENTS = 0, /* .kv-events: the event plane itself */
    WIRE_SUBJ_RELAYS,     /* .kv-relays: announces (start, heartbeat) */
    WIRE_SUBJ_DISCOVER,   /* .kv-relays.discover: who is there? */
    WIRE_SUBJ_RECOVERY    /* .kv-recovery.<publisher_id> */
} wire_subject_kind;

/* The subject into out (n bytes, NUL-terminated). KVO_ETOOBIG when it does
 * not fit; KVO_EINVAL when ns or component is empty or holds '.', '*', '>'
 * or white space (a NATS token). publisher_id is used by RECOVERY only. */
kvo_status wire_subject(char *out, size_t n, const char *ns,
                        const char *component, wire_subject_kind kind,
                        uint64_t publisher_id);

#define WIRE_HDR_ZMQ_SEQ "KVO-Zmq-Seq"   /* "first-last" ZMQ seqs covered */
#define WIRE_HDR_RECOVERY "KVO-Recovery" /* what a recovery reply is */
#define WIRE_ANNOUNCE_MAX_RANKS 1024

/* A relay's announce. Decoded strings and arrays point into the kvo_json
 * document given to the decoder (valid while it is). */
typedef struct wire_announce {
    uint64_t publisher_id;
    uint64_t worker_id;
    uint32_t n_ranks;
    const uint64_t *ranks; /* dp ranks, each < 2^32 */
    const char *recovery_subject;
    bool has_last; /* false: nothing published yet */
    uint64_t last_sequence;
    uint64_t started_at_ms; /* unix ms: a restart changes it */
    uint32_t heartbeat_ms;
} wire_announce;

kvo_status wire_announce_encode(const wire_announce *a, kvo_buf *out);

/* A recovery request: a dump, or the envelopes from from_sequence on. */
typedef struct wire_recovery_req {
    bool dump;
    uint64_t from_sequence;
} wire_recovery_req;

kvo_status wire_recovery_req_encode(const wire_recovery_req *r, kvo_buf *out);

/* What one message of a recovery reply stream is (its KVO-Recovery
 * header). */
typedef enum wire_reply_kind {
    WIRE_REPLY_EVENTS = 0, /* an envelope from the ring */
    WIRE_REPLY_DUMP,       /* an envelope of a dump */
    WIRE_REPLY_END,        /* the end, with a count */
    WIRE_REPLY_TOO_NEW     /* nothing to send */
} wire_reply_kind;

const char *wire_reply_kind_name(wire_reply_kind k);
kvo_status wire_reply_kind_parse(const char *s, wire_reply_kind *out);

/* The body of an END or TOO_NEW message. */
typedef struct wire_reply_end {
    wire_reply_kind kind; /* END: EVENTS or DUMP, what came before */
    uint64_t sent;        /* END: envelopes sent before it */
    bool has_as_of;       /* END of a dump, TOO_NEW: the sequence below */
    uint64_t as_of;       /* DUMP: the state is as of this envelope;
                               TOO_NEW: the relay's last sequence */
    uint64_t blocks;      /* END of a dump: blocks in it */
} wire_reply_end;

kvo_status wire_reply_end_encode(wire_reply_kind what, const wire_reply_end *e,
                                 kvo_buf *out);

struct kvo_json; /* kvo_json.h */

/* Decoders: one strict JSON object (kvo_json); unknown keys ignored, a
 * missing or mistyped field is KVO_EPROTO naming it. doc holds the parse
 * and must outlive what points into it. */
kvo_status wire_announce_decode(struct kvo_json *doc, const void *body,
                                size_t len, wire_announce *a, kvo_err *err);
kvo_status wire_recovery_req_decode(struct kvo_json *doc, const void *body,
                                    size_t len, wire_recovery_req *r,
                                    kvo_err *err);
/* what: END or TOO_NEW (the header said which). */
kvo_status wire_reply_end_decode(struct kvo_json *doc, wire_reply_kind what,
                                 const void *body, size_t len,
                                 wire_reply_end *e, kvo_err *err);

/* ======================================================================== */
/* Capture files (DESIGN §3)                                                 */
/* ======================================================================== */

#define WIRE_CAP_MAGIC "KVOCAP1\n"
#define WIRE_CAP_MAX_FRAMES 16

typedef struct wire_frame {
    const uint8_t *data;
    size_t len;
} wire_frame;

typedef struct wire_cap_writer wire_cap_writer;
typedef struct wire_cap_reader wire_cap_reader;

typedef struct wire_cap_record {
    uint64_t unix_ns;
    uint32_t n_frames;
    wire_frame frames[WIRE_CAP_MAX_FRAMES]; /* valid until the next read */
    uint64_t offset; /* file offset of the record header */
} wire_cap_record;

/* Create/truncate path and write the magic. */
kvo_status wire_cap_create(wire_cap_writer **out, const char *path);
kvo_status wire_cap_write(wire_cap_writer *w, uint64_t unix_ns,
                          const wire_frame *frames, uint32_t n_frames);
kvo_status wire_cap_flush(wire_cap_writer *w);
/* Flushes and closes; NULL is a no-op. */
void wire_cap_close(wire_cap_writer *w);

/* Open and check the magic (KVO_EPROTO when it is not a capture). */
kvo_status wire_cap_open(wire_cap_reader **out, const char *path,
                         const wire_limits *lim);
/* KVO_OK with a record, KVO_EOF at a clean end, KVO_ETRUNC / KVO_EPROTO /
 * KVO_ETOOBIG on damage (err says where). */
kvo_status wire_cap_next(wire_cap_reader *r, wire_cap_record *rec,
                         kvo_err *err);
void wire_cap_free(wire_cap_reader *r);

/* ======================================================================== */
/* ZMQ framing helpers (DESIGN §4)                                           */
/* ======================================================================== */

/* 8-byte big-endian sequence frame. */
void wire_seq_put(uint8_t out[8], uint64_t seq);
kvo_status wire_seq_get(const uint8_t *p, size_t len, uint64_t *seq);
#define WIRE_REPLAY_END UINT64_MAX /* FF x 8: end-of-replay marker */

#endif /* WIRE_H */
