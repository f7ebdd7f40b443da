/* index_find.c — the readers: kvr_index_find, the chain math and the exact jump search.
 * Any number of reader threads, one struct kvr_index_reader each; they never lock (index_int.h,
 * CONCURRENCY) and make no heap allocation: a reader's scratch (sized by max_query_blocks and
 * max_workers) is allocated with it.
 *
 * LEMMA
 * If holes(H) == 0 (index_write.c, HOLES) and H holds the entry at position L with the
 * query's chain hash, then H holds the entry of every position <= L of the query (its parent
 * is held and has chain[L-1] — equal chain hashes mean equal prefixes, 2^-64 bounds — by
 * induction). So for a hole-free holder the positions of the query it holds are exactly
 * [0, tm).
 *
 * EXACT JUMP SEARCH
 * find looks only at jump landings (every jump_stride blocks, at most LAND_MAX = 32 of them:
 * a longer query gets them further apart, so its cost does not grow with its length by the
 * landing; chains computed 8 landings at a time: each stride's content sum by its own Horner
 * chain, 8 interleaved, then one multiply-add per landing; table slots and nodes prefetched a
 * few landings ahead); a landing whose holder set equals the alive set (compared in place,
 * one memcmp) costs one pass; holders missing at a landing are bisected within the stride
 * behind it, split into groups by each probe (a probe whose set equals the set at the group's
 * lower bound, unchanged since the group was seen there by its seqlock sequence, or the set
 * at its upper bound, moves the whole group; a probe 64+ blocks from the group's lower bound
 * gets its chain by the interleaved sums, a nearer one block by block from the nearest known
 * chain). A landing that keeps few of many alive holders (16x fewer: a shared prefix ends)
 * finds them by binary search in the alive ids and drops the runs between them whole. The
 * last block is looked at early (after LAST_AT landings with nobody gone, or at the first
 * landing where some stopped and others go on, when LAST_MIN landings or more remain): all
 * the landing chains are computed then, the last block's lookup is staged over the next
 * landings like a landing's, and if its holder set equals the alive set (one memcmp) they
 * all hold the whole query and the landings stop (one long match among shorter shared ones
 * no longer walks the landings to the end).
 * A worker is "fast" when all its holders are hole-free (a dense per-worker counter says so):
 * matched = max tm over its tiers, and the score follows from the tm values. Any other worker
 * is scanned position by position (find_slow: exact, slower). No "same count means same set"
 * shortcut anywhere: sets are compared or intersected. The usual answer (no pod filter,
 * workers with one hole-free holder each) is a leading run of position 0's holder set:
 * classified by one check per holder and written out by a straight loop; the rest goes
 * through the general per-worker classification and output.
 * Where find's time goes, and the searches tried and dropped: docs/index.md, find.
 */
#include "index/index_int.h"

struct slowst {
    uint32_t wid;
    uint32_t alive; /* tiers holding every position so far */
    uint32_t done;
    uint32_t matched;
    uint32_t base;      /* matched_base: positions held in a tier not set aside */
    uint32_t base_done;
    uint32_t tm[KVR_TIER_MAX];
    double score;
};

#define PF_SLOT 8 /* landings ahead whose table slot is prefetched */
#define PF_NODE 4 /* landings ahead whose node is prefetched */
#define PF_HSET 2 /* landings ahead looked up, their holder array prefetched */
#define LAND_MAX 32 /* landings, at most (longer queries: further apart) */
#define LAST_MIN 6  /* landings left that make the last block worth a look */
#define LAST_AT 3   /* the landing after which everyone still there makes it worth one */

struct kvr_index_reader {
    struct kvr_index *ix;
    struct ebr_slot *slot;
    uint32_t qid;
    uint32_t maxq, maxh, maxw;
    uint64_t root;      /* the query namespace's chain root */
    uint32_t aside;     /* tiers left out of matched_base (kvr_index_reader_aside) */
    uint64_t *ch;       /* chain per position, valid where chq[p] == qid */
    uint32_t *chq;
    struct node **nd;   /* node per position, valid where ndq[p] == qid */
    uint32_t *ndq;
    uint64_t *lh;       /* key hash per landing */
    uint64_t m2[32];    /* KVR_HASH_CHAIN_MUL^(2^b) */
    uint32_t *podq;     /* allowed pods: podq[pod] == qid */
    uint32_t *s0;       /* holders at position 0 (filtered; bit 31 marks slow workers) */
    uint32_t *buf;      /* a holder set being examined */
    uint32_t *alive;    /* indices into s0 of fast holders still matching */
    uint32_t *ah;       /* their holder ids */
    uint32_t *drop;     /* indices into s0 that dropped out between two landings */
    uint32_t *tmp;
    uint32_t *tm;       /* per s0 index: positions matched by that holder */
    struct slowst *sw;
    struct kvr_index_hit *hits;
    /* the hits' names: per worker id, the generation (ix->wgen) whose pod name and rank are
     * cached here (copies: the records may be freed once a find ends) */
    uint32_t *cgen, *crank;
    char **cname;
};

void kvr_index_reader_aside(struct kvr_index_reader *r, uint32_t tier_mask)
{
    r->aside = tier_mask;
}

int kvr_index_reader_create(struct kvr_index *ix, struct kvr_index_reader **out)
{
    if (ix == NULL || out == NULL)
        return -EINVAL;
    struct ebr_slot *s = kvr_ix_slot_claim(ix, 1);
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
    size_t q = r->maxq, h = r->maxh;
    r->ch = sl_alloc(s, q * sizeof(*r->ch));
    r->chq = sl_calloc(s, q * sizeof(*r->chq));
    r->nd = sl_alloc(s, q * sizeof(*r->nd));
    r->ndq = sl_calloc(s, q * sizeof(*r->ndq));
    r->lh = sl_alloc(s, q * sizeof(*r->lh));
    r->m2[0] = KVR_HASH_CHAIN_MUL;
    for (int b = 1; b < 32; b++)
        r->m2[b] = r->m2[b - 1] * r->m2[b - 1];
    r->podq = sl_calloc(s, (size_t)r->maxw * sizeof(*r->podq));
    r->s0 = sl_alloc(s, h * sizeof(uint32_t));
    r->buf = sl_alloc(s, h * sizeof(uint32_t));
    r->alive = sl_alloc(s, h * sizeof(uint32_t));
    r->ah = sl_alloc(s, h * sizeof(uint32_t));
    r->drop = sl_alloc(s, h * sizeof(uint32_t));
    r->tmp = sl_alloc(s, h * sizeof(uint32_t));
    r->tm = sl_alloc(s, h * sizeof(uint32_t));
    r->sw = sl_alloc(s, (size_t)r->maxw * sizeof(*r->sw));
    r->hits = sl_alloc(s, (size_t)r->maxw * sizeof(*r->hits));
    r->cgen = sl_calloc(s, (size_t)r->maxw * sizeof(*r->cgen));
    r->crank = sl_calloc(s, (size_t)r->maxw * sizeof(*r->crank));
    r->cname = sl_calloc(s, (size_t)r->maxw * sizeof(*r->cname));
    if (!r->ch || !r->chq || !r->nd || !r->ndq || !r->lh || !r->podq || !r->s0 || !r->buf ||
        !r->alive || !r->ah || !r->drop || !r->tmp || !r->tm || !r->sw || !r->hits ||
        !r->cgen || !r->crank || !r->cname) {
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
    for (uint32_t w = 0; r->cname != NULL && w < r->maxw; w++)
        sl_free(s, r->cname[w]);
    void *p[] = {r->ch, r->chq, r->nd, r->ndq, r->lh, r->podq, r->s0, r->buf,
                 r->alive, r->ah, r->drop, r->tmp, r->tm, r->sw, r->hits, r->cgen,
                 r->crank, r->cname, r};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
        sl_free(s, p[i]);
    slot_release(s);
}

/* Chain hash at p, sequentially from the nearest position below already known. */
static uint64_t chain_seq(struct kvr_index_reader *r, const uint64_t *q, uint32_t p)
{
    const uint32_t qid = r->qid;
    if (r->chq[p] == qid)
        return r->ch[p];
    uint32_t b = p;
    while (b > 0 && r->chq[b - 1] != qid)
        b--;
    uint64_t c = b == 0 ? r->root : r->ch[b - 1];
    for (; b <= p; b++) {
        c = kvr_hash_chain(c, q[b]);
        r->ch[b] = c;
        r->chq[b] = qid;
    }
    return c;
}

/* M^g (M = KVR_HASH_CHAIN_MUL): the index's table up to jump_stride, else from the reader's
 * table of M^(2^b) (one multiply per set bit). */
static inline uint64_t mpow(const struct kvr_index_reader *r, uint32_t g)
{
    if (g <= r->ix->o.jump_stride)
        return r->ix->pw[g];
    uint64_t v = 1;
    for (uint32_t b = 0; g != 0; b++, g >>= 1)
        if (g & 1)
            v *= r->m2[b];
    return v;
}

/* sum_{i<g} x[i]*M^(g-1-i). Long runs are split in 8 parts whose Horner sums run
 * interleaved (8 independent multiply chains) and are joined by one multiply-add each. */
static uint64_t seg_sum(const struct kvr_index_reader *r, const uint64_t *x, uint32_t g)
{
    const uint64_t M = KVR_HASH_CHAIN_MUL;
    uint64_t s = 0;
    uint32_t i = 0;
    if (g >= 32) {
        const uint32_t l = g / 8;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        for (uint32_t k = 0; k < l; k++) {
            s0 = s0 * M + x[k];
            s1 = s1 * M + x[k + l];
            s2 = s2 * M + x[k + 2 * l];
            s3 = s3 * M + x[k + 3 * l];
            s4 = s4 * M + x[k + 4 * l];
            s5 = s5 * M + x[k + 5 * l];
            s6 = s6 * M + x[k + 6 * l];
            s7 = s7 * M + x[k + 7 * l];
        }
        const uint64_t ml = mpow(r, l);
        s = ((((((s0 * ml + s1) * ml + s2) * ml + s3) * ml + s4) * ml + s5) * ml + s6) * ml + s7;
        i = 8 * l;
    }
    for (; i < g; i++)
        s = s * M + x[i];
    return s;
}

/* Chain at p > lo from the known chain at lo; cached. */
static inline uint64_t chain_from(struct kvr_index_reader *r, const uint64_t *q, uint32_t lo,
                                  uint32_t p)
{
    uint64_t c = r->ch[lo] * mpow(r, p - lo) + seg_sum(r, q + lo + 1, p - lo);
    r->ch[p] = c;
    r->chq[p] = r->qid;
    return c;
}

/* Chains at the 8 landings base + u*k (u = 1..8) from the known one at base: each stride's
 * content sum is a Horner chain of its own, the 8 run interleaved (8 independent multiply
 * chains, one multiply-add a block), then chain[L_u] = chain[L_(u-1)]*M^k + S_u. */
static void chain_land8(struct kvr_index_reader *r, const uint64_t *q, uint32_t base, uint32_t k,
                        uint64_t *lh)
{
    const uint64_t M = KVR_HASH_CHAIN_MUL;
    const uint64_t *x = q + base + 1;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (uint32_t i = 0; i < k; i++) {
        s0 = s0 * M + x[i];
        s1 = s1 * M + x[i + k];
        s2 = s2 * M + x[i + 2 * k];
        s3 = s3 * M + x[i + 3 * k];
        s4 = s4 * M + x[i + 4 * k];
        s5 = s5 * M + x[i + 5 * k];
        s6 = s6 * M + x[i + 6 * k];
        s7 = s7 * M + x[i + 7 * k];
    }
    const uint64_t mk = mpow(r, k), qid = r->qid;
    uint32_t L = base;
    uint64_t c = r->ch[L], sv[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    for (int u = 0; u < 8; u++) {
        L += k;
        c = c * mk + sv[u];
        r->ch[L] = c;
        r->chq[L] = (uint32_t)qid;
        lh[u] = key_hash(c);
    }
}

/* Chain at p, the chain at lo < p known: a long way (wide strides of long queries) by the
 * interleaved sums, a short one sequentially from the nearest known position. */
static inline uint64_t chain_at(struct kvr_index_reader *r, const uint64_t *q, uint32_t lo,
                                uint32_t p)
{
    if (r->chq[p] == r->qid)
        return r->ch[p];
    if (p - lo >= 64)
        return chain_from(r, q, lo, p);
    return chain_seq(r, q, p);
}

static inline struct node *node_at(struct kvr_index_reader *r, uint32_t ns, const uint64_t *q,
                                   uint32_t p)
{
    if (r->ndq[p] == r->qid)
        return r->nd[p];
    uint64_t c = chain_seq(r, q, p);
    struct node *x = tab_find(r->ix, c, key_hash(c));
    r->nd[p] = x;
    r->ndq[p] = r->qid;
    return x;
}

/* Prefetch stage 2: the node the first matching-tag slot points to (not verified). */
static inline void pf_node(const struct kvr_index *ix, uint64_t h)
{
    uint32_t shift;
    const struct table *t = tabw_get(ix, h, &shift);
    if (t == NULL)
        return;
    uint64_t mask = (~0ull) >> shift, i = h >> shift, tag = h >> 48;
    for (int k = 0; k < 4; k++, i = (i + 1) & mask) {
        uint64_t v = LD(t->slot[i]);
        if (v == 0)
            return;
        if (v != SLOT_TOMB && (v >> 48) == tag) {
            __builtin_prefetch((const void *)(uintptr_t)(v & PTR_MASK));
            return;
        }
    }
}

/* Prefetch stage 3: the holder array of a node (likely cached by now): its header and id
 * run, up to 16 lines (a reader compares or copies the whole run). */
static inline void pf_hset(const struct node *x)
{
    uint32_t n;
    if (x == NULL || !((n = LD(x->n)) & N_EXT))
        return;
    const char *p = (const char *)(uintptr_t)LD(x->h);
    uint32_t cnt = n & N_COUNT, lines = (8 + cnt * 4 + 63) / 64;
    if (lines > 16)
        lines = 16;
    for (uint32_t k = 0; k < lines; k++)
        __builtin_prefetch(p + 64 * k);
}

/* Reader side: is the holder set of x exactly a[0..na)? (seqlock, no copy) *seq gets the
 * sequence number the answer holds for. */
static inline int hs_equal(const struct node *x, const uint32_t *a, uint32_t na, uint32_t *seq)
{
    for (;;) {
        uint32_t s1 = LDA(x->seq);
        if (s1 & 1) {
            cpu_relax();
            continue;
        }
        uint32_t n = LD(x->n);
        uint64_t h = LD(x->h);
        IX_FENCE(__ATOMIC_ACQUIRE);
        if (LD(x->seq) != s1)
            continue;
        uint32_t cnt = (n & N_DEAD) ? 0 : n & N_COUNT;
        int eq;
        if (cnt != na)
            eq = 0;
        else if (cnt == 0)
            eq = 1;
        else if (!(n & N_EXT))
            eq = el_holder(h) == a[0];
        else {
            const struct hset *hs = (const struct hset *)(uintptr_t)h;
            eq = cnt <= LD(hs->cap) && hv_equal(hs->v, a, cnt);
        }
        IX_FENCE(__ATOMIC_ACQUIRE);
        if (LD(x->seq) == s1) {
            *seq = s1;
            return eq;
        }
    }
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

/* The holders drop[0..nd) (sorted) hold position lo and not hi: find where each stops.
 * Their held positions are a prefix (hole-free), so bisect, splitting the group at each
 * probe into those still present (stop later) and those gone (stop earlier). */
static void drop_search(struct kvr_index_reader *r, uint32_t ns, const uint64_t *q,
                        uint32_t nd, uint32_t lo, uint32_t hi, uint32_t loseq)
{
    struct {
        uint32_t b, c, lo, hi, lseq; /* lseq: lo's node seq when the group was seen there */
    } st[64];
    uint32_t *d = r->drop, *tmp = r->tmp, *buf = r->buf, *s0 = r->s0, *tm = r->tm;
    int sp = 0;
    st[sp].b = 0;
    st[sp].c = nd;
    st[sp].lo = lo;
    st[sp].lseq = loseq;
    st[sp++].hi = hi;
    while (sp > 0) {
        sp--;
        uint32_t b = st[sp].b, c = st[sp].c, l = st[sp].lo, h = st[sp].hi, ls = st[sp].lseq;
        if (h - l == 1) {
            for (uint32_t i = 0; i < c; i++)
                tm[d[b + i]] = h;
            continue;
        }
        uint32_t m = l + (h - l) / 2;
        /* the next probe is one of m's two children: their table slots load meanwhile */
        chain_at(r, q, l, m);
        if (m - l > 1 && r->ndq[l + (m - l) / 2] != r->qid)
            pf_slot(r->ix, key_hash(chain_at(r, q, l, l + (m - l) / 2)));
        if (h - m > 1 && r->ndq[m + (h - m) / 2] != r->qid)
            pf_slot(r->ix, key_hash(chain_at(r, q, m, m + (h - m) / 2)));
        struct node *x = node_at(r, ns, q, m);
        uint32_t ms = 0;
        uint32_t nb = x ? kvr_ix_hs_read_seq(x, buf, &ms) : 0, k = 0, np = 0, nab = 0;
        if (nb == 0) { /* nobody holds m: the whole group stops before it */
            st[sp].b = b;
            st[sp].c = c;
            st[sp].lo = l;
            st[sp].lseq = ls;
            st[sp++].hi = m;
            continue;
        }
        /* The group was seen holding l (node sequence ls) and not h. If m's holder set
         * equals l's set unchanged since (same sequence), all of the group holds m; if it
         * equals h's set, none does (exact set comparisons, one memcmp each; every
         * conclusion rests on sets as they were read): a group that stops at one place is
         * bisected without a per-member merge. */
        if (c > 8) {
            struct node *xl = node_at(r, ns, q, l), *xh = node_at(r, ns, q, h);
            uint32_t sq = 0;
            int all = xl != NULL && hs_equal(xl, buf, nb, &sq) && sq == ls;
            if (all || (xh != NULL && hs_equal(xh, buf, nb, &sq))) {
                st[sp].b = b;
                st[sp].c = c;
                st[sp].lo = all ? m : l;
                st[sp].lseq = all ? ms : ls;
                st[sp++].hi = all ? h : m;
                continue;
            }
        }
        for (uint32_t i = 0; i < c; i++) {
            uint32_t e = d[b + i], hid = s0[e];
            while (k < nb && buf[k] < hid)
                k++;
            if (k < nb && buf[k] == hid)
                d[b + np++] = e;
            else
                tmp[nab++] = e;
        }
        memcpy(&d[b + np], tmp, nab * sizeof(*tmp));
        /* stack depth: one pending sibling per halving, at most log2(stride) + 1 */
        if (nab > 0) {
            st[sp].b = b + np;
            st[sp].c = nab;
            st[sp].lo = l;
            st[sp].lseq = ls;
            st[sp++].hi = m;
        }
        if (np > 0) {
            st[sp].b = b;
            st[sp].c = np;
            st[sp].lo = m;
            st[sp].lseq = ms;
            st[sp++].hi = h;
        }
    }
}

/* Chains and key hashes of landings from `done` on (8 full strides at once when all are
 * before the last landing, else one); returns the new count. */
static uint32_t land_chains(struct kvr_index_reader *r, const uint64_t *q, uint32_t done,
                            uint32_t nl, uint32_t stride, uint32_t last)
{
    if (done + 8 < nl) {
        chain_land8(r, q, done * stride, stride, &r->lh[done]);
        return done + 8;
    }
    uint32_t L = done + 1 < nl ? (done + 1) * stride : last, base = done * stride;
    uint64_t c = r->chq[L] == r->qid ? r->ch[L] : chain_from(r, q, base, L);
    r->lh[done] = key_hash(c);
    return done + 1;
}

/* Fast holders (all of their worker's holders hole-free): positions held along the query
 * are exactly [0, tm). Jump from landing to landing; when a holder is missing at a landing,
 * scan the stride behind it (only for the holders that dropped). */
static void find_fast(struct kvr_index_reader *r, uint32_t ns, const uint64_t *q, uint32_t n,
                      uint32_t na, uint32_t seq0)
{
    const struct kvr_index *ix = r->ix;
    uint32_t *tm = r->tm, *alive = r->alive, *ah = r->ah, *drop = r->drop, *buf = r->buf;
    if (n <= 1) {
        for (uint32_t a = 0; a < na; a++)
            tm[alive[a]] = n;
        return;
    }
    const uint32_t last = n - 1;
    uint32_t stride = ix->o.jump_stride;
    if ((last + stride - 1) / stride > LAND_MAX) /* long query: landings further apart */
        stride = (last + LAND_MAX - 1) / LAND_MAX;
    const uint32_t nl = (last - 1) / stride + 1; /* landings: min((j+1)*stride, n-1) */
#define LANDING(j) ((j) + 1 < nl ? ((j) + 1) * stride : last)
    uint32_t nprev = na;
    uint32_t done = 0;   /* landings whose chain and key hash are computed */
    uint32_t issued = 0; /* landings whose table slot is prefetched */
    uint32_t looked = 0; /* landings whose node is looked up */
    uint32_t prev = 0, pseq = seq0; /* seq of prev's node when alive[] was seen there */
    uint32_t lastst = 0; /* the look at the last block: 0 not begun, 1 slot prefetched,
                          * 2 node prefetched, 3 looked up, 4 compare, 5 compared */
    for (uint32_t j = 0; j < nl && na > 0; j++) {
        int dropped = j > 0 && na < nprev;
        nprev = na;
        if (lastst == 0 && (j == LAST_AT || dropped) && nl - 1 - j >= LAST_MIN) {
            /* a long match is likely (nobody stopped over the first landings, or some
             * stopped and the rest go on): if all of them hold the last block, they are
             * done. All the chains now (the last landing is the last block), its lookup
             * staged over the next landings */
            while (done < nl)
                done = land_chains(r, q, done, nl, stride, last);
            pf_slot(ix, r->lh[nl - 1]);
            lastst = 1;
        } else if (lastst == 5 && dropped) { /* looked up: look again */
            lastst = 4;
        } else if (lastst > 0 && lastst < 5) { /* the look's stages, one a landing */
            lastst++;
        }
        if (done < nl && done < j + PF_SLOT)
            done = land_chains(r, q, done, nl, stride, last);
        for (; issued < done && issued < j + PF_SLOT; issued++)
            pf_slot(ix, r->lh[issued]);
        if (lastst == 2) {
            pf_node(ix, r->lh[nl - 1]);
        } else if (lastst == 3) {
            if (r->ndq[last] != r->qid) {
                r->nd[last] = tab_find(ix, r->ch[last], r->lh[nl - 1]);
                r->ndq[last] = r->qid;
            }
            pf_hset(r->nd[last]);
        } else if (lastst == 4) {
            const struct node *xl = r->nd[last];
            uint32_t sq = 0;
            lastst = 5;
            if (xl != NULL && hs_equal(xl, ah, na, &sq)) {
                for (uint32_t a = 0; a < na; a++)
                    tm[alive[a]] = n;
                na = 0;
                break;
            }
        }
        if (j + PF_NODE < issued)
            pf_node(ix, r->lh[j + PF_NODE]);
        for (; looked < issued && looked <= j + PF_HSET; looked++) {
            uint32_t LL = LANDING(looked);
            if (r->ndq[LL] != r->qid) {
                r->nd[LL] = tab_find(ix, r->ch[LL], r->lh[looked]);
                r->ndq[LL] = r->qid;
                pf_hset(r->nd[LL]);
            }
        }
        uint32_t L = LANDING(j);
        struct node *x = r->nd[L];
        uint32_t xs = 0;
        if (x != NULL && hs_equal(x, ah, na, &xs)) {
            prev = L;
            pseq = xs;
            continue;
        }
        uint32_t nb = x ? kvr_ix_hs_read_seq(x, buf, &xs) : 0, ka = 0, nd = 0;
        if (nb * 16 < na) {
            /* few left of many (a shared prefix ends): each of the landing's holders is
             * searched for in ah (binary, from the last one found); the runs between the
             * ones found drop whole */
            uint32_t lo = 0;
            for (uint32_t k = 0; k < nb && lo < na; k++) {
                uint32_t a = lo, hi = na;
                while (a < hi) {
                    uint32_t mid = a + (hi - a) / 2;
                    if (ah[mid] < buf[k])
                        a = mid + 1;
                    else
                        hi = mid;
                }
                if (a == na || ah[a] != buf[k])
                    continue;
                memcpy(drop + nd, alive + lo, (a - lo) * sizeof(*drop));
                nd += a - lo;
                alive[ka] = alive[a];
                ah[ka++] = ah[a];
                lo = a + 1;
            }
            memcpy(drop + nd, alive + lo, (na - lo) * sizeof(*drop));
            nd += na - lo;
        } else {
            for (uint32_t a = 0, k = 0; a < na; a++) {
                uint32_t h = ah[a];
                while (k < nb && buf[k] < h)
                    k++;
                if (k < nb && buf[k] == h) {
                    alive[ka] = alive[a];
                    ah[ka++] = h;
                } else {
                    drop[nd++] = alive[a];
                }
            }
        }
        na = ka;
        if (nd > 0)
            drop_search(r, ns, q, nd, prev, L, pseq);
        prev = L;
        pseq = xs;
    }
#undef LANDING
    for (uint32_t a = 0; a < na; a++)
        tm[alive[a]] = n;
}

/* Slow workers (some holder has holes): position by position, exact. */
static void find_slow(struct kvr_index_reader *r, uint32_t ns, const uint64_t *q, uint32_t n,
                      uint32_t nsw, const double *w)
{
    uint32_t left = nsw, *buf = r->buf;
    for (uint32_t p = 1; p < n && left > 0; p++) {
        struct node *x = node_at(r, ns, q, p);
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
            if (!sw->base_done && (mask & ~r->aside) == 0) {
                sw->base_done = 1;
                sw->base = p;
            }
            if (mask == 0) {
                sw->done = 1;
                sw->matched = p;
                left--;
            } else {
                sw->score += maxw_of(mask, w);
            }
            uint32_t gone = sw->alive & ~mask;
            for (uint32_t t = 0; gone != 0; t++, gone >>= 1)
                if (gone & 1)
                    sw->tm[t] = p;
            sw->alive &= mask;
        }
    }
    for (uint32_t i = 0; i < nsw; i++) {
        struct slowst *sw = &r->sw[i];
        if (!sw->base_done)
            sw->base = n;
        if (sw->done)
            continue;
        sw->matched = n;
        for (uint32_t t = 0; t < KVR_TIER_MAX; t++)
            if (sw->alive >> t & 1)
                sw->tm[t] = n;
    }
}

/* Inside the critical section: names each hit from its worker's record and drops hits of
 * workers forgotten during the find (index_intern.c, FORGETTING). A worker id seen in a
 * holder set is not published again before this find ends, so its generation is the
 * holder's or odd (forgotten meanwhile: dropped). The name and rank are copied into the
 * reader once per generation (the record may be freed once a find ends; an earlier copy is
 * replaced only here, when the answer that lent it out is no longer valid); a hit then costs
 * two loads from dense per-id arrays. Returns the hits kept, SIZE_MAX when a copy could not
 * be allocated. */
static size_t name_hits(struct kvr_index_reader *r, struct kvr_index_hit *hits, size_t nh)
{
    const struct kvr_index *ix = r->ix;
    size_t k = 0;
    for (size_t i = 0; i < nh; i++) {
        uint32_t wid = hits[i].wid, g = LDA(ix->wgen[wid]);
        if (g & 1u)
            continue;
        if (r->cgen[wid] != g) {
            const struct worker *wk = worker_get(ix, wid);
            if (wk == NULL)
                continue;
            char *nm = sl_alloc(r->slot, wk->podlen + 1u);
            if (nm == NULL)
                return SIZE_MAX;
            memcpy(nm, wk->pod, wk->podlen + 1u);
            sl_free(r->slot, r->cname[wid]);
            r->cname[wid] = nm;
            r->crank[wid] = wk->rank;
            r->cgen[wid] = g;
        }
        if (k != i)
            hits[k] = hits[i];
        hits[k].pod = r->cname[wid];
        hits[k].dp_rank = r->crank[wid];
        k++;
    }
    return k;
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
        memset(r->chq, 0, (size_t)r->maxq * sizeof(*r->chq));
        memset(r->ndq, 0, (size_t)r->maxq * sizeof(*r->ndq));
        memset(r->podq, 0, (size_t)r->maxw * sizeof(*r->podq));
        r->qid = 1;
    }
    const uint32_t qid = r->qid;
    r->root = ns_root(ns);
    for (size_t i = 0; i < npods; i++)
        if (pod_ids[i] < r->maxw)
            r->podq[pod_ids[i]] = qid;

    ebr_enter(ix, r->slot);
    size_t nh = 0;
    struct node *x = node_at(r, ns, q, 0);
    if (x == NULL)
        goto out;
    uint32_t seq0 = 0;
    uint32_t n0 = kvr_ix_hs_read_seq(x, r->s0, &seq0);
    uint32_t *s0 = r->s0, *tm = r->tm, *alive = r->alive, *ah = r->ah;
    const uint32_t *podq = r->podq, *wpod = ix->wpod;
    uint32_t *wslow = ix->wslow;
    uint32_t na = 0, nsw = 0, k = 0, i = 0;
    uint32_t nw = LDA(ix->nworkers);

    /* The common case first: a leading run of holders each the only one of its worker,
     * hole-free, no pod filter. s0 stays as it is, alive is the identity, ah a copy. */
    if (npods == 0) {
        uint32_t pw = UINT32_MAX;
        for (; i < n0; i++) {
            uint32_t wid = H_WID(s0[i]);
            if (wid == pw || wid >= nw || LD(wslow[wid]) != 0)
                break;
            pw = wid;
        }
        if (i > 0 && i < n0 && H_WID(s0[i]) == pw)
            i--; /* s0[i - 1] shares its worker with s0[i] */
        for (uint32_t a = 0; a < i; a++) {
            alive[a] = a;
            tm[a] = 0;
        }
        memcpy(ah, s0, (size_t)i * sizeof(*ah));
        na = k = i;
    }
    const uint32_t ncommon = i;

    /* the rest: filter by pod, classify workers fast / slow */
    while (i < n0) {
        uint32_t wid = H_WID(s0[i]), j = i + 1;
        if (j < n0 && H_WID(s0[j]) == wid) {
            while (j < n0 && H_WID(s0[j]) == wid)
                j++;
        } else if (wid < nw && (npods == 0 || podq[wpod[wid]] == qid) &&
                   LD(wslow[wid]) == 0) {
            /* one hole-free holder: the common case */
            s0[k] = s0[i];
            alive[na] = k;
            ah[na++] = s0[i];
            tm[k++] = 0;
            i = j;
            continue;
        }
        if (wid >= nw || (npods > 0 && podq[wpod[wid]] != qid)) {
            i = j;
            continue;
        }
        int slow = LD(wslow[wid]) != 0;
        if (slow) {
            struct slowst *sw = &r->sw[nsw++];
            memset(sw, 0, sizeof(*sw));
            sw->wid = wid;
            for (uint32_t m = i; m < j; m++)
                sw->alive |= 1u << H_TIER(s0[m]);
            sw->base_done = (sw->alive & ~r->aside) == 0; /* base 0 */
            sw->score = maxw_of(sw->alive, w);
        }
        for (uint32_t m = i; m < j; m++) {
            uint32_t h = s0[m];
            s0[k] = h | (slow ? 0x80000000u : 0);
            if (!slow) {
                alive[na] = k;
                ah[na++] = h;
            }
            tm[k] = 0;
            k++;
        }
        i = j;
    }
    n0 = k;

    find_fast(r, ns, q, (uint32_t)n, na, seq0);
    if (nsw > 0)
        find_slow(r, ns, q, (uint32_t)n, nsw, w);

    /* results, ascending wid; the common run first */
    uint32_t si = 0;
    struct kvr_index_hit *hits_out = r->hits;
    for (uint32_t a = 0; a < ncommon; a++) {
        uint32_t h0 = s0[a], m = tm[a];
        struct kvr_index_hit *hit = &hits_out[a];
        *hit = (struct kvr_index_hit){.wid = H_WID(h0), .matched = m,
                                      .matched_base = r->aside >> H_TIER(h0) & 1 ? 0 : m};
        hit->tier_matched[H_TIER(h0)] = m;
        hit->score = (double)m * w[H_TIER(h0)];
    }
    nh = ncommon;
    for (i = ncommon; i < n0;) {
        uint32_t h0 = s0[i], wid = H_WID(h0 & 0x7fffffffu), j = i + 1;
        struct kvr_index_hit *hit = &hits_out[nh++];
        if (!(h0 & 0x80000000u) && (j == n0 || H_WID(s0[j] & 0x7fffffffu) != wid)) {
            /* one hole-free holder: the common case */
            *hit = (struct kvr_index_hit){.wid = wid, .matched = tm[i],
                                          .matched_base = r->aside >> H_TIER(h0) & 1 ? 0
                                                                                    : tm[i]};
            hit->tier_matched[H_TIER(h0)] = tm[i];
            hit->score = (double)tm[i] * w[H_TIER(h0)];
            i = j;
            continue;
        }
        while (j < n0 && H_WID(s0[j] & 0x7fffffffu) == wid)
            j++;
        memset(hit, 0, sizeof(*hit));
        hit->wid = wid;
        if (s0[i] & 0x80000000u) {
            struct slowst *sw = &r->sw[si++];
            hit->matched = sw->matched;
            hit->matched_base = sw->base;
            memcpy(hit->tier_matched, sw->tm, sizeof(sw->tm));
            hit->score = sw->score;
        } else if (j == i + 1) { /* one tier: the common case */
            hit->matched = tm[i];
            hit->matched_base = r->aside >> H_TIER(s0[i]) & 1 ? 0 : tm[i];
            hit->tier_matched[H_TIER(s0[i])] = tm[i];
            hit->score = (double)tm[i] * w[H_TIER(s0[i])];
        } else {
            uint32_t ord[KVR_TIER_MAX], no = 0;
            for (uint32_t m = i; m < j; m++) {
                uint32_t t = H_TIER(s0[m]);
                hit->tier_matched[t] = tm[m];
                if (tm[m] > hit->matched)
                    hit->matched = tm[m];
                if (!(r->aside >> t & 1) && tm[m] > hit->matched_base)
                    hit->matched_base = tm[m];
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
    nh = name_hits(r, hits_out, nh);
out:
    ebr_exit(r->slot);
    *nhits = nh;
    return nh == SIZE_MAX ? -ENOMEM : 0;
}
