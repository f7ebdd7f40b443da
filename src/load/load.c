/* load.c — the scraper: every [load] metrics_interval, GET each target's metrics URL, read the
 * answer narrowly (load_prom.c), keep each worker's figures with the time they arrived.
 *
 * Threads
 *   - One scraper thread runs a libuv loop that drives libcurl's multi interface, the pattern
 *     of curl's multi-uv example: CURLMOPT_SOCKETFUNCTION opens/changes/closes a uv_poll per
 *     socket, CURLMOPT_TIMERFUNCTION arms a uv_timer, and both call
 *     curl_multi_socket_action. All transfers of a round run concurrently on that thread;
 *     nothing blocks it (curl's resolver is threaded; numeric hosts need none).
 *   - Its timers: `tick` (every metrics_interval: start a transfer for each target that is
 *     not still busy with the previous one; bounded by metrics_timeout), `refresh` (once a
 *     second: ask the daemon which workers exist, rebuild the targets), and `wake` (an
 *     async: stop, a reload, a new fixed list from set_pods; sends coalesce).
 *   - Any thread reads samples (kvr_load_get, _foreach, _put_json, _metrics).
 *
 * Locking
 *   - `lock` guards the worker table (pod, rank) → sample. The scraper takes it once per
 *     finished answer to copy the figures in (and once per refresh that removes workers);
 *     a reader takes it for a hash probe and a 80-byte copy. A mutex rather than a seqlock:
 *     a reader needs all the figures of one sample together with its time, the table itself
 *     changes (workers come and go), readers are few (route decisions, /v1/pods, /metrics)
 *     and the section is a few hundred nanoseconds, so a seqlock would buy nothing but a
 *     retry loop over memory that may be freed under it.
 *   - `ctl_lock` guards what the main thread hands over (pending settings, the fixed pod
 *     list, the stop flag); the scraper copies it out in its wake callback.
 *   - Targets, curl handles and the loop are the scraper thread's alone (after start; the
 *     main thread touches them only before the thread exists and after it is joined).
 *   - Statistics are relaxed atomics; the duration histogram is metrics.h's (lock-free).
 *
 * Targets and workers
 *   A target is one URL (the template filled in) with the pods it stands for and, for a
 *   {rank} template, its rank. It keeps its curl easy handle (connection reuse: the multi
 *   handle's connection cache keeps each engine's keep-alive connection between rounds) and
 *   its parse state. A finished 200 answer updates the workers (pod, rank) it reports: every
 *   rank found for a per-pod URL, the target's own rank for a per-rank one (or the only rank
 *   the answer has). Workers are created by their first good answer and removed with their
 *   target; a target that fails keeps its workers, whose samples age (stale past
 *   stale_after; readers decide). Limits: max_targets URLs (the rest refused, a gauge) and
 *   max_targets workers (the rest refused, counted); max_response_bytes per answer (aborted
 *   past it, counted); metrics_timeout per transfer (counted).
 *
 * Files: load.c (the scraper, the targets, the reading calls), load_url.c (URL templates and
 * the listing of workers), load_prom.c (the text format reader), load_table.c (the worker
 * table), sharing load_int.h.
 */
#include "load/load.h"
#include "load/load_int.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/base.h"
#include "core/log.h"
#include "core/metrics.h"

#ifndef KVR_VERSION
#define KVR_VERSION "0"
#endif

#define ALL_RANKS UINT32_MAX
#define REFRESH_MS 1000

enum result {
    RES_OK,
    RES_TIMEOUT,     /* metrics_timeout passed (connecting included) */
    RES_CONNECT,     /* refused, unreachable, name not resolved */
    RES_HTTP_STATUS, /* an answer other than 200 */
    RES_TOO_LARGE,   /* past max_response_bytes */
    RES_PARSE,       /* a 200 without any series that is read (for the target's rank) */
    RES_ERROR,       /* anything else (reset, TLS, ...) */
    NRESULTS
};
static const char *const result_names[NRESULTS] = {"ok",        "timeout", "connect", "http_status",
                                                   "too_large", "parse",   "error"};

struct target {
    struct kvr_load *l;
    char *url;
    char **pods; /* sorted, unique */
    size_t npods;
    uint32_t rank;  /* ALL_RANKS for a per-pod URL */
    CURL *easy;     /* NULL until its first transfer */
    struct kvr_load_prom prom;
    uint64_t bytes; /* of the answer being read */
    long status;    /* its HTTP status, once known (0 before) */
    bool too_large;
    bool busy;      /* in the multi handle */
    bool dead;      /* being removed (a refresh) */
    uint64_t started_ns;
    uint64_t last_ok_ns; /* 0 = never */
    uint32_t fails;      /* consecutive failed scrapes */
    enum result last;
};

struct settings {
    char *url; /* NULL = off */
    int64_t interval_ms, timeout_ms, stale_ms, max_bytes;
    uint32_t max_targets;
};

struct sockctx {
    uv_poll_t poll;
    curl_socket_t fd;
    struct kvr_load *l;
};

struct kvr_load {
    void (*list_pods)(void *arg, struct kvr_load_list *l);
    void *list_arg;
    bool started; /* main thread: the loop and thread exist */
    pthread_t thread;

    pthread_mutex_t ctl_lock;
    struct settings pending; /* ctl_lock */
    bool pending_set;        /* ctl_lock */
    char **fixed;            /* ctl_lock: set_pods */
    uint32_t *fixed_ranks;
    size_t nfixed;
    bool fixed_set; /* ctl_lock */
    bool stopping;  /* ctl_lock */

    pthread_mutex_t lock; /* the worker table */
    struct kvr_load_wtable w; /* lock */

    _Atomic int64_t stale_ns;
    _Atomic bool enabled;

    /* scraper thread only */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t tick, refresh, curl_timer;
    CURLM *multi;
    struct curl_slist *headers;
    struct settings cur;
    bool per_rank; /* cur.url names {rank} */
    struct target **targets; /* sorted by url */
    size_t ntargets;
    struct kvr_ratelimit rl;

    /* statistics */
    _Atomic uint64_t results[NRESULTS];
    _Atomic uint64_t malformed, ignored, workers_refused;
    _Atomic uint64_t g_targets, g_stale, g_bad_pod, g_too_many;
    struct kvr_hist duration;
};

/* ---- small helpers -------------------------------------------------------------------- */

static char *xstrdup(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}

static void settings_free(struct settings *s)
{
    free(s->url);
    s->url = NULL;
}

/* From conf; 0 or -ENOMEM. An empty URL is NULL (off). */
static int settings_from(struct settings *s, const struct kvr_conf *c)
{
    memset(s, 0, sizeof(*s));
    if (c->load_metrics_url != NULL && c->load_metrics_url[0] != '\0' &&
        (s->url = strdup(c->load_metrics_url)) == NULL)
        return -ENOMEM;
    s->interval_ms = c->load_interval_ms > 0 ? c->load_interval_ms : 50;
    s->timeout_ms = c->load_timeout_ms > 0 ? c->load_timeout_ms : 500;
    s->stale_ms = c->load_stale_after_ms > 0 ? c->load_stale_after_ms : 1000;
    s->max_bytes = c->load_max_response_bytes > 0 ? c->load_max_response_bytes : 4 << 20;
    s->max_targets = c->load_max_targets > 0 ? c->load_max_targets : 4096;
    return 0;
}

/* ---- targets (scraper thread) ---------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool target_has_pod(const struct target *t, const char *pod)
{
    const char *key = pod;
    return t->npods > 0 && bsearch(&key, t->pods, t->npods, sizeof(char *), cmp_str) != NULL;
}

/* The sweep after a refresh: workers of removed targets, or of pods their target no longer
 * stands for. Scraper thread, lock held (it dereferences owners: they are not freed yet). */
static bool worker_orphaned(const struct kvr_load_worker *w, void *arg)
{
    (void)arg;
    const struct target *t = w->owner;
    return t == NULL || t->dead || !target_has_pod(t, w->pod);
}

static void target_free(struct target *t)
{
    if (t == NULL)
        return;
    if (t->easy != NULL)
        curl_easy_cleanup(t->easy);
    kvr_load_prom_deinit(&t->prom);
    kvr_load_pods_free(t->pods, t->npods);
    free(t->url);
    free(t);
}

static void target_abort(struct kvr_load *l, struct target *t)
{
    if (t->busy) {
        curl_multi_remove_handle(l->multi, t->easy);
        t->busy = false;
    }
}

/* ---- libcurl's multi interface on libuv (curl's multi-uv example) ------------------------ */

static void check_done(struct kvr_load *l);

static void sockctx_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct sockctx *c = h->data;
    struct kvr_load *l = c->l;
    int flags = 0, running;

    if (status < 0)
        flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE)
        flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
        flags |= CURL_CSELECT_OUT;
    /* may close c's poll through on_socket (CURL_POLL_REMOVE): c is not used after */
    curl_multi_socket_action(l->multi, c->fd, flags, &running);
    check_done(l);
}

static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    struct kvr_load *l = userp;
    struct sockctx *c = socketp;
    int ev = 0;

    (void)easy;
    if (what == CURL_POLL_REMOVE) {
        if (c != NULL) {
            uv_poll_stop(&c->poll);
            curl_multi_assign(l->multi, s, NULL);
            uv_close((uv_handle_t *)&c->poll, sockctx_closed);
        }
        return 0;
    }
    if (c == NULL) {
        c = calloc(1, sizeof(*c));
        if (c == NULL)
            return -1;
        c->fd = s;
        c->l = l;
        if (uv_poll_init_socket(&l->loop, &c->poll, s) != 0) {
            free(c);
            return -1;
        }
        c->poll.data = c;
        curl_multi_assign(l->multi, s, c);
    }
    if (what & CURL_POLL_IN)
        ev |= UV_READABLE;
    if (what & CURL_POLL_OUT)
        ev |= UV_WRITABLE;
    uv_poll_start(&c->poll, ev, on_poll);
    return 0;
}

static void on_curl_timeout(uv_timer_t *h)
{
    struct kvr_load *l = h->data;
    int running;

    curl_multi_socket_action(l->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(l);
}

/* CURLMOPT_TIMERFUNCTION: only arms the timer (curl forbids acting from inside it). */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp)
{
    struct kvr_load *l = userp;

    (void)multi;
    if (timeout_ms < 0)
        uv_timer_stop(&l->curl_timer);
    else
        uv_timer_start(&l->curl_timer, on_curl_timeout, (uint64_t)timeout_ms, 0);
    return 0;
}

/* CURLOPT_WRITEFUNCTION: counts the answer against max_response_bytes and reads it as it
 * arrives (only a 200's body is read). */
static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct target *t = ud;
    size_t n = size * nmemb;

    if (t->bytes + n > (uint64_t)t->l->cur.max_bytes) {
        t->too_large = true;
        return 0; /* aborts the transfer (CURLE_WRITE_ERROR) */
    }
    t->bytes += n;
    if (t->status == 0)
        curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
    if (t->status == 200)
        (void)kvr_load_prom_feed(&t->prom, ptr, n); /* -ENOMEM: counted malformed there */
    return n;
}

/* The options every transfer of t shares; set once per easy handle. */
static int easy_setup(struct kvr_load *l, struct target *t)
{
    CURL *e = curl_easy_init();
    CURLcode rc = CURLE_OK;

    if (e == NULL)
        return -ENOMEM;
#define SET(opt, v)                                                                           \
    if (rc == CURLE_OK)                                                                       \
    rc = curl_easy_setopt(e, opt, v)
    SET(CURLOPT_URL, t->url);
    SET(CURLOPT_PRIVATE, (void *)t);
    SET(CURLOPT_WRITEFUNCTION, on_body);
    SET(CURLOPT_WRITEDATA, (void *)t);
    SET(CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85 */
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
#else
    SET(CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    SET(CURLOPT_FOLLOWLOCATION, 0L); /* an engine's /metrics does not redirect */
    SET(CURLOPT_PROXY, "");          /* no proxy, whatever the environment says */
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    SET(CURLOPT_HTTPHEADER, l->headers);
    SET(CURLOPT_USERAGENT, "kvrouterd/" KVR_VERSION);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
#undef SET
    if (rc != CURLE_OK) {
        curl_easy_cleanup(e);
        return -EINVAL;
    }
    t->easy = e;
    return 0;
}

static void scrape_start(struct kvr_load *l, struct target *t, uint64_t now)
{
    if (t->busy)
        return; /* the previous scrape is still running (bounded by metrics_timeout) */
    if (t->easy == NULL && easy_setup(l, t) != 0) {
        KVR_CNT_INC(l->results[RES_ERROR]);
        return;
    }
    curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, (long)l->cur.timeout_ms);
    curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)l->cur.timeout_ms);
    curl_easy_setopt(t->easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)l->cur.max_bytes);
    kvr_load_prom_reset(&t->prom);
    t->bytes = 0;
    t->status = 0;
    t->too_large = false;
    t->started_ns = now;
    if (curl_multi_add_handle(l->multi, t->easy) != CURLM_OK) {
        KVR_CNT_INC(l->results[RES_ERROR]);
        return;
    }
    t->busy = true;
}

/* Copies a good answer into the workers, dated `at` (when its request was sent: a routing
 * decision made after that may not be counted in it yet); false when it has nothing for them. */
static bool store(struct kvr_load *l, struct target *t, uint64_t at)
{
    const struct kvr_load_prom_rank *one = NULL;
    size_t nr;

    if (t->rank != ALL_RANKS) {
        one = kvr_load_prom_find(&t->prom, t->rank);
        if (one == NULL && t->prom.nranks == 1)
            one = &t->prom.ranks[0]; /* a per-rank URL whose engine labels its rank otherwise */
        if (one == NULL)
            return false;
        nr = 1;
    } else {
        nr = t->prom.nranks;
        if (nr == 0)
            return false;
    }
    pthread_mutex_lock(&l->lock);
    for (size_t p = 0; p < t->npods; p++) {
        for (size_t i = 0; i < nr; i++) {
            const struct kvr_load_prom_rank *r = one != NULL ? one : &t->prom.ranks[i];
            uint32_t rank = one != NULL ? t->rank : r->rank;
            uint64_t h = kvr_load_key_hash(t->pods[p], rank);
            struct kvr_load_worker *w = kvr_load_wt_find(&l->w, t->pods[p], rank, h);
            if (w == NULL) {
                if (l->w.n >= l->cur.max_targets) {
                    KVR_CNT_INC(l->workers_refused);
                    continue;
                }
                w = calloc(1, sizeof(*w));
                if (w != NULL) {
                    w->rank = rank;
                    w->hash = h; /* before the insert: it places by the hash */
                }
                if (w == NULL || (w->pod = strdup(t->pods[p])) == NULL ||
                    kvr_load_wt_insert(&l->w, w) != 0) {
                    kvr_load_worker_free(w);
                    KVR_CNT_INC(l->workers_refused);
                    continue;
                }
            }
            w->owner = t;
            w->s.waiting = r->prio[KVR_LOAD_WAITING] ? r->v[KVR_LOAD_WAITING] : -1;
            w->s.running = r->prio[KVR_LOAD_RUNNING] ? r->v[KVR_LOAD_RUNNING] : -1;
            w->s.kv_usage = r->prio[KVR_LOAD_KV_USAGE] ? r->v[KVR_LOAD_KV_USAGE] : -1;
            w->s.prompt_tokens = r->prio[KVR_LOAD_PROMPT] ? r->v[KVR_LOAD_PROMPT] : -1;
            w->s.prefix_hit_tokens = r->prio[KVR_LOAD_HITS] ? r->v[KVR_LOAD_HITS] : -1;
            w->s.prefix_query_tokens = r->prio[KVR_LOAD_QUERIES] ? r->v[KVR_LOAD_QUERIES] : -1;
            w->s.at_ns = at;
        }
    }
    pthread_mutex_unlock(&l->lock);
    return true;
}

static void scrape_done(struct kvr_load *l, struct target *t, CURLcode rc)
{
    uint64_t now = kvr_now_ns();
    enum result r;

    t->busy = false;
    if (t->status == 0)
        curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
    if (t->too_large || rc == CURLE_FILESIZE_EXCEEDED)
        r = RES_TOO_LARGE;
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        r = RES_TIMEOUT;
    else if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
        r = RES_CONNECT;
    else if (rc != CURLE_OK)
        r = RES_ERROR;
    else if (t->status != 200)
        r = RES_HTTP_STATUS;
    else {
        kvr_load_prom_end(&t->prom);
        KVR_CNT_ADD(l->malformed, t->prom.malformed);
        KVR_CNT_ADD(l->ignored, t->prom.ignored);
        r = store(l, t, t->started_ns) ? RES_OK : RES_PARSE;
    }
    KVR_CNT_INC(l->results[r]);
    kvr_hist_observe(&l->duration, (double)(now - t->started_ns) / 1e9);
    if (r == RES_OK) {
        if (t->fails > 0)
            kvr_log_info("load: %s answers again (after %" PRIu32 " failed scrape(s))", t->url,
                         t->fails);
        t->fails = 0;
        t->last_ok_ns = now;
    } else {
        if (t->fails == 0 || t->last != r) {
            char why[96];
            if (r == RES_HTTP_STATUS)
                snprintf(why, sizeof(why), "HTTP status %ld", t->status);
            else if (r == RES_PARSE)
                snprintf(why, sizeof(why), "no series it knows (%" PRIu64 " malformed lines)",
                         t->prom.malformed);
            else if (r == RES_TOO_LARGE)
                snprintf(why, sizeof(why), "answer over max_response_bytes (%lld)",
                         (long long)l->cur.max_bytes);
            else
                snprintf(why, sizeof(why), "%s (%s)", result_names[r], curl_easy_strerror(rc));
            kvr_log_limited(&l->rl, KVR_LOG_WARN,
                            "load: scraping %s failed: %s; its last sample ages out (stale "
                            "after %lld ms)",
                            t->url, why, (long long)l->cur.stale_ms);
        }
        t->fails++;
    }
    t->last = r;
}

static void check_done(struct kvr_load *l)
{
    CURLMsg *m;
    int left;

    while ((m = curl_multi_info_read(l->multi, &left)) != NULL) {
        CURL *e = m->easy_handle;
        CURLcode rc = m->data.result;
        char *priv = NULL;
        struct target *t;

        if (m->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, &priv);
        t = (struct target *)(void *)priv;
        curl_multi_remove_handle(l->multi, e); /* m is invalid from here */
        if (t != NULL)
            scrape_done(l, t, rc);
    }
}

/* ---- the listing and the refresh (scraper thread) --------------------------------------- */

/* Rebuilds the targets from the workers known now (the fixed list, then the polled one):
 * URLs filled in, pods that cannot go into a URL refused, one target per URL (kept when it
 * was there before: its connection and easy handle stay), at most max_targets of them.
 * Workers of targets or pods that went are removed. */
static void refresh(struct kvr_load *l)
{
    struct kvr_load_list list = {0};
    struct target **next = NULL, **gone = NULL;
    size_t nnext = 0, ngone = 0, bad_pod = 0, too_many = 0, i, j, k;
    char *url = NULL;

    if (l->cur.url != NULL) {
        pthread_mutex_lock(&l->ctl_lock);
        for (i = 0; i < l->nfixed; i++)
            (void)kvr_load_list_add(&list, l->fixed[i], l->fixed_ranks[i]);
        pthread_mutex_unlock(&l->ctl_lock);
        if (l->list_pods != NULL)
            l->list_pods(l->list_arg, &list);
        url = malloc(KVR_LOAD_URL_MAX);
        if (url == NULL || list.rc != 0)
            goto out; /* out of memory: keep the targets as they are */
    }
    /* fill in the URLs; drop the pods that cannot be put into one */
    for (i = j = 0; i < list.n; i++) {
        struct kvr_load_lentry e = list.v[i];
        int n = kvr_load_url_expand(l->cur.url, e.pod, l->per_rank ? e.rank : 0, url,
                                    KVR_LOAD_URL_MAX);
        if (n < 0 || (e.url = strdup(url)) == NULL) {
            if (n < 0)
                bad_pod++;
            free(e.pod);
            continue;
        }
        list.v[j++] = e;
    }
    list.n = j;
    if (list.n > 1)
        qsort(list.v, list.n, sizeof(list.v[0]), kvr_load_lentry_cmp);
    next = calloc(list.n + 1, sizeof(*next));
    gone = calloc(l->ntargets + 1, sizeof(*gone));
    if (next == NULL || gone == NULL)
        goto out;
    /* merge the sorted entries (grouped by URL) with the sorted targets */
    for (i = 0, k = 0; i < list.n;) {
        size_t e = i + 1, np = 0;
        char **pods;
        struct target *t = NULL;
        int c = 1;

        while (e < list.n && strcmp(list.v[e].url, list.v[i].url) == 0)
            e++;
        while (k < l->ntargets && (c = strcmp(l->targets[k]->url, list.v[i].url)) < 0)
            gone[ngone++] = l->targets[k++];
        if (nnext == l->cur.max_targets) {
            too_many += e - i;
            if (c == 0)
                gone[ngone++] = l->targets[k++];
            i = e;
            continue;
        }
        pods = kvr_load_group_pods(&list.v[i], e - i, &np);
        if (c == 0) {
            t = l->targets[k++];
            if (pods != NULL) {
                kvr_load_pods_free(t->pods, t->npods);
                t->pods = pods;
                t->npods = np;
            } /* else: out of memory, the target keeps its old pods */
        } else if (pods != NULL && (t = calloc(1, sizeof(*t))) != NULL &&
                   (t->url = strdup(list.v[i].url)) != NULL) {
            t->l = l;
            t->pods = pods;
            t->npods = np;
            t->rank = l->per_rank ? list.v[i].rank : ALL_RANKS;
            kvr_load_prom_init(&t->prom);
        } else {
            if (t != NULL)
                free(t);
            t = NULL;
            kvr_load_pods_free(pods, np);
        }
        if (t != NULL)
            next[nnext++] = t;
        i = e;
    }
    while (k < l->ntargets)
        gone[ngone++] = l->targets[k++];
    for (i = 0; i < ngone; i++) {
        gone[i]->dead = true;
        target_abort(l, gone[i]);
    }
    pthread_mutex_lock(&l->lock);
    kvr_load_wt_sweep(&l->w, worker_orphaned, NULL);
    pthread_mutex_unlock(&l->lock);
    for (i = 0; i < ngone; i++) {
        kvr_log_debug("load: no longer scraping %s", gone[i]->url);
        target_free(gone[i]);
    }
    free(l->targets);
    l->targets = next;
    l->ntargets = nnext;
    next = NULL;
    KVR_CNT_SET(l->g_targets, nnext);
    KVR_CNT_SET(l->g_bad_pod, bad_pod);
    KVR_CNT_SET(l->g_too_many, too_many);
out:
    free(next);
    free(gone);
    free(url);
    kvr_load_list_free(&list);
}

/* ---- the loop (scraper thread) ---------------------------------------------------------- */

static void on_tick(uv_timer_t *h)
{
    struct kvr_load *l = h->data;
    uint64_t now = kvr_now_ns(), stale = (uint64_t)l->cur.stale_ms * 1000000u, nstale = 0;

    for (size_t i = 0; i < l->ntargets; i++) {
        struct target *t = l->targets[i];
        if (t->last_ok_ns == 0 || now - t->last_ok_ns > stale)
            nstale++;
        scrape_start(l, t, now);
    }
    KVR_CNT_SET(l->g_stale, nstale);
}

static void on_refresh(uv_timer_t *h)
{
    refresh(h->data);
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (uv_is_closing(h))
        return;
    uv_close(h, h->type == UV_POLL ? sockctx_closed : NULL);
}

/* Stop: every transfer abandoned, curl's handles cleaned up, every uv handle closed (the
 * loop then ends by itself). */
static void shutdown_loop(struct kvr_load *l)
{
    for (size_t i = 0; i < l->ntargets; i++) {
        struct target *t = l->targets[i];
        target_abort(l, t);
        if (t->easy != NULL) {
            curl_easy_cleanup(t->easy);
            t->easy = NULL;
        }
    }
    curl_multi_cleanup(l->multi); /* may still close sockets through on_socket */
    l->multi = NULL;
    uv_walk(&l->loop, close_any, NULL);
}

static void apply_settings(struct kvr_load *l, struct settings *fresh)
{
    bool url_changed = (fresh->url == NULL) != (l->cur.url == NULL) ||
                       (fresh->url != NULL && strcmp(fresh->url, l->cur.url) != 0);
    bool interval_changed = fresh->interval_ms != l->cur.interval_ms;

    settings_free(&l->cur);
    l->cur = *fresh;
    memset(fresh, 0, sizeof(*fresh));
    l->per_rank = kvr_load_url_per_rank(l->cur.url);
    if (interval_changed)
        uv_timer_start(&l->tick, on_tick, (uint64_t)l->cur.interval_ms,
                       (uint64_t)l->cur.interval_ms);
    curl_multi_setopt(l->multi, CURLMOPT_MAXCONNECTS, (long)l->cur.max_targets + 16);
    if (url_changed)
        kvr_log_info("load: scraping %s", l->cur.url != NULL ? l->cur.url : "off");
}

static void on_wake(uv_async_t *h)
{
    struct kvr_load *l = h->data;
    struct settings fresh = {0};
    bool stopping, got_settings, got_fixed;

    pthread_mutex_lock(&l->ctl_lock);
    stopping = l->stopping;
    got_settings = l->pending_set;
    if (got_settings) {
        fresh = l->pending;
        memset(&l->pending, 0, sizeof(l->pending));
        l->pending_set = false;
    }
    got_fixed = l->fixed_set;
    l->fixed_set = false;
    pthread_mutex_unlock(&l->ctl_lock);
    if (stopping) {
        settings_free(&fresh);
        shutdown_loop(l);
        return;
    }
    if (got_settings)
        apply_settings(l, &fresh);
    if (got_settings || got_fixed)
        refresh(l);
}

static void *scraper_main(void *arg)
{
    struct kvr_load *l = arg;

    refresh(l); /* first targets at once, not a second late */
    uv_run(&l->loop, UV_RUN_DEFAULT);
    return NULL;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* The loop, its handles and the thread; main thread, before the thread exists. */
static int start_thread(struct kvr_load *l, struct kvr_err *err)
{
    int rc;

    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return kvr_err_set(err, -EIO, "load: libcurl: %s", curl_easy_strerror(curl_init_rc));
    l->headers = curl_slist_append(NULL, "Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1");
    l->multi = curl_multi_init();
    if (l->headers == NULL || l->multi == NULL) {
        rc = kvr_err_set(err, -ENOMEM, "load: out of memory");
        goto fail_curl;
    }
    curl_multi_setopt(l->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(l->multi, CURLMOPT_SOCKETDATA, l);
    curl_multi_setopt(l->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(l->multi, CURLMOPT_TIMERDATA, l);
    /* one keep-alive connection per target stays open between rounds */
    curl_multi_setopt(l->multi, CURLMOPT_MAXCONNECTS, (long)l->cur.max_targets + 16);
    rc = uv_loop_init(&l->loop);
    if (rc != 0) {
        kvr_err_set(err, rc, "load: uv_loop_init: %s", uv_strerror(rc));
        goto fail_curl;
    }
    uv_async_init(&l->loop, &l->wake, on_wake);
    uv_timer_init(&l->loop, &l->tick);
    uv_timer_init(&l->loop, &l->refresh);
    uv_timer_init(&l->loop, &l->curl_timer);
    l->wake.data = l->tick.data = l->refresh.data = l->curl_timer.data = l;
    uv_timer_start(&l->tick, on_tick, (uint64_t)l->cur.interval_ms, (uint64_t)l->cur.interval_ms);
    uv_timer_start(&l->refresh, on_refresh, REFRESH_MS, REFRESH_MS);
    rc = -pthread_create(&l->thread, NULL, scraper_main, l);
    if (rc != 0) {
        kvr_err_set(err, rc, "load: cannot start the scraper thread: %s", strerror(-rc));
        uv_walk(&l->loop, close_any, NULL);
        uv_run(&l->loop, UV_RUN_DEFAULT);
        uv_loop_close(&l->loop);
        goto fail_curl;
    }
    l->started = true;
    kvr_log_info("load: scraping %s every %lld ms (timeout %lld ms, stale after %lld ms)",
                 l->cur.url, (long long)l->cur.interval_ms, (long long)l->cur.timeout_ms,
                 (long long)l->cur.stale_ms);
    return 0;
fail_curl:
    if (l->multi != NULL)
        curl_multi_cleanup(l->multi);
    l->multi = NULL;
    curl_slist_free_all(l->headers);
    l->headers = NULL;
    return rc;
}

/* ---- lifecycle (main thread) ------------------------------------------------------------ */

int kvr_load_create(const struct kvr_load_opts *o, struct kvr_load **out, struct kvr_err *err)
{
    struct kvr_load *l;
    int rc;

    if (o == NULL || o->conf == NULL || out == NULL)
        return kvr_err_set(err, -EINVAL, "load: no configuration");
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return kvr_err_set(err, -ENOMEM, "load: out of memory");
    rc = settings_from(&l->cur, o->conf);
    if (rc != 0) {
        free(l);
        return kvr_err_set(err, rc, "load: out of memory");
    }
    l->per_rank = kvr_load_url_per_rank(l->cur.url);
    l->list_pods = o->list_pods;
    l->list_arg = o->list_arg;
    pthread_mutex_init(&l->ctl_lock, NULL);
    pthread_mutex_init(&l->lock, NULL);
    atomic_init(&l->stale_ns, l->cur.stale_ms * 1000000);
    atomic_init(&l->enabled, l->cur.url != NULL);
    kvr_ratelimit_init(&l->rl, o->conf->log_ratelimit_ms, o->conf->log_ratelimit_burst);
    kvr_hist_init_exp(&l->duration, 0.001, 2.0, 14); /* 1 ms .. 8.2 s */
    *out = l;
    return 0;
}

int kvr_load_start(struct kvr_load *l, struct kvr_err *err)
{
    if (l == NULL || l->started || l->cur.url == NULL)
        return 0;
    return start_thread(l, err);
}

int kvr_load_set_conf(struct kvr_load *l, const struct kvr_conf *c, struct kvr_err *err)
{
    struct settings fresh;
    int rc;

    if (l == NULL)
        return 0;
    rc = settings_from(&fresh, c);
    if (rc != 0)
        return kvr_err_set(err, rc, "load: out of memory");
    atomic_store_explicit(&l->stale_ns, fresh.stale_ms * 1000000, memory_order_relaxed);
    atomic_store_explicit(&l->enabled, fresh.url != NULL, memory_order_relaxed);
    if (!l->started) {
        /* no thread yet: the settings are ours to replace */
        settings_free(&l->cur);
        l->cur = fresh;
        l->per_rank = kvr_load_url_per_rank(l->cur.url);
        return kvr_load_start(l, err);
    }
    pthread_mutex_lock(&l->ctl_lock);
    settings_free(&l->pending);
    l->pending = fresh;
    l->pending_set = true;
    pthread_mutex_unlock(&l->ctl_lock);
    uv_async_send(&l->wake);
    return 0;
}

int kvr_load_set_pods(struct kvr_load *l, const char *const *pods, const uint32_t *ranks,
                      size_t n)
{
    char **v = n ? calloc(n, sizeof(char *)) : NULL;
    uint32_t *r = n ? calloc(n, sizeof(uint32_t)) : NULL;
    char **oldv;
    size_t oldn;
    uint32_t *oldr;

    if (l == NULL)
        return 0;
    if (n > 0 && (v == NULL || r == NULL))
        goto oom;
    for (size_t i = 0; i < n; i++) {
        if ((v[i] = xstrdup(pods[i])) == NULL)
            goto oom;
        r[i] = ranks != NULL ? ranks[i] : 0;
    }
    pthread_mutex_lock(&l->ctl_lock);
    oldv = l->fixed;
    oldn = l->nfixed;
    oldr = l->fixed_ranks;
    l->fixed = v;
    l->fixed_ranks = r;
    l->nfixed = n;
    l->fixed_set = true;
    pthread_mutex_unlock(&l->ctl_lock);
    kvr_load_pods_free(oldv, oldn);
    free(oldr);
    if (l->started)
        uv_async_send(&l->wake);
    return 0;
oom:
    kvr_load_pods_free(v, n);
    free(r);
    return -ENOMEM;
}

void kvr_load_stop(struct kvr_load *l)
{
    if (l == NULL || !l->started)
        return;
    pthread_mutex_lock(&l->ctl_lock);
    l->stopping = true;
    pthread_mutex_unlock(&l->ctl_lock);
    uv_async_send(&l->wake);
    pthread_join(l->thread, NULL);
    uv_loop_close(&l->loop);
    curl_slist_free_all(l->headers);
    l->headers = NULL;
    l->started = false;
}

void kvr_load_destroy(struct kvr_load *l)
{
    if (l == NULL)
        return;
    kvr_load_stop(l);
    for (size_t i = 0; i < l->ntargets; i++)
        target_free(l->targets[i]);
    free(l->targets);
    kvr_load_wt_free(&l->w);
    kvr_load_pods_free(l->fixed, l->nfixed);
    free(l->fixed_ranks);
    settings_free(&l->cur);
    settings_free(&l->pending);
    pthread_mutex_destroy(&l->ctl_lock);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* ---- reading (any thread) --------------------------------------------------------------- */

bool kvr_load_enabled(struct kvr_load *l)
{
    return l != NULL && atomic_load_explicit(&l->enabled, memory_order_relaxed);
}

static void fill_age(struct kvr_load_sample *s, uint64_t now, int64_t stale_ns)
{
    s->age_ns = now > s->at_ns ? now - s->at_ns : 0;
    s->stale = s->age_ns > (uint64_t)stale_ns;
}

int kvr_load_get(struct kvr_load *l, const char *pod, uint32_t rank, struct kvr_load_sample *out)
{
    uint64_t h;
    const struct kvr_load_worker *w;
    int rc = -ENOENT;

    if (l == NULL || pod == NULL)
        return -ENOENT;
    h = kvr_load_key_hash(pod, rank);
    pthread_mutex_lock(&l->lock);
    w = kvr_load_wt_find(&l->w, pod, rank, h);
    if (w != NULL) {
        *out = w->s;
        rc = 0;
    }
    pthread_mutex_unlock(&l->lock);
    if (rc == 0)
        fill_age(out, kvr_now_ns(), atomic_load_explicit(&l->stale_ns, memory_order_relaxed));
    return rc;
}

void kvr_load_foreach(struct kvr_load *l,
                      void (*cb)(void *arg, const char *pod, uint32_t rank,
                                 const struct kvr_load_sample *s),
                      void *arg)
{
    uint64_t now;
    int64_t stale;

    if (l == NULL)
        return;
    now = kvr_now_ns();
    stale = atomic_load_explicit(&l->stale_ns, memory_order_relaxed);
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < l->w.cap; i++) {
        const struct kvr_load_worker *w = l->w.slots[i];
        struct kvr_load_sample s;
        if (w == NULL)
            continue;
        s = w->s;
        fill_age(&s, now, stale);
        cb(arg, w->pod, w->rank, &s);
    }
    pthread_mutex_unlock(&l->lock);
}

/* A JSON number, or null for an unknown (-1) figure. */
static void put_num(struct kvr_buf *b, const char *key, double v)
{
    char tmp[64];
    int n;
    if (v < 0)
        n = snprintf(tmp, sizeof(tmp), "%snull", key);
    else
        n = snprintf(tmp, sizeof(tmp), "%s%.10g", key, v);
    if (n > 0)
        kvr_buf_append(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

void kvr_load_put_json(struct kvr_load *l, const char *pod, uint32_t rank, struct kvr_buf *b)
{
    struct kvr_load_sample s;
    char tmp[96];
    int n;

    if (kvr_load_get(l, pod, rank, &s) != 0)
        return;
    put_num(b, ",\"load\":{\"waiting\":", s.waiting);
    put_num(b, ",\"running\":", s.running);
    put_num(b, ",\"kv_usage\":", s.kv_usage);
    n = snprintf(tmp, sizeof(tmp), ",\"age_ms\":%" PRIu64 ",\"stale\":%s}",
                 s.age_ns / 1000000u, s.stale ? "true" : "false");
    if (n > 0)
        kvr_buf_append(b, tmp, (size_t)n);
}

/* ---- /metrics ----------------------------------------------------------------------------- */

struct render {
    struct kvr_buf *b;
    int family; /* which per-worker gauge is being written */
    bool first;
};

static const struct {
    const char *name, *help;
} worker_gauges[] = {
    {"load_waiting_requests", "Requests waiting in the engine's queue, as last scraped"},
    {"load_running_requests", "Requests in the engine's running batch, as last scraped"},
    {"load_kv_cache_usage_ratio", "KV-cache usage (0..1) reported by the engine, as last scraped"},
    {"load_sample_age_seconds", "Age of the worker's last scraped sample"},
    {"load_stale", "1 when the worker's last sample is older than [load] stale_after"},
};

static void render_worker(void *arg, const char *pod, uint32_t rank,
                          const struct kvr_load_sample *s)
{
    struct render *r = arg;
    char esc[2 * KVR_NAME_MAX + 8], lab[2 * KVR_NAME_MAX + 48];
    double v;

    switch (r->family) {
    case 0: v = s->waiting; break;
    case 1: v = s->running; break;
    case 2: v = s->kv_usage; break;
    case 3: v = (double)s->age_ns / 1e9; break;
    default: v = s->stale ? 1.0 : 0.0; break;
    }
    if (v < 0)
        return; /* not exported by this engine */
    kvr_metrics_label_escape(esc, sizeof(esc), pod);
    snprintf(lab, sizeof(lab), "pod=\"%s\",dp_rank=\"%" PRIu32 "\"", esc, rank);
    kvr_metrics_gauge(r->b, worker_gauges[r->family].name,
                      r->first ? worker_gauges[r->family].help : NULL, lab, v);
    r->first = false;
}

void kvr_load_metrics(struct kvr_load *l, struct kvr_buf *b)
{
    struct render r = {.b = b};
    char lab[48];

    if (l == NULL)
        return;
    for (int i = 0; i < NRESULTS; i++) {
        snprintf(lab, sizeof(lab), "result=\"%s\"", result_names[i]);
        kvr_metrics_counter(b, "load_scrapes_total",
                            i == 0 ? "Scrapes of the engines' metrics endpoints, by result" : NULL,
                            lab, KVR_CNT_GET(l->results[i]));
    }
    kvr_metrics_hist(b, "load_scrape_duration_seconds",
                     "Duration of a scrape (request to last byte or failure)", NULL, &l->duration);
    kvr_metrics_gauge(b, "load_targets", "Metrics URLs being scraped", NULL,
                      (double)KVR_CNT_GET(l->g_targets));
    kvr_metrics_gauge(b, "load_targets_stale",
                      "Metrics URLs without a good answer within [load] stale_after", NULL,
                      (double)KVR_CNT_GET(l->g_stale));
    kvr_metrics_gauge(b, "load_targets_refused",
                      "Workers not scraped at the last refresh: a pod id that cannot go into a "
                      "URL, or past [load] max_targets",
                      "reason=\"bad_pod\"", (double)KVR_CNT_GET(l->g_bad_pod));
    kvr_metrics_gauge(b, "load_targets_refused", NULL, "reason=\"too_many\"",
                      (double)KVR_CNT_GET(l->g_too_many));
    kvr_metrics_counter(b, "load_workers_refused_total",
                        "Scraped (pod, dp_rank) figures not kept: past [load] max_targets", NULL,
                        KVR_CNT_GET(l->workers_refused));
    kvr_metrics_counter(b, "load_malformed_lines_total",
                        "Lines of scraped answers refused as malformed", NULL,
                        KVR_CNT_GET(l->malformed));
    kvr_metrics_counter(b, "load_ignored_samples_total",
                        "Scraped samples not used: NaN, infinite or negative values, bad ranks",
                        NULL, KVR_CNT_GET(l->ignored));
    for (r.family = 0; r.family < (int)(sizeof(worker_gauges) / sizeof(worker_gauges[0]));
         r.family++) {
        r.first = true;
        kvr_load_foreach(l, render_worker, &r);
    }
}
