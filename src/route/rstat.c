/* rstat.c — decision metrics as sums (see rstat.h for what they answer and their bounds).
 *
 * Tables, all under mu: the (endpoint, model, policy) rows (a small array scanned linearly:
 * at most KVR_RSTAT_MAX_MODELS models × a handful of policies), the branch counts, and the
 * workers (a chained hash by pod and rank, KVR_RSTAT_MAX_WORKERS at most). Expiry of idle
 * workers runs when metrics are rendered, so a scrape never shows a worker idle past ttl.
 * Latency histograms are kvr_hist (lock-free) and need no lock.
 */
#include "route/rstat.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "core/log.h"
#include "core/metrics.h"

#define NPOL (KVR_ROUTE_NPOLICIES + 1) /* route's policies, then "none" for /v1/score */
#define POL_NONE KVR_ROUTE_NPOLICIES
#define NROWS (KVR_RSTAT_MAX_MODELS + 1) /* + "_other" */
#define WBUCKETS 1024

static const char *const branch_names[KVR_RSTAT_NBRANCHES] = {"cache", "load", "busy",
                                                              "fallback", "no_candidate"};
static const char *const input_names[KVR_RSTAT_NINPUTS] = {"tokens", "prompt", "chat"};
static const char *const endpoint_names[KVR_RSTAT_NENDPOINTS] = {"route", "score"};

struct sums {
    uint64_t decisions, query_blocks, chosen_matched, best_matched;
};

struct model_row {
    char *name;                                 /* "_other" for the overflow row */
    struct sums s[KVR_RSTAT_NENDPOINTS][NPOL];
};

struct worker {
    char *pod;
    uint32_t rank;
    uint64_t decisions, matched_blocks, matched_tokens, prompt_tokens;
    int64_t last_ms;
    struct worker *next;
};

struct kvr_rstat {
    pthread_mutex_t mu;
    int64_t ttl_ms;
    struct model_row rows[NROWS]; /* rows[0..nrows-1] named; rows[KVR_RSTAT_MAX_MODELS] other */
    size_t nrows;
    uint64_t branches[KVR_ROUTE_NPOLICIES][KVR_RSTAT_NBRANCHES];
    struct worker *w[WBUCKETS];
    size_t nworkers;
    uint64_t worker_overflow, workers_expired;
    struct kvr_hist lat[KVR_RSTAT_NENDPOINTS][KVR_RSTAT_NINPUTS]; /* lock-free */
    struct kvr_hist tok[KVR_RSTAT_NINPUTS];  /* tokenizing (prompt, chat); lock-free */
};

const char *kvr_rstat_branch_name(int branch)
{
    return branch >= 0 && branch < KVR_RSTAT_NBRANCHES ? branch_names[branch] : "?";
}

const char *kvr_rstat_input_name(int input)
{
    return input >= 0 && input < KVR_RSTAT_NINPUTS ? input_names[input] : "?";
}

int kvr_rstat_create(int64_t ttl_ms, struct kvr_rstat **out)
{
    struct kvr_rstat *s = calloc(1, sizeof(*s));

    if (s == NULL)
        return -ENOMEM;
    if ((s->rows[KVR_RSTAT_MAX_MODELS].name = strdup("_other")) == NULL) {
        free(s);
        return -ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->ttl_ms = ttl_ms;
    for (int e = 0; e < KVR_RSTAT_NENDPOINTS; e++)
        for (int i = 0; i < KVR_RSTAT_NINPUTS; i++)
            kvr_hist_init_exp(&s->lat[e][i], 25e-6, 2, 18); /* 25 µs .. 3.3 s */
    for (int i = 0; i < KVR_RSTAT_NINPUTS; i++)
        kvr_hist_init_exp(&s->tok[i], 25e-6, 2, 18);
    *out = s;
    return 0;
}

void kvr_rstat_destroy(struct kvr_rstat *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < NROWS; i++)
        free(s->rows[i].name);
    for (size_t b = 0; b < WBUCKETS; b++) {
        for (struct worker *w = s->w[b], *n; w != NULL; w = n) {
            n = w->next;
            free(w->pod);
            free(w);
        }
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

uint32_t kvr_rstat_best_matched(const struct kvr_route_cand *c, size_t n)
{
    uint32_t best = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].matched_blocks > best)
            best = c[i].matched_blocks;
    return best;
}

int kvr_rstat_branch(const struct kvr_route_cand *c, size_t n, size_t chosen, int policy,
                     bool rejected)
{
    size_t nbusy = 0;
    uint32_t best;

    if (n == 0)
        return KVR_RSTAT_NO_CANDIDATE;
    for (size_t i = 0; i < n; i++)
        nbusy += c[i].busy;
    if (rejected || (policy == KVR_ROUTE_TTFT && nbusy == n))
        return KVR_RSTAT_BUSY;
    best = kvr_rstat_best_matched(c, n);
    if (best == 0)
        return KVR_RSTAT_FALLBACK;
    return chosen < n && c[chosen].matched_blocks == best ? KVR_RSTAT_CACHE : KVR_RSTAT_LOAD;
}

/* The row of model (mu held): an existing one, a new one while there is room, else other. */
static struct model_row *row_of(struct kvr_rstat *s, const char *model)
{
    if (model == NULL)
        return &s->rows[KVR_RSTAT_MAX_MODELS];
    for (size_t i = 0; i < s->nrows; i++)
        if (strcmp(s->rows[i].name, model) == 0)
            return &s->rows[i];
    if (s->nrows < KVR_RSTAT_MAX_MODELS && (s->rows[s->nrows].name = strdup(model)) != NULL)
        return &s->rows[s->nrows++];
    return &s->rows[KVR_RSTAT_MAX_MODELS];
}

static size_t wbucket(const char *pod, uint32_t rank)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)pod; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)((h ^ rank) * 0x9e3779b97f4a7c15ull >> 54) & (WBUCKETS - 1);
}

/* The worker's entry (mu held), created while under the cap; NULL past it or out of memory. */
static struct worker *worker_of(struct kvr_rstat *s, const char *pod, uint32_t rank)
{
    size_t b = wbucket(pod, rank);
    for (struct worker *w = s->w[b]; w != NULL; w = w->next)
        if (w->rank == rank && strcmp(w->pod, pod) == 0)
            return w;
    if (s->nworkers >= KVR_RSTAT_MAX_WORKERS)
        return NULL;
    struct worker *w = calloc(1, sizeof(*w));
    if (w == NULL || (w->pod = strdup(pod)) == NULL) {
        free(w);
        return NULL;
    }
    w->rank = rank;
    w->next = s->w[b];
    s->w[b] = w;
    s->nworkers++;
    return w;
}

void kvr_rstat_record(struct kvr_rstat *s, const struct kvr_rstat_decision *d)
{
    int e = d->endpoint == KVR_RSTAT_SCORE ? KVR_RSTAT_SCORE : KVR_RSTAT_ROUTE;
    int in = d->input >= 0 && d->input < KVR_RSTAT_NINPUTS ? d->input : KVR_RSTAT_TOKENS;
    int pol = e == KVR_RSTAT_SCORE ? POL_NONE
              : d->policy >= 0 && d->policy < KVR_ROUTE_NPOLICIES ? d->policy
                                                                   : KVR_ROUTE_TTFT;
    int br = d->branch >= 0 && d->branch < KVR_RSTAT_NBRANCHES ? d->branch
                                                               : KVR_RSTAT_NO_CANDIDATE;
    /* a score sums every query; a route decision only when a worker was chosen */
    bool sum = e == KVR_RSTAT_SCORE || d->pod != NULL;

    if (d->seconds >= 0)
        kvr_hist_observe(&s->lat[e][in], d->seconds);
    pthread_mutex_lock(&s->mu);
    struct sums *x = &row_of(s, d->model)->s[e][pol];
    x->decisions++;
    if (sum) {
        x->query_blocks += d->query_blocks;
        x->best_matched += d->best_matched;
        x->chosen_matched += e == KVR_RSTAT_ROUTE ? d->chosen_matched : 0;
    }
    if (e == KVR_RSTAT_ROUTE) {
        s->branches[pol][br]++;
        if (d->pod != NULL) {
            struct worker *w = worker_of(s, d->pod, d->dp_rank);
            if (w != NULL) {
                w->decisions++;
                w->matched_blocks += d->chosen_matched;
                w->matched_tokens += (uint64_t)d->chosen_matched * d->block_size;
                w->prompt_tokens += d->prompt_tokens;
                w->last_ms = kvr_now_ms();
            } else {
                s->worker_overflow++;
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void kvr_rstat_tokenized(struct kvr_rstat *s, int input, double seconds)
{
    if (input >= 0 && input < KVR_RSTAT_NINPUTS)
        kvr_hist_observe(&s->tok[input], seconds);
}

/* Unlinks and frees every worker for which drop(w) says so (mu held); returns how many. */
static size_t sweep(struct kvr_rstat *s, bool (*drop)(const struct worker *, const void *),
                    const void *arg)
{
    size_t n = 0;
    for (size_t b = 0; b < WBUCKETS; b++) {
        struct worker **pp = &s->w[b];
        while (*pp != NULL) {
            struct worker *w = *pp;
            if (!drop(w, arg)) {
                pp = &w->next;
                continue;
            }
            *pp = w->next;
            free(w->pod);
            free(w);
            s->nworkers--;
            n++;
        }
    }
    return n;
}

static bool is_pod(const struct worker *w, const void *pod)
{
    return strcmp(w->pod, pod) == 0;
}

static bool idle_since(const struct worker *w, const void *cutoff)
{
    return w->last_ms < *(const int64_t *)cutoff;
}

void kvr_rstat_forget_pod(struct kvr_rstat *s, const char *pod)
{
    pthread_mutex_lock(&s->mu);
    sweep(s, is_pod, pod);
    pthread_mutex_unlock(&s->mu);
}

struct wsnap {
    char pod[KVR_NAME_MAX];
    uint32_t rank;
    uint64_t decisions, matched_blocks, matched_tokens, prompt_tokens;
};

static void sums_family(struct kvr_buf *out, const char *name, const char *help,
                        const struct model_row *rows, size_t nrows, size_t field)
{
    char esc[KVR_NAME_MAX * 2 + 8];
    bool first = true;

    for (size_t i = 0; i < nrows; i++) {
        for (int e = 0; e < KVR_RSTAT_NENDPOINTS; e++) {
            for (int p = 0; p < NPOL; p++) {
                const struct sums *x = &rows[i].s[e][p];
                char labels[sizeof(esc) + 96];
                if (x->decisions == 0 || (e == KVR_RSTAT_SCORE) != (p == POL_NONE))
                    continue;
                if (field == offsetof(struct sums, chosen_matched) && e == KVR_RSTAT_SCORE)
                    continue; /* a score chooses nothing */
                kvr_metrics_label_escape(esc, sizeof(esc), rows[i].name);
                snprintf(labels, sizeof(labels), "endpoint=\"%s\",model=\"%s\",policy=\"%s\"",
                         endpoint_names[e], esc,
                         p == POL_NONE ? "none" : kvr_route_policy_name(p));
                kvr_metrics_counter(out, name, first ? help : NULL, labels,
                                    *(const uint64_t *)((const char *)x + field));
                first = false;
            }
        }
    }
    if (first) /* no decision yet: the family exists all the same (HELP/TYPE only) */
        kvr_buf_printf(out, "# HELP kvrouter_%s %s\n# TYPE kvrouter_%s counter\n", name, help,
                       name);
}

void kvr_rstat_metrics(struct kvr_rstat *s, struct kvr_buf *out)
{
    struct model_row *rows = calloc(NROWS, sizeof(*rows));
    struct wsnap *ws = NULL;
    uint64_t br[KVR_ROUTE_NPOLICIES][KVR_RSTAT_NBRANCHES], overflow, expired;
    size_t nrows = 0, nw = 0;
    char esc[KVR_NAME_MAX * 2 + 8], labels[sizeof(esc) + 64];

    if (rows == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->ttl_ms > 0) {
        int64_t cutoff = kvr_now_ms() - s->ttl_ms;
        s->workers_expired += sweep(s, idle_since, &cutoff);
    }
    for (size_t i = 0; i < NROWS; i++) {
        if (i >= s->nrows && i != KVR_RSTAT_MAX_MODELS)
            continue;
        rows[nrows] = s->rows[i]; /* name borrowed: rows are never freed before destroy */
        nrows++;
    }
    memcpy(br, s->branches, sizeof(br));
    overflow = s->worker_overflow;
    expired = s->workers_expired;
    ws = s->nworkers ? calloc(s->nworkers, sizeof(*ws)) : NULL;
    for (size_t b = 0; ws != NULL && b < WBUCKETS; b++) {
        for (const struct worker *w = s->w[b]; w != NULL; w = w->next, nw++) {
            snprintf(ws[nw].pod, sizeof(ws[nw].pod), "%s", w->pod);
            ws[nw].rank = w->rank;
            ws[nw].decisions = w->decisions;
            ws[nw].matched_blocks = w->matched_blocks;
            ws[nw].matched_tokens = w->matched_tokens;
            ws[nw].prompt_tokens = w->prompt_tokens;
        }
    }
    pthread_mutex_unlock(&s->mu);

    sums_family(out, "decision_total", "Decisions (route) and scored queries (score)", rows,
                nrows, offsetof(struct sums, decisions));
    sums_family(out, "decision_query_blocks_total",
                "Full blocks of the queries of decisions that chose a worker, and of scored "
                "queries", rows, nrows, offsetof(struct sums, query_blocks));
    sums_family(out, "decision_chosen_matched_blocks_total",
                "Cached blocks the chosen worker held (predicted hits)", rows, nrows,
                offsetof(struct sums, chosen_matched));
    sums_family(out, "decision_best_matched_blocks_total",
                "The most cached blocks any candidate held", rows, nrows,
                offsetof(struct sums, best_matched));
    free(rows);

    kvr_buf_printf(out, "# HELP kvrouter_decision_branch_total Route decisions by outcome\n"
                        "# TYPE kvrouter_decision_branch_total counter\n");
    for (int p = 0; p < KVR_ROUTE_NPOLICIES; p++)
        for (int b = 0; b < KVR_RSTAT_NBRANCHES; b++)
            kvr_buf_printf(out, "kvrouter_decision_branch_total{policy=\"%s\",branch=\"%s\"} %"
                                PRIu64 "\n", kvr_route_policy_name(p), branch_names[b], br[p][b]);

    for (int e = 0; e < KVR_RSTAT_NENDPOINTS; e++) {
        for (int i = 0; i < KVR_RSTAT_NINPUTS; i++) {
            snprintf(labels, sizeof(labels), "endpoint=\"%s\",input=\"%s\"", endpoint_names[e],
                     input_names[i]);
            kvr_metrics_hist(out, "decision_duration_seconds",
                             e == 0 && i == 0 ? "Time from a request's body to its answer, by "
                                                "endpoint and input kind"
                                              : NULL,
                             labels, &s->lat[e][i]);
        }
    }

    for (int i = KVR_RSTAT_PROMPT; i < KVR_RSTAT_NINPUTS; i++) {
        snprintf(labels, sizeof(labels), "input=\"%s\"", input_names[i]);
        kvr_metrics_hist(out, "decision_tokenize_seconds",
                         i == KVR_RSTAT_PROMPT ? "Time a query's text (prompt, or chat rendered "
                                                 "by its template) took to become token ids"
                                               : NULL,
                         labels, &s->tok[i]);
    }

    static const char *const wnames[4][2] = {
        {"decision_worker_total", "Route decisions that chose this worker"},
        {"decision_worker_matched_blocks_total", "Cached blocks of the queries routed to this "
                                                 "worker (predicted hits)"},
        {"decision_worker_matched_tokens_total", "Predicted hit tokens (matched blocks x block "
                                                 "size), beside vllm:prefix_cache_hits_total"},
        {"decision_worker_prompt_tokens_total", "Prompt tokens routed to this worker, beside "
                                                "vllm:prefix_cache_queries_total"},
    };
    for (int k = 0; k < 4; k++) {
        kvr_buf_printf(out, "# HELP kvrouter_%s %s\n# TYPE kvrouter_%s counter\n", wnames[k][0],
                       wnames[k][1], wnames[k][0]);
        for (size_t i = 0; i < nw; i++) {
            const struct wsnap *w = &ws[i];
            uint64_t v = k == 0 ? w->decisions : k == 1 ? w->matched_blocks
                                               : k == 2 ? w->matched_tokens
                                                        : w->prompt_tokens;
            kvr_metrics_label_escape(esc, sizeof(esc), w->pod);
            kvr_buf_printf(out, "kvrouter_%s{pod=\"%s\",dp_rank=\"%u\"} %" PRIu64 "\n",
                           wnames[k][0], esc, w->rank, v);
        }
    }
    free(ws);
    kvr_metrics_gauge(out, "decision_workers", "Workers with decision series now", NULL,
                      (double)nw);
    kvr_metrics_counter(out, "decision_worker_overflow_total",
                        "Decisions to a worker past the per-worker series cap (not kept per "
                        "worker)", NULL, overflow);
    kvr_metrics_counter(out, "decision_workers_expired_total",
                        "Worker series dropped after [events] forget_after without a decision",
                        NULL, expired);
}
