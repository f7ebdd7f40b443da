/* decode_int.h — private to decode*.c: the decoder's state and the helpers its files share.
 *
 * decode.h stays the one contract; this header exists because the batch decoder is split in
 * two files: decode.c (lifecycle, events through msgpack-c, kvr_decode_next) and
 * decode_scan.c (the bounds-checked walk over the raw bytes and the bulk-array decoders it
 * runs). Both read and write struct kvr_decoder; see the design note at the top of decode.c.
 */
#ifndef KVR_DECODE_INT_H
#define KVR_DECODE_INT_H

#include "events/decode.h"

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* msgpack-c parser stack (MSGPACK_EMBED_STACK_SIZE in msgpack/unpack_define.h, which
 * msgpack.h does not include; libmsgpackc is built with the default 32). */
#define HARD_MAX_DEPTH 32u

struct span {
    size_t off;    /* first byte of the event */
    size_t zone;   /* zone bytes msgpack-c would need to unpack all of it (too_large test) */
    size_t zone_c; /* zone bytes it needs once the event's bulk arrays are carved out */
    uint32_t c0;   /* its carves are carves[c0, next span's c0) */
};

/* A bulk array (block_hashes / token_ids position) of an event, read from the raw bytes;
 * msgpack-c sees a 3-byte placeholder (bin 8 of one byte) instead, see carve_copy(). */
struct carve {
    size_t start, end;        /* header, end of the array */
    uint32_t n;               /* items */
    uint32_t off;             /* first decoded value in d->hashes / d->tokens */
    bool tok;                 /* token_ids position (else block_hashes) */
    bool ok;                  /* decoded: all n items are valid hashes / token ids */
    const uint8_t *marker;    /* the placeholder's data byte in the copy (set per event) */
};
#define CARVE_MARK 3u /* c4 01 00 */

struct kvr_decoder {
    struct kvr_decode_limits lim;
    size_t ev_zone_max;      /* events needing more zone than this are too_large */

    msgpack_zone *zone;      /* owned; holds the current event only */
    size_t zone_chunk;       /* first-chunk size of zone */

    uint8_t skip_width[256];   /* scalar_width, plus fixstr (1 + length): what the walk's
                                * runs skip without recording anything */
    uint8_t scalar_width[256]; /* encoded size of fixed-size scalars (ints, floats, nil,
                                * bools, fixext); 0 for containers, str, bin, ext, 0xc1 */

    struct span *spans;      /* per event of the open batch, + end sentinel; grow-only */
    size_t spans_cap;
    struct carve *carves;    /* bulk arrays of the open batch, in byte order; grow-only */
    size_t carves_cap, ncarves;
    uint8_t *cbuf;           /* an event with its bulk arrays replaced by placeholders */
    size_t cbcap;

    uint64_t *hashes;        /* scratch for the whole open batch */
    size_t hcap, hlen;
    uint32_t *tokens;
    size_t tcap, tlen;

    struct kvr_xkey *xk;     /* the current event's extra keys; grow-only */
    size_t xkcap;
    uint32_t *xkf;           /* its per-block first-item offsets (nhashes + 1) */
    size_t xkfcap;
    uint32_t *rem;           /* its remaining_copy_counts */
    size_t remcap;

    const uint8_t *buf;      /* open batch (NULL when none) */
    uint32_t nevents, next;
};

/* What prescan() learns about a batch. */
struct scan {
    size_t top_off[4];    /* start of top-level elements 0..3 (0 when absent) */
    uint64_t ntop;        /* top-level array length */
    bool events_array;    /* element [1] is an array */
    uint32_t nevents;
    size_t hbound, tbound; /* scratch needed, upper bounds */
    size_t zone_max;       /* largest per-event zone need (events within ev_zone_max) */
    size_t copy_max;       /* largest carved copy of an event */
};

/* ---- small helpers ------------------------------------------------------------------- */

static inline uint64_t be_read(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline uint16_t be16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return __builtin_bswap16(v);
}

static inline uint32_t be32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}

static inline uint64_t be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

/* Big-endian unsigned of width n in {1, 2, 4, 8} (msgpack int and length widths). */
static inline uint64_t be_n(const uint8_t *p, unsigned n)
{
    switch (n) {
    case 1: return p[0];
    case 2: return be16(p);
    case 4: return be32(p);
    default: return be64(p);
    }
}

/* Capacity for `need` entries: grow by doubling; shrink back when the capacity grew past
 * `keep` and the need is under a quarter of it. Returns the current capacity when no
 * change is wanted. */
static inline size_t fit_cap(size_t cap, size_t need, size_t min, size_t keep)
{
    size_t want;

    if (need <= cap && !(cap > keep && need <= cap / 4))
        return cap;
    want = min;
    while (want < need)
        want *= 2;
    return want;
}

/* Walks exactly one msgpack value spanning p[0..len) (decode_scan.c; see the design note in
 * decode.c). Fills *sc and d->spans[0..nevents], decodes the bulk arrays into the scratch
 * arrays. Returns 0, -EBADMSG, or -ENOMEM. */
int kvr_decode_prescan(struct kvr_decoder *d, const uint8_t *p, size_t len, struct scan *sc);

#endif
