/* index.c — the positional index (see index.h for the contract).
 *
 * DATA
 * - Entry (struct node, 32 bytes, from a slab): key = the chain hash alone (the namespace is
 *   folded into the chain's root, see ns_root; the position into the chain itself; a flag
 *   marks position 0), the parent's chain hash and the sorted set of holders that have it.
 *   A holder id is wid << 3 | tier, so the set sorted by id groups a worker's tiers
 *   together. One holder is stored inline in the node (holder | nchild << 32); two or more
 *   live in a separately allocated array (struct hset) that grows and shrinks by halves (a
 *   system-prompt block held by 16k holders costs 8 bytes a holder, a private block nothing
 *   beyond the node): the sorted holder ids first, their nchild in a parallel array behind
 *   them, so find compares and copies holder runs with memcmp/memcpy. nchild counts the
 *   children of this entry that the same holder holds (holes, below).
 *   kvr_index_stats' "entries" counts these (namespace, position, chain) entries.
 * - Node slab: 2 MB aligned chunks, each an anonymous mapping advised MADV_HUGEPAGE (a
 *   node's chunk is its address rounded down), each with a free list, a bump index and a
 *   live count, under one spinlock; writers take a run of up to 256 never-used nodes of a
 *   chunk's bump area (two pointers in their slot), or when the chunk has a free list a batch
 *   of 64 from it, and give back the unused and the reclaimed ones when the call ends (an
 *   unused run still at its chunk's bump end in one step). A chunk is unmapped when
 *   its last node comes back, except one emptied chunk kept as a spare (counted in bytes).
 * - Main table: 1024 shards by the key hash's low bits, each an open-addressing table
 *   (linear probing, max load 3/4) of 8-byte slots: node pointer | 16-bit tag << 48, 0 empty,
 *   1 tombstone. A slot's home is the hash's top bits and its tag the top 16 bits, so a
 *   rebuild of up to 2^16 slots places entries from their tags without touching nodes.
 *   Writers take the table's mask and shift from the shard (copies kept under its lock, in
 *   the lock's cache line), not from the table header (another miss per entry created or
 *   deleted: store and remove p50 ~3 us faster).
 *   Unlinking before an empty slot clears the tombstones behind it. Nodes never move, so
 *   readers and the reverse maps keep plain pointers.
 * - Per holder (worker, tier), writer-private: recs, the reverse map engine hash -> node
 *   pointer | copies << 48 (16 bytes a block, stored under mix64 of the engine hash, a
 *   bijection, so a rehash reads homes off the stored keys; copies past 65535 overflow
 *   into `extra`, keyed the same way), open addressing over any capacity (doubles, max
 *   load 7/8 counting tombstones: a deletion
 *   leaves a tombstone, nothing moves, or before an empty slot empties its slot and the
 *   tombstones just before it; an insertion takes the first tombstone of its probe run; a
 *   rehash clears them); absent, chain-keyed counts
 *   of held children whose parent entry the holder does not hold; alias, extra engine hashes
 *   that map to an entry the holder already holds (vLLM cache_salt / multimodal blocks: same
 *   tokens, different engine hash). Membership of a holder in an entry = 1 + alias count; it
 *   ends with the last engine hash. A holder's fixed record (~100 bytes) stays once used.
 * - The chain hash is never the engine's hash: store computes chain = kvr_hash_chain(parent
 *   entry's chain, content) with the parent found through the engine hash (same holder first,
 *   then the worker's other tiers, which share engine hashes for the same content chain).
 *
 * HOLES AND EXACT JUMP SEARCH
 * holes(H) = number of entries H holds at position > 0 whose parent entry H does not hold.
 * Kept exact: gaining an entry E moves absent[E] into E's nchild (those children stop being
 * holes) and bumps the parent's nchild or absent[parent]; losing E does the reverse. (Along
 * a stored chain the next block's membership is counted in the new entry's nchild when it
 * is created and withdrawn if that block turns out to be a duplicate: one lock less. A
 * remove walking a chain tail first defers the decrement of the parent's nchild to the
 * parent's own removal, which is the next one: see hole_lose.)
 * Lemma: if holes(H) == 0 and H holds the entry at position L with the query's chain hash,
 * then H holds the entry of every position <= L of the query (its parent is held and has
 * chain[L-1] — equal chain hashes mean equal prefixes, 2^-64 bounds — by induction).
 * So for a hole-free holder the positions of the query it holds are exactly [0, tm): find
 * looks only at jump landings (every jump_stride blocks, at most LAND_MAX = 32 of them: a
 * longer query gets them further apart, so its cost does not grow with its length by the
 * landing; chains computed 8 landings at a time: each stride's content sum by its own
 * Horner chain, 8 interleaved, then one multiply-add per landing; table slots and nodes
 * prefetched a few landings ahead); a landing whose holder set equals the alive set
 * (compared in place, one memcmp) costs one pass; holders missing at a landing are
 * bisected within the stride behind it, split into groups by each probe (a probe whose set
 * equals the set at the group's lower bound, unchanged since the group was seen there by
 * its seqlock sequence, or the set at its upper bound, moves the whole group; a probe 64+
 * blocks from the group's lower bound gets its chain by the interleaved sums, a nearer one
 * block by block from the nearest known chain). A landing that keeps few of many alive
 * holders (16x fewer: a shared prefix ends) finds them by binary search in the alive ids
 * and drops the runs between them whole. The last
 * block is looked at early (after LAST_AT landings with nobody gone, or at the first
 * landing where some stopped and others go on, when LAST_MIN landings or more remain): all
 * the landing chains are computed then, the last block's lookup is staged over the next
 * landings like a landing's, and if its holder set equals the alive set (one memcmp) they
 * all hold the whole query and the landings stop (one long match among shorter shared ones
 * no longer walks the landings to the end). A
 * worker is "fast" when all its holders are hole-free (a dense per-worker counter says so):
 * matched = max tm over its tiers, and the score follows from the tm values. Any other
 * worker is scanned position by position (exact, slower). No "same count means same set"
 * shortcut anywhere: sets are compared or intersected. The usual answer (no pod filter,
 * workers with one hole-free holder each) is a leading run of position 0's holder set:
 * classified by one check per holder and written out by a straight loop; the rest goes
 * through the general per-worker classification and output.
 * Where find's time goes (rdtsc split, 976 x 1024 bench, 112 hits): ~100 ticks a landing
 * (~25 when cached); the full hit walks 9 landings to where the shared prefix ends, bisects
 * it (~0.9K ticks, dependent misses), and the last block's look ends it 3 landings later
 * (~1.4 µs in all; before the look it walked all 32 landings, ~2.4 µs); the half hit walks
 * 17 landings and bisects twice, and pays ~0.2 µs for the look that fails (the chains of
 * the last 8 landings, the last block's lookup). At 4096 workers (1024 hits)
 * classification + output are ~7K of ~16K ticks. The Mooncake trace's queries (957 blocks
 * on average, p99 4153, max 11961; no worker with holes: find_slow never runs) walked up
 * to n/32 landings (374) before the landing cap; its hash-assigned queries are mostly
 * full hits of one worker, which the look now ends after ~7 landings. What remains slow
 * in the round-robin run (4-13 holders): queries of 3.5K-12K blocks with 1-4 groups to
 * bisect in 100-375-block strides (~2.9K ticks a group) and their chains (~0.85 tick a
 * block). Split further (rdtsc, the 208 round-robin queries of 3K+ blocks, quiescent): in
 * 193 of them the look at the last block fails, yet the longest holder (the worker that
 * served the request) matches ~97% of the query on average, so the chains are needed that
 * far anyway; per query ~27K ticks = chains ~14K + bisection ~5K (2 groups) + landings and
 * the rest ~8K. The chains' 14K is mostly the bench reading the query cold from its 30 MB
 * array: a plain sum over the same query costs 3.0 ticks a block, find's chains over a
 * query in cache ~0.9 (~4.7K of ~17K ticks). bench_index's "query in cache" line (odd
 * queries copied to a buffer first, as the request parser leaves them) shows find's own
 * work: round-robin p99 ~7-9.5 us in cache vs ~11-13 cold; by hash ~2.6-3.0 vs 5.2-6.3.
 * Concurrent runs add interference that is not find's work: finds that stop at
 * block 0 took 8-20 µs at times (the writer's frees unmap memory: ~600 TLB-shootdown
 * interrupts a run on the reader's core, /proc/interrupts), and 13 finds in ~190K waited
 * milliseconds on a node lock held by a writer that was not running (1.47M spins).
 * Measured and dropped (find): 512-bit vpmullq content sums (p50 -0.05 µs, Dynamo full hit
 * p99 2.0 -> 3.4 µs: the frequency licence), 256-bit vpmullq sums for strides of 64+ (no
 * change on 8192-block queries), software prefetch of the query's content in the chain
 * loops (no change), a level deeper prefetch in wide bisections (no change), the common-run
 * classification 8 holders at a time branch-free (4096 workers: +0.2 µs), a reader that
 * yields after 64 spins on a held node (not measurable in the noise of the concurrent run).
 * Measured and dropped (round-robin trace, long queries): a fan-out bisection for strides
 * of 64+ (7 or 15 probes a round, all slots prefetched, then all nodes, then all looked up
 * with their holder arrays prefetched, members split into the parts between probes; also
 * 3 probes, and rounds down to 8-wide parts): bisection ticks per 3K+ query 5.0-5.5K ->
 * 5.3-7.6K, not fewer; after a failed look at the last block with strides of 64+,
 * bisecting all of (prev landing, last] at once instead of walking the rest of the
 * landings (landing chains reused as bisection starts): in-cache p99 7.3-9.2 -> 10.8 us;
 * a software prefetch 64 or 192 blocks ahead in each of chain_land8's 8 streams (chains
 * over cold queries ~-10%, within the noise); at most 16 or 24 landings for queries of
 * 2K+ blocks (3 interleaved runs each on a loaded machine: no difference out of the noise).
 * Measured and dropped: breadth-first search rounds instead of the per-group bisection
 * (every open group probed at up to 3..64 points a round, all groups' probes of a round
 * looked up together, first round 16 probes over the whole query): Dynamo full hit 2.5 ->
 * 2.5-3.3 µs, half hit 1.95 -> 2.3-3.4 (a round exposes slot, node and holder-array
 * latency in full where the bisection overlaps the landing pipeline, and big holder sets
 * are read at more probes); longer landing prefetch distances (16/8/4 and more: slower), no
 * node stage (slower), prefetching every table slot of a bisected stride, or the children's
 * nodes and grandchildren's slots at each probe (both slower: the node stage's slot loads
 * stall), tab_find inlined into the landing loop (no change); in store/remove, inlining
 * node_lock/cmap_get/holes_add/prov_cancel (-0.6%/-1.7% instructions, remove 20% slower),
 * a 16/32-block store look-ahead (no change), glibc THP/mmap-threshold tunables (no change
 * at p50). jump_stride 64 (KVR_BENCH_STRIDE=64) gives find full hit ~1.97 µs, half ~2.3.
 *
 * STORE AND REMOVE FAST PATHS
 * store looks ST_AHEAD blocks ahead computing each block's chain (assuming the chain
 * continues), key hash and reverse-map key and home into a ring, prefetching the table and
 * map slots; a block whose real parent differs (after a duplicate) restarts the look-ahead.
 * store_fast then does the usual block in one pass from the ring (new engine hash, the
 * previous block's entry counted it provisionally or position 0, no absent children, no
 * parked blocks, a table and map with room): one probe of each map, one shard lock, join or
 * create, counters accumulated and published once per call. remove works in windows of
 * RM_WIN blocks, each in stages that put all their misses in flight before the next stage
 * needs them (reverse-map homes, records and their nodes, the nodes' table slots), then
 * removes the blocks in order; unstore_fast deletes the usual block (last copy, no alias,
 * the entry held by this holder alone) in one critical section and leaves a tombstone in
 * the reverse map (the backward-shift deletion it replaced was ~110 instructions a block
 * at 7/8 load). Both check everything before changing anything and leave all other cases
 * to the general store_one/unstore, so results are identical. Node runs from the slab
 * (DATA), the uncontended node lock inline and hole_lose's usual case (the parent is the
 * next block removed) inline in unstore_fast trim both.
 * Measured (976 x 1024, 128 workers): callgrind instructions a block, store 465 -> 410,
 * remove 560 -> 393; wall p50 store ~95 -> ~75 us, remove ~100 -> ~55 us. Where the
 * store's time goes now: growth, not the per-block path. With the reverse maps and the
 * shard tables pre-sized (an experiment, not a policy: memory must follow contents) the
 * store p50 is ~46 us; the reverse maps' doublings cost ~18 us of the p50 (half the calls
 * double one), the shard tables' ~14 us (~7 rebuilds a call). The floor of this work
 * (bench/bench_floor.c, in make bench: chain multiply-add, one insert into a 2M-slot table
 * with prefetch, a 32-byte node from a bump allocator, one insert into the holder's
 * reverse map, nothing else) runs 34-38 us per 1024 blocks pre-sized and 77-82 us growing
 * as the index grows (the index: 75-79 us from empty); at the Mooncake trace's size (4M
 * pairs, 256 holders) 43-46 ns a block pre-sized. So a 20 us store cannot come from
 * tuning this design (one table entry and one reverse-map record a block).
 * Steady-state trace (bench_index's trace passes 3-4, round-robin: every LRU full, a store
 * and a remove per block, 315 MB index): ~7.2-7.9 M block-ops/s, writer CPU all user time;
 * callgrind ~460 instructions a stored block and ~390 a removed one (as in the 976 x 1024
 * shape), so the trace's ~2x higher cost a block is stalls: perf puts the store's samples
 * on the reverse-map probe (~22%), the software prefetches (~14%: fill buffers full), the
 * table slot (~14%) and the shard lock's cmpxchg (~9%). Store look-ahead 8, 16 or 32
 * blocks: no difference (interleaved runs). A staged look-ahead like remove's (home slot
 * read 4 blocks ahead and its node prefetched for writing, the node's holder array 2
 * ahead): slower (3 interleaved runs: store from empty p50 77 -> 87 us, round-robin steady
 * writer user time 2.8 -> 3.0 s), dropped. Nor are the locks the cost: with the shard,
 * slab and node locks made plain stores (an experiment valid only for one writer thread)
 * the round-robin steady writer user time was 2.68-2.77 s against 2.76-2.86 s, store and
 * remove p50 within noise (3 interleaved runs). Pass 1 (from empty) swings 3-10 M block-ops/s
 * with the kernel's first touch of the memory (writer system time 30-560 ms a pass on
 * this VM), with or without MADV_HUGEPAGE on the node chunks.
 * Steady state (churn: remove a sequence, store it again, in the full index): a store
 * first left its records in the empty slot ending each probe run, so every remove + store
 * left ~1K more tombstones and the store's up-front reservation (records + tombstones)
 * then doubled the holder's map (125 doublings in 512 churn ops, 77M cycles: the p99). Now
 * store_fast and recmap_slot take the first tombstone of the run (a block stored again
 * finds its own), the reservation grows only for records (tombstones alone never
 * rehash: an insertion that finds neither a tombstone nor room does) and a deletion before
 * an empty slot clears tombstones in place: no rehash at all in steady state. Measured
 * (same runs, medians of 3): steady store avg 140 -> 80 us, p50 86 -> 76, p99 404 -> 145;
 * steady remove p50 64 -> 70 (the maps stay at their load instead of doubling; recmap_del
 * inline, its rarer half out of line, brought it back to ~67); bytes per pair after the
 * 512-op churn 85.3 -> 63.3 (the same as before the churn). store_fast keeps the old
 * shorter probe loop while a map has no tombstones (callgrind, bench/index.sh: store 409
 * instructions a block before this work, 432 with tombstone tracking, 415 with both
 * loops; remove 473 -> 477; store from empty p50 ~81 -> ~78 us).
 * Where the store's tails come from now (rdtsc per call, 976 x 1024 from empty): the p99
 * is the ~12 calls that map a new node chunk: the first touch of a 2 MB transparent huge
 * page costs ~300 us (clearing it) and, with the kernel's THP defrag policy "madvise" on
 * this machine, sometimes ~5 ms (direct compaction). Without MADV_HUGEPAGE the store p99
 * from empty is ~255 us but its p50 ~9 us worse (4 KB faults spread over every call), so
 * huge pages stay. Next come the reverse-map doublings (120-190 us in the calls that do
 * the largest one, ~21 us a call on average) and shard table rebuilds (~10 us a call).
 * Branch totals (tombstone reuse + shard mask copies; 4 interleaved runs, medians, us,
 * avg/p50/p99): store from empty 127/81/350 -> 94/75/340; store steady 143/88/409 ->
 * 76/74/142; remove steady 71/66/150 -> 72/66/142; remove to empty 83/70/219 -> 81/71/194.
 * Trace, round-robin (LRU evictions), M block-ops/s: writer alone 7.8 -> 8.4, with a
 * concurrent reader 6.3 -> 7.5.
 * A reverse-map doubling's array comes from sl_calloc_pop: one madvise(MADV_POPULATE_WRITE)
 * faults its pages instead of a trap per 4 KB page during the rehash (the largest doubling
 * of the bench, to 150 KB, ~120 -> ~60 us in isolation; page faults of the whole bench
 * 16.8K -> 10.0K). Measured (5 interleaved runs, medians, us, avg/p50/p99): store from
 * empty 96.5/73.7/375 -> 88.0/74.8/341, the other lines unchanged within noise (shrinks
 * keep plain calloc: memory malloc reuses has no faults to save). Trace, writer alone, M
 * block-ops/s per core of writer CPU time (5 interleaved runs, medians): hash-assigned 9.3
 * -> 10.7, round-robin 8.4 -> 9.6 (the trace's page faults 367K -> 230K; most left are the
 * bench's own). Own populated mappings for the large arrays did as well for store but cost
 * remove to empty ~5 us avg (munmap of each large array); populating the shard tables'
 * growth too changed nothing. What growth still costs: the kernel clearing the new pages
 * (in the trace ~10% of the writer's profile; unavoidable for memory fresh from the
 * kernel, and calloc clears reused memory just as much) and the rehash loop itself.
 * In steady state nothing grows or rehashes any more (0 reverse-map rehashes, ~0.1 us of
 * shard rebuilds a call); its p99 is mostly noise (the slowest calls differ between runs).
 * Measured and dropped: the remove windows for store (all of a window's slots prefetched,
 * then its blocks: 16 instructions a block fewer but ~8% slower than the rolling
 * look-ahead, also with the next window prefetched while one is stored), ST_AHEAD 12 (no
 * change), a new node chunk populated with MADV_POPULATE_WRITE when mapped (no change,
 * 5 interleaved runs: the same 2 MB clearing in the same call; only a thread outside the
 * writer's calls could take it off a store's time).
 *
 * ORPHANS (store whose parent engine hash the worker does not know in any tier)
 * The blocks are never indexed at a guessed position. Up to opts.orphan_capacity blocks per
 * worker are parked, FIFO, with their parent engine hash (0 = drop them all, counted).
 * Invariant at the end of every call: no parked block's parent is known to the worker. When
 * a store creates an engine hash that a parked block awaits (or parks a block whose parent,
 * an earlier block of the same store, is already known), the parked list is swept in FIFO
 * order, adopting every block whose parent is now known (same tier first, then the other
 * tiers), until a sweep adopts nothing. Parking more than capacity evicts the oldest
 * parked blocks (counted in orphans_dropped); a single store larger than the capacity parks
 * its first blocks and drops the rest. A remove naming a parked block drops it (counted in
 * orphans_dropped); clear/purge drop the worker's parked blocks of the cleared tiers.
 * Duplicate store of an engine hash the holder has: refcounted (copies), its first
 * (position, chain) is kept.
 *
 * CONCURRENCY
 * - Writers: one thread per worker at a time (index.h); different workers' writers run in
 *   parallel and meet on shared entries. A node is locked by its writer-side seqlock (seq
 *   odd = held; CAS from even), held for exactly one entry update. Finding-or-creating an
 *   entry and deleting the last holder take the shard's spinlock (order: shard, then node);
 *   a node is marked dead and unlinked under both, so a node found under the shard lock is
 *   alive. Other updates (holders joining/leaving a shared entry, child counts) take only
 *   the node lock. A shard's mask/shift copies (DATA) are written by tab_publish and read
 *   by writers, both under the shard lock; readers never read them (they use tabw and the
 *   table itself), so the published-table protocol below is unchanged.
 * - Readers never lock: table slots are read with acquire loads (insert publishes a fully
 *   built node with a release store; delete writes a tombstone or, before an empty slot, 0;
 *   growth/shrink builds a new table and publishes its pointer; nothing in a published table
 *   moves), holder sets are read under the node's seqlock; (n, array pointer) are
 *   validated before the array is touched and the array's own capacity bounds the read.
 *   Scalar shared fields are accessed with atomics; holder-id runs are copied/compared with
 *   memcpy/memcmp and validated by the seqlock (in a TSAN build element-wise relaxed
 *   atomics, so TSAN sees no data race).
 * - Memory reclamation: epoch-based (EBR). Every reader and every writer call holds a slot
 *   announcing the global epoch while it may touch shared memory. Unlinked nodes, replaced
 *   holder arrays and replaced tables are retired into the writer slot's list and freed
 *   once the global epoch has advanced twice past their retirement (no thread can still
 *   see them; the list is in retirement order, so what is old enough is a prefix).
 *   Writers try to advance the epoch when leaving a call. Reclaimed nodes go back
 *   to the slab at the end of the call that reclaimed them.
 * - Statistics are per slot (relaxed, owner-written) and summed when read; bytes are
 *   malloc_usable_size() of everything this module allocates (slab chunks as whole 2 MB
 *   mappings, the spare and free nodes included), added at malloc and removed at free
 *   (retired and cached memory counts until it is really freed).
 * - Interning: one mutex for inserts; lookups are lock-free over immutable records in
 *   open-addressing tables whose replaced versions are kept until destroy.
 * - find makes no heap allocation: its scratch (sized by max_query_blocks and max_workers)
 *   lives in the reader.
 */
#include "index_int.h"

/* ---- creation ---------------------------------------------------------------------------- */

int kvr_index_create(const struct kvr_index_opts *opts, struct kvr_index **out)
{
    struct kvr_index *ix;
    struct kvr_index_opts o = {0};

    if (out == NULL)
        return -EINVAL;
    if (opts != NULL)
        o = *opts;
    if (o.jump_stride == 0)
        o.jump_stride = 32;
    if (o.max_workers == 0)
        o.max_workers = 16384;
    if (o.max_query_blocks == 0)
        o.max_query_blocks = 65536;
    if (o.max_workers > (1u << 24) || o.max_query_blocks > (1u << 26) ||
        o.jump_stride > (1u << 20))
        return -EINVAL;

    ix = aligned_alloc(64, (sizeof(*ix) + 63) / 64 * 64);
    if (ix == NULL)
        return -ENOMEM;
    memset(ix, 0, sizeof(*ix));
    ix->o = o;
    ix->epoch = 1;
    ix->gbytes = usable(ix);
    pthread_mutex_init(&ix->imu, NULL);
    ix->sh = aligned_alloc(64, NSHARD * sizeof(struct shard));
    ix->tabw = g_calloc(ix, NSHARD * sizeof(*ix->tabw));
    ix->workers = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->workers));
    ix->pods = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->pods));
    ix->wslow = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->wslow));
    ix->wpod = g_calloc(ix, (size_t)o.max_workers * sizeof(*ix->wpod));
    ix->pw = g_calloc(ix, ((size_t)o.jump_stride + 1) * sizeof(*ix->pw));
    if (ix->sh == NULL || ix->tabw == NULL || ix->workers == NULL || ix->pods == NULL || ix->wslow == NULL ||
        ix->wpod == NULL || ix->pw == NULL) {
        kvr_index_destroy(ix);
        return -ENOMEM;
    }
    __atomic_fetch_add(&ix->gbytes, usable(ix->sh), __ATOMIC_RELAXED);
    memset(ix->sh, 0, NSHARD * sizeof(struct shard));
    strcpy(ix->tier_names[KVR_TIER_GPU], "gpu");
    strcpy(ix->tier_names[KVR_TIER_CPU], "cpu");
    strcpy(ix->tier_names[KVR_TIER_STORAGE], "storage");
    ix->ntiers = 3;
    ix->pw[0] = 1;
    for (uint32_t i = 1; i <= o.jump_stride; i++)
        ix->pw[i] = ix->pw[i - 1] * KVR_HASH_CHAIN_MUL;
    *out = ix;
    return 0;
}

void kvr_index_destroy(struct kvr_index *ix)
{
    if (ix == NULL)
        return;
    /* Everything below is single-threaded by contract. Use a private slot for frees. */
    struct ebr_slot *s = &ix->slots[EBR_SLOTS - 1];
    if (ix->sh != NULL) {
        for (unsigned i = 0; i < NSHARD; i++) {
            struct table *t = ix->sh[i].tab;
            for (uint64_t k = 0; t != NULL && k <= t->mask; k++) {
                uint64_t v = t->slot[k];
                if (v == 0 || v == SLOT_TOMB)
                    continue;
                struct node *x = (struct node *)(uintptr_t)(v & PTR_MASK);
                if (x->n & N_EXT)
                    sl_free(s, (void *)(uintptr_t)x->h);
            }
            sl_free(s, t);
        }
        free(ix->sh);
    }
    free(ix->tabw);
    for (unsigned i = 0; i < EBR_SLOTS; i++) {
        struct ebr_slot *e = &ix->slots[i];
        for (size_t k = 0; k < e->nret; k++)
            if (!((uintptr_t)e->ret[k].p & RET_NODE)) /* nodes: in the slab's chunks */
                free(e->ret[k].p);
        free(e->ret);
    }
    while (ix->slab.all != NULL) {
        struct nchunk *c = ix->slab.all;
        ix->slab.all = c->anext;
        (void)munmap(c, NCHUNK);
    }
    if (ix->slab.spare != NULL)
        (void)munmap(ix->slab.spare, NCHUNK);
    for (uint32_t w = 0; ix->workers != NULL && w < ix->nworkers; w++) {
        struct worker *wk = ix->workers[w];
        for (int t = 0; t < KVR_TIER_MAX; t++) {
            struct holder *hd = wk->h[t];
            if (hd == NULL)
                continue;
            free(hd->recs.s);
            free(hd->absent.s);
            free(hd->alias.s);
            free(hd->extra.s);
            free(hd);
        }
        free(wk->orph);
        free(wk->awaited.s);
        free(wk);
    }
    for (uint32_t p = 0; ix->pods != NULL && p < ix->npods; p++) {
        free(ix->pods[p]->name);
        free(ix->pods[p]->wids);
        free(ix->pods[p]);
    }
    for (uint32_t c = 0; c < NS_CHUNKS; c++)
        free(ix->ns_chunk[c]);
    itab_free(ix, ix->ns_tab, 1);
    itab_free(ix, ix->w_tab, 1);
    itab_free(ix, ix->pod_tab, 1);
    free(ix->workers);
    free(ix->pods);
    free(ix->wslow);
    free(ix->wpod);
    free(ix->pw);
    pthread_mutex_destroy(&ix->imu);
    free(ix);
}

/* ---- statistics ----------------------------------------------------------------------- */

void kvr_index_stats(struct kvr_index *ix, struct kvr_index_stats *st)
{
    int64_t bytes = __atomic_load_n(&ix->gbytes, __ATOMIC_RELAXED), entries = 0, pairs = 0,
            orph = 0;
    for (unsigned i = 0; i < EBR_SLOTS; i++) {
        bytes += LD(ix->slots[i].bytes);
        entries += LD(ix->slots[i].entries);
        pairs += LD(ix->slots[i].pairs);
        orph += LD(ix->slots[i].orphans);
    }
    st->entries = entries > 0 ? (uint64_t)entries : 0;
    st->holders = pairs > 0 ? (uint64_t)pairs : 0;
    st->bytes = bytes > 0 ? (uint64_t)bytes : 0;
    st->workers = LDA(ix->nworkers);
    st->namespaces = LDA(ix->nns);
    st->orphans = orph > 0 ? (uint64_t)orph : 0;
}

void kvr_index_worker_blocks(struct kvr_index *ix, uint32_t wid, uint64_t blocks[KVR_TIER_MAX])
{
    memset(blocks, 0, KVR_TIER_MAX * sizeof(uint64_t));
    struct worker *w = worker_get(ix, wid);
    if (w == NULL)
        return;
    for (int t = 0; t < KVR_TIER_MAX; t++) {
        struct holder *h = LDA(w->h[t]);
        if (h != NULL)
            blocks[t] = LD(h->blocks);
    }
}
