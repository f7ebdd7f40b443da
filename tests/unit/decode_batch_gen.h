/* decode_batch_gen.h — builds realistic vLLM KV-event batches with msgpack-c's packer, for
 * test_decode (large batches: zone growth, array32 tokens, no allocation once warm) and
 * bench/bench_decode.c. Header-only, test/bench code, not part of libkvr.
 *
 * gen_batch(): [ts, [nev × BlockStored], dp_rank] where each event has nblk uint64 hashes
 * chained from a parent (nil for event 0), nblk*bs token ids in [0, 152000), medium "GPU",
 * extra_keys [nil × nblk], group_idx 0 and kind "full_attention" — in the v0.24+ map form
 * (msgspec key order, the two None-default fields omitted) or the v0.22 12-element array.
 * Values are a pure function of (seed, event, block, token index): see gen_hash/gen_token.
 */
#ifndef KVR_DECODE_BATCH_GEN_H
#define KVR_DECODE_BATCH_GEN_H

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t gen_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t gen_hash(uint64_t seed, uint32_t ev, uint32_t blk)
{
    return gen_mix(seed ^ ((uint64_t)ev << 32) ^ blk);
}

static inline uint32_t gen_token(uint64_t seed, uint32_t ev, uint64_t i)
{
    return (uint32_t)(gen_mix(~seed ^ ((uint64_t)ev << 40) ^ i) % 152000u);
}

static inline void gen_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* Appends one batch to sb (which the caller initialised). */
static inline void gen_batch(msgpack_sbuffer *sb, uint32_t nev, uint32_t nblk, uint32_t bs,
                             bool map_form, uint64_t seed)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1789095808.8378847);
    msgpack_pack_array(&pk, nev);
    for (uint32_t e = 0; e < nev; e++) {
        if (map_form) {
            msgpack_pack_map(&pk, 11);
            gen_str(&pk, "type");
        } else {
            msgpack_pack_array(&pk, 12);
        }
        gen_str(&pk, "BlockStored");
        if (map_form)
            gen_str(&pk, "block_hashes");
        msgpack_pack_array(&pk, nblk);
        for (uint32_t b = 0; b < nblk; b++)
            msgpack_pack_uint64(&pk, gen_hash(seed, e, b));
        if (map_form)
            gen_str(&pk, "parent_block_hash");
        if (e == 0)
            msgpack_pack_nil(&pk);
        else
            msgpack_pack_uint64(&pk, gen_hash(seed, e - 1, nblk - 1));
        if (map_form)
            gen_str(&pk, "token_ids");
        msgpack_pack_array(&pk, nblk * bs);
        for (uint64_t i = 0; i < (uint64_t)nblk * bs; i++)
            msgpack_pack_uint32(&pk, gen_token(seed, e, i));
        if (map_form)
            gen_str(&pk, "block_size");
        msgpack_pack_uint32(&pk, bs);
        if (map_form)
            gen_str(&pk, "lora_id");
        msgpack_pack_nil(&pk);
        if (map_form)
            gen_str(&pk, "medium");
        gen_str(&pk, "GPU");
        if (map_form)
            gen_str(&pk, "lora_name");
        msgpack_pack_nil(&pk);
        if (map_form)
            gen_str(&pk, "extra_keys");
        msgpack_pack_array(&pk, nblk);
        for (uint32_t b = 0; b < nblk; b++)
            msgpack_pack_nil(&pk);
        if (map_form)
            gen_str(&pk, "group_idx");
        msgpack_pack_uint32(&pk, 0);
        if (map_form)
            gen_str(&pk, "kv_cache_spec_kind");
        gen_str(&pk, "full_attention");
        if (!map_form)
            msgpack_pack_nil(&pk); /* kv_cache_spec_sliding_window */
    }
    msgpack_pack_uint32(&pk, 0);
}

#endif
