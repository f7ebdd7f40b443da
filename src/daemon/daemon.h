/* daemon.h — process-level plumbing shared by daemon/main.c and the tests: signal mask, the
 * main-thread wait loop (SIGTERM/SIGINT stop, SIGHUP reload, systemd watchdog pings), the
 * reload procedure, the ready line and the shutdown guard.
 *
 * The ready line is a contract with the integration harness and with operators' log
 * scrapers: one INFO line "kvrouterd ready version=X [http=H:P] [admin=H:P] [events=E1,E2]",
 * keys present only for listeners that exist.
 *
 * Threads: everything here runs on the main thread, except the shutdown guard which runs on
 * its own detached thread.
 */
#ifndef KVR_DAEMON_H
#define KVR_DAEMON_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "core/conf.h"
#include "core/err.h"
#include "events/ingest.h"
#include "core/metrics.h"
#include "core/notify.h"
#include "events/zsub.h"
#include "load/load.h"
#include "route/route.h"

#ifndef KVR_VERSION
#define KVR_VERSION "0.0.0"
#endif
#ifndef KVR_GIT_REV
#define KVR_GIT_REV "unknown"
#endif

/* What is listening, for the ready line. NULL / 0 entries are left out. */
struct kvr_daemon_listeners {
    const char *http;           /* "HOST:PORT" as bound */
    const char *admin;          /* "HOST:PORT" as bound */
    const char *const *events;  /* bound/connected event endpoints */
    size_t nevents;
};

/* Renders "kvrouterd ready version=... http=... admin=... events=a,b" (no newline). */
void kvr_daemon_format_ready(struct kvr_buf *b, const struct kvr_daemon_listeners *l);
/* Logs the ready line at INFO. */
void kvr_daemon_log_ready(const struct kvr_daemon_listeners *l);

/* "HOST:PORT" from a configured listen address and the port actually bound (port 0 →
 * the real one); IPv6 hosts are bracketed. */
void kvr_daemon_hostport(char *buf, size_t cap, const char *conf_listen, int port);

/* Blocks SIGTERM, SIGINT, SIGHUP in the calling thread (call before any thread exists so all
 * threads inherit the mask), gives them a no-op handler (a container's PID 1 would otherwise
 * never see SIGTERM) and ignores SIGPIPE. Fills *set with the blocked set. */
int kvr_daemon_block_signals(sigset_t *set, struct kvr_err *err);

/* Called after a successful reload, with live already updated (e.g. push score weights). */
typedef void (*kvr_daemon_reload_cb)(void *arg, const struct kvr_conf *live);

struct kvr_daemon_loop {
    const char *conf_path;
    struct kvr_conf *live;        /* the running configuration (reloadable parts updated) */
    struct kvr_notify *notify;
    const sigset_t *sigs;         /* from kvr_daemon_block_signals */
    kvr_daemon_reload_cb on_reload;
    void *arg;
};

/* Re-reads conf_path. On success applies the reloadable directives to live, reconfigures
 * logging, calls on_reload and logs "reload ok: ..." (and a warning naming changed
 * directives that need a restart); on failure keeps live and logs
 * "reload failed: FILE:LINE: message". Returns 0 or the load error. */
int kvr_daemon_reload(struct kvr_daemon_loop *l);

/* Waits for signals until SIGTERM or SIGINT (returned), handling SIGHUP (RELOADING=1, reload,
 * READY=1) and sending WATCHDOG=1 every half watchdog interval. */
int kvr_daemon_wait(struct kvr_daemon_loop *l);

/* The event pipeline's wiring. Ownership: ingest owns the writer queues and consumes them;
 * zsub borrows them as its outputs and produces into them. Directions: zsub → queues →
 * ingest for batches (zsub never calls ingest); ingest → zsub only for replay requests,
 * through ingest's intake interface, which this wires to kvr_zsub_replay. Order: create
 * ingest, then this, then kvr_ingest_start and kvr_zsub_start; stop zsub, then ingest;
 * destroy ingest (it points at zsub's topics), then zsub.
 *
 * Creates zsub from [events]/[log] with ing's queues as outputs, binds and connects every
 * configured endpoint (the first failure is returned, with its endpoint in err, and nothing
 * is left created) and sets ing's intake to it. models: [events] models (NULL: all), borrowed
 * for zsub's life. */
struct kvr_modelfilter;
int kvr_daemon_zsub_create(const struct kvr_conf *c, const struct kvr_modelfilter *models,
                           struct kvr_ingest *ing,
                           struct kvr_zsub **out, struct kvr_err *err);

/* kvrouterd -t beyond parsing: resolves what startup resolves, without binding. Bind
 * endpoints as zmq_bind would (numeric address, '*' or an existing interface: "localhost" is
 * an error), the CURVE key files as zsub loads them. Errors are "FILE:LINE: ..." in err.
 * Connect hosts that do not resolve now are reported through warn (may be NULL), not as
 * errors: zmq_connect accepts them and keeps retrying, as the daemon does. */
int kvr_daemon_check(const struct kvr_conf *c, struct kvr_err *err,
                     void (*warn)(void *arg, const char *msg), void *arg);

/* The load scraper's targets (load.h). kvr_daemon_load_list is its list_pods callback with
 * arg = the struct kvr_ingest: every (pod, dp_rank) of the KV-event streams (restored ones
 * included: an engine that stopped publishing is still a candidate, and its scrapes say
 * whether it answers). kvr_daemon_load_fixed hands it the [model] approximate_pods of c
 * (rank 0, each pod once): at start and after a reload; main thread. 0 or -ENOMEM. */
void kvr_daemon_load_list(void *arg, struct kvr_load_list *l);
int kvr_daemon_load_fixed(struct kvr_load *load, const struct kvr_conf *c);
/* route's engine-load source (kvr_route_set_load_source) read from the scraper, arg = the
 * struct kvr_load: its sample of (pod, dp_rank) with its time and stale flag; a count the
 * engine does not export is 0, a usage it does not export -1; -ENOENT without a sample or
 * when the engine exports neither count. Takes load's mutex under route's (load never calls
 * route: no cycle). */
int kvr_daemon_route_load(void *arg, const char *pod, uint32_t dp_rank,
                          struct kvr_route_engine_load *out);

/* Starts a detached thread that ends the process with exit status 1 if shutdown has not
 * finished after ms milliseconds (a hung module must not keep a stopping service alive). */
int kvr_daemon_shutdown_guard(int64_t ms);

#endif
