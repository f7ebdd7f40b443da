/* test_zsub.c — zsub. First its frames (zsub_frame.c), without sockets: topic split, seq,
 * replay replies in both eras, malformed frames rejected; fixed cases, then randomized
 * inputs against naive reference parsers (seed printed on failure; KVR_SEED=N reruns one).
 * Then zsub on real ZeroMQ sockets on 127.0.0.1 wired to ingest as the daemon does: bad
 * frames counted, replays through a ROUTER in both eras, timeouts, disconnect purges and pod
 * overrides, runtime endpoints, random garbage, IPv6 and bind errors. Every wait is bounded.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "ingest_common.h"
#include "daemon/daemon.h"
#include "events/zsub.h"

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

/* A live seq frame with the publisher id vLLM's snapshot publishers append (PR #57789:
 * 8-byte seq + 16-byte uuid4): read, not dropped as a bad seq. */
static void test_seq_id(void **state)
{
    static const char f24[] = "\x00\x00\x00\x00\x00\x00\x01\x02"
                              "\x8f\x12\x03\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff\x00";
    char big[8 + KVR_ZSUB_PUBID_MAX + 1];
    uint64_t s = 0;
    const void *id = NULL;
    size_t n = 99;
    (void)state;

    assert_int_equal(kvr_zsub_seq_id(f24, 24, &s, &id, &n), 0);
    assert_true(s == 0x102);
    assert_ptr_equal(id, f24 + 8);
    assert_int_equal(n, 16);
    assert_int_equal(kvr_zsub_seq_id(f24, 8, &s, &id, &n), 0); /* no id */
    assert_null(id);
    assert_int_equal(n, 0);
    assert_int_equal(kvr_zsub_seq_id(f24, 9, &s, &id, &n), 0);
    assert_int_equal(n, 1);
    memset(big, 1, sizeof(big));
    assert_int_equal(kvr_zsub_seq_id(big, sizeof(big) - 1, &s, &id, &n), 0);
    assert_int_equal(n, KVR_ZSUB_PUBID_MAX);
    s = 7;
    id = NULL;
    n = 99;
    assert_int_equal(kvr_zsub_seq_id(big, sizeof(big), &s, &id, &n), -EINVAL);
    assert_int_equal(kvr_zsub_seq_id(f24, 7, &s, &id, &n), -EINVAL);
    assert_int_equal(kvr_zsub_seq_id(NULL, 0, &s, &id, &n), -EINVAL);
    assert_true(s == 7 && id == NULL && n == 99);
    /* the writer compares runs by kvr_queue_pubid: equal ids agree, never 0 */
    assert_true(kvr_queue_pubid(f24 + 8, 16) == kvr_queue_pubid(f24 + 8, 16));
    assert_true(kvr_queue_pubid(f24 + 8, 16) != kvr_queue_pubid(f24 + 9, 15));
    assert_true(kvr_queue_pubid("", 0) != 0);
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
            if (rand() % 4 == 0)
                l[i] = (size_t)rand() % 16;
            else
                l[i] = i == 0 ? 0 : i == is ? 8 : (size_t)rand() % 16;
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


/* ---- replay address templates (zsub_tmpl.c) ------------------------------------------- */

static void build_ok(const char *tmpl, const char *pod, uint32_t rank, const char *want)
{
    char out[KVR_ZSUB_ADDR_MAX];
    struct kvr_err err = {{0}};
    int rc = kvr_zsub_template_build(tmpl, pod, rank, out, sizeof(out), &err);
    if (rc != 0)
        fail_msg("%s with pod '%s' rank %u: %d %s", tmpl, pod, rank, rc, err.msg);
    assert_string_equal(out, want);
}

static void build_fails(const char *tmpl, const char *pod, uint32_t rank, int want)
{
    char out[KVR_ZSUB_ADDR_MAX];
    struct kvr_err err = {{0}};
    int rc = kvr_zsub_template_build(tmpl, pod, rank, out, sizeof(out), &err);
    if (rc != want)
        fail_msg("%s with pod '%s' rank %u: got %d, want %d (%s)", tmpl, pod, rank, rc, want,
                 err.msg);
    assert_true(err.msg[0] != '\0');
}

static void test_replay_template(void **state)
{
    struct kvr_err err;
    static const char *const good[] = {
        "tcp://{pod}:{5558+rank}", "tcp://{pod}:5558", "tcp://[{pod}]:{5558+rank}",
        "ipc:///run/vllm/{pod}-{rank}.sock", "tcp://10.0.0.9:{5558+rank}", "tcp://10.0.0.9:5558",
        "tcp://{pod}.engines.svc:{0+rank}1", "tcp://{pod}:{65535+rank}"};
    static const char *const bad[] = {
        "", "{pod}:5558", "http://{pod}:1", "inproc://{pod}", "tcp://{pod}:{5558+rank",
        "tcp://{pod}:5558}", "tcp://{pod}:{x}", "tcp://{pod}:{+rank}", "tcp://{pod}:{rank+1}",
        "tcp://{pod}:{65536+rank}", "tcp://{pod}:{123456+rank}", "tcp://{pod}", "tcp://{pod}:",
        "tcp://{pod}:{rank}", /* port 0 at rank 0 */ "tcp://{pod}:0", "tcp://:{5558+rank}",
        "tcp://{pod}:{5558+rank}x", "tcp://{pod} :5558", "tcp://{Pod}:1", "tcp://{pod}/x:1",
        "tcp://*:{5558+rank}", "ipc://"};
    (void)state;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (kvr_zsub_template_check(good[i], &err) != 0)
            fail_msg("'%s' refused: %s", good[i], err.msg);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(kvr_zsub_template_check(bad[i], &err), -EINVAL);
    assert_true(kvr_zsub_template_uses_pod("tcp://{pod}:1"));
    assert_false(kvr_zsub_template_uses_pod("tcp://h:{1+rank}"));
    assert_false(kvr_zsub_template_uses_pod(NULL));

    /* vLLM's offset: rank r binds replay_endpoint's port + r */
    build_ok("tcp://{pod}:{5558+rank}", "10.0.0.7", 0, "tcp://10.0.0.7:5558");
    build_ok("tcp://{pod}:{5558+rank}", "10.0.0.7", 3, "tcp://10.0.0.7:5561");
    build_ok("tcp://{pod}:{5558+rank}", "fd00::1", 1, "tcp://[fd00::1]:5559");
    build_ok("tcp://[{pod}]:{5558+rank}", "fd00::1", 0, "tcp://[fd00::1]:5558");
    build_ok("tcp://{pod}:{5558+rank}", "vllm-0.vllm.ns.svc.cluster.local", 2,
             "tcp://vllm-0.vllm.ns.svc.cluster.local:5560");
    build_ok("ipc:///run/vllm/{pod}-{rank}.sock", "pod-a", 7, "ipc:///run/vllm/pod-a-7.sock");
    build_ok("tcp://10.0.0.9:5558", "whatever is in the topic", 4, "tcp://10.0.0.9:5558");
    build_ok("tcp://{pod}:{65534+rank}", "h", 1, "tcp://h:65535");
    build_fails("tcp://{pod}:{65534+rank}", "h", 2, -ERANGE);
    build_fails("tcp://{pod}:{5558+rank}", "h", UINT32_MAX, -ERANGE);

    /* hostile pod ids: nothing that is not a host reaches an address */
    static const char *const hostile[] = {
        "", "10.0.0.7:5557", "evil.example:1", "a/b", "../../x", "a@b", "a b", "a\tb", "*",
        "-a", "a-", "a..b", ".a", "a.", "fe80::1%eth0", "[fd00::1]", "a_b", "a%b", "a;b",
        "a{pod}", "\xc3\xa9t\xc3\xa9", "tcp://h:1", "a\nb", "1.2.3.4/8", ":::::::::",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.b" /* 64 */};
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        assert_false(kvr_zsub_pod_is_host(hostile[i], strlen(hostile[i])));
        build_fails("tcp://{pod}:{5558+rank}", hostile[i], 0, -EINVAL);
    }
    {
        char longname[300];
        memset(longname, 'a', sizeof(longname));
        for (size_t i = 63; i < 260; i += 64)
            longname[i] = '.';
        longname[254] = '\0'; /* 254 bytes: one over a DNS name */
        assert_false(kvr_zsub_pod_is_host(longname, 254));
        longname[253] = '\0';
        assert_true(kvr_zsub_pod_is_host(longname, 253) == (longname[252] != '.'));
        /* a host that fits no address buffer: refused, not truncated */
        char out[32];
        assert_int_equal(kvr_zsub_template_build("tcp://{pod}:1", "abcdefghijklmnopqrstuvwxyz",
                                                 0, out, sizeof(out), &err),
                         -ENAMETOOLONG);
    }
    /* a NUL inside the pod (len counts it) is refused */
    assert_false(kvr_zsub_pod_is_host("ab\0c", 4));
    assert_true(kvr_zsub_pod_is_host("10.0.0.7", 8));
    assert_true(kvr_zsub_pod_is_host("::1", 3));
    assert_true(kvr_zsub_pod_is_host("pod-0", 5));
}

/* Independent statement of "a host" for the randomized test: an address inet_pton takes, or
 * dot-separated labels matching [A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?. */
static bool ref_is_host(const char *p)
{
    unsigned char a[16];
    size_t n = strlen(p), start = 0;
    if (n == 0 || n > 253)
        return false;
    if (inet_pton(AF_INET, p, a) == 1 || inet_pton(AF_INET6, p, a) == 1)
        return true;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] != '.')
            continue;
        size_t len = i - start;
        if (len == 0 || len > 63 || !isalnum((unsigned char)p[start]) ||
            !isalnum((unsigned char)p[i - 1]))
            return false;
        for (size_t k = start; k < i; k++)
            if (!isalnum((unsigned char)p[k]) && p[k] != '-')
                return false;
        start = i + 1;
    }
    return true;
}

static void test_replay_template_random(void **state)
{
    static const char alphabet[] = "ab09-.:%/@ *[]{}_\x01\xff";
    (void)state;
    g_seed = seed_from_env();
    printf("test_replay_template_random: seed %u (KVR_SEED)\n", g_seed);
    srand(g_seed);
    for (int iter = 0; iter < 200000; iter++) {
        char pod[80], out[KVR_ZSUB_ADDR_MAX];
        size_t n = (size_t)(rand() % 20);
        struct kvr_err err;
        uint32_t rank = (uint32_t)(rand() % 4);
        for (size_t i = 0; i < n; i++)
            pod[i] = alphabet[rand() % (int)(sizeof(alphabet) - 1)];
        pod[n] = '\0';
        bool want = ref_is_host(pod);
        if (kvr_zsub_pod_is_host(pod, n) != want)
            fail_msg("seed %u iter %d: pod '%s' host=%d, the reference says %d", g_seed, iter,
                     pod, !want, want);
        int rc = kvr_zsub_template_build("tcp://{pod}:{5558+rank}", pod, rank, out, sizeof(out),
                                         &err);
        if ((rc == 0) != want)
            fail_msg("seed %u iter %d: pod '%s' built=%d", g_seed, iter, pod, rc == 0);
        if (rc == 0) {
            char expect[KVR_ZSUB_ADDR_MAX];
            snprintf(expect, sizeof(expect), strchr(pod, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u",
                     pod, 5558 + rank);
            assert_string_equal(out, expect);
        }
    }
}

/* ---- zsub wired to ingest, with real sockets ------------------------------------------ */
/* These cases moved here from test_ingest.c when zsub stopped being created by ingest: they
 * test zsub's job (frames on the wire, the replay client, connection monitoring and
 * disconnect purges, runtime endpoints, binds) end to end, through ingest and the index,
 * with their assertions unchanged. A PUB in the test publishes into the zsub SUB (bound on
 * tcp://127.0.0.1:*, or connecting to the test's PUB). */

static void zsub_metrics(struct fx *f, struct kvr_buf *b)
{
    kvr_zsub_metrics(f->zsub, b);
}

/* Index → ingest → zsub as daemon/main.c does it; on failure nothing is left created. */
static int pipeline_start(const struct kvr_conf *c, struct kvr_index *ix,
                          struct kvr_ingest **ing, struct kvr_zsub **z, struct kvr_err *err)
{
    int rc;

    *ing = NULL;
    *z = NULL;
    rc = kvr_ingest_create(c, ix, ing, err);
    if (rc == 0)
        rc = kvr_daemon_zsub_create(c, NULL, *ing, z, err);
    if (rc == 0)
        rc = kvr_ingest_start(*ing, err);
    if (rc == 0)
        rc = kvr_zsub_start(*z, err);
    if (rc != 0) {
        if (*z != NULL)
            kvr_zsub_stop(*z);
        kvr_ingest_destroy(*ing);
        kvr_zsub_destroy(*z);
        *ing = NULL;
        *z = NULL;
    }
    return rc;
}

/* The daemon's stop order: zsub stops producing, ingest drains and goes, then zsub. */
static void pipeline_stop(struct kvr_ingest *ing, struct kvr_zsub *z)
{
    kvr_zsub_stop(z);
    kvr_ingest_stop(ing);
    kvr_ingest_destroy(ing);
    kvr_zsub_destroy(z);
}

/* Creates index + ingest + zsub wired as daemon/main.c does (kvr_daemon_zsub_create); bind
 * mode unless `bind` is false; tweak edits the config. */
static struct fx *fx_new_conf(bool bind, int64_t purge_after_ms, void (*tweak)(struct kvr_conf *))
{
    struct fx *f = calloc(1, sizeof(*f));
    struct kvr_index_opts io = {0};
    struct kvr_err err = {{0}};
    const char *eps[1];

    conf_defaults(&f->conf);
    if (purge_after_ms >= 0)
        f->conf.purge_after_disconnect_ms = purge_after_ms;
    if (tweak != NULL)
        tweak(&f->conf);
    if (bind) {
        f->bind_list[0] = "tcp://127.0.0.1:*";
        f->conf.bind = f->bind_list;
        f->conf.nbind = 1;
    }
    io.orphan_capacity = 1024;
    assert_int_equal(kvr_index_create(&io, &f->ix), 0);
    assert_int_equal(kvr_index_reader_create(f->ix, &f->rd), 0);
    if (pipeline_start(&f->conf, f->ix, &f->ing, &f->zsub, &err) != 0)
        fail_msg("start: %s", err.msg);
    assert_true(kvr_ingest_ready(f->ing));
    f->more_metrics = zsub_metrics;
    f->zctx = zmq_ctx_new();
    f->pub = zmq_socket(f->zctx, ZMQ_PUB);
    int zero = 0, big = 1000000;
    zmq_setsockopt(f->pub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(f->pub, ZMQ_SNDHWM, &big, sizeof(big));
    if (bind) {
        assert_int_equal(kvr_zsub_bound(f->zsub, eps, 1), 1);
        assert_non_null(strstr(eps[0], "tcp://127.0.0.1:"));
        assert_null(strchr(eps[0] + 16, '*'));
        snprintf(f->ep, sizeof(f->ep), "%s", eps[0]);
        assert_int_equal(zmq_connect(f->pub, f->ep), 0);
    } else {
        size_t len = sizeof(f->ep);
        assert_int_equal(zmq_bind(f->pub, "tcp://127.0.0.1:*"), 0);
        zmq_getsockopt(f->pub, ZMQ_LAST_ENDPOINT, f->ep, &len);
    }
    return f;
}

static struct fx *fx_new(bool bind, int64_t purge_after_ms)
{
    return fx_new_conf(bind, purge_after_ms, NULL);
}

static void fx_free(struct fx *f)
{
    if (f->pub != NULL)
        zmq_close(f->pub);
    zmq_ctx_term(f->zctx);
    pipeline_stop(f->ing, f->zsub);
    kvr_index_reader_destroy(f->rd);
    kvr_index_destroy(f->ix);
    free(f);
}

static void send_frames(void *pub, const void *topic, size_t tlen, const void *seq, size_t slen,
                        const void *payload, size_t plen, int nframes)
{
    assert_true(zmq_send(pub, topic, tlen, nframes > 1 ? ZMQ_SNDMORE : 0) >= 0);
    if (nframes > 1)
        assert_true(zmq_send(pub, seq, slen, nframes > 2 ? ZMQ_SNDMORE : 0) >= 0);
    if (nframes > 2)
        assert_true(zmq_send(pub, payload, plen, nframes > 3 ? ZMQ_SNDMORE : 0) >= 0);
    if (nframes > 3)
        assert_true(zmq_send(pub, "x", 1, 0) >= 0);
}

static void publish(void *pub, const char *topic, uint64_t seq, const struct tev *evs, size_t n,
                    int dp_rank)
{
    msgpack_sbuffer sb;
    unsigned char s8[8];

    pack_batch(&sb, evs, n, dp_rank);
    be64(s8, seq);
    send_frames(pub, topic, strlen(topic), s8, 8, sb.data, sb.size, 3);
    msgpack_sbuffer_destroy(&sb);
}

static void test_bad_frames_and_events(void **state)
{
    struct fx *f = fx_new(true, -1);
    unsigned char s8[8], s4[4] = {0, 0, 0, 1};
    uint32_t tok[16];
    uint64_t h[4] = {1, 2, 3, 4}, hb[2] = {5, 6};
    struct kvr_stream_info si;
    msgpack_sbuffer sb;
    (void)state;

    warm_up(f);
    tokens_seq(tok, 16, 50);
    be64(s8, 0);
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, "", 0, 2); /* 2 */
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, "\x90", 1, 4);
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s4, 4, "\x90", 1, 3);
    send_frames(f->pub, "kv@nomodel", 10, s8, 8, "\x90", 1, 3);
    /* an undecodable payload with a valid frame layout */
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, "\xc1\xc1", 2, 3);

    /* one batch: garbage, good store, unknown tag, store with bad token count, good remove */
    struct tev evs[5] = {
        {.type = EV_GARBAGE_INT},
        {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
         .lora_id = -1},
        {.type = EV_UNKNOWN_TAG},
        {.type = EV_STORED, .hashes = hb, .n = 2, .has_parent = true, .parent = 4, .tokens = tok,
         .ntok = 7, .bs = 4, .lora_id = -1},
        {.type = EV_REMOVED, .hashes = h + 3, .n = 1},
    };
    publish(f->pub, "kv@pod-b@" MODEL, 1, evs, 5, 0);
    si = wait_seq(f, "pod-b", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 3);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-b", 0), 3);
    wait_metric(f, "events_bad_frames_total", "reason=\"frames\"", 2);
    wait_metric(f, "events_bad_frames_total", "reason=\"seq\"", 1);
    wait_metric(f, "events_bad_frames_total", "reason=\"topic\"", 1);
    wait_metric(f, "events_bad_batches_total", "reason=\"decode\"", 1);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"not_event\"") +
                         metric(f, "events_skipped_total", "reason=\"no_tag\""),
                     1);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"unknown_tag\""), 1);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"token_count\""), 1);

    /* block size mismatch with the learned one: skipped, counted */
    struct tev bsm = {.type = EV_STORED, .hashes = hb, .n = 1, .tokens = tok, .ntok = 8, .bs = 8,
                      .lora_id = -1};
    publish(f->pub, "kv@pod-b@" MODEL, 2, &bsm, 1, 0);
    wait_seq(f, "pod-b", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"block_size_mismatch\""), 1);

    /* a batch without dp_rank (v0.9.0 shape) counts as rank 0 */
    pack_batch(&sb, &bsm, 0, -1);
    be64(s8, 3);
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, sb.data, sb.size, 3);
    msgpack_sbuffer_destroy(&sb);
    wait_seq(f, "pod-b", 0, 3, KVR_STREAM_SYNCED);
    fx_free(f);
}

/* ---- replay server (ROUTER) ---------------------------------------------------------- */

struct ring_ent {
    uint64_t seq;
    msgpack_sbuffer sb;
};

struct router {
    void *zctx;
    void *sock;
    char ep[256];
    const char *topic;
    bool v25;
    pthread_mutex_t mu;
    struct ring_ent ring[64];
    size_t nring;
    _Atomic bool stop;
    _Atomic int requests;
    uint64_t skip_seq; /* not served (simulates a hole in the ring); UINT64_MAX = none */
    bool mute;         /* never answers (a hung engine) */
    uint32_t rank;     /* the DP rank engine_publish writes into its batches */
    pthread_t th;
};

static void *router_main(void *arg)
{
    struct router *r = arg;
    while (!atomic_load(&r->stop)) {
        zmq_pollitem_t it = {.socket = r->sock, .events = ZMQ_POLLIN};
        zmq_msg_t id, empty, start;
        unsigned char s8[8];
        uint64_t from = 0;

        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zmq_msg_init(&id);
        zmq_msg_init(&empty);
        zmq_msg_init(&start);
        zmq_msg_recv(&id, r->sock, 0);
        zmq_msg_recv(&empty, r->sock, 0);
        zmq_msg_recv(&start, r->sock, 0);
        for (size_t i = 0; i < 8 && i < zmq_msg_size(&start); i++)
            from = (from << 8) | ((unsigned char *)zmq_msg_data(&start))[i];
        atomic_fetch_add(&r->requests, 1);
        if (r->mute) {
            zmq_msg_close(&id);
            zmq_msg_close(&empty);
            zmq_msg_close(&start);
            continue;
        }
        pthread_mutex_lock(&r->mu);
        for (size_t i = 0; i < r->nring; i++) {
            if (r->ring[i].seq < from || r->ring[i].seq == r->skip_seq)
                continue;
            be64(s8, r->ring[i].seq);
            zmq_send(r->sock, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
            zmq_send(r->sock, "", 0, ZMQ_SNDMORE);
            if (r->v25)
                zmq_send(r->sock, r->topic, strlen(r->topic), ZMQ_SNDMORE);
            zmq_send(r->sock, s8, 8, ZMQ_SNDMORE);
            zmq_send(r->sock, r->ring[i].sb.data, r->ring[i].sb.size, 0);
        }
        pthread_mutex_unlock(&r->mu);
        memset(s8, 0xff, 8);
        zmq_send(r->sock, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
        zmq_send(r->sock, "", 0, ZMQ_SNDMORE);
        if (r->v25)
            zmq_send(r->sock, "", 0, ZMQ_SNDMORE);
        zmq_send(r->sock, s8, 8, ZMQ_SNDMORE);
        zmq_send(r->sock, "", 0, 0);
        zmq_msg_close(&id);
        zmq_msg_close(&empty);
        zmq_msg_close(&start);
    }
    return NULL;
}

static struct router *router_new_mute(void *zctx, const char *topic, bool v25, bool mute)
{
    struct router *r = calloc(1, sizeof(*r));
    size_t len = sizeof(r->ep);
    int zero = 0;

    r->zctx = zctx;
    r->topic = topic;
    r->v25 = v25;
    r->skip_seq = UINT64_MAX;
    r->mute = mute;
    pthread_mutex_init(&r->mu, NULL);
    r->sock = zmq_socket(zctx, ZMQ_ROUTER);
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(r->sock, "tcp://127.0.0.1:*"), 0);
    zmq_getsockopt(r->sock, ZMQ_LAST_ENDPOINT, r->ep, &len);
    pthread_create(&r->th, NULL, router_main, r);
    return r;
}

static struct router *router_new(void *zctx, const char *topic, bool v25)
{
    return router_new_mute(zctx, topic, v25, false);
}

static void router_free(struct router *r)
{
    atomic_store(&r->stop, true);
    pthread_join(r->th, NULL);
    zmq_close(r->sock);
    for (size_t i = 0; i < r->nring; i++)
        msgpack_sbuffer_destroy(&r->ring[i].sb);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Publishes a batch (unless drop) and keeps it in the replay ring. */
static void engine_publish(void *pub, struct router *r, uint64_t seq, const struct tev *evs,
                           size_t n, bool drop)
{
    unsigned char s8[8];

    pthread_mutex_lock(&r->mu);
    assert_true(r->nring < 64);
    r->ring[r->nring].seq = seq;
    pack_batch(&r->ring[r->nring].sb, evs, n, (int)r->rank);
    if (!drop) {
        be64(s8, seq);
        send_frames(pub, r->topic, strlen(r->topic), s8, 8, r->ring[r->nring].sb.data,
                    r->ring[r->nring].sb.size, 3);
    }
    r->nring++;
    pthread_mutex_unlock(&r->mu);
}

struct ep_seen {
    const char *ep;
    bool found;
    bool connected;
    bool from_config;
};

static void ep_cb(const struct kvr_zsub_endpoint *e, void *arg)
{
    struct ep_seen *s = arg;
    if (strcmp(e->endpoint, s->ep) == 0) {
        s->found = true;
        s->connected = e->connected;
        s->from_config = e->from_config;
    }
}

static void wait_connected(struct fx *f, const char *ep)
{
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    while (kvr_now_ms() < deadline) {
        struct ep_seen s = {.ep = ep};
        kvr_zsub_endpoints(f->zsub, ep_cb, &s);
        if (s.found && s.connected)
            return;
        sleep_ms(5);
    }
    fail_msg("endpoint %s never connected", ep);
}

/* Connect mode with a replay ROUTER: dropped live batches come back through the replay. */
static void run_replay(bool v25)
{
    struct fx *f = fx_new(false, -1);
    const char *topic = "kv@pod-rp@" MODEL;
    struct router *r = router_new(f->zctx, topic, v25);
    struct kvr_err err;
    uint32_t tok[64];
    uint64_t h[16];
    struct kvr_stream_info si;

    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, f->ep, r->ep, NULL, &err), 0);
    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, f->ep, NULL, NULL, &err), -EEXIST);
    wait_connected(f, f->ep);
    warm_up(f);
    tokens_seq(tok, 64, 500);
    for (int i = 0; i < 16; i++)
        h[i] = 7000 + (uint64_t)i;
    /* a chain of 16 blocks over 8 batches (2 blocks each); batches 2, 3 and 6 are lost */
    for (uint64_t q = 0; q < 8; q++) {
        struct tev e = {.type = EV_STORED, .hashes = h + 2 * q, .n = 2, .has_parent = q > 0,
                        .parent = q > 0 ? h[2 * q - 1] : 0, .tokens = tok + 8 * q, .ntok = 8,
                        .bs = 4, .lora_id = -1};
        engine_publish(f->pub, r, q, &e, 1, q == 2 || q == 3 || q == 6);
    }
    si = wait_seq(f, "pod-rp", 0, 7, KVR_STREAM_SYNCED);
    assert_true(si.gaps >= 1);
    assert_true(si.replays >= 1);
    assert_int_equal(si.blocks, 16);
    assert_int_equal(matched(f, MODEL, NULL, tok, 64, 4, "pod-rp", 0), 16);
    assert_true(atomic_load(&r->requests) >= 1);
    assert_true(metric(f, "events_replayed_batches_total", NULL) >= 3);
    assert_true(metric(f, "events_replays_total", "result=\"ok\"") >= 1);
    /* nothing applied twice: every duplicate block store would show here */
    assert_int_equal(metric(f, "events_blocks_duplicate_total", NULL), 0);

    /* a hole in the engine's ring: replay cannot recover it → unsynced */
    pthread_mutex_lock(&r->mu);
    r->skip_seq = 9;
    pthread_mutex_unlock(&r->mu);
    struct tev none[1] = {{0}};
    engine_publish(f->pub, r, 8, none, 0, false);
    engine_publish(f->pub, r, 9, none, 0, true);
    engine_publish(f->pub, r, 10, none, 0, false);
    si = wait_seq(f, "pod-rp", 0, 10, KVR_STREAM_UNSYNCED);
    assert_true(metric(f, "events_replays_total", "result=\"failed\"") >= 1);

    assert_int_equal(kvr_zsub_endpoint_del(f->zsub, f->ep, &err), 0);
    assert_int_equal(kvr_zsub_endpoint_del(f->zsub, f->ep, &err), -ENOENT);
    router_free(r);
    fx_free(f);
}

static void test_replay_v24(void **state)
{
    (void)state;
    run_replay(false);
}

static void test_replay_v25(void **state)
{
    (void)state;
    run_replay(true);
}

/* Bind mode with [events] bind_replay: the engine (pod id 127.0.0.1, DP rank 2) connects to
 * our bound SUB, and its ROUTER listens on the template's port + 2. A stream first seen at
 * seq 2 replays its history from 0; a later gap replays too; a pod id that is not a host gets
 * no replay (counted), and its gap leaves it unsynced. */
static char g_bind_replay[64];
static void bind_replay_conf(struct kvr_conf *c)
{
    c->bind_replay = g_bind_replay;
}

static void test_bind_replay(void **state)
{
    void *rctx = zmq_ctx_new();
    const char *topic = "kv@127.0.0.1@" MODEL;
    struct router *r = router_new(rctx, topic, true);
    int port = atoi(strrchr(r->ep, ':') + 1);
    struct fx *f;
    uint32_t tok[64];
    uint64_t h[16];
    struct kvr_stream_info si;
    struct tev none[1] = {{0}};
    (void)state;

    snprintf(g_bind_replay, sizeof(g_bind_replay), "tcp://{pod}:{%d+rank}", port - 2);
    f = fx_new_conf(true, -1, bind_replay_conf);
    warm_up(f);
    r->rank = 2;
    tokens_seq(tok, 64, 900);
    for (int i = 0; i < 16; i++)
        h[i] = 9100 + (uint64_t)i;
    /* batches 0 and 1 were published before we were there; 5 is lost on the way */
    for (uint64_t q = 0; q < 8; q++) {
        struct tev e = {.type = EV_STORED, .hashes = h + 2 * q, .n = 2, .has_parent = q > 0,
                        .parent = q > 0 ? h[2 * q - 1] : 0, .tokens = tok + 8 * q, .ntok = 8,
                        .bs = 4, .lora_id = -1};
        engine_publish(f->pub, r, q, &e, 1, q == 0 || q == 1 || q == 5);
    }
    si = wait_seq(f, "127.0.0.1", 2, 7, KVR_STREAM_SYNCED);
    assert_true(si.replays >= 1);
    assert_int_equal(si.blocks, 16);
    assert_int_equal(matched(f, MODEL, NULL, tok, 64, 4, "127.0.0.1", 2), 16);
    assert_true(atomic_load(&r->requests) >= 1);
    assert_int_equal(metric(f, "events_blocks_duplicate_total", NULL), 0);
    assert_int_equal(metric(f, "events_replay_unaddressable_topics_total", NULL), 0);

    /* a pod id that cannot be a host: no replay is attempted, the gap leaves it unsynced */
    int before = atomic_load(&r->requests);
    publish(f->pub, "kv@not_a_host@" MODEL, 0, none, 0, 0);
    wait_seq(f, "not_a_host", 0, 0, KVR_STREAM_SYNCED);
    publish(f->pub, "kv@not_a_host@" MODEL, 2, none, 0, 0);
    wait_seq(f, "not_a_host", 0, 2, KVR_STREAM_UNSYNCED);
    assert_int_equal(metric(f, "events_replay_unaddressable_topics_total", NULL), 1);
    sleep_ms(50);
    assert_int_equal(atomic_load(&r->requests), before);
    fx_free(f);
    router_free(r);
    zmq_ctx_term(rctx);
}

/* Connect mode: an engine that goes away for longer than purge_after_disconnect is purged;
 * a pod override names an engine whose topic is empty. */
static void test_disconnect_purge_and_override(void **state)
{
    struct fx *f = fx_new(false, 200);
    struct kvr_err err;
    uint32_t tok[16];
    uint64_t h[4] = {1, 2, 3, 4};
    struct kvr_stream_info si;
    unsigned char s8[8];
    msgpack_sbuffer sb;
    (void)state;

    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, f->ep, NULL, "pod-o@" MODEL, &err), 0);
    wait_connected(f, f->ep);
    tokens_seq(tok, 16, 40);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
                     .lora_id = -1};
    pack_batch(&sb, &st, 1, 0);
    /* slow joiner: publish seq 0, 1, ... (empty topic frame, vLLM's default; the same
     * blocks again are reference-counted duplicates) until the stream is seen */
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    uint64_t seq = 0;
    while (!get_stream(f, "pod-o", 0, &si)) {
        assert_true(kvr_now_ms() < deadline);
        be64(s8, seq++);
        send_frames(f->pub, "", 0, s8, 8, sb.data, sb.size, 3);
        sleep_ms(5);
    }
    msgpack_sbuffer_destroy(&sb);
    si = wait_seq(f, "pod-o", 0, seq - 1, -1);
    assert_int_equal(si.blocks, 4);
    assert_int_equal(si.restarts, 0);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-o", 0), 4);

    /* the engine goes away */
    zmq_close(f->pub);
    f->pub = NULL;
    deadline = kvr_now_ms() + WAIT_MS;
    while (worker_tier_blocks(f, "pod-o", 0, KVR_TIER_GPU) != 0) {
        assert_true(kvr_now_ms() < deadline);
        sleep_ms(10);
    }
    assert_true(metric(f, "events_disconnect_purges_total", NULL) >= 1);
    assert_true(metric(f, "events_disconnects_total", NULL) >= 1);
    fx_free(f);
}

static void short_replay_timeout(struct kvr_conf *c)
{
    c->replay_timeout_ms = 300;
}

static void no_replays(struct kvr_conf *c)
{
    c->max_concurrent_replays = 0;
}

/* An engine whose ROUTER never answers: the stream replays until the deadline, buffering its
 * live batches, then applies them (in order, once) and is unsynced. */
static void test_replay_timeout(void **state)
{
    struct fx *f = fx_new_conf(false, -1, short_replay_timeout);
    const char *topic = "kv@pod-to@" MODEL;
    struct router *r = router_new_mute(f->zctx, topic, true, true);
    struct kvr_err err;
    struct tev none[1] = {{0}};
    struct kvr_stream_info si;
    int64_t deadline;
    (void)state;

    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, f->ep, r->ep, NULL, &err), 0);
    wait_connected(f, f->ep);
    warm_up(f);
    engine_publish(f->pub, r, 0, none, 0, false);
    wait_seq(f, "pod-to", 0, 0, KVR_STREAM_SYNCED);
    engine_publish(f->pub, r, 1, none, 0, true);
    engine_publish(f->pub, r, 2, none, 0, false);
    /* replaying: seq 2 is held back */
    deadline = kvr_now_ms() + WAIT_MS;
    while (!(get_stream(f, "pod-to", 0, &si) && si.state == KVR_STREAM_REPLAYING)) {
        assert_true(kvr_now_ms() < deadline);
        sleep_ms(2);
    }
    assert_int_equal(si.last_seq, 0);
    engine_publish(f->pub, r, 3, none, 0, false);
    si = wait_seq(f, "pod-to", 0, 3, KVR_STREAM_UNSYNCED);
    assert_int_equal(si.gaps, 1);
    assert_int_equal(si.replays, 1);
    assert_true(atomic_load(&r->requests) >= 1);
    assert_true(metric(f, "events_replays_total", "result=\"failed\"") >= 1);
    assert_true(metric(f, "events_buffered_batches_total", NULL) >= 1);
    router_free(r);
    fx_free(f);
}

/* max_concurrent_replays = 0: a gap is never replayed, even with a replay endpoint. */
static void test_replay_disabled(void **state)
{
    struct fx *f = fx_new_conf(false, -1, no_replays);
    const char *topic = "kv@pod-nr@" MODEL;
    struct router *r = router_new(f->zctx, topic, true);
    struct kvr_err err;
    struct tev none[1] = {{0}};
    struct kvr_stream_info si;
    (void)state;

    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, f->ep, r->ep, NULL, &err), 0);
    wait_connected(f, f->ep);
    warm_up(f);
    engine_publish(f->pub, r, 0, none, 0, false);
    engine_publish(f->pub, r, 1, none, 0, true);
    engine_publish(f->pub, r, 2, none, 0, false);
    si = wait_seq(f, "pod-nr", 0, 2, KVR_STREAM_UNSYNCED);
    assert_int_equal(si.replays, 0);
    assert_int_equal(atomic_load(&r->requests), 0);
    router_free(r);
    fx_free(f);
}

static void test_endpoint_errors(void **state)
{
    struct fx *f = fx_new(true, -1);
    struct kvr_err err;
    struct kvr_buf b;
    (void)state;
    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, "not an endpoint", NULL, NULL, &err),
                     -EINVAL);
    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, "", NULL, NULL, &err), -EINVAL);
    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, "tcp://127.0.0.1:1", "bad", NULL, &err),
                     -EINVAL);
    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, "tcp://127.0.0.1:1", NULL, "@m", &err),
                     -EINVAL);
    assert_int_equal(kvr_zsub_endpoint_add(f->zsub, "tcp://127.0.0.1:1", NULL, NULL, &err), 0);
    struct ep_seen s = {.ep = "tcp://127.0.0.1:1"};
    kvr_zsub_endpoints(f->zsub, ep_cb, &s);
    assert_true(s.found);
    assert_false(s.from_config);
    assert_int_equal(kvr_zsub_endpoint_del(f->zsub, "tcp://127.0.0.1:1", &err), 0);
    assert_int_equal(kvr_zsub_endpoint_del(f->zsub, "tcp://127.0.0.1:1", &err), -ENOENT);
    /* metrics render without streams */
    kvr_buf_init(&b);
    kvr_ingest_metrics(f->ing, &b);
    assert_non_null(strstr(b.data, "kvrouter_events_lag_seconds_bucket"));
    assert_null(strstr(b.data, "kvrouter_index_entries")); /* httpapi renders the index's */
    kvr_buf_free(&b);
    /* stop is idempotent and ready goes false */
    kvr_ingest_stop(f->ing);
    kvr_ingest_stop(f->ing);
    assert_false(kvr_ingest_ready(f->ing));
    fx_free(f);
}

/* Garbage from the wire: random frame counts, seq sizes, topics and payloads. Nothing
 * crashes, every message is either counted as bad or handed to a writer, and a valid batch
 * after the storm is applied. */
static void test_random_garbage(void **state)
{
    struct fx *f = fx_new(true, -1);
    unsigned seed = (unsigned)(getenv("KVR_SEED") ? atoi(getenv("KVR_SEED")) : 4242);
    enum { N = 2000 };
    unsigned char buf[256];
    uint32_t tok[8];
    uint64_t h[2] = {1, 2};
    double sent_before, handed, bad = 0;
    (void)state;

    warm_up(f);
    sent_before = metric(f, "events_messages_total", NULL);
    srand(seed);
    for (int i = 0; i < N; i++) {
        int nframes = 1 + rand() % 5;
        for (int k = 0; k < nframes; k++) {
            size_t len = (size_t)(rand() % 40);
            int kind = rand() % 4;
            for (size_t j = 0; j < len; j++)
                buf[j] = (unsigned char)rand();
            if (k == 0 && kind < 2) {
                /* plausible topics, some valid */
                len = (size_t)snprintf((char *)buf, sizeof(buf), kind ? "kv@g%d@m" : "kv@g%d",
                                       rand() % 4);
            } else if (k == 1 && kind < 3) {
                len = 8;
            }
            assert_true(zmq_send(f->pub, buf, len, k + 1 < nframes ? ZMQ_SNDMORE : 0) >= 0);
        }
    }
    tokens_seq(tok, 8, 77);
    struct tev e = {.type = EV_STORED, .hashes = h, .n = 2, .tokens = tok, .ntok = 8, .bs = 4,
                    .lora_id = -1};
    publish(f->pub, "kv@after-storm@" MODEL, 5, &e, 1, 0);
    wait_seq(f, "after-storm", 0, 5, KVR_STREAM_SYNCED);
    handed = metric(f, "events_messages_total", NULL) - sent_before;
    for (int r = 0; r < 4; r++) {
        static const char *const reasons[] = {"frames", "seq", "topic", "too_many_topics"};
        char lab[64];
        snprintf(lab, sizeof(lab), "reason=\"%s\"", reasons[r]);
        bad += metric(f, "events_bad_frames_total", lab);
    }
    /* every message accounted for (SUB filter "kv@": non-matching topics never arrive, so
     * compare with what arrived: at most N + 1) */
    assert_true(handed + bad <= N + 1);
    assert_true(handed >= 1);
    assert_true(bad > 0);
    assert_true(matched(f, MODEL, NULL, tok, 8, 4, "after-storm", 0) == 2);
    fx_free(f);
}

/* IPv6: a bind on [::1] is reported as such, and an IPv6 engine gets through. */
static void test_ipv6_bind(void **state)
{
    struct kvr_conf c;
    struct kvr_index *ix;
    struct kvr_index_reader *rd;
    struct kvr_ingest *ing;
    struct kvr_zsub *zsub;
    struct kvr_err err = {{0}};
    char *binds[1] = {"tcp://[::1]:*"};
    struct kvr_index_opts io = {0};
    const char *eps[1];
    void *zctx, *pub;
    int one = 1, zero = 0;
    struct fx shim;
    (void)state;

    conf_defaults(&c);
    c.bind = binds;
    c.nbind = 1;
    assert_int_equal(kvr_index_create(&io, &ix), 0);
    assert_int_equal(kvr_index_reader_create(ix, &rd), 0);
    if (pipeline_start(&c, ix, &ing, &zsub, &err) != 0) {
        /* no IPv6 loopback on this machine: nothing to test */
        kvr_index_reader_destroy(rd);
        kvr_index_destroy(ix);
        skip();
    }
    assert_int_equal(kvr_zsub_bound(zsub, eps, 1), 1);
    assert_non_null(strstr(eps[0], "tcp://[::1]:"));
    zctx = zmq_ctx_new();
    pub = zmq_socket(zctx, ZMQ_PUB);
    zmq_setsockopt(pub, ZMQ_IPV6, &one, sizeof(one));
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_connect(pub, eps[0]), 0);
    memset(&shim, 0, sizeof(shim));
    shim.ing = ing;
    shim.zsub = zsub;
    shim.ix = ix;
    shim.rd = rd;
    shim.pub = pub;
    warm_up(&shim);
    zmq_close(pub);
    zmq_ctx_term(zctx);
    pipeline_stop(ing, zsub);
    kvr_index_reader_destroy(rd);
    kvr_index_destroy(ix);
}

/* ---- admission (zsub_auth.c) ----------------------------------------------------------- */

static double wait_metric_at_least(struct fx *f, const char *name, const char *labels,
                                   double want)
{
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    double v = -1;
    while (kvr_now_ms() < deadline) {
        v = metric(f, name, labels);
        if (v >= want)
            return v;
        sleep_ms(2);
    }
    fail_msg("metric %s{%s} = %g, want >= %g", name, labels ? labels : "", v, want);
    return v;
}

/* [events] forward: an XPUB re-publishing accepted live messages frame for frame; bad ones
 * are not forwarded; a replica whose queue is full costs drops (counted), never a stall. */
static void forward_conf(struct kvr_conf *c)
{
    c->forward = "tcp://127.0.0.1:*";
    c->rcvhwm = 100;
}

/* The next forwarded message whose topic is not the warm-up's (3 frames into m). */
static int recv_forwarded(void *sub, zmq_msg_t m[3])
{
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    while (kvr_now_ms() < deadline) {
        zmq_pollitem_t it = {.socket = sub, .events = ZMQ_POLLIN};
        int n = 0;
        if (zmq_poll(&it, 1, 50) <= 0)
            continue;
        for (int more = 1; more; n++) {
            zmq_msg_t x, *d = n < 3 ? &m[n] : &x;
            zmq_msg_init(d);
            assert_true(zmq_msg_recv(d, sub, 0) >= 0);
            more = zmq_msg_more(d);
            if (d == &x)
                zmq_msg_close(d);
        }
        if (n == 3 && zmq_msg_size(&m[0]) >= 9 &&
            memcmp(zmq_msg_data(&m[0]), "kv@warmup", 9) == 0) {
            for (int i = 0; i < 3; i++)
                zmq_msg_close(&m[i]);
            continue;
        }
        return n;
    }
    fail_msg("nothing forwarded");
    return 0;
}

static void test_forward(void **state)
{
    struct fx *f = fx_new_conf(true, -1, forward_conf);
    const char *fep = kvr_zsub_forward_bound(f->zsub);
    void *sub = zmq_socket(f->zctx, ZMQ_SUB);
    int zero = 0, one = 1;
    unsigned char s8[8], big[2048];
    zmq_msg_t m[3];
    struct tev none[1] = {{0}};
    msgpack_sbuffer sb;
    (void)state;

    assert_non_null(fep);
    assert_non_null(strstr(fep, "tcp://127.0.0.1:"));
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv@", 3);
    assert_int_equal(zmq_connect(sub, fep), 0);
    wait_metric_at_least(f, "events_forward_subscriptions_total", NULL, 1);
    warm_up(f);

    /* a bad message (2 frames) is not forwarded; the good one after it is, unchanged */
    be64(s8, 41);
    send_frames(f->pub, "kv@pod-fw@" MODEL, strlen("kv@pod-fw@" MODEL), s8, 8, "x", 1, 2);
    pack_batch(&sb, none, 0, 3);
    be64(s8, 42);
    send_frames(f->pub, "kv@pod-fw@" MODEL, strlen("kv@pod-fw@" MODEL), s8, 8, sb.data, sb.size,
                3);
    assert_int_equal(recv_forwarded(sub, m), 3);
    assert_str(zmq_msg_data(&m[0]), zmq_msg_size(&m[0]), "kv@pod-fw@" MODEL);
    assert_int_equal(zmq_msg_size(&m[1]), 8);
    assert_memory_equal(zmq_msg_data(&m[1]), s8, 8);
    assert_int_equal(zmq_msg_size(&m[2]), sb.size);
    assert_memory_equal(zmq_msg_data(&m[2]), sb.data, sb.size);
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&m[i]);
    msgpack_sbuffer_destroy(&sb);
    wait_seq(f, "pod-fw", 3, 42, KVR_STREAM_SYNCED); /* and it was ingested here too */
    assert_true(metric(f, "events_bad_frames_total", "reason=\"frames\"") >= 1);
    assert_int_equal(metric(f, "events_forwarded_total", NULL),
                     metric(f, "events_messages_total", NULL));
    assert_int_equal(metric(f, "events_forward_dropped_total", NULL), 0);
    zmq_close(sub);

    /* a replica that stops reading: its queue (rcvhwm 100, plus socket buffers) fills, the
     * rest is dropped and counted; ingestion goes on */
    sub = zmq_socket(f->zctx, ZMQ_SUB);
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sub, ZMQ_RCVHWM, &one, sizeof(one));
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    assert_int_equal(zmq_connect(sub, fep), 0);
    wait_metric_at_least(f, "events_forward_subscriptions_total", NULL, 2);
    memset(big, 0xc1, sizeof(big)); /* not msgpack: counted as undecodable by the writers */
    for (uint64_t q = 0; q < 8000; q++) {
        be64(s8, 100 + q);
        send_frames(f->pub, "kv@pod-fl@" MODEL, strlen("kv@pod-fl@" MODEL), s8, 8, big,
                    sizeof(big), 3);
    }
    wait_metric_at_least(f, "events_forward_dropped_total", NULL, 1);
    {
        double prev = -1, cur = metric(f, "events_messages_total", NULL);
        int64_t deadline = kvr_now_ms() + WAIT_MS;
        while (cur != prev && kvr_now_ms() < deadline) { /* until the flood is read */
            sleep_ms(100);
            prev = cur;
            cur = metric(f, "events_messages_total", NULL);
        }
        assert_int_equal(metric(f, "events_forwarded_total", NULL) +
                             metric(f, "events_forward_dropped_total", NULL),
                         cur);
    }
    zmq_close(sub);
    fx_free(f);
}

static struct kvr_cidr g_allow[2];

static void admission_conf(struct kvr_conf *c)
{
    assert_int_equal(kvr_cidr_parse("127.0.0.2/32", &g_allow[0]), 0);
    assert_int_equal(kvr_cidr_parse("::1/128", &g_allow[1]), 0);
    c->allow = g_allow;
    c->nallow = 2;
    c->pod_must_match_peer = true;
}

/* A PUB from 127.0.0.1 is refused by the ZAP handler (allow = 127.0.0.2, ::1); one from
 * 127.0.0.2 gets in, but only for its own pod: a topic claiming another pod is dropped before
 * any queue (no stream is created for it). */
static void test_admission_allowlist_and_pod(void **state)
{
    struct fx *f = fx_new_conf(true, -1, admission_conf);
    struct tev none[1] = {{0}};
    struct kvr_stream_info si;
    char src_ep[300];
    void *pub2;
    int zero = 0;
    uint64_t seq = 0;
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    (void)state;

    pub2 = zmq_socket(f->zctx, ZMQ_PUB);
    zmq_setsockopt(pub2, ZMQ_LINGER, &zero, sizeof(zero));
    snprintf(src_ep, sizeof(src_ep), "tcp://127.0.0.2:0;%s", f->ep + strlen("tcp://"));
    assert_int_equal(zmq_connect(pub2, src_ep), 0);
    while (kvr_now_ms() < deadline && !get_stream(f, "127.0.0.2", 0, &si)) {
        publish(pub2, "kv@127.0.0.2@" MODEL, seq++, none, 0, 0);
        sleep_ms(5);
    }
    assert_true(get_stream(f, "127.0.0.2", 0, &si));
    wait_metric_at_least(f, "events_rejected_total", "reason=\"address\"", 1);
    for (int i = 0; i < 5; i++)
        publish(f->pub, "kv@127.0.0.1@" MODEL, (uint64_t)i, none, 0, 0);
    publish(pub2, "kv@127.0.0.9@" MODEL, 1000000000, none, 0, 0);
    publish(pub2, "kv@10.0.0.1@" MODEL, 1000000000, none, 0, 0);
    publish(pub2, "kv@pod-name@" MODEL, 1000000000, none, 0, 0);
    publish(pub2, "kv@127.0.0.2@" MODEL, seq, none, 0, 0);
    wait_seq(f, "127.0.0.2", 0, seq, KVR_STREAM_SYNCED);
    wait_metric(f, "events_rejected_total", "reason=\"pod_mismatch\"", 3);
    assert_false(get_stream(f, "127.0.0.1", 0, &si));
    assert_false(get_stream(f, "127.0.0.9", 0, &si));
    assert_false(get_stream(f, "pod-name", 0, &si));
    assert_int_equal(metric(f, "events_rejected_total", "reason=\"curve_key\""), 0);
    zmq_close(pub2);
    fx_free(f);
}

/* What zmq_bind resolves, for -t; the key files as startup reads them. */
static void test_check_bind_and_keys(void **state)
{
    struct kvr_err err = {{0}};
    struct kvr_zsub_curve k;
    char pub[41], sec[41], opub[41], osec[41];
    char dir[] = "/tmp/kvr-test-zsub-XXXXXX", ps[300], pp[300], po[300], pa[300];
    FILE *fp;
    (void)state;

    assert_int_equal(kvr_zsub_check_bind("tcp://*:5557", &err), 0);
    assert_int_equal(kvr_zsub_check_bind("tcp://127.0.0.1:0", &err), 0);
    assert_int_equal(kvr_zsub_check_bind("tcp://lo:5557", &err), 0);
    assert_int_equal(kvr_zsub_check_bind("tcp://[::1]:5557", &err), 0);
    assert_int_equal(kvr_zsub_check_bind("inproc://x", &err), 0);
    assert_int_equal(kvr_zsub_check_bind("ipc:///tmp/kvr.sock", &err), 0);
    assert_int_equal(kvr_zsub_check_bind("tcp://localhost:5557", &err), -ENODEV);
    assert_non_null(strstr(err.msg, "'localhost' is none of these"));
    assert_int_equal(kvr_zsub_check_bind("tcp://example.com:5557", &err), -ENODEV);
    assert_int_equal(kvr_zsub_check_bind("ipc:///nonexistent-kvr-dir/s", &err), -ENOENT);
    assert_int_equal(kvr_zsub_check_connect("tcp://127.0.0.1:5557", &err), 0);
    assert_int_equal(kvr_zsub_check_connect("tcp://localhost:5557", &err), 0);
    assert_int_equal(kvr_zsub_check_connect("tcp://127.0.0.2:0;127.0.0.1:5557", &err), 0);
    assert_int_equal(kvr_zsub_check_connect("tcp://no-such-host.invalid:1", &err), -ENOENT);

    if (!zmq_has("curve")) {
        assert_int_equal(kvr_zsub_curve_load("/x", "/y", NULL, &k, &err), -ENOTSUP);
        return;
    }
    assert_non_null(mkdtemp(dir));
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    assert_int_equal(zmq_curve_keypair(opub, osec), 0);
    snprintf(ps, sizeof(ps), "%s/s", dir);
    snprintf(pp, sizeof(pp), "%s/p", dir);
    snprintf(po, sizeof(po), "%s/o", dir);
    snprintf(pa, sizeof(pa), "%s/a", dir);
    fp = fopen(ps, "w");
    fprintf(fp, "# secret\n  %s  \n", sec);
    fclose(fp);
    fp = fopen(pp, "w");
    fprintf(fp, "%s", pub);
    fclose(fp);
    fp = fopen(po, "w");
    fprintf(fp, "%s\n", opub);
    fclose(fp);
    fp = fopen(pa, "w");
    fprintf(fp, "# clients\n%s\n\n%s\n", pub, opub);
    fclose(fp);
    assert_int_equal(kvr_zsub_curve_load(ps, pp, pa, &k, &err), 0);
    assert_string_equal(k.secret, sec);
    assert_string_equal(k.public_key, pub);
    assert_int_equal(k.nauthorized, 2);
    kvr_zsub_curve_free(&k);
    assert_int_equal(kvr_zsub_curve_load(ps, po, NULL, &k, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "not the public key of"));
    assert_int_equal(kvr_zsub_curve_load(ps, "/nonexistent-kvr", NULL, &k, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "curve_public_key_file /nonexistent-kvr: cannot open"));
    fp = fopen(po, "w");
    fprintf(fp, "%s\nnot-a-key\n", opub);
    fclose(fp);
    assert_int_equal(kvr_zsub_curve_load(ps, pp, po, &k, &err), -EINVAL);
    assert_non_null(strstr(err.msg, ":2: expected a Z85 public key"));
    assert_int_equal(kvr_zsub_curve_load(pa, pp, NULL, &k, &err), -EINVAL); /* two keys */
    fp = fopen(pa, "w");
    fprintf(fp, "# nobody\n");
    fclose(fp);
    assert_int_equal(kvr_zsub_curve_load(ps, pp, pa, &k, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "no keys"));
    unlink(ps);
    unlink(pp);
    unlink(po);
    unlink(pa);
    rmdir(dir);
}

static void test_bind_error(void **state)
{
    struct kvr_conf c;
    struct kvr_index *ix;
    struct kvr_ingest *ing;
    struct kvr_zsub *zsub;
    struct kvr_err err = {{0}};
    char *binds[1] = {"tcp://nonsense"};
    struct kvr_index_opts io = {0};
    (void)state;
    conf_defaults(&c);
    c.bind = binds;
    c.nbind = 1;
    assert_int_equal(kvr_index_create(&io, &ix), 0);
    assert_true(pipeline_start(&c, ix, &ing, &zsub, &err) < 0);
    assert_non_null(strstr(err.msg, "tcp://nonsense"));
    assert_null(ing);
    assert_null(zsub);
    kvr_index_destroy(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topic),
        cmocka_unit_test(test_seq),
        cmocka_unit_test(test_seq_id),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_topic_random),
        cmocka_unit_test(test_seq_random),
        cmocka_unit_test(test_replay_random),
        cmocka_unit_test(test_replay_template),
        cmocka_unit_test(test_replay_template_random),
        cmocka_unit_test(test_bad_frames_and_events),
        cmocka_unit_test(test_replay_v24),
        cmocka_unit_test(test_replay_v25),
        cmocka_unit_test(test_bind_replay),
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_replay_timeout),
        cmocka_unit_test(test_replay_disabled),
        cmocka_unit_test(test_disconnect_purge_and_override),
        cmocka_unit_test(test_endpoint_errors),
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_ipv6_bind),
        cmocka_unit_test(test_bind_error),
        cmocka_unit_test(test_admission_allowlist_and_pod),
        cmocka_unit_test(test_check_bind_and_keys),
    };
    kvr_log_configure(getenv("KVR_TEST_DEBUG") ? KVR_LOG_DEBUG : KVR_LOG_ERROR, KVR_LOG_TEXT);
    if (getenv("KVR_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("KVR_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
