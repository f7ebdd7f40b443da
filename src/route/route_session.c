/* route_session.c — session affinity in a decision: when a conversation's bond to the worker
 * of its previous turn is kept, and when the load policy breaks it.
 *
 * Why a file of its own: route.c runs the policies; this is the one rule laid over all of
 * them, after the policy has filled every candidate's figures. A bond is kept (its worker
 * chosen) unless that worker is busy ([route] busy_kv_usage / busy_waiting) while another
 * candidate is not, or, under ttft, its predicted time to first token exceeds the best one's
 * by more than [route] session_max_wait: a conversation's next turn goes where its cache is,
 * but never waits much longer than elsewhere (llm-d's stickiness bound, in time units). A
 * bond whose worker is not among the candidates (a forgotten pod, one the gateway did not
 * send) is broken and rebound. Every outcome is counted.
 *
 * Threads: under kvr_route.mu (route.c takes it).
 */
#include "route/route_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *const out_names[KVR_ROUTE_SESSION_NOUT] = {"none", "new",  "kept",
                                                              "busy", "slow", "gone"};

const char *kvr_route_session_name(int out)
{
    return out >= 0 && out < KVR_ROUTE_SESSION_NOUT ? out_names[out] : "none";
}

static size_t cand_of(const struct kvr_route_query *q, const char *pod, uint32_t rank)
{
    for (size_t i = 0; i < q->ncands; i++)
        if (q->cands[i].dp_rank == rank && strcmp(q->cands[i].pod, pod) == 0)
            return i;
    return SIZE_MAX;
}

void route_session_apply(struct kvr_route *r, const struct kvr_route_query *q,
                         struct kvr_route_decision *d, int64_t now_ms)
{
    if (q->session == NULL || q->session_len == 0 || r->session_ttl_ms <= 0)
        return;
    const char *pod;
    uint32_t rank;
    int out = KVR_ROUTE_SESSION_NEW;
    if (kvr_session_get(r->sess, q->session, q->session_len, now_ms - r->session_ttl_ms, &pod,
                        &rank) == 1) {
        size_t b = cand_of(q, pod, rank);
        const struct kvr_route_cand *c = q->cands, *best = &c[d->chosen];
        bool others_free = false;
        for (size_t i = 0; i < q->ncands && !others_free; i++)
            others_free = i != b && !c[i].busy;
        if (b == SIZE_MAX) {
            out = KVR_ROUTE_SESSION_GONE;
        } else if (b == d->chosen) {
            out = KVR_ROUTE_SESSION_KEPT;
        } else if (c[b].busy && others_free) {
            out = KVR_ROUTE_SESSION_BUSY;
        } else if (d->policy == KVR_ROUTE_TTFT && c[b].cost > best->cost + r->session_max_wait) {
            out = KVR_ROUTE_SESSION_SLOW;
        } else {
            out = KVR_ROUTE_SESSION_KEPT;
            if (d->policy == KVR_ROUTE_TTFT)
                snprintf(d->reason, sizeof(d->reason),
                         "session's worker: predicted %.3f s, the best %.3f s", c[b].cost,
                         best->cost);
            else
                snprintf(d->reason, sizeof(d->reason), "session's worker");
            d->chosen = b;
        }
    }
    d->session = out;
    r->sess_out[out]++;
    const struct kvr_route_cand *ch = &q->cands[d->chosen];
    if (kvr_session_bind(r->sess, q->session, q->session_len, ch->pod, ch->dp_rank, now_ms) != 0)
        r->sess_out[KVR_ROUTE_SESSION_NONE]++; /* out of memory: not bound, counted as none */
    kvr_session_expire(r->sess, now_ms - r->session_ttl_ms);
}

void route_session_metrics(struct kvr_route *r, struct kvr_buf *out)
{
    kvr_buf_printf(out, "# HELP kvrouter_route_session_decisions_total Decisions with a "
                        "session key, by what became of its bond (none: could not be bound)\n"
                        "# TYPE kvrouter_route_session_decisions_total counter\n");
    for (int i = 0; i < KVR_ROUTE_SESSION_NOUT; i++)
        kvr_buf_printf(out, "kvrouter_route_session_decisions_total{outcome=\"%s\"} %" PRIu64
                            "\n", out_names[i], r->sess_out[i]);
    kvr_buf_printf(out, "# HELP kvrouter_route_sessions Session bonds kept now\n"
                        "# TYPE kvrouter_route_sessions gauge\nkvrouter_route_sessions %zu\n",
                   kvr_session_count(r->sess));
}
