/* test_modelfilter.c — [events] models patterns (src/core/modelfilter.c): the glob matcher
 * against glibc's fnmatch(3) on random patterns and names (KVR_SEED), the checks that reject
 * bad lists, and lists replaced while other threads match. */
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/modelfilter.h"

static bool glob(const char *p, const char *s)
{
    return kvr_modelfilter_glob(p, strlen(p), s, strlen(s));
}

static void test_glob(void **state)
{
    (void)state;
    assert_true(glob("Qwen/*", "Qwen/Qwen3-32B"));
    assert_false(glob("Qwen/*", "meta-llama/Llama-3.1-8B"));
    assert_true(glob("*", "a/b/c"));
    assert_true(glob("*", ""));
    assert_false(glob("", "a"));
    assert_true(glob("*llama*", "meta-llama/Llama-3.1-8B"));
    assert_false(glob("*llama*", "meta-LLAMA/x")); /* case-sensitive */
    assert_true(glob("m?del", "model"));
    assert_false(glob("m?del", "mdel"));
    assert_true(glob("org/m[0-9]", "org/m7"));
    assert_false(glob("org/m[0-9]", "org/mx"));
    assert_true(glob("org/m[!0-9]", "org/mx"));
    assert_true(glob("org/m[^0-9]", "org/mx"));
    assert_true(glob("a[]]b", "a]b"));
    assert_true(glob("a\\*b", "a*b"));
    assert_false(glob("a\\*b", "axb"));
    assert_true(glob("a*b*c", "aXbYbZc"));
    assert_false(glob("a*b*c", "aXbYbZ"));
    assert_true(glob("exact/model", "exact/model"));
    assert_false(glob("exact/model", "exact/model2"));
    assert_false(glob("exact/model", "exact/mode"));
    assert_true(glob("**a", "bba"));
    /* lengths are honoured: no NUL needed */
    assert_true(kvr_modelfilter_glob("ab*", 2, "abc", 2));
    assert_false(kvr_modelfilter_glob("ab*", 2, "abc", 3));
}

static unsigned g_seed;

static void test_glob_random_vs_fnmatch(void **state)
{
    static const char *const tok[] = {"a", "b", "/", "*", "?", "[ab]", "[!a]", "[a-b]", "\\*",
                                      "-"};
    const char *env = getenv("KVR_SEED");
    (void)state;

    g_seed = env ? (unsigned)strtoul(env, NULL, 10) : 20261129u;
    srand(g_seed);
    for (int iter = 0; iter < 200000; iter++) {
        char pat[64] = "", name[16];
        int np = rand() % 6, ns = rand() % 8;
        for (int k = 0; k < np; k++)
            strcat(pat, tok[rand() % (sizeof(tok) / sizeof(tok[0]))]);
        for (int k = 0; k < ns; k++)
            name[k] = "ab/*-"[rand() % 5];
        name[ns] = '\0';
        assert_int_equal(kvr_modelfilter_check(pat, NULL), 0);
        bool want = fnmatch(pat, name, 0) == 0, got = glob(pat, name);
        if (want != got)
            fail_msg("seed %u iter %d: '%s' vs '%s': fnmatch %d, ours %d", g_seed, iter, pat,
                     name, want, got);
    }
}

static void test_check(void **state)
{
    struct kvr_err err;
    char many[64 * 3 + 8] = "";
    char longp[300];
    (void)state;

    assert_int_equal(kvr_modelfilter_check(NULL, &err), 0);
    assert_int_equal(kvr_modelfilter_check("", &err), 0);
    assert_int_equal(kvr_modelfilter_check("  Qwen/*   meta-llama/* \t x ", &err), 0);
    assert_int_equal(kvr_modelfilter_check("org/m[0-9", &err), -EINVAL);
    assert_non_null(strstr(err.msg, "org/m[0-9"));
    assert_int_equal(kvr_modelfilter_check("ok [", &err), -EINVAL);
    assert_int_equal(kvr_modelfilter_check("a[]", &err), -EINVAL); /* ']' first is literal */
    assert_int_equal(kvr_modelfilter_check("trailing\\", &err), -EINVAL);
    assert_int_equal(kvr_modelfilter_check("ctl\x01x", &err), -EINVAL);
    assert_int_equal(kvr_modelfilter_check("a\\[b", &err), 0);
    for (int i = 0; i < 64; i++)
        strcat(many, "m* ");
    assert_int_equal(kvr_modelfilter_check(many, &err), 0);
    strcat(many, "x");
    assert_int_equal(kvr_modelfilter_check(many, &err), -EINVAL);
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    assert_int_equal(kvr_modelfilter_check(longp, &err), -EINVAL);
    longp[255] = '\0';
    assert_int_equal(kvr_modelfilter_check(longp, &err), 0);
}

static void test_filter(void **state)
{
    struct kvr_modelfilter *f;
    struct kvr_err err;
    (void)state;

    assert_true(kvr_modelfilter_holds(NULL, "x", 1));
    assert_false(kvr_modelfilter_active(NULL));
    assert_int_equal(kvr_modelfilter_create("", &f, &err), 0);
    assert_false(kvr_modelfilter_active(f));
    assert_true(kvr_modelfilter_holds(f, "anything", 8));
    assert_string_equal(kvr_modelfilter_text(f), "");
    assert_int_equal(kvr_modelfilter_gen(f), 0);

    assert_int_equal(kvr_modelfilter_set(f, "  Qwen/*\tmeta-llama/Llama-3.1-8B ", &err), 0);
    assert_int_equal(kvr_modelfilter_gen(f), 1);
    assert_true(kvr_modelfilter_active(f));
    assert_string_equal(kvr_modelfilter_text(f), "Qwen/* meta-llama/Llama-3.1-8B");
    assert_true(kvr_modelfilter_holds(f, "Qwen/Qwen3-32B", 14));
    assert_true(kvr_modelfilter_holds(f, "meta-llama/Llama-3.1-8B", 23));
    assert_false(kvr_modelfilter_holds(f, "meta-llama/Llama-3.1-70B", 24));

    /* a bad list keeps the previous one */
    assert_int_equal(kvr_modelfilter_set(f, "bad[", &err), -EINVAL);
    assert_int_equal(kvr_modelfilter_gen(f), 1);
    assert_true(kvr_modelfilter_holds(f, "Qwen/Qwen3-32B", 14));
    assert_int_equal(kvr_modelfilter_set(f, "", &err), 0);
    assert_false(kvr_modelfilter_active(f));
    kvr_modelfilter_destroy(f);
    assert_int_equal(kvr_modelfilter_create("x[", &f, &err), -EINVAL);
    assert_null(f);
}

/* Readers match while the list is replaced: every answer is one list's, whichever (run under
 * TSan: no race, no use after free). */
struct race {
    struct kvr_modelfilter *f;
    atomic_bool stop;
    atomic_ullong odd;
};

static void *reader(void *arg)
{
    struct race *r = arg;
    while (!atomic_load(&r->stop)) {
        /* both lists hold z, neither holds c */
        bool z = kvr_modelfilter_holds(r->f, "z", 1), c = kvr_modelfilter_holds(r->f, "c/x", 3);
        const char *t = kvr_modelfilter_text(r->f);
        if (!z || c || strlen(t) != 5)
            atomic_fetch_add(&r->odd, 1);
    }
    return NULL;
}

static void test_reload_race(void **state)
{
    struct race r;
    struct kvr_err err;
    pthread_t th[2];
    (void)state;

    assert_int_equal(kvr_modelfilter_create("a/* z", &r.f, &err), 0);
    atomic_init(&r.stop, false);
    atomic_init(&r.odd, 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader, &r), 0);
    for (int i = 0; i < 2000; i++)
        assert_int_equal(kvr_modelfilter_set(r.f, i % 2 ? "a/* z" : "b/* z", &err), 0);
    atomic_store(&r.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&r.odd), 0);
    kvr_modelfilter_destroy(r.f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glob),
        cmocka_unit_test(test_glob_random_vs_fnmatch),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_filter),
        cmocka_unit_test(test_reload_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
