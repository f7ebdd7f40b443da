/* assume.h — the assumed store of approximate mode: which prompt-prefix blocks kvrouterd
 * assumes a worker holds because it routed requests there, for engines that publish no KV
 * events (SGLang or TRT-LLM without events, vLLM with events off).
 *
 * Why a module: an assumption is a guess, so unlike an event-fed entry it must age out. Each
 * assumed block carries the time it was last routed to; blocks older than [route]
 * assumed_ttl expire, and a worker keeps at most [route] assumed_max_blocks of them (least
 * recently routed first out, as an engine's own LRU would evict). This store only keeps
 * that bookkeeping; the ingest writer that owns the worker mirrors every change into the
 * index's "assumed" tier, so scoring needs nothing new.
 *
 * Keys: a chain of 64-bit keys, key[i] naming the prefix that ends at block i (the caller
 * derives them from the blocks' content hashes). A request assumes the whole chain from
 * block 0, and the store touches it from its last block back to block 0, so a block is always
 * at least as recent as any of its descendants and eviction or expiry takes leaves before
 * their ancestors: the assumed blocks of a worker never have holes (every held key's parent
 * is held), which is what lets kvr_assume_touch report the new blocks as one suffix.
 *
 * Predicted mode (ingest_assume.c, [route] predicted_ttl) uses a second store the same way
 * for workers that do publish events, and drops a block from it when the worker's events
 * confirm it (kvr_assume_confirm): that block and its ancestors go, its descendants stay. So
 * a store that was confirmed into may hold a chain's later blocks without its first ones
 * (never the other way round: the gaps are where the events took over).
 *
 * Threads: none of its own; one store per writer thread, used by that thread only. Pure: no
 * clock (times are passed in, non-decreasing), no I/O. Errors: negative errno.
 */
#ifndef KVR_ASSUME_H
#define KVR_ASSUME_H

#include <stddef.h>
#include <stdint.h>

struct kvr_assume;

int kvr_assume_create(struct kvr_assume **out);
void kvr_assume_destroy(struct kvr_assume *a);

/* Assumes the chain keys[0..n) for worker wid at time now_ms (never earlier than a previous
 * call's). n is first cut to max_blocks (>= 1): blocks past a worker's cap are never
 * assumed. Keys already held are refreshed; *first_new is the first key that was not held
 * (n when all were): keys[*first_new..n) are the new ones (no holes, see above) unless
 * kvr_assume_confirm dropped some: then the caller asks kvr_assume_holds first. Does not
 * evict: kvr_assume_evict does, after the caller stored the new blocks. Returns the number
 * of keys assumed (the cut n), or -ENOMEM (nothing changed). */
int kvr_assume_touch(struct kvr_assume *a, uint32_t wid, const uint64_t *keys, size_t n,
                     int64_t now_ms, uint32_t max_blocks, size_t *first_new);

/* Pops worker wid's least recently touched keys while it holds more than max_blocks, at
 * most cap of them, into out; returns how many. */
size_t kvr_assume_evict(struct kvr_assume *a, uint32_t wid, uint32_t max_blocks, uint64_t *out,
                        size_t cap);

/* One assumption: a worker and a block's key. */
struct kvr_assume_pair {
    uint64_t key;
    uint32_t wid;
};

/* Pops the assumptions of any worker last touched before before_ms, oldest first, at most
 * cap of them, into out; returns how many (0: none is that old). */
size_t kvr_assume_expire(struct kvr_assume *a, int64_t before_ms, struct kvr_assume_pair *out,
                         size_t cap);

/* The last-touch time of the oldest assumption held, or INT64_MAX when none is. */
int64_t kvr_assume_oldest(const struct kvr_assume *a);

/* The worker's events stored key: drops it and then its ancestors (the keys before it in
 * the chain it was last touched in) while they are held, at most cap keys, into out;
 * returns how many (0: key was not held). */
size_t kvr_assume_confirm(struct kvr_assume *a, uint32_t wid, uint64_t key, uint64_t *out,
                          size_t cap);

/* Forgets every assumption of worker wid (the caller drops them from the index); returns
 * how many there were. */
size_t kvr_assume_drop_worker(struct kvr_assume *a, uint32_t wid);

/* Keys worker wid holds; keys held in all. */
size_t kvr_assume_worker_count(const struct kvr_assume *a, uint32_t wid);
size_t kvr_assume_count(const struct kvr_assume *a);
/* Whether worker wid holds key. */
int kvr_assume_holds(const struct kvr_assume *a, uint32_t wid, uint64_t key);
/* Bytes the store has allocated. */
size_t kvr_assume_bytes(const struct kvr_assume *a);

#endif
