/* share.h — replicas share their routing decisions over ZeroMQ, so that each one's in-flight
 * view counts the work the others just sent to a worker.
 *
 * Why: several kvrouterd replicas behind a round-robin of callers each see only their own
 * decisions; between two engine scrapes they all pick the same "best" worker (Dynamo #589,
 * production-stack #166; llm-d pins its picker to one replica for this reason; Dynamo's
 * replicas publish their active sequences to each other). ZeroMQ is already the event plane:
 * no new system to run. Each replica binds a PUB socket ([route] peer_bind) and connects a
 * SUB socket to the others' ([route] peers). A committed decision (route.h's share hook)
 * is copied into a bounded ring without waiting (full: dropped, counted) and a thread of
 * this module sends the ring in batches (at most KVR_SHARE_BATCH decisions or 1 ms after
 * the first one waited). Received batches are applied to route as in-flight work from now
 * (kvr_route_apply_shared); confirmations need no message: every replica reads the same
 * engines' events and confirms by the same block hash. A replica's own batches (its id, 16
 * random bytes at start) are skipped, so a peer list may name every replica. A lost peer or
 * batch costs accuracy (work not counted until the engines' scrapes show it), never
 * correctness: decisions never wait for a peer.
 *
 * The wire (one ZeroMQ frame, little-endian): "KVRS", version 1, 3 zero bytes, the sender's
 * id (16 bytes), count (u16), 2 zero bytes; then count entries: dp_rank (u32), tokens (u64),
 * key (u64), flags (u8: 1 = evented), pod length (u8, 1..KVR_SHARE_POD_MAX), the pod's
 * bytes. A frame that does not parse whole is refused and counted (kvr_share_decode).
 *
 * Threads: kvr_share_publish from any thread under route's mutex; one thread of its own.
 */
#ifndef KVR_SHARE_H
#define KVR_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/err.h"
#include "route/route.h"

#define KVR_SHARE_BATCH 256
#define KVR_SHARE_POD_MAX 255
#define KVR_SHARE_RING 8192 /* decisions waiting to be sent */
#define KVR_SHARE_HDR 28

struct kvr_share;

/* bind: the PUB endpoint ("" or NULL = none: this replica only listens); peers: the others'
 * PUB endpoints, separated by blanks or commas ("" or NULL = none). Binds and connects now
 * (errors name the endpoint). */
int kvr_share_create(struct kvr_route *route, const char *bind, const char *peers,
                     struct kvr_share **out, struct kvr_err *err);
int kvr_share_start(struct kvr_share *s, struct kvr_err *err);
/* Stops the thread (queued decisions are sent first, 100 ms at most) and frees. NULL ok. */
void kvr_share_destroy(struct kvr_share *s);
/* route.h's kvr_route_share_fn: queues the decision (arg = the kvr_share). */
void kvr_share_publish(void *arg, const struct kvr_route_shared *d);
/* Prometheus lines: kvrouter_share_*. */
void kvr_share_metrics(struct kvr_share *s, struct kvr_buf *out);

/* ---- the codec (pure; for tests and fuzzing) ---- */

/* Encodes n decisions (n <= KVR_SHARE_BATCH, pods 1..KVR_SHARE_POD_MAX bytes) from id into
 * out (reset first). 0 or -EINVAL / -ENOMEM. */
int kvr_share_encode(const uint8_t id[16], const struct kvr_route_shared *d, size_t n,
                     struct kvr_buf *out);
/* Decodes a frame: calls cb for each entry (pod NUL-terminated in a scratch copy) unless the
 * sender is self (then returns 1 and calls nothing). 0, 1, or -EINVAL with err naming what is
 * wrong (nothing was called: the frame is checked whole first). */
int kvr_share_decode(const void *buf, size_t len, const uint8_t self[16],
                     void (*cb)(void *arg, const struct kvr_route_shared *d), void *arg,
                     struct kvr_err *err);

#endif
