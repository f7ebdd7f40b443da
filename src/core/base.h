/* base.h — the few definitions every module shares: the length limit of names, and the
 * macros for statistics counters.
 *
 * Why one header: the name limit bounds buffers in zsub (topics), ingest (stream names),
 * index (interning) and reqbody (request fields); four copies drifted once (255 here, 256
 * there). The counter macros are the house rule for statistics ("relaxed _Atomic, or owned
 * by one thread"), written once so every module counts the same way.
 *
 * Header only; no module state. Assertions are KVR_ASSERT in log.h (they log before abort).
 */
#ifndef KVR_BASE_H
#define KVR_BASE_H

#include <stdatomic.h>

/* Pods, models, LoRA names, tier names: at most this many bytes (longer ones are -EINVAL). */
#define KVR_NAME_MAX 256

/* Statistics counters on _Atomic fields, relaxed: a reader sums or prints them, nothing is
 * ordered by them.
 *   KVR_CNT_GET(f)         read
 *   KVR_CNT_ADD(f, n)      add from any thread (a locked read-modify-write)
 *   KVR_CNT_INC(f)         add 1 from any thread
 *   KVR_CNT_OWN_ADD(f, n)  add from the one thread that owns f (a plain load and store: no
 *                          locked instruction on the hot path; readers see a torn-free value)
 *   KVR_CNT_OWN_INC(f)     add 1 from the owning thread
 *   KVR_CNT_SET(f, v)      store (gauges owned by one thread) */
#define KVR_CNT_GET(f) atomic_load_explicit(&(f), memory_order_relaxed)
#define KVR_CNT_ADD(f, n) atomic_fetch_add_explicit(&(f), (n), memory_order_relaxed)
#define KVR_CNT_INC(f) KVR_CNT_ADD(f, 1)
#define KVR_CNT_OWN_ADD(f, n)                                                                 \
    atomic_store_explicit(&(f), atomic_load_explicit(&(f), memory_order_relaxed) + (n),       \
                          memory_order_relaxed)
#define KVR_CNT_OWN_INC(f) KVR_CNT_OWN_ADD(f, 1)
#define KVR_CNT_SET(f, v) atomic_store_explicit(&(f), (v), memory_order_relaxed)

#endif
