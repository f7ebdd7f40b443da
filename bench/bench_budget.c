/* bench_budget.c — what the memory cap's check costs a writer: kvr_index_bytes(), asked
 * before every BlockStored when [index] max_memory is set, against kvr_index_stats(), the
 * full statistics it was derived from (which sums every one of the 256 epoch slots' four
 * counters). Both are timed on an index whose epoch slots are in use as in the daemon:
 * KVR_BENCH_READERS readers (one slot each, for their lifetime) and writer calls from two
 * threads, with blocks stored so the counters are live. ns per call, median of 5 runs.
 *
 * Then the sizing figures of docs/operations.md "Memory cap": the empty index's bytes per
 * max_workers slot, and the bytes a (holder, block) pair adds, for blocks no other worker
 * holds (a new entry each) and for blocks already held by others (a holder added to an entry), measured
 * by storing KVR_BENCH_SIZE_BLOCKS blocks (chains of 1024) on KVR_BENCH_SIZE_WORKERS
 * workers. Run by bench/budget.sh before the trace replay. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"
#include "index/index.h"

static struct kvr_index *ix;
static uint32_t g_wid[2];

static void *store_some(void *arg)
{
    uint32_t t = (uint32_t)(uintptr_t)arg;
    struct kvr_index_block b[64];
    for (uint32_t k = 0; k < 64; k++) {
        struct kvr_index_wres res = {0};
        for (uint32_t i = 0; i < 64; i++) {
            b[i].engine_hash = (uint64_t)t << 40 | (uint64_t)k << 20 | i;
            b[i].content_hash = mixh(b[i].engine_hash + 1);
        }
        if (kvr_index_store(ix, g_wid[t], 0, 0, NULL, b, 64, &res) != 0)
            abort();
    }
    return NULL;
}

/* Stores blocks [0, n) (chains of 1024, content c0 + i) on worker wid; -1 on error. */
static int store_range(struct kvr_index *x, uint32_t ns, uint32_t wid, uint64_t c0, long n)
{
    static struct kvr_index_block b[1024];
    for (long s = 0; s < n; s += 1024) {
        struct kvr_index_wres res = {0};
        long k = n - s < 1024 ? n - s : 1024;
        for (long i = 0; i < k; i++) {
            b[i].engine_hash = mixh(c0 + (uint64_t)(s + i)) | 1;
            b[i].content_hash = mixh(c0 + (uint64_t)(s + i) + 7);
        }
        if (kvr_index_store(x, wid, 0, ns, NULL, b, (size_t)k, &res) != 0)
            return -1;
    }
    return 0;
}

static int sizing(void)
{
    long nb = envl("KVR_BENCH_SIZE_BLOCKS", 1 << 20), nw = envl("KVR_BENCH_SIZE_WORKERS", 8);
    struct kvr_index *a, *b;
    struct kvr_index_opts oa = {.max_workers = 64}, ob = {.max_workers = 16384};
    uint32_t ns, wid;
    uint64_t seed, e0, e1, e2, e3;

    if (kvr_index_create(&oa, &a) != 0 || kvr_index_create(&ob, &b) != 0)
        return 1;
    e0 = kvr_index_bytes(a);
    e1 = kvr_index_bytes(b);
    printf("sizing: empty index %.2f MB at max_workers 64, %.2f MB at 16384: %.0f bytes a "
           "max_workers slot\n", (double)e0 / 1e6, (double)e1 / 1e6,
           (double)(e1 - e0) / (16384 - 64));
    kvr_index_destroy(b);
    if (kvr_index_ns_intern(a, "m", NULL, &ns, &seed) != 0)
        return 1;
    /* unique blocks: every worker its own content */
    for (long w = 0; w < nw; w++) {
        char pod[32];
        snprintf(pod, sizeof(pod), "u-%ld", w);
        if (kvr_index_worker_intern(a, pod, 0, &wid) != 0 ||
            store_range(a, ns, wid, (uint64_t)w << 32, nb / nw) != 0)
            return 1;
    }
    e2 = kvr_index_bytes(a);
    /* shared blocks: as many pairs again, every worker holding the same content */
    for (long w = 0; w < nw; w++) {
        char pod[32];
        snprintf(pod, sizeof(pod), "s-%ld", w);
        if (kvr_index_worker_intern(a, pod, 0, &wid) != 0 ||
            store_range(a, ns, wid, 1ull << 60, nb / nw) != 0)
            return 1;
    }
    e3 = kvr_index_bytes(a);
    printf("sizing: %ld pairs on %ld workers, blocks unique to a worker: %.1f bytes a pair\n",
           nb / nw * nw, nw, (double)(e2 - e0) / (double)(nb / nw * nw));
    printf("sizing: %ld pairs on %ld workers, every block on all of them:  %.1f bytes a pair\n",
           nb / nw * nw, nw, (double)(e3 - e2) / (double)(nb / nw * nw));
    kvr_index_destroy(a);
    return 0;
}

int main(void)
{
    long readers = envl("KVR_BENCH_READERS", 4), calls = envl("KVR_BENCH_CALLS", 2000000);
    struct kvr_index_opts o = {.orphan_capacity = 1024};
    struct kvr_index_reader *rd[64];
    struct kvr_index_stats st;
    uint32_t ns;
    uint64_t seed, sink = 0;
    double tb[5], ts[5];
    pthread_t th[2];

    if (kvr_index_create(&o, &ix) != 0 || kvr_index_ns_intern(ix, "m", NULL, &ns, &seed) != 0)
        return 1;
    if (readers > 64)
        readers = 64;
    for (long i = 0; i < readers; i++)
        if (kvr_index_reader_create(ix, &rd[i]) != 0)
            return 1;
    for (uint32_t t = 0; t < 2; t++) {
        char pod[16];
        snprintf(pod, sizeof(pod), "pod-%u", t);
        if (kvr_index_worker_intern(ix, pod, 0, &g_wid[t]) != 0)
            return 1;
    }
    for (uintptr_t t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, store_some, (void *)t);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    for (int r = 0; r < 5; r++) {
        double t0 = now_us();
        for (long i = 0; i < calls; i++)
            sink += kvr_index_bytes(ix);
        double t1 = now_us();
        for (long i = 0; i < calls / 16; i++) {
            kvr_index_stats(ix, &st);
            sink += st.bytes;
        }
        double t2 = now_us();
        tb[r] = (t1 - t0) * 1e3 / (double)calls;
        ts[r] = (t2 - t1) * 1e3 / (double)(calls / 16);
    }
    qsort(tb, 5, sizeof(double), cmpd);
    qsort(ts, 5, sizeof(double), cmpd);
    kvr_index_stats(ix, &st);
    printf("memory cap check, %ld readers + 2 writer threads' slots, index %.1f MB:\n",
           readers, (double)st.bytes / 1e6);
    printf("  kvr_index_bytes  %7.1f ns/call (median of 5)\n", tb[2]);
    printf("  kvr_index_stats  %7.1f ns/call (median of 5)\n", ts[2]);
    if (kvr_index_bytes(ix) != st.bytes) {
        printf("bench_budget: FAILED: kvr_index_bytes %llu != stats bytes %llu\n",
               (unsigned long long)kvr_index_bytes(ix), (unsigned long long)st.bytes);
        return 1;
    }
    if (sink == 42)
        printf("\n");
    for (long i = 0; i < readers; i++)
        kvr_index_reader_destroy(rd[i]);
    kvr_index_destroy(ix);
    return sizing();
}
