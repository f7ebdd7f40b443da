/* httpapi.h — the endpoints of the HTTP API: routing, admin-listener and bearer-token rules,
 * request bodies, JSON responses, /metrics assembly. It is the handler that httpreq calls for
 * each complete request; no sockets here, so the whole request path is testable in-process.
 *
 * Routes (see openapi.yaml):
 *   POST   /v1/score           both listeners (token ids, or a prompt tokenized here)
 *   POST   /v1/tokenize        both listeners (vLLM's route: prompt -> token ids)
 *   POST   /v1/route           both listeners (a score query + candidates -> one worker)
 *   DELETE /v1/routes/{id}     both listeners (ends a tracked request)
 *   GET    /v1/pods            admin **
 *   DELETE /v1/pods/{pod}      admin *
 *   GET    /v1/endpoints       admin **
 *   POST   /v1/endpoints       admin *
 *   DELETE /v1/endpoints       admin *
 *   GET    /metrics            admin **
 *   GET    /v1/snapshot        admin listener only, bearer token as for mutations (*):
 *                              a fresh snapshot (snap.h's format), with Content-Length
 *   GET    /healthz, /readyz   both
 * (*) Mutating routes: with an admin listener configured they exist only there (404 on the
 * main listener); with [http] admin_token set they need "Authorization: Bearer <token>"
 * (401 without it, 403 with a wrong one; compared in constant time). The token can be
 * replaced at run time (kvr_httpapi_set_token, SIGHUP).
 * (**) Introspection: with an admin listener configured, only there (404 on the main
 * listener) unless [http] public_introspection = on. Without one, everything is on the one
 * listener.
 * A request on a probe-only connection (over the connection cap, req->probe_only) gets
 * /healthz or /readyz answered, anything else 503; every answer closes the connection.
 * A body-taking route asked without Content-Length or chunked framing gets 411 and the
 * connection closes (the unframed body would otherwise be parsed as the next request).
 *
 * Uses (ARCHITECTURE.md lists score, ingest (admin), metrics): also zsub, deliberately, for
 * the admin endpoint routes, its /metrics families and readiness (zsub owns the sockets;
 * going through ingest would bring back the ingest -> zsub call this layout removed); and
 * index.h's public statistics for the index gauges (never index internals).
 *
 * Threads: struct kvr_httpapi is shared and read-only after create (except the ready flag,
 * atomic); one struct kvr_httpapi_thread per loop thread holds the score ctx and scratch.
 */
#ifndef KVR_HTTPAPI_H
#define KVR_HTTPAPI_H

#include <stdbool.h>

#include "core/buf.h"
#include "core/conf.h"
#include "http/httpreq.h"
#include "index/index.h"
#include "events/ingest.h"
#include "load/load.h"
#include "route/share.h"
#include "route/score.h"
#include "route/route.h"
#include "state/snap.h"
#include "text/tokset.h"
#include "events/zsub.h"

#define KVR_HTTPAPI_MAX_PODS 4096 /* pod filter entries per score query */

struct kvr_httpapi;
struct kvr_httpapi_thread;

struct kvr_httpapi_deps {
    const struct kvr_conf *conf;
    struct kvr_score *score;   /* required for /v1/score */
    struct kvr_ingest *ingest; /* NULL: pod routes answer 503, readyz ignores it */
    struct kvr_zsub *zsub;     /* NULL: endpoint routes answer 503, readyz ignores it; admin
                                * endpoint add/remove/list and its /metrics lines go to it */
    struct kvr_index *index;   /* index gauges in /metrics when ingest is NULL */
    struct kvr_snap *snap;     /* GET /v1/snapshot and its /metrics lines; NULL: 503 */
    struct kvr_route *route;   /* POST /v1/route, DELETE /v1/routes/{id}; NULL: 503 */
    struct kvr_load *load;     /* scraped engine loads in /v1/pods and /metrics; may be NULL */
    struct kvr_share *share;   /* replicas sharing decisions: /metrics lines; may be NULL */
    struct kvr_tokset *tokset; /* POST /v1/tokenize, "prompt" in /v1/score; NULL: no
                                * tokenizers (text gets 400 "no tokenizer for model") */
    const struct kvr_modelfilter *models; /* [events] models: queries naming another model
                                * answer 404; NULL: every model (outlives the api) */
    bool admin_listener;       /* an admin listener exists (mutations only there) */
    bool public_introspection; /* with admin_listener: introspection also on the main one */
    /* Appends the server's own metrics (connections, requests, limits); may be NULL. */
    void (*server_metrics)(void *arg, struct kvr_buf *out);
    void *server_metrics_arg;
};

int kvr_httpapi_create(const struct kvr_httpapi_deps *deps, struct kvr_httpapi **out);
void kvr_httpapi_destroy(struct kvr_httpapi *api);
void kvr_httpapi_set_ready(struct kvr_httpapi *api, bool ready);
bool kvr_httpapi_ready(const struct kvr_httpapi *api);
/* Replaces the admin bearer token (NULL or "" = none); any thread. 0 or -ENOMEM (the old
 * token stays). */
int kvr_httpapi_set_token(struct kvr_httpapi *api, const char *token);

/* Per-thread state; stats receives the handler-level limit counts (tokens). */
int kvr_httpapi_thread_create(struct kvr_httpapi *api, struct kvr_httpstats *stats,
                              struct kvr_httpapi_thread **out);
void kvr_httpapi_thread_destroy(struct kvr_httpapi_thread *t);

/* Whether req is one for the text threads: a POST to an endpoint that tokenizes or renders
 * (/v1/score, /v1/tokenize, /v1/route) with a body of at least min_bytes, while tokenizers
 * are configured (the body's size bounds the text it holds; a chat template adds a bounded
 * amount to it). Returns the endpoint, or KVR_EP_OTHER: answer inline. Any thread. */
enum kvr_http_ep kvr_httpapi_offload(const struct kvr_httpapi *api, const struct kvr_httpreq *req,
                                     size_t min_bytes);

/* The kvr_httpreq_handler: arg is the struct kvr_httpapi_thread (a loop's, or a text
 * thread's: the handler runs on whichever thread owns that struct). */
void kvr_httpapi_handle(void *arg, const struct kvr_httpreq *req, struct kvr_httpresp *resp);

/* Percent-decodes src[0..len) into dst (cap bytes incl. NUL): 0, or -EINVAL for a bad escape,
 * an encoded NUL or overflow. '+' stays '+' (paths are not form data). */
int kvr_httpapi_percent_decode(const char *src, size_t len, char *dst, size_t cap);
/* Appends a JSON number for v (shortest of up to 6 decimals; "0" for non-finite). */
void kvr_httpapi_put_double(struct kvr_buf *b, double v);

#endif
