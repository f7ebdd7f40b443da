/* zsub_auth.c — admission on the event plane: who may publish into the index.
 *
 * Layers (docs/security.md):
 *   - ZAP handler (libzmq's ZAP protocol, RFC 27): a REP socket bound at
 *     inproc://zeromq.zap.01 in zsub's context, answered by the receive thread. Bind sockets
 *     carry a ZAP domain, so libzmq asks it at every handshake, NULL mechanism included (vLLM's
 *     publisher has no security option). It refuses a peer whose address is outside
 *     [events] allow, and a CURVE client whose public key is not in the authorized keys.
 *     A refused peer never gets a message through; each refusal is counted and logged
 *     rate-limited. Only created when there is something to check, so without allow lines
 *     (and without authorized keys) nothing changes.
 *   - CURVE server on bind sockets (opt-in; publishers that can do it: SGLang, relays).
 *   - pod_must_match_peer: each message's topic pod must equal the IP address it came from
 *     (zmq_msg_gets "Peer-Address"), checked before the message reaches a writer queue: a
 *     spoofed "kv@victim@m" with a seq jump never touches the victim's stream.
 *   - Connections on bind sockets are watched through a socket monitor: publisher connects,
 *     disconnects, failed handshakes, and the connections ZeroMQ itself drops after a
 *     message over max_message_size. libzmq 4.3.4 reports that drop as a plain
 *     DISCONNECTED, the same event as a publisher closing; so at ACCEPTED we dup the
 *     connection's fd, and at DISCONNECTED look at our copy: end-of-stream (or a reset)
 *     means the publisher closed it; a connection still open from the peer's side means
 *     ZeroMQ dropped it (an oversized message or another ZMTP protocol error).
 *
 * Connect sockets (we dial an engine) get none of this: the operator chose the endpoint
 * (config or token-protected admin API), a pod= override fixes the identity, and their
 * messages come from that one engine.
 *
 * Threads: init/deinit/bind_opts on the creating thread before start; the rest on the
 * receive thread; the key-file and endpoint checks anywhere (pure but for file reads and
 * getifaddrs/getaddrinfo).
 */
#include "events/zsub_int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netdb.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "kvrouterd"
#define MAX_AUTHORIZED_KEYS 65536
#define MAX_KEY_FILE_BYTES (4 << 20)

static const char *const reject_names[KVR_ZSUB_REJ_COUNT] = {"address", "curve_key",
                                                              "handshake", "pod_mismatch"};

const char *kvr_zsub_reject_name(enum kvr_zsub_reject r)
{
    return (unsigned)r < KVR_ZSUB_REJ_COUNT ? reject_names[r] : "?";
}

/* ---- key files ----------------------------------------------------------------------- */

static int read_file(const char *what, const char *path, char **out, struct kvr_err *err)
{
    FILE *f = fopen(path, "re");
    char *buf;
    size_t n;

    if (f == NULL)
        return kvr_err_set(err, -errno, "%s %s: cannot open: %s", what, path, strerror(errno));
    buf = malloc(MAX_KEY_FILE_BYTES + 1);
    if (buf == NULL) {
        fclose(f);
        return kvr_err_set(err, -ENOMEM, "%s %s: out of memory", what, path);
    }
    n = fread(buf, 1, MAX_KEY_FILE_BYTES + 1, f);
    if (ferror(f) || n > MAX_KEY_FILE_BYTES) {
        int rc = ferror(f) ? -EIO : -EFBIG;
        fclose(f);
        free(buf);
        return kvr_err_set(err, rc, "%s %s: %s", what, path,
                           rc == -EIO ? "read error" : "file too large");
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    return 0;
}

/* Next non-empty, non-comment line of *p, trimmed, NUL-terminated in place; NULL at end. */
static char *next_line(char **p, int *lineno)
{
    while (**p != '\0') {
        char *l = *p, *e = strchr(l, '\n');
        if (e != NULL) {
            *e = '\0';
            *p = e + 1;
        } else {
            *p = l + strlen(l);
        }
        (*lineno)++;
        while (isspace((unsigned char)*l))
            l++;
        size_t n = strlen(l);
        while (n > 0 && isspace((unsigned char)l[n - 1]))
            l[--n] = '\0';
        if (n > 0 && l[0] != '#')
            return l;
    }
    return NULL;
}

static bool z85_key(const char *s, uint8_t key[32])
{
    return strlen(s) == 40 && zmq_z85_decode(key, s) != NULL;
}

static int read_one_key(const char *what, const char *path, char z85[41], struct kvr_err *err)
{
    char *buf, *p, *l;
    uint8_t k[32];
    int line = 0, rc;

    if ((rc = read_file(what, path, &buf, err)) != 0)
        return rc;
    p = buf;
    l = next_line(&p, &line);
    if (l == NULL || !z85_key(l, k) || next_line(&p, &line) != NULL) {
        free(buf);
        return kvr_err_set(err, -EINVAL, "%s %s: expected one Z85 key (40 characters, as "
                                         "zmq_curve_keypair() makes) and nothing else",
                           what, path);
    }
    memcpy(z85, l, 41);
    memset(buf, 0, strlen(l) + (size_t)(l - buf)); /* the secret key file's text */
    free(buf);
    return 0;
}

void kvr_zsub_curve_free(struct kvr_zsub_curve *c)
{
    if (c == NULL)
        return;
    free(c->authorized);
    memset(c, 0, sizeof(*c));
}

int kvr_zsub_curve_load(const char *secret_file, const char *public_file,
                        const char *authorized_file, struct kvr_zsub_curve *out,
                        struct kvr_err *err)
{
    char derived[41];
    int rc;

    memset(out, 0, sizeof(*out));
    if (!zmq_has("curve"))
        return kvr_err_set(err, -ENOTSUP, "curve_secret_key_file %s: this libzmq was built "
                                          "without CURVE",
                           secret_file);
    if ((rc = read_one_key("curve_secret_key_file", secret_file, out->secret, err)) != 0 ||
        (rc = read_one_key("curve_public_key_file", public_file, out->public_key, err)) != 0)
        goto fail;
    if (zmq_curve_public(derived, out->secret) != 0 || strcmp(derived, out->public_key) != 0) {
        rc = kvr_err_set(err, -EINVAL, "curve_public_key_file %s: not the public key of "
                                       "curve_secret_key_file %s",
                         public_file, secret_file);
        goto fail;
    }
    if (authorized_file != NULL) {
        char *buf, *p, *l;
        int line = 0;
        if ((rc = read_file("curve_authorized_keys_file", authorized_file, &buf, err)) != 0)
            goto fail;
        p = buf;
        while ((l = next_line(&p, &line)) != NULL) {
            uint8_t k[32];
            void *grown;
            if (!z85_key(l, k)) {
                rc = kvr_err_set(err, -EINVAL, "curve_authorized_keys_file %s:%d: expected a "
                                               "Z85 public key (40 characters)",
                                 authorized_file, line);
                free(buf);
                goto fail;
            }
            if (out->nauthorized >= MAX_AUTHORIZED_KEYS) {
                rc = kvr_err_set(err, -E2BIG, "curve_authorized_keys_file %s: more than %d keys",
                                 authorized_file, MAX_AUTHORIZED_KEYS);
                free(buf);
                goto fail;
            }
            grown = realloc(out->authorized, (out->nauthorized + 1) * sizeof(*out->authorized));
            if (grown == NULL) {
                rc = kvr_err_set(err, -ENOMEM, "out of memory");
                free(buf);
                goto fail;
            }
            out->authorized = grown;
            memcpy(out->authorized[out->nauthorized++], k, 32);
        }
        free(buf);
        if (out->nauthorized == 0) {
            /* An empty list would be "anyone" by the no-list rule: surely not meant. */
            rc = kvr_err_set(err, -EINVAL, "curve_authorized_keys_file %s: no keys",
                             authorized_file);
            goto fail;
        }
    }
    return 0;
fail:
    memset(out->secret, 0, sizeof(out->secret));
    kvr_zsub_curve_free(out);
    return rc;
}

/* ---- endpoint checks (kvrouterd -t) ------------------------------------------------------ */

/* Splits tcp://HOST:PORT (HOST may be [v6]) into host (without brackets). */
static int tcp_host(const char *ep, char *host, size_t cap, bool *bracketed)
{
    const char *h = ep + 6, *colon;
    size_t n;

    if (strncmp(ep, "tcp://", 6) != 0)
        return -EINVAL;
    /* A source address ("tcp://src;dst") only exists for connects. */
    colon = strrchr(h, ':');
    if (colon == NULL)
        return -EINVAL;
    n = (size_t)(colon - h);
    *bracketed = n >= 2 && h[0] == '[' && h[n - 1] == ']';
    if (*bracketed) {
        h++;
        n -= 2;
    }
    if (n == 0 || n >= cap)
        return -EINVAL;
    memcpy(host, h, n);
    host[n] = '\0';
    return 0;
}

static bool interface_has(const char *name, int family)
{
    struct ifaddrs *ifa, *i;
    bool found = false;

    if (getifaddrs(&ifa) != 0)
        return false;
    for (i = ifa; i != NULL && !found; i = i->ifa_next)
        found = i->ifa_name != NULL && strcmp(i->ifa_name, name) == 0 && i->ifa_addr != NULL &&
                i->ifa_addr->sa_family == family;
    freeifaddrs(ifa);
    return found;
}

int kvr_zsub_check_bind(const char *ep, struct kvr_err *err)
{
    char host[256];
    unsigned char tmp[16];
    bool br;

    if (strncmp(ep, "ipc://", 6) == 0) {
        char dir[512];
        const char *slash = strrchr(ep + 6, '/');
        struct stat sb;
        if (slash == NULL || ep[6] == '@') /* relative to cwd, or Linux abstract namespace */
            return 0;
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - (ep + 6)), ep + 6);
        if (dir[0] != '\0' && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
            return kvr_err_set(err, -ENOENT, "directory %s does not exist", dir);
        return 0;
    }
    if (strncmp(ep, "tcp://", 6) != 0)
        return 0; /* inproc: nothing to resolve */
    if (tcp_host(ep, host, sizeof(host), &br) != 0)
        return kvr_err_set(err, -EINVAL, "expected tcp://HOST:PORT");
    if (strcmp(host, "*") == 0)
        return 0;
    if (br)
        return inet_pton(AF_INET6, host, tmp) == 1 || interface_has(host, AF_INET6)
                   ? 0
                   : kvr_err_set(err, -ENODEV, "'%s' is neither an IPv6 address nor an "
                                               "interface with one",
                                 host);
    if (inet_pton(AF_INET, host, tmp) == 1)
        return 0;
    if (interface_has(host, AF_INET))
        return 0;
    return kvr_err_set(err, -ENODEV, "ZeroMQ binds to '*', a numeric IP address or a network "
                                     "interface name, and '%s' is none of these on this host "
                                     "(it does not look names up; e.g. use tcp://127.0.0.1:PORT "
                                     "for loopback only, tcp://*:PORT for every interface)",
                      host);
}

int kvr_zsub_check_connect(const char *ep, struct kvr_err *err)
{
    char host[256];
    struct addrinfo hints = {0}, *res = NULL;
    const char *semi;
    bool br;
    int rc;

    if (strncmp(ep, "tcp://", 6) != 0)
        return 0;
    semi = strchr(ep, ';'); /* tcp://SOURCE;HOST:PORT: check the destination */
    if (semi != NULL) {
        char rebuilt[600];
        snprintf(rebuilt, sizeof(rebuilt), "tcp://%s", semi + 1);
        return kvr_zsub_check_connect(rebuilt, err);
    }
    if (tcp_host(ep, host, sizeof(host), &br) != 0)
        return kvr_err_set(err, -EINVAL, "expected tcp://HOST:PORT");
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = br ? AF_INET6 : AF_UNSPEC;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (res != NULL)
        freeaddrinfo(res);
    if (rc != 0)
        return kvr_err_set(err, -ENOENT, "host '%s' does not resolve now: %s", host,
                           gai_strerror(rc));
    return 0;
}

/* ---- setup ------------------------------------------------------------------------------- */

int kvr_zsub_auth_init(struct kvr_zsub *z, struct kvr_err *err)
{
    if (z->o.nallow > 0) {
        z->allow = malloc(z->o.nallow * sizeof(*z->allow));
        if (z->allow == NULL)
            return kvr_err_set(err, -ENOMEM, "zsub: out of memory");
        memcpy(z->allow, z->o.allow, z->o.nallow * sizeof(*z->allow));
        z->nallow = z->o.nallow;
    }
    z->o.allow = z->allow;
    if (z->o.curve != NULL) {
        z->curve = *z->o.curve;
        z->curve.authorized = NULL;
        z->curve.nauthorized = 0;
        if (z->o.curve->nauthorized > 0) {
            size_t sz = z->o.curve->nauthorized * sizeof(*z->curve.authorized);
            z->curve.authorized = malloc(sz);
            if (z->curve.authorized == NULL)
                return kvr_err_set(err, -ENOMEM, "zsub: out of memory");
            memcpy(z->curve.authorized, z->o.curve->authorized, sz);
            z->curve.nauthorized = z->o.curve->nauthorized;
        }
        z->curve_on = true;
    }
    z->o.curve = NULL; /* borrowed: not kept */
    kvr_ratelimit_init(&z->rl_admit, z->o.ratelimit_ms, z->o.ratelimit_burst);
    kvr_ratelimit_init(&z->rl_conn, z->o.ratelimit_ms, z->o.ratelimit_burst);
    if (z->nallow == 0 && z->curve.nauthorized == 0)
        return 0; /* nothing for a ZAP handler to decide: libzmq admits everyone */
    z->zap = zmq_socket(z->ctx, ZMQ_REP);
    if (z->zap == NULL)
        return kvr_err_set(err, -ENOMEM, "zsub: cannot create the ZAP socket: %s",
                           zmq_strerror(errno));
    kvr_zsub_set_int(z->zap, ZMQ_LINGER, 0);
    if (zmq_bind(z->zap, ZAP_ENDPOINT) != 0) {
        int rc = -errno;
        zmq_close(z->zap);
        z->zap = NULL;
        return kvr_err_set(err, rc, "zsub: cannot bind the ZAP handler: %s",
                           zmq_strerror(-rc));
    }
    return 0;
}

void kvr_zsub_auth_deinit(struct kvr_zsub *z)
{
    if (z->zap != NULL) {
        zmq_close(z->zap);
        z->zap = NULL;
    }
    free(z->allow);
    z->allow = NULL;
    memset(z->curve.secret, 0, sizeof(z->curve.secret));
    kvr_zsub_curve_free(&z->curve);
}

int kvr_zsub_auth_zap_opt(struct kvr_zsub *z, void *sock, struct kvr_err *err)
{
    if (z->zap != NULL &&
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) != 0)
        return kvr_err_set(err, -errno, "ZMQ_ZAP_DOMAIN: %s", zmq_strerror(errno));
    return 0;
}

int kvr_zsub_auth_bind_opts(struct kvr_zsub *z, void *sock, struct kvr_err *err)
{
    int one = 1;
    int rc = kvr_zsub_auth_zap_opt(z, sock, err);

    if (rc != 0)
        return rc;
    if (z->curve_on &&
        (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
         zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, z->curve.secret, 41) != 0 ||
         zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, z->curve.public_key, 41) != 0))
        return kvr_err_set(err, -errno, "CURVE server options: %s", zmq_strerror(errno));
    return 0;
}

/* ---- ZAP handler (receive thread) ------------------------------------------------------- */

static void count_reject(struct kvr_zsub *z, enum kvr_zsub_reject r, const char *peer,
                         const char *detail)
{
    KVR_CNT_INC(z->rejected[r]);
    kvr_log_limited(&z->rl_admit, KVR_LOG_WARN, "events: refused %s: %s (%s)",
                    peer[0] ? peer : "a publisher", kvr_zsub_reject_name(r), detail);
}

#define ZAP_MAX_FRAMES 8

void kvr_zsub_read_zap(struct kvr_zsub *z)
{
    for (;;) {
        zmq_msg_t f[ZAP_MAX_FRAMES];
        size_t n = 0, extra = 0;
        int more = 1;
        char addr[64] = "", mech[16] = "";
        const char *status = "200", *text = "OK";

        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], z->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[0]);
            return;
        }
        n = 1;
        more = zmq_msg_more(&f[0]);
        while (more) {
            zmq_msg_t tmp, *m = n < ZAP_MAX_FRAMES ? &f[n] : &tmp;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, z->zap, 0) < 0) {
                zmq_msg_close(m);
                break;
            }
            more = zmq_msg_more(m);
            if (m == &tmp) {
                zmq_msg_close(m);
                extra++;
            } else {
                n++;
            }
        }
        /* [version, request id, domain, address, identity, mechanism, credentials...] */
        if (n >= 6) {
            snprintf(addr, sizeof(addr), "%.*s", (int)zmq_msg_size(&f[3]),
                     (const char *)zmq_msg_data(&f[3]));
            snprintf(mech, sizeof(mech), "%.*s", (int)zmq_msg_size(&f[5]),
                     (const char *)zmq_msg_data(&f[5]));
        }
        if (n < 6 || extra > 0 || zmq_msg_size(&f[0]) != 3 ||
            memcmp(zmq_msg_data(&f[0]), "1.0", 3) != 0) {
            status = "500";
            text = "bad ZAP request";
        } else if (z->nallow > 0) {
            uint8_t a[16];
            if (kvr_cidr_addr(addr, strlen(addr), a) != 0 ||
                !kvr_cidr_match_any(z->allow, z->nallow, a)) {
                status = "400";
                text = "address not allowed";
                count_reject(z, KVR_ZSUB_REJ_ADDRESS, addr, "not in [events] allow");
            }
        }
        if (strcmp(status, "200") == 0 && strcmp(mech, "CURVE") == 0 &&
            z->curve.nauthorized > 0) {
            bool ok = false;
            if (n >= 7 && zmq_msg_size(&f[6]) == 32)
                for (size_t i = 0; i < z->curve.nauthorized && !ok; i++)
                    ok = memcmp(z->curve.authorized[i], zmq_msg_data(&f[6]), 32) == 0;
            if (!ok) {
                char k[41] = "?";
                if (n >= 7 && zmq_msg_size(&f[6]) == 32)
                    zmq_z85_encode(k, zmq_msg_data(&f[6]), 32);
                status = "400";
                text = "key not authorized";
                count_reject(z, KVR_ZSUB_REJ_CURVE_KEY, addr, k);
            }
        }
        /* [version, request id, status, text, user id, metadata] */
        zmq_send(z->zap, "1.0", 3, ZMQ_SNDMORE);
        if (n >= 2)
            zmq_send(z->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        else
            zmq_send(z->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(z->zap, status, 3, ZMQ_SNDMORE);
        zmq_send(z->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(z->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(z->zap, "", 0, 0);
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
}

/* ---- pod must match peer (receive thread) ------------------------------------------------ */

bool kvr_zsub_pod_admitted(struct kvr_zsub *z, struct source *s, zmq_msg_t *first)
{
    struct kvr_zsub_topic_parts kt;
    const char *peer;
    uint8_t pa[16], pp[16];
    char pod[80];

    /* ipc/inproc peers are local processes with no address (file permissions guard them). */
    if (!z->o.pod_must_match_peer || !s->bind || s->pod_cfg != NULL ||
        strncmp(s->bound, "tcp://", 6) != 0)
        return true;
    if (kvr_zsub_topic_split(zmq_msg_data(first), zmq_msg_size(first), &kt) != 0)
        return true; /* not a kv@pod@model topic: counted as a bad topic next */
    peer = zmq_msg_gets(first, "Peer-Address");
    if (peer != NULL && kvr_cidr_addr(peer, strlen(peer), pa) == 0 &&
        kvr_cidr_addr(kt.pod, kt.pod_len, pp) == 0 && memcmp(pa, pp, 16) == 0)
        return true;
    snprintf(pod, sizeof(pod), "%.*s", kt.pod_len > 64 ? 64 : (int)kt.pod_len, kt.pod);
    KVR_CNT_INC(z->rejected[KVR_ZSUB_REJ_POD_MISMATCH]);
    kvr_log_limited(&z->rl_admit, KVR_LOG_WARN,
                    "events: dropped message for pod '%s' from %s on %s: pod_mismatch (the pod "
                    "in the topic must be the publisher's address)",
                    pod, peer != NULL ? peer : "an unknown address", s->bound);
    return false;
}

/* ---- bind socket monitor (receive thread) ------------------------------------------------ */

/* Our copy of a descriptor libzmq accepted, and its close. Out of line and named so the
 * ThreadSanitizer build can ignore exactly these (zsub.c's suppressions): libzmq is not
 * instrumented, so TSan never sees it create or close the fd numbers we copy and reports
 * the copy as a race with whichever instrumented module (libuv) last used the number.
 * Copying or closing a copy never touches the other module's descriptor. */
__attribute__((noinline)) int kvr_zsub_fd_copy(int fd)
{
    return fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

__attribute__((noinline)) void kvr_zsub_fd_copy_close(int fd)
{
    close(fd);
}

static struct pconn *conn_find(struct source *s, int fd)
{
    for (size_t i = 0; i < s->nconns; i++)
        if (s->conns[i].fd == fd)
            return &s->conns[i];
    return NULL;
}

static void conn_drop(struct source *s, struct pconn *c)
{
    if (c->dupfd >= 0)
        kvr_zsub_fd_copy_close(c->dupfd);
    *c = s->conns[--s->nconns];
}

void kvr_zsub_conns_close(struct source *s)
{
    while (s->nconns > 0)
        conn_drop(s, &s->conns[0]);
    free(s->conns);
    s->conns = NULL;
    s->capconns = 0;
}

/* The peer of a connection that belongs to bind source s, into buf; false when fd is not
 * such a connection (any more): its local address must be s's port (tcp) or path (ipc). The
 * check matters because the ACCEPTED event is read later than it happened: the connection may
 * be gone and its fd number reused by another module's socket (an HTTP client, say), which
 * we must not hold open. */
static bool conn_of(const struct source *s, int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ps, ls;
    socklen_t pl = sizeof(ps), ll = sizeof(ls);
    char h[INET6_ADDRSTRLEN] = "?";
    const char *colon = strrchr(s->bound, ':');
    unsigned bport = colon != NULL ? (unsigned)strtoul(colon + 1, NULL, 10) : 0;

    if (getpeername(fd, (struct sockaddr *)&ps, &pl) != 0 ||
        getsockname(fd, (struct sockaddr *)&ls, &ll) != 0 || ps.ss_family != ls.ss_family)
        return false;
    if (ls.ss_family == AF_INET) {
        const struct sockaddr_in *l = (const struct sockaddr_in *)&ls,
                                 *a = (const struct sockaddr_in *)&ps;
        if (strncmp(s->bound, "tcp://", 6) != 0 || ntohs(l->sin_port) != bport)
            return false;
        inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h));
        snprintf(buf, cap, "%s:%u", h, ntohs(a->sin_port));
        return true;
    }
    if (ls.ss_family == AF_INET6) {
        const struct sockaddr_in6 *l = (const struct sockaddr_in6 *)&ls,
                                  *a = (const struct sockaddr_in6 *)&ps;
        if (strncmp(s->bound, "tcp://", 6) != 0 || ntohs(l->sin6_port) != bport)
            return false;
        inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h));
        snprintf(buf, cap, "[%s]:%u", h, ntohs(a->sin6_port));
        return true;
    }
    if (ls.ss_family == AF_UNIX) {
        const struct sockaddr_un *l = (const struct sockaddr_un *)&ls;
        size_t n = ll > offsetof(struct sockaddr_un, sun_path)
                       ? ll - offsetof(struct sockaddr_un, sun_path)
                       : 0;
        if (strncmp(s->bound, "ipc://", 6) != 0 || n == 0 ||
            strncmp(l->sun_path, s->bound + 6, n) != 0)
            return false;
        snprintf(buf, cap, "a local process");
        return true;
    }
    return false;
}

/* Peeks at our copy of a publisher's fd. Out of line and named in the TSan suppressions
 * (zsub.c) with kvr_zsub_fd_copy: TSan did not see the copy made (fcntl F_DUPFD), only an
 * earlier socket of the same number (an HTTP connection libuv accepted and closed), and
 * reported the peek as a race with that accept. */
__attribute__((noinline)) ssize_t kvr_zsub_fd_peek(int fd, char *b)
{
    return recv(fd, b, 1, MSG_PEEK | MSG_DONTWAIT);
}

/* After libzmq closed its fd: did the publisher end the connection (end of stream, reset),
 * or is it still open from its side (ZeroMQ dropped it)? */
static bool closed_by_peer(int dupfd)
{
    char b;
    ssize_t r = kvr_zsub_fd_peek(dupfd, &b);
    if (r == 0)
        return true;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        return true; /* reset, or not a connected socket any more */
    return false;    /* unread bytes, or open and quiet */
}

void kvr_zsub_bind_monitor_event(struct kvr_zsub *z, struct source *s, uint16_t ev,
                                 uint32_t value)
{
    struct pconn *c;
    int fd = (int)value;

    switch (ev) {
    case ZMQ_EVENT_ACCEPTED:
        if ((c = conn_find(s, fd)) != NULL) /* a stale entry: the fd was reused */
            conn_drop(s, c);
        if (!kvr_zsub_grow((void **)&s->conns, &s->capconns, s->nconns + 1, sizeof(*s->conns)))
            return;
        c = &s->conns[s->nconns];
        c->fd = fd;
        /* libzmq may already have closed the fd, and the kernel reused it: conn_of() keeps
         * us from holding another module's socket. Another connection of this same socket
         * may be misattributed (only this counter and log line, and we close our copy at
         * the next DISCONNECTED of that fd number). */
        c->dupfd = kvr_zsub_fd_copy(fd);
        if (c->dupfd < 0 || !conn_of(s, c->dupfd, c->peer, sizeof(c->peer))) {
            if (c->dupfd >= 0)
                kvr_zsub_fd_copy_close(c->dupfd);
            return;
        }
        s->nconns++;
        KVR_CNT_INC(z->publisher_connects);
        kvr_log_debug("events: publisher %s connected to %s", c->peer, s->bound);
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        /* The ZAP handler refused it (counted there). These events carry an error code, not
         * the fd: with one I/O thread the connection's DISCONNECTED comes next, and is not a
         * drop. */
        s->refusals++;
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        s->refusals++;
        KVR_CNT_INC(z->rejected[KVR_ZSUB_REJ_HANDSHAKE]);
        kvr_log_limited(&z->rl_admit, KVR_LOG_WARN,
                        "events: refused a publisher on %s: handshake (%s)", s->bound,
                        ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                            ? (z->curve_on ? "CURVE is required: no CURVE, or a bad one"
                                           : "ZeroMQ protocol error")
                            : "closed or failed before the handshake finished");
        break;
    case ZMQ_EVENT_DISCONNECTED:
        c = conn_find(s, fd);
        if (s->refusals > 0) {
            s->refusals--;
            if (c != NULL)
                conn_drop(s, c);
            return;
        }
        if (c == NULL)
            return;
        if (closed_by_peer(c->dupfd)) {
            KVR_CNT_INC(z->publisher_disconnects);
            kvr_log_limited(&z->rl_conn, KVR_LOG_INFO, "events: publisher %s disconnected from %s",
                            c->peer, s->bound);
        } else {
            KVR_CNT_INC(z->connections_dropped);
            kvr_log_limited(&z->rl_conn, KVR_LOG_WARN,
                            "events: dropped the connection of publisher %s on %s: it sent a "
                            "message over max_message_size (%" PRId64 " bytes) or broke the "
                            "ZeroMQ protocol; the message is lost (its stream will see a gap)",
                            c->peer, s->bound, z->o.max_message_size);
        }
        conn_drop(s, c);
        break;
    default:
        break;
    }
}
