/* kvo-mocker: a mock vLLM engine (block pool, scheduler, KV events over
 * ZeroMQ, OpenAI HTTP API), or a trace replayer with --trace. */
#include "mock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ranks one process runs (--dp-size): each has its own block pool, its
 * publisher and two ports. */
#define MAX_DP_SIZE 64
/* --replay-buffer-mb is in MiB. */
#define MIB (1u << 20)

enum {
    OPT_HOST = 256,
    OPT_PORT,
    OPT_ZMQ_HOST,
    OPT_ZMQ_PORT,
    OPT_ZMQ_ENDPOINT,
    OPT_REPLAY_PORT,
    OPT_NO_REPLAY,
    OPT_ADVERTISE,
    OPT_TOPIC,
    OPT_BLOCK_SIZE,
    OPT_NUM_GPU_BLOCKS,
    OPT_MAX_SEQS,
    OPT_MAX_BATCHED,
    OPT_MAX_MODEL_LEN,
    OPT_DP_SIZE,
    OPT_ROLE,
    OPT_NO_CACHING,
    OPT_CACHING,
    OPT_KV_TRANSFER,
    OPT_HASH_ALGO,
    OPT_HASH_SEED,
    OPT_HASH_BYTES,
    OPT_HASH_MEMO,
    OPT_EVENT_FORMAT,
    OPT_SPEEDUP,
    OPT_SEED,
    OPT_MUTATE,
    OPT_RECORD,
    OPT_TRACE,
    OPT_REPLAY_BUFFER,
    OPT_REPLAY_BUFFER_MB,
    OPT_ZMQ_HWM,
    OPT_REQUIRE_EVENTS,
    OPT_MODEL,
    OPT_NO_PROGRESS,
    OPT_SUMMARY_JSON,
    OPT_LOG_LEVEL,
    OPT_VOCAB_SIZE,
    OPT_LORA_MODULES,
    OPT_CPU_OFFLOAD,
    OPT_KV_GROUPS
};

static const struct option options[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"zmq-host", required_argument, NULL, OPT_ZMQ_HOST},
    {"zmq-port", required_argument, NULL, OPT_ZMQ_PORT},
    {"zmq-endpoint", required_argument, NULL, OPT_ZMQ_ENDPOINT},
    {"replay-port", required_argument, NULL, OPT_REPLAY_PORT},
    {"no-replay", no_argument, NULL, OPT_NO_REPLAY},
    {"advertise-host", required_argument, NULL, OPT_ADVERTISE},
    {"topic", required_argument, NULL, OPT_TOPIC},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"num-gpu-blocks", required_argument, NULL, OPT_NUM_GPU_BLOCKS},
    {"max-num-seqs", required_argument, NULL, OPT_MAX_SEQS},
    {"max-num-batched-tokens", required_argument, NULL, OPT_MAX_BATCHED},
    {"max-model-len", required_argument, NULL, OPT_MAX_MODEL_LEN},
    {"dp-size", required_argument, NULL, OPT_DP_SIZE},
    {"role", required_argument, NULL, OPT_ROLE},
    {"no-enable-prefix-caching", no_argument, NULL, OPT_NO_CACHING},
    {"enable-prefix-caching", no_argument, NULL, OPT_CACHING},
    {"kv-transfer-ms-per-block", required_argument, NULL, OPT_KV_TRANSFER},
    {"hash-algo", required_argument, NULL, OPT_HASH_ALGO},
    {"hash-seed", required_argument, NULL, OPT_HASH_SEED},
    {"hash-bytes", no_argument, NULL, OPT_HASH_BYTES},
    {"hash-memo", required_argument, NULL, OPT_HASH_MEMO},
    {"event-format", required_argument, NULL, OPT_EVENT_FORMAT},
    {"speedup", required_argument, NULL, OPT_SPEEDUP},
    {"seed", required_argument, NULL, OPT_SEED},
    {"vocab-size", required_argument, NULL, OPT_VOCAB_SIZE},
    {"mutate", required_argument, NULL, OPT_MUTATE},
    {"record", required_argument, NULL, OPT_RECORD},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"replay-buffer", required_argument, NULL, OPT_REPLAY_BUFFER},
    {"replay-buffer-mb", required_argument, NULL, OPT_REPLAY_BUFFER_MB},
    {"zmq-hwm", required_argument, NULL, OPT_ZMQ_HWM},
    {"require-events", no_argument, NULL, OPT_REQUIRE_EVENTS},
    {"model", required_argument, NULL, OPT_MODEL},
    {"lora-modules", required_argument, NULL, OPT_LORA_MODULES},
    {"cpu-offload-blocks", required_argument, NULL, OPT_CPU_OFFLOAD},
    {"kv-groups", required_argument, NULL, OPT_KV_GROUPS},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"summary-json", no_argument, NULL, OPT_SUMMARY_JSON},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {NULL, 0, NULL, 0}};

static const char usage[] =
    "usage: kvo-mocker [options]            serve the HTTP API + KV events\n"
    "       kvo-mocker --trace FILE [options]  replay a Mooncake trace\n"
    "\n"
    "A mock vLLM engine: vLLM v1's block pool and scheduler, KV events over\n"
    "ZeroMQ (PUB + replay ROUTER), the OpenAI HTTP API, and the engine's "
    "cache\n"
    "as ground truth (/kvo/state, /kvo/probe).\n"
    "\n"
    "HTTP:\n"
    "  --host H                  bind address (default 127.0.0.1)\n"
    "  --port P                  (default 8000; 0 = pick a free port)\n"
    "  --model NAME              served model name (default kvo-mock)\n"
    "  --lora-modules N[=P],...  LoRA adapters a request's \"model\" may name\n"
    "                            (lora_int_id 1, 2, ... in order; then any "
    "other\n"
    "                            model name is a 404, as vLLM)\n"
    "KV events (rank r of --dp-size uses port + r; 0 picks a free block):\n"
    "  --zmq-host H              PUB/ROUTER bind address (default 127.0.0.1)\n"
    "  --zmq-port P              PUB port (default 5557; 0 = pick)\n"
    "  --zmq-endpoint E          PUB endpoint instead (any ZeroMQ endpoint)\n"
    "  --replay-port P           replay ROUTER port (default 5558; 0 = pick)\n"
    "  --no-replay               no replay socket\n"
    "  --advertise-host H        host written in /kvo/event_sources\n"
    "  --topic T                 topic frame (default empty, as vLLM)\n"
    "  --event-format F          map|map-next|array-v0.9.0|array-v0.9.1|\n"
    "                            array-v0.10.2|array-v0.14|array-late (map)\n"
    "  --hash-bytes              hashes as raw digests, not low-64 ints\n"
    "  --replay-buffer N         batches kept for replay (default 10000)\n"
    "  --replay-buffer-mb N      and at most N MiB of them (default: no cap)\n"
    "  --zmq-hwm N               PUB high-water mark (default 100000)\n"
    "  --require-events          fail when the publisher cannot bind\n"
    "  --record FILE             capture every published message\n"
    "Engine:\n"
    "  --block-size N            (default 16)\n"
    "  --num-gpu-blocks N        per rank, incl. the null block (default "
    "16384)\n"
    "  --max-num-seqs N          (default 256)\n"
    "  --max-num-batched-tokens N (default 8192)\n"
    "  --max-model-len N         (default (num-gpu-blocks - 1) * block-size)\n"
    "  --dp-size N               data-parallel ranks (default 1)\n"
    "  --role R                  aggregated|prefill|decode (default "
    "aggregated)\n"
    "  --no-enable-prefix-caching  no prefix cache and no KV events\n"
    "  --cpu-offload-blocks N    a CPU tier of N blocks per rank: GPU "
    "evictions\n"
    "                            are offloaded to it (medium CPU), prefixes "
    "load\n"
    "                            back from it (default 0 = none)\n"
    "  --kv-groups full[,sliding:W]...  a hybrid model's KV-cache groups: "
    "events\n"
    "                            carry group_idx; a router indexes group 0 "
    "(full\n"
    "                            attention); not with --cpu-offload-blocks\n"
    "  --kv-transfer-ms-per-block X  decode role: latency per received block\n"
    "  --hash-algo A             sha256|sha256_cbor|xxhash|xxhash_cbor "
    "(sha256)\n"
    "  --hash-seed S             PYTHONHASHSEED of NONE_HASH (default \"0\")\n"
    "  --hash-memo N             trace-prompt hash memo: 2^N rows of one "
    "trace\n"
    "                            block each (default 14 = 25 MB; 0 = off)\n"
    "  --speedup X               timing model / X; 0 = virtual time (default)\n"
    "  --seed N                  generated tokens (default 0)\n"
    "  --vocab-size N            token ids of requests must be below N\n"
    "                            (default 4294967296; at least 32000)\n"
    "  --mutate NAME[,NAME]      corrupt the published events (below)\n"
    "Trace mode:\n"
    "  --trace FILE              Mooncake JSONL; no HTTP; summary on stdout\n"
    "  --no-progress             no progress bar (shown on a terminal)\n"
    "  --summary-json            the summary as one JSON line\n"
    "Other:\n"
    "  --log-level L             error|warn|info|debug (default info)\n"
    "  -h, --help                this text\n"
    "  -V, --version             print the version\n"
    "\n"
    "Every option also reads KVO_<NAME> from the environment.\n"
    "Exit: 0 clean stop, 1 input failed (trace unreadable), 2 usage or "
    "setup.\n";

typedef struct opts {
    mock_cfg cfg;
    kvo_level level;
    bool help, version;
} opts;

static kvo_status bad(const char *opt, const char *arg) {
    fprintf(stderr, "kvo-mocker: bad value for --%s: '%s'\n", opt,
            arg ? arg : "");
    return KVO_EINVAL;
}

static kvo_status port_opt(const char *name, const char *arg, uint16_t *out) {
    uint32_t v;
    if (kvo_parse_u32(arg, &v) || v > UINT16_MAX) return bad(name, arg);
    *out = (uint16_t)v;
    return KVO_OK;
}

static kvo_status u32_opt(const char *name, const char *arg, uint32_t *out,
                          uint32_t min) {
    uint32_t v;
    if (kvo_parse_u32(arg, &v) || v < min) return bad(name, arg);
    *out = v;
    return KVO_OK;
}

static kvo_status set_opt(void *ctx, int code, const char *arg) {
    opts *o = ctx;
    mock_cfg *c = &o->cfg;
    double d;
    uint32_t u;
    switch (code) {
    case 'h': o->help = true; return KVO_OK;
    case 'V': o->version = true; return KVO_OK;
    case OPT_HOST: c->host = arg; return KVO_OK;
    case OPT_PORT: return port_opt("port", arg, &c->port);
    case OPT_ZMQ_HOST: c->zmq_host = arg; return KVO_OK;
    case OPT_ZMQ_PORT: return port_opt("zmq-port", arg, &c->zmq_port);
    case OPT_ZMQ_ENDPOINT: c->zmq_endpoint = *arg ? arg : NULL; return KVO_OK;
    case OPT_REPLAY_PORT: return port_opt("replay-port", arg, &c->replay_port);
    case OPT_NO_REPLAY: c->replay = false; return KVO_OK;
    case OPT_ADVERTISE: c->advertise_host = arg; return KVO_OK;
    case OPT_TOPIC: c->topic = arg; return KVO_OK;
    case OPT_BLOCK_SIZE: return u32_opt("block-size", arg, &c->block_size, 1);
    case OPT_NUM_GPU_BLOCKS:
        return u32_opt("num-gpu-blocks", arg, &c->num_gpu_blocks, 2);
    case OPT_MAX_SEQS: return u32_opt("max-num-seqs", arg, &c->max_num_seqs, 1);
    case OPT_MAX_BATCHED:
        return u32_opt("max-num-batched-tokens", arg,
                       &c->max_num_batched_tokens, 1);
    case OPT_MAX_MODEL_LEN:
        return u32_opt("max-model-len", arg, &c->max_model_len, 2);
    case OPT_DP_SIZE:
        if (u32_opt("dp-size", arg, &c->dp_size, 1)) return KVO_EINVAL;
        return c->dp_size > MAX_DP_SIZE ? bad("dp-size", arg) : KVO_OK;
    case OPT_ROLE:
        return mock_role_parse(arg, &c->role) ? bad("role", arg) : KVO_OK;
    case OPT_NO_CACHING: c->prefix_caching = false; return KVO_OK;
    case OPT_CPU_OFFLOAD:
        return u32_opt("cpu-offload-blocks", arg, &c->cpu_offload_blocks, 0);
    case OPT_KV_GROUPS:
        return mock_groups_parse(arg, c) ? bad("kv-groups", arg) : KVO_OK;
    case OPT_CACHING: c->prefix_caching = true; return KVO_OK;
    case OPT_KV_TRANSFER:
        if (kvo_parse_double(arg, &d) || d < 0)
            return bad("kv-transfer-ms-per-block", arg);
        c->kv_transfer_ms_per_block = d;
        return KVO_OK;
    case OPT_HASH_ALGO:
        return wire_algo_parse(arg, &c->hash_algo) ? bad("hash-algo", arg)
                                                   : KVO_OK;
    case OPT_HASH_SEED: c->hash_seed = arg; return KVO_OK;
    case OPT_HASH_BYTES: c->hash_bytes = true; return KVO_OK;
    case OPT_HASH_MEMO:
        if (kvo_parse_u32(arg, &u) || u > MOCK_MEMO_LOG2_MAX)
            return bad("hash-memo", arg);
        c->hash_memo_log2 = u;
        return KVO_OK;
    case OPT_EVENT_FORMAT:
        return wire_format_parse(arg, &c->event_format)
                   ? bad("event-format", arg)
                   : KVO_OK;
    case OPT_SPEEDUP:
        if (kvo_parse_double(arg, &d) || d < 0) return bad("speedup", arg);
        c->speedup = d;
        return KVO_OK;
    case OPT_SEED:
        return kvo_parse_u64(arg, &c->seed) ? bad("seed", arg) : KVO_OK;
    case OPT_VOCAB_SIZE:
        /* trace prompts and generated tokens use ids below 32000 */
        if (kvo_parse_u64(arg, &c->vocab_size) ||
            c->vocab_size < MOCK_TRACE_VOCAB) {
            fprintf(
                stderr,
                "kvo-mocker: bad value for --vocab-size: '%s' (an integer >= "
                "%u: trace prompts and generated tokens use ids below %u)\n",
                arg, MOCK_TRACE_VOCAB, MOCK_TRACE_VOCAB);
            return KVO_EINVAL;
        }
        return KVO_OK;
    case OPT_MUTATE: {
        char which[64];
        if (mock_mutate_parse(arg, &c->mutations, which, sizeof(which))) {
            fprintf(stderr, "kvo-mocker: unknown mutation '%s' (see --help)\n",
                    which);
            return KVO_EINVAL;
        }
        return KVO_OK;
    }
    case OPT_RECORD: c->record = *arg ? arg : NULL; return KVO_OK;
    case OPT_TRACE: c->trace = *arg ? arg : NULL; return KVO_OK;
    case OPT_REPLAY_BUFFER:
        return u32_opt("replay-buffer", arg, &c->replay_buffer, 0);
    case OPT_REPLAY_BUFFER_MB:
        if (kvo_parse_u32(arg, &u) || u == 0)
            return bad("replay-buffer-mb", arg);
        c->replay_buffer_bytes = (uint64_t)u * MIB;
        return KVO_OK;
    case OPT_ZMQ_HWM:
        if (kvo_parse_u32(arg, &u) || u > INT32_MAX) return bad("zmq-hwm", arg);
        c->zmq_hwm = (int)u;
        return KVO_OK;
    case OPT_REQUIRE_EVENTS: c->require_events = true; return KVO_OK;
    case OPT_MODEL: c->model = arg; return KVO_OK;
    case OPT_LORA_MODULES:
        c->lora_modules = *arg ? arg : NULL;
        return mock_cfg_lora_modules_check(c) ? bad("lora-modules", arg)
                                              : KVO_OK;
    case OPT_NO_PROGRESS: c->progress = false; return KVO_OK;
    case OPT_SUMMARY_JSON: c->summary_json = true; return KVO_OK;
    case OPT_LOG_LEVEL:
        return kvo_log_level_parse(arg, &o->level) ? bad("log-level", arg)
                                                   : KVO_OK;
    default: return KVO_EINVAL;
    }
}

static void print_help(void) {
    fputs(usage, stdout);
    printf("\nMutations (--mutate; the published bytes only, never the "
           "engine):\n");
    const mock_mutation_info *m = mock_mutations();
    for (unsigned i = 0; i < MOCK_MUT_COUNT; i++) {
        printf("  %-20s %-7s %s", m[i].name, m[i].killed ? "killed" : "benign",
               m[i].what);
        if (m[i].incident) printf(" [%s]", m[i].incident);
        if (m[i].needs) printf(" (seen with %s traffic)", m[i].needs);
        printf("\n");
    }
}

static void log_config(const mock_cfg *c) {
    char muts[512] = "";
    const mock_mutation_info *m = mock_mutations();
    for (unsigned i = 0; i < MOCK_MUT_COUNT; i++) {
        if (!(c->mutations & m[i].bit)) continue;
        size_t n = strlen(muts);
        snprintf(muts + n, sizeof(muts) - n, "%s%s", n ? "," : "", m[i].name);
    }
    kvo_info("kvo-mocker %s: mode=%s model=%s role=%s dp_size=%u block_size=%u "
             "num_gpu_blocks=%u max_num_seqs=%u max_num_batched_tokens=%u "
             "max_model_len=%u prefix_caching=%s hash_algo=%s hash_seed=%s "
             "hash_bytes=%s event_format=%s topic='%s' speedup=%g seed=%llu "
             "vocab_size=%llu mutate=%s record=%s cpu_offload_blocks=%u "
             "lora_modules=%s kv_groups=%u",
             KVO_VERSION, c->trace ? "trace" : "server", c->model,
             mock_role_name(c->role), c->dp_size, c->block_size,
             c->num_gpu_blocks, c->max_num_seqs, c->max_num_batched_tokens,
             mock_cfg_max_model_len(c), c->prefix_caching ? "on" : "off",
             wire_algo_name(c->hash_algo), c->hash_seed,
             c->hash_bytes ? "on" : "off", wire_format_name(c->event_format),
             c->topic, c->speedup, (unsigned long long)c->seed,
             (unsigned long long)c->vocab_size, *muts ? muts : "none",
             c->record ? c->record : "none", c->cpu_offload_blocks,
             c->lora_modules ? c->lora_modules : "none", mock_cfg_groups(c));
}

int main(int argc, char **argv) {
    opts o;
    memset(&o, 0, sizeof(o));
    mock_cfg_default(&o.cfg);
    o.cfg.progress = true;
    o.level = KVO_LOG_INFO;
    int optind_ = kvo_getopt(argc, argv, options, set_opt, &o);
    if (optind_ < 0) {
        fprintf(stderr, "kvo-mocker: see --help\n");
        return KVO_EXIT_USAGE;
    }
    if (o.help) {
        print_help();
        return KVO_EXIT_OK;
    }
    if (o.version) {
        printf("kvo-mocker %s\n", KVO_VERSION);
        return KVO_EXIT_OK;
    }
    if (optind_ < argc) {
        fprintf(stderr, "kvo-mocker: unexpected argument '%s' (see --help)\n",
                argv[optind_]);
        return KVO_EXIT_USAGE;
    }
    if (o.cfg.n_groups > 1 && o.cfg.cpu_offload_blocks) {
        fprintf(stderr,
                "kvo-mocker: --kv-groups and --cpu-offload-blocks do not "
                "go together\n");
        return KVO_EXIT_USAGE;
    }
    if (o.cfg.dp_size > 1 && o.cfg.zmq_port &&
        o.cfg.zmq_port + o.cfg.dp_size - 1 > UINT16_MAX) {
        fprintf(stderr, "kvo-mocker: --zmq-port + --dp-size exceeds 65535\n");
        return KVO_EXIT_USAGE;
    }
    kvo_log_init("kvo-mocker", o.level);
    kvo_signals_init();
    log_config(&o.cfg);
    kvo_status st =
        o.cfg.trace ? mock_run_trace(&o.cfg) : mock_run_server(&o.cfg);
    if (st == KVO_OK) return KVO_EXIT_OK;
    if (o.cfg.trace && (st == KVO_ENOTFOUND || st == KVO_EIO))
        return KVO_EXIT_FAIL;
    return KVO_EXIT_USAGE;
}
