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
 * parsing): kvrouterd -t and startup load them (tokset).
 */
#include "conf.h"
#include "conf_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base.h"

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

int kvr_conf_model_key(struct kvr_conf *c, const char *key, const char *value, int line,
                       char *msg, size_t msgcap)
{
    struct kvr_conf_model *m = &c->models[c->nmodels - 1];

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
                          "tokenizer or chat_template)", key, m->name);
    return -EINVAL;
}

void kvr_conf_models_free(struct kvr_conf *c)
{
    for (size_t i = 0; i < c->nmodels; i++) {
        free(c->models[i].name);
        free(c->models[i].tokenizer);
        free(c->models[i].chat_template);
    }
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
    return same_str(a->tokenizer, b->tokenizer) && same_str(a->chat_template, b->chat_template);
}

int kvr_conf_models_reload(struct kvr_conf *live, const struct kvr_conf *fresh,
                           void (*changed)(void *arg, const char *name), void *arg)
{
    struct kvr_conf_model *copy = NULL;
    int n = 0;

    if (fresh->nmodels > 0 && (copy = calloc(fresh->nmodels, sizeof(*copy))) == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < fresh->nmodels; i++) {
        const struct kvr_conf_model *f = &fresh->models[i];
        copy[i] = *f;
        copy[i].name = strdup(f->name);
        copy[i].tokenizer = f->tokenizer ? strdup(f->tokenizer) : NULL;
        copy[i].chat_template = f->chat_template ? strdup(f->chat_template) : NULL;
        if (copy[i].name == NULL || (f->tokenizer && copy[i].tokenizer == NULL) ||
            (f->chat_template && copy[i].chat_template == NULL)) {
            for (size_t j = 0; j <= i; j++) {
                free(copy[j].name);
                free(copy[j].tokenizer);
                free(copy[j].chat_template);
            }
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
