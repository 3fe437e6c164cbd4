/* relay_pipe.c -- the relay's pure pipeline: frames in, envelopes out.
 *
 * Per source (one ZMQ publisher) a small state machine keeps the sequence:
 *
 *   LIVE ----- seq == next ------------------> apply
 *     |  ----- seq <  next, same bytes as ---> duplicate (live lagging a replay)
 *     |        the batch applied as seq
 *     |  ----- seq <  next, other bytes, ----> restart: cleared, replay from 0
 *     |        or seq <= last live seq
 *     |  ----- seq >  next (gap) ------------> request replay(next), buffer seq
 *     v                                        (no endpoint: cleared, accept)
 *   REPLAYING: live batches are buffered (bounded); replies are applied in
 *     order, duplicates dropped; first reply > requested = window exceeded
 *     (cleared, accept from there); end marker -> drain the buffer (a hole
 *     left = incomplete: cleared, accept); no reply for the timeout ->
 *     cleared, drain accepting.
 *
 * "cleared" (one RouterEvent per tier: what the relay forgets is the whole
 * rank) is only emitted when something was forwarded for the source since
 * its last cleared (a second one would say nothing new). The engine's own
 * AllBlocksCleared is another thing: its GPU cache only, forwarded as the
 * device tier's cleared.
 *
 * The sockets' own news comes in through relay_pipe_link: a SUB back after
 * a loss may have missed batches (PUB drops what a gone subscriber would
 * get), so the source replays, LIVE or not (a replay asked before the loss
 * cannot hold what was published during it) -- and the engine behind it may
 * be another process, restarted while idle, with nothing new to show it.
 * So the replay is asked from next-1, the last batch applied, whose payload
 * hash the seen ring holds (without it, from next), and its first answer
 * probes the engine:
 *
 *   PROBING (REPLAYING from next-1)
 *     |  ----- reply next-1, same bytes ------> the same engine: duplicate,
 *     |                                         go on from next
 *     |  ----- reply next-1, other bytes -----> restart
 *     |  ----- end marker at once ------------> restart (it holds nothing
 *     |                                         from next-1 on)
 *     |  ----- first reply > next-1 ----------> judged as a first reply from
 *     |                                         next: == next goes on, > next
 *     |                                         is a window exceeded
 *     |  ----- the replay breaks twice -------> restart (the batch was read
 *     v                                         once: it cannot break it)
 *   restart: restarts++, cleared, replay the new run from 0 (live batches
 *     buffered since the SUB came back are kept: they are the new run's).
 *
 * A first reply beyond next-1 cannot tell a restarted engine from one whose
 * buffer wrapped while the SUB was away (both published more than their
 * buffer since): either way what is lost is cleared and everything the
 * engine still holds is applied, counted as window_exceeded. A replay whose
 * connection drops is asked again from next; dropping twice with next
 * unchanged means batch next itself breaks the connection (libzmq drops a
 * connection on a frame over ZMQ_MAXMSGSIZE and never reconnects on its
 * own): it is counted as oversize, cleared (as a gap that cannot be
 * replayed), marked done for the watermark, and the replay asked from the
 * batch after it.
 *
 * An applied batch is decoded, each event validated and converted to
 * RouterEvents (a lower tier's store without extra_keys takes the
 * tokens_hash the rank's device tier holds for the block:
 * router_hashes), passed through the dedup reference counts (per
 * dp_rank and tier, kept in the forwarded state) and appended to the
 * pending message:
 *
 *   pending: ev[0..n) (<= max_events), blocks pool and removed pool
 *   (<= max_blocks together); only the last event grows (merging), so each
 *   event's blocks are contiguous at the end of their pool.
 *
 * The pending message remembers the ZMQ sequences folded into it: first =
 * the first batch that touched it, last = the last batch fully inside it.
 * It carries KVO-Zmq-Seq: first-last only when some batch completed in it,
 * so a watermark never claims a batch whose tail is still unpublished.
 */
#include "kvo_json.h"
#include "kvo_map.h"
#include "relay_int.h"

#include <xxhash.h>

#include <msgpack.h>
#include <stdio.h>
#include <string.h>

/* A note longer than this is cut (it is one log line). */
#define NOTE_MAX 512
/* Bytes of an unknown medium name quoted in a note. */
#define MEDIUM_SHOWN 32
/* First capacities of the held-batch array and the digest pool. */
#define HELD_FIRST_CAP 64
#define DIGESTS_FIRST_CAP 1024u
/* A byte-string block hash this long is the engine's whole digest. */
#define XXH128_DIGEST_BYTES 16
#define SHA256_DIGEST_BYTES 32
/* The envelope's topic field (DESIGN §6). */
static const char envelope_topic[] = "kv-events";

typedef struct held {
    uint64_t seq;
    size_t len;
    uint8_t *data;
} held;

/* The last SEEN_RING applied batches of a source, by seq % SEEN_RING: a
 * live batch behind next is a duplicate only if it is the batch applied. */
#define SEEN_RING 256

typedef struct source {
    uint32_t fallback_rank;
    uint32_t rank; /* last rank seen, for the cleared the relay emits */
    bool has_replay;
    relay_src_state state;
    bool has_next;
    uint64_t next;
    bool has_live;
    uint64_t live_last;
    uint64_t want;     /* REPLAYING: first seq requested */
    bool got_reply;    /* REPLAYING: a batch reply arrived */
    uint64_t deadline; /* REPLAYING: monotonic ns */
    bool dirty;        /* forwarded something since the last cleared */
    held *buf;         /* live batches waiting for the replay */
    uint32_t nbuf;
    size_t capbuf;
    size_t buf_bytes;
    bool overflowed;
    bool link_up;      /* the SUB is connected (last link event) */
    bool link_was_up;  /* it was once: the next SUB_UP is a reconnect */
    bool broke;        /* REPLAYING: a replay connection dropped ... */
    uint64_t broke_at; /* ... with next == broke_at */
    bool probing;      /* REPLAYING: the SUB came back; the replay was ... */
    uint64_t probe;    /* ... asked from this batch, applied before */
    uint64_t seen_seq[SEEN_RING];  /* seq + 1 of the batch in the slot */
    uint64_t seen_hash[SEEN_RING]; /* XXH3-64 of its payload */
} source;

struct relay_pipe {
    relay_pipe_cfg cfg;
    relay_out out;
    char *subject;
    relay_stats st;
    source *src;
    uint32_t nsrc;
    relay_state *state; /* forwarded blocks, with the dedup counts */
    relay_ring *ring;   /* the last envelopes published */
    wire_batch batch;
    uint64_t now;

    /* pending message */
    uint32_t psrc; /* source of the batches in it */
    uint32_t pn;
    wire_revent *pev;
    wire_rblock *pblocks;
    uint32_t pnblocks;
    uint64_t *premoved;
    uint32_t pnremoved;
    bool p_has_first, p_has_last;
    uint64_t p_first, p_last;
    uint64_t cur_seq; /* batch being applied */

    uint64_t sequence; /* envelope sequence, per publisher from 0 */
    uint64_t event_id; /* last RouterEvent id of the worker */
    bool has_wm;       /* the last KVO-Zmq-Seq published: the watermark */
    uint64_t wm_first, wm_last;
    kvo_json req; /* recovery requests are parsed here */
    wire_plane_msg msg;
    kvo_buf body;

    /* engine-hash verification */
    wire_digest root;
    kvo_map digests; /* normalized key -> index into dpool */
    wire_digest *dpool;
    uint32_t dlen, dcap;
    uint32_t *dfree;
    uint32_t nfree;
    kvo_buf hscratch;
    uint64_t *th; /* a store's tokens hashes (router_hashes) */
    size_t cap_th;
    kvo_buf idbuf;    /* its multimodal ids, NUL-terminated */
    wire_mm_key *mmk; /* one block's multimodal keys */
    size_t cap_mmk;
};

/* ---- small helpers -------------------------------------------------------*/

static void note(relay_pipe *p, kvo_level lvl, const char *kind,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void note(relay_pipe *p, kvo_level lvl, const char *kind,
                 const char *fmt, ...) {
    if (!p->out.note) return;
    char msg[NOTE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    p->out.note(p->out.ctx, lvl, kind, msg);
}

uint64_t relay_stats_decode_errors(const relay_stats *s) {
    uint64_t t = 0;
    for (int i = 0; i < KVO_STATUS_COUNT; i++) t += s->decode_errors[i];
    return t;
}

uint64_t relay_stats_rejects(const relay_stats *s) {
    uint64_t t = 0;
    for (int i = 0; i < RELAY_REJECT_COUNT; i++) t += s->rejects[i];
    return t;
}

uint64_t relay_stats_replay_failures(const relay_stats *s) {
    uint64_t t = 0;
    for (int i = 0; i < RELAY_REPLAY_FAIL_COUNT; i++)
        t += s->replay_failures[i];
    return t;
}

uint64_t relay_stats_recovery_requests(const relay_stats *s) {
    uint64_t t = 0;
    for (int i = 0; i < RELAY_RECOVERY_COUNT; i++) t += s->recovery_requests[i];
    return t;
}

/* Count a per-source counter and its total. */
#define SRC_COUNT(p, si, name) ((p)->st.src[si].name++, (p)->st.name++)

static const char *const fail_names[] = {
#define RELAY_NAME(name, help) #name,
    RELAY_REPLAY_FAIL_KINDS(RELAY_NAME)
#undef RELAY_NAME
};

/* ---- pending message -----------------------------------------------------*/

static void pend_reset(relay_pipe *p) {
    p->pn = 0;
    p->pnblocks = 0;
    p->pnremoved = 0;
    p->p_has_first = p->p_has_last = false;
}

static bool pend_empty(const relay_pipe *p) {
    return p->pn == 0 && !p->p_has_first && !p->p_has_last;
}

static void publish(relay_pipe *p, const wire_revent *ev, uint32_t n,
                    bool has_range, uint64_t first, uint64_t last) {
    p->msg.publisher_id = p->cfg.publisher_id;
    p->msg.sequence = p->sequence++;
    p->msg.published_at = kvo_unix_ns() / RELAY_NS_PER_MS;
    p->msg.topic.p = envelope_topic;
    p->msg.topic.len = sizeof(envelope_topic) - 1;
    p->msg.single_form = false;
    p->msg.n_events = n;
    p->msg.events = (wire_revent *)ev;
    kvo_buf_reset(&p->body);
    kvo_status s = wire_plane_encode(&p->msg, &p->body);
    p->msg.events = NULL;
    p->msg.n_events = 0;
    if (s == KVO_OK) {
        /* Kept whether NATS takes it or not: a requester that missed it
         * gets it from the ring. */
        relay_ring_env kept = {p->msg.sequence, has_range,  first, last,
                               p->body.data,    p->body.len};
        relay_ring_push(p->ring, &kept);
        if (has_range) {
            p->has_wm = true;
            p->wm_first = first;
            p->wm_last = last;
        }
        s = p->out.publish(p->out.ctx, p->subject, has_range, first, last,
                           p->body.data, p->body.len);
    }
    if (s != KVO_OK) {
        p->st.publish_dropped++;
        note(p, KVO_LOG_WARN, "publish",
             "envelope %" PRIu64 " not published: %s", p->msg.sequence,
             kvo_strerror(s));
        return;
    }
    p->st.messages_published++;
    p->st.bytes_published += p->body.len;
    if (n == 0) p->st.watermark_messages++;
    for (uint32_t i = 0; i < n; i++) {
        if (ev[i].type == WIRE_R_STORED) {
            p->st.revents_stored++;
            p->st.blocks_forwarded += ev[i].n_blocks;
        } else if (ev[i].type == WIRE_R_REMOVED) {
            p->st.revents_removed++;
            p->st.removes_forwarded += ev[i].n_removed;
        } else {
            p->st.revents_cleared++;
        }
    }
}

void relay_pipe_flush(relay_pipe *p) {
    if (pend_empty(p)) return;
    if (p->pn > 0 || p->p_has_last)
        publish(p, p->pev, p->pn, p->p_has_last, p->p_first, p->p_last);
    pend_reset(p);
}

/* A batch of the current source touched the pending message. */
static void touch(relay_pipe *p) {
    if (!p->p_has_first) {
        p->p_has_first = true;
        p->p_first = p->cur_seq;
    }
}

static wire_revent *pend_new_event(relay_pipe *p, wire_rtype type,
                                   uint32_t rank, wire_tier tier) {
    wire_revent *e = &p->pev[p->pn++];
    memset(e, 0, sizeof(*e));
    e->worker_id = p->cfg.worker_id;
    e->tier = tier;
    e->event_id = ++p->event_id;
    e->dp_rank = rank;
    e->type = type;
    touch(p);
    p->src[p->psrc].dirty = true; /* it will be forwarded */
    return e;
}

/* Append a validated store, converting as it goes: blocks are written
 * straight into the pool; a store longer than the room left is split, the
 * next part chained to the last block of the previous one. */
static void pend_store(relay_pipe *p, uint32_t rank, wire_tier tier,
                       const wire_event *e, const uint64_t *th,
                       relay_state_rank *fwd) {
    bool has_parent = e->parent.kind != WIRE_HASH_NONE;
    uint64_t parent = e->parent.key;
    uint32_t i = 0;
    while (i < e->n_hashes) {
        uint32_t room = p->cfg.max_blocks - p->pnblocks - p->pnremoved;
        wire_revent *last = p->pn ? &p->pev[p->pn - 1] : NULL;
        bool merge = last && last->type == WIRE_R_STORED &&
                     last->dp_rank == rank && last->tier == tier &&
                     has_parent && last->n_blocks > 0 &&
                     last->blocks[last->n_blocks - 1].block_hash == parent;
        if (room == 0 || (!merge && p->pn == p->cfg.max_events)) {
            relay_pipe_flush(p);
            continue;
        }
        uint32_t take = e->n_hashes - i < room ? e->n_hashes - i : room;
        if (!merge) {
            last = pend_new_event(p, WIRE_R_STORED, rank, tier);
            last->has_parent = has_parent;
            last->parent_hash = has_parent ? parent : 0;
            last->blocks = p->pblocks + p->pnblocks;
        }
        wire_rblock *dst = p->pblocks + p->pnblocks;
        for (uint32_t k = 0; k < take; k++, i++) {
            dst[k].block_hash = e->hashes[i].key;
            dst[k].tokens_hash = th[i];
            if (fwd &&
                relay_state_store(fwd, tier, dst[k].block_hash, has_parent,
                                  parent, dst[k].tokens_hash) != KVO_OK)
                p->st.state_dropped++;
            has_parent = true;
            parent = dst[k].block_hash;
        }
        p->pnblocks += take;
        last->n_blocks += take;
    }
}

static void pend_remove(relay_pipe *p, uint32_t rank, wire_tier tier,
                        uint64_t h) {
    for (;;) {
        uint32_t room = p->cfg.max_blocks - p->pnblocks - p->pnremoved;
        wire_revent *last = p->pn ? &p->pev[p->pn - 1] : NULL;
        bool merge = last && last->type == WIRE_R_REMOVED &&
                     last->dp_rank == rank && last->tier == tier;
        if (room == 0 || (!merge && p->pn == p->cfg.max_events)) {
            relay_pipe_flush(p);
            continue;
        }
        if (!merge) {
            last = pend_new_event(p, WIRE_R_REMOVED, rank, tier);
            last->removed = p->premoved + p->pnremoved;
        }
        p->premoved[p->pnremoved++] = h;
        last->n_removed++;
        return;
    }
}

/* The engine's AllBlocksCleared (vLLM's reset_prefix_cache): its GPU
 * prefix cache only -- an offloading engine keeps its CPU blocks, and
 * removes them later one by one. So it is forwarded as the device tier's
 * cleared (an index clears only the tier a cleared names) and empties the
 * device tier of the rank's state. It flushes what came before it and
 * starts a fresh message. */
static void pend_cleared(relay_pipe *p, uint32_t rank) {
    relay_pipe_flush(p);
    pend_new_event(p, WIRE_R_CLEARED, rank, WIRE_TIER_DEVICE);
    relay_state_clear_tier(p->state, rank, WIRE_TIER_DEVICE);
}

/* ---- cleared emitted by the relay itself ---------------------------------*/

/* The relay lost track of the source (start, restart, a gap it cannot
 * replay): whatever it told the index about the rank, in any tier, may be
 * wrong now. One message with a cleared per tier (device first) clears
 * them all in the index, as the rank's whole state is forgotten here. */
static void emit_cleared(relay_pipe *p, uint32_t si, const char *why) {
    source *s = &p->src[si];
    relay_pipe_flush(p);
    _Static_assert(WIRE_TIER_DEVICE == 0, "the device tier's cleared first");
    wire_revent ev[WIRE_TIER_COUNT];
    memset(ev, 0, sizeof(ev));
    for (int t = 0; t < WIRE_TIER_COUNT; t++) {
        ev[t].worker_id = p->cfg.worker_id;
        ev[t].tier = (wire_tier)t;
        ev[t].event_id = ++p->event_id;
        ev[t].dp_rank = s->rank;
        ev[t].type = WIRE_R_CLEARED;
    }
    publish(p, ev, WIRE_TIER_COUNT, false, 0, 0);
    relay_state_clear(p->state, s->rank);
    s->dirty = false;
    p->st.cleared_emitted++;
    note(p, KVO_LOG_WARN, "cleared",
         "source %u: published cleared for worker %" PRIu64 " dp_rank %u (%s)",
         si, p->cfg.worker_id, s->rank, why);
}

/* The index can no longer be trusted for this source: count, clear. */
static void lost(relay_pipe *p, uint32_t si, relay_replay_fail kind) {
    p->st.replay_failures[kind]++;
    if (p->src[si].dirty) emit_cleared(p, si, fail_names[kind]);
}

/* ---- engine-hash verification ---------------------------------------------*/

static void digest_remember(relay_pipe *p, uint64_t key, const wire_digest *d) {
    uint64_t *ix = kvo_map_get(&p->digests, key);
    if (ix) {
        p->dpool[*ix] = *d;
        return;
    }
    uint32_t slot;
    if (p->nfree) {
        slot = p->dfree[--p->nfree];
    } else {
        if (p->dlen >= p->cfg.verify_max_blocks) return;
        if (p->dlen == p->dcap) {
            uint32_t ncap = p->dcap ? p->dcap * 2 : DIGESTS_FIRST_CAP;
            wire_digest *n = kvo_realloc(p->dpool, ncap * sizeof(*n));
            uint32_t *f = kvo_realloc(p->dfree, ncap * sizeof(*f));
            if (n) p->dpool = n;
            if (f) p->dfree = f;
            if (!n || !f) return;
            p->dcap = ncap;
        }
        slot = p->dlen++;
    }
    ix = kvo_map_put(&p->digests, key, NULL);
    if (!ix) {
        p->dfree[p->nfree++] = slot;
        return;
    }
    *ix = slot;
    p->dpool[slot] = *d;
}

static void digest_forget(relay_pipe *p, uint64_t key) {
    uint64_t *ix = kvo_map_get(&p->digests, key);
    if (!ix) return;
    p->dfree[p->nfree++] = (uint32_t)*ix;
    kvo_map_del(&p->digests, key);
}

/* Extra keys of every block as (lora, salt) strings, from the event's
 * extra_keys list (vLLM) or from lora_name/cache_salt when it is absent.
 * A list entry with anything but strings (multimodal keys) cannot be
 * rebuilt here: ok[i] = false. */
#define MAX_KEY 256
typedef struct block_extra {
    bool ok;
    char lora[MAX_KEY];
    char salt[MAX_KEY];
    bool has_lora, has_salt;
} block_extra;

static bool copy_str(char *dst, const char *p, size_t n) {
    if (n >= MAX_KEY) return false;
    memcpy(dst, p, n);
    dst[n] = '\0';
    return true;
}

static void extra_from_fields(const wire_event *e, bool root_block,
                              block_extra *x) {
    memset(x, 0, sizeof(*x));
    x->ok = true;
    if (e->lora_name.p) {
        x->has_lora = true;
        x->ok &= copy_str(x->lora, e->lora_name.p, e->lora_name.len);
    }
    if (root_block && e->cache_salt.p) {
        x->has_salt = true;
        x->ok &= copy_str(x->salt, e->cache_salt.p, e->cache_salt.len);
    }
}

static void extra_from_list(const wire_event *e, const msgpack_object *o,
                            bool root_block, block_extra *x) {
    memset(x, 0, sizeof(*x));
    x->ok = true;
    if (o->type == MSGPACK_OBJECT_NIL) return;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > 2) {
        x->ok = false;
        return;
    }
    const msgpack_object *k = o->via.array.ptr;
    uint32_t n = o->via.array.size;
    for (uint32_t i = 0; i < n; i++)
        if (k[i].type != MSGPACK_OBJECT_STR) {
            x->ok = false;
            return;
        }
    const msgpack_object_str *s0 = n > 0 ? &k[0].via.str : NULL;
    bool s0_is_lora = s0 && e->lora_name.p && e->lora_name.len == s0->size &&
                      memcmp(e->lora_name.p, s0->ptr, s0->size) == 0;
    if (n == 1 && root_block && !s0_is_lora) {
        x->has_salt = true;
        x->ok = copy_str(x->salt, s0->ptr, s0->size);
    } else if (n >= 1) {
        x->has_lora = true;
        x->ok = copy_str(x->lora, s0->ptr, s0->size);
        if (n == 2) {
            x->has_salt = root_block;
            x->ok &= root_block &&
                     copy_str(x->salt, k[1].via.str.ptr, k[1].via.str.size);
        }
    }
}

static bool hash_matches(const wire_hash *h, const wire_digest *d) {
    if (h->kind == WIRE_HASH_BYTES)
        return h->len == d->len && memcmp(h->bytes, d->b, d->len) == 0;
    return wire_digest_low64(d) == h->key;
}

static void verify_store(relay_pipe *p, const wire_event *e, uint32_t ei,
                         uint32_t bs, const msgpack_object *list) {
    wire_digest parent;
    bool have = true;
    bool root = e->parent.kind == WIRE_HASH_NONE;
    if (root) {
        parent = p->root;
    } else {
        uint64_t *ix = kvo_map_get(&p->digests, e->parent.key);
        have = ix != NULL;
        if (ix) parent = p->dpool[*ix];
    }
    for (uint32_t i = 0; i < e->n_hashes; i++) {
        const wire_hash *h = &e->hashes[i];
        wire_digest got;
        bool have_got = false;
        if (!have) {
            p->st.hash_unknown_parent++;
        } else {
            block_extra x;
            if (!list)
                extra_from_fields(e, root && i == 0, &x);
            else if (i < list->via.array.size)
                extra_from_list(e, &list->via.array.ptr[i], root && i == 0, &x);
            else
                x.ok = false;
            wire_extra ex = {x.has_lora ? x.lora : NULL,
                             x.has_salt ? x.salt : NULL};
            if (!x.ok || wire_engine_block(p->cfg.verify_algo, &parent,
                                           e->token_ids + (size_t)i * bs, bs,
                                           &ex, &p->hscratch, &got) != KVO_OK) {
                p->st.hash_unsupported++;
            } else {
                have_got = true;
                p->st.hash_verified++;
                if (!hash_matches(h, &got)) {
                    p->st.hash_mismatches++;
                    if (!p->st.has_mismatch) {
                        relay_mismatch *m = &p->st.first_mismatch;
                        p->st.has_mismatch = true;
                        m->seq = p->cur_seq;
                        m->event = ei;
                        m->block = i;
                        m->expected = got;
                        m->got = *h;
                        m->got.bytes = NULL;
                        if (h->kind == WIRE_HASH_BYTES) {
                            uint32_t n = h->len < RELAY_MISMATCH_BYTES
                                             ? h->len
                                             : RELAY_MISMATCH_BYTES;
                            memcpy(m->got_bytes, h->bytes, n);
                        }
                        note(p, KVO_LOG_WARN, "hash",
                             "engine hash mismatch: seq %" PRIu64
                             " event %u block %u: expected %016" PRIx64
                             " got %016" PRIx64,
                             p->cur_seq, ei, i, wire_digest_low64(&got),
                             h->key);
                    }
                }
            }
        }
        /* What the engine chains from: its own digest when published in
         * full, else ours. */
        wire_digest chain;
        bool have_chain = false;
        if (h->kind == WIRE_HASH_BYTES &&
            (h->len == XXH128_DIGEST_BYTES || h->len == SHA256_DIGEST_BYTES)) {
            chain.len = (uint8_t)h->len;
            memcpy(chain.b, h->bytes, h->len);
            have_chain = true;
        } else if (have_got) {
            chain = got;
            have_chain = true;
        }
        if (have_chain) {
            digest_remember(p, h->key, &chain);
            parent = chain; /* read next only when have_chain */
        }
        have = have_chain;
    }
}

/* ---- conversion ----------------------------------------------------------*/

/* The media the relay forwards (vLLM's names, exactly) and their tiers, as
 * wire_tier_from_medium maps them; nil is GPU. false: unknown medium. */
static bool medium_tier(wire_str m, wire_tier *tier) {
#define KNOWN(s, t)                                                            \
    { s, sizeof(s) - 1, t }
    static const struct {
        const char *s;
        uint32_t n;
        wire_tier t;
    } known[] = {
        KNOWN("GPU", WIRE_TIER_DEVICE), KNOWN("CPU", WIRE_TIER_HOST_PINNED),
        KNOWN("CPU_PINNED", WIRE_TIER_HOST_PINNED),
        KNOWN("DISK", WIRE_TIER_DISK), KNOWN("STORAGE", WIRE_TIER_EXTERNAL)};
#undef KNOWN
    if (!m.p) {
        *tier = WIRE_TIER_DEVICE;
        return true;
    }
    for (size_t i = 0; i < KVO_ARRAY_LEN(known); i++) {
        if (known[i].n == m.len && known[i].s[0] == m.p[0] &&
            memcmp(known[i].s, m.p, m.len) == 0) {
            *tier = known[i].t;
            return true;
        }
    }
    return false;
}

static void reject(relay_pipe *p, relay_reject kind, uint32_t ei,
                   const char *detail) {
    p->st.rejects[kind]++;
    note(p, KVO_LOG_WARN, "reject", "seq %" PRIu64 " event %u rejected: %s",
         p->cur_seq, ei, detail);
}

/* The event's tier; false (the event rejected) when its medium is unknown. */
static bool event_tier(relay_pipe *p, const wire_event *e, uint32_t ei,
                       wire_tier *tier) {
    if (medium_tier(e->medium, tier)) return true;
    char why[64];
    snprintf(why, sizeof(why), "unknown medium '%.*s'",
             (int)(e->medium.len > MEDIUM_SHOWN ? MEDIUM_SHOWN : e->medium.len),
             e->medium.p);
    reject(p, RELAY_medium, ei, why);
    return false;
}

/* Whether s is the string of w. */
static bool str_is(const msgpack_object_str *s, wire_str w) {
    return w.p && s->size == w.len && memcmp(s->ptr, w.p, w.len) == 0;
}

/* One block's router keys from its extra_keys entry k (vLLM's
 * generate_block_hash_extra_keys: the adapter's name, the (identifier,
 * offset) pairs of the multimodal items it overlaps, the salt on block 0
 * only): the pairs into p->mmk (ids copied NUL-terminated into p->idbuf)
 * and the salt. false, why set: an entry it cannot read. */
static bool block_keys(relay_pipe *p, const wire_event *e,
                       const msgpack_object *k, bool first, uint32_t *n_mm,
                       const char **salt, size_t *salt_len, char *why,
                       size_t whysz) {
    *n_mm = 0;
    if (k->type == MSGPACK_OBJECT_NIL) return true;
    if (k->type != MSGPACK_OBJECT_ARRAY) {
        snprintf(why, whysz, "extra_keys entry is not a list");
        return false;
    }
    uint32_t n = k->via.array.size;
    const msgpack_object *v = k->via.array.ptr;
    if (kvo_grow(&p->mmk, &p->cap_mmk, n ? n : 1, sizeof(*p->mmk), 8) !=
        KVO_OK) {
        snprintf(why, whysz, "out of memory");
        return false;
    }
    size_t need = 0;
    for (uint32_t i = 0; i < n; i++)
        if (v[i].type == MSGPACK_OBJECT_ARRAY && v[i].via.array.size == 2 &&
            v[i].via.array.ptr[0].type == MSGPACK_OBJECT_STR)
            need += v[i].via.array.ptr[0].via.str.size + 1;
    kvo_buf_reset(&p->idbuf);
    if (kvo_buf_reserve(&p->idbuf, need + 1) != KVO_OK) {
        snprintf(why, whysz, "out of memory");
        return false;
    }
    char *ids = (char *)p->idbuf.data;
    size_t used = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (v[i].type == MSGPACK_OBJECT_STR) {
            if (i == 0 && str_is(&v[i].via.str, e->lora_name)) continue;
            if (first && i == n - 1) { /* the salt, block 0 only */
                *salt = v[i].via.str.ptr;
                *salt_len = v[i].via.str.size;
                continue;
            }
            snprintf(why, whysz,
                     "extra_keys string %u is neither the adapter "
                     "nor block 0's salt",
                     i);
            return false;
        }
        const msgpack_object *pr = v[i].via.array.ptr;
        if (v[i].type != MSGPACK_OBJECT_ARRAY || v[i].via.array.size != 2 ||
            pr[0].type != MSGPACK_OBJECT_STR ||
            (pr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
             pr[1].type != MSGPACK_OBJECT_NEGATIVE_INTEGER) ||
            (pr[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
             pr[1].via.u64 > INT64_MAX) ||
            memchr(pr[0].via.str.ptr, 0, pr[0].via.str.size)) {
            snprintf(why, whysz,
                     "extra_keys item %u is not a string or an "
                     "(identifier, offset) pair",
                     i);
            return false;
        }
        memcpy(ids + used, pr[0].via.str.ptr, pr[0].via.str.size);
        ids[used + pr[0].via.str.size] = '\0';
        p->mmk[(*n_mm)++] = (wire_mm_key){ids + used, pr[1].via.i64};
        used += pr[0].via.str.size + 1;
    }
    return true;
}

/* A store's extra_keys (vLLM: one entry per block), unpacked once into up
 * (the caller destroys it) for the router hashes and the verification:
 * *list NULL when absent or nil. false, why set: undecodable, not a list,
 * or not one entry per block. */
static bool extra_keys_list(const wire_event *e, msgpack_unpacked *up,
                            const msgpack_object **list, char *why,
                            size_t whysz) {
    *list = NULL;
    if (!e->extra_keys.p) return true;
    size_t off = 0;
    if (msgpack_unpack_next(up, (const char *)e->extra_keys.p,
                            e->extra_keys.len,
                            &off) != MSGPACK_UNPACK_SUCCESS) {
        snprintf(why, whysz, "extra_keys undecodable");
        return false;
    }
    if (up->data.type == MSGPACK_OBJECT_NIL) return true;
    if (up->data.type != MSGPACK_OBJECT_ARRAY) {
        snprintf(why, whysz, "extra_keys is not a list");
        return false;
    }
    if (up->data.via.array.size != e->n_hashes) {
        snprintf(why, whysz, "%u extra_keys entries for %u blocks",
                 up->data.via.array.size, e->n_hashes);
        return false;
    }
    *list = &up->data;
    return true;
}

/* The router hash of every block of a store into p->th (DESIGN §5 as the
 * engine's event describes the blocks): the adapter's seed (lora_name) on
 * every block; the salt's seed on block 0 of a chain root only -- from its
 * extra_keys entry (list, vLLM), else from SGLang's cache_salt field; each
 * block's multimodal pairs appended to its bytes (wire_router_hash_mm).
 * device (a lower tier's store without extra_keys; else NULL): a block
 * whose router hash the rank's device tier holds takes it instead. false,
 * why set: an entry of another shape: such a block cannot be hashed as a
 * router querying the request would. */
static bool router_hashes(relay_pipe *p, const wire_event *e,
                          const msgpack_object *list, uint32_t bs,
                          relay_state_rank *device, char *why, size_t whysz) {
    if (kvo_grow(&p->th, &p->cap_th, e->n_hashes, sizeof(*p->th), 64) !=
        KVO_OK) {
        snprintf(why, whysz, "out of memory");
        return false;
    }
    bool root = e->parent.kind == WIRE_HASH_NONE;
    bool ok = true;
    uint64_t seed = wire_router_seed(e->lora_name.p, e->lora_name.len, NULL, 0);
    for (uint32_t i = 0; ok && i < e->n_hashes; i++) {
        if (device) {
            if (relay_state_tokens_hash(device, WIRE_TIER_DEVICE,
                                        e->hashes[i].key, &p->th[i])) {
                p->st.tier_hash_reused++;
                continue;
            }
            p->st.tier_hash_computed++;
        }
        bool first = root && i == 0;
        const char *salt = first ? e->cache_salt.p : NULL;
        size_t salt_len = first ? e->cache_salt.len : 0;
        uint32_t n_mm = 0;
        if (list && !(ok = block_keys(p, e, &list->via.array.ptr[i], first,
                                      &n_mm, &salt, &salt_len, why, whysz)))
            break;
        uint64_t s = salt ? wire_router_seed(e->lora_name.p, e->lora_name.len,
                                             salt, salt_len)
                          : seed;
        p->th[i] = wire_router_hash_mm(e->token_ids + (size_t)i * bs, bs, s,
                                       p->mmk, n_mm);
    }
    return ok;
}

static void convert_stored(relay_pipe *p, const wire_event *e, uint32_t ei,
                           uint32_t rank, relay_state_rank *fwd) {
    char why[160];
    wire_tier tier;
    if (!event_tier(p, e, ei, &tier)) return;
    uint32_t bs = p->cfg.block_size;
    if (e->n_hashes == 0) {
        reject(p, RELAY_empty, ei, "BlockStored without block hashes");
        return;
    }
    if (tier != WIRE_TIER_DEVICE && e->n_tokens == 0) {
        reject(p, RELAY_no_tokens, ei, "offload store without token_ids");
        return;
    }
    if (e->block_size.set && e->block_size.v != (int64_t)bs) {
        snprintf(why, sizeof(why), "block_size %" PRId64 " != %u",
                 e->block_size.v, bs);
        reject(p, RELAY_block_size, ei, why);
        return;
    }
    if ((uint64_t)e->n_tokens != (uint64_t)e->n_hashes * bs) {
        snprintf(why, sizeof(why), "%u tokens for %u blocks of %u", e->n_tokens,
                 e->n_hashes, bs);
        reject(p, RELAY_token_count, ei, why);
        return;
    }
    for (uint32_t i = 0; i < e->n_tokens; i++) {
        if (e->token_ids[i] > UINT32_MAX) {
            /* The router hashes ids as u32 (DESIGN §5): hashing this one
             * truncated would alias it with its low 32 bits. */
            snprintf(why, sizeof(why),
                     "token_ids[%u] = %" PRIu64 " does not fit 32 bits", i,
                     e->token_ids[i]);
            reject(p, RELAY_token_range, ei, why);
            return;
        }
    }
    /* A lower tier's store without extra_keys (vLLM's offloading events
     * tracker defers them): hashed from its tokens alone, a block would lack
     * the salt of a prompt's block 0 and the multimodal keys its GPU store
     * had, and no router query of the request would find it. The engine
     * offloads a block while its GPU copy is still cached (vLLM and
     * kvo-mocker publish the CPU store before the GPU's BlockRemoved), so
     * the rank's device tier holds the block's exact router hash: it is
     * taken (router_hashes); only a block the device tier does not hold is
     * hashed from its tokens (fwd NULL: no state, state_dropped counted). */
    bool keyless = tier != WIRE_TIER_DEVICE && !e->extra_keys.p;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    const msgpack_object *list;
    if (!extra_keys_list(e, &up, &list, why, sizeof(why)) ||
        !router_hashes(p, e, list, bs, keyless ? fwd : NULL, why,
                       sizeof(why))) {
        msgpack_unpacked_destroy(&up);
        reject(p, RELAY_extra_keys, ei, why);
        return;
    }
    /* nor can the engine hash of a keyless store be verified: the keys it
     * took are unknown here */
    if (p->cfg.verify && keyless)
        p->st.hash_unsupported += e->n_hashes;
    else if (p->cfg.verify)
        verify_store(p, e, ei, bs, list);
    msgpack_unpacked_destroy(&up);
    pend_store(p, rank, tier, e, p->th, fwd);
}

static void convert_removed(relay_pipe *p, const wire_event *e, uint32_t ei,
                            uint32_t rank, relay_state_rank *fwd) {
    wire_tier tier;
    if (!event_tier(p, e, ei, &tier)) return;
    if (e->n_hashes == 0) {
        reject(p, RELAY_empty, ei, "BlockRemoved without block hashes");
        return;
    }
    for (uint32_t i = 0; i < e->n_hashes; i++) {
        uint64_t h = e->hashes[i].key;
        kvo_map_dec_result r =
            fwd ? relay_state_remove(fwd, tier, h) : KVO_MAP_ABSENT;
        if (r == KVO_MAP_HELD) {
            p->st.dedup_suppressed++;
            continue;
        }
        if (r == KVO_MAP_ABSENT) p->st.removes_unknown++;
        if (p->cfg.verify) digest_forget(p, h);
        pend_remove(p, rank, tier, h);
    }
}

/* ---- applying a batch ----------------------------------------------------*/

static void batch_done(relay_pipe *p, uint64_t seq) {
    touch(p);
    p->p_has_last = true;
    p->p_last = seq;
}

/* The batch applied as seq had exactly these bytes (and is remembered). */
static bool seen_same(const source *s, uint64_t seq, const uint8_t *payload,
                      size_t len) {
    uint32_t k = (uint32_t)(seq % SEEN_RING);
    return s->seen_seq[k] == seq + 1 &&
           s->seen_hash[k] == XXH3_64bits(payload, len);
}

/* The seen ring still has the batch applied as seq. */
static bool seen_known(const source *s, uint64_t seq) {
    return s->seen_seq[seq % SEEN_RING] == seq + 1;
}

static void apply(relay_pipe *p, uint32_t si, uint64_t seq,
                  const uint8_t *payload, size_t len, bool replayed) {
    source *s = &p->src[si];
    uint32_t k = (uint32_t)(seq % SEEN_RING);
    s->seen_seq[k] = seq + 1;
    s->seen_hash[k] = XXH3_64bits(payload, len);
    s->next = seq + 1;
    s->has_next = true;
    p->st.batches_applied++;
    if (replayed) p->st.replays_applied++;
    if (!pend_empty(p) && p->psrc != si) relay_pipe_flush(p);
    p->psrc = si;
    p->cur_seq = seq;

    kvo_err err;
    kvo_status st =
        wire_batch_decode(payload, len, p->cfg.limits, &p->batch, &err);
    if (st != KVO_OK) {
        p->st.decode_errors[st < KVO_STATUS_COUNT ? st : KVO_EPROTO]++;
        char buf[256];
        note(p, KVO_LOG_WARN, "decode",
             "source %u seq %" PRIu64 ": undecodable batch (%zu bytes): %s", si,
             seq, len, kvo_err_str(&err, buf, sizeof(buf)));
        batch_done(p, seq);
        return;
    }
    const wire_batch *b = &p->batch;
    for (uint32_t i = 0; i < b->n_events; i++) {
        const wire_event *e = &b->events[i];
        p->st.events_stored += e->type == WIRE_EV_STORED;
        p->st.events_removed += e->type == WIRE_EV_REMOVED;
        p->st.events_cleared += e->type == WIRE_EV_CLEARED;
        if (e->type == WIRE_EV_STORED) p->st.blocks_stored += e->n_hashes;
        if (e->type == WIRE_EV_REMOVED) p->st.blocks_removed += e->n_hashes;
    }
    uint32_t rank = s->fallback_rank;
    bool fits = !b->dp_rank.set ||
                (b->dp_rank.v >= 0 && b->dp_rank.v <= (int64_t)UINT32_MAX);
    if (fits && b->dp_rank.set) rank = (uint32_t)b->dp_rank.v;
    /* The rank's forwarded state; NULL when out of memory (then nothing is
     * recorded, counted as state_dropped) or when the table is full. */
    relay_state_rank *fwd = NULL;
    kvo_status rs =
        fits ? relay_state_rank_get(p->state, rank, &fwd) : KVO_EINVAL;
    if (rs == KVO_EINVAL || rs == KVO_ETOOBIG) {
        p->st.rejects[RELAY_dp_rank] += b->n_events;
        note(p, KVO_LOG_WARN, "reject",
             "seq %" PRIu64 ": data_parallel_rank %" PRId64
             " out of range or beyond %u distinct ranks, %u events rejected",
             seq, fits ? (int64_t)rank : b->dp_rank.v, RELAY_STATE_MAX_RANKS,
             b->n_events);
        batch_done(p, seq);
        return;
    }
    s->rank = rank;
    for (uint32_t i = 0; i < b->n_events; i++) {
        const wire_event *e = &b->events[i];
        /* A hybrid model (vLLM's hybrid allocator) publishes every KV-cache
         * group; a router indexes group 0, the full-attention group: the
         * others (sliding window, Mamba) hold the same hashes over other
         * blocks and would corrupt it. Counted, not forwarded. */
        if (e->type != WIRE_EV_CLEARED && e->group_idx.set &&
            e->group_idx.v != 0) {
            p->st.blocks_other_group += e->n_hashes;
            continue;
        }
        switch (e->type) {
        case WIRE_EV_STORED: convert_stored(p, e, i, rank, fwd); break;
        case WIRE_EV_REMOVED: convert_removed(p, e, i, rank, fwd); break;
        case WIRE_EV_CLEARED: pend_cleared(p, rank); break;
        }
    }
    batch_done(p, seq);
}

/* ---- sequence state machine ----------------------------------------------*/

static void buffer_clear(source *s) {
    for (uint32_t i = 0; i < s->nbuf; i++) kvo_free(s->buf[i].data);
    s->nbuf = 0;
    s->buf_bytes = 0;
}

static void buffer_push(relay_pipe *p, source *s, uint64_t seq,
                        const uint8_t *payload, size_t len) {
    if (s->nbuf >= p->cfg.buffer_max_batches ||
        s->buf_bytes + len > p->cfg.buffer_max_bytes)
        goto drop;
    if (kvo_grow(&s->buf, &s->capbuf, s->nbuf + 1, sizeof(*s->buf),
                 HELD_FIRST_CAP) != KVO_OK)
        goto drop;
    uint8_t *copy = kvo_malloc(len ? len : 1);
    if (!copy) goto drop;
    memcpy(copy, payload, len);
    s->buf[s->nbuf++] = (held){seq, len, copy};
    s->buf_bytes += len;
    p->st.live_buffered++;
    return;
drop:
    p->st.buffer_dropped++;
    s->overflowed = true;
    note(p, KVO_LOG_WARN, "buffer",
         "replay buffer full: live batch %" PRIu64 " dropped (replayed later)",
         seq);
}

static bool request_replay(relay_pipe *p, uint32_t si, uint64_t from);

/* Apply the buffered live batches in order. After a failure the first hole
 * is accepted as is (the index was cleared already); after a replay that
 * completed, a hole means the replay could not cover it. */
static void drain(relay_pipe *p, uint32_t si, bool after_failure) {
    source *s = &p->src[si];
    s->state = RELAY_SRC_LIVE;
    s->broke = false; /* that replay is over */
    s->probing = false;
    uint32_t n = s->nbuf;
    held *items = s->buf;
    s->buf = NULL;
    s->nbuf = s->capbuf = 0;
    s->buf_bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        held *h = &items[i];
        if (s->has_next && h->seq < s->next) {
            p->st.duplicates_dropped++;
        } else {
            if (s->has_next && h->seq > s->next && !after_failure) {
                lost(p, si, RELAY_incomplete);
                note(p, KVO_LOG_WARN, "replay",
                     "source %u: replay ended at %" PRIu64
                     ", live resumes at %" PRIu64,
                     si, s->next, h->seq);
            }
            after_failure = false;
            apply(p, si, h->seq, h->data, h->len, false);
        }
        kvo_free(h->data);
    }
    kvo_free(items);
    if (s->overflowed) {
        s->overflowed = false;
        if (s->has_next && s->has_replay) request_replay(p, si, s->next);
    }
}

/* The replay will not come: count, clear, go on with what is buffered. */
static void replay_failed(relay_pipe *p, uint32_t si, relay_replay_fail why) {
    source *s = &p->src[si];
    if (p->out.replay_abort) p->out.replay_abort(p->out.ctx, si);
    lost(p, si, why);
    note(p, KVO_LOG_WARN, "replay",
         "source %u: replay from %" PRIu64 " failed (%s)", si, s->want,
         fail_names[why]);
    s->has_next = false; /* accept whatever comes next */
    drain(p, si, true);
}

/* Ask source si for every batch from `from` on. true: the replay is
 * outstanding (the source is REPLAYING); false: it could not be asked (no
 * endpoint, or the request failed), the loss is counted and the source takes
 * whatever comes next. */
static bool request_replay(relay_pipe *p, uint32_t si, uint64_t from) {
    source *s = &p->src[si];
    if (!s->has_replay) {
        lost(p, si, RELAY_no_endpoint);
        s->has_next = false;
        return false;
    }
    s->state = RELAY_SRC_REPLAYING;
    s->want = from;
    s->got_reply = false;
    s->probing = false;
    s->deadline = p->now + p->cfg.replay_timeout_ms * RELAY_NS_PER_MS;
    s->has_next = true;
    s->next = from;
    p->st.replays_requested++;
    note(p, KVO_LOG_INFO, "replay", "source %u: replay requested from %" PRIu64,
         si, from);
    kvo_status st = p->out.replay_request(p->out.ctx, si, from);
    if (st != KVO_OK) {
        replay_failed(p, si, RELAY_request_failed);
        return false;
    }
    return true;
}

/* Live batch seq came after a hole that starts at from: ask for the hole and
 * hold seq until the replay has filled it; when no replay can be asked, seq
 * is taken as it is. */
static void replay_then(relay_pipe *p, uint32_t si, uint64_t from, uint64_t seq,
                        const uint8_t *payload, size_t len) {
    if (request_replay(p, si, from))
        buffer_push(p, &p->src[si], seq, payload, len);
    else
        apply(p, si, seq, payload, len, false);
}

static void on_live(relay_pipe *p, uint32_t si, uint64_t seq,
                    const uint8_t *payload, size_t len) {
    source *s = &p->src[si];
    /* Behind next while LIVE: the same batch late (its bytes were applied
     * as seq), or a publisher that started over -- also when no live batch
     * was seen yet (everything so far came through a replay). */
    bool went_back = (s->has_live && seq <= s->live_last) ||
                     (s->state == RELAY_SRC_LIVE && s->has_next &&
                      seq < s->next && !seen_same(s, seq, payload, len));
    if (went_back) {
        /* The publisher started over: nothing we hold is valid. */
        p->st.restarts++;
        note(p, KVO_LOG_WARN, "restart",
             "source %u: sequence went back from %" PRIu64 " to %" PRIu64
             " (publisher restart)",
             si, s->has_live ? s->live_last : s->next - 1, seq);
        if (s->state == RELAY_SRC_REPLAYING) {
            if (p->out.replay_abort) p->out.replay_abort(p->out.ctx, si);
            p->st.buffer_discarded += s->nbuf;
            buffer_clear(s);
            s->overflowed = false;
            s->state = RELAY_SRC_LIVE;
            s->probing = false;
        }
        s->live_last = seq;
        s->dirty = true; /* always say it: the engine lost its cache */
        emit_cleared(p, si, "publisher restart");
        if (seq == 0 || !s->has_replay) {
            if (seq != 0) p->st.replay_failures[RELAY_no_endpoint]++;
            apply(p, si, seq, payload, len, false);
            return;
        }
        replay_then(p, si, 0, seq, payload, len);
        return;
    }
    s->has_live = true;
    s->live_last = seq;
    if (s->state == RELAY_SRC_REPLAYING) {
        buffer_push(p, s, seq, payload, len);
        return;
    }
    if (!s->has_next || seq == s->next) {
        apply(p, si, seq, payload, len, false);
        return;
    }
    if (seq < s->next) {
        p->st.duplicates_dropped++;
        return;
    }
    p->st.gaps++;
    note(p, KVO_LOG_WARN, "gap",
         "source %u: sequence gap, expected %" PRIu64 " got %" PRIu64, si,
         s->next, seq);
    replay_then(p, si, s->next, seq, payload, len);
}

/* ---- a SUB back after a loss: same engine, or a new one? -------------------*/

/* The engine behind si restarted while its SUB was away (the probe says
 * why): nothing it held is valid. Say so (cleared), and replay the new run
 * from 0. Live batches buffered since the SUB came back are the new run's:
 * they stay, and the last of them is the new run's last live one. */
static void probe_restart(relay_pipe *p, uint32_t si, const char *why) {
    source *s = &p->src[si];
    s->probing = false;
    p->st.restarts++;
    note(p, KVO_LOG_WARN, "restart",
         "source %u: publisher restarted while the SUB was away: %s "
         "(batch %" PRIu64 ")",
         si, why, s->probe);
    if (p->out.replay_abort) p->out.replay_abort(p->out.ctx, si);
    s->has_live = s->nbuf > 0;
    for (uint32_t i = 0; i < s->nbuf; i++)
        if (i == 0 || s->buf[i].seq > s->live_last)
            s->live_last = s->buf[i].seq;
    s->dirty = true; /* always say it: the engine lost its cache */
    emit_cleared(p, si, "publisher restart");
    request_replay(p, si, 0);
}

/* Ask si's replay from the last batch applied, to compare what comes back
 * with what was applied. */
static void probe(relay_pipe *p, uint32_t si) {
    source *s = &p->src[si];
    uint64_t at = s->next - 1;
    s->broke = false;
    if (!request_replay(p, si, at)) return;
    s->probing = true;
    s->probe = at;
}

/* A batch reply while probing: true when it goes on as any reply. */
static bool probe_reply(relay_pipe *p, uint32_t si, uint64_t seq,
                        const uint8_t *payload, size_t len) {
    source *s = &p->src[si];
    if (seq < s->probe) { /* from further back than asked */
        if (seen_known(s, seq) && !seen_same(s, seq, payload, len)) {
            probe_restart(p, si, "an earlier batch came back with other bytes");
            return false;
        }
        p->st.duplicates_dropped++;
        return false;
    }
    s->probing = false;
    if (seq == s->probe) {
        if (!seen_same(s, seq, payload, len)) {
            probe_restart(p, si,
                          "the last batch applied came back with other bytes");
            return false;
        }
        /* The same engine: go on after it. */
        p->st.duplicates_dropped++;
        s->got_reply = true;
        s->next = seq + 1;
        return false;
    }
    /* Its buffer no longer holds the batch: the reply is judged as any
     * first reply from the batch after it (a hole is a window exceeded). */
    s->next = s->probe + 1;
    return true;
}

static void on_reply(relay_pipe *p, uint32_t si, uint64_t seq,
                     const uint8_t *payload, size_t len, bool end) {
    source *s = &p->src[si];
    if (s->state != RELAY_SRC_REPLAYING) {
        p->st.replay_stray++;
        return;
    }
    s->deadline = p->now + p->cfg.replay_timeout_ms * RELAY_NS_PER_MS;
    if (end && s->probing) {
        p->st.replays_completed++;
        probe_restart(p, si, "it holds nothing from the last batch applied on");
        return;
    }
    if (end) {
        p->st.replays_completed++;
        note(p, KVO_LOG_INFO, "replay",
             "source %u: replay from %" PRIu64 " done, next %" PRIu64, si,
             s->want, s->next);
        drain(p, si, false);
        return;
    }
    p->st.batches_replayed++;
    if (s->probing && !probe_reply(p, si, seq, payload, len)) return;
    if (!s->got_reply) {
        s->got_reply = true;
        if (seq > s->next) {
            note(p, KVO_LOG_WARN, "replay",
                 "source %u: replay window exceeded: asked %" PRIu64
                 ", oldest %" PRIu64,
                 si, s->next, seq);
            lost(p, si, RELAY_window_exceeded);
            s->next = seq;
        }
    }
    if (seq < s->next) {
        p->st.duplicates_dropped++;
        return;
    }
    if (seq > s->next) {
        lost(p, si, RELAY_incomplete);
        note(p, KVO_LOG_WARN, "replay",
             "source %u: replay skipped from %" PRIu64 " to %" PRIu64, si,
             s->next, seq);
    }
    apply(p, si, seq, payload, len, true);
}

/* ---- public entry points -------------------------------------------------*/

void relay_pipe_live(relay_pipe *p, uint32_t si, const wire_frame *f,
                     uint32_t n, uint64_t now_ns) {
    if (si >= p->nsrc) return;
    p->now = now_ns;
    p->st.batches_live++;
    uint64_t seq;
    if (n != 3) {
        p->st.bad_msgs[RELAY_frames]++;
        note(p, KVO_LOG_WARN, "frames",
             "source %u: message with %u frames skipped (expected 3)", si, n);
        return;
    }
    if (wire_seq_get(f[1].data, f[1].len, &seq) != KVO_OK) {
        p->st.bad_msgs[RELAY_seq]++;
        note(p, KVO_LOG_WARN, "frames",
             "source %u: sequence frame of %zu bytes skipped", si, f[1].len);
        return;
    }
    on_live(p, si, seq, f[2].data, f[2].len);
}

void relay_pipe_replay(relay_pipe *p, uint32_t si, const wire_frame *f,
                       uint32_t n, uint64_t now_ns) {
    if (si >= p->nsrc) return;
    p->now = now_ns;
    /* ["", topic, seq, payload] (vLLM >= 0.26) or ["", seq, payload]. */
    const wire_frame *fs = NULL, *fp = NULL;
    if (n == 4 && f[0].len == 0) {
        fs = &f[2];
        fp = &f[3];
    } else if (n == 3 && f[0].len == 0) {
        fs = &f[1];
        fp = &f[2];
    }
    uint64_t seq;
    if (!fs || wire_seq_get(fs->data, fs->len, &seq) != KVO_OK) {
        p->st.bad_msgs[RELAY_replay_frames]++;
        note(p, KVO_LOG_WARN, "frames",
             "source %u: replay reply with %u frames skipped", si, n);
        return;
    }
    bool end = seq == WIRE_REPLAY_END && fp->len == 0;
    on_reply(p, si, seq, fp->data, fp->len, end);
}

/* Batch next of si cannot be received (relay_pipe_link says why): count
 * it, clear the rank as for a gap no replay can fill, and mark the batch
 * done so the watermark passes it (a lockstep driver waiting for it would
 * otherwise wait for ever). */
static void skip_oversize(relay_pipe *p, uint32_t si) {
    source *s = &p->src[si];
    uint64_t seq = s->next;
    SRC_COUNT(p, si, oversize);
    note(p, KVO_LOG_WARN, "oversize",
         "source %u: batch %" PRIu64 " lost: the replay connection dropped "
         "twice right before it (a frame over --zmq-max-msg-bytes?)",
         si, seq);
    if (s->dirty) emit_cleared(p, si, "oversize batch");
    if (!pend_empty(p) && p->psrc != si) relay_pipe_flush(p);
    p->psrc = si;
    p->cur_seq = seq;
    batch_done(p, seq);
    s->next = seq + 1;
    s->broke = false;
}

/* The replay connection of si dropped: what was in flight is gone. */
static void replay_link_lost(relay_pipe *p, uint32_t si) {
    source *s = &p->src[si];
    if (p->out.replay_abort) p->out.replay_abort(p->out.ctx, si);
    if (s->state != RELAY_SRC_REPLAYING) return; /* reopened on demand */
    if (s->probing) {
        /* Twice broken before the batch asked for came back. Either a new
         * engine's batch there is too big, or ours came back right before
         * one too big after it and libzmq dropped both with the
         * connection (which of the two depends on timing). Nothing tells
         * them apart, so take the side that cannot leave stale blocks: a
         * restart (cleared, replay from 0). */
        if (s->broke && s->broke_at == s->probe) {
            probe_restart(p, si,
                          "cannot tell: its replay broke twice before the "
                          "last batch applied came back, so taken as one");
            return;
        }
        uint64_t at = s->probe;
        note(p, KVO_LOG_WARN, "link",
             "source %u: replay connection lost while checking batch %" PRIu64
             ", asking again",
             si, at);
        s->next = at + 1;
        probe(p, si);
        if (s->probing) {
            s->broke = true;
            s->broke_at = at;
        }
        return;
    }
    if (s->broke && s->broke_at == s->next) {
        skip_oversize(p, si);
    } else {
        s->broke = true;
        s->broke_at = s->next;
        note(p, KVO_LOG_WARN, "link",
             "source %u: replay connection lost at %" PRIu64 ", asking again",
             si, s->next);
    }
    request_replay(p, si, s->next);
}

void relay_pipe_link(relay_pipe *p, uint32_t si, relay_link what,
                     uint64_t now_ns) {
    if (si >= p->nsrc) return;
    p->now = now_ns;
    source *s = &p->src[si];
    switch (what) {
    case RELAY_LINK_SUB_UP:
        s->link_up = true;
        if (!s->link_was_up) {
            s->link_was_up = true;
            return; /* the first connection: nothing was missed yet */
        }
        SRC_COUNT(p, si, zmq_reconnects);
        note(p, KVO_LOG_INFO, "link", "source %u: SUB connection back%s", si,
             s->has_next && s->has_replay ? ", replaying what it missed" : "");
        if (!s->has_next || !s->has_replay)
            return; /* the next batch shows it */
        if (s->state == RELAY_SRC_REPLAYING && p->out.replay_abort)
            p->out.replay_abort(p->out.ctx, si);
        /* The engine may have restarted meanwhile, idle (nothing new to
         * show it): ask from the last batch applied and compare. */
        if (s->next > 0 && seen_known(s, s->next - 1))
            probe(p, si);
        else
            request_replay(p, si, s->next);
        return;
    case RELAY_LINK_SUB_DOWN:
        s->link_up = false;
        SRC_COUNT(p, si, zmq_disconnects);
        note(p, KVO_LOG_WARN, "link", "source %u: SUB connection lost", si);
        return;
    case RELAY_LINK_SUB_REOPENED:
        SRC_COUNT(p, si, zmq_sockets_reopened);
        note(p, KVO_LOG_WARN, "reopen",
             "source %u: libzmq gave the SUB up (protocol error, e.g. a "
             "frame over --zmq-max-msg-bytes): made a new one",
             si);
        return;
    case RELAY_LINK_REPLAY_DOWN:
        SRC_COUNT(p, si, zmq_disconnects);
        replay_link_lost(p, si);
        return;
    case RELAY_LINK_HANDSHAKE_FAILED:
        SRC_COUNT(p, si, zmq_protocol_errors);
        note(p, KVO_LOG_WARN, "handshake", "source %u: ZMTP handshake failed",
             si);
        return;
    case RELAY_LINK_COUNT: break;
    }
}

void relay_pipe_tick(relay_pipe *p, uint64_t now_ns) {
    p->now = now_ns;
    for (uint32_t i = 0; i < p->nsrc; i++) {
        source *s = &p->src[i];
        if (s->state == RELAY_SRC_REPLAYING && now_ns >= s->deadline)
            replay_failed(p, i, RELAY_timeout);
    }
}

uint64_t relay_pipe_deadline(const relay_pipe *p) {
    uint64_t d = 0;
    for (uint32_t i = 0; i < p->nsrc; i++) {
        const source *s = &p->src[i];
        if (s->state == RELAY_SRC_REPLAYING && (!d || s->deadline < d))
            d = s->deadline;
    }
    return d;
}

void relay_pipe_start(relay_pipe *p, uint64_t now_ns) {
    p->now = now_ns;
    if (!p->cfg.replay_from_set) return;
    for (uint32_t i = 0; i < p->nsrc; i++) {
        p->src[i].dirty = true; /* the index may hold anything */
        emit_cleared(p, i, "start");
        request_replay(p, i, p->cfg.replay_from);
    }
}

/* ---- recovery (docs/recovery.md) -------------------------------------------*/

/* Insert r into the sorted out[0..*n) unless it is there (or out is full). */
static void rank_add(uint32_t *out, size_t *n, size_t max, uint32_t r) {
    size_t i = 0;
    while (i < *n && out[i] < r) i++;
    if ((i < *n && out[i] == r) || *n == max) return;
    memmove(&out[i + 1], &out[i], (*n - i) * sizeof(*out));
    out[i] = r;
    (*n)++;
}

size_t relay_pipe_ranks(const relay_pipe *p, uint32_t *out, size_t max) {
    size_t n = relay_state_ranks(p->state, out, max);
    for (uint32_t i = 0; i < p->nsrc; i++) {
        rank_add(out, &n, max, p->src[i].fallback_rank);
        rank_add(out, &n, max, p->src[i].rank);
    }
    return n;
}

bool relay_pipe_last_sequence(const relay_pipe *p, uint64_t *seq) {
    if (p->sequence == 0) return false;
    *seq = p->sequence - 1;
    return true;
}

static kvo_status send_end(relay_reply_fn reply, void *ctx,
                           wire_reply_kind what, const wire_reply_end *e,
                           kvo_buf *b) {
    kvo_buf_reset(b);
    kvo_status st = wire_reply_end_encode(what, e, b);
    return st == KVO_OK ? reply(ctx, what, false, 0, 0, b->data, b->len) : st;
}

/* The envelopes from..last of the ring, then the end. */
static kvo_status send_events(relay_pipe *p, uint64_t from, uint64_t last,
                              relay_reply_fn reply, void *ctx,
                              relay_recovery *out) {
    for (uint64_t seq = from; seq <= last; seq++) {
        const relay_ring_env *e = relay_ring_get(p->ring, seq);
        if (!e) return KVO_ESTATE; /* the caller checked: cannot happen */
        kvo_status st = reply(ctx, WIRE_REPLY_EVENTS, e->has_range, e->first,
                              e->last, e->body, e->len);
        if (st != KVO_OK) return st;
        out->sent++;
        p->st.recovery_envelopes_sent++;
    }
    wire_reply_end end = {.kind = WIRE_REPLY_EVENTS,
                          .sent = out->sent,
                          .has_as_of = true,
                          .as_of = last};
    return send_end(reply, ctx, WIRE_REPLY_END, &end, &p->body);
}

/* The state as envelopes (none before the first envelope was published:
 * nothing was forwarded yet), then the end. */
static kvo_status send_dump(relay_pipe *p, size_t max_payload,
                            relay_reply_fn reply, void *ctx,
                            relay_recovery *out) {
    kvo_status st = KVO_OK;
    if (out->has_as_of) {
        uint32_t ranks[RELAY_PIPE_MAX_RANKS];
        relay_dump_cfg dc = {
            .publisher_id = p->cfg.publisher_id,
            .worker_id = p->cfg.worker_id,
            .event_id = p->event_id,
            .as_of = out->as_of,
            .published_at_ms = kvo_unix_ns() / RELAY_NS_PER_MS,
            .has_wm = p->has_wm,
            .wm_first = p->wm_first,
            .wm_last = p->wm_last,
            .ranks = ranks,
            .n_ranks = relay_pipe_ranks(p, ranks, KVO_ARRAY_LEN(ranks)),
            .max_payload = max_payload,
            .max_events = p->cfg.max_events,
            .max_blocks = p->cfg.max_blocks,
        };
        relay_dump_result dr;
        st = relay_dump_send(&dc, p->state, reply, ctx, &dr);
        out->sent = dr.sent;
        out->blocks = dr.blocks;
        out->orphans = dr.orphans;
        p->st.recovery_envelopes_sent += dr.sent;
        p->st.dump_blocks_sent += dr.blocks;
        p->st.dump_orphans += dr.orphans;
    }
    if (st != KVO_OK) return st;
    wire_reply_end end = {.kind = WIRE_REPLY_DUMP,
                          .sent = out->sent,
                          .has_as_of = out->has_as_of,
                          .as_of = out->as_of,
                          .blocks = out->blocks};
    st = send_end(reply, ctx, WIRE_REPLY_END, &end, &p->body);
    if (st == KVO_OK) p->st.dumps_sent++;
    return st;
}

kvo_status relay_pipe_recover(relay_pipe *p, const char *reply_to,
                              const uint8_t *body, size_t len,
                              size_t max_payload, relay_reply_fn reply,
                              void *ctx, relay_recovery *out, kvo_err *err) {
    memset(out, 0, sizeof(*out));
    wire_recovery_req req;
    kvo_status st;
    if (!reply_to || !*reply_to)
        st = kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET, "no reply inbox");
    else if (len > RELAY_RECOVERY_REQUEST_MAX)
        st = kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                         "a request of %zu bytes (at most %u)", len,
                         RELAY_RECOVERY_REQUEST_MAX);
    else
        st = wire_recovery_req_decode(&p->req, body, len, &req, err);
    if (st != KVO_OK) {
        p->st.recovery_bad_requests++;
        out->bad = true;
        return st;
    }
    /* Answer between two published envelopes: what is pending goes out
     * first, so the state is exactly that of the last envelope. */
    relay_pipe_flush(p);
    out->has_as_of = relay_pipe_last_sequence(p, &out->as_of);
    if (!req.dump && (!out->has_as_of || req.from_sequence > out->as_of)) {
        out->kind = WIRE_REPLY_TOO_NEW;
        p->st.recovery_requests[RELAY_too_new]++;
        wire_reply_end e = {.kind = WIRE_REPLY_TOO_NEW,
                            .has_as_of = out->has_as_of,
                            .as_of = out->as_of};
        st = send_end(reply, ctx, WIRE_REPLY_TOO_NEW, &e, &p->body);
    } else if (!req.dump && relay_ring_holds(p->ring, req.from_sequence) &&
               relay_ring_holds(p->ring, out->as_of)) {
        /* (an envelope that could not be encoded is in no ring: then the
         * ring ends before the last sequence, and a dump answers) */
        out->kind = WIRE_REPLY_EVENTS;
        p->st.recovery_requests[RELAY_events]++;
        st = send_events(p, req.from_sequence, out->as_of, reply, ctx, out);
    } else {
        out->kind = WIRE_REPLY_DUMP;
        p->st.recovery_requests[RELAY_dump]++;
        st = send_dump(p, max_payload, reply, ctx, out);
    }
    if (st != KVO_OK) {
        p->st.recovery_replies_failed++;
        kvo_err_set(err, st, KVO_ERR_NO_OFFSET,
                    "%s reply abandoned after %" PRIu64 " envelopes: %s",
                    wire_reply_kind_name(out->kind), out->sent,
                    kvo_strerror(st));
    }
    return st;
}

kvo_status relay_pipe_new(relay_pipe **out, const relay_pipe_cfg *cfg,
                          const relay_out *o) {
    if (!cfg || !o || !o->publish || !o->replay_request || !cfg->subject ||
        cfg->block_size == 0)
        return KVO_EINVAL;
    kvo_status st = KVO_ENOMEM;
    relay_pipe *p = kvo_calloc(1, sizeof(*p));
    if (!p) return KVO_ENOMEM;
    p->cfg = *cfg;
    p->out = *o;
    if (!p->cfg.replay_timeout_ms)
        p->cfg.replay_timeout_ms = RELAY_PIPE_REPLAY_TIMEOUT_MS;
    if (!p->cfg.buffer_max_batches)
        p->cfg.buffer_max_batches = RELAY_PIPE_BUFFER_BATCHES;
    if (!p->cfg.buffer_max_bytes)
        p->cfg.buffer_max_bytes = RELAY_PIPE_BUFFER_BYTES;
    if (!p->cfg.max_events || p->cfg.max_events > RELAY_PIPE_MAX_EVENTS)
        p->cfg.max_events = RELAY_PIPE_MAX_EVENTS;
    if (!p->cfg.max_blocks || p->cfg.max_blocks > RELAY_PIPE_MAX_BLOCKS)
        p->cfg.max_blocks = RELAY_PIPE_MAX_BLOCKS;
    if (!p->cfg.verify_max_blocks)
        p->cfg.verify_max_blocks = RELAY_PIPE_VERIFY_BLOCKS;
    if (!p->cfg.ring_max_envelopes)
        p->cfg.ring_max_envelopes = RELAY_PIPE_RING_ENVELOPES;
    if (!p->cfg.ring_max_bytes) p->cfg.ring_max_bytes = RELAY_PIPE_RING_BYTES;
    kvo_json_init(&p->req);
    wire_batch_init(&p->batch);
    wire_plane_init(&p->msg);
    kvo_buf_init(&p->body);
    kvo_buf_init(&p->hscratch);
    kvo_buf_init(&p->idbuf);
    kvo_map_init(&p->digests);
    p->subject = kvo_strdup(cfg->subject);
    p->pev = kvo_calloc(p->cfg.max_events, sizeof(*p->pev));
    p->pblocks = kvo_calloc(p->cfg.max_blocks, sizeof(*p->pblocks));
    p->premoved = kvo_calloc(p->cfg.max_blocks, sizeof(*p->premoved));
    if (!p->subject || !p->pev || !p->pblocks || !p->premoved) goto done;
    if ((st = relay_state_new(&p->state)) != KVO_OK ||
        (st = relay_ring_new(&p->ring, p->cfg.ring_max_envelopes,
                             p->cfg.ring_max_bytes)) != KVO_OK)
        goto done;
    if (p->cfg.verify) {
        st = wire_engine_root(p->cfg.verify_algo,
                              p->cfg.hash_seed ? p->cfg.hash_seed : "0",
                              &p->root);
        if (st != KVO_OK) goto done;
    }
    p->cfg.subject = p->subject;
    p->cfg.hash_seed = NULL; /* only used above */
    *out = p;
    return KVO_OK;
done:
    relay_pipe_free(p);
    return st;
}

void relay_pipe_free(relay_pipe *p) {
    if (!p) return;
    for (uint32_t i = 0; i < p->nsrc; i++) {
        buffer_clear(&p->src[i]);
        kvo_free(p->src[i].buf);
    }
    kvo_free(p->src);
    relay_state_free(p->state);
    relay_ring_free(p->ring);
    kvo_json_fini(&p->req);
    wire_batch_fini(&p->batch);
    wire_plane_fini(&p->msg);
    kvo_buf_fini(&p->body);
    kvo_buf_fini(&p->hscratch);
    kvo_buf_fini(&p->idbuf);
    kvo_free(p->th);
    kvo_free(p->mmk);
    kvo_map_fini(&p->digests);
    kvo_free(p->dpool);
    kvo_free(p->dfree);
    kvo_free(p->subject);
    kvo_free(p->pev);
    kvo_free(p->pblocks);
    kvo_free(p->premoved);
    kvo_free(p);
}

kvo_status relay_pipe_source_add(relay_pipe *p, uint32_t fallback_rank,
                                 bool has_replay, uint32_t *id) {
    if (p->nsrc >= RELAY_MAX_SOURCES) return KVO_ETOOBIG;
    source *n = kvo_realloc(p->src, (p->nsrc + 1) * sizeof(*n));
    if (!n) return KVO_ENOMEM;
    p->src = n;
    source *s = &p->src[p->nsrc];
    memset(s, 0, sizeof(*s));
    s->fallback_rank = s->rank = fallback_rank;
    s->has_replay = has_replay;
    if (id) *id = p->nsrc;
    p->nsrc++;
    return KVO_OK;
}

relay_stats *relay_pipe_stats(relay_pipe *p) {
    p->st.n_src = p->nsrc;
    uint64_t depth = 0;
    for (uint32_t i = 0; i < p->nsrc; i++) depth += p->src[i].nbuf;
    p->st.buffer_depth = depth;
    relay_state_size(p->state, &p->st.state_blocks, &p->st.state_bytes);
    relay_ring_size(p->ring, &p->st.ring_envelopes, &p->st.ring_bytes);
    return &p->st;
}

uint32_t relay_pipe_source_count(const relay_pipe *p) { return p->nsrc; }

void relay_pipe_source_info(const relay_pipe *p, uint32_t si,
                            relay_src_info *out) {
    memset(out, 0, sizeof(*out));
    if (si >= p->nsrc) return;
    const source *s = &p->src[si];
    out->dp_rank = s->rank;
    out->state = s->state;
    out->connected = s->link_up;
    out->has_next = s->has_next;
    out->next_seq = s->next;
    out->buffered = s->nbuf;
}
