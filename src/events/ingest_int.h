/* ingest_int.h — ingest's private header: the writer, stream and topic records, the
 * counters, and the few functions its files share (ingest.c: lifecycle, admin;
 * ingest_writer.c: the writer loop, ordering and replay buffering; ingest_apply.c: events →
 * index; ingest_metrics.c: the readers, streams and /metrics). Not a contract for other
 * modules: ingest.h is.
 *
 * Threads: as noted per field (writer-only fields are touched by the writer thread that
 * owns the topic's shard; published fields are relaxed atomics read by any thread).
 */
#ifndef KVR_INGEST_INT_H
#define KVR_INGEST_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "events/decode.h"
#include "index/index.h"
#include "events/ingest.h"
#include "core/log.h"
#include "core/metrics.h"
#include "events/queue.h"
#include "events/queue_msg.h"
#include "events/stream.h"

#define MAX_DP_RANK 4096
#define LORA_CACHE 4
#define TIER_CACHE 8
#define ACQUIRE_BATCH 64

/* Skip reasons of our own, after the decoder's. */
enum {
    SKIP_NO_BLOCK_SIZE = KVR_SKIP_REASON_COUNT,
    SKIP_BLOCK_SIZE_MISMATCH,
    SKIP_NAMESPACE,
    SKIP_TIER,
    SKIP_INDEX,
    SKIP_OVER_BUDGET, /* a store refused: the index is at [index] max_memory */
    SKIP_COUNT
};
enum { BAD_DECODE = 0, BAD_WORKER, BAD_DP_RANK, BAD_REPLAY_RANK, BAD_COUNT };
/* Why an assumption was not applied (ingest_assume.c). */
enum { AS_SKIP_EVENTS = 0, AS_SKIP_WORKER, AS_SKIP_OVER_BUDGET, AS_SKIP_INDEX, AS_SKIP_COUNT };
/* Why a prediction was not applied (ingest_predict.c). */
enum { PR_SKIP_NO_EVENTS = 0, PR_SKIP_OVER_BUDGET, PR_SKIP_INDEX, PR_SKIP_COUNT };
struct kvr_assume;
struct kvr_assume_pair;
/* The ASSUME item's payload (ingest_assume.c builds it): this header, n content hashes, then
 * "model\0lora\0pod\0". predict: a prediction (ingest_predict.c). */
struct as_msg {
    uint32_t dp_rank;
    uint32_t n;
    uint16_t model_len, lora_len, pod_len; /* lora_len 0: none */
    uint8_t predict;
    uint64_t content[];
};
struct as_pub {
    char *pod;
    uint32_t wid, dp_rank;
    uint64_t blocks;
};
struct pend {
    uint64_t seq;
    struct kvr_queue_payload msg;
};

struct ing_topic;
struct ing_snapjob;

#define NO_WID UINT32_MAX

struct ing_stream {
    struct kvr_stream sm;           /* writer only */
    struct ing_topic *it;
    uint32_t dp_rank;
    uint32_t wid;                   /* writer; changed under reg_mu (readers read it there);
                                     * NO_WID while its pod is forgotten (DELETE): the next
                                     * batch interns the worker again */
    uint32_t source;                /* writer: source of the last live batch */
    uint32_t replays_out;           /* writer: replay requests not ended yet (REPLAY_END) */
    bool can_replay;
    /* writer only: bit g set = KV-cache group g seen in BlockStored as full attention
     * (indexed) / as another kind (filtered by the decoder); groups >= 64 are never learned */
    uint64_t groups_full, groups_other;
    struct pend *pend;              /* writer: live batches buffered during a replay */
    size_t npend, cappend;
    /* writer: a store of this stream was refused by the memory cap since its worker was last
     * emptied (cleared, purged, forgotten): the index misses some of its blocks. Published in
     * p_over_budget; cleared like unsynced (ingest_apply.c, THE MEMORY CAP). */
    bool over_budget;

    /* published for readers (relaxed) */
    _Atomic uint64_t p_last_seq, p_gaps, p_replays, p_restarts, p_replays_ok, p_replays_failed;
    /* set (release, after p_last_seq) once a batch was applied: until then the stream is not
     * listed, so a client waiting for last_seq == 0 cannot see it before seq 0 is indexed */
    _Atomic bool p_has_last;
    _Atomic int p_state;
    _Atomic int64_t p_last_ms;      /* kvr_now_ms() of the last applied batch; 0 = never */
    _Atomic bool p_over_budget;     /* over_budget, for readers (relaxed) */
    /* the recovery progress of its replay (relaxed; meaningful while p_state is replaying):
     * the seqs [p_replay_from, p_replay_to) are what the replay has to bring */
    _Atomic uint64_t p_replay_from, p_replay_to;
};

struct lora_slot {
    bool used;
    uint8_t len;
    char name[KVR_NAME_MAX];
    uint32_t ns;
    uint64_t seed;
};

struct ing_topic {                  /* writer of topic->shard only */
    const struct kvr_queue_topic *t;
    int64_t last_ms;                /* kvr_now_ms() of its last live batch (or creation) */
    bool releasing;                 /* released to the producer (intake.forget) */
    bool dying;                     /* its FORGET came: freed once its replays ended */
    struct kvr_queue_payload rec;   /* dying: the FORGET payload (owns the record) */
    struct ing_stream **ranks;
    uint32_t nranks;
    bool base_ok;
    uint32_t base_ns;
    uint64_t base_seed;
    struct lora_slot lora[LORA_CACHE];
    unsigned lora_next;
};

struct tier_slot {
    uint8_t len;
    char s[32];
    uint8_t tier;
};

struct writer_stats {
    _Atomic uint64_t batches, replayed_batches, dup_batches, stale_items;
    _Atomic uint64_t bad[BAD_COUNT];
    _Atomic uint64_t events[4];
    _Atomic uint64_t skipped[SKIP_COUNT];
    _Atomic uint64_t stored, removed, dup_blocks, orphaned, adopted, orphans_dropped;
    _Atomic uint64_t unknown_removes, cleared, purged, restart_purged;
    _Atomic uint64_t pub_restarts;  /* engine restarts read from a changed publisher id */
    _Atomic uint64_t buffered, replay_aborts;
    _Atomic uint64_t pods_forgotten, workers_refused;
    _Atomic uint64_t budget_blocks; /* blocks of stores refused by the memory cap */
    /* approximate mode (ingest_assume.c) */
    _Atomic uint64_t as_applied;    /* assumptions applied */
    _Atomic uint64_t as_skipped[AS_SKIP_COUNT]; /* assumptions not applied, by reason */
    _Atomic uint64_t as_stored, as_refreshed, as_evicted, as_expired, as_dropped; /* blocks */
    _Atomic uint64_t as_count;      /* gauge: blocks this writer assumes now */
    _Atomic uint64_t as_forgotten;  /* pods known only by assumptions, forgotten at expiry */
    /* predicted entries (ingest_predict.c) */
    _Atomic uint64_t pr_applied;    /* predictions applied */
    _Atomic uint64_t pr_skipped[PR_SKIP_COUNT];
    _Atomic uint64_t pr_stored, pr_refreshed, pr_confirmed, pr_contradicted, pr_expired,
        pr_evicted; /* blocks */
    _Atomic uint64_t pr_count;      /* gauge: blocks this writer predicts now */
};

struct writer {
    struct kvr_ingest *ing;
    uint32_t idx;
    struct kvr_queue *q;
    struct kvr_decoder *dec;
    pthread_t th;
    bool th_started;
    struct ing_topic **topics;      /* topics of this shard (writer only) */
    size_t ntopics, captopics;
    uint64_t *rm;                   /* coalesced removals (apply_removed) */
    size_t nrm, caprm;
    uint8_t rm_tier;
    uint64_t *content;              /* scratch */
    struct kvr_index_block *blocks;
    size_t capblocks;
    struct tier_slot tiers[TIER_CACHE];
    unsigned ntiers;
    struct ing_topic **dying;       /* topics forgotten whose replays have not ended */
    size_t ndying, capdying;
    int64_t next_sweep;             /* kvr_now_ms() of the next idle sweep (forget_after) */
    struct ing_restored *restored;  /* ingest_snap.c: streams of a snapshot of this writer's
                                     * pods (filled before start; `claimed` under reg_mu) */
    size_t nrestored;
    struct ing_snapjob *snap;       /* a snapshot part being taken (ingest_snap.c), or NULL */
    /* approximate mode (ingest_assume.c), writer only */
    struct kvr_assume *as;          /* created with the first assumption */
    uint64_t *evented;              /* bit wid: the worker has an event stream (or a restored
                                     * one): never assumed */
    uint32_t nevented;              /* bits allocated */
    uint8_t as_tier;                /* the index's "assumed" tier (0 = not interned yet) */
    uint64_t *as_keys;              /* scratch: chain keys, evictions */
    struct kvr_assume_pair *as_pairs; /* scratch: expiries, sorted by worker */
    struct kvr_index_block *as_blocks;
    size_t as_cap;
    int64_t next_expire;            /* kvr_now_ms() of the next expiry check (0: none due) */
    /* predicted entries (ingest_predict.c), writer only */
    struct kvr_assume *pr;          /* created with the first prediction */
    uint8_t pr_tier;                /* the index's "predicted" tier (0 = not interned yet) */
    uint8_t *pr_new;                /* scratch: which keys of a prediction are new */
    uint64_t *pr_keys;              /* scratch: chain keys, confirmations, evictions */
    struct kvr_assume_pair *pr_pairs; /* scratch: expiries */
    struct kvr_index_block *pr_blocks;
    size_t pr_cap;
    int64_t pr_next_expire;         /* as next_expire, for predictions */
    /* the workers holding assumptions, for kvr_ingest_assumed_workers (any thread): written
     * by the writer under as_mu, read under it */
    pthread_mutex_t as_mu;
    struct as_pub *as_pub;          /* dense */
    size_t as_npub, as_cappub;
    uint32_t *as_pub_at;            /* writer only: wid -> index in as_pub + 1 (0: none) */
    uint32_t as_pub_nat;
    struct writer_stats st;
};

enum { CMD_PURGE_POD = 1, CMD_SNAPSHOT = 2 };
struct ing_cmd {
    int type;
    const char *pod;
    uint32_t pod_id;
    uint64_t removed;
    const struct kvr_ingest_snap_sink *sink; /* CMD_SNAPSHOT */
    uint64_t stall_ns;                       /* CMD_SNAPSHOT: time spent in the part */
    int rc;
    bool done;                      /* under ing->done_mu */
};

struct kvr_ingest {
    const struct kvr_conf *conf;
    struct kvr_index *ix;
    struct kvr_ingest_intake intake; /* set before start; zeroed: no replays */
    uint32_t nwriters;
    struct writer *w;
    struct kvr_queue **queues;       /* w[i].q, for kvr_ingest_queues() */
    struct kvr_hist lag;

    pthread_mutex_t reg_mu;         /* streams registry */
    struct ing_stream **streams;
    size_t nstreams, capstreams;

    pthread_mutex_t done_mu;        /* command completions */
    pthread_cond_t done_cv;

    struct kvr_ratelimit rl_bad;    /* peer-caused warnings ([log] ratelimit_*) */
    struct kvr_ratelimit rl_gap;
    struct kvr_ratelimit rl_budget; /* the memory cap's one warning (burst 1 per interval) */
    _Atomic uint64_t max_memory;    /* [index] max_memory (0 = none); set on reload */
    _Atomic int64_t assume_ttl_ms;  /* [route] assumed_ttl; set on reload */
    _Atomic uint32_t assume_max;    /* [route] assumed_max_blocks; set on reload */
    _Atomic uint64_t assume_full;   /* assumptions dropped: the writer's queue was full */
    /* recovery through replays (ingest_writer.c, publish): streams replaying now, and the
     * episode that began when the first of them started (its start time, the replayed
     * batches counted then, the streams that entered it) for the log lines at its start and
     * end; written by any writer with atomics */
    _Atomic uint32_t replaying;
    _Atomic int64_t episode_t0_ms;
    _Atomic uint64_t episode_streams, episode_batches0;
    _Atomic int64_t predict_ttl_ms; /* [route] predicted_ttl (0 = off); set on reload */
    _Atomic uint64_t predict_full;  /* predictions dropped: the writer's queue was full */
    kvr_ingest_store_hook store_hook; /* set before start; NULL = none */
    void *store_hook_arg;

    pthread_mutex_t life_mu;        /* start/stop */
    bool started, stopped;
    _Atomic bool ready;
    _Atomic bool writers_running;
};

/* ingest_apply.c: the events of the batch open in w->dec, applied to stream s's worker. */
void kvr_ingest_apply_batch(struct writer *w, struct ing_stream *s);
/* Drops every tier of s's worker; the blocks dropped are added to *counter (one of w->st). */
void kvr_ingest_clear_worker(struct writer *w, struct ing_stream *s, _Atomic uint64_t *counter);
/* The memory cap's state of a new ingest (max_memory from conf, its warning's limiter). */
void kvr_ingest_budget_init(struct kvr_ingest *ing);

/* ingest_writer.c: a writer thread (arg: its struct writer); drop_pending releases the
 * live batches a stream buffered during a replay. */
void *kvr_ingest_writer_main(void *arg);
/* On the pod's writer thread (or the only thread): forgets the pod in the index (its blocks,
 * worker and pod ids: kvr_index_pod_forget) and detaches its streams (unlisted, sequence
 * state reset; a later batch of the pod starts it afresh). -ENOENT for a pod not indexed. */
int kvr_ingest_forget_pod(struct writer *w, const char *pod, uint64_t *removed);
/* Frees a topic's state (streams, ranks, the FORGET payload; destroy). */
void kvr_ingest_topic_free(struct ing_topic *it);
void kvr_ingest_drop_pending(struct ing_stream *s);

/* ingest_assume.c: approximate mode on the writer thread. An ASSUME item; the expiry check
 * (the writer loop calls it every round; cheap when nothing is due); a worker that now has
 * an event stream (its assumptions go, it is never assumed again while it has one); a
 * worker whose pod is forgotten (the index already dropped its blocks); how long the loop
 * may sleep before the next expiry (-1: none pending); destroy. */
void kvr_ingest_assume_apply(struct writer *w, const struct kvr_queue_payload *p);
void kvr_ingest_assume_expire(struct writer *w);
void kvr_ingest_assume_evented(struct writer *w, uint32_t wid);
void kvr_ingest_assume_forgotten(struct writer *w, uint32_t wid);
int64_t kvr_ingest_assume_wait_ms(const struct writer *w);
void kvr_ingest_assume_free(struct writer *w);

/* ingest_predict.c: predicted entries on the writer thread. A prediction (an ASSUME item
 * with predict set, handed over by kvr_ingest_assume_apply); a BlockStored the writer just
 * applied to worker wid, tier (engine hashes: confirms predictions); a BlockRemoved it is
 * about to apply (contradicts them); a worker cleared or forgotten (the index dropped its
 * blocks already: the bookkeeping follows); expiry and sleep as assume's; destroy. */
void kvr_ingest_predict_apply(struct writer *w, const struct as_msg *m);
void kvr_ingest_predict_stored(struct writer *w, uint32_t wid, uint8_t tier,
                               const uint64_t *hashes, size_t n);
void kvr_ingest_predict_removing(struct writer *w, uint32_t wid, uint8_t tier,
                                 const uint64_t *hashes, size_t n);
void kvr_ingest_predict_cleared(struct writer *w, uint32_t wid);
/* A worker's stream appeared (or was restored from a snapshot, which may have saved
 * predicted entries without their bookkeeping): its predicted tier is emptied. */
void kvr_ingest_predict_evented(struct writer *w, uint32_t wid);
void kvr_ingest_predict_expire(struct writer *w);
int64_t kvr_ingest_predict_wait_ms(const struct writer *w);
void kvr_ingest_predict_free(struct writer *w);

/* ingest_snap.c: snapshots. A stream restored from a snapshot, until its first batch. */
struct ing_restored {
    char *pod, *model;
    uint32_t dp_rank;
    uint32_t wid;                   /* its worker, restored into the index */
    uint64_t last_seq;
    bool unsynced;
    bool claimed;                   /* a live stream took it over (under reg_mu), or its pod
                                     * was forgotten */
    uint64_t groups_full, groups_other;
    uint64_t pub_id;                /* the engine run's publisher id (kvr_queue_pubid), 0: none */
};
/* The CMD_SNAPSHOT item: the writer's part begins (w->snap); its pods are handed to the sink
 * a few per step, each step between two batches; the command is completed (done, rc,
 * stall_ns = the longest step) by the step that handled the last pod. */
void kvr_ingest_snap_begin(struct writer *w, struct ing_cmd *c);
/* The writer loop calls this after each round of items while w->snap is set. */
void kvr_ingest_snap_step(struct writer *w);
/* A new stream s of topic t: takes over the restored state of (pod, model, dp_rank). */
void kvr_ingest_snap_claim(struct writer *w, const struct kvr_queue_topic *t, struct ing_stream *s);
/* The pod was forgotten: its restored streams go too (writer thread). */
void kvr_ingest_snap_forget(struct writer *w, const char *pod);
/* kvr_ingest_streams(): the restored streams not taken over yet (reg_mu held). */
void kvr_ingest_snap_list(struct kvr_ingest *ing, void (*cb)(const struct kvr_stream_info *s,
                                                               void *arg),
                          void *arg);
/* destroy */
void kvr_ingest_snap_free(struct kvr_ingest *ing);

/* ingest_metrics.c: the name of a skip reason (the decoder's, then SKIP_NO_BLOCK_SIZE...). */
const char *kvr_ingest_skip_name(int r);
/* The state a reader shows for s (under reg_mu, for s->wid): the state machine's, then
 * over_budget, then incomplete when its worker holds orphans (*orphans, may be NULL). */
enum kvr_stream_state kvr_ingest_shown_state(struct kvr_ingest *ing, struct ing_stream *s,
                                             uint32_t *orphans);

#endif
