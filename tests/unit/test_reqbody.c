/* test_reqbody.c — score-query and endpoint bodies, JSON and msgpack. Inputs are copied into
 * exact-size heap buffers so sanitizer builds catch over-reads. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/reqbody.h"

static uint32_t g_tokens[64];
static const char *g_pods[4];
static struct kvr_hash_media g_media[4];
static const struct kvr_reqbody_scratch g_sc = {g_tokens, 64, g_pods, 4, g_media, 4};
static char *g_buf; /* last body, freed by the next call */

/* A body of exactly len bytes (it may hold raw 0 bytes), parsed by the JSON query decoder. */
static int qjson_n(const char *s, size_t len, struct kvr_reqbody_query *q, struct kvr_err *e)
{
    free(g_buf);
    g_buf = malloc(len ? len : 1);
    memcpy(g_buf, s, len);
    return kvr_reqbody_query_json(g_buf, len, &g_sc, q, e);
}

static int qjson(const char *s, struct kvr_reqbody_query *q, struct kvr_err *e)
{
    return qjson_n(s, strlen(s), q, e);
}

static void test_json_query(void **state)
{
    struct kvr_reqbody_query q;
    struct kvr_err e;
    (void)state;

    assert_int_equal(qjson("{\"model\":\"m\",\"token_ids\":[1,2,3]}", &q, &e), 0);
    assert_string_equal(q.model, "m");
    assert_null(q.lora_name);
    assert_int_equal(q.ntokens, 3);
    assert_int_equal(q.tokens[2], 3);
    assert_int_equal(q.npods, 0);

    /* any key order, whitespace, escapes in keys and values, unknown keys skipped */
    assert_int_equal(qjson(" { \"x\" : {\"a\": [1, {}]}, \"token_ids\" : [ ] ,\n"
                           "\"pods\": [\"p\\u0031\", \"p2\"], \"lora_n\\u0061me\": \"l\\/a\","
                           " \"mod\\u0065l\": \"Qwen/Qwen3-8B\", \"y\": null } ",
                           &q, &e),
                     0);
    assert_string_equal(q.model, "Qwen/Qwen3-8B");
    assert_string_equal(q.lora_name, "l/a");
    assert_int_equal(q.ntokens, 0);
    assert_int_equal(q.npods, 2);
    assert_string_equal(q.pods[0], "p1");
    assert_string_equal(q.pods[1], "p2");

    /* null / empty lora and null pods */
    assert_int_equal(qjson("{\"model\":\"m\",\"token_ids\":[0],\"lora_name\":null,\"pods\":null}",
                           &q, &e),
                     0);
    assert_null(q.lora_name);
    assert_int_equal(q.npods, 0);
    assert_int_equal(qjson("{\"model\":\"m\",\"token_ids\":[0],\"lora_name\":\"\"}", &q, &e), 0);
    assert_null(q.lora_name);
}

static void test_json_query_errors(void **state)
{
    static const struct {
        const char *body;
        int rc;
        const char *msg;
    } bad[] = {
        {"", -EINVAL, "object"},
        {"[]", -EINVAL, "object"},
        {"{}", -EINVAL, "missing \"model\""},
        {"{\"model\":\"m\"}", -EINVAL, "missing \"token_ids\""},
        {"{\"token_ids\":[1]}", -EINVAL, "missing \"model\""},
        {"{\"model\":\"\",\"token_ids\":[1]}", -EINVAL, "model"},
        {"{\"model\":1,\"token_ids\":[1]}", -EINVAL, "model"},
        {"{\"model\":null,\"token_ids\":[1]}", -EINVAL, "model"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"model\":\"n\"}", -EINVAL, "duplicate"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"token_ids\":[2]}", -EINVAL, "duplicate"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pods\":[],\"pods\":[]}", -EINVAL, "duplicate"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"lora_name\":null,\"lora_name\":null}", -EINVAL,
         "duplicate"},
        {"{\"model\":\"m\",\"token_ids\":[1.0]}", -EINVAL, "fraction"},
        {"{\"model\":\"m\",\"token_ids\":[-1]}", -EINVAL, "negative"},
        {"{\"model\":\"m\",\"token_ids\":[4294967296]}", -EINVAL, "range"},
        {"{\"model\":\"m\",\"token_ids\":[\"1\"]}", -EINVAL, "unsigned integer"},
        {"{\"model\":\"m\",\"token_ids\":\"1\"}", -EINVAL, "array"},
        {"{\"model\":\"m\",\"token_ids\":null}", -EINVAL, "array"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"lora_name\":3}", -EINVAL, "lora_name"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pods\":\"p\"}", -EINVAL, "pods"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pods\":[1]}", -EINVAL, "pods"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pods\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", -EINVAL,
         "too many pods"},
        {"{\"model\":\"m\",\"token_ids\":[1]} x", -EINVAL, "trailing"},
        {"{\"model\":\"m\",\"token_ids\":[1],}", -EINVAL, "key"},
        {"{\"model\":\"m\" \"token_ids\":[1]}", -EINVAL, "','"},
        {"{\"model\":\"m\",\"token_ids\":[1]", -EINVAL, "','"},
        {"{\"model\":\"m\\u0000\",\"token_ids\":[1]}", -EINVAL, "NUL"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"x\":[1,}", -EINVAL, "JSON"},
    };
    struct kvr_reqbody_query q;
    struct kvr_err e;
    char big[200];
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc;
        memset(e.msg, 0, sizeof(e.msg));
        rc = qjson(bad[i].body, &q, &e);
        if (rc != bad[i].rc || strstr(e.msg, bad[i].msg) == NULL)
            fail_msg("%s: rc %d msg '%s' (want %d '%s')", bad[i].body, rc, e.msg, bad[i].rc,
                     bad[i].msg);
    }
    /* 64 tokens fit, 65 do not: -E2BIG */
    {
        char body[600];
        size_t len = (size_t)snprintf(body, sizeof(body), "{\"model\":\"m\",\"token_ids\":[");
        for (int i = 0; i < 65; i++)
            len += (size_t)snprintf(body + len, sizeof(body) - len, "%s%d", i ? "," : "", i);
        snprintf(body + len, sizeof(body) - len, "]}");
        assert_int_equal(qjson(body, &q, &e), -E2BIG);
        assert_non_null(strstr(e.msg, "too many token ids"));
    }
    /* model longer than KVR_NAME_MAX (256) */
    {
        char body[400];
        memset(big, 'a', sizeof(big));
        snprintf(body, sizeof(body), "{\"model\":\"%.199s%.70s\",\"token_ids\":[]}", big, big);
        assert_int_equal(qjson(body, &q, &e), -EINVAL);
    }
}

static void test_endpoint_json(void **state)
{
    struct kvr_reqbody_endpoint ep;
    struct kvr_err e;
    char buf[200];
    (void)state;

#define EP(s) (strcpy(buf, s), kvr_reqbody_endpoint_json(buf, strlen(buf), &ep, &e))
    assert_int_equal(EP("{\"endpoint\":\"tcp://127.0.0.1:5557\"}"), 0);
    assert_string_equal(ep.endpoint, "tcp://127.0.0.1:5557");
    assert_null(ep.replay_endpoint);
    assert_null(ep.pod);
    assert_int_equal(EP("{\"pod\":\"p\",\"replay_endpoint\":\"tcp://h:1\",\"endpoint\":\"tcp://h:2\","
                        "\"other\":[1]}"),
                     0);
    assert_string_equal(ep.pod, "p");
    assert_string_equal(ep.replay_endpoint, "tcp://h:1");
    assert_int_equal(EP("{\"endpoint\":\"a\",\"pod\":null}"), 0);
    assert_null(ep.pod);
    assert_int_equal(EP("{}"), -EINVAL);
    assert_int_equal(EP("{\"endpoint\":\"\"}"), -EINVAL);
    assert_int_equal(EP("{\"endpoint\":5}"), -EINVAL);
    assert_int_equal(EP("{\"endpoint\":\"a\",\"endpoint\":\"b\"}"), -EINVAL);
    assert_non_null(strstr(e.msg, "duplicate"));
    assert_int_equal(EP("{\"endpoint\":\"a\",\"pod\":[]}"), -EINVAL);
    assert_int_equal(EP("[\"endpoint\"]"), -EINVAL);
    assert_int_equal(EP("{\"endpoint\":\"a\"}}"), -EINVAL);
#undef EP
}

/* ---- msgpack ------------------------------------------------------------------------- */

struct mpw {
    unsigned char b[4096];
    size_t n;
};

static void mp_raw(struct mpw *w, const void *p, size_t n)
{
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void mp_byte(struct mpw *w, unsigned v)
{
    w->b[w->n++] = (unsigned char)v;
}
static void mp_be(struct mpw *w, uint64_t v, unsigned nbytes)
{
    for (unsigned i = nbytes; i-- > 0;)
        mp_byte(w, (unsigned)(v >> (8 * i)) & 0xff);
}
static void mp_str(struct mpw *w, const char *s)
{
    size_t n = strlen(s);
    if (n < 32) {
        mp_byte(w, 0xa0 | (unsigned)n);
    } else if (n < 256) {
        mp_byte(w, 0xd9);
        mp_byte(w, (unsigned)n);
    } else {
        mp_byte(w, 0xda);
        mp_be(w, n, 2);
    }
    mp_raw(w, s, n);
}
static void mp_uint(struct mpw *w, uint64_t v)
{
    if (v < 128) {
        mp_byte(w, (unsigned)v);
    } else if (v < 256) {
        mp_byte(w, 0xcc);
        mp_byte(w, (unsigned)v);
    } else if (v < 65536) {
        mp_byte(w, 0xcd);
        mp_be(w, v, 2);
    } else if (v <= UINT32_MAX) {
        mp_byte(w, 0xce);
        mp_be(w, v, 4);
    } else {
        mp_byte(w, 0xcf);
        mp_be(w, v, 8);
    }
}

static int qmp(const struct mpw *w, struct kvr_reqbody_query *q, struct kvr_err *e)
{
    free(g_buf);
    g_buf = malloc(w->n ? w->n : 1);
    memcpy(g_buf, w->b, w->n);
    return kvr_reqbody_query_msgpack(g_buf, w->n, &g_sc, q, e);
}


/* cache_salt and mm_hashes, both bodies: values, nulls, and every refusal. */
static void test_salt_media(void **state)
{
    struct kvr_reqbody_query q;
    struct kvr_err e;
    (void)state;

    assert_int_equal(qjson("{\"model\":\"m\",\"token_ids\":[1],\"cache_salt\":\"t-a\","
                           "\"mm_hashes\":[{\"hash\":\"img0\",\"offset\":4,\"length\":20,"
                           "\"x\":[1]},{\"length\":1,\"offset\":24,\"hash\":\"b\\u0031\"}]}",
                           &q, &e), 0);
    assert_string_equal(q.cache_salt, "t-a");
    assert_int_equal(q.nmedia, 2);
    assert_int_equal(q.media[0].id_len, 4);
    assert_memory_equal(q.media[0].id, "img0", 4);
    assert_true(q.media[0].offset == 4 && q.media[0].length == 20);
    assert_memory_equal(q.media[1].id, "b1", 2);
    assert_true(q.media[1].offset == 24 && q.media[1].length == 1);
    assert_int_equal(qjson("{\"model\":\"m\",\"token_ids\":[1],\"cache_salt\":null,"
                           "\"mm_hashes\":null}", &q, &e), 0);
    assert_null(q.cache_salt);
    assert_int_equal(q.nmedia, 0);
    assert_int_equal(qjson("{\"model\":\"m\",\"token_ids\":[1],\"cache_salt\":\"\"}", &q, &e), 0);
    assert_null(q.cache_salt);

    static const struct {
        const char *body, *msg;
    } bad[] = {
        {"\"cache_salt\":1", "\"cache_salt\" must be a string or null"},
        {"\"cache_salt\":\"a\",\"cache_salt\":\"b\"", "duplicate key \"cache_salt\""},
        {"\"mm_hashes\":{}", "\"mm_hashes\" must be an array of objects"},
        {"\"mm_hashes\":[1]", "\"mm_hashes\" must be an array of objects"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":1}]",
         "\"mm_hashes\"[0] needs \"hash\", \"offset\" and \"length\""},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":-1,\"length\":1}]",
         "\"mm_hashes\"[0].offset must be an integer in [0, 2^32)"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":1.5,\"length\":1}]",
         "\"mm_hashes\"[0].offset must be an integer in [0, 2^32)"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":1,\"length\":4294967296}]",
         "\"mm_hashes\"[0].length must be an integer in [0, 2^32)"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":1,\"length\":0}]",
         "\"mm_hashes\"[0].length must be >= 1"},
        {"\"mm_hashes\":[{\"hash\":\"\",\"offset\":1,\"length\":1}]",
         "\"mm_hashes\"[0].hash must be 1..256 bytes"},
        {"\"mm_hashes\":[{\"hash\":3,\"offset\":1,\"length\":1}]",
         "\"mm_hashes\"[0].hash must be a string"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"hash\":\"b\",\"offset\":1,\"length\":1}]",
         "duplicate key in \"mm_hashes\" item 0"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":4,\"length\":4},"
         "{\"hash\":\"b\",\"offset\":7,\"length\":1}]",
         "\"mm_hashes\" must be sorted by offset and not overlap (item 1)"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":4,\"length\":1},"
         "{\"hash\":\"b\",\"offset\":1,\"length\":1}]",
         "\"mm_hashes\" must be sorted by offset and not overlap (item 1)"},
        {"\"mm_hashes\":[{\"hash\":\"a\",\"offset\":0,\"length\":1},"
         "{\"hash\":\"a\",\"offset\":1,\"length\":1},{\"hash\":\"a\",\"offset\":2,\"length\":1},"
         "{\"hash\":\"a\",\"offset\":3,\"length\":1},{\"hash\":\"a\",\"offset\":4,\"length\":1}]",
         "too many \"mm_hashes\" items (limit 4)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char body[1024];
        snprintf(body, sizeof(body), "{\"model\":\"m\",\"token_ids\":[1],%s}", bad[i].body);
        e.msg[0] = '\0';
        if (qjson(body, &q, &e) != -EINVAL || strcmp(e.msg, bad[i].msg) != 0)
            fail_msg("case %zu: got \"%s\", want \"%s\"", i, e.msg, bad[i].msg);
    }

    /* msgpack: the same fields, any int width for the ranges */
    static const uint8_t mp[] = {
        0x84, 0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'm', 0xa9, 't', 'o', 'k', 'e', 'n', '_',
        'i', 'd', 's', 0x91, 0x01, 0xaa, 'c', 'a', 'c', 'h', 'e', '_', 's', 'a', 'l', 't',
        0xa3, 't', '-', 'a', 0xa9, 'm', 'm', '_', 'h', 'a', 's', 'h', 'e', 's', 0x92,
        0x83, 0xa4, 'h', 'a', 's', 'h', 0xa4, 'i', 'm', 'g', '0', 0xa6, 'o', 'f', 'f', 's',
        'e', 't', 0xcd, 0x01, 0x00, 0xa6, 'l', 'e', 'n', 'g', 't', 'h', 0xd0, 0x14,
        0x83, 0xa6, 'l', 'e', 'n', 'g', 't', 'h', 0x01, 0xa6, 'o', 'f', 'f', 's', 'e', 't',
        0xce, 0x00, 0x01, 0x00, 0x00, 0xa4, 'h', 'a', 's', 'h', 0xa1, 'b'};
    char buf[sizeof(mp)];
    memcpy(buf, mp, sizeof(mp));
    assert_int_equal(kvr_reqbody_query_msgpack(buf, sizeof(buf), &g_sc, &q, &e), 0);
    assert_string_equal(q.cache_salt, "t-a");
    assert_int_equal(q.nmedia, 2);
    assert_string_equal(q.media[0].id, "img0");
    assert_true(q.media[0].offset == 256 && q.media[0].length == 20);
    assert_string_equal(q.media[1].id, "b");
    assert_true(q.media[1].offset == 65536 && q.media[1].length == 1);
    /* a negative signed length is refused */
    memcpy(buf, mp, sizeof(mp));
    buf[76] = (char)0xec; /* the 0x14 of "length": d0 14 → d0 ec (-20) */
    assert_int_equal((uint8_t)mp[76], 0x14);
    assert_int_equal(kvr_reqbody_query_msgpack(buf, sizeof(buf), &g_sc, &q, &e), -EINVAL);
    assert_string_equal(e.msg, "\"mm_hashes\"[0].length must be an integer in [0, 2^32)");
}

static void test_msgpack_query(void **state)
{
    struct mpw w = {.n = 0};
    struct kvr_reqbody_query q;
    struct kvr_err e;
    static const uint64_t vals[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295u, 7,
                                    300, 70000, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    size_t nv = sizeof(vals) / sizeof(vals[0]);
    (void)state;

    mp_byte(&w, 0x85);
    mp_str(&w, "skip");
    mp_byte(&w, 0x92); /* [1.5, {"a": bin}] */
    mp_byte(&w, 0xcb);
    mp_be(&w, 0x3ff8000000000000ull, 8);
    mp_byte(&w, 0x81);
    mp_str(&w, "a");
    mp_byte(&w, 0xc4);
    mp_byte(&w, 2);
    mp_byte(&w, 0);
    mp_byte(&w, 0);
    mp_str(&w, "token_ids");
    mp_byte(&w, 0xdc);
    mp_be(&w, nv + 3, 2);
    for (size_t i = 0; i < nv; i++)
        mp_uint(&w, vals[i]);
    /* other widths holding small non-negative values */
    mp_byte(&w, 0xcf);
    mp_be(&w, 42, 8);
    mp_byte(&w, 0xd1);
    mp_be(&w, 1000, 2);
    mp_byte(&w, 0xd3);
    mp_be(&w, 4294967295u, 8);
    mp_str(&w, "model");
    mp_str(&w, "Qwen/Qwen3-8B");
    mp_str(&w, "lora_name");
    mp_str(&w, "adapter-a");
    mp_str(&w, "pods");
    mp_byte(&w, 0x92);
    mp_str(&w, "pod-a");
    mp_str(&w, "pod-bb");

    assert_int_equal(qmp(&w, &q, &e), 0);
    assert_string_equal(q.model, "Qwen/Qwen3-8B");
    assert_string_equal(q.lora_name, "adapter-a");
    assert_int_equal(q.ntokens, nv + 3);
    for (size_t i = 0; i < nv; i++)
        assert_int_equal(q.tokens[i], vals[i]);
    assert_int_equal(q.tokens[nv], 42);
    assert_int_equal(q.tokens[nv + 1], 1000);
    assert_int_equal(q.tokens[nv + 2], 4294967295u);
    assert_int_equal(q.npods, 2);
    assert_string_equal(q.pods[0], "pod-a");
    assert_string_equal(q.pods[1], "pod-bb");

    /* every truncation is rejected, never read past the end */
    for (size_t k = 0; k < w.n; k++) {
        struct mpw t = w;
        t.n = k;
        if (qmp(&t, &q, &e) == 0)
            fail_msg("prefix %zu of %zu accepted", k, w.n);
    }
}

static void one_bad_token(const unsigned char *tok, size_t toklen, const char *want)
{
    struct mpw w = {.n = 0};
    struct kvr_reqbody_query q;
    struct kvr_err e;
    int rc;

    mp_byte(&w, 0x82);
    mp_str(&w, "model");
    mp_str(&w, "m");
    mp_str(&w, "token_ids");
    mp_byte(&w, 0x92);
    mp_byte(&w, 1);
    mp_raw(&w, tok, toklen);
    memset(e.msg, 0, sizeof(e.msg));
    rc = qmp(&w, &q, &e);
    if (rc != -EINVAL || strstr(e.msg, want) == NULL)
        fail_msg("token %02x: rc %d msg '%s' want '%s'", tok[0], rc, e.msg, want);
}

static void test_msgpack_errors(void **state)
{
    static const unsigned char neg_fix[] = {0xff};
    static const unsigned char neg8[] = {0xd0, 0x80};
    static const unsigned char neg64[] = {0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char big64[] = {0xcf, 0, 0, 0, 1, 0, 0, 0, 0};
    static const unsigned char f64[] = {0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0};
    static const unsigned char f32[] = {0xca, 0x3f, 0x80, 0, 0};
    static const unsigned char str[] = {0xa1, '1'};
    static const unsigned char nil[] = {0xc0};
    static const unsigned char tru[] = {0xc3};
    struct mpw w = {.n = 0};
    struct kvr_reqbody_query q;
    struct kvr_err e;
    (void)state;

    one_bad_token(neg_fix, 1, "negative");
    one_bad_token(neg8, 2, "negative");
    one_bad_token(neg64, 9, "negative");
    one_bad_token(big64, 9, "range");
    one_bad_token(f64, 9, "not an integer");
    one_bad_token(f32, 5, "not an integer");
    one_bad_token(str, 2, "not an integer");
    one_bad_token(nil, 1, "not an integer");
    one_bad_token(tru, 1, "not an integer");

    /* not a map; duplicate; trailing data; NUL in string; too many tokens; missing keys */
    mp_byte(&w, 0x90);
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    w.n = 0;
    mp_byte(&w, 0x82);
    mp_str(&w, "model");
    mp_str(&w, "m");
    mp_str(&w, "model");
    mp_str(&w, "m");
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "duplicate"));
    w.n = 0;
    mp_byte(&w, 0x82);
    mp_str(&w, "model");
    mp_str(&w, "m");
    mp_str(&w, "token_ids");
    mp_byte(&w, 0x90);
    assert_int_equal(qmp(&w, &q, &e), 0);
    mp_byte(&w, 0xc0);
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "trailing"));
    w.n = 0;
    mp_byte(&w, 0x82);
    mp_str(&w, "model");
    mp_raw(&w, "\xa3m\0x", 4);
    mp_str(&w, "token_ids");
    mp_byte(&w, 0x90);
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "NUL"));
    w.n = 0;
    mp_byte(&w, 0x82);
    mp_str(&w, "model");
    mp_str(&w, "m");
    mp_str(&w, "token_ids");
    mp_byte(&w, 0xdc);
    mp_be(&w, 65, 2);
    for (int i = 0; i < 65; i++)
        mp_uint(&w, (uint64_t)i * 1000);
    assert_int_equal(qmp(&w, &q, &e), -E2BIG);
    w.n = 0;
    mp_byte(&w, 0x81);
    mp_str(&w, "model");
    mp_str(&w, "m");
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "token_ids"));
    /* a huge declared container count with few bytes */
    w.n = 0;
    mp_byte(&w, 0xdf);
    mp_be(&w, 0xffffffffu, 4);
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    w.n = 0;
    mp_byte(&w, 0x81);
    mp_str(&w, "x");
    mp_byte(&w, 0xdd);
    mp_be(&w, 0xffffffffu, 4);
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    /* deep nesting in an unknown key */
    w.n = 0;
    mp_byte(&w, 0x81);
    mp_str(&w, "x");
    for (int i = 0; i < 100; i++)
        mp_byte(&w, 0x91);
    mp_byte(&w, 0x01);
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "deep"));
}

/* Random msgpack token arrays of mixed widths (long enough for the paired fast loop). */
/* ---- U+0000 ------------------------------------------------------------------------------ */

/* The prompt keeps U+0000 (JSON "\u0000", a raw 0 byte in a msgpack string) with its length,
 * as vLLM tokenizes it; every string used as a C string refuses it, naming the field. */
static void test_nul_fields(void **state)
{
    struct kvr_reqbody_query q;
    struct kvr_err e;
    struct mpw w = {.n = 0};
    (void)state;

    assert_int_equal(qjson("{\"model\":\"m\",\"prompt\":\"a\\u0000b\\u0000\"}", &q, &e), 0);
    assert_false(q.has_tokens);
    assert_int_equal(q.prompt_len, 4);
    assert_memory_equal(q.prompt, "a\0b\0", 5);
    assert_int_equal(qjson("{\"model\":\"m\",\"prompt\":\"\\u0000\"}", &q, &e), 0);
    assert_int_equal(q.prompt_len, 1);
    assert_int_equal(q.prompt[0], '\0');

    static const struct {
        const char *field, *msg;
    } bad[] = {
        {"\"model\":\"m\\u0000x\",\"prompt\":\"p\"", "\"model\""},
        {"\"model\":\"m\",\"prompt\":\"p\",\"lora_name\":\"\\u0000\"", "\"lora_name\""},
        {"\"model\":\"m\",\"prompt\":\"p\",\"cache_salt\":\"s\\u0000\"", "\"cache_salt\""},
        {"\"model\":\"m\",\"prompt\":\"p\",\"pods\":[\"a\",\"b\\u0000\"]", "\"pods\"[1]"},
        {"\"model\":\"m\",\"token_ids\":[1],\"mm_hashes\":[{\"hash\":\"h\\u0000\",\"offset\":0,"
         "\"length\":1}]", "\"mm_hashes\"[0].hash"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char body[512], want[128];
        snprintf(body, sizeof(body), "{%s}", bad[i].field);
        snprintf(want, sizeof(want), "%s must not contain a NUL character (\\u0000)", bad[i].msg);
        e.msg[0] = '\0';
        if (qjson(body, &q, &e) != -EINVAL || strcmp(e.msg, want) != 0)
            fail_msg("case %zu: got \"%s\", want \"%s\"", i, e.msg, want);
    }
    /* a raw 0 byte in a JSON string stays a control character */
    assert_int_equal(qjson_n("{\"model\":\"m\",\"prompt\":\"a\0b\"}", 28, &q, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "control character"));

    /* route keys: candidates' pods and the policy */
    static struct kvr_reqbody_cand cands[4];
    struct kvr_reqbody_route rq;
    static const struct {
        const char *body, *msg;
    } rbad[] = {
        {"{\"model\":\"m\",\"token_ids\":[1],\"candidates\":[{\"pod\":\"a\"},{\"pod\":\"b\\u0000\"}]}",
         "\"candidates\"[1].pod must not contain a NUL character (\\u0000)"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"policy\":\"cost\\u0000x\"}",
         "\"policy\" must not contain a NUL character (\\u0000)"},
    };
    for (size_t i = 0; i < sizeof(rbad) / sizeof(rbad[0]); i++) {
        char body[256];
        size_t len = strlen(rbad[i].body);
        memcpy(body, rbad[i].body, len);
        e.msg[0] = '\0';
        if (kvr_reqbody_query_ext(body, len, &g_sc, &q, NULL, NULL, cands, 4, &rq, &e) != -EINVAL ||
            strcmp(e.msg, rbad[i].msg) != 0)
            fail_msg("route case %zu: got \"%s\", want \"%s\"", i, e.msg, rbad[i].msg);
    }
    {
        char body[] = "{\"model\":\"m\",\"prompt\":\"\\u0000\",\"policy\":\"cost\"}";
        assert_int_equal(kvr_reqbody_query_ext(body, strlen(body), &g_sc, &q, NULL, NULL, cands,
                                               4, &rq, &e), 0);
        assert_int_equal(q.prompt_len, 1);
        assert_string_equal(rq.policy, "cost");
    }

    /* endpoint admin bodies */
    struct kvr_reqbody_endpoint ep;
    static const char *const ebad[] = {
        "{\"endpoint\":\"tcp://h:1\\u0000\"}", "{\"endpoint\":\"tcp://h:1\",\"pod\":\"p\\u0000\"}",
        "{\"endpoint\":\"tcp://h:1\",\"replay_endpoint\":\"\\u0000\"}"};
    static const char *const ewant[] = {"\"endpoint\"", "\"pod\"", "\"replay_endpoint\""};
    for (size_t i = 0; i < 3; i++) {
        char body[128], want[128];
        size_t len = strlen(ebad[i]);
        memcpy(body, ebad[i], len);
        snprintf(want, sizeof(want), "%s must not contain a NUL character (\\u0000)", ewant[i]);
        e.msg[0] = '\0';
        if (kvr_reqbody_endpoint_json(body, len, &ep, &e) != -EINVAL || strcmp(e.msg, want) != 0)
            fail_msg("endpoint case %zu: got \"%s\", want \"%s\"", i, e.msg, want);
    }

    /* msgpack: a raw 0 byte in the prompt is text, in the model a refusal */
    mp_byte(&w, 0x82);
    mp_str(&w, "model");
    mp_str(&w, "m");
    mp_str(&w, "prompt");
    mp_raw(&w, "\xa4\0a\0\0", 5);
    assert_int_equal(qmp(&w, &q, &e), 0);
    assert_int_equal(q.prompt_len, 4);
    assert_memory_equal(q.prompt, "\0a\0\0", 5);
    w.n = 0;
    mp_byte(&w, 0x83);
    mp_str(&w, "model");
    mp_str(&w, "m");
    mp_str(&w, "prompt");
    mp_str(&w, "p");
    mp_str(&w, "cache_salt");
    mp_raw(&w, "\xa2s\0", 3);
    assert_int_equal(qmp(&w, &q, &e), -EINVAL);
    assert_string_equal(e.msg, "msgpack: \"cache_salt\" must not contain a NUL character (\\u0000)");
}

/* Chat bodies: U+0000 in contents (a string, text parts), tools and chat_template_kwargs
 * reaches the template as part of its string, and the render keeps it (its output is
 * (pointer, length)). */
static void test_nul_chat(void **state)
{
    static const char body[] =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\\u0000\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\\u0000b\"},"
        "{\"type\":\"text\",\"text\":\"\\u0000\"}]},{\"role\":\"assistant\",\"content\":\"\\u0000\","
        "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":\\\"\\\\u0000\\\"}\"}}]}],"
        "\"tools\":[{\"function\":{\"description\":\"d\\u0000\"}}],"
        "\"chat_template_kwargs\":{\"extra\":\"k\\u0000\"}}";
    static const char src[] =
        "{% for m in messages %}<{{ m.role }}:{{ m.content }}|{{ m.content | length }}"
        "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}>"
        "{% endfor %}{{ tools | tojson }}{{ extra }}{{ extra | length }}";
    static const char want[] = "<system:s\0|2><user:a\0b\n\0|5>"
                               "<assistant:\0|1{\"x\": \"\\u0000\"}>"
                               "[{\"function\": {\"description\": \"d\\u0000\"}}]k\0" "2";
    struct kvr_reqbody_query q;
    struct kvr_reqbody_chat ch;
    struct kvr_err e;
    kvr_tmpl_ctx *ctx;
    kvr_tmpl *t;
    char err[256], *buf;
    const char *out;
    size_t outlen;
    (void)state;

    assert_int_equal(kvr_tmpl_ctx_create(&ctx, NULL), 0);
    assert_int_equal(kvr_tmpl_compile(src, sizeof(src) - 1, &t, err, sizeof(err)), 0);
    buf = malloc(sizeof(body) - 1);
    memcpy(buf, body, sizeof(body) - 1);
    e.msg[0] = '\0';
    if (kvr_reqbody_query_ext(buf, sizeof(body) - 1, &g_sc, &q, ctx, &ch, NULL, 0, NULL, &e) != 0)
        fail_msg("chat body refused: %s", e.msg);
    assert_int_equal(ch.nmessages, 3);
    assert_int_equal(ch.final_len, 1); /* continue_final_message's text: "\0" */
    assert_int_equal(ch.final_text[0], '\0');
    kvr_tmpl_val *vars = kvr_tmpl_dict(ctx);
    assert_non_null(vars);
    assert_int_equal(kvr_tmpl_dict_set(ctx, vars, "messages", 8, ch.messages_str), 0);
    assert_int_equal(kvr_tmpl_dict_set(ctx, vars, "tools", 5, ch.tools), 0);
    assert_int_equal(kvr_tmpl_dict_merge(ctx, vars, ch.kwargs), 0);
    if (kvr_tmpl_render(t, ctx, vars, 0, &out, &outlen, err, sizeof(err)) != 0)
        fail_msg("render: %s", err);
    if (outlen != sizeof(want) - 1 || memcmp(out, want, outlen) != 0)
        fail_msg("render: %zu bytes \"%.*s\", want %zu", outlen, (int)outlen, out,
                 sizeof(want) - 1);
    /* the parts form keeps each text part whole */
    kvr_tmpl_ctx_reset(ctx);
    memcpy(buf, body, sizeof(body) - 1);
    assert_int_equal(kvr_reqbody_query_ext(buf, sizeof(body) - 1, &g_sc, &q, ctx, &ch, NULL, 0,
                                           NULL, &e), 0);
    kvr_tmpl *tp;
    static const char psrc[] = "{% for p in messages[1].content %}[{{ p.text }}]{% endfor %}";
    assert_int_equal(kvr_tmpl_compile(psrc, sizeof(psrc) - 1, &tp, err, sizeof(err)), 0);
    vars = kvr_tmpl_dict(ctx);
    assert_int_equal(kvr_tmpl_dict_set(ctx, vars, "messages", 8, ch.messages_parts), 0);
    assert_int_equal(kvr_tmpl_render(tp, ctx, vars, 0, &out, &outlen, err, sizeof(err)), 0);
    assert_int_equal(outlen, 8);
    assert_memory_equal(out, "[a\0b][\0]", 8);
    kvr_tmpl_free(tp);
    kvr_tmpl_free(t);
    kvr_tmpl_ctx_destroy(ctx);
    free(buf);
}

static void test_msgpack_random(void **state)
{
    unsigned seed0 = 12345;
    uint32_t want[64];
    (void)state;

    for (int iter = 0; iter < 3000; iter++) {
        unsigned s = seed0 + (unsigned)iter;
        struct mpw w = {.n = 0};
        struct kvr_reqbody_query q;
        struct kvr_err e;
        size_t n = (size_t)(rand_r(&s) % 65);

        mp_byte(&w, 0x82);
        mp_str(&w, "token_ids");
        mp_byte(&w, 0xdc);
        mp_be(&w, n, 2);
        for (size_t i = 0; i < n; i++) {
            uint32_t v;
            switch (rand_r(&s) % 4) {
            case 0: v = (uint32_t)(rand_r(&s) % 128); break;
            case 1: v = (uint32_t)(rand_r(&s) % 256); break;
            case 2: v = (uint32_t)(rand_r(&s) % 65536); break;
            default: v = ((uint32_t)rand_r(&s) << 8) ^ (uint32_t)rand_r(&s); break;
            }
            want[i] = v;
            if (rand_r(&s) % 16 == 0) { /* an unusual but valid width */
                mp_byte(&w, 0xcf);
                mp_be(&w, v, 8);
            } else {
                mp_uint(&w, v);
            }
        }
        mp_str(&w, "model");
        mp_str(&w, "m");
        if (qmp(&w, &q, &e) != 0 || q.ntokens != n ||
            memcmp(q.tokens, want, n * sizeof(uint32_t)) != 0)
            fail_msg("seed %u: %s", seed0 + (unsigned)iter, e.msg);
    }
}

/* The AVX-512 window decoder against the scalar path: random token arrays (every integer width,
 * signed encodings of non-negative and negative values, > 2^32, invalid type bytes, wrong
 * counts, truncated bodies), each body decoded from its own exactly sized heap copy (so ASan
 * sees any over-read) at every level; return code, message and tokens must agree. */
#define LV_MAX 1200
static uint32_t lv_tok[2][LV_MAX];
static const char *lv_pods[2][4];

static void lv_elem(struct mpw *w, unsigned *s, int mode)
{
    uint32_t r = (uint32_t)rand_r(s);
    unsigned pick = (unsigned)rand_r(s) % 1000;
    uint64_t v;

    if (mode == 0) /* mostly uint16/uint32 like real prompts */
        v = pick < 500 ? r % 65536 : 65536 + r % 100000;
    else if (mode == 1) /* fixint-dense */
        v = pick < 800 ? r % 128 : r % 300;
    else
        v = pick < 250 ? r % 128 : pick < 500 ? r % 256 : pick < 750 ? r % 65536 : r;
    if (pick % 97 == 3 && mode >= 2) { /* an unusual valid width */
        switch (rand_r(s) % 5) {
        case 0: mp_byte(w, 0xcf); mp_be(w, v, 8); return;
        case 1: mp_byte(w, 0xd3); mp_be(w, v, 8); return;
        case 2: mp_byte(w, 0xd2); mp_be(w, v & 0x7fffffff, 4); return;
        case 3: mp_byte(w, 0xd1); mp_be(w, v & 0x7fff, 2); return;
        default: mp_byte(w, 0xd0); mp_be(w, v & 0x7f, 1); return;
        }
    }
    if (pick % 331 == 7 && mode >= 3) { /* invalid: negative, too big, not an integer */
        static const unsigned char bad[][9] = {
            {0xff}, {0xe0}, {0xd0, 0x80}, {0xd1, 0xff, 0xff}, {0xd2, 0x80, 0, 0, 0},
            {0xd3, 0xff, 0, 0, 0, 0, 0, 0, 0}, {0xcf, 0, 0, 0, 1, 0, 0, 0, 0},
            {0xca, 0x3f, 0x80, 0, 0}, {0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, {0xc0}, {0xc2},
            {0xc3}, {0xa1, '1'}, {0x90}, {0x80}, {0xc1}, {0xd4, 1, 2}, {0xcc}, {0xcd, 1}};
        static const unsigned char blen[] = {1, 1, 2, 3, 5, 9, 9, 5, 9, 1, 1, 1, 2, 1, 1, 1, 3, 1, 2};
        unsigned k = (unsigned)rand_r(s) % (unsigned)sizeof(blen);
        mp_raw(w, bad[k], blen[k]);
        return;
    }
    mp_uint(w, v);
}

static void test_msgpack_levels(void **state)
{
    static struct mpw w; /* 4096 bytes */
    int best = kvr_reqbody_force_isa(-1);
    unsigned seed0 = 777;
    long agree_ok = 0, agree_err = 0;
    (void)state;

    printf("-- msgpack token decoder: best level %d\n", best);
    for (int iter = 0; iter < 20000; iter++) {
        unsigned s = seed0 + (unsigned)iter;
        int mode = rand_r(&s) % 5;
        size_t n = (size_t)(rand_r(&s) % 3 == 0 ? rand_r(&s) % 70 : rand_r(&s) % 1100);
        size_t declared = n, cut;
        int rc[2];
        struct kvr_reqbody_query q[2];
        struct kvr_err e[2];
        bool tokens_last = rand_r(&s) % 2;

        w.n = 0;
        mp_byte(&w, 0x82);
        if (!tokens_last) {
            mp_str(&w, "model");
            mp_str(&w, "m");
        }
        if (rand_r(&s) % 20 == 0)
            declared = n + (size_t)(rand_r(&s) % 5) - 2;
        mp_str(&w, "token_ids");
        mp_byte(&w, 0xdd);
        mp_be(&w, declared, 4);
        for (size_t i = 0; i < n && w.n < sizeof(w.b) - 32; i++)
            lv_elem(&w, &s, mode);
        if (tokens_last) {
            mp_str(&w, "model");
            mp_str(&w, "m");
        }
        cut = w.n;
        if (rand_r(&s) % 10 == 0)
            cut = (size_t)rand_r(&s) % (w.n + 1);
        for (int lv = 0; lv < 2; lv++) {
            struct kvr_reqbody_scratch sc = {lv_tok[lv], LV_MAX, lv_pods[lv], 4, NULL, 0};
            char *b = malloc(cut ? cut : 1);
            memcpy(b, w.b, cut);
            kvr_reqbody_force_isa(lv == 0 ? 0 : -1);
            memset(&e[lv], 0, sizeof(e[lv]));
            memset(lv_tok[lv], 0, sizeof(lv_tok[lv]));
            rc[lv] = kvr_reqbody_query_msgpack(b, cut, &sc, &q[lv], &e[lv]);
            free(b);
        }
        kvr_reqbody_force_isa(-1);
        if (rc[0] != rc[1] || strcmp(e[0].msg, e[1].msg) != 0)
            fail_msg("seed %u: rc %d '%s' vs %d '%s'", seed0 + (unsigned)iter, rc[0], e[0].msg,
                     rc[1], e[1].msg);
        if (rc[0] == 0) {
            if (q[0].ntokens != q[1].ntokens ||
                memcmp(lv_tok[0], lv_tok[1], q[0].ntokens * sizeof(uint32_t)) != 0)
                fail_msg("seed %u: tokens differ", seed0 + (unsigned)iter);
            agree_ok++;
        } else {
            agree_err++;
        }
    }
    printf("-- %ld accepted, %ld rejected, identical at levels 0 and %d\n", agree_ok, agree_err,
           best);
}

static int teardown(void **state)
{
    (void)state;
    free(g_buf);
    g_buf = NULL;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_query),
        cmocka_unit_test(test_json_query_errors),
        cmocka_unit_test(test_salt_media),
        cmocka_unit_test(test_endpoint_json),
        cmocka_unit_test(test_msgpack_query),
        cmocka_unit_test(test_msgpack_errors),
        cmocka_unit_test(test_nul_fields),
        cmocka_unit_test(test_nul_chat),
        cmocka_unit_test(test_msgpack_random),
        cmocka_unit_test(test_msgpack_levels),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
