/* test_jtok.c — the strict JSON cursor and the fast token-array parser.
 *
 * Every input is copied into a heap buffer of exactly its length, so an ASan build catches
 * any read past the end (the fast path must stop before the last 16 bytes). Randomized
 * cases print their seed on failure.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "http/jtok.h"

static char *dup_exact(const char *s, size_t len)
{
    char *b = malloc(len ? len : 1);
    assert_non_null(b);
    memcpy(b, s, len);
    return b;
}

/* Parses s as a token array; returns rc, fills out/n. */
static int parse_arr(const char *s, size_t len, uint32_t *out, size_t cap, size_t *n,
                     struct kvr_jtok *jout)
{
    char *b = dup_exact(s, len);
    struct kvr_jtok j;
    int rc;

    kvr_jtok_init(&j, b, len);
    rc = kvr_jtok_u32_array(&j, out, cap, n);
    if (rc == 0)
        rc = kvr_jtok_finish(&j);
    if (jout != NULL) {
        *jout = j;
        jout->p = jout->end = jout->base = NULL; /* buffer freed below */
    }
    free(b);
    return rc;
}

static int parse_str(const char *s, uint32_t *out, size_t cap, size_t *n)
{
    return parse_arr(s, strlen(s), out, cap, n, NULL);
}

static void test_valid_forms(void **state)
{
    uint32_t out[16];
    size_t n;
    (void)state;

    assert_int_equal(parse_str("[]", out, 16, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(parse_str("[ \t\r\n]", out, 16, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(parse_str(" \n[0]\n ", out, 16, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 0);
    assert_int_equal(parse_str("[1,2,3]", out, 16, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(out[2], 3);
    assert_int_equal(parse_str("[ 1 , 2 ,3\t,\n4\r]", out, 16, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(out[3], 4);
    assert_int_equal(parse_str("[4294967295, 0, 4294967295]", out, 16, &n), 0);
    assert_int_equal(n, 3);
    assert_true(out[0] == 4294967295u && out[1] == 0 && out[2] == 4294967295u);
    /* every digit count through the fast path (followed by plenty of bytes) */
    assert_int_equal(parse_str("[1, 12, 123, 1234, 12345, 123456, 1234567, 12345678, "
                               "123456789, 1234567890, 7, 8, 9, 10, 11, 12]",
                               out, 16, &n),
                     0);
    assert_int_equal(n, 16);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[3], 1234);
    assert_int_equal(out[6], 1234567);
    assert_int_equal(out[7], 12345678);
    assert_int_equal(out[8], 123456789);
    assert_int_equal(out[9], 1234567890);
    assert_int_equal(out[15], 12);
    /* zeros next to separators of each kind */
    assert_int_equal(parse_str("[0,0 ,0\n,0]        ", out, 16, &n), 0);
    assert_int_equal(n, 4);
}

static void expect_invalid(const char *s, int code)
{
    uint32_t out[64];
    size_t n;
    int rc = parse_str(s, out, 64, &n);
    if (rc != code)
        fail_msg("input %s: rc %d, want %d", s, rc, code);
}

static void test_invalid_forms(void **state)
{
    static const char *const bad[] = {
        "", " ", "1", "{}", "[", "[ ", "[1", "[1,", "[1 ", "[1,]", "[,1]", "[,]", "[1 2]",
        "[1,,2]", "[-1]", "[-0]", "[1.0]", "[1.5]", "[1e3]", "[1E3]", "[1e-3]", "[01]", "[00]",
        "[007]", "[+1]", "[\"1\"]", "[null]", "[true]", "[false]", "[[1]]", "[{}]",
        "[4294967296]", "[4294967300]", "[9999999999]", "[10000000000]",
        "[99999999999999999999999]", "[0x10]", "[1}", "[1]]", "[1] x", "[1a]", "[1,a]",
        "[Infinity]", "[NaN]", "[ 1, 2, 3, 4, 5, 6, 7, 8, -9 ]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9.5, 10, 11, 12, 13]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 09, 10, 11, 12, 13]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 12345678901, 10, 11, 12, 13]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 4294967296, 10, 11, 12, 13]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 00000000, 10, 11, 12, 13]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 1\x80, 10, 11, 12, 13]",
        "[1, 2, 3, 4, 5, 6, 7, 8,\x80 10, 11, 12, 13]",
        "[1, 2, 3, 4, 5, 6, 7, 8 9, 10, 11, 12, 13]",
        "[1\v]", "[\f1]",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_invalid(bad[i], -EINVAL);
}

static void test_error_messages(void **state)
{
    uint32_t out[8];
    size_t n;
    struct kvr_jtok j;
    char msg[200];
    (void)state;

    assert_int_equal(parse_arr("[5, -1]", 7, out, 8, &n, &j), -EINVAL);
    kvr_jtok_errstr(&j, msg, sizeof(msg));
    assert_non_null(strstr(msg, "negative"));
    assert_int_equal(j.err_index, 1);
    assert_int_equal(j.err_off, 4);

    assert_int_equal(parse_arr("[1.5]", 5, out, 8, &n, &j), -EINVAL);
    kvr_jtok_errstr(&j, msg, sizeof(msg));
    assert_non_null(strstr(msg, "fraction"));

    assert_int_equal(parse_arr("[4294967296]", 12, out, 8, &n, &j), -EINVAL);
    kvr_jtok_errstr(&j, msg, sizeof(msg));
    assert_non_null(strstr(msg, "range"));

    assert_int_equal(parse_arr("[012]", 5, out, 8, &n, &j), -EINVAL);
    kvr_jtok_errstr(&j, msg, sizeof(msg));
    assert_non_null(strstr(msg, "leading zero"));
}

static void test_cap(void **state)
{
    uint32_t out[4];
    size_t n;
    (void)state;

    assert_int_equal(parse_str("[1,2,3,4]", out, 4, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(parse_str("[1,2,3,4,5]", out, 4, &n), -E2BIG);
    assert_int_equal(parse_str("[1]", out, 0, &n), -E2BIG);
    assert_int_equal(parse_str("[]", out, 0, &n), 0);
}

/* Random arrays with random values (all digit counts) and random whitespace, checked
 * against the values used to build them; then every proper prefix must fail. */
static size_t gen_array(unsigned *seed, uint32_t *vals, size_t nvals, char *buf, size_t cap)
{
    static const char *const ws[] = {"", "", "", " ", "  ", "\n", "\t", "\r\n", " \n "};
    size_t len = 0;

#define PUT(...) len += (size_t)snprintf(buf + len, cap - len, __VA_ARGS__)
    PUT("%s[", ws[rand_r(seed) % 9]);
    for (size_t i = 0; i < nvals; i++) {
        uint32_t v;
        switch (rand_r(seed) % 5) {
        case 0: v = (uint32_t)(rand_r(seed) % 10); break;
        case 1: v = (uint32_t)(rand_r(seed) % 1000); break;
        case 2: v = (uint32_t)(rand_r(seed) % 200000); break;
        case 3: v = ((uint32_t)rand_r(seed) << 16) ^ (uint32_t)rand_r(seed); break;
        default: v = UINT32_MAX - (uint32_t)(rand_r(seed) % 3); break;
        }
        vals[i] = v;
        PUT("%s%" PRIu32 "%s%s", ws[rand_r(seed) % 9], v, ws[rand_r(seed) % 9],
            i + 1 < nvals ? "," : "");
    }
    PUT("%s]%s", ws[rand_r(seed) % 9], ws[rand_r(seed) % 9]);
#undef PUT
    return len;
}

static void test_random_roundtrip(void **state)
{
    unsigned seed0 = (unsigned)time(NULL);
    uint32_t vals[300], out[300];
    static char buf[300 * 40];
    (void)state;

    for (int iter = 0; iter < 2000; iter++) {
        unsigned seed = seed0 + (unsigned)iter, s = seed;
        size_t nv = (size_t)(rand_r(&s) % 300), n, len;
        int rc;

        len = gen_array(&s, vals, nv, buf, sizeof(buf));
        rc = parse_arr(buf, len, out, 300, &n, NULL);
        if (rc != 0 || n != nv || memcmp(out, vals, nv * sizeof(uint32_t)) != 0)
            fail_msg("seed %u: rc %d n %zu want %zu", seed, rc, n, nv);
        if (iter % 20 == 0) {
            /* every truncation is an error (the last byte may be trailing whitespace) */
            size_t full = len;
            while (full > 0 && (buf[full - 1] == ' ' || buf[full - 1] == '\n' ||
                                buf[full - 1] == '\r' || buf[full - 1] == '\t'))
                full--;
            for (size_t k = 0; k < full; k++)
                if (parse_arr(buf, k, out, 300, &n, NULL) == 0)
                    fail_msg("seed %u: prefix %zu of %zu accepted", seed, k, full);
        }
    }
}

/* Every single-byte corruption of a valid array either still parses to a value set that a
 * scalar reference agrees with, or is rejected — never a crash. Compare against strtoull. */
static int ref_parse(const char *s, size_t len, uint32_t *out, size_t cap, size_t *n)
{
    size_t i = 0, cnt = 0;
#define WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')
    while (i < len && WS(s[i]))
        i++;
    if (i >= len || s[i] != '[')
        return -1;
    i++;
    while (i < len && WS(s[i]))
        i++;
    if (i < len && s[i] == ']') {
        i++;
        goto tail;
    }
    for (;;) {
        uint64_t v = 0;
        size_t st = i;
        while (i < len && WS(s[i]))
            i++;
        st = i;
        if (i >= len || s[i] < '0' || s[i] > '9')
            return -1;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (uint64_t)(s[i] - '0');
            if (v > UINT32_MAX)
                return -1;
            i++;
        }
        if (s[st] == '0' && i - st > 1)
            return -1;
        if (cnt >= cap)
            return -2;
        out[cnt++] = (uint32_t)v;
        while (i < len && WS(s[i]))
            i++;
        if (i < len && s[i] == ',') {
            i++;
            continue;
        }
        if (i < len && s[i] == ']') {
            i++;
            break;
        }
        return -1;
    }
tail:
    while (i < len && WS(s[i]))
        i++;
#undef WS
    *n = cnt;
    return i == len ? 0 : -1;
}

static void test_mutations_vs_reference(void **state)
{
    static const char alphabet[] = "0123456789 ,[]-.eE+\n\x80x";
    char buf[1024];
    uint32_t out[64], ref[64];
    unsigned seed0 = (unsigned)time(NULL) * 7u;
    (void)state;

    for (int iter = 0; iter < 20000; iter++) {
        unsigned seed = seed0 + (unsigned)iter, s = seed;
        uint32_t vals[40];
        size_t len = gen_array(&s, vals, (size_t)(rand_r(&s) % 20), buf, sizeof(buf) - 1);
        size_t nmut = 1 + (size_t)(rand_r(&s) % 3), n = 0, rn = 0;
        int rc, rr;

        if (len == 0)
            continue;
        for (size_t m = 0; m < nmut; m++)
            buf[rand_r(&s) % len] = alphabet[rand_r(&s) % (sizeof(alphabet) - 1)];
        rc = parse_arr(buf, len, out, 64, &n, NULL);
        rr = ref_parse(buf, len, ref, 64, &rn);
        if ((rc == 0) != (rr == 0) ||
            (rc == 0 && (n != rn || memcmp(out, ref, n * sizeof(uint32_t)) != 0)))
            fail_msg("seed %u: '%.*s' rc %d ref %d", seed, (int)len, buf, rc, rr);
    }
}

static void test_long_array(void **state)
{
    size_t nv = 1u << 20, cap = nv * 12 + 16, len = 0, n;
    char *buf = malloc(cap);
    uint32_t *out = malloc(nv * sizeof(uint32_t));
    int rc;
    (void)state;

    assert_non_null(buf);
    assert_non_null(out);
    buf[len++] = '[';
    for (size_t i = 0; i < nv; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%zu", i ? ", " : "",
                                (i * 2654435761u) % 200003u);
    buf[len++] = ']';
    rc = parse_arr(buf, len, out, nv, &n, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(n, nv);
    for (size_t i = 0; i < nv; i++)
        if (out[i] != (uint32_t)((i * 2654435761u) % 200003u))
            fail_msg("element %zu", i);
    assert_int_equal(parse_arr(buf, len, out, nv - 1, &n, NULL), -E2BIG);
    free(buf);
    free(out);
}

/* ---- strings, skipping, objects ------------------------------------------------------ */

static int one_string(const char *s, char *dec, size_t cap)
{
    size_t len = strlen(s), dl;
    char *b = dup_exact(s, len), *out;
    struct kvr_jtok j;
    int rc;

    kvr_jtok_init(&j, b, len);
    rc = kvr_jtok_string(&j, &out, &dl);
    if (rc == 0)
        rc = kvr_jtok_finish(&j);
    if (rc == 0 && dec != NULL) {
        assert_true(dl < cap);
        memcpy(dec, out, dl + 1);
        assert_int_equal(strlen(dec), dl);
    }
    free(b);
    return rc;
}

static void test_strings(void **state)
{
    char d[64];
    (void)state;

    assert_int_equal(one_string("\"abc\"", d, sizeof(d)), 0);
    assert_string_equal(d, "abc");
    assert_int_equal(one_string("\"\"", d, sizeof(d)), 0);
    assert_string_equal(d, "");
    assert_int_equal(one_string("\"a\\\"b\\\\c\\/d\\n\\t\\r\\b\\f\"", d, sizeof(d)), 0);
    assert_string_equal(d, "a\"b\\c/d\n\t\r\b\f");
    assert_int_equal(one_string("\"\\u0041\\u00e9\\u20ac\\ud83d\\ude00\"", d, sizeof(d)), 0);
    assert_string_equal(d, "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_int_equal(one_string("\"caf\xc3\xa9\"", d, sizeof(d)), 0);
    assert_string_equal(d, "caf\xc3\xa9");

    assert_int_equal(one_string("\"abc", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\\ud83d\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\\ude00\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\\ud83d\\u0041\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\\x\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\\u12\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\\u12g4\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"a\nb\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\xc3\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"\xc0\x80\"", NULL, 0), -EINVAL);       /* overlong */
    assert_int_equal(one_string("\"\xed\xa0\x80\"", NULL, 0), -EINVAL);   /* surrogate */
    assert_int_equal(one_string("\"\xf4\x90\x80\x80\"", NULL, 0), -EINVAL); /* > U+10FFFF */
    assert_int_equal(one_string("\"\xff\"", NULL, 0), -EINVAL);
    assert_int_equal(one_string("\"a\" x", NULL, 0), -EINVAL);
    assert_int_equal(one_string("abc", NULL, 0), -EINVAL);
}

/* U+0000: "\u0000" decodes to a 0 byte inside the string (the length counts it; vLLM takes
 * such prompts), everywhere a string is decoded or skipped; a raw 0 byte is still a control
 * character. */
static void test_nul_strings(void **state)
{
    static const char body[] = "{\"k\\u0000ey\": \"a\\u0000b\", \"x\": [\"\\u0000\"]}";
    struct kvr_jtok j;
    char *b, *key, *s;
    size_t klen, n;
    int st = 0, ast = 0;
    (void)state;

    b = dup_exact("\"\\u0000\"", 8);
    kvr_jtok_init(&j, b, 8);
    assert_int_equal(kvr_jtok_string(&j, &s, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(s[0], '\0');
    assert_int_equal(kvr_jtok_finish(&j), 0);
    free(b);

    b = dup_exact(body, sizeof(body) - 1);
    kvr_jtok_init(&j, b, sizeof(body) - 1);
    assert_int_equal(kvr_jtok_object_next(&j, &st, &key, &klen), 1);
    assert_int_equal(klen, 4);
    assert_memory_equal(key, "k\0ey", 5); /* and the terminator after it */
    assert_int_equal(kvr_jtok_string(&j, &s, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(s, "a\0b", 4);
    assert_int_equal(kvr_jtok_object_next(&j, &st, &key, &klen), 1);
    assert_int_equal(kvr_jtok_array_next(&j, &ast), 1);
    assert_int_equal(kvr_jtok_string(&j, &s, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(s[0], '\0');
    assert_int_equal(kvr_jtok_array_next(&j, &ast), 0);
    assert_int_equal(kvr_jtok_object_next(&j, &st, &key, &klen), 0);
    assert_int_equal(kvr_jtok_finish(&j), 0);
    free(b);

    /* validated but not decoded: kvr_jtok_skip takes it too */
    b = dup_exact(body, sizeof(body) - 1);
    kvr_jtok_init(&j, b, sizeof(body) - 1);
    assert_int_equal(kvr_jtok_skip(&j), 0);
    free(b);

    /* a raw 0 byte is still a control character, and a short escape still bad */
    b = dup_exact("\"a\0b\"", 5);
    kvr_jtok_init(&j, b, 5);
    assert_int_equal(kvr_jtok_string(&j, &s, &n), -EINVAL);
    assert_string_equal(j.msg, "control character in string");
    free(b);
    assert_int_equal(one_string("\"\\u000\"", NULL, 0), -EINVAL);

    /* and back out: kvr_jtok_escape writes it as \u0000 */
    char out[32];
    size_t w = kvr_jtok_escape(out, "a\0b", 3);
    assert_int_equal(w, 10);
    assert_memory_equal(out, "\"a\\u0000b\"", 10);
}

static int skip_all(const char *s)
{
    size_t len = strlen(s);
    char *b = dup_exact(s, len);
    struct kvr_jtok j;
    int rc;

    kvr_jtok_init(&j, b, len);
    rc = kvr_jtok_skip(&j);
    if (rc == 0)
        rc = kvr_jtok_finish(&j);
    free(b);
    return rc;
}

static void test_skip(void **state)
{
    static const char *const good[] = {
        "0", "-0", "1.5", "-1.5e10", "1E+2", "1e-2", "true", "false", "null", "\"x\"",
        "[]", "{}", "[1, [2, {\"a\": [true, null]}], \"s\"]", "{\"a\": {\"b\": {}}, \"c\": []}",
        " [ 1 , 2 ] ",
    };
    static const char *const bad[] = {
        "", "01", "-", "1.", ".5", "1e", "1e+", "+1", "tru", "nul", "[1,]", "{\"a\":}",
        "{\"a\" 1}", "{a: 1}", "{\"a\": 1,}", "[1 2]", "{\"a\": 1 \"b\": 2}", "'x'", "[", "{",
        "NaN", "[1]]", "{}{}",
    };
    char deep[400];
    (void)state;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (skip_all(good[i]) != 0)
            fail_msg("rejected %s", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (skip_all(bad[i]) != -EINVAL)
            fail_msg("accepted %s", bad[i]);
    /* depth: 64 levels fine, 65 rejected */
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    deep[128] = '\0';
    assert_int_equal(skip_all(deep), 0);
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    deep[130] = '\0';
    assert_int_equal(skip_all(deep), -EINVAL);
}

static void test_object_iteration(void **state)
{
    const char *src = "{ \"a\" : 1, \"b\\u0063\": [1,2], \"\": \"v\" }";
    size_t len = strlen(src), klen;
    char *b = dup_exact(src, len), *key;
    struct kvr_jtok j;
    int st = 0, rc, nkeys = 0;
    (void)state;

    kvr_jtok_init(&j, b, len);
    while ((rc = kvr_jtok_object_next(&j, &st, &key, &klen)) == 1) {
        if (nkeys == 0)
            assert_string_equal(key, "a");
        if (nkeys == 1)
            assert_string_equal(key, "bc");
        if (nkeys == 2)
            assert_int_equal(klen, 0);
        nkeys++;
        assert_int_equal(kvr_jtok_skip(&j), 0);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(nkeys, 3);
    assert_int_equal(kvr_jtok_finish(&j), 0);
    free(b);
}

static void test_escape(void **state)
{
    char out[128];
    size_t n;
    (void)state;

    n = kvr_jtok_escape(out, "a\"b\\c\n\x01\xc3\xa9\xff", 10);
    out[n] = '\0';
    assert_string_equal(out, "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\\ufffd\"");
    /* round trip through the parser */
    {
        size_t dl;
        char *dec;
        struct kvr_jtok j;
        n = kvr_jtok_escape(out, "x\ty\"z\x1f", 6);
        kvr_jtok_init(&j, out, n);
        assert_int_equal(kvr_jtok_string(&j, &dec, &dl), 0);
        assert_int_equal(dl, 6);
        assert_memory_equal(dec, "x\ty\"z\x1f", 6);
    }
}

int main(void)
{
    int rc = 0, best = kvr_jtok_force_isa(-1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_forms),
        cmocka_unit_test(test_invalid_forms),
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_random_roundtrip),
        cmocka_unit_test(test_mutations_vs_reference),
        cmocka_unit_test(test_long_array),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_nul_strings),
        cmocka_unit_test(test_skip),
        cmocka_unit_test(test_object_iteration),
        cmocka_unit_test(test_escape),
    };
    /* every integer path this CPU has: portable, SSE2 blocks, AVX2 blocks */
    for (int level = 0; level <= best; level++) {
        printf("-- token paths up to level %d\n", kvr_jtok_force_isa(level));
        rc |= cmocka_run_group_tests(tests, NULL, NULL);
    }
    kvr_jtok_force_isa(-1);
    return rc;
}
