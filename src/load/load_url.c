/* load_url.c — what the scraper asks: the [load] metrics_url template filled in for a
 * worker, and the listing of workers the daemon hands over (load.h's kvr_load_list), sorted
 * and grouped into one entry per URL for the refresh (load.c).
 *
 * Why its own file: these are pure functions of strings, with no thread, lock or handle, and
 * the tests (test_load_prom) call them directly; load.c keeps the scraper's loop and state.
 */
#include "load/load.h"
#include "load/load_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"

/* ---- URL templates -------------------------------------------------------------------- */

bool kvr_load_pod_ok(const char *pod)
{
    size_t n = 0;
    for (const char *p = pod; *p; p++, n++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']'))
            return false;
    }
    return n > 0 && n < KVR_NAME_MAX;
}

bool kvr_load_url_per_rank(const char *tmpl)
{
    return tmpl != NULL && strstr(tmpl, "{rank}") != NULL;
}

int kvr_load_url_expand(const char *tmpl, const char *pod, uint32_t rank, char *out, size_t cap)
{
    const char *colon = strrchr(pod, ':');
    size_t hostlen = colon != NULL ? (size_t)(colon - pod) : strlen(pod);
    size_t n = 0;

    if (!kvr_load_pod_ok(pod) || cap == 0)
        return -EINVAL;
    for (const char *p = tmpl; *p;) {
        const char *ins = NULL;
        size_t inslen = 0, skip = 1;
        char num[16];

        if (*p == '{') {
            if (strncmp(p, "{pod}", 5) == 0) {
                ins = pod, inslen = strlen(pod), skip = 5;
            } else if (strncmp(p, "{host}", 6) == 0) {
                ins = pod, inslen = hostlen, skip = 6;
            } else if (strncmp(p, "{rank}", 6) == 0) {
                inslen = (size_t)snprintf(num, sizeof(num), "%" PRIu32, rank);
                ins = num, skip = 6;
            } else {
                return -EINVAL;
            }
        } else {
            ins = p, inslen = 1;
        }
        if (n + inslen >= cap)
            return -ENAMETOOLONG;
        memcpy(out + n, ins, inslen);
        n += inslen;
        p += skip;
    }
    out[n] = '\0';
    return (int)n;
}

/* ---- the listing ---------------------------------------------------------------------- */

void kvr_load_pods_free(char **pods, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(pods[i]);
    free(pods);
}

/* Frees a target; its easy handle must be out of the multi handle. */
int kvr_load_list_add(struct kvr_load_list *l, const char *pod, uint32_t rank)
{
    size_t n = pod != NULL ? strlen(pod) : 0;

    if (n == 0 || n >= KVR_NAME_MAX)
        return -EINVAL;
    if (l->n == KVR_LOAD_LIST_MAX)
        return -ENOSPC;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 64;
        struct kvr_load_lentry *g = realloc(l->v, nc * sizeof(*g));
        if (g == NULL)
            return l->rc = -ENOMEM;
        l->v = g;
        l->cap = nc;
    }
    l->v[l->n].pod = strdup(pod);
    if (l->v[l->n].pod == NULL)
        return l->rc = -ENOMEM;
    l->v[l->n].rank = rank;
    l->v[l->n].url = NULL;
    l->n++;
    return 0;
}

void kvr_load_list_free(struct kvr_load_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].pod);
        free(l->v[i].url);
    }
    free(l->v);
    memset(l, 0, sizeof(*l));
}

int kvr_load_lentry_cmp(const void *a, const void *b)
{
    const struct kvr_load_lentry *x = a, *y = b;
    int c = strcmp(x->url, y->url);
    return c != 0 ? c : strcmp(x->pod, y->pod);
}

/* The pods of entries v[0..n) (sorted, one URL) as a fresh unique array. NULL on ENOMEM. */
char **kvr_load_group_pods(const struct kvr_load_lentry *v, size_t n, size_t *np)
{
    char **pods = calloc(n, sizeof(char *));
    size_t k = 0;

    if (pods == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 && strcmp(pods[k - 1], v[i].pod) == 0)
            continue;
        if ((pods[k] = strdup(v[i].pod)) == NULL) {
            kvr_load_pods_free(pods, k);
            return NULL;
        }
        k++;
    }
    *np = k;
    return pods;
}

