/* jtok_simd.c — the block kernels of kvr_jtok_u32_array(): 64 bytes of a JSON token array
 * classified at once (SSE2, AVX2, AVX-512 BW/VBMI/VBMI2) and every number of a validated
 * region converted without a per-byte loop.
 *
 * Why its own file: these kernels are x86-64 intrinsics with per-function target attributes,
 * a different kind of code from the strict JSON cursor in jtok.c, and they have their own
 * tests (test_jtok and fuzz_jtok run every ISA level against the per-token path). jtok.c picks
 * the level (kvr_jtok_force_isa) and calls them once per array pass: each call loops over
 * whole blocks, so nothing per number crosses the file boundary. The contract of each kernel
 * is in jtok_int.h; the per-token path in jtok.c reports every error precisely.
 * Pure; any thread.
 */
#include "http/jtok_int.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- block classification (x86-64: SSE2 always, AVX2 when the CPU has it) ---------------- */

#ifdef JTOK_BLOCKS

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
    ATTR bool NAME(const char **pp, const char *end, uint32_t *out, size_t cap,                 \
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

BLOCK_LOOP(kvr_jtok_blocks_sse2, , blk_sse2)

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
__attribute__((target("avx2,bmi"))) bool kvr_jtok_blocks_avx2(const char **pp, const char *end,
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

__attribute__((target(AVX512_TARGET))) bool kvr_jtok_blocks_avx512(const char **pp,
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
