/* jtok_int.h — private to jtok*.c: what jtok.c (the cursor, the per-token path and the ISA
 * choice) and jtok_simd.c (the block kernels) share. jtok.h stays the one contract.
 */
#ifndef KVR_JTOK_INT_H
#define KVR_JTOK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LOAD_LE64(x) __builtin_bswap64(x)
#else
#define LOAD_LE64(x) (x)
#endif

#if defined(__x86_64__) && defined(__SSE2__)
#define JTOK_BLOCKS 1

/* Block kernels (jtok_simd.c). Each starts at "expecting a number" at *pp, converts the
 * numbers of whole 64-byte blocks into out[*cntp..cap) while at least 72 bytes remain before
 * end, and advances *pp and *cntp over what it converted. false: a block did not validate
 * (the per-token path then reports the precise error); true: it stopped at a block without a
 * comma or near the end. The AVX2 kernel needs AVX2 and BMI, the AVX-512 kernel AVX-512 F,
 * BW, VBMI, VBMI2, BMI and BMI2: the caller checks the CPU first. */
bool kvr_jtok_blocks_sse2(const char **pp, const char *end, uint32_t *out, size_t cap,
                          size_t *cntp);
bool kvr_jtok_blocks_avx2(const char **pp, const char *end, uint32_t *out, size_t cap,
                          size_t *cntp);
bool kvr_jtok_blocks_avx512(const char **pp, const char *end, uint32_t *out, size_t cap,
                            size_t *cntp);
#endif

#endif
