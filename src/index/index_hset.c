/* index_hset.c — an entry's holder set, and the node lock that guards it.
 *
 * One holder is stored inline in the node (holder | nchild << 32); two or more live in a
 * separately allocated array (struct hset) that grows and shrinks by halves (a system-prompt
 * block held by 16k holders costs 8 bytes a holder, a private block nothing beyond the node):
 * the sorted holder ids first, their nchild in a parallel array behind them, so find compares
 * and copies holder runs with memcmp/memcpy (hv_move/hv_equal, index_int.h).
 * Writers change a set with the node locked (kvr_ix_node_lock, the contended loop, is here
 * and out of line; the uncontended acquisition is inline in index_int.h) and get a replaced
 * array back, to retire after unlocking. Readers copy a set under the seqlock
 * (kvr_ix_hs_read_seq) and retry when it moved; a torn read is never used.
 */
#include "index/index_int.h"

void kvr_ix_node_lock(struct node *nd)
{
    for (unsigned spins = 0;; spins++) {
        uint32_t s = LD(nd->seq);
        if (!(s & 1) && __atomic_compare_exchange_n(&nd->seq, &s, s + 1, true,
                                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
        if (spins > 64)
            sched_yield();
        else
            cpu_relax();
    }
    IX_FENCE(__ATOMIC_RELEASE);
}

/* Lower bound of holder in e[0..n). */
static inline uint32_t hs_lb(const uint32_t *e, uint32_t n, uint32_t holder)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (LD(e[mid]) < holder)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct hset *hs_new(struct ebr_slot *s, uint32_t cap)
{
    struct hset *hs = sl_alloc(s, sizeof(*hs) + 2 * (size_t)cap * sizeof(uint32_t));
    if (hs != NULL)
        ST(hs->cap, cap);
    return hs;
}

/* Node locked. Adds holder: 1 added, 0 already there, -ENOMEM. *old gets an array to
 * retire after unlocking. */
int kvr_ix_hs_add(struct ebr_slot *s, struct node *nd, uint32_t holder, uint32_t nchild,
           void **old)
{
    uint32_t n = LD(nd->n), cnt = n & N_COUNT;

    if (cnt == 0) {
        ST(nd->h, pack_el(holder, nchild));
        N_SET(nd, 1u);
        return 1;
    }
    if (!(n & N_EXT)) {
        uint64_t one = LD(nd->h);
        if (el_holder(one) == holder)
            return 0;
        struct hset *hs = hs_new(s, 4);
        if (hs == NULL)
            return -ENOMEM;
        uint32_t *hh = HS_HID(hs), *nc = HS_NCH(hs), lo = el_holder(one) < holder;
        ST(hh[!lo], el_holder(one));
        ST(nc[!lo], (uint32_t)(one >> 32));
        ST(hh[lo], holder);
        ST(nc[lo], nchild);
        ST(nd->h, (uint64_t)(uintptr_t)hs);
        N_SET(nd, 2u | N_EXT);
        return 1;
    }
    struct hset *hs = (struct hset *)(uintptr_t)LD(nd->h);
    uint32_t *hh = HS_HID(hs), *nc = HS_NCH(hs);
    /* joining after every present holder (ids assigned in order) needs no search */
    uint32_t i = LD(hh[cnt - 1]) < holder ? cnt : hs_lb(hh, cnt, holder);
    if (i < cnt && LD(hh[i]) == holder)
        return 0;
    if (cnt == LD(hs->cap)) {
        struct hset *nh = hs_new(s, LD(hs->cap) * 2);
        if (nh == NULL)
            return -ENOMEM;
        uint32_t *nhh = HS_HID(nh), *nnc = HS_NCH(nh);
        hv_move(nhh, hh, i);
        hv_move(nhh + i + 1, hh + i, cnt - i);
        hv_move(nnc, nc, i);
        hv_move(nnc + i + 1, nc + i, cnt - i);
        ST(nhh[i], holder);
        ST(nnc[i], nchild);
        ST(nd->h, (uint64_t)(uintptr_t)nh);
        *old = hs;
    } else {
        hv_move(hh + i + 1, hh + i, cnt - i);
        hv_move(nc + i + 1, nc + i, cnt - i);
        ST(hh[i], holder);
        ST(nc[i], nchild);
    }
    N_SET(nd, (cnt + 1) | N_EXT);
    return 1;
}

/* Node locked. Removes holder: 1 removed (*nchild set), 0 absent. */
int kvr_ix_hs_del(struct ebr_slot *s, struct node *nd, uint32_t holder, uint32_t *nchild,
           void **old)
{
    uint32_t n = LD(nd->n), cnt = n & N_COUNT;

    if (cnt == 0)
        return 0;
    if (!(n & N_EXT)) {
        uint64_t one = LD(nd->h);
        if (el_holder(one) != holder)
            return 0;
        *nchild = (uint32_t)(one >> 32);
        N_SET(nd, 0u);
        return 1;
    }
    struct hset *hs = (struct hset *)(uintptr_t)LD(nd->h);
    uint32_t *hh = HS_HID(hs), *nc = HS_NCH(hs);
    uint32_t i = hs_lb(hh, cnt, holder);
    if (i >= cnt || LD(hh[i]) != holder)
        return 0;
    *nchild = LD(nc[i]);
    uint32_t cap = LD(hs->cap);
    if (cnt == 2) {
        ST(nd->h, pack_el(LD(hh[1 - i]), LD(nc[1 - i])));
        N_SET(nd, 1u);
        *old = hs;
        return 1;
    }
    if (cap > 4 && cnt - 1 <= cap / 4) {
        struct hset *nh = hs_new(s, cap / 2);
        if (nh != NULL) {
            uint32_t *nhh = HS_HID(nh), *nnc = HS_NCH(nh);
            hv_move(nhh, hh, i);
            hv_move(nhh + i, hh + i + 1, cnt - i - 1);
            hv_move(nnc, nc, i);
            hv_move(nnc + i, nc + i + 1, cnt - i - 1);
            ST(nd->h, (uint64_t)(uintptr_t)nh);
            N_SET(nd, (cnt - 1) | N_EXT);
            *old = hs;
            return 1;
        }
        /* no memory to shrink: keep the big array */
    }
    hv_move(hh + i, hh + i + 1, cnt - i - 1);
    hv_move(nc + i, nc + i + 1, cnt - i - 1);
    N_SET(nd, (cnt - 1) | N_EXT);
    return 1;
}

/* Node locked. Adds delta to the holder's nchild; returns 1 when the holder is there. */
int kvr_ix_hs_adj(struct node *nd, uint32_t holder, int delta)
{
    uint32_t n = LD(nd->n), cnt = n & N_COUNT;

    if (cnt == 0 || (n & N_DEAD))
        return 0;
    if (!(n & N_EXT)) {
        uint64_t e = LD(nd->h);
        if (el_holder(e) != holder)
            return 0;
        uint32_t c = (uint32_t)(e >> 32);
        KVR_ASSERT(delta > 0 || c >= (uint32_t)-delta);
        ST(nd->h, pack_el(holder, c + (uint32_t)delta));
        return 1;
    }
    struct hset *hs = (struct hset *)(uintptr_t)LD(nd->h);
    uint32_t *hh = HS_HID(hs);
    uint32_t i = hs_lb(hh, cnt, holder);
    if (i >= cnt || LD(hh[i]) != holder)
        return 0;
    uint32_t *p = &HS_NCH(hs)[i], c = LD(*p);
    KVR_ASSERT(delta > 0 || c >= (uint32_t)-delta);
    ST(*p, c + (uint32_t)delta);
    return 1;
}

/* Reader side: copies the holder ids of nd into buf; returns their count. *seq gets the
 * node's (even) sequence number the copy is consistent with. */
uint32_t kvr_ix_hs_read_seq(const struct node *nd, uint32_t *buf, uint32_t *seq)
{
    for (;;) {
        uint32_t s1 = LDA(nd->seq);
        if (s1 & 1) {
            cpu_relax();
            continue;
        }
        uint32_t n = LD(nd->n);
        uint64_t h = LD(nd->h);
        IX_FENCE(__ATOMIC_ACQUIRE);
        if (LD(nd->seq) != s1)
            continue;
        uint32_t cnt = n & N_COUNT, k = 0;
        *seq = s1;
        if ((n & N_DEAD) || cnt == 0)
            return 0;
        if (!(n & N_EXT)) {
            buf[0] = el_holder(h);
            return 1;
        }
        const struct hset *hs = (const struct hset *)(uintptr_t)h;
        uint32_t cap = LD(hs->cap);
        if (cnt > cap)
            cnt = cap;
        hv_move(buf, hs->v, cnt);
        k = cnt;
        IX_FENCE(__ATOMIC_ACQUIRE);
        if (LD(nd->seq) == s1)
            return k;
    }
}
