/* assume.c — the assumed store of approximate mode (see assume.h for what it keeps and why).
 *
 * Layout: one pool of nodes addressed by 32-bit index (a free list threads the unused ones),
 * each on three structures at once:
 * - a chained hash table by (wid, key), for "is this block assumed already";
 * - its worker's list in touch order (head = most recent), for the per-worker cap;
 * - one global list in touch order, for expiry: times only grow, so the global tail is the
 *   oldest assumption of all and expiry costs O(expired).
 * Everything an operation may need is allocated before it changes anything, so -ENOMEM
 * leaves the store as it was.
 */
#include "events/assume.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index/hash.h"

#define NIL UINT32_MAX
#define POOL_MAX (UINT32_MAX - 1)

struct anode {
    uint64_t key;
    uint64_t parent;      /* the previous key of the chain it was touched in (root: none) */
    int64_t t;            /* last touch, ms */
    uint32_t wid;
    uint32_t root;        /* 1: block 0 of its chain, no parent */
    uint32_t hnext;       /* hash chain, or the free list */
    uint32_t wprev, wnext; /* worker list: prev = more recent */
    uint32_t gprev, gnext; /* global list: prev = more recent */
};

struct aworker {
    uint32_t head, tail; /* most and least recently touched */
    uint32_t count;
};

struct kvr_assume {
    struct anode *pool;
    uint32_t pool_cap, pool_hw, free_head, nfree;
    uint32_t *bucket; /* heads; nbucket is a power of two */
    uint32_t nbucket;
    struct aworker *w; /* by wid, grown on demand */
    uint32_t nw;
    uint32_t ghead, gtail;
    size_t count;
};

int kvr_assume_create(struct kvr_assume **out)
{
    struct kvr_assume *a = calloc(1, sizeof(*a));

    if (a == NULL)
        return -ENOMEM;
    a->free_head = a->ghead = a->gtail = NIL;
    *out = a;
    return 0;
}

void kvr_assume_destroy(struct kvr_assume *a)
{
    if (a == NULL)
        return;
    free(a->pool);
    free(a->bucket);
    free(a->w);
    free(a);
}

static inline uint32_t bucket_of(const struct kvr_assume *a, uint32_t wid, uint64_t key)
{
    return (uint32_t)kvr_hash_mix64(key ^ ((uint64_t)wid * 0x9e3779b97f4a7c15ull)) &
           (a->nbucket - 1);
}

static uint32_t find(const struct kvr_assume *a, uint32_t wid, uint64_t key)
{
    if (a->nbucket == 0)
        return NIL;
    for (uint32_t i = a->bucket[bucket_of(a, wid, key)]; i != NIL; i = a->pool[i].hnext)
        if (a->pool[i].key == key && a->pool[i].wid == wid)
            return i;
    return NIL;
}

/* Room for `need` more nodes, a worker record for wid, and a table at most fully loaded. */
static int reserve(struct kvr_assume *a, uint32_t wid, size_t need)
{
    if (wid >= a->nw) {
        uint32_t nw = a->nw ? a->nw : 64;
        while (nw <= wid)
            nw *= 2;
        struct aworker *w = realloc(a->w, (size_t)nw * sizeof(*w));
        if (w == NULL)
            return -ENOMEM;
        for (uint32_t i = a->nw; i < nw; i++)
            w[i] = (struct aworker){NIL, NIL, 0};
        a->w = w;
        a->nw = nw;
    }
    if ((size_t)(a->pool_cap - a->pool_hw) + a->nfree < need) {
        size_t cap = a->pool_cap ? (size_t)a->pool_cap * 2 : 1024;
        while (cap - a->pool_hw + a->nfree < need)
            cap *= 2;
        if (cap > POOL_MAX)
            cap = POOL_MAX;
        if (cap - a->pool_hw + a->nfree < need)
            return -ENOMEM;
        struct anode *p = realloc(a->pool, cap * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        a->pool = p;
        a->pool_cap = (uint32_t)cap;
    }
    if (a->count + need > a->nbucket) {
        uint32_t nb = a->nbucket ? a->nbucket : 1024;
        while (nb < a->count + need && nb < (1u << 31))
            nb *= 2;
        uint32_t *b = malloc((size_t)nb * sizeof(*b));
        if (b == NULL)
            return -ENOMEM;
        for (uint32_t i = 0; i < nb; i++)
            b[i] = NIL;
        free(a->bucket);
        a->bucket = b;
        a->nbucket = nb;
        for (uint32_t wi = 0; wi < a->nw; wi++) /* rehash: every held node, via its worker */
            for (uint32_t i = a->w[wi].head; i != NIL; i = a->pool[i].wnext) {
                uint32_t h = bucket_of(a, a->pool[i].wid, a->pool[i].key);
                a->pool[i].hnext = b[h];
                b[h] = i;
            }
    }
    return 0;
}

static void unlink_lists(struct kvr_assume *a, uint32_t i)
{
    struct anode *n = &a->pool[i];
    struct aworker *w = &a->w[n->wid];

    if (n->wprev != NIL)
        a->pool[n->wprev].wnext = n->wnext;
    else
        w->head = n->wnext;
    if (n->wnext != NIL)
        a->pool[n->wnext].wprev = n->wprev;
    else
        w->tail = n->wprev;
    if (n->gprev != NIL)
        a->pool[n->gprev].gnext = n->gnext;
    else
        a->ghead = n->gnext;
    if (n->gnext != NIL)
        a->pool[n->gnext].gprev = n->gprev;
    else
        a->gtail = n->gprev;
}

static void link_front(struct kvr_assume *a, uint32_t i)
{
    struct anode *n = &a->pool[i];
    struct aworker *w = &a->w[n->wid];

    n->wprev = NIL;
    n->wnext = w->head;
    if (w->head != NIL)
        a->pool[w->head].wprev = i;
    else
        w->tail = i;
    w->head = i;
    n->gprev = NIL;
    n->gnext = a->ghead;
    if (a->ghead != NIL)
        a->pool[a->ghead].gprev = i;
    else
        a->gtail = i;
    a->ghead = i;
}

static uint32_t node_new(struct kvr_assume *a, uint32_t wid, uint64_t key)
{
    uint32_t i, h;

    if (a->free_head != NIL) {
        i = a->free_head;
        a->free_head = a->pool[i].hnext;
        a->nfree--;
    } else {
        i = a->pool_hw++;
    }
    h = bucket_of(a, wid, key);
    a->pool[i] = (struct anode){.key = key, .wid = wid, .hnext = a->bucket[h]};
    a->bucket[h] = i;
    a->w[wid].count++;
    a->count++;
    return i;
}

/* Unlinks node i from all three structures and frees it; returns its key. */
static uint64_t node_del(struct kvr_assume *a, uint32_t i)
{
    struct anode *n = &a->pool[i];
    uint64_t key = n->key;
    uint32_t *pp = &a->bucket[bucket_of(a, n->wid, key)];

    while (*pp != i)
        pp = &a->pool[*pp].hnext;
    *pp = n->hnext;
    unlink_lists(a, i);
    a->w[n->wid].count--;
    a->count--;
    n->hnext = a->free_head;
    a->free_head = i;
    a->nfree++;
    return key;
}

int kvr_assume_touch(struct kvr_assume *a, uint32_t wid, const uint64_t *keys, size_t n,
                     int64_t now_ms, uint32_t max_blocks, size_t *first_new)
{
    size_t first;
    int rc;

    if (max_blocks == 0)
        max_blocks = 1;
    if (n > max_blocks)
        n = max_blocks;
    if (wid == NIL || (n > 0 && keys == NULL))
        return -EINVAL;
    for (first = 0; first < n && find(a, wid, keys[first]) != NIL; first++)
        ;
    *first_new = first;
    if ((rc = reserve(a, wid, n - first)) != 0)
        return rc;
    /* last block first: block 0 ends up the most recent of the chain */
    for (size_t k = n; k-- > 0;) {
        uint32_t i = find(a, wid, keys[k]);
        if (i == NIL)
            i = node_new(a, wid, keys[k]);
        else
            unlink_lists(a, i);
        a->pool[i].t = now_ms;
        a->pool[i].root = k == 0;
        a->pool[i].parent = k > 0 ? keys[k - 1] : 0;
        link_front(a, i);
    }
    return (int)n;
}

size_t kvr_assume_evict(struct kvr_assume *a, uint32_t wid, uint32_t max_blocks, uint64_t *out,
                        size_t cap)
{
    size_t k = 0;

    if (wid >= a->nw)
        return 0;
    while (k < cap && a->w[wid].count > max_blocks)
        out[k++] = node_del(a, a->w[wid].tail);
    return k;
}

size_t kvr_assume_expire(struct kvr_assume *a, int64_t before_ms, struct kvr_assume_pair *out,
                         size_t cap)
{
    size_t k = 0;

    while (k < cap && a->gtail != NIL && a->pool[a->gtail].t < before_ms) {
        out[k].wid = a->pool[a->gtail].wid;
        out[k++].key = node_del(a, a->gtail);
    }
    return k;
}

int64_t kvr_assume_oldest(const struct kvr_assume *a)
{
    return a->gtail != NIL ? a->pool[a->gtail].t : INT64_MAX;
}

size_t kvr_assume_confirm(struct kvr_assume *a, uint32_t wid, uint64_t key, uint64_t *out,
                          size_t cap)
{
    size_t k = 0;
    uint32_t i;

    while (k < cap && (i = find(a, wid, key)) != NIL) {
        int root = a->pool[i].root;
        key = a->pool[i].parent;
        out[k++] = node_del(a, i);
        if (root)
            break;
    }
    return k;
}

size_t kvr_assume_drop_worker(struct kvr_assume *a, uint32_t wid)
{
    size_t k = 0;

    if (wid >= a->nw)
        return 0;
    while (a->w[wid].head != NIL) {
        node_del(a, a->w[wid].head);
        k++;
    }
    return k;
}

size_t kvr_assume_worker_count(const struct kvr_assume *a, uint32_t wid)
{
    return wid < a->nw ? a->w[wid].count : 0;
}

size_t kvr_assume_count(const struct kvr_assume *a)
{
    return a->count;
}

int kvr_assume_holds(const struct kvr_assume *a, uint32_t wid, uint64_t key)
{
    return find(a, wid, key) != NIL;
}

size_t kvr_assume_bytes(const struct kvr_assume *a)
{
    return sizeof(*a) + (size_t)a->pool_cap * sizeof(struct anode) +
           (size_t)a->nbucket * sizeof(uint32_t) + (size_t)a->nw * sizeof(struct aworker);
}
