/* wire_trace.c -- tokens of Mooncake trace blocks (DESIGN §8).
 *
 * Token j of trace block h is splitmix64's finalizer applied to a mix of
 * (h, j), reduced to the 32,000-token vocabulary. Any fixed function would
 * do; this one is cheap and spreads neighbouring ids. kvo-mocker and
 * kvo-check both call it, so they synthesize identical prompts. */
#include "wire.h"

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint32_t wire_trace_token(uint64_t hash_id, uint32_t j) {
    uint64_t x = mix64(hash_id * 0x9E3779B97F4A7C15ull + j);
    return (uint32_t)(x % WIRE_TRACE_VOCAB);
}
