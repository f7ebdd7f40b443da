/* index_maps.c — the per-holder maps, writer-private (one writer per worker: no locks).
 *
 * - recs, the reverse map: engine hash -> node pointer | copies << 48 (16 bytes a block),
 *   stored under mix64 of the engine hash (a bijection, so a rehash reads homes off the
 *   stored keys); copies past 65535 overflow into the holder's `extra` cmap, keyed the same
 *   way. Open addressing over any capacity (home = multiply-high of the key), doubling at 7/8
 *   load counting tombstones, shrinking to 7/16 full when an eighth full. A deletion leaves a
 *   tombstone (nothing moves: records looked up ahead stay valid until a resize), or before an
 *   empty slot empties its slot and the tombstones just before it; an insertion takes the
 *   first tombstone of its probe run (a block stored again after its removal finds its own, so
 *   churn never rehashes); a rehash clears them.
 * - cmap, a counting map (key -> count, 0 = none; power-of-two capacity, max load 3/4,
 *   backward-shift deletion): a holder's `absent` (chain-keyed counts of held children whose
 *   parent entry the holder does not hold), `alias` (extra engine hashes that map to an entry
 *   the holder already holds: vLLM cache_salt / multimodal blocks, same tokens, different
 *   engine hash) and `extra`; a worker's `awaited` (orphans, index_write.c).
 * What store and remove call per block is static inline in index_int.h; growth, shrinking and
 * the counting maps are here. tests/unit/test_index_maps.c checks both against a model. Why
 * these load factors, and the populated doublings: docs/index.md, growth.
 */
#include "index/index_int.h"

#ifndef POP_MIN
#define POP_MIN (16u << 10) /* sl_calloc_pop: smaller arrays are calloc'd */
#endif

/* sl_calloc for an array that a growing table fills right away (a rehash): its whole pages
 * are faulted in one madvise(MADV_POPULATE_WRITE) instead of one trap per 4 KB page as the
 * rehash writes them. calloc leaves memory fresh from the kernel (its own mappings, a new
 * heap top) untouched, so the pages are cleared once, by the kernel; memory it reuses it
 * clears itself, and then the madvise only walks present pages (a doubling to 150 KB took
 * half the time: docs/index.md, growth). */
static void *sl_calloc_pop(struct ebr_slot *s, size_t n)
{
    void *p = sl_calloc(s, n);
#ifdef MADV_POPULATE_WRITE
    if (p != NULL && n >= POP_MIN) {
        uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
        uintptr_t e = ((uintptr_t)p + n) & ~(uintptr_t)4095;
        if (e > a) /* a failure only leaves the faults to the rehash */
            (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
    }
#endif
    return p;
}

static int recmap_resize(struct ebr_slot *s, struct recmap *m, uint32_t cap)
{
    struct recmap nm = {NULL, cap, m->n, 0};
    if (cap > 0) {
        nm.s = cap > m->cap ? sl_calloc_pop(s, (size_t)cap * sizeof(*nm.s))
                            : sl_calloc(s, (size_t)cap * sizeof(*nm.s));
        if (nm.s == NULL)
            return -ENOMEM;
        for (uint32_t i = 0; i < m->cap; i++) {
            if (!REC_LIVE(&m->s[i]))
                continue;
            uint32_t j = rec_home(&nm, m->s[i].key);
            while (nm.s[j].nc != 0)
                j = rec_next(&nm, j);
            nm.s[j] = m->s[i];
        }
    }
    sl_free(s, m->s);
    *m = nm;
    return 0;
}

#ifndef RECMAP_GROW
#define RECMAP_GROW 8 /* growth factor, in quarters */
#endif

static inline uint32_t rec_cap_for(size_t need)
{
    size_t cap = need * 8 / RECMAP_LOAD + 1;
    return (uint32_t)(cap < 8 ? 8 : cap);
}

/* Makes room for `more` insertions (records and tombstones stay within the max load): a
 * map whose tombstones are at least a quarter of the max load is rehashed at the same
 * capacity, otherwise it grows geometrically. */
int kvr_ix_recmap_room(struct ebr_slot *s, struct recmap *m, size_t more)
{
    size_t need = (size_t)m->n + more;
    if (need > (1u << 30))
        return -ENOMEM;
    if ((need + m->tomb) * 8 <= (size_t)m->cap * RECMAP_LOAD)
        return 0;
    if (need * 32 <= (size_t)m->cap * RECMAP_LOAD * 3)
        return recmap_resize(s, m, m->cap);
    size_t grown = (size_t)m->cap * RECMAP_GROW / 4 * RECMAP_LOAD / 8 + 1; /* geometric */
    return recmap_resize(s, m, rec_cap_for(need > grown ? need : grown));
}

/* recmap_del's rarer half: the slot before an empty one, and shrinking. */
__attribute__((noinline)) void kvr_ix_recmap_del_slow(struct ebr_slot *s, struct recmap *m,
                                               struct rec *r)
{
    uint32_t cap = m->cap, i = (uint32_t)(r - m->s);
    if (m->s[rec_next(m, i)].nc == 0) {
        /* the next slot is empty, so no probe passes here: empty this slot and the
         * tombstones just before it */
        r->nc = 0;
        m->tomb--;
        for (i = i == 0 ? cap - 1 : i - 1; m->s[i].nc == REC_TOMB; i = i == 0 ? cap - 1 : i - 1) {
            m->s[i].nc = 0;
            m->tomb--;
        }
    }
    if (m->n == 0)
        (void)recmap_resize(s, m, 0);
    else if (cap > 8 && (size_t)m->n * 8 < cap)
        (void)recmap_resize(s, m, rec_cap_for((size_t)m->n * 2));
}

static int cmap_resize(struct ebr_slot *s, struct cmap *m, uint32_t cap)
{
    struct cslot *ns = NULL;
    if (cap > 0) {
        ns = sl_calloc(s, (size_t)cap * sizeof(*ns));
        if (ns == NULL)
            return -ENOMEM;
        for (uint32_t i = 0; m->s != NULL && i <= m->mask; i++) {
            if (m->s[i].val == 0)
                continue;
            uint32_t j = (uint32_t)kvr_hash_mix64(m->s[i].key) & (cap - 1);
            while (ns[j].val != 0)
                j = (j + 1) & (cap - 1);
            ns[j] = m->s[i];
        }
    }
    sl_free(s, m->s);
    m->s = ns;
    m->mask = cap ? cap - 1 : 0;
    return 0;
}

uint64_t kvr_ix_cmap_get(const struct cmap *m, uint64_t key)
{
    if (m->s == NULL)
        return 0;
    uint32_t i = (uint32_t)kvr_hash_mix64(key) & m->mask;
    while (m->s[i].val != 0) {
        if (m->s[i].key == key)
            return m->s[i].val;
        i = (i + 1) & m->mask;
    }
    return 0;
}

static void cmap_del_at(struct ebr_slot *s, struct cmap *m, uint32_t i)
{
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->s[j].val == 0)
            break;
        uint32_t k = (uint32_t)kvr_hash_mix64(m->s[j].key) & m->mask;
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].val = 0;
    m->n--;
    uint32_t cap = m->mask + 1;
    if (m->n == 0)
        (void)cmap_resize(s, m, 0);
    else if (cap > 8 && m->n * 8 < cap)
        (void)cmap_resize(s, m, cap / 2);
}

/* Adds delta to key's count (deleting it at 0). The count must not go negative. */
int kvr_ix_cmap_add(struct ebr_slot *s, struct cmap *m, uint64_t key, int64_t delta)
{
    if (m->s != NULL) {
        uint32_t i = (uint32_t)kvr_hash_mix64(key) & m->mask;
        while (m->s[i].val != 0) {
            if (m->s[i].key == key) {
                KVR_ASSERT(delta >= 0 || m->s[i].val >= (uint64_t)-delta);
                m->s[i].val += (uint64_t)delta;
                if (m->s[i].val == 0)
                    cmap_del_at(s, m, i);
                return 0;
            }
            i = (i + 1) & m->mask;
        }
    }
    KVR_ASSERT(delta >= 0);
    if (delta == 0)
        return 0;
    if (m->s == NULL || (m->n + 1) * 4 > (m->mask + 1) * 3) {
        int rc = cmap_resize(s, m, m->s ? (m->mask + 1) * 2 : 8);
        if (rc < 0)
            return rc;
    }
    uint32_t i = (uint32_t)kvr_hash_mix64(key) & m->mask;
    while (m->s[i].val != 0)
        i = (i + 1) & m->mask;
    m->s[i].key = key;
    m->s[i].val = (uint64_t)delta;
    m->n++;
    return 0;
}

void kvr_ix_cmap_free(struct ebr_slot *s, struct cmap *m)
{
    sl_free(s, m->s);
    memset(m, 0, sizeof(*m));
}
