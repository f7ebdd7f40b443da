/* test_hash.c — content hash, namespace seed and chain hash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "index/hash.h"

static void test_block_is_xxh3_of_le_u32(void **state)
{
    (void)state;
    uint32_t tok[37];
    unsigned char le[sizeof(tok)];
    for (int i = 0; i < 37; i++) {
        tok[i] = 0x01020304u * (uint32_t)(i + 1) + 0xdeadu;
        le[4 * i] = (unsigned char)tok[i];
        le[4 * i + 1] = (unsigned char)(tok[i] >> 8);
        le[4 * i + 2] = (unsigned char)(tok[i] >> 16);
        le[4 * i + 3] = (unsigned char)(tok[i] >> 24);
    }
    for (size_t n = 0; n <= 37; n += 5)
        assert_true(kvr_hash_block(1337, tok, n) == XXH3_64bits_withSeed(le, 4 * n, 1337));
    /* the seed matters */
    assert_true(kvr_hash_block(1, tok, 16) != kvr_hash_block(2, tok, 16));
}

static void test_blocks_matches_block(void **state)
{
    (void)state;
    uint32_t tok[64];
    uint64_t out[4];
    for (int i = 0; i < 64; i++)
        tok[i] = (uint32_t)i * 7u;
    kvr_hash_blocks(99, tok, 4, 16, out);
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == kvr_hash_block(99, tok + 16 * i, 16));
}

static void test_ns_seed(void **state)
{
    (void)state;
    uint64_t a = kvr_hash_ns_seed("m", 1, NULL, 0);
    assert_true(a == kvr_hash_ns_seed("m", 1, "", 0)); /* empty LoRA = none */
    assert_true(a != kvr_hash_ns_seed("m", 1, "x", 1));
    assert_true(kvr_hash_ns_seed("ab", 2, NULL, 0) != kvr_hash_ns_seed("a", 1, "b", 1));
    assert_true(kvr_hash_ns_seed("a", 1, "b", 1) != kvr_hash_ns_seed("b", 1, "a", 1));
    assert_true(a == kvr_hash_ns_seed("m", 1, NULL, 0)); /* pure */
}

static void test_chain(void **state)
{
    (void)state;
    /* deterministic, order sensitive */
    uint64_t x = kvr_hash_chain(kvr_hash_chain(KVR_HASH_CHAIN_ROOT, 1), 2);
    uint64_t y = kvr_hash_chain(kvr_hash_chain(KVR_HASH_CHAIN_ROOT, 2), 1);
    assert_true(x != y);
    assert_true(x == kvr_hash_chain(kvr_hash_chain(KVR_HASH_CHAIN_ROOT, 1), 2));
    /* prefixes that differ in one block never collide at any later position, whatever
     * follows (the index's SGLang case) */
    uint64_t c[64];
    for (int i = 0; i < 64; i++)
        c[i] = XXH3_64bits(&i, sizeof(i));
    for (int d = 0; d < 64; d += 3) {
        uint64_t a = KVR_HASH_CHAIN_ROOT, b = KVR_HASH_CHAIN_ROOT;
        for (int i = 0; i < 64; i++) {
            a = kvr_hash_chain(a, c[i]);
            b = kvr_hash_chain(b, i == d ? c[i] ^ 0x100 : c[i]);
            if (i >= d)
                assert_true(a != b);
            else
                assert_true(a == b);
        }
    }
}


/* Extra-key folds: the documented xxh3 encoding (tag, le64 length, bytes, le64 offset),
 * kinds and order matter, and the query fold follows vLLM's overlap rule. */
static void test_extra_keys(void **state)
{
    uint64_t h = 0x1234, want;
    unsigned char b[64];
    (void)state;

    /* 's', le64(3), "abc" seeded with h */
    b[0] = 's';
    memset(b + 1, 0, 8);
    b[1] = 3;
    memcpy(b + 9, "abc", 3);
    want = XXH3_64bits_withSeed(b, 12, h);
    assert_true(kvr_hash_xk_str(h, "abc", 3) == want);
    /* 'm', le64(2), "id", le64(-3) */
    b[0] = 'm';
    memset(b + 1, 0, 8);
    b[1] = 2;
    memcpy(b + 9, "id", 2);
    memset(b + 11, 0xff, 8);
    b[11] = 0xfd;
    want = XXH3_64bits_withSeed(b, 19, h);
    assert_true(kvr_hash_xk_media(h, "id", 2, -3) == want);
    /* kinds and order are part of the key */
    assert_true(kvr_hash_xk_str(h, "id", 2) != kvr_hash_xk_bytes(h, "id", 2));
    assert_true(kvr_hash_xk_str(h, "id", 2) != h);
    assert_true(kvr_hash_xk_media(h, "id", 2, 0) != kvr_hash_xk_media(h, "id", 2, 1));
    assert_true(kvr_hash_xk_str(kvr_hash_xk_str(h, "a", 1), "b", 1) !=
                kvr_hash_xk_str(kvr_hash_xk_str(h, "b", 1), "a", 1));
    assert_true(kvr_hash_xk_int(h, 1) != kvr_hash_xk_other(h));

    /* query fold: 3 blocks of 4; media [2, 7) covers blocks 0 and 1; salt on block 0 */
    uint64_t c[3] = {10, 20, 30}, e[3] = {10, 20, 30};
    struct kvr_hash_media m = {"img", 3, 2, 5};
    kvr_hash_fold_query(c, 3, 4, "s", 1, &m, 1);
    e[0] = kvr_hash_xk_str(kvr_hash_xk_media(e[0], "img", 3, 2), "s", 1);
    e[1] = kvr_hash_xk_media(e[1], "img", 3, -2);
    assert_true(c[0] == e[0] && c[1] == e[1] && c[2] == e[2]);
    /* Dynamo's/SGLang's prefixed form folds as the bare salt */
    uint64_t p1[1] = {10}, p2[1] = {10};
    kvr_hash_fold_query(p1, 1, 4, "dynamo-cache-salt:t", 19, NULL, 0);
    kvr_hash_fold_query(p2, 1, 4, "t", 1, NULL, 0);
    assert_true(p1[0] == p2[0] && p1[0] != 10);
    /* no salt, no media: unchanged (a plain query is the plain hash) */
    kvr_hash_fold_query(c, 3, 4, "", 0, NULL, 0);
    assert_true(c[0] == e[0] && c[1] == e[1] && c[2] == e[2]);
    /* two media in one block, in order */
    uint64_t d[1] = {5};
    struct kvr_hash_media mm[2] = {{"a", 1, 0, 1}, {"b", 1, 2, 9}};
    kvr_hash_fold_query(d, 1, 4, NULL, 0, mm, 2);
    assert_true(d[0] == kvr_hash_xk_media(kvr_hash_xk_media(5, "a", 1, 0), "b", 1, 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_is_xxh3_of_le_u32),
        cmocka_unit_test(test_blocks_matches_block),
        cmocka_unit_test(test_ns_seed),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_extra_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
