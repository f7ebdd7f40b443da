/* modelfilter.h — which models this instance holds: [events] models, a space-separated list
 * of glob patterns over the model name of an event topic (kv@<pod>@<model>) or of a query.
 * Partitions a fleet by model across kvrouterd instances (docs/scaling.md): the subscriber
 * skips the events of models it does not hold, the HTTP API answers 404 for them.
 *
 * Patterns: `*` (any run of bytes, '/' included, so "Qwen/" followed by `*` holds every
 * Qwen model), `?` (one byte),
 * `[abc]`, `[a-z]`, `[!a-z]` or `[^a-z]` (one byte in / not in the set), `\c` (c itself).
 * Matching is byte-wise and case-sensitive, over the whole name. A list that is empty (or
 * only spaces) holds every model; a filter is then "inactive".
 *
 * Threads: kvr_modelfilter_check is a pure function. A filter is created and changed
 * (kvr_modelfilter_set, SIGHUP) by one thread at a time; holds/active/text/gen may be called
 * from any thread meanwhile: they see the old list or the new one, never a mix, and a list
 * once published is never freed before kvr_modelfilter_destroy (a reload keeps the previous
 * list: a few bytes per reload that changed it).
 */
#ifndef KVR_MODELFILTER_H
#define KVR_MODELFILTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define KVR_MODELFILTER_MAX_PATTERNS 64
#define KVR_MODELFILTER_MAX_PATTERN 255 /* bytes of one pattern */

struct kvr_modelfilter;

/* Validates a list: 0, or -EINVAL with err naming the bad pattern and why (an unterminated
 * '[' set, an empty set, a trailing '\', a pattern longer than KVR_MODELFILTER_MAX_PATTERN,
 * more than KVR_MODELFILTER_MAX_PATTERNS patterns, a control byte). NULL/"" is valid. */
int kvr_modelfilter_check(const char *list, struct kvr_err *err);

/* A filter holding list's models (checked as above). 0, -EINVAL (err set) or -ENOMEM. */
int kvr_modelfilter_create(const char *list, struct kvr_modelfilter **out, struct kvr_err *err);
/* Replaces the list (checked as above); on an error the previous list stays. The
 * generation (kvr_modelfilter_gen) is bumped on every successful call. */
int kvr_modelfilter_set(struct kvr_modelfilter *f, const char *list, struct kvr_err *err);
void kvr_modelfilter_destroy(struct kvr_modelfilter *f);

/* True when the model (len bytes, no NUL needed) matches a pattern, or when the filter is
 * NULL or inactive. Any thread. */
bool kvr_modelfilter_holds(const struct kvr_modelfilter *f, const char *model, size_t len);
/* A non-empty list is in force (NULL: false). Any thread. */
bool kvr_modelfilter_active(const struct kvr_modelfilter *f);
/* The list in force, as configured (whitespace collapsed to single spaces; "" when
 * inactive); valid until destroy. Any thread. */
const char *kvr_modelfilter_text(const struct kvr_modelfilter *f);
/* Bumped by every kvr_modelfilter_set: a cache of verdicts keyed by it knows when to look
 * again. Any thread (NULL: 0). */
uint32_t kvr_modelfilter_gen(const struct kvr_modelfilter *f);

/* One glob pattern against a name (both with lengths). Exposed for the tests. */
bool kvr_modelfilter_glob(const char *pat, size_t plen, const char *s, size_t slen);

#endif
