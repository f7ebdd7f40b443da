/* test_zsub.c — zsub's frames (zsub_frame.c): topic split, seq, replay replies in both eras,
 * malformed frames rejected; fixed cases, then randomized inputs against naive reference
 * parsers (seed printed on failure; KVR_SEED=N reruns one). No sockets.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "zsub.h"

/* Payload frames are opaque to zsub: any bytes do (these are two small msgpack batches). */
static const unsigned char PAYLOAD_ARRAY[] = {0x92, 0xcb, 0x41, 0xd9, 0x00, 0x00, 0x00, 0x00,
                                              0x00, 0x00, 0x90};
static const unsigned char PAYLOAD_MAP[] = {0x93, 0x01, 0x90, 0x00};

static void assert_str(const char *p, size_t n, const char *want)
{
    assert_non_null(p);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(p, want, n);
}

/* ---- fixed cases (moved from test_decode.c with the helpers) ----------------------- */

static void test_topic(void **state)
{
    struct kvr_zsub_topic_parts t;
    (void)state;

#define TOPIC(s) kvr_zsub_topic_split((s), sizeof(s) - 1, &t)
    assert_int_equal(TOPIC("kv@10.0.0.5@Qwen/Qwen3-8B"), 0);
    assert_str(t.pod, t.pod_len, "10.0.0.5");
    assert_str(t.model, t.model_len, "Qwen/Qwen3-8B");
    assert_int_equal(TOPIC("kv@pod-a@org/m@v2@x"), 0); /* model keeps its '@' */
    assert_str(t.pod, t.pod_len, "pod-a");
    assert_str(t.model, t.model_len, "org/m@v2@x");
    assert_int_equal(TOPIC("kv@10.0.0.5:5557@m"), 0);
    assert_str(t.pod, t.pod_len, "10.0.0.5:5557");
    assert_int_equal(TOPIC("kv@p@m"), 0);
    assert_int_equal(TOPIC("kv@p@@"), 0);
    assert_str(t.model, t.model_len, "@");
    assert_int_equal(TOPIC("kv@@model"), -EINVAL);
    assert_int_equal(TOPIC("kv@pod@"), -EINVAL);
    assert_int_equal(TOPIC("kv@pod"), -EINVAL);
    assert_int_equal(TOPIC("kv@"), -EINVAL);
    assert_int_equal(TOPIC("kv@@"), -EINVAL);
    assert_int_equal(TOPIC("kv"), -EINVAL);
    assert_int_equal(TOPIC(""), -EINVAL);
    assert_int_equal(TOPIC("kv-events"), -EINVAL);
    assert_int_equal(TOPIC("KV@p@m"), -EINVAL);
    assert_int_equal(TOPIC("xkv@p@m"), -EINVAL);
    assert_int_equal(TOPIC("kv@p\0q@m"), -EINVAL);
    assert_int_equal(TOPIC("kv@p@m\0"), -EINVAL);
    assert_int_equal(kvr_zsub_topic_split(NULL, 0, &t), -EINVAL);
    /* the length is honoured, no NUL needed */
    assert_int_equal(kvr_zsub_topic_split("kv@p@modelXYZ", 9, &t), 0);
    assert_str(t.model, t.model_len, "mode");
#undef TOPIC
}

static void test_seq(void **state)
{
    uint64_t s = 0;
    (void)state;
    assert_int_equal(kvr_zsub_seq("\x00\x00\x00\x00\x00\x00\x00\x2a", 8, &s), 0);
    assert_true(s == 42);
    assert_int_equal(kvr_zsub_seq("\x01\x02\x03\x04\x05\x06\x07\x08", 8, &s), 0);
    assert_true(s == 0x0102030405060708ull);
    assert_int_equal(kvr_zsub_seq("\xff\xff\xff\xff\xff\xff\xff\xff", 8, &s), 0);
    assert_true(s == KVR_ZSUB_SEQ_END);
    s = 7;
    assert_int_equal(kvr_zsub_seq("\x00\x00\x00\x00\x00\x00\x2a", 7, &s), -EINVAL);
    assert_int_equal(kvr_zsub_seq("\x00\x00\x00\x00\x00\x00\x00\x00\x2a", 9, &s), -EINVAL);
    assert_int_equal(kvr_zsub_seq("", 0, &s), -EINVAL);
    assert_true(s == 7);
}

static void test_replay(void **state)
{
    static const char topic[] = "kv@p@m";
    static const char seq42[8] = {0, 0, 0, 0, 0, 0, 0, 42};
    static const char end[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    const void *pl = NULL;
    size_t pn = 0;
    uint64_t s = 0;
    (void)state;

    {   /* v0.9 – v0.24: [empty, seq, payload] */
        const void *f[] = {"", seq42, PAYLOAD_ARRAY};
        size_t l[] = {0, 8, sizeof(PAYLOAD_ARRAY)};
        assert_int_equal(kvr_zsub_replay_reply(f, l, 3, &s, &pl, &pn), 0);
        assert_true(s == 42);
        assert_ptr_equal(pl, PAYLOAD_ARRAY);
        assert_int_equal(pn, sizeof(PAYLOAD_ARRAY));
    }
    {   /* v0.9 – v0.24 end marker */
        const void *f[] = {"", end, ""};
        size_t l[] = {0, 8, 0};
        assert_int_equal(kvr_zsub_replay_reply(f, l, 3, &s, &pl, &pn), 0);
        assert_true(s == KVR_ZSUB_SEQ_END);
        assert_int_equal(pn, 0);
    }
    {   /* v0.25+: [empty, topic, seq, payload] */
        const void *f[] = {"", topic, seq42, PAYLOAD_MAP};
        size_t l[] = {0, sizeof(topic) - 1, 8, sizeof(PAYLOAD_MAP)};
        assert_int_equal(kvr_zsub_replay_reply(f, l, 4, &s, &pl, &pn), 0);
        assert_true(s == 42);
        assert_ptr_equal(pl, PAYLOAD_MAP);
        assert_int_equal(pn, sizeof(PAYLOAD_MAP));
    }
    {   /* v0.25+ end marker: empty topic, ff×8, empty payload (NULL frame pointers too) */
        const void *f[] = {NULL, NULL, end, NULL};
        size_t l[] = {0, 0, 8, 0};
        s = 0;
        assert_int_equal(kvr_zsub_replay_reply(f, l, 4, &s, &pl, &pn), 0);
        assert_true(s == KVR_ZSUB_SEQ_END);
        assert_int_equal(pn, 0);
    }
    {   /* bad shapes */
        const void *f[] = {"", topic, seq42, PAYLOAD_MAP, ""};
        size_t l[] = {0, sizeof(topic) - 1, 8, sizeof(PAYLOAD_MAP), 0};
        assert_int_equal(kvr_zsub_replay_reply(f, l, 5, &s, &pl, &pn), -EINVAL);
        assert_int_equal(kvr_zsub_replay_reply(f + 2, l + 2, 2, &s, &pl, &pn), -EINVAL);
        assert_int_equal(kvr_zsub_replay_reply(f, l, 0, &s, &pl, &pn), -EINVAL);
        /* 4 frames whose seq slot is the topic */
        assert_int_equal(kvr_zsub_replay_reply(f + 1, l + 1, 4, &s, &pl, &pn), -EINVAL);
        const void *g[] = {"x", seq42, PAYLOAD_MAP}; /* non-empty delimiter */
        size_t gl[] = {1, 8, sizeof(PAYLOAD_MAP)};
        assert_int_equal(kvr_zsub_replay_reply(g, gl, 3, &s, &pl, &pn), -EINVAL);
        const void *h[] = {"", seq42, PAYLOAD_MAP}; /* 7- and 9-byte seq */
        size_t hl[] = {0, 7, sizeof(PAYLOAD_MAP)};
        assert_int_equal(kvr_zsub_replay_reply(h, hl, 3, &s, &pl, &pn), -EINVAL);
        hl[1] = 9;
        assert_int_equal(kvr_zsub_replay_reply(h, hl, 3, &s, &pl, &pn), -EINVAL);
    }
}

/* ---- randomized, against naive references ------------------------------------------ */

static unsigned g_seed;

static unsigned seed_from_env(void)
{
    const char *s = getenv("KVR_SEED");
    return s != NULL ? (unsigned)strtoul(s, NULL, 10) : 20261125u;
}

/* A character-by-character reading of the topic rule: "kv@", pod up to the first '@',
 * the rest is the model; no NUL anywhere; neither part empty. */
static int ref_topic(const unsigned char *s, size_t len, size_t *pod_off, size_t *pod_len,
                     size_t *model_off, size_t *model_len)
{
    int state = 0; /* 0..2: prefix, 3: pod, 4: model */
    size_t at = 0;

    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\0')
            return -EINVAL;
        if (state < 3) {
            if (s[i] != "kv@"[state])
                return -EINVAL;
            state++;
        } else if (state == 3 && s[i] == '@') {
            at = i;
            state = 4;
        }
    }
    if (state != 4 || at == 3 || at + 1 == len)
        return -EINVAL;
    *pod_off = 3;
    *pod_len = at - 3;
    *model_off = at + 1;
    *model_len = len - at - 1;
    return 0;
}

static size_t rand_frame(unsigned char *buf, size_t cap)
{
    static const char alpha[] = "kv@@@a/.:-\0Kx";
    size_t n = (size_t)rand() % cap;
    size_t i = 0;

    if (rand() % 2 == 0 && n >= 3) { /* usually the right prefix */
        memcpy(buf, "kv@", 3);
        i = 3;
    }
    for (; i < n; i++)
        buf[i] = rand() % 8 == 0 ? (unsigned char)rand() : (unsigned char)alpha[rand() % 13];
    return n;
}

static void test_topic_random(void **state)
{
    unsigned char buf[24];
    size_t ok = 0;
    (void)state;

    g_seed = seed_from_env();
    srand(g_seed);
    for (int iter = 0; iter < 200000; iter++) {
        size_t n = rand_frame(buf, sizeof(buf));
        struct kvr_zsub_topic_parts t;
        size_t po = 0, pl = 0, mo = 0, ml = 0;
        int want = ref_topic(buf, n, &po, &pl, &mo, &ml);
        int got = kvr_zsub_topic_split(buf, n, &t);

        if (got != want)
            fail_msg("seed %u iter %d: topic of %zu bytes: got %d want %d", g_seed, iter, n, got,
                     want);
        if (got != 0)
            continue;
        ok++;
        if (t.pod != (const char *)buf + po || t.pod_len != pl ||
            t.model != (const char *)buf + mo || t.model_len != ml)
            fail_msg("seed %u iter %d: topic split at the wrong place", g_seed, iter);
    }
    assert_true(ok > 1000); /* the generator does reach valid topics */
}

static void test_seq_random(void **state)
{
    unsigned char buf[12];
    (void)state;

    g_seed = seed_from_env();
    srand(g_seed);
    for (int iter = 0; iter < 100000; iter++) {
        size_t n = (size_t)rand() % 11;
        uint64_t got = 0xdeadbeef, want = 0;
        int rc;

        for (size_t i = 0; i < n; i++)
            buf[i] = (unsigned char)rand();
        for (size_t i = 0; i < n && n == 8; i++)
            want = want * 256u + buf[i];
        rc = kvr_zsub_seq(buf, n, &got);
        if (rc != (n == 8 ? 0 : -EINVAL))
            fail_msg("seed %u iter %d: seq of %zu bytes: rc %d", g_seed, iter, n, rc);
        if (rc == 0 && got != want)
            fail_msg("seed %u iter %d: seq %llx want %llx", g_seed, iter,
                     (unsigned long long)got, (unsigned long long)want);
        if (rc != 0 && got != 0xdeadbeef)
            fail_msg("seed %u iter %d: a rejected seq wrote its output", g_seed, iter);
    }
}

static void test_replay_random(void **state)
{
    static unsigned char bytes[8][16];
    (void)state;

    g_seed = seed_from_env();
    srand(g_seed);
    for (int iter = 0; iter < 100000; iter++) {
        size_t nf = (size_t)rand() % 7, is = nf == 4 ? 2 : 1;
        const void *f[8];
        size_t l[8];
        uint64_t seq = 0, wseq = 0;
        const void *pl = NULL;
        size_t pn = 0;
        int want = 0, got;

        for (size_t i = 0; i < nf; i++) {
            /* mostly the right shape: empty delimiter, 8-byte seq */
            l[i] = rand() % 4 == 0 ? (size_t)rand() % 16 : i == 0 ? 0 : i == is ? 8
                                                                               : (size_t)rand() % 16;
            for (size_t k = 0; k < l[i]; k++)
                bytes[i][k] = (unsigned char)rand();
            f[i] = l[i] == 0 && rand() % 2 ? NULL : bytes[i];
        }
        if (nf != 3 && nf != 4)
            want = -EINVAL;
        else if (l[0] != 0 || l[is] != 8 || f[is] == NULL)
            want = -EINVAL;
        for (size_t k = 0; want == 0 && k < 8; k++)
            wseq = wseq * 256u + ((const unsigned char *)f[is])[k];
        got = kvr_zsub_replay_reply(f, l, nf, &seq, &pl, &pn);
        if (got != want)
            fail_msg("seed %u iter %d: reply of %zu frames: got %d want %d", g_seed, iter, nf,
                     got, want);
        if (got == 0 && (seq != wseq || pl != f[is + 1] || pn != l[is + 1]))
            fail_msg("seed %u iter %d: reply parsed wrong", g_seed, iter);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topic),
        cmocka_unit_test(test_seq),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_topic_random),
        cmocka_unit_test(test_seq_random),
        cmocka_unit_test(test_replay_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
