/* idx_feed.c -- event-plane messages into a tree (DESIGN §6), and the JSON
 * shapes the service and replay share. */
#include "idx.h"

#include <string.h>

size_t idx_prompt_hash(const uint64_t *tokens, size_t n, uint32_t block_size,
                       const char *lora, const char *salt, uint64_t *out) {
    if (block_size == 0) return 0;
    uint64_t seed = wire_router_seed(lora, lora ? strlen(lora) : 0, salt,
                                     salt ? strlen(salt) : 0);
    return wire_router_hash_blocks(tokens, n, block_size, seed, out);
}
