/* bench_chat.c — a chat request's text path, one thread: Qwen3's chat template rendered over a
 * 10-turn conversation of ~8K tokens (a system prompt, user/assistant turns of ~3 KB), then the
 * text tokenized; µs p50/p99 over ITERS requests, each with a different last user turn:
 *   cold   values built, rendered, tokenized without a prefix cache
 *   warm   the same through the prefix cache holding the first 9 turns (each request's
 *          render shares them and adds a new last turn of ~3 KB, which the cache then holds
 *          too, as the daemon does)
 *
 *   bench_chat TOKREF_DIR TEMPLATE [iters]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "text/tmpl.h"
#include "text/tok.h"

static const char *words[] = {"the", "cache", "router", "prefix", "block", "engine", "token",
                              "request", "latency", "fleet", "score", "GPU", "memory", "Zürich",
                              "données", "缓存", "and", "of", "to", "is", "with", "for", "42"};

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

static char turns[10][3300];

static kvr_tmpl_val *conversation(kvr_tmpl_ctx *ctx, int nturns, int variant)
{
    kvr_tmpl_val *vars = kvr_tmpl_dict(ctx), *msgs = kvr_tmpl_list(ctx);
    char last[3400];
    for (int i = 0; i < nturns; i++) {
        const char *role = i == 0 ? "system" : i % 2 ? "user" : "assistant";
        const char *t = turns[i];
        if (i == nturns - 1 && variant >= 0) { /* a different last question each request */
            snprintf(last, sizeof last, "Request %d: %s", variant, turns[i]);
            t = last;
        }
        kvr_tmpl_val *m = kvr_tmpl_dict(ctx);
        kvr_tmpl_dict_set(ctx, m, "role", 4, kvr_tmpl_str(ctx, role, strlen(role)));
        kvr_tmpl_dict_set(ctx, m, "content", 7, kvr_tmpl_str(ctx, t, strlen(t)));
        kvr_tmpl_list_push(ctx, msgs, m);
    }
    kvr_tmpl_dict_set(ctx, vars, "messages", 8, msgs);
    kvr_tmpl_dict_set(ctx, vars, "tools", 5, kvr_tmpl_none(ctx));
    kvr_tmpl_dict_set(ctx, vars, "add_generation_prompt", 21, kvr_tmpl_bool(ctx, 1));
    kvr_tmpl_dict_set(ctx, vars, "eos_token", 9, kvr_tmpl_str(ctx, "<|im_end|>", 10));
    return vars;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_chat TOKREF_DIR TEMPLATE [iters]\n");
        return 2;
    }
    int iters = argc > 3 ? atoi(argv[3]) : 500;
    char p[1024], err[512];
    snprintf(p, sizeof p, "%s/qwen3", argv[1]);
    kvr_tok *tok;
    if (kvr_tok_load(p, &tok, err, sizeof err)) {
        fprintf(stderr, "bench_chat: %s\n", err);
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    static char src[1 << 16];
    size_t sl = fread(src, 1, sizeof src, f);
    fclose(f);
    kvr_tmpl *t;
    if (kvr_tmpl_compile(src, sl, &t, err, sizeof err)) {
        fprintf(stderr, "bench_chat: %s\n", err);
        return 1;
    }
    unsigned seed = 11;
    for (int i = 0; i < 10; i++)
        text(turns[i], sizeof turns[i], &seed);
    kvr_tmpl_ctx *ctx;
    kvr_tmpl_ctx_create(&ctx, NULL);
    kvr_tok_scratch *s = kvr_tok_scratch_new();
    kvr_tok_cache *cache;
    kvr_tok_cache_new(8 << 20, &cache); /* full after ~120 requests: the steady state */
    const char *out;
    size_t outlen;
    const uint32_t *ids;
    /* the first 9 turns, as the previous request of this conversation */
    kvr_tmpl_render(t, ctx, conversation(ctx, 9, -1), 0, &out, &outlen, err, sizeof err);
    kvr_tok_encode_cached(tok, cache, s, out, outlen, false, &ids);
    double *cold = malloc((size_t)iters * sizeof *cold), *warm = malloc((size_t)iters * sizeof *warm);
    int ntok = 0;
    size_t bytes = 0;
    for (int i = -10; i < iters; i++) {
        double a = now_us();
        kvr_tmpl_ctx_reset(ctx);
        kvr_tmpl_render(t, ctx, conversation(ctx, 10, i + 1000), 0, &out, &outlen, err,
                        sizeof err);
        int n1 = kvr_tok_encode(tok, s, out, outlen, false, &ids);
        double b = now_us();
        kvr_tmpl_ctx_reset(ctx);
        kvr_tmpl_render(t, ctx, conversation(ctx, 10, i), 0, &out, &outlen, err, sizeof err);
        int n2 = kvr_tok_encode_cached(tok, cache, s, out, outlen, false, &ids);
        double e = now_us();
        if (n1 < 0 || n2 < 0) {
            fprintf(stderr, "bench_chat: failed %d %d\n", n1, n2);
            return 1;
        }
        if (i >= 0)
            cold[i] = b - a, warm[i] = e - b, ntok = n2, bytes = outlen;
    }
    qsort(cold, (size_t)iters, sizeof *cold, cmpd);
    qsort(warm, (size_t)iters, sizeof *warm, cmpd);
    struct kvr_tok_cache_stats st;
    kvr_tok_cache_stats(cache, &st);
    printf("chat request, Qwen3 template, 10 turns, %zu bytes rendered, %d tokens, %d requests\n",
           bytes, ntok, iters);
    printf("  cold (render + tokenize, no prefix cache)   p50 %8.1f us   p99 %8.1f us\n",
           cold[iters / 2], cold[iters * 99 / 100]);
    printf("  warm (first 9 turns in the prefix cache)    p50 %8.1f us   p99 %8.1f us   "
           "(hits %llu, %.0f%% of the text resumed)\n",
           warm[iters / 2], warm[iters * 99 / 100], (unsigned long long)st.hits,
           st.hits ? 100.0 * (double)st.saved_bytes / (double)st.hits / (double)bytes : 0);
    kvr_tok_cache_free(cache);
    kvr_tok_scratch_free(s);
    kvr_tmpl_ctx_destroy(ctx);
    kvr_tmpl_free(t);
    kvr_tok_free(tok);
    free(cold);
    free(warm);
    return 0;
}
