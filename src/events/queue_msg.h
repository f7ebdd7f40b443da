/* queue_msg.h — what travels through the writer queues: the contract between the producer
 * of event messages (zsub, the ZeroMQ receive thread) and their consumer (ingest, the writer
 * threads), so that neither includes the other's header.
 *
 * Why a header of its own: queue.c is a generic ring of item_size-byte slots and knows
 * nothing of this; zsub must not use ingest and ingest should not use zsub (ARCHITECTURE.md).
 * The items, the topic record both sides read, the replay request the consumer asks for and
 * the rule that picks a pod's writer (kvr_queue_shard) are written down once, here. Header
 * only, depends on nothing.
 *
 * Ownership: a payload is (data, len, release, ctx). The producer fills it; whoever holds the
 * item owns the payload and must release it exactly once (kvr_queue_payload_release) when
 * done; it may be copied by value to move it (e.g. into a replay buffer), the copy then owns
 * it. The consumer never needs to know what the bytes live in (a ZeroMQ message in the
 * daemon, a malloc'd buffer in tests).
 *
 * Threads: an item is written by its producer between kvr_queue_reserve() and
 * kvr_queue_commit(), then belongs to the consumer of that queue. A payload's release may run
 * on any thread.
 */
#ifndef KVR_QUEUE_MSG_H
#define KVR_QUEUE_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes handed over without copying, plus how to give them back. */
struct kvr_queue_payload {
    const void *data;
    size_t len;
    void (*release)(void *ctx); /* NULL: nothing to release */
    void *ctx;
};

static inline void kvr_queue_payload_release(struct kvr_queue_payload *p)
{
    if (p->release != NULL)
        p->release(p->ctx);
    p->release = NULL; /* releasing twice stays harmless */
    p->ctx = NULL;
    p->data = NULL;
    p->len = 0;
}

/* One distinct topic (per pod override): interned by the producer, immutable after, valid
 * until the producer is destroyed (so the consumer is destroyed first, or stops using it),
 * or, once the consumer released it and the producer sent its FORGET item, until the
 * consumer releases that item's payload (which frees the record). */
struct kvr_queue_topic {
    const char *pod;   /* NUL-terminated */
    const char *model;
    uint32_t shard;    /* kvr_queue_shard(pod) */
    uint32_t id;       /* unique among live topics */
    void *owner;       /* for the consumer of `shard` only (ingest's per-topic state) */
};

enum kvr_queue_kind {
    KVR_QUEUE_LIVE = 1,       /* a live batch: topic, seq, source, can_replay, payload */
    KVR_QUEUE_REPLAY = 2,     /* a replayed batch of request ctx/gen: topic, seq, payload */
    KVR_QUEUE_REPLAY_END = 3, /* replay ctx/gen finished: ok */
    KVR_QUEUE_PURGE = 4,      /* source went away long enough: purge what topic got from it */
    KVR_QUEUE_CMD = 5,        /* consumer-defined command in ctx (never from the producer) */
    KVR_QUEUE_FORGET = 6,     /* topic left the producer's table (the consumer released it):
                               * nothing more comes for it; payload owns the record: release
                               * it once the consumer no longer refers to the topic */
    KVR_QUEUE_ASSUME = 7,     /* consumer-defined (never from the producer): an approximate-
                               * mode assumption in payload, released by the consumer */
};

/* A slot of a writer queue (kvr_queue_create(depth, sizeof(struct kvr_queue_msg), ...)). */
struct kvr_queue_msg {
    struct kvr_queue_payload payload;   /* LIVE, REPLAY, FORGET, ASSUME: owned by the item */
    const struct kvr_queue_topic *topic; /* LIVE, REPLAY, PURGE, FORGET */
    void *ctx;                          /* REPLAY, REPLAY_END, CMD */
    uint64_t seq;                       /* LIVE, REPLAY */
    uint64_t recv_ns;                   /* LIVE, REPLAY: kvr_now_ns() at receipt */
    uint64_t pubid;                     /* LIVE: kvr_queue_pubid() of the publisher id the
                                         * seq frame carried after the seq; 0: none */
    uint32_t source;                    /* LIVE: source id; PURGE: the source gone */
    uint32_t gen;                       /* REPLAY, REPLAY_END: the request's gen */
    uint8_t kind;                       /* enum kvr_queue_kind */
    bool ok;                            /* REPLAY_END: end marker received */
    bool can_replay;                    /* LIVE: the source has a replay endpoint */
};

/* A replay request from the consumer: batches from `start` of `source`, answered by REPLAY
 * items then one REPLAY_END into queue[shard], all carrying ctx and gen. dp_rank is the
 * stream's DP rank (from its batches: the producer never decodes them): a source whose
 * replay address is a template ([events] bind_replay) builds it from topic->pod and it. */
struct kvr_queue_replay_req {
    uint32_t source;
    uint32_t shard;
    uint32_t gen;
    uint32_t dp_rank;
    uint64_t start;
    const struct kvr_queue_topic *topic;
    void *ctx;
};

/* The writer that owns a pod: FNV-1a-32 of the pod name modulo n (n >= 1; 0 gives 0). Every
 * batch and every command about a pod goes to this queue, so one thread writes its workers. */
static inline uint32_t kvr_queue_shard(const char *pod, size_t len, uint32_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)pod[i];
        h *= 16777619u;
    }
    return n > 0 ? h % n : 0;
}

/* The publisher id of a vLLM engine run (a random id per publisher lifetime, sent after the
 * seq in the seq frame, or as a batch's 4th element), reduced to 64 bits for comparison:
 * FNV-1a-64, never 0 (0 means "no id"). Two runs colliding is a 2^-64 chance. */
static inline uint64_t kvr_queue_pubid(const void *id, size_t len)
{
    const unsigned char *p = id;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h != 0 ? h : 1;
}

#endif
