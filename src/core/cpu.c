/* cpu.c — the CPU feature probe (cpu.h).
 *
 * Why its own module: decode and jtok each probed with __builtin_cpu_supports() in their own
 * words; one probe keeps the feature names in one place and lets each kernel state its
 * requirement as a mask next to the kernel.
 *
 * The bits are computed on the first call and cached in one relaxed atomic (PROBED marks a
 * filled cache). Two threads racing on the first call both compute the same value, so no
 * lock or once-flag is needed; __builtin_cpu_init() is idempotent.
 */
#include "core/cpu.h"

#include <stdatomic.h>

#define PROBED (1u << 31)

static _Atomic uint32_t g_features; /* 0: not probed yet; else PROBED | KVR_CPU_* bits */

static uint32_t probe(void)
{
    uint32_t f = 0;

#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse2"))
        f |= KVR_CPU_SSE2;
    if (__builtin_cpu_supports("popcnt"))
        f |= KVR_CPU_POPCNT;
    if (__builtin_cpu_supports("bmi"))
        f |= KVR_CPU_BMI;
    if (__builtin_cpu_supports("bmi2"))
        f |= KVR_CPU_BMI2;
    if (__builtin_cpu_supports("avx2"))
        f |= KVR_CPU_AVX2;
    if (__builtin_cpu_supports("avx512f"))
        f |= KVR_CPU_AVX512F;
    if (__builtin_cpu_supports("avx512bw"))
        f |= KVR_CPU_AVX512BW;
    if (__builtin_cpu_supports("avx512vbmi"))
        f |= KVR_CPU_AVX512VBMI;
    if (__builtin_cpu_supports("avx512vbmi2"))
        f |= KVR_CPU_AVX512VBMI2;
#endif
    return f;
}

uint32_t kvr_cpu_features(void)
{
    uint32_t f = atomic_load_explicit(&g_features, memory_order_relaxed);

    if (f == 0) {
        f = PROBED | probe();
        atomic_store_explicit(&g_features, f, memory_order_relaxed);
    }
    return f & ~PROBED;
}

bool kvr_cpu_has(uint32_t mask)
{
    return (kvr_cpu_features() & mask) == mask;
}
