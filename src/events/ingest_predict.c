/* ingest_predict.c — predicted entries (issue #26): a routing decision to a worker that
 * publishes events, taken as that worker computing the request's blocks until its events
 * say so.
 *
 * Why: a worker's BlockStored arrives when its prefill completes, hundreds of ms after the
 * decision. Sixteen siblings sharing a long prefix that arrive within those ms would each
 * be routed as if no worker held it, and a load-aware policy spreads them. So the decision
 * is indexed too, for a short while ([route] predicted_ttl), in the index's "predicted"
 * tier; scores read it apart from the exact tiers (score.h: predicted_blocks), the policies
 * take the better of the two.
 *
 * Reuse: the bookkeeping is approximate mode's (assume.h: touch times, per-worker LRU
 * under [route] assumed_max_blocks, expiry), in a second store w->pr, and the items are its
 * ASSUME items with predict set (ingest_assume.c queues them). The same thread rule holds:
 * only this writer, the one that owns the pod, writes the worker's entries.
 *
 * Keys: the index's own chain hashes (kvr_index_chain_root, kvr_hash_chain), so that a
 * BlockStored, whose blocks the index keys by chain, names the predictions it confirms
 * (kvr_index_chain_of). A confirmed block leaves with its predicted ancestors (the engine
 * holds a block's whole prefix); its descendants stay, so the tier may lack a chain's first
 * blocks where the events took over. A later prediction of such a chain stores each run of
 * keys the store lacks, with the key before the run (held) as its parent.
 *
 * Contradictions: a removal of a predicted block drops that block (its descendants no
 * longer match past it in any tier, and expire); AllBlocksCleared, a restart, a purge or a
 * forget clear the index's tiers of the worker, and its predictions with them.
 */
#include "events/ingest.h"
#include "events/ingest_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "events/assume.h"
#include "index/hash.h"

#define PR_PAIR_BYTES 64u /* the memory cap's estimate of a stored block (ingest_apply.c) */
#define PR_EXPIRE_BATCH 1024

void kvr_ingest_set_predict_ttl(struct kvr_ingest *ing, int64_t ttl_ms)
{
    atomic_store_explicit(&ing->predict_ttl_ms, ttl_ms > 0 ? ttl_ms : 0, memory_order_relaxed);
}

bool kvr_ingest_predicting(struct kvr_ingest *ing)
{
    return atomic_load_explicit(&ing->predict_ttl_ms, memory_order_relaxed) > 0;
}

uint64_t kvr_ingest_predicted_blocks(struct kvr_ingest *ing)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < ing->nwriters; i++)
        n += KVR_CNT_GET(ing->w[i].st.pr_count);
    return n;
}

static bool has_events(const struct writer *w, uint32_t wid)
{
    return wid < w->nevented && (w->evented[wid / 64] >> (wid % 64) & 1);
}

static void publish_count(struct writer *w)
{
    KVR_CNT_SET(w->st.pr_count, w->pr != NULL ? kvr_assume_count(w->pr) : 0);
}

static bool ensure_scratch(struct writer *w, size_t n)
{
    if (n <= w->pr_cap)
        return true;
    size_t cap = w->pr_cap ? w->pr_cap : 256;
    while (cap < n)
        cap *= 2;
    uint64_t *k = realloc(w->pr_keys, cap * sizeof(*k));
    if (k == NULL)
        return false;
    w->pr_keys = k;
    struct kvr_assume_pair *pr = realloc(w->pr_pairs, cap * sizeof(*pr));
    if (pr == NULL)
        return false;
    w->pr_pairs = pr;
    struct kvr_index_block *b = realloc(w->pr_blocks, cap * sizeof(*b));
    if (b == NULL)
        return false;
    w->pr_blocks = b;
    uint8_t *f = realloc(w->pr_new, cap);
    if (f == NULL)
        return false;
    w->pr_new = f;
    w->pr_cap = cap;
    return true;
}

static void plan_expiry(struct writer *w, int64_t ttl)
{
    int64_t oldest = w->pr != NULL ? kvr_assume_oldest(w->pr) : INT64_MAX;
    int64_t slack = ttl / 100 > 10 ? ttl / 100 : 10;
    w->pr_next_expire = oldest == INT64_MAX || ttl <= 0 ? 0 : oldest + ttl + slack;
}

/* Drops all of worker wid's predictions, from the store and (unless the caller's clear did)
 * the index; counted as contradicted. */
static void drop_worker(struct writer *w, uint32_t wid, bool index_too)
{
    struct kvr_index_wres res = {0};
    size_t n;

    if (w->pr == NULL || (n = kvr_assume_drop_worker(w->pr, wid)) == 0)
        return;
    if (index_too)
        (void)kvr_index_clear(w->ing->ix, wid, w->pr_tier, &res);
    KVR_CNT_OWN_ADD(w->st.pr_contradicted, n);
    publish_count(w);
}

void kvr_ingest_predict_apply(struct writer *w, const struct as_msg *m)
{
    struct kvr_ingest *ing = w->ing;
    struct kvr_index *ix = ing->ix;
    const char *model = (const char *)(m->content + m->n), *lora = model + m->model_len + 1;
    const char *pod = lora + m->lora_len + 1;
    uint32_t ns, wid, max = atomic_load_explicit(&ing->assume_max, memory_order_relaxed);
    int64_t ttl = atomic_load_explicit(&ing->predict_ttl_ms, memory_order_relaxed);
    uint64_t seed, cap, prev;
    size_t n = m->n, first, nnew = 0;
    int rc;

    if (ttl <= 0) /* turned off since it was queued */
        return;
    if (kvr_index_worker_lookup(ix, pod, m->dp_rank, &wid) != 0 || !has_events(w, wid)) {
        KVR_CNT_OWN_INC(w->st.pr_skipped[PR_SKIP_NO_EVENTS]);
        return;
    }
    cap = atomic_load_explicit(&ing->max_memory, memory_order_relaxed);
    if (cap != 0) {
        uint64_t bytes = kvr_index_bytes(ix);
        if (bytes >= cap || (uint64_t)n > (cap - bytes) / PR_PAIR_BYTES) {
            KVR_CNT_OWN_INC(w->st.pr_skipped[PR_SKIP_OVER_BUDGET]);
            return;
        }
    }
    if (n > max)
        n = max;
    if (kvr_index_ns_intern(ix, model, m->lora_len ? lora : NULL, &ns, &seed) != 0 ||
        (w->pr_tier == 0 && kvr_index_tier_intern(ix, "predicted", 9, &w->pr_tier) != 0) ||
        (w->pr == NULL && kvr_assume_create(&w->pr) != 0) || !ensure_scratch(w, n)) {
        KVR_CNT_OWN_INC(w->st.pr_skipped[PR_SKIP_INDEX]);
        return;
    }
    prev = kvr_index_chain_root(ns);
    for (size_t i = 0; i < n; i++) {
        prev = w->pr_keys[i] = kvr_hash_chain(prev, m->content[i]);
        w->pr_new[i] = !kvr_assume_holds(w->pr, wid, prev);
        nnew += w->pr_new[i];
    }
    rc = kvr_assume_touch(w->pr, wid, w->pr_keys, n, kvr_now_ms(), max, &first);
    if (rc < 0) { /* nothing changed */
        KVR_CNT_OWN_INC(w->st.pr_skipped[PR_SKIP_INDEX]);
        return;
    }
    KVR_CNT_OWN_ADD(w->st.pr_refreshed, n - nnew);
    /* each run of new keys, parented on the held key before it (or at position 0) */
    for (size_t i = 0, j; i < n; i = j) {
        struct kvr_index_wres res = {0};
        if (!w->pr_new[i]) {
            j = i + 1;
            continue;
        }
        for (j = i; j < n && w->pr_new[j]; j++)
            w->pr_blocks[j - i] = (struct kvr_index_block){.engine_hash = w->pr_keys[j],
                                                          .content_hash = m->content[j]};
        rc = kvr_index_store(ix, wid, w->pr_tier, ns, i > 0 ? &w->pr_keys[i - 1] : NULL,
                             w->pr_blocks, j - i, &res);
        KVR_CNT_OWN_ADD(w->st.pr_stored, res.stored);
        if (rc != 0) { /* the store and the index may disagree now: start the worker over */
            drop_worker(w, wid, true);
            KVR_CNT_OWN_INC(w->st.pr_skipped[PR_SKIP_INDEX]);
            return;
        }
    }
    size_t k;
    while ((k = kvr_assume_evict(w->pr, wid, max, w->pr_keys, w->pr_cap)) > 0) {
        struct kvr_index_wres res = {0};
        (void)kvr_index_remove(ix, wid, w->pr_tier, w->pr_keys, k, &res);
        KVR_CNT_OWN_ADD(w->st.pr_evicted, k);
    }
    KVR_CNT_OWN_INC(w->st.pr_applied);
    publish_count(w);
    if (w->pr_next_expire == 0)
        plan_expiry(w, ttl);
}

void kvr_ingest_predict_stored(struct writer *w, uint32_t wid, uint8_t tier,
                               const uint64_t *hashes, size_t n)
{
    size_t held, done = 0;

    if (w->pr == NULL || tier == w->pr_tier || (held = kvr_assume_worker_count(w->pr, wid)) == 0)
        return;
    if (!ensure_scratch(w, held)) /* out of memory: they expire instead */
        return;
    for (size_t i = n; i-- > 0 && done < held;) { /* leaf first: one walk takes the chain */
        uint64_t chain;
        size_t k;
        if (kvr_index_chain_of(w->ing->ix, wid, tier, hashes[i], &chain) != 0)
            continue; /* parked as an orphan: not in the index yet */
        k = kvr_assume_confirm(w->pr, wid, chain, w->pr_keys, w->pr_cap);
        if (k > 0) {
            struct kvr_index_wres res = {0};
            (void)kvr_index_remove(w->ing->ix, wid, w->pr_tier, w->pr_keys, k, &res);
            KVR_CNT_OWN_ADD(w->st.pr_confirmed, k);
            done += k;
        }
    }
    if (done > 0)
        publish_count(w);
}

void kvr_ingest_predict_removing(struct writer *w, uint32_t wid, uint8_t tier,
                                 const uint64_t *hashes, size_t n)
{
    size_t dropped = 0;

    if (w->pr == NULL || tier == w->pr_tier || kvr_assume_worker_count(w->pr, wid) == 0 ||
        !ensure_scratch(w, 1))
        return;
    for (size_t i = 0; i < n; i++) {
        uint64_t chain, key;
        if (kvr_index_chain_of(w->ing->ix, wid, tier, hashes[i], &chain) != 0)
            continue;
        /* a cap of 1: the block alone, not its ancestors */
        if (kvr_assume_confirm(w->pr, wid, chain, &key, 1) == 1) {
            struct kvr_index_wres res = {0};
            (void)kvr_index_remove(w->ing->ix, wid, w->pr_tier, &key, 1, &res);
            dropped++;
        }
    }
    if (dropped > 0) {
        KVR_CNT_OWN_ADD(w->st.pr_contradicted, dropped);
        publish_count(w);
    }
}

void kvr_ingest_predict_cleared(struct writer *w, uint32_t wid)
{
    drop_worker(w, wid, false);
}

void kvr_ingest_predict_evented(struct writer *w, uint32_t wid)
{
    struct kvr_index *ix = w->ing->ix;
    struct kvr_index_wres res = {0};
    uint8_t n = kvr_index_tier_count(ix);

    if (w->pr != NULL && kvr_assume_worker_count(w->pr, wid) > 0) {
        drop_worker(w, wid, true);
        return;
    }
    for (uint8_t t = 0; t < n; t++) {
        const char *name = kvr_index_tier_name(ix, t);
        if (name != NULL && strcmp(name, "predicted") == 0) {
            (void)kvr_index_clear(ix, wid, t, &res);
            return;
        }
    }
}

void kvr_ingest_predict_expire(struct writer *w)
{
    int64_t now, ttl;
    size_t k;

    if (w->pr == NULL || w->pr_next_expire == 0 || (now = kvr_now_ms()) < w->pr_next_expire)
        return;
    ttl = atomic_load_explicit(&w->ing->predict_ttl_ms, memory_order_relaxed);
    if (!ensure_scratch(w, PR_EXPIRE_BATCH))
        return;
    /* turned off (ttl 0): everything held expires now */
    while ((k = kvr_assume_expire(w->pr, ttl > 0 ? now - ttl : INT64_MAX, w->pr_pairs,
                                  PR_EXPIRE_BATCH)) > 0) {
        for (size_t i = 0; i < k; i++) { /* one remove per worker's run */
            struct kvr_index_wres res = {0};
            size_t j = i;
            while (j < k && w->pr_pairs[j].wid == w->pr_pairs[i].wid) {
                w->pr_keys[j - i] = w->pr_pairs[j].key;
                j++;
            }
            (void)kvr_index_remove(w->ing->ix, w->pr_pairs[i].wid, w->pr_tier, w->pr_keys,
                                   j - i, &res);
            i = j - 1;
        }
        KVR_CNT_OWN_ADD(w->st.pr_expired, k);
    }
    publish_count(w);
    plan_expiry(w, ttl > 0 ? ttl : 1);
}

int64_t kvr_ingest_predict_wait_ms(const struct writer *w)
{
    if (w->pr_next_expire == 0)
        return -1;
    int64_t d = w->pr_next_expire - kvr_now_ms();
    return d > 0 ? d : 0;
}

void kvr_ingest_predict_free(struct writer *w)
{
    kvr_assume_destroy(w->pr);
    w->pr = NULL;
    free(w->pr_keys);
    free(w->pr_pairs);
    free(w->pr_blocks);
    free(w->pr_new);
    w->pr_keys = NULL;
    w->pr_pairs = NULL;
    w->pr_blocks = NULL;
    w->pr_new = NULL;
    w->pr_cap = 0;
}
