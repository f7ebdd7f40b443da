/* conf_value.c — the syntax of directive values: unsigned integers, sizes ("64KiB"),
 * durations ("500ms"), HOST:PORT and ZMQ endpoints. Text in, value or -errno out.
 *
 * Why its own file: these parsers know nothing of the directive table, the INI walk or
 * struct kvr_conf (conf.c); they are the part other modules call too (http.c and daemon.c
 * parse listen addresses with kvr_conf_parse_hostport) and the part test_conf and fuzz_conf
 * exercise directly. conf.c's setters use them through conf_int.h.
 *
 * Pure functions; any thread.
 */
#include "core/conf.h"
#include "core/conf_int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#define MAX_ENDPOINT 512

/* Parses an unsigned decimal integer prefix; returns chars consumed or -1/-ERANGE. */
int kvr_conf_parse_digits(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    int n = 0;
    while (isdigit((unsigned char)s[n])) {
        unsigned dgt = (unsigned)(s[n] - '0');
        if (v > (UINT64_MAX - dgt) / 10)
            return -ERANGE;
        v = v * 10 + dgt;
        n++;
    }
    if (n == 0)
        return -1;
    *out = v;
    return n;
}

/* ---- shared parsers (exported) ------------------------------------------------------- */

struct unit {
    const char *name;
    int64_t mul;
};

/* Digits followed by one of units[] (strcasecmp when nocase): the product, -ERANGE past
 * INT64_MAX, -EINVAL otherwise. */
static int parse_with_unit(const char *s, const struct unit *units, size_t nunits, bool nocase,
                           int64_t *out)
{
    uint64_t v;
    int n;

    if (s == NULL)
        return -EINVAL;
    n = kvr_conf_parse_digits(s, &v);
    if (n == -ERANGE)
        return -ERANGE;
    if (n < 0)
        return -EINVAL;
    for (size_t i = 0; i < nunits; i++) {
        if ((nocase ? strcasecmp(s + n, units[i].name) : strcmp(s + n, units[i].name)) == 0) {
            if (v > (uint64_t)(INT64_MAX / units[i].mul))
                return -ERANGE;
            *out = (int64_t)v * units[i].mul;
            return 0;
        }
    }
    return -EINVAL;
}

int kvr_conf_parse_size(const char *s, int64_t *out)
{
    static const struct unit units[] = {{"", 1},           {"B", 1},
                                        {"K", 1LL << 10},  {"KiB", 1LL << 10},
                                        {"M", 1LL << 20},  {"MiB", 1LL << 20},
                                        {"G", 1LL << 30},  {"GiB", 1LL << 30}};

    return parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), true, out);
}

int kvr_conf_parse_duration(const char *s, int64_t *ms)
{
    static const struct unit units[] = {
        {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};

    return parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), false, ms);
}

static bool is_hostname(const char *h, size_t n)
{
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (!isalnum(ch) && ch != '.' && ch != '-' && ch != '_')
            return false;
    }
    return h[0] != '-' && h[0] != '.';
}

/* Port: decimal 0..65535 (or "*" when allow_star, reported as 0). Whole string. */
static int parse_port(const char *s, bool allow_star, int *port)
{
    uint64_t v;
    int n;

    if (allow_star && strcmp(s, "*") == 0) {
        *port = 0;
        return 0;
    }
    n = kvr_conf_parse_digits(s, &v);
    if (n <= 0 || s[n] != '\0' || n > 5 || v > 65535)
        return -EINVAL;
    *port = (int)v;
    return 0;
}

/* Splits "HOST:PORT" / "[V6]:PORT" into host (without brackets) and the port text. */
static int split_hostport(const char *s, char *host, size_t cap, const char **port_text,
                          bool *bracketed)
{
    const char *colon;
    size_t hl;

    *bracketed = false;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL || close[1] != ':')
            return -EINVAL;
        hl = (size_t)(close - s - 1);
        if (hl == 0 || hl >= cap)
            return -EINVAL;
        memcpy(host, s + 1, hl);
        host[hl] = '\0';
        *port_text = close + 2;
        *bracketed = true;
        return 0;
    }
    colon = strrchr(s, ':');
    if (colon == NULL)
        return -EINVAL;
    hl = (size_t)(colon - s);
    if (hl == 0 || hl >= cap || memchr(s, ':', hl) != NULL) /* bare v6 needs brackets */
        return -EINVAL;
    memcpy(host, s, hl);
    host[hl] = '\0';
    *port_text = colon + 1;
    return 0;
}

int kvr_conf_parse_hostport(const char *s, char *host, size_t cap, int *port)
{
    char h[256];
    const char *pt;
    bool br;
    unsigned char tmp[sizeof(struct in6_addr)];

    if (s == NULL || split_hostport(s, h, sizeof(h), &pt, &br) != 0)
        return -EINVAL;
    if (br) {
        if (inet_pton(AF_INET6, h, tmp) != 1)
            return -EINVAL;
    } else if (!is_hostname(h, strlen(h))) {
        return -EINVAL;
    }
    if (parse_port(pt, false, port) != 0)
        return -EINVAL;
    if (strlen(h) >= cap)
        return -ENAMETOOLONG;
    memcpy(host, h, strlen(h) + 1);
    return 0;
}

/* ZMQ endpoint syntax. for_bind: tcp host may be '*' and the port '*' or 0 (ephemeral). */
int kvr_conf_check_endpoint(const char *ep, bool for_bind)
{
    char h[256];
    const char *pt;
    bool br;
    int port;
    unsigned char tmp[sizeof(struct in6_addr)];

    if (strlen(ep) >= MAX_ENDPOINT)
        return -EINVAL;
    for (const char *p = ep; *p; p++)
        if (isspace((unsigned char)*p) || !isprint((unsigned char)*p))
            return -EINVAL;
    if (strncmp(ep, "ipc://", 6) == 0)
        return ep[6] != '\0' && strlen(ep + 6) <= 107 ? 0 : -EINVAL;
    if (strncmp(ep, "inproc://", 9) == 0)
        return ep[9] != '\0' ? 0 : -EINVAL;
    if (strncmp(ep, "tcp://", 6) != 0)
        return -EINVAL;
    if (split_hostport(ep + 6, h, sizeof(h), &pt, &br) != 0)
        return -EINVAL;
    if (br) {
        if (inet_pton(AF_INET6, h, tmp) != 1)
            return -EINVAL;
    } else if (strcmp(h, "*") == 0) {
        if (!for_bind)
            return -EINVAL;
    } else if (!is_hostname(h, strlen(h))) {
        return -EINVAL;
    }
    if (parse_port(pt, for_bind, &port) != 0)
        return -EINVAL;
    if (!for_bind && port == 0)
        return -EINVAL;
    return 0;
}

int kvr_conf_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no",
                                                                               "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}
