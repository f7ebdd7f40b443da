/* index_shard.c — the main table: where entries are created, found and deleted.
 *
 * NSHARD (1024) shards by the key hash's low bits, each an open-addressing table (linear
 * probing, max load 3/4) of 8-byte slots: node pointer | 16-bit tag << 48, 0 empty,
 * 1 tombstone. A slot's home is the hash's top bits and its tag the top 16 bits, so a rebuild
 * of up to 2^16 slots places entries from their tags without touching nodes. Unlinking before
 * an empty slot clears the tombstones behind it. Tables grow, shrink when an eighth full
 * (memory follows live contents) and are rebuilt at the same size when tombstones pile up
 * (kvr_ix_tab_unlink_locked), by a rebuild published whole; readers (tab_find, inline in
 * index_int.h) see slots change only by release stores, and find each shard's table with its
 * shift in one compact array (ix->tabw) that stays in L1.
 * Writers take the table's mask and shift from the shard (copies kept under its lock, in the
 * lock's cache line), not from the table header: another miss per entry created or deleted
 * (docs/index.md). tab_publish writes them and writers read them, both under the shard lock;
 * readers never read them.
 * kvr_ix_entry_add and kvr_ix_entry_del hold the shard lock, then the node's (lock order:
 * index_int.h), and retire what they replaced after unlocking.
 */
#include "index/index_int.h"

/* Under the shard lock: publishes the shard's table for readers. */
static void tab_publish(struct kvr_index *ix, struct shard *sh, struct table *t)
{
    KVR_ASSERT(((uintptr_t)t >> 48) == 0);
    STR(sh->tab, t);
    STR(ix->tabw[sh - ix->sh], t ? (uint64_t)(uintptr_t)t | (uint64_t)t->shift << 56 : 0);
    sh->shift = t ? t->shift : 0;
    sh->mask = t ? t->mask : 0;
}

/* Under the shard lock: rebuilds the shard's table for `want` live entries, publishes it.
 * The caller retires the replaced table after unlocking (see the lock order). */
static int tab_rebuild(struct kvr_index *ix, struct ebr_slot *s, struct shard *sh,
                       uint64_t want)
{
    uint64_t cap = 16;
    while (cap < want * 2)
        cap <<= 1;
    struct table *nt = sl_calloc(s, sizeof(*nt) + cap * sizeof(uint64_t));
    if (nt == NULL)
        return -ENOMEM;
    nt->mask = cap - 1;
    nt->shift = (uint32_t)__builtin_clzll(cap) + 1;
    struct table *ot = sh->tab;
    if (ot != NULL) {
        for (uint64_t i = 0; i <= ot->mask; i++) {
            uint64_t v = LD(ot->slot[i]);
            if (v == 0 || v == SLOT_TOMB)
                continue;
            uint64_t j;
            if (nt->shift >= 48) {
                j = (v >> 48) >> (nt->shift - 48);
            } else {
                const struct node *x = (const struct node *)(uintptr_t)(v & PTR_MASK);
                j = key_hash(x->chain) >> nt->shift;
            }
            while (nt->slot[j] != 0)
                j = (j + 1) & nt->mask;
            nt->slot[j] = v;
        }
    }
    tab_publish(ix, sh, nt);
    sh->used = sh->live;
    return 0;
}

/* Under the shard lock: unlinks x (key hash h) from the shard's table, shrinking it when
 * live contents call for it. Returns a replaced table to retire after unlocking, or NULL. */
struct table *kvr_ix_tab_unlink_locked(struct kvr_index *ix, struct ebr_slot *s, struct shard *sh,
                                struct node *x, uint64_t h)
{
    struct table *t = sh->tab;
    uint64_t i = h >> sh->shift, mask = sh->mask;
    for (;;) {
        uint64_t v = LD(t->slot[i]);
        KVR_ASSERT(v != 0);
        if ((v & PTR_MASK) == (uint64_t)(uintptr_t)x && v != SLOT_TOMB)
            break;
        i = (i + 1) & mask;
    }
    if (LD(t->slot[(i + 1) & mask]) != 0) {
        STR(t->slot[i], SLOT_TOMB);
    } else {
        /* The next slot is empty, so no probe needs to pass here: empty it, and the
         * tombstones just before it (readers' probes stop at the same place as before). */
        STR(t->slot[i], 0ull);
        sh->used--;
        for (uint64_t j = (i - 1) & mask; LD(t->slot[j]) == SLOT_TOMB; j = (j - 1) & mask) {
            STR(t->slot[j], 0ull);
            sh->used--;
        }
    }
    sh->live--;
    /* Shrink (memory follows live contents); a failed shrink is harmless. */
    if (sh->live == 0) {
        tab_publish(ix, sh, NULL);
        sh->used = 0;
        return t;
    }
    if (mask + 1 > 16 && sh->live * 8 < mask + 1)
        return tab_rebuild(ix, s, sh, sh->live) == 0 ? t : NULL;
    /* Clear tombstones in place (same capacity) once they are an eighth of the table and
     * slots in use pass 5/8, while live entries fill at most 5/8: probes are long only at
     * high use, and a rebuild then comes after at least cap/8 deletions, so its cost (one
     * pass over the table) is a few slots a deletion. Without it a flat shard's tombstones
     * fill it to the 3/4 mark, and one whose live entries are just over half of it then
     * doubles (docs/index.md, trace). */
    if ((sh->used - sh->live) * 8 > mask + 1 && sh->used * 8 > (mask + 1) * 5 &&
        sh->live * 8 <= (mask + 1) * 5)
        return tab_rebuild(ix, s, sh, (mask + 1) / 2) == 0 ? t : NULL;
    return NULL;
}

/* Adds holder to entry chain (key hash h; root: at position 0), creating it. *added = 1 for a new
 * membership. One probe under the shard lock finds the entry or the slot for it. */
int kvr_ix_entry_add(struct kvr_index *ix, struct ebr_slot *s, int root,
              uint64_t chain, uint64_t pchain, uint64_t h, uint32_t holder,
              uint32_t nchild, struct node **out, int *added)
{
    struct shard *sh = &ix->sh[h & (NSHARD - 1)];
    void *old = NULL;
    struct table *oldt = NULL;
    int rc;

    shard_lock(sh);
    if (sh->tab == NULL || (sh->used + 1) * 4 > (sh->mask + 1) * 3) {
        oldt = sh->tab;
        rc = tab_rebuild(ix, s, sh, sh->live + 1);
        if (rc < 0) {
            shard_unlock(sh);
            return rc;
        }
    }
    struct table *t = sh->tab;
    uint64_t ins;
    struct node *x = tab_probe_locked(sh, t, h, chain, &ins);
    if (x != NULL) {
        kvr_ix_node_lock(x);
        rc = kvr_ix_hs_add(s, x, holder, nchild, &old);
        node_unlock(x);
        shard_unlock(sh);
        if (oldt != NULL)
            kvr_ix_ebr_retire(ix, s, oldt);
        kvr_ix_ebr_retire(ix, s, old);
        if (rc < 0)
            return rc;
    } else {
        x = node_alloc(ix, s);
        if (x == NULL) {
            shard_unlock(sh);
            if (oldt != NULL)
                kvr_ix_ebr_retire(ix, s, oldt);
            return -ENOMEM;
        }
        node_init(x, chain, pchain, root, holder, nchild);
        tab_insert_locked(sh, t, ins, x, h);
        shard_unlock(sh);
        if (oldt != NULL)
            kvr_ix_ebr_retire(ix, s, oldt);
        ADD(s->entries, 1);
        rc = 1;
    }
    if (rc == 1)
        ADD(s->pairs, 1);
    *out = x;
    *added = rc;
    return 0;
}

/* Under the shard lock (sh, x's shard; h, x's key hash) and x's node lock: when x has no
 * holder left, marks it dead and unlinks it. Unlocks both, then retires the table an unlink
 * replaced. 1 when x died (the caller counts it and retires it), else 0. */
static inline int unlink_if_empty(struct kvr_index *ix, struct ebr_slot *s, struct shard *sh,
                                  struct node *x, uint64_t h)
{
    struct table *oldt = NULL;
    int dead = 0;

    if ((LD(x->n) & ~N_ROOT) == 0) {
        ST(x->n, N_DEAD);
        dead = 1;
    }
    node_unlock(x);
    if (dead)
        oldt = kvr_ix_tab_unlink_locked(ix, s, sh, x, h);
    shard_unlock(sh);
    if (oldt != NULL)
        kvr_ix_ebr_retire(ix, s, oldt);
    return dead;
}

/* Removes holder from x (it must be there); deletes the entry when it empties. */
uint32_t kvr_ix_entry_del(struct kvr_index *ix, struct ebr_slot *s, struct node *x,
                   uint32_t holder)
{
    void *old = NULL;
    uint32_t nchild = 0;
    uint64_t h = key_hash(x->chain);
    struct shard *sh = &ix->sh[h & (NSHARD - 1)];
    int dead;

    if ((LD(x->n) & (N_COUNT | N_EXT)) == 1) {
        /* most likely the last holder: delete in one critical section */
        shard_lock(sh);
        kvr_ix_node_lock(x);
        int r = kvr_ix_hs_del(s, x, holder, &nchild, &old);
        KVR_ASSERT(r == 1);
        dead = unlink_if_empty(ix, s, sh, x, h);
        ADD(s->pairs, -1);
        kvr_ix_ebr_retire(ix, s, old);
        if (dead) {
            ADD(s->entries, -1);
            kvr_ix_ebr_retire(ix, s, (void *)((uintptr_t)x | RET_NODE));
        }
        return nchild;
    }
    kvr_ix_node_lock(x);
    int r = kvr_ix_hs_del(s, x, holder, &nchild, &old);
    uint32_t left = LD(x->n) & N_COUNT;
    node_unlock(x);
    KVR_ASSERT(r == 1);
    kvr_ix_ebr_retire(ix, s, old);
    ADD(s->pairs, -1);
    if (left != 0)
        return nchild;

    shard_lock(sh);
    kvr_ix_node_lock(x);
    dead = unlink_if_empty(ix, s, sh, x, h);
    if (dead) {
        ADD(s->entries, -1);
        kvr_ix_ebr_retire(ix, s, (void *)((uintptr_t)x | RET_NODE));
    }
    return nchild;
}
