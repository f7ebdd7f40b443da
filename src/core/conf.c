/* conf.c — INI file → validated struct kvr_conf, driven by one table of directives.
 *
 * Files: conf.c (setters, INI walk, cross-checks), conf_table.c (the directive table),
 * conf_value.c (the syntax of values: sizes, durations, HOST:PORT, ZMQ endpoints),
 * conf_model.c ([model "NAME"]
 * sections) and conf_reload.c (SIGHUP: kvr_conf_apply_reload, moved out of this file), sharing
 * conf_int.h, which also holds the table's types so that conf_reload.c can walk it.
 *
 * Design
 *   - `kvr_conf_directives[]` below is the single source of truth: section, key, type,
 *     default (as the text a user would write), range, flags (repeatable, reloadable,
 *     empty-ok) and the field offset in struct kvr_conf. Defaults are applied by parsing the
 *     default text through the same setter as user input, so a default can never bypass
 *     validation. Reload and the "needs a restart" report (conf_reload.c) walk the same table.
 *   - libinih (Debian package, version 55) does the INI tokenizing through ini_parse_stream()
 *     with our own line reader. The reader is what gives us exact line numbers (the packaged
 *     library is built without INI_HANDLER_LINENO) and lets us normalise what the compiled-in
 *     inih options would otherwise decide for us:
 *       * leading whitespace is stripped, so an indented line is a normal line and never an
 *         inih multi-line continuation (INI_ALLOW_MULTILINE is on in the Debian build);
 *       * inline comments are cut here: " # ..." and " ; ..." (a '#' or ';' preceded by
 *         whitespace), whatever INI_ALLOW_INLINE_COMMENTS was at build time. Consequence:
 *         values cannot contain " #" or " ;";
 *       * section headers are checked here (unknown section, missing ']', trailing text), so an
 *         empty unknown section is an error too (inih only calls the handler for keys);
 *       * "key = value" lines without '=' are syntax errors; lines longer than inih's buffer
 *         (INI_MAX_LINE) are an error instead of being silently split.
 *     The reader stops the parse at the first error, so err holds the first problem.
 *   - After parsing: cross-checks (listen vs admin_listen, reconnect bounds, duplicate
 *     endpoints, at least one event source), reported at the line of the later directive.
 *
 * Pure parsing: no threads, no sockets, no globals written. Errors are "FILE:LINE: message".
 */
#include "core/conf.h"
#include "core/conf_int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base.h"
#include "core/log.h"
#include "core/modelfilter.h"

#define CONF_MAX_FILE_BYTES (1 << 20)
#define MAX_POD_ID 256



static const char *const sections[] = {"log", "events", "index", "http", "score", "route",
                                       "load", "tokenizer", "state", "daemon"};

static const struct {
    const char *name;
    double weight;
} default_weights[] = {{"gpu", 1.0}, {"cpu", 0.8}, {"storage", 0.5},
                       /* locality REMOTE blocks; SGLang's EXTERNAL (shared pool) medium */
                       {"remote", 0.6}, {"external", 0.4},
                       /* approximate mode's guesses (route.h): below a real GPU block */
                       {"assumed", 0.7},
                       /* a block a prefill routed there is computing (issue #26): the
                        * burst's siblings count it as cached (route.h, ttft) */
                       {"predicted", 1.0}};

/* Parser state shared by the line reader and the inih handler. */
struct pstate {
    struct kvr_conf *c;
    const char *file;
    const char *text;
    size_t len, pos;
    int lineno;
    int rc;               /* first error (negative errno) or 0 */
    struct kvr_err *err;
    int seen_line[KVR_CONF_MAX_DIRECTIVES]; /* line a directive was first set on, 0 = unset */
    int weight_line[KVR_CONF_MAX_TIERS]; /* per weights[] entry, 0 = default */
    int section_line;     /* line of the last [section] header */
    bool in_model;        /* the last header was [model "NAME"] (inih sees "[model]") */
};

/* ---- small helpers ------------------------------------------------------------------- */

static void *xrealloc_array(void *p, size_t n, size_t sz)
{
    if (n != 0 && sz > SIZE_MAX / n)
        return NULL;
    return realloc(p, n * sz);
}

static void fmt_size(char *buf, size_t cap, double v)
{
    int64_t b = (int64_t)v;
    if (b >= (int64_t)GiB && b % (int64_t)GiB == 0)
        snprintf(buf, cap, "%lldGiB", (long long)(b / (int64_t)GiB));
    else if (b >= (int64_t)MiB && b % (int64_t)MiB == 0)
        snprintf(buf, cap, "%lldMiB", (long long)(b / (int64_t)MiB));
    else if (b >= (int64_t)KiB && b % (int64_t)KiB == 0)
        snprintf(buf, cap, "%lldKiB", (long long)(b / (int64_t)KiB));
    else
        snprintf(buf, cap, "%lldB", (long long)b);
}

static void fmt_duration(char *buf, size_t cap, double v)
{
    int64_t ms = (int64_t)v;
    if (ms >= (int64_t)MS_H && ms % (int64_t)MS_H == 0)
        snprintf(buf, cap, "%lldh", (long long)(ms / (int64_t)MS_H));
    else if (ms >= (int64_t)MS_M && ms % (int64_t)MS_M == 0)
        snprintf(buf, cap, "%lldm", (long long)(ms / (int64_t)MS_M));
    else if (ms >= (int64_t)MS_S && ms % (int64_t)MS_S == 0)
        snprintf(buf, cap, "%llds", (long long)(ms / (int64_t)MS_S));
    else
        snprintf(buf, cap, "%lldms", (long long)ms);
}

static void fmt_range(char *buf, size_t cap, const struct directive *d)
{
    char lo[32], hi[32];
    switch (d->type) {
    case T_SIZE:
        fmt_size(lo, sizeof(lo), d->min);
        fmt_size(hi, sizeof(hi), d->max);
        break;
    case T_DURATION:
        fmt_duration(lo, sizeof(lo), d->min);
        fmt_duration(hi, sizeof(hi), d->max);
        break;
    case T_WEIGHT:
    case T_DOUBLE:
        snprintf(lo, sizeof(lo), "%g", d->min);
        snprintf(hi, sizeof(hi), "%g", d->max);
        break;
    default:
        snprintf(lo, sizeof(lo), "%.0f", d->min);
        snprintf(hi, sizeof(hi), "%.0f", d->max);
        break;
    }
    snprintf(buf, cap, "%s..%s", lo, hi);
}

/* ---- setters ------------------------------------------------------------------------- */

/* Error reporting from a setter: message without the FILE:LINE prefix. */
struct setctx {
    char msg[KVR_ERR_MSG_MAX - 64];
};

static int set_msg(struct setctx *sc, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_msg(struct setctx *sc, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sc->msg, sizeof(sc->msg), fmt, ap);
    va_end(ap);
    return rc;
}

static int bad_value(struct setctx *sc, const struct directive *d, const char *v,
                     const char *expected)
{
    return set_msg(sc, -EINVAL, "invalid value '%.200s' for [%s] %s: expected %s", v, d->section,
                   d->name, expected);
}

static int out_of_range(struct setctx *sc, const struct directive *d, const char *key,
                        const char *v)
{
    char r[80];
    fmt_range(r, sizeof(r), d);
    return set_msg(sc, -ERANGE, "[%s] %s = %.200s is out of range (%s)", d->section, key, v, r);
}

static int set_number(struct kvr_conf *c, const struct directive *d, const char *v,
                      struct setctx *sc)
{
    int64_t x = 0;
    uint64_t u;
    int rc, n;

    switch (d->type) {
    case T_DURATION:
        rc = kvr_conf_parse_duration(v, &x);
        if (rc == -EINVAL)
            return bad_value(sc, d, v, "a duration (e.g. 500ms, 10s, 5m, 1h; bare number = ms)");
        break;
    case T_SIZE:
        rc = kvr_conf_parse_size(v, &x);
        if (rc == -EINVAL)
            return bad_value(sc, d, v, "a size (e.g. 512B, 64KiB, 16MiB, 1GiB; bare number = bytes)");
        break;
    default: /* T_U32, T_I64 */
        n = kvr_conf_parse_digits(v, &u);
        if (n == -ERANGE) {
            rc = -ERANGE;
        } else if (n < 0 || v[n] != '\0') {
            return bad_value(sc, d, v, "a non-negative integer");
        } else {
            rc = u > (uint64_t)INT64_MAX ? -ERANGE : 0;
            x = (int64_t)u;
        }
        break;
    }
    if (rc == -ERANGE || (double)x < d->min || (double)x > d->max)
        return out_of_range(sc, d, d->name, v);
    if (d->type == T_U32)
        *FIELD(c, d, uint32_t) = (uint32_t)x;
    else
        *FIELD(c, d, int64_t) = x;
    return 0;
}

static int parse_double(const char *v, double *out)
{
    char *end;
    double x;

    if (v[0] == '\0' || isspace((unsigned char)v[0]))
        return -EINVAL;
    errno = 0;
    x = strtod(v, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(x))
        return -EINVAL;
    *out = x;
    return 0;
}

static int set_weight(struct kvr_conf *c, const struct directive *d, const char *key,
                      const char *v, struct pstate *st, struct setctx *sc)
{
    const char *tier = key + strlen("weight.");
    char lower[sizeof(c->weights[0].name)];
    size_t tl = strlen(tier), i;
    double w;

    if (tl == 0 || tl >= sizeof(lower))
        return set_msg(sc, -EINVAL, "invalid tier name '%.64s' in [score] %.100s: expected 1..%zu "
                                    "characters of [a-z0-9_-]",
                       tier, key, sizeof(lower) - 1);
    for (i = 0; i < tl; i++) {
        unsigned char ch = (unsigned char)tolower((unsigned char)tier[i]);
        if (!isalnum(ch) && ch != '_' && ch != '-')
            return set_msg(sc, -EINVAL, "invalid tier name '%.64s' in [score] %.100s: expected "
                                        "1..%zu characters of [a-z0-9_-]",
                           tier, key, sizeof(lower) - 1);
        lower[i] = (char)ch;
    }
    lower[tl] = '\0';
    if (parse_double(v, &w) != 0)
        return bad_value(sc, d, v, "a number (e.g. 0.8)");
    if (w < d->min || w > d->max)
        return out_of_range(sc, d, key, v);
    for (i = 0; i < c->nweights; i++)
        if (strcmp(c->weights[i].name, lower) == 0)
            break;
    if (i < c->nweights && st != NULL && st->weight_line[i] != 0)
        return set_msg(sc, -EINVAL, "duplicate key '%s' in section [score] (first set on line %d)",
                       key, st->weight_line[i]);
    if (i == c->nweights) {
        if (c->nweights == KVR_CONF_MAX_TIERS)
            return set_msg(sc, -ENOSPC, "too many tiers in [score]: at most %d weight.<tier> "
                                        "entries (including the defaults gpu, cpu, storage, "
                                        "remote, external, assumed, predicted)",
                           KVR_CONF_MAX_TIERS);
        memcpy(c->weights[i].name, lower, tl + 1);
        c->nweights++;
    }
    c->weights[i].weight = w;
    if (st != NULL)
        st->weight_line[i] = st->lineno;
    return 0;
}

/* A replay= with placeholders: its syntax is zsub's (kvr_zsub_template_check, called by
 * kvrouterd -t and at startup); here only what any endpoint needs. */
static bool replay_template_shape(const char *t)
{
    if (strchr(t, '{') == NULL || strlen(t) >= 256 ||
        (strncmp(t, "tcp://", 6) != 0 && strncmp(t, "ipc://", 6) != 0))
        return false;
    for (const char *p = t; *p; p++)
        if (isspace((unsigned char)*p) || !isprint((unsigned char)*p))
            return false;
    return true;
}

/* Parses "ENDPOINT [replay=ENDPOINT] [pod=ID]" into a new connect entry. */
static int add_connect(struct kvr_conf *c, const struct directive *d, const char *v, int line,
                       struct setctx *sc)
{
    struct kvr_conf_connect cc = {.line = line};
    char *copy = strdup(v), *save = NULL, *tok;
    struct kvr_conf_connect *grown;
    int rc = 0;

    if (copy == NULL)
        return set_msg(sc, -ENOMEM, "out of memory");
    tok = strtok_r(copy, " \t", &save);
    if (tok == NULL || kvr_conf_check_endpoint(tok, false) != 0) {
        rc = set_msg(sc, -EINVAL, "invalid endpoint '%.200s' for [events] connect: expected "
                                  "tcp://HOST:PORT, ipc://PATH or inproc://NAME",
                     tok ? tok : "");
        goto out;
    }
    cc.endpoint = strdup(tok);
    if (cc.endpoint == NULL)
        goto oom;
    while ((tok = strtok_r(NULL, " \t", &save)) != NULL) {
        if (strncmp(tok, "replay=", 7) == 0 && cc.replay == NULL) {
            if (kvr_conf_check_endpoint(tok + 7, false) != 0 && !replay_template_shape(tok + 7)) {
                rc = set_msg(sc, -EINVAL, "invalid replay endpoint '%.200s' for [events] connect: "
                                          "expected tcp://HOST:PORT, ipc://PATH, inproc://NAME "
                                          "or a template such as tcp://{pod}:{5558+rank}",
                             tok + 7);
                goto out;
            }
            if ((cc.replay = strdup(tok + 7)) == NULL)
                goto oom;
        } else if (strncmp(tok, "pod=", 4) == 0 && cc.pod == NULL) {
            size_t pl = strlen(tok + 4);
            if (pl == 0 || pl >= MAX_POD_ID) {
                rc = set_msg(sc, -EINVAL, "invalid pod id '%.200s' for [events] connect: expected "
                                          "1..%d printable characters",
                             tok + 4, MAX_POD_ID - 1);
                goto out;
            }
            for (const char *p = tok + 4; *p; p++) {
                if (!isprint((unsigned char)*p)) {
                    rc = set_msg(sc, -EINVAL, "invalid pod id for [events] connect: expected "
                                              "printable characters");
                    goto out;
                }
            }
            if ((cc.pod = strdup(tok + 4)) == NULL)
                goto oom;
        } else {
            rc = set_msg(sc, -EINVAL, "invalid option '%.200s' for [events] connect: expected "
                                      "replay=ENDPOINT or pod=ID (each at most once)",
                         tok);
            goto out;
        }
    }
    grown = xrealloc_array(c->connect, c->nconnect + 1, sizeof(*grown));
    if (grown == NULL)
        goto oom;
    c->connect = grown;
    c->connect[c->nconnect++] = cc;
    free(copy);
    (void)d;
    return 0;
oom:
    rc = set_msg(sc, -ENOMEM, "out of memory");
out:
    free(cc.endpoint);
    free(cc.replay);
    free(cc.pod);
    free(copy);
    return rc;
}

static int add_bind(struct kvr_conf *c, const char *v, int line, struct setctx *sc)
{
    char **grown;
    int *lines;
    char *dup;

    if (kvr_conf_check_endpoint(v, true) != 0)
        return set_msg(sc, -EINVAL, "invalid endpoint '%.200s' for [events] bind: expected "
                                    "tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or inproc://NAME",
                       v);
    dup = strdup(v);
    grown = dup ? xrealloc_array(c->bind, c->nbind + 1, sizeof(*grown)) : NULL;
    if (grown == NULL) {
        free(dup);
        return set_msg(sc, -ENOMEM, "out of memory");
    }
    c->bind = grown;
    lines = xrealloc_array(c->bind_line, c->nbind + 1, sizeof(*lines));
    if (lines == NULL) {
        free(dup);
        return set_msg(sc, -ENOMEM, "out of memory");
    }
    c->bind_line = lines;
    c->bind_line[c->nbind] = line;
    c->bind[c->nbind++] = dup;
    return 0;
}

static int add_cidr(struct kvr_conf *c, const struct directive *d, const char *v,
                    struct setctx *sc)
{
    struct kvr_cidr r, *grown;

    if (kvr_cidr_parse(v, &r) != 0)
        return bad_value(sc, d, v, "an IPv4 or IPv6 address or range with its host bits clear "
                                   "(e.g. 10.0.0.0/8, 127.0.0.1, ::1/128, fd00::/8)");
    grown = xrealloc_array(c->allow, c->nallow + 1, sizeof(*grown));
    if (grown == NULL)
        return set_msg(sc, -ENOMEM, "out of memory");
    c->allow = grown;
    c->allow[c->nallow++] = r;
    return 0;
}

static int set_bool(bool *field, const struct directive *d, const char *v, struct setctx *sc)
{
    if (kvr_conf_parse_bool(v, field) == 0)
        return 0;
    return bad_value(sc, d, v, "on or off (also true/false, yes/no, 1/0)");
}

static int set_string(char **field, const char *v, struct setctx *sc)
{
    char *dup = strdup(v);
    if (dup == NULL)
        return set_msg(sc, -ENOMEM, "out of memory");
    free(*field);
    *field = dup;
    return 0;
}

/* Applies one directive value. st is NULL when applying defaults. */
static int set_value(struct kvr_conf *c, const struct directive *d, const char *key,
                     const char *v, struct pstate *st, struct setctx *sc)
{
    switch (d->type) {
    case T_LEVEL: {
        enum kvr_log_level l;
        if (kvr_log_level_parse(v, &l) != 0)
            return bad_value(sc, d, v, "error, warn, info or debug");
        *FIELD(c, d, int) = (int)l;
        return 0;
    }
    case T_FORMAT:
        if (strcasecmp(v, "text") == 0)
            *FIELD(c, d, int) = KVR_LOG_TEXT;
        else if (strcasecmp(v, "json") == 0)
            *FIELD(c, d, int) = KVR_LOG_JSON;
        else
            return bad_value(sc, d, v, "text or json");
        return 0;
    case T_DURATION:
    case T_SIZE:
    case T_U32:
    case T_I64:
        return set_number(c, d, v, sc);
    case T_DOUBLE: {
        double x;
        if (parse_double(v, &x) != 0)
            return bad_value(sc, d, v, "a number (e.g. 0.5)");
        if (x < d->min || x > d->max)
            return out_of_range(sc, d, d->name, v);
        *FIELD(c, d, double) = x;
        return 0;
    }
    case T_STRING: {
        size_t l = strlen(v);
        if ((double)l > d->max)
            return set_msg(sc, -EINVAL, "value for [%s] %s is too long (%zu bytes, at most %.0f)",
                           d->section, d->name, l, d->max);
        for (const char *p = v; *p; p++)
            if (!isprint((unsigned char)*p))
                return bad_value(sc, d, v, "printable characters");
        return set_string(FIELD(c, d, char *), v, sc);
    }
    case T_HOSTPORT: {
        char host[256];
        int port;
        unsigned char tmp[sizeof(struct in6_addr)];
        if (kvr_conf_parse_hostport(v, host, sizeof(host), &port) != 0 ||
            (inet_pton(AF_INET, host, tmp) != 1 && inet_pton(AF_INET6, host, tmp) != 1))
            return bad_value(sc, d, v, "IP:PORT or [IPv6]:PORT with a numeric address and port "
                                       "0..65535 (e.g. 127.0.0.1:8080)");
        return set_string(FIELD(c, d, char *), v, sc);
    }
    case T_BIND:
        return add_bind(c, v, st != NULL ? st->lineno : 0, sc);
    case T_CIDR:
        return add_cidr(c, d, v, sc);
    case T_BOOL:
        return set_bool(FIELD(c, d, bool), d, v, sc);
    case T_CONNECT:
        return add_connect(c, d, v, st != NULL ? st->lineno : 0, sc);
    case T_WEIGHT:
        return set_weight(c, d, key, v, st, sc);
    }
    return set_msg(sc, -EINVAL, "internal: unknown directive type");
}

static const struct directive *find_directive(const char *section, const char *name)
{
    for (size_t i = 0; i < kvr_conf_ndirectives; i++) {
        const struct directive *d = &kvr_conf_directives[i];
        if (strcasecmp(d->section, section) != 0)
            continue;
        if (d->type == T_WEIGHT ? strncasecmp(name, "weight.", 7) == 0
                                : strcasecmp(d->name, name) == 0)
            return d;
    }
    return NULL;
}

static bool known_section(const char *s)
{
    for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++)
        if (strcasecmp(sections[i], s) == 0)
            return true;
    return false;
}

static int apply_defaults(struct kvr_conf *c, struct kvr_err *err)
{
    struct setctx sc;

    for (size_t i = 0; i < kvr_conf_ndirectives; i++) {
        const struct directive *d = &kvr_conf_directives[i];
        if (d->def == NULL)
            continue;
        if (set_value(c, d, d->name, d->def, NULL, &sc) != 0)
            return kvr_err_set(err, -EINVAL, "internal: bad default for [%s] %s: %s", d->section,
                               d->name, sc.msg);
    }
    for (size_t i = 0; i < sizeof(default_weights) / sizeof(default_weights[0]); i++) {
        snprintf(c->weights[i].name, sizeof(c->weights[i].name), "%s", default_weights[i].name);
        c->weights[i].weight = default_weights[i].weight;
    }
    c->nweights = sizeof(default_weights) / sizeof(default_weights[0]);
    return 0;
}

/* ---- inih glue ----------------------------------------------------------------------- */

static int fail(struct pstate *st, int line, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct pstate *st, int line, int rc, const char *fmt, ...)
{
    char msg[KVR_ERR_MSG_MAX];
    va_list ap;

    if (st->rc != 0)
        return st->rc; /* keep the first error */
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    st->rc = rc;
    kvr_err_set(st->err, rc, "%s:%d: %s", st->file, line, msg);
    return rc;
}

/* Checks a "[section]" line (leading whitespace already stripped, comment cut). */
static void check_section_line(struct pstate *st, const char *line)
{
    const char *close = strchr(line, ']');
    const char *p;
    char name[64];
    size_t n;

    if (close == NULL) {
        fail(st, st->lineno, -EINVAL, "missing ']' in section header");
        return;
    }
    for (p = close + 1; *p; p++) {
        if (!isspace((unsigned char)*p)) {
            fail(st, st->lineno, -EINVAL, "unexpected text after section header: '%.100s'", p);
            return;
        }
    }
    p = line + 1;
    n = (size_t)(close - p);
    st->in_model = false;
    if (n >= 5 && strncasecmp(p, "model", 5) == 0 && (n == 5 || p[5] == ' ' || p[5] == '\t' ||
                                                      p[5] == '"')) {
        char model[KVR_NAME_MAX + 1], msg[300];
        int rc = kvr_conf_model_header(p, n, model, sizeof(model), msg, sizeof(msg));
        if (rc == 0)
            rc = kvr_conf_model_add(st->c, model, st->lineno, msg, sizeof(msg));
        if (rc != 0) {
            fail(st, st->lineno, rc, "%s", msg);
            return;
        }
        /* inih gets "[model]": its section buffer is short, and the name is ours */
        strcpy((char *)line, "[model]");
        st->in_model = true;
        st->section_line = st->lineno;
        return;
    }
    if (n >= sizeof(name))
        n = sizeof(name) - 1;
    memcpy(name, p, n);
    name[n] = '\0';
    if (!known_section(name)) {
        fail(st, st->lineno, -EINVAL, "unknown section [%s] (expected one of [log], [events], "
                                      "[index], [http], [score], [route], [load], "
                                      "[tokenizer], [state], [daemon], [model \"NAME\"])",
             name);
        return;
    }
    st->section_line = st->lineno;
}

/* inih line reader: one source line per call (so st->lineno is inih's line number). */
static char *conf_reader(char *buf, int size, void *stream)
{
    struct pstate *st = stream;
    const char *start, *nl;
    size_t n, i;

    if (st->rc != 0 || st->pos >= st->len)
        return NULL;
    start = st->text + st->pos;
    nl = memchr(start, '\n', st->len - st->pos);
    n = nl ? (size_t)(nl - start) : st->len - st->pos;
    st->pos += n + (nl ? 1 : 0);
    st->lineno++;

    if (memchr(start, '\0', n) != NULL) {
        fail(st, st->lineno, -EINVAL, "NUL byte in line");
        return NULL;
    }
    /* UTF-8 BOM on the first line. */
    if (st->lineno == 1 && n >= 3 && memcmp(start, "\xEF\xBB\xBF", 3) == 0) {
        start += 3;
        n -= 3;
    }
    while (n > 0 && (*start == ' ' || *start == '\t')) {
        start++;
        n--;
    }
    while (n > 0 && isspace((unsigned char)start[n - 1]))
        n--;
    if (size <= 1 || n >= (size_t)size - 1) {
        fail(st, st->lineno, -EINVAL, "line too long (at most %d characters)", size - 2);
        return NULL;
    }
    memcpy(buf, start, n);
    buf[n] = '\0';
    if (n == 0 || buf[0] == '#' || buf[0] == ';')
        return buf;
    /* Cut an inline comment: '#' or ';' preceded by whitespace. */
    for (i = 1; i < n; i++) {
        if ((buf[i] == '#' || buf[i] == ';') && (buf[i - 1] == ' ' || buf[i - 1] == '\t')) {
            buf[i] = '\0';
            n = i;
            break;
        }
    }
    while (n > 0 && isspace((unsigned char)buf[n - 1]))
        buf[--n] = '\0';
    if (buf[0] == '[') {
        check_section_line(st, buf);
    } else if (strchr(buf, '=') == NULL) {
        fail(st, st->lineno, -EINVAL, "syntax error: expected 'key = value' or '[section]', "
                                      "got '%.100s'",
             buf);
    }
    return st->rc != 0 ? NULL : buf;
}

static int conf_handler(void *user, const char *section, const char *name, const char *value)
{
    struct pstate *st = user;
    const struct directive *d;
    struct setctx sc;
    size_t idx;

    if (st->rc != 0)
        return 0;
    if (section[0] == '\0') {
        fail(st, st->lineno, -EINVAL, "key '%.100s' outside of any section", name);
        return 0;
    }
    if (st->in_model) {
        char msg[600];
        int rc = kvr_conf_model_key(st->c, name, value, st->lineno, msg, sizeof(msg));
        if (rc != 0)
            fail(st, st->lineno, rc, "%s", msg);
        return rc == 0;
    }
    d = find_directive(section, name);
    if (d == NULL) {
        fail(st, st->lineno, -EINVAL, "unknown key '%.100s' in section [%s]", name, section);
        return 0;
    }
    idx = (size_t)(d - kvr_conf_directives);
    if (!(d->flags & F_REPEATABLE) && st->seen_line[idx] != 0) {
        fail(st, st->lineno, -EINVAL, "duplicate key '%s' in section [%s] (first set on line %d)",
             d->name, d->section, st->seen_line[idx]);
        return 0;
    }
    if (value[0] == '\0' && !(d->flags & F_EMPTY_OK)) {
        fail(st, st->lineno, -EINVAL, "empty value for [%s] %.100s", d->section, name);
        return 0;
    }
    if (set_value(st->c, d, name, value, st, &sc) != 0) {
        fail(st, st->lineno, -EINVAL, "%s", sc.msg);
        return 0;
    }
    if (st->seen_line[idx] == 0)
        st->seen_line[idx] = st->lineno;
    return 1;
}

static int seen_line(const struct pstate *st, const char *section, const char *name)
{
    const struct directive *d = find_directive(section, name);
    return d ? st->seen_line[d - kvr_conf_directives] : 0;
}

static int later(int a, int b)
{
    return a > b ? a : b;
}

/* Wildcard addresses overlap with every address of their family for the same port. */
static bool is_wildcard(const char *host)
{
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
}

/* tcp://HOST:* or tcp://HOST:0: each bind gets its own port, so repeats do not clash. */
static bool ephemeral(const char *ep)
{
    size_t n = strlen(ep);
    return n >= 2 && ep[n - 2] == ':' && (ep[n - 1] == '*' || ep[n - 1] == '0');
}

/* [state] bootstrap: http://HOST:PORT (an optional trailing '/'), nothing else. */
static bool bootstrap_ok(const char *v)
{
    char host[256], hp[300];
    int port;
    size_t n;

    if (strncmp(v, "http://", 7) != 0)
        return false;
    n = strlen(v + 7);
    if (n > 0 && v[7 + n - 1] == '/')
        n--;
    if (n == 0 || n >= sizeof(hp) || memchr(v + 7, '/', n) != NULL)
        return false;
    memcpy(hp, v + 7, n);
    hp[n] = '\0';
    /* a host name is fine here (the fetch resolves it): only the shape is checked */
    return kvr_conf_parse_hostport(hp, host, sizeof(host), &port) == 0 && port > 0;
}

/* [load] metrics_url: http:// or https://, a host part, printable characters without
 * spaces, and only the placeholders {pod}, {host} and {rank} (a lone '{' or '}' is an
 * error: it would be sent as is and most likely means a typo). NULL when fine, else what is
 * wrong. load.c expands it (kvr_load_url_expand) and trusts this check. */
static const char *metrics_url_problem(const char *t)
{
    static const char *const ph[] = {"{pod}", "{host}", "{rank}"};
    const char *p;

    if (strncmp(t, "http://", 7) == 0)
        p = t + 7;
    else if (strncmp(t, "https://", 8) == 0)
        p = t + 8;
    else
        return "expected a URL starting with http:// or https://";
    if (*p == '\0' || *p == '/' || *p == '?' || *p == '#')
        return "the URL has no host (e.g. http://{pod}/metrics)";
    for (p = t; *p; p++) {
        size_t i;
        if (isspace((unsigned char)*p) || !isprint((unsigned char)*p))
            return "the URL holds a space or a non-printable character";
        if (*p == '}')
            return "a '}' outside {pod}, {host} or {rank}";
        if (*p != '{')
            continue;
        for (i = 0; i < sizeof(ph) / sizeof(ph[0]); i++)
            if (strncmp(p, ph[i], strlen(ph[i])) == 0)
                break;
        if (i == sizeof(ph) / sizeof(ph[0]))
            return "unknown placeholder (expected {pod}, {host} or {rank})";
        p += strlen(ph[i]) - 1;
    }
    return NULL;
}

static void cross_check(struct pstate *st)
{
    struct kvr_conf *c = st->c;
    int eof = st->lineno > 0 ? st->lineno : 1;

    if (c->admin_listen != NULL) {
        char h1[256], h2[256];
        int p1, p2;
        if (kvr_conf_parse_hostport(c->listen, h1, sizeof(h1), &p1) == 0 &&
            kvr_conf_parse_hostport(c->admin_listen, h2, sizeof(h2), &p2) == 0 && p1 == p2 &&
            p1 != 0 && (strcmp(h1, h2) == 0 || is_wildcard(h1) || is_wildcard(h2))) {
            fail(st, later(seen_line(st, "http", "listen"), seen_line(st, "http", "admin_listen")),
                 -EINVAL, "[http] admin_listen %s conflicts with listen %s: use another port",
                 c->admin_listen, c->listen);
            return;
        }
    }
    if (c->reconnect_interval_max_ms != 0 &&
        c->reconnect_interval_max_ms < c->reconnect_interval_ms) {
        fail(st, later(seen_line(st, "events", "reconnect_interval"),
                       seen_line(st, "events", "reconnect_interval_max")),
             -EINVAL, "[events] reconnect_interval_max (%lldms) is below reconnect_interval "
                      "(%lldms); use 0 to disable the backoff",
             (long long)c->reconnect_interval_max_ms, (long long)c->reconnect_interval_ms);
        return;
    }
    for (size_t i = 0; i < c->nbind; i++) {
        for (size_t j = 0; j < i; j++) {
            if (strcmp(c->bind[i], c->bind[j]) == 0 && !ephemeral(c->bind[i])) {
                fail(st, eof, -EINVAL, "[events] bind %s is given twice", c->bind[i]);
                return;
            }
        }
    }
    for (size_t i = 0; i < c->nconnect; i++) {
        for (size_t j = 0; j < i; j++) {
            if (strcmp(c->connect[i].endpoint, c->connect[j].endpoint) == 0) {
                fail(st, eof, -EINVAL, "[events] connect %s is given twice",
                     c->connect[i].endpoint);
                return;
            }
        }
    }
    if ((c->curve_secret_key_file == NULL) != (c->curve_public_key_file == NULL)) {
        fail(st, later(seen_line(st, "events", "curve_secret_key_file"),
                       seen_line(st, "events", "curve_public_key_file")),
             -EINVAL, "[events] curve_secret_key_file and curve_public_key_file go together: "
                      "set both (CURVE on bind sockets) or neither");
        return;
    }
    if (c->curve_authorized_keys_file != NULL && c->curve_secret_key_file == NULL) {
        fail(st, seen_line(st, "events", "curve_authorized_keys_file"), -EINVAL,
             "[events] curve_authorized_keys_file needs curve_secret_key_file and "
             "curve_public_key_file");
        return;
    }
    c->bind_replay_line = seen_line(st, "events", "bind_replay");
    c->forward_line = seen_line(st, "events", "forward");
    if (c->bind_replay != NULL && c->nbind == 0) {
        fail(st, c->bind_replay_line, -EINVAL, "[events] bind_replay names the replay address "
                                               "of engines that connect to a bind socket, and "
                                               "there is no [events] bind");
        return;
    }
    if (c->events_models != NULL) {
        struct kvr_err me;
        if (kvr_modelfilter_check(c->events_models, &me) != 0) {
            fail(st, seen_line(st, "events", "models"), -EINVAL, "[events] models: %s", me.msg);
            return;
        }
    }
    if (c->forward != NULL) {
        if (kvr_conf_check_endpoint(c->forward, true) != 0) {
            fail(st, c->forward_line, -EINVAL, "invalid endpoint '%.200s' for [events] "
                                               "forward: expected tcp://HOST:PORT, "
                                               "tcp://*:PORT, ipc://PATH or inproc://NAME",
                 c->forward);
            return;
        }
        for (size_t i = 0; i < c->nbind; i++) {
            if (strcmp(c->forward, c->bind[i]) == 0 && !ephemeral(c->forward)) {
                fail(st, later(c->forward_line, c->bind_line ? c->bind_line[i] : 0), -EINVAL,
                     "[events] forward %s is also an [events] bind endpoint", c->forward);
                return;
            }
        }
    }
    if (strcmp(c->route_policy, "cost") != 0 && strcmp(c->route_policy, "cache_aware") != 0 &&
        strcmp(c->route_policy, "score") != 0 && strcmp(c->route_policy, "ttft") != 0) {
        fail(st, seen_line(st, "route", "policy"), -EINVAL,
             "[route] policy = %.100s: expected cost, cache_aware, score or ttft",
             c->route_policy);
        return;
    }
    if (strcmp(c->route_when_all_busy, "best") != 0 &&
        strcmp(c->route_when_all_busy, "reject") != 0) {
        fail(st, seen_line(st, "route", "when_all_busy"), -EINVAL,
             "[route] when_all_busy = %.100s: expected best or reject", c->route_when_all_busy);
        return;
    }
    for (const char *p = c->route_peers; p != NULL && *p;) { /* ZeroMQ endpoints */
        char ep[1024];
        size_t n = strcspn(p, " \t,");
        snprintf(ep, sizeof(ep), "%.*s", (int)(n < sizeof(ep) ? n : sizeof(ep) - 1), p);
        if (n > 0 && (n >= sizeof(ep) || kvr_conf_check_endpoint(ep, false) != 0)) {
            fail(st, seen_line(st, "route", "peers"), -EINVAL,
                 "[route] peers: %.200s is not an endpoint (tcp://HOST:PORT, ipc://PATH)", ep);
            return;
        }
        p += n;
        p += strspn(p, " \t,");
    }
    if (c->route_peer_bind != NULL && c->route_peer_bind[0] != '\0' &&
        kvr_conf_check_endpoint(c->route_peer_bind, true) != 0) {
        fail(st, seen_line(st, "route", "peer_bind"), -EINVAL,
             "[route] peer_bind = %.200s: not a bind endpoint (tcp://HOST:PORT, ipc://PATH)",
             c->route_peer_bind);
        return;
    }
    for (const char *h = c->route_session_header; h != NULL && *h; h++) {
        /* an HTTP field name: RFC 9110's token characters */
        if (!isalnum((unsigned char)*h) && strchr("!#$%&'*+-.^_`|~", *h) == NULL) {
            fail(st, seen_line(st, "route", "session_header"), -EINVAL,
                 "[route] session_header = %.100s: not an HTTP header name (letters, digits "
                 "and !#$%%&'*+-.^_`|~ only)", c->route_session_header);
            return;
        }
    }
    if (c->load_metrics_url != NULL && c->load_metrics_url[0] != '\0') {
        const char *why = metrics_url_problem(c->load_metrics_url);
        if (why != NULL) {
            fail(st, seen_line(st, "load", "metrics_url"), -EINVAL,
                 "[load] metrics_url = %.200s: %s", c->load_metrics_url, why);
            return;
        }
    }
    if (c->load_stale_after_ms < c->load_interval_ms) {
        fail(st, later(seen_line(st, "load", "stale_after"),
                       seen_line(st, "load", "metrics_interval")),
             -EINVAL, "[load] stale_after (%lldms) is below metrics_interval (%lldms): every "
                      "sample would be stale before the next scrape",
             (long long)c->load_stale_after_ms, (long long)c->load_interval_ms);
        return;
    }
    c->state_dir_line = seen_line(st, "state", "dir");
    c->curve_secret_key_line = seen_line(st, "events", "curve_secret_key_file");
    c->curve_public_key_line = seen_line(st, "events", "curve_public_key_file");
    c->curve_authorized_keys_line = seen_line(st, "events", "curve_authorized_keys_file");
    if (c->bootstrap != NULL && c->bootstrap[0] != '\0' && !bootstrap_ok(c->bootstrap)) {
        fail(st, seen_line(st, "state", "bootstrap"), -EINVAL,
             "[state] bootstrap = %.200s: expected http://HOST:PORT (a peer's admin listener)",
             c->bootstrap);
        return;
    }
    if (c->nbind == 0 && c->nconnect == 0) {
        fail(st, eof, -EINVAL, "no event source: set [events] bind (engines connect to us) "
                               "and/or [events] connect (we dial engines)");
        return;
    }
}

static int load_text(const char *name, const char *text, size_t len, struct kvr_conf *c,
                     struct kvr_err *err)
{
    struct pstate *st;
    int rc;

    memset(c, 0, sizeof(*c));
    c->path = strdup(name);
    if (c->path == NULL)
        return kvr_err_set(err, -ENOMEM, "%s: out of memory", name);
    rc = apply_defaults(c, err);
    if (rc != 0)
        goto fail;
    st = calloc(1, sizeof(*st));
    if (st == NULL) {
        rc = kvr_err_set(err, -ENOMEM, "%s: out of memory", name);
        goto fail;
    }
    st->c = c;
    st->file = name;
    st->text = text;
    st->len = len;
    st->err = err;
    rc = ini_parse_stream(conf_reader, st, conf_handler, st);
    if (st->rc == 0 && rc > 0) /* inih found something our reader let through */
        fail(st, rc, -EINVAL, "syntax error");
    else if (st->rc == 0 && rc < 0)
        fail(st, 1, -ENOMEM, "out of memory");
    if (st->rc == 0)
        cross_check(st);
    rc = st->rc;
    free(st);
    if (rc != 0)
        goto fail;
    return 0;
fail:
    kvr_conf_free(c);
    return rc == -ENOMEM ? rc : -EINVAL;
}

int kvr_conf_load_string(const char *name, const char *text, struct kvr_conf *c,
                         struct kvr_err *err)
{
    return load_text(name, text, strlen(text), c, err);
}

int kvr_conf_load(const char *path, struct kvr_conf *c, struct kvr_err *err)
{
    struct stat sb;
    char *buf = NULL;
    size_t got = 0;
    int fd, rc;

    memset(c, 0, sizeof(*c));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        return kvr_err_set(err, rc, "%s: cannot open: %s", path, strerror(-rc));
    }
    if (fstat(fd, &sb) != 0) {
        rc = -errno;
        kvr_err_set(err, rc, "%s: cannot stat: %s", path, strerror(-rc));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = kvr_err_set(err, -EINVAL, "%s: not a regular file", path);
        goto out;
    }
    if (sb.st_size > CONF_MAX_FILE_BYTES) {
        rc = kvr_err_set(err, -EFBIG, "%s: file too large (%lld bytes, at most %d)", path,
                         (long long)sb.st_size, CONF_MAX_FILE_BYTES);
        goto out;
    }
    buf = malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        rc = kvr_err_set(err, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            kvr_err_set(err, rc, "%s: cannot read: %s", path, strerror(-rc));
            goto out;
        }
        if (r == 0)
            break; /* file shrank: parse what we have */
        got += (size_t)r;
    }
    buf[got] = '\0';
    rc = load_text(path, buf, got, c, err);
out:
    free(buf);
    close(fd);
    return rc;
}

void kvr_conf_free(struct kvr_conf *c)
{
    if (c == NULL)
        return;
    free(c->path);
    for (size_t i = 0; i < c->nbind; i++)
        free(c->bind[i]);
    free(c->bind);
    free(c->bind_line);
    free(c->allow);
    free(c->curve_secret_key_file);
    free(c->curve_public_key_file);
    free(c->curve_authorized_keys_file);
    for (size_t i = 0; i < c->nconnect; i++) {
        free(c->connect[i].endpoint);
        free(c->connect[i].replay);
        free(c->connect[i].pod);
    }
    free(c->connect);
    free(c->subscribe);
    free(c->bind_replay);
    free(c->forward);
    free(c->events_models);
    free(c->state_dir);
    free(c->bootstrap);
    free(c->listen);
    free(c->admin_listen);
    free(c->admin_token);
    free(c->route_policy);
    free(c->route_when_all_busy);
    free(c->route_session_header);
    free(c->route_peer_bind);
    free(c->route_peers);
    free(c->load_metrics_url);
    kvr_conf_models_free(c);
    memset(c, 0, sizeof(*c));
}

double kvr_conf_tier_weight(const struct kvr_conf *c, const char *tier)
{
    for (size_t i = 0; i < c->nweights; i++)
        if (strcasecmp(c->weights[i].name, tier) == 0)
            return c->weights[i].weight;
    return c->default_weight;
}
