/* ingest.h — from ZeroMQ messages to index updates: sockets (via zsub), FNV-1a sharded writer
 * threads, per-stream sequence tracking (gaps, replays, restarts), counters.
 *
 * Lifecycle (main thread): create → start → ... → stop → destroy. stop() stops intake, drains
 * the writer queues (every received batch is applied), joins the threads.
 *
 * Threads: after start, the query/admin functions below may be called from any thread (the
 * HTTP loops). Mutations of a pod's blocks (purge) are executed on the writer thread that
 * owns the pod and the call waits for them, so writers stay the only writers of their
 * workers.
 */
#ifndef KVR_INGEST_H
#define KVR_INGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "err.h"
#include "index.h"
#include "metrics.h"
#include "stream.h" /* enum kvr_stream_state */

struct kvr_ingest;

int kvr_ingest_create(const struct kvr_conf *conf, struct kvr_index *ix, struct kvr_ingest **out,
                      struct kvr_err *err);
/* Binds/connects every configured endpoint and starts the threads. A bind that fails (address
 * in use, bad endpoint) is an error here, with the endpoint in err. */
int kvr_ingest_start(struct kvr_ingest *ing, struct kvr_err *err);
/* Idempotent; safe before start. */
void kvr_ingest_stop(struct kvr_ingest *ing);
void kvr_ingest_destroy(struct kvr_ingest *ing);

/* True once every configured socket is bound/connecting and the threads run; false again
 * after stop() begins. */
bool kvr_ingest_ready(const struct kvr_ingest *ing);

/* Bound endpoints as actually bound (tcp://host:port with the real port when the config said
 * port 0 or '*'); fills up to cap borrowed strings, returns the count. */
size_t kvr_ingest_bound_endpoints(const struct kvr_ingest *ing, const char **eps, size_t cap);

/* ---- runtime connect endpoints (admin API) ------------------------------------------ */

/* Adds a connect endpoint (our SUB dials an engine PUB), with an optional replay endpoint and
 * pod override. -EEXIST when already present, -EINVAL for a bad endpoint. */
int kvr_ingest_endpoint_add(struct kvr_ingest *ing, const char *endpoint, const char *replay,
                            const char *pod, struct kvr_err *err);
/* Disconnects it; its workers are purged after purge_after_disconnect like any disconnect.
 * -ENOENT when not present. */
int kvr_ingest_endpoint_del(struct kvr_ingest *ing, const char *endpoint, struct kvr_err *err);

struct kvr_endpoint_info {
    const char *endpoint;
    const char *replay;   /* NULL if none */
    const char *pod;      /* NULL if none */
    bool connected;       /* per the socket monitor */
    bool from_config;     /* false when added at runtime */
};
/* Calls cb for each connect endpoint (under an internal lock: cb must not call back). */
void kvr_ingest_endpoints(struct kvr_ingest *ing,
                          void (*cb)(const struct kvr_endpoint_info *e, void *arg), void *arg);

/* ---- pods / streams ------------------------------------------------------------------ */

/* Purges every block of the pod (all ranks, models, tiers) on its writer thread and waits.
 * *removed = (holder, block) pairs dropped. -ENOENT when the pod was never seen. */
int kvr_ingest_purge_pod(struct kvr_ingest *ing, const char *pod, uint64_t *removed);

/* One (topic, dp_rank) stream, joined with its worker's block counts. */
struct kvr_stream_info {
    const char *pod;      /* borrowed for the duration of the callback */
    const char *model;
    uint32_t dp_rank;
    uint64_t blocks;                 /* sum of tier_blocks (a block in two tiers counts twice) */
    uint64_t tier_blocks[KVR_TIER_MAX];
    const char *tier_names[KVR_TIER_MAX]; /* NULL for unused tiers */
    uint64_t last_seq;    /* last batch applied to the index */
    uint64_t gaps;
    uint64_t replays;
    uint64_t restarts;
    enum kvr_stream_state state;
    int64_t last_event_age_ms; /* since the last batch was applied */
};
/* A stream is listed once its first batch has been applied; last_seq is published after the
 * batch's index updates (release/acquire), so a caller that sees last_seq >= N and then
 * queries the index sees every batch up to N. */
void kvr_ingest_streams(struct kvr_ingest *ing,
                        void (*cb)(const struct kvr_stream_info *s, void *arg), void *arg);

/* Number of streams currently unsynced (gauge). */
uint64_t kvr_ingest_unsynced(struct kvr_ingest *ing);

/* Appends every ingestion counter, gauge and histogram in Prometheus text form. */
void kvr_ingest_metrics(struct kvr_ingest *ing, struct kvr_buf *out);

#endif
