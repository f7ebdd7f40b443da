/* bench_index_dump.c — a worker's dump and restore (src/index/index_dump.c), the index's part of a
 * snapshot: how long writing and loading the index take, and how many bytes a (holder,
 * block) pair costs on disk (the targets: <= 24 bytes a pair, write >= 10M pairs/s,
 * load >= 5M pairs/s).
 *
 * Shape: bench_index's (sequences of B blocks, 25% shared prefix from 4 groups, W workers,
 * worker = sequence % W, one tier), S sequences for ~1M and ~10M pairs. Dump: every worker
 * dumped into one buffer (as the snapshot writer appends them), timed whole, R times on the
 * same index. Restore: a fresh index (namespace interned, workers interned, untimed), then
 * every worker's blob restored, timed whole, R times. Both on one thread (in the daemon each
 * writer thread dumps its own workers, so they run in parallel); medians printed with the
 * min and max. Restored indexes are checked against the original's statistics.
 *
 * Environment: KVR_BENCH_WORKERS (default 128), KVR_BENCH_BLOCKS (1024), KVR_BENCH_PAIRS
 * ("1000000,10000000": the pair counts to run), KVR_BENCH_REPS (5), KVR_BENCH_SEED.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "core/buf.h"
#include "index/index.h"

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench_index_dump: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_index_dump: %s: %d\n", what, rc);
    exit(1);
}

static struct kvr_index *fresh(uint32_t nworkers, uint32_t *wids)
{
    struct kvr_index_opts o = {.max_workers = nworkers + 1, .orphan_capacity = 1024};
    struct kvr_index *ix;
    uint32_t ns;
    int rc;
    if ((rc = kvr_index_create(&o, &ix)) != 0 ||
        (rc = kvr_index_ns_intern(ix, "bench-model", NULL, &ns, NULL)) != 0)
        die("create", rc);
    for (uint32_t w = 0; w < nworkers; w++) {
        char pod[32];
        snprintf(pod, sizeof(pod), "pod-%u", w);
        if ((rc = kvr_index_worker_intern(ix, pod, 0, &wids[w])) != 0)
            die("intern", rc);
    }
    return ix;
}

/* CPU time of this thread, µs: what the call cost, whatever else the machine runs */
static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void stat3(double *v, int n, double *med, double *lo, double *hi)
{
    qsort(v, (size_t)n, sizeof(double), cmpd);
    *med = v[n / 2];
    *lo = v[0];
    *hi = v[n - 1];
}

static void run(uint64_t want, uint32_t nworkers, uint32_t nblk, int reps)
{
    /* a worker's sequences share one prefix group (s % 4 == worker % 4 for 4 | W): its
     * prefix is one set of pairs (with copies), the private 3/4 of each sequence are new */
    uint32_t npre = nblk / 4;
    uint64_t base = (uint64_t)nworkers * npre;
    uint32_t nseq = (uint32_t)(want > base ? (want - base + (nblk - npre) - 1) / (nblk - npre)
                                           : nworkers);
    uint32_t *wids = xmalloc(nworkers * sizeof(*wids));
    struct kvr_index *a = fresh(nworkers, wids);
    uint64_t *pre = xmalloc((size_t)4 * npre * sizeof(uint64_t));
    for (size_t i = 0; i < (size_t)4 * npre; i++)
        pre[i] = rnd();
    struct kvr_index_block *blk = xmalloc(nblk * sizeof(*blk));
    double t0 = now_us();
    for (uint32_t s = 0; s < nseq; s++) {
        const uint64_t *g = pre + (size_t)(s % 4) * npre;
        uint64_t eh = 0x5eed ^ (s % 4);
        for (uint32_t k = 0; k < nblk; k++) {
            uint64_t c = k < npre ? g[k] : rnd();
            if (k == npre) /* the private part's engine hashes diverge with its content */
                eh ^= mixh(s + 1);
            eh = mixh(eh ^ c);
            blk[k] = (struct kvr_index_block){eh, c};
        }
        int rc = kvr_index_store(a, wids[s % nworkers], 0, 0, NULL, blk, nblk, NULL);
        if (rc != 0)
            die("store", rc);
    }
    double tbuild = now_us() - t0;
    struct kvr_index_stats st;
    kvr_index_stats(a, &st);
    printf("%u sequences x %u blocks over %u workers: %llu pairs, %llu entries "
           "(built in %.2f s)\n",
           nseq, nblk, nworkers, (unsigned long long)st.holders,
           (unsigned long long)st.entries, tbuild / 1e6);

    /* dump */
    double *td = xmalloc((size_t)reps * sizeof(double));
    double *tc = xmalloc((size_t)reps * sizeof(double));
    double c0;
    struct kvr_buf out;
    kvr_buf_init(&out);
    size_t *off = xmalloc(((size_t)nworkers + 1) * sizeof(size_t));
    for (int r = 0; r < reps; r++) {
        kvr_buf_reset(&out);
        t0 = now_us();
        c0 = cpu_us();
        for (uint32_t w = 0; w < nworkers; w++) {
            off[w] = out.len;
            int rc = kvr_index_worker_dump(a, wids[w], &out);
            if (rc != 0)
                die("dump", rc);
        }
        tc[r] = cpu_us() - c0;
        td[r] = now_us() - t0;
        off[nworkers] = out.len;
    }
    double med, lo, hi, cmed, clo, chi;
    stat3(td, reps, &med, &lo, &hi);
    stat3(tc, reps, &cmed, &clo, &chi);
    double pairs = (double)st.holders;
    printf("  dump     median %8.1f ms (min %.1f, max %.1f)  %6.1f M pairs/s;  CPU %8.1f ms "
           "(min %.1f)  %6.1f M pairs/s\n",
           med / 1e3, lo / 1e3, hi / 1e3, pairs / med, cmed / 1e3, clo / 1e3, pairs / cmed);
    printf("           %zu bytes = %.2f bytes a pair\n", out.len, (double)out.len / pairs);

    /* restore: the original first goes, as at a daemon's start (and memory stays bounded) */
    kvr_index_destroy(a);
    for (int r = 0; r < reps; r++) {
        struct kvr_index *b = fresh(nworkers, wids);
        t0 = now_us();
        c0 = cpu_us();
        for (uint32_t w = 0; w < nworkers; w++) {
            int rc = kvr_index_worker_restore(b, wids[w], out.data + off[w], off[w + 1] - off[w],
                                              NULL);
            if (rc != 0)
                die("restore", rc);
        }
        tc[r] = cpu_us() - c0;
        td[r] = now_us() - t0;
        struct kvr_index_stats sb;
        kvr_index_stats(b, &sb);
        if (sb.holders != st.holders || sb.entries != st.entries) {
            fprintf(stderr, "bench_index_dump: restored %llu pairs, %llu entries\n",
                    (unsigned long long)sb.holders, (unsigned long long)sb.entries);
            exit(1);
        }
        if (r == 0)
            printf("  restored index: %.1f bytes a pair in memory (original's figure: "
                   "%.1f)\n",
                   (double)sb.bytes / pairs, (double)st.bytes / pairs);
        kvr_index_destroy(b);
    }
    stat3(td, reps, &med, &lo, &hi);
    stat3(tc, reps, &cmed, &clo, &chi);
    printf("  restore  median %8.1f ms (min %.1f, max %.1f)  %6.1f M pairs/s;  CPU %8.1f ms "
           "(min %.1f)  %6.1f M pairs/s\n",
           med / 1e3, lo / 1e3, hi / 1e3, pairs / med, cmed / 1e3, clo / 1e3, pairs / cmed);
    kvr_buf_free(&out);
    free(off);
    free(td);
    free(tc);
    free(blk);
    free(pre);
    free(wids);
}

int main(void)
{
    rng = (uint64_t)envl("KVR_BENCH_SEED", 42);
    uint32_t nworkers = (uint32_t)envl("KVR_BENCH_WORKERS", 128);
    uint32_t nblk = (uint32_t)envl("KVR_BENCH_BLOCKS", 1024);
    int reps = (int)envl("KVR_BENCH_REPS", 5);
    const char *pairs = getenv("KVR_BENCH_PAIRS");
    if (pairs == NULL || *pairs == 0)
        pairs = "1000000,10000000";
    if (reps < 1 || nworkers < 1 || nblk < 4)
        die("bad environment", -EINVAL);
    printf("bench_index_dump: dump and restore of every worker, one thread, %d runs each "
           "(median, min, max)\n",
           reps);
    for (const char *p = pairs; *p;) {
        char *end;
        uint64_t want = strtoull(p, &end, 10);
        if (end == p)
            die("bad KVR_BENCH_PAIRS", -EINVAL);
        run(want, nworkers, nblk, reps);
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}
