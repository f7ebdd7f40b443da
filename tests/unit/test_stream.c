/* test_stream.c — the pure per-stream seq state machine (src/events/stream.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "events/stream.h"

#define ACT(v) ((v) & KVR_STREAM_ACTION_MASK)

/* Feeds a live batch; applies it when told to (as the writer does). */
static int live(struct kvr_stream *s, uint64_t seq, bool can_replay)
{
    int v = kvr_stream_on_live(s, seq, can_replay);
    if (ACT(v) == KVR_STREAM_APPLY)
        kvr_stream_applied(s, seq);
    return v;
}

/* A stream loaded from a snapshot: its first live batch continues, starts a replay for the
 * batches missed while the daemon was down, or is an engine restart (purge). */
static void test_restored(void **state)
{
    struct kvr_stream s;
    (void)state;
    kvr_stream_restore(&s, 100, false);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_RESTORED);
    assert_int_equal(kvr_stream_expected(&s), 101);
    assert_int_equal(live(&s, 101, true), KVR_STREAM_APPLY);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);

    kvr_stream_restore(&s, 100, false);
    assert_int_equal(kvr_stream_on_live(&s, 150, true), KVR_STREAM_REPLAY);
    assert_int_equal(s.replay_from, 101);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_REPLAYING);

    kvr_stream_restore(&s, 100, false);
    assert_int_equal(live(&s, 150, false), KVR_STREAM_APPLY); /* no replay: unsynced */
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);

    kvr_stream_restore(&s, 100, false);
    assert_int_equal(live(&s, 0, true), KVR_STREAM_APPLY | KVR_STREAM_F_PURGE);
    assert_int_equal(s.restarts, 1);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);

    kvr_stream_restore(&s, 100, true); /* saved unsynced stays unsynced */
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    assert_int_equal(live(&s, 101, true), KVR_STREAM_APPLY);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
}

static int live_pub(struct kvr_stream *s, uint64_t seq, uint64_t pub, bool can_replay)
{
    int v = kvr_stream_on_live_pub(s, seq, pub, can_replay);
    if (ACT(v) == KVR_STREAM_APPLY)
        kvr_stream_applied(s, seq);
    return v;
}

/* vLLM's snapshot publishers send an id per engine run: a changed id is a restart even when
 * the new run's seq is past the old `last` (which the seq alone reads as a gap); a batch
 * without an id (a replay reply, an engine without snapshots) never flaps the stream. */
static void test_publisher_id(void **state)
{
    struct kvr_stream s;
    (void)state;

    kvr_stream_init(&s);
    assert_int_equal(live_pub(&s, 0, 0xa, true), KVR_STREAM_APPLY); /* first contact learns it */
    assert_int_equal(s.pub_id, 0xa);
    assert_int_equal(live_pub(&s, 1, 0xa, true), KVR_STREAM_APPLY);
    assert_int_equal(live_pub(&s, 2, 0, true), KVR_STREAM_APPLY);    /* no id: same run */
    assert_int_equal(s.pub_id, 0xa);
    assert_int_equal(live_pub(&s, 3, 0xa, true), KVR_STREAM_APPLY);  /* no flap back */
    assert_int_equal(s.restarts, 0);

    /* a new run whose seq went past ours: the seq alone says gap (replay from 4) */
    assert_int_equal(live_pub(&s, 9, 0xb, false), KVR_STREAM_APPLY | KVR_STREAM_F_PURGE);
    assert_int_equal(s.restarts, 1);
    assert_int_equal(s.pub_restarts, 1);
    assert_int_equal(s.pub_id, 0xb);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED); /* 0..8 of the run missed */
    assert_int_equal(live_pub(&s, 10, 0xb, false), KVR_STREAM_APPLY);

    /* with a replay endpoint: purge and a replay from 0 of the new run */
    assert_int_equal(live_pub(&s, 20, 0xc, true), KVR_STREAM_REPLAY | KVR_STREAM_F_PURGE);
    assert_int_equal(s.replay_from, 0);
    assert_int_equal(s.pub_restarts, 2);

    /* a new run caught at seq 0: one restart, not two (id and seq agree) */
    kvr_stream_init(&s);
    assert_int_equal(live_pub(&s, 0, 0xa, true), KVR_STREAM_APPLY);
    assert_int_equal(live_pub(&s, 1, 0xa, true), KVR_STREAM_APPLY);
    assert_int_equal(live_pub(&s, 0, 0xb, true), KVR_STREAM_APPLY | KVR_STREAM_F_PURGE);
    assert_int_equal(s.restarts, 1);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);

    /* id A, none, id B: a restart at B */
    kvr_stream_init(&s);
    assert_int_equal(live_pub(&s, 0, 0xa, true), KVR_STREAM_APPLY);
    assert_int_equal(live_pub(&s, 1, 0, true), KVR_STREAM_APPLY);
    assert_int_equal(live_pub(&s, 2, 0xb, false), KVR_STREAM_APPLY | KVR_STREAM_F_PURGE);
    assert_int_equal(s.pub_restarts, 1);

    /* restored from a snapshot with the id: the same run continues, another one restarts */
    kvr_stream_restore_pub(&s, 100, false, 0xa);
    assert_int_equal(live_pub(&s, 101, 0xa, true), KVR_STREAM_APPLY);
    assert_int_equal(s.restarts, 0);
    kvr_stream_restore_pub(&s, 100, false, 0xa);
    assert_int_equal(live_pub(&s, 101, 0xb, false), KVR_STREAM_APPLY | KVR_STREAM_F_PURGE);
    assert_int_equal(s.restarts, 1);
    /* a snapshot without one (older kvrouterd) learns it from the first batch */
    kvr_stream_restore_pub(&s, 100, false, 0);
    assert_int_equal(live_pub(&s, 101, 0xb, true), KVR_STREAM_APPLY);
    assert_int_equal(s.pub_id, 0xb);
    assert_int_equal(s.restarts, 0);

    /* an admin reset keeps no baseline: the next batch is a first contact, whatever its id */
    kvr_stream_reset(&s);
    assert_int_equal(live_pub(&s, 102, 0xc, false), KVR_STREAM_APPLY);
    assert_int_equal(s.restarts, 0);
    assert_int_equal(s.pub_id, 0xc);
}

static void test_baseline_and_normal(void **state)
{
    struct kvr_stream s;
    (void)state;
    kvr_stream_init(&s);
    assert_int_equal(live(&s, 42, false), KVR_STREAM_APPLY); /* no replay: the baseline */
    assert_true(s.based);
    assert_int_equal(s.last, 42);
    for (uint64_t q = 43; q < 100; q++)
        assert_int_equal(live(&s, q, true), KVR_STREAM_APPLY);
    assert_int_equal(s.last, 99);
    assert_int_equal(s.gaps, 0);
    assert_int_equal(s.restarts, 0);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
}

static void test_baseline_at_zero(void **state)
{
    struct kvr_stream s;
    (void)state;
    kvr_stream_init(&s);
    assert_int_equal(live(&s, 0, false), KVR_STREAM_APPLY);
    assert_int_equal(live(&s, 1, false), KVR_STREAM_APPLY);
    assert_int_equal(s.last, 1);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
}

static void test_gap_without_replay_unsynced(void **state)
{
    struct kvr_stream s;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 0, false);
    live(&s, 1, false);
    assert_int_equal(live(&s, 5, false), KVR_STREAM_APPLY);
    assert_int_equal(s.gaps, 1);
    assert_int_equal(s.last, 5);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    /* stays unsynced while contiguous */
    assert_int_equal(live(&s, 6, false), KVR_STREAM_APPLY);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    /* another gap counts again */
    live(&s, 9, false);
    assert_int_equal(s.gaps, 2);
    /* resync through AllBlocksCleared */
    kvr_stream_cleared(&s);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    assert_int_equal(live(&s, 10, false), KVR_STREAM_APPLY);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
}

static void test_gap_replay_ok(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 10, false); /* baseline (first contact without a replay endpoint) */
    live(&s, 11, true);
    /* 12..14 lost; 15 arrives */
    assert_int_equal(kvr_stream_on_live(&s, 15, true), KVR_STREAM_REPLAY);
    assert_int_equal(s.replay_from, 12);
    assert_int_equal(s.gaps, 1);
    assert_int_equal(s.replays, 1);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_REPLAYING);
    gen = s.replay_gen;
    /* live batches during the replay are buffered */
    assert_int_equal(kvr_stream_on_live(&s, 16, true), KVR_STREAM_BUFFER);
    assert_int_equal(kvr_stream_on_live(&s, 17, true), KVR_STREAM_BUFFER);
    /* the replay returns 12..16 (the engine's ring at the time it served us) */
    for (uint64_t q = 12; q <= 16; q++) {
        assert_int_equal(kvr_stream_on_replay(&s, gen, q), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, q);
    }
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(s.replays_ok, 1);
    /* drain: 15, 16 already applied through the replay, 17 is new */
    assert_int_equal(kvr_stream_on_buffered(&s, 15, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_buffered(&s, 16, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_buffered(&s, 17, true), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 17);
    assert_int_equal(s.duplicates, 2);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    assert_int_equal(live(&s, 18, true), KVR_STREAM_APPLY);
    assert_int_equal(s.last, 18);
}

static void test_replay_ahead_of_live(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 0, true);
    assert_int_equal(kvr_stream_on_live(&s, 2, true), KVR_STREAM_REPLAY);
    gen = s.replay_gen;
    /* the replay returns more than the live socket delivered so far */
    for (uint64_t q = 1; q <= 5; q++) {
        assert_int_equal(kvr_stream_on_replay(&s, gen, q), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, q);
    }
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(kvr_stream_on_buffered(&s, 2, true), KVR_STREAM_DROP);
    /* 3..5 then arrive live late: duplicates, never applied twice, not a restart */
    assert_int_equal(kvr_stream_on_live(&s, 3, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_live(&s, 5, true), KVR_STREAM_DROP);
    assert_int_equal(s.restarts, 0);
    assert_int_equal(live(&s, 6, true), KVR_STREAM_APPLY);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
}

static void test_replay_not_contiguous(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 100, false);
    assert_int_equal(kvr_stream_on_live(&s, 110, true), KVR_STREAM_REPLAY);
    gen = s.replay_gen;
    /* the engine's ring starts at 105: 101..104 are gone */
    assert_int_equal(kvr_stream_on_replay(&s, gen, 105), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 105);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_REPLAYING);
    assert_int_equal(kvr_stream_on_replay(&s, gen, 106), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 106);
    /* the ROUTER drops 107 (its burst overran SNDHWM): the ring still has it, ask again */
    assert_int_equal(kvr_stream_on_replay(&s, gen, 108), KVR_STREAM_REPLAY);
    assert_int_equal(s.replay_from, 107);
    assert_int_equal(s.hole_replays, 1);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_REPLAYING);
    /* the rest of the first replay is stale */
    assert_int_equal(kvr_stream_on_replay(&s, gen, 109), KVR_STREAM_DROP);
    assert_false(kvr_stream_on_replay_end(&s, gen, true));
    gen = s.replay_gen;
    for (uint64_t q = 107; q <= 110; q++) {
        assert_int_equal(kvr_stream_on_replay(&s, gen, q), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, q);
    }
    /* a duplicate inside the replay */
    assert_int_equal(kvr_stream_on_replay(&s, gen, 110), KVR_STREAM_DROP);
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(s.replays_ok, 1);
    assert_int_equal(s.gaps, 3);
    assert_int_equal(kvr_stream_on_buffered(&s, 110, true), KVR_STREAM_DROP);
    /* 101..104 were not in the ring: unsynced for good */
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);

    /* a ROUTER that keeps dropping the same batch: after KVR_STREAM_HOLE_RETRIES new
     * replays the hole is applied (unsynced) */
    kvr_stream_init(&s);
    live(&s, 0, false);
    assert_int_equal(kvr_stream_on_live(&s, 10, true), KVR_STREAM_REPLAY);
    for (int i = 0; i < KVR_STREAM_HOLE_RETRIES; i++) {
        gen = s.replay_gen;
        assert_int_equal(kvr_stream_on_replay(&s, gen, s.replay_from), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, s.last + 1);
        assert_int_equal(kvr_stream_on_replay(&s, gen, s.last + 2), KVR_STREAM_REPLAY);
    }
    gen = s.replay_gen;
    assert_int_equal(kvr_stream_on_replay(&s, gen, s.replay_from), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, s.replay_from);
    assert_int_equal(kvr_stream_on_replay(&s, gen, s.last + 2), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, s.last + 2);
    assert_int_equal(s.hole_replays, KVR_STREAM_HOLE_RETRIES);
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    /* the next gap gets its own retries */
    assert_int_equal(kvr_stream_on_live(&s, s.last + 5, true), KVR_STREAM_REPLAY);
    assert_int_equal(s.hole_retries, 0);
}

static void test_replay_timeout(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 0, true);
    kvr_stream_on_live(&s, 3, true);
    gen = s.replay_gen;
    kvr_stream_on_live(&s, 4, true);
    assert_true(kvr_stream_on_replay_end(&s, gen, false));
    assert_int_equal(s.replays_failed, 1);
    assert_int_equal(kvr_stream_on_buffered(&s, 3, true), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 3);
    assert_int_equal(kvr_stream_on_buffered(&s, 4, true), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 4);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    /* late items of that replay are stale */
    assert_int_equal(kvr_stream_on_replay(&s, gen, 1), KVR_STREAM_DROP);
    assert_false(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(s.stale, 2);
    assert_int_equal(s.last, 4);
}

static void test_abort_replay(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 0, true);
    kvr_stream_on_live(&s, 2, true);
    gen = s.replay_gen;
    kvr_stream_abort_replay(&s);
    assert_int_equal(s.replays_failed, 1);
    assert_int_equal(kvr_stream_on_buffered(&s, 2, true), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 2);
    assert_int_equal(kvr_stream_on_replay(&s, gen, 1), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
}

static void test_restart(void **state)
{
    struct kvr_stream s;
    int v;
    (void)state;
    kvr_stream_init(&s);
    for (uint64_t q = 0; q < 10; q++)
        live(&s, q, false);
    /* restart caught at seq 0: purge, re-baseline, synced */
    v = live(&s, 0, false);
    assert_int_equal(ACT(v), KVR_STREAM_APPLY);
    assert_true(v & KVR_STREAM_F_PURGE);
    assert_int_equal(s.restarts, 1);
    assert_int_equal(s.last, 0);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    assert_int_equal(live(&s, 1, false), KVR_STREAM_APPLY);
    /* restart seen first at seq 3 (0..2 missed) without replay: purge, apply, unsynced */
    for (uint64_t q = 2; q < 50; q++)
        live(&s, q, false);
    v = live(&s, 3, false);
    assert_int_equal(ACT(v), KVR_STREAM_APPLY);
    assert_true(v & KVR_STREAM_F_PURGE);
    assert_int_equal(s.restarts, 2);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    assert_int_equal(live(&s, 4, false), KVR_STREAM_APPLY);
    /* a restart re-baselines at 0: synced again */
    v = live(&s, 0, false);
    assert_true(v & KVR_STREAM_F_PURGE);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
}

static void test_restart_with_replay_from_zero(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    int v;
    (void)state;
    kvr_stream_init(&s);
    for (uint64_t q = 0; q < 20; q++)
        live(&s, q, true);
    v = kvr_stream_on_live(&s, 2, true);
    assert_int_equal(ACT(v), KVR_STREAM_REPLAY);
    assert_true(v & KVR_STREAM_F_PURGE);
    assert_int_equal(s.replay_from, 0);
    gen = s.replay_gen;
    assert_int_equal(kvr_stream_on_live(&s, 3, true), KVR_STREAM_BUFFER);
    for (uint64_t q = 0; q <= 3; q++) {
        assert_int_equal(kvr_stream_on_replay(&s, gen, q), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, q);
    }
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(kvr_stream_on_buffered(&s, 2, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_buffered(&s, 3, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    assert_int_equal(live(&s, 4, true), KVR_STREAM_APPLY);
}

static void test_restart_during_replay(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    int v;
    (void)state;
    kvr_stream_init(&s);
    for (uint64_t q = 0; q < 20; q++)
        live(&s, q, true);
    kvr_stream_on_live(&s, 25, true); /* gap → replay from 20 */
    gen = s.replay_gen;
    assert_int_equal(kvr_stream_on_live(&s, 26, true), KVR_STREAM_BUFFER);
    /* the engine restarts before the replay answers */
    v = live(&s, 0, true);
    assert_int_equal(ACT(v), KVR_STREAM_APPLY);
    assert_true(v & KVR_STREAM_F_PURGE);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    /* the old run's replay is stale now */
    assert_int_equal(kvr_stream_on_replay(&s, gen, 20), KVR_STREAM_DROP);
    assert_false(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(live(&s, 1, true), KVR_STREAM_APPLY);
    assert_int_equal(s.last, 1);
}

static void test_reset(void **state)
{
    struct kvr_stream s;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 0, false);
    live(&s, 5, false);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    kvr_stream_reset(&s);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    /* next batch is a new baseline (not a restart even though seq is lower) */
    assert_int_equal(live(&s, 3, false), KVR_STREAM_APPLY);
    assert_int_equal(s.restarts, 0);
    assert_int_equal(s.gaps, 1);
}

/* Randomized: a lossy live channel plus a replay that returns the exact missing range.
 * Every seq must be applied exactly once and in order. */
static void test_random_exactly_once(void **state)
{
    unsigned seed = (unsigned)(getenv("KVR_SEED") ? atoi(getenv("KVR_SEED")) : 12345);
    (void)state;
    srand(seed);
    for (int round = 0; round < 200; round++) {
        struct kvr_stream s;
        uint64_t buf[64];
        size_t nbuf = 0;
        uint64_t next_apply = 0;
        uint64_t n = 50 + (uint64_t)(rand() % 200);
        bool pending = false;
        uint32_t gen = 0;
        uint64_t from = 0;

        kvr_stream_init(&s);
        for (uint64_t q = 0; q <= n; q++) {
            bool lost = q > 0 && q < n && rand() % 5 == 0;
            int v;

            if (!lost) {
                v = kvr_stream_on_live(&s, q, true);
                if (ACT(v) == KVR_STREAM_APPLY) {
                    if (q != next_apply)
                        fail_msg("seed %u: applied %llu expected %llu", seed,
                                 (unsigned long long)q, (unsigned long long)next_apply);
                    kvr_stream_applied(&s, q);
                    next_apply = q + 1;
                } else if (ACT(v) == KVR_STREAM_REPLAY || ACT(v) == KVR_STREAM_BUFFER) {
                    if (ACT(v) == KVR_STREAM_REPLAY) {
                        pending = true;
                        gen = s.replay_gen;
                        from = s.replay_from;
                    }
                    if (nbuf < 64)
                        buf[nbuf++] = q;
                }
            }
            /* the replay is served after a random delay, covering from..q */
            if (pending && rand() % 3 == 0) {
                for (uint64_t r = from; r <= q; r++) {
                    if (kvr_stream_on_replay(&s, gen, r) == KVR_STREAM_APPLY) {
                        if (r != next_apply)
                            fail_msg("seed %u: replay applied %llu expected %llu", seed,
                                     (unsigned long long)r, (unsigned long long)next_apply);
                        kvr_stream_applied(&s, r);
                        next_apply = r + 1;
                    }
                }
                assert_true(kvr_stream_on_replay_end(&s, gen, true));
                for (size_t i = 0; i < nbuf; i++) {
                    if (kvr_stream_on_buffered(&s, buf[i], true) == KVR_STREAM_APPLY) {
                        if (buf[i] != next_apply)
                            fail_msg("seed %u: drain applied %llu", seed,
                                     (unsigned long long)buf[i]);
                        kvr_stream_applied(&s, buf[i]);
                        next_apply = buf[i] + 1;
                    }
                }
                nbuf = 0;
                pending = false;
            }
        }
        if (pending) {
            for (uint64_t r = from; r <= n; r++)
                if (kvr_stream_on_replay(&s, gen, r) == KVR_STREAM_APPLY) {
                    assert_int_equal(r, next_apply);
                    kvr_stream_applied(&s, r);
                    next_apply = r + 1;
                }
            kvr_stream_on_replay_end(&s, gen, true);
            for (size_t i = 0; i < nbuf; i++)
                if (kvr_stream_on_buffered(&s, buf[i], true) == KVR_STREAM_APPLY) {
                    assert_int_equal(buf[i], next_apply);
                    kvr_stream_applied(&s, buf[i]);
                    next_apply = buf[i] + 1;
                }
        }
        if (next_apply != n + 1)
            fail_msg("seed %u round %d: ended at %llu of %llu", seed, round,
                     (unsigned long long)next_apply, (unsigned long long)n + 1);
        assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
        assert_int_equal(s.restarts, 0);
    }
}

/* A whole replay, then a buffered live batch beyond the next seq: lost on the live socket
 * after the engine served the replay. A new gap: another replay from there. */
static void test_gap_after_whole_replay(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    (void)state;
    kvr_stream_init(&s);
    live(&s, 0, true);
    live(&s, 1, true);
    assert_int_equal(ACT(kvr_stream_on_live(&s, 4, true)), KVR_STREAM_REPLAY); /* 2, 3 lost */
    gen = s.replay_gen;
    assert_int_equal(ACT(kvr_stream_on_live(&s, 5, true)), KVR_STREAM_BUFFER);
    assert_int_equal(ACT(kvr_stream_on_live(&s, 7, true)), KVR_STREAM_BUFFER); /* 6 lost */
    for (uint64_t q = 2; q <= 5; q++) { /* the engine served 2..5 */
        assert_int_equal(kvr_stream_on_replay(&s, gen, q), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, q);
    }
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(kvr_stream_on_buffered(&s, 4, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_buffered(&s, 5, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_buffered(&s, 7, true), KVR_STREAM_REPLAY);
    assert_int_equal(s.replay_from, 6);
    assert_int_equal(s.gaps, 2);
    gen = s.replay_gen;
    assert_int_equal(kvr_stream_on_replay(&s, gen, 6), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 6);
    assert_int_equal(kvr_stream_on_replay(&s, gen, 7), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 7);
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(kvr_stream_on_buffered(&s, 7, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    assert_int_equal(s.replays_ok, 2);

    /* the same without a replay endpoint any more: unsynced, applied */
    kvr_stream_init(&s);
    live(&s, 0, true);
    assert_int_equal(ACT(kvr_stream_on_live(&s, 2, true)), KVR_STREAM_REPLAY);
    gen = s.replay_gen;
    kvr_stream_on_live(&s, 4, true);
    assert_int_equal(kvr_stream_on_replay(&s, gen, 1), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 1);
    assert_int_equal(kvr_stream_on_replay(&s, gen, 2), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 2);
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(kvr_stream_on_buffered(&s, 2, false), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_buffered(&s, 4, false), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 4);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    assert_int_equal(s.gaps, 2);
}

/* Randomized: the live channel also loses batches while a replay is in flight, after the
 * engine served it (its end is processed later). Every seq applied exactly once, in order. */
static void test_random_loss_during_replay(void **state)
{
    unsigned seed = (unsigned)(getenv("KVR_SEED") ? atoi(getenv("KVR_SEED")) : 4242);
    (void)state;
    srand(seed);
    for (int round = 0; round < 300; round++) {
        struct kvr_stream s;
        uint64_t buf[512];
        size_t nbuf = 0;
        uint64_t next_apply = 0, n = 30 + (uint64_t)(rand() % 200), from = 0;
        bool pending = false, served = false;
        uint32_t gen = 0;
        uint64_t replays = 0;

        kvr_stream_init(&s);
        for (uint64_t q = 0; q <= n + 64; q++) {
            if (q <= n) {
                bool lost = q > 0 && q < n && rand() % 4 == 0;
                if (!lost) {
                    int v = ACT(kvr_stream_on_live(&s, q, true));
                    if (v == KVR_STREAM_APPLY) {
                        if (q != next_apply)
                            fail_msg("seed %u: live applied %llu, expected %llu", seed,
                                     (unsigned long long)q, (unsigned long long)next_apply);
                        kvr_stream_applied(&s, q);
                        next_apply = q + 1;
                    } else {
                        assert_true(v == KVR_STREAM_REPLAY || v == KVR_STREAM_BUFFER);
                        if (v == KVR_STREAM_REPLAY) {
                            pending = true, served = false, replays++;
                            gen = s.replay_gen, from = s.replay_from;
                        }
                        assert_true(nbuf < 512);
                        buf[nbuf++] = q;
                    }
                }
            }
            /* the engine serves from..min(q, n) (its ring has everything published) */
            if (pending && !served && (rand() % 3 == 0 || q > n)) {
                for (uint64_t r = from; r <= (q < n ? q : n); r++)
                    if (kvr_stream_on_replay(&s, gen, r) == KVR_STREAM_APPLY) {
                        if (r != next_apply)
                            fail_msg("seed %u: replay applied %llu, expected %llu", seed,
                                     (unsigned long long)r, (unsigned long long)next_apply);
                        kvr_stream_applied(&s, r);
                        next_apply = r + 1;
                    }
                served = true;
                continue; /* its end comes later: more live batches may arrive (or be lost) */
            }
            if (pending && served && (rand() % 2 == 0 || q > n)) {
                size_t i;
                assert_true(kvr_stream_on_replay_end(&s, gen, true));
                pending = served = false;
                for (i = 0; i < nbuf; i++) {
                    int v = kvr_stream_on_buffered(&s, buf[i], true);
                    if (v == KVR_STREAM_REPLAY) { /* keep buf[i..] for the new replay */
                        memmove(buf, buf + i, (nbuf - i) * sizeof(buf[0]));
                        nbuf -= i;
                        pending = true, replays++;
                        gen = s.replay_gen, from = s.replay_from;
                        assert_int_equal(from, next_apply);
                        break;
                    }
                    if (v == KVR_STREAM_APPLY) {
                        if (buf[i] != next_apply)
                            fail_msg("seed %u: drain applied %llu, expected %llu", seed,
                                     (unsigned long long)buf[i], (unsigned long long)next_apply);
                        kvr_stream_applied(&s, buf[i]);
                        next_apply = buf[i] + 1;
                    }
                }
                if (!pending)
                    nbuf = 0;
            }
        }
        if (pending || next_apply != n + 1)
            fail_msg("seed %u round %d: ended at %llu of %llu (pending %d)", seed, round,
                     (unsigned long long)next_apply, (unsigned long long)n + 1, pending);
        assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
        assert_int_equal(s.replays, replays);
    }
}

/* First contact: a stream seen for the first time at seq > 0 with a replay endpoint asks for
 * the engine's history from 0 and buffers the live batch; the overlap is dropped. */
static void test_first_contact(void **state)
{
    struct kvr_stream s;
    uint32_t gen;
    (void)state;
    kvr_stream_init(&s);
    assert_int_equal(kvr_stream_on_live(&s, 42, true), KVR_STREAM_REPLAY); /* no purge */
    assert_int_equal(s.replay_from, 0);
    assert_int_equal(s.first_contacts, 1);
    assert_int_equal(s.gaps, 0); /* not a gap: nothing was lost, it was never seen */
    assert_int_equal(s.restarts, 0);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_REPLAYING);
    gen = s.replay_gen;
    assert_int_equal(kvr_stream_on_live(&s, 43, true), KVR_STREAM_BUFFER);
    for (uint64_t q = 0; q <= 43; q++) {
        assert_int_equal(kvr_stream_on_replay(&s, gen, q), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, q);
    }
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(kvr_stream_on_buffered(&s, 42, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_on_buffered(&s, 43, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_SYNCED);
    assert_int_equal(live(&s, 44, true), KVR_STREAM_APPLY);

    /* seq 0 first: a baseline, nothing to ask for */
    kvr_stream_init(&s);
    assert_int_equal(live(&s, 0, true), KVR_STREAM_APPLY);
    assert_int_equal(s.first_contacts, 0);

    /* the engine's ring no longer holds seq 0: a hole, applied from what is there, unsynced */
    kvr_stream_init(&s);
    assert_int_equal(kvr_stream_on_live(&s, 500, true), KVR_STREAM_REPLAY);
    gen = s.replay_gen;
    for (uint64_t q = 400; q <= 500; q++) {
        assert_int_equal(kvr_stream_on_replay(&s, gen, q), KVR_STREAM_APPLY);
        kvr_stream_applied(&s, q);
    }
    assert_true(kvr_stream_on_replay_end(&s, gen, true));
    assert_int_equal(s.replays_failed, 1);
    assert_int_equal(kvr_stream_on_buffered(&s, 500, true), KVR_STREAM_DROP);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);
    assert_int_equal(s.last, 500);

    /* the replay fails (timeout, unreachable ROUTER): the live batch is applied, unsynced */
    kvr_stream_init(&s);
    assert_int_equal(kvr_stream_on_live(&s, 7, true), KVR_STREAM_REPLAY);
    gen = s.replay_gen;
    assert_true(kvr_stream_on_replay_end(&s, gen, false));
    assert_int_equal(kvr_stream_on_buffered(&s, 7, true), KVR_STREAM_APPLY);
    kvr_stream_applied(&s, 7);
    assert_int_equal(kvr_stream_state(&s), KVR_STREAM_UNSYNCED);

    /* after a reset (purge from outside) the next batch is a first contact again */
    kvr_stream_init(&s);
    live(&s, 0, true);
    live(&s, 1, true);
    kvr_stream_reset(&s);
    assert_int_equal(kvr_stream_on_live(&s, 9, true), KVR_STREAM_REPLAY);
    assert_int_equal(s.replay_from, 0);
    assert_int_equal(s.restarts, 0);

    /* a restored stream is not a first contact: a gap replays from last + 1 */
    kvr_stream_restore(&s, 30, false);
    assert_int_equal(kvr_stream_on_live(&s, 40, true), KVR_STREAM_REPLAY);
    assert_int_equal(s.replay_from, 31);
    assert_int_equal(s.first_contacts, 0);
}

/* The naive reference for a stream the daemon first sees at seq `join`, from an engine whose
 * replay ring holds seqs ring_lo.. (ring_lo <= join), with live loss after the join: which
 * seqs end up applied (in order) and whether the stream may say synced. */
static size_t model_first_contact(uint64_t join, uint64_t ring_lo, uint64_t n, bool can,
                                  const bool *lost, uint64_t *want, bool *synced)
{
    size_t k = 0;
    if (can) {
        /* the replay from 0 recovers what the ring holds; later gaps come from the ring too */
        uint64_t from = join == 0 ? 0 : ring_lo;
        for (uint64_t q = from; q <= n; q++)
            want[k++] = q;
        *synced = join == 0 || ring_lo == 0;
        return k;
    }
    *synced = true;
    for (uint64_t q = join; q <= n; q++) {
        if (lost[q])
            *synced = false; /* a gap without replay */
        else
            want[k++] = q;
    }
    return k;
}

/* Randomized against model_first_contact: late join, ring that may have lost seq 0, live
 * loss (also while a replay runs, after the engine served it), a ROUTER that drops batches
 * inside a few replays (recovered by replaying again), replay endpoint or not. */
static void test_random_first_contact_model(void **state)
{
    unsigned seed = (unsigned)(getenv("KVR_SEED") ? atoi(getenv("KVR_SEED")) : 777);
    (void)state;
    srand(seed);
    uint64_t hole_replays = 0;
    printf("test_random_first_contact_model: seed %u (KVR_SEED)\n", seed);
    for (int round = 0; round < 400; round++) {
        struct kvr_stream s;
        uint64_t buf[512], got[600], want[600];
        bool lost[600];
        size_t nbuf = 0, ngot = 0, nwant;
        uint64_t n = 20 + (uint64_t)(rand() % 300), from = 0;
        uint64_t join = rand() % 3 == 0 ? 0 : (uint64_t)rand() % (n / 2);
        uint64_t ring_lo = rand() % 2 == 0 ? 0 : (uint64_t)rand() % (join + 1);
        bool can = rand() % 4 != 0, pending = false, served = false, synced;
        uint32_t gen = 0;
        int drops_left = rand() % 4; /* serves whose ROUTER may drop (fewer than the retries) */

        for (uint64_t q = 0; q <= n; q++)
            lost[q] = q > join && q < n && rand() % 5 == 0;
        kvr_stream_init(&s);
        for (uint64_t q = join; q <= n + 64; q++) {
            if (q <= n && !lost[q]) {
                int v = ACT(kvr_stream_on_live(&s, q, can));
                if (v == KVR_STREAM_APPLY) {
                    kvr_stream_applied(&s, q);
                    got[ngot++] = q;
                } else if (v == KVR_STREAM_REPLAY || v == KVR_STREAM_BUFFER) {
                    if (v == KVR_STREAM_REPLAY) {
                        pending = true, served = false;
                        gen = s.replay_gen, from = s.replay_from;
                    }
                    assert_true(nbuf < 512);
                    buf[nbuf++] = q;
                }
            }
            /* the engine serves what its ring holds from `from` up to what it published; in
             * a few serves its ROUTER drops batches after the first (a burst over SNDHWM) */
            if (pending && !served && (rand() % 3 == 0 || q > n)) {
                uint32_t g = gen;
                bool restarted = false, first = true;
                for (uint64_t r = from > ring_lo ? from : ring_lo; r <= (q < n ? q : n); r++) {
                    int v;
                    if (!first && drops_left > 0 && rand() % 6 == 0)
                        continue;
                    first = false;
                    v = kvr_stream_on_replay(&s, g, r);
                    if (v == KVR_STREAM_APPLY) {
                        kvr_stream_applied(&s, r);
                        got[ngot++] = r;
                    } else if (v == KVR_STREAM_REPLAY) { /* the rest of g is stale */
                        assert_false(restarted);
                        restarted = true;
                        gen = s.replay_gen, from = s.replay_from;
                    }
                }
                if (drops_left > 0)
                    drops_left--;
                if (restarted) {
                    assert_false(kvr_stream_on_replay_end(&s, g, true)); /* stale */
                    continue; /* the new replay is served later */
                }
                served = true;
                continue;
            }
            if (pending && served && (rand() % 2 == 0 || q > n)) {
                size_t i;
                assert_true(kvr_stream_on_replay_end(&s, gen, true));
                pending = served = false;
                for (i = 0; i < nbuf; i++) {
                    int v = kvr_stream_on_buffered(&s, buf[i], can);
                    if (v == KVR_STREAM_REPLAY) {
                        memmove(buf, buf + i, (nbuf - i) * sizeof(buf[0]));
                        nbuf -= i;
                        pending = true;
                        gen = s.replay_gen, from = s.replay_from;
                        break;
                    }
                    if (v == KVR_STREAM_APPLY) {
                        kvr_stream_applied(&s, buf[i]);
                        got[ngot++] = buf[i];
                    }
                }
                if (!pending)
                    nbuf = 0;
            }
        }
        nwant = model_first_contact(join, ring_lo, n, can, lost, want, &synced);
        if (pending || ngot != nwant || memcmp(got, want, ngot * sizeof(got[0])) != 0)
            fail_msg("seed %u round %d (join %llu ring_lo %llu n %llu replay %d): applied %zu "
                     "seqs, the model %zu (pending %d)",
                     seed, round, (unsigned long long)join, (unsigned long long)ring_lo,
                     (unsigned long long)n, can, ngot, nwant, pending);
        if ((kvr_stream_state(&s) == KVR_STREAM_SYNCED) != synced)
            fail_msg("seed %u round %d (join %llu ring_lo %llu replay %d): state %s, the model "
                     "says %s",
                     seed, round, (unsigned long long)join, (unsigned long long)ring_lo, can,
                     kvr_stream_state_name(kvr_stream_state(&s)), synced ? "synced" : "not");
        assert_int_equal(s.restarts, 0);
        assert_int_equal(s.first_contacts, can && join > 0 ? 1 : 0);
        hole_replays += s.hole_replays;
    }
    printf("test_random_first_contact_model: %llu replays restarted for ROUTER drops\n",
           (unsigned long long)hole_replays);
    assert_true(hole_replays > 0); /* the path was taken */
}

/* The names /v1/pods prints (moved here from ingest with the enum). */
static void test_state_names(void **state)
{
    (void)state;
    assert_string_equal(kvr_stream_state_name(KVR_STREAM_SYNCED), "synced");
    assert_string_equal(kvr_stream_state_name(KVR_STREAM_REPLAYING), "replaying");
    assert_string_equal(kvr_stream_state_name(KVR_STREAM_RESTORED), "restored");
    assert_string_equal(kvr_stream_state_name(KVR_STREAM_UNSYNCED), "unsynced");
    assert_string_equal(kvr_stream_state_name((enum kvr_stream_state)7), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_names),
        cmocka_unit_test(test_baseline_and_normal),
        cmocka_unit_test(test_restored),
        cmocka_unit_test(test_baseline_at_zero),
        cmocka_unit_test(test_gap_without_replay_unsynced),
        cmocka_unit_test(test_gap_replay_ok),
        cmocka_unit_test(test_replay_ahead_of_live),
        cmocka_unit_test(test_replay_not_contiguous),
        cmocka_unit_test(test_replay_timeout),
        cmocka_unit_test(test_abort_replay),
        cmocka_unit_test(test_gap_after_whole_replay),
        cmocka_unit_test(test_random_loss_during_replay),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_restart_with_replay_from_zero),
        cmocka_unit_test(test_restart_during_replay),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_publisher_id),
        cmocka_unit_test(test_random_exactly_once),
        cmocka_unit_test(test_first_contact),
        cmocka_unit_test(test_random_first_contact_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
