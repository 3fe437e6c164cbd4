/* idx_feed.c -- event-plane messages into a tree (DESIGN §6), and the JSON
 * shapes the service and replay share.
 *
 * A message is decoded into one reused wire_plane_msg (its arena keeps its
 * memory), checked against its publisher's sequence, and its RouterEvents
 * are applied in order. Only device-tier events reach the tree: lower tiers
 * are Dynamo's separate lower-tier indexers, not the primary overlap.
 *
 * Publishers (idx.h says what is kept and for how long):
 *
 *   pubs[0, npubs)  sorted by publisher_id, npubs <= max_pubs, each a pub:
 *                   its idx_publisher, when it was last heard (the feed's
 *                   clock), its jump state and the ring of its last RING
 *                   (sequence, body hash) pairs
 *   gone[]          a ring of the last max_pubs forgotten (id, last
 *                   sequence), oldest at gone_head once full; gone_at maps
 *                   an id to its ring position + 1 (a slot reused for
 *                   another id is no longer pointed at)
 *
 * oldest_ms is at or below every tracked publisher's heard_ms, so an
 * expiry that cannot find anyone idle returns without a scan.
 *
 * Sequence rule per tracked publisher, on a message with sequence seq that
 * is not an exact duplicate (the ring holds seq with the same body hash):
 *
 *   first heard         missed = seq (0..seq-1 went by unheard)
 *   seq > last          missed = seq - last - 1
 *   seq in the range the previous message jumped over, not remembered:
 *                       a rewind (the jump was bogus): last = seq
 *   seq <= last, remembered with another body, or 0: a restart: last = seq
 *   seq <= last, otherwise: taken for an old duplicate, dropped
 *
 * A message with missed > 0 leaves its publisher in a jump (from the old
 * last, or from nothing when first heard) until the next applied message.
 * Counters saturate instead of wrapping.
 */
#include "idx_int.h"
#include "kvo_map.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define RING 256 /* bodies remembered per publisher, for exact duplicates */
#define PUBS_FIRST_CAP 8 /* publisher slots allocated at first */
#define U64_DIGITS 20    /* decimal digits of the largest u64 */

/* What the previous applied message did to the sequence. */
typedef enum jump_state {
    JUMP_NONE = 0,
    JUMP_FROM,  /* jumped ahead from jump_from */
    JUMP_FIRST, /* first heard above 0 */
} jump_state;

typedef struct pub {
    idx_publisher p;
    uint64_t heard_ms;  /* the feed's clock at its last message */
    jump_state jump;
    uint64_t jump_from; /* JUMP_FROM: last_sequence before the jump */
    uint64_t ring_seq[RING];
    uint64_t ring_hash[RING];
} pub;

typedef struct gone {
    uint64_t id, last_sequence;
} gone;

struct idx_feed {
    idx_tree *tree;
    wire_plane_msg msg;
    wire_limits lim;
    idx_feed_counters c;
    pub **pubs; /* sorted by publisher_id */
    size_t npubs, cap;
    size_t max_pubs;
    uint64_t idle_ms; /* 0 = never forget */
    uint64_t now_ms, oldest_ms;
    gone *gone;       /* max_pubs slots, allocated at the first expiry */
    size_t gone_len, gone_head;
    kvo_map gone_at;  /* id -> position in gone + 1 */
};

static uint64_t sat_add(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

size_t idx_prompt_hash(const uint64_t *tokens, size_t n, uint32_t block_size,
                       const char *lora, const char *salt, uint64_t *out) {
    if (block_size == 0) return 0;
    uint64_t seed = wire_router_seed(lora, lora ? strlen(lora) : 0, salt,
                                     salt ? strlen(salt) : 0);
    return wire_router_hash_blocks(tokens, n, block_size, seed, out);
}

kvo_status idx_feed_new(idx_feed **out, const idx_feed_cfg *cfg) {
    idx_feed *f = kvo_calloc(1, sizeof(*f));
    if (!f) return KVO_ENOMEM;
    kvo_status s = idx_tree_new(&f->tree);
    if (s != KVO_OK) {
        kvo_free(f);
        return s;
    }
    wire_plane_init(&f->msg);
    wire_limits_default(&f->lim);
    f->max_pubs = cfg && cfg->max_publishers ? cfg->max_publishers
                                             : IDX_MAX_PUBLISHERS_DEFAULT;
    f->idle_ms = cfg ? cfg->publisher_idle_ms : 0;
    kvo_map_init(&f->gone_at);
    *out = f;
    return KVO_OK;
}

void idx_feed_free(idx_feed *f) {
    if (!f) return;
    idx_tree_free(f->tree);
    wire_plane_fini(&f->msg);
    for (size_t i = 0; i < f->npubs; i++) kvo_free(f->pubs[i]);
    kvo_free(f->pubs);
    kvo_free(f->gone);
    kvo_map_fini(&f->gone_at);
    kvo_free(f);
}

idx_tree *idx_feed_tree(idx_feed *f) { return f->tree; }

void idx_feed_set_clock(idx_feed *f, uint64_t now_ms) {
    if (now_ms > f->now_ms) f->now_ms = now_ms;
}

/* Where publisher id is in pubs, or would be inserted. */
static size_t pub_pos(const idx_feed *f, uint64_t id) {
    size_t lo = 0, hi = f->npubs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->pubs[mid]->p.publisher_id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static pub *pub_find(const idx_feed *f, uint64_t id) {
    size_t i = pub_pos(f, id);
    return i < f->npubs && f->pubs[i]->p.publisher_id == id ? f->pubs[i]
                                                            : NULL;
}

/* Keep a forgotten publisher's last sequence (best effort: out of memory,
 * it is forgotten whole). */
static void remember(idx_feed *f, uint64_t id, uint64_t last_sequence) {
    if (!f->gone && !(f->gone = kvo_malloc(f->max_pubs * sizeof(*f->gone))))
        return;
    size_t pos;
    if (f->gone_len < f->max_pubs) {
        pos = f->gone_len++;
    } else { /* the oldest goes */
        pos = f->gone_head;
        f->gone_head = (f->gone_head + 1) % f->max_pubs;
        uint64_t *at = kvo_map_get(&f->gone_at, f->gone[pos].id);
        if (at && *at == pos + 1) kvo_map_del(&f->gone_at, f->gone[pos].id);
    }
    bool added;
    uint64_t *at = kvo_map_put(&f->gone_at, id, &added);
    if (!at) return;
    f->gone[pos] = (gone){id, last_sequence};
    *at = pos + 1;
}

/* A forgotten publisher's last sequence, taken out of the memory. */
static bool recall(idx_feed *f, uint64_t id, uint64_t *last_sequence) {
    uint64_t *at = kvo_map_get(&f->gone_at, id);
    if (!at) return false;
    *last_sequence = f->gone[*at - 1].last_sequence;
    kvo_map_del(&f->gone_at, id);
    return true;
}

size_t idx_feed_expire(idx_feed *f) {
    if (!f->idle_ms || f->now_ms < f->oldest_ms ||
        f->now_ms - f->oldest_ms < f->idle_ms)
        return 0;
    size_t k = 0, n = 0;
    uint64_t oldest = f->now_ms;
    for (size_t i = 0; i < f->npubs; i++) {
        pub *p = f->pubs[i];
        if (f->now_ms - p->heard_ms >= f->idle_ms) {
            remember(f, p->p.publisher_id, p->p.last_sequence);
            kvo_free(p);
            n++;
            continue;
        }
        if (p->heard_ms < oldest) oldest = p->heard_ms;
        f->pubs[k++] = p;
    }
    f->npubs = k;
    f->oldest_ms = oldest;
    f->c.publishers_expired += n;
    return n;
}

/* A new publisher's state, in its place in pubs; one forgotten before
 * (back) comes back with its last sequence. */
static kvo_status pub_add(idx_feed *f, uint64_t id, bool back, uint64_t last,
                          pub **out) {
    kvo_status st = kvo_grow(&f->pubs, &f->cap, f->npubs + 1,
                             sizeof(*f->pubs), PUBS_FIRST_CAP);
    if (st != KVO_OK) return st;
    pub *p = kvo_calloc(1, sizeof(*p));
    if (!p) return KVO_ENOMEM;
    p->p.publisher_id = id;
    p->heard_ms = f->now_ms;
    for (int i = 0; i < RING; i++) p->ring_seq[i] = UINT64_MAX;
    if (back) p->p.last_sequence = last;
    size_t pos = pub_pos(f, id);
    memmove(&f->pubs[pos + 1], &f->pubs[pos], (f->npubs - pos) * sizeof(*f->pubs));
    f->pubs[pos] = p;
    f->npubs++;
    *out = p;
    return KVO_OK;
}

/* "A-B" (decimal, A <= B). */
static bool parse_zmq_seq(const char *s, uint64_t *a, uint64_t *b) {
    const char *dash = strchr(s, '-');
    if (!dash || dash == s || dash - s > U64_DIGITS) return false;
    char first[U64_DIGITS + 1];
    memcpy(first, s, (size_t)(dash - s));
    first[dash - s] = '\0';
    return kvo_parse_u64(first, a) == KVO_OK &&
           kvo_parse_u64(dash + 1, b) == KVO_OK && *a <= *b;
}

/* The sequence rule of the file header for a tracked publisher (fresh:
 * first heard). Fills r; false when the message is a duplicate. */
static bool track(idx_feed *f, pub *p, bool fresh, uint64_t seq,
                  uint64_t hash, idx_feed_result *r) {
    uint64_t last = p->p.last_sequence;
    uint64_t *rs = &p->ring_seq[seq % RING], *rh = &p->ring_hash[seq % RING];
    bool remembered = *rs == seq;
    p->heard_ms = f->now_ms;
    if (fresh) {
        r->missed = seq;
    } else if (seq <= last) {
        bool in_jump = p->jump != JUMP_NONE && seq < last && !remembered &&
                       seq != 0 && /* 0: a restart, as ever */
                       (p->jump == JUMP_FIRST || seq > p->jump_from);
        if (remembered && *rh == hash) {
            p->p.duplicates++;
            r->duplicate = true;
            return false;
        }
        if (in_jump) {
            r->rewind = true;
            r->jumped_from = last;
            if (p->jump == JUMP_FROM && seq - p->jump_from > 1)
                r->missed = seq - p->jump_from - 1;
        } else if (!remembered && seq != 0) {
            p->p.duplicates++;
            r->duplicate = true;
            return false;
        } else {
            p->p.restarts++;
            r->restart = true;
        }
    } else {
        r->missed = seq - last - 1;
    }
    if (r->missed) {
        p->p.gaps++;
        p->p.missed = sat_add(p->p.missed, r->missed);
    }
    p->jump = r->missed && !r->rewind ? (fresh ? JUMP_FIRST : JUMP_FROM)
                                      : JUMP_NONE;
    p->jump_from = last;
    if (r->restart || r->rewind) p->p.has_zmq = false;
    *rs = seq;
    *rh = hash;
    p->p.last_sequence = seq;
    p->p.messages++;
    return true;
}

kvo_status idx_feed_message(idx_feed *f, const uint8_t *body, size_t len,
                            const char *zmq_seq, idx_feed_result *res,
                            kvo_err *err) {
    idx_feed_result r;
    memset(&r, 0, sizeof(r));
    f->c.messages++;
    kvo_status s = wire_plane_decode(body, len, &f->lim, &f->msg, err);
    if (s != KVO_OK) {
        r.undecodable = s != KVO_ENOMEM;
        goto done;
    }
    const wire_plane_msg *m = &f->msg;
    r.publisher_id = m->publisher_id;
    r.sequence = m->sequence;
    pub *p = pub_find(f, m->publisher_id);
    bool fresh = false;
    if (!p) { /* recalled first: making room may push it out */
        uint64_t last = 0;
        bool back = recall(f, m->publisher_id, &last);
        if (f->npubs >= f->max_pubs) r.expired = (uint32_t)idx_feed_expire(f);
        if (f->npubs >= f->max_pubs) {
            r.untracked = true;
        } else {
            s = pub_add(f, m->publisher_id, back, last, &p);
            fresh = !back;
        }
        if (!p && back) remember(f, m->publisher_id, last);
        if (s != KVO_OK) goto done;
    }
    if (p && !track(f, p, fresh, m->sequence, XXH3_64bits(body, len), &r)) {
        s = KVO_EEXIST;
        goto done;
    }
    if (zmq_seq) {
        uint64_t a, b;
        if (!parse_zmq_seq(zmq_seq, &a, &b)) {
            r.bad_header = true;
        } else if (p) {
            if (!p->p.has_zmq || a < p->p.zmq_first) p->p.zmq_first = a;
            if (!p->p.has_zmq || b > p->p.zmq_last) p->p.zmq_last = b;
            p->p.has_zmq = true;
        }
    }
    for (uint32_t i = 0; i < m->n_events; i++) {
        const wire_revent *ev = &m->events[i];
        if (ev->tier != WIRE_TIER_DEVICE) {
            r.other_tier++;
            continue;
        }
        idx_evstatus st;
        kvo_status a = idx_tree_apply(f->tree, ev, &st);
        if (a != KVO_OK) {
            r.lost++;
            s = a;
        }
    }
    r.applied = true;
done:
    f->c.applied += r.applied;
    f->c.duplicates += r.duplicate;
    f->c.undecodable += r.undecodable;
    f->c.restarts += r.restart;
    f->c.rewinds += r.rewind;
    f->c.gaps += r.missed != 0;
    f->c.missed = sat_add(f->c.missed, r.missed);
    f->c.bad_headers += r.bad_header;
    f->c.other_tier += r.other_tier;
    f->c.enomem += r.lost;
    f->c.publishers_refused += r.untracked;
    if (res) *res = r;
    return s;
}

void idx_feed_counters_get(const idx_feed *f, idx_feed_counters *out) {
    *out = f->c;
    out->publishers = f->npubs;
}

bool idx_feed_zmq_last(const idx_feed *f, uint64_t publisher_id,
                       uint64_t *zmq_last) {
    const pub *p = pub_find(f, publisher_id);
    if (!p || !p->p.has_zmq) return false;
    *zmq_last = p->p.zmq_last;
    return true;
}

kvo_status idx_feed_publishers(const idx_feed *f, idx_publisher **out,
                               size_t *n) {
    *out = NULL;
    *n = 0;
    if (!f->npubs) return KVO_OK;
    idx_publisher *v = kvo_malloc(f->npubs * sizeof(*v));
    if (!v) return KVO_ENOMEM;
    for (size_t i = 0; i < f->npubs; i++) v[i] = f->pubs[i]->p;
    *out = v;
    *n = f->npubs;
    return KVO_OK;
}

/* ======================================================================== */
/* JSON                                                                      */
/* ======================================================================== */

/* json-c's adders do not fail in ways we can act on (they return -1 only
 * when out of memory, and then the object is just incomplete); builders
 * below check the objects they create. */
static json_object *u64(uint64_t v) { return json_object_new_uint64(v); }

static void put(json_object *o, const char *k, json_object *v, bool *ok) {
    if (!v || json_object_object_add(o, k, v) != 0) {
        json_object_put(v);
        *ok = false;
    }
}

static void push(json_object *a, json_object *v, bool *ok) {
    if (!v || json_object_array_add(a, v) != 0) {
        json_object_put(v);
        *ok = false;
    }
}

static json_object *done(json_object *o, bool ok) {
    if (ok) return o;
    json_object_put(o);
    return NULL;
}

json_object *idx_json_counters(const idx_feed *f) {
    idx_counters c;
    idx_stats st;
    idx_tree_counters(f->tree, &c);
    idx_tree_stats(f->tree, &st);
    bool ok = true;
    json_object *o = json_object_new_object(), *ev = json_object_new_object();
    if (!o || !ev) {
        json_object_put(o);
        json_object_put(ev);
        return NULL;
    }
    for (int type = WIRE_R_STORED; type <= WIRE_R_CLEARED; type++) {
        json_object *t = json_object_new_object();
        for (int s = 0; t && s < IDX_EV_STATUS_COUNT; s++)
            put(t, idx_evstatus_name((idx_evstatus)s), u64(c.events[type][s]), &ok);
        put(ev, idx_rtype_name((wire_rtype)type), t, &ok);
    }
    put(o, "events", ev, &ok);
    json_object *b = json_object_new_object();
    if (b) {
        put(b, "stored", u64(c.blocks_stored), &ok);
        put(b, "removed", u64(c.blocks_removed), &ok);
        put(b, "not_found", u64(c.blocks_not_found), &ok);
        put(b, "hash_mismatch", u64(c.hash_mismatch), &ok);
    }
    put(o, "blocks", b, &ok);
    idx_feed_counters k;
    idx_feed_counters_get(f, &k);
#define IDX_PUT(field, key, prom, type, help) put(o, key, u64(k.field), &ok);
    IDX_FEED_COUNTERS(IDX_PUT)
#undef IDX_PUT
    put(o, "nodes", u64(st.nodes), &ok);
    put(o, "resident_blocks", u64(st.held), &ok);
    put(o, "pairs", u64(st.pairs), &ok);
    put(o, "workers", u64(st.workers), &ok);
    return done(o, ok);
}

json_object *idx_json_workers(const idx_tree *t) {
    idx_worker *w;
    size_t n;
    if (idx_tree_workers(t, &w, &n) != KVO_OK) return NULL;
    bool ok = true;
    json_object *a = json_object_new_array_ext((int)n);
    for (size_t i = 0; a && i < n; i++) {
        json_object *o = json_object_new_object();
        if (o) {
            put(o, "worker_id", u64(w[i].worker_id), &ok);
            put(o, "dp_rank", u64(w[i].dp_rank), &ok);
            put(o, "blocks", u64(w[i].blocks), &ok);
        }
        push(a, o, &ok);
    }
    kvo_free(w);
    return a ? done(a, ok) : NULL;
}

json_object *idx_json_scores(const idx_scores *s) {
    bool ok = true;
    json_object *o = json_object_new_object();
    json_object *a = json_object_new_array_ext((int)s->n);
    if (!o || !a) {
        json_object_put(o);
        json_object_put(a);
        return NULL;
    }
    put(o, "isl_blocks", u64(s->isl_blocks), &ok);
    for (size_t i = 0; i < s->n; i++) {
        json_object *e = json_object_new_object();
        if (e) {
            put(e, "worker_id", u64(s->v[i].worker_id), &ok);
            put(e, "dp_rank", u64(s->v[i].dp_rank), &ok);
            put(e, "blocks", u64(s->v[i].blocks), &ok);
        }
        push(a, e, &ok);
    }
    put(o, "scores", a, &ok);
    return done(o, ok);
}

json_object *idx_json_watermark(const idx_feed *f, const idx_page *page) {
    size_t from = 0, to = f->npubs;
    if (page && page->has_after) {
        from = pub_pos(f, page->after);
        if (from < f->npubs && f->pubs[from]->p.publisher_id == page->after)
            from++;
    }
    if (page && to - from > page->limit) to = from + page->limit;
    bool ok = true;
    json_object *o = json_object_new_object();
    json_object *a = json_object_new_array_ext((int)(to - from));
    if (!o || !a) {
        json_object_put(o);
        json_object_put(a);
        return NULL;
    }
    for (size_t i = from; i < to; i++) {
        const idx_publisher *p = &f->pubs[i]->p;
        json_object *e = json_object_new_object();
        if (e) {
            put(e, "publisher_id", u64(p->publisher_id), &ok);
            put(e, "last_sequence", u64(p->last_sequence), &ok);
            put(e, "messages", u64(p->messages), &ok);
            put(e, "gaps", u64(p->gaps), &ok);
            put(e, "missed", u64(p->missed), &ok);
            put(e, "duplicates", u64(p->duplicates), &ok);
            put(e, "restarts", u64(p->restarts), &ok);
            json_object_object_add(e, "zmq_seq_first",
                                   p->has_zmq ? u64(p->zmq_first) : NULL);
            json_object_object_add(e, "zmq_seq_last",
                                   p->has_zmq ? u64(p->zmq_last) : NULL);
        }
        push(a, e, &ok);
    }
    put(o, "publishers", a, &ok);
    if (to < f->npubs && to > from) /* more follow */
        put(o, "next", u64(f->pubs[to - 1]->p.publisher_id), &ok);
    return done(o, ok);
}

/* The shape is wire_plane_to_json's: the event goes through it alone, in
 * a message of one, and comes back out. */
json_object *idx_json_revent(const wire_revent *ev) {
    wire_plane_msg m;
    wire_plane_init(&m);
    m.n_events = 1;
    m.events = (wire_revent *)ev; /* read only */
    json_object *j, *evs, *e = NULL;
    if (wire_plane_to_json(&m, &j) != KVO_OK) return NULL;
    if (json_object_object_get_ex(j, "router_events", &evs))
        e = json_object_get(json_object_array_get_idx(evs, 0));
    json_object_put(j);
    wire_plane_fini(&m);
    return e;
}

/* ======================================================================== */
/* Queries                                                                   */
/* ======================================================================== */

kvo_status idx_request_query(idx_tree *t, uint32_t block_size,
                             const idx_request *q, idx_scores *out) {
    static const uint64_t none[1];
    kvo_status s;
    uint32_t isl;
    if (q->kind == IDX_REQ_HASHES) {
        s = idx_tree_query(t, q->n ? q->v : none, q->n, out);
        isl = q->n > UINT32_MAX ? UINT32_MAX : (uint32_t)q->n;
    } else {
        if (q->kind != IDX_REQ_TOKENS || block_size == 0) return KVO_EINVAL;
        size_t nb = q->n / block_size;
        uint64_t *hashes = kvo_malloc((nb ? nb : 1) * sizeof(uint64_t));
        if (!hashes) return KVO_ENOMEM;
        nb = idx_prompt_hash(q->n ? q->v : none, q->n, block_size, q->lora,
                             q->salt, hashes);
        s = idx_tree_query(t, hashes, nb, out);
        kvo_free(hashes);
        /* like Dynamo's hit rate: ceil(tokens / block_size) */
        uint64_t ceil = ((uint64_t)q->n + block_size - 1) / block_size;
        isl = ceil > UINT32_MAX ? UINT32_MAX : (uint32_t)ceil;
    }
    if (s == KVO_OK) out->isl_blocks = isl;
    return s;
}
