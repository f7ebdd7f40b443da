/* tmpl_stmt.c — the statement half of the parser: template bodies (data, `{{ }}` and `{% %}`
 * tags up to an end tag) and each statement the subset has: for (targets, loop filter, else),
 * if/elif/else, set (a name, a tuple of names, ns.attr, or a block with filters), macro and
 * call blocks (parameters with defaults), filter blocks, with, break/continue inside a loop.
 * Any other tag is refused with its line. Split from tmpl_parse.c, which parses the
 * expressions these statements hold and runs the compile; the two share the parser state and
 * its token helpers through tmpl_int.h. Runs only inside kvr_tmpl_compile, on its caller's
 * thread.
 */
#include <errno.h>

#include "text/tmpl_int.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int block_end(struct parser *P)
{
    if (cur(P)->type != TK_BLOCK_END)
        return perr(P, "expected '%%}'");
    P->i++;
    return 0;
}

/* names: a, b, c (targets of for/set) */
static int parse_targets(struct parser *P, struct svec *sv)
{
    for (;;) {
        bool paren = is_op(P, "(");
        if (paren)
            P->i++;
        struct ttoken *t = cur(P);
        if (t->type != TK_NAME)
            return perr(P, "expected a variable name");
        for (size_t k = 0; k < sizeof(reserved) / sizeof(reserved[0]); k++)
            if (tok_is_name(t, reserved[k]))
                return perr(P, "cannot assign to '%s'", reserved[k]);
        TRY(svec_push(P, sv, t->p, t->n));
        P->i++;
        if (paren) {
            while (is_op(P, ",")) {
                P->i++;
                t = cur(P);
                if (t->type != TK_NAME)
                    return perr(P, "expected a variable name");
                TRY(svec_push(P, sv, t->p, t->n));
                P->i++;
            }
            TRY(expect_op(P, ")"));
        }
        if (!is_op(P, ","))
            return 0;
        P->i++;
    }
}

static int parse_stmt(struct parser *P, struct nvec *body);

int parse_body(struct parser *P, const char *const *ends, struct nvec *body, int *which)
{
    if (++P->depth > MAX_NEST)
        return perr(P, "statements nested too deep");
    for (;;) {
        struct ttoken *t = cur(P);
        if (t->type == TK_EOF) {
            if (ends)
                return perr(P, "unexpected end of template, expected '%s'", ends[0]);
            P->depth--;
            return 0;
        }
        if (t->type == TK_BLOCK_BEGIN && ends && P->t[P->i + 1].type == TK_NAME) {
            for (int k = 0; ends[k]; k++)
                if (tok_is_name(&P->t[P->i + 1], ends[k])) {
                    P->i += 2;
                    *which = k;
                    P->depth--;
                    return 0;
                }
        }
        TRY(parse_stmt(P, body));
    }
}

static int parse_for(struct parser *P, struct tnode *n)
{
    struct svec tg = {0};
    TRY(parse_targets(P, &tg));
    n->names = tg.s;
    n->namelens = tg.l;
    n->nnames = tg.n;
    if (!is_name(P, "in"))
        return perr(P, "expected 'in' in a for loop");
    P->i++;
    TRY(parse_tuple(P, &n->a, false));
    if (is_name(P, "if")) {
        P->i++;
        TRY(parse_expr(P, &n->b));
    }
    if (is_name(P, "recursive"))
        return perr(P, "recursive loops are not supported");
    TRY(block_end(P));
    static const char *const ends[] = {"endfor", "else", NULL};
    struct nvec body = {0}, els = {0};
    int which;
    P->loops++;
    TRY(parse_body(P, ends, &body, &which));
    P->loops--;
    TRY(block_end(P));
    if (which == 1) {
        static const char *const ends2[] = {"endfor", NULL};
        TRY(parse_body(P, ends2, &els, &which));
        TRY(block_end(P));
    }
    n->v = body.v;
    n->nv = body.n;
    n->w = els.v;
    n->nw = els.n;
    return 0;
}

static int parse_if(struct parser *P, struct tnode *n)
{
    TRY(parse_tuple(P, &n->a, true));
    TRY(block_end(P));
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    struct nvec body = {0}, els = {0};
    int which;
    TRY(parse_body(P, ends, &body, &which));
    n->v = body.v;
    n->nv = body.n;
    if (which == 1) {
        struct tnode *e = node(P, N_IF);
        if (e == NULL)
            return -ENOMEM;
        TRY(parse_if(P, e));
        TRY(nvec_push(P, &els, e));
    } else {
        TRY(block_end(P));
        if (which == 2) {
            static const char *const ends2[] = {"endif", NULL};
            TRY(parse_body(P, ends2, &els, &which));
            TRY(block_end(P));
        }
    }
    n->w = els.v;
    n->nw = els.n;
    return 0;
}

/* a filter chain `name(args)|name...` from the first name, applied to a placeholder
 * (a = NULL: the block's output) */
static int parse_filter_chain(struct parser *P, struct tnode **io)
{
    struct tnode *x = NULL;
    for (;;) {
        TRY(parse_filter_name(P, &x));
        if (!is_op(P, "|"))
            break;
        P->i++;
    }
    *io = x;
    return 0;
}

static int parse_macro_params(struct parser *P, struct tnode *n)
{
    static struct tnode placeholder;
    struct svec names = {0};
    struct nvec defs = {0};
    TRY(expect_op(P, "("));
    while (!is_op(P, ")")) {
        if (names.n) {
            TRY(expect_op(P, ","));
            if (is_op(P, ")"))
                break;
        }
        struct ttoken *t = cur(P);
        if (t->type != TK_NAME)
            return perr(P, "expected a parameter name");
        TRY(svec_push(P, &names, t->p, t->n));
        P->i++;
        struct tnode *d = NULL;
        if (is_op(P, "=")) {
            P->i++;
            TRY(parse_expr(P, &d));
        } else if (defs.n && defs.v[defs.n - 1] != NULL) {
            return perr(P, "parameter without a default after one with a default");
        }
        TRY(nvec_push(P, &defs, &placeholder));
        defs.v[defs.n - 1] = d; /* NULL: no default */
    }
    P->i++;
    n->names = names.s;
    n->namelens = names.l;
    n->nnames = names.n;
    n->w = defs.v;
    n->nw = defs.n;
    return 0;
}

/* The body of a block statement that has one end tag ({% endset %}, {% endfilter %}, ...),
 * up to that tag; the caller ends the tag's block (endmacro may carry a name first). */
static int body_until(struct parser *P, const char *end, struct nvec *out)
{
    const char *const ends[] = {end, NULL};
    int which;
    return parse_body(P, ends, out, &which);
}

/* `%}`, the body up to {% end %}, and the end tag's `%}`: the block statements whose body
 * follows their opening tag directly (set block, filter, with); the body goes to n->v. */
static int body_into(struct parser *P, struct tnode *n, const char *end)
{
    struct nvec b = {0};
    TRY(block_end(P));
    TRY(body_until(P, end, &b));
    TRY(block_end(P));
    n->v = b.v;
    n->nv = b.n;
    return 0;
}

/* A macro's or call block's body: parsed as macro m, with no loop of the outer body open
 * (loop controls and caller() resolve against m). */
static int macro_body(struct parser *P, struct tnode *m, const char *end, struct nvec *out)
{
    struct tnode *outer = P->macro;
    int loops = P->loops;
    P->macro = m;
    P->loops = 0;
    int rc = body_until(P, end, out);
    P->macro = outer;
    P->loops = loops;
    return rc;
}

static int parse_stmt(struct parser *P, struct nvec *body)
{
    struct ttoken *t = cur(P);
    struct tnode *n;
    if (t->type == TK_DATA) {
        n = node(P, N_DATA);
        if (n == NULL)
            return -ENOMEM;
        n->s = t->p;
        n->sn = t->n;
        P->i++;
        return nvec_push(P, body, n);
    }
    if (t->type == TK_VAR_BEGIN) {
        P->i++;
        n = node(P, N_OUTPUT);
        if (n == NULL)
            return -ENOMEM;
        TRY(parse_tuple(P, &n->a, true));
        if (cur(P)->type != TK_VAR_END)
            return perr(P, "expected '}}'");
        P->i++;
        return nvec_push(P, body, n);
    }
    if (t->type != TK_BLOCK_BEGIN)
        return perr(P, "unexpected token");
    P->i++;
    t = cur(P);
    if (t->type != TK_NAME)
        return perr(P, "expected a statement name after '{%%'");
    P->i++;
    if (tok_is_name(t, "for")) {
        n = node(P, N_FOR);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        TRY(parse_for(P, n));
    } else if (tok_is_name(t, "if")) {
        n = node(P, N_IF);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        TRY(parse_if(P, n));
    } else if (tok_is_name(t, "set")) {
        n = node(P, N_SET);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        struct ttoken *nm = cur(P);
        if (nm->type == TK_NAME && P->t[P->i + 1].type == TK_OP && P->t[P->i + 1].n == 1 &&
            P->t[P->i + 1].p[0] == '.') {
            /* ns.attr = expr */
            n->kind = N_SET_ATTR;
            n->s = nm->p;
            n->sn = nm->n;
            P->i += 2;
            if (cur(P)->type != TK_NAME)
                return perr(P, "expected an attribute name");
            n->names = tarena_alloc(P->a, sizeof(char *));
            n->namelens = tarena_alloc(P->a, sizeof(size_t));
            if (n->names == NULL || n->namelens == NULL)
                return -ENOMEM;
            n->names[0] = cur(P)->p;
            n->namelens[0] = cur(P)->n;
            n->nnames = 1;
            P->i++;
            TRY(expect_op(P, "="));
            TRY(parse_tuple(P, &n->a, true));
            TRY(block_end(P));
        } else {
            struct svec tg = {0};
            TRY(parse_targets(P, &tg));
            n->names = tg.s;
            n->namelens = tg.l;
            n->nnames = tg.n;
            if (is_op(P, "=")) {
                P->i++;
                TRY(parse_tuple(P, &n->a, true));
                TRY(block_end(P));
            } else {
                if (tg.n != 1)
                    return perr(P, "a block set assigns one name");
                n->kind = N_SET_BLOCK;
                if (is_op(P, "|")) {
                    P->i++;
                    TRY(parse_filter_chain(P, &n->a));
                }
                TRY(body_into(P, n, "endset"));
            }
        }
    } else if (tok_is_name(t, "macro")) {
        n = node(P, N_MACRO);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        if (cur(P)->type != TK_NAME)
            return perr(P, "expected a macro name");
        n->s = cur(P)->p;
        n->sn = cur(P)->n;
        P->i++;
        TRY(parse_macro_params(P, n));
        TRY(block_end(P));
        struct nvec b = {0};
        TRY(macro_body(P, n, "endmacro", &b));
        if (cur(P)->type == TK_NAME)
            P->i++; /* {% endmacro name %} */
        TRY(block_end(P));
        n->v = b.v;
        n->nv = b.n;
    } else if (tok_is_name(t, "call")) {
        n = node(P, N_CALL_BLOCK);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        struct tnode *caller = node(P, N_MACRO);
        if (caller == NULL)
            return -ENOMEM;
        caller->s = "caller";
        caller->sn = 6;
        if (is_op(P, "("))
            TRY(parse_macro_params(P, caller));
        TRY(parse_expr(P, &n->a));
        if (n->a->kind != N_CALL)
            return perr(P, "expected a call after {%% call %%}");
        TRY(block_end(P));
        struct nvec b = {0};
        TRY(macro_body(P, caller, "endcall", &b));
        TRY(block_end(P));
        caller->v = b.v;
        caller->nv = b.n;
        n->b = caller;
    } else if (tok_is_name(t, "filter")) {
        n = node(P, N_FILTER_BLOCK);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        TRY(parse_filter_chain(P, &n->a));
        TRY(body_into(P, n, "endfilter"));
    } else if (tok_is_name(t, "with")) {
        n = node(P, N_WITH);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        struct svec names = {0};
        struct nvec vals = {0};
        while (cur(P)->type != TK_BLOCK_END) {
            if (names.n)
                TRY(expect_op(P, ","));
            if (cur(P)->type != TK_NAME)
                return perr(P, "expected a name in 'with'");
            TRY(svec_push(P, &names, cur(P)->p, cur(P)->n));
            P->i++;
            TRY(expect_op(P, "="));
            struct tnode *e;
            TRY(parse_expr(P, &e));
            TRY(nvec_push(P, &vals, e));
        }
        TRY(body_into(P, n, "endwith"));
        n->names = names.s;
        n->namelens = names.l;
        n->nnames = names.n;
        n->w = vals.v;
        n->nw = vals.n;
    } else if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        if (P->loops == 0)
            return perr(P, "'%.*s' outside a loop", (int)t->n, t->p);
        n = node(P, tok_is_name(t, "break") ? N_BREAK : N_CONTINUE);
        if (n == NULL)
            return -ENOMEM;
        n->line = t->line;
        TRY(block_end(P));
    } else {
        P->i--;
        return perr(P, "'%.*s' is not supported (or is an unmatched end tag)", (int)t->n, t->p);
    }
    return nvec_push(P, body, n);
}
