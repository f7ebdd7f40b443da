/* tok.c — Hugging Face tokenizer.json (BPE) in C: load once, encode from any thread.
 *
 * Why this shape: HF computes ids as added-token split → normalize → pre-tokenize → BPE per
 * pre-token → post-process; reproducing each stage literally (same regexes, same merge order
 * with HF's heap tie-break on position) is what makes the ids exact. Byte-level vocabularies
 * are converted back to raw bytes at load, so the hot path works on the text's own bytes and
 * never builds the GPT-2 "Ġ" strings. The loader keeps no cJSON objects past load.
 */
#include "tok.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
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
};

/* ---- small helpers ---------------------------------------------------------------------- */

__attribute__((format(printf, 4, 5))) static int errf(char *err, size_t errlen, int rc,
                                                     const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int grow(void **p, size_t *cap, size_t need, size_t elsz)
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

static size_t utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Strict UTF-8 (no overlongs, surrogates or > U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
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

/* GPT-2's bytes_to_unicode, inverted: code point -> byte, -1 when not one of the 256. */
static int bl_byte(uint32_t cp)
{
    if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    /* the 68 bytes not printable above, in order, got 256.. */
    int k = (int)cp - 256;
    for (int b = 0; b < 256; b++) {
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
            continue;
        if (k-- == 0)
            return b;
    }
    return -1;
}

static uint64_t hbytes(const char *s, size_t n)
{
    return XXH3_64bits(s, n);
}

static uint64_t hpair(uint64_t k)
{
    k ^= k >> 31;
    k *= 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 29);
}

/* ---- vocabulary ------------------------------------------------------------------------- */

static int arena_put(kvr_tok *t, const char *s, size_t n, uint32_t *off)
{
    if (t->arena_len + n > UINT32_MAX)
        return -ENOMEM;
    int rc = grow((void **)&t->arena, &t->arena_cap, t->arena_len + n + 1, 1);
    if (rc)
        return rc;
    memcpy(t->arena + t->arena_len, s, n);
    *off = (uint32_t)t->arena_len;
    t->arena_len += n;
    return 0;
}

/* Byte-level keys back to raw bytes (into buf, at least n bytes); other keys unchanged. */
static size_t key_bytes(const kvr_tok *t, const char *s, size_t n, char *buf)
{
    if (!t->byte_level) {
        memcpy(buf, s, n);
        return n;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        int b = k > 0 ? bl_byte((uint32_t)cp) : -1;
        if (b < 0) { /* not a byte-level string (e.g. an added token): keep it as it is */
            memcpy(buf, s, n);
            return n;
        }
        buf[o++] = (char)b;
        i += (size_t)k;
    }
    return o;
}

static uint32_t vocab_get(const kvr_tok *t, const char *s, size_t n)
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

static int vocab_set(kvr_tok *t, const char *key, size_t n, uint32_t id, char *err, size_t el,
                     const char *what)
{
    if (id >= t->nvocab)
        return errf(err, el, -EINVAL, "%s: id %u out of range", what, id);
    if (t->vlen[id] != UINT32_MAX) /* an added token re-listing a vocab id: keep the first */
        return 0;
    int rc = arena_put(t, key, n, &t->voff[id]);
    if (rc)
        return rc;
    t->vlen[id] = (uint32_t)n;
    if (vocab_get(t, key, n) != UINT32_MAX)
        return 0; /* duplicate string (e.g. a byte-level key equal to an added token) */
    size_t i = hbytes(key, n) & t->vmask;
    while (t->vtab[i] != UINT32_MAX)
        i = (i + 1) & t->vmask;
    t->vtab[i] = id;
    return 0;
}

static const struct merge *merge_get(const kvr_tok *t, uint32_t a, uint32_t b)
{
    uint64_t k = (uint64_t)a << 32 | b;
    for (size_t i = hpair(k) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->mkey[i] == UINT64_MAX)
            return NULL;
        if (t->mkey[i] == k)
            return &t->mval[i];
    }
}

/* ---- loading ---------------------------------------------------------------------------- */

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jtrue(const cJSON *o, const char *k)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static bool jnull(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return !v || cJSON_IsNull(v);
}

static bool utf8_valid(const unsigned char *s, size_t n);

/* A copy of a string the encoder puts into or matches against text: it must be valid UTF-8,
 * or a match could cut a character and hand PCRE2 (run without its own UTF check) a bad
 * subject. */
static int dupstr(const char *s, char **out, size_t *len)
{
    *len = strlen(s);
    if (!utf8_valid((const unsigned char *)s, *len))
        return -EILSEQ;
    *out = malloc(*len + 1);
    if (!*out)
        return -ENOMEM;
    memcpy(*out, s, *len + 1);
    return 0;
}

/* A component of type Sequence (normalizer, pre-tokenizer, post-processor): each element
 * of n[key] loaded by fn, with its JSON path for errors. */
typedef int (*load_fn)(kvr_tok *t, const cJSON *n, const char *path, char *err, size_t el);

static int load_seq(kvr_tok *t, const cJSON *n, const char *key, const char *path, load_fn fn,
                    char *err, size_t el)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(n, key), *e;
    int i = 0;

    if (!cJSON_IsArray(a))
        return errf(err, el, -EINVAL, "%s.%s: not an array", path, key);
    cJSON_ArrayForEach(e, a)
    {
        char p[256];
        snprintf(p, sizeof p, "%s.%s[%d]", path, key, i++);
        int rc = fn(t, e, p, err, el);
        if (rc)
            return rc;
    }
    return 0;
}

static int load_norm(kvr_tok *t, const cJSON *n, const char *path, char *err, size_t el)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    const char *ty = jstr(n, "type");
    if (!ty)
        return errf(err, el, -EINVAL, "%s.type: missing", path);
    if (!strcmp(ty, "Sequence"))
        return load_seq(t, n, "normalizers", path, load_norm, err, el);
    struct norm nm = {0};
    int rc = 0;
    if (!strcmp(ty, "NFC"))
        nm.kind = N_NFC;
    else if (!strcmp(ty, "NFD"))
        nm.kind = N_NFD;
    else if (!strcmp(ty, "NFKC"))
        nm.kind = N_NFKC;
    else if (!strcmp(ty, "NFKD"))
        nm.kind = N_NFKD;
    else if (!strcmp(ty, "Prepend")) {
        const char *s = jstr(n, "prepend");
        if (!s)
            return errf(err, el, -EINVAL, "%s.prepend: missing", path);
        nm.kind = N_PREPEND;
        rc = dupstr(s, &nm.a, &nm.alen);
    } else if (!strcmp(ty, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *s = jstr(pat, "String"), *c = jstr(n, "content");
        if (!s)
            return errf(err, el, -ENOTSUP, "%s.pattern: only String patterns are supported",
                        path);
        if (!c || !*s)
            return errf(err, el, -EINVAL, "%s.content: missing", path);
        nm.kind = N_REPLACE;
        rc = dupstr(s, &nm.a, &nm.alen);
        if (!rc)
            rc = dupstr(c, &nm.b, &nm.blen);
    } else
        return errf(err, el, -ENOTSUP, "%s.type: unsupported normalizer \"%s\"", path, ty);
    struct norm *q = rc ? NULL : realloc(t->norms, (t->nnorms + 1) * sizeof nm);
    if (!q) {
        free(nm.a);
        free(nm.b);
        return rc == -EILSEQ ? errf(err, el, -EINVAL, "%s: a string is not valid UTF-8", path)
                             : -ENOMEM;
    }
    t->norms = q;
    t->norms[t->nnorms++] = nm;
    return 0;
}

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_pre(kvr_tok *t, struct pre p)
{
    struct pre *q = realloc(t->pres, (t->npres + 1) * sizeof p);
    if (!q)
        return -ENOMEM;
    t->pres = q;
    t->pres[t->npres++] = p;
    return 0;
}

/* HF runs Split regexes with Oniguruma, whose \s is Unicode's White_Space property (with
 * U+0085 NEL); PCRE2's UCP \s is "Z or HT/LF/VT/FF/CR" (no NEL). Spelled out, both agree. */
#define WS_CLASS "\\t\\n\\x0b\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}" \
                 "\\x{202f}\\x{205f}\\x{3000}"

/* re with \s and \S rewritten to WS_CLASS (malloc'ed into *out); -ENOTSUP for \S in a class. */
static int hf_whitespace(const char *re, char **out)
{
    size_t n = strlen(re), cap = n * (sizeof WS_CLASS + 3) + 1, o = 0;
    char *b = malloc(cap);
    if (!b)
        return -ENOMEM;
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char d = re[++i];
            if (d == 's' || d == 'S') {
                if (in && d == 'S') {
                    free(b);
                    return -ENOTSUP;
                }
                o += (size_t)snprintf(b + o, cap - o, in ? "%s" : d == 's' ? "[%s]" : "[^%s]",
                                      WS_CLASS);
            } else {
                b[o++] = c;
                b[o++] = d;
            }
            continue;
        }
        if (!in && c == '[') {
            in = true;
            b[o++] = c;
            if (re[i + 1] == '^')
                b[o++] = re[++i];
            if (re[i + 1] == ']')
                b[o++] = re[++i];
            continue;
        }
        if (in && c == ']')
            in = false;
        b[o++] = c;
    }
    b[o] = 0;
    *out = b;
    return 0;
}

static int compile_re(const char *re0, pcre2_code **out, const char *path, char *err, size_t el)
{
    int ec;
    PCRE2_SIZE eo;
    char *re;
    int rc = hf_whitespace(re0, &re);
    if (rc)
        return rc == -ENOMEM ? rc
                             : errf(err, el, rc, "%s.pattern.Regex: \\S inside a class", path);
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                  &ec, &eo, NULL);
    free(re);
    if (!c) {
        char m[160];
        pcre2_get_error_message(ec, (PCRE2_UCHAR *)m, sizeof m);
        return errf(err, el, -EINVAL, "%s.pattern.Regex: %s at offset %zu", path, m, (size_t)eo);
    }
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE); /* failure: the interpreter runs it */
    *out = c;
    return 0;
}

static int load_pre(kvr_tok *t, const cJSON *n, const char *path, char *err, size_t el)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    const char *ty = jstr(n, "type");
    if (!ty)
        return errf(err, el, -EINVAL, "%s.type: missing", path);
    if (!strcmp(ty, "Sequence"))
        return load_seq(t, n, "pretokenizers", path, load_pre, err, el);
    if (!strcmp(ty, "ByteLevel")) {
        if (jtrue(n, "add_prefix_space"))
            return errf(err, el, -ENOTSUP, "%s.add_prefix_space: true is not supported", path);
        t->byte_level = true;
        if (jtrue(n, "use_regex")) {
            struct pre p = {.behavior = B_ISOLATED};
            int rc = compile_re(GPT2_RE, &p.re, path, err, el);
            if (!rc && (rc = add_pre(t, p)))
                pcre2_code_free(p.re);
            return rc;
        }
        return 0;
    }
    if (strcmp(ty, "Split"))
        return errf(err, el, -ENOTSUP, "%s.type: unsupported pre_tokenizer \"%s\"", path, ty);
    if (jtrue(n, "invert"))
        return errf(err, el, -ENOTSUP, "%s.invert: true is not supported", path);
    const char *b = jstr(n, "behavior");
    struct pre p = {0};
    if (b && !strcmp(b, "Isolated"))
        p.behavior = B_ISOLATED;
    else if (b && !strcmp(b, "Removed"))
        p.behavior = B_REMOVED;
    else if (b && !strcmp(b, "MergedWithPrevious"))
        p.behavior = B_MERGED_PREV;
    else if (b && !strcmp(b, "MergedWithNext"))
        p.behavior = B_MERGED_NEXT;
    else
        return errf(err, el, -ENOTSUP, "%s.behavior: unsupported \"%s\"", path, b ? b : "");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
    const char *re = jstr(pat, "Regex"), *s = jstr(pat, "String");
    int rc;
    if (re)
        rc = compile_re(re, &p.re, path, err, el);
    else if (s && *s) {
        if ((rc = dupstr(s, &p.lit, &p.litlen)) == -EILSEQ)
            return errf(err, el, -EINVAL, "%s.pattern.String: not valid UTF-8", path);
    } else
        return errf(err, el, -EINVAL, "%s.pattern: neither Regex nor a non-empty String", path);
    if (!rc && (rc = add_pre(t, p))) {
        pcre2_code_free(p.re);
        free(p.lit);
    }
    return rc;
}

static int load_model(kvr_tok *t, const cJSON *m, char *err, size_t el)
{
    const char *ty = jstr(m, "type");
    if (!m || !ty)
        return errf(err, el, -EINVAL, "model.type: missing");
    if (strcmp(ty, "BPE"))
        return errf(err, el, -ENOTSUP, "model.type: unsupported model \"%s\" (only BPE)", ty);
    if (!jnull(m, "dropout"))
        return errf(err, el, -ENOTSUP, "model.dropout: not supported");
    const char *p = jstr(m, "continuing_subword_prefix"), *s = jstr(m, "end_of_word_suffix");
    if ((p && *p) || (s && *s))
        return errf(err, el, -ENOTSUP,
                    "model: continuing_subword_prefix/end_of_word_suffix not supported");
    t->ignore_merges = jtrue(m, "ignore_merges");
    t->byte_fallback = jtrue(m, "byte_fallback");
    t->fuse_unk = jtrue(m, "fuse_unk");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    if (!cJSON_IsObject(vocab))
        return errf(err, el, -EINVAL, "model.vocab: not an object");
    char *kb = NULL;
    size_t kbcap = 0;
    int rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= t->nvocab ||
            e->valuedouble != (double)(uint32_t)e->valuedouble) {
            rc = errf(err, el, -EINVAL, "model.vocab[\"%.40s\"]: bad id", e->string);
            break;
        }
        size_t n = strlen(e->string);
        if ((rc = grow((void **)&kb, &kbcap, n + 1, 1)))
            break;
        n = key_bytes(t, e->string, n, kb);
        if ((rc = vocab_set(t, kb, n, (uint32_t)e->valuedouble, err, el, "model.vocab")))
            break;
    }
    const char *unk = jstr(m, "unk_token");
    t->unk = UINT32_MAX;
    if (!rc && unk) {
        t->unk = vocab_get(t, unk, strlen(unk));
        if (t->unk == UINT32_MAX)
            rc = errf(err, el, -EINVAL, "model.unk_token: \"%.40s\" not in vocab", unk);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b, hx[8];
        t->id1[b] = vocab_get(t, &c, 1);
        snprintf(hx, sizeof hx, "<0x%02X>", b);
        t->bytefb[b] = vocab_get(t, hx, 6);
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!rc && !cJSON_IsArray(merges))
        rc = errf(err, el, -EINVAL, "model.merges: not an array");
    if (rc) {
        free(kb);
        return rc;
    }
    size_t nm = (size_t)cJSON_GetArraySize(merges), cap = 16;
    while (cap < nm * 2)
        cap *= 2;
    t->mkey = malloc(cap * sizeof *t->mkey);
    t->mval = malloc(cap * sizeof *t->mval);
    if (!t->mkey || !t->mval) {
        free(kb);
        return -ENOMEM;
    }
    memset(t->mkey, 0xFF, cap * sizeof *t->mkey);
    t->mmask = cap - 1;
    uint32_t rank = 0;
    cJSON_ArrayForEach(e, merges)
    {
        const char *a, *b;
        size_t al, bl;
        const char *sp;
        if (cJSON_IsString(e) && (sp = strchr(e->valuestring, ' ')) && !strchr(sp + 1, ' ')) {
            a = e->valuestring, al = (size_t)(sp - a), b = sp + 1, bl = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            a = e->child->valuestring, al = strlen(a);
            b = e->child->next->valuestring, bl = strlen(b);
        } else {
            rc = errf(err, el, -EINVAL, "model.merges[%u]: not \"a b\" or [a, b]", rank);
            break;
        }
        if ((rc = grow((void **)&kb, &kbcap, 2 * (al + bl) + 2, 1)))
            break;
        size_t ka = key_bytes(t, a, al, kb), kbl = key_bytes(t, b, bl, kb + ka);
        uint32_t ia = vocab_get(t, kb, ka), ib = vocab_get(t, kb + ka, kbl),
                 in = vocab_get(t, kb, ka + kbl);
        if (ia == UINT32_MAX || ib == UINT32_MAX || in == UINT32_MAX) {
            rc = errf(err, el, -EINVAL, "model.merges[%u]: token not in vocab", rank);
            break;
        }
        uint64_t k = (uint64_t)ia << 32 | ib;
        size_t i = hpair(k) & t->mmask;
        while (t->mkey[i] != UINT64_MAX && t->mkey[i] != k)
            i = (i + 1) & t->mmask;
        if (t->mkey[i] == UINT64_MAX) { /* a repeated pair keeps its first (lowest) rank */
            t->mkey[i] = k;
            t->mval[i] = (struct merge){rank, in};
        }
        rank++;
    }
    free(kb);
    return rc;
}

static int cmp_added(const void *pa, const void *pb, void *ctx)
{
    const kvr_tok *t = ctx;
    const struct added *a = &t->added[*(const uint32_t *)pa], *b = &t->added[*(const uint32_t *)pb];
    unsigned char fa = (unsigned char)t->arena[a->moff];
    unsigned char fb = (unsigned char)t->arena[b->moff];
    if (fa != fb)
        return fa < fb ? -1 : 1;
    return a->mlen > b->mlen ? -1 : a->mlen < b->mlen ? 1 : 0;
}

static int build_addset(kvr_tok *t, struct addset *as, bool normalized)
{
    as->idx = malloc((t->nadded + 1) * sizeof *as->idx);
    if (!as->idx)
        return -ENOMEM;
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].normalized == normalized && t->added[i].mlen)
            as->idx[as->n++] = (uint32_t)i;
    qsort_r(as->idx, as->n, sizeof *as->idx, cmp_added, t);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < as->n && (unsigned char)t->arena[t->added[as->idx[j]].moff] < b)
            j++;
        as->first[b] = (uint32_t)j;
    }
    as->first[256] = (uint32_t)as->n;
    return 0;
}

/* The id of a token named in the post-processor or tokenizer_config.json. */
static uint32_t token_id(const kvr_tok *t, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && !memcmp(t->arena + t->added[i].off, s, n))
            return t->added[i].id;
    return vocab_get(t, s, n);
}

static int push_u32(uint32_t **a, size_t *n, uint32_t v)
{
    uint32_t *q = realloc(*a, (*n + 1) * sizeof v);
    if (!q)
        return -ENOMEM;
    *a = q;
    q[(*n)++] = v;
    return 0;
}

static int load_post(kvr_tok *t, const cJSON *n, const char *path, char *err, size_t el)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    const char *ty = jstr(n, "type");
    if (!ty)
        return errf(err, el, -EINVAL, "%s.type: missing", path);
    if (!strcmp(ty, "ByteLevel"))
        return 0;
    if (!strcmp(ty, "Sequence"))
        return load_seq(t, n, "processors", path, load_post, err, el);
    if (strcmp(ty, "TemplateProcessing"))
        return errf(err, el, -ENOTSUP, "%s.type: unsupported post_processor \"%s\"", path, ty);
    if (t->nprefix || t->nsuffix)
        return errf(err, el, -ENOTSUP, "%s: a second TemplateProcessing", path);
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(n, "single"), *e;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(n, "special_tokens");
    if (!cJSON_IsArray(single))
        return errf(err, el, -EINVAL, "%s.single: not an array", path);
    bool seen_a = false;
    int i = 0, rc = 0;
    cJSON_ArrayForEach(e, single)
    {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        if (sq) {
            const char *id = jstr(sq, "id");
            if (!id || strcmp(id, "A") || seen_a)
                return errf(err, el, -EINVAL, "%s.single[%d].Sequence: not one A", path, i);
            seen_a = true;
        } else if (st) {
            const char *id = jstr(st, "id");
            const cJSON *d = id ? cJSON_GetObjectItemCaseSensitive(sp, id) : NULL;
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(d, "ids"), *x;
            if (!cJSON_IsArray(ids))
                return errf(err, el, -EINVAL, "%s.special_tokens[\"%.40s\"].ids: missing", path,
                            id ? id : "");
            cJSON_ArrayForEach(x, ids)
            {
                if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= t->nvocab)
                    return errf(err, el, -EINVAL, "%s.special_tokens: bad id", path);
                rc = seen_a ? push_u32(&t->suffix, &t->nsuffix, (uint32_t)x->valuedouble)
                            : push_u32(&t->prefix, &t->nprefix, (uint32_t)x->valuedouble);
                if (rc)
                    return rc;
            }
        } else
            return errf(err, el, -EINVAL, "%s.single[%d]: neither SpecialToken nor Sequence",
                        path, i);
        i++;
    }
    if (!seen_a)
        return errf(err, el, -EINVAL, "%s.single: no Sequence A", path);
    return 0;
}

/* tokenizer_config.json: the classes whose fast tokenizer rebuilds its post-processor from
 * add_bos_token/add_eos_token (transformers' LlamaTokenizerFast/GemmaTokenizerFast
 * update_post_processor; defaults add_bos_token=true, add_eos_token=false). */
static int load_config(kvr_tok *t, const cJSON *c, char *err, size_t el)
{
    const char *cls = jstr(c, "tokenizer_class");
    if (!cls)
        return 0;
    if (strcmp(cls, "LlamaTokenizerFast") && strcmp(cls, "LlamaTokenizer") &&
        strcmp(cls, "GemmaTokenizerFast") && strcmp(cls, "GemmaTokenizer"))
        return 0;
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(c, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(c, "add_eos_token");
    bool bos = ab ? cJSON_IsTrue(ab) : true, eos = ae ? cJSON_IsTrue(ae) : false;
    t->nprefix = t->nsuffix = 0;
    const char *names[2] = {"bos_token", "eos_token"};
    bool want[2] = {bos, eos};
    for (int k = 0; k < 2; k++) {
        if (!want[k])
            continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, names[k]);
        const char *s = cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
        uint32_t id = s ? token_id(t, s) : UINT32_MAX;
        if (id == UINT32_MAX)
            return errf(err, el, -EINVAL, "tokenizer_config.json: %s: missing or unknown",
                        names[k]);
        int rc = k == 0 ? push_u32(&t->prefix, &t->nprefix, id)
                        : push_u32(&t->suffix, &t->nsuffix, id);
        if (rc)
            return rc;
    }
    return 0;
}

static int normalize(const kvr_tok *t, kvr_tok_scratch *s, const char *in, size_t n,
                     const char **out, size_t *outn);

/* HF matches a normalized=true added token in normalized text by its normalized content. */
static int normalize_added(kvr_tok *t, struct added *a)
{
    char *c = malloc(a->len + 1); /* the arena may move under arena_put */
    kvr_tok_scratch *s = kvr_tok_scratch_new();
    int rc = c && s ? 0 : -ENOMEM;
    if (!rc) {
        memcpy(c, t->arena + a->off, a->len);
        const char *o;
        size_t on;
        if (!(rc = normalize(t, s, c, a->len, &o, &on)) &&
            !(rc = arena_put(t, o, on, &a->moff)))
            a->mlen = (uint32_t)on;
    }
    kvr_tok_scratch_free(s);
    free(c);
    return rc;
}

static int load_json(kvr_tok *t, const cJSON *root, const cJSON *config, char *err, size_t el)
{
    if (!cJSON_IsObject(root))
        return errf(err, el, -EINVAL, "$: not a JSON object");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *e;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added))
        return errf(err, el, -EINVAL, "added_tokens: not an array");
    /* the id space */
    double maxid = -1;
    cJSON_ArrayForEach(e, vocab) if (cJSON_IsNumber(e) && e->valuedouble > maxid) maxid =
        e->valuedouble;
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsNumber(id) && id->valuedouble > maxid)
            maxid = id->valuedouble;
    }
    if (maxid >= (1u << 24))
        return errf(err, el, -EINVAL, "model.vocab: ids above 2^24");
    t->nvocab = (uint32_t)(maxid + 1);
    size_t cap = 16;
    while (cap < (size_t)t->nvocab * 2)
        cap *= 2;
    t->voff = malloc(((size_t)t->nvocab + 1) * sizeof *t->voff);
    t->vlen = malloc(((size_t)t->nvocab + 1) * sizeof *t->vlen);
    t->vtab = malloc(cap * sizeof *t->vtab);
    if (!t->voff || !t->vlen || !t->vtab)
        return -ENOMEM;
    memset(t->vlen, 0xFF, ((size_t)t->nvocab + 1) * sizeof *t->vlen);
    memset(t->vtab, 0xFF, cap * sizeof *t->vtab);
    t->vmask = cap - 1;
    /* pre-tokenizer first: it decides whether the vocabulary is byte-level */
    int rc = load_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                      "pre_tokenizer", err, el);
    if (!rc)
        rc = load_norm(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer",
                       err, el);
    if (!rc)
        rc = load_model(t, m, err, el);
    if (rc)
        return rc;
    int i = 0;
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const char *s = jstr(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || !s)
            return errf(err, el, -EINVAL, "added_tokens[%d]: id or content missing", i);
        struct added a = {.id = (uint32_t)id->valuedouble,
                          .special = jtrue(e, "special"),
                          .normalized = jtrue(e, "normalized"),
                          .lstrip = jtrue(e, "lstrip"),
                          .rstrip = jtrue(e, "rstrip"),
                          .single_word = jtrue(e, "single_word")};
        size_t n = strlen(s);
        if (!utf8_valid((const unsigned char *)s, n))
            return errf(err, el, -EINVAL, "added_tokens[%d].content: not valid UTF-8", i);
        if ((rc = arena_put(t, s, n, &a.off)))
            return rc;
        a.len = a.mlen = (uint32_t)n;
        a.moff = a.off;
        if (a.normalized && t->nnorms && (rc = normalize_added(t, &a)))
            return rc;
        if ((rc = vocab_set(t, s, n, a.id, err, el, "added_tokens")))
            return rc;
        struct added *q = realloc(t->added, (t->nadded + 1) * sizeof a);
        if (!q)
            return -ENOMEM;
        t->added = q;
        t->added[t->nadded++] = a;
        i++;
    }
    if ((rc = build_addset(t, &t->raw, false)) || (rc = build_addset(t, &t->normd, true)))
        return rc;
    if ((rc = load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                        "post_processor", err, el)))
        return rc;
    if (config && (rc = load_config(t, config, err, el)))
        return rc;
    return 0;
}

int kvr_tok_load_mem(const char *json, size_t len, const char *config, size_t config_len,
                     kvr_tok **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return errf(err, errlen, -EINVAL, "not valid JSON (near byte %zu)",
                    (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : 0));
    cJSON *cfg = NULL;
    if (config) {
        cfg = cJSON_ParseWithLength(config, config_len);
        if (!cfg || !cJSON_IsObject(cfg)) {
            cJSON_Delete(root);
            cJSON_Delete(cfg);
            return errf(err, errlen, -EINVAL, "tokenizer_config.json: not a JSON object");
        }
    }
    static _Atomic uint64_t gens;
    kvr_tok *t = calloc(1, sizeof *t);
    if (t)
        t->gen = atomic_fetch_add_explicit(&gens, 1, memory_order_relaxed) + 1;
    int rc = t ? load_json(t, root, cfg, err, errlen) : -ENOMEM;
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (rc) {
        if (rc == -ENOMEM && err && errlen && !err[0])
            errf(err, errlen, rc, "out of memory");
        kvr_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

static int read_file(const char *path, char **buf, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > (off_t)1 << 30) {
        close(fd);
        return -EINVAL;
    }
    char *b = malloc((size_t)st.st_size + 1);
    size_t n = 0;
    while (b && n < (size_t)st.st_size) {
        ssize_t r = read(fd, b + n, (size_t)st.st_size - n);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            free(b);
            b = NULL;
        } else
            n += (size_t)r;
    }
    close(fd);
    if (!b)
        return -EIO;
    *buf = b;
    *len = n;
    return 0;
}

int kvr_tok_load(const char *path, kvr_tok **out, char *err, size_t errlen)
{
    char jp[PATH_MAX], cp[PATH_MAX];
    struct stat st;
    *out = NULL;
    if (stat(path, &st))
        return errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
    bool dir = S_ISDIR(st.st_mode);
    if (snprintf(jp, sizeof jp, dir ? "%s/tokenizer.json" : "%s", path) >= (int)sizeof jp)
        return errf(err, errlen, -ENAMETOOLONG, "%s: path too long", path);
    const char *slash = strrchr(jp, '/');
    int dl = slash ? (int)(slash - jp) : 1;
    snprintf(cp, sizeof cp, "%.*s/tokenizer_config.json", dl, slash ? jp : ".");
    char *j = NULL, *c = NULL;
    size_t jl = 0, cl = 0;
    int rc = read_file(jp, &j, &jl);
    if (rc)
        return errf(err, errlen, rc, "%s: %s", jp, strerror(-rc));
    bool have_cfg = access(cp, F_OK) == 0;
    if (have_cfg && (rc = read_file(cp, &c, &cl))) {
        free(j);
        return errf(err, errlen, rc, "%s: %s", cp, strerror(-rc));
    }
    char e2[384];
    rc = kvr_tok_load_mem(j, jl, c, cl, out, e2, sizeof e2);
    if (rc)
        errf(err, errlen, rc, "%s: %s", strncmp(e2, "tokenizer_config.json", 21) ? jp : cp,
             strncmp(e2, "tokenizer_config.json: ", 23) ? e2 : e2 + 23);
    free(j);
    free(c);
    return rc;
}

void kvr_tok_free(kvr_tok *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nnorms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    for (size_t i = 0; i < t->npres; i++) {
        pcre2_code_free(t->pres[i].re);
        free(t->pres[i].lit);
    }
    free(t->norms);
    free(t->pres);
    free(t->arena);
    free(t->voff);
    free(t->vlen);
    free(t->vtab);
    free(t->mkey);
    free(t->mval);
    free(t->added);
    free(t->raw.idx);
    free(t->normd.idx);
    free(t->prefix);
    free(t->suffix);
    free(t);
}

uint32_t kvr_tok_vocab_size(const kvr_tok *t)
{
    return t->nvocab;
}

const char *kvr_tok_token(const kvr_tok *t, uint32_t id, size_t *len)
{
    if (id >= t->nvocab || t->vlen[id] == UINT32_MAX)
        return NULL;
    *len = t->vlen[id];
    return t->arena + t->voff[id];
}

/* ---- encoding --------------------------------------------------------------------------- */

struct piece {
    uint32_t s, e;
    bool m; /* a match of the split pattern */
};
struct sym {
    uint32_t id, len;
    int32_t prev, next;
};
struct hent {
    uint32_t rank, pos, new_id;
};

/* The word cache (HF's idea): BPE results of short pre-tokens, per scratch (so per thread:
 * no sharing, no locks), direct-mapped, keyed by the tokenizer's load generation and the
 * word's bytes (compared in full: exact, never a hash match alone). */
#define WC_SLOTS 4096
#define WC_WORD 24
#define WC_IDS 12
struct wc_slot {
    uint64_t gen;
    uint8_t wlen, nids;
    char w[WC_WORD];
    uint32_t ids[WC_IDS];
};

struct kvr_tok_scratch {
    struct wc_slot *wc; /* WC_SLOTS, allocated on first use */
    uint32_t *ids;
    size_t nids, idcap;
    char *nb[2];
    size_t nbcap[2];
    struct piece *pa, *pb, *seq;
    size_t pacap, pbcap, seqcap;
    struct sym *sym;
    size_t symcap;
    struct hent *heap; /* at most 2n entries: n-1 pairs, and each merge pops 1, pushes 2 */
    size_t heapcap;
    utf8proc_int32_t *u32; /* Unicode normalization */
    size_t u32cap;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
};

kvr_tok_scratch *kvr_tok_scratch_new(void)
{
    kvr_tok_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->md = pcre2_match_data_create(1, NULL);
    s->mc = pcre2_match_context_create(NULL);
    s->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->md || !s->mc || !s->js) {
        kvr_tok_scratch_free(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mc, NULL, s->js);
    return s;
}

void kvr_tok_scratch_free(kvr_tok_scratch *s)
{
    if (!s)
        return;
    free(s->wc);
    free(s->ids);
    free(s->nb[0]);
    free(s->nb[1]);
    free(s->pa);
    free(s->pb);
    free(s->seq);
    free(s->sym);
    free(s->heap);
    free(s->u32);
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s);
}

static int out_id(kvr_tok_scratch *s, uint32_t id)
{
    if (s->nids == s->idcap) {
        if (s->nids >= INT32_MAX)
            return -EOVERFLOW;
        int rc = grow((void **)&s->ids, &s->idcap, s->nids + 1, sizeof *s->ids);
        if (rc)
            return rc;
    }
    s->ids[s->nids++] = id;
    return 0;
}

static bool heap_less(const struct hent *a, const struct hent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct hent *h, size_t *n, struct hent v)
{
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&v, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static struct hent heap_pop(struct hent *h, size_t *n)
{
    struct hent top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &v))
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = v;
    return top;
}

static bool has_fallback(const kvr_tok *t, const char *w, size_t k)
{
    for (size_t j = 0; j < k; j++)
        if (t->bytefb[(unsigned char)w[j]] == UINT32_MAX)
            return false;
    return true;
}

static int bpe_merge(const kvr_tok *t, kvr_tok_scratch *s, const char *w, size_t n);

void kvr_tok_scratch_clear_cache(kvr_tok_scratch *s)
{
    if (s->wc)
        memset(s->wc, 0, WC_SLOTS * sizeof *s->wc);
}

/* BPE of one pre-token through the word cache. */
static int bpe(const kvr_tok *t, kvr_tok_scratch *s, const char *w, size_t n)
{
    if (!n)
        return 0;
    if (n > WC_WORD)
        return bpe_merge(t, s, w, n);
    if (!s->wc && !(s->wc = calloc(WC_SLOTS, sizeof *s->wc)))
        return -ENOMEM;
    struct wc_slot *e = &s->wc[XXH3_64bits(w, n) & (WC_SLOTS - 1)];
    int rc;
    if (e->gen == t->gen && e->wlen == n && !memcmp(e->w, w, n)) {
        for (size_t i = 0; i < e->nids; i++)
            if ((rc = out_id(s, e->ids[i])))
                return rc;
        return 0;
    }
    size_t before = s->nids;
    if ((rc = bpe_merge(t, s, w, n)))
        return rc;
    size_t k = s->nids - before;
    if (k <= WC_IDS) {
        e->gen = t->gen;
        e->wlen = (uint8_t)n;
        e->nids = (uint8_t)k;
        memcpy(e->w, w, n);
        if (k) /* a word of characters the vocabulary lacks (no unk, no fallback) has none */
            memcpy(e->ids, s->ids + before, k * sizeof *e->ids);
    }
    return 0;
}

/* BPE of one pre-token, as HF's Word::merge_all (heap ordered by rank, then position). */
static int bpe_merge(const kvr_tok *t, kvr_tok_scratch *s, const char *w, size_t n)
{
    if (t->ignore_merges) {
        uint32_t id = vocab_get(t, w, n);
        if (id != UINT32_MAX)
            return out_id(s, id);
    }
    int rc;
    if ((rc = grow((void **)&s->sym, &s->symcap, n, sizeof *s->sym)) ||
        (rc = grow((void **)&s->heap, &s->heapcap, 2 * n + 2, sizeof *s->heap)))
        return rc;
    struct sym *sy = s->sym;
    size_t ns = 0;
    bool last_unk = false;
    for (size_t i = 0; i < n;) {
        size_t k = t->byte_level ? 1 : utf8_len((unsigned char)w[i]);
        if (k > n - i)
            k = n - i;
        uint32_t id = k == 1 ? t->id1[(unsigned char)w[i]] : vocab_get(t, w + i, k);
        if (id != UINT32_MAX) {
            sy[ns++] = (struct sym){id, (uint32_t)k, 0, 0};
            last_unk = false;
        } else if (t->byte_fallback && has_fallback(t, w + i, k)) {
            for (size_t j = 0; j < k; j++)
                sy[ns++] = (struct sym){t->bytefb[(unsigned char)w[i + j]], 1, 0, 0};
            last_unk = false;
        } else if (t->unk != UINT32_MAX) {
            if (t->fuse_unk && last_unk)
                sy[ns - 1].len += (uint32_t)k;
            else
                sy[ns++] = (struct sym){t->unk, (uint32_t)k, 0, 0};
            last_unk = true;
        }
        i += k;
    }
    for (size_t i = 0; i < ns; i++) {
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const struct merge *m = merge_get(t, sy[i].id, sy[i + 1].id);
        if (m)
            heap_push(s->heap, &nh, (struct hent){m->rank, (uint32_t)i, m->new_id});
    }
    while (nh) {
        struct hent top = heap_pop(s->heap, &nh);
        struct sym *cur = &sy[top.pos];
        if (!cur->len || cur->next < 0)
            continue;
        struct sym *right = &sy[cur->next];
        const struct merge *m = merge_get(t, cur->id, right->id);
        if (!m || m->new_id != top.new_id)
            continue;
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0)
            sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const struct merge *pm = merge_get(t, sy[cur->prev].id, cur->id);
            if (pm)
                heap_push(s->heap, &nh, (struct hent){pm->rank, (uint32_t)cur->prev, pm->new_id});
        }
        if (cur->next >= 0) {
            const struct merge *nm = merge_get(t, cur->id, sy[cur->next].id);
            if (nm)
                heap_push(s->heap, &nh, (struct hent){nm->rank, top.pos, nm->new_id});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (sy[i].len && (rc = out_id(s, sy[i].id)))
            return rc;
    return 0;
}

/* One split pre-tokenizer over each piece of *in (text buf), into *out. */
static int split(const struct pre *p, kvr_tok_scratch *s, const char *buf, const struct piece *in,
                 size_t nin, struct piece **out, size_t *outcap, size_t *nout)
{
    size_t no = 0;
    int rc;
    for (size_t pi = 0; pi < nin; pi++) {
        const char *w = buf + in[pi].s;
        size_t n = in[pi].e - in[pi].s, nq = 0, at = 0;
        /* the interleaved gaps and matches (non-empty), as HF's find_matches */
        while (at < n) {
            size_t ms, me;
            if (p->re) {
                int r = pcre2_match(p->re, (PCRE2_SPTR)w, n, at, PCRE2_NO_UTF_CHECK, s->md,
                                    s->mc);
                if (r == PCRE2_ERROR_NOMATCH)
                    break;
                if (r < 0)
                    return -E2BIG;
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
                ms = ov[0], me = ov[1];
            } else {
                const char *f = memmem(w + at, n - at, p->lit, p->litlen);
                if (!f)
                    break;
                ms = (size_t)(f - w), me = ms + p->litlen;
            }
            if (me == ms) { /* empty match: HF skips it */
                at = ms + (ms < n ? utf8_len((unsigned char)w[ms]) : 1);
                continue;
            }
            if ((rc = grow((void **)&s->seq, &s->seqcap, nq + 2, sizeof *s->seq)))
                return rc;
            size_t gs = nq ? s->seq[nq - 1].e : 0;
            if (ms > gs)
                s->seq[nq++] = (struct piece){(uint32_t)gs, (uint32_t)ms, false};
            s->seq[nq++] = (struct piece){(uint32_t)ms, (uint32_t)me, true};
            at = me;
        }
        size_t gs = nq ? s->seq[nq - 1].e : 0;
        if ((rc = grow((void **)&s->seq, &s->seqcap, nq + 1, sizeof *s->seq)))
            return rc;
        if (gs < n)
            s->seq[nq++] = (struct piece){(uint32_t)gs, (uint32_t)n, false};
        if ((rc = grow((void **)out, outcap, no + nq, sizeof **out)))
            return rc;
        struct piece *o = *out;
        size_t base = no;
        uint32_t off = in[pi].s;
        if (p->behavior == B_ISOLATED) {
            for (size_t i = 0; i < nq; i++)
                o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
        } else if (p->behavior == B_REMOVED) {
            for (size_t i = 0; i < nq; i++)
                if (!s->seq[i].m)
                    o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
        } else if (p->behavior == B_MERGED_PREV) {
            bool prevm = false;
            for (size_t i = 0; i < nq; i++) {
                if (s->seq[i].m && !prevm && no > base)
                    o[no - 1].e = s->seq[i].e + off;
                else
                    o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
                prevm = s->seq[i].m;
            }
        } else { /* B_MERGED_NEXT: the same from the right */
            bool prevm = false;
            size_t k = nq;
            for (size_t i = nq; i-- > 0;) {
                if (s->seq[i].m && !prevm && k < nq)
                    s->seq[k].s = s->seq[i].s;
                else
                    s->seq[--k] = s->seq[i];
                prevm = s->seq[i].m;
            }
            for (size_t i = k; i < nq; i++)
                o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
        }
    }
    *nout = no;
    return 0;
}

static int pretok_bpe(const kvr_tok *t, kvr_tok_scratch *s, const char *buf, size_t off,
                      size_t len)
{
    if (!len)
        return 0;
    int rc;
    if (!t->npres)
        return bpe(t, s, buf + off, len);
    if ((rc = grow((void **)&s->pa, &s->pacap, 1, sizeof *s->pa)))
        return rc;
    s->pa[0] = (struct piece){(uint32_t)off, (uint32_t)(off + len), false};
    size_t n = 1;
    for (size_t i = 0; i < t->npres; i++) {
        size_t no;
        if ((rc = split(&t->pres[i], s, buf, s->pa, n, &s->pb, &s->pbcap, &no)))
            return rc;
        struct piece *x = s->pa;
        size_t xc = s->pacap;
        s->pa = s->pb, s->pacap = s->pbcap, s->pb = x, s->pbcap = xc;
        n = no;
    }
    for (size_t i = 0; i < n; i++)
        if ((rc = bpe(t, s, buf + s->pa[i].s, s->pa[i].e - s->pa[i].s)))
            return rc;
    return 0;
}

static bool is_space(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The byte next to a match: ASCII alphanumerics and '_' (and any non-ASCII) are word. */
static bool is_word(const char *s, size_t at)
{
    unsigned char c = (unsigned char)s[at];
    return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* Leftmost-longest match of an added token in s[from, n): [*ms, *me) the span (with lstrip/rstrip
 * whitespace), the token id in *id. */
static bool added_find(const kvr_tok *t, const struct addset *as, const char *s, size_t n,
                       size_t from, size_t *ms, size_t *me, uint32_t *id)
{
    if (!as->n)
        return false;
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        for (uint32_t j = as->first[b]; j < as->first[b + 1]; j++) {
            const struct added *a = &t->added[as->idx[j]];
            if (a->mlen > n - i || memcmp(s + i, t->arena + a->moff, a->mlen))
                continue;
            size_t st = i, en = i + a->mlen;
            if (a->single_word && ((st > 0 && is_word(s, st - 1)) ||
                                   (en < n && is_word(s, en))))
                continue;
            if (a->lstrip)
                while (st > from && is_space((unsigned char)s[st - 1]))
                    st--;
            if (a->rstrip)
                while (en < n && is_space((unsigned char)s[en]))
                    en++;
            *ms = st, *me = en, *id = a->id;
            return true;
        }
    }
    return false;
}

/* NF(C|D|KC|KD) of in[0,n) into *dst. Normalization is local: text splits before an ASCII
 * character (a starter that is never the second of a composition, and has no decomposition)
 * normalize independently. So ASCII is copied, and only each non-ASCII run with the
 * ASCII character before it (which may compose with the run's marks) goes through utf8proc,
 * in the scratch's buffers (no allocation once they have grown). */
static int unicode_norm(kvr_tok_scratch *s, int kind, const char *in, size_t n, char **dst,
                        size_t *dcap, size_t *dn)
{
    static const int opt[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE,
                              UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                              UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    utf8proc_option_t o = (utf8proc_option_t)(UTF8PROC_STABLE | opt[kind]);
    size_t o_n = 0, i = 0;
    int rc;
    while (i < n) {
        size_t a = i;
        while (i < n && (unsigned char)in[i] < 0x80)
            i++;
        size_t rs = i > a ? i - 1 : i; /* the run, with the ASCII character before it */
        if ((rc = grow((void **)dst, dcap, o_n + (rs - a) + 1, 1)))
            return rc;
        memcpy(*dst + o_n, in + a, rs - a);
        o_n += rs - a;
        if (i == n) { /* ended in ASCII: the last one is copied too */
            (*dst)[o_n++] = in[rs];
            break;
        }
        while (i < n && (unsigned char)in[i] >= 0x80)
            i++;
        /* decompose (up to 18 code points per character in NFKD), reorder, compose */
        for (;;) {
            utf8proc_ssize_t m = utf8proc_decompose((const utf8proc_uint8_t *)in + rs,
                                                    (utf8proc_ssize_t)(i - rs), s->u32,
                                                    (utf8proc_ssize_t)s->u32cap, o);
            if (m < 0)
                return m == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EILSEQ;
            if ((size_t)m > s->u32cap) {
                if ((rc = grow((void **)&s->u32, &s->u32cap, (size_t)m + 1, sizeof *s->u32)))
                    return rc;
                continue;
            }
            m = utf8proc_normalize_utf32(s->u32, m, o);
            if (m < 0)
                return -EILSEQ;
            if ((rc = grow((void **)dst, dcap, o_n + (size_t)m * 4 + 1, 1)))
                return rc;
            for (utf8proc_ssize_t k = 0; k < m; k++)
                o_n += (size_t)utf8proc_encode_char(s->u32[k], (utf8proc_uint8_t *)*dst + o_n);
            break;
        }
    }
    *dn = o_n;
    return 0;
}

/* Normalizes s[0,n) into a scratch buffer: *out, *outn. */
static int normalize(const kvr_tok *t, kvr_tok_scratch *s, const char *in, size_t n,
                     const char **out, size_t *outn)
{
    const char *cur = in;
    size_t cn = n;
    int which = 0, rc;
    for (size_t i = 0; i < t->nnorms; i++) {
        const struct norm *nm = &t->norms[i];
        char **dst = &s->nb[which];
        size_t *dcap = &s->nbcap[which];
        size_t dn = 0;
        if (nm->kind <= N_NFKD) {
            size_t k = 0;
            while (k < cn && (unsigned char)cur[k] < 0x80)
                k++;
            if (k == cn)
                continue; /* ASCII is invariant under every normalization form */
            if ((rc = unicode_norm(s, nm->kind, cur, cn, dst, dcap, &dn)))
                return rc;
        } else if (nm->kind == N_PREPEND) {
            if (!cn)
                continue;
            if ((rc = grow((void **)dst, dcap, cn + nm->alen, 1)))
                return rc;
            memcpy(*dst, nm->a, nm->alen);
            memcpy(*dst + nm->alen, cur, cn);
            dn = cn + nm->alen;
        } else { /* N_REPLACE */
            size_t cnt = 0;
            for (const char *p = cur; (p = memmem(p, cn - (size_t)(p - cur), nm->a, nm->alen));
                 p += nm->alen)
                cnt++;
            if (!cnt)
                continue;
            if ((rc = grow((void **)dst, dcap, cn + cnt * nm->blen, 1)))
                return rc;
            const char *p = cur, *f;
            while ((f = memmem(p, cn - (size_t)(p - cur), nm->a, nm->alen))) {
                memcpy(*dst + dn, p, (size_t)(f - p));
                dn += (size_t)(f - p);
                memcpy(*dst + dn, nm->b, nm->blen);
                dn += nm->blen;
                p = f + nm->alen;
            }
            memcpy(*dst + dn, p, cn - (size_t)(p - cur));
            dn += cn - (size_t)(p - cur);
        }
        cur = *dst;
        cn = dn;
        which ^= 1;
    }
    *out = cur;
    *outn = cn;
    return 0;
}

/* A segment between raw-matched added tokens: normalize, split on normalized added tokens,
 * pre-tokenize and BPE the rest. */
static int segment(const kvr_tok *t, kvr_tok_scratch *s, const char *in, size_t n)
{
    if (!n)
        return 0;
    const char *b;
    size_t bn;
    int rc = normalize(t, s, in, n, &b, &bn);
    if (rc)
        return rc;
    size_t at = 0, ms, me;
    uint32_t id;
    while (added_find(t, &t->normd, b, bn, at, &ms, &me, &id)) {
        if ((rc = pretok_bpe(t, s, b, at, ms - at)) || (rc = out_id(s, id)))
            return rc;
        at = me;
    }
    return pretok_bpe(t, s, b, at, bn - at);
}

int kvr_tok_encode(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t len,
                   bool add_special, const uint32_t **ids)
{
    *ids = NULL;
    if (len > UINT32_MAX / 2)
        return -EOVERFLOW;
    if (!utf8_valid((const unsigned char *)text, len))
        return -EILSEQ;
    s->nids = 0;
    int rc = 0;
    for (size_t i = 0; add_special && !rc && i < t->nprefix; i++)
        rc = out_id(s, t->prefix[i]);
    size_t at = 0, ms, me;
    uint32_t id;
    while (!rc && added_find(t, &t->raw, text, len, at, &ms, &me, &id)) {
        if (!(rc = segment(t, s, text + at, ms - at)))
            rc = out_id(s, id);
        at = me;
    }
    if (!rc)
        rc = segment(t, s, text + at, len - at);
    for (size_t i = 0; add_special && !rc && i < t->nsuffix; i++)
        rc = out_id(s, t->suffix[i]);
    if (rc)
        return rc;
    *ids = s->ids ? s->ids : (const uint32_t *)"";
    return (int)s->nids;
}
