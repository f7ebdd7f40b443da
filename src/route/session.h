/* session.h — session affinity: a conversation's key bound to the worker of its last
 * routing decision, for an idle time.
 *
 * Why: a conversation's next turn should run where its previous turn ran, where its KV cache
 * is, even before that worker's events say so (a turn arriving while the previous one is
 * still prefilling) and on workers that publish no events at all. Dynamo
 * (X-Dynamo-Session-ID), llm-d (x-session-id, 300 s) and vLLM's production-stack
 * (--session-key) bind sessions explicitly; route.c decides when a bond is kept or broken.
 *
 * A bond: key (1..KVR_SESSION_KEY_MAX bytes, any bytes) -> (pod, dp_rank, last use). Bonds
 * idle for longer than the caller's ttl are gone; past max bonds the least recently used
 * one goes first. Bonds to a pod are dropped with it (kvr_session_drop_pod).
 *
 * Pure: no clock (times are passed in, non-decreasing), no lock (route's mutex covers it),
 * no I/O. Errors: negative errno.
 */
#ifndef KVR_SESSION_H
#define KVR_SESSION_H

#include <stddef.h>
#include <stdint.h>

#define KVR_SESSION_KEY_MAX 256

struct kvr_session;

int kvr_session_create(uint32_t max, struct kvr_session **out);
void kvr_session_destroy(struct kvr_session *s);
/* The most bonds kept (>= 1); lowering it evicts the least recently used at once. */
void kvr_session_set_max(struct kvr_session *s, uint32_t max);

/* The bond of key if it was used after before_ms (an older one is dropped): 1 with *pod
 * (valid until the next call that changes s) and *dp_rank set, else 0. */
int kvr_session_get(struct kvr_session *s, const char *key, size_t len, int64_t before_ms,
                    const char **pod, uint32_t *dp_rank);

/* Binds key to (pod, dp_rank), used at now_ms (a new bond, or moved and refreshed).
 * 0, -EINVAL (key empty or too long, pod empty) or -ENOMEM (nothing changed). */
int kvr_session_bind(struct kvr_session *s, const char *key, size_t len, const char *pod,
                     uint32_t dp_rank, int64_t now_ms);

/* Drops the bonds last used at or before before_ms; returns how many. */
size_t kvr_session_expire(struct kvr_session *s, int64_t before_ms);

/* Drops every bond to pod (any rank); returns how many. */
size_t kvr_session_drop_pod(struct kvr_session *s, const char *pod);

size_t kvr_session_count(const struct kvr_session *s);

#endif
