/* load_table.c — the table (pod, dp_rank) → latest sample behind load.c's readers.
 *
 * Open addressing with linear probing on an FNV-1a hash of the pod and rank; the capacity is
 * a power of two and the table at most half full (it doubles before). Removal is linear
 * probing's backward-shift deletion, so no tombstones accumulate and a sweep never needs to
 * allocate (a refresh must be able to drop workers whose target is being freed, whatever the
 * memory situation). Why a file of its own: the deletion is the subtle part of the module,
 * and tests/unit/test_load_prom.c checks it against a naive model through load_int.h.
 *
 * No locking here: load.c holds its `lock` around every call.
 */
#include "load/load_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint64_t kvr_load_key_hash(const char *pod, uint32_t rank)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)pod; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    for (int i = 0; i < 4; i++)
        h = (h ^ ((rank >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}

struct kvr_load_worker *kvr_load_wt_find(const struct kvr_load_wtable *t, const char *pod,
                                         uint32_t rank, uint64_t h)
{
    if (t->cap == 0)
        return NULL;
    for (size_t i = h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        struct kvr_load_worker *w = t->slots[i];
        if (w == NULL)
            return NULL;
        if (w->hash == h && w->rank == rank && strcmp(w->pod, pod) == 0)
            return w;
    }
}

static void place(struct kvr_load_worker **slots, size_t cap, struct kvr_load_worker *w)
{
    size_t i = w->hash & (cap - 1);
    while (slots[i] != NULL)
        i = (i + 1) & (cap - 1);
    slots[i] = w;
}

int kvr_load_wt_insert(struct kvr_load_wtable *t, struct kvr_load_worker *w)
{
    if ((t->n + 1) * 2 > t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 16;
        struct kvr_load_worker **s = calloc(nc, sizeof(*s));
        if (s == NULL)
            return -ENOMEM;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i] != NULL)
                place(s, nc, t->slots[i]);
        free(t->slots);
        t->slots = s;
        t->cap = nc;
    }
    place(t->slots, t->cap, w);
    t->n++;
    return 0;
}

void kvr_load_worker_free(struct kvr_load_worker *w)
{
    if (w != NULL)
        free(w->pod);
    free(w);
}

/* Empties slot i and closes the gap: each later entry of the run moves into the hole unless
 * its home slot lies cyclically in (hole, its slot], so every entry stays reachable from its
 * home. */
static void delete_at(struct kvr_load_wtable *t, size_t i)
{
    size_t mask = t->cap - 1, j = i;

    t->slots[i] = NULL;
    for (;;) {
        size_t k;
        j = (j + 1) & mask;
        if (t->slots[j] == NULL)
            return;
        k = t->slots[j]->hash & mask;
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        t->slots[i] = t->slots[j];
        t->slots[j] = NULL;
        i = j;
    }
}

/* A deletion may move a later entry into the slot just checked, so that slot is looked at
 * again; an entry only moves backwards within its run, and a run never reaches around the
 * (at most half full) table back to the scan position, so every entry is looked at once at
 * least and none is skipped. */
size_t kvr_load_wt_sweep(struct kvr_load_wtable *t,
                         bool (*drop)(const struct kvr_load_worker *w, void *arg), void *arg)
{
    size_t removed = 0;

    for (size_t i = 0; i < t->cap;) {
        struct kvr_load_worker *w = t->slots[i];
        if (w != NULL && drop(w, arg)) {
            delete_at(t, i);
            kvr_load_worker_free(w);
            t->n--;
            removed++;
            continue;
        }
        i++;
    }
    return removed;
}

void kvr_load_wt_free(struct kvr_load_wtable *t)
{
    for (size_t i = 0; i < t->cap; i++)
        kvr_load_worker_free(t->slots[i]);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}
