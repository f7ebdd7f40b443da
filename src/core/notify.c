/* notify.c — sd_notify(3) implemented directly: one AF_UNIX datagram per state change.
 *
 * Protocol (systemd.io/NOTIFY, sd_notify(3)): NOTIFY_SOCKET names an AF_UNIX datagram socket,
 * either a path ("/run/systemd/notify") or an abstract name ("@/org/..." → leading NUL byte,
 * address length excludes the trailing NUL). Messages are newline-separated KEY=VALUE lines.
 * We only send; no credentials or fds are passed (systemd reads the sender pid from
 * SO_PASSCRED on its side, which is why NotifyAccess=main works with a plain sendto()).
 *
 * Invariants: fd == -1 means disabled and every send returns 0. The socket is CLOEXEC and
 * non-blocking: a full receive queue makes a send fail with -EAGAIN rather than stall the
 * main thread. Threads: owner thread only.
 */
#include "core/notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (s == NULL || *s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -EINVAL;
    *out = v;
    return 0;
}

int kvr_notify_init_from(struct kvr_notify *n, const char *socket_path, const char *wd_usec,
                         const char *wd_pid, pid_t pid, struct kvr_err *err)
{
    size_t len;
    uint64_t v;

    memset(n, 0, sizeof(*n));
    n->fd = -1;
    if (wd_usec != NULL && parse_u64(wd_usec, &v) == 0 && v > 0) {
        uint64_t p;
        if (wd_pid == NULL || (parse_u64(wd_pid, &p) == 0 && p == (uint64_t)pid))
            n->watchdog_usec = v;
    }
    if (socket_path == NULL || socket_path[0] == '\0')
        return 0;
    if (socket_path[0] != '/' && socket_path[0] != '@')
        return kvr_err_set(err, -EAFNOSUPPORT,
                           "NOTIFY_SOCKET=%s: only AF_UNIX paths and @abstract names are supported",
                           socket_path);
    len = strlen(socket_path);
    if (len >= sizeof(n->addr.sun_path))
        return kvr_err_set(err, -ENAMETOOLONG, "NOTIFY_SOCKET=%s: path too long", socket_path);
    n->addr.sun_family = AF_UNIX;
    memcpy(n->addr.sun_path, socket_path, len);
    if (socket_path[0] == '@')
        n->addr.sun_path[0] = '\0';
    n->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
                             (socket_path[0] == '@' ? 0 : 1));
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (n->fd < 0) {
        int rc = -errno;
        return kvr_err_set(err, rc, "NOTIFY_SOCKET: socket(): %s", strerror(-rc));
    }
    return 0;
}

int kvr_notify_init(struct kvr_notify *n, struct kvr_err *err)
{
    return kvr_notify_init_from(n, getenv("NOTIFY_SOCKET"), getenv("WATCHDOG_USEC"),
                                getenv("WATCHDOG_PID"), getpid(), err);
}

void kvr_notify_deinit(struct kvr_notify *n)
{
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
}

bool kvr_notify_enabled(const struct kvr_notify *n)
{
    return n->fd >= 0;
}

int kvr_notify_send(struct kvr_notify *n, const char *state)
{
    ssize_t r;

    if (n->fd < 0)
        return 0;
    do {
        r = sendto(n->fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&n->addr,
                   n->addrlen);
    } while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

int kvr_notify_ready(struct kvr_notify *n, const char *status)
{
    char buf[512];

    if (status == NULL)
        return kvr_notify_send(n, "READY=1");
    snprintf(buf, sizeof(buf), "READY=1\nSTATUS=%s", status);
    return kvr_notify_send(n, buf);
}

int kvr_notify_reloading(struct kvr_notify *n)
{
    char buf[96];
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(buf, sizeof(buf), "RELOADING=1\nMONOTONIC_USEC=%llu",
             (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
    return kvr_notify_send(n, buf);
}

int kvr_notify_stopping(struct kvr_notify *n)
{
    return kvr_notify_send(n, "STOPPING=1");
}

int kvr_notify_watchdog(struct kvr_notify *n)
{
    return kvr_notify_send(n, "WATCHDOG=1");
}

int kvr_notify_status(struct kvr_notify *n, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    int m;

    if (n->fd < 0)
        return 0;
    m = snprintf(buf, sizeof(buf), "STATUS=");
    va_start(ap, fmt);
    vsnprintf(buf + m, sizeof(buf) - (size_t)m, fmt, ap);
    va_end(ap);
    /* STATUS is one line: newlines would start new assignments. */
    for (char *p = buf; *p; p++)
        if (*p == '\n')
            *p = ' ';
    return kvr_notify_send(n, buf);
}

uint64_t kvr_notify_watchdog_usec(const struct kvr_notify *n)
{
    return n->watchdog_usec;
}
