/* ingest_metrics.c — what readers see of ingest: the stream listing (/v1/pods), the
 * unsynced gauge and ingest's /metrics lines, with the names of the skip and bad-batch
 * reasons they are labelled with.
 *
 * Why its own file: reading is a job of its own (any thread, summing per-writer counters
 * and the streams' published fields, under reg_mu only for the registry) with its own
 * contract (the Prometheus families and HELP texts scrapers rely on, checked by
 * test_ingest's metric assertions and the integration tests); it never writes.
 */
#include "events/ingest_int.h"

#include <stdio.h>
#include <string.h>

static const char *const own_skip_names[] = {"no_block_size", "block_size_mismatch", "namespace",
                                             "tier", "index_error", "over_budget"};
_Static_assert(sizeof(own_skip_names) / sizeof(own_skip_names[0]) ==
                   SKIP_COUNT - KVR_SKIP_REASON_COUNT,
               "a name for every skip reason of ours");

/* The states a reader shows, in the order of the per-state gauge. */
static const enum kvr_stream_state shown_states[] = {
    KVR_STREAM_SYNCED,      KVR_STREAM_REPLAYING,  KVR_STREAM_UNSYNCED,
    KVR_STREAM_OVER_BUDGET, KVR_STREAM_INCOMPLETE, KVR_STREAM_RESTORED};
#define NSHOWN (sizeof(shown_states) / sizeof(shown_states[0]))

static const char *const bad_batch_names[BAD_COUNT] = {"decode", "worker", "dp_rank",
                                                       "replay_rank"};

const char *kvr_ingest_skip_name(int r)
{
    return r < KVR_SKIP_REASON_COUNT ? kvr_decode_skip_reason_name((enum kvr_skip_reason)r)
                                     : own_skip_names[r - KVR_SKIP_REASON_COUNT];
}

/* ---- reading ----------------------------------------------------------------------------- */

/* The state machine says whether batches were lost (replaying, unsynced); the writer whether
 * stores were refused (over_budget); the index whether blocks wait for their parent
 * (incomplete). The first that applies is shown: a stream is `synced` (or `restored`) only
 * when the index holds everything its engine announced. */
enum kvr_stream_state kvr_ingest_shown_state(struct kvr_ingest *ing, struct ing_stream *s,
                                             uint32_t *orphans)
{
    enum kvr_stream_state st = (enum kvr_stream_state)KVR_CNT_GET(s->p_state);
    uint32_t o = s->wid != NO_WID ? kvr_index_worker_orphans(ing->ix, s->wid) : 0;

    if (orphans != NULL)
        *orphans = o;
    if (st == KVR_STREAM_REPLAYING || st == KVR_STREAM_UNSYNCED)
        return st;
    if (s->wid == NO_WID) /* forgotten: holds nothing */
        return st;
    if (atomic_load_explicit(&s->p_over_budget, memory_order_relaxed))
        return KVR_STREAM_OVER_BUDGET;
    if (o > 0)
        return KVR_STREAM_INCOMPLETE;
    return st;
}

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
            /* Per-tier counts are distinct blocks; a block in two tiers counts in both.
             * Predictions (ingest_predict.c) are listed but not what the events hold. */
            if (si.tier_names[t] == NULL || strcmp(si.tier_names[t], "predicted") != 0)
                si.blocks += tb[t];
        }
        si.last_seq = atomic_load_explicit(&s->p_last_seq, memory_order_acquire);
        si.gaps = KVR_CNT_GET(s->p_gaps);
        si.replays = KVR_CNT_GET(s->p_replays);
        si.restarts = KVR_CNT_GET(s->p_restarts);
        si.state = kvr_ingest_shown_state(ing, s, &si.orphans);
        si.last_event_age_ms = last > 0 ? now - last : -1;
        cb(&si, arg);
    }
    kvr_ingest_snap_list(ing, cb, arg); /* restored from a snapshot, no batch yet */
    pthread_mutex_unlock(&ing->reg_mu);
}

size_t kvr_ingest_model_workers(struct kvr_ingest *ing, const char *model,
                                void (*cb)(void *arg, const char *pod, uint32_t dp_rank),
                                void *arg)
{
    size_t n = 0;
    pthread_mutex_lock(&ing->reg_mu);
    for (size_t i = 0; i < ing->nstreams; i++) {
        struct ing_stream *s = ing->streams[i];
        if (!atomic_load_explicit(&s->p_has_last, memory_order_acquire) || s->wid == NO_WID ||
            strcmp(s->it->t->model, model) != 0)
            continue;
        cb(arg, s->it->t->pod, s->dp_rank);
        n++;
    }
    pthread_mutex_unlock(&ing->reg_mu);
    return n;
}

uint64_t kvr_ingest_synced(struct kvr_ingest *ing)
{
    uint64_t n = 0;

    pthread_mutex_lock(&ing->reg_mu);
    for (size_t i = 0; i < ing->nstreams; i++)
        if (KVR_CNT_GET(ing->streams[i]->p_state) == KVR_STREAM_SYNCED &&
            atomic_load_explicit(&ing->streams[i]->p_has_last, memory_order_acquire))
            n++;
    pthread_mutex_unlock(&ing->reg_mu);
    return n;
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
    uint64_t st_count[NSHOWN] = {0}, orphans = 0;
    uint64_t rp_streams = 0, rp_wanted = 0, rp_done = 0; /* recovery through replays */
    int64_t now_ms = kvr_now_ms(), oldest = 0; /* the stream with the oldest last batch */
    uint64_t cap = kvr_ingest_max_memory(ing);
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
    kvr_metrics_counter(out, "events_blocks_over_budget_total",
                        "Blocks not indexed because the index was at [index] max_memory", NULL,
                        SUMW(budget_blocks));
    kvr_metrics_gauge(out, "index_max_memory_bytes",
                      "[index] max_memory: index bytes past which stores are refused (0: none)",
                      NULL, (double)cap);
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
    kvr_metrics_counter(out, "events_publisher_restarts_total",
                        "Engine restarts read from a changed publisher id (also counted in "
                        "events_restarts_total)",
                        NULL, SUMW(pub_restarts));
    kvr_metrics_counter(out, "events_blocks_purged_total",
                        "Blocks purged by admin request or endpoint disconnect", NULL,
                        SUMW(purged));
    kvr_metrics_counter(out, "events_pods_forgotten_total",
                        "Pods forgotten (DELETE /v1/pods/{pod}): blocks purged, worker ids freed",
                        NULL, SUMW(pods_forgotten));
    kvr_metrics_counter(out, "events_workers_refused_total",
                        "New workers refused because max_workers workers are indexed (their "
                        "batches are dropped)",
                        NULL, SUMW(workers_refused));
    kvr_metrics_counter(out, "events_buffered_batches_total",
                        "Live batches held back while their stream was replaying", NULL,
                        SUMW(buffered));
    kvr_metrics_counter(out, "events_replay_aborts_total",
                        "Replays abandoned by the writer (buffer limit, no replay, shutdown)",
                        NULL, SUMW(replay_aborts));

    pthread_mutex_lock(&ing->reg_mu);
    for (size_t i = 0; i < ing->nstreams; i++) {
        struct ing_stream *s = ing->streams[i];
        uint32_t o;
        enum kvr_stream_state st = kvr_ingest_shown_state(ing, s, &o);
        gaps += KVR_CNT_GET(s->p_gaps);
        replays += KVR_CNT_GET(s->p_replays);
        restarts += KVR_CNT_GET(s->p_restarts);
        rok += KVR_CNT_GET(s->p_replays_ok);
        rfail += KVR_CNT_GET(s->p_replays_failed);
        for (size_t k = 0; k < NSHOWN; k++)
            if (shown_states[k] == st)
                st_count[k]++;
        orphans += o;
        nstreams++;
        int64_t last = KVR_CNT_GET(s->p_last_ms);
        if (last > 0 && s->wid != NO_WID && now_ms - last > oldest)
            oldest = now_ms - last;
        if (KVR_CNT_GET(s->p_state) == KVR_STREAM_REPLAYING) {
            uint64_t from = KVR_CNT_GET(s->p_replay_from), to = KVR_CNT_GET(s->p_replay_to);
            uint64_t next = atomic_load_explicit(&s->p_has_last, memory_order_acquire)
                                ? atomic_load_explicit(&s->p_last_seq, memory_order_relaxed) + 1
                                : 0;
            rp_streams++;
            if (to > from) {
                rp_wanted += to - from;
                rp_done += next <= from ? 0 : (next < to ? next : to) - from;
            }
        }
    }
    pthread_mutex_unlock(&ing->reg_mu);
    kvr_metrics_counter(out, "events_gaps_total", "Sequence gaps detected", NULL, gaps);
    kvr_metrics_counter(out, "events_restarts_total",
                        "Engine restarts detected (seq went backwards or the publisher id changed)", NULL, restarts);
    kvr_metrics_counter(out, "events_replays_started_total", "Replays requested by streams",
                        NULL, replays);
    kvr_metrics_counter(out, "events_replays_total", "Replays finished, by result",
                        "result=\"ok\"", rok);
    kvr_metrics_counter(out, "events_replays_total", NULL, "result=\"failed\"", rfail);
    for (size_t k = 0; k < NSHOWN; k++) {
        snprintf(lab, sizeof(lab), "state=\"%s\"", kvr_stream_state_name(shown_states[k]));
        kvr_metrics_gauge(out, "events_streams",
                          k == 0 ? "Event streams (topic, dp_rank), by state (as /v1/pods)" : NULL,
                          lab, (double)st_count[k]);
    }
    kvr_metrics_gauge(out, "events_unsynced_streams", "Streams that may miss blocks", NULL,
                      (double)st_count[2]);
    kvr_metrics_gauge(out, "events_oldest_stream_age_seconds",
                      "Time since the last batch of the stream heard from least recently "
                      "(0 = no stream; an idle engine publishes nothing)", NULL,
                      (double)oldest / 1000.0);
    kvr_metrics_gauge(out, "recovery_replay_streams", "Streams replaying now (recovering a gap "
                      "or their history)", NULL, (double)rp_streams);
    kvr_metrics_gauge(out, "recovery_replay_batches_requested",
                      "Batches the running replays have to bring (from each replay's first "
                      "seq to the live batch that revealed its gap)", NULL, (double)rp_wanted);
    kvr_metrics_gauge(out, "recovery_replay_batches_received",
                      "Of those, batches applied so far", NULL, (double)rp_done);
    kvr_metrics_gauge(out, "events_stream_orphans",
                      "Blocks parked as orphans (parent unknown), summed over the streams "
                      "(a worker fed by two topics counts once per topic)",
                      NULL, (double)orphans);

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

    /* approximate mode (ingest_assume.c) */
    kvr_metrics_counter(out, "route_assumptions_total",
                        "Routing decisions to approximate-mode workers, by result", "result=\"applied\"",
                        SUMW(as_applied));
    {
        static const char *const why[AS_SKIP_COUNT] = {"events", "max_workers", "over_budget",
                                                       "index"};
        for (int r = 0; r < AS_SKIP_COUNT; r++) {
            snprintf(lab, sizeof(lab), "result=\"%s\"", why[r]);
            kvr_metrics_counter(out, "route_assumptions_total", NULL, lab,
                                SUMW_AT(as_skipped, r));
        }
    }
    kvr_metrics_counter(out, "route_assumptions_total", NULL, "result=\"queue_full\"",
                        KVR_CNT_GET(ing->assume_full));
    kvr_metrics_counter(out, "route_assumed_blocks_total",
                        "Assumed blocks, by what happened to them (stored: new; refreshed: "
                        "routed again; evicted: past assumed_max_blocks; expired: past "
                        "assumed_ttl; dropped: the worker published events or was forgotten)",
                        "event=\"stored\"", SUMW(as_stored));
    kvr_metrics_counter(out, "route_assumed_blocks_total", NULL, "event=\"refreshed\"",
                        SUMW(as_refreshed));
    kvr_metrics_counter(out, "route_assumed_blocks_total", NULL, "event=\"evicted\"",
                        SUMW(as_evicted));
    kvr_metrics_counter(out, "route_assumed_blocks_total", NULL, "event=\"expired\"",
                        SUMW(as_expired));
    kvr_metrics_counter(out, "route_assumed_blocks_total", NULL, "event=\"dropped\"",
                        SUMW(as_dropped));
    kvr_metrics_counter(out, "route_assumed_pods_forgotten_total",
                        "Pods known only through assumptions, forgotten when their last "
                        "assumption expired (worker ids freed)", NULL, SUMW(as_forgotten));
    kvr_metrics_gauge(out, "route_assumed_blocks", "Blocks assumed now (approximate mode)", NULL,
                      (double)kvr_ingest_assumed_blocks(ing));
    /* predicted entries (ingest_predict.c) */
    kvr_metrics_counter(out, "route_predictions_total",
                        "Decisions to workers with events predicted on them, by result",
                        "result=\"applied\"", SUMW(pr_applied));
    static const char *const pr_why[PR_SKIP_COUNT] = {"no_events", "over_budget", "index"};
    for (int r = 0; r < PR_SKIP_COUNT; r++) {
        snprintf(lab, sizeof(lab), "result=\"skipped\",reason=\"%s\"", pr_why[r]);
        kvr_metrics_counter(out, "route_predictions_total", NULL, lab, SUMW_AT(pr_skipped, r));
    }
    kvr_metrics_counter(out, "route_predictions_total", NULL, "result=\"queue_full\"",
                        KVR_CNT_GET(ing->predict_full));
    kvr_metrics_counter(out, "route_predicted_blocks_total",
                        "Predicted blocks by event (stored: new; refreshed: routed again; "
                        "confirmed: the worker's BlockStored; contradicted: its removal, clear, "
                        "restart or purge; expired: past predicted_ttl; evicted: past "
                        "assumed_max_blocks)",
                        "event=\"stored\"", SUMW(pr_stored));
    kvr_metrics_counter(out, "route_predicted_blocks_total", NULL, "event=\"refreshed\"",
                        SUMW(pr_refreshed));
    kvr_metrics_counter(out, "route_predicted_blocks_total", NULL, "event=\"confirmed\"",
                        SUMW(pr_confirmed));
    kvr_metrics_counter(out, "route_predicted_blocks_total", NULL, "event=\"contradicted\"",
                        SUMW(pr_contradicted));
    kvr_metrics_counter(out, "route_predicted_blocks_total", NULL, "event=\"expired\"",
                        SUMW(pr_expired));
    kvr_metrics_counter(out, "route_predicted_blocks_total", NULL, "event=\"evicted\"",
                        SUMW(pr_evicted));
    kvr_metrics_gauge(out, "route_predicted_blocks", "Blocks predicted now", NULL,
                      (double)kvr_ingest_predicted_blocks(ing));

}
