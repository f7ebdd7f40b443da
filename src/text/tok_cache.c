/* tok_cache.c — the exact prefix cache of tokenization: a prompt that begins like an earlier
 * one (system prompt, few-shot header, earlier turns) costs only its new tail.
 *
 * Why it is exact. BPE runs per pre-token, so encoding can resume at a pre-token boundary
 * given the ids before it. Which boundaries of an earlier text T1 are still boundaries in a
 * new text T2 that shares only T1[0, c) is proven when T1 is cached, for each checkpoint
 * c = i * G (G bytes, every block of text):
 *  - added tokens: every token that starts more than the longest added token before c is
 *    found the same in T2, so the segment structure before e = c - max_added - 1 is
 *    settled (a token of T2 that straddles c can only start after e);
 *  - the first pre-tokenizer's regex is run again over T1[sub, e) with PCRE2_PARTIAL_HARD:
 *    a match that could come out differently with more text stops the scan, so the pieces
 *    before the last complete boundary k are T2's as well (kvr_tok_prove); further
 *    pre-tokenizers split those pieces independently, BPE is per piece;
 *  - normalization (NFx) is local before an ASCII character: k must sit on one; a
 *    segment is resumable inside only when its normalization changed nothing before k;
 *    tokens with lstrip need a non-space between k and e.
 * The checkpoint keeps (k, the ids before k). A lookup hashes T2 in blocks of G (a chain
 * of xxh3, seeded by the tokenizer's load generation and add_special), binary-searches the
 * longest cached checkpoint, compares the cached text byte for byte (a hash match alone is
 * never trusted), copies the ids and encodes from k. Resumption is only at segment starts
 * for tokenizers whose first pre-tokenizer is not a regex Split (Mistral: one BPE word per
 * segment; Gemma 3: a literal split on a space its normalizer removed).
 *
 * Storage: one entry ("doc") per cached text: its first ncps * G bytes, the ids up to its
 * last checkpoint, its checkpoints, and one hash-table link per checkpoint; LRU-evicted by
 * bytes. A text that resumed is added only when it brought INSERT_MIN new bytes (each
 * conversation turn of that size is cached; a short question after a cached system prompt
 * is not). One mutex: a lookup holds it for a binary search, one memcmp and an id copy.
 */
#include "text/tok_int.h"

#include <pthread.h>
#include <stdatomic.h>

#define G 256 /* bytes per checkpoint block */
/* A prompt that resumed adds itself only when it tokenized at least this much new text:
 * a short tail (another question after the same system prompt) is cheap to tokenize again,
 * while caching it would store the whole shared beginning once more and pay the proof. */
#define INSERT_MIN 2048

struct ent {
    uint64_t key;
    struct doc *d;
    uint32_t i; /* checkpoint i: text [0, i*G) */
    struct ent *next, **pprev; /* pprev: O(1) unlink (texts sharing a beginning share keys,
                                * so a key's chain can be as long as the texts holding it) */
};

struct doc {
    struct doc *prev, *next; /* LRU, head = newest */
    uint64_t gen;
    bool add_special;
    uint32_t ncps;
    size_t nids, bytes;
    char *text;       /* ncps * G bytes */
    uint32_t *ids;    /* nids */
    struct tok_mark *cps; /* cps[i-1] for checkpoint i */
    struct ent *ents;     /* ncps */
};

struct kvr_tok_cache {
    pthread_mutex_t lock;
    struct ent **bucket;
    size_t mask;
    struct doc head; /* LRU sentinel */
    size_t bytes, max_bytes, docs;
    uint64_t hits, misses, inserts, evictions, saved;
};

int kvr_tok_cache_new(size_t max_bytes, kvr_tok_cache **out)
{
    kvr_tok_cache *c = calloc(1, sizeof *c);
    size_t nb = 1024;
    while (nb < max_bytes / 1024 && nb < (1u << 24))
        nb <<= 1;
    if (!c || !(c->bucket = calloc(nb, sizeof *c->bucket))) {
        free(c);
        return -ENOMEM;
    }
    c->mask = nb - 1;
    c->max_bytes = max_bytes;
    c->head.prev = c->head.next = &c->head;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return 0;
}

static void unlink_doc(kvr_tok_cache *c, struct doc *d)
{
    d->prev->next = d->next;
    d->next->prev = d->prev;
}

static void push_front(kvr_tok_cache *c, struct doc *d)
{
    d->next = c->head.next;
    d->prev = &c->head;
    c->head.next->prev = d;
    c->head.next = d;
}

static void drop(kvr_tok_cache *c, struct doc *d)
{
    for (uint32_t i = 0; i < d->ncps; i++) {
        struct ent *e = &d->ents[i];
        *e->pprev = e->next;
        if (e->next)
            e->next->pprev = e->pprev;
    }
    unlink_doc(c, d);
    c->bytes -= d->bytes;
    c->docs--;
    free(d);
}

void kvr_tok_cache_free(kvr_tok_cache *c)
{
    if (!c)
        return;
    while (c->head.next != &c->head)
        drop(c, c->head.next);
    pthread_mutex_destroy(&c->lock);
    free(c->bucket);
    free(c);
}

void kvr_tok_cache_stats(kvr_tok_cache *c, struct kvr_tok_cache_stats *st)
{
    pthread_mutex_lock(&c->lock);
    *st = (struct kvr_tok_cache_stats){c->hits, c->misses, c->inserts, c->evictions,
                                       c->bytes, c->docs, c->saved};
    pthread_mutex_unlock(&c->lock);
}

static const struct ent *find(const kvr_tok_cache *c, uint64_t key, uint32_t i, uint64_t gen,
                              bool add)
{
    for (const struct ent *e = c->bucket[key & c->mask]; e; e = e->next)
        if (e->key == key && e->i == i && e->d->gen == gen && e->d->add_special == add)
            return e;
    return NULL;
}

/* The resumable point for checkpoint e (see the file's note), from the marks of the text's
 * encode (sorted by raw; *j the last one <= e so far) and the last proven point cur. */
static struct tok_mark next_point(const kvr_tok *t, kvr_tok_scratch *s, const char *text,
                                  const struct tok_mark *mk, size_t nm, size_t *j, size_t e,
                                  struct tok_mark cur)
{
    while (*j + 1 < nm && mk[*j + 1].raw <= e)
        (*j)++;
    if (!nm || mk[*j].raw > e)
        return cur;
    struct tok_mark m = mk[*j];
    if (m.seg != TOK_MARK_END && m.raw == m.seg) /* a segment start */
        return m.raw > cur.raw ? m : cur;
    bool closed = m.seg == TOK_MARK_END;
    size_t end = closed ? m.raw : e;
    size_t from = cur.sub == m.sub && cur.raw >= m.sub && cur.seg != TOK_MARK_END ? cur.raw
                                                                                 : m.sub;
    long k = kvr_tok_prove(t, s, text, m.sub, from, end, closed);
    if (k < 0 || (size_t)k <= from || (size_t)k <= cur.raw)
        return cur;
    for (size_t x = *j + 1; x-- > 0;) { /* the piece mark at k */
        if (mk[x].raw < (uint32_t)k)
            break;
        if (mk[x].raw == (uint32_t)k && mk[x].seg != TOK_MARK_END && mk[x].sub == m.sub)
            return mk[x];
    }
    return cur;
}

int kvr_tok_encode_cached(const kvr_tok *t, kvr_tok_cache *c, kvr_tok_scratch *s,
                          const char *text, size_t len, bool add_special, const uint32_t **ids)
{
    size_t nb = len / G;
    if (kvr_tok_over_limit(t, s, len))
        return -EMSGSIZE; /* no hashing or lookup for a text refused by its size */
    if (!c || nb < 2 || len > UINT32_MAX / 2)
        return kvr_tok_encode(t, s, text, len, add_special, ids);
    uint64_t *h = kvr_tok_scratch_aux(s, (nb + 1) * sizeof *h + nb * sizeof(struct tok_mark));
    if (!h)
        return -ENOMEM;
    struct tok_mark *cps = (struct tok_mark *)(h + nb + 1);
    int rc;
    /* a chain over the blocks (unseeded xxh3: its seeded form derives a secret per call) */
    h[0] = (t->gen << 1 | add_special) * 0x9e3779b97f4a7c15ull;
    for (size_t i = 1; i <= nb; i++) {
        uint64_t x = (h[i - 1] ^ XXH3_64bits(text + (i - 1) * G, G)) * 0xff51afd7ed558ccdull;
        h[i] = x ^ (x >> 32);
    }

    /* the longest cached checkpoint: binary search on the hash, then the bytes compared */
    size_t best = 0;
    struct tok_mark at = {0};
    bool hit = false;
    pthread_mutex_lock(&c->lock);
    size_t lo = 1, hi = nb;
    const struct ent *be = NULL;
    while (lo <= hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct ent *e = find(c, h[mid], (uint32_t)mid, t->gen, add_special);
        if (e)
            best = mid, be = e, lo = mid + 1;
        else
            hi = mid - 1;
    }
    if (be && !memcmp(be->d->text, text, best * G) && be->d->cps[best - 1].raw > 0) {
        const struct doc *d = be->d;
        at = d->cps[best - 1];
        uint32_t *dst = kvr_tok_ids_prepare(s, at.nids);
        if (dst) {
            memcpy(dst, d->ids, at.nids * sizeof *dst);
            memcpy(cps, d->cps, best * sizeof *cps);
            unlink_doc(c, be->d);
            push_front(c, be->d);
            hit = true;
            c->hits++;
            c->saved += at.raw;
        }
    }
    if (!hit) {
        best = 0;
        c->misses++;
    }
    pthread_mutex_unlock(&c->lock);

    /* marks are only needed when this text will be added */
    bool add = !hit || len - at.raw >= INSERT_MIN;
    rc = kvr_tok_encode_at(t, s, text, len, add_special, hit ? &at : NULL, add, ids);
    if (rc < 0)
        goto out;

    if (!add)
        goto out;
    /* checkpoints of this text past the hit */
    size_t nm, j = 0;
    const struct tok_mark *mk = kvr_tok_marks(s, &nm);
    struct tok_mark cur = hit ? at : (nm ? mk[0] : (struct tok_mark){0});
    size_t margin = (size_t)t->max_added + 1;
    for (size_t i = best + 1; i <= nb; i++) {
        size_t c_end = i * G;
        if (c_end > margin && c_end - margin > cur.raw)
            cur = next_point(t, s, text, mk, nm, &j, c_end - margin, cur);
        cps[i - 1] = cur;
    }
    if (cps[nb - 1].raw <= (hit ? at.raw : 0))
        goto out; /* nothing resumable past what is cached */
    size_t nids = cps[nb - 1].nids;
    size_t bytes = sizeof(struct doc) + nb * G + nids * sizeof(uint32_t) +
                   nb * (sizeof(struct tok_mark) + sizeof(struct ent));
    if (bytes > c->max_bytes)
        goto out;
    struct doc *d = malloc(bytes);
    if (!d)
        goto out; /* the answer stands; only caching failed */
    d->gen = t->gen;
    d->add_special = add_special;
    d->ncps = (uint32_t)nb;
    d->nids = nids;
    d->bytes = bytes;
    d->ents = (struct ent *)(d + 1);
    d->cps = (struct tok_mark *)(d->ents + nb);
    d->ids = (uint32_t *)(d->cps + nb);
    d->text = (char *)(d->ids + nids);
    memcpy(d->text, text, nb * G);
    memcpy(d->ids, *ids, nids * sizeof(uint32_t));
    memcpy(d->cps, cps, nb * sizeof *cps);
    pthread_mutex_lock(&c->lock);
    while (c->bytes + bytes > c->max_bytes && c->head.prev != &c->head) {
        drop(c, c->head.prev);
        c->evictions++;
    }
    for (size_t i = 1; i <= nb; i++) {
        struct ent *e = &d->ents[i - 1];
        struct ent **b = &c->bucket[h[i] & c->mask];
        *e = (struct ent){h[i], d, (uint32_t)i, *b, b};
        if (*b)
            (*b)->pprev = &e->next;
        *b = e;
    }
    push_front(c, d);
    c->bytes += bytes;
    c->docs++;
    c->inserts++;
    pthread_mutex_unlock(&c->lock);
out:
    return rc;
}
