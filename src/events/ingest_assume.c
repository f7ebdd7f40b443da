/* ingest_assume.c — approximate mode on the writer threads: routing decisions to workers
 * that publish no KV events, taken as those workers now holding the requests' blocks.
 *
 * Why here: the index lets one thread write a worker (index.h), and that is the writer that
 * owns the worker's pod. So an HTTP loop that made a decision does not write the index: it
 * copies the request's block hashes into an ASSUME item and queues it, without waiting, on
 * the pod's writer (a full queue drops the assumption, counted: a guess is not worth
 * stalling a query). The writer keeps the bookkeeping in its own assumed store (assume.h:
 * per-worker LRU, touch times) and mirrors it into the index's "assumed" tier, so finds and
 * scores see assumed blocks like any tier, with their own weight ([score] weight.assumed).
 *
 * Workers: a pod that only ever appears in decisions is interned like one with events;
 * when its last assumption expires it is forgotten again (forget_if_idle).
 *
 * Precedence: a worker with an event stream (or one restored from a snapshot) is never
 * assumed, and its first batch drops whatever was assumed before (kvr_ingest_assume_evented
 * from the stream's creation): events say what it holds. Assumed blocks are the only entries
 * of the index that expire ([route] assumed_ttl after the last decision that routed them);
 * event-fed entries never do.
 *
 * Keys: the index needs a per-holder key for each block (removals, parents); an engine hash
 * does not exist here, so the key of block i is a hash of the whole prefix ending there:
 * key[i] = mix64(key[i-1] * KVR_HASH_CHAIN_MUL + content[i]), from the namespace's seed, so
 * equal prefixes get equal keys and a prefix's blocks are found again by later requests.
 */
#include "events/ingest.h"
#include "events/ingest_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "events/assume.h"
#include "index/hash.h"

#define AS_PAIR_BYTES 64u /* the memory cap's estimate of a stored block (ingest_apply.c) */
#define AS_EXPIRE_BATCH 1024

static const char *msg_names(const struct as_msg *m)
{
    return (const char *)(m->content + m->n);
}

int kvr_ingest_assume(struct kvr_ingest *ing, const struct kvr_ingest_assumption *a)
{
    size_t ml, ll, pl, n;
    struct kvr_queue_msg *it;
    struct writer *w;
    struct as_msg *m;

    if (a == NULL || a->model == NULL || a->pod == NULL || (a->n > 0 && a->content == NULL))
        return -EINVAL;
    ml = strlen(a->model);
    ll = a->lora != NULL ? strlen(a->lora) : 0;
    pl = strlen(a->pod);
    if (ml == 0 || pl == 0 || ml > KVR_NAME_MAX || ll > KVR_NAME_MAX || pl > KVR_NAME_MAX)
        return -EINVAL;
    n = a->n;
    if (a->predict && !kvr_ingest_predicting(ing))
        return 0;
    uint32_t max = atomic_load_explicit(&ing->assume_max, memory_order_relaxed);
    if (n > max)
        n = max;
    if (n == 0)
        return 0;
    if (!atomic_load(&ing->writers_running))
        return -ESHUTDOWN;
    m = malloc(sizeof(*m) + n * sizeof(uint64_t) + ml + ll + pl + 3);
    if (m == NULL)
        return -ENOMEM;
    m->dp_rank = a->dp_rank;
    m->n = (uint32_t)n;
    m->model_len = (uint16_t)ml;
    m->lora_len = (uint16_t)ll;
    m->pod_len = (uint16_t)pl;
    m->predict = a->predict;
    memcpy(m->content, a->content, n * sizeof(uint64_t));
    char *names = (char *)(m->content + n);
    memcpy(names, a->model, ml + 1);
    if (ll > 0)
        memcpy(names + ml + 1, a->lora, ll);
    names[ml + 1 + ll] = '\0';
    memcpy(names + ml + ll + 2, a->pod, pl + 1);

    w = &ing->w[kvr_queue_shard(a->pod, pl, ing->nwriters)];
    it = kvr_queue_try_reserve(w->q);
    if (it == NULL) {
        free(m);
        if (kvr_queue_closed(w->q))
            return -ESHUTDOWN;
        if (a->predict)
            KVR_CNT_INC(ing->predict_full);
        else
            KVR_CNT_INC(ing->assume_full);
        return -EAGAIN;
    }
    memset(it, 0, sizeof(*it));
    it->kind = KVR_QUEUE_ASSUME;
    it->payload = (struct kvr_queue_payload){.data = m, .len = sizeof(*m), .release = free,
                                             .ctx = m};
    kvr_queue_commit(w->q);
    return 0;
}

void kvr_ingest_set_assume_limits(struct kvr_ingest *ing, int64_t ttl_ms, uint32_t max_blocks)
{
    atomic_store_explicit(&ing->assume_ttl_ms, ttl_ms > 0 ? ttl_ms : 120000,
                          memory_order_relaxed);
    atomic_store_explicit(&ing->assume_max, max_blocks > 0 ? max_blocks : 65536,
                          memory_order_relaxed);
}

uint64_t kvr_ingest_assumed_blocks(struct kvr_ingest *ing)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < ing->nwriters; i++)
        n += KVR_CNT_GET(ing->w[i].st.as_count);
    return n;
}

/* ---- the writer side ------------------------------------------------------------------ */

static bool evented(const struct writer *w, uint32_t wid)
{
    return wid < w->nevented && (w->evented[wid / 64] >> (wid % 64) & 1);
}

static void publish_count(struct writer *w)
{
    KVR_CNT_SET(w->st.as_count, w->as != NULL ? kvr_assume_count(w->as) : 0);
}

/* Worker wid's entry in the published list follows its count (added, updated, removed at
 * 0). Out of memory: the list misses the worker (only the listing is affected). */
static void publish_worker(struct writer *w, uint32_t wid)
{
    uint64_t n = w->as != NULL ? kvr_assume_worker_count(w->as, wid) : 0;
    uint32_t at = wid < w->as_pub_nat ? w->as_pub_at[wid] : 0;

    if (at == 0 && n == 0)
        return;
    if (at == 0) {
        const char *pod = kvr_index_worker_pod(w->ing->ix, wid);
        char *dup;
        if (pod == NULL || (dup = strdup(pod)) == NULL)
            return;
        if (wid >= w->as_pub_nat) {
            uint32_t nn = w->as_pub_nat ? w->as_pub_nat : 256;
            while (nn <= wid)
                nn *= 2;
            uint32_t *v = realloc(w->as_pub_at, nn * sizeof(*v));
            if (v == NULL) {
                free(dup);
                return;
            }
            memset(v + w->as_pub_nat, 0, (nn - w->as_pub_nat) * sizeof(*v));
            w->as_pub_at = v;
            w->as_pub_nat = nn;
        }
        pthread_mutex_lock(&w->as_mu);
        if (w->as_npub == w->as_cappub) {
            size_t nc = w->as_cappub ? w->as_cappub * 2 : 16;
            struct as_pub *v = realloc(w->as_pub, nc * sizeof(*v));
            if (v == NULL) {
                pthread_mutex_unlock(&w->as_mu);
                free(dup);
                return;
            }
            w->as_pub = v;
            w->as_cappub = nc;
        }
        w->as_pub[w->as_npub] = (struct as_pub){dup, wid, kvr_index_worker_rank(w->ing->ix, wid),
                                                n};
        w->as_pub_at[wid] = (uint32_t)++w->as_npub;
        pthread_mutex_unlock(&w->as_mu);
        return;
    }
    pthread_mutex_lock(&w->as_mu);
    if (n > 0) {
        w->as_pub[at - 1].blocks = n;
        pthread_mutex_unlock(&w->as_mu);
        return;
    }
    char *gone = w->as_pub[at - 1].pod;
    w->as_pub[at - 1] = w->as_pub[--w->as_npub];
    if (at - 1 < w->as_npub)
        w->as_pub_at[w->as_pub[at - 1].wid] = at;
    w->as_pub_at[wid] = 0;
    pthread_mutex_unlock(&w->as_mu);
    free(gone);
}

void kvr_ingest_assumed_workers(struct kvr_ingest *ing,
                                void (*cb)(void *arg, const char *pod, uint32_t dp_rank,
                                           uint64_t blocks),
                                void *arg)
{
    for (uint32_t i = 0; i < ing->nwriters; i++) {
        struct writer *w = &ing->w[i];
        pthread_mutex_lock(&w->as_mu);
        for (size_t k = 0; k < w->as_npub; k++)
            cb(arg, w->as_pub[k].pod, w->as_pub[k].dp_rank, w->as_pub[k].blocks);
        pthread_mutex_unlock(&w->as_mu);
    }
}

/* The next expiry check: when the oldest assumption expires, plus a little slack so that a
 * busy fleet's steady trickle of expiries is taken in batches. */
static void plan_expiry(struct writer *w, int64_t ttl)
{
    int64_t oldest = w->as != NULL ? kvr_assume_oldest(w->as) : INT64_MAX;
    int64_t slack = ttl / 100 > 10 ? ttl / 100 : 10;
    w->next_expire = oldest == INT64_MAX ? 0 : oldest + ttl + slack;
}

static bool ensure_scratch(struct writer *w, size_t n)
{
    if (n <= w->as_cap)
        return true;
    size_t cap = w->as_cap ? w->as_cap : 256;
    while (cap < n)
        cap *= 2;
    uint64_t *k = realloc(w->as_keys, cap * sizeof(*k));
    if (k == NULL)
        return false;
    w->as_keys = k;
    struct kvr_assume_pair *pr = realloc(w->as_pairs, cap * sizeof(*pr));
    if (pr == NULL)
        return false;
    w->as_pairs = pr;
    struct kvr_index_block *b = realloc(w->as_blocks, cap * sizeof(*b));
    if (b == NULL)
        return false;
    w->as_blocks = b;
    w->as_cap = cap;
    return true;
}

/* Drops worker wid's assumptions from the store and the index (its tier alone). */
static void drop_worker(struct writer *w, uint32_t wid)
{
    struct kvr_index_wres res = {0};
    size_t n;

    if (w->as == NULL || (n = kvr_assume_drop_worker(w->as, wid)) == 0)
        return;
    (void)kvr_index_clear(w->ing->ix, wid, w->as_tier, &res);
    KVR_CNT_OWN_ADD(w->st.as_dropped, n);
    publish_worker(w, wid); /* the list first: a reader that saw the gauge sees it */
    publish_count(w);
}

static void evict_over(struct writer *w, uint32_t wid, uint32_t max)
{
    size_t k;

    while ((k = kvr_assume_evict(w->as, wid, max, w->as_keys, w->as_cap)) > 0) {
        struct kvr_index_wres res = {0};
        (void)kvr_index_remove(w->ing->ix, wid, w->as_tier, w->as_keys, k, &res);
        KVR_CNT_OWN_ADD(w->st.as_evicted, k);
    }
}

void kvr_ingest_assume_apply(struct writer *w, const struct kvr_queue_payload *p)
{
    struct kvr_ingest *ing = w->ing;
    struct kvr_index *ix = ing->ix;
    const struct as_msg *m = p->data;
    const char *model = msg_names(m), *lora = model + m->model_len + 1;
    const char *pod = lora + m->lora_len + 1;
    uint32_t ns, wid, max = atomic_load_explicit(&ing->assume_max, memory_order_relaxed);
    int64_t ttl = atomic_load_explicit(&ing->assume_ttl_ms, memory_order_relaxed);
    uint64_t seed, cap, prev;
    size_t n = m->n, first;
    int rc;

    if (m->predict) {
        kvr_ingest_predict_apply(w, m);
        return;
    }
    if (kvr_index_worker_lookup(ix, pod, m->dp_rank, &wid) != 0 &&
        kvr_index_worker_intern(ix, pod, m->dp_rank, &wid) != 0) {
        KVR_CNT_OWN_INC(w->st.as_skipped[AS_SKIP_WORKER]); /* max_workers reached */
        return;
    }
    if (evented(w, wid)) {
        KVR_CNT_OWN_INC(w->st.as_skipped[AS_SKIP_EVENTS]);
        return;
    }
    cap = atomic_load_explicit(&ing->max_memory, memory_order_relaxed);
    if (cap != 0) {
        uint64_t bytes = kvr_index_bytes(ix);
        if (bytes >= cap || (uint64_t)n > (cap - bytes) / AS_PAIR_BYTES) {
            KVR_CNT_OWN_INC(w->st.as_skipped[AS_SKIP_OVER_BUDGET]);
            return;
        }
    }
    if (kvr_index_ns_intern(ix, model, m->lora_len ? lora : NULL, &ns, &seed) != 0 ||
        (w->as_tier == 0 && kvr_index_tier_intern(ix, "assumed", 7, &w->as_tier) != 0) ||
        (w->as == NULL && kvr_assume_create(&w->as) != 0) || !ensure_scratch(w, n)) {
        KVR_CNT_OWN_INC(w->st.as_skipped[AS_SKIP_INDEX]);
        return;
    }
    prev = kvr_hash_mix64(seed ^ KVR_HASH_CHAIN_ROOT);
    for (size_t i = 0; i < n; i++)
        prev = w->as_keys[i] = kvr_hash_mix64(prev * KVR_HASH_CHAIN_MUL + m->content[i]);
    rc = kvr_assume_touch(w->as, wid, w->as_keys, n, kvr_now_ms(), max, &first);
    if (rc < 0) {
        KVR_CNT_OWN_INC(w->st.as_skipped[AS_SKIP_INDEX]);
        return;
    }
    n = (size_t)rc;
    KVR_CNT_OWN_ADD(w->st.as_refreshed, first);
    if (first < n) {
        struct kvr_index_wres res = {0};
        for (size_t i = first; i < n; i++)
            w->as_blocks[i - first] = (struct kvr_index_block){.engine_hash = w->as_keys[i],
                                                            .content_hash = m->content[i]};
        rc = kvr_index_store(ix, wid, w->as_tier, ns, first > 0 ? &w->as_keys[first - 1] : NULL,
                             w->as_blocks, n - first, &res);
        KVR_CNT_OWN_ADD(w->st.as_stored, res.stored);
        if (rc != 0) { /* the store and the index may disagree now: start the worker over */
            drop_worker(w, wid);
            KVR_CNT_OWN_INC(w->st.as_skipped[AS_SKIP_INDEX]);
            return;
        }
    }
    evict_over(w, wid, max);
    KVR_CNT_OWN_INC(w->st.as_applied);
    publish_worker(w, wid); /* the list first: a reader that saw the gauge sees it */
    publish_count(w);
    if (w->next_expire == 0)
        plan_expiry(w, ttl);
}

/* Expired (wid, key) pairs are removed from the index one call per worker: by worker. */
static int pair_cmp(const void *a, const void *b)
{
    uint32_t x = ((const struct kvr_assume_pair *)a)->wid;
    uint32_t y = ((const struct kvr_assume_pair *)b)->wid;
    return x < y ? -1 : x > y;
}

/* A pod known only through assumptions whose last assumption expired is forgotten, as
 * [events] forget_after forgets idle pods with events: its worker ids go back for reuse
 * (gateways that route to ever new pod names would otherwise fill max_workers). Only when
 * none of its workers publishes events or holds an assumption, and it has no topic here. */
static void forget_if_idle(struct writer *w, uint32_t wid)
{
    struct kvr_index *ix = w->ing->ix;
    uint32_t pid = kvr_index_worker_pod_id(ix, wid), wids[64];
    const char *pod = kvr_index_worker_pod(ix, wid);
    struct kvr_index_wres res = {0};
    size_t n;

    if (pid == UINT32_MAX || pod == NULL)
        return;
    n = kvr_index_pod_workers(ix, pid, wids, 64);
    if (n > 64) /* a pod of that many ranks stays */
        return;
    for (size_t i = 0; i < n; i++)
        if (evented(w, wids[i]) || kvr_assume_worker_count(w->as, wids[i]) > 0)
            return;
    for (size_t i = 0; i < w->ntopics; i++)
        if (strcmp(w->topics[i]->t->pod, pod) == 0)
            return;
    if (kvr_index_pod_forget(ix, pid, &res) == 0)
        KVR_CNT_OWN_INC(w->st.as_forgotten);
}

void kvr_ingest_assume_expire(struct writer *w)
{
    int64_t now, ttl;
    size_t k;

    kvr_ingest_predict_expire(w);
    if (w->as == NULL || w->next_expire == 0 || (now = kvr_now_ms()) < w->next_expire)
        return;
    ttl = atomic_load_explicit(&w->ing->assume_ttl_ms, memory_order_relaxed);
    if (!ensure_scratch(w, AS_EXPIRE_BATCH))
        return;
    while ((k = kvr_assume_expire(w->as, now - ttl, w->as_pairs, AS_EXPIRE_BATCH)) > 0) {
        struct kvr_assume_pair *v = w->as_pairs;
        qsort(v, k, sizeof(*v), pair_cmp); /* one remove call per worker */
        for (size_t i = 0, j; i < k; i = j) {
            struct kvr_index_wres res = {0};
            for (j = i; j < k && v[j].wid == v[i].wid; j++)
                w->as_keys[j - i] = v[j].key;
            (void)kvr_index_remove(w->ing->ix, v[i].wid, w->as_tier, w->as_keys, j - i, &res);
            publish_worker(w, v[i].wid); /* before a forget frees its pod name */
            if (kvr_assume_worker_count(w->as, v[i].wid) == 0)
                forget_if_idle(w, v[i].wid);
        }
        KVR_CNT_OWN_ADD(w->st.as_expired, k);
    }
    publish_count(w);
    plan_expiry(w, ttl);
}

int64_t kvr_ingest_assume_wait_ms(const struct writer *w)
{
    int64_t p = kvr_ingest_predict_wait_ms(w);
    if (w->next_expire == 0)
        return p;
    int64_t d = w->next_expire - kvr_now_ms();
    d = d > 0 ? d : 0;
    return p >= 0 && p < d ? p : d;
}

void kvr_ingest_assume_evented(struct writer *w, uint32_t wid)
{
    drop_worker(w, wid);
    kvr_ingest_predict_evented(w, wid);
    if (wid >= w->nevented) {
        uint32_t nb = w->nevented ? w->nevented : 1024;
        while (nb <= wid)
            nb *= 2;
        uint64_t *e = realloc(w->evented, nb / 8);
        if (e == NULL) /* out of memory: a later decision may still assume it (the next
                        * batch's stream creation does not come again: the bit is lost) */
            return;
        memset(e + w->nevented / 64, 0, (nb - w->nevented) / 8);
        w->evented = e;
        w->nevented = nb;
    }
    w->evented[wid / 64] |= 1ull << (wid % 64);
}

void kvr_ingest_assume_forgotten(struct writer *w, uint32_t wid)
{
    kvr_ingest_predict_cleared(w, wid);
    if (wid < w->nevented)
        w->evented[wid / 64] &= ~(1ull << (wid % 64));
    if (w->as != NULL && kvr_assume_worker_count(w->as, wid) > 0) {
        /* the index dropped the blocks already (kvr_index_pod_forget) */
        KVR_CNT_OWN_ADD(w->st.as_dropped, kvr_assume_drop_worker(w->as, wid));
        publish_worker(w, wid);
        publish_count(w);
    }
}

void kvr_ingest_assume_free(struct writer *w)
{
    kvr_ingest_predict_free(w);
    for (size_t k = 0; k < w->as_npub; k++)
        free(w->as_pub[k].pod);
    free(w->as_pub);
    free(w->as_pub_at);
    w->as_pub = NULL;
    w->as_pub_at = NULL;
    w->as_npub = w->as_cappub = 0;
    kvr_assume_destroy(w->as);
    w->as = NULL;
    free(w->evented);
    free(w->as_keys);
    free(w->as_pairs);
    free(w->as_blocks);
    w->as_blocks = NULL;
    w->evented = NULL;
    w->as_keys = NULL;
    w->as_pairs = NULL;
}
