/* idx_feed.c -- event-plane messages into a tree (DESIGN §6), and the JSON
 * shapes the service and replay share.
 *
 * A message is decoded into one reused wire_plane_msg (its arena keeps its
 * memory), checked against its publisher's sequence, and its RouterEvents
 * are applied in order, every storage tier to its own slots (idx_tree.c,
 * "Storage tiers"); lower-tier events are counted as other_tier.
 *
 * Publishers (idx.h says what is kept and for how long; idx_int.h holds
 * the structures, which idx_recover.c shares):
 *
 *   pubs[0, npubs)  sorted by publisher_id, npubs <= max_pubs, each an
 *                   idx_pub: its idx_publisher, when it was last heard
 *                   (the feed's clock), its jump state, the ring of its
 *                   last IDX_RING (sequence, body hash) pairs, and its
 *                   relay and recovery state (idx_recover.c)
 *   gone[]          a ring of the last max_pubs forgotten (id, last
 *                   sequence), oldest at gone_head once full; gone_at maps
 *                   an id to its ring position + 1 (a slot reused for
 *                   another id is no longer pointed at)
 *
 * oldest_ms is at or below every tracked publisher's heard_ms, so an
 * expiry that cannot find anyone idle returns without a scan. A publisher
 * in the middle of a recovery is never forgotten (it counts as heard); a
 * stale one is, like any other (its workers stay cleared).
 *
 * Sequence rule per tracked publisher without recovery (with recovery,
 * idx_recover.c's rule decides first and calls this one only for the
 * next expected sequence and for sequences at or below the last), on a
 * message with sequence seq that is not an exact duplicate (the ring holds
 * seq with the same body hash):
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

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define PUBS_FIRST_CAP 8 /* publisher slots allocated at first */
#define U64_DIGITS 20    /* decimal digits of the largest u64 */

static uint64_t sat_add(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

size_t idx_prompt_hash(const uint64_t *tokens, size_t n, uint32_t block_size,
                       const char *lora, const char *salt, uint64_t *out) {
    return wire_router_hash_prompt(tokens, n, block_size, lora, salt, NULL, 0,
                                   out);
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
    f->rec_timeout_ms = cfg && cfg->recovery_timeout_ms
                            ? cfg->recovery_timeout_ms
                            : IDX_RECOVERY_TIMEOUT_MS_DEFAULT;
    f->held_max_msgs = cfg && cfg->held_max_msgs ? cfg->held_max_msgs
                                                 : IDX_HELD_MAX_MSGS_DEFAULT;
    f->held_max_bytes = cfg && cfg->held_max_bytes ? cfg->held_max_bytes
                                                   : IDX_HELD_MAX_BYTES_DEFAULT;
    kvo_map_init(&f->gone_at);
    kvo_json_init(&f->doc);
    *out = f;
    return KVO_OK;
}

void idx_feed_pub_free(idx_feed *f, idx_pub *p) {
    if (!p) return;
    idx_rec_fini(f, p);
    kvo_free(p->relay.ranks);
    kvo_free(p->relay.subject);
    kvo_free(p->stale);
    kvo_free(p);
}

void idx_feed_free(idx_feed *f) {
    if (!f) return;
    idx_tree_free(f->tree);
    wire_plane_fini(&f->msg);
    for (size_t i = 0; i < f->npubs; i++) idx_feed_pub_free(f, f->pubs[i]);
    kvo_free(f->pubs);
    kvo_free(f->gone);
    kvo_map_fini(&f->gone_at);
    kvo_json_fini(&f->doc);
    kvo_free(f);
}

idx_tree *idx_feed_tree(idx_feed *f) { return f->tree; }

uint64_t idx_feed_generation(const idx_feed *f) { return f->gen; }

void idx_feed_set_pause(idx_feed *f, idx_feed_pause_fn fn, void *ctx) {
    f->pause = fn;
    f->pause_ctx = ctx;
}

void idx_feed_set_clock(idx_feed *f, uint64_t now_ms) {
    if (now_ms > f->now_ms) f->now_ms = now_ms;
}

/* Where publisher id is in pubs, or would be inserted. */
static size_t pub_pos(const idx_feed *f, uint64_t id) {
    size_t lo = 0, hi = f->npubs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->pubs[mid]->p.publisher_id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

idx_pub *idx_feed_pub(const idx_feed *f, uint64_t id) {
    size_t i = pub_pos(f, id);
    return i < f->npubs && f->pubs[i]->p.publisher_id == id ? f->pubs[i] : NULL;
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
        if (at && *at == pos + 1) kvo_map_del_at(&f->gone_at, at);
    }
    bool added;
    uint64_t *at = kvo_map_put(&f->gone_at, id, &added);
    if (!at) return;
    f->gone[pos] = (idx_gone){id, last_sequence};
    *at = pos + 1;
}

/* A forgotten publisher's last sequence, taken out of the memory. */
static bool recall(idx_feed *f, uint64_t id, uint64_t *last_sequence) {
    uint64_t *at = kvo_map_get(&f->gone_at, id);
    if (!at) return false;
    *last_sequence = f->gone[*at - 1].last_sequence;
    kvo_map_del_at(&f->gone_at, at);
    return true;
}

size_t idx_feed_expire(idx_feed *f) {
    if (!f->idle_ms || f->now_ms < f->oldest_ms ||
        f->now_ms - f->oldest_ms < f->idle_ms)
        return 0;
    size_t k = 0, n = 0;
    uint64_t oldest = f->now_ms;
    for (size_t i = 0; i < f->npubs; i++) {
        idx_pub *p = f->pubs[i];
        if (p->rec.asking) p->heard_ms = f->now_ms; /* kept */
        if (f->now_ms - p->heard_ms >= f->idle_ms) {
            if (p->seen) remember(f, p->p.publisher_id, p->p.last_sequence);
            idx_feed_pub_free(f, p);
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
 * (back) comes back with its last sequence, whole. */
static kvo_status pub_add(idx_feed *f, uint64_t id, bool back, uint64_t last,
                          idx_pub **out) {
    kvo_status st = kvo_grow(&f->pubs, &f->cap, f->npubs + 1, sizeof(*f->pubs),
                             PUBS_FIRST_CAP);
    if (st != KVO_OK) return st;
    idx_pub *p = kvo_calloc(1, sizeof(*p));
    if (!p) return KVO_ENOMEM;
    p->p.publisher_id = id;
    p->heard_ms = f->now_ms;
    for (int i = 0; i < IDX_RING; i++) p->ring_seq[i] = UINT64_MAX;
    if (back) {
        p->p.last_sequence = last;
        p->seen = p->whole = true;
    }
    size_t pos = pub_pos(f, id);
    memmove(&f->pubs[pos + 1], &f->pubs[pos],
            (f->npubs - pos) * sizeof(*f->pubs));
    f->pubs[pos] = p;
    f->npubs++;
    *out = p;
    return KVO_OK;
}

/* The publisher table's rule for a publisher not tracked now: recalled
 * from the forgotten first (making room may push it out), added when
 * there is room, else untracked (*out NULL). r->expired counts those
 * forgotten to make room. */
static kvo_status pub_get(idx_feed *f, uint64_t id, idx_pub **out, bool *fresh,
                          idx_feed_result *r) {
    *fresh = false;
    if ((*out = idx_feed_pub(f, id))) return KVO_OK;
    uint64_t last = 0;
    kvo_status s = KVO_OK;
    bool back = recall(f, id, &last);
    if (f->npubs >= f->max_pubs) {
        size_t n = idx_feed_expire(f);
        if (r) r->expired = (uint32_t)n;
    }
    if (f->npubs < f->max_pubs) {
        s = pub_add(f, id, back, last, out);
        *fresh = s == KVO_OK && !back;
    }
    if (!*out && back) remember(f, id, last);
    return s;
}

kvo_status idx_feed_pub_get(idx_feed *f, uint64_t id, idx_pub **out,
                            bool *fresh) {
    return pub_get(f, id, out, fresh, NULL);
}

bool idx_feed_parse_zmq(const char *s, uint64_t *a, uint64_t *b) {
    const char *dash = strchr(s, '-');
    if (!dash || dash == s || dash - s > U64_DIGITS) return false;
    char first[U64_DIGITS + 1];
    memcpy(first, s, (size_t)(dash - s));
    first[dash - s] = '\0';
    return kvo_parse_u64(first, a) == KVO_OK &&
           kvo_parse_u64(dash + 1, b) == KVO_OK && *a <= *b;
}

bool idx_feed_track(idx_feed *f, idx_pub *p, bool fresh, uint64_t seq,
                    uint64_t hash, idx_feed_result *r) {
    uint64_t last = p->p.last_sequence;
    uint64_t *rs = &p->ring_seq[seq % IDX_RING];
    uint64_t *rh = &p->ring_hash[seq % IDX_RING];
    bool remembered = *rs == seq;
    p->heard_ms = f->now_ms;
    fresh = fresh || !p->seen;
    if (fresh) {
        r->missed = seq;
    } else if (seq <= last) {
        bool in_jump = p->jump != IDX_JUMP_NONE && seq < last && !remembered &&
                       seq != 0 && /* 0: a restart, as ever */
                       (p->jump == IDX_JUMP_FIRST || seq > p->jump_from);
        if (remembered && *rh == hash) {
            p->p.duplicates++;
            r->duplicate = true;
            return false;
        }
        if (in_jump) {
            r->rewind = true;
            r->jumped_from = last;
            if (p->jump == IDX_JUMP_FROM && seq - p->jump_from > 1)
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
    p->jump = r->missed && !r->rewind ? (fresh ? IDX_JUMP_FIRST : IDX_JUMP_FROM)
                                      : IDX_JUMP_NONE;
    p->jump_from = last;
    if (r->restart || r->rewind) p->p.has_zmq = false;
    if (fresh || r->restart)
        p->whole = seq == 0;
    else if (r->missed)
        p->whole = false;
    p->seen = true;
    *rs = seq;
    *rh = hash;
    p->p.last_sequence = seq;
    p->p.messages++;
    return true;
}

/* Remember one of p's worker ids (the slots a failed recovery clears). */
static void note_worker(idx_pub *p, uint64_t worker_id) {
    for (uint32_t i = 0; i < p->n_workers; i++)
        if (p->workers[i] == worker_id) return;
    if (p->n_workers < IDX_PUB_WORKERS) p->workers[p->n_workers++] = worker_id;
}

kvo_status idx_feed_apply_events(idx_feed *f, idx_pub *p, idx_feed_result *r,
                                 uint64_t *blocks) {
    const wire_plane_msg *m = &f->msg;
    kvo_status s = KVO_OK;
    uint64_t stored = 0;
    for (uint32_t i = 0; i < m->n_events; i++) {
        if (i > 0 && f->pause) {
            f->gen++; /* readers' caches: the tree moved */
            f->pause(f->pause_ctx);
        }
        const wire_revent *ev = &m->events[i];
        r->other_tier += ev->tier != WIRE_TIER_DEVICE;
        if (p && (p->n_workers == 0 || p->workers[0] != ev->worker_id))
            note_worker(p, ev->worker_id);
        idx_evstatus st;
        kvo_status a = idx_tree_apply(f->tree, ev, &st);
        if (a != KVO_OK) {
            r->lost++;
            if (s == KVO_OK) s = a;
        } else if (ev->type == WIRE_R_STORED && st == IDX_EV_OK) {
            stored += ev->n_blocks;
        }
    }
    f->gen++;
    if (blocks) *blocks = stored;
    return s;
}

void idx_feed_zmq_header(idx_pub *p, const char *zmq_seq, idx_feed_result *r) {
    uint64_t a, b;
    if (!idx_feed_parse_zmq(zmq_seq, &a, &b)) {
        r->bad_header = true;
    } else if (p) {
        if (!p->p.has_zmq || a < p->p.zmq_first) p->p.zmq_first = a;
        if (!p->p.has_zmq || b > p->p.zmq_last) p->p.zmq_last = b;
        p->p.has_zmq = true;
    }
}

/* Count what became of one message. */
static void count(idx_feed *f, const idx_feed_result *r) {
    f->c.applied += r->applied;
    f->c.duplicates += r->duplicate;
    f->c.undecodable += r->undecodable;
    f->c.restarts += r->restart;
    f->c.rewinds += r->rewind;
    f->c.gaps += r->missed != 0;
    f->c.missed = sat_add(f->c.missed, r->missed);
    f->c.bad_headers += r->bad_header;
    f->c.other_tier += r->other_tier;
    f->c.enomem += r->lost;
    f->c.publishers_refused += r->untracked;
}

kvo_status idx_feed_live_decoded(idx_feed *f, const char *subject,
                                 const uint8_t *body, size_t len,
                                 const char *zmq_seq, bool released,
                                 idx_feed_result *r) {
    const wire_plane_msg *m = &f->msg;
    r->publisher_id = m->publisher_id;
    r->sequence = m->sequence;
    idx_pub *p;
    bool fresh;
    kvo_status s = pub_get(f, m->publisher_id, &p, &fresh, r);
    if (s != KVO_OK) goto done;
    r->untracked = !p;
    if (p) {
        uint64_t hash = XXH3_64bits(body, len);
        if (f->recovery && (p->rec.asking || !p->p.stale)) {
            idx_rec_act act = idx_rec_live(f, p, fresh, m->sequence, hash, body,
                                           len, zmq_seq, subject, released, r);
            if (act == IDX_REC_HOLD) goto done;
            if (act == IDX_REC_DROP) {
                s = KVO_EEXIST;
                goto done;
            }
        } else if (!idx_feed_track(f, p, fresh, m->sequence, hash, r)) {
            s = KVO_EEXIST;
            goto done;
        }
    }
    s = idx_feed_apply_events(f, p, r, NULL);
    if (zmq_seq) idx_feed_zmq_header(p, zmq_seq, r); /* after: pauses */
    r->applied = true;
done:
    count(f, r);
    return s;
}

kvo_status idx_feed_live(idx_feed *f, const char *subject, const uint8_t *body,
                         size_t len, const char *zmq_seq, idx_feed_result *res,
                         kvo_err *err) {
    idx_feed_result r;
    memset(&r, 0, sizeof(r));
    kvo_status s = wire_plane_decode(body, len, &f->lim, &f->msg, err);
    if (s != KVO_OK) {
        r.undecodable = s != KVO_ENOMEM;
        count(f, &r);
    } else {
        s = idx_feed_live_decoded(f, subject, body, len, zmq_seq, false, &r);
    }
    /* counted once handled, with its outcome: HTTP served between two
     * events of the envelope (the feed's pause) must not show a client
     * that waits for a message count a message half applied */
    f->c.messages++;
    if (res) *res = r;
    return s;
}

kvo_status idx_feed_message(idx_feed *f, const uint8_t *body, size_t len,
                            const char *zmq_seq, idx_feed_result *res,
                            kvo_err *err) {
    return idx_feed_live(f, NULL, body, len, zmq_seq, res, err);
}

void idx_feed_counters_get(const idx_feed *f, idx_feed_counters *out) {
    *out = f->c;
    out->publishers = f->npubs;
    out->relays = out->recovering = out->stale_publishers = 0;
    for (size_t i = 0; i < f->npubs; i++) {
        const idx_pub *p = f->pubs[i];
        out->relays += p->relay.announced;
        out->recovering += p->rec.asking;
        out->stale_publishers += p->p.stale;
    }
}

bool idx_feed_zmq_last(const idx_feed *f, uint64_t publisher_id,
                       uint64_t *zmq_last) {
    const idx_pub *p = idx_feed_pub(f, publisher_id);
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
            put(t, idx_evstatus_name((idx_evstatus)s), u64(c.events[type][s]),
                &ok);
        put(ev, idx_rtype_name((wire_rtype)type), t, &ok);
    }
    put(o, "events", ev, &ok);
    json_object *b = json_object_new_object();
    if (b) {
        put(b, "stored", u64(c.blocks_stored), &ok);
        put(b, "removed", u64(c.blocks_removed), &ok);
        put(b, "not_found", u64(c.blocks_not_found), &ok);
        put(b, "hash_mismatch", u64(c.hash_mismatch), &ok);
        put(b, "orphans_lost", u64(c.orphans_lost), &ok);
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

/* {"<tier>": blocks through it, ...} for the lower tiers sc has. */
static json_object *tiers_json(const idx_score *sc) {
    json_object *o = json_object_new_object();
    bool ok = o != NULL;
    for (uint32_t k = 1; ok && k < WIRE_TIER_COUNT; k++)
        if (sc->lower & (1u << (k - 1)))
            put(o, wire_tier_name((wire_tier)k), u64(sc->through[k - 1]), &ok);
    return done(o, ok);
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
            if (s->v[i].lower) put(e, "tiers", tiers_json(&s->v[i]), &ok);
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
            put(e, "stale", json_object_new_boolean(p->stale), &ok);
        }
        push(a, e, &ok);
    }
    put(o, "publishers", a, &ok);
    if (to < f->npubs && to > from) /* more follow */
        put(o, "next", u64(f->pubs[to - 1]->p.publisher_id), &ok);
    return done(o, ok);
}

bool idx_json_recovery(const idx_feed *f, json_object *o) {
    bool ok = true;
    json_object *rec = json_object_new_array(), *st = json_object_new_array();
    size_t stale = 0;
    for (size_t i = 0; rec && st && i < f->npubs; i++) {
        const idx_pub *p = f->pubs[i];
        if (p->rec.asking) push(rec, u64(p->p.publisher_id), &ok);
        for (size_t k = 0; p->p.stale && k < p->n_stale; k++, stale++) {
            if (stale >= IDX_HEALTH_STALE_MAX) continue;
            json_object *e = json_object_new_object();
            if (e) {
                put(e, "publisher_id", u64(p->p.publisher_id), &ok);
                put(e, "worker_id", u64(p->stale[k].worker_id), &ok);
                put(e, "dp_rank", u64(p->stale[k].dp_rank), &ok);
            }
            push(st, e, &ok);
        }
    }
    if (!rec || !st) {
        json_object_put(rec);
        json_object_put(st);
        return false;
    }
    put(o, "recovering", rec, &ok);
    put(o, "stale", st, &ok);
    put(o, "stale_count", u64(stale), &ok);
    return ok;
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
