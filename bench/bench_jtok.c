/* bench_jtok.c — token-array parsing speed: jtok's SWAR parser vs cJSON on the same body.
 *
 * Body: {"model": "m", "token_ids": [ ... 8192 ids ... ]} with ids in [0, 152064) (a
 * Qwen-sized vocabulary) and ", " separators (Python json.dumps style), plus the same with
 * "," separators. Reports MB/s (body bytes / time) and µs per body for:
 *   jtok array     kvr_jtok_u32_array on the array alone
 *   reqbody json   the whole body through kvr_reqbody_query_json (keys, strings, array)
 *   reqbody mpack  the same query as msgpack through kvr_reqbody_query_msgpack, at each
 *                  decoder level (AVX-512 VBMI windows when the CPU has them, scalar)
 *   cJSON          cJSON_ParseWithLength + walking the array into u32s
 * Times are thread CPU time (the machine is shared), best of 5 rounds.
 * Usage: bench_jtok [tokens] [iterations]
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/jtok.h"
#include "http/reqbody.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t make_json(char *buf, size_t cap, const uint32_t *toks, size_t n, const char *sep)
{
    size_t len = (size_t)snprintf(buf, cap, "{\"model\": \"Qwen/Qwen3-8B\", \"token_ids\": [");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%u", i ? sep : "", toks[i]);
    len += (size_t)snprintf(buf + len, cap - len, "]}");
    return len;
}

static size_t make_msgpack(unsigned char *b, const uint32_t *toks, size_t n)
{
    size_t len = 0;
    b[len++] = 0x82;
    b[len++] = 0xa5;
    memcpy(b + len, "model", 5);
    len += 5;
    b[len++] = 0xad;
    memcpy(b + len, "Qwen/Qwen3-8B", 13);
    len += 13;
    b[len++] = 0xa9;
    memcpy(b + len, "token_ids", 9);
    len += 9;
    b[len++] = 0xdd;
    b[len++] = (unsigned char)(n >> 24);
    b[len++] = (unsigned char)(n >> 16);
    b[len++] = (unsigned char)(n >> 8);
    b[len++] = (unsigned char)n;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = toks[i];
        if (v < 128) {
            b[len++] = (unsigned char)v;
        } else if (v < 256) {
            b[len++] = 0xcc;
            b[len++] = (unsigned char)v;
        } else if (v < 65536) {
            b[len++] = 0xcd;
            b[len++] = (unsigned char)(v >> 8);
            b[len++] = (unsigned char)v;
        } else {
            b[len++] = 0xce;
            b[len++] = (unsigned char)(v >> 24);
            b[len++] = (unsigned char)(v >> 16);
            b[len++] = (unsigned char)(v >> 8);
            b[len++] = (unsigned char)v;
        }
    }
    return len;
}

static void report(const char *what, size_t bytes, int iters, double secs)
{
    double per = secs / iters;
    printf("%-22s %8zu B  %9.1f MB/s  %8.2f us/body\n", what, bytes, bytes / per / 1e6,
           per * 1e6);
}

/* Runs body `iters` times per round, 5 rounds; t = the best round's time. */
#define BEST5(t, iters, ...)                                    \
    do {                                                        \
        (t) = 1e30;                                             \
        for (int r_ = 0; r_ < 5; r_++) {                        \
            double t0_ = now_s(), d_;                           \
            for (int i_ = 0; i_ < (iters); i_++) {              \
                __VA_ARGS__;                                    \
            }                                                   \
            d_ = now_s() - t0_;                                 \
            if (d_ < (t))                                       \
                (t) = d_;                                       \
        }                                                       \
    } while (0)

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 8192;
    int iters = argc > 2 ? atoi(argv[2]) : 1000;
    uint32_t *toks = malloc(n * sizeof(uint32_t)), *out = malloc(n * sizeof(uint32_t));
    size_t cap = n * 16 + 128;
    char *body = malloc(cap), *work = malloc(cap);
    unsigned char *mp = malloc(n * 5 + 64);
    const char *pods[4];
    struct kvr_reqbody_scratch sc = {out, n, pods, 4, NULL, 0};
    struct kvr_reqbody_query q;
    unsigned seed = 42;
    volatile uint64_t sink = 0;
    int bad = 0;
    static const char *const seps[] = {", ", ","};

    if (n == 0 || toks == NULL || out == NULL || body == NULL || work == NULL || mp == NULL)
        return 1;
    for (size_t i = 0; i < n; i++)
        toks[i] = (uint32_t)(rand_r(&seed) % 152064);

    for (int s = 0; s < 2; s++) {
        size_t len = make_json(body, cap, toks, n, seps[s]);
        const char *arr = strchr(body, '[');
        size_t alen = len - (size_t)(arr - body) - 1;
        double t;
        int citers = iters / 10 + 1;

        printf("-- %zu tokens, separator \"%s\"\n", n, seps[s]);
        memcpy(work, arr, alen);
        BEST5(t, iters, {
            struct kvr_jtok j;
            size_t cnt;
            kvr_jtok_init(&j, work, alen);
            bad |= kvr_jtok_u32_array(&j, out, n, &cnt) != 0 || cnt != n;
            sink += out[n - 1];
        });
        report(kvr_jtok_force_isa(-1) == 3 ? "jtok array (avx512)"
               : kvr_jtok_force_isa(-1) == 2 ? "jtok array (avx2)" : "jtok array (best)",
               alen, iters, t);

        for (int lvl = 0; lvl < kvr_jtok_force_isa(-1); lvl++) {
            char lbl[32];
            kvr_jtok_force_isa(lvl);
            BEST5(t, iters, {
                struct kvr_jtok j;
                size_t cnt;
                kvr_jtok_init(&j, work, alen);
                bad |= kvr_jtok_u32_array(&j, out, n, &cnt) != 0 || cnt != n;
                sink += out[n - 1];
            });
            snprintf(lbl, sizeof(lbl), "jtok array (%s)",
                     lvl == 0 ? "portable" : lvl == 1 ? "sse2" : "avx2");
            report(lbl, alen, iters, t);
        }
        kvr_jtok_force_isa(-1);

        BEST5(t, iters, {
            memcpy(work, body, len);
            bad |= kvr_reqbody_query_json(work, len, &sc, &q, NULL) != 0 || q.ntokens != n;
            sink += q.tokens[0];
        });
        report("reqbody json (+copy)", len, iters, t);

        BEST5(t, citers, {
            cJSON *root = cJSON_ParseWithLength(body, len);
            cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "token_ids"), *e;
            size_t k = 0;
            cJSON_ArrayForEach(e, a) out[k++] = (uint32_t)e->valuedouble;
            sink += k;
            cJSON_Delete(root);
        });
        report("cJSON", len, citers, t);
    }
    {
        size_t len = make_msgpack(mp, toks, n);
        double t;
        printf("-- %zu tokens, msgpack\n", n);
        for (int lvl = kvr_reqbody_force_isa(-1); lvl >= 0; lvl--) {
            kvr_reqbody_force_isa(lvl);
            BEST5(t, iters, {
                memcpy(work, mp, len);
                bad |= kvr_reqbody_query_msgpack(work, len, &sc, &q, NULL) != 0 ||
                       q.ntokens != n;
                sink += q.tokens[0];
            });
            report(lvl == 1 ? "reqbody mpack avx512 (+copy)" : "reqbody mpack scalar (+copy)",
                   len, iters, t);
        }
        kvr_reqbody_force_isa(-1);
    }
    (void)sink;
    free(toks);
    free(out);
    free(body);
    free(work);
    free(mp);
    if (bad)
        fprintf(stderr, "bench_jtok: a parse failed\n");
    return bad;
}
