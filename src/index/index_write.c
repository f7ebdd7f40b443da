/* index_write.c — the writers: store, remove, clear and purge, with the hole accounting and
 * the orphans. One writer thread per worker at a time (index.h): a worker's holders, maps and
 * parked blocks are its writer's alone; entries are shared (index_shard.c, index_hset.c).
 *
 * CHAINS
 * The chain hash is never the engine's hash: store computes chain = kvr_hash_chain(parent
 * entry's chain, content) with the parent found through the engine hash (same holder first,
 * then the worker's other tiers, which share engine hashes for the same content chain).
 * Duplicate store of an engine hash the holder has: refcounted (copies), its first
 * (position, chain) is kept. Another engine hash for an entry the holder already holds is an
 * alias: membership of a holder in an entry = 1 + alias count, and it ends with the last
 * engine hash. A holder's fixed record (~100 bytes) stays once used.
 *
 * HOLES
 * holes(H) = number of entries H holds at position > 0 whose parent entry H does not hold.
 * Kept exact: gaining an entry E moves absent[E] into E's nchild (those children stop being
 * holes) and bumps the parent's nchild or absent[parent]; losing E does the reverse. (Along
 * a stored chain the next block's membership is counted in the new entry's nchild when it
 * is created and withdrawn if that block turns out to be a duplicate: one lock less. A
 * remove walking a chain tail first defers the decrement of the parent's nchild to the
 * parent's own removal, which is the next one: see hole_lose.) Every change goes through
 * holes_add, which keeps the per-worker count of holey holders find reads (ix->wslow): a
 * worker whose holders are all hole-free is answered by the jump search (the lemma in
 * index_find.c), any other position by position.
 *
 * STORE AND REMOVE FAST PATHS
 * store looks ST_AHEAD blocks ahead computing each block's chain (assuming the chain
 * continues), key hash and reverse-map key and home into a ring, prefetching the table and
 * map slots; a block whose real parent differs (after a duplicate) restarts the look-ahead.
 * store_fast then does the usual block in one pass from the ring (new engine hash, the
 * previous block's entry counted it provisionally or position 0, no absent children, no
 * parked blocks, a table and map with room): one probe of each map, one shard lock, join or
 * create, counters accumulated and published once per call. remove runs a rolling
 * pipeline whose stages each put a block's next misses in flight several blocks before the
 * next stage needs them (reverse-map home; record, its node and the slot after it; the
 * node's table slot and shard), then removes the blocks in order; unstore_fast deletes the
 * usual block (last copy, no alias, the entry held by this holder alone) in one critical
 * section and leaves a tombstone in the reverse map. Both check everything before changing
 * anything and leave all other cases to the general store_one/unstore, so results are
 * identical. Node runs from the slab, the uncontended node lock inline and hole_lose's
 * usual case (the parent is the next block removed) inline in unstore_fast trim both. What
 * each of these saved, and the look-aheads and windows tried and dropped: docs/index.md,
 * store and remove.
 *
 * ORPHANS (store whose parent engine hash the worker does not know in any tier)
 * The blocks are never indexed at a guessed position. Up to opts.orphan_capacity blocks per
 * worker are parked, FIFO, with their parent engine hash (0 = drop them all, counted).
 * Invariant at the end of every call: no parked block's parent is known to the worker. When
 * a store creates an engine hash that a parked block awaits (or parks a block whose parent,
 * an earlier block of the same store, is already known), the parked list is swept in FIFO
 * order, adopting every block whose parent is now known (same tier first, then the other
 * tiers), until a sweep adopts nothing. Parking more than capacity evicts the oldest
 * parked blocks (counted in orphans_dropped); a single store larger than the capacity parks
 * its first blocks and drops the rest. A remove naming a parked block drops it (counted in
 * orphans_dropped); clear/purge drop the worker's parked blocks of the cleared tiers.
 */
#include "index/index_int.h"

struct wctx {
    struct kvr_index *ix;
    struct ebr_slot *s;
    struct worker *w;
    uint32_t wid;
    struct kvr_index_wres *res;
    int adopt; /* a new engine hash is awaited by a parked block */
    struct node *prov; /* entry holding a provisional child count (store_one) */
    struct node *pend; /* remove: entry whose nchild for pend_hid owes a decrement */
    uint32_t pend_hid;
};

static void ebr_reserve(struct wctx *c, size_t more)
{
    kvr_ix_ebr_reserve_slot(c->s, more);
}

/* All changes of a holder's hole count go through here: the worker's count of holey
 * holders (read by find to pick the exact slow path) follows the 0 <-> non-zero edges. */
static void holes_add(struct wctx *c, struct holder *H, int64_t delta)
{
    uint64_t before = LD(H->holes), after = before + (uint64_t)delta;
    KVR_ASSERT(delta >= 0 || before >= (uint64_t)-delta);
    if (before == 0 && after != 0)
        __atomic_fetch_add(&c->ix->wslow[c->wid], 1, __ATOMIC_RELAXED);
    else if (before != 0 && after == 0)
        __atomic_fetch_sub(&c->ix->wslow[c->wid], 1, __ATOMIC_RELAXED);
    ST(H->holes, after);
}

static struct holder *holder_get(struct wctx *c, uint32_t tier)
{
    struct holder *h = c->w->h[tier];
    if (h == NULL) {
        h = sl_calloc(c->s, sizeof(*h));
        if (h != NULL)
            STR(c->w->h[tier], h);
    }
    return h;
}

/* Engine hash lookup across the worker: the given tier first, then the others. */
static struct rec *worker_rec(struct worker *w, uint32_t tier, uint64_t eh)
{
    struct holder *h = w->h[tier];
    struct rec *r = h ? recmap_get(&h->recs, eh) : NULL;
    if (r != NULL)
        return r;
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++) {
        if (t == tier || (h = w->h[t]) == NULL)
            continue;
        if ((r = recmap_get(&h->recs, eh)) != NULL)
            return r;
    }
    return NULL;
}

/* H just gained membership in x. pn: the store's parent node (or NULL). When the parent
 * already counted this block provisionally (store chains, see store_one) prov is set. */
static int hole_gain(struct wctx *c, struct holder *H, uint32_t hid, struct node *x,
                     struct node *pn, int prov)
{
    if (LD(x->n) & N_ROOT)
        return 0;
    struct node *p = pn;
    if (p == NULL || p->chain != x->parent_chain)
        p = tab_find(c->ix, x->parent_chain, key_hash(x->parent_chain));
    else if (prov)
        return 0;
    if (p != NULL && entry_adj(p, hid, 1))
        return 0;
    int rc = kvr_ix_cmap_add(c->s, &H->absent, absent_key(x->parent_chain), 1);
    if (rc == 0)
        holes_add(c, H, 1);
    return rc;
}

/* Applies the decrement remove deferred (see hole_lose). */
static void pend_flush(struct wctx *c)
{
    if (c->pend != NULL) {
        int r = entry_adj(c->pend, c->pend_hid, -1);
        KVR_ASSERT(r == 1);
        c->pend = NULL;
    }
}

/* H just lost membership in an entry (key chain, parent pchain, root: at position 0) that
 * had nchild held children. hint: a node that may be the parent (saves a lookup); when it
 * is, it is held by H (it comes from H's reverse map) and it is the next block the remove
 * call names (removals walk a chain tail first), so the parent's nchild decrement is
 * deferred in c->pend: if that next removal deletes H's membership, the decrement is
 * folded into the nchild it returns (one node lock less a block); anything else applies
 * it first (unstore, end of the call). Only this writer reads H's nchild values. */
static void hole_lose(struct wctx *c, struct holder *H, uint32_t hid, int root,
                      uint64_t chain, uint64_t pchain, uint32_t nchild, struct node *hint)
{
    if (nchild > 0) {
        if (kvr_ix_cmap_add(c->s, &H->absent, absent_key(chain), nchild) == 0)
            holes_add(c, H, nchild);
        else
            kvr_log_error("index: out of memory in hole accounting");
    }
    if (root)
        return;
    struct node *p = hint;
    if (p != NULL && p->chain == pchain) {
        KVR_ASSERT(c->pend == NULL);
        c->pend = p;
        c->pend_hid = hid;
        return;
    }
    p = tab_find(c->ix, pchain, key_hash(pchain));
    if (p != NULL && entry_adj(p, hid, -1))
        return;
    (void)kvr_ix_cmap_add(c->s, &H->absent, absent_key(pchain), -1);
    holes_add(c, H, -1);
}

/* Withdraws the provisional child count store_one gave the previous block's entry. */
static void prov_cancel(struct wctx *c, uint32_t hid)
{
    if (c->prov != NULL) {
        int r = entry_adj(c->prov, hid, -1);
        KVR_ASSERT(r == 1);
        c->prov = NULL;
    }
}

/* Stores one block for holder (wid, tier) after parent node *pn (NULL = position 0);
 * *pn becomes this block's node. more: another block of the same chain follows in this
 * store; its membership is then counted in this entry's nchild right away (one lock less
 * per block) and withdrawn by prov_cancel if it does not happen. */
static int store_one(struct wctx *c, struct holder *H, uint32_t tier, uint32_t ns,
                     struct node **pn, const struct kvr_index_block *b, int more)
{
    uint32_t hid = HOLDER(c->wid, tier);
    uint64_t key = rec_key(b->engine_hash);
    struct rec *r = recmap_slot(c->s, &H->recs, key);
    if (r == NULL) {
        prov_cancel(c, hid);
        return -ENOMEM;
    }
    if (REC_LIVE(r)) {
        prov_cancel(c, hid);
        if (REC_COPIES(r) < COPIES_MAX)
            r->nc += 1ull << 48;
        else if (kvr_ix_cmap_add(c->s, &H->extra, key, 1) < 0) /* keyed like the records */
            return -ENOMEM;
        c->res->duplicates++;
        *pn = REC_ND(r);
        return 0;
    }
    struct node *p = *pn;
    uint64_t pch = p ? p->chain : ns_root(ns);
    uint64_t chain = kvr_hash_chain(pch, b->content_hash);
    uint64_t nchild = H->absent.n ? kvr_ix_cmap_get(&H->absent, absent_key(chain)) : 0;
    struct node *x;
    int added, rc;

    rc = kvr_ix_entry_add(c->ix, c->s, p == NULL, chain, pch, key_hash(chain), hid,
                   (uint32_t)nchild + (more ? 1 : 0), &x, &added);
    if (rc < 0) {
        prov_cancel(c, hid);
        return rc;
    }
    /* the slot found above: nothing touched the map since */
    rec_fill(&H->recs, r, key, (uint64_t)(uintptr_t)x | 1ull << 48);
    ADD(H->blocks, 1);
    c->res->stored++;
    if (added) {
        if (nchild > 0) {
            (void)kvr_ix_cmap_add(c->s, &H->absent, absent_key(chain), -(int64_t)nchild);
            holes_add(c, H, -(int64_t)nchild);
        }
        rc = hole_gain(c, H, hid, x, p, c->prov != NULL && c->prov == p);
        if (rc < 0)
            kvr_log_error("index: out of memory in hole accounting");
        if (c->prov != p)
            prov_cancel(c, hid);
        c->prov = more ? x : NULL;
    } else {
        prov_cancel(c, hid);
        KVR_ASSERT(nchild == 0);
        if (kvr_ix_cmap_add(c->s, &H->alias, (uint64_t)(uintptr_t)x, 1) < 0)
            kvr_log_error("index: out of memory counting an engine-hash alias");
    }
    if (c->w->norph > 0 && kvr_ix_cmap_get(&c->w->awaited, b->engine_hash) > 0)
        c->adopt = 1;
    *pn = x;
    return 0;
}

#define ST_AHEAD 8  /* store: blocks looked ahead (chain, key hash, slots prefetched) */
#define ST_RING 16  /* > ST_AHEAD */

struct st_ring {
    uint64_t pch[ST_RING], ch[ST_RING], kh[ST_RING]; /* predicted parent chain, chain, key */
    uint64_t rk[ST_RING];                            /* reverse-map key */
    uint32_t rh[ST_RING], cap[ST_RING];              /* reverse-map home for that capacity */
};

/* Counters store_fast accumulates and publishes once per call. */
struct st_acc {
    uint64_t stored, entries;
};

static void st_acc_flush(struct wctx *c, struct holder *H, struct st_acc *a)
{
    if (a->stored == 0)
        return;
    ADD(H->blocks, (int64_t)a->stored);
    ADD(c->s->pairs, (int64_t)a->stored);
    ADD(c->s->entries, (int64_t)a->entries);
    c->res->stored += a->stored;
    a->stored = a->entries = 0;
}

/* The usual block of a store, in one pass: a new engine hash for the holder continuing the
 * store's chain (the previous block's entry counted it provisionally, see store_one) or at
 * position 0, with no absent children, no parked blocks for the worker, joining an existing
 * entry or creating one in a table with room. chain, h and rh are the block's chain hash,
 * key hash and reverse-map home (computed ahead). Returns 0, having changed nothing, for
 * anything else (duplicates, aliases, a map or table to grow, the first block after a given
 * parent, ENOMEM): store_one then does the general work. Exactly store_one's effects. */
static inline int store_fast(struct wctx *c, struct holder *H, uint32_t hid, struct node **pn,
                             uint64_t key, uint64_t pch, uint64_t chain, uint64_t h, uint32_t rh,
                             int more, struct st_acc *acc)
{
    struct recmap *m = &H->recs;
    struct node *p = *pn;
    if (m->s == NULL || c->w->norph != 0 || (p != NULL && c->prov != p))
        return 0;
    /* the record goes to the first tombstone of its probe run (churn that stores again
     * what it removed finds its own tombstone there: the map neither fills up with
     * tombstones nor grows, and the probe stops at it, RECMAP_OWN_TOMB), else to the empty
     * slot ending the run, if within the max load */
    uint32_t i = rh, tb = UINT32_MAX;
    if (m->tomb == 0) { /* the usual case, and a shorter loop */
        for (; m->s[i].nc != 0; i = rec_next(m, i))
            if (m->s[i].key == key)
                return 0; /* duplicate */
    } else {
        for (; m->s[i].nc != 0; i = rec_next(m, i)) {
            if (m->s[i].key == key) {
                if (m->s[i].nc != REC_TOMB)
                    return 0; /* duplicate */
                if (tb == UINT32_MAX)
                    tb = i;
                break; /* its own tombstone: not live further on (RECMAP_OWN_TOMB) */
            }
            if (m->s[i].nc == REC_TOMB && tb == UINT32_MAX)
                tb = i;
        }
    }
    if (tb != UINT32_MAX)
        i = tb;
    else if ((size_t)(m->n + m->tomb + 1) * 8 > (size_t)m->cap * RECMAP_LOAD)
        return 0;
    if (H->absent.n && kvr_ix_cmap_get(&H->absent, absent_key(chain)) != 0)
        return 0;
    struct kvr_index *ix = c->ix;
    struct shard *sh = &ix->sh[h & (NSHARD - 1)];
    uint32_t nchild = more ? 1u : 0u;
    void *old = NULL;

    shard_lock(sh);
    struct table *t = sh->tab;
    if (t == NULL || (sh->used + 1) * 4 > (sh->mask + 1) * 3) {
        shard_unlock(sh);
        return 0;
    }
    uint64_t ins;
    struct node *x = tab_probe_locked(sh, t, h, chain, &ins);
    if (x != NULL) {
        node_lock_fast(x);
        int r = kvr_ix_hs_add(c->s, x, hid, nchild, &old);
        node_unlock(x);
        shard_unlock(sh);
        if (r != 1) { /* an alias (0) or ENOMEM: nothing changed */
            KVR_ASSERT(old == NULL);
            return 0;
        }
        kvr_ix_ebr_retire(ix, c->s, old);
    } else {
        x = node_alloc(ix, c->s);
        if (x == NULL) {
            shard_unlock(sh);
            return 0;
        }
        node_init(x, chain, pch, p == NULL, hid, nchild);
        tab_insert_locked(sh, t, ins, x, h);
        shard_unlock(sh);
        acc->entries++;
    }
    rec_fill(m, &m->s[i], key, (uint64_t)(uintptr_t)x | 1ull << 48);
    acc->stored++;
    /* hole accounting: position 0 has no parent; otherwise the parent counted this block
     * provisionally (c->prov == p) */
    if ((p != NULL ? p->chain != x->parent_chain : !(LD(x->n) & N_ROOT)) &&
        hole_gain(c, H, hid, x, p, p != NULL) < 0)
        kvr_log_error("index: out of memory in hole accounting");
    c->prov = more ? x : NULL;
    *pn = x;
    return 1;
}

/* Drops one copy of r (holder H at tier). hint: see hole_lose. */
static void unstore(struct wctx *c, struct holder *H, uint32_t tier, struct rec *r,
                    struct node *hint)
{
    struct node *x = REC_ND(r);
    uint32_t hid = HOLDER(c->wid, tier);
    /* a deferred decrement is folded in only when this call ends H's membership of it */
    if (c->pend != NULL && (c->pend != x || c->pend_hid != hid))
        pend_flush(c);
    uint32_t copies = REC_COPIES(r);
    if (copies == COPIES_MAX && H->extra.n && kvr_ix_cmap_get(&H->extra, r->key) > 0) {
        pend_flush(c);
        (void)kvr_ix_cmap_add(c->s, &H->extra, r->key, -1);
        return;
    }
    if (copies > 1) {
        pend_flush(c);
        r->nc -= 1ull << 48;
        return;
    }
    recmap_del(c->s, &H->recs, r);
    ADD(H->blocks, -1);
    c->res->removed++;
    if (H->alias.n && kvr_ix_cmap_get(&H->alias, (uint64_t)(uintptr_t)x) > 0) {
        pend_flush(c);
        (void)kvr_ix_cmap_add(c->s, &H->alias, (uint64_t)(uintptr_t)x, -1);
        return;
    }
    int root = (LD(x->n) & N_ROOT) != 0;
    uint64_t chain = x->chain, pchain = x->parent_chain;
    uint32_t nchild = kvr_ix_entry_del(c->ix, c->s, x, hid);
    if (c->pend != NULL) { /* == x: the decrement owed to this membership, now gone */
        KVR_ASSERT(nchild >= 1);
        nchild--;
        c->pend = NULL;
    }
    hole_lose(c, H, hid, root, chain, pchain, nchild, hint);
}

/* Counters unstore_fast accumulates and publishes once per call. */
struct rm_acc {
    uint64_t removed, entries;
};

static void rm_acc_flush(struct wctx *c, struct holder *H, struct rm_acc *a)
{
    if (a->removed == 0)
        return;
    ADD(H->blocks, -(int64_t)a->removed);
    ADD(c->s->pairs, -(int64_t)a->removed);
    ADD(c->s->entries, -(int64_t)a->entries);
    c->res->removed += a->removed;
    a->removed = a->entries = 0;
}

/* The usual removal, in one pass: the last copy of an engine hash (no alias, no extra
 * copies) whose entry holds this holder alone, deleted in one critical section. Returns 0,
 * having changed nothing, for anything else (unstore does the general work). Exactly
 * unstore's effects. */
static inline int unstore_fast(struct wctx *c, struct holder *H, uint32_t hid, struct rec *r,
                               struct node *hint, struct rm_acc *acc)
{
    struct node *x = REC_ND(r);
    if (REC_COPIES(r) != 1 || H->alias.n != 0 || (LD(x->n) & (N_COUNT | N_EXT)) != 1 ||
        (c->pend != NULL && (c->pend != x || c->pend_hid != hid)))
        return 0;
    struct kvr_index *ix = c->ix;
    struct ebr_slot *s = c->s;
    uint64_t chain = x->chain, pchain = x->parent_chain, h = key_hash(chain);
    struct shard *sh = &ix->sh[h & (NSHARD - 1)];

    shard_lock(sh);
    node_lock_fast(x);
    uint32_t n = LD(x->n);
    uint64_t e = LD(x->h);
    if ((n & (N_COUNT | N_EXT)) != 1 || el_holder(e) != hid) { /* another holder joined */
        node_unlock(x);
        shard_unlock(sh);
        return 0;
    }
    ST(x->n, N_DEAD);
    node_unlock(x);
    struct table *oldt = kvr_ix_tab_unlink_locked(ix, s, sh, x, h);
    shard_unlock(sh);
    if (oldt != NULL)
        kvr_ix_ebr_retire(ix, s, oldt);
    if (s->nret < s->capret) { /* reserved by the caller */
        s->ret[s->nret].p = (void *)((uintptr_t)x | RET_NODE);
        s->ret[s->nret].epoch = __atomic_load_n(&ix->epoch, __ATOMIC_SEQ_CST);
        s->nret++;
    } else {
        kvr_ix_ebr_retire(ix, s, (void *)((uintptr_t)x | RET_NODE));
    }
    recmap_del(s, &H->recs, r);
    acc->removed++;
    acc->entries++;
    uint32_t nchild = (uint32_t)(e >> 32);
    if (c->pend != NULL) { /* == x: the decrement owed to this membership, now gone */
        KVR_ASSERT(nchild >= 1);
        nchild--;
        c->pend = NULL;
    }
    if (nchild == 0 && !(n & N_ROOT) && hint != NULL && hint->chain == pchain) {
        c->pend = hint; /* hole_lose's usual case: the next block removed is the parent */
        c->pend_hid = hid;
    } else {
        hole_lose(c, H, hid, (n & N_ROOT) != 0, chain, pchain, nchild, hint);
    }
    return 1;
}

static void orph_remove_at(struct wctx *c, uint32_t i, uint32_t k)
{
    struct worker *w = c->w;
    for (uint32_t j = i; j < i + k; j++)
        (void)kvr_ix_cmap_add(c->s, &w->awaited, w->orph[j].parent, -1);
    memmove(&w->orph[i], &w->orph[i + k], (w->norph - i - k) * sizeof(*w->orph));
    w->norph -= k;
    ST(w->porph, w->norph);
    ADD(c->s->orphans, -(int64_t)k);
    if (w->norph == 0) {
        sl_free(c->s, w->orph);
        w->orph = NULL;
        w->corph = 0;
    }
}

static int orph_park(struct wctx *c, uint32_t tier, uint32_t ns, uint64_t parent,
                     const struct kvr_index_block *b, size_t n)
{
    struct worker *w = c->w;
    uint32_t cap = c->ix->o.orphan_capacity;
    size_t k = n < cap ? n : cap;

    c->res->orphans_dropped += n - k;
    if (k == 0)
        return 0;
    if (w->norph + k > cap) {
        uint32_t ev = (uint32_t)(w->norph + k - cap);
        orph_remove_at(c, 0, ev);
        c->res->orphans_dropped += ev;
    }
    if (w->norph + k > w->corph) {
        uint32_t nc = w->corph ? w->corph : 16;
        while (nc < w->norph + k)
            nc *= 2;
        if (nc > cap)
            nc = cap;
        struct parked *np = sl_alloc(c->s, nc * sizeof(*np));
        if (np == NULL)
            return -ENOMEM;
        if (w->norph)
            memcpy(np, w->orph, w->norph * sizeof(*np));
        sl_free(c->s, w->orph);
        w->orph = np;
        w->corph = nc;
    }
    for (size_t i = 0; i < k; i++) {
        struct parked *pk = &w->orph[w->norph];
        pk->eh = b[i].engine_hash;
        pk->content = b[i].content_hash;
        pk->parent = i == 0 ? parent : b[i - 1].engine_hash;
        pk->ns = ns;
        pk->tier = tier;
        if (kvr_ix_cmap_add(c->s, &w->awaited, pk->parent, 1) < 0)
            return -ENOMEM;
        w->norph++;
        ST(w->porph, w->norph);
        ADD(c->s->orphans, 1);
        c->res->orphaned++;
    }
    return 0;
}

static int orph_adopt(struct wctx *c)
{
    struct worker *w = c->w;
    int progress;
    do {
        progress = 0;
        c->adopt = 0;
        for (uint32_t i = 0; i < w->norph;) {
            struct parked pk = w->orph[i];
            struct rec *r = worker_rec(w, pk.tier, pk.parent);
            if (r == NULL) {
                i++;
                continue;
            }
            struct node *pn = REC_ND(r);
            orph_remove_at(c, i, 1);
            struct kvr_index_block b = {pk.eh, pk.content};
            struct holder *H = holder_get(c, pk.tier);
            if (H == NULL)
                return -ENOMEM;
            int rc = store_one(c, H, pk.tier, pk.ns, &pn, &b, 0);
            if (rc < 0)
                return rc;
            c->res->orphans_adopted++;
            progress = 1;
        }
    } while (progress && w->norph > 0);
    c->adopt = 0;
    return 0;
}

static int wbegin(struct kvr_index *ix, uint32_t wid, struct kvr_index_wres *res,
                  struct wctx *c)
{
    c->ix = ix;
    c->w = worker_get(ix, wid);
    if (c->w == NULL)
        return -EINVAL;
    c->wid = wid;
    c->res = res;
    c->adopt = 0;
    c->prov = NULL;
    c->pend = NULL;
    c->s = kvr_ix_slot_claim(ix, 0);
    ebr_enter(ix, c->s);
    return 0;
}

static void wend(struct wctx *c)
{
    ebr_exit(c->s);
    kvr_ix_ebr_reclaim(c->ix, c->s);
    kvr_ix_node_cache_roll(c->ix, c->s);
    slot_release(c->s);
}

int kvr_index_store(struct kvr_index *ix, uint32_t wid, uint8_t tier, uint32_t ns,
                    const uint64_t *parent, const struct kvr_index_block *blocks, size_t n,
                    struct kvr_index_wres *res)
{
    struct kvr_index_wres local = {0};
    struct wctx c;
    int rc;

    if (ix == NULL || tier >= KVR_TIER_MAX || ns >= LDA(ix->nns) || (n > 0 && !blocks))
        return -EINVAL;
    if ((rc = wbegin(ix, wid, res ? res : &local, &c)) < 0)
        return rc;
    struct node *pn = NULL;
    if (n == 0)
        goto out;
    if (parent != NULL) {
        struct rec *r = worker_rec(c.w, tier, *parent);
        if (r == NULL) {
            rc = orph_park(&c, tier, ns, *parent, blocks, n);
            /* a parked block whose own parent (an earlier block of this store) is already
             * known to the worker is adopted right away, like any other; the new blocks are
             * the last min(n, capacity) parked */
            size_t k = n < c.ix->o.orphan_capacity ? n : c.ix->o.orphan_capacity;
            for (uint32_t i = c.w->norph - (uint32_t)k; rc == 0 && i < c.w->norph; i++)
                if (worker_rec(c.w, c.w->orph[i].tier, c.w->orph[i].parent) != NULL)
                    c.adopt = 1;
            if (rc == 0 && c.adopt)
                rc = orph_adopt(&c);
            goto out;
        }
        pn = REC_ND(r);
    }
    struct holder *H = holder_get(&c, tier);
    if (H == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    recmap_reserve(c.s, &H->recs, n);
    /* look ahead: each block's chain, key hash and reverse-map home are computed ST_AHEAD
     * blocks ahead assuming the chain continues (their table and map slots prefetched) and
     * kept in a ring for store_fast; a block whose parent turns out different (after a
     * duplicate) restarts the look-ahead from its real chain */
    struct st_ring ring;
    struct st_acc acc = {0};
    uint32_t hid = HOLDER(wid, tier);
    uint64_t la_chain = pn ? pn->chain : ns_root(ns);
    size_t la = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t pch = pn ? pn->chain : ns_root(ns);
        if (la > i && ring.pch[i % ST_RING] != pch)
            la = i, la_chain = pch; /* prediction broken: restart from the real parent */
        for (; la < n && la < i + ST_AHEAD; la++) {
            uint32_t k = (uint32_t)(la % ST_RING);
            ring.pch[k] = la_chain;
            la_chain = kvr_hash_chain(la_chain, blocks[la].content_hash);
            ring.ch[k] = la_chain;
            ring.kh[k] = key_hash(la_chain);
            pf_slot(ix, ring.kh[k]);
            __builtin_prefetch(&ix->sh[ring.kh[k] & (NSHARD - 1)], 1);
            ring.rh[k] = 0;
            ring.rk[k] = rec_key(blocks[la].engine_hash);
            if (H->recs.s != NULL) {
                ring.rh[k] = rec_home(&H->recs, ring.rk[k]);
                __builtin_prefetch(&H->recs.s[ring.rh[k]]);
            }
            ring.cap[k] = H->recs.cap;
        }
        uint32_t k = (uint32_t)(i % ST_RING);
        if (ring.cap[k] == H->recs.cap &&
            store_fast(&c, H, hid, &pn, ring.rk[k], pch, ring.ch[k], ring.kh[k],
                       ring.rh[k], i + 1 < n, &acc))
            continue;
        if ((rc = store_one(&c, H, tier, ns, &pn, &blocks[i], i + 1 < n)) < 0)
            break;
    }
    st_acc_flush(&c, H, &acc);
    if (rc < 0)
        goto out;
    if (c.adopt)
        rc = orph_adopt(&c);
out:
    wend(&c);
    return rc;
}

uint32_t kvr_index_copies(struct kvr_index *ix, uint32_t wid, uint8_t tier, uint64_t hash)
{
    struct worker *w;
    struct holder *H;
    struct rec *r;
    uint64_t n;

    if (ix == NULL || tier >= KVR_TIER_MAX || (w = worker_get(ix, wid)) == NULL)
        return 0;
    H = w->h[tier];
    if (H == NULL || H->recs.s == NULL || (r = recmap_get_key(&H->recs, rec_key(hash))) == NULL)
        return 0;
    n = REC_COPIES(r);
    if (n == COPIES_MAX && H->extra.n)
        n += kvr_ix_cmap_get(&H->extra, r->key);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int kvr_index_chain_of(struct kvr_index *ix, uint32_t wid, uint8_t tier, uint64_t hash,
                       uint64_t *chain)
{
    struct worker *w;
    struct holder *H;
    struct rec *r;

    if (ix == NULL || tier >= KVR_TIER_MAX || (w = worker_get(ix, wid)) == NULL)
        return -ENOENT;
    H = w->h[tier];
    if (H == NULL || H->recs.s == NULL || (r = recmap_get_key(&H->recs, rec_key(hash))) == NULL)
        return -ENOENT;
    *chain = REC_ND(r)->chain;
    return 0;
}

uint64_t kvr_index_chain_root(uint32_t ns)
{
    return ns_root(ns);
}

/* remove's look-ahead, a rolling pipeline over the blocks: RM_D1 blocks ahead a block's
 * reverse-map home is prefetched, RM_D2 ahead its record is looked up (its node and the
 * slot after it prefetched), RM_D3 ahead the node's chain is read (its table slot and shard
 * prefetched), then the block is removed. */
#define RM_D1 16
#define RM_D2 10
#define RM_D3 5
#define RM_RING 32 /* > RM_D1, a power of two */

/* A record looked up ahead by remove, if it is still eh's (not deleted since; the caller
 * drops the records looked up when the map is resized). */
static inline struct rec *rm_ahead(struct rec *r, uint64_t key)
{
    return r != NULL && REC_LIVE(r) && r->key == key ? r : NULL;
}

/* The removal of hashes[i] (its key and the record looked up ahead, maybe stale). */
static void rm_block(struct wctx *c, struct holder *H, uint32_t tier, uint32_t hid,
                     const uint64_t *hashes, size_t i, size_t n, const uint64_t *key,
                     struct rec **lr, struct rm_acc *acc)
{
    struct rec *r = NULL;
    if (H != NULL) {
        r = rm_ahead(lr[i % RM_RING], key[i % RM_RING]);
        if (r == NULL)
            r = recmap_get_key(&H->recs, key[i % RM_RING]);
    }
    if (r != NULL) {
        /* removals usually walk a chain tail first: the next one is the parent */
        struct rec *nx = NULL;
        if (i + 1 < n) {
            uint32_t k = (uint32_t)((i + 1) % RM_RING);
            nx = rm_ahead(lr[k], key[k]);
            if (nx == NULL)
                nx = recmap_get_key(&H->recs, key[k]);
        }
        struct node *hint = nx ? REC_ND(nx) : NULL;
        if (!unstore_fast(c, H, hid, r, hint, acc))
            unstore(c, H, tier, r, hint);
        return;
    }
    struct worker *w = c->w;
    uint32_t k;
    for (k = 0; k < w->norph; k++)
        if (w->orph[k].eh == hashes[i] && w->orph[k].tier == tier)
            break;
    if (k < w->norph) {
        orph_remove_at(c, k, 1);
        c->res->orphans_dropped++;
    } else {
        c->res->unknown_removes++;
    }
}

int kvr_index_remove(struct kvr_index *ix, uint32_t wid, uint8_t tier, const uint64_t *hashes,
                     size_t n, struct kvr_index_wres *res)
{
    struct kvr_index_wres local = {0};
    struct wctx c;
    int rc;

    if (ix == NULL || tier >= KVR_TIER_MAX || (n > 0 && !hashes))
        return -EINVAL;
    if ((rc = wbegin(ix, wid, res ? res : &local, &c)) < 0)
        return rc;
    struct holder *H = c.w->h[tier];
    struct rm_acc acc = {0};
    uint32_t hid = HOLDER(wid, tier);
    if (H != NULL)
        ebr_reserve(&c, n + 16);
    /* Records never move until the map is resized (tombstones): a record looked up ahead
     * is used if still live and eh's, and all are dropped when the map's array changes
     * (the next one is the hint: it must have been looked up before its parent's removal,
     * hence RM_D2 >= 1). */
    uint64_t key[RM_RING];
    struct rec *lr[RM_RING] = {0};
    struct rec *base = H != NULL ? H->recs.s : NULL;
    for (size_t t = 0; t < n + RM_D1; t++) {
        size_t j = t;
        if (j < n) { /* its map slot */
            key[j % RM_RING] = rec_key(hashes[j]);
            lr[j % RM_RING] = NULL;
            if (base != NULL)
                __builtin_prefetch(&base[rec_home(&H->recs, key[j % RM_RING])]);
        }
        j = t - (RM_D1 - RM_D2);
        if (t >= RM_D1 - RM_D2 && j < n && base != NULL) { /* its record, its node */
            const struct recmap *m = &H->recs;
            struct rec *r = recmap_get_at(m, key[j % RM_RING], rec_home(m, key[j % RM_RING]));
            lr[j % RM_RING] = r;
            if (r != NULL) {
                __builtin_prefetch(REC_ND(r));
                __builtin_prefetch(r + 1); /* recmap_del reads the next slot */
            }
        }
        j = t - (RM_D1 - RM_D3);
        struct rec *r3;
        if (t >= RM_D1 - RM_D3 && j < n &&
            (r3 = rm_ahead(lr[j % RM_RING], key[j % RM_RING])) != NULL) {
            /* the record is live (removals since may have deleted it: a hash named twice);
             * its node stays allocated during the call (epoch): its immutable chain is
             * safe to read, only to prefetch */
            uint64_t kh = key_hash(REC_ND(r3)->chain);
            pf_slot(ix, kh);
            __builtin_prefetch(&ix->sh[kh & (NSHARD - 1)]);
        }
        if (t < RM_D1)
            continue;
        j = t - RM_D1;
        rm_block(&c, H, tier, hid, hashes, j, n, key, lr, &acc);
        if (H != NULL && H->recs.s != base) { /* resized: records looked up are stale */
            base = H->recs.s;
            memset(lr, 0, sizeof(lr));
        }
    }
    if (H != NULL)
        rm_acc_flush(&c, H, &acc);
    pend_flush(&c);
    wend(&c);
    return 0;
}

static void holder_clear(struct wctx *c, uint32_t tier)
{
    struct worker *w = c->w;
    for (uint32_t i = 0; i < w->norph;) { /* parked blocks of this tier */
        if (w->orph[i].tier == tier) {
            orph_remove_at(c, i, 1);
            c->res->orphans_dropped++;
        } else {
            i++;
        }
    }
    struct holder *H = w->h[tier];
    if (H == NULL)
        return;
    uint32_t hid = HOLDER(c->wid, tier);
    ebr_reserve(c, H->recs.n + 16);
    for (uint32_t i = 0; i < H->recs.cap; i++) {
        struct rec *r = &H->recs.s[i];
        if (!REC_LIVE(r))
            continue;
        c->res->cleared++;
        uint64_t key = (uint64_t)(uintptr_t)REC_ND(r);
        if (H->alias.n && kvr_ix_cmap_get(&H->alias, key) > 0)
            (void)kvr_ix_cmap_add(c->s, &H->alias, key, -1);
        else
            (void)kvr_ix_entry_del(c->ix, c->s, REC_ND(r), hid);
    }
    sl_free(c->s, H->recs.s);
    memset(&H->recs, 0, sizeof(H->recs));
    kvr_ix_cmap_free(c->s, &H->absent);
    kvr_ix_cmap_free(c->s, &H->alias);
    kvr_ix_cmap_free(c->s, &H->extra);
    ST(H->blocks, 0);
    holes_add(c, H, -(int64_t)LD(H->holes));
}

static void worker_clear(struct wctx *c, int tier)
{
    if (tier >= 0) {
        holder_clear(c, (uint32_t)tier);
        return;
    }
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
        holder_clear(c, t);
}

int kvr_index_clear(struct kvr_index *ix, uint32_t wid, int tier, struct kvr_index_wres *res)
{
    struct kvr_index_wres local = {0};
    struct wctx c;
    int rc;

    if (ix == NULL || tier >= KVR_TIER_MAX)
        return -EINVAL;
    if ((rc = wbegin(ix, wid, res ? res : &local, &c)) < 0)
        return rc;
    worker_clear(&c, tier);
    wend(&c);
    return 0;
}

int kvr_index_purge_pod(struct kvr_index *ix, uint32_t pod_id, struct kvr_index_wres *res)
{
    uint32_t buf[64];
    if (ix == NULL || pod_id >= LDA(ix->npods))
        return -EINVAL;
    size_t n = kvr_index_pod_workers(ix, pod_id, buf, 64);
    uint32_t *w = buf;
    if (n > 64) {
        /* a pod with more than 64 ranks: rare; this is a writer call, allocation is fine */
        w = malloc(n * sizeof(*w));
        if (w == NULL)
            return -ENOMEM;
        n = kvr_index_pod_workers(ix, pod_id, w, n);
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = kvr_index_clear(ix, w[i], -1, res);
    if (w != buf)
        free(w);
    return rc;
}
