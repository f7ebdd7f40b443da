/* snap.c — the snapshot format and the taking of snapshots: encode what ingest's writers hand
 * over, verify before loading, restore into an empty index, the periodic thread and its
 * metrics. Files, the peer client and the startup procedure are in snap_io.c.
 *
 * Why this shape:
 * - Consistency without stalls: readers never see a snapshot being taken (the index is read
 *   only by each worker's own writer, through kvr_index_worker_dump); each writer takes its
 *   part between two batches (kvr_ingest_snapshot) into its own buffer here, so the part's
 *   streams' last_seq match its workers' blocks; the header, checksums and the file (or the
 *   in-memory copy for GET /v1/snapshot) are done afterwards on the caller's thread (the
 *   periodic thread, main at shutdown, an HTTP loop), from the parts as segments: a save
 *   never copies them into one buffer (page faults on fresh memory were a third of a
 *   snapshot's time here).
 * - Namespaces and tiers are read after every part is in: ids only grow, so every id a part
 *   refers to is in the lists (a namespace interned meanwhile is merely unused).
 * - Verify, then apply: a file is checked completely (kvr_snap_verify) before the index is
 *   touched; the restore itself can still fail on a worker blob the index refuses (it checks
 *   each one before changing anything) or on ENOMEM, and then kvr_snap_boot throws the index
 *   away for a fresh one: an index is the snapshot's or empty, never half of it.
 * - Each writer's part takes its pods a few at a time between batches (ingest_snap.c), so a
 *   writer pauses for about one pod's blocks at most, not for its whole part.
 *
 * Threads: kvr_snap_take/save serialize on s->mu; the periodic thread waits on s->th_cv with
 * a deadline so stop() wakes it at once. Metrics are relaxed atomics.
 */
#include "state/snap.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "core/base.h"
#include "core/log.h"
#include "core/metrics.h"

#ifndef KVR_VERSION
#define KVR_VERSION "0.0.0"
#endif

#define MAGIC "KVRSNAP"            /* + NUL: 8 bytes */
#define HDR_LEN 96
#define HDR_SUM_OFF 88
#define SEC_HDR 24
#define PRODUCER_LEN 24

enum {
    SEC_NAMESPACES = 1,
    SEC_TIERS = 2,
    SEC_STREAMS = 3,
    SEC_WORKER = 4,
    SEC_END = 15,
};

/* ---- little-endian encoding ---------------------------------------------------------- */

static void put_le(struct kvr_buf *b, uint64_t v, int n)
{
    unsigned char x[8];
    for (int i = 0; i < n; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    kvr_buf_append(b, x, (size_t)n);
}

static void set_le(char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (char)(unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void put_str(struct kvr_buf *b, const char *s)
{
    size_t n = s != NULL ? strlen(s) : 0;
    if (n > KVR_NAME_MAX)
        n = KVR_NAME_MAX; /* cannot happen: every name is interned within the limit */
    put_le(b, n, 2);
    kvr_buf_append(b, s != NULL ? s : "", n);
    kvr_buf_append(b, "", 1);
}

/* Opens a section at the end of b; close_section fills its header once the payload is in. */
static size_t open_section(struct kvr_buf *b, uint32_t type)
{
    size_t at = b->len;
    put_le(b, type, 4);
    put_le(b, 0, 4);
    put_le(b, 0, 8);
    put_le(b, 0, 8);
    return at;
}

static void close_section(struct kvr_buf *b, size_t at, uint32_t records)
{
    if (b->oom)
        return;
    size_t len = b->len - at - SEC_HDR;
    set_le(b->data + at + 4, records, 4);
    set_le(b->data + at + 8, len, 8);
    set_le(b->data + at + 16, XXH64(b->data + at + SEC_HDR, len, 0), 8);
}

/* ---- a reader over untrusted bytes ------------------------------------------------------- */

struct rd {
    const unsigned char *p, *end;
    bool bad;
};

static uint64_t rd_le(struct rd *r, int n)
{
    if (r->bad || (size_t)(r->end - r->p) < (size_t)n) {
        r->bad = true;
        return 0;
    }
    uint64_t v = get_le(r->p, n);
    r->p += n;
    return v;
}

/* A string: u16 length (<= KVR_NAME_MAX), bytes without NUL, then NUL. Returns it in place. */
static const char *rd_str(struct rd *r, bool allow_empty)
{
    uint64_t n = rd_le(r, 2);
    const char *s;

    if (r->bad || n > KVR_NAME_MAX || (size_t)(r->end - r->p) < n + 1 ||
        (n == 0 && !allow_empty)) {
        r->bad = true;
        return NULL;
    }
    s = (const char *)r->p;
    if (memchr(s, 0, n) != NULL || r->p[n] != 0) {
        r->bad = true;
        return NULL;
    }
    r->p += n + 1;
    return s;
}

/* ---- verify ------------------------------------------------------------------------------ */

struct sec {
    uint32_t type, records;
    const unsigned char *payload;
    uint64_t len;
};

/* Calls fn for every section after the header (bounds and checksums checked); stops at END,
 * whose whole-file checksum it checks. */
static int walk(const unsigned char *d, size_t len, int (*fn)(void *arg, const struct sec *s),
                void *arg, struct kvr_err *err)
{
    size_t off = HDR_LEN;

    for (;;) {
        struct sec s;
        uint64_t sum;
        int rc;

        if (len - off < SEC_HDR)
            return kvr_err_set(err, -EINVAL, "truncated at byte %zu (a section header)", off);
        s.type = (uint32_t)get_le(d + off, 4);
        s.records = (uint32_t)get_le(d + off + 4, 4);
        s.len = get_le(d + off + 8, 8);
        sum = get_le(d + off + 16, 8);
        if (s.len > len - off - SEC_HDR)
            return kvr_err_set(err, -EINVAL, "truncated: section at byte %zu says %" PRIu64
                                             " bytes, %zu remain",
                               off, s.len, len - off - SEC_HDR);
        s.payload = d + off + SEC_HDR;
        if (XXH64(s.payload, s.len, 0) != sum)
            return kvr_err_set(err, -EINVAL, "checksum mismatch in section %u at byte %zu",
                               s.type, off);
        if (s.type == SEC_END) {
            if (s.len != 8 || s.records != 0)
                return kvr_err_set(err, -EINVAL, "malformed end section");
            if (get_le(s.payload, 8) != XXH64(d, off, 0))
                return kvr_err_set(err, -EINVAL, "whole-file checksum mismatch");
            if (off + SEC_HDR + 8 != len)
                return kvr_err_set(err, -EINVAL, "%zu bytes after the end section",
                                   len - off - SEC_HDR - 8);
            return 0;
        }
        rc = fn(arg, &s);
        if (rc != 0)
            return rc;
        off += SEC_HDR + s.len;
    }
}

/* A worker section to restore (apply), pointing into the snapshot's bytes. */
struct wjob {
    const char *pod;
    uint32_t rank;
    const unsigned char *blob;
    size_t len;
};

struct vstate {
    struct kvr_err *err;
    uint32_t version; /* the file's format version */
    uint64_t ns, tiers, streams, workers;
    int phase; /* 0: expect NAMESPACES, 1: TIERS, 2: parts */
    /* apply */
    struct kvr_index *ix;
    struct kvr_snap_loaded *out;
    size_t capstreams;
    struct wjob *jobs; /* worker sections, restored after the walk (restore_workers) */
    size_t njobs, capjobs;
};

static int sec_bad(struct vstate *v, const struct sec *s, const char *what)
{
    return kvr_err_set(v->err, -EINVAL, "malformed %s section (%u records, %" PRIu64 " bytes)",
                       what, s->records, s->len);
}

static int parse_ns(struct vstate *v, const struct sec *s)
{
    struct rd r = {s->payload, s->payload + s->len, false};

    for (uint32_t i = 0; i < s->records && !r.bad; i++) {
        const char *model = rd_str(&r, false), *lora = NULL;
        uint64_t has_lora = rd_le(&r, 1);
        if (has_lora > 1)
            r.bad = true;
        if (has_lora == 1)
            lora = rd_str(&r, false);
        uint32_t bs = (uint32_t)rd_le(&r, 4);
        if (r.bad || v->ix == NULL)
            continue;
        uint32_t ns;
        uint64_t seed;
        int rc = kvr_index_ns_intern(v->ix, model, lora, &ns, &seed);
        if (rc != 0)
            return kvr_err_set(v->err, rc, "namespace %u (%s): %s", i, model, strerror(-rc));
        if (ns != i)
            return kvr_err_set(v->err, -EINVAL, "namespace %u interned as %u: the index is not "
                                                "empty", i, ns);
        if (bs > 0)
            kvr_index_ns_set_block_size(v->ix, ns, bs);
    }
    if (r.bad || r.p != r.end)
        return sec_bad(v, s, "namespaces");
    v->ns = s->records;
    return 0;
}

static int parse_tiers(struct vstate *v, const struct sec *s)
{
    struct rd r = {s->payload, s->payload + s->len, false};

    if (s->records > KVR_TIER_MAX)
        return sec_bad(v, s, "tiers");
    for (uint32_t i = 0; i < s->records && !r.bad; i++) {
        const char *name = rd_str(&r, false);
        if (r.bad || v->ix == NULL)
            continue;
        uint8_t t;
        const char *have = kvr_index_tier_name(v->ix, (uint8_t)i);
        if (have != NULL) { /* gpu, cpu, storage: built in */
            if (strcmp(have, name) != 0)
                return kvr_err_set(v->err, -EINVAL, "tier %u is '%s' here, '%s' in the file", i,
                                   have, name);
            continue;
        }
        int rc = kvr_index_tier_intern(v->ix, name, strlen(name), &t);
        if (rc != 0 || t != i)
            return kvr_err_set(v->err, rc ? rc : -EINVAL, "tier %u (%s) cannot be restored", i,
                               name);
    }
    if (r.bad || r.p != r.end)
        return sec_bad(v, s, "tiers");
    v->tiers = s->records;
    return 0;
}

static int parse_streams(struct vstate *v, const struct sec *s)
{
    struct rd r = {s->payload, s->payload + s->len, false};

    for (uint32_t i = 0; i < s->records && !r.bad; i++) {
        struct kvr_ingest_snap_stream ss;
        uint64_t flags;

        ss.pod = rd_str(&r, false);
        ss.model = rd_str(&r, true);
        ss.dp_rank = (uint32_t)rd_le(&r, 4);
        ss.last_seq = rd_le(&r, 8);
        flags = rd_le(&r, 1);
        ss.groups_full = rd_le(&r, 8);
        ss.groups_other = rd_le(&r, 8);
        /* bit 0: unsynced; bit 1 (version 2): a publisher id follows, never 0 */
        if (flags > (v->version >= 2 ? 3u : 1u))
            r.bad = true;
        ss.unsynced = flags & 1;
        ss.pub_id = 0;
        if (flags & 2) {
            ss.pub_id = rd_le(&r, 8);
            if (ss.pub_id == 0)
                r.bad = true;
        }
        if (r.bad || v->out == NULL)
            continue;
        if (v->out->nstreams == v->capstreams) {
            size_t nc = v->capstreams ? v->capstreams * 2 : 16;
            struct kvr_ingest_snap_stream *p = realloc(v->out->streams, nc * sizeof(*p));
            if (p == NULL)
                return kvr_err_set(v->err, -ENOMEM, "out of memory");
            v->out->streams = p;
            v->capstreams = nc;
        }
        v->out->streams[v->out->nstreams++] = ss;
    }
    if (r.bad || r.p != r.end)
        return sec_bad(v, s, "streams");
    v->streams += s->records;
    return 0;
}

static int parse_worker(struct vstate *v, const struct sec *s)
{
    struct rd r = {s->payload, s->payload + s->len, false};
    const char *pod = rd_str(&r, false);
    uint32_t rank = (uint32_t)rd_le(&r, 4);
    uint64_t blen = rd_le(&r, 8);

    if (r.bad || s->records != 1 || blen != (uint64_t)(r.end - r.p))
        return sec_bad(v, s, "worker");
    v->workers++;
    if (v->ix == NULL)
        return 0;
    if (v->njobs == v->capjobs) {
        size_t nc = v->capjobs ? v->capjobs * 2 : 64;
        struct wjob *p = realloc(v->jobs, nc * sizeof(*p));
        if (p == NULL)
            return kvr_err_set(v->err, -ENOMEM, "out of memory");
        v->jobs = p;
        v->capjobs = nc;
    }
    v->jobs[v->njobs++] = (struct wjob){pod, rank, r.p, (size_t)blen};
    return 0;
}

/* ---- restoring the workers, in parallel ---------------------------------------------------
 * Workers are independent for the index (different workers may be written by different
 * threads at once: index.h), so the worker sections are restored by up to RESTORE_THREADS
 * threads taking them in file order from a shared counter; the restore is bounded by one
 * random probe of the entry table per entry (docs/index.md), which threads overlap. The
 * first failure stops the others at their next section; the caller then drops the index. */

#define RESTORE_THREADS 8

/* A progress line at most this often while the workers are restored (a large snapshot takes
 * seconds: about 5 s for 10M pairs; the HTTP listeners are not up yet to show gauges). */
#define RESTORE_PROGRESS_NS 1000000000ull

struct rpool {
    struct vstate *v;
    _Atomic size_t next;
    _Atomic size_t done;          /* workers restored */
    _Atomic uint64_t pairs;
    uint64_t t0_ns;               /* set before the threads start */
    _Atomic uint64_t next_log_ns; /* the next progress line is due then (CAS among threads) */
    _Atomic int failed;
    pthread_mutex_t mu; /* err, rc */
    int rc;             /* the first failure */
};

static void *restore_main(void *arg)
{
    struct rpool *rp = arg;
    struct vstate *v = rp->v;

    for (;;) {
        size_t i = atomic_fetch_add(&rp->next, 1);
        if (i >= v->njobs || atomic_load(&rp->failed))
            break;
        const struct wjob *j = &v->jobs[i];
        struct kvr_index_wres res = {0};
        uint32_t wid;
        int rc = kvr_index_worker_intern(v->ix, j->pod, j->rank, &wid);
        if (rc == 0)
            rc = kvr_index_worker_restore(v->ix, wid, j->blob, j->len, &res);
        if (rc != 0) {
            pthread_mutex_lock(&rp->mu);
            if (!atomic_exchange(&rp->failed, 1))
                rp->rc = kvr_err_set(v->err, rc, "worker %s/%u: %s", j->pod, j->rank,
                            rc == -ENOSPC ? "no worker id left ([index] max_workers)"
                                          : rc == -EINVAL || rc == -EBUSY
                                                ? "its blocks were refused by the index"
                                                : strerror(-rc));
            pthread_mutex_unlock(&rp->mu);
            break;
        }
        uint64_t pairs = atomic_fetch_add(&rp->pairs, res.stored) + res.stored;
        size_t done = atomic_fetch_add(&rp->done, 1) + 1;
        uint64_t now = kvr_now_ns(), due = atomic_load(&rp->next_log_ns);
        if (now >= due && done < v->njobs &&
            atomic_compare_exchange_strong(&rp->next_log_ns, &due, now + RESTORE_PROGRESS_NS))
            kvr_log_info("recovery: loading the snapshot: %zu of %zu workers, %" PRIu64
                         " of %" PRIu64 " pairs, %.1f s", done, v->njobs, pairs,
                         v->out->info.pairs, (double)(now - rp->t0_ns) / 1e9);
    }
    return NULL;
}

static int wjob_cmp(const void *a, const void *b)
{
    const struct wjob *x = *(const struct wjob *const *)a, *y = *(const struct wjob *const *)b;
    int c = strcmp(x->pod, y->pod);
    return c != 0 ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

/* A file that lists one worker twice (damaged or crafted) is refused before any restore: the
 * threads below would restore both sections into the same worker at once, and a worker has
 * one writer at a time (index.h; fuzz_snap found the assertion in the apply and a
 * use-after-free). */
static int jobs_distinct(struct vstate *v)
{
    const struct wjob **ix;
    int rc = 0;

    if (v->njobs < 2)
        return 0;
    if ((ix = malloc(v->njobs * sizeof(*ix))) == NULL)
        return kvr_err_set(v->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < v->njobs; i++)
        ix[i] = &v->jobs[i];
    qsort(ix, v->njobs, sizeof(*ix), wjob_cmp);
    for (size_t i = 1; i < v->njobs && rc == 0; i++)
        if (wjob_cmp(&ix[i - 1], &ix[i]) == 0)
            rc = kvr_err_set(v->err, -EINVAL, "worker %s/%u listed twice", ix[i]->pod,
                             ix[i]->rank);
    free(ix);
    return rc;
}

static int restore_workers(struct vstate *v)
{
    struct rpool rp = {.v = v};
    pthread_t th[RESTORE_THREADS];
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = ncpu > 0 ? (size_t)ncpu : 1, started = 0;

    if (n > RESTORE_THREADS)
        n = RESTORE_THREADS;
    if (n > v->njobs)
        n = v->njobs;
    rp.t0_ns = kvr_now_ns();
    atomic_init(&rp.next_log_ns, rp.t0_ns + RESTORE_PROGRESS_NS);
    pthread_mutex_init(&rp.mu, NULL);
    for (size_t i = 1; i < n; i++) /* the calling thread is the first */
        if (pthread_create(&th[started], NULL, restore_main, &rp) == 0)
            started++;
    restore_main(&rp);
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&rp.mu);
    v->out->pairs += atomic_load(&rp.pairs);
    return atomic_load(&rp.failed) ? rp.rc : 0;
}

static int on_section(void *arg, const struct sec *s)
{
    struct vstate *v = arg;

    switch (s->type) {
    case SEC_NAMESPACES:
        if (v->phase != 0)
            break;
        v->phase = 1;
        return parse_ns(v, s);
    case SEC_TIERS:
        if (v->phase != 1)
            break;
        v->phase = 2;
        return parse_tiers(v, s);
    case SEC_STREAMS:
        if (v->phase != 2)
            break;
        return parse_streams(v, s);
    case SEC_WORKER:
        if (v->phase != 2)
            break;
        return parse_worker(v, s);
    default:
        return kvr_err_set(v->err, -EINVAL, "unknown section type %u", s->type);
    }
    return kvr_err_set(v->err, -EINVAL, "section type %u out of order", s->type);
}

static int check_header(const unsigned char *d, size_t len, struct kvr_snap_info *info,
                        struct kvr_err *err)
{
    struct kvr_snap_info in;

    memset(&in, 0, sizeof(in));
    if (len < 12 || memcmp(d, MAGIC, 8) != 0)
        return kvr_err_set(err, -EINVAL, "not a kvrouterd snapshot (bad magic)");
    in.version = (uint32_t)get_le(d + 8, 4);
    if (in.version > KVR_SNAP_VERSION)
        return kvr_err_set(err, -EPROTONOSUPPORT,
                           "snapshot format version %u is newer than this kvrouterd's (%d)",
                           in.version, KVR_SNAP_VERSION);
    if (in.version == 0)
        return kvr_err_set(err, -EINVAL, "bad format version 0");
    if (len < HDR_LEN)
        return kvr_err_set(err, -EINVAL, "truncated header (%zu bytes)", len);
    if (get_le(d + 12, 4) != HDR_LEN)
        return kvr_err_set(err, -EINVAL, "bad header length");
    if (get_le(d + HDR_SUM_OFF, 8) != XXH64(d, HDR_SUM_OFF, 0))
        return kvr_err_set(err, -EINVAL, "header checksum mismatch");
    in.created_ms = (int64_t)get_le(d + 16, 8);
    in.namespaces = get_le(d + 24, 8);
    in.tiers = get_le(d + 32, 8);
    in.streams = get_le(d + 40, 8);
    in.workers = get_le(d + 48, 8);
    in.pairs = get_le(d + 56, 8);
    memcpy(in.producer, d + 64, PRODUCER_LEN);
    in.producer[PRODUCER_LEN] = '\0';
    in.bytes = len;
    if (info != NULL)
        *info = in;
    return 0;
}

static int run(const void *data, size_t len, struct vstate *v, struct kvr_snap_info *info)
{
    struct kvr_snap_info in;
    int rc;

    if (data == NULL && len > 0)
        return kvr_err_set(v->err, -EINVAL, "no data");
    rc = check_header(data, len, &in, v->err);
    if (rc != 0)
        return rc;
    v->version = in.version;
    rc = walk(data, len, on_section, v, v->err);
    if (rc != 0)
        return rc;
    if (v->phase != 2)
        return kvr_err_set(v->err, -EINVAL, "namespaces or tiers section missing");
    if (v->ns != in.namespaces || v->tiers != in.tiers || v->streams != in.streams ||
        v->workers != in.workers)
        return kvr_err_set(v->err, -EINVAL, "counts in the header disagree with the sections");
    if (info != NULL)
        *info = in;
    return 0;
}

int kvr_snap_verify(const void *data, size_t len, struct kvr_snap_info *info,
                    struct kvr_err *err)
{
    struct vstate v = {.err = err};
    return run(data, len, &v, info);
}

void kvr_snap_loaded_free(struct kvr_snap_loaded *l)
{
    free(l->streams);
    memset(l, 0, sizeof(*l));
}

int kvr_snap_apply(const void *data, size_t len, struct kvr_index *ix, struct kvr_snap_loaded *out,
                   struct kvr_err *err)
{
    struct vstate v = {.err = err};
    struct kvr_index_stats st;
    int rc;

    memset(out, 0, sizeof(*out));
    rc = run(data, len, &v, &out->info); /* everything checked before anything changes */
    if (rc != 0)
        return rc;
    kvr_index_stats(ix, &st);
    if (st.namespaces != 0 || st.workers != 0)
        return kvr_err_set(err, -EBUSY, "the index is not empty");
    memset(&v, 0, sizeof(v));
    v.err = err;
    v.ix = ix;
    v.out = out;
    rc = run(data, len, &v, &out->info);
    if (rc == 0)
        rc = jobs_distinct(&v);
    if (rc == 0)
        rc = restore_workers(&v);
    free(v.jobs);
    if (rc != 0) {
        free(out->streams);
        out->streams = NULL;
        out->nstreams = 0;
    }
    return rc;
}

/* ---- taking snapshots ------------------------------------------------------------------------ */

struct part {
    unsigned char hdr[SEC_HDR]; /* its STREAMS section header (layout) */
    struct kvr_buf streams;  /* stream records */
    uint32_t nstreams;
    struct kvr_buf workers;  /* complete WORKER sections */
    uint32_t nworkers;
};

struct kvr_snap {
    char *dir;
    int64_t interval_ms;
    struct kvr_index *ix;
    struct kvr_ingest *ing;

    pthread_mutex_t mu;      /* one snapshot at a time; the rest of this block under it */
    struct part *parts;
    uint32_t nparts;
    struct kvr_buf head;     /* header, NAMESPACES, TIERS */
    unsigned char tail[SEC_HDR + 8]; /* END */
    struct kvr_snap_seg *seg; /* 2 + 3 * nparts */

    pthread_mutex_t th_mu;   /* the periodic thread */
    pthread_cond_t th_cv;
    pthread_t th;
    bool th_started, stopping;

    _Atomic uint64_t taken, failures, bytes, pairs, duration_ns, stall_ns, last_ok_ms;
    _Atomic uint64_t pairs_taken, streams_taken, workers_taken; /* of the last one taken */
    struct kvr_snap_recovery rec;   /* startup's recovery (read-only after create) */
};

static int sink_stream(void *arg, uint32_t writer, const struct kvr_ingest_snap_stream *s)
{
    struct kvr_snap *sn = arg;
    struct part *p = &sn->parts[writer];

    put_str(&p->streams, s->pod);
    put_str(&p->streams, s->model);
    put_le(&p->streams, s->dp_rank, 4);
    put_le(&p->streams, s->last_seq, 8);
    put_le(&p->streams, (s->unsynced ? 1 : 0) | (s->pub_id != 0 ? 2 : 0), 1);
    put_le(&p->streams, s->groups_full, 8);
    put_le(&p->streams, s->groups_other, 8);
    if (s->pub_id != 0)
        put_le(&p->streams, s->pub_id, 8);
    p->nstreams++;
    return p->streams.oom ? -ENOMEM : 0;
}

static int sink_worker(void *arg, uint32_t writer, uint32_t wid, const char *pod,
                       uint32_t dp_rank)
{
    struct kvr_snap *sn = arg;
    struct part *p = &sn->parts[writer];
    struct kvr_buf *b = &p->workers;
    size_t at = open_section(b, SEC_WORKER), lat;
    int rc;

    put_str(b, pod);
    put_le(b, dp_rank, 4);
    lat = b->len;
    put_le(b, 0, 8);
    if (b->oom)
        return -ENOMEM;
    rc = kvr_index_worker_dump(sn->ix, wid, b);
    if (rc != 0)
        return rc;
    if (b->oom)
        return -ENOMEM;
    set_le(b->data + lat, b->len - lat - 8, 8);
    close_section(b, at, 1);
    p->nworkers++;
    return 0;
}

int kvr_snap_create(const struct kvr_snap_opts *o, struct kvr_snap **out, struct kvr_err *err)
{
    struct kvr_snap *s = calloc(1, sizeof(*s));
    uint32_t n = 1;

    if (s == NULL)
        return kvr_err_set(err, -ENOMEM, "out of memory");
    if (o->ingest != NULL)
        (void)kvr_ingest_queues(o->ingest, &n);
    s->parts = calloc(n, sizeof(*s->parts));
    s->seg = calloc(2 + 3 * (size_t)n, sizeof(*s->seg));
    kvr_buf_init(&s->head);
    if (o->dir != NULL && o->dir[0] != '\0')
        s->dir = strdup(o->dir);
    if (s->parts == NULL || s->seg == NULL ||
        (o->dir != NULL && o->dir[0] != '\0' && s->dir == NULL)) {
        free(s->parts);
        free(s->seg);
        free(s->dir);
        free(s);
        return kvr_err_set(err, -ENOMEM, "out of memory");
    }
    s->nparts = n;
    for (uint32_t i = 0; i < n; i++) {
        kvr_buf_init(&s->parts[i].streams);
        kvr_buf_init(&s->parts[i].workers);
    }
    s->interval_ms = o->interval_ms;
    s->rec = o->rec;
    if (s->rec.source == NULL)
        s->rec.source = "none";
    s->ix = o->index;
    s->ing = o->ingest;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->th_mu, NULL);
    pthread_cond_init(&s->th_cv, NULL);
    *out = s;
    return 0;
}

/* The file as segments over the parts (no copy of them): head = header + NAMESPACES + TIERS,
 * then per part its STREAMS section header, its stream records and its WORKER sections, then
 * END (whole-file checksum, computed over the segments). Called with s->mu held, after the
 * parts are in; the segments point into s->parts, s->head and s->tail until the next run. */
static int layout(struct kvr_snap *s, size_t *nseg, size_t *total)
{
    struct kvr_index *ix = s->ix;
    struct kvr_buf *h = &s->head;
    uint32_t nns = kvr_index_ns_count(ix);
    uint8_t nt = kvr_index_tier_count(ix);
    uint64_t nstreams = 0, nworkers = 0;
    struct kvr_index_stats st;
    char producer[PRODUCER_LEN];
    XXH64_state_t whole;
    size_t at, n = 0;

    for (uint32_t i = 0; i < s->nparts; i++) {
        nstreams += s->parts[i].nstreams;
        nworkers += s->parts[i].nworkers;
    }
    kvr_index_stats(ix, &st);
    kvr_buf_reset(h);
    kvr_buf_append(h, MAGIC, 8);
    put_le(h, KVR_SNAP_VERSION, 4);
    put_le(h, HDR_LEN, 4);
    put_le(h, (uint64_t)(kvr_wall_s() * 1000.0), 8);
    put_le(h, nns, 8);
    put_le(h, nt, 8);
    put_le(h, nstreams, 8);
    put_le(h, nworkers, 8);
    put_le(h, st.holders, 8);
    memset(producer, 0, sizeof(producer));
    snprintf(producer, sizeof(producer), "kvrouterd %s", KVR_VERSION);
    kvr_buf_append(h, producer, sizeof(producer));
    if (h->oom)
        return -ENOMEM;
    put_le(h, XXH64(h->data, HDR_SUM_OFF, 0), 8);
    /* namespaces, tiers: read after every part is in (ids only grow) */
    at = open_section(h, SEC_NAMESPACES);
    for (uint32_t i = 0; i < nns; i++) {
        const char *model = NULL, *lora = NULL;
        if (kvr_index_ns_names(ix, i, &model, &lora) != 0)
            model = "?";
        put_str(h, model);
        put_le(h, lora != NULL ? 1 : 0, 1);
        if (lora != NULL)
            put_str(h, lora);
        put_le(h, kvr_index_ns_block_size(ix, i), 4);
    }
    close_section(h, at, nns);
    at = open_section(h, SEC_TIERS);
    for (uint8_t t = 0; t < nt; t++) {
        const char *name = kvr_index_tier_name(ix, t);
        put_str(h, name != NULL ? name : "?");
    }
    close_section(h, at, nt);
    if (h->oom)
        return -ENOMEM;

    s->seg[n++] = (struct kvr_snap_seg){h->data, h->len};
    for (uint32_t i = 0; i < s->nparts; i++) {
        struct part *p = &s->parts[i];
        set_le((char *)p->hdr, SEC_STREAMS, 4);
        set_le((char *)p->hdr + 4, p->nstreams, 4);
        set_le((char *)p->hdr + 8, p->streams.len, 8);
        set_le((char *)p->hdr + 16, XXH64(p->streams.data, p->streams.len, 0), 8);
        s->seg[n++] = (struct kvr_snap_seg){p->hdr, SEC_HDR};
        s->seg[n++] = (struct kvr_snap_seg){p->streams.data, p->streams.len};
        s->seg[n++] = (struct kvr_snap_seg){p->workers.data, p->workers.len};
    }
    XXH64_reset(&whole, 0);
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        if (s->seg[i].len > 0)
            XXH64_update(&whole, s->seg[i].data, s->seg[i].len);
        *total += s->seg[i].len;
    }
    set_le((char *)s->tail + SEC_HDR, XXH64_digest(&whole), 8);
    set_le((char *)s->tail, SEC_END, 4);
    set_le((char *)s->tail + 4, 0, 4);
    set_le((char *)s->tail + 8, 8, 8);
    set_le((char *)s->tail + 16, XXH64(s->tail + SEC_HDR, 8, 0), 8);
    s->seg[n++] = (struct kvr_snap_seg){s->tail, sizeof(s->tail)};
    *total += sizeof(s->tail);
    *nseg = n;
    return 0;
}

/* Every writer's part into s->parts (reset first); s->mu held. */
static int take_parts(struct kvr_snap *s, uint64_t *stall)
{
    struct kvr_ingest_snap_sink sink = {.stream = sink_stream, .worker = sink_worker, .arg = s};

    *stall = 0;
    for (uint32_t i = 0; i < s->nparts; i++) {
        kvr_buf_reset(&s->parts[i].streams);
        kvr_buf_reset(&s->parts[i].workers);
        s->parts[i].nstreams = s->parts[i].nworkers = 0;
    }
    return s->ing != NULL ? kvr_ingest_snapshot(s->ing, &sink, stall) : 0;
}

/* The parts' memory is not kept between runs (a snapshot may be large). */
static void drop_parts(struct kvr_snap *s)
{
    for (uint32_t i = 0; i < s->nparts; i++) {
        kvr_buf_free(&s->parts[i].streams);
        kvr_buf_free(&s->parts[i].workers);
    }
    kvr_buf_free(&s->head);
}

/* take (+ write into dir when dir != NULL, else concatenate into out): the one procedure. */
static int run_snapshot(struct kvr_snap *s, const char *dir, struct kvr_buf *out, size_t *bytes,
                        struct kvr_err *err)
{
    uint64_t stall = 0, t0 = kvr_now_ns(), t_parts;
    size_t nseg = 0, total = 0;
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = take_parts(s, &stall);
    t_parts = kvr_now_ns();
    if (rc == 0)
        rc = layout(s, &nseg, &total);
    if (rc == 0 && dir != NULL) {
        rc = kvr_snap_write_segs(dir, s->seg, nseg, err);
    } else if (rc == 0) {
        kvr_buf_reset(out);
        if (kvr_buf_reserve(out, total) != 0)
            rc = -ENOMEM;
        for (size_t i = 0; rc == 0 && i < nseg; i++)
            if (s->seg[i].len > 0)
                kvr_buf_append(out, s->seg[i].data, s->seg[i].len);
        if (rc == 0 && out->oom)
            rc = -ENOMEM;
    }
    if (rc == 0) {
        struct kvr_snap_info info;
        (void)check_header((const unsigned char *)s->head.data, s->head.len, &info, NULL);
        KVR_CNT_SET(s->pairs_taken, info.pairs);
        KVR_CNT_SET(s->streams_taken, info.streams);
        KVR_CNT_SET(s->workers_taken, info.workers);
    }
    drop_parts(s);
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) {
        if (out != NULL)
            kvr_buf_reset(out);
        KVR_CNT_INC(s->failures);
        /* a write error already says what and where */
        return dir != NULL && rc != -ENOMEM ? rc : kvr_err_set(err, rc, "snapshot: %s",
                                                                 strerror(-rc));
    }
    KVR_CNT_SET(s->stall_ns, stall);
    *bytes = total;
    kvr_log_debug("snapshot %s: %zu bytes in %.3f ms (writers' parts %.3f ms, %s %.3f ms), "
                  "longest writer stall %.3f ms",
                  dir != NULL ? "written" : "taken", total, (double)(kvr_now_ns() - t0) / 1e6,
                  (double)(t_parts - t0) / 1e6, dir != NULL ? "file" : "assembly",
                  (double)(kvr_now_ns() - t_parts) / 1e6, (double)stall / 1e6);
    return 0;
}

int kvr_snap_take(struct kvr_snap *s, struct kvr_buf *out, struct kvr_err *err)
{
    size_t bytes;
    return run_snapshot(s, NULL, out, &bytes, err);
}

int kvr_snap_save(struct kvr_snap *s, struct kvr_err *err)
{
    uint64_t t0 = kvr_now_ns();
    size_t bytes = 0;
    int rc;

    if (s->dir == NULL)
        return kvr_err_set(err, -ENOTDIR, "snapshot: no [state] dir");
    rc = run_snapshot(s, s->dir, NULL, &bytes, err);
    if (rc == 0) {
        uint64_t ns = kvr_now_ns() - t0;
        KVR_CNT_INC(s->taken);
        KVR_CNT_SET(s->bytes, bytes);
        KVR_CNT_SET(s->pairs, KVR_CNT_GET(s->pairs_taken));
        KVR_CNT_SET(s->duration_ns, ns);
        KVR_CNT_SET(s->last_ok_ms, (uint64_t)(kvr_wall_s() * 1000.0));
        kvr_log_info("snapshot written: %s/%s, %zu bytes, %" PRIu64 " streams, %" PRIu64
                     " workers, %" PRIu64 " pairs in %.3f s (longest writer stall %.3f ms)",
                     s->dir, KVR_SNAP_FILE, bytes, KVR_CNT_GET(s->streams_taken),
                     KVR_CNT_GET(s->workers_taken), KVR_CNT_GET(s->pairs_taken),
                     (double)ns / 1e9, (double)KVR_CNT_GET(s->stall_ns) / 1e6);
    }
    return rc;
}

static void *periodic_main(void *arg)
{
    struct kvr_snap *s = arg;
    struct kvr_err e;

    pthread_mutex_lock(&s->th_mu);
    while (!s->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += s->interval_ms / 1000;
        ts.tv_nsec += (s->interval_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!s->stopping && pthread_cond_timedwait(&s->th_cv, &s->th_mu, &ts) != ETIMEDOUT)
            ;
        if (s->stopping)
            break;
        pthread_mutex_unlock(&s->th_mu);
        if (kvr_snap_save(s, &e) != 0)
            kvr_log_error("periodic %s", e.msg);
        pthread_mutex_lock(&s->th_mu);
    }
    pthread_mutex_unlock(&s->th_mu);
    return NULL;
}

int kvr_snap_start(struct kvr_snap *s, struct kvr_err *err)
{
    pthread_condattr_t ca;
    int rc;

    if (s->dir == NULL || s->interval_ms <= 0)
        return 0;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_destroy(&s->th_cv);
    pthread_cond_init(&s->th_cv, &ca);
    pthread_condattr_destroy(&ca);
    rc = pthread_create(&s->th, NULL, periodic_main, s);
    if (rc != 0)
        return kvr_err_set(err, -rc, "snapshot thread: %s", strerror(rc));
    s->th_started = true;
    return 0;
}

void kvr_snap_stop(struct kvr_snap *s)
{
    if (s == NULL || !s->th_started)
        return;
    pthread_mutex_lock(&s->th_mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->th_cv);
    pthread_mutex_unlock(&s->th_mu);
    pthread_join(s->th, NULL);
    s->th_started = false;
}

void kvr_snap_destroy(struct kvr_snap *s)
{
    if (s == NULL)
        return;
    kvr_snap_stop(s);
    for (uint32_t i = 0; i < s->nparts; i++) {
        kvr_buf_free(&s->parts[i].streams);
        kvr_buf_free(&s->parts[i].workers);
    }
    kvr_buf_free(&s->head);
    free(s->parts);
    free(s->seg);
    free(s->dir);
    pthread_cond_destroy(&s->th_cv);
    pthread_mutex_destroy(&s->th_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void kvr_snap_metrics(struct kvr_snap *s, struct kvr_buf *out)
{
    uint64_t ok = KVR_CNT_GET(s->last_ok_ms);

    kvr_metrics_counter(out, "snapshot_total", "Snapshots written to [state] dir", NULL,
                        KVR_CNT_GET(s->taken));
    kvr_metrics_counter(out, "snapshot_failures_total", "Snapshots that could not be taken or "
                                                        "written",
                        NULL, KVR_CNT_GET(s->failures));
    kvr_metrics_gauge(out, "snapshot_duration_seconds", "Time the last snapshot written took",
                      NULL, (double)KVR_CNT_GET(s->duration_ns) / 1e9);
    kvr_metrics_gauge(out, "snapshot_writer_stall_seconds",
                      "Longest time one ingest writer spent on the last snapshot taken", NULL,
                      (double)KVR_CNT_GET(s->stall_ns) / 1e9);
    kvr_metrics_gauge(out, "snapshot_bytes", "Size of the last snapshot written", NULL,
                      (double)KVR_CNT_GET(s->bytes));
    kvr_metrics_gauge(out, "snapshot_pairs", "(holder, block) pairs in the last snapshot written",
                      NULL, (double)KVR_CNT_GET(s->pairs));
    kvr_metrics_gauge(out, "snapshot_last_success_timestamp_seconds",
                      "Unix time of the last snapshot written (0 = none yet)", NULL,
                      (double)ok / 1000.0);
    /* startup's recovery (before the listeners: its results, not its progress) */
    char lab[64];
    snprintf(lab, sizeof(lab), "source=\"%s\"", s->rec.source);
    kvr_metrics_gauge(out, "recovery_snapshot_info",
                      "1, labelled with where the startup snapshot came from (file, peer, none)",
                      lab, 1);
    kvr_metrics_gauge(out, "recovery_snapshot_load_seconds",
                      "Time the startup snapshot took to load into the index (0 = none)", NULL,
                      (double)s->rec.load_ns / 1e9);
    kvr_metrics_gauge(out, "recovery_snapshot_pairs_restored",
                      "(holder, block) pairs restored from the startup snapshot", NULL,
                      (double)s->rec.pairs);
    kvr_metrics_gauge(out, "recovery_snapshot_streams_restored",
                      "Streams restored from the startup snapshot", NULL,
                      (double)s->rec.streams);
    kvr_metrics_gauge(out, "recovery_bootstrap_seconds",
                      "Time the peer bootstrap's fetch took (0 = not asked)", NULL,
                      (double)s->rec.bootstrap_ns / 1e9);
    kvr_metrics_gauge(out, "recovery_bootstrap_bytes",
                      "Bytes of the peer's snapshot received at startup", NULL,
                      (double)s->rec.bootstrap_bytes);
    kvr_metrics_gauge(out, "recovery_bootstrap_failed",
                      "1 when a peer was asked at startup and gave no valid snapshot", NULL,
                      s->rec.bootstrap && !s->rec.bootstrap_ok ? 1.0 : 0.0);
}
