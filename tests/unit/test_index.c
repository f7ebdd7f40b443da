/* test_index.c — unit tests of every index operation and edge case. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "index/hash.h"
#include "index/index.h"

#define MAXN 4096

struct fx {
    struct kvr_index *ix;
    struct kvr_index_reader *r;
    uint32_t ns, ns_lora, ns_b;
    uint32_t w0, w1, w2; /* w0 = pod-a rank 0, w1 = pod-a rank 1, w2 = pod-b rank 0 */
    uint32_t pod_a, pod_b;
};

/* content hash of logical block i of document d; engine hash of the same */
static uint64_t C(int d, int i)
{
    return 0x1000000ull * (uint64_t)(d + 1) + (uint64_t)i * 7919u + 1;
}
static uint64_t E(int d, int i)
{
    return 0xe000000000ull + 0x100000ull * (uint64_t)(d + 1) + (uint64_t)i;
}

static void mk(struct fx *f, uint32_t stride, uint32_t cap)
{
    struct kvr_index_opts o = {.jump_stride = stride, .orphan_capacity = cap,
                               .max_workers = 64, .max_query_blocks = MAXN};
    memset(f, 0, sizeof(*f));
    assert_int_equal(kvr_index_create(&o, &f->ix), 0);
    assert_int_equal(kvr_index_reader_create(f->ix, &f->r), 0);
    assert_int_equal(kvr_index_ns_intern(f->ix, "m", NULL, &f->ns, NULL), 0);
    assert_int_equal(kvr_index_ns_intern(f->ix, "m", "lora1", &f->ns_lora, NULL), 0);
    assert_int_equal(kvr_index_ns_intern(f->ix, "m2", NULL, &f->ns_b, NULL), 0);
    assert_int_equal(kvr_index_worker_intern(f->ix, "pod-a", 0, &f->w0), 0);
    assert_int_equal(kvr_index_worker_intern(f->ix, "pod-a", 1, &f->w1), 0);
    assert_int_equal(kvr_index_worker_intern(f->ix, "pod-b", 0, &f->w2), 0);
    assert_int_equal(kvr_index_pod_lookup(f->ix, "pod-a", &f->pod_a), 0);
    assert_int_equal(kvr_index_pod_lookup(f->ix, "pod-b", &f->pod_b), 0);
}

static void rm_fx(struct fx *f)
{
    kvr_index_reader_destroy(f->r);
    kvr_index_destroy(f->ix);
}

/* stores blocks [from, to) of document d after parent block from-1 (none when from == 0) */
static struct kvr_index_wres st(struct fx *f, uint32_t wid, uint8_t tier, uint32_t ns, int d,
                                int from, int to)
{
    struct kvr_index_block b[MAXN];
    struct kvr_index_wres res = {0};
    for (int i = from; i < to; i++) {
        b[i - from].engine_hash = E(d, i);
        b[i - from].content_hash = C(d, i);
    }
    uint64_t parent = E(d, from - 1);
    assert_int_equal(kvr_index_store(f->ix, wid, tier, ns, from ? &parent : NULL, b,
                                     (size_t)(to - from), &res),
                     0);
    return res;
}

static struct kvr_index_wres rmv(struct fx *f, uint32_t wid, uint8_t tier, int d, int from,
                                 int to)
{
    uint64_t h[MAXN];
    struct kvr_index_wres res = {0};
    for (int i = from; i < to; i++)
        h[i - from] = E(d, i);
    assert_int_equal(kvr_index_remove(f->ix, wid, tier, h, (size_t)(to - from), &res), 0);
    return res;
}

static const double W1[KVR_TIER_MAX] = {1, 1, 1, 1, 1, 1, 1, 1};

/* query = content of document d [0, n), with q[div] replaced when div >= 0 */
static const struct kvr_index_hit *q(struct fx *f, uint32_t ns, int d, int n, int div,
                                     const uint32_t *pods, size_t npods, const double *w,
                                     uint32_t wid, size_t *nhits)
{
    uint64_t qq[MAXN];
    const struct kvr_index_hit *hits;
    size_t nh;
    for (int i = 0; i < n; i++)
        qq[i] = i == div ? 0xbadbadull : C(d, i);
    assert_int_equal(kvr_index_find(f->r, ns, qq, (size_t)n, pods, npods, w ? w : W1, &hits,
                                    &nh),
                     0);
    if (nhits)
        *nhits = nh;
    for (size_t i = 0; i < nh; i++) {
        if (i > 0)
            assert_true(hits[i - 1].wid < hits[i].wid);
        if (hits[i].wid == wid)
            return &hits[i];
    }
    return NULL;
}

static uint32_t matched(struct fx *f, uint32_t ns, int d, int n, uint32_t wid)
{
    const struct kvr_index_hit *h = q(f, ns, d, n, -1, NULL, 0, NULL, wid, NULL);
    return h ? h->matched : 0;
}

static void test_store_find_basic(void **state)
{
    (void)state;
    uint32_t strides[] = {1, 2, 7, 32};
    for (int s = 0; s < 4; s++) {
        struct fx f;
        mk(&f, strides[s], 0);
        struct kvr_index_wres r = st(&f, f.w0, KVR_TIER_GPU, f.ns, 0, 0, 100);
        assert_int_equal(r.stored, 100);
        for (int n = 1; n <= 130; n++)
            assert_int_equal(matched(&f, f.ns, 0, n, f.w0), n < 100 ? n : 100);
        assert_int_equal(matched(&f, f.ns, 1, 50, f.w0), 0); /* other content */
        size_t nh;
        assert_null(q(&f, f.ns, 0, 10, 0, NULL, 0, NULL, f.w0, &nh)); /* miss at block 0 */
        assert_int_equal(nh, 0);
        struct kvr_index_stats stt;
        kvr_index_stats(f.ix, &stt);
        assert_int_equal(stt.entries, 100);
        assert_int_equal(stt.holders, 100);
        assert_int_equal(stt.workers, 3);
        assert_int_equal(stt.namespaces, 3);
        assert_true(stt.bytes > 0);
        /* a stored continuation */
        r = st(&f, f.w0, KVR_TIER_GPU, f.ns, 0, 100, 150);
        assert_int_equal(r.stored, 50);
        assert_int_equal(matched(&f, f.ns, 0, 150, f.w0), 150);
        rm_fx(&f);
    }
}

static void test_duplicates_refcounted(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    st(&f, f.w0, 0, f.ns, 0, 0, 40);
    struct kvr_index_wres r = st(&f, f.w0, 0, f.ns, 0, 0, 40);
    assert_int_equal(r.stored, 0);
    assert_int_equal(r.duplicates, 40);
    uint64_t b[KVR_TIER_MAX];
    kvr_index_worker_blocks(f.ix, f.w0, b);
    assert_int_equal(b[0], 40); /* distinct blocks */
    assert_int_equal(kvr_index_copies(f.ix, f.w0, 0, E(0, 7)), 2);
    assert_int_equal(kvr_index_copies(f.ix, f.w0, 1, E(0, 7)), 0); /* another tier */
    assert_int_equal(kvr_index_copies(f.ix, f.w1, 0, E(0, 7)), 0); /* another worker */
    assert_int_equal(kvr_index_copies(f.ix, f.w0, 0, E(9, 7)), 0); /* unknown hash */
    r = rmv(&f, f.w0, 0, 0, 0, 40);
    assert_int_equal(kvr_index_copies(f.ix, f.w0, 0, E(0, 7)), 1);
    assert_int_equal(r.removed, 0); /* one copy left */
    assert_int_equal(matched(&f, f.ns, 0, 40, f.w0), 40);
    r = rmv(&f, f.w0, 0, 0, 0, 40);
    assert_int_equal(r.removed, 40);
    assert_int_equal(matched(&f, f.ns, 0, 40, f.w0), 0);
    r = rmv(&f, f.w0, 0, 0, 0, 40);
    assert_int_equal(r.unknown_removes, 40);

    /* more copies than the record's inline counter holds (65535) */
    size_t many = 70000;
    struct kvr_index_block *bl = calloc(many, sizeof(*bl));
    uint64_t *hh = calloc(many, sizeof(*hh));
    for (size_t i = 0; i < many; i++) {
        bl[i] = (struct kvr_index_block){E(5, 0), C(5, 0)};
        hh[i] = E(5, 0);
    }
    r = (struct kvr_index_wres){0};
    assert_int_equal(kvr_index_store(f.ix, f.w1, 0, f.ns, NULL, bl, many, &r), 0);
    assert_int_equal(r.stored, 1);
    assert_int_equal(r.duplicates, many - 1);
    assert_int_equal(kvr_index_copies(f.ix, f.w1, 0, E(5, 0)), many); /* past 0xffff */
    r = (struct kvr_index_wres){0};
    assert_int_equal(kvr_index_remove(f.ix, f.w1, 0, hh, many - 1, &r), 0);
    assert_int_equal(kvr_index_copies(f.ix, f.w1, 0, E(5, 0)), 1);
    assert_int_equal(r.removed, 0);
    assert_int_equal(matched(&f, f.ns, 5, 1, f.w1), 1);
    r = (struct kvr_index_wres){0};
    assert_int_equal(kvr_index_remove(f.ix, f.w1, 0, hh, 2, &r), 0);
    assert_int_equal(r.removed, 1);
    assert_int_equal(r.unknown_removes, 1);
    assert_int_equal(matched(&f, f.ns, 5, 1, f.w1), 0);
    free(bl);
    free(hh);
    struct kvr_index_stats stt;
    kvr_index_stats(f.ix, &stt);
    assert_int_equal(stt.entries, 0);
    assert_int_equal(stt.holders, 0);
    rm_fx(&f);
}


/* Extra keys at the index: a salted (or media-keyed) block 0 has its own content hash, and
 * the chain carries it, so the same tokens' later blocks are other entries too: a plain query
 * finds nothing of the salted chain, the same salt all of it, a different salt nothing. */
static void test_extra_keys_chain(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    struct kvr_index_block b[8];
    uint64_t plain[8], salted[8], other[8];
    struct kvr_index_wres r = {0};
    for (int i = 0; i < 8; i++) {
        plain[i] = salted[i] = other[i] = C(3, i);
        b[i] = (struct kvr_index_block){E(3, i), C(3, i)};
    }
    salted[0] = kvr_hash_xk_str(plain[0], "tenant-a", 8);
    other[0] = kvr_hash_xk_str(plain[0], "tenant-b", 8);
    b[0].content_hash = salted[0];
    assert_int_equal(kvr_index_store(f.ix, f.w0, 0, f.ns, NULL, b, 8, &r), 0);
    st(&f, f.w2, 0, f.ns, 3, 0, 8); /* the plain chain on pod-b */
    const struct kvr_index_hit *hits;
    size_t nh;
    uint32_t got[3] = {0, 0, 0};
    const uint64_t *qs[3] = {plain, salted, other};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(kvr_index_find(f.r, f.ns, qs[k], 8, NULL, 0, W1, &hits, &nh), 0);
        for (size_t i = 0; i < nh; i++)
            got[k] |= (hits[i].wid == f.w0 ? 1u : 2u) << (hits[i].matched == 8 ? 0 : 4);
    }
    assert_int_equal(got[0], 2); /* plain: pod-b only, whole chain */
    assert_int_equal(got[1], 1); /* salted: pod-a only, whole chain */
    assert_int_equal(got[2], 0); /* another salt: nobody */
    rm_fx(&f);
}

static void test_orphans(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 100);
    /* blocks 10..60 arrive before 0..10: parked, never indexed at position 0 */
    struct kvr_index_wres r = st(&f, f.w0, 0, f.ns, 0, 10, 60);
    assert_int_equal(r.orphaned, 50);
    assert_int_equal(r.stored, 0);
    struct kvr_index_stats stt;
    kvr_index_stats(f.ix, &stt);
    assert_int_equal(stt.orphans, 50);
    assert_int_equal(kvr_index_worker_orphans(f.ix, f.w0), 50);
    assert_int_equal(stt.entries, 0);
    /* a query starting with block 10's content does not match (SGLang would) */
    uint64_t qq[50];
    const struct kvr_index_hit *hits;
    size_t nh;
    for (int i = 0; i < 50; i++)
        qq[i] = C(0, 10 + i);
    assert_int_equal(kvr_index_find(f.r, f.ns, qq, 50, NULL, 0, W1, &hits, &nh), 0);
    assert_int_equal(nh, 0);
    /* the parent arrives: adoption */
    r = st(&f, f.w0, 0, f.ns, 0, 0, 10);
    assert_int_equal(r.stored, 60);
    assert_int_equal(r.orphans_adopted, 50);
    assert_int_equal(kvr_index_worker_orphans(f.ix, f.w0), 0);
    assert_int_equal(matched(&f, f.ns, 0, 60, f.w0), 60);
    kvr_index_stats(f.ix, &stt);
    assert_int_equal(stt.orphans, 0);
    /* parent known in another tier of the worker: not an orphan */
    r = st(&f, f.w0, KVR_TIER_CPU, f.ns, 0, 30, 40);
    assert_int_equal(r.orphaned, 0);
    assert_int_equal(r.stored, 10);
    /* parent unknown for this worker even though another worker has it */
    r = st(&f, f.w1, 0, f.ns, 0, 30, 40);
    assert_int_equal(r.orphaned, 10);
    /* removing a parked block drops it */
    r = rmv(&f, f.w1, 0, 0, 35, 36);
    assert_int_equal(r.orphans_dropped, 1);
    assert_int_equal(r.unknown_removes, 0);
    /* capacity: 100 per worker; the oldest are evicted */
    r = st(&f, f.w2, 0, f.ns, 1, 1, 81);
    assert_int_equal(r.orphaned, 80);
    r = st(&f, f.w2, 0, f.ns, 2, 1, 41);
    assert_int_equal(r.orphaned, 40);
    assert_int_equal(r.orphans_dropped, 20);
    /* a store larger than the capacity keeps its first blocks */
    r = st(&f, f.w2, 0, f.ns, 3, 1, 151);
    assert_int_equal(r.orphaned, 100);
    assert_int_equal(r.orphans_dropped, 100 + 50);
    /* clear drops parked blocks */
    r = (struct kvr_index_wres){0};
    assert_int_equal(kvr_index_clear(f.ix, f.w2, -1, &r), 0);
    assert_int_equal(r.orphans_dropped, 100);
    /* the adopted chain of document 3 stays parked-free and exact */
    r = st(&f, f.w2, 0, f.ns, 3, 0, 1);
    assert_int_equal(r.orphans_adopted, 0);
    assert_int_equal(matched(&f, f.ns, 3, 10, f.w2), 1);
    rm_fx(&f);

    /* capacity 0: dropped and counted */
    mk(&f, 32, 0);
    r = st(&f, f.w0, 0, f.ns, 0, 5, 25);
    assert_int_equal(r.orphaned, 0);
    assert_int_equal(r.orphans_dropped, 20);
    st(&f, f.w0, 0, f.ns, 0, 0, 5);
    assert_int_equal(matched(&f, f.ns, 0, 25, f.w0), 5);
    rm_fx(&f);
}

static void test_remove_mixed_unknown(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    st(&f, f.w0, 0, f.ns, 0, 0, 64);
    uint64_t h[6] = {0x1234, E(0, 63), 0x5678, E(0, 62), E(9, 9), E(0, 61)};
    struct kvr_index_wres r = {0};
    assert_int_equal(kvr_index_remove(f.ix, f.w0, 0, h, 6, &r), 0);
    assert_int_equal(r.removed, 3);
    assert_int_equal(r.unknown_removes, 3);
    assert_int_equal(matched(&f, f.ns, 0, 64, f.w0), 61);
    /* removing from a tier the worker never used */
    r = rmv(&f, f.w0, KVR_TIER_CPU, 0, 0, 3);
    assert_int_equal(r.unknown_removes, 3);
    rm_fx(&f);
}

static void test_clear_and_purge(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    st(&f, f.w0, KVR_TIER_GPU, f.ns, 0, 0, 50);
    st(&f, f.w0, KVR_TIER_CPU, f.ns, 0, 0, 70);
    st(&f, f.w1, KVR_TIER_GPU, f.ns, 0, 0, 30);
    st(&f, f.w2, KVR_TIER_GPU, f.ns, 0, 0, 20);
    uint64_t b[KVR_TIER_MAX];
    kvr_index_worker_blocks(f.ix, f.w0, b);
    assert_int_equal(b[KVR_TIER_GPU], 50);
    assert_int_equal(b[KVR_TIER_CPU], 70);
    struct kvr_index_wres r = {0};
    assert_int_equal(kvr_index_clear(f.ix, f.w0, KVR_TIER_CPU, &r), 0);
    assert_int_equal(r.cleared, 70);
    kvr_index_worker_blocks(f.ix, f.w0, b);
    assert_int_equal(b[KVR_TIER_CPU], 0);
    assert_int_equal(b[KVR_TIER_GPU], 50);
    assert_int_equal(matched(&f, f.ns, 0, 100, f.w0), 50);
    memset(&r, 0, sizeof(r));
    assert_int_equal(kvr_index_clear(f.ix, f.w0, -1, &r), 0);
    assert_int_equal(r.cleared, 50);
    assert_int_equal(matched(&f, f.ns, 0, 100, f.w0), 0);
    /* purge pod-a: both ranks, pod-b untouched */
    st(&f, f.w0, KVR_TIER_GPU, f.ns, 0, 0, 10);
    memset(&r, 0, sizeof(r));
    assert_int_equal(kvr_index_purge_pod(f.ix, f.pod_a, &r), 0);
    assert_int_equal(r.cleared, 40);
    assert_int_equal(matched(&f, f.ns, 0, 100, f.w0), 0);
    assert_int_equal(matched(&f, f.ns, 0, 100, f.w1), 0);
    assert_int_equal(matched(&f, f.ns, 0, 100, f.w2), 20);
    struct kvr_index_stats stt;
    kvr_index_stats(f.ix, &stt);
    assert_int_equal(stt.entries, 20);
    assert_int_equal(stt.holders, 20);
    assert_int_equal(kvr_index_purge_pod(f.ix, 99, &r), -EINVAL);
    assert_int_equal(kvr_index_clear(f.ix, 99, -1, &r), -EINVAL);
    rm_fx(&f);
}

static void test_divergent_prefix(void **state)
{
    (void)state;
    uint32_t strides[] = {1, 2, 7, 32};
    for (int s = 0; s < 4; s++) {
        struct fx f;
        mk(&f, strides[s], 0);
        st(&f, f.w0, 0, f.ns, 0, 0, 256);
        /* SGLang's case: diverges at 1, identical content at every later landing */
        const struct kvr_index_hit *h = q(&f, f.ns, 0, 256, 1, NULL, 0, NULL, f.w0, NULL);
        assert_non_null(h);
        assert_int_equal(h->matched, 1);
        for (int d = 2; d < 256; d += 37) {
            h = q(&f, f.ns, 0, 256, d, NULL, 0, NULL, f.w0, NULL);
            assert_int_equal(h->matched, d);
        }
        /* a second worker holds a sibling chain sharing blocks 0..99 */
        struct kvr_index_block b[200];
        for (int i = 0; i < 200; i++) {
            b[i].engine_hash = 0xabc000 + (uint64_t)i;
            b[i].content_hash = i < 100 ? C(0, i) : C(0, i) ^ 1;
        }
        struct kvr_index_wres r = {0};
        assert_int_equal(kvr_index_store(f.ix, f.w1, 0, f.ns, NULL, b, 200, &r), 0);
        assert_int_equal(matched(&f, f.ns, 0, 256, f.w0), 256);
        assert_int_equal(matched(&f, f.ns, 0, 256, f.w1), 100);
        struct kvr_index_stats stt;
        kvr_index_stats(f.ix, &stt);
        assert_int_equal(stt.entries, 356);
        assert_int_equal(stt.holders, 456);
        rm_fx(&f);
    }
}

/* find's early look at the last block: one long match among shorter shared ones (it
 * finishes at the first landing where the shorter ones are gone), a single holder of the
 * whole query (it finishes after the first landings), and queries where the look fails
 * (longer than the long match, or diverging before its end); long queries get their
 * landings further apart. Every answer against min(stored length, divergence, n). */
static void test_long_match_look(void **state)
{
    (void)state;
    uint32_t strides[] = {1, 2, 7, 32};
    const int plen[] = {100, 300, 301, 1500, 2999}; /* shorter shared prefixes of doc 0 */
    const int NL = 3000;                            /* the long match */
    for (int s = 0; s < 4; s++) {
        struct fx f;
        mk(&f, strides[s], 0);
        uint32_t ws[5], wl, w1;
        for (int k = 0; k < 5; k++) {
            char pod[16];
            snprintf(pod, sizeof(pod), "pod-s%d", k);
            assert_int_equal(kvr_index_worker_intern(f.ix, pod, 0, &ws[k]), 0);
            st(&f, ws[k], 0, f.ns, 0, 0, plen[k]);
        }
        assert_int_equal(kvr_index_worker_intern(f.ix, "pod-long", 0, &wl), 0);
        st(&f, wl, 0, f.ns, 0, 0, NL);
        assert_int_equal(kvr_index_worker_intern(f.ix, "pod-one", 0, &w1), 0);
        st(&f, w1, 0, f.ns, 1, 0, 2000); /* doc 1: held by one worker alone */
        const int ns[] = {NL, NL - 1, NL + 37, 2000, 1000, 333, 64};
        const int divs[] = {-1, 1, 99, 100, 101, 299, 300, 1499, 1500, 2500, 2998, 2999};
        for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
            for (size_t b = 0; b < sizeof(divs) / sizeof(divs[0]); b++) {
                int n = ns[a], d = divs[b] < n ? divs[b] : -1;
                int lim = d >= 0 ? d : n;
                const struct kvr_index_hit *h = q(&f, f.ns, 0, n, d, NULL, 0, NULL, wl, NULL);
                assert_non_null(h);
                assert_int_equal(h->matched, lim < NL ? lim : NL);
                for (int k = 0; k < 5; k++) {
                    h = q(&f, f.ns, 0, n, d, NULL, 0, NULL, ws[k], NULL);
                    assert_non_null(h);
                    assert_int_equal(h->matched, lim < plen[k] ? lim : plen[k]);
                }
                h = q(&f, f.ns, 1, n, d, NULL, 0, NULL, w1, NULL);
                assert_non_null(h);
                assert_int_equal(h->matched, lim < 2000 ? lim : 2000);
            }
        }
        rm_fx(&f);
    }
}

static void test_holes(void **state)
{
    (void)state;
    uint32_t strides[] = {1, 2, 7, 32};
    for (int s = 0; s < 4; s++) {
        struct fx f;
        mk(&f, strides[s], 0);
        st(&f, f.w0, 0, f.ns, 0, 0, 100);
        st(&f, f.w1, 0, f.ns, 0, 0, 100);
        rmv(&f, f.w0, 0, 0, 40, 41); /* a middle block: later ones stay */
        assert_int_equal(matched(&f, f.ns, 0, 100, f.w0), 40);
        assert_int_equal(matched(&f, f.ns, 0, 100, f.w1), 100);
        rmv(&f, f.w0, 0, 0, 3, 4);
        assert_int_equal(matched(&f, f.ns, 0, 100, f.w0), 3);
        /* refill both holes: full again */
        st(&f, f.w0, 0, f.ns, 0, 3, 4);
        assert_int_equal(matched(&f, f.ns, 0, 100, f.w0), 40);
        st(&f, f.w0, 0, f.ns, 0, 40, 41);
        assert_int_equal(matched(&f, f.ns, 0, 100, f.w0), 100);
        /* a hole filled by another tier: the worker matches, the tiers do not */
        st(&f, f.w2, KVR_TIER_GPU, f.ns, 0, 0, 100);
        st(&f, f.w2, KVR_TIER_CPU, f.ns, 0, 50, 51);
        rmv(&f, f.w2, KVR_TIER_GPU, 0, 50, 51);
        const struct kvr_index_hit *h = q(&f, f.ns, 0, 100, -1, NULL, 0, NULL, f.w2, NULL);
        assert_int_equal(h->matched, 100);
        assert_int_equal(h->tier_matched[KVR_TIER_GPU], 50);
        assert_int_equal(h->tier_matched[KVR_TIER_CPU], 0);
        rm_fx(&f);
    }
}

static void test_tiers_and_score(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 7, 0);
    st(&f, f.w0, KVR_TIER_GPU, f.ns, 0, 0, 10);
    st(&f, f.w0, KVR_TIER_CPU, f.ns, 0, 0, 20);
    double w[KVR_TIER_MAX] = {1.0, 0.5, 0.25, 0, 0, 0, 0, 0};
    const struct kvr_index_hit *h = q(&f, f.ns, 0, 30, -1, NULL, 0, w, f.w0, NULL);
    assert_int_equal(h->matched, 20);
    assert_int_equal(h->tier_matched[KVR_TIER_GPU], 10);
    assert_int_equal(h->tier_matched[KVR_TIER_CPU], 20);
    assert_true(h->score == 10 * 1.0 + 10 * 0.5);
    /* offloaded continuation: blocks 20..30 only in storage, parent in cpu */
    st(&f, f.w0, KVR_TIER_STORAGE, f.ns, 0, 20, 30);
    h = q(&f, f.ns, 0, 40, -1, NULL, 0, w, f.w0, NULL);
    assert_int_equal(h->matched, 30);
    assert_int_equal(h->tier_matched[KVR_TIER_STORAGE], 0);
    assert_true(h->score == 10 * 1.0 + 10 * 0.5 + 10 * 0.25);
    /* best weight wins even when it is not tier 0 */
    double w2[KVR_TIER_MAX] = {0.5, 2.0, 1.0, 0, 0, 0, 0, 0};
    h = q(&f, f.ns, 0, 40, -1, NULL, 0, w2, f.w0, NULL);
    assert_true(h->score == 20 * 2.0 + 10 * 1.0);
    rm_fx(&f);
}

static void test_pod_filter(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    st(&f, f.w0, 0, f.ns, 0, 0, 10);
    st(&f, f.w1, 0, f.ns, 0, 0, 20);
    st(&f, f.w2, 0, f.ns, 0, 0, 30);
    size_t nh;
    uint32_t pods[1] = {f.pod_b};
    assert_null(q(&f, f.ns, 0, 30, -1, pods, 1, NULL, f.w0, &nh));
    assert_int_equal(nh, 1);
    assert_int_equal(q(&f, f.ns, 0, 30, -1, pods, 1, NULL, f.w2, &nh)->matched, 30);
    pods[0] = f.pod_a;
    assert_int_equal(q(&f, f.ns, 0, 30, -1, pods, 1, NULL, f.w1, &nh)->matched, 20);
    assert_int_equal(nh, 2);
    q(&f, f.ns, 0, 30, -1, NULL, 0, NULL, f.w1, &nh);
    assert_int_equal(nh, 3);
    size_t n = kvr_index_pod_workers(f.ix, f.pod_a, NULL, 0);
    assert_int_equal(n, 2);
    rm_fx(&f);
}

static void test_namespaces_isolated(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    st(&f, f.w0, 0, f.ns_lora, 0, 0, 10);
    assert_int_equal(matched(&f, f.ns, 0, 10, f.w0), 0);
    assert_int_equal(matched(&f, f.ns_b, 0, 10, f.w0), 0);
    assert_int_equal(matched(&f, f.ns_lora, 0, 10, f.w0), 10);
    /* interning is idempotent, "" LoRA == none */
    uint32_t ns;
    uint64_t seed, seed2;
    assert_int_equal(kvr_index_ns_intern(f.ix, "m", "", &ns, &seed), 0);
    assert_int_equal(ns, f.ns);
    assert_int_equal(kvr_index_ns_lookup(f.ix, "m", "lora1", &ns, &seed2), 0);
    assert_int_equal(ns, f.ns_lora);
    assert_true(seed != seed2);
    assert_true(seed2 == kvr_hash_ns_seed("m", 1, "lora1", 5));
    assert_int_equal(kvr_index_ns_lookup(f.ix, "nope", NULL, &ns, NULL), -ENOENT);
    assert_int_equal(kvr_index_ns_block_size(f.ix, f.ns), 0);
    kvr_index_ns_set_block_size(f.ix, f.ns, 16);
    assert_int_equal(kvr_index_ns_block_size(f.ix, f.ns), 16);
    assert_int_equal(kvr_index_ns_block_size(f.ix, 1000), 0);
    rm_fx(&f);
}

static void test_alias_engine_hashes(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    st(&f, f.w0, 0, f.ns, 0, 0, 20);
    /* same tokens, different engine hashes (cache salt): same entries */
    struct kvr_index_block b[20];
    for (int i = 0; i < 20; i++) {
        b[i].engine_hash = 0x5a17000 + (uint64_t)i;
        b[i].content_hash = C(0, i);
    }
    struct kvr_index_wres r = {0};
    assert_int_equal(kvr_index_store(f.ix, f.w0, 0, f.ns, NULL, b, 20, &r), 0);
    assert_int_equal(r.stored, 20);
    struct kvr_index_stats stt;
    kvr_index_stats(f.ix, &stt);
    assert_int_equal(stt.entries, 20);
    assert_int_equal(stt.holders, 20);
    uint64_t bl[KVR_TIER_MAX];
    kvr_index_worker_blocks(f.ix, f.w0, bl);
    assert_int_equal(bl[0], 40);
    rmv(&f, f.w0, 0, 0, 0, 20); /* the first set goes; the aliases keep the blocks */
    assert_int_equal(matched(&f, f.ns, 0, 20, f.w0), 20);
    uint64_t h[20];
    for (int i = 0; i < 20; i++)
        h[i] = b[i].engine_hash;
    memset(&r, 0, sizeof(r));
    assert_int_equal(kvr_index_remove(f.ix, f.w0, 0, h + 10, 10, &r), 0);
    assert_int_equal(matched(&f, f.ns, 0, 20, f.w0), 10);
    rm_fx(&f);
}

static void test_limits_and_args(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 0);
    uint64_t qq[MAXN + 1] = {0};
    const struct kvr_index_hit *hits;
    size_t nh;
    assert_int_equal(kvr_index_find(f.r, f.ns, qq, MAXN + 1, NULL, 0, W1, &hits, &nh), -E2BIG);
    assert_int_equal(kvr_index_find(f.r, f.ns, qq, MAXN, NULL, 0, W1, &hits, &nh), 0);
    assert_int_equal(kvr_index_find(f.r, f.ns, qq, 0, NULL, 0, W1, &hits, &nh), 0);
    assert_int_equal(nh, 0);
    assert_int_equal(kvr_index_find(f.r, 77, qq, 3, NULL, 0, W1, &hits, &nh), -EINVAL);
    struct kvr_index_block b = {1, 2};
    assert_int_equal(kvr_index_store(f.ix, 999, 0, f.ns, NULL, &b, 1, NULL), -EINVAL);
    assert_int_equal(kvr_index_store(f.ix, f.w0, KVR_TIER_MAX, f.ns, NULL, &b, 1, NULL),
                     -EINVAL);
    assert_int_equal(kvr_index_store(f.ix, f.w0, 0, 1234, NULL, &b, 1, NULL), -EINVAL);
    assert_int_equal(kvr_index_store(f.ix, f.w0, 0, f.ns, NULL, &b, 1, NULL), 0);
    assert_int_equal(kvr_index_remove(f.ix, 999, 0, &b.engine_hash, 1, NULL), -EINVAL);

    /* names */
    char longname[KVR_NAME_MAX + 2];
    memset(longname, 'x', sizeof(longname));
    longname[KVR_NAME_MAX + 1] = 0;
    uint32_t id;
    assert_int_equal(kvr_index_worker_intern(f.ix, longname, 0, &id), -EINVAL);
    assert_int_equal(kvr_index_ns_intern(f.ix, longname, NULL, &id, NULL), -EINVAL);
    assert_int_equal(kvr_index_worker_intern(f.ix, "", 0, &id), -EINVAL);
    longname[KVR_NAME_MAX] = 0; /* exactly the maximum is fine */
    assert_int_equal(kvr_index_worker_intern(f.ix, longname, 0, &id), 0);

    /* workers */
    assert_int_equal(kvr_index_worker_intern(f.ix, "pod-a", 1, &id), 0);
    assert_int_equal(id, f.w1);
    assert_int_equal(kvr_index_worker_lookup(f.ix, "pod-b", 0, &id), 0);
    assert_int_equal(id, f.w2);
    assert_int_equal(kvr_index_worker_lookup(f.ix, "pod-b", 1, &id), -ENOENT);
    assert_string_equal(kvr_index_worker_pod(f.ix, f.w1), "pod-a");
    assert_int_equal(kvr_index_worker_rank(f.ix, f.w1), 1);
    assert_int_equal(kvr_index_worker_pod_id(f.ix, f.w2), f.pod_b);
    uint32_t wids[4];
    assert_int_equal(kvr_index_pod_workers(f.ix, f.pod_a, wids, 4), 2);
    assert_int_equal(wids[0], f.w0);
    assert_int_equal(wids[1], f.w1);
    int rc = 0;
    char pod[32];
    for (int i = 0; i < 100 && rc == 0; i++) {
        snprintf(pod, sizeof(pod), "p%d", i);
        rc = kvr_index_worker_intern(f.ix, pod, 0, &id);
    }
    assert_int_equal(rc, -ENOSPC); /* max_workers = 64 */
    assert_int_equal(kvr_index_worker_count(f.ix), 64);

    /* tiers */
    uint8_t t;
    assert_int_equal(kvr_index_tier_intern(f.ix, NULL, 0, &t), 0);
    assert_int_equal(t, KVR_TIER_GPU);
    assert_int_equal(kvr_index_tier_intern(f.ix, "GPU", 3, &t), 0);
    assert_int_equal(t, KVR_TIER_GPU);
    assert_int_equal(kvr_index_tier_intern(f.ix, "Cpu", 3, &t), 0);
    assert_int_equal(t, KVR_TIER_CPU);
    assert_int_equal(kvr_index_tier_intern(f.ix, "STORAGE", 7, &t), 0);
    assert_int_equal(t, KVR_TIER_STORAGE);
    assert_int_equal(kvr_index_tier_intern(f.ix, "NVMe", 4, &t), 0);
    assert_int_equal(t, 3);
    assert_string_equal(kvr_index_tier_name(f.ix, 3), "nvme");
    assert_int_equal(kvr_index_tier_intern(f.ix, "nvme", 4, &t), 0);
    assert_int_equal(t, 3);
    assert_null(kvr_index_tier_name(f.ix, 4));
    for (int i = 0; i < 4; i++) {
        snprintf(pod, sizeof(pod), "t%d", i);
        assert_int_equal(kvr_index_tier_intern(f.ix, pod, strlen(pod), &t), 0);
    }
    assert_int_equal(kvr_index_tier_count(f.ix), 8);
    assert_int_equal(kvr_index_tier_intern(f.ix, "more", 4, &t), -ENOSPC);
    assert_int_equal(kvr_index_tier_intern(f.ix, longname, KVR_NAME_MAX + 1, &t), -EINVAL);
    rm_fx(&f);
}

/* Store/remove churn returns the index's memory to its baseline. */
static void test_churn_frees(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 32, 64);
    /* warm up: a holder's fixed record exists once its (worker, tier) has been used */
    for (uint32_t w = 0; w < 3; w++)
        for (uint8_t t = 0; t < 2; t++) {
            st(&f, w, t, f.ns, 0, 0, 1);
            rmv(&f, w, t, 0, 0, 1);
        }
    /* at rest: deferred frees done, the writers' node caches drained (two idle calls) */
    for (int i = 0; i < 3; i++)
        rmv(&f, f.w0, 0, 0, 0, 1);
    struct kvr_index_stats base, mid, end;
    kvr_index_stats(f.ix, &base);
    for (int round = 0; round < 20; round++) {
        for (int d = 0; d < 20; d++) {
            uint32_t w = (uint32_t)(d % 3);
            st(&f, w, (uint8_t)(d % 2), f.ns, d, 0, 300);
            st(&f, w, (uint8_t)(d % 2), f.ns, 100 + d, 5, 30); /* orphans */
        }
        kvr_index_stats(f.ix, &mid);
        assert_true(mid.bytes > base.bytes + 100000);
        for (int d = 0; d < 20; d++) {
            uint32_t w = (uint32_t)(d % 3);
            rmv(&f, w, (uint8_t)(d % 2), d, 0, 300);
            rmv(&f, w, (uint8_t)(d % 2), 100 + d, 5, 30);
        }
    }
    /* let deferred frees run: a few writer calls with nobody reading */
    for (int i = 0; i < 3; i++)
        rmv(&f, f.w0, 0, 0, 0, 1);
    kvr_index_stats(f.ix, &end);
    assert_int_equal(end.entries, 0);
    assert_int_equal(end.holders, 0);
    assert_int_equal(end.orphans, 0);
    printf("churn: baseline %llu bytes, peak %llu, after %llu\n",
           (unsigned long long)base.bytes, (unsigned long long)mid.bytes,
           (unsigned long long)end.bytes);
    assert_int_equal(end.bytes, base.bytes);
    rm_fx(&f);
}

/* Forgetting a pod frees its blocks, ids and names; a full index takes a new pod in its
 * place (reusing the ids), and no answer names the forgotten pod again. */
static void test_forget_reuse(void **state)
{
    (void)state;
    struct fx f;
    mk(&f, 4, 0);
    uint64_t q[8];
    for (int i = 0; i < 8; i++)
        q[i] = C(0, i);
    const struct kvr_index_hit *h;
    size_t nh;
    st(&f, f.w0, KVR_TIER_GPU, f.ns, 0, 0, 8);
    st(&f, f.w1, KVR_TIER_GPU, f.ns, 0, 0, 5);
    st(&f, f.w2, KVR_TIER_GPU, f.ns, 0, 0, 3);
    assert_int_equal(kvr_index_find(f.r, f.ns, q, 8, NULL, 0, NULL, &h, &nh), 0);
    assert_int_equal(nh, 3);
    assert_string_equal(h[0].pod, "pod-a");
    assert_int_equal(h[0].dp_rank, 0);
    assert_string_equal(h[1].pod, "pod-a");
    assert_int_equal(h[1].dp_rank, 1);
    assert_string_equal(h[2].pod, "pod-b");

    /* fill the index (max_workers = 64) */
    uint32_t id;
    char pod[32];
    for (int i = 3; i < 64; i++) {
        snprintf(pod, sizeof(pod), "fill-%d", i);
        assert_int_equal(kvr_index_worker_intern(f.ix, pod, 0, &id), 0);
    }
    assert_int_equal(kvr_index_worker_intern(f.ix, "new", 0, &id), -ENOSPC);
    uint64_t forgotten, refused;
    kvr_index_forget_stats(f.ix, &forgotten, &refused);
    assert_int_equal(forgotten, 0);
    assert_int_equal(refused, 1);

    struct kvr_index_wres res = {0};
    assert_int_equal(kvr_index_pod_forget(f.ix, f.pod_a, &res), 0);
    assert_int_equal(res.cleared, 8 + 5);
    assert_int_equal(kvr_index_pod_forget(f.ix, f.pod_a, NULL), -ENOENT);
    assert_int_equal(kvr_index_pod_lookup(f.ix, "pod-a", &id), -ENOENT);
    assert_int_equal(kvr_index_worker_lookup(f.ix, "pod-a", 1, &id), -ENOENT);
    assert_null(kvr_index_worker_pod(f.ix, f.w0));
    uint64_t b[KVR_TIER_MAX];
    kvr_index_worker_blocks(f.ix, f.w0, b);
    assert_int_equal(b[KVR_TIER_GPU], 0);
    struct kvr_index_stats sts;
    kvr_index_stats(f.ix, &sts);
    assert_int_equal(sts.workers, 62);
    assert_int_equal(kvr_index_pod_workers(f.ix, f.pod_a, &id, 1), 0);
    assert_int_equal(kvr_index_find(f.r, f.ns, q, 8, NULL, 0, NULL, &h, &nh), 0);
    assert_int_equal(nh, 1);
    assert_string_equal(h[0].pod, "pod-b");

    /* full again, but two ids are free: the new pod gets them */
    uint32_t n0, n1;
    assert_int_equal(kvr_index_worker_intern(f.ix, "new", 0, &n0), 0);
    assert_int_equal(kvr_index_worker_intern(f.ix, "new", 1, &n1), 0);
    assert_true((n0 == f.w0 || n0 == f.w1) && (n1 == f.w0 || n1 == f.w1) && n0 != n1);
    assert_int_equal(kvr_index_worker_intern(f.ix, "newer", 0, &id), -ENOSPC);
    assert_int_equal(kvr_index_worker_count(f.ix), 64);
    uint32_t pnew;
    assert_int_equal(kvr_index_pod_lookup(f.ix, "new", &pnew), 0);
    assert_int_equal(pnew, f.pod_a); /* the pod id too */
    kvr_index_worker_blocks(f.ix, n0, b);
    assert_int_equal(b[KVR_TIER_GPU], 0); /* nothing inherited */
    assert_int_equal(kvr_index_find(f.r, f.ns, q, 8, NULL, 0, NULL, &h, &nh), 0);
    assert_int_equal(nh, 1);
    st(&f, n1, KVR_TIER_GPU, f.ns, 0, 0, 2);
    assert_int_equal(kvr_index_find(f.r, f.ns, q, 8, &pnew, 1, NULL, &h, &nh), 0);
    assert_int_equal(nh, 1);
    assert_string_equal(h[0].pod, "new");
    assert_int_equal(h[0].dp_rank, 1);
    assert_int_equal(h[0].matched, 2);
    /* the old name comes back as a new pod when there is room */
    res = (struct kvr_index_wres){0};
    assert_int_equal(kvr_index_pod_forget(f.ix, pnew, &res), 0);
    assert_int_equal(res.cleared, 2);
    assert_int_equal(kvr_index_worker_intern(f.ix, "pod-a", 0, &id), 0);
    kvr_index_forget_stats(f.ix, &forgotten, &refused);
    assert_int_equal(forgotten, 4);
    assert_int_equal(refused, 2);
    /* churn many pods through the few free ids: memory stays bounded */
    kvr_index_stats(f.ix, &sts);
    uint64_t bytes0 = sts.bytes;
    for (int i = 0; i < 5000; i++) {
        uint32_t pid;
        snprintf(pod, sizeof(pod), "churn-%d", i);
        assert_int_equal(kvr_index_worker_intern(f.ix, pod, 0, &id), 0);
        st(&f, id, KVR_TIER_GPU, f.ns, 1, 0, 4);
        assert_int_equal(kvr_index_pod_lookup(f.ix, pod, &pid), 0);
        assert_int_equal(kvr_index_pod_forget(f.ix, pid, NULL), 0);
    }
    kvr_index_stats(f.ix, &sts);
    assert_true(sts.bytes < bytes0 + 64 * 1024);
    assert_int_equal(sts.workers, 63);
    rm_fx(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_find_basic),
        cmocka_unit_test(test_duplicates_refcounted),
        cmocka_unit_test(test_extra_keys_chain),
        cmocka_unit_test(test_orphans),
        cmocka_unit_test(test_remove_mixed_unknown),
        cmocka_unit_test(test_clear_and_purge),
        cmocka_unit_test(test_divergent_prefix),
        cmocka_unit_test(test_long_match_look),
        cmocka_unit_test(test_holes),
        cmocka_unit_test(test_tiers_and_score),
        cmocka_unit_test(test_pod_filter),
        cmocka_unit_test(test_namespaces_isolated),
        cmocka_unit_test(test_alias_engine_hashes),
        cmocka_unit_test(test_limits_and_args),
        cmocka_unit_test(test_churn_frees),
        cmocka_unit_test(test_forget_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
