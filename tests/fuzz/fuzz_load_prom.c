/* fuzz_load_prom.c — libFuzzer target for the load scraper's narrow Prometheus text reader
 * (load_prom.c) and its URL templates (load.c).
 *
 * Input: the first byte seeds where the answer is cut, the rest is the answer. It is read in
 * one piece and again fed in pieces cut at pseudo-random places (as libcurl hands it over):
 * both readings must agree exactly (the cuts never change the result), every kept figure
 * must be finite, non-negative, KV usage within 0..1, and the counts must add up. The answer
 * (its first line, NUL-terminated) is also tried as a pod id in each placeholder of a URL
 * template: either refused or a URL that fits and holds no byte the pod check refuses.
 * Copies go into exact-size heap buffers so ASan sees any over-read.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "load/load_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const struct kvr_load_prom *p)
{
    /* a line is kept, malformed, ignored or none of them */
    if (p->samples + p->malformed + p->ignored > p->lines || p->nranks > KVR_LOAD_PROM_MAX_RANKS)
        abort();
    for (size_t i = 0; i < p->nranks; i++)
        for (int f = 0; f < KVR_LOAD_NFIELDS; f++) {
            double v = p->ranks[i].v[f];
            if (p->ranks[i].prio[f] == 0)
                continue;
            if (!isfinite(v) || v < 0 || (f == KVR_LOAD_KV_USAGE && v > 1))
                abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const tmpl[] = {"http://{pod}/metrics", "https://{host}:9400/m?r={rank}"};
    struct kvr_load_prom whole, cut;
    unsigned r;
    char *text, *pod, url[KVR_LOAD_URL_MAX];
    size_t n, podlen;

    if (size == 0)
        return 0;
    r = data[0] * 2654435761u + 1;
    n = size - 1;
    text = malloc(n ? n : 1);
    if (text == NULL)
        return 0;
    memcpy(text, data + 1, n);

    kvr_load_prom_init(&whole);
    kvr_load_prom_init(&cut);
    if (kvr_load_prom_parse(&whole, text, n) == 0) {
        check(&whole);
        kvr_load_prom_reset(&cut);
        for (size_t i = 0; i < n;) {
            size_t step;
            r = r * 1103515245u + 12345u;
            step = 1 + (r >> 16) % ((r & 1) ? 7 : 97);
            if (step > n - i)
                step = n - i;
            if (kvr_load_prom_feed(&cut, text + i, step) != 0)
                goto out;
            i += step;
        }
        kvr_load_prom_end(&cut);
        if (cut.lines != whole.lines || cut.samples != whole.samples ||
            cut.malformed != whole.malformed || cut.ignored != whole.ignored ||
            cut.nranks != whole.nranks ||
            (whole.nranks &&
             memcmp(cut.ranks, whole.ranks, whole.nranks * sizeof(whole.ranks[0])) != 0))
            abort();
    }

    {
        const char *nl = memchr(text, '\n', n); /* text is not NUL-terminated */
        podlen = nl ? (size_t)(nl - text) : n;
    }
    pod = malloc(podlen + 1);
    if (pod != NULL) {
        memcpy(pod, text, podlen);
        pod[podlen] = '\0';
        for (size_t t = 0; t < sizeof(tmpl) / sizeof(tmpl[0]); t++) {
            int len = kvr_load_url_expand(tmpl[t], pod, 7, url, sizeof(url));
            if (len >= 0 && ((size_t)len != strlen(url) || !kvr_load_pod_ok(pod)))
                abort();
            if (len < 0 && len != -EINVAL && len != -ENAMETOOLONG)
                abort();
        }
        free(pod);
    }
out:
    kvr_load_prom_deinit(&whole);
    kvr_load_prom_deinit(&cut);
    free(text);
    return 0;
}
