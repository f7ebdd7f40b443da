/* index.h — the positional index: which holder has which prompt-prefix block.
 *
 * Keys are (position, content hash); each entry is tagged with the router's chain hash of the
 * whole prefix ending at it and holds the set of holders that have it. A holder is
 * (worker, tier); a worker is (pod, dp_rank) interned to a dense id. The engine's block hash
 * is only the key of a per-holder reverse map used by removals and parent lookups.
 *
 * Threads:
 * - Write operations (store/remove/clear/purge_worker) for one worker must come from one
 *   thread at a time: the ingest writer thread that owns the worker's pod (sticky sharding).
 *   Different writers may write different workers concurrently.
 * - Interning (namespaces, workers, tiers) may be called from any thread.
 * - Readers (kvr_index_find through a per-thread struct kvr_index_reader, and the stats and
 *   lookup getters) run concurrently with writers; they never wait behind a lock held for
 *   more than one entry update and make no heap allocation. The scheme is described in
 *   src/index/index_int.h (CONCURRENCY), the module's map in src/index/index.c.
 *
 * Errors: negative errno (-EINVAL bad argument, -ENOMEM, -ENOSPC a configured limit).
 */
#ifndef KVR_INDEX_H
#define KVR_INDEX_H

#include "core/base.h" /* KVR_NAME_MAX */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_TIER_MAX 8     /* 0 gpu, 1 cpu, 2 storage, 3.. interned by name */
#define KVR_TIER_GPU 0
#define KVR_TIER_CPU 1
#define KVR_TIER_STORAGE 2

struct kvr_index;
struct kvr_index_reader;

struct kvr_index_opts {
    uint32_t jump_stride;     /* find's jump length (widened so a query takes at most 32
                               * landings); default 32; never changes an answer */
    uint32_t max_workers;     /* default 16384 */
    uint32_t orphan_capacity; /* blocks held while their parent is unknown; 0 = drop them */
    uint32_t max_query_blocks; /* readers' scratch size; default 65536 */
};

int kvr_index_create(const struct kvr_index_opts *opts, struct kvr_index **out);
void kvr_index_destroy(struct kvr_index *ix);

/* ---- interning (any thread) ---------------------------------------------------------- */

/* Namespace = (model, lora_name). lora may be NULL. *ns is dense (0, 1, ...). seed is the
 * kvr_hash_ns_seed() of the pair, for content hashing. */
int kvr_index_ns_intern(struct kvr_index *ix, const char *model, const char *lora, uint32_t *ns,
                        uint64_t *seed);
/* Reader-safe lookup; -ENOENT when never interned. */
int kvr_index_ns_lookup(struct kvr_index *ix, const char *model, const char *lora, uint32_t *ns,
                        uint64_t *seed);
/* Block size of a namespace's model, learned from events (0 = not known yet). The setter is
 * called by ingest when an event carries block_size; readers see it atomically. */
void kvr_index_ns_set_block_size(struct kvr_index *ix, uint32_t ns, uint32_t block_size);
uint32_t kvr_index_ns_block_size(struct kvr_index *ix, uint32_t ns);

/* Worker = (pod, dp_rank). -ENOSPC when max_workers workers are interned (forgotten ones do
 * not count: their ids are reused, after a grace period the call waits out if it must). */
int kvr_index_worker_intern(struct kvr_index *ix, const char *pod, uint32_t dp_rank,
                            uint32_t *wid);
int kvr_index_worker_lookup(struct kvr_index *ix, const char *pod, uint32_t dp_rank,
                            uint32_t *wid);
/* Pods are interned with their workers; pod ids are dense too (for find's pod filter). */
int kvr_index_pod_lookup(struct kvr_index *ix, const char *pod, uint32_t *pod_id);
/* Borrowed; stable until the worker's pod is forgotten (kvr_index_pod_forget), so only the
 * pod's writer thread (or a caller that knows the pod is not forgotten meanwhile) may keep
 * it. Readers name hits from kvr_index_hit.pod instead. NULL for a free id. */
const char *kvr_index_worker_pod(const struct kvr_index *ix, uint32_t wid);
uint32_t kvr_index_worker_rank(const struct kvr_index *ix, uint32_t wid);
uint32_t kvr_index_worker_pod_id(const struct kvr_index *ix, uint32_t wid);
/* Upper bound of worker ids in use (ids are < it; some may be free). */
uint32_t kvr_index_worker_count(const struct kvr_index *ix);
/* Workers interned now. */
uint32_t kvr_index_worker_live(const struct kvr_index *ix);
/* Workers of a pod (any thread): fills up to cap ids, returns the total count. */
size_t kvr_index_pod_workers(struct kvr_index *ix, uint32_t pod_id, uint32_t *wids, size_t cap);

/* Tier from an event's `medium`: case-insensitive; NULL/empty → gpu; "cpu"; "storage";
 * other names interned (lower-cased) up to KVR_TIER_MAX, then -ENOSPC. */
int kvr_index_tier_intern(struct kvr_index *ix, const char *medium, size_t len, uint8_t *tier);
const char *kvr_index_tier_name(const struct kvr_index *ix, uint8_t tier); /* NULL if unused */
uint8_t kvr_index_tier_count(const struct kvr_index *ix);

/* ---- writes (the worker's owning writer thread) --------------------------------------- */

struct kvr_index_block {
    uint64_t engine_hash;  /* the engine's block hash (only a removal/parent key) */
    uint64_t content_hash; /* kvr_hash_block(ns seed, block tokens) */
};

/* What one write did; counters are added to (caller zeroes). */
struct kvr_index_wres {
    uint64_t stored;          /* new (holder, block) pairs indexed */
    uint64_t duplicates;      /* stores of an engine hash the holder already had (refcounted) */
    uint64_t orphaned;        /* blocks parked because their parent was unknown */
    uint64_t orphans_adopted; /* parked blocks indexed when their parent arrived */
    uint64_t orphans_dropped; /* parked blocks evicted (capacity) or dropped */
    uint64_t removed;         /* (holder, block) pairs whose last copy was removed */
    uint64_t unknown_removes; /* removal of an engine hash the holder does not have */
    uint64_t cleared;         /* (holder, block) pairs dropped by clear/purge */
};

/* Stores blocks[0..n) as a chain: blocks[0]'s parent is *parent (NULL = none → position 0),
 * each next block's parent is the previous one. A parent unknown to the worker never leads
 * to a guessed position (see index_write.c for the orphan policy). */
int kvr_index_store(struct kvr_index *ix, uint32_t wid, uint8_t tier, uint32_t ns,
                    const uint64_t *parent, const struct kvr_index_block *blocks, size_t n,
                    struct kvr_index_wres *res);

/* Removes one copy of each engine hash for the holder; every hash is processed, unknown ones
 * counted in res->unknown_removes and skipped. */
int kvr_index_remove(struct kvr_index *ix, uint32_t wid, uint8_t tier, const uint64_t *hashes,
                     size_t n, struct kvr_index_wres *res);

/* Copies of an engine hash the holder (wid, tier) has now (0: none). For a producer's
 * authoritative remaining count (remaining_copy_counts): the caller removes the difference
 * with kvr_index_remove. Same thread rule as store. */
uint32_t kvr_index_copies(struct kvr_index *ix, uint32_t wid, uint8_t tier, uint64_t hash);

/* The router's chain hash of the block the holder (wid, tier) stores under engine hash
 * `hash` (0, or -ENOENT when it has none): the key predicted entries are kept under, so the
 * worker's events can confirm them. Same thread rule as store. */
int kvr_index_chain_of(struct kvr_index *ix, uint32_t wid, uint8_t tier, uint64_t hash,
                       uint64_t *chain);
/* The chain hash a namespace's prefixes start from: chain[0] = kvr_hash_chain(root,
 * content[0]), chain[i] = kvr_hash_chain(chain[i-1], content[i]) (pure; any thread). */
uint64_t kvr_index_chain_root(uint32_t ns);

/* AllBlocksCleared: drops the worker's blocks in one tier, or all tiers with tier < 0.
 * Cost proportional to that worker's blocks. */
int kvr_index_clear(struct kvr_index *ix, uint32_t wid, int tier, struct kvr_index_wres *res);

/* Purge: clear(wid, all tiers) for every rank of the pod. Same thread rule (all workers of a
 * pod belong to one writer). */
int kvr_index_purge_pod(struct kvr_index *ix, uint32_t pod_id, struct kvr_index_wres *res);

/* Forget: clears every worker of the pod (as purge, counted in res->cleared) and frees their
 * worker ids, the pod id and the interning keys: lookups of the pod and its workers answer
 * -ENOENT, kvr_index_stats' workers drops, and a later intern of the same (pod, rank) gets a
 * fresh id. The ids are reused by later interns only after a grace period (no reader still in
 * a find that began before the forget), so a concurrent find reports the forgotten workers'
 * blocks under their own name or not at all, never under another pod's. Same thread rule as
 * purge (the pod's writer thread); afterwards the caller must drop every wid and pod id of
 * the pod it kept. -ENOENT when pod_id is not an interned pod. Design: index_intern.c. */
int kvr_index_pod_forget(struct kvr_index *ix, uint32_t pod_id, struct kvr_index_wres *res);
/* Workers forgotten and workers refused (-ENOSPC: max_workers interned) so far. */
void kvr_index_forget_stats(struct kvr_index *ix, uint64_t *forgotten, uint64_t *refused);

/* ---- reads (any reader thread with its own reader) ------------------------------------ */

/* A reader holds the per-thread scratch of find (no allocation per query) and the thread's
 * registration for safe memory reclamation. One per thread; not shared. */
int kvr_index_reader_create(struct kvr_index *ix, struct kvr_index_reader **out);
void kvr_index_reader_destroy(struct kvr_index_reader *r);

/* Tiers (a bit per tier id) whose holdings count in a hit's matched but not in its
 * matched_base: predicted entries, a guess next to what the events said. Default none. */
void kvr_index_reader_aside(struct kvr_index_reader *r, uint32_t tier_mask);

struct kvr_index_hit {
    uint32_t wid;
    uint32_t dp_rank;
    const char *pod; /* the worker's pod, read inside the find (a copy owned by the reader) */
    uint32_t matched;                    /* exact longest prefix held, any tier */
    uint32_t matched_base;               /* longest prefix held in the tiers not set aside
                                          * (kvr_index_reader_aside); = matched without */
    uint32_t tier_matched[KVR_TIER_MAX]; /* longest prefix held in that tier alone */
    double score; /* sum over blocks [0, matched) of the best weight among tiers holding it */
};

/* Scores content hashes q[0..n) of namespace ns: for every worker with matched >= 1, one hit
 * (named by pod and dp_rank: use these, not a lookup of wid after the call, which may have
 * been forgotten and reused since).
 * pod_ids (npods > 0) restricts the answer to workers of those pods. weights[t] is the weight
 * of tier t for score. Hits are in ascending wid order, borrowed from the reader until its
 * next call. n > opts.max_query_blocks → -E2BIG. The names are the reader's own copies,
 * made once per worker (and again after its id was forgotten and reused): -ENOMEM if such a
 * copy cannot be allocated. */
int kvr_index_find(struct kvr_index_reader *r, uint32_t ns, const uint64_t *q, size_t n,
                   const uint32_t *pod_ids, size_t npods, const double weights[KVR_TIER_MAX],
                   const struct kvr_index_hit **hits, size_t *nhits);

/* ---- statistics (any thread) ----------------------------------------------------------- */

struct kvr_index_stats {
    uint64_t entries;  /* (position, content hash) entries */
    uint64_t holders;  /* (holder, entry) pairs */
    uint64_t bytes;    /* bytes in use, from the allocator's own figures */
    uint64_t workers;
    uint64_t namespaces;
    uint64_t orphans;  /* blocks parked waiting for a parent */
};
void kvr_index_stats(struct kvr_index *ix, struct kvr_index_stats *st);
/* kvr_index_stats' bytes alone, cheap enough to ask before every store (sums only the epoch
 * slots ever used, not all of them): the memory cap's ([index] max_memory) figure. */
uint64_t kvr_index_bytes(const struct kvr_index *ix);

/* Blocks the worker holds parked as orphans (their parent unknown): while > 0 the index is
 * incomplete for it. 0 for a free id. */
uint32_t kvr_index_worker_orphans(const struct kvr_index *ix, uint32_t wid);

/* Blocks a worker holds per tier (distinct engine hashes, duplicates counted once). */
void kvr_index_worker_blocks(struct kvr_index *ix, uint32_t wid, uint64_t blocks[KVR_TIER_MAX]);

/* ---- snapshots (index_dump.c) ---------------------------------------------------------- */

struct kvr_buf;

/* Namespaces are ids 0..count-1 in interning order; an entry's chain hash depends on its
 * namespace id (ns_root), so a restore interns them in the same order into an empty index
 * first. Any thread. */
uint32_t kvr_index_ns_count(const struct kvr_index *ix);
/* The names a namespace was interned with (borrowed, stable for the index's life; lora NULL
 * when none). -ENOENT for an id not interned. Any thread. */
int kvr_index_ns_names(const struct kvr_index *ix, uint32_t ns, const char **model,
                       const char **lora);
/* Appends to out a self-delimiting, versioned blob of worker wid's state: its entries (chain,
 * parent: root with its namespace, another entry of the blob or an explicit parent chain),
 * per entry its records (tier, reverse-map key = the bijective mix of the engine hash,
 * copies incl. those beyond 0xffff; several records of one tier for an entry are its
 * aliases) and its parked orphans in FIFO order (engine hash, content, parent engine hash,
 * namespace, tier). Hole counts and child counts are not stored: restore recomputes them.
 * Format: docs/index.md, "Dump format" (its first 9 bytes are a version byte and the u64 LE
 * length of the rest, so a reader finds its end unparsed). The worker's writer thread (or no
 * writer running); readers may run. -ENOENT free id, -ENOMEM (out->oom set, or a scratch
 * allocation). */
int kvr_index_worker_dump(struct kvr_index *ix, uint32_t wid, struct kvr_buf *out);
/* Restores such a blob into worker wid, which must hold nothing yet (fresh intern; -EBUSY
 * otherwise, -ENOENT free id). Untrusted bytes: the whole blob is validated before anything
 * changes (-EINVAL, nothing changed: bad structure or version, trailing bytes, out-of-range
 * references, duplicate entries or records, a namespace or tier id not interned, an orphan
 * whose parent the blob holds), but for an entry whose chain another worker's entry has with
 * another parent or position: found while applying (one table probe an entry, not two), it
 * withdraws what was applied (-EINVAL, the worker holds nothing again; readers may have seen
 * part of it meanwhile). -ENOMEM may leave part restored (the caller then drops the whole
 * index). More
 * orphans than opts.orphan_capacity: the oldest are dropped (res->orphans_dropped), as a
 * store parking them would. res counts what was restored: stored (holder, block) pairs
 * (distinct engine hashes), orphaned (parked blocks). Same thread rule as store. */
int kvr_index_worker_restore(struct kvr_index *ix, uint32_t wid, const void *blob, size_t len,
                             struct kvr_index_wres *res);

#endif
