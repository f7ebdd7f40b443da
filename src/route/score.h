/* score.h — a query (model, lora, token ids, pod filter) → ranked worker scores.
 *
 * The prompt is cut into the model's block size (learned from its events, else its
 * [model] block_size, else 16 for a model in approximate mode; a partial tail block does not
 * count), hashed with hash.h exactly as ingest hashes events (a cache_salt
 * and media items fold in as the engine's extra keys: kvr_hash_fold_query), and looked up
 * with kvr_index_find(). score = sum over the matched blocks of the best tier weight the
 * worker holds each at. Entries are sorted by score desc, then pod, then dp_rank.
 * The "predicted" tier (ingest_assume.c) is set aside: matched_blocks counts without it,
 * predicted_blocks with it, and score weighs it like any tier ([score] weight.predicted).
 *
 * Uses conf.h only for the settings struct it is created from (tier weights), as ingest does.
 *
 * Threads: one struct kvr_score_ctx per thread (it owns an index reader and scratch sized
 * for max_tokens, so a query makes no heap allocation). Weights can be changed at runtime
 * (SIGHUP) with kvr_score_set_weights from any thread.
 */
#ifndef KVR_SCORE_H
#define KVR_SCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/conf.h"
#include "index/hash.h"
#include "index/index.h"
#include "core/metrics.h"

struct kvr_score;     /* shared: index, weights, latency histograms */
struct kvr_score_ctx; /* per thread */

int kvr_score_create(struct kvr_index *ix, const struct kvr_conf *conf, struct kvr_score **out);
void kvr_score_destroy(struct kvr_score *s);
/* Re-reads the tier weights and the [model] block sizes from conf (reload). */
void kvr_score_set_weights(struct kvr_score *s, const struct kvr_conf *conf);

int kvr_score_ctx_create(struct kvr_score *s, uint32_t max_tokens, struct kvr_score_ctx **out);
void kvr_score_ctx_destroy(struct kvr_score_ctx *c);

struct kvr_score_query {
    const char *model;       /* NUL-terminated */
    const char *lora_name;   /* NULL = none */
    const uint32_t *tokens;
    size_t ntokens;
    const char *const *pods; /* NULL/npods 0 = all pods */
    size_t npods;
    const char *cache_salt;  /* NULL/"" = none; keys block 0 as the engine does */
    const struct kvr_hash_media *media; /* sorted by offset, not overlapping */
    size_t nmedia;
    bool want_hashes;         /* res->hashes: the query's block content hashes, even when no
                               * worker of the model is indexed yet */
};

struct kvr_score_entry {
    const char *pod; /* borrowed from the index */
    uint32_t dp_rank;
    uint32_t matched_blocks;   /* exact: what the worker's events (or approximate mode's
                                * assumptions) say it holds */
    uint32_t matched_tokens;
    uint32_t predicted_blocks; /* the longest prefix counting its "predicted" tier too
                                * (>= matched_blocks): blocks requests routed there in the last
                                * [route] predicted_ttl are computing, not yet confirmed */
    uint32_t tiers[KVR_TIER_MAX]; /* per-tier matched prefix, indexed by tier id */
    double score;
};

struct kvr_score_result {
    uint32_t block_size;  /* 0 when the model is unknown (JSON null) */
    uint32_t query_blocks;
    const struct kvr_score_entry *entries; /* borrowed from ctx until its next query */
    size_t nentries;
    const char *tier_names[KVR_TIER_MAX]; /* names of tier ids in use (NULL = unused) */
    const uint64_t *hashes; /* want_hashes: query_blocks content hashes (kvr_hash_blocks,
                             * extra keys folded), borrowed from ctx until its next query;
                             * else NULL */
};

/* 0, or -E2BIG when ntokens > the ctx's max_tokens. Unknown model/LoRA/pods → 0 with no
 * entries. Observes latency, query blocks and matched fraction histograms. */
int kvr_score_query(struct kvr_score_ctx *c, const struct kvr_score_query *q,
                    struct kvr_score_result *res);

void kvr_score_metrics(struct kvr_score *s, struct kvr_buf *out);

#endif
