/* hash.h — the router's own block hashes; one definition shared by ingest (events) and score
 * (queries), so the two always agree.
 *
 * - Namespace seed: xxh3-64 of (model, lora_name); blocks of different namespaces never
 *   share a content hash (and so never match).
 * - Content hash of a block: xxh3-64 over its token ids as u32 little-endian, seeded by the
 *   namespace seed.
 * - Chain hash of the prefix ending at a block: a cheap mix of the parent's chain hash and the
 *   block's content hash (position 0 mixes with KVR_HASH_CHAIN_ROOT). It is on the query hot
 *   path, so it is an inline multiply-xorshift, not a second xxh3 pass.
 *
 * The engine's own block hash is never compared with these: it only keys removals.
 * Pure functions; any thread.
 */
#ifndef KVR_HASH_H
#define KVR_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVR_HASH_CHAIN_ROOT 0x9e3779b97f4a7c15ull

/* lora == NULL (or lora_len == 0 with lora == NULL) means "no LoRA". */
uint64_t kvr_hash_ns_seed(const char *model, size_t model_len, const char *lora, size_t lora_len);

/* xxh3-64 of tokens[0..n) as little-endian u32, seeded with seed. */
uint64_t kvr_hash_block(uint64_t seed, const uint32_t *tokens, size_t n);

/* Content hashes of n whole blocks of block_size tokens each: out[i] for tokens
 * [i*block_size, (i+1)*block_size). */
void kvr_hash_blocks(uint64_t seed, const uint32_t *tokens, size_t n, uint32_t block_size,
                     uint64_t *out);

static inline uint64_t kvr_hash_chain(uint64_t parent_chain, uint64_t content)
{
    uint64_t x = (parent_chain ^ (content + 0x9e3779b97f4a7c15ull + (parent_chain << 6) +
                                  (parent_chain >> 2)));
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 32;
    return x;
}

#endif
