/* kvo-relay: vLLM KV events (ZeroMQ) -> Dynamo's event plane (NATS). */
#include "relay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    OPT_ZMQ = 256,
    OPT_ZMQ_BIND,
    OPT_TOPIC,
    OPT_REPLAY,
    OPT_DISCOVER,
    OPT_DP_RANK,
    OPT_ZMQ_HWM,
    OPT_ZMQ_MAX,
    OPT_LINGER,
    OPT_NATS_BUFFER,
    OPT_NS,
    OPT_COMPONENT,
    OPT_WORKER_ID,
    OPT_PUBLISHER_ID,
    OPT_BLOCK_SIZE,
    OPT_REPLAY_FROM,
    OPT_REPLAY_TIMEOUT,
    OPT_REPLAY_BUFFER,
    OPT_VERIFY,
    OPT_HASH_SEED,
    OPT_METRICS,
    OPT_STATS_INTERVAL,
    OPT_STATS_JSON,
    OPT_RECORD,
    OPT_RECORD_WHAT,
    OPT_LOG_LEVEL,
    OPT_RECOVERY_BUFFER,
    OPT_RECOVERY_BUFFER_MB,
    OPT_HEARTBEAT
};

/* --block-size above this is refused: no engine has blocks that large, so
 * a bigger value is a mistake, not a setting. */
#define MAX_BLOCK_SIZE (1u << 20)
/* --replay-timeout-ms above a day is refused (surely a typo). */
#define MAX_REPLAY_TIMEOUT_MS 86400000u
/* --recovery-buffer, --recovery-buffer-mb and --heartbeat-ms above these are
 * refused: more would be a typo, not a setting. */
#define MAX_RECOVERY_BUFFER (1u << 24)
#define MAX_RECOVERY_BUFFER_MB (1u << 16)
#define MAX_HEARTBEAT_MS 3600000u

static const struct option options[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"zmq", required_argument, NULL, OPT_ZMQ},
    {"zmq-bind", no_argument, NULL, OPT_ZMQ_BIND},
    {"topic", required_argument, NULL, OPT_TOPIC},
    {"replay", required_argument, NULL, OPT_REPLAY},
    {"discover", required_argument, NULL, OPT_DISCOVER},
    {"dp-rank", required_argument, NULL, OPT_DP_RANK},
    {"zmq-hwm", required_argument, NULL, OPT_ZMQ_HWM},
    {"zmq-max-msg-bytes", required_argument, NULL, OPT_ZMQ_MAX},
    {"linger-ms", required_argument, NULL, OPT_LINGER},
    KVO_NATS_OPTIONS,
    /* Relay only: nats.c's reconnect buffer holds what a client publishes
     * while disconnected, and the indexer publishes nothing. */
    {"nats-buffer-bytes", required_argument, NULL, OPT_NATS_BUFFER},
    {"namespace", required_argument, NULL, OPT_NS},
    {"component", required_argument, NULL, OPT_COMPONENT},
    {"worker-id", required_argument, NULL, OPT_WORKER_ID},
    {"publisher-id", required_argument, NULL, OPT_PUBLISHER_ID},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"replay-from", required_argument, NULL, OPT_REPLAY_FROM},
    {"replay-timeout-ms", required_argument, NULL, OPT_REPLAY_TIMEOUT},
    {"replay-buffer-batches", required_argument, NULL, OPT_REPLAY_BUFFER},
    {"verify-engine-hash", required_argument, NULL, OPT_VERIFY},
    {"hash-seed", required_argument, NULL, OPT_HASH_SEED},
    {"metrics-listen", required_argument, NULL, OPT_METRICS},
    {"stats-interval-ms", required_argument, NULL, OPT_STATS_INTERVAL},
    {"stats-json", required_argument, NULL, OPT_STATS_JSON},
    {"record", required_argument, NULL, OPT_RECORD},
    {"record-what", required_argument, NULL, OPT_RECORD_WHAT},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"recovery-buffer", required_argument, NULL, OPT_RECOVERY_BUFFER},
    {"recovery-buffer-mb", required_argument, NULL, OPT_RECOVERY_BUFFER_MB},
    {"heartbeat-ms", required_argument, NULL, OPT_HEARTBEAT},
    {NULL, 0, NULL, 0}};

static const char usage[] =
    "usage: kvo-relay (--zmq ENDPOINT [--replay ENDPOINT] | --discover URL)\n"
    "                 [options]\n"
    "\n"
    "Subscribes to a vLLM KV-event publisher (ZeroMQ), checks sequences\n"
    "(replaying gaps), decodes, validates and converts every batch, and\n"
    "publishes Dynamo event-plane envelopes on NATS.\n"
    "\n"
    "Sources:\n"
    "  --zmq ENDPOINT          SUB endpoint (connect), e.g. "
    "tcp://127.0.0.1:5557\n"
    "  --zmq-bind              bind the SUB endpoint instead of connecting\n"
    "  --topic T               topic prefix to subscribe to (default: all)\n"
    "  --replay ENDPOINT       the publisher's replay ROUTER (DEALER "
    "connects)\n"
    "  --discover URL          GET URL/kvo/event_sources, one source per "
    "entry\n"
    "  --dp-rank R             rank for batches without one (default 0)\n"
    "  --zmq-hwm N             ZMQ high-water mark (default 100000)\n"
    "  --zmq-max-msg-bytes N   ZMQ_MAXMSGSIZE (default 67108864; -1 = none);\n"
    "                          a larger batch drops the connection: the relay\n"
    "                          reconnects, counts the batch as oversize (as\n"
    "                          an unreplayable gap without --replay), clears\n"
    "                          the rank and goes on\n"
    "  --linger-ms N           ZMQ_LINGER (default 100)\n"
    "NATS:\n" KVO_NATS_USAGE
    "  --nats-buffer-bytes N   reconnect buffer (default 67108864)\n"
    "Event plane:\n"
    "  --namespace NS          (default dynamo)\n"
    "  --component C           (default backend); subject\n"
    "                          namespace.NS.component.C.kv-events\n"
    "  --worker-id N           (default 0)\n"
    "  --publisher-id N        envelope publisher_id (default random)\n"
    "  --block-size N          engine block size (default 16)\n"
    "Sequences:\n"
    "  --replay-from N         at start: publish cleared, replay from N\n"
    "  --replay-timeout-ms N   give up on a silent replay (default 5000)\n"
    "  --replay-buffer-batches N  live batches held during a replay (100000)\n"
    "Recovery (docs/recovery.md):\n"
    "  --recovery-buffer N     envelopes kept for recovery requests (4096)\n"
    "  --recovery-buffer-mb N  and at most N MiB of them (64); older\n"
    "                          sequences are answered with a dump\n"
    "  --heartbeat-ms N        announce on <p>.kv-relays every N ms (1000)\n"
    "Verification:\n"
    "  --verify-engine-hash ALGO  sha256|sha256_cbor|xxhash|xxhash_cbor\n"
    "  --hash-seed S           the engine's PYTHONHASHSEED (default 0)\n"
    "Observability:\n"
    "  --metrics-listen ADDR   HTTP /metrics /health /stats (default off)\n"
    "  --stats-interval-ms N   periodic stats line (default 10000; 0 = off)\n"
    "  --stats-json FILE       exit stats JSON to FILE (default stdout)\n"
    "  --record FILE           capture what was received and published\n"
    "  --record-what W         zmq|nats|both (default both)\n"
    "  --log-level L           error|warn|info|debug (default info)\n"
    "  -h, --help              this text\n"
    "  -V, --version           print the version\n"
    "\n"
    "Every option also reads KVO_<NAME> from the environment.\n"
    "Exit: 0 clean stop, 1 engine-hash mismatches (with "
    "--verify-engine-hash),\n"
    "2 usage or setup error.\n";

typedef struct opts {
    relay_cfg cfg;
    kvo_level level;
    bool help, version;
} opts;

static kvo_status bad(const char *opt, const char *arg) {
    fprintf(stderr, "kvo-relay: bad value for --%s: '%s'\n", opt,
            arg ? arg : "");
    return KVO_EINVAL;
}

static kvo_status set_opt(void *ctx, int code, const char *arg) {
    opts *o = ctx;
    relay_cfg *c = &o->cfg;
    uint64_t u;
    int64_t i;
    uint32_t u32;
    int r = kvo_nats_opt_set(&c->nats, code, arg);
    if (r != KVO_NATS_OPT_OTHER)
        return r == KVO_NATS_OPT_OK ? KVO_OK
                                    : bad(kvo_nats_opt_name(code), arg);
    switch (code) {
    case 'h': o->help = true; return KVO_OK;
    case 'V': o->version = true; return KVO_OK;
    case OPT_ZMQ: c->zmq = arg; return KVO_OK;
    case OPT_ZMQ_BIND: c->zmq_bind = true; return KVO_OK;
    case OPT_TOPIC: c->topic = arg; return KVO_OK;
    case OPT_REPLAY: c->replay = *arg ? arg : NULL; return KVO_OK;
    case OPT_DISCOVER: c->discover = arg; return KVO_OK;
    case OPT_DP_RANK:
        return kvo_parse_u32(arg, &c->dp_rank) ? bad("dp-rank", arg) : KVO_OK;
    case OPT_ZMQ_HWM:
        if (kvo_parse_u32(arg, &u32) || u32 > INT32_MAX)
            return bad("zmq-hwm", arg);
        c->zmq_hwm = (int)u32;
        return KVO_OK;
    case OPT_ZMQ_MAX:
        if (kvo_parse_i64(arg, &i) || i < -1)
            return bad("zmq-max-msg-bytes", arg);
        c->zmq_max_msg_bytes = i;
        return KVO_OK;
    case OPT_LINGER:
        if (kvo_parse_u32(arg, &u32) || u32 > INT32_MAX)
            return bad("linger-ms", arg);
        c->linger_ms = (int)u32;
        return KVO_OK;
    case OPT_NATS_BUFFER:
        if (kvo_parse_u32(arg, &u32) || u32 > INT32_MAX)
            return bad("nats-buffer-bytes", arg);
        c->nats.buffer_bytes = (int)u32;
        return KVO_OK;
    case OPT_NS: c->ns = arg; return KVO_OK;
    case OPT_COMPONENT: c->component = arg; return KVO_OK;
    case OPT_WORKER_ID:
        return kvo_parse_u64(arg, &c->worker_id) ? bad("worker-id", arg)
                                                 : KVO_OK;
    case OPT_PUBLISHER_ID:
        if (kvo_parse_u64(arg, &c->publisher_id))
            return bad("publisher-id", arg);
        c->publisher_id_set = true;
        return KVO_OK;
    case OPT_BLOCK_SIZE:
        if (kvo_parse_u32(arg, &c->block_size) || c->block_size == 0 ||
            c->block_size > MAX_BLOCK_SIZE)
            return bad("block-size", arg);
        return KVO_OK;
    case OPT_REPLAY_FROM:
        if (kvo_parse_u64(arg, &c->replay_from) || c->replay_from == UINT64_MAX)
            return bad("replay-from", arg);
        c->replay_from_set = true;
        return KVO_OK;
    case OPT_REPLAY_TIMEOUT:
        if (kvo_parse_u64(arg, &u) || u == 0 || u > MAX_REPLAY_TIMEOUT_MS)
            return bad("replay-timeout-ms", arg);
        c->replay_timeout_ms = u;
        return KVO_OK;
    case OPT_REPLAY_BUFFER:
        if (kvo_parse_u32(arg, &c->buffer_max_batches) ||
            c->buffer_max_batches == 0)
            return bad("replay-buffer-batches", arg);
        return KVO_OK;
    case OPT_VERIFY:
        if (wire_algo_parse(arg, &c->verify_algo))
            return bad("verify-engine-hash", arg);
        c->verify = true;
        return KVO_OK;
    case OPT_HASH_SEED: c->hash_seed = arg; return KVO_OK;
    case OPT_METRICS: c->metrics_listen = *arg ? arg : NULL; return KVO_OK;
    case OPT_STATS_INTERVAL:
        return kvo_parse_u64(arg, &c->stats_interval_ms)
                   ? bad("stats-interval-ms", arg)
                   : KVO_OK;
    case OPT_STATS_JSON: c->stats_json = arg; return KVO_OK;
    case OPT_RECORD: c->record = arg; return KVO_OK;
    case OPT_RECORD_WHAT:
        if (strcmp(arg, "both") == 0)
            c->record_what = RELAY_RECORD_BOTH;
        else if (strcmp(arg, "zmq") == 0)
            c->record_what = RELAY_RECORD_ZMQ;
        else if (strcmp(arg, "nats") == 0)
            c->record_what = RELAY_RECORD_NATS;
        else
            return bad("record-what", arg);
        return KVO_OK;
    case OPT_RECOVERY_BUFFER:
        if (kvo_parse_u32(arg, &c->recovery_buffer) ||
            c->recovery_buffer == 0 || c->recovery_buffer > MAX_RECOVERY_BUFFER)
            return bad("recovery-buffer", arg);
        return KVO_OK;
    case OPT_RECOVERY_BUFFER_MB:
        if (kvo_parse_u32(arg, &c->recovery_buffer_mb) ||
            c->recovery_buffer_mb == 0 ||
            c->recovery_buffer_mb > MAX_RECOVERY_BUFFER_MB)
            return bad("recovery-buffer-mb", arg);
        return KVO_OK;
    case OPT_HEARTBEAT:
        if (kvo_parse_u32(arg, &c->heartbeat_ms) || c->heartbeat_ms == 0 ||
            c->heartbeat_ms > MAX_HEARTBEAT_MS)
            return bad("heartbeat-ms", arg);
        return KVO_OK;
    case OPT_LOG_LEVEL:
        return kvo_log_level_parse(arg, &o->level) ? bad("log-level", arg)
                                                   : KVO_OK;
    default: return KVO_EINVAL;
    }
}

int main(int argc, char **argv) {
    opts o;
    memset(&o, 0, sizeof(o));
    relay_cfg_default(&o.cfg);
    o.level = KVO_LOG_INFO;
    int idx = kvo_getopt(argc, argv, options, set_opt, &o);
    if (idx < 0) {
        fputs("kvo-relay: see --help\n", stderr);
        return KVO_EXIT_USAGE;
    }
    if (o.help) {
        fputs(usage, stdout);
        return KVO_EXIT_OK;
    }
    if (o.version) {
        printf("kvo-relay %s\n", KVO_VERSION);
        return KVO_EXIT_OK;
    }
    if (idx < argc) {
        fprintf(stderr, "kvo-relay: unexpected argument '%s'\n", argv[idx]);
        return KVO_EXIT_USAGE;
    }
    if (!o.cfg.zmq == !o.cfg.discover) {
        fputs("kvo-relay: give exactly one of --zmq and --discover\n", stderr);
        return KVO_EXIT_USAGE;
    }
    if (o.cfg.discover && (o.cfg.replay || o.cfg.zmq_bind)) {
        fputs("kvo-relay: --replay and --zmq-bind go with --zmq, not "
              "--discover\n",
              stderr);
        return KVO_EXIT_USAGE;
    }
    char err[256];
    if (kvo_nats_cfg_check(&o.cfg.nats, err, sizeof(err)) != KVO_OK) {
        fprintf(stderr, "kvo-relay: %s\n", err);
        return KVO_EXIT_USAGE;
    }
    kvo_log_init("kvo-relay", o.level);
    kvo_signals_init();
    kvo_status st = relay_run(&o.cfg);
    kvo_nats_shutdown();
    if (st == KVO_OK) return KVO_EXIT_OK;
    if (st == KVO_ECHECK) {
        fputs("kvo-relay: engine-hash mismatches (see first_mismatch)\n",
              stderr);
        return KVO_EXIT_FAIL;
    }
    fprintf(stderr, "kvo-relay: %s\n", kvo_strerror(st));
    return KVO_EXIT_USAGE;
}
