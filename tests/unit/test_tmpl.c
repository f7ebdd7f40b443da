/* test_tmpl.c — the template engine against Jinja2 itself: tests/data/tmpl/goldens.jsonl holds
 * what Debian's python3-jinja2, configured as transformers configures it, renders for the real
 * chat templates in tests/data/tmpl/NAME.jinja over designed and seeded-random conversations, and
 * for feature templates covering the subset (scripts/tmpl-goldens.py writes it). Outputs must be
 * byte-equal; expected errors must be errors (raise_exception's message byte-equal). Also: the
 * compile-time refusals with their line, the render limits, vLLM's content-format detection,
 * concurrent renders of one compiled template, and random mutations of the real templates
 * (seed printed; KVR_TEST_SEED=N replays) that must fail cleanly or render, never crash.
 *
 * The goldens are read with jtok (strings with their lengths: some hold U+0000, which every
 * template path must keep). Numbers become ints when integral; the goldens use no integral
 * floats in variables.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "http/jtok.h" /* the goldens' reader: strings with their lengths */
#include "text/tmpl.h"

static unsigned test_seed(void)
{
    const char *s = getenv("KVR_TEST_SEED");
    return s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)clock();
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[n] = 0;
        *len = (size_t)n;
    }
    return p;
}

/* A golden's JSON value into a template value. The goldens are read with jtok, not cJSON:
 * their strings may hold U+0000 ("\u0000"), which a C-string JSON library would cut short. */
static kvr_tmpl_val *from_json(kvr_tmpl_ctx *ctx, struct kvr_jtok *j)
{
    int c = kvr_jtok_peek(j), st = 0, rc;
    char *s, *key;
    size_t n, klen;

    if (kvr_jtok_null(j))
        return kvr_tmpl_none(ctx);
    if (c == 't' || c == 'f') {
        bool b;
        assert_int_equal(kvr_jtok_bool(j, &b), 0);
        return kvr_tmpl_bool(ctx, b);
    }
    if (c == '"') {
        assert_int_equal(kvr_jtok_string(j, &s, &n), 0);
        return kvr_tmpl_str(ctx, s, n);
    }
    if (c == '[') {
        kvr_tmpl_val *l = kvr_tmpl_list(ctx);
        while ((rc = kvr_jtok_array_next(j, &st)) == 1) {
            kvr_tmpl_val *v = from_json(ctx, j);
            assert_non_null(v);
            assert_int_equal(kvr_tmpl_list_push(ctx, l, v), 0);
        }
        assert_int_equal(rc, 0);
        return l;
    }
    if (c == '{') {
        kvr_tmpl_val *d = kvr_tmpl_dict(ctx);
        while ((rc = kvr_jtok_object_next(j, &st, &key, &klen)) == 1) {
            kvr_tmpl_val *v = from_json(ctx, j);
            assert_non_null(v);
            assert_int_equal(kvr_tmpl_dict_set(ctx, d, key, klen, v), 0);
        }
        assert_int_equal(rc, 0);
        return d;
    }
    /* a number: an int when integral (as the goldens' Python ints are), else a float */
    char buf[64];
    assert_int_equal(kvr_jtok_number(j, &s, &n), 0);
    assert_true(n < sizeof buf);
    memcpy(buf, s, n);
    buf[n] = '\0';
    double d = strtod(buf, NULL);
    if (d == floor(d) && fabs(d) < 9007199254740992.0)
        return kvr_tmpl_int(ctx, (int64_t)d);
    return kvr_tmpl_double(ctx, d);
}

/* One line of goldens.jsonl, decoded in place: strings with their lengths, vars built in ctx. */
struct golden {
    const char *name, *tname, *src, *experr, *kind, *out;
    size_t srclen, outlen;
    double now;
    kvr_tmpl_val *vars;
    bool header; /* the first line: {"seed", "jinja2"} */
    double seed;
    const char *jinja2;
};

static void golden_parse(char *line, kvr_tmpl_ctx *ctx, struct golden *g)
{
    struct kvr_jtok j;
    int st = 0, rc;
    char *key, *s, *num;
    size_t klen, n;

    memset(g, 0, sizeof *g);
    kvr_jtok_init(&j, line, strlen(line));
    while ((rc = kvr_jtok_object_next(&j, &st, &key, &klen)) == 1) {
        const char **str = NULL;
        size_t *len = NULL;
#define K(name) (klen == sizeof(name) - 1 && memcmp(key, name, klen) == 0)
        if (K("vars")) {
            g->vars = from_json(ctx, &j);
            continue;
        }
        if (K("now") || K("seed")) {
            char buf[64];
            assert_int_equal(kvr_jtok_number(&j, &num, &n), 0);
            assert_true(n < sizeof buf);
            memcpy(buf, num, n);
            buf[n] = '\0';
            *(K("now") ? &g->now : &g->seed) = strtod(buf, NULL);
            g->header |= K("seed");
            continue;
        }
        str = K("name") ? &g->name : K("template") ? &g->tname : K("source") ? &g->src
            : K("error") ? &g->experr : K("kind") ? &g->kind : K("output") ? &g->out
            : K("jinja2") ? &g->jinja2 : NULL;
        len = K("source") ? &g->srclen : K("output") ? &g->outlen : NULL;
#undef K
        if (str == NULL) {
            assert_int_equal(kvr_jtok_skip(&j), 0);
            continue;
        }
        assert_int_equal(kvr_jtok_string(&j, &s, &n), 0);
        *str = s;
        if (len != NULL)
            *len = n;
    }
    assert_int_equal(rc, 0);
}

struct tcache {
    char name[64];
    kvr_tmpl *t;
};
static struct tcache cache[16];

static kvr_tmpl *load_named(const char *name)
{
    for (int i = 0; i < 16; i++)
        if (cache[i].t && strcmp(cache[i].name, name) == 0)
            return cache[i].t;
    char path[256], err[256];
    size_t len;
    snprintf(path, sizeof path, "tests/data/tmpl/%s.jinja", name);
    char *src = slurp(path, &len);
    if (src == NULL)
        fail_msg("cannot read %s", path);
    kvr_tmpl *t;
    int rc = kvr_tmpl_compile(src, len, &t, err, sizeof err);
    free(src);
    if (rc)
        fail_msg("%s: compile failed: %s", path, err);
    for (int i = 0; i < 16; i++)
        if (cache[i].t == NULL) {
            snprintf(cache[i].name, sizeof cache[i].name, "%s", name);
            cache[i].t = t;
            return t;
        }
    fail_msg("template cache full");
    return NULL;
}

static void show_diff(const char *name, const char *exp, size_t elen, const char *got, size_t glen)
{
    size_t i = 0;
    while (i < elen && i < glen && exp[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "MISMATCH %s at byte %zu (expected %zu bytes, got %zu)\n  expected: %.*s\n"
                    "  got:      %.*s\n",
            name, i, elen, glen, (int)(elen - from < 120 ? elen - from : 120), exp + from,
            (int)(glen - from < 120 ? glen - from : 120), got + from);
}

static void test_goldens(void **state)
{
    (void)state;
    size_t len;
    char *all = slurp("tests/data/tmpl/goldens.jsonl", &len);
    assert_non_null(all);
    kvr_tmpl_ctx *ctx;
    assert_int_equal(kvr_tmpl_ctx_create(&ctx, NULL), 0);
    int n = 0, bad = 0, errs = 0, line = 0;
    char *save = NULL;
    for (char *l = strtok_r(all, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        struct golden g;
        kvr_tmpl_ctx_reset(ctx);
        golden_parse(l, ctx, &g);
        if (line++ == 0) {
            assert_true(g.header);
            printf("goldens: jinja2 %s, random conversations from seed %d\n",
                   g.jinja2 ? g.jinja2 : "?", (int)g.seed);
            continue;
        }
        const char *name = g.name;
        char err[512];
        kvr_tmpl *t = NULL, *own = NULL;
        int rc = 0;
        if (g.tname)
            t = load_named(g.tname);
        else {
            rc = kvr_tmpl_compile(g.src, g.srclen, &own, err, sizeof err);
            t = own;
        }
        n++;
        if (rc == 0) {
            kvr_tmpl_ctx_set_time(ctx, (int64_t)g.now);
            const char *out;
            size_t outlen;
            rc = kvr_tmpl_render(t, ctx, g.vars, 0, &out, &outlen, err, sizeof err);
            if (rc == 0 && g.out) {
                if (outlen != g.outlen || memcmp(out, g.out, outlen) != 0) {
                    show_diff(name, g.out, g.outlen, out, outlen);
                    bad++;
                }
            } else if (rc == 0) {
                fprintf(stderr, "MISMATCH %s: rendered, Jinja2 failed with: %s\n", name, g.experr);
                bad++;
            }
        }
        if (rc != 0) {
            if (g.out) {
                fprintf(stderr, "MISMATCH %s: failed (%d: %s), Jinja2 rendered\n", name, rc, err);
                bad++;
            } else {
                errs++;
                /* raise_exception: the template's own message, byte for byte */
                if (g.kind && strcmp(g.kind, "TemplateError") == 0 && strcmp(err, g.experr) != 0) {
                    fprintf(stderr, "MISMATCH %s: message '%s', Jinja2 '%s'\n", name, err,
                            g.experr);
                    bad++;
                }
            }
        }
        kvr_tmpl_free(own);
    }
    printf("goldens: %d cases, %d expected errors, %d mismatches\n", n, errs, bad);
    kvr_tmpl_ctx_destroy(ctx);
    free(all);
    assert_true(n > 300);
    assert_int_equal(bad, 0);
}

static void expect_refused(const char *src, const char *want)
{
    kvr_tmpl *t = NULL;
    char err[256];
    int rc = kvr_tmpl_compile(src, strlen(src), &t, err, sizeof err);
    if (rc != -EINVAL || strstr(err, want) == NULL)
        fail_msg("template %s: rc %d err '%s', wanted -EINVAL with '%s'", src, rc,
                 rc ? err : "", want);
    assert_null(t);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refused("{% include 'x.jinja' %}", "line 1: 'include' is not supported");
    expect_refused("a\nb\n{% extends 'base' %}", "line 3: 'extends'");
    expect_refused("{% block b %}{% endblock %}", "'block' is not supported");
    expect_refused("{% import 'm' as m %}", "'import'");
    expect_refused("{% from 'm' import x %}", "'from'");
    expect_refused("x\n{% for a in b recursive %}{% endfor %}", "line 2: recursive loops");
    expect_refused("{{ x | nosuch }}", "unsupported filter 'nosuch'");
    expect_refused("{{ x is nosuch }}", "unsupported test 'nosuch'");
    expect_refused("{{ f(*args) }}", "not supported");
    expect_refused("{{ x.__class__ }}", "unsafe");
    expect_refused("{% if x %}", "expected 'endif'");
    expect_refused("{% endif %}", "'endif' is not supported");
    expect_refused("{{ x", "end of template");
    expect_refused("{{ 'abc }}", "unterminated string");
    expect_refused("{# open", "unterminated comment");
    expect_refused("{% raw %}never closed", "endraw");
    expect_refused("{% break %}", "outside a loop");
    expect_refused("\n\n{{ 1 + }}", "line 3");
    expect_refused("{{ ) }}", "unexpected");
    expect_refused("{% set %}", "expected a variable name");
    expect_refused("{{ '\\N{BULLET}' }}", "\\N");
    expect_refused("{{ 99999999999999999999 }}", "out of range");
    expect_refused("{% generation %}x{% endgeneration %}", "'generation' is not supported");
    /* nesting bounded at compile time */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++)
        deep[k++] = '(';
    deep[k] = 0;
    strcat(deep, "1 }}");
    expect_refused(deep, "nested too deep");
    /* left-deep chains the parser builds in loops are bounded too (by the tree's height) */
    static const char *units[] = {"+1", ".a", "|trim", "[0]", " ~ 'a'", " or 1", "(1)",
                                  " is defined and 1"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t ul = strlen(units[u]);
        char *s = malloc(20000 * ul + 16);
        size_t n = (size_t)sprintf(s, "{{ x");
        for (int i = 0; i < 20000; i++) {
            memcpy(s + n, units[u], ul);
            n += ul;
        }
        memcpy(s + n, " }}", 4);
        expect_refused(s, "nested too deep");
        free(s);
    }
    /* statements nest within the same bound */
    char *s = malloc(20 * 300 + 16);
    size_t n = 0;
    for (int i = 0; i < 300; i++)
        n += (size_t)sprintf(s + n, "{%% if 1 %%}");
    s[n] = 0;
    expect_refused(s, "nested too deep");
    free(s);
}

static int render_src(const char *src, const struct kvr_tmpl_limits *lim, size_t max_bytes,
                      char *err, size_t errlen)
{
    kvr_tmpl *t;
    kvr_tmpl_ctx *ctx;
    int rc = kvr_tmpl_compile(src, strlen(src), &t, err, errlen);
    if (rc)
        return rc;
    assert_int_equal(kvr_tmpl_ctx_create(&ctx, lim), 0);
    const char *out;
    size_t outlen;
    rc = kvr_tmpl_render(t, ctx, NULL, max_bytes, &out, &outlen, err, errlen);
    kvr_tmpl_ctx_destroy(ctx);
    kvr_tmpl_free(t);
    return rc;
}

static void test_limits(void **state)
{
    (void)state;
    char err[256];
    struct kvr_tmpl_limits lim = {.max_mem = 8 << 20, .max_depth = 16, .max_iters = 10000};
    assert_int_equal(render_src("{% for i in range(100) %}0123456789{% endfor %}", &lim, 500,
                                err, sizeof err), -E2BIG);
    assert_non_null(strstr(err, "exceeds 500 bytes"));
    assert_int_equal(render_src("{% for i in range(100) %}0123456789{% endfor %}", &lim, 1000,
                                err, sizeof err), 0);
    assert_int_equal(render_src("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", &lim, 0,
                                err, sizeof err), -ELOOP);
    assert_non_null(strstr(err, "nested too deep"));
    /* deep expressions inside deep macro recursion, at the default limits: the frame cap
     * stops it (and ASan builds see no stack overflow) */
    char deep[2048];
    size_t k = (size_t)sprintf(deep, "{%% macro m(n) %%}{{ ");
    for (int i = 0; i < 40; i++)
        deep[k++] = '[';
    k += (size_t)sprintf(deep + k, "m(n + 1)");
    for (int i = 0; i < 40; i++)
        deep[k++] = ']';
    sprintf(deep + k, " }}{%% endmacro %%}{{ m(0) }}");
    assert_int_equal(render_src(deep, NULL, 0, err, sizeof err), -ELOOP);
    assert_non_null(strstr(err, "template recursion too deep"));
    /* containers nested deeper than any recursion bound, built at render time */
    assert_int_equal(render_src("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
                                "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x == ns.x }}"
                                "{{ [ns.x] < [ns.x] }}", NULL, 0, err, sizeof err), -EINVAL);
    assert_int_equal(render_src("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
                                "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}", NULL, 0, err,
                                sizeof err), -EINVAL);
    assert_int_equal(render_src("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
                                "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | tojson }}", NULL, 0,
                                err, sizeof err), -EINVAL);
    assert_int_equal(render_src("{% for i in range(100) %}{% for j in range(100) %}{% for k in "
                                "range(100) %}{% endfor %}{% endfor %}{% endfor %}", &lim, 0, err,
                                sizeof err), -ELOOP);
    assert_non_null(strstr(err, "too many loop iterations"));
    assert_int_equal(render_src("{% set s = 'x' * 1000 %}{% set ns = namespace(s=s) %}"
                                "{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                                &lim, 0, err, sizeof err), -ENOMEM);
    assert_int_equal(render_src("{{ 'ab' * 100000000000 }}", &lim, 0, err, sizeof err), -ENOMEM);
    assert_int_equal(render_src("{{ raise_exception('boom ' ~ 1) }}", NULL, 0, err, sizeof err),
                     -EINVAL);
    assert_string_equal(err, "boom 1");
    assert_int_equal(render_src("{{ 9223372036854775807 + 1 }}", NULL, 0, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "overflow"));
}

static void test_content_format(void **state)
{
    (void)state;
    assert_int_equal(kvr_tmpl_content_is_parts(load_named("gemma3")), 1);
    assert_int_equal(kvr_tmpl_content_is_parts(load_named("qwen3")), 0);
    assert_int_equal(kvr_tmpl_content_is_parts(load_named("llama3")), 0);
    assert_int_equal(kvr_tmpl_content_is_parts(load_named("llama3_1")), 0);
    assert_int_equal(kvr_tmpl_content_is_parts(load_named("deepseek_v3")), 0);
    static const struct {
        const char *src;
        int parts;
    } cases[] = {
        {"{% for m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}", 1},
        {"{% for m in messages %}{% for p in m['content'] | list %}{% endfor %}{% endfor %}", 1},
        {"{% set msgs = messages[1:] %}{% for m in msgs %}{% for p in m.content %}{% endfor %}{% endfor %}", 1},
        {"{% for m in messages %}{% for p in m.text %}{% endfor %}{% endfor %}", 0},
        {"{% for p in content %}{% endfor %}", 0},
        {"{% for m in other %}{% for p in m.content %}{% endfor %}{% endfor %}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvr_tmpl *t;
        char err[128];
        assert_int_equal(kvr_tmpl_compile(cases[i].src, strlen(cases[i].src), &t, err, sizeof err), 0);
        if (kvr_tmpl_content_is_parts(t) != cases[i].parts)
            fail_msg("content format of %s: %d", cases[i].src, kvr_tmpl_content_is_parts(t));
        kvr_tmpl_free(t);
    }
}

/* ---- concurrent renders of one compiled template ---- */
struct thr {
    const kvr_tmpl *t;
    const char *expect;
    int bad;
};

static kvr_tmpl_val *conv(kvr_tmpl_ctx *ctx, int turns)
{
    kvr_tmpl_val *vars = kvr_tmpl_dict(ctx), *msgs = kvr_tmpl_list(ctx);
    for (int i = 0; i < turns; i++) {
        kvr_tmpl_val *m = kvr_tmpl_dict(ctx);
        char text[64];
        int n = snprintf(text, sizeof text, "turn %d: caché ✓", i);
        kvr_tmpl_dict_set(ctx, m, "role", 4, kvr_tmpl_str(ctx, i % 2 ? "assistant" : "user", i % 2 ? 9 : 4));
        kvr_tmpl_dict_set(ctx, m, "content", 7, kvr_tmpl_str(ctx, text, (size_t)n));
        kvr_tmpl_list_push(ctx, msgs, m);
    }
    kvr_tmpl_dict_set(ctx, vars, "messages", 8, msgs);
    kvr_tmpl_dict_set(ctx, vars, "add_generation_prompt", 21, kvr_tmpl_bool(ctx, 1));
    return vars;
}

static void *thr_main(void *arg)
{
    struct thr *th = arg;
    kvr_tmpl_ctx *ctx;
    if (kvr_tmpl_ctx_create(&ctx, NULL)) {
        th->bad++;
        return NULL;
    }
    for (int i = 0; i < 300; i++) {
        kvr_tmpl_ctx_reset(ctx);
        const char *out;
        size_t outlen;
        char err[128];
        if (kvr_tmpl_render(th->t, ctx, conv(ctx, 9), 0, &out, &outlen, err, sizeof err) ||
            strcmp(out, th->expect) != 0)
            th->bad++;
    }
    kvr_tmpl_ctx_destroy(ctx);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    const kvr_tmpl *t = load_named("qwen3");
    kvr_tmpl_ctx *ctx;
    assert_int_equal(kvr_tmpl_ctx_create(&ctx, NULL), 0);
    const char *out;
    size_t outlen;
    char err[128];
    assert_int_equal(kvr_tmpl_render(t, ctx, conv(ctx, 9), 0, &out, &outlen, err, sizeof err), 0);
    char *expect = strdup(out);
    assert_non_null(strstr(expect, "<|im_start|>assistant\nturn 7: caché ✓<|im_end|>"));
    kvr_tmpl_ctx_destroy(ctx);
    pthread_t th[4];
    struct thr a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct thr){.t = t, .expect = expect};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
    }
    free(expect);
}

/* ---- random mutations of real templates: errors are fine, crashes and hangs are not ---- */
static void test_mutations(void **state)
{
    (void)state;
    unsigned seed = test_seed();
    printf("test_mutations: seed %u (KVR_TEST_SEED=%u replays)\n", seed, seed);
    srand(seed);
    static const char *names[] = {"qwen3", "gemma3", "deepseek_v3", "llama3"};
    static const char *frags[] = {"{%", "%}", "{{", "}}", "{#", "#}", "-", "(", ")", "[", "]",
                                  "'", "\"", "|", ".", "loop", " for ", " in ", " if ", "endif",
                                  "endfor", "ns.", "~", "*", "**", "\\", "\n", "messages"};
    kvr_tmpl_ctx *ctx;
    struct kvr_tmpl_limits lim = {.max_mem = 16 << 20, .max_iters = 100000};
    assert_int_equal(kvr_tmpl_ctx_create(&ctx, &lim), 0);
    int compiled = 0, rendered = 0;
    for (int it = 0; it < 1500; it++) {
        size_t len;
        char path[128];
        snprintf(path, sizeof path, "tests/data/tmpl/%s.jinja", names[rand() % 4]);
        char *src = slurp(path, &len);
        assert_non_null(src);
        char *m = malloc(len + 256);
        memcpy(m, src, len);
        int edits = 1 + rand() % 4;
        for (int e = 0; e < edits; e++) {
            size_t at = len ? (size_t)rand() % len : 0;
            int op = rand() % 3;
            if (op == 0 && len > 0) { /* delete a run */
                size_t n = 1 + (size_t)rand() % 8;
                if (at + n > len)
                    n = len - at;
                memmove(m + at, m + at + n, len - at - n);
                len -= n;
            } else if (op == 1 && len > 0) { /* flip a byte */
                m[at] = (char)rand();
            } else { /* insert a fragment */
                const char *f = frags[rand() % (int)(sizeof frags / sizeof frags[0])];
                size_t fl = strlen(f);
                if (len + fl < len + 256 - 1) {
                    memmove(m + at + fl, m + at, len - at);
                    memcpy(m + at, f, fl);
                    len += fl;
                }
            }
        }
        kvr_tmpl *t;
        char err[256];
        if (kvr_tmpl_compile(m, len, &t, err, sizeof err) == 0) {
            compiled++;
            kvr_tmpl_ctx_reset(ctx);
            const char *out;
            size_t outlen;
            if (kvr_tmpl_render(t, ctx, conv(ctx, 4), 1 << 20, &out, &outlen, err, sizeof err) == 0)
                rendered++;
            kvr_tmpl_free(t);
        } else {
            assert_true(strncmp(err, "line ", 5) == 0 || strstr(err, "memory"));
        }
        free(m);
        free(src);
    }
    printf("test_mutations: 1500 mutants, %d compiled, %d rendered\n", compiled, rendered);
    kvr_tmpl_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_content_format),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_mutations),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < 16; i++)
        kvr_tmpl_free(cache[i].t);
    return rc;
}
