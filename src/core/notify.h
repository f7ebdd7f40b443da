/* notify.h — the systemd service notification protocol (sd_notify(3)), without libsystemd.
 *
 * When systemd starts a Type=notify service it passes NOTIFY_SOCKET (a filesystem path, or
 * '@' for the abstract namespace) and, with WatchdogSec=, WATCHDOG_USEC and WATCHDOG_PID.
 * kvr_notify_init() reads them; every send is then one datagram of "KEY=VALUE\n" lines on an
 * AF_UNIX SOCK_DGRAM socket. Without NOTIFY_SOCKET every call is a successful no-op, so the
 * daemon runs the same way in a terminal, in Docker and under systemd.
 *
 * Ownership: struct kvr_notify lives in caller storage (init/deinit). Threads: a kvr_notify
 * is used by one thread (the daemon main thread); sends are single sendto() calls.
 */
#ifndef KVR_NOTIFY_H
#define KVR_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "core/err.h"

struct kvr_notify {
    int fd;                   /* -1 when disabled */
    struct sockaddr_un addr;
    socklen_t addrlen;
    uint64_t watchdog_usec;   /* 0 when no watchdog was requested for this process */
};

/* From the environment (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID). Returns 0 (also when
 * notification is disabled), or a negative errno with the reason in err when NOTIFY_SOCKET is
 * set but unusable (the caller may log and continue: n is then disabled). */
int kvr_notify_init(struct kvr_notify *n, struct kvr_err *err);

/* Same from explicit values (tests): socket may be NULL; wd_usec/wd_pid may be NULL; pid is
 * compared with WATCHDOG_PID (a watchdog meant for another process is ignored). */
int kvr_notify_init_from(struct kvr_notify *n, const char *socket, const char *wd_usec,
                         const char *wd_pid, pid_t pid, struct kvr_err *err);

void kvr_notify_deinit(struct kvr_notify *n);

bool kvr_notify_enabled(const struct kvr_notify *n);

/* Sends a raw state string ("READY=1\nSTATUS=..."); 0 or negative errno. */
int kvr_notify_send(struct kvr_notify *n, const char *state);

/* READY=1 with an optional STATUS= text. */
int kvr_notify_ready(struct kvr_notify *n, const char *status);
/* RELOADING=1 plus MONOTONIC_USEC=<CLOCK_MONOTONIC now> (required by systemd >= 253 for
 * Type=notify-reload, ignored by older versions). */
int kvr_notify_reloading(struct kvr_notify *n);
int kvr_notify_stopping(struct kvr_notify *n);
int kvr_notify_watchdog(struct kvr_notify *n);
int kvr_notify_status(struct kvr_notify *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Watchdog interval requested by the service manager in µs; 0 when none. Ping at half. */
uint64_t kvr_notify_watchdog_usec(const struct kvr_notify *n);

#endif
