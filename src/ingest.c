/* ingest.c — writer threads: decode batches, track every (topic, dp_rank) stream's seq,
 * apply events to the index, recover gaps through replays, count everything.
 *
 * Pipeline: a producer (zsub's receive thread in the daemon, wired by main; the tests push
 * directly) → one bounded queue per writer, owned by ingest, chosen by kvr_queue_shard(pod) →
 * writer thread: decode (its own kvr_decoder), stream state
 * machine (stream.c), index writes. All workers of a pod are written by one writer thread,
 * which is the index's rule; admin purges are posted into that writer's queue as commands
 * and waited for, so nothing else ever writes those workers.
 *
 * Streams: a stream is (topic, dp_rank); its worker is (pod, dp_rank). dp_rank comes from the
 * batch (0 when absent), so the writer decodes a batch before it knows the stream. Per topic
 * (struct ing_topic, reached through the producer's interned topic's owner pointer: no lookup per
 * batch) the writer keeps streams by rank and a small namespace cache.
 *
 * Replays (ordering per stream): on a gap the stream state machine asks for a replay; the
 * writer posts it through the intake interface (zsub's replay client in the daemon) and from
 * then on *buffers* that stream's live batches (payloads
 * moved, not copied) instead of applying them. Replayed batches arrive through the same
 * writer queue and are applied in seq order (anything at or below the last applied seq is
 * dropped). When the replay ends (end marker, timeout, failure) the buffer is drained in
 * arrival order through the same dedup check, so a batch is never applied twice and never
 * out of order. Other streams of the same writer keep flowing meanwhile. A buffer over
 * queue_depth batches aborts the replay (stream unsynced), bounding memory.
 *
 * AllBlocksCleared clears *all* tiers of the worker (as llm-d does): the GPU reset is what
 * vLLM announces, and dropping the offload tiers too keeps the index a subset of the truth
 * (a missed hit costs a recompute; a false hit costs a wrong routing decision). It also
 * resynchronizes an unsynced stream.
 *
 * Counters are per writer (written by that writer only, relaxed atomics) and summed when
 * rendered; per-stream fields read by kvr_ingest_streams() are published as relaxed atomics
 * after each batch. The stream registry (reg_mu) only grows; streams live until destroy.
 */
#include "ingest.h"
#include "ingest_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "decode.h"
#include "hash.h"
#include "log.h"
#include "queue.h"
#include "queue_msg.h"
#include "stream.h"

static const char *const own_skip_names[] = {"no_block_size", "block_size_mismatch", "namespace",
                                             "tier", "index_error"};

static const char *const bad_batch_names[BAD_COUNT] = {"decode", "worker", "dp_rank",
                                                       "replay_rank"};

const char *kvr_ingest_skip_name(int r)
{
    return r < KVR_SKIP_REASON_COUNT ? kvr_skip_reason_name((enum kvr_skip_reason)r)
                                     : own_skip_names[r - KVR_SKIP_REASON_COUNT];
}

/* ---- lifecycle ------------------------------------------------------------------------- */

/* A log limiter with these settings (0 → 10 s / 10 lines), as zsub sets its own. */
static void ratelimit_init(struct kvr_ratelimit *rl, int64_t interval_ms, uint32_t burst)
{
    atomic_init(&rl->window_start_ms, 0);
    atomic_init(&rl->printed, 0);
    atomic_init(&rl->suppressed, 0);
    rl->interval_ms = interval_ms > 0 ? interval_ms : 10000;
    rl->burst = burst > 0 ? burst : 10;
}

int kvr_ingest_create(const struct kvr_conf *conf, struct kvr_index *ix, struct kvr_ingest **out,
                      struct kvr_err *err)
{
    struct kvr_ingest *ing;
    struct kvr_decode_limits lim;
    int rc;

    ing = calloc(1, sizeof(*ing));
    if (ing == NULL)
        return kvr_err_set(err, -ENOMEM, "out of memory");
    ing->conf = conf;
    ing->ix = ix;
    ing->nwriters = conf->writer_threads ? conf->writer_threads : 2;
    pthread_mutex_init(&ing->reg_mu, NULL);
    pthread_mutex_init(&ing->done_mu, NULL);
    pthread_cond_init(&ing->done_cv, NULL);
    pthread_mutex_init(&ing->life_mu, NULL);
    ratelimit_init(&ing->rl_bad, conf->log_ratelimit_ms, conf->log_ratelimit_burst);
    ratelimit_init(&ing->rl_gap, conf->log_ratelimit_ms, conf->log_ratelimit_burst);
    /* 25 µs .. ~7 s in steps of 1.5x */
    kvr_hist_init_exp(&ing->lag, 25e-6, 1.5, 32);

    ing->w = calloc(ing->nwriters, sizeof(*ing->w));
    ing->queues = calloc(ing->nwriters, sizeof(*ing->queues));
    if (ing->w == NULL || ing->queues == NULL) {
        rc = kvr_err_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    memset(&lim, 0, sizeof(lim));
    lim.max_events = conf->max_events_per_batch ? conf->max_events_per_batch : 65536;
    lim.max_tokens = conf->max_tokens_per_event ? conf->max_tokens_per_event : 1048576;
    lim.max_hashes = lim.max_tokens;
    lim.max_depth = 32;
    for (uint32_t i = 0; i < ing->nwriters; i++) {
        struct writer *w = &ing->w[i];
        w->ing = ing;
        w->idx = i;
        rc = kvr_queue_create(conf->queue_depth ? conf->queue_depth : 4096,
                              sizeof(struct kvr_queue_msg), &w->q);
        if (rc == 0)
            rc = kvr_decoder_create(&lim, &w->dec);
        if (rc != 0) {
            kvr_err_set(err, rc, "events: cannot create writer %u: %s", i, strerror(-rc));
            goto fail;
        }
        ing->queues[i] = w->q;
    }
    *out = ing;
    return 0;
fail:
    kvr_ingest_destroy(ing);
    return rc;
}

struct kvr_queue *const *kvr_ingest_queues(const struct kvr_ingest *ing, uint32_t *n)
{
    *n = ing->nwriters;
    return ing->queues;
}

void kvr_ingest_set_intake(struct kvr_ingest *ing, const struct kvr_ingest_intake *in)
{
    ing->intake = *in;
}

int kvr_ingest_start(struct kvr_ingest *ing, struct kvr_err *err)
{
    int rc;

    pthread_mutex_lock(&ing->life_mu);
    if (ing->started) {
        pthread_mutex_unlock(&ing->life_mu);
        return kvr_err_set(err, -EALREADY, "events: already started");
    }
    ing->started = true;
    pthread_mutex_unlock(&ing->life_mu);

    for (uint32_t i = 0; i < ing->nwriters; i++) {
        rc = pthread_create(&ing->w[i].th, NULL, kvr_ingest_writer_main, &ing->w[i]);
        if (rc != 0) {
            kvr_ingest_stop(ing);
            return kvr_err_set(err, -rc, "events: cannot start writer: %s", strerror(rc));
        }
        ing->w[i].th_started = true;
    }
    atomic_store(&ing->writers_running, true);
    atomic_store(&ing->ready, true);
    return 0;
}

void kvr_ingest_stop(struct kvr_ingest *ing)
{
    pthread_mutex_lock(&ing->life_mu);
    if (ing->stopped || !ing->started) {
        pthread_mutex_unlock(&ing->life_mu);
        return;
    }
    ing->stopped = true;
    pthread_mutex_unlock(&ing->life_mu);

    atomic_store(&ing->ready, false);
    /* The producer was stopped first (main: kvr_zsub_stop); one still pushing gets NULL from
     * kvr_queue_reserve() from here on. */
    for (uint32_t i = 0; i < ing->nwriters; i++)
        kvr_queue_close(ing->w[i].q);
    for (uint32_t i = 0; i < ing->nwriters; i++) {
        if (ing->w[i].th_started) {
            pthread_join(ing->w[i].th, NULL);
            ing->w[i].th_started = false;
        }
    }
    atomic_store(&ing->writers_running, false);
}

static void free_stream(struct ing_stream *s)
{
    kvr_ingest_drop_pending(s);
    free(s->pend);
    free(s);
}

void kvr_ingest_destroy(struct kvr_ingest *ing)
{
    if (ing == NULL)
        return;
    kvr_ingest_stop(ing);
    /* Items never consumed (writers not started) still own payloads. */
    for (uint32_t i = 0; ing->w != NULL && i < ing->nwriters; i++) {
        struct writer *w = &ing->w[i];
        size_t n;
        if (w->q == NULL)
            continue;
        kvr_queue_close(w->q);
        while ((n = kvr_queue_acquire(w->q, ACQUIRE_BATCH, 0)) > 0) {
            for (size_t k = 0; k < n; k++) {
                struct kvr_queue_msg *it = kvr_queue_item(w->q, k);
                if (it->kind == KVR_QUEUE_LIVE || it->kind == KVR_QUEUE_REPLAY)
                    kvr_queue_payload_release(&it->payload);
            }
            kvr_queue_release(w->q, n);
        }
    }
    for (size_t i = 0; i < ing->nstreams; i++)
        free_stream(ing->streams[i]);
    free(ing->streams);
    for (uint32_t i = 0; ing->w != NULL && i < ing->nwriters; i++) {
        struct writer *w = &ing->w[i];
        for (size_t k = 0; k < w->ntopics; k++) {
            free(w->topics[k]->ranks);
            free(w->topics[k]);
        }
        free(w->topics);
        free(w->content);
        free(w->blocks);
        free(w->rm);
        kvr_decoder_destroy(w->dec);
        kvr_queue_destroy(w->q);
    }
    free(ing->w);
    free(ing->queues);
    pthread_mutex_destroy(&ing->reg_mu);
    pthread_cond_destroy(&ing->done_cv);
    pthread_mutex_destroy(&ing->done_mu);
    pthread_mutex_destroy(&ing->life_mu);
    free(ing);
}

bool kvr_ingest_ready(const struct kvr_ingest *ing)
{
    return atomic_load(&((struct kvr_ingest *)ing)->ready);
}

/* ---- admin ------------------------------------------------------------------------------ */

int kvr_ingest_purge_pod(struct kvr_ingest *ing, const char *pod, uint64_t *removed)
{
    struct ing_cmd c = {.type = CMD_PURGE_POD, .pod = pod};
    struct kvr_queue_msg *it;
    struct writer *w;
    int rc;

    if (removed != NULL)
        *removed = 0;
    if (pod == NULL)
        return -EINVAL;
    rc = kvr_index_pod_lookup(ing->ix, pod, &c.pod_id);
    if (rc != 0)
        return -ENOENT;
    w = &ing->w[kvr_queue_shard(pod, strlen(pod), ing->nwriters)];
    if (!atomic_load(&ing->writers_running)) {
        /* No writer thread: this thread is the only writer. */
        struct kvr_index_wres res = {0};
        rc = kvr_index_purge_pod(ing->ix, c.pod_id, &res);
        if (removed != NULL)
            *removed = res.cleared;
        return rc;
    }
    it = kvr_queue_reserve(w->q, NULL);
    if (it == NULL)
        return -ESHUTDOWN;
    it->kind = KVR_QUEUE_CMD;
    it->ctx = &c;
    it->topic = NULL;
    kvr_queue_commit(w->q);
    pthread_mutex_lock(&ing->done_mu);
    while (!c.done)
        pthread_cond_wait(&ing->done_cv, &ing->done_mu);
    pthread_mutex_unlock(&ing->done_mu);
    if (removed != NULL)
        *removed = c.removed;
    return c.rc;
}

/* ---- reading ----------------------------------------------------------------------------- */

void kvr_ingest_streams(struct kvr_ingest *ing,
                        void (*cb)(const struct kvr_stream_info *s, void *arg), void *arg)
{
    int64_t now = kvr_now_ms();

    pthread_mutex_lock(&ing->reg_mu);
    for (size_t i = 0; i < ing->nstreams; i++) {
        struct ing_stream *s = ing->streams[i];
        struct kvr_stream_info si;
        uint64_t tb[KVR_TIER_MAX];
        int64_t last = atomic_load_explicit(&s->p_last_ms, memory_order_relaxed);

        if (!atomic_load_explicit(&s->p_has_last, memory_order_acquire))
            continue; /* registered, first batch not applied yet */
        memset(&si, 0, sizeof(si));
        si.pod = s->it->t->pod;
        si.model = s->it->t->model;
        si.dp_rank = s->dp_rank;
        kvr_index_worker_blocks(ing->ix, s->wid, tb);
        for (int t = 0; t < KVR_TIER_MAX; t++) {
            si.tier_blocks[t] = tb[t];
            si.tier_names[t] = kvr_index_tier_name(ing->ix, (uint8_t)t);
            /* Per-tier counts are distinct blocks; a block in two tiers counts in both. */
            si.blocks += tb[t];
        }
        si.last_seq = atomic_load_explicit(&s->p_last_seq, memory_order_acquire);
        si.gaps = KVR_CNT_GET(s->p_gaps);
        si.replays = KVR_CNT_GET(s->p_replays);
        si.restarts = KVR_CNT_GET(s->p_restarts);
        si.state = (enum kvr_stream_state)KVR_CNT_GET(s->p_state);
        si.last_event_age_ms = last > 0 ? now - last : -1;
        cb(&si, arg);
    }
    pthread_mutex_unlock(&ing->reg_mu);
}

uint64_t kvr_ingest_unsynced(struct kvr_ingest *ing)
{
    uint64_t n = 0;

    pthread_mutex_lock(&ing->reg_mu);
    for (size_t i = 0; i < ing->nstreams; i++)
        if (KVR_CNT_GET(ing->streams[i]->p_state) == KVR_STREAM_UNSYNCED)
            n++;
    pthread_mutex_unlock(&ing->reg_mu);
    return n;
}

/* Sum of one per-writer counter (at byte offset off in struct writer_stats). */
static uint64_t sumw(const struct kvr_ingest *ing, size_t off)
{
    uint64_t s = 0;
    for (uint32_t i = 0; i < ing->nwriters; i++)
        s += KVR_CNT_GET(*(_Atomic uint64_t *)((char *)&ing->w[i].st + off));
    return s;
}
#define SUMW(field) sumw(ing, offsetof(struct writer_stats, field))
#define SUMW_AT(field, i) \
    sumw(ing, offsetof(struct writer_stats, field) + (size_t)(i) * sizeof(_Atomic uint64_t))

void kvr_ingest_metrics(struct kvr_ingest *ing, struct kvr_buf *out)
{
    char lab[128];
    uint64_t gaps = 0, replays = 0, restarts = 0, rok = 0, rfail = 0, nstreams = 0;
    uint64_t st_count[3] = {0, 0, 0};
    uint64_t waits = 0;

    kvr_metrics_counter(out, "events_batches_total", "Live batches applied to the index", NULL,
                        SUMW(batches));
    kvr_metrics_counter(out, "events_replayed_batches_total",
                        "Batches recovered through replay and applied", NULL,
                        SUMW(replayed_batches));
    kvr_metrics_counter(out, "events_duplicate_batches_total",
                        "Batches dropped because they were already applied", NULL,
                        SUMW(dup_batches));
    kvr_metrics_counter(out, "events_stale_replay_items_total",
                        "Replay replies for an abandoned or finished replay", NULL,
                        SUMW(stale_items));
    for (int r = 0; r < BAD_COUNT; r++) {
        snprintf(lab, sizeof(lab), "reason=\"%s\"", bad_batch_names[r]);
        kvr_metrics_counter(out, "events_bad_batches_total",
                            r == 0 ? "Batches not applied at all, by reason" : NULL, lab,
                            SUMW_AT(bad, r));
    }
    {
        static const char *const tn[4] = {NULL, "BlockStored", "BlockRemoved", "AllBlocksCleared"};
        for (int t = 1; t <= 3; t++) {
            snprintf(lab, sizeof(lab), "type=\"%s\"", tn[t]);
            kvr_metrics_counter(out, "events_total", t == 1 ? "Events applied, by type" : NULL,
                                lab, SUMW_AT(events, t));
        }
    }
    for (int r = 1; r < SKIP_COUNT; r++) {
        snprintf(lab, sizeof(lab), "reason=\"%s\"", kvr_ingest_skip_name(r));
        kvr_metrics_counter(out, "events_skipped_total",
                            r == 1 ? "Events skipped (rest of their batch applied), by reason"
                                   : NULL,
                            lab, SUMW_AT(skipped, r));
    }
    kvr_metrics_counter(out, "events_filtered_groups_total",
                        "Events of non-full-attention KV-cache groups filtered out", NULL,
                        SUMW_AT(skipped, KVR_SKIP_GROUP));
    kvr_metrics_counter(out, "events_blocks_stored_total", "New (holder, block) pairs indexed",
                        NULL, SUMW(stored));
    kvr_metrics_counter(out, "events_blocks_removed_total",
                        "(holder, block) pairs whose last copy was removed", NULL, SUMW(removed));
    kvr_metrics_counter(out, "events_blocks_duplicate_total",
                        "Stores of a block the holder already had (reference counted)", NULL,
                        SUMW(dup_blocks));
    kvr_metrics_counter(out, "events_blocks_orphaned_total",
                        "Blocks parked because their parent was unknown", NULL, SUMW(orphaned));
    kvr_metrics_counter(out, "events_orphans_adopted_total",
                        "Parked blocks indexed once their parent arrived", NULL, SUMW(adopted));
    kvr_metrics_counter(out, "events_orphans_dropped_total",
                        "Parked blocks dropped (capacity or removal)", NULL,
                        SUMW(orphans_dropped));
    kvr_metrics_counter(out, "events_unknown_removes_total",
                        "BlockRemoved for a block the holder did not have", NULL,
                        SUMW(unknown_removes));
    kvr_metrics_counter(out, "events_blocks_cleared_total",
                        "Blocks dropped by AllBlocksCleared", NULL, SUMW(cleared));
    kvr_metrics_counter(out, "events_blocks_restart_purged_total",
                        "Blocks purged because their engine restarted", NULL,
                        SUMW(restart_purged));
    kvr_metrics_counter(out, "events_blocks_purged_total",
                        "Blocks purged by admin request or endpoint disconnect", NULL,
                        SUMW(purged));
    kvr_metrics_counter(out, "events_buffered_batches_total",
                        "Live batches held back while their stream was replaying", NULL,
                        SUMW(buffered));
    kvr_metrics_counter(out, "events_replay_aborts_total",
                        "Replays abandoned by the writer (buffer limit, no replay, shutdown)",
                        NULL, SUMW(replay_aborts));

    pthread_mutex_lock(&ing->reg_mu);
    for (size_t i = 0; i < ing->nstreams; i++) {
        struct ing_stream *s = ing->streams[i];
        int st = KVR_CNT_GET(s->p_state);
        gaps += KVR_CNT_GET(s->p_gaps);
        replays += KVR_CNT_GET(s->p_replays);
        restarts += KVR_CNT_GET(s->p_restarts);
        rok += KVR_CNT_GET(s->p_replays_ok);
        rfail += KVR_CNT_GET(s->p_replays_failed);
        if (st >= 0 && st < 3)
            st_count[st]++;
        nstreams++;
    }
    pthread_mutex_unlock(&ing->reg_mu);
    kvr_metrics_counter(out, "events_gaps_total", "Sequence gaps detected", NULL, gaps);
    kvr_metrics_counter(out, "events_restarts_total",
                        "Engine restarts detected (seq went backwards)", NULL, restarts);
    kvr_metrics_counter(out, "events_replays_started_total", "Replays requested by streams",
                        NULL, replays);
    kvr_metrics_counter(out, "events_replays_total", "Replays finished, by result",
                        "result=\"ok\"", rok);
    kvr_metrics_counter(out, "events_replays_total", NULL, "result=\"failed\"", rfail);
    kvr_metrics_gauge(out, "events_streams", "Event streams (topic, dp_rank), by state",
                      "state=\"synced\"", (double)st_count[0]);
    kvr_metrics_gauge(out, "events_streams", NULL, "state=\"replaying\"", (double)st_count[1]);
    kvr_metrics_gauge(out, "events_streams", NULL, "state=\"unsynced\"", (double)st_count[2]);
    kvr_metrics_gauge(out, "events_unsynced_streams", "Streams that may miss blocks", NULL,
                      (double)st_count[2]);

    /* Prometheus wants the samples of one family together: one loop per family. */
    for (uint32_t i = 0; i < ing->nwriters; i++) {
        struct kvr_queue_stats qs;
        kvr_queue_stats(ing->w[i].q, &qs);
        snprintf(lab, sizeof(lab), "writer=\"%u\"", i);
        kvr_metrics_gauge(out, "events_queue_depth",
                          i == 0 ? "Messages waiting in a writer queue" : NULL, lab,
                          (double)qs.depth);
        waits += qs.waits;
    }
    for (uint32_t i = 0; i < ing->nwriters; i++) {
        struct kvr_queue_stats qs;
        kvr_queue_stats(ing->w[i].q, &qs);
        snprintf(lab, sizeof(lab), "writer=\"%u\"", i);
        kvr_metrics_gauge(out, "events_queue_max_depth",
                          i == 0 ? "High-water mark of a writer queue" : NULL, lab,
                          (double)qs.max_depth);
    }
    kvr_metrics_gauge(out, "events_queue_capacity", "Slots per writer queue", NULL,
                      (double)(ing->conf->queue_depth ? ing->conf->queue_depth : 4096));
    kvr_metrics_counter(out, "events_queue_waits_total",
                        "Hand-offs that found a writer queue full and waited", NULL, waits);
    kvr_metrics_hist(out, "events_lag_seconds",
                     "Time from the engine's batch timestamp to the batch being applied", NULL,
                     &ing->lag);

}
