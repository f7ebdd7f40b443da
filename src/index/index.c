/* index.c — the positional index (see index.h for the contract): create, destroy and the
 * statistics. This note is the map of the module; each index_<part>.c opens with the design
 * of its part, index_int.h holds the structures, the concurrency scheme and the lock order,
 * and docs/index.md the measurements (what each choice cost, what was tried and dropped).
 *
 * WHAT IT IS
 * Entries keyed by the chain hash of a prompt prefix (namespace and position folded in), each
 * with the sorted set of holders (worker, tier) that hold that block; per holder a reverse map
 * from the engine's block hash to the entry. Writers (one thread per worker) store, remove
 * and clear blocks; readers (any number, never locking) answer, per worker, how many leading
 * blocks of a query it holds.
 *
 * INVARIANTS (true at the end of every call)
 * - An entry exists iff a holder holds it; a holder holds an entry iff its reverse map has a
 *   live record for an engine hash mapping to it (membership = 1 + alias count).
 * - holes(H), the number of H's entries past position 0 whose parent entry H does not hold,
 *   is exact (index_write.c), so the positions of a query a hole-free holder holds are a
 *   prefix [0, tm) (the lemma in index_find.c) and find jumps instead of walking.
 * - No parked orphan's parent is known to its worker (index_write.c, ORPHANS).
 * - A node found under its shard's lock is alive; nothing a reader may still see is freed
 *   (epochs: index_ebr.c).
 * - A worker id in a holder set is that holder's published worker, or one forgotten since the
 *   reader's epoch began; ids, names and interning records of forgotten pods are freed and
 *   reused only after a grace period (index_intern.c, FORGETTING), so max_workers bounds
 *   the workers interned at one time, not ever.
 * - Memory follows contents: shard tables, maps and holder arrays shrink, emptied slab chunks
 *   are unmapped (but one spare), a writer call's cached nodes go back to the slab when it
 *   ends, and an idle index holds nothing for past contents.
 * Internal invariants are checked with KVR_ASSERT (on in release builds).
 *
 * FILES
 *   index_int.h     structures, atomics, spinlock, lock order, hot helpers (static inline)
 *   index_ebr.c     memory accounting, epoch-based reclamation
 *   index_slab.c    the node slab
 *   index_hset.c    the node lock, holder sets
 *   index_shard.c   the main table's shards; entries created and deleted
 *   index_maps.c    per-holder maps: the reverse map, counting maps
 *   index_intern.c  namespaces, workers, pods, tiers; forgetting pods, reusing their ids
 *   index_write.c   store, remove, clear, purge; holes; orphans
 *   index_find.c    readers and find: chain math, exact jump search
 *   index_dump.c    a worker's state dumped to a blob and restored exactly (snapshots)
 *
 * STATISTICS
 * Per slot (relaxed, owner-written) and summed when read; bytes are malloc_usable_size() of
 * everything this module allocates (slab chunks as whole 2 MB mappings, the spare and free
 * nodes included), added at malloc and removed at free (retired and cached memory counts
 * until it is really freed).
 */
#include "index/index_int.h"

/* ---- creation ---------------------------------------------------------------------------- */

int kvr_index_create(const struct kvr_index_opts *opts, struct kvr_index **out)
{
    struct kvr_index *ix;
    struct kvr_index_opts o = {0};

    if (out == NULL)
        return -EINVAL;
    if (opts != NULL)
        o = *opts;
    if (o.jump_stride == 0)
        o.jump_stride = 32;
    if (o.max_workers == 0)
        o.max_workers = 16384;
    if (o.max_query_blocks == 0)
        o.max_query_blocks = 65536;
    if (o.max_workers > (1u << 24) || o.max_query_blocks > (1u << 26) ||
        o.jump_stride > (1u << 20))
        return -EINVAL;

    ix = aligned_alloc(64, (sizeof(*ix) + 63) / 64 * 64);
    if (ix == NULL)
        return -ENOMEM;
    memset(ix, 0, sizeof(*ix));
    ix->o = o;
    ix->epoch = 1;
    ix->gbytes = usable(ix);
    pthread_mutex_init(&ix->imu, NULL);
    ix->sh = aligned_alloc(64, NSHARD * sizeof(struct shard));
    ix->tabw = g_calloc(ix, NSHARD * sizeof(*ix->tabw));
    ix->workers = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->workers));
    ix->pods = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->pods));
    ix->wslow = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->wslow));
    ix->wpod = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->wpod));
    ix->wgen = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->wgen));
    ix->wfree = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->wfree));
    ix->pfree = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->pfree));
    ix->pw = g_calloc(ix, ((size_t)o.jump_stride + 1) * sizeof(*ix->pw));
    if (ix->sh == NULL || ix->tabw == NULL || ix->workers == NULL || ix->pods == NULL ||
        ix->wslow == NULL || ix->wpod == NULL || ix->wgen == NULL || ix->wfree == NULL || ix->pfree == NULL ||
        ix->pw == NULL) {
        kvr_index_destroy(ix);
        return -ENOMEM;
    }
    __atomic_fetch_add(&ix->gbytes, usable(ix->sh), __ATOMIC_RELAXED);
    memset(ix->sh, 0, NSHARD * sizeof(struct shard));
    strcpy(ix->tier_names[KVR_TIER_GPU], "gpu");
    strcpy(ix->tier_names[KVR_TIER_CPU], "cpu");
    strcpy(ix->tier_names[KVR_TIER_STORAGE], "storage");
    ix->ntiers = 3;
    ix->pw[0] = 1;
    for (uint32_t i = 1; i <= o.jump_stride; i++)
        ix->pw[i] = ix->pw[i - 1] * KVR_HASH_CHAIN_MUL;
    *out = ix;
    return 0;
}

void kvr_index_destroy(struct kvr_index *ix)
{
    if (ix == NULL)
        return;
    /* Everything below is single-threaded by contract. Use a private slot for frees. */
    struct ebr_slot *s = &ix->slots[EBR_SLOTS - 1];
    if (ix->sh != NULL) {
        for (unsigned i = 0; i < NSHARD; i++) {
            struct table *t = ix->sh[i].tab;
            for (uint64_t k = 0; t != NULL && k <= t->mask; k++) {
                uint64_t v = t->slot[k];
                if (v == 0 || v == SLOT_TOMB)
                    continue;
                struct node *x = (struct node *)(uintptr_t)(v & PTR_MASK);
                if (x->n & N_EXT)
                    sl_free(s, (void *)(uintptr_t)x->h);
            }
            sl_free(s, t);
        }
        free(ix->sh);
    }
    free(ix->tabw);
    for (unsigned i = 0; i < EBR_SLOTS; i++) {
        struct ebr_slot *e = &ix->slots[i];
        for (size_t k = 0; k < e->nret; k++)
            if (!((uintptr_t)e->ret[k].p & RET_NODE)) /* nodes: in the slab's chunks */
                free(e->ret[k].p);
        free(e->ret);
    }
    while (ix->slab.all != NULL) {
        struct nchunk *c = ix->slab.all;
        ix->slab.all = c->anext;
        (void)munmap(c, NCHUNK);
    }
    if (ix->slab.spare != NULL)
        (void)munmap(ix->slab.spare, NCHUNK);
    for (uint32_t w = 0; ix->workers != NULL && w < ix->nworkers; w++) {
        struct worker *wk = ix->workers[w];
        if (wk == NULL) /* forgotten: its record is deferred (below) */
            continue;
        for (int t = 0; t < KVR_TIER_MAX; t++) {
            struct holder *hd = wk->h[t];
            if (hd == NULL)
                continue;
            free(hd->recs.s);
            free(hd->absent.s);
            free(hd->alias.s);
            free(hd->extra.s);
            free(hd);
        }
        free(wk->orph);
        free(wk->awaited.s);
        free(wk);
    }
    if (ix->wfree != NULL && ix->pfree != NULL)
        kvr_ix_dfr_free_all(ix);
    for (uint32_t p = 0; ix->pods != NULL && p < ix->npods; p++) {
        if (ix->pods[p] == NULL)
            continue;
        free(ix->pods[p]->name);
        free(ix->pods[p]->wids);
        free(ix->pods[p]);
    }
    for (uint32_t c = 0; c < NS_CHUNKS; c++)
        free(ix->ns_chunk[c]);
    kvr_ix_itab_free(ix, ix->ns_tab, 1);
    kvr_ix_itab_free(ix, ix->w_tab, 1);
    kvr_ix_itab_free(ix, ix->pod_tab, 1);
    free(ix->workers);
    free(ix->pods);
    free(ix->wslow);
    free(ix->wpod);
    free(ix->wgen);
    free(ix->wfree);
    free(ix->pfree);
    free(ix->pw);
    pthread_mutex_destroy(&ix->imu);
    free(ix);
}

/* ---- statistics ----------------------------------------------------------------------- */

void kvr_index_stats(struct kvr_index *ix, struct kvr_index_stats *st)
{
    int64_t bytes = __atomic_load_n(&ix->gbytes, __ATOMIC_RELAXED), entries = 0, pairs = 0,
            orph = 0;
    for (unsigned i = 0; i < EBR_SLOTS; i++) {
        bytes += LD(ix->slots[i].bytes);
        entries += LD(ix->slots[i].entries);
        pairs += LD(ix->slots[i].pairs);
        orph += LD(ix->slots[i].orphans);
    }
    st->entries = entries > 0 ? (uint64_t)entries : 0;
    st->holders = pairs > 0 ? (uint64_t)pairs : 0;
    st->bytes = bytes > 0 ? (uint64_t)bytes : 0;
    st->workers = LDA(ix->nlive);
    st->namespaces = LDA(ix->nns);
    st->orphans = orph > 0 ? (uint64_t)orph : 0;
}

uint64_t kvr_index_bytes(const struct kvr_index *ix)
{
    /* slots above the high-water mark were never claimed: their bytes are 0 */
    uint32_t n = __atomic_load_n(&ix->nslots, __ATOMIC_RELAXED);
    int64_t bytes = __atomic_load_n(&ix->gbytes, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < n && i < EBR_SLOTS; i++)
        bytes += LD(ix->slots[i].bytes);
    return bytes > 0 ? (uint64_t)bytes : 0;
}

void kvr_index_worker_blocks(struct kvr_index *ix, uint32_t wid, uint64_t blocks[KVR_TIER_MAX])
{
    memset(blocks, 0, KVR_TIER_MAX * sizeof(uint64_t));
    if (wid >= LDA(ix->nworkers))
        return;
    /* inside an epoch: a worker forgotten meanwhile is freed only after it */
    struct ebr_slot *s = kvr_ix_slot_claim(ix, 0);
    ebr_enter(ix, s);
    struct worker *w = worker_get(ix, wid);
    for (int t = 0; w != NULL && t < KVR_TIER_MAX; t++) {
        struct holder *h = LDA(w->h[t]);
        if (h != NULL)
            blocks[t] = LD(h->blocks);
    }
    ebr_exit(s);
    slot_release(s);
}

uint32_t kvr_index_worker_orphans(const struct kvr_index *cix, uint32_t wid)
{
    struct kvr_index *ix = (struct kvr_index *)cix; /* an epoch slot is claimed, nothing changed */
    uint32_t n = 0;
    if (wid >= LDA(ix->nworkers))
        return 0;
    struct ebr_slot *s = kvr_ix_slot_claim(ix, 0);
    ebr_enter(ix, s);
    struct worker *w = worker_get(ix, wid);
    if (w != NULL)
        n = LD(w->porph);
    ebr_exit(s);
    slot_release(s);
    return n;
}
