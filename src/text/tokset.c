/* tokset.c — model name -> tokenizer, published to readers RCU style (see tokset.h).
 *
 * A table is immutable once published. Readers announce the epoch they start in
 * (seq_cst store, then the table load); a reload stores the new table, advances the epoch
 * and waits until every reader is quiescent or started after the advance, then frees what
 * the old table alone owned. Tokenizers that did not change are shared by both tables
 * (owned by whichever table is current; the old table frees only those it does not pass on).
 */
#include "text/tokset.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/log.h"
#include "core/metrics.h"
#include "text/tmpl.h"
#include "text/tok.h"

struct fid { /* identity of a file as reload compares it; all zero: absent */
    dev_t dev;
    ino_t ino;
    off_t size;
    int64_t mtime_ns;
};

/* What a model needs to turn text and chat messages into ids; immutable once loaded, shared
 * by consecutive tables while its files do not change. */
struct mtext {
    kvr_tok *tok;
    kvr_tmpl *chat, *chat_tools; /* NULL: none (chat_tools: use chat) */
    bool parts, parts_tools;     /* the template wants content parts (vLLM "auto") */
    char *special[4];            /* bos, eos, unk, pad token strings; NULL: not passed */
};

static const char *const special_names[4] = {"bos_token", "eos_token", "unk_token",
                                             "pad_token"};

static void mtext_free(struct mtext *mt)
{
    if (mt == NULL)
        return;
    kvr_tok_free(mt->tok);
    kvr_tmpl_free(mt->chat);
    kvr_tmpl_free(mt->chat_tools);
    for (int i = 0; i < 4; i++)
        free(mt->special[i]);
    free(mt);
}

struct entry {
    char *name;
    char *path, *tpl_path; /* the tokenizer, the chat_template override (NULL) */
    struct mtext *mt;
    struct fid json, cfg, tpl;
};

struct table {
    size_t n;
    struct entry e[]; /* sorted by name */
};

struct kvr_tokset_reader {
    struct kvr_tokset *ts;
    _Atomic uint64_t active; /* epoch the current call started in; 0 = quiescent */
    kvr_tok_scratch *scratch;
    kvr_tmpl_ctx *ctx; /* chat requests' values and renders */
    struct kvr_tokset_reader *next;
};

struct kvr_tokset {
    _Atomic(struct table *) table;
    _Atomic uint64_t epoch;
    pthread_mutex_t lock; /* readers list */
    struct kvr_tokset_reader *readers;
    kvr_tok_cache *cache; /* [tokenizer] prefix_cache; NULL = off */
    _Atomic uint64_t reloads, reload_failures, encodes, chats;
    _Atomic uint64_t limit_stops, limit_prechecks, bpe_bytes; /* the token limit */
};

static void fid_of(const char *path, struct fid *f)
{
    struct stat st;
    memset(f, 0, sizeof(*f));
    if (stat(path, &st) != 0)
        return;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->size = st.st_size;
    f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

/* The two files kvr_tok_load reads for path (a directory or a tokenizer.json). */
static void files_of(const char *path, struct fid *json, struct fid *cfg)
{
    char jp[4200], cp[4200];
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(jp, sizeof(jp), dir ? "%s/tokenizer.json" : "%s", path);
    const char *slash = strrchr(jp, '/');
    snprintf(cp, sizeof(cp), "%.*s/tokenizer_config.json", slash ? (int)(slash - jp) : 1,
             slash ? jp : ".");
    fid_of(jp, json);
    fid_of(cp, cfg);
}

static bool fid_eq(const struct fid *a, const struct fid *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *b = NULL;
    long n;
    if (f == NULL)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < (64l << 20) &&
        fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1)) != NULL) {
        if (fread(b, 1, (size_t)n, f) != (size_t)n) {
            free(b);
            b = NULL;
        } else {
            b[n] = '\0';
            *len = (size_t)n;
        }
    }
    fclose(f);
    return b;
}

/* The directory of the tokenizer files (path is a directory or a tokenizer.json). */
static void tok_dir(const char *path, char *dir, size_t cap)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(dir, cap, "%s", path);
        return;
    }
    const char *slash = strrchr(path, '/');
    snprintf(dir, cap, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
}

static int compile_tpl(const struct kvr_conf *c, const struct kvr_conf_model *m,
                       const char *file, const char *src, size_t len, kvr_tmpl **t, bool *parts,
                       struct kvr_err *err)
{
    char msg[400];
    int rc = kvr_tmpl_compile(src, len, t, msg, sizeof(msg));
    if (rc != 0)
        return kvr_err_set(err, rc, "%s:%d: [model \"%s\"] chat template %s: %s", c->path,
                           m->chat_template ? m->chat_template_line : m->tokenizer_line,
                           m->name, file, msg);
    *parts = kvr_tmpl_content_is_parts(*t) == 1;
    return 0;
}

/* The chat template (transformers' order: the [model] chat_template file, else
 * tokenizer_config.json's chat_template (a string, or named templates: "default" and
 * "tool_use"), else chat_template.jinja beside it) and the special token strings. */
static int load_chat(const struct kvr_conf *c, const struct kvr_conf_model *m,
                     struct mtext *mt, struct kvr_err *err)
{
    char dir[4096], p[4200];
    size_t len = 0;
    char *txt;
    cJSON *cfg = NULL;
    int rc = 0;

    tok_dir(m->tokenizer, dir, sizeof(dir));
    snprintf(p, sizeof(p), "%s/tokenizer_config.json", dir);
    if ((txt = slurp(p, &len)) != NULL) {
        cfg = cJSON_ParseWithLength(txt, len);
        free(txt);
    }
    for (int i = 0; cfg != NULL && i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, special_names[i]);
        if (cJSON_IsObject(v))
            v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(v) && (mt->special[i] = strdup(v->valuestring)) == NULL)
            rc = -ENOMEM;
    }
    if (rc == 0 && m->chat_template != NULL) {
        if ((txt = slurp(m->chat_template, &len)) == NULL)
            rc = kvr_err_set(err, -ENOENT, "%s:%d: [model \"%s\"] chat_template: cannot read "
                             "%s", c->path, m->chat_template_line, m->name, m->chat_template);
        else
            rc = compile_tpl(c, m, m->chat_template, txt, len, &mt->chat, &mt->parts, err);
        free(txt);
    } else if (rc == 0 && cfg != NULL && cJSON_GetObjectItemCaseSensitive(cfg, "chat_template")) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *x;
        if (cJSON_IsString(ct)) {
            rc = compile_tpl(c, m, p, ct->valuestring, strlen(ct->valuestring), &mt->chat,
                             &mt->parts, err);
        } else if (cJSON_IsArray(ct)) {
            cJSON_ArrayForEach(x, ct)
            {
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "name");
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(x, "template");
                if (rc != 0 || !cJSON_IsString(n) || !cJSON_IsString(t))
                    continue;
                if (strcmp(n->valuestring, "default") == 0 && mt->chat == NULL)
                    rc = compile_tpl(c, m, p, t->valuestring, strlen(t->valuestring),
                                     &mt->chat, &mt->parts, err);
                else if (strcmp(n->valuestring, "tool_use") == 0 && mt->chat_tools == NULL)
                    rc = compile_tpl(c, m, p, t->valuestring, strlen(t->valuestring),
                                     &mt->chat_tools, &mt->parts_tools, err);
            }
        }
    } else if (rc == 0) {
        snprintf(p, sizeof(p), "%s/chat_template.jinja", dir);
        if ((txt = slurp(p, &len)) != NULL)
            rc = compile_tpl(c, m, p, txt, len, &mt->chat, &mt->parts, err);
        free(txt);
    }
    cJSON_Delete(cfg);
    if (rc == -ENOMEM)
        kvr_err_set(err, rc, "out of memory");
    return rc;
}

static void tpl_fid(const struct kvr_conf_model *m, struct fid *f)
{
    char dir[4096], p[4200];
    if (m->chat_template != NULL) {
        fid_of(m->chat_template, f);
        return;
    }
    tok_dir(m->tokenizer, dir, sizeof(dir));
    snprintf(p, sizeof(p), "%s/chat_template.jinja", dir);
    fid_of(p, f);
}

static int load_one(const struct kvr_conf *c, const struct kvr_conf_model *m, struct entry *e,
                    struct kvr_err *err)
{
    char msg[600];
    int rc;
    memset(e, 0, sizeof(*e));
    files_of(m->tokenizer, &e->json, &e->cfg);
    tpl_fid(m, &e->tpl);
    if ((e->mt = calloc(1, sizeof(*e->mt))) == NULL)
        return kvr_err_set(err, -ENOMEM, "out of memory");
    rc = kvr_tok_load(m->tokenizer, &e->mt->tok, msg, sizeof(msg));
    if (rc != 0) {
        mtext_free(e->mt);
        e->mt = NULL;
        return kvr_err_set(err, rc, "%s:%d: [model \"%s\"] tokenizer: %s", c->path,
                           m->tokenizer_line, m->name, msg);
    }
    if ((rc = load_chat(c, m, e->mt, err)) != 0) {
        mtext_free(e->mt);
        e->mt = NULL;
        return rc;
    }
    e->name = strdup(m->name);
    e->path = strdup(m->tokenizer);
    e->tpl_path = m->chat_template ? strdup(m->chat_template) : NULL;
    if (e->name == NULL || e->path == NULL || (m->chat_template && e->tpl_path == NULL)) {
        mtext_free(e->mt);
        free(e->name);
        free(e->path);
        free(e->tpl_path);
        return kvr_err_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

/* Loads several tokenizers at once (one thread each, up to 8 at a time): a large vocabulary
 * takes about a second to load, and startup and reload wait for all of them. */
struct loadjob {
    const struct kvr_conf *c;
    const struct kvr_conf_model *m;
    struct entry *e;
    struct kvr_err err;
    int rc;
};

static void *load_thread(void *arg)
{
    struct loadjob *j = arg;
    j->rc = load_one(j->c, j->m, j->e, &j->err);
    return NULL;
}

static void load_all(struct loadjob *jobs, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        pthread_t th[8];
        bool started[8] = {false};
        size_t k = n - i < 8 ? n - i : 8;
        for (size_t x = 1; x < k; x++)
            started[x] = pthread_create(&th[x], NULL, load_thread, &jobs[i + x]) == 0;
        load_thread(&jobs[i]);
        for (size_t x = 1; x < k; x++) {
            if (started[x])
                pthread_join(th[x], NULL);
            else
                load_thread(&jobs[i + x]); /* no thread: here, in turn */
        }
    }
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static size_t count_models(const struct kvr_conf *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->nmodels; i++)
        n += c->models[i].tokenizer != NULL;
    return n;
}

/* Frees a table's names and paths; its tokenizers too when free_toks. */
static void table_free(struct table *t, bool free_toks)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n; i++) {
        if (free_toks)
            mtext_free(t->e[i].mt);
        free(t->e[i].name);
        free(t->e[i].path);
        free(t->e[i].tpl_path);
    }
    free(t);
}

static const struct entry *lookup(const struct table *t, const char *name)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(name, t->e[mid].name);
        if (c == 0)
            return &t->e[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

int kvr_tokset_create(const struct kvr_conf *c, struct kvr_tokset **out, struct kvr_err *err)
{
    size_t want = count_models(c), nj = 0;
    struct kvr_tokset *ts = calloc(1, sizeof(*ts));
    struct table *t = calloc(1, sizeof(*t) + want * sizeof(struct entry));
    struct loadjob *jobs = calloc(want + 1, sizeof(*jobs));
    int rc = 0;

    if (ts == NULL || t == NULL || jobs == NULL) {
        free(ts);
        free(t);
        free(jobs);
        return kvr_err_set(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < c->nmodels; i++)
        if (c->models[i].tokenizer != NULL)
            jobs[nj] = (struct loadjob){c, &c->models[i], &t->e[nj], {{0}}, 0}, nj++;
    load_all(jobs, nj);
    for (size_t i = 0; i < nj; i++) { /* the first failure in file order is reported */
        if (jobs[i].rc != 0 && rc == 0) {
            rc = jobs[i].rc;
            *err = jobs[i].err;
        }
    }
    for (size_t i = 0; i < nj; i++) /* entries that loaded, packed */
        if (jobs[i].rc == 0)
            t->e[t->n++] = t->e[i];
    free(jobs);
    if (rc != 0) {
        table_free(t, true);
        free(ts);
        return rc;
    }
    qsort(t->e, t->n, sizeof(t->e[0]), cmp_entry);
    if (t->n > 0 && c->prefix_cache > 0 &&
        kvr_tok_cache_new((size_t)c->prefix_cache, &ts->cache) != 0) {
        table_free(t, true);
        free(ts);
        return kvr_err_set(err, -ENOMEM, "out of memory (the tokenizer prefix cache)");
    }
    atomic_init(&ts->table, t);
    atomic_init(&ts->epoch, 1);
    pthread_mutex_init(&ts->lock, NULL);
    *out = ts;
    return 0;
}

int kvr_tokset_check(const struct kvr_conf *c, struct kvr_err *err)
{
    struct kvr_tokset *ts;
    int rc = kvr_tokset_create(c, &ts, err);
    if (rc == 0)
        kvr_tokset_destroy(ts);
    return rc;
}

/* A table entry sharing o's loaded model (names copied). */
static int copy_entry(struct entry *e, const struct entry *o)
{
    *e = *o;
    e->name = strdup(o->name);
    e->path = strdup(o->path);
    e->tpl_path = o->tpl_path ? strdup(o->tpl_path) : NULL;
    if (e->name == NULL || e->path == NULL || (o->tpl_path && e->tpl_path == NULL)) {
        free(e->name);
        free(e->path);
        free(e->tpl_path);
        return -ENOMEM;
    }
    return 0;
}

/* Waits until no reader can still be using a table published before epoch `after`. */
static void synchronize(struct kvr_tokset *ts, uint64_t after)
{
    pthread_mutex_lock(&ts->lock);
    for (struct kvr_tokset_reader *r = ts->readers; r != NULL; r = r->next) {
        for (unsigned spins = 0;; spins++) {
            uint64_t a = atomic_load(&r->active);
            if (a == 0 || a >= after)
                break;
            if (spins < 64)
                sched_yield();
            else
                nanosleep(&(struct timespec){0, 200000}, NULL); /* a call lasts < ms */
        }
    }
    pthread_mutex_unlock(&ts->lock);
}

int kvr_tokset_reload(struct kvr_tokset *ts, const struct kvr_conf *c, size_t *nloaded,
                      struct kvr_err *err)
{
    struct table *old = atomic_load(&ts->table);
    size_t want = count_models(c), loaded = 0;
    struct table *t = calloc(1, sizeof(*t) + want * sizeof(struct entry));
    bool *kept = calloc(old->n + 1, sizeof(bool)); /* old entries passed on */
    struct kvr_err first = {0};
    int frc = 0;

    if (nloaded != NULL)
        *nloaded = 0;
    if (t == NULL || kept == NULL) {
        free(t);
        free(kept);
        return kvr_err_set(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < c->nmodels; i++) {
        const struct kvr_conf_model *m = &c->models[i];
        if (m->tokenizer == NULL)
            continue;
        const struct entry *o = lookup(old, m->name);
        struct fid j, f, tp;
        files_of(m->tokenizer, &j, &f);
        tpl_fid(m, &tp);
        if (o != NULL && strcmp(o->path, m->tokenizer) == 0 && fid_eq(&o->json, &j) &&
            fid_eq(&o->cfg, &f) && fid_eq(&o->tpl, &tp) &&
            (o->tpl_path == NULL) == (m->chat_template == NULL) &&
            (o->tpl_path == NULL || strcmp(o->tpl_path, m->chat_template) == 0)) {
            struct entry *e = &t->e[t->n];
            if (copy_entry(e, o) != 0)
                goto keep_error;
            kept[o - old->e] = true;
            t->n++;
            continue;
        }
        struct kvr_err e1;
        int rc = load_one(c, m, &t->e[t->n], &e1);
        if (rc == 0) {
            t->n++;
            loaded++;
            kvr_log_info("tokenizer for model \"%s\" loaded from %s", m->name, m->tokenizer);
            continue;
        }
        kvr_log_error("reload: %s (%s)", e1.msg,
                      o != NULL ? "the model keeps its previous tokenizer"
                                : "the model has no tokenizer");
        if (frc == 0) {
            frc = -EINVAL;
            first = e1;
        }
        if (o != NULL) { /* keep the previous one */
            if (copy_entry(&t->e[t->n], o) != 0)
                goto keep_error;
            kept[o - old->e] = true;
            t->n++;
        }
    }
    qsort(t->e, t->n, sizeof(t->e[0]), cmp_entry);
    atomic_store(&ts->table, t);
    uint64_t after = atomic_fetch_add(&ts->epoch, 1) + 1;
    synchronize(ts, after);
    for (size_t i = 0; i < old->n; i++)
        if (!kept[i])
            mtext_free(old->e[i].mt);
    table_free(old, false);
    free(kept);
    atomic_fetch_add(&ts->reloads, 1);
    if (frc != 0)
        atomic_fetch_add(&ts->reload_failures, 1);
    if (nloaded != NULL)
        *nloaded = loaded;
    if (frc != 0)
        *err = first;
    return frc;

keep_error: /* out of memory midway: nothing published; free what this reload loaded */
    for (size_t i = 0; i < t->n; i++) {
        bool shared = false;
        for (size_t k = 0; k < old->n; k++)
            shared |= old->e[k].mt == t->e[i].mt;
        if (!shared)
            mtext_free(t->e[i].mt);
    }
    table_free(t, false);
    free(kept);
    atomic_fetch_add(&ts->reload_failures, 1);
    return kvr_err_set(err, -ENOMEM, "out of memory (the previous tokenizers stay)");
}

void kvr_tokset_destroy(struct kvr_tokset *ts)
{
    if (ts == NULL)
        return;
    table_free(atomic_load(&ts->table), true);
    kvr_tok_cache_free(ts->cache);
    pthread_mutex_destroy(&ts->lock);
    free(ts);
}

int kvr_tokset_reader_create(struct kvr_tokset *ts, struct kvr_tokset_reader **out)
{
    struct kvr_tokset_reader *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->scratch = kvr_tok_scratch_new()) == NULL ||
        kvr_tmpl_ctx_create(&r->ctx, NULL) != 0) {
        if (r != NULL)
            kvr_tok_scratch_free(r->scratch);
        free(r);
        return -ENOMEM;
    }
    r->ts = ts;
    atomic_init(&r->active, 0);
    pthread_mutex_lock(&ts->lock);
    r->next = ts->readers;
    ts->readers = r;
    pthread_mutex_unlock(&ts->lock);
    *out = r;
    return 0;
}

void kvr_tokset_reader_destroy(struct kvr_tokset_reader *r)
{
    if (r == NULL)
        return;
    struct kvr_tokset *ts = r->ts;
    pthread_mutex_lock(&ts->lock);
    for (struct kvr_tokset_reader **p = &ts->readers; *p != NULL; p = &(*p)->next) {
        if (*p == r) {
            *p = r->next;
            break;
        }
    }
    pthread_mutex_unlock(&ts->lock);
    kvr_tok_scratch_free(r->scratch);
    kvr_tmpl_ctx_destroy(r->ctx);
    free(r);
}

void kvr_tokset_reader_set_limit(struct kvr_tokset_reader *r, size_t max_ids)
{
    kvr_tok_scratch_set_limit(r->scratch, max_ids);
}

/* Text to ids through the prefix cache, under the reader's token limit (counted). */
static int encode(struct kvr_tokset *ts, struct kvr_tokset_reader *r, const kvr_tok *tok,
                  const char *text, size_t len, bool add_special, const uint32_t **ids)
{
    uint64_t before = kvr_tok_scratch_bpe_bytes(r->scratch);
    int rc;

    if (kvr_tok_over_limit(tok, r->scratch, len)) {
        atomic_fetch_add_explicit(&ts->limit_prechecks, 1, memory_order_relaxed);
        rc = -EMSGSIZE;
    } else {
        rc = kvr_tok_encode_cached(tok, ts->cache, r->scratch, text, len, add_special, ids);
    }
    if (rc == -EMSGSIZE)
        atomic_fetch_add_explicit(&ts->limit_stops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&ts->bpe_bytes, kvr_tok_scratch_bpe_bytes(r->scratch) - before,
                              memory_order_relaxed);
    return rc;
}

int kvr_tokset_encode(struct kvr_tokset_reader *r, const char *model, const char *text,
                      size_t len, bool add_special, const uint32_t **ids)
{
    struct kvr_tokset *ts = r->ts;
    int rc;

    atomic_store(&r->active, atomic_load(&ts->epoch));
    const struct table *t = atomic_load(&ts->table);
    const struct entry *e = lookup(t, model);
    if (e == NULL)
        rc = -ENOENT;
    else
        rc = encode(ts, r, e->mt->tok, text, len, add_special, ids);
    atomic_store_explicit(&r->active, 0, memory_order_release);
    if (rc >= 0)
        atomic_fetch_add_explicit(&ts->encodes, 1, memory_order_relaxed);
    return rc;
}

kvr_tmpl_ctx *kvr_tokset_reader_ctx(struct kvr_tokset_reader *r)
{
    return r->ctx;
}

static int render(const struct mtext *mt, kvr_tmpl_ctx *ctx, const struct kvr_tokset_chat *c,
                  const char **out, size_t *outlen, char *err, size_t errlen)
{
    bool tools = c->tools != NULL && mt->chat_tools != NULL;
    const kvr_tmpl *t = tools ? mt->chat_tools : mt->chat;
    bool parts = tools ? mt->parts_tools : mt->parts;
    kvr_tmpl_val *vars = kvr_tmpl_dict(ctx), *none = kvr_tmpl_none(ctx);
    kvr_tmpl_val *agp = kvr_tmpl_bool(ctx, c->add_generation_prompt);
    int rc;

    if (vars == NULL || none == NULL || agp == NULL)
        return -ENOMEM;
    /* transformers: render(messages=, tools=, documents=, add_generation_prompt=,
     * **special_tokens_map, **chat_template_kwargs) */
    if (kvr_tmpl_dict_set(ctx, vars, "messages", 8, parts ? c->messages_parts : c->messages_str) ||
        kvr_tmpl_dict_set(ctx, vars, "tools", 5, c->tools ? c->tools : none) ||
        kvr_tmpl_dict_set(ctx, vars, "documents", 9, c->documents ? c->documents : none) ||
        kvr_tmpl_dict_set(ctx, vars, "add_generation_prompt", 21, agp))
        return -ENOMEM;
    for (int i = 0; i < 4; i++) {
        kvr_tmpl_val *v;
        if (mt->special[i] == NULL)
            continue;
        if ((v = kvr_tmpl_str(ctx, mt->special[i], strlen(mt->special[i]))) == NULL ||
            kvr_tmpl_dict_set(ctx, vars, special_names[i], strlen(special_names[i]), v))
            return -ENOMEM;
    }
    if (c->kwargs != NULL && (rc = kvr_tmpl_dict_merge(ctx, vars, c->kwargs)) != 0)
        return rc;
    return kvr_tmpl_render(t, ctx, vars, c->max_render_bytes, out, outlen, err, errlen);
}

/* transformers' continue_final_message: the output up to the end of the final message's
 * (stripped) text, which must occur in it. */
static int cut_final(const char *out, size_t *outlen, const char *ft, size_t fl, char *err,
                     size_t errlen)
{
    while (fl > 0 && (*ft == ' ' || (*ft >= '\t' && *ft <= '\r')))
        ft++, fl--;
    while (fl > 0 && (ft[fl - 1] == ' ' || (ft[fl - 1] >= '\t' && ft[fl - 1] <= '\r')))
        fl--;
    for (size_t i = *outlen >= fl ? *outlen - fl + 1 : 0; i-- > 0;) {
        if (memcmp(out + i, ft, fl) == 0) {
            *outlen = i + fl;
            return 0;
        }
    }
    snprintf(err, errlen, "continue_final_message: the final message's content is not in the "
                          "rendered chat");
    return -EINVAL;
}

int kvr_tokset_chat(struct kvr_tokset_reader *r, const char *model,
                    const struct kvr_tokset_chat *c, const uint32_t **ids, char *err,
                    size_t errlen)
{
    struct kvr_tokset *ts = r->ts;
    const char *out;
    size_t outlen;
    int rc;

    err[0] = '\0';
    atomic_store(&r->active, atomic_load(&ts->epoch));
    const struct entry *e = lookup(atomic_load(&ts->table), model);
    if (e == NULL)
        rc = -ENOENT;
    else if (e->mt->chat == NULL)
        rc = -ENOTSUP;
    else if ((rc = render(e->mt, r->ctx, c, &out, &outlen, err, errlen)) == 0 &&
             (!c->continue_final_message ||
              (rc = cut_final(out, &outlen, c->final_text, c->final_len, err, errlen)) == 0))
        rc = encode(ts, r, e->mt->tok, out, outlen, c->add_special_tokens, ids);
    atomic_store_explicit(&r->active, 0, memory_order_release);
    if (rc >= 0)
        atomic_fetch_add_explicit(&ts->chats, 1, memory_order_relaxed);
    return rc;
}

void kvr_tokset_metrics(struct kvr_tokset *ts, struct kvr_buf *out)
{
    kvr_metrics_gauge(out, "tokenizer_models", "Models with a tokenizer loaded", NULL,
                      (double)atomic_load(&ts->table)->n);
    kvr_metrics_counter(out, "tokenizer_reloads_total", "Reloads of the tokenizer set (SIGHUP)",
                        NULL, atomic_load(&ts->reloads));
    kvr_metrics_counter(out, "tokenizer_reload_failures_total",
                        "Reloads where a tokenizer could not be loaded (the model kept its "
                        "previous one)", NULL, atomic_load(&ts->reload_failures));
    kvr_metrics_counter(out, "tokenizer_encodes_total", "Prompts tokenized", NULL,
                        atomic_load(&ts->encodes));
    kvr_metrics_counter(out, "tokenizer_chats_total",
                        "Chat requests rendered with the model's chat template and tokenized",
                        NULL, atomic_load(&ts->chats));
    kvr_metrics_counter(out, "tokenizer_limit_stops_total",
                        "Texts refused at [http] max_query_tokens as soon as known, without "
                        "tokenizing the rest", NULL, atomic_load(&ts->limit_stops));
    kvr_metrics_counter(out, "tokenizer_limit_prechecks_total",
                        "Of those, texts refused by their length alone, before tokenizing "
                        "(tokenizers with a sound bound only)", NULL,
                        atomic_load(&ts->limit_prechecks));
    kvr_metrics_counter(out, "tokenizer_bpe_bytes_total",
                        "Text bytes run through BPE (pre-tokens; word-cache hits included)",
                        NULL, atomic_load(&ts->bpe_bytes));
    if (ts->cache == NULL)
        return;
    struct kvr_tok_cache_stats st;
    kvr_tok_cache_stats(ts->cache, &st);
    kvr_metrics_counter(out, "tokenizer_prefix_cache_hits_total",
                        "Prompts (of 512 bytes or more) that resumed from a cached beginning",
                        NULL, st.hits);
    kvr_metrics_counter(out, "tokenizer_prefix_cache_misses_total",
                        "Prompts (of 512 bytes or more) with no cached beginning", NULL,
                        st.misses);
    kvr_metrics_counter(out, "tokenizer_prefix_cache_saved_bytes_total",
                        "Prompt bytes not tokenized again thanks to the prefix cache", NULL,
                        st.saved_bytes);
    kvr_metrics_counter(out, "tokenizer_prefix_cache_inserts_total",
                        "Prompts added to the prefix cache", NULL, st.inserts);
    kvr_metrics_counter(out, "tokenizer_prefix_cache_evictions_total",
                        "Prompts evicted from the prefix cache ([tokenizer] prefix_cache)",
                        NULL, st.evictions);
    kvr_metrics_gauge(out, "tokenizer_prefix_cache_bytes", "Bytes held by the prefix cache",
                      NULL, (double)st.bytes);
    kvr_metrics_gauge(out, "tokenizer_prefix_cache_entries", "Prompts held by the prefix cache",
                      NULL, (double)st.entries);
}
