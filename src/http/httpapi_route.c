/* httpapi_route.c — POST /v1/route: one decision for a gateway (route.h has the policies).
 *
 * Why a file of its own: the route endpoint does more than the others: it finds the
 * candidates (the body's, else the model's workers with events and its approximate_pods),
 * scores only those, maps the scored workers onto the candidates by one sort and a binary
 * search each (up to 4096 of each), decides, tracks, and hands approximate mode's
 * assumption to the chosen worker's writer (ingest.h). Threads: a loop thread's handler,
 * with that thread's scratch (t->rs, allocated on first use).
 */
#include "http/httpapi_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events/ingest.h"
#include "core/log.h"
#include "route/route.h"
#include "route/rstat.h"
#include "route/score.h"

/* ---- POST /v1/route -------------------------------------------------------------------- */

struct route_scratch {
    struct kvr_reqbody_cand in[KVR_HTTPAPI_MAX_PODS];
    struct kvr_route_cand c[KVR_HTTPAPI_MAX_PODS];
    const char *pods[KVR_HTTPAPI_MAX_PODS];
    uint32_t by_name[KVR_HTTPAPI_MAX_PODS]; /* candidate indexes sorted by (pod, dp_rank) */
    char names[KVR_HTTPAPI_MAX_PODS * 32]; /* default candidates' pod names, copied */
    size_t nnames, n;
    size_t nstream; /* default candidates: the first nstream are workers with events */
    bool full;
};

static int cand_cmp(const struct kvr_reqbody_cand *a, const char *pod, uint32_t rank)
{
    int c = strcmp(a->pod, pod);
    return c ? c : a->dp_rank < rank ? -1 : a->dp_rank > rank;
}

static int by_name_cmp(const void *a, const void *b, void *arg)
{
    const struct kvr_reqbody_cand *base = arg;
    const struct kvr_reqbody_cand *x = &base[*(const uint32_t *)a];
    const struct kvr_reqbody_cand *y = &base[*(const uint32_t *)b];
    return cand_cmp(x, y->pod, y->dp_rank);
}

static void add_worker(void *arg, const char *pod, uint32_t dp_rank)
{
    struct route_scratch *rs = arg;
    size_t l = strlen(pod) + 1;
    if (rs->n >= KVR_HTTPAPI_MAX_PODS || rs->nnames + l > sizeof(rs->names)) {
        rs->full = true;
        return;
    }
    memcpy(rs->names + rs->nnames, pod, l);
    rs->in[rs->n] = (struct kvr_reqbody_cand){.pod = rs->names + rs->nnames, .dp_rank = dp_rank,
                                              .role = -1};
    rs->nnames += l;
    rs->n++;
}

/* An approximate_pods entry as a default candidate (dp_rank 0), unless a worker with events
 * already is that candidate. */
static void add_approx_pod(void *arg, const char *pod, uint32_t dp_rank)
{
    struct route_scratch *rs = arg;
    for (size_t i = 0; i < rs->nstream; i++)
        if (rs->in[i].dp_rank == dp_rank && strcmp(rs->in[i].pod, pod) == 0)
            return;
    add_worker(arg, pod, dp_rank);
}

/* A prefill pool pod added to a gateway's candidates (which name where requests may go: the
 * decode side), unless the gateway named it. */
static void add_prefill_pod(void *arg, const char *pod, uint32_t dp_rank)
{
    struct route_scratch *rs = arg;
    for (size_t i = 0; i < rs->n; i++)
        if (rs->in[i].dp_rank == dp_rank && strcmp(rs->in[i].pod, pod) == 0)
            return;
    add_worker(arg, pod, dp_rank);
}

void kvr_httpapi_ep_route(struct kvr_httpapi_thread *t, const struct kvr_httpreq *req,
                     struct kvr_httpresp *resp)
{
    struct kvr_reqbody_query q;
    struct kvr_reqbody_route rq;
    struct kvr_score_query sq;
    struct kvr_score_result res;
    struct kvr_route_query rqy;
    struct kvr_route_decision d;
    struct kvr_buf *b = resp->body;
    char id[17];
    int rc, policy = -1;
    uint64_t t0 = kvr_now_ns();

    if (t->rs == NULL && (t->rs = malloc(sizeof(*t->rs))) == NULL) {
        fail(resp, 500, "out of memory");
        return;
    }
    struct route_scratch *rs = t->rs;
    rs->n = rs->nnames = 0;
    rs->full = false;
    if (kvr_httpapi_query_body(t, req, resp, &q, &rq, rs->in, KVR_HTTPAPI_MAX_PODS) != 0)
        return;
    if (rq.policy != NULL && (policy = kvr_route_policy_parse(rq.policy)) < 0) {
        fail(resp, 400, "unknown policy \"%.100s\" (cost, cache_aware or score)", rq.policy);
        return;
    }
    if (req->session_truncated && rq.session == NULL) {
        fail(resp, 400, "the session header is longer than %d bytes", KVR_HTTPREQ_SESSION_MAX);
        return;
    }
    if (kvr_httpapi_score_ready(t, &q, resp) != 0)
        return;
    rs->n = rq.ncands;
    rs->nstream = 0;
    if (rs->n == 0) { /* the model's workers with events, and its approximate_pods */
        if (t->api->ingest != NULL)
            kvr_ingest_model_workers(t->api->ingest, q.model, add_worker, rs);
        rs->nstream = rs->n;
        kvr_route_approx_pods(t->api->route, q.model, add_approx_pod, rs);
    }
    if (rs->n == 0) {
        kvr_rstat_record(t->api->rstat,
                         &(struct kvr_rstat_decision){
                             .endpoint = KVR_RSTAT_ROUTE, .input = kvr_httpapi_input_kind(t, &q),
                             .model = q.model,
                             .policy = policy >= 0 ? policy : kvr_route_policy(t->api->route),
                             .branch = KVR_RSTAT_NO_CANDIDATE, .prompt_tokens = q.ntokens,
                             .seconds = -1});
        fail(resp, 503, "no candidate: no worker of model \"%.300s\" has published events "
                        "(send \"candidates\", or list [model] approximate_pods)", q.model);
        return;
    }
    /* a gateway lists the engines it forwards to; the model's prefill pool is kvrouterd's
     * to add (the gateway never sends a request there itself) */
    if (rq.ncands > 0 && kvr_route_has_roles(t->api->route, q.model))
        kvr_route_prefill_pods(t->api->route, q.model, add_prefill_pod, rs);
    /* score only the candidates' pods */
    for (size_t i = 0; i < rs->n; i++)
        rs->pods[i] = rs->in[i].pod;
    sq = (struct kvr_score_query){.model = q.model, .lora_name = q.lora_name,
                                  .tokens = q.tokens, .ntokens = q.ntokens, .pods = rs->pods,
                                  .npods = rs->n, .cache_salt = q.cache_salt,
                                  .media = q.media, .nmedia = q.nmedia,
                                  .want_hashes = true}; /* for approximate mode */
    rc = kvr_score_query(t->sctx, &sq, &res);
    if (rc != 0) {
        fail(resp, rc == -E2BIG ? 413 : 500, "scoring failed: %s", strerror(-rc));
        return;
    }
    for (size_t i = 0; i < rs->n; i++) {
        const struct kvr_reqbody_cand *in = &rs->in[i];
        /* a default candidate known from its events confirms its prefills by them; for
         * the others route asks the model's approximate mode (route_flight.c) */
        bool evented = rq.ncands == 0 && i < rs->nstream;
        /* the role: the gateway's, else (resolved below) the model's lists */
        rs->c[i] = (struct kvr_route_cand){.pod = in->pod, .dp_rank = in->dp_rank,
                                           .role = in->role >= 0 ? (uint8_t)in->role
                                                                 : KVR_ROUTE_ROLE_UNSET,
                                           .has_requests = in->has_requests,
                                           .has_tokens = in->has_tokens,
                                           .evented = evented,
                                           .active_requests = in->active_requests,
                                           .active_tokens = in->active_tokens};
        rs->by_name[i] = (uint32_t)i;
    }
    kvr_route_resolve_roles(t->api->route, q.model, rs->c, rs->n);
    /* each scored worker to its candidates: sorted by name, one binary search per entry */
    qsort_r(rs->by_name, rs->n, sizeof(rs->by_name[0]), by_name_cmp, rs->in);
    for (size_t k = 0; k < res.nentries; k++) {
        const struct kvr_score_entry *e = &res.entries[k];
        size_t lo = 0, hi = rs->n;
        while (lo < hi) { /* the first candidate >= (pod, rank) */
            size_t mid = (lo + hi) / 2;
            if (cand_cmp(&rs->in[rs->by_name[mid]], e->pod, e->dp_rank) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (; lo < rs->n && cand_cmp(&rs->in[rs->by_name[lo]], e->pod, e->dp_rank) == 0; lo++) {
            rs->c[rs->by_name[lo]].matched_blocks = e->predicted_blocks; /* max(exact, pred.) */
            rs->c[rs->by_name[lo]].exact_blocks = e->matched_blocks;
            rs->c[rs->by_name[lo]].score = e->score;
        }
    }
    rqy = (struct kvr_route_query){.query_blocks = res.query_blocks,
                                   .block_size = res.block_size, .prompt_tokens = q.ntokens,
                                   .last_block = res.hashes != NULL && res.query_blocks > 0
                                                     ? res.hashes[res.query_blocks - 1]
                                                     : 0,
                                   .commit = true, .model = q.model, .policy = policy,
                                   /* the body's session_id, else the header's */
                                   .session = rq.session ? rq.session : req->session,
                                   .session_len = rq.session ? rq.session_len
                                                             : req->session_len,
                                   .cands = rs->c,
                                   .ncands = rs->n};
    rc = kvr_route_decide(t->api->route, &rqy, &d);
    /* the decision metrics (rstat.h): a refused decision counts as busy, with no worker */
    kvr_rstat_record(t->api->rstat,
                     &(struct kvr_rstat_decision){
                         .endpoint = KVR_RSTAT_ROUTE, .input = kvr_httpapi_input_kind(t, &q),
                         .model = q.model, .policy = d.policy,
                         .branch = kvr_rstat_branch(rs->c, rs->n, d.chosen, d.policy,
                                                    rc == -EBUSY),
                         .query_blocks = res.query_blocks, .block_size = res.block_size,
                         .prompt_tokens = q.ntokens,
                         .best_matched = kvr_rstat_best_matched(rs->c, rs->n),
                         .pod = rc == 0 ? rs->c[d.chosen].pod : NULL,
                         .dp_rank = rs->c[d.chosen].dp_rank,
                         .chosen_matched = rs->c[d.chosen].matched_blocks,
                         .seconds = (double)(kvr_now_ns() - t0) / 1e9});
    if (rc == -ENOENT) {
        fail(resp, 503, "no decode worker among the candidates of model \"%.300s\" (every "
                        "one has the role prefill)", q.model);
        return;
    }
    if (rc == -EBUSY) {
        resp->extra_headers = "Retry-After: 1\r\n";
        fail(resp, 429, "every candidate is busy (%.100s); [route] when_all_busy = reject",
             d.reason);
        return;
    }
    const struct kvr_route_cand *ch = &rs->c[d.chosen];
    id[0] = '\0';
    if (rq.track && (rc = kvr_route_track(t->api->route, ch->pod, ch->dp_rank, q.ntokens, id)) != 0) {
        fail(resp, rc == -ENOSPC ? 503 : 500, "cannot track the request: %s",
             rc == -ENOSPC ? "[route] max_tracked requests are active" : strerror(-rc));
        return;
    }
    /* approximate mode: the chosen worker now holds the request's blocks (its writer skips
     * this when the worker publishes events; a default candidate known from its events is
     * not even handed over) */
    bool assumed = false;
    size_t at = d.prefill != SIZE_MAX ? d.prefill : d.chosen; /* the worker computing it */
    if (res.hashes != NULL && t->api->ingest != NULL && at >= rs->nstream &&
        kvr_route_assumes(t->api->route, q.model, rs->c[at].pod)) {
        struct kvr_ingest_assumption as = {.model = q.model, .lora = q.lora_name,
                                           .pod = rs->c[at].pod, .dp_rank = rs->c[at].dp_rank,
                                           .content = res.hashes, .n = res.query_blocks};
        assumed = kvr_ingest_assume(t->api->ingest, &as) == 0;
    }
    /* predicted entries: a worker with events (its writer checks) now computes the blocks
     * it lacks, until its events say so (ingest.h) */
    bool predicted = false;
    if (!assumed && res.hashes != NULL && t->api->ingest != NULL &&
        rs->c[at].exact_blocks < res.query_blocks && kvr_ingest_predicting(t->api->ingest) &&
        (at < rs->nstream || rq.ncands > 0)) {
        struct kvr_ingest_assumption as = {.model = q.model, .lora = q.lora_name,
                                           .pod = rs->c[at].pod, .dp_rank = rs->c[at].dp_rank,
                                           .content = res.hashes, .n = res.query_blocks,
                                           .predict = true};
        predicted = kvr_ingest_assume(t->api->ingest, &as) == 0;
    }
    put(b, "{\"model\":");
    put_json_str(b, q.model);
    put(b, ",\"pod\":");
    put_json_str(b, ch->pod);
    put_kv_u64(b, ",\"dp_rank\":", ch->dp_rank);
    put_kv_u64(b, ",\"matched_blocks\":", ch->exact_blocks);
    if (ch->matched_blocks > ch->exact_blocks)
        put_kv_u64(b, ",\"predicted_blocks\":", ch->matched_blocks);
    put_kv_u64(b, ",\"query_blocks\":", res.query_blocks);
    put(b, ",\"block_size\":");
    if (res.block_size)
        put_u64(b, res.block_size);
    else
        put(b, "null");
    if (!q.has_tokens) {
        put_kv_u64(b, ",\"tokens\":", q.ntokens);
    }
    put(b, ",\"policy\":");
    put_json_str(b, kvr_route_policy_name(d.policy));
    put(b, ",\"reason\":");
    put_json_str(b, d.reason);
    if (id[0]) {
        put(b, ",\"route_id\":");
        put_json_str(b, id);
    }
    if (assumed)
        put(b, ",\"assumed\":true");
    if (predicted)
        put(b, ",\"predicted\":true");
    if (d.pd) { /* disaggregated serving: the pair, or the decode worker alone */
        put(b, d.prefill != SIZE_MAX ? ",\"disaggregate\":true" : ",\"disaggregate\":false");
        if (d.prefill != SIZE_MAX) {
            const struct kvr_route_cand *p = &rs->c[d.prefill];
            put(b, ",\"prefill\":{\"pod\":");
            put_json_str(b, p->pod);
            put_kv_u64(b, ",\"dp_rank\":", p->dp_rank);
            put_kv_u64(b, ",\"matched_blocks\":", p->matched_blocks);
            put(b, "}");
        }
        put(b, ",\"decode\":{\"pod\":");
        put_json_str(b, ch->pod);
        put_kv_u64(b, ",\"dp_rank\":", ch->dp_rank);
        put(b, "}");
    }
    if (d.session != KVR_ROUTE_SESSION_NONE) {
        put(b, ",\"session\":");
        put_json_str(b, kvr_route_session_name(d.session));
    }
    put(b, ",\"candidates\":[");
    for (size_t i = 0; i < rs->n; i++) {
        const struct kvr_route_cand *c = &rs->c[i];
        put(b, i ? ",{\"pod\":" : "{\"pod\":");
        put_json_str(b, c->pod);
        put_kv_u64(b, ",\"dp_rank\":", c->dp_rank);
        put_kv_u64(b, ",\"matched_blocks\":", c->exact_blocks);
        if (c->matched_blocks > c->exact_blocks)
            put_kv_u64(b, ",\"predicted_blocks\":", c->matched_blocks);
        put_kv_u64(b, ",\"active_requests\":", c->active_requests);
        put_kv_u64(b, ",\"active_tokens\":", c->active_tokens);
        if (c->role != KVR_ROUTE_BOTH) {
            put(b, ",\"role\":");
            put_json_str(b, kvr_route_role_name(c->role));
        }
        put(b, d.policy == KVR_ROUTE_COST ? ",\"cost\":"
               : d.policy == KVR_ROUTE_CACHE_AWARE ? ",\"match_rate\":"
               : d.policy == KVR_ROUTE_SCORE     ? ",\"score\":"
                                                   : ",\"ttft\":");
        kvr_httpapi_put_double(b, c->cost);
        if (d.policy == KVR_ROUTE_TTFT) {
            put_kv_u64(b, ",\"queued_tokens\":", c->queued_tokens);
            put_kv_u64(b, ",\"uncached_tokens\":", c->uncached_tokens);
            put(b, ",\"running\":");
            kvr_httpapi_put_double(b, c->running);
            put(b, ",\"prefill_rate\":");
            kvr_httpapi_put_double(b, c->rate);
            if (c->kv_usage >= 0) {
                put(b, ",\"kv_usage\":");
                kvr_httpapi_put_double(b, c->kv_usage);
            }
            if (c->busy)
                put(b, ",\"busy\":true");
        }
        put(b, "}");
    }
    put(b, rs->full ? "],\"candidates_truncated\":true}\n" : "]}\n");
}
