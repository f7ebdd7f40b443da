/* tmpl_render.c — walks the compiled AST with one render's state. Scopes follow Jinja2:
 * `if` shares its scope, every for-loop iteration, macro call and `with` gets a fresh scope
 * whose assignments vanish at its end (only namespace attributes carry values out), and the
 * template's variables sit under every scope, then the globals. Limits: nested macro calls
 * (max_depth), loop iterations over the whole render (max_iters), output bytes (max_bytes) and
 * arena bytes (max_mem); each fails the render with an error, never a partial success.
 * Thread-safety: the template is only read; all state is in struct trender and the ctx.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tmpl_int.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

struct rstate {
    struct trender r;
    const tval *vars;
    tval *placeholder; /* the input of a filter block / block set chain */
};

int terr(struct trender *r, const struct tnode *n, int rc, const char *fmt, ...)
{
    if (r->errlen && r->err[0] == 0) {
        va_list ap;
        va_start(ap, fmt);
        tmpl_verr(r->err, r->errlen, n ? n->line : -1, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int tr_count_iter(struct trender *r, const struct tnode *n)
{
    if (++r->iters > r->ctx->lim.max_iters)
        return terr(r, n, -ELOOP, "too many loop iterations (limit %llu)",
                    (unsigned long long)r->ctx->lim.max_iters);
    return 0;
}

/* ---- scopes ---- */
static struct tframe *frame_new(struct trender *r, struct tframe *parent)
{
    struct tframe *f = tarena_alloc(r->a, sizeof(*f));
    if (f) {
        memset(f, 0, sizeof(*f));
        f->parent = parent;
    }
    return f;
}

static int frame_set(struct trender *r, struct tframe *f, const char *k, size_t kn, tval *v)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->e[i].kn == kn && memcmp(f->e[i].k, k, kn) == 0) {
            f->e[i].v = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 4;
        struct tkv *p = tarena_alloc(r->a, cap * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        if (f->n)
            memcpy(p, f->e, f->n * sizeof(*p));
        f->e = p;
        f->cap = cap;
    }
    f->e[f->n].k = k;
    f->e[f->n].kn = kn;
    f->e[f->n].v = v;
    f->n++;
    return 0;
}

static tval func_vals[6] = {
    [F_RANGE] = {.type = TV_FUNC, .u.func = F_RANGE},
    [F_NAMESPACE] = {.type = TV_FUNC, .u.func = F_NAMESPACE},
    [F_DICT] = {.type = TV_FUNC, .u.func = F_DICT},
    [F_RAISE] = {.type = TV_FUNC, .u.func = F_RAISE},
    [F_STRFTIME] = {.type = TV_FUNC, .u.func = F_STRFTIME},
};

static tval *lookup(struct rstate *S, struct tframe *f, const char *k, size_t kn)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->e[i].kn == kn && memcmp(f->e[i].k, k, kn) == 0)
                return f->e[i].v;
    if (S->vars) {
        tval *v = tv_dict_get(S->vars, k, kn);
        if (v)
            return v;
    }
    int g = tb_global(k, kn);
    if (g)
        return &func_vals[g];
    return NULL;
}

static int undef_error(struct trender *r, const struct tnode *n, const tval *u)
{
    if (u->undef_err)
        return terr(r, n, -EINVAL, "%s", u->undef_err);
    if (u->u.s.p)
        return terr(r, n, -EINVAL, "'%.*s' is undefined", (int)u->u.s.n, u->u.s.p);
    return terr(r, n, -EINVAL, "undefined value used");
}

/* Recursion guard: eval and exec_stmt count their frames (the compiled tree's height is
 * bounded, but macros recurse); past MAX_FRAMES the render fails instead of the stack. */
#define MAX_FRAMES 1000

static int eval(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out);
static int exec_body(struct rstate *S, struct tframe *f, struct tnode *const *v, size_t nv,
                     struct tbuf *out);

/* ---- items of an iterable (for loops, filters) ---- */
static int iter_items(struct trender *r, const struct tnode *n, tval *x, tval **out)
{
    switch (x->type) {
    case TV_LIST:
        *out = x;
        return 0;
    case TV_UNDEF:
        if (x->undef_err)
            return undef_error(r, n, x);
        *out = tv_list(r->a, 0);
        return *out ? 0 : oom(r, n);
    case TV_DICT:
    case TV_NS: {
        tval *l = tv_list(r->a, x->u.o.n);
        if (l == NULL)
            return oom(r, n);
        for (size_t i = 0; i < x->u.o.n; i++) {
            tval *k = tv_str_nocopy(r->a, x->u.o.e[i].k, x->u.o.e[i].kn);
            if (k == NULL)
                return oom(r, n);
            l->u.l.v[l->u.l.n++] = k;
        }
        *out = l;
        return 0;
    }
    case TV_STR: {
        tval *l = tv_list(r->a, tu8_len(x->u.s.p, x->u.s.n));
        if (l == NULL)
            return oom(r, n);
        for (size_t i = 0; i < x->u.s.n;) {
            size_t e = tu8_next(x->u.s.p, x->u.s.n, i);
            tval *c = tv_str_nocopy(r->a, x->u.s.p + i, e - i);
            if (c == NULL || tv_list_push(r->a, l, c))
                return oom(r, n);
            i = e;
        }
        *out = l;
        return 0;
    }
    default:
        return terr(r, n, -EINVAL, "'%s' object is not iterable", tv_typename(x));
    }
}

/* ---- expressions ---- */
static int num_binop(struct trender *r, const struct tnode *n, int op, tval *a, tval *b,
                     tval **out)
{
    bool isf = a->type == TV_FLOAT || b->type == TV_FLOAT;
    if (!isf && op != OP_DIV) {
        int64_t x = a->type == TV_INT ? a->u.i : a->u.b, y = b->type == TV_INT ? b->u.i : b->u.b;
        int64_t z;
        switch (op) {
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &z))
                goto ovf;
            break;
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &z))
                goto ovf;
            break;
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &z))
                goto ovf;
            break;
        case OP_FLOORDIV:
        case OP_MOD:
            if (y == 0)
                return terr(r, n, -EINVAL, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                goto ovf;
            z = op == OP_FLOORDIV ? x / y : x % y;
            if (op == OP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0)))
                z--;
            if (op == OP_MOD && z != 0 && ((z < 0) != (y < 0)))
                z += y;
            break;
        case OP_POW:
            if (y < 0) {
                if (x == 0)
                    return terr(r, n, -EINVAL, "0 cannot be raised to a negative power");
                *out = tv_float(r->a, pow((double)x, (double)y));
                return *out ? 0 : oom(r, n);
            }
            z = 1;
            for (int64_t k = 0; k < y; k++) {
                if (__builtin_mul_overflow(z, x, &z))
                    goto ovf;
                if (z == 0 || z == 1 || (z == -1 && k > 64))
                    break;
            }
            if (z == -1 && (y % 2) == 0)
                z = 1;
            break;
        default:
            return terr(r, n, -EINVAL, "bad operator");
        }
        *out = tv_int(r->a, z);
        return *out ? 0 : oom(r, n);
    ovf:
        return terr(r, n, -EINVAL, "integer overflow (integers are 64-bit here)");
    }
    double x = tv_num(a), y = tv_num(b), z;
    switch (op) {
    case OP_ADD: z = x + y; break;
    case OP_SUB: z = x - y; break;
    case OP_MUL: z = x * y; break;
    case OP_DIV:
        if (y == 0)
            return terr(r, n, -EINVAL, "division by zero");
        z = x / y;
        break;
    case OP_FLOORDIV:
        if (y == 0)
            return terr(r, n, -EINVAL, "float floor division by zero");
        z = floor(x / y);
        break;
    case OP_MOD:
        if (y == 0)
            return terr(r, n, -EINVAL, "float modulo");
        z = fmod(x, y);
        if (z != 0 && ((z < 0) != (y < 0)))
            z += y;
        else if (z == 0)
            z = copysign(0.0, y); /* Python: a zero remainder takes the divisor's sign */
        break;
    case OP_POW: z = pow(x, y); break;
    default: return terr(r, n, -EINVAL, "bad operator");
    }
    *out = tv_float(r->a, z);
    return *out ? 0 : oom(r, n);
}

static int repeat(struct trender *r, const struct tnode *n, tval *seq, int64_t k, tval **out)
{
    if (k < 0)
        k = 0;
    if (seq->type == TV_STR) {
        if (seq->u.s.n && (uint64_t)k > (r->a->max ? r->a->max : SIZE_MAX) / seq->u.s.n)
            return oom(r, n);
        struct tbuf b = {.a = r->a};
        for (int64_t i = 0; i < k && !b.err; i++)
            tbuf_put(&b, seq->u.s.p, seq->u.s.n);
        if (b.err)
            return oom(r, n);
        *out = tv_str_nocopy(r->a, b.p ? b.p : "", b.n);
    } else {
        if (seq->u.l.n && (uint64_t)k > (r->a->max ? r->a->max : SIZE_MAX) / 8 / seq->u.l.n)
            return oom(r, n);
        tval *l = tv_list(r->a, 0);
        if (l == NULL)
            return oom(r, n);
        l->tuple = seq->tuple;
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < seq->u.l.n; j++)
                if (tv_list_push(r->a, l, seq->u.l.v[j]))
                    return oom(r, n);
        *out = l;
    }
    return *out ? 0 : oom(r, n);
}

static int binop(struct trender *r, const struct tnode *n, int op, tval *a, tval *b, tval **out)
{
    if (op == OP_MOD && a->type == TV_STR) /* formatting: an Undefined argument prints '' */
        return tb_format(r, n, a, b, out);
    if (a->type == TV_UNDEF)
        return undef_error(r, n, a);
    if (b->type == TV_UNDEF)
        return undef_error(r, n, b);
    if (tv_is_num(a) && tv_is_num(b))
        return num_binop(r, n, op, a, b, out);
    if (op == OP_ADD && a->type == TV_STR && b->type == TV_STR && (a->markup || b->markup)) {
        /* Markup + str escapes the str */
        struct tbuf bb = {.a = r->a};
        if (a->markup)
            tbuf_put(&bb, a->u.s.p, a->u.s.n);
        else
            tv_html_escape(&bb, a->u.s.p, a->u.s.n);
        if (b->markup)
            tbuf_put(&bb, b->u.s.p, b->u.s.n);
        else
            tv_html_escape(&bb, b->u.s.p, b->u.s.n);
        if (bb.err)
            return oom(r, n);
        *out = tv_str_nocopy(r->a, bb.p ? bb.p : "", bb.n);
        if (*out)
            (*out)->markup = 1;
        return *out ? 0 : oom(r, n);
    }
    if (op == OP_ADD && a->type == TV_STR && b->type == TV_STR) {
        char *p = tarena_alloc(r->a, a->u.s.n + b->u.s.n + 1);
        if (p == NULL)
            return oom(r, n);
        memcpy(p, a->u.s.p, a->u.s.n);
        memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
        p[a->u.s.n + b->u.s.n] = 0;
        *out = tv_str_nocopy(r->a, p, a->u.s.n + b->u.s.n);
        return *out ? 0 : oom(r, n);
    }
    if (op == OP_ADD && a->type == TV_LIST && b->type == TV_LIST && a->tuple == b->tuple) {
        tval *l = tv_list(r->a, a->u.l.n + b->u.l.n);
        if (l == NULL)
            return oom(r, n);
        l->tuple = a->tuple;
        for (size_t i = 0; i < a->u.l.n; i++)
            l->u.l.v[l->u.l.n++] = a->u.l.v[i];
        for (size_t i = 0; i < b->u.l.n; i++)
            l->u.l.v[l->u.l.n++] = b->u.l.v[i];
        *out = l;
        return 0;
    }
    if (op == OP_MUL && (a->type == TV_STR || a->type == TV_LIST) &&
        (b->type == TV_INT || b->type == TV_BOOL))
        return repeat(r, n, a, b->type == TV_INT ? b->u.i : b->u.b, out);
    if (op == OP_MUL && (b->type == TV_STR || b->type == TV_LIST) &&
        (a->type == TV_INT || a->type == TV_BOOL))
        return repeat(r, n, b, a->type == TV_INT ? a->u.i : a->u.b, out);
    if (op == OP_MOD && a->type == TV_STR)
        return tb_format(r, n, a, b, out);
    static const char *ops[] = {"+", "-", "*", "/", "//", "%", "**"};
    return terr(r, n, -EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", ops[op],
                tv_typename(a), tv_typename(b));
}

static int contains(struct trender *r, const struct tnode *n, tval *x, tval *c, bool *out)
{
    switch (c->type) {
    case TV_STR:
        if (x->type != TV_STR)
            return terr(r, n, -EINVAL, "'in <string>' requires string as left operand, not %s",
                        tv_typename(x));
        *out = x->u.s.n == 0 || (x->u.s.n <= c->u.s.n &&
                                 memmem(c->u.s.p, c->u.s.n, x->u.s.p, x->u.s.n) != NULL);
        return 0;
    case TV_LIST:
        *out = false;
        for (size_t i = 0; i < c->u.l.n; i++)
            if (tv_eq(x, c->u.l.v[i])) {
                *out = true;
                break;
            }
        return 0;
    case TV_DICT:
    case TV_NS:
        if ((x->type == TV_LIST && !x->tuple) || x->type == TV_DICT)
            return terr(r, n, -EINVAL, "unhashable type: '%s'", tv_typename(x));
        *out = x->type == TV_STR && tv_dict_get(c, x->u.s.p, x->u.s.n) != NULL;
        return 0;
    case TV_UNDEF:
        *out = false;
        return 0;
    default:
        return terr(r, n, -EINVAL, "argument of type '%s' is not iterable", tv_typename(c));
    }
}

static int compare(struct trender *r, const struct tnode *n, int op, tval *a, tval *b, bool *out)
{
    int c;
    switch (op) {
    case C_EQ: *out = tv_eq(a, b); return 0;
    case C_NE: *out = !tv_eq(a, b); return 0;
    case C_IN: return contains(r, n, a, b, out);
    case C_NOTIN: TRY(contains(r, n, a, b, out)); *out = !*out; return 0;
    default:
        if (a->type == TV_UNDEF)
            return undef_error(r, n, a);
        if (b->type == TV_UNDEF)
            return undef_error(r, n, b);
        if (tv_cmp(a, b, &c))
            return terr(r, n, -EINVAL, "'%s' not supported between instances of '%s' and '%s'",
                        op == C_LT ? "<" : op == C_LE ? "<=" : op == C_GT ? ">" : ">=",
                        tv_typename(a), tv_typename(b));
        *out = op == C_LT ? c < 0 : op == C_LE ? c <= 0 : op == C_GT ? c > 0 : c >= 0;
        return 0;
    }
}

static int norm_index(int64_t i, size_t len, size_t *out)
{
    if (i < 0)
        i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len)
        return -1;
    *out = (size_t)i;
    return 0;
}

/* character offsets of a string, built on demand for indexing/slicing by code point */
static int str_offsets(struct trender *r, const tval *s, size_t **offs, size_t *count)
{
    size_t cnt = tu8_len(s->u.s.p, s->u.s.n);
    size_t *o = tarena_alloc(r->a, (cnt + 1) * sizeof(size_t));
    if (o == NULL)
        return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < s->u.s.n; i = tu8_next(s->u.s.p, s->u.s.n, i))
        o[k++] = i;
    o[k] = s->u.s.n;
    *offs = o;
    *count = k;
    return 0;
}

static int getitem(struct rstate *S, const struct tnode *n, tval *obj, tval *key, tval **out)
{
    struct trender *r = &S->r;
    if (obj->type == TV_UNDEF)
        return undef_error(r, n, obj);
    if ((obj->type == TV_LIST) && (key->type == TV_INT || key->type == TV_BOOL)) {
        size_t i;
        int64_t k = key->type == TV_INT ? key->u.i : key->u.b;
        if (norm_index(k, obj->u.l.n, &i)) {
            *out = tv_undef(r->a, NULL, 0);
            return *out ? 0 : oom(r, n);
        }
        *out = obj->u.l.v[i];
        return 0;
    }
    if (obj->type == TV_STR && (key->type == TV_INT || key->type == TV_BOOL)) {
        size_t *o, cnt, i;
        if (str_offsets(r, obj, &o, &cnt))
            return oom(r, n);
        if (norm_index(key->type == TV_INT ? key->u.i : key->u.b, cnt, &i)) {
            *out = tv_undef(r->a, NULL, 0);
            return *out ? 0 : oom(r, n);
        }
        *out = tv_str_nocopy(r->a, obj->u.s.p + o[i], o[i + 1] - o[i]);
        return *out ? 0 : oom(r, n);
    }
    if ((obj->type == TV_DICT || obj->type == TV_NS) && key->type == TV_STR) {
        tval *v = tv_dict_get(obj, key->u.s.p, key->u.s.n);
        if (v) {
            *out = v;
            return 0;
        }
    }
    if (key->type == TV_STR) {
        *out = tb_getattr(r, obj, key->u.s.p, key->u.s.n);
        return *out ? 0 : oom(r, n);
    }
    *out = tv_undef(r->a, NULL, 0);
    return *out ? 0 : oom(r, n);
}

static int slice_arg(struct trender *r, const struct tnode *n, tval *v, bool *has, int64_t *out)
{
    *has = false;
    if (v == NULL || v->type == TV_NONE)
        return 0;
    if (v->type != TV_INT && v->type != TV_BOOL)
        return terr(r, n, -EINVAL, "slice indices must be integers or None");
    *has = true;
    *out = v->type == TV_INT ? v->u.i : v->u.b;
    return 0;
}

static int do_slice(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
{
    struct trender *r = &S->r;
    tval *obj, *a = NULL, *b = NULL, *c = NULL;
    TRY(eval(S, f, n->a, &obj));
    if (n->b)
        TRY(eval(S, f, n->b, &a));
    if (n->c)
        TRY(eval(S, f, n->c, &b));
    if (n->d)
        TRY(eval(S, f, n->d, &c));
    if (obj->type == TV_UNDEF)
        return undef_error(r, n, obj);
    bool hs, he, hp;
    int64_t st = 0, en = 0, step = 1;
    TRY(slice_arg(r, n, a, &hs, &st));
    TRY(slice_arg(r, n, b, &he, &en));
    TRY(slice_arg(r, n, c, &hp, &step));
    if (step == 0)
        return terr(r, n, -EINVAL, "slice step cannot be zero");
    size_t *offs = NULL, len;
    if (obj->type == TV_STR) {
        if (str_offsets(r, obj, &offs, &len))
            return oom(r, n);
    } else if (obj->type == TV_LIST) {
        len = obj->u.l.n;
    } else {
        return terr(r, n, -EINVAL, "'%s' object is not subscriptable", tv_typename(obj));
    }
    int64_t L = (int64_t)len;
    /* a step longer than the sequence selects at most one item: clamp it so that index
     * arithmetic below cannot overflow */
    if (step > L)
        step = L + 1;
    else if (step < -L - 1)
        step = -L - 1;
    /* Python's PySlice_AdjustIndices */
    if (!hs)
        st = step < 0 ? L - 1 : 0;
    else {
        if (st < 0) {
            st += L;
            if (st < 0)
                st = step < 0 ? -1 : 0;
        } else if (st >= L)
            st = step < 0 ? L - 1 : L;
    }
    if (!he)
        en = step < 0 ? -1 : L;
    else {
        if (en < 0) {
            en += L;
            if (en < 0)
                en = step < 0 ? -1 : 0;
        } else if (en >= L)
            en = step < 0 ? L - 1 : L;
    }
    if (obj->type == TV_STR) {
        struct tbuf bb = {.a = r->a};
        for (int64_t i = st; step > 0 ? i < en : i > en; i += step)
            tbuf_put(&bb, obj->u.s.p + offs[i], offs[i + 1] - offs[i]);
        if (bb.err)
            return oom(r, n);
        *out = tv_str_nocopy(r->a, bb.p ? bb.p : "", bb.n);
        return *out ? 0 : oom(r, n);
    }
    tval *l = tv_list(r->a, 0);
    if (l == NULL)
        return oom(r, n);
    l->tuple = obj->tuple;
    for (int64_t i = st; step > 0 ? i < en : i > en; i += step)
        if (tv_list_push(r->a, l, obj->u.l.v[i]))
            return oom(r, n);
    *out = l;
    return 0;
}

/* evaluates the arguments of a call / filter / test node */
struct args {
    tval *pos[16];
    size_t np;
    tval *kw[16];
    size_t nk;
};

static int eval_args(struct rstate *S, struct tframe *f, const struct tnode *n, struct args *A)
{
    if (n->nv > 16 || n->nw > 16)
        return terr(&S->r, n, -EINVAL, "too many arguments (16 at most)");
    A->np = n->nv;
    A->nk = n->nw;
    for (size_t i = 0; i < n->nv; i++)
        TRY(eval(S, f, n->v[i], &A->pos[i]));
    for (size_t i = 0; i < n->nw; i++)
        TRY(eval(S, f, n->w[i], &A->kw[i]));
    return 0;
}

int tr_call_macro(struct trender *r, const struct tnode *at, tval *m, tval **args, size_t nargs,
                  const char **kn, size_t *knl, tval **kv, size_t nkw, tval **out)
{
    struct rstate *S = (struct rstate *)r;
    const struct tnode *mn = m->u.m.node;
    if (r->depth >= r->ctx->lim.max_depth)
        return terr(r, at, -ELOOP, "macro calls nested too deep (limit %u)",
                    (unsigned)r->ctx->lim.max_depth);
    struct tframe *f = frame_new(r, m->u.m.scope);
    if (f == NULL)
        return oom(r, at);
    if (nargs > mn->nnames && !mn->flag)
        return terr(r, at, -EINVAL, "macro '%.*s' takes not more than %zu argument(s)",
                    (int)mn->sn, mn->s, mn->nnames);
    for (size_t k = 0; k < nkw; k++) {
        bool found = false;
        for (size_t i = 0; i < mn->nnames; i++)
            if (mn->namelens[i] == knl[k] && memcmp(mn->names[i], kn[k], knl[k]) == 0) {
                if (i < nargs)
                    return terr(r, at, -EINVAL, "macro '%.*s' got multiple values for '%.*s'",
                                (int)mn->sn, mn->s, (int)knl[k], kn[k]);
                found = true;
            }
        if (!found)
            return terr(r, at, -EINVAL, "macro '%.*s' takes no keyword argument '%.*s'",
                        (int)mn->sn, mn->s, (int)knl[k], kn[k]);
    }
    r->depth++;
    int rc = 0;
    for (size_t i = 0; i < mn->nnames && rc == 0; i++) {
        tval *v = NULL;
        if (i < nargs)
            v = args[i];
        for (size_t k = 0; k < nkw && v == NULL; k++)
            if (mn->namelens[i] == knl[k] && memcmp(mn->names[i], kn[k], knl[k]) == 0)
                v = kv[k];
        if (v == NULL && i < mn->nw && mn->w[i])
            rc = eval(S, f, mn->w[i], &v);
        if (rc == 0 && v == NULL && (v = tv_undef(r->a, mn->names[i], mn->namelens[i])) == NULL)
            rc = oom(r, at);
        if (rc == 0 && frame_set(r, f, mn->names[i], mn->namelens[i], v))
            rc = oom(r, at);
    }
    if (rc == 0 && mn->flag) {
        tval *va = tv_list(r->a, 0);
        if (va == NULL)
            rc = oom(r, at);
        for (size_t i = mn->nnames; rc == 0 && i < nargs; i++)
            if (tv_list_push(r->a, va, args[i]))
                rc = oom(r, at);
        if (rc == 0) {
            va->tuple = 1;
            if (frame_set(r, f, "varargs", 7, va))
                rc = oom(r, at);
        }
    }
    if (rc == 0 && m->u.m.caller && frame_set(r, f, "caller", 6, m->u.m.caller))
        rc = oom(r, at);
    struct tbuf b = {.a = r->a};
    if (rc == 0)
        rc = exec_body(S, f, mn->v, mn->nv, &b);
    r->depth--;
    if (rc)
        return rc;
    if (b.err)
        return oom(r, at);
    *out = tv_str_nocopy(r->a, b.p ? b.p : "", b.n);
    return *out ? 0 : oom(r, at);
}

static int eval_call(struct rstate *S, struct tframe *f, const struct tnode *n, tval *caller,
                     tval **out)
{
    struct trender *r = &S->r;
    tval *fn;
    TRY(eval(S, f, n->a, &fn));
    struct args A;
    TRY(eval_args(S, f, n, &A));
    if (fn->type == TV_MACRO) {
        if (caller) {
            tval *m = tv_new(r->a, TV_MACRO);
            if (m == NULL)
                return oom(r, n);
            *m = *fn;
            m->u.m.caller = caller;
            fn = m;
        }
        return tr_call_macro(r, n, fn, A.pos, A.np, n->names, n->namelens, A.kw, A.nk, out);
    }
    if (fn->type == TV_UNDEF)
        return undef_error(r, n, fn);
    return tb_call(r, n, fn, A.pos, A.np, n->names, n->namelens, A.kw, A.nk, out);
}

static int eval_filter(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
    __attribute__((noinline));
static int eval_test(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
    __attribute__((noinline));

static int eval_inner(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
{
    struct trender *r = &S->r;
    tval *a, *b;
    switch (n->kind) {
    case N_CONST:
        *out = n->lit;
        return 0;
    case N_NAME: {
        tval *v = lookup(S, f, n->s, n->sn);
        if (v == NULL && (v = tv_undef(r->a, n->s, n->sn)) == NULL)
            return oom(r, n);
        *out = v;
        return 0;
    }
    case N_GETATTR:
        TRY(eval(S, f, n->a, &a));
        if (a->type == TV_UNDEF)
            return undef_error(r, n, a);
        *out = tb_getattr(r, a, n->s, n->sn);
        return *out ? 0 : oom(r, n);
    case N_GETITEM:
        TRY(eval(S, f, n->a, &a));
        TRY(eval(S, f, n->b, &b));
        return getitem(S, n, a, b, out);
    case N_SLICE:
        return do_slice(S, f, n, out);
    case N_CALL:
        return eval_call(S, f, n, NULL, out);
    case N_FILTER:
        return eval_filter(S, f, n, out);
    case N_TEST:
        return eval_test(S, f, n, out);
    case N_BINOP:
        TRY(eval(S, f, n->a, &a));
        TRY(eval(S, f, n->b, &b));
        return binop(r, n, n->op, a, b, out);
    case N_NEG:
    case N_POS:
        TRY(eval(S, f, n->a, &a));
        if (a->type == TV_UNDEF)
            return undef_error(r, n, a);
        if (!tv_is_num(a))
            return terr(r, n, -EINVAL, "bad operand type for unary %c: '%s'",
                        n->kind == N_NEG ? '-' : '+', tv_typename(a));
        if (a->type == TV_FLOAT)
            *out = tv_float(r->a, n->kind == N_NEG ? -a->u.d : a->u.d);
        else {
            int64_t v = a->type == TV_INT ? a->u.i : a->u.b;
            if (n->kind == N_NEG && v == INT64_MIN)
                return terr(r, n, -EINVAL, "integer overflow");
            *out = tv_int(r->a, n->kind == N_NEG ? -v : v);
        }
        return *out ? 0 : oom(r, n);
    case N_NOT:
        TRY(eval(S, f, n->a, &a));
        *out = tv_bool(!tv_truthy(a));
        return 0;
    case N_AND:
        TRY(eval(S, f, n->a, &a));
        if (!tv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(S, f, n->b, out);
    case N_OR:
        TRY(eval(S, f, n->a, &a));
        if (tv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(S, f, n->b, out);
    case N_COND:
        TRY(eval(S, f, n->b, &a));
        if (tv_truthy(a))
            return eval(S, f, n->a, out);
        if (n->c)
            return eval(S, f, n->c, out);
        *out = tv_undef(r->a, NULL, 0);
        return *out ? 0 : oom(r, n);
    case N_LIST:
    case N_TUPLE: {
        tval *l = tv_list(r->a, n->nv);
        if (l == NULL)
            return oom(r, n);
        l->tuple = n->kind == N_TUPLE;
        for (size_t i = 0; i < n->nv; i++) {
            TRY(eval(S, f, n->v[i], &l->u.l.v[i]));
            l->u.l.n++;
        }
        *out = l;
        return 0;
    }
    case N_DICT: {
        tval *d = tv_dict(r->a, TV_DICT);
        if (d == NULL)
            return oom(r, n);
        for (size_t i = 0; i < n->nv; i++) {
            TRY(eval(S, f, n->v[i], &a));
            TRY(eval(S, f, n->w[i], &b));
            if (a->type != TV_STR)
                return terr(r, n, -EINVAL, "only string keys are supported in dict literals");
            if (tv_dict_set(r->a, d, a->u.s.p, a->u.s.n, b))
                return oom(r, n);
        }
        *out = d;
        return 0;
    }
    case N_CONCAT: {
        TRY(eval(S, f, n->a, &a));
        TRY(eval(S, f, n->b, &b));
        struct tbuf bb = {.a = r->a};
        if (tv_to_str(&bb, a) || tv_to_str(&bb, b))
            return terr(r, n, -EINVAL, "cannot convert a %s or %s to a string",
                        tv_typename(a), tv_typename(b));
        if (bb.err)
            return oom(r, n);
        *out = tv_str_nocopy(r->a, bb.p ? bb.p : "", bb.n);
        return *out ? 0 : oom(r, n);
    }
    case N_COMPARE: {
        TRY(eval(S, f, n->a, &a));
        for (size_t i = 0; i < n->nv; i++) {
            bool res;
            TRY(eval(S, f, n->v[i], &b));
            TRY(compare(r, n, n->cmpops[i], a, b, &res));
            if (!res) {
                *out = &tv_false_const;
                return 0;
            }
            a = b;
        }
        *out = &tv_true_const;
        return 0;
    }
    default:
        return terr(r, n, -EINVAL, "internal: not an expression");
    }
}

static int eval_filter(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
{
    tval *a;
    if (n->a)
        TRY(eval(S, f, n->a, &a));
    else
        a = S->placeholder;
    struct args A;
    TRY(eval_args(S, f, n, &A));
    return tb_filter(&S->r, n, n->s, n->sn, a, A.pos, A.np, n->names, n->namelens, A.kw, A.nk,
                     out);
}

static int eval_test(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
{
    tval *a;
    TRY(eval(S, f, n->a, &a));
    struct args A;
    TRY(eval_args(S, f, n, &A));
    bool res;
    TRY(tb_test(&S->r, n, n->s, n->sn, a, A.pos, A.np, &res));
    *out = tv_bool(n->op ? !res : res);
    return 0;
}

static int eval(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
{
    if (++S->r.frames > MAX_FRAMES) {
        S->r.frames--;
        return terr(&S->r, n, -ELOOP, "template recursion too deep");
    }
    int rc = eval_inner(S, f, n, out);
    S->r.frames--;
    return rc;
}

/* ---- statements ---- */
static int assign(struct rstate *S, struct tframe *f, const struct tnode *n, tval *v)
{
    struct trender *r = &S->r;
    if (n->nnames == 1)
        return frame_set(r, f, n->names[0], n->namelens[0], v) ? oom(r, n) : 0;
    tval *items;
    TRY(iter_items(r, n, v, &items));
    if (items->u.l.n != n->nnames)
        return terr(r, n, -EINVAL, "cannot unpack %zu values into %zu names", items->u.l.n,
                    n->nnames);
    for (size_t i = 0; i < n->nnames; i++)
        if (frame_set(r, f, n->names[i], n->namelens[i], items->u.l.v[i]))
            return oom(r, n);
    return 0;
}

static int exec_for(struct rstate *S, struct tframe *f, const struct tnode *n, struct tbuf *out)
{
    struct trender *r = &S->r;
    tval *it, *items;
    TRY(eval(S, f, n->a, &it));
    TRY(iter_items(r, n, it, &items));
    if (n->b) { /* loop filter: evaluated with the targets bound, without `loop` */
        tval *kept = tv_list(r->a, 0);
        if (kept == NULL)
            return oom(r, n);
        for (size_t i = 0; i < items->u.l.n; i++) {
            TRY(tr_count_iter(r, n));
            struct tframe *lf = frame_new(r, f);
            if (lf == NULL)
                return oom(r, n);
            TRY(assign(S, lf, n, items->u.l.v[i]));
            tval *c;
            TRY(eval(S, lf, n->b, &c));
            if (tv_truthy(c) && tv_list_push(r->a, kept, items->u.l.v[i]))
                return oom(r, n);
        }
        items = kept;
    }
    if (items->u.l.n == 0) {
        struct tframe *ef = frame_new(r, f);
        if (ef == NULL)
            return oom(r, n);
        return exec_body(S, ef, n->w, n->nw, out);
    }
    struct tloop *lp = tarena_alloc(r->a, sizeof(*lp));
    tval *lv = tv_new(r->a, TV_LOOP);
    if (lp == NULL || lv == NULL)
        return oom(r, n);
    lp->items = items;
    lp->n = items->u.l.n;
    lv->u.loop = lp;
    for (size_t i = 0; i < lp->n; i++) {
        TRY(tr_count_iter(r, n));
        lp->i = i;
        struct tframe *lf = frame_new(r, f);
        if (lf == NULL)
            return oom(r, n);
        if (frame_set(r, lf, "loop", 4, lv))
            return oom(r, n);
        TRY(assign(S, lf, n, items->u.l.v[i]));
        TRY(exec_body(S, lf, n->v, n->nv, out));
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
    return 0;
}

static int render_to_str(struct rstate *S, struct tframe *f, const struct tnode *n, tval **out)
{
    struct tbuf b = {.a = S->r.a};
    TRY(exec_body(S, f, n->v, n->nv, &b));
    if (b.err)
        return oom(&S->r, n);
    *out = tv_str_nocopy(S->r.a, b.p ? b.p : "", b.n);
    return *out ? 0 : oom(&S->r, n);
}

static int apply_chain(struct rstate *S, struct tframe *f, const struct tnode *chain, tval *in,
                       tval **out)
{
    tval *save = S->placeholder;
    S->placeholder = in;
    int rc = eval(S, f, chain, out);
    S->placeholder = save;
    return rc;
}

static int output(struct trender *r, const struct tnode *n, tval *v, struct tbuf *out)
{
    if (tv_to_str(out, v))
        return terr(r, n, -EINVAL, "cannot print a %s", tv_typename(v));
    return 0;
}

static int exec_stmt_inner(struct rstate *S, struct tframe *f, const struct tnode *n,
                           struct tbuf *out)
{
    struct trender *r = &S->r;
    tval *v;
    switch (n->kind) {
    case N_DATA:
        tbuf_put(out, n->s, n->sn);
        return 0;
    case N_OUTPUT:
        TRY(eval(S, f, n->a, &v));
        return output(r, n, v, out);
    case N_IF:
        TRY(eval(S, f, n->a, &v));
        if (tv_truthy(v))
            return exec_body(S, f, n->v, n->nv, out);
        return exec_body(S, f, n->w, n->nw, out);
    case N_FOR:
        return exec_for(S, f, n, out);
    case N_SET:
        TRY(eval(S, f, n->a, &v));
        return assign(S, f, n, v);
    case N_SET_ATTR: {
        tval *ns = lookup(S, f, n->s, n->sn);
        if (ns == NULL || ns->type != TV_NS)
            return terr(r, n, -EINVAL, "cannot assign attribute on non-namespace object");
        TRY(eval(S, f, n->a, &v));
        return tv_dict_set(r->a, ns, n->names[0], n->namelens[0], v) ? oom(r, n) : 0;
    }
    case N_SET_BLOCK:
        TRY(render_to_str(S, f, n, &v));
        if (n->a)
            TRY(apply_chain(S, f, n->a, v, &v));
        return assign(S, f, n, v);
    case N_MACRO: {
        tval *m = tv_new(r->a, TV_MACRO);
        if (m == NULL)
            return oom(r, n);
        m->u.m.node = n;
        m->u.m.scope = f;
        return frame_set(r, f, n->s, n->sn, m) ? oom(r, n) : 0;
    }
    case N_CALL_BLOCK: {
        tval *caller = tv_new(r->a, TV_MACRO);
        if (caller == NULL)
            return oom(r, n);
        caller->u.m.node = n->b;
        caller->u.m.scope = f;
        TRY(eval_call(S, f, n->a, caller, &v));
        return output(r, n, v, out);
    }
    case N_FILTER_BLOCK:
        TRY(render_to_str(S, f, n, &v));
        TRY(apply_chain(S, f, n->a, v, &v));
        return output(r, n, v, out);
    case N_BREAK:
        r->ctl = 1;
        return 0;
    case N_CONTINUE:
        r->ctl = 2;
        return 0;
    case N_WITH: {
        struct tframe *wf = frame_new(r, f);
        if (wf == NULL)
            return oom(r, n);
        for (size_t i = 0; i < n->nnames; i++) {
            TRY(eval(S, f, n->w[i], &v));
            if (frame_set(r, wf, n->names[i], n->namelens[i], v))
                return oom(r, n);
        }
        return exec_body(S, wf, n->v, n->nv, out);
    }
    default:
        return terr(r, n, -EINVAL, "internal: not a statement");
    }
}

static int exec_stmt(struct rstate *S, struct tframe *f, const struct tnode *n, struct tbuf *out)
{
    if (++S->r.frames > MAX_FRAMES) {
        S->r.frames--;
        return terr(&S->r, n, -ELOOP, "template recursion too deep");
    }
    int rc = exec_stmt_inner(S, f, n, out);
    S->r.frames--;
    return rc;
}

static int exec_body(struct rstate *S, struct tframe *f, struct tnode *const *v, size_t nv,
                     struct tbuf *out)
{
    for (size_t i = 0; i < nv; i++) {
        TRY(exec_stmt(S, f, v[i], out));
        if (out->err) {
            if (out->err == -E2BIG)
                return terr(&S->r, v[i], -E2BIG, "rendered output exceeds %zu bytes", out->max);
            return oom(&S->r, v[i]);
        }
        if (S->r.ctl)
            return 0;
    }
    return 0;
}

/* ---- ctx and entry point ---- */
int kvr_tmpl_ctx_create(kvr_tmpl_ctx **out, const struct kvr_tmpl_limits *lim)
{
    kvr_tmpl_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    if (lim)
        c->lim = *lim;
    if (c->lim.max_mem == 0)
        c->lim.max_mem = (size_t)256 << 20;
    if (c->lim.max_depth == 0)
        c->lim.max_depth = 64;
    if (c->lim.max_iters == 0)
        c->lim.max_iters = 1000000;
    c->arena.max = c->lim.max_mem;
    *out = c;
    return 0;
}

void kvr_tmpl_ctx_reset(kvr_tmpl_ctx *ctx)
{
    tarena_reset(&ctx->arena);
}

void kvr_tmpl_ctx_destroy(kvr_tmpl_ctx *ctx)
{
    if (ctx == NULL)
        return;
    tarena_free(&ctx->arena);
    free(ctx->out.p);
    free(ctx);
}

void kvr_tmpl_ctx_set_time(kvr_tmpl_ctx *ctx, int64_t unix_seconds)
{
    ctx->now = unix_seconds;
    ctx->now_set = true;
}

int kvr_tmpl_render(const kvr_tmpl *t, kvr_tmpl_ctx *ctx, const kvr_tmpl_val *vars,
                    size_t max_bytes, const char **out, size_t *outlen, char *err, size_t errlen)
{
    static char dummy[1];
    if (errlen == 0)
        err = dummy, errlen = 0;
    else
        err[0] = 0;
    *out = NULL;
    *outlen = 0;
    struct rstate S = {.r = {.ctx = ctx, .a = &ctx->arena, .t = t, .err = err, .errlen = errlen}};
    if (vars && vars->type != TV_DICT)
        return terr(&S.r, NULL, -EINVAL, "template variables must be a dict");
    S.vars = vars;
    ctx->out.n = 0;
    ctx->out.err = 0;
    ctx->out.max = max_bytes;
    ctx->out.a = NULL;
    struct tframe *root = frame_new(&S.r, NULL);
    if (root == NULL)
        return oom(&S.r, NULL);
    int rc = exec_body(&S, root, t->root->v, t->root->nv, &ctx->out);
    if (rc == 0 && ctx->out.err)
        rc = ctx->out.err == -E2BIG
                 ? terr(&S.r, NULL, -E2BIG, "rendered output exceeds %zu bytes", max_bytes)
                 : oom(&S.r, NULL);
    if (rc)
        return rc;
    if (ctx->out.p == NULL) {
        tbuf_put(&ctx->out, "", 0);
        *out = "";
    } else {
        *out = ctx->out.p;
    }
    *outlen = ctx->out.n;
    return 0;
}
