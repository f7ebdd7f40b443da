/* test_index_maps.c — the index's per-holder maps alone (src/index/index_maps.c, index_int.h):
 * the reverse map (recmap: engine hash -> node | copies, tombstones, resize and shrink) and
 * the counting map (cmap: key -> count, backward-shift deletion), each driven by a random
 * operation sequence against a naive reference model (as Redis tests dict.c).
 *
 * After every operation the touched key is checked against the model; every few operations,
 * and at the end of each phase, the whole map: its counts, every live record reachable from
 * its home without crossing an empty slot, no key twice, no tombstone just before an empty
 * slot (a deletion there clears them), the load limits, and the byte accounting.
 * Phases grow the maps to thousands of keys and shrink them back to empty, over a key
 * universe small enough that deleted keys come back (tombstone reuse). The copies counter
 * of a record overflows into the holder's `extra` cmap past COPIES_MAX, as in index_write.c.
 *
 * Seed: KVR_SEED=<n> or argv[1] (default: from the clock); printed first, and with every
 * failure.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "index/index_int.h"

static uint64_t g_seed, g_rng;
static uint64_t g_op; /* operation number, for failure messages */

static uint64_t rnd(void)
{
    g_rng += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    uint64_t z = g_rng;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rnd_below(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}

#define CHECK(c)                                                                              \
    do {                                                                                      \
        if (!(c))                                                                             \
            fail_msg("check failed: %s (line %d, seed %" PRIu64 ", op %" PRIu64 ")", #c,      \
                     __LINE__, g_seed, g_op);                                                 \
    } while (0)

/* ---- naive reference model: an unsorted array of (key, value) ------------------------ */

struct model {
    uint64_t *k, *v;
    size_t n, cap;
};

static size_t model_find(const struct model *md, uint64_t k)
{
    for (size_t i = 0; i < md->n; i++)
        if (md->k[i] == k)
            return i;
    return SIZE_MAX;
}

static uint64_t model_get(const struct model *md, uint64_t k)
{
    size_t i = model_find(md, k);
    return i == SIZE_MAX ? 0 : md->v[i];
}

static void model_set(struct model *md, uint64_t k, uint64_t v)
{
    size_t i = model_find(md, k);
    if (v == 0) {
        if (i != SIZE_MAX) {
            md->k[i] = md->k[md->n - 1];
            md->v[i] = md->v[md->n - 1];
            md->n--;
        }
        return;
    }
    if (i != SIZE_MAX) {
        md->v[i] = v;
        return;
    }
    if (md->n == md->cap) {
        md->cap = md->cap ? md->cap * 2 : 64;
        md->k = realloc(md->k, md->cap * sizeof(*md->k));
        md->v = realloc(md->v, md->cap * sizeof(*md->v));
        assert_non_null(md->k);
        assert_non_null(md->v);
    }
    md->k[md->n] = k;
    md->v[md->n++] = v;
}

static void model_free(struct model *md)
{
    free(md->k);
    free(md->v);
    memset(md, 0, sizeof(*md));
}

/* ---- the reverse map with the copies overflow, as index_write.c drives it -------------- */

struct revh {
    struct recmap recs;
    struct cmap extra; /* rec key -> copies beyond COPIES_MAX */
};

/* a fake node pointer (never dereferenced by the maps): 48 bits derived from the hash */
static uint64_t fake_nd(uint64_t eh)
{
    return (kvr_hash_mix64(eh ^ 0x5bd1e995u) & PTR_MASK & ~7ull) | 8u;
}

/* store_one's handling of one engine hash (new record, or one copy more) */
static void rev_store(struct ebr_slot *s, struct revh *h, uint64_t eh)
{
    uint64_t key = rec_key(eh);
    struct rec *r = recmap_slot(s, &h->recs, key);
    CHECK(r != NULL);
    if (REC_LIVE(r)) {
        CHECK(r->key == key);
        if (REC_COPIES(r) < COPIES_MAX)
            r->nc += 1ull << 48;
        else
            CHECK(kvr_ix_cmap_add(s, &h->extra, key, 1) == 0);
        return;
    }
    rec_fill(&h->recs, r, key, fake_nd(eh) | 1ull << 48);
}

/* unstore's handling: one copy less, the record deleted with its last copy. Returns 0 when
 * the map does not know eh. */
static int rev_unstore(struct ebr_slot *s, struct revh *h, uint64_t eh)
{
    struct rec *r = recmap_get(&h->recs, eh);
    if (r == NULL)
        return 0;
    uint32_t copies = REC_COPIES(r);
    if (copies == COPIES_MAX && h->extra.n && kvr_ix_cmap_get(&h->extra, r->key) > 0)
        CHECK(kvr_ix_cmap_add(s, &h->extra, r->key, -1) == 0);
    else if (copies > 1)
        r->nc -= 1ull << 48;
    else
        recmap_del(s, &h->recs, r);
    return 1;
}

static uint64_t rev_copies(const struct revh *h, uint64_t eh)
{
    struct rec *r = recmap_get(&h->recs, eh);
    if (r == NULL)
        return 0;
    CHECK(REC_ND(r) == (struct node *)(uintptr_t)fake_nd(eh)); /* copies never spill */
    return REC_COPIES(r) + kvr_ix_cmap_get(&h->extra, r->key);
}

static void recmap_check_all(const struct recmap *m, const struct model *md)
{
    if (m->s == NULL) {
        CHECK(m->n == 0 && m->tomb == 0 && md->n == 0);
        return;
    }
    uint32_t live = 0, tomb = 0;
    for (uint32_t i = 0; i < m->cap; i++) {
        const struct rec *r = &m->s[i];
        uint32_t nx = i + 1 == m->cap ? 0 : i + 1;
        if (r->nc == REC_TOMB) {
            tomb++;
            CHECK(m->s[nx].nc != 0); /* a tombstone before an empty slot is cleared */
            continue;
        }
        if (r->nc == 0)
            continue;
        live++;
        /* reachable: no empty slot between its home and itself */
        for (uint32_t j = rec_home(m, r->key); j != i; j = j + 1 == m->cap ? 0 : j + 1)
            CHECK(m->s[j].nc != 0);
        CHECK(recmap_get_key(m, r->key) == r); /* so also: the key is there once */
    }
    CHECK(live == m->n);
    CHECK(tomb == m->tomb);
    CHECK(m->n == md->n);
    CHECK((size_t)(m->n + m->tomb) * 8 <= (size_t)m->cap * RECMAP_LOAD);
}

static void test_recmap_random(void **state)
{
    (void)state;
    struct ebr_slot slot;
    memset(&slot, 0, sizeof(slot));
    struct revh h;
    memset(&h, 0, sizeof(h));
    struct model md = {0}; /* engine hash -> copies */
    uint64_t *uni = malloc(12000 * sizeof(*uni));
    assert_non_null(uni);
    for (int i = 0; i < 12000; i++)
        uni[i] = rnd();
    uni[0] = 0; /* engine hashes 0 and 1 are valid keys too */
    uni[1] = 1;

    /* phases: target sizes the map walks to (grow, shrink to empty, churn around a size) */
    static const uint32_t target[] = {40, 0, 3000, 2900, 3100, 20, 9000, 0, 700, 650, 0};
    uint64_t ops = 0;
    for (size_t ph = 0; ph < sizeof(target) / sizeof(target[0]); ph++) {
        uint32_t goal = target[ph], uspan = goal < 50 ? 100 : goal + goal / 3;
        if (uspan > 12000)
            uspan = 12000;
        uint64_t steps = 0;
        while (steps < 4000 || (md.n != goal && steps < 200000)) {
            g_op = ++ops;
            steps++;
            int grow = md.n < goal ? rnd_below(100) < 80 : rnd_below(100) < 20;
            if (md.n == goal && rnd_below(2) == 0)
                grow = !grow;
            if (grow) {
                if (rnd_below(64) == 0) /* a store ahead: room for a batch first */
                    recmap_reserve(&slot, &h.recs, 1 + rnd_below(64));
                uint64_t eh = uni[rnd_below(uspan)];
                rev_store(&slot, &h, eh);
                model_set(&md, eh, model_get(&md, eh) + 1);
                CHECK(rev_copies(&h, eh) == model_get(&md, eh));
            } else if (md.n > 0) {
                /* a known key most of the time, sometimes one the map never had */
                uint64_t eh = rnd_below(8) ? md.k[rnd_below((uint32_t)md.n)] : rnd() | 1ull << 63;
                uint64_t c = model_get(&md, eh);
                CHECK(rev_unstore(&slot, &h, eh) == (c > 0));
                if (c > 0)
                    model_set(&md, eh, c - 1);
                CHECK(rev_copies(&h, eh) == model_get(&md, eh));
            }
            if (ops % 97 == 0 || h.recs.cap <= 64)
                recmap_check_all(&h.recs, &md);
        }
        recmap_check_all(&h.recs, &md);
        for (size_t i = 0; i < md.n; i++)
            CHECK(rev_copies(&h, md.k[i]) == md.v[i]);
        if (goal == 0)
            CHECK(h.recs.s == NULL && h.recs.cap == 0); /* memory follows contents */
    }

    /* the copies overflow: past COPIES_MAX the count goes on in `extra` and comes back */
    const uint64_t hot[3] = {uni[2], uni[3], uni[4]};
    const uint64_t over[3] = {COPIES_MAX - 1, COPIES_MAX, COPIES_MAX + 1234};
    for (int k = 0; k < 3; k++) {
        for (uint64_t i = 0; i < over[k]; i++)
            rev_store(&slot, &h, hot[k]);
        model_set(&md, hot[k], model_get(&md, hot[k]) + over[k]);
        CHECK(rev_copies(&h, hot[k]) == model_get(&md, hot[k]));
    }
    recmap_check_all(&h.recs, &md);
    for (int k = 2; k >= 0; k--) {
        uint64_t c = model_get(&md, hot[k]);
        for (uint64_t i = 0; i < c; i++) {
            g_op = ++ops;
            CHECK(rev_unstore(&slot, &h, hot[k]) == 1);
            if ((c - i) % 4099 == 0 || c - i < 3 ||
                (c - i > COPIES_MAX - 3 && c - i < COPIES_MAX + 3))
                CHECK(rev_copies(&h, hot[k]) == c - i - 1);
        }
        model_set(&md, hot[k], 0);
        CHECK(rev_unstore(&slot, &h, hot[k]) == 0);
    }
    CHECK(h.extra.n == 0 && h.extra.s == NULL);

    /* empty it: every record and array freed, the bytes accounted back to zero */
    while (md.n > 0) {
        g_op = ++ops;
        uint64_t eh = md.k[md.n - 1];
        CHECK(rev_unstore(&slot, &h, eh) == 1);
        model_set(&md, eh, md.v[md.n - 1] - 1);
    }
    recmap_check_all(&h.recs, &md);
    CHECK(h.recs.s == NULL);
    CHECK(slot.bytes == 0);
    model_free(&md);
    free(uni);
}

/* ---- the counting map --------------------------------------------------------------- */

static void cmap_check_all(const struct cmap *m, const struct model *md)
{
    if (m->s == NULL) {
        CHECK(m->n == 0 && md->n == 0);
        return;
    }
    uint32_t cap = m->mask + 1, live = 0;
    CHECK((cap & (cap - 1)) == 0);
    for (uint32_t i = 0; i < cap; i++) {
        if (m->s[i].val == 0)
            continue;
        live++;
        CHECK(m->s[i].val == model_get(md, m->s[i].key));
        /* reachable: no empty slot between its home and itself (backward-shift deletion
         * keeps this without tombstones) */
        for (uint32_t j = (uint32_t)kvr_hash_mix64(m->s[i].key) & m->mask; j != i;
             j = (j + 1) & m->mask)
            CHECK(m->s[j].val != 0);
    }
    CHECK(live == m->n);
    CHECK(m->n == md->n);
    CHECK((uint64_t)m->n * 4 <= (uint64_t)cap * 3);
    for (size_t i = 0; i < md->n; i++)
        CHECK(kvr_ix_cmap_get(m, md->k[i]) == md->v[i]);
}

static void test_cmap_random(void **state)
{
    (void)state;
    struct ebr_slot slot;
    memset(&slot, 0, sizeof(slot));
    struct cmap m;
    memset(&m, 0, sizeof(m));
    struct model md = {0};
    uint64_t *uni = malloc(8000 * sizeof(*uni));
    assert_non_null(uni);
    for (int i = 0; i < 8000; i++)
        uni[i] = i < 4000 ? rnd() : (uint64_t)i; /* random keys and small dense ones */
    uni[0] = 0;

    static const uint32_t target[] = {10, 0, 2000, 30, 5000, 4900, 0, 300, 0};
    uint64_t ops = 0;
    for (size_t ph = 0; ph < sizeof(target) / sizeof(target[0]); ph++) {
        uint32_t goal = target[ph], uspan = goal < 50 ? 120 : goal + goal / 2;
        if (uspan > 8000)
            uspan = 8000;
        uint64_t steps = 0;
        while (steps < 4000 || (md.n != goal && steps < 200000)) {
            g_op = ++ops;
            steps++;
            int grow = md.n < goal ? rnd_below(100) < 80 : rnd_below(100) < 20;
            if (md.n == goal && rnd_below(2) == 0)
                grow = !grow;
            uint64_t key;
            int64_t delta;
            if (grow || md.n == 0) {
                key = uni[rnd_below(uspan)];
                delta = 1 + (int64_t)rnd_below(rnd_below(4) ? 3 : 1000);
            } else {
                size_t i = rnd_below((uint32_t)md.n);
                key = md.k[i];
                /* down to zero (a deletion) most of the time, else part of the way */
                delta = rnd_below(4) ? -(int64_t)md.v[i] : -(int64_t)(1 + rnd() % md.v[i]);
            }
            if (rnd_below(16) == 0)
                delta = 0; /* a no-op, on a present key or an absent one */
            CHECK(kvr_ix_cmap_add(&slot, &m, key, delta) == 0);
            model_set(&md, key, (uint64_t)((int64_t)model_get(&md, key) + delta));
            CHECK(kvr_ix_cmap_get(&m, key) == model_get(&md, key));
            if (ops % 89 == 0 || m.mask < 64)
                cmap_check_all(&m, &md);
        }
        cmap_check_all(&m, &md);
        if (goal == 0)
            CHECK(m.s == NULL); /* memory follows contents */
    }
    CHECK(kvr_ix_cmap_add(&slot, &m, 42, 5) == 0);
    kvr_ix_cmap_free(&slot, &m);
    CHECK(m.s == NULL && m.n == 0 && kvr_ix_cmap_get(&m, 42) == 0);
    CHECK(slot.bytes == 0);
    model_free(&md);
    free(uni);
}

int main(int argc, char **argv)
{
    const char *e = argc > 1 ? argv[1] : getenv("KVR_SEED");
    g_seed = e != NULL ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
    g_rng = g_seed;
    printf("test_index_maps: seed %" PRIu64 " (KVR_SEED=<n> or argv[1] repeats a run)\n", g_seed);
    fflush(stdout);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recmap_random),
        cmocka_unit_test(test_cmap_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
