/* index_int.h — what the index_*.c files share, private to src/index*.c (libuv's
 * internal.h): the structures, the atomics and fences, the spinlock, the lock order, and the
 * hot helpers as static inline. index_*.c are separate translation units, so whatever the
 * store, remove and find paths call per block from another file is defined here; what was
 * out of line before the split stays out of line (inlining kvr_ix_node_lock or
 * kvr_ix_cmap_get made remove slower). Overview and invariants: index.c; measurements:
 * docs/index.md. Functions one index file defines for another are named kvr_ix_* (the
 * public API is kvr_index_*), so no global symbol of libkvr.a lacks the project's prefix.
 *
 * ENTRIES
 * An entry (struct node, 32 bytes, from the slab) is keyed by its chain hash alone (the
 * namespace is folded into the chain's root, see ns_root; the position into the chain itself;
 * a flag marks position 0) and holds the parent's chain hash and the sorted set of holders
 * that have it (index_hset.c). A holder id is wid << 3 | tier, so the set sorted by id groups
 * a worker's tiers together. nchild, kept per holder in the set, counts the children of the
 * entry that the same holder holds (holes: index_write.c). kvr_index_stats' "entries" counts
 * these (namespace, position, chain) entries. Nodes never move, so readers and the reverse
 * maps keep plain pointers.
 *
 * CONCURRENCY
 * - Writers: one thread per worker at a time (index.h); different workers' writers run in
 *   parallel and meet on shared entries. A node is locked by its writer-side seqlock (seq
 *   odd = held; CAS from even), held for exactly one entry update. Finding-or-creating an
 *   entry and deleting the last holder take the shard's spinlock, then the node's; a node is
 *   marked dead and unlinked under both, so a node found under the shard lock is alive. Other
 *   updates (holders joining/leaving a shared entry, child counts) take only the node lock.
 * - Readers never lock: table slots are read with acquire loads (insert publishes a fully
 *   built node with a release store; delete writes a tombstone or, before an empty slot, 0;
 *   growth/shrink builds a new table and publishes its pointer; nothing in a published table
 *   moves), holder sets are read under the node's seqlock; (n, array pointer) are validated
 *   before the array is touched and the array's own capacity bounds the read. Scalar shared
 *   fields are accessed with atomics; holder-id runs are copied/compared with memcpy/memcmp
 *   and validated by the seqlock (in a TSAN build element-wise relaxed atomics, so TSAN sees
 *   no data race).
 * - What readers may still see is freed only after they cannot: epochs (index_ebr.c).
 * - Interning: one mutex for inserts, lock-free lookups (index_intern.c).
 *
 * LOCK ORDER (written down here only; every lock is held for one bounded step)
 *     shard -> slab -> node          and, apart from them, the interning mutex
 * - shard (struct shard.lock, a spinlock): a shard's table and its mask/shift copies: probe,
 *   insert, unlink, rebuild, publish. Under it a writer may take the slab lock (node_alloc
 *   refilling its slot's cache) or one node lock (joining an entry found, deleting the last
 *   holder). May allocate: the rebuilt table (tab_rebuild, bounded by the shard's contents).
 * - slab (struct slab.lock, a spinlock): the chunk lists and counts. May mmap, madvise and
 *   munmap one 2 MB chunk (a new one, an emptied one beyond the spare). Takes no other lock.
 * - node (struct node.seq, a writer seqlock): one entry's count, flags and holder set. May
 *   allocate: a holder array (kvr_ix_hs_add/kvr_ix_hs_del, the set doubling or halving).
 *   Takes no other lock. Slab and node are never held together: the order above is the total order both
 *   nestings (shard -> slab, shard -> node) fit.
 * - the interning mutex (ix->imu, a pthread mutex): interning inserts and removals, a pod's
 *   worker list, the deferred frees and free id lists of forgotten workers and pods. May
 *   allocate, free, advance the epoch (kvr_ix_ebr_advance: atomics only) and, waiting for a
 *   grace period when ids are needed, yield. Never held with, nor taken under, the locks
 *   above, and never taken by a thread inside an epoch (ebr_enter..ebr_exit), so waiting
 *   for the epoch under it cannot wait for itself.
 * - Under any of them: no kvr_log_* (KVR_ASSERT excepted: the process ends there), no other
 *   I/O, no sleeping or waiting except spinning on these same locks, and no kvr_ix_ebr_retire (it
 *   may grow its list and log): what a locked step replaces (a table, a holder array) is
 *   handed back and retired after unlocking.
 * - Readers take none of them; they spin only while a node's seq is odd (one entry update).
 */
#ifndef KVR_INDEX_INT_H
#define KVR_INDEX_INT_H

#include "index/index.h"

#include "index/hash.h"
#include "core/log.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- basics ------------------------------------------------------------------------- */

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define LDA(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define STR(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define ADD(x, v) ST((x), LD(x) + (v)) /* single-writer counters */

/* Fences order the seqlock and epoch protocols on weakly ordered CPUs. ThreadSanitizer does
 * not model fences (gcc refuses them); every shared access is atomic anyway, so in a TSAN
 * build they become no-ops and the epoch announcement stays a full barrier (xchg on x86). */
#if defined(__SANITIZE_THREAD__)
#define IX_FENCE(order) ((void)0)
#else
#define IX_FENCE(order) __atomic_thread_fence(order)
#endif

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#define SHARD_BITS 10
#define NSHARD (1u << SHARD_BITS)
#define SLOT_TOMB 1ull
#define PTR_MASK ((1ull << 48) - 1)
#define EBR_SLOTS 256
#define EBR_READER_SLOTS 192 /* the rest stay free for writer calls */
#define NS_CHUNK 1024
#define NS_CHUNKS 1024       /* up to 1M namespaces */
#define HOLDER(wid, tier) ((uint32_t)(wid) << 3 | (uint32_t)(tier))
#define H_WID(h) ((h) >> 3)
#define H_TIER(h) ((h) & 7u)

#define N_COUNT 0x1fffffffu
#define N_ROOT 0x20000000u /* immutable: the entry is at position 0 */
#define N_EXT 0x40000000u
#define N_DEAD 0x80000000u

/* ---- structures ---------------------------------------------------------------------- */

struct retired {
    void *p;
    uint64_t epoch;
};

struct ebr_slot {
    uint64_t epoch; /* atomic: 0 = quiescent, else the global epoch seen at entry */
    uint32_t owner; /* atomic: 0 free, 1 claimed */
    uint32_t reader; /* owner: claimed by a reader for its lifetime */
    /* owner only */
    struct retired *ret;
    size_t nret, capret;
    struct node *nfresh; /* nodes taken from chunks' free lists for this call */
    struct node *nnext;  /* nodes reclaimed during this call */
    struct node *rb, *re; /* a run of never-used nodes of one chunk, taken for this call */
    /* owner-written (relaxed), summed by stats */
    int64_t bytes, entries, pairs, orphans;
} __attribute__((aligned(64)));

struct hset {
    uint32_t cap; /* atomic (read by readers through an unvalidated pointer) */
    uint32_t pad;
    uint32_t v[]; /* atomic: v[0..cap) holder ids, sorted; v[cap..2 cap) their nchild */
};
#define HS_HID(hs) ((hs)->v)
#define HS_NCH(hs) ((hs)->v + LD((hs)->cap))

/* Copies and comparisons of holder-id runs. Readers run them under a node's seqlock and
 * validate it afterwards (a torn read is retried, never used); writers hold the node lock.
 * ThreadSanitizer builds go element by element with relaxed atomics (every shared access
 * atomic, as TSAN wants); others use memcpy/memmove/memcmp (vectorised). */
static inline void hv_move(uint32_t *dst, const uint32_t *src, uint32_t n)
{
#if defined(__SANITIZE_THREAD__)
    if (dst < src)
        for (uint32_t k = 0; k < n; k++)
            ST(dst[k], LD(src[k]));
    else
        for (uint32_t k = n; k-- > 0;)
            ST(dst[k], LD(src[k]));
#else
    if (n > 16) {
        memmove(dst, src, (size_t)n * sizeof(*dst));
    } else if (dst < src) { /* short runs (the usual shift in a holder array): no call */
        for (uint32_t k = 0; k < n; k++)
            dst[k] = src[k];
    } else {
        for (uint32_t k = n; k-- > 0;)
            dst[k] = src[k];
    }
#endif
}

static inline int hv_equal(const uint32_t *x, const uint32_t *a, uint32_t n)
{
#if defined(__SANITIZE_THREAD__)
    for (uint32_t k = 0; k < n; k++)
        if (LD(x[k]) != a[k])
            return 0;
    return 1;
#else
    return memcmp(x, a, (size_t)n * sizeof(*x)) == 0;
#endif
}

struct node {
    uint64_t chain;        /* key (namespace and position folded in, see ns_root); immutable */
    uint64_t parent_chain; /* immutable (unused at position 0) */
    uint32_t seq;          /* atomic: seqlock, odd while a writer holds the node */
    uint32_t n;            /* atomic: count | N_EXT | N_DEAD */
    uint64_t h;            /* atomic: inline element, or struct hset * when N_EXT */
};

#define NCHUNK (2u << 20) /* node slab chunk: size and alignment, one transparent huge page */
#define NCHUNK_HDR 64u
#define NCHUNK_NODES ((NCHUNK - NCHUNK_HDR) / sizeof(struct node))
_Static_assert(sizeof(struct node) == 32, "node: 32 bytes, two per cache line");

struct nchunk { /* header of a node chunk, NCHUNK_HDR bytes */
    struct nchunk *anext, *aprev; /* all chunks */
    struct nchunk *pnext, *pprev; /* chunks with room */
    struct node *free;
    uint32_t live, bump;
};

struct slab {
    uint32_t lock; /* spinlock */
    uint32_t pad;
    struct nchunk *all, *partial;
    struct nchunk *spare; /* one emptied chunk kept mapped (counted in bytes) */
} __attribute__((aligned(64)));

/* A slot's home is the top bits of the key hash (the shard is chosen by the low bits), and
 * its tag is the top 16 bits: a rebuild up to 2^16 slots places entries from the tags alone,
 * without touching the nodes. */
struct table {
    uint64_t mask;  /* immutable */
    uint32_t shift; /* immutable: 64 - log2(mask + 1) */
    uint32_t pad;
    uint64_t slot[]; /* atomic */
};

struct shard {
    uint32_t lock;       /* spinlock: writers creating/deleting entries here */
    uint32_t shift;      /* under lock: tab->shift (0 without a table) */
    struct table *tab;   /* atomic pointer; replaced under lock */
    uint64_t live, used; /* under lock */
    uint64_t mask;       /* under lock: tab->mask (writers probe without loading the table
                          * header, another cache line) */
} __attribute__((aligned(64)));

struct rec {
    uint64_t key; /* rec_key(engine hash): mix64 is a bijection, so keys compare like hashes */
    uint64_t nc; /* node pointer | copies << 48 (0xffff = more in holder.extra); 0 = empty */
};
#define REC_TOMB 1ull /* nc of a deleted record (a tombstone; a live nc is >= 1 << 48) */
#define REC_LIVE(r) ((r)->nc > REC_TOMB)
#define REC_ND(r) ((struct node *)(uintptr_t)((r)->nc & PTR_MASK))
#define REC_COPIES(r) ((uint32_t)((r)->nc >> 48))
#define COPIES_MAX 0xffffu

struct recmap {
    struct rec *s;
    uint32_t cap, n, tomb; /* tomb: deleted records still in probe runs */
};

struct cslot {
    uint64_t key, val; /* val 0 = empty */
};

struct cmap {
    struct cslot *s;
    uint32_t mask, n;
};

struct holder {
    struct recmap recs;  /* writer */
    struct cmap absent;  /* writer: key(ns, chain of a parent not held) -> held children */
    struct cmap alias;   /* writer: node pointer -> extra engine hashes */
    struct cmap extra;   /* writer: engine hash -> copies beyond COPIES_MAX */
    uint64_t blocks;     /* atomic: distinct engine hashes held */
    uint64_t holes;      /* atomic: held entries whose parent entry is not held */
};

struct parked {
    uint64_t eh, content, parent;
    uint32_t ns, tier;
};

struct worker {
    uint32_t pod_id, rank;          /* immutable */
    const char *pod;                /* immutable, owned by the pod */
    uint32_t podlen;                /* immutable: strlen(pod) */
    struct holder *h[KVR_TIER_MAX]; /* atomic pointers; created by the writer */
    /* writer only */
    struct parked *orph;
    uint32_t norph, corph;
    uint32_t porph;                 /* atomic: norph, published for readers */
    struct cmap awaited; /* parent engine hash -> parked blocks awaiting it */
};

struct pod {
    char *name;
    uint32_t *wids; /* under ix->imu */
    uint32_t nw, cw;
};

struct nsrec {
    uint64_t seed;
    const char *key;     /* the interning key (model \0 flag lora), owned by ns_tab's record;
                          * written before nns publishes the id (snapshots name namespaces) */
    uint32_t block_size; /* atomic */
};

struct irec {
    uint64_t h;
    uint32_t id, len;
    char s[];
};

struct itab {
    uint32_t mask, n; /* n: live records and tombstones */
    uint32_t ntomb;
    struct itab *old; /* ns_tab: replaced tables, kept until destroy (its lookups take no
                       * epoch); the worker and pod tables defer theirs (struct dfr) */
    struct irec *slot[]; /* atomic pointers; IREC_TOMB marks a removed key */
};

/* A removed interning key: lookups probe past it, inserts do not reuse it (a lock-free
 * lookup may be comparing the removed record; it is freed after a grace period). */
#define IREC_TOMB ((struct irec *)(uintptr_t)1)

/* What forgetting leaves for later (index_intern.c, FORGETTING): freed, and ids made
 * reusable, once the global epoch is two past `epoch`. Under ix->imu, in epoch order. */
enum { DFR_FREE = 0, DFR_WORKER = 1, DFR_POD = 2 };
struct dfr {
    void *p;
    uint64_t epoch;
    uint32_t kind, id;
};

struct kvr_index {
    struct kvr_index_opts o;
    struct shard *sh; /* NSHARD */
    uint64_t *tabw;   /* NSHARD, atomic: each shard's table pointer | shift << 56, one
                       * compact array readers keep in L1 (no table header to load) */

    struct slab slab;
    struct ebr_slot slots[EBR_SLOTS];
    uint64_t epoch;    /* atomic, starts at 1 */
    uint32_t nslots;   /* atomic: high-water mark of used slots */

    pthread_mutex_t imu; /* interning inserts */
    int64_t gbytes;      /* atomic: bytes of interning structures */
    struct itab *ns_tab, *w_tab, *pod_tab; /* atomic pointers */
    struct nsrec *ns_chunk[NS_CHUNKS];     /* atomic pointers */
    uint32_t nns;                          /* atomic */
    struct worker **workers;               /* max_workers; atomic pointers (NULL: free) */
    uint32_t nworkers;                     /* atomic: high-water mark of worker ids */
    struct pod **pods;                     /* max_workers; atomic pointers (NULL: free) */
    uint32_t npods;                        /* atomic: high-water mark of pod ids */
    uint32_t nlive, nlivepods;             /* atomic: workers and pods interned now */
    /* forgetting (under imu): deferred frees, then ids free for reuse */
    struct dfr *dfr;
    size_t ndfr, capdfr;
    uint32_t *wfree, nwfree; /* max_workers */
    uint32_t *pfree, npfree; /* max_workers */
    uint64_t forgotten;      /* atomic: workers forgotten */
    uint64_t refused;        /* atomic: workers refused, max_workers live (-ENOSPC) */
    char tier_names[KVR_TIER_MAX][KVR_NAME_MAX + 1];
    uint32_t ntiers; /* atomic */
    uint32_t *wslow;  /* max_workers; atomic: holders of the worker with holes > 0 */
    uint32_t *wpod;   /* max_workers; pod id of each worker (written before the worker is
                       * published) */
    uint32_t *wgen;   /* max_workers; atomic: a worker id's generation, even while published
                       * (advanced before each publication), odd once forgotten; readers
                       * cache each worker's name by it (index_find.c, name_hits) */
    uint64_t *pw;     /* KVR_HASH_CHAIN_MUL^i for i <= jump_stride */
};

/* ---- synchronization ---------------------------------------------------------------- */

/* Test-and-test-and-set spinlock shared by the slab and the shards: held for a few
 * instructions (one batch of nodes, one table slot), so spin briefly, then yield. */
static inline void spin_lock(uint32_t *lock)
{
    for (unsigned spins = 0;; spins++) {
        uint32_t z = 0;
        if (LD(*lock) == 0 && __atomic_compare_exchange_n(lock, &z, 1, true, __ATOMIC_ACQUIRE,
                                                          __ATOMIC_RELAXED))
            return;
        if (spins > 64)
            sched_yield();
        else
            cpu_relax();
    }
}

static inline void spin_unlock(uint32_t *lock)
{
    STR(*lock, 0u);
}

/* ---- memory accounting and epoch-based reclamation (index_ebr.c) ----------------------- */

static inline int64_t usable(void *p)
{
    return (int64_t)malloc_usable_size(p);
}

static inline void *sl_alloc(struct ebr_slot *s, size_t n)
{
    void *p = malloc(n);
    if (p != NULL)
        ADD(s->bytes, usable(p));
    return p;
}

static inline void *sl_calloc(struct ebr_slot *s, size_t n)
{
    void *p = calloc(1, n);
    if (p != NULL)
        ADD(s->bytes, usable(p));
    return p;
}

static inline void sl_free(struct ebr_slot *s, void *p)
{
    if (p == NULL)
        return;
    ADD(s->bytes, -usable(p));
    free(p);
}

static inline void *g_calloc(struct kvr_index *ix, size_t n)
{
    void *p = calloc(1, n);
    if (p != NULL)
        __atomic_fetch_add(&ix->gbytes, usable(p), __ATOMIC_RELAXED);
    return p;
}

static inline void g_free(struct kvr_index *ix, void *p)
{
    if (p == NULL)
        return;
    __atomic_fetch_sub(&ix->gbytes, usable(p), __ATOMIC_RELAXED);
    free(p);
}

struct ebr_slot *kvr_ix_slot_claim(struct kvr_index *ix, int reader);
void kvr_ix_ebr_retire(struct kvr_index *ix, struct ebr_slot *s, void *p);
void kvr_ix_ebr_reserve_slot(struct ebr_slot *s, size_t more);
void kvr_ix_ebr_reclaim(struct kvr_index *ix, struct ebr_slot *s);
uint64_t kvr_ix_ebr_advance(struct kvr_index *ix);

static inline void slot_release(struct ebr_slot *s)
{
    s->reader = 0;
    STR(s->owner, 0);
}

static inline void ebr_enter(struct kvr_index *ix, struct ebr_slot *s)
{
    (void)__atomic_exchange_n(&s->epoch, LD(ix->epoch), __ATOMIC_SEQ_CST);
    IX_FENCE(__ATOMIC_SEQ_CST);
}

static inline void ebr_exit(struct ebr_slot *s)
{
    STR(s->epoch, 0);
}

/* ---- the node slab (index_slab.c) ----------------------------------------------------- */

struct node *kvr_ix_node_refill(struct kvr_index *ix, struct ebr_slot *s);
void kvr_ix_node_cache_roll(struct kvr_index *ix, struct ebr_slot *s);

/* A node for a new entry, under the shard lock: from the slot's cached nodes or its bump run
 * without any lock (per entry created); the slab lock only to refill, once per batch. */
static inline struct node *node_alloc(struct kvr_index *ix, struct ebr_slot *s)
{
    struct node *x = s->nfresh;
    if (x != NULL) {
        memcpy(&s->nfresh, (void *)x, sizeof(s->nfresh));
        return x;
    }
    if (s->rb != s->re)
        return s->rb++;
    return kvr_ix_node_refill(ix, s);
}

/* Node memory: a free node's first word links it in a slot's cache. Nodes reclaimed at the
 * end of a writer call serve the next call on that slot; whatever that call does not use is
 * freed when it ends, so an idle index holds no cached nodes (memory follows contents). */
#define RET_NODE 1ull /* tag in a retired pointer: a node, recycled through the cache */

static inline void node_cache_put(struct ebr_slot *s, void *p)
{
    memcpy(p, (void *)&s->nnext, sizeof(s->nnext));
    s->nnext = p;
}

/* ---- nodes: the node lock and holder sets (index_hset.c) ------------------------------ */

void kvr_ix_node_lock(struct node *nd);
int kvr_ix_hs_add(struct ebr_slot *s, struct node *nd, uint32_t holder, uint32_t nchild,
           void **old);
int kvr_ix_hs_del(struct ebr_slot *s, struct node *nd, uint32_t holder, uint32_t *nchild,
           void **old);
int kvr_ix_hs_adj(struct node *nd, uint32_t holder, int delta);
uint32_t kvr_ix_hs_read_seq(const struct node *nd, uint32_t *buf, uint32_t *seq);

static inline uint64_t pack_el(uint32_t holder, uint32_t nchild)
{
    return (uint64_t)holder | (uint64_t)nchild << 32;
}

/* kvr_ix_node_lock with the uncontended acquisition inline: one CAS on the store and remove
 * fast paths; the contended loop stays out of line (inlining all of kvr_ix_node_lock made
 * remove slower). */
static inline void node_lock_fast(struct node *nd)
{
    uint32_t s = LD(nd->seq);
    if (!(s & 1) && __atomic_compare_exchange_n(&nd->seq, &s, s + 1, false, __ATOMIC_ACQUIRE,
                                                __ATOMIC_RELAXED)) {
        IX_FENCE(__ATOMIC_RELEASE);
        return;
    }
    kvr_ix_node_lock(nd);
}

static inline void node_unlock(struct node *nd)
{
    STR(nd->seq, LD(nd->seq) + 1);
}

/* Node locked: sets count and flags, keeping the immutable N_ROOT. */
#define N_SET(nd, v) ST((nd)->n, (v) | (LD((nd)->n) & N_ROOT))

static inline uint32_t el_holder(uint64_t e)
{
    return (uint32_t)e;
}

static inline uint32_t hs_read(const struct node *nd, uint32_t *buf)
{
    uint32_t seq;
    return kvr_ix_hs_read_seq(nd, buf, &seq);
}

/* ---- the writer-private maps (index_maps.c) -------------------------------------------- */

int kvr_ix_recmap_room(struct ebr_slot *s, struct recmap *m, size_t more);
void kvr_ix_recmap_del_slow(struct ebr_slot *s, struct recmap *m,
                     struct rec *r);
uint64_t kvr_ix_cmap_get(const struct cmap *m, uint64_t key);
int kvr_ix_cmap_add(struct ebr_slot *s, struct cmap *m, uint64_t key, int64_t delta);
void kvr_ix_cmap_free(struct ebr_slot *s, struct cmap *m);

static inline uint64_t rec_key(uint64_t eh)
{
    return kvr_hash_mix64(eh);
}

/* Home of a key (already mixed: a rehash needs no hashing). */
static inline uint32_t rec_home(const struct recmap *m, uint64_t key)
{
    return (uint32_t)(((unsigned __int128)key * m->cap) >> 64);
}

static inline uint32_t rec_next(const struct recmap *m, uint32_t i)
{
    return i + 1 == m->cap ? 0 : i + 1;
}

#ifndef RECMAP_LOAD
#define RECMAP_LOAD 7 /* max load, in eighths */
#endif

/* RECMAP_OWN_TOMB: a search for key may stop at a tombstone left by key itself. A tombstone
 * keeps its key, and key, when live, precedes every tombstone it left in its probe run: it
 * was deleted at that slot, and an insertion takes the first free slot (tombstone or empty)
 * of the run, so a later insertion of key lands there or before; nothing else moves a record
 * but a rehash, which clears all tombstones, and a slot is emptied only at the end of a run
 * (recmap_del), which takes the tombstones before it along. So the first slot holding key,
 * live or not, decides: lookups miss there, insertions take the first tombstone up to it.
 * Churn (a remove, then a store of the same blocks, as a full engine cache evicts and
 * recomputes) finds each block's own tombstone instead of walking to the end of a run that
 * tombstones keep long (docs/index.md, steady state). */

/* Grows once for `more` insertions ahead (a store of many blocks) when they cannot fit
 * even with every tombstone reused; tombstones alone never cause a rehash here (a store
 * after a remove usually reuses them: recmap_slot and store_fast take the first tombstone
 * of the probe run), the insertion that finds no tombstone and no room does. */
static inline void recmap_reserve(struct ebr_slot *s, struct recmap *m, size_t more)
{
    size_t need = (size_t)m->n + more;
    if (need * 8 > (size_t)m->cap * RECMAP_LOAD)
        (void)kvr_ix_recmap_room(s, m, more);
}

static inline struct rec *recmap_get_key(const struct recmap *m, uint64_t key)
{
    if (m->s == NULL)
        return NULL;
    uint32_t i = rec_home(m, key);
    while (m->s[i].nc != 0) {
        if (m->s[i].key == key) /* its own tombstone ends the search (RECMAP_OWN_TOMB) */
            return m->s[i].nc != REC_TOMB ? &m->s[i] : NULL;
        i = rec_next(m, i);
    }
    return NULL;
}

static inline struct rec *recmap_get(const struct recmap *m, uint64_t eh)
{
    return recmap_get_key(m, rec_key(eh));
}

/* Probe for key from a home computed ahead for the current capacity. */
static inline struct rec *recmap_get_at(const struct recmap *m, uint64_t key, uint32_t i)
{
    while (m->s[i].nc != 0) {
        if (m->s[i].key == key)
            return m->s[i].nc != REC_TOMB ? &m->s[i] : NULL;
        i = rec_next(m, i);
    }
    return NULL;
}

/* The live record of eh, or (not REC_LIVE) the free slot where it goes (the first
 * tombstone of its probe run, else the empty slot ending it), after making room for one
 * more; NULL when growing failed. Valid until the map changes; fill it with rec_fill. */
static inline struct rec *recmap_slot(struct ebr_slot *s, struct recmap *m, uint64_t key)
{
    if (m->s != NULL) {
        uint32_t i = rec_home(m, key), t = UINT32_MAX;
        for (; m->s[i].nc != 0; i = rec_next(m, i)) {
            if (m->s[i].key == key) {
                if (m->s[i].nc != REC_TOMB)
                    return &m->s[i];
                if (t == UINT32_MAX)
                    t = i;
                break; /* its own tombstone: key is not live further on (RECMAP_OWN_TOMB) */
            }
            if (m->s[i].nc == REC_TOMB && t == UINT32_MAX)
                t = i;
        }
        if (t != UINT32_MAX) /* reusing a tombstone needs no room */
            return &m->s[t];
        if ((size_t)(m->n + m->tomb + 1) * 8 <= (size_t)m->cap * RECMAP_LOAD)
            return &m->s[i];
    }
    /* no room: after making some (a rehash leaves no tombstones), the probe ends at an
     * empty slot within the max load */
    if (kvr_ix_recmap_room(s, m, 1) < 0)
        return NULL;
    return recmap_slot(s, m, key);
}

/* Fills the free slot r (from recmap_slot or a probe like it) with a new record. */
static inline void rec_fill(struct recmap *m, struct rec *r, uint64_t key, uint64_t nc)
{
    if (r->nc == REC_TOMB)
        m->tomb--;
    r->key = key;
    r->nc = nc;
    m->n++;
}

/* Deletes r: a tombstone (no record moves, so records looked up ahead stay valid until the
 * map is resized), or, before an empty slot, an empty slot with the tombstones just before
 * it; the map is rehashed smaller when an eighth full and tombstones are cleared whenever
 * it is rehashed. Inline for the usual tombstone (per block removed); the rarer half,
 * kvr_ix_recmap_del_slow, is out of line (index_maps.c). */
static inline void recmap_del(struct ebr_slot *s, struct recmap *m, struct rec *r)
{
    uint32_t i = (uint32_t)(r - m->s);
    r->nc = REC_TOMB;
    m->tomb++;
    m->n--;
    if (m->s[rec_next(m, i)].nc == 0 || (size_t)m->n * 8 < m->cap)
        kvr_ix_recmap_del_slow(s, m, r);
}

/* ---- the shard tables and entries (index_shard.c) ------------------------------------- */

struct table *kvr_ix_tab_unlink_locked(struct kvr_index *ix, struct ebr_slot *s, struct shard *sh,
                                struct node *x, uint64_t h);
int kvr_ix_entry_add(struct kvr_index *ix, struct ebr_slot *s, int root,
              uint64_t chain, uint64_t pchain, uint64_t h, uint32_t holder,
              uint32_t nchild, struct node **out, int *added);
uint32_t kvr_ix_entry_del(struct kvr_index *ix, struct ebr_slot *s, struct node *x,
                   uint32_t holder);

/* The chain hash of a prefix at position 0 starts from its namespace's root (the standard
 * KVR_HASH_CHAIN_ROOT for namespace 0; mix64 is a bijection, so roots differ): an entry's
 * chain hash alone is its key, as "equal chain hash = same namespace, position and prefix"
 * carries the same 2^-64 collision bound as equal chains at one position already did. */
static inline uint64_t ns_root(uint32_t ns)
{
    return KVR_HASH_CHAIN_ROOT ^ kvr_hash_mix64(ns);
}

static inline uint64_t key_hash(uint64_t chain)
{
    uint64_t h = chain;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static inline void shard_lock(struct shard *sh)
{
    spin_lock(&sh->lock);
}

static inline void shard_unlock(struct shard *sh)
{
    spin_unlock(&sh->lock);
}

static inline const struct table *tabw_get(const struct kvr_index *ix, uint64_t h,
                                           uint32_t *shift)
{
    uint64_t w = LDA(ix->tabw[h & (NSHARD - 1)]);
    *shift = (uint32_t)(w >> 56);
    return (const struct table *)(uintptr_t)(w & PTR_MASK);
}

/* Lock-free lookup (readers and writers inside an epoch). Inline: find calls it at every
 * landing and bisection probe, writers for a parent's entry. */
static inline struct node *tab_find(const struct kvr_index *ix, uint64_t chain, uint64_t h)
{
    uint32_t shift;
    const struct table *t = tabw_get(ix, h, &shift);
    if (t == NULL)
        return NULL;
    uint64_t mask = (~0ull) >> shift, i = h >> shift, tag = h >> 48;
    for (;;) {
        uint64_t v = LDA(t->slot[i]);
        if (v == 0)
            return NULL;
        if (v != SLOT_TOMB && (v >> 48) == tag) {
            const struct node *x = (const struct node *)(uintptr_t)(v & PTR_MASK);
            if (x->chain == chain)
                return (struct node *)x;
        }
        i = (i + 1) & mask;
    }
}

/* Prefetch stage 1: the table slot where key hash h starts probing. */
static inline void pf_slot(const struct kvr_index *ix, uint64_t h)
{
    uint32_t shift;
    const struct table *t = tabw_get(ix, h, &shift);
    if (t != NULL)
        __builtin_prefetch(&t->slot[h >> shift]);
}

/* Under the shard lock: probes sh's table t for the entry of chain (key hash h). Returns its
 * node, or NULL with *ins = the slot for a new entry (the first tombstone of the probe run,
 * else the empty slot that ends it). */
static inline struct node *tab_probe_locked(const struct shard *sh, const struct table *t,
                                            uint64_t h, uint64_t chain, uint64_t *ins)
{
    uint64_t mask = sh->mask, i = h >> sh->shift, tag = h >> 48, first = UINT64_MAX;
    for (;;) {
        uint64_t v = LD(t->slot[i]);
        if (v == 0) {
            *ins = first == UINT64_MAX ? i : first;
            return NULL;
        }
        if (v == SLOT_TOMB) {
            if (first == UINT64_MAX)
                first = i;
        } else if ((v >> 48) == tag) {
            struct node *y = (struct node *)(uintptr_t)(v & PTR_MASK);
            if (y->chain == chain)
                return y;
        }
        i = (i + 1) & mask;
    }
}

/* A fresh node (node_alloc) as the entry of chain (parent pchain; root: at position 0) held
 * by holder alone, nchild of its children held by holder too. Not yet visible to anyone. */
static inline void node_init(struct node *x, uint64_t chain, uint64_t pchain, int root,
                             uint32_t holder, uint32_t nchild)
{
    x->chain = chain;
    x->parent_chain = pchain;
    x->seq = 0;
    x->n = 1u | (root ? N_ROOT : 0u);
    x->h = pack_el(holder, nchild);
}

/* Under the shard lock: publishes the built node x in slot ins of sh's table t, the slot
 * tab_probe_locked gave for key hash h (a release store: readers see x whole). */
static inline void tab_insert_locked(struct shard *sh, struct table *t, uint64_t ins,
                                     struct node *x, uint64_t h)
{
    KVR_ASSERT(((uintptr_t)x >> 48) == 0);
    if (LD(t->slot[ins]) == 0)
        sh->used++;
    sh->live++;
    STR(t->slot[ins], (uint64_t)(uintptr_t)x | (h >> 48) << 48);
}

/* The key of a holder's `absent` count for children of the entry with this chain. */
static inline uint64_t absent_key(uint64_t chain)
{
    return chain;
}

/* Writer: +delta to holder's nchild in the entry; 1 when the holder holds it. */
static inline int entry_adj(struct node *x, uint32_t holder, int delta)
{
    kvr_ix_node_lock(x);
    int r = kvr_ix_hs_adj(x, holder, delta);
    node_unlock(x);
    return r;
}

/* ---- interning (index_intern.c) -------------------------------------------------------- */

void kvr_ix_itab_free(struct kvr_index *ix, struct itab *t, int recs);
void kvr_ix_worker_free(struct kvr_index *ix, struct worker *wk);
void kvr_ix_dfr_free_all(struct kvr_index *ix);

static inline struct worker *worker_get(const struct kvr_index *ix, uint32_t wid)
{
    if (wid >= LDA(ix->nworkers))
        return NULL;
    return LDA(ix->workers[wid]);
}

#endif
