/* tmpl_lex.c — template source to tokens, as Jinja2 3.1's lexer does it with trim_blocks and
 * lstrip_blocks on: data between tags, `{{ }}` / `{% %}` tags with their expression tokens,
 * comments dropped, `{% raw %}` kept verbatim, and whitespace control applied to the data
 * tokens here (`-` strips all whitespace beside the tag, `+` turns lstrip/trim off, a block or
 * comment tag alone on its line takes the line's leading spaces/tabs and its newline).
 * String literals are decoded as Python literals (Jinja2 runs them through unicode-escape).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "text/tmpl_int.h"

struct lex {
    const char *s;
    size_t n, i;
    int line;
    struct tarena *a;
    struct ttokens *out;
    char *err;
    size_t errlen;
};

static int lerr(struct lex *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lerr(struct lex *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tmpl_verr(L->err, L->errlen, L->line, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static struct ttoken *push(struct lex *L, int type, const char *p, size_t n)
{
    struct ttokens *t = L->out;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        struct ttoken *v = tarena_alloc(L->a, cap * sizeof(*v));
        if (v == NULL)
            return NULL;
        if (t->n)
            memcpy(v, t->v, t->n * sizeof(*v));
        t->v = v;
        t->cap = cap;
    }
    struct ttoken *k = &t->v[t->n++];
    memset(k, 0, sizeof(*k));
    k->type = (uint8_t)type;
    k->line = L->line;
    k->p = p;
    k->n = n;
    return k;
}

static void count_lines(struct lex *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (L->s[i] == '\n')
            L->line++;
}

/* Skips Python whitespace (\s) from i; returns the new position. */
static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n) {
        size_t adv;
        uint32_t c = tu8_dec(s, n, i, &adv);
        if (!tu_isspace(c))
            break;
        i += adv;
    }
    return i;
}

/* Emits data s[b..e) after the whitespace control of the tag that follows it. */
static int emit_data(struct lex *L, size_t b, size_t e, char sign, bool lstrip_tag,
                     bool line_starting)
{
    if (sign == '-') {
        size_t off, len;
        tu_strip(L->s + b, e - b, NULL, 0, 2, &off, &len);
        e = b + len;
    } else if (sign != '+' && lstrip_tag) {
        size_t lp = b;
        for (size_t k = e; k > b; k--)
            if (L->s[k - 1] == '\n') {
                lp = k;
                break;
            }
        if (lp > b || line_starting) {
            bool allws = true;
            for (size_t k = lp; k < e; k++)
                if (L->s[k] != ' ' && L->s[k] != '\t') {
                    allws = false;
                    break;
                }
            if (allws)
                e = lp;
        }
    }
    if (e > b && push(L, TK_DATA, L->s + b, e - b) == NULL)
        return -ENOMEM;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes the body of a string literal (between the quotes) as Python's unicode-escape. */
static int decode_string(struct lex *L, const char *p, size_t n, struct ttoken *t)
{
    struct tbuf b = {.a = L->a};
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != '\\' || i + 1 >= n) {
            tbuf_putc(&b, c);
            continue;
        }
        char e = p[++i];
        int digits = 0;
        switch (e) {
        case '\n': break; /* line continuation */
        case '\\': tbuf_putc(&b, '\\'); break;
        case '\'': tbuf_putc(&b, '\''); break;
        case '"': tbuf_putc(&b, '"'); break;
        case 'a': tbuf_putc(&b, '\a'); break;
        case 'b': tbuf_putc(&b, '\b'); break;
        case 'f': tbuf_putc(&b, '\f'); break;
        case 'n': tbuf_putc(&b, '\n'); break;
        case 'r': tbuf_putc(&b, '\r'); break;
        case 't': tbuf_putc(&b, '\t'); break;
        case 'v': tbuf_putc(&b, '\v'); break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': return lerr(L, "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '7'; k++)
                    v = v * 8 + (uint32_t)(p[++i] - '0');
                tu8_enc(&b, v);
            } else {
                tbuf_putc(&b, '\\');
                tbuf_putc(&b, e);
            }
        }
        if (digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = i + 1 < n ? hexval(p[i + 1]) : -1;
                if (h < 0)
                    return lerr(L, "truncated \\%c escape in a string", e);
                v = v * 16 + (uint32_t)h;
                i++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                return lerr(L, "escape \\%c out of range", e);
            tu8_enc(&b, v);
        }
    }
    if (b.err)
        return b.err;
    t->p = b.p ? b.p : "";
    t->n = b.n;
    return 0;
}

static bool is_name_start(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_name_char(unsigned char c)
{
    return is_name_start(c) || (c >= '0' && c <= '9');
}
static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* digits with single underscores between them; returns end */
static size_t scan_digits(const char *s, size_t n, size_t i)
{
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1]))))
        i++;
    return i;
}

static int lex_number(struct lex *L, bool after_dot)
{
    const char *s = L->s;
    size_t st = L->i, e = scan_digits(s, L->n, L->i);
    bool isfloat = false;
    if (!after_dot) {
        if (e + 1 < L->n && s[e] == '.' && is_digit(s[e + 1])) {
            e = scan_digits(s, L->n, e + 1);
            isfloat = true;
        }
        if (e < L->n && (s[e] == 'e' || s[e] == 'E')) {
            size_t k = e + 1;
            if (k < L->n && (s[k] == '+' || s[k] == '-'))
                k++;
            if (k < L->n && is_digit(s[k])) {
                e = scan_digits(s, L->n, k);
                isfloat = true;
            }
        }
    }
    char tmp[64];
    size_t tn = 0;
    for (size_t k = st; k < e; k++)
        if (s[k] != '_') {
            if (tn + 1 >= sizeof(tmp))
                return lerr(L, "number literal too long");
            tmp[tn++] = s[k];
        }
    tmp[tn] = 0;
    struct ttoken *t = push(L, isfloat ? TK_FLOAT : TK_INT, s + st, e - st);
    if (t == NULL)
        return -ENOMEM;
    if (isfloat) {
        t->d = strtod(tmp, NULL);
    } else {
        errno = 0;
        long long v = strtoll(tmp, NULL, 10);
        if (errno)
            return lerr(L, "integer literal out of range");
        t->i = v;
    }
    L->i = e;
    return 0;
}

static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char ops1[] = "+-*/%~[](){}><=.:|,;";

/* Lexes the inside of a tag until its end; kind 'v' ({{ }}) or 'b' ({% %}). */
static int lex_tag(struct lex *L, char kind, bool *trimmed_nl)
{
    const char *s = L->s;
    int depth = 0;
    *trimmed_nl = false;
    for (;;) {
        size_t w = skip_ws(s, L->n, L->i);
        count_lines(L, L->i, w);
        L->i = w;
        if (L->i >= L->n)
            return lerr(L, "unexpected end of template inside a tag");
        size_t i = L->i;
        if (depth == 0) {
            char endc = kind == 'v' ? '}' : '%';
            size_t k = i;
            char sign = 0;
            if ((s[k] == '-' || s[k] == '+') && k + 2 < L->n + 0 && s[k + 1] == endc &&
                s[k + 2] == '}') {
                sign = s[k];
                k++;
            }
            if (k + 1 < L->n && s[k] == endc && s[k + 1] == '}' && !(sign == '+' && kind == 'v')) {
                if (push(L, kind == 'v' ? TK_VAR_END : TK_BLOCK_END, s + i, k + 2 - i) == NULL)
                    return -ENOMEM;
                L->i = k + 2;
                if (sign == '-') {
                    size_t e = skip_ws(s, L->n, L->i);
                    count_lines(L, L->i, e);
                    L->i = e;
                } else if (sign == 0 && kind == 'b' && L->i < L->n && s[L->i] == '\n') {
                    L->i++;
                    L->line++;
                    *trimmed_nl = true;
                }
                if (sign == '-' && L->i > 0 && s[L->i - 1] == '\n')
                    *trimmed_nl = true;
                return 0;
            }
        }
        unsigned char c = (unsigned char)s[i];
        if (c == '\'' || c == '"') {
            size_t k = i + 1;
            while (k < L->n && s[k] != (char)c) {
                if (s[k] == '\\')
                    k++;
                k++;
            }
            if (k >= L->n)
                return lerr(L, "unterminated string");
            struct ttoken *t = push(L, TK_STRING, NULL, 0);
            if (t == NULL)
                return -ENOMEM;
            int rc = decode_string(L, s + i + 1, k - i - 1, t);
            if (rc)
                return rc;
            count_lines(L, i, k);
            L->i = k + 1;
            continue;
        }
        if (is_digit((char)c)) {
            struct ttokens *o = L->out;
            bool after_dot = o->n && o->v[o->n - 1].type == TK_OP && o->v[o->n - 1].n == 1 &&
                             o->v[o->n - 1].p[0] == '.';
            int rc = lex_number(L, after_dot);
            if (rc)
                return rc;
            continue;
        }
        if (is_name_start(c)) {
            size_t k = i;
            while (k < L->n && is_name_char((unsigned char)s[k]))
                k++;
            if (push(L, TK_NAME, s + i, k - i) == NULL)
                return -ENOMEM;
            L->i = k;
            continue;
        }
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof(ops2) / sizeof(ops2[0]); k++)
            if (i + 1 < L->n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1])
                oplen = 2;
        if (!oplen && c && strchr(ops1, c))
            oplen = 1;
        if (!oplen)
            return lerr(L, "unexpected character '%c' in a tag", c >= 0x20 && c < 0x7f ? c : '?');
        if (c == '(' || c == '[' || c == '{')
            depth++;
        else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0)
                return lerr(L, "unexpected '%c'", c);
            depth--;
        }
        if (depth > 256)
            return lerr(L, "brackets nested too deep");
        if (push(L, TK_OP, s + i, oplen) == NULL)
            return -ENOMEM;
        L->i = i + oplen;
    }
}

/* the tag name at position i (after `{%` and its sign): "raw", "endraw"... */
static bool tag_is(const char *s, size_t n, size_t i, const char *word, size_t *end)
{
    i = skip_ws(s, n, i);
    size_t wl = strlen(word);
    if (i + wl > n || memcmp(s + i, word, wl) != 0)
        return false;
    if (i + wl < n && is_name_char((unsigned char)s[i + wl]))
        return false;
    i = skip_ws(s, n, i + wl);
    if (i < n && (s[i] == '-' || s[i] == '+'))
        i++;
    if (i + 1 < n && s[i] == '%' && s[i + 1] == '}') {
        *end = i + 2;
        return true;
    }
    return false;
}

int tmpl_lex(const char *src, size_t len, struct tarena *a, struct ttokens *out, char *err,
             size_t errlen)
{
    struct lex L = {.s = src, .n = len, .line = 1, .a = a, .out = out, .err = err,
                    .errlen = errlen};
    bool line_starting = true;
    while (L.i < L.n) {
        size_t b = L.i, k = b;
        const char *tag = NULL;
        while (k + 1 < L.n) {
            const char *q = memchr(src + k, '{', L.n - k - 1);
            if (q == NULL)
                break;
            k = (size_t)(q - src);
            if (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#') {
                tag = src + k;
                break;
            }
            k++;
        }
        if (tag == NULL) {
            if (push(&L, TK_DATA, src + b, L.n - b) == NULL)
                return -ENOMEM;
            break;
        }
        char kind = tag[1];
        char sign = (k + 2 < L.n && (src[k + 2] == '-' || src[k + 2] == '+')) ? src[k + 2] : 0;
        if (kind == '{' && sign == '+')
            sign = 0; /* `{{+` is a unary plus, not a modifier */
        int rc = emit_data(&L, b, k, sign, kind != '{', line_starting);
        if (rc)
            return rc;
        count_lines(&L, b, k);
        size_t body = k + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = body;
            for (;;) {
                const char *q = e < L.n ? memchr(src + e, '#', L.n - e) : NULL;
                if (q == NULL || (size_t)(q - src) + 1 >= L.n)
                    return lerr(&L, "unterminated comment");
                e = (size_t)(q - src);
                if (src[e + 1] == '}')
                    break;
                e++;
            }
            char esign = (e > body && (src[e - 1] == '-' || src[e - 1] == '+')) ? src[e - 1] : 0;
            count_lines(&L, body, e);
            L.i = e + 2;
            line_starting = false;
            if (esign == '-') {
                size_t w = skip_ws(src, L.n, L.i);
                count_lines(&L, L.i, w);
                L.i = w;
                line_starting = L.i > 0 && src[L.i - 1] == '\n';
            } else if (esign != '+' && L.i < L.n && src[L.i] == '\n') {
                L.i++;
                L.line++;
                line_starting = true;
            }
            continue;
        }
        size_t rend;
        if (kind == '%' && tag_is(src, L.n, body, "raw", &rend)) {
            /* raw: find {% endraw %} */
            char rsign = src[rend - 3];
            size_t p = rend;
            if (rsign == '-')
                p = skip_ws(src, L.n, p);
            else if (p < L.n && src[p] == '\n')
                p++;
            size_t q = p, eend = 0, etag = 0;
            char esign = 0;
            for (;;) {
                const char *m = q + 1 < L.n ? memchr(src + q, '{', L.n - q - 1) : NULL;
                if (m == NULL)
                    return lerr(&L, "missing {%% endraw %%}");
                q = (size_t)(m - src);
                if (src[q + 1] == '%') {
                    size_t bb = q + 2;
                    char s2 = (bb < L.n && (src[bb] == '-' || src[bb] == '+')) ? src[bb] : 0;
                    if (tag_is(src, L.n, bb + (s2 ? 1 : 0), "endraw", &eend)) {
                        etag = q;
                        esign = s2;
                        break;
                    }
                }
                q++;
            }
            count_lines(&L, body, p);
            size_t save = L.i;
            (void)save;
            rc = emit_data(&L, p, etag, esign, true, p > 0 && src[p - 1] == '\n');
            if (rc)
                return rc;
            count_lines(&L, p, eend);
            L.i = eend;
            char endsign = src[eend - 3];
            if (endsign == '-')
                L.i = skip_ws(src, L.n, L.i);
            else if (endsign != '+' && L.i < L.n && src[L.i] == '\n')
                L.i++;
            count_lines(&L, eend, L.i);
            line_starting = L.i > 0 && src[L.i - 1] == '\n';
            continue;
        }
        if (push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, tag, 2) == NULL)
            return -ENOMEM;
        L.i = body;
        bool nl;
        rc = lex_tag(&L, kind == '{' ? 'v' : 'b', &nl);
        if (rc)
            return rc;
        line_starting = nl;
    }
    if (push(&L, TK_EOF, src + L.n, 0) == NULL)
        return -ENOMEM;
    return 0;
}
