/* hash.h — the router's own block hashes; one definition shared by ingest (events) and score
 * (queries), so the two always agree.
 *
 * - Namespace seed: xxh3-64 of (model, lora_name); blocks of different namespaces never
 *   share a content hash (and so never match).
 * - Content hash of a block: xxh3-64 over its token ids as u32 little-endian, seeded by the
 *   namespace seed.
 * - Chain hash of the prefix ending at a block: chain = parent_chain * KVR_HASH_CHAIN_MUL +
 *   content (mod 2^64); position 0 uses KVR_HASH_CHAIN_ROOT as its parent. It is on the query
 *   hot path: one multiply-add per block, and because it is a polynomial in the content hashes
 *   the index can compute the chain at a jump landing from independent multiplies
 *   (chain[p+k] = chain[p]*M^k + sum c[p+i]*M^(k-i)) instead of a serial dependency chain.
 *   Safety: content hashes are xxh3 outputs; two prefixes of equal length that differ in
 *   exactly one block never collide (M is odd, so multiplication by M^j is a bijection), and
 *   prefixes differing in several blocks collide with probability ~2^-64 like any 64-bit hash.
 *   Equal chain hash at equal position is the index's definition of "same prefix".
 * - Extra keys (docs/wire-extra-keys.md): a block the engine hashed with extra keys (media,
 *   cache_salt, prompt embeddings; not the LoRA name, which the namespace already carries)
 *   gets a content hash that folds them in, item by item in the engine's order:
 *   h = content; for each item h = kvr_hash_xk_<kind>(h, item). Each fold hashes a tag, the
 *   item's length-prefixed bytes (and the media offset) seeded by h, so the result equals the
 *   plain content hash only by a 2^-64 accident and depends on the items, their kinds and
 *   their order. The chain hash carries it to every later block (a salted block 0 makes the
 *   whole prefix the tenant's own). Ingest folds what the events carry, score folds what the
 *   query names (cache_salt on block 0, media overlapping each block), with these functions
 *   only, so both sides agree by construction.
 * The engine's own block hash is never compared with these: it only keys removals.
 * Pure functions; any thread.
 */
#ifndef KVR_HASH_H
#define KVR_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVR_HASH_CHAIN_ROOT 0x9e3779b97f4a7c15ull

/* lora == NULL or lora_len == 0 means "no LoRA" (both spell the same namespace). */
uint64_t kvr_hash_ns_seed(const char *model, size_t model_len, const char *lora, size_t lora_len);

/* xxh3-64 of tokens[0..n) as little-endian u32, seeded with seed. */
uint64_t kvr_hash_block(uint64_t seed, const uint32_t *tokens, size_t n);

/* Content hashes of n whole blocks of block_size tokens each: out[i] for tokens
 * [i*block_size, (i+1)*block_size). */
void kvr_hash_blocks(uint64_t seed, const uint32_t *tokens, size_t n, uint32_t block_size,
                     uint64_t *out);

/* Extra-key folds (see above). Strings are bytes (not NUL-terminated); n may be 0. */
uint64_t kvr_hash_xk_str(uint64_t h, const char *s, size_t n);          /* cache_salt, a bare
                                                                          * string key */
uint64_t kvr_hash_xk_media(uint64_t h, const char *id, size_t n, int64_t offset); /* [id,
                                                                          * offset of the media's
                                                                          * start - block start] */
uint64_t kvr_hash_xk_bytes(uint64_t h, const void *b, size_t n);        /* prompt-embeds digest */
uint64_t kvr_hash_xk_int(uint64_t h, int64_t v);                        /* an int key */
uint64_t kvr_hash_xk_other(uint64_t h);  /* any other shape: never produced by a query */

/* A query's media item, as vLLM's MultiModalFeatureSpec: identifier (the media hash the
 * engine puts in its extra keys) and its placeholder range in the prompt's token ids. */
struct kvr_hash_media {
    const char *id;
    size_t id_len;
    uint64_t offset; /* first placeholder token */
    uint64_t length; /* placeholder tokens, >= 1 */
};

/* Folds a query's extra keys into the content hashes of its n whole blocks, as vLLM's
 * generate_block_hash_extra_keys keys them: block i covers tokens [i*bs, (i+1)*bs); every
 * media item overlapping it (offset < end and offset + length > start), in the order given
 * (sorted by offset, not overlapping: the caller validates), folds as
 * kvr_hash_xk_media(id, offset - start); then block 0 folds the salt (NULL or empty: none).
 * A salt written "dynamo-cache-salt:<s>" (Dynamo's and SGLang's form) folds as <s>, as the
 * decoder reads that form in events. */
void kvr_hash_fold_query(uint64_t *content, size_t n, uint32_t block_size, const char *salt,
                         size_t salt_len, const struct kvr_hash_media *m, size_t nm);

/* murmur3's 64-bit finalizer: a bijection that spreads every input bit over the output
 * (the index keys its reverse maps and namespace roots with it). */
static inline uint64_t kvr_hash_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

#define KVR_HASH_CHAIN_MUL 0xff51afd7ed558ccdull /* odd */

static inline uint64_t kvr_hash_chain(uint64_t parent_chain, uint64_t content)
{
    return parent_chain * KVR_HASH_CHAIN_MUL + content;
}

#endif
