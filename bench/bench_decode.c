/* bench_decode.c — decoder throughput on one core: realistic batches (vLLM-shaped, from
 * tests/unit/decode_batch_gen.h) in the v0.22 array form and the v0.24+ map form, decoded
 * with kvr_decode_batch() and fully iterated with kvr_decode_next() (every hash and token
 * read), on one warm decoder as a writer thread would use it.
 *
 *   build/release/bench/bench_decode [seconds per case, default 1]
 *
 * Prints one line per case: payload size, batches/s, blocks/s, tokens/s, MB/s.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../tests/unit/decode_batch_gen.h"
#include "events/decode.h"
#include "core/log.h"

static volatile uint64_t g_sink;

static void bench(const char *name, uint32_t nev, uint32_t nblk, uint32_t bs, bool map_form,
                  double seconds)
{
    struct kvr_decoder *d = NULL;
    struct kvr_batch bt;
    struct kvr_event ev;
    enum kvr_skip_reason why;
    msgpack_sbuffer sb;
    uint64_t n = 0, sink = 0, t0, t1, deadline;

    msgpack_sbuffer_init(&sb);
    gen_batch(&sb, nev, nblk, bs, map_form, 42);
    if (kvr_decode_create(NULL, &d) != 0)
        exit(1);
    t0 = kvr_now_ns();
    deadline = t0 + (uint64_t)(seconds * 1e9);
    do {
        for (int i = 0; i < 64; i++, n++) {
            if (kvr_decode_batch(d, sb.data, sb.size, &bt) != 0) {
                fprintf(stderr, "bench_decode: %s does not decode\n", name);
                exit(1);
            }
            while (kvr_decode_next(d, &ev, &why) == 1) {
                for (size_t k = 0; k < ev.nhashes; k++)
                    sink += ev.hashes[k];
                for (size_t k = 0; k < ev.ntokens; k++)
                    sink += ev.tokens[k];
            }
        }
        t1 = kvr_now_ns();
    } while (t1 < deadline);
    g_sink = sink;

    double s = (double)(t1 - t0) / 1e9;
    double bps = (double)n / s;
    printf("decode %-22s %7zu B  %9.0f batches/s  %10.0f blocks/s  %12.0f tokens/s  "
           "%7.1f MB/s  %7.2f us/batch\n",
           name, sb.size, bps, bps * nev * nblk, bps * nev * nblk * bs,
           bps * (double)sb.size / 1e6, 1e6 / bps);
    kvr_decode_destroy(d);
    msgpack_sbuffer_destroy(&sb);
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;

    if (seconds <= 0)
        seconds = 1.0;
    printf("# one core; batch = [ts, events, dp_rank], BlockStored events of B blocks x 16 "
           "tokens\n");
    bench("array 32ev x 16blk", 32, 16, 16, false, seconds);
    bench("map   32ev x 16blk", 32, 16, 16, true, seconds);
    bench("array 1ev x 512blk", 1, 512, 16, false, seconds);
    bench("map   1ev x 512blk", 1, 512, 16, true, seconds);
    bench("map   256ev x 1blk", 256, 1, 16, true, seconds);
    return 0;
}
