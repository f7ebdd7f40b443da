/* ingest.h — from event batches to index updates: FNV-1a sharded writer threads, each
 * draining its own queue, per-stream sequence tracking (gaps, replays, restarts), counters.
 *
 * Flow and ownership: ingest owns its writer queues (one per writer thread, created with it,
 * sized by [events] queue_depth) and is their only consumer. Whoever produces batches (zsub
 * in the daemon, the unit tests directly) gets them from kvr_ingest_queues() and pushes
 * struct kvr_queue_msg items (queue_msg.h): payloads are plain (data, len, release, ctx)
 * that the writer releases when done. Ingest never calls the producer's module; what it asks
 * of it (replays) goes through struct kvr_ingest_intake, which main wires (daemon.c adapts
 * zsub to it). Topics in the items belong to the producer: destroy ingest before it.
 *
 * Lifecycle (main thread): create → [set_intake] → start → ... → stop → destroy. Stop the
 * producer first; stop() then closes the queues, drains them (every received batch is
 * applied), joins the threads. destroy() releases the payloads of items never consumed.
 *
 * Threads: after start, the query/admin functions below may be called from any thread (the
 * HTTP loops). Mutations of a pod's blocks (purge) are executed on the writer thread that
 * owns the pod and the call waits for them, so writers stay the only writers of their
 * workers.
 */
#ifndef KVR_INGEST_H
#define KVR_INGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/conf.h"
#include "core/err.h"
#include "index/index.h"
#include "core/metrics.h"
#include "events/queue.h"
#include "events/queue_msg.h"
#include "events/stream.h" /* enum kvr_stream_state */

struct kvr_ingest;

int kvr_ingest_create(const struct kvr_conf *conf, struct kvr_index *ix, struct kvr_ingest **out,
                      struct kvr_err *err);
/* The writer queues, one per writer thread (n of them; n = [events] writer_threads): items
 * of struct kvr_queue_msg. A pod's batches go to queue kvr_queue_shard(pod, len, n). Owned by
 * ingest (valid until destroy); producers borrow them. */
struct kvr_queue *const *kvr_ingest_queues(const struct kvr_ingest *ing, uint32_t *n);

/* What ingest asks of its producer. Every member may be NULL (then: no replays; a gap is
 * counted and the stream becomes unsynced, as without a replay endpoint). */
struct kvr_ingest_intake {
    /* A replay request, from a writer thread; must not block on I/O. Answered by REPLAY items
     * then one REPLAY_END into queue r->shard carrying r->ctx and r->gen. Non-zero: no
     * answer will come (the writer abandons the replay). */
    int (*replay)(void *arg, const struct kvr_queue_replay_req *r);
    /* True while replay requests can be answered (the producer runs). */
    bool (*running)(void *arg);
    /* The writer is done with topic t (its pod was deleted or forgotten), at most once per
     * topic, from the writer thread; must not block on I/O. 0: one KVR_QUEUE_FORGET item for
     * t will follow in t's queue (after everything else for it), whose payload the writer
     * releases once it no longer refers to t. Non-zero (or NULL): t stays the producer's;
     * the writer keeps its state for t. */
    int (*forget)(void *arg, const struct kvr_queue_topic *t);
    void *arg;
};
/* Before start, from the creating thread. */
void kvr_ingest_set_intake(struct kvr_ingest *ing, const struct kvr_ingest_intake *in);

/* Starts the writer threads. */
int kvr_ingest_start(struct kvr_ingest *ing, struct kvr_err *err);
/* Idempotent; safe before start. */
void kvr_ingest_stop(struct kvr_ingest *ing);
void kvr_ingest_destroy(struct kvr_ingest *ing);

/* True once the writer threads run; false again after stop() begins. */
bool kvr_ingest_ready(const struct kvr_ingest *ing);

/* ---- pods / streams ------------------------------------------------------------------ */

/* Forgets the pod on its writer thread and waits: purges every block (all ranks, models,
 * tiers), frees its worker and pod ids in the index (for other pods to reuse) and drops its
 * streams from kvr_ingest_streams(); a later batch from the pod starts it afresh, as a new
 * pod. *removed = (holder, block) pairs dropped. -ENOENT when the pod is not indexed (never
 * seen, or forgotten and silent since). */
int kvr_ingest_purge_pod(struct kvr_ingest *ing, const char *pod, uint64_t *removed);

/* One (topic, dp_rank) stream, joined with its worker's block counts. */
struct kvr_stream_info {
    const char *pod;      /* borrowed for the duration of the callback */
    const char *model;
    uint32_t dp_rank;
    uint64_t blocks;                 /* sum of tier_blocks (a block in two tiers counts twice) */
    uint64_t tier_blocks[KVR_TIER_MAX];
    const char *tier_names[KVR_TIER_MAX]; /* NULL for unused tiers */
    uint64_t last_seq;    /* last batch applied to the index */
    uint64_t gaps;
    uint64_t replays;
    uint64_t restarts;
    enum kvr_stream_state state; /* shown state, first that applies: replaying, unsynced,
                                  * over_budget, incomplete, restored, synced */
    int64_t last_event_age_ms; /* since the last batch was applied */
    uint32_t orphans;     /* blocks of its worker parked as orphans (parent unknown): while
                           * > 0 the index is incomplete for it (state incomplete) */
};
/* A stream is listed once its first batch has been applied; last_seq is published after the
 * batch's index updates (release/acquire), so a caller that sees last_seq >= N and then
 * queries the index sees every batch up to N. */
void kvr_ingest_streams(struct kvr_ingest *ing,
                        void (*cb)(const struct kvr_stream_info *s, void *arg), void *arg);

/* The workers (pod, dp_rank) of a model's streams that have applied a batch and whose pod
 * is not forgotten, for routing candidates: cb under the registry lock (writers take it only
 * to register a new stream). Returns their number. */
size_t kvr_ingest_model_workers(struct kvr_ingest *ing, const char *model,
                                void (*cb)(void *arg, const char *pod, uint32_t dp_rank),
                                void *arg);

/* ---- approximate mode (route.h: engines that publish no KV events) -------------------- */

/* A routing decision to a worker, to be taken as the worker now holding the request's
 * blocks. Strings are NUL-terminated and copied. */
struct kvr_ingest_assumption {
    const char *model;
    const char *lora;        /* NULL = none */
    const char *pod;
    uint32_t dp_rank;
    const uint64_t *content; /* the request's whole blocks' content hashes (score.h) */
    size_t n;
    bool predict;            /* a prediction for a worker with events (below), not an
                              * assumption */
};
/* Hands an assumption to the pod's writer thread without ever waiting (any thread; an HTTP
 * loop calls it): 0 queued, -EAGAIN the writer's queue is full (dropped, counted),
 * -ESHUTDOWN the writers are stopping, -ENOMEM, -EINVAL. Only the first assumed_max_blocks
 * blocks are kept. The writer then, in queue order with the pod's events:
 * - skips it (counted) when the worker has an event stream (or one restored from a
 *   snapshot): real events always take precedence over assumptions;
 * - else assumes the chain (assume.h): blocks already assumed are refreshed, new ones are
 *   stored in the index under the worker's "assumed" tier, and the worker's least recently
 *   routed blocks past assumed_max_blocks are removed.
 * Assumptions expire assumed_ttl after the last decision that routed them, and a worker's
 * first event batch drops all of its assumptions (its events say what it holds). */
int kvr_ingest_assume(struct kvr_ingest *ing, const struct kvr_ingest_assumption *a);
/* [route] assumed_ttl and assumed_max_blocks (reload, any thread): applied by the writers
 * from their next assumption or expiry check. */
void kvr_ingest_set_assume_limits(struct kvr_ingest *ing, int64_t ttl_ms, uint32_t max_blocks);
/* Predicted entries (issue #26; ingest_predict.c): kvr_ingest_assume with predict set, for a
 * decision to a worker that publishes events, when [route] predicted_ttl > 0. Same queueing
 * (a full queue drops it, counted as result="queue_full"). The writer skips it unless the
 * worker has an event stream; else it keeps the chain in a second store (assume.h) and the
 * index's "predicted" tier, refreshed by later decisions, until the worker's events confirm
 * a block (its BlockStored: the block and its ancestors go), contradict one (its removal;
 * a clear, restart, purge or forget drops all of the worker's), or predicted_ttl passes.
 * Scores read the tier as predicted_blocks (score.h). */
void kvr_ingest_set_predict_ttl(struct kvr_ingest *ing, int64_t ttl_ms);
/* Whether predictions are on (predicted_ttl > 0; any thread). */
bool kvr_ingest_predicting(struct kvr_ingest *ing);
/* Blocks predicted now, over all workers (any thread). */
uint64_t kvr_ingest_predicted_blocks(struct kvr_ingest *ing);
/* Called by a writer after it applied a BlockStored of the worker (pod, dp_rank): the
 * stored blocks' content hashes (as score hashes a query's blocks), n >= 1. The hook runs on
 * the writer thread and must be quick (route's prefill confirmations: kvr_route_confirm). */
typedef void (*kvr_ingest_store_hook)(void *arg, const char *pod, uint32_t dp_rank,
                                      const uint64_t *content, size_t n);
/* Before kvr_ingest_start; fn NULL = none. */
void kvr_ingest_set_store_hook(struct kvr_ingest *ing, kvr_ingest_store_hook fn, void *arg);
/* Blocks assumed now, over all workers (any thread). */
uint64_t kvr_ingest_assumed_blocks(struct kvr_ingest *ing);
/* The workers holding assumptions now and how many blocks each (any thread; cb runs under
 * a writer's lock that its writer takes once per assumption: keep it short). */
void kvr_ingest_assumed_workers(struct kvr_ingest *ing,
                                void (*cb)(void *arg, const char *pod, uint32_t dp_rank,
                                           uint64_t blocks),
                                void *arg);

/* ---- the memory cap ([index] max_memory) --------------------------------------------- */

/* A BlockStored is refused (not indexed, skip reason over_budget) when the index's bytes
 * (kvr_index_bytes) plus an estimate of the store would pass the cap; removals and clears
 * always apply. A stream that had a store refused reads over_budget until its worker is
 * emptied (AllBlocksCleared, engine restart, purge, pod forgotten), like unsynced. Any
 * thread (SIGHUP reload); 0 = no cap. Takes effect at the writers' next store. */
void kvr_ingest_set_max_memory(struct kvr_ingest *ing, uint64_t bytes);
uint64_t kvr_ingest_max_memory(const struct kvr_ingest *ing);

/* Number of streams currently unsynced (gauge). */
uint64_t kvr_ingest_unsynced(struct kvr_ingest *ing);
/* Streams synced now (applying batches in order, no replay running; any thread). */
uint64_t kvr_ingest_synced(struct kvr_ingest *ing);

/* Appends ingest's counters, gauges and histograms in Prometheus text form (the producer's
 * own figures, such as zsub's events_messages_total, are its to render). */
void kvr_ingest_metrics(struct kvr_ingest *ing, struct kvr_buf *out);

/* ---- snapshots (the snap module) ------------------------------------------------------ */

/* One stream's state as a snapshot holds it. Strings are borrowed (NUL-terminated). */
struct kvr_ingest_snap_stream {
    const char *pod;
    const char *model;
    uint32_t dp_rank;
    uint64_t last_seq;      /* last batch applied to the index */
    bool unsynced;          /* the index may miss blocks of it */
    uint64_t groups_full;   /* learned hybrid KV-cache groups (bit g: full attention) */
    uint64_t groups_other;  /* bit g: another kind (its removals are not indexed) */
    uint64_t pub_id;        /* the engine run's publisher id (kvr_queue_pubid); 0: none seen */
};

/* Where a snapshot's per-writer parts go. Both are called on writer thread `writer` (or on
 * the caller's thread when the writers do not run), at a batch boundary: first every stream
 * of that writer, then every worker of those streams once (the worker belongs to that
 * writer, so kvr_index_worker_dump(wid) is legal in the callback). Non-zero aborts that
 * writer's part and is returned by kvr_ingest_snapshot(). */
struct kvr_ingest_snap_sink {
    int (*stream)(void *arg, uint32_t writer, const struct kvr_ingest_snap_stream *s);
    int (*worker)(void *arg, uint32_t writer, uint32_t wid, const char *pod, uint32_t dp_rank);
    void *arg;
};

/* Takes every writer's part through sink: a command in each writer queue (behind the batches
 * queued before it), executed by the writer between batches, waited for; readers are never
 * involved. Each part is consistent: a stream's last_seq matches its worker's blocks. The
 * parts of different writers are taken at different moments (each pod is consistent with
 * itself, which is what a restore needs). Streams restored from a snapshot that saw no batch
 * since are included as restored. *stall_ns (may be NULL) = the longest time one writer spent
 * in its part. Any thread but a writer's; serialize calls (the snap module does). 0 or the
 * first sink error, -ESHUTDOWN when the writers are stopping. */
int kvr_ingest_snapshot(struct kvr_ingest *ing, const struct kvr_ingest_snap_sink *sink,
                        uint64_t *stall_ns);

/* Before start (creating thread): the streams of a loaded snapshot, whose workers are already
 * restored into the index. Each is listed by kvr_ingest_streams() in state "restored" until
 * its topic's first batch arrives; then the stream continues from last_seq
 * (kvr_stream_restore: last + 1 → synced, a gap → replay or unsynced, a lower seq → engine
 * restart, purge). Strings are copied. -EBUSY after start, -EINVAL for a bad entry,
 * -ENOMEM. */
int kvr_ingest_restore_streams(struct kvr_ingest *ing, const struct kvr_ingest_snap_stream *v,
                               size_t n);

#endif
