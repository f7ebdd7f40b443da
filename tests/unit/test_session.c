/* test_session.c — session bonds against a naive model (every bond a row with its last-use
 * stamp; least recently used = the smallest stamp, found by a scan), on random keys (some
 * colliding in their first bytes, binary, up to the key limit), pods, caps and clocks (seed
 * printed, KVR_TEST_SEED=N replays): every get, bind, expiry, pod drop and eviction, and the
 * count after each step; then the refusals.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "route/session.h"

static unsigned seed;

#define KEYS 300
#define PODS 5

struct row {
    int key;
    int pod;
    uint32_t rank;
    int64_t used;
    uint64_t stamp; /* use order (equal times happen) */
};
static struct row model[KEYS];
static size_t nmodel;
static uint64_t stamp_ctr;
static char keys[KEYS][KVR_SESSION_KEY_MAX];
static size_t klens[KEYS];
static const char *pods[PODS] = {"10.0.0.1:8000", "10.0.0.2:8000", "pod-c", "pod-d", "e"};

static int model_find(int key)
{
    for (size_t i = 0; i < nmodel; i++)
        if (model[i].key == key)
            return (int)i;
    return -1;
}

static void model_del(size_t i)
{
    model[i] = model[--nmodel];
}

static void model_evict(uint32_t max)
{
    while (nmodel > max) {
        size_t lru = 0;
        for (size_t i = 1; i < nmodel; i++)
            if (model[i].stamp < model[lru].stamp)
                lru = i;
        model_del(lru);
    }
}

static void test_against_model(void **state)
{
    (void)state;
    unsigned r = seed;
    for (int k = 0; k < KEYS; k++) { /* prefixes shared, lengths 2..max, any bytes; the
                                         * last two name k, so the keys are distinct */
        klens[k] = k % 7 == 0 ? KVR_SESSION_KEY_MAX : 2 + (size_t)(rand_r(&r) % 40);
        for (size_t i = 0; i + 2 < klens[k]; i++)
            keys[k][i] = i < klens[k] / 2 ? (char)('a' + k % 3) : (char)(rand_r(&r) & 0xff);
        keys[k][klens[k] - 2] = (char)(k & 0xff);
        keys[k][klens[k] - 1] = (char)(k >> 8);
    }
    uint32_t max = 1 + (uint32_t)(rand_r(&r) % KEYS);
    struct kvr_session *s;
    assert_int_equal(kvr_session_create(max, &s), 0);
    int64_t now = 1000;
    for (int step = 0; step < 200000; step++) {
        now += rand_r(&r) % 3;
        int op = (int)(rand_r(&r) % 100);
        int key = (int)(rand_r(&r) % KEYS);
        if (op < 45) { /* bind */
            int pod = (int)(rand_r(&r) % PODS);
            uint32_t rank = (uint32_t)(rand_r(&r) % 3);
            assert_int_equal(kvr_session_bind(s, keys[key], klens[key], pods[pod], rank, now), 0);
            int i = model_find(key);
            if (i < 0) {
                i = (int)nmodel++;
                model[i].key = key;
            }
            model[i].pod = pod;
            model[i].rank = rank;
            model[i].used = now;
            model[i].stamp = ++stamp_ctr;
            model_evict(max);
        } else if (op < 90) { /* get, with a ttl */
            int64_t before = now - (int64_t)(rand_r(&r) % 400);
            const char *pod = NULL;
            uint32_t rank = 99;
            int got = kvr_session_get(s, keys[key], klens[key], before, &pod, &rank);
            int i = model_find(key);
            int want = i >= 0 && model[i].used > before;
            if (i >= 0 && !want)
                model_del((size_t)i);
            assert_int_equal(got, want);
            if (want) {
                assert_string_equal(pod, pods[model[i].pod]);
                assert_int_equal(rank, model[i].rank);
            }
        } else if (op < 96) { /* expire */
            int64_t before = now - (int64_t)(rand_r(&r) % 600);
            size_t want = 0;
            for (size_t i = 0; i < nmodel;)
                if (model[i].used <= before)
                    model_del(i), want++;
                else
                    i++;
            assert_int_equal(kvr_session_expire(s, before), want);
        } else if (op < 98) { /* a pod forgotten */
            int pod = (int)(rand_r(&r) % PODS);
            size_t want = 0;
            for (size_t i = 0; i < nmodel;)
                if (model[i].pod == pod)
                    model_del(i), want++;
                else
                    i++;
            assert_int_equal(kvr_session_drop_pod(s, pods[pod]), want);
        } else { /* the cap changes */
            max = 1 + (uint32_t)(rand_r(&r) % KEYS);
            kvr_session_set_max(s, max);
            model_evict(max);
        }
        assert_int_equal(kvr_session_count(s), nmodel);
    }
    kvr_session_destroy(s);
}

static void test_refusals(void **state)
{
    (void)state;
    struct kvr_session *s;
    char big[KVR_SESSION_KEY_MAX + 1];
    const char *pod;
    uint32_t rank;
    memset(big, 'k', sizeof(big));
    assert_int_equal(kvr_session_create(0, &s), 0); /* a cap of 0 keeps one */
    assert_int_equal(kvr_session_bind(s, "", 0, "p", 0, 1), -EINVAL);
    assert_int_equal(kvr_session_bind(s, big, sizeof(big), "p", 0, 1), -EINVAL);
    assert_int_equal(kvr_session_bind(s, "k", 1, "", 0, 1), -EINVAL);
    assert_int_equal(kvr_session_bind(s, "k", 1, NULL, 0, 1), -EINVAL);
    assert_int_equal(kvr_session_bind(s, big, sizeof(big) - 1, "p", 2, 5), 0);
    assert_int_equal(kvr_session_get(s, big, sizeof(big), 0, &pod, &rank), 0);
    assert_int_equal(kvr_session_get(s, big, sizeof(big) - 1, 4, &pod, &rank), 1);
    assert_int_equal(kvr_session_get(s, big, sizeof(big) - 1, 5, &pod, &rank), 0); /* idle */
    assert_int_equal(kvr_session_bind(s, "a", 1, "p", 0, 6), 0);
    assert_int_equal(kvr_session_bind(s, "b", 1, "q", 0, 7), 0); /* evicts a */
    assert_int_equal(kvr_session_count(s), 1);
    assert_int_equal(kvr_session_get(s, "a", 1, 0, &pod, &rank), 0);
    assert_int_equal(kvr_session_get(s, "b", 1, 0, &pod, &rank), 1);
    assert_string_equal(pod, "q");
    kvr_session_destroy(s);
    kvr_session_destroy(NULL);
}

int main(void)
{
    const char *env = getenv("KVR_TEST_SEED");
    seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_session: seed %u (KVR_TEST_SEED=%u replays it)\n", seed, seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_model),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
