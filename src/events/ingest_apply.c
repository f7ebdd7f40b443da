/* ingest_apply.c — turning one decoded batch into index calls: namespaces (model, LoRA),
 * tiers, block sizes, content hashes, coalesced removals, hybrid-model group filtering,
 * AllBlocksCleared; every skip counted with its reason.
 *
 * Why its own file: this is the "events → index" half of a writer, with its own rules
 * (documented per function below and in docs/ingest.md) and no business with queues,
 * sequence numbers or replays, which stay in ingest.c. Runs only on the writer thread that
 * owns the stream (w); touches w's caches and counters and the stream's group masks.
 *
 * THE MEMORY CAP ([index] max_memory, docs/operations.md "Memory cap")
 * Before a BlockStored reaches the index, the writer compares the index's bytes
 * (kvr_index_bytes: a sum over the few epoch slots in use, ~3 ns) plus an estimate of the
 * store (BUDGET_PAIR_BYTES a block) with the cap; over it, the event is skipped with reason
 * over_budget and its blocks counted. Everything else applies: removals and clears free
 * memory, and an orphan parked is a store like any other (refused). The check is per event
 * and per writer, not a reservation: writers check concurrently and the index grows in steps
 * (a 2 MiB node chunk, a holder's reverse map doubling), so the index can pass the cap by
 * about one such step per writer; bench/budget.sh measures it.
 * A stream that had a store refused misses blocks its engine holds (and, after them, their
 * children, which come back parked as orphans): it reads over_budget. Being back under the
 * cap does not bring the refused blocks back, so the state stays until the worker is emptied
 * and the index misses nothing again, the rules that resync an unsynced stream:
 * AllBlocksCleared (here), an engine restart or a purge (kvr_ingest_clear_worker), or a new
 * baseline after the pod was forgotten (a batch applied without a previous one). A replay
 * cannot help: the refused batches were applied, so no gap is seen to replay.
 *
 * EXTRA KEYS, TIERS, REMAINING COUNTS (docs/wire-extra-keys.md)
 * A block stored with extra keys (media, cache_salt, prompt embeddings) gets the content hash
 * folded with them through hash.h, as score folds a query's; an event-level salt (SGLang)
 * keys the request's first block, so it is folded into blocks[0] of an event without a
 * parent. Tiers: locality REMOTE → the "remote" tier (both events); SGLang's mediums are
 * aliased onto ours (CPU_PINNED, CPU_TIER1, CPU_TIER2 → cpu; DISK → storage; EXTERNAL keeps
 * its own "external" tier). A BlockRemoved with remaining_copy_counts sets the holder's copies
 * of each hash to that count (removing the difference) instead of removing one copy: a
 * producer that reports only the last copy's removal cannot leave entries behind.
 */
#include "events/ingest_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "index/hash.h"

/* Bytes a (holder, block) pair costs the index, with its reverse-map record: 63.3 in
 * bench/index.sh, 31-68 fresh and ~100 under LRU churn in bench/budget.sh (docs/operations.md
 * "Memory cap"); a store of n blocks is refused when bytes + n × this would pass the cap. Only an
 * estimate of the next step: what the index really allocates is what is compared. */
#define BUDGET_PAIR_BYTES 64u

void kvr_ingest_budget_init(struct kvr_ingest *ing)
{
    atomic_init(&ing->max_memory,
                ing->conf->max_memory > 0 ? (uint64_t)ing->conf->max_memory : 0);
    /* one warning per interval: the message carries the running count */
    kvr_ratelimit_init(&ing->rl_budget, ing->conf->log_ratelimit_ms, 1);
}

void kvr_ingest_set_max_memory(struct kvr_ingest *ing, uint64_t bytes)
{
    atomic_store_explicit(&ing->max_memory, bytes, memory_order_relaxed);
}

uint64_t kvr_ingest_max_memory(const struct kvr_ingest *ing)
{
    return atomic_load_explicit(&ing->max_memory, memory_order_relaxed);
}

static void set_over_budget(struct ing_stream *s, bool v)
{
    if (s->over_budget == v)
        return;
    s->over_budget = v;
    atomic_store_explicit(&s->p_over_budget, v, memory_order_relaxed);
}

static void add_wres(struct writer *w, const struct kvr_index_wres *r)
{
    if (r->stored)
        KVR_CNT_OWN_ADD(w->st.stored, r->stored);
    if (r->duplicates)
        KVR_CNT_OWN_ADD(w->st.dup_blocks, r->duplicates);
    if (r->orphaned)
        KVR_CNT_OWN_ADD(w->st.orphaned, r->orphaned);
    if (r->orphans_adopted)
        KVR_CNT_OWN_ADD(w->st.adopted, r->orphans_adopted);
    if (r->orphans_dropped)
        KVR_CNT_OWN_ADD(w->st.orphans_dropped, r->orphans_dropped);
    if (r->removed)
        KVR_CNT_OWN_ADD(w->st.removed, r->removed);
    if (r->unknown_removes)
        KVR_CNT_OWN_ADD(w->st.unknown_removes, r->unknown_removes);
}

/* SGLang's StorageMedium names (and its older CPU tiers) onto our tiers. */
static void tier_alias(const char **medium, size_t *len)
{
    static const struct {
        const char *from, *to;
    } alias[] = {{"CPU_PINNED", "cpu"}, {"CPU_TIER1", "cpu"}, {"CPU_TIER2", "cpu"},
                 {"DISK", "storage"}};
    for (size_t i = 0; i < sizeof(alias) / sizeof(alias[0]); i++) {
        size_t n = strlen(alias[i].from);
        if (*len == n && strncasecmp(*medium, alias[i].from, n) == 0) {
            *medium = alias[i].to;
            *len = strlen(alias[i].to);
            return;
        }
    }
}

static int tier_of(struct writer *w, const char *medium, size_t len, uint8_t *tier)
{
    int rc;

    if (medium == NULL || len == 0) {
        *tier = KVR_TIER_GPU;
        return 0;
    }
    tier_alias(&medium, &len);
    for (unsigned i = 0; i < w->ntiers; i++) {
        if (w->tiers[i].len == len && memcmp(w->tiers[i].s, medium, len) == 0) {
            *tier = w->tiers[i].tier;
            return 0;
        }
    }
    rc = kvr_index_tier_intern(w->ing->ix, medium, len, tier);
    if (rc != 0)
        return rc;
    if (len < sizeof(w->tiers[0].s)) {
        unsigned slot = w->ntiers < TIER_CACHE ? w->ntiers++ : (unsigned)(len % TIER_CACHE);
        memcpy(w->tiers[slot].s, medium, len);
        w->tiers[slot].len = (uint8_t)len;
        w->tiers[slot].tier = *tier;
    }
    return 0;
}

/* Namespace of (topic model, LoRA): lora_name, or the legacy lora_id as a decimal string. */
static int ns_of(struct writer *w, struct ing_topic *it, const struct kvr_event *ev, uint32_t *ns,
                 uint64_t *seed)
{
    char idbuf[24];
    const char *lora = NULL;
    size_t len = 0;
    struct lora_slot *sl;
    char name[KVR_NAME_MAX];
    int rc;

    if (ev->lora_name != NULL && ev->lora_name_len > 0) {
        lora = ev->lora_name;
        len = ev->lora_name_len;
    } else if (ev->has_lora_id) {
        len = (size_t)snprintf(idbuf, sizeof(idbuf), "%" PRId64, ev->lora_id);
        lora = idbuf;
    }
    if (lora == NULL) {
        if (!it->base_ok) {
            rc = kvr_index_ns_intern(w->ing->ix, it->t->model, NULL, &it->base_ns,
                                     &it->base_seed);
            if (rc != 0)
                return rc;
            it->base_ok = true;
        }
        *ns = it->base_ns;
        *seed = it->base_seed;
        return 0;
    }
    if (len >= KVR_NAME_MAX || memchr(lora, '\0', len) != NULL)
        return -EINVAL;
    for (unsigned i = 0; i < LORA_CACHE; i++) {
        sl = &it->lora[i];
        if (sl->used && sl->len == len && memcmp(sl->name, lora, len) == 0) {
            *ns = sl->ns;
            *seed = sl->seed;
            return 0;
        }
    }
    memcpy(name, lora, len);
    name[len] = '\0';
    rc = kvr_index_ns_intern(w->ing->ix, it->t->model, name, ns, seed);
    if (rc != 0)
        return rc;
    sl = &it->lora[it->lora_next++ % LORA_CACHE];
    sl->used = true;
    sl->len = (uint8_t)len;
    memcpy(sl->name, lora, len);
    sl->ns = *ns;
    sl->seed = *seed;
    return 0;
}

/* The event's tier: its medium's, or "remote" for blocks held at another location. */
static int ev_tier(struct writer *w, const struct kvr_event *ev, uint8_t *tier)
{
    if (ev->remote)
        return tier_of(w, "remote", 6, tier);
    return tier_of(w, ev->medium, ev->medium_len, tier);
}

/* Folds one extra key into a content hash, as score folds a query's (hash.h). */
static uint64_t fold_xkey(uint64_t h, const struct kvr_xkey *k)
{
    switch (k->kind) {
    case KVR_XK_STR: return kvr_hash_xk_str(h, k->s, k->len);
    case KVR_XK_MEDIA: return kvr_hash_xk_media(h, k->s, k->len, k->i);
    case KVR_XK_BYTES: return kvr_hash_xk_bytes(h, k->s, k->len);
    case KVR_XK_INT: return kvr_hash_xk_int(h, k->i);
    default: return kvr_hash_xk_other(h);
    }
}

static bool ensure_scratch(struct writer *w, size_t n)
{
    size_t nc;
    uint64_t *c;
    struct kvr_index_block *b;

    if (n <= w->capblocks)
        return true;
    nc = w->capblocks ? w->capblocks : 256;
    while (nc < n)
        nc *= 2;
    c = realloc(w->content, nc * sizeof(*c));
    if (c == NULL)
        return false;
    w->content = c;
    b = realloc(w->blocks, nc * sizeof(*b));
    if (b == NULL)
        return false;
    w->blocks = b;
    w->capblocks = nc;
    return true;
}

static void skip(struct writer *w, struct ing_stream *s, int reason)
{
    KVR_CNT_OWN_INC(w->st.skipped[reason]);
    if (reason != KVR_SKIP_GROUP)
        kvr_log_limited(&w->ing->rl_bad, KVR_LOG_WARN, "events: skipped an event from %s/%u: %s",
                        s->it->t->pod, s->dp_rank, kvr_ingest_skip_name(reason));
}

/* True (and counted, warned, the stream marked) when a store of n blocks must be refused. */
static bool refuse_store(struct writer *w, struct ing_stream *s, size_t n)
{
    struct kvr_ingest *ing = w->ing;
    uint64_t cap = atomic_load_explicit(&ing->max_memory, memory_order_relaxed), bytes;

    if (cap == 0)
        return false;
    bytes = kvr_index_bytes(ing->ix);
    if (bytes < cap && (uint64_t)n <= (cap - bytes) / BUDGET_PAIR_BYTES)
        return false;
    KVR_CNT_OWN_INC(w->st.skipped[SKIP_OVER_BUDGET]);
    KVR_CNT_OWN_ADD(w->st.budget_blocks, n);
    set_over_budget(s, true);
    kvr_log_limited(&ing->rl_budget, KVR_LOG_WARN,
                    "index: %" PRIu64 " bytes, at [index] max_memory (%" PRIu64 "): new blocks "
                    "are not indexed (%s/%u and others; see events_skipped_total{reason="
                    "\"over_budget\"}); their streams read over_budget until they resync",
                    bytes, cap, s->it->t->pod, s->dp_rank);
    return true;
}

static void apply_stored(struct writer *w, struct ing_stream *s, const struct kvr_event *ev)
{
    struct kvr_index *ix = w->ing->ix;
    struct kvr_index_wres res = {0};
    uint32_t ns, bs, learned;
    uint64_t seed;
    uint8_t tier;
    size_t n = ev->nhashes;

    if (ns_of(w, s->it, ev, &ns, &seed) != 0) {
        skip(w, s, SKIP_NAMESPACE);
        return;
    }
    learned = kvr_index_ns_block_size(ix, ns);
    bs = ev->block_size;
    if (bs == 0) {
        bs = learned;
        if (bs == 0) {
            skip(w, s, SKIP_NO_BLOCK_SIZE);
            return;
        }
    } else if (learned == 0) {
        kvr_index_ns_set_block_size(ix, ns, bs);
        kvr_log_info("events: model %s: block size %u learned from %s", s->it->t->model, bs,
                     s->it->t->pod);
    } else if (bs != learned) {
        /* Content hashes at another granularity would never match queries chunked at the
         * learned size (hybrid partial entries, misconfigured engines). */
        skip(w, s, SKIP_BLOCK_SIZE_MISMATCH);
        return;
    }
    if (n == 0)
        return;
    if ((uint64_t)ev->ntokens != (uint64_t)n * bs) {
        skip(w, s, KVR_SKIP_TOKEN_COUNT);
        return;
    }
    if (ev_tier(w, ev, &tier) != 0) {
        skip(w, s, SKIP_TIER);
        return;
    }
    if (refuse_store(w, s, n))
        return;
    if (!ensure_scratch(w, n)) {
        skip(w, s, SKIP_INDEX);
        return;
    }
    kvr_hash_blocks(seed, ev->tokens, n, bs, w->content);
    if (ev->xkeys != NULL)
        for (size_t i = 0; i < n; i++)
            for (uint32_t k = ev->xk_first[i]; k < ev->xk_first[i + 1]; k++)
                w->content[i] = fold_xkey(w->content[i], &ev->xkeys[k]);
    if (ev->salt != NULL && !ev->has_parent)
        w->content[0] = kvr_hash_xk_str(w->content[0], ev->salt, ev->salt_len);
    for (size_t i = 0; i < n; i++) {
        w->blocks[i].engine_hash = ev->hashes[i];
        w->blocks[i].content_hash = w->content[i];
    }
    if (kvr_index_store(ix, s->wid, tier, ns, ev->has_parent ? &ev->parent : NULL, w->blocks, n,
                        &res) != 0) {
        skip(w, s, SKIP_INDEX);
    } else {
        kvr_ingest_predict_stored(w, s->wid, tier, ev->hashes, n); /* confirmations */
        if (w->ing->store_hook != NULL)
            w->ing->store_hook(w->ing->store_hook_arg, s->it->t->pod, s->dp_rank, w->content,
                               n);
    }
    add_wres(w, &res);
}

void kvr_ingest_set_store_hook(struct kvr_ingest *ing, kvr_ingest_store_hook fn, void *arg)
{
    ing->store_hook = fn;
    ing->store_hook_arg = arg;
}

/* Consecutive BlockRemoved events of one tier (vLLM sends one per evicted block, usually many
 * in a row) are applied with one kvr_index_remove() call: same result as one call per event
 * (the index processes the hashes in order), without the per-call overhead. Any other event
 * flushes first, so the batch's order is kept. */
static void flush_removed(struct writer *w, struct ing_stream *s)
{
    struct kvr_index_wres res = {0};

    if (w->nrm == 0)
        return;
    kvr_ingest_predict_removing(w, s->wid, w->rm_tier, w->rm, w->nrm);
    if (kvr_index_remove(w->ing->ix, s->wid, w->rm_tier, w->rm, w->nrm, &res) != 0)
        skip(w, s, SKIP_INDEX);
    add_wres(w, &res);
    w->nrm = 0;
}

static void learn_group(struct ing_stream *s, int32_t g, bool full)
{
    if (g >= 0 && g < 64) {
        if (full)
            s->groups_full |= 1ull << g;
        else
            s->groups_other |= 1ull << g;
    }
}

/* Hybrid models announce the same token range once per KV-cache group, with the same hashes
 * when block sizes match; only full-attention groups are indexed. BlockRemoved carries no
 * kind, so a removal is applied when its group was seen storing full-attention blocks, or is
 * group 0 not known as another kind (pre-HMA engines have only group 0). A block is always
 * stored before it is removed, so the group of an indexed block is known by then. */
static bool removal_indexed(const struct ing_stream *s, int32_t g)
{
    if (g < 0 || g >= 64)
        return false;
    if (s->groups_full & (1ull << g))
        return true;
    return g == 0 && !(s->groups_other & 1ull);
}

/* remaining_copy_counts: each hash keeps exactly that many copies (more are never made up:
 * a store we missed cannot be rebuilt from a count). A count for a hash the holder does not
 * have is an unknown removal, as without counts. */
static void apply_remaining(struct writer *w, struct ing_stream *s, const struct kvr_event *ev,
                            uint8_t tier)
{
    struct kvr_index_wres res = {0};

    flush_removed(w, s); /* the copies read below must include every earlier removal */
    for (size_t i = 0; i < ev->nhashes; i++) {
        uint32_t have = kvr_index_copies(w->ing->ix, s->wid, tier, ev->hashes[i]);
        uint32_t drop = have == 0 ? 1 : have > ev->remaining[i] ? have - ev->remaining[i] : 0;
        if (ev->remaining[i] == 0 && have > 0)
            kvr_ingest_predict_removing(w, s->wid, tier, &ev->hashes[i], 1);
        for (uint32_t k = 0; k < drop; k++)
            if (kvr_index_remove(w->ing->ix, s->wid, tier, &ev->hashes[i], 1, &res) != 0)
                skip(w, s, SKIP_INDEX);
    }
    add_wres(w, &res);
}

static void apply_removed(struct writer *w, struct ing_stream *s, const struct kvr_event *ev)
{
    uint8_t tier;

    if (!removal_indexed(s, ev->group_idx)) {
        skip(w, s, KVR_SKIP_GROUP);
        return;
    }
    if (ev->nhashes == 0)
        return;
    if (ev_tier(w, ev, &tier) != 0) {
        skip(w, s, SKIP_TIER);
        return;
    }
    if (ev->remaining != NULL) {
        apply_remaining(w, s, ev, tier);
        return;
    }
    if (w->nrm > 0 && tier != w->rm_tier)
        flush_removed(w, s);
    if (w->nrm + ev->nhashes > w->caprm) {
        size_t nc = w->caprm ? w->caprm : 256;
        uint64_t *p;
        while (nc < w->nrm + ev->nhashes)
            nc *= 2;
        p = realloc(w->rm, nc * sizeof(*p));
        if (p == NULL) {
            struct kvr_index_wres res = {0};
            flush_removed(w, s);
            kvr_ingest_predict_removing(w, s->wid, tier, ev->hashes, ev->nhashes);
            if (kvr_index_remove(w->ing->ix, s->wid, tier, ev->hashes, ev->nhashes, &res) != 0)
                skip(w, s, SKIP_INDEX);
            add_wres(w, &res);
            return;
        }
        w->rm = p;
        w->caprm = nc;
    }
    memcpy(w->rm + w->nrm, ev->hashes, ev->nhashes * sizeof(*ev->hashes));
    w->nrm += ev->nhashes;
    w->rm_tier = tier;
}

void kvr_ingest_clear_worker(struct writer *w, struct ing_stream *s, _Atomic uint64_t *counter)
{
    struct kvr_index_wres res = {0};

    set_over_budget(s, false); /* emptied: the index misses nothing of it any more */
    if (s->wid == NO_WID) /* forgotten: nothing held (and the id may be another's now) */
        return;
    kvr_index_clear(w->ing->ix, s->wid, -1, &res);
    kvr_ingest_predict_cleared(w, s->wid); /* the clear took its predicted tier too */
    KVR_CNT_OWN_ADD(*counter, res.cleared);
}

/* Applies the events of the batch currently open in the decoder. */
void kvr_ingest_apply_batch(struct writer *w, struct ing_stream *s)
{
    struct kvr_event ev;
    enum kvr_skip_reason reason;
    int r;

    /* A batch without a previous one (a new baseline): the worker was emptied before it
     * (purged, forgotten) or never held anything. */
    if (!s->sm.has_last)
        set_over_budget(s, false);
    while ((r = kvr_decode_next(w->dec, &ev, &reason)) != 0) {
        if (r == 2) {
            if (reason == KVR_SKIP_GROUP && ev.type == KVR_EV_STORED)
                learn_group(s, ev.group_idx, false);
            skip(w, s, reason < KVR_SKIP_REASON_COUNT ? (int)reason : KVR_SKIP_NOT_EVENT);
            continue;
        }
        if (ev.type != KVR_EV_REMOVED)
            flush_removed(w, s);
        switch (ev.type) {
        case KVR_EV_STORED:
            KVR_CNT_OWN_INC(w->st.events[KVR_EV_STORED]);
            learn_group(s, ev.group_idx, true);
            apply_stored(w, s, &ev);
            break;
        case KVR_EV_REMOVED:
            KVR_CNT_OWN_INC(w->st.events[KVR_EV_REMOVED]);
            apply_removed(w, s, &ev);
            break;
        case KVR_EV_CLEARED:
            KVR_CNT_OWN_INC(w->st.events[KVR_EV_CLEARED]);
            kvr_ingest_clear_worker(w, s, &w->st.cleared);
            kvr_stream_cleared(&s->sm);
            break;
        default:
            skip(w, s, KVR_SKIP_UNKNOWN_TAG);
            break;
        }
    }
    flush_removed(w, s);
}

