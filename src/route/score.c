/* score.c — a query → ranked worker scores, on top of kvr_index_find().
 *
 * Design:
 * - struct kvr_score is shared: the index, a copy of the [score] weights (by tier name) under
 *   a mutex with a generation counter, and the histograms (lock-free).
 * - struct kvr_score_ctx is one per thread and owns everything a query needs: an index reader,
 *   the content-hash scratch (max_tokens entries: a block is at least one token), the pod-id
 *   scratch and the result entries (one per worker at most), so a query makes no heap
 *   allocation. The ctx caches the per-tier-id weight array; it is rebuilt only when the
 *   weight generation or the number of tiers in use changes (one relaxed load per query
 *   otherwise).
 * - The block size is the namespace's (learned from events); a LoRA namespace that has none
 *   yet falls back to its base model's, and a model whose events taught none to the
 *   configured one ([model] block_size, 16 for approximate mode: conf's table, copied into
 *   each ctx with the weights, so the lookup takes no lock). A partial tail block is not
 *   hashed.
 * Threads: kvr_score_query on the ctx's thread; kvr_score_set_weights and kvr_score_metrics
 * from any thread.
 */
#include "route/score.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "index/hash.h"
#include "core/log.h"

#define SCORE_MAX_PODS 4096 /* pod filter entries per query (ctx scratch) */

struct weight_conf {
    char name[32];
    double weight;
};

/* A model's configured block size (used while its events have taught none). */
struct bs_conf {
    char *model;
    uint32_t block_size;
};

struct kvr_score {
    struct kvr_index *ix;
    uint32_t max_workers;

    pthread_mutex_t wlock;                     /* protects wconf, nw, wdefault, bsc, nbsc */
    struct weight_conf wconf[KVR_CONF_MAX_TIERS];
    size_t nw;
    double wdefault;
    struct bs_conf *bsc;
    size_t nbsc;
    _Atomic uint64_t wgen;                     /* bumped after each change */

    struct kvr_hist latency;      /* seconds */
    struct kvr_hist query_blocks; /* whole blocks in the prompt */
    struct kvr_hist matched;      /* best matched_blocks / query_blocks, known models */
    _Atomic uint64_t unknown_model;
};

struct kvr_score_ctx {
    struct kvr_score *s;
    struct kvr_index_reader *reader;
    uint32_t max_tokens;
    uint64_t *hashes;   /* [max_tokens] */
    uint32_t *pod_ids;  /* [SCORE_MAX_PODS] */
    struct kvr_score_entry *entries;
    size_t ent_cap;

    uint64_t wgen_seen;
    uint8_t tiers_seen;
    uint32_t aside; /* the "predicted" tier's bit, once interned */
    double weights[KVR_TIER_MAX];
    struct bs_conf *bsc; /* the ctx's copy of s->bsc, taken with the weights */
    size_t nbsc;
};

static void bs_free(struct bs_conf *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].model);
    free(v);
}

/* A copy of the configured block sizes of src[0..n): 0 or -ENOMEM (*out untouched). */
static int bs_copy(const struct bs_conf *src, size_t n, struct bs_conf **out)
{
    struct bs_conf *v = calloc(n ? n : 1, sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        v[i].block_size = src[i].block_size;
        if ((v[i].model = strdup(src[i].model)) == NULL) {
            bs_free(v, i);
            return -ENOMEM;
        }
    }
    *out = v;
    return 0;
}

/* The [model] sections' block sizes: block_size, else 16 (vLLM's default) for a model in
 * approximate mode (it may never have events to learn one from). */
static void load_block_sizes(struct kvr_score *s, const struct kvr_conf *conf)
{
    struct bs_conf *v = calloc(conf->nmodels ? conf->nmodels : 1, sizeof(*v)), *old;
    size_t n = 0, nold;

    if (v == NULL)
        return; /* out of memory: the previous sizes stay */
    for (size_t i = 0; i < conf->nmodels; i++) {
        const struct kvr_conf_model *m = &conf->models[i];
        uint32_t bs = m->block_size ? m->block_size
                      : (m->approximate || m->napproximate_pods) ? 16 : 0;
        if (bs == 0)
            continue;
        if ((v[n].model = strdup(m->name)) == NULL) {
            bs_free(v, n);
            return;
        }
        v[n++].block_size = bs;
    }
    pthread_mutex_lock(&s->wlock);
    old = s->bsc;
    nold = s->nbsc;
    s->bsc = v;
    s->nbsc = n;
    pthread_mutex_unlock(&s->wlock);
    bs_free(old, nold);
}

static void load_weights(struct kvr_score *s, const struct kvr_conf *conf)
{
    load_block_sizes(s, conf);
    pthread_mutex_lock(&s->wlock);
    s->nw = conf->nweights < KVR_CONF_MAX_TIERS ? conf->nweights : KVR_CONF_MAX_TIERS;
    for (size_t i = 0; i < s->nw; i++) {
        memcpy(s->wconf[i].name, conf->weights[i].name, sizeof(s->wconf[i].name));
        s->wconf[i].name[sizeof(s->wconf[i].name) - 1] = '\0';
        s->wconf[i].weight = conf->weights[i].weight;
    }
    s->wdefault = conf->default_weight;
    pthread_mutex_unlock(&s->wlock);
    atomic_fetch_add_explicit(&s->wgen, 1, memory_order_release);
}

int kvr_score_create(struct kvr_index *ix, const struct kvr_conf *conf, struct kvr_score **out)
{
    struct kvr_score *s;
    static const double frac[] = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99,
                                  1.0};

    if (ix == NULL || conf == NULL || out == NULL)
        return -EINVAL;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return -ENOMEM;
    s->ix = ix;
    s->max_workers = conf->max_workers ? conf->max_workers : 16384;
    if (pthread_mutex_init(&s->wlock, NULL) != 0) {
        free(s);
        return -ENOMEM;
    }
    load_weights(s, conf);
    kvr_hist_init_exp(&s->latency, 1e-6, 2.0, 24);      /* 1 µs .. 8 s */
    kvr_hist_init_exp(&s->query_blocks, 1.0, 2.0, 18);  /* 1 .. 131072 */
    kvr_hist_init(&s->matched, frac, sizeof(frac) / sizeof(frac[0]));
    *out = s;
    return 0;
}

void kvr_score_destroy(struct kvr_score *s)
{
    if (s == NULL)
        return;
    pthread_mutex_destroy(&s->wlock);
    bs_free(s->bsc, s->nbsc);
    free(s);
}

void kvr_score_set_weights(struct kvr_score *s, const struct kvr_conf *conf)
{
    load_weights(s, conf);
}

int kvr_score_ctx_create(struct kvr_score *s, uint32_t max_tokens, struct kvr_score_ctx **out)
{
    struct kvr_score_ctx *c;
    int rc;

    if (s == NULL || out == NULL || max_tokens == 0)
        return -EINVAL;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    c->s = s;
    c->max_tokens = max_tokens;
    c->ent_cap = s->max_workers;
    c->hashes = malloc((size_t)max_tokens * sizeof(uint64_t));
    c->pod_ids = malloc(SCORE_MAX_PODS * sizeof(uint32_t));
    c->entries = malloc(c->ent_cap * sizeof(struct kvr_score_entry));
    if (c->hashes == NULL || c->pod_ids == NULL || c->entries == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    rc = kvr_index_reader_create(s->ix, &c->reader);
    if (rc != 0)
        goto fail;
    c->wgen_seen = UINT64_MAX;
    *out = c;
    return 0;
fail:
    free(c->hashes);
    free(c->pod_ids);
    free(c->entries);
    free(c);
    return rc;
}

void kvr_score_ctx_destroy(struct kvr_score_ctx *c)
{
    if (c == NULL)
        return;
    kvr_index_reader_destroy(c->reader);
    bs_free(c->bsc, c->nbsc);
    free(c->hashes);
    free(c->pod_ids);
    free(c->entries);
    free(c);
}

/* Rebuilds the per-tier-id weights when the configuration or the set of tiers changed. */
static void refresh_weights(struct kvr_score_ctx *c, struct kvr_score_result *res)
{
    struct kvr_score *s = c->s;
    uint64_t gen = atomic_load_explicit(&s->wgen, memory_order_acquire);
    uint8_t ntiers = kvr_index_tier_count(s->ix);

    for (uint8_t t = 0; t < KVR_TIER_MAX; t++)
        res->tier_names[t] = t < ntiers ? kvr_index_tier_name(s->ix, t) : NULL;
    if (gen == c->wgen_seen && ntiers == c->tiers_seen)
        return;
    c->aside = 0;
    for (uint8_t t = 0; t < KVR_TIER_MAX; t++)
        if (res->tier_names[t] != NULL && strcmp(res->tier_names[t], "predicted") == 0)
            c->aside = 1u << t;
    kvr_index_reader_aside(c->reader, c->aside);
    pthread_mutex_lock(&s->wlock);
    for (uint8_t t = 0; t < KVR_TIER_MAX; t++) {
        const char *name = res->tier_names[t];
        double w = s->wdefault;
        if (name == NULL) {
            /* ids 0..2 are gpu, cpu, storage even before an event named them */
            name = t == KVR_TIER_GPU ? "gpu" : t == KVR_TIER_CPU ? "cpu"
                 : t == KVR_TIER_STORAGE ? "storage" : NULL;
        }
        for (size_t i = 0; name != NULL && i < s->nw; i++)
            if (strcasecmp(s->wconf[i].name, name) == 0) {
                w = s->wconf[i].weight;
                break;
            }
        c->weights[t] = w;
    }
    if (gen != c->wgen_seen) {
        struct bs_conf *v;
        if (bs_copy(s->bsc, s->nbsc, &v) == 0) { /* out of memory: the old copy stays */
            bs_free(c->bsc, c->nbsc);
            c->bsc = v;
            c->nbsc = s->nbsc;
        }
    }
    pthread_mutex_unlock(&s->wlock);
    c->wgen_seen = gen;
    c->tiers_seen = ntiers;
}

/* The query's block content hashes into c->hashes, as ingest hashes events. */
static void hash_query(struct kvr_score_ctx *c, const struct kvr_score_query *q, uint64_t seed,
                       uint32_t nblocks, uint32_t bs)
{
    kvr_hash_blocks(seed, q->tokens, nblocks, bs, c->hashes);
    kvr_hash_fold_query(c->hashes, nblocks, bs, q->cache_salt,
                        q->cache_salt ? strlen(q->cache_salt) : 0, q->media, q->nmedia);
}

static int entry_cmp(const void *pa, const void *pb)
{
    const struct kvr_score_entry *a = pa, *b = pb;
    int r;

    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    r = strcmp(a->pod, b->pod);
    if (r != 0)
        return r;
    return a->dp_rank < b->dp_rank ? -1 : a->dp_rank > b->dp_rank ? 1 : 0;
}

int kvr_score_query(struct kvr_score_ctx *c, const struct kvr_score_query *q,
                    struct kvr_score_result *res)
{
    struct kvr_score *s = c->s;
    struct kvr_index *ix = s->ix;
    uint64_t t0 = kvr_now_ns(), seed;
    uint32_t ns, bs = 0, nblocks, best = 0;
    const uint32_t *pod_filter = NULL;
    size_t npods = 0, nhits = 0;
    const struct kvr_index_hit *hits = NULL;
    int rc;

    memset(res, 0, sizeof(*res));
    res->entries = c->entries;
    if (q->ntokens > c->max_tokens || q->npods > SCORE_MAX_PODS)
        return -E2BIG;
    if (q->model == NULL)
        return -EINVAL;
    refresh_weights(c, res);

    rc = kvr_index_ns_lookup(ix, q->model, q->lora_name, &ns, &seed);
    if (rc == 0)
        bs = kvr_index_ns_block_size(ix, ns);
    if (bs == 0 && q->lora_name != NULL) {
        uint32_t base_ns;
        uint64_t base_seed;
        if (kvr_index_ns_lookup(ix, q->model, NULL, &base_ns, &base_seed) == 0)
            bs = kvr_index_ns_block_size(ix, base_ns);
    }
    for (size_t i = 0; bs == 0 && i < c->nbsc; i++)
        if (strcmp(c->bsc[i].model, q->model) == 0)
            bs = c->bsc[i].block_size;
    if (bs == 0) { /* unknown model: block_size null, no scores */
        atomic_fetch_add_explicit(&s->unknown_model, 1, memory_order_relaxed);
        goto done;
    }
    res->block_size = bs;
    nblocks = (uint32_t)(q->ntokens / bs);
    res->query_blocks = nblocks;
    kvr_hist_observe(&s->query_blocks, (double)nblocks);
    if (q->want_hashes && nblocks > 0) { /* even for a namespace nothing was indexed in */
        if (rc != 0)
            seed = kvr_hash_ns_seed(q->model, strlen(q->model), q->lora_name,
                                    q->lora_name ? strlen(q->lora_name) : 0);
        hash_query(c, q, seed, nblocks, bs);
        res->hashes = c->hashes;
    }
    if (rc != 0 || nblocks == 0) /* LoRA never seen, or no whole block: nothing matches */
        goto observed;

    if (q->npods > 0) {
        for (size_t i = 0; i < q->npods; i++) {
            uint32_t pid;
            if (q->pods[i] != NULL && kvr_index_pod_lookup(ix, q->pods[i], &pid) == 0)
                c->pod_ids[npods++] = pid;
        }
        if (npods == 0) /* only unknown pods: they match nothing */
            goto observed;
        pod_filter = c->pod_ids;
    }

    if (res->hashes == NULL)
        hash_query(c, q, seed, nblocks, bs);
    rc = kvr_index_find(c->reader, ns, c->hashes, nblocks, pod_filter, npods, c->weights, &hits,
                        &nhits);
    if (rc != 0)
        return rc;
    if (nhits > c->ent_cap)
        nhits = c->ent_cap; /* cannot happen: one hit per worker, ent_cap = max_workers */
    for (size_t i = 0; i < nhits; i++) {
        const struct kvr_index_hit *h = &hits[i];
        struct kvr_score_entry *e = &c->entries[res->nentries];
        if (h->matched == 0)
            continue;
        e->pod = h->pod; /* named inside the find: the wid may be forgotten since */
        e->dp_rank = h->dp_rank;
        e->matched_blocks = h->matched_base;
        e->matched_tokens = h->matched_base * bs;
        e->predicted_blocks = h->matched;
        memcpy(e->tiers, h->tier_matched, sizeof(e->tiers));
        e->score = h->score;
        if (h->matched_base > best)
            best = h->matched_base;
        res->nentries++;
    }
    if (res->nentries > 1)
        qsort(c->entries, res->nentries, sizeof(c->entries[0]), entry_cmp);
observed:
    kvr_hist_observe(&s->matched, nblocks ? (double)best / (double)nblocks : 0.0);
done:
    kvr_hist_observe(&s->latency, (double)(kvr_now_ns() - t0) * 1e-9);
    return 0;
}

void kvr_score_metrics(struct kvr_score *s, struct kvr_buf *out)
{
    kvr_metrics_hist(out, "score_latency_seconds",
                     "Time to score one query (hashing, index lookup, ranking)", NULL,
                     &s->latency);
    kvr_metrics_hist(out, "score_query_blocks",
                     "Whole blocks per scored prompt (models with a known block size)", NULL,
                     &s->query_blocks);
    kvr_metrics_hist(out, "score_matched_fraction",
                     "Best worker's matched blocks over the prompt's blocks, per query", NULL,
                     &s->matched);
    kvr_metrics_counter(out, "score_unknown_model_total",
                        "Queries for a model (or LoRA) whose block size is not known yet", NULL,
                        atomic_load_explicit(&s->unknown_model, memory_order_relaxed));
}
