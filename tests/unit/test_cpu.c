/* test_cpu.c — the CPU feature probe: stable, consistent with the compiler's own probe, the
 * same from racing threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/cpu.h"

static void test_has_matches_features(void **state)
{
    (void)state;
    uint32_t f = kvr_cpu_features();
    assert_true(kvr_cpu_features() == f);
    assert_true(kvr_cpu_has(0));
    for (unsigned b = 0; b < 31; b++)
        assert_true(kvr_cpu_has(1u << b) == ((f >> b) & 1));
    assert_true(kvr_cpu_has(f));
    assert_true(!kvr_cpu_has(f | (1u << 30))); /* no such feature bit */
}

static void test_matches_builtin(void **state)
{
    (void)state;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    assert_true(kvr_cpu_has(KVR_CPU_AVX2) == !!__builtin_cpu_supports("avx2"));
    assert_true(kvr_cpu_has(KVR_CPU_AVX512VBMI) == !!__builtin_cpu_supports("avx512vbmi"));
    assert_true(kvr_cpu_has(KVR_CPU_AVX512VBMI2) == !!__builtin_cpu_supports("avx512vbmi2"));
    assert_true(kvr_cpu_has(KVR_CPU_BMI2) == !!__builtin_cpu_supports("bmi2"));
#if defined(__x86_64__)
    assert_true(kvr_cpu_has(KVR_CPU_SSE2)); /* part of x86-64 */
#endif
#else
    assert_true(kvr_cpu_features() == 0);
#endif
}

static void *probe_thread(void *arg)
{
    *(uint32_t *)arg = kvr_cpu_features();
    return NULL;
}

static void test_threads_agree(void **state)
{
    (void)state;
    pthread_t th[8];
    uint32_t got[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&th[i], NULL, probe_thread, &got[i]), 0);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_true(got[i] == kvr_cpu_features());
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_agree), /* first: the threads race on the first probe */
        cmocka_unit_test(test_has_matches_features),
        cmocka_unit_test(test_matches_builtin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
