/* bench_snap.c — snapshots through the snap module: take (every writer's part + assembly),
 * write (tmp file, fsync, rename, fsync dir), read + verify + restore into a fresh index, and
 * the size on disk per (holder, block) pair, at 1M and 10M pairs; then find latency while
 * snapshots are taken back to back by the ingest writer threads vs without (same run, same
 * reader thread), and the writers' stall.
 *
 * Shape: W workers (pods), each holding sequences of L blocks whose first S blocks are a
 * shared "system prompt" (one namespace, GPU tier), until P pairs are held.
 * Env: KVR_BENCH_SNAP_PAIRS ("1000000 10000000"), KVR_BENCH_SNAP_WORKERS (64),
 * KVR_BENCH_SNAP_LEN (256), KVR_BENCH_SNAP_SHARED (32), KVR_BENCH_SNAP_DIR (/tmp),
 * KVR_BENCH_SEED. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "core/conf.h"
#include "index/index.h"
#include "events/ingest.h"
#include "core/log.h"
#include "state/snap.h"

static const struct kvr_index_opts IXO = {.max_workers = 16384, .orphan_capacity = 0};

struct world {
    struct kvr_conf conf;
    struct kvr_index *ix;
    struct kvr_ingest *ing;
    uint32_t nworkers;
    uint64_t **seqs; /* content hashes of every stored sequence (for finds) */
    size_t nseqs;
    uint32_t len;
};

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_snap: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(1);
}

static void build(struct world *w, uint64_t pairs, uint32_t nworkers, uint32_t len,
                  uint32_t shared)
{
    struct kvr_err err;
    struct kvr_ingest_snap_stream *ss = calloc(nworkers, sizeof(*ss));
    char (*pods)[32] = calloc(nworkers, 32);
    uint32_t ns;
    uint64_t seed, *sys = malloc(shared * sizeof(uint64_t));
    struct kvr_index_block *b = malloc(len * sizeof(*b));
    int rc;

    memset(w, 0, sizeof(*w));
    w->conf.writer_threads = 2;
    w->conf.queue_depth = 1024;
    w->conf.max_events_per_batch = 1024;
    w->conf.max_tokens_per_event = 1 << 16;
    w->conf.max_workers = 16384;
    w->nworkers = nworkers;
    w->len = len;
    if ((rc = kvr_index_create(&IXO, &w->ix)) != 0)
        die("index", rc);
    if ((rc = kvr_ingest_create(&w->conf, w->ix, &w->ing, &err)) != 0)
        die(err.msg, rc);
    for (uint32_t i = 0; i < nworkers; i++) {
        snprintf(pods[i], 32, "10.0.%u.%u", i / 250, i % 250 + 1);
        ss[i] = (struct kvr_ingest_snap_stream){.pod = pods[i], .model = "org/model",
                                                .last_seq = 1000 + i, .groups_full = 1};
    }
    /* the workers and their streams, as a restore would leave them */
    if ((rc = kvr_ingest_restore_streams(w->ing, ss, nworkers)) != 0)
        die("restore_streams", rc);
    kvr_index_ns_intern(w->ix, "org/model", NULL, &ns, &seed);
    kvr_index_ns_set_block_size(w->ix, ns, 16);
    for (uint32_t k = 0; k < shared; k++)
        sys[k] = rnd();
    uint64_t held = 0;
    size_t cap = 0;
    for (uint64_t s = 0; held < pairs; s++) {
        uint32_t wid, wk = (uint32_t)(s % nworkers);
        struct kvr_index_wres res = {0};
        uint64_t *seq = malloc(len * sizeof(uint64_t));
        uint64_t eh = rnd();
        for (uint32_t k = 0; k < len; k++) {
            seq[k] = k < shared ? sys[k] : rnd();
            /* engine hash: chained (a shared prefix has the same hashes everywhere) */
            eh = k < shared ? mixh(sys[k] + k) : mixh(eh ^ seq[k]);
            b[k].engine_hash = eh;
            b[k].content_hash = seq[k];
        }
        kvr_index_worker_lookup(w->ix, pods[wk], 0, &wid);
        if ((rc = kvr_index_store(w->ix, wid, KVR_TIER_GPU, ns, NULL, b, len, &res)) != 0)
            die("store", rc);
        held += res.stored;
        if (w->nseqs == cap) {
            cap = cap ? cap * 2 : 1024;
            w->seqs = realloc(w->seqs, cap * sizeof(*w->seqs));
        }
        w->seqs[w->nseqs++] = seq;
    }
    free(ss);
    free(pods);
    free(sys);
    free(b);
}

static void world_free(struct world *w)
{
    kvr_ingest_destroy(w->ing);
    kvr_index_destroy(w->ix);
    for (size_t i = 0; i < w->nseqs; i++)
        free(w->seqs[i]);
    free(w->seqs);
}

/* ---- take / write / load ------------------------------------------------------------------ */

static void sizes(uint64_t pairs, uint32_t nworkers, uint32_t len, uint32_t shared,
                  const char *dir)
{
    struct world w;
    struct kvr_snap *sn;
    struct kvr_snap_opts so;
    struct kvr_buf b, r;
    struct kvr_err err;
    struct kvr_index_stats st;
    char path[512];
    double t0, t_take, t_write, t_read, t_load;
    int rc;

    build(&w, pairs, nworkers, len, shared);
    kvr_index_stats(w.ix, &st);
    so = (struct kvr_snap_opts){.dir = dir, .index = w.ix, .ingest = w.ing};
    if ((rc = kvr_snap_create(&so, &sn, &err)) != 0)
        die(err.msg, rc);
    kvr_buf_init(&b);
    kvr_buf_init(&r);
    kvr_log_configure(KVR_LOG_DEBUG, KVR_LOG_TEXT); /* its split: parts, assembly */
    t0 = now_us();
    if ((rc = kvr_snap_take(sn, &b, &err)) != 0)
        die(err.msg, rc);
    t_take = now_us() - t0;
    kvr_log_configure(KVR_LOG_WARN, KVR_LOG_TEXT);
    t0 = now_us();
    if ((rc = kvr_snap_write_file(dir, b.data, b.len, &err)) != 0)
        die(err.msg, rc);
    t_write = now_us() - t0;
    snprintf(path, sizeof(path), "%s/%s", dir, KVR_SNAP_FILE);
    kvr_log_configure(KVR_LOG_DEBUG, KVR_LOG_TEXT);
    t0 = now_us();
    if ((rc = kvr_snap_save(sn, &err)) != 0) /* what the periodic thread does */
        die(err.msg, rc);
    double t_save = now_us() - t0;
    kvr_log_configure(KVR_LOG_WARN, KVR_LOG_TEXT);
    t0 = now_us();
    if ((rc = kvr_snap_read_file(path, &r, &err)) != 0)
        die(err.msg, rc);
    t_read = now_us() - t0;
    struct kvr_index *ix2;
    struct kvr_snap_loaded l;
    kvr_index_create(&IXO, &ix2);
    t0 = now_us();
    if ((rc = kvr_snap_apply(r.data, r.len, ix2, &l, &err)) != 0)
        die(err.msg, rc);
    t_load = now_us() - t0;
    struct kvr_index_stats st2;
    kvr_index_stats(ix2, &st2);
    printf("  %9" PRIu64 " pairs (%" PRIu64 " entries, %u workers, index %.1f MiB = %.1f B/pair)\n",
           st.holders, st.entries, nworkers, (double)st.bytes / 1048576.0,
           (double)st.bytes / (double)st.holders);
    printf("    file      %10zu bytes = %6.2f bytes/pair\n", b.len,
           (double)b.len / (double)st.holders);
    printf("    take      %8.1f ms = %6.1f M pairs/s (every writer's part + assembly in "
           "memory: GET /v1/snapshot)\n",
           t_take / 1e3, (double)st.holders / t_take);
    printf("    write     %8.1f ms = %6.1f M pairs/s (that buffer: tmp, fsync, rename, fsync "
           "dir)\n",
           t_write / 1e3, (double)st.holders / t_write);
    printf("    save      %8.1f ms = %6.1f M pairs/s (kvr_snap_save: parts, then the file "
           "written from them)\n", t_save / 1e3, (double)st.holders / t_save);
    printf("    read      %8.1f ms (the file into memory)\n", t_read / 1e3);
    printf("    load      %8.1f ms = %6.1f M pairs/s (verify + restore into an empty index)\n",
           t_load / 1e3, (double)st.holders / t_load);
    printf("    restored  %9" PRIu64 " pairs, %" PRIu64 " entries (%s)\n", st2.holders,
           st2.entries, st2.holders == st.holders && st2.entries == st.entries ? "equal" : "DIFFER");
    kvr_snap_loaded_free(&l);
    kvr_index_destroy(ix2);
    kvr_buf_free(&b);
    kvr_buf_free(&r);
    kvr_snap_destroy(sn);
    unlink(path);
    world_free(&w);
}

/* ---- find latency during snapshots ------------------------------------------------------ */

struct rctx {
    struct world *w;
    _Atomic int phase; /* 0 run, 1 stop */
    double *lat;
    size_t n, cap;
};

static void *reader(void *arg)
{
    struct rctx *c = arg;
    struct kvr_index_reader *r;
    double wts[KVR_TIER_MAX] = {1, 0.8, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};

    kvr_index_reader_create(c->w->ix, &r);
    while (atomic_load(&c->phase) == 0 && c->n < c->cap) {
        const struct kvr_index_hit *h;
        size_t nh;
        uint64_t *q = c->w->seqs[rnd() % c->w->nseqs];
        double t0 = now_us();
        kvr_index_find(r, 0, q, c->w->len, NULL, 0, wts, &h, &nh);
        c->lat[c->n++] = now_us() - t0;
    }
    kvr_index_reader_destroy(r);
    return NULL;
}

static void pct(const char *name, double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmpd);
    printf("    %-22s %7zu finds  p50 %7.1f us  p99 %7.1f us  p99.9 %7.1f us  max %8.1f us\n",
           name, n, v[n / 2], v[(size_t)((double)n * 0.99)], v[(size_t)((double)n * 0.999)],
           v[n - 1]);
}

static void during(uint64_t pairs, uint32_t nworkers, uint32_t len, uint32_t shared)
{
    struct world w;
    struct kvr_snap *sn;
    struct kvr_err err;
    struct kvr_buf b;
    struct rctx c;
    pthread_t th;
    int rc;

    build(&w, pairs, nworkers, len, shared);
    if ((rc = kvr_ingest_start(w.ing, &err)) != 0) /* parts taken by the writer threads */
        die(err.msg, rc);
    struct kvr_snap_opts so = {.index = w.ix, .ingest = w.ing};
    kvr_snap_create(&so, &sn, &err);
    kvr_buf_init(&b);
    memset(&c, 0, sizeof(c));
    c.w = &w;
    c.cap = 4000000;
    c.lat = malloc(c.cap * sizeof(double));

    /* without: 2 s of finds */
    pthread_create(&th, NULL, reader, &c);
    usleep(2000000);
    atomic_store(&c.phase, 1);
    pthread_join(th, NULL);
    pct("without snapshots", c.lat, c.n);

    /* during: snapshots back to back on this thread while the reader runs */
    c.n = 0;
    atomic_store(&c.phase, 0);
    pthread_create(&th, NULL, reader, &c);
    int taken = 0;
    double t0 = now_us(), stall_max = 0;
    while (now_us() - t0 < 2e6 || taken < 2) {
        if ((rc = kvr_snap_take(sn, &b, &err)) != 0)
            die(err.msg, rc);
        taken++;
        struct kvr_buf m;
        kvr_buf_init(&m);
        kvr_snap_metrics(sn, &m);
        const char *p = strstr(m.data, "\nkvrouter_snapshot_writer_stall_seconds ");
        if (p != NULL) {
            double s = strtod(p + strlen("\nkvrouter_snapshot_writer_stall_seconds "), NULL);
            if (s > stall_max)
                stall_max = s;
        }
        kvr_buf_free(&m);
    }
    atomic_store(&c.phase, 1);
    pthread_join(th, NULL);
    pct("during snapshots", c.lat, c.n);
    printf("    %d snapshots of %zu bytes taken meanwhile; longest writer stall %.1f ms\n", taken,
           b.len, stall_max * 1e3);
    kvr_ingest_stop(w.ing);
    free(c.lat);
    kvr_buf_free(&b);
    kvr_snap_destroy(sn);
    world_free(&w);
}

int main(void)
{
    const char *pairs_env = getenv("KVR_BENCH_SNAP_PAIRS");
    const char *dir = getenv("KVR_BENCH_SNAP_DIR");
    char buf[256], *save = NULL;
    uint32_t nworkers = (uint32_t)envl("KVR_BENCH_SNAP_WORKERS", 64);
    uint32_t len = (uint32_t)envl("KVR_BENCH_SNAP_LEN", 256);
    uint32_t shared = (uint32_t)envl("KVR_BENCH_SNAP_SHARED", 32);
    uint64_t first = 0;

    rng = (uint64_t)envl("KVR_BENCH_SEED", 42);
    kvr_log_configure(KVR_LOG_WARN, KVR_LOG_TEXT);
    snprintf(buf, sizeof(buf), "%s", pairs_env ? pairs_env : "1000000 10000000");
    if (dir == NULL || dir[0] == '\0')
        dir = "/tmp";
    printf("bench_snap: %u workers, sequences of %u blocks (first %u shared), dir %s\n",
           nworkers, len, shared, dir);
    for (char *t = strtok_r(buf, " ,", &save); t != NULL; t = strtok_r(NULL, " ,", &save)) {
        uint64_t p = strtoull(t, NULL, 0);
        if (first == 0)
            first = p;
        sizes(p, nworkers, len, shared, dir);
    }
    printf("  find latency (1 reader thread, whole-sequence queries) at %" PRIu64 " pairs:\n",
           first);
    during(first, nworkers, len, shared);
    return 0;
}
