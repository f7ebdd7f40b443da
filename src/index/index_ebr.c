/* index_ebr.c — memory accounting and epoch-based reclamation (EBR).
 *
 * Readers never lock (index_int.h, CONCURRENCY), so a writer that unlinks a node, replaces a
 * holder array or replaces a shard table cannot know when the last reader lets go of it: it
 * retires the object, and epochs say when it may be freed.
 * - Every reader and every writer call holds a slot announcing the global epoch while it may
 *   touch shared memory (kvr_ix_slot_claim; ebr_enter/ebr_exit around the accesses). Readers keep a
 *   slot for their lifetime and may use only the first EBR_READER_SLOTS, so writer calls
 *   always find one (they spin, then yield, while all are busy).
 * - Unlinked nodes, replaced holder arrays and replaced tables are retired into the writer
 *   slot's list and freed once the global epoch has advanced twice past their retirement (no
 *   thread can still see them; the list is in retirement order, so what is old enough is a
 *   prefix). Writers try to advance the epoch when leaving a call. Reclaimed nodes go back
 *   to the slab at the end of the call that reclaimed them (index_slab.c).
 * - kvr_ix_ebr_retire may allocate (its list) and log (when that fails it leaks the object rather
 *   than free it early), so it is never called under an index lock (lock order: index_int.h).
 * Accounting: sl_* (per slot, owner-written) and g_* (interning, atomic) in index_int.h add
 * malloc_usable_size() at allocation and remove it at free.
 */
#include "index/index_int.h"

struct ebr_slot *kvr_ix_slot_claim(struct kvr_index *ix, int reader)
{
    static __thread uint32_t hint;
    uint32_t lim = reader ? EBR_READER_SLOTS : EBR_SLOTS;

    for (unsigned spins = 0;; spins++) {
        for (uint32_t k = 0; k < lim; k++) {
            uint32_t i = (hint + k) % lim;
            struct ebr_slot *s = &ix->slots[i];
            uint32_t zero = 0;
            if (LD(s->owner) != 0)
                continue;
            if (!__atomic_compare_exchange_n(&s->owner, &zero, 1, false, __ATOMIC_ACQUIRE,
                                             __ATOMIC_RELAXED))
                continue;
            hint = i;
            uint32_t hw = LD(ix->nslots);
            while (hw < i + 1 &&
                   !__atomic_compare_exchange_n(&ix->nslots, &hw, i + 1, false,
                                                __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                ;
            s->reader = (uint32_t)reader;
            return s;
        }
        if (reader)
            return NULL;
        if (spins > 16)
            sched_yield();
        else
            cpu_relax();
    }
}

/* Queues p to be freed when no thread can see it any more. Never called with an index lock
 * held: it may grow the slot's own list and, when that fails, logs and leaks the object
 * rather than free it early. */
void kvr_ix_ebr_retire(struct kvr_index *ix, struct ebr_slot *s, void *p)
{
    if (p == NULL)
        return;
    if (s->nret == s->capret) {
        size_t nc = s->capret ? s->capret * 2 : 64;
        struct retired *nr = sl_alloc(s, nc * sizeof(*nr));
        if (nr == NULL) {
            kvr_log_error("index: out of memory retiring %p; leaking it", p);
            return;
        }
        if (s->nret)
            memcpy(nr, s->ret, s->nret * sizeof(*nr));
        sl_free(s, s->ret);
        s->ret = nr;
        s->capret = nc;
    }
    s->ret[s->nret].p = p;
    s->ret[s->nret].epoch = __atomic_load_n(&ix->epoch, __ATOMIC_SEQ_CST);
    s->nret++;
}

/* Makes room for `more` retirements (a big remove or clear) in one growth. */
void kvr_ix_ebr_reserve_slot(struct ebr_slot *s, size_t more)
{
    size_t need = s->nret + more;
    if (need <= s->capret)
        return;
    size_t nc = s->capret ? s->capret : 64;
    while (nc < need)
        nc *= 2;
    struct retired *nr = sl_alloc(s, nc * sizeof(*nr));
    if (nr == NULL)
        return; /* kvr_ix_ebr_retire grows on demand */
    if (s->nret)
        memcpy(nr, s->ret, s->nret * sizeof(*nr));
    sl_free(s, s->ret);
    s->ret = nr;
    s->capret = nc;
}

/* Tries to advance the global epoch (twice when nobody is in a critical section of an older
 * one) and returns it. Atomics only: callable under the interning mutex (forgetting waits
 * for grace periods with it), never from inside an epoch of the caller's own. */
uint64_t kvr_ix_ebr_advance(struct kvr_index *ix)
{
    uint64_t e = __atomic_load_n(&ix->epoch, __ATOMIC_SEQ_CST);
    for (int round = 0; round < 2; round++) {
        uint32_t nu = __atomic_load_n(&ix->nslots, __ATOMIC_SEQ_CST);
        int ok = 1;
        for (uint32_t i = 0; i < nu; i++) {
            uint64_t se = __atomic_load_n(&ix->slots[i].epoch, __ATOMIC_SEQ_CST);
            if (se != 0 && se != e) {
                ok = 0;
                break;
            }
        }
        if (!ok)
            break;
        if (__atomic_compare_exchange_n(&ix->epoch, &e, e + 1, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            e = e + 1;
    }
    return e;
}

/* Called by a writer after ebr_exit(): tries to advance the epoch (twice when nobody is in
 * a critical section) and frees what is old enough. */
void kvr_ix_ebr_reclaim(struct kvr_index *ix, struct ebr_slot *s)
{
    if (s->nret == 0) {
        if (s->ret != NULL) { /* reserved but unused */
            sl_free(s, s->ret);
            s->ret = NULL;
            s->capret = 0;
        }
        return;
    }
    uint64_t e = kvr_ix_ebr_advance(ix);
    /* the list is in retirement order, so its epochs never decrease: what is old enough
     * is a prefix (a writer racing a busy reader, whose epoch holds the global one back,
     * no longer rescans a long list on every call) */
    size_t k = 0;
    for (; k < s->nret && s->ret[k].epoch + 2 <= e; k++) {
        if ((uintptr_t)s->ret[k].p & RET_NODE)
            node_cache_put(s, (void *)((uintptr_t)s->ret[k].p & ~(uintptr_t)RET_NODE));
        else
            sl_free(s, s->ret[k].p);
    }
    if (k > 0 && k < s->nret)
        memmove(s->ret, s->ret + k, (s->nret - k) * sizeof(*s->ret));
    s->nret -= k;
    if (s->nret == 0) {
        sl_free(s, s->ret);
        s->ret = NULL;
        s->capret = 0;
    }
}
