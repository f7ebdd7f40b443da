/* main.c — kvrouterd entry point. Wiring only: argv, config, logging, signal mask, modules
 * created in order and stopped in reverse, the signal wait loop. Everything a test would want
 * to reach lives in src/ (conf, daemon, notify, and the modules).
 *
 * Threads: the main thread blocks SIGTERM/SIGINT/SIGHUP before any module starts a thread
 * (so all threads inherit the mask), then waits for them in kvr_daemon_wait().
 *
 * Adding a module: a field in struct app, a create/start step in app_start() (logging and
 * returning on failure; app_stop() must cope with a partially started app), the reverse step
 * in app_stop(), and its listeners in the ready line in app_ready().
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/conf.h"
#include "daemon/daemon.h"
#include "http/http.h"
#include "index/index.h"
#include "events/ingest.h"
#include "load/load.h"
#include "core/log.h"
#include "core/modelfilter.h"
#include "core/notify.h"
#include "route/score.h"
#include "route/share.h"
#include "state/snap.h"
#include "route/route.h"
#include "text/tokset.h"
#include "events/zsub.h"

#ifndef KVR_DEFAULT_CONF
#define KVR_DEFAULT_CONF "/etc/kvrouterd/kvrouterd.conf"
#endif

struct app {
    struct kvr_conf conf;     /* live configuration (reloadable parts change on SIGHUP) */
    struct kvr_notify notify;
    sigset_t sigs;
    struct kvr_index *index;
    struct kvr_score *score;
    struct kvr_ingest *ingest; /* owns the writer queues */
    struct kvr_zsub *zsub;     /* produces into them */
    struct kvr_http *http;
    struct kvr_snap *snap;     /* snapshots ([state]): periodic thread, GET /v1/snapshot */
    struct kvr_tokset *tokset; /* [model] tokenizers; reloaded on SIGHUP */
    struct kvr_route *route;   /* [route]: decisions and tracked loads */
    struct kvr_load *load;     /* [load]: the engines' own /metrics (its own thread) */
    struct kvr_share *share;   /* [route] peer_bind/peers: replicas share decisions */
    struct kvr_modelfilter *models; /* [events] models: read by zsub and http; SIGHUP */
    bool running;              /* app_start succeeded: a shutdown snapshot is worth writing */
};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: kvrouterd [-c FILE] [-t]\n"
            "KV-cache-aware router: indexes vLLM KV-cache events, scores prompts over HTTP.\n"
            "\n"
            "  -c, --config FILE  configuration file (default " KVR_DEFAULT_CONF ")\n"
            "  -t, --test         check the configuration and exit (0 ok, 1 with FILE:LINE: error)\n"
            "      --version      print the version and exit\n"
            "  -h, --help         print this help and exit\n"
            "\n"
            "Signals: SIGTERM/SIGINT stop gracefully; SIGHUP reloads [log], [score], [route],\n"
            "[load], [http] admin_token, [index] max_memory, [events] models and the [model]\n"
            "sections (changed tokenizers are loaded).\n");
}

/* kvrouterd -t: advice that does not fail the check. */
static void check_warn(void *arg, const char *msg)
{
    (void)arg;
    fprintf(stderr, "%s\n", msg);
}

/* Reload hook: push reloadable settings into running modules. */
static void app_reloaded(void *arg, const struct kvr_conf *live)
{
    struct app *a = arg;

    if (a->score != NULL)
        kvr_score_set_weights(a->score, live);
    if (a->ingest != NULL) {
        kvr_ingest_set_max_memory(a->ingest, live->max_memory > 0 ? (uint64_t)live->max_memory : 0);
        kvr_ingest_set_assume_limits(a->ingest, live->route_assumed_ttl_ms,
                                     live->route_assumed_max_blocks);
        kvr_ingest_set_predict_ttl(a->ingest, live->route_predicted_ttl_ms);
    }
    if (a->http != NULL && kvr_http_set_admin_token(a->http, live->admin_token) != 0)
        kvr_log_error("reload: out of memory setting [http] admin_token (the old one stays)");
    if (a->route != NULL)
        kvr_route_set_conf(a->route, live);
    if (a->load != NULL) {
        struct kvr_err err;
        if (kvr_load_set_conf(a->load, live, &err) != 0)
            kvr_log_error("reload: [load]: %s", err.msg);
        if (kvr_daemon_load_fixed(a->load, live) != 0)
            kvr_log_error("reload: out of memory setting the approximate_pods to scrape");
    }
    if (a->models != NULL) {
        struct kvr_err err;
        if (kvr_modelfilter_set(a->models, live->events_models, &err) != 0)
            kvr_log_error("reload: [events] models: %s (the previous list stays)", err.msg);
    }
    if (a->tokset != NULL) {
        struct kvr_err err;
        size_t n = 0;
        /* failures are logged per model by tokset (the model keeps its tokenizer) */
        if (kvr_tokset_reload(a->tokset, live, &n, &err) == 0 && n > 0)
            kvr_log_info("reload: %zu tokenizer(s) loaded", n);
    }
}

/* An ingest writer stored blocks: route's prefills on that worker may be done. */
static void stored_blocks(void *arg, const char *pod, uint32_t dp_rank, const uint64_t *content,
                          size_t n)
{
    kvr_route_confirm(arg, pod, dp_rank, content, n);
}

static int app_start(struct app *a, struct kvr_err *err)
{
    struct kvr_index_opts io = {
        .jump_stride = a->conf.jump_stride,
        .max_workers = a->conf.max_workers,
        .orphan_capacity = a->conf.orphan_capacity,
        .max_query_blocks = a->conf.max_query_tokens, /* a block holds at least one token */
    };
    struct kvr_snap_boot_opts bo = {.dir = a->conf.state_dir, .bootstrap = a->conf.bootstrap,
                                    .token = a->conf.admin_token,
                                    .timeout_ms = a->conf.bootstrap_timeout_ms, .index = io};
    struct kvr_snap_opts so;
    struct kvr_snap_boot boot;
    struct kvr_http_deps hd;
    struct kvr_load_opts lo;
    int rc;

    /* tokenizers first: a bad file fails startup before anything binds */
    rc = kvr_tokset_create(&a->conf, &a->tokset, err);
    if (rc != 0)
        return rc;
    rc = kvr_route_create(&a->conf, &a->route);
    if (rc != 0)
        return kvr_err_set(err, rc, "route: %s", strerror(-rc));
    rc = kvr_index_create(&io, &a->index);
    if (rc != 0)
        return kvr_err_set(err, rc, "index: %s", strerror(-rc));
    /* the newest valid snapshot (local or a peer's), before anything reads or writes the
     * index; may replace a->index by a fresh one when a restore fails midway */
    rc = kvr_snap_boot(&bo, &a->index, &boot, err);
    if (rc != 0)
        return rc;
    rc = kvr_score_create(a->index, &a->conf, &a->score);
    if (rc == 0)
        rc = kvr_ingest_create(&a->conf, a->index, &a->ingest, err);
    else
        kvr_err_set(err, rc, "score: %s", strerror(-rc));
    if (rc == 0 && boot.loaded.nstreams > 0) {
        int sr = kvr_ingest_restore_streams(a->ingest, boot.loaded.streams, boot.loaded.nstreams);
        if (sr != 0)
            kvr_log_error("snapshot: its streams could not all be restored (%s); those not "
                          "restored start afresh with their next batch", strerror(-sr));
    }
    kvr_snap_boot_free(&boot);
    if (rc != 0)
        return rc;
    so = (struct kvr_snap_opts){.dir = a->conf.state_dir,
                                .interval_ms = a->conf.snapshot_interval_ms,
                                .index = a->index, .ingest = a->ingest, .rec = boot.rec};
    rc = kvr_snap_create(&so, &a->snap, err);
    if (rc != 0)
        return rc;
    rc = kvr_modelfilter_create(a->conf.events_models, &a->models, err); /* checked by conf */
    if (rc != 0)
        return rc;
    rc = kvr_daemon_zsub_create(&a->conf, a->models, a->ingest, &a->zsub, err); /* binds */
    if (rc != 0)
        return rc;
    kvr_ingest_set_store_hook(a->ingest, stored_blocks, a->route);
    rc = kvr_ingest_start(a->ingest, err);
    if (rc != 0)
        return rc;
    rc = kvr_zsub_start(a->zsub, err);
    if (rc != 0)
        return rc;
    rc = kvr_snap_start(a->snap, err);
    if (rc != 0)
        return rc;
    lo = (struct kvr_load_opts){.conf = &a->conf, .list_pods = kvr_daemon_load_list,
                                .list_arg = a->ingest};
    rc = kvr_load_create(&lo, &a->load, err);
    if (rc == 0 && (rc = kvr_daemon_load_fixed(a->load, &a->conf)) != 0)
        kvr_err_set(err, rc, "load: out of memory");
    if (rc == 0)
        rc = kvr_load_start(a->load, err); /* a thread only when [load] metrics_url is set */
    if (rc != 0)
        return rc;
    kvr_route_set_load_source(a->route, kvr_daemon_route_load, a->load); /* before http */
    if ((a->conf.route_peer_bind != NULL && a->conf.route_peer_bind[0] != '\0') ||
        (a->conf.route_peers != NULL && a->conf.route_peers[0] != '\0')) {
        rc = kvr_share_create(a->route, a->conf.route_peer_bind, a->conf.route_peers,
                              &a->share, err);
        if (rc == 0)
            rc = kvr_share_start(a->share, err);
        if (rc != 0)
            return rc;
        kvr_route_set_share(a->route, kvr_share_publish, a->share);
    }
    hd = (struct kvr_http_deps){.conf = &a->conf, .score = a->score, .ingest = a->ingest,
                                .zsub = a->zsub, .index = a->index, .snap = a->snap,
                                .tokset = a->tokset, .route = a->route, .load = a->load,
                                .share = a->share, .models = a->models};
    rc = kvr_http_create(&hd, &a->http, err);
    if (rc != 0)
        return rc;
    rc = kvr_http_start(a->http, err);
    if (rc == 0)
        a->running = true;
    return rc;
}

/* Reverse order; copes with a partially started app. Readiness drops first. */
static void app_stop(struct app *a)
{
    if (a->http != NULL) {
        kvr_http_set_ready(a->http, false);
        kvr_http_stop(a->http); /* finishes responses being written */
        kvr_http_destroy(a->http);
        a->http = NULL;
    }
    if (a->route != NULL) {
        kvr_route_set_load_source(a->route, NULL, NULL); /* no decision runs any more */
        kvr_route_set_share(a->route, NULL, NULL);
    }
    kvr_share_destroy(a->share); /* sends what is queued, stops its thread */
    a->share = NULL;
    kvr_load_destroy(a->load); /* stops its thread; before ingest, which its listing reads */
    a->load = NULL;
    kvr_snap_stop(a->snap); /* the periodic thread (finishes a snapshot being written) */
    if (a->zsub != NULL)
        kvr_zsub_stop(a->zsub); /* intake ends: nothing is queued after this */
    if (a->ingest != NULL)
        kvr_ingest_stop(a->ingest); /* drains: every received batch is applied */
    if (a->snap != NULL && a->running && a->conf.state_dir != NULL &&
        a->conf.state_dir[0] != '\0') {
        struct kvr_err err;
        if (kvr_snap_save(a->snap, &err) != 0) /* after the drain: the last batch is in */
            kvr_log_error("shutdown %s", err.msg);
    }
    kvr_snap_destroy(a->snap);
    a->snap = NULL;
    if (a->ingest != NULL) {
        kvr_ingest_destroy(a->ingest); /* before zsub: its streams point at zsub's topics */
        a->ingest = NULL;
    }
    if (a->zsub != NULL) {
        kvr_zsub_destroy(a->zsub);
        a->zsub = NULL;
    }
    if (a->score != NULL) {
        kvr_score_destroy(a->score);
        a->score = NULL;
    }
    if (a->index != NULL) {
        kvr_index_destroy(a->index);
        a->index = NULL;
    }
    kvr_tokset_destroy(a->tokset); /* after http: its loop threads held the readers */
    a->tokset = NULL;
    kvr_route_destroy(a->route);
    a->route = NULL;
    kvr_modelfilter_destroy(a->models); /* after zsub and http, its readers */
    a->models = NULL;
}

static void app_ready(struct app *a)
{
    struct kvr_daemon_listeners l = {0};
    char http[300], admin[300];
    const char *events[64];

    if (a->zsub != NULL) {
        l.nevents = kvr_zsub_bound(a->zsub, events, 64);
        l.events = events;
    }

    if (a->http != NULL) {
        kvr_daemon_hostport(http, sizeof(http), a->conf.listen, kvr_http_port(a->http));
        l.http = http;
        if (kvr_http_admin_port(a->http) != 0) {
            kvr_daemon_hostport(admin, sizeof(admin), a->conf.admin_listen,
                                kvr_http_admin_port(a->http));
            l.admin = admin;
        }
        kvr_http_set_ready(a->http, true);
    }
    kvr_daemon_log_ready(&l);
    kvr_notify_ready(&a->notify, "ready");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"test", no_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    const char *conf_path = KVR_DEFAULT_CONF;
    struct app a;
    struct kvr_err err;
    struct kvr_daemon_loop loop;
    bool check_only = false;
    int opt, rc, status = 1;

    memset(&a, 0, sizeof(a));
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":c:th", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            conf_path = optarg;
            break;
        case 't':
            check_only = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("kvrouterd %s (%s)\n", KVR_VERSION, KVR_GIT_REV);
            return 0;
        case ':':
            fprintf(stderr, "kvrouterd: option requires an argument -- '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        default:
            fprintf(stderr, "kvrouterd: unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "kvrouterd: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    rc = kvr_conf_load(conf_path, &a.conf, &err);
    if (check_only) {
        if (rc == 0 && (rc = kvr_daemon_check(&a.conf, &err, check_warn, NULL)) != 0)
            kvr_conf_free(&a.conf);
        if (rc != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        fprintf(stderr, "kvrouterd: configuration file %s is valid\n", conf_path);
        kvr_conf_free(&a.conf);
        return 0;
    }
    if (rc != 0) {
        kvr_log_error("configuration: %s", err.msg);
        return 1;
    }
    kvr_log_configure((enum kvr_log_level)a.conf.log_level,
                      (enum kvr_log_format)a.conf.log_format);

    /* Before any thread exists: every thread inherits this mask. */
    if (kvr_daemon_block_signals(&a.sigs, &err) != 0) {
        kvr_log_error("%s", err.msg);
        goto out_conf;
    }
    if (kvr_notify_init(&a.notify, &err) != 0)
        kvr_log_warn("systemd notification disabled: %s", err.msg);

    kvr_log_info("kvrouterd %s (%s) starting with %s", KVR_VERSION, KVR_GIT_REV, conf_path);
    if (app_start(&a, &err) != 0) {
        kvr_log_error("startup failed: %s", err.msg);
        app_stop(&a);
        goto out_notify;
    }
    app_ready(&a);

    loop = (struct kvr_daemon_loop){
        .conf_path = conf_path,
        .live = &a.conf,
        .notify = &a.notify,
        .sigs = &a.sigs,
        .on_reload = app_reloaded,
        .arg = &a,
    };
    kvr_daemon_wait(&loop);

    kvr_notify_stopping(&a.notify);
    /* Modules drain within shutdown_timeout; the guard ends a hung shutdown. */
    kvr_daemon_shutdown_guard(a.conf.shutdown_timeout_ms + 10000);
    app_stop(&a);
    status = 0;
    kvr_log_info("kvrouterd stopped");
out_notify:
    kvr_notify_deinit(&a.notify);
out_conf:
    kvr_conf_free(&a.conf);
    return status;
}
