/* bench_floor.c — what the minimum per-block work of an index store costs on this machine.
 *
 * bench_index's first section stores 976 sequences x 1024 blocks (128 workers) into the
 * positional index from empty, ~75 us per 1024-block store at p50. Issue #3 asks for
 * <= 20 us. This benchmark measures the floor under any design that inserts each new block
 * once into one global hash table (the entry readers find by chain hash) and once into its
 * holder's reverse map (engine hash -> entry, which removals need), with none of the
 * index's other work: no holder sets, locks, seqlocks, epochs, hole counts, parent lookup
 * by engine hash, orphans or statistics. If the floor is near or above the target, the
 * target cannot be met by tuning the index; it would need another design.
 *
 * Shape: bench_index's first section, S sequences x B blocks, W holders (holder = seq % W),
 * random 64-bit content and engine hashes, but every block is new (no shared prefix: the
 * index's bench shares 25% of each sequence with others, blocks that join an existing
 * entry instead of creating one). One timed call stores one sequence; avg / p50 / p99 in
 * us per call, as bench_index's report(). Each block, in one pass with the table and map
 * slots prefetched ST_AHEAD blocks ahead (as the index's store):
 *   (a) chain = parent * KVR_HASH_CHAIN_MUL + content, key hash, find-or-insert into an
 *       open-addressing table (linear probing) whose 8-byte slots hold the chain itself;
 *   (b) as (a), but the slot holds node pointer | 16-bit tag << 48 (the index's slot) and a
 *       32-byte node (chain, parent chain, seqlock, count, holder) comes from a bump
 *       allocator over 2 MB chunks; a tag match compares the node's chain. The tag is bits
 *       16..31 of the key hash: the index's tag, its top 16 bits, would repeat the home's
 *       top bits in a 2M-slot table (a node read on nearly every occupied slot probed:
 *       (b) p50 ~28 -> ~20 us, (c) ~45 -> ~37 us, measured here);
 *   (c) as (b), plus find-or-insert of the 16-byte record (mix64(engine hash), node | copies
 *       << 48) into the holder's reverse map (linear probing, home = multiply-high): the
 *       full floor;
 *   (d) as (c), but the table split in 1024 shards by the key hash's low bits (the
 *       index's layout: one more lookup a block, of the shard's header; the index's top-bit
 *       tag, so a rebuild places entries from their tags without reading nodes; with bits
 *       16..31 and node reads the growing (d) was ~5 us slower at p50, ~20 in avg), twice:
 *       pre-sized (no growth), then growing as the index grows: each shard table from 16 slots,
 *       rebuilt twice as large when 3/4 full, each map from empty, room for the call's
 *       blocks reserved at its start (at least doubling, at most 7/8 full).
 *   (e) as (c) and (d), but 8-byte reverse records (issue #18): the top 32 bits of the engine
 *       hash's mix as tag, the node's index (chunk number x nodes a chunk + slot: chunks never
 *       move) + 1 in the low 31 bits, bit 31 "more copies" (their counts would go to a side
 *       table; no block is stored twice here). The home comes from the tag (multiply-high),
 *       so a growing map rehashes without the key. The node's holder element carries the
 *       mix's low 32 bits beside the holder: the store confirms a tag match by the node
 *       index (it knows its node), a removal (here the lookup pass) by reading the node,
 *       which a removal reads anyway to drop its holder. Pre-sized one table (as (c)),
 *       pre-sized 1024 shards and growing (as the two (d)); the maps have half the bytes.
 *   (g) (b) in the growing 1024-shard layout of (d): the entry table alone, with no reverse
 *       map at all (a design that found removals some other way would still pay this).
 *   (h) (d) growing, but each holder's reverse map segmented (extendible hashing: a
 *       directory by the key's top bits, 4 KB segments of 16-byte records, a full segment
 *       split in two): growth moves one segment's records instead of rehashing the map.
 *   (f) as (e), but a call's records are built in bulk: collected while the table is filled,
 *       sorted by tag (two byte-wide counting passes over its top 16 bits, so by home), then
 *       inserted in one sweep over the holder's map (prefetch ST_AHEAD records ahead).
 * (a)-(c) and the pre-sized (d), (e), (f) never grow: the table has the next power of two >= 2 x S x B
 * slots (2M for the default shape, at most half full), the maps the next power of two >= 2
 * x the records a holder gets (16K). Memory: pre-sized arrays are allocated before the
 * timed calls and populated then (MADV_POPULATE_WRITE, as the index's sl_calloc_pop does
 * for an array it fills at once); the table is one mapping advised MADV_HUGEPAGE (the
 * index's shard tables are calloc'd, 4 KB pages: a pre-sized design would map one table
 * so). Node chunks are 2 MB-aligned mappings advised MADV_HUGEPAGE, mapped and first
 * touched inside the timed calls, as the index's slab (their p99: ~300 us to clear a huge
 * page, a few ms when the kernel compacts for it). In the growing (d) the shard tables are
 * calloc'd and the maps calloc'd and populated when they grow, inside the timed calls, as
 * the index does.
 * No deletions happen, so probes need no tombstone test (the index's has one compare more).
 * After each variant a lookup pass finds every stored block (table, node, map record) and
 * the benchmark fails if one is missing or wrong: every insert is a real insert.
 *
 * Environment: KVR_BENCH_SEQS, KVR_BENCH_BLOCKS, KVR_BENCH_WORKERS (default 976 / 1024 /
 * 128, as bench_index), KVR_BENCH_SEED; KVR_FLOOR_ONLY runs only the variants whose name
 * starts with it ("(c)", "(e) (c)": for callgrind, with --toggle-collect=store_map etc.).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_common.h"
#include "index/hash.h"

#ifndef ST_AHEAD
#define ST_AHEAD 8 /* blocks looked ahead, as the index's store */
#endif
#define ST_RING 32

static void die(const char *what)
{
    fprintf(stderr, "bench_floor: %s\n", what);
    exit(1);
}
static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n, sz);
    if (!p)
        die("out of memory");
    return p;
}

static void report(const char *name, double *v, size_t n, uint32_t nblk)
{
    if (n == 0)
        return;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    qsort(v, n, sizeof(double), cmpd);
    printf("  %-44s avg %8.2f  p50 %8.2f  p99 %8.2f  us  (n=%zu; p50 %.1f ns a block)\n",
           name, sum / (double)n, v[n / 2], v[(size_t)((double)n * 0.99)], n,
           v[n / 2] * 1e3 / nblk);
}

/* The index's hashes (src/index/index_int.h): key_hash of a chain picks shard, home and tag; mix64 of
 * an engine hash (mixh, bench_common.h) is the reverse-map key. */
static inline uint64_t key_hash(uint64_t chain)
{
    uint64_t h = chain;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

/* Memory populated at once (pre-faulted). */
static void populate(void *p, size_t n)
{
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
    uintptr_t e = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (e <= a)
        return;
#ifdef MADV_POPULATE_WRITE
    if (madvise((void *)a, e - a, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (uintptr_t q = a; q < e; q += 4096) /* older kernels: touch every page */
        *(volatile char *)q = 0;
}

#define HUGE_SZ (2u << 20)

/* A 2 MB-aligned anonymous mapping of len bytes (a multiple of 2 MB) advised MADV_HUGEPAGE,
 * as the index's chunk_map. */
static void *map_huge(size_t len)
{
    size_t ml = len + HUGE_SZ;
    char *p = mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap failed");
    uintptr_t a = ((uintptr_t)p + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1);
    size_t head = a - (uintptr_t)p, tail = ml - head - len;
    if (head)
        (void)munmap(p, head);
    if (tail)
        (void)munmap((char *)a + len, tail);
#ifdef MADV_HUGEPAGE
    (void)madvise((void *)a, len, MADV_HUGEPAGE);
#endif
    return (void *)a;
}

/* ---- the structures ------------------------------------------------------------------ */

struct node { /* the index's struct node */
    uint64_t chain;
    uint64_t parent_chain;
    uint32_t seq;
    uint32_t n;
    uint64_t h;
};
_Static_assert(sizeof(struct node) == 32, "node: 32 bytes");

#define PTR_MASK ((1ull << 48) - 1)
#define NODES_PER_CHUNK (HUGE_SZ / sizeof(struct node))

struct shard {
    uint64_t *slot; /* 0 empty */
    uint64_t mask;
    uint32_t shift; /* home = key hash >> shift */
    uint64_t used;
};

struct rec {
    uint64_t key; /* mix64(engine hash) */
    uint64_t nc;  /* node | copies << 48; 0 empty */
};

struct recmap {
    struct rec *s;
    uint32_t cap, n;
};

/* (e), (f): an 8-byte record, tag << 32 | more copies << 31 | (node index + 1); 0 empty. */
#define R8_IDX ((1ull << 31) - 1)
#define R8_MORE (1ull << 31)
struct recmap8 {
    uint64_t *s;
    uint32_t cap, n;
};

enum mode { M_TAB, M_NODE, M_MAP, M_SEG, M_MAP8, M_BULK8 };

/* (h): a segmented reverse map (extendible hashing): a directory indexed by the key's top
 * gd bits points at 4 KB segments of 16-byte records, linear probing within a segment from
 * the key's low bits. A full segment (7/8) splits in two by its next key bit (the directory
 * doubles when the segment's depth is its depth): growth moves one segment's records, in
 * L1, into one new 4 KB segment, instead of rehashing the whole map into a fresh array. */
#define SEG_RECS 256u
#define SEG_MAX (SEG_RECS * 7 / 8)
struct seg {
    uint32_t ld, n; /* local depth, records */
    struct rec r[SEG_RECS];
};
struct segmap {
    struct seg **dir; /* 1 << gd entries */
    uint32_t gd, n;
};

struct floor {
    struct shard *sh;
    uint64_t shmask; /* shards - 1 */
    uint32_t tsh;    /* tag = key hash >> tsh & 0xffff */
    uint64_t *presized; /* the pre-sized table's mapping (NULL when growing) */
    size_t presized_len;
    struct recmap *maps;
    struct recmap8 *maps8;
    struct segmap *segs;
    uint32_t nmaps;
    uint64_t *bk; /* (f): the call's records, then sorted (2 x the call's blocks) */
    uint32_t nbk;
    struct node *bump, *bend;
    void **chunks;
    size_t nchunks, cchunks;
    uint64_t dups; /* find-or-insert found the key (random keys: expected 0) */
};

static struct node *node_new(struct floor *f)
{
    if (f->bump == f->bend) {
        if (f->nchunks == f->cchunks) {
            f->cchunks = f->cchunks ? 2 * f->cchunks : 16;
            f->chunks = realloc(f->chunks, f->cchunks * sizeof(*f->chunks));
            if (!f->chunks)
                die("out of memory");
        }
        f->bump = map_huge(HUGE_SZ);
        f->bend = f->bump + NODES_PER_CHUNK;
        f->chunks[f->nchunks++] = f->bump;
    }
    return f->bump++;
}

/* A node's index: chunk number x NODES_PER_CHUNK + slot (chunks never move). A new node is
 * in the last chunk; a found one (a duplicate, rare) is looked for in all. */
static uint32_t node_index(const struct floor *f, const struct node *nd)
{
    for (size_t i = f->nchunks; i-- > 0;) {
        const struct node *c = f->chunks[i];
        if (nd >= c && nd < c + NODES_PER_CHUNK)
            return (uint32_t)(i * NODES_PER_CHUNK + (size_t)(nd - c));
    }
    die("node not in a chunk");
    return 0;
}
static inline struct node *node_at(const struct floor *f, uint64_t idx)
{
    return (struct node *)f->chunks[idx / NODES_PER_CHUNK] + idx % NODES_PER_CHUNK;
}

/* The index's tab_rebuild: at least 16 slots, at most half full after it; an entry's new
 * home comes from its tag while the table has at most 2^16 slots, else from its node. */
static void tab_rebuild(struct shard *sh, uint64_t want, uint32_t tsh)
{
    uint64_t cap = 16;
    while (cap < want * 2)
        cap <<= 1;
    uint64_t *ns = calloc(cap, sizeof(uint64_t));
    if (!ns)
        die("out of memory");
    uint32_t shift = (uint32_t)__builtin_clzll(cap) + 1;
    if (sh->slot != NULL) {
        for (uint64_t i = 0; i <= sh->mask; i++) {
            uint64_t v = sh->slot[i];
            if (v == 0)
                continue;
            const struct node *x = (const struct node *)(uintptr_t)(v & PTR_MASK);
            uint64_t j = tsh == 48 && shift >= 48 ? (v >> 48) >> (shift - 48)
                                                  : key_hash(x->chain) >> shift;
            while (ns[j] != 0)
                j = (j + 1) & (cap - 1);
            ns[j] = v;
        }
        free(sh->slot);
    }
    sh->slot = ns;
    sh->mask = cap - 1;
    sh->shift = shift;
}

static inline uint32_t rec_home(const struct recmap *m, uint64_t key)
{
    return (uint32_t)(((unsigned __int128)key * m->cap) >> 64);
}

static void recmap_resize(struct recmap *m, uint32_t cap)
{
    struct rec *ns = xcalloc(cap, sizeof(*ns));
    if ((size_t)cap * sizeof(*ns) >= (16u << 10)) /* the index's POP_MIN */
        populate(ns, (size_t)cap * sizeof(*ns));
    struct recmap nm = {ns, cap, m->n};
    for (uint32_t i = 0; i < m->cap; i++) {
        if (m->s[i].nc == 0)
            continue;
        uint32_t j = rec_home(&nm, m->s[i].key);
        while (ns[j].nc != 0)
            j = j + 1 == cap ? 0 : j + 1;
        ns[j] = m->s[i];
    }
    free(m->s);
    *m = nm;
}

static inline uint32_t rec_cap_for(size_t need) /* 7/8 load, the index's rec_cap_for */
{
    size_t cap = need * 8 / 7 + 1;
    return (uint32_t)(cap < 8 ? 8 : cap);
}

/* The index's recmap_reserve: room for `more` records before a store, growing at least
 * geometrically (x2). A pre-sized map never grows. */
static void recmap_reserve(struct recmap *m, size_t more)
{
    size_t need = (size_t)m->n + more;
    if (need * 8 <= (size_t)m->cap * 7)
        return;
    size_t grown = (size_t)m->cap * 2 * 7 / 8 + 1;
    recmap_resize(m, rec_cap_for(need > grown ? need : grown));
}

static inline struct seg *seg_of(const struct segmap *m, uint64_t k)
{
    return m->dir[m->gd ? k >> (64 - m->gd) : 0];
}

static void seg_split(struct segmap *m, struct seg *sg, uint64_t k)
{
    if (sg->ld == m->gd) { /* the directory doubles */
        struct seg **nd = xcalloc((size_t)2 << m->gd, sizeof(*nd));
        for (size_t i = 0; i < (size_t)1 << m->gd; i++)
            nd[2 * i] = nd[2 * i + 1] = m->dir[i];
        free(m->dir);
        m->dir = nd;
        m->gd++;
    }
    uint32_t old = sg->ld;
    struct seg *ns = malloc(sizeof(*ns));
    if (ns == NULL)
        die("out of memory");
    struct rec tmp[SEG_RECS];
    memcpy(tmp, sg->r, sizeof(tmp));
    memset(sg->r, 0, sizeof(sg->r));
    memset(ns->r, 0, sizeof(ns->r));
    sg->ld = ns->ld = old + 1;
    sg->n = ns->n = 0;
    for (uint32_t i = 0; i < SEG_RECS; i++) {
        if (tmp[i].nc == 0)
            continue;
        struct seg *to = (tmp[i].key >> (63 - old)) & 1 ? ns : sg;
        uint32_t q = (uint32_t)tmp[i].key & (SEG_RECS - 1);
        while (to->r[q].nc != 0)
            q = (q + 1) & (SEG_RECS - 1);
        to->r[q] = tmp[i];
        to->n++;
    }
    /* the directory entries of sg's prefix whose next bit is 1 now point at ns */
    uint64_t prefix = old ? k >> (64 - old) : 0;
    size_t span = (size_t)1 << (m->gd - old), start = (size_t)prefix * span;
    for (size_t i = start + span / 2; i < start + span; i++)
        m->dir[i] = ns;
}

/* find-or-insert of (k, nd): 1 inserted, 0 another copy */
static inline int seg_insert(struct segmap *m, uint64_t k, struct node *nd)
{
    for (;;) {
        struct seg *sg = seg_of(m, k);
        uint32_t q = (uint32_t)k & (SEG_RECS - 1);
        while (sg->r[q].nc != 0 && sg->r[q].key != k)
            q = (q + 1) & (SEG_RECS - 1);
        if (sg->r[q].nc != 0) {
            sg->r[q].nc += 1ull << 48;
            return 0;
        }
        if (sg->n + 1 > SEG_MAX) {
            seg_split(m, sg, k);
            continue;
        }
        sg->r[q] = (struct rec){k, (uint64_t)(uintptr_t)nd | 1ull << 48};
        sg->n++;
        m->n++;
        return 1;
    }
}

static const struct rec *seg_get(const struct segmap *m, uint64_t k)
{
    const struct seg *sg = seg_of(m, k);
    for (uint32_t q = (uint32_t)k & (SEG_RECS - 1); sg->r[q].nc != 0; q = (q + 1) & (SEG_RECS - 1))
        if (sg->r[q].key == k)
            return &sg->r[q];
    return NULL;
}

/* 8-byte maps: the home comes from the tag (its top bits), so a rehash needs no key. */
static inline uint32_t r8_home(const struct recmap8 *m, uint32_t tag)
{
    return (uint32_t)(((uint64_t)tag * m->cap) >> 32);
}

static void recmap8_reserve(struct recmap8 *m, size_t more)
{
    size_t need = (size_t)m->n + more;
    if (need * 8 <= (size_t)m->cap * 7)
        return;
    size_t grown = (size_t)m->cap * 2 * 7 / 8 + 1;
    uint32_t cap = rec_cap_for(need > grown ? need : grown);
    uint64_t *ns = xcalloc(cap, sizeof(*ns));
    if ((size_t)cap * sizeof(*ns) >= (16u << 10))
        populate(ns, (size_t)cap * sizeof(*ns));
    struct recmap8 nm = {ns, cap, m->n};
    for (uint32_t i = 0; i < m->cap; i++) {
        uint64_t v = m->s[i];
        if (v == 0)
            continue;
        uint32_t j = r8_home(&nm, (uint32_t)(v >> 32));
        while (ns[j] != 0)
            j = j + 1 == cap ? 0 : j + 1;
        ns[j] = v;
    }
    free(m->s);
    *m = nm;
}

/* Find-or-insert of record v (tag << 32 | node index + 1). A tag match is a duplicate only
 * if it names the same node: the store knows its node, so the check is exact. */
static inline void r8_insert(struct floor *f, struct recmap8 *m, uint32_t q, uint64_t v)
{
    uint64_t x;
    while ((x = m->s[q]) != 0) {
        if ((x & ~R8_MORE) == v) {
            m->s[q] = x | R8_MORE; /* another copy (counts beyond 1 in a side table) */
            f->dups++;
            return;
        }
        q = q + 1 == m->cap ? 0 : q + 1;
    }
    m->s[q] = v;
    m->n++;
}

/* (f): sort the call's records by tag (so by home) in two byte passes over the tag's top 16
 * bits, then insert them in one sweep over the map. */
static void bulk_insert(struct floor *f, struct recmap8 *m, uint32_t n)
{
    uint64_t *a = f->bk, *b = f->bk + f->nbk;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t cnt[257] = {0};
        unsigned sh = 48 + 8 * (unsigned)pass;
        for (uint32_t i = 0; i < n; i++)
            cnt[((a[i] >> sh) & 0xff) + 1]++;
        for (int d = 0; d < 256; d++)
            cnt[d + 1] += cnt[d];
        for (uint32_t i = 0; i < n; i++)
            b[cnt[(a[i] >> sh) & 0xff]++] = a[i];
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (i + ST_AHEAD < n)
            __builtin_prefetch(&m->s[r8_home(m, (uint32_t)(a[i + ST_AHEAD] >> 32))]);
        r8_insert(f, m, r8_home(m, (uint32_t)(a[i] >> 32)), a[i]);
    }
}

/* ---- the store ----------------------------------------------------------------------- */


/* One sequence of n blocks for holder. mode is a constant in each caller below, so the
 * compiler emits one loop per variant without the others' work. */
static inline __attribute__((always_inline)) void
store_seq(struct floor *f, const uint64_t *cont, const uint64_t *eh, uint32_t n,
          uint32_t holder, enum mode mode)
{
    uint64_t rch[ST_RING], rh[ST_RING], rk[ST_RING];
    struct recmap *m = &f->maps[holder];
    struct recmap8 *m8 = &f->maps8[holder];
    struct segmap *sgm = &f->segs[holder];
    if (mode == M_MAP)
        recmap_reserve(m, n);
    if (mode == M_MAP8 || mode == M_BULK8)
        recmap8_reserve(m8, n);
    uint64_t chain = KVR_HASH_CHAIN_ROOT, pchain = KVR_HASH_CHAIN_ROOT;
    uint32_t ahead = 0;
    for (uint32_t i = 0; i < n; i++) {
        for (; ahead < n && ahead <= i + ST_AHEAD; ahead++) {
            uint32_t r = ahead % ST_RING;
            chain = kvr_hash_chain(chain, cont[ahead]);
            uint64_t h = key_hash(chain);
            rch[r] = chain;
            rh[r] = h;
            const struct shard *ps = &f->sh[h & f->shmask];
            if (ps->slot != NULL)
                __builtin_prefetch(&ps->slot[h >> ps->shift]);
            if (mode == M_MAP) {
                uint64_t k = mixh(eh[ahead]);
                rk[r] = k;
                __builtin_prefetch(&m->s[rec_home(m, k)]);
            }
            if (mode == M_SEG) {
                uint64_t k = mixh(eh[ahead]);
                rk[r] = k;
                __builtin_prefetch(&seg_of(sgm, k)->r[(uint32_t)k & (SEG_RECS - 1)]);
            }
            if (mode == M_MAP8 || mode == M_BULK8)
                rk[r] = mixh(eh[ahead]);
            if (mode == M_MAP8)
                __builtin_prefetch(&m8->s[r8_home(m8, (uint32_t)(rk[r] >> 32))]);
        }
        uint32_t r = i % ST_RING;
        uint64_t c = rch[r], h = rh[r];
        struct shard *sh = &f->sh[h & f->shmask];
        if (mode != M_TAB && (sh->slot == NULL || (sh->used + 1) * 4 > (sh->mask + 1) * 3))
            tab_rebuild(sh, sh->used + 1, f->tsh);
        uint64_t j = h >> sh->shift, tag = (h >> f->tsh) & 0xffff, v;
        struct node *nd = NULL;
        if (mode == M_TAB) {
            if (c == 0) /* 0 marks an empty slot; a chain of 0 has probability 2^-64 */
                die("chain hash 0");
            while ((v = sh->slot[j]) != 0 && v != c)
                j = (j + 1) & sh->mask;
            if (v == c)
                f->dups++;
            else {
                sh->slot[j] = c;
                sh->used++;
            }
        } else {
            while ((v = sh->slot[j]) != 0) {
                if ((v >> 48) == tag &&
                    ((struct node *)(uintptr_t)(v & PTR_MASK))->chain == c) {
                    nd = (struct node *)(uintptr_t)(v & PTR_MASK);
                    break;
                }
                j = (j + 1) & sh->mask;
            }
            if (nd != NULL) {
                f->dups++;
            } else {
                nd = node_new(f);
                /* (e), (f): the holder element also carries the low 32 bits of the engine
                 * hash's mix, which confirm a tag match */
                *nd = (struct node){c, pchain, 0, 1,
                                    mode >= M_MAP8 ? holder | rk[r] << 32 : holder};
                sh->slot[j] = (uint64_t)(uintptr_t)nd | tag << 48;
                sh->used++;
            }
        }
        if (mode == M_MAP) {
            uint64_t k = rk[r];
            uint32_t q = rec_home(m, k);
            while (m->s[q].nc != 0 && m->s[q].key != k)
                q = q + 1 == m->cap ? 0 : q + 1;
            if (m->s[q].nc != 0) {
                m->s[q].nc += 1ull << 48; /* another copy */
                f->dups++;
            } else {
                m->s[q] = (struct rec){k, (uint64_t)(uintptr_t)nd | 1ull << 48};
                m->n++;
            }
        }
        if (mode == M_SEG && !seg_insert(sgm, rk[r], nd))
            f->dups++;
        if (mode == M_MAP8 || mode == M_BULK8) {
            uint32_t ix = nd == f->bump - 1 /* new: in the last chunk */
                              ? (uint32_t)((f->nchunks - 1) * NODES_PER_CHUNK +
                                           (size_t)(nd - (f->bend - NODES_PER_CHUNK)))
                              : node_index(f, nd);
            uint64_t rv = rk[r] >> 32 << 32 | (uint64_t)(ix + 1);
            if (mode == M_MAP8)
                r8_insert(f, m8, r8_home(m8, (uint32_t)(rk[r] >> 32)), rv);
            else
                f->bk[i] = rv;
        }
        pchain = c;
    }
    if (mode == M_BULK8)
        bulk_insert(f, m8, n);
}

/* One entry point per mode: store_seq inlined with its mode constant, one loop each. */
#define STORE_FN(fn, mode)                                                                  \
    static void fn(struct floor *f, const uint64_t *c, const uint64_t *e, uint32_t n,       \
                   uint32_t w)                                                              \
    {                                                                                       \
        store_seq(f, c, e, n, w, mode);                                                     \
    }
STORE_FN(store_tab, M_TAB)
STORE_FN(store_node, M_NODE)
STORE_FN(store_map, M_MAP)
STORE_FN(store_seg, M_SEG)
STORE_FN(store_map8, M_MAP8)
STORE_FN(store_bulk8, M_BULK8)

/* ---- setup, check, teardown ---------------------------------------------------------- */

enum layout {
    L_ONE,    /* one pre-sized table */
    L_SHARDS, /* 1024 pre-sized shards (the index's NSHARD) */
    L_GROW,   /* 1024 shards from 16 slots, maps from empty, both growing */
};
#define NSHARD 1024u

static void floor_init(struct floor *f, enum mode mode, enum layout lay, uint64_t blocks,
                       uint32_t nholders, uint32_t per_holder)
{
    memset(f, 0, sizeof(*f));
    f->nmaps = mode >= M_MAP ? nholders : 0;
    f->maps = xcalloc(nholders, sizeof(*f->maps));
    f->maps8 = xcalloc(nholders, sizeof(*f->maps8));
    f->segs = xcalloc(nholders, sizeof(*f->segs));
    for (uint32_t w = 0; w < nholders && mode == M_SEG; w++) {
        f->segs[w].dir = xcalloc(1, sizeof(struct seg *));
        f->segs[w].dir[0] = xcalloc(1, sizeof(struct seg));
    }
    f->nbk = per_holder; /* >= one call's blocks */
    if (mode == M_BULK8)
        f->bk = xcalloc(2 * (size_t)f->nbk, sizeof(uint64_t));
    uint32_t nsh = lay == L_ONE ? 1 : NSHARD;
    f->sh = xcalloc(nsh, sizeof(*f->sh));
    f->shmask = nsh - 1;
    /* one table of 2M slots homes by the top 21 bits: top-bit tags would repeat them
     * (a tag match, a node read, on nearly every occupied slot probed); shards of up to
     * 2^16 slots keep the index's top-bit tags, which a rebuild places without nodes */
    f->tsh = lay == L_ONE ? 16 : 48;
    if (lay == L_GROW)
        return;
    /* one mapping for all shards, each at most half full (as the index's tab_rebuild) */
    uint64_t cap = 16;
    while (cap * nsh < blocks * 2)
        cap <<= 1;
    f->presized_len = (cap * nsh * sizeof(uint64_t) + HUGE_SZ - 1) & ~(size_t)(HUGE_SZ - 1);
    f->presized = map_huge(f->presized_len);
    populate(f->presized, f->presized_len);
    for (uint32_t i = 0; i < nsh; i++) {
        f->sh[i].slot = f->presized + (size_t)i * cap;
        f->sh[i].mask = cap - 1;
        f->sh[i].shift = (uint32_t)__builtin_clzll(cap) + 1;
    }
    uint32_t mc = 16;
    while (mc < (uint64_t)per_holder * 2)
        mc <<= 1;
    for (uint32_t w = 0; w < f->nmaps && mode == M_MAP; w++) {
        f->maps[w].s = xcalloc(mc, sizeof(struct rec));
        f->maps[w].cap = mc;
        populate(f->maps[w].s, (size_t)mc * sizeof(struct rec));
    }
    for (uint32_t w = 0; w < f->nmaps && mode >= M_MAP8; w++) {
        f->maps8[w].s = xcalloc(mc, sizeof(uint64_t));
        f->maps8[w].cap = mc;
        populate(f->maps8[w].s, (size_t)mc * sizeof(uint64_t));
    }
}

static void floor_free(struct floor *f)
{
    if (f->presized)
        (void)munmap(f->presized, f->presized_len);
    else
        for (uint64_t i = 0; i <= f->shmask; i++)
            free(f->sh[i].slot);
    free(f->sh);
    for (uint32_t w = 0; w < f->nmaps; w++) {
        free(f->maps[w].s);
        free(f->maps8[w].s);
        struct segmap *m = &f->segs[w];
        for (size_t i = 0; m->dir != NULL && i < (size_t)1 << m->gd; i++)
            if (i == 0 || m->dir[i] != m->dir[i - 1])
                free(m->dir[i]);
        free(m->dir);
    }
    free(f->segs);
    free(f->maps);
    free(f->maps8);
    free(f->bk);
    for (size_t i = 0; i < f->nchunks; i++)
        (void)munmap(f->chunks[i], HUGE_SZ);
    free(f->chunks);
}

/* Every stored block must be found: its chain in the table (and its node's chain, parent
 * and holder), its engine hash in its holder's map pointing at that node. Returns the
 * number missing or wrong. */
static uint64_t check(const struct floor *f, enum mode mode, const uint64_t *cont,
                      const uint64_t *eng, uint32_t nseq, uint32_t nblk, uint32_t nw)
{
    uint64_t bad = 0, used = 0, recs = 0;
    for (uint32_t s = 0; s < nseq; s++) {
        uint64_t chain = KVR_HASH_CHAIN_ROOT, pchain = KVR_HASH_CHAIN_ROOT;
        uint32_t w = s % nw;
        for (uint32_t b = 0; b < nblk; b++) {
            size_t at = (size_t)s * nblk + b;
            chain = kvr_hash_chain(chain, cont[at]);
            uint64_t h = key_hash(chain);
            const struct shard *sh = &f->sh[h & f->shmask];
            const struct node *nd = NULL;
            int found = 0;
            for (uint64_t j = h >> sh->shift; sh->slot != NULL && sh->slot[j] != 0;
                 j = (j + 1) & sh->mask) {
                uint64_t v = sh->slot[j];
                if (mode == M_TAB) {
                    if ((found = v == chain))
                        break;
                } else if ((v >> 48) == ((h >> f->tsh) & 0xffff)) {
                    nd = (const struct node *)(uintptr_t)(v & PTR_MASK);
                    if ((found = nd->chain == chain))
                        break;
                }
            }
            if (!found || (mode != M_TAB && (nd->parent_chain != pchain || (mode >= M_MAP8 ? (uint32_t)nd->h : nd->h) != w))) {
                bad++;
            } else if (mode == M_MAP) {
                const struct recmap *m = &f->maps[w];
                uint64_t k = mixh(eng[at]);
                uint32_t q = rec_home(m, k);
                while (m->s[q].nc != 0 && m->s[q].key != k)
                    q = q + 1 == m->cap ? 0 : q + 1;
                const struct node *rn = (const struct node *)(uintptr_t)(m->s[q].nc & PTR_MASK);
                if (m->s[q].nc == 0 || rn != nd)
                    bad++;
            } else if (mode == M_SEG) {
                const struct rec *rr = seg_get(&f->segs[w], mixh(eng[at]));
                if (rr == NULL || (const struct node *)(uintptr_t)(rr->nc & PTR_MASK) != nd)
                    bad++;
            } else if (mode >= M_MAP8) {
                /* as a removal would: the first record whose tag matches and whose node's
                 * holder element carries the mix's low 32 bits and this holder */
                const struct recmap8 *m = &f->maps8[w];
                uint64_t k = mixh(eng[at]);
                const struct node *rn = NULL;
                for (uint32_t q = r8_home(m, (uint32_t)(k >> 32)); m->s[q] != 0;
                     q = q + 1 == m->cap ? 0 : q + 1) {
                    uint64_t v = m->s[q];
                    if (v >> 32 != k >> 32)
                        continue;
                    const struct node *x = node_at(f, (v & R8_IDX) - 1);
                    if (x->h == (w | k << 32)) {
                        rn = x;
                        break;
                    }
                }
                if (rn != nd)
                    bad++;
            }
            pchain = chain;
        }
    }
    for (uint64_t i = 0; i <= f->shmask; i++)
        used += f->sh[i].used;
    for (uint32_t w = 0; w < f->nmaps; w++)
        recs += f->maps[w].n + f->maps8[w].n + f->segs[w].n;
    uint64_t want = (uint64_t)nseq * nblk - f->dups;
    if (used != want || (mode >= M_MAP && recs != want))
        bad++;
    return bad;
}

typedef void store_fn(struct floor *, const uint64_t *, const uint64_t *, uint32_t, uint32_t);

static void variant(const char *name, store_fn *fn, enum mode mode, enum layout lay,
                    const uint64_t *cont, const uint64_t *eng, uint32_t nseq, uint32_t nblk,
                    uint32_t nw, double *lat)
{
    const char *only = getenv("KVR_FLOOR_ONLY");
    if (only != NULL && strncmp(name, only, strlen(only)) != 0)
        return;
    struct floor f;
    uint32_t per_holder = (nseq + nw - 1) / nw * nblk;
    floor_init(&f, mode, lay, (uint64_t)nseq * nblk, nw, per_holder);
    for (uint32_t s = 0; s < nseq; s++) {
        size_t at = (size_t)s * nblk;
        double t0 = now_us();
        fn(&f, &cont[at], &eng[at], nblk, s % nw);
        lat[s] = now_us() - t0;
    }
    uint64_t bad = check(&f, mode, cont, eng, nseq, nblk, nw);
    if (bad) {
        fprintf(stderr, "bench_floor: %s: %llu stored blocks not found by the lookup pass\n",
                name, (unsigned long long)bad);
        exit(1);
    }
    report(name, lat, nseq, nblk);
    if (f.dups)
        printf("    (%llu duplicate keys found and not inserted)\n", (unsigned long long)f.dups);
    floor_free(&f);
}

int main(void)
{
    rng = (uint64_t)envl("KVR_BENCH_SEED", 42);
    uint32_t nseq = (uint32_t)envl("KVR_BENCH_SEQS", 976);
    uint32_t nblk = (uint32_t)envl("KVR_BENCH_BLOCKS", 1024);
    uint32_t nw = (uint32_t)envl("KVR_BENCH_WORKERS", 128);
    if (nseq == 0 || nblk == 0 || nw == 0)
        die("KVR_BENCH_SEQS, KVR_BENCH_BLOCKS and KVR_BENCH_WORKERS must be > 0");
    size_t total = (size_t)nseq * nblk;
    uint64_t *cont = xcalloc(total, sizeof(uint64_t));
    uint64_t *eng = xcalloc(total, sizeof(uint64_t));
    for (size_t i = 0; i < total; i++) {
        cont[i] = rnd();
        eng[i] = rnd();
    }
    double *lat = xcalloc(nseq, sizeof(double));
    uint64_t cap = 16, mc = 16;
    while (cap < total * 2)
        cap <<= 1;
    while (mc < (uint64_t)(nseq + nw - 1) / nw * nblk * 2)
        mc <<= 1;
    printf("floor: %u sequences x %u blocks, %u holders (holder = seq %% %u), every block new "
           "(no shared prefix), random content and engine hashes; per %u-block store\n",
           nseq, nblk, nw, nw, nblk);
    printf("  pre-sized: table %llu slots (%.1f MB, MADV_HUGEPAGE, populated before the "
           "stores), maps %llu records (%.2f MB each, populated); growing: shard tables "
           "calloc'd from 16 slots, maps from empty, x2, inside the timed stores\n",
           (unsigned long long)cap, (double)cap * 8 / 1e6, (unsigned long long)mc,
           (double)mc * 16 / 1e6);
    variant("(a) chain + table insert", store_tab, M_TAB, L_ONE, cont, eng, nseq, nblk, nw,
            lat);
    variant("(b) (a) + 32-byte node", store_node, M_NODE, L_ONE, cont, eng, nseq, nblk, nw,
            lat);
    variant("(c) (b) + reverse map: the floor", store_map, M_MAP, L_ONE, cont, eng, nseq,
            nblk, nw, lat);
    variant("(d) (c), 1024 shards, pre-sized", store_map, M_MAP, L_SHARDS, cont, eng, nseq,
            nblk, nw, lat);
    variant("(d) (c), 1024 shards, all growing", store_map, M_MAP, L_GROW, cont, eng, nseq,
            nblk, nw, lat);
    variant("(e) (c), 8-byte records", store_map8, M_MAP8, L_ONE, cont, eng, nseq, nblk, nw,
            lat);
    variant("(e) (d), 8-byte records, pre-sized", store_map8, M_MAP8, L_SHARDS, cont, eng,
            nseq, nblk, nw, lat);
    variant("(e) (d), 8-byte records, all growing", store_map8, M_MAP8, L_GROW, cont, eng,
            nseq, nblk, nw, lat);
    variant("(h) (d), segmented maps, growing", store_seg, M_SEG, L_GROW, cont, eng, nseq,
            nblk, nw, lat);
    variant("(g) (b), 1024 shards, growing: no reverse map", store_node, M_NODE, L_GROW,
            cont, eng, nseq, nblk, nw, lat);
    variant("(f) (e), records sorted, one sweep", store_bulk8, M_BULK8, L_ONE, cont, eng,
            nseq, nblk, nw, lat);
    variant("(f) (e) sorted, 1024 shards, pre-sized", store_bulk8, M_BULK8, L_SHARDS, cont,
            eng, nseq, nblk, nw, lat);
    variant("(f) (e) sorted, 1024 shards, all growing", store_bulk8, M_BULK8, L_GROW, cont,
            eng, nseq, nblk, nw, lat);
    printf("  every stored block found again by a lookup pass after each variant\n");
    free(lat);
    free(eng);
    free(cont);
    return 0;
}
