/* index_slab.c — the node slab, where entries' nodes come from.
 *
 * Nodes are created and deleted per block, so they come from 2 MB aligned chunks rather than
 * malloc: each chunk an anonymous mapping advised MADV_HUGEPAGE (a node's chunk is its
 * address rounded down), with a free list, a bump index and a live count, under one spinlock
 * (the slab lock; what may run under it: index_int.h). Writers take a run of up to NODE_RUN
 * never-used nodes of a chunk's bump area (two pointers in their slot), or when the chunk has
 * a free list a batch of NODE_BATCH from it, and give back the unused and the reclaimed ones
 * when the call ends (an unused run still at its chunk's bump end in one step): one lock
 * acquisition per batch, not per node; node_alloc, per entry created, is inline in
 * index_int.h. A chunk is unmapped when its last node comes back, except one emptied chunk
 * kept as a spare (counted in bytes), so memory follows contents. What the huge pages save
 * and what their first touch costs: docs/index.md, growth.
 */
#include "index/index_int.h"

static struct nchunk *nchunk_of(void *x)
{
    return (struct nchunk *)((uintptr_t)x & ~(uintptr_t)(NCHUNK - 1));
}

static void slab_lock(struct slab *sb)
{
    spin_lock(&sb->lock);
}

static void slab_unlock(struct slab *sb)
{
    spin_unlock(&sb->lock);
}

static void chunk_link(struct nchunk **head, struct nchunk *c, int partial)
{
    struct nchunk **nx = partial ? &c->pnext : &c->anext, **pv = partial ? &c->pprev : &c->aprev;
    *nx = *head;
    *pv = NULL;
    if (*head != NULL)
        *(partial ? &(*head)->pprev : &(*head)->aprev) = c;
    *head = c;
}

static void chunk_unlink(struct nchunk **head, struct nchunk *c, int partial)
{
    struct nchunk *nx = partial ? c->pnext : c->anext, *pv = partial ? c->pprev : c->aprev;
    if (pv != NULL)
        *(partial ? &pv->pnext : &pv->anext) = nx;
    else
        *head = nx;
    if (nx != NULL)
        *(partial ? &nx->pprev : &nx->aprev) = pv;
}

/* A chunk is a 2 MB-aligned anonymous mapping advised as a transparent huge page: one TLB
 * entry covers 65534 nodes (with 4 KB pages every new node page was a fault and the table
 * walks of random nodes missed the TLB). bytes count the whole mapping. */
static struct nchunk *chunk_map(struct ebr_slot *s)
{
    size_t len = 2 * (size_t)NCHUNK;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)p + NCHUNK - 1) & ~(uintptr_t)(NCHUNK - 1);
    size_t head = a - (uintptr_t)p, tail = len - head - NCHUNK;
    if (head)
        (void)munmap(p, head);
    if (tail)
        (void)munmap((char *)a + NCHUNK, tail);
#ifdef MADV_HUGEPAGE
    (void)madvise((void *)a, NCHUNK, MADV_HUGEPAGE);
#endif
    ADD(s->bytes, (int64_t)NCHUNK);
    return (struct nchunk *)a;
}

static void chunk_unmap(struct ebr_slot *s, struct nchunk *c)
{
    ADD(s->bytes, -(int64_t)NCHUNK);
    (void)munmap(c, NCHUNK);
}

/* Slab locked: a chunk with room (the spare or a new chunk if none), NULL on ENOMEM. */
static struct nchunk *slab_room_locked(struct slab *sb, struct ebr_slot *s)
{
    struct nchunk *c = sb->partial;
    if (c == NULL) {
        if ((c = sb->spare) != NULL)
            sb->spare = NULL;
        else if ((c = chunk_map(s)) == NULL)
            return NULL;
        c->free = NULL;
        c->live = 0;
        c->bump = 0;
        chunk_link(&sb->all, c, 0);
        chunk_link(&sb->partial, c, 1);
    }
    return c;
}

/* Slab locked: one node from a chunk with room (the spare or a new chunk if none), NULL on
 * ENOMEM. */
static struct node *slab_take_locked(struct slab *sb, struct ebr_slot *s)
{
    struct nchunk *c = slab_room_locked(sb, s);
    if (c == NULL)
        return NULL;
    struct node *x;
    if (c->free != NULL) {
        x = c->free;
        memcpy(&c->free, (void *)x, sizeof(c->free));
    } else {
        x = (struct node *)((char *)c + NCHUNK_HDR) + c->bump++;
    }
    if (++c->live == NCHUNK_NODES)
        chunk_unlink(&sb->partial, c, 1);
    return x;
}

/* Slab locked: gives x back. A chunk that empties becomes the spare (one chunk kept, so a
 * small index churning around a chunk boundary does not map and zero 2 MB per call); a
 * second one is unmapped. */
static void slab_put_locked(struct slab *sb, struct ebr_slot *s, struct node *x)
{
    struct nchunk *c = nchunk_of(x);
    if (c->live == NCHUNK_NODES)
        chunk_link(&sb->partial, c, 1);
    if (--c->live == 0) {
        chunk_unlink(&sb->partial, c, 1);
        chunk_unlink(&sb->all, c, 0);
        if (sb->spare == NULL)
            sb->spare = c;
        else
            chunk_unmap(s, c);
        return;
    }
    memcpy((void *)x, &c->free, sizeof(c->free));
    c->free = x;
}

#define NODE_BATCH 64
#define NODE_RUN 256

struct node *kvr_ix_node_refill(struct kvr_index *ix, struct ebr_slot *s)
{
    struct slab *sb = &ix->slab;
    slab_lock(sb);
    /* a chunk with no free list but never-used room: take a run of its bump area (one
     * pointer pair, given back in one step at the end of the call if unused) */
    struct nchunk *c = slab_room_locked(sb, s);
    if (c != NULL && c->free == NULL && c->bump < NCHUNK_NODES) {
        uint32_t k = (uint32_t)NCHUNK_NODES - c->bump;
        if (k > NODE_RUN)
            k = NODE_RUN;
        s->rb = (struct node *)((char *)c + NCHUNK_HDR) + c->bump;
        s->re = s->rb + k;
        c->bump += k;
        c->live += k;
        if (c->live == NCHUNK_NODES)
            chunk_unlink(&sb->partial, c, 1);
        slab_unlock(sb);
        return s->rb++;
    }
    for (int k = 0; c != NULL && k < NODE_BATCH; k++) {
        struct node *y = slab_take_locked(sb, s);
        if (y == NULL)
            break;
        memcpy((void *)y, &s->nfresh, sizeof(s->nfresh));
        s->nfresh = y;
    }
    slab_unlock(sb);
    struct node *x = s->nfresh;
    if (x != NULL)
        memcpy(&s->nfresh, (void *)x, sizeof(s->nfresh));
    return x;
}

/* End of a writer call: the slot's unused and reclaimed nodes go back to the slab. */
void kvr_ix_node_cache_roll(struct kvr_index *ix, struct ebr_slot *s)
{
    if (s->nfresh == NULL && s->nnext == NULL && s->rb == s->re)
        return;
    struct slab *sb = &ix->slab;
    slab_lock(sb);
    if (s->rb != s->re) {
        struct nchunk *c = nchunk_of(s->rb);
        uint32_t k = (uint32_t)(s->re - s->rb);
        if ((struct node *)((char *)c + NCHUNK_HDR) + c->bump == s->re && c->live > k) {
            /* still the chunk's bump end: give the run back in one step */
            if (c->live == NCHUNK_NODES)
                chunk_link(&sb->partial, c, 1);
            c->bump -= k;
            c->live -= k;
        } else {
            for (struct node *x = s->rb; x != s->re; x++)
                slab_put_locked(sb, s, x);
        }
        s->rb = s->re = NULL;
    }
    for (int pass = 0; pass < 2; pass++) {
        struct node *x = pass ? s->nnext : s->nfresh;
        while (x != NULL) {
            struct node *nx;
            memcpy(&nx, (void *)x, sizeof(nx));
            slab_put_locked(sb, s, x);
            x = nx;
        }
    }
    slab_unlock(sb);
    s->nfresh = s->nnext = NULL;
}
