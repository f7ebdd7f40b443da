/* hash.c — the router's block hashes (see hash.h).
 *
 * Namespace seed: xxh3-64 over an unambiguous encoding of (model, lora):
 *   le64(model_len) model le64(lora_len + 1 or 0) lora
 * so ("a", "b") and ("ab", NULL) differ. An empty LoRA name is the same as none (NULL): events
 * and queries spell "no adapter" either way. Content hash: xxh3-64 of the block's
 * token ids as u32 little-endian (on little-endian hosts the array is hashed in place; on
 * big-endian hosts it is byte-swapped through a small stack buffer, never allocated).
 * Extra-key folds: h' = xxh3-64 over tag byte, le64(length), the bytes (media: then le64 of
 * the offset), seeded with h. The tags ('s' str, 'm' media, 'b' bytes, 'i' int, 'x' other)
 * keep a salt from ever equalling a media id or an embeddings digest with the same bytes.
 * Pure functions, any thread.
 */
#include "index/hash.h"

#include <stdbool.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation */
#include <xxhash.h>

static void put_le64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

uint64_t kvr_hash_ns_seed(const char *model, size_t model_len, const char *lora, size_t lora_len)
{
    XXH3_state_t st;
    unsigned char len[8];

    XXH3_64bits_reset(&st);
    put_le64(len, (uint64_t)model_len);
    XXH3_64bits_update(&st, len, sizeof(len));
    if (model_len > 0)
        XXH3_64bits_update(&st, model, model_len);
    if (lora == NULL)
        lora_len = 0;
    put_le64(len, lora_len == 0 ? 0 : (uint64_t)lora_len + 1);
    XXH3_64bits_update(&st, len, sizeof(len));
    if (lora_len > 0)
        XXH3_64bits_update(&st, lora, lora_len);
    return XXH3_64bits_digest(&st);
}

uint64_t kvr_hash_block(uint64_t seed, const uint32_t *tokens, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return XXH3_64bits_withSeed(tokens, n * sizeof(uint32_t), seed);
#else
    XXH3_state_t st;
    unsigned char buf[1024];

    XXH3_64bits_reset_withSeed(&st, seed);
    while (n > 0) {
        size_t k = n < sizeof(buf) / 4 ? n : sizeof(buf) / 4;
        for (size_t i = 0; i < k; i++) {
            uint32_t t = tokens[i];
            buf[4 * i] = (unsigned char)t;
            buf[4 * i + 1] = (unsigned char)(t >> 8);
            buf[4 * i + 2] = (unsigned char)(t >> 16);
            buf[4 * i + 3] = (unsigned char)(t >> 24);
        }
        XXH3_64bits_update(&st, buf, 4 * k);
        tokens += k;
        n -= k;
    }
    return XXH3_64bits_digest(&st);
#endif
}

void kvr_hash_blocks(uint64_t seed, const uint32_t *tokens, size_t n, uint32_t block_size,
                     uint64_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = kvr_hash_block(seed, tokens + i * (size_t)block_size, block_size);
}

static uint64_t xk_fold(uint64_t h, unsigned char tag, const void *b, size_t n, bool has_off,
                        int64_t off)
{
    XXH3_state_t st;
    unsigned char hdr[9];

    XXH3_64bits_reset_withSeed(&st, h);
    hdr[0] = tag;
    put_le64(hdr + 1, (uint64_t)n);
    XXH3_64bits_update(&st, hdr, sizeof(hdr));
    if (n > 0)
        XXH3_64bits_update(&st, b, n);
    if (has_off) {
        put_le64(hdr, (uint64_t)off);
        XXH3_64bits_update(&st, hdr, 8);
    }
    return XXH3_64bits_digest(&st);
}

uint64_t kvr_hash_xk_str(uint64_t h, const char *s, size_t n)
{
    return xk_fold(h, 's', s, n, false, 0);
}

uint64_t kvr_hash_xk_media(uint64_t h, const char *id, size_t n, int64_t offset)
{
    return xk_fold(h, 'm', id, n, true, offset);
}

uint64_t kvr_hash_xk_bytes(uint64_t h, const void *b, size_t n)
{
    return xk_fold(h, 'b', b, n, false, 0);
}

uint64_t kvr_hash_xk_int(uint64_t h, int64_t v)
{
    unsigned char b[8];
    put_le64(b, (uint64_t)v);
    return xk_fold(h, 'i', b, 8, false, 0);
}

uint64_t kvr_hash_xk_other(uint64_t h)
{
    return xk_fold(h, 'x', NULL, 0, false, 0);
}

#define SALT_PREFIX "dynamo-cache-salt:" /* decode.c reads the same prefix in events */

void kvr_hash_fold_query(uint64_t *content, size_t n, uint32_t block_size, const char *salt,
                         size_t salt_len, const struct kvr_hash_media *m, size_t nm)
{
    size_t j = 0; /* first item that does not end before the current block */

    for (size_t i = 0; i < n && nm > 0; i++) {
        uint64_t start = (uint64_t)i * block_size, end = start + block_size;
        while (j < nm && m[j].offset + m[j].length <= start)
            j++;
        for (size_t k = j; k < nm && m[k].offset < end; k++)
            if (m[k].offset + m[k].length > start)
                content[i] = kvr_hash_xk_media(content[i], m[k].id, m[k].id_len,
                                               (int64_t)m[k].offset - (int64_t)start);
    }
    if (salt != NULL && salt_len > sizeof(SALT_PREFIX) - 1 &&
        memcmp(salt, SALT_PREFIX, sizeof(SALT_PREFIX) - 1) == 0) {
        salt += sizeof(SALT_PREFIX) - 1;
        salt_len -= sizeof(SALT_PREFIX) - 1;
    }
    if (n > 0 && salt != NULL && salt_len > 0)
        content[0] = kvr_hash_xk_str(content[0], salt, salt_len);
}
