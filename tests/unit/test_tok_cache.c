/* test_tok_cache.c — the prefix cache is exact: cached and uncached tokenizations are equal
 * on every golden text and on randomized texts built to share beginnings (prefix + different
 * continuations, cut inside whitespace runs, digit runs, words, before combining marks,
 * around added tokens), for the five reference tokenizers and for variants of Qwen3's file
 * whose added tokens have lstrip/rstrip/normalized set. And the cache is used: hits, saved
 * bytes, eviction under a small budget, concurrent threads.
 *
 * The reference tokenizers come from `make deps` (build/tokref; see test_tok.c); without them
 * the test fails unless KVR_TOK_NO_REF=1, which prints that nothing was checked. Randomized
 * cases print their seed (KVR_TEST_SEED=N replays one).
 */
#include <errno.h>
#include <inttypes.h>
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

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "text/tok.h"
#include "tok_common.h"

/* Sanitizer builds run a lighter load (the same cases, fewer of them). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LIGHT 4
#else
#define LIGHT 1
#endif

static const char *const names[] = {"qwen3", "llama3", "deepseek_v3", "llama2", "gemma3"};
#define NM (sizeof names / sizeof names[0])
static kvr_tok *toks[NM + 2]; /* + Qwen3 variants: lstrip/rstrip tokens, normalized tokens */
static size_t ntoks;
static unsigned seed;

/* Qwen3's file with its added tokens changed: lstrip+rstrip on <|im_start|>/<|im_end|>, or
 * normalized=true on every non-special one (matched in NFC text). */
static kvr_tok *variant(const char *dir, int kind)
{
    char p[512], err[512];
    size_t n;
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    char *j = slurp(p, &n);
    assert_non_null(j);
    cJSON *root = cJSON_ParseWithLength(j, n);
    free(j);
    assert_non_null(root);
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))
    {
        const char *c = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
        if (kind == 0 && (!strcmp(c, "<|im_start|>") || !strcmp(c, "<|im_end|>"))) {
            cJSON_ReplaceItemInObject(a, "lstrip", cJSON_CreateTrue());
            cJSON_ReplaceItemInObject(a, "rstrip", cJSON_CreateTrue());
        }
        if (kind == 1 && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special")))
            cJSON_ReplaceItemInObject(a, "normalized", cJSON_CreateTrue());
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    kvr_tok *t = NULL;
    int rc = kvr_tok_load_mem(out, strlen(out), NULL, 0, &t, err, sizeof err);
    if (rc)
        fprintf(stderr, "variant %d: %s\n", kind, err);
    assert_int_equal(rc, 0);
    free(out);
    return t;
}

static int setup(void **state)
{
    (void)state;
    char p[512], err[512];
    seed = test_seed();
    printf("test_tok_cache: seed %u (KVR_TEST_SEED=%u replays it)\n", seed, seed);
    snprintf(p, sizeof p, "%s/qwen3/tokenizer.json", tokref());
    FILE *f = fopen(p, "rb");
    if (!f) {
        const char *no = getenv("KVR_TOK_NO_REF");
        if (no && !strcmp(no, "1")) {
            printf("test_tok_cache: KVR_TOK_NO_REF=1 and no %s: NOTHING is checked\n", p);
            return 0;
        }
        fprintf(stderr, "test_tok_cache: %s missing: run `make deps`\n", p);
        return -1;
    }
    fclose(f);
    for (size_t m = 0; m < NM; m++) {
        snprintf(p, sizeof p, "%s/%s", tokref(), names[m]);
        if (kvr_tok_load(p, &toks[m], err, sizeof err)) {
            fprintf(stderr, "load %s: %s\n", p, err);
            return -1;
        }
    }
    snprintf(p, sizeof p, "%s/qwen3", tokref());
    toks[NM] = variant(p, 0);
    toks[NM + 1] = variant(p, 1);
    ntoks = NM + 2;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (size_t m = 0; m < ntoks; m++)
        kvr_tok_free(toks[m]);
    return 0;
}

static const char *tname(size_t m)
{
    return m < NM ? names[m] : m == NM ? "qwen3+lstrip/rstrip" : "qwen3+normalized";
}

/* Encodes through the cache and plainly; fails on any difference. */
static void check(size_t m, kvr_tok_cache *c, kvr_tok_scratch *sc, kvr_tok_scratch *sp,
                  const char *text, size_t len, bool add, const char *what)
{
    const uint32_t *a, *b;
    int na = kvr_tok_encode_cached(toks[m], c, sc, text, len, add, &a);
    int nb = kvr_tok_encode(toks[m], sp, text, len, add, &b);
    if (na != nb || (na > 0 && memcmp(a, b, (size_t)na * sizeof *a))) {
        int at = 0;
        while (na > 0 && nb > 0 && at < na && at < nb && a[at] == b[at])
            at++;
        printf("  %s: %s differs (seed %u, add=%d, len %zu): cached %d ids, plain %d, first "
               "difference at id %d\n  text: \"%.*s\"\n",
               tname(m), what, seed, add, len, na, nb, at, (int)(len < 400 ? len : 400), text);
        fail();
    }
}

static void test_goldens_cached(void **state)
{
    (void)state;
    if (!ntoks)
        skip();
    for (size_t m = 0; m < NM; m++) {
        char p[256];
        size_t len;
        snprintf(p, sizeof p, "tests/data/tok/goldens-%s.json", names[m]);
        char *j = slurp(p, &len);
        assert_non_null(j);
        cJSON *root = cJSON_ParseWithLength(j, len), *c;
        kvr_tok_cache *cache;
        assert_int_equal(kvr_tok_cache_new(64 << 20, &cache), 0);
        kvr_tok_scratch *sc = kvr_tok_scratch_new(), *sp = kvr_tok_scratch_new();
        /* twice: the second pass finds every long text cached */
        for (int pass = 0; pass < 2; pass++)
            cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "cases"))
            {
                const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
                bool add = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_special_tokens"));
                check(m, cache, sc, sp, text, strlen(text), add, "golden");
            }
        struct kvr_tok_cache_stats st;
        kvr_tok_cache_stats(cache, &st);
        printf("test_tok_cache: %-12s goldens equal cached; hits %" PRIu64 ", saved %" PRIu64
               " bytes\n", names[m], st.hits, st.saved_bytes);
        kvr_tok_cache_free(cache);
        kvr_tok_scratch_free(sc);
        kvr_tok_scratch_free(sp);
        cJSON_Delete(root);
        free(j);
    }
}

/* Fragments whose joins exercise every resumption condition. */
static const char *const frags[] = {
    "the", " quick", " brown", "fox", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ",
    "123", "4567890", " 42", "3.14159", ",", ".", "!?", "...", "'s", "'ll", " don't",
    "中文", "日本語のテキスト", "한국어", "مرحبا", " العالم", "e\xcc\x81", "\xcc\x81", "\xcc\xa7",
    "caf\xc3\xa9", "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",
    "\xf0\x9f\x98\x80", "<|im_start|>", "<|im_end|>", "<|im_start|>user\n", "<think>",
    "[INST]", "<s>", "</s>", "<start_of_turn>", "<|begin_of_text|>", "<｜User｜>",
    "int main(void) {\n\treturn 0;\n}", "    ", "Supercalifragilisticexpialidocious",
    "__init__", "http://example.com/a?b=c", "ＡＢＣ", "ﬁ", "\xe2\x84\xab", "x"};
#define NF (sizeof frags / sizeof frags[0])

static size_t gen(char *buf, size_t cap, size_t want, unsigned *r)
{
    size_t n = 0;
    while (n < want) {
        const char *f = frags[(size_t)rand_r(r) % NF];
        size_t l = strlen(f);
        if (n + l >= cap)
            break;
        memcpy(buf + n, f, l);
        n += l;
    }
    return n;
}

static void test_random_prefixes(void **state)
{
    (void)state;
    if (!ntoks)
        skip();
    enum { CAP = 16384 };
    char *a = malloc(CAP), *b = malloc(CAP);
    for (size_t m = 0; m < ntoks; m++) {
        unsigned r = seed + (unsigned)m * 7919;
        kvr_tok_cache *cache;
        assert_int_equal(kvr_tok_cache_new(8 << 20, &cache), 0);
        kvr_tok_scratch *sc = kvr_tok_scratch_new(), *sp = kvr_tok_scratch_new();
        for (int trial = 0; trial < 120 / LIGHT; trial++) {
            /* a shared beginning P, then two different continuations */
            size_t np = gen(a, CAP / 2, 300 + (size_t)rand_r(&r) % 3000, &r);
            memcpy(b, a, np);
            size_t na = np + gen(a + np, CAP / 2, (size_t)rand_r(&r) % 1200, &r);
            size_t nb = np + gen(b + np, CAP / 2, (size_t)rand_r(&r) % 1200, &r);
            bool add = rand_r(&r) & 1;
            check(m, cache, sc, sp, a, na, add, "first text");
            check(m, cache, sc, sp, b, nb, add, "second text (shares its beginning)");
            /* the same beginning cut at every kind of point: a byte-prefix of P */
            size_t cut = np / 2 + (size_t)rand_r(&r) % (np / 2 + 1);
            while (cut < np && (b[cut] & 0xC0) == 0x80)
                cut++;
            check(m, cache, sc, sp, b, cut, add, "a cut of the beginning");
        }
        struct kvr_tok_cache_stats st;
        kvr_tok_cache_stats(cache, &st);
        printf("test_tok_cache: %-20s %d random texts equal cached; hits %" PRIu64
               ", saved %" PRIu64 " bytes, evictions %" PRIu64 "\n",
               tname(m), 3 * (120 / LIGHT), st.hits, st.saved_bytes, st.evictions);
        /* tokenizers that pre-tokenize with a regex resume inside text; the others only
         * after added tokens (which most random texts contain) */
        assert_true(st.hits > 0);
        kvr_tok_cache_free(cache);
        kvr_tok_scratch_free(sc);
        kvr_tok_scratch_free(sp);
    }
    free(a);
    free(b);
}

/* The 20 KB document: a prompt that shares all of it but its last kilobyte resumes close to
 * where they part (Qwen3, Llama 3), and a tiny budget evicts without losing exactness. */
static void test_long_shared_prefix(void **state)
{
    (void)state;
    if (!ntoks)
        skip();
    size_t len;
    char *doc = slurp("tests/data/tok/doc20k.txt", &len);
    assert_non_null(doc);
    char *t2 = malloc(len + 64);
    memcpy(t2, doc, len - 1000);
    memcpy(t2 + len - 1000, " and now something else entirely.", 33);
    size_t n2 = len - 1000 + 33;
    for (size_t m = 0; m < 2; m++) {
        kvr_tok_cache *cache;
        assert_int_equal(kvr_tok_cache_new(64 << 20, &cache), 0);
        kvr_tok_scratch *sc = kvr_tok_scratch_new(), *sp = kvr_tok_scratch_new();
        check(m, cache, sc, sp, doc, len, true, "20 KB document");
        check(m, cache, sc, sp, t2, n2, true, "20 KB document, other ending");
        struct kvr_tok_cache_stats st;
        kvr_tok_cache_stats(cache, &st);
        printf("test_tok_cache: %-12s 20 KB shared: resumed after %" PRIu64 " of %zu shared "
               "bytes\n", names[m], st.saved_bytes, len - 1000);
        assert_int_equal(st.hits, 1);
        assert_true(st.saved_bytes + 256 + 64 + 64 >= len - 1000);
        kvr_tok_cache_free(cache);
        /* a budget of one document: every insert evicts the previous one */
        assert_int_equal(kvr_tok_cache_new(len * 6, &cache), 0);
        char *t3 = malloc(n2);
        memcpy(t3, t2, n2);
        for (int i = 0; i < 6; i++) {
            t3[i * 37 % 500] ^= 1; /* a different beginning each time */
            check(m, cache, sc, sp, t3, n2, i & 1, "evicting");
        }
        free(t3);
        kvr_tok_cache_stats(cache, &st);
        assert_true(st.evictions >= 4);
        assert_true(st.bytes <= len * 6);
        kvr_tok_cache_free(cache);
        kvr_tok_scratch_free(sc);
        kvr_tok_scratch_free(sp);
    }
    free(doc);
    free(t2);
}

/* Texts that part where resumption is delicate, placed at every offset around checkpoints:
 * T1 = filler + common + a, T2 = filler + common + b, where b completes an added token that
 * common began, adds a combining mark to common's last letter (NFC), lengthens a whitespace
 * run, continues a digit run, or brings a token with lstrip right after spaces. T1 is cached
 * first, then T2 must equal its plain encoding. */
static void test_adversarial_cuts(void **state)
{
    (void)state;
    if (!ntoks)
        skip();
    static const struct {
        const char *common, *a, *b;
    } pat[] = {
        {"<|im_start", "foo bar", "|>user\nhi"},
        {"<|im_", "x y", "end|> next"},
        {"<|begin_of_te", "xt", "xt|> z"},
        {"<\xef\xbd\x9cUser", "x", "\xef\xbd\x9c> q"},
        {"</s", "x", "> q"},
        {"<start_of_tur", "x", "n> q"},
        {"cafe", " next", "\xcc\x81 next"},
        {"e", "x", "\xcc\xa7\xcc\x81"},
        {"word   ", "x", "   \n\n  z"},
        {"word \t", "y", "\r\n\t z"},
        {"12", "34567", "a"},
        {"x   ", "y", "<|im_start|>user"},
        {"y ", "  ", "<|im_end|>"},
        {"Hello", "'s", "'ll"},
        /* runs longer than the margin: a token with lstrip eats back over the checkpoint */
        {"x                                        ", "y", "<|im_start|>user"},
        {"x \t \t \t \t \t \t \t \t \t \t \t \t \t \t \t \t \t \t", "z", "\n<|im_end|>"},
        {"w                                                    ", "v", "\n\n"},
        {"x   \n   \n   \n   \n   \n   \n   \n   \n   \n   \n   \n   \n   \n", "y",
         "<|im_start|>"},
    };
    static const char *const words[] = {"lorem", "ipsum", "dolor", "sit", "amet", "a", "be"};
    enum { CAP = 2048 };
    char *t1 = malloc(CAP), *t2 = malloc(CAP);
    int n = 0;
    for (size_t m = 0; m < ntoks; m++) {
        kvr_tok_cache *cache;
        assert_int_equal(kvr_tok_cache_new(16 << 20, &cache), 0);
        kvr_tok_scratch *sc = kvr_tok_scratch_new(), *sp = kvr_tok_scratch_new();
        unsigned r = seed ^ (unsigned)m;
        for (size_t p = 0; p < sizeof pat / sizeof pat[0]; p++) {
            size_t lc = strlen(pat[p].common), la = strlen(pat[p].a), lb = strlen(pat[p].b);
            for (size_t c = 512; c <= 768; c += 256 * LIGHT) {
                for (size_t d = c - 48; d < c + 8; d += LIGHT) { /* where the texts part */
                    size_t f = 0, fl = d - lc;
                    while (f < fl) { /* filler of exactly fl bytes */
                        const char *w = words[(size_t)rand_r(&r) % 7];
                        size_t wl = strlen(w);
                        if (f + wl + 1 > fl) {
                            memset(t1 + f, 'z', fl - f);
                            f = fl;
                            break;
                        }
                        memcpy(t1 + f, w, wl);
                        t1[f + wl] = ' ';
                        f += wl + 1;
                    }
                    memcpy(t1 + fl, pat[p].common, lc);
                    memcpy(t2, t1, d);
                    memcpy(t1 + d, pat[p].a, la);
                    memcpy(t2 + d, pat[p].b, lb);
                    /* enough after the parting point for the checkpoint to exist */
                    memset(t1 + d + la, 'q', c + 8 - d);
                    memset(t2 + d + lb, 'q', c + 8 - d);
                    bool add = (d & 1) != 0;
                    check(m, cache, sc, sp, t1, d + la + c + 8 - d, add, "adversarial T1");
                    check(m, cache, sc, sp, t2, d + lb + c + 8 - d, add, "adversarial T2");
                    n++;
                }
            }
        }
        kvr_tok_cache_free(cache);
        kvr_tok_scratch_free(sc);
        kvr_tok_scratch_free(sp);
    }
    printf("test_tok_cache: %d adversarial pairs equal cached\n", n);
    free(t1);
    free(t2);
}

struct thr {
    kvr_tok_cache *cache;
    unsigned seed;
    int bad;
};

static void *worker(void *arg)
{
    struct thr *w = arg;
    enum { CAP = 8192 };
    char *buf = malloc(CAP);
    kvr_tok_scratch *sc = kvr_tok_scratch_new(), *sp = kvr_tok_scratch_new();
    unsigned r = w->seed;
    char base[2048];
    unsigned r0 = 12345; /* every thread shares this beginning */
    size_t nbase = gen(base, sizeof base, 1500, &r0);
    for (int i = 0; i < 150 / LIGHT; i++) {
        memcpy(buf, base, nbase);
        size_t n = nbase + gen(buf + nbase, CAP - nbase, (size_t)rand_r(&r) % 2000, &r);
        const uint32_t *a, *b;
        int na = kvr_tok_encode_cached(toks[0], w->cache, sc, buf, n, true, &a);
        int nb = kvr_tok_encode(toks[0], sp, buf, n, true, &b);
        w->bad += na != nb || memcmp(a, b, (size_t)na * sizeof *a) != 0;
    }
    kvr_tok_scratch_free(sc);
    kvr_tok_scratch_free(sp);
    free(buf);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    if (!ntoks)
        skip();
    kvr_tok_cache *cache;
    assert_int_equal(kvr_tok_cache_new(1 << 20, &cache), 0); /* small: evictions race too */
    pthread_t th[4];
    struct thr w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct thr){cache, seed + (unsigned)i, 0};
        pthread_create(&th[i], NULL, worker, &w[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += w[i].bad;
    }
    struct kvr_tok_cache_stats st;
    kvr_tok_cache_stats(cache, &st);
    printf("test_tok_cache: 4 threads, %d texts: %d differences, hits %" PRIu64 "\n",
           4 * (150 / LIGHT), bad, st.hits);
    assert_int_equal(bad, 0);
    assert_true(st.hits > 0);
    kvr_tok_cache_free(cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens_cached),
        cmocka_unit_test(test_random_prefixes),
        cmocka_unit_test(test_long_shared_prefix),
        cmocka_unit_test(test_adversarial_cuts),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
