/* tok.c — Hugging Face tokenizer.json (BPE) in C: load once, encode from any thread.
 *
 * Why this shape: HF computes ids as added-token split → normalize → pre-tokenize → BPE per
 * pre-token → post-process; reproducing each stage literally (same regexes, same merge order
 * with HF's heap tie-break on position) is what makes the ids exact. Byte-level vocabularies
 * are converted back to raw bytes at load, so the hot path works on the text's own bytes and
 * never builds the GPT-2 "Ġ" strings. Loading is tok_load.c; what both share, tok_int.h.
 */
#include "text/tok_int.h"

#include <limits.h>
#include <stdio.h>

/* ---- encoding --------------------------------------------------------------------------- */

struct piece {
    uint32_t s, e;
    bool m; /* a match of the split pattern */
};
struct sym {
    uint32_t id, len;
    int32_t prev, next;
};
struct hent {
    uint32_t rank, pos, new_id;
};

/* The word cache (HF's idea): BPE results of short pre-tokens, per scratch (so per thread:
 * no sharing, no locks), direct-mapped, keyed by the tokenizer's load generation and the
 * word's bytes (compared in full: exact, never a hash match alone). */
#define WC_SLOTS 4096
#define WC_WORD 24
#define WC_IDS 12
struct wc_slot {
    uint64_t gen;
    uint8_t wlen, nids;
    char w[WC_WORD];
    uint32_t ids[WC_IDS];
};

struct kvr_tok_scratch {
    struct wc_slot *wc; /* WC_SLOTS, allocated on first use */
    uint32_t *ids;
    size_t nids, idcap;
    char *nb[2];
    size_t nbcap[2];
    struct piece *pa, *pb, *seq;
    size_t pacap, pbcap, seqcap;
    struct sym *sym;
    size_t symcap;
    struct hent *heap; /* at most 2n entries: n-1 pairs, and each merge pops 1, pushes 2 */
    size_t heapcap;
    utf8proc_int32_t *u32; /* Unicode normalization */
    size_t u32cap;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    /* resumption marks (the prefix cache): recorded when `record` */
    bool record;
    struct tok_mark *marks;
    size_t nmarks, markcap;
    size_t rec_base, rec_sub; /* raw offset of the normalized buffer (SIZE_MAX: not the raw
                               * text) and of the current sub-segment, for piece marks */
    char *cat; /* a resumed segment: raw head + normalized tail */
    size_t catcap;
    void *aux; /* kvr_tok_scratch_aux */
    size_t auxcap;
    size_t limit;        /* kvr_tok_scratch_set_limit: more ids than this stop (0 = none) */
    uint64_t bpe_bytes;  /* bytes of pre-tokens run through BPE (word-cache hits too) */
};

kvr_tok_scratch *kvr_tok_scratch_new(void)
{
    kvr_tok_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->md = pcre2_match_data_create(1, NULL);
    s->mc = pcre2_match_context_create(NULL);
    s->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->md || !s->mc || !s->js) {
        kvr_tok_scratch_free(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mc, NULL, s->js);
    return s;
}

void kvr_tok_scratch_free(kvr_tok_scratch *s)
{
    if (!s)
        return;
    free(s->wc);
    free(s->ids);
    free(s->nb[0]);
    free(s->nb[1]);
    free(s->pa);
    free(s->pb);
    free(s->seq);
    free(s->sym);
    free(s->heap);
    free(s->u32);
    free(s->marks);
    free(s->cat);
    free(s->aux);
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s);
}

void kvr_tok_scratch_set_limit(kvr_tok_scratch *s, size_t max_ids)
{
    s->limit = max_ids;
}

uint64_t kvr_tok_scratch_bpe_bytes(const kvr_tok_scratch *s)
{
    return s->bpe_bytes;
}

/* The limit: ids are only ever appended, so once one more would pass it the text makes
 * more than limit ids: stop (the caller answers 413) without looking at the rest. */
static int out_id(kvr_tok_scratch *s, uint32_t id)
{
    if (s->limit && s->nids >= s->limit)
        return -EMSGSIZE;
    if (s->nids == s->idcap) {
        if (s->nids >= INT32_MAX)
            return -EOVERFLOW;
        int rc = grow((void **)&s->ids, &s->idcap, s->nids + 1, sizeof *s->ids);
        if (rc)
            return rc;
    }
    s->ids[s->nids++] = id;
    return 0;
}

static bool heap_less(const struct hent *a, const struct hent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct hent *h, size_t *n, struct hent v)
{
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&v, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static struct hent heap_pop(struct hent *h, size_t *n)
{
    struct hent top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &v))
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = v;
    return top;
}

static bool has_fallback(const kvr_tok *t, const char *w, size_t k)
{
    for (size_t j = 0; j < k; j++)
        if (t->bytefb[(unsigned char)w[j]] == UINT32_MAX)
            return false;
    return true;
}

static int bpe_merge(const kvr_tok *t, kvr_tok_scratch *s, const char *w, size_t n);

void kvr_tok_scratch_clear_cache(kvr_tok_scratch *s)
{
    if (s->wc)
        memset(s->wc, 0, WC_SLOTS * sizeof *s->wc);
}

static bool whole_words; /* kvr_tok_force_whole_words (tests, benchmarks) */

void kvr_tok_force_whole_words(bool on)
{
    whole_words = on;
}

/* BPE of one piece of a pre-token through the word cache. */
static int bpe_piece(const kvr_tok *t, kvr_tok_scratch *s, const char *w, size_t n)
{
    if (!n)
        return 0;
    if (n > WC_WORD)
        return bpe_merge(t, s, w, n);
    if (!s->wc && !(s->wc = calloc(WC_SLOTS, sizeof *s->wc)))
        return -ENOMEM;
    struct wc_slot *e = &s->wc[XXH3_64bits(w, n) & (WC_SLOTS - 1)];
    int rc;
    if (e->gen == t->gen && e->wlen == n && !memcmp(e->w, w, n)) {
        for (size_t i = 0; i < e->nids; i++)
            if ((rc = out_id(s, e->ids[i])))
                return rc;
        return 0;
    }
    size_t before = s->nids;
    if ((rc = bpe_merge(t, s, w, n)))
        return rc;
    size_t k = s->nids - before;
    if (k <= WC_IDS) {
        e->gen = t->gen;
        e->wlen = (uint8_t)n;
        e->nids = (uint8_t)k;
        memcpy(e->w, w, n);
        if (k) /* a word of characters the vocabulary lacks (no unk, no fallback) has none */
            memcpy(e->ids, s->ids + before, k * sizeof *e->ids);
    }
    return 0;
}

/* A character of a pre-token that BPE starts as its own vocabulary entry (as bpe_merge
 * looks it up), not as byte-fallback or unk symbols. */
static bool direct(const kvr_tok *t, const char *w, size_t k)
{
    return k == 1 ? t->id1[(unsigned char)w[0]] != UINT32_MAX : vocab_get(t, w, k) != UINT32_MAX;
}

#define SPLIT_MIN 64 /* pre-tokens longer than this are split where merges cannot reach */

/* BPE of one pre-token. A long one (Gemma 3, Mistral: a whole segment is one pre-token, so
 * BPE would be O(n log n) over all of it, with no word cache and no early stop) is cut
 * between two characters c1 c2 when both start as vocabulary entries of their own and the
 * byte pair (last of c1, first of c2) occurs inside no vocabulary entry: then no merge can
 * ever make a symbol that spans the cut (a merge's result is the entry of its parts' bytes
 * joined, and a symbol ending with c1 ends with c1's bytes, one starting with c2 starts with
 * c2's), so the merges on either side never meet, and in HF's order (rank, then position)
 * each side's merges come in the same order as when run alone: the ids are the same as
 * BPE of the whole pre-token. Gemma 3's and Mistral's vocabularies have "\u2581" after
 * another character in one entry at most, so their texts are cut at (nearly) every word. */
static int bpe(const kvr_tok *t, kvr_tok_scratch *s, const char *w, size_t n)
{
    int rc;
    s->bpe_bytes += n;
    if (n <= SPLIT_MIN || !t->split_words || whole_words)
        return bpe_piece(t, s, w, n);
    size_t start = 0, i = 0;
    bool prev = false;
    while (i < n) {
        size_t k = t->byte_level ? 1 : utf8_len((unsigned char)w[i]);
        if (k > n - i)
            k = n - i;
        bool d = direct(t, w + i, k);
        unsigned x = (unsigned)(unsigned char)w[i ? i - 1 : 0] << 8 | (unsigned char)w[i];
        if (i > start && prev && d && !(t->pairs[x >> 3] & (1u << (x & 7)))) {
            if ((rc = bpe_piece(t, s, w + start, i - start)))
                return rc;
            start = i;
        }
        prev = d;
        i += k;
    }
    return bpe_piece(t, s, w + start, n - start);
}

/* BPE of one pre-token, as HF's Word::merge_all (heap ordered by rank, then position). */
static int bpe_merge(const kvr_tok *t, kvr_tok_scratch *s, const char *w, size_t n)
{
    if (t->ignore_merges) {
        uint32_t id = vocab_get(t, w, n);
        if (id != UINT32_MAX)
            return out_id(s, id);
    }
    int rc;
    if ((rc = grow((void **)&s->sym, &s->symcap, n, sizeof *s->sym)) ||
        (rc = grow((void **)&s->heap, &s->heapcap, 2 * n + 2, sizeof *s->heap)))
        return rc;
    struct sym *sy = s->sym;
    size_t ns = 0;
    bool last_unk = false;
    for (size_t i = 0; i < n;) {
        size_t k = t->byte_level ? 1 : utf8_len((unsigned char)w[i]);
        if (k > n - i)
            k = n - i;
        uint32_t id = k == 1 ? t->id1[(unsigned char)w[i]] : vocab_get(t, w + i, k);
        if (id != UINT32_MAX) {
            sy[ns++] = (struct sym){id, (uint32_t)k, 0, 0};
            last_unk = false;
        } else if (t->byte_fallback && has_fallback(t, w + i, k)) {
            for (size_t j = 0; j < k; j++)
                sy[ns++] = (struct sym){t->bytefb[(unsigned char)w[i + j]], 1, 0, 0};
            last_unk = false;
        } else if (t->unk != UINT32_MAX) {
            if (t->fuse_unk && last_unk)
                sy[ns - 1].len += (uint32_t)k;
            else
                sy[ns++] = (struct sym){t->unk, (uint32_t)k, 0, 0};
            last_unk = true;
        }
        i += k;
    }
    for (size_t i = 0; i < ns; i++) {
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const struct merge *m = merge_get(t, sy[i].id, sy[i + 1].id);
        if (m)
            heap_push(s->heap, &nh, (struct hent){m->rank, (uint32_t)i, m->new_id});
    }
    while (nh) {
        struct hent top = heap_pop(s->heap, &nh);
        struct sym *cur = &sy[top.pos];
        if (!cur->len || cur->next < 0)
            continue;
        struct sym *right = &sy[cur->next];
        const struct merge *m = merge_get(t, cur->id, right->id);
        if (!m || m->new_id != top.new_id)
            continue;
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0)
            sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const struct merge *pm = merge_get(t, sy[cur->prev].id, cur->id);
            if (pm)
                heap_push(s->heap, &nh, (struct hent){pm->rank, (uint32_t)cur->prev, pm->new_id});
        }
        if (cur->next >= 0) {
            const struct merge *nm = merge_get(t, cur->id, sy[cur->next].id);
            if (nm)
                heap_push(s->heap, &nh, (struct hent){nm->rank, top.pos, nm->new_id});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (sy[i].len && (rc = out_id(s, sy[i].id)))
            return rc;
    return 0;
}

/* One split pre-tokenizer over each piece of *in (text buf), into *out. */
static int split(const struct pre *p, kvr_tok_scratch *s, const char *buf, const struct piece *in,
                 size_t nin, struct piece **out, size_t *outcap, size_t *nout, size_t first_rel,
                 uint32_t bound)
{
    size_t no = 0, least = s->nids;
    int rc;
    for (size_t pi = 0; pi < nin; pi++) {
        const char *w = buf + in[pi].s;
        /* the first piece of a resumed segment is scanned from first_rel, a boundary of this
         * (the first) pre-tokenizer: what lies before it was tokenized already */
        size_t n = in[pi].e - in[pi].s, nq = 0, at = pi ? 0 : first_rel, from = at;
        /* the interleaved gaps and matches (non-empty), as HF's find_matches */
        while (at < n) {
            size_t ms, me;
            if (p->re) {
                int r = (p->jit ? pcre2_jit_match : pcre2_match)(p->re, (PCRE2_SPTR)w, n, at,
                                                                 PCRE2_NO_UTF_CHECK, s->md,
                                    s->mc);
                if (r == PCRE2_ERROR_NOMATCH)
                    break;
                if (r < 0)
                    return -E2BIG;
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
                ms = ov[0], me = ov[1];
            } else {
                const char *f = memmem(w + at, n - at, p->lit, p->litlen);
                if (!f)
                    break;
                ms = (size_t)(f - w), me = ms + p->litlen;
            }
            if (me == ms) { /* empty match: HF skips it */
                at = ms + (ms < n ? utf8_len((unsigned char)w[ms]) : 1);
                continue;
            }
            if (bound) { /* the token limit, while the regex runs (see pretok_bpe) */
                size_t g0 = nq ? s->seq[nq - 1].e : from;
                least += (ms - g0 + bound - 1) / bound + (me - ms + bound - 1) / bound;
                if (least > s->limit)
                    return -EMSGSIZE;
            }
            if ((rc = grow((void **)&s->seq, &s->seqcap, nq + 2, sizeof *s->seq)))
                return rc;
            size_t gs = nq ? s->seq[nq - 1].e : from;
            if (ms > gs)
                s->seq[nq++] = (struct piece){(uint32_t)gs, (uint32_t)ms, false};
            s->seq[nq++] = (struct piece){(uint32_t)ms, (uint32_t)me, true};
            at = me;
        }
        size_t gs = nq ? s->seq[nq - 1].e : from;
        if ((rc = grow((void **)&s->seq, &s->seqcap, nq + 1, sizeof *s->seq)))
            return rc;
        if (gs < n)
            s->seq[nq++] = (struct piece){(uint32_t)gs, (uint32_t)n, false};
        if ((rc = grow((void **)out, outcap, no + nq, sizeof **out)))
            return rc;
        struct piece *o = *out;
        size_t base = no;
        uint32_t off = in[pi].s;
        if (p->behavior == B_ISOLATED) {
            for (size_t i = 0; i < nq; i++)
                o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
        } else if (p->behavior == B_REMOVED) {
            for (size_t i = 0; i < nq; i++)
                if (!s->seq[i].m)
                    o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
        } else if (p->behavior == B_MERGED_PREV) {
            bool prevm = false;
            for (size_t i = 0; i < nq; i++) {
                if (s->seq[i].m && !prevm && no > base)
                    o[no - 1].e = s->seq[i].e + off;
                else
                    o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
                prevm = s->seq[i].m;
            }
        } else { /* B_MERGED_NEXT: the same from the right */
            bool prevm = false;
            size_t k = nq;
            for (size_t i = nq; i-- > 0;) {
                if (s->seq[i].m && !prevm && k < nq)
                    s->seq[k].s = s->seq[i].s;
                else
                    s->seq[--k] = s->seq[i];
                prevm = s->seq[i].m;
            }
            for (size_t i = k; i < nq; i++)
                o[no++] = (struct piece){s->seq[i].s + off, s->seq[i].e + off, false};
        }
    }
    *nout = no;
    return 0;
}

static int mark(kvr_tok_scratch *s, size_t raw, size_t seg, size_t sub)
{
    int rc;
    if (s->nmarks == s->markcap &&
        (rc = grow((void **)&s->marks, &s->markcap, s->nmarks + 1, sizeof *s->marks)))
        return rc;
    s->marks[s->nmarks++] = (struct tok_mark){(uint32_t)raw, (uint32_t)s->nids, (uint32_t)seg,
                                              (uint32_t)sub};
    return 0;
}

/* Pre-tokenizes and BPEs buf[off, off+len), the first pre-tokenizer scanning from first_at
 * (== off, or a resumption point inside). */
static int pretok_bpe(const kvr_tok *t, kvr_tok_scratch *s, const char *buf, size_t off,
                      size_t len, size_t first_at)
{
    if (first_at >= off + len)
        return 0;
    int rc;
    if (!t->npres) {
        if (s->limit && t->cover && s->nids + (len + t->max_sym - 1) / t->max_sym > s->limit)
            return -EMSGSIZE;
        return bpe(t, s, buf + off, len);
    }
    if ((rc = grow((void **)&s->pa, &s->pacap, 1, sizeof *s->pa)))
        return rc;
    s->pa[0] = (struct piece){(uint32_t)off, (uint32_t)(off + len), false};
    size_t n = 1;
    for (size_t i = 0; i < t->npres; i++) {
        size_t no;
        /* The first pre-tokenizer's pieces (Isolated: kept as they are) each make at least
         * ceil(len / max_sym) ids, whatever later pre-tokenizers split them into (when none
         * removes text): a text past the limit stops during the regex scan */
        uint32_t bound = i == 0 && s->limit && t->cover && t->keep_all &&
                                 t->pres[0].behavior == B_ISOLATED ? t->max_sym : 0;
        if ((rc = split(&t->pres[i], s, buf, s->pa, n, &s->pb, &s->pbcap, &no,
                        i ? 0 : first_at - off, bound)))
            return rc;
        struct piece *x = s->pa;
        size_t xc = s->pacap;
        s->pa = s->pb, s->pacap = s->pbcap, s->pb = x, s->pbcap = xc;
        n = no;
    }
    if (s->limit && t->cover) { /* each piece makes at least ceil(len / max_sym) ids */
        size_t least = s->nids;
        for (size_t i = 0; i < n && least <= s->limit; i++)
            least += (s->pa[i].e - s->pa[i].s + t->max_sym - 1) / t->max_sym;
        if (least > s->limit)
            return -EMSGSIZE; /* before any BPE of this segment (Gemma 3: the whole text) */
    }
    bool rec = s->record && s->rec_base != SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (rec && (rc = mark(s, s->rec_base + s->pa[i].s, s->rec_base, s->rec_base + off)))
            return rc;
        if ((rc = bpe(t, s, buf + s->pa[i].s, s->pa[i].e - s->pa[i].s)))
            return rc;
    }
    return 0;
}

static bool is_space(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The byte next to a match: ASCII alphanumerics and '_' (and any non-ASCII) are word. */
static bool is_word(const char *s, size_t at)
{
    unsigned char c = (unsigned char)s[at];
    return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* Leftmost-longest match of an added token in s[from, n): [*ms, *me) the span (with lstrip/rstrip
 * whitespace), the token id in *id. */
static bool added_find(const kvr_tok *t, const struct addset *as, const char *s, size_t n,
                       size_t from, size_t floor, size_t *ms, size_t *me, uint32_t *id)
{
    if (!as->n)
        return false;
    /* scans from `from`; lstrip stops at `floor` (the end of the previous token: from, or
     * before it when resuming inside a segment, whose head holds no token) */
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        for (uint32_t j = as->first[b]; j < as->first[b + 1]; j++) {
            const struct added *a = &t->added[as->idx[j]];
            if (a->mlen > n - i || memcmp(s + i, t->arena + a->moff, a->mlen))
                continue;
            size_t st = i, en = i + a->mlen;
            if (a->single_word && ((st > 0 && is_word(s, st - 1)) ||
                                   (en < n && is_word(s, en))))
                continue;
            if (a->lstrip)
                while (st > floor && is_space((unsigned char)s[st - 1]))
                    st--;
            if (a->rstrip)
                while (en < n && is_space((unsigned char)s[en]))
                    en++;
            *ms = st, *me = en, *id = a->id;
            return true;
        }
    }
    return false;
}

/* NF(C|D|KC|KD) of in[0,n) into *dst. Normalization is local: text splits before an ASCII
 * character (a starter that is never the second of a composition, and has no decomposition)
 * normalize independently. So ASCII is copied, and only each non-ASCII run with the
 * ASCII character before it (which may compose with the run's marks) goes through utf8proc,
 * in the scratch's buffers (no allocation once they have grown). */
static int unicode_norm(kvr_tok_scratch *s, int kind, const char *in, size_t n, char **dst,
                        size_t *dcap, size_t *dn)
{
    static const int opt[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE,
                              UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                              UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    utf8proc_option_t o = (utf8proc_option_t)(UTF8PROC_STABLE | opt[kind]);
    size_t o_n = 0, i = 0;
    int rc;
    while (i < n) {
        size_t a = i;
        while (i < n && (unsigned char)in[i] < 0x80)
            i++;
        size_t rs = i > a ? i - 1 : i; /* the run, with the ASCII character before it */
        if ((rc = grow((void **)dst, dcap, o_n + (rs - a) + 1, 1)))
            return rc;
        memcpy(*dst + o_n, in + a, rs - a);
        o_n += rs - a;
        if (i == n) { /* ended in ASCII: the last one is copied too */
            (*dst)[o_n++] = in[rs];
            break;
        }
        while (i < n && (unsigned char)in[i] >= 0x80)
            i++;
        /* decompose (up to 18 code points per character in NFKD), reorder, compose */
        for (;;) {
            utf8proc_ssize_t m = utf8proc_decompose((const utf8proc_uint8_t *)in + rs,
                                                    (utf8proc_ssize_t)(i - rs), s->u32,
                                                    (utf8proc_ssize_t)s->u32cap, o);
            if (m < 0)
                return m == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EILSEQ;
            if ((size_t)m > s->u32cap) {
                if ((rc = grow((void **)&s->u32, &s->u32cap, (size_t)m + 1, sizeof *s->u32)))
                    return rc;
                continue;
            }
            m = utf8proc_normalize_utf32(s->u32, m, o);
            if (m < 0)
                return -EILSEQ;
            if ((rc = grow((void **)dst, dcap, o_n + (size_t)m * 4 + 1, 1)))
                return rc;
            for (utf8proc_ssize_t k = 0; k < m; k++)
                o_n += (size_t)utf8proc_encode_char(s->u32[k], (utf8proc_uint8_t *)*dst + o_n);
            break;
        }
    }
    *dn = o_n;
    return 0;
}

/* The normalizer chain, within its growth cap (tok_int.h). */
int kvr_tok_normalize(const kvr_tok *t, kvr_tok_scratch *s, const char *in, size_t n,
                      const char **out, size_t *outn)
{
    const char *cur = in;
    size_t cn = n;
    size_t cap = n > (SIZE_MAX - NORM_SLACK) / NORM_GROWTH ? SIZE_MAX
                                                           : n * NORM_GROWTH + NORM_SLACK;
    int which = 0, rc;
    for (size_t i = 0; i < t->nnorms; i++) {
        const struct norm *nm = &t->norms[i];
        char **dst = &s->nb[which];
        size_t *dcap = &s->nbcap[which];
        size_t dn = 0;
        if (nm->kind <= N_NFKD) {
            size_t k = 0;
            while (k < cn && (unsigned char)cur[k] < 0x80)
                k++;
            if (k == cn)
                continue; /* ASCII is invariant under every normalization form */
            if ((rc = unicode_norm(s, nm->kind, cur, cn, dst, dcap, &dn)))
                return rc;
        } else if (nm->kind == N_PREPEND) {
            if (!cn)
                continue;
            if (cn + nm->alen > cap)
                return -EOVERFLOW;
            if ((rc = grow((void **)dst, dcap, cn + nm->alen, 1)))
                return rc;
            memcpy(*dst, nm->a, nm->alen);
            memcpy(*dst + nm->alen, cur, cn);
            dn = cn + nm->alen;
        } else { /* N_REPLACE */
            size_t cnt = 0;
            for (const char *p = cur; (p = memmem(p, cn - (size_t)(p - cur), nm->a, nm->alen));
                 p += nm->alen)
                cnt++;
            if (!cnt)
                continue;
            if (nm->blen > nm->alen && (cnt > (cap - cn) / (nm->blen - nm->alen) || cn > cap))
                return -EOVERFLOW;
            if ((rc = grow((void **)dst, dcap, cn + cnt * nm->blen, 1)))
                return rc;
            const char *p = cur, *f;
            while ((f = memmem(p, cn - (size_t)(p - cur), nm->a, nm->alen))) {
                memcpy(*dst + dn, p, (size_t)(f - p));
                dn += (size_t)(f - p);
                memcpy(*dst + dn, nm->b, nm->blen);
                dn += nm->blen;
                p = f + nm->alen;
            }
            memcpy(*dst + dn, p, cn - (size_t)(p - cur));
            dn += cn - (size_t)(p - cur);
        }
        cur = *dst;
        cn = dn;
        which ^= 1;
    }
    *out = cur;
    *outn = cn;
    return 0;
}

/* A normalized segment b[0, bn) (raw offset seg; ident: b is the raw text itself): split
 * on normalized added tokens, pre-tokenize and BPE the rest, from `resume` (0, or a
 * resumption point inside the sub-segment starting at sub). */
static int segment_body(const kvr_tok *t, kvr_tok_scratch *s, const char *b, size_t bn,
                        size_t seg, bool ident, size_t resume, size_t sub)
{
    size_t at = sub, scan = resume, ms, me;
    uint32_t id;
    int rc;
    s->rec_base = ident && t->inseg ? seg : SIZE_MAX;
    bool rec = s->record && s->rec_base != SIZE_MAX;
    while (added_find(t, &t->normd, b, bn, scan, at, &ms, &me, &id)) {
        if ((rc = pretok_bpe(t, s, b, at, ms - at, scan)) ||
            (rec && (rc = mark(s, seg + ms, TOK_MARK_END, seg + at))) || (rc = out_id(s, id)))
            return rc;
        at = scan = me;
    }
    if ((rc = pretok_bpe(t, s, b, at, bn - at, scan)))
        return rc;
    return rec ? mark(s, seg + bn, TOK_MARK_END, seg + at) : 0;
}

/* A segment between raw-matched added tokens, text[seg, seg+n): normalize, then the body. */
static int segment(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t seg, size_t n)
{
    int rc;
    if (s->record && (rc = mark(s, seg, seg, seg)))
        return rc;
    if (!n)
        return 0;
    const char *in = text + seg, *b;
    size_t bn;
    if ((rc = kvr_tok_normalize(t, s, in, n, &b, &bn)))
        return rc;
    bool ident = b == in || (bn == n && !memcmp(b, in, n));
    return segment_body(t, s, b, bn, seg, ident, 0, 0);
}

/* From a segment start `at` to the end. */
static int encode_from(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t len,
                       size_t at)
{
    size_t ms, me;
    uint32_t id;
    int rc = 0;
    while (!rc && added_find(t, &t->raw, text, len, at, at, &ms, &me, &id)) {
        if (!(rc = segment(t, s, text, at, ms - at)))
            rc = out_id(s, id);
        at = me;
    }
    return rc ? rc : segment(t, s, text, at, len - at);
}

/* From a mark inside a segment (raw text up to it is its own normalization): the segment's
 * tail is normalized alone (normalization is local before an ASCII character, which the
 * cache checked) and appended to the raw head, so the first pre-tokenizer sees the whole
 * segment as a subject. */
static int encode_inseg(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t len,
                        const struct tok_mark *m)
{
    size_t k = m->raw, seg = m->seg, ms = len, me = len;
    uint32_t id;
    int rc;
    bool found = added_find(t, &t->raw, text, len, k, seg, &ms, &me, &id);
    size_t end = found ? ms : len;
    const char *tail, *b = text + seg;
    size_t tn, bn = end - seg;
    if ((rc = kvr_tok_normalize(t, s, text + k, end - k, &tail, &tn)))
        return rc;
    if (tail != text + k && (tn != end - k || memcmp(tail, text + k, tn))) {
        if ((rc = grow((void **)&s->cat, &s->catcap, (k - seg) + tn + 1, 1)))
            return rc;
        memcpy(s->cat, text + seg, k - seg);
        memcpy(s->cat + (k - seg), tail, tn);
        b = s->cat;
        bn = (k - seg) + tn;
    }
    if ((rc = segment_body(t, s, b, bn, seg, b == text + seg, k - seg, m->sub - seg)))
        return rc;
    if (!found)
        return 0;
    if ((rc = out_id(s, id)))
        return rc;
    return encode_from(t, s, text, len, me);
}

int kvr_tok_encode_at(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t len,
                      bool add_special, const struct tok_mark *m, bool record,
                      const uint32_t **ids)
{
    *ids = NULL;
    if (len > UINT32_MAX / 2)
        return -EOVERFLOW;
    /* resuming, the text before m is the cached text (compared byte for byte): valid */
    size_t from = m ? m->raw : 0;
    if (from > len || !utf8_valid((const unsigned char *)text + from, len - from))
        return -EILSEQ;
    if (kvr_tok_over_limit(t, s, len))
        return -EMSGSIZE;
    if (m != NULL && s->limit && s->nids > s->limit) /* the cached ids alone pass it */
        return -EMSGSIZE;
    int rc = 0;
    s->record = record;
    s->nmarks = 0;
    if (m == NULL) {
        s->nids = 0;
        for (size_t i = 0; add_special && !rc && i < t->nprefix; i++)
            rc = out_id(s, t->prefix[i]);
        if (!rc)
            rc = encode_from(t, s, text, len, 0);
    } else if (m->raw == m->seg) {
        rc = encode_from(t, s, text, len, m->raw);
    } else {
        rc = encode_inseg(t, s, text, len, m);
    }
    for (size_t i = 0; add_special && !rc && i < t->nsuffix; i++)
        rc = out_id(s, t->suffix[i]);
    s->record = false;
    if (rc)
        return rc;
    *ids = s->ids ? s->ids : (const uint32_t *)"";
    return (int)s->nids;
}

bool kvr_tok_over_limit(const kvr_tok *t, const kvr_tok_scratch *s, size_t len)
{
    return s->limit && t->raw_bound && (len + t->max_sym - 1) / t->max_sym > s->limit;
}

int kvr_tok_encode(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t len,
                   bool add_special, const uint32_t **ids)
{
    return kvr_tok_encode_at(t, s, text, len, add_special, NULL, false, ids);
}

uint32_t *kvr_tok_ids_prepare(kvr_tok_scratch *s, size_t n)
{
    if (n > s->idcap && grow((void **)&s->ids, &s->idcap, n, sizeof *s->ids))
        return NULL;
    s->nids = n;
    return s->ids;
}

void *kvr_tok_scratch_aux(kvr_tok_scratch *s, size_t n)
{
    if (n > s->auxcap) {
        void *p = realloc(s->aux, n);
        if (!p)
            return NULL;
        s->aux = p;
        s->auxcap = n;
    }
    return s->aux;
}

const struct tok_mark *kvr_tok_marks(const kvr_tok_scratch *s, size_t *n)
{
    *n = s->nmarks;
    return s->marks;
}

long kvr_tok_prove(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t sub,
                   size_t from, size_t e, bool closed)
{
    const struct pre *p = &t->pres[0];
    const char *w = text + sub;
    size_t n = e - sub, at = from - sub, gs = at, best = at, lastns = SIZE_MAX;
    if (from >= e)
        return (long)from;
    if (t->any_lstrip && !closed) /* a later token's lstrip must not reach back over it */
        for (size_t i = e; i-- > from;)
            if (!is_space((unsigned char)text[i])) {
                lastns = i - sub;
                break;
            }
#define OK_AT(b) ((!t->has_nfx || (unsigned char)w[b] < 0x80) && \
                  (!t->any_lstrip || closed || (lastns != SIZE_MAX && (b) <= lastns)))
    while (at < n) {
        int r = (p->jit ? pcre2_jit_match : pcre2_match)(p->re, (PCRE2_SPTR)w, n, at,
                            PCRE2_NO_UTF_CHECK | (closed ? 0 : PCRE2_PARTIAL_HARD), s->md, s->mc);
        if (r == PCRE2_ERROR_NOMATCH || r == PCRE2_ERROR_PARTIAL)
            break;
        if (r < 0)
            return -E2BIG;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: skipped, as split() does */
            at = ms + utf8_len((unsigned char)w[ms]);
            continue;
        }
        if (ms > gs && OK_AT(ms))
            best = ms;
        if (me < n && OK_AT(me))
            best = me;
        gs = at = me;
    }
#undef OK_AT
    return (long)(sub + best);
}
