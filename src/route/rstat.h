/* rstat.h — what routing decisions were worth: counters that add up.
 *
 * Why a module: an operator asks "is routing paying off?", and a mean of per-request ratios
 * cannot answer it (Dynamo's router_kv_hit_rate read 0.495 where the block-weighted rate was
 * 0.980). Every figure here is a sum, so that a rate is a ratio of sums in PromQL:
 *   predicted hit rate = sum(chosen_matched_blocks) / sum(query_blocks)
 *   chosen vs best     = sum(chosen_matched_blocks) / sum(best_matched_blocks)
 * per (endpoint, model, policy); decisions per outcome branch (cache, load, busy, fallback,
 * no_candidate); the decision latency by input kind (token ids, prompt, chat) and the part
 * of it spent tokenizing text; and per
 * worker the decisions routed to it with their matched blocks and tokens, to set beside the
 * engine's own vllm:prefix_cache_hits_total for the same pod.
 *
 * Cardinality is bounded: at most KVR_RSTAT_MAX_MODELS model names (others are counted under
 * model="_other"), at most KVR_RSTAT_MAX_WORKERS workers (others counted in
 * kvrouter_decision_worker_overflow_total), and a worker's series go away when its pod is
 * forgotten (kvr_rstat_forget_pod, from DELETE /v1/pods) or after ttl without a decision to
 * it (the daemon passes [events] forget_after: a pod purged or forgotten stops being a
 * candidate, so its series go after the same time; 0 = kept until the cap). The two caps are
 * constants rather than directives: they bound what /metrics renders, not what a peer can
 * send, and reaching them is counted (_other, the overflow counter).
 *
 * Uses core only; the caller classifies the outcome with kvr_rstat_branch (route.h's
 * candidates). Threads: any; one mutex around the tables (a record holds it for a few
 * hash probes), histograms are lock-free.
 */
#ifndef KVR_RSTAT_H
#define KVR_RSTAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "route/route.h"

#define KVR_RSTAT_MAX_MODELS 64
#define KVR_RSTAT_MAX_WORKERS 4096

enum kvr_rstat_endpoint { KVR_RSTAT_ROUTE = 0, KVR_RSTAT_SCORE, KVR_RSTAT_NENDPOINTS };
enum kvr_rstat_input { KVR_RSTAT_TOKENS = 0, KVR_RSTAT_PROMPT, KVR_RSTAT_CHAT, KVR_RSTAT_NINPUTS };

/* The outcome of one /v1/route decision:
 *   cache        the chosen worker holds the longest cached prefix among the candidates (> 0)
 *   load         another candidate held more: load (or predicted time) outweighed the cache
 *   busy         ttft found every candidate busy (chosen anyway, or refused with 429)
 *   fallback     no candidate held a block: the choice was by load alone
 *   no_candidate no worker to choose from (503) */
enum kvr_rstat_branch {
    KVR_RSTAT_CACHE = 0,
    KVR_RSTAT_LOAD,
    KVR_RSTAT_BUSY,
    KVR_RSTAT_FALLBACK,
    KVR_RSTAT_NO_CANDIDATE,
    KVR_RSTAT_NBRANCHES
};

struct kvr_rstat;

/* ttl_ms: a worker's series go after this long without a decision to it (0 = never). */
int kvr_rstat_create(int64_t ttl_ms, struct kvr_rstat **out);
void kvr_rstat_destroy(struct kvr_rstat *s);

/* One decision (route) or one scored query (score). */
struct kvr_rstat_decision {
    int endpoint;             /* enum kvr_rstat_endpoint */
    int input;                /* enum kvr_rstat_input */
    const char *model;        /* NULL: counted under "_other" */
    int policy;               /* route: the policy used (route.h); score: ignored */
    int branch;               /* route: enum kvr_rstat_branch; score: ignored */
    uint32_t query_blocks;    /* the query's full blocks */
    uint32_t block_size;      /* 0 when unknown */
    uint64_t prompt_tokens;   /* the query's tokens */
    uint32_t best_matched;    /* the most matched blocks among candidates / scored workers */
    const char *pod;          /* route: the chosen worker; NULL when none was chosen
                               * (refused, no candidate): its blocks are not summed */
    uint32_t dp_rank;
    uint32_t chosen_matched;  /* route: the chosen worker's matched blocks */
    double seconds;           /* from the request's body to the answer; < 0: not observed */
};
void kvr_rstat_record(struct kvr_rstat *s, const struct kvr_rstat_decision *d);

/* The branch of a route decision from its candidates after kvr_route_decide (busy: every
 * candidate's busy flag under ttft; rejected: kvr_route_decide said -EBUSY). */
int kvr_rstat_branch(const struct kvr_route_cand *c, size_t n, size_t chosen, int policy,
                     bool rejected);
/* The most matched blocks among n candidates (0 when n is 0). */
uint32_t kvr_rstat_best_matched(const struct kvr_route_cand *c, size_t n);

/* The time a query's text took to become token ids (input: prompt or chat), a part of its
 * decision's time. */
void kvr_rstat_tokenized(struct kvr_rstat *s, int input, double seconds);

/* Drops every worker series of pod (DELETE /v1/pods/{pod}). */
void kvr_rstat_forget_pod(struct kvr_rstat *s, const char *pod);

/* Prometheus lines (expires idle workers first). */
void kvr_rstat_metrics(struct kvr_rstat *s, struct kvr_buf *out);

const char *kvr_rstat_branch_name(int branch);
const char *kvr_rstat_input_name(int input);

#endif
