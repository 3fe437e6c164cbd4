/* kvo-indexer: the radix index as a service (NATS in, HTTP out), or offline
 * over a capture file (replay). */
#include "idx.h"
#include "kvo_nats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Long-option codes, above every short option's character. */
enum {
    OPT_SUBJECT = 256,
    OPT_HTTP,
    OPT_BLOCK_SIZE,
    OPT_LOG_LEVEL,
    OPT_MAX_PUBLISHERS,
    OPT_PUBLISHER_IDLE_MS,
    OPT_MAX_BODY,
    OPT_NO_RECOVERY,
    OPT_RECOVERY_TIMEOUT_MS,
    OPT_DISCOVER_MS,
    OPT_APPLY_BUDGET_US,
    OPT_DYNAMO_HTTP,
    OPT_DYNAMO_MAX_LISTENERS,
};

#define BLOCK_SIZE_MAX (1u << 20) /* largest --block-size accepted */
#define MAX_PUBLISHERS_MAX                                                     \
    (1u << 20)                    /* largest --max-publishers (4 KiB each) */
#define MAX_BODY_MAX (1ull << 30) /* largest --max-body */
#define TIMEOUT_MS_MAX                                                         \
    3600000u                   /* largest --recovery-timeout-ms and
                                     --discover-ms: an hour */
#define BUDGET_US_MAX 1000000u /* largest --apply-budget-us */
#define LISTENERS_MAX 65536u   /* largest --dynamo-max-listeners */

static const struct option options[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    KVO_NATS_OPTIONS,
    {"subject", required_argument, NULL, OPT_SUBJECT},
    {"http", required_argument, NULL, OPT_HTTP},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"max-publishers", required_argument, NULL, OPT_MAX_PUBLISHERS},
    {"publisher-idle-ms", required_argument, NULL, OPT_PUBLISHER_IDLE_MS},
    {"max-body", required_argument, NULL, OPT_MAX_BODY},
    {"no-recovery", no_argument, NULL, OPT_NO_RECOVERY},
    {"recovery-timeout-ms", required_argument, NULL, OPT_RECOVERY_TIMEOUT_MS},
    {"discover-ms", required_argument, NULL, OPT_DISCOVER_MS},
    {"apply-budget-us", required_argument, NULL, OPT_APPLY_BUDGET_US},
    {"dynamo-http", required_argument, NULL, OPT_DYNAMO_HTTP},
    {"dynamo-max-listeners", required_argument, NULL, OPT_DYNAMO_MAX_LISTENERS},
    {NULL, 0, NULL, 0}};

static const char usage[] =
    "usage: kvo-indexer [options]\n"
    "       kvo-indexer replay EVENTS [QUERIES] [--block-size N]\n"
    "\n"
    "A radix index of KV-cache blocks per worker with the semantics of\n"
    "Dynamo's radix tree, fed by the event plane (NATS) and answering\n"
    "per-prompt hit queries over HTTP.\n"
    "\n"
    "Service:\n" KVO_NATS_USAGE
    "  --subject S             (default namespace.*.component.*.kv-events)\n"
    "  --http HOST:PORT        HTTP API (default 127.0.0.1:8090; port 0 picks\n"
    "                          one, logged as 'listening on "
    "http://HOST:PORT')\n"
    "  --block-size N          tokens per block for token queries (default "
    "16)\n"
    "  --log-level L           error|warn|info|debug (default info)\n"
    "  --max-publishers N      publishers whose sequences are tracked "
    "(default\n"
    "                          4096); beyond, messages still apply, "
    "untracked,\n"
    "                          and are counted (publishers_refused)\n"
    "  --publisher-idle-ms T   forget a publisher's sequence state after T ms\n"
    "                          without a message (default 600000; 0 = never);\n"
    "                          its blocks stay indexed\n"
    "  --max-body BYTES        largest request body (default 16777216)\n"
    "  --no-recovery           never ask relays for what was missed (count\n"
    "                          gaps only), for publishers that do not speak\n"
    "                          docs/recovery.md (a plain Dynamo publisher)\n"
    "  --recovery-timeout-ms T a relay silent for T ms in the middle of an\n"
    "                          answer has failed: its workers are cleared and\n"
    "                          marked stale (default 5000)\n"
    "  --discover-ms T         how long /health says recovering at start,\n"
    "                          while relays answer the discover request\n"
    "                          (default 500)\n"
    "  --apply-budget-us T     apply for at most T us before serving HTTP\n"
    "                          again (sooner when a request waits), between\n"
    "                          two events of an envelope too (default 500)\n"
    "  --dynamo-http HOST:PORT also serve Dynamo's standalone-indexer API\n"
    "                          there (port 0 picks one, logged as 'dynamo API\n"
    "                          listening on http://HOST:PORT'): POST "
    "/register\n"
    "                          consumes that engine's ZMQ events in-process\n"
    "                          (the relay's pipeline, no kvo-relay needed),\n"
    "                          /unregister, GET /workers, POST /query,\n"
    "                          /query_by_hash, GET /dump /health /metrics\n"
    "  --dynamo-max-listeners N  (engine, dp_rank)s registered at once\n"
    "                          (default 256; beyond, /register is 503)\n"
    "HTTP: POST /query {\"token_ids\": [...], \"lora_name\"?, "
    "\"cache_salt\"?},\n"
    "  POST /query_by_hash {\"tokens_hashes\": [...]} -> {\"isl_blocks\", "
    "\"scores\":\n"
    "  [{\"worker_id\", \"dp_rank\", \"blocks\"}]} (strict JSON: exact "
    "integers,\n"
    "  valid UTF-8, one value); GET /workers /health /metrics /counters;\n"
    "  GET /watermark[?after=ID&limit=N] (pages of at most 1000 publishers,\n"
    "  \"next\" when more follow); GET /dump (at most 10000 events) or\n"
    "  /dump?after=K&limit=N -> {\"events\", \"next\"};\n"
    "  GET /blocks?worker_id=W&dp_rank=R[&after=H&limit=N][&digest_only=1]\n"
    "  -> {\"worker_id\", \"dp_rank\", \"count\", \"digest\", \"blocks\":\n"
    "  [[hash, parent|null]], \"next\"} (sorted; pages of at most 100000);\n"
    "  POST /lookup {\"worker_id\", \"dp_rank\", \"block_hashes\": [...]}\n"
    "  (at most 4096) -> {\"blocks\": [{\"block_hash\", \"held\",\n"
    "  \"tokens_hash\", \"parent_hash\", \"in_set\", \"others\",\n"
    "  \"other_holders\"}]}.\n"
    "\n"
    "Replay: EVENTS is a capture file of event-plane messages; QUERIES is "
    "JSON\n"
    "  lines ({\"apply\": K} | {\"token_ids\": [...]} | {\"tokens_hashes\": "
    "[...]});\n"
    "  prints one line per query, then {\"counters\", \"workers\", "
    "\"pairs\"}.\n"
    "\n"
    "  -h, --help              this text\n"
    "  -V, --version           print the version\n"
    "Every option also reads KVO_<NAME> from the environment.\n"
    "Exit: 0 ok, 1 input failed (replay: unreadable or damaged capture, bad\n"
    "query line), 2 usage or setup error.\n";

typedef struct opts {
    idx_service_cfg cfg; /* cfg.nats points at nats */
    kvo_nats_cfg nats;
    kvo_level level;
    bool help, version;
} opts;

static kvo_status bad(const char *opt, const char *arg) {
    fprintf(stderr, "kvo-indexer: bad value for --%s: '%s'\n", opt,
            arg ? arg : "");
    return KVO_EINVAL;
}

static kvo_status set_opt(void *ctx, int code, const char *arg) {
    opts *o = ctx;
    idx_service_cfg *c = &o->cfg;
    int r = kvo_nats_opt_set(&o->nats, code, arg);
    if (r != KVO_NATS_OPT_OTHER)
        return r == KVO_NATS_OPT_OK ? KVO_OK
                                    : bad(kvo_nats_opt_name(code), arg);
    switch (code) {
    case 'h': o->help = true; return KVO_OK;
    case 'V': o->version = true; return KVO_OK;
    case OPT_SUBJECT:
        if (!*arg) return bad("subject", arg);
        c->subject = arg;
        return KVO_OK;
    case OPT_HTTP: c->http = arg; return KVO_OK;
    case OPT_BLOCK_SIZE:
        if (kvo_parse_u32(arg, &c->block_size) || c->block_size == 0 ||
            c->block_size > BLOCK_SIZE_MAX)
            return bad("block-size", arg);
        return KVO_OK;
    case OPT_LOG_LEVEL:
        return kvo_log_level_parse(arg, &o->level) ? bad("log-level", arg)
                                                   : KVO_OK;
    case OPT_MAX_PUBLISHERS:
        if (kvo_parse_u32(arg, &c->feed.max_publishers) ||
            c->feed.max_publishers == 0 ||
            c->feed.max_publishers > MAX_PUBLISHERS_MAX)
            return bad("max-publishers", arg);
        return KVO_OK;
    case OPT_PUBLISHER_IDLE_MS:
        return kvo_parse_u64(arg, &c->feed.publisher_idle_ms)
                   ? bad("publisher-idle-ms", arg)
                   : KVO_OK;
    case OPT_NO_RECOVERY: c->no_recovery = true; return KVO_OK;
    case OPT_RECOVERY_TIMEOUT_MS:
        if (kvo_parse_u64(arg, &c->feed.recovery_timeout_ms) ||
            c->feed.recovery_timeout_ms == 0 ||
            c->feed.recovery_timeout_ms > TIMEOUT_MS_MAX)
            return bad("recovery-timeout-ms", arg);
        return KVO_OK;
    case OPT_DISCOVER_MS:
        if (kvo_parse_u64(arg, &c->discover_ms) ||
            c->discover_ms > TIMEOUT_MS_MAX)
            return bad("discover-ms", arg);
        return KVO_OK;
    case OPT_APPLY_BUDGET_US:
        if (kvo_parse_u32(arg, &c->apply_budget_us) ||
            c->apply_budget_us == 0 || c->apply_budget_us > BUDGET_US_MAX)
            return bad("apply-budget-us", arg);
        return KVO_OK;
    case OPT_DYNAMO_HTTP: c->dynamo_http = arg; return KVO_OK;
    case OPT_DYNAMO_MAX_LISTENERS:
        if (kvo_parse_u32(arg, &c->dynamo_max_listeners) ||
            c->dynamo_max_listeners == 0 ||
            c->dynamo_max_listeners > LISTENERS_MAX)
            return bad("dynamo-max-listeners", arg);
        return KVO_OK;
    case OPT_MAX_BODY: {
        uint64_t v;
        if (kvo_parse_u64(arg, &v) || v == 0 || v > MAX_BODY_MAX)
            return bad("max-body", arg);
        c->max_body = (size_t)v;
        return KVO_OK;
    }
    default: return KVO_EINVAL;
    }
}

/* kvo_getopt stops at the first operand; the replay contract puts options
 * after EVENTS [QUERIES], so move options (and their values) first. */
static void options_first(int argc, char **argv, const struct option *table) {
    char **sorted = kvo_calloc((size_t)argc + 1, sizeof(char *));
    if (!sorted) return;
    int k = 1, n = 1;
    sorted[0] = argv[0];
    for (int pass = 0; pass < 2; pass++)
        for (int i = 1; i < argc; i++) {
            bool opt = argv[i][0] == '-' && argv[i][1] != '\0';
            bool takes = false;
            if (opt && argv[i][1] == '-' && !strchr(argv[i], '=')) {
                for (const struct option *o = table; o->name; o++)
                    if (strcmp(argv[i] + 2, o->name) == 0)
                        takes = o->has_arg == required_argument;
            }
            if (pass == 0 && opt) {
                sorted[k++] = argv[i];
                if (takes && i + 1 < argc) sorted[k++] = argv[++i];
            } else if (pass == 1) {
                if (opt) {
                    i += takes;
                    continue;
                }
                sorted[k++] = argv[i];
            }
            n = k;
        }
    memcpy(argv, sorted, (size_t)n * sizeof(char *));
    kvo_free(sorted);
}

/* Defaults, then the options of `table` into o: -1 to go on with the
 * operands from *first, or the exit code (usage error, --help, --version). */
static int opts_parse(int argc, char **argv, const struct option *table,
                      opts *o, int *first) {
    memset(o, 0, sizeof(*o));
    idx_service_cfg_default(&o->cfg);
    kvo_nats_cfg_default(&o->nats);
    o->cfg.nats = &o->nats;
    o->level = KVO_LOG_INFO;
    *first = kvo_getopt(argc, argv, table, set_opt, o);
    if (*first < 0) {
        fputs("kvo-indexer: see --help\n", stderr);
        return KVO_EXIT_USAGE;
    }
    if (o->help) {
        fputs(usage, stdout);
        return KVO_EXIT_OK;
    }
    if (o->version) {
        printf("kvo-indexer %s\n", KVO_VERSION);
        return KVO_EXIT_OK;
    }
    return -1;
}

static int run_replay(int argc, char **argv) {
    static const struct option ropts[] = {
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
        {NULL, 0, NULL, 0}};
    options_first(argc, argv, ropts);
    opts o;
    int idx, exit_code = opts_parse(argc, argv, ropts, &o, &idx);
    if (exit_code >= 0) return exit_code;
    if (argc - idx < 1 || argc - idx > 2) {
        fputs("kvo-indexer: replay takes EVENTS [QUERIES]; see --help\n",
              stderr);
        return KVO_EXIT_USAGE;
    }
    idx_replay_cfg rc = {argv[idx], argc - idx == 2 ? argv[idx + 1] : NULL,
                         o.cfg.block_size};
    char err[512];
    kvo_status st = idx_replay_run(&rc, stdout, err, sizeof(err));
    if (st == KVO_OK) return KVO_EXIT_OK;
    fprintf(stderr, "kvo-indexer: %s\n", err[0] ? err : kvo_strerror(st));
    return st == KVO_ENOMEM ? KVO_EXIT_USAGE : KVO_EXIT_FAIL;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "replay") == 0)
        return run_replay(argc - 1, argv + 1);
    opts o;
    int idx, exit_code = opts_parse(argc, argv, options, &o, &idx);
    if (exit_code >= 0) return exit_code;
    if (idx < argc) {
        fprintf(stderr, "kvo-indexer: unexpected argument '%s'\n", argv[idx]);
        return KVO_EXIT_USAGE;
    }
    char err[256];
    if (kvo_nats_cfg_check(&o.nats, err, sizeof(err)) != KVO_OK) {
        fprintf(stderr, "kvo-indexer: %s\n", err);
        return KVO_EXIT_USAGE;
    }
    kvo_log_init("kvo-indexer", o.level);
    kvo_signals_init();
    const idx_service_cfg *c = &o.cfg;
    kvo_info("kvo-indexer %s: nats=%s subject=%s http=%s block_size=%u "
             "auth=%s tls=%s reconnect_wait_ms=%d max_publishers=%u "
             "publisher_idle_ms=%llu max_body=%zu recovery=%s "
             "recovery_timeout_ms=%llu discover_ms=%llu apply_budget_us=%u "
             "dynamo_http=%s dynamo_max_listeners=%u",
             KVO_VERSION, o.nats.url, c->subject, c->http, c->block_size,
             kvo_nats_cfg_auth(&o.nats), kvo_nats_cfg_tls(&o.nats),
             o.nats.reconnect_wait_ms, c->feed.max_publishers,
             (unsigned long long)c->feed.publisher_idle_ms, c->max_body,
             c->no_recovery ? "off" : "on",
             (unsigned long long)c->feed.recovery_timeout_ms,
             (unsigned long long)c->discover_ms, c->apply_budget_us,
             c->dynamo_http ? c->dynamo_http : "-", c->dynamo_max_listeners);
    kvo_status st = idx_service_run(&o.cfg);
    kvo_nats_shutdown();
    if (st == KVO_OK) return KVO_EXIT_OK;
    fprintf(stderr, "kvo-indexer: %s\n", kvo_strerror(st));
    return KVO_EXIT_USAGE;
}
