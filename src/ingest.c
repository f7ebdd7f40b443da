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

/* ---- streams ------------------------------------------------------------------------- */

static void publish(struct ing_stream *s)
{
    if (s->sm.has_last) {
        /* release: the index updates of the batches up to `last` happen before a reader
         * that sees this value (the /v1/pods contract: wait for last_seq, then query) */
        atomic_store_explicit(&s->p_last_seq, s->sm.last, memory_order_release);
        atomic_store_explicit(&s->p_has_last, true, memory_order_release);
    }
    atomic_store_explicit(&s->p_gaps, s->sm.gaps, memory_order_relaxed);
    atomic_store_explicit(&s->p_replays, s->sm.replays, memory_order_relaxed);
    atomic_store_explicit(&s->p_replays_ok, s->sm.replays_ok, memory_order_relaxed);
    atomic_store_explicit(&s->p_replays_failed, s->sm.replays_failed, memory_order_relaxed);
    atomic_store_explicit(&s->p_restarts, s->sm.restarts, memory_order_relaxed);
    atomic_store_explicit(&s->p_state, (int)kvr_stream_state(&s->sm), memory_order_relaxed);
}

static struct ing_topic *topic_of(struct writer *w, const struct kvr_queue_topic *t)
{
    struct kvr_queue_topic *mt = (struct kvr_queue_topic *)t; /* owner is ours to write */
    struct ing_topic *it = mt->owner;

    if (it != NULL)
        return it;
    it = calloc(1, sizeof(*it));
    if (it == NULL)
        return NULL;
    if (w->ntopics == w->captopics) {
        size_t nc = w->captopics ? w->captopics * 2 : 16;
        struct ing_topic **p = realloc(w->topics, nc * sizeof(*p));
        if (p == NULL) {
            free(it);
            return NULL;
        }
        w->topics = p;
        w->captopics = nc;
    }
    it->t = t;
    w->topics[w->ntopics++] = it;
    mt->owner = it;
    return it;
}

static struct ing_stream *stream_of(struct writer *w, const struct kvr_queue_topic *t,
                                    uint32_t dp_rank, int *bad)
{
    struct kvr_ingest *ing = w->ing;
    struct ing_topic *it;
    struct ing_stream *s;
    uint32_t wid;
    int rc;

    if (dp_rank >= MAX_DP_RANK) {
        *bad = BAD_DP_RANK;
        return NULL;
    }
    it = topic_of(w, t);
    if (it == NULL) {
        *bad = BAD_WORKER;
        return NULL;
    }
    if (dp_rank < it->nranks && it->ranks[dp_rank] != NULL)
        return it->ranks[dp_rank];
    rc = kvr_index_worker_intern(ing->ix, t->pod, dp_rank, &wid);
    if (rc != 0) {
        *bad = BAD_WORKER;
        kvr_log_limited(&w->ing->rl_bad, KVR_LOG_WARN, "events: cannot add worker %s/%u: %s", t->pod,
                        dp_rank, strerror(-rc));
        return NULL;
    }
    if (dp_rank >= it->nranks) {
        uint32_t nn = dp_rank + 1 < 4 ? 4 : dp_rank + 1;
        struct ing_stream **p = realloc(it->ranks, nn * sizeof(*p));
        if (p == NULL) {
            *bad = BAD_WORKER;
            return NULL;
        }
        memset(p + it->nranks, 0, (nn - it->nranks) * sizeof(*p));
        it->ranks = p;
        it->nranks = nn;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        *bad = BAD_WORKER;
        return NULL;
    }
    kvr_stream_init(&s->sm);
    s->it = it;
    s->dp_rank = dp_rank;
    s->wid = wid;
    pthread_mutex_lock(&ing->reg_mu);
    if (ing->nstreams == ing->capstreams) {
        size_t nc = ing->capstreams ? ing->capstreams * 2 : 32;
        struct ing_stream **p = realloc(ing->streams, nc * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&ing->reg_mu);
            free(s);
            *bad = BAD_WORKER;
            return NULL;
        }
        ing->streams = p;
        ing->capstreams = nc;
    }
    ing->streams[ing->nstreams++] = s;
    pthread_mutex_unlock(&ing->reg_mu);
    it->ranks[dp_rank] = s;
    kvr_log_info("events: new stream pod=%s model=%s dp_rank=%u (worker %u)", t->pod, t->model,
                 dp_rank, wid);
    return s;
}

static void observe_lag(struct writer *w, double ts)
{
    double lag = kvr_wall_s() - ts;
    kvr_hist_observe(&w->ing->lag, lag > 0 ? lag : 0);
}

static void applied(struct writer *w, struct ing_stream *s, uint64_t seq)
{
    kvr_stream_applied(&s->sm, seq);
    atomic_store_explicit(&s->p_last_ms, kvr_now_ms(), memory_order_relaxed);
}

static void drop_pending(struct ing_stream *s)
{
    for (size_t i = 0; i < s->npend; i++)
        kvr_queue_payload_release(&s->pend[i].msg);
    s->npend = 0;
}

static bool stream_can_replay(struct writer *w, const struct ing_stream *s)
{
    const struct kvr_ingest_intake *in = &w->ing->intake;

    return s->can_replay && w->ing->conf->max_concurrent_replays > 0 && in->running != NULL &&
           in->running(in->arg);
}

static void abort_replay(struct writer *w, struct ing_stream *s, const char *why);

/* Asks the intake (zsub) for the replay the stream just started (kvr_stream_on_live/on_buffered said
 * KVR_STREAM_REPLAY); the stream's buffer holds the batch that revealed the gap. */
static void request_replay(struct writer *w, struct ing_stream *s, uint64_t seen)
{
    const struct kvr_ingest_intake *in = &w->ing->intake;
    struct kvr_queue_replay_req req = {.source = s->source, .shard = w->idx,
                                       .gen = s->sm.replay_gen, .start = s->sm.replay_from,
                                       .topic = s->it->t, .ctx = s};
    kvr_log_info("events: %s/%u: gap before seq %" PRIu64 ", replaying from %" PRIu64,
                 s->it->t->pod, s->dp_rank, seen, s->sm.replay_from);
    if (in->replay == NULL || in->replay(in->arg, &req) != 0)
        abort_replay(w, s, "replay unavailable");
}

/* Applies a buffered live batch that kvr_stream_on_buffered() said to apply (decoded again:
 * the decoder moved on meanwhile). */
static void apply_buffered(struct writer *w, struct ing_stream *s, struct pend *p)
{
    struct kvr_batch b;

    if (kvr_decode_batch(w->dec, p->msg.data, p->msg.len, &b) == 0) {
        kvr_ingest_apply_batch(w, s);
        KVR_CNT_OWN_INC(w->st.batches);
        observe_lag(w, b.ts);
    } else {
        KVR_CNT_OWN_INC(w->st.bad[BAD_DECODE]); /* cannot happen: it decoded when buffered */
    }
    applied(w, s, p->seq);
}

/* After a replay ended or was abandoned: the buffered live batches, in arrival order. A new
 * gap among them (lost on the live socket after the engine served the replay) starts
 * another replay: that batch and the ones after it stay buffered for it. */
static void drain(struct writer *w, struct ing_stream *s)
{
    for (size_t i = 0; i < s->npend; i++) {
        int v = kvr_stream_on_buffered(&s->sm, s->pend[i].seq, stream_can_replay(w, s));
        if (v == KVR_STREAM_REPLAY) {
            for (size_t k = 0; i > 0 && i + k < s->npend; k++) { /* keep pend[i..] */
                s->pend[k] = s->pend[i + k];
            }
            s->npend -= i;
            request_replay(w, s, s->pend[0].seq);
            return;
        }
        if (v == KVR_STREAM_APPLY)
            apply_buffered(w, s, &s->pend[i]);
        else
            KVR_CNT_OWN_INC(w->st.dup_batches);
        kvr_queue_payload_release(&s->pend[i].msg);
    }
    s->npend = 0;
    if (s->sm.unsynced)
        kvr_log_limited(&w->ing->rl_gap, KVR_LOG_WARN,
                        "events: %s/%u: replay did not recover every batch; stream unsynced",
                        s->it->t->pod, s->dp_rank);
}

static bool buffer_msg(struct writer *w, struct ing_stream *s, uint64_t seq,
                       struct kvr_queue_payload *m)
{
    uint32_t limit = w->ing->conf->queue_depth ? w->ing->conf->queue_depth : 4096;

    if (s->npend >= limit)
        return false;
    if (s->npend == s->cappend) {
        size_t nc = s->cappend ? s->cappend * 2 : 16;
        struct pend *p = realloc(s->pend, nc * sizeof(*p));
        if (p == NULL)
            return false;
        s->pend = p;
        s->cappend = nc;
    }
    s->pend[s->npend].seq = seq;
    s->pend[s->npend].msg = *m;
    *m = (struct kvr_queue_payload){0}; /* the buffer owns it now */
    s->npend++;
    KVR_CNT_OWN_INC(w->st.buffered);
    return true;
}

static void abort_replay(struct writer *w, struct ing_stream *s, const char *why)
{
    kvr_stream_abort_replay(&s->sm);
    KVR_CNT_OWN_INC(w->st.replay_aborts);
    kvr_log_limited(&w->ing->rl_gap, KVR_LOG_WARN, "events: %s/%u: replay abandoned (%s)",
                    s->it->t->pod, s->dp_rank, why);
    drain(w, s);
}

static void handle_live(struct writer *w, struct kvr_queue_msg *item)
{
    struct kvr_batch b;
    struct ing_stream *s;
    int bad = BAD_WORKER;
    int v;

    if (kvr_decode_batch(w->dec, item->payload.data, item->payload.len, &b) != 0) {
        KVR_CNT_OWN_INC(w->st.bad[BAD_DECODE]);
        kvr_log_limited(&w->ing->rl_bad, KVR_LOG_WARN,
                        "events: undecodable batch seq %" PRIu64 " from %s (%zu bytes)",
                        item->seq, item->topic->pod, item->payload.len);
        return;
    }
    s = stream_of(w, item->topic, b.has_dp_rank ? b.dp_rank : 0, &bad);
    if (s == NULL) {
        KVR_CNT_OWN_INC(w->st.bad[bad]);
        return;
    }
    s->source = item->source;
    s->can_replay = item->can_replay;
    v = kvr_stream_on_live(&s->sm, item->seq, stream_can_replay(w, s));
    if (v & KVR_STREAM_F_PURGE) {
        drop_pending(s);
        kvr_ingest_clear_worker(w, s, &w->st.restart_purged);
        kvr_log_info("events: %s/%u restarted (seq %" PRIu64 "): its blocks were purged",
                     item->topic->pod, s->dp_rank, item->seq);
    }
    switch (v & KVR_STREAM_ACTION_MASK) {
    case KVR_STREAM_APPLY:
        if (s->sm.unsynced && s->sm.has_last && item->seq != s->sm.last + 1)
            kvr_log_limited(&w->ing->rl_gap, KVR_LOG_WARN,
                            "events: %s/%u: gap %" PRIu64 "..%" PRIu64 " without replay; "
                            "stream unsynced",
                            item->topic->pod, s->dp_rank, s->sm.last + 1, item->seq - 1);
        kvr_ingest_apply_batch(w, s);
        applied(w, s, item->seq);
        KVR_CNT_OWN_INC(w->st.batches);
        observe_lag(w, b.ts);
        break;
    case KVR_STREAM_DROP:
        KVR_CNT_OWN_INC(w->st.dup_batches);
        break;
    case KVR_STREAM_REPLAY:
        if (!buffer_msg(w, s, item->seq, &item->payload)) {
            abort_replay(w, s, "out of memory");
            break;
        }
        request_replay(w, s, item->seq);
        break;
    case KVR_STREAM_BUFFER:
        if (!buffer_msg(w, s, item->seq, &item->payload)) {
            /* Apply the buffer, then this batch through the normal path. */
            abort_replay(w, s, "buffer limit reached");
            if (kvr_stream_on_buffered(&s->sm, item->seq, false) == KVR_STREAM_APPLY &&
                kvr_decode_batch(w->dec, item->payload.data, item->payload.len, &b) == 0) {
                kvr_ingest_apply_batch(w, s);
                applied(w, s, item->seq);
                KVR_CNT_OWN_INC(w->st.batches);
                observe_lag(w, b.ts);
            }
        }
        break;
    }
    publish(s);
}

static void handle_replay(struct writer *w, struct kvr_queue_msg *item)
{
    struct ing_stream *s = item->ctx;
    struct kvr_batch b;

    if (kvr_stream_on_replay(&s->sm, item->gen, item->seq) != KVR_STREAM_APPLY) {
        if (s->sm.replaying && item->gen == s->sm.replay_gen)
            KVR_CNT_OWN_INC(w->st.dup_batches);
        else
            KVR_CNT_OWN_INC(w->st.stale_items);
        publish(s);
        return;
    }
    if (kvr_decode_batch(w->dec, item->payload.data, item->payload.len, &b) != 0) {
        /* The engine's own batch is broken: it is lost either way; keep continuity. */
        KVR_CNT_OWN_INC(w->st.bad[BAD_DECODE]);
    } else if ((b.has_dp_rank ? b.dp_rank : 0) != s->dp_rank) {
        KVR_CNT_OWN_INC(w->st.bad[BAD_REPLAY_RANK]);
        kvr_log_limited(&w->ing->rl_bad, KVR_LOG_WARN,
                        "events: replay for %s/%u returned a batch of dp_rank %u: is replay= "
                        "the ROUTER of that rank?",
                        s->it->t->pod, s->dp_rank, b.dp_rank);
    } else {
        kvr_ingest_apply_batch(w, s);
        KVR_CNT_OWN_INC(w->st.replayed_batches);
    }
    applied(w, s, item->seq);
    publish(s);
}

static void reset_stream(struct ing_stream *s)
{
    drop_pending(s);
    kvr_stream_reset(&s->sm);
    publish(s);
}

/* Endpoint gone for purge_after_disconnect: purge the workers this source fed. */
static void handle_purge(struct writer *w, struct kvr_queue_msg *item)
{
    struct ing_topic *it = item->topic->owner;

    if (it == NULL)
        return;
    for (uint32_t r = 0; r < it->nranks; r++) {
        struct ing_stream *s = it->ranks[r];
        if (s == NULL || s->source != item->source)
            continue;
        kvr_ingest_clear_worker(w, s, &w->st.purged);
        reset_stream(s);
    }
}

static void handle_cmd(struct writer *w, struct ing_cmd *c)
{
    struct kvr_ingest *ing = w->ing;
    struct kvr_index_wres res = {0};

    if (c->type == CMD_PURGE_POD) {
        c->rc = kvr_index_purge_pod(ing->ix, c->pod_id, &res);
        c->removed = res.cleared;
        KVR_CNT_OWN_ADD(w->st.purged, res.cleared);
        for (size_t i = 0; i < w->ntopics; i++) {
            struct ing_topic *it = w->topics[i];
            if (strcmp(it->t->pod, c->pod) != 0)
                continue;
            for (uint32_t r = 0; r < it->nranks; r++)
                if (it->ranks[r] != NULL)
                    reset_stream(it->ranks[r]);
        }
    }
    pthread_mutex_lock(&ing->done_mu);
    c->done = true;
    pthread_cond_broadcast(&ing->done_cv);
    pthread_mutex_unlock(&ing->done_mu);
}

static void handle_item(struct writer *w, struct kvr_queue_msg *item)
{
    switch (item->kind) {
    case KVR_QUEUE_LIVE:
        handle_live(w, item);
        break;
    case KVR_QUEUE_REPLAY:
        handle_replay(w, item);
        break;
    case KVR_QUEUE_REPLAY_END: {
        struct ing_stream *s = item->ctx;
        if (kvr_stream_on_replay_end(&s->sm, item->gen, item->ok))
            drain(w, s);
        else
            KVR_CNT_OWN_INC(w->st.stale_items);
        publish(s);
        break;
    }
    case KVR_QUEUE_PURGE:
        handle_purge(w, item);
        break;
    case KVR_QUEUE_CMD:
        handle_cmd(w, item->ctx);
        break;
    default:
        break;
    }
    if (item->kind == KVR_QUEUE_LIVE || item->kind == KVR_QUEUE_REPLAY)
        kvr_queue_payload_release(&item->payload);
}

static void *writer_main(void *arg)
{
    struct writer *w = arg;

    for (;;) {
        size_t n = kvr_queue_acquire(w->q, ACQUIRE_BATCH, -1);
        if (n == 0) {
            if (kvr_queue_closed(w->q))
                break;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            handle_item(w, kvr_queue_item(w->q, i));
        kvr_queue_release(w->q, n);
    }
    /* Shutdown: replays will not answer any more; apply what was buffered. */
    for (size_t i = 0; i < w->ntopics; i++) {
        struct ing_topic *it = w->topics[i];
        for (uint32_t r = 0; r < it->nranks; r++) {
            struct ing_stream *s = it->ranks[r];
            if (s != NULL && s->sm.replaying) {
                abort_replay(w, s, "shutting down");
                publish(s);
            }
        }
    }
    return NULL;
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
        rc = pthread_create(&ing->w[i].th, NULL, writer_main, &ing->w[i]);
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
    drop_pending(s);
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
