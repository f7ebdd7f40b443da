/* tok_load.c — loading a Hugging Face tokenizer.json (+ tokenizer_config.json) into the
 * immutable struct kvr_tok that tok.c encodes with: BPE models only, every component either
 * understood exactly or refused with its JSON path (FILE: JSON.PATH: what), never
 * approximated. Byte-level vocabularies are converted back to raw bytes here, so the encoder
 * works on the text's own bytes. The loader keeps no cJSON objects past load.
 */
#include "text/tok_int.h"

#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

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

/* One component (normalizer, pre-tokenizer, post-processor) that is not a Sequence: n, of
 * type ty, at JSON path `path` (for errors). */
typedef int (*load_fn)(kvr_tok *t, const cJSON *n, const char *ty, const char *path, char *err,
                       size_t el);

/* The component n at path: nothing when absent or null; a Sequence loads each element of
 * n[seq_key] in turn (each a component itself, with its own path); any other type is loaded
 * by one. 0 or a negative errno. */
static int load_component(kvr_tok *t, const cJSON *n, const char *path, const char *seq_key,
                          load_fn one, char *err, size_t el)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    const char *ty = jstr(n, "type");
    if (!ty)
        return errf(err, el, -EINVAL, "%s.type: missing", path);
    if (strcmp(ty, "Sequence"))
        return one(t, n, ty, path, err, el);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(n, seq_key), *e;
    int i = 0;

    if (!cJSON_IsArray(a))
        return errf(err, el, -EINVAL, "%s.%s: not an array", path, seq_key);
    cJSON_ArrayForEach(e, a)
    {
        char p[256];
        snprintf(p, sizeof p, "%s.%s[%d]", path, seq_key, i++);
        int rc = load_component(t, e, p, seq_key, one, err, el);
        if (rc)
            return rc;
    }
    return 0;
}

static int load_norm(kvr_tok *t, const cJSON *n, const char *ty, const char *path, char *err,
                     size_t el)
{
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

/* 1 when JIT-compiled, 0 when the interpreter runs it, or -errno. */
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
    /* failure: the interpreter runs it; PARTIAL_HARD is the prefix cache's proof scan */
    *out = c;
    return pcre2_jit_compile(c, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD) == 0 ? 1 : 0;
}

static int load_pre(kvr_tok *t, const cJSON *n, const char *ty, const char *path, char *err,
                     size_t el)
{
    if (!strcmp(ty, "ByteLevel")) {
        if (jtrue(n, "add_prefix_space"))
            return errf(err, el, -ENOTSUP, "%s.add_prefix_space: true is not supported", path);
        t->byte_level = true;
        if (jtrue(n, "use_regex")) {
            struct pre p = {.behavior = B_ISOLATED};
            int rc = compile_re(GPT2_RE, &p.re, path, err, el);
            if (rc >= 0)
                p.jit = rc, rc = 0;
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
    if (re) {
        if ((rc = compile_re(re, &p.re, path, err, el)) >= 0)
            p.jit = rc, rc = 0;
    } else if (s && *s) {
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

static int load_post(kvr_tok *t, const cJSON *n, const char *ty, const char *path, char *err,
                     size_t el)
{
    if (!strcmp(ty, "ByteLevel"))
        return 0;
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
        if (!(rc = kvr_tok_normalize(t, s, c, a->len, &o, &on)) &&
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
    int rc = load_component(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                            "pre_tokenizer", "pretokenizers", load_pre, err, el);
    if (!rc)
        rc = load_component(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                            "normalizer", "normalizers", load_norm, err, el);
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
            return rc == -EOVERFLOW
                       ? errf(err, el, rc, "added_tokens[%d].content: the normalizer grows it "
                                           "past %d x its length + %d bytes", i, NORM_GROWTH,
                                           NORM_SLACK)
                       : rc;
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
    if ((rc = load_component(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                             "post_processor", "processors", load_post, err, el)))
        return rc;
    if (config && (rc = load_config(t, config, err, el)))
        return rc;
    return 0;
}

/* The lower bounds the token limit uses (tok_int.h: max_sym, cover, raw_bound). Why they
 * are sound:
 * - A BPE symbol starts as one character (or byte, byte-level) of the pre-token: a vocabulary
 *   entry of exactly those bytes, a byte-fallback token per byte (its entry "<0xAB>" is
 *   longer than the byte it covers), or unk (one character, at most 4 bytes, unless fuse_unk
 *   joins a run of them: unbounded). A merge's new id is the vocabulary entry of the two
 *   parts' bytes concatenated (the loader looks it up so), so by induction the bytes a
 *   symbol covers never exceed its entry's length. With ignore_merges a whole pre-token
 *   found in the vocabulary is its entry. So every output id covers at most max_sym bytes.
 * - cover: a character with none of vocabulary entry, byte fallback and unk is dropped
 *   (makes no id), and a fused unk covers any number of bytes; either breaks the bound.
 *   Byte-level vocabularies have all 256 one-byte entries; byte_fallback tokenizers have all
 *   256 <0xAB> tokens (then neither unk nor dropping is ever reached).
 * - raw_bound, from the raw text: added tokens cover at most max_added bytes each unless
 *   lstrip/rstrip absorb whitespace runs (unbounded); Prepend and a Replace whose
 *   replacement is no shorter than its pattern only grow the text; NFC/NFKC can shrink it
 *   (compositions, compatibility forms; the ratio is small but we do not rely on a proof of
 *   it) and a Removed split drops text: for those, only the per-pre-token bound applies
 *   (kvr_tok_encode_at checks it before each segment's BPE). */
/* The byte pairs found inside vocabulary entries (keys: raw bytes for byte-level ones), for
 * splitting long pre-tokens (tok.c: bpe says why that is exact). Not with ignore_merges: a
 * piece that is itself a vocabulary entry would become one id, which BPE of the whole
 * pre-token need not give. */
static int word_pairs(kvr_tok *t)
{
    if (t->ignore_merges)
        return 0;
    if (!(t->pairs = calloc(65536 / 8, 1)))
        return -ENOMEM;
    for (uint32_t id = 0; id < t->nvocab; id++) {
        if (t->vlen[id] == UINT32_MAX)
            continue;
        const unsigned char *k = (const unsigned char *)t->arena + t->voff[id];
        for (uint32_t j = 1; j < t->vlen[id]; j++) {
            unsigned x = (unsigned)k[j - 1] << 8 | k[j];
            t->pairs[x >> 3] |= (uint8_t)(1u << (x & 7));
        }
    }
    t->split_words = true;
    return 0;
}

static void token_bounds(kvr_tok *t)
{
    uint32_t m = 4;
    for (uint32_t i = 0; i < t->nvocab; i++)
        if (t->vlen[i] != UINT32_MAX && t->vlen[i] > m)
            m = t->vlen[i];
    if (t->max_added > m)
        m = t->max_added;
    t->max_sym = m;
    bool all1 = true, allfb = true;
    for (int b = 0; b < 256; b++) {
        all1 &= t->id1[b] != UINT32_MAX;
        allfb &= t->bytefb[b] != UINT32_MAX;
    }
    t->cover = (t->byte_level && all1) || (t->byte_fallback && allfb) ||
               (t->unk != UINT32_MAX && !t->fuse_unk);
    t->keep_all = true;
    for (size_t i = 0; i < t->npres; i++)
        t->keep_all &= t->pres[i].behavior != B_REMOVED;
    t->raw_bound = t->cover && t->keep_all;
    for (size_t i = 0; i < t->nadded; i++)
        t->raw_bound &= !t->added[i].lstrip && !t->added[i].rstrip;
    for (size_t i = 0; i < t->nnorms; i++) {
        const struct norm *nm = &t->norms[i];
        t->raw_bound &= nm->kind == N_PREPEND || (nm->kind == N_REPLACE && nm->blen >= nm->alen);
    }
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
        if (err && errlen && !err[0]) /* every failure says why */
            errf(err, errlen, rc, "%s", rc == -ENOMEM ? "out of memory" : strerror(-rc));
        kvr_tok_free(t);
        return rc;
    }
    /* what the prefix cache needs to know (tok_cache.c): where text can be resumed */
    t->inseg = t->npres > 0 && t->pres[0].re != NULL && t->pres[0].behavior == B_ISOLATED;
    for (size_t i = 0; i < t->nnorms; i++) {
        t->has_nfx |= t->norms[i].kind <= N_NFKD;
        t->inseg &= t->norms[i].kind <= N_NFKD; /* Prepend/Replace: segment starts only */
    }
    for (size_t i = 0; i < t->nadded; i++) {
        const struct added *a = &t->added[i];
        uint32_t l = a->len > a->mlen ? a->len : a->mlen;
        if (l > t->max_added)
            t->max_added = l;
        t->any_lstrip |= a->lstrip;
    }
    token_bounds(t);
    if ((rc = word_pairs(t)) != 0) {
        kvr_tok_free(t);
        return errf(err, errlen, rc, "out of memory");
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
    free(t->pairs);
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

