/* cidr.c — address ranges and their matching (see cidr.h): the parsing of [events] allow
 * and of the peer addresses ZeroMQ reports. Its own module because it is a pure job with
 * its own tests (test_cidr: fixed cases and randomized checks against a naive bit-by-bit
 * reference); zsub (the ZAP handler, the pod check) and conf (validation) use it.
 * Threads: any.
 */
#include "core/cidr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static const uint8_t V4MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

static bool is_v4mapped(const uint8_t a[16])
{
    return memcmp(a, V4MAPPED, 12) == 0;
}

/* Parses a numeric address; *v4 tells which family the text was. */
static int parse_addr(const char *s, size_t len, uint8_t out[16], bool *v4)
{
    char buf[INET6_ADDRSTRLEN + 2];
    struct in_addr a4;

    if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
        s++;
        len -= 2;
        if (len == 0 || len >= sizeof(buf) || memchr(s, ':', len) == NULL)
            return -EINVAL;
        memcpy(buf, s, len);
        buf[len] = '\0';
        *v4 = false;
        return inet_pton(AF_INET6, buf, out) == 1 ? 0 : -EINVAL;
    }
    if (len == 0 || len >= sizeof(buf))
        return -EINVAL;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (inet_pton(AF_INET, buf, &a4) == 1) {
        memcpy(out, V4MAPPED, 12);
        memcpy(out + 12, &a4, 4);
        *v4 = true;
        return 0;
    }
    *v4 = false;
    return inet_pton(AF_INET6, buf, out) == 1 ? 0 : -EINVAL;
}

int kvr_cidr_addr(const char *s, size_t len, uint8_t out[16])
{
    bool v4;
    if (s == NULL)
        return -EINVAL;
    return parse_addr(s, len, out, &v4);
}

bool kvr_cidr_match(const struct kvr_cidr *c, const uint8_t addr[16])
{
    unsigned full = c->bits / 8, rest = c->bits % 8;

    if (memcmp(c->addr, addr, full) != 0)
        return false;
    if (rest == 0)
        return true;
    return ((c->addr[full] ^ addr[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

bool kvr_cidr_match_any(const struct kvr_cidr *c, size_t n, const uint8_t addr[16])
{
    for (size_t i = 0; i < n; i++)
        if (kvr_cidr_match(&c[i], addr))
            return true;
    return false;
}

int kvr_cidr_parse(const char *s, struct kvr_cidr *out)
{
    const char *slash;
    size_t alen;
    unsigned bits = 0, maxbits;
    bool v4;
    uint8_t a[16];

    if (s == NULL || out == NULL)
        return -EINVAL;
    slash = strchr(s, '/');
    alen = slash ? (size_t)(slash - s) : strlen(s);
    if (parse_addr(s, alen, a, &v4) != 0)
        return -EINVAL;
    maxbits = v4 ? 32 : 128;
    if (slash != NULL) {
        const char *p = slash + 1;
        size_t nd = strspn(p, "0123456789");
        if (nd == 0 || nd > 3 || p[nd] != '\0' || (nd > 1 && p[0] == '0'))
            return -EINVAL;
        for (size_t i = 0; i < nd; i++)
            bits = bits * 10 + (unsigned)(p[i] - '0');
        if (bits > maxbits)
            return -EINVAL;
    } else {
        bits = maxbits;
    }
    if (v4)
        bits += 96;
    /* Host bits must be clear. */
    for (unsigned i = bits; i < 128; i++)
        if (a[i / 8] & (0x80 >> (i % 8)))
            return -EINVAL;
    memcpy(out->addr, a, 16);
    out->bits = (uint8_t)bits;
    return 0;
}

void kvr_cidr_format(const struct kvr_cidr *c, char *buf, size_t cap)
{
    char t[INET6_ADDRSTRLEN];

    if (is_v4mapped(c->addr) && c->bits >= 96) {
        inet_ntop(AF_INET, c->addr + 12, t, sizeof(t));
        snprintf(buf, cap, "%s/%u", t, c->bits - 96u);
    } else {
        inet_ntop(AF_INET6, c->addr, t, sizeof(t));
        snprintf(buf, cap, "%s/%u", t, c->bits);
    }
}
