/* metrics.c — lock-free histograms and Prometheus text rendering.
 *
 * Histograms keep non-cumulative atomic bucket counts; rendering turns them cumulative.
 * The sum is a double kept as bits in an atomic u64 and updated with a CAS loop.
 */
#include "core/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_hist_init(struct kvr_hist *h, const double *bounds, size_t nbounds)
{
    memset(h, 0, sizeof(*h));
    if (nbounds > KVR_HIST_MAX_BUCKETS)
        nbounds = KVR_HIST_MAX_BUCKETS;
    h->nbounds = nbounds;
    memcpy(h->bounds, bounds, nbounds * sizeof(double));
}

void kvr_hist_init_exp(struct kvr_hist *h, double start, double factor, size_t n)
{
    double b[KVR_HIST_MAX_BUCKETS];

    if (n > KVR_HIST_MAX_BUCKETS)
        n = KVR_HIST_MAX_BUCKETS;
    for (size_t i = 0; i < n; i++) {
        b[i] = start;
        start *= factor;
    }
    kvr_hist_init(h, b, n);
}

void kvr_hist_observe(struct kvr_hist *h, double v)
{
    size_t lo = 0, hi = h->nbounds;
    uint64_t old, nw;
    double sum;

    /* first bound >= v (Prometheus buckets are "le") */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h->bounds[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    atomic_fetch_add_explicit(&h->buckets[lo], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    old = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
    do {
        memcpy(&sum, &old, sizeof(sum));
        sum += v;
        memcpy(&nw, &sum, sizeof(nw));
    } while (!atomic_compare_exchange_weak_explicit(&h->sum_bits, &old, nw, memory_order_relaxed,
                                                    memory_order_relaxed));
}

double kvr_hist_quantile(const struct kvr_hist *h, double q)
{
    uint64_t total = 0, acc = 0, c[KVR_HIST_MAX_BUCKETS + 1];
    double rank, lo;

    for (size_t i = 0; i <= h->nbounds; i++) {
        c[i] = atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        total += c[i];
    }
    if (total == 0)
        return 0;
    rank = q * (double)total;
    for (size_t i = 0; i <= h->nbounds; i++) {
        if ((double)(acc + c[i]) >= rank && c[i] > 0) {
            if (i == h->nbounds)
                return h->nbounds ? h->bounds[h->nbounds - 1] : 0;
            lo = i ? h->bounds[i - 1] : 0;
            return lo + (h->bounds[i] - lo) * ((rank - (double)acc) / (double)c[i]);
        }
        acc += c[i];
    }
    return h->nbounds ? h->bounds[h->nbounds - 1] : 0;
}

static void head(struct kvr_buf *b, const char *name, const char *help, const char *type)
{
    if (help != NULL)
        kvr_buf_printf(b, "# HELP kvrouter_%s %s\n# TYPE kvrouter_%s %s\n", name, help, name,
                       type);
}

void kvr_metrics_counter(struct kvr_buf *b, const char *name, const char *help,
                         const char *labels, uint64_t v)
{
    head(b, name, help, "counter");
    if (labels != NULL && *labels)
        kvr_buf_printf(b, "kvrouter_%s{%s} %llu\n", name, labels, (unsigned long long)v);
    else
        kvr_buf_printf(b, "kvrouter_%s %llu\n", name, (unsigned long long)v);
}

void kvr_metrics_gauge(struct kvr_buf *b, const char *name, const char *help, const char *labels,
                       double v)
{
    head(b, name, help, "gauge");
    if (labels != NULL && *labels)
        kvr_buf_printf(b, "kvrouter_%s{%s} %.17g\n", name, labels, v);
    else
        kvr_buf_printf(b, "kvrouter_%s %.17g\n", name, v);
}

void kvr_metrics_hist(struct kvr_buf *b, const char *name, const char *help, const char *labels,
                      const struct kvr_hist *h)
{
    uint64_t acc = 0, bits;
    double sum;
    const char *sep = (labels != NULL && *labels) ? "," : "";
    const char *lb = labels != NULL ? labels : "";

    head(b, name, help, "histogram");
    for (size_t i = 0; i < h->nbounds; i++) {
        acc += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        kvr_buf_printf(b, "kvrouter_%s_bucket{%s%sle=\"%.9g\"} %llu\n", name, lb, sep,
                       h->bounds[i], (unsigned long long)acc);
    }
    acc += atomic_load_explicit(&h->buckets[h->nbounds], memory_order_relaxed);
    kvr_buf_printf(b, "kvrouter_%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, lb, sep,
                   (unsigned long long)acc);
    bits = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
    memcpy(&sum, &bits, sizeof(sum));
    if (*lb) {
        kvr_buf_printf(b, "kvrouter_%s_sum{%s} %.17g\n", name, lb, sum);
        kvr_buf_printf(b, "kvrouter_%s_count{%s} %llu\n", name, lb, (unsigned long long)acc);
    } else {
        kvr_buf_printf(b, "kvrouter_%s_sum %.17g\n", name, sum);
        kvr_buf_printf(b, "kvrouter_%s_count %llu\n", name, (unsigned long long)acc);
    }
}

void kvr_metrics_label_escape(char *dst, size_t cap, const char *s)
{
    size_t n = 0;

    if (cap == 0)
        return;
    for (; *s && n + 2 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            dst[n++] = '\\';
            dst[n++] = *s;
        } else if (*s == '\n') {
            dst[n++] = '\\';
            dst[n++] = 'n';
        } else {
            dst[n++] = *s;
        }
    }
    dst[n] = '\0';
}
