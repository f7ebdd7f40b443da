/* queue.h — bounded hand-off between threads, with wake-ups and in-place slots.
 *
 * A ring of `capacity` fixed-size slots. Producers fill a slot in place (reserve → write →
 * commit), so an item that must not be byte-copied (a ZeroMQ message) is moved straight into
 * its slot; the consumer processes slots in place (acquire → item(i) → release) and so never
 * copies either. Nothing is ever dropped: a producer facing a full ring waits (the wait is
 * counted) until the consumer releases a slot or the queue is closed.
 *
 * Threads: any number of producer threads (serialized by an internal lock held from reserve
 * to commit/cancel, so keep that span short: no blocking calls in between); exactly one
 * consumer thread. Stats and depth may be read from any thread. Wake-ups cost a syscall only
 * when the other side is actually asleep.
 */
#ifndef KVR_QUEUE_H
#define KVR_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvr_queue;

/* capacity >= 1 slots of item_size bytes (slots are 16-byte aligned). 0 or -EINVAL/-ENOMEM. */
int kvr_queue_create(uint32_t capacity, size_t item_size, struct kvr_queue **out);
/* Items still queued are not touched: the owner drains them first if they hold resources. */
void kvr_queue_destroy(struct kvr_queue *q);

/* ---- producers ----------------------------------------------------------------------- */

/* Reserves the next slot, waiting while the ring is full. Returns the slot (contents
 * unspecified) with the producer lock held, or NULL once the queue is closed (lock not held).
 * *waited (may be NULL) is set to true when the call had to wait. */
void *kvr_queue_reserve(struct kvr_queue *q, bool *waited);
/* As kvr_queue_reserve, but never waits: NULL (lock not held) when the ring is full, the
 * queue closed, or another producer keeps the producer lock (it may be waiting for room)
 * beyond a short spin; the caller counts what it gave up. For producers that must not
 * block (an HTTP loop thread handing a command to a writer). */
void *kvr_queue_try_reserve(struct kvr_queue *q);
/* Publishes the reserved slot to the consumer and releases the producer lock. */
void kvr_queue_commit(struct kvr_queue *q);
/* Gives the reserved slot back unpublished and releases the producer lock. */
void kvr_queue_cancel(struct kvr_queue *q);

/* ---- the consumer -------------------------------------------------------------------- */

/* Waits up to timeout_ms (< 0: no limit, 0: do not wait) until at least one item is queued;
 * returns how many items (<= max) are now acquired, addressed by kvr_queue_item(q, 0..n-1),
 * or 0 on timeout, or 0 when the queue is closed and empty. */
size_t kvr_queue_acquire(struct kvr_queue *q, size_t max, int64_t timeout_ms);
void *kvr_queue_item(struct kvr_queue *q, size_t i);
/* Frees the first n acquired slots (n <= acquired count) for producers. */
void kvr_queue_release(struct kvr_queue *q, size_t n);

/* ---- both ---------------------------------------------------------------------------- */

/* After close, reserve returns NULL (waiting producers wake up and get NULL) and acquire
 * returns the remaining items, then 0 without waiting. Idempotent. */
void kvr_queue_close(struct kvr_queue *q);
bool kvr_queue_closed(const struct kvr_queue *q);

struct kvr_queue_stats {
    uint64_t depth;     /* items queued now (includes acquired, not yet released) */
    uint64_t capacity;
    uint64_t pushed;    /* items committed since creation */
    uint64_t waits;     /* reserve calls that found the ring full and waited */
    uint64_t max_depth; /* high-water mark */
};
void kvr_queue_stats(const struct kvr_queue *q, struct kvr_queue_stats *st);

#endif
