/* check_traffic.c -- the request dimensions of the event schema (issue 15):
 * which LoRA adapter, tenant salt and multimodal item a request carries.
 *
 * Every choice is a pure function of (--seed, the request's trace line, the
 * options), so a run is reproducible and the lockstep driver, --load, the
 * checkpoint sweeps and the summary all see the same keys for a request
 * without storing them:
 *
 *   adapter  with probability --lora-fraction, one of --lora-adapters N
 *            ("kvo-lora-1" .. "kvo-lora-N", the names spawned engines get
 *            in --lora-modules); sent as the completion's "model" (vLLM's
 *            way to name an adapter) and as the probe's "lora_name".
 *   tenant   with --salt-tenants N, every request: "tenant-0" .. N-1, as
 *            "cache_salt".
 *   item     with probability --mm-fraction, one "mm_items" entry: image k
 *            of MM_IMAGES has a fixed placeholder range (MM_FIRST + k *
 *            MM_STRIDE, MM_LENGTH tokens, off block boundaries) and id
 *            "kvo-img-k"; a prompt too short for it carries none. Equal
 *            prompts with the same image share blocks; with another image,
 *            only the blocks before the item.
 *
 * The router hashes of such a prompt are wire_router_hash_prompt's: what
 * the relay derives from the engine's events.
 */
#include "check_int.h"

#include <stdio.h>
#include <string.h>

/* Images requests draw from, and where image k's placeholders lie. */
#define MM_IMAGES 8
#define MM_FIRST 5
#define MM_STRIDE 24
#define MM_LENGTH 40

/* Independent draws per dimension. */
enum { DRAW_LORA = 1, DRAW_ADAPTER, DRAW_TENANT, DRAW_MM, DRAW_IMAGE };

static uint64_t draw(const check_cfg *c, const check_request *q, int what) {
    return kvo_mix64(kvo_mix64(c->seed ^ 0x6b766f7472616666ull) ^
                     kvo_mix64(q->line * 8 + (uint64_t)what));
}

/* A draw as a fraction in [0, 1). */
static double unit(uint64_t u) { return (double)(u >> 11) * 0x1.0p-53; }

bool check_traffic_any(const check_cfg *c) {
    return (c->lora_adapters && c->lora_fraction > 0) || c->salt_tenants ||
           c->mm_fraction > 0;
}

void check_keys_of(const check_cfg *c, const check_request *q,
                   check_keys *out) {
    memset(out, 0, sizeof(*out));
    if (c->lora_adapters && unit(draw(c, q, DRAW_LORA)) < c->lora_fraction)
        snprintf(out->lora, sizeof(out->lora), "kvo-lora-%u",
                 (unsigned)(draw(c, q, DRAW_ADAPTER) % c->lora_adapters) + 1);
    if (c->salt_tenants)
        snprintf(out->salt, sizeof(out->salt), "tenant-%u",
                 (unsigned)(draw(c, q, DRAW_TENANT) % c->salt_tenants));
    if (c->mm_fraction > 0 && unit(draw(c, q, DRAW_MM)) < c->mm_fraction) {
        unsigned k = (unsigned)(draw(c, q, DRAW_IMAGE) % MM_IMAGES);
        uint64_t off = MM_FIRST + (uint64_t)k * MM_STRIDE;
        if (off + MM_LENGTH <= q->input_length) {
            snprintf(out->mm_id, sizeof(out->mm_id), "kvo-img-%u", k);
            out->mm = (wire_mm_span){off, MM_LENGTH, out->mm_id};
            out->has_mm = true;
        }
    }
}

kvo_status check_keys_json(const check_keys *k, kvo_buf *out) {
    kvo_buf_reset(out);
    kvo_status st = KVO_OK;
    /* the names are ours: [a-z0-9-] only, nothing to escape */
    if (k->salt[0]) st = kvo_buf_printf(out, ",\"cache_salt\":\"%s\"", k->salt);
    if (st == KVO_OK && k->has_mm)
        st = kvo_buf_printf(out,
                            ",\"mm_items\":[{\"offset\":%llu,\"length\":%llu,"
                            "\"hash\":\"%s\"}]",
                            (unsigned long long)k->mm.offset,
                            (unsigned long long)k->mm.length, k->mm_id);
    return st;
}

void check_traffic_count(const check_cfg *c, const check_request *reqs,
                         size_t n, check_traffic_counts *out) {
    memset(out, 0, sizeof(*out));
    if (!check_traffic_any(c)) return;
    for (size_t i = 0; i < n; i++) {
        check_keys k;
        check_keys_of(c, &reqs[i], &k);
        out->lora += k.lora[0] != 0;
        out->salted += k.salt[0] != 0;
        out->mm += k.has_mm;
    }
}
