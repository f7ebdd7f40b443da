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
 *   notes above blocks_sse2/blocks_avx2/blocks_avx512. The per-token path does the rest and
 *   reports every error precisely.
 * - Strings are decoded in place: the writer never overtakes the reader because every escape
 *   is at least as long as the UTF-8 it produces.
 * - Errors record the first failure only (static message, offset), so the hot path carries
 *   no formatting.
 * Pure; any thread.
 */
#include "jtok.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <stdatomic.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LOAD_LE64(x) __builtin_bswap64(x)
#else
#define LOAD_LE64(x) (x)
#endif

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
                if (cp == 0)
                    return fail_at(j, r, -EINVAL, "NUL character in string");
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

/* ---- block classification (x86-64: SSE2 always, AVX2 when the CPU has it) ---------------- */

#if defined(__x86_64__) && defined(__SSE2__)
#define JTOK_BLOCKS 1

/* Bit i of each mask describes p[i], i < 64. */
struct blk {
    uint64_t dig;   /* '0'..'9' */
    uint64_t com;   /* ',' */
    uint64_t other; /* neither digit, ',' nor JSON whitespace */
    uint64_t zero;  /* '0' */
};

static inline __attribute__((always_inline)) void blk_sse2(const char *p, struct blk *b)
{
    const __m128i lo = _mm_set1_epi8('0' - 1), hi = _mm_set1_epi8('9' + 1);
    const __m128i comma = _mm_set1_epi8(','), sp = _mm_set1_epi8(' '), z = _mm_set1_epi8('0');
    const __m128i nl = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r'), tab = _mm_set1_epi8('\t');
    uint64_t d = 0, c = 0, w = 0, zz = 0;

    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
        __m128i isd = _mm_and_si128(_mm_cmpgt_epi8(v, lo), _mm_cmplt_epi8(v, hi));
        __m128i isw = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, sp), _mm_cmpeq_epi8(v, nl)),
                                   _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, tab)));
        d |= (uint64_t)(uint16_t)_mm_movemask_epi8(isd) << (16 * i);
        c |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, comma)) << (16 * i);
        w |= (uint64_t)(uint16_t)_mm_movemask_epi8(isw) << (16 * i);
        zz |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, z)) << (16 * i);
    }
    b->dig = d;
    b->com = c;
    b->other = ~(d | c | w);
    b->zero = zz;
}

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
blk_avx2(const char *p, struct blk *b)
{
    /* whitespace by nibble lookup: lut[c & 15] == c only for ' ', \t, \n, \r */
    const __m256i lut = _mm256_setr_epi8(
        ' ', (char)0x81, (char)0x82, (char)0x83, (char)0x84, (char)0x85, (char)0x86, (char)0x87,
        (char)0x88, '\t', '\n', (char)0x8b, (char)0x8c, '\r', (char)0x8e, (char)0x8f, ' ',
        (char)0x81, (char)0x82, (char)0x83, (char)0x84, (char)0x85, (char)0x86, (char)0x87,
        (char)0x88, '\t', '\n', (char)0x8b, (char)0x8c, '\r', (char)0x8e, (char)0x8f);
    const __m256i zero = _mm256_set1_epi8('0'), nine = _mm256_set1_epi8(9);
    const __m256i comma = _mm256_set1_epi8(',');
    uint64_t d[2], c[2], w[2], zz[2];

    for (int i = 0; i < 2; i++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
        __m256i off = _mm256_sub_epi8(v, zero);
        __m256i isd = _mm256_cmpeq_epi8(_mm256_min_epu8(off, nine), off);
        __m256i isw = _mm256_cmpeq_epi8(_mm256_shuffle_epi8(lut, v), v);
        d[i] = (uint32_t)_mm256_movemask_epi8(isd);
        c[i] = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, comma));
        w[i] = (uint32_t)_mm256_movemask_epi8(isw);
        zz[i] = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, zero));
    }
    b->dig = d[0] | d[1] << 32;
    b->com = c[0] | c[1] << 32;
    b->other = ~(b->dig | b->com | w[0] | w[1] << 32);
    b->zero = zz[0] | zz[1] << 32;
}

static inline __attribute__((always_inline)) uint64_t prefix_xor(uint64_t x)
{
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    return x;
}

/* Converts every number of the blocks at *pp while they validate, starting at "expecting a
 * number". Each block: take the region up to its last comma; it must hold only digits,
 * commas and whitespace, number starts and commas must alternate (prefix XOR), no number
 * may have a leading zero; then every number of the region is converted. Starts and ends come
 * from masks, so the conversions do not wait on each other. Returns false when a block did
 * not validate (the per-token path then reports the precise error) or had no comma; *pp and
 * *cnt advance over what was converted. A 9..10 digit number is converted with an overflow
 * check; 11+ digits stop the blocks. */
#define BLOCK_LOOP(NAME, ATTR, MASKS)                                                         \
    ATTR static bool NAME(const char **pp, const char *end, uint32_t *out, size_t cap,          \
                          size_t *cntp)                                                         \
    {                                                                                           \
        const char *p = *pp;                                                                    \
        size_t cnt = *cntp;                                                                     \
        bool ok = true;                                                                         \
        while (end - p >= 72) {                                                                 \
            struct blk b;                                                                       \
            uint64_t region, starts, ends, x;                                                   \
            unsigned last;                                                                      \
            MASKS(p, &b);                                                                       \
            if (b.com == 0)                                                                     \
                break;                                                                          \
            last = 63u - (unsigned)__builtin_clzll(b.com);                                      \
            region = last == 63 ? ~0ull : (2ull << last) - 1;                                   \
            starts = b.dig & ~(b.dig << 1) & region;                                            \
            ends = b.dig & ~(b.dig >> 1) & region;                                              \
            x = prefix_xor(starts | (b.com & region));                                          \
            if (((b.other & region) | (starts & ~x) | (b.com & region & x) |                    \
                 (starts & b.zero & (b.dig >> 1))) != 0 ||                                      \
                cnt + (size_t)__builtin_popcountll(starts) > cap) {                             \
                ok = false;                                                                     \
                break;                                                                          \
            }                                                                                   \
            while (starts) {                                                                    \
                unsigned s0 = (unsigned)__builtin_ctzll(starts);                                \
                unsigned e0 = (unsigned)__builtin_ctzll(ends);                                  \
                unsigned nd = e0 - s0 + 1;                                                      \
                uint64_t t;                                                                     \
                starts &= starts - 1;                                                           \
                ends &= ends - 1;                                                               \
                if (__builtin_expect(nd <= 8, 1)) {                                             \
                    memcpy(&t, p + s0, 8);                                                      \
                    t = LOAD_LE64(t) << (64 - 8 * nd);                                          \
                    t = ((t & 0x0f0f0f0f0f0f0f0full) * 2561) >> 8;                              \
                    t = ((t & 0x00ff00ff00ff00ffull) * 6553601) >> 16;                          \
                    t = ((t & 0x0000ffff0000ffffull) * 42949672960001ull) >> 32;                \
                } else {                                                                        \
                    t = 0;                                                                      \
                    for (unsigned k = 0; k < nd && t <= UINT32_MAX; k++)                        \
                        t = t * 10 + (uint64_t)(p[s0 + k] - '0');                               \
                    if (t > UINT32_MAX) {                                                       \
                        *pp = p + s0; /* resume before this number: per-token path reports */   \
                        *cntp = cnt;                                                            \
                        return false;                                                           \
                    }                                                                           \
                }                                                                               \
                out[cnt++] = (uint32_t)t;                                                       \
            }                                                                                   \
            p += last + 1;                                                                      \
        }                                                                                       \
        *pp = p;                                                                                \
        *cntp = cnt;                                                                            \
        return ok;                                                                              \
    }

BLOCK_LOOP(blocks_sse2, , blk_sse2)

/* Converts the numbers of one validated region (digit mask dig, starting at base) one by one;
 * on overflow *qp is left at the offending number and false is returned. */
static bool blocks_sse2_one(const char **qp, const char *base, const char *end, uint64_t region,
                            uint64_t dig, uint32_t *out, size_t *cntp)
{
    uint64_t starts = dig & ~(dig << 1) & region, ends = dig & ~(dig >> 1) & region;
    size_t cnt = *cntp;
    (void)end;

    while (starts) {
        unsigned s0 = (unsigned)__builtin_ctzll(starts);
        unsigned nd = (unsigned)__builtin_ctzll(ends) - s0 + 1;
        uint64_t t = 0;
        starts &= starts - 1;
        ends &= ends - 1;
        for (unsigned k = 0; k < nd && t <= UINT32_MAX; k++)
            t = t * 10 + (uint64_t)(base[s0 + k] - '0');
        if (t > UINT32_MAX) {
            *qp = base + s0;
            *cntp = cnt;
            return false;
        }
        out[cnt++] = (uint32_t)t;
    }
    *cntp = cnt;
    return true;
}
/* The AVX2 variant validates the same way, but converts four numbers per vector step: each
 * number's 8 bytes are loaded and shifted so its digits end at the top byte (scalar, one load
 * and one shift), then maddubs (x10 + y), madd (x100 + y) and a 32x32 multiply (x10000 + y)
 * turn four such words into four values at once. A block holding a number of 9+ digits is
 * converted by the scalar loop instead (with the overflow check). */
__attribute__((target("avx2,bmi"))) static bool blocks_avx2(const char **pp, const char *end,
                                                             uint32_t *out, size_t cap,
                                                             size_t *cntp)
{
    const char *p = *pp;
    size_t cnt = *cntp;
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    const __m256i m10 = _mm256_set1_epi16(0x010a); /* bytes 10, 1 */
    const __m256i m100 = _mm256_set1_epi32(0x00010064); /* words 100, 1 */
    const __m256i m10000 = _mm256_set1_epi64x(10000);
    const __m256i pack = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    uint32_t vals[68];

    while (end - p >= 72) {
        struct blk b;
        uint64_t region, starts, ends, x;
        unsigned last, k = 0;
        bool long_num = false;

        blk_avx2(p, &b);
        if (b.com == 0)
            break;
        last = 63u - (unsigned)__builtin_clzll(b.com);
        region = last == 63 ? ~0ull : (2ull << last) - 1;
        starts = b.dig & ~(b.dig << 1) & region;
        ends = b.dig & ~(b.dig >> 1) & region;
        x = prefix_xor(starts | (b.com & region));
        if (((b.other & region) | (starts & ~x) | (b.com & region & x) |
             (starts & b.zero & (b.dig >> 1))) != 0 ||
            cnt + (size_t)__builtin_popcountll(starts) > cap) {
            *pp = p;
            *cntp = cnt;
            return false;
        }
        {
            /* four numbers per step, kept in registers; results go straight into out when
             * the rounding-up slack fits, else through vals */
            size_t nnum = (size_t)__builtin_popcountll(starts);
            bool direct = cnt + nnum + 3 <= cap;
            uint32_t *dst = direct ? out + cnt : vals;
            unsigned bad = 0;
#define NEXT_WORD(w)                                                                        \
    do {                                                                                    \
        if (starts) {                                                                       \
            unsigned s0_ = (unsigned)__builtin_ctzll(starts);                               \
            unsigned nd_ = (unsigned)__builtin_ctzll(ends) - s0_ + 1;                       \
            uint64_t t_;                                                                    \
            starts &= starts - 1;                                                           \
            ends &= ends - 1;                                                               \
            bad |= nd_ > 8;                                                                 \
            memcpy(&t_, p + s0_, 8);                                                        \
            (w) = LOAD_LE64(t_) << ((64 - 8 * nd_) & 63);                                   \
        } else {                                                                            \
            (w) = 0;                                                                        \
        }                                                                                   \
    } while (0)
            while (starts) {
                uint64_t w0, w1, w2, w3;
                __m256i v;
                NEXT_WORD(w0);
                NEXT_WORD(w1);
                NEXT_WORD(w2);
                NEXT_WORD(w3);
                v = _mm256_set_epi64x((long long)w3, (long long)w2, (long long)w1,
                                      (long long)w0);
                v = _mm256_and_si256(v, m0f);
                v = _mm256_maddubs_epi16(v, m10);
                v = _mm256_madd_epi16(v, m100);
                v = _mm256_add_epi64(_mm256_mul_epu32(v, m10000), _mm256_srli_epi64(v, 32));
                v = _mm256_permutevar8x32_epi32(v, pack);
                _mm_storeu_si128((__m128i *)(void *)(dst + k), _mm256_castsi256_si128(v));
                k += 4;
            }
#undef NEXT_WORD
            if (__builtin_expect(bad != 0, 0))
                long_num = true;
            else if (!direct)
                for (unsigned i = 0; i < nnum; i++)
                    out[cnt + i] = vals[i];
            k = (unsigned)nnum;
        }
        if (__builtin_expect(long_num, 0)) {
            /* rare: redo this block number by number (9..10 digits, overflow check) */
            const char *q = p;
            size_t c0 = cnt;
            if (!blocks_sse2_one(&q, p, end, region, b.dig, out, &c0)) {
                *pp = q;
                *cntp = c0;
                return false;
            }
            cnt = c0;
            p += last + 1;
            continue;
        }
        cnt += k;
        p += last + 1;
    }
    *pp = p;
    *cntp = cnt;
    return true;
}


/* AVX-512 (BW, VBMI, VBMI2) variant: no per-number scalar work at all. Per block region (up to
 * its last comma, validated as above): the digits are compressed together (vpcompressb), the
 * start and end offsets of the numbers within that digit string are compressed into two byte
 * vectors, and one permute (vpermb) per eight numbers places each number's digits at the top of
 * its own 8-byte lane, zero-padded; the lanes are then converted as in the AVX2 variant, eight
 * at a time. A region with a number of 9+ digits takes the per-token path. */
#define AVX512_TARGET "avx512f,avx512bw,avx512vbmi,avx512vbmi2,bmi,bmi2"

__attribute__((target(AVX512_TARGET))) static bool blocks_avx512(const char **pp,
                                                                 const char *end,
                                                                 uint32_t *out, size_t cap,
                                                                 size_t *cntp)
{
    const char *p = *pp;
    size_t cnt = *cntp;
    const __m512i c0 = _mm512_set1_epi8('0'), c10 = _mm512_set1_epi8(10);
    const __m512i ccomma = _mm512_set1_epi8(',');
    /* whitespace by nibble lookup: lut[c & 15] == c only for ' ', \t, \n, \r */
    const __m512i wslut = _mm512_broadcast_i32x4(_mm_setr_epi8(
        ' ', (char)0x81, (char)0x82, (char)0x83, (char)0x84, (char)0x85, (char)0x86, (char)0x87,
        (char)0x88, '\t', '\n', (char)0x8b, (char)0x8c, '\r', (char)0x8e, (char)0x8f));
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i m10 = _mm512_set1_epi16(0x010a);      /* bytes 10, 1 */
    const __m512i m100 = _mm512_set1_epi32(0x00010064); /* words 100, 1 */
    const __m512i m10000 = _mm512_set1_epi64(10000);
    __m512i iota, lane, back;
    uint8_t tmp[64];

    for (int i = 0; i < 64; i++)
        tmp[i] = (uint8_t)i;
    iota = _mm512_loadu_si512(tmp);
    for (int i = 0; i < 64; i++)
        tmp[i] = (uint8_t)(i >> 3); /* output byte -> its lane (number) */
    lane = _mm512_loadu_si512(tmp);
    for (int i = 0; i < 64; i++)
        tmp[i] = (uint8_t)(7 - (i & 7)); /* output byte -> distance from its lane's top */
    back = _mm512_loadu_si512(tmp);

    while (end - p >= 72) {
        __m512i v = _mm512_loadu_si512(p), dstr, spos, epos;
        uint64_t dig, com, wsp, zero, other, region, starts, ends, x, sbits, ebits;
        unsigned last, k;

        dig = _mm512_cmplt_epu8_mask(_mm512_sub_epi8(v, c0), c10);
        com = _mm512_cmpeq_epi8_mask(v, ccomma);
        wsp = _mm512_cmpeq_epi8_mask(_mm512_shuffle_epi8(wslut, v), v);
        zero = _mm512_cmpeq_epi8_mask(v, c0);
        other = ~(dig | com | wsp);
        if (com == 0)
            break;
        last = 63u - (unsigned)__builtin_clzll(com);
        region = last == 63 ? ~0ull : (2ull << last) - 1;
        starts = dig & ~(dig << 1) & region;
        ends = dig & ~(dig >> 1) & region;
        x = prefix_xor(starts | (com & region));
        k = (unsigned)__builtin_popcountll(starts);
        if (((other & region) | (starts & ~x) | (com & region & x) |
             (starts & zero & (dig >> 1))) != 0 ||
            cnt + k + 8 > cap) {
            *pp = p;
            *cntp = cnt;
            return false;
        }
        dig &= region;
        dstr = _mm512_maskz_compress_epi8(dig, v);
        sbits = _pext_u64(starts, dig);
        ebits = _pext_u64(ends, dig);
        spos = _mm512_maskz_compress_epi8(sbits, iota);
        epos = _mm512_maskz_compress_epi8(ebits, iota);
        /* any number longer than 8 digits: this region goes token by token */
        if (_mm512_cmpgt_epu8_mask(_mm512_sub_epi8(epos, spos), _mm512_set1_epi8(7)) &
            ((k >= 64 ? 0 : (1ull << k)) - 1)) {
            *pp = p;
            *cntp = cnt;
            return false;
        }
        for (unsigned r = 0; r < k; r += 8) {
            __m512i l = _mm512_add_epi8(lane, _mm512_set1_epi8((char)r));
            __m512i eb = _mm512_permutexvar_epi8(l, epos);
            __m512i sb = _mm512_permutexvar_epi8(l, spos);
            __m512i src = _mm512_sub_epi8(eb, back);
            __mmask64 valid = _mm512_cmpge_epi8_mask(src, sb);
            __m512i w = _mm512_maskz_permutexvar_epi8(valid, src, dstr);
            w = _mm512_and_si512(w, m0f);
            w = _mm512_maddubs_epi16(w, m10);
            w = _mm512_madd_epi16(w, m100);
            w = _mm512_add_epi64(_mm512_mul_epu32(w, m10000), _mm512_srli_epi64(w, 32));
            _mm256_storeu_si256((__m256i *)(void *)(out + cnt + r), _mm512_cvtepi64_epi32(w));
        }
        cnt += k;
        p += last + 1;
    }
    *pp = p;
    *cntp = cnt;
    return true;
}
#endif

/* 0 = per-token path only, 1 = + SSE2 blocks, 2 = + AVX2 blocks, 3 = + AVX-512 VBMI2 blocks;
 * -1 = not probed yet. Every thread that probes stores the same value. */
static _Atomic int g_isa = -1;

static int isa_level(void)
{
    int v = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (v < 0) {
#ifdef JTOK_BLOCKS
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 2 : 1;
        if (v == 2 && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2") &&
            __builtin_cpu_supports("bmi2"))
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
 * - blocks (x86-64, BLOCK_LOOP above) while at least 72 bytes remain;
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
                blocks = blocks_avx512(&p, end, out, cap, &cnt);
            else if (isa == 2)
                blocks = blocks_avx2(&p, end, out, cap, &cnt);
            else
                blocks = blocks_sse2(&p, end, out, cap, &cnt);
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
