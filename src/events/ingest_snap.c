/* ingest_snap.c — ingest's side of snapshots: each writer hands over its own part (its
 * streams and the workers it writes) at a batch boundary, and streams loaded from a snapshot
 * wait here ("restored") until their topic's first batch takes them over.
 *
 * Why in ingest: only a writer may read its workers' blocks consistently with its streams'
 * last_seq (it is their only writer), so the part is taken on the writer thread, between two
 * items of its queue (a CMD_SNAPSHOT item posted behind whatever was queued). The writer
 * only walks its streams and calls the sink; encoding, checksums and files are the snap
 * module's (src/state/snap.c), so ingest knows nothing of the format. Readers are never involved:
 * kvr_index_worker_dump() runs on the writer, and scoring keeps reading the index meanwhile.
 * The writer's stall is the time its part takes, measured and reported (kvrouterd_snapshot_
 * writer_stall_seconds).
 *
 * Restored streams: kvr_ingest_restore_streams() (before start) files each under the writer
 * that owns its pod (kvr_queue_shard). Their workers are already in the index (the snap
 * module restored them); the entry holds (pod, model, dp_rank) → last_seq, unsynced, the
 * learned hybrid groups. When a new stream of that key appears (stream_of), it takes the
 * state over (kvr_stream_restore) before its first batch is judged. Until then the entry is
 * listed in /v1/pods as "restored" and included in later snapshots as it is. A pod forgotten
 * (DELETE /v1/pods) drops its entries.
 *
 * Threads: an entry is written by its writer thread (or before start); `claimed` is changed
 * under reg_mu, which the /v1/pods listing holds while it reads the entries.
 */
#include "events/ingest_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A snapshot a writer is taking, a few pods per step between batches. */
struct ing_snapjob {
    struct ing_cmd *c;        /* the CMD_SNAPSHOT item's command (its sink, stall, rc) */
    char **pods;              /* the writer's pods when the command arrived, sorted */
    size_t npods, next;
    uint32_t *wids;           /* scratch: one pod's workers */
    size_t nwids, capwids;
    int rc;
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int add_wid(uint32_t **v, size_t *n, size_t *cap, uint32_t wid)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        uint32_t *p = realloc(*v, nc * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        *v = p;
        *cap = nc;
    }
    (*v)[(*n)++] = wid;
    return 0;
}

/* One pod's streams and workers: consistent with each other (one batch boundary). */
static int emit_pod(struct writer *w, const struct kvr_ingest_snap_sink *sink, const char *pod,
                    struct ing_snapjob *j)
{
    struct kvr_ingest *ing = w->ing;
    int rc = 0;

    j->nwids = 0;
    for (size_t i = 0; i < w->ntopics && rc == 0; i++) {
        struct ing_topic *it = w->topics[i];
        if (strcmp(it->t->pod, pod) != 0)
            continue;
        for (uint32_t r = 0; r < it->nranks && rc == 0; r++) {
            struct ing_stream *s = it->ranks[r];
            if (s == NULL || s->wid == NO_WID)
                continue;
            rc = add_wid(&j->wids, &j->nwids, &j->capwids, s->wid);
            if (rc != 0 || !s->sm.based || !s->sm.has_last)
                continue; /* no baseline (right after an engine restart): nothing to resume */
            /* a stream whose stores the memory cap refused misses blocks: it comes back
             * unsynced (the snapshot has no over_budget flag; both resync the same way) */
            struct kvr_ingest_snap_stream ss = {
                .pod = it->t->pod, .model = it->t->model, .dp_rank = s->dp_rank,
                .last_seq = s->sm.last, .unsynced = s->sm.unsynced || s->over_budget,
                .groups_full = s->groups_full, .groups_other = s->groups_other,
                .pub_id = s->sm.pub_id};
            rc = sink->stream(sink->arg, w->idx, &ss);
        }
    }
    for (size_t i = 0; i < w->nrestored && rc == 0; i++) {
        struct ing_restored *e = &w->restored[i];
        if (e->claimed || strcmp(e->pod, pod) != 0)
            continue;
        struct kvr_ingest_snap_stream ss = {
            .pod = e->pod, .model = e->model, .dp_rank = e->dp_rank, .last_seq = e->last_seq,
            .unsynced = e->unsynced, .groups_full = e->groups_full,
            .groups_other = e->groups_other, .pub_id = e->pub_id};
        rc = add_wid(&j->wids, &j->nwids, &j->capwids, e->wid);
        if (rc == 0)
            rc = sink->stream(sink->arg, w->idx, &ss);
    }
    if (rc == 0 && j->nwids > 0) {
        qsort(j->wids, j->nwids, sizeof(*j->wids), u32_cmp);
        for (size_t i = 0; i < j->nwids && rc == 0; i++) {
            const char *wpod;
            if (i > 0 && j->wids[i] == j->wids[i - 1])
                continue; /* one pod, several models: one worker */
            wpod = kvr_index_worker_pod(ing->ix, j->wids[i]);
            if (wpod == NULL)
                continue;
            rc = sink->worker(sink->arg, w->idx, j->wids[i], wpod,
                              kvr_index_worker_rank(ing->ix, j->wids[i]));
        }
    }
    return rc;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void job_free(struct ing_snapjob *j)
{
    for (size_t i = 0; i < j->npods; i++)
        free(j->pods[i]);
    free(j->pods);
    free(j->wids);
    free(j);
}

/* The pods of this writer now (its topics' and its restored streams'), sorted, once each. */
static int job_create(struct writer *w, struct ing_cmd *c, struct ing_snapjob **out)
{
    struct ing_snapjob *j = calloc(1, sizeof(*j));
    size_t cap = w->ntopics + w->nrestored, n = 0;
    bool oom = false;

    if (j == NULL)
        return -ENOMEM;
    j->c = c;
    j->pods = calloc(cap ? cap : 1, sizeof(*j->pods));
    if (j->pods == NULL) {
        free(j);
        return -ENOMEM;
    }
    for (size_t i = 0; i < w->ntopics && !oom; i++)
        if ((j->pods[n++] = strdup(w->topics[i]->t->pod)) == NULL)
            oom = true;
    for (size_t i = 0; i < w->nrestored && !oom; i++) /* claimed ones are topics now */
        if (!w->restored[i].claimed && (j->pods[n++] = strdup(w->restored[i].pod)) == NULL)
            oom = true;
    j->npods = n;
    if (oom) {
        job_free(j);
        return -ENOMEM;
    }
    qsort(j->pods, n, sizeof(*j->pods), str_cmp);
    n = 0;
    for (size_t i = 0; i < j->npods; i++) {
        if (n > 0 && strcmp(j->pods[i], j->pods[n - 1]) == 0)
            free(j->pods[i]);
        else
            j->pods[n++] = j->pods[i];
    }
    j->npods = n;
    *out = j;
    return 0;
}

/* Runs pods of the job for up to SNAP_STEP_NS (at least one pod); true when the job is done. */
#define SNAP_STEP_NS 1000000u
static bool job_step(struct writer *w, struct ing_snapjob *j)
{
    uint64_t t0 = mono_ns(), dt;

    while (j->next < j->npods && j->rc == 0) {
        j->rc = emit_pod(w, j->c->sink, j->pods[j->next++], j);
        if (mono_ns() - t0 >= SNAP_STEP_NS)
            break;
    }
    dt = mono_ns() - t0;
    if (dt > j->c->stall_ns)
        j->c->stall_ns = dt;
    return j->next >= j->npods || j->rc != 0;
}

static void cmd_done(struct kvr_ingest *ing, struct ing_cmd *c)
{
    pthread_mutex_lock(&ing->done_mu);
    c->done = true;
    pthread_cond_broadcast(&ing->done_cv);
    pthread_mutex_unlock(&ing->done_mu);
}

void kvr_ingest_snap_begin(struct writer *w, struct ing_cmd *c)
{
    struct ing_snapjob *j;

    KVR_ASSERT(w->snap == NULL); /* the snap module takes one snapshot at a time */
    c->stall_ns = 0;
    c->rc = job_create(w, c, &j);
    if (c->rc != 0) {
        cmd_done(w->ing, c);
        return;
    }
    w->snap = j;
    kvr_ingest_snap_step(w);
}

void kvr_ingest_snap_step(struct writer *w)
{
    struct ing_snapjob *j = w->snap;
    struct ing_cmd *c;

    if (j == NULL || !job_step(w, j))
        return;
    c = j->c;
    c->rc = j->rc;
    w->snap = NULL;
    job_free(j);
    cmd_done(w->ing, c); /* c belongs to the waiter from here on */
}

int kvr_ingest_snapshot(struct kvr_ingest *ing, const struct kvr_ingest_snap_sink *sink,
                        uint64_t *stall_ns)
{
    struct ing_cmd *cmds;
    uint32_t posted = 0;
    uint64_t stall = 0;
    int rc = 0;

    if (stall_ns != NULL)
        *stall_ns = 0;
    cmds = calloc(ing->nwriters, sizeof(*cmds));
    if (cmds == NULL)
        return -ENOMEM;
    if (!atomic_load(&ing->writers_running)) {
        /* before start or after stop: no writer thread, this is the only one */
        for (uint32_t i = 0; i < ing->nwriters && rc == 0; i++) {
            struct ing_snapjob *j;
            cmds[i].sink = sink;
            rc = job_create(&ing->w[i], &cmds[i], &j);
            if (rc != 0)
                break;
            while (!job_step(&ing->w[i], j))
                ;
            rc = j->rc;
            job_free(j);
            if (cmds[i].stall_ns > stall)
                stall = cmds[i].stall_ns;
        }
        goto out;
    }
    for (uint32_t i = 0; i < ing->nwriters; i++) {
        struct kvr_queue_msg *it = kvr_queue_reserve(ing->w[i].q, NULL);
        if (it == NULL) {
            rc = -ESHUTDOWN;
            break;
        }
        cmds[i].type = CMD_SNAPSHOT;
        cmds[i].sink = sink;
        it->kind = KVR_QUEUE_CMD;
        it->ctx = &cmds[i];
        it->topic = NULL;
        kvr_queue_commit(ing->w[i].q);
        posted++;
    }
    /* wait for every command posted (a closed queue is still drained by its writer, which
     * finishes a snapshot it began before it exits) */
    pthread_mutex_lock(&ing->done_mu);
    for (uint32_t i = 0; i < posted; i++)
        while (!cmds[i].done)
            pthread_cond_wait(&ing->done_cv, &ing->done_mu);
    pthread_mutex_unlock(&ing->done_mu);
    for (uint32_t i = 0; i < posted; i++) {
        if (rc == 0)
            rc = cmds[i].rc;
        if (cmds[i].stall_ns > stall)
            stall = cmds[i].stall_ns;
    }
out:
    free(cmds);
    if (stall_ns != NULL)
        *stall_ns = stall;
    return rc;
}

int kvr_ingest_restore_streams(struct kvr_ingest *ing, const struct kvr_ingest_snap_stream *v,
                               size_t n)
{
    pthread_mutex_lock(&ing->life_mu);
    bool started = ing->started;
    pthread_mutex_unlock(&ing->life_mu);
    if (started)
        return -EBUSY;
    for (size_t i = 0; i < n; i++) {
        const struct kvr_ingest_snap_stream *s = &v[i];
        struct writer *w;
        struct ing_restored *e;
        uint32_t wid;
        int rc;

        if (s->pod == NULL || s->model == NULL || s->pod[0] == '\0' ||
            strlen(s->pod) > KVR_NAME_MAX || strlen(s->model) > KVR_NAME_MAX ||
            s->dp_rank >= MAX_DP_RANK)
            return -EINVAL;
        rc = kvr_index_worker_lookup(ing->ix, s->pod, s->dp_rank, &wid);
        if (rc == -ENOENT)
            rc = kvr_index_worker_intern(ing->ix, s->pod, s->dp_rank, &wid);
        if (rc != 0)
            return rc;
        w = &ing->w[kvr_queue_shard(s->pod, strlen(s->pod), ing->nwriters)];
        for (size_t k = 0; k < w->nrestored; k++) {
            e = &w->restored[k];
            if (e->dp_rank == s->dp_rank && strcmp(e->pod, s->pod) == 0 &&
                strcmp(e->model, s->model) == 0)
                return -EINVAL; /* twice the same stream */
        }
        e = realloc(w->restored, (w->nrestored + 1) * sizeof(*e));
        if (e == NULL)
            return -ENOMEM;
        w->restored = e;
        e = &w->restored[w->nrestored];
        memset(e, 0, sizeof(*e));
        e->pod = strdup(s->pod);
        e->model = strdup(s->model);
        if (e->pod == NULL || e->model == NULL) {
            free(e->pod);
            free(e->model);
            return -ENOMEM;
        }
        e->dp_rank = s->dp_rank;
        e->wid = wid;
        e->last_seq = s->last_seq;
        e->unsynced = s->unsynced;
        e->groups_full = s->groups_full;
        e->groups_other = s->groups_other;
        e->pub_id = s->pub_id;
        w->nrestored++;
    }
    return 0;
}

void kvr_ingest_snap_claim(struct writer *w, const struct kvr_queue_topic *t, struct ing_stream *s)
{
    for (size_t i = 0; i < w->nrestored; i++) {
        struct ing_restored *e = &w->restored[i];
        if (e->claimed || e->dp_rank != s->dp_rank || strcmp(e->pod, t->pod) != 0 ||
            strcmp(e->model, t->model) != 0)
            continue;
        kvr_stream_restore_pub(&s->sm, e->last_seq, e->unsynced, e->pub_id);
        s->groups_full = e->groups_full;
        s->groups_other = e->groups_other;
        /* listed from here on as the stream (restored), no longer as the entry: one switch
         * under reg_mu, so a /v1/pods reader never misses it in between */
        pthread_mutex_lock(&w->ing->reg_mu);
        atomic_store_explicit(&s->p_last_seq, e->last_seq, memory_order_release);
        atomic_store_explicit(&s->p_state, (int)KVR_STREAM_RESTORED, memory_order_relaxed);
        atomic_store_explicit(&s->p_has_last, true, memory_order_release);
        e->claimed = true;
        pthread_mutex_unlock(&w->ing->reg_mu);
        kvr_log_info("events: stream pod=%s model=%s dp_rank=%u resumes from the snapshot "
                     "(last seq %llu%s)",
                     t->pod, t->model, s->dp_rank, (unsigned long long)e->last_seq,
                     e->unsynced ? ", unsynced" : "");
        return;
    }
}

void kvr_ingest_snap_forget(struct writer *w, const char *pod)
{
    pthread_mutex_lock(&w->ing->reg_mu);
    for (size_t i = 0; i < w->nrestored; i++)
        if (strcmp(w->restored[i].pod, pod) == 0)
            w->restored[i].claimed = true;
    pthread_mutex_unlock(&w->ing->reg_mu);
}

void kvr_ingest_snap_list(struct kvr_ingest *ing, void (*cb)(const struct kvr_stream_info *s,
                                                               void *arg),
                          void *arg)
{
    for (uint32_t k = 0; k < ing->nwriters; k++) {
        struct writer *w = &ing->w[k];
        for (size_t i = 0; i < w->nrestored; i++) {
            struct ing_restored *e = &w->restored[i];
            struct kvr_stream_info si;
            uint64_t tb[KVR_TIER_MAX];

            if (e->claimed)
                continue;
            memset(&si, 0, sizeof(si));
            si.pod = e->pod;
            si.model = e->model;
            si.dp_rank = e->dp_rank;
            kvr_index_worker_blocks(ing->ix, e->wid, tb);
            for (int t = 0; t < KVR_TIER_MAX; t++) {
                si.tier_blocks[t] = tb[t];
                si.tier_names[t] = kvr_index_tier_name(ing->ix, (uint8_t)t);
                si.blocks += tb[t];
            }
            si.last_seq = e->last_seq;
            si.state = KVR_STREAM_RESTORED;
            si.last_event_age_ms = -1;
            cb(&si, arg);
        }
    }
}

void kvr_ingest_snap_free(struct kvr_ingest *ing)
{
    for (uint32_t k = 0; ing->w != NULL && k < ing->nwriters; k++) {
        struct writer *w = &ing->w[k];
        for (size_t i = 0; i < w->nrestored; i++) {
            free(w->restored[i].pod);
            free(w->restored[i].model);
        }
        free(w->restored);
        w->restored = NULL;
        w->nrestored = 0;
    }
}
