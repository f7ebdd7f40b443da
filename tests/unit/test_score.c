/* test_score.c — score.c against the real index: blocks stored directly with kvr_index_store,
 * then queries. Exact prefixes with divergent chains, partial tail blocks, tiers and weights
 * (and their reload), pod filter, ordering, unknown model/LoRA, limits, and a randomized
 * comparison with a brute-force reference (seed printed on failure). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/conf.h"
#include "index/hash.h"
#include "index/index.h"
#include "route/score.h"

#define BS 4
#define MAXTOK 4096

struct fx {
    struct kvr_conf conf;
    struct kvr_index *ix;
    struct kvr_score *s;
    struct kvr_score_ctx *c;
    uint64_t next_engine_hash;
};

static void load_conf(struct kvr_conf *c, const char *extra)
{
    char text[1024];
    struct kvr_err err;

    snprintf(text, sizeof(text), "[events]\nbind = tcp://127.0.0.1:*\n%s", extra ? extra : "");
    if (kvr_conf_load_string("test", text, c, &err) != 0)
        fail_msg("conf: %s", err.msg);
}

static struct fx *fx_new(const char *extra_conf)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct kvr_index_opts o = {0};

    load_conf(&f->conf, extra_conf);
    o.jump_stride = 4; /* small, so jumps and the exact fallback both run */
    o.max_workers = 256;
    o.max_query_blocks = MAXTOK;
    assert_int_equal(kvr_index_create(&o, &f->ix), 0);
    assert_int_equal(kvr_score_create(f->ix, &f->conf, &f->s), 0);
    assert_int_equal(kvr_score_ctx_create(f->s, MAXTOK, &f->c), 0);
    f->next_engine_hash = 1000;
    return f;
}

static void fx_free(struct fx *f)
{
    kvr_score_ctx_destroy(f->c);
    kvr_score_destroy(f->s);
    kvr_index_destroy(f->ix);
    kvr_conf_free(&f->conf);
    free(f);
}

/* Stores the whole blocks of tokens[0..n) as one chain from the root for (pod, rank) in
 * tier, namespace (model, lora) with block size bs. */
static void store_bs(struct fx *f, const char *pod, uint32_t rank, const char *medium,
                     const char *model, const char *lora, const uint32_t *tokens, size_t n,
                     uint32_t bs)
{
    uint32_t wid, ns;
    uint64_t seed, content[MAXTOK];
    uint8_t tier;
    struct kvr_index_block blocks[MAXTOK];
    struct kvr_index_wres res = {0};
    size_t nb = n / bs;

    assert_int_equal(kvr_index_worker_intern(f->ix, pod, rank, &wid), 0);
    assert_int_equal(kvr_index_ns_intern(f->ix, model, lora, &ns, &seed), 0);
    kvr_index_ns_set_block_size(f->ix, ns, bs);
    assert_int_equal(kvr_index_tier_intern(f->ix, medium, medium ? strlen(medium) : 0, &tier), 0);
    kvr_hash_blocks(seed, tokens, nb, bs, content);
    for (size_t i = 0; i < nb; i++) {
        blocks[i].engine_hash = f->next_engine_hash++;
        blocks[i].content_hash = content[i];
    }
    assert_int_equal(kvr_index_store(f->ix, wid, tier, ns, NULL, blocks, nb, &res), 0);
}

static void store(struct fx *f, const char *pod, uint32_t rank, const char *medium,
                  const uint32_t *tokens, size_t n)
{
    store_bs(f, pod, rank, medium, "m", NULL, tokens, n, BS);
}

static int query(struct fx *f, const char *model, const char *lora, const uint32_t *tokens,
                 size_t n, const char *const *pods, size_t npods, struct kvr_score_result *r)
{
    struct kvr_score_query q = {.model = model, .lora_name = lora, .tokens = tokens,
                                .ntokens = n, .pods = pods, .npods = npods};
    return kvr_score_query(f->c, &q, r);
}

static void seq(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i * 7u;
}

static const struct kvr_score_entry *find(const struct kvr_score_result *r, const char *pod,
                                          uint32_t rank)
{
    for (size_t i = 0; i < r->nentries; i++)
        if (strcmp(r->entries[i].pod, pod) == 0 && r->entries[i].dp_rank == rank)
            return &r->entries[i];
    return NULL;
}

static void test_divergent_prefixes(void **state)
{
    struct fx *f = fx_new(NULL);
    uint32_t p[8 * BS + 3], other[8 * BS];
    struct kvr_score_result r;
    (void)state;

    seq(p, 8 * BS + 3, 100);
    memcpy(other, p, 3 * BS * sizeof(uint32_t));
    seq(other + 3 * BS, 5 * BS, 9000);
    store(f, "a", 0, "GPU", p, 8 * BS);
    store(f, "b", 0, "GPU", other, 8 * BS);
    store(f, "c", 0, "GPU", p, 2 * BS);

    assert_int_equal(query(f, "m", NULL, p, 8 * BS + 3, NULL, 0, &r), 0); /* partial tail */
    assert_int_equal(r.block_size, BS);
    assert_int_equal(r.query_blocks, 8);
    assert_int_equal(r.nentries, 3);
    assert_string_equal(r.entries[0].pod, "a");
    assert_int_equal(r.entries[0].matched_blocks, 8);
    assert_int_equal(r.entries[0].matched_tokens, 8 * BS);
    assert_string_equal(r.entries[1].pod, "b");
    assert_int_equal(r.entries[1].matched_blocks, 3);
    assert_string_equal(r.entries[2].pod, "c");
    assert_int_equal(r.entries[2].matched_blocks, 2);
    assert_true(fabs(r.entries[0].score - 8.0) < 1e-9);
    assert_int_equal(r.entries[0].tiers[KVR_TIER_GPU], 8);
    assert_string_equal(r.tier_names[KVR_TIER_GPU], "gpu");

    assert_int_equal(query(f, "m", NULL, other, 8 * BS, NULL, 0, &r), 0);
    assert_int_equal(r.nentries, 3);
    assert_string_equal(r.entries[0].pod, "b");
    assert_int_equal(r.entries[0].matched_blocks, 8);
    assert_int_equal(find(&r, "a", 0)->matched_blocks, 3);

    /* fewer tokens than one block: known block size, nothing to match */
    assert_int_equal(query(f, "m", NULL, p, BS - 1, NULL, 0, &r), 0);
    assert_int_equal(r.block_size, BS);
    assert_int_equal(r.query_blocks, 0);
    assert_int_equal(r.nentries, 0);
    /* first block unknown: nothing, although later blocks exist somewhere */
    {
        uint32_t q[8 * BS];
        memcpy(q, p, sizeof(q));
        q[0] ^= 1;
        assert_int_equal(query(f, "m", NULL, q, 8 * BS, NULL, 0, &r), 0);
        assert_int_equal(r.nentries, 0);
    }
    fx_free(f);
}

static void test_tiers_and_weights(void **state)
{
    struct fx *f = fx_new(NULL);
    uint32_t p[6 * BS];
    struct kvr_score_result r;
    struct kvr_conf c2;
    const struct kvr_score_entry *e;
    (void)state;

    seq(p, 6 * BS, 5);
    store(f, "t", 0, "GPU", p, 4 * BS);
    store(f, "t", 0, "cpu", p, 6 * BS);
    store(f, "u", 0, "FS", p, 5 * BS); /* a tier without a weight: default_weight */
    assert_int_equal(query(f, "m", NULL, p, 6 * BS, NULL, 0, &r), 0);
    e = find(&r, "t", 0);
    assert_non_null(e);
    assert_int_equal(e->matched_blocks, 6);
    assert_int_equal(e->tiers[KVR_TIER_GPU], 4);
    assert_int_equal(e->tiers[KVR_TIER_CPU], 6);
    assert_true(fabs(e->score - (4 * 1.0 + 2 * 0.8)) < 1e-9);
    e = find(&r, "u", 0);
    assert_int_equal(e->matched_blocks, 5);
    assert_true(fabs(e->score - 5 * 0.5) < 1e-9);
    assert_string_equal(r.entries[0].pod, "t");

    /* reload: weights by name, including the new tier */
    load_conf(&c2, "[score]\nweight.gpu = 2\nweight.cpu = 0.25\nweight.fs = 3\n");
    kvr_score_set_weights(f->s, &c2);
    kvr_conf_free(&c2);
    assert_int_equal(query(f, "m", NULL, p, 6 * BS, NULL, 0, &r), 0);
    assert_true(fabs(find(&r, "t", 0)->score - (4 * 2.0 + 2 * 0.25)) < 1e-9);
    assert_true(fabs(find(&r, "u", 0)->score - 5 * 3.0) < 1e-9);
    assert_string_equal(r.entries[0].pod, "u");
    fx_free(f);
}

/* The "predicted" tier is set aside: matched_blocks counts without it, predicted_blocks with
 * it, on hole-free holders (the fast path) and on a predicted holder missing its first
 * blocks, as confirmations leave it (the slow path). */
static void test_predicted_tier(void **state)
{
    struct fx *f = fx_new(NULL);
    uint32_t p[6 * BS], wid;
    uint8_t tier;
    struct kvr_score_result r;
    const struct kvr_score_entry *e;
    (void)state;

    seq(p, 6 * BS, 77);
    store(f, "w", 0, "GPU", p, 5 * BS); /* exact alone */
    assert_int_equal(query(f, "m", NULL, p, 6 * BS, NULL, 0, &r), 0);
    e = find(&r, "w", 0);
    assert_int_equal(e->matched_blocks, 5);
    assert_int_equal(e->predicted_blocks, 5);

    store(f, "x", 0, "GPU", p, 3 * BS);
    store(f, "x", 0, "predicted", p, 6 * BS);
    store(f, "y", 0, "predicted", p, 4 * BS);
    store(f, "z", 0, "GPU", p, 2 * BS);
    uint64_t first = f->next_engine_hash;
    store(f, "z", 0, "predicted", p, 5 * BS);
    assert_int_equal(kvr_index_worker_lookup(f->ix, "z", 0, &wid), 0);
    assert_int_equal(kvr_index_tier_intern(f->ix, "predicted", 9, &tier), 0);
    uint64_t gone[2] = {first, first + 1};
    struct kvr_index_wres res = {0};
    assert_int_equal(kvr_index_remove(f->ix, wid, tier, gone, 2, &res), 0);

    assert_int_equal(query(f, "m", NULL, p, 6 * BS, NULL, 0, &r), 0);
    e = find(&r, "x", 0);
    assert_int_equal(e->matched_blocks, 3);
    assert_int_equal(e->matched_tokens, 3 * BS);
    assert_int_equal(e->predicted_blocks, 6);
    assert_int_equal(e->tiers[tier], 6);
    assert_true(fabs(e->score - 6 * 1.0) < 1e-9); /* weight.predicted 1.0 */
    e = find(&r, "y", 0);
    assert_int_equal(e->matched_blocks, 0);
    assert_int_equal(e->predicted_blocks, 4);
    e = find(&r, "z", 0);
    assert_int_equal(e->matched_blocks, 2);
    assert_int_equal(e->predicted_blocks, 5);
    assert_int_equal(e->tiers[tier], 0);
    e = find(&r, "w", 0);
    assert_int_equal(e->matched_blocks, 5);
    assert_int_equal(e->predicted_blocks, 5);
    assert_string_equal(r.entries[0].pod, "x");
    fx_free(f);
}

static void test_pod_filter_ranks_and_ties(void **state)
{
    struct fx *f = fx_new(NULL);
    uint32_t p[4 * BS];
    struct kvr_score_result r;
    static const char *const only_b[] = {"b"};
    static const char *const nobody[] = {"nobody"};
    static const char *const mixed[] = {"nobody", "a", "a"};
    (void)state;

    seq(p, 4 * BS, 77);
    store(f, "b", 1, "GPU", p, 4 * BS);
    store(f, "b", 0, "GPU", p, 4 * BS);
    store(f, "a", 3, "GPU", p, 4 * BS);
    store(f, "c", 0, "GPU", p, 2 * BS);
    assert_int_equal(query(f, "m", NULL, p, 4 * BS, NULL, 0, &r), 0);
    assert_int_equal(r.nentries, 4);
    /* equal scores: by pod, then dp_rank */
    assert_string_equal(r.entries[0].pod, "a");
    assert_string_equal(r.entries[1].pod, "b");
    assert_int_equal(r.entries[1].dp_rank, 0);
    assert_string_equal(r.entries[2].pod, "b");
    assert_int_equal(r.entries[2].dp_rank, 1);
    assert_string_equal(r.entries[3].pod, "c");

    assert_int_equal(query(f, "m", NULL, p, 4 * BS, only_b, 1, &r), 0);
    assert_int_equal(r.nentries, 2);
    assert_string_equal(r.entries[0].pod, "b");
    assert_string_equal(r.entries[1].pod, "b");
    assert_int_equal(query(f, "m", NULL, p, 4 * BS, nobody, 1, &r), 0);
    assert_int_equal(r.nentries, 0);
    assert_int_equal(r.block_size, BS);
    assert_int_equal(query(f, "m", NULL, p, 4 * BS, mixed, 3, &r), 0);
    assert_int_equal(r.nentries, 1);
    assert_string_equal(r.entries[0].pod, "a");
    fx_free(f);
}

static void test_models_and_lora(void **state)
{
    struct fx *f = fx_new("[http]\nmax_query_tokens = 64\n");
    uint32_t p[4 * 8];
    struct kvr_score_result r;
    (void)state;

    seq(p, 32, 3);
    store_bs(f, "l", 0, "GPU", "m2", "ad-a", p, 32, 8);
    store_bs(f, "base", 0, "GPU", "m2", NULL, p, 16, 8);
    assert_int_equal(query(f, "nope", NULL, p, 32, NULL, 0, &r), 0);
    assert_int_equal(r.block_size, 0);
    assert_int_equal(r.query_blocks, 0);
    assert_int_equal(r.nentries, 0);

    assert_int_equal(query(f, "m2", "ad-a", p, 32, NULL, 0, &r), 0);
    assert_int_equal(r.block_size, 8);
    assert_int_equal(r.query_blocks, 4);
    assert_int_equal(r.nentries, 1);
    assert_string_equal(r.entries[0].pod, "l");
    assert_int_equal(r.entries[0].matched_tokens, 32);

    assert_int_equal(query(f, "m2", NULL, p, 32, NULL, 0, &r), 0);
    assert_int_equal(r.nentries, 1);
    assert_string_equal(r.entries[0].pod, "base");

    /* a LoRA never seen: the base model's block size, no entries */
    assert_int_equal(query(f, "m2", "ad-z", p, 32, NULL, 0, &r), 0);
    assert_int_equal(r.block_size, 8);
    assert_int_equal(r.nentries, 0);

    /* the ctx was created for MAXTOK tokens */
    {
        static uint32_t big[MAXTOK + 1];
        assert_int_equal(query(f, "m2", NULL, big, MAXTOK + 1, NULL, 0, &r), -E2BIG);
    }
    fx_free(f);
}

/* Approximate mode's inputs: a model events taught no block size is scored at its
 * [model] block_size, or 16 when it is in approximate mode (events' size wins once known;
 * a reload changes it); want_hashes returns the blocks' content hashes (even for a namespace
 * never indexed), exactly as ingest hashes stored blocks. */
static void test_configured_block_size_and_hashes(void **state)
{
    struct fx *f = fx_new("[model \"fresh\"]\nblock_size = 8\n"
                          "[model \"apx\"]\napproximate = on\n[model \"plain\"]\n");
    uint32_t p[40];
    uint64_t seed, want[5];
    struct kvr_score_result r;
    (void)state;

    seq(p, 40, 11);
    struct kvr_score_query q = {.model = "fresh", .tokens = p, .ntokens = 40,
                                .want_hashes = true};
    assert_int_equal(kvr_score_query(f->c, &q, &r), 0);
    assert_int_equal(r.block_size, 8);
    assert_int_equal(r.query_blocks, 5);
    assert_int_equal(r.nentries, 0);
    assert_non_null(r.hashes);
    seed = kvr_hash_ns_seed("fresh", 5, NULL, 0);
    kvr_hash_blocks(seed, p, 5, 8, want);
    assert_memory_equal(r.hashes, want, sizeof(want));
    /* a salt folds into block 0 as for any query */
    q.cache_salt = "tenant";
    assert_int_equal(kvr_score_query(f->c, &q, &r), 0);
    assert_true(r.hashes[0] != want[0] && r.hashes[1] == want[1]);
    q.cache_salt = NULL;
    /* without want_hashes: none */
    q.want_hashes = false;
    assert_int_equal(kvr_score_query(f->c, &q, &r), 0);
    assert_null(r.hashes);
    /* approximate mode without block_size: 16; a section with neither: unknown model */
    q.model = "apx";
    assert_int_equal(kvr_score_query(f->c, &q, &r), 0);
    assert_int_equal(r.block_size, 16);
    assert_int_equal(r.query_blocks, 2);
    q.model = "plain";
    assert_int_equal(kvr_score_query(f->c, &q, &r), 0);
    assert_int_equal(r.block_size, 0);
    /* a reload changes the configured size from the next query on */
    struct kvr_conf c2;
    load_conf(&c2, "[model \"fresh\"]\nblock_size = 4\n");
    kvr_score_set_weights(f->s, &c2);
    kvr_conf_free(&c2);
    q.model = "fresh";
    assert_int_equal(kvr_score_query(f->c, &q, &r), 0);
    assert_int_equal(r.block_size, 4);
    assert_int_equal(r.query_blocks, 10);
    /* once events teach a size (here 10), it wins over the configured one */
    store_bs(f, "w", 0, "GPU", "fresh", NULL, p, 40, 10);
    assert_int_equal(kvr_score_query(f->c, &q, &r), 0);
    assert_int_equal(r.block_size, 10);
    assert_int_equal(r.query_blocks, 4);
    assert_int_equal(r.nentries, 1);
    assert_int_equal(r.entries[0].matched_blocks, 4);
    fx_free(f);
}

/* ---- randomized comparison with a brute-force reference --------------------------------- */

#define NW 12
#define NBASE 3
#define MAXB 40

struct chain_rec {
    int w;
    int tier;    /* 0 gpu, 1 cpu, 2 storage */
    uint32_t toks[MAXB * BS];
    int nb;
};

static void test_random_vs_reference(void **state)
{
    unsigned seed0 = (unsigned)time(NULL);
    static const char *const media[] = {"GPU", "CPU", "STORAGE"};
    static const double weights[] = {1.0, 0.8, 0.5};
    (void)state;

    for (int iter = 0; iter < 60; iter++) {
        unsigned seed = seed0 + (unsigned)iter * 7919u, s = seed;
        struct fx *f = fx_new(NULL);
        static struct chain_rec recs[200];
        static uint32_t base[NBASE][MAXB * BS];
        int nrec = 0;
        char pods[NW][16];

        for (int b = 0; b < NBASE; b++)
            for (int i = 0; i < MAXB * BS; i++)
                base[b][i] = (uint32_t)rand_r(&s) % 1000u;
        for (int w = 0; w < NW; w++)
            snprintf(pods[w], sizeof(pods[w]), "p%02d", w);
        for (int k = 0; k < 100; k++) {
            struct chain_rec *c = &recs[nrec++];
            int b = rand_r(&s) % NBASE, div;
            c->w = rand_r(&s) % NW;
            c->tier = rand_r(&s) % 3;
            c->nb = 1 + rand_r(&s) % MAXB;
            memcpy(c->toks, base[b], sizeof(c->toks));
            div = rand_r(&s) % (MAXB + 10); /* diverge at a random block, or never */
            for (int i = div * BS; i < MAXB * BS; i++)
                c->toks[i] = 5000u + (uint32_t)rand_r(&s) % 1000u;
            store(f, pods[c->w / 2], (uint32_t)(c->w % 2), media[c->tier], c->toks,
                  (size_t)c->nb * BS);
        }
        for (int qn = 0; qn < 20; qn++) {
            uint32_t q[MAXB * BS];
            int b = rand_r(&s) % NBASE, qb = 1 + rand_r(&s) % MAXB;
            int tm[NW][3];
            struct kvr_score_result r;
            size_t want = 0;

            memcpy(q, base[b], sizeof(q));
            if (rand_r(&s) % 3 == 0) /* sometimes query a stored divergent chain */
                memcpy(q, recs[rand_r(&s) % nrec].toks, sizeof(q));
            memset(tm, 0, sizeof(tm));
            for (int k = 0; k < nrec; k++) {
                int common = 0;
                while (common < recs[k].nb && common < qb &&
                       memcmp(recs[k].toks + common * BS, q + common * BS,
                              BS * sizeof(uint32_t)) == 0)
                    common++;
                if (common > tm[recs[k].w][recs[k].tier])
                    tm[recs[k].w][recs[k].tier] = common;
            }
            assert_int_equal(query(f, "m", NULL, q, (size_t)qb * BS, NULL, 0, &r), 0);
            for (int w = 0; w < NW; w++) {
                int matched = 0;
                double sc = 0;
                const struct kvr_score_entry *e;
                for (int t = 0; t < 3; t++)
                    if (tm[w][t] > matched)
                        matched = tm[w][t];
                for (int j = 0; j < matched; j++) {
                    double best = 0;
                    for (int t = 0; t < 3; t++)
                        if (tm[w][t] > j && weights[t] > best)
                            best = weights[t];
                    sc += best;
                }
                e = find(&r, pods[w / 2], (uint32_t)(w % 2));
                if (matched == 0) {
                    if (e != NULL)
                        fail_msg("seed %u: worker %d listed with 0 blocks", seed, w);
                    continue;
                }
                want++;
                if (e == NULL || (int)e->matched_blocks != matched ||
                    (int)e->tiers[KVR_TIER_GPU] != tm[w][0] ||
                    (int)e->tiers[KVR_TIER_CPU] != tm[w][1] ||
                    (int)e->tiers[KVR_TIER_STORAGE] != tm[w][2] || fabs(e->score - sc) > 1e-9)
                    fail_msg("seed %u iter %d: worker %d: got %d (g%d c%d s%d, %.3f), want %d "
                             "(g%d c%d s%d, %.3f)",
                             seed, qn, w, e ? (int)e->matched_blocks : -1,
                             e ? (int)e->tiers[0] : -1, e ? (int)e->tiers[1] : -1,
                             e ? (int)e->tiers[2] : -1, e ? e->score : -1.0, matched, tm[w][0],
                             tm[w][1], tm[w][2], sc);
            }
            assert_int_equal(r.nentries, want);
            for (size_t i = 1; i < r.nentries; i++) {
                const struct kvr_score_entry *a = &r.entries[i - 1], *b2 = &r.entries[i];
                int c = strcmp(a->pod, b2->pod);
                if (!(a->score > b2->score ||
                      (a->score == b2->score && (c < 0 || (c == 0 && a->dp_rank < b2->dp_rank)))))
                    fail_msg("seed %u: entries %zu and %zu out of order", seed, i - 1, i);
            }
        }
        fx_free(f);
    }
}

static void test_metrics(void **state)
{
    struct fx *f = fx_new(NULL);
    uint32_t p[2 * BS];
    struct kvr_score_result r;
    struct kvr_buf b;
    (void)state;

    seq(p, 2 * BS, 1);
    store(f, "a", 0, NULL, p, 2 * BS);
    assert_int_equal(query(f, "m", NULL, p, 2 * BS, NULL, 0, &r), 0);
    assert_int_equal(query(f, "zz", NULL, p, 2 * BS, NULL, 0, &r), 0);
    kvr_buf_init(&b);
    kvr_score_metrics(f->s, &b);
    assert_non_null(strstr(b.data, "# TYPE kvrouter_score_latency_seconds histogram"));
    assert_non_null(strstr(b.data, "kvrouter_score_latency_seconds_count 2"));
    assert_non_null(strstr(b.data, "kvrouter_score_query_blocks_count 1"));
    assert_non_null(strstr(b.data, "kvrouter_score_matched_fraction_bucket{le=\"1\"} 1"));
    assert_non_null(strstr(b.data, "kvrouter_score_unknown_model_total 1"));
    kvr_buf_free(&b);
    fx_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_divergent_prefixes),
        cmocka_unit_test(test_tiers_and_weights),
        cmocka_unit_test(test_predicted_tier),
        cmocka_unit_test(test_pod_filter_ranks_and_ties),
        cmocka_unit_test(test_models_and_lora),
        cmocka_unit_test(test_configured_block_size_and_hashes),
        cmocka_unit_test(test_random_vs_reference),
        cmocka_unit_test(test_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
