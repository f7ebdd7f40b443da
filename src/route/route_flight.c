/* route_flight.c — the work kvrouterd's own decisions put on each worker, confirmed by the
 * worker's KV events, and the "ttft" policy that decides by it.
 *
 * Why: a gateway such as nginx or HAProxy sends no loads and cannot report when a response
 * ends, and an engine's /metrics lag a decision by up to one scrape. Between two scrapes a
 * burst would all go to the worker that looked best at the last one. So every decision is
 * recorded here as in-flight work on the chosen worker, and the engine's own reports are
 * used only for what they can know better (requests others routed, what is really running).
 *
 * A decision's life on its worker (struct flight):
 *   prefill   its uncached prompt tokens are queued on the worker. For a worker that
 *             publishes KV events it ends when the worker stores the request's last full
 *             block (kvr_route_confirm, called by the ingest writer with the stored blocks'
 *             content hashes: the same hashes score computed for the query), or, never
 *             confirmed, after [route] prefill_timeout (counted), or when a prefill decided
 *             over a second after it on that worker is confirmed (counted: the engine
 *             computes in arrival order, its events were lost). For a worker without
 *             events (approximate mode) or a request with no full block to store, it ends at
 *             the predicted time.
 *   decoding  counted as running until an engine metrics sample newer than its
 *             confirmation counts it itself, or [route] decode_time passes.
 * A confirmation also teaches the worker's prefill throughput: the request's tokens over the
 * time it was served (from the worker's previous confirmation, or from its decision if
 * later), a decayed ratio of sums per worker and over the fleet. It is what the worker
 * really did for us, slowed by whatever else it was doing (decodes, others' requests): the
 * rate a prediction needs.
 *
 * The ttft policy predicts each candidate's time to first token
 *     ttft = (queued + uncached_weight x uncached) / rate
 *   queued   = our unconfirmed prefills' uncached tokens on it, less what the worker has
 *                computed of the oldest since it was served (rate x time, at most all)
 *              + (the engine's waiting requests not ours: waiting at its last sample minus
 *                 our prefills decided before that sample, at least 0) x the mean uncached
 *                 tokens of our decisions
 *   uncached = this request's prompt tokens past the candidate's cached prefix
 *   rate     = the fleet's learned prefill tokens/s ([route] prefill_rate before any);
 *              a worker's own once it has 32 confirmations and differs by over 25%
 * ([route] uncached_weight, default 1: the prediction itself; above 1 a cached prefix
 * weighs more, for the work it saves the requests after this one) and picks the smallest;
 * ties go to the longest cached prefix, then the fewest running requests (the engine's
 * running at its last sample plus our requests confirmed since), then a seeded random
 * choice. Then, among the candidates within (1 + [route] sticky_band) x that best time, the
 * one with the longest cached prefix is taken instead: a band of a few milliseconds at light
 * load changes little, while under overload, where every time is seconds, it keeps requests
 * where their prefix is and the fleet computes less (measured in docs/routing.md); not one
 * decoding more than (1 + band) x the best one's running requests + 8, or a prefix most
 * requests share would stay on its first few holders. Workers over [route] busy_kv_usage
 * (the engine's KV-cache usage) or busy_waiting (its waiting requests) are skipped while
 * any other is not (SGLang's and Dynamo's busy thresholds); when all are, the best anyway,
 * or -EBUSY with [route] when_all_busy = reject. Loads the gateway sends override:
 * active_tokens stands for queued, active_requests for running.
 * Peer ideas it takes: Dynamo's cost (prefill still to compute + load, in one unit), made a
 * time with a learned rate; Dynamo's tracking of routed prefills until done, confirmed here
 * by the events rather than by the frontend; llm-d's predicted-TTFT stickiness bound and
 * its 50 ms scrape of vllm:num_requests_waiting / kv_cache_usage_perc.
 *
 * Threads: everything under kvr_route.mu (route.c takes it), except kvr_route_confirm's first
 * look at the atomic count of pending prefills.
 */
#include "route/route_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A confirmation teaches a rate only from this much work (smaller ones are mostly latency). */
#define LEARN_MIN_TOKENS 256.0
#define LEARN_WORKER 0.1  /* weight of a new sample in a worker's rate */
#define WORKER_MIN_SAMPLES 32 /* a worker's own rate is used after this many confirmations */
#define WORKER_APART 0.25     /* ... when it is this far from the fleet's (a share) */
#define LEARN_FLEET 0.05  /* ... in the fleet's */
#define GC_EVERY_NS 10000000000ll          /* sweep idle workers every 10 s at most */
#define IDLE_NS (600ll * 1000000000ll)     /* a worker idle for 10 min is forgotten */
#define STICKY_RUNNING_SLACK 8 /* requests decoding a sticky choice may have over the band */

/* Links f after `after` (NULL: as the head). */
static void fl_insert(struct flist *l, struct flight *after, struct flight *f)
{
    f->prev = after;
    f->next = after != NULL ? after->next : l->head;
    if (f->next != NULL)
        f->next->prev = f;
    else
        l->tail = f;
    if (after != NULL)
        after->next = f;
    else
        l->head = f;
    l->n++;
}

static void fl_push(struct flist *l, struct flight *f)
{
    fl_insert(l, l->tail, f);
}

static void fl_unlink(struct flist *l, struct flight *f)
{
    if (f->prev != NULL)
        f->prev->next = f->next;
    else
        l->head = f->next;
    if (f->next != NULL)
        f->next->prev = f->prev;
    else
        l->tail = f->prev;
    l->n--;
    f->prev = f->next = NULL;
}

static void fl_free(struct flist *l)
{
    for (struct flight *f = l->head, *n; f != NULL; f = n) {
        n = f->next;
        free(f);
    }
    l->head = l->tail = NULL;
    l->n = 0;
}

void route_flight_free(struct wload *w)
{
    fl_free(&w->pend);
    fl_free(&w->dec);
}

static void pend_dec(struct kvr_route *r)
{
    atomic_fetch_sub_explicit(&r->npend, 1, memory_order_relaxed);
}

/* f (unlinked from pend) becomes a decoding request since `since`. */
static void to_decoding(struct kvr_route *r, struct wload *w, struct flight *f, int64_t since)
{
    if (f->prefill_only) { /* its KV went to a decode worker, which counts the request */
        free(f);
        return;
    }
    f->due_ns = since;
    if (w->dec.n >= FLIGHT_MAX) {
        struct flight *old = w->dec.head;
        fl_unlink(&w->dec, old);
        free(old);
        r->flight_dropped++;
    }
    /* in confirmation order: nearly always the newest (an estimated prefill's predicted
     * end can be earlier than a confirmation already here) */
    struct flight *after = w->dec.tail;
    while (after != NULL && after->due_ns > since)
        after = after->prev;
    fl_insert(&w->dec, after, f);
}

/* f leaves w's pending prefills. */
static void pend_unlink(struct kvr_route *r, struct wload *w, struct flight *f)
{
    fl_unlink(&w->pend, f);
    w->pend_tokens -= f->tokens < w->pend_tokens ? f->tokens : w->pend_tokens;
    pend_dec(r);
}

void route_flight_age(struct kvr_route *r, struct wload *w, int64_t now)
{
    if (now >= w->pend_due) { /* something may be due: the whole list, and a new bound */
        int64_t next = INT64_MAX;
        for (struct flight *f = w->pend.head, *n; f != NULL; f = n) {
            n = f->next;
            if (now < f->due_ns) {
                next = f->due_ns < next ? f->due_ns : next;
                continue;
            }
            pend_unlink(r, w, f);
            if (f->evented) { /* its events never said: not counted any more */
                r->pend_expired++;
                free(f);
            } else {
                r->pend_estimated++;
                to_decoding(r, w, f, f->due_ns);
            }
        }
        w->pend_due = next;
    }
    for (struct flight *f; (f = w->dec.head) != NULL && now - f->due_ns >= r->decode_time_ns;) {
        fl_unlink(&w->dec, f);
        free(f);
    }
}

void route_flight_age_all(struct kvr_route *r, int64_t now)
{
    for (size_t i = 0; i < WBUCKETS; i++)
        for (struct wload *w = r->w[i]; w != NULL; w = w->next)
            route_flight_age(r, w, now);
}

void route_flight_gc(struct kvr_route *r, int64_t now)
{
    if (now < r->gc_ns)
        return;
    r->gc_ns = now + GC_EVERY_NS;
    for (size_t i = 0; i < WBUCKETS; i++) {
        for (struct wload *w = r->w[i], *n; w != NULL; w = n) {
            n = w->next;
            route_flight_age(r, w, now);
            if (w->requests == 0 && w->pend.n == 0 && w->dec.n == 0 &&
                now - w->last_ns > IDLE_NS) {
                w->rate = w->work = w->secs = 0; /* forgotten with it */
                w->gw_role = KVR_ROUTE_ROLE_UNSET;
                route_wmaybe_free(r, w);
            }
        }
    }
}

/* The rate a prediction divides by: the fleet's, learned over every confirmation (engines of
 * one kind do the same work at the same speed, and one worker's few samples are noisy:
 * measured in docs/routing.md), unless the worker has shown over enough confirmations that
 * it is another kind (its own rate more than WORKER_APART from the fleet's). */
static double worker_rate(const struct kvr_route *r, const struct wload *w)
{
    double fleet = r->fleet_rate > 0 ? r->fleet_rate : r->prefill_rate;
    if (w != NULL && w->rate > 0 && w->confirmed >= WORKER_MIN_SAMPLES &&
        fabs(w->rate / fleet - 1) > WORKER_APART)
        return w->rate;
    return fleet;
}

static uint64_t uncached(const struct kvr_route_query *q, const struct kvr_route_cand *c)
{
    uint64_t cached = (uint64_t)c->matched_blocks * q->block_size;
    return q->prompt_tokens > cached ? q->prompt_tokens - cached : 0;
}

/* What the worker has computed of its oldest pending prefill of ours: it has been served
 * since the previous confirmation (or its decision) at the worker's rate, at most all of it
 * (then the events are late, and the rest of the queue is counted whole). */
static double head_done(const struct kvr_route *r, const struct wload *w, int64_t now)
{
    const struct flight *h = w->pend.head;
    if (h == NULL)
        return 0;
    int64_t from = h->t0_ns > w->served_ns ? h->t0_ns : w->served_ns;
    double done = now > from ? (double)(now - from) / 1e9 * worker_rate(r, w) : 0;
    return done < (double)h->tokens ? done : (double)h->tokens;
}

void route_flight_view(struct kvr_route *r, struct kvr_route_query *q, int64_t now)
{
    for (size_t i = 0; i < q->ncands; i++) {
        struct kvr_route_cand *c = &q->cands[i];
        struct wload *w = route_wfind(r, c->pod, c->dp_rank, false);
        struct kvr_route_engine_load el;
        bool have = false;
        double queued, running;

        if (w != NULL)
            route_flight_age(r, w, now);
        if (r->load_fn != NULL && r->load_fn(r->load_arg, c->pod, c->dp_rank, &el) == 0 &&
            !el.stale)
            have = true;
        queued = w != NULL ? (double)w->pend_tokens - head_done(r, w, now) : 0;
        running = w != NULL ? (double)w->dec.n : 0;
        if (have) {
            /* our prefills decided before the sample are among its waiting or running;
             * both lists are ordered, the ones after the sample are at their tails */
            double before = w ? w->pend.n : 0, since = 0;
            for (const struct flight *f = w ? w->pend.tail : NULL;
                 f != NULL && f->t0_ns > el.sample_ns; f = f->prev)
                before--;
            for (const struct flight *f = w ? w->dec.tail : NULL;
                 f != NULL && f->due_ns > el.sample_ns; f = f->prev)
                since++;
            double others = el.waiting - before;
            if (others > 0)
                queued += others * r->mean_uncached;
            running = el.running + since;
        }
        if (c->has_tokens)
            queued = (double)c->active_tokens;
        if (c->has_requests)
            running = (double)c->active_requests;
        c->engine_load = have;
        c->kv_usage = have ? el.kv_usage : -1;
        c->busy = have && ((r->busy_kv_usage > 0 && el.kv_usage >= r->busy_kv_usage) ||
                           (r->busy_waiting > 0 && el.waiting >= r->busy_waiting));
        c->queued_tokens = (uint64_t)llround(queued);
        c->uncached_tokens = uncached(q, c);
        c->running = running;
        c->rate = worker_rate(r, w);
    }
}

static void flight_add(struct kvr_route *r, struct wload *w, struct flight *f, int64_t now);

void route_flight_commit(struct kvr_route *r, const struct kvr_route_query *q,
                         const struct kvr_route_cand *c, int64_t now, bool decodes)
{
    struct wload *w = route_wfind(r, c->pod, c->dp_rank, true);
    struct flight *f;

    if (w == NULL || (f = calloc(1, sizeof(*f))) == NULL) {
        r->flight_dropped++;
        return;
    }
    w->last_ns = now;
    w->gw_role = c->role_given ? c->role : KVR_ROUTE_ROLE_UNSET;
    r->mean_uncached = r->mean_uncached > 0
                           ? r->mean_uncached + 0.05 * ((double)c->uncached_tokens -
                                                        r->mean_uncached)
                           : (double)c->uncached_tokens;
    f->tokens = c->uncached_tokens;
    f->prefill_only = !decodes;
    f->ahead = c->queued_tokens;
    f->t0_ns = now;
    bool evented = c->evented ||
                   (q->model != NULL && !route_assumes_locked(r, q->model, c->pod));
    f->evented = evented && q->last_block != 0 && c->matched_blocks < q->query_blocks;
    f->key = f->evented ? q->last_block : 0;
    if (r->share_fn != NULL) {
        struct kvr_route_shared sh = {.pod = c->pod, .dp_rank = c->dp_rank,
                                      .tokens = f->tokens, .key = f->key,
                                      .evented = f->evented};
        r->share_fn(r->share_arg, &sh);
    }
    flight_add(r, w, f, now);
}

/* f (tokens, ahead, t0, evented, key set) becomes w's newest prefill, or decoding at once
 * when it has nothing to compute. */
static void flight_add(struct kvr_route *r, struct wload *w, struct flight *f, int64_t now)
{
    if (f->tokens == 0) { /* all cached: decoding at once */
        to_decoding(r, w, f, now);
        return;
    }
    if (f->evented)
        f->due_ns = now + r->prefill_timeout_ns;
    else /* nothing will confirm it: done when predicted */
        f->due_ns = now + (int64_t)((double)(f->ahead + f->tokens) / worker_rate(r, w) * 1e9);
    if (w->pend.n >= FLIGHT_MAX) {
        struct flight *old = w->pend.head;
        pend_unlink(r, w, old);
        free(old);
        r->flight_dropped++;
    }
    fl_push(&w->pend, f); /* t0 = now, taken under mu: the newest */
    if (f->due_ns < w->pend_due)
        w->pend_due = f->due_ns;
    w->pend_tokens += f->tokens;
    atomic_fetch_add_explicit(&r->npend, 1, memory_order_relaxed);
}

void route_flight_decoding(struct kvr_route *r, const struct kvr_route_cand *c, int64_t now)
{
    struct wload *w = route_wfind(r, c->pod, c->dp_rank, true);
    struct flight *f = w != NULL ? calloc(1, sizeof(*f)) : NULL;
    if (f == NULL) {
        r->flight_dropped++;
        return;
    }
    w->last_ns = now;
    f->t0_ns = now;
    to_decoding(r, w, f, now);
}

void kvr_route_set_share(struct kvr_route *r, kvr_route_share_fn fn, void *arg)
{
    pthread_mutex_lock(&r->mu);
    r->share_fn = fn;
    r->share_arg = arg;
    pthread_mutex_unlock(&r->mu);
}

int kvr_route_apply_shared(struct kvr_route *r, const struct kvr_route_shared *s)
{
    if (s->pod == NULL || s->pod[0] == '\0')
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    int64_t now = route_now_ns();
    struct wload *w = route_wfind(r, s->pod, s->dp_rank, true);
    struct flight *f = w != NULL ? calloc(1, sizeof(*f)) : NULL;
    if (f == NULL) {
        r->flight_dropped++;
        pthread_mutex_unlock(&r->mu);
        return -ENOMEM;
    }
    route_flight_age(r, w, now);
    w->last_ns = now;
    f->tokens = s->tokens;
    f->ahead = w->pend_tokens;
    f->t0_ns = now; /* the peer's clock is not ours: it was decided about now */
    f->evented = s->evented && s->key != 0;
    f->key = f->evented ? s->key : 0;
    flight_add(r, w, f, now);
    r->shared_applied++;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* A confirmed prefill's service time: from the worker's previous confirmation (it was queued
 * behind that one: an engine admits in arrival order and computes prefills in that order) or
 * from its decision if the worker had nothing of ours pending then. Its tokens over that
 * time, summed with decay (a ratio of sums: prefills that finish in one step together add
 * their tokens to the interval the first one measured, not an infinite rate). Counting the
 * tokens queued ahead at the decision instead overstated the rate up to 3x: the head of the
 * queue was often mostly computed by then. */
static void learn(struct kvr_route *r, struct wload *w, const struct flight *f, int64_t now)
{
    int64_t from = f->t0_ns > w->served_ns ? f->t0_ns : w->served_ns;
    double work = (double)f->tokens, secs = now > from ? (double)(now - from) / 1e9 : 0;
    w->served_ns = now;
    if (work < LEARN_MIN_TOKENS)
        return; /* a short prefill's time is mostly latency */
    w->work = w->work * (1 - LEARN_WORKER) + work;
    w->secs = w->secs * (1 - LEARN_WORKER) + secs;
    r->fleet_work = r->fleet_work * (1 - LEARN_FLEET) + work;
    r->fleet_secs = r->fleet_secs * (1 - LEARN_FLEET) + secs;
    if (w->secs > 0)
        w->rate = w->work / w->secs;
    if (r->fleet_secs > 0)
        r->fleet_rate = r->fleet_work / r->fleet_secs;
}

/* A confirmed prefill decided at t0 on w: the prefills of ours decided on w over FIFO_MARGIN
 * before it are done too, confirmed or not. An engine computes prefills in arrival order
 * (vLLM's scheduler runs the earlier admitted first; chunks of a long one take the budget
 * before a later one gets any), so only their events can be missing: lost in a gap, or never
 * sent because a sibling had already stored their last block. Without this they would count
 * as queued until prefill_timeout and keep traffic off a worker that is idle. The margin
 * leaves requests that reach the engine in another order than decided (ms apart) alone. */
#define FIFO_MARGIN_NS 1000000000ll

static void infer_before(struct kvr_route *r, struct wload *w, int64_t t0, int64_t now)
{
    for (struct flight *f; (f = w->pend.head) != NULL && f->t0_ns <= t0 - FIFO_MARGIN_NS;) {
        pend_unlink(r, w, f); /* pend is in decision order: these are its head */
        r->pend_inferred++;
        to_decoding(r, w, f, now);
    }
}

void kvr_route_confirm(struct kvr_route *r, const char *pod, uint32_t dp_rank,
                       const uint64_t *content, size_t n)
{
    if (n == 0 || atomic_load_explicit(&r->npend, memory_order_relaxed) == 0)
        return;
    pthread_mutex_lock(&r->mu);
    struct wload *w = route_wfind(r, pod, dp_rank, false);
    if (w != NULL && w->pend.n > 0) {
        int64_t now = route_now_ns(), latest = INT64_MIN;
        for (struct flight *f = w->pend.head, *nx; f != NULL; f = nx) {
            nx = f->next;
            bool hit = false;
            for (size_t i = n; f->key != 0 && i-- > 0 && !hit;)
                hit = content[i] == f->key;
            if (!hit)
                continue;
            pend_unlink(r, w, f);
            learn(r, w, f, now);
            r->confirmed++;
            w->confirmed++;
            w->last_ns = now;
            latest = f->t0_ns > latest ? f->t0_ns : latest;
            to_decoding(r, w, f, now);
        }
        if (latest != INT64_MIN)
            infer_before(r, w, latest, now);
    }
    pthread_mutex_unlock(&r->mu);
}

/* ttft's order: the lower predicted time; equal, the longer cached prefix (the request's
 * next turns find it there, and the fleet computes less); then the fewer running. */
static int ttft_cmp(const struct kvr_route_cand *a, const struct kvr_route_cand *b)
{
    if (a->cost != b->cost)
        return a->cost < b->cost ? -1 : 1;
    if (a->matched_blocks != b->matched_blocks)
        return a->matched_blocks > b->matched_blocks ? -1 : 1;
    if (a->running != b->running)
        return a->running < b->running ? -1 : 1;
    return 0;
}

int route_decide_ttft(struct kvr_route *r, struct kvr_route_query *q,
                      struct kvr_route_decision *d)
{
    struct kvr_route_cand *c = q->cands;
    size_t best = SIZE_MAX, ties = 0, nbusy = 0;

    for (size_t i = 0; i < q->ncands; i++) {
        c[i].cost = ((double)c[i].queued_tokens + r->uncached_weight * (double)c[i].uncached_tokens) /
                    c[i].rate;
        nbusy += c[i].busy;
    }
    bool all_busy = nbusy == q->ncands;
    for (size_t i = 0; i < q->ncands; i++) {
        if (c[i].busy && !all_busy)
            continue;
        int k = best == SIZE_MAX ? -1 : ttft_cmp(&c[i], &c[best]);
        if (k < 0) {
            best = i;
            ties = 1;
        } else if (k == 0 && route_rand(r) % ++ties == 0) {
            best = i; /* reservoir choice among equals */
        }
    }
    /* Within the band of the best time, the longest cached prefix (then the best time);
     * but not a worker already decoding more than the band's share above the best one
     * (plus STICKY_RUNNING_SLACK): a prefix most requests share would otherwise stay on the
     * few workers that hold it, their decodes slowing their prefills in a way the learned
     * rate does not show, instead of being copied to more (docs/routing.md). */
    if (r->sticky_band > 0) {
        double lim = c[best].cost * (1 + r->sticky_band);
        double rlim = c[best].running * (1 + r->sticky_band) + STICKY_RUNNING_SLACK;
        for (size_t i = 0; i < q->ncands; i++) {
            if ((c[i].busy && !all_busy) || c[i].cost > lim || c[i].running > rlim)
                continue;
            if (c[i].matched_blocks > c[best].matched_blocks)
                best = i;
        }
    }
    d->chosen = best;
    int n = snprintf(d->reason, sizeof(d->reason),
                     "lowest predicted time to first token, %.3f s (%" PRIu64 " queued + %" PRIu64
                     " uncached tokens at %.0f/s)",
                     c[best].cost, c[best].queued_tokens, c[best].uncached_tokens, c[best].rate);
    if (nbusy > 0 && n > 0 && (size_t)n < sizeof(d->reason))
        snprintf(d->reason + n, sizeof(d->reason) - (size_t)n, all_busy ? "; all %zu busy"
                                                                          : "; %zu busy skipped",
                 nbusy);
    if (!all_busy) {
        r->busy_skipped += nbusy;
        return 0;
    }
    r->all_busy++;
    if (!r->reject_all_busy)
        return 0;
    r->rejected++;
    return -EBUSY;
}

void kvr_route_set_load_source(struct kvr_route *r, kvr_route_load_fn fn, void *arg)
{
    pthread_mutex_lock(&r->mu);
    r->load_fn = fn;
    r->load_arg = arg;
    pthread_mutex_unlock(&r->mu);
}

static void flight_of(const struct wload *w, struct kvr_route_flight *f)
{
    *f = (struct kvr_route_flight){.requests = w->requests, .tokens = w->tokens,
                                   .pending = w->pend.n, .pending_tokens = w->pend_tokens,
                                   .decoding = w->dec.n, .confirmed = w->confirmed,
                                   .prefill_rate = w->rate,
                                   .role_given = w->gw_role == KVR_ROUTE_ROLE_UNSET
                                                     ? -1
                                                     : w->gw_role};
}

void kvr_route_flight_of(struct kvr_route *r, const char *pod, uint32_t dp_rank,
                         struct kvr_route_flight *out)
{
    memset(out, 0, sizeof(*out));
    out->role_given = -1;
    pthread_mutex_lock(&r->mu);
    struct wload *w = route_wfind(r, pod, dp_rank, false);
    if (w != NULL) {
        route_flight_age(r, w, route_now_ns());
        flight_of(w, out);
    }
    pthread_mutex_unlock(&r->mu);
}

void kvr_route_flights(struct kvr_route *r,
                       void (*cb)(void *arg, const char *pod, uint32_t dp_rank,
                                  const struct kvr_route_flight *f),
                       void *arg)
{
    pthread_mutex_lock(&r->mu);
    int64_t now = route_now_ns();
    for (size_t i = 0; i < WBUCKETS; i++) {
        for (struct wload *w = r->w[i]; w != NULL; w = w->next) {
            route_flight_age(r, w, now);
            if (w->pend.n == 0 && w->dec.n == 0 && w->rate == 0 && w->confirmed == 0)
                continue;
            struct kvr_route_flight f;
            flight_of(w, &f);
            cb(arg, w->pod, w->rank, &f);
        }
    }
    pthread_mutex_unlock(&r->mu);
}
