/* kvo-check -- the oracle: drives a trace through engines, relays and an
 * indexer and compares engine truth with the index, prompt by prompt.
 *
 *   kvo-check --spawn --trace FILE [options]     start everything, check
 *   kvo-check --engines URL,... --trace FILE     check running parts
 *   kvo-check mutants [--load] [--trace FILE] [--limit N]   mutation-test
 *
 * Exit: 0 PASS, 1 FAIL (one-line cause on stderr), 2 usage/setup error.
 */
#include "kvo_check.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    OPT_SPAWN = 256,
    OPT_TRACE,
    OPT_LIMIT,
    OPT_WORKERS,
    OPT_DECODE_WORKERS,
    OPT_DP_SIZE,
    OPT_BLOCK_SIZE,
    OPT_NUM_GPU_BLOCKS,
    OPT_POLICY,
    OPT_HASH_ALGO,
    OPT_HASH_SEED,
    OPT_EVENT_FORMAT,
    OPT_MUTATE,
    OPT_SEED,
    OPT_REPLAY_BUFFER,
    OPT_VERIFY,
    OPT_NO_REPLAY,
    OPT_DROP_SEQ,
    OPT_RELAY_RESTART_AT,
    OPT_LOG_DIR,
    OPT_KEEP_LOGS,
    OPT_BIN_DIR,
    OPT_ENGINES,
    OPT_INDEXER,
    OPT_INDEXER_API,
    OPT_MODEL_NAME,
    OPT_NATS,
    OPT_MODEL,
    OPT_NO_RELAYS,
    OPT_SETTLE_MS,
    OPT_PROMPT_FORM,
    OPT_TIMEOUT_MS,
    OPT_FAIL_FAST,
    OPT_VERBOSE,
    OPT_REPORT_JSON,
    OPT_REPORT_HTML,
    OPT_WORST,
    OPT_QUIET,
    OPT_LOG_LEVEL,
    OPT_ONLY,
    OPT_NO_PROGRESS,
    OPT_SWEEP,
    OPT_LOAD,
    OPT_CONCURRENCY,
    OPT_ARRIVAL,
    OPT_TIME_SCALE,
    OPT_SPEEDUP,
    OPT_CHECKPOINT_EVERY,
    OPT_OVERLAP_WEIGHT,
    OPT_ROUTER_TEMPERATURE,
    OPT_CHECKPOINT_SWEEP,
    OPT_LOCKSTEP,
    OPT_EXTRA_BLOCK_SEQ,
    OPT_INDEXER_RESTART_AT,
    OPT_ENGINE_RESTART_AT,
    OPT_NATS_KILL_AT,
    OPT_NATS_DOWN_MS,
    OPT_CHAOS,
    OPT_NATS_CLUSTER,
    OPT_NATS_KILL_NODE,
    OPT_CHAOS_EVERY,
    /* the event schema's dimensions (issue 15) */
    OPT_LORA_ADAPTERS,
    OPT_LORA_FRACTION,
    OPT_SALT_TENANTS,
    OPT_MM_FRACTION,
    OPT_RESET_AT,
    OPT_KV_GROUPS,
    OPT_CPU_OFFLOAD_BLOCKS
};

static const struct option OPTIONS[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"spawn", no_argument, NULL, OPT_SPAWN},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"workers", required_argument, NULL, OPT_WORKERS},
    {"decode-workers", required_argument, NULL, OPT_DECODE_WORKERS},
    {"dp-size", required_argument, NULL, OPT_DP_SIZE},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"num-gpu-blocks", required_argument, NULL, OPT_NUM_GPU_BLOCKS},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"hash-algo", required_argument, NULL, OPT_HASH_ALGO},
    {"hash-seed", required_argument, NULL, OPT_HASH_SEED},
    {"event-format", required_argument, NULL, OPT_EVENT_FORMAT},
    {"mutate", required_argument, NULL, OPT_MUTATE},
    {"seed", required_argument, NULL, OPT_SEED},
    {"replay-buffer", required_argument, NULL, OPT_REPLAY_BUFFER},
    {"verify-engine-hash", no_argument, NULL, OPT_VERIFY},
    {"no-replay", no_argument, NULL, OPT_NO_REPLAY},
    {"drop-seq", required_argument, NULL, OPT_DROP_SEQ},
    {"extra-block-seq", required_argument, NULL, OPT_EXTRA_BLOCK_SEQ},
    {"relay-restart-at", required_argument, NULL, OPT_RELAY_RESTART_AT},
    {"indexer-restart-at", required_argument, NULL, OPT_INDEXER_RESTART_AT},
    {"engine-restart-at", required_argument, NULL, OPT_ENGINE_RESTART_AT},
    {"nats-kill-at", required_argument, NULL, OPT_NATS_KILL_AT},
    {"nats-cluster", required_argument, NULL, OPT_NATS_CLUSTER},
    {"nats-kill-node", required_argument, NULL, OPT_NATS_KILL_NODE},
    {"nats-down-ms", required_argument, NULL, OPT_NATS_DOWN_MS},
    {"chaos", required_argument, NULL, OPT_CHAOS},
    {"chaos-every", required_argument, NULL, OPT_CHAOS_EVERY},
    {"lora-adapters", required_argument, NULL, OPT_LORA_ADAPTERS},
    {"lora-fraction", required_argument, NULL, OPT_LORA_FRACTION},
    {"salt-tenants", required_argument, NULL, OPT_SALT_TENANTS},
    {"mm-fraction", required_argument, NULL, OPT_MM_FRACTION},
    {"reset-at", required_argument, NULL, OPT_RESET_AT},
    {"kv-groups", required_argument, NULL, OPT_KV_GROUPS},
    {"cpu-offload-blocks", required_argument, NULL, OPT_CPU_OFFLOAD_BLOCKS},
    {"log-dir", required_argument, NULL, OPT_LOG_DIR},
    {"keep-logs", no_argument, NULL, OPT_KEEP_LOGS},
    {"bin-dir", required_argument, NULL, OPT_BIN_DIR},
    {"engines", required_argument, NULL, OPT_ENGINES},
    {"indexer", required_argument, NULL, OPT_INDEXER},
    {"indexer-api", required_argument, NULL, OPT_INDEXER_API},
    {"model-name", required_argument, NULL, OPT_MODEL_NAME},
    {"nats", required_argument, NULL, OPT_NATS},
    {"model", required_argument, NULL, OPT_MODEL},
    {"no-relays", no_argument, NULL, OPT_NO_RELAYS},
    {"settle-ms", required_argument, NULL, OPT_SETTLE_MS},
    {"prompt-form", required_argument, NULL, OPT_PROMPT_FORM},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT_MS},
    {"fail-fast", no_argument, NULL, OPT_FAIL_FAST},
    {"verbose", no_argument, NULL, OPT_VERBOSE},
    {"sweep", required_argument, NULL, OPT_SWEEP},
    {"report-json", required_argument, NULL, OPT_REPORT_JSON},
    {"report-html", required_argument, NULL, OPT_REPORT_HTML},
    {"worst", required_argument, NULL, OPT_WORST},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"only", required_argument, NULL, OPT_ONLY},
    {"load", no_argument, NULL, OPT_LOAD},
    {"lockstep", no_argument, NULL, OPT_LOCKSTEP},
    {"concurrency", required_argument, NULL, OPT_CONCURRENCY},
    {"arrival", required_argument, NULL, OPT_ARRIVAL},
    {"time-scale", required_argument, NULL, OPT_TIME_SCALE},
    {"speedup", required_argument, NULL, OPT_SPEEDUP},
    {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
    {"checkpoint-sweep", required_argument, NULL, OPT_CHECKPOINT_SWEEP},
    {"overlap-weight", required_argument, NULL, OPT_OVERLAP_WEIGHT},
    {"router-temperature", required_argument, NULL, OPT_ROUTER_TEMPERATURE},
    {NULL, 0, NULL, 0}};

static const char USAGE[] =
    "usage: kvo-check --spawn --trace FILE [options]\n"
    "       kvo-check --engines URL[,URL...] --trace FILE [options]\n"
    "       kvo-check mutants [--load] [--trace FILE] [--limit N] [--only "
    "a,b]\n"
    "\n"
    "Drives a Mooncake trace through engines, kvo-relays and a kvo-indexer\n"
    "and checks that the index matches the engines' caches. Lockstep (the\n"
    "default): one request at a time, every prompt's index score on every\n"
    "worker (capped at (n-1)//block_size) equals the engine's cached prefix.\n"
    "Both modes: a checkpoint every --checkpoint-every requests and at the\n"
    "end stops the traffic, waits for every answer and for the index, then\n"
    "compares every (worker, rank)'s cached block set (hashes and parents)\n"
    "with the index's and re-checks recent prompts on every worker.\n"
    "Exit 0 PASS, 1 FAIL (cause on stderr), 2 setup error.\n"
    "\n"
    "What runs:\n"
    "  --spawn                 start nats-server, kvo-mockers, one kvo-relay "
    "per\n"
    "                          engine rank and a kvo-indexer (free loopback "
    "ports)\n"
    "  --engines URL,...       running OpenAI-compatible engines (kvo-mocker "
    "or\n"
    "                          vLLM; worker ids 0.. in this order)\n"
    "  --indexer URL           a running kvo-indexer (default: spawn one)\n"
    "  --indexer-api API       kvo (kvo-indexer's, events through relays and\n"
    "                          NATS) or dynamo (Dynamo's standalone indexer\n"
    "                          API: every engine rank is registered with it\n"
    "                          and it reads their ZMQ itself; spawned: a\n"
    "                          kvo-indexer --dynamo-http) (kvo)\n"
    "  --model-name M          dynamo: the model_name registered and queried\n"
    "                          (default: the completions' model)\n"
    "  --nats URL              a running NATS (default: spawn nats-server)\n"
    "  --no-relays             engines' events reach NATS through your relays\n"
    "  --model NAME            model for completions (default: /v1/models)\n"
    "  --settle-ms MS          quiet period before each query when there is "
    "no\n"
    "                          exact watermark (500)\n"
    "  --bin-dir DIR           where kvo-mocker/relay/indexer are (default:\n"
    "                          next to kvo-check, then PATH)\n"
    "Trace and routing:\n"
    "  --trace FILE            Mooncake JSONL (timestamp, input_length,\n"
    "                          output_length, hash_ids)\n"
    "  --limit N               first N requests (0 = all)\n"
    "  --policy P              round-robin (request i -> worker i mod N, rank\n"
    "                          (i div N) mod dp), kv (highest index score,\n"
    "                          ties: least used, then lowest slot) or dynamo\n"
    "                          (Dynamo's KV-router cost: W x uncached prompt\n"
    "                          blocks + blocks of the requests in flight on "
    "the\n"
    "                          slot; lowest wins; ties: fewest in flight, "
    "then\n"
    "                          lowest slot)\n"
    "  --overlap-weight W      dynamo: weight of the prefill blocks (1.0)\n"
    "  --router-temperature T  dynamo: 0 = lowest cost; T > 0 samples a\n"
    "                          softmax over -cost/T (seeded by --seed) (0)\n"
    "  --prompt-form F         auto|trace|tokens (auto: the trace extension\n"
    "                          against kvo-mocker, token ids otherwise)\n"
    "Load mode:\n"
    "  --load                  many requests in flight, routed at submission\n"
    "                          from the index as it is (no watermark wait);\n"
    "                          exact at checkpoints; per request the routing-\n"
    "                          time score vs the engine's hit is reported\n"
    "  --lockstep              one request at a time (the default; undoes an\n"
    "                          earlier --load)\n"
    "  --concurrency N         requests in flight (8 per worker); with\n"
    "                          --arrival trace, the most at once\n"
    "  --arrival A             closed (N in flight at all times, trace order)\n"
    "                          or trace (the trace's timestamps / "
    "--time-scale)\n"
    "  --time-scale X          --arrival trace: timestamps divided by X\n"
    "                          (default: --speedup, or 1 when it is 0)\n"
    "  --speedup X             spawned engines' timing model divided by X; 0 "
    "=\n"
    "                          as fast as they go (lockstep 0, load 1)\n"
    "Spawned engines (kvo-mocker):\n"
    "  --workers N             engines (4); prefill engines with decode "
    "workers\n"
    "  --decode-workers N      disaggregated decode engines (0)\n"
    "  --dp-size N             ranks per engine (1)\n"
    "  --block-size N          (16)\n"
    "  --num-gpu-blocks N      per rank (mocker default)\n"
    "  --hash-algo A           sha256|sha256_cbor|xxhash|xxhash_cbor (sha256)\n"
    "  --hash-seed S           PYTHONHASHSEED string (0)\n"
    "  --event-format F        map|array-v0.14|array-late|... (map)\n"
    "  --mutate NAME[,NAME]    kvo-mocker encoder mutants (see `mutants`)\n"
    "  --seed N                generated tokens; the router's draws (0)\n"
    "  --replay-buffer N       batches per rank (sized for the run)\n"
    "Traffic (every dimension of the event schema; drawn from --seed):\n"
    "  --lora-adapters N       spawned engines serve LoRA adapters "
    "kvo-lora-1..N\n"
    "  --lora-fraction F       share of requests naming one as their model "
    "(0)\n"
    "  --salt-tenants N        every request gets tenant-K's cache_salt, K < "
    "N\n"
    "  --mm-fraction F         share of prompts with one multimodal item (0)\n"
    "  --reset-at N            POST /reset_prefix_cache to every engine, "
    "idle,\n"
    "                          before request N (lockstep)\n"
    "  --kv-groups SPEC        spawned engines' KV-cache groups "
    "(full,sliding:W)\n"
    "  --cpu-offload-blocks N  spawned engines' CPU tier, blocks per rank (0)\n"
    "Relays and fault injection:\n"
    "  --verify-engine-hash    relays recompute every engine hash\n"
    "Faults (--spawn, lockstep; each must still PASS with 0 divergent: the\n"
    "relays and the indexer recover exactly; a run without any must see no\n"
    "gap and no recovery at all):\n"
    "  --relay-restart-at N    SIGKILL relay 0.0 before request N, start a\n"
    "                          fresh one (replays from seq 0)\n"
    "  --indexer-restart-at N  SIGKILL kvo-indexer before request N, start it\n"
    "                          again on its port; go on once /health says ok\n"
    "                          (it rebuilt the index from the relays' dumps)\n"
    "  --engine-restart-at N   SIGKILL kvo-mocker 0 before request N, start "
    "it\n"
    "                          again on its ports (empty); go on once the\n"
    "                          index holds none of its blocks (every rank)\n"
    "  --nats-kill-at N        SIGKILL nats-server before request N, start it\n"
    "                          again on its port after --nats-down-ms\n"
    "  --nats-down-ms M        (500)\n"
    "  --nats-cluster N        spawn N clustered nats-servers (routes on\n"
    "                          loopback; 1..5, default 1): the indexer\n"
    "                          connects to node 0 first, the relays to node 1\n"
    "  --nats-kill-node WHO    the node --nats-kill-at and --chaos kill:\n"
    "                          indexer (its node, default) or relay\n"
    "  --chaos SEED            before every --chaos-every-th request, kill "
    "and\n"
    "                          restart one of {a relay, kvo-indexer,\n"
    "                          nats-server}: each round of three covers all\n"
    "                          three, in an order (and relay) drawn from SEED\n"
    "  --chaos-every K         (50)\n"
    "  --no-replay             relays without a replay endpoint\n"
    "  --drop-seq N            drop ZMQ batch N of engine 0 rank 0 on its way\n"
    "                          to the relay\n"
    "  --extra-block-seq N     from ZMQ batch N of engine 0 rank 0 on, add to\n"
    "                          the first that stores blocks a child block the\n"
    "                          engine never computed (no prompt reaches it)\n"
    "Checkpoints, reports and run control:\n"
    "  --checkpoint-every K    a full-state checkpoint every K requests (200;\n"
    "                          0 = only the one at the end)\n"
    "  --sweep N               the last checkpoint re-checks the run's last\n"
    "                          N distinct prompts on every worker (1000; 0 =\n"
    "                          off)\n"
    "  --checkpoint-sweep N    earlier checkpoints: the last N distinct\n"
    "                          prompts since the checkpoint before (50)\n"
    "  --report-json FILE      one JSON line per prompt, then a summary line\n"
    "  --report-html FILE      a self-contained HTML report\n"
    "  --worst N               rows of the worst-prompts table (10)\n"
    "  --fail-fast             stop at the first failure\n"
    "  --verbose               every counter and the worst prompts in the\n"
    "                          summary of a PASS too (a FAIL always has them)\n"
    "  --timeout-ms MS         one watermark wait or HTTP call; under --load,\n"
    "                          the longest time without any answer (30000)\n"
    "  --log-dir DIR           process logs (default: a temp dir, kept on "
    "FAIL)\n"
    "  --keep-logs             keep the logs on PASS too\n"
    "  --no-progress, --quiet  no progress bar / also no summary\n"
    "  --log-level L           error|warn|info|debug (info; mutants: warn)\n"
    "  --only a,b              mutants: run only these\n"
    "  -h, --help, -V, --version\n"
    "Every option also reads KVO_<NAME> from the environment.\n";

typedef struct opts {
    check_cfg cfg;
    size_t worst;
    bool quiet, no_progress;
    kvo_level level;
    const char *only;
    bool limit_set, workers_set, dp_set, blocks_set, level_set;
    bool load_only_set; /* an option that needs --load */
    bool checkpoint_set;
} opts;

static kvo_status bad(const char *opt, const char *v) {
    fprintf(stderr, "kvo-check: bad value for --%s: '%s'\n", opt, v);
    return KVO_EINVAL;
}

static kvo_status set_u32(uint32_t *out, const char *opt, const char *v) {
    return kvo_parse_u32(v, out) == KVO_OK ? KVO_OK : bad(opt, v);
}

static kvo_status set_u64(uint64_t *out, const char *opt, const char *v) {
    return kvo_parse_u64(v, out) == KVO_OK ? KVO_OK : bad(opt, v);
}

/* v as one of names (NULL-terminated): *out = its position, which is the
 * enum value it names. */
static kvo_status set_choice(int *out, const char *opt, const char *v,
                             const char *const names[]) {
    for (int i = 0; names[i]; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = i;
            return KVO_OK;
        }
    return bad(opt, v);
}

/* A count that may not be negative. */
static kvo_status set_i64(int64_t *out, const char *opt, const char *v) {
    int64_t x;
    if (kvo_parse_i64(v, &x) != KVO_OK || x < 0) return bad(opt, v);
    *out = x;
    return KVO_OK;
}

/* A finite number >= 0 (> 0 when positive). */
static kvo_status set_double(double *out, const char *opt, const char *v,
                             bool positive) {
    double x;
    if (kvo_parse_double(v, &x) != KVO_OK || !(x >= 0) || x > 1e300 ||
        (positive && x <= 0))
        return bad(opt, v);
    *out = x;
    return KVO_OK;
}

static kvo_status set_long(long *out, const char *opt, const char *v) {
    int64_t x;
    if (set_i64(&x, opt, v) != KVO_OK) return KVO_EINVAL;
    *out = (long)x;
    return KVO_OK;
}

static kvo_status on_opt(void *ctx, int code, const char *v) {
    opts *o = ctx;
    check_cfg *c = &o->cfg;
    int choice;
    switch (code) {
    case 'h': fputs(USAGE, stdout); exit(KVO_EXIT_OK);
    case 'V': printf("kvo-check %s\n", KVO_VERSION); exit(KVO_EXIT_OK);
    case OPT_SPAWN: c->spawn = true; return KVO_OK;
    case OPT_TRACE: c->trace = v; return KVO_OK;
    case OPT_LIMIT: o->limit_set = true; return set_u64(&c->limit, "limit", v);
    case OPT_WORKERS:
        o->workers_set = true;
        return set_u32(&c->workers, "workers", v);
    case OPT_DECODE_WORKERS:
        return set_u32(&c->decode_workers, "decode-workers", v);
    case OPT_DP_SIZE:
        o->dp_set = true;
        return set_u32(&c->dp_size, "dp-size", v);
    case OPT_BLOCK_SIZE: return set_u32(&c->block_size, "block-size", v);
    case OPT_NUM_GPU_BLOCKS:
        o->blocks_set = true;
        return set_u64(&c->num_gpu_blocks, "num-gpu-blocks", v);
    case OPT_POLICY: {
        static const char *const names[] = {[CHECK_POLICY_ROUND_ROBIN] =
                                                "round-robin",
                                            [CHECK_POLICY_KV] = "kv",
                                            [CHECK_POLICY_DYNAMO] = "dynamo",
                                            NULL};
        if (set_choice(&choice, "policy", v, names) != KVO_OK)
            return KVO_EINVAL;
        c->policy = (check_policy)choice;
        return KVO_OK;
    }
    case OPT_HASH_ALGO: c->hash_algo = v; return KVO_OK;
    case OPT_HASH_SEED: c->hash_seed = v; return KVO_OK;
    case OPT_EVENT_FORMAT: c->event_format = v; return KVO_OK;
    case OPT_MUTATE: c->mutate = v; return KVO_OK;
    case OPT_SEED: return set_u64(&c->seed, "seed", v);
    case OPT_REPLAY_BUFFER:
        return set_u64(&c->replay_buffer, "replay-buffer", v);
    case OPT_VERIFY: c->verify_engine_hash = true; return KVO_OK;
    case OPT_NO_REPLAY: c->no_replay = true; return KVO_OK;
    case OPT_DROP_SEQ: return set_i64(&c->drop_seq, "drop-seq", v);
    case OPT_EXTRA_BLOCK_SEQ:
        return set_i64(&c->extra_block_seq, "extra-block-seq", v);
    case OPT_LORA_ADAPTERS:
        return set_u32(&c->lora_adapters, "lora-adapters", v);
    case OPT_LORA_FRACTION:
        if (set_double(&c->lora_fraction, "lora-fraction", v, false) !=
                KVO_OK ||
            c->lora_fraction > 1)
            return bad("lora-fraction", v);
        return KVO_OK;
    case OPT_SALT_TENANTS: return set_u32(&c->salt_tenants, "salt-tenants", v);
    case OPT_MM_FRACTION:
        if (set_double(&c->mm_fraction, "mm-fraction", v, false) != KVO_OK ||
            c->mm_fraction > 1)
            return bad("mm-fraction", v);
        return KVO_OK;
    case OPT_RESET_AT: return set_i64(&c->reset_at, "reset-at", v);
    case OPT_KV_GROUPS: c->kv_groups = *v ? v : NULL; return KVO_OK;
    case OPT_CPU_OFFLOAD_BLOCKS:
        return set_u64(&c->cpu_offload_blocks, "cpu-offload-blocks", v);
    case OPT_RELAY_RESTART_AT:
        return set_i64(&c->relay_restart_at, "relay-restart-at", v);
    case OPT_INDEXER_RESTART_AT:
        return set_i64(&c->indexer_restart_at, "indexer-restart-at", v);
    case OPT_ENGINE_RESTART_AT:
        return set_i64(&c->engine_restart_at, "engine-restart-at", v);
    case OPT_NATS_CLUSTER: {
        uint64_t n;
        if (set_u64(&n, "nats-cluster", v) != KVO_OK || n < 1 ||
            n > CHECK_NATS_MAX)
            return bad("nats-cluster", v);
        c->nats_cluster = (uint32_t)n;
        return KVO_OK;
    }
    case OPT_NATS_KILL_NODE:
        if (strcmp(v, "indexer") == 0)
            c->nats_kill_relay_node = false;
        else if (strcmp(v, "relay") == 0)
            c->nats_kill_relay_node = true;
        else
            return bad("nats-kill-node", v);
        return KVO_OK;
    case OPT_NATS_KILL_AT: return set_i64(&c->nats_kill_at, "nats-kill-at", v);
    case OPT_NATS_DOWN_MS:
        if (set_u64(&c->nats_down_ms, "nats-down-ms", v) != KVO_OK)
            return KVO_EINVAL;
        return c->nats_down_ms <= 600000 ? KVO_OK : bad("nats-down-ms", v);
    case OPT_CHAOS: c->chaos = true; return set_u64(&c->chaos_seed, "chaos", v);
    case OPT_CHAOS_EVERY:
        if (set_u64(&c->chaos_every, "chaos-every", v) != KVO_OK)
            return KVO_EINVAL;
        return c->chaos_every > 0 ? KVO_OK : bad("chaos-every", v);
    case OPT_LOG_DIR: c->log_dir = v; return KVO_OK;
    case OPT_KEEP_LOGS: c->keep_logs = true; return KVO_OK;
    case OPT_BIN_DIR: c->bin_dir = v; return KVO_OK;
    case OPT_ENGINES: c->engines = v; return KVO_OK;
    case OPT_INDEXER: c->indexer = v; return KVO_OK;
    case OPT_INDEXER_API:
        if (strcmp(v, "kvo") == 0)
            c->indexer_api = CHECK_API_KVO;
        else if (strcmp(v, "dynamo") == 0)
            c->indexer_api = CHECK_API_DYNAMO;
        else
            return bad("indexer-api", v);
        return KVO_OK;
    case OPT_MODEL_NAME: c->model_name = v; return KVO_OK;
    case OPT_NATS: c->nats = v; return KVO_OK;
    case OPT_MODEL: c->model = v; return KVO_OK;
    case OPT_NO_RELAYS: c->no_relays = true; return KVO_OK;
    case OPT_SETTLE_MS: return set_long(&c->settle_ms, "settle-ms", v);
    case OPT_PROMPT_FORM: {
        static const char *const names[] = {[CHECK_FORM_AUTO] = "auto",
                                            [CHECK_FORM_TRACE] = "trace",
                                            [CHECK_FORM_TOKENS] = "tokens",
                                            NULL};
        if (set_choice(&choice, "prompt-form", v, names) != KVO_OK)
            return KVO_EINVAL;
        c->prompt_form = (check_prompt_form)choice;
        return KVO_OK;
    }
    case OPT_TIMEOUT_MS:
        if (set_long(&c->timeout_ms, "timeout-ms", v) != KVO_OK)
            return KVO_EINVAL;
        return c->timeout_ms > 0 ? KVO_OK : bad("timeout-ms", v);
    case OPT_FAIL_FAST: c->fail_fast = true; return KVO_OK;
    case OPT_VERBOSE: c->verbose = true; return KVO_OK;
    case OPT_SWEEP: return set_u64(&c->sweep, "sweep", v);
    case OPT_CHECKPOINT_SWEEP:
        return set_u64(&c->checkpoint_sweep, "checkpoint-sweep", v);
    case OPT_REPORT_JSON: c->report_json = v; return KVO_OK;
    case OPT_REPORT_HTML: c->report_html = v; return KVO_OK;
    case OPT_WORST: {
        uint32_t w;
        if (set_u32(&w, "worst", v) != KVO_OK) return KVO_EINVAL;
        o->worst = w;
        return KVO_OK;
    }
    case OPT_QUIET: o->quiet = o->no_progress = true; return KVO_OK;
    case OPT_NO_PROGRESS: o->no_progress = true; return KVO_OK;
    case OPT_LOG_LEVEL:
        o->level_set = true;
        return kvo_log_level_parse(v, &o->level) == KVO_OK
                   ? KVO_OK
                   : bad("log-level", v);
    case OPT_ONLY: o->only = v; return KVO_OK;
    case OPT_LOAD: c->load = true; return KVO_OK;
    case OPT_LOCKSTEP: c->load = false; return KVO_OK;
    case OPT_CONCURRENCY:
        o->load_only_set = true;
        if (set_u32(&c->concurrency, "concurrency", v) != KVO_OK)
            return KVO_EINVAL;
        return c->concurrency > 0 && c->concurrency <= CHECK_CONCURRENCY_MAX
                   ? KVO_OK
                   : bad("concurrency", v);
    case OPT_ARRIVAL: {
        static const char *const names[] = {[CHECK_ARRIVAL_CLOSED] = "closed",
                                            [CHECK_ARRIVAL_TRACE] = "trace",
                                            NULL};
        o->load_only_set = true;
        if (set_choice(&choice, "arrival", v, names) != KVO_OK)
            return KVO_EINVAL;
        c->arrival = (check_arrival)choice;
        return KVO_OK;
    }
    case OPT_TIME_SCALE:
        o->load_only_set = true;
        return set_double(&c->time_scale, "time-scale", v, true);
    case OPT_SPEEDUP: return set_double(&c->speedup, "speedup", v, false);
    case OPT_CHECKPOINT_EVERY:
        o->checkpoint_set = true;
        return set_u64(&c->checkpoint_every, "checkpoint-every", v);
    case OPT_OVERLAP_WEIGHT:
        return set_double(&c->overlap_weight, "overlap-weight", v, false);
    case OPT_ROUTER_TEMPERATURE:
        return set_double(&c->router_temperature, "router-temperature", v,
                          false);
    default: return KVO_EINVAL;
    }
}

/* mutants without --trace: the bundled 1,000-request trace, found from the
 * working directory or from the build tree (<repo>/build/bin/kvo-check):
 * up to TRACE_LEVELS_UP directories above kvo-check. */
enum { TRACE_LEVELS_UP = 3 };
static const char *default_trace(char *buf, size_t n) {
    static const char rel[] = "traces/mooncake_conversation_1000.jsonl";
    if (access(rel, R_OK) == 0) return rel;
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0) return NULL;
    self[len] = '\0';
    for (int up = 0; up < TRACE_LEVELS_UP; up++) {
        char *slash = strrchr(self, '/');
        if (!slash) break;
        *slash = '\0';
        snprintf(buf, n, "%s/%s", self, rel);
        if (access(buf, R_OK) == 0) return buf;
    }
    return NULL;
}

int main(int argc, char **argv) {
    opts o;
    memset(&o, 0, sizeof(o));
    check_cfg_defaults(&o.cfg);
    o.worst = 10;
    o.level = KVO_LOG_INFO;
    bool mutants = argc > 1 && strcmp(argv[1], "mutants") == 0;
    if (mutants) {
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    int first = kvo_getopt(argc, argv, OPTIONS, on_opt, &o);
    if (first < 0) {
        fputs(USAGE, stderr);
        return KVO_EXIT_USAGE;
    }
    if (first < argc) {
        fprintf(stderr, "kvo-check: unexpected argument '%s' (see --help)\n",
                argv[first]);
        return KVO_EXIT_USAGE;
    }
    /* the matrix is the output of `mutants`: per-run lines only on demand */
    if (mutants && !o.level_set) o.level = KVO_LOG_WARN;
    kvo_log_init("kvo-check", o.level);
    kvo_signals_init();
    check_cfg *c = &o.cfg;
    c->progress = !o.no_progress && isatty(STDERR_FILENO);

    if (mutants) {
        /* A scenario that can observe every mutant: several workers, dp 2,
         * a cache small enough to evict, engine hashes verified. */
        char buf[PATH_MAX + 64];
        c->spawn = true;
        c->engines = NULL;
        c->verify_engine_hash = true;
        c->progress = false;
        if (!o.workers_set) c->workers = 2;
        if (!o.dp_set) c->dp_size = 2;
        if (!o.blocks_set) c->num_gpu_blocks = 8192;
        if (!o.limit_set) c->limit = 120;
        /* under load, checkpoints are where mutants are caught: several */
        if (c->load && !o.checkpoint_set) c->checkpoint_every = 40;
        if (c->load && c->speedup < 0) c->speedup = 0;
        if (!c->trace) c->trace = default_trace(buf, sizeof(buf));
        if (!c->trace) {
            fprintf(stderr, "kvo-check: no --trace given and "
                            "traces/mooncake_conversation_1000.jsonl not "
                            "found\n");
            return KVO_EXIT_USAGE;
        }
        kvo_info("kvo-check %s mutants: trace %s limit %llu workers %u dp %u "
                 "gpu blocks %llu%s",
                 KVO_VERSION, c->trace, (unsigned long long)c->limit,
                 c->workers, c->dp_size, (unsigned long long)c->num_gpu_blocks,
                 c->load ? " load" : "");
        bool ok = false;
        kvo_status st = check_mutants_run(c, o.only, stdout, &ok);
        if (st != KVO_OK) {
            /* kvo_strerror(KVO_EINTR) is "interrupted" */
            fprintf(stderr, "kvo-check: mutants: %s\n", kvo_strerror(st));
            return KVO_EXIT_USAGE;
        }
        if (!ok) {
            fprintf(stderr, "kvo-check: mutants: some mutant did not behave "
                            "as expected (BAD rows above)\n");
            return KVO_EXIT_FAIL;
        }
        printf("every mutant behaved as expected\n");
        return KVO_EXIT_OK;
    }

    if (o.load_only_set && !c->load) {
        fprintf(stderr, "kvo-check: --concurrency, --arrival and --time-scale "
                        "need --load\n");
        return KVO_EXIT_USAGE;
    }
    bool kills = c->relay_restart_at >= 0 || c->indexer_restart_at >= 0 ||
                 c->engine_restart_at >= 0 || c->nats_kill_at >= 0 || c->chaos;
    if (kills && c->load) {
        fprintf(stderr, "kvo-check: the fault options (--relay-restart-at, "
                        "--indexer-restart-at, --engine-restart-at, "
                        "--nats-kill-at, --chaos) are for lockstep runs (not "
                        "with --load)\n");
        return KVO_EXIT_USAGE;
    }
    if (c->indexer_api == CHECK_API_DYNAMO &&
        (kills || c->nats || c->nats_cluster > 1 || c->drop_seq >= 0 ||
         c->extra_block_seq >= 0)) {
        fprintf(stderr, "kvo-check: with --indexer-api dynamo the indexer "
                        "reads the engines' ZMQ itself: no relays and no "
                        "NATS, so no --nats, --nats-cluster, --drop-seq, "
                        "--extra-block-seq or fault options\n");
        return KVO_EXIT_USAGE;
    }
    /* the run keeps them in fixed fields: a longer one is refused, not cut */
    if ((c->model && strlen(c->model) >= CHECK_MODEL_MAX) ||
        (c->model_name && strlen(c->model_name) >= CHECK_MODEL_MAX)) {
        fprintf(stderr,
                "kvo-check: --model and --model-name take at most %d "
                "bytes\n",
                CHECK_MODEL_MAX - 1);
        return KVO_EXIT_USAGE;
    }
    if (c->model_name && c->indexer_api != CHECK_API_DYNAMO) {
        fprintf(stderr, "kvo-check: --model-name is for --indexer-api "
                        "dynamo\n");
        return KVO_EXIT_USAGE;
    }
    if (c->nats_cluster > 1 && (c->nats || !c->spawn)) {
        fprintf(stderr, "kvo-check: --nats-cluster starts the servers: it "
                        "needs --spawn and no --nats\n");
        return KVO_EXIT_USAGE;
    }
    if (kills && !c->spawn) {
        fprintf(stderr, "kvo-check: the fault options kill processes "
                        "kvo-check started: they need --spawn\n");
        return KVO_EXIT_USAGE;
    }
    if (c->load && c->reset_at >= 0) {
        fprintf(stderr, "kvo-check: --reset-at is for lockstep runs (the "
                        "engines must be idle; not with --load)\n");
        return KVO_EXIT_USAGE;
    }
    if ((c->lora_fraction > 0) != (c->lora_adapters > 0)) {
        fprintf(stderr, "kvo-check: --lora-adapters N and --lora-fraction F "
                        "go together\n");
        return KVO_EXIT_USAGE;
    }
    if (!c->spawn &&
        (c->lora_adapters || c->kv_groups || c->cpu_offload_blocks)) {
        fprintf(stderr, "kvo-check: --lora-adapters, --kv-groups and "
                        "--cpu-offload-blocks configure spawned engines "
                        "(--spawn)\n");
        return KVO_EXIT_USAGE;
    }
    if (!c->spawn && !c->engines) {
        fprintf(stderr, "kvo-check: give --spawn or --engines URL,... (see "
                        "--help)\n");
        return KVO_EXIT_USAGE;
    }
    if (c->spawn && c->engines) {
        fprintf(stderr, "kvo-check: --spawn and --engines exclude each "
                        "other\n");
        return KVO_EXIT_USAGE;
    }
    if (!c->trace) {
        fprintf(stderr, "kvo-check: --trace FILE is required\n");
        return KVO_EXIT_USAGE;
    }
    kvo_info("kvo-check %s: trace %s limit %llu %s", KVO_VERSION, c->trace,
             (unsigned long long)c->limit, c->spawn ? "spawn" : c->engines);

    check_result *res = NULL;
    kvo_err err = {0};
    kvo_status st = check_result_new(&res);
    if (st == KVO_OK) st = check_run(c, res, &err);
    int code;
    const char *cause;
    if (st != KVO_OK) {
        fprintf(stderr, "kvo-check: %s\n",
                err.msg[0] ? err.msg : kvo_strerror(st));
        code = KVO_EXIT_USAGE;
    } else {
        if (!o.quiet) check_report_summary(stdout, res, o.worst);
        if (c->report_json) printf("JSON report: %s\n", c->report_json);
        if (c->report_html) printf("HTML report: %s\n", c->report_html);
        fflush(stdout);
        if (check_result_passed(res, &cause)) {
            code = KVO_EXIT_OK;
        } else {
            fprintf(stderr, "kvo-check: FAIL: %s\n", cause);
            code = KVO_EXIT_FAIL;
        }
    }
    check_result_free(res);
    return code;
}
