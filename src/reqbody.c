/* reqbody.c — JSON (through jtok) and msgpack (a bounded cursor) request bodies.
 *
 * Design: one pass over the body, in place. JSON keys and string values are decoded into the
 * buffer by jtok; msgpack strings are moved one header back (the header is at least one byte
 * long) so they can be NUL-terminated without touching the next item. Strings that hold a NUL
 * byte are rejected (they cannot be C strings). The msgpack cursor checks every length
 * against the bytes left before reading, so a count can never make it loop past the buffer;
 * generic values are skipped with a depth limit. Msgpack token arrays are decoded 64-byte
 * window at a time with AVX-512 VBMI when the CPU has it (runtime dispatch; see "token
 * windows" below), the scalar cursor taking every element the windows leave; both paths
 * accept and reject exactly the same bodies with the same messages (tests/unit/test_reqbody.c
 * and fuzz_jtok compare them).
 * Pure; any thread.
 */
#include "reqbody.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "index.h"
#include "jtok.h"

#define MP_MAX_DEPTH 64

static int jerr(struct kvr_jtok *j, struct kvr_err *err)
{
    if (err != NULL)
        kvr_jtok_errstr(j, err->msg, sizeof(err->msg));
    return j->code != 0 ? j->code : -EINVAL;
}

static bool key_is(const char *k, size_t klen, const char *name)
{
    size_t n = strlen(name);
    return klen == n && memcmp(k, name, n) == 0;
}

/* ---- JSON ------------------------------------------------------------------------------- */

int kvr_reqbody_query_json(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                           struct kvr_reqbody_query *q, struct kvr_err *err)
{
    struct kvr_jtok j;
    bool seen_model = false, seen_tokens = false, seen_lora = false, seen_pods = false;
    int st = 0, rc;
    char *key, *str;
    size_t klen, slen;

    memset(q, 0, sizeof(*q));
    q->tokens = s->tokens;
    q->pods = s->pods;
    kvr_jtok_init(&j, body, len);
    if (kvr_jtok_peek(&j) != '{')
        return kvr_err_set(err, -EINVAL, "body must be a JSON object");
    while ((rc = kvr_jtok_object_next(&j, &st, &key, &klen)) == 1) {
        if (key_is(key, klen, "token_ids")) {
            if (seen_tokens)
                return kvr_err_set(err, -EINVAL, "duplicate key \"token_ids\"");
            seen_tokens = true;
            rc = kvr_jtok_u32_array(&j, s->tokens, s->max_tokens, &q->ntokens);
            if (rc == -E2BIG)
                return kvr_err_set(err, -E2BIG, "too many token ids (limit %zu)", s->max_tokens);
            if (rc != 0)
                return jerr(&j, err);
        } else if (key_is(key, klen, "model")) {
            if (seen_model)
                return kvr_err_set(err, -EINVAL, "duplicate key \"model\"");
            seen_model = true;
            if (kvr_jtok_peek(&j) != '"')
                return kvr_err_set(err, -EINVAL, "\"model\" must be a string");
            if (kvr_jtok_string(&j, &str, &slen) != 0)
                return jerr(&j, err);
            q->model = str;
            if (slen == 0 || slen > KVR_NAME_MAX)
                return kvr_err_set(err, -EINVAL, "\"model\" must be 1..%d bytes", KVR_NAME_MAX);
        } else if (key_is(key, klen, "lora_name")) {
            if (seen_lora)
                return kvr_err_set(err, -EINVAL, "duplicate key \"lora_name\"");
            seen_lora = true;
            if (kvr_jtok_null(&j))
                continue;
            if (kvr_jtok_peek(&j) != '"')
                return kvr_err_set(err, -EINVAL, "\"lora_name\" must be a string or null");
            if (kvr_jtok_string(&j, &str, &slen) != 0)
                return jerr(&j, err);
            if (slen > KVR_NAME_MAX)
                return kvr_err_set(err, -EINVAL, "\"lora_name\" longer than %d bytes",
                                   KVR_NAME_MAX);
            q->lora_name = slen ? str : NULL;
        } else if (key_is(key, klen, "pods")) {
            int ast = 0;
            if (seen_pods)
                return kvr_err_set(err, -EINVAL, "duplicate key \"pods\"");
            seen_pods = true;
            if (kvr_jtok_null(&j))
                continue;
            if (kvr_jtok_peek(&j) != '[')
                return kvr_err_set(err, -EINVAL, "\"pods\" must be an array of strings");
            while ((rc = kvr_jtok_array_next(&j, &ast)) == 1) {
                if (kvr_jtok_peek(&j) != '"')
                    return kvr_err_set(err, -EINVAL, "\"pods\" must be an array of strings");
                if (kvr_jtok_string(&j, &str, &slen) != 0)
                    return jerr(&j, err);
                if (q->npods >= s->max_pods)
                    return kvr_err_set(err, -EINVAL, "too many pods (limit %zu)", s->max_pods);
                s->pods[q->npods++] = str;
            }
            if (rc < 0)
                return jerr(&j, err);
        } else {
            if (kvr_jtok_skip(&j) != 0)
                return jerr(&j, err);
        }
    }
    if (rc < 0)
        return jerr(&j, err);
    if (kvr_jtok_finish(&j) != 0)
        return jerr(&j, err);
    if (!seen_model)
        return kvr_err_set(err, -EINVAL, "missing \"model\"");
    if (!seen_tokens)
        return kvr_err_set(err, -EINVAL, "missing \"token_ids\"");
    return 0;
}

static int opt_string(struct kvr_jtok *j, const char *name, const char **out, struct kvr_err *err)
{
    char *str;
    size_t slen;

    if (kvr_jtok_null(j)) {
        *out = NULL;
        return 0;
    }
    if (kvr_jtok_peek(j) != '"')
        return kvr_err_set(err, -EINVAL, "\"%s\" must be a string", name);
    if (kvr_jtok_string(j, &str, &slen) != 0)
        return jerr(j, err);
    *out = slen ? str : NULL;
    return 0;
}

int kvr_reqbody_endpoint_json(char *body, size_t len, struct kvr_reqbody_endpoint *e,
                              struct kvr_err *err)
{
    struct kvr_jtok j;
    bool seen[3] = {false, false, false};
    static const char *const names[3] = {"endpoint", "replay_endpoint", "pod"};
    const char **slots[3];
    int st = 0, rc;
    char *key;
    size_t klen;

    memset(e, 0, sizeof(*e));
    slots[0] = &e->endpoint;
    slots[1] = &e->replay_endpoint;
    slots[2] = &e->pod;
    kvr_jtok_init(&j, body, len);
    if (kvr_jtok_peek(&j) != '{')
        return kvr_err_set(err, -EINVAL, "body must be a JSON object");
    while ((rc = kvr_jtok_object_next(&j, &st, &key, &klen)) == 1) {
        int k;
        for (k = 0; k < 3; k++)
            if (key_is(key, klen, names[k]))
                break;
        if (k == 3) {
            if (kvr_jtok_skip(&j) != 0)
                return jerr(&j, err);
            continue;
        }
        if (seen[k])
            return kvr_err_set(err, -EINVAL, "duplicate key \"%s\"", names[k]);
        seen[k] = true;
        if ((rc = opt_string(&j, names[k], slots[k], err)) != 0)
            return rc;
    }
    if (rc < 0)
        return jerr(&j, err);
    if (kvr_jtok_finish(&j) != 0)
        return jerr(&j, err);
    if (e->endpoint == NULL)
        return kvr_err_set(err, -EINVAL, "missing \"endpoint\" (a non-empty string)");
    return 0;
}

/* ---- msgpack ---------------------------------------------------------------------------- */

struct mp {
    unsigned char *p;
    unsigned char *end;
    unsigned char *base;
    struct kvr_err *err;
};

static int mp_fail(struct mp *m, const char *what)
{
    return kvr_err_set(m->err, -EINVAL, "msgpack: %s at byte %zu", what,
                       (size_t)(m->p - m->base));
}

static inline uint64_t be(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t be64(uint64_t x)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return x;
#else
    return __builtin_bswap64(x);
#endif
}

static inline uint64_t le64(uint64_t x)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_bswap64(x);
#else
    return x;
#endif
}

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline bool mp_has(const struct mp *m, uint64_t n)
{
    return (uint64_t)(m->end - m->p) >= n;
}

/* Reads a container or string header of the given family: returns 0 and *n, or -EINVAL. */
enum mp_kind { MP_STR, MP_ARRAY, MP_MAP };

static int mp_header(struct mp *m, enum mp_kind kind, uint64_t *n, size_t *hdr)
{
    unsigned char b;
    unsigned w = 0;

    if (!mp_has(m, 1))
        return -EINVAL;
    b = m->p[0];
    switch (kind) {
    case MP_STR:
        if (b >= 0xa0 && b <= 0xbf) {
            *n = b & 0x1f;
            *hdr = 1;
            return 0;
        }
        w = b == 0xd9 ? 1 : b == 0xda ? 2 : b == 0xdb ? 4 : 0;
        break;
    case MP_ARRAY:
        if (b >= 0x90 && b <= 0x9f) {
            *n = b & 0x0f;
            *hdr = 1;
            return 0;
        }
        w = b == 0xdc ? 2 : b == 0xdd ? 4 : 0;
        break;
    case MP_MAP:
        if (b >= 0x80 && b <= 0x8f) {
            *n = b & 0x0f;
            *hdr = 1;
            return 0;
        }
        w = b == 0xde ? 2 : b == 0xdf ? 4 : 0;
        break;
    }
    if (w == 0 || !mp_has(m, 1 + w))
        return -EINVAL;
    *n = be(m->p + 1, w);
    *hdr = 1 + w;
    return 0;
}

/* A string: moved one header back and NUL-terminated in place. */
static int mp_string(struct mp *m, const char *name, char **s, size_t *len)
{
    uint64_t n;
    size_t hdr;
    unsigned char *start = m->p;

    if (mp_header(m, MP_STR, &n, &hdr) != 0 || !mp_has(m, hdr + n))
        return kvr_err_set(m->err, -EINVAL, "msgpack: \"%s\" must be a string", name);
    if (memchr(start + hdr, 0, n) != NULL)
        return kvr_err_set(m->err, -EINVAL, "msgpack: NUL byte in \"%s\"", name);
    memmove(start, start + hdr, n);
    start[n] = '\0';
    m->p = start + hdr + n;
    *s = (char *)start;
    *len = n;
    return 0;
}

static int mp_nil(struct mp *m)
{
    if (mp_has(m, 1) && m->p[0] == 0xc0) {
        m->p++;
        return 1;
    }
    return 0;
}

static int mp_skip(struct mp *m, int depth)
{
    unsigned char b;
    uint64_t n, len;
    size_t hdr;

    if (depth > MP_MAX_DEPTH)
        return mp_fail(m, "nested too deeply");
    if (!mp_has(m, 1))
        return mp_fail(m, "truncated");
    b = m->p[0];
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        m->p++;
        return 0;
    }
    if ((b >= 0xa0 && b <= 0xbf) || b == 0xd9 || b == 0xda || b == 0xdb) {
        if (mp_header(m, MP_STR, &n, &hdr) != 0 || !mp_has(m, hdr + n))
            return mp_fail(m, "truncated string");
        m->p += hdr + n;
        return 0;
    }
    if ((b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd ||
        (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf) {
        bool map = (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf;
        if (mp_header(m, map ? MP_MAP : MP_ARRAY, &n, &hdr) != 0)
            return mp_fail(m, "truncated container");
        m->p += hdr;
        if (map)
            n *= 2;
        if (!mp_has(m, n)) /* every element takes at least one byte */
            return mp_fail(m, "truncated container");
        for (uint64_t i = 0; i < n; i++)
            if (mp_skip(m, depth + 1) != 0)
                return -EINVAL;
        return 0;
    }
    switch (b) {
    case 0xcc: case 0xd0: len = 1; break;
    case 0xcd: case 0xd1: len = 2; break;
    case 0xca: case 0xce: case 0xd2: len = 4; break;
    case 0xcb: case 0xcf: case 0xd3: len = 8; break;
    case 0xd4: len = 2; break; /* fixext: type + data */
    case 0xd5: len = 3; break;
    case 0xd6: len = 5; break;
    case 0xd7: len = 9; break;
    case 0xd8: len = 17; break;
    case 0xc4: case 0xc5: case 0xc6: case 0xc7: case 0xc8: case 0xc9: {
        unsigned w = (b == 0xc4 || b == 0xc7) ? 1 : (b == 0xc5 || b == 0xc8) ? 2 : 4;
        if (!mp_has(m, 1 + w))
            return mp_fail(m, "truncated");
        len = w + be(m->p + 1, w) + (b >= 0xc7 ? 1 : 0);
        break;
    }
    default:
        return mp_fail(m, "invalid type byte");
    }
    if (!mp_has(m, 1 + len))
        return mp_fail(m, "truncated");
    m->p += 1 + len;
    return 0;
}

/* Elements [i, lim) of a token array at *pp, one type byte at a time (the reference path, and
 * every element the window path leaves: rare widths, invalid bytes, the tail). */
static int mp_tokens_range(struct mp *m, uint32_t *out, const unsigned char **pp, uint64_t i,
                           uint64_t lim)
{
    const unsigned char *p = *pp, *end = m->end;

    /* Two tokens per step: the second tag is found by shifting the 8 bytes already loaded, so
     * the loop-carried chain is one load plus a few ALU ops per pair. Anything but fixint and
     * uint8/16/32 leaves this loop for the careful one below. */
    while (i + 2 <= lim && end - p >= 24) {
        uint64_t x, y0, y1;
        unsigned b0, b1, k0, k1, l0, l1;
        memcpy(&x, p, 8);
        x = le64(x);
        b0 = (unsigned)(x & 0xff);
        k0 = b0 - 0xcc;
        if (UNLIKELY(b0 >= 0x80 && k0 > 2))
            break;
        l0 = b0 < 0x80 ? 1 : 1 + (1u << k0);
        b1 = (unsigned)(x >> (8 * l0)) & 0xff;
        k1 = b1 - 0xcc;
        if (UNLIKELY(b1 >= 0x80 && k1 > 2))
            break;
        l1 = b1 < 0x80 ? 1 : 1 + (1u << k1);
        memcpy(&y0, p + 1, 8);
        memcpy(&y1, p + l0 + 1, 8);
        out[i] = b0 < 0x80 ? b0 : (uint32_t)(be64(y0) >> (64 - (8u << (k0 & 3))));
        out[i + 1] = b1 < 0x80 ? b1 : (uint32_t)(be64(y1) >> (64 - (8u << (k1 & 3))));
        p += l0 + l1;
        i += 2;
    }
    for (; i < lim; i++) {
        unsigned char b;
        uint64_t v;
        unsigned w;

        if (p >= end)
            goto truncated;
        b = *p;
        if (b <= 0x7f) {
            out[i] = b;
            p++;
            continue;
        }
        /* uint8/16/32: width 1 << (b - 0xcc), read as one big-endian 8-byte load */
        if (LIKELY((unsigned)(b - 0xcc) <= 2 && end - p >= 9)) {
            unsigned k = (unsigned)(b - 0xcc);
            uint64_t x;
            memcpy(&x, p + 1, 8);
            out[i] = (uint32_t)(be64(x) >> (64 - (8u << k)));
            p += 1 + (1u << k);
            continue;
        }
        switch (b) {
        case 0xcc: case 0xd0: w = 1; break;
        case 0xcd: case 0xd1: w = 2; break;
        case 0xce: case 0xd2: w = 4; break;
        case 0xcf: case 0xd3: w = 8; break;
        default:
            m->p = (unsigned char *)p;
            if (b >= 0xe0)
                return kvr_err_set(m->err, -EINVAL,
                                   "msgpack: negative token id (element %llu)",
                                   (unsigned long long)i);
            return kvr_err_set(m->err, -EINVAL,
                               "msgpack: token id is not an integer (element %llu, byte %zu)",
                               (unsigned long long)i, (size_t)(p - m->base));
        }
        if ((size_t)(end - p) < 1 + w)
            goto truncated;
        v = be(p + 1, w);
        if (b >= 0xd0) { /* signed: sign-extend then require 0 <= v */
            unsigned sh = 64 - 8 * w;
            int64_t sv = (int64_t)(v << sh) >> sh;
            if (sv < 0)
                return kvr_err_set(m->err, -EINVAL, "msgpack: negative token id (element %llu)",
                                   (unsigned long long)i);
            v = (uint64_t)sv;
        }
        if (v > UINT32_MAX)
            return kvr_err_set(m->err, -EINVAL,
                               "msgpack: token id out of range (>= 2^32) (element %llu)",
                               (unsigned long long)i);
        out[i] = (uint32_t)v;
        p += 1 + w;
    }
    *pp = p;
    return 0;
truncated:
    m->p = (unsigned char *)p;
    return mp_fail(m, "truncated token array");
}

/* ---- token windows (AVX-512 VBMI) ----------------------------------------------------------
 * The position of each element depends on the type bytes of all before it, so a window of 64
 * bytes is resolved by pointer doubling instead of a byte-by-byte walk: next[i] = i + length
 * of an element whose type byte would be at i (1 fixint, 2 uint8, 3 uint16, 5 uint32; any
 * other byte counts 1 and is checked below), positions >= 64 being fixed points of a 128-entry
 * table. Squaring that table five times (vpermi2b) gives next^1, ^2, ... ^32; lane j of V =
 * next^j(c) is built from the binary digits of j, where c is the first element's offset in the
 * window (0..4, carried from the previous window as next^32(c) - 64, a lookup off the data
 * path; a window with more than 32 elements, fixint-dense, takes a sixth step to 64 lanes). Lanes with V < 64 are the K elements starting in the window. Their type bytes are
 * checked (anything but fixint/uint8/16/32 ends the run before that element, which the scalar
 * path then takes: rare widths, negatives, errors); the value bytes are gathered from the two
 * loaded vectors in little-endian order (index = start + value bytes - k for byte k) into 16
 * u32 lanes per output vector. A window needs 128 readable bytes and 64 elements left, so
 * neither the loads nor the 64-lane stores leave the body or the scratch array. */

#if defined(__x86_64__)
#define MP_WINDOWS 1
#define MP_AVX512 "avx512f,avx512bw,avx512vbmi,bmi,popcnt"

__attribute__((target(MP_AVX512))) static size_t tokens_avx512(const unsigned char **pp,
                                                                const unsigned char *end,
                                                                uint32_t *out, size_t left)
{
    static const uint64_t bits[6] = {0xaaaaaaaaaaaaaaaaull, 0xccccccccccccccccull,
                                     0xf0f0f0f0f0f0f0f0ull, 0xff00ff00ff00ff00ull,
                                     0xffff0000ffff0000ull, 0xffffffff00000000ull};
    const unsigned char *q = *pp;
    size_t cnt = 0;
    const __m512i ctab = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 2, 4, 0, 0, 0, 0, 0, 0, 0, 0,
                                                              0, 0, 0, 0, 0));
    const __m512i x_cc = _mm512_set1_epi8((char)0xcc), x_70 = _mm512_set1_epi8(0x70);
    const __m512i x_80 = _mm512_set1_epi8((char)0x80), x_07 = _mm512_set1_epi8(7);
    const __m512i x_01 = _mm512_set1_epi8(1), x_40 = _mm512_set1_epi8(64);
    __m512i cv = _mm512_setzero_si512(); /* offset of the next element in the window, all lanes */
    uint8_t iota_b[64], kpat_b[64], rep_b[64];
    __m512i iota, iota1, hi, kpat, rep0, k16;

    for (int i = 0; i < 64; i++) {
        iota_b[i] = (uint8_t)i;
        kpat_b[i] = (uint8_t)(i & 3);
        rep_b[i] = (uint8_t)(i >> 2);
    }
    iota = _mm512_loadu_si512(iota_b);
    kpat = _mm512_loadu_si512(kpat_b);
    rep0 = _mm512_loadu_si512(rep_b);
    hi = _mm512_add_epi8(iota, _mm512_set1_epi8(64));
    iota1 = _mm512_add_epi8(iota, x_01);
    k16 = _mm512_set1_epi8(16);

    while (left - cnt >= 64 && end - q >= 128) {
        __m512i d0 = _mm512_loadu_si512(q), d1 = _mm512_loadu_si512(q + 64);
        __m512i vl, E, P, V, lsb, W, r;
        __mmask64 valid, bad;
        unsigned k;

        /* class of a type byte at i: value bytes (1, 2, 4 for uint8/16/32) | 8 for a fixint;
         * 0 = anything else. b ^ 0xcc + 0x70 (saturating) keeps 0xc0..0xcf on table entries
         * and sends every other byte above 0x7f, which vpshufb turns into 0. */
        vl = _mm512_shuffle_epi8(ctab, _mm512_adds_epu8(_mm512_xor_si512(d0, x_cc), x_70));
        P = _mm512_add_epi8(iota1, vl); /* the shortest path to the squarings */
        E = _mm512_or_si512(vl, _mm512_srli_epi16(_mm512_andnot_si512(d0, x_80), 4));
        V = cv;
        for (int b = 0; b < 5; b++) {
            V = _mm512_mask2_permutex2var_epi8(P, V, (__mmask64)bits[b], hi);
            P = _mm512_permutex2var_epi8(P, P, hi);
        }
        /* P = next^32; lanes 32..63 repeat 0..31. Element 31 still in the window (more than 32
         * elements: fixint-dense) takes the sixth step; otherwise next^32(c) has left it. */
        valid = _mm512_cmplt_epu8_mask(V, x_40);
        if (UNLIKELY(valid >> 31 & 1)) {
            V = _mm512_mask2_permutex2var_epi8(P, V, (__mmask64)bits[5], hi);
            P = _mm512_permutex2var_epi8(P, P, hi);
            valid = _mm512_cmplt_epu8_mask(V, x_40);
        } else {
            valid &= 0xffffffffull;
        }
        E = _mm512_permutexvar_epi8(V, E);
        bad = _mm512_mask_testn_epi8_mask(valid, E, E);
        k = (unsigned)__builtin_popcountll(valid);
        if (UNLIKELY(bad != 0))
            k = (unsigned)__builtin_ctzll(bad);
        vl = _mm512_and_si512(E, x_07);
        lsb = _mm512_add_epi8(V, vl);
        W = _mm512_max_epu8(vl, x_01);
        r = rep0;
        for (unsigned j = 0; j < k; j += 16) {
            __m512i base = _mm512_permutexvar_epi8(r, lsb);
            __m512i wid = _mm512_permutexvar_epi8(r, W);
            __mmask64 m = _mm512_cmpgt_epu8_mask(wid, kpat);
            __m512i idx = _mm512_sub_epi8(base, kpat);
            _mm512_storeu_si512(out + cnt + j, _mm512_maskz_permutex2var_epi8(m, d0, idx, d1));
            r = _mm512_add_epi8(r, k16);
        }
        cnt += k;
        if (UNLIKELY(bad != 0)) {
            uint8_t vb[64];
            _mm512_storeu_si512(vb, V);
            *pp = q + vb[k];
            return cnt;
        }
        cv = _mm512_sub_epi8(_mm512_permutexvar_epi8(cv, P), x_40); /* all lanes: c */
        q += 64;
    }
    *pp = q + ((unsigned)_mm_cvtsi128_si32(_mm512_castsi512_si128(cv)) & 0xff);
    return cnt;
}

/* 0 = scalar only, 1 = + AVX-512 VBMI windows; -1 = not probed yet. */
static _Atomic int g_mp_isa = -1;

static int mp_isa(void)
{
    int v = atomic_load_explicit(&g_mp_isa, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("bmi") &&
                    __builtin_cpu_supports("popcnt")
                ? 1
                : 0;
        atomic_store_explicit(&g_mp_isa, v, memory_order_relaxed);
    }
    return v;
}
#else
static int mp_isa(void)
{
    return 0;
}
#endif

int kvr_reqbody_force_isa(int level)
{
#ifdef MP_WINDOWS
    int best;
    atomic_store_explicit(&g_mp_isa, -1, memory_order_relaxed);
    best = mp_isa();
    if (level >= 0 && level < best)
        atomic_store_explicit(&g_mp_isa, level, memory_order_relaxed);
#else
    (void)level;
#endif
    return mp_isa();
}

static int mp_tokens(struct mp *m, const struct kvr_reqbody_scratch *s, size_t *count)
{
    uint64_t n;
    size_t hdr;
    const unsigned char *p;
    uint64_t i = 0;
    int rc;

    if (mp_header(m, MP_ARRAY, &n, &hdr) != 0)
        return kvr_err_set(m->err, -EINVAL, "msgpack: \"token_ids\" must be an array of integers");
    m->p += hdr;
    if (n > s->max_tokens)
        return kvr_err_set(m->err, -E2BIG, "too many token ids (limit %zu)", s->max_tokens);
    if (!mp_has(m, n))
        return mp_fail(m, "truncated token array");
    p = m->p;
#ifdef MP_WINDOWS
    if (n >= 64 && mp_isa() >= 1) {
        while (n - i >= 64 && m->end - p >= 128) {
            uint64_t lim;
            i += tokens_avx512(&p, m->end, s->tokens + i, (size_t)(n - i));
            if (n - i < 64 || m->end - p < 128)
                break;
            /* stopped before an element the windows do not take: a few the careful way */
            lim = n - i > 8 ? i + 8 : n;
            if ((rc = mp_tokens_range(m, s->tokens, &p, i, lim)) != 0)
                return rc;
            i = lim;
        }
    }
#endif
    if ((rc = mp_tokens_range(m, s->tokens, &p, i, n)) != 0)
        return rc;
    m->p = (unsigned char *)p;
    *count = (size_t)n;
    return 0;
}

int kvr_reqbody_query_msgpack(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                              struct kvr_reqbody_query *q, struct kvr_err *err)
{
    struct mp m = {(unsigned char *)body, (unsigned char *)body + len, (unsigned char *)body, err};
    bool seen_model = false, seen_tokens = false, seen_lora = false, seen_pods = false;
    uint64_t nkeys;
    size_t hdr;
    int rc;

    memset(q, 0, sizeof(*q));
    q->tokens = s->tokens;
    q->pods = s->pods;
    if (mp_header(&m, MP_MAP, &nkeys, &hdr) != 0)
        return kvr_err_set(err, -EINVAL, "msgpack: body must be a map");
    m.p += hdr;
    if (!mp_has(&m, nkeys * 2))
        return mp_fail(&m, "truncated map");
    for (uint64_t i = 0; i < nkeys; i++) {
        uint64_t klen;
        size_t khdr;
        const char *key;
        char *str;
        size_t slen;

        if (mp_header(&m, MP_STR, &klen, &khdr) != 0 || !mp_has(&m, khdr + klen))
            return mp_fail(&m, "map key must be a string");
        key = (const char *)m.p + khdr;
        m.p += khdr + klen;
        if (key_is(key, klen, "token_ids")) {
            if (seen_tokens)
                return kvr_err_set(err, -EINVAL, "duplicate key \"token_ids\"");
            seen_tokens = true;
            if ((rc = mp_tokens(&m, s, &q->ntokens)) != 0)
                return rc;
        } else if (key_is(key, klen, "model")) {
            if (seen_model)
                return kvr_err_set(err, -EINVAL, "duplicate key \"model\"");
            seen_model = true;
            if ((rc = mp_string(&m, "model", &str, &slen)) != 0)
                return rc;
            if (slen == 0 || slen > KVR_NAME_MAX)
                return kvr_err_set(err, -EINVAL, "\"model\" must be 1..%d bytes", KVR_NAME_MAX);
            q->model = str;
        } else if (key_is(key, klen, "lora_name")) {
            if (seen_lora)
                return kvr_err_set(err, -EINVAL, "duplicate key \"lora_name\"");
            seen_lora = true;
            if (mp_nil(&m))
                continue;
            if ((rc = mp_string(&m, "lora_name", &str, &slen)) != 0)
                return rc;
            if (slen > KVR_NAME_MAX)
                return kvr_err_set(err, -EINVAL, "\"lora_name\" longer than %d bytes",
                                   KVR_NAME_MAX);
            q->lora_name = slen ? str : NULL;
        } else if (key_is(key, klen, "pods")) {
            uint64_t n;
            if (seen_pods)
                return kvr_err_set(err, -EINVAL, "duplicate key \"pods\"");
            seen_pods = true;
            if (mp_nil(&m))
                continue;
            if (mp_header(&m, MP_ARRAY, &n, &hdr) != 0)
                return kvr_err_set(err, -EINVAL, "msgpack: \"pods\" must be an array of strings");
            m.p += hdr;
            if (n > s->max_pods)
                return kvr_err_set(err, -EINVAL, "too many pods (limit %zu)", s->max_pods);
            for (uint64_t k = 0; k < n; k++) {
                if ((rc = mp_string(&m, "pods[]", &str, &slen)) != 0)
                    return rc;
                s->pods[q->npods++] = str;
            }
        } else {
            if (mp_skip(&m, 1) != 0)
                return -EINVAL;
        }
    }
    if (m.p != m.end)
        return mp_fail(&m, "trailing data after the map");
    if (!seen_model)
        return kvr_err_set(err, -EINVAL, "missing \"model\"");
    if (!seen_tokens)
        return kvr_err_set(err, -EINVAL, "missing \"token_ids\"");
    return 0;
}
