/* load.h — the engines' own load: each known engine's Prometheus /metrics endpoint scraped
 * on a timer, parsed narrowly, and kept per worker (pod, dp_rank) with the time it arrived.
 *
 * Why a module: a routing policy needs to know how busy each candidate is between two
 * requests, and the shipped gateways (nginx, HAProxy) cannot tell it. Every engine already
 * exports its queue and KV-cache usage (vLLM, SGLang, TensorRT-LLM); llm-d scrapes them every
 * 50 ms. This module does the same for kvrouterd's route module to read; it decides nothing.
 *
 * What is kept, per worker: requests waiting and running, KV-cache usage (0..1), and the
 * counters a policy can learn prefill throughput from (prompt tokens, prefix-cache hit and
 * query tokens), plus the monotonic time the sample arrived. A worker whose engine stops
 * answering keeps its last sample: readers get its age and a stale flag (age past [load]
 * stale_after) and decide (docs/load.md).
 *
 * Targets: this module does not know ingest. It is handed the workers to scrape in two ways,
 * both merged: a callback it polls once a second on its own thread (the daemon lists the
 * workers of the KV-event streams), and a fixed list (the daemon sets [model]
 * approximate_pods, at start and on SIGHUP). Each worker's URL is [load] metrics_url
 * with {pod}, {host} and {rank} filled in; without {rank} one URL serves every DP rank of a
 * pod (the engine labels its series per rank: vLLM's engine="N", SGLang's dp_rank="N"; no
 * label = rank 0), with {rank} each (pod, rank) has its own URL. Pods whose id is not a
 * plain host[:port] (letters, digits, '.', '-', '_', ':', '[', ']') are refused (a topic is
 * a peer's bytes, and must not steer our requests elsewhere).
 *
 * Threads: one scraper thread of its own (a libuv loop driving libcurl's multi interface;
 * docs/load.md says why libcurl). The reading calls below are for any thread, do no I/O and
 * hold one mutex for the time of a hash probe and a copy (microseconds). Lifecycle calls
 * (create, start, set_conf, set_pods, stop, destroy) are the main thread's.
 */
#ifndef KVR_LOAD_H
#define KVR_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/conf.h"
#include "core/err.h"

struct kvr_load;

/* One worker's latest sample. A figure the engine did not export is -1. */
struct kvr_load_sample {
    double waiting;        /* requests queued (vllm:num_requests_waiting, ...) */
    double running;        /* requests in the running batch */
    double kv_usage;       /* KV-cache usage, 0..1 */
    double prompt_tokens;  /* counter: prompt tokens processed (vllm:prompt_tokens_total) */
    double prefix_hit_tokens;   /* counter: prompt tokens found in the prefix cache */
    double prefix_query_tokens; /* counter: prompt tokens looked up in the prefix cache */
    uint64_t at_ns;        /* kvr_now_ns() (monotonic) when the scrape that brought it was
                            * sent: a routing decision made later may not be counted in it */
    uint64_t age_ns;       /* now - at_ns, when read */
    bool stale;            /* age past [load] stale_after */
};

/* The target-listing callback's handle: add the workers to scrape with kvr_load_list_add. */
struct kvr_load_list;

/* Adds a worker (pod NUL-terminated, copied). 0, -EINVAL (empty or too long a pod), or
 * -ENOMEM. Only inside a list_pods callback. */
int kvr_load_list_add(struct kvr_load_list *l, const char *pod, uint32_t rank);

struct kvr_load_opts {
    const struct kvr_conf *conf; /* [load]; read during create only */
    /* Polled about once a second on the scraper thread (may be NULL): lists the workers
     * known now. Must not call back into this module except kvr_load_list_add. */
    void (*list_pods)(void *arg, struct kvr_load_list *l);
    void *list_arg;
};

/* Creates the module (no thread, no network yet). 0, -EINVAL, -ENOMEM (err says why). */
int kvr_load_create(const struct kvr_load_opts *o, struct kvr_load **out, struct kvr_err *err);
/* Starts the scraper thread when [load] metrics_url is set (else a no-op until a reload sets
 * it). 0 or a negative errno with err. */
int kvr_load_start(struct kvr_load *l, struct kvr_err *err);
/* SIGHUP: every [load] directive. A URL set where there was none starts the thread; an
 * emptied one drops every target and worker (the thread idles). Main thread. 0 or -errno. */
int kvr_load_set_conf(struct kvr_load *l, const struct kvr_conf *c, struct kvr_err *err);
/* The fixed workers (beside the polled ones): replaces the previous list. pods[i] with
 * ranks[i] (ranks NULL = all rank 0). Strings are copied. Main thread (like set_conf). 0 or
 * -ENOMEM (the old list stays). */
int kvr_load_set_pods(struct kvr_load *l, const char *const *pods, const uint32_t *ranks,
                      size_t n);
/* Stops and joins the scraper thread (transfers in flight are abandoned). Idempotent; the
 * samples stay readable until destroy. */
void kvr_load_stop(struct kvr_load *l);
void kvr_load_destroy(struct kvr_load *l);

/* Whether scraping is configured now ([load] metrics_url not empty). Any thread. */
bool kvr_load_enabled(struct kvr_load *l);

/* The latest sample of (pod, rank): 0, or -ENOENT when none ever arrived (or l is NULL).
 * Any thread; no I/O. */
int kvr_load_get(struct kvr_load *l, const char *pod, uint32_t rank,
                 struct kvr_load_sample *out);

/* Calls cb for every worker with a sample, under the module's mutex: cb must be short
 * (format into memory, no I/O) and must not call into this module. Any thread. */
void kvr_load_foreach(struct kvr_load *l,
                      void (*cb)(void *arg, const char *pod, uint32_t rank,
                                 const struct kvr_load_sample *s),
                      void *arg);

/* /v1/pods: appends ,"load":{"waiting":W,"running":R,"kv_usage":U,"age_ms":A,"stale":B}
 * for (pod, rank) when it has a sample (unknown figures are null); nothing otherwise. */
void kvr_load_put_json(struct kvr_load *l, const char *pod, uint32_t rank, struct kvr_buf *b);

/* /metrics: the kvrouter_load_* families (scrapes by result, scrape durations, targets,
 * stale targets, malformed lines, per-worker gauges). Nothing when l is NULL. */
void kvr_load_metrics(struct kvr_load *l, struct kvr_buf *b);

#endif
