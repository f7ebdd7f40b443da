/* queue.c — bounded ring with in-place slots, lock-free fast path, sleeping slow path.
 *
 * Positions are monotonically increasing 64-bit counters: `tail` counts committed items
 * (written by the producer holding `pmu`), `head` counts released ones (written by the
 * consumer only). depth = tail - head; slot of position p = p % capacity.
 *
 * Fast path: no lock between the two sides; the producer publishes a slot with a store to
 * `tail`, the consumer frees slots with a store to `head`.
 *
 * Sleeping (Dekker-style, seq_cst on both sides so no wake-up is lost): a side that finds
 * nothing to do takes `mu`, sets its `*_sleeping` flag, re-reads the other side's position
 * and only then waits on its condition variable. The other side stores its position and then
 * reads the flag; when set, it takes `mu` and signals. Either the sleeper sees the new
 * position or the waker sees the flag, and because the sleeper holds `mu` from setting the
 * flag until pthread_cond_wait atomically releases it, the signal cannot fall in between.
 *
 * Threads: producers serialize on `pmu` (held from reserve to commit/cancel); one consumer.
 */
#include "events/queue.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvr_queue {
    uint32_t cap;
    size_t stride;
    unsigned char *slots;

    _Atomic uint64_t head;       /* consumer only writes */
    _Atomic uint64_t tail;       /* producer holding pmu only writes */
    uint64_t acquired;           /* consumer only */
    _Atomic bool closed;

    pthread_mutex_t pmu;         /* producers: reserve → commit */
    pthread_mutex_t mu;          /* sleeping and wake-ups */
    pthread_cond_t not_empty;    /* consumer waits */
    pthread_cond_t not_full;     /* producer waits */
    _Atomic int consumer_sleeping;
    _Atomic int producer_sleeping;

    _Atomic uint64_t waits;
    _Atomic uint64_t max_depth;  /* producer holding pmu only writes */
};

int kvr_queue_create(uint32_t capacity, size_t item_size, struct kvr_queue **out)
{
    struct kvr_queue *q;
    pthread_condattr_t ca;

    if (capacity == 0 || item_size == 0 || item_size > (1u << 20))
        return -EINVAL;
    q = calloc(1, sizeof(*q));
    if (q == NULL)
        return -ENOMEM;
    q->cap = capacity;
    q->stride = (item_size + 15) & ~(size_t)15;
    q->slots = aligned_alloc(16, q->stride * capacity);
    if (q->slots == NULL) {
        free(q);
        return -ENOMEM;
    }
    memset(q->slots, 0, q->stride * capacity);
    pthread_mutex_init(&q->pmu, NULL);
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->not_empty, &ca);
    pthread_cond_init(&q->not_full, &ca);
    pthread_condattr_destroy(&ca);
    *out = q;
    return 0;
}

void kvr_queue_destroy(struct kvr_queue *q)
{
    if (q == NULL)
        return;
    pthread_cond_destroy(&q->not_empty);
    pthread_cond_destroy(&q->not_full);
    pthread_mutex_destroy(&q->mu);
    pthread_mutex_destroy(&q->pmu);
    free(q->slots);
    free(q);
}

static inline void *slot_at(struct kvr_queue *q, uint64_t pos)
{
    return q->slots + (size_t)(pos % q->cap) * q->stride;
}

void *kvr_queue_reserve(struct kvr_queue *q, bool *waited)
{
    uint64_t t;

    if (waited != NULL)
        *waited = false;
    pthread_mutex_lock(&q->pmu);
    if (atomic_load(&q->closed)) {
        pthread_mutex_unlock(&q->pmu);
        return NULL;
    }
    t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    if (t - atomic_load_explicit(&q->head, memory_order_acquire) >= q->cap) {
        atomic_fetch_add_explicit(&q->waits, 1, memory_order_relaxed);
        if (waited != NULL)
            *waited = true;
        pthread_mutex_lock(&q->mu);
        atomic_store(&q->producer_sleeping, 1);
        while (t - atomic_load(&q->head) >= q->cap && !atomic_load(&q->closed))
            pthread_cond_wait(&q->not_full, &q->mu);
        atomic_store(&q->producer_sleeping, 0);
        pthread_mutex_unlock(&q->mu);
        if (atomic_load(&q->closed)) {
            pthread_mutex_unlock(&q->pmu);
            return NULL;
        }
    }
    return slot_at(q, t);
}

void *kvr_queue_try_reserve(struct kvr_queue *q)
{
    uint64_t t;
    int tries = 0;

    /* A producer waiting in kvr_queue_reserve for a full ring holds pmu meanwhile: a plain
     * lock here would wait with it. So: a full ring gives up at once, and pmu is only tried
     * (a producer that is merely filling its slot lets go within a few hundred cycles). */
    for (;;) {
        if (atomic_load(&q->closed) ||
            atomic_load_explicit(&q->tail, memory_order_relaxed) -
                    atomic_load_explicit(&q->head, memory_order_acquire) >= q->cap)
            return NULL;
        if (pthread_mutex_trylock(&q->pmu) == 0)
            break;
        if (++tries == 256)
            return NULL;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    if (atomic_load(&q->closed) ||
        t - atomic_load_explicit(&q->head, memory_order_acquire) >= q->cap) {
        pthread_mutex_unlock(&q->pmu);
        return NULL;
    }
    return slot_at(q, t);
}

void kvr_queue_commit(struct kvr_queue *q)
{
    uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed) + 1;
    uint64_t depth;

    atomic_store(&q->tail, t); /* seq_cst: pairs with the consumer's sleeping protocol */
    depth = t - atomic_load_explicit(&q->head, memory_order_relaxed);
    if (depth > atomic_load_explicit(&q->max_depth, memory_order_relaxed))
        atomic_store_explicit(&q->max_depth, depth, memory_order_relaxed);
    if (atomic_load(&q->consumer_sleeping)) {
        pthread_mutex_lock(&q->mu);
        pthread_cond_signal(&q->not_empty);
        pthread_mutex_unlock(&q->mu);
    }
    pthread_mutex_unlock(&q->pmu);
}

void kvr_queue_cancel(struct kvr_queue *q)
{
    pthread_mutex_unlock(&q->pmu);
}

static void deadline_after(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

size_t kvr_queue_acquire(struct kvr_queue *q, size_t max, int64_t timeout_ms)
{
    uint64_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&q->tail, memory_order_acquire);
    size_t n;

    if (t == h && timeout_ms != 0 && !atomic_load(&q->closed)) {
        struct timespec ts;

        if (timeout_ms > 0)
            deadline_after(&ts, timeout_ms);
        pthread_mutex_lock(&q->mu);
        atomic_store(&q->consumer_sleeping, 1);
        while ((t = atomic_load(&q->tail)) == h && !atomic_load(&q->closed)) {
            if (timeout_ms < 0) {
                pthread_cond_wait(&q->not_empty, &q->mu);
            } else if (pthread_cond_timedwait(&q->not_empty, &q->mu, &ts) == ETIMEDOUT) {
                t = atomic_load(&q->tail);
                break;
            }
        }
        atomic_store(&q->consumer_sleeping, 0);
        pthread_mutex_unlock(&q->mu);
    } else if (t == h) {
        t = atomic_load(&q->tail);
    }
    n = (size_t)(t - h);
    if (n > max)
        n = max;
    q->acquired = n;
    return n;
}

void *kvr_queue_item(struct kvr_queue *q, size_t i)
{
    return slot_at(q, atomic_load_explicit(&q->head, memory_order_relaxed) + i);
}

void kvr_queue_release(struct kvr_queue *q, size_t n)
{
    uint64_t h;

    if (n == 0)
        return;
    if (n > q->acquired)
        n = q->acquired;
    q->acquired -= n;
    h = atomic_load_explicit(&q->head, memory_order_relaxed) + n;
    atomic_store(&q->head, h); /* seq_cst: pairs with the producer's sleeping protocol */
    if (atomic_load(&q->producer_sleeping)) {
        pthread_mutex_lock(&q->mu);
        pthread_cond_signal(&q->not_full);
        pthread_mutex_unlock(&q->mu);
    }
}

void kvr_queue_close(struct kvr_queue *q)
{
    pthread_mutex_lock(&q->mu);
    atomic_store(&q->closed, true);
    pthread_cond_broadcast(&q->not_empty);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->mu);
}

bool kvr_queue_closed(const struct kvr_queue *q)
{
    return atomic_load(&((struct kvr_queue *)q)->closed);
}

void kvr_queue_stats(const struct kvr_queue *cq, struct kvr_queue_stats *st)
{
    struct kvr_queue *q = (struct kvr_queue *)cq;
    uint64_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);

    st->depth = t >= h ? t - h : 0;
    st->capacity = q->cap;
    st->pushed = t;
    st->waits = atomic_load_explicit(&q->waits, memory_order_relaxed);
    st->max_depth = atomic_load_explicit(&q->max_depth, memory_order_relaxed);
}
