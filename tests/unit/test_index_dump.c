/* test_index_dump.c — a worker's dump and restore (src/index/index_dump.c) must rebuild the index
 * exactly: the restored index is compared with the original, which is the reference (the
 * original itself is checked against a naive model by test_index_diff.c).
 *
 * Each round builds an index from random operations over several workers, tiers and
 * namespaces: chains with shared prefixes, duplicate stores (copies, once past 0xffff into
 * the `extra` map), aliases (two engine hashes for one entry), removes in the middle (holes),
 * orphans (unknown parents), clears. Every worker is dumped and restored into a fresh index
 * (namespaces and tiers interned in order first), then compared white-box (index_int.h): per
 * holder every record (key, entry chain, parent chain, position 0, copies incl. extra) and
 * every membership's child count, the absent map, the alias counts, holes, blocks, the
 * worker's holey-holder count, its orphans in order and its awaited map; and through the API:
 * statistics, per-worker blocks and orphans, find answers for many queries. Then the same
 * random operations are applied to both indexes (every result compared) and they are compared
 * again. Restore is also fed truncations and byte flips of valid blobs: refused ones must
 * leave the index untouched, accepted ones must stay consistent (clearing empties it).
 * One test restores and dumps while reader threads run finds and another worker's writer
 * stores and removes the same sequences (TSan's part).
 *
 * KVR_SEED=<n> reproduces a run (printed first, and with every failure); KVR_DUMP_ROUNDS
 * changes the number of rounds (default 6). KVR_DUMP_CORPUS=<dir> writes the round's blobs
 * as the fuzz seed corpus (tests/fuzz/corpus/index_restore).
 */
#include <inttypes.h>
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

#include "core/buf.h"
#include "index/index_int.h"

static uint64_t g_seed, g_rng;
static int g_round;

static uint64_t rnd(void)
{
    g_rng += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    uint64_t z = g_rng;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rn(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}

#define CHECK(c)                                                                              \
    do {                                                                                      \
        if (!(c))                                                                             \
            fail_msg("check failed: %s (line %d, KVR_SEED=%" PRIu64 ", round %d)", #c,        \
                     __LINE__, g_seed, g_round);                                              \
    } while (0)

/* ---- the shape of a test index ---------------------------------------------------------- */

#define NNS 3
#define NPODS 4
#define NRANKS 2
#define NW (NPODS * NRANKS)
#define NTIERS 4 /* gpu, cpu, storage and an interned "nvme" */
#define NSEQ 48
#define SEQ_MAX 40
#define ORPH_CAP 24
#define DUMP_HDR_LEN 9 /* version byte, u64 body length */

/* Sequences: content hashes per namespace, many sharing prefixes (a system prompt). */
struct seq {
    uint32_t ns, n;
    uint64_t c[SEQ_MAX];
};
static struct seq g_seq[NSEQ];

static void make_seqs(void)
{
    for (int i = 0; i < NSEQ; i++) {
        struct seq *s = &g_seq[i];
        s->ns = rn(NNS);
        s->n = 1 + rn(SEQ_MAX);
        uint32_t share = 0;
        if (i > 0 && rn(3) != 0) { /* share a prefix with an earlier sequence of this ns */
            const struct seq *o = &g_seq[rn((uint32_t)i)];
            if (o->ns == s->ns)
                share = rn(o->n + 1) < s->n ? rn(o->n + 1) : s->n;
            memcpy(s->c, o->c, share * sizeof(uint64_t));
        }
        for (uint32_t k = share; k < s->n; k++)
            s->c[k] = rnd();
    }
}

/* The engine's hash of block k of a sequence: a chained hash (vLLM's), with a salt that
 * makes aliases (another engine hash for the same tokens). */
static uint64_t ehash(const struct seq *s, uint32_t k, uint32_t salt)
{
    uint64_t h = 0x1234 + s->ns + salt * 0x9e37;
    for (uint32_t i = 0; i <= k; i++)
        h = kvr_hash_mix64(h ^ s->c[i]);
    return h;
}

static struct kvr_index *make_index(uint32_t *wids)
{
    struct kvr_index_opts o = {.orphan_capacity = ORPH_CAP, .max_workers = 64};
    struct kvr_index *ix;
    assert_int_equal(kvr_index_create(&o, &ix), 0);
    for (int n = 0; n < NNS; n++) {
        char model[16];
        snprintf(model, sizeof(model), "model-%d", n);
        uint32_t id;
        assert_int_equal(kvr_index_ns_intern(ix, model, n == 2 ? "lora-x" : NULL, &id, NULL), 0);
        CHECK(id == (uint32_t)n);
    }
    uint8_t t;
    assert_int_equal(kvr_index_tier_intern(ix, "NVMe", 4, &t), 0);
    CHECK(t == 3);
    for (int p = 0; p < NPODS; p++)
        for (int r = 0; r < NRANKS; r++) {
            char pod[16];
            snprintf(pod, sizeof(pod), "pod-%d", p);
            assert_int_equal(kvr_index_worker_intern(ix, pod, (uint32_t)r,
                                                     &wids[p * NRANKS + r]), 0);
        }
    return ix;
}

/* A fresh index named like src (namespaces and tiers from src's names, in id order: what
 * the snapshot module does), with the same workers. */
static struct kvr_index *make_like(struct kvr_index *src, uint32_t *wids)
{
    struct kvr_index_opts o = {.orphan_capacity = ORPH_CAP, .max_workers = 64};
    struct kvr_index *ix;
    assert_int_equal(kvr_index_create(&o, &ix), 0);
    for (uint32_t n = 0; n < kvr_index_ns_count(src); n++) {
        const char *model, *lora;
        uint32_t id;
        assert_int_equal(kvr_index_ns_names(src, n, &model, &lora), 0);
        assert_int_equal(kvr_index_ns_intern(ix, model, lora, &id, NULL), 0);
        CHECK(id == n);
    }
    for (uint8_t t = 0; t < kvr_index_tier_count(src); t++) {
        const char *name = kvr_index_tier_name(src, t);
        uint8_t id;
        assert_int_equal(kvr_index_tier_intern(ix, name, strlen(name), &id), 0);
        CHECK(id == t);
    }
    for (uint32_t w = 0; w < NW; w++) {
        uint32_t id;
        assert_int_equal(kvr_index_worker_intern(ix, kvr_index_worker_pod(src, wids[w]),
                                                 kvr_index_worker_rank(src, wids[w]), &id), 0);
        CHECK(id == wids[w]);
    }
    return ix;
}

/* ---- random operations, applied identically to one or two indexes ---------------------- */

static void op(struct kvr_index **ixs, int nix, const uint32_t *wids)
{
    uint32_t w = wids[rn(NW)];
    uint8_t tier = (uint8_t)(rn(4) == 0 ? rn(NTIERS) : rn(2));
    const struct seq *s = &g_seq[rn(NSEQ)];
    uint32_t salt = rn(12) == 0 ? 1 : 0;
    struct kvr_index_wres res[2] = {{0}, {0}};
    int rc[2] = {0, 0};
    uint32_t kind = rn(100);
    if (kind < 55) { /* store a segment [a, b) of the sequence, after its true parent */
        uint32_t a = rn(4) == 0 ? rn(s->n) : 0, b = a + 1 + rn(s->n - a);
        struct kvr_index_block blk[SEQ_MAX];
        for (uint32_t k = a; k < b; k++)
            blk[k - a] = (struct kvr_index_block){ehash(s, k, salt), s->c[k]};
        uint64_t parent = a > 0 ? ehash(s, a - 1, salt) : 0;
        if (a > 0 && rn(8) == 0)
            parent = rnd(); /* a parent nobody knows: orphans */
        for (int i = 0; i < nix; i++)
            rc[i] = kvr_index_store(ixs[i], w, tier, s->ns, a > 0 ? &parent : NULL, blk,
                                    b - a, &res[i]);
    } else if (kind < 85) { /* remove a few blocks, tail first or anywhere (holes) */
        uint64_t h[8];
        uint32_t n = 1 + rn(8), k0 = rn(s->n);
        for (uint32_t i = 0; i < n; i++)
            h[i] = ehash(s, rn(2) ? (k0 >= i ? k0 - i : 0) : rn(s->n), salt);
        for (int i = 0; i < nix; i++)
            rc[i] = kvr_index_remove(ixs[i], w, tier, h, n, &res[i]);
    } else if (kind < 87) {
        int t = rn(3) == 0 ? -1 : (int)tier;
        for (int i = 0; i < nix; i++)
            rc[i] = kvr_index_clear(ixs[i], w, t, &res[i]);
    } else { /* duplicates of what is there */
        struct kvr_index_block blk = {ehash(s, 0, salt), s->c[0]};
        for (int i = 0; i < nix; i++)
            rc[i] = kvr_index_store(ixs[i], w, tier, s->ns, NULL, &blk, 1, &res[i]);
    }
    for (int i = 0; i < nix; i++)
        CHECK(rc[i] == 0);
    if (nix == 2)
        CHECK(memcmp(&res[0], &res[1], sizeof(res[0])) == 0);
}

/* ---- white-box canonical state of a worker ------------------------------------------------ */

struct tup {
    uint64_t v[7];
};

static int tup_cmp(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct tup));
}

struct canon {
    struct tup *t;
    size_t n, cap;
};

static void put(struct canon *c, uint64_t a, uint64_t b, uint64_t d, uint64_t e, uint64_t f,
                uint64_t g, uint64_t h)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 256;
        c->t = realloc(c->t, c->cap * sizeof(*c->t));
        assert_non_null(c->t);
    }
    c->t[c->n++] = (struct tup){{a, b, d, e, f, g, h}};
}

/* nchild of holder in x (it must hold it) */
static uint32_t nchild_of(const struct node *x, uint32_t holder)
{
    uint32_t n = x->n & N_COUNT;
    if (!(x->n & N_EXT)) {
        CHECK(n == 1 && (uint32_t)x->h == holder);
        return (uint32_t)(x->h >> 32);
    }
    const struct hset *hs = (const struct hset *)(uintptr_t)x->h;
    for (uint32_t i = 0; i < n; i++)
        if (hs->v[i] == holder)
            return hs->v[hs->cap + i];
    CHECK(0);
    return 0;
}

/* Everything the worker's state is, as sorted tuples; node pointers are named by chain. */
static void canon_worker(struct kvr_index *ix, uint32_t wid, struct canon *c)
{
    struct worker *w = worker_get(ix, wid);
    CHECK(w != NULL);
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++) {
        const struct holder *H = w->h[t];
        if (H == NULL || (H->recs.n == 0 && H->holes == 0)) /* an empty holder is none */
            continue;
        put(c, 1, t, H->blocks, H->holes, H->recs.n, H->absent.n, H->alias.n);
        for (uint32_t i = 0; i < H->recs.cap; i++) {
            const struct rec *r = &H->recs.s[i];
            if (!REC_LIVE(r))
                continue;
            const struct node *x = REC_ND(r);
            uint64_t copies = REC_COPIES(r);
            if (copies == COPIES_MAX)
                copies += kvr_ix_cmap_get(&H->extra, r->key);
            put(c, 2, t, r->key, x->chain, x->parent_chain,
                copies << 8 | ((x->n & N_ROOT) ? 1 : 0),
                nchild_of(x, HOLDER(wid, t)) | (uint64_t)kvr_ix_cmap_get(&H->alias,
                                                                         (uintptr_t)x) << 32);
        }
        for (uint32_t i = 0; H->absent.s && i <= H->absent.mask; i++)
            if (H->absent.s[i].val)
                put(c, 3, t, H->absent.s[i].key, H->absent.s[i].val, 0, 0, 0);
        for (uint32_t i = 0; H->extra.s && i <= H->extra.mask; i++)
            if (H->extra.s[i].val)
                put(c, 4, t, H->extra.s[i].key, H->extra.s[i].val, 0, 0, 0);
    }
    for (uint32_t i = 0; i < w->norph; i++) {
        const struct parked *pk = &w->orph[i];
        put(c, 5, i, pk->eh, pk->content, pk->parent, pk->ns, pk->tier);
    }
    for (uint32_t i = 0; w->awaited.s && i <= w->awaited.mask; i++)
        if (w->awaited.s[i].val)
            put(c, 6, w->awaited.s[i].key, w->awaited.s[i].val, 0, 0, 0, 0);
    put(c, 7, w->norph, w->porph, ix->wslow[wid], 0, 0, 0);
    qsort(c->t, c->n, sizeof(*c->t), tup_cmp);
}

static void same_worker(struct kvr_index *a, struct kvr_index *b, uint32_t wid)
{
    struct canon ca = {0}, cb = {0};
    canon_worker(a, wid, &ca);
    canon_worker(b, wid, &cb);
    if (ca.n != cb.n)
        fprintf(stderr, "worker %u: %zu vs %zu tuples\n", wid, ca.n, cb.n);
    for (size_t i = 0; i < ca.n && i < cb.n; i++)
        if (tup_cmp(&ca.t[i], &cb.t[i]) != 0) {
            fprintf(stderr, "worker %u: tuple %zu differs: kind %" PRIu64 "/%" PRIu64 "\n",
                    wid, i, ca.t[i].v[0], cb.t[i].v[0]);
            break;
        }
    CHECK(ca.n == cb.n && (ca.n == 0 || memcmp(ca.t, cb.t, ca.n * sizeof(*ca.t)) == 0));
    free(ca.t);
    free(cb.t);
}

/* Through the API: statistics, per-worker blocks and orphans, find answers. */
static void same_answers(struct kvr_index *a, struct kvr_index *b, const uint32_t *wids)
{
    struct kvr_index_stats sa, sb;
    kvr_index_stats(a, &sa);
    kvr_index_stats(b, &sb);
    CHECK(sa.entries == sb.entries && sa.holders == sb.holders && sa.orphans == sb.orphans &&
          sa.workers == sb.workers && sa.namespaces == sb.namespaces);
    for (int i = 0; i < NW; i++) {
        uint64_t ba[KVR_TIER_MAX], bb[KVR_TIER_MAX];
        kvr_index_worker_blocks(a, wids[i], ba);
        kvr_index_worker_blocks(b, wids[i], bb);
        CHECK(memcmp(ba, bb, sizeof(ba)) == 0);
        CHECK(kvr_index_worker_orphans(a, wids[i]) == kvr_index_worker_orphans(b, wids[i]));
    }
    struct kvr_index_reader *ra, *rb;
    assert_int_equal(kvr_index_reader_create(a, &ra), 0);
    assert_int_equal(kvr_index_reader_create(b, &rb), 0);
    const double wt[KVR_TIER_MAX] = {1, 0.5, 0.25, 0.125, 0, 0, 0, 0};
    for (int q = 0; q < 200; q++) {
        const struct seq *s = &g_seq[rn(NSEQ)];
        uint64_t qc[SEQ_MAX];
        uint32_t n = 1 + rn(s->n);
        memcpy(qc, s->c, n * sizeof(uint64_t));
        if (rn(4) == 0)
            qc[rn(n)] = rnd(); /* diverges somewhere */
        const struct kvr_index_hit *ha, *hb;
        size_t na, nb;
        assert_int_equal(kvr_index_find(ra, s->ns, qc, n, NULL, 0, wt, &ha, &na), 0);
        assert_int_equal(kvr_index_find(rb, s->ns, qc, n, NULL, 0, wt, &hb, &nb), 0);
        CHECK(na == nb);
        for (size_t i = 0; i < na; i++) {
            CHECK(ha[i].wid == hb[i].wid && ha[i].matched == hb[i].matched &&
                  ha[i].score == hb[i].score && strcmp(ha[i].pod, hb[i].pod) == 0);
            CHECK(memcmp(ha[i].tier_matched, hb[i].tier_matched, sizeof(ha[i].tier_matched)) ==
                  0);
        }
    }
    kvr_index_reader_destroy(ra);
    kvr_index_reader_destroy(rb);
}

static void same(struct kvr_index *a, struct kvr_index *b, const uint32_t *wids)
{
    for (int i = 0; i < NW; i++)
        same_worker(a, b, wids[i]);
    same_answers(a, b, wids);
}

/* Dumps every worker of a into blobs[] (each its own buffer). */
static void dump_all(struct kvr_index *a, const uint32_t *wids, struct kvr_buf *blobs)
{
    for (int i = 0; i < NW; i++) {
        kvr_buf_init(&blobs[i]);
        assert_int_equal(kvr_index_worker_dump(a, wids[i], &blobs[i]), 0);
    }
}

static void restore_all(struct kvr_index *b, const uint32_t *wids, struct kvr_buf *blobs,
                        uint64_t *stored, uint64_t *orphaned)
{
    for (int i = 0; i < NW; i++) {
        struct kvr_index_wres res = {0};
        assert_int_equal(kvr_index_worker_restore(b, wids[i], blobs[i].data, blobs[i].len,
                                                  &res), 0);
        *stored += res.stored;
        *orphaned += res.orphaned;
        CHECK(res.orphans_dropped == 0);
    }
}

static void write_corpus(const struct kvr_buf *blobs)
{
    const char *dir = getenv("KVR_DUMP_CORPUS");
    if (dir == NULL)
        return;
    for (int i = 0; i < NW; i++) {
        if (blobs[i].len > 64 * 1024)
            continue; /* seeds stay small */
        char path[512];
        snprintf(path, sizeof(path), "%s/round%d-w%d", dir, g_round, i);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        CHECK(fwrite(blobs[i].data, 1, blobs[i].len, f) == blobs[i].len);
        fclose(f);
    }
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_roundtrip(void **state)
{
    (void)state;
    const char *env = getenv("KVR_DUMP_ROUNDS");
    int rounds = env ? atoi(env) : 6;
    for (g_round = 0; g_round < rounds; g_round++) {
        g_rng = g_seed ^ (uint64_t)g_round * 0x51ed27ull;
        make_seqs();
        uint32_t wids[NW], wb[NW];
        struct kvr_index *a = make_index(wids);
        int nops = 400 + (int)rn(3000);
        for (int i = 0; i < nops; i++)
            op(&a, 1, wids);
        if (g_round == 1) { /* copies past 0xffff: the extra map */
            const struct seq *s = &g_seq[0];
            struct kvr_index_block blk = {ehash(s, 0, 0), s->c[0]};
            for (int i = 0; i < 0x10000 + 7; i++)
                assert_int_equal(kvr_index_store(a, wids[0], 0, s->ns, NULL, &blk, 1, NULL), 0);
        }
        struct kvr_buf blobs[NW];
        dump_all(a, wids, blobs);
        write_corpus(blobs);
        struct kvr_index *b = make_like(a, wids);
        memcpy(wb, wids, sizeof(wb));
        uint64_t stored = 0, orphaned = 0;
        restore_all(b, wb, blobs, &stored, &orphaned);
        struct kvr_index_stats st;
        kvr_index_stats(a, &st);
        CHECK(orphaned == st.orphans);
        size_t bytes = 0;
        for (int i = 0; i < NW; i++)
            bytes += blobs[i].len;
        printf("round %d: %d ops, %" PRIu64 " records, %" PRIu64 " pairs, %" PRIu64
               " entries, %" PRIu64 " orphans, %zu bytes\n",
               g_round, nops, stored, st.holders, st.entries, st.orphans, bytes);
        same(a, b, wids);
        /* a dump of the restored index restores to the same again (its bytes may differ:
         * the entries' order follows the reverse maps' slots) */
        struct kvr_buf again[NW];
        dump_all(b, wids, again);
        struct kvr_index *b2 = make_like(a, wids);
        uint64_t stored2 = 0, orphaned2 = 0;
        restore_all(b2, wids, again, &stored2, &orphaned2);
        CHECK(stored2 == stored && orphaned2 == orphaned);
        same(a, b2, wids);
        kvr_index_destroy(b2);
        /* then both live on identically */
        struct kvr_index *both[2] = {a, b};
        for (int i = 0; i < 2000; i++)
            op(both, 2, wids);
        same(a, b, wids);
        for (int i = 0; i < NW; i++) {
            kvr_buf_free(&blobs[i]);
            kvr_buf_free(&again[i]);
        }
        /* clearing everything leaves nothing in either */
        for (int i = 0; i < NW; i++) {
            assert_int_equal(kvr_index_clear(a, wids[i], -1, NULL), 0);
            assert_int_equal(kvr_index_clear(b, wids[i], -1, NULL), 0);
        }
        kvr_index_stats(b, &st);
        CHECK(st.entries == 0 && st.holders == 0 && st.orphans == 0);
        kvr_index_destroy(a);
        kvr_index_destroy(b);
    }
}

/* The index's observable state is empty for worker w (after a refused restore). */
static void untouched(struct kvr_index *ix)
{
    struct kvr_index_stats st;
    kvr_index_stats(ix, &st);
    CHECK(st.entries == 0 && st.holders == 0 && st.orphans == 0);
    for (uint32_t w = 0; w < kvr_index_worker_count(ix); w++) {
        struct worker *wk = worker_get(ix, w);
        CHECK(wk->norph == 0 && wk->awaited.n == 0 && ix->wslow[w] == 0);
        for (int t = 0; t < KVR_TIER_MAX; t++) {
            const struct holder *H = wk->h[t];
            CHECK(H == NULL || (H->recs.n == 0 && H->absent.n == 0 && H->alias.n == 0 &&
                                H->extra.n == 0 && H->blocks == 0 && H->holes == 0));
        }
    }
}

/* Feeds restore one mutated blob; returns its rc. A refused blob must change nothing; an
 * accepted one must be consistent enough to be written to and cleared to nothing. */
static int feed(struct kvr_index *c, uint32_t wid, const uint8_t *p, size_t n)
{
    struct kvr_index_wres res = {0};
    int rc = kvr_index_worker_restore(c, wid, p, n, &res);
    CHECK(rc == 0 || rc == -EINVAL);
    if (rc != 0) {
        untouched(c);
        return rc;
    }
    /* accepted (a flip that kept it valid): usable, then cleared to nothing */
    const struct seq *s = &g_seq[0];
    struct kvr_index_block blk = {ehash(s, 0, 0), s->c[0]};
    assert_int_equal(kvr_index_store(c, wid, 0, s->ns, NULL, &blk, 1, NULL), 0);
    assert_int_equal(kvr_index_clear(c, wid, -1, NULL), 0);
    untouched(c);
    return rc;
}

static void test_bad_blobs(void **state)
{
    (void)state;
    g_round = 0;
    g_rng = g_seed ^ 0xbadull;
    make_seqs();
    uint32_t wids[NW];
    struct kvr_index *a = make_index(wids);
    for (int i = 0; i < 600; i++)
        op(&a, 1, wids);
    struct kvr_buf blobs[NW];
    dump_all(a, wids, blobs);
    /* the largest blob */
    int big = 0;
    for (int i = 1; i < NW; i++)
        if (blobs[i].len > blobs[big].len)
            big = i;
    const uint8_t *b = (const uint8_t *)blobs[big].data;
    size_t len = blobs[big].len;
    struct kvr_index *c = make_like(a, wids);
    uint32_t w = wids[big];
    /* every truncation, and the blob with a byte more */
    for (size_t n = 0; n < len; n += n < 64 ? 1 : 1 + rn(7))
        CHECK(feed(c, w, b, n) == -EINVAL);
    uint8_t *m = malloc(len + 64);
    assert_non_null(m);
    memcpy(m, b, len);
    m[len] = 0;
    CHECK(feed(c, w, m, len + 1) == -EINVAL);
    /* random flips: most refused, any accepted must be consistent */
    int accepted = 0;
    for (int i = 0; i < 3000; i++) {
        memcpy(m, b, len);
        int nf = 1 + (int)rn(3);
        for (int k = 0; k < nf; k++)
            m[rn((uint32_t)len)] ^= (uint8_t)(1u << rn(8));
        accepted += feed(c, w, m, len) == 0;
    }
    /* the blob itself still restores, and the worker is then busy */
    struct kvr_index_wres res = {0};
    assert_int_equal(kvr_index_worker_restore(c, w, b, len, &res), 0);
    CHECK(kvr_index_worker_restore(c, w, b, len, &res) == -EBUSY);
    CHECK(kvr_index_worker_restore(c, 63, b, len, &res) == -ENOENT);
    printf("bad blobs: %zu bytes, %d of 3000 flipped blobs accepted (keys, chains)\n", len,
           accepted);
    free(m);
    for (int i = 0; i < NW; i++)
        kvr_buf_free(&blobs[i]);
    kvr_index_destroy(a);
    kvr_index_destroy(c);
}

/* A blob whose entry another worker of the restoring index holds with another parent (a
 * blob from another index): refused, found late (after many entries were applied), and
 * withdrawn: the worker holds nothing, the other worker is exactly as before, and the index
 * answers as before. */
static void test_conflict(void **state)
{
    (void)state;
    uint32_t wids[NW];
    g_round = 0;
    g_rng = g_seed ^ 0xc0ull;
    make_seqs();
    struct kvr_index *a = make_index(wids);
    struct kvr_index_block blk[30];
    uint64_t chain[30], pch = ns_root(0);
    for (int k = 0; k < 30; k++) {
        blk[k] = (struct kvr_index_block){1000 + (uint64_t)k, 500 + (uint64_t)k};
        chain[k] = pch = kvr_hash_chain(pch, blk[k].content_hash);
    }
    assert_int_equal(kvr_index_store(a, wids[0], 0, 0, NULL, blk, 30, NULL), 0);
    assert_int_equal(kvr_index_store(a, wids[0], 1, 0, NULL, blk, 25, NULL), 0);
    struct kvr_buf bl;
    kvr_buf_init(&bl);
    assert_int_equal(kvr_index_worker_dump(a, wids[0], &bl), 0);
    struct kvr_index *c = make_like(a, wids);
    /* in c, worker 1 holds a's block 20 (chain and all) at position 0, and shares a's first
     * blocks: the restore joins those, then meets the conflict */
    uint64_t fake = chain[20] - ns_root(0) * KVR_HASH_CHAIN_MUL; /* that chain at position 0 */
    struct kvr_index_block fb = {77, fake};
    assert_int_equal(kvr_index_store(c, wids[1], 0, 0, NULL, &fb, 1, NULL), 0);
    assert_int_equal(kvr_index_store(c, wids[1], 0, 0, NULL, blk, 5, NULL), 0);
    struct canon before = {0}, after = {0};
    canon_worker(c, wids[1], &before);
    struct kvr_index_stats st0, st1;
    kvr_index_stats(c, &st0);
    struct kvr_index_wres res = {0};
    CHECK(kvr_index_worker_restore(c, wids[0], bl.data, bl.len, &res) == -EINVAL);
    CHECK(res.stored == 0 && res.orphaned == 0);
    kvr_index_stats(c, &st1);
    CHECK(st0.entries == st1.entries && st0.holders == st1.holders && st1.orphans == 0);
    canon_worker(c, wids[1], &after);
    CHECK(before.n == after.n && memcmp(before.t, after.t, before.n * sizeof(*before.t)) == 0);
    struct worker *w0 = worker_get(c, wids[0]);
    CHECK(w0->norph == 0 && c->wslow[wids[0]] == 0);
    for (int t = 0; t < KVR_TIER_MAX; t++)
        CHECK(w0->h[t] == NULL || (w0->h[t]->recs.n == 0 && w0->h[t]->blocks == 0 &&
                                   w0->h[t]->holes == 0 && w0->h[t]->absent.n == 0));
    /* and the worker takes a good blob afterwards (the other worker's entry forgotten) */
    uint32_t pid;
    assert_int_equal(kvr_index_pod_lookup(c, kvr_index_worker_pod(c, wids[1]), &pid), 0);
    CHECK(kvr_index_worker_pod_id(c, wids[0]) == pid); /* pod-0 holds both ranks */
    assert_int_equal(kvr_index_clear(c, wids[1], -1, NULL), 0);
    assert_int_equal(kvr_index_worker_restore(c, wids[0], bl.data, bl.len, NULL), 0);
    same_worker(a, c, wids[0]);
    free(before.t);
    free(after.t);
    kvr_buf_free(&bl);
    kvr_index_destroy(a);
    kvr_index_destroy(c);
}

/* ---- concurrent readers (TSan) ------------------------------------------------------------ */

static struct kvr_index *g_cix;
static int g_stop;
static uint64_t g_finds;
static uint64_t g_live_finds, g_live_xops; /* progress seen while running */

/* Waits (at most 5 s) until the readers and the other writer have each made progress since
 * *f and *x: on a 2-core machine the restores could otherwise all run before they are
 * scheduled once, and nothing would have been concurrent. */
static void wait_progress(uint64_t *f, uint64_t *x)
{
    struct timespec t0, now, nap = {0, 200000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        uint64_t nf = __atomic_load_n(&g_live_finds, __ATOMIC_RELAXED);
        uint64_t nx = __atomic_load_n(&g_live_xops, __ATOMIC_RELAXED);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((nf > *f && nx > *x) || now.tv_sec - t0.tv_sec >= 5) {
            *f = nf;
            *x = nx;
            return;
        }
        nanosleep(&nap, NULL);
    }
}

static void *reader(void *arg)
{
    struct kvr_index_reader *r;
    uint64_t s = (uint64_t)(uintptr_t)arg, n = 0;
    if (kvr_index_reader_create(g_cix, &r) != 0)
        return NULL;
    const double wt[KVR_TIER_MAX] = {1, 1, 1, 1, 1, 1, 1, 1};
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        s = kvr_hash_mix64(s + 1);
        const struct seq *q = &g_seq[s % NSEQ];
        const struct kvr_index_hit *h;
        size_t nh;
        if (kvr_index_find(r, q->ns, q->c, q->n, NULL, 0, wt, &h, &nh) == 0)
            for (size_t i = 0; i < nh; i++)
                if (h[i].matched > q->n)
                    abort();
        n++;
        __atomic_fetch_add(&g_live_finds, 1, __ATOMIC_RELAXED);
    }
    kvr_index_reader_destroy(r);
    __atomic_fetch_add(&g_finds, n, __ATOMIC_RELAXED);
    return NULL;
}

/* Another worker's writer storing and removing the same sequences meanwhile: restores join
 * and leave entries it creates and deletes (their shards and nodes shared). */
static uint32_t g_xw;
static uint64_t g_xops;

static void *xwriter(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg, n = 0;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        s = kvr_hash_mix64(s + 1);
        const struct seq *q = &g_seq[s % NSEQ];
        struct kvr_index_block blk[SEQ_MAX];
        uint64_t eh[SEQ_MAX];
        for (uint32_t k = 0; k < q->n; k++) {
            eh[k] = ehash(q, k, 0);
            blk[k] = (struct kvr_index_block){eh[k], q->c[k]};
        }
        if (kvr_index_store(g_cix, g_xw, 0, q->ns, NULL, blk, q->n, NULL) != 0)
            abort();
        if ((s >> 8) % 2 && kvr_index_remove(g_cix, g_xw, 0, eh, q->n, NULL) != 0)
            abort();
        n++;
        __atomic_fetch_add(&g_live_xops, 1, __ATOMIC_RELAXED);
    }
    __atomic_fetch_add(&g_xops, n, __ATOMIC_RELAXED);
    return NULL;
}

static void test_concurrent_readers(void **state)
{
    (void)state;
    g_round = 0;
    g_rng = g_seed ^ 0x7ull;
    make_seqs();
    uint32_t wids[NW];
    struct kvr_index *a = make_index(wids);
    for (int i = 0; i < 1500; i++)
        op(&a, 1, wids);
    struct kvr_buf blobs[NW];
    dump_all(a, wids, blobs);
    g_cix = make_like(a, wids);
    __atomic_store_n(&g_stop, 0, __ATOMIC_RELAXED);
    assert_int_equal(kvr_index_worker_intern(g_cix, "pod-x", 0, &g_xw), 0);
    pthread_t rt[2], xt;
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&rt[i], NULL, reader, (void *)(uintptr_t)(i + 1)), 0);
    assert_int_equal(pthread_create(&xt, NULL, xwriter, (void *)(uintptr_t)99), 0);
    /* restore, dump and clear again and again while the readers find */
    uint64_t seen_f = 0, seen_x = 0;
    for (int rep = 0; rep < 20; rep++) {
        uint64_t stored = 0, orphaned = 0;
        if (rep % 5 == 0)
            wait_progress(&seen_f, &seen_x);
        restore_all(g_cix, wids, blobs, &stored, &orphaned);
        for (int i = 0; i < NW; i++) {
            struct kvr_buf x;
            kvr_buf_init(&x);
            assert_int_equal(kvr_index_worker_dump(g_cix, wids[i], &x), 0);
            CHECK(x.len > 0);
            kvr_buf_free(&x);
        }
        if (rep + 1 < 20)
            for (int i = 0; i < NW; i++)
                assert_int_equal(kvr_index_clear(g_cix, wids[i], -1, NULL), 0);
    }
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++)
        pthread_join(rt[i], NULL);
    pthread_join(xt, NULL);
    /* the restored workers are the originals (a holder's state is its own: child counts,
     * absent and holes count only its own entries); then without the other writer's blocks,
     * the whole index answers as the original does */
    for (int i = 0; i < NW; i++)
        same_worker(a, g_cix, wids[i]);
    uint32_t xpod;
    assert_int_equal(kvr_index_pod_lookup(g_cix, "pod-x", &xpod), 0);
    assert_int_equal(kvr_index_pod_forget(g_cix, xpod, NULL), 0);
    same(a, g_cix, wids);
    printf("concurrent: %" PRIu64 " finds and %" PRIu64 " writes of another worker during 20 "
           "restores\n",
           g_finds, g_xops);
    CHECK(g_finds > 0 && g_xops > 0);
    for (int i = 0; i < NW; i++)
        kvr_buf_free(&blobs[i]);
    kvr_index_destroy(a);
    kvr_index_destroy(g_cix);
}

/* Namespaces' names come back as interned (lora NULL when none). */
static void test_ns_names(void **state)
{
    (void)state;
    uint32_t wids[NW];
    struct kvr_index *a = make_index(wids);
    const char *m, *l;
    CHECK(kvr_index_ns_count(a) == NNS);
    assert_int_equal(kvr_index_ns_names(a, 0, &m, &l), 0);
    CHECK(strcmp(m, "model-0") == 0 && l == NULL);
    assert_int_equal(kvr_index_ns_names(a, 2, &m, &l), 0);
    CHECK(strcmp(m, "model-2") == 0 && l != NULL && strcmp(l, "lora-x") == 0);
    CHECK(kvr_index_ns_names(a, NNS, &m, &l) == -ENOENT);
    struct kvr_buf b;
    kvr_buf_init(&b);
    CHECK(kvr_index_worker_dump(a, 63, &b) == -ENOENT);
    /* an empty worker dumps to a small blob that restores to nothing */
    assert_int_equal(kvr_index_worker_dump(a, wids[0], &b), 0);
    CHECK(b.len == DUMP_HDR_LEN + 3);
    assert_int_equal(kvr_index_worker_restore(a, wids[1], b.data, b.len, NULL), 0);
    untouched(a);
    kvr_buf_free(&b);
    kvr_index_destroy(a);
}

int main(void)
{
    const char *env = getenv("KVR_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    printf("test_index_dump: KVR_SEED=%" PRIu64 "\n", g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ns_names),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_conflict),
        cmocka_unit_test(test_bad_blobs),
        cmocka_unit_test(test_concurrent_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
