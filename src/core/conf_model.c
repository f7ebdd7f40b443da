/* conf_model.c — the per-model sections of the configuration: [model "NAME"].
 *
 * Why a file of its own: model sections are named (the name is the model as engines spell
 * it in their topic, e.g. "Qwen/Qwen3-8B"), repeatable with distinct names, and reloadable as
 * a whole list; the directive table of conf.c describes fixed sections and cannot say that.
 * conf.c hands it the header text and the keys of these sections.
 *
 * Keys: tokenizer = PATH (a directory holding tokenizer.json, or a tokenizer.json file). A
 * relative PATH is taken relative to the directory of the configuration file, so a config
 * and its tokenizers can move together. The files are not read here (conf stays pure
 * parsing): kvrouterd -t and startup load them (tokset). chat_template = PATH likewise.
 * Approximate mode (engines without KV events, route.h): approximate = BOOL,
 * approximate_pods = POD[, POD...] (commas or blanks between names), block_size = N.
 */
#include "core/conf.h"
#include "core/conf_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/base.h"

int kvr_conf_model_header(const char *hdr, size_t n, char *name, size_t cap, char *msg,
                          size_t msgcap)
{
    size_t i = 5, s, e;

    /* hdr[0..n) is what is between '[' and ']'; it starts with "model" */
    while (i < n && (hdr[i] == ' ' || hdr[i] == '\t'))
        i++;
    if (i == 5 || i >= n || hdr[i] != '"') {
        snprintf(msg, msgcap, "expected [model \"NAME\"] (the model as engines name it in "
                              "their topic, in double quotes)");
        return -EINVAL;
    }
    s = ++i;
    while (i < n && hdr[i] != '"')
        i++;
    if (i >= n) {
        snprintf(msg, msgcap, "missing closing '\"' in [model \"NAME\"]");
        return -EINVAL;
    }
    e = i++;
    while (i < n && (hdr[i] == ' ' || hdr[i] == '\t'))
        i++;
    if (i != n) {
        snprintf(msg, msgcap, "unexpected text after the model name in [model \"NAME\"]");
        return -EINVAL;
    }
    if (e == s) {
        snprintf(msg, msgcap, "empty model name in [model \"\"]");
        return -EINVAL;
    }
    if (e - s > KVR_NAME_MAX || e - s >= cap) {
        snprintf(msg, msgcap, "model name longer than %d bytes", KVR_NAME_MAX);
        return -EINVAL;
    }
    for (size_t k = s; k < e; k++) {
        if ((unsigned char)hdr[k] < 0x20 || hdr[k] == 0x7f) {
            snprintf(msg, msgcap, "control character in the model name");
            return -EINVAL;
        }
    }
    memcpy(name, hdr + s, e - s);
    name[e - s] = '\0';
    return 0;
}

int kvr_conf_model_add(struct kvr_conf *c, const char *name, int line, char *msg, size_t msgcap)
{
    struct kvr_conf_model *m;

    for (size_t i = 0; i < c->nmodels; i++) {
        if (strcmp(c->models[i].name, name) == 0) {
            snprintf(msg, msgcap, "[model \"%.200s\"] is given twice (first on line %d)", name,
                     c->models[i].line);
            return -EINVAL;
        }
    }
    m = realloc(c->models, (c->nmodels + 1) * sizeof(*m));
    if (m == NULL)
        goto nomem;
    c->models = m;
    m = &c->models[c->nmodels];
    memset(m, 0, sizeof(*m));
    m->name = strdup(name);
    if (m->name == NULL)
        goto nomem;
    m->line = line;
    c->nmodels++;
    return 0;
nomem:
    snprintf(msg, msgcap, "out of memory");
    return -ENOMEM;
}

/* PATH relative to the directory of the configuration file (absolute ones as they are). */
static char *resolve(const char *conf_path, const char *v)
{
    const char *slash = conf_path ? strrchr(conf_path, '/') : NULL;
    size_t dl, vl = strlen(v);
    char *p;

    if (v[0] == '/' || slash == NULL)
        return strdup(v);
    dl = (size_t)(slash - conf_path) + 1;
    p = malloc(dl + vl + 1);
    if (p == NULL)
        return NULL;
    memcpy(p, conf_path, dl);
    memcpy(p + dl, v, vl + 1);
    return p;
}

#define MAX_APPROX_PODS 4096 /* a route query's candidate limit */

static bool pod_sep(char ch)
{
    return ch == ',' || ch == ' ' || ch == '\t';
}

/* A pod list (approximate_pods, prefill_pods, decode_pods): names separated by commas or
 * blanks; each 1..KVR_NAME_MAX bytes without control characters, given once. */
static int set_pods(struct kvr_conf_model *m, const char *key, const char *v, char ***list,
                    size_t *nlist, char *msg, size_t msgcap)
{
    const char *p = v;

    while (*p) {
        while (pod_sep(*p))
            p++;
        if (*p == '\0')
            break;
        const char *s = p;
        while (*p && !pod_sep(*p))
            p++;
        size_t n = (size_t)(p - s);
        if (n > KVR_NAME_MAX) {
            snprintf(msg, msgcap, "[model \"%.200s\"] %s: a pod name longer than %d bytes",
                     m->name, key, KVR_NAME_MAX);
            return -EINVAL;
        }
        for (size_t k = 0; k < n; k++)
            if ((unsigned char)s[k] < 0x20 || s[k] == 0x7f) {
                snprintf(msg, msgcap, "[model \"%.200s\"] %s: control character in a pod name",
                         m->name, key);
                return -EINVAL;
            }
        for (size_t k = 0; k < *nlist; k++)
            if (strlen((*list)[k]) == n && memcmp((*list)[k], s, n) == 0) {
                snprintf(msg, msgcap, "[model \"%.200s\"] %s: pod '%.*s' is listed twice",
                         m->name, key, (int)(n > 200 ? 200 : n), s);
                return -EINVAL;
            }
        if (*nlist == MAX_APPROX_PODS) {
            snprintf(msg, msgcap, "[model \"%.200s\"] %s: more than %d pods", m->name, key,
                     MAX_APPROX_PODS);
            return -EINVAL;
        }
        char **grown = realloc(*list, (*nlist + 1) * sizeof(*grown));
        if (grown == NULL)
            goto nomem;
        *list = grown;
        if ((grown[*nlist] = strndup(s, n)) == NULL)
            goto nomem;
        (*nlist)++;
    }
    if (*nlist == 0) {
        snprintf(msg, msgcap, "[model \"%.200s\"] %s: expected pod names separated by commas",
                 m->name, key);
        return -EINVAL;
    }
    return 0;
nomem:
    snprintf(msg, msgcap, "out of memory");
    return -ENOMEM;
}

static int dup_key(const struct kvr_conf_model *m, const char *key, int first, char *msg,
                   size_t msgcap)
{
    snprintf(msg, msgcap, "duplicate key '%s' in [model \"%.200s\"] (first set on line %d)", key,
             m->name, first);
    return -EINVAL;
}

int kvr_conf_model_key(struct kvr_conf *c, const char *key, const char *value, int line,
                       char *msg, size_t msgcap)
{
    struct kvr_conf_model *m = &c->models[c->nmodels - 1];

    if (strcasecmp(key, "approximate") == 0) {
        if (m->approximate_line != 0)
            return dup_key(m, "approximate", m->approximate_line, msg, msgcap);
        if (kvr_conf_parse_bool(value, &m->approximate) != 0) {
            snprintf(msg, msgcap, "[model \"%.200s\"] approximate: expected on or off (also "
                                  "true/false, yes/no, 1/0)", m->name);
            return -EINVAL;
        }
        m->approximate_line = line;
        return 0;
    }
    if (strcasecmp(key, "approximate_pods") == 0) {
        if (m->approximate_pods_line != 0)
            return dup_key(m, "approximate_pods", m->approximate_pods_line, msg, msgcap);
        m->approximate_pods_line = line;
        return set_pods(m, "approximate_pods", value, &m->approximate_pods,
                        &m->napproximate_pods, msg, msgcap);
    }
    if (strcasecmp(key, "prefill_pods") == 0 || strcasecmp(key, "decode_pods") == 0) {
        bool pre = strcasecmp(key, "prefill_pods") == 0;
        int *seen = pre ? &m->prefill_pods_line : &m->decode_pods_line;
        if (*seen != 0)
            return dup_key(m, pre ? "prefill_pods" : "decode_pods", *seen, msg, msgcap);
        *seen = line;
        int rc = set_pods(m, pre ? "prefill_pods" : "decode_pods", value,
                          pre ? &m->prefill_pods : &m->decode_pods,
                          pre ? &m->nprefill_pods : &m->ndecode_pods, msg, msgcap);
        for (size_t i = 0; rc == 0 && i < m->nprefill_pods; i++)
            for (size_t k = 0; k < m->ndecode_pods; k++)
                if (strcmp(m->prefill_pods[i], m->decode_pods[k]) == 0) {
                    snprintf(msg, msgcap, "[model \"%.200s\"] pod '%.200s' is in both "
                                          "prefill_pods and decode_pods (a pod that does both "
                                          "is listed in neither)", m->name, m->prefill_pods[i]);
                    return -EINVAL;
                }
        return rc;
    }
    if (strcasecmp(key, "block_size") == 0) {
        uint64_t v;
        if (m->block_size_line != 0)
            return dup_key(m, "block_size", m->block_size_line, msg, msgcap);
        int nd = kvr_conf_parse_digits(value, &v);
        if (nd <= 0 || value[nd] != '\0' || v < 1 || v > 65536) {
            snprintf(msg, msgcap, "[model \"%.200s\"] block_size: expected a number of tokens "
                                  "(1..65536)", m->name);
            return -EINVAL;
        }
        m->block_size = (uint32_t)v;
        m->block_size_line = line;
        return 0;
    }

    if (strcasecmp(key, "tokenizer") == 0) {
        if (m->tokenizer != NULL) {
            snprintf(msg, msgcap, "duplicate key 'tokenizer' in [model \"%.200s\"] (first set "
                                  "on line %d)", m->name, m->tokenizer_line);
            return -EINVAL;
        }
        if (value[0] == '\0' || strlen(value) > 4095) {
            snprintf(msg, msgcap, "[model \"%.200s\"] tokenizer: expected a path (a directory "
                                  "holding tokenizer.json, or a tokenizer.json file)", m->name);
            return -EINVAL;
        }
        m->tokenizer = resolve(c->path, value);
        if (m->tokenizer == NULL) {
            snprintf(msg, msgcap, "out of memory");
            return -ENOMEM;
        }
        m->tokenizer_line = line;
        return 0;
    }
    if (strcasecmp(key, "chat_template") == 0) {
        if (m->chat_template != NULL) {
            snprintf(msg, msgcap, "duplicate key 'chat_template' in [model \"%.200s\"] (first "
                                  "set on line %d)", m->name, m->chat_template_line);
            return -EINVAL;
        }
        if (value[0] == '\0' || strlen(value) > 4095) {
            snprintf(msg, msgcap, "[model \"%.200s\"] chat_template: expected the path of a "
                                  "Jinja template file", m->name);
            return -EINVAL;
        }
        if ((m->chat_template = resolve(c->path, value)) == NULL) {
            snprintf(msg, msgcap, "out of memory");
            return -ENOMEM;
        }
        m->chat_template_line = line;
        return 0;
    }
    snprintf(msg, msgcap, "unknown key '%.100s' in section [model \"%.200s\"] (expected "
                          "tokenizer, chat_template, approximate, approximate_pods, "
                          "prefill_pods, decode_pods or block_size)", key, m->name);
    return -EINVAL;
}

static void list_free(char **list, size_t n)
{
    for (size_t k = 0; k < n; k++)
        free(list[k]);
    free(list);
}

static void model_free(struct kvr_conf_model *m)
{
    free(m->name);
    free(m->tokenizer);
    free(m->chat_template);
    list_free(m->approximate_pods, m->napproximate_pods);
    list_free(m->prefill_pods, m->nprefill_pods);
    list_free(m->decode_pods, m->ndecode_pods);
}

static bool same_list(char *const *a, size_t na, char *const *b, size_t nb)
{
    if (na != nb)
        return false;
    for (size_t k = 0; k < na; k++)
        if (strcmp(a[k], b[k]) != 0)
            return false;
    return true;
}

/* A copy of the list f[0..n) into *out: false when out of memory (*out holds *nout). */
static bool list_copy(char ***out, size_t *nout, char *const *f, size_t n)
{
    *out = NULL;
    *nout = 0;
    if (n == 0)
        return true;
    if ((*out = calloc(n, sizeof(char *))) == NULL)
        return false;
    for (size_t k = 0; k < n; k++) {
        if (((*out)[k] = strdup(f[k])) == NULL)
            return false;
        *nout = k + 1;
    }
    return true;
}

void kvr_conf_models_free(struct kvr_conf *c)
{
    for (size_t i = 0; i < c->nmodels; i++)
        model_free(&c->models[i]);
    free(c->models);
    c->models = NULL;
    c->nmodels = 0;
}

static const struct kvr_conf_model *find(const struct kvr_conf *c, const char *name)
{
    for (size_t i = 0; i < c->nmodels; i++)
        if (strcmp(c->models[i].name, name) == 0)
            return &c->models[i];
    return NULL;
}

static bool same_str(const char *a, const char *b)
{
    return (a == NULL) == (b == NULL) && (a == NULL || strcmp(a, b) == 0);
}

static bool same(const struct kvr_conf_model *a, const struct kvr_conf_model *b)
{
    if (a->approximate != b->approximate || a->block_size != b->block_size ||
        !same_list(a->approximate_pods, a->napproximate_pods, b->approximate_pods,
                   b->napproximate_pods) ||
        !same_list(a->prefill_pods, a->nprefill_pods, b->prefill_pods, b->nprefill_pods) ||
        !same_list(a->decode_pods, a->ndecode_pods, b->decode_pods, b->ndecode_pods))
        return false;
    return same_str(a->tokenizer, b->tokenizer) && same_str(a->chat_template, b->chat_template);
}

/* A deep copy of f into *m (zeroed first): 0 or -ENOMEM (*m freed). */
static int model_copy(struct kvr_conf_model *m, const struct kvr_conf_model *f)
{
    *m = *f;
    m->name = strdup(f->name);
    m->tokenizer = f->tokenizer ? strdup(f->tokenizer) : NULL;
    m->chat_template = f->chat_template ? strdup(f->chat_template) : NULL;
    bool bad = m->name == NULL || (f->tokenizer && m->tokenizer == NULL) ||
               (f->chat_template && m->chat_template == NULL);
    bad |= !list_copy(&m->approximate_pods, &m->napproximate_pods, f->approximate_pods,
                      f->napproximate_pods);
    bad |= !list_copy(&m->prefill_pods, &m->nprefill_pods, f->prefill_pods, f->nprefill_pods);
    bad |= !list_copy(&m->decode_pods, &m->ndecode_pods, f->decode_pods, f->ndecode_pods);
    if (bad) {
        model_free(m);
        return -ENOMEM;
    }
    return 0;
}

int kvr_conf_models_reload(struct kvr_conf *live, const struct kvr_conf *fresh,
                           void (*changed)(void *arg, const char *name), void *arg)
{
    struct kvr_conf_model *copy = NULL;
    int n = 0;

    if (fresh->nmodels > 0 && (copy = calloc(fresh->nmodels, sizeof(*copy))) == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < fresh->nmodels; i++) {
        if (model_copy(&copy[i], &fresh->models[i]) != 0) {
            for (size_t j = 0; j < i; j++)
                model_free(&copy[j]);
            free(copy);
            return -ENOMEM; /* the live list stays */
        }
    }
    for (size_t i = 0; i < fresh->nmodels; i++) {
        const struct kvr_conf_model *o = find(live, fresh->models[i].name);
        if (o == NULL || !same(o, &fresh->models[i])) {
            changed(arg, fresh->models[i].name);
            n++;
        }
    }
    for (size_t i = 0; i < live->nmodels; i++) {
        if (find(fresh, live->models[i].name) == NULL) {
            changed(arg, live->models[i].name);
            n++;
        }
    }
    kvr_conf_models_free(live);
    live->models = copy;
    live->nmodels = fresh->nmodels;
    return n;
}
