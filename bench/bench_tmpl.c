/* bench_tmpl.c — chat-template render latency: Qwen3's template (tests/data/tmpl/qwen3.jinja)
 * over a 10-message conversation of ~30 KB (~8K tokens: a system prompt, then user/assistant
 * turns of ~3 KB, one assistant turn with reasoning_content), one thread. Two figures, p50 and
 * p99 over ITERS renders after a warm-up:
 *   render      the conversation's values built once (another ctx), each render on a reset ctx
 *   build+render  the values rebuilt on every iteration too (what a request pays besides JSON)
 * Also compiles: the template compile time (paid once per model at load).
 *
 *   bench_tmpl [TEMPLATE] [iters]     (default tests/data/tmpl/qwen3.jinja, 2000)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "text/tmpl.h"

static const char *words[] = {"the", "cache", "router", "prefix", "block", "engine", "token",
                              "request", "latency", "fleet", "score", "GPU", "memory", "Zürich",
                              "données", "缓存", "🙂", "and", "of", "to", "is", "with", "for"};

static void text(char *buf, size_t want, unsigned *seed)
{
    size_t n = 0;
    while (n + 16 < want) {
        *seed = *seed * 1103515245u + 12345u;
        const char *w = words[(*seed >> 16) % (sizeof words / sizeof words[0])];
        size_t l = strlen(w);
        memcpy(buf + n, w, l);
        n += l;
        buf[n++] = (*seed >> 8) % 17 == 0 ? '\n' : ' ';
    }
    buf[n] = 0;
}

static kvr_tmpl_val *build(kvr_tmpl_ctx *ctx, size_t *bytes)
{
    static char t[10][3200];
    static int made;
    unsigned seed = 7;
    if (!made) {
        for (int i = 0; i < 10; i++)
            text(t[i], sizeof t[i], &seed);
        made = 1;
    }
    kvr_tmpl_val *vars = kvr_tmpl_dict(ctx), *msgs = kvr_tmpl_list(ctx);
    *bytes = 0;
    for (int i = 0; i < 10; i++) {
        const char *role = i == 0 ? "system" : i % 2 ? "user" : "assistant";
        kvr_tmpl_val *m = kvr_tmpl_dict(ctx);
        kvr_tmpl_dict_set(ctx, m, "role", 4, kvr_tmpl_str(ctx, role, strlen(role)));
        kvr_tmpl_dict_set(ctx, m, "content", 7, kvr_tmpl_str(ctx, t[i], strlen(t[i])));
        if (i == 8)
            kvr_tmpl_dict_set(ctx, m, "reasoning_content", 17, kvr_tmpl_str(ctx, t[1], 400));
        kvr_tmpl_list_push(ctx, msgs, m);
        *bytes += strlen(t[i]);
    }
    kvr_tmpl_dict_set(ctx, vars, "messages", 8, msgs);
    kvr_tmpl_dict_set(ctx, vars, "tools", 5, kvr_tmpl_none(ctx));
    kvr_tmpl_dict_set(ctx, vars, "add_generation_prompt", 21, kvr_tmpl_bool(ctx, 1));
    kvr_tmpl_dict_set(ctx, vars, "eos_token", 9, kvr_tmpl_str(ctx, "<|im_end|>", 10));
    return vars;
}

static void report(const char *what, double *lat, int n, size_t outlen)
{
    qsort(lat, (size_t)n, sizeof *lat, cmpd);
    printf("%-14s p50 %8.1f us  p99 %8.1f us  (%d renders, %zu bytes out, %.0f MB/s at p50)\n",
           what, lat[n / 2], lat[(n * 99) / 100], n, outlen, (double)outlen / lat[n / 2]);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/data/tmpl/qwen3.jinja";
    int iters = argc > 2 ? atoi(argv[2]) : 2000;
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    static char src[1 << 20];
    size_t len = fread(src, 1, sizeof src, f);
    fclose(f);
    kvr_tmpl *t;
    char err[256];
    double t0 = now_us();
    if (kvr_tmpl_compile(src, len, &t, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", path, err);
        return 1;
    }
    printf("bench_tmpl: %s (%zu bytes) compiled in %.1f us\n", path, len, now_us() - t0);
    kvr_tmpl_ctx *vctx, *ctx;
    if (kvr_tmpl_ctx_create(&vctx, NULL) || kvr_tmpl_ctx_create(&ctx, NULL))
        return 1;
    size_t in_bytes;
    kvr_tmpl_val *vars = build(vctx, &in_bytes);
    printf("bench_tmpl: conversation of 10 messages, %zu bytes of content\n", in_bytes);
    double *lat = malloc(sizeof(double) * (size_t)iters);
    const char *out;
    size_t outlen = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = -iters / 10; i < iters; i++) {
            double s = now_us();
            kvr_tmpl_ctx_reset(ctx);
            kvr_tmpl_val *v = pass == 0 ? vars : build(ctx, &in_bytes);
            if (kvr_tmpl_render(t, ctx, v, 0, &out, &outlen, err, sizeof err)) {
                fprintf(stderr, "render: %s\n", err);
                return 1;
            }
            if (i >= 0)
                lat[i] = now_us() - s;
        }
        report(pass == 0 ? "render" : "build+render", lat, iters, outlen);
    }
    free(lat);
    kvr_tmpl_ctx_destroy(ctx);
    kvr_tmpl_ctx_destroy(vctx);
    kvr_tmpl_free(t);
    return 0;
}
