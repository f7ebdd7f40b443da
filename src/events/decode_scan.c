/* decode_scan.c — the bounds-checked walk over a batch's raw msgpack bytes, and the
 * bulk-array decoders it runs (token ids, block hashes), including kvr_decode_u32_run() that
 * HTTP msgpack request bodies share (reqbody.c).
 *
 * Why its own file: this is the part of decode that never touches a msgpack-c object. It
 * proves every declared length against the bytes left before anything is allocated, sizes
 * the per-event zone, and decodes the bulk arrays straight from the bytes (AVX-512 VBMI
 * windows or scalar loops); decode.c then unpacks the small fields with msgpack-c. The design
 * note at the top of decode.c describes both halves; test_decode (both ISA levels, the
 * reference path side by side) and fuzz_decode cover them.
 *
 * Threads: kvr_decode_prescan() works on one decoder (its owner's thread);
 * kvr_decode_u32_run() is pure, any thread.
 */
#include "events/decode_int.h"

#include "core/cpu.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- token-id runs (decode.h; shared with the HTTP layer's msgpack request bodies) ---- */

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline uint64_t be64v(uint64_t x)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return x;
#else
    return __builtin_bswap64(x);
#endif
}

static inline uint64_t le64v(uint64_t x)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_bswap64(x);
#else
    return x;
#endif
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
#define MP_CPU (KVR_CPU_AVX512F | KVR_CPU_AVX512BW | KVR_CPU_AVX512VBMI | KVR_CPU_BMI | \
                KVR_CPU_POPCNT) /* what MP_AVX512 names: kvr_cpu_has() before running it */

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
        v = kvr_cpu_has(MP_CPU) ? 1 : 0;
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

int kvr_decode_force_isa(int level)
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

size_t kvr_decode_u32_run(const uint8_t **pp, const uint8_t *end, uint32_t *out, size_t n)
{
    const uint8_t *p = *pp;
    size_t i = 0;

#ifdef MP_WINDOWS
    if (n >= 64 && mp_isa() >= 1)
        i = tokens_avx512(&p, end, out, n); /* stops before an element it does not take */
#endif
    /* Two tokens per step: the second tag is found by shifting the 8 bytes already loaded, so
     * the loop-carried chain is one load plus a few ALU ops per pair. Anything but fixint and
     * uint8/16/32 leaves this loop for the careful one below. */
    while (i + 2 <= n && end - p >= 24) {
        uint64_t x, y0, y1;
        unsigned b0, b1, k0, k1, l0, l1;
        memcpy(&x, p, 8);
        x = le64v(x);
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
        out[i] = b0 < 0x80 ? b0 : (uint32_t)(be64v(y0) >> (64 - (8u << (k0 & 3))));
        out[i + 1] = b1 < 0x80 ? b1 : (uint32_t)(be64v(y1) >> (64 - (8u << (k1 & 3))));
        p += l0 + l1;
        i += 2;
    }
    for (; i < n && p < end; i++) {
        unsigned b = *p, k = b - 0xcc;
        if (b <= 0x7f) {
            out[i] = b;
            p++;
            continue;
        }
        if (k > 2 || (size_t)(end - p) < 1 + (1u << k))
            break;
        out[i] = (uint32_t)be_read(p + 1, 1u << k);
        p += 1 + (1u << k);
    }
    *pp = p;
    return i;
}

/* ---- prescan: bounded walk over the raw bytes ---------------------------------------- */

struct level {
    uint64_t left, total; /* items (map: keys + values) */
    bool map;
    bool carve;           /* the items of carves[ncarves - 1] (closed when the level ends) */
};

static int add_carve(struct kvr_decoder *d, size_t start, uint64_t n, bool tok)
{
    if (d->ncarves == d->carves_cap) {
        size_t cap = d->carves_cap ? d->carves_cap * 2 : 256;
        struct carve *p = realloc(d->carves, cap * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        d->carves = p;
        d->carves_cap = cap;
    }
    struct carve *c = &d->carves[d->ncarves++];
    c->start = c->end = start; /* end: set when the array ends */
    c->n = (uint32_t)n;
    c->off = 0;
    c->tok = tok;
    c->ok = false;
    c->marker = NULL;
    return 0;
}

/* Room for need values in a scratch array during prescan (grow only; offsets are kept, not
 * pointers, so a move is harmless). */
static int scratch_room(void **a, size_t *cap, size_t need, size_t elem, size_t min)
{
    size_t c = fit_cap(*cap, need, min, SIZE_MAX);
    void *p;

    if (c == *cap)
        return 0;
    p = realloc(*a, c * elem);
    if (p == NULL)
        return -ENOMEM;
    *a = p;
    *cap = c;
    return 0;
}

/* One msgpack int at p (avail bytes readable) as msgpack-c would type it: *neg when it is a
 * NEGATIVE_INTEGER; its encoded width in *w. false: not an int, or truncated. */
static inline bool raw_int(const uint8_t *p, size_t avail, uint64_t *v, bool *neg, unsigned *w)
{
    uint8_t b = p[0];
    if (b <= 0x7f) {
        *v = b, *neg = false, *w = 1;
        return true;
    }
    if (b >= 0xe0) {
        *v = (uint64_t)(int64_t)(int8_t)b, *neg = true, *w = 1;
        return true;
    }
    if (b >= 0xcc && b <= 0xd3) {
        unsigned n = 1u << ((b - 0xcc) & 3);
        if (avail < 1 + n)
            return false;
        uint64_t u = be_n(p + 1, n);
        if (b <= 0xcf) {
            *v = u, *neg = false;
        } else {
            int64_t x = n == 8 ? (int64_t)u : (int64_t)(u << (64 - 8 * n)) >> (64 - 8 * n);
            *v = (uint64_t)x, *neg = x < 0;
        }
        *w = 1 + n;
        return true;
    }
    return false;
}

/* Decodes the items of a token_ids array at p[*pos] (n of them, each an int in [0, 2^32),
 * any encoding msgpack-c would call a positive integer) into out; stops before the first
 * other item. Returns how many were decoded; *pos moves past them. */
static uint32_t pre_tokens(const uint8_t *p, size_t len, size_t *pos, uint32_t n, uint32_t *out)
{
    const uint8_t *q = p + *pos, *end = p + len;
    size_t i = 0;

    for (;;) {
        uint64_t v;
        bool neg;
        unsigned w;
        i += kvr_decode_u32_run(&q, end, out + i, n - i);
        if (i == n || q >= end)
            break;
        /* rare widths: uint 64 and signed ints holding a valid id */
        if (!raw_int(q, (size_t)(end - q), &v, &neg, &w) || neg || v > UINT32_MAX)
            break;
        out[i++] = (uint32_t)v;
        q += w;
    }
    *pos = (size_t)(q - p);
    return (uint32_t)i;
}

/* Same for a block_hashes array: any int (negative: two's complement) or a non-empty bin
 * (last 8 bytes big-endian, left-padded), like hash_of(). */
static uint32_t pre_hashes(const uint8_t *p, size_t len, size_t *pos, uint32_t n, uint64_t *out)
{
    size_t q = *pos;
    uint32_t i;

    for (i = 0; i < n && q < len; i++) {
        uint8_t b = p[q];
        bool neg;
        unsigned w;
        if (raw_int(p + q, len - q, &out[i], &neg, &w)) {
            q += w;
        } else if (b >= 0xc4 && b <= 0xc6) {
            unsigned lw = 1u << (b - 0xc4);
            size_t sz;
            if (len - q < 1 + lw)
                break;
            sz = (size_t)be_n(p + q + 1, lw);
            if (sz == 0 || len - q - 1 - lw < sz)
                break;
            q += 1 + lw;
            out[i] = sz >= 8 ? be64(p + q + sz - 8) : be_read(p + q, sz);
            q += sz;
        } else {
            break;
        }
    }
    *pos = q;
    return i;
}

static int reserve_spans(struct kvr_decoder *d, size_t n)
{
    struct span *p;
    size_t cap;

    if (n <= d->spans_cap)
        return 0;
    cap = d->spans_cap ? d->spans_cap : 256;
    while (cap < n)
        cap *= 2;
    p = realloc(d->spans, cap * sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    d->spans = p;
    d->spans_cap = cap;
    return 0;
}

/* decode_int.h */
int kvr_decode_prescan(struct kvr_decoder *d, const uint8_t *p, size_t len, struct scan *sc)
{
    struct level st[HARD_MAX_DEPTH + 1];
    size_t pos = 0, dummy_zone = 0, *ev_zone = &dummy_zone, *ev_zone_c = &dummy_zone;
    uint32_t depth = 0;
    bool in_events = false;       /* st[2] is the events array */
    bool in_carve = false;        /* st[4] is a carved array (depth >= 4 is inside it) */
    const uint8_t *key = NULL;    /* last string key read in a map event */
    size_t key_len = 0;

    memset(sc, 0, sizeof(*sc));
    d->ncarves = 0;
    st[0].left = st[0].total = 1;
    st[0].map = false;
    st[0].carve = false;
    for (;;) {
        size_t rem, hdr = 1, skip = 0;
        uint64_t n = 0, idx;
        int kind = 0; /* 0 scalar, 1 array, 2 map */
        bool is_str = false;
        uint8_t b;

        while (depth > 0 && st[depth].left == 0) {
            if (depth == 2 && in_events) { /* the events array ends here */
                d->spans[sc->nevents].off = pos;
                d->spans[sc->nevents].c0 = (uint32_t)d->ncarves;
                in_events = false;
                ev_zone = ev_zone_c = &dummy_zone;
            }
            if (st[depth].carve) {
                d->carves[d->ncarves - 1].end = pos;
                in_carve = false;
            }
            depth--;
        }
        if (depth == 0 && st[0].left == 0)
            break;
        if (depth >= 3 && !st[depth].map) {
            /* Fast path for runs of fixed-size scalars and short strings inside an event
             * (an array event's small fields, nested arrays): nothing to record for them. */
            uint64_t left = st[depth].left;
            uint8_t w;
            while (left != 0 && pos < len && (w = d->skip_width[p[pos]]) != 0) {
                if (len - pos < w)
                    return -EBADMSG;
                pos += w;
                left--;
            }
            st[depth].left = left;
            if (left == 0)
                continue;
        } else if (depth >= 3 && (st[depth].total - st[depth].left) % 2 == 0) {
            /* The same in a map (a map event's small fields): whole pairs of a short-string
             * key and such a value. A pair whose value is anything else (a container: its
             * key matters) goes the general way, key first. */
            uint64_t left = st[depth].left;
            while (left >= 2 && len - pos >= 2) {
                uint8_t kb = p[pos], vw;
                size_t kw = (size_t)1 + (kb & 0x1f);
                if (kb < 0xa0 || kb > 0xbf || len - pos <= kw ||
                    (vw = d->skip_width[p[pos + kw]]) == 0)
                    break;
                if (len - pos - kw < vw)
                    return -EBADMSG;
                pos += kw + vw;
                left -= 2;
            }
            st[depth].left = left;
            if (left == 0)
                continue;
        }
        idx = st[depth].total - st[depth].left;
        st[depth].left--;
        if (pos >= len)
            return -EBADMSG; /* truncated */
        rem = len - pos;
        b = p[pos];
        size_t start = pos;

        if (depth == 1 && idx < 4) {
            sc->top_off[idx] = pos;
        } else if (depth == 2 && in_events) {
            d->spans[idx].off = pos;
            d->spans[idx].zone = d->spans[idx].zone_c = 0;
            d->spans[idx].c0 = (uint32_t)d->ncarves;
            ev_zone = &d->spans[idx].zone;
            ev_zone_c = &d->spans[idx].zone_c;
            key = NULL;
        }

        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool */
        } else if (b <= 0x8f) {
            kind = 2, n = b & 0x0f;
        } else if (b <= 0x9f) {
            kind = 1, n = b & 0x0f;
        } else if (b <= 0xbf) {
            skip = b & 0x1f, is_str = true;
        } else {
            switch (b) {
            case 0xc4: case 0xc5: case 0xc6:   /* bin 8/16/32 */
            case 0xc7: case 0xc8: case 0xc9: { /* ext 8/16/32 (+ type byte) */
                size_t w = (size_t)1 << ((b - 0xc4) % 3);
                if (rem < 1 + w)
                    return -EBADMSG;
                hdr = 1 + w + (b >= 0xc7);
                skip = be_read(p + pos + 1, w);
                break;
            }
            case 0xca: hdr = 5; break;
            case 0xcb: hdr = 9; break;
            case 0xcc: case 0xd0: hdr = 2; break;
            case 0xcd: case 0xd1: hdr = 3; break;
            case 0xce: case 0xd2: hdr = 5; break;
            case 0xcf: case 0xd3: hdr = 9; break;
            case 0xd4: hdr = 3; break;  /* fixext 1: type + 1 byte */
            case 0xd5: hdr = 4; break;
            case 0xd6: hdr = 6; break;
            case 0xd7: hdr = 10; break;
            case 0xd8: hdr = 18; break;
            case 0xd9: case 0xda: case 0xdb: { /* str 8/16/32 */
                size_t w = (size_t)1 << (b - 0xd9);
                if (rem < 1 + w)
                    return -EBADMSG;
                hdr = 1 + w;
                skip = be_read(p + pos + 1, w);
                is_str = true;
                break;
            }
            case 0xdc: case 0xdd: case 0xde: case 0xdf: { /* array/map 16/32 */
                size_t w = (b == 0xdc || b == 0xde) ? 2 : 4;
                if (rem < 1 + w)
                    return -EBADMSG;
                hdr = 1 + w;
                n = be_read(p + pos + 1, w);
                kind = (b <= 0xdd) ? 1 : 2;
                break;
            }
            default: /* 0xc1: never used */
                return -EBADMSG;
            }
        }
        if (rem < hdr || rem - hdr < skip)
            return -EBADMSG;
        if (depth == 3 && in_events && st[3].map && idx % 2 == 0) {
            key = is_str ? p + pos + hdr : NULL;
            key_len = skip;
        }
        pos += hdr + skip;
        if (kind == 0) {
            if (depth == 0)
                return -EBADMSG; /* a batch is an array */
            continue;
        }

        /* A container: every declared item needs at least one byte of what is left. */
        uint64_t items = (kind == 2) ? 2 * n : n;
        if (items > len - pos)
            return -EBADMSG;
        if (depth + 1 > d->lim.max_depth)
            return -EBADMSG;
        st[depth + 1].carve = false;
        if (depth == 0) {
            if (kind != 1)
                return -EBADMSG;
            sc->ntop = n;
        } else if (depth == 1 && idx == 1 && kind == 1) { /* the events array */
            int rc;
            if (n > d->lim.max_events)
                return -EBADMSG;
            rc = reserve_spans(d, (size_t)n + 1);
            if (rc != 0)
                return rc;
            sc->events_array = true;
            sc->nevents = (uint32_t)n;
            in_events = true;
        } else if (depth >= 2 && in_events) { /* an event or something inside one */
            size_t z = (size_t)n * (kind == 2 ? sizeof(msgpack_object_kv) : sizeof(msgpack_object));
            bool carved = false;
            *ev_zone += z;
            if (depth == 3 && kind == 1) { /* an array field of an event */
                bool h, t;
                if (!st[3].map) {
                    h = (idx == 1), t = (idx == 3);
                } else {
                    h = idx % 2 == 1 && key && key_len == 12 && !memcmp(key, "block_hashes", 12);
                    t = idx % 2 == 1 && key && key_len == 9 && !memcmp(key, "token_ids", 9);
                }
                bool fits = h ? n <= d->lim.max_hashes : n <= d->lim.max_tokens;
                uint32_t done = 0;
                if ((h || t) && !d->lim.reference) {
                    /* a bulk array: decoded right here, in the walk that validates it */
                    int rc = add_carve(d, start, n, t);
                    if (rc != 0)
                        return rc;
                    struct carve *c = &d->carves[d->ncarves - 1];
                    if (fits && h) {
                        rc = scratch_room((void **)&d->hashes, &d->hcap, sc->hbound + n,
                                          sizeof(*d->hashes), 1024);
                        if (rc == 0)
                            done = pre_hashes(p, len, &pos, (uint32_t)n,
                                              d->hashes + sc->hbound);
                    } else if (fits) {
                        rc = scratch_room((void **)&d->tokens, &d->tcap, sc->tbound + n,
                                          sizeof(*d->tokens), 4096);
                        if (rc == 0)
                            done = pre_tokens(p, len, &pos, (uint32_t)n,
                                              d->tokens + sc->tbound);
                    }
                    if (rc != 0)
                        return rc;
                    c->off = (uint32_t)(h ? sc->hbound : sc->tbound);
                    carved = in_carve = true;
                    if (fits && done == n) { /* all of it: no level to walk */
                        c->ok = true;
                        c->end = pos;
                        in_carve = false;
                    } else {
                        items = n - done; /* walked from the first item not decoded */
                    }
                }
                if (h && fits)
                    sc->hbound += n;
                if (t && fits)
                    sc->tbound += n;
                if (carved && !in_carve)
                    continue;
            }
            if (!carved && !in_carve)
                *ev_zone_c += z;
            st[depth + 1].carve = carved;
        }
        depth++;
        st[depth].left = st[depth].total = items;
        st[depth].map = (kind == 2);
    }
    if (pos != len)
        return -EBADMSG; /* trailing bytes */
    for (uint32_t i = 0; i < sc->nevents; i++) {
        const struct span *e = &d->spans[i];
        if (e->zone > d->ev_zone_max)
            continue; /* skipped as too_large, never unpacked */
        if (e->zone_c > sc->zone_max)
            sc->zone_max = e->zone_c;
        if (e[1].c0 != e->c0) {
            size_t copy = e[1].off - e->off;
            for (uint32_t k = e->c0; k < e[1].c0; k++)
                copy -= d->carves[k].end - d->carves[k].start - CARVE_MARK;
            if (copy > sc->copy_max)
                sc->copy_max = copy;
        }
    }
    return 0;
}
