/* tmpl_builtin.c — what templates call: Jinja2's filters and tests, the str/dict/list methods
 * chat templates use, and the globals (range, namespace, dict, raise_exception, strftime_now).
 * Each follows the Python it stands for (jinja2/filters.py, jinja2/tests.py, str methods) as
 * far as chat templates can tell; the sandbox's refusals (list.append, dict.update...) are
 * kept: they return an Undefined that fails when called, as ImmutableSandboxedEnvironment does.
 * The string side (str methods, case mapping, `%` formatting, Markup) is in tmpl_str.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tmpl_int.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int in_list(const char *name, size_t nn, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (eqs(name, nn, list[i]))
            return i + 1;
    return 0;
}

static const char *const filters[] = {
    "trim", "tojson", "length", "count", "default", "d", "join", "first", "last", "list",
    "map", "select", "reject", "selectattr", "rejectattr", "string", "int", "float", "lower",
    "upper", "replace", "indent", "safe", "unique", "items", "dictsort", "capitalize", "title",
    "abs", "reverse", "sort", "min", "max", "sum", "round", "format", NULL};
static const char *const tests[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
    "iterable", "sequence", "boolean", "true", "false", "even", "odd", "divisibleby", "eq",
    "equalto", "ne", "lt", "lessthan", "gt", "greaterthan", "le", "ge", "in", "sameas",
    "callable", "lower", "upper", NULL};

int tb_known_filter(const char *name, size_t nn) { return in_list(name, nn, filters); }
int tb_known_test(const char *name, size_t nn) { return in_list(name, nn, tests); }

int tb_global(const char *name, size_t nn)
{
    static const char *const g[] = {"range", "namespace", "dict", "raise_exception",
                                    "strftime_now", NULL};
    return in_list(name, nn, g);
}

static int to_str_val(struct trender *r, const struct tnode *n, tval *x, tval **out)
{
    if (x->type == TV_STR) {
        *out = x;
        return 0;
    }
    struct tbuf b = {.a = r->a};
    if (tv_to_str(&b, x))
        return terr(r, n, -EINVAL, "cannot convert a %s to a string", tv_typename(x));
    *out = mkstr(r, &b);
    return *out ? 0 : oom(r, n);
}

static bool kwarg(const char **kn, size_t *knl, tval **kv, size_t nkw, const char *name,
                  tval **out)
{
    for (size_t i = 0; i < nkw; i++)
        if (eqs(kn[i], knl[i], name)) {
            *out = kv[i];
            return true;
        }
    return false;
}

/* the argument at position i or named name; NULL if absent */
static tval *arg(tval **args, size_t nargs, size_t i, const char **kn, size_t *knl, tval **kv,
                 size_t nkw, const char *name)
{
    tval *v;
    if (i < nargs)
        return args[i];
    if (name && kwarg(kn, knl, kv, nkw, name, &v))
        return v;
    return NULL;
}

int tb_to_items(struct trender *r, const struct tnode *n, tval *x, tval **out)
{
    /* same as a for loop's view of x */
    switch (x->type) {
    case TV_LIST: *out = x; return 0;
    case TV_UNDEF: *out = tv_list(r->a, 0); return *out ? 0 : oom(r, n);
    case TV_DICT: case TV_NS: case TV_STR: {
        tval *l = tv_list(r->a, 0);
        if (l == NULL)
            return oom(r, n);
        if (x->type == TV_STR) {
            for (size_t i = 0; i < x->u.s.n;) {
                size_t e = tu8_next(x->u.s.p, x->u.s.n, i);
                tval *c = tv_str_nocopy(r->a, x->u.s.p + i, e - i);
                if (c == NULL || tv_list_push(r->a, l, c))
                    return oom(r, n);
                i = e;
            }
        } else {
            for (size_t i = 0; i < x->u.o.n; i++) {
                tval *k = tv_str_nocopy(r->a, x->u.o.e[i].k, x->u.o.e[i].kn);
                if (k == NULL || tv_list_push(r->a, l, k))
                    return oom(r, n);
            }
        }
        *out = l;
        return 0;
    }
    default:
        return terr(r, n, -EINVAL, "'%s' object is not iterable", tv_typename(x));
    }
}

/* attribute path "a.b.0" as Jinja's make_attrgetter */
static int attr_path(struct trender *r, const struct tnode *n, tval *x, tval *attr, tval **out)
{
    if (x->type == TV_UNDEF) /* environment.getitem(Undefined, ...) raises */
        return terr(r, n, -EINVAL, "'%.*s' is undefined", (int)x->u.s.n, x->u.s.p ? x->u.s.p : "");
    if (attr->type == TV_INT) {
        if (x->type == TV_LIST) {
            int64_t i = attr->u.i < 0 ? attr->u.i + (int64_t)x->u.l.n : attr->u.i;
            *out = i >= 0 && (uint64_t)i < x->u.l.n ? x->u.l.v[i] : &tv_undef_const;
        } else {
            *out = &tv_undef_const;
        }
        return 0;
    }
    if (attr->type != TV_STR) {
        *out = &tv_undef_const; /* Jinja2 looks it up as an item: no string key matches */
        return 0;
    }
    const char *p = attr->u.s.p, *e = p + attr->u.s.n;
    tval *cur = x;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        size_t len = dot ? (size_t)(dot - p) : (size_t)(e - p);
        bool isnum = len > 0;
        for (size_t k = 0; k < len; k++)
            isnum &= p[k] >= '0' && p[k] <= '9';
        if (cur->type == TV_UNDEF)
            return terr(r, n, -EINVAL, "'%.*s' is undefined", (int)cur->u.s.n,
                        cur->u.s.p ? cur->u.s.p : "");
        if (isnum && cur->type == TV_LIST) {
            size_t i = (size_t)strtoull(p, NULL, 10);
            cur = i < cur->u.l.n ? cur->u.l.v[i] : &tv_undef_const;
        } else if (cur->type == TV_DICT || cur->type == TV_NS) {
            tval *v = tv_dict_get(cur, p, len);
            cur = v ? v : tb_getattr(r, cur, p, len);
        } else {
            cur = tb_getattr(r, cur, p, len);
        }
        if (cur == NULL)
            return oom(r, n);
        if (!dot)
            break;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

static int key_lower(struct trender *r, tval *v, bool cs, tval **out)
{
    if (!cs && v->type == TV_STR) {
        *out = tb_case_map(r, v, 0);
        return *out ? 0 : -ENOMEM;
    }
    *out = v;
    return 0;
}

/* stable insertion sort (lists in templates are small) by key values */
static int sort_vals(struct trender *r, const struct tnode *n, tval **items, tval **keys,
                     size_t cnt, bool reverse)
{
    for (size_t i = 1; i < cnt; i++) {
        tval *it = items[i], *k = keys[i];
        size_t j = i;
        while (j > 0) {
            int c;
            if (tv_cmp(keys[j - 1], k, &c))
                return terr(r, n, -EINVAL, "'<' not supported between instances of '%s' and '%s'",
                            tv_typename(keys[j - 1]), tv_typename(k));
            if (reverse ? c >= 0 : c <= 0)
                break;
            items[j] = items[j - 1];
            keys[j] = keys[j - 1];
            j--;
        }
        items[j] = it;
        keys[j] = k;
    }
    return 0;
}

static int do_indent(struct trender *r, const struct tnode *n, tval *s, tval *width, bool first,
                     bool blank, tval **out)
{
    struct tbuf ind = {.a = r->a}, b = {.a = r->a};
    if (width == NULL)
        tbuf_put(&ind, "    ", 4);
    else if (width->type == TV_STR)
        tbuf_put(&ind, width->u.s.p, width->u.s.n);
    else if (width->type == TV_INT && width->u.i >= 0 && width->u.i < 4096)
        for (int64_t i = 0; i < width->u.i; i++)
            tbuf_putc(&ind, ' ');
    else
        return terr(r, n, -EINVAL, "indent width must be an int or a string");
    /* s += "\n"; lines = s.tb_splitlines() */
    struct tbuf sb = {.a = r->a};
    tbuf_put(&sb, s->u.s.p, s->u.s.n);
    tbuf_putc(&sb, '\n');
    if (sb.err || ind.err)
        return oom(r, n);
    size_t cap = sb.n + 1;
    size_t *st = tarena_alloc(r->a, cap * sizeof(size_t)), *ln = tarena_alloc(r->a, cap * sizeof(size_t));
    if (st == NULL || ln == NULL)
        return oom(r, n);
    size_t cnt;
    tb_splitlines(sb.p, sb.n, st, ln, &cnt, cap);
    if (first)
        tbuf_put(&b, ind.p, ind.n);
    for (size_t i = 0; i < cnt; i++) {
        if (i > 0) {
            tbuf_putc(&b, '\n');
            if (blank || ln[i])
                tbuf_put(&b, ind.p, ind.n);
        }
        tbuf_put(&b, sb.p + st[i], ln[i]);
    }
    *out = mkstr(r, &b);
    if (*out)
        (*out)->markup = s->markup;
    return *out ? 0 : oom(r, n);
}

/* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
 * note the positional order (ensure_ascii first), unlike Jinja2's own tojson(indent) */
static int json_filter(struct trender *r, const struct tnode *n, tval *x, tval *ascii,
                       tval *indent, tval *seps, tval *sortk, tval **out)
{
    struct tjson_opt o = {.indent = -1, .item_sep = ", ", .item_sep_n = 2, .key_sep = ": ",
                          .key_sep_n = 2};
    if (indent && indent->type != TV_NONE) {
        if (indent->type != TV_INT || indent->u.i < 0 || indent->u.i > 64)
            return terr(r, n, -EINVAL, "tojson indent must be an int (0..64)");
        o.indent = (int)indent->u.i;
        o.item_sep = ",";
        o.item_sep_n = 1;
    }
    if (seps && seps->type != TV_NONE) {
        if (seps->type != TV_LIST || seps->u.l.n != 2 || seps->u.l.v[0]->type != TV_STR ||
            seps->u.l.v[1]->type != TV_STR)
            return terr(r, n, -EINVAL, "tojson separators must be a pair of strings");
        /* values are immutable while the render runs: no copy (and NULs in them kept) */
        o.item_sep = seps->u.l.v[0]->u.s.p;
        o.item_sep_n = seps->u.l.v[0]->u.s.n;
        o.key_sep = seps->u.l.v[1]->u.s.p;
        o.key_sep_n = seps->u.l.v[1]->u.s.n;
    }
    o.sort_keys = sortk && tv_truthy(sortk);
    o.ascii = ascii && tv_truthy(ascii);
    struct tbuf b = {.a = r->a};
    int rc = tv_json(&b, x, &o, 0, 0);
    if (rc == -ENOMEM)
        return oom(r, n);
    if (rc)
        return terr(r, n, -EINVAL, "Object of type %s is not JSON serializable", tv_typename(x));
    *out = mkstr(r, &b);
    return *out ? 0 : oom(r, n);
}

static int apply_test(struct trender *r, const struct tnode *n, tval *name, tval *x,
                      tval **args, size_t nargs, bool *res)
{
    if (name == NULL) {
        *res = tv_truthy(x);
        return 0;
    }
    TRY(need_str(r, n, name, "test name"));
    if (!tb_known_test(name->u.s.p, name->u.s.n))
        return terr(r, n, -EINVAL, "no test named '%.*s'", (int)name->u.s.n, name->u.s.p);
    return tb_test(r, n, name->u.s.p, name->u.s.n, x, args, nargs, res);
}

int tb_filter(struct trender *r, const struct tnode *n, const char *name, size_t nn, tval *x,
              tval **args, size_t nargs, const char **kn, size_t *knl, tval **kv, size_t nkw,
              tval **out)
{
#define ARG(i, nm) arg(args, nargs, (i), kn, knl, kv, nkw, (nm))
    if (eqs(name, nn, "default") || eqs(name, nn, "d")) {
        tval *dv = ARG(0, "default_value"), *boolean = ARG(1, "boolean");
        bool use = x->type == TV_UNDEF || (boolean && tv_truthy(boolean) && !tv_truthy(x));
        if (use) {
            if (dv == NULL) {
                *out = tv_str_nocopy(r->a, "", 0);
                return *out ? 0 : oom(r, n);
            }
            *out = dv;
        } else {
            *out = x;
        }
        return 0;
    }
    if (x->type == TV_UNDEF && x->undef_err)
        return terr(r, n, -EINVAL, "%s", x->undef_err);
    if (eqs(name, nn, "safe")) {
        tval *sv;
        TRY(to_str_val(r, n, x, &sv));
        *out = tb_markup(r, sv);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(name, nn, "string"))
        return to_str_val(r, n, x, out);
    if (eqs(name, nn, "format")) { /* soft_str(value) % (kwargs or args) */
        tval *fs;
        if (nkw)
            return terr(r, n, -EINVAL, "format: keyword arguments are not supported");
        TRY(to_str_val(r, n, x, &fs));
        tval *t = tv_list(r->a, nargs);
        if (t == NULL)
            return oom(r, n);
        t->tuple = 1;
        for (size_t i = 0; i < nargs; i++)
            t->u.l.v[t->u.l.n++] = args[i];
        return tb_format(r, n, fs, t, out);
    }
    if (eqs(name, nn, "trim")) {
        tval *s, *chars = ARG(0, "chars");
        TRY(to_str_val(r, n, x, &s));
        if (chars && chars->type != TV_NONE)
            TRY(need_str(r, n, chars, "trim chars"));
        size_t off, len;
        bool c = chars && chars->type == TV_STR;
        tu_strip(s->u.s.p, s->u.s.n, c ? chars->u.s.p : NULL, c ? chars->u.s.n : 0, 3, &off, &len);
        *out = tv_str_nocopy(r->a, s->u.s.p + off, len);
        if (*out)
            (*out)->markup = s->markup;
        return *out ? 0 : oom(r, n);
    }
    if (eqs(name, nn, "tojson")) {
        if (nargs > 4)
            return terr(r, n, -EINVAL, "tojson takes at most 4 arguments");
        for (size_t i = 0; i < nkw; i++)
            if (!eqs(kn[i], knl[i], "indent") && !eqs(kn[i], knl[i], "sort_keys") &&
                !eqs(kn[i], knl[i], "ensure_ascii") && !eqs(kn[i], knl[i], "separators"))
                return terr(r, n, -EINVAL, "tojson: unexpected argument '%.*s'", (int)knl[i], kn[i]);
        return json_filter(r, n, x, ARG(0, "ensure_ascii"), ARG(1, "indent"), ARG(2, "separators"),
                           ARG(3, "sort_keys"), out);
    }
    if (eqs(name, nn, "length") || eqs(name, nn, "count")) {
        int64_t len;
        switch (x->type) {
        case TV_STR: len = (int64_t)tu8_len(x->u.s.p, x->u.s.n); break;
        case TV_LIST: len = (int64_t)x->u.l.n; break;
        case TV_DICT: case TV_NS: len = (int64_t)x->u.o.n; break;
        case TV_UNDEF: len = 0; break;
        default: return terr(r, n, -EINVAL, "object of type '%s' has no len()", tv_typename(x));
        }
        *out = tv_int(r->a, len);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(name, nn, "lower") || eqs(name, nn, "upper") || eqs(name, nn, "title") ||
        eqs(name, nn, "capitalize")) {
        tval *s;
        TRY(to_str_val(r, n, x, &s));
        *out = eqs(name, nn, "title") ? tb_title_filter(r, s)
               : tb_case_map(r, s, eqs(name, nn, "lower") ? 0 : eqs(name, nn, "upper") ? 1 : 3);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(name, nn, "replace")) {
        tval *s, *old = ARG(0, "old"), *nw = ARG(1, "new"), *cnt = ARG(2, "count");
        TRY(to_str_val(r, n, x, &s));
        TRY(need_str(r, n, old, "replace: old"));
        TRY(need_str(r, n, nw, "replace: new"));
        tval *margs[3] = {old, nw, cnt};
        tval m = {.type = TV_METHOD, .u.meth = {.self = s, .name = "replace"}};
        return tb_call(r, n, &m, margs, cnt && cnt->type != TV_NONE ? 3 : 2, NULL, NULL, NULL, 0,
                       out);
    }
    if (eqs(name, nn, "indent")) {
        if (x->type == TV_UNDEF) /* s += "\n" fails on Undefined */
            return terr(r, n, -EINVAL, "'%.*s' is undefined", (int)x->u.s.n,
                        x->u.s.p ? x->u.s.p : "");
        tval *w = ARG(0, "width"), *first = ARG(1, "first"), *blank = ARG(2, "blank");
        if (x->type != TV_STR) /* Jinja2 does s += "\n" without str(): only strings indent */
            return terr(r, n, -EINVAL, "indent: a string is required, not %s", tv_typename(x));
        return do_indent(r, n, x, w, first && tv_truthy(first), blank && tv_truthy(blank), out);
    }
    if (eqs(name, nn, "int") || eqs(name, nn, "float")) {
        bool isint = eqs(name, nn, "int");
        tval *dv = ARG(0, "default");
        if (x->type == TV_UNDEF) /* int(Undefined) raises in Jinja2 */
            return terr(r, n, -EINVAL, "'%.*s' is undefined", (int)x->u.s.n,
                        x->u.s.p ? x->u.s.p : "");
        if (x->type == TV_INT || x->type == TV_BOOL || x->type == TV_FLOAT) {
            if (isint && x->type == TV_FLOAT && !(fabs(x->u.d) < 9.2e18)) {
                if (isnan(x->u.d) || isinf(x->u.d))
                    goto use_default; /* Python: ValueError/OverflowError -> the default */
                return terr(r, n, -EINVAL, "integer overflow (integers are 64-bit here)");
            }
            if (isint)
                *out = tv_int(r->a, x->type == TV_FLOAT ? (int64_t)x->u.d
                                                        : x->type == TV_INT ? x->u.i : x->u.b);
            else
                *out = tv_float(r->a, tv_num(x));
            return *out ? 0 : oom(r, n);
        }
        if (x->type == TV_STR) {
            char tmp[64];
            size_t off, len;
            tu_strip(x->u.s.p, x->u.s.n, NULL, 0, 3, &off, &len);
            if (len > 0 && len < sizeof(tmp)) {
                /* Python's int()/float() take single underscores between digits */
                const char *q = x->u.s.p + off;
                size_t tl = 0;
                bool ok = true;
                for (size_t k = 0; k < len; k++) {
                    if (q[k] == '\0') { /* Python: not a number; strtod would stop there */
                        ok = false;
                        break;
                    }
                    if (q[k] == '_') {
                        ok &= k > 0 && k + 1 < len && q[k - 1] >= '0' && q[k - 1] <= '9' &&
                              q[k + 1] >= '0' && q[k + 1] <= '9';
                        continue;
                    }
                    tmp[tl++] = q[k];
                }
                tmp[ok ? tl : 0] = 0;
                char *end;
                errno = 0;
                if (isint) {
                    long long v = strtoll(tmp, &end, 10);
                    if (*end == 0 && errno == 0 && end != tmp) {
                        *out = tv_int(r->a, v);
                        return *out ? 0 : oom(r, n);
                    }
                }
                double d = strtod(tmp, &end);
                if (*end == 0 && end != tmp && !isnan(d) && !isinf(d) && strchr(tmp, 'x') == NULL &&
                    strchr(tmp, 'X') == NULL) {
                    if (isint && !(fabs(d) < 9.2e18))
                        return terr(r, n, -EINVAL, "integer overflow (integers are 64-bit here)");
                    *out = isint ? tv_int(r->a, (int64_t)d) : tv_float(r->a, d);
                    return *out ? 0 : oom(r, n);
                }
            }
        }
    use_default:
        if (dv) {
            *out = dv;
            return 0;
        }
        *out = isint ? tv_int(r->a, 0) : tv_float(r->a, 0.0);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(name, nn, "abs")) {
        if (x->type == TV_INT && x->u.i != INT64_MIN)
            *out = tv_int(r->a, x->u.i < 0 ? -x->u.i : x->u.i);
        else if (x->type == TV_FLOAT)
            *out = tv_float(r->a, fabs(x->u.d));
        else if (x->type == TV_BOOL)
            *out = tv_int(r->a, x->u.b);
        else
            return terr(r, n, -EINVAL, "bad operand type for abs(): '%s'", tv_typename(x));
        return *out ? 0 : oom(r, n);
    }
    if (eqs(name, nn, "round")) {
        tval *prec = ARG(0, "precision"), *method = ARG(1, "method");
        if (!tv_is_num(x))
            return terr(r, n, -EINVAL, "round: not a number");
        if ((prec && prec->type != TV_INT) || (method && method->type != TV_STR))
            return terr(r, n, -EINVAL, "round: bad arguments");
        if (method && !eqs(method->u.s.p, method->u.s.n, "common"))
            return terr(r, n, -EINVAL, "round: only method 'common' is supported");
        int64_t p = prec ? prec->u.i : 0;
        if (p != 0)
            return terr(r, n, -EINVAL, "round: only precision 0 is supported");
        double d = tv_num(x);
        *out = tv_float(r->a, d < 0 ? -floor(-d + 0.5) : floor(d + 0.5));
        return *out ? 0 : oom(r, n);
    }
    /* filters over sequences */
    tval *items;
    if (eqs(name, nn, "items")) {
        if (x->type == TV_UNDEF) {
            *out = tv_list(r->a, 0);
            return *out ? 0 : oom(r, n);
        }
        if (x->type != TV_DICT && x->type != TV_NS)
            return terr(r, n, -EINVAL, "can only get item pairs from a mapping");
        tval m = {.type = TV_METHOD, .u.meth = {.self = x, .name = "items"}};
        return tb_call(r, n, &m, NULL, 0, NULL, NULL, NULL, 0, out);
    }
    if (eqs(name, nn, "dictsort")) {
        tval *cs = ARG(0, "case_sensitive"), *by = ARG(1, "by"), *rev = ARG(2, "reverse");
        if (x->type != TV_DICT && x->type != TV_NS)
            return terr(r, n, -EINVAL, "dictsort: not a mapping");
        bool byval = by && by->type == TV_STR && eqs(by->u.s.p, by->u.s.n, "value");
        if (by && !byval && !(by->type == TV_STR && eqs(by->u.s.p, by->u.s.n, "key")))
            return terr(r, n, -EINVAL, "You can only sort by either \"key\" or \"value\"");
        tval m = {.type = TV_METHOD, .u.meth = {.self = x, .name = "items"}};
        TRY(tb_call(r, n, &m, NULL, 0, NULL, NULL, NULL, 0, &items));
        tval **keys = tarena_alloc(r->a, (items->u.l.n + 1) * sizeof(tval *));
        if (keys == NULL)
            return oom(r, n);
        for (size_t i = 0; i < items->u.l.n; i++)
            if (key_lower(r, items->u.l.v[i]->u.l.v[byval ? 1 : 0], cs && tv_truthy(cs), &keys[i]))
                return oom(r, n);
        TRY(sort_vals(r, n, items->u.l.v, keys, items->u.l.n, rev && tv_truthy(rev)));
        *out = items;
        return 0;
    }
    if (!tv_truthy(x) && (eqs(name, nn, "map") || eqs(name, nn, "select") ||
                          eqs(name, nn, "reject") || eqs(name, nn, "selectattr") ||
                          eqs(name, nn, "rejectattr"))) {
        *out = tv_list(r->a, 0); /* these start with `if value:` in Jinja2: none/''/0 -> empty */
        return *out ? 0 : oom(r, n);
    }
    TRY(tb_to_items(r, n, x, &items));
    if (eqs(name, nn, "list")) {
        tval *l = tv_list(r->a, items->u.l.n);
        if (l == NULL)
            return oom(r, n);
        for (size_t i = 0; i < items->u.l.n; i++)
            l->u.l.v[l->u.l.n++] = items->u.l.v[i];
        *out = l;
        return 0;
    }
    if (eqs(name, nn, "first") || eqs(name, nn, "last")) {
        if (items->u.l.n == 0)
            *out = &tv_undef_const;
        else
            *out = items->u.l.v[eqs(name, nn, "first") ? 0 : items->u.l.n - 1];
        return 0;
    }
    if (eqs(name, nn, "reverse")) {
        if (x->type == TV_STR) {
            struct tbuf b = {.a = r->a};
            for (size_t i = items->u.l.n; i-- > 0;)
                tbuf_put(&b, items->u.l.v[i]->u.s.p, items->u.l.v[i]->u.s.n);
            *out = mkstr(r, &b);
            return *out ? 0 : oom(r, n);
        }
        tval *l = tv_list(r->a, items->u.l.n);
        if (l == NULL)
            return oom(r, n);
        for (size_t i = items->u.l.n; i-- > 0;)
            l->u.l.v[l->u.l.n++] = items->u.l.v[i];
        *out = l;
        return 0;
    }
    if (eqs(name, nn, "join")) {
        tval *sep = ARG(0, "d"), *attr = ARG(1, "attribute");
        if (sep && sep->type != TV_STR)
            TRY(to_str_val(r, n, sep, &sep));
        struct tbuf b = {.a = r->a};
        for (size_t i = 0; i < items->u.l.n; i++) {
            tval *it = items->u.l.v[i];
            if (attr)
                TRY(attr_path(r, n, it, attr, &it));
            if (i && sep)
                tbuf_put(&b, sep->u.s.p, sep->u.s.n);
            if (tv_to_str(&b, it))
                return terr(r, n, -EINVAL, "join: cannot convert a %s to a string", tv_typename(it));
        }
        *out = mkstr(r, &b);
        return *out ? 0 : oom(r, n);
    }
    if (eqs(name, nn, "map")) {
        tval *attr = NULL, *dflt = NULL;
        kwarg(kn, knl, kv, nkw, "attribute", &attr);
        kwarg(kn, knl, kv, nkw, "default", &dflt);
        tval *l = tv_list(r->a, items->u.l.n);
        if (l == NULL)
            return oom(r, n);
        for (size_t i = 0; i < items->u.l.n; i++) {
            TRY(tr_count_iter(r, n));
            tval *it = items->u.l.v[i], *res;
            if (attr) {
                TRY(attr_path(r, n, it, attr, &res));
                if (res->type == TV_UNDEF && dflt)
                    res = dflt;
            } else {
                if (nargs == 0 || args[0]->type != TV_STR)
                    return terr(r, n, -EINVAL, "map: expected a filter name or attribute=");
                if (!tb_known_filter(args[0]->u.s.p, args[0]->u.s.n) ||
                    eqs(args[0]->u.s.p, args[0]->u.s.n, "map"))
                    return terr(r, n, -EINVAL, "map: unsupported filter '%.*s'",
                                (int)args[0]->u.s.n, args[0]->u.s.p);
                TRY(tb_filter(r, n, args[0]->u.s.p, args[0]->u.s.n, it, args + 1, nargs - 1,
                              kn, knl, kv, nkw, &res));
            }
            l->u.l.v[l->u.l.n++] = res;
        }
        *out = l;
        return 0;
    }
    if (eqs(name, nn, "select") || eqs(name, nn, "reject") || eqs(name, nn, "selectattr") ||
        eqs(name, nn, "rejectattr")) {
        bool attrmode = name[nn - 4] == 'a', keep_true = name[0] == 's';
        size_t ai = 0;
        tval *attr = NULL;
        if (attrmode) {
            if (nargs < 1)
                return terr(r, n, -EINVAL, "%.*s: missing attribute", (int)nn, name);
            attr = args[ai++];
        }
        tval *test = ai < nargs ? args[ai++] : NULL;
        tval *l = tv_list(r->a, 0);
        if (l == NULL)
            return oom(r, n);
        for (size_t i = 0; i < items->u.l.n; i++) {
            TRY(tr_count_iter(r, n));
            tval *it = items->u.l.v[i], *v = it;
            if (attr)
                TRY(attr_path(r, n, it, attr, &v));
            bool res;
            TRY(apply_test(r, n, test, v, args + ai, nargs - ai, &res));
            if (res == keep_true && tv_list_push(r->a, l, it))
                return oom(r, n);
        }
        *out = l;
        return 0;
    }
    if (eqs(name, nn, "unique") || eqs(name, nn, "sort") || eqs(name, nn, "min") ||
        eqs(name, nn, "max") || eqs(name, nn, "sum")) {
        tval *cs = NULL, *attr = NULL, *rev = NULL, *start = NULL;
        kwarg(kn, knl, kv, nkw, "case_sensitive", &cs);
        kwarg(kn, knl, kv, nkw, "attribute", &attr);
        kwarg(kn, knl, kv, nkw, "reverse", &rev);
        kwarg(kn, knl, kv, nkw, "start", &start);
        if (eqs(name, nn, "sort")) {
            if (nargs > 0)
                rev = args[0];
            if (nargs > 1)
                cs = args[1];
            if (nargs > 2)
                attr = args[2];
        } else if (eqs(name, nn, "sum")) {
            if (nargs > 0)
                attr = args[0];
            if (nargs > 1)
                start = args[1];
        } else if (nargs > 0) {
            cs = args[0];
            if (nargs > 1)
                attr = args[1];
        }
        size_t cnt = items->u.l.n;
        tval **its = tarena_alloc(r->a, (cnt + 1) * sizeof(tval *));
        tval **keys = tarena_alloc(r->a, (cnt + 1) * sizeof(tval *));
        if (its == NULL || keys == NULL)
            return oom(r, n);
        for (size_t i = 0; i < cnt; i++) {
            its[i] = items->u.l.v[i];
            tval *k = its[i];
            if (attr)
                TRY(attr_path(r, n, k, attr, &k));
            if (eqs(name, nn, "sum"))
                keys[i] = k;
            else if (key_lower(r, k, cs && tv_truthy(cs), &keys[i]))
                return oom(r, n);
        }
        if (eqs(name, nn, "sum")) {
            tval *acc = start ? start : tv_int(r->a, 0);
            if (acc == NULL)
                return oom(r, n);
            for (size_t i = 0; i < cnt; i++) {
                if (!tv_is_num(acc) || !tv_is_num(keys[i]))
                    return terr(r, n, -EINVAL, "sum: not a number");
                if (acc->type == TV_FLOAT || keys[i]->type == TV_FLOAT)
                    acc = tv_float(r->a, tv_num(acc) + tv_num(keys[i]));
                else {
                    int64_t z, x0 = acc->type == TV_INT ? acc->u.i : acc->u.b;
                    int64_t y0 = keys[i]->type == TV_INT ? keys[i]->u.i : keys[i]->u.b;
                    if (__builtin_add_overflow(x0, y0, &z))
                        return terr(r, n, -EINVAL, "integer overflow");
                    acc = tv_int(r->a, z);
                }
                if (acc == NULL)
                    return oom(r, n);
            }
            *out = acc;
            return 0;
        }
        if (eqs(name, nn, "unique")) {
            for (size_t i = 0; i < cnt; i++)
                if ((keys[i]->type == TV_LIST && !keys[i]->tuple) || keys[i]->type == TV_DICT)
                    return terr(r, n, -EINVAL, "unhashable type: '%s'", tv_typename(keys[i]));
            tval *l = tv_list(r->a, 0);
            if (l == NULL)
                return oom(r, n);
            for (size_t i = 0; i < cnt; i++) {
                bool seen = false;
                for (size_t j = 0; j < i && !seen; j++)
                    seen = tv_eq(keys[j], keys[i]);
                if (!seen && tv_list_push(r->a, l, its[i]))
                    return oom(r, n);
            }
            *out = l;
            return 0;
        }
        TRY(sort_vals(r, n, its, keys, cnt, eqs(name, nn, "sort") && rev && tv_truthy(rev)));
        if (eqs(name, nn, "min") || eqs(name, nn, "max")) {
            *out = cnt == 0 ? &tv_undef_const : its[eqs(name, nn, "min") ? 0 : cnt - 1];
            return 0;
        }
        tval *l = tv_list(r->a, cnt);
        if (l == NULL)
            return oom(r, n);
        for (size_t i = 0; i < cnt; i++)
            l->u.l.v[l->u.l.n++] = its[i];
        *out = l;
        return 0;
    }
    return terr(r, n, -EINVAL, "unsupported filter '%.*s'", (int)nn, name);
#undef ARG
}

int tb_test(struct trender *r, const struct tnode *n, const char *name, size_t nn, tval *x,
            tval **args, size_t nargs, bool *out)
{
    tval *a0 = nargs > 0 ? args[0] : NULL;
    int t = in_list(name, nn, tests);
    switch (t) {
    case 1: *out = x->type != TV_UNDEF; return 0;
    case 2: *out = x->type == TV_UNDEF; return 0;
    case 3: *out = x->type == TV_NONE; return 0;
    case 4: *out = x->type == TV_STR; return 0;
    case 5: *out = tv_is_num(x); return 0;
    case 6: *out = x->type == TV_INT; return 0;
    case 7: *out = x->type == TV_FLOAT; return 0;
    case 8: *out = x->type == TV_DICT; return 0;
    case 9: *out = x->type == TV_STR || x->type == TV_LIST || x->type == TV_DICT ||
                   x->type == TV_UNDEF || x->type == TV_LOOP;
        return 0;
    case 10: /* len() and __getitem__: Undefined has both (its __getitem__ fails when called) */
        *out = x->type == TV_STR || x->type == TV_LIST || x->type == TV_DICT || x->type == TV_UNDEF;
        return 0;
    case 11: *out = x->type == TV_BOOL; return 0;
    case 12: *out = x->type == TV_BOOL && x->u.b; return 0;
    case 13: *out = x->type == TV_BOOL && !x->u.b; return 0;
    case 14: case 15: case 16: { /* value % 2 == 1 / value % num == 0, as Python computes */
        if (!tv_is_num(x))
            return terr(r, n, -EINVAL, "test '%.*s' needs a number", (int)nn, name);
        tval two = {.type = TV_INT, .u.i = 2};
        tval *m = t == 16 ? a0 : &two;
        if (m == NULL || !tv_is_num(m) || tv_num(m) == 0)
            return terr(r, n, -EINVAL, "divisibleby needs a non-zero number");
        if (x->type == TV_FLOAT || m->type == TV_FLOAT) {
            double md = tv_num(m), rem = fmod(tv_num(x), md);
            if (rem != 0 && ((rem < 0) != (md < 0)))
                rem += md;
            *out = t == 15 ? rem == 1 : rem == 0;
        } else {
            int64_t v = x->type == TV_INT ? x->u.i : x->u.b;
            int64_t d = m->type == TV_INT ? m->u.i : m->u.b;
            int64_t rem = (d == -1) ? 0 : v % d;
            if (rem != 0 && ((rem < 0) != (d < 0)))
                rem += d;
            *out = t == 15 ? rem == 1 : rem == 0;
        }
        return 0;
    }
    case 17: case 18: case 19:
        if (a0 == NULL)
            return terr(r, n, -EINVAL, "test '%.*s' needs an argument", (int)nn, name);
        *out = tv_eq(x, a0) == (t != 19);
        return 0;
    case 20: case 21: case 22: case 23: case 24: case 25: {
        int c;
        if (a0 == NULL)
            return terr(r, n, -EINVAL, "test '%.*s' needs an argument", (int)nn, name);
        if (x->type == TV_UNDEF || a0->type == TV_UNDEF || tv_cmp(x, a0, &c))
            return terr(r, n, -EINVAL, "test '%.*s': values do not compare", (int)nn, name);
        *out = (t <= 21) ? c < 0 : (t <= 23) ? c > 0 : (t == 24) ? c <= 0 : c >= 0;
        return 0;
    }
    case 26: {
        if (a0 == NULL)
            return terr(r, n, -EINVAL, "test 'in' needs an argument");
        if (a0->type == TV_STR) {
            if (x->type != TV_STR)
                return terr(r, n, -EINVAL, "'in <string>' requires string as left operand");
            *out = x->u.s.n == 0 || memmem(a0->u.s.p, a0->u.s.n, x->u.s.p, x->u.s.n) != NULL;
        } else if (a0->type == TV_LIST) {
            *out = false;
            for (size_t i = 0; i < a0->u.l.n && !*out; i++)
                *out = tv_eq(x, a0->u.l.v[i]);
        } else if (a0->type == TV_DICT || a0->type == TV_NS) {
            if ((x->type == TV_LIST && !x->tuple) || x->type == TV_DICT)
                return terr(r, n, -EINVAL, "unhashable type: '%s'", tv_typename(x));
            *out = x->type == TV_STR && tv_dict_get(a0, x->u.s.p, x->u.s.n) != NULL;
        } else if (a0->type == TV_UNDEF) {
            *out = false;
        } else {
            return terr(r, n, -EINVAL, "argument of type '%s' is not iterable", tv_typename(a0));
        }
        return 0;
    }
    case 27:
        if (a0 == NULL)
            return terr(r, n, -EINVAL, "test 'sameas' needs an argument");
        /* `is` identity: singletons compare by value, containers by pointer */
        if (x->type == TV_NONE || x->type == TV_BOOL || x->type == TV_UNDEF)
            *out = x->type == a0->type && (x->type != TV_BOOL || x->u.b == a0->u.b);
        else
            *out = x == a0;
        return 0;
    case 28:
        *out = x->type == TV_MACRO || x->type == TV_METHOD || x->type == TV_FUNC ||
               x->type == TV_CYCLER;
        return 0;
    case 29: case 30: {
        if (x->type != TV_STR) {
            *out = false;
            return 0;
        }
        /* str.islower()/isupper(): at least one cased char and none of the other case */
        bool lo = false, up = false;
        for (size_t i = 0; i < x->u.s.n;) {
            size_t adv;
            uint32_t c = tu8_dec(x->u.s.p, x->u.s.n, i, &adv);
            up |= tb_cp_lower(c) != c || c == 0x130;
            lo |= tb_cp_upper(c) != c || c == 0xDF || c == 0x138 || c == 0x149;
            i += adv;
        }
        *out = t == 29 ? (lo && !up) : (up && !lo);
        return 0;
    }
    default:
        return terr(r, n, -EINVAL, "unsupported test '%.*s'", (int)nn, name);
    }
}

/* ---- attributes ---- */
static const char *const str_methods[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace",
    "upper", "lower", "title", "capitalize", "find", "rfind", "count", "join", "splitlines",
    "isdigit", "isspace", "isalpha", "isalnum", "islower", "isupper", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const dict_unsafe[] = {"pop", "popitem", "update", "setdefault", "clear",
                                          NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append", "extend", "insert", "pop", "remove",
                                          "clear", "sort", "reverse", NULL};

static tval *method(struct trender *r, tval *self, const char *const *tbl, int idx)
{
    tval *m = tv_new(r->a, TV_METHOD);
    if (m) {
        m->u.meth.self = self;
        m->u.meth.name = tbl[idx - 1];
    }
    return m;
}

static tval *unsafe(struct trender *r, const char *name, size_t nn, const char *type)
{
    tval *u = tv_new(r->a, TV_UNDEF);
    if (u == NULL)
        return NULL;
    struct tbuf b = {.a = r->a};
    tbuf_put(&b, "access to attribute '", 21);
    tbuf_put(&b, name, nn);
    tbuf_put(&b, "' of '", 6);
    tbuf_put(&b, type, strlen(type));
    tbuf_put(&b, "' object is unsafe.", 19);
    if (b.err)
        return NULL;
    u->undef_err = b.p;
    u->u.s.p = name;
    u->u.s.n = nn;
    return u;
}

tval *tb_getattr(struct trender *r, tval *obj, const char *name, size_t nn)
{
    int k;
    switch (obj->type) {
    case TV_DICT:
        if ((k = in_list(name, nn, dict_methods)))
            return method(r, obj, dict_methods, k);
        if (in_list(name, nn, dict_unsafe))
            return unsafe(r, name, nn, "dict");
        /* fallthrough */
    case TV_NS: {
        tval *v = tv_dict_get(obj, name, nn);
        return v ? v : tv_undef(r->a, name, nn);
    }
    case TV_STR:
        if ((k = in_list(name, nn, str_methods)))
            return method(r, obj, str_methods, k);
        return tv_undef(r->a, name, nn);
    case TV_LIST:
        if ((k = in_list(name, nn, list_methods)))
            return method(r, obj, list_methods, k);
        if (in_list(name, nn, list_unsafe))
            return unsafe(r, name, nn, obj->tuple ? "tuple" : "list");
        return tv_undef(r->a, name, nn);
    case TV_LOOP: {
        struct tloop *lp = obj->u.loop;
        int64_t v;
        if (eqs(name, nn, "index")) v = (int64_t)lp->i + 1;
        else if (eqs(name, nn, "index0")) v = (int64_t)lp->i;
        else if (eqs(name, nn, "revindex")) v = (int64_t)(lp->n - lp->i);
        else if (eqs(name, nn, "revindex0")) v = (int64_t)(lp->n - lp->i - 1);
        else if (eqs(name, nn, "length")) v = (int64_t)lp->n;
        else if (eqs(name, nn, "depth")) v = 1;
        else if (eqs(name, nn, "depth0")) v = 0;
        else if (eqs(name, nn, "first")) return tv_bool(lp->i == 0);
        else if (eqs(name, nn, "last")) return tv_bool(lp->i + 1 == lp->n);
        else if (eqs(name, nn, "previtem"))
            return lp->i > 0 ? lp->items->u.l.v[lp->i - 1] : tv_undef(r->a, name, nn);
        else if (eqs(name, nn, "nextitem"))
            return lp->i + 1 < lp->n ? lp->items->u.l.v[lp->i + 1] : tv_undef(r->a, name, nn);
        else if (eqs(name, nn, "cycle")) {
            tval *c = tv_new(r->a, TV_CYCLER);
            if (c)
                c->u.loop = lp;
            return c;
        } else
            return tv_undef(r->a, name, nn);
        return tv_int(r->a, v);
    }
    default:
        return tv_undef(r->a, name, nn);
    }
}

/* ---- calls ---- */
static int call_global(struct trender *r, const struct tnode *n, int g, tval **args,
                       size_t nargs, const char **kn, size_t *knl, tval **kv, size_t nkw,
                       tval **out)
{
    switch (g) {
    case F_RANGE: {
        int64_t a[3] = {0, 0, 1};
        if (nargs < 1 || nargs > 3 || nkw)
            return terr(r, n, -EINVAL, "range expects 1 to 3 integer arguments");
        for (size_t i = 0; i < nargs; i++)
            if (args[i]->type != TV_INT && args[i]->type != TV_BOOL)
                return terr(r, n, -EINVAL, "range: '%s' object cannot be interpreted as an integer",
                            tv_typename(args[i]));
        int64_t v[3];
        for (size_t i = 0; i < nargs; i++)
            v[i] = args[i]->type == TV_INT ? args[i]->u.i : args[i]->u.b;
        if (nargs == 1)
            a[1] = v[0];
        else {
            a[0] = v[0];
            a[1] = v[1];
            if (nargs == 3)
                a[2] = v[2];
        }
        if (a[2] == 0)
            return terr(r, n, -EINVAL, "range() arg 3 must not be zero");
        /* count without overflow */
        double cnt = a[2] > 0 ? ceil(((double)a[1] - (double)a[0]) / (double)a[2])
                              : ceil(((double)a[0] - (double)a[1]) / (double)-a[2]);
        if (cnt < 0)
            cnt = 0;
        if (cnt > 100000)
            return terr(r, n, -EINVAL, "Range too big. The sandbox blocks ranges larger than "
                                       "MAX_RANGE (100000).");
        tval *l = tv_list(r->a, (size_t)cnt);
        if (l == NULL)
            return oom(r, n);
        for (int64_t x = a[0]; a[2] > 0 ? x < a[1] : x > a[1]; x += a[2]) {
            tval *iv = tv_int(r->a, x);
            if (iv == NULL || tv_list_push(r->a, l, iv))
                return oom(r, n);
            if ((a[2] > 0 && x > INT64_MAX - a[2]) || (a[2] < 0 && x < INT64_MIN - a[2]))
                break;
        }
        *out = l;
        return 0;
    }
    case F_NAMESPACE:
    case F_DICT: {
        tval *d = tv_dict(r->a, g == F_NAMESPACE ? TV_NS : TV_DICT);
        if (d == NULL)
            return oom(r, n);
        for (size_t i = 0; i < nargs; i++) {
            if (args[i]->type != TV_DICT && args[i]->type != TV_NS)
                return terr(r, n, -EINVAL, "%s: positional arguments must be mappings",
                            g == F_NAMESPACE ? "namespace" : "dict");
            for (size_t k = 0; k < args[i]->u.o.n; k++)
                if (tv_dict_set(r->a, d, args[i]->u.o.e[k].k, args[i]->u.o.e[k].kn,
                                args[i]->u.o.e[k].v))
                    return oom(r, n);
        }
        for (size_t i = 0; i < nkw; i++)
            if (tv_dict_set(r->a, d, kn[i], knl[i], kv[i]))
                return oom(r, n);
        *out = d;
        return 0;
    }
    case F_RAISE: {
        struct tbuf b = {.a = r->a};
        if (nargs != 1 || nkw)
            return terr(r, n, -EINVAL, "raise_exception() takes exactly one argument");
        if (tv_to_str(&b, args[0]))
            return terr(r, n, -EINVAL, "raise_exception with an unprintable message");
        if (b.err)
            return oom(r, n);
        /* the model's own message, without a line prefix (never empty: err always says
         * something) */
        if (b.n == 0)
            return terr(r, n, -EINVAL, "raise_exception with an empty message");
        return terr(r, NULL, -EINVAL, "%s", b.p);
    }
    case F_STRFTIME: {
        if (nargs != 1 || args[0]->type != TV_STR)
            return terr(r, n, -EINVAL, "strftime_now expects one format string");
        time_t now = r->ctx->now_set ? (time_t)r->ctx->now : time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        char fmt[256], res[512];
        if (args[0]->u.s.n >= sizeof(fmt))
            return terr(r, n, -EINVAL, "strftime_now format too long");
        memcpy(fmt, args[0]->u.s.p, args[0]->u.s.n);
        fmt[args[0]->u.s.n] = 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        /* the format is the template's (data, not code): strftime has no %n-style writes */
        size_t len = args[0]->u.s.n ? strftime(res, sizeof(res), fmt, &tm) : 0;
#pragma GCC diagnostic pop
        *out = tv_str(r->a, res, len);
        return *out ? 0 : oom(r, n);
    }
    }
    return terr(r, n, -EINVAL, "internal: unknown global");
}

int tb_call(struct trender *r, const struct tnode *n, tval *fn, tval **args, size_t nargs,
            const char **kn, size_t *knl, tval **kv, size_t nkw, tval **out)
{
    if (fn->type == TV_FUNC)
        return call_global(r, n, fn->u.func, args, nargs, kn, knl, kv, nkw, out);
    if (fn->type == TV_MACRO)
        return tr_call_macro(r, n, fn, args, nargs, kn, knl, kv, nkw, out);
    if (fn->type == TV_CYCLER) {
        if (nargs == 0)
            return terr(r, n, -EINVAL, "no items for cycling given");
        *out = args[fn->u.loop->i % nargs];
        return 0;
    }
    if (fn->type != TV_METHOD)
        return terr(r, n, -EINVAL, "'%s' object is not callable", tv_typename(fn));
    tval *self = fn->u.meth.self;
    const char *m = fn->u.meth.name;
    size_t mn = strlen(m);
    if (self->type == TV_STR) {
        if (nkw)
            return terr(r, n, -EINVAL, "str.%s: keyword arguments are not supported", m);
        return tb_call_str_method(r, n, self, m, args, nargs, out);
    }
    if (self->type == TV_DICT) {
        if (eqs(m, mn, "get")) {
            if (nargs < 1 || nargs > 2)
                return terr(r, n, -EINVAL, "get expected 1 or 2 arguments");
            tval *v = args[0]->type == TV_STR ? tv_dict_get(self, args[0]->u.s.p, args[0]->u.s.n)
                                              : NULL;
            *out = v ? v : nargs > 1 ? args[1] : &tv_none_const;
            return 0;
        }
        if (eqs(m, mn, "copy")) {
            tval *d = tv_dict(r->a, TV_DICT);
            if (d == NULL)
                return oom(r, n);
            for (size_t i = 0; i < self->u.o.n; i++)
                if (tv_dict_set(r->a, d, self->u.o.e[i].k, self->u.o.e[i].kn, self->u.o.e[i].v))
                    return oom(r, n);
            *out = d;
            return 0;
        }
        tval *l = tv_list(r->a, self->u.o.n);
        if (l == NULL)
            return oom(r, n);
        for (size_t i = 0; i < self->u.o.n; i++) {
            tval *k = tv_str_nocopy(r->a, self->u.o.e[i].k, self->u.o.e[i].kn), *e = k;
            if (k == NULL)
                return oom(r, n);
            if (eqs(m, mn, "values"))
                e = self->u.o.e[i].v;
            else if (eqs(m, mn, "items")) {
                e = tv_list(r->a, 2);
                if (e == NULL)
                    return oom(r, n);
                e->tuple = 1;
                e->u.l.v[0] = k;
                e->u.l.v[1] = self->u.o.e[i].v;
                e->u.l.n = 2;
            }
            l->u.l.v[l->u.l.n++] = e;
        }
        *out = l;
        return 0;
    }
    if (self->type == TV_LIST) {
        if (eqs(m, mn, "copy")) {
            tval *l = tv_list(r->a, self->u.l.n);
            if (l == NULL)
                return oom(r, n);
            for (size_t i = 0; i < self->u.l.n; i++)
                l->u.l.v[l->u.l.n++] = self->u.l.v[i];
            *out = l;
            return 0;
        }
        if (nargs != 1)
            return terr(r, n, -EINVAL, "list.%s takes one argument here", m);
        int64_t cnt = 0, idx = -1;
        for (size_t i = 0; i < self->u.l.n; i++)
            if (tv_eq(self->u.l.v[i], args[0])) {
                cnt++;
                if (idx < 0)
                    idx = (int64_t)i;
            }
        if (eqs(m, mn, "index") && idx < 0)
            return terr(r, n, -EINVAL, "value is not in list");
        *out = tv_int(r->a, eqs(m, mn, "index") ? idx : cnt);
        return *out ? 0 : oom(r, n);
    }
    return terr(r, n, -EINVAL, "method %s is not supported", m);
}
