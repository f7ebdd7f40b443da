/* test_decode.c — src/decode.c against byte-exact fixtures (spec §7 and one per wire era /
 * edge case), limits, truncation, trailing bytes, and the no-allocation
 * promise once warm. Fixture bytes come from tests/unit/gen_decode_fixtures.py (msgspec's
 * encoding rules through Python msgpack); the two §7 fixtures were also checked byte for
 * byte against the hex dump in the spec.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "decode.h"
#include "decode_batch_gen.h"

/* ---- allocation counter (plain glibc builds; sanitizers bring their own malloc) -------- */
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define COUNT_ALLOCS 1
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
static int g_counting;
static size_t g_calls, g_biggest;
static void note(size_t n)
{
    if (g_counting) {
        g_calls++;
        if (n > g_biggest)
            g_biggest = n;
    }
}
void *malloc(size_t n)
{
    note(n);
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t m)
{
    note(n * m);
    return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n)
{
    note(n);
    return __libc_realloc(p, n);
}
void free(void *p)
{
    __libc_free(p);
}
static void count_start(void)
{
    g_calls = g_biggest = 0;
    g_counting = 1;
}
static void count_stop(void)
{
    g_counting = 0;
}
#else
#define COUNT_ALLOCS 0
#endif

/* ---- fixtures ------------------------------------------------------------------------ */
/* BEGIN GENERATED FIXTURES (tests/unit/gen_decode_fixtures.py --update) */
/* 239 bytes */
static const uint8_t FX_SPEC_MAP[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x91, 0x8b, 0xa4, 0x74, 0x79, 0x70,
    0x65, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0xac, 0x62, 0x6c,
    0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0xcf, 0xda, 0xb8, 0x9b, 0xaa,
    0x7b, 0x58, 0x57, 0xc0, 0xb1, 0x70, 0x61, 0x72, 0x65, 0x6e, 0x74, 0x5f, 0x62, 0x6c, 0x6f, 0x63,
    0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0xc0, 0xa9, 0x74, 0x6f, 0x6b, 0x65, 0x6e, 0x5f, 0x69, 0x64,
    0x73, 0xdc, 0x00, 0x10, 0xce, 0x00, 0x02, 0x50, 0x5c, 0xcd, 0x03, 0x68, 0xcc, 0xc6, 0xcd, 0x23,
    0x68, 0xcd, 0x01, 0x76, 0xcd, 0x01, 0x17, 0xcd, 0x1a, 0x42, 0xcd, 0x01, 0x3b, 0xcd, 0x15, 0xf0,
    0x1e, 0xce, 0x00, 0x02, 0x50, 0x5d, 0xcc, 0xc6, 0xce, 0x00, 0x02, 0x50, 0x5c, 0xce, 0x00, 0x01,
    0x2d, 0x23, 0xcc, 0xc6, 0xce, 0x00, 0x02, 0x50, 0x73, 0xaa, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f,
    0x73, 0x69, 0x7a, 0x65, 0x10, 0xa7, 0x6c, 0x6f, 0x72, 0x61, 0x5f, 0x69, 0x64, 0xc0, 0xa6, 0x6d,
    0x65, 0x64, 0x69, 0x75, 0x6d, 0xa3, 0x47, 0x50, 0x55, 0xa9, 0x6c, 0x6f, 0x72, 0x61, 0x5f, 0x6e,
    0x61, 0x6d, 0x65, 0xc0, 0xaa, 0x65, 0x78, 0x74, 0x72, 0x61, 0x5f, 0x6b, 0x65, 0x79, 0x73, 0x91,
    0xc0, 0xa9, 0x67, 0x72, 0x6f, 0x75, 0x70, 0x5f, 0x69, 0x64, 0x78, 0x00, 0xb2, 0x6b, 0x76, 0x5f,
    0x63, 0x61, 0x63, 0x68, 0x65, 0x5f, 0x73, 0x70, 0x65, 0x63, 0x5f, 0x6b, 0x69, 0x6e, 0x64, 0xae,
    0x66, 0x75, 0x6c, 0x6c, 0x5f, 0x61, 0x74, 0x74, 0x65, 0x6e, 0x74, 0x69, 0x6f, 0x6e, 0x00,
};

/* 118 bytes */
static const uint8_t FX_SPEC_ARRAY[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x91, 0x9c, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0xcf, 0xda, 0xb8, 0x9b, 0xaa, 0x7b, 0x58,
    0x57, 0xc0, 0xc0, 0xdc, 0x00, 0x10, 0xce, 0x00, 0x02, 0x50, 0x5c, 0xcd, 0x03, 0x68, 0xcc, 0xc6,
    0xcd, 0x23, 0x68, 0xcd, 0x01, 0x76, 0xcd, 0x01, 0x17, 0xcd, 0x1a, 0x42, 0xcd, 0x01, 0x3b, 0xcd,
    0x15, 0xf0, 0x1e, 0xce, 0x00, 0x02, 0x50, 0x5d, 0xcc, 0xc6, 0xce, 0x00, 0x02, 0x50, 0x5c, 0xce,
    0x00, 0x01, 0x2d, 0x23, 0xcc, 0xc6, 0xce, 0x00, 0x02, 0x50, 0x73, 0x10, 0xc0, 0xa3, 0x47, 0x50,
    0x55, 0xc0, 0x91, 0xc0, 0x00, 0xae, 0x66, 0x75, 0x6c, 0x6c, 0x5f, 0x61, 0x74, 0x74, 0x65, 0x6e,
    0x74, 0x69, 0x6f, 0x6e, 0xc0, 0x00,
};

/* 94 bytes */
static const uint8_t FX_V090[] = {
    0x92, 0xce, 0x65, 0x53, 0xf1, 0x00, 0x93, 0x96, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74,
    0x6f, 0x72, 0x65, 0x64, 0x92, 0xfb, 0xd3, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xc0,
    0x98, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x04, 0xc0, 0x96, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0xce, 0x00, 0x12, 0xd6, 0x87, 0xd3, 0xaa,
    0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0x94, 0x09, 0x0a, 0x0b, 0x0c, 0x04, 0x07, 0x92, 0xac,
    0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0x91, 0xfb,
};

/* 197 bytes */
static const uint8_t FX_V0102_BIN[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x92, 0x97, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0xc4, 0x20, 0x20, 0x2d, 0xa1, 0x72, 0x48,
    0x2d, 0x92, 0x8b, 0xbc, 0x42, 0xab, 0x25, 0xb0, 0x15, 0x1e, 0x2b, 0x89, 0x5f, 0x13, 0xf4, 0x10,
    0x02, 0xe2, 0x7b, 0x2c, 0xea, 0xbc, 0xfa, 0xe6, 0xd3, 0x32, 0xea, 0xcf, 0x2c, 0xea, 0xbc, 0xfa,
    0xe6, 0xd3, 0x32, 0xea, 0xc4, 0x20, 0x20, 0x2d, 0xa1, 0x72, 0x48, 0x2d, 0x92, 0x8b, 0xbc, 0x42,
    0xab, 0x25, 0xb0, 0x15, 0x1e, 0x2b, 0x89, 0x5f, 0x13, 0xf4, 0x10, 0x02, 0xe2, 0x7b, 0x2c, 0xea,
    0xbc, 0xfa, 0xe6, 0xd3, 0x32, 0xea, 0xdc, 0x00, 0x20, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
    0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17,
    0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x10, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0x93,
    0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0x91, 0xc4, 0x20,
    0x20, 0x2d, 0xa1, 0x72, 0x48, 0x2d, 0x92, 0x8b, 0xbc, 0x42, 0xab, 0x25, 0xb0, 0x15, 0x1e, 0x2b,
    0x89, 0x5f, 0x13, 0xf4, 0x10, 0x02, 0xe2, 0x7b, 0x2c, 0xea, 0xbc, 0xfa, 0xe6, 0xd3, 0x32, 0xea,
    0xa3, 0x43, 0x50, 0x55, 0x01,
};

/* 71 bytes */
static const uint8_t FX_NEG_HASHES[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x91, 0x97, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x96, 0xff, 0xd0, 0x9c, 0xd1, 0xfc, 0x18, 0xd2,
    0xff, 0xfe, 0x79, 0x60, 0xd3, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xd3, 0xff, 0xff,
    0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x90,
    0x00, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0x00,
};

/* 131 bytes */
static const uint8_t FX_SHORT_BIN[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x91, 0x94, 0xac, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0x94, 0xc4, 0x03, 0x01, 0x02, 0x03, 0xc4,
    0x08, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xc4, 0x10, 0x00, 0x01, 0x02, 0x03, 0x04,
    0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xc4, 0x40, 0x00, 0x01, 0x02,
    0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12,
    0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22,
    0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32,
    0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x3b, 0x3c, 0x3d, 0x3e, 0x3f, 0xa3, 0x47, 0x50,
    0x55, 0x00, 0x00,
};

/* 77 bytes */
static const uint8_t FX_EMPTY_BIN[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x93, 0x93, 0xac, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0x91, 0xc4, 0x00, 0xa3, 0x47, 0x50, 0x55,
    0x97, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x01, 0xc4,
    0x00, 0x90, 0x00, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0x93, 0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52,
    0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0x91, 0x02, 0xa3, 0x47, 0x50, 0x55, 0x00,
};

/* 248 bytes */
static const uint8_t FX_V022[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x93, 0x9c, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0x0b, 0x0c, 0x0a, 0xdc, 0x00, 0x20, 0x64,
    0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72, 0x73, 0x74,
    0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x7b, 0x7c, 0x7d, 0x7e, 0x7f, 0xcc, 0x80, 0xcc, 0x81, 0xcc,
    0x82, 0xcc, 0x83, 0x10, 0x03, 0xa3, 0x47, 0x50, 0x55, 0xa7, 0x6d, 0x79, 0x2d, 0x6c, 0x6f, 0x72,
    0x61, 0x92, 0x92, 0xa7, 0x6d, 0x79, 0x2d, 0x6c, 0x6f, 0x72, 0x61, 0x92, 0xa6, 0x6d, 0x6d, 0x68,
    0x61, 0x73, 0x68, 0xfd, 0x91, 0xa7, 0x6d, 0x79, 0x2d, 0x6c, 0x6f, 0x72, 0x61, 0x00, 0xae, 0x66,
    0x75, 0x6c, 0x6c, 0x5f, 0x61, 0x74, 0x74, 0x65, 0x6e, 0x74, 0x69, 0x6f, 0x6e, 0xc0, 0x9c, 0xab,
    0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x0b, 0xc0, 0xdc, 0x00,
    0x10, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72,
    0x73, 0x10, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0xc0, 0xc0, 0x01, 0xae, 0x73, 0x6c, 0x69, 0x64, 0x69,
    0x6e, 0x67, 0x5f, 0x77, 0x69, 0x6e, 0x64, 0x6f, 0x77, 0xcd, 0x10, 0x00, 0x9c, 0xab, 0x42, 0x6c,
    0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x15, 0x14, 0xdc, 0x00, 0x10, 0x00,
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
    0x05, 0xa3, 0x47, 0x50, 0x55, 0xc0, 0xc0, 0x02, 0xad, 0x6d, 0x6c, 0x61, 0x5f, 0x61, 0x74, 0x74,
    0x65, 0x6e, 0x74, 0x69, 0x6f, 0x6e, 0xc0, 0x03,
};

/* 474 bytes */
static const uint8_t FX_V024_MAPS[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x93, 0x8e, 0xa9, 0x74, 0x6f, 0x6b,
    0x65, 0x6e, 0x5f, 0x69, 0x64, 0x73, 0xdc, 0x00, 0x10, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
    0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xa8, 0x6c, 0x6f, 0x63, 0x61, 0x6c, 0x69,
    0x74, 0x79, 0xa5, 0x4c, 0x4f, 0x43, 0x41, 0x4c, 0xaa, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x73,
    0x69, 0x7a, 0x65, 0x10, 0xa6, 0x6d, 0x65, 0x64, 0x69, 0x75, 0x6d, 0xa3, 0x43, 0x50, 0x55, 0xb1,
    0x70, 0x61, 0x72, 0x65, 0x6e, 0x74, 0x5f, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73,
    0x68, 0x4d, 0xaa, 0x73, 0x65, 0x73, 0x73, 0x69, 0x6f, 0x6e, 0x5f, 0x69, 0x64, 0xa2, 0x73, 0x31,
    0xa4, 0x74, 0x79, 0x70, 0x65, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65,
    0x64, 0xac, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0x4e,
    0xa9, 0x6c, 0x6f, 0x72, 0x61, 0x5f, 0x6e, 0x61, 0x6d, 0x65, 0xa2, 0x61, 0x64, 0xa7, 0x6c, 0x6f,
    0x72, 0x61, 0x5f, 0x69, 0x64, 0x09, 0xa9, 0x6f, 0x77, 0x6e, 0x65, 0x72, 0x73, 0x68, 0x69, 0x70,
    0xa1, 0x78, 0xaa, 0x65, 0x78, 0x74, 0x72, 0x61, 0x5f, 0x6b, 0x65, 0x79, 0x73, 0x91, 0x92, 0xa4,
    0x73, 0x61, 0x6c, 0x74, 0x92, 0xa3, 0x69, 0x6d, 0x67, 0x00, 0x2a, 0xa7, 0x69, 0x6e, 0x74, 0x20,
    0x6b, 0x65, 0x79, 0xaa, 0x63, 0x61, 0x63, 0x68, 0x65, 0x5f, 0x73, 0x61, 0x6c, 0x74, 0xa2, 0x7a,
    0x7a, 0x8b, 0xac, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91,
    0x4f, 0xa4, 0x74, 0x79, 0x70, 0x65, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72,
    0x65, 0x64, 0xa9, 0x74, 0x6f, 0x6b, 0x65, 0x6e, 0x5f, 0x69, 0x64, 0x73, 0xdc, 0x00, 0x10, 0x10,
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0xaa,
    0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x10, 0xb1, 0x70, 0x61, 0x72, 0x65,
    0x6e, 0x74, 0x5f, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x4e, 0xa7, 0x6c,
    0x6f, 0x72, 0x61, 0x5f, 0x69, 0x64, 0xc0, 0xa6, 0x6d, 0x65, 0x64, 0x69, 0x75, 0x6d, 0xa3, 0x47,
    0x50, 0x55, 0xa9, 0x6c, 0x6f, 0x72, 0x61, 0x5f, 0x6e, 0x61, 0x6d, 0x65, 0xc0, 0xbc, 0x6b, 0x76,
    0x5f, 0x63, 0x61, 0x63, 0x68, 0x65, 0x5f, 0x73, 0x70, 0x65, 0x63, 0x5f, 0x73, 0x6c, 0x69, 0x64,
    0x69, 0x6e, 0x67, 0x5f, 0x77, 0x69, 0x6e, 0x64, 0x6f, 0x77, 0xc0, 0xb2, 0x6b, 0x76, 0x5f, 0x63,
    0x61, 0x63, 0x68, 0x65, 0x5f, 0x73, 0x70, 0x65, 0x63, 0x5f, 0x6b, 0x69, 0x6e, 0x64, 0xb3, 0x53,
    0x49, 0x4e, 0x4b, 0x5f, 0x46, 0x55, 0x4c, 0x4c, 0x5f, 0x41, 0x54, 0x54, 0x45, 0x4e, 0x54, 0x49,
    0x4f, 0x4e, 0xa9, 0x67, 0x72, 0x6f, 0x75, 0x70, 0x5f, 0x69, 0x64, 0x78, 0x03, 0x83, 0xa4, 0x74,
    0x79, 0x70, 0x65, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0xac,
    0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0x50, 0xa9, 0x74,
    0x6f, 0x6b, 0x65, 0x6e, 0x5f, 0x69, 0x64, 0x73, 0xc0, 0x02,
};

/* 331 bytes */
static const uint8_t FX_REMOVED_CLEARED[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x99, 0x84, 0xa4, 0x74, 0x79, 0x70,
    0x65, 0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0xac, 0x62,
    0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0xcf, 0xda, 0xb8, 0x9b,
    0xaa, 0x7b, 0x58, 0x57, 0xc0, 0xa6, 0x6d, 0x65, 0x64, 0x69, 0x75, 0x6d, 0xa3, 0x47, 0x50, 0x55,
    0xa9, 0x67, 0x72, 0x6f, 0x75, 0x70, 0x5f, 0x69, 0x64, 0x78, 0x00, 0x94, 0xac, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0x91, 0xcf, 0xda, 0xb8, 0x9b, 0xaa, 0x7b,
    0x58, 0x57, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0x00, 0x81, 0xa4, 0x74, 0x79, 0x70, 0x65, 0xb0, 0x41,
    0x6c, 0x6c, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x73, 0x43, 0x6c, 0x65, 0x61, 0x72, 0x65, 0x64, 0x91,
    0xb0, 0x41, 0x6c, 0x6c, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x73, 0x43, 0x6c, 0x65, 0x61, 0x72, 0x65,
    0x64, 0x84, 0xa6, 0x6d, 0x65, 0x64, 0x69, 0x75, 0x6d, 0xa3, 0x47, 0x50, 0x55, 0xac, 0x62, 0x6c,
    0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x93, 0x01, 0x02, 0x03, 0xa4, 0x74,
    0x79, 0x70, 0x65, 0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64,
    0xa8, 0x6c, 0x6f, 0x63, 0x61, 0x6c, 0x69, 0x74, 0x79, 0xa5, 0x4c, 0x4f, 0x43, 0x41, 0x4c, 0x82,
    0xa4, 0x74, 0x79, 0x70, 0x65, 0xb0, 0x41, 0x6c, 0x6c, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x73, 0x43,
    0x6c, 0x65, 0x61, 0x72, 0x65, 0x64, 0xa5, 0x65, 0x78, 0x74, 0x72, 0x61, 0x92, 0x01, 0x02, 0x93,
    0xb0, 0x41, 0x6c, 0x6c, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x73, 0x43, 0x6c, 0x65, 0x61, 0x72, 0x65,
    0x64, 0xa8, 0x77, 0x68, 0x61, 0x74, 0x65, 0x76, 0x65, 0x72, 0x01, 0x83, 0xa4, 0x74, 0x79, 0x70,
    0x65, 0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0xac, 0x62,
    0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0x04, 0xa9, 0x67, 0x72,
    0x6f, 0x75, 0x70, 0x5f, 0x69, 0x64, 0x78, 0x01, 0x94, 0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52,
    0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64, 0x91, 0x05, 0xc0, 0x02, 0x00,
};

/* 555 bytes */
static const uint8_t FX_MIXED[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0xdc, 0x00, 0x1a, 0x97, 0xab, 0x42,
    0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x01, 0xc0, 0x92, 0x01, 0x02,
    0x02, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0x92, 0xad, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x49, 0x6e, 0x61,
    0x63, 0x74, 0x69, 0x76, 0x65, 0x91, 0x01, 0x84, 0xa4, 0x74, 0x79, 0x70, 0x65, 0xab, 0x42, 0x6c,
    0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0xac, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f,
    0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0x02, 0xa9, 0x74, 0x6f, 0x6b, 0x65, 0x6e, 0x5f, 0x69,
    0x64, 0x73, 0x92, 0xa1, 0x78, 0x01, 0xaa, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x73, 0x69, 0x7a,
    0x65, 0x02, 0x2a, 0x93, 0x01, 0x02, 0x03, 0x81, 0xac, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68,
    0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0x03, 0x81, 0xa4, 0x74, 0x79, 0x70, 0x65, 0x07, 0x95, 0xab,
    0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0xcb, 0x3f, 0xf8, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x92, 0x01, 0x02, 0x02, 0x95, 0xab, 0x42, 0x6c, 0x6f, 0x63,
    0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0xa4, 0x6e, 0x6f, 0x70, 0x65, 0xc0, 0x92, 0x01, 0x02,
    0x02, 0x95, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x04,
    0xc0, 0x93, 0x01, 0x02, 0x03, 0x02, 0x9a, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f,
    0x72, 0x65, 0x64, 0x91, 0x05, 0xc0, 0x92, 0x01, 0x02, 0x02, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0xc0,
    0xc0, 0x01, 0x97, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91,
    0x06, 0xc0, 0x92, 0x01, 0x02, 0x02, 0xc0, 0x05, 0x95, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53,
    0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x07, 0xc0, 0x92, 0xff, 0x02, 0x02, 0x95, 0xab, 0x42, 0x6c,
    0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x08, 0xc0, 0x92, 0x01, 0xcf, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x02, 0x95, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53,
    0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x09, 0xc0, 0x92, 0x92, 0x01, 0x02, 0x92, 0x03, 0x04, 0x02,
    0x95, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x0a, 0xc0,
    0x92, 0x01, 0x02, 0xfe, 0x9b, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65,
    0x64, 0x91, 0x0b, 0xc0, 0x92, 0x01, 0x02, 0x02, 0xc0, 0xa3, 0x47, 0x50, 0x55, 0xc0, 0xc0, 0x00,
    0xa5, 0x6d, 0x61, 0x6d, 0x62, 0x61, 0x95, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f,
    0x72, 0x65, 0x64, 0x91, 0x0c, 0xc0, 0xa3, 0x74, 0x6f, 0x6b, 0x02, 0x95, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x0d, 0xa1, 0x70, 0x92, 0x01, 0x02, 0x02,
    0x90, 0xc0, 0x93, 0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f, 0x76, 0x65, 0x64,
    0x91, 0x0e, 0xa3, 0x47, 0x50, 0x55, 0x97, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f,
    0x72, 0x65, 0x64, 0x91, 0x0f, 0xc0, 0x92, 0xce, 0xff, 0xff, 0xff, 0xff, 0x00, 0x02, 0xcf, 0x80,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x47, 0x50, 0x55, 0x98, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0x10, 0x11, 0x0f, 0x94, 0x05, 0x06, 0x07,
    0x08, 0x02, 0xff, 0xa3, 0x47, 0x50, 0x55, 0xc0, 0x91, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53,
    0x74, 0x6f, 0x72, 0x65, 0x64, 0x94, 0xac, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x52, 0x65, 0x6d, 0x6f,
    0x76, 0x65, 0x64, 0x91, 0x12, 0xa3, 0x47, 0x50, 0x55, 0xff, 0x05,
};

/* 228 bytes */
static const uint8_t FX_TOKEN_COUNT[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x94, 0x97, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0x01, 0x02, 0xc0, 0xdc, 0x00, 0x1f, 0x00,
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x10, 0xc0,
    0xa3, 0x47, 0x50, 0x55, 0x84, 0xa4, 0x74, 0x79, 0x70, 0x65, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b,
    0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0xac, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73,
    0x68, 0x65, 0x73, 0x91, 0x01, 0xa9, 0x74, 0x6f, 0x6b, 0x65, 0x6e, 0x5f, 0x69, 0x64, 0x73, 0xc0,
    0xaa, 0x62, 0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x10, 0x83, 0xa4, 0x74, 0x79,
    0x70, 0x65, 0xab, 0x42, 0x6c, 0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0xac, 0x62,
    0x6c, 0x6f, 0x63, 0x6b, 0x5f, 0x68, 0x61, 0x73, 0x68, 0x65, 0x73, 0x91, 0x01, 0xa9, 0x74, 0x6f,
    0x6b, 0x65, 0x6e, 0x5f, 0x69, 0x64, 0x73, 0x93, 0x01, 0x02, 0x03, 0x97, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0xc4, 0x20, 0x20, 0x2d, 0xa1, 0x72, 0x48,
    0x2d, 0x92, 0x8b, 0xbc, 0x42, 0xab, 0x25, 0xb0, 0x15, 0x1e, 0x2b, 0x89, 0x5f, 0x13, 0xf4, 0x10,
    0x02, 0xe2, 0x7b, 0x2c, 0xea, 0xbc, 0xfa, 0xe6, 0xd3, 0x32, 0xea, 0xc0, 0x90, 0x00, 0xc0, 0xa3,
    0x43, 0x50, 0x55, 0x00,
};

/* 12 bytes */
static const uint8_t FX_OUTER_F32[] = {
    0x94, 0xca, 0x4f, 0x00, 0x00, 0x00, 0x90, 0xc0, 0xa3, 0x78, 0x79, 0x7a,
};

/* 18 bytes */
static const uint8_t FX_OUTER_NEGTS[] = {
    0x95, 0xfd, 0x90, 0xce, 0xff, 0xff, 0xff, 0xff, 0xa5, 0x65, 0x78, 0x74, 0x72, 0x61, 0x81, 0xa1,
    0x6b, 0x01,
};

/* 49 bytes */
static const uint8_t FX_DEEP_EXTRA[] = {
    0x93, 0xcb, 0x41, 0xda, 0xa8, 0xdb, 0xe0, 0x35, 0x9f, 0xe7, 0x91, 0x99, 0xab, 0x42, 0x6c, 0x6f,
    0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x91, 0x01, 0xc0, 0x91, 0x01, 0x01, 0xc0, 0xa3,
    0x47, 0x50, 0x55, 0xc0, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x01,
    0x00,
};
/* END GENERATED FIXTURES */

#define FX(n) FX_##n, sizeof(FX_##n)

static const uint32_t TOK16[16] = {151644, 872, 198, 9064, 374, 279, 6722, 315,
                                   5616, 30, 151645, 198, 151644, 77091, 198, 151667};
#define H7 0xdab89baa7b5857c0ull
#define TS7 1789095808.8378847

/* ---- helpers ------------------------------------------------------------------------- */

struct res {
    int rc; /* 1 event, 2 skipped */
    enum kvr_skip_reason why;
    struct kvr_event ev;
};

static struct kvr_decoder *mk(uint32_t max_events, uint32_t max_tokens, uint32_t max_hashes,
                              uint32_t max_depth)
{
    struct kvr_decode_limits lim = {.max_events = max_events, .max_tokens = max_tokens,
                                    .max_hashes = max_hashes, .max_depth = max_depth};
    struct kvr_decoder *d = NULL;
    assert_int_equal(kvr_decode_create(&lim, &d), 0);
    assert_non_null(d);
    return d;
}

/* Opens a batch that must decode, drains it into out[], returns the event count. */
static size_t run(struct kvr_decoder *d, const uint8_t *b, size_t n, struct kvr_batch *bt,
                  struct res *out, size_t cap)
{
    size_t k = 0;
    assert_int_equal(kvr_decode_batch(d, b, n, bt), 0);
    for (;;) {
        struct res r;
        memset(&r, 0, sizeof(r));
        r.rc = kvr_decode_next(d, &r.ev, &r.why);
        if (r.rc == 0)
            break;
        assert_true(r.rc == 1 || r.rc == 2);
        assert_true(r.rc == 1 ? r.why == KVR_SKIP_NONE : r.why != KVR_SKIP_NONE);
        assert_true(k < cap);
        out[k++] = r;
    }
    assert_int_equal(k, bt->nevents);
    assert_int_equal(kvr_decode_next(d, &out[0].ev, NULL), 0); /* stays at the end */
    return k;
}

static void assert_str(const char *p, size_t n, const char *want)
{
    assert_non_null(p);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(p, want, n);
}

static void assert_ok(const struct res *r, enum kvr_event_type t)
{
    if (r->rc != 1)
        fail_msg("expected an event, got skip %s", kvr_decode_skip_reason_name(r->why));
    assert_int_equal(r->ev.type, t);
}

static void assert_skip(const struct res *r, enum kvr_skip_reason why)
{
    if (r->rc != 2 || r->why != why)
        fail_msg("expected skip %s, got rc=%d %s", kvr_decode_skip_reason_name(why), r->rc,
                 kvr_decode_skip_reason_name(r->why));
}

/* ---- §7 ------------------------------------------------------------------------------ */

static void check_spec_batch(const uint8_t *b, size_t n)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];

    assert_int_equal(run(d, b, n, &bt, r, 4), 1);
    assert_true(bt.ts == TS7);
    assert_true(bt.has_dp_rank);
    assert_int_equal(bt.dp_rank, 0);
    assert_ok(&r[0], KVR_EV_STORED);
    assert_int_equal(r[0].ev.nhashes, 1);
    assert_true(r[0].ev.hashes[0] == H7);
    assert_false(r[0].ev.has_parent);
    assert_int_equal(r[0].ev.ntokens, 16);
    assert_memory_equal(r[0].ev.tokens, TOK16, sizeof(TOK16));
    assert_int_equal(r[0].ev.block_size, 16);
    assert_str(r[0].ev.medium, r[0].ev.medium_len, "GPU");
    assert_null(r[0].ev.lora_name);
    assert_false(r[0].ev.has_lora_id);
    assert_int_equal(r[0].ev.group_idx, 0);
    kvr_decode_destroy(d);
}

static void test_spec_map(void **state)
{
    (void)state;
    assert_int_equal(sizeof(FX_SPEC_MAP), 239);
    /* spot-check the §7 dump: offsets 0x2b (uint64 hash), 0x51 (array16), 0xee (dp_rank) */
    assert_memory_equal(FX_SPEC_MAP + 0x2b, "\xcf\xda\xb8\x9b\xaa\x7b\x58\x57\xc0", 9);
    assert_memory_equal(FX_SPEC_MAP + 0x51, "\xdc\x00\x10", 3);
    assert_int_equal(FX_SPEC_MAP[0xee], 0x00);
    check_spec_batch(FX(SPEC_MAP));
}

static void test_spec_array(void **state)
{
    (void)state;
    assert_int_equal(sizeof(FX_SPEC_ARRAY), 118);
    assert_int_equal(FX_SPEC_ARRAY[11], 0x9c); /* fixarray(12) */
    check_spec_batch(FX(SPEC_ARRAY));
}

/* ---- eras ---------------------------------------------------------------------------- */

static void test_v090(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    const uint64_t neg = (uint64_t)INT64_C(-6148914691236517206);
    (void)state;

    assert_int_equal(FX_V090[0], 0x92); /* two-element batch */
    assert_int_equal(run(d, FX(V090), &bt, r, 4), 3);
    assert_true(bt.ts == 1700000000.0);
    assert_false(bt.has_dp_rank);
    assert_ok(&r[0], KVR_EV_STORED);
    assert_int_equal(r[0].ev.nhashes, 2);
    assert_true(r[0].ev.hashes[0] == (uint64_t)-5);
    assert_true(r[0].ev.hashes[1] == neg);
    assert_false(r[0].ev.has_parent);
    assert_int_equal(r[0].ev.ntokens, 8);
    assert_int_equal(r[0].ev.tokens[7], 8);
    assert_int_equal(r[0].ev.block_size, 4);
    assert_null(r[0].ev.medium);
    assert_false(r[0].ev.has_lora_id);
    assert_ok(&r[1], KVR_EV_STORED);
    assert_true(r[1].ev.has_parent);
    assert_true(r[1].ev.parent == neg);
    assert_true(r[1].ev.hashes[0] == 1234567);
    assert_true(r[1].ev.has_lora_id);
    assert_int_equal(r[1].ev.lora_id, 7);
    assert_ok(&r[2], KVR_EV_REMOVED);
    assert_int_equal(r[2].ev.nhashes, 1);
    assert_true(r[2].ev.hashes[0] == (uint64_t)-5);
    assert_null(r[2].ev.medium);
    assert_null(r[2].ev.tokens);
    /* earlier events' arrays are still intact after later ones were decoded */
    assert_true(r[0].ev.hashes[0] == (uint64_t)-5);
    assert_int_equal(r[0].ev.tokens[0], 1);
    kvr_decode_destroy(d);
}

static void test_v0102_bin(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    (void)state;

    assert_non_null(memmem(FX_V0102_BIN, sizeof(FX_V0102_BIN), "\xc4\x20\x20\x2d\xa1", 5));
    assert_int_equal(run(d, FX(V0102_BIN), &bt, r, 4), 2);
    assert_int_equal(bt.dp_rank, 1);
    assert_ok(&r[0], KVR_EV_STORED);
    assert_int_equal(r[0].ev.nhashes, 2);
    /* bin32 sha256 → last 8 bytes big-endian == the int-mode value (spec §3.3) */
    assert_true(r[0].ev.hashes[0] == 0x2ceabcfae6d332eaull);
    assert_true(r[0].ev.hashes[1] == 3236607068019569386ull);
    assert_true(r[0].ev.has_parent);
    assert_true(r[0].ev.parent == 0x2ceabcfae6d332eaull);
    assert_int_equal(r[0].ev.ntokens, 32);
    assert_int_equal(r[0].ev.tokens[31], 32);
    assert_str(r[0].ev.medium, r[0].ev.medium_len, "GPU");
    assert_ok(&r[1], KVR_EV_REMOVED);
    assert_true(r[1].ev.hashes[0] == 0x2ceabcfae6d332eaull);
    assert_str(r[1].ev.medium, r[1].ev.medium_len, "CPU");
    kvr_decode_destroy(d);
}

static void test_neg_hashes(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[2];
    (void)state;

    /* every signed width is on the wire: fixint, int8, int16, int32, int64 */
    assert_non_null(memmem(FX_NEG_HASHES, sizeof(FX_NEG_HASHES), "\x96\xff\xd0\x9c\xd1", 5));
    assert_non_null(memmem(FX_NEG_HASHES, sizeof(FX_NEG_HASHES), "\xd2\xff\xfe\x79\x60", 5));
    assert_non_null(memmem(FX_NEG_HASHES, sizeof(FX_NEG_HASHES),
                           "\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 9));
    assert_int_equal(run(d, FX(NEG_HASHES), &bt, r, 2), 1);
    assert_ok(&r[0], KVR_EV_STORED);
    assert_int_equal(r[0].ev.nhashes, 6);
    assert_true(r[0].ev.hashes[0] == UINT64_MAX);
    assert_true(r[0].ev.hashes[1] == (uint64_t)-100);
    assert_true(r[0].ev.hashes[2] == (uint64_t)-1000);
    assert_true(r[0].ev.hashes[3] == (uint64_t)-100000);
    assert_true(r[0].ev.hashes[4] == 0x8000000000000000ull);
    assert_true(r[0].ev.hashes[5] == (uint64_t)(INT64_C(-2147483648) - 1));
    assert_true(r[0].ev.has_parent && r[0].ev.parent == UINT64_MAX);
    assert_int_equal(r[0].ev.ntokens, 0); /* [] with block_size 0: 0 == 6 * 0 */
    assert_int_equal(r[0].ev.block_size, 0);
    kvr_decode_destroy(d);
}

static void test_short_bin(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[2];
    (void)state;

    assert_int_equal(run(d, FX(SHORT_BIN), &bt, r, 2), 1);
    assert_ok(&r[0], KVR_EV_REMOVED);
    assert_int_equal(r[0].ev.nhashes, 4);
    assert_true(r[0].ev.hashes[0] == 0x010203ull);             /* left-padded */
    assert_true(r[0].ev.hashes[1] == 0x0102030405060708ull);   /* exactly 8 */
    assert_true(r[0].ev.hashes[2] == 0x08090a0b0c0d0e0full);   /* xxhash 16 B */
    assert_true(r[0].ev.hashes[3] == 0x38393a3b3c3d3e3full);   /* 2 × sha256 concat */
    kvr_decode_destroy(d);
}

static void test_empty_bin(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    (void)state;

    assert_int_equal(run(d, FX(EMPTY_BIN), &bt, r, 4), 3);
    assert_skip(&r[0], KVR_SKIP_BAD_HASH);
    assert_skip(&r[1], KVR_SKIP_BAD_HASH); /* empty bin parent */
    assert_ok(&r[2], KVR_EV_REMOVED);
    assert_true(r[2].ev.hashes[0] == 2);
    kvr_decode_destroy(d);
}

static void test_v022(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    (void)state;

    assert_int_equal(run(d, FX(V022), &bt, r, 4), 3);
    assert_int_equal(bt.dp_rank, 3);
    assert_ok(&r[0], KVR_EV_STORED);
    assert_int_equal(r[0].ev.nhashes, 2);
    assert_true(r[0].ev.hashes[0] == 11 && r[0].ev.hashes[1] == 12);
    assert_true(r[0].ev.has_parent && r[0].ev.parent == 10);
    assert_int_equal(r[0].ev.ntokens, 32);
    assert_int_equal(r[0].ev.tokens[0], 100);
    assert_int_equal(r[0].ev.tokens[31], 131);
    assert_str(r[0].ev.lora_name, r[0].ev.lora_name_len, "my-lora");
    assert_false(r[0].ev.has_lora_id); /* lora_name wins over the legacy id */
    assert_int_equal(r[0].ev.group_idx, 0);
    assert_skip(&r[1], KVR_SKIP_GROUP); /* sliding_window group 1 */
    assert_int_equal(r[1].ev.type, KVR_EV_STORED);
    assert_int_equal(r[1].ev.group_idx, 1);
    assert_ok(&r[2], KVR_EV_STORED);      /* mla_attention group 2 */
    assert_int_equal(r[2].ev.group_idx, 2);
    assert_true(r[2].ev.has_lora_id);
    assert_int_equal(r[2].ev.lora_id, 5);
    assert_null(r[2].ev.lora_name);
    kvr_decode_destroy(d);
}

static void test_v024_maps(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    (void)state;

    assert_int_equal(run(d, FX(V024_MAPS), &bt, r, 4), 3);
    assert_int_equal(bt.dp_rank, 2);
    assert_ok(&r[0], KVR_EV_STORED); /* "type" not first, unknown and int keys */
    assert_true(r[0].ev.hashes[0] == 78);
    assert_true(r[0].ev.has_parent && r[0].ev.parent == 77);
    assert_int_equal(r[0].ev.ntokens, 16);
    assert_int_equal(r[0].ev.tokens[15], 15);
    assert_int_equal(r[0].ev.block_size, 16);
    assert_str(r[0].ev.medium, r[0].ev.medium_len, "CPU");
    assert_str(r[0].ev.lora_name, r[0].ev.lora_name_len, "ad");
    assert_false(r[0].ev.has_lora_id);
    assert_ok(&r[1], KVR_EV_STORED); /* SINK_FULL_ATTENTION, case-insensitive, group 3 */
    assert_int_equal(r[1].ev.group_idx, 3);
    assert_null(r[1].ev.lora_name);
    assert_false(r[1].ev.has_lora_id);
    assert_int_equal(r[1].ev.tokens[0], 16);
    assert_ok(&r[2], KVR_EV_STORED); /* omitted defaults everywhere */
    assert_int_equal(r[2].ev.ntokens, 0);
    assert_null(r[2].ev.tokens);
    assert_int_equal(r[2].ev.block_size, 0);
    assert_false(r[2].ev.has_parent);
    assert_null(r[2].ev.medium);
    kvr_decode_destroy(d);
}

static void test_removed_cleared(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[10];
    (void)state;

    assert_int_equal(run(d, FX(REMOVED_CLEARED), &bt, r, 10), 9);
    for (int i = 0; i < 2; i++) {
        assert_ok(&r[i], KVR_EV_REMOVED);
        assert_int_equal(r[i].ev.nhashes, 1);
        assert_true(r[i].ev.hashes[0] == H7);
        assert_str(r[i].ev.medium, r[i].ev.medium_len, "GPU");
        assert_null(r[i].ev.tokens);
    }
    assert_ok(&r[2], KVR_EV_CLEARED);
    assert_ok(&r[3], KVR_EV_CLEARED);
    assert_ok(&r[4], KVR_EV_REMOVED);
    assert_int_equal(r[4].ev.nhashes, 3);
    assert_true(r[4].ev.hashes[2] == 3);
    assert_ok(&r[5], KVR_EV_CLEARED);
    assert_int_equal(r[5].ev.nhashes, 0);
    assert_ok(&r[6], KVR_EV_CLEARED);
    /* removals of other groups are yielded with their group: ingest filters them */
    assert_ok(&r[7], KVR_EV_REMOVED);
    assert_int_equal(r[7].ev.group_idx, 1);
    assert_ok(&r[8], KVR_EV_REMOVED);
    assert_true(r[8].ev.group_idx != 0);
    kvr_decode_destroy(d);
}

static void test_mixed(void **state)
{
    static const int want[] = {
        0, KVR_SKIP_UNKNOWN_TAG, KVR_SKIP_BAD_TOKENS, KVR_SKIP_NOT_EVENT, KVR_SKIP_NO_TAG,
        KVR_SKIP_NO_TAG, KVR_SKIP_NO_TAG, KVR_SKIP_BAD_HASH, KVR_SKIP_BAD_FIELD,
        KVR_SKIP_TOKEN_COUNT, KVR_SKIP_GROUP, KVR_SKIP_BAD_FIELD, KVR_SKIP_BAD_TOKENS,
        KVR_SKIP_BAD_TOKENS, KVR_SKIP_BAD_TOKENS, KVR_SKIP_BAD_FIELD, KVR_SKIP_GROUP,
        KVR_SKIP_BAD_TOKENS, KVR_SKIP_BAD_HASH, KVR_SKIP_NO_TAG, KVR_SKIP_NOT_EVENT, 0,
        KVR_SKIP_BAD_FIELD, 0, KVR_SKIP_BAD_FIELD, KVR_SKIP_BAD_FIELD,
    };
    const size_t nw = sizeof(want) / sizeof(want[0]);
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[32];
    (void)state;

    assert_int_equal(run(d, FX(MIXED), &bt, r, 32), nw);
    assert_int_equal(bt.dp_rank, 5);
    for (size_t i = 0; i < nw; i++) {
        if (want[i] == 0) {
            if (r[i].rc != 1)
                fail_msg("event %zu: skipped as %s", i, kvr_decode_skip_reason_name(r[i].why));
        } else if (r[i].rc != 2 || (int)r[i].why != want[i]) {
            fail_msg("event %zu: want %s, got rc=%d %s", i,
                     kvr_decode_skip_reason_name((enum kvr_skip_reason)want[i]), r[i].rc,
                     kvr_decode_skip_reason_name(r[i].why));
        }
    }
    /* the valid ones, checked after the whole batch was drained (pointers stay valid) */
    assert_int_equal(r[0].ev.type, KVR_EV_STORED);
    assert_true(r[0].ev.hashes[0] == 1);
    assert_int_equal(r[0].ev.ntokens, 2);
    assert_int_equal(r[0].ev.tokens[0], 1);
    assert_int_equal(r[0].ev.tokens[1], 2);
    assert_int_equal(r[21].ev.type, KVR_EV_REMOVED);
    assert_true(r[21].ev.hashes[0] == 14);
    assert_int_equal(r[23].ev.type, KVR_EV_STORED);
    assert_int_equal(r[23].ev.nhashes, 2);
    assert_true(r[23].ev.hashes[0] == 16 && r[23].ev.hashes[1] == 17);
    assert_true(r[23].ev.parent == 15);
    assert_int_equal(r[23].ev.ntokens, 4);
    assert_int_equal(r[23].ev.tokens[3], 8);
    assert_true(r[23].ev.has_lora_id);
    assert_int_equal(r[23].ev.lora_id, -1);
    kvr_decode_destroy(d);
}

static void test_token_count(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    (void)state;

    assert_int_equal(run(d, FX(TOKEN_COUNT), &bt, r, 4), 4);
    assert_skip(&r[0], KVR_SKIP_TOKEN_COUNT); /* 31 tokens for 2 × 16 */
    assert_skip(&r[1], KVR_SKIP_TOKEN_COUNT); /* nil tokens, block_size 16 */
    assert_ok(&r[2], KVR_EV_STORED);          /* no block_size: nothing to check */
    assert_int_equal(r[2].ev.ntokens, 3);
    assert_int_equal(r[2].ev.block_size, 0);
    assert_ok(&r[3], KVR_EV_STORED);          /* placeholder: [] and block_size 0 */
    assert_int_equal(r[3].ev.ntokens, 0);
    kvr_decode_destroy(d);
}

static void test_outer(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[2];
    (void)state;

    assert_int_equal(run(d, FX(OUTER_F32), &bt, r, 2), 0);
    assert_true(bt.ts == 2147483648.0);
    assert_false(bt.has_dp_rank);
    assert_int_equal(run(d, FX(OUTER_NEGTS), &bt, r, 2), 0);
    assert_true(bt.ts == -3.0);
    assert_true(bt.has_dp_rank);
    assert_int_equal(bt.dp_rank, UINT32_MAX);

    static const struct {
        const char *b;
        size_t n;
    } bad[] = {
        {"", 0},
        {"\x80", 1},                                 /* map */
        {"\x91\x00", 2},                             /* 1 element */
        {"\x92\xa1x\x90", 4},                        /* ts is a string */
        {"\x92\xc0\x90", 3},                         /* ts nil */
        {"\x92\x00\x80", 3},                         /* events is a map */
        {"\x92\x00\xc0", 3},                         /* events nil */
        {"\x93\x00\x90\xff", 4},                     /* dp_rank -1 */
        {"\x93\x00\x90\xa1\x30", 5},                 /* dp_rank "0" */
        {"\x93\x00\x90\xcf\x00\x00\x00\x01\x00\x00\x00\x00", 12}, /* dp_rank 2^32 */
        {"\x93\x00\x90\xc3", 4},                     /* dp_rank true */
        {"\x92\x00\x91\xc1", 4},                     /* reserved byte */
        {"\x01", 1},                                 /* scalar */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (kvr_decode_batch(d, bad[i].b, bad[i].n, &bt) != -EBADMSG)
            fail_msg("bad outer #%zu accepted", i);
        assert_int_equal(kvr_decode_next(d, &r[0].ev, &r[0].why), 0);
    }
    assert_int_equal(kvr_decode_batch(d, NULL, 0, &bt), -EBADMSG);
    assert_int_equal(kvr_decode_batch(d, NULL, 5, &bt), -EINVAL);
    kvr_decode_destroy(d);
}

/* ---- limits -------------------------------------------------------------------------- */

static void test_limits_events(void **state)
{
    struct kvr_decoder *d = mk(2, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    (void)state;

    assert_int_equal(kvr_decode_batch(d, FX(V090), &bt), -EBADMSG); /* 3 > 2 */
    assert_int_equal(kvr_decode_next(d, &r[0].ev, &r[0].why), 0);
    assert_int_equal(kvr_decode_batch(d, FX(MIXED), &bt), -EBADMSG);
    assert_int_equal(run(d, FX(V0102_BIN), &bt, r, 4), 2);             /* 2 == 2 */
    kvr_decode_destroy(d);
    d = mk(3, 0, 0, 0);
    assert_int_equal(run(d, FX(V090), &bt, r, 4), 3);
    kvr_decode_destroy(d);
}

static void test_limits_tokens_hashes(void **state)
{
    struct kvr_decoder *d = mk(0, 15, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    (void)state;

    assert_int_equal(run(d, FX(SPEC_MAP), &bt, r, 4), 1);
    assert_skip(&r[0], KVR_SKIP_TOO_LARGE);
    kvr_decode_destroy(d);
    d = mk(0, 16, 0, 0);
    assert_int_equal(run(d, FX(SPEC_MAP), &bt, r, 4), 1);
    assert_ok(&r[0], KVR_EV_STORED);
    kvr_decode_destroy(d);

    d = mk(0, 0, 1, 0);
    assert_int_equal(run(d, FX(V090), &bt, r, 4), 3);
    assert_skip(&r[0], KVR_SKIP_TOO_LARGE); /* 2 hashes > 1 */
    assert_ok(&r[1], KVR_EV_STORED);
    assert_ok(&r[2], KVR_EV_REMOVED);
    assert_true(r[1].ev.hashes[0] == 1234567);
    kvr_decode_destroy(d);
}

static void test_limits_depth(void **state)
{
    struct kvr_decoder *d;
    struct kvr_batch bt;
    struct res r[2];
    uint8_t *deep;
    const size_t big = 100000;
    (void)state;

    /* deep_extra nests 14 containers: batch, events, event, extra_keys + 10 more */
    d = mk(0, 0, 0, 13);
    assert_int_equal(kvr_decode_batch(d, FX(DEEP_EXTRA), &bt), -EBADMSG);
    kvr_decode_destroy(d);
    d = mk(0, 0, 0, 14);
    assert_int_equal(run(d, FX(DEEP_EXTRA), &bt, r, 2), 1);
    assert_ok(&r[0], KVR_EV_STORED);
    kvr_decode_destroy(d);

    /* 100000 nested arrays; and a configured depth above msgpack-c's 32 is clamped */
    deep = malloc(big + 1);
    assert_non_null(deep);
    memset(deep, 0x91, big);
    deep[big] = 0x00;
    d = mk(0, 0, 0, 0);
    assert_int_equal(kvr_decode_batch(d, deep, big + 1, &bt), -EBADMSG);
    kvr_decode_destroy(d);
    d = mk(0, 0, 0, 1000);
    assert_int_equal(kvr_decode_batch(d, deep, big + 1, &bt), -EBADMSG);
    /* exactly 32 levels: [ts, [[[...[0]...]]]] is accepted by the outer check... */
    deep[0] = 0x92;
    deep[1] = 0x00;
    memset(deep + 2, 0x91, 31);
    deep[33] = 0x00;
    assert_int_equal(kvr_decode_batch(d, deep, 34, &bt), 0);
    assert_int_equal(kvr_decode_next(d, &r[0].ev, &r[0].why), 2);
    assert_int_equal(r[0].why, KVR_SKIP_NO_TAG);
    /* ...33 is not */
    memset(deep + 2, 0x91, 32);
    deep[34] = 0x00;
    assert_int_equal(kvr_decode_batch(d, deep, 35, &bt), -EBADMSG);
    kvr_decode_destroy(d);
    free(deep);
}

static void test_limits_huge_declared(void **state)
{
    static const struct {
        const char *b;
        size_t n;
    } bad[] = {
        {"\xdd\xff\xff\xff\xff", 5},                                  /* array32 4G */
        {"\xdd\xff\xff\xff\xff\x00\x00\x00", 8},
        {"\x92\xcb\x41\xda\xa8\xdb\xe0\x35\x9f\xe7\xdd\xff\xff\xff\xff\x00", 16},
        {"\x93\x00\x91\x92\xab" "BlockStored" "\xdd\xff\xff\xff\xff", 21},  /* hashes 4G */
        {"\x92\x00\xdf\xff\xff\xff\xff", 7},                          /* map32 4G */
        {"\x92\x00\x91\x81\xa4type\xdf\x7f\xff\xff\xff", 14},
        {"\x92\x00\xdb\xff\xff\xff\xff", 7},                          /* str32 4G */
        {"\x92\x00\xc6\xff\xff\xff\xff", 7},                          /* bin32 4G */
        {"\x92\x00\xc9\xff\xff\xff\xff\x01", 8},                      /* ext32 4G */
        {"\x92\x00\xdc\x00\x03\x00\x00", 7},                          /* array16(3), 2 items */
        {"\x92\x00\x82\x00\x00\x00", 6},                              /* map(2), 3 of 4 */
    };
    struct kvr_decoder *d = mk(UINT32_MAX, UINT32_MAX, UINT32_MAX, 32);
    struct kvr_batch bt;
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
#if COUNT_ALLOCS
        count_start();
#endif
        int rc = kvr_decode_batch(d, bad[i].b, bad[i].n, &bt);
#if COUNT_ALLOCS
        count_stop();
        if (g_biggest > 65536)
            fail_msg("#%zu: allocated %zu bytes", i, g_biggest);
#endif
        if (rc != -EBADMSG)
            fail_msg("#%zu: rc %d", i, rc);
    }
    kvr_decode_destroy(d);
}

/* ---- robustness ---------------------------------------------------------------------- */

static const struct {
    const char *name;
    const uint8_t *b;
    size_t n;
} ALL[] = {
#define E(x) {#x, FX_##x, sizeof(FX_##x)}
    E(SPEC_MAP), E(SPEC_ARRAY), E(V090), E(V0102_BIN), E(NEG_HASHES), E(SHORT_BIN),
    E(EMPTY_BIN), E(V022), E(V024_MAPS), E(REMOVED_CLEARED), E(MIXED), E(TOKEN_COUNT),
    E(OUTER_F32), E(OUTER_NEGTS), E(DEEP_EXTRA),
#undef E
};
#define NALL (sizeof(ALL) / sizeof(ALL[0]))

static void drain(struct kvr_decoder *d)
{
    struct kvr_event ev;
    enum kvr_skip_reason why;
    int rc, n = 0;
    while ((rc = kvr_decode_next(d, &ev, &why)) != 0) {
        assert_true(rc == 1 || rc == 2);
        if (rc == 1 && ev.nhashes)
            assert_non_null(ev.hashes);
        if (rc == 1 && ev.type == KVR_EV_STORED && ev.block_size)
            assert_true(ev.ntokens == ev.nhashes * ev.block_size);
        /* touch every element so sanitizers see any bad pointer */
        for (size_t i = 0; rc == 1 && i < ev.nhashes; i++)
            n += (int)(ev.hashes[i] & 1);
        for (size_t i = 0; rc == 1 && i < ev.ntokens; i++)
            n += (int)(ev.tokens[i] & 1);
    }
    (void)n;
}

static void test_truncated(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    (void)state;

    for (size_t f = 0; f < NALL; f++) {
        for (size_t n = 0; n < ALL[f].n; n++) {
            /* a private copy of exactly n bytes so ASan catches any over-read */
            uint8_t *cp = malloc(n ? n : 1);
            assert_non_null(cp);
            memcpy(cp, ALL[f].b, n);
            int rc = kvr_decode_batch(d, cp, n, &bt);
            if (rc != -EBADMSG)
                fail_msg("%s truncated to %zu: rc %d", ALL[f].name, n, rc);
            drain(d);
            free(cp);
        }
        assert_int_equal(kvr_decode_batch(d, ALL[f].b, ALL[f].n, &bt), 0);
        drain(d);
    }
    kvr_decode_destroy(d);
}

static void test_trailing(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    uint8_t buf[1200];
    (void)state;

    for (size_t f = 0; f < NALL; f++) {
        assert_true(2 * ALL[f].n <= sizeof(buf));
        memcpy(buf, ALL[f].b, ALL[f].n);
        buf[ALL[f].n] = 0x00;
        assert_int_equal(kvr_decode_batch(d, buf, ALL[f].n + 1, &bt), -EBADMSG);
        buf[ALL[f].n] = 0xc0;
        assert_int_equal(kvr_decode_batch(d, buf, ALL[f].n + 1, &bt), -EBADMSG);
        memcpy(buf + ALL[f].n, ALL[f].b, ALL[f].n); /* two batches back to back */
        assert_int_equal(kvr_decode_batch(d, buf, 2 * ALL[f].n, &bt), -EBADMSG);
        assert_int_equal(kvr_decode_next(d, &(struct kvr_event){0}, NULL), 0);
    }
    kvr_decode_destroy(d);
}

/* Deterministic mutations of every fixture: byte flips, inserts and deletes. Everything
 * must come back as a batch error or events/skips; sanitizer builds check the memory. */
/* ---- the bulk-array path against the reference path ------------------------------------ */

static struct kvr_decoder *mk_ref(void)
{
    struct kvr_decode_limits lim = {.reference = true};
    struct kvr_decoder *d = NULL;
    assert_int_equal(kvr_decode_create(&lim, &d), 0);
    return d;
}

/* Decodes b with both decoders in lockstep: same verdicts, same events and fields. Returns
 * the number of events yielded (not skipped). */
static size_t diff_paths(struct kvr_decoder *a, struct kvr_decoder *r, const uint8_t *b,
                         size_t n)
{
    struct kvr_batch ba, br;
    struct res x, y;
    size_t yielded = 0;
    int rc = kvr_decode_batch(a, b, n, &ba);

    assert_int_equal(rc, kvr_decode_batch(r, b, n, &br));
    if (rc != 0)
        return 0;
    assert_int_equal(ba.nevents, br.nevents);
    assert_true(ba.ts == br.ts || (ba.ts != ba.ts && br.ts != br.ts));
    assert_true(ba.has_dp_rank == br.has_dp_rank && ba.dp_rank == br.dp_rank);
    do {
        memset(&x, 0, sizeof(x));
        memset(&y, 0, sizeof(y));
        x.rc = kvr_decode_next(a, &x.ev, &x.why);
        y.rc = kvr_decode_next(r, &y.ev, &y.why);
        if (x.rc != y.rc || x.why != y.why)
            fail_msg("paths disagree: rc %d/%d, %s/%s", x.rc, y.rc,
                     kvr_decode_skip_reason_name(x.why), kvr_decode_skip_reason_name(y.why));
        if (x.rc != 1)
            continue;
        yielded++;
        assert_int_equal(x.ev.type, y.ev.type);
        assert_int_equal(x.ev.nhashes, y.ev.nhashes);
        assert_int_equal(x.ev.ntokens, y.ev.ntokens);
        if (x.ev.nhashes)
            assert_memory_equal(x.ev.hashes, y.ev.hashes, x.ev.nhashes * sizeof(uint64_t));
        if (x.ev.ntokens)
            assert_memory_equal(x.ev.tokens, y.ev.tokens, x.ev.ntokens * sizeof(uint32_t));
        assert_true(x.ev.has_parent == y.ev.has_parent && x.ev.parent == y.ev.parent);
        assert_int_equal(x.ev.block_size, y.ev.block_size);
        assert_ptr_equal(x.ev.medium, y.ev.medium); /* borrowed from the batch bytes */
        assert_int_equal(x.ev.medium_len, y.ev.medium_len);
        assert_ptr_equal(x.ev.lora_name, y.ev.lora_name);
        assert_int_equal(x.ev.lora_name_len, y.ev.lora_name_len);
        assert_true(x.ev.has_lora_id == y.ev.has_lora_id && x.ev.lora_id == y.ev.lora_id);
        assert_int_equal(x.ev.group_idx, y.ev.group_idx);
    } while (x.rc != 0);
    return yielded;
}

/* Packs [ts, [event], 0] where the event is built by fn. */
typedef void (*ev_fn)(msgpack_packer *pk, int variant);

static void one_event_batch(msgpack_sbuffer *sb, ev_fn fn, int variant)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1.5);
    msgpack_pack_array(&pk, 1);
    fn(&pk, variant);
    msgpack_pack_uint32(&pk, 0);
}

/* Odd token arrays in a v0.22-style BlockStored: the variant picks the odd item. */
static void ev_odd_tokens(msgpack_packer *pk, int v)
{
    msgpack_pack_array(pk, 7);
    gen_str(pk, "BlockStored");
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 77);
    msgpack_pack_nil(pk);
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint32(pk, 1);
    switch (v) {
    case 0: msgpack_pack_int8(pk, 5); break;              /* d0 05: fine */
    case 1: msgpack_pack_int8(pk, -5); break;             /* negative */
    case 2: gen_str(pk, "x"); break;                      /* str */
    case 3: msgpack_pack_array(pk, 1); msgpack_pack_uint8(pk, 1); break; /* nested */
    case 4: msgpack_pack_uint64(pk, 1ull << 32); break;   /* too big */
    case 5: { const char c = 0xcf, z[8] = {0, 0, 0, 0, 0, 0, 0, 9}; /* cf, small */
              msgpack_sbuffer_write(pk->data, &c, 1); msgpack_sbuffer_write(pk->data, z, 8); }
            break;
    case 6: msgpack_pack_int64(pk, 4000000000ll); break;  /* d3, < 2^32 */
    case 7: msgpack_pack_double(pk, 1.0); break;          /* float */
    case 8: msgpack_pack_nil(pk); break;
    default: msgpack_pack_map(pk, 0); break;
    }
    msgpack_pack_uint16(pk, 300);
    msgpack_pack_uint32(pk, 70000);
    msgpack_pack_uint32(pk, 4);
    msgpack_pack_nil(pk);
    gen_str(pk, "cpu");
}

/* Odd hash arrays in a BlockRemoved, plus an array where group_idx goes (variant 6). */
static void ev_odd_hashes(msgpack_packer *pk, int v)
{
    static const char bin10[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    msgpack_pack_array(pk, 4);
    gen_str(pk, "BlockRemoved");
    msgpack_pack_array(pk, 3);
    msgpack_pack_int16(pk, -300);
    switch (v) {
    case 0: msgpack_pack_bin(pk, 3); msgpack_pack_bin_body(pk, bin10, 3); break;
    case 1: msgpack_pack_bin(pk, 10); msgpack_pack_bin_body(pk, bin10, 10); break;
    case 2: msgpack_pack_bin(pk, 0); break;                                   /* empty bin */
    case 3: gen_str(pk, "h"); break;                                         /* str */
    case 4: msgpack_pack_map(pk, 1); msgpack_pack_nil(pk); msgpack_pack_nil(pk); break;
    case 5: msgpack_pack_int64(pk, INT64_MIN); break;
    default: msgpack_pack_uint64(pk, UINT64_MAX); break;
    }
    msgpack_pack_uint64(pk, 1ull << 40);
    gen_str(pk, "GPU");
    if (v == 6) {
        msgpack_pack_array(pk, 1); /* group_idx: wrong type */
        msgpack_pack_uint8(pk, 0);
    } else {
        msgpack_pack_uint8(pk, 0);
    }
}

/* v0.24 maps: duplicate keys, a bin where token_ids goes, strings after the arrays. */
static void ev_odd_map(msgpack_packer *pk, int v)
{
    bool second = v == 0 || v == 3;
    msgpack_pack_map(pk, second ? 7 : 6);
    gen_str(pk, "type");
    gen_str(pk, "BlockStored");
    gen_str(pk, "block_hashes");
    msgpack_pack_array(pk, 2);
    msgpack_pack_uint64(pk, 11);
    msgpack_pack_uint64(pk, 12);
    gen_str(pk, "token_ids");
    if (v == 1) {
        msgpack_pack_bin(pk, 1);
        msgpack_pack_bin_body(pk, "\0", 1);
    } else {
        msgpack_pack_array(pk, 4);
        for (int i = 0; i < 4; i++)
            msgpack_pack_uint32(pk, 100 + i);
    }
    gen_str(pk, "block_size");
    msgpack_pack_uint32(pk, 2);
    gen_str(pk, "medium");
    gen_str(pk, "CPU");
    gen_str(pk, "lora_name");
    gen_str(pk, "adapter-1");
    if (second) {
        gen_str(pk, "token_ids"); /* a second one: the last wins */
        if (v == 3) {
            msgpack_pack_nil(pk);
        } else {
            msgpack_pack_array(pk, 4);
            for (int i = 0; i < 4; i++)
                msgpack_pack_uint8(pk, (uint8_t)(7 + i));
        }
    }
}

static void bulk_paths_agree(void);

/* Both token-run levels (AVX-512 VBMI windows where the CPU has them, and scalar). */
static void test_bulk_paths_agree(void **state)
{
    int best = kvr_decode_force_isa(-1);
    (void)state;
    for (int lv = best; lv >= 0; lv--) {
        printf("-- token runs at level %d\n", kvr_decode_force_isa(lv));
        bulk_paths_agree();
    }
    kvr_decode_force_isa(-1);
}

static void bulk_paths_agree(void)
{
    struct kvr_decoder *a = mk(0, 0, 0, 0), *r = mk_ref();
    msgpack_sbuffer sb;
    static const struct { ev_fn fn; int nvar; int ok_mask; } cases[] = {
        /* variants that must yield an event (the rest must be skipped) */
        {ev_odd_tokens, 10, 1 << 0 | 1 << 5 | 1 << 6},
        {ev_odd_hashes, 7, 1 << 0 | 1 << 1 | 1 << 5},
        {ev_odd_map, 4, 1 << 0 | 1 << 2},
    };

    msgpack_sbuffer_init(&sb);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int v = 0; v < cases[c].nvar; v++) {
            one_event_batch(&sb, cases[c].fn, v);
            size_t got = diff_paths(a, r, (const uint8_t *)sb.data, sb.size);
            if (got != (size_t)(cases[c].ok_mask >> v & 1))
                fail_msg("case %zu variant %d: %zu events yielded", c, v, got);
        }
    }
    /* spot checks of what the bulk path produced */
    struct kvr_batch bt;
    struct res out[1];
    one_event_batch(&sb, ev_odd_map, 0);
    run(a, (const uint8_t *)sb.data, sb.size, &bt, out, 1);
    assert_ok(&out[0], KVR_EV_STORED);
    assert_int_equal(out[0].ev.ntokens, 4);
    assert_int_equal(out[0].ev.tokens[0], 7);
    assert_str(out[0].ev.medium, out[0].ev.medium_len, "CPU");
    assert_str(out[0].ev.lora_name, out[0].ev.lora_name_len, "adapter-1");
    assert_true(out[0].ev.lora_name > sb.data && out[0].ev.lora_name < sb.data + sb.size);
    one_event_batch(&sb, ev_odd_hashes, 1);
    run(a, (const uint8_t *)sb.data, sb.size, &bt, out, 1);
    assert_ok(&out[0], KVR_EV_REMOVED);
    assert_true(out[0].ev.hashes[0] == (uint64_t)-300);
    assert_true(out[0].ev.hashes[1] == 0x030405060708090aull);
    one_event_batch(&sb, ev_odd_tokens, 6);
    run(a, (const uint8_t *)sb.data, sb.size, &bt, out, 1);
    assert_ok(&out[0], KVR_EV_STORED);
    assert_int_equal(out[0].ev.tokens[1], 4000000000u);
    msgpack_sbuffer_destroy(&sb);

    /* every fixture, and large generated batches in both forms */
    for (size_t f = 0; f < NALL; f++)
        diff_paths(a, r, ALL[f].b, ALL[f].n);
    for (int form = 0; form < 2; form++) {
        msgpack_sbuffer_init(&sb);
        gen_batch(&sb, 40, 24, 16, form == 1, 9);
        assert_int_equal(diff_paths(a, r, (const uint8_t *)sb.data, sb.size), 40);
        msgpack_sbuffer_clear(&sb);
        gen_batch(&sb, 3, 300, 16, form == 1, 10); /* 4800-token arrays: the windows */
        assert_int_equal(diff_paths(a, r, (const uint8_t *)sb.data, sb.size), 3);
        msgpack_sbuffer_destroy(&sb);
    }
    kvr_decode_destroy(a);
    kvr_decode_destroy(r);
}

static void test_mutations(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    uint8_t buf[1200];
    struct kvr_decoder *ref = mk_ref();
    uint64_t seed = 0x5eed0fdecull, x = seed;
    size_t accepted = 0;
    (void)state;

    for (int it = 0; it < 60000; it++) {
        size_t f = it % NALL, n = ALL[f].n, pos;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf, ALL[f].b, n);
        pos = (size_t)(x >> 8) % n;
        switch ((x >> 40) % 3) {
        case 0:
            buf[pos] = (uint8_t)(x >> 48);
            break;
        case 1:
            memmove(buf + pos + 1, buf + pos, n - pos);
            buf[pos] = (uint8_t)(x >> 48);
            n++;
            break;
        default:
            memmove(buf + pos, buf + pos + 1, n - pos - 1);
            n--;
            break;
        }
        if (kvr_decode_batch(d, buf, n, &bt) == 0) {
            accepted++;
            drain(d);
        }
        diff_paths(d, ref, buf, n);
    }
    kvr_decode_destroy(ref);
    if (accepted == 0)
        fail_msg("seed %llx: no mutation was accepted", (unsigned long long)seed);
    kvr_decode_destroy(d);
}

/* Generated batches (decode_batch_gen.h): every value checked against its generator. */
static void check_generated(struct kvr_decoder *d, const msgpack_sbuffer *sb, uint32_t nev,
                            uint32_t nblk, uint32_t bs, uint64_t seed)
{
    struct kvr_batch bt;
    struct kvr_event ev;
    enum kvr_skip_reason why;
    const uint64_t *h0 = NULL;

    assert_int_equal(kvr_decode_batch(d, sb->data, sb->size, &bt), 0);
    assert_int_equal(bt.nevents, nev);
    for (uint32_t e = 0; e < nev; e++) {
        assert_int_equal(kvr_decode_next(d, &ev, &why), 1);
        assert_int_equal(ev.type, KVR_EV_STORED);
        assert_int_equal(ev.nhashes, nblk);
        assert_int_equal(ev.ntokens, (size_t)nblk * bs);
        assert_int_equal(ev.block_size, bs);
        assert_int_equal(ev.has_parent, e > 0);
        if (e > 0)
            assert_true(ev.parent == gen_hash(seed, e - 1, nblk - 1));
        for (uint32_t b = 0; b < nblk; b++)
            assert_true(ev.hashes[b] == gen_hash(seed, e, b));
        for (size_t i = 0; i < ev.ntokens; i++)
            if (ev.tokens[i] != gen_token(seed, e, i))
                fail_msg("event %u token %zu", e, i);
        if (e == 0)
            h0 = ev.hashes;
    }
    assert_int_equal(kvr_decode_next(d, &ev, &why), 0);
    for (uint32_t b = 0; b < nblk; b++) /* the first event's array is still intact */
        assert_true(h0[b] == gen_hash(seed, 0, b));
}

static void test_big_batches(void **state)
{
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    (void)state;

    for (int form = 0; form < 2; form++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        gen_batch(&sb, 32, 16, 16, form == 1, 1 + form); /* zone grows past its 64 KiB */
        check_generated(d, &sb, 32, 16, 16, 1 + form);
        msgpack_sbuffer_clear(&sb);
        gen_batch(&sb, 1, 5000, 16, form == 1, 7);        /* 80000 tokens: array32 */
        assert_non_null(memmem(sb.data, sb.size, "\xdd\x00\x01\x38\x80", 5));
        check_generated(d, &sb, 1, 5000, 16, 7);
        msgpack_sbuffer_clear(&sb);
        gen_batch(&sb, 2, 3, 4, form == 1, 9);            /* and small again */
        check_generated(d, &sb, 2, 3, 4, 9);
        msgpack_sbuffer_destroy(&sb);
    }
    kvr_decode_destroy(d);
}

/* [0, [small, one with extra_keys of nnil nils, small], 0] */
static void gen_extra_batch(msgpack_sbuffer *sb, uint32_t nnil)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, 3);
    for (int e = 0; e < 3; e++) {
        msgpack_pack_array(&pk, 9);
        gen_str(&pk, "BlockStored");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint32(&pk, 100 + e);
        msgpack_pack_nil(&pk);
        msgpack_pack_array(&pk, 2);
        msgpack_pack_uint32(&pk, 1);
        msgpack_pack_uint32(&pk, 2);
        msgpack_pack_uint32(&pk, 2);
        msgpack_pack_nil(&pk);
        gen_str(&pk, "GPU");
        msgpack_pack_nil(&pk);
        msgpack_pack_array(&pk, e == 1 ? nnil : 1);
        for (uint32_t i = 0; i < (e == 1 ? nnil : 1); i++)
            msgpack_pack_nil(&pk);
    }
    msgpack_pack_uint32(&pk, 0);
}

/* An event that would need more zone than sizeof(msgpack_object) * (max_tokens +
 * max_hashes) + 1 MiB is skipped as too_large without being unpacked; its neighbours are
 * decoded. With default limits the same event is fine. */
static void test_event_zone_cap(void **state)
{
    struct kvr_decoder *d = mk(0, 8, 8, 0);
    struct kvr_batch bt;
    struct res r[4];
    msgpack_sbuffer sb;
    (void)state;

    msgpack_sbuffer_init(&sb);
    gen_extra_batch(&sb, 50000); /* 50000 * 24 B > 1 MiB + 24 * 16 */
#if COUNT_ALLOCS
    count_start();
#endif
    assert_int_equal(run(d, (const uint8_t *)sb.data, sb.size, &bt, r, 4), 3);
#if COUNT_ALLOCS
    count_stop();
    if (g_biggest >= 1000000)
        fail_msg("allocated %zu bytes for a skipped event", g_biggest);
#endif
    assert_ok(&r[0], KVR_EV_STORED);
    assert_skip(&r[1], KVR_SKIP_TOO_LARGE);
    assert_ok(&r[2], KVR_EV_STORED);
    assert_true(r[0].ev.hashes[0] == 100 && r[2].ev.hashes[0] == 102);
    kvr_decode_destroy(d);

    d = mk(0, 0, 0, 0);
    assert_int_equal(run(d, (const uint8_t *)sb.data, sb.size, &bt, r, 4), 3);
    for (int i = 0; i < 3; i++)
        assert_ok(&r[i], KVR_EV_STORED);
    assert_true(r[1].ev.hashes[0] == 101);
    kvr_decode_destroy(d);
    msgpack_sbuffer_destroy(&sb);
}

/* A zone grown past 4 MiB for one huge event is released when the next batch is small;
 * small batches after that allocate nothing again. */
static void test_zone_shrinks(void **state)
{
#if COUNT_ALLOCS
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    struct res r[4];
    msgpack_sbuffer big, small;
    (void)state;

    msgpack_sbuffer_init(&big);
    msgpack_sbuffer_init(&small);
    gen_extra_batch(&big, 400000); /* ~9.6 MB of zone for event 1 */
    gen_extra_batch(&small, 10);
    assert_int_equal(run(d, (const uint8_t *)small.data, small.size, &bt, r, 4), 3);
    count_start();
    assert_int_equal(run(d, (const uint8_t *)big.data, big.size, &bt, r, 4), 3);
    count_stop();
    assert_true(g_biggest >= 400000 * sizeof(msgpack_object)); /* the zone grew */
    count_start();
    assert_int_equal(run(d, (const uint8_t *)small.data, small.size, &bt, r, 4), 3);
    count_stop();
    assert_true(g_calls >= 1 && g_biggest < 1000000); /* shrunk back to a small zone */
    count_start();
    for (int i = 0; i < 10; i++)
        assert_int_equal(run(d, (const uint8_t *)small.data, small.size, &bt, r, 4), 3);
    count_stop();
    assert_int_equal(g_calls, 0);
    msgpack_sbuffer_destroy(&big);
    msgpack_sbuffer_destroy(&small);
    kvr_decode_destroy(d);
#else
    (void)state;
    skip();
#endif
}

static void test_no_alloc_when_warm(void **state)
{
#if COUNT_ALLOCS
    struct kvr_decoder *d = mk(0, 0, 0, 0);
    struct kvr_batch bt;
    msgpack_sbuffer big[2];
    (void)state;

    for (int form = 0; form < 2; form++) {
        msgpack_sbuffer_init(&big[form]);
        gen_batch(&big[form], 32, 16, 16, form == 1, 3);
    }
    for (int round = 0; round < 2; round++) {
        if (round == 1)
            count_start();
        for (int i = 0; i < 50; i++) {
            for (size_t f = 0; f < NALL; f++) {
                assert_int_equal(kvr_decode_batch(d, ALL[f].b, ALL[f].n, &bt), 0);
                drain(d);
            }
            for (int form = 0; form < 2; form++) {
                assert_int_equal(kvr_decode_batch(d, big[form].data, big[form].size, &bt), 0);
                drain(d);
            }
        }
        if (round == 1) {
            count_stop();
            if (g_calls != 0)
                fail_msg("%zu allocations once warm", g_calls);
        }
    }
    for (int form = 0; form < 2; form++)
        msgpack_sbuffer_destroy(&big[form]);
    kvr_decode_destroy(d);
#else
    (void)state;
    skip();
#endif
}

static void test_reason_names(void **state)
{
    (void)state;
    for (int i = 0; i < KVR_SKIP_REASON_COUNT; i++) {
        const char *n = kvr_decode_skip_reason_name((enum kvr_skip_reason)i);
        assert_non_null(n);
        assert_true(n[0] != 0);
        for (const char *p = n; *p; p++)
            assert_true((*p >= 'a' && *p <= 'z') || *p == '_');
        for (int j = 0; j < i; j++)
            assert_string_not_equal(n, kvr_decode_skip_reason_name((enum kvr_skip_reason)j));
    }
    assert_string_equal(kvr_decode_skip_reason_name(KVR_SKIP_UNKNOWN_TAG), "unknown_tag");
    assert_string_equal(kvr_decode_skip_reason_name(KVR_SKIP_GROUP), "group_filtered");
    assert_string_equal(kvr_decode_skip_reason_name(KVR_SKIP_REASON_COUNT), "invalid");
}

static void test_lifecycle(void **state)
{
    struct kvr_decoder *d = NULL;
    struct kvr_event ev;
    (void)state;
    assert_int_equal(kvr_decode_create(NULL, NULL), -EINVAL);
    assert_int_equal(kvr_decode_create(NULL, &d), 0); /* NULL limits → defaults */
    assert_int_equal(kvr_decode_next(d, &ev, NULL), 0); /* no batch open */
    kvr_decode_destroy(d);
    kvr_decode_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_map),
        cmocka_unit_test(test_spec_array),
        cmocka_unit_test(test_v090),
        cmocka_unit_test(test_v0102_bin),
        cmocka_unit_test(test_neg_hashes),
        cmocka_unit_test(test_short_bin),
        cmocka_unit_test(test_empty_bin),
        cmocka_unit_test(test_v022),
        cmocka_unit_test(test_v024_maps),
        cmocka_unit_test(test_removed_cleared),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_token_count),
        cmocka_unit_test(test_outer),
        cmocka_unit_test(test_limits_events),
        cmocka_unit_test(test_limits_tokens_hashes),
        cmocka_unit_test(test_limits_depth),
        cmocka_unit_test(test_limits_huge_declared),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_trailing),
        cmocka_unit_test(test_bulk_paths_agree),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_big_batches),
        cmocka_unit_test(test_event_zone_cap),
        cmocka_unit_test(test_zone_shrinks),
        cmocka_unit_test(test_no_alloc_when_warm),
        cmocka_unit_test(test_reason_names),
        cmocka_unit_test(test_lifecycle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
