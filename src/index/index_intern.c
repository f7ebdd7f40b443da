/* index_intern.c — interning: namespaces (model, LoRA), workers (pod, dp rank), pods and
 * tiers get the small dense ids the index and its callers work with.
 *
 * Inserts and removals take one mutex (ix->imu; it may allocate under it and takes no other
 * lock: lock order in index_int.h); lookups are lock-free over immutable records in
 * open-addressing tables. A record, a worker or a namespace chunk is complete before its
 * pointer or count is published with a release store.
 *
 * FORGETTING (kvr_index_pod_forget; namespaces and tiers are never forgotten)
 * Pods come and go (Kubernetes pod IPs churn), so worker and pod ids are recycled; max_workers
 * bounds the workers interned at one time, not ever. Readers never lock, so a recycled id must
 * never let a reader attribute one pod's blocks to another:
 * 1. The pod's writer clears every worker of the pod (as purge), so no holder set holds the
 *    workers' holder ids any more.
 * 2. Under imu the keys are removed from the worker and pod tables (a tombstone: lock-free
 *    lookups probe past it, a table rebuild drops it; the removed record stays readable), the
 *    worker and pod records are unpublished (ix->workers[wid] = ix->pods[pid] = NULL), and
 *    records, removed keys and ids are queued (struct dfr) with the epoch read after those
 *    stores (a full barrier: an atomic read-modify-write).
 * 3. An entry is freed, and its id pushed on the free list, only once the global epoch is two
 *    past its own (the same rule as the epoch-based reclamation of index_ebr.c): by then every
 *    reader that could have seen the old holder ids in a holder set, or the old record in
 *    ix->workers, has left its critical section. A reused id is written (wpod, the record)
 *    before it is published, after that grace; so a reader sees a wid in a holder set only
 *    while ix->workers[wid] is that holder's record or NULL (forgotten meanwhile: find drops
 *    the hit), and find names each hit from the record inside its critical section, copying
 *    the name into the reader (struct kvr_index_hit.pod), never by a later lookup. A reader
 *    keeps those copies per worker id with the id's generation (ix->wgen: even while
 *    published, odd once forgotten, advanced before each publication), so a worker's name is
 *    copied once per generation, not per hit.
 * 4. Interning takes a free id first, then a never-used one; when neither is left but
 *    forgotten ids are still in their grace period, it advances the epoch itself and yields
 *    until they are ripe (readers' and writers' critical sections are one bounded call), so a
 *    new worker is refused (-ENOSPC) only when max_workers workers are really interned.
 * Replaced worker and pod tables and removed keys go the same way (they were kept until
 * destroy before forgetting existed), so memory follows the pods interned now, not every pod
 * ever seen; hence lookups of those two tables run inside an epoch (a writer slot claimed
 * for the lookup, itab_lookup). The namespace table is never removed from and keeps its
 * replaced versions until destroy, as before (its lookups, once per score, take no epoch).
 * A pod id looked up outside a find (score's pod filter) may name a pod forgotten since;
 * after a grace period its id may belong to another pod, whose hits then carry that pod's
 * own name (never the forgotten one's).
 */
#include "index/index_int.h"

static uint64_t str_hash(const void *p, size_t n)
{
    return kvr_hash_ns_seed(p, n, NULL, 0);
}

static int itab_find(const struct itab *t, const void *key, uint32_t len, uint64_t h,
                     uint32_t *id)
{
    if (t == NULL)
        return -ENOENT;
    uint32_t i = (uint32_t)h & t->mask;
    for (;;) {
        const struct irec *r = LDA(t->slot[i]);
        if (r == NULL)
            return -ENOENT;
        if (r != IREC_TOMB && r->h == h && r->len == len && memcmp(r->s, key, len) == 0) {
            *id = r->id;
            return 0;
        }
        i = (i + 1) & t->mask;
    }
}

static void dfr_push(struct kvr_index *ix, void *p, uint32_t kind, uint32_t id);

/* Under imu. A full table (records and tombstones) is rebuilt at twice its live records'
 * needs; the replaced one is deferred (a lookup may still walk it), or, for the namespace
 * table (never forgotten from; its lookups, on every score, take no epoch), kept until
 * destroy as before (at most the size of the newest). */
static int itab_add(struct kvr_index *ix, struct itab **tp, const void *key, uint32_t len,
                    uint64_t h, uint32_t id, struct irec **out)
{
    int keep_old = tp == &ix->ns_tab;
    struct itab *t = *tp;
    if (t == NULL || (t->n + 1) * 2 > t->mask + 1) {
        uint32_t live = t ? t->n - t->ntomb : 0, cap = 64;
        while ((live + 1) * 4 > cap)
            cap *= 2;
        struct itab *nt = g_calloc(ix, sizeof(*nt) + cap * sizeof(struct irec *));
        if (nt == NULL)
            return -ENOMEM;
        nt->mask = cap - 1;
        for (uint32_t i = 0; t != NULL && i <= t->mask; i++) {
            struct irec *r = t->slot[i];
            if (r == NULL || r == IREC_TOMB)
                continue;
            uint32_t j = (uint32_t)r->h & nt->mask;
            while (nt->slot[j] != NULL)
                j = (j + 1) & nt->mask;
            nt->slot[j] = r;
        }
        nt->n = live;
        if (keep_old)
            nt->old = t;
        STR(*tp, nt);
        if (t != NULL && !keep_old)
            dfr_push(ix, t, DFR_FREE, 0);
        t = nt;
    }
    struct irec *r = g_calloc(ix, sizeof(*r) + len + 1);
    if (r == NULL)
        return -ENOMEM;
    r->h = h;
    r->id = id;
    r->len = len;
    memcpy(r->s, key, len);
    if (out != NULL)
        *out = r;
    uint32_t i = (uint32_t)h & t->mask;
    while (t->slot[i] != NULL)
        i = (i + 1) & t->mask;
    STR(t->slot[i], r);
    t->n++;
    return 0;
}

/* A lock-free lookup in the worker or pod table: inside an epoch, as their records and
 * replaced tables are freed after a grace period (FORGETTING). */
static int itab_lookup(struct kvr_index *ix, struct itab *const *tp, const void *key,
                       uint32_t len, uint64_t h, uint32_t *id)
{
    struct ebr_slot *s = kvr_ix_slot_claim(ix, 0);
    ebr_enter(ix, s);
    int rc = itab_find(LDA(*tp), key, len, h, id);
    ebr_exit(s);
    slot_release(s);
    return rc;
}

/* Under imu: removes key (a tombstone) and defers its record. */
static void itab_del(struct kvr_index *ix, struct itab *t, const void *key, uint32_t len,
                     uint64_t h)
{
    if (t == NULL)
        return;
    for (uint32_t i = (uint32_t)h & t->mask;; i = (i + 1) & t->mask) {
        struct irec *r = t->slot[i];
        if (r == NULL)
            return;
        if (r != IREC_TOMB && r->h == h && r->len == len && memcmp(r->s, key, len) == 0) {
            STR(t->slot[i], IREC_TOMB);
            t->ntomb++;
            dfr_push(ix, r, DFR_FREE, 0);
            return;
        }
    }
}

/* key = model \0 (lora ? 1 lora : 0) */
static int ns_key(const char *model, const char *lora, char *buf, uint32_t *len)
{
    if (model == NULL)
        return -EINVAL;
    size_t ml = strlen(model), ll = lora ? strlen(lora) : 0;
    if (ml > KVR_NAME_MAX || ll > KVR_NAME_MAX)
        return -EINVAL;
    memcpy(buf, model, ml);
    buf[ml] = 0;
    buf[ml + 1] = ll ? 1 : 0;
    memcpy(buf + ml + 2, lora ? lora : "", ll);
    *len = (uint32_t)(ml + 2 + ll);
    return 0;
}

static struct nsrec *ns_rec(struct kvr_index *ix, uint32_t ns)
{
    struct nsrec *c = LDA(ix->ns_chunk[ns / NS_CHUNK]);
    return c ? &c[ns % NS_CHUNK] : NULL;
}

int kvr_index_ns_lookup(struct kvr_index *ix, const char *model, const char *lora,
                        uint32_t *ns, uint64_t *seed)
{
    char key[2 * KVR_NAME_MAX + 2];
    uint32_t len, id;
    int rc = ns_key(model, lora, key, &len);
    if (rc < 0)
        return rc;
    rc = itab_find(LDA(ix->ns_tab), key, len, str_hash(key, len), &id);
    if (rc < 0)
        return rc;
    if (ns)
        *ns = id;
    if (seed)
        *seed = ns_rec(ix, id)->seed;
    return 0;
}

int kvr_index_ns_intern(struct kvr_index *ix, const char *model, const char *lora,
                        uint32_t *ns, uint64_t *seed)
{
    char key[2 * KVR_NAME_MAX + 2];
    uint32_t len, id;
    int rc = ns_key(model, lora, key, &len);
    if (rc < 0)
        return rc;
    uint64_t h = str_hash(key, len);
    if (itab_find(LDA(ix->ns_tab), key, len, h, &id) == 0)
        goto found;
    pthread_mutex_lock(&ix->imu);
    if (itab_find(ix->ns_tab, key, len, h, &id) == 0) {
        pthread_mutex_unlock(&ix->imu);
        goto found;
    }
    id = ix->nns;
    if (id >= NS_CHUNK * NS_CHUNKS) {
        pthread_mutex_unlock(&ix->imu);
        return -ENOSPC;
    }
    if (ix->ns_chunk[id / NS_CHUNK] == NULL) {
        struct nsrec *c = g_calloc(ix, NS_CHUNK * sizeof(*c));
        if (c == NULL) {
            pthread_mutex_unlock(&ix->imu);
            return -ENOMEM;
        }
        STR(ix->ns_chunk[id / NS_CHUNK], c);
    }
    struct nsrec *r = ns_rec(ix, id);
    r->seed = kvr_hash_ns_seed(model, strlen(model), lora, lora ? strlen(lora) : 0);
    struct irec *rec = NULL;
    rc = itab_add(ix, &ix->ns_tab, key, len, h, id, &rec);
    if (rc == 0) {
        r->key = rec->s;
        STR(ix->nns, id + 1);
    }
    pthread_mutex_unlock(&ix->imu);
    if (rc < 0)
        return rc;
found:
    if (ns)
        *ns = id;
    if (seed)
        *seed = ns_rec(ix, id)->seed;
    return 0;
}

void kvr_index_ns_set_block_size(struct kvr_index *ix, uint32_t ns, uint32_t block_size)
{
    if (ns < LDA(ix->nns))
        STR(ns_rec(ix, ns)->block_size, block_size);
}

uint32_t kvr_index_ns_block_size(struct kvr_index *ix, uint32_t ns)
{
    if (ns >= LDA(ix->nns))
        return 0;
    return LDA(ns_rec(ix, ns)->block_size);
}

uint32_t kvr_index_ns_count(const struct kvr_index *ix)
{
    return LDA(ix->nns);
}

int kvr_index_ns_names(const struct kvr_index *ix, uint32_t ns, const char **model,
                       const char **lora)
{
    if (ns >= LDA(ix->nns))
        return -ENOENT;
    const struct nsrec *c = LDA(ix->ns_chunk[ns / NS_CHUNK]);
    const char *k = c[ns % NS_CHUNK].key; /* key = model \0 (lora ? 1 lora : 0) */
    size_t ml = strlen(k);
    if (model != NULL)
        *model = k;
    if (lora != NULL)
        *lora = k[ml + 1] ? k + ml + 2 : NULL;
    return 0;
}

static int worker_key(const char *pod, uint32_t rank, char *buf, uint32_t *len)
{
    if (pod == NULL)
        return -EINVAL;
    size_t pl = strlen(pod);
    if (pl == 0 || pl > KVR_NAME_MAX)
        return -EINVAL;
    memcpy(buf, pod, pl);
    buf[pl] = 0;
    for (int i = 0; i < 4; i++)
        buf[pl + 1 + i] = (char)(rank >> (8 * i));
    *len = (uint32_t)pl + 5;
    return 0;
}

int kvr_index_worker_lookup(struct kvr_index *ix, const char *pod, uint32_t dp_rank,
                            uint32_t *wid)
{
    char key[KVR_NAME_MAX + 8];
    uint32_t len, id;
    int rc = worker_key(pod, dp_rank, key, &len);
    if (rc < 0)
        return rc;
    rc = itab_lookup(ix, &ix->w_tab, key, len, str_hash(key, len), &id);
    if (rc == 0 && wid)
        *wid = id;
    return rc;
}

int kvr_index_pod_lookup(struct kvr_index *ix, const char *pod, uint32_t *pod_id)
{
    uint32_t id;
    if (pod == NULL)
        return -EINVAL;
    size_t pl = strlen(pod);
    if (pl == 0 || pl > KVR_NAME_MAX)
        return -EINVAL;
    int rc = itab_lookup(ix, &ix->pod_tab, pod, (uint32_t)pl, str_hash(pod, pl), &id);
    if (rc == 0 && pod_id)
        *pod_id = id;
    return rc;
}

/* ---- forgetting: deferred frees and free ids (under imu) ------------------------------- */

static void dfr_push(struct kvr_index *ix, void *p, uint32_t kind, uint32_t id)
{
    if (ix->ndfr == ix->capdfr) {
        size_t nc = ix->capdfr ? ix->capdfr * 2 : 64;
        struct dfr *nd = g_calloc(ix, nc * sizeof(*nd));
        if (nd == NULL)
            return; /* out of memory: leak it (and lose the id) rather than free it early */
        if (ix->ndfr)
            memcpy(nd, ix->dfr, ix->ndfr * sizeof(*nd));
        g_free(ix, ix->dfr);
        ix->dfr = nd;
        ix->capdfr = nc;
    }
    /* the epoch after the unpublishing stores: an RMW is a full barrier (and TSan sees it) */
    uint64_t e = __atomic_fetch_add(&ix->epoch, 0, __ATOMIC_SEQ_CST);
    ix->dfr[ix->ndfr++] = (struct dfr){.p = p, .epoch = e, .kind = kind, .id = id};
}

static void pod_free(struct kvr_index *ix, struct pod *pd)
{
    g_free(ix, pd->name);
    g_free(ix, pd->wids);
    g_free(ix, pd);
}

static void dfr_release(struct kvr_index *ix, struct dfr *d)
{
    switch (d->kind) {
    case DFR_WORKER:
        kvr_ix_worker_free(ix, d->p);
        ix->wfree[ix->nwfree++] = d->id;
        break;
    case DFR_POD:
        pod_free(ix, d->p);
        ix->pfree[ix->npfree++] = d->id;
        break;
    default:
        g_free(ix, d->p);
    }
}

/* Frees what is past its grace period (a prefix: the list is in epoch order); returns the
 * worker ids still waiting. */
static uint32_t dfr_collect(struct kvr_index *ix)
{
    uint64_t e = kvr_ix_ebr_advance(ix);
    size_t k = 0;
    uint32_t waiting = 0;
    for (; k < ix->ndfr && ix->dfr[k].epoch + 2 <= e; k++)
        dfr_release(ix, &ix->dfr[k]);
    if (k > 0) {
        memmove(ix->dfr, ix->dfr + k, (ix->ndfr - k) * sizeof(*ix->dfr));
        ix->ndfr -= k;
    }
    for (size_t i = 0; i < ix->ndfr; i++)
        waiting += ix->dfr[i].kind == DFR_WORKER;
    return waiting;
}

/* A worker id for a new worker: a recycled one, a never-used one, or, while forgotten ones
 * are in their grace period, one of them once ripe. -ENOSPC when max_workers are live. */
static int wid_take(struct kvr_index *ix, uint32_t *id)
{
    for (unsigned spins = 0;; spins++) {
        if (ix->nwfree > 0) {
            *id = ix->wfree[--ix->nwfree];
            return 0;
        }
        if (ix->nworkers < ix->o.max_workers) {
            *id = ix->nworkers;
            return 0;
        }
        if (dfr_collect(ix) == 0 && ix->nwfree == 0)
            return -ENOSPC;
        if (ix->nwfree == 0) {
            if (spins > 16)
                sched_yield();
            else
                cpu_relax();
        }
    }
}

static int pid_take(struct kvr_index *ix, uint32_t *id)
{
    if (ix->npfree > 0) {
        *id = ix->pfree[--ix->npfree];
        return 0;
    }
    if (ix->npods < ix->o.max_workers) {
        *id = ix->npods;
        return 0;
    }
    return -ENOSPC; /* cannot happen: a pod has a worker, wid_take found one */
}

int kvr_index_worker_intern(struct kvr_index *ix, const char *pod, uint32_t dp_rank,
                            uint32_t *wid)
{
    char key[KVR_NAME_MAX + 8];
    uint32_t len, id, pid;
    int rc = worker_key(pod, dp_rank, key, &len);
    if (rc < 0)
        return rc;
    uint64_t h = str_hash(key, len);
    if (itab_lookup(ix, &ix->w_tab, key, len, h, &id) == 0)
        goto found;
    pthread_mutex_lock(&ix->imu);
    if (itab_find(ix->w_tab, key, len, h, &id) == 0)
        goto found_locked;
    if (ix->ndfr > 0)
        (void)dfr_collect(ix);
    rc = wid_take(ix, &id);
    if (rc < 0)
        goto fail;
    size_t pl = strlen(pod);
    uint64_t ph = str_hash(pod, pl);
    struct pod *pd;
    int newpod = 0;
    rc = -ENOMEM;
    if (itab_find(ix->pod_tab, pod, (uint32_t)pl, ph, &pid) == 0) {
        pd = ix->pods[pid];
    } else {
        rc = pid_take(ix, &pid);
        if (rc < 0)
            goto fail;
        rc = -ENOMEM;
        pd = g_calloc(ix, sizeof(*pd));
        if (pd == NULL)
            goto fail;
        pd->name = g_calloc(ix, pl + 1);
        if (pd->name == NULL || itab_add(ix, &ix->pod_tab, pod, (uint32_t)pl, ph, pid, NULL) < 0) {
            g_free(ix, pd->name);
            g_free(ix, pd);
            goto fail;
        }
        memcpy(pd->name, pod, pl);
        newpod = 1;
    }
    if (pd->nw == pd->cw) {
        uint32_t nc = pd->cw ? pd->cw * 2 : 4;
        uint32_t *nw = g_calloc(ix, nc * sizeof(*nw));
        if (nw == NULL)
            goto fail_pod;
        if (pd->nw)
            memcpy(nw, pd->wids, pd->nw * sizeof(*nw));
        g_free(ix, pd->wids);
        pd->wids = nw;
        pd->cw = nc;
    }
    struct worker *wk = g_calloc(ix, sizeof(*wk));
    if (wk == NULL)
        goto fail_pod;
    wk->pod_id = pid;
    wk->rank = dp_rank;
    wk->pod = pd->name;
    wk->podlen = (uint32_t)pl;
    if (itab_add(ix, &ix->w_tab, key, len, h, id, NULL) < 0) {
        g_free(ix, wk);
        goto fail_pod;
    }
    if (newpod) {
        STR(ix->pods[pid], pd);
        if (pid == ix->npods)
            STR(ix->npods, pid + 1);
        STR(ix->nlivepods, ix->nlivepods + 1);
    }
    pd->wids[pd->nw++] = id;
    ix->wpod[id] = pid;
    ST(ix->wslow[id], 0u);
    STR(ix->wgen[id], (ix->wgen[id] | 1u) + 1u); /* a new even generation */
    STR(ix->workers[id], wk);
    if (id == ix->nworkers)
        STR(ix->nworkers, id + 1);
    STR(ix->nlive, ix->nlive + 1);
found_locked:
    pthread_mutex_unlock(&ix->imu);
found:
    if (wid)
        *wid = id;
    return 0;
fail_pod:
    if (newpod) { /* its key is in pod_tab already: take it out again */
        itab_del(ix, ix->pod_tab, pod, (uint32_t)pl, ph);
        dfr_push(ix, pd, DFR_POD, pid);
    }
fail:
    if (rc == -ENOSPC)
        __atomic_fetch_add(&ix->refused, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&ix->imu);
    return rc;
}

int kvr_index_pod_forget(struct kvr_index *ix, uint32_t pod_id, struct kvr_index_wres *res)
{
    uint32_t *wids = NULL, nw = 0;
    struct kvr_index_wres dummy = {0};
    int rc = 0;

    if (ix == NULL)
        return -EINVAL;
    if (res == NULL)
        res = &dummy;
    pthread_mutex_lock(&ix->imu);
    struct pod *pd = pod_id < ix->npods ? ix->pods[pod_id] : NULL;
    if (pd == NULL) {
        pthread_mutex_unlock(&ix->imu);
        return -ENOENT;
    }
    nw = pd->nw;
    wids = malloc((nw ? nw : 1) * sizeof(*wids));
    if (wids != NULL && nw)
        memcpy(wids, pd->wids, nw * sizeof(*wids));
    pthread_mutex_unlock(&ix->imu);
    if (wids == NULL)
        return -ENOMEM;
    /* 1. the blocks: no holder set keeps these workers' holder ids */
    for (uint32_t i = 0; i < nw; i++) {
        rc = kvr_index_clear(ix, wids[i], -1, res);
        if (rc < 0)
            goto out;
    }
    /* 2. keys, records and ids: unpublished now, freed and reusable after a grace period */
    pthread_mutex_lock(&ix->imu);
    for (uint32_t i = 0; i < nw; i++) {
        char key[KVR_NAME_MAX + 8];
        uint32_t len;
        struct worker *wk = ix->workers[wids[i]];
        if (wk == NULL || worker_key(wk->pod, wk->rank, key, &len) < 0)
            continue;
        itab_del(ix, ix->w_tab, key, len, str_hash(key, len));
        STR(ix->workers[wids[i]], NULL);
        STR(ix->wgen[wids[i]], ix->wgen[wids[i]] | 1u); /* odd: forgotten */
        STR(ix->nlive, ix->nlive - 1);
        __atomic_fetch_add(&ix->forgotten, 1, __ATOMIC_RELAXED);
        dfr_push(ix, wk, DFR_WORKER, wids[i]);
    }
    size_t pl = strlen(pd->name);
    itab_del(ix, ix->pod_tab, pd->name, (uint32_t)pl, str_hash(pd->name, pl));
    STR(ix->pods[pod_id], NULL);
    STR(ix->nlivepods, ix->nlivepods - 1);
    dfr_push(ix, pd, DFR_POD, pod_id);
    (void)dfr_collect(ix);
    pthread_mutex_unlock(&ix->imu);
out:
    free(wids);
    return rc;
}

void kvr_index_forget_stats(struct kvr_index *ix, uint64_t *forgotten, uint64_t *refused)
{
    if (forgotten != NULL)
        *forgotten = __atomic_load_n(&ix->forgotten, __ATOMIC_RELAXED);
    if (refused != NULL)
        *refused = __atomic_load_n(&ix->refused, __ATOMIC_RELAXED);
}

const char *kvr_index_worker_pod(const struct kvr_index *ix, uint32_t wid)
{
    struct worker *w = worker_get(ix, wid);
    return w ? w->pod : NULL;
}

uint32_t kvr_index_worker_rank(const struct kvr_index *ix, uint32_t wid)
{
    struct worker *w = worker_get(ix, wid);
    return w ? w->rank : 0;
}

uint32_t kvr_index_worker_pod_id(const struct kvr_index *ix, uint32_t wid)
{
    struct worker *w = worker_get(ix, wid);
    return w ? w->pod_id : UINT32_MAX;
}

uint32_t kvr_index_worker_count(const struct kvr_index *ix)
{
    return LDA(ix->nworkers);
}

uint32_t kvr_index_worker_live(const struct kvr_index *ix)
{
    return LDA(ix->nlive);
}

size_t kvr_index_pod_workers(struct kvr_index *ix, uint32_t pod_id, uint32_t *wids, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&ix->imu);
    if (pod_id < ix->npods && ix->pods[pod_id] != NULL) {
        struct pod *pd = ix->pods[pod_id];
        n = pd->nw;
        for (size_t i = 0; i < n && i < cap; i++)
            wids[i] = pd->wids[i];
    }
    pthread_mutex_unlock(&ix->imu);
    return n;
}

int kvr_index_tier_intern(struct kvr_index *ix, const char *medium, size_t len, uint8_t *tier)
{
    char low[KVR_NAME_MAX + 1];

    if (medium == NULL || len == 0) {
        *tier = KVR_TIER_GPU;
        return 0;
    }
    if (len > KVR_NAME_MAX)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        char c = medium[i];
        if (c == 0)
            return -EINVAL;
        low[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    low[len] = 0;
    uint32_t nt = LDA(ix->ntiers);
    for (uint32_t t = 0; t < nt; t++)
        if (strcmp(ix->tier_names[t], low) == 0) {
            *tier = (uint8_t)t;
            return 0;
        }
    pthread_mutex_lock(&ix->imu);
    nt = ix->ntiers;
    for (uint32_t t = 0; t < nt; t++)
        if (strcmp(ix->tier_names[t], low) == 0) {
            pthread_mutex_unlock(&ix->imu);
            *tier = (uint8_t)t;
            return 0;
        }
    if (nt >= KVR_TIER_MAX) {
        pthread_mutex_unlock(&ix->imu);
        return -ENOSPC;
    }
    memcpy(ix->tier_names[nt], low, len + 1);
    STR(ix->ntiers, nt + 1);
    pthread_mutex_unlock(&ix->imu);
    *tier = (uint8_t)nt;
    return 0;
}

const char *kvr_index_tier_name(const struct kvr_index *ix, uint8_t tier)
{
    if (tier >= LDA(ix->ntiers))
        return NULL;
    return ix->tier_names[tier];
}

uint8_t kvr_index_tier_count(const struct kvr_index *ix)
{
    return (uint8_t)LDA(ix->ntiers);
}

void kvr_ix_itab_free(struct kvr_index *ix, struct itab *t, int recs)
{
    while (t != NULL) {
        struct itab *old = t->old; /* the namespace table's replaced versions */
        for (uint32_t i = 0; recs && i <= t->mask; i++)
            if (t->slot[i] != IREC_TOMB)
                g_free(ix, t->slot[i]);
        g_free(ix, t);
        t = old;
        recs = 0; /* records are shared with the newest table */
    }
}

/* A worker record and what its writer left in it (a forgotten worker was cleared: its maps
 * are empty or gone; destroy frees a full one). Its memory was counted by the writer's slot,
 * so the bytes are taken off the interning total: the sum stays right. */
void kvr_ix_worker_free(struct kvr_index *ix, struct worker *wk)
{
    if (wk == NULL)
        return;
    for (int t = 0; t < KVR_TIER_MAX; t++) {
        struct holder *hd = wk->h[t];
        if (hd == NULL)
            continue;
        void *p[] = {hd->recs.s, hd->absent.s, hd->alias.s, hd->extra.s, hd};
        for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
            g_free(ix, p[i]);
    }
    g_free(ix, wk->orph);
    g_free(ix, wk->awaited.s);
    g_free(ix, wk);
}

/* Destroy: everything still deferred, without waiting (single-threaded by contract). */
void kvr_ix_dfr_free_all(struct kvr_index *ix)
{
    for (size_t k = 0; k < ix->ndfr; k++)
        dfr_release(ix, &ix->dfr[k]);
    ix->ndfr = 0;
    g_free(ix, ix->dfr);
    ix->dfr = NULL;
}
