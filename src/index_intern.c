/* index_intern.c — interning: namespaces (model, LoRA), workers (pod, dp rank), pods and
 * tiers get the small dense ids the index and its callers work with.
 *
 * Inserts take one mutex (ix->imu; it may allocate under it and takes no other lock: lock
 * order in index_int.h); lookups are lock-free over immutable records in open-addressing
 * tables whose replaced versions are kept until destroy (a lookup may still walk an old one).
 * A record, a worker or a namespace chunk is complete before its pointer or count is
 * published with a release store.
 */
#include "index_int.h"

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
    ix->wpod[id] = pid;
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

void kvr_ix_itab_free(struct kvr_index *ix, struct itab *t, int recs)
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
