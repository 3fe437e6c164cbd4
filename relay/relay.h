/* relay.h -- kvo-relay: vLLM KV events over ZeroMQ -> Dynamo's event plane
 * over NATS (DESIGN §4, §6, §10). What a program calls to run the service.
 *
 *   ZMQ SUB  [topic][seq][payload] --\                       /--> NATS subject
 *   ZMQ DEALER replay replies -------+--> relay_pipe --------+    (envelope +
 *                                    |  seq/gap/replay state |     RouterEvents,
 *                                    |  decode, validate,    |     KVO-Zmq-Seq)
 *                                    |  convert, dedup, batch|
 *   relay_run: one zmq_poll loop over the sockets and the metrics HTTP fd.
 *
 * The relay is the source of truth for its worker (docs/recovery.md): it
 * keeps its last envelopes and its forwarded state, answers recovery
 * requests on <p>.kv-recovery.<publisher_id>, announces itself on
 * <p>.kv-relays at start and every --heartbeat-ms, and answers discover
 * requests on <p>.kv-relays.discover (<p> = namespace.<ns>.component.<c>).
 *
 * What the service shows (--metrics-listen): GET /metrics (Prometheus,
 * kvo_relay_<counter>_total), GET /stats and the exit JSON (one object:
 * every counter and gauge by name, plus "version", "publisher_id",
 * "worker_id", "subject", "recovery_subject", "started_at" (unix ms),
 * "capture_errors" and "sources": [{"endpoint",
 * "replay_endpoint", "dp_rank", "state": "live"|"replaying", "last_seq":
 * u64|null (last applied), "buffered", "connected": bool (the SUB), and the
 * source's own counters}]), GET /health. The counters are listed once, in
 * relay_int.h's RELAY_COUNTERS and RELAY_SOURCE_COUNTERS tables.
 *
 * The pipeline itself (relay_pipe: frames in, envelopes out, no sockets)
 * and the other internals are in relay_int.h.
 */
#ifndef RELAY_H
#define RELAY_H

#include "kvo.h"
#include "kvo_nats.h"
#include "wire.h"

typedef enum relay_record_what {
    RELAY_RECORD_BOTH = 0,
    RELAY_RECORD_ZMQ,
    RELAY_RECORD_NATS
} relay_record_what;

typedef struct relay_cfg {
    /* sources: --zmq (+ --replay) or --discover */
    const char *zmq;           /* SUB endpoint */
    bool zmq_bind;             /* bind instead of connect */
    const char *topic;         /* subscription prefix; "" = all */
    const char *replay;        /* DEALER endpoint or NULL */
    const char *discover;      /* engine base URL or NULL */
    uint32_t dp_rank;          /* fallback rank (--dp-rank) */
    int zmq_hwm;               /* ZMQ_RCVHWM/SNDHWM */
    int64_t zmq_max_msg_bytes; /* ZMQ_MAXMSGSIZE */
    int linger_ms;             /* ZMQ_LINGER */
    kvo_nats_cfg nats;         /* the --nats* options */
    /* event plane */
    const char *ns, *component;
    uint64_t worker_id;
    bool publisher_id_set;
    uint64_t publisher_id;
    uint32_t block_size;
    /* sequence handling */
    bool replay_from_set;
    uint64_t replay_from;
    uint64_t replay_timeout_ms;
    uint32_t buffer_max_batches;
    /* verification */
    bool verify;
    wire_algo verify_algo;
    const char *hash_seed;
    /* observability */
    const char *metrics_listen; /* host:port or NULL */
    uint64_t stats_interval_ms; /* 0 = no periodic line */
    const char *stats_json;     /* exit JSON file; NULL = stdout */
    const char *record;         /* capture file or NULL */
    relay_record_what record_what;
    /* recovery (docs/recovery.md) */
    uint32_t recovery_buffer;    /* envelopes kept for recovery requests */
    uint32_t recovery_buffer_mb; /* and their bytes, MiB */
    uint32_t heartbeat_ms;       /* between announces */
} relay_cfg;

/* The defaults --help prints. Strings are static. */
void relay_cfg_default(relay_cfg *c);
/* Run until kvo_stop (or a fatal setup error). Writes the exit JSON.
 * KVO_OK on a clean stop; KVO_ECHECK when --verify-engine-hash counted
 * mismatches; setup failures return their status. cfg's strings must last
 * the call. */
kvo_status relay_run(const relay_cfg *cfg);

#endif /* RELAY_H */
