/* tok_int.h — what tok_load.c (tokenizer.json → struct kvr_tok) and tok.c (encoding) share,
 * private to src/tok*.c: the loaded tokenizer's structures and the small helpers both sides
 * call (the vocabulary and merge tables are built by the loader and probed per word by the
 * encoder, so their lookups are static inline here). Not a contract for other modules:
 * tok.h is.
 */
#ifndef KVR_TOK_INT_H
#define KVR_TOK_INT_H

#include "text/tok.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>
#include <xxhash.h>

enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_PREPEND, N_REPLACE };
struct norm {
    int kind;
    char *a, *b; /* Prepend: a; Replace: a -> b */
    size_t alen, blen;
};

enum { B_ISOLATED, B_REMOVED, B_MERGED_PREV, B_MERGED_NEXT };
struct pre {
    int behavior;
    pcre2_code *re; /* regex, or NULL for a literal */
    bool jit;       /* re is JIT-compiled for complete and partial-hard matching */
    char *lit;
    size_t litlen;
};

struct added {
    uint32_t id;
    uint32_t off, len;   /* content in the arena */
    uint32_t moff, mlen; /* what is matched: the content, normalized when normalized=true */
    bool special, normalized, lstrip, rstrip, single_word;
};

/* A set of added tokens matched in one pass: sorted by (first byte, length desc). */
struct addset {
    uint32_t *idx; /* into t->added */
    size_t n;
    uint32_t first[257]; /* idx[first[b] .. first[b+1]) start with byte b */
};

struct merge {
    uint32_t rank, new_id;
};

struct kvr_tok {
    uint64_t gen; /* unique per load: keys the scratch's word cache */
    /* vocab: id -> bytes in arena; open-addressed table of ids keyed by bytes */
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *voff, *vlen; /* per id; vlen UINT32_MAX: no such id */
    uint32_t nvocab;       /* ids 0 .. nvocab-1 */
    uint32_t *vtab;        /* UINT32_MAX empty */
    size_t vmask;
    uint32_t id1[256]; /* id of the one-byte token b, UINT32_MAX none */
    uint32_t bytefb[256];
    /* merges */
    uint64_t *mkey;
    struct merge *mval;
    size_t mmask;
    bool byte_level, ignore_merges, byte_fallback, fuse_unk;
    uint32_t unk; /* UINT32_MAX none */
    struct norm *norms;
    size_t nnorms;
    struct pre *pres;
    size_t npres;
    struct added *added;
    size_t nadded;
    struct addset raw, normd;
    uint32_t *prefix, *suffix; /* post-processor template around the sequence */
    size_t nprefix, nsuffix;
    /* resumption (the prefix cache): inseg = text can resume inside a segment, at a
     * boundary of the first pre-tokenizer (a regex Split, Isolated; normalizers NFx only) */
    bool inseg, has_nfx, any_lstrip;
    uint32_t max_added; /* bytes of the longest added token (content or normalized form) */
    /* the token limit (kvr_tok_scratch_set_limit): lower bounds on the ids a text makes.
     * max_sym: bytes one output token can cover at most (the longest vocabulary entry or
     * added token, and 4 for an unknown character); cover: every character of a pre-token
     * yields a symbol (by vocabulary, byte fallback or an unfused unk), so a pre-token of n
     * bytes makes at least ceil(n / max_sym) ids; raw_bound: moreover normalization never
     * shrinks the text, no split removes text and no added token strips whitespace, so a
     * raw text of n bytes makes at least ceil(n / max_sym) ids (tok_load.c says why). */
    uint32_t max_sym;
    bool cover, raw_bound, keep_all; /* keep_all: no pre-tokenizer removes text */
    /* Long pre-tokens split where no merge can ever reach across (tok.c: bpe): pairs has
     * bit (a << 8 | b) set when bytes a, b follow each other inside some vocabulary entry;
     * NULL (and split_words false) with ignore_merges, where splitting would change ids. */
    uint8_t *pairs;
    bool split_words;
};

/* ---- small helpers ---------------------------------------------------------------------- */

static inline int grow(void **p, size_t *cap, size_t need, size_t elsz)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elsz)
            return -ENOMEM;
        n *= 2;
    }
    void *q = realloc(*p, n * elsz);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

static inline size_t utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Strict UTF-8 (no overlongs, surrogates or > U+10FFFF). */
static inline bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            uint64_t w;
            /* ASCII runs eight bytes at a time */
            while (i + 8 <= n && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull)))
                i += 8;
            if (i < n && s[i] < 0x80)
                i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF)
            k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 3, cp = c & 0x07;
        else
            return false;
        if (n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += k + 1;
    }
    return true;
}

static inline uint64_t hbytes(const char *s, size_t n)
{
    return XXH3_64bits(s, n);
}

static inline uint64_t hpair(uint64_t k)
{
    k ^= k >> 31;
    k *= 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 29);
}

/* ---- lookups (built by the loader, probed by the encoder) ------------------------------- */

static inline uint32_t vocab_get(const kvr_tok *t, const char *s, size_t n)
{
    if (!t->vtab)
        return UINT32_MAX;
    for (size_t i = hbytes(s, n) & t->vmask;; i = (i + 1) & t->vmask) {
        uint32_t id = t->vtab[i];
        if (id == UINT32_MAX)
            return UINT32_MAX;
        if (t->vlen[id] == n && memcmp(t->arena + t->voff[id], s, n) == 0)
            return id;
    }
}

static inline const struct merge *merge_get(const kvr_tok *t, uint32_t a, uint32_t b)
{
    uint64_t k = (uint64_t)a << 32 | b;
    for (size_t i = hpair(k) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->mkey[i] == UINT64_MAX)
            return NULL;
        if (t->mkey[i] == k)
            return &t->mval[i];
    }
}

/* tok.c: the normalizer chain on text (the loader runs it on normalized=true added tokens). */
/* ---- resumption (tok.c for tok_cache.c) ---------------------------------------------------
 * A mark is a point of a text where encoding can restart with the same result, given the
 * ids before it: raw = the offset, nids = ids before it, seg = the start of its segment
 * (after a raw-matched added token), sub = the start of its sub-segment (after a normalized
 * added token). raw == seg: a segment start; otherwise a boundary of the first pre-tokenizer
 * inside an identity-normalized segment (t->inseg). Marks recorded by an encode are
 * candidates; the cache proves which survive a different continuation (kvr_tok_prove). */
struct tok_mark {
    uint32_t raw, nids, seg, sub;
};
/* seg of an END mark: raw is where the sub-segment starting at sub ends (the start of an
 * added token, or of the text's end); recorded with the piece marks, never resumed from */
#define TOK_MARK_END UINT32_MAX
/* Encodes from m (NULL: the start); with m, s must hold m->nids ids (kvr_tok_ids_prepare).
 * record: keep the marks passed (kvr_tok_marks). */
int kvr_tok_encode_at(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t len,
                      bool add_special, const struct tok_mark *m, bool record,
                      const uint32_t **ids);
uint32_t *kvr_tok_ids_prepare(kvr_tok_scratch *s, size_t n); /* NULL: -ENOMEM */
/* A per-scratch buffer of at least n bytes for the cache's per-call arrays (kept between
 * calls; its content is not preserved across a growth). NULL: -ENOMEM. */
void *kvr_tok_scratch_aux(kvr_tok_scratch *s, size_t n);
const struct tok_mark *kvr_tok_marks(const kvr_tok_scratch *s, size_t *n);
/* The last boundary k in (from, e) of the first pre-tokenizer in the sub-segment starting at
 * sub (raw text), scanning text[sub, e) from the known boundary `from` with
 * PCRE2_PARTIAL_HARD: a match that could change with more text stops the scan, so the
 * pieces before k are those of any text that continues text[0, e) (with the added-token
 * margins the cache keeps). closed: the sub-segment really ends at e (an added token
 * follows, inside the shared text): a plain scan. k also satisfies the resumption
 * conditions: an ASCII character at k when a Unicode normalizer runs, and (open) a
 * non-space in [k, e) when a token has lstrip. Returns k (from when there is none), or
 * -E2BIG (regex resource limit). */
long kvr_tok_prove(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t sub,
                   size_t from, size_t e, bool closed);

/* Normalizes in[0,n) into s: *out, *outn. -EOVERFLOW when the normalized text would pass
 * NORM_GROWTH x n + NORM_SLACK bytes: chained Replace normalizers of a hostile
 * tokenizer.json can grow a text exponentially (found by fuzz_tok_load), while real
 * normalizers grow it a few times at most (NFKC's widest expansion is 18 code points for
 * one; a Replace of " " by "\u2581" triples a space). */
#define NORM_GROWTH 32
#define NORM_SLACK 4096
int kvr_tok_normalize(const kvr_tok *t, kvr_tok_scratch *s, const char *in, size_t n,
                      const char **out, size_t *outn);

#endif
