/* relay_stats.c -- the relay's counters as JSON, Prometheus text (written
 * by base's kvo_prom) and one log line. Names come from the X-macro tables
 * in relay_int.h, so the three views never drift. */
#include "kvo_prom.h"
#include "relay_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define KIND_NAME(name, help) #name,
static const char *const bad_names[] = {RELAY_BAD_MSG_KINDS(KIND_NAME)};
static const char *const reject_names[] = {RELAY_REJECT_KINDS(KIND_NAME)};
static const char *const fail_names[] = {RELAY_REPLAY_FAIL_KINDS(KIND_NAME)};
static const char *const recovery_names[] = {RELAY_RECOVERY_KINDS(KIND_NAME)};
#undef KIND_NAME

static json_object *u64(uint64_t v) { return json_object_new_uint64(v); }

static json_object *kinds(const uint64_t *v, const char *const *names, int n) {
    json_object *o = json_object_new_object();
    for (int i = 0; i < n; i++) json_object_object_add(o, names[i], u64(v[i]));
    return o;
}

static json_object *hex(const uint8_t *b, size_t n) {
    char s[2 * RELAY_MISMATCH_BYTES + 1];
    if (n > RELAY_MISMATCH_BYTES) n = RELAY_MISMATCH_BYTES;
    for (size_t i = 0; i < n; i++) snprintf(s + 2 * i, 3, "%02x", b[i]);
    s[2 * n] = '\0';
    return json_object_new_string(s);
}

json_object *relay_stats_to_json(const relay_stats *s) {
    json_object *o = json_object_new_object();
#define ADD(name, help) json_object_object_add(o, #name, u64(s->name));
    RELAY_COUNTERS(ADD)
#undef ADD
    json_object_object_add(o, "bad_msgs",
                           kinds(s->bad_msgs, bad_names, RELAY_BAD_MSG_COUNT));
    json_object *de = json_object_new_object();
    for (int i = 0; i < KVO_STATUS_COUNT; i++)
        if (i != KVO_OK)
            json_object_object_add(de, kvo_status_name((kvo_status)i),
                                   u64(s->decode_errors[i]));
    json_object_object_add(o, "decode_errors", de);
    json_object_object_add(o, "decode_errors_total",
                           u64(relay_stats_decode_errors(s)));
    json_object_object_add(o, "rejects",
                           kinds(s->rejects, reject_names, RELAY_REJECT_COUNT));
    json_object_object_add(o, "rejects_total", u64(relay_stats_rejects(s)));
    json_object_object_add(
        o, "replay_failures",
        kinds(s->replay_failures, fail_names, RELAY_REPLAY_FAIL_COUNT));
    json_object_object_add(o, "replay_failures_total",
                           u64(relay_stats_replay_failures(s)));
    json_object_object_add(
        o, "recovery_requests",
        kinds(s->recovery_requests, recovery_names, RELAY_RECOVERY_COUNT));
    json_object_object_add(o, "recovery_requests_total",
                           u64(relay_stats_recovery_requests(s)));
#define ADD(name, help) json_object_object_add(o, #name, u64(s->name));
    RELAY_GAUGES(ADD)
#undef ADD
    json_object_object_add(o, "buffer_depth", u64(s->buffer_depth));
    json_object_object_add(o, "nats_buffered", u64(s->nats_buffered));
    json_object_object_add(o, "nats_buffered_total",
                           u64(s->nats_buffered_total));
    json_object_object_add(o, "nats_connected",
                           json_object_new_boolean(s->nats_connected));
    json_object *fm = NULL;
    if (s->has_mismatch) {
        const relay_mismatch *m = &s->first_mismatch;
        fm = json_object_new_object();
        json_object_object_add(fm, "seq", u64(m->seq));
        json_object_object_add(fm, "event", u64(m->event));
        json_object_object_add(fm, "block", u64(m->block));
        json_object_object_add(fm, "expected",
                               hex(m->expected.b, m->expected.len));
        json_object_object_add(fm, "expected_low64",
                               u64(wire_digest_low64(&m->expected)));
        if (m->got.kind == WIRE_HASH_BYTES)
            json_object_object_add(fm, "got", hex(m->got_bytes, m->got.len));
        else
            json_object_object_add(fm, "got", u64(m->got.key));
    }
    json_object_object_add(o, "first_mismatch", fm);
    return o;
}

void relay_src_stats_to_json(const relay_src_stats *s, json_object *o) {
#define ADD(name, help) json_object_object_add(o, #name, u64(s->name));
    RELAY_SOURCE_COUNTERS(ADD)
#undef ADD
}

/* A counter family with one sample per kind (label kind="<name>"). */
static void by_kind(kvo_prom *p, const char *name, const char *help,
                    const uint64_t *v, const char *const *names, int n) {
    kvo_prom_family(p, name, "counter", help);
    for (int i = 0; i < n; i++)
        kvo_prom_u64(p, name, v[i], "kind=\"%s\"", names[i]);
}

kvo_status relay_stats_to_prom(const relay_stats *s, kvo_buf *out) {
    kvo_prom p;
    kvo_prom_init(&p, out, "kvo_relay_");
#define PROM(name, help) kvo_prom_counter(&p, #name "_total", help, s->name);
    RELAY_COUNTERS(PROM)
#undef PROM
    by_kind(&p, "bad_messages_total", "messages skipped by kind", s->bad_msgs,
            bad_names, RELAY_BAD_MSG_COUNT);
    kvo_prom_family(&p, "decode_errors_total", "counter",
                    "undecodable batches by status");
    for (int i = KVO_OK + 1; i < KVO_STATUS_COUNT; i++)
        kvo_prom_u64(&p, "decode_errors_total", s->decode_errors[i],
                     "kind=\"%s\"", kvo_status_name((kvo_status)i));
    by_kind(&p, "rejects_total", "events rejected by kind", s->rejects,
            reject_names, RELAY_REJECT_COUNT);
    by_kind(&p, "replay_failures_total",
            "gaps the replay could not cover, by kind", s->replay_failures,
            fail_names, RELAY_REPLAY_FAIL_COUNT);
    by_kind(&p, "recovery_requests_total",
            "recovery requests answered, by what answered them",
            s->recovery_requests, recovery_names, RELAY_RECOVERY_COUNT);
    uint32_t nsrc = s->n_src < RELAY_MAX_SOURCES ? s->n_src : RELAY_MAX_SOURCES;
#define PROM(name, help)                                                       \
    kvo_prom_family(&p, "source_" #name "_total", "counter", help);            \
    for (uint32_t i = 0; i < nsrc; i++)                                        \
        kvo_prom_u64(&p, "source_" #name "_total", s->src[i].name,             \
                     "source=\"%u\"", i);
    RELAY_SOURCE_COUNTERS(PROM)
#undef PROM
    kvo_prom_gauge(&p, "buffer_depth", "live batches waiting for a replay",
                   s->buffer_depth);
    kvo_prom_gauge(&p, "nats_buffered",
                   "messages held in the NATS reconnect buffer",
                   s->nats_buffered);
    kvo_prom_counter(&p, "nats_buffered_total",
                     "messages that went through the reconnect buffer",
                     s->nats_buffered_total);
    kvo_prom_gauge(&p, "nats_connected", "1 when NATS is up",
                   s->nats_connected ? 1 : 0);
#define PROM(name, help) kvo_prom_gauge(&p, #name, help, s->name);
    RELAY_GAUGES(PROM)
#undef PROM
    return kvo_prom_status(&p);
}

void relay_stats_line(const relay_stats *s, char *buf, size_t n) {
    snprintf(buf, n,
             "batches=%" PRIu64 " stored=%" PRIu64 " removed=%" PRIu64
             " cleared=%" PRIu64 " blocks=%" PRIu64 " decode_errors=%" PRIu64
             " rejects=%" PRIu64 " gaps=%" PRIu64 " replays=%" PRIu64
             "/%" PRIu64 " replay_failures=%" PRIu64 " restarts=%" PRIu64
             " dups=%" PRIu64 " dedup=%" PRIu64 " removes_unknown=%" PRIu64
             " msgs=%" PRIu64 " bytes=%" PRIu64 " dropped=%" PRIu64
             " reconnects=%" PRIu64 " live_buffered=%" PRIu64
             " nats_buffered=%" PRIu64 " hash_mismatches=%" PRIu64
             " zmq_disconnects=%" PRIu64 " oversize=%" PRIu64
             " recoveries=%" PRIu64 " dumps=%" PRIu64 " state_blocks=%" PRIu64,
             s->batches_applied, s->events_stored, s->events_removed,
             s->events_cleared, s->blocks_stored, relay_stats_decode_errors(s),
             relay_stats_rejects(s), s->gaps, s->replays_completed,
             s->replays_requested, relay_stats_replay_failures(s), s->restarts,
             s->duplicates_dropped, s->dedup_suppressed, s->removes_unknown,
             s->messages_published, s->bytes_published, s->publish_dropped,
             s->nats_reconnects, s->buffer_depth, s->nats_buffered,
             s->hash_mismatches, s->zmq_disconnects, s->oversize,
             relay_stats_recovery_requests(s), s->dumps_sent, s->state_blocks);
}
