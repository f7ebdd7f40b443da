/* route_int.h — what route.c (policies, tracked requests) and route_flight.c (in-flight work
 * of kvrouterd's own decisions, the ttft policy's view of each worker) share. Not a contract:
 * route.h is. Everything here is under kvr_route.mu unless a field says otherwise.
 */
#ifndef KVR_ROUTE_INT_H
#define KVR_ROUTE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "route/route.h"
#include "route/session.h"

#define WBUCKETS 1024
/* A worker keeps at most this many unconfirmed prefills and decoding requests of ours; past
 * it the oldest goes (counted): a worker that never confirms cannot grow memory. */
#define FLIGHT_MAX 4096

/* One decision of ours on a worker: a prefill until the worker's events (or, for a worker
 * without events, the predicted time) say it is done, then a decoding request. */
struct flight {
    uint64_t key;     /* content hash of the request's last full block; 0 = none */
    uint64_t tokens;  /* uncached prompt tokens the worker computes */
    uint64_t ahead;   /* the worker's queued prefill tokens when it was routed there */
    int64_t t0_ns;    /* decision */
    int64_t due_ns;   /* prefill: dropped (evented) or done (not evented) by then;
                       * decoding: the time it was confirmed */
    bool evented;
    bool prefill_only; /* a P/D prefill worker's: done, it is not decoding there */
    struct flight *prev, *next; /* pend: by t0_ns; dec: by due_ns; oldest first */
};

/* Both lists stay ordered (pend by decision time: decisions are taken under mu, so in
 * clock order; dec by confirmation time, inserted in place), so a decision's look at a
 * worker costs what changed since the last look, not the length of its lists: the
 * expired are at the head, the ones newer than an engine sample at the tail. */
struct flist {
    struct flight *head, *tail;
    uint32_t n;
};

struct wload {
    char *pod;
    uint32_t rank;
    uint64_t requests, tokens; /* tracked (track + DELETE) */
    struct flist pend;         /* our prefills not yet confirmed */
    uint64_t pend_tokens;      /* sum of pend's tokens */
    int64_t pend_due;          /* no pend entry is due before this (a lower bound) */
    struct flist dec;          /* our confirmed requests, counted as decoding */
    double rate;               /* learned prefill tokens/s (0: none yet): work / secs */
    double work, secs;         /* decayed sums of confirmed prefill tokens and their service
                                * times, whose ratio is the rate */
    int64_t served_ns;         /* last confirmation: the next pending prefill is served
                                * from then (or from its decision, if later) */
    uint64_t confirmed;        /* prefills its events confirmed */
    int64_t last_ns;           /* last decision, confirmation or track */
    uint8_t gw_role;           /* the gateway's role at the last decision routed here;
                                * KVR_ROUTE_ROLE_UNSET: none given */
    struct wload *next;
};

struct tracked {
    uint64_t id;
    struct wload *w;
    uint64_t tokens;
    int64_t t0_ms;
    struct tracked *hnext;       /* id table */
    struct tracked *prev, *next; /* start order, oldest first */
};

/* A [model] section's approximate-mode settings (models with none of them are not kept). */
struct approx {
    char *name;
    bool all;       /* approximate = on */
    char **pods;    /* approximate_pods */
    size_t npods;
    char **pre, **dec; /* prefill_pods, decode_pods (route_pd.c) */
    size_t npre, ndec;
};

struct kvr_route {
    pthread_mutex_t mu;
    struct approx *ap; /* under mu; replaced whole on reload */
    size_t nap;
    int policy;
    double overlap_weight, temperature, rel_threshold, cache_threshold;
    uint64_t abs_threshold;
    int64_t max_age_ms;
    uint32_t max_tracked;
    /* ttft and the in-flight accounting */
    double prefill_rate;       /* tokens/s assumed before a worker's events taught one */
    double uncached_weight;    /* ttft: the request's own uncached tokens count this much */
    double sticky_band;        /* ttft: within this share of the best time, the most cached */
    int64_t prefill_timeout_ns, decode_time_ns;
    uint64_t pd_local_max_uncached; /* P/D: stay on the decode worker under this ... */
    double pd_local_max_share;      /* ... and under this share of the prompt uncached */
    uint64_t pd_split, pd_local;    /* P/D decisions: disaggregated, kept local */
    double busy_kv_usage;      /* 0 = off */
    uint32_t busy_waiting;     /* 0 = off */
    bool reject_all_busy;
    kvr_route_load_fn load_fn; /* set before use; NULL = no engine metrics */
    void *load_arg;
    double fleet_rate;         /* learned over every worker (0: none yet) */
    double fleet_work, fleet_secs; /* its decayed sums */
    double mean_uncached;      /* running mean of decisions' uncached tokens */
    int64_t gc_ns;             /* next sweep of idle workers */
    _Atomic uint64_t npend;    /* prefills pending on every worker: the confirm hook's
                                * lock-free "nothing to do" (written under mu) */
    uint64_t confirmed, pend_expired, pend_estimated, pend_inferred, flight_dropped, all_busy,
        rejected,
        busy_skipped;
    kvr_route_share_fn share_fn; /* replicas: each committed decision (NULL = none) */
    void *share_arg;
    uint64_t shared_applied;     /* peers' decisions taken in */
    /* session affinity (session.h) */
    struct kvr_session *sess;
    int64_t session_ttl_ms;    /* 0 = off */
    double session_max_wait;   /* seconds; ttft breaks a bond past it */
    uint64_t sess_out[KVR_ROUTE_SESSION_NOUT];
    uint64_t rng;
    struct wload *w[WBUCKETS];
    struct tracked **t; /* id table, tmask + 1 buckets */
    size_t tmask, ntracked;
    struct tracked head; /* sentinel of the start-order list */
    uint64_t decisions[KVR_ROUTE_NPOLICIES], tracked_total, ended, expired;
};

int64_t route_now_ns(void);
uint64_t route_rand(struct kvr_route *r);
struct wload *route_wfind(struct kvr_route *r, const char *pod, uint32_t rank, bool create);
/* The model's [model] routing settings (approximate mode, P/D roles), NULL: none. mu held. */
const struct approx *route_approx_of(const struct kvr_route *r, const char *model);
/* kvr_route_assumes with mu held. */
bool route_assumes_locked(const struct kvr_route *r, const char *model, const char *pod);
/* Frees w when nothing refers to it and it learned nothing worth keeping. */
void route_wmaybe_free(struct kvr_route *r, struct wload *w);

/* route_flight.c */
void route_flight_free(struct wload *w);
/* Ages w's flights: unconfirmed prefills past their time, decoding requests past
 * decode_time. */
void route_flight_age(struct kvr_route *r, struct wload *w, int64_t now);
/* route_flight_age for every worker. */
void route_flight_age_all(struct kvr_route *r, int64_t now);
/* Fills every candidate's in-flight view (queued, running, ttft) at now. */
void route_flight_view(struct kvr_route *r, struct kvr_route_query *q, int64_t now);
/* Records the decision for candidate c as in-flight work on its worker (a prefill, then a
 * decoding request unless !decodes: a P/D prefill worker). */
void route_flight_commit(struct kvr_route *r, const struct kvr_route_query *q,
                         const struct kvr_route_cand *c, int64_t now, bool decodes);
/* The ttft policy. 0, or -EBUSY when every candidate is busy and reject_all_busy. */
int route_decide_ttft(struct kvr_route *r, struct kvr_route_query *q,
                      struct kvr_route_decision *d);
/* Frees workers idle for long with nothing in flight (every few seconds at most). */
void route_flight_gc(struct kvr_route *r, int64_t now);

/* route_pd.c: the P/D decision (route.h) after route_flight_view filled the candidates;
 * commits when q->commit. 0, -EBUSY (ttft, every prefill candidate busy, reject), -ENOENT. */
int route_decide_pd(struct kvr_route *r, struct kvr_route_query *q,
                    struct kvr_route_decision *d, int64_t now);
/* The policy d->policy over q's candidates (route.c). 0 or -EBUSY. */
int route_decide_policy(struct kvr_route *r, struct kvr_route_query *q,
                        struct kvr_route_decision *d);
/* A decoding request of ours on c's worker from now (route_flight.c). */
void route_flight_decoding(struct kvr_route *r, const struct kvr_route_cand *c, int64_t now);

/* route_session.c: after the policy chose d->chosen (and filled the candidates' costs and
 * busy flags), the query's session bond may choose instead; the key is bound to the final
 * choice. Sets d->session; now in ms. */
void route_session_apply(struct kvr_route *r, const struct kvr_route_query *q,
                         struct kvr_route_decision *d, int64_t now_ms);
/* Prometheus lines of the session bonds (mu held by the caller). */
void route_session_metrics(struct kvr_route *r, struct kvr_buf *out);

#endif
