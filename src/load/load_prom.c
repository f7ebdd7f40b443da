/* load_prom.c — the narrow reader of the Prometheus text format (0.0.4) behind load.c.
 *
 * What it reads: the samples of a few names (the table below), per DP rank; every other line
 * is skipped after its name, unread: an engine's /metrics is mostly histogram buckets the
 * router has no use for, and a strict parse of them would only add ways to fail. A line
 * of a name that is read must be well formed:
 *     name [ '{' label '=' '"' value '"' { ',' ... } [ ',' ] '}' ] value [ timestamp ]
 * blanks and tabs between tokens, leading blanks, trailing blanks/tabs/CRs (CRLF files),
 * label values with the escapes \\ \" \n, values as Go's ParseFloat writes them (decimal,
 * exponent, NaN, +Inf, -Inf), an optional integer timestamp (ignored: the sample's time is
 * when it arrived). Anything else on such a line makes it malformed: counted, and the rest
 * of the answer is still read. Comments (# HELP, # TYPE, anything after '#') and blank lines
 * are skipped; the last line may lack its newline.
 *
 * Ranks: label dp_rank (SGLang), else engine (vLLM's engine index), else rank 0. A series
 * labelled tp_rank or pp_rank other than "0" is skipped: the rank-0 scheduler of a DP rank
 * speaks for it (SGLang with --enable-metrics-for-all-schedulers exports one series per TP
 * rank, all counting the same requests). Several series of one name for one rank (model_name,
 * priority, ...) add up; for KV usage the largest wins.
 *
 * Input is fed in pieces cut anywhere (load.c feeds each chunk libcurl hands it): complete
 * lines are read in place, the unfinished tail is kept (at most KVR_LOAD_PROM_MAX_LINE bytes:
 * a longer line is judged by its first KVR_LOAD_PROM_MAX_LINE bytes and dropped), so the
 * result never depends on where the cuts fall (tests/fuzz/fuzz_load_prom.c checks it).
 *
 * Pure: no I/O, no globals written, one state per answer; a bad byte is counted, never
 * asserted on.
 */
#include "load/load_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The names read. prio: 2 current, 1 a deprecated alias (kept while engines still export
 * both; the current one wins). Sources: docs/load.md. */
static const struct {
    const char *name;
    uint8_t len;
    uint8_t field;
    uint8_t prio;
} names[] = {
#define N(s, f, p) {s, sizeof(s) - 1, f, p}
    N("vllm:num_requests_waiting", KVR_LOAD_WAITING, 2),
    N("vllm:num_requests_running", KVR_LOAD_RUNNING, 2),
    N("vllm:kv_cache_usage_perc", KVR_LOAD_KV_USAGE, 2),
    N("vllm:gpu_cache_usage_perc", KVR_LOAD_KV_USAGE, 1),
    N("vllm:prompt_tokens_total", KVR_LOAD_PROMPT, 2),
    N("vllm:prefix_cache_hits_total", KVR_LOAD_HITS, 2),
    N("vllm:gpu_prefix_cache_hits_total", KVR_LOAD_HITS, 1),
    N("vllm:prefix_cache_queries_total", KVR_LOAD_QUERIES, 2),
    N("vllm:gpu_prefix_cache_queries_total", KVR_LOAD_QUERIES, 1),
    N("sglang:num_queue_reqs", KVR_LOAD_WAITING, 2),
    N("sglang:num_running_reqs", KVR_LOAD_RUNNING, 2),
    N("sglang:token_usage", KVR_LOAD_KV_USAGE, 2),
    N("sglang:prompt_tokens_total", KVR_LOAD_PROMPT, 2),
    N("sglang:cached_tokens_total", KVR_LOAD_HITS, 2),
    N("trtllm_num_requests_waiting", KVR_LOAD_WAITING, 2),
    N("trtllm_num_requests_running", KVR_LOAD_RUNNING, 2),
    N("trtllm_kv_cache_utilization", KVR_LOAD_KV_USAGE, 2),
#undef N
};

static bool name_start(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

static bool name_char(unsigned char c)
{
    return name_start(c) || (c >= '0' && c <= '9');
}

static bool label_start(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool label_char(unsigned char c)
{
    return label_start(c) || (c >= '0' && c <= '9');
}

static bool blank(unsigned char c)
{
    return c == ' ' || c == '\t';
}

/* Index into names[] of s[0..n), or -1. */
static int lookup(const char *s, size_t n)
{
    /* every name read starts with one of three prefixes: most lines stop here */
    if (n < 7 || (s[0] != 'v' && s[0] != 's' && s[0] != 't'))
        return -1;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (names[i].len == n && memcmp(names[i].name, s, n) == 0)
            return (int)i;
    return -1;
}

/* A rank label's value: 1..5 decimal digits, at most KVR_LOAD_PROM_RANK_MAX. */
static bool parse_rank(const char *s, size_t n, uint32_t *out)
{
    uint32_t v = 0;
    if (n == 0 || n > 5)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint32_t)(s[i] - '0');
    }
    if (v > KVR_LOAD_PROM_RANK_MAX)
        return false;
    *out = v;
    return true;
}

static bool ieq(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    if (n != l)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return false;
    }
    return true;
}

/* A sample value as Go's strconv.ParseFloat writes it: [+-] then digits with an optional
 * fraction and exponent, or Inf / Infinity / NaN (any case). 0 and *out, or -1. */
static int parse_value(const char *s, size_t n, double *out)
{
    char buf[64];
    size_t i = 0, digits = 0;
    char *end;

    if (n == 0 || n >= sizeof(buf))
        return -1;
    if (s[0] == '+' || s[0] == '-')
        i++;
    if (ieq(s + i, n - i, "inf") || ieq(s + i, n - i, "infinity")) {
        *out = s[0] == '-' ? -INFINITY : INFINITY;
        return 0;
    }
    if (ieq(s + i, n - i, "nan")) {
        *out = NAN;
        return 0;
    }
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, digits++;
    }
    if (digits == 0)
        return -1;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t ed = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, ed++;
        if (ed == 0)
            return -1;
    }
    if (i != n)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *out = strtod(buf, &end); /* the C locale: kvrouterd never calls setlocale */
    return end == buf + n ? 0 : -1;
}

/* An optional timestamp: [+-] digits (an int64 in Go's parser; the value is not used). */
static bool timestamp_ok(const char *s, size_t n)
{
    size_t i = 0;
    if (n > 0 && (s[0] == '+' || s[0] == '-'))
        i++;
    if (i == n || n - i > 19)
        return false;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

static struct kvr_load_prom_rank *rank_slot(struct kvr_load_prom *p, uint32_t rank)
{
    for (size_t i = 0; i < p->nranks; i++)
        if (p->ranks[i].rank == rank)
            return &p->ranks[i];
    if (p->nranks == KVR_LOAD_PROM_MAX_RANKS)
        return NULL;
    if (p->nranks == p->rcap) {
        size_t nc = p->rcap ? p->rcap * 2 : 4;
        struct kvr_load_prom_rank *g;
        if (nc > KVR_LOAD_PROM_MAX_RANKS)
            nc = KVR_LOAD_PROM_MAX_RANKS;
        g = realloc(p->ranks, nc * sizeof(*g));
        if (g == NULL)
            return NULL;
        p->ranks = g;
        p->rcap = nc;
    }
    memset(&p->ranks[p->nranks], 0, sizeof(p->ranks[0]));
    p->ranks[p->nranks].rank = rank;
    return &p->ranks[p->nranks++];
}

static void keep(struct kvr_load_prom *p, int idx, uint32_t rank, double v)
{
    struct kvr_load_prom_rank *r;
    int f = names[idx].field;
    uint8_t prio = names[idx].prio;

    if (!isfinite(v) || v < 0) {
        p->ignored++;
        return;
    }
    if (f == KVR_LOAD_KV_USAGE && v > 1)
        v = 1;
    r = rank_slot(p, rank);
    if (r == NULL) {
        p->ignored++;
        return;
    }
    if (prio > r->prio[f]) {
        r->prio[f] = prio;
        r->v[f] = v;
    } else if (prio == r->prio[f]) {
        if (f == KVR_LOAD_KV_USAGE)
            r->v[f] = v > r->v[f] ? v : r->v[f];
        else
            r->v[f] += v;
    }
    p->samples++;
}

/* The labels that matter, as found in one line. */
struct labels {
    const char *dp, *engine; /* raw values (no escapes in a valid rank) */
    size_t dpn, enginen;
    bool skip;               /* tp_rank or pp_rank other than "0" */
    bool has_dp, has_engine, has_tp, has_pp;
};

static void label_seen(struct labels *lb, const char *name, size_t nn, const char *v,
                       size_t vn, bool escaped)
{
    if (nn == 7 && memcmp(name, "dp_rank", 7) == 0 && !lb->has_dp) {
        lb->has_dp = true;
        lb->dp = escaped ? "" : v; /* an escape is never part of a valid rank */
        lb->dpn = escaped ? 0 : vn;
    } else if (nn == 6 && memcmp(name, "engine", 6) == 0 && !lb->has_engine) {
        lb->has_engine = true;
        lb->engine = escaped ? "" : v;
        lb->enginen = escaped ? 0 : vn;
    } else if (nn == 7 && memcmp(name, "tp_rank", 7) == 0 && !lb->has_tp) {
        lb->has_tp = true;
        if (escaped || vn != 1 || v[0] != '0')
            lb->skip = true;
    } else if (nn == 7 && memcmp(name, "pp_rank", 7) == 0 && !lb->has_pp) {
        lb->has_pp = true;
        if (escaped || vn != 1 || v[0] != '0')
            lb->skip = true;
    }
}

/* Parses '{' ... '}' from s[*i] (s[*i] == '{'). false when malformed. */
static bool parse_labels(const char *s, size_t n, size_t *pi, struct labels *lb)
{
    size_t i = *pi + 1;

    for (;;) {
        size_t ns, ne, vs;
        bool escaped = false;

        while (i < n && blank((unsigned char)s[i]))
            i++;
        if (i < n && s[i] == '}') {
            *pi = i + 1;
            return true;
        }
        if (i >= n || !label_start((unsigned char)s[i]))
            return false;
        ns = i;
        while (i < n && label_char((unsigned char)s[i]))
            i++;
        ne = i;
        while (i < n && blank((unsigned char)s[i]))
            i++;
        if (i >= n || s[i] != '=')
            return false;
        i++;
        while (i < n && blank((unsigned char)s[i]))
            i++;
        if (i >= n || s[i] != '"')
            return false;
        vs = ++i;
        for (;;) {
            if (i >= n)
                return false;
            if (s[i] == '"')
                break;
            if (s[i] == '\\') {
                if (i + 1 >= n || (s[i + 1] != '\\' && s[i + 1] != '"' && s[i + 1] != 'n'))
                    return false;
                escaped = true;
                i += 2;
                continue;
            }
            i++;
        }
        label_seen(lb, s + ns, ne - ns, s + vs, i - vs, escaped);
        i++; /* the closing quote */
        while (i < n && blank((unsigned char)s[i]))
            i++;
        if (i < n && s[i] == ',') {
            i++;
            continue;
        }
        if (i < n && s[i] == '}') {
            *pi = i + 1;
            return true;
        }
        return false;
    }
}

/* A line longer than KVR_LOAD_PROM_MAX_LINE, judged by its first bytes s[0..n): malformed
 * when it is a sample of a name that is read (or no sample at all), else skipped. */
/* The metric name a line starts with, [*ns, *ne): 1; 0 for blanks or a comment (nothing to
 * read); -1, counted malformed, when something else starts it. */
static int line_name(struct kvr_load_prom *p, const char *s, size_t n, size_t *ns, size_t *ne)
{
    size_t i = 0;

    while (i < n && blank((unsigned char)s[i]))
        i++;
    if (i == n || s[i] == '#')
        return 0;
    if (!name_start((unsigned char)s[i])) {
        p->malformed++;
        return -1;
    }
    *ns = i;
    while (i < n && name_char((unsigned char)s[i]))
        i++;
    *ne = i;
    return 1;
}

static void overlong(struct kvr_load_prom *p, const char *s, size_t n)
{
    size_t ns, ne;

    p->lines++;
    if (line_name(p, s, n, &ns, &ne) == 1 && ne < n && lookup(s + ns, ne - ns) >= 0)
        p->malformed++;
}

static void parse_line(struct kvr_load_prom *p, const char *s, size_t n)
{
    struct labels lb;
    size_t i = 0, ns, ne, vs;
    uint32_t rank = 0;
    double v;
    int idx;

    if (n > KVR_LOAD_PROM_MAX_LINE) {
        overlong(p, s, KVR_LOAD_PROM_MAX_LINE);
        return;
    }
    p->lines++;
    while (n > 0 && (blank((unsigned char)s[n - 1]) || s[n - 1] == '\r'))
        n--;
    if (line_name(p, s, n, &ns, &ne) != 1)
        return;
    i = ne;
    idx = lookup(s + ns, ne - ns);
    if (idx < 0)
        return; /* not a name that is read: the rest of the line is not looked at */
    memset(&lb, 0, sizeof(lb));
    while (i < n && blank((unsigned char)s[i]))
        i++;
    if (i < n && s[i] == '{') {
        if (!parse_labels(s, n, &i, &lb))
            goto malformed;
        while (i < n && blank((unsigned char)s[i]))
            i++;
    } else if (i == ne) {
        goto malformed; /* "name1": the value must be separated from the name */
    }
    vs = i;
    while (i < n && !blank((unsigned char)s[i]))
        i++;
    if (parse_value(s + vs, i - vs, &v) != 0)
        goto malformed;
    while (i < n && blank((unsigned char)s[i]))
        i++;
    if (i < n && !timestamp_ok(s + i, n - i))
        goto malformed;
    if (lb.skip)
        return;
    if (lb.has_dp ? !parse_rank(lb.dp, lb.dpn, &rank)
                  : lb.has_engine && !parse_rank(lb.engine, lb.enginen, &rank)) {
        p->ignored++;
        return;
    }
    keep(p, idx, rank, v);
    return;
malformed:
    p->malformed++;
}

void kvr_load_prom_init(struct kvr_load_prom *p)
{
    memset(p, 0, sizeof(*p));
}

void kvr_load_prom_reset(struct kvr_load_prom *p)
{
    p->nranks = 0;
    p->lines = p->samples = p->malformed = p->ignored = 0;
    p->partlen = 0;
    p->skipping = false;
}

void kvr_load_prom_deinit(struct kvr_load_prom *p)
{
    free(p->ranks);
    free(p->part);
    memset(p, 0, sizeof(*p));
}

static int part_append(struct kvr_load_prom *p, const char *s, size_t n)
{
    if (p->partlen + n > p->partcap) {
        size_t nc = p->partcap ? p->partcap : 256;
        char *g;
        while (nc < p->partlen + n)
            nc *= 2;
        if (nc > KVR_LOAD_PROM_MAX_LINE)
            nc = KVR_LOAD_PROM_MAX_LINE;
        g = realloc(p->part, nc);
        if (g == NULL)
            return -ENOMEM;
        p->part = g;
        p->partcap = nc;
    }
    memcpy(p->part + p->partlen, s, n);
    p->partlen += n;
    return 0;
}

int kvr_load_prom_feed(struct kvr_load_prom *p, const char *data, size_t len)
{
    int rc = 0;

    while (len > 0) {
        const char *nl = memchr(data, '\n', len);
        size_t take = nl ? (size_t)(nl - data) : len;
        size_t adv = nl ? take + 1 : len;

        if (p->skipping) {
            if (nl != NULL)
                p->skipping = false;
        } else if (p->partlen > 0 || nl == NULL) {
            /* the line continues an earlier piece, or goes on past this one */
            if (p->partlen + take > KVR_LOAD_PROM_MAX_LINE) {
                size_t room = KVR_LOAD_PROM_MAX_LINE - p->partlen;
                if (part_append(p, data, room) == 0)
                    overlong(p, p->part, p->partlen);
                else
                    p->lines++, p->malformed++, rc = -ENOMEM;
                p->partlen = 0;
                p->skipping = nl == NULL;
            } else if (part_append(p, data, take) != 0) {
                p->lines++, p->malformed++, rc = -ENOMEM;
                p->partlen = 0;
                p->skipping = nl == NULL;
            } else if (nl != NULL) {
                parse_line(p, p->part, p->partlen);
                p->partlen = 0;
            }
        } else {
            parse_line(p, data, take);
        }
        data += adv;
        len -= adv;
    }
    return rc;
}

void kvr_load_prom_end(struct kvr_load_prom *p)
{
    if (!p->skipping && p->partlen > 0)
        parse_line(p, p->part, p->partlen);
    p->partlen = 0;
    p->skipping = false;
}

int kvr_load_prom_parse(struct kvr_load_prom *p, const char *text, size_t len)
{
    int rc;

    kvr_load_prom_reset(p);
    rc = kvr_load_prom_feed(p, text, len);
    kvr_load_prom_end(p);
    return rc;
}

const struct kvr_load_prom_rank *kvr_load_prom_find(const struct kvr_load_prom *p,
                                                    uint32_t rank)
{
    for (size_t i = 0; i < p->nranks; i++)
        if (p->ranks[i].rank == rank)
            return &p->ranks[i];
    return NULL;
}
