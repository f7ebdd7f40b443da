/* route.h — one routing decision from a query's scores and the candidates' loads, and the
 * loads kvrouterd tracks itself for gateways that know none.
 *
 * Why a module: a score alone leaves every gateway to write a policy, and most gateways
 * (nginx, HAProxy) cannot. The policies follow the peers so that operators find the
 * behaviour they know:
 *   cost        (NVIDIA Dynamo's KV router) per candidate
 *                 cost = overlap_weight * (query_blocks - matched_blocks) + decode_blocks,
 *               decode_blocks = ceil(active_tokens / block_size); the lowest cost wins, ties
 *               broken by a seeded random choice; with temperature > 0 a candidate is drawn
 *               with probability softmax(-cost_normalized / temperature) instead, costs
 *               normalized by the largest.
 *   cache_aware (SGLang's gateway) loads = active requests; when they are imbalanced
 *               (max - min > balance_abs_threshold and max > min * balance_rel_threshold)
 *               the least loaded; else when the best match rate (matched / query blocks)
 *               reaches cache_threshold the best match (ties: least loaded); else the least
 *               loaded.
 *   score       the best score, ordered as POST /v1/score orders it (score, then pod, then
 *               dp_rank); when nothing matches, the least loaded.
 *   ttft        (the default) the lowest predicted time to first token from the in-flight
 *               work of kvrouterd's own decisions, confirmed by the workers' KV events, and
 *               the engines' own /metrics (load.h); route_flight.c has the formula.
 * Loads: a candidate's active_requests/active_tokens come from the gateway when it sends
 * them, else from what kvrouterd tracks: a decision made with track counts the request as
 * active on the chosen worker (1 request, its prompt tokens) until kvr_route_end or
 * max_request_age.
 *
 * Approximate mode, for engines that publish no KV events ([model "NAME"] approximate,
 * approximate_pods; Dynamo's --no-kv-events router, SGLang's approximate radix tree): a
 * decision to such a worker is taken as the worker now holding the request's blocks. This
 * module only says which decisions are assumed (kvr_route_assumes); the caller hands the
 * blocks to the worker's ingest writer, which keeps them in the index's "assumed" tier with
 * [route] assumed_ttl and assumed_max_blocks (assume.h), and never for a worker that
 * publishes events (events take precedence). The block size such a model is scored at while
 * no event taught one is score's ([model] block_size, else 16).
 *
 * Uses conf (the [route] settings and the [model] sections' approximate keys) only. Threads: any; one mutex for loads, tracked requests
 * and the random stream (a decision holds it for a few µs).
 */
#ifndef KVR_ROUTE_H
#define KVR_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/conf.h"

enum kvr_route_policy {
    KVR_ROUTE_COST = 0,
    KVR_ROUTE_CACHE_AWARE,
    KVR_ROUTE_SCORE,
    KVR_ROUTE_TTFT,
    KVR_ROUTE_NPOLICIES
};

/* "cost", "cache_aware", "score", "ttft" → the policy, or -1. */
int kvr_route_policy_parse(const char *s);
const char *kvr_route_policy_name(int policy);

struct kvr_route;

/* [route] settings from c (the seed is read once: 0 = from the clock). */
int kvr_route_create(const struct kvr_conf *c, struct kvr_route **out);
void kvr_route_destroy(struct kvr_route *r);
/* SIGHUP: the reloadable [route] settings. */
void kvr_route_set_conf(struct kvr_route *r, const struct kvr_conf *c);
/* The [route] policy now (what a query without "policy" gets). */
int kvr_route_policy(struct kvr_route *r);

/* A worker's part in disaggregated serving (route_pd.c). */
enum kvr_route_role {
    KVR_ROUTE_BOTH = 0, /* prefills and decodes (the default) */
    KVR_ROUTE_PREFILL,  /* prefills only: its KV cache goes to a decode worker */
    KVR_ROUTE_DECODE    /* decodes only (a prefill worker's KV comes to it) */
};
/* "both", "prefill", "decode" -> the role, or -1. */
int kvr_route_role_parse(const char *s);
const char *kvr_route_role_name(int role);
/* Whether the model lists prefill_pods or decode_pods. */
bool kvr_route_has_roles(struct kvr_route *r, const char *model);
/* A candidate role not given by the gateway (kvr_route_cand.role before
 * kvr_route_resolve_roles). */
#define KVR_ROUTE_ROLE_UNSET 0xff
struct kvr_route_cand;
/* Each candidate whose role is KVR_ROUTE_ROLE_UNSET gets its pod's role from the model's
 * prefill_pods / decode_pods (both when listed in neither): one look under the mutex. */
void kvr_route_resolve_roles(struct kvr_route *r, const char *model, struct kvr_route_cand *c,
                             size_t n);
/* The role the model's prefill_pods / decode_pods give pod (both when it lists neither). */
int kvr_route_role_of(struct kvr_route *r, const char *model, const char *pod);
/* One worker with a role other than both, or one a gateway gave a role to (/v1/pods). */
struct kvr_route_role_info {
    const char *model;   /* config: the [model] section; gateway: NULL */
    const char *pod;
    int64_t dp_rank;     /* config: -1 (every rank); gateway: the worker's */
    int role;            /* enum kvr_route_role */
    bool from_gateway;   /* the role the candidates of the last decision routed there gave */
    int64_t idle_ms;     /* gateway: since that worker's last decision or confirmation */
};
/* Calls cb for every configured role (each model's prefill_pods, then decode_pods), then for
 * every worker whose last routed decision came with a gateway's role (under the mutex: cb
 * must not call back into route). */
void kvr_route_roles(struct kvr_route *r,
                     void (*cb)(void *arg, const struct kvr_route_role_info *ri), void *arg);
/* Calls cb(arg, pod, 0) for each of the model's prefill_pods (under the mutex). */
void kvr_route_prefill_pods(struct kvr_route *r, const char *model,
                            void (*cb)(void *arg, const char *pod, uint32_t dp_rank), void *arg);

struct kvr_route_cand {
    const char *pod; /* NUL-terminated, borrowed for the call */
    uint32_t dp_rank;
    uint8_t role;    /* enum kvr_route_role */
    bool role_given; /* out (kvr_route_resolve_roles): the gateway sent the role */
    uint32_t matched_blocks;       /* the cached prefix the policies use: /v1/score's
                                    * predicted_blocks, the better of exact and predicted */
    uint32_t exact_blocks;         /* /v1/score's matched_blocks (reported, not used) */
    double score;                  /* as /v1/score computes it */
    bool has_requests, has_tokens; /* the gateway sent the load */
    bool evented;                  /* known to publish KV events (its prefills are confirmed
                                    * by them); false: unknown, see kvr_route_query.model */
    uint64_t active_requests;      /* in: the gateway's; out: the one used */
    uint64_t active_tokens;
    double cost; /* out: the policy's figure (cost; match rate for cache_aware; score;
                  * predicted seconds to first token for ttft) */
    /* out, the in-flight view (every policy): */
    uint64_t queued_tokens;  /* prefill tokens queued ahead of this request */
    uint64_t uncached_tokens; /* this request's prompt tokens the worker would compute */
    double running;          /* requests decoding */
    double rate;             /* prefill tokens/s assumed (learned, else configured) */
    double kv_usage;         /* the engine's, < 0 unknown */
    bool busy;               /* over [route] busy_kv_usage or busy_waiting */
    bool engine_load;        /* an engine metrics sample was used (fresh, not stale) */
};

struct kvr_route_query {
    uint32_t query_blocks;
    uint32_t block_size; /* 0 when the model is unknown */
    uint64_t prompt_tokens;
    uint64_t last_block; /* content hash (kvr_hash_blocks, extra keys folded) of the
                          * query's last full block; 0 = none (query_blocks 0) */
    bool commit;         /* record the decision as in-flight work on the chosen worker */
    const char *model;   /* NULL, or the model: a chosen candidate not known to publish
                          * events (evented false) is taken to publish them unless the
                          * model's approximate mode covers it (kvr_route_assumes) */
    int policy;          /* -1: [route] policy */
    const char *session; /* the session key (any bytes), NULL/0 = none */
    size_t session_len;
    struct kvr_route_cand *cands;
    size_t ncands;
};

/* What a decision did with the query's session key. */
enum kvr_route_session_out {
    KVR_ROUTE_SESSION_NONE = 0,  /* no key, or sessions off */
    KVR_ROUTE_SESSION_NEW,       /* no bond (or an idle one): the policy's choice, bound */
    KVR_ROUTE_SESSION_KEPT,      /* the bond's worker, chosen (by the policy or the bond) */
    KVR_ROUTE_SESSION_BUSY,      /* broken: its worker is busy while another is not */
    KVR_ROUTE_SESSION_SLOW,      /* broken: its predicted time exceeds the best's by more
                                  * than [route] session_max_wait (ttft) */
    KVR_ROUTE_SESSION_GONE,      /* broken: its worker is not a candidate any more */
    KVR_ROUTE_SESSION_NOUT
};
/* "none", "new", "kept", "busy", "slow", "gone". */
const char *kvr_route_session_name(int out);

struct kvr_route_decision {
    size_t chosen;      /* index into cands: where the request goes (for a disaggregated
                         * query, the decode worker) */
    size_t prefill;     /* disaggregated: the prefill worker's index; SIZE_MAX: none */
    bool pd;            /* some candidate has a role: the P/D decision ran */
    int policy;
    int session;        /* enum kvr_route_session_out */
    char reason[128];
};

/* Disaggregated prefill and decode (route_pd.c): when a candidate's role is prefill or
 * decode, the decode worker is the decode-capable candidate (decode or both) with the fewest
 * running requests (then the least queued prefill, then a seeded random choice); the request
 * stays on it alone when its uncached tokens there are under [route] pd_local_max_uncached
 * and at most pd_local_max_share of the prompt, or when
 * no prefill-capable candidate is another worker; else the policy chooses the prefill worker
 * among the prefill-capable candidates (prefill or both) and the decision counts the prefill
 * there and a decoding request on the decode worker. -ENOENT: no decode-capable candidate.
 * Sessions do not apply to such a query.
 *
 * Decides (ncands >= 1, else -EINVAL). Fills each candidate's loads, cost and in-flight
 * view. With a session key and [route] session_ttl > 0: a bond to a candidate, used within
 * the ttl, chooses that candidate unless it is busy while another is not, or (ttft) its
 * predicted time exceeds the best's by more than session_max_wait; then (and with no bond)
 * the policy's choice, and the key is bound to the chosen worker (not on -EBUSY). With q->commit, the chosen worker gets the request as in-flight work: a prefill of
 * its uncached tokens until the worker's events store the request's last full block
 * (kvr_route_confirm; a worker without events: until the predicted time), then a decoding
 * request until a newer engine metrics sample counts it or [route] decode_time passes.
 * -EBUSY: ttft found every candidate busy and [route] when_all_busy = reject (nothing
 * committed; d->chosen is the best anyway). */
int kvr_route_decide(struct kvr_route *r, struct kvr_route_query *q,
                     struct kvr_route_decision *d);

/* ---- the engines' own load, and confirmations by KV events ----------------------------- */

/* What an engine reports about itself (its /metrics), for one (pod, dp_rank). */
struct kvr_route_engine_load {
    double waiting, running; /* requests */
    double kv_usage;         /* 0..1; < 0 unknown */
    int64_t sample_ns;       /* CLOCK_MONOTONIC time the sample was taken */
    bool stale;              /* the source has had no good sample for too long */
};
/* 0 with *out filled, or -ENOENT (no sample). Called under the route mutex: must not call
 * back into route, and must be quick (no I/O). */
typedef int (*kvr_route_load_fn)(void *arg, const char *pod, uint32_t dp_rank,
                                 struct kvr_route_engine_load *out);
/* Before decisions start (not thread-safe against them). fn NULL: no engine metrics. */
void kvr_route_set_load_source(struct kvr_route *r, kvr_route_load_fn fn, void *arg);

/* The worker (pod, dp_rank) stored blocks with these content hashes (an ingest writer, after
 * applying a BlockStored): our prefills on it whose last full block is among them are done.
 * Any thread; returns at once without the mutex when nothing is pending anywhere. */
void kvr_route_confirm(struct kvr_route *r, const char *pod, uint32_t dp_rank,
                       const uint64_t *content, size_t n);

/* ---- replicas sharing their decisions (share.h carries them) --------------------- */

/* A committed decision as a replica's peers take it in: its uncached tokens queue as a
 * prefill on (pod, dp_rank), confirmed by the worker's events through key (the content hash
 * of the request's last full block; evented false or key 0: done at the predicted time). */
struct kvr_route_shared {
    const char *pod; /* NUL-terminated, borrowed for the call */
    uint32_t dp_rank;
    uint64_t tokens;
    uint64_t key;
    bool evented;
};
/* Called under the route mutex for every committed decision: must copy what it keeps and
 * return at once (no I/O, no call into route). */
typedef void (*kvr_route_share_fn)(void *arg, const struct kvr_route_shared *s);
void kvr_route_set_share(struct kvr_route *r, kvr_route_share_fn fn, void *arg);
/* A peer's decision: in-flight work on its worker from now, as if decided here (not a
 * decision of ours: no session, no counters but its own). 0, -EINVAL, -ENOMEM. */
int kvr_route_apply_shared(struct kvr_route *r, const struct kvr_route_shared *s);

/* The in-flight view of one worker, for /v1/pods. */
struct kvr_route_flight {
    uint64_t requests, tokens; /* tracked (track + DELETE), as kvr_route_load */
    uint32_t pending;         /* our prefills not yet confirmed */
    uint64_t pending_tokens;  /* their uncached tokens */
    uint32_t decoding;        /* our confirmed requests still counted as decoding */
    uint64_t confirmed;       /* prefills confirmed by its events so far */
    double prefill_rate;      /* learned tokens/s; 0 = none yet */
    int role_given;           /* the role a gateway gave with the last decision routed
                               * here (enum kvr_route_role), -1: none */
};
/* The view of (pod, dp_rank): all zero when kvrouterd keeps nothing for it. */
void kvr_route_flight_of(struct kvr_route *r, const char *pod, uint32_t dp_rank,
                         struct kvr_route_flight *out);
/* Calls cb for each worker kvrouterd keeps in-flight state or a learned rate for (under the
 * route mutex: cb must not call back into route). */
void kvr_route_flights(struct kvr_route *r,
                       void (*cb)(void *arg, const char *pod, uint32_t dp_rank,
                                  const struct kvr_route_flight *f),
                       void *arg);

/* Counts a request as active on (pod, dp_rank) with tokens prompt tokens; *id gets its route
 * id (16 hex digits + NUL). 0, or -ENOMEM, or -ENOSPC past the tracking limit. */
int kvr_route_track(struct kvr_route *r, const char *pod, uint32_t dp_rank, uint64_t tokens,
                    char id[17]);
/* Ends a tracked request: 0, or -ENOENT (unknown, ended or expired). */
int kvr_route_end(struct kvr_route *r, const char *id, size_t len);

/* The tracked loads, for /v1/pods: calls cb for each worker with active requests. */
void kvr_route_loads(struct kvr_route *r,
                     void (*cb)(void *arg, const char *pod, uint32_t dp_rank, uint64_t requests,
                                uint64_t tokens),
                     void *arg);

/* The tracked load of one worker (0, 0 when none). */
void kvr_route_load(struct kvr_route *r, const char *pod, uint32_t dp_rank, uint64_t *requests,
                    uint64_t *tokens);

/* ---- approximate mode (any thread; under the route mutex) ------------------------------ */

/* Whether a decision to (model, pod) is to be assumed: [model] approximate is on, or the
 * pod is in its approximate_pods. */
bool kvr_route_assumes(struct kvr_route *r, const char *model, const char *pod);
/* Calls cb(arg, pod, 0) for each pod of model's approximate_pods (default route
 * candidates), under the route mutex (cb must not call back into route). Returns how many. */
size_t kvr_route_approx_pods(struct kvr_route *r, const char *model,
                             void (*cb)(void *arg, const char *pod, uint32_t dp_rank), void *arg);

/* DELETE /v1/pods/POD: the session bonds to pod are dropped; returns how many. */
size_t kvr_route_forget_pod(struct kvr_route *r, const char *pod);

/* Prometheus lines: decisions by policy, tracked requests, expiries, per-worker loads. */
void kvr_route_metrics(struct kvr_route *r, struct kvr_buf *out);

#endif
