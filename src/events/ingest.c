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
 *
 * Files: this one holds the lifecycle (queues, writers, intake) and the admin purge;
 * ingest_writer.c the writer loop (sequence verdicts, replay buffering); ingest_apply.c
 * events → index; ingest_metrics.c the readers (streams, /metrics). They share ingest_int.h.
 */
#include "events/ingest.h"
#include "events/ingest_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "events/decode.h"
#include "index/hash.h"
#include "core/log.h"
#include "events/queue.h"
#include "events/queue_msg.h"
#include "events/stream.h"

/* ---- lifecycle ------------------------------------------------------------------------- */

/* A log limiter with these settings (0 → 10 s / 10 lines), as zsub sets its own. */
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
    kvr_ratelimit_init(&ing->rl_bad, conf->log_ratelimit_ms, conf->log_ratelimit_burst);
    kvr_ratelimit_init(&ing->rl_gap, conf->log_ratelimit_ms, conf->log_ratelimit_burst);
    kvr_ingest_budget_init(ing);
    kvr_ingest_set_assume_limits(ing, conf->route_assumed_ttl_ms, conf->route_assumed_max_blocks);
    kvr_ingest_set_predict_ttl(ing, conf->route_predicted_ttl_ms);
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
        pthread_mutex_init(&w->as_mu, NULL);
        rc = kvr_queue_create(conf->queue_depth ? conf->queue_depth : 4096,
                              sizeof(struct kvr_queue_msg), &w->q);
        if (rc == 0)
            rc = kvr_decode_create(&lim, &w->dec);
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
                if (it->kind == KVR_QUEUE_LIVE || it->kind == KVR_QUEUE_REPLAY ||
                    it->kind == KVR_QUEUE_FORGET || it->kind == KVR_QUEUE_ASSUME)
                    kvr_queue_payload_release(&it->payload);
            }
            kvr_queue_release(w->q, n);
        }
    }
    kvr_ingest_snap_free(ing);
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
        for (size_t k = 0; k < w->ndying; k++) /* forgotten; replays never ended */
            kvr_ingest_topic_free(w->dying[k]);
        free(w->dying);
        kvr_ingest_assume_free(w);
        pthread_mutex_destroy(&w->as_mu);
        free(w->content);
        free(w->blocks);
        free(w->rm);
        kvr_decode_destroy(w->dec);
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
    if (!atomic_load(&ing->writers_running)) /* no writer thread: this is the only one */
        return kvr_ingest_forget_pod(w, pod, removed);
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
