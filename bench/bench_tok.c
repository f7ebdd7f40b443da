/* bench_tok.c — tokenizer throughput: encodes of a 20 KB document, one thread, per reference
 * tokenizer; the median of RUNS runs of ITERS encodes. Cold: the scratch's word cache emptied
 * before every encode (words repeat within the document, so it still helps, as HF's does);
 * warm: the same document again (every word cached: an upper bound).
 *
 *   bench_tok TOKREF_DIR DOC [runs] [iters]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "tok.h"

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
        kvr_tok_free(t);
    }
    printf("(document: %s, %zu bytes; %d runs x %d encodes, one thread)\n", argv[2], len, runs,
           iters);
    return 0;
}
