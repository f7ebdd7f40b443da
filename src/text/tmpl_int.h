/* tmpl_int.h — private structures of the tmpl module, shared by its parts:
 *   tmpl_val.c      arena, values, Python-compatible str()/repr()/json/compare, the
 *                   "line N: " form of every error message (tmpl_verr)
 *   tmpl_lex.c      source -> tokens (Jinja2's whitespace control applied here)
 *   tmpl_parse.c    tokens -> AST (compile): expressions, the height check, the content-format
 *                   detector
 *   tmpl_stmt.c     the statement parsers ({% for/if/set/macro/call/filter/with %}, bodies)
 *   tmpl_render.c   AST evaluation: statements, expressions, scopes, limits
 *   tmpl_builtin.c  filters, tests, attributes, dict/list methods, globals
 *   tmpl_str.c      str methods, case mapping, `%` formatting, Markup
 * The AST and its literal values belong to the compiled template and are never written
 * during a render; everything a render makes lives in the ctx arena.
 */
#ifndef KVR_TMPL_INT_H
#define KVR_TMPL_INT_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "text/tmpl.h"

/* The module's internal functions are global across its files: they link as kvr_tmpl_*
 * (house style: every exported name carries the module prefix) and read short here. */
#define tb_call_str_method kvr_tmpl_tb_call_str_method
#define tb_case_map kvr_tmpl_tb_case_map
#define tb_cp_lower kvr_tmpl_tb_cp_lower
#define tb_cp_upper kvr_tmpl_tb_cp_upper
#define tb_splitlines kvr_tmpl_tb_splitlines
#define tb_title_filter kvr_tmpl_tb_title_filter
#define tb_to_items kvr_tmpl_tb_to_items
#define nvec_push kvr_tmpl_nvec_push
#define parse_body kvr_tmpl_parse_body
#define parse_expr kvr_tmpl_parse_expr
#define parse_filter_name kvr_tmpl_parse_filter_name
#define parse_tuple kvr_tmpl_parse_tuple
#define perr kvr_tmpl_perr
#define svec_push kvr_tmpl_svec_push
#define tarena_alloc kvr_tmpl_tarena_alloc
#define tarena_free kvr_tmpl_tarena_free
#define tarena_reset kvr_tmpl_tarena_reset
#define tarena_strdup kvr_tmpl_tarena_strdup
#define tb_call kvr_tmpl_tb_call
#define tb_filter kvr_tmpl_tb_filter
#define tb_format kvr_tmpl_tb_format
#define tb_getattr kvr_tmpl_tb_getattr
#define tb_global kvr_tmpl_tb_global
#define tb_known_filter kvr_tmpl_tb_known_filter
#define tb_known_test kvr_tmpl_tb_known_test
#define tb_markup kvr_tmpl_tb_markup
#define tb_test kvr_tmpl_tb_test
#define tbuf_put kvr_tmpl_tbuf_put
#define tbuf_putc kvr_tmpl_tbuf_putc
#define terr kvr_tmpl_terr
#define tmpl_lex kvr_tmpl_tmpl_lex
#define tmpl_verr kvr_tmpl_tmpl_verr
#define tr_call_macro kvr_tmpl_tr_call_macro
#define tr_count_iter kvr_tmpl_tr_count_iter
#define tu8_dec kvr_tmpl_tu8_dec
#define tu8_enc kvr_tmpl_tu8_enc
#define tu8_len kvr_tmpl_tu8_len
#define tu8_next kvr_tmpl_tu8_next
#define tu_isspace kvr_tmpl_tu_isspace
#define tu_strip kvr_tmpl_tu_strip
#define tv_bool kvr_tmpl_tv_bool
#define tv_cmp kvr_tmpl_tv_cmp
#define tv_dict kvr_tmpl_tv_dict
#define tv_dict_get kvr_tmpl_tv_dict_get
#define tv_dict_set kvr_tmpl_tv_dict_set
#define tv_eq kvr_tmpl_tv_eq
#define tv_false_const kvr_tmpl_tv_false_const
#define tv_float kvr_tmpl_tv_float
#define tv_float_repr kvr_tmpl_tv_float_repr
#define tv_html_escape kvr_tmpl_tv_html_escape
#define tv_int kvr_tmpl_tv_int
#define tv_is_num kvr_tmpl_tv_is_num
#define tv_is_str kvr_tmpl_tv_is_str
#define tv_json kvr_tmpl_tv_json
#define tv_list kvr_tmpl_tv_list
#define tv_list_push kvr_tmpl_tv_list_push
#define tv_new kvr_tmpl_tv_new
#define tv_none_const kvr_tmpl_tv_none_const
#define tv_num kvr_tmpl_tv_num
#define tv_repr kvr_tmpl_tv_repr
#define tv_str kvr_tmpl_tv_str
#define tv_str_nocopy kvr_tmpl_tv_str_nocopy
#define tv_to_str kvr_tmpl_tv_to_str
#define tv_true_const kvr_tmpl_tv_true_const
#define tv_truthy kvr_tmpl_tv_truthy
#define tv_typename kvr_tmpl_tv_typename
#define tv_undef kvr_tmpl_tv_undef
#define tv_undef_const kvr_tmpl_tv_undef_const

/* ---- arena ---- */
struct tarena_chunk {
    struct tarena_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};
struct tarena {
    struct tarena_chunk *head;
    size_t total, max; /* bytes held, cap (0 = none) */
};
void *tarena_alloc(struct tarena *a, size_t n);
void tarena_reset(struct tarena *a); /* keeps the first chunk */
void tarena_free(struct tarena *a);
char *tarena_strdup(struct tarena *a, const char *s, size_t n);

/* ---- errors (tmpl_val.c) ----
 * err (errlen bytes; 0: no message) = "line N: " (line < 0: no prefix) and fmt over ap, cut
 * to fit: the one form of the lexer's, the parser's and the render's messages. */
void tmpl_verr(char *err, size_t errlen, int line, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* ---- values ---- */
enum tval_type {
    TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT,
    TV_NS,     /* namespace(): a dict whose attributes may be set */
    TV_MACRO,  /* a macro (or a call block's caller) bound to its defining scope */
    TV_LOOP,   /* the `loop` object of a for loop */
    TV_METHOD, /* a bound method: self + name */
    TV_FUNC,   /* a global function: range, namespace, dict, raise_exception, strftime_now */
    TV_CYCLER, /* loop.cycle */
};

struct tkv {
    const char *k;
    size_t kn;
    struct kvr_tmpl_val *v;
};

struct tnode;
struct tframe;
struct tloop;

struct kvr_tmpl_val {
    uint8_t type;
    uint8_t tuple;  /* TV_LIST: a tuple (repr differs) */
    uint8_t markup; /* TV_STR: a markupsafe.Markup (from |safe): `+` and `%` escape the other
                     * side, repr is Markup('...') */
    union {
        int b;
        int64_t i;
        double d;
        struct { const char *p; size_t n; } s; /* TV_STR; TV_UNDEF: the name/hint (may be NULL) */
        struct { struct kvr_tmpl_val **v; size_t n, cap; } l;
        struct { struct tkv *e; size_t n, cap; } o; /* TV_DICT, TV_NS */
        struct { const struct tnode *node; struct tframe *scope; struct kvr_tmpl_val *caller; } m;
        struct tloop *loop;
        struct { struct kvr_tmpl_val *self; const char *name; } meth;
        int func;
    } u;
    /* TV_UNDEF only: set when using it must fail with this message (sandbox refusals) */
    const char *undef_err;
};
typedef struct kvr_tmpl_val tval;

extern tval tv_undef_const, tv_none_const, tv_true_const, tv_false_const;

struct tbuf {
    char *p;
    size_t n, cap, max; /* max: 0 = unlimited */
    struct tarena *a;   /* NULL: malloc'd (the render output) */
    int err;            /* sticky: -ENOMEM / -E2BIG */
};
void tbuf_put(struct tbuf *b, const char *s, size_t n);
void tbuf_putc(struct tbuf *b, char c);

tval *tv_new(struct tarena *a, int type);
/* an Undefined that names what was missing (name NULL: none); its use fails with the name */
tval *tv_undef(struct tarena *a, const char *name, size_t nn);
tval *tv_str(struct tarena *a, const char *s, size_t n); /* copies */
tval *tv_str_nocopy(struct tarena *a, const char *s, size_t n);
tval *tv_int(struct tarena *a, int64_t i);
tval *tv_float(struct tarena *a, double d);
tval *tv_list(struct tarena *a, size_t cap);
tval *tv_dict(struct tarena *a, int type);
int tv_list_push(struct tarena *a, tval *l, tval *v);
int tv_dict_set(struct tarena *a, tval *d, const char *k, size_t kn, tval *v);
tval *tv_dict_get(const tval *d, const char *k, size_t kn);
tval *tv_bool(int b);

bool tv_truthy(const tval *v);
bool tv_is_str(const tval *v);
bool tv_is_num(const tval *v); /* int, float, bool */
double tv_num(const tval *v);
const char *tv_typename(const tval *v);
/* str() and repr() as Python prints them; 0 or -EINVAL (a value that cannot print). */
int tv_to_str(struct tbuf *b, const tval *v);
int tv_repr(struct tbuf *b, const tval *v);
/* markupsafe.escape: & < > ' " */
void tv_html_escape(struct tbuf *b, const char *s, size_t n);
void tv_float_repr(struct tbuf *b, double d);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) */
struct tjson_opt {
    int indent;           /* < 0: None */
    const char *item_sep; /* ", " (or "," with an indent) unless separators= */
    size_t item_sep_n;    /* its length (separators may hold NUL bytes) */
    const char *key_sep;  /* ": " */
    size_t key_sep_n;
    int sort_keys;
    int ascii;            /* ensure_ascii */
};
int tv_json(struct tbuf *b, const tval *v, const struct tjson_opt *o, int level, int depth);
/* Python ==; and ordering: 0 ok with *cmp set, -EINVAL when the types do not order. */
bool tv_eq(const tval *a, const tval *b);
int tv_cmp(const tval *a, const tval *b, int *cmp);
/* UTF-8 helpers */
size_t tu8_len(const char *s, size_t n);                 /* code points */
size_t tu8_next(const char *s, size_t n, size_t i);      /* next boundary after i */
uint32_t tu8_dec(const char *s, size_t n, size_t i, size_t *adv);
void tu8_enc(struct tbuf *b, uint32_t cp);
bool tu_isspace(uint32_t cp);                             /* Python str.isspace() */
/* Python str.strip()/lstrip()/rstrip(); chars NULL = whitespace. mode bit1 left, bit2 right. */
void tu_strip(const char *s, size_t n, const char *chars, size_t cn, int mode, size_t *off,
              size_t *len);

/* ---- lexer ---- */
enum ttok {
    TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP, TK_RAW,
};
struct ttoken {
    uint8_t type;
    int line;
    const char *p; /* TK_DATA/TK_NAME/TK_OP: source text; TK_STRING: decoded (arena) */
    size_t n;
    int64_t i;
    double d;
};
struct ttokens {
    struct ttoken *v;
    size_t n, cap;
};
/* 0, or -EINVAL/-ENOMEM with err filled. src is normalized by the caller ("\n" newlines, one
 * trailing newline dropped). */
int tmpl_lex(const char *src, size_t len, struct tarena *a, struct ttokens *out, char *err,
             size_t errlen);

/* ---- AST ---- */
enum tnode_kind {
    /* statements */
    N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_ATTR, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK,
    N_FILTER_BLOCK, N_BREAK, N_CONTINUE, N_WITH,
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BINOP,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT, N_CONCAT, N_COMPARE,
};
enum tbinop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW };
enum tcmpop { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE, C_IN, C_NOTIN };

struct tnode {
    uint16_t kind;
    uint8_t op;       /* N_BINOP: tbinop; N_TEST: negated */
    uint8_t flag;     /* N_MACRO: uses varargs; N_FOR: has loop filter */
    int line;
    const char *s;    /* a name: N_NAME, N_GETATTR attr, N_FILTER/N_TEST name, N_SET target... */
    size_t sn;
    tval *lit;        /* N_CONST */
    struct tnode *a, *b, *c, *d;
    struct tnode **v; /* bodies, arguments, list items, parameter defaults */
    size_t nv;
    struct tnode **w; /* else bodies, keyword argument values, dict values */
    size_t nw;
    const char **names; /* keyword names, for-targets, set-targets, macro parameters */
    size_t *namelens;
    size_t nnames;
    uint8_t *cmpops;  /* N_COMPARE: one per operand after the first (in v) */
};

struct kvr_tmpl {
    struct tarena arena;
    struct tnode *root; /* a body: kind N_WITH with v/nv as the statements */
    int content_parts;
};

/* ---- parser: tmpl_parse.c (tokens, expressions, compile) and tmpl_stmt.c (statements) ----
 * Only those two files use this section. The token tests, expect_op() and node() are tiny and
 * run for every token or node: static inline, so neither file pays a call into the other. */
#define MAX_NEST 200

struct parser {
    struct ttoken *t;
    size_t n, i;
    struct tarena *a;
    char *err;
    size_t errlen;
    int depth;
    int loops;            /* for-loops around the current statement (break/continue) */
    struct tnode *macro;  /* macro being parsed (varargs detection) */
    size_t nodes;         /* nodes made (sizes the height pass's stack) */
};

/* "line N: ..." into P->err unless an error is already there; returns -EINVAL */
int perr(struct parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static inline struct ttoken *cur(struct parser *P)
{
    return &P->t[P->i];
}

static inline bool is_op(struct parser *P, const char *op)
{
    struct ttoken *t = cur(P);
    size_t l = strlen(op);
    return t->type == TK_OP && t->n == l && memcmp(t->p, op, l) == 0;
}

static inline bool is_name(struct parser *P, const char *name)
{
    struct ttoken *t = cur(P);
    size_t l = strlen(name);
    return t->type == TK_NAME && t->n == l && memcmp(t->p, name, l) == 0;
}

static inline bool tok_is_name(const struct ttoken *t, const char *name)
{
    size_t l = strlen(name);
    return t->type == TK_NAME && t->n == l && memcmp(t->p, name, l) == 0;
}

static inline int expect_op(struct parser *P, const char *op)
{
    if (!is_op(P, op))
        return perr(P, "expected '%s'", op);
    P->i++;
    return 0;
}

static inline struct tnode *node(struct parser *P, int kind)
{
    struct tnode *n = tarena_alloc(P->a, sizeof(*n));
    if (n) {
        P->nodes++;
        memset(n, 0, sizeof(*n));
        n->kind = (uint16_t)kind;
        n->line = cur(P)->line;
    }
    return n;
}

/* growable node vectors */
struct nvec {
    struct tnode **v;
    size_t n, cap;
};
/* appends x (NULL: -ENOMEM, so a failed node() can be pushed unchecked); 0 or -ENOMEM */
int nvec_push(struct parser *P, struct nvec *v, struct tnode *x);
struct svec {
    const char **s;
    size_t *l;
    size_t n, cap;
};
int svec_push(struct parser *P, struct svec *v, const char *s, size_t l);

/* Names an expression may not use and a for/set may not assign to. Static here, not extern,
 * so each user's sizeof(reserved) still counts the table. */
static const char *const reserved[] = {"for", "if", "else", "elif", "in", "is", "and", "or", "not",
                                       "endfor", "endif", "recursive"};

/* tmpl_parse.c: an expression (the conditional `x if c else y` included); an expression or an
 * unparenthesized tuple (cond false: no conditional, as after a for's `in`); a filter name and
 * its arguments applied to *io. tmpl_stmt.c: statements up to one of the end tags (ends NULL:
 * to the end of the template; *which: the index of the tag found, its name consumed, `%}` not).
 * All return 0, -EINVAL (perr filled) or -ENOMEM. */
int parse_expr(struct parser *P, struct tnode **out);
int parse_tuple(struct parser *P, struct tnode **out, bool cond);
int parse_filter_name(struct parser *P, struct tnode **io);
int parse_body(struct parser *P, const char *const *ends, struct nvec *body, int *which);

/* ---- render ---- */
struct tframe {
    struct tframe *parent;
    struct tkv *e;
    size_t n, cap;
};

struct tloop {
    const tval *items;
    size_t i;
    size_t n;
};

struct kvr_tmpl_ctx {
    struct tarena arena;
    struct kvr_tmpl_limits lim;
    struct tbuf out;
    int64_t now;
    bool now_set;
};

struct trender {
    kvr_tmpl_ctx *ctx;
    struct tarena *a;
    const kvr_tmpl *t;
    char *err;
    size_t errlen;
    uint32_t depth;  /* nested macro calls */
    uint32_t frames; /* eval/exec_stmt frames on the stack */
    uint64_t iters;
    int ctl; /* 1 break, 2 continue */
};

/* builtins (tmpl_builtin.c); args already evaluated. Return 0 or an error set via terr. */
int tb_filter(struct trender *r, const struct tnode *n, const char *name, size_t nn, tval *x,
              tval **args, size_t nargs, const char **kn, size_t *knl, tval **kv, size_t nkw,
              tval **out);
int tb_test(struct trender *r, const struct tnode *n, const char *name, size_t nn, tval *x,
            tval **args, size_t nargs, bool *out);
int tb_call(struct trender *r, const struct tnode *n, tval *fn, tval **args, size_t nargs,
            const char **kn, size_t *knl, tval **kv, size_t nkw, tval **out);
/* str % value (printf-style), the subset documented in tmpl_builtin.c */
int tb_format(struct trender *r, const struct tnode *n, tval *fmt, tval *arg, tval **out);
/* a Markup copy of the string s (shares its bytes) */
tval *tb_markup(struct trender *r, tval *s);
/* tmpl_str.c: str methods and case mapping */
uint32_t tb_cp_upper(uint32_t c); /* simple case mapping of one code point (tables there) */
uint32_t tb_cp_lower(uint32_t c);
int tb_call_str_method(struct trender *r, const struct tnode *n, tval *s, const char *m,
                       tval **args, size_t nargs, tval **out);
tval *tb_case_map(struct trender *r, tval *s, int mode); /* 0 lower 1 upper 2 title 3 capitalize */
tval *tb_title_filter(struct trender *r, tval *s);       /* Jinja2's title filter */
void tb_splitlines(const char *s, size_t n, size_t *starts, size_t *lens, size_t *cnt,
                   size_t cap);
/* the items a for loop would see (lists as they are, dict keys, characters) */
int tb_to_items(struct trender *r, const struct tnode *n, tval *x, tval **out);
/* attribute lookup as Jinja2's sandboxed getattr: methods of str/dict, keys of dicts */
tval *tb_getattr(struct trender *r, tval *obj, const char *name, size_t nn);
int tb_known_filter(const char *name, size_t nn);
int tb_known_test(const char *name, size_t nn);
enum { F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME };
int tb_global(const char *name, size_t nn);

int terr(struct trender *r, const struct tnode *n, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Small helpers of the render side (tmpl_render.c, tmpl_builtin.c, tmpl_str.c): static
 * inline here, one definition instead of a copy in each file. */
static inline int oom(struct trender *r, const struct tnode *n)
{
    return terr(r, n, -ENOMEM, "out of memory (render memory cap reached)");
}

static inline bool eqs(const char *a, size_t an, const char *b) /* a[0..an) == b */
{
    size_t bn = strlen(b);
    return an == bn && memcmp(a, b, an) == 0;
}

/* the string built in b (NULL if building it failed) */
static inline tval *mkstr(struct trender *r, struct tbuf *b)
{
    if (b->err)
        return NULL;
    return tv_str_nocopy(r->a, b->p ? b->p : "", b->n);
}

/* 0 when v is a string; else -EINVAL, "<what> must be a string, not <type>" */
static inline int need_str(struct trender *r, const struct tnode *n, tval *v, const char *what)
{
    if (v == NULL || v->type != TV_STR)
        return terr(r, n, -EINVAL, "%s must be a string, not %s", what,
                    v ? tv_typename(v) : "nothing");
    return 0;
}
/* invoke a macro value (tmpl_render.c) */
int tr_call_macro(struct trender *r, const struct tnode *at, tval *m, tval **args,
                  size_t nargs, const char **kn, size_t *knl, tval **kv, size_t nkw,
                  tval **out);
int tr_count_iter(struct trender *r, const struct tnode *n);

#endif
