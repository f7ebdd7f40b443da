/* tmpl_val.c — the value model of the template engine: an arena per render ctx (values are
 * never freed one by one: a render's temporaries die with kvr_tmpl_ctx_reset), the public
 * constructors, the "line N: " form of every error message, and the conversions whose bytes must match Python's: str() and repr() of
 * None/bools/ints/floats/lists/dicts, float repr (shortest round-trip digits), json.dumps with
 * ensure_ascii=False, ==, ordering, and Python's notion of whitespace for strip().
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tmpl_int.h"

tval tv_undef_const = {.type = TV_UNDEF};
tval tv_none_const = {.type = TV_NONE};
tval tv_true_const = {.type = TV_BOOL, .u.b = 1};
tval tv_false_const = {.type = TV_BOOL, .u.b = 0};

/* ---- arena ---- */
#define CHUNK 65536

void *tarena_alloc(struct tarena *a, size_t n)
{
    struct tarena_chunk *c = a->head;
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (c == NULL || c->cap - c->used < n) {
        size_t cap = n > CHUNK / 2 ? n : CHUNK;
        if (a->max && a->total + cap > a->max)
            return NULL;
        c = malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->cap = cap;
        c->used = 0;
        a->total += cap;
        if (cap == n && a->head) { /* a big block: keep the current chunk on top */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void tarena_reset(struct tarena *a)
{
    struct tarena_chunk *c = a->head, *keep = NULL;
    while (c) {
        struct tarena_chunk *nx = c->next;
        if (nx == NULL && c->cap == CHUNK)
            keep = c;
        else
            free(c);
        c = nx;
    }
    a->head = keep;
    a->total = keep ? keep->cap : 0;
    if (keep) {
        keep->used = 0;
        keep->next = NULL;
    }
}

void tarena_free(struct tarena *a)
{
    struct tarena_chunk *c = a->head;
    while (c) {
        struct tarena_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->total = 0;
}

char *tarena_strdup(struct tarena *a, const char *s, size_t n)
{
    char *p = tarena_alloc(a, n + 1);
    if (p == NULL)
        return NULL;
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- errors ---- */
void tmpl_verr(char *err, size_t errlen, int line, const char *fmt, va_list ap)
{
    int k = 0;

    if (errlen == 0)
        return;
    if (line >= 0) {
        k = snprintf(err, errlen, "line %d: ", line);
        if (k < 0)
            k = 0;
    }
    if ((size_t)k < errlen)
        vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
}

/* ---- buffers ---- */
void tbuf_put(struct tbuf *b, const char *s, size_t n)
{
    if (b->err || n == 0)
        return;
    if (b->max && b->n + n > b->max) {
        b->err = -E2BIG;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p;
        if (b->a) {
            p = tarena_alloc(b->a, cap);
            if (p && b->n)
                memcpy(p, b->p, b->n);
        } else {
            p = realloc(b->p, cap);
        }
        if (p == NULL) {
            b->err = -ENOMEM;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tbuf_putc(struct tbuf *b, char c)
{
    tbuf_put(b, &c, 1);
}

/* ---- constructors ---- */
tval *tv_new(struct tarena *a, int type)
{
    tval *v = tarena_alloc(a, sizeof(*v));
    if (v) {
        memset(v, 0, sizeof(*v));
        v->type = (uint8_t)type;
    }
    return v;
}

/* a value of type with u.s = (s, n): a string, or an Undefined naming what is missing */
static tval *tv_new_s(struct tarena *a, int type, const char *s, size_t n)
{
    tval *v = tv_new(a, type);
    if (v) {
        v->u.s.p = s;
        v->u.s.n = n;
    }
    return v;
}

tval *tv_undef(struct tarena *a, const char *name, size_t nn)
{
    return tv_new_s(a, TV_UNDEF, name, nn);
}

tval *tv_str_nocopy(struct tarena *a, const char *s, size_t n)
{
    return tv_new_s(a, TV_STR, s, n);
}

tval *tv_str(struct tarena *a, const char *s, size_t n)
{
    char *p = tarena_strdup(a, s, n);
    return p ? tv_str_nocopy(a, p, n) : NULL;
}

tval *tv_int(struct tarena *a, int64_t i)
{
    tval *v = tv_new(a, TV_INT);
    if (v)
        v->u.i = i;
    return v;
}

tval *tv_float(struct tarena *a, double d)
{
    tval *v = tv_new(a, TV_FLOAT);
    if (v)
        v->u.d = d;
    return v;
}

tval *tv_bool(int b)
{
    return b ? &tv_true_const : &tv_false_const;
}

tval *tv_list(struct tarena *a, size_t cap)
{
    tval *v = tv_new(a, TV_LIST);
    if (v && cap) {
        v->u.l.v = tarena_alloc(a, cap * sizeof(tval *));
        if (v->u.l.v == NULL)
            return NULL;
        v->u.l.cap = cap;
    }
    return v;
}

tval *tv_dict(struct tarena *a, int type)
{
    return tv_new(a, type);
}

int tv_list_push(struct tarena *a, tval *l, tval *v)
{
    if (l->u.l.n == l->u.l.cap) {
        size_t cap = l->u.l.cap ? l->u.l.cap * 2 : 4;
        tval **p = tarena_alloc(a, cap * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        if (l->u.l.n)
            memcpy(p, l->u.l.v, l->u.l.n * sizeof(*p));
        l->u.l.v = p;
        l->u.l.cap = cap;
    }
    l->u.l.v[l->u.l.n++] = v;
    return 0;
}

tval *tv_dict_get(const tval *d, const char *k, size_t kn)
{
    for (size_t i = 0; i < d->u.o.n; i++)
        if (d->u.o.e[i].kn == kn && memcmp(d->u.o.e[i].k, k, kn) == 0)
            return d->u.o.e[i].v;
    return NULL;
}

int tv_dict_set(struct tarena *a, tval *d, const char *k, size_t kn, tval *v)
{
    for (size_t i = 0; i < d->u.o.n; i++)
        if (d->u.o.e[i].kn == kn && memcmp(d->u.o.e[i].k, k, kn) == 0) {
            d->u.o.e[i].v = v;
            return 0;
        }
    if (d->u.o.n == d->u.o.cap) {
        size_t cap = d->u.o.cap ? d->u.o.cap * 2 : 4;
        struct tkv *p = tarena_alloc(a, cap * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        if (d->u.o.n)
            memcpy(p, d->u.o.e, d->u.o.n * sizeof(*p));
        d->u.o.e = p;
        d->u.o.cap = cap;
    }
    d->u.o.e[d->u.o.n].k = k;
    d->u.o.e[d->u.o.n].kn = kn;
    d->u.o.e[d->u.o.n].v = v;
    d->u.o.n++;
    return 0;
}

/* public constructors */
kvr_tmpl_val *kvr_tmpl_none(kvr_tmpl_ctx *ctx) { return tv_new(&ctx->arena, TV_NONE); }
kvr_tmpl_val *kvr_tmpl_bool(kvr_tmpl_ctx *ctx, int b)
{
    tval *v = tv_new(&ctx->arena, TV_BOOL);
    if (v)
        v->u.b = !!b;
    return v;
}
kvr_tmpl_val *kvr_tmpl_int(kvr_tmpl_ctx *ctx, int64_t i) { return tv_int(&ctx->arena, i); }
kvr_tmpl_val *kvr_tmpl_double(kvr_tmpl_ctx *ctx, double d) { return tv_float(&ctx->arena, d); }
kvr_tmpl_val *kvr_tmpl_str(kvr_tmpl_ctx *ctx, const char *s, size_t n)
{
    return tv_str(&ctx->arena, s, n);
}
kvr_tmpl_val *kvr_tmpl_list(kvr_tmpl_ctx *ctx) { return tv_list(&ctx->arena, 0); }
kvr_tmpl_val *kvr_tmpl_dict(kvr_tmpl_ctx *ctx) { return tv_dict(&ctx->arena, TV_DICT); }

int kvr_tmpl_list_push(kvr_tmpl_ctx *ctx, kvr_tmpl_val *list, kvr_tmpl_val *v)
{
    if (list == NULL || v == NULL || list->type != TV_LIST)
        return -EINVAL;
    return tv_list_push(&ctx->arena, list, v);
}

int kvr_tmpl_dict_set(kvr_tmpl_ctx *ctx, kvr_tmpl_val *dict, const char *key, size_t klen,
                      kvr_tmpl_val *v)
{
    if (dict == NULL || v == NULL || dict->type != TV_DICT)
        return -EINVAL;
    char *k = tarena_strdup(&ctx->arena, key, klen);
    if (k == NULL)
        return -ENOMEM;
    return tv_dict_set(&ctx->arena, dict, k, klen, v);
}

const kvr_tmpl_val *kvr_tmpl_dict_get(const kvr_tmpl_val *dict, const char *key, size_t klen)
{
    if (dict == NULL || dict->type != TV_DICT)
        return NULL;
    return tv_dict_get(dict, key, klen);
}

int kvr_tmpl_dict_merge(kvr_tmpl_ctx *ctx, kvr_tmpl_val *dst, const kvr_tmpl_val *src)
{
    if (dst == NULL || src == NULL || dst->type != TV_DICT || src->type != TV_DICT)
        return -EINVAL;
    for (size_t i = 0; i < src->u.o.n; i++) {
        int rc = tv_dict_set(&ctx->arena, dst, src->u.o.e[i].k, src->u.o.e[i].kn,
                             src->u.o.e[i].v);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- predicates ---- */
bool tv_is_str(const tval *v) { return v->type == TV_STR; }
bool tv_is_num(const tval *v)
{
    return v->type == TV_INT || v->type == TV_FLOAT || v->type == TV_BOOL;
}
double tv_num(const tval *v)
{
    return v->type == TV_FLOAT ? v->u.d : v->type == TV_INT ? (double)v->u.i : (double)v->u.b;
}

bool tv_truthy(const tval *v)
{
    switch (v->type) {
    case TV_UNDEF: case TV_NONE: return false;
    case TV_BOOL: return v->u.b;
    case TV_INT: return v->u.i != 0;
    case TV_FLOAT: return v->u.d != 0;
    case TV_STR: return v->u.s.n != 0;
    case TV_LIST: return v->u.l.n != 0;
    case TV_DICT: return v->u.o.n != 0;
    default: return true;
    }
}

const char *tv_typename(const tval *v)
{
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str",
                                  "list", "dict", "Namespace", "Macro", "LoopContext",
                                  "builtin_function_or_method", "function", "function"};
    if (v->type == TV_LIST && v->tuple)
        return "tuple";
    return names[v->type];
}

/* ---- UTF-8 ---- */
/* Decodes one code point at i; invalid or truncated sequences decode as one raw byte (so
 * every walk over a string, with tu8_next or tu8_len, sees the same boundaries). */
uint32_t tu8_dec(const char *s, size_t n, size_t i, size_t *adv)
{
    const unsigned char *p = (const unsigned char *)s + i;
    size_t left = n - i;
    uint32_t c = p[0];
    size_t need = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2
                : (c & 0xF8) == 0xF0 ? 3 : 9;
    *adv = 1;
    if (need == 0 || need == 9 || left < need + 1)
        return c;
    for (size_t k = 1; k <= need; k++)
        if ((p[k] & 0xC0) != 0x80)
            return c;
    *adv = need + 1;
    if (need == 1)
        return ((c & 0x1F) << 6) | (p[1] & 0x3F);
    if (need == 2)
        return ((c & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return ((c & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) | ((uint32_t)(p[2] & 0x3F) << 6) |
           (p[3] & 0x3F);
}

size_t tu8_next(const char *s, size_t n, size_t i)
{
    size_t adv;
    (void)tu8_dec(s, n, i, &adv);
    return i + adv > n ? n : i + adv;
}

size_t tu8_len(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i = tu8_next(s, n, i)) {
        /* ASCII runs are the common case */
        while (i < n && (unsigned char)s[i] < 0x80) {
            i++;
            c++;
        }
        if (i >= n)
            break;
        c++;
    }
    return c;
}

void tu8_enc(struct tbuf *b, uint32_t cp)
{
    char t[4];
    if (cp < 0x80) {
        t[0] = (char)cp;
        tbuf_put(b, t, 1);
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        tbuf_put(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        tbuf_put(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        tbuf_put(b, t, 4);
    }
}

bool tu_isspace(uint32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

static bool in_chars(uint32_t c, const char *chars, size_t cn)
{
    for (size_t i = 0; i < cn;) {
        size_t adv;
        if (tu8_dec(chars, cn, i, &adv) == c)
            return true;
        i += adv;
    }
    return false;
}

void tu_strip(const char *s, size_t n, const char *chars, size_t cn, int mode, size_t *off,
              size_t *len)
{
    size_t b = 0, e = n;
    if (mode & 1) {
        while (b < e) {
            size_t adv;
            uint32_t c = tu8_dec(s, e, b, &adv);
            if (chars ? !in_chars(c, chars, cn) : !tu_isspace(c))
                break;
            b += adv;
        }
    }
    if (mode & 2) {
        while (e > b) {
            size_t st = e - 1, adv;
            while (st > b && ((unsigned char)s[st] & 0xC0) == 0x80)
                st--;
            uint32_t c = tu8_dec(s, e, st, &adv);
            if (chars ? !in_chars(c, chars, cn) : !tu_isspace(c))
                break;
            e = st;
        }
    }
    *off = b;
    *len = e - b;
}

/* ---- printing ---- */
void tv_float_repr(struct tbuf *b, double d)
{
    char t[64];
    if (isnan(d)) {
        tbuf_put(b, "nan", 3);
        return;
    }
    if (isinf(d)) {
        if (d < 0)
            tbuf_put(b, "-inf", 4);
        else
            tbuf_put(b, "inf", 3);
        return;
    }
    /* shortest digits that round-trip, then Python's layout (repr: fixed for -4 <= exp < 16) */
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof(t), "%.*e", prec - 1, d);
        if (strtod(t, NULL) == d)
            break;
    }
    char digits[32];
    size_t nd = 0;
    const char *p = t;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    if (neg)
        tbuf_putc(b, '-');
    if (exp >= -5 + 1 && exp < 16) {
        if (exp < 0) {
            tbuf_put(b, "0.", 2);
            for (int i = 0; i < -exp - 1; i++)
                tbuf_putc(b, '0');
            tbuf_put(b, digits, nd);
        } else {
            size_t intd = (size_t)exp + 1;
            for (size_t i = 0; i < intd; i++)
                tbuf_putc(b, i < nd ? digits[i] : '0');
            tbuf_putc(b, '.');
            if (nd > intd)
                tbuf_put(b, digits + intd, nd - intd);
            else
                tbuf_putc(b, '0');
        }
    } else {
        tbuf_putc(b, digits[0]);
        if (nd > 1) {
            tbuf_putc(b, '.');
            tbuf_put(b, digits + 1, nd - 1);
        }
        snprintf(t, sizeof(t), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        tbuf_put(b, t, strlen(t));
    }
}

static void put_int(struct tbuf *b, int64_t i)
{
    char t[32];
    int n = snprintf(t, sizeof(t), "%lld", (long long)i);
    tbuf_put(b, t, (size_t)n);
}

/* Python repr of a str: quotes chosen as Python does, escapes of non-printables. */
static void str_repr(struct tbuf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = (sq && !dq) ? '"' : '\'';
    tbuf_putc(b, q);
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t c = tu8_dec(s, n, i, &adv);
        char t[16];
        if (c == (uint32_t)q || c == '\\') {
            tbuf_putc(b, '\\');
            tbuf_putc(b, (char)c);
        } else if (c == '\n') {
            tbuf_put(b, "\\n", 2);
        } else if (c == '\r') {
            tbuf_put(b, "\\r", 2);
        } else if (c == '\t') {
            tbuf_put(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == 0xad) {
            snprintf(t, sizeof(t), "\\x%02x", c);
            tbuf_put(b, t, 4);
        } else {
            tbuf_put(b, s + i, adv);
        }
        i += adv;
    }
    tbuf_putc(b, q);
}

void tv_html_escape(struct tbuf *b, const char *s, size_t n)
{
    size_t st = 0;
    for (size_t i = 0; i < n; i++) {
        const char *rep;
        switch (s[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '\'': rep = "&#39;"; break;
        case '"': rep = "&#34;"; break;
        default: continue;
        }
        tbuf_put(b, s + st, i - st);
        tbuf_put(b, rep, strlen(rep));
        st = i + 1;
    }
    tbuf_put(b, s + st, n - st);
}

static int repr_in(struct tbuf *b, const tval *v, int depth)
{
    if (depth > 200)
        return -ELOOP;
    switch (v->type) {
    case TV_STR:
        if (v->markup)
            tbuf_put(b, "Markup(", 7);
        str_repr(b, v->u.s.p, v->u.s.n);
        if (v->markup)
            tbuf_putc(b, ')');
        return 0;
    case TV_LIST: {
        tbuf_putc(b, v->tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.l.n; i++) {
            if (i)
                tbuf_put(b, ", ", 2);
            int rc = repr_in(b, v->u.l.v[i], depth + 1);
            if (rc)
                return rc;
        }
        if (v->tuple && v->u.l.n == 1)
            tbuf_putc(b, ',');
        tbuf_putc(b, v->tuple ? ')' : ']');
        return 0;
    }
    case TV_DICT:
        tbuf_putc(b, '{');
        for (size_t i = 0; i < v->u.o.n; i++) {
            if (i)
                tbuf_put(b, ", ", 2);
            str_repr(b, v->u.o.e[i].k, v->u.o.e[i].kn);
            tbuf_put(b, ": ", 2);
            int rc = repr_in(b, v->u.o.e[i].v, depth + 1);
            if (rc)
                return rc;
        }
        tbuf_putc(b, '}');
        return 0;
    case TV_UNDEF:
        if (depth > 0) /* repr(Undefined) inside a container */
            tbuf_put(b, "Undefined", 9);
        return 0;
    default:
        return tv_to_str(b, v);
    }
}

int tv_repr(struct tbuf *b, const tval *v)
{
    return repr_in(b, v, 0);
}

int tv_to_str(struct tbuf *b, const tval *v)
{
    switch (v->type) {
    case TV_UNDEF:
        return 0; /* Jinja2's default Undefined prints as '' */
    case TV_NONE: tbuf_put(b, "None", 4); return 0;
    case TV_BOOL: if (v->u.b) tbuf_put(b, "True", 4); else tbuf_put(b, "False", 5); return 0;
    case TV_INT: put_int(b, v->u.i); return 0;
    case TV_FLOAT: tv_float_repr(b, v->u.d); return 0;
    case TV_STR: tbuf_put(b, v->u.s.p, v->u.s.n); return 0;
    case TV_LIST: case TV_DICT: return repr_in(b, v, 0);
    default:
        return -EINVAL; /* macros, methods, namespaces... print object addresses in Python */
    }
}

/* ---- JSON (json.dumps, ensure_ascii=False) ---- */
static void json_str(struct tbuf *b, const char *s, size_t n, bool ascii)
{
    tbuf_putc(b, '"');
    size_t st = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80 && ascii) { /* ensure_ascii: \uXXXX, surrogate pairs above the BMP */
            size_t adv;
            uint32_t cp = tu8_dec(s, n, i, &adv);
            tbuf_put(b, s + st, i - st);
            char t[16];
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(t, sizeof(t), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                tbuf_put(b, t, 12);
            } else {
                snprintf(t, sizeof(t), "\\u%04x", cp);
                tbuf_put(b, t, 6);
            }
            i += adv - 1;
            st = i + 1;
            continue;
        }
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        tbuf_put(b, s + st, i - st);
        st = i + 1;
        char t[8];
        switch (c) {
        case '"': tbuf_put(b, "\\\"", 2); break;
        case '\\': tbuf_put(b, "\\\\", 2); break;
        case '\n': tbuf_put(b, "\\n", 2); break;
        case '\r': tbuf_put(b, "\\r", 2); break;
        case '\t': tbuf_put(b, "\\t", 2); break;
        case '\b': tbuf_put(b, "\\b", 2); break;
        case '\f': tbuf_put(b, "\\f", 2); break;
        default:
            snprintf(t, sizeof(t), "\\u%04x", c);
            tbuf_put(b, t, 6);
        }
    }
    tbuf_put(b, s + st, n - st);
    tbuf_putc(b, '"');
}

static void json_nl(struct tbuf *b, int indent, int level)
{
    tbuf_putc(b, '\n');
    for (int i = 0; i < indent * level; i++)
        tbuf_putc(b, ' ');
}

static int key_cmp(const struct tkv *x, const struct tkv *y)
{
    size_t n = x->kn < y->kn ? x->kn : y->kn;
    int c = n ? memcmp(x->k, y->k, n) : 0;
    return c ? c : (x->kn > y->kn) - (x->kn < y->kn);
}

int tv_json(struct tbuf *b, const tval *v, const struct tjson_opt *o, int level, int depth)
{
    if (depth > 200)
        return -ELOOP;
    switch (v->type) {
    case TV_NONE: tbuf_put(b, "null", 4); return 0;
    case TV_BOOL: if (v->u.b) tbuf_put(b, "true", 4); else tbuf_put(b, "false", 5); return 0;
    case TV_INT: put_int(b, v->u.i); return 0;
    case TV_FLOAT:
        if (isnan(v->u.d))
            tbuf_put(b, "NaN", 3);
        else if (isinf(v->u.d))
            tbuf_put(b, v->u.d < 0 ? "-Infinity" : "Infinity", v->u.d < 0 ? 9 : 8);
        else
            tv_float_repr(b, v->u.d);
        return 0;
    case TV_STR: json_str(b, v->u.s.p, v->u.s.n, o->ascii); return 0;
    case TV_LIST:
        if (v->u.l.n == 0) {
            tbuf_put(b, "[]", 2);
            return 0;
        }
        tbuf_putc(b, '[');
        for (size_t i = 0; i < v->u.l.n; i++) {
            if (i)
                tbuf_put(b, o->item_sep, o->item_sep_n);
            if (o->indent >= 0)
                json_nl(b, o->indent, level + 1);
            int rc = tv_json(b, v->u.l.v[i], o, level + 1, depth + 1);
            if (rc)
                return rc;
        }
        if (o->indent >= 0)
            json_nl(b, o->indent, level);
        tbuf_putc(b, ']');
        return 0;
    case TV_DICT: {
        if (v->u.o.n == 0) {
            tbuf_put(b, "{}", 2);
            return 0;
        }
        const struct tkv *e = v->u.o.e;
        if (o->sort_keys && v->u.o.n > 1) {
            struct tkv *se = malloc(v->u.o.n * sizeof(*se)); /* freed below, no arena growth */
            if (se == NULL)
                return -ENOMEM;
            memcpy(se, e, v->u.o.n * sizeof(*se));
            for (size_t i = 1; i < v->u.o.n; i++) /* insertion sort: dicts are small */
                for (size_t j = i; j > 0 && key_cmp(&se[j - 1], &se[j]) > 0; j--) {
                    struct tkv t = se[j];
                    se[j] = se[j - 1];
                    se[j - 1] = t;
                }
            int rc = 0;
            tbuf_putc(b, '{');
            for (size_t i = 0; i < v->u.o.n && rc == 0; i++) {
                if (i)
                    tbuf_put(b, o->item_sep, o->item_sep_n);
                if (o->indent >= 0)
                    json_nl(b, o->indent, level + 1);
                json_str(b, se[i].k, se[i].kn, o->ascii);
                tbuf_put(b, o->key_sep, o->key_sep_n);
                rc = tv_json(b, se[i].v, o, level + 1, depth + 1);
            }
            free(se);
            if (rc)
                return rc;
        } else {
            tbuf_putc(b, '{');
            for (size_t i = 0; i < v->u.o.n; i++) {
                if (i)
                    tbuf_put(b, o->item_sep, o->item_sep_n);
                if (o->indent >= 0)
                    json_nl(b, o->indent, level + 1);
                json_str(b, e[i].k, e[i].kn, o->ascii);
                tbuf_put(b, o->key_sep, o->key_sep_n);
                int rc = tv_json(b, e[i].v, o, level + 1, depth + 1);
                if (rc)
                    return rc;
            }
        }
        if (o->indent >= 0)
            json_nl(b, o->indent, level);
        tbuf_putc(b, '}');
        return 0;
    }
    default:
        return -EINVAL; /* Undefined, namespaces, macros: "not JSON serializable" */
    }
}

/* ---- comparison ---- */
static bool eq_in(const tval *a, const tval *b, int depth);

/* Python ==; containers nested deeper than 200 compare unequal (a template can build them in
 * a loop; the recursion stays bounded) */
bool tv_eq(const tval *a, const tval *b)
{
    return eq_in(a, b, 0);
}

static bool eq_in(const tval *a, const tval *b, int depth)
{
    if (depth > 200)
        return false;
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->type == TV_FLOAT || b->type == TV_FLOAT)
            return tv_num(a) == tv_num(b);
        int64_t x = a->type == TV_INT ? a->u.i : a->u.b, y = b->type == TV_INT ? b->u.i : b->u.b;
        return x == y;
    }
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case TV_UNDEF: case TV_NONE: return true;
    case TV_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case TV_LIST:
        if (a->u.l.n != b->u.l.n || a->tuple != b->tuple)
            return false;
        for (size_t i = 0; i < a->u.l.n; i++)
            if (!eq_in(a->u.l.v[i], b->u.l.v[i], depth + 1))
                return false;
        return true;
    case TV_DICT:
        if (a->u.o.n != b->u.o.n)
            return false;
        for (size_t i = 0; i < a->u.o.n; i++) {
            tval *o = tv_dict_get(b, a->u.o.e[i].k, a->u.o.e[i].kn);
            if (o == NULL || !eq_in(a->u.o.e[i].v, o, depth + 1))
                return false;
        }
        return true;
    default:
        return a == b;
    }
}

static int cmp_in(const tval *a, const tval *b, int *cmp, int depth);

int tv_cmp(const tval *a, const tval *b, int *cmp)
{
    return cmp_in(a, b, cmp, 0);
}

static int cmp_in(const tval *a, const tval *b, int *cmp, int depth)
{
    if (depth > 200)
        return -EINVAL;
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->type == TV_FLOAT || b->type == TV_FLOAT) {
            double x = tv_num(a), y = tv_num(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        } else {
            int64_t x = a->type == TV_INT ? a->u.i : a->u.b;
            int64_t y = b->type == TV_INT ? b->u.i : b->u.b;
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        }
        return 0;
    }
    if (a->type == TV_STR && b->type == TV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = n ? memcmp(a->u.s.p, b->u.s.p, n) : 0;
        if (c == 0)
            c = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n ? 1 : 0;
        *cmp = c < 0 ? -1 : c > 0;
        return 0;
    }
    if (a->type == TV_LIST && b->type == TV_LIST && a->tuple == b->tuple) {
        for (size_t i = 0; i < a->u.l.n && i < b->u.l.n; i++) {
            if (eq_in(a->u.l.v[i], b->u.l.v[i], depth + 1))
                continue;
            return cmp_in(a->u.l.v[i], b->u.l.v[i], cmp, depth + 1);
        }
        *cmp = a->u.l.n < b->u.l.n ? -1 : a->u.l.n > b->u.l.n ? 1 : 0;
        return 0;
    }
    return -EINVAL;
}
