/* bench_index.c — positional index benchmark.
 *
 * 1. Dynamo's microbenchmark shape (single thread): S sequences x B blocks, W workers
 *    (worker = sequence % W), 25% shared prefix drawn from 4 prefix groups, jump 32. Per
 *    B-block operation, avg / p50 / p99 in µs: store, remove, find full hit, find half hit +
 *    half miss, find miss at block 0; plus bytes per (holder, block), reverse maps included.
 *    Run for W = 128 (976 x 1024) and W = 4096 (one 1024-block sequence per worker).
 *    Store and remove from empty include the growth of every table and reverse map (the
 *    peers' figures do too); "steady state" then churns up to 512 sequences (remove one,
 *    store it again) in the full index, whose tables no longer grow, as in a running fleet
 *    whose caches are full; bytes per pair are printed again after the churn (the same
 *    contents: memory should not have grown).
 * 2. Concurrent: one writer thread applies the event stream of the Mooncake synthetic trace
 *    (each hash_id -> 512 deterministic token ids, 16-token blocks, 256 workers, each an
 *    LRU cache of 16,384 blocks whose evictions become removes) while one reader runs the
 *    trace's queries. Block operations per second and find p50/p99. Workers are assigned
 *    by hash of the first block (prefix-aware routing: many cache hits) and round-robin
 *    (few hits, LRU evictions). The trace is replayed in passes (KVR_TRACE_PASSES, default
 *    4): pass 1 grows the index from empty, later passes replay it as new prompts with the
 *    same sharing structure while the LRUs carry on, so the caches fill and evict (the
 *    steady state of a running fleet; round-robin is full from pass 2, by hash by pass 4).
 *    Each pass is reported with the writer thread's user and system CPU time (system time
 *    is the kernel clearing the pages the index touches first). As in the daemon, an
 *    event's blocks and a query's hashes are in cache when the index gets them (copied to
 *    a buffer first, untimed): only index calls are timed. The reader runs the queries of
 *    the pass being written.
 *
 * Environment: KVR_BENCH_SEQS, KVR_BENCH_BLOCKS, KVR_BENCH_WORKERS (shape 1, default 976 /
 * 1024 / 128), KVR_BENCH_BIG_WORKERS (default 4096, 0 = skip), KVR_BENCH_QUERIES (finds per
 * kind, default 2000), KVR_TRACE (trace path; default ../shared/traces/synthetic_trace.jsonl
 * from the repository root, "" = skip), KVR_TRACE_REQUESTS (limit), KVR_TRACE_PASSES,
 * KVR_TRACE_ASSIGN (hash or rr; default both), KVR_TRACE_ROUNDS (1 = the writer alone only,
 * default 2), KVR_BENCH_SEED, KVR_BENCH_STRIDE (shape 1 jump_stride, default 32).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_common.h"
#include "index/hash.h"
#include "index/index.h"
#include "index/index_int.h" /* trace_diag only: the tables' and maps' shape after each pass */

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench_index: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void report(const char *name, double *v, size_t n)
{
    if (n == 0)
        return;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    qsort(v, n, sizeof(double), cmpd);
    printf("  %-34s avg %8.2f  p50 %8.2f  p99 %8.2f  us  (n=%zu)\n", name, sum / (double)n,
           v[n / 2], v[(size_t)((double)n * 0.99)], n);
}

/* ---- 1. microbenchmark shape ---------------------------------------------------------- */

/* The steady-state calls, out of line so that callgrind can collect them alone
 * (--toggle-collect=churn_store / churn_remove: the churn's instructions and misses without
 * the stores from empty). */
static __attribute__((noinline)) void churn_store(struct kvr_index *ix, uint32_t wid, uint32_t ns,
                                                  const struct kvr_index_block *b, size_t n,
                                                  struct kvr_index_wres *r)
{
    kvr_index_store(ix, wid, 0, ns, NULL, b, n, r);
}

static __attribute__((noinline)) void churn_remove(struct kvr_index *ix, uint32_t wid,
                                                   const uint64_t *h, size_t n,
                                                   struct kvr_index_wres *r)
{
    kvr_index_remove(ix, wid, 0, h, n, r);
}

static void shape(uint32_t nseq, uint32_t nblk, uint32_t nworkers, uint32_t nq)
{
    printf("shape: %u sequences x %u blocks, %u workers (worker = seq %% %u), 25%% shared "
           "prefix from 4 groups, jump 32\n",
           nseq, nblk, nworkers, nworkers);
    uint32_t npre = nblk / 4;
    uint64_t *pre = xmalloc((size_t)4 * npre * sizeof(uint64_t));
    for (size_t i = 0; i < (size_t)4 * npre; i++)
        pre[i] = rnd();
    struct kvr_index_block *blk = xmalloc((size_t)nseq * nblk * sizeof(*blk));
    uint64_t *cont = xmalloc((size_t)nseq * nblk * sizeof(uint64_t));
    for (uint32_t s = 0; s < nseq; s++) {
        uint32_t g = (uint32_t)(rnd() % 4);
        uint64_t eh = 0x5eed;
        for (uint32_t i = 0; i < nblk; i++) {
            uint64_t c = i < npre ? pre[(size_t)g * npre + i] : rnd();
            eh = mixh(eh ^ c);
            cont[(size_t)s * nblk + i] = c;
            blk[(size_t)s * nblk + i] = (struct kvr_index_block){eh, c};
        }
    }
    struct kvr_index *ix;
    struct kvr_index_opts o = {.jump_stride = (uint32_t)envl("KVR_BENCH_STRIDE", 32),
                               .max_workers = nworkers};
    if (kvr_index_create(&o, &ix) != 0)
        exit(1);
    struct kvr_index_reader *rd;
    kvr_index_reader_create(ix, &rd);
    uint32_t ns;
    kvr_index_ns_intern(ix, "bench-model", NULL, &ns, NULL);
    uint32_t *wid = xmalloc(nworkers * sizeof(uint32_t));
    for (uint32_t w = 0; w < nworkers; w++) {
        char pod[32];
        snprintf(pod, sizeof(pod), "pod-%u", w);
        kvr_index_worker_intern(ix, pod, 0, &wid[w]);
    }
    struct kvr_index_stats st0, st1;
    kvr_index_stats(ix, &st0);

    double *lat = xmalloc((size_t)(nseq > nq ? nseq : nq) * sizeof(double));
    for (uint32_t s = 0; s < nseq; s++) {
        struct kvr_index_wres r = {0};
        double t0 = now_us();
        kvr_index_store(ix, wid[s % nworkers], 0, ns, NULL, &blk[(size_t)s * nblk], nblk, &r);
        lat[s] = now_us() - t0;
    }
    report("store (per sequence, from empty)", lat, nseq);
    kvr_index_stats(ix, &st1);
    printf("  memory: %llu entries, %llu (holder, block) pairs, %.1f bytes per pair "
           "(%.1f MB in use, %.1f MB before the stores)\n",
           (unsigned long long)st1.entries, (unsigned long long)st1.holders,
           (double)(st1.bytes - st0.bytes) / (double)st1.holders, (double)st1.bytes / 1e6,
           (double)st0.bytes / 1e6);

    uint64_t *q = xmalloc((size_t)nblk * sizeof(uint64_t));
    const struct kvr_index_hit *hits;
    size_t nh;
    uint64_t hits_total = 0;
    const char *names[3] = {"find full hit", "find half hit + half miss", "find miss at block 0"};
    for (int kind = 0; kind < 3; kind++) {
        hits_total = 0;
        for (uint32_t i = 0; i < nq; i++) {
            uint32_t s = (uint32_t)(rnd() % nseq);
            for (uint32_t b = 0; b < nblk; b++)
                q[b] = (kind == 0 || (kind == 1 && b < nblk / 2)) ? cont[(size_t)s * nblk + b]
                                                                   : rnd();
            double t0 = now_us();
            kvr_index_find(rd, ns, q, nblk, NULL, 0, NULL, &hits, &nh);
            lat[i] = now_us() - t0;
            hits_total += nh;
        }
        char nm[64];
        snprintf(nm, sizeof(nm), "%s (%.1f hits)", names[kind], (double)hits_total / nq);
        report(nm, lat, nq);
    }

    /* steady state: the index stays at its size while sequences churn (a full engine cache
     * evicts one and stores another), so the tables and reverse maps do not grow: each op
     * removes one sequence (tail first) and stores it again */
    uint64_t *h = xmalloc((size_t)nblk * sizeof(uint64_t));
    uint32_t nch = nseq < 512 ? nseq : 512;
    double *lat2 = xmalloc((size_t)nch * sizeof(double));
    for (uint32_t k = 0; k < nch; k++) {
        uint32_t s = (uint32_t)(((uint64_t)k * 7919) % nseq);
        struct kvr_index_wres r = {0};
        for (uint32_t b = 0; b < nblk; b++)
            h[b] = blk[(size_t)s * nblk + (nblk - 1 - b)].engine_hash;
        double t0 = now_us();
        churn_remove(ix, wid[s % nworkers], h, nblk, &r);
        double t1 = now_us();
        churn_store(ix, wid[s % nworkers], ns, &blk[(size_t)s * nblk], nblk, &r);
        lat2[k] = now_us() - t1;
        lat[k] = t1 - t0;
    }
    kvr_index_stats(ix, &st1);
    printf("  memory after the churn: %.1f bytes per pair (%.1f MB in use)\n",
           (double)(st1.bytes - st0.bytes) / (double)st1.holders, (double)st1.bytes / 1e6);
    report("store, steady state (churn)", lat2, nch);
    report("remove, steady state (churn)", lat, nch);
    free(lat2);

    /* remove: every sequence, its blocks tail first (like vLLM's eviction order) */
    for (uint32_t s = 0; s < nseq; s++) {
        for (uint32_t b = 0; b < nblk; b++)
            h[b] = blk[(size_t)s * nblk + (nblk - 1 - b)].engine_hash;
        struct kvr_index_wres r = {0};
        double t0 = now_us();
        kvr_index_remove(ix, wid[s % nworkers], 0, h, nblk, &r);
        lat[s] = now_us() - t0;
    }
    report("remove (per sequence, to empty)", lat, nseq);
    kvr_index_stats(ix, &st1);
    printf("  after removing everything: %llu entries, %.1f MB in use\n",
           (unsigned long long)st1.entries, (double)st1.bytes / 1e6);
    kvr_index_reader_destroy(rd);
    kvr_index_destroy(ix);
    free(h);
    free(q);
    free(lat);
    free(wid);
    free(blk);
    free(cont);
    free(pre);
}

/* ---- 2. Mooncake trace, concurrent ------------------------------------------------------ */

#define TR_WORKERS 256
#define TR_CAP 16384
#define TR_BS 16
#define TR_PER_ID (512 / TR_BS)
#define TR_MAX_PASSES 16

struct ev {
    uint32_t worker;
    uint32_t store; /* 1 store, 0 remove */
    uint32_t has_parent;
    uint32_t n;
    uint64_t parent;
    size_t off; /* into evb (blocks) or evh (hashes) */
};

/* growable arrays */
static struct ev *evs;
static size_t nev, cev;
static struct kvr_index_block *evb;
static size_t nevb, cevb;
static uint64_t *evh;
static size_t nevh, cevh;

static void *grow(void *p, size_t *cap, size_t need, size_t el)
{
    if (need <= *cap)
        return p;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need)
        nc *= 2;
    p = realloc(p, nc * el);
    if (!p) {
        fprintf(stderr, "bench_index: out of memory\n");
        exit(1);
    }
    *cap = nc;
    return p;
}

/* per-worker LRU of blocks (by engine hash) */
struct lru_node {
    uint64_t eh;
    uint32_t prev, next; /* indices, UINT32_MAX = none */
};
struct lru {
    struct lru_node *nodes; /* TR_CAP + 1 */
    uint32_t *free_list, nfree;
    uint32_t head, tail, n; /* head = most recent */
    uint64_t *keys;         /* open addressing eh -> node index + 1 */
    uint32_t *vals;
    uint32_t mask;
};
static void lru_init(struct lru *l)
{
    l->nodes = xmalloc((TR_CAP + 1) * sizeof(*l->nodes));
    l->free_list = xmalloc((TR_CAP + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i <= TR_CAP; i++)
        l->free_list[i] = TR_CAP - i;
    l->nfree = TR_CAP + 1;
    l->head = l->tail = UINT32_MAX;
    l->n = 0;
    l->mask = 65535;
    l->keys = calloc(l->mask + 1, sizeof(uint64_t));
    l->vals = calloc(l->mask + 1, sizeof(uint32_t));
}
static uint32_t *lru_slot(struct lru *l, uint64_t eh, int *found)
{
    uint32_t i = (uint32_t)mixh(eh) & l->mask;
    while (l->vals[i]) {
        if (l->keys[i] == eh) {
            *found = 1;
            return &l->vals[i];
        }
        i = (i + 1) & l->mask;
    }
    *found = 0;
    l->keys[i] = eh;
    return &l->vals[i];
}
static void lru_map_del(struct lru *l, uint64_t eh)
{
    uint32_t i = (uint32_t)mixh(eh) & l->mask;
    while (l->keys[i] != eh || !l->vals[i])
        i = (i + 1) & l->mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & l->mask;
        if (!l->vals[j])
            break;
        uint32_t k = (uint32_t)mixh(l->keys[j]) & l->mask;
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            l->keys[i] = l->keys[j];
            l->vals[i] = l->vals[j];
            i = j;
        }
    }
    l->vals[i] = 0;
}
static void lru_unlink(struct lru *l, uint32_t x)
{
    struct lru_node *n = &l->nodes[x];
    if (n->prev != UINT32_MAX)
        l->nodes[n->prev].next = n->next;
    else
        l->head = n->next;
    if (n->next != UINT32_MAX)
        l->nodes[n->next].prev = n->prev;
    else
        l->tail = n->prev;
}
static void lru_push_front(struct lru *l, uint32_t x)
{
    l->nodes[x].prev = UINT32_MAX;
    l->nodes[x].next = l->head;
    if (l->head != UINT32_MAX)
        l->nodes[l->head].prev = x;
    l->head = x;
    if (l->tail == UINT32_MAX)
        l->tail = x;
}
static int lru_has(struct lru *l, uint64_t eh)
{
    uint32_t i = (uint32_t)mixh(eh) & l->mask;
    while (l->vals[i]) {
        if (l->keys[i] == eh)
            return 1;
        i = (i + 1) & l->mask;
    }
    return 0;
}
/* makes eh the most recent (inserting it) */
static void lru_touch(struct lru *l, uint64_t eh)
{
    int found;
    uint32_t *v = lru_slot(l, eh, &found);
    if (found) {
        lru_unlink(l, *v - 1);
        lru_push_front(l, *v - 1);
        return;
    }
    uint32_t x = l->free_list[--l->nfree];
    l->nodes[x].eh = eh;
    *v = x + 1;
    lru_push_front(l, x);
    l->n++;
}
static uint64_t lru_evict(struct lru *l)
{
    uint32_t x = l->tail;
    uint64_t eh = l->nodes[x].eh;
    lru_unlink(l, x);
    lru_map_del(l, eh);
    l->free_list[l->nfree++] = x;
    l->n--;
    return eh;
}

struct idmap { /* hash_id -> its 32 content hashes */
    uint64_t *keys;
    uint64_t (*vals)[TR_PER_ID];
    uint8_t *used;
    size_t mask;
};

static uint64_t *content_of(struct idmap *m, uint64_t id, uint64_t seed)
{
    size_t i = (size_t)mixh(id + 1) & m->mask;
    while (m->used[i]) {
        if (m->keys[i] == id)
            return m->vals[i];
        i = (i + 1) & m->mask;
    }
    m->used[i] = 1;
    m->keys[i] = id;
    uint32_t tok[512];
    for (int j = 0; j < 512; j++)
        tok[j] = (uint32_t)(mixh(id * 512 + (uint64_t)j) % 128000);
    kvr_hash_blocks(seed, tok, TR_PER_ID, TR_BS, m->vals[i]);
    return m->vals[i];
}

struct query {
    size_t off;
    uint32_t n;
};

struct trace_run {
    struct kvr_index *ix;
    int diag; /* KVR_TRACE_DIAG */
    uint32_t ns;
    uint32_t wid[TR_WORKERS];
    uint64_t *qc; /* query contents */
    struct query *qs;
    size_t nq;
    uint32_t qmax; /* the longest query's blocks */
    volatile int done;
    double *lat;
    size_t nlat, clat;
    uint64_t block_ops;
    double writer_us, writer_cpu_us;
    /* per pass: first event, and what the writer measured */
    size_t pass_ev[TR_MAX_PASSES + 1];
    int npass;
    size_t pass_q[TR_MAX_PASSES + 1]; /* first query of each pass */
    int cur_pass;                     /* the pass the writer is applying */
    uint8_t *latp;                    /* the pass of each latency */
    struct kvr_index_block *bbuf; /* one event's blocks, hashes */
    uint64_t *hbuf;
    uint64_t pass_ops[TR_MAX_PASSES];
    double pass_us[TR_MAX_PASSES], pass_user_us[TR_MAX_PASSES], pass_sys_us[TR_MAX_PASSES];
};

static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void thread_times(double *user_us, double *sys_us)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    *user_us = (double)ru.ru_utime.tv_sec * 1e6 + (double)ru.ru_utime.tv_usec;
    *sys_us = (double)ru.ru_stime.tv_sec * 1e6 + (double)ru.ru_stime.tv_usec;
}


/* KVR_TRACE_DIAG=1: after each pass, the shape of the index's tables (a diagnosis aid for
 * the long-run decline, docs/index.md: trace): shard tables' capacity, live entries and
 * tombstones and the mean distance of a live entry from its home; the same for the reverse
 * maps; node chunks and their live nodes. Reads writer-private state: only between passes,
 * with the writer between calls. */
static void trace_diag(struct kvr_index *ix, int pass)
{
    uint64_t tcap = 0, tlive = 0, ttomb = 0, tdist = 0;
    for (uint32_t k = 0; k < NSHARD; k++) {
        struct table *t = ix->sh[k].tab;
        if (t == NULL)
            continue;
        tcap += t->mask + 1;
        for (uint64_t i = 0; i <= t->mask; i++) {
            uint64_t v = t->slot[i];
            if (v == SLOT_TOMB)
                ttomb++;
            else if (v != 0) {
                struct node *x = (struct node *)(uintptr_t)(v & PTR_MASK);
                uint64_t home = key_hash(x->chain) >> t->shift;
                tlive++;
                tdist += (i - home) & t->mask;
            }
        }
    }
    uint64_t rcap = 0, rn = 0, rtomb = 0, rdist = 0;
    for (uint32_t w = 0; w < ix->nworkers; w++) {
        struct worker *wk = ix->workers[w];
        if (wk == NULL || wk->h[0] == NULL || wk->h[0]->recs.s == NULL)
            continue;
        struct recmap *m = &wk->h[0]->recs;
        rcap += m->cap;
        for (uint32_t i = 0; i < m->cap; i++) {
            if (m->s[i].nc == REC_TOMB)
                rtomb++;
            else if (m->s[i].nc != 0) {
                uint32_t home = rec_home(m, m->s[i].key);
                rn++;
                rdist += i >= home ? i - home : i + m->cap - home;
            }
        }
    }
    uint64_t chunks = 0, cl = 0;
    for (struct nchunk *c = ix->slab.all; c != NULL; c = c->anext)
        chunks++, cl += c->live;
    printf("    diag %d: shards %.2fM slots, %.2fM live, %.2fM tomb, dist %.2f | recmaps "
           "%.2fM slots, %.2fM live, %.2fM tomb, dist %.2f | %llu chunks, %.0f%% live\n",
           pass + 1, tcap / 1e6, tlive / 1e6, ttomb / 1e6, tlive ? (double)tdist / tlive : 0,
           rcap / 1e6, rn / 1e6, rtomb / 1e6, rn ? (double)rdist / rn : 0,
           (unsigned long long)chunks, chunks ? 100.0 * cl / ((double)chunks * NCHUNK_NODES) : 0);
}

static void *trace_writer(void *arg)
{
    struct trace_run *t = arg;
    uint64_t ops = 0;
    double t0 = now_us(), c0 = cpu_us();
    for (int p = 0; p < t->npass; p++) {
        __atomic_store_n(&t->cur_pass, p, __ATOMIC_RELAXED);
        uint64_t pops = 0;
        double u0, s0, u1, s1;
        thread_times(&u0, &s0);
        double in_calls = 0;
        for (size_t i = t->pass_ev[p]; i < t->pass_ev[p + 1]; i++) {
            struct ev *e = &evs[i];
            struct kvr_index_wres r = {0};
            /* the event's blocks are first copied to a buffer, as the decoder leaves them
             * (in cache); only the index call is timed */
            double e0;
            if (e->store) {
                memcpy(t->bbuf, &evb[e->off], e->n * sizeof(*t->bbuf));
                e0 = now_us();
                kvr_index_store(t->ix, t->wid[e->worker], 0, t->ns,
                                e->has_parent ? &e->parent : NULL, t->bbuf, e->n, &r);
            } else {
                memcpy(t->hbuf, &evh[e->off], e->n * sizeof(*t->hbuf));
                e0 = now_us();
                kvr_index_remove(t->ix, t->wid[e->worker], 0, t->hbuf, e->n, &r);
            }
            in_calls += now_us() - e0;
            pops += e->n;
        }
        thread_times(&u1, &s1);
        t->pass_us[p] = in_calls;
        t->pass_user_us[p] = u1 - u0;
        t->pass_sys_us[p] = s1 - s0;
        t->pass_ops[p] = pops;
        ops += pops;
        if (t->diag)
            trace_diag(t->ix, p);
    }
    t->writer_us = now_us() - t0;
    t->writer_cpu_us = cpu_us() - c0;
    t->block_ops = ops;
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void *trace_reader(void *arg)
{
    struct trace_run *t = arg;
    struct kvr_index_reader *rd;
    kvr_index_reader_create(t->ix, &rd);
    const struct kvr_index_hit *hits;
    size_t nh;
    /* the queries of the pass the writer is applying, in turn: they ask for what is being
     * stored now, as a gateway's would; each is first copied to a buffer, as the daemon's
     * request parser leaves it (in cache), and only the find is timed */
    uint64_t *qb = xmalloc(t->qmax * sizeof(*qb));
    size_t i = 0;
    while (!__atomic_load_n(&t->done, __ATOMIC_ACQUIRE)) {
        int p = __atomic_load_n(&t->cur_pass, __ATOMIC_RELAXED);
        if (i < t->pass_q[p] || i >= t->pass_q[p + 1])
            i = t->pass_q[p];
        struct query *q = &t->qs[i++];
        memcpy(qb, &t->qc[q->off], q->n * sizeof(*qb));
        double t0 = now_us();
        kvr_index_find(rd, t->ns, qb, q->n, NULL, 0, NULL, &hits, &nh);
        double d = now_us() - t0;
        if (t->nlat < t->clat) {
            t->latp[t->nlat] = (uint8_t)p;
            t->lat[t->nlat++] = d;
        }
    }
    free(qb);
    kvr_index_reader_destroy(rd);
    return NULL;
}

static int trace(const char *path, long limit, int by_hash)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("trace: %s: %s (skipped; set KVR_TRACE)\n", path, strerror(errno));
        return 0;
    }
    struct trace_run t = {0};
    nev = nevb = nevh = 0;
    struct kvr_index_opts o = {.jump_stride = 32, .max_workers = TR_WORKERS};
    kvr_index_create(&o, &t.ix);
    uint64_t seed;
    kvr_index_ns_intern(t.ix, "mooncake", NULL, &t.ns, &seed);
    for (uint32_t w = 0; w < TR_WORKERS; w++) {
        char pod[32];
        snprintf(pod, sizeof(pod), "pod-%u", w);
        kvr_index_worker_intern(t.ix, pod, 0, &t.wid[w]);
    }
    struct idmap im;
    im.mask = (1u << 20) - 1;
    im.keys = xmalloc((im.mask + 1) * sizeof(uint64_t));
    im.vals = xmalloc((im.mask + 1) * sizeof(*im.vals));
    im.used = calloc(im.mask + 1, 1);
    struct lru *lru = xmalloc(TR_WORKERS * sizeof(*lru));
    for (int w = 0; w < TR_WORKERS; w++)
        lru_init(&lru[w]);

    size_t cq = 0, cqc = 0, nqc = 0;
    char *line = NULL;
    size_t lcap = 0;
    uint64_t *ids = NULL;
    size_t cids = 0;
    uint64_t *bc = NULL, *beh = NULL;
    size_t cbc = 0, cbeh = 0;
    /* the trace's requests: hash_ids and block counts */
    struct treq {
        size_t off;
        uint32_t nid, nb;
    } *rq = NULL;
    size_t nrq = 0, crq = 0, nids = 0;
    while (getline(&line, &lcap, f) > 0 && (limit <= 0 || (long)nrq < limit)) {
        char *p = strstr(line, "\"input_length\"");
        char *hp = strstr(line, "\"hash_ids\"");
        if (!p || !hp)
            continue;
        long in_len = strtol(strchr(p, ':') + 1, NULL, 10);
        hp = strchr(hp, '[') + 1;
        size_t nid = 0;
        while (*hp && *hp != ']') {
            char *e;
            unsigned long long v = strtoull(hp, &e, 10);
            if (e == hp)
                break;
            ids = grow(ids, &cids, nids + nid + 1, sizeof(*ids));
            ids[nids + nid++] = v;
            hp = e;
            while (*hp == ',' || *hp == ' ')
                hp++;
        }
        uint32_t nb = (uint32_t)(in_len / TR_BS);
        if (nb > nid * TR_PER_ID)
            nb = (uint32_t)(nid * TR_PER_ID);
        if (nb == 0)
            continue;
        rq = grow(rq, &crq, nrq + 1, sizeof(*rq));
        rq[nrq++] = (struct treq){nids, (uint32_t)nid, nb};
        nids += nid;
    }
    /* passes: the first from an empty index; each later one replays the trace as new
     * prompts with the same sharing structure (its content hashes are the first pass's
     * remixed with the pass number) while the LRUs carry on, so the caches fill and their
     * evictions turn into removes: the steady state of a running fleet. */
    t.npass = (int)envl("KVR_TRACE_PASSES", 4);
    t.diag = (int)envl("KVR_TRACE_DIAG", 0);
    if (t.npass < 1)
        t.npass = 1;
    if (t.npass > TR_MAX_PASSES)
        t.npass = TR_MAX_PASSES;
    uint64_t requests = 0, blocks_req = 0, hit_blocks = 0;
    size_t last_q0 = 0;
    for (int pass = 0; pass < t.npass; pass++) {
        t.pass_ev[pass] = nev;
        t.pass_q[pass] = last_q0 = t.nq;
        uint64_t remix = (uint64_t)pass * 0x9e3779b97f4a7c15ull;
        for (size_t ri = 0; ri < nrq; ri++) {
            const uint64_t *rid = &ids[rq[ri].off];
            uint32_t nb = rq[ri].nb;
            bc = grow(bc, &cbc, nb, sizeof(*bc));
            beh = grow(beh, &cbeh, nb, sizeof(*beh));
            uint64_t eh = 0x5eed;
            for (uint32_t b = 0; b < nb; b++) {
                bc[b] = content_of(&im, rid[b / TR_PER_ID], seed)[b % TR_PER_ID];
                if (pass)
                    bc[b] = mixh(bc[b] ^ remix);
                beh[b] = eh = mixh(eh ^ bc[b]);
            }
            /* query */
            t.qs = grow(t.qs, &cq, t.nq + 1, sizeof(*t.qs));
            t.qc = grow(t.qc, &cqc, nqc + nb, sizeof(*t.qc));
            memcpy(&t.qc[nqc], bc, nb * sizeof(uint64_t));
            t.qs[t.nq++] = (struct query){nqc, nb};
            if (nb > t.qmax)
                t.qmax = nb;
            nqc += nb;
            /* worker by hash of the first hash_id (requests sharing a prefix meet on one
             * worker, as a prefix-aware router would send them); its cache: runs of missing
             * blocks become store events */
            uint32_t w = by_hash ? (uint32_t)(mixh(rid[0] + 0x77 + remix) % TR_WORKERS)
                                 : (uint32_t)(requests % TR_WORKERS);
            struct lru *l = &lru[w];
            for (uint32_t b = 0; b < nb;) {
                if (lru_has(l, beh[b])) {
                    hit_blocks++;
                    b++;
                    continue;
                }
                uint32_t e2 = b;
                while (e2 < nb && !lru_has(l, beh[e2]))
                    e2++;
                evs = grow(evs, &cev, nev + 1, sizeof(*evs));
                evb = grow(evb, &cevb, nevb + (e2 - b), sizeof(*evb));
                evs[nev++] = (struct ev){w, 1, b > 0, e2 - b, b > 0 ? beh[b - 1] : 0, nevb};
                for (uint32_t k = b; k < e2; k++)
                    evb[nevb++] = (struct kvr_index_block){beh[k], bc[k]};
                b = e2;
            }
            /* touch tail first so a request's tail is evicted before its head (vLLM order);
             * a request larger than the cache keeps its head */
            size_t rm0 = nevh;
            for (uint32_t b = nb; b-- > 0;) {
                lru_touch(l, beh[b]);
                if (l->n > TR_CAP) {
                    evh = grow(evh, &cevh, nevh + 1, sizeof(*evh));
                    evh[nevh++] = lru_evict(l);
                }
            }
            if (nevh > rm0) {
                evs = grow(evs, &cev, nev + 1, sizeof(*evs));
                evs[nev++] = (struct ev){w, 0, 0, (uint32_t)(nevh - rm0), 0, rm0};
            }
            requests++;
            blocks_req += nb;
        }
    }
    t.pass_ev[t.npass] = nev;
    t.pass_q[t.npass] = t.nq;
    uint32_t evmax = 1;
    for (size_t i = 0; i < nev; i++)
        if (evs[i].n > evmax)
            evmax = evs[i].n;
    t.bbuf = xmalloc(evmax * sizeof(*t.bbuf));
    t.hbuf = xmalloc(evmax * sizeof(*t.hbuf));
    free(rq);
    fclose(f);
    free(line);
    size_t nstore = 0, nrm = 0;
    for (size_t i = 0; i < nev; i++)
        *(evs[i].store ? &nstore : &nrm) += evs[i].n;
    printf("trace (workers %s): %d passes of %zu requests, %llu blocks requested (%.1f%% "
           "cache hits), events: %zu (%zu blocks stored, %zu removed), %u workers x LRU %u "
           "blocks\n",
           by_hash ? "by hash of the first block" : "round-robin", t.npass, nrq,
           (unsigned long long)blocks_req, 100.0 * (double)hit_blocks / (double)blocks_req, nev,
           nstore, nrm, TR_WORKERS, TR_CAP);

    /* writer alone first (throughput without a concurrent reader), then with one reader
     * on a fresh index */
    int nround = (int)envl("KVR_TRACE_ROUNDS", 2);
    for (int round = 0; round < nround && round < 2; round++) {
        if (round == 1) {
            kvr_index_destroy(t.ix);
            kvr_index_create(&o, &t.ix);
            kvr_index_ns_intern(t.ix, "mooncake", NULL, &t.ns, &seed);
            for (uint32_t w = 0; w < TR_WORKERS; w++) {
                char pod[32];
                snprintf(pod, sizeof(pod), "pod-%u", w);
                kvr_index_worker_intern(t.ix, pod, 0, &t.wid[w]);
            }
        }
        t.done = 0;
        t.nlat = 0;
        t.clat = 4u << 20;
        t.lat = round == 1 ? xmalloc(t.clat * sizeof(double)) : NULL;
        t.latp = round == 1 ? xmalloc(t.clat) : NULL;
        pthread_t wt, rt;
        pthread_create(&wt, NULL, trace_writer, &t);
        if (round == 1)
            pthread_create(&rt, NULL, trace_reader, &t);
        pthread_join(wt, NULL);
        if (round == 1)
            pthread_join(rt, NULL);
        struct kvr_index_stats st;
        kvr_index_stats(t.ix, &st);
        double in_calls = 0;
        for (int p = 0; p < t.npass; p++)
            in_calls += t.pass_us[p];
        printf("  %s: %llu block ops in %.1f ms of index calls = %.2f M block-ops/s (writer "
               "thread %.1f ms wall, %.1f ms CPU with the event copies); index %llu entries, "
               "%llu pairs, %.1f MB\n",
               round ? "writer + 1 concurrent reader" : "writer alone",
               (unsigned long long)t.block_ops, in_calls / 1000,
               (double)t.block_ops / in_calls, t.writer_us / 1000, t.writer_cpu_us / 1000,
               (unsigned long long)st.entries, (unsigned long long)st.holders,
               (double)st.bytes / 1e6);
        /* per pass: pass 1 grows the index from empty (its memory's first touch: the
         * kernel clearing pages is the "sys" part); later passes run on full caches */
        double wu = 0, uu = 0, su = 0;
        uint64_t wo = 0;
        for (int p = 0; p < t.npass; p++) {
            size_t ns_ = 0, nr_ = 0;
            for (size_t i = t.pass_ev[p]; i < t.pass_ev[p + 1]; i++)
                *(evs[i].store ? &ns_ : &nr_) += evs[i].n;
            printf("    pass %d: %zu stored + %zu removed in %.1f ms = %.2f M block-ops/s "
                   "(writer thread CPU: user %.1f ms, sys %.1f ms)\n",
                   p + 1, ns_, nr_, t.pass_us[p] / 1000, (double)t.pass_ops[p] / t.pass_us[p],
                   t.pass_user_us[p] / 1000, t.pass_sys_us[p] / 1000);
            if (p > 0) {
                wu += t.pass_us[p];
                uu += t.pass_user_us[p];
                su += t.pass_sys_us[p];
                wo += t.pass_ops[p];
            }
        }
        if (t.npass > 1)
            printf("    passes 2-%d (caches warm): %.2f M block-ops/s (writer CPU: user %.1f "
                   "ms, sys %.1f ms)\n",
                   t.npass, (double)wo / wu, uu / 1000, su / 1000);
        if (round == 1) {
            /* split: during pass 1 (index growing from empty) and passes 2+ (warm) */
            size_t n1 = 0;
            for (size_t k = 0; k < t.nlat; k++)
                if (t.latp[k] == 0) {
                    double x = t.lat[k];
                    t.lat[k] = t.lat[n1];
                    t.latp[k] = t.latp[n1];
                    t.lat[n1] = x;
                    t.latp[n1++] = 0;
                }
            report("concurrent find, pass 1", t.lat, n1);
            if (t.npass > 1) {
                char nm[80];
                snprintf(nm, sizeof(nm), "concurrent find, passes 2-%d", t.npass);
                report(nm, t.lat + n1, t.nlat - n1);
            }
            free(t.lat);
            free(t.latp);
        }
    }
    /* the trace's queries on the final index, single thread. Even-numbered queries are
     * read where they are, cold in a ~30 MB array (a long query's first read is ~3 ticks a
     * block of DRAM reads, ~13 us for the longest, 11961 blocks); odd-numbered ones are
     * first copied to a buffer, as the daemon's request parser leaves them (in cache).
     * Each query runs once, so both halves see the index equally cold. */
    {
        struct kvr_index_reader *rd;
        kvr_index_reader_create(t.ix, &rd);
        /* the last pass's queries: the final index holds their blocks */
        const struct query *lq = &t.qs[last_q0];
        size_t n = t.nq - last_q0 < 4000 ? t.nq - last_q0 : 4000;
        double *lat[2] = {xmalloc(n * sizeof(double)), xmalloc(n * sizeof(double))};
        size_t nl[2] = {0, 0}, tot[2] = {0, 0};
        uint64_t *qb = xmalloc(t.qmax * sizeof(*qb));
        const struct kvr_index_hit *hits;
        size_t nh;
        for (size_t i = 0; i < n; i++) {
            const uint64_t *qq = &t.qc[lq[i].off];
            int hot = (int)(i & 1);
            if (hot) {
                memcpy(qb, qq, lq[i].n * sizeof(*qb));
                qq = qb;
            }
            double t0 = now_us();
            kvr_index_find(rd, t.ns, qq, lq[i].n, NULL, 0, NULL, &hits, &nh);
            lat[hot][nl[hot]++] = now_us() - t0;
            tot[hot] += nh;
        }
        char nm[80];
        snprintf(nm, sizeof(nm), "find, quiescent (%.1f hits)",
                 (double)tot[0] / (double)(nl[0] ? nl[0] : 1));
        report(nm, lat[0], nl[0]);
        snprintf(nm, sizeof(nm), "find, quiescent, query in cache (%.1f hits)",
                 (double)tot[1] / (double)(nl[1] ? nl[1] : 1));
        report(nm, lat[1], nl[1]);
        free(qb);
        free(lat[0]);
        free(lat[1]);
        kvr_index_reader_destroy(rd);
    }
    kvr_index_destroy(t.ix);
    for (int w = 0; w < TR_WORKERS; w++) {
        free(lru[w].nodes);
        free(lru[w].free_list);
        free(lru[w].keys);
        free(lru[w].vals);
    }
    free(lru);
    free(im.keys);
    free(im.vals);
    free(im.used);
    free(ids);
    free(bc);
    free(beh);
    free(t.qs);
    free(t.qc);
    free(t.bbuf);
    free(t.hbuf);
    return 0;
}

int main(void)
{
    rng = (uint64_t)envl("KVR_BENCH_SEED", 42);
    uint32_t nseq = (uint32_t)envl("KVR_BENCH_SEQS", 976);
    uint32_t nblk = (uint32_t)envl("KVR_BENCH_BLOCKS", 1024);
    uint32_t nw = (uint32_t)envl("KVR_BENCH_WORKERS", 128);
    uint32_t big = (uint32_t)envl("KVR_BENCH_BIG_WORKERS", 4096);
    uint32_t nq = (uint32_t)envl("KVR_BENCH_QUERIES", 2000);
    if (nseq)
        shape(nseq, nblk, nw, nq);
    if (big)
        shape(big, nblk, big, nq);
    const char *tr = getenv("KVR_TRACE");
    if (!tr)
        tr = "../shared/traces/synthetic_trace.jsonl";
    if (*tr) {
        const char *mode = getenv("KVR_TRACE_ASSIGN"); /* hash, rr or both (default) */
        if (!mode || strcmp(mode, "rr") != 0)
            trace(tr, envl("KVR_TRACE_REQUESTS", 0), 1);
        if (!mode || strcmp(mode, "hash") != 0)
            trace(tr, envl("KVR_TRACE_REQUESTS", 0), 0);
    }
    return 0;
}
