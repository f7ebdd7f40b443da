/* fuzz_share.c — libFuzzer target for the replicas' decision batches (route/share.c's
 * kvr_share_decode): any bytes from a peer socket are either refused whole (nothing applied)
 * or decoded into entries that encode back to the same bytes (the format has no slack: a
 * frame that parses is canonical, its reserved bytes zero).
 * Copies go into exact-size heap buffers so ASan sees any over-read.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "route/share.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct got {
    struct kvr_route_shared d[KVR_SHARE_BATCH];
    char pods[KVR_SHARE_BATCH][KVR_SHARE_POD_MAX + 1];
    size_t n;
};

static void take(void *arg, const struct kvr_route_shared *d)
{
    struct got *g = arg;
    if (g->n >= KVR_SHARE_BATCH || d->pod == NULL || strlen(d->pod) == 0 ||
        strlen(d->pod) > KVR_SHARE_POD_MAX)
        abort();
    strcpy(g->pods[g->n], d->pod);
    g->d[g->n] = *d;
    g->d[g->n].pod = g->pods[g->n];
    g->n++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct got g;
    static const uint8_t self[16] = {1, 2, 3};
    uint8_t *buf = malloc(size ? size : 1);
    struct kvr_err err;

    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    g.n = 0;
    int rc = kvr_share_decode(buf, size, self, take, &g, &err);
    if (rc < 0 && g.n != 0)
        abort(); /* refused frames apply nothing */
    if (rc == 0) {
        struct kvr_buf out;
        kvr_buf_init(&out);
        if (kvr_share_encode(buf + 8, g.d, g.n, &out) != 0 || out.len != size ||
            memcmp(out.data, buf, size) != 0)
            abort();
        kvr_buf_free(&out);
    }
    free(buf);
    return 0;
}
