/* fuzz_snap.c — libFuzzer target for the snapshot loader: kvr_snap_verify, then kvr_snap_apply
 * into a fresh index (which hands every worker blob to the index's own validation). Any input
 * must be accepted or refused with an error, never crash, hang or leak; a refused restore
 * leaves an index the caller can destroy.
 *
 * Checksums would stop almost every mutation at the first section, so each input is tried
 * twice: as it is (the checksum paths), and "resealed" (every section checksum, the END
 * checksum and the header checksum recomputed over the mutated bytes), which reaches the
 * section parsers and the index's blob checks. Seeds: real small snapshots written by
 * test_snap (tests/fuzz/corpus/snap). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "index/index.h"
#include "state/snap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void reseal(uint8_t *d, size_t len)
{
    size_t off = 96;

    if (len < 96)
        return;
    wr64(d + 88, XXH64(d, 88, 0));
    while (len - off >= 24) {
        uint32_t type = (uint32_t)(d[off] | d[off + 1] << 8 | d[off + 2] << 16 |
                                   (uint32_t)d[off + 3] << 24);
        uint64_t sl = rd64(d + off + 8);
        if (sl > len - off - 24)
            return;
        if (type == 15 && sl == 8)
            wr64(d + off + 24, XXH64(d, off, 0));
        wr64(d + off + 16, XXH64(d + off + 24, sl, 0));
        off += 24 + sl;
    }
}

static void try_load(const uint8_t *d, size_t len)
{
    struct kvr_index_opts o = {.orphan_capacity = 64, .max_workers = 256};
    struct kvr_index *ix;
    struct kvr_snap_loaded l;
    struct kvr_snap_info info;
    struct kvr_err err;

    if (kvr_snap_verify(d, len, &info, &err) != 0)
        return;
    if (kvr_index_create(&o, &ix) != 0)
        return;
    if (kvr_snap_apply(d, len, ix, &l, &err) == 0) {
        for (size_t i = 0; i < l.nstreams; i++) /* the strings are in place and terminated */
            if (strlen(l.streams[i].pod) > KVR_NAME_MAX || l.streams[i].model == NULL)
                abort();
        kvr_snap_loaded_free(&l);
    }
    kvr_index_destroy(ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;

    try_load(data, size);
    copy = malloc(size ? size : 1);
    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    reseal(copy, size);
    try_load(copy, size);
    free(copy);
    return 0;
}
