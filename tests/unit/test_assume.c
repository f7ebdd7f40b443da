/* test_assume.c — the assumed store of approximate mode against a naive model (every
 * assumption a row with its last-touch stamp; LRU = the smallest stamp, found by a scan), on
 * random prompt trees, workers, caps and clocks (seed printed, KVR_TEST_SEED=N replays): the
 * new suffix each touch reports, every eviction and expiry in order, per-worker counts, and
 * the no-holes invariant (every assumed block's parent is assumed) after every step.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "events/assume.h"
#include "index/hash.h"

static unsigned seed;

#define NODES 600 /* prompt-tree nodes */
#define WORKERS 6
#define MODEL_CAP (NODES * WORKERS)

struct tnode {
    uint64_t key;
    int parent; /* -1 at a root */
    int depth;
};
static struct tnode tree[NODES];
static int ntree;

struct row {
    uint32_t wid;
    int node;
    int64_t t;
    uint64_t stamp;
};
static struct row model[MODEL_CAP];
static size_t nmodel;
static uint64_t stamp_ctr;

static int model_find(uint32_t wid, int node)
{
    for (size_t i = 0; i < nmodel; i++)
        if (model[i].wid == wid && model[i].node == node)
            return (int)i;
    return -1;
}

static void model_del(size_t i)
{
    model[i] = model[--nmodel];
}

static size_t model_count(uint32_t wid)
{
    size_t c = 0;
    for (size_t i = 0; i < nmodel; i++)
        c += model[i].wid == wid;
    return c;
}

/* The chain from a root to node `leaf`, as tree indexes, root first. */
static size_t chain_of(int leaf, int *out)
{
    int tmp[NODES];
    size_t n = 0;
    for (int x = leaf; x >= 0; x = tree[x].parent)
        tmp[n++] = x;
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

static void build_tree(unsigned *r)
{
    ntree = 0;
    for (int i = 0; i < NODES; i++) {
        int parent = (i < 4 || rand_r(r) % 10 == 0) ? -1 : (int)(rand_r(r) % (unsigned)i);
        uint64_t pk = parent < 0 ? 0x1234 : tree[parent].key;
        tree[i] = (struct tnode){.key = kvr_hash_mix64(pk * 31 + (uint64_t)i + 1),
                                 .parent = parent,
                                 .depth = parent < 0 ? 0 : tree[parent].depth + 1};
        ntree++;
    }
}

static void check_state(struct kvr_assume *a)
{
    assert_int_equal(kvr_assume_count(a), nmodel);
    for (uint32_t w = 0; w < WORKERS; w++)
        assert_int_equal(kvr_assume_worker_count(a, w), model_count(w));
    for (size_t i = 0; i < nmodel; i++) {
        assert_true(kvr_assume_holds(a, model[i].wid, tree[model[i].node].key));
        int p = tree[model[i].node].parent;
        if (p >= 0) /* no holes */
            assert_true(model_find(model[i].wid, p) >= 0);
    }
}

static void one_run(unsigned *r, size_t steps)
{
    struct kvr_assume *a;
    int64_t now = 1000;
    int chain[NODES];
    uint64_t keys[NODES], out[NODES * WORKERS];
    struct kvr_assume_pair px[NODES * WORKERS];

    build_tree(r);
    nmodel = 0;
    stamp_ctr = 0;
    assert_int_equal(kvr_assume_create(&a), 0);
    for (size_t step = 0; step < steps; step++) {
        unsigned op = (unsigned)rand_r(r) % 100;
        uint32_t wid = (uint32_t)rand_r(r) % WORKERS;
        now += rand_r(r) % 4;
        if (op < 65) { /* a routing decision: touch a chain, then evict over the cap */
            uint32_t cap = 1 + (uint32_t)rand_r(r) % (rand_r(r) % 3 ? 400 : 30);
            size_t n = chain_of((int)(rand_r(r) % (unsigned)ntree), chain), first, want;
            for (size_t i = 0; i < n; i++)
                keys[i] = tree[chain[i]].key;
            for (want = 0; want < n && want < cap && model_find(wid, chain[want]) >= 0; want++)
                ;
            int got = kvr_assume_touch(a, wid, keys, n, now, cap, &first);
            size_t cut = n < cap ? n : cap;
            assert_int_equal(got, (int)cut);
            assert_int_equal(first, want);
            for (size_t k = cut; k-- > 0;) {
                int i = model_find(wid, chain[k]);
                if (i < 0) {
                    assert_true(nmodel < MODEL_CAP);
                    i = (int)nmodel++;
                    model[i] = (struct row){.wid = wid, .node = chain[k]};
                }
                model[i].t = now;
                model[i].stamp = ++stamp_ctr;
            }
            size_t ne = kvr_assume_evict(a, wid, cap, out, sizeof(out) / sizeof(out[0]));
            size_t me = 0;
            while (model_count(wid) > cap) {
                size_t lo = SIZE_MAX;
                for (size_t i = 0; i < nmodel; i++)
                    if (model[i].wid == wid && (lo == SIZE_MAX || model[i].stamp < model[lo].stamp))
                        lo = i;
                assert_true(me < ne);
                assert_true(out[me] == tree[model[lo].node].key);
                me++;
                model_del(lo);
            }
            assert_int_equal(ne, me);
        } else if (op < 90) { /* expiry: everything older than a random age, in small bites */
            int64_t before = now - (int64_t)(rand_r(r) % 200);
            size_t capx = 1 + (size_t)rand_r(r) % 50;
            size_t ne = kvr_assume_expire(a, before, px, capx);
            for (size_t k = 0; k < ne; k++) {
                size_t lo = SIZE_MAX;
                for (size_t i = 0; i < nmodel; i++)
                    if (lo == SIZE_MAX || model[i].stamp < model[lo].stamp)
                        lo = i;
                assert_true(lo != SIZE_MAX && model[lo].t < before);
                assert_int_equal(px[k].wid, model[lo].wid);
                assert_true(px[k].key == tree[model[lo].node].key);
                model_del(lo);
            }
            if (ne < capx) /* stopped early: the oldest left is not that old */
                for (size_t i = 0; i < nmodel; i++)
                    assert_true(model[i].t >= before);
        } else if (op < 93) {
            size_t n = kvr_assume_drop_worker(a, wid), m = 0;
            for (size_t i = nmodel; i-- > 0;)
                if (model[i].wid == wid) {
                    model_del(i);
                    m++;
                }
            assert_int_equal(n, m);
        } else { /* an unheld key is not held */
            assert_false(kvr_assume_holds(a, wid, 0xdeadbeefull));
        }
        check_state(a);
        int64_t oldest = INT64_MAX;
        for (size_t i = 0; i < nmodel; i++)
            if (model[i].t < oldest)
                oldest = model[i].t;
        assert_true(kvr_assume_oldest(a) == oldest);
    }
    assert_true(kvr_assume_bytes(a) > 0);
    kvr_assume_destroy(a);
}

static void test_against_model(void **state)
{
    (void)state;
    unsigned r = seed;
    for (int run = 0; run < 12; run++)
        one_run(&r, 1500);
}

static void test_edges(void **state)
{
    (void)state;
    struct kvr_assume *a;
    uint64_t keys[4] = {1, 2, 3, 4}, out[8];
    size_t first;

    assert_int_equal(kvr_assume_create(&a), 0);
    assert_int_equal(kvr_assume_touch(a, UINT32_MAX, keys, 4, 0, 10, &first), -EINVAL);
    assert_int_equal(kvr_assume_touch(a, 3, keys, 0, 0, 10, &first), 0);
    assert_int_equal(first, 0);
    /* a chain longer than the cap: only its first max_blocks blocks are assumed */
    assert_int_equal(kvr_assume_touch(a, 3, keys, 4, 5, 2, &first), 2);
    assert_int_equal(first, 0);
    assert_int_equal(kvr_assume_worker_count(a, 3), 2);
    assert_false(kvr_assume_holds(a, 3, 3));
    assert_int_equal(kvr_assume_evict(a, 3, 2, out, 8), 0);
    /* refreshed: nothing new, then the cap lowered evicts the leaf first */
    assert_int_equal(kvr_assume_touch(a, 3, keys, 2, 6, 2, &first), 2);
    assert_int_equal(first, 2);
    assert_int_equal(kvr_assume_evict(a, 3, 1, out, 8), 1);
    assert_true(out[0] == 2);
    /* expiry is by time: nothing before 6, key 1 before 7 */
    struct kvr_assume_pair px[8];
    assert_int_equal(kvr_assume_expire(a, 6, px, 8), 0);
    assert_int_equal(kvr_assume_expire(a, 7, px, 8), 1);
    assert_int_equal(px[0].wid, 3);
    assert_true(px[0].key == 1);
    assert_int_equal(kvr_assume_count(a), 0);
    assert_int_equal(kvr_assume_drop_worker(a, 99), 0);
    assert_int_equal(kvr_assume_worker_count(a, 1u << 30), 0);
    kvr_assume_destroy(a);
    kvr_assume_destroy(NULL);
}

/* Predicted mode: a confirmed block goes with its ancestors, never its descendants or
 * another worker's; a branch shares its parents' chain; a later touch re-adds the gap. */
static void test_confirm(void **state)
{
    (void)state;
    struct kvr_assume *a;
    uint64_t chain[5] = {10, 11, 12, 13, 14}, branch[4] = {10, 11, 22, 23}, out[16];
    size_t first;

    assert_int_equal(kvr_assume_create(&a), 0);
    assert_int_equal(kvr_assume_touch(a, 1, chain, 5, 0, 100, &first), 5);
    assert_int_equal(kvr_assume_touch(a, 1, branch, 4, 1, 100, &first), 4);
    assert_int_equal(first, 2);
    assert_int_equal(kvr_assume_touch(a, 2, chain, 5, 1, 100, &first), 5);
    assert_int_equal(kvr_assume_worker_count(a, 1), 7);
    assert_int_equal(kvr_assume_confirm(a, 1, 99, out, 16), 0); /* never predicted */
    /* block 12 stored: 12, 11, 10 go (leaf first), 13 and 14 and the branch's 22, 23 stay */
    assert_int_equal(kvr_assume_confirm(a, 1, 12, out, 16), 3);
    assert_true(out[0] == 12 && out[1] == 11 && out[2] == 10);
    assert_int_equal(kvr_assume_worker_count(a, 1), 4);
    assert_true(kvr_assume_holds(a, 1, 13) && kvr_assume_holds(a, 1, 22));
    assert_int_equal(kvr_assume_worker_count(a, 2), 5);
    /* the branch's block 23 stored: 23 and 22; its parent 11 is gone already */
    assert_int_equal(kvr_assume_confirm(a, 1, 23, out, 16), 2);
    assert_true(out[0] == 23 && out[1] == 22);
    /* the cap bounds one call: the rest is confirmed by the next */
    assert_int_equal(kvr_assume_confirm(a, 2, 14, out, 2), 2);
    assert_int_equal(kvr_assume_confirm(a, 2, 12, out, 16), 3);
    assert_int_equal(kvr_assume_worker_count(a, 2), 0);
    /* touched again: the confirmed gap is not held, the rest is */
    assert_int_equal(kvr_assume_touch(a, 1, chain, 5, 2, 100, &first), 5);
    assert_int_equal(first, 0);
    assert_int_equal(kvr_assume_worker_count(a, 1), 5);
    assert_int_equal(kvr_assume_confirm(a, 1, 14, out, 16), 5);
    assert_int_equal(kvr_assume_count(a), 0);
    kvr_assume_destroy(a);
}

/* Many workers and blocks: the table and the pool grow through several doublings. */
static void test_growth(void **state)
{
    (void)state;
    struct kvr_assume *a;
    uint64_t keys[512];
    size_t first;

    assert_int_equal(kvr_assume_create(&a), 0);
    for (uint32_t w = 0; w < 300; w++) {
        for (size_t i = 0; i < 512; i++)
            keys[i] = kvr_hash_mix64((uint64_t)w << 20 | i);
        assert_int_equal(kvr_assume_touch(a, w * 7, keys, 512, w, 100000, &first), 512);
        assert_int_equal(first, 0);
    }
    assert_int_equal(kvr_assume_count(a), 300 * 512);
    for (uint32_t w = 0; w < 300; w++)
        assert_int_equal(kvr_assume_worker_count(a, w * 7), 512);
    assert_int_equal(kvr_assume_drop_worker(a, 7), 512);
    assert_int_equal(kvr_assume_count(a), 299 * 512);
    kvr_assume_destroy(a);
}

int main(void)
{
    const char *s = getenv("KVR_TEST_SEED");
    seed = s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL);
    printf("test_assume: seed %u (KVR_TEST_SEED=%u replays it)\n", seed, seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_model),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_confirm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
