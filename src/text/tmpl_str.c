/* tmpl_str.c — the string side of the builtins: Python's str methods (split/rsplit, strip,
 * replace, find, join, startswith...), case mapping (upper/lower/title/capitalize with the
 * Unicode tables below), splitlines, Jinja2's title filter, Markup, and printf-style `%`
 * formatting. Split from tmpl_builtin.c (filters, tests, attributes, globals), which calls
 * these through tmpl_int.h.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tmpl_int.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

/* Simple case mapping of the scripts chat text mostly uses: ASCII, Latin-1, Latin Extended-A,
 * Greek, Cyrillic, Armenian, Latin Extended Additional (Vietnamese), fullwidth Latin; with
 * Python's special cases there (ß -> SS, final sigma, İ -> i̇). Other code points are caseless
 * here (Python knows more: docs/chat-templates.md). */
uint32_t tb_cp_upper(uint32_t c)
{
    if (c < 0x80)
        return c >= 'a' && c <= 'z' ? c - 32 : c;
    if (c == 0xB5) return 0x39C;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    if (c >= 0x100 && c <= 0x137) return (c & 1) ? c - 1 : c;
    if (c >= 0x139 && c <= 0x148) return (c & 1) ? c : c - 1;
    if (c >= 0x14A && c <= 0x177) return (c & 1) ? c - 1 : c;
    if (c >= 0x179 && c <= 0x17E) return (c & 1) ? c : c - 1;
    if (c == 0x3C2) return 0x3A3;
    if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 32;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c >= 0x3CD && c <= 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
        return (c & 1) ? c - 1 : c;
    if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c : c - 1;
    if (c == 0x4CF) return 0x4C0;
    if (c >= 0x561 && c <= 0x586) return c - 48;
    if ((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) return (c & 1) ? c - 1 : c;
    if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
    return c;
}

uint32_t tb_cp_lower(uint32_t c)
{
    if (c < 0x80)
        return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x137 && c != 0x130) return (c & 1) ? c : c + 1;
    if (c >= 0x139 && c <= 0x148) return (c & 1) ? c + 1 : c;
    if (c >= 0x14A && c <= 0x177) return (c & 1) ? c : c + 1;
    if (c >= 0x179 && c <= 0x17E) return (c & 1) ? c + 1 : c;
    if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c >= 0x38E && c <= 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
        return (c & 1) ? c : c + 1;
    if (c == 0x4C0) return 0x4CF;
    if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c + 1 : c;
    if (c >= 0x531 && c <= 0x556) return c + 48;
    if (c == 0x1E9E) return 0xDF;
    if ((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) return (c & 1) ? c : c + 1;
    if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
    return c;
}

static bool cp_cased(uint32_t c)
{
    return tb_cp_upper(c) != c || tb_cp_lower(c) != c || c == 0xDF || c == 0x130 || c == 0x138 ||
           c == 0x149 || c == 0xAA || c == 0xBA;
}

/* upper of c into b (ß -> SS, ŉ -> ʼN); title: ß -> Ss */
static void put_upper(struct tbuf *b, uint32_t c, bool title)
{
    if (c == 0xDF)
        tbuf_put(b, title ? "Ss" : "SS", 2);
    else if (c == 0x149) {
        tu8_enc(b, 0x2BC);
        tbuf_putc(b, 'N');
    } else
        tu8_enc(b, tb_cp_upper(c));
}

static void put_lower(struct tbuf *b, const char *s, size_t n, size_t i, uint32_t c)
{
    if (c == 0x130) { /* İ -> i + combining dot above */
        tbuf_putc(b, 'i');
        tu8_enc(b, 0x307);
        return;
    }
    if (c == 0x3A3) { /* final sigma: after a cased letter and not before one */
        bool before = false, after = false;
        for (size_t k = i; k > 0;) {
            size_t st = k - 1, adv;
            while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80)
                st--;
            uint32_t pc = tu8_dec(s, n, st, &adv);
            before = cp_cased(pc);
            break;
        }
        size_t adv;
        (void)tu8_dec(s, n, i, &adv);
        if (i + adv < n) {
            size_t a2;
            after = cp_cased(tu8_dec(s, n, i + adv, &a2));
        }
        tu8_enc(b, before && !after ? 0x3C2 : 0x3C3);
        return;
    }
    tu8_enc(b, tb_cp_lower(c));
}

/* Jinja2's title filter (not str.title): words start after runs of whitespace, '-', '(',
 * '{', '[' or '<'; each word is word[0].upper() + word[1:].lower() */
tval *tb_title_filter(struct trender *r, tval *s)
{
    struct tbuf b = {.a = r->a};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    bool at_start = true;
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t c = tu8_dec(p, n, i, &adv);
        bool sep = tu_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        if (sep) {
            tbuf_put(&b, p + i, adv);
            at_start = true;
        } else if (at_start) {
            put_upper(&b, c, false);
            at_start = false;
        } else {
            put_lower(&b, p, n, i, c);
        }
        i += adv;
    }
    return mkstr(r, &b);
}

/* mode 0 lower, 1 upper, 2 title, 3 capitalize (Python str methods) */
tval *tb_case_map(struct trender *r, tval *s, int mode)
{
    struct tbuf b = {.a = r->a};
    bool prev_cased = false;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t c = tu8_dec(p, n, i, &adv);
        if (c < 0x80 && mode < 2) { /* fast path */
            char ch = (char)(mode == 1 ? tb_cp_upper(c) : tb_cp_lower(c));
            tbuf_putc(&b, ch);
        } else if (mode == 0 || (mode == 2 && prev_cased) || (mode == 3 && i > 0)) {
            put_lower(&b, p, n, i, c);
        } else if (mode == 1 || mode == 2 || mode == 3) {
            put_upper(&b, c, mode >= 2);
        }
        prev_cased = cp_cased(c);
        i += adv;
    }
    tval *v = mkstr(r, &b);
    if (v)
        v->markup = s->markup; /* Markup's methods return Markup */
    return v;
}

tval *tb_markup(struct trender *r, tval *s)
{
    if (s->markup)
        return s;
    tval *v = tv_str_nocopy(r->a, s->u.s.p, s->u.s.n);
    if (v)
        v->markup = 1;
    return v;
}


void tb_splitlines(const char *s, size_t n, size_t *starts, size_t *lens, size_t *cnt,
                       size_t cap)
{
    size_t k = 0, st = 0;
    for (size_t i = 0; i < n && k < cap;) {
        size_t adv;
        uint32_t c = tu8_dec(s, n, i, &adv);
        bool br = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                  c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (br) {
            starts[k] = st;
            lens[k++] = i - st;
            if (c == '\r' && i + 1 < n && s[i + 1] == '\n')
                adv++;
            st = i + adv;
        }
        i += adv;
    }
    if (st < n && k < cap) {
        starts[k] = st;
        lens[k++] = n - st;
    }
    *cnt = k;
}

static int str_split(struct trender *r, const struct tnode *n, tval *s, tval *sep, int64_t maxs,
                     bool right, tval **out)
{
    tval *l = tv_list(r->a, 0);
    if (l == NULL)
        return oom(r, n);
    const char *p = s->u.s.p;
    size_t len = s->u.s.n;
    if (sep == NULL || sep->type == TV_NONE) {
        /* runs of whitespace; no empty strings */
        if (right) {
            /* collect all then merge leading ones beyond maxsplit */
            tval *all;
            TRY(str_split(r, n, s, NULL, -1, false, &all));
            if (maxs < 0 || (size_t)maxs >= all->u.l.n) {
                *out = all;
                return 0;
            }
            size_t keep = all->u.l.n - (size_t)maxs; /* first `keep` words stay joined */
            const char *start = all->u.l.v[0]->u.s.p;
            const char *end = all->u.l.v[keep - 1]->u.s.p + all->u.l.v[keep - 1]->u.s.n;
            tval *first = tv_str_nocopy(r->a, start, (size_t)(end - start));
            if (first == NULL || tv_list_push(r->a, l, first))
                return oom(r, n);
            for (size_t i = keep; i < all->u.l.n; i++)
                if (tv_list_push(r->a, l, all->u.l.v[i]))
                    return oom(r, n);
            *out = l;
            return 0;
        }
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            while (i < len) {
                size_t adv;
                if (!tu_isspace(tu8_dec(p, len, i, &adv)))
                    break;
                i += adv;
            }
            if (i >= len)
                break;
            size_t st = i;
            if (maxs >= 0 && splits >= maxs) { /* the rest, trailing whitespace kept */
                tval *w = tv_str_nocopy(r->a, p + st, len - st);
                if (w == NULL || tv_list_push(r->a, l, w))
                    return oom(r, n);
                break;
            }
            while (i < len) {
                size_t adv;
                if (tu_isspace(tu8_dec(p, len, i, &adv)))
                    break;
                i += adv;
            }
            tval *w = tv_str_nocopy(r->a, p + st, i - st);
            if (w == NULL || tv_list_push(r->a, l, w))
                return oom(r, n);
            splits++;
        }
        *out = l;
        return 0;
    }
    if (sep->type != TV_STR)
        return terr(r, n, -EINVAL, "must be str or None, not %s", tv_typename(sep));
    if (sep->u.s.n == 0)
        return terr(r, n, -EINVAL, "empty separator");
    size_t sl = sep->u.s.n;
    /* positions of all separators (left to right, non-overlapping) */
    size_t cnt = 0, cap = 16;
    size_t *pos = tarena_alloc(r->a, cap * sizeof(size_t));
    if (pos == NULL)
        return oom(r, n);
    for (size_t i = 0; i + sl <= len;) {
        const char *m = memmem(p + i, len - i, sep->u.s.p, sl);
        if (m == NULL)
            break;
        if (cnt == cap) {
            size_t *np = tarena_alloc(r->a, cap * 2 * sizeof(size_t));
            if (np == NULL)
                return oom(r, n);
            memcpy(np, pos, cnt * sizeof(size_t));
            pos = np;
            cap *= 2;
        }
        pos[cnt++] = (size_t)(m - p);
        i = (size_t)(m - p) + sl;
    }
    size_t use_from = 0, use_to = cnt;
    if (maxs >= 0 && (size_t)maxs < cnt) {
        if (right)
            use_from = cnt - (size_t)maxs;
        else
            use_to = (size_t)maxs;
    }
    size_t st = 0;
    for (size_t k = use_from; k < use_to; k++) {
        size_t e = pos[k];
        if (right && k == use_from)
            st = 0;
        tval *w = tv_str_nocopy(r->a, p + st, e - st);
        if (w == NULL || tv_list_push(r->a, l, w))
            return oom(r, n);
        st = e + sl;
    }
    tval *w = tv_str_nocopy(r->a, p + st, len - st);
    if (w == NULL || tv_list_push(r->a, l, w))
        return oom(r, n);
    *out = l;
    return 0;
}

static bool prefix_match(tval *s, tval *pfx, bool end)
{
    if (pfx->u.s.n > s->u.s.n)
        return false;
    const char *at = end ? s->u.s.p + s->u.s.n - pfx->u.s.n : s->u.s.p;
    return memcmp(at, pfx->u.s.p, pfx->u.s.n) == 0;
}

int tb_call_str_method(struct trender *r, const struct tnode *n, tval *s, const char *m,
                           tval **args, size_t nargs, tval **out)
{
    size_t mn = strlen(m);
    tval *a0 = nargs > 0 ? args[0] : NULL, *a1 = nargs > 1 ? args[1] : NULL;
    if (eqs(m, mn, "startswith") || eqs(m, mn, "endswith")) {
        bool end = m[0] == 'e';
        if (a0 == NULL || nargs > 1)
            return terr(r, n, -EINVAL, "%s takes one argument here", m);
        if (a0->type == TV_LIST && a0->tuple) {
            bool any = false;
            for (size_t i = 0; i < a0->u.l.n; i++) {
                TRY(need_str(r, n, a0->u.l.v[i], m));
                any |= prefix_match(s, a0->u.l.v[i], end);
            }
            *out = tv_bool(any);
            return 0;
        }
        TRY(need_str(r, n, a0, m));
        *out = tv_bool(prefix_match(s, a0, end));
        return 0;
    }
    if (eqs(m, mn, "split") || eqs(m, mn, "rsplit")) {
        int64_t maxs = -1;
        if (a1) {
            if (a1->type != TV_INT)
                return terr(r, n, -EINVAL, "maxsplit must be an int");
            maxs = a1->u.i;
        }
        return str_split(r, n, s, a0, maxs, m[0] == 'r', out);
    }
    if (eqs(m, mn, "strip") || eqs(m, mn, "lstrip") || eqs(m, mn, "rstrip")) {
        int mode = m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3;
        bool c = a0 && a0->type != TV_NONE;
        if (c)
            TRY(need_str(r, n, a0, m));
        size_t off, len;
        tu_strip(s->u.s.p, s->u.s.n, c ? a0->u.s.p : NULL, c ? a0->u.s.n : 0, mode, &off, &len);
        *out = tv_str_nocopy(r->a, s->u.s.p + off, len);
        if (*out)
            (*out)->markup = s->markup;
        return *out ? 0 : oom(r, n);
    }
    if (eqs(m, mn, "replace")) {
        TRY(need_str(r, n, a0, "replace: old"));
        TRY(need_str(r, n, a1, "replace: new"));
        int64_t cnt = -1;
        if (nargs > 2) {
            if (args[2]->type != TV_INT)
                return terr(r, n, -EINVAL, "replace: count must be an int");
            cnt = args[2]->u.i;
        }
        struct tbuf b = {.a = r->a};
        const char *p = s->u.s.p;
        size_t len = s->u.s.n, i = 0;
        int64_t done = 0;
        if (a0->u.s.n == 0) {
            /* Python inserts `new` between every character and at both ends */
            for (size_t k = 0; k <= len;) {
                if (cnt < 0 || done < cnt) {
                    tbuf_put(&b, a1->u.s.p, a1->u.s.n);
                    done++;
                }
                if (k == len)
                    break;
                size_t e = tu8_next(p, len, k);
                tbuf_put(&b, p + k, e - k);
                k = e;
            }
        } else {
            while (i < len && (cnt < 0 || done < cnt)) {
                const char *hit = memmem(p + i, len - i, a0->u.s.p, a0->u.s.n);
                if (hit == NULL)
                    break;
                tbuf_put(&b, p + i, (size_t)(hit - (p + i)));
                tbuf_put(&b, a1->u.s.p, a1->u.s.n);
                i = (size_t)(hit - p) + a0->u.s.n;
                done++;
            }
            tbuf_put(&b, p + i, len - i);
        }
        *out = mkstr(r, &b);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(m, mn, "upper") || eqs(m, mn, "lower") || eqs(m, mn, "title") ||
        eqs(m, mn, "capitalize")) {
        *out = tb_case_map(r, s, m[0] == 'l' ? 0 : m[0] == 'u' ? 1 : m[0] == 't' ? 2 : 3);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(m, mn, "find") || eqs(m, mn, "rfind") || eqs(m, mn, "count")) {
        TRY(need_str(r, n, a0, m));
        if (nargs > 1)
            return terr(r, n, -EINVAL, "%s: start/end are not supported", m);
        int64_t res = -1, cnt = 0;
        const char *p = s->u.s.p;
        size_t len = s->u.s.n;
        if (a0->u.s.n == 0) {
            cnt = (int64_t)tu8_len(p, len) + 1;
            res = m[0] == 'r' ? (int64_t)tu8_len(p, len) : 0;
        } else {
            for (size_t i = 0; i + a0->u.s.n <= len;) {
                const char *hit = memmem(p + i, len - i, a0->u.s.p, a0->u.s.n);
                if (hit == NULL)
                    break;
                size_t at = (size_t)(hit - p);
                if (res < 0 || m[0] == 'r')
                    res = (int64_t)tu8_len(p, at);
                cnt++;
                if (m[0] == 'f')
                    break;
                i = at + (m[0] == 'c' ? a0->u.s.n : 1);
            }
        }
        *out = tv_int(r->a, m[0] == 'c' ? cnt : res);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(m, mn, "join")) {
        tval *items;
        if (a0 == NULL)
            return terr(r, n, -EINVAL, "join takes one argument");
        TRY(tb_to_items(r, n, a0, &items));
        struct tbuf b = {.a = r->a};
        for (size_t i = 0; i < items->u.l.n; i++) {
            TRY(need_str(r, n, items->u.l.v[i], "join item"));
            if (i)
                tbuf_put(&b, s->u.s.p, s->u.s.n);
            tbuf_put(&b, items->u.l.v[i]->u.s.p, items->u.l.v[i]->u.s.n);
        }
        *out = mkstr(r, &b);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(m, mn, "splitlines")) {
        size_t cap = s->u.s.n + 1;
        size_t *st = tarena_alloc(r->a, cap * sizeof(size_t)), *ln = tarena_alloc(r->a, cap * sizeof(size_t));
        tval *l = tv_list(r->a, 0);
        if (st == NULL || ln == NULL || l == NULL)
            return oom(r, n);
        size_t cnt;
        tb_splitlines(s->u.s.p, s->u.s.n, st, ln, &cnt, cap);
        for (size_t i = 0; i < cnt; i++) {
            tval *w = tv_str_nocopy(r->a, s->u.s.p + st[i], ln[i]);
            if (w == NULL || tv_list_push(r->a, l, w))
                return oom(r, n);
        }
        *out = l;
        return 0;
    }
    if (mn > 2 && m[0] == 'i' && m[1] == 's') {
        bool all = s->u.s.n > 0, lo = false, up = false;
        for (size_t i = 0; i < s->u.s.n; i++) {
            unsigned char c = (unsigned char)s->u.s.p[i];
            bool d = c >= '0' && c <= '9', a = (c | 32) >= 'a' && (c | 32) <= 'z';
            lo |= c >= 'a' && c <= 'z';
            up |= c >= 'A' && c <= 'Z';
            if (eqs(m, mn, "isdigit")) all &= d;
            else if (eqs(m, mn, "isalpha")) all &= a;
            else if (eqs(m, mn, "isalnum")) all &= a || d;
            else if (eqs(m, mn, "isspace")) all &= c == ' ' || (c >= 9 && c <= 13);
        }
        if (eqs(m, mn, "islower"))
            all = lo && !up;
        else if (eqs(m, mn, "isupper"))
            all = up && !lo;
        *out = tv_bool(all);
        return 0;
    }
    return terr(r, n, -EINVAL, "str.%s is not supported", m);
}

/* ---- printf-style formatting: str % value ----
 * Python's %-operator for what templates use: %s %r %d %i %f %F %x %X %o %e %g %c? no: %s %r
 * %d %i %f %x %%, with flags '-', '0', ' ', '+', a width and a precision. Arguments: a tuple,
 * or any other value as the single argument. %(name)s mappings are refused. */
int tb_format(struct trender *r, const struct tnode *n, tval *fmt, tval *arg, tval **out)
{
    tval **av = &arg;
    size_t ac = 1, ai = 0;
    if (arg->type == TV_LIST && arg->tuple) {
        av = arg->u.l.v;
        ac = arg->u.l.n;
    }
    struct tbuf b = {.a = r->a};
    const char *p = fmt->u.s.p, *e = p + fmt->u.s.n;
    while (p < e) {
        const char *pc = memchr(p, '%', (size_t)(e - p));
        if (pc == NULL) {
            tbuf_put(&b, p, (size_t)(e - p));
            break;
        }
        tbuf_put(&b, p, (size_t)(pc - p));
        p = pc + 1;
        char flags[8];
        size_t nf = 0;
        while (p < e && *p != '\0' && strchr("-0 +#", *p) && nf < sizeof flags - 1)
            flags[nf++] = *p++;
        flags[nf] = 0;
        int width = -1, prec = -1;
        if (p < e && *p == '(')
            return terr(r, n, -EINVAL, "%%(name) formatting is not supported");
        if (p < e && *p == '*')
            return terr(r, n, -EINVAL, "* widths are not supported");
        if (p < e && *p >= '0' && *p <= '9') {
            width = 0;
            while (p < e && *p >= '0' && *p <= '9' && width < 1000)
                width = width * 10 + (*p++ - '0');
        }
        if (p < e && *p == '.') {
            p++;
            prec = 0;
            while (p < e && *p >= '0' && *p <= '9' && prec < 1000)
                prec = prec * 10 + (*p++ - '0');
        }
        if (p >= e)
            return terr(r, n, -EINVAL, "incomplete format");
        char conv = *p++;
        if (conv == '%') {
            tbuf_putc(&b, '%');
            continue;
        }
        if (ai >= ac)
            return terr(r, n, -EINVAL, "not enough arguments for format string");
        tval *v = av[ai++];
        struct tbuf piece = {.a = r->a};
        char t[512], spec[32];
        switch (conv) {
        case 's':
        case 'r': {
            int rc = conv == 's' ? tv_to_str(&piece, v) : tv_repr(&piece, v);
            if (rc)
                return terr(r, n, -EINVAL, "cannot format a %s", tv_typename(v));
            if (fmt->markup && !(conv == 's' && v->type == TV_STR && v->markup) && piece.n) {
                struct tbuf esc = {.a = r->a}; /* Markup % x escapes x */
                tv_html_escape(&esc, piece.p, piece.n);
                if (esc.err)
                    return oom(r, n);
                piece = esc;
            }
            size_t len = piece.n;
            if (prec >= 0) { /* precision counts characters */
                size_t k = 0, chars = 0;
                while (k < piece.n && chars < (size_t)prec) {
                    k = tu8_next(piece.p, piece.n, k);
                    chars++;
                }
                len = k;
            }
            size_t chars = tu8_len(piece.p ? piece.p : "", len);
            bool left = strchr(flags, '-') != NULL;
            if (!left)
                for (int k = (int)chars; k < width; k++)
                    tbuf_putc(&b, ' ');
            tbuf_put(&b, piece.p ? piece.p : "", len);
            if (left)
                for (int k = (int)chars; k < width; k++)
                    tbuf_putc(&b, ' ');
            continue;
        }
        case 'd': case 'i': case 'x': case 'X': case 'o': {
            int64_t iv;
            if (v->type == TV_INT || v->type == TV_BOOL)
                iv = v->type == TV_INT ? v->u.i : v->u.b;
            else if (v->type == TV_FLOAT && (conv == 'd' || conv == 'i') && fabs(v->u.d) < 9.2e18)
                iv = (int64_t)v->u.d;
            else
                return terr(r, n, -EINVAL, "%%%c format: a number is required, not %s", conv,
                            tv_typename(v));
            if (conv != 'd' && conv != 'i' && strchr(flags, '#'))
                return terr(r, n, -EINVAL, "the '#' flag is not supported");
            snprintf(spec, sizeof spec, "%%%s%s%s%s%s%s",
                     strchr(flags, '-') ? "-" : "", strchr(flags, '0') ? "0" : "",
                     strchr(flags, '+') ? "+" : "", strchr(flags, ' ') ? " " : "",
                     width >= 0 ? "*" : "", prec >= 0 ? ".*" : "");
            size_t sl = strlen(spec);
            const char *lc = conv == 'x' ? "llx" : conv == 'X' ? "llX" : conv == 'o' ? "llo" : "lld";
            memcpy(spec + sl, lc, 4);
            long long val = iv;
            if ((conv == 'x' || conv == 'X' || conv == 'o') && iv < 0) {
                /* Python prints -0x..: sign, then the magnitude */
                tbuf_putc(&b, '-');
                val = iv == INT64_MIN ? INT64_MAX : -iv;
            }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
            int k;
            if (width >= 0 && prec >= 0)
                k = snprintf(t, sizeof t, spec, width, prec, val);
            else if (width >= 0)
                k = snprintf(t, sizeof t, spec, width, val);
            else if (prec >= 0)
                k = snprintf(t, sizeof t, spec, prec, val);
            else
                k = snprintf(t, sizeof t, spec, val);
#pragma GCC diagnostic pop
            if (k < 0 || (size_t)k >= sizeof t)
                return terr(r, n, -EINVAL, "format width too large");
            tbuf_put(&b, t, (size_t)k);
            continue;
        }
        case 'f': case 'F': {
            if (!tv_is_num(v))
                return terr(r, n, -EINVAL, "%%f format: a real number is required, not %s",
                            tv_typename(v));
            if (prec > 100 || width > 400)
                return terr(r, n, -EINVAL, "format precision too large");
            snprintf(spec, sizeof spec, "%%%s%s%s%s*.*f", strchr(flags, '-') ? "-" : "",
                     strchr(flags, '0') ? "0" : "", strchr(flags, '+') ? "+" : "",
                     strchr(flags, ' ') ? " " : "");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
            int k = snprintf(t, sizeof t, spec, width < 0 ? 0 : width, prec < 0 ? 6 : prec,
                             tv_num(v));
#pragma GCC diagnostic pop
            if (k < 0 || (size_t)k >= sizeof t)
                return terr(r, n, -EINVAL, "format width too large");
            tbuf_put(&b, t, (size_t)k);
            continue;
        }
        default:
            return terr(r, n, -EINVAL, "unsupported format character '%c' (0x%x)",
                        conv >= 0x20 && conv < 0x7f ? conv : '?', (unsigned char)conv);
        }
    }
    /* Python skips this check when the argument could be a mapping (it has __getitem__ and is
     * not a tuple or str): lists, dicts, and Jinja2's Undefined */
    bool mapping = arg->type == TV_DICT || arg->type == TV_UNDEF || arg->type == TV_NS ||
                   (arg->type == TV_LIST && !arg->tuple);
    if (ai < ac && !mapping)
        return terr(r, n, -EINVAL, "not all arguments converted during string formatting");
    *out = mkstr(r, &b);
    if (*out)
        (*out)->markup = fmt->markup;
    return *out ? 0 : oom(r, n);
}
