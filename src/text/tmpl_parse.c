/* tmpl_parse.c — tokens to the AST a render walks, following Jinja2 3.1's parser (operator
 * precedence, filters and tests binding tighter than binary operators, test arguments without
 * parentheses, adjacent string literals joined). Constructs outside the subset (include,
 * extends, blocks, imports, recursive loops, star-args / double-star-kwargs at call sites...)
 * are refused here with the line they are on, so no template renders half-understood.
 * This file holds the expressions, the compile entry and the passes over the finished tree:
 * the height check and vLLM's content format detection, which is a question about the AST.
 * The statement parsers (bodies; for/if/set/macro/call/filter/with) are in tmpl_stmt.c; the
 * parser state and the token helpers both files use are in tmpl_int.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tmpl_int.h"

int perr(struct parser *P, const char *fmt, ...)
{
    if (P->errlen && P->err[0] == 0) {
        va_list ap;
        va_start(ap, fmt);
        tmpl_verr(P->err, P->errlen, P->i < P->n ? P->t[P->i].line : P->t[P->n - 1].line, fmt,
                  ap);
        va_end(ap);
    }
    return -EINVAL;
}

int nvec_push(struct parser *P, struct nvec *v, struct tnode *x)
{
    if (x == NULL)
        return -ENOMEM;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        struct tnode **p = tarena_alloc(P->a, cap * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        if (v->n)
            memcpy(p, v->v, v->n * sizeof(*p));
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}
int svec_push(struct parser *P, struct svec *v, const char *s, size_t l)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        const char **p = tarena_alloc(P->a, cap * sizeof(*p));
        size_t *q = tarena_alloc(P->a, cap * sizeof(*q));
        if (p == NULL || q == NULL)
            return -ENOMEM;
        if (v->n) {
            memcpy(p, v->s, v->n * sizeof(*p));
            memcpy(q, v->l, v->n * sizeof(*q));
        }
        v->s = p;
        v->l = q;
        v->cap = cap;
    }
    v->s[v->n] = s;
    v->l[v->n++] = l;
    return 0;
}

static int parse_expr_nocond(struct parser *P, struct tnode **out);
static int parse_unary(struct parser *P, struct tnode **out, bool with_filter);
static int parse_primary(struct parser *P, struct tnode **out);
static int parse_postfix(struct parser *P, struct tnode **io);
static int parse_filter_expr(struct parser *P, struct tnode **io);

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

/* call arguments after '(' up to ')': positional in v, keywords in names/w */
static int parse_args(struct parser *P, struct tnode *n)
{
    struct nvec pos = {0}, kwv = {0};
    struct svec kw = {0};
    TRY(expect_op(P, "("));
    while (!is_op(P, ")")) {
        if (pos.n + kwv.n) {
            TRY(expect_op(P, ","));
            if (is_op(P, ")"))
                break;
        }
        if (is_op(P, "*") || is_op(P, "**"))
            return perr(P, "*args / **kwargs in calls are not supported");
        if (cur(P)->type == TK_NAME && P->i + 1 < P->n && P->t[P->i + 1].type == TK_OP &&
            P->t[P->i + 1].n == 1 && P->t[P->i + 1].p[0] == '=') {
            TRY(svec_push(P, &kw, cur(P)->p, cur(P)->n));
            P->i += 2;
            struct tnode *e;
            TRY(parse_expr(P, &e));
            TRY(nvec_push(P, &kwv, e));
        } else {
            if (kwv.n)
                return perr(P, "positional argument after a keyword argument");
            struct tnode *e;
            TRY(parse_expr(P, &e));
            TRY(nvec_push(P, &pos, e));
        }
    }
    P->i++;
    n->v = pos.v;
    n->nv = pos.n;
    n->w = kwv.v;
    n->nw = kwv.n;
    n->names = kw.s;
    n->namelens = kw.l;
    n->nnames = kw.n;
    return 0;
}

/* at '(' after *io: *io becomes the call of *io with those arguments */
static int parse_call(struct parser *P, struct tnode **io)
{
    struct tnode *c = node(P, N_CALL);
    if (c == NULL)
        return -ENOMEM;
    c->a = *io;
    TRY(parse_args(P, c));
    *io = c;
    return 0;
}

/* At the name after '|' or 'is' (what: "filter" or "test"; after: that operator): a node
 * of kind applied to io, named by it, if known() knows the name; past the name. */
static int parse_applied_name(struct parser *P, struct tnode *io, int kind,
                              int (*known)(const char *, size_t), const char *what,
                              const char *after, struct tnode **out)
{
    struct ttoken *t = cur(P);
    if (t->type != TK_NAME)
        return perr(P, "expected a %s name after '%s'", what, after);
    if (!known(t->p, t->n))
        return perr(P, "unsupported %s '%.*s'", what, (int)t->n, t->p);
    struct tnode *n = node(P, kind);
    if (n == NULL)
        return -ENOMEM;
    n->s = t->p;
    n->sn = t->n;
    n->a = io;
    P->i++;
    *out = n;
    return 0;
}

int parse_filter_name(struct parser *P, struct tnode **io)
{
    struct tnode *n;
    TRY(parse_applied_name(P, *io, N_FILTER, tb_known_filter, "filter", "|", &n));
    if (is_op(P, "."))
        return perr(P, "dotted filter names are not supported");
    if (is_op(P, "("))
        TRY(parse_args(P, n));
    *io = n;
    return 0;
}

static int parse_filter(struct parser *P, struct tnode **io)
{
    P->i++; /* '|' */
    return parse_filter_name(P, io);
}

static int parse_test(struct parser *P, struct tnode **io)
{
    /* at 'is' */
    P->i++;
    bool neg = false;
    if (is_name(P, "not")) {
        neg = true;
        P->i++;
    }
    struct tnode *n;
    TRY(parse_applied_name(P, *io, N_TEST, tb_known_test, "test", "is", &n));
    n->op = neg;
    struct ttoken *t = cur(P);
    if (is_op(P, "(")) {
        TRY(parse_args(P, n));
    } else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT ||
                t->type == TK_FLOAT || is_op(P, "[") || is_op(P, "{")) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        struct tnode *arg;
        if (is_name(P, "is"))
            return perr(P, "unexpected 'is'");
        TRY(parse_primary(P, &arg));
        TRY(parse_postfix(P, &arg));
        n->v = tarena_alloc(P->a, sizeof(struct tnode *));
        if (n->v == NULL)
            return -ENOMEM;
        n->v[0] = arg;
        n->nv = 1;
    }
    *io = n;
    return 0;
}

static int parse_filter_expr(struct parser *P, struct tnode **io)
{
    for (;;) {
        if (is_op(P, "|"))
            TRY(parse_filter(P, io));
        else if (is_name(P, "is"))
            TRY(parse_test(P, io));
        else if (is_op(P, "("))
            TRY(parse_call(P, io));
        else
            return 0;
    }
}

static int parse_subscript(struct parser *P, struct tnode **io)
{
    /* at '[' */
    P->i++;
    struct tnode *parts[3] = {NULL, NULL, NULL};
    int np = 0;
    bool slice = false;
    for (;;) {
        if (is_op(P, ":")) {
            slice = true;
            if (++np > 2)
                return perr(P, "bad slice");
            P->i++;
            continue;
        }
        if (is_op(P, "]"))
            break;
        if (parts[np] != NULL)
            return perr(P, "expected ']'");
        TRY(parse_expr(P, &parts[np]));
        if (is_op(P, ","))
            return perr(P, "tuple subscripts are not supported");
    }
    P->i++;
    struct tnode *n;
    if (slice) {
        n = node(P, N_SLICE);
        if (n == NULL)
            return -ENOMEM;
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
    } else {
        if (parts[0] == NULL)
            return perr(P, "empty subscript");
        n = node(P, N_GETITEM);
        if (n == NULL)
            return -ENOMEM;
        n->b = parts[0];
    }
    n->a = *io;
    *io = n;
    return 0;
}

static int parse_postfix(struct parser *P, struct tnode **io)
{
    for (;;) {
        if (is_op(P, ".")) {
            P->i++;
            struct ttoken *t = cur(P);
            struct tnode *n;
            if (t->type == TK_NAME) {
                n = node(P, N_GETATTR);
                if (n == NULL)
                    return -ENOMEM;
                n->s = t->p;
                n->sn = t->n;
                if (t->n >= 2 && t->p[0] == '_' )
                    return perr(P, "access to '%.*s' is unsafe", (int)t->n, t->p);
            } else if (t->type == TK_INT) {
                n = node(P, N_GETITEM);
                if (n == NULL)
                    return -ENOMEM;
                struct tnode *k = node(P, N_CONST);
                if (k == NULL || (k->lit = tv_int(P->a, t->i)) == NULL)
                    return -ENOMEM;
                n->b = k;
            } else {
                return perr(P, "expected a name after '.'");
            }
            n->a = *io;
            P->i++;
            *io = n;
        } else if (is_op(P, "[")) {
            TRY(parse_subscript(P, io));
        } else if (is_op(P, "(")) {
            TRY(parse_call(P, io));
        } else {
            return 0;
        }
    }
}

/* At an opening bracket: the expressions up to close, separated by commas (a trailing one
 * allowed), into items, and past close; *comma tells whether any comma was seen. */
static int parse_items(struct parser *P, const char *close, struct nvec *items, bool *comma)
{
    P->i++;
    *comma = false;
    while (!is_op(P, close)) {
        if (items->n) {
            TRY(expect_op(P, ","));
            *comma = true;
            if (is_op(P, close))
                break;
        }
        struct tnode *e;
        TRY(parse_expr(P, &e));
        TRY(nvec_push(P, items, e));
    }
    P->i++;
    return 0;
}

/* a node of kind (N_TUPLE, N_LIST) holding items */
static int seq_node(struct parser *P, int kind, const struct nvec *items, struct tnode **out)
{
    struct tnode *n = node(P, kind);
    if (n == NULL)
        return -ENOMEM;
    n->v = items->v;
    n->nv = items->n;
    *out = n;
    return 0;
}

/* ( ... ) after '(' was seen: a parenthesized expression or a tuple */
static int parse_paren(struct parser *P, struct tnode **out)
{
    struct nvec items = {0};
    bool comma;
    TRY(parse_items(P, ")", &items, &comma));
    if (items.n == 1 && !comma) {
        *out = items.v[0];
        return 0;
    }
    return seq_node(P, N_TUPLE, &items, out);
}

static int parse_primary(struct parser *P, struct tnode **out)
{
    struct ttoken *t = cur(P);
    struct tnode *n;
    if (++P->depth > MAX_NEST)
        return perr(P, "expression nested too deep");
    switch (t->type) {
    case TK_NAME: {
        n = node(P, N_CONST);
        if (n == NULL)
            return -ENOMEM;
        if (tok_is_name(t, "true") || tok_is_name(t, "True"))
            n->lit = &tv_true_const;
        else if (tok_is_name(t, "false") || tok_is_name(t, "False"))
            n->lit = &tv_false_const;
        else if (tok_is_name(t, "none") || tok_is_name(t, "None"))
            n->lit = &tv_none_const;
        else {
            for (size_t k = 0; k < sizeof(reserved) / sizeof(reserved[0]); k++)
                if (tok_is_name(t, reserved[k]))
                    return perr(P, "unexpected '%s'", reserved[k]);
            n->kind = N_NAME;
            n->s = t->p;
            n->sn = t->n;
            if (P->macro && t->n == 7 && memcmp(t->p, "varargs", 7) == 0)
                P->macro->flag = 1;
        }
        P->i++;
        break;
    }
    case TK_STRING: {
        /* adjacent literals are one string */
        struct tbuf b = {.a = P->a};
        while (cur(P)->type == TK_STRING) {
            tbuf_put(&b, cur(P)->p, cur(P)->n);
            P->i++;
        }
        if (b.err)
            return b.err;
        n = node(P, N_CONST);
        if (n == NULL || (n->lit = tv_str_nocopy(P->a, b.p ? b.p : "", b.n)) == NULL)
            return -ENOMEM;
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        n = node(P, N_CONST);
        if (n == NULL)
            return -ENOMEM;
        n->lit = t->type == TK_INT ? tv_int(P->a, t->i) : tv_float(P->a, t->d);
        if (n->lit == NULL)
            return -ENOMEM;
        P->i++;
        break;
    case TK_OP:
        if (is_op(P, "(")) {
            TRY(parse_paren(P, &n));
        } else if (is_op(P, "[")) {
            struct nvec items = {0};
            bool comma;
            TRY(parse_items(P, "]", &items, &comma));
            TRY(seq_node(P, N_LIST, &items, &n));
        } else if (is_op(P, "{")) {
            P->i++;
            struct nvec keys = {0}, vals = {0};
            while (!is_op(P, "}")) {
                if (keys.n) {
                    TRY(expect_op(P, ","));
                    if (is_op(P, "}"))
                        break;
                }
                struct tnode *k, *v;
                TRY(parse_expr(P, &k));
                TRY(expect_op(P, ":"));
                TRY(parse_expr(P, &v));
                TRY(nvec_push(P, &keys, k));
                TRY(nvec_push(P, &vals, v));
            }
            P->i++;
            n = node(P, N_DICT);
            if (n == NULL)
                return -ENOMEM;
            n->v = keys.v;
            n->nv = keys.n;
            n->w = vals.v;
            n->nw = vals.n;
        } else {
            return perr(P, "unexpected '%.*s'", (int)t->n, t->p);
        }
        break;
    case TK_VAR_END:
    case TK_BLOCK_END:
    case TK_EOF:
        return perr(P, "unexpected end of expression");
    default:
        return perr(P, "unexpected token");
    }
    P->depth--;
    *out = n;
    return 0;
}

static int parse_unary(struct parser *P, struct tnode **out, bool with_filter)
{
    struct tnode *n;
    if (++P->depth > MAX_NEST)
        return perr(P, "expression nested too deep");
    if (is_op(P, "-") || is_op(P, "+")) {
        bool neg = is_op(P, "-");
        n = node(P, neg ? N_NEG : N_POS);
        if (n == NULL)
            return -ENOMEM;
        P->i++;
        TRY(parse_unary(P, &n->a, false));
    } else {
        TRY(parse_primary(P, &n));
        TRY(parse_postfix(P, &n));
    }
    if (with_filter)
        TRY(parse_filter_expr(P, &n));
    P->depth--;
    *out = n;
    return 0;
}

/* One step of a left-associative level: at a binary operator, steps past it, parses the right
 * operand with sub (the next tighter level) and makes *io the node (*io op rhs) of kind. The
 * node is made after its right operand, so it takes the line the operand ends on. */
static int binop(struct parser *P, struct tnode **io, int kind, int op,
                 int (*sub)(struct parser *, struct tnode **))
{
    P->i++;
    struct tnode *rhs;
    TRY(sub(P, &rhs));
    struct tnode *n = node(P, kind);
    if (n == NULL)
        return -ENOMEM;
    n->op = (uint8_t)op;
    n->a = *io;
    n->b = rhs;
    *io = n;
    return 0;
}

/* a unary operand with its filters and tests: the operand of ** (binop's sub) */
static int parse_unary_filtered(struct parser *P, struct tnode **out)
{
    return parse_unary(P, out, true);
}

static int parse_pow(struct parser *P, struct tnode **out)
{
    TRY(parse_unary_filtered(P, out));
    while (is_op(P, "**"))
        TRY(binop(P, out, N_BINOP, OP_POW, parse_unary_filtered));
    return 0;
}

static int parse_math2(struct parser *P, struct tnode **out)
{
    TRY(parse_pow(P, out));
    for (;;) {
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV
               : is_op(P, "%") ? OP_MOD : -1;
        if (op < 0)
            return 0;
        TRY(binop(P, out, N_BINOP, op, parse_pow));
    }
}

static int parse_concat(struct parser *P, struct tnode **out)
{
    TRY(parse_math2(P, out));
    while (is_op(P, "~"))
        TRY(binop(P, out, N_CONCAT, 0, parse_math2));
    return 0;
}

static int parse_math1(struct parser *P, struct tnode **out)
{
    TRY(parse_concat(P, out));
    for (;;) {
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : -1;
        if (op < 0)
            return 0;
        TRY(binop(P, out, N_BINOP, op, parse_concat));
    }
}

static int parse_compare(struct parser *P, struct tnode **out)
{
    struct tnode *first;
    TRY(parse_math1(P, &first));
    struct nvec ops = {0};
    uint8_t opv[64];
    for (;;) {
        int op;
        if (is_op(P, "=="))
            op = C_EQ;
        else if (is_op(P, "!="))
            op = C_NE;
        else if (is_op(P, "<"))
            op = C_LT;
        else if (is_op(P, "<="))
            op = C_LE;
        else if (is_op(P, ">"))
            op = C_GT;
        else if (is_op(P, ">="))
            op = C_GE;
        else if (is_name(P, "in"))
            op = C_IN;
        else if (is_name(P, "not") && P->i + 1 < P->n && tok_is_name(&P->t[P->i + 1], "in")) {
            op = C_NOTIN;
            P->i++;
        } else
            break;
        P->i++;
        if (ops.n >= sizeof(opv))
            return perr(P, "comparison chain too long");
        struct tnode *r;
        TRY(parse_math1(P, &r));
        opv[ops.n] = (uint8_t)op;
        TRY(nvec_push(P, &ops, r));
    }
    if (ops.n == 0) {
        *out = first;
        return 0;
    }
    struct tnode *n = node(P, N_COMPARE);
    if (n == NULL)
        return -ENOMEM;
    n->a = first;
    n->v = ops.v;
    n->nv = ops.n;
    n->cmpops = tarena_alloc(P->a, ops.n);
    if (n->cmpops == NULL)
        return -ENOMEM;
    memcpy(n->cmpops, opv, ops.n);
    *out = n;
    return 0;
}

static int parse_not(struct parser *P, struct tnode **out)
{
    if (is_name(P, "not")) {
        if (++P->depth > MAX_NEST)
            return perr(P, "expression nested too deep");
        struct tnode *n = node(P, N_NOT);
        if (n == NULL)
            return -ENOMEM;
        P->i++;
        TRY(parse_not(P, &n->a));
        P->depth--;
        *out = n;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(struct parser *P, struct tnode **out)
{
    TRY(parse_not(P, out));
    while (is_name(P, "and"))
        TRY(binop(P, out, N_AND, 0, parse_not));
    return 0;
}

static int parse_or(struct parser *P, struct tnode **out)
{
    TRY(parse_and(P, out));
    while (is_name(P, "or"))
        TRY(binop(P, out, N_OR, 0, parse_and));
    return 0;
}

static int parse_expr_nocond(struct parser *P, struct tnode **out)
{
    return parse_or(P, out);
}

int parse_expr(struct parser *P, struct tnode **out)
{
    if (++P->depth > MAX_NEST)
        return perr(P, "expression nested too deep");
    TRY(parse_or(P, out));
    while (is_name(P, "if")) {
        P->i++;
        struct tnode *n = node(P, N_COND);
        if (n == NULL)
            return -ENOMEM;
        n->a = *out;
        TRY(parse_or(P, &n->b));
        if (is_name(P, "else")) {
            P->i++;
            TRY(parse_expr(P, &n->c));
        }
        *out = n;
    }
    P->depth--;
    return 0;
}

/* an expression or an unparenthesized tuple (a, b) */
int parse_tuple(struct parser *P, struct tnode **out, bool cond)
{
    struct nvec items = {0};
    for (;;) {
        struct tnode *e;
        TRY(cond ? parse_expr(P, &e) : parse_expr_nocond(P, &e));
        TRY(nvec_push(P, &items, e));
        if (!is_op(P, ","))
            break;
        P->i++;
        struct ttoken *t = cur(P);
        if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || is_op(P, "=") ||
            is_name(P, "in") || is_name(P, "if"))
            break;
    }
    if (items.n == 1 && !(P->i > 0 && P->t[P->i - 1].type == TK_OP && P->t[P->i - 1].p[0] == ',')) {
        *out = items.v[0];
        return 0;
    }
    return seq_node(P, N_TUPLE, &items, out);
}

/* ---- tree height ----
 * The parser's loops build left-deep chains (a.b.c..., 1+1+1..., x|f|f...) that no recursion
 * counter sees, and a render walks the tree recursively: refuse trees taller than MAX_HEIGHT
 * here, with an explicit stack (this pass must not recurse either). */
#define MAX_HEIGHT 256

static struct tnode *child(const struct tnode *n, size_t k)
{
    struct tnode *fixed[4] = {n->a, n->b, n->c, n->d};
    if (k < 4)
        return fixed[k];
    k -= 4;
    if (k < n->nv)
        return n->v[k];
    k -= n->nv;
    if (k < n->nw)
        return n->w[k];
    return NULL;
}

static int check_height(struct parser *P, struct tnode *root)
{
    struct hf {
        struct tnode *n;
        size_t k;
        int h;
    };
    size_t cap = P->nodes + 2;
    struct hf *st = malloc(cap * sizeof(*st));
    if (st == NULL)
        return -ENOMEM;
    size_t sp = 0;
    int rc = 0;
    st[sp++] = (struct hf){root, 0, 0};
    while (sp && rc == 0) {
        struct hf *f = &st[sp - 1];
        size_t total = 4 + f->n->nv + f->n->nw;
        struct tnode *c = NULL;
        while (f->k < total && (c = child(f->n, f->k)) == NULL)
            f->k++;
        if (f->k >= total) { /* done: report height to the parent */
            int h = f->h + 1;
            sp--;
            if (sp && st[sp - 1].h < h)
                st[sp - 1].h = h;
            continue;
        }
        f->k++;
        if (sp > MAX_HEIGHT) {
            rc = -EINVAL;
            if (P->errlen && P->err[0] == 0)
                snprintf(P->err, P->errlen, "line %d: template nested too deep (more than %d levels)",
                         c->line, MAX_HEIGHT);
            break;
        }
        if (sp >= cap) { /* a node reached twice cannot happen in a tree; stay safe */
            rc = -EINVAL;
            break;
        }
        st[sp++] = (struct hf){c, 0, 0};
    }
    free(st);
    return rc;
}

/* ---- content format detection (vLLM _detect_content_format) ---- */
struct nlist {
    struct tnode **v;
    size_t n;
};

/* appends the nodes of a kind under n to out (out->v NULL: only counts them in out->n) */
static void collect(struct tnode *n, int kind, struct nlist *out)
{
    if (n == NULL)
        return;
    if (n->kind == kind) {
        if (out->v)
            out->v[out->n] = n;
        out->n++;
    }
    collect(n->a, kind, out);
    collect(n->b, kind, out);
    collect(n->c, kind, out);
    collect(n->d, kind, out);
    for (size_t i = 0; i < n->nv; i++)
        collect(n->v[i], kind, out);
    for (size_t i = 0; i < n->nw; i++)
        collect(n->w[i], kind, out);
}

static bool name_is(const struct tnode *n, const char *s, size_t sl)
{
    return n && n->kind == N_NAME && n->sn == sl && memcmp(n->s, s, sl) == 0;
}

/* _is_var_or_elems_access(node, varname, key) */
static bool var_or_elems(const struct tnode *n, const char *v, size_t vl, const char *key)
{
    if (n == NULL)
        return false;
    if (n->kind == N_FILTER || n->kind == N_TEST)
        return var_or_elems(n->a, v, vl, key);
    if (n->kind == N_SLICE)
        return var_or_elems(n->a, v, vl, key);
    if (key) {
        size_t kl = strlen(key);
        if (n->kind == N_GETITEM && n->b && n->b->kind == N_CONST && n->b->lit->type == TV_STR)
            return name_is(n->a, v, vl) && n->b->lit->u.s.n == kl &&
                   memcmp(n->b->lit->u.s.p, key, kl) == 0;
        if (n->kind == N_GETATTR)
            return name_is(n->a, v, vl) && n->sn == kl && memcmp(n->s, key, kl) == 0;
        return false;
    }
    return name_is(n, v, vl);
}

static int detect_parts(struct parser *P, struct tnode *root)
{
    struct nlist sets = {0}, fors = {0};
    collect(root, N_SET, &sets);
    collect(root, N_FOR, &fors);
    sets.v = tarena_alloc(P->a, (sets.n + 1) * sizeof(void *));
    fors.v = tarena_alloc(P->a, (fors.n + 1) * sizeof(void *));
    if (sets.v == NULL || fors.v == NULL)
        return 0;
    sets.n = fors.n = 0;
    collect(root, N_SET, &sets);
    collect(root, N_FOR, &fors);
    /* names bound to messages (or its elements through slices/filters) */
    const char *mv[64];
    size_t ml[64], nm = 0;
    mv[nm] = "messages";
    ml[nm++] = 8;
    for (size_t q = 0; q < nm; q++)
        for (size_t i = 0; i < sets.n && nm < 64; i++) {
            struct tnode *s = sets.v[i];
            if (s->nnames != 1 || !var_or_elems(s->a, mv[q], ml[q], NULL))
                continue;
            bool seen = false;
            for (size_t k = 0; k < nm; k++)
                seen |= ml[k] == s->namelens[0] && memcmp(mv[k], s->names[0], ml[k]) == 0;
            if (!seen) {
                mv[nm] = s->names[0];
                ml[nm++] = s->namelens[0];
            }
        }
    /* loop variables over messages */
    const char *lv[64];
    size_t ll[64], nl = 0;
    for (size_t i = 0; i < fors.n && nl < 64; i++)
        for (size_t q = 0; q < nm; q++)
            if (fors.v[i]->nnames == 1 && var_or_elems(fors.v[i]->a, mv[q], ml[q], NULL)) {
                lv[nl] = fors.v[i]->names[0];
                ll[nl++] = fors.v[i]->namelens[0];
                break;
            }
    for (size_t i = 0; i < fors.n; i++)
        for (size_t q = 0; q < nl; q++)
            if (var_or_elems(fors.v[i]->a, lv[q], ll[q], "content"))
                return 1;
    return 0;
}

int kvr_tmpl_compile(const char *src, size_t len, kvr_tmpl **out, char *err, size_t errlen)
{
    *out = NULL;
    if (errlen)
        err[0] = 0;
    kvr_tmpl *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    t->arena.max = 64u << 20;
    /* Jinja2 normalizes newlines to \n and drops one trailing newline */
    char *s = tarena_alloc(&t->arena, len + 1);
    int rc = -ENOMEM;
    if (s == NULL)
        goto fail;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    struct ttokens toks = {0};
    rc = tmpl_lex(s, n, &t->arena, &toks, err, errlen);
    if (rc)
        goto fail;
    struct parser P = {.t = toks.v, .n = toks.n, .a = &t->arena, .err = err, .errlen = errlen};
    struct nvec body = {0};
    rc = parse_body(&P, NULL, &body, NULL);
    if (rc)
        goto fail;
    t->root = node(&P, N_WITH);
    if (t->root == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    t->root->v = body.v;
    t->root->nv = body.n;
    rc = check_height(&P, t->root);
    if (rc)
        goto fail;
    t->content_parts = detect_parts(&P, t->root);
    *out = t;
    return 0;
fail:
    if (rc == -ENOMEM && errlen && err[0] == 0)
        snprintf(err, errlen, "out of memory compiling the template");
    tarena_free(&t->arena);
    free(t);
    return rc;
}

void kvr_tmpl_free(kvr_tmpl *t)
{
    if (t == NULL)
        return;
    tarena_free(&t->arena);
    free(t);
}

int kvr_tmpl_content_is_parts(const kvr_tmpl *t)
{
    return t->content_parts;
}
