/* test_index_stress.c — writers churn while readers check invariants (run it under TSAN:
 * make SANITIZE=thread build/san-thread/tests/test_index_stress).
 *
 * Setup: "stable" workers hold fixed chains that nobody touches afterwards: one full
 * (hole-free) chain of document 0, one with a hole at block 50, one whose gpu tier holds
 * [0, 80) and cpu tier [0, 120). Writer threads (each owning a disjoint set of pods, like
 * ingest's sticky sharding) churn other workers over documents that share prefixes with
 * document 0, so the stable entries' holder sets change all the time (inline <-> array,
 * array growth/shrink, entry creation/deletion, table growth/shrink, clears, purges,
 * orphans). Readers check on every query: stable answers exact; hits ascending; for every
 * hit 1 <= matched <= n, tier_matched[t] <= matched, and matched <= what that worker could
 * ever have stored. Another thread keeps interning new pods, namespaces and tiers.
 * KVR_STRESS_MS sets the duration (default 1500 ms); KVR_SEED the seed.
 *
 * test_forget_reuse: pods come and go while readers query. Each writer keeps a few pods of
 * its own alive, each storing the document its name says (pod "d<doc>-w<writer>-<n>"), and
 * forgets them (kvr_index_pod_forget) in turn; max_workers is exactly the workers alive at
 * once, so every new worker reuses a forgotten id (waiting out its grace period). Readers
 * check every hit is named after a pod that stored the queried document (documents share no
 * block: a recycled id reported under its new name would name the wrong document), with a
 * valid rank and matched <= the stored length; another thread reads per-worker blocks and
 * statistics and looks pods up all the while.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "index/hash.h"
#include "index/index.h"
#include "core/log.h"

#define CHECK(c)                                                                            \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            fprintf(stderr, "stress: check failed: %s (line %d, seed %llu)\n", #c, __LINE__, \
                    (unsigned long long)g_seed);                                            \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

#define NWRITERS 2
#define NREADERS 2
#define NPODS 16
#define RANKS 2
#define NCHURN (NPODS * RANKS)
#define LEN 200
#define NDOCS 8

static uint64_t g_seed;
static struct kvr_index *g_ix;
static uint32_t g_ns, g_ns2;
static uint32_t g_churn[NCHURN], g_stable, g_holey, g_tiered;
static int g_stop;
static uint64_t g_content[NDOCS][LEN];
static uint64_t g_eh[NDOCS][LEN];
static uint64_t g_ops[NWRITERS], g_finds[NREADERS];

#define mixh kvr_hash_mix64

static void store(uint32_t wid, uint8_t tier, uint32_t ns, int d, int from, int to)
{
    struct kvr_index_block b[LEN];
    for (int i = from; i < to; i++) {
        b[i - from].engine_hash = g_eh[d][i];
        b[i - from].content_hash = g_content[d][i];
    }
    uint64_t parent = from ? g_eh[d][from - 1] : 0;
    struct kvr_index_wres r = {0};
    CHECK(kvr_index_store(g_ix, wid, tier, ns, from ? &parent : NULL, b, (size_t)(to - from),
                          &r) == 0);
}

static void remove_(uint32_t wid, uint8_t tier, int d, int from, int to)
{
    uint64_t h[LEN];
    for (int i = from; i < to; i++)
        h[i - from] = g_eh[d][i];
    struct kvr_index_wres r = {0};
    CHECK(kvr_index_remove(g_ix, wid, tier, h, (size_t)(to - from), &r) == 0);
}

static void *writer(void *arg)
{
    int me = (int)(intptr_t)arg;
    uint64_t s = g_seed ^ (uint64_t)(me + 1) * 0x9e3779b97f4a7c15ull;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        s = mixh(s + 1);
        /* this writer owns pods p with p % NWRITERS == me */
        uint32_t pod = (uint32_t)(s % (NPODS / NWRITERS)) * NWRITERS + (uint32_t)me;
        uint32_t wid = g_churn[pod * RANKS + (uint32_t)((s >> 8) % RANKS)];
        uint8_t tier = (uint8_t)((s >> 12) % 2);
        int d = (int)((s >> 16) % NDOCS);
        int from = (int)((s >> 24) % 4 == 0 ? (s >> 28) % LEN : 0);
        int to = from + 1 + (int)((s >> 36) % (uint64_t)(LEN - from));
        uint32_t ns = (s >> 50) % 8 == 0 ? g_ns2 : g_ns;
        switch ((s >> 44) % 16) {
        case 0:
            if ((s >> 54) % 8 == 0) {
                uint32_t pid = kvr_index_worker_pod_id(g_ix, wid);
                struct kvr_index_wres r = {0};
                CHECK(kvr_index_purge_pod(g_ix, pid, &r) == 0);
            } else {
                struct kvr_index_wres r = {0};
                CHECK(kvr_index_clear(g_ix, wid, (s >> 56) % 2 ? -1 : tier, &r) == 0);
            }
            break;
        case 1: case 2: case 3: case 4: case 5: case 6:
            remove_(wid, tier, d, from, to);
            break;
        default:
            store(wid, tier, ns, d, from, to);
            break;
        }
        g_ops[me]++;
    }
    return NULL;
}

static void *reader(void *arg)
{
    int me = (int)(intptr_t)arg;
    struct kvr_index_reader *r;
    CHECK(kvr_index_reader_create(g_ix, &r) == 0);
    uint64_t s = g_seed ^ (uint64_t)(me + 101) * 0x9e3779b97f4a7c15ull;
    const double w[KVR_TIER_MAX] = {1.0, 0.5, 0.25, 0.125, 1, 1, 1, 1};
    uint64_t q[LEN];
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        s = mixh(s + 1);
        int d = (s % 4 == 0) ? (int)((s >> 8) % NDOCS) : 0;
        int n = 1 + (int)((s >> 16) % LEN);
        memcpy(q, g_content[d], (size_t)n * sizeof(uint64_t));
        int div = -1;
        if ((s >> 32) % 5 == 0 && n > 1) {
            div = 1 + (int)((s >> 40) % (uint64_t)(n - 1));
            q[div] = 0xd1fd1f;
        }
        const struct kvr_index_hit *hits;
        size_t nh;
        CHECK(kvr_index_find(r, g_ns, q, (size_t)n, NULL, 0, w, &hits, &nh) == 0);
        int seen_stable = 0, seen_holey = 0, seen_tiered = 0;
        for (size_t i = 0; i < nh; i++) {
            const struct kvr_index_hit *h = &hits[i];
            CHECK(i == 0 || hits[i - 1].wid < h->wid);
            CHECK(h->matched >= 1 && h->matched <= (uint32_t)n);
            for (int t = 0; t < KVR_TIER_MAX; t++)
                CHECK(h->tier_matched[t] <= h->matched);
            CHECK(h->score <= (double)h->matched * 1.0 + 1e-9);
            uint32_t expect = 0;
            int exact = 0;
            if (h->wid == g_stable) {
                seen_stable = exact = 1;
                expect = d == 0 ? (uint32_t)(div >= 0 ? div : n) : 0;
            } else if (h->wid == g_holey) {
                seen_holey = exact = 1;
                expect = d == 0 ? (uint32_t)(div >= 0 && div < 50 ? div : (n < 50 ? n : 50)) : 0;
            } else if (h->wid == g_tiered) {
                seen_tiered = exact = 1;
                expect = d == 0 ? (uint32_t)(div >= 0 && div < 120 ? div : (n < 120 ? n : 120)) : 0;
                uint32_t g = (uint32_t)(div >= 0 && div < 80 ? div : (n < 80 ? n : 80));
                if (d == 0) {
                    CHECK(h->tier_matched[KVR_TIER_GPU] == g);
                    CHECK(h->tier_matched[KVR_TIER_CPU] == expect);
                    CHECK(h->score == (double)g * 1.0 + (double)(expect - g) * 0.5);
                }
            } else {
                /* churn workers store at most the documents' blocks in order */
                CHECK(h->matched <= (uint32_t)(div >= 0 ? div : n));
            }
            if (exact && d == 0)
                CHECK(h->matched == expect);
        }
        if (d == 0) {
            CHECK(seen_stable);
            CHECK(seen_holey);
            CHECK(seen_tiered);
        }
        if ((s >> 60) == 0) {
            struct kvr_index_stats st;
            kvr_index_stats(g_ix, &st);
            uint64_t b[KVR_TIER_MAX];
            kvr_index_worker_blocks(g_ix, g_stable, b);
            CHECK(b[0] == LEN);
            uint32_t id;
            CHECK(kvr_index_worker_lookup(g_ix, "stable", 0, &id) == 0 && id == g_stable);
            CHECK(kvr_index_tier_name(g_ix, KVR_TIER_CPU) != NULL);
        }
        g_finds[me]++;
    }
    kvr_index_reader_destroy(r);
    return NULL;
}

static void *interner(void *arg)
{
    (void)arg;
    char name[64];
    for (int i = 0; !__atomic_load_n(&g_stop, __ATOMIC_RELAXED); i++) {
        uint32_t id;
        snprintf(name, sizeof(name), "late-pod-%d", i % 40);
        int rc = kvr_index_worker_intern(g_ix, name, (uint32_t)(i % 3), &id);
        CHECK(rc == 0 || rc == -ENOSPC);
        snprintf(name, sizeof(name), "model-%d", i % 200);
        CHECK(kvr_index_ns_intern(g_ix, name, i % 2 ? "lora" : NULL, &id, NULL) == 0);
        uint8_t t;
        snprintf(name, sizeof(name), "Tier%d", i % 7);
        rc = kvr_index_tier_intern(g_ix, name, strlen(name), &t);
        CHECK(rc == 0 || rc == -ENOSPC);
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_stress(void **state)
{
    (void)state;
    const char *env = getenv("KVR_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    const char *ms_env = getenv("KVR_STRESS_MS");
    long ms = ms_env ? atol(ms_env) : 1500;
    printf("test_index_stress: KVR_SEED=%llu KVR_STRESS_MS=%ld\n", (unsigned long long)g_seed,
           ms);
    fflush(stdout);

    /* documents share prefixes with document 0: 0..(20*d) */
    for (int d = 0; d < NDOCS; d++)
        for (int i = 0; i < LEN; i++) {
            g_content[d][i] = i < 20 * d ? g_content[0][i] : mixh((uint64_t)d * 1000 + (uint64_t)i + 7);
            g_eh[d][i] = mixh((i ? g_eh[d][i - 1] : 99) ^ g_content[d][i]);
        }

    struct kvr_index_opts o = {.jump_stride = 8, .orphan_capacity = 64, .max_workers = 256};
    assert_int_equal(kvr_index_create(&o, &g_ix), 0);
    assert_int_equal(kvr_index_ns_intern(g_ix, "m", NULL, &g_ns, NULL), 0);
    assert_int_equal(kvr_index_ns_intern(g_ix, "m", "adapter", &g_ns2, NULL), 0);
    for (uint32_t p = 0; p < NPODS; p++)
        for (uint32_t k = 0; k < RANKS; k++) {
            char pod[32];
            snprintf(pod, sizeof(pod), "churn-%u", p);
            assert_int_equal(kvr_index_worker_intern(g_ix, pod, k, &g_churn[p * RANKS + k]), 0);
        }
    assert_int_equal(kvr_index_worker_intern(g_ix, "stable", 0, &g_stable), 0);
    assert_int_equal(kvr_index_worker_intern(g_ix, "holey", 0, &g_holey), 0);
    assert_int_equal(kvr_index_worker_intern(g_ix, "tiered", 0, &g_tiered), 0);
    store(g_stable, KVR_TIER_GPU, g_ns, 0, 0, LEN);
    store(g_holey, KVR_TIER_GPU, g_ns, 0, 0, LEN);
    remove_(g_holey, KVR_TIER_GPU, 0, 50, 51);
    store(g_tiered, KVR_TIER_GPU, g_ns, 0, 0, 80);
    store(g_tiered, KVR_TIER_CPU, g_ns, 0, 0, 120);

    pthread_t wt[NWRITERS], rt[NREADERS], it;
    for (int i = 0; i < NWRITERS; i++)
        assert_int_equal(pthread_create(&wt[i], NULL, writer, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NREADERS; i++)
        assert_int_equal(pthread_create(&rt[i], NULL, reader, (void *)(intptr_t)i), 0);
    assert_int_equal(pthread_create(&it, NULL, interner, NULL), 0);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < NWRITERS; i++)
        pthread_join(wt[i], NULL);
    for (int i = 0; i < NREADERS; i++)
        pthread_join(rt[i], NULL);
    pthread_join(it, NULL);
    uint64_t ops = 0, finds = 0;
    for (int i = 0; i < NWRITERS; i++)
        ops += g_ops[i];
    for (int i = 0; i < NREADERS; i++)
        finds += g_finds[i];
    printf("test_index_stress: %llu writes, %llu finds checked\n", (unsigned long long)ops,
           (unsigned long long)finds);
    CHECK(ops > 0 && finds > 0);

    /* quiescent again: everything churned away leaves exactly the stable contents */
    for (uint32_t i = 0; i < NCHURN; i++) {
        struct kvr_index_wres r = {0};
        assert_int_equal(kvr_index_clear(g_ix, g_churn[i], -1, &r), 0);
    }
    struct kvr_index_stats st;
    kvr_index_stats(g_ix, &st);
    assert_int_equal(st.orphans, 0);
    assert_int_equal(st.holders, LEN + (LEN - 1) + 80 + 120);
    assert_int_equal(st.entries, LEN);
    kvr_index_destroy(g_ix);
}

/* ---- forget and reuse ---------------------------------------------------------------- */

#define FR_WRITERS 2
#define FR_ALIVE 4 /* pods alive per writer */
#define FR_RANKS 2
#define FR_DOCS 6
#define FR_LEN 64

static uint64_t fr_content[FR_DOCS][FR_LEN], fr_eh[FR_DOCS][FR_LEN];
static uint64_t fr_forgets[FR_WRITERS], fr_finds, fr_hits;

static void fr_pod_name(char *buf, size_t cap, uint32_t doc, int me, uint64_t n)
{
    snprintf(buf, cap, "d%u-w%d-%llu", doc, me, (unsigned long long)n);
}

static void *fr_writer(void *arg)
{
    int me = (int)(intptr_t)arg;
    uint64_t s = g_seed ^ (uint64_t)(me + 7) * 0x9e3779b97f4a7c15ull, n = 0;
    uint32_t pid[FR_ALIVE], wid[FR_ALIVE][FR_RANKS];
    int alive[FR_ALIVE] = {0};
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        s = mixh(s + 1);
        int k = (int)(s % FR_ALIVE);
        if (alive[k]) { /* forget it */
            struct kvr_index_wres r = {0};
            CHECK(kvr_index_pod_forget(g_ix, pid[k], &r) == 0);
            alive[k] = 0;
            fr_forgets[me]++;
            continue;
        }
        uint32_t doc = (uint32_t)((s >> 8) % FR_DOCS);
        char pod[64];
        fr_pod_name(pod, sizeof(pod), doc, me, n++);
        for (uint32_t rk = 0; rk < FR_RANKS; rk++) {
            /* never refused: the forgotten ids come back after their grace period */
            CHECK(kvr_index_worker_intern(g_ix, pod, rk, &wid[k][rk]) == 0);
            int len = 1 + (int)((s >> (16 + 8 * rk)) % FR_LEN);
            struct kvr_index_block b[FR_LEN];
            for (int i = 0; i < len; i++) {
                b[i].engine_hash = fr_eh[doc][i];
                b[i].content_hash = fr_content[doc][i];
            }
            struct kvr_index_wres r = {0};
            CHECK(kvr_index_store(g_ix, wid[k][rk], (uint8_t)(rk % 2), g_ns, NULL, b,
                                  (size_t)len, &r) == 0);
        }
        CHECK(kvr_index_pod_lookup(g_ix, pod, &pid[k]) == 0);
        alive[k] = 1;
    }
    for (int k = 0; k < FR_ALIVE; k++)
        if (alive[k]) {
            struct kvr_index_wres r = {0};
            CHECK(kvr_index_pod_forget(g_ix, pid[k], &r) == 0);
        }
    return NULL;
}

static void *fr_reader(void *arg)
{
    int me = (int)(intptr_t)arg;
    struct kvr_index_reader *r;
    CHECK(kvr_index_reader_create(g_ix, &r) == 0);
    uint64_t s = g_seed ^ (uint64_t)(me + 201) * 0x9e3779b97f4a7c15ull, finds = 0, nh = 0;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        s = mixh(s + 1);
        uint32_t doc = (uint32_t)(s % FR_DOCS);
        int len = 1 + (int)((s >> 8) % FR_LEN);
        const struct kvr_index_hit *hits;
        size_t nhits;
        CHECK(kvr_index_find(r, g_ns, fr_content[doc], (size_t)len, NULL, 0, NULL, &hits,
                             &nhits) == 0);
        for (size_t i = 0; i < nhits; i++) {
            unsigned d = 99;
            CHECK(hits[i].pod != NULL && sscanf(hits[i].pod, "d%u-", &d) == 1);
            CHECK(d == doc); /* never another pod's blocks under this name */
            CHECK(hits[i].dp_rank < FR_RANKS);
            CHECK(hits[i].matched >= 1 && hits[i].matched <= (uint32_t)len);
            CHECK(i == 0 || hits[i - 1].wid < hits[i].wid);
        }
        finds++;
        nh += nhits;
    }
    __atomic_fetch_add(&fr_finds, finds, __ATOMIC_RELAXED);
    __atomic_fetch_add(&fr_hits, nh, __ATOMIC_RELAXED);
    kvr_index_reader_destroy(r);
    return NULL;
}

static void *fr_watcher(void *arg)
{
    (void)arg;
    uint64_t s = g_seed;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        s = mixh(s + 1);
        uint32_t nw = kvr_index_worker_count(g_ix);
        for (uint32_t w = 0; w < nw; w++) {
            uint64_t b[KVR_TIER_MAX];
            kvr_index_worker_blocks(g_ix, w, b);
            for (int t = 0; t < KVR_TIER_MAX; t++)
                CHECK(b[t] <= FR_LEN);
        }
        struct kvr_index_stats st;
        kvr_index_stats(g_ix, &st);
        CHECK(st.workers <= FR_WRITERS * FR_ALIVE * FR_RANKS);
        char pod[64];
        uint32_t p;
        fr_pod_name(pod, sizeof(pod), (uint32_t)(s % FR_DOCS), (int)((s >> 8) % FR_WRITERS),
                    (s >> 16) % 64);
        (void)kvr_index_pod_lookup(g_ix, pod, &p);
        (void)kvr_index_worker_lookup(g_ix, pod, 0, &p);
    }
    return NULL;
}

static void test_forget_reuse(void **state)
{
    (void)state;
    const char *env = getenv("KVR_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    const char *ms_env = getenv("KVR_STRESS_MS");
    long ms = ms_env ? atol(ms_env) : 1500;
    for (int d = 0; d < FR_DOCS; d++)
        for (int i = 0; i < FR_LEN; i++) {
            fr_content[d][i] = mixh((uint64_t)d * 100000 + (uint64_t)i + 11);
            fr_eh[d][i] = mixh((i ? fr_eh[d][i - 1] : 77) ^ fr_content[d][i]);
        }
    struct kvr_index_opts o = {.jump_stride = 4,
                               .max_workers = FR_WRITERS * FR_ALIVE * FR_RANKS};
    assert_int_equal(kvr_index_create(&o, &g_ix), 0);
    assert_int_equal(kvr_index_ns_intern(g_ix, "m", NULL, &g_ns, NULL), 0);
    __atomic_store_n(&g_stop, 0, __ATOMIC_RELAXED);
    pthread_t wt[FR_WRITERS], rt[NREADERS], at;
    for (int i = 0; i < FR_WRITERS; i++)
        assert_int_equal(pthread_create(&wt[i], NULL, fr_writer, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NREADERS; i++)
        assert_int_equal(pthread_create(&rt[i], NULL, fr_reader, (void *)(intptr_t)i), 0);
    assert_int_equal(pthread_create(&at, NULL, fr_watcher, NULL), 0);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < FR_WRITERS; i++)
        pthread_join(wt[i], NULL);
    for (int i = 0; i < NREADERS; i++)
        pthread_join(rt[i], NULL);
    pthread_join(at, NULL);
    uint64_t forgets = 0;
    for (int i = 0; i < FR_WRITERS; i++)
        forgets += fr_forgets[i];
    printf("test_forget_reuse: %llu pods forgotten, %llu finds, %llu hits checked\n",
           (unsigned long long)forgets, (unsigned long long)fr_finds,
           (unsigned long long)fr_hits);
    CHECK(forgets > FR_ALIVE * FR_WRITERS && fr_finds > 0);
    /* all forgotten: nothing left, every id free again */
    struct kvr_index_stats st;
    kvr_index_stats(g_ix, &st);
    assert_int_equal(st.workers, 0);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.holders, 0);
    uint64_t fg, refused;
    kvr_index_forget_stats(g_ix, &fg, &refused);
    assert_int_equal(refused, 0);
    assert_true(fg >= forgets * FR_RANKS);
    kvr_index_destroy(g_ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stress),
                                       cmocka_unit_test(test_forget_reuse)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
