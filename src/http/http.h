/* http.h — the HTTP/1.1 front end (libuv + http-parser): scoring API, pod/endpoint admin,
 * health, readiness and Prometheus metrics. Queries are answered inline on the loop thread
 * that read them, except large texts to tokenize, which go to the text threads
 * ([tokenizer] threads; http.c's design note).
 *
 * Lifecycle (main thread): create → start (binds the listeners, starts [http] threads loop
 * threads) → ... → stop (closes listeners, finishes in-flight responses, joins) → destroy.
 * Uses zsub only to hand it to httpapi (the admin endpoint routes: see httpapi.h).
 * Readiness (/readyz) is 200 only between kvr_http_set_ready(h, true) and stop.
 */
#ifndef KVR_HTTP_H
#define KVR_HTTP_H

#include <stdbool.h>

#include "core/conf.h"
#include "core/err.h"
#include "events/ingest.h"
#include "load/load.h"
#include "route/share.h"
#include "route/score.h"
#include "state/snap.h"
#include "text/tokset.h"
#include "events/zsub.h"

struct kvr_http;

struct kvr_http_deps {
    const struct kvr_conf *conf;
    struct kvr_score *score;
    struct kvr_ingest *ingest;
    struct kvr_zsub *zsub;   /* admin endpoints, its /metrics lines, readiness */
    struct kvr_index *index; /* only for kvr_index_stats() gauges in /metrics */
    struct kvr_snap *snap;   /* GET /v1/snapshot, kvrouter_snapshot_* metrics; may be NULL */
    struct kvr_tokset *tokset; /* prompts to token ids; NULL: text answers 400 */
    struct kvr_route *route;   /* POST /v1/route; NULL: 503 */
    struct kvr_load *load;     /* the engines' scraped loads in /v1/pods, /metrics; may be NULL */
    struct kvr_share *share;   /* replicas sharing decisions: its /metrics lines; may be NULL */
    const struct kvr_modelfilter *models; /* [events] models: other models answer 404; NULL */
};

int kvr_http_create(const struct kvr_http_deps *deps, struct kvr_http **out, struct kvr_err *err);
/* Binds [http] listen (and admin_listen), starts the loop threads. -EADDRINUSE etc. with the
 * address in err. */
int kvr_http_start(struct kvr_http *h, struct kvr_err *err);
/* Ports actually bound (useful with port 0); admin port is 0 when there is no admin listener. */
int kvr_http_port(const struct kvr_http *h);
int kvr_http_admin_port(const struct kvr_http *h);
void kvr_http_set_ready(struct kvr_http *h, bool ready);
/* SIGHUP: the bearer token for mutating admin routes (NULL or "" = none) from the next
 * request on; main thread. 0 or -ENOMEM (the old token stays). */
int kvr_http_set_admin_token(struct kvr_http *h, const char *token);
/* Idempotent. */
void kvr_http_stop(struct kvr_http *h);
void kvr_http_destroy(struct kvr_http *h);

#endif
