/* bench_tok.c — tokenizer throughput: encodes of a 20 KB document, one thread, per reference
 * tokenizer; the median of RUNS runs of ITERS encodes. Cold: the scratch's word cache emptied
 * before every encode (words repeat within the document, so it still helps, as HF's does);
 * warm: the same document again (every word cached: an upper bound).
 * Then the prefix cache (tok_cache.c): prompts of a 24 KB prefix (the document, extended)
 * plus a new 1 KB tail each (drawn from the document at a different offset, so the tail's
 * words are not new either): µs per prompt p50/p99, through the cache (the prefix cached by
 * an earlier prompt; each prompt is also inserted, as the daemon does) and without it.
 *
 *   bench_tok TOKREF_DIR DOC [runs] [iters]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "text/tok.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tok TOKREF_DIR DOC [runs] [iters]\n");
        return 2;
    }
    int runs = argc > 3 ? atoi(argv[3]) : 7, iters = argc > 4 ? atoi(argv[4]) : 50;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    static char doc[1 << 20];
    size_t len = fread(doc, 1, sizeof doc, f);
    fclose(f);
    static const char *names[] = {"qwen3", "llama3", "deepseek_v3", "llama2", "gemma3"};
    static const char *labels[] = {"Qwen3", "Llama 3", "DeepSeek-V3", "Mistral-7B v0.1",
                                   "Gemma 3"};
    kvr_tok *res[5];
    int pq = (int)envl("TOK_CACHE_PROMPTS", 400);
    printf("%-16s %8s %8s %10s %10s %10s %10s\n", "tokenizer", "load ms", "tokens",
           "cold p50", "cold min", "cold max", "warm p50");
    for (size_t m = 0; m < sizeof names / sizeof *names; m++) {
        char p[1024], err[512];
        snprintf(p, sizeof p, "%s/%s", argv[1], names[m]);
        kvr_tok *t;
        double t0 = now_us();
        if (kvr_tok_load(p, &t, err, sizeof err)) {
            fprintf(stderr, "bench_tok: %s\n", err);
            return 1;
        }
        double load_ms = (now_us() - t0) / 1e3;
        kvr_tok_scratch *s = kvr_tok_scratch_new();
        const uint32_t *ids;
        int n = kvr_tok_encode(t, s, doc, len, false, &ids); /* warm the scratch */
        double *mbs = malloc((size_t)runs * sizeof *mbs), *wmb = malloc((size_t)runs * sizeof *wmb);
        for (int r = 0; r < runs; r++) {
            double a = now_us();
            for (int i = 0; i < iters; i++) {
                kvr_tok_scratch_clear_cache(s);
                kvr_tok_encode(t, s, doc, len, false, &ids);
            }
            mbs[r] = (double)len * iters / (now_us() - a); /* bytes/µs = MB/s */
            a = now_us();
            for (int i = 0; i < iters; i++)
                kvr_tok_encode(t, s, doc, len, false, &ids);
            wmb[r] = (double)len * iters / (now_us() - a);
        }
        qsort(mbs, (size_t)runs, sizeof *mbs, cmpd);
        qsort(wmb, (size_t)runs, sizeof *wmb, cmpd);
        printf("%-16s %8.0f %8d %10.1f %10.1f %10.1f %10.1f\n", labels[m], load_ms, n,
               mbs[runs / 2], mbs[0], mbs[runs - 1], wmb[runs / 2]);
        free(mbs);
        free(wmb);
        kvr_tok_scratch_free(s);
        res[m] = t;
    }
    printf("\nprefix cache: 24 KB cached prefix + a new 1 KB tail per prompt, %d prompts\n", pq);
    printf("%-16s %10s %10s %10s %10s %12s\n", "tokenizer", "cached p50", "cached p99",
           "plain p50", "plain p99", "resumed at");
    enum { PRE = 24 * 1024, TAIL = 1024 };
    char *text = malloc(PRE + TAIL);
    for (size_t i = 0; i < PRE; i++) /* the document, then again from its start */
        text[i] = doc[i % len];
    size_t pre = PRE;
    while (pre > 0 && ((unsigned char)text[pre] & 0xC0) == 0x80)
        pre--;
    double *cu = malloc((size_t)pq * sizeof *cu), *pu = malloc((size_t)pq * sizeof *pu);
    for (size_t m = 0; m < sizeof names / sizeof *names; m++) {
        kvr_tok_cache *c;
        /* 8 MiB: full after ~150 such prompts, so most run in the steady state (evicting,
         * reusing freed memory) rather than first-touching new pages */
        kvr_tok_cache_new(8 << 20, &c);
        kvr_tok_scratch *s = kvr_tok_scratch_new(), *s2 = kvr_tok_scratch_new();
        const uint32_t *ids;
        size_t n = pre;
        for (int q = -1; q < pq; q++) {
            /* a tail from elsewhere in the document, on a character boundary */
            size_t off = ((size_t)(q + 1) * 7919) % (len - TAIL), tl = TAIL;
            while (off < len && ((unsigned char)doc[off] & 0xC0) == 0x80)
                off++;
            while (tl > 0 && ((unsigned char)doc[off + tl] & 0xC0) == 0x80)
                tl--;
            memcpy(text + pre, doc + off, tl);
            n = pre + tl;
            double a = now_us();
            int r1 = kvr_tok_encode_cached(res[m], c, s, text, n, true, &ids);
            double b = now_us();
            int r2 = kvr_tok_encode(res[m], s2, text, n, true, &ids);
            double e = now_us();
            if (r1 != r2) {
                fprintf(stderr, "bench_tok: cached and plain differ\n");
                return 1;
            }
            if (q >= 0)
                cu[q] = b - a, pu[q] = e - b;
        }
        struct kvr_tok_cache_stats st;
        kvr_tok_cache_stats(c, &st);
        qsort(cu, (size_t)pq, sizeof *cu, cmpd);
        qsort(pu, (size_t)pq, sizeof *pu, cmpd);
        printf("%-16s %10.1f %10.1f %10.1f %10.1f %11.1f%%\n", labels[m], cu[pq / 2],
               cu[pq * 99 / 100], pu[pq / 2], pu[pq * 99 / 100],
               st.hits ? 100.0 * (double)st.saved_bytes / (double)st.hits / (double)pre : 0);
        kvr_tok_cache_free(c);
        kvr_tok_scratch_free(s);
        kvr_tok_scratch_free(s2);
        kvr_tok_free(res[m]);
    }
    printf("(resumed at: the share of the 24 KB prefix served from the cache, mean; Mistral "
           "and Gemma 3 resume only after added tokens, which this text lacks)\n");
    free(cu);
    free(pu);
    free(text);
    printf("(document: %s, %zu bytes; %d runs x %d encodes, one thread)\n", argv[2], len, runs,
           iters);
    return 0;
}
