/* index_dump.c — one worker's part of a snapshot: its state encoded as a blob, and the blob
 * restored into a fresh worker, so that a restarted kvrouterd (or a replica bootstrapped from
 * a peer) rebuilds the positional index exactly, not approximately. The snapshot container
 * (file, magic, checksums, streams, which writer dumps which worker) is src/state/snap.c's; this
 * file knows only the index's structures.
 *
 * WHAT IS STORED, WHAT IS RECOMPUTED
 * A worker's state is its holders' records (reverse-map key, node, copies; the `extra` map's
 * copies beyond 0xffff; the `alias` map is implied: several records of one tier naming the
 * same entry), the entries they name (chain, parent chain, position 0 or not: all immutable)
 * and its parked orphans. Everything else is derived from those and recomputed by restore
 * instead of trusted from the bytes: each holder's child counts (nchild in the holder set),
 * its `absent` map and hole count, the worker's count of holey holders (ix->wslow), the block,
 * pair and entry counters and the `awaited` map. These are what the stores would have built
 * in any order (holes are a function of which entries a holder holds: index_write.c, HOLES),
 * so the restored worker behaves exactly like the original under further writes and finds.
 *
 * ENCODING (docs/index.md, "Dump format", has the byte layout and the measured sizes)
 * The blob lists the worker's distinct entries in an order where a held parent comes before
 * its children (a walk up each chain to the first entry already listed, then down), so a
 * parent is usually the previous entry: a one-byte back reference. A parent the worker does
 * not hold is an explicit chain, a position-0 entry names its namespace. Each entry is
 * followed by its records (tier, key, copies when not 1). Keys are rec_key(engine hash),
 * which the reverse map stores (mix64, a bijection), so neither side hashes per record. About
 * 18 bytes a (holder, block) pair: 8 of chain, 8 of key, 2 of structure.
 *
 * RESTORE OF UNTRUSTED BYTES
 * A blob may come from a damaged file or a peer: it is parsed and checked whole (structure,
 * counts against the bytes left, ids interned, no duplicate chain or record, parents
 * resolved) into scratch arrays before the index is touched. One check is left to the apply:
 * that an entry other workers already hold has the blob's parent chain and position. Apply
 * meets that entry anyway (kvr_ix_entry_add finds it), and checking it up front was a second
 * random table probe per entry (a third of a 10M-pair restore: docs/index.md); a conflict
 * withdraws that entry's memberships and the worker is cleared again. Otherwise only an
 * allocation failure stops the apply half-way (index.h says what the caller does then).
 * Scratch hash tables are seeded per call, so a crafted blob cannot make their probes
 * quadratic.
 */
#include "index/index_int.h"

#include "core/buf.h"

#include <pthread.h>
#include <time.h>

#define DUMP_VERSION 1
#define DUMP_HDR 9 /* version byte, u64 LE body length */

/* record header byte */
#define RH_TIER 7u
#define RH_LAST 8u   /* the entry's last record */
#define RH_COPIES 16u /* copies - 1 follows as a varint */
#define RH_BITS 31u

/* parent tag (varint) */
#define PT_ROOT 0u     /* position 0; the namespace id follows */
#define PT_EXPLICIT 1u /* the parent chain follows (an entry the worker does not hold) */
/* >= 2: the parent is the entry (tag - 1) places before this one */

/* ---- bytes ------------------------------------------------------------------------- */

static inline uint8_t *put_v(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint8_t *put_u64(uint8_t *p, uint64_t v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, 8);
#else
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
#endif
    return p + 8;
}

struct rd {
    const uint8_t *p, *e;
    int bad;
};

static inline uint64_t get_u64(struct rd *r)
{
    if (r->e - r->p < 8) {
        r->bad = 1;
        r->p = r->e;
        return 0;
    }
    uint64_t v;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&v, r->p, 8);
#else
    v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)r->p[i] << (8 * i);
#endif
    r->p += 8;
    return v;
}

static inline uint8_t get_u8(struct rd *r)
{
    if (r->p == r->e) {
        r->bad = 1;
        return 0;
    }
    return *r->p++;
}

/* A varint of at most 10 bytes, canonical (no overlong encoding, nothing past 2^64). */
static inline uint64_t get_v(struct rd *r)
{
    uint64_t v = 0;
    for (unsigned sh = 0; sh < 70; sh += 7) {
        if (r->p == r->e)
            break;
        uint8_t b = *r->p++;
        if (sh == 63 && b > 1)
            break;
        v |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80)) {
            if (b == 0 && sh > 0)
                break; /* overlong */
            return v;
        }
    }
    r->bad = 1;
    r->p = r->e;
    return 0;
}

/* ---- scratch ----------------------------------------------------------------------------
 * A call's scratch arrays are carved from one block. Fresh memory costs a page fault a 4 KB
 * page (on the development VM malloc'd scratch made dump 6x and restore 2x slower:
 * docs/index.md, "Dump format"), and a snapshot dumps worker after worker on the same writer
 * thread, so each thread keeps its block for its next call, up to SCRATCH_KEEP (a worker of
 * ~150K pairs); a larger one is the call's own and freed after it. */
#define SCRATCH_KEEP ((size_t)16 << 20)

struct scratch {
    void *p;
    size_t cap;
};

static pthread_key_t sc_key;
static pthread_once_t sc_once = PTHREAD_ONCE_INIT;
static int sc_ok;

static void sc_destroy(void *p)
{
    struct scratch *sc = p;
    free(sc->p);
    free(sc);
}

static void sc_init(void)
{
    sc_ok = pthread_key_create(&sc_key, sc_destroy) == 0;
}

/* n bytes (64-byte aligned, not zeroed): the thread's kept block when it serves, else one of
 * the call's own (*own set). NULL when out of memory. */
static void *scratch_get(size_t n, int *own)
{
    *own = 1;
    if (n > SCRATCH_KEEP || pthread_once(&sc_once, sc_init) != 0 || !sc_ok)
        return aligned_alloc(64, (n + 63) & ~(size_t)63);
    struct scratch *sc = pthread_getspecific(sc_key);
    if (sc == NULL) {
        if ((sc = calloc(1, sizeof(*sc))) == NULL)
            return NULL;
        if (pthread_setspecific(sc_key, sc) != 0) {
            free(sc);
            return aligned_alloc(64, (n + 63) & ~(size_t)63);
        }
    }
    if (sc->cap < n) {
        size_t cap = n < 256 * 1024 ? 256 * 1024 : (n + 63) & ~(size_t)63;
        void *p = aligned_alloc(64, cap);
        if (p == NULL)
            return NULL;
        free(sc->p);
        sc->p = p;
        sc->cap = cap;
    }
    *own = 0;
    return sc->p;
}

static void scratch_put(void *p, int own)
{
    if (own)
        free(p);
}

/* Carves n elements of size sz from *at (16-byte aligned). */
static void *carve(char **at, size_t n, size_t sz)
{
    void *p = *at;
    *at += (n * sz + 15) & ~(size_t)15;
    return p;
}

/* ---- scratch: a u64 -> u32 table (value 0 = empty), seeded per call ---------------------- */

struct sslot {
    uint64_t k;
    uint32_t v, pad;
};

struct smap {
    struct sslot *s; /* key and value in one slot: one line a probe */
    uint64_t mask, seed;
};

static size_t smap_cap(size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap <<= 1;
    return cap;
}

static size_t smap_bytes(size_t n)
{
    return smap_cap(n) * sizeof(struct sslot) + 16;
}

static void smap_init(struct smap *m, size_t n, uint64_t seed, char **at)
{
    size_t cap = smap_cap(n);
    m->s = carve(at, cap, sizeof(*m->s));
    memset(m->s, 0, cap * sizeof(*m->s));
    m->mask = cap - 1;
    m->seed = seed;
}

static inline uint64_t smap_home(const struct smap *m, uint64_t key)
{
    return kvr_hash_mix64(key ^ m->seed) & m->mask;
}

static inline void smap_prefetch(const struct smap *m, uint64_t key)
{
    __builtin_prefetch(&m->s[smap_home(m, key)]);
}

/* The slot of key: its value, or 0 where it would go. */
static inline struct sslot *smap_slot(const struct smap *m, uint64_t key)
{
    uint64_t i = smap_home(m, key);
    while (m->s[i].v != 0 && m->s[i].k != key)
        i = (i + 1) & m->mask;
    return &m->s[i];
}

static uint64_t call_seed(const void *p)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return kvr_hash_mix64((uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^
                          (uint64_t)(uintptr_t)p);
}

/* The inverse of kvr_hash_mix64 (murmur3's fmix64): a position-0 entry's parent chain is
 * ns_root(ns) = ROOT ^ mix64(ns), which gives the namespace id back. */
static inline uint64_t mix64_inv(uint64_t x)
{
    x ^= x >> 33;
    x *= 0x9cb4b2f8129337dbull;
    x ^= x >> 33;
    x *= 0x4f74430c22a54005ull;
    x ^= x >> 33;
    return x;
}

/* ---- dump ---------------------------------------------------------------------------- */

struct drec {
    uint64_t key, copies;
    uint32_t ent;
    uint32_t tier;
};

struct dent {
    uint64_t chain, pchain; /* the node's, read once (nodes are scattered: a miss each) */
    int32_t par;  /* entry index of the parent, -1 none held, -2 position 0 */
    uint32_t pos; /* place in the blob, UINT32_MAX until listed */
    uint32_t nrec, rbeg;
};

#define DU_AHEAD 16 /* dump: how far ahead each pass prefetches what it will touch */

int kvr_index_worker_dump(struct kvr_index *ix, uint32_t wid, struct kvr_buf *out)
{
    if (ix == NULL || out == NULL)
        return -EINVAL;
    struct worker *w = worker_get(ix, wid);
    if (w == NULL)
        return -ENOENT;
    size_t nrec = 0;
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
        if (w->h[t] != NULL)
            nrec += w->h[t]->recs.n;
    if (nrec > UINT32_MAX / 2) /* what restore accepts (and the scratch's 32-bit indices) */
        return -ENOMEM;

    int rc = -ENOMEM, own;
    size_t nr1 = nrec ? nrec : 1;
    char *sc = scratch_get(nr1 * (sizeof(struct drec) + sizeof(struct dent) + 8) + 64 +
                               smap_bytes(nrec),
                           &own), *at = sc;
    if (sc == NULL)
        return -ENOMEM;
    struct drec *rv = carve(&at, nr1, sizeof(*rv));
    struct dent *ev = carve(&at, nr1, sizeof(*ev));
    uint32_t *ord = carve(&at, nr1, sizeof(*ord));
    uint32_t *ridx = carve(&at, nr1, sizeof(*ridx));
    struct smap m;
    smap_init(&m, nrec, call_seed(w), &at);

    /* records, and the distinct entries they name (keyed by chain: unique per entry) */
    size_t n = 0;
    uint32_t nent = 0;
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++) {
        const struct holder *H = w->h[t];
        if (H == NULL || H->recs.n == 0)
            continue;
        for (uint32_t i = 0; i < H->recs.cap; i++) {
            const struct rec *r = &H->recs.s[i];
            /* two stages: the node 2 * DU_AHEAD slots on, the map slot of its chain (the
             * node in cache by then) DU_AHEAD on */
            if (i + 2 * DU_AHEAD < H->recs.cap && REC_LIVE(r + 2 * DU_AHEAD))
                __builtin_prefetch(REC_ND(r + 2 * DU_AHEAD));
            if (i + DU_AHEAD < H->recs.cap && REC_LIVE(r + DU_AHEAD))
                smap_prefetch(&m, REC_ND(r + DU_AHEAD)->chain);
            if (!REC_LIVE(r))
                continue;
            const struct node *x = REC_ND(r);
            uint64_t copies = REC_COPIES(r);
            if (copies == COPIES_MAX && H->extra.n)
                copies += kvr_ix_cmap_get(&H->extra, r->key);
            struct sslot *sl = smap_slot(&m, x->chain);
            if (sl->v == 0) {
                sl->k = x->chain;
                sl->v = ++nent;
                ev[nent - 1] = (struct dent){x->chain, x->parent_chain,
                                             (LD(x->n) & N_ROOT) ? -2 : -1, UINT32_MAX, 0, 0};
            }
            uint32_t e = sl->v - 1;
            ev[e].nrec++;
            rv[n++] = (struct drec){r->key, copies, e, t};
        }
    }
    KVR_ASSERT(n == nrec);
    for (uint32_t e = 0; e < nent; e++) {
        if (e + DU_AHEAD < nent)
            smap_prefetch(&m, ev[e + DU_AHEAD].pchain);
        if (ev[e].par == -2)
            continue;
        ev[e].par = (int32_t)smap_slot(&m, ev[e].pchain)->v - 1;
    }
    /* order: each unlisted entry's chain is walked up to the first entry listed (or not
     * held, or position 0), then listed top down; ord doubles as the walk's stack, filled
     * from the end (the part not listed yet) */
    uint32_t k = 0;
    for (uint32_t e = 0; e < nent; e++) {
        if (e + DU_AHEAD < nent && ev[e + DU_AHEAD].par >= 0)
            __builtin_prefetch(&ev[ev[e + DU_AHEAD].par]);
        if (ev[e].pos != UINT32_MAX)
            continue;
        uint32_t sp = nent;
        int32_t cur = (int32_t)e;
        while (cur >= 0 && ev[cur].pos == UINT32_MAX) {
            ev[cur].pos = UINT32_MAX - 1; /* on the stack (breaks a cycle, were there one) */
            ord[--sp] = (uint32_t)cur;
            cur = ev[cur].par;
        }
        /* ord[sp..nent) holds the walk, the topmost ancestor first: list it in that order
         * (k <= sp <= j: the list's end never passes the element read) */
        for (uint32_t j = sp; j < nent; j++) {
            uint32_t u = ord[j];
            ev[u].pos = k;
            ord[k++] = u;
        }
    }
    KVR_ASSERT(k == nent);
    /* records grouped by entry, in the entries' order */
    uint32_t off = 0;
    for (uint32_t j = 0; j < nent; j++) {
        if (j + DU_AHEAD < nent)
            __builtin_prefetch(&ev[ord[j + DU_AHEAD]]);
        struct dent *d = &ev[ord[j]];
        d->rbeg = off;
        off += d->nrec;
        d->nrec = 0;
    }
    for (size_t i = 0; i < nrec; i++) {
        if (i + DU_AHEAD < nrec)
            __builtin_prefetch(&ev[rv[i + DU_AHEAD].ent]);
        struct dent *d = &ev[rv[i].ent];
        ridx[d->rbeg + d->nrec++] = (uint32_t)i;
    }

    size_t bound = DUMP_HDR + 30 + (size_t)nent * (8 + 10 + 8) + nrec * (1 + 8 + 10) +
                   (size_t)w->norph * (24 + 5 + 1);
    if (kvr_buf_reserve(out, bound) < 0)
        goto out;
    uint8_t *p0 = (uint8_t *)out->data + out->len, *p = p0 + DUMP_HDR;
    p = put_v(p, nent);
    p = put_v(p, nrec);
    p = put_v(p, w->norph);
    for (uint32_t j = 0; j < nent; j++) {
        if (j + 2 * DU_AHEAD < nent)
            __builtin_prefetch(&ev[ord[j + 2 * DU_AHEAD]]);
        if (j + DU_AHEAD < nent)
            __builtin_prefetch(&rv[ridx[ev[ord[j + DU_AHEAD]].rbeg]]);
        const struct dent *d = &ev[ord[j]];
        p = put_u64(p, d->chain);
        if (d->par == -2) {
            uint64_t ns = mix64_inv(d->pchain ^ KVR_HASH_CHAIN_ROOT);
            if (ns > UINT32_MAX || ns_root((uint32_t)ns) != d->pchain) {
                rc = -EIO; /* not a namespace's root: cannot happen through the API */
                goto out;
            }
            p = put_v(p, PT_ROOT);
            p = put_v(p, ns);
        } else if (d->par >= 0 && ev[d->par].pos < j) {
            p = put_v(p, (uint64_t)(j - ev[d->par].pos) + 1);
        } else {
            p = put_v(p, PT_EXPLICIT);
            p = put_u64(p, d->pchain);
        }
        for (uint32_t i = 0; i < d->nrec; i++) {
            const struct drec *r = &rv[ridx[d->rbeg + i]];
            uint8_t hb = (uint8_t)r->tier;
            if (i + 1 == d->nrec)
                hb |= RH_LAST;
            if (r->copies > 1)
                hb |= RH_COPIES;
            *p++ = hb;
            p = put_u64(p, r->key);
            if (r->copies > 1)
                p = put_v(p, r->copies - 1);
        }
    }
    for (uint32_t i = 0; i < w->norph; i++) {
        const struct parked *pk = &w->orph[i];
        p = put_u64(p, pk->eh);
        p = put_u64(p, pk->content);
        p = put_u64(p, pk->parent);
        p = put_v(p, pk->ns);
        *p++ = (uint8_t)pk->tier;
    }
    KVR_ASSERT((size_t)(p - p0) <= bound);
    p0[0] = DUMP_VERSION;
    (void)put_u64(p0 + 1, (uint64_t)(p - p0 - DUMP_HDR));
    out->len += (size_t)(p - p0);
    out->data[out->len] = '\0';
    rc = 0;
out:
    scratch_put(sc, own);
    return rc;
}

/* ---- restore --------------------------------------------------------------------------- */

#ifndef RS_AHEAD
#define RS_AHEAD 8 /* restore: entries whose table slot is prefetched ahead */
#endif

struct pent {
    uint64_t chain, pchain;
    int32_t par;   /* entry index of the parent held by the worker, -1 none */
    uint8_t root;  /* position 0 */
    uint8_t mask;  /* tiers holding it */
    uint8_t expl;  /* the parent was given as a chain (resolved after parsing) */
    uint8_t pad;
    uint32_t rbeg; /* first record; the next entry's rbeg ends them */
    uint32_t mb;   /* first membership (one per tier in mask, in tier order) */
};

struct prec {
    uint64_t key, copies;
    uint32_t tier;
};

struct parsed {
    uint32_t nent, nrec, norph;
    struct pent *ent;
    struct prec *rec;
    struct parked *orph;
    uint32_t *nch; /* per membership: children held by the same holder */
    uint64_t cnt[KVR_TIER_MAX];
    char *sc;      /* the scratch all of these are carved from */
    int own;
};

static void parsed_free(struct parsed *ps)
{
    if (ps->sc != NULL)
        scratch_put(ps->sc, ps->own);
}

/* Bits set in a byte (the build assumes no popcnt instruction: __builtin_popcount would be
 * a libgcc call per entry). */
static inline uint32_t pop8(uint32_t m)
{
    static const uint8_t nib[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
    return nib[m & 15] + nib[(m >> 4) & 15];
}

static inline uint32_t memb(const struct pent *e, uint32_t t)
{
    return e->mb + pop8(e->mask & ((1u << t) - 1));
}

/* Parses and checks the whole blob but for conflicts with entries other workers hold (apply
 * finds those). 0, -EINVAL or -ENOMEM; nothing in the index changes. */
static int parse(struct kvr_index *ix, const uint8_t *b, size_t len, struct parsed *ps)
{
    struct rd r = {b, b + len, 0};
    uint32_t nns = LDA(ix->nns), ntiers = LDA(ix->ntiers);
    if (len < DUMP_HDR || get_u8(&r) != DUMP_VERSION || get_u64(&r) != len - DUMP_HDR)
        return -EINVAL;
    uint64_t nent = get_v(&r), nrec = get_v(&r), norph = get_v(&r);
    size_t left = (size_t)(r.e - r.p);
    /* each entry takes at least 18 bytes (chain, tag, a record), each further record 9,
     * each orphan 26: counts the bytes cannot hold are refused before any allocation */
    if (r.bad || nent > nrec || nrec > UINT32_MAX / 2 || norph > UINT32_MAX / 2 ||
        nent * 9 + nrec * 9 + norph * 26 > left)
        return -EINVAL;
    ps->nent = (uint32_t)nent;
    ps->nrec = (uint32_t)nrec;
    ps->norph = (uint32_t)norph;
    size_t nr1 = nrec ? nrec : 1;
    ps->sc = scratch_get((nent + 1) * sizeof(struct pent) + nr1 * sizeof(struct prec) +
                             (norph + 1) * sizeof(struct parked) + nr1 * sizeof(uint32_t) +
                             64 + smap_bytes(nent) + smap_bytes(nrec),
                         &ps->own);
    if (ps->sc == NULL)
        return -ENOMEM;
    char *at = ps->sc;
    ps->ent = carve(&at, nent + 1, sizeof(*ps->ent));
    ps->rec = carve(&at, nr1, sizeof(*ps->rec));
    ps->orph = carve(&at, norph + 1, sizeof(*ps->orph));
    ps->nch = carve(&at, nr1, sizeof(*ps->nch)); /* memberships <= records */

    int rc = -EINVAL;
    uint64_t seed = call_seed(ps);
    struct smap ch, keys; /* chain -> entry + 1; key -> tier mask + 1 */
    smap_init(&ch, nent, seed, &at);
    smap_init(&keys, nrec, seed ^ 1, &at);
    uint32_t ri = 0, nm = 0;
    for (uint32_t e = 0; e < nent; e++) {
        struct pent *pe = &ps->ent[e];
        memset(pe, 0, sizeof(*pe));
        pe->chain = get_u64(&r);
        pe->par = -1;
        uint64_t tag = get_v(&r);
        if (tag == PT_ROOT) {
            uint64_t ns = get_v(&r);
            if (ns >= nns)
                goto out;
            pe->root = 1;
            pe->pchain = ns_root((uint32_t)ns);
        } else if (tag == PT_EXPLICIT) {
            pe->pchain = get_u64(&r);
            pe->expl = 1;
        } else {
            if (tag - 1 > e)
                goto out;
            pe->par = (int32_t)(e - (tag - 1));
            pe->pchain = ps->ent[pe->par].chain;
        }
        pe->rbeg = ri;
        for (;;) {
            uint8_t hb = get_u8(&r);
            if (r.bad || (hb & ~RH_BITS) || (hb & RH_TIER) >= ntiers || ri == nrec)
                goto out;
            struct prec *pr = &ps->rec[ri++];
            pr->tier = hb & RH_TIER;
            pr->key = get_u64(&r);
            pr->copies = 1;
            if (hb & RH_COPIES) {
                uint64_t c = get_v(&r);
                if (c == 0 || c >= (1ull << 62))
                    goto out;
                pr->copies = c + 1;
            }
            pe->mask |= (uint8_t)(1u << pr->tier);
            ps->cnt[pr->tier]++;
            if (hb & RH_LAST)
                break;
        }
        if (r.bad)
            goto out;
        pe->mb = nm;
        nm += pop8(pe->mask);
    }
    if (ri != nrec)
        goto out;
    ps->ent[nent].rbeg = ri;
    for (uint32_t i = 0; i < norph; i++) {
        struct parked *pk = &ps->orph[i];
        pk->eh = get_u64(&r);
        pk->content = get_u64(&r);
        pk->parent = get_u64(&r);
        uint64_t ns = get_v(&r);
        pk->tier = get_u8(&r);
        if (r.bad || ns >= nns || pk->tier >= ntiers)
            goto out;
        pk->ns = (uint32_t)ns;
    }
    if (r.bad || r.p != r.e)
        goto out;

    /* the decoded blob indexed (look-ups prefetched RS_AHEAD on): no chain twice, no
     * (tier, key) twice, no orphan whose parent the worker holds */
    for (uint32_t e = 0; e < nent; e++) {
        if (e + RS_AHEAD < nent)
            smap_prefetch(&ch, ps->ent[e + RS_AHEAD].chain);
        struct sslot *sl = smap_slot(&ch, ps->ent[e].chain);
        if (sl->v != 0)
            goto out; /* an entry listed twice */
        sl->k = ps->ent[e].chain;
        sl->v = e + 1;
    }
    for (uint32_t i = 0; i < nrec; i++) {
        const struct prec *pr = &ps->rec[i];
        if (i + RS_AHEAD < nrec)
            smap_prefetch(&keys, pr[RS_AHEAD].key);
        struct sslot *sl = smap_slot(&keys, pr->key);
        uint32_t tm = sl->v ? sl->v - 1 : 0;
        if (tm & (1u << pr->tier))
            goto out; /* a record listed twice */
        sl->k = pr->key;
        sl->v = (tm | 1u << pr->tier) + 1;
    }
    for (uint32_t i = 0; i < norph; i++) /* index_write.c, ORPHANS: the invariant */
        if (smap_slot(&keys, rec_key(ps->orph[i].parent))->v != 0)
            goto out;

    /* parents given as chains: an entry of the blob if it lists one (a dump lists held
     * parents first, but the order is not trusted). Agreement with entries other workers
     * hold is checked where apply meets them (one table probe an entry instead of two). */
    for (uint32_t e = 0; e < nent; e++) {
        struct pent *pe = &ps->ent[e];
        if (!pe->expl)
            continue;
        uint32_t v = smap_slot(&ch, pe->pchain)->v;
        if (v == e + 1)
            goto out; /* its own parent */
        pe->par = (int32_t)v - 1;
    }
    memset(ps->nch, 0, nm * sizeof(*ps->nch));
    for (uint32_t e = 0; e < nent; e++) {
        const struct pent *pe = &ps->ent[e];
        if (pe->root || pe->par < 0)
            continue;
        const struct pent *pp = &ps->ent[pe->par];
        for (uint32_t both = pe->mask & pp->mask; both; both &= both - 1)
            ps->nch[memb(pp, (uint32_t)__builtin_ctz(both))]++;
    }
    rc = 0;
out:
    return rc;
}

static struct holder *holder_make(struct worker *w, struct ebr_slot *s, uint32_t tier)
{
    struct holder *h = w->h[tier];
    if (h == NULL) {
        h = sl_calloc(s, sizeof(*h));
        if (h != NULL)
            STR(w->h[tier], h);
    }
    return h;
}

/* Applies a checked blob. -ENOMEM, or -EINVAL when an entry is already in the index with
 * another parent chain or position (an entry's identity: the blob is not this index's):
 * that entry's memberships are withdrawn again and the caller clears the worker. */
static int apply(struct kvr_index *ix, struct ebr_slot *s, struct worker *w, uint32_t wid,
                 const struct parsed *ps, struct kvr_index_wres *res)
{
    struct holder *H[KVR_TIER_MAX] = {0};
    uint64_t holes[KVR_TIER_MAX] = {0};
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++) {
        if (ps->cnt[t] == 0)
            continue;
        if ((H[t] = holder_make(w, s, t)) == NULL ||
            kvr_ix_recmap_room(s, &H[t]->recs, ps->cnt[t]) < 0)
            return -ENOMEM;
    }
    int rc = 0;
    for (uint32_t e = 0; e < ps->nent && rc == 0; e++) {
        const struct pent *pe = &ps->ent[e];
        if (e + RS_AHEAD < ps->nent) { /* its table slot and its first record's map slot */
            pf_slot(ix, key_hash(pe[RS_AHEAD].chain));
            const struct prec *pr = &ps->rec[pe[RS_AHEAD].rbeg];
            const struct recmap *rm = &H[pr->tier]->recs;
            __builtin_prefetch(&rm->s[rec_home(rm, pr->key)]);
        }
        struct node *xt[KVR_TIER_MAX];
        uint32_t nr[KVR_TIER_MAX] = {0};
        uint64_t kh = key_hash(pe->chain);
        for (uint32_t m = pe->mask; m; m &= m - 1) {
            uint32_t t = (uint32_t)__builtin_ctz(m);
            int added;
            rc = kvr_ix_entry_add(ix, s, pe->root, pe->chain, pe->pchain, kh, HOLDER(wid, t),
                                  ps->nch[memb(pe, t)], &xt[t], &added);
            if (rc < 0)
                return rc;
            KVR_ASSERT(added == 1); /* a fresh holder, entries distinct */
            if (xt[t]->parent_chain != pe->pchain || !!(LD(xt[t]->n) & N_ROOT) != pe->root) {
                for (uint32_t u = pe->mask & ((2u << t) - 1); u; u &= u - 1) {
                    uint32_t tu = (uint32_t)__builtin_ctz(u);
                    (void)kvr_ix_entry_del(ix, s, xt[tu], HOLDER(wid, tu));
                }
                return -EINVAL;
            }
            if (!pe->root && (pe->par < 0 || !(ps->ent[pe->par].mask & (1u << t)))) {
                if ((rc = kvr_ix_cmap_add(s, &H[t]->absent, absent_key(pe->pchain), 1)) < 0)
                    return rc;
                holes[t]++;
            }
        }
        for (uint32_t i = pe->rbeg; i < pe[1].rbeg; i++) {
            const struct prec *pr = &ps->rec[i];
            struct holder *h = H[pr->tier];
            struct rec *r = recmap_slot(s, &h->recs, pr->key);
            if (r == NULL)
                return -ENOMEM;
            KVR_ASSERT(!REC_LIVE(r));
            uint64_t c = pr->copies < COPIES_MAX ? pr->copies : COPIES_MAX;
            rec_fill(&h->recs, r, pr->key, (uint64_t)(uintptr_t)xt[pr->tier] | c << 48);
            if (pr->copies > COPIES_MAX &&
                (rc = kvr_ix_cmap_add(s, &h->extra, pr->key,
                                      (int64_t)(pr->copies - COPIES_MAX))) < 0)
                return rc;
            nr[pr->tier]++;
        }
        for (uint32_t m = pe->mask; m; m &= m - 1) {
            uint32_t t = (uint32_t)__builtin_ctz(m);
            if (nr[t] > 1 &&
                (rc = kvr_ix_cmap_add(s, &H[t]->alias, (uint64_t)(uintptr_t)xt[t],
                                      nr[t] - 1)) < 0)
                return rc;
        }
    }
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++) {
        if (H[t] == NULL)
            continue;
        ADD(H[t]->blocks, ps->cnt[t]);
        res->stored += ps->cnt[t];
        if (holes[t] > 0) {
            KVR_ASSERT(LD(H[t]->holes) == 0);
            __atomic_fetch_add(&ix->wslow[wid], 1, __ATOMIC_RELAXED);
            ST(H[t]->holes, holes[t]);
        }
    }
    /* orphans, FIFO; beyond this index's capacity the oldest are dropped, as parking does */
    uint32_t cap = ix->o.orphan_capacity;
    uint32_t keep = ps->norph < cap ? ps->norph : cap, skip = ps->norph - keep;
    res->orphans_dropped += skip;
    if (keep == 0)
        return 0;
    uint32_t nc = 16;
    while (nc < keep)
        nc *= 2;
    if (nc > cap)
        nc = cap;
    w->orph = sl_alloc(s, nc * sizeof(*w->orph));
    if (w->orph == NULL)
        return -ENOMEM;
    w->corph = nc;
    for (uint32_t i = 0; i < keep; i++) {
        const struct parked *pk = &ps->orph[skip + i];
        if (kvr_ix_cmap_add(s, &w->awaited, pk->parent, 1) < 0)
            return -ENOMEM;
        w->orph[w->norph++] = *pk;
        ST(w->porph, w->norph);
        ADD(s->orphans, 1);
        res->orphaned++;
    }
    return 0;
}

int kvr_index_worker_restore(struct kvr_index *ix, uint32_t wid, const void *blob, size_t len,
                             struct kvr_index_wres *res)
{
    struct kvr_index_wres local = {0};
    if (ix == NULL || (blob == NULL && len > 0))
        return -EINVAL;
    if (res == NULL)
        res = &local;
    struct worker *w = worker_get(ix, wid);
    if (w == NULL)
        return -ENOENT;
    if (w->norph != 0)
        return -EBUSY;
    for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
        if (w->h[t] != NULL && (w->h[t]->recs.n != 0 || LD(w->h[t]->holes) != 0))
            return -EBUSY;

    struct parsed ps = {0};
    struct ebr_slot *s = kvr_ix_slot_claim(ix, 0);
    ebr_enter(ix, s);
    int rc = parse(ix, blob, len, &ps), applied = rc == 0;
    struct kvr_index_wres part = {0};
    if (rc == 0)
        rc = apply(ix, s, w, wid, &ps, &part);
    ebr_exit(s);
    kvr_ix_ebr_reclaim(ix, s);
    kvr_ix_node_cache_roll(ix, s);
    slot_release(s);
    parsed_free(&ps);
    if (applied && rc == -EINVAL) {
        /* a conflict found half-way: what was applied goes again, the worker holds nothing
         * as before (its counters were not yet added to: clearing leaves them at 0) */
        struct kvr_index_wres gone = {0};
        (void)kvr_index_clear(ix, wid, -1, &gone);
        return rc;
    }
    res->stored += part.stored;
    res->orphaned += part.orphaned;
    res->orphans_dropped += part.orphans_dropped;
    return rc;
}
