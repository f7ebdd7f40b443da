/* bench_radix.c — the seed's radix-tree-vs-positional table, reproduced in our own harness.
 *
 * Why: the project's seed documents justify the positional index with Dynamo's published
 * comparison (lib/kv-router/README.md, "Benchmark Results (1M blocks, depth 1024, 128
 * workers)": RadixTree store 90 / remove 91 / find hit 227 / find partial 216 µs against
 * NestedMap 98 / 233 / 44 / 44). Those figures come from another machine, another language
 * and Dynamo's NestedMap, not our index. This benchmark writes the two radix trees the seed
 * describes, as comparators (they are NOT index backends of the daemon), and runs them in
 * one run (one process tree), on one workload and one random stream, next to the positional
 * index (kvr_index_* from src/index/index.h), so a reader can see on this machine why the
 * positional index was chosen. Notes and figures: docs/radix.md.
 *
 * The comparators (Dynamo's RadixTree and ConcurrentRadixTree, from the seed's description
 * and lib/kv-router/src/radix_tree.rs / concurrent_radix_tree.rs):
 * - a node has a children map keyed by the block's local (content) hash, a set of the
 *   workers holding it, the block's sequence (engine) hash, and a reference count standing
 *   for Rust's Rc/Arc: a node lives while a parent's children map or a worker's lookup
 *   entry points at it (freed iteratively, as Dynamo's Drop, no recursion);
 * - per worker, a lookup map sequence hash -> node, for events (a store's parent, removals);
 * - store(worker, parent, blocks): start at the parent from the worker's lookup (or the
 *   root); per block, take the child by local hash, else reuse the worker's node for that
 *   sequence hash, else create one, and link it; add the worker to its set and the node to
 *   the worker's lookup;
 * - remove(worker, hashes): per hash, the node from the lookup; drop the worker from its
 *   set; an emptied node drops all its children (cascading cleanup) but stays in its
 *   parent's children map (as Dynamo's); the lookup entry goes;
 * - find(local hashes): walk from the root by local hash.
 *   RadixTree: candidates = the first node's workers, intersected with each next node's
 *   workers; a worker that drops out scores the depth reached (the seed's "intersect
 *   candidates with node's workers, track the depth where each worker drops out").
 *   "RadixTree+count" is the same tree with Dynamo's later shortcut (radix_tree.rs today:
 *   intersect only where the child's set is smaller, since sets only shrink down a path),
 *   an extra column (KVR_RADIX_COUNT=0 leaves it out).
 *   ConcurrentRadixTree: each node behind its own pthread rwlock (Arc<RwLock>); find
 *   read-locks the current node to take the child (an atomic reference for the walk, as
 *   Arc::clone), releases it, read-locks the child and adds 1 to the score of every worker
 *   in its set (Dynamo's update_scores: O(depth x workers)); writes write-lock nodes hand
 *   over hand (parent before child) and hold the worker's lookup lock (DashMap's shard
 *   guard) for the whole event. Removal does not walk descendants (the seed's description;
 *   Dynamo's later code collects every descendant first: ~190K nodes under a prefix
 *   group's first block on this workload, milliseconds per remove by our estimate).
 *   Both report tree sizes (the worker's lookup size) for every worker scored, as Dynamo's.
 *
 * Workload (Dynamo's radix_tree_microbench with --size 1000000 --depth 1024
 * --num-workers 128, its defaults otherwise): size / depth = 976 sequences of 1024 blocks,
 * worker = sequence % 128, the first round(0.25 x 1024) = 256 blocks of each sequence from
 * one of 4 prefix groups drawn at random, the rest unique. Local hashes are Dynamo's
 * (0xDEADBEEF00000000 | group << 32 | block for the prefix, seq << 32 | block otherwise)
 * passed through the index's 64-bit bijection (same equalities; the positional index
 * assumes well-mixed content hashes, as xxh3's are); sequence (engine) hashes chain them
 * (h = mix64(h ^ local)). Events are whole sequences without a parent. Measured as Dynamo
 * measures, 1000 iterations of which the first 10% are warm-up and discarded:
 *   STORE_BLOCK     sequence i % 976 removed (untimed), then stored (timed);
 *   REMOVE_BLOCK    sequence i % 976 removed (timed, head first as Dynamo's remove event),
 *                   then stored again (untimed);
 *   FIND (HIT)      the 1024 local hashes of sequence i % 976;
 *   FIND (PARTIAL)  its first 512, then 512 that match nothing;
 * and, not in the seed, the remove again with each sequence's hashes tail first (the order
 * in which vLLM frees a sequence's blocks).
 * Each structure is built (store from empty, reported as an extra row), queried and churned
 * in a child process of its own (a fresh heap, see run_forked), one structure in memory at
 * a time; the structures run in turn, the positional index first (its answers are the
 * reference), R rounds (KVR_RADIX_ROUNDS, default 3) with the trees' order rotated, and
 * each cell prints the median over the rounds of the round's p50 (and of its average).
 * Not in the seed: "HIT, 1 writer churning" (positional and ConcRadixTree only: a reader
 * thread asks HIT queries while the main thread runs another 1000 remove + store cycles;
 * p50 in the table, p99 on a line below; answers checked for sanity only, as they depend
 * on the moment; this is also what exercises the concurrent tree's locks and references).
 *
 * Correctness: every timed find's answer (matched blocks per worker) is kept and compared
 * with the positional index's answer to the same query, and after the churn every HIT
 * query is asked again of each structure and compared again. Any difference prints the
 * query and fails the benchmark (exit 1). The seed is printed (KVR_BENCH_SEED, default 42).
 *
 * Environment: KVR_RADIX_ROUNDS, KVR_RADIX_ITERS (default 1000), KVR_RADIX_SIZE (pairs,
 * default 1000000), KVR_RADIX_DEPTH (1024), KVR_RADIX_WORKERS (128), KVR_RADIX_COUNT,
 * KVR_BENCH_SEED.
 */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "index/hash.h"
#include "index/index.h"

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench_radix: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n, sz);
    if (!p) {
        fprintf(stderr, "bench_radix: out of memory (%zu x %zu bytes)\n", n, sz);
        exit(1);
    }
    return p;
}

/* ---- u64 -> pointer map: linear probing, backward-shift deletion, doubling at 7/8 full,
 * no shrinking (as Rust's HashMap); a NULL value marks an empty slot ------------------- */

struct pslot {
    uint64_t k;
    void *v;
};
struct pmap {
    struct pslot *s;
    uint32_t mask; /* capacity - 1; s == NULL when never used */
    uint32_t n;
};

static inline uint32_t pm_home(const struct pmap *m, uint64_t k)
{
    return (uint32_t)mixh(k) & m->mask;
}

static inline void *pm_get(const struct pmap *m, uint64_t k)
{
    if (!m->s)
        return NULL;
    for (uint32_t i = pm_home(m, k);; i = (i + 1) & m->mask) {
        if (!m->s[i].v)
            return NULL;
        if (m->s[i].k == k)
            return m->s[i].v;
    }
}

static void pm_grow(struct pmap *m)
{
    uint32_t ocap = m->s ? m->mask + 1 : 0, ncap = ocap ? ocap * 2 : 4;
    struct pslot *os = m->s;
    m->s = xcalloc(ncap, sizeof(*m->s));
    m->mask = ncap - 1;
    for (uint32_t j = 0; j < ocap; j++) {
        if (!os[j].v)
            continue;
        uint32_t i = pm_home(m, os[j].k);
        while (m->s[i].v)
            i = (i + 1) & m->mask;
        m->s[i] = os[j];
    }
    free(os);
}

/* Inserts or replaces; returns the value replaced (NULL if the key was new). */
static void *pm_put(struct pmap *m, uint64_t k, void *v)
{
    if (!m->s || (uint64_t)(m->n + 1) * 8 > (uint64_t)(m->mask + 1) * 7)
        pm_grow(m);
    uint32_t i = pm_home(m, k);
    for (; m->s[i].v; i = (i + 1) & m->mask)
        if (m->s[i].k == k) {
            void *old = m->s[i].v;
            m->s[i].v = v;
            return old;
        }
    m->s[i] = (struct pslot){k, v};
    m->n++;
    return NULL;
}

/* Removes k; returns its value (NULL if absent). */
static void *pm_del(struct pmap *m, uint64_t k)
{
    if (!m->s)
        return NULL;
    uint32_t i = pm_home(m, k);
    for (;; i = (i + 1) & m->mask) {
        if (!m->s[i].v)
            return NULL;
        if (m->s[i].k == k)
            break;
    }
    void *old = m->s[i].v;
    for (uint32_t j = i;;) {
        j = (j + 1) & m->mask;
        if (!m->s[j].v)
            break;
        uint32_t h = pm_home(m, m->s[j].k);
        /* move j back to i unless its home lies cyclically in (i, j] */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].v = NULL;
    m->n--;
    return old;
}

/* ---- worker set: u32 ids stored + 1 (0 = empty), same scheme ---------------------------- */

struct wset {
    uint32_t *s;
    uint32_t mask;
    uint32_t n;
};

static inline uint32_t ws_home(const struct wset *w, uint32_t id)
{
    return (uint32_t)(((uint64_t)(id + 1) * 0x9e3779b97f4a7c15ull) >> 40) & w->mask;
}

static inline bool ws_has(const struct wset *w, uint32_t id)
{
    if (!w->s)
        return false;
    for (uint32_t i = ws_home(w, id);; i = (i + 1) & w->mask) {
        if (!w->s[i])
            return false;
        if (w->s[i] == id + 1)
            return true;
    }
}

static void ws_add(struct wset *w, uint32_t id)
{
    if (ws_has(w, id))
        return;
    if (!w->s || (uint64_t)(w->n + 1) * 8 > (uint64_t)(w->mask + 1) * 7) {
        uint32_t ocap = w->s ? w->mask + 1 : 0, ncap = ocap ? ocap * 2 : 4;
        uint32_t *os = w->s;
        w->s = xcalloc(ncap, sizeof(uint32_t));
        w->mask = ncap - 1;
        for (uint32_t j = 0; j < ocap; j++) {
            if (!os[j])
                continue;
            uint32_t i = ws_home(w, os[j] - 1);
            while (w->s[i])
                i = (i + 1) & w->mask;
            w->s[i] = os[j];
        }
        free(os);
    }
    uint32_t i = ws_home(w, id);
    while (w->s[i])
        i = (i + 1) & w->mask;
    w->s[i] = id + 1;
    w->n++;
}

static void ws_del(struct wset *w, uint32_t id)
{
    if (!w->s)
        return;
    uint32_t i = ws_home(w, id);
    for (;; i = (i + 1) & w->mask) {
        if (!w->s[i])
            return;
        if (w->s[i] == id + 1)
            break;
    }
    for (uint32_t j = i;;) {
        j = (j + 1) & w->mask;
        if (!w->s[j])
            break;
        uint32_t h = ws_home(w, w->s[j] - 1);
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            w->s[i] = w->s[j];
            i = j;
        }
    }
    w->s[i] = 0;
    w->n--;
}

/* ---- the trees --------------------------------------------------------------------------- */

struct rnode {
    struct pmap children; /* local hash -> struct rnode * (one reference each) */
    struct wset workers;
    uint64_t block_hash;
    uint32_t refs;            /* Rc strong count; atomic in the concurrent tree */
    pthread_rwlock_t lock[];  /* the concurrent tree's nodes only (Arc<RwLock<Block>>) */
};

struct rtree {
    bool conc;
    uint32_t nworkers;
    struct rnode *root;
    struct pmap *lookup;  /* per worker: sequence hash -> node (one reference each) */
    pthread_rwlock_t *lk; /* concurrent: per worker lookup lock */
    /* find scratch (one reader thread per tree here) */
    uint32_t *score, *act, *touched;
    struct rhit *hits;
};

struct rhit {
    uint32_t w;
    uint32_t matched;
    uint32_t tree_size;
};

static struct rnode *node_new(struct rtree *t, uint64_t block_hash, uint32_t refs)
{
    struct rnode *n = xmalloc(sizeof(*n) + (t->conc ? sizeof(pthread_rwlock_t) : 0));
    memset(n, 0, sizeof(*n));
    n->block_hash = block_hash;
    n->refs = refs;
    if (t->conc)
        pthread_rwlock_init(n->lock, NULL);
    return n;
}

static inline void ref_inc(const struct rtree *t, struct rnode *n)
{
    if (t->conc)
        __atomic_fetch_add(&n->refs, 1, __ATOMIC_RELAXED);
    else
        n->refs++;
}

/* Frees n and every node only it kept alive, iteratively (Dynamo's Drop: no recursion). */
static void node_free(const struct rtree *t, struct rnode *n)
{
    struct rnode *local[64], **stk = local;
    size_t ns = 0, cap = 64;
    stk[ns++] = n;
    while (ns) {
        struct rnode *x = stk[--ns];
        if (x->children.s) {
            for (uint32_t i = 0; i <= x->children.mask; i++) {
                struct rnode *c = x->children.s[i].v;
                if (!c)
                    continue;
                bool last = t->conc ? __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0
                                    : --c->refs == 0;
                if (!last)
                    continue;
                if (ns == cap) {
                    struct rnode **nst = xmalloc(2 * cap * sizeof(*nst));
                    memcpy(nst, stk, ns * sizeof(*nst));
                    if (stk != local)
                        free(stk);
                    stk = nst;
                    cap *= 2;
                }
                stk[ns++] = c;
            }
        }
        free(x->children.s);
        free(x->workers.s);
        if (t->conc)
            pthread_rwlock_destroy(x->lock);
        free(x);
    }
    if (stk != local)
        free(stk);
}

static inline void ref_dec(const struct rtree *t, struct rnode *n)
{
    bool last = t->conc ? __atomic_sub_fetch(&n->refs, 1, __ATOMIC_ACQ_REL) == 0 : --n->refs == 0;
    if (last)
        node_free(t, n);
}

/* Drops every child reference of n and empties its map (capacity kept, as HashMap::clear). */
static void children_clear(const struct rtree *t, struct rnode *n)
{
    if (!n->children.s || !n->children.n)
        return;
    for (uint32_t i = 0; i <= n->children.mask; i++) {
        struct rnode *c = n->children.s[i].v;
        if (c) {
            n->children.s[i].v = NULL;
            ref_dec(t, c);
        }
    }
    n->children.n = 0;
}

static struct rtree *tree_create(bool conc, uint32_t nworkers)
{
    struct rtree *t = xcalloc(1, sizeof(*t));
    t->conc = conc;
    t->nworkers = nworkers;
    t->root = node_new(t, 0, 1);
    t->lookup = xcalloc(nworkers, sizeof(*t->lookup));
    if (conc) {
        t->lk = xmalloc(nworkers * sizeof(*t->lk));
        for (uint32_t w = 0; w < nworkers; w++)
            pthread_rwlock_init(&t->lk[w], NULL);
    }
    t->score = xcalloc(nworkers, sizeof(uint32_t));
    t->act = xmalloc(nworkers * sizeof(uint32_t));
    t->touched = xmalloc(nworkers * sizeof(uint32_t));
    t->hits = xmalloc(nworkers * sizeof(*t->hits));
    return t;
}

static void tree_destroy(struct rtree *t)
{
    for (uint32_t w = 0; w < t->nworkers; w++) {
        struct pmap *m = &t->lookup[w];
        for (uint32_t i = 0; m->s && i <= m->mask; i++)
            if (m->s[i].v)
                ref_dec(t, m->s[i].v);
        free(m->s);
        if (t->conc)
            pthread_rwlock_destroy(&t->lk[w]);
    }
    ref_dec(t, t->root);
    free(t->lookup);
    free(t->lk);
    free(t->score);
    free(t->act);
    free(t->touched);
    free(t->hits);
    free(t);
}

/* Points the worker's lookup entry for h at child (the old entry's reference dropped). */
static inline void lookup_set(const struct rtree *t, struct pmap *lk, uint64_t h,
                              struct rnode *child)
{
    ref_inc(t, child);
    struct rnode *old = pm_put(lk, h, child);
    if (old)
        ref_dec(t, old);
}

/* RadixTree::apply_event(Stored). -ENOENT: parent unknown to the worker (nothing stored);
 * -EINVAL: a block that would be its own parent (Dynamo rejects the rest of the event). */
static int rt_store(struct rtree *t, uint32_t w, const uint64_t *parent,
                    const struct kvr_index_block *b, size_t n)
{
    struct pmap *lk = &t->lookup[w];
    struct rnode *cur = parent ? pm_get(lk, *parent) : t->root;
    if (!cur)
        return -ENOENT;
    for (size_t i = 0; i < n; i++) {
        struct rnode *child = pm_get(&cur->children, b[i].content_hash);
        if (!child) {
            child = pm_get(lk, b[i].engine_hash);
            if (!child)
                child = node_new(t, b[i].engine_hash, 0);
            pm_put(&cur->children, b[i].content_hash, child);
            child->refs++;
        }
        if (child == cur)
            return -EINVAL;
        ws_add(&child->workers, w);
        lookup_set(t, lk, b[i].engine_hash, child);
        cur = child;
    }
    return 0;
}

/* RadixTree::apply_event(Removed); returns the hashes the worker did not have. */
static size_t rt_remove(struct rtree *t, uint32_t w, const uint64_t *h, size_t n)
{
    struct pmap *lk = &t->lookup[w];
    size_t unknown = 0;
    for (size_t i = 0; i < n; i++) {
        struct rnode *node = pm_get(lk, h[i]);
        if (!node) {
            unknown++;
            continue;
        }
        ws_del(&node->workers, w);
        if (!node->workers.n)
            children_clear(t, node); /* no worker has its descendants either */
        pm_del(lk, h[i]);
        ref_dec(t, node);
    }
    return unknown;
}

/* RadixTree::find_matches(early_exit = false): fills t->hits, returns their count.
 * count_shortcut: intersect only where the child's set is smaller than the candidates. */
static size_t rt_find(struct rtree *t, const uint64_t *q, size_t n, bool count_shortcut)
{
    if (!n)
        return 0;
    struct rnode *cur = pm_get(&t->root->children, q[0]);
    if (!cur || !cur->workers.n)
        return 0;
    size_t nh = 0, na = 0;
    for (uint32_t i = 0; i <= cur->workers.mask; i++) /* active = first.workers.clone() */
        if (cur->workers.s[i])
            t->act[na++] = cur->workers.s[i] - 1;
    uint32_t depth = 1;
    for (size_t idx = 1; idx < n; idx++) {
        struct rnode *blk = pm_get(&cur->children, q[idx]);
        if (!blk)
            break;
        if (!count_shortcut || blk->workers.n < na) {
            size_t k = 0;
            for (size_t j = 0; j < na; j++) {
                if (ws_has(&blk->workers, t->act[j]))
                    t->act[k++] = t->act[j];
                else
                    t->hits[nh++] = (struct rhit){t->act[j], depth, 0};
            }
            na = k;
        }
        if (!na)
            break;
        cur = blk;
        depth = (uint32_t)idx + 1;
    }
    for (size_t j = 0; j < na; j++)
        t->hits[nh++] = (struct rhit){t->act[j], depth, 0};
    for (size_t j = 0; j < nh; j++)
        t->hits[j].tree_size = t->lookup[t->hits[j].w].n;
    return nh;
}

/* ConcurrentRadixTree::apply_stored: the worker's lookup guard for the whole event, nodes
 * write-locked hand over hand; `cur` and `child` are counted references (Arc clones). */
static int crt_store(struct rtree *t, uint32_t w, const uint64_t *parent,
                     const struct kvr_index_block *b, size_t n)
{
    struct pmap *lk = &t->lookup[w];
    pthread_rwlock_wrlock(&t->lk[w]);
    struct rnode *cur = parent ? pm_get(lk, *parent) : t->root;
    if (!cur) {
        pthread_rwlock_unlock(&t->lk[w]);
        return -ENOENT;
    }
    ref_inc(t, cur);
    bool needs_worker = false;
    for (size_t i = 0; i < n; i++) {
        struct rnode *child;
        pthread_rwlock_wrlock(cur->lock);
        if (needs_worker) /* the previous block's node, now the parent */
            ws_add(&cur->workers, w);
        needs_worker = true;
        child = pm_get(&cur->children, b[i].content_hash);
        if (child) {
            /* Dynamo checks the block hash is the same for every worker (a read lock) */
            pthread_rwlock_rdlock(child->lock);
            uint64_t bh = child->block_hash;
            pthread_rwlock_unlock(child->lock);
            if (bh != b[i].engine_hash)
                fprintf(stderr, "bench_radix: block hash mismatch at block %zu\n", i);
            ref_inc(t, child);
        } else {
            child = pm_get(lk, b[i].engine_hash);
            if (child)
                ref_inc(t, child);
            else
                child = node_new(t, b[i].engine_hash, 1);
            pm_put(&cur->children, b[i].content_hash, child);
            ref_inc(t, child);
        }
        pthread_rwlock_unlock(cur->lock);
        lookup_set(t, lk, b[i].engine_hash, child);
        ref_dec(t, cur);
        cur = child;
    }
    if (needs_worker) {
        pthread_rwlock_wrlock(cur->lock);
        ws_add(&cur->workers, w);
        pthread_rwlock_unlock(cur->lock);
    }
    ref_dec(t, cur);
    pthread_rwlock_unlock(&t->lk[w]);
    return 0;
}

static size_t crt_remove(struct rtree *t, uint32_t w, const uint64_t *h, size_t n)
{
    struct pmap *lk = &t->lookup[w];
    size_t unknown = 0;
    pthread_rwlock_wrlock(&t->lk[w]);
    for (size_t i = 0; i < n; i++) {
        struct rnode *node = pm_get(lk, h[i]);
        if (!node) {
            unknown++;
            continue;
        }
        ref_inc(t, node);
        pthread_rwlock_wrlock(node->lock);
        ws_del(&node->workers, w);
        if (!node->workers.n)
            children_clear(t, node);
        pthread_rwlock_unlock(node->lock);
        ref_dec(t, pm_del(lk, h[i]));
        ref_dec(t, node);
    }
    pthread_rwlock_unlock(&t->lk[w]);
    return unknown;
}

/* ConcurrentRadixTree::find_matches_impl(early_exit = false). */
static size_t crt_find(struct rtree *t, const uint64_t *q, size_t n)
{
    size_t nt = 0;
    struct rnode *cur = t->root;
    ref_inc(t, cur);
    for (size_t i = 0; i < n; i++) {
        pthread_rwlock_rdlock(cur->lock);
        struct rnode *child = pm_get(&cur->children, q[i]);
        if (child)
            ref_inc(t, child);
        pthread_rwlock_unlock(cur->lock);
        if (!child)
            break;
        pthread_rwlock_rdlock(child->lock);
        const struct wset *ws = &child->workers;
        for (uint32_t j = 0; ws->s && j <= ws->mask; j++) { /* update_scores */
            uint32_t x = ws->s[j];
            if (x && t->score[x - 1]++ == 0)
                t->touched[nt++] = x - 1;
        }
        pthread_rwlock_unlock(child->lock);
        ref_dec(t, cur);
        cur = child;
    }
    ref_dec(t, cur);
    for (size_t j = 0; j < nt; j++) {
        uint32_t w = t->touched[j];
        pthread_rwlock_rdlock(&t->lk[w]);
        uint32_t size = t->lookup[w].n;
        pthread_rwlock_unlock(&t->lk[w]);
        t->hits[j] = (struct rhit){w, t->score[w], size};
        t->score[w] = 0;
    }
    return nt;
}

/* ---- the harness: one interface over the three structures ------------------------------ */

enum kind { K_POS, K_RT, K_CRT, K_RTC, K_N };
static const char *const kname[K_N] = {"positional", "RadixTree", "ConcRadixTree",
                                       "RadixTree+count"};

struct subject {
    enum kind k;
    struct rtree *t;
    struct kvr_index *ix;
    struct kvr_index_reader *rd;
    uint32_t ns;
    uint32_t *wid;  /* worker -> index wid */
    uint32_t *wof;  /* index wid -> worker */
    uint32_t nwof;
};

static void subj_create(struct subject *s, enum kind k, uint32_t nworkers)
{
    memset(s, 0, sizeof(*s));
    s->k = k;
    if (k != K_POS) {
        s->t = tree_create(k == K_CRT, nworkers);
        return;
    }
    struct kvr_index_opts o = {.jump_stride = 32, .max_workers = nworkers};
    if (kvr_index_create(&o, &s->ix) != 0 || kvr_index_reader_create(s->ix, &s->rd) != 0) {
        fprintf(stderr, "bench_radix: cannot create the index\n");
        exit(1);
    }
    kvr_index_ns_intern(s->ix, "bench-model", NULL, &s->ns, NULL);
    s->wid = xmalloc(nworkers * sizeof(uint32_t));
    for (uint32_t w = 0; w < nworkers; w++) {
        char pod[32];
        snprintf(pod, sizeof(pod), "pod-%u", w);
        if (kvr_index_worker_intern(s->ix, pod, 0, &s->wid[w]) != 0) {
            fprintf(stderr, "bench_radix: cannot intern worker %u\n", w);
            exit(1);
        }
    }
    s->nwof = kvr_index_worker_count(s->ix);
    s->wof = xmalloc(s->nwof * sizeof(uint32_t));
    for (uint32_t w = 0; w < nworkers; w++)
        s->wof[s->wid[w]] = w;
}

static void subj_destroy(struct subject *s)
{
    if (s->t)
        tree_destroy(s->t);
    if (s->ix) {
        kvr_index_reader_destroy(s->rd);
        kvr_index_destroy(s->ix);
    }
    free(s->wid);
    free(s->wof);
}

static void subj_store(struct subject *s, uint32_t w, const struct kvr_index_block *b, size_t n)
{
    int rc;
    if (s->k == K_POS) {
        struct kvr_index_wres r = {0};
        rc = kvr_index_store(s->ix, s->wid[w], 0, s->ns, NULL, b, n, &r);
    } else if (s->k == K_CRT) {
        rc = crt_store(s->t, w, NULL, b, n);
    } else {
        rc = rt_store(s->t, w, NULL, b, n);
    }
    if (rc != 0) {
        fprintf(stderr, "bench_radix: %s store failed: %d\n", kname[s->k], rc);
        exit(1);
    }
}

static void subj_remove(struct subject *s, uint32_t w, const uint64_t *h, size_t n)
{
    size_t unknown;
    if (s->k == K_POS) {
        struct kvr_index_wres r = {0};
        kvr_index_remove(s->ix, s->wid[w], 0, h, n, &r);
        unknown = r.unknown_removes;
    } else if (s->k == K_CRT) {
        unknown = crt_remove(s->t, w, h, n);
    } else {
        unknown = rt_remove(s->t, w, h, n);
    }
    if (unknown) {
        fprintf(stderr, "bench_radix: %s: %zu unknown removes\n", kname[s->k], unknown);
        exit(1);
    }
}

/* The find itself, timed by the caller; the answer is read by subj_answer afterwards. */
static size_t subj_find(struct subject *s, const uint64_t *q, size_t n)
{
    if (s->k == K_POS) {
        const struct kvr_index_hit *hits;
        size_t nh = 0;
        if (kvr_index_find(s->rd, s->ns, q, n, NULL, 0, NULL, &hits, &nh) != 0) {
            fprintf(stderr, "bench_radix: positional find failed\n");
            exit(1);
        }
        return nh;
    }
    return s->k == K_CRT ? crt_find(s->t, q, n) : rt_find(s->t, q, n, s->k == K_RTC);
}

/* Writes the last find's answer as matched blocks per worker (0 = none) into out[W]. A
 * tree's answer is its scratch; the positional index's is asked again (the same query on
 * the same index: its hits were borrowed from the reader and are reread, untimed). */
static void subj_answer(struct subject *s, const uint64_t *q, size_t n, size_t nh,
                        uint16_t *out, uint32_t nworkers)
{
    memset(out, 0, nworkers * sizeof(*out));
    if (s->k != K_POS) {
        for (size_t i = 0; i < nh; i++)
            out[s->t->hits[i].w] = (uint16_t)s->t->hits[i].matched;
        return;
    }
    const struct kvr_index_hit *hits;
    size_t n2 = 0;
    if (kvr_index_find(s->rd, s->ns, q, n, NULL, 0, NULL, &hits, &n2) != 0 || n2 != nh) {
        fprintf(stderr, "bench_radix: positional find not repeatable\n");
        exit(1);
    }
    for (size_t j = 0; j < n2; j++)
        out[s->wof[hits[j].wid]] = (uint16_t)hits[j].matched;
}

/* The timed calls go through these, never inlined nor folded together (gcc's identical code
 * folding made cg_remove_tail an alias of cg_remove_head), so that callgrind can count each
 * kind apart (radix.sh with KVR_BENCH_CALLGRIND=1: --toggle-collect on each, one output file
 * per structure's child process). */
#if defined(__clang__)
#define CG_HOOK __attribute__((noinline))
#else
#define CG_HOOK __attribute__((noipa))
#endif
CG_HOOK static void cg_store(struct subject *s, uint32_t w, const struct kvr_index_block *b,
                             size_t n)
{
    subj_store(s, w, b, n);
}
CG_HOOK static void cg_remove_head(struct subject *s, uint32_t w, const uint64_t *h, size_t n)
{
    subj_remove(s, w, h, n);
}
CG_HOOK static void cg_remove_tail(struct subject *s, uint32_t w, const uint64_t *h, size_t n)
{
    subj_remove(s, w, h, n);
}
CG_HOOK static size_t cg_find_hit(struct subject *s, const uint64_t *q, size_t n)
{
    return subj_find(s, q, n);
}
CG_HOOK static size_t cg_find_partial(struct subject *s, const uint64_t *q, size_t n)
{
    return subj_find(s, q, n);
}

/* ---- workload and measurement ----------------------------------------------------------- */

struct workload {
    uint32_t nseq, depth, nworkers, iters, warm;
    struct kvr_index_block *blk; /* nseq x depth */
    uint64_t *rm;                /* nseq x depth: engine hashes in event order */
    uint64_t *rmt;               /* the same, each sequence's tail first (vLLM's order) */
    uint64_t *partial;           /* iters x depth: PARTIAL queries */
    uint64_t *hitq;              /* nseq x depth: content hashes (HIT queries) */
};

static void workload_make(struct workload *wl)
{
    size_t nb = (size_t)wl->nseq * wl->depth;
    wl->blk = xmalloc(nb * sizeof(*wl->blk));
    wl->rm = xmalloc(nb * sizeof(uint64_t));
    wl->rmt = xmalloc(nb * sizeof(uint64_t));
    wl->hitq = xmalloc(nb * sizeof(uint64_t));
    uint32_t plen = (uint32_t)lround(wl->depth * 0.25);
    for (uint32_t s = 0; s < wl->nseq; s++) {
        uint64_t g = rnd() % 4, eh = 0x5eed;
        for (uint32_t i = 0; i < wl->depth; i++) {
            uint64_t local = i < plen ? (0xDEADBEEF00000000ull | (g << 32) | i)
                                      : (((uint64_t)s << 32) | i);
            uint64_t c = mixh(local);
            eh = mixh(eh ^ c);
            size_t at = (size_t)s * wl->depth + i;
            wl->blk[at] = (struct kvr_index_block){eh, c};
            wl->rm[at] = eh;
            wl->rmt[(size_t)s * wl->depth + (wl->depth - 1 - i)] = eh;
            wl->hitq[at] = c;
        }
    }
    wl->partial = xmalloc((size_t)wl->iters * wl->depth * sizeof(uint64_t));
    uint32_t half = wl->depth / 2;
    for (uint32_t i = 0; i < wl->iters; i++) {
        uint32_t s = i % wl->nseq;
        uint64_t *q = &wl->partial[(size_t)i * wl->depth];
        memcpy(q, &wl->hitq[(size_t)s * wl->depth], half * sizeof(uint64_t));
        for (uint32_t j = half; j < wl->depth; j++) /* Dynamo's 0xDEAD0000 | i << 16 | j */
            q[j] = mixh(0xDEAD0000ull | ((uint64_t)i << 16) | (j - half));
    }
}

enum row { R_BUILD, R_STORE, R_REMOVE, R_HIT, R_PARTIAL, R_RMTAIL, R_CONC, R_NROWS };
static const char *const rname[R_NROWS] = {
    "store, from empty (build)", "STORE_BLOCK (churn)",    "REMOVE_BLOCK (churn)",
    "FIND_MATCHES (HIT)",        "FIND_MATCHES (PARTIAL)", "remove, tail first (churn)",
    "HIT, 1 writer churning"};
/* the seed's published figures, µs (the rows it does not have: 0) */
static const double seed_rt[R_NROWS] = {0, 90, 91, 227, 216, 0, 0};
static const double seed_nm[R_NROWS] = {0, 98, 233, 44, 44, 0, 0};

#define MAX_ROUNDS 15
/* results, written by the forked child that measured them (shared memory) */
struct results {
    double p50s[K_N][R_NROWS][MAX_ROUNDS], avgs[K_N][R_NROWS][MAX_ROUNDS];
    double p99s[K_N][R_NROWS][MAX_ROUNDS];
    uint64_t conc_finds[K_N][MAX_ROUNDS], conc_bad[K_N][MAX_ROUNDS];
    double bytes_pair[K_N][MAX_ROUNDS];
    long mismatches;
};
static struct results *res;
#define p50s (res->p50s)
#define avgs (res->avgs)
#define p99s (res->p99s)
#define bytes_pair (res->bytes_pair)
#define mismatches (res->mismatches)

static void *shared_alloc(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "bench_radix: mmap: %s\n", strerror(errno));
        exit(1);
    }
    return p;
}

static double last_p99; /* of the last stats() call */

static void stats(double *v, size_t n, double *p50, double *avg)
{
    double sum = 0;
    if (!n) {
        *p50 = *avg = last_p99 = 0;
        return;
    }
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    qsort(v, n, sizeof(double), cmpd);
    *p50 = v[n / 2];
    *avg = sum / (double)n;
    last_p99 = v[(size_t)((double)n * 0.99)];
}

/* ---- find while a writer churns (the structures that allow it: positional, concurrent) -- */

struct conc {
    struct subject *s;
    const struct workload *wl;
    int stop;
    double *lat;
    size_t nlat, cap;
    uint64_t finds, bad; /* bad: an answer no state of the index could give */
};

static void *conc_reader(void *arg)
{
    struct conc *c = arg;
    uint32_t D = c->wl->depth, W = c->wl->nworkers;
    uint64_t *qb = xmalloc(D * sizeof(uint64_t));
    struct kvr_index_reader *rd = NULL;
    if (c->s->k == K_POS && kvr_index_reader_create(c->s->ix, &rd) != 0) {
        fprintf(stderr, "bench_radix: reader\n");
        exit(1);
    }
    for (uint32_t i = 0; !__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE); i++) {
        memcpy(qb, &c->wl->hitq[(size_t)(i % c->wl->nseq) * D], D * sizeof(*qb));
        const struct kvr_index_hit *hits = NULL;
        size_t nh = 0;
        double t0 = now_us();
        if (rd)
            kvr_index_find(rd, c->s->ns, qb, D, NULL, 0, NULL, &hits, &nh);
        else
            nh = crt_find(c->s->t, qb, D);
        double d = now_us() - t0;
        if (c->nlat < c->cap)
            c->lat[c->nlat++] = d;
        c->finds++;
        if (nh > W)
            c->bad++;
        for (size_t j = 0; j < nh; j++) {
            uint32_t m = rd ? hits[j].matched : c->s->t->hits[j].matched;
            uint32_t w = rd ? c->s->wof[hits[j].wid] : c->s->t->hits[j].w;
            if (m < 1 || m > D || w >= W)
                c->bad++;
        }
    }
    if (rd)
        kvr_index_reader_destroy(rd);
    free(qb);
    return NULL;
}

static double median(double *v, int n)
{
    double c[MAX_ROUNDS];
    memcpy(c, v, (size_t)n * sizeof(double));
    qsort(c, (size_t)n, sizeof(double), cmpd);
    return (n % 2) ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* Compares an answer with the positional index's; prints the first differences. */
static void check(const uint16_t *ref, const uint16_t *got, uint32_t nworkers, enum kind k,
                  const char *what, uint32_t qi)
{
    for (uint32_t w = 0; w < nworkers; w++) {
        if (ref[w] == got[w])
            continue;
        if (mismatches++ < 10)
            fprintf(stderr,
                    "bench_radix: MISMATCH %s query %u, worker %u: positional %u, %s %u\n",
                    what, qi, w, ref[w], kname[k], got[w]);
    }
}

/* One structure through the whole sequence of measurements of one round. ref[] holds the
 * positional answers (filled when k == K_POS, which runs first in every round). */
static void run_one(enum kind k, int round, const struct workload *wl, uint16_t *ref[3])
{
    uint32_t W = wl->nworkers, D = wl->depth;
    /* what a timed call reads is first copied here, untimed, as Dynamo's benchmark clones an
     * event or a query before starting its clock (and our daemon's parsers leave them in
     * cache): the calls are timed, not the first read of an 8-16 MB workload array */
    struct kvr_index_block *bb = xmalloc(D * sizeof(*bb));
    uint16_t *ans = xmalloc(W * sizeof(uint16_t));
    double *lat = xmalloc((wl->iters > wl->nseq ? wl->iters : wl->nseq) * sizeof(double));
    uint64_t *qb = xmalloc(D * sizeof(uint64_t)), *hb = xmalloc(D * sizeof(uint64_t));
    struct subject s;
    size_t h0 = heap_in_use();
    subj_create(&s, k, W);
    struct kvr_index_stats st0, st1;
    if (k == K_POS)
        kvr_index_stats(s.ix, &st0);

    /* build: every sequence stored once, from empty */
    for (uint32_t q = 0; q < wl->nseq; q++) {
        memcpy(bb, &wl->blk[(size_t)q * D], D * sizeof(*bb));
        double t0 = now_us();
        subj_store(&s, q % W, bb, D);
        lat[q] = now_us() - t0;
    }
    stats(lat, wl->nseq, &p50s[k][R_BUILD][round], &avgs[k][R_BUILD][round]);
    if (k == K_POS) {
        kvr_index_stats(s.ix, &st1);
        bytes_pair[k][round] = (double)(st1.bytes - st0.bytes) / (double)st1.holders;
    } else {
        bytes_pair[k][round] = (double)(heap_in_use() - h0) / ((double)wl->nseq * D);
    }

    /* finds on the built index: HIT then PARTIAL, every answer compared */
    for (int kind = 0; kind < 2; kind++) {
        size_t n = 0;
        for (uint32_t i = 0; i < wl->iters; i++) {
            memcpy(qb, kind == 0 ? &wl->hitq[(size_t)(i % wl->nseq) * D]
                                 : &wl->partial[(size_t)i * D], D * sizeof(*qb));
            const uint64_t *q = qb;
            double t0 = now_us();
            size_t nh = kind == 0 ? cg_find_hit(&s, q, D) : cg_find_partial(&s, q, D);
            double d = now_us() - t0;
            if (i >= wl->warm)
                lat[n++] = d;
            uint16_t *dst = k == K_POS ? &ref[kind][(size_t)i * W] : ans;
            subj_answer(&s, q, D, nh, dst, W);
            if (k != K_POS)
                check(&ref[kind][(size_t)i * W], dst, W, k, kind ? "PARTIAL" : "HIT", i);
        }
        enum row r = kind == 0 ? R_HIT : R_PARTIAL;
        stats(lat, n, &p50s[k][r][round], &avgs[k][r][round]);
    }

    /* churn, as Dynamo's bench_store_remove_cycle: store timed, then remove timed; then
     * (not in the seed) remove timed with each sequence's hashes tail first, the order in
     * which vLLM frees a sequence's blocks */
    for (int pass = 0; pass < 3; pass++) {
        int timed_store = pass == 0;
        const uint64_t *rm = pass == 2 ? wl->rmt : wl->rm;
        size_t n = 0;
        for (uint32_t i = 0; i < wl->iters; i++) {
            uint32_t q = i % wl->nseq;
            memcpy(hb, &rm[(size_t)q * D], D * sizeof(*hb));
            memcpy(bb, &wl->blk[(size_t)q * D], D * sizeof(*bb));
            double t0 = now_us(), t1, t2;
            if (pass == 0)
                subj_remove(&s, q % W, hb, D);
            else if (pass == 1)
                cg_remove_head(&s, q % W, hb, D);
            else
                cg_remove_tail(&s, q % W, hb, D);
            t1 = now_us();
            if (pass == 0)
                cg_store(&s, q % W, bb, D);
            else
                subj_store(&s, q % W, bb, D);
            t2 = now_us();
            if (i >= wl->warm)
                lat[n++] = timed_store ? t2 - t1 : t1 - t0;
        }
        enum row r = pass == 0 ? R_STORE : pass == 1 ? R_REMOVE : R_RMTAIL;
        stats(lat, n, &p50s[k][r][round], &avgs[k][r][round]);
    }

    /* one reader thread asking HIT queries while this thread churns (positional and the
     * concurrent tree only): find latency under writes, and the concurrent tree's locking
     * and reference counts exercised for real (answers checked for sanity only: they
     * depend on the moment) */
    if (k == K_POS || k == K_CRT) {
        struct conc c = {.s = &s, .wl = wl, .cap = 1u << 20};
        c.lat = xmalloc(c.cap * sizeof(double));
        pthread_t th;
        if (pthread_create(&th, NULL, conc_reader, &c) != 0) {
            fprintf(stderr, "bench_radix: pthread_create\n");
            exit(1);
        }
        for (uint32_t i = 0; i < wl->iters; i++) {
            uint32_t q = i % wl->nseq;
            subj_remove(&s, q % W, &wl->rm[(size_t)q * D], D);
            subj_store(&s, q % W, &wl->blk[(size_t)q * D], D);
        }
        __atomic_store_n(&c.stop, 1, __ATOMIC_RELEASE);
        pthread_join(th, NULL);
        stats(c.lat, c.nlat, &p50s[k][R_CONC][round], &avgs[k][R_CONC][round]);
        p99s[k][R_CONC][round] = last_p99;
        res->conc_finds[k][round] = c.finds;
        res->conc_bad[k][round] = c.bad;
        if (c.bad) {
            fprintf(stderr, "bench_radix: %s: %llu impossible answers under writes\n",
                    kname[k], (unsigned long long)c.bad);
            mismatches++;
        }
        free(c.lat);
    }

    /* after the churn: every sequence's HIT query again, untimed, compared again */
    for (uint32_t q = 0; q < wl->nseq; q++) {
        const uint64_t *qq = &wl->hitq[(size_t)q * D];
        size_t nh = subj_find(&s, qq, D);
        uint16_t *dst = k == K_POS ? &ref[2][(size_t)q * W] : ans;
        subj_answer(&s, qq, D, nh, dst, W);
        if (k != K_POS)
            check(&ref[2][(size_t)q * W], dst, W, k, "HIT after churn", q);
    }
    subj_destroy(&s);
    free(bb);
    free(qb);
    free(hb);
    free(ans);
    free(lat);
}

/* Each structure is measured in a child process of its own: a fresh heap, as Dynamo's
 * benchmark builds each index in a process of its own. In one process, whichever tree was
 * built right after the positional index was destroyed took 4-8x longer to build (malloc
 * carving the freed memory: _int_malloc and page faults in the profile), whichever it was. */
static void run_forked(enum kind k, int round, const struct workload *wl, uint16_t *ref[3])
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench_radix: fork: %s\n", strerror(errno));
        exit(1);
    }
    if (pid == 0) {
        if (getenv("KVR_RADIX_TAG")) /* radix.sh's callgrind mode: which child is which */
            fprintf(stderr, "bench_radix: child %d runs %s\n", (int)getpid(), kname[k]);
        run_one(k, round, wl, ref);
        exit(0); /* not _exit: a sanitizer build's leak check runs in every child */
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_radix: the %s run failed (status %d)\n", kname[k], st);
        exit(1);
    }
}

int main(void)
{
    uint64_t seed = (uint64_t)envl("KVR_BENCH_SEED", 42);
    rng = seed;
    struct workload wl = {0};
    long size = envl("KVR_RADIX_SIZE", 1000000);
    wl.depth = (uint32_t)envl("KVR_RADIX_DEPTH", 1024);
    wl.nworkers = (uint32_t)envl("KVR_RADIX_WORKERS", 128);
    wl.iters = (uint32_t)envl("KVR_RADIX_ITERS", 1000);
    int rounds = (int)envl("KVR_RADIX_ROUNDS", 3);
    bool count = envl("KVR_RADIX_COUNT", 1) != 0;
    if (wl.depth < 2 || wl.depth > 65535 || size / wl.depth < 1 || wl.nworkers < 1 ||
        wl.iters < 10 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_radix: bad shape\n");
        return 2;
    }
    wl.nseq = (uint32_t)(size / wl.depth);
    wl.warm = wl.iters / 10;
    workload_make(&wl);
    printf("seed workload (Dynamo's radix_tree_microbench --size %ld --depth %u --num-workers "
           "%u): %u sequences x %u blocks, worker = seq %% %u, first %ld blocks from 4 prefix "
           "groups; %u iterations per operation (first %u discarded); %d rounds; seed %llu\n",
           size, wl.depth, wl.nworkers, wl.nseq, wl.depth, wl.nworkers,
           lround(wl.depth * 0.25), wl.iters, wl.warm, rounds, (unsigned long long)seed);

    uint32_t W = wl.nworkers;
    size_t nref = (size_t)(wl.iters > wl.nseq ? wl.iters : wl.nseq) * W;
    res = shared_alloc(sizeof(*res));
    uint16_t *ref[3] = {shared_alloc(nref * sizeof(uint16_t)), shared_alloc(nref * sizeof(uint16_t)),
                        shared_alloc(nref * sizeof(uint16_t))};
    enum kind order[K_N] = {K_RT, K_CRT, K_RTC};
    int nk = count ? 3 : 2;
    for (int r = 0; r < rounds; r++) {
        /* the positional index first (its answers are the reference), then the trees in an
         * order rotated every round */
        for (int j = -1; j < nk; j++)
            run_forked(j < 0 ? K_POS : order[(j + r) % nk], r, &wl, ref);
        printf("  round %d: HIT p50 positional %.2f, RadixTree %.1f, ConcRadixTree %.1f µs\n",
               r + 1, p50s[K_POS][R_HIT][r], p50s[K_RT][R_HIT][r], p50s[K_CRT][R_HIT][r]);
        fflush(stdout);
    }

    enum kind cols[K_N] = {K_RT, K_CRT, K_POS, K_RTC};
    int ncols = count ? 4 : 3;
    printf("\nµs per %u-block operation, median over %d rounds of each round's p50 (avg in "
           "brackets)\n",
           wl.depth, rounds);
    printf("%-27s", "operation");
    for (int c = 0; c < ncols; c++)
        printf(" %19s", kname[cols[c]]);
    printf(" | %8s %9s | %11s %11s\n", "seed RT", "seed NMap", "RT/pos here", "RT/NMap seed");
    for (int r = 0; r < R_NROWS; r++) {
        printf("%-27s", rname[r]);
        double m[K_N];
        for (int c = 0; c < ncols; c++) {
            enum kind k = cols[c];
            m[k] = median(p50s[k][r], rounds);
            char cell[40];
            snprintf(cell, sizeof(cell), "%.2f (%.1f)", m[k], median(avgs[k][r], rounds));
            printf(" %19s", r == R_CONC && k != K_POS && k != K_CRT ? "-" : cell);
        }
        if (r == R_CONC)
            printf(" | %8s %9s | %11s %11s\n", "-", "-", "-", "-");
        else if (seed_rt[r] > 0)
            printf(" | %8.0f %9.0f | %10.2fx %10.2fx\n", seed_rt[r], seed_nm[r],
                   m[K_RT] / m[K_POS], seed_rt[r] / seed_nm[r]);
        else
            printf(" | %8s %9s | %10.2fx %11s\n", "-", "-", m[K_RT] / m[K_POS], "-");
    }
    printf("%-27s", "bytes per (worker, block)");
    for (int c = 0; c < ncols; c++)
        printf(" %19.1f", median(bytes_pair[cols[c]], rounds));
    printf("\n(positional: the index's own figure after the build; trees: malloc's bytes in "
           "use, after the build)\n");
    printf("ConcRadixTree/positional here: store %.2fx, remove %.2fx, find hit %.2fx, "
           "partial %.2fx\n",
           median(p50s[K_CRT][R_STORE], rounds) / median(p50s[K_POS][R_STORE], rounds),
           median(p50s[K_CRT][R_REMOVE], rounds) / median(p50s[K_POS][R_REMOVE], rounds),
           median(p50s[K_CRT][R_HIT], rounds) / median(p50s[K_POS][R_HIT], rounds),
           median(p50s[K_CRT][R_PARTIAL], rounds) / median(p50s[K_POS][R_PARTIAL], rounds));
    printf("HIT while 1 writer churns (%u remove + store cycles), median p99: positional %.2f, "
           "ConcRadixTree %.1f µs; finds done: %llu and %llu in round 1\n",
           wl.iters, median(p99s[K_POS][R_CONC], rounds), median(p99s[K_CRT][R_CONC], rounds),
           (unsigned long long)res->conc_finds[K_POS][0],
           (unsigned long long)res->conc_finds[K_CRT][0]);
    printf("answers compared with the positional index: %u HIT + %u PARTIAL + %u after the "
           "churn per tree per round: %ld differences\n",
           wl.iters, wl.iters, wl.nseq, mismatches);
    bool failed = mismatches != 0;
    munmap(ref[0], nref * sizeof(uint16_t));
    munmap(ref[1], nref * sizeof(uint16_t));
    munmap(ref[2], nref * sizeof(uint16_t));
    munmap(res, sizeof(*res));
    free(wl.blk);
    free(wl.rm);
    free(wl.rmt);
    free(wl.hitq);
    free(wl.partial);
    if (failed) {
        fprintf(stderr, "bench_radix: FAILED: answers differ from the positional index\n");
        return 1;
    }
    return 0;
}
