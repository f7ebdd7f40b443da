/* ingest_writer.c — a writer thread's loop: drain its queue, find the item's stream,
 * feed the sequence state machine (stream.c) and act on its verdict: apply (via
 * ingest_apply.c), drop a duplicate, buffer live batches while a replay runs, ask the intake
 * for a replay, drain the buffer when it ends; purges and admin commands; payload release.
 *
 * Why its own file: this is the ordering logic (never apply a batch twice or out of order,
 * bounded buffering, publication of per-stream state to readers) and it has its own tests
 * (test_ingest's replay, purge and restart cases, test_stream for the state machine); the
 * lifecycle and readers stay in ingest.c, the index writes in ingest_apply.c.
 *
 * Threads: everything here runs on the writer thread that owns the item's shard, except
 * that stream_of() registers new streams under ing->reg_mu for the readers.
 *
 * PODS THAT COME AND GO (docs/ingest.md)
 * A pod is forgotten by DELETE /v1/pods/{pod} (kvr_ingest_forget_pod, a command on this
 * thread) or, with [events] forget_after > 0, by the idle sweep of this thread: every topic of
 * the pod without a live batch for forget_after and every worker of it holding no blocks
 * (cleared, or purged after its endpoint disconnected). Forgetting:
 * 1. the index forgets the pod (kvr_index_pod_forget: blocks purged, worker and pod ids freed
 *    for reuse after a grace period);
 * 2. its streams are detached (sequence state reset, unlisted, wid = NO_WID: a batch that
 *    still comes interns the worker again, as a new pod);
 * 3. each of its topics is released to the producer (intake.forget, once per topic), which
 *    drops it from its topic table (max_topics counts live topics) and sends one FORGET item
 *    behind everything queued for it; on that item the topic's streams are unregistered and
 *    freed with the topic's state and record, or, while a replay asked for one of its streams
 *    has not ended (REPLAY items carry the stream), as soon as the last REPLAY_END comes.
 * So topics, streams and worker slots follow the pods alive now, not every pod ever seen.
 */
#include "events/ingest_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- streams ------------------------------------------------------------------------- */

/* The recovery episode's log lines (struct kvr_ingest, replaying): the first stream that
 * starts replaying opens it, the last one that stops closes it with the time taken. */
static void replay_transition(struct kvr_ingest *ing, bool now_replaying)
{
    if (now_replaying) {
        atomic_fetch_add_explicit(&ing->episode_streams, 1, memory_order_relaxed);
        if (atomic_fetch_add_explicit(&ing->replaying, 1, memory_order_relaxed) == 0) {
            uint64_t b = 0;
            for (uint32_t i = 0; i < ing->nwriters; i++)
                b += KVR_CNT_GET(ing->w[i].st.replayed_batches);
            atomic_store_explicit(&ing->episode_batches0, b, memory_order_relaxed);
            atomic_store_explicit(&ing->episode_t0_ms, kvr_now_ms(), memory_order_relaxed);
            kvr_log_info("recovery: replays started (streams catching up through their "
                         "engines' replay endpoints)");
        }
        return;
    }
    if (atomic_fetch_sub_explicit(&ing->replaying, 1, memory_order_relaxed) != 1)
        return;
    uint64_t b = 0, unsynced = 0;
    for (uint32_t i = 0; i < ing->nwriters; i++)
        b += KVR_CNT_GET(ing->w[i].st.replayed_batches);
    pthread_mutex_lock(&ing->reg_mu);
    for (size_t i = 0; i < ing->nstreams; i++)
        unsynced += KVR_CNT_GET(ing->streams[i]->p_state) == KVR_STREAM_UNSYNCED;
    pthread_mutex_unlock(&ing->reg_mu);
    kvr_log_info("recovery: replays finished in %.3f s: %" PRIu64 " streams, %" PRIu64
                 " batches replayed, %" PRIu64 " streams unsynced",
                 (double)(kvr_now_ms() - atomic_load_explicit(&ing->episode_t0_ms,
                                                              memory_order_relaxed)) / 1000.0,
                 atomic_exchange_explicit(&ing->episode_streams, 0, memory_order_relaxed),
                 b - atomic_load_explicit(&ing->episode_batches0, memory_order_relaxed),
                 unsynced);
}

static void publish(struct kvr_ingest *ing, struct ing_stream *s)
{
    int was = atomic_load_explicit(&s->p_state, memory_order_relaxed);
    int st = (int)kvr_stream_state(&s->sm);

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
    atomic_store_explicit(&s->p_state, st, memory_order_relaxed);
    if ((was == KVR_STREAM_REPLAYING) != (st == KVR_STREAM_REPLAYING))
        replay_transition(ing, st == KVR_STREAM_REPLAYING);
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
    it->last_ms = kvr_now_ms();
    w->topics[w->ntopics++] = it;
    mt->owner = it;
    return it;
}

/* The stream's worker id, interned (again, after its pod was forgotten). */
static int stream_intern(struct writer *w, const struct kvr_queue_topic *t, uint32_t dp_rank,
                         uint32_t *wid)
{
    int rc = kvr_index_worker_intern(w->ing->ix, t->pod, dp_rank, wid);
    if (rc == -ENOSPC) {
        KVR_CNT_OWN_INC(w->st.workers_refused);
        kvr_log_limited(&w->ing->rl_bad, KVR_LOG_WARN,
                        "events: worker %s/%u refused: max_workers (%u) workers are indexed; "
                        "its events are dropped until pods are deleted (DELETE /v1/pods/{pod}) "
                        "or forgotten ([events] forget_after)",
                        t->pod, dp_rank, w->ing->conf->max_workers);
    } else if (rc != 0) {
        kvr_log_limited(&w->ing->rl_bad, KVR_LOG_WARN, "events: cannot add worker %s/%u: %s",
                        t->pod, dp_rank, strerror(-rc));
    }
    return rc;
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
    if (dp_rank < it->nranks && it->ranks[dp_rank] != NULL) {
        s = it->ranks[dp_rank];
        if (s->wid != NO_WID)
            return s;
        /* its pod was forgotten: a new worker id, listed again from its next batch */
        if (stream_intern(w, t, dp_rank, &wid) != 0) {
            *bad = BAD_WORKER;
            return NULL;
        }
        pthread_mutex_lock(&ing->reg_mu);
        s->wid = wid;
        pthread_mutex_unlock(&ing->reg_mu);
        kvr_ingest_assume_evented(w, wid); /* events take precedence over assumptions */
        if (ing->intake.forget == NULL) /* nothing was handed back: forgettable again */
            it->releasing = false;
        kvr_log_info("events: stream pod=%s model=%s dp_rank=%u is back (worker %u)", t->pod,
                     t->model, dp_rank, wid);
        return s;
    }
    rc = stream_intern(w, t, dp_rank, &wid);
    if (rc != 0) {
        *bad = BAD_WORKER;
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
    kvr_ingest_assume_evented(w, wid); /* events take precedence over assumptions */
    kvr_ingest_snap_claim(w, t, s); /* resumes from a snapshot when it holds the stream */
    kvr_log_info("events: new stream pod=%s model=%s dp_rank=%u (worker %u)", t->pod, t->model,
                 dp_rank, wid);
    return s;
}

static bool grow_topics(struct ing_topic ***arr, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap * 2 : 16;
    struct ing_topic **p = realloc(*arr, nc * sizeof(*p));
    if (p == NULL)
        return false;
    *arr = p;
    *cap = nc;
    return true;
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

void kvr_ingest_drop_pending(struct ing_stream *s)
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

/* Asks the intake (zsub) for the replay the stream just started (kvr_stream_on_live,
 * on_buffered or on_replay said KVR_STREAM_REPLAY); the stream's buffer holds the batch that
 * revealed the gap (on_replay: the live batches buffered since the first replay started). */
static void request_replay(struct writer *w, struct ing_stream *s, uint64_t seen)
{
    const struct kvr_ingest_intake *in = &w->ing->intake;
    struct kvr_queue_replay_req req = {.source = s->source, .shard = w->idx,
                                       .gen = s->sm.replay_gen, .dp_rank = s->dp_rank,
                                       .start = s->sm.replay_from, .topic = s->it->t, .ctx = s};
    if (s->sm.hole_retries > 0)
        kvr_log_limited(&w->ing->rl_gap, KVR_LOG_INFO,
                        "events: %s/%u: the replay skipped to seq %" PRIu64 " (dropped by the "
                        "engine's ROUTER); replaying again from %" PRIu64 " (attempt %u)",
                        s->it->t->pod, s->dp_rank, seen, s->sm.replay_from,
                        s->sm.hole_retries + 1);
    else if (!s->sm.has_last && s->sm.replay_from == 0 && s->sm.restarts == 0)
        kvr_log_info("events: %s/%u: first seen at seq %" PRIu64 ", replaying its history "
                     "from 0",
                     s->it->t->pod, s->dp_rank, seen);
    else
        kvr_log_info("events: %s/%u: gap before seq %" PRIu64 ", replaying from %" PRIu64,
                     s->it->t->pod, s->dp_rank, seen, s->sm.replay_from);
    /* progress (ingest_metrics.c): from replay_from up to the live batch that revealed the
     * gap (the first one buffered) */
    atomic_store_explicit(&s->p_replay_from, s->sm.replay_from, memory_order_relaxed);
    atomic_store_explicit(&s->p_replay_to, s->npend > 0 ? s->pend[0].seq : seen,
                          memory_order_relaxed);
    if (in->replay == NULL || in->replay(in->arg, &req) != 0)
        abort_replay(w, s, "replay unavailable");
    else
        s->replays_out++; /* one REPLAY_END will come */
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
    uint64_t pub, prev_pub, pub_restarts;

    if (kvr_decode_batch(w->dec, item->payload.data, item->payload.len, &b) != 0) {
        KVR_CNT_OWN_INC(w->st.bad[BAD_DECODE]);
        kvr_log_limited(&w->ing->rl_bad, KVR_LOG_WARN,
                        "events: undecodable batch seq %" PRIu64 " from %s (%zu bytes)",
                        item->seq, item->topic->pod, item->payload.len);
        return;
    }
    s = stream_of(w, item->topic, b.has_dp_rank ? b.dp_rank : 0, &bad);
    if (item->topic->owner != NULL) /* created by stream_of unless out of memory */
        ((struct ing_topic *)item->topic->owner)->last_ms = kvr_now_ms();
    if (s == NULL) {
        KVR_CNT_OWN_INC(w->st.bad[bad]);
        return;
    }
    s->source = item->source;
    s->can_replay = item->can_replay;
    /* The publisher id: in the seq frame (vLLM PR #57789), else a batch's 4th element. */
    pub = item->pubid != 0 ? item->pubid
          : b.pub_id_len > 0 ? kvr_queue_pubid(b.pub_id, b.pub_id_len)
                             : 0;
    prev_pub = s->sm.pub_id;
    pub_restarts = s->sm.pub_restarts;
    v = kvr_stream_on_live_pub(&s->sm, item->seq, pub, stream_can_replay(w, s));
    if (v & KVR_STREAM_F_PURGE) {
        kvr_ingest_drop_pending(s);
        kvr_ingest_clear_worker(w, s, &w->st.restart_purged);
        if (s->sm.pub_restarts != pub_restarts) {
            KVR_CNT_OWN_INC(w->st.pub_restarts);
            kvr_log_info("events: %s/%u restarted (publisher id %016" PRIx64 " -> %016" PRIx64
                         ", seq %" PRIu64 "): its blocks were purged",
                         item->topic->pod, s->dp_rank, prev_pub, pub, item->seq);
        } else {
            kvr_log_info("events: %s/%u restarted (seq %" PRIu64 "): its blocks were purged",
                         item->topic->pod, s->dp_rank, item->seq);
        }
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
    publish(w->ing, s);
}

static void handle_replay(struct writer *w, struct kvr_queue_msg *item)
{
    struct ing_stream *s = item->ctx;
    struct kvr_batch b;
    int v = kvr_stream_on_replay(&s->sm, item->gen, item->seq);

    if (v == KVR_STREAM_REPLAY) {
        /* A hole the ROUTER left mid-replay: ask again from the expected seq. */
        request_replay(w, s, item->seq);
        publish(w->ing, s);
        return;
    }
    if (v != KVR_STREAM_APPLY) {
        if (s->sm.replaying && item->gen == s->sm.replay_gen)
            KVR_CNT_OWN_INC(w->st.dup_batches);
        else
            KVR_CNT_OWN_INC(w->st.stale_items);
        publish(w->ing, s);
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
    publish(w->ing, s);
}

static void reset_stream(struct kvr_ingest *ing, struct ing_stream *s)
{
    kvr_ingest_drop_pending(s);
    kvr_stream_reset(&s->sm);
    publish(ing, s);
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
        reset_stream(w->ing, s);
    }
}

static void detach_stream(struct kvr_ingest *ing, struct ing_stream *s)
{
    reset_stream(ing, s);
    pthread_mutex_lock(&ing->reg_mu);
    s->wid = NO_WID;
    atomic_store_explicit(&s->p_has_last, false, memory_order_release); /* unlisted */
    pthread_mutex_unlock(&ing->reg_mu);
}

/* Hands the topic back to the producer (once): its FORGET item frees our state for it. */
static void release_topic(struct writer *w, struct ing_topic *it)
{
    const struct kvr_ingest_intake *in = &w->ing->intake;

    if (it->releasing)
        return;
    /* without a producer that takes topics back (unit tests), the state stays, but is not
     * released again at every sweep */
    if (in->forget == NULL || in->forget(in->arg, it->t) == 0)
        it->releasing = true;
}

static int forget_pod(struct writer *w, const char *pod, uint64_t *removed, bool log)
{
    struct kvr_ingest *ing = w->ing;
    struct kvr_index_wres res = {0};
    uint32_t pid;
    int rc = -ENOENT;

    if (removed != NULL)
        *removed = 0;
    /* looked up here, on the only thread that interns or forgets this pod: an id looked up
     * elsewhere may be stale (forgotten, then reused by another pod) */
    if (kvr_index_pod_lookup(ing->ix, pod, &pid) == 0) {
        /* its workers' approximate-mode state goes with them (their ids will be reused) */
        uint32_t buf[64], *wids = buf;
        size_t nw = kvr_index_pod_workers(ing->ix, pid, buf, 64);
        if (nw > 64 && (wids = malloc(nw * sizeof(*wids))) != NULL) {
            kvr_index_pod_workers(ing->ix, pid, wids, nw); /* this thread interns them */
        } else if (nw > 64) { /* out of memory: the first 64 */
            wids = buf;
            nw = 64;
        }
        for (size_t k = 0; k < nw; k++)
            kvr_ingest_assume_forgotten(w, wids[k]);
        if (wids != buf)
            free(wids);
        rc = kvr_index_pod_forget(ing->ix, pid, &res);
        if (removed != NULL)
            *removed = res.cleared;
        KVR_CNT_OWN_ADD(w->st.purged, res.cleared);
        if (rc != 0 && rc != -ENOENT)
            return rc;
        if (rc == 0)
            KVR_CNT_OWN_INC(w->st.pods_forgotten);
    }
    kvr_ingest_snap_forget(w, pod); /* its restored streams, if any */
    for (size_t i = 0; i < w->ntopics; i++) {
        struct ing_topic *it = w->topics[i];
        if (strcmp(it->t->pod, pod) != 0)
            continue;
        for (uint32_t r = 0; r < it->nranks; r++)
            if (it->ranks[r] != NULL)
                detach_stream(ing, it->ranks[r]);
        release_topic(w, it);
    }
    if (rc == 0 && log)
        kvr_log_info("events: pod %s forgotten (%" PRIu64 " blocks purged)", pod, res.cleared);
    return rc;
}

int kvr_ingest_forget_pod(struct writer *w, const char *pod, uint64_t *removed)
{
    return forget_pod(w, pod, removed, true);
}

void kvr_ingest_topic_free(struct ing_topic *it)
{
    for (uint32_t r = 0; r < it->nranks; r++) {
        struct ing_stream *s = it->ranks[r];
        if (s == NULL)
            continue;
        kvr_ingest_drop_pending(s);
        free(s->pend);
        free(s);
    }
    free(it->ranks);
    kvr_queue_payload_release(&it->rec);
    free(it);
}

/* A dying topic's state goes once no replay of its streams can still answer. */
static bool topic_try_free(struct writer *w, struct ing_topic *it)
{
    for (uint32_t r = 0; r < it->nranks; r++)
        if (it->ranks[r] != NULL && it->ranks[r]->replays_out > 0)
            return false;
    for (size_t i = 0; i < w->ndying; i++)
        if (w->dying[i] == it) {
            w->dying[i] = w->dying[--w->ndying];
            break;
        }
    kvr_ingest_topic_free(it);
    return true;
}

static void handle_forget(struct writer *w, struct kvr_queue_msg *item)
{
    struct kvr_ingest *ing = w->ing;
    struct kvr_queue_topic *mt = (struct kvr_queue_topic *)item->topic;
    struct ing_topic *it = mt->owner;

    if (it == NULL) { /* never reached this writer's state */
        kvr_queue_payload_release(&item->payload);
        return;
    }
    for (size_t i = 0; i < w->ntopics; i++)
        if (w->topics[i] == it) {
            w->topics[i] = w->topics[--w->ntopics];
            break;
        }
    pthread_mutex_lock(&ing->reg_mu);
    for (uint32_t r = 0; r < it->nranks; r++) {
        struct ing_stream *s = it->ranks[r];
        if (s == NULL)
            continue;
        for (size_t k = 0; k < ing->nstreams; k++)
            if (ing->streams[k] == s) {
                ing->streams[k] = ing->streams[--ing->nstreams];
                break;
            }
    }
    pthread_mutex_unlock(&ing->reg_mu);
    for (uint32_t r = 0; r < it->nranks; r++)
        if (it->ranks[r] != NULL) {
            kvr_ingest_drop_pending(it->ranks[r]);
            kvr_stream_reset(&it->ranks[r]->sm); /* later replay items are stale */
        }
    it->rec = item->payload;
    item->payload = (struct kvr_queue_payload){0};
    it->dying = true;
    if (topic_try_free(w, it))
        return;
    if (grow_topics(&w->dying, &w->capdying, w->ndying + 1))
        w->dying[w->ndying++] = it;
    /* else: out of memory; its last REPLAY_END frees it all the same (it->dying) */
}

static int pod_cmp(const void *a, const void *b)
{
    const struct ing_topic *x = *(struct ing_topic *const *)a, *y = *(struct ing_topic *const *)b;
    return strcmp(x->t->pod, y->t->pod);
}

/* [events] forget_after: forgets the pods whose topics are all idle that long and whose
 * workers hold no blocks. */
static void sweep_idle(struct writer *w)
{
    struct kvr_ingest *ing = w->ing;
    int64_t fa = ing->conf->forget_after_ms, now = kvr_now_ms();
    bool any = false;
    size_t nforgot = 0;

    for (size_t i = 0; i < w->ntopics && !any; i++)
        any = !w->topics[i]->releasing && now - w->topics[i]->last_ms >= fa;
    if (!any)
        return;
    size_t n = 0;
    struct ing_topic **v = malloc(w->ntopics * sizeof(*v));
    if (v == NULL)
        return;
    for (size_t i = 0; i < w->ntopics; i++)
        if (!w->topics[i]->releasing)
            v[n++] = w->topics[i];
    qsort(v, n, sizeof(*v), pod_cmp);
    for (size_t i = 0, j; i < n; i = j) {
        bool idle = true;
        for (j = i; j < n && strcmp(v[j]->t->pod, v[i]->t->pod) == 0; j++) {
            struct ing_topic *it = v[j];
            if (now - it->last_ms < fa)
                idle = false;
            for (uint32_t r = 0; idle && r < it->nranks; r++) {
                struct ing_stream *s = it->ranks[r];
                uint64_t tb[KVR_TIER_MAX];
                if (s == NULL || s->wid == NO_WID)
                    continue;
                kvr_index_worker_blocks(ing->ix, s->wid, tb);
                for (int t = 0; t < KVR_TIER_MAX; t++)
                    idle = idle && tb[t] == 0;
            }
        }
        if (idle) {
            char pod[KVR_NAME_MAX + 1];
            snprintf(pod, sizeof(pod), "%s", v[i]->t->pod); /* v[i] may be released */
            if (forget_pod(w, pod, NULL, false) == 0)
                nforgot++;
        }
    }
    free(v);
    if (nforgot > 0)
        kvr_log_info("events: forgot %zu pod(s) idle for forget_after (%" PRId64 " ms) "
                     "without blocks", nforgot, fa);
}

static void handle_cmd(struct writer *w, struct ing_cmd *c)
{
    struct kvr_ingest *ing = w->ing;

    if (c->type == CMD_SNAPSHOT) { /* completed by its last step (ingest_snap.c) */
        kvr_ingest_snap_begin(w, c);
        return;
    }
    if (c->type == CMD_PURGE_POD)
        c->rc = kvr_ingest_forget_pod(w, c->pod, &c->removed);
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
        if (s->replays_out > 0)
            s->replays_out--;
        if (kvr_stream_on_replay_end(&s->sm, item->gen, item->ok))
            drain(w, s);
        else
            KVR_CNT_OWN_INC(w->st.stale_items);
        publish(w->ing, s);
        if (s->it->dying)
            (void)topic_try_free(w, s->it);
        break;
    }
    case KVR_QUEUE_FORGET:
        handle_forget(w, item);
        break;
    case KVR_QUEUE_PURGE:
        handle_purge(w, item);
        break;
    case KVR_QUEUE_CMD:
        handle_cmd(w, item->ctx);
        break;
    case KVR_QUEUE_ASSUME:
        kvr_ingest_assume_apply(w, &item->payload);
        break;
    default:
        break;
    }
    if (item->kind == KVR_QUEUE_LIVE || item->kind == KVR_QUEUE_REPLAY ||
        item->kind == KVR_QUEUE_ASSUME)
        kvr_queue_payload_release(&item->payload);
}

void *kvr_ingest_writer_main(void *arg)
{
    struct writer *w = arg;

    int64_t fa = w->ing->conf->forget_after_ms;
    /* with forget_after, wake up for the idle sweep: 4 times per forget_after, 10ms..1s */
    int64_t tick = fa <= 0 ? -1 : fa / 4 < 10 ? 10 : fa / 4 > 1000 ? 1000 : fa / 4;

    w->next_sweep = kvr_now_ms() + tick;
    /* workers restored from a snapshot publish events: never assumed */
    for (size_t i = 0; i < w->nrestored; i++)
        kvr_ingest_assume_evented(w, w->restored[i].wid);
    for (;;) {
        /* a snapshot part in progress: do not sleep, take its next step after the items;
         * else sleep until the idle sweep or the next assumption expires */
        int64_t wait = w->snap != NULL ? 0 : tick, aw = kvr_ingest_assume_wait_ms(w);
        if (aw >= 0 && (wait < 0 || aw < wait))
            wait = aw;
        size_t n = kvr_queue_acquire(w->q, ACQUIRE_BATCH, wait);
        if (n == 0 && kvr_queue_closed(w->q) && w->snap == NULL)
            break;
        for (size_t i = 0; i < n; i++)
            handle_item(w, kvr_queue_item(w->q, i));
        if (n > 0)
            kvr_queue_release(w->q, n);
        if (w->snap != NULL)
            kvr_ingest_snap_step(w);
        kvr_ingest_assume_expire(w);
        if (tick > 0 && kvr_now_ms() >= w->next_sweep) {
            sweep_idle(w);
            w->next_sweep = kvr_now_ms() + tick;
        }
    }
    /* Shutdown: replays will not answer any more; apply what was buffered. */
    for (size_t i = 0; i < w->ntopics; i++) {
        struct ing_topic *it = w->topics[i];
        for (uint32_t r = 0; r < it->nranks; r++) {
            struct ing_stream *s = it->ranks[r];
            if (s != NULL && s->sm.replaying) {
                abort_replay(w, s, "shutting down");
                publish(w->ing, s);
            }
        }
    }
    return NULL;
}

