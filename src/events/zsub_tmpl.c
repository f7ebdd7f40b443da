/* zsub_tmpl.c — replay address templates: "tcp://{pod}:{5558+rank}" → the ROUTER address of
 * one engine's DP rank, from the pod id of its topic and the rank of its batches.
 *
 * Why: in bind mode engines dial us, so their replay ROUTER's address is nowhere in our
 * configuration; vLLM binds it on replay_endpoint's port plus the DP rank
 * (offset_endpoint_port), and with llm-d's topic convention the pod id is the pod's IP. So
 * the address can be named from what a message carries ([events] bind_replay; also a connect
 * endpoint's replay= for a replica fed by a primary's forward socket, whose messages come from
 * many engines).
 *
 * Security: the pod id comes from the network, and we dial what the template makes of it.
 * Only a pod id that can be a host is substituted: an IPv4 or IPv6 address (IPv6 put in
 * brackets), or a DNS name of RFC 1123 labels; anything else (ports, paths, '@', '%',
 * spaces, "*", empty labels) is refused and the stream gets no replay. Which peers may send
 * which pod ids is admission's job ([events] allow, pod_must_match_peer: docs/security.md).
 *
 * Pure functions, no allocation, any thread; zsub's receive thread builds addresses when a
 * replay starts, conf (kvrouterd -t, via daemon.c) checks templates.
 */
#include "events/zsub.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PORT 65535u

bool kvr_zsub_pod_is_host(const char *pod, size_t len)
{
    char buf[KVR_ZSUB_ADDR_MAX];
    unsigned char a[sizeof(struct in6_addr)];
    size_t label = 0;

    if (len == 0 || len > 253)
        return false;
    memcpy(buf, pod, len);
    buf[len] = '\0';
    if (memchr(pod, '\0', len) != NULL)
        return false;
    if (inet_pton(AF_INET, buf, a) == 1 || inet_pton(AF_INET6, buf, a) == 1)
        return true;
    /* A DNS name: labels of 1..63 [A-Za-z0-9-], neither starting nor ending with '-'. */
    for (size_t i = 0; i <= len; i++) {
        char ch = i < len ? pod[i] : '.';
        if (ch == '.') {
            if (label == 0 || pod[i - 1] == '-')
                return false;
            label = 0;
        } else if (isalnum((unsigned char)ch) || (ch == '-' && label > 0)) {
            if (++label > 63)
                return false;
        } else {
            return false;
        }
    }
    return true;
}

/* The placeholder at p ('{'): PH_POD, PH_RANK or PH_OFFSET (*base = N of {N+rank}); its
 * length in *n. -1 when it is none of them. */
enum { PH_POD = 1, PH_RANK, PH_OFFSET };
static int placeholder(const char *p, size_t *n, uint32_t *base)
{
    size_t d = 0;
    uint32_t v = 0;

    if (strncmp(p, "{pod}", 5) == 0) {
        *n = 5;
        return PH_POD;
    }
    if (strncmp(p, "{rank}", 6) == 0) {
        *n = 6;
        return PH_RANK;
    }
    while (isdigit((unsigned char)p[1 + d]) && d < 5) {
        v = v * 10 + (uint32_t)(p[1 + d] - '0');
        d++;
    }
    if (d == 0 || v > MAX_PORT || strncmp(p + 1 + d, "+rank}", 6) != 0)
        return -1;
    *n = 1 + d + 6;
    *base = v;
    return PH_OFFSET;
}

/* tcp://HOST:PORT (PORT 1..65535, HOST not empty) or ipc://PATH, as built. */
static bool built_ok(const char *a)
{
    const char *colon;
    char *end;
    unsigned long port;

    if (strncmp(a, "ipc://", 6) == 0)
        return a[6] != '\0' && strlen(a + 6) <= 107;
    if (strncmp(a, "tcp://", 6) != 0)
        return false;
    colon = strrchr(a + 6, ':');
    if (colon == NULL || colon == a + 6 || !isdigit((unsigned char)colon[1]))
        return false;
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    return *end == '\0' && errno == 0 && port >= 1 && port <= MAX_PORT &&
           strchr(a + 6, '/') == NULL && strchr(a + 6, '*') == NULL;
}

int kvr_zsub_template_build(const char *tmpl, const char *pod, uint32_t rank, char *out,
                            size_t cap, struct kvr_err *err)
{
    size_t o = 0;

    if (cap == 0)
        return kvr_err_set(err, -ENAMETOOLONG, "no room for the address");
    for (const char *p = tmpl; *p != '\0';) {
        char piece[KVR_ZSUB_ADDR_MAX + 8];
        size_t n = 1, pl;
        uint32_t base = 0;
        int ph;

        if (*p == '}')
            return kvr_err_set(err, -EINVAL, "'}' without '{' at offset %zu", (size_t)(p - tmpl));
        if (isspace((unsigned char)*p) || !isprint((unsigned char)*p))
            return kvr_err_set(err, -EINVAL, "space or control character at offset %zu",
                               (size_t)(p - tmpl));
        if (*p != '{') {
            piece[0] = *p;
            pl = 1;
        } else if ((ph = placeholder(p, &n, &base)) < 0) {
            return kvr_err_set(err, -EINVAL, "unknown placeholder at offset %zu: expected "
                                             "{pod}, {rank} or {N+rank} (N at most %u)",
                               (size_t)(p - tmpl), MAX_PORT);
        } else if (ph == PH_POD) {
            size_t len = strlen(pod);
            bool v6 = memchr(pod, ':', len) != NULL;
            if (!kvr_zsub_pod_is_host(pod, len))
                return kvr_err_set(err, -EINVAL, "pod id '%.64s' is not a host name or address",
                                   pod);
            /* An IPv6 address goes in brackets, unless the template has them around {pod}. */
            if (v6 && !(p > tmpl && p[-1] == '[')) {
                pl = (size_t)snprintf(piece, sizeof(piece), "[%s]", pod);
            } else {
                pl = (size_t)snprintf(piece, sizeof(piece), "%s", pod);
            }
        } else if (ph == PH_RANK) {
            pl = (size_t)snprintf(piece, sizeof(piece), "%u", rank);
        } else {
            if ((uint64_t)base + rank > MAX_PORT)
                return kvr_err_set(err, -ERANGE, "port %u+%u is above %u", base, rank, MAX_PORT);
            pl = (size_t)snprintf(piece, sizeof(piece), "%u", base + rank);
        }
        if (o + pl >= cap)
            return kvr_err_set(err, -ENAMETOOLONG, "address longer than %zu bytes", cap - 1);
        memcpy(out + o, piece, pl);
        o += pl;
        p += n;
    }
    out[o] = '\0';
    if (!built_ok(out))
        return kvr_err_set(err, -EINVAL, "'%.200s' is not tcp://HOST:PORT (port 1..%u) or "
                                         "ipc://PATH",
                           out, MAX_PORT);
    return 0;
}

int kvr_zsub_template_check(const char *tmpl, struct kvr_err *err)
{
    char out[KVR_ZSUB_ADDR_MAX];
    int rc;

    if (strlen(tmpl) >= KVR_ZSUB_ADDR_MAX)
        return kvr_err_set(err, -EINVAL, "longer than %d bytes", KVR_ZSUB_ADDR_MAX - 1);
    if (strncmp(tmpl, "tcp://", 6) != 0 && strncmp(tmpl, "ipc://", 6) != 0)
        return kvr_err_set(err, -EINVAL, "expected tcp://HOST:PORT or ipc://PATH, where HOST "
                                         "may be {pod} and PORT {N+rank}");
    /* Built for a typical pod at rank 0: syntax, placeholders and the shape of the result. */
    rc = kvr_zsub_template_build(tmpl, "192.0.2.1", 0, out, sizeof(out), err);
    if (rc != 0)
        return rc;
    return 0;
}

bool kvr_zsub_template_uses_pod(const char *tmpl)
{
    return tmpl != NULL && strstr(tmpl, "{pod}") != NULL;
}
