/* route.c — routing decisions and tracked loads (see route.h for the policies).
 *
 * State under one mutex: the [route] settings, the random stream, the per-worker loads
 * (a chained table by pod and rank; an entry lives while its worker has tracked requests)
 * and the tracked requests (a table by id, plus a list in start order so that expiry only
 * looks at the oldest).
 */
#include "route/route.h"
#include "route/route_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/metrics.h"

static const char *const names[KVR_ROUTE_NPOLICIES] = {"cost", "cache_aware", "score", "ttft"};

int kvr_route_policy_parse(const char *s)
{
    for (int i = 0; i < KVR_ROUTE_NPOLICIES; i++)
        if (s != NULL && strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *kvr_route_policy_name(int policy)
{
    return policy >= 0 && policy < KVR_ROUTE_NPOLICIES ? names[policy] : "?";
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t route_now_ns(void)
{
    return (int64_t)kvr_now_ns(); /* CLOCK_MONOTONIC, as load's samples are dated */
}

uint64_t route_rand(struct kvr_route *r) /* xorshift64* */
{
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return r->rng * 0x2545f4914f6cdd1dull;
}

static void set_conf(struct kvr_route *r, const struct kvr_conf *c)
{
    int p = kvr_route_policy_parse(c->route_policy);
    r->policy = p >= 0 ? p : KVR_ROUTE_TTFT;
    r->overlap_weight = c->route_overlap_weight;
    r->temperature = c->route_temperature;
    r->abs_threshold = c->route_balance_abs_threshold;
    r->rel_threshold = c->route_balance_rel_threshold;
    r->cache_threshold = c->route_cache_threshold;
    r->max_age_ms = c->route_max_request_age_ms;
    r->max_tracked = c->route_max_tracked;
    r->prefill_rate = c->route_prefill_rate > 0 ? c->route_prefill_rate : 20000;
    r->uncached_weight = c->route_uncached_weight > 0 ? c->route_uncached_weight : 1;
    r->sticky_band = c->route_sticky_band;
    r->prefill_timeout_ns = c->route_prefill_timeout_ms * 1000000;
    r->decode_time_ns = c->route_decode_time_ms * 1000000;
    r->busy_kv_usage = c->route_busy_kv_usage;
    r->busy_waiting = c->route_busy_waiting;
    r->reject_all_busy = c->route_when_all_busy != NULL &&
                         strcmp(c->route_when_all_busy, "reject") == 0;
    r->pd_local_max_uncached = c->route_pd_local_max_uncached;
    r->pd_local_max_share = c->route_pd_local_max_share;
    r->session_ttl_ms = c->route_session_ttl_ms;
    r->session_max_wait = (double)c->route_session_max_wait_ms / 1000;
    if (r->sess != NULL)
        kvr_session_set_max(r->sess, c->route_session_max);
}

static void strs_free(char **v, size_t n)
{
    for (size_t k = 0; k < n; k++)
        free(v[k]);
    free(v);
}

static void approx_free(struct approx *ap, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ap[i].name);
        strs_free(ap[i].pods, ap[i].npods);
        strs_free(ap[i].pre, ap[i].npre);
        strs_free(ap[i].dec, ap[i].ndec);
    }
    free(ap);
}

/* A copy of f[0..n) into *out (counted in *nout as it goes): 0 or -ENOMEM. */
static int strs_copy(char ***out, size_t *nout, char *const *f, size_t n)
{
    if (n == 0)
        return 0;
    if ((*out = calloc(n, sizeof(char *))) == NULL)
        return -ENOMEM;
    for (size_t k = 0; k < n; k++, (*nout)++)
        if (((*out)[k] = strdup(f[k])) == NULL)
            return -ENOMEM;
    return 0;
}

/* The approximate-mode and P/D-role settings of c's [model] sections, copied: 0 or
 * -ENOMEM. */
static int approx_copy(const struct kvr_conf *c, struct approx **out, size_t *nout)
{
    struct approx *ap = calloc(c->nmodels ? c->nmodels : 1, sizeof(*ap));
    size_t n = 0;

    if (ap == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < c->nmodels; i++) {
        const struct kvr_conf_model *m = &c->models[i];
        if (!m->approximate && m->napproximate_pods == 0 && m->nprefill_pods == 0 &&
            m->ndecode_pods == 0)
            continue;
        struct approx *a = &ap[n++];
        a->all = m->approximate;
        if ((a->name = strdup(m->name)) == NULL ||
            strs_copy(&a->pods, &a->npods, m->approximate_pods, m->napproximate_pods) != 0 ||
            strs_copy(&a->pre, &a->npre, m->prefill_pods, m->nprefill_pods) != 0 ||
            strs_copy(&a->dec, &a->ndec, m->decode_pods, m->ndecode_pods) != 0)
            goto nomem;
    }
    *out = ap;
    *nout = n;
    return 0;
nomem:
    approx_free(ap, n);
    return -ENOMEM;
}

const struct approx *route_approx_of(const struct kvr_route *r, const char *model)
{
    for (size_t i = 0; i < r->nap; i++)
        if (strcmp(r->ap[i].name, model) == 0)
            return &r->ap[i];
    return NULL;
}

bool route_assumes_locked(const struct kvr_route *r, const char *model, const char *pod)
{
    const struct approx *a = route_approx_of(r, model);
    bool yes = a != NULL && a->all;
    for (size_t k = 0; a != NULL && !yes && k < a->npods; k++)
        yes = strcmp(a->pods[k], pod) == 0;
    return yes;
}

bool kvr_route_assumes(struct kvr_route *r, const char *model, const char *pod)
{
    pthread_mutex_lock(&r->mu);
    bool yes = route_assumes_locked(r, model, pod);
    pthread_mutex_unlock(&r->mu);
    return yes;
}

size_t kvr_route_approx_pods(struct kvr_route *r, const char *model,
                             void (*cb)(void *arg, const char *pod, uint32_t dp_rank), void *arg)
{
    size_t n = 0;

    pthread_mutex_lock(&r->mu);
    const struct approx *a = route_approx_of(r, model);
    for (size_t k = 0; a != NULL && k < a->npods; k++, n++)
        cb(arg, a->pods[k], 0);
    for (size_t k = 0; a != NULL && k < a->npre; k++, n++) /* roles name candidates too */
        cb(arg, a->pre[k], 0);
    for (size_t k = 0; a != NULL && k < a->ndec; k++, n++)
        cb(arg, a->dec[k], 0);
    pthread_mutex_unlock(&r->mu);
    return n;
}

int kvr_route_create(const struct kvr_conf *c, struct kvr_route **out)
{
    struct kvr_route *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->t = calloc(4096, sizeof(*r->t))) == NULL ||
        kvr_session_create(c->route_session_max, &r->sess) != 0 ||
        approx_copy(c, &r->ap, &r->nap) != 0) {
        if (r != NULL) {
            free(r->t);
            kvr_session_destroy(r->sess);
        }
        free(r);
        return -ENOMEM;
    }
    r->tmask = 4095;
    pthread_mutex_init(&r->mu, NULL);
    set_conf(r, c);
    r->rng = c->route_seed ? c->route_seed : (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)r;
    r->rng = r->rng * 0x9e3779b97f4a7c15ull | 1;
    r->head.prev = r->head.next = &r->head;
    *out = r;
    return 0;
}

void kvr_route_destroy(struct kvr_route *r)
{
    if (r == NULL)
        return;
    for (struct tracked *t = r->head.next, *n; t != &r->head; t = n) {
        n = t->next;
        free(t);
    }
    for (size_t i = 0; i < WBUCKETS; i++) {
        for (struct wload *w = r->w[i], *n; w != NULL; w = n) {
            n = w->next;
            route_flight_free(w);
            free(w->pod);
            free(w);
        }
    }
    pthread_mutex_destroy(&r->mu);
    kvr_session_destroy(r->sess);
    approx_free(r->ap, r->nap);
    free(r->t);
    free(r);
}

void kvr_route_set_conf(struct kvr_route *r, const struct kvr_conf *c)
{
    struct approx *ap = NULL, *old;
    size_t nap = 0, nold;
    bool fresh = approx_copy(c, &ap, &nap) == 0; /* out of memory: the old settings stay */

    pthread_mutex_lock(&r->mu);
    set_conf(r, c);
    old = fresh ? r->ap : NULL;
    nold = r->nap;
    if (fresh) {
        r->ap = ap;
        r->nap = nap;
    }
    pthread_mutex_unlock(&r->mu);
    approx_free(old, fresh ? nold : 0);
}

int kvr_route_policy(struct kvr_route *r)
{
    pthread_mutex_lock(&r->mu);
    int p = r->policy;
    pthread_mutex_unlock(&r->mu);
    return p;
}

static size_t wbucket(const char *pod, uint32_t rank)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)pod; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)((h ^ rank) * 0x9e3779b97f4a7c15ull >> 54) & (WBUCKETS - 1);
}

struct wload *route_wfind(struct kvr_route *r, const char *pod, uint32_t rank, bool create)
{
    size_t b = wbucket(pod, rank);
    for (struct wload *w = r->w[b]; w != NULL; w = w->next)
        if (w->rank == rank && strcmp(w->pod, pod) == 0)
            return w;
    if (!create)
        return NULL;
    struct wload *w = calloc(1, sizeof(*w));
    if (w == NULL || (w->pod = strdup(pod)) == NULL) {
        free(w);
        return NULL;
    }
    w->rank = rank;
    w->last_ns = route_now_ns();
    w->gw_role = KVR_ROUTE_ROLE_UNSET;
    w->next = r->w[b];
    r->w[b] = w;
    return w;
}

void route_wmaybe_free(struct kvr_route *r, struct wload *w)
{
    if (w->requests > 0 || w->pend.n > 0 || w->dec.n > 0 || w->rate > 0 ||
        w->gw_role != KVR_ROUTE_ROLE_UNSET) /* shown in /v1/pods until idle */
        return;
    struct wload **pp = &r->w[wbucket(w->pod, w->rank)];
    while (*pp != w)
        pp = &(*pp)->next;
    *pp = w->next;
    free(w->pod);
    free(w);
}

static void wrelease(struct kvr_route *r, struct wload *w, uint64_t tokens)
{
    w->requests--;
    w->tokens -= tokens < w->tokens ? tokens : w->tokens;
    route_wmaybe_free(r, w);
}

static bool id_used(const struct kvr_route *r, uint64_t id)
{
    const struct tracked *x = r->t[id & r->tmask];
    while (x != NULL && x->id != id)
        x = x->hnext;
    return x != NULL;
}

static void untrack(struct kvr_route *r, struct tracked *t)
{
    struct tracked **pp = &r->t[t->id & r->tmask];
    while (*pp != t)
        pp = &(*pp)->hnext;
    *pp = t->hnext;
    t->prev->next = t->next;
    t->next->prev = t->prev;
    wrelease(r, t->w, t->tokens);
    r->ntracked--;
    free(t);
}

/* Tracked requests older than max_request_age end (the gateway never said). */
static void expire(struct kvr_route *r, int64_t now)
{
    while (r->head.next != &r->head && now - r->head.next->t0_ms > r->max_age_ms) {
        untrack(r, r->head.next);
        r->expired++;
    }
}

static double decode_blocks(const struct kvr_route_cand *c, uint32_t block_size)
{
    uint32_t bs = block_size ? block_size : 1;
    return (double)((c->active_tokens + bs - 1) / bs);
}

/* The least loaded (requests, then tokens), ties by the random stream. */
static size_t least_loaded(struct kvr_route *r, const struct kvr_route_cand *c, size_t n)
{
    size_t best = 0, ties = 1;
    for (size_t i = 1; i < n; i++) {
        if (c[i].active_requests < c[best].active_requests ||
            (c[i].active_requests == c[best].active_requests &&
             c[i].active_tokens < c[best].active_tokens)) {
            best = i;
            ties = 1;
        } else if (c[i].active_requests == c[best].active_requests &&
                   c[i].active_tokens == c[best].active_tokens &&
                   route_rand(r) % ++ties == 0) {
            best = i; /* reservoir choice among equals */
        }
    }
    return best;
}

static void decide_cost(struct kvr_route *r, struct kvr_route_query *q,
                        struct kvr_route_decision *d)
{
    struct kvr_route_cand *c = q->cands;
    double lo = INFINITY, hi = 0;
    for (size_t i = 0; i < q->ncands; i++) {
        double prefill = (double)(q->query_blocks - (c[i].matched_blocks < q->query_blocks
                                                         ? c[i].matched_blocks
                                                         : q->query_blocks));
        c[i].cost = r->overlap_weight * prefill + decode_blocks(&c[i], q->block_size);
        if (c[i].cost < lo)
            lo = c[i].cost;
        if (c[i].cost > hi)
            hi = c[i].cost;
    }
    if (r->temperature > 0 && hi > 0) {
        /* softmax over -cost / max cost / temperature */
        double sum = 0, x;
        for (size_t i = 0; i < q->ncands; i++)
            sum += exp(-(c[i].cost - lo) / hi / r->temperature);
        x = (double)(route_rand(r) >> 11) / 9007199254740992.0 * sum;
        d->chosen = q->ncands - 1;
        for (size_t i = 0; i < q->ncands; i++) {
            x -= exp(-(c[i].cost - lo) / hi / r->temperature);
            if (x < 0) {
                d->chosen = i;
                break;
            }
        }
        snprintf(d->reason, sizeof(d->reason), "sampled by softmax (temperature %g)",
                 r->temperature);
        return;
    }
    size_t ties = 0;
    for (size_t i = 0; i < q->ncands; i++)
        if (c[i].cost == lo && route_rand(r) % ++ties == 0)
            d->chosen = i;
    snprintf(d->reason, sizeof(d->reason), ties > 1 ? "lowest cost (%zu tied, random choice)"
                                                    : "lowest cost",
             ties);
}

static void decide_cache_aware(struct kvr_route *r, struct kvr_route_query *q,
                               struct kvr_route_decision *d)
{
    struct kvr_route_cand *c = q->cands;
    uint64_t mn = UINT64_MAX, mx = 0;
    size_t best = 0;
    for (size_t i = 0; i < q->ncands; i++) {
        c[i].cost = q->query_blocks ? (double)c[i].matched_blocks / q->query_blocks : 0;
        if (c[i].active_requests < mn)
            mn = c[i].active_requests;
        if (c[i].active_requests > mx)
            mx = c[i].active_requests;
        if (c[i].cost > c[best].cost ||
            (c[i].cost == c[best].cost && c[i].active_requests < c[best].active_requests))
            best = i;
    }
    if (mx - mn > r->abs_threshold && (double)mx > (double)mn * r->rel_threshold) {
        d->chosen = least_loaded(r, c, q->ncands);
        snprintf(d->reason, sizeof(d->reason), "loads imbalanced (%" PRIu64 "..%" PRIu64
                 " requests): least loaded", mn, mx);
    } else if (q->query_blocks > 0 && c[best].cost >= r->cache_threshold) {
        d->chosen = best;
        snprintf(d->reason, sizeof(d->reason), "best match rate %.3f >= cache_threshold %g",
                 c[best].cost, r->cache_threshold);
    } else {
        d->chosen = least_loaded(r, c, q->ncands);
        snprintf(d->reason, sizeof(d->reason), "best match rate %.3f < cache_threshold %g: "
                 "least loaded", c[best].cost, r->cache_threshold);
    }
}

static void decide_score(struct kvr_route *r, struct kvr_route_query *q,
                         struct kvr_route_decision *d)
{
    struct kvr_route_cand *c = q->cands;
    size_t best = 0;
    for (size_t i = 0; i < q->ncands; i++) {
        c[i].cost = c[i].score;
        int k = strcmp(c[i].pod, c[best].pod);
        if (c[i].score > c[best].score ||
            (c[i].score == c[best].score &&
             (k < 0 || (k == 0 && c[i].dp_rank < c[best].dp_rank))))
            best = i;
    }
    if (c[best].matched_blocks > 0) {
        d->chosen = best;
        snprintf(d->reason, sizeof(d->reason), "best score");
    } else {
        d->chosen = least_loaded(r, c, q->ncands);
        snprintf(d->reason, sizeof(d->reason), "no candidate holds a block: least loaded");
    }
}

int route_decide_policy(struct kvr_route *r, struct kvr_route_query *q,
                        struct kvr_route_decision *d)
{
    if (d->policy == KVR_ROUTE_COST)
        decide_cost(r, q, d);
    else if (d->policy == KVR_ROUTE_CACHE_AWARE)
        decide_cache_aware(r, q, d);
    else if (d->policy == KVR_ROUTE_SCORE)
        decide_score(r, q, d);
    else
        return route_decide_ttft(r, q, d);
    return 0;
}

int kvr_route_decide(struct kvr_route *r, struct kvr_route_query *q,
                     struct kvr_route_decision *d)
{
    int64_t now;
    int rc = 0;

    if (q->ncands == 0)
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    now = route_now_ns();
    expire(r, now / 1000000);
    route_flight_gc(r, now);
    d->policy = q->policy >= 0 && q->policy < KVR_ROUTE_NPOLICIES ? q->policy : r->policy;
    d->chosen = 0;
    d->session = KVR_ROUTE_SESSION_NONE;
    for (size_t i = 0; i < q->ncands; i++) {
        struct kvr_route_cand *c = &q->cands[i];
        const struct wload *w = (!c->has_requests || !c->has_tokens)
                                    ? route_wfind(r, c->pod, c->dp_rank, false)
                                    : NULL;
        if (!c->has_requests)
            c->active_requests = w ? w->requests : 0;
        if (!c->has_tokens)
            c->active_tokens = w ? w->tokens : 0;
    }
    route_flight_view(r, q, now);
    d->prefill = SIZE_MAX;
    d->pd = false;
    for (size_t i = 0; i < q->ncands && !d->pd; i++)
        d->pd = q->cands[i].role != KVR_ROUTE_BOTH;
    if (d->pd) { /* commits itself: two workers */
        rc = route_decide_pd(r, q, d, now);
        if (rc != -ENOENT)
            r->decisions[d->policy]++;
        pthread_mutex_unlock(&r->mu);
        return rc;
    }
    rc = route_decide_policy(r, q, d);
    if (rc == 0)
        route_session_apply(r, q, d, now / 1000000);
    r->decisions[d->policy]++;
    if (rc == 0 && q->commit)
        route_flight_commit(r, q, &q->cands[d->chosen], now, true);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int kvr_route_track(struct kvr_route *r, const char *pod, uint32_t dp_rank, uint64_t tokens,
                    char id[17])
{
    struct tracked *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    pthread_mutex_lock(&r->mu);
    int64_t now = now_ms();
    expire(r, now);
    if (r->ntracked >= r->max_tracked) {
        pthread_mutex_unlock(&r->mu);
        free(t);
        return -ENOSPC;
    }
    struct wload *w = route_wfind(r, pod, dp_rank, true);
    if (w == NULL) {
        pthread_mutex_unlock(&r->mu);
        free(t);
        return -ENOMEM;
    }
    do /* a random, unused, non-zero id */
        t->id = route_rand(r);
    while (t->id == 0 || id_used(r, t->id));
    w->requests++;
    w->tokens += tokens;
    w->last_ns = now * 1000000;
    t->w = w;
    t->tokens = tokens;
    t->t0_ms = now;
    t->hnext = r->t[t->id & r->tmask];
    r->t[t->id & r->tmask] = t;
    t->prev = r->head.prev;
    t->next = &r->head;
    r->head.prev->next = t;
    r->head.prev = t;
    r->ntracked++;
    r->tracked_total++;
    snprintf(id, 17, "%016" PRIx64, t->id);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int kvr_route_end(struct kvr_route *r, const char *id, size_t len)
{
    uint64_t v = 0;
    if (len != 16)
        return -ENOENT;
    for (size_t i = 0; i < 16; i++) {
        char ch = id[i];
        unsigned d = ch >= '0' && ch <= '9' ? (unsigned)(ch - '0')
                     : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10)
                                              : 16;
        if (d == 16)
            return -ENOENT;
        v = v << 4 | d;
    }
    int rc = -ENOENT;
    pthread_mutex_lock(&r->mu);
    expire(r, now_ms());
    for (struct tracked *t = r->t[v & r->tmask]; t != NULL; t = t->hnext) {
        if (t->id == v) {
            untrack(r, t);
            r->ended++;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void kvr_route_loads(struct kvr_route *r,
                     void (*cb)(void *arg, const char *pod, uint32_t dp_rank, uint64_t requests,
                                uint64_t tokens),
                     void *arg)
{
    pthread_mutex_lock(&r->mu);
    expire(r, now_ms());
    for (size_t i = 0; i < WBUCKETS; i++)
        for (const struct wload *w = r->w[i]; w != NULL; w = w->next)
            cb(arg, w->pod, w->rank, w->requests, w->tokens);
    pthread_mutex_unlock(&r->mu);
}

void kvr_route_load(struct kvr_route *r, const char *pod, uint32_t dp_rank, uint64_t *requests,
                    uint64_t *tokens)
{
    pthread_mutex_lock(&r->mu);
    const struct wload *w = route_wfind(r, pod, dp_rank, false);
    *requests = w ? w->requests : 0;
    *tokens = w ? w->tokens : 0;
    pthread_mutex_unlock(&r->mu);
}

struct mline {
    struct kvr_buf *b;
    bool requests;
};

static void load_line(void *arg, const char *pod, uint32_t rank, uint64_t requests,
                      uint64_t tokens)
{
    struct mline *m = arg;
    char esc[600];
    kvr_metrics_label_escape(esc, sizeof(esc), pod);
    kvr_buf_printf(m->b, "kvrouter_route_active_%s{pod=\"%s\",dp_rank=\"%u\"} %" PRIu64 "\n",
                   m->requests ? "requests" : "tokens", esc, rank,
                   m->requests ? requests : tokens);
}

static void flight_line(void *arg, const char *pod, uint32_t rank,
                        const struct kvr_route_flight *f)
{
    char esc[600];
    kvr_metrics_label_escape(esc, sizeof(esc), pod);
    kvr_buf_printf(arg, "kvrouter_route_inflight_prefill_tokens{pod=\"%s\",dp_rank=\"%u\"} %"
                        PRIu64 "\n", esc, rank, f->pending_tokens);
}

static void rate_line(void *arg, const char *pod, uint32_t rank, const struct kvr_route_flight *f)
{
    char esc[600];
    if (f->prefill_rate <= 0)
        return;
    kvr_metrics_label_escape(esc, sizeof(esc), pod);
    kvr_buf_printf(arg, "kvrouter_route_prefill_rate{pod=\"%s\",dp_rank=\"%u\"} %.1f\n", esc,
                   rank, f->prefill_rate);
}

size_t kvr_route_forget_pod(struct kvr_route *r, const char *pod)
{
    pthread_mutex_lock(&r->mu);
    size_t n = kvr_session_drop_pod(r->sess, pod);
    pthread_mutex_unlock(&r->mu);
    return n;
}

void kvr_route_metrics(struct kvr_route *r, struct kvr_buf *out)
{
    uint64_t dec[KVR_ROUTE_NPOLICIES], tt, en, ex, nt, cf, pe, ps, pi, fd, ab, rj, bs, np, sa;
    pthread_mutex_lock(&r->mu);
    expire(r, now_ms());
    route_flight_age_all(r, route_now_ns());
    memcpy(dec, r->decisions, sizeof(dec));
    tt = r->tracked_total, en = r->ended, ex = r->expired, nt = r->ntracked;
    cf = r->confirmed, pe = r->pend_expired, ps = r->pend_estimated, fd = r->flight_dropped;
    pi = r->pend_inferred, sa = r->shared_applied;
    ab = r->all_busy, rj = r->rejected, bs = r->busy_skipped;
    np = atomic_load_explicit(&r->npend, memory_order_relaxed);
    pthread_mutex_unlock(&r->mu);
    kvr_buf_printf(out, "# HELP kvrouter_route_decisions_total Routing decisions "
                        "(POST /v1/route)\n# TYPE kvrouter_route_decisions_total counter\n");
    for (int i = 0; i < KVR_ROUTE_NPOLICIES; i++)
        kvr_buf_printf(out, "kvrouter_route_decisions_total{policy=\"%s\"} %" PRIu64 "\n",
                       names[i], dec[i]);
    kvr_metrics_counter(out, "route_tracked_total", "Decisions tracked as active requests",
                        NULL, tt);
    kvr_metrics_counter(out, "route_ended_total", "Tracked requests ended by the gateway",
                        NULL, en);
    kvr_metrics_counter(out, "route_expired_total",
                        "Tracked requests ended by [route] max_request_age", NULL, ex);
    kvr_metrics_gauge(out, "route_tracked", "Tracked requests active now", NULL, (double)nt);
    kvr_metrics_gauge(out, "route_inflight_prefills",
                      "Prefills of routed requests not yet confirmed by the worker's events",
                      NULL, (double)np);
    kvr_metrics_counter(out, "route_prefills_confirmed_total",
                        "Prefills of routed requests confirmed by the worker's KV events", NULL,
                        cf);
    kvr_metrics_counter(out, "route_prefills_expired_total",
                        "Prefills never confirmed within [route] prefill_timeout", NULL, pe);
    kvr_metrics_counter(out, "route_prefills_inferred_total",
                        "Prefills taken as done, unconfirmed, when one routed to the same "
                        "worker over a second later was confirmed", NULL, pi);
    kvr_metrics_counter(out, "route_shared_applied_total",
                        "Decisions of peer replicas taken in as in-flight work ([route] peers)",
                        NULL, sa);
    kvr_metrics_counter(out, "route_prefills_estimated_total",
                        "Prefills on workers without events, done by the predicted time", NULL,
                        ps);
    kvr_metrics_counter(out, "route_inflight_dropped_total",
                        "In-flight entries dropped past the per-worker limit", NULL, fd);
    kvr_metrics_counter(out, "route_busy_skipped_total",
                        "Candidates skipped as busy by the ttft policy", NULL, bs);
    kvr_metrics_counter(out, "route_all_busy_total",
                        "ttft decisions where every candidate was busy", NULL, ab);
    kvr_metrics_counter(out, "route_rejected_total",
                        "Decisions refused because every candidate was busy (when_all_busy = "
                        "reject)", NULL, rj);
    pthread_mutex_lock(&r->mu);
    kvr_session_expire(r->sess, now_ms() - r->session_ttl_ms);
    route_session_metrics(r, out);
    uint64_t split = r->pd_split, local = r->pd_local;
    pthread_mutex_unlock(&r->mu);
    kvr_buf_printf(out, "# HELP kvrouter_route_pd_decisions_total Decisions for models with "
                        "prefill and decode roles: split (a prefill worker and a decode worker) "
                        "or local (the decode worker alone)\n"
                        "# TYPE kvrouter_route_pd_decisions_total counter\n"
                        "kvrouter_route_pd_decisions_total{kind=\"split\"} %llu\n"
                        "kvrouter_route_pd_decisions_total{kind=\"local\"} %llu\n",
                   (unsigned long long)split, (unsigned long long)local);
    kvr_buf_printf(out, "# HELP kvrouter_route_inflight_prefill_tokens Uncached tokens of "
                        "routed prefills not yet confirmed, per worker\n"
                        "# TYPE kvrouter_route_inflight_prefill_tokens gauge\n");
    kvr_route_flights(r, flight_line, out);
    kvr_buf_printf(out, "# HELP kvrouter_route_prefill_rate Prefill tokens/s learned from "
                        "confirmations, per worker\n"
                        "# TYPE kvrouter_route_prefill_rate gauge\n");
    kvr_route_flights(r, rate_line, out);
    for (int k = 0; k < 2; k++) {
        struct mline m = {out, k == 0};
        kvr_buf_printf(out, "# HELP kvrouter_route_active_%s Tracked active %s per worker\n"
                            "# TYPE kvrouter_route_active_%s gauge\n",
                       k ? "tokens" : "requests", k ? "prompt tokens" : "requests",
                       k ? "tokens" : "requests");
        kvr_route_loads(r, load_line, &m);
    }
}
