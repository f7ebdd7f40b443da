/* bench_common.h — what the index benchmarks (bench_index.c, bench_floor.c) share: their
 * random numbers (splitmix64, seeded from KVR_BENCH_SEED by main), the index's 64-bit
 * finalizer under a short name, a monotonic clock in µs, environment numbers and a sort
 * order for latencies. Included by one translation unit each: the state is per program. */
#ifndef KVR_BENCH_COMMON_H
#define KVR_BENCH_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "index/hash.h"

static uint64_t rng = 42;

static inline uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define mixh kvr_hash_mix64 /* the index's mix64 (reverse-map keys), hash.h */

static inline double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static inline long envl(const char *n, long d)
{
    const char *v = getenv(n);
    return v && *v ? strtol(v, NULL, 0) : d;
}

static inline int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
