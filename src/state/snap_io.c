/* snap_io.c — the snap module's contact with the outside: snapshot files (atomic write, read,
 * setting a refused file aside, the directory check), the small blocking HTTP/1.1 client that
 * fetches a peer's snapshot, and the startup procedure that picks, verifies and loads one.
 *
 * Why a file of its own: snap.c is the format (encode, verify, restore) and the taking of
 * snapshots; this is I/O and policy around it, through snap.h only (no shared internals).
 *
 * Files: write to snapshot.tmp, fsync, rename over snapshot.kvr, fsync the directory: a crash
 * or a failed write (ENOSPC, EFBIG) leaves the previous snapshot as it was. A refused file is
 * renamed aside (snapshot.kvr.bad-<time>[-n]), never deleted and never over an earlier one.
 * The peer client speaks only http://HOST:PORT, one GET with Connection: close, the body
 * framed by Content-Length, the whole exchange under one deadline (poll on a non-blocking
 * socket); its bytes are verified by the caller like a file's.
 *
 * Threads: startup (main thread) and whoever saves (the periodic thread, main at shutdown).
 */
#include "state/snap.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

/* ---- files -------------------------------------------------------------------------------- */

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;

    if (fd < 0)
        return -errno;
    if (fsync(fd) != 0 && errno != EINVAL)
        rc = -errno;
    close(fd);
    return rc;
}

/* The parent of dir (trailing slashes ignored): "." for a bare name, "/" for a top-level one. */
static int parent_of(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    while (n > 0 && dir[n - 1] != '/')
        n--;
    if (n == 0)
        return snprintf(out, cap, ".") < (int)cap ? 0 : -ENAMETOOLONG;
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n >= cap)
        return -ENAMETOOLONG;
    memcpy(out, dir, n);
    out[n] = '\0';
    return 0;
}

/* dir is missing: make it (create) or say whether it could be made (!create). */
static int missing_dir(const char *dir, bool create, struct kvr_err *err)
{
    char parent[PATH_MAX];
    struct stat sb;

    if (parent_of(dir, parent, sizeof(parent)) != 0)
        return kvr_err_set(err, -ENAMETOOLONG, "state directory %s: path too long", dir);
    if (stat(parent, &sb) != 0)
        return kvr_err_set(err, -ENOENT, "state directory %s: No such file or directory (nor "
                                         "its parent %s)", dir, parent);
    if (!S_ISDIR(sb.st_mode))
        return kvr_err_set(err, -ENOTDIR, "state directory %s: parent %s is not a directory",
                           dir, parent);
    if (!create) {
        if (access(parent, W_OK | X_OK) != 0)
            return kvr_err_set(err, -EACCES, "state directory %s is missing and cannot be "
                                             "created: %s is not writable", dir, parent);
        return 1;
    }
    if (mkdir(dir, 0750) != 0 && errno != EEXIST)
        return kvr_err_set(err, -errno, "state directory %s cannot be created: %s", dir,
                           strerror(errno));
    kvr_log_info("created state directory %s", dir);
    return 0;
}

int kvr_snap_check_dir(const char *dir, bool create, struct kvr_err *err)
{
    struct stat sb;
    char probe[PATH_MAX];
    int fd, rc;

    if (dir == NULL || dir[0] == '\0')
        return kvr_err_set(err, -EINVAL, "no state directory");
    if (stat(dir, &sb) != 0) {
        if (errno != ENOENT)
            return kvr_err_set(err, -errno, "state directory %s: %s", dir, strerror(errno));
        if ((rc = missing_dir(dir, create, err)) != 0)
            return rc;
        if (stat(dir, &sb) != 0)
            return kvr_err_set(err, -errno, "state directory %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode))
        return kvr_err_set(err, -ENOTDIR, "state directory %s: not a directory", dir);
    if ((size_t)snprintf(probe, sizeof(probe), "%s/.kvrouterd-probe.%ld", dir,
                         (long)getpid()) >= sizeof(probe))
        return kvr_err_set(err, -ENAMETOOLONG, "state directory %s: path too long", dir);
    fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return kvr_err_set(err, -errno, "state directory %s is not writable: %s", dir,
                           strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

int kvr_snap_write_file(const char *dir, const void *data, size_t len, struct kvr_err *err)
{
    struct kvr_snap_seg one = {data, len};
    return kvr_snap_write_segs(dir, &one, 1, err);
}

int kvr_snap_write_segs(const char *dir, const struct kvr_snap_seg *seg, size_t nseg,
                        struct kvr_err *err)
{
    char tmp[PATH_MAX], dst[PATH_MAX];
    int fd, rc;

    if ((size_t)snprintf(tmp, sizeof(tmp), "%s/%s", dir, KVR_SNAP_TMP) >= sizeof(tmp) ||
        (size_t)snprintf(dst, sizeof(dst), "%s/%s", dir, KVR_SNAP_FILE) >= sizeof(dst))
        return kvr_err_set(err, -ENAMETOOLONG, "state directory %s: path too long", dir);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return kvr_err_set(err, -errno, "%s: %s", tmp, strerror(errno));
    for (size_t i = 0; i < nseg; i++) {
        const char *p = seg[i].data;
        size_t left = seg[i].len;
        while (left > 0) {
            ssize_t n = write(fd, p, left > (1u << 30) ? (1u << 30) : left);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                rc = n < 0 ? -errno : -ENOSPC;
                goto fail;
            }
            p += n;
            left -= (size_t)n;
        }
    }
    if (fsync(fd) != 0) {
        rc = -errno;
        goto fail;
    }
    if (close(fd) != 0) {
        rc = -errno;
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, dst) != 0) {
        rc = -errno;
        goto fail;
    }
    rc = fsync_dir(dir);
    if (rc != 0)
        return kvr_err_set(err, rc, "%s: fsync: %s", dir, strerror(-rc));
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return kvr_err_set(err, rc, "%s: %s (the previous snapshot is kept)", tmp, strerror(-rc));
}

int kvr_snap_read_file(const char *path, struct kvr_buf *out, struct kvr_err *err)
{
    struct stat sb;
    int fd, rc = 0;

    kvr_buf_reset(out);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvr_err_set(err, -errno, "%s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = kvr_err_set(err, -EINVAL, "%s: not a regular file", path);
        goto out;
    }
    if (kvr_buf_reserve(out, (size_t)sb.st_size + 1) != 0) {
        rc = kvr_err_set(err, -ENOMEM, "%s: out of memory (%lld bytes)", path,
                         (long long)sb.st_size);
        goto out;
    }
    for (;;) {
        if (out->cap - out->len < 2 && kvr_buf_reserve(out, 1 << 20) != 0) {
            rc = kvr_err_set(err, -ENOMEM, "%s: out of memory", path);
            goto out;
        }
        ssize_t n = read(fd, out->data + out->len, out->cap - out->len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = kvr_err_set(err, -errno, "%s: %s", path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        out->len += (size_t)n;
        out->data[out->len] = '\0';
    }
out:
    close(fd);
    return rc;
}

int kvr_snap_set_aside(const char *path, char *aside, size_t cap)
{
    char to[PATH_MAX], stamp[32];
    time_t now = time(NULL);
    struct tm tm;

    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
    snprintf(to, sizeof(to), "%s.bad-%s", path, stamp);
    /* never over an earlier one (several refusals within a second) */
    for (int i = 1; access(to, F_OK) == 0 && i < 1000; i++)
        snprintf(to, sizeof(to), "%s.bad-%s-%d", path, stamp, i);
    if (rename(path, to) != 0)
        return -errno;
    if (aside != NULL)
        snprintf(aside, cap, "%s", to);
    return 0;
}

/* ---- peers: a small blocking HTTP/1.1 client ------------------------------------------------ */

static int64_t left_ms(int64_t deadline)
{
    int64_t l = deadline - kvr_now_ms();
    return l > 0 ? l : 0;
}

static int wait_fd(int fd, short ev, int64_t deadline)
{
    struct pollfd p = {.fd = fd, .events = ev};
    for (;;) {
        int64_t l = left_ms(deadline);
        if (l == 0)
            return -ETIMEDOUT;
        int n = poll(&p, 1, (int)(l > INT_MAX ? INT_MAX : l));
        if (n > 0)
            return 0;
        if (n == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

/* After a send or recv on the non-blocking fd returned n: 0 when it went through (n >= 0); 1
 * when it would block or was interrupted, once fd is ready for ev again; else a negative errno
 * (-ETIMEDOUT when the deadline passes first). */
static int io_retry(int fd, ssize_t n, short ev, int64_t deadline)
{
    if (n >= 0)
        return 0;
    if (errno == EAGAIN || errno == EINTR) {
        int rc = wait_fd(fd, ev, deadline);
        return rc != 0 ? rc : 1;
    }
    return -errno;
}

static int parse_url(const char *url, char *host, size_t cap, char *port, size_t pcap)
{
    const char *h, *e, *c;

    if (url == NULL || strncmp(url, "http://", 7) != 0)
        return -EINVAL;
    h = url + 7;
    e = h + strcspn(h, "/");
    if (*e != '\0' && strcmp(e, "/") != 0)
        return -EINVAL; /* HOST:PORT only; the path is ours */
    if (*h == '[') {
        c = memchr(h, ']', (size_t)(e - h));
        if (c == NULL || c[1] != ':')
            return -EINVAL;
        if ((size_t)(c - h - 1) >= cap)
            return -EINVAL;
        memcpy(host, h + 1, (size_t)(c - h - 1));
        host[c - h - 1] = '\0';
        c++;
    } else {
        c = NULL;
        for (const char *q = h; q < e; q++)
            if (*q == ':')
                c = q;
        if (c == NULL || (size_t)(c - h) >= cap || c == h)
            return -EINVAL;
        memcpy(host, h, (size_t)(c - h));
        host[c - h] = '\0';
    }
    if ((size_t)(e - c - 1) >= pcap || e - c - 1 < 1)
        return -EINVAL;
    memcpy(port, c + 1, (size_t)(e - c - 1));
    port[e - c - 1] = '\0';
    for (const char *q = port; *q; q++)
        if (*q < '0' || *q > '9')
            return -EINVAL;
    return 0;
}

static int dial(const char *host, const char *port, int64_t deadline, struct kvr_err *err)
{
    struct addrinfo hints, *res = NULL, *ai;
    int fd = -1, rc, last = -ECONNREFUSED;

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0)
        return kvr_err_set(err, -EHOSTUNREACH, "%s: %s", host, gai_strerror(rc));
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            last = -errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ||
            (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == 0)) {
            int so = 0;
            socklen_t sl = sizeof(so);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl);
            if (so == 0)
                break;
            last = -so;
        } else {
            last = errno == EINPROGRESS ? -ETIMEDOUT : -errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return kvr_err_set(err, last, "connect %s:%s: %s", host, port, strerror(-last));
    return fd;
}

int kvr_snap_fetch(const char *url, const char *token, int64_t timeout_ms, struct kvr_buf *out,
                   struct kvr_err *err)
{
    char host[256], port[8], req[1024];
    int64_t deadline = kvr_now_ms() + (timeout_ms > 0 ? timeout_ms : 30000);
    size_t hdr_end = 0, sent = 0, reqlen;
    uint64_t clen = 0;
    bool have_clen = false;
    int fd, rc = 0;

    kvr_buf_reset(out);
    if (parse_url(url, host, sizeof(host), port, sizeof(port)) != 0)
        return kvr_err_set(err, -EINVAL, "%s: expected http://HOST:PORT", url);
    if (token != NULL && (strlen(token) > 255 || strpbrk(token, "\r\n") != NULL))
        token = NULL;
    reqlen = (size_t)snprintf(req, sizeof(req),
                              "GET /v1/snapshot HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n"
                              "%s%s%s\r\n",
                              host, port, token ? "Authorization: Bearer " : "",
                              token ? token : "", token ? "\r\n" : "");
    fd = dial(host, port, deadline, err);
    if (fd < 0)
        return fd;
    while (sent < reqlen) {
        ssize_t n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
        if ((rc = io_retry(fd, n, POLLOUT, deadline)) < 0)
            goto io_fail;
        if (rc > 0)
            continue;
        sent += (size_t)n;
    }
    for (;;) {
        if (have_clen && out->len - hdr_end >= clen)
            break;
        if (kvr_buf_reserve(out, 1 << 16) != 0) {
            rc = kvr_err_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        ssize_t n = recv(fd, out->data + out->len, out->cap - out->len - 1, 0);
        if ((rc = io_retry(fd, n, POLLIN, deadline)) < 0)
            goto io_fail;
        if (rc > 0)
            continue;
        if (n == 0) {
            rc = kvr_err_set(err, -EPIPE, "connection closed after %zu bytes", out->len);
            goto out;
        }
        out->len += (size_t)n;
        out->data[out->len] = '\0';
        if (hdr_end == 0) {
            char *e = strstr(out->data, "\r\n\r\n");
            if (e == NULL) {
                if (out->len > 65536) {
                    rc = kvr_err_set(err, -EPROTO, "response header too long");
                    goto out;
                }
                continue;
            }
            hdr_end = (size_t)(e - out->data) + 4;
            int status = 0;
            if (sscanf(out->data, "HTTP/1.%*d %d", &status) != 1 || status != 200) {
                char line[160];
                snprintf(line, sizeof(line), "%.*s", (int)strcspn(out->data, "\r\n"),
                         out->data);
                rc = kvr_err_set(err, -EPROTO, "peer answered '%s'", line);
                goto out;
            }
            for (char *p = out->data; p < e; p = strstr(p, "\r\n") + 2) {
                if (strncasecmp(p, "content-length:", 15) == 0) {
                    clen = strtoull(p + 15, NULL, 10);
                    have_clen = true;
                }
                if (strstr(p, "\r\n") == NULL || strstr(p, "\r\n") >= e)
                    break;
            }
            if (!have_clen) {
                rc = kvr_err_set(err, -EPROTO, "no Content-Length");
                goto out;
            }
        }
    }
    /* the body alone */
    memmove(out->data, out->data + hdr_end, (size_t)clen);
    out->len = (size_t)clen;
    close(fd);
    return 0;
io_fail:
    rc = kvr_err_set(err, rc, "%s", rc == -ETIMEDOUT ? "timed out" : strerror(-rc));
out:
    close(fd);
    kvr_buf_reset(out);
    return rc;
}

/* ---- startup ------------------------------------------------------------------------------ */

void kvr_snap_boot_free(struct kvr_snap_boot *b)
{
    kvr_snap_loaded_free(&b->loaded);
    kvr_buf_free(&b->bytes);
    b->source = NULL;
}

static void fmt_time(int64_t ms, char *buf, size_t cap)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

int kvr_snap_boot(const struct kvr_snap_boot_opts *o, struct kvr_index **ix,
                  struct kvr_snap_boot *out, struct kvr_err *err)
{
    bool have_dir = o->dir != NULL && o->dir[0] != '\0';
    char path[PATH_MAX], aside[PATH_MAX + 40];
    struct kvr_snap_info local = {0}, peer = {0};
    struct kvr_buf pbuf;
    struct kvr_err e;
    bool have_local = false;
    int rc;

    memset(out, 0, sizeof(*out));
    kvr_buf_init(&out->bytes);
    kvr_buf_init(&pbuf);
    if (have_dir) {
        rc = kvr_snap_check_dir(o->dir, true, err);
        if (rc != 0)
            return rc;
        snprintf(path, sizeof(path), "%s/%s", o->dir, KVR_SNAP_TMP);
        unlink(path); /* a write that never finished */
        snprintf(path, sizeof(path), "%s/%s", o->dir, KVR_SNAP_FILE);
        rc = kvr_snap_read_file(path, &out->bytes, &e);
        if (rc == 0) {
            rc = kvr_snap_verify(out->bytes.data, out->bytes.len, &local, &e);
            if (rc == 0) {
                have_local = true;
            } else {
                int ar = kvr_snap_set_aside(path, aside, sizeof(aside));
                kvr_log_error("snapshot %s refused: %s; %s%s; starting without it", path, e.msg,
                              ar == 0 ? "kept as " : "could not be set aside: ",
                              ar == 0 ? aside : strerror(-ar));
            }
        } else if (rc != -ENOENT) {
            kvr_log_error("snapshot %s cannot be read: %s; starting without it", path, e.msg);
        }
    }
    if (o->bootstrap != NULL && o->bootstrap[0] != '\0') {
        uint64_t f0 = kvr_now_ns();
        kvr_log_info("recovery: bootstrap: fetching the snapshot of peer %s (timeout %.1f s)",
                     o->bootstrap, (double)o->timeout_ms / 1000.0);
        out->rec.bootstrap = true;
        rc = kvr_snap_fetch(o->bootstrap, o->token, o->timeout_ms, &pbuf, &e);
        out->rec.bootstrap_ns = kvr_now_ns() - f0;
        out->rec.bootstrap_bytes = pbuf.len;
        if (rc == 0)
            kvr_log_info("recovery: bootstrap: %zu bytes from %s in %.3f s", pbuf.len,
                         o->bootstrap, (double)out->rec.bootstrap_ns / 1e9);
        if (rc == 0)
            rc = kvr_snap_verify(pbuf.data, pbuf.len, &peer, &e);
        out->rec.bootstrap_ok = rc == 0;
        if (rc != 0) {
            kvr_log_warn("bootstrap from %s failed: %s; %s", o->bootstrap, e.msg,
                         have_local ? "using the local snapshot" : "starting without a snapshot");
        } else if (have_local && local.created_ms >= peer.created_ms) {
            kvr_log_info("bootstrap: the local snapshot is as new as the peer's; using it");
        } else {
            struct kvr_buf t = out->bytes; /* swap: the peer's is the one */
            out->bytes = pbuf;
            pbuf = t;
            local = peer;
            have_local = true;
            out->source = "peer";
            if (have_dir && kvr_snap_write_file(o->dir, out->bytes.data, out->bytes.len, &e) != 0)
                kvr_log_warn("bootstrap: cannot save the peer's snapshot: %s", e.msg);
        }
    }
    kvr_buf_free(&pbuf);
    if (!have_local) {
        kvr_buf_free(&out->bytes);
        return 0;
    }
    if (out->source == NULL)
        out->source = "file";

    kvr_log_info("recovery: loading the snapshot from %s (%" PRIu64 " workers, %" PRIu64
                 " pairs, %" PRIu64 " bytes)",
                 strcmp(out->source, "peer") == 0 ? o->bootstrap : path, local.workers,
                 local.pairs, local.bytes);
    uint64_t t0 = kvr_now_ns();
    rc = kvr_snap_apply(out->bytes.data, out->bytes.len, *ix, &out->loaded, &e);
    if (rc != 0) {
        struct kvr_index *fresh = NULL;
        int ar = -ENOENT;
        if (strcmp(out->source, "file") == 0 || have_dir)
            ar = have_dir ? kvr_snap_set_aside(path, aside, sizeof(aside)) : -ENOENT;
        kvr_log_error("snapshot from %s refused while loading: %s; %s%s; starting without it",
                      strcmp(out->source, "peer") == 0 ? o->bootstrap : path, e.msg,
                      ar == 0 ? "kept as " : "", ar == 0 ? aside : "");
        kvr_index_destroy(*ix); /* never a half-loaded index */
        *ix = NULL;
        rc = kvr_index_create(&o->index, &fresh);
        if (rc != 0)
            return kvr_err_set(err, rc, "index: %s", strerror(-rc));
        *ix = fresh;
        kvr_snap_boot_free(out);
        return 0;
    }
    out->rec.source = out->source;
    out->rec.load_ns = kvr_now_ns() - t0;
    out->rec.pairs = out->loaded.pairs;
    out->rec.streams = out->loaded.nstreams;
    char when[40];
    fmt_time(local.created_ms, when, sizeof(when));
    kvr_log_info("snapshot loaded from %s: taken %s by %s, %zu streams, %" PRIu64
                 " workers, %" PRIu64 " pairs, %" PRIu64 " bytes in %.3f s",
                 strcmp(out->source, "peer") == 0 ? o->bootstrap : path, when,
                 local.producer, out->loaded.nstreams, local.workers, out->loaded.pairs,
                 local.bytes, (double)(kvr_now_ns() - t0) / 1e9);
    /* the clock went back (or the peer's is ahead): loaded all the same (its content does not
     * depend on the time), but said, since "newer" decides between a file and a peer */
    int64_t now_ms = (int64_t)(kvr_wall_s() * 1000.0);
    if (local.created_ms > now_ms + 60000)
        kvr_log_warn("snapshot: taken %s, %.0f s in the future: is this host's clock (or the "
                     "peer's) wrong?", when, (double)(local.created_ms - now_ms) / 1000.0);
    return 0;
}
