/* wire_recovery.c -- the recovery extension of the event plane
 * (docs/recovery.md): subjects, and the JSON control messages relays and
 * indexers exchange (announce, recovery request, the end of a reply
 * stream). Envelopes themselves are wire_plane.c's.
 *
 * Written by hand into a kvo_buf (the shapes are small and fixed), read
 * with base's strict reader (kvo_json): one object, exact integers.
 */
#include "kvo_json.h"
#include "wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *const subject_suffix[] = {
    [WIRE_SUBJ_EVENTS] = "kv-events",
    [WIRE_SUBJ_RELAYS] = "kv-relays",
    [WIRE_SUBJ_DISCOVER] = "kv-relays.discover",
    [WIRE_SUBJ_RECOVERY] = "kv-recovery",
};

/* One NATS subject token: not empty, none of . * > or white space. */
static bool token_ok(const char *s) {
    if (!s || !*s) return false;
    for (; *s; s++)
        if (*s == '.' || *s == '*' || *s == '>' || *s <= ' ') return false;
    return true;
}

kvo_status wire_subject(char *out, size_t n, const char *ns,
                        const char *component, wire_subject_kind kind,
                        uint64_t publisher_id) {
    if (!token_ok(ns) || !token_ok(component) ||
        (unsigned)kind >= KVO_ARRAY_LEN(subject_suffix))
        return KVO_EINVAL;
    int k = kind == WIRE_SUBJ_RECOVERY
                ? snprintf(out, n, "namespace.%s.component.%s.%s.%" PRIu64, ns,
                           component, subject_suffix[kind], publisher_id)
                : snprintf(out, n, "namespace.%s.component.%s.%s", ns,
                           component, subject_suffix[kind]);
    return k < 0 || (size_t)k >= n ? KVO_ETOOBIG : KVO_OK;
}

/* ---- writing ---------------------------------------------------------------*/

/* A JSON string of s, which must need no escaping (subjects do not). */
static kvo_status put_plain_str(kvo_buf *b, const char *s) {
    for (const char *c = s; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            return KVO_EINVAL;
    return kvo_buf_printf(b, "\"%s\"", s);
}

static kvo_status put_opt_u64(kvo_buf *b, bool has, uint64_t v) {
    return has ? kvo_buf_printf(b, "%" PRIu64, v) : kvo_buf_printf(b, "null");
}

kvo_status wire_announce_encode(const wire_announce *a, kvo_buf *out) {
    if (a->n_ranks > WIRE_ANNOUNCE_MAX_RANKS) return KVO_EINVAL;
    kvo_status st = kvo_buf_printf(out,
                                   "{\"publisher_id\":%" PRIu64
                                   ",\"worker_id\":%" PRIu64 ",\"dp_ranks\":[",
                                   a->publisher_id, a->worker_id);
    for (uint32_t i = 0; i < a->n_ranks && st == KVO_OK; i++)
        st = kvo_buf_printf(out, "%s%" PRIu64, i ? "," : "", a->ranks[i]);
    if (st == KVO_OK) st = kvo_buf_printf(out, "],\"recovery_subject\":");
    if (st == KVO_OK) st = put_plain_str(out, a->recovery_subject);
    if (st == KVO_OK) st = kvo_buf_printf(out, ",\"last_sequence\":");
    if (st == KVO_OK) st = put_opt_u64(out, a->has_last, a->last_sequence);
    if (st == KVO_OK)
        st = kvo_buf_printf(
            out, ",\"started_at\":%" PRIu64 ",\"heartbeat_ms\":%" PRIu32 "}",
            a->started_at_ms, a->heartbeat_ms);
    return st;
}

kvo_status wire_recovery_req_encode(const wire_recovery_req *r, kvo_buf *out) {
    return r->dump ? kvo_buf_printf(out, "{\"dump\":true}")
                   : kvo_buf_printf(out, "{\"from_sequence\":%" PRIu64 "}",
                                    r->from_sequence);
}

static const char *const reply_names[] = {
    [WIRE_REPLY_EVENTS] = "events",
    [WIRE_REPLY_DUMP] = "dump",
    [WIRE_REPLY_END] = "end",
    [WIRE_REPLY_TOO_NEW] = "too_new",
};

const char *wire_reply_kind_name(wire_reply_kind k) {
    return (unsigned)k < KVO_ARRAY_LEN(reply_names) ? reply_names[k] : "?";
}

kvo_status wire_reply_kind_parse(const char *s, wire_reply_kind *out) {
    for (size_t i = 0; s && i < KVO_ARRAY_LEN(reply_names); i++)
        if (strcmp(s, reply_names[i]) == 0) {
            *out = (wire_reply_kind)i;
            return KVO_OK;
        }
    return KVO_EPROTO;
}

kvo_status wire_reply_end_encode(wire_reply_kind what, const wire_reply_end *e,
                                 kvo_buf *out) {
    if (what == WIRE_REPLY_TOO_NEW) {
        kvo_status st = kvo_buf_printf(out, "{\"last_sequence\":");
        if (st == KVO_OK) st = put_opt_u64(out, e->has_as_of, e->as_of);
        return st == KVO_OK ? kvo_buf_printf(out, "}") : st;
    }
    if (what != WIRE_REPLY_END ||
        (e->kind != WIRE_REPLY_EVENTS && e->kind != WIRE_REPLY_DUMP))
        return KVO_EINVAL;
    kvo_status st =
        kvo_buf_printf(out, "{\"kind\":\"%s\",\"sent\":%" PRIu64 ",\"as_of\":",
                       reply_names[e->kind], e->sent);
    if (st == KVO_OK) st = put_opt_u64(out, e->has_as_of, e->as_of);
    if (st == KVO_OK)
        st = kvo_buf_printf(out, ",\"blocks\":%" PRIu64 "}", e->blocks);
    return st;
}

/* ---- reading ---------------------------------------------------------------*/

static kvo_status bad_field(kvo_err *err, const char *name, const char *want) {
    return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                       "\"%s\": expected %s", name, want);
}

/* The body as one JSON object, into *o. */
static kvo_status object_of(kvo_json *doc, const void *body, size_t len,
                            const kvo_jv **o, kvo_err *err) {
    kvo_status st = kvo_json_parse(doc, body, len, NULL, err);
    if (st != KVO_OK) return st;
    if (!kvo_json_is(doc->root, KVO_JSON_OBJ))
        return kvo_err_set(err, KVO_EPROTO, 0, "expected a JSON object");
    *o = doc->root;
    return KVO_OK;
}

static kvo_status need_u64(const kvo_jv *o, const char *name, uint64_t *v,
                           kvo_err *err) {
    return kvo_json_u64(kvo_json_get(o, name), v)
               ? KVO_OK
               : bad_field(err, name, "an integer >= 0");
}

/* An integer or null (absent counts as null). */
static kvo_status opt_u64(const kvo_jv *o, const char *name, bool *has,
                          uint64_t *v, kvo_err *err) {
    const kvo_jv *j = kvo_json_get(o, name);
    *has = j && !kvo_json_is(j, KVO_JSON_NULL);
    if (*has && !kvo_json_u64(j, v))
        return bad_field(err, name, "an integer >= 0 or null");
    return KVO_OK;
}

kvo_status wire_announce_decode(kvo_json *doc, const void *body, size_t len,
                                wire_announce *a, kvo_err *err) {
    const kvo_jv *o = NULL; /* set by object_of when it succeeds */
    kvo_status st = object_of(doc, body, len, &o, err);
    if (st != KVO_OK) return st;
    wire_announce v = {0};
    uint64_t hb;
    if ((st = need_u64(o, "publisher_id", &v.publisher_id, err)) != KVO_OK ||
        (st = need_u64(o, "worker_id", &v.worker_id, err)) != KVO_OK ||
        (st = opt_u64(o, "last_sequence", &v.has_last, &v.last_sequence,
                      err)) != KVO_OK ||
        (st = need_u64(o, "started_at", &v.started_at_ms, err)) != KVO_OK ||
        (st = need_u64(o, "heartbeat_ms", &hb, err)) != KVO_OK)
        return st;
    if (hb > UINT32_MAX) return bad_field(err, "heartbeat_ms", "< 2^32");
    v.heartbeat_ms = (uint32_t)hb;
    size_t n;
    kvo_err e2;
    if (kvo_json_u64s(kvo_json_get(o, "dp_ranks"), &v.ranks, &n, &e2) != KVO_OK)
        return bad_field(err, "dp_ranks", "an array of integers >= 0");
    if (n > WIRE_ANNOUNCE_MAX_RANKS)
        return kvo_err_set(err, KVO_ETOOBIG, KVO_ERR_NO_OFFSET,
                           "\"dp_ranks\": more than %d",
                           WIRE_ANNOUNCE_MAX_RANKS);
    for (size_t i = 0; i < n; i++)
        if (v.ranks[i] > UINT32_MAX)
            return bad_field(err, "dp_ranks", "ranks < 2^32");
    v.n_ranks = (uint32_t)n;
    v.recovery_subject =
        kvo_json_str(kvo_json_get(o, "recovery_subject"), NULL);
    if (!v.recovery_subject || !*v.recovery_subject)
        return bad_field(err, "recovery_subject", "a subject");
    *a = v;
    return KVO_OK;
}

kvo_status wire_recovery_req_decode(kvo_json *doc, const void *body, size_t len,
                                    wire_recovery_req *r, kvo_err *err) {
    const kvo_jv *o = NULL; /* set by object_of when it succeeds */
    kvo_status st = object_of(doc, body, len, &o, err);
    if (st != KVO_OK) return st;
    const kvo_jv *d = kvo_json_get(o, "dump");
    bool dump = false;
    if (d && !kvo_json_bool(d, &dump))
        return bad_field(err, "dump", "true or false");
    wire_recovery_req v = {.dump = dump};
    if (!dump &&
        (st = need_u64(o, "from_sequence", &v.from_sequence, err)) != KVO_OK)
        return st;
    *r = v;
    return KVO_OK;
}

kvo_status wire_reply_end_decode(kvo_json *doc, wire_reply_kind what,
                                 const void *body, size_t len,
                                 wire_reply_end *e, kvo_err *err) {
    const kvo_jv *o = NULL; /* set by object_of when it succeeds */
    kvo_status st = object_of(doc, body, len, &o, err);
    if (st != KVO_OK) return st;
    wire_reply_end v = {.kind = what};
    if (what == WIRE_REPLY_TOO_NEW) {
        st = opt_u64(o, "last_sequence", &v.has_as_of, &v.as_of, err);
        if (st == KVO_OK) *e = v;
        return st;
    }
    if (what != WIRE_REPLY_END) return KVO_EINVAL;
    const char *kind = kvo_json_str(kvo_json_get(o, "kind"), NULL);
    if (wire_reply_kind_parse(kind, &v.kind) != KVO_OK ||
        (v.kind != WIRE_REPLY_EVENTS && v.kind != WIRE_REPLY_DUMP))
        return bad_field(err, "kind", "\"events\" or \"dump\"");
    if ((st = need_u64(o, "sent", &v.sent, err)) != KVO_OK ||
        (st = opt_u64(o, "as_of", &v.has_as_of, &v.as_of, err)) != KVO_OK)
        return st;
    const kvo_jv *b = kvo_json_get(o, "blocks");
    if (b && !kvo_json_u64(b, &v.blocks))
        return bad_field(err, "blocks", "an integer >= 0");
    *e = v;
    return KVO_OK;
}
