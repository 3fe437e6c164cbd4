/* bench_wire.c -- kvo-bench-wire: KVEventBatch decode and encode throughput
 * next to baselines measured on the same bytes in the same run.
 *
 * Workload: one realistic batch = 32 BlockStored events, each 16 blocks of
 * 16 tokens (16 u64 hashes, 256 token ids drawn below a 151,936-token
 * vocabulary -- Qwen's: ids take 1, 2 and 4 bytes at random -- or --vocab N
 * (32000: the trace prompts of kvo-mocker, 2 bytes each), a chained parent,
 * extra_keys [None] * 16, group_idx 0, kv_cache_spec_kind "full_attention"),
 * from splitmix64 seeded with 1, in the map layout (vLLM >= 0.24) and the
 * array-v0.14 layout.
 *
 * Rows, per layout (each the median of --runs rounds of --iters calls; a
 * round times every row once, so load drift hits all rows alike):
 *   memcpy            copy the payload into another buffer
 *   msgpack unpack    msgpack_unpack() into a long-lived zone cleared per
 *                     call
 *   msgpack next      msgpack_unpack_next() into a reused msgpack_unpacked
 *                     (a fresh zone per call); the baseline is the faster
 *   precheck          wire_precheck alone
 *   precheck+unpack   what a msgpack-c based decoder costs before it even
 *                     converts anything
 *   decode            wire_batch_decode (pre-check + direct decode into a
 *                     reused wire_batch)
 *   msgpack pack      msgpack-c's packer writing the same bytes as encode,
 *                     at its cheapest: room reserved once per batch, a
 *                     write callback that only copies (no memcpy call for
 *                     the <= 9 bytes of one value)
 *   encode            wire_batch_encode into a reused kvo_buf
 * Times are this thread's CPU time. MB/s is payload bytes per second;
 * events/s counts events; "x unpack" is the time relative to msgpack-c's
 * faster entry point (goal for decode: <= 2); "x pack" the time relative
 * to msgpack pack (the encoder writes msgpack directly because the packer
 * stayed several times slower, see wire_batch.c). A checksum over what every
 * decode produced proves the work was done (and equal between runs).
 */
#include "kvo.h"
#include "wire.h"
#include "wire_int.h"

#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_EVENTS 32
#define N_BLOCKS 16
#define BLOCK_TOKENS 16

static uint64_t rng_state = 1;
static uint32_t vocab = 151936; /* --vocab */

static uint64_t splitmix64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ z >> 27) * 0x94D049BB133111EBull;
    return z ^ z >> 31;
}

/* Builds the workload batch (storage owned by the arena of b). */
static void build_batch(wire_batch *b) {
    wire_batch_init(b);
    b->ts = 1760000000.25;
    b->batch_len = 3;
    b->dp_rank = (wire_int){true, 0};
    b->n_events = N_EVENTS;
    b->events = kvo_arena_alloc(&b->arena, N_EVENTS * sizeof(wire_event));
    static uint8_t extra[3 + N_BLOCKS];
    extra[0] = 0xdc, extra[1] = 0, extra[2] = N_BLOCKS;
    memset(extra + 3, 0xc0, N_BLOCKS);
    uint64_t parent = 0;
    for (int e = 0; e < N_EVENTS; e++) {
        wire_event *ev = &b->events[e];
        memset(ev, 0, sizeof(*ev));
        ev->type = WIRE_EV_STORED;
        ev->n_hashes = N_BLOCKS;
        ev->hashes = kvo_arena_alloc(&b->arena, N_BLOCKS * sizeof(wire_hash));
        for (int k = 0; k < N_BLOCKS; k++)
            ev->hashes[k] = (wire_hash){WIRE_HASH_UINT, 0, splitmix64(), NULL};
        ev->parent = e ? (wire_hash){WIRE_HASH_UINT, 0, parent, NULL}
                       : (wire_hash){WIRE_HASH_NONE, 0, 0, NULL};
        parent = ev->hashes[N_BLOCKS - 1].key;
        ev->n_tokens = N_BLOCKS * BLOCK_TOKENS;
        ev->token_ids =
            kvo_arena_alloc(&b->arena, ev->n_tokens * sizeof(uint64_t));
        for (uint32_t t = 0; t < ev->n_tokens; t++)
            ev->token_ids[t] = splitmix64() % vocab;
        ev->block_size = (wire_int){true, BLOCK_TOKENS};
        ev->medium = (wire_str){"GPU", 3};
        ev->extra_keys = (wire_raw){extra, sizeof(extra)};
        ev->group_idx = (wire_int){true, 0};
        ev->kv_cache_spec_kind = (wire_str){"full_attention", 14};
    }
}

/* This thread's CPU time: the machine is shared, and wall time would count
 * the moments another process held the CPU. */
static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One timed step; returns non-zero on failure. */
typedef int (*step_fn)(void *ctx);

/* Time n steps in rounds: each round runs every step for iters calls, so
 * drift in machine load hits all rows alike; the median round is kept.
 * ns[s] = -1 when step s failed. */
static void measure(step_fn *fns, size_t n, void *ctx, long iters, int runs,
                    double *ns) {
    double t[16][64];
    for (size_t s = 0; s < n; s++) { /* warm-up */
        ns[s] = 0;
        for (long i = 0; i < iters / 4 + 1; i++)
            if (fns[s](ctx)) ns[s] = -1;
    }
    for (int r = 0; r < runs; r++) {
        for (size_t s = 0; s < n; s++) {
            if (ns[s] < 0) continue;
            uint64_t t0 = cpu_ns();
            for (long i = 0; i < iters; i++)
                if (fns[s](ctx)) ns[s] = -1;
            t[s][r] = (double)(cpu_ns() - t0) / (double)iters;
        }
    }
    for (size_t s = 0; s < n; s++) {
        if (ns[s] < 0) continue;
        qsort(t[s], (size_t)runs, sizeof(double), cmp_double);
        ns[s] = t[s][runs / 2];
    }
}

typedef struct ctx {
    const uint8_t *payload;
    size_t len;
    uint8_t *copy;
    msgpack_zone zone;
    msgpack_unpacked unpacked;
    wire_batch batch;
    wire_batch src;
    wire_format fmt;
    kvo_buf out;
    volatile uint64_t sink;
} ctx;

/* rotl-xor over every hash key and token of a batch. */
static uint64_t batch_checksum(const wire_batch *b) {
    uint64_t cs = 0;
#define MIX(v) (cs = (cs << 5 | cs >> 59) ^ (uint64_t)(v))
    for (uint32_t e = 0; e < b->n_events; e++) {
        const wire_event *ev = &b->events[e];
        MIX(ev->parent.key);
        for (uint32_t k = 0; k < ev->n_hashes; k++) MIX(ev->hashes[k].key);
        for (uint32_t t = 0; t < ev->n_tokens; t++) MIX(ev->token_ids[t]);
    }
#undef MIX
    return cs;
}

static int step_memcpy(void *p) {
    ctx *c = p;
    memcpy(c->copy, c->payload, c->len);
    c->sink += c->copy[c->len / 2];
    return 0;
}

static int step_unpack_zone(void *p) {
    ctx *c = p;
    msgpack_object obj;
    size_t off = 0;
    msgpack_zone_clear(&c->zone);
    if (msgpack_unpack((const char *)c->payload, c->len, &off, &c->zone,
                       &obj) != MSGPACK_UNPACK_SUCCESS)
        return 1;
    c->sink += obj.via.array.size;
    return 0;
}

static int step_unpack_next(void *p) {
    ctx *c = p;
    size_t off = 0;
    if (msgpack_unpack_next(&c->unpacked, (const char *)c->payload, c->len,
                            &off) != MSGPACK_UNPACK_SUCCESS)
        return 1;
    c->sink += c->unpacked.data.via.array.size;
    return 0;
}

static int step_precheck(void *p) {
    ctx *c = p;
    return wire_precheck(c->payload, c->len, NULL, NULL, NULL) != KVO_OK;
}

static int step_precheck_unpack(void *p) {
    return step_precheck(p) || step_unpack_zone(p);
}

static int step_decode(void *p) {
    ctx *c = p;
    if (wire_batch_decode(c->payload, c->len, NULL, &c->batch, NULL) != KVO_OK)
        return 1;
    c->sink += c->batch.n_events;
    return 0;
}

/* msgpack pack: the write callback of a packer whose room is reserved. */
static int pack_write(void *data, const char *p, size_t n) {
    kvo_buf *b = data;
    uint8_t *d = b->data + b->len;
    b->len += n;
    if (n > 9) {
        memcpy(d, p, n);
        return 0;
    }
    for (size_t i = 0; i < n; i++) /* one int or header: inlined copy */
        d[i] = (uint8_t)p[i];
    return 0;
}

static void pack_key(msgpack_packer *pk, bool map, const char *key) {
    if (map) msgpack_pack_str_with_body(pk, key, strlen(key));
}

static void pack_str(msgpack_packer *pk, wire_str s) {
    if (s.p)
        msgpack_pack_str_with_body(pk, s.p, s.len);
    else
        msgpack_pack_nil(pk);
}

static void pack_int(msgpack_packer *pk, wire_int v) {
    if (v.set)
        msgpack_pack_int64(pk, v.v);
    else
        msgpack_pack_nil(pk);
}

/* The workload's events (BlockStored with int hashes) in the map layout
 * (the keys the encoder writes for them) or array-v0.14. */
static void pack_event(msgpack_packer *pk, kvo_buf *out, bool map,
                       const wire_event *ev) {
    if (map)
        msgpack_pack_map(pk, 11);
    else
        msgpack_pack_array(pk, 8);
    pack_key(pk, map, "type");
    msgpack_pack_str_with_body(pk, "BlockStored", 11);
    pack_key(pk, map, "block_hashes");
    msgpack_pack_array(pk, ev->n_hashes);
    for (uint32_t k = 0; k < ev->n_hashes; k++)
        msgpack_pack_uint64(pk, ev->hashes[k].key);
    pack_key(pk, map, "parent_block_hash");
    if (ev->parent.kind == WIRE_HASH_NONE)
        msgpack_pack_nil(pk);
    else
        msgpack_pack_uint64(pk, ev->parent.key);
    pack_key(pk, map, "token_ids");
    msgpack_pack_array(pk, ev->n_tokens);
    for (uint32_t t = 0; t < ev->n_tokens; t++)
        msgpack_pack_uint64(pk, ev->token_ids[t]);
    pack_key(pk, map, "block_size");
    pack_int(pk, ev->block_size);
    pack_key(pk, map, "lora_id");
    pack_int(pk, ev->lora_id);
    pack_key(pk, map, "medium");
    pack_str(pk, ev->medium);
    pack_key(pk, map, "lora_name");
    pack_str(pk, ev->lora_name);
    if (!map) return;
    pack_key(pk, map, "extra_keys");
    pack_write(out, (const char *)ev->extra_keys.p, ev->extra_keys.len);
    pack_key(pk, map, "group_idx");
    pack_int(pk, ev->group_idx);
    pack_key(pk, map, "kv_cache_spec_kind");
    pack_str(pk, ev->kv_cache_spec_kind);
}

static int step_pack(void *p) {
    ctx *c = p;
    const wire_batch *b = &c->src;
    kvo_buf_reset(&c->out);
    /* an upper bound: 9 bytes per int, 64 per field */
    size_t room = 64;
    for (uint32_t e = 0; e < b->n_events; e++)
        room += 9 * ((size_t)b->events[e].n_hashes + b->events[e].n_tokens) +
                12 * 64 + b->events[e].extra_keys.len;
    if (kvo_buf_reserve(&c->out, room) != KVO_OK) return 1;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &c->out, pack_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, b->ts);
    msgpack_pack_array(&pk, b->n_events);
    for (uint32_t e = 0; e < b->n_events; e++)
        pack_event(&pk, &c->out, c->fmt == WIRE_FMT_MAP, &b->events[e]);
    pack_int(&pk, b->dp_rank);
    return 0;
}

static int step_encode(void *p) {
    ctx *c = p;
    kvo_buf_reset(&c->out);
    return wire_batch_encode(&c->src, c->fmt, 0, &c->out) != KVO_OK;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvo-bench-wire [--iters N] [--runs N] [--vocab N]\n"
            "KVEventBatch decode/encode throughput next to memcpy and\n"
            "msgpack-c unpack of the same bytes (32 BlockStored x 16 blocks\n"
            "x 16 tokens; map and array-v0.14 layouts). Token ids are drawn\n"
            "below --vocab (default 151936).\n");
}

typedef struct opts {
    long iters;
    int runs;
} opts;

static kvo_status set_opt(void *p, int code, const char *arg) {
    opts *o = p;
    uint32_t v;
    switch (code) {
    case 'i':
        if (kvo_parse_u32(arg, &v) != KVO_OK || v == 0) return KVO_EINVAL;
        o->iters = v;
        return KVO_OK;
    case 'r':
        if (kvo_parse_u32(arg, &v) != KVO_OK || v == 0 || v > 63)
            return KVO_EINVAL;
        o->runs = (int)v;
        return KVO_OK;
    case 'v':
        if (kvo_parse_u32(arg, &v) != KVO_OK || v == 0) return KVO_EINVAL;
        vocab = v;
        return KVO_OK;
    case 'h': usage(stdout); exit(KVO_EXIT_OK);
    case 'V': printf("kvo-bench-wire %s\n", KVO_VERSION); exit(KVO_EXIT_OK);
    default: return KVO_EINVAL;
    }
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"iters", required_argument, NULL, 'i'},
        {"runs", required_argument, NULL, 'r'},
        {"vocab", required_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0}};
    opts o = {1000, 9};
    if (kvo_getopt(argc, argv, longopts, set_opt, &o) < 0) {
        usage(stderr);
        return KVO_EXIT_USAGE;
    }
    static const wire_format fmts[] = {WIRE_FMT_MAP, WIRE_FMT_ARRAY_V0_14};
    wire_batch src;
    build_batch(&src);
    printf("workload: %d BlockStored x %d blocks x %d tokens below %" PRIu32
           ", splitmix64 seed 1; %ld calls x %d runs, median\n",
           N_EVENTS, N_BLOCKS, BLOCK_TOKENS, vocab, o.iters, o.runs);
    printf("%-14s %-18s %10s %10s %12s %9s %7s\n", "layout", "step", "ns/call",
           "MB/s", "events/s", "x unpack", "x pack");
    int rc = KVO_EXIT_OK;
    for (size_t f = 0; f < KVO_ARRAY_LEN(fmts); f++) {
        ctx *c = calloc(1, sizeof(*c));
        kvo_buf payload;
        kvo_buf_init(&payload);
        if (!c || wire_batch_encode(&src, fmts[f], 0, &payload) != KVO_OK) {
            fprintf(stderr, "kvo-bench-wire: cannot build the workload\n");
            return KVO_EXIT_FAIL;
        }
        c->payload = payload.data;
        c->len = payload.len;
        c->copy = malloc(payload.len);
        msgpack_zone_init(&c->zone, MSGPACK_ZONE_CHUNK_SIZE);
        msgpack_unpacked_init(&c->unpacked);
        wire_batch_init(&c->batch);
        c->src = src;
        c->fmt = fmts[f];
        kvo_buf_init(&c->out);
        /* The packer baseline must write the very bytes encode writes. */
        if (step_pack(c) || c->out.len != payload.len ||
            memcmp(c->out.data, payload.data, payload.len) != 0) {
            fprintf(stderr, "kvo-bench-wire: msgpack pack differs from "
                            "wire_batch_encode\n");
            return KVO_EXIT_FAIL;
        }

        struct {
            const char *name;
            step_fn fn;
        } steps[] = {
            {"memcpy", step_memcpy},
            {"msgpack unpack", step_unpack_zone},
            {"msgpack next", step_unpack_next},
            {"precheck", step_precheck},
            {"precheck+unpack", step_precheck_unpack},
            {"decode", step_decode},
            {"msgpack pack", step_pack},
            {"encode", step_encode},
        };
        enum { N_STEPS = KVO_ARRAY_LEN(steps) };
        step_fn fns[N_STEPS];
        double ns[N_STEPS];
        for (size_t s = 0; s < N_STEPS; s++) fns[s] = steps[s].fn;
        measure(fns, N_STEPS, c, o.iters, o.runs, ns);
        for (size_t s = 0; s < N_STEPS; s++) {
            if (ns[s] < 0) {
                fprintf(stderr, "kvo-bench-wire: %s failed\n", steps[s].name);
                rc = KVO_EXIT_FAIL;
            }
        }
        /* The baseline is msgpack-c's faster entry point. */
        double base = ns[1] < ns[2] ? ns[1] : ns[2], pack = ns[N_STEPS - 2];
        if (wire_batch_decode(c->payload, c->len, NULL, &c->batch, NULL) !=
            KVO_OK)
            rc = KVO_EXIT_FAIL;
        printf("%-14s %zu bytes per batch, decoded checksum 0x%016" PRIx64 "\n",
               wire_format_name(fmts[f]), c->len, batch_checksum(&c->batch));
        for (size_t s = 0; s < KVO_ARRAY_LEN(steps); s++) {
            double sec = ns[s] / 1e9;
            printf("%-14s %-18s %10.0f %10.1f %12.0f %9.2f %7.2f\n",
                   wire_format_name(fmts[f]), steps[s].name, ns[s],
                   (double)c->len / sec / 1e6, N_EVENTS / sec, ns[s] / base,
                   ns[s] / pack);
        }
        free(c->copy);
        msgpack_zone_destroy(&c->zone);
        msgpack_unpacked_destroy(&c->unpacked);
        wire_batch_fini(&c->batch);
        kvo_buf_fini(&c->out);
        kvo_buf_fini(&payload);
        free(c);
    }
    wire_batch_fini(&src);
    return rc;
}
