/* test_index_diff.c — randomized differential test of the index against a naive model.
 *
 * The model keeps, per holder (worker, tier), a refcounted map engine hash -> (ns, position,
 * chain) and a count per (holder, ns, position, chain); find is the definition: for every
 * worker, walk positions from 0 while some tier holds the query's chain there. The orphan
 * policy (per-worker FIFO of orphan_capacity blocks, adoption sweeps) is modelled as
 * documented in index.c and index_int.h. Every operation's counters, every find answer (exact, scores use
 * dyadic weights so sums are exact, hits named by pod and rank) and periodically the
 * statistics are compared. Pods are also forgotten (kvr_index_pod_forget) and come back under
 * a new name: with max_workers = workers + 8, their worker and pod ids are reused.
 *
 * KVR_SEED=<n> reproduces a run; KVR_DIFF_OPS=<n> changes the operation count (default
 * 500,000, 120,000 in a sanitizer build, split over five sub-runs with jump strides 1, 2, 7,
 * 32 and 64; every run draws a new seed, so CI runs add up to many more).
 */
#include <errno.h>
#include <setjmp.h>

/* 1.2M operations took 33 s in a release build and 78 s under ASan on the 2-core CI
 * machine: the suite's budget is 10 minutes. A sanitizer build checks memory and races, for
 * which fewer operations suffice; the release build checks the answers. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DIFF_OPS_DEFAULT 120000
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DIFF_OPS_DEFAULT 120000
#endif
#endif
#ifndef DIFF_OPS_DEFAULT
#define DIFF_OPS_DEFAULT 500000
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "index/hash.h"
#include "index/index.h"

/* ---- rng ---- */
static uint64_t rng_s;
static uint64_t rnd(void)
{
    uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t rn(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}
static int chance(double p)
{
    return (double)(rnd() >> 11) / 9007199254740992.0 < p;
}
#define mixh kvr_hash_mix64

/* ---- a small map: 3-word key -> u64 value (0 = absent) ---- */
struct tslot {
    uint64_t a, b, c, v;
};
struct tmap {
    struct tslot *s;
    size_t mask, n;
};
static size_t th(uint64_t a, uint64_t b, uint64_t c)
{
    return (size_t)mixh(a * 31 + mixh(b) * 17 + mixh(c + 7));
}
static void tmap_grow(struct tmap *m)
{
    size_t cap = m->s ? (m->mask + 1) * 2 : 1024;
    struct tslot *ns = calloc(cap, sizeof(*ns));
    assert_non_null(ns);
    for (size_t i = 0; m->s && i <= m->mask; i++) {
        if (!m->s[i].v)
            continue;
        size_t j = th(m->s[i].a, m->s[i].b, m->s[i].c) & (cap - 1);
        while (ns[j].v)
            j = (j + 1) & (cap - 1);
        ns[j] = m->s[i];
    }
    free(m->s);
    m->s = ns;
    m->mask = cap - 1;
}
static uint64_t tmap_get(const struct tmap *m, uint64_t a, uint64_t b, uint64_t c)
{
    if (!m->s)
        return 0;
    size_t i = th(a, b, c) & m->mask;
    while (m->s[i].v) {
        if (m->s[i].a == a && m->s[i].b == b && m->s[i].c == c)
            return m->s[i].v;
        i = (i + 1) & m->mask;
    }
    return 0;
}
/* sets the value (0 deletes) */
static void tmap_set(struct tmap *m, uint64_t a, uint64_t b, uint64_t c, uint64_t v)
{
    if (!m->s || (m->n + 1) * 2 > m->mask + 1)
        tmap_grow(m);
    size_t i = th(a, b, c) & m->mask;
    while (m->s[i].v) {
        if (m->s[i].a == a && m->s[i].b == b && m->s[i].c == c)
            break;
        i = (i + 1) & m->mask;
    }
    if (!m->s[i].v) {
        if (!v)
            return;
        m->s[i] = (struct tslot){a, b, c, v};
        m->n++;
        return;
    }
    if (v) {
        m->s[i].v = v;
        return;
    }
    /* backward-shift delete */
    size_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (!m->s[j].v)
            break;
        size_t k = th(m->s[j].a, m->s[j].b, m->s[j].c) & m->mask;
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].v = 0;
    m->n--;
}
static uint64_t tmap_add(struct tmap *m, uint64_t a, uint64_t b, uint64_t c, int64_t d)
{
    uint64_t v = tmap_get(m, a, b, c) + (uint64_t)d;
    tmap_set(m, a, b, c, v);
    return v;
}
static void tmap_free(struct tmap *m)
{
    free(m->s);
    memset(m, 0, sizeof(*m));
}

/* ---- the model ---- */
struct rrec {
    uint64_t eh, chain;
    uint32_t ns, pos, copies, hidx, holder;
};
struct rholder {
    uint32_t *recs; /* indices into pool */
    uint32_t n, cap;
};
struct rpark {
    uint64_t eh, content, parent;
    uint32_t ns, tier;
};
struct model {
    uint32_t nworkers, ntiers, ranks, cap;
    struct rrec *pool;
    uint32_t npool, cpool, *freel, nfree;
    struct rholder *h; /* nworkers * 8 */
    struct tmap rec;   /* (holder, eh) -> pool index + 1 */
    struct tmap pres;  /* (holder, ns<<32|pos, chain) -> number of recs */
    struct tmap ent;   /* (ns, pos, chain) -> holders with pres > 0 */
    struct tmap p0;    /* (ns, chain) at position 0 -> index + 1 into p0v */
    struct hvec {
        uint32_t *h, n, cap;
    } *p0v;
    uint32_t np0v, cp0v;
    struct rpark **park;
    uint32_t *npark, *cpark;
    uint64_t nparked;
};
#define RH(w, t) ((w) * 8 + (t))

static struct rrec *m_find(struct model *m, uint32_t holder, uint64_t eh)
{
    uint64_t v = tmap_get(&m->rec, holder, eh, 0);
    return v ? &m->pool[v - 1] : NULL;
}
static struct rrec *m_find_worker(struct model *m, uint32_t w, uint32_t t, uint64_t eh)
{
    struct rrec *r = m_find(m, RH(w, t), eh);
    for (uint32_t u = 0; !r && u < 8; u++)
        if (u != t)
            r = m_find(m, RH(w, u), eh);
    return r;
}
static void m_pres(struct model *m, uint32_t holder, uint32_t ns, uint32_t pos, uint64_t chain,
                   int d)
{
    uint64_t key = (uint64_t)ns << 32 | pos;
    uint64_t v = tmap_add(&m->pres, holder, key, chain, d);
    if (d > 0 && v == 1)
        tmap_add(&m->ent, ns, pos, chain, 1);
    if (d < 0 && v == 0)
        tmap_add(&m->ent, ns, pos, chain, -1);
    if (pos != 0 || !((d > 0 && v == 1) || (d < 0 && v == 0)))
        return;
    /* holder list of position-0 entries: the model's candidates for find */
    uint64_t vi = tmap_get(&m->p0, ns, chain, 0);
    if (!vi) {
        if (m->np0v == m->cp0v) {
            m->cp0v = m->cp0v ? m->cp0v * 2 : 256;
            m->p0v = realloc(m->p0v, m->cp0v * sizeof(*m->p0v));
        }
        memset(&m->p0v[m->np0v], 0, sizeof(*m->p0v));
        vi = ++m->np0v;
        tmap_set(&m->p0, ns, chain, 0, vi);
    }
    struct hvec *hv = &m->p0v[vi - 1];
    if (d > 0) {
        if (hv->n == hv->cap) {
            hv->cap = hv->cap ? hv->cap * 2 : 4;
            hv->h = realloc(hv->h, hv->cap * sizeof(uint32_t));
        }
        hv->h[hv->n++] = holder;
    } else {
        uint32_t i = 0;
        while (hv->h[i] != holder)
            i++;
        hv->h[i] = hv->h[--hv->n];
    }
}
static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}
static struct rrec *m_new(struct model *m, uint32_t holder, uint64_t eh, uint32_t ns,
                          uint32_t pos, uint64_t chain)
{
    uint32_t idx;
    if (m->nfree)
        idx = m->freel[--m->nfree];
    else {
        if (m->npool == m->cpool) {
            m->cpool = m->cpool ? m->cpool * 2 : 4096;
            m->pool = realloc(m->pool, m->cpool * sizeof(*m->pool));
            m->freel = realloc(m->freel, m->cpool * sizeof(*m->freel));
        }
        idx = m->npool++;
    }
    struct rholder *h = &m->h[holder];
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 16;
        h->recs = realloc(h->recs, h->cap * sizeof(*h->recs));
    }
    struct rrec *r = &m->pool[idx];
    *r = (struct rrec){eh, chain, ns, pos, 1, h->n, holder};
    h->recs[h->n++] = idx;
    tmap_set(&m->rec, holder, eh, 0, idx + 1);
    m_pres(m, holder, ns, pos, chain, 1);
    return r;
}
static void m_del(struct model *m, struct rrec *r)
{
    uint32_t idx = (uint32_t)(r - m->pool);
    struct rholder *h = &m->h[r->holder];
    uint32_t last = h->recs[--h->n];
    h->recs[r->hidx] = last;
    m->pool[last].hidx = r->hidx;
    tmap_set(&m->rec, r->holder, r->eh, 0, 0);
    m_pres(m, r->holder, r->ns, r->pos, r->chain, -1);
    m->freel[m->nfree++] = idx;
}

/* one block stored after parent (NULL = position 0); returns the block's rec */
static struct rrec *m_store_one(struct model *m, uint32_t w, uint32_t t, uint32_t ns,
                                struct rrec *parent, uint64_t eh, uint64_t content,
                                struct kvr_index_wres *res)
{
    struct rrec *r = m_find(m, RH(w, t), eh);
    if (r) {
        r->copies++;
        res->duplicates++;
        return r;
    }
    uint32_t pos = parent ? parent->pos + 1 : 0;
    uint64_t pch = parent ? parent->chain : KVR_HASH_CHAIN_ROOT;
    res->stored++;
    return m_new(m, RH(w, t), eh, ns, pos, kvr_hash_chain(pch, content));
}
static void m_park_del(struct model *m, uint32_t w, uint32_t i)
{
    memmove(&m->park[w][i], &m->park[w][i + 1], (m->npark[w] - i - 1) * sizeof(struct rpark));
    m->npark[w]--;
    m->nparked--;
}
static void m_adopt(struct model *m, uint32_t w, struct kvr_index_wres *res)
{
    int progress;
    do {
        progress = 0;
        for (uint32_t i = 0; i < m->npark[w];) {
            struct rpark pk = m->park[w][i];
            struct rrec *p = m_find_worker(m, w, pk.tier, pk.parent);
            if (!p) {
                i++;
                continue;
            }
            /* copy: pool may move */
            struct rrec pc = *p;
            m_park_del(m, w, i);
            m_store_one(m, w, pk.tier, pk.ns, &pc, pk.eh, pk.content, res);
            res->orphans_adopted++;
            progress = 1;
        }
    } while (progress && m->npark[w] > 0);
}
static void m_store(struct model *m, uint32_t w, uint32_t t, uint32_t ns, const uint64_t *parent,
                    const struct kvr_index_block *b, size_t n, struct kvr_index_wres *res)
{
    struct rrec pc, *p = NULL;
    if (n == 0)
        return;
    if (parent) {
        p = m_find_worker(m, w, t, *parent);
        if (!p) {
            size_t k = n < m->cap ? n : m->cap;
            res->orphans_dropped += n - k;
            if (k == 0)
                return;
            while (m->npark[w] + k > m->cap) {
                m_park_del(m, w, 0);
                res->orphans_dropped++;
            }
            if (m->npark[w] + k > m->cpark[w]) {
                m->cpark[w] = m->npark[w] + (uint32_t)k + 16;
                m->park[w] = realloc(m->park[w], m->cpark[w] * sizeof(struct rpark));
            }
            for (size_t i = 0; i < k; i++) {
                m->park[w][m->npark[w]++] = (struct rpark){
                    b[i].engine_hash, b[i].content_hash, i ? b[i - 1].engine_hash : *parent, ns,
                    t};
                m->nparked++;
                res->orphaned++;
            }
            m_adopt(m, w, res);
            return;
        }
        pc = *p;
        p = &pc;
    }
    for (size_t i = 0; i < n; i++) {
        struct rrec *r = m_store_one(m, w, t, ns, p, b[i].engine_hash, b[i].content_hash, res);
        pc = *r;
        p = &pc;
    }
    if (m->npark[w])
        m_adopt(m, w, res);
}
static void m_remove(struct model *m, uint32_t w, uint32_t t, const uint64_t *eh, size_t n,
                     struct kvr_index_wres *res)
{
    for (size_t i = 0; i < n; i++) {
        struct rrec *r = m_find(m, RH(w, t), eh[i]);
        if (r) {
            if (--r->copies == 0) {
                m_del(m, r);
                res->removed++;
            }
            continue;
        }
        uint32_t k;
        for (k = 0; k < m->npark[w]; k++)
            if (m->park[w][k].eh == eh[i] && m->park[w][k].tier == t)
                break;
        if (k < m->npark[w]) {
            m_park_del(m, w, k);
            res->orphans_dropped++;
        } else {
            res->unknown_removes++;
        }
    }
}
static void m_clear(struct model *m, uint32_t w, int tier, struct kvr_index_wres *res)
{
    for (uint32_t t = 0; t < 8; t++) {
        if (tier >= 0 && (uint32_t)tier != t)
            continue;
        struct rholder *h = &m->h[RH(w, t)];
        while (h->n) {
            m_del(m, &m->pool[h->recs[h->n - 1]]);
            res->cleared++;
        }
        for (uint32_t i = 0; i < m->npark[w];) {
            if (m->park[w][i].tier == t) {
                m_park_del(m, w, i);
                res->orphans_dropped++;
            } else
                i++;
        }
    }
}

/* ---- the scenario ---- */
#define NNS 3
#define NDOC 48
#define MAXLEN 80
struct doc {
    uint32_t len;
    uint64_t content[MAXLEN];
    uint64_t eh[2][MAXLEN]; /* two salts: aliasing */
};
struct scen {
    struct kvr_index *ix;
    struct kvr_index_reader *rd;
    struct model m;
    uint32_t ns[NNS];
    uint32_t *wid; /* model worker -> index wid */
    uint32_t *pod; /* model worker -> index pod id */
    uint32_t *gen; /* model pod -> times forgotten (its index name is pod-<n>-g<gen>) */
    uint8_t tiers[4];
    struct doc docs[NNS][NDOC];
    uint64_t alpha[NNS][10];
};

static void gen_docs(struct scen *sc)
{
    for (int n = 0; n < NNS; n++) {
        for (int a = 0; a < 10; a++)
            sc->alpha[n][a] = mixh((uint64_t)n * 1000 + (uint64_t)a + 1);
        for (int d = 0; d < NDOC; d++) {
            struct doc *D = &sc->docs[n][d];
            D->len = 1 + rn(MAXLEN);
            uint32_t shared = 0;
            if (d > 0 && chance(0.6)) {
                struct doc *S = &sc->docs[n][rn((uint32_t)d)];
                shared = rn(S->len + 1);
                if (shared > D->len)
                    shared = D->len;
                memcpy(D->content, S->content, shared * sizeof(uint64_t));
            }
            for (uint32_t i = shared; i < D->len; i++)
                D->content[i] = sc->alpha[n][rn(10)];
            for (int s = 0; s < 2; s++) {
                uint64_t prev = (uint64_t)n * 77 + 5;
                for (uint32_t i = 0; i < D->len; i++) {
                    prev = mixh(prev ^ D->content[i] ^ (uint64_t)s * 0xabcdef);
                    D->eh[s][i] = prev;
                }
            }
        }
    }
}

static void check_res(const struct kvr_index_wres *a, const struct kvr_index_wres *b,
                      uint64_t seed, uint64_t op, const char *what)
{
    if (memcmp(a, b, sizeof(*a)) != 0) {
        fprintf(stderr,
                "DIFF seed=%llu op=%llu %s counters: index stored=%llu dup=%llu orph=%llu "
                "adopt=%llu drop=%llu rm=%llu unk=%llu clr=%llu | model stored=%llu dup=%llu "
                "orph=%llu adopt=%llu drop=%llu rm=%llu unk=%llu clr=%llu\n",
                (unsigned long long)seed, (unsigned long long)op, what,
                (unsigned long long)a->stored, (unsigned long long)a->duplicates,
                (unsigned long long)a->orphaned, (unsigned long long)a->orphans_adopted,
                (unsigned long long)a->orphans_dropped, (unsigned long long)a->removed,
                (unsigned long long)a->unknown_removes, (unsigned long long)a->cleared,
                (unsigned long long)b->stored, (unsigned long long)b->duplicates,
                (unsigned long long)b->orphaned, (unsigned long long)b->orphans_adopted,
                (unsigned long long)b->orphans_dropped, (unsigned long long)b->removed,
                (unsigned long long)b->unknown_removes, (unsigned long long)b->cleared);
        fail();
    }
}

static const double wchoices[] = {0, 0.25, 0.5, 0.75, 1, 1.25, 2, -0.5};

/* model workers sorted by their index wid (hits come in ascending wid; forgotten ids are
 * reused, so the order is not the model's) */
static const uint32_t *cmp_wid_map;
static int cmp_by_wid(const void *a, const void *b)
{
    uint32_t x = cmp_wid_map[*(const uint32_t *)a], y = cmp_wid_map[*(const uint32_t *)b];
    return x < y ? -1 : x > y;
}

static void pod_name(const struct scen *sc, uint32_t mw, char *buf, size_t cap)
{
    uint32_t p = mw / sc->m.ranks;
    snprintf(buf, cap, "pod-%u-g%u", p, sc->gen[p]);
}

static uint64_t run_find(struct scen *sc, uint64_t seed, uint64_t op)
{
    struct model *m = &sc->m;
    uint32_t n = rn(NNS);
    struct doc *D = &sc->docs[n][rn(NDOC)];
    uint64_t q[MAXLEN + 16];
    uint32_t len = 1 + rn(D->len);
    if (chance(0.2) && D->len >= 10) /* 10..19 blocks: often held to the end by all who
                                       * hold it after a few jump landings (find's early
                                       * look at the last block succeeds) */
        len = 10 + rn(D->len - 9 < 10 ? D->len - 9 : 10);
    memcpy(q, D->content, len * sizeof(uint64_t));
    if (chance(0.3)) /* diverge somewhere (often at 1: SGLang's case) */
        q[chance(0.3) ? (len > 1 ? 1 : 0) : rn(len)] = sc->alpha[n][rn(10)];
    if (chance(0.2)) {
        uint32_t extra = rn(16);
        for (uint32_t i = 0; i < extra; i++)
            q[len++] = sc->alpha[n][rn(10)];
    }
    double w[KVR_TIER_MAX];
    for (int t = 0; t < KVR_TIER_MAX; t++)
        w[t] = wchoices[rn(8)];
    uint32_t pods[3], npods = 0;
    uint32_t npod_total = (m->nworkers + m->ranks - 1) / m->ranks;
    if (chance(0.1)) {
        npods = 1 + rn(3);
        for (uint32_t i = 0; i < npods; i++)
            pods[i] = sc->pod[rn(npod_total) * m->ranks];
    }
    const struct kvr_index_hit *hits;
    size_t nh;
    assert_int_equal(kvr_index_find(sc->rd, sc->ns[n], q, len, pods, npods, w, &hits, &nh), 0);

    /* model */
    uint64_t ch[MAXLEN + 16];
    uint64_t c = KVR_HASH_CHAIN_ROOT;
    for (uint32_t i = 0; i < len; i++)
        ch[i] = c = kvr_hash_chain(c, q[i]);
    size_t k = 0;
    /* candidates: workers holding position 0 in some tier */
    static uint32_t cand[1 << 16];
    uint32_t ncand = 0;
    uint64_t vi = tmap_get(&m->p0, sc->ns[n], ch[0], 0);
    if (vi) {
        struct hvec *hv = &m->p0v[vi - 1];
        for (uint32_t i = 0; i < hv->n; i++)
            cand[ncand++] = hv->h[i] / 8;
        qsort(cand, ncand, sizeof(uint32_t), cmp_u32);
        uint32_t u = 0; /* unique, then by wid */
        for (uint32_t i = 0; i < ncand; i++)
            if (u == 0 || cand[u - 1] != cand[i])
                cand[u++] = cand[i];
        ncand = u;
        cmp_wid_map = sc->wid;
        qsort(cand, ncand, sizeof(uint32_t), cmp_by_wid);
    }
    for (uint32_t ci = 0; ci < ncand; ci++) {
        uint32_t mw = cand[ci];
        if (ci > 0 && cand[ci - 1] == mw)
            continue;
        if (npods) {
            int ok = 0;
            for (uint32_t i = 0; i < npods; i++)
                ok |= pods[i] == sc->pod[mw];
            if (!ok)
                continue;
        }
        uint32_t tm[KVR_TIER_MAX] = {0}, alive = 0, matched = 0;
        double score = 0;
        for (uint32_t p = 0; p < len; p++) {
            uint32_t mask = 0;
            for (uint32_t t = 0; t < m->ntiers; t++)
                if (tmap_get(&m->pres, RH(mw, t), (uint64_t)sc->ns[n] << 32 | p, ch[p]))
                    mask |= 1u << t;
            if (p == 0)
                alive = mask;
            alive &= mask;
            for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
                if (alive >> t & 1)
                    tm[t] = p + 1;
            if (!mask)
                break;
            double b = 0;
            int first = 1;
            for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
                if (mask >> t & 1) {
                    if (first || w[t] > b)
                        b = w[t];
                    first = 0;
                }
            score += b;
            matched = p + 1;
        }
        if (!matched)
            continue;
        /* model workers map 1:1 onto index wids; hits are named by their pod and rank */
        char pname[48];
        pod_name(sc, mw, pname, sizeof(pname));
        if (k < nh && (hits[k].pod == NULL || strcmp(hits[k].pod, pname) != 0 ||
                       hits[k].dp_rank != mw % m->ranks)) {
            fprintf(stderr, "DIFF seed=%llu op=%llu find: hit %zu (wid %u) named %s/%u, "
                            "expected %s/%u\n",
                    (unsigned long long)seed, (unsigned long long)op, k, hits[k].wid,
                    hits[k].pod ? hits[k].pod : "(null)", hits[k].dp_rank, pname,
                    mw % m->ranks);
            fail();
        }
        if (k >= nh || hits[k].wid != sc->wid[mw] || hits[k].matched != matched ||
            memcmp(hits[k].tier_matched, tm, sizeof(tm)) != 0 || hits[k].score != score) {
            fprintf(stderr, "DIFF seed=%llu op=%llu find (len %u): worker %u expected matched=%u "
                            "score=%g tm=[%u %u %u %u]",
                    (unsigned long long)seed, (unsigned long long)op, len, sc->wid[mw], matched,
                    score, tm[0], tm[1], tm[2], tm[3]);
            if (k < nh)
                fprintf(stderr, "; index hit %zu: wid %u matched=%u score=%g tm=[%u %u %u %u]\n",
                        k, hits[k].wid, hits[k].matched, hits[k].score, hits[k].tier_matched[0],
                        hits[k].tier_matched[1], hits[k].tier_matched[2],
                        hits[k].tier_matched[3]);
            else
                fprintf(stderr, "; index has only %zu hits\n", nh);
            fail();
        }
        k++;
    }
    if (k != nh) {
        fprintf(stderr, "DIFF seed=%llu op=%llu find: index has %zu hits, model %zu (extra wid %u)\n",
                (unsigned long long)seed, (unsigned long long)op, nh, k, hits[k].wid);
        fail();
    }
    return nh;
}

static void check_stats(struct scen *sc, uint64_t seed, uint64_t op)
{
    struct model *m = &sc->m;
    struct kvr_index_stats st;
    kvr_index_stats(sc->ix, &st);
    if (st.workers != m->nworkers) {
        fprintf(stderr, "DIFF seed=%llu op=%llu stats: workers %llu/%u\n",
                (unsigned long long)seed, (unsigned long long)op,
                (unsigned long long)st.workers, m->nworkers);
        fail();
    }
    if (st.entries != m->ent.n || st.holders != m->pres.n || st.orphans != m->nparked) {
        fprintf(stderr, "DIFF seed=%llu op=%llu stats: entries %llu/%zu holders %llu/%zu "
                        "orphans %llu/%llu\n",
                (unsigned long long)seed, (unsigned long long)op,
                (unsigned long long)st.entries, m->ent.n, (unsigned long long)st.holders,
                m->pres.n, (unsigned long long)st.orphans, (unsigned long long)m->nparked);
        fail();
    }
    for (uint32_t w = 0; w < m->nworkers; w++) {
        uint64_t b[KVR_TIER_MAX];
        kvr_index_worker_blocks(sc->ix, sc->wid[w], b);
        for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
            if (b[t] != m->h[RH(w, t)].n) {
                fprintf(stderr, "DIFF seed=%llu op=%llu blocks of worker %u tier %u: %llu/%u\n",
                        (unsigned long long)seed, (unsigned long long)op, w, t,
                        (unsigned long long)b[t], m->h[RH(w, t)].n);
                fail();
            }
    }
}

static void subrun(uint64_t seed, uint32_t stride, uint32_t nworkers, uint32_t ranks,
                   uint32_t cap, uint32_t find_permille, uint64_t nops, uint64_t *nfinds,
                   uint64_t *nhits)
{
    struct scen *sc = calloc(1, sizeof(*sc));
    struct model *m = &sc->m;
    struct kvr_index_opts o = {.jump_stride = stride, .max_workers = nworkers + 8,
                               .orphan_capacity = cap, .max_query_blocks = MAXLEN + 16};
    rng_s = seed;
    assert_int_equal(kvr_index_create(&o, &sc->ix), 0);
    assert_int_equal(kvr_index_reader_create(sc->ix, &sc->rd), 0);
    assert_int_equal(kvr_index_ns_intern(sc->ix, "model-a", NULL, &sc->ns[0], NULL), 0);
    assert_int_equal(kvr_index_ns_intern(sc->ix, "model-a", "lora-x", &sc->ns[1], NULL), 0);
    assert_int_equal(kvr_index_ns_intern(sc->ix, "model-b", NULL, &sc->ns[2], NULL), 0);
    sc->tiers[0] = KVR_TIER_GPU;
    sc->tiers[1] = KVR_TIER_CPU;
    assert_int_equal(kvr_index_tier_intern(sc->ix, "DISK", 4, &sc->tiers[2]), 0);
    assert_int_equal(sc->tiers[2], 3);
    m->nworkers = nworkers;
    m->ranks = ranks;
    m->ntiers = 4; /* gpu, cpu, (storage unused), disk */
    m->cap = cap;
    m->h = calloc((size_t)nworkers * 8, sizeof(*m->h));
    m->park = calloc(nworkers, sizeof(*m->park));
    m->npark = calloc(nworkers, sizeof(*m->npark));
    m->cpark = calloc(nworkers, sizeof(*m->cpark));
    sc->wid = calloc(nworkers, sizeof(uint32_t));
    sc->pod = calloc(nworkers, sizeof(uint32_t));
    sc->gen = calloc(nworkers, sizeof(uint32_t));
    for (uint32_t w = 0; w < nworkers; w++) {
        char pod[48];
        pod_name(sc, w, pod, sizeof(pod));
        assert_int_equal(kvr_index_worker_intern(sc->ix, pod, w % ranks, &sc->wid[w]), 0);
        assert_int_equal(sc->wid[w], w);
        assert_int_equal(kvr_index_pod_lookup(sc->ix, pod, &sc->pod[w]), 0);
    }
    gen_docs(sc);

    /* a few "hot" workers get most operations so chains grow long and holes appear */
    uint32_t hot = nworkers < 16 ? nworkers : 16;
    for (uint64_t op = 0; op < nops; op++) {
        uint32_t w = chance(0.5) ? rn(hot) : rn(nworkers);
        uint32_t mt = chance(0.6) ? 0 : (chance(0.5) ? 1 : 3); /* tier */
        uint32_t kind = rn(907);
        if (rn(1000) < find_permille)
            kind = 999; /* find */
        struct kvr_index_wres a = {0}, b = {0};
        if (kind < 520) { /* store */
            uint32_t n = rn(NNS);
            struct doc *D = &sc->docs[n][rn(NDOC)];
            int salt = chance(0.05);
            uint32_t s = chance(0.6) ? 0 : rn(D->len);
            uint32_t k = 1 + rn(D->len - s);
            struct kvr_index_block bl[MAXLEN];
            for (uint32_t i = 0; i < k; i++) {
                bl[i].engine_hash = D->eh[salt][s + i];
                bl[i].content_hash = D->content[s + i];
            }
            if (k > 1 && chance(0.03)) {
                /* an engine hash from elsewhere inside the store: when the worker holds it,
                 * a duplicate at another position, so the blocks after it chain from that
                 * entry (the store's look-ahead prediction breaks there) */
                struct doc *E = &sc->docs[n][rn(NDOC)];
                bl[1 + rn(k - 1)].engine_hash = E->eh[chance(0.5)][rn(E->len)];
            }
            uint64_t par = s > 0 ? D->eh[salt][s - 1] : 0;
            if (chance(0.03)) {
                par = rnd(); /* a parent that will never come */
                if (!s)
                    s = 1;
            }
            assert_int_equal(kvr_index_store(sc->ix, sc->wid[w], (uint8_t)sc->tiers[mt == 3 ? 2 : mt],
                                             sc->ns[n], s ? &par : NULL, bl, k, &a),
                             0);
            m_store(m, w, mt, sc->ns[n], s ? &par : NULL, bl, k, &b);
            check_res(&a, &b, seed, op, "store");
        } else if (kind < 900) { /* remove */
            uint64_t eh[48];
            uint32_t k = chance(0.1) ? 1 + rn(48) : 1 + rn(12); /* some span remove windows */
            uint32_t n = rn(NNS);
            struct doc *D = &sc->docs[n][rn(NDOC)];
            int salt = chance(0.05);
            uint32_t start = rn(D->len);
            int leaf_first = chance(0.5);
            for (uint32_t i = 0; i < k; i++) {
                if (chance(0.08))
                    eh[i] = rnd();
                else if (leaf_first)
                    eh[i] = D->eh[salt][(D->len - 1 - (start + i) % D->len)];
                else
                    eh[i] = D->eh[salt][rn(D->len)];
            }
            assert_int_equal(kvr_index_remove(sc->ix, sc->wid[w], (uint8_t)sc->tiers[mt == 3 ? 2 : mt],
                                              eh, k, &a),
                             0);
            m_remove(m, w, mt, eh, k, &b);
            check_res(&a, &b, seed, op, "remove");
        } else if (kind < 903) { /* clear */
            int t = chance(0.5) ? -1 : (int)mt;
            int it = t < 0 ? -1 : sc->tiers[t == 3 ? 2 : t];
            assert_int_equal(kvr_index_clear(sc->ix, sc->wid[w], it, &a), 0);
            m_clear(m, w, t, &b);
            check_res(&a, &b, seed, op, "clear");
        } else if (kind < 905) { /* purge the pod */
            uint32_t first = w - w % ranks;
            assert_int_equal(kvr_index_purge_pod(sc->ix, sc->pod[w], &a), 0);
            for (uint32_t x = first; x < first + ranks && x < nworkers; x++)
                m_clear(m, x, -1, &b);
            check_res(&a, &b, seed, op, "purge");
        } else if (kind < 907) { /* forget the pod; it comes back under a new name (ids reused) */
            uint32_t first = w - w % ranks, p = w / ranks;
            char old[48], nw[48];
            pod_name(sc, first, old, sizeof(old));
            assert_int_equal(kvr_index_pod_forget(sc->ix, sc->pod[w], &a), 0);
            assert_int_equal(kvr_index_pod_forget(sc->ix, sc->pod[w], NULL), -ENOENT);
            for (uint32_t x = first; x < first + ranks && x < nworkers; x++)
                m_clear(m, x, -1, &b);
            check_res(&a, &b, seed, op, "forget");
            assert_int_equal(kvr_index_pod_lookup(sc->ix, old, NULL), -ENOENT);
            assert_int_equal(kvr_index_worker_lookup(sc->ix, old, 0, NULL), -ENOENT);
            sc->gen[p]++;
            pod_name(sc, first, nw, sizeof(nw));
            for (uint32_t x = first; x < first + ranks && x < nworkers; x++) {
                assert_int_equal(kvr_index_worker_intern(sc->ix, nw, x % ranks, &sc->wid[x]), 0);
                assert_int_equal(kvr_index_pod_lookup(sc->ix, nw, &sc->pod[x]), 0);
                assert_true(sc->wid[x] < nworkers + 8);
            }
            assert_int_equal(kvr_index_worker_live(sc->ix), nworkers);
        } else if (kind == 999) {
            *nhits += run_find(sc, seed, op);
            (*nfinds)++;
        }
        if (op % 20000 == 19999)
            check_stats(sc, seed, op);
    }
    check_stats(sc, seed, nops);

    /* drain everything: the index must end empty */
    for (uint32_t w = 0; w < nworkers; w++) {
        struct kvr_index_wres a = {0}, b = {0};
        assert_int_equal(kvr_index_clear(sc->ix, sc->wid[w], -1, &a), 0);
        m_clear(m, w, -1, &b);
        check_res(&a, &b, seed, nops, "final clear");
    }
    struct kvr_index_stats st;
    kvr_index_stats(sc->ix, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.holders, 0);
    assert_int_equal(st.orphans, 0);

    kvr_index_reader_destroy(sc->rd);
    kvr_index_destroy(sc->ix);
    for (uint32_t i = 0; i < nworkers * 8; i++)
        free(m->h[i].recs);
    for (uint32_t w = 0; w < nworkers; w++)
        free(m->park[w]);
    free(m->park);
    free(m->npark);
    free(m->cpark);
    free(m->h);
    free(m->pool);
    free(m->freel);
    tmap_free(&m->rec);
    tmap_free(&m->pres);
    tmap_free(&m->ent);
    tmap_free(&m->p0);
    for (uint32_t i = 0; i < m->np0v; i++)
        free(m->p0v[i].h);
    free(m->p0v);
    free(sc->wid);
    free(sc->pod);
    free(sc->gen);
    free(sc);
}

static void test_diff(void **state)
{
    (void)state;
    const char *env = getenv("KVR_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    const char *ops_env = getenv("KVR_DIFF_OPS");
    uint64_t total = ops_env ? strtoull(ops_env, NULL, 0) : DIFF_OPS_DEFAULT;
    printf("test_index_diff: KVR_SEED=%llu ops=%llu\n", (unsigned long long)seed,
           (unsigned long long)total);
    fflush(stdout);
    struct {
        uint32_t stride, workers, ranks, cap, find_permille;
    } runs[] = {{1, 24, 2, 16, 100}, {2, 400, 4, 0, 25}, {7, 3000, 3, 64, 6}, {32, 1200, 2, 8, 12},
                /* stride 64: drops between 0 and 64 take find's wide search (7 probes a
                 * round over intervals of 64+ blocks, as in long queries' strides) */
                {64, 300, 2, 8, 40}};
    const int nruns = (int)(sizeof(runs) / sizeof(runs[0]));
    uint64_t finds = 0, hits = 0;
    for (int i = 0; i < nruns; i++)
        subrun(seed + (uint64_t)i * 0x1234567, runs[i].stride, runs[i].workers, runs[i].ranks,
               runs[i].cap, runs[i].find_permille, total / (uint64_t)nruns, &finds, &hits);
    printf("test_index_diff: %llu finds, %llu hits compared, 0 differences\n",
           (unsigned long long)finds, (unsigned long long)hits);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_diff)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
