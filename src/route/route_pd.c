/* route_pd.c — disaggregated prefill and decode: one decision picks the decode worker by
 * load, decides whether the request is worth disaggregating, and picks the prefill worker by
 * the policy (KV overlap and prefill load).
 *
 * Why: large fleets split prefill and decode into pools (vLLM with a KV connector such as
 * NIXL; llm-d, Dynamo and SGLang's gateway route that way). The prefill worker is where the
 * prompt's KV cache matters; the decode worker only receives the computed KV, so it is
 * chosen by load (Dynamo's decode router: overlap credit 0, load only), except that a decode
 * worker whose own cache (its KV events) leaves the request short is preferred: the request
 * is then served there alone, as a conversation's next turn where its earlier turns decoded.
 * A short uncached part is cheaper to compute where the request decodes than to move: under [route]
 * pd_local_max_uncached tokens (llm-d's prefix-based P/D decider; 2,048 as Dynamo) and at
 * most pd_local_max_share of the prompt (1 by default: any share; Dynamo's conditional
 * disaggregation uses 0.7) it stays on the decode worker alone.
 *
 * Roles come from [model] prefill_pods / decode_pods, or the gateway's candidates ("role").
 * In-flight work: the prefill counts on the prefill worker (confirmed by its events, as any
 * prefill), a decoding request on the decode worker.
 *
 * Threads: under kvr_route.mu (route.c takes it).
 */
#include "route/route_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_names[] = {"both", "prefill", "decode"};

int kvr_route_role_parse(const char *s)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, role_names[i]) == 0)
            return i;
    return -1;
}

const char *kvr_route_role_name(int role)
{
    return role >= 0 && role < 3 ? role_names[role] : "both";
}

static int role_locked(const struct approx *a, const char *pod)
{
    for (size_t k = 0; a != NULL && k < a->npre; k++)
        if (strcmp(a->pre[k], pod) == 0)
            return KVR_ROUTE_PREFILL;
    for (size_t k = 0; a != NULL && k < a->ndec; k++)
        if (strcmp(a->dec[k], pod) == 0)
            return KVR_ROUTE_DECODE;
    return KVR_ROUTE_BOTH;
}

void kvr_route_resolve_roles(struct kvr_route *r, const char *model, struct kvr_route_cand *c,
                             size_t n)
{
    pthread_mutex_lock(&r->mu);
    const struct approx *a = model != NULL ? route_approx_of(r, model) : NULL;
    for (size_t i = 0; i < n; i++)
        if (!(c[i].role_given = c[i].role != KVR_ROUTE_ROLE_UNSET))
            c[i].role = (uint8_t)(a != NULL && (a->npre > 0 || a->ndec > 0)
                                      ? role_locked(a, c[i].pod)
                                      : KVR_ROUTE_BOTH);
    pthread_mutex_unlock(&r->mu);
}

int kvr_route_role_of(struct kvr_route *r, const char *model, const char *pod)
{
    pthread_mutex_lock(&r->mu);
    int role = role_locked(model != NULL ? route_approx_of(r, model) : NULL, pod);
    pthread_mutex_unlock(&r->mu);
    return role;
}

void kvr_route_roles(struct kvr_route *r,
                     void (*cb)(void *arg, const struct kvr_route_role_info *ri), void *arg)
{
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->nap; i++) {
        const struct approx *a = &r->ap[i];
        for (size_t k = 0; k < a->npre + a->ndec; k++) {
            bool pre = k < a->npre;
            cb(arg, &(struct kvr_route_role_info){
                        .model = a->name, .pod = pre ? a->pre[k] : a->dec[k - a->npre],
                        .dp_rank = -1, .role = pre ? KVR_ROUTE_PREFILL : KVR_ROUTE_DECODE});
        }
    }
    int64_t now = route_now_ns();
    for (size_t b = 0; b < WBUCKETS; b++)
        for (const struct wload *w = r->w[b]; w != NULL; w = w->next)
            if (w->gw_role != KVR_ROUTE_ROLE_UNSET)
                cb(arg, &(struct kvr_route_role_info){.pod = w->pod, .dp_rank = w->rank,
                                                      .role = w->gw_role,
                                                      .from_gateway = true,
                                                      .idle_ms = (now - w->last_ns) / 1000000});
    pthread_mutex_unlock(&r->mu);
}

bool kvr_route_has_roles(struct kvr_route *r, const char *model)
{
    pthread_mutex_lock(&r->mu);
    const struct approx *a = model != NULL ? route_approx_of(r, model) : NULL;
    bool yes = a != NULL && (a->npre > 0 || a->ndec > 0);
    pthread_mutex_unlock(&r->mu);
    return yes;
}

void kvr_route_prefill_pods(struct kvr_route *r, const char *model,
                            void (*cb)(void *arg, const char *pod, uint32_t dp_rank), void *arg)
{
    pthread_mutex_lock(&r->mu);
    const struct approx *a = model != NULL ? route_approx_of(r, model) : NULL;
    for (size_t k = 0; a != NULL && k < a->npre; k++)
        cb(arg, a->pre[k], 0);
    pthread_mutex_unlock(&r->mu);
}

/* Whether c may serve the request alone: what it would compute is short enough
 * (pd_local_max_uncached, pd_local_max_share of the prompt). */
static bool fits_local(const struct kvr_route *r, const struct kvr_route_query *q,
                       const struct kvr_route_cand *c)
{
    return c->uncached_tokens < r->pd_local_max_uncached &&
           (double)c->uncached_tokens <= r->pd_local_max_share * (double)q->prompt_tokens;
}

/* The decode worker. First among the decode-capable candidates whose cache leaves the
 * request short enough to serve alone (fits_local) and that are not busy: a decode pool
 * that publishes KV events holds its conversations' earlier turns, and the next turn served
 * where its prefix is needs no prefill worker and no transfer. Else any decode-capable
 * candidate. Within either: the fewest running requests, then the least queued prefill (a
 * worker that may also compute this prompt), then the longest cached prefix, then a seeded
 * random choice. SIZE_MAX: none. */
static size_t pick_decode(struct kvr_route *r, const struct kvr_route_query *q)
{
    for (int pass = 0; pass < 2; pass++) {
        size_t best = SIZE_MAX, ties = 0;
        for (size_t i = 0; i < q->ncands; i++) {
            const struct kvr_route_cand *c = &q->cands[i];
            if (c->role == KVR_ROUTE_PREFILL || (pass == 0 && (c->busy || !fits_local(r, q, c))))
                continue;
            int k = 0;
            if (best != SIZE_MAX) {
                const struct kvr_route_cand *b = &q->cands[best];
                k = c->running != b->running ? (c->running < b->running ? -1 : 1)
                    : c->queued_tokens != b->queued_tokens
                        ? (c->queued_tokens < b->queued_tokens ? -1 : 1)
                    : c->matched_blocks != b->matched_blocks
                        ? (c->matched_blocks > b->matched_blocks ? -1 : 1)
                        : 0;
            }
            if (best == SIZE_MAX || k < 0) {
                best = i;
                ties = 1;
            } else if (k == 0 && route_rand(r) % ++ties == 0) {
                best = i;
            }
        }
        if (best != SIZE_MAX)
            return best;
    }
    return SIZE_MAX;
}

int route_decide_pd(struct kvr_route *r, struct kvr_route_query *q,
                    struct kvr_route_decision *d, int64_t now)
{
    size_t dec = pick_decode(r, q), npre = 0;
    if (dec == SIZE_MAX) {
        snprintf(d->reason, sizeof(d->reason), "no decode-capable candidate");
        return -ENOENT;
    }
    for (size_t i = 0; i < q->ncands; i++)
        npre += q->cands[i].role != KVR_ROUTE_DECODE && i != dec;
    const struct kvr_route_cand *dc = &q->cands[dec];
    uint64_t unc = dc->uncached_tokens;
    bool small = fits_local(r, q, dc);
    d->chosen = dec;
    if (small || npre == 0) {
        r->pd_local++;
        snprintf(d->reason, sizeof(d->reason),
                 small ? "decode worker alone: %llu uncached tokens (under %llu, at most "
                         "%.2f of the prompt)"
                       : "decode worker alone: no prefill worker (%llu uncached tokens)",
                 (unsigned long long)unc, (unsigned long long)r->pd_local_max_uncached,
                 r->pd_local_max_share);
        if (q->commit)
            route_flight_commit(r, q, dc, now, true);
        return 0;
    }
    /* the policy over the prefill-capable candidates (the decode worker excluded) */
    struct kvr_route_cand *sub = malloc(npre * sizeof(*sub));
    size_t *map = malloc(npre * sizeof(*map));
    if (sub == NULL || map == NULL) { /* out of memory: the decode worker alone */
        free(sub);
        free(map);
        r->pd_local++;
        snprintf(d->reason, sizeof(d->reason), "decode worker alone: out of memory");
        if (q->commit)
            route_flight_commit(r, q, dc, now, true);
        return 0;
    }
    size_t n = 0;
    for (size_t i = 0; i < q->ncands; i++)
        if (q->cands[i].role != KVR_ROUTE_DECODE && i != dec) {
            sub[n] = q->cands[i];
            map[n++] = i;
        }
    struct kvr_route_query sq = *q;
    struct kvr_route_decision sd = {.policy = d->policy, .prefill = SIZE_MAX};
    sq.cands = sub;
    sq.ncands = n;
    int rc = route_decide_policy(r, &sq, &sd);
    for (size_t k = 0; k < n; k++) { /* the policy's figures back on the candidates */
        q->cands[map[k]].cost = sub[k].cost;
        q->cands[map[k]].busy = sub[k].busy;
    }
    size_t pre = map[sd.chosen];
    free(sub);
    free(map);
    d->prefill = pre;
    snprintf(d->reason, sizeof(d->reason), "prefill: %.90s; decode: fewest running",
             sd.reason);
    if (rc != 0)
        return rc;
    r->pd_split++;
    if (q->commit) {
        route_flight_commit(r, q, &q->cands[pre], now, false);
        route_flight_decoding(r, dc, now);
    }
    return 0;
}
