/* metrics.h — counters, histograms and Prometheus text exposition.
 *
 * Modules keep their own statistics (relaxed _Atomic counters, or per-thread and summed when
 * read) and render them on demand into a struct kvr_buf (buf.h) with the helpers below; the
 * HTTP layer concatenates those renderings for GET /metrics. Names get the "kvrouter_" prefix
 * here, so callers pass "events_received_total" and the line says
 * "kvrouter_events_received_total". Units belong in the name (_seconds, _bytes).
 *
 * Threads: kvr_hist_observe() is lock-free and may race with rendering (a scrape may see a
 * count one ahead of the buckets; Prometheus tolerates it). A kvr_buf belongs to one thread.
 */
#ifndef KVR_METRICS_H
#define KVR_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h" /* struct kvr_buf: what the renderers write into */

/* Histogram with fixed upper bounds (le), plus +Inf. Values are in the unit of the metric
 * (seconds for latencies). Up to KVR_HIST_MAX_BUCKETS finite bounds. */
#define KVR_HIST_MAX_BUCKETS 32
struct kvr_hist {
    size_t nbounds;
    double bounds[KVR_HIST_MAX_BUCKETS];
    _Atomic uint64_t buckets[KVR_HIST_MAX_BUCKETS + 1]; /* non-cumulative; last = +Inf */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_bits; /* double stored as bits, updated with CAS */
};

/* bounds must be strictly increasing; nbounds <= KVR_HIST_MAX_BUCKETS. */
void kvr_hist_init(struct kvr_hist *h, const double *bounds, size_t nbounds);
/* Exponential bounds: start, start*factor, ... (n of them). */
void kvr_hist_init_exp(struct kvr_hist *h, double start, double factor, size_t n);
void kvr_hist_observe(struct kvr_hist *h, double v);
/* Quantile estimate (linear within the bucket), for logs and benchmarks; 0 when empty. */
double kvr_hist_quantile(const struct kvr_hist *h, double q);

/* Prometheus text exposition. `labels` is either NULL or the inside of the braces, already
 * escaped ("pod=\"a\",tier=\"gpu\""). HELP/TYPE lines are written when help != NULL; for a
 * family with several label sets, pass help on the first call only. */
void kvr_metrics_counter(struct kvr_buf *b, const char *name, const char *help,
                         const char *labels, uint64_t v);
void kvr_metrics_gauge(struct kvr_buf *b, const char *name, const char *help, const char *labels,
                       double v);
void kvr_metrics_hist(struct kvr_buf *b, const char *name, const char *help, const char *labels,
                      const struct kvr_hist *h);
/* Escapes a label value (\\, \", \n) into dst (NUL-terminated, truncated to cap). */
void kvr_metrics_label_escape(char *dst, size_t cap, const char *s);

#endif
