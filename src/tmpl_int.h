/* tmpl_int.h — private structures of the tmpl module, shared by its parts:
 *   tmpl_val.c      arena, values, Python-compatible str()/repr()/json/compare
 *   tmpl_lex.c      source -> tokens (Jinja2's whitespace control applied here)
 *   tmpl_parse.c    tokens -> AST (compile), the content-format detector
 *   tmpl_render.c   AST evaluation: statements, expressions, scopes, limits
 *   tmpl_builtin.c  filters, tests, methods, globals
 * The AST and its literal values belong to the compiled template and are never written
 * during a render; everything a render makes lives in the ctx arena.
 */
#ifndef KVR_TMPL_INT_H
#define KVR_TMPL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tmpl.h"

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
    const char *key_sep;  /* ": " */
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
/* attribute lookup as Jinja2's sandboxed getattr: methods of str/dict, keys of dicts */
tval *tb_getattr(struct trender *r, tval *obj, const char *name, size_t nn);
int tb_known_filter(const char *name, size_t nn);
int tb_known_test(const char *name, size_t nn);
enum { F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME };
int tb_global(const char *name, size_t nn);

int terr(struct trender *r, const struct tnode *n, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* invoke a macro value (tmpl_render.c) */
int tr_call_macro(struct trender *r, const struct tnode *at, tval *m, tval **args,
                  size_t nargs, const char **kn, size_t *knl, tval **kv, size_t nkw,
                  tval **out);
int tr_count_iter(struct trender *r, const struct tnode *n);

#endif
