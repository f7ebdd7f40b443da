/* stream.h — the sequence-number state machine of one (topic, dp_rank) event stream.
 *
 * Pure logic: no sockets, no index, no clock, no allocation. The ingest writer that owns the
 * stream feeds it every batch's seq and performs the verdict (apply, drop, buffer, start a
 * replay, purge the worker); the unit tests drive it directly.
 *
 * Model (see stream.c for the rationale):
 * - First contact (no baseline: a stream never seen, or reset; not a restored one): seq 0,
 *   or any seq without a replay endpoint, sets the baseline and is applied; a later seq with
 *   a replay endpoint starts a replay from 0 (the engine's whole history, as far as its ring
 *   still holds it: a ring without seq 0 is a hole, the stream unsynced) and is buffered.
 * - seq == last + 1: applied. seq > last + 1: a gap. With a replay endpoint, a replay from
 *   last + 1 starts and live batches are buffered until it ends; without one, the gap is
 *   counted, the stream becomes unsynced and the batch is applied.
 * - seq <= the last live seq seen: the engine restarted. The worker is purged, the baseline
 *   reset; seq 0 is applied as the new baseline, a later seq starts a replay from 0 when
 *   possible (else it is applied and the stream is unsynced: batches 0..seq-1 were missed).
 * - While replaying: replayed batches are applied in order, those already applied are
 *   dropped (never applied twice). A replayed seq beyond the next expected one is a hole: at
 *   the start of the replay it is the engine's ring that no longer reaches back (applied,
 *   stream unsynced); after the replay's first batch it is batches the ROUTER dropped (vLLM
 *   sends a whole replay in one burst with SNDHWM 1000: a 10,000-batch ring loses some even
 *   on loopback), which are still in the ring, so a new replay from the expected seq starts
 *   (KVR_STREAM_REPLAY; the rest of the old one is stale), at most KVR_STREAM_HOLE_RETRIES
 *   times per gap, after which the hole is applied as above. At the end, the buffered live
 *   batches are handed back in arrival order and pass through the same dedup check; after a
 *   replay that reached the end of the engine's ring (end marker, no hole after its first
 *   batch), a buffered batch beyond the next expected seq is a new gap (batches lost on the
 *   live socket after the engine served the replay) and starts another replay.
 * - Publisher id (vLLM with state snapshots: a random id per publisher lifetime, on every live
 *   batch): a live batch whose id differs from the last id the stream saw is an engine
 *   restart, whatever its seq, handled exactly as a seq that went backwards (purge, new
 *   baseline from this batch). The seq alone misses a restart whose new run got past the old
 *   `last` while kvrouterd was not looking (kvrouterd down, restored from a snapshot; the
 *   subscriber disconnected), which then reads as a gap and keeps the dead run's blocks. A
 *   batch without an id (replies to replay requests; an engine run without snapshots) is
 *   judged by its seq alone and leaves the remembered id as it was: id A, no id, id A is one
 *   run, so a missing id never flaps the stream; id A, no id, id B is a restart at B. A
 *   stream without a baseline (first contact, reset) just learns the id.
 * - Resync: an unsynced stream becomes synced again when AllBlocksCleared is applied (the
 *   worker's blocks are all dropped, so the index no longer misses anything), or on a
 *   re-baseline (restart at seq 0, purge).
 *
 * Threads: a stream belongs to one writer thread.
 */
#ifndef KVR_STREAM_H
#define KVR_STREAM_H

#include <stdbool.h>
#include <stdint.h>


enum kvr_stream_state {
    KVR_STREAM_SYNCED = 0,    /* contiguous since the baseline */
    KVR_STREAM_REPLAYING = 1, /* a gap is being recovered through replay */
    KVR_STREAM_UNSYNCED = 2,  /* a gap could not be recovered; index may miss blocks */
    KVR_STREAM_RESTORED = 3,  /* loaded from a snapshot; no live batch since */
    /* Not produced by kvr_stream_state(): ingest reports them from what the index holds. */
    KVR_STREAM_OVER_BUDGET = 4, /* stores refused by [index] max_memory; resync as unsynced */
    KVR_STREAM_INCOMPLETE = 5,  /* blocks parked as orphans (parent unknown) for its worker */
};
const char *kvr_stream_state_name(enum kvr_stream_state s); /* "synced", ... */

/* Verdict for one batch: an action, plus KVR_STREAM_F_PURGE when the worker's blocks must be
 * purged first (engine restart; buffered batches of the old run are discarded with it). */
enum kvr_stream_action {
    KVR_STREAM_APPLY = 0,  /* apply the batch, then call kvr_stream_applied() */
    KVR_STREAM_DROP = 1,   /* already applied (or a stale replay): drop it */
    KVR_STREAM_BUFFER = 2, /* a replay is running: keep the batch for the drain */
    KVR_STREAM_REPLAY = 3, /* gap: request a replay (replay_from, replay_gen), buffer the batch */
};
#define KVR_STREAM_ACTION_MASK 0x0f
#define KVR_STREAM_F_PURGE 0x10
/* Replays restarted for holes after a replay's first batch, per gap (see above). */
#define KVR_STREAM_HOLE_RETRIES 16

struct kvr_stream {
    bool based;         /* a baseline exists */
    bool has_last;      /* `last` is valid (false right after a restart until seq is applied) */
    uint64_t last;      /* last applied seq */
    uint64_t live_last; /* highest live seq seen in this run (valid when based) */

    bool replaying;
    bool replay_hole;   /* the running replay skipped seqs */
    bool replay_any;    /* the running replay delivered a batch to apply */
    bool replay_mid_hole; /* it skipped seqs after such a batch (the ROUTER dropped some) */
    bool replay_whole;  /* the last replay ended with its end marker and no hole */
    bool replay_tail;   /* it ended with its end marker and no hole after its first batch:
                         * what it served reaches the end of the engine's ring (a hole at
                         * its start is the ring's past, not a loss on the way) */
    uint64_t replay_from;
    uint32_t replay_gen; /* bumped on every replay start/abort: older replay items are stale */
    uint32_t hole_retries; /* replays restarted for a mid-replay hole in this gap */

    bool unsynced;      /* sticky until resync */
    bool restored;      /* from a snapshot, until the first live batch */
    uint64_t pub_id;    /* the engine run's publisher id (kvr_queue_pubid), last seen; 0: none */

    /* counters (monotonic) */
    uint64_t gaps;      /* gaps detected (live or inside a replay) */
    uint64_t replays;   /* replays started */
    uint64_t replays_ok;
    uint64_t replays_failed;
    uint64_t restarts;
    uint64_t pub_restarts;   /* of those, read from a changed publisher id */
    uint64_t first_contacts; /* replays from 0 started at first contact */
    uint64_t hole_replays;   /* replays restarted for a hole the ROUTER left */
    uint64_t duplicates; /* batches dropped as already applied */
    uint64_t stale;      /* replay items of an aborted or finished replay */
};

void kvr_stream_init(struct kvr_stream *s);
/* A stream loaded from a snapshot: based, `last` applied (and the highest live seq seen),
 * unsynced as it was saved. Its first live batch then follows the usual rules: last + 1 is
 * applied, a gap starts a replay from last + 1 (or leaves it unsynced), a seq <= last is an
 * engine restart (purge). State KVR_STREAM_RESTORED until that batch. */
void kvr_stream_restore(struct kvr_stream *s, uint64_t last, bool unsynced);
/* The same with the publisher id the snapshot saved (0: none): a first live batch with
 * another id is then an engine restart, one with the same id or none is judged by its seq. */
void kvr_stream_restore_pub(struct kvr_stream *s, uint64_t last, bool unsynced, uint64_t pub_id);

/* A live batch. can_replay: its source has a replay endpoint and replays may be started
 * (at first contact too: a replay from 0, see above). */
int kvr_stream_on_live(struct kvr_stream *s, uint64_t seq, bool can_replay);
/* A live batch that may carry its publisher's id (pub_id, kvr_queue_pubid; 0: none): a
 * changed id is an engine restart (KVR_STREAM_F_PURGE, see above); otherwise as
 * kvr_stream_on_live. */
int kvr_stream_on_live_pub(struct kvr_stream *s, uint64_t seq, uint64_t pub_id, bool can_replay);
/* A batch returned by replay `gen`: KVR_STREAM_APPLY, KVR_STREAM_DROP, or KVR_STREAM_REPLAY:
 * a hole after the replay's first batch, a new replay (replay_from, replay_gen) has started
 * from the expected seq; drop this batch, request it; the buffered live batches wait on. */
int kvr_stream_on_replay(struct kvr_stream *s, uint32_t gen, uint64_t seq);
/* Replay `gen` finished (ok: end marker received; false: timeout/error). Returns true when
 * it was the current replay: the caller then hands every buffered batch, in arrival order,
 * to kvr_stream_on_buffered(). False for a stale gen (nothing to do). */
bool kvr_stream_on_replay_end(struct kvr_stream *s, uint32_t gen, bool ok);
/* Aborts the running replay (buffer limit, source gone); the caller then drains the buffer
 * through kvr_stream_on_buffered() as after a failed end. */
void kvr_stream_abort_replay(struct kvr_stream *s);
/* A buffered live batch after the replay ended: KVR_STREAM_APPLY or KVR_STREAM_DROP; or,
 * when the replay was complete and this batch is beyond the next expected seq (the live
 * socket lost batches after the engine served the replay: a new gap) and can_replay,
 * KVR_STREAM_REPLAY: a replay from the expected seq has started, and this batch and the
 * ones buffered after it stay buffered for its drain. */
int kvr_stream_on_buffered(struct kvr_stream *s, uint64_t seq, bool can_replay);

/* The batch with this seq was applied to the index. */
void kvr_stream_applied(struct kvr_stream *s, uint64_t seq);
/* An AllBlocksCleared was applied (all tiers of the worker dropped): resync. */
void kvr_stream_cleared(struct kvr_stream *s);
/* The worker was purged from outside (admin, endpoint gone): forget the baseline; the next
 * live batch starts a new one. Counters are kept; a running replay becomes stale. */
void kvr_stream_reset(struct kvr_stream *s);

enum kvr_stream_state kvr_stream_state(const struct kvr_stream *s);

/* Seq the next applied batch must have (valid when based and not right after a restart). */
static inline uint64_t kvr_stream_expected(const struct kvr_stream *s)
{
    return s->has_last ? s->last + 1 : s->replay_from;
}

#endif
