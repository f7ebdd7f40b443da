/* session.c — session bonds (session.h): a chained hash table of keys and a list in order
 * of last use, so expiry and eviction take from the front and every operation is O(1)
 * expected.
 */
#include "route/session.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct bond {
    struct bond *hnext;       /* bucket chain */
    struct bond *prev, *next; /* use order, least recent first */
    uint64_t h;
    int64_t used_ms;
    uint32_t rank;
    uint16_t klen;
    char *pod;
    char key[]; /* klen bytes */
};

struct kvr_session {
    struct bond **b;
    size_t mask, n;
    uint32_t max;
    struct bond head; /* sentinel of the use-order list */
};

int kvr_session_create(uint32_t max, struct kvr_session **out)
{
    struct kvr_session *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->b = calloc(64, sizeof(*s->b))) == NULL) {
        free(s);
        return -ENOMEM;
    }
    s->mask = 63;
    s->max = max ? max : 1;
    s->head.prev = s->head.next = &s->head;
    *out = s;
    return 0;
}

static void bond_free(struct bond *x)
{
    free(x->pod);
    free(x);
}

void kvr_session_destroy(struct kvr_session *s)
{
    if (s == NULL)
        return;
    for (struct bond *x = s->head.next, *n; x != &s->head; x = n) {
        n = x->next;
        bond_free(x);
    }
    free(s->b);
    free(s);
}

static void list_unlink(struct bond *x)
{
    x->prev->next = x->next;
    x->next->prev = x->prev;
}

static void list_append(struct kvr_session *s, struct bond *x)
{
    x->prev = s->head.prev;
    x->next = &s->head;
    s->head.prev->next = x;
    s->head.prev = x;
}

static void drop(struct kvr_session *s, struct bond *x)
{
    struct bond **p = &s->b[x->h & s->mask];
    while (*p != x)
        p = &(*p)->hnext;
    *p = x->hnext;
    list_unlink(x);
    bond_free(x);
    s->n--;
}

static struct bond *find(const struct kvr_session *s, const char *key, size_t len, uint64_t h)
{
    for (struct bond *x = s->b[h & s->mask]; x != NULL; x = x->hnext)
        if (x->h == h && x->klen == len && memcmp(x->key, key, len) == 0)
            return x;
    return NULL;
}

static void evict(struct kvr_session *s)
{
    while (s->n > s->max)
        drop(s, s->head.next);
}

void kvr_session_set_max(struct kvr_session *s, uint32_t max)
{
    s->max = max ? max : 1;
    evict(s);
}

int kvr_session_get(struct kvr_session *s, const char *key, size_t len, int64_t before_ms,
                    const char **pod, uint32_t *dp_rank)
{
    if (len == 0 || len > KVR_SESSION_KEY_MAX)
        return 0;
    struct bond *x = find(s, key, len, XXH3_64bits(key, len));
    if (x == NULL)
        return 0;
    if (x->used_ms <= before_ms) {
        drop(s, x);
        return 0;
    }
    *pod = x->pod;
    *dp_rank = x->rank;
    return 1;
}

/* Doubles the table when it holds more bonds than buckets (a failed grow keeps the old). */
static void grow(struct kvr_session *s)
{
    size_t nb = (s->mask + 1) * 2;
    struct bond **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return;
    for (size_t i = 0; i <= s->mask; i++) {
        for (struct bond *x = s->b[i], *n; x != NULL; x = n) {
            n = x->hnext;
            x->hnext = b[x->h & (nb - 1)];
            b[x->h & (nb - 1)] = x;
        }
    }
    free(s->b);
    s->b = b;
    s->mask = nb - 1;
}

int kvr_session_bind(struct kvr_session *s, const char *key, size_t len, const char *pod,
                     uint32_t dp_rank, int64_t now_ms)
{
    if (key == NULL || len == 0 || len > KVR_SESSION_KEY_MAX || pod == NULL || pod[0] == '\0')
        return -EINVAL;
    uint64_t h = XXH3_64bits(key, len);
    struct bond *x = find(s, key, len, h);
    if (x != NULL) {
        if (strcmp(x->pod, pod) != 0) {
            char *p = strdup(pod);
            if (p == NULL)
                return -ENOMEM;
            free(x->pod);
            x->pod = p;
        }
        x->rank = dp_rank;
        x->used_ms = now_ms;
        list_unlink(x);
        list_append(s, x);
        return 0;
    }
    if ((x = malloc(sizeof(*x) + len)) == NULL)
        return -ENOMEM;
    if ((x->pod = strdup(pod)) == NULL) {
        free(x);
        return -ENOMEM;
    }
    memcpy(x->key, key, len);
    x->klen = (uint16_t)len;
    x->h = h;
    x->rank = dp_rank;
    x->used_ms = now_ms;
    x->hnext = s->b[h & s->mask];
    s->b[h & s->mask] = x;
    list_append(s, x);
    s->n++;
    evict(s);
    if (s->n > s->mask + 1)
        grow(s);
    return 0;
}

size_t kvr_session_expire(struct kvr_session *s, int64_t before_ms)
{
    size_t k = 0;
    while (s->head.next != &s->head && s->head.next->used_ms <= before_ms) {
        drop(s, s->head.next);
        k++;
    }
    return k;
}

size_t kvr_session_drop_pod(struct kvr_session *s, const char *pod)
{
    size_t k = 0;
    for (struct bond *x = s->head.next, *n; x != &s->head; x = n) {
        n = x->next;
        if (strcmp(x->pod, pod) == 0) {
            drop(s, x);
            k++;
        }
    }
    return k;
}

size_t kvr_session_count(const struct kvr_session *s)
{
    return s->n;
}
