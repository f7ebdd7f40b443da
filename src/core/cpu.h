/* cpu.h — which instruction-set extensions this CPU has, probed once for the whole process.
 *
 * The SIMD kernels (decode_scan.c's token windows, jtok_simd.c's block kernels) are compiled
 * with per-function target attributes and may run only where the CPU has every extension
 * their target names. Each module states its own requirement as a mask of KVR_CPU_* bits and
 * asks kvr_cpu_has(); this module is the one place that talks to the CPU
 * (__builtin_cpu_supports). Forcing a lower level for tests stays with each module
 * (kvr_decode_force_isa, kvr_jtok_force_isa): it never claims more than kvr_cpu_has() says.
 *
 * Threads: any thread, any time; the probe runs on the first call and every caller sees the
 * same bits.
 */
#ifndef KVR_CPU_H
#define KVR_CPU_H

#include <stdbool.h>
#include <stdint.h>

enum {
    KVR_CPU_SSE2 = 1u << 0,
    KVR_CPU_POPCNT = 1u << 1,
    KVR_CPU_BMI = 1u << 2,
    KVR_CPU_BMI2 = 1u << 3,
    KVR_CPU_AVX2 = 1u << 4,
    KVR_CPU_AVX512F = 1u << 5,
    KVR_CPU_AVX512BW = 1u << 6,
    KVR_CPU_AVX512VBMI = 1u << 7,
    KVR_CPU_AVX512VBMI2 = 1u << 8,
};

/* The KVR_CPU_* bits this CPU has (0 off x86). */
uint32_t kvr_cpu_features(void);
/* true when the CPU has every extension in mask. */
bool kvr_cpu_has(uint32_t mask);

#endif
