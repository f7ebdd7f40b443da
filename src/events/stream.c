/* stream.c — per-stream seq tracking: baseline, gaps, replays, restarts, resync.
 *
 * Two positions are kept: `last`, the last seq applied to the index, and `live_last`, the
 * highest seq seen on the live socket in the current engine run. They are equal except while
 * a replay runs (live batches are then buffered, not applied). Restart detection compares a
 * live seq with `live_last`, not with `last`: during a replay the live stream is ahead of
 * what was applied, and a restarted engine's seq 0.. must not be mistaken for a duplicate.
 *
 * Never applying a batch twice: every applied seq passes through on_live/on_replay/
 * on_buffered, which only answer APPLY for exactly `last + 1` (or, for holes, for a seq above
 * it: a hole is counted and marks the stream unsynced, but what is there is applied). A
 * replay overlaps with the buffered live batches by design (the engine's ring holds
 * everything up to the moment it served us), and the overlap is dropped as duplicates.
 *
 * Invariants: replaying ⇒ based. !has_last ⇒ (replaying or the next verdict is APPLY).
 * Threads: one writer thread per stream.
 */
#include "events/stream.h"

#include <string.h>

const char *kvr_stream_state_name(enum kvr_stream_state s)
{
    switch (s) {
    case KVR_STREAM_SYNCED:
        return "synced";
    case KVR_STREAM_REPLAYING:
        return "replaying";
    case KVR_STREAM_UNSYNCED:
        return "unsynced";
    case KVR_STREAM_RESTORED:
        return "restored";
    case KVR_STREAM_OVER_BUDGET:
        return "over_budget";
    case KVR_STREAM_INCOMPLETE:
        return "incomplete";
    }
    return "?";
}

void kvr_stream_init(struct kvr_stream *s)
{
    memset(s, 0, sizeof(*s));
}

static int start_replay(struct kvr_stream *s, uint64_t from)
{
    if (!s->replaying)
        s->hole_retries = 0; /* a new gap; a restart for a hole keeps counting */
    s->replaying = true;
    s->replay_hole = false;
    s->replay_any = false;
    s->replay_mid_hole = false;
    s->replay_whole = false;
    s->replay_tail = false;
    s->replay_from = from;
    s->replay_gen++;
    s->replays++;
    return KVR_STREAM_REPLAY;
}

void kvr_stream_restore(struct kvr_stream *s, uint64_t last, bool unsynced)
{
    kvr_stream_init(s);
    s->based = true;
    s->has_last = true;
    s->last = last;
    s->live_last = last;
    s->unsynced = unsynced;
    s->restored = true;
}

void kvr_stream_restore_pub(struct kvr_stream *s, uint64_t last, bool unsynced, uint64_t pub_id)
{
    kvr_stream_restore(s, last, unsynced);
    s->pub_id = pub_id;
}

/* The engine restarted (vLLM sends no clear at start-up): a new baseline from this batch,
 * with the worker purged first. */
static int restart(struct kvr_stream *s, uint64_t seq, bool can_replay)
{
    s->restarts++;
    if (s->replaying) {
        s->replaying = false;
        s->replay_gen++; /* items of the old run's replay become stale */
    }
    s->unsynced = false;
    s->has_last = false;
    s->live_last = seq;
    if (seq == 0)
        return KVR_STREAM_APPLY | KVR_STREAM_F_PURGE;
    s->gaps++; /* batches 0..seq-1 of the new run were missed */
    if (can_replay)
        return start_replay(s, 0) | KVR_STREAM_F_PURGE;
    s->unsynced = true;
    return KVR_STREAM_APPLY | KVR_STREAM_F_PURGE;
}

int kvr_stream_on_live_pub(struct kvr_stream *s, uint64_t seq, uint64_t pub_id, bool can_replay)
{
    bool changed = pub_id != 0 && s->pub_id != 0 && pub_id != s->pub_id && s->based;

    if (pub_id != 0)
        s->pub_id = pub_id;
    if (!changed)
        return kvr_stream_on_live(s, seq, can_replay);
    s->restored = false;
    s->pub_restarts++;
    return restart(s, seq, can_replay);
}

int kvr_stream_on_live(struct kvr_stream *s, uint64_t seq, bool can_replay)
{
    uint64_t expected;

    s->restored = false;

    if (!s->based) {
        /* First contact (a stream never seen, or reset): with a replay endpoint, a stream
         * that did not start at seq 0 asks for the engine's history from 0 (vLLM's ring keeps
         * the last buffer_steps batches: a young engine's whole life); the live batch is
         * buffered. A ring that lost seq 0 shows as a hole in that replay (unsynced). Without
         * a replay endpoint this batch is the baseline: what came before is unknown. */
        s->based = true;
        s->has_last = false;
        s->live_last = seq;
        if (seq > 0 && can_replay) {
            s->first_contacts++;
            return start_replay(s, 0);
        }
        return KVR_STREAM_APPLY;
    }
    if (seq <= s->live_last) /* seq went backwards: the engine restarted */
        return restart(s, seq, can_replay);
    s->live_last = seq;
    if (s->replaying)
        return KVR_STREAM_BUFFER;
    expected = kvr_stream_expected(s);
    if (seq == expected)
        return KVR_STREAM_APPLY;
    if (seq < expected) {
        /* Cannot happen with live_last == last; kept as a guard against double apply. */
        s->duplicates++;
        return KVR_STREAM_DROP;
    }
    s->gaps++;
    if (can_replay)
        return start_replay(s, expected);
    s->unsynced = true;
    return KVR_STREAM_APPLY;
}

int kvr_stream_on_replay(struct kvr_stream *s, uint32_t gen, uint64_t seq)
{
    uint64_t expected;

    if (!s->replaying || gen != s->replay_gen) {
        s->stale++;
        return KVR_STREAM_DROP;
    }
    expected = kvr_stream_expected(s);
    if (seq < expected) {
        s->duplicates++;
        return KVR_STREAM_DROP;
    }
    if (seq > expected && s->replay_any && s->hole_retries < KVR_STREAM_HOLE_RETRIES) {
        /* After the replay's first batch: the ROUTER dropped expected..seq-1 (its burst
         * overran SNDHWM); the engine's ring still has them. Ask again from there. */
        s->gaps++;
        s->hole_retries++;
        s->hole_replays++;
        return start_replay(s, expected);
    }
    if (seq > expected) {
        /* The engine's ring no longer holds expected..seq-1 (or the ROUTER keeps dropping
         * them): that part is lost. Apply what follows; the stream stays unsynced. */
        s->gaps++;
        s->replay_hole = true;
        if (s->replay_any)
            s->replay_mid_hole = true;
        s->unsynced = true;
    }
    s->replay_any = true;
    return KVR_STREAM_APPLY;
}

bool kvr_stream_on_replay_end(struct kvr_stream *s, uint32_t gen, bool ok)
{
    if (!s->replaying || gen != s->replay_gen) {
        s->stale++;
        return false;
    }
    s->replaying = false;
    s->replay_whole = ok && !s->replay_hole;
    s->replay_tail = ok && !s->replay_mid_hole;
    if (s->replay_whole)
        s->replays_ok++;
    else
        s->replays_failed++;
    return true;
}

void kvr_stream_abort_replay(struct kvr_stream *s)
{
    if (!s->replaying)
        return;
    s->replaying = false;
    s->replay_gen++;
    s->replays_failed++;
}

int kvr_stream_on_buffered(struct kvr_stream *s, uint64_t seq, bool can_replay)
{
    uint64_t expected = kvr_stream_expected(s);

    if (s->has_last && seq <= s->last) {
        s->duplicates++;
        return KVR_STREAM_DROP;
    }
    if (seq > expected) {
        if (s->replay_tail) {
            /* The replay reached the end of the engine's ring, so these batches were lost on
             * the live socket after the engine served it: a new gap. (A hole at the start of
             * the replay, the ring's lost past, is no reason to doubt its end.) */
            s->gaps++;
            s->replay_whole = false;
            s->replay_tail = false;
            if (can_replay)
                return start_replay(s, expected);
        }
        /* Otherwise the replay did not cover this part of its gap (failed, timed out, the
         * ROUTER dropped batches), which was counted when detected. */
        s->unsynced = true;
    }
    return KVR_STREAM_APPLY;
}

void kvr_stream_applied(struct kvr_stream *s, uint64_t seq)
{
    s->has_last = true;
    s->last = seq;
    if (!s->replaying && seq > s->live_last)
        s->live_last = seq;
}

void kvr_stream_cleared(struct kvr_stream *s)
{
    s->unsynced = false;
}

void kvr_stream_reset(struct kvr_stream *s)
{
    s->based = false;
    s->has_last = false;
    if (s->replaying) {
        s->replaying = false;
        s->replay_gen++;
    }
    s->replay_hole = false;
    s->unsynced = false;
    s->restored = false;
}

enum kvr_stream_state kvr_stream_state(const struct kvr_stream *s)
{
    if (s->replaying)
        return KVR_STREAM_REPLAYING;
    if (s->unsynced)
        return KVR_STREAM_UNSYNCED;
    if (s->restored)
        return KVR_STREAM_RESTORED;
    return KVR_STREAM_SYNCED;
}
