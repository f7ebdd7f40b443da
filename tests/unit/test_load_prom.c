/* test_load_prom.c — the narrow Prometheus text reader of the load scraper (load_prom.c) and
 * its URL templates (load.c).
 *
 * - Real answers: tests/data/load/ holds /metrics texts shaped as vLLM 0.10 (V1, two DP
 *   engines), vLLM 0.9 (deprecated and current names side by side), vLLM 0.6 (V0), SGLang
 *   (dp_rank labels; TP ranks all exporting), trtllm-serve and a hand-made file of edge cases
 *   (CRLF, escapes, NaN, timestamps, malformed lines, no final newline); each is checked
 *   against the figures written in it.
 * - Cuts: every answer fed in pieces cut at random places reads the same as in one piece.
 * - Random answers (seed printed, KVR_TEST_SEED=N replays) read the same by load_prom.c and
 *   by the naive reference reader below (NUL-terminated copies of each line, string.h and
 *   strtod), including random garbage lines and byte flips.
 * - Overlong lines, the rank cap, the URL templates and a module without a thread.
 * - The worker table (load_table.c): random inserts, finds and sweeps against a naive list,
 *   on few and many workers (long probe runs, wrap-around at the end of the slots).
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "load/load.h"
#include "load/load_int.h"

static unsigned seed;

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (f == NULL) {
        print_error("cannot open %s\n", path);
        fail();
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

/* prio > 0 and the value, or prio 0 when want < 0 */
static void expect(const struct kvr_load_prom *p, uint32_t rank, int f, double want)
{
    const struct kvr_load_prom_rank *r = kvr_load_prom_find(p, rank);
    assert_non_null(r);
    if (want < 0) {
        if (r->prio[f] != 0)
            print_error("rank %u field %d: expected none, got %g\n", rank, f, r->v[f]);
        assert_int_equal(r->prio[f], 0);
        return;
    }
    if (r->prio[f] == 0 || fabs(r->v[f] - want) > 1e-9 * (1 + fabs(want)))
        print_error("rank %u field %d: expected %.17g, got %.17g (prio %d)\n", rank, f, want,
                    r->v[f], r->prio[f]);
    assert_true(r->prio[f] != 0);
    assert_true(fabs(r->v[f] - want) <= 1e-9 * (1 + fabs(want)));
}

static void expect_rank(const struct kvr_load_prom *p, uint32_t rank, double waiting,
                        double running, double kv, double prompt, double hits, double queries)
{
    expect(p, rank, KVR_LOAD_WAITING, waiting);
    expect(p, rank, KVR_LOAD_RUNNING, running);
    expect(p, rank, KVR_LOAD_KV_USAGE, kv);
    expect(p, rank, KVR_LOAD_PROMPT, prompt);
    expect(p, rank, KVR_LOAD_HITS, hits);
    expect(p, rank, KVR_LOAD_QUERIES, queries);
}

static void parse_file(const char *name, struct kvr_load_prom *p)
{
    char path[256];
    size_t len;
    char *text;

    snprintf(path, sizeof(path), "tests/data/load/%s", name);
    text = slurp(path, &len);
    kvr_load_prom_init(p);
    assert_int_equal(kvr_load_prom_parse(p, text, len), 0);
    free(text);
}

static void test_vllm_010_dp2(void **state)
{
    struct kvr_load_prom p;
    (void)state;
    parse_file("vllm-0.10-dp2.txt", &p);
    assert_int_equal(p.nranks, 2);
    assert_int_equal(p.malformed, 0);
    assert_int_equal(p.ignored, 0);
    expect_rank(&p, 0, 4, 12, 0.8312500000000001, 1849216, 1201664, 1848320);
    expect_rank(&p, 1, 0, 9, 0.37109375, 1524608, 880640, 1523712);
    assert_int_equal(p.samples, 12);
    kvr_load_prom_deinit(&p);
}

static void test_vllm_09_deprecated_names(void **state)
{
    struct kvr_load_prom p;
    (void)state;
    parse_file("vllm-0.9-deprecated.txt", &p);
    assert_int_equal(p.nranks, 1);
    assert_int_equal(p.malformed, 0);
    /* both names are exported with one value: the current one wins, nothing is doubled */
    expect_rank(&p, 0, 0, 1, 0.25, -1, 1200, 5000);
    kvr_load_prom_deinit(&p);
}

static void test_vllm_06_v0(void **state)
{
    struct kvr_load_prom p;
    (void)state;
    parse_file("vllm-0.6-v0.txt", &p);
    assert_int_equal(p.nranks, 1); /* no engine label: rank 0 */
    assert_int_equal(p.malformed, 0);
    expect_rank(&p, 0, 2, 5, 0.55, 83211, -1, -1);
    assert_int_equal(kvr_load_prom_find(&p, 0)->prio[KVR_LOAD_KV_USAGE], 1); /* the old name */
    kvr_load_prom_deinit(&p);
}

static void test_sglang(void **state)
{
    struct kvr_load_prom p;
    (void)state;
    parse_file("sglang-dp2.txt", &p);
    assert_int_equal(p.nranks, 2);
    assert_int_equal(p.malformed, 0);
    /* the tokenizer's counters carry no dp_rank: rank 0 */
    expect_rank(&p, 0, 6, 31, 0.71, 8128902, 5201883, -1);
    expect_rank(&p, 1, 2, 28, 0.57, -1, -1, -1);
    kvr_load_prom_deinit(&p);

    parse_file("sglang-all-schedulers.txt", &p);
    assert_int_equal(p.nranks, 1);
    expect_rank(&p, 0, 1, 4, 0.12, -1, -1, -1); /* tp_rank 1 repeats tp_rank 0: not added */
    kvr_load_prom_deinit(&p);
}

static void test_trtllm(void **state)
{
    struct kvr_load_prom p;
    (void)state;
    parse_file("trtllm.txt", &p);
    assert_int_equal(p.nranks, 1);
    assert_int_equal(p.malformed, 0);
    expect_rank(&p, 0, 3, 17, 0.62, -1, -1, -1);
    kvr_load_prom_deinit(&p);
}

static void test_edge_cases(void **state)
{
    struct kvr_load_prom p;
    (void)state;
    parse_file("edge-crlf.txt", &p);
    /* the file's comments list what each line is; the figures below follow from them */
    assert_int_equal(p.lines, 23);
    assert_int_equal(p.samples, 7);
    assert_int_equal(p.malformed, 6);
    assert_int_equal(p.ignored, 4);
    assert_int_equal(p.nranks, 2);
    assert_int_equal(p.ranks[0].rank, 0);
    assert_int_equal(p.ranks[1].rank, 1);
    expect_rank(&p, 0, 5.5, -1, -1, -1, -1, -1);
    expect_rank(&p, 1, 1, 10, 1.0, -1, -1, -1); /* usage 1.5 clamped to 1; the max kept */
    kvr_load_prom_deinit(&p);
}

/* ---- the naive reference reader -------------------------------------------------------------- */

static const struct {
    const char *name;
    int field, prio;
} ref_names[] = {
    {"vllm:num_requests_waiting", KVR_LOAD_WAITING, 2},
    {"vllm:num_requests_running", KVR_LOAD_RUNNING, 2},
    {"vllm:kv_cache_usage_perc", KVR_LOAD_KV_USAGE, 2},
    {"vllm:gpu_cache_usage_perc", KVR_LOAD_KV_USAGE, 1},
    {"vllm:prompt_tokens_total", KVR_LOAD_PROMPT, 2},
    {"vllm:prefix_cache_hits_total", KVR_LOAD_HITS, 2},
    {"vllm:gpu_prefix_cache_hits_total", KVR_LOAD_HITS, 1},
    {"vllm:prefix_cache_queries_total", KVR_LOAD_QUERIES, 2},
    {"vllm:gpu_prefix_cache_queries_total", KVR_LOAD_QUERIES, 1},
    {"sglang:num_queue_reqs", KVR_LOAD_WAITING, 2},
    {"sglang:num_running_reqs", KVR_LOAD_RUNNING, 2},
    {"sglang:token_usage", KVR_LOAD_KV_USAGE, 2},
    {"sglang:prompt_tokens_total", KVR_LOAD_PROMPT, 2},
    {"sglang:cached_tokens_total", KVR_LOAD_HITS, 2},
    {"trtllm_num_requests_waiting", KVR_LOAD_WAITING, 2},
    {"trtllm_num_requests_running", KVR_LOAD_RUNNING, 2},
    {"trtllm_kv_cache_utilization", KVR_LOAD_KV_USAGE, 2},
};

#define NAMECH "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:0123456789"
#define LABELCH "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789"
#define DIGITS "0123456789"

struct ref {
    struct kvr_load_prom_rank r[KVR_LOAD_PROM_MAX_RANKS];
    size_t n;
    uint64_t lines, samples, malformed, ignored;
};

/* A whole-token number as strtod reads it, minus what Go's ParseFloat would not take (hex,
 * nan(...), underscores) and minus tokens of 64 bytes or more (the documented cap). */
static bool ref_number(const char *tok, double *out)
{
    char *end;
    if (tok[0] == '\0' || strlen(tok) >= 64 || strpbrk(tok, "xXpP(_") != NULL)
        return false;
    if (strchr("+-.0123456789iInN", tok[0]) == NULL)
        return false;
    *out = strtod(tok, &end);
    if (*end != '\0')
        return false;
    /* "inity"-less spellings strtod takes: only inf, infinity, nan (any case) besides digits */
    if (strpbrk(tok, "0123456789") == NULL) {
        const char *w = tok + (tok[0] == '+' || tok[0] == '-');
        if (strcasecmp(w, "inf") != 0 && strcasecmp(w, "infinity") != 0 &&
            strcasecmp(w, "nan") != 0)
            return false;
    }
    return true;
}

static bool ref_rank(const char *v, uint32_t *out)
{
    size_t n = strlen(v);
    if (n == 0 || n > 5 || strspn(v, DIGITS) != n)
        return false;
    *out = (uint32_t)atoi(v);
    return *out <= 65535;
}

/* One line, NUL-terminated, newline removed. */
static void ref_line(struct ref *R, char *s)
{
    char *p = s, *e = s + strlen(s), *val, *name_end;
    char dp[64] = "", eng[64] = "";
    bool has_dp = false, has_eng = false, skip = false, has_tp = false, has_pp = false;
    int idx = -1, f;
    size_t nl;
    uint32_t rank = 0;
    double v;
    struct kvr_load_prom_rank *r = NULL;

    R->lines++;
    while (e > s && strchr(" \t\r", e[-1]) != NULL && e[-1] != '\0')
        *--e = '\0';
    p += strspn(p, " \t");
    if (*p == '\0' || *p == '#')
        return;
    if (strchr(NAMECH, *p) == NULL || (*p >= '0' && *p <= '9')) {
        R->malformed++;
        return;
    }
    nl = strspn(p, NAMECH);
    for (size_t i = 0; i < sizeof(ref_names) / sizeof(ref_names[0]); i++)
        if (strlen(ref_names[i].name) == nl && strncmp(ref_names[i].name, p, nl) == 0)
            idx = (int)i;
    if (idx < 0)
        return;
    name_end = p + nl;
    p = name_end + strspn(name_end, " \t");
    if (*p == '{') {
        p++;
        for (;;) {
            char lname[64], lval[256];
            size_t ln, vn = 0;
            bool esc = false;
            p += strspn(p, " \t");
            if (*p == '}') {
                p++;
                break;
            }
            if (*p == '\0' || strchr(LABELCH, *p) == NULL || (*p >= '0' && *p <= '9'))
                goto bad;
            ln = strspn(p, LABELCH);
            snprintf(lname, sizeof(lname), "%.*s", (int)(ln < 63 ? ln : 63), p);
            p += ln;
            p += strspn(p, " \t");
            if (*p != '=')
                goto bad;
            p++;
            p += strspn(p, " \t");
            if (*p != '"')
                goto bad;
            p++;
            while (*p != '"') {
                if (*p == '\0')
                    goto bad;
                if (*p == '\\') {
                    if (p[1] != '\\' && p[1] != '"' && p[1] != 'n')
                        goto bad;
                    esc = true;
                    p += 2;
                    continue;
                }
                if (vn < sizeof(lval) - 1)
                    lval[vn++] = *p;
                p++;
            }
            lval[vn] = '\0';
            p++;
            if (esc)
                strcpy(lval, "\\"); /* never a rank, never "0" */
            if (strcmp(lname, "dp_rank") == 0 && !has_dp) {
                has_dp = true;
                strcpy(dp, strlen(lval) < 60 ? lval : "x");
            } else if (strcmp(lname, "engine") == 0 && !has_eng) {
                has_eng = true;
                strcpy(eng, strlen(lval) < 60 ? lval : "x");
            } else if (strcmp(lname, "tp_rank") == 0 && !has_tp) {
                has_tp = true;
                skip |= strcmp(lval, "0") != 0;
            } else if (strcmp(lname, "pp_rank") == 0 && !has_pp) {
                has_pp = true;
                skip |= strcmp(lval, "0") != 0;
            }
            p += strspn(p, " \t");
            if (*p == ',') {
                p++;
                continue;
            }
            if (*p == '}') {
                p++;
                break;
            }
            goto bad;
        }
        p += strspn(p, " \t");
    } else if (p == name_end) {
        goto bad;
    }
    val = p;
    p += strcspn(p, " \t");
    if (*p != '\0') {
        char *ts;
        *p++ = '\0';
        ts = p + strspn(p, " \t");
        if (*ts != '\0') {
            const char *d = ts + (*ts == '+' || *ts == '-');
            size_t dn = strspn(d, DIGITS);
            if (dn == 0 || dn > 19 || d[dn] != '\0')
                goto bad;
        }
    }
    if (!ref_number(val, &v))
        goto bad;
    if (skip)
        return;
    if (has_dp ? !ref_rank(dp, &rank) : has_eng && !ref_rank(eng, &rank)) {
        R->ignored++;
        return;
    }
    if (!isfinite(v) || v < 0) {
        R->ignored++;
        return;
    }
    f = ref_names[idx].field;
    if (f == KVR_LOAD_KV_USAGE && v > 1)
        v = 1;
    for (size_t i = 0; i < R->n; i++)
        if (R->r[i].rank == rank)
            r = &R->r[i];
    if (r == NULL) {
        if (R->n == KVR_LOAD_PROM_MAX_RANKS) {
            R->ignored++;
            return;
        }
        r = &R->r[R->n++];
        memset(r, 0, sizeof(*r));
        r->rank = rank;
    }
    if (ref_names[idx].prio > r->prio[f]) {
        r->prio[f] = (uint8_t)ref_names[idx].prio;
        r->v[f] = v;
    } else if (ref_names[idx].prio == r->prio[f]) {
        r->v[f] = f == KVR_LOAD_KV_USAGE ? fmax(r->v[f], v) : r->v[f] + v;
    }
    R->samples++;
    return;
bad:
    R->malformed++;
}

/* Lines here are short (the generator keeps them under KVR_LOAD_PROM_MAX_LINE). */
static void ref_parse(struct ref *R, const char *text, size_t len)
{
    memset(R, 0, sizeof(*R));
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t n = nl ? (size_t)(nl - (text + i)) : len - i;
        char *line = malloc(n + 1);
        assert_non_null(line);
        memcpy(line, text + i, n);
        line[n] = '\0';
        if (memchr(text + i, '\0', n) != NULL) {
            /* a NUL cuts the C string: the reader sees it as a bad byte after the name (or a
             * bad name); the reference cannot, so the generator never makes one */
            fail_msg("generator made a NUL");
        }
        ref_line(R, line);
        free(line);
        i += n + (nl ? 1 : 0);
    }
}

static void same(const struct kvr_load_prom *p, const struct ref *R, const char *text)
{
    bool ok = p->lines == R->lines && p->samples == R->samples &&
              p->malformed == R->malformed && p->ignored == R->ignored && p->nranks == R->n;
    for (size_t i = 0; ok && i < R->n; i++) {
        const struct kvr_load_prom_rank *a = &p->ranks[i], *b = &R->r[i];
        ok = a->rank == b->rank;
        for (int f = 0; ok && f < KVR_LOAD_NFIELDS; f++)
            ok = a->prio[f] == b->prio[f] && (a->prio[f] == 0 || a->v[f] == b->v[f]);
    }
    if (!ok) {
        print_error("seed %u: reader and reference differ on:\n%s\n"
                    "reader: lines %llu samples %llu malformed %llu ignored %llu ranks %zu\n"
                    "ref:    lines %llu samples %llu malformed %llu ignored %llu ranks %zu\n",
                    seed, text, (unsigned long long)p->lines, (unsigned long long)p->samples,
                    (unsigned long long)p->malformed, (unsigned long long)p->ignored, p->nranks,
                    (unsigned long long)R->lines, (unsigned long long)R->samples,
                    (unsigned long long)R->malformed, (unsigned long long)R->ignored, R->n);
        fail();
    }
}

/* ---- the random answers ---------------------------------------------------------------------- */

struct gen {
    char *b;
    size_t n, cap;
    unsigned r;
};

static void g_put(struct gen *g, const char *s)
{
    size_t l = strlen(s);
    if (g->n + l + 1 > g->cap) {
        g->cap = (g->n + l + 1) * 2;
        g->b = realloc(g->b, g->cap);
        assert_non_null(g->b);
    }
    memcpy(g->b + g->n, s, l + 1);
    g->n += l;
}

static unsigned rnd(struct gen *g, unsigned n)
{
    return (unsigned)rand_r(&g->r) % n;
}

static const char *pick(struct gen *g, const char *const *v, size_t n)
{
    return v[rnd(g, (unsigned)n)];
}
#define PICK(g, arr) pick(g, arr, sizeof(arr) / sizeof(arr[0]))

static void g_blank(struct gen *g)
{
    static const char *const b[] = {"", " ", "\t", "  ", " \t "};
    g_put(g, PICK(g, b));
}

static void g_sample(struct gen *g)
{
    static const char *const other[] = {"vllm:num_requests_swapped", "python_gc_objects_collected_total",
                                        "vllm:num_requests_waitingx", "vllm:num_requests_waitin",
                                        "sglang:gen_throughput", "trtllm_kv_cache_hit_rate",
                                        "vllm:time_to_first_token_seconds_bucket", "x", "_", ":a"};
    static const char *const lnames[] = {"model_name", "engine", "dp_rank", "tp_rank", "pp_rank",
                                         "le", "finished_reason", "_x1"};
    static const char *const lvals[] = {"0", "1", "2", "3", "7", "15", "255", "256", "65535",
                                        "65536", "00", "x", "", "-1", "Qwen/Qwen3-8B",
                                        "a\\\"b", "c\\\\d", "e\\nf", "a,b}c", "+Inf", "0.5"};
    static const char *const values[] = {"0", "1", "2.5", "17.0", "1e3", "1.5E-2", "+3", "-0",
                                         "-4", ".5", "5.", "NaN", "nan", "+Inf", "-Inf", "Inf",
                                         "infinity", "1e", "0x10", "", "1_0", "--1", "e5",
                                         "1.2.3", "123456789012", "0.999", "7e+0", "nan(1)"};
    static const char *const ts[] = {"1759894431170", "-17", "+5", "abc", "1.5", "12345678901234567890"};
    char tmp[128];
    int nl;

    if (rnd(g, 4) == 0)
        g_put(g, PICK(g, other));
    else
        g_put(g, ref_names[rnd(g, sizeof(ref_names) / sizeof(ref_names[0]))].name);
    if (rnd(g, 8) == 0)
        g_blank(g);
    if (rnd(g, 5) != 0) {
        g_put(g, "{");
        nl = (int)rnd(g, 5);
        for (int i = 0; i < nl; i++) {
            if (i)
                g_put(g, rnd(g, 10) ? "," : " , ");
            if (rnd(g, 40) == 0)
                g_put(g, "9bad");
            else
                g_put(g, PICK(g, lnames));
            g_put(g, rnd(g, 10) ? "=" : " = ");
            if (rnd(g, 50) == 0) {
                g_put(g, "unquoted");
            } else {
                g_put(g, "\"");
                g_put(g, rnd(g, 60) ? PICK(g, lvals) : "\\q");
                if (rnd(g, 80) != 0)
                    g_put(g, "\"");
            }
        }
        if (nl && rnd(g, 10) == 0)
            g_put(g, ",");
        if (rnd(g, 40) != 0)
            g_put(g, "}");
    }
    if (rnd(g, 12) != 0)
        g_put(g, rnd(g, 5) ? " " : "\t");
    g_put(g, PICK(g, values));
    if (rnd(g, 5) == 0) {
        g_put(g, rnd(g, 2) ? " " : "\t ");
        g_put(g, PICK(g, ts));
    }
    if (rnd(g, 30) == 0) {
        snprintf(tmp, sizeof(tmp), " %u", rnd(g, 100));
        g_put(g, tmp);
    }
    if (rnd(g, 6) == 0)
        g_put(g, rnd(g, 2) ? " " : "\r");
}

static void g_garbage(struct gen *g)
{
    char tmp[40];
    size_t n = rnd(g, sizeof(tmp) - 1);
    for (size_t i = 0; i < n; i++) {
        char c;
        do
            c = (char)(1 + rnd(g, 126)); /* no NUL, no newline */
        while (c == '\n');
        tmp[i] = c;
    }
    tmp[n] = '\0';
    g_put(g, tmp);
}

static void gen_answer(struct gen *g, unsigned lines)
{
    g->n = 0;
    g_put(g, "");
    for (unsigned i = 0; i < lines; i++) {
        switch (rnd(g, 12)) {
        case 0:
            g_put(g, rnd(g, 2) ? "# HELP vllm:num_requests_waiting Number of requests waiting."
                               : "# TYPE vllm:num_requests_waiting gauge");
            break;
        case 1:
            g_blank(g);
            break;
        case 2:
            g_garbage(g);
            break;
        default:
            if (rnd(g, 10) == 0)
                g_blank(g);
            g_sample(g);
            break;
        }
        if (i + 1 < lines || rnd(g, 2))
            g_put(g, rnd(g, 4) ? "\n" : "\r\n");
    }
}

static void feed_cut(struct kvr_load_prom *p, const char *text, size_t len, unsigned *r)
{
    kvr_load_prom_reset(p);
    for (size_t i = 0; i < len;) {
        size_t step = 1 + (size_t)rand_r(r) % (rand_r(r) % 3 ? 8 : 200);
        if (step > len - i)
            step = len - i;
        assert_int_equal(kvr_load_prom_feed(p, text + i, step), 0);
        i += step;
    }
    kvr_load_prom_end(p);
}

static void test_random_against_reference(void **state)
{
    struct gen g = {.r = seed};
    struct kvr_load_prom p, q;
    struct ref *R = malloc(sizeof(*R));
    unsigned cr = seed ^ 0x5bd1e995u;
    (void)state;

    assert_non_null(R);
    kvr_load_prom_init(&p);
    kvr_load_prom_init(&q);
    uint64_t tot_samples = 0, tot_malformed = 0, tot_ignored = 0;

    for (int it = 0; it < 3000; it++) {
        gen_answer(&g, 1 + rnd(&g, 40));
        if (rnd(&g, 4) == 0 && g.n > 0) { /* a few flipped bytes (never a NUL) */
            for (int k = 0; k < 3; k++) {
                size_t at = rnd(&g, (unsigned)g.n);
                char c = (char)(1 + rnd(&g, 255));
                g.b[at] = c;
            }
        }
        assert_int_equal(kvr_load_prom_parse(&p, g.b, g.n), 0);
        ref_parse(R, g.b, g.n);
        same(&p, R, g.b);
        feed_cut(&q, g.b, g.n, &cr);
        same(&q, R, g.b);
        tot_samples += R->samples;
        tot_malformed += R->malformed;
        tot_ignored += R->ignored;
    }
    /* the generator makes every kind of line in quantity */
    printf("random answers: %llu samples kept, %llu lines malformed, %llu samples ignored\n",
           (unsigned long long)tot_samples, (unsigned long long)tot_malformed,
           (unsigned long long)tot_ignored);
    assert_true(tot_samples > 5000 && tot_malformed > 5000 && tot_ignored > 1000);
    kvr_load_prom_deinit(&p);
    kvr_load_prom_deinit(&q);
    free(R);
    free(g.b);
}

/* Every file of tests/data/load read in random pieces reads as in one. */
static void test_cuts(void **state)
{
    static const char *const files[] = {"vllm-0.10-dp2.txt", "vllm-0.9-deprecated.txt",
                                        "vllm-0.6-v0.txt", "sglang-dp2.txt",
                                        "sglang-all-schedulers.txt", "trtllm.txt",
                                        "edge-crlf.txt"};
    unsigned r = seed;
    (void)state;

    for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
        char path[256];
        size_t len;
        char *text;
        struct kvr_load_prom whole, cut;

        snprintf(path, sizeof(path), "tests/data/load/%s", files[f]);
        text = slurp(path, &len);
        kvr_load_prom_init(&whole);
        kvr_load_prom_init(&cut);
        kvr_load_prom_parse(&whole, text, len);
        for (int k = 0; k < 50; k++) {
            feed_cut(&cut, text, len, &r);
            assert_int_equal(cut.lines, whole.lines);
            assert_int_equal(cut.samples, whole.samples);
            assert_int_equal(cut.malformed, whole.malformed);
            assert_int_equal(cut.ignored, whole.ignored);
            assert_int_equal(cut.nranks, whole.nranks);
            assert_memory_equal(cut.ranks, whole.ranks, whole.nranks * sizeof(whole.ranks[0]));
        }
        kvr_load_prom_deinit(&whole);
        kvr_load_prom_deinit(&cut);
        free(text);
    }
}

static void test_overlong_lines(void **state)
{
    size_t big = KVR_LOAD_PROM_MAX_LINE + 100;
    char *text = malloc(3 * big + 256);
    struct kvr_load_prom p, q;
    size_t n = 0;
    unsigned r = seed;
    (void)state;

    assert_non_null(text);
    /* a read name with a huge label value: malformed; an unknown one: skipped; then a good
     * line that must survive both */
    n += (size_t)sprintf(text + n, "vllm:num_requests_waiting{model_name=\"");
    memset(text + n, 'a', big);
    n += big;
    n += (size_t)sprintf(text + n, "\"} 1\nsome_histogram_bucket{x=\"");
    memset(text + n, 'b', big);
    n += big;
    n += (size_t)sprintf(text + n, "\"} 2\nvllm:num_requests_running 5\n");
    kvr_load_prom_init(&p);
    kvr_load_prom_init(&q);
    kvr_load_prom_parse(&p, text, n);
    assert_int_equal(p.lines, 3);
    assert_int_equal(p.malformed, 1);
    assert_int_equal(p.samples, 1);
    expect(&p, 0, KVR_LOAD_RUNNING, 5);
    expect(&p, 0, KVR_LOAD_WAITING, -1);
    for (int k = 0; k < 5; k++) {
        feed_cut(&q, text, n, &r);
        assert_int_equal(q.lines, 3);
        assert_int_equal(q.malformed, 1);
        assert_int_equal(q.samples, 1);
    }
    /* the same lines without the final newline: the last one is read at the end */
    kvr_load_prom_parse(&p, text, n - 1);
    assert_int_equal(p.samples, 1);
    /* an unfinished overlong line at the end is dropped, not read */
    kvr_load_prom_parse(&p, text, (size_t)strlen("vllm:num_requests_waiting{model_name=\"") + big);
    assert_int_equal(p.malformed, 1);
    assert_int_equal(p.samples, 0);
    kvr_load_prom_deinit(&p);
    kvr_load_prom_deinit(&q);
    free(text);
}

static void test_rank_cap(void **state)
{
    struct kvr_load_prom p;
    char *text = malloc(64 * 400);
    size_t n = 0;
    (void)state;

    assert_non_null(text);
    for (int i = 0; i < 300; i++)
        n += (size_t)sprintf(text + n, "vllm:num_requests_running{engine=\"%d\"} 1\n", i);
    kvr_load_prom_init(&p);
    kvr_load_prom_parse(&p, text, n);
    assert_int_equal(p.nranks, KVR_LOAD_PROM_MAX_RANKS);
    assert_int_equal(p.samples, KVR_LOAD_PROM_MAX_RANKS);
    assert_int_equal(p.ignored, 300 - KVR_LOAD_PROM_MAX_RANKS);
    kvr_load_prom_deinit(&p);
    free(text);
}

static void test_url_templates(void **state)
{
    char out[128];
    (void)state;

    assert_true(kvr_load_url_expand("http://{pod}/metrics", "10.0.0.5:8000", 3, out,
                                    sizeof(out)) > 0);
    assert_string_equal(out, "http://10.0.0.5:8000/metrics");
    assert_true(kvr_load_url_expand("https://{host}:9400/m?r={rank}", "10.0.0.5:8000", 3, out,
                                    sizeof(out)) > 0);
    assert_string_equal(out, "https://10.0.0.5:9400/m?r=3");
    assert_true(kvr_load_url_expand("http://{host}:{rank}/", "[::1]:8000", 12, out,
                                    sizeof(out)) > 0);
    assert_string_equal(out, "http://[::1]:12/");
    assert_true(kvr_load_url_expand("http://{host}/", "engine-a.svc", 0, out, sizeof(out)) > 0);
    assert_string_equal(out, "http://engine-a.svc/"); /* no ':' : {host} is the whole pod */
    assert_true(kvr_load_url_per_rank("http://{host}:{rank}/"));
    assert_false(kvr_load_url_per_rank("http://{pod}/metrics"));
    /* pods that would steer the request elsewhere */
    assert_int_equal(kvr_load_url_expand("http://{pod}/m", "a/b", 0, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvr_load_url_expand("http://{pod}/m", "user@evil:80", 0, out, sizeof(out)),
                     -EINVAL);
    assert_int_equal(kvr_load_url_expand("http://{pod}/m", "a?b", 0, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvr_load_url_expand("http://{pod}/m", "", 0, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvr_load_url_expand("http://{pod}/m", "a b", 0, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvr_load_url_expand("http://{pod}/{x}", "a:1", 0, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvr_load_url_expand("http://{pod}/metrics", "10.0.0.5:8000", 0, out, 20),
                     -ENAMETOOLONG);
    assert_true(kvr_load_pod_ok("pod-a_1.example:8000"));
    assert_false(kvr_load_pod_ok("pod%20a"));
}

/* No URL: no thread, nothing to read, and /metrics still renders its families. */
static void test_module_off(void **state)
{
    struct kvr_conf c;
    struct kvr_load_opts o;
    struct kvr_load *l = NULL;
    struct kvr_load_sample s;
    struct kvr_buf b;
    struct kvr_err err;
    const char *pods[] = {"10.0.0.5:8000", "10.0.0.6:8000"};
    (void)state;

    assert_int_equal(kvr_conf_load_string("t.conf", "[events]\nbind = tcp://127.0.0.1:*\n", &c,
                                          &err),
                     0);
    assert_int_equal(c.load_interval_ms, 50);
    assert_int_equal(c.load_timeout_ms, 500);
    assert_int_equal(c.load_stale_after_ms, 1000);
    assert_int_equal(c.load_max_response_bytes, 4 << 20);
    assert_null(c.load_metrics_url);
    o = (struct kvr_load_opts){.conf = &c};
    assert_int_equal(kvr_load_create(&o, &l, &err), 0);
    assert_int_equal(kvr_load_start(l, &err), 0);
    assert_false(kvr_load_enabled(l));
    assert_int_equal(kvr_load_set_pods(l, pods, NULL, 2), 0);
    assert_int_equal(kvr_load_get(l, "10.0.0.5:8000", 0, &s), -ENOENT);
    kvr_buf_init(&b);
    kvr_load_put_json(l, "10.0.0.5:8000", 0, &b);
    assert_int_equal(b.len, 0);
    kvr_load_metrics(l, &b);
    assert_non_null(strstr(b.data, "kvrouter_load_scrapes_total{result=\"ok\"} 0"));
    assert_non_null(strstr(b.data, "kvrouter_load_targets 0"));
    kvr_buf_free(&b);
    kvr_load_stop(l);
    kvr_load_destroy(l);
    assert_int_equal(kvr_load_get(NULL, "x", 0, &s), -ENOENT);
    kvr_conf_free(&c);
}

static void test_conf_directives(void **state)
{
    static const struct {
        const char *text, *error;
    } bad[] = {
        {"[load]\nmetrics_url = ftp://{pod}/metrics\n",
         "t.conf:5: [load] metrics_url = ftp://{pod}/metrics: expected a URL starting with "
         "http:// or https://"},
        {"[load]\nmetrics_url = http://{pod}/{model}\n",
         "t.conf:5: [load] metrics_url = http://{pod}/{model}: unknown placeholder (expected "
         "{pod}, {host} or {rank})"},
        {"[load]\nmetrics_url = http:///metrics\n",
         "t.conf:5: [load] metrics_url = http:///metrics: the URL has no host (e.g. "
         "http://{pod}/metrics)"},
        {"[load]\nmetrics_url = http://{pod}/m}\n",
         "t.conf:5: [load] metrics_url = http://{pod}/m}: a '}' outside {pod}, {host} or {rank}"},
        {"[load]\nmetrics_interval = 5ms\n",
         "t.conf:5: [load] metrics_interval = 5ms is out of range (10ms..1m)"},
        {"[load]\nmetrics_interval = 2s\n",
         "t.conf:5: [load] stale_after (1000ms) is below metrics_interval (2000ms): every sample "
         "would be stale before the next scrape"},
        {"[load]\nmax_response_bytes = 1KiB\n",
         "t.conf:5: [load] max_response_bytes = 1KiB is out of range (4KiB..256MiB)"},
    };
    struct kvr_conf c;
    struct kvr_err err;
    char text[512];
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(text, sizeof(text), "[events]\nbind = tcp://127.0.0.1:*\n\n%s", bad[i].text);
        err.msg[0] = '\0';
        assert_int_equal(kvr_conf_load_string("t.conf", text, &c, &err), -EINVAL);
        if (strcmp(err.msg, bad[i].error) != 0)
            print_error("got:  %s\nwant: %s\n", err.msg, bad[i].error);
        assert_string_equal(err.msg, bad[i].error);
    }
    snprintf(text, sizeof(text), "[events]\nbind = tcp://127.0.0.1:*\n[load]\n"
                                 "metrics_url = https://{host}:9400/metrics?rank={rank}\n"
                                 "metrics_interval = 100ms\nmetrics_timeout = 2s\n"
                                 "stale_after = 300ms\nmax_response_bytes = 1MiB\n"
                                 "max_targets = 8\n");
    assert_int_equal(kvr_conf_load_string("t.conf", text, &c, &err), 0);
    assert_string_equal(c.load_metrics_url, "https://{host}:9400/metrics?rank={rank}");
    assert_int_equal(c.load_interval_ms, 100);
    assert_int_equal(c.load_timeout_ms, 2000);
    assert_int_equal(c.load_stale_after_ms, 300);
    assert_int_equal(c.load_max_response_bytes, 1 << 20);
    assert_int_equal(c.load_max_targets, 8);
    kvr_conf_free(&c);
    /* empty = off */
    assert_int_equal(kvr_conf_load_string("t.conf", "[events]\nbind = tcp://127.0.0.1:*\n"
                                                    "[load]\nmetrics_url =\n",
                                          &c, &err),
                     0);
    assert_true(c.load_metrics_url == NULL || c.load_metrics_url[0] == '\0');
    kvr_conf_free(&c);
}

/* ---- the worker table ------------------------------------------------------------------------- */

struct model {
    char pod[32];
    uint32_t rank;
    bool live;
};

static bool drop_marked(const struct kvr_load_worker *w, void *arg)
{
    const bool *gone = arg;
    return gone[(size_t)w->s.waiting]; /* the model's index, kept in the sample for the test */
}

static void test_worker_table(void **state)
{
    enum { N = 3000 };
    struct model *m = calloc(N, sizeof(*m));
    bool *gone = calloc(N, sizeof(bool));
    struct kvr_load_wtable t = {0};
    unsigned r = seed;
    size_t live = 0;
    (void)state;

    assert_non_null(m);
    assert_non_null(gone);
    for (int round = 0; round < 40; round++) {
        /* insert a batch of new workers (few pods, many ranks: colliding home slots) */
        size_t add = (size_t)rand_r(&r) % 200;
        for (size_t k = 0; k < add; k++) {
            size_t i = (size_t)rand_r(&r) % N;
            struct kvr_load_worker *w;
            if (m[i].live)
                continue;
            snprintf(m[i].pod, sizeof(m[i].pod), "10.0.0.%u:8000", (unsigned)(i % 7));
            m[i].rank = (uint32_t)(i / 7);
            w = calloc(1, sizeof(*w));
            assert_non_null(w);
            w->pod = strdup(m[i].pod);
            w->rank = m[i].rank;
            w->hash = kvr_load_key_hash(w->pod, w->rank);
            w->s.waiting = (double)i;
            assert_null(kvr_load_wt_find(&t, w->pod, w->rank, w->hash));
            assert_int_equal(kvr_load_wt_insert(&t, w), 0);
            m[i].live = true;
            live++;
        }
        /* sweep a random share of them away */
        memset(gone, 0, N * sizeof(bool));
        size_t want = 0;
        for (size_t i = 0; i < N; i++)
            if (m[i].live && rand_r(&r) % 3 == 0) {
                gone[i] = true;
                want++;
            }
        assert_int_equal(kvr_load_wt_sweep(&t, drop_marked, gone), want);
        live -= want;
        assert_int_equal(t.n, live);
        for (size_t i = 0; i < N; i++) {
            const struct kvr_load_worker *w;
            if (gone[i])
                m[i].live = false;
            if (m[i].pod[0] == '\0')
                continue;
            w = kvr_load_wt_find(&t, m[i].pod, m[i].rank, kvr_load_key_hash(m[i].pod, m[i].rank));
            if (m[i].live != (w != NULL))
                print_error("seed %u round %d: worker %zu %s but %s\n", seed, round, i,
                            m[i].live ? "live" : "removed", w ? "found" : "not found");
            assert_true(m[i].live == (w != NULL));
            if (w != NULL)
                assert_true(w->s.waiting == (double)i);
        }
        assert_true(t.cap == 0 || t.n * 2 <= t.cap);
    }
    kvr_load_wt_free(&t);
    free(m);
    free(gone);
}

int main(void)
{
    const char *s = getenv("KVR_TEST_SEED");
    seed = s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("test_load_prom: seed %u (KVR_TEST_SEED=%u replays it)\n", seed, seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_010_dp2),
        cmocka_unit_test(test_vllm_09_deprecated_names),
        cmocka_unit_test(test_vllm_06_v0),
        cmocka_unit_test(test_sglang),
        cmocka_unit_test(test_trtllm),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_cuts),
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_overlong_lines),
        cmocka_unit_test(test_rank_cap),
        cmocka_unit_test(test_url_templates),
        cmocka_unit_test(test_module_off),
        cmocka_unit_test(test_conf_directives),
        cmocka_unit_test(test_worker_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
