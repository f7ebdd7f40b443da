/* conf_reload.c — SIGHUP: a freshly loaded configuration onto the live one.
 *
 * kvr_conf_apply_reload walks conf.c's directive table (kvr_conf_directives, conf_int.h):
 * a directive whose value differs between live and fresh is copied onto live when the table
 * marks it reloadable and named in `changed`, or else named in `ignored` (the daemon warns
 * that it needs a restart). Score weights are compared per tier (added, removed or a new
 * value); the [model] list is swapped as a whole by conf_model.c (kvr_conf_models_reload).
 *
 * Why a file of its own: it parses nothing. fresh has already passed the whole of conf.c
 * (parse, cross-checks), so only the comparison and the copy live here; it moved out of
 * conf.c when that file passed 1,200 lines, and shares nothing with it but the table.
 *
 * No threads of its own and no locks: the caller owns *live while this runs (daemon.c calls
 * it on the main thread, then hands live to the modules' reload callbacks).
 */
#include "core/conf.h"
#include "core/conf_int.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"

static void list_add(struct kvr_err *e, size_t *len, const char *section, const char *name)
{
    int n;
    if (e == NULL || *len >= sizeof(e->msg) - 1)
        return;
    n = snprintf(e->msg + *len, sizeof(e->msg) - *len, "%s%s.%s", *len ? ", " : "", section, name);
    if (n > 0)
        *len += (size_t)n;
    if (*len >= sizeof(e->msg))
        *len = sizeof(e->msg) - 1;
}

static bool str_eq(const char *a, const char *b)
{
    if (a == NULL || b == NULL)
        return a == b;
    return strcmp(a, b) == 0;
}

static bool field_equal(const struct directive *d, const struct kvr_conf *a,
                        const struct kvr_conf *b)
{
    switch (d->type) {
    case T_LEVEL:
    case T_FORMAT:
        return *CFIELD(a, d, int) == *CFIELD(b, d, int);
    case T_DURATION:
    case T_SIZE:
    case T_I64:
        return *CFIELD(a, d, int64_t) == *CFIELD(b, d, int64_t);
    case T_U32:
        return *CFIELD(a, d, uint32_t) == *CFIELD(b, d, uint32_t);
    case T_DOUBLE:
        return *CFIELD(a, d, double) == *CFIELD(b, d, double);
    case T_STRING:
    case T_HOSTPORT:
        return str_eq(*CFIELD(a, d, char *), *CFIELD(b, d, char *));
    case T_BIND:
        if (a->nbind != b->nbind)
            return false;
        for (size_t i = 0; i < a->nbind; i++)
            if (!str_eq(a->bind[i], b->bind[i]))
                return false;
        return true;
    case T_CONNECT:
        if (a->nconnect != b->nconnect)
            return false;
        for (size_t i = 0; i < a->nconnect; i++)
            if (!str_eq(a->connect[i].endpoint, b->connect[i].endpoint) ||
                !str_eq(a->connect[i].replay, b->connect[i].replay) ||
                !str_eq(a->connect[i].pod, b->connect[i].pod))
                return false;
        return true;
    case T_CIDR:
        return a->nallow == b->nallow &&
               (a->nallow == 0 || memcmp(a->allow, b->allow, a->nallow * sizeof(*a->allow)) == 0);
    case T_BOOL:
        return *CFIELD(a, d, bool) == *CFIELD(b, d, bool);
    case T_WEIGHT:
        return true; /* compared per tier in kvr_conf_apply_reload */
    }
    return true;
}

static void field_copy(const struct directive *d, struct kvr_conf *dst, const struct kvr_conf *src)
{
    switch (d->type) {
    case T_LEVEL:
    case T_FORMAT:
        *FIELD(dst, d, int) = *CFIELD(src, d, int);
        break;
    case T_DURATION:
    case T_SIZE:
    case T_I64:
        *FIELD(dst, d, int64_t) = *CFIELD(src, d, int64_t);
        break;
    case T_U32:
        *FIELD(dst, d, uint32_t) = *CFIELD(src, d, uint32_t);
        break;
    case T_DOUBLE:
        *FIELD(dst, d, double) = *CFIELD(src, d, double);
        break;
    case T_BOOL:
        *FIELD(dst, d, bool) = *CFIELD(src, d, bool);
        break;
    case T_STRING: { /* [http] admin_token: live owns its copy; on ENOMEM keep the old one */
        const char *v = *CFIELD(src, d, char *);
        char *dup = v != NULL ? strdup(v) : NULL;
        char **f = FIELD(dst, d, char *);
        if (v != NULL && dup == NULL)
            break;
        if (*f != NULL)
            explicit_bzero(*f, strlen(*f));
        free(*f);
        *f = dup;
        break;
    }
    default:
        break; /* only scalar types and strings are reloadable (weights: the caller) */
    }
}

struct model_list {
    struct kvr_err *changed;
    size_t *len;
    int n;
};

static void model_changed(void *arg, const char *name)
{
    struct model_list *ml = arg;
    char n[KVR_NAME_MAX + 8];
    snprintf(n, sizeof(n), "\"%s\"", name);
    list_add(ml->changed, ml->len, "model", n);
    ml->n++;
}

int kvr_conf_apply_reload(struct kvr_conf *live, const struct kvr_conf *fresh,
                          struct kvr_err *changed, struct kvr_err *ignored)
{
    size_t clen = 0, ilen = 0;
    int nchanged = 0;

    if (changed != NULL)
        changed->msg[0] = '\0';
    if (ignored != NULL)
        ignored->msg[0] = '\0';
    for (size_t i = 0; i < kvr_conf_ndirectives; i++) {
        const struct directive *d = &kvr_conf_directives[i];
        if (d->type == T_WEIGHT)
            continue;
        if (field_equal(d, live, fresh))
            continue;
        if (d->flags & F_RELOADABLE) {
            field_copy(d, live, fresh);
            list_add(changed, &clen, d->section, d->name);
            nchanged++;
        } else {
            list_add(ignored, &ilen, d->section, d->name);
        }
    }
    /* Weights: a tier changed when its effective weight differs (added, removed, new value). */
    for (size_t i = 0; i < fresh->nweights; i++) {
        const char *t = fresh->weights[i].name;
        bool found = false;
        for (size_t j = 0; j < live->nweights; j++) {
            if (strcmp(live->weights[j].name, t) == 0) {
                found = live->weights[j].weight == fresh->weights[i].weight;
                break;
            }
        }
        if (!found) {
            char n[48];
            snprintf(n, sizeof(n), "weight.%s", t);
            list_add(changed, &clen, "score", n);
            nchanged++;
        }
    }
    for (size_t j = 0; j < live->nweights; j++) {
        bool present = false;
        for (size_t i = 0; i < fresh->nweights; i++)
            present |= strcmp(live->weights[j].name, fresh->weights[i].name) == 0;
        if (!present) {
            char n[48];
            snprintf(n, sizeof(n), "weight.%s", live->weights[j].name);
            list_add(changed, &clen, "score", n);
            nchanged++;
        }
    }
    memcpy(live->weights, fresh->weights, sizeof(live->weights));
    live->nweights = fresh->nweights;
    struct model_list ml = {changed, &clen, 0};
    if (kvr_conf_models_reload(live, fresh, model_changed, &ml) < 0)
        list_add(ignored, &ilen, "model", "* (out of memory: the previous [model] sections stay)");
    nchanged += ml.n;
    return nchanged;
}
