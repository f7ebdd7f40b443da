/* index.c — the positional index (see index.h for the contract).
 *
 * DATA
 * - Entry (struct node): key (namespace, position, chain hash), plus the parent's chain hash
 *   and the sorted set of holders that have it. A holder id is wid << 3 | tier, so the set
 *   sorted by id groups a worker's tiers together. One holder is stored inline in the node
 *   (8 bytes); two or more live in a separately allocated sorted array (struct hset) that
 *   grows and shrinks by halves. Each element is holder | nchild << 32, where nchild counts
 *   the children of this entry that the same holder holds (hole accounting, below).
 * - Main table: 1024 shards by key hash, each an open-addressing table of 8-byte slots
 *   (node pointer | 16-bit tag << 48, 0 empty, 1 tombstone). Nodes never move, so readers
 *   and the reverse maps keep plain pointers.
 * - Per holder (worker, tier), writer-private: recs, the reverse map engine hash -> {node,
 *   copies}; absent, chain-keyed counts of held children whose parent entry the holder does
 *   not hold; alias, extra engine hashes that map to an entry the holder already holds
 *   (vLLM cache_salt / multimodal blocks: same tokens, different engine hash). Membership
 *   of a holder in an entry = 1 + alias count; it ends with the last engine hash.
 * - The chain hash is never the engine's hash: store computes chain = kvr_hash_chain(parent
 *   entry's chain, content) with the parent found through the engine hash (same holder first,
 *   then the worker's other tiers, which share engine hashes for the same content chain).
 *
 * HOLES AND EXACT JUMP SEARCH
 * holes(H) = number of entries H holds at position > 0 whose parent entry H does not hold.
 * Kept exact: gaining an entry E moves absent[E] into E's nchild (those children stop being
 * holes) and bumps the parent's nchild or absent[parent]; losing E does the reverse.
 * Lemma: if holes(H) == 0 and H holds the entry at position L with the query's chain hash,
 * then H holds the entry of every position <= L of the query (its parent is held and has
 * chain[L-1] — equal chain hashes at equal positions mean equal prefixes — by induction).
 * So for a hole-free holder the positions of the query it holds are exactly [0, tm), and tm
 * is found by looking only at jump landings, scanning one stride back when it disappears.
 * A worker is "fast" when all its holders are hole-free: matched = max tm over its tiers,
 * and score follows from the tm values. Any other worker is scanned position by position
 * (exact, slower). No "same count means same set" shortcut: landings intersect the sets.
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
 * Duplicate store of an engine hash the holder has: refcounted (copies), its first
 * (position, chain) is kept.
 *
 * CONCURRENCY
 * - Writers: one thread per worker at a time (index.h); different workers' writers run in
 *   parallel and meet on shared entries. A node is locked by its writer-side seqlock (seq
 *   odd = held; CAS from even), held for exactly one entry update. Creating or deleting an
 *   entry additionally takes its shard mutex (order: shard, then node); a node is marked
 *   dead and unlinked under both, so a node found alive under the shard lock stays linked.
 * - Readers never lock: table slots are read with acquire loads (insert publishes a fully
 *   built node with a release store; delete writes a tombstone; growth/shrink builds a new
 *   table and publishes its pointer; nothing in a published table moves), holder sets are
 *   read under the node's seqlock (all shared fields are accessed with atomics, so TSAN
 *   sees no data race); (n, array pointer) are validated before the array is touched.
 * - Memory reclamation: epoch-based (EBR). Every reader and every writer call holds a slot
 *   announcing the global epoch while it may touch shared memory. Unlinked nodes, replaced
 *   holder arrays and replaced tables are retired into the writer slot's list and freed
 *   once the global epoch has advanced twice past their retirement (no thread can still
 *   see them). Writers try to advance the epoch when leaving a call.
 * - Statistics are per slot (relaxed, owner-written) and summed when read; bytes are
 *   malloc_usable_size() of everything this module allocates, added at malloc and removed
 *   at free (retired memory counts until it is really freed).
 * - Interning: one mutex for inserts; lookups are lock-free over immutable records in
 *   open-addressing tables whose replaced versions are kept until destroy.
 * - find makes no heap allocation: its scratch lives in the reader.
 */
#include "index.h"

#include "hash.h"
#include "log.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* ---- basics ------------------------------------------------------------------------- */

#define IX_ASSERT(c)                                                                        \
    do {                                                                                    \
        if (__builtin_expect(!(c), 0))                                                      \
            ix_assert_fail(#c, __LINE__);                                                   \
    } while (0)

static void ix_assert_fail(const char *what, int line)
{
    kvr_log_error("index: internal invariant failed: %s (index.c:%d)", what, line);
    abort();
}

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

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
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

#define N_COUNT 0x3fffffffu
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
    /* owner-written (relaxed), summed by stats */
    int64_t bytes, entries, pairs, orphans;
} __attribute__((aligned(64)));

struct hset {
    uint32_t cap; /* atomic (read by readers through an unvalidated pointer) */
    uint32_t pad;
    uint64_t e[]; /* atomic: holder | nchild << 32, sorted by holder */
};

struct node {
    uint64_t chain;        /* key; immutable */
    uint64_t parent_chain; /* immutable (unused at position 0) */
    uint32_t pos, ns;      /* key; immutable */
    uint32_t seq;          /* atomic: seqlock, odd while a writer holds the node */
    uint32_t n;            /* atomic: count | N_EXT | N_DEAD */
    uint64_t h;            /* atomic: inline element, or struct hset * when N_EXT */
};

struct table {
    uint64_t mask; /* immutable */
    uint64_t slot[]; /* atomic */
};

struct shard {
    pthread_mutex_t mu;  /* writers creating/deleting entries here */
    struct table *tab;   /* atomic pointer; replaced under mu */
    uint64_t live, used; /* under mu */
} __attribute__((aligned(64)));

struct rec {
    uint64_t eh;
    struct node *nd; /* NULL = empty slot */
    uint32_t copies;
    uint32_t pad;
};

struct recmap {
    struct rec *s;
    uint32_t mask, n;
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
    struct holder *h[KVR_TIER_MAX]; /* atomic pointers; created by the writer */
    /* writer only */
    struct parked *orph;
    uint32_t norph, corph;
    struct cmap awaited; /* parent engine hash -> parked blocks awaiting it */
};

struct pod {
    char *name;
    uint32_t *wids; /* under ix->imu */
    uint32_t nw, cw;
};

struct nsrec {
    uint64_t seed;
    uint32_t block_size; /* atomic */
};

struct irec {
    uint64_t h;
    uint32_t id, len;
    char s[];
};

struct itab {
    uint32_t mask, n;
    struct itab *old; /* replaced tables, kept until destroy (lookups are lock-free) */
    struct irec *slot[]; /* atomic pointers */
};

struct kvr_index {
    struct kvr_index_opts o;
    struct shard *sh; /* NSHARD */

    struct ebr_slot slots[EBR_SLOTS];
    uint64_t epoch;    /* atomic, starts at 1 */
    uint32_t nslots;   /* atomic: high-water mark of used slots */

    pthread_mutex_t imu; /* interning inserts */
    int64_t gbytes;      /* atomic: bytes of interning structures */
    struct itab *ns_tab, *w_tab, *pod_tab; /* atomic pointers */
    struct nsrec *ns_chunk[NS_CHUNKS];     /* atomic pointers */
    uint32_t nns;                          /* atomic */
    struct worker **workers;               /* max_workers; atomic pointers */
    uint32_t nworkers;                     /* atomic */
    struct pod **pods;                     /* max_workers; atomic pointers */
    uint32_t npods;                        /* atomic */
    char tier_names[KVR_TIER_MAX][KVR_NAME_MAX + 1];
    uint32_t ntiers; /* atomic */
    uint64_t pow[64]; /* KVR_HASH_CHAIN_MUL^i */
};

/* ---- memory accounting and epoch-based reclamation ------------------------------------- */

static inline int64_t usable(void *p)
{
    return (int64_t)malloc_usable_size(p);
}

static void *sl_alloc(struct ebr_slot *s, size_t n)
{
    void *p = malloc(n);
    if (p != NULL)
        ADD(s->bytes, usable(p));
    return p;
}

static void *sl_calloc(struct ebr_slot *s, size_t n)
{
    void *p = calloc(1, n);
    if (p != NULL)
        ADD(s->bytes, usable(p));
    return p;
}

static void sl_free(struct ebr_slot *s, void *p)
{
    if (p == NULL)
        return;
    ADD(s->bytes, -usable(p));
    free(p);
}

static void *g_calloc(struct kvr_index *ix, size_t n)
{
    void *p = calloc(1, n);
    if (p != NULL)
        __atomic_fetch_add(&ix->gbytes, usable(p), __ATOMIC_RELAXED);
    return p;
}

static void g_free(struct kvr_index *ix, void *p)
{
    if (p == NULL)
        return;
    __atomic_fetch_sub(&ix->gbytes, usable(p), __ATOMIC_RELAXED);
    free(p);
}

static struct ebr_slot *slot_claim(struct kvr_index *ix, int reader)
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

static void slot_release(struct ebr_slot *s)
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

/* Queues p to be freed when no thread can see it any more. Called with no node lock held
 * is not required (a bounded realloc of the slot's own list); on allocation failure the
 * object is leaked rather than freed early. */
static void ebr_retire(struct kvr_index *ix, struct ebr_slot *s, void *p)
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

/* Called by a writer after ebr_exit(): tries to advance the epoch (twice when nobody is in
 * a critical section) and frees what is old enough. */
static void ebr_reclaim(struct kvr_index *ix, struct ebr_slot *s)
{
    if (s->nret == 0)
        return;
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
    size_t k = 0;
    for (size_t i = 0; i < s->nret; i++) {
        if (s->ret[i].epoch + 2 <= e)
            sl_free(s, s->ret[i].p);
        else
            s->ret[k++] = s->ret[i];
    }
    s->nret = k;
    if (k == 0) {
        sl_free(s, s->ret);
        s->ret = NULL;
        s->capret = 0;
    }
}

/* ---- entries: nodes and holder sets ------------------------------------------------- */

static inline uint64_t key_hash(uint32_t ns, uint32_t pos, uint64_t chain)
{
    uint64_t h = chain ^ ((((uint64_t)pos << 32) | ns) * 0x9e3779b97f4a7c15ull);
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static inline uint64_t pack_el(uint32_t holder, uint32_t nchild)
{
    return (uint64_t)holder | (uint64_t)nchild << 32;
}

static void node_lock(struct node *nd)
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

static void node_unlock(struct node *nd)
{
    STR(nd->seq, LD(nd->seq) + 1);
}

/* Lock-free lookup (readers and writers inside an epoch). */
static struct node *tab_find(const struct kvr_index *ix, uint32_t ns, uint32_t pos,
                             uint64_t chain, uint64_t h)
{
    const struct shard *sh = &ix->sh[h & (NSHARD - 1)];
    const struct table *t = LDA(sh->tab);
    if (t == NULL)
        return NULL;
    uint64_t mask = t->mask, i = (h >> SHARD_BITS) & mask, tag = h >> 48;
    for (;;) {
        uint64_t v = LDA(t->slot[i]);
        if (v == 0)
            return NULL;
        if (v != SLOT_TOMB && (v >> 48) == tag) {
            const struct node *x = (const struct node *)(uintptr_t)(v & PTR_MASK);
            if (x->chain == chain && x->pos == pos && x->ns == ns)
                return (struct node *)x;
        }
        i = (i + 1) & mask;
    }
}

/* Under sh->mu: rebuilds the shard's table for `want` live entries, publishes it. */
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
    struct table *ot = sh->tab;
    if (ot != NULL) {
        for (uint64_t i = 0; i <= ot->mask; i++) {
            uint64_t v = LD(ot->slot[i]);
            if (v == 0 || v == SLOT_TOMB)
                continue;
            const struct node *x = (const struct node *)(uintptr_t)(v & PTR_MASK);
            uint64_t h = key_hash(x->ns, x->pos, x->chain);
            uint64_t j = (h >> SHARD_BITS) & nt->mask;
            while (nt->slot[j] != 0)
                j = (j + 1) & nt->mask;
            nt->slot[j] = v;
        }
    }
    STR(sh->tab, nt);
    sh->used = sh->live;
    ebr_retire(ix, s, ot);
    return 0;
}

static int tab_insert_locked(struct kvr_index *ix, struct ebr_slot *s, struct shard *sh,
                             struct node *x, uint64_t h)
{
    if (sh->tab == NULL || (sh->used + 1) * 4 > (sh->tab->mask + 1) * 3) {
        int rc = tab_rebuild(ix, s, sh, sh->live + 1);
        if (rc < 0)
            return rc;
    }
    struct table *t = sh->tab;
    uint64_t i = (h >> SHARD_BITS) & t->mask;
    uint64_t v;
    while ((v = LD(t->slot[i])) != 0 && v != SLOT_TOMB)
        i = (i + 1) & t->mask;
    IX_ASSERT(((uintptr_t)x >> 48) == 0);
    STR(t->slot[i], (uint64_t)(uintptr_t)x | (h >> 48) << 48);
    sh->live++;
    if (v == 0)
        sh->used++;
    return 0;
}

static void tab_unlink_locked(struct kvr_index *ix, struct ebr_slot *s, struct shard *sh,
                              struct node *x, uint64_t h)
{
    struct table *t = sh->tab;
    uint64_t i = (h >> SHARD_BITS) & t->mask;
    for (;;) {
        uint64_t v = LD(t->slot[i]);
        IX_ASSERT(v != 0);
        if ((v & PTR_MASK) == (uint64_t)(uintptr_t)x && v != SLOT_TOMB) {
            STR(t->slot[i], SLOT_TOMB);
            break;
        }
        i = (i + 1) & t->mask;
    }
    sh->live--;
    /* Shrink (memory follows live contents); a failed shrink is harmless. */
    if (sh->live == 0) {
        STR(sh->tab, (struct table *)NULL);
        sh->used = 0;
        ebr_retire(ix, s, t);
    } else if (t->mask + 1 > 16 && sh->live * 8 < t->mask + 1) {
        (void)tab_rebuild(ix, s, sh, sh->live);
    }
}

static inline uint32_t el_holder(uint64_t e)
{
    return (uint32_t)e;
}

/* Lower bound of holder in e[0..n). */
static inline uint32_t hs_lb(const uint64_t *e, uint32_t n, uint32_t holder)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (el_holder(LD(e[mid])) < holder)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct hset *hs_new(struct ebr_slot *s, uint32_t cap)
{
    struct hset *hs = sl_alloc(s, sizeof(*hs) + (size_t)cap * sizeof(uint64_t));
    if (hs != NULL)
        ST(hs->cap, cap);
    return hs;
}

/* Node locked. Adds holder: 1 added, 0 already there, -ENOMEM. *old gets an array to
 * retire after unlocking. */
static int hs_add(struct ebr_slot *s, struct node *nd, uint32_t holder, uint32_t nchild,
                  void **old)
{
    uint32_t n = LD(nd->n), cnt = n & N_COUNT;
    uint64_t el = pack_el(holder, nchild);

    if (cnt == 0) {
        ST(nd->h, el);
        ST(nd->n, 1u);
        return 1;
    }
    if (!(n & N_EXT)) {
        uint64_t one = LD(nd->h);
        if (el_holder(one) == holder)
            return 0;
        struct hset *hs = hs_new(s, 4);
        if (hs == NULL)
            return -ENOMEM;
        if (el_holder(one) < holder) {
            ST(hs->e[0], one);
            ST(hs->e[1], el);
        } else {
            ST(hs->e[0], el);
            ST(hs->e[1], one);
        }
        ST(nd->h, (uint64_t)(uintptr_t)hs);
        ST(nd->n, 2u | N_EXT);
        return 1;
    }
    struct hset *hs = (struct hset *)(uintptr_t)LD(nd->h);
    uint32_t i = hs_lb(hs->e, cnt, holder);
    if (i < cnt && el_holder(LD(hs->e[i])) == holder)
        return 0;
    if (cnt == LD(hs->cap)) {
        struct hset *nh = hs_new(s, LD(hs->cap) * 2);
        if (nh == NULL)
            return -ENOMEM;
        for (uint32_t k = 0; k < i; k++)
            ST(nh->e[k], LD(hs->e[k]));
        ST(nh->e[i], el);
        for (uint32_t k = i; k < cnt; k++)
            ST(nh->e[k + 1], LD(hs->e[k]));
        ST(nd->h, (uint64_t)(uintptr_t)nh);
        *old = hs;
    } else {
        for (uint32_t k = cnt; k > i; k--)
            ST(hs->e[k], LD(hs->e[k - 1]));
        ST(hs->e[i], el);
    }
    ST(nd->n, (cnt + 1) | N_EXT);
    return 1;
}

/* Node locked. Removes holder: 1 removed (*nchild set), 0 absent. */
static int hs_del(struct ebr_slot *s, struct node *nd, uint32_t holder, uint32_t *nchild,
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
        ST(nd->n, 0u);
        return 1;
    }
    struct hset *hs = (struct hset *)(uintptr_t)LD(nd->h);
    uint32_t i = hs_lb(hs->e, cnt, holder);
    if (i >= cnt || el_holder(LD(hs->e[i])) != holder)
        return 0;
    *nchild = (uint32_t)(LD(hs->e[i]) >> 32);
    uint32_t cap = LD(hs->cap);
    if (cnt == 2) {
        ST(nd->h, LD(hs->e[1 - i]));
        ST(nd->n, 1u);
        *old = hs;
        return 1;
    }
    if (cap > 4 && cnt - 1 <= cap / 4) {
        struct hset *nh = hs_new(s, cap / 2);
        if (nh != NULL) {
            uint32_t k2 = 0;
            for (uint32_t k = 0; k < cnt; k++)
                if (k != i)
                    ST(nh->e[k2++], LD(hs->e[k]));
            ST(nd->h, (uint64_t)(uintptr_t)nh);
            ST(nd->n, (cnt - 1) | N_EXT);
            *old = hs;
            return 1;
        }
        /* no memory to shrink: keep the big array */
    }
    for (uint32_t k = i; k + 1 < cnt; k++)
        ST(hs->e[k], LD(hs->e[k + 1]));
    ST(nd->n, (cnt - 1) | N_EXT);
    return 1;
}

/* Node locked. Adds delta to the holder's nchild; returns 1 when the holder is there. */
static int hs_adj(struct node *nd, uint32_t holder, int delta)
{
    uint32_t n = LD(nd->n), cnt = n & N_COUNT;
    uint64_t *p;

    if (cnt == 0 || (n & N_DEAD))
        return 0;
    if (!(n & N_EXT)) {
        p = &nd->h;
    } else {
        struct hset *hs = (struct hset *)(uintptr_t)LD(nd->h);
        uint32_t i = hs_lb(hs->e, cnt, holder);
        if (i >= cnt)
            return 0;
        p = &hs->e[i];
    }
    uint64_t e = LD(*p);
    if (el_holder(e) != holder)
        return 0;
    uint32_t c = (uint32_t)(e >> 32);
    IX_ASSERT(delta > 0 || c >= (uint32_t)-delta);
    ST(*p, pack_el(holder, c + (uint32_t)delta));
    return 1;
}

/* Reader side: copies the holder ids of nd into buf; returns their count. */
static uint32_t hs_read(const struct node *nd, uint32_t *buf)
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
        for (k = 0; k < cnt; k++)
            buf[k] = el_holder(LD(hs->e[k]));
        IX_FENCE(__ATOMIC_ACQUIRE);
        if (LD(nd->seq) == s1)
            return k;
    }
}

/* Adds holder to entry (ns, pos, chain), creating it. *added = 1 for a new membership. */
static int entry_add(struct kvr_index *ix, struct ebr_slot *s, uint32_t ns, uint32_t pos,
                     uint64_t chain, uint64_t pchain, uint32_t holder, uint32_t nchild,
                     struct node **out, int *added)
{
    uint64_t h = key_hash(ns, pos, chain);
    struct shard *sh = &ix->sh[h & (NSHARD - 1)];
    void *old = NULL;
    int rc;

    struct node *x = tab_find(ix, ns, pos, chain, h);
    if (x != NULL) {
        node_lock(x);
        if (!(LD(x->n) & N_DEAD)) {
            rc = hs_add(s, x, holder, nchild, &old);
            node_unlock(x);
            goto done;
        }
        node_unlock(x);
    }
    pthread_mutex_lock(&sh->mu);
    x = tab_find(ix, ns, pos, chain, h);
    if (x != NULL) {
        node_lock(x);
        IX_ASSERT(!(LD(x->n) & N_DEAD));
        rc = hs_add(s, x, holder, nchild, &old);
        node_unlock(x);
        pthread_mutex_unlock(&sh->mu);
        goto done;
    }
    x = sl_alloc(s, sizeof(*x));
    if (x == NULL) {
        pthread_mutex_unlock(&sh->mu);
        return -ENOMEM;
    }
    x->chain = chain;
    x->parent_chain = pchain;
    x->pos = pos;
    x->ns = ns;
    x->seq = 0;
    x->n = 1;
    x->h = pack_el(holder, nchild);
    rc = tab_insert_locked(ix, s, sh, x, h);
    pthread_mutex_unlock(&sh->mu);
    if (rc < 0) {
        sl_free(s, x);
        return rc;
    }
    ADD(s->entries, 1);
    rc = 1;
done:
    ebr_retire(ix, s, old);
    if (rc < 0)
        return rc;
    if (rc == 1)
        ADD(s->pairs, 1);
    *out = x;
    *added = rc;
    return 0;
}

/* Removes holder from x (it must be there); deletes the entry when it empties. */
static uint32_t entry_del(struct kvr_index *ix, struct ebr_slot *s, struct node *x,
                          uint32_t holder)
{
    void *old = NULL;
    uint32_t nchild = 0;

    node_lock(x);
    int r = hs_del(s, x, holder, &nchild, &old);
    uint32_t left = LD(x->n) & N_COUNT;
    node_unlock(x);
    IX_ASSERT(r == 1);
    ebr_retire(ix, s, old);
    ADD(s->pairs, -1);
    if (left != 0)
        return nchild;

    uint64_t h = key_hash(x->ns, x->pos, x->chain);
    struct shard *sh = &ix->sh[h & (NSHARD - 1)];
    int dead = 0;
    pthread_mutex_lock(&sh->mu);
    node_lock(x);
    if (LD(x->n) == 0) {
        ST(x->n, N_DEAD);
        dead = 1;
    }
    node_unlock(x);
    if (dead)
        tab_unlink_locked(ix, s, sh, x, h);
    pthread_mutex_unlock(&sh->mu);
    if (dead) {
        ADD(s->entries, -1);
        ebr_retire(ix, s, x);
    }
    return nchild;
}

/* Writer: +delta to holder's nchild in the entry; 1 when the holder holds it. */
static int entry_adj(struct node *x, uint32_t holder, int delta)
{
    node_lock(x);
    int r = hs_adj(x, holder, delta);
    node_unlock(x);
    return r;
}

/* ---- writer-private maps --------------------------------------------------------------- */

static int recmap_resize(struct ebr_slot *s, struct recmap *m, uint32_t cap)
{
    struct rec *ns = NULL;
    if (cap > 0) {
        ns = sl_calloc(s, (size_t)cap * sizeof(*ns));
        if (ns == NULL)
            return -ENOMEM;
        for (uint32_t i = 0; m->s != NULL && i <= m->mask; i++) {
            if (m->s[i].nd == NULL)
                continue;
            uint32_t j = (uint32_t)mix64(m->s[i].eh) & (cap - 1);
            while (ns[j].nd != NULL)
                j = (j + 1) & (cap - 1);
            ns[j] = m->s[i];
        }
    }
    sl_free(s, m->s);
    m->s = ns;
    m->mask = cap ? cap - 1 : 0;
    return 0;
}

static struct rec *recmap_get(const struct recmap *m, uint64_t eh)
{
    if (m->s == NULL)
        return NULL;
    uint32_t i = (uint32_t)mix64(eh) & m->mask;
    while (m->s[i].nd != NULL) {
        if (m->s[i].eh == eh)
            return &m->s[i];
        i = (i + 1) & m->mask;
    }
    return NULL;
}

/* eh must be absent. The returned pointer is valid until the next insert/delete. */
static struct rec *recmap_put(struct ebr_slot *s, struct recmap *m, uint64_t eh,
                              struct node *nd)
{
    if (m->s == NULL || (m->n + 1) * 4 > (m->mask + 1) * 3) {
        uint32_t cap = m->s ? (m->mask + 1) * 2 : 8;
        if (recmap_resize(s, m, cap) < 0)
            return NULL;
    }
    uint32_t i = (uint32_t)mix64(eh) & m->mask;
    while (m->s[i].nd != NULL)
        i = (i + 1) & m->mask;
    m->s[i].eh = eh;
    m->s[i].nd = nd;
    m->s[i].copies = 1;
    m->n++;
    return &m->s[i];
}

static void recmap_del(struct ebr_slot *s, struct recmap *m, struct rec *r)
{
    uint32_t i = (uint32_t)(r - m->s), j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->s[j].nd == NULL)
            break;
        uint32_t k = (uint32_t)mix64(m->s[j].eh) & m->mask;
        /* move j to i when k is cyclically outside (i, j] */
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].nd = NULL;
    m->n--;
    uint32_t cap = m->mask + 1;
    if (m->n == 0)
        (void)recmap_resize(s, m, 0);
    else if (cap > 8 && m->n * 8 < cap)
        (void)recmap_resize(s, m, cap / 2);
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
            uint32_t j = (uint32_t)mix64(m->s[i].key) & (cap - 1);
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

static uint64_t cmap_get(const struct cmap *m, uint64_t key)
{
    if (m->s == NULL)
        return 0;
    uint32_t i = (uint32_t)mix64(key) & m->mask;
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
        uint32_t k = (uint32_t)mix64(m->s[j].key) & m->mask;
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
static int cmap_add(struct ebr_slot *s, struct cmap *m, uint64_t key, int64_t delta)
{
    if (m->s != NULL) {
        uint32_t i = (uint32_t)mix64(key) & m->mask;
        while (m->s[i].val != 0) {
            if (m->s[i].key == key) {
                IX_ASSERT(delta >= 0 || m->s[i].val >= (uint64_t)-delta);
                m->s[i].val += (uint64_t)delta;
                if (m->s[i].val == 0)
                    cmap_del_at(s, m, i);
                return 0;
            }
            i = (i + 1) & m->mask;
        }
    }
    IX_ASSERT(delta >= 0);
    if (delta == 0)
        return 0;
    if (m->s == NULL || (m->n + 1) * 4 > (m->mask + 1) * 3) {
        int rc = cmap_resize(s, m, m->s ? (m->mask + 1) * 2 : 8);
        if (rc < 0)
            return rc;
    }
    uint32_t i = (uint32_t)mix64(key) & m->mask;
    while (m->s[i].val != 0)
        i = (i + 1) & m->mask;
    m->s[i].key = key;
    m->s[i].val = (uint64_t)delta;
    m->n++;
    return 0;
}

static void cmap_free(struct ebr_slot *s, struct cmap *m)
{
    sl_free(s, m->s);
    memset(m, 0, sizeof(*m));
}

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
    ix->workers = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->workers));
    ix->pods = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->pods));
    if (ix->sh == NULL || ix->workers == NULL || ix->pods == NULL) {
        kvr_index_destroy(ix);
        return -ENOMEM;
    }
    __atomic_fetch_add(&ix->gbytes, usable(ix->sh), __ATOMIC_RELAXED);
    memset(ix->sh, 0, NSHARD * sizeof(struct shard));
    for (unsigned i = 0; i < NSHARD; i++)
        pthread_mutex_init(&ix->sh[i].mu, NULL);
    strcpy(ix->tier_names[KVR_TIER_GPU], "gpu");
    strcpy(ix->tier_names[KVR_TIER_CPU], "cpu");
    strcpy(ix->tier_names[KVR_TIER_STORAGE], "storage");
    ix->ntiers = 3;
    ix->pow[0] = 1;
    for (int i = 1; i < 64; i++)
        ix->pow[i] = ix->pow[i - 1] * KVR_HASH_CHAIN_MUL;
    *out = ix;
    return 0;
}

static void itab_free(struct kvr_index *ix, struct itab *t, int recs)
{
    while (t != NULL) {
        struct itab *old = t->old;
        if (recs)
            for (uint32_t i = 0; i <= t->mask; i++)
                g_free(ix, t->slot[i]);
        g_free(ix, t);
        t = old;
        recs = 0; /* records are shared with the newest table */
    }
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
                sl_free(s, x);
            }
            sl_free(s, t);
            pthread_mutex_destroy(&ix->sh[i].mu);
        }
        free(ix->sh);
    }
    for (unsigned i = 0; i < EBR_SLOTS; i++) {
        struct ebr_slot *e = &ix->slots[i];
        for (size_t k = 0; k < e->nret; k++)
            free(e->ret[k].p);
        free(e->ret);
    }
    for (uint32_t w = 0; ix->workers != NULL && w < ix->nworkers; w++) {
        struct worker *wk = ix->workers[w];
        for (int t = 0; t < KVR_TIER_MAX; t++) {
            struct holder *hd = wk->h[t];
            if (hd == NULL)
                continue;
            free(hd->recs.s);
            free(hd->absent.s);
            free(hd->alias.s);
            free(hd);
        }
        free(wk->orph);
        free(wk->awaited.s);
        free(wk);
    }
    for (uint32_t p = 0; ix->pods != NULL && p < ix->npods; p++) {
        free(ix->pods[p]->name);
        free(ix->pods[p]->wids);
        free(ix->pods[p]);
    }
    for (uint32_t c = 0; c < NS_CHUNKS; c++)
        free(ix->ns_chunk[c]);
    itab_free(ix, ix->ns_tab, 1);
    itab_free(ix, ix->w_tab, 1);
    itab_free(ix, ix->pod_tab, 1);
    free(ix->workers);
    free(ix->pods);
    pthread_mutex_destroy(&ix->imu);
    free(ix);
}

/* ---- interning ----------------------------------------------------------------------- */

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
        if (r->h == h && r->len == len && memcmp(r->s, key, len) == 0) {
            *id = r->id;
            return 0;
        }
        i = (i + 1) & t->mask;
    }
}

/* Under imu. */
static int itab_add(struct kvr_index *ix, struct itab **tp, const void *key, uint32_t len,
                    uint64_t h, uint32_t id)
{
    struct itab *t = *tp;
    if (t == NULL || (t->n + 1) * 2 > t->mask + 1) {
        uint32_t cap = t ? (t->mask + 1) * 2 : 64;
        struct itab *nt = g_calloc(ix, sizeof(*nt) + cap * sizeof(struct irec *));
        if (nt == NULL)
            return -ENOMEM;
        nt->mask = cap - 1;
        for (uint32_t i = 0; t != NULL && i <= t->mask; i++) {
            struct irec *r = t->slot[i];
            if (r == NULL)
                continue;
            uint32_t j = (uint32_t)r->h & nt->mask;
            while (nt->slot[j] != NULL)
                j = (j + 1) & nt->mask;
            nt->slot[j] = r;
        }
        nt->n = t ? t->n : 0;
        nt->old = t;
        STR(*tp, nt);
        t = nt;
    }
    struct irec *r = g_calloc(ix, sizeof(*r) + len + 1);
    if (r == NULL)
        return -ENOMEM;
    r->h = h;
    r->id = id;
    r->len = len;
    memcpy(r->s, key, len);
    uint32_t i = (uint32_t)h & t->mask;
    while (t->slot[i] != NULL)
        i = (i + 1) & t->mask;
    STR(t->slot[i], r);
    t->n++;
    return 0;
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
    rc = itab_add(ix, &ix->ns_tab, key, len, h, id);
    if (rc == 0)
        STR(ix->nns, id + 1);
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
    rc = itab_find(LDA(ix->w_tab), key, len, str_hash(key, len), &id);
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
    int rc = itab_find(LDA(ix->pod_tab), pod, (uint32_t)pl, str_hash(pod, pl), &id);
    if (rc == 0 && pod_id)
        *pod_id = id;
    return rc;
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
    if (itab_find(LDA(ix->w_tab), key, len, h, &id) == 0)
        goto found;
    pthread_mutex_lock(&ix->imu);
    if (itab_find(ix->w_tab, key, len, h, &id) == 0)
        goto found_locked;
    rc = -ENOSPC;
    if (ix->nworkers >= ix->o.max_workers)
        goto fail;
    size_t pl = strlen(pod);
    uint64_t ph = str_hash(pod, pl);
    struct pod *pd;
    rc = -ENOMEM;
    if (itab_find(ix->pod_tab, pod, (uint32_t)pl, ph, &pid) == 0) {
        pd = ix->pods[pid];
    } else {
        pid = ix->npods;
        pd = g_calloc(ix, sizeof(*pd));
        if (pd == NULL)
            goto fail;
        pd->name = g_calloc(ix, pl + 1);
        if (pd->name == NULL || itab_add(ix, &ix->pod_tab, pod, (uint32_t)pl, ph, pid) < 0) {
            g_free(ix, pd->name);
            g_free(ix, pd);
            goto fail;
        }
        memcpy(pd->name, pod, pl);
        STR(ix->pods[pid], pd);
        STR(ix->npods, pid + 1);
    }
    if (pd->nw == pd->cw) {
        uint32_t nc = pd->cw ? pd->cw * 2 : 4;
        uint32_t *nw = g_calloc(ix, nc * sizeof(*nw));
        if (nw == NULL)
            goto fail;
        if (pd->nw)
            memcpy(nw, pd->wids, pd->nw * sizeof(*nw));
        g_free(ix, pd->wids);
        pd->wids = nw;
        pd->cw = nc;
    }
    id = ix->nworkers;
    struct worker *wk = g_calloc(ix, sizeof(*wk));
    if (wk == NULL)
        goto fail;
    wk->pod_id = pid;
    wk->rank = dp_rank;
    wk->pod = pd->name;
    if (itab_add(ix, &ix->w_tab, key, len, h, id) < 0) {
        g_free(ix, wk);
        goto fail;
    }
    pd->wids[pd->nw++] = id;
    STR(ix->workers[id], wk);
    STR(ix->nworkers, id + 1);
found_locked:
    pthread_mutex_unlock(&ix->imu);
found:
    if (wid)
        *wid = id;
    return 0;
fail:
    pthread_mutex_unlock(&ix->imu);
    return rc;
}

static struct worker *worker_get(const struct kvr_index *ix, uint32_t wid)
{
    if (wid >= LDA(ix->nworkers))
        return NULL;
    return LDA(ix->workers[wid]);
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

size_t kvr_index_pod_workers(struct kvr_index *ix, uint32_t pod_id, uint32_t *wids, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&ix->imu);
    if (pod_id < ix->npods) {
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

/* ---- writes -------------------------------------------------------------------------- */

struct wctx {
    struct kvr_index *ix;
    struct ebr_slot *s;
    struct worker *w;
    uint32_t wid;
    struct kvr_index_wres *res;
    int adopt; /* a new engine hash is awaited by a parked block */
};

static inline uint64_t absent_key(uint32_t ns, uint64_t chain)
{
    return chain ^ ((uint64_t)ns + 1) * 0x9e3779b97f4a7c15ull;
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

/* H just gained membership in x (pn = the store's parent node, or NULL). */
static int hole_gain(struct wctx *c, struct holder *H, uint32_t hid, struct node *x,
                     struct node *pn)
{
    if (x->pos == 0)
        return 0;
    struct node *p = pn;
    if (p == NULL || p->ns != x->ns || p->chain != x->parent_chain || p->pos + 1 != x->pos)
        p = tab_find(c->ix, x->ns, x->pos - 1, x->parent_chain,
                     key_hash(x->ns, x->pos - 1, x->parent_chain));
    if (p != NULL && entry_adj(p, hid, 1))
        return 0;
    int rc = cmap_add(c->s, &H->absent, absent_key(x->ns, x->parent_chain), 1);
    if (rc == 0)
        ADD(H->holes, 1);
    return rc;
}

/* H just lost membership in x, which had nchild held children. */
static void hole_lose(struct wctx *c, struct holder *H, uint32_t hid, uint32_t ns,
                      uint32_t pos, uint64_t chain, uint64_t pchain, uint32_t nchild)
{
    if (nchild > 0) {
        if (cmap_add(c->s, &H->absent, absent_key(ns, chain), nchild) == 0)
            ADD(H->holes, nchild);
        else
            kvr_log_error("index: out of memory in hole accounting");
    }
    if (pos == 0)
        return;
    struct node *p = tab_find(c->ix, ns, pos - 1, pchain, key_hash(ns, pos - 1, pchain));
    if (p != NULL && entry_adj(p, hid, -1))
        return;
    (void)cmap_add(c->s, &H->absent, absent_key(ns, pchain), -1);
    IX_ASSERT(LD(H->holes) > 0);
    ADD(H->holes, -1);
}

/* Stores one block for holder (wid, tier) after parent node *pn (NULL = position 0);
 * *pn becomes this block's node. */
static int store_one(struct wctx *c, uint32_t tier, uint32_t ns, struct node **pn,
                     const struct kvr_index_block *b)
{
    struct holder *H = holder_get(c, tier);
    if (H == NULL)
        return -ENOMEM;
    struct rec *r = recmap_get(&H->recs, b->engine_hash);
    if (r != NULL) {
        r->copies++;
        c->res->duplicates++;
        *pn = r->nd;
        return 0;
    }
    uint32_t hid = HOLDER(c->wid, tier);
    struct node *p = *pn;
    uint32_t pos = p ? p->pos + 1 : 0;
    uint64_t pch = p ? p->chain : KVR_HASH_CHAIN_ROOT;
    uint64_t chain = kvr_hash_chain(pch, b->content_hash);
    uint64_t nchild = cmap_get(&H->absent, absent_key(ns, chain));
    struct node *x;
    int added, rc;

    rc = entry_add(c->ix, c->s, ns, pos, chain, pch, hid, (uint32_t)nchild, &x, &added);
    if (rc < 0)
        return rc;
    r = recmap_put(c->s, &H->recs, b->engine_hash, x);
    if (r == NULL) {
        if (added)
            (void)entry_del(c->ix, c->s, x, hid);
        return -ENOMEM;
    }
    ADD(H->blocks, 1);
    c->res->stored++;
    if (added) {
        if (nchild > 0) {
            (void)cmap_add(c->s, &H->absent, absent_key(ns, chain), -(int64_t)nchild);
            IX_ASSERT(LD(H->holes) >= nchild);
            ADD(H->holes, -nchild);
        }
        rc = hole_gain(c, H, hid, x, p);
        if (rc < 0)
            kvr_log_error("index: out of memory in hole accounting");
    } else {
        IX_ASSERT(nchild == 0);
        if (cmap_add(c->s, &H->alias, (uint64_t)(uintptr_t)x, 1) < 0)
            kvr_log_error("index: out of memory counting an engine-hash alias");
    }
    if (c->w->norph > 0 && cmap_get(&c->w->awaited, b->engine_hash) > 0)
        c->adopt = 1;
    *pn = x;
    return 0;
}

/* Drops one copy of r (holder H at tier). */
static void unstore(struct wctx *c, struct holder *H, uint32_t tier, struct rec *r)
{
    if (--r->copies > 0)
        return;
    struct node *x = r->nd;
    recmap_del(c->s, &H->recs, r);
    ADD(H->blocks, -1);
    c->res->removed++;
    if (cmap_get(&H->alias, (uint64_t)(uintptr_t)x) > 0) {
        (void)cmap_add(c->s, &H->alias, (uint64_t)(uintptr_t)x, -1);
        return;
    }
    uint32_t ns = x->ns, pos = x->pos;
    uint64_t chain = x->chain, pchain = x->parent_chain;
    uint32_t hid = HOLDER(c->wid, tier);
    uint32_t nchild = entry_del(c->ix, c->s, x, hid);
    hole_lose(c, H, hid, ns, pos, chain, pchain, nchild);
}

static void orph_remove_at(struct wctx *c, uint32_t i, uint32_t k)
{
    struct worker *w = c->w;
    for (uint32_t j = i; j < i + k; j++)
        (void)cmap_add(c->s, &w->awaited, w->orph[j].parent, -1);
    memmove(&w->orph[i], &w->orph[i + k], (w->norph - i - k) * sizeof(*w->orph));
    w->norph -= k;
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
        if (cmap_add(c->s, &w->awaited, pk->parent, 1) < 0)
            return -ENOMEM;
        w->norph++;
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
            struct node *pn = r->nd;
            orph_remove_at(c, i, 1);
            struct kvr_index_block b = {pk.eh, pk.content};
            int rc = store_one(c, pk.tier, pk.ns, &pn, &b);
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
    c->s = slot_claim(ix, 0);
    ebr_enter(ix, c->s);
    return 0;
}

static void wend(struct wctx *c)
{
    ebr_exit(c->s);
    ebr_reclaim(c->ix, c->s);
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
        pn = r->nd;
    }
    for (size_t i = 0; i < n; i++)
        if ((rc = store_one(&c, tier, ns, &pn, &blocks[i])) < 0)
            goto out;
    if (c.adopt)
        rc = orph_adopt(&c);
out:
    wend(&c);
    return rc;
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
    for (size_t i = 0; i < n; i++) {
        struct rec *r = H ? recmap_get(&H->recs, hashes[i]) : NULL;
        if (r != NULL) {
            unstore(&c, H, tier, r);
            continue;
        }
        uint32_t k;
        for (k = 0; k < c.w->norph; k++)
            if (c.w->orph[k].eh == hashes[i] && c.w->orph[k].tier == tier)
                break;
        if (k < c.w->norph) {
            orph_remove_at(&c, k, 1);
            c.res->orphans_dropped++;
        } else {
            c.res->unknown_removes++;
        }
    }
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
    for (uint32_t i = 0; H->recs.s != NULL && i <= H->recs.mask; i++) {
        struct rec *r = &H->recs.s[i];
        if (r->nd == NULL)
            continue;
        c->res->cleared++;
        uint64_t key = (uint64_t)(uintptr_t)r->nd;
        if (cmap_get(&H->alias, key) > 0)
            (void)cmap_add(c->s, &H->alias, key, -1);
        else
            (void)entry_del(c->ix, c->s, r->nd, hid);
    }
    sl_free(c->s, H->recs.s);
    memset(&H->recs, 0, sizeof(H->recs));
    cmap_free(c->s, &H->absent);
    cmap_free(c->s, &H->alias);
    ST(H->blocks, 0);
    ST(H->holes, 0);
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

/* ---- reads --------------------------------------------------------------------------- */

struct slowst {
    uint32_t wid;
    uint32_t alive;  /* tiers holding every position so far */
    uint32_t done;
    uint32_t matched;
    uint32_t tm[KVR_TIER_MAX];
    double score;
};

struct kvr_index_reader {
    struct kvr_index *ix;
    struct ebr_slot *slot;
    uint32_t qid;
    uint32_t maxq, maxh, maxw;
    uint32_t nch;
    uint64_t *ch;          /* chain per position, valid for [0, nch) */
    struct node **nd;      /* node cache per position, valid where ndq[p] == qid */
    uint32_t *ndq;
    uint32_t *podq;        /* allowed pods: podq[pod] == qid */
    uint32_t *s0;          /* holders at position 0 (filtered) */
    uint32_t *buf;         /* a holder set being examined */
    uint32_t *alive, *drop; /* indices into s0 */
    uint32_t *tm;          /* per s0 index */
    struct slowst *sw;
    struct kvr_index_hit *hits;
};

int kvr_index_reader_create(struct kvr_index *ix, struct kvr_index_reader **out)
{
    if (ix == NULL || out == NULL)
        return -EINVAL;
    struct ebr_slot *s = slot_claim(ix, 1);
    if (s == NULL)
        return -ENOSPC;
    struct kvr_index_reader *r = sl_calloc(s, sizeof(*r));
    if (r == NULL) {
        slot_release(s);
        return -ENOMEM;
    }
    r->ix = ix;
    r->slot = s;
    r->maxq = ix->o.max_query_blocks;
    r->maxw = ix->o.max_workers;
    r->maxh = ix->o.max_workers * KVR_TIER_MAX;
    r->ch = sl_alloc(s, (size_t)r->maxq * sizeof(*r->ch));
    r->nd = sl_alloc(s, (size_t)r->maxq * sizeof(*r->nd));
    r->ndq = sl_calloc(s, (size_t)r->maxq * sizeof(*r->ndq));
    r->podq = sl_calloc(s, (size_t)r->maxw * sizeof(*r->podq));
    r->s0 = sl_alloc(s, (size_t)r->maxh * sizeof(uint32_t));
    r->buf = sl_alloc(s, (size_t)r->maxh * sizeof(uint32_t));
    r->alive = sl_alloc(s, (size_t)r->maxh * sizeof(uint32_t));
    r->drop = sl_alloc(s, (size_t)r->maxh * sizeof(uint32_t));
    r->tm = sl_alloc(s, (size_t)r->maxh * sizeof(uint32_t));
    r->sw = sl_alloc(s, (size_t)r->maxw * sizeof(*r->sw));
    r->hits = sl_alloc(s, (size_t)r->maxw * sizeof(*r->hits));
    if (!r->ch || !r->nd || !r->ndq || !r->podq || !r->s0 || !r->buf || !r->alive ||
        !r->drop || !r->tm || !r->sw || !r->hits) {
        kvr_index_reader_destroy(r);
        return -ENOMEM;
    }
    *out = r;
    return 0;
}

void kvr_index_reader_destroy(struct kvr_index_reader *r)
{
    if (r == NULL)
        return;
    struct ebr_slot *s = r->slot;
    sl_free(s, r->ch);
    sl_free(s, r->nd);
    sl_free(s, r->ndq);
    sl_free(s, r->podq);
    sl_free(s, r->s0);
    sl_free(s, r->buf);
    sl_free(s, r->alive);
    sl_free(s, r->drop);
    sl_free(s, r->tm);
    sl_free(s, r->sw);
    sl_free(s, r->hits);
    sl_free(s, r);
    slot_release(s);
}

static inline void chain_upto(struct kvr_index_reader *r, const uint64_t *q, uint32_t p)
{
    uint32_t k = r->nch;
    if (k > p)
        return;
    uint64_t c = r->ch[k - 1];
    for (; k <= p; k++) {
        c = kvr_hash_chain(c, q[k]);
        r->ch[k] = c;
    }
    r->nch = k;
}

static inline struct node *node_at(struct kvr_index_reader *r, uint32_t ns, const uint64_t *q,
                                   uint32_t p)
{
    if (r->ndq[p] == r->qid)
        return r->nd[p];
    chain_upto(r, q, p);
    struct node *x = tab_find(r->ix, ns, p, r->ch[p], key_hash(ns, p, r->ch[p]));
    r->nd[p] = x;
    r->ndq[p] = r->qid;
    return x;
}

static inline double maxw_of(uint32_t mask, const double *w)
{
    double b = 0;
    int first = 1;
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
        if (mask >> t & 1) {
            if (first || w[t] > b)
                b = w[t];
            first = 0;
        }
    return b;
}

int kvr_index_find(struct kvr_index_reader *r, uint32_t ns, const uint64_t *q, size_t n,
                   const uint32_t *pod_ids, size_t npods, const double weights[KVR_TIER_MAX],
                   const struct kvr_index_hit **hits, size_t *nhits)
{
    if (r == NULL || hits == NULL || nhits == NULL || (n > 0 && q == NULL) ||
        (npods > 0 && pod_ids == NULL))
        return -EINVAL;
    struct kvr_index *ix = r->ix;
    *hits = r->hits;
    *nhits = 0;
    if (n > r->maxq)
        return -E2BIG;
    if (ns >= LDA(ix->nns))
        return -EINVAL;
    if (n == 0)
        return 0;

    double w[KVR_TIER_MAX];
    for (int t = 0; t < KVR_TIER_MAX; t++)
        w[t] = weights ? weights[t] : 1.0;
    if (++r->qid == 0) {
        memset(r->ndq, 0, (size_t)r->maxq * sizeof(*r->ndq));
        memset(r->podq, 0, (size_t)r->maxw * sizeof(*r->podq));
        r->qid = 1;
    }
    const uint32_t qid = r->qid;
    for (size_t i = 0; i < npods; i++)
        if (pod_ids[i] < r->maxw)
            r->podq[pod_ids[i]] = qid;

    ebr_enter(ix, r->slot);
    r->ch[0] = kvr_hash_chain(KVR_HASH_CHAIN_ROOT, q[0]);
    r->nch = 1;
    struct node *x = node_at(r, ns, q, 0);
    size_t nh = 0;
    if (x == NULL)
        goto out;
    uint32_t n0 = hs_read(x, r->s0);
    uint32_t *s0 = r->s0, *tm = r->tm, *alive = r->alive, *drop = r->drop, *buf = r->buf;
    uint32_t na = 0, nsw = 0, k = 0;
    uint32_t ntiers = LDA(ix->ntiers);

    /* filter by pod, classify workers fast / slow */
    for (uint32_t i = 0; i < n0;) {
        uint32_t wid = H_WID(s0[i]), j = i;
        while (j < n0 && H_WID(s0[j]) == wid)
            j++;
        struct worker *wk = worker_get(ix, wid);
        if (wk == NULL || (npods > 0 && r->podq[wk->pod_id] != qid)) {
            i = j;
            continue;
        }
        int slow = 0;
        for (uint32_t t = 0; t < ntiers && !slow; t++) {
            struct holder *hd = LDA(wk->h[t]);
            if (hd != NULL && LD(hd->holes) != 0)
                slow = 1;
        }
        if (slow) {
            struct slowst *sw = &r->sw[nsw++];
            memset(sw, 0, sizeof(*sw));
            sw->wid = wid;
            for (uint32_t m = i; m < j; m++)
                sw->alive |= 1u << H_TIER(s0[m]);
            sw->score = maxw_of(sw->alive, w);
        }
        for (uint32_t m = i; m < j; m++) {
            s0[k] = s0[m] | (slow ? 0x80000000u : 0); /* marks slow workers' entries */
            if (!slow)
                alive[na++] = k;
            tm[k] = 0;
            k++;
        }
        i = j;
    }
    n0 = k;

    /* fast holders: jump search */
    const uint32_t stride = ix->o.jump_stride;
    uint32_t prev = 0;
    while (na > 0 && prev + 1 < n) {
        uint32_t L = prev + stride < n - 1 ? prev + stride : (uint32_t)n - 1;
        x = node_at(r, ns, q, L);
        uint32_t nb = x ? hs_read(x, buf) : 0, j = 0, ka = 0, nd = 0;
        for (uint32_t a = 0; a < na; a++) {
            uint32_t h = s0[alive[a]];
            while (j < nb && buf[j] < h)
                j++;
            if (j < nb && buf[j] == h)
                alive[ka++] = alive[a];
            else
                drop[nd++] = alive[a];
        }
        na = ka;
        for (uint32_t p = prev + 1; p < L && nd > 0; p++) {
            x = node_at(r, ns, q, p);
            nb = x ? hs_read(x, buf) : 0;
            uint32_t kd = 0;
            j = 0;
            for (uint32_t a = 0; a < nd; a++) {
                uint32_t h = s0[drop[a]];
                while (j < nb && buf[j] < h)
                    j++;
                if (j < nb && buf[j] == h)
                    drop[kd++] = drop[a];
                else
                    tm[drop[a]] = p;
            }
            nd = kd;
        }
        for (uint32_t a = 0; a < nd; a++)
            tm[drop[a]] = L;
        prev = L;
    }
    for (uint32_t a = 0; a < na; a++)
        tm[alive[a]] = (uint32_t)n;

    /* slow workers: position by position */
    uint32_t nslow_alive = nsw;
    for (uint32_t p = 1; p < n && nslow_alive > 0; p++) {
        x = node_at(r, ns, q, p);
        uint32_t nb = x ? hs_read(x, buf) : 0, j = 0;
        for (uint32_t i = 0; i < nsw; i++) {
            struct slowst *sw = &r->sw[i];
            if (sw->done)
                continue;
            while (j < nb && H_WID(buf[j]) < sw->wid)
                j++;
            uint32_t mask = 0;
            while (j < nb && H_WID(buf[j]) == sw->wid)
                mask |= 1u << H_TIER(buf[j++]);
            if (mask == 0) {
                sw->done = 1;
                sw->matched = p;
                nslow_alive--;
            } else {
                sw->score += maxw_of(mask, w);
            }
            uint32_t gone = sw->alive & ~mask;
            for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
                if (gone >> t & 1)
                    sw->tm[t] = p;
            sw->alive &= mask;
        }
    }
    for (uint32_t i = 0; i < nsw; i++) {
        struct slowst *sw = &r->sw[i];
        if (sw->done)
            continue;
        sw->matched = (uint32_t)n;
        for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
            if (sw->alive >> t & 1)
                sw->tm[t] = (uint32_t)n;
    }

    /* results, ascending wid */
    uint32_t si = 0;
    for (uint32_t i = 0; i < n0;) {
        uint32_t wid = H_WID(s0[i] & 0x7fffffffu), j = i;
        while (j < n0 && H_WID(s0[j] & 0x7fffffffu) == wid)
            j++;
        struct kvr_index_hit *hit = &r->hits[nh++];
        memset(hit, 0, sizeof(*hit));
        hit->wid = wid;
        if (s0[i] & 0x80000000u) {
            struct slowst *sw = &r->sw[si++];
            hit->matched = sw->matched;
            memcpy(hit->tier_matched, sw->tm, sizeof(sw->tm));
            hit->score = sw->score;
        } else {
            uint32_t ord[KVR_TIER_MAX], no = 0;
            for (uint32_t m = i; m < j; m++) {
                uint32_t t = H_TIER(s0[m]);
                hit->tier_matched[t] = tm[m];
                if (tm[m] > hit->matched)
                    hit->matched = tm[m];
                /* insertion sort by tm descending */
                uint32_t z = no++;
                while (z > 0 && hit->tier_matched[ord[z - 1]] < tm[m]) {
                    ord[z] = ord[z - 1];
                    z--;
                }
                ord[z] = t;
            }
            double best = 0, score = 0;
            for (uint32_t z = 0; z < no; z++) {
                if (z == 0 || w[ord[z]] > best)
                    best = w[ord[z]];
                uint32_t next = z + 1 < no ? hit->tier_matched[ord[z + 1]] : 0;
                score += (double)(hit->tier_matched[ord[z]] - next) * best;
            }
            hit->score = score;
        }
        i = j;
    }
out:
    ebr_exit(r->slot);
    *nhits = nh;
    return 0;
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
    st->workers = LDA(ix->nworkers);
    st->namespaces = LDA(ix->nns);
    st->orphans = orph > 0 ? (uint64_t)orph : 0;
}

void kvr_index_worker_blocks(struct kvr_index *ix, uint32_t wid, uint64_t blocks[KVR_TIER_MAX])
{
    memset(blocks, 0, KVR_TIER_MAX * sizeof(uint64_t));
    struct worker *w = worker_get(ix, wid);
    if (w == NULL)
        return;
    for (int t = 0; t < KVR_TIER_MAX; t++) {
        struct holder *h = LDA(w->h[t]);
        if (h != NULL)
            blocks[t] = LD(h->blocks);
    }
}
