/* jtok.c — strict JSON cursor with an 8-bytes-at-a-time unsigned integer array parser.
 *
 * Design:
 * - The cursor never reads at or past `end`; the fast integer path runs only while at least
 *   16 bytes remain, and the scalar path finishes the tail, so callers need no padding.
 * - Integers (SWAR): load 8 bytes little-endian; a byte is a digit iff after subtracting '0'
 *   it is < 10. The first non-digit is found with one mask and ctz; the digits (1..7 of
 *   them) are shifted to the top so the leading bytes become zeros, then three multiplies
 *   turn 8 digit bytes into the value (pairs, quads, octet). Numbers of 8+ digits take the
 *   scalar path, which also does the overflow check (>= 2^32 → error).
 * - Blocks: 64 bytes classified at once (SSE2, AVX2 or AVX-512, chosen at run time); see the
 *   notes in jtok_simd.c (the kernels' own file). The per-token path does the rest and
 *   reports every error precisely.
 * - Strings are decoded in place: the writer never overtakes the reader because every escape
 *   is at least as long as the UTF-8 it produces. "\u0000" decodes to a 0 byte like any other
 *   character (valid JSON, and vLLM tokenizes it): a decoded string is (pointer, length), its
 *   trailing NUL a convenience, and callers that need a C string refuse embedded NULs.
 * - Errors record the first failure only (static message, offset), so the hot path carries
 *   no formatting.
 * Pure; any thread.
 */
#include "http/jtok.h"
#include "http/jtok_int.h"

#include "core/cpu.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <stdatomic.h>

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

static int fail_at(struct kvr_jtok *j, const char *at, int code, const char *msg)
{
    if (j->code == 0) {
        j->code = code;
        j->msg = msg;
        j->err_off = (size_t)(at - j->base);
    }
    return code;
}

void kvr_jtok_init(struct kvr_jtok *j, char *buf, size_t len)
{
    j->p = buf;
    j->end = buf + len;
    j->base = buf;
    j->code = 0;
    j->msg = NULL;
    j->err_off = 0;
    j->err_index = SIZE_MAX;
}

static inline bool is_ws(unsigned char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static inline void skip_ws(struct kvr_jtok *j)
{
    char *p = j->p;
    while (p < j->end && is_ws((unsigned char)*p))
        p++;
    j->p = p;
}

int kvr_jtok_peek(struct kvr_jtok *j)
{
    skip_ws(j);
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

int kvr_jtok_expect(struct kvr_jtok *j, char c, const char *msg)
{
    skip_ws(j);
    if (j->p >= j->end || *j->p != c)
        return fail_at(j, j->p, -EINVAL, msg);
    j->p++;
    return 0;
}

int kvr_jtok_finish(struct kvr_jtok *j)
{
    skip_ws(j);
    if (j->p != j->end)
        return fail_at(j, j->p, -EINVAL, "trailing data after the JSON value");
    return 0;
}

/* ---- strings --------------------------------------------------------------------------- */

static int hex4(const char *p, uint32_t *v)
{
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = (unsigned char)p[i];
        uint32_t d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        x = (x << 4) | d;
    }
    *v = x;
    return 0;
}

/* Length of a valid UTF-8 sequence starting at p (lead byte >= 0x80), 0 if invalid. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    size_t n;
    uint32_t cp;

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

static size_t put_utf8(char *w, uint32_t cp)
{
    if (cp < 0x80) {
        w[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        w[0] = (char)(0xc0 | (cp >> 6));
        w[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        w[0] = (char)(0xe0 | (cp >> 12));
        w[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        w[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    w[0] = (char)(0xf0 | (cp >> 18));
    w[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    w[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    w[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses the string whose opening quote is at j->p. With write, decodes in place starting at
 * the opening quote's position + 1 and NUL-terminates; returns start/len. */
static int scan_string(struct kvr_jtok *j, bool write, char **s, size_t *len)
{
    char *r = j->p + 1, *w = r, *start = r, *end = j->end;

    for (;;) {
        unsigned char c;
        if (UNLIKELY(r >= end))
            return fail_at(j, r, -EINVAL, "unterminated string");
        c = (unsigned char)*r;
        if (c == '"')
            break;
        if (c == '\\') {
            uint32_t cp;
            if (end - r < 2)
                return fail_at(j, r, -EINVAL, "unterminated string");
            switch (r[1]) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (end - r < 6 || hex4(r + 2, &cp) != 0)
                    return fail_at(j, r, -EINVAL, "bad \\u escape in string");
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return fail_at(j, r, -EINVAL, "unpaired surrogate in string");
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    uint32_t lo;
                    if (end - r < 12 || r[6] != '\\' || r[7] != 'u' || hex4(r + 8, &lo) != 0 ||
                        lo < 0xdc00 || lo > 0xdfff)
                        return fail_at(j, r, -EINVAL, "unpaired surrogate in string");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    r += 6;
                }
                r += 6;
                if (write)
                    w += put_utf8(w, cp);
                continue;
            default:
                return fail_at(j, r, -EINVAL, "bad escape in string");
            }
            r += 2;
            if (write)
                *w++ = (char)cp;
            continue;
        }
        if (c < 0x20)
            return fail_at(j, r, -EINVAL, "control character in string");
        if (c < 0x80) {
            if (write)
                *w++ = (char)c;
            r++;
            continue;
        }
        {
            size_t n = utf8_len((const unsigned char *)r, (const unsigned char *)end);
            if (n == 0)
                return fail_at(j, r, -EINVAL, "invalid UTF-8 in string");
            if (write) {
                memmove(w, r, n);
                w += n;
            }
            r += n;
        }
    }
    j->p = r + 1;
    if (write) {
        *w = '\0';
        *s = start;
        *len = (size_t)(w - start);
    }
    return 0;
}

int kvr_jtok_string(struct kvr_jtok *j, char **s, size_t *len)
{
    skip_ws(j);
    if (j->p >= j->end || *j->p != '"')
        return fail_at(j, j->p, -EINVAL, "expected a string");
    return scan_string(j, true, s, len);
}

int kvr_jtok_null(struct kvr_jtok *j)
{
    skip_ws(j);
    if (j->end - j->p >= 4 && memcmp(j->p, "null", 4) == 0) {
        j->p += 4;
        return 1;
    }
    return 0;
}

int kvr_jtok_bool(struct kvr_jtok *j, bool *v)
{
    skip_ws(j);
    if (j->end - j->p >= 4 && memcmp(j->p, "true", 4) == 0) {
        j->p += 4;
        *v = true;
        return 0;
    }
    if (j->end - j->p >= 5 && memcmp(j->p, "false", 5) == 0) {
        j->p += 5;
        *v = false;
        return 0;
    }
    return fail_at(j, j->p, -EINVAL, "expected true or false");
}

/* ---- generic values -------------------------------------------------------------------- */

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int skip_number(struct kvr_jtok *j)
{
    char *p = j->p, *end = j->end;

    if (p < end && *p == '-')
        p++;
    if (p >= end || !is_digit((unsigned char)*p))
        return fail_at(j, p, -EINVAL, "bad number");
    if (*p == '0')
        p++;
    else
        while (p < end && is_digit((unsigned char)*p))
            p++;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit((unsigned char)*p))
            return fail_at(j, p, -EINVAL, "bad number");
        while (p < end && is_digit((unsigned char)*p))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || !is_digit((unsigned char)*p))
            return fail_at(j, p, -EINVAL, "bad number");
        while (p < end && is_digit((unsigned char)*p))
            p++;
    }
    j->p = p;
    return 0;
}

int kvr_jtok_u64(struct kvr_jtok *j, uint64_t *v)
{
    char *p;
    uint64_t x = 0;

    kvr_jtok_peek(j);
    p = j->p;
    if (p >= j->end || !is_digit((unsigned char)*p))
        return fail_at(j, p, -EINVAL, "expected a non-negative integer");
    if (*p == '0' && p + 1 < j->end && is_digit((unsigned char)p[1]))
        return fail_at(j, p, -EINVAL, "leading zero in integer");
    while (p < j->end && is_digit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (x > (UINT64_MAX - d) / 10)
            return fail_at(j, p, -EINVAL, "integer too large");
        x = x * 10 + d;
        p++;
    }
    if (p < j->end && (*p == '.' || *p == 'e' || *p == 'E'))
        return fail_at(j, p, -EINVAL, "expected an integer");
    j->p = p;
    *v = x;
    return 0;
}

int kvr_jtok_number(struct kvr_jtok *j, char **s, size_t *len)
{
    int rc;
    kvr_jtok_peek(j);
    *s = j->p;
    if ((rc = skip_number(j)) != 0)
        return rc;
    *len = (size_t)(j->p - *s);
    return 0;
}

static int skip_value(struct kvr_jtok *j, int depth)
{
    int c = kvr_jtok_peek(j), rc, st = 0;
    char *key;
    size_t klen;

    if (depth > KVR_JTOK_MAX_DEPTH)
        return fail_at(j, j->p, -EINVAL, "JSON nested too deeply");
    switch (c) {
    case '"':
        return scan_string(j, false, NULL, NULL);
    case '{':
        while ((rc = kvr_jtok_object_next(j, &st, &key, &klen)) == 1)
            if ((rc = skip_value(j, depth + 1)) != 0)
                return rc;
        return rc;
    case '[':
        while ((rc = kvr_jtok_array_next(j, &st)) == 1)
            if ((rc = skip_value(j, depth + 1)) != 0)
                return rc;
        return rc;
    case 't':
        if (j->end - j->p >= 4 && memcmp(j->p, "true", 4) == 0) {
            j->p += 4;
            return 0;
        }
        break;
    case 'f':
        if (j->end - j->p >= 5 && memcmp(j->p, "false", 5) == 0) {
            j->p += 5;
            return 0;
        }
        break;
    case 'n':
        if (kvr_jtok_null(j))
            return 0;
        break;
    case -1:
        return fail_at(j, j->p, -EINVAL, "unexpected end of JSON");
    default:
        if (c == '-' || is_digit((unsigned char)c))
            return skip_number(j);
        break;
    }
    return fail_at(j, j->p, -EINVAL, "invalid JSON value");
}

int kvr_jtok_skip(struct kvr_jtok *j)
{
    return skip_value(j, 1);
}

int kvr_jtok_object_next(struct kvr_jtok *j, int *state, char **key, size_t *keylen)
{
    int c;

    if (*state == 0) {
        if (kvr_jtok_expect(j, '{', "expected an object") != 0)
            return j->code;
        *state = 1;
        c = kvr_jtok_peek(j);
        if (c == '}') {
            j->p++;
            *state = 2;
            return 0;
        }
    } else if (*state == 1) {
        c = kvr_jtok_peek(j);
        if (c == '}') {
            j->p++;
            *state = 2;
            return 0;
        }
        if (c != ',')
            return fail_at(j, j->p, -EINVAL, "expected ',' or '}' in object");
        j->p++;
        c = kvr_jtok_peek(j);
    } else {
        return 0;
    }
    if (c != '"')
        return fail_at(j, j->p, -EINVAL, "expected a string key in object");
    if (scan_string(j, true, key, keylen) != 0)
        return j->code;
    if (kvr_jtok_expect(j, ':', "expected ':' after object key") != 0)
        return j->code;
    return 1;
}

int kvr_jtok_array_next(struct kvr_jtok *j, int *state)
{
    int c;

    if (*state == 0) {
        if (kvr_jtok_expect(j, '[', "expected an array") != 0)
            return j->code;
        *state = 1;
        c = kvr_jtok_peek(j);
        if (c == ']') {
            j->p++;
            *state = 2;
            return 0;
        }
        return 1;
    }
    if (*state == 2)
        return 0;
    c = kvr_jtok_peek(j);
    if (c == ']') {
        j->p++;
        *state = 2;
        return 0;
    }
    if (c != ',')
        return fail_at(j, j->p, -EINVAL, "expected ',' or ']' in array");
    j->p++;
    if (kvr_jtok_peek(j) == -1)
        return fail_at(j, j->p, -EINVAL, "unexpected end of JSON");
    return 1;
}

/* ---- unsigned 32-bit integer arrays ----------------------------------------------------- */

/* The error for a value that does not start with a digit or is followed by junk. */
static int num_error(struct kvr_jtok *j, const char *p, size_t idx)
{
    const char *msg = "token id is not an unsigned integer";
    unsigned char c = p < j->end ? (unsigned char)*p : 0;

    if (p >= j->end)
        msg = "unexpected end of token array";
    else if (c == '-')
        msg = "negative token id";
    else if (c == '.' || c == 'e' || c == 'E')
        msg = "token id is not an integer (fraction or exponent)";
    else if (c == ']' || c == ',')
        msg = "missing token id in array";
    if (j->code == 0)
        j->err_index = idx;
    return fail_at(j, p, -EINVAL, msg);
}

/* Scalar number at p (a digit is there): value, or -1 with the error recorded. */
static int scalar_u32(struct kvr_jtok *j, const char **pp, size_t idx, uint32_t *out)
{
    const char *p = *pp, *end = j->end, *start = p;
    uint64_t v = 0;

    if (*p == '0') {
        p++;
        if (p < end && is_digit((unsigned char)*p)) {
            if (j->code == 0)
                j->err_index = idx;
            return fail_at(j, start, -EINVAL, "leading zero in token id");
        }
    } else {
        while (p < end && is_digit((unsigned char)*p)) {
            v = v * 10 + (uint64_t)(*p - '0');
            if (v > UINT32_MAX) {
                if (j->code == 0)
                    j->err_index = idx;
                return fail_at(j, start, -EINVAL, "token id out of range (>= 2^32)");
            }
            p++;
        }
    }
    *out = (uint32_t)v;
    *pp = p;
    return 0;
}

/* 0 = per-token path only, 1 = + SSE2 blocks, 2 = + AVX2 blocks, 3 = + AVX-512 VBMI2 blocks;
 * -1 = not probed yet. Every thread that probes stores the same value. */
static _Atomic int g_isa = -1;

static int isa_level(void)
{
    int v = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (v < 0) {
#ifdef JTOK_BLOCKS
        /* every extension the kernels' target attributes name (jtok_simd.c) */
        v = kvr_cpu_has(KVR_CPU_AVX2 | KVR_CPU_BMI) ? 2 : 1;
        if (v == 2 && kvr_cpu_has(KVR_CPU_AVX512F | KVR_CPU_AVX512BW | KVR_CPU_AVX512VBMI |
                                  KVR_CPU_AVX512VBMI2 | KVR_CPU_BMI2))
            v = 3;
#else
        v = 0;
#endif
        atomic_store_explicit(&g_isa, v, memory_order_relaxed);
    }
    return v;
}

int kvr_jtok_force_isa(int level)
{
    int best;
    atomic_store_explicit(&g_isa, -1, memory_order_relaxed);
    best = isa_level();
    if (level >= 0 && level < best)
        atomic_store_explicit(&g_isa, level, memory_order_relaxed);
    return isa_level();
}

/* Value of the 1..7-digit number at p (8 readable bytes), or nd_digits 0 (not a digit) or 8
 * (8+ digits: caller takes the scalar path). */
static inline uint32_t swar_u32(const char *p, unsigned *ndig)
{
    uint64_t x, d, nd, t;
    unsigned n;

    memcpy(&x, p, 8);
    x = LOAD_LE64(x);
    d = x - 0x3030303030303030ull;
    nd = (d | (x + 0x4646464646464646ull) | x) & 0x8080808080808080ull;
    if (nd == 0) {
        *ndig = 8;
        return 0;
    }
    n = (unsigned)__builtin_ctzll(nd) >> 3;
    *ndig = n;
    if (n == 0)
        return 0;
    t = d << (64 - 8 * n);
    t = ((t & 0x0f0f0f0f0f0f0f0full) * 2561) >> 8;
    t = ((t & 0x00ff00ff00ff00ffull) * 6553601) >> 16;
    t = ((t & 0x0000ffff0000ffffull) * 42949672960001ull) >> 32;
    return (uint32_t)t;
}

static int leading_zero(struct kvr_jtok *j, const char *p, size_t idx)
{
    if (j->code == 0)
        j->err_index = idx;
    return fail_at(j, p, -EINVAL, "leading zero in token id");
}

/* Two paths share the loop, and both start at "expecting a number" (right after '[' or ','):
 * - blocks (x86-64, jtok_simd.c) while at least 72 bytes remain;
 * - per token (any CPU, and the tail / anything unusual): one number, then its separator.
 *   It also produces the precise error when a block does not validate. */
int kvr_jtok_u32_array(struct kvr_jtok *j, uint32_t *out, size_t cap, size_t *n)
{
    const char *p, *end = j->end;
    size_t cnt = 0;
#ifdef JTOK_BLOCKS
    int isa = isa_level();
    bool blocks = isa > 0;
#endif

    *n = 0;
    skip_ws(j);
    p = j->p;
    if (p >= end || *p != '[')
        return fail_at(j, p, -EINVAL, "token_ids must be an array of integers");
    p++;
    while (p < end && is_ws((unsigned char)*p))
        p++;
    if (p < end && *p == ']') {
        j->p = (char *)p + 1;
        return 0;
    }

    for (;;) {
        uint32_t v;
        unsigned char c;
        unsigned nd;

#ifdef JTOK_BLOCKS
        if (blocks && end - p >= 72) {
            /* returns false when a block does not validate: finish token by token */
            if (isa == 3)
                blocks = kvr_jtok_blocks_avx512(&p, end, out, cap, &cnt);
            else if (isa == 2)
                blocks = kvr_jtok_blocks_avx2(&p, end, out, cap, &cnt);
            else
                blocks = kvr_jtok_blocks_sse2(&p, end, out, cap, &cnt);
        }
#endif
        while (UNLIKELY(p < end && is_ws((unsigned char)*p)))
            p++;
        if (LIKELY(end - p >= 16)) {
            v = swar_u32(p, &nd);
            if (UNLIKELY(nd == 8))
                goto scalar;
            if (UNLIKELY(nd == 0))
                return num_error(j, p, cnt);
            if (UNLIKELY(*p == '0' && nd > 1))
                return leading_zero(j, p, cnt);
            p += nd;
        } else {
        scalar:
            if (p >= end || !is_digit((unsigned char)*p))
                return num_error(j, p, cnt);
            if (scalar_u32(j, &p, cnt, &v) != 0)
                return j->code;
        }
        if (UNLIKELY(cnt >= cap)) {
            if (j->code == 0)
                j->err_index = cnt;
            return fail_at(j, p, -E2BIG, "too many token ids");
        }
        out[cnt++] = v;

        /* separator: the common forms ", " and "," are taken without a loop */
        if (UNLIKELY(p >= end))
            return num_error(j, p, cnt);
        c = (unsigned char)*p;
        if (LIKELY(c == ',')) {
            p++;
            if (p < end && *p == ' ')
                p++;
            if (LIKELY(p < end && is_digit((unsigned char)*p)))
                continue;
            while (p < end && is_ws((unsigned char)*p))
                p++;
            if (p < end && is_digit((unsigned char)*p))
                continue;
            return num_error(j, p, cnt);
        }
        if (c == ']')
            break;
        if (is_ws(c)) {
            while (p < end && is_ws((unsigned char)*p))
                p++;
            if (p < end && *p == ']')
                break;
            if (p < end && *p == ',') {
                p++;
                while (p < end && is_ws((unsigned char)*p))
                    p++;
                if (p < end && is_digit((unsigned char)*p))
                    continue;
                return num_error(j, p, cnt);
            }
            if (j->code == 0)
                j->err_index = cnt;
            return fail_at(j, p, -EINVAL, p < end ? "expected ',' or ']' in token array"
                                                  : "unexpected end of token array");
        }
        return num_error(j, p, cnt - 1);
    }
    j->p = (char *)p + 1;
    *n = cnt;
    return 0;
}

size_t kvr_jtok_errstr(const struct kvr_jtok *j, char *dst, size_t cap)
{
    int n;

    if (cap == 0)
        return 0;
    if (j->code == 0)
        n = snprintf(dst, cap, "no error");
    else if (j->err_index != SIZE_MAX)
        n = snprintf(dst, cap, "%s (element %zu, byte %zu)", j->msg, j->err_index, j->err_off);
    else
        n = snprintf(dst, cap, "%s at byte %zu", j->msg, j->err_off);
    if (n < 0)
        return 0;
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

/* ---- output escaping -------------------------------------------------------------------- */

size_t kvr_jtok_escape(char *dst, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *r = (const unsigned char *)s, *end = r + len;
    char *w = dst;

    *w++ = '"';
    while (r < end) {
        unsigned char c = *r;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *w++ = (char)c;
            r++;
            continue;
        }
        if (c >= 0x80) {
            size_t n = utf8_len(r, end);
            if (n == 0) { /* invalid UTF-8 from a peer: replacement character */
                memcpy(w, "\\ufffd", 6);
                w += 6;
                r++;
            } else {
                memcpy(w, r, n);
                w += n;
                r += n;
            }
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = hex[c >> 4];
            *w++ = hex[c & 15];
            break;
        }
        r++;
    }
    *w++ = '"';
    return (size_t)(w - dst);
}
