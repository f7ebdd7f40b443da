/* fuzz_index_restore.c — kvr_index_worker_restore on untrusted bytes (a snapshot from a
 * damaged disk or a peer). A refused blob (-EINVAL) must leave the index untouched; an
 * accepted one must leave an index that dumps, restores again to the same counts, takes
 * further writes, and clears to nothing (every KVR_ASSERT of the write path on the way).
 *
 * The index is shaped like test_index_dump.c's (3 namespaces, the lora one last, tiers gpu,
 * cpu, storage and "nvme"), so its dumped blobs, committed as the seed corpus
 * (tests/fuzz/corpus/index_restore, written by KVR_DUMP_CORPUS=<dir> test_index_dump), are
 * valid here; the orphan capacity is smaller (16), so seeds with more parked blocks also take
 * the path that drops the oldest. Worker 1 holds a few entries first, so restored entries
 * join shared ones.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "index/index.h"

static struct kvr_index *mk(uint32_t *w0, uint32_t *w1)
{
    struct kvr_index_opts o = {.orphan_capacity = 16, .max_workers = 8};
    struct kvr_index *ix;
    uint32_t ns;
    uint8_t t;
    if (kvr_index_create(&o, &ix) != 0)
        abort();
    if (kvr_index_ns_intern(ix, "model-0", NULL, &ns, NULL) != 0 ||
        kvr_index_ns_intern(ix, "model-1", NULL, &ns, NULL) != 0 ||
        kvr_index_ns_intern(ix, "model-2", "lora-x", &ns, NULL) != 0 ||
        kvr_index_tier_intern(ix, "nvme", 4, &t) != 0 ||
        kvr_index_worker_intern(ix, "pod-0", 0, w0) != 0 ||
        kvr_index_worker_intern(ix, "pod-0", 1, w1) != 0)
        abort();
    struct kvr_index_block b[3] = {{1, 11}, {2, 12}, {3, 13}};
    if (kvr_index_store(ix, *w1, 0, 0, NULL, b, 3, NULL) != 0)
        abort();
    return ix;
}

static void check(int c)
{
    if (!c)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t w0, w1;
    struct kvr_index *ix = mk(&w0, &w1);
    struct kvr_index_stats before, st;
    kvr_index_stats(ix, &before);
    struct kvr_index_wres res = {0};
    int rc = kvr_index_worker_restore(ix, w0, data, size, &res);
    check(rc == 0 || rc == -EINVAL);
    kvr_index_stats(ix, &st);
    uint64_t blocks[KVR_TIER_MAX];
    if (rc != 0) {
        check(st.entries == before.entries && st.holders == before.holders &&
              st.orphans == 0);
        kvr_index_worker_blocks(ix, w0, blocks);
        for (int t = 0; t < KVR_TIER_MAX; t++)
            check(blocks[t] == 0);
        kvr_index_destroy(ix);
        return 0;
    }
    check(st.orphans == res.orphaned && st.orphans <= 16);
    /* dumps, and the dump restores to the same counts in another index */
    struct kvr_buf b;
    kvr_buf_init(&b);
    check(kvr_index_worker_dump(ix, w0, &b) == 0);
    uint32_t v0, v1;
    struct kvr_index *iy = mk(&v0, &v1);
    struct kvr_index_wres r2 = {0};
    check(kvr_index_worker_restore(iy, v0, b.data, b.len, &r2) == 0);
    struct kvr_index_stats sy;
    kvr_index_stats(iy, &sy);
    check(sy.entries == st.entries && sy.holders == st.holders && sy.orphans == st.orphans &&
          r2.stored == res.stored && r2.orphaned == res.orphaned);
    kvr_buf_free(&b);
    kvr_index_destroy(iy);
    /* finds, further writes, and clearing to nothing */
    struct kvr_index_reader *r;
    check(kvr_index_reader_create(ix, &r) == 0);
    const double wt[KVR_TIER_MAX] = {1, 1, 1, 1, 1, 1, 1, 1};
    const uint64_t q[3] = {11, 12, 13};
    const struct kvr_index_hit *hits;
    size_t nh;
    check(kvr_index_find(r, 0, q, 3, NULL, 0, wt, &hits, &nh) == 0);
    kvr_index_reader_destroy(r);
    struct kvr_index_block nb[2] = {{1, 11}, {5, 15}};
    check(kvr_index_store(ix, w0, 0, 0, NULL, nb, 2, NULL) == 0);
    uint64_t rm[2] = {1, 5};
    check(kvr_index_remove(ix, w0, 0, rm, 2, NULL) == 0);
    check(kvr_index_clear(ix, w0, -1, NULL) == 0);
    kvr_index_stats(ix, &st);
    check(st.entries == before.entries && st.holders == before.holders && st.orphans == 0);
    kvr_index_destroy(ix);
    return 0;
}
