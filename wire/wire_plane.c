/* wire_plane.c -- the event plane, relay -> indexer (DESIGN §6), in Dynamo's
 * msgpack form.
 *
 *   envelope  {"publisher_id": u64, "sequence": u64, "published_at": u64 ms,
 *              "topic": "kv-events", "payload": bin}
 *   payload   [RouterEvent, ...]          (or one RouterEvent: older Dynamo)
 *   RouterEvent {"worker_id": u64, "storage_tier": str,
 *                "event": {"event_id": u64, "data": DATA, "dp_rank": u32}}
 *   DATA      {"stored": {"parent_hash": u64|nil, "start_position": nil,
 *                         "blocks": [{"block_hash": u64, "tokens_hash": u64,
 *                                     "mm_extra_info": nil}, ...]}}
 *           | {"removed": {"block_hashes": [u64, ...]}}
 *           | "cleared"
 *
 * Encoding writes the keys in exactly that order, directly into the output
 * buffer (shortest int, str and bin forms, as rmp-serde writes them), so the
 * output is byte-identical to Dynamo's and to the vectors.
 *
 * Decoding: the envelope, and then the payload bin, each pass the
 * structural pre-check (wire_int.h) before anything is allocated; after
 * that every count is backed by input bytes, so arrays are sized from the
 * counts and read with the bounds-checked cursor. Keys are looked up by
 * name, unknown keys are skipped, duplicate keys are rejected (serde does
 * the same). start_position and mm_extra_info are accepted with any value
 * and dropped (the relay only ever sends nil). Optional on input, with the
 * default older Dynamo implies: storage_tier (device), dp_rank (0),
 * parent_hash (nil). Everything decoded is copied into the message's arena.
 */
#include "wire_int.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ======================================================================== */
/* Tiers                                                                     */
/* ======================================================================== */

static const struct {
    const char *s;
    uint8_t len;
} tier_names[WIRE_TIER_COUNT] = {
#define T(s)                                                                   \
    { s, sizeof(s) - 1 }
    [WIRE_TIER_DEVICE] = T("device"),
    [WIRE_TIER_HOST_PINNED] = T("host_pinned"),
    [WIRE_TIER_DISK] = T("disk"),
    [WIRE_TIER_EXTERNAL] = T("external"),
#undef T
};

const char *wire_tier_name(wire_tier t) {
    if ((unsigned)t >= WIRE_TIER_COUNT) return "unknown";
    return tier_names[t].s;
}

static bool mem_is(const void *p, size_t n, const char *lit) {
    size_t ln = strlen(lit);
    return n == ln && memcmp(p, lit, n) == 0;
}

kvo_status wire_tier_parse(const char *s, size_t len, wire_tier *out) {
    if (!s) return KVO_EINVAL;
    for (int t = 0; t < WIRE_TIER_COUNT; t++) {
        if (mem_is(s, len, tier_names[t].s)) {
            *out = (wire_tier)t;
            return KVO_OK;
        }
    }
    return KVO_EINVAL;
}

static bool medium_is(wire_str m, const char *lit) {
    return m.len == strlen(lit) && strncasecmp(m.p, lit, m.len) == 0;
}

/* vLLM's medium is an open set. The three it documents map to their tier;
 * everything else (STORAGE, remote connectors, names from newer engines)
 * is storage outside the host: external. Case is ignored. */
wire_tier wire_tier_from_medium(wire_str medium) {
    if (!medium.p || medium_is(medium, "GPU")) return WIRE_TIER_DEVICE;
    if (medium_is(medium, "CPU") || medium_is(medium, "CPU_PINNED"))
        return WIRE_TIER_HOST_PINNED;
    if (medium_is(medium, "DISK")) return WIRE_TIER_DISK;
    return WIRE_TIER_EXTERNAL;
}

/* ======================================================================== */
/* Message lifecycle                                                         */
/* ======================================================================== */

void wire_plane_init(wire_plane_msg *m) {
    memset(m, 0, sizeof(*m));
    kvo_arena_init(&m->arena);
}

void wire_plane_fini(wire_plane_msg *m) {
    if (!m) return;
    kvo_arena_fini(&m->arena);
    memset(m, 0, sizeof(*m));
}

void wire_plane_reset(wire_plane_msg *m) {
    kvo_arena arena = m->arena;
    kvo_arena_reset(&arena);
    memset(m, 0, sizeof(*m));
    m->arena = arena;
}

/* ======================================================================== */
/* Decoder                                                                   */
/* ======================================================================== */

typedef struct dec {
    wire_rd r;
    size_t base; /* offset of r.buf in the envelope, for error offsets */
    wire_plane_msg *m;
    kvo_err *err;
    const char *where; /* "events[3]" etc., for messages */
    char where_buf[48];
} dec;

static kvo_status expected(dec *d, kvo_status st, const char *field,
                           const char *what) {
    if (st == KVO_ETRUNC)
        return kvo_err_set(d->err, st, d->base + d->r.pos, "%s%s: input ends",
                           d->where, field);
    return kvo_err_set(d->err, KVO_EPROTO, d->base + d->r.pos,
                       "%s%s: expected %s, got %s", d->where, field, what,
                       wire_rd_peek(&d->r) < 0
                           ? "end of input"
                           : wire_mp_type_name((uint8_t)wire_rd_peek(&d->r)));
}

static kvo_status rd_u64(dec *d, const char *field, uint64_t *v) {
    size_t at = d->r.pos;
    bool neg;
    kvo_status st = wire_rd_int(&d->r, &neg, v);
    if (st != KVO_OK) return expected(d, st, field, "unsigned int");
    if (neg) {
        d->r.pos = at;
        return kvo_err_set(d->err, KVO_EPROTO, d->base + at,
                           "%s%s: negative value", d->where, field);
    }
    return KVO_OK;
}

static kvo_status rd_map(dec *d, const char *field, uint32_t *n) {
    kvo_status st = wire_rd_map(&d->r, n);
    return st == KVO_OK ? KVO_OK : expected(d, st, field, "map");
}

static kvo_status rd_array(dec *d, const char *field, uint32_t *n) {
    kvo_status st = wire_rd_array(&d->r, n);
    return st == KVO_OK ? KVO_OK : expected(d, st, field, "array");
}

/* A map key (pointing into the input). */
static kvo_status rd_key(dec *d, const char *inmap, const uint8_t **p,
                         uint32_t *n) {
    kvo_status st = wire_rd_str(&d->r, p, n);
    return st == KVO_OK ? KVO_OK : expected(d, st, inmap, "str key");
}

static kvo_status rd_skip(dec *d, const char *field) {
    kvo_status st = wire_rd_skip(&d->r);
    return st == KVO_OK ? KVO_OK : expected(d, st, field, "a value");
}

/* Marks key bit `bit` as seen; a second sighting is an error. */
static kvo_status seen_once(dec *d, unsigned *seen, unsigned bit, size_t key_at,
                            const char *key) {
    if (*seen & (1u << bit))
        return kvo_err_set(d->err, KVO_EPROTO, d->base + key_at,
                           "%sduplicate key \"%s\"", d->where, key);
    *seen |= 1u << bit;
    return KVO_OK;
}

static kvo_status missing(dec *d, size_t map_at, const char *key) {
    return kvo_err_set(d->err, KVO_EPROTO, d->base + map_at,
                       "%smissing key \"%s\"", d->where, key);
}

static void *arena_array(dec *d, size_t n, size_t size) {
    if (n == 0) return NULL;
    return kvo_arena_alloc(&d->m->arena, n * size);
}

static kvo_status oom(dec *d) {
    return kvo_err_set(d->err, KVO_ENOMEM, d->base + d->r.pos,
                       "%sout of memory", d->where);
}

/* The smallest valid encodings, so counts that cannot be real are refused
 * before sizing an allocation from them (the pre-check only guarantees one
 * byte per element):
 *   RouterEvent {"worker_id": 0, "event": {"event_id": 0, "data": "cleared"}}
 *   block       {"block_hash": 0, "tokens_hash": 0} */
#define MIN_EVENT_BYTES 42u
#define MIN_BLOCK_BYTES 26u

static kvo_status dec_blocks(dec *d, wire_revent *ev) {
    uint32_t n;
    kvo_status st = rd_array(d, "blocks", &n);
    if (st != KVO_OK) return st;
    if ((size_t)n > (d->r.len - d->r.pos) / MIN_BLOCK_BYTES)
        return kvo_err_set(d->err, KVO_EPROTO, d->base + d->r.pos,
                           "%sblocks: %u blocks cannot fit in %zu bytes",
                           d->where, n, d->r.len - d->r.pos);
    ev->blocks = arena_array(d, n, sizeof(*ev->blocks));
    if (n && !ev->blocks) return oom(d);
    ev->n_blocks = n;
    for (uint32_t i = 0; i < n; i++) {
        size_t map_at = d->r.pos;
        uint32_t nk;
        if ((st = rd_map(d, "blocks[]", &nk)) != KVO_OK) return st;
        unsigned seen = 0;
        for (uint32_t k = 0; k < nk; k++) {
            size_t key_at = d->r.pos;
            const uint8_t *kp = NULL;
            uint32_t kn = 0;
            if ((st = rd_key(d, "blocks[]", &kp, &kn)) != KVO_OK) return st;
            if (mem_is(kp, kn, "block_hash")) {
                if ((st = seen_once(d, &seen, 0, key_at, "block_hash")) ||
                    (st = rd_u64(d, "block_hash", &ev->blocks[i].block_hash)))
                    return st;
            } else if (mem_is(kp, kn, "tokens_hash")) {
                if ((st = seen_once(d, &seen, 1, key_at, "tokens_hash")) ||
                    (st = rd_u64(d, "tokens_hash", &ev->blocks[i].tokens_hash)))
                    return st;
            } else if ((st = rd_skip(d, "blocks[]")) != KVO_OK) {
                return st; /* mm_extra_info and unknown keys */
            }
        }
        if (!(seen & 1)) return missing(d, map_at, "block_hash");
        if (!(seen & 2)) return missing(d, map_at, "tokens_hash");
    }
    return KVO_OK;
}

static kvo_status dec_stored(dec *d, wire_revent *ev) {
    size_t map_at = d->r.pos;
    uint32_t nk;
    kvo_status st = rd_map(d, "stored", &nk);
    if (st != KVO_OK) return st;
    ev->type = WIRE_R_STORED;
    unsigned seen = 0;
    for (uint32_t k = 0; k < nk; k++) {
        size_t key_at = d->r.pos;
        const uint8_t *kp = NULL;
        uint32_t kn = 0;
        if ((st = rd_key(d, "stored", &kp, &kn)) != KVO_OK) return st;
        if (mem_is(kp, kn, "parent_hash")) {
            if ((st = seen_once(d, &seen, 0, key_at, "parent_hash"))) return st;
            if (!wire_rd_nil(&d->r)) {
                if ((st = rd_u64(d, "parent_hash", &ev->parent_hash)))
                    return st;
                ev->has_parent = true;
            }
        } else if (mem_is(kp, kn, "blocks")) {
            if ((st = seen_once(d, &seen, 1, key_at, "blocks")) ||
                (st = dec_blocks(d, ev)))
                return st;
        } else if ((st = rd_skip(d, "stored")) != KVO_OK) {
            return st; /* start_position and unknown keys */
        }
    }
    if (!(seen & 2)) return missing(d, map_at, "blocks");
    return KVO_OK;
}

static kvo_status dec_removed(dec *d, wire_revent *ev) {
    size_t map_at = d->r.pos;
    uint32_t nk;
    kvo_status st = rd_map(d, "removed", &nk);
    if (st != KVO_OK) return st;
    ev->type = WIRE_R_REMOVED;
    bool have = false;
    for (uint32_t k = 0; k < nk; k++) {
        size_t key_at = d->r.pos;
        const uint8_t *kp = NULL;
        uint32_t kn = 0;
        if ((st = rd_key(d, "removed", &kp, &kn)) != KVO_OK) return st;
        if (!mem_is(kp, kn, "block_hashes")) {
            if ((st = rd_skip(d, "removed")) != KVO_OK) return st;
            continue;
        }
        if (have)
            return kvo_err_set(d->err, KVO_EPROTO, d->base + key_at,
                               "%sduplicate key \"block_hashes\"", d->where);
        have = true;
        uint32_t n;
        if ((st = rd_array(d, "block_hashes", &n)) != KVO_OK) return st;
        ev->removed = arena_array(d, n, sizeof(*ev->removed));
        if (n && !ev->removed) return oom(d);
        ev->n_removed = n;
        for (uint32_t i = 0; i < n; i++)
            if ((st = rd_u64(d, "block_hashes[]", &ev->removed[i]))) return st;
    }
    if (!have) return missing(d, map_at, "block_hashes");
    return KVO_OK;
}

/* DATA: "cleared" | {"stored": ...} | {"removed": ...} | {"cleared": any} */
static kvo_status dec_data(dec *d, wire_revent *ev) {
    size_t at = d->r.pos;
    const uint8_t *p = NULL;
    uint32_t n = 0;
    if (wire_rd_str(&d->r, &p, &n) == KVO_OK) {
        if (mem_is(p, n, "cleared")) {
            ev->type = WIRE_R_CLEARED;
            return KVO_OK;
        }
        d->r.pos = at;
        return kvo_err_set(d->err, KVO_EPROTO, d->base + at,
                           "%sdata: unknown event kind \"%.*s\"", d->where,
                           (int)(n > 32 ? 32 : n), (const char *)p);
    }
    uint32_t nk;
    kvo_status st = rd_map(d, "data", &nk);
    if (st != KVO_OK) return st;
    if (nk != 1)
        return kvo_err_set(d->err, KVO_EPROTO, d->base + at,
                           "%sdata: expected one key, got %u", d->where, nk);
    size_t key_at = d->r.pos;
    if ((st = rd_key(d, "data", &p, &n)) != KVO_OK) return st;
    if (mem_is(p, n, "stored")) return dec_stored(d, ev);
    if (mem_is(p, n, "removed")) return dec_removed(d, ev);
    if (mem_is(p, n, "cleared")) {
        ev->type = WIRE_R_CLEARED;
        return rd_skip(d, "cleared");
    }
    return kvo_err_set(d->err, KVO_EPROTO, d->base + key_at,
                       "%sdata: unknown event kind \"%.*s\"", d->where,
                       (int)(n > 32 ? 32 : n), (const char *)p);
}

static kvo_status dec_event(dec *d, wire_revent *ev) {
    size_t map_at = d->r.pos;
    uint32_t nk;
    kvo_status st = rd_map(d, "event", &nk);
    if (st != KVO_OK) return st;
    unsigned seen = 0;
    for (uint32_t k = 0; k < nk; k++) {
        size_t key_at = d->r.pos;
        const uint8_t *kp = NULL;
        uint32_t kn = 0;
        if ((st = rd_key(d, "event", &kp, &kn)) != KVO_OK) return st;
        if (mem_is(kp, kn, "event_id")) {
            if ((st = seen_once(d, &seen, 0, key_at, "event_id")) ||
                (st = rd_u64(d, "event_id", &ev->event_id)))
                return st;
        } else if (mem_is(kp, kn, "data")) {
            if ((st = seen_once(d, &seen, 1, key_at, "data")) ||
                (st = dec_data(d, ev)))
                return st;
        } else if (mem_is(kp, kn, "dp_rank")) {
            uint64_t r;
            size_t at = d->r.pos;
            if ((st = seen_once(d, &seen, 2, key_at, "dp_rank")) ||
                (st = rd_u64(d, "dp_rank", &r)))
                return st;
            if (r > UINT32_MAX)
                return kvo_err_set(d->err, KVO_EPROTO, d->base + at,
                                   "%sdp_rank: %llu exceeds u32", d->where,
                                   (unsigned long long)r);
            ev->dp_rank = (uint32_t)r;
        } else if ((st = rd_skip(d, "event")) != KVO_OK) {
            return st;
        }
    }
    if (!(seen & 1)) return missing(d, map_at, "event_id");
    if (!(seen & 2)) return missing(d, map_at, "data");
    return KVO_OK;
}

static kvo_status dec_router_event(dec *d, wire_revent *ev) {
    size_t map_at = d->r.pos;
    uint32_t nk;
    kvo_status st = rd_map(d, "", &nk);
    if (st != KVO_OK) return st;
    unsigned seen = 0;
    ev->tier = WIRE_TIER_DEVICE;
    for (uint32_t k = 0; k < nk; k++) {
        size_t key_at = d->r.pos;
        const uint8_t *kp = NULL;
        uint32_t kn = 0;
        if ((st = rd_key(d, "", &kp, &kn)) != KVO_OK) return st;
        if (mem_is(kp, kn, "worker_id")) {
            if ((st = seen_once(d, &seen, 0, key_at, "worker_id")) ||
                (st = rd_u64(d, "worker_id", &ev->worker_id)))
                return st;
        } else if (mem_is(kp, kn, "storage_tier")) {
            size_t at = d->r.pos;
            const uint8_t *tp = NULL;
            uint32_t tn = 0;
            if ((st = seen_once(d, &seen, 1, key_at, "storage_tier")))
                return st;
            if ((st = wire_rd_str(&d->r, &tp, &tn)) != KVO_OK)
                return expected(d, st, "storage_tier", "str");
            if (wire_tier_parse((const char *)tp, tn, &ev->tier) != KVO_OK)
                return kvo_err_set(d->err, KVO_EPROTO, d->base + at,
                                   "%sstorage_tier: unknown tier \"%.*s\"",
                                   d->where, (int)(tn > 32 ? 32 : tn),
                                   (const char *)tp);
        } else if (mem_is(kp, kn, "event")) {
            if ((st = seen_once(d, &seen, 2, key_at, "event")) ||
                (st = dec_event(d, ev)))
                return st;
        } else if ((st = rd_skip(d, "")) != KVO_OK) {
            return st;
        }
    }
    if (!(seen & 1)) return missing(d, map_at, "worker_id");
    if (!(seen & 4)) return missing(d, map_at, "event");
    return KVO_OK;
}

static kvo_status dec_payload(dec *d) {
    wire_plane_msg *m = d->m;
    int b = wire_rd_peek(&d->r);
    uint32_t n = 1;
    if (b >= 0 && ((b & 0xf0) == 0x80 || b == 0xde || b == 0xdf)) {
        m->single_form = true;
    } else {
        kvo_status st = rd_array(d, "payload", &n);
        if (st != KVO_OK) return st;
    }
    if ((size_t)n > (d->r.len - d->r.pos) / MIN_EVENT_BYTES + m->single_form)
        return kvo_err_set(d->err, KVO_EPROTO, d->base + d->r.pos,
                           "payload: %u events cannot fit in %zu bytes", n,
                           d->r.len - d->r.pos);
    m->events = arena_array(d, n, sizeof(*m->events));
    if (n && !m->events) return oom(d);
    if (n) memset(m->events, 0, (size_t)n * sizeof(*m->events));
    for (uint32_t i = 0; i < n; i++) {
        snprintf(d->where_buf, sizeof(d->where_buf), "payload[%u].", i);
        d->where = d->where_buf;
        kvo_status st = dec_router_event(d, &m->events[i]);
        if (st != KVO_OK) return st;
        m->n_events = i + 1;
    }
    d->where = "";
    return KVO_OK;
}

enum { K_PUB, K_SEQ, K_AT, K_TOPIC, K_PAYLOAD };

static kvo_status dec_envelope(dec *d, const wire_limits *lim) {
    wire_plane_msg *m = d->m;
    uint32_t nk;
    kvo_status st = rd_map(d, "envelope", &nk);
    if (st != KVO_OK) return st;
    unsigned seen = 0;
    const uint8_t *payload = NULL;
    uint32_t plen = 0;
    size_t poff = 0;
    for (uint32_t k = 0; k < nk; k++) {
        size_t key_at = d->r.pos;
        const uint8_t *kp = NULL;
        uint32_t kn = 0;
        if ((st = rd_key(d, "envelope", &kp, &kn)) != KVO_OK) return st;
        if (mem_is(kp, kn, "publisher_id")) {
            if ((st = seen_once(d, &seen, K_PUB, key_at, "publisher_id")) ||
                (st = rd_u64(d, "publisher_id", &m->publisher_id)))
                return st;
        } else if (mem_is(kp, kn, "sequence")) {
            if ((st = seen_once(d, &seen, K_SEQ, key_at, "sequence")) ||
                (st = rd_u64(d, "sequence", &m->sequence)))
                return st;
        } else if (mem_is(kp, kn, "published_at")) {
            if ((st = seen_once(d, &seen, K_AT, key_at, "published_at")) ||
                (st = rd_u64(d, "published_at", &m->published_at)))
                return st;
        } else if (mem_is(kp, kn, "topic")) {
            const uint8_t *tp = NULL;
            uint32_t tn = 0;
            if ((st = seen_once(d, &seen, K_TOPIC, key_at, "topic"))) return st;
            if ((st = wire_rd_str(&d->r, &tp, &tn)) != KVO_OK)
                return expected(d, st, "topic", "str");
            char *t = kvo_arena_alloc(&m->arena, (size_t)tn + 1);
            if (!t) return oom(d);
            memcpy(t, tp, tn);
            t[tn] = '\0';
            m->topic.p = t;
            m->topic.len = tn;
        } else if (mem_is(kp, kn, "payload")) {
            if ((st = seen_once(d, &seen, K_PAYLOAD, key_at, "payload")))
                return st;
            if ((st = wire_rd_bin(&d->r, &payload, &plen)) != KVO_OK)
                return expected(d, st, "payload", "bin");
            poff = (size_t)(payload - d->r.buf);
        } else if ((st = rd_skip(d, "envelope")) != KVO_OK) {
            return st;
        }
    }
    static const char *const req[] = {"publisher_id", "sequence",
                                      "published_at", "topic", "payload"};
    for (unsigned i = 0; i < KVO_ARRAY_LEN(req); i++)
        if (!(seen & (1u << i))) return missing(d, 0, req[i]);

    /* The payload is a msgpack value of its own: bound it too. */
    st = wire_precheck(payload, plen, lim, NULL, d->err);
    if (st != KVO_OK) {
        if (d->err) d->err->offset += poff;
        return st;
    }
    dec pd = {.r = {payload, plen, 0},
              .base = poff,
              .m = m,
              .err = d->err,
              .where = ""};
    return dec_payload(&pd);
}

kvo_status wire_plane_decode(const uint8_t *buf, size_t len,
                             const wire_limits *lim, wire_plane_msg *m,
                             kvo_err *err) {
    wire_plane_reset(m);
    if (!buf && len) return kvo_err_set(err, KVO_EINVAL, 0, "no input");
    kvo_status st = wire_precheck(buf, len, lim, NULL, err);
    if (st == KVO_OK) {
        dec d = {
            .r = {buf, len, 0}, .base = 0, .m = m, .err = err, .where = ""};
        st = dec_envelope(&d, lim);
    }
    if (st != KVO_OK) wire_plane_reset(m);
    return st;
}

/* ======================================================================== */
/* Encoder                                                                   */
/* ======================================================================== */

/* Direct writes into reserved room with wire_int.h's wire_put_*: the key
 * strings are constants with their fixstr header, ints take the shortest
 * form (positive fixint, cc, cd, ce, cf: what msgpack-c and rmp-serde
 * write), so the bytes are those of the vectors without a packer call per
 * field. Room is reserved once per message from upper bounds (ENC_* below),
 * so the writes need no checks. */

/* Upper bounds of what the writers below produce. */
#define ENC_ENVELOPE 96u /* + the topic string */
#define ENC_EVENT 160u   /* a RouterEvent without its blocks/hashes */
#define ENC_BLOCK 57u    /* {"block_hash", "tokens_hash", "mm_extra_info"} */
#define ENC_HASH 9u

static uint8_t *put_router_event(uint8_t *p, const wire_revent *ev) {
    *p++ = 0x83;
    WIRE_PUT_KEY(p, "worker_id");
    p = wire_put_uint(p, ev->worker_id);
    WIRE_PUT_KEY(p, "storage_tier");
    p = wire_put_blob(p, false, tier_names[ev->tier].s,
                      tier_names[ev->tier].len);
    WIRE_PUT_KEY(p, "event");
    *p++ = 0x83;
    WIRE_PUT_KEY(p, "event_id");
    p = wire_put_uint(p, ev->event_id);
    WIRE_PUT_KEY(p, "data");
    switch (ev->type) {
    case WIRE_R_STORED:
        *p++ = 0x81;
        WIRE_PUT_KEY(p, "stored");
        *p++ = 0x83;
        WIRE_PUT_KEY(p, "parent_hash");
        if (ev->has_parent)
            p = wire_put_uint(p, ev->parent_hash);
        else
            *p++ = 0xc0;
        WIRE_PUT_KEY(p, "start_position");
        *p++ = 0xc0;
        WIRE_PUT_KEY(p, "blocks");
        p = wire_put_container(p, false, ev->n_blocks);
        for (uint32_t i = 0; i < ev->n_blocks; i++) {
            *p++ = 0x83;
            WIRE_PUT_KEY(p, "block_hash");
            p = wire_put_uint(p, ev->blocks[i].block_hash);
            WIRE_PUT_KEY(p, "tokens_hash");
            p = wire_put_uint(p, ev->blocks[i].tokens_hash);
            WIRE_PUT_KEY(p, "mm_extra_info");
            *p++ = 0xc0;
        }
        break;
    case WIRE_R_REMOVED:
        *p++ = 0x81;
        WIRE_PUT_KEY(p, "removed");
        *p++ = 0x81;
        WIRE_PUT_KEY(p, "block_hashes");
        p = wire_put_container(p, false, ev->n_removed);
        for (uint32_t i = 0; i < ev->n_removed; i++)
            p = wire_put_uint(p, ev->removed[i]);
        break;
    default: /* WIRE_R_CLEARED (checked by the caller) */
        WIRE_PUT_KEY(p, "cleared");
        break;
    }
    WIRE_PUT_KEY(p, "dp_rank");
    return wire_put_uint(p, ev->dp_rank);
}

/* The payload is written after a 5-byte bin32 header, which is then shrunk
 * to the shortest bin header (the payload moves by at most 3 bytes, and
 * only when it is under 64 KiB), so no second buffer is needed. */
kvo_status wire_plane_encode(const wire_plane_msg *m, kvo_buf *out) {
    if (!m || !out || (m->n_events && !m->events)) return KVO_EINVAL;
    const char *topic = m->topic.p ? m->topic.p : "kv-events";
    size_t tlen = m->topic.p ? m->topic.len : strlen(topic);
    size_t room = ENC_ENVELOPE + tlen;
    for (uint32_t i = 0; i < m->n_events; i++) {
        const wire_revent *ev = &m->events[i];
        if ((ev->type == WIRE_R_STORED && ev->n_blocks && !ev->blocks) ||
            (ev->type == WIRE_R_REMOVED && ev->n_removed && !ev->removed) ||
            ev->type < WIRE_R_STORED || ev->type > WIRE_R_CLEARED ||
            (unsigned)ev->tier >= WIRE_TIER_COUNT)
            return KVO_EINVAL;
        room += ENC_EVENT;
        if (ev->type == WIRE_R_STORED) room += (size_t)ev->n_blocks * ENC_BLOCK;
        if (ev->type == WIRE_R_REMOVED)
            room += (size_t)ev->n_removed * ENC_HASH;
    }
    if (kvo_buf_reserve(out, room) != KVO_OK) return KVO_ENOMEM;
    uint8_t *start = out->data + out->len, *p = start;
    *p++ = 0x85;
    WIRE_PUT_KEY(p, "publisher_id");
    p = wire_put_uint(p, m->publisher_id);
    WIRE_PUT_KEY(p, "sequence");
    p = wire_put_uint(p, m->sequence);
    WIRE_PUT_KEY(p, "published_at");
    p = wire_put_uint(p, m->published_at);
    WIRE_PUT_KEY(p, "topic");
    p = wire_put_blob(p, false, topic, (uint32_t)tlen);
    WIRE_PUT_KEY(p, "payload");
    uint8_t *h = p;
    p += 5;
    bool single = m->single_form && m->n_events == 1;
    if (!single) p = wire_put_container(p, false, m->n_events);
    for (uint32_t i = 0; i < m->n_events; i++)
        p = put_router_event(p, &m->events[i]);
    size_t plen = (size_t)(p - h) - 5;
    unsigned w;
    if (plen <= 0xff) {
        h[0] = 0xc4;
        w = 1;
    } else if (plen <= 0xffff) {
        h[0] = 0xc5;
        w = 2;
    } else if (plen <= 0xffffffffu) {
        h[0] = 0xc6;
        w = 4;
    } else {
        return KVO_ETOOBIG; /* out->len untouched: nothing appended */
    }
    wire_put_be(h + 1, plen, w);
    if (w < 4) {
        memmove(h + 1 + w, h + 5, plen);
        p -= 4 - w;
    }
    out->len += (size_t)(p - start);
    return KVO_OK;
}

/* ======================================================================== */
/* JSON view                                                                 */
/* ======================================================================== */

static json_object *json_u64(uint64_t v) { return json_object_new_uint64(v); }

static json_object *router_event_json(const wire_revent *ev) {
    json_object *data;
    if (ev->type == WIRE_R_CLEARED) {
        data = json_object_new_string("cleared");
    } else if (ev->type == WIRE_R_STORED) {
        json_object *blocks = json_object_new_array_ext((int)ev->n_blocks);
        for (uint32_t i = 0; i < ev->n_blocks; i++) {
            json_object *b = json_object_new_object();
            json_object_object_add(b, "block_hash",
                                   json_u64(ev->blocks[i].block_hash));
            json_object_object_add(b, "tokens_hash",
                                   json_u64(ev->blocks[i].tokens_hash));
            json_object_object_add(b, "mm_extra_info", NULL);
            json_object_array_add(blocks, b);
        }
        json_object *st = json_object_new_object();
        json_object_object_add(st, "parent_hash",
                               ev->has_parent ? json_u64(ev->parent_hash)
                                              : NULL);
        json_object_object_add(st, "start_position", NULL);
        json_object_object_add(st, "blocks", blocks);
        data = json_object_new_object();
        json_object_object_add(data, "stored", st);
    } else {
        json_object *hashes = json_object_new_array_ext((int)ev->n_removed);
        for (uint32_t i = 0; i < ev->n_removed; i++)
            json_object_array_add(hashes, json_u64(ev->removed[i]));
        json_object *rm = json_object_new_object();
        json_object_object_add(rm, "block_hashes", hashes);
        data = json_object_new_object();
        json_object_object_add(data, "removed", rm);
    }
    json_object *e = json_object_new_object();
    json_object_object_add(e, "event_id", json_u64(ev->event_id));
    json_object_object_add(e, "data", data);
    json_object_object_add(e, "dp_rank", json_u64(ev->dp_rank));
    json_object *r = json_object_new_object();
    json_object_object_add(r, "worker_id", json_u64(ev->worker_id));
    json_object_object_add(r, "storage_tier",
                           json_object_new_string(wire_tier_name(ev->tier)));
    json_object_object_add(r, "event", e);
    return r;
}

kvo_status wire_plane_to_json(const wire_plane_msg *m, json_object **out) {
    if (!m || !out || (m->n_events && !m->events)) return KVO_EINVAL;
    json_object *j = json_object_new_object();
    if (!j) return KVO_ENOMEM;
    json_object_object_add(j, "publisher_id", json_u64(m->publisher_id));
    json_object_object_add(j, "sequence", json_u64(m->sequence));
    json_object_object_add(j, "published_at", json_u64(m->published_at));
    json_object_object_add(
        j, "topic",
        m->topic.p ? json_object_new_string_len(m->topic.p, (int)m->topic.len)
                   : NULL);
    json_object *evs = json_object_new_array_ext((int)m->n_events);
    for (uint32_t i = 0; i < m->n_events; i++)
        json_object_array_add(evs, router_event_json(&m->events[i]));
    json_object_object_add(j, "router_events", evs);
    *out = j;
    return KVO_OK;
}
