/* load_int.h — private to load*.c (and their tests): the narrow Prometheus text parser of
 * load_prom.c, the worker table of load_table.c and the URL template expansion load.c uses.
 * Not a contract for other modules: load.h is.
 *
 * The parser reads the text exposition format 0.0.4 (what vLLM, SGLang and TensorRT-LLM
 * serve on /metrics) line by line, incrementally (an answer can be fed as it arrives, in
 * pieces cut anywhere), and keeps only the series it knows (load_prom.c's name table), per
 * DP rank. Everything else is skipped unread. Pure: no I/O, no globals; one state per
 * answer being read, owned by one thread.
 */
#ifndef KVR_LOAD_INT_H
#define KVR_LOAD_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "load/load.h"

#define KVR_LOAD_PROM_MAX_RANKS 256   /* distinct DP ranks kept from one answer */
#define KVR_LOAD_PROM_RANK_MAX 65535u /* a rank label above this is refused */
#define KVR_LOAD_PROM_MAX_LINE 65536  /* bytes; a longer line is skipped (malformed when its
                                       * name is one that is read) */

enum kvr_load_field {
    KVR_LOAD_WAITING = 0,
    KVR_LOAD_RUNNING,
    KVR_LOAD_KV_USAGE,
    KVR_LOAD_PROMPT,  /* prompt tokens (counter) */
    KVR_LOAD_HITS,    /* prefix-cache hit tokens (counter) */
    KVR_LOAD_QUERIES, /* prefix-cache query tokens (counter) */
    KVR_LOAD_NFIELDS
};

/* One DP rank's figures from one answer. prio[f] = 0: not exported; else the priority of the
 * name it came from (a current name beats a deprecated alias of the same figure; series of
 * one priority add up, KV usage takes the largest). */
struct kvr_load_prom_rank {
    uint32_t rank;
    uint8_t prio[KVR_LOAD_NFIELDS];
    double v[KVR_LOAD_NFIELDS];
};

struct kvr_load_prom {
    struct kvr_load_prom_rank *ranks; /* in order of first appearance */
    size_t nranks, rcap;
    uint64_t lines;     /* lines seen (comments and blank ones included) */
    uint64_t samples;   /* samples kept */
    uint64_t malformed; /* lines refused: bad syntax on a name that is read, or a line
                         * that does not start with a metric name at all */
    uint64_t ignored;   /* well-formed samples of a read name not kept: NaN, +-Inf or a
                         * negative value, a rank label that is not 0..65535, the rank cap */
    /* incremental reading */
    char *part;         /* the unfinished last line of the bytes fed so far */
    size_t partlen, partcap;
    bool skipping;      /* inside an overlong line: drop bytes up to the next newline */
};

void kvr_load_prom_init(struct kvr_load_prom *p);
/* Ready for a new answer: figures and counts cleared, buffers kept. */
void kvr_load_prom_reset(struct kvr_load_prom *p);
/* The next bytes of the answer (any cut). 0, or -ENOMEM (the line being assembled is lost,
 * counted malformed; reading goes on). */
int kvr_load_prom_feed(struct kvr_load_prom *p, const char *data, size_t len);
/* The end of the answer: reads a last line that has no newline. */
void kvr_load_prom_end(struct kvr_load_prom *p);
void kvr_load_prom_deinit(struct kvr_load_prom *p);
/* reset + feed + end on a whole text. */
int kvr_load_prom_parse(struct kvr_load_prom *p, const char *text, size_t len);
/* The figures of `rank`, or NULL when the answer had none. */
const struct kvr_load_prom_rank *kvr_load_prom_find(const struct kvr_load_prom *p,
                                                    uint32_t rank);

/* ---- the worker table (load_table.c; load.c's `lock` held around every call) ---------- */

struct kvr_load_worker {
    char *pod;                /* owned */
    uint32_t rank;
    uint64_t hash;            /* kvr_load_key_hash(pod, rank): set before the insert */
    struct kvr_load_sample s; /* age_ns and stale are filled in when read */
    const void *owner;        /* load.c's target: compared, dereferenced by the scraper only */
};

struct kvr_load_wtable {
    struct kvr_load_worker **slots; /* linear probing, cap a power of two, at most half full */
    size_t cap, n;
};

uint64_t kvr_load_key_hash(const char *pod, uint32_t rank);
/* The worker (pod, rank) whose hash is h, or NULL. */
struct kvr_load_worker *kvr_load_wt_find(const struct kvr_load_wtable *t, const char *pod,
                                         uint32_t rank, uint64_t h);
/* Inserts w (not present; w->hash set). 0 or -ENOMEM (the table unchanged). */
int kvr_load_wt_insert(struct kvr_load_wtable *t, struct kvr_load_worker *w);
/* Removes and frees every worker drop() selects; allocates nothing. The number removed. */
size_t kvr_load_wt_sweep(struct kvr_load_wtable *t,
                         bool (*drop)(const struct kvr_load_worker *w, void *arg), void *arg);
void kvr_load_wt_free(struct kvr_load_wtable *t);
void kvr_load_worker_free(struct kvr_load_worker *w);

/* ---- URL templates and the listing (load_url.c) ------------------------------------------------------------ */

#define KVR_LOAD_URL_MAX 2048

/* A pod id that may be put into a URL: 1..255 bytes of [A-Za-z0-9._:[]-]. */
bool kvr_load_pod_ok(const char *pod);
/* Whether the template names {rank} (one URL per (pod, rank) rather than per pod). */
bool kvr_load_url_per_rank(const char *tmpl);
/* tmpl (checked by conf.c) with {pod}, {host} (pod up to its last ':', all of it without
 * one) and {rank} filled in, into out[cap]. The length, or -EINVAL (a pod that
 * kvr_load_pod_ok refuses, an unknown placeholder) or -ENAMETOOLONG. */
int kvr_load_url_expand(const char *tmpl, const char *pod, uint32_t rank, char *out,
                        size_t cap);

#define KVR_LOAD_LIST_MAX (1u << 20) /* workers a listing may name (memory bound) */

struct kvr_load_lentry {
    char *pod;
    uint32_t rank;
    char *url;
};

struct kvr_load_list {
    struct kvr_load_lentry *v;
    size_t n, cap;
    int rc; /* first -ENOMEM */
};

/* Frees pods[0..n) and the array. */
void kvr_load_pods_free(char **pods, size_t n);
/* Frees a listing's entries (and zeroes it). */
void kvr_load_list_free(struct kvr_load_list *l);
/* qsort order of listing entries: URL, then pod. */
int kvr_load_lentry_cmp(const void *a, const void *b);
/* The pods of entries v[0..n) (sorted, one URL) as a fresh unique array. NULL on ENOMEM. */
char **kvr_load_group_pods(const struct kvr_load_lentry *v, size_t n, size_t *np);

#endif
