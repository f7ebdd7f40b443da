/* daemon.c — main-thread plumbing: signal mask, wait loop, reload, ready line, shutdown guard.
 *
 * Signal model: SIGTERM, SIGINT and SIGHUP are blocked in the main thread before any other
 * thread is created, so every thread inherits the mask and no thread is ever interrupted by
 * them; the main thread collects them synchronously with sigtimedwait(). The wait uses a
 * bounded tick (half the systemd watchdog interval, at most 1 s) so watchdog pings are sent
 * on time and the loop never blocks forever.
 *
 * Reload: parse the whole file into a fresh struct first; only when it is valid are the
 * reloadable directives copied onto the live config (kvr_conf_apply_reload). A broken file
 * leaves everything as it was and is logged with its FILE:LINE.
 *
 * Event wiring (kvr_daemon_zsub_create): the [events] settings as zsub's options, and two
 * small adapters from ingest's intake interface to zsub, so that neither module includes
 * the other; main only calls it in order.
 */
#include "daemon/daemon.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/log.h"
#include "events/queue_msg.h"
#include "state/snap.h"
#include "text/tokset.h"

void kvr_daemon_format_ready(struct kvr_buf *b, const struct kvr_daemon_listeners *l)
{
    kvr_buf_printf(b, "kvrouterd ready version=%s", KVR_VERSION);
    if (l->http != NULL)
        kvr_buf_printf(b, " http=%s", l->http);
    if (l->admin != NULL)
        kvr_buf_printf(b, " admin=%s", l->admin);
    if (l->nevents > 0) {
        kvr_buf_printf(b, " events=");
        for (size_t i = 0; i < l->nevents; i++)
            kvr_buf_printf(b, "%s%s", i ? "," : "", l->events[i]);
    }
}

void kvr_daemon_log_ready(const struct kvr_daemon_listeners *l)
{
    struct kvr_buf b;

    kvr_buf_init(&b);
    kvr_daemon_format_ready(&b, l);
    if (b.oom || b.data == NULL)
        kvr_log_info("kvrouterd ready version=%s", KVR_VERSION);
    else
        kvr_log_info("%s", b.data);
    kvr_buf_free(&b);
}

void kvr_daemon_hostport(char *buf, size_t cap, const char *conf_listen, int port)
{
    char host[256];
    int p;

    if (conf_listen == NULL || kvr_conf_parse_hostport(conf_listen, host, sizeof(host), &p) != 0) {
        snprintf(buf, cap, "%s", conf_listen ? conf_listen : "?");
        return;
    }
    if (strchr(host, ':') != NULL)
        snprintf(buf, cap, "[%s]:%d", host, port);
    else
        snprintf(buf, cap, "%s:%d", host, port);
}

/* Never runs while the signals are blocked; installed so that, as PID 1 of a container
 * (where the kernel discards signals left at SIG_DFL), SIGTERM is never dropped. */
static void noop_handler(int sig)
{
    (void)sig;
}

int kvr_daemon_block_signals(sigset_t *set, struct kvr_err *err)
{
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
    struct sigaction sa;
    int rc;

    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
    rc = pthread_sigmask(SIG_BLOCK, set, NULL);
    if (rc != 0)
        return kvr_err_set(err, -rc, "pthread_sigmask: %s", strerror(rc));
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = noop_handler;
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        if (sigaction(sigs[i], &sa, NULL) != 0) {
            rc = -errno;
            return kvr_err_set(err, rc, "sigaction(%d): %s", sigs[i], strerror(-rc));
        }
    }
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPIPE, &sa, NULL) != 0) {
        rc = -errno;
        return kvr_err_set(err, rc, "sigaction(SIGPIPE): %s", strerror(-rc));
    }
    return 0;
}

int kvr_daemon_reload(struct kvr_daemon_loop *l)
{
    struct kvr_conf fresh;
    struct kvr_err err, changed, ignored;
    enum kvr_log_level old_level = (enum kvr_log_level)l->live->log_level;
    int rc, n;
    bool logged = false;

    rc = kvr_conf_load(l->conf_path, &fresh, &err);
    if (rc != 0) {
        kvr_log_error("reload failed: %s (keeping the previous configuration)", err.msg);
        return rc;
    }
    n = kvr_conf_apply_reload(l->live, &fresh, &changed, &ignored);
    kvr_conf_free(&fresh);
    /* Modules take the new settings before "reload ok" is written: whoever waits for that
     * line (an operator, a test) must see them in effect. */
    if (l->on_reload != NULL)
        l->on_reload(l->arg, l->live);
    /* The result line must be visible under the more verbose of the old and new levels, so
     * it is written before the switch when the level goes down, after it otherwise. It is
     * the reload's last line: whoever waits for it (an operator, a test taking a log mark)
     * has every line the reload writes. */
    if (l->live->log_level < (int)old_level) {
        if (ignored.msg[0] != '\0')
            kvr_log_warn("reload: changes to %s need a restart and were not applied", ignored.msg);
        if (n > 0)
            kvr_log_info("reload ok: changed %s", changed.msg);
        else
            kvr_log_info("reload ok: no changes");
        logged = true;
    }
    kvr_log_configure((enum kvr_log_level)l->live->log_level,
                      (enum kvr_log_format)l->live->log_format);
    if (!logged) {
        if (ignored.msg[0] != '\0')
            kvr_log_warn("reload: changes to %s need a restart and were not applied", ignored.msg);
        kvr_log_debug("reload: log level is now %s",
                      kvr_log_level_name((enum kvr_log_level)l->live->log_level));
        if (n > 0)
            kvr_log_info("reload ok: changed %s", changed.msg);
        else
            kvr_log_info("reload ok: no changes");
    }
    return 0;
}

int kvr_daemon_wait(struct kvr_daemon_loop *l)
{
    uint64_t wd = kvr_notify_watchdog_usec(l->notify);
    int64_t tick_ms = 1000, next_ping = 0;

    if (wd > 0) {
        tick_ms = (int64_t)(wd / 2000);
        if (tick_ms < 1)
            tick_ms = 1;
        if (tick_ms > 1000)
            tick_ms = 1000;
        kvr_log_debug("systemd watchdog: %llu us, pinging every %llu us",
                      (unsigned long long)wd, (unsigned long long)(wd / 2));
    }
    for (;;) {
        struct timespec ts;
        siginfo_t si;
        int sig;
        int64_t now = kvr_now_ms();

        if (wd > 0 && now >= next_ping) {
            kvr_notify_watchdog(l->notify);
            next_ping = now + (int64_t)(wd / 2000);
        }
        ts.tv_sec = tick_ms / 1000;
        ts.tv_nsec = (tick_ms % 1000) * 1000000L;
        sig = sigtimedwait(l->sigs, &si, &ts);
        if (sig < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            kvr_log_error("sigtimedwait: %s", strerror(errno));
            return SIGTERM;
        }
        switch (sig) {
        case SIGTERM:
        case SIGINT:
            kvr_log_info("received %s, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            return sig;
        case SIGHUP:
            kvr_log_info("received SIGHUP, reloading %s", l->conf_path);
            kvr_notify_reloading(l->notify);
            if (kvr_daemon_reload(l) == 0)
                kvr_notify_ready(l->notify, "reloaded");
            else
                kvr_notify_ready(l->notify, "reload failed; running with the previous "
                                            "configuration");
            break;
        default:
            break;
        }
    }
}

static void *guard_main(void *arg)
{
    int64_t ms = (int64_t)(intptr_t)arg;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    kvr_log_error("shutdown did not finish within %lld ms; exiting", (long long)ms);
    _exit(1);
    return NULL;
}

int kvr_daemon_shutdown_guard(int64_t ms)
{
    pthread_t t;
    pthread_attr_t a;
    int rc;

    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&t, &a, guard_main, (void *)(intptr_t)ms);
    pthread_attr_destroy(&a);
    return -rc;
}

/* ---- event pipeline wiring -------------------------------------------------------------- */

static int intake_replay(void *arg, const struct kvr_queue_replay_req *r)
{
    return kvr_zsub_replay(arg, r);
}

static int intake_forget(void *arg, const struct kvr_queue_topic *t)
{
    return kvr_zsub_forget_topic(arg, t);
}

static bool intake_running(void *arg)
{
    return kvr_zsub_running(arg);
}

/* The replay address templates ([events] bind_replay, connect replay=...{pod}...), at their
 * line: zsub owns their syntax (conf stays socket-free and does not use zsub). */
static int check_templates(const struct kvr_conf *c, struct kvr_err *err)
{
    struct kvr_err e;
    int rc;

    if (c->bind_replay != NULL && (rc = kvr_zsub_template_check(c->bind_replay, &e)) != 0)
        return kvr_err_set(err, rc, "%s:%d: [events] bind_replay %s: %s", c->path,
                           c->bind_replay_line, c->bind_replay, e.msg);
    for (size_t i = 0; i < c->nconnect; i++) {
        const char *t = c->connect[i].replay;
        if (t != NULL && strchr(t, '{') != NULL && (rc = kvr_zsub_template_check(t, &e)) != 0)
            return kvr_err_set(err, rc, "%s:%d: [events] connect %s replay=%s: %s", c->path,
                               c->connect[i].line, c->connect[i].endpoint, t, e.msg);
    }
    return 0;
}

int kvr_daemon_zsub_create(const struct kvr_conf *c, const struct kvr_modelfilter *models,
                           struct kvr_ingest *ing,
                           struct kvr_zsub **out, struct kvr_err *err)
{
    struct kvr_ingest_intake in;
    struct kvr_zsub_opts zo;
    struct kvr_zsub_curve curve;
    struct kvr_zsub *z;
    uint32_t n;
    int rc;

    *out = NULL;
    memset(&zo, 0, sizeof(zo));
    memset(&curve, 0, sizeof(curve));
    zo.subscribe = c->subscribe ? c->subscribe : "kv@";
    zo.rcvhwm = c->rcvhwm;
    zo.max_message_size = c->max_message_size;
    zo.reconnect_ivl_ms = c->reconnect_interval_ms;
    zo.reconnect_ivl_max_ms = c->reconnect_interval_max_ms;
    zo.purge_after_disconnect_ms = c->purge_after_disconnect_ms;
    zo.replay_timeout_ms = c->replay_timeout_ms > 0 ? c->replay_timeout_ms : 2000;
    /* max_concurrent_replays = 0 disables replay (streams never ask); zsub needs >= 1 slot. */
    zo.max_concurrent_replays = c->max_concurrent_replays ? c->max_concurrent_replays : 1;
    zo.max_topics = c->max_workers ? c->max_workers : 16384;
    zo.ratelimit_ms = c->log_ratelimit_ms;
    zo.ratelimit_burst = c->log_ratelimit_burst;
    zo.queues = kvr_ingest_queues(ing, &n);
    zo.nshards = n;
    zo.allow = c->allow;
    zo.nallow = c->nallow;
    zo.pod_must_match_peer = c->pod_must_match_peer;
    zo.bind_replay = c->bind_replay;
    zo.models = models;
    if ((rc = check_templates(c, err)) != 0)
        return rc;
    if (c->curve_secret_key_file != NULL) {
        rc = kvr_zsub_curve_load(c->curve_secret_key_file, c->curve_public_key_file,
                                 c->curve_authorized_keys_file, &curve, err);
        if (rc != 0)
            return rc;
        zo.curve = &curve;
    }
    rc = kvr_zsub_create(&zo, &z, err);
    kvr_zsub_curve_free(&curve); /* zsub keeps its own copy */
    memset(&curve, 0, sizeof(curve));
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < c->nbind; i++) {
        rc = kvr_zsub_bind(z, c->bind[i], err);
        if (rc != 0)
            goto fail;
    }
    for (size_t i = 0; i < c->nconnect; i++) {
        rc = kvr_zsub_connect(z, c->connect[i].endpoint, c->connect[i].replay,
                              c->connect[i].pod, true, err);
        if (rc != 0)
            goto fail;
    }
    if (c->forward != NULL && (rc = kvr_zsub_forward(z, c->forward, err)) != 0)
        goto fail;
    in = (struct kvr_ingest_intake){.replay = intake_replay, .running = intake_running,
                                    .forget = intake_forget, .arg = z};
    kvr_ingest_set_intake(ing, &in);
    *out = z;
    return 0;
fail:
    kvr_zsub_destroy(z);
    return rc;
}

/* ---- kvrouterd -t: what startup would resolve ------------------------------------------ */

int kvr_daemon_check(const struct kvr_conf *c, struct kvr_err *err,
                     void (*warn)(void *arg, const char *msg), void *arg)
{
    struct kvr_err e;
    int rc;

    if ((rc = check_templates(c, err)) != 0)
        return rc;
    for (size_t i = 0; i < c->nbind; i++) {
        rc = kvr_zsub_check_bind(c->bind[i], &e);
        if (rc != 0)
            return kvr_err_set(err, rc, "%s:%d: [events] bind %s: %s", c->path,
                               c->bind_line != NULL ? c->bind_line[i] : 0, c->bind[i], e.msg);
    }
    if (c->forward != NULL && (rc = kvr_zsub_check_bind(c->forward, &e)) != 0)
        return kvr_err_set(err, rc, "%s:%d: [events] forward %s: %s", c->path, c->forward_line,
                           c->forward, e.msg);
    if (c->curve_secret_key_file != NULL) {
        struct kvr_zsub_curve k;
        rc = kvr_zsub_curve_load(c->curve_secret_key_file, c->curve_public_key_file,
                                 c->curve_authorized_keys_file, &k, &e);
        if (rc != 0) {
            /* The line of the file the message names. */
            int line = c->curve_secret_key_line;
            if (strncmp(e.msg, "curve_public", 12) == 0)
                line = c->curve_public_key_line;
            else if (strncmp(e.msg, "curve_authorized", 16) == 0)
                line = c->curve_authorized_keys_line;
            return kvr_err_set(err, rc, "%s:%d: [events] %s", c->path, line, e.msg);
        }
        memset(k.secret, 0, sizeof(k.secret));
        kvr_zsub_curve_free(&k);
    }
    if ((rc = kvr_tokset_check(c, err)) != 0)
        return rc;
    if (c->state_dir != NULL && c->state_dir[0] != '\0') {
        rc = kvr_snap_check_dir(c->state_dir, false, &e);
        if (rc < 0)
            return kvr_err_set(err, rc, "%s:%d: [state] dir: %s", c->path, c->state_dir_line,
                               e.msg);
        if (rc == 1 && warn != NULL) {
            char m[KVR_ERR_MSG_MAX + 4200];
            snprintf(m, sizeof(m), "%s:%d: note: [state] dir %s does not exist yet; kvrouterd "
                                   "creates it (mode 0750) when it starts",
                     c->path, c->state_dir_line, c->state_dir);
            warn(arg, m);
        }
    }
    for (size_t i = 0; i < c->nconnect && warn != NULL; i++) {
        const char *eps[2] = {c->connect[i].endpoint, c->connect[i].replay};
        for (size_t j = 0; j < 2; j++) {
            char m[KVR_ERR_MSG_MAX + 600];
            if (eps[j] == NULL || strchr(eps[j], '{') != NULL || /* a template: checked */
                kvr_zsub_check_connect(eps[j], &e) == 0)
                continue;
            snprintf(m, sizeof(m), "%s: warning: [events] connect %s: %s (kvrouterd keeps "
                                   "retrying it)",
                     c->path, eps[j], e.msg);
            warn(arg, m);
        }
    }
    return 0;
}

/* ---- the load scraper's targets ------------------------------------------------------- */

static void load_stream(const struct kvr_stream_info *s, void *arg)
{
    if (s->pod != NULL && s->pod[0] != '\0')
        (void)kvr_load_list_add(arg, s->pod, s->dp_rank); /* ENOMEM: counted by load */
}

void kvr_daemon_load_list(void *arg, struct kvr_load_list *l)
{
    if (arg != NULL)
        kvr_ingest_streams(arg, load_stream, l);
}

int kvr_daemon_load_fixed(struct kvr_load *load, const struct kvr_conf *c)
{
    const char **pods;
    size_t n = 0, cap = 0;
    int rc;

    for (size_t i = 0; i < c->nmodels; i++)
        cap += c->models[i].napproximate_pods;
    pods = calloc(cap ? cap : 1, sizeof(*pods));
    if (pods == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < c->nmodels; i++) {
        for (size_t j = 0; j < c->models[i].napproximate_pods; j++) {
            const char *p = c->models[i].approximate_pods[j];
            size_t k = 0;
            while (k < n && strcmp(pods[k], p) != 0)
                k++;
            if (k == n)
                pods[n++] = p;
        }
    }
    rc = kvr_load_set_pods(load, pods, NULL, n);
    free(pods);
    return rc;
}

int kvr_daemon_route_load(void *arg, const char *pod, uint32_t dp_rank,
                          struct kvr_route_engine_load *out)
{
    struct kvr_load_sample s;

    if (kvr_load_get(arg, pod, dp_rank, &s) != 0 || (s.waiting < 0 && s.running < 0))
        return -ENOENT;
    out->waiting = s.waiting < 0 ? 0 : s.waiting;
    out->running = s.running < 0 ? 0 : s.running;
    out->kv_usage = s.kv_usage;
    out->sample_ns = (int64_t)s.at_ns; /* kvr_now_ns: CLOCK_MONOTONIC */
    out->stale = s.stale;
    return 0;
}
