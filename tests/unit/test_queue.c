/* test_queue.c — bounded in-place queue (src/events/queue.c): FIFO order, back-pressure (the
 * producer waits, nothing is dropped), timeouts, close/drain, multiple producers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include <cmocka.h>

#include "core/log.h"
#include "events/queue.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

struct item {
    uint32_t producer;
    uint64_t value;
    char pad[40];
};

static void test_basic_fifo(void **state)
{
    struct kvr_queue *q;
    struct kvr_queue_stats st;
    (void)state;
    assert_int_equal(kvr_queue_create(4, sizeof(struct item), &q), 0);
    for (uint64_t i = 0; i < 4; i++) {
        bool waited = true;
        struct item *it = kvr_queue_reserve(q, &waited);
        assert_non_null(it);
        assert_false(waited);
        it->value = i;
        kvr_queue_commit(q);
    }
    kvr_queue_stats(q, &st);
    assert_int_equal(st.depth, 4);
    assert_int_equal(st.max_depth, 4);
    assert_int_equal(kvr_queue_acquire(q, 2, 0), 2);
    assert_int_equal(((struct item *)kvr_queue_item(q, 0))->value, 0);
    assert_int_equal(((struct item *)kvr_queue_item(q, 1))->value, 1);
    kvr_queue_release(q, 1);
    kvr_queue_stats(q, &st);
    assert_int_equal(st.depth, 3);
    /* wrap around */
    struct item *it = kvr_queue_reserve(q, NULL);
    it->value = 4;
    kvr_queue_commit(q);
    assert_int_equal(kvr_queue_acquire(q, 16, 0), 4);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(((struct item *)kvr_queue_item(q, i))->value, i + 1);
    kvr_queue_release(q, 4);
    assert_int_equal(kvr_queue_acquire(q, 16, 0), 0);
    kvr_queue_destroy(q);
}

static void test_timeout(void **state)
{
    struct kvr_queue *q;
    int64_t t0;
    (void)state;
    assert_int_equal(kvr_queue_create(2, 8, &q), 0);
    t0 = kvr_now_ms();
    assert_int_equal(kvr_queue_acquire(q, 1, 50), 0);
    assert_true(kvr_now_ms() - t0 >= 45);
    kvr_queue_destroy(q);
}

/* try_reserve never waits: NULL on a full ring (nothing queued changes), a slot again once
 * the consumer released one, NULL once closed. */
static void test_try_reserve(void **state)
{
    struct kvr_queue *q;
    struct kvr_queue_stats st;
    struct item *it;
    (void)state;
    assert_int_equal(kvr_queue_create(2, sizeof(struct item), &q), 0);
    for (uint64_t i = 0; i < 2; i++) {
        it = kvr_queue_try_reserve(q);
        assert_non_null(it);
        it->value = i;
        kvr_queue_commit(q);
    }
    assert_null(kvr_queue_try_reserve(q));
    kvr_queue_stats(q, &st);
    assert_int_equal(st.depth, 2);
    assert_int_equal(st.waits, 0);
    assert_int_equal(kvr_queue_acquire(q, 1, 0), 1);
    assert_int_equal(((struct item *)kvr_queue_item(q, 0))->value, 0);
    kvr_queue_release(q, 1);
    it = kvr_queue_try_reserve(q);
    assert_non_null(it);
    it->value = 2;
    kvr_queue_commit(q);
    kvr_queue_close(q);
    assert_null(kvr_queue_try_reserve(q));
    assert_int_equal(kvr_queue_acquire(q, 4, 0), 2);
    assert_int_equal(((struct item *)kvr_queue_item(q, 1))->value, 2);
    kvr_queue_release(q, 2);
    kvr_queue_destroy(q);
}

static void *waiting_producer(void *arg)
{
    struct kvr_queue *q = arg;
    struct item *it = kvr_queue_reserve(q, NULL); /* waits for room, holding the lock */
    assert_non_null(it);
    it->value = 99;
    kvr_queue_commit(q);
    return NULL;
}

/* A producer waiting for room holds the producer lock: try_reserve must not wait with it. */
static void test_try_reserve_beside_a_waiting_producer(void **state)
{
    struct kvr_queue *q;
    struct kvr_queue_stats st;
    pthread_t th;
    (void)state;
    assert_int_equal(kvr_queue_create(1, sizeof(struct item), &q), 0);
    struct item *it = kvr_queue_try_reserve(q);
    assert_non_null(it);
    it->value = 1;
    kvr_queue_commit(q);
    assert_int_equal(pthread_create(&th, NULL, waiting_producer, q), 0);
    for (int i = 0; i < 1000; i++) { /* until the producer is waiting */
        kvr_queue_stats(q, &st);
        if (st.waits > 0)
            break;
        sleep_ms(1);
    }
    assert_null(kvr_queue_try_reserve(q)); /* returns; does not hang */
    assert_int_equal(kvr_queue_acquire(q, 1, 1000), 1);
    kvr_queue_release(q, 1);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(kvr_queue_acquire(q, 1, 1000), 1);
    assert_int_equal(((struct item *)kvr_queue_item(q, 0))->value, 99);
    kvr_queue_release(q, 1);
    kvr_queue_destroy(q);
}

static void test_bad_args(void **state)
{
    struct kvr_queue *q;
    (void)state;
    assert_int_equal(kvr_queue_create(0, 8, &q), -EINVAL);
    assert_int_equal(kvr_queue_create(4, 0, &q), -EINVAL);
}

static void test_close_drains(void **state)
{
    struct kvr_queue *q;
    (void)state;
    assert_int_equal(kvr_queue_create(8, 8, &q), 0);
    for (uint64_t i = 0; i < 3; i++) {
        uint64_t *p = kvr_queue_reserve(q, NULL);
        *p = i;
        kvr_queue_commit(q);
    }
    kvr_queue_close(q);
    kvr_queue_close(q);
    assert_true(kvr_queue_closed(q));
    assert_null(kvr_queue_reserve(q, NULL));
    assert_int_equal(kvr_queue_acquire(q, 8, -1), 3);
    kvr_queue_release(q, 3);
    assert_int_equal(kvr_queue_acquire(q, 8, -1), 0);
    kvr_queue_destroy(q);
}

/* A producer blocked on a full queue is woken by close and gets NULL. */
static void *blocked_producer(void *arg)
{
    struct kvr_queue *q = arg;
    bool waited = false;
    void *p = kvr_queue_reserve(q, &waited);
    return p == NULL && waited ? (void *)1 : NULL;
}

static void test_close_wakes_producer(void **state)
{
    struct kvr_queue *q;
    pthread_t th;
    void *ret;
    struct kvr_queue_stats st;
    (void)state;
    assert_int_equal(kvr_queue_create(1, 8, &q), 0);
    kvr_queue_reserve(q, NULL);
    kvr_queue_commit(q);
    pthread_create(&th, NULL, blocked_producer, q);
    for (int i = 0; i < 500; i++) { /* bounded: until the producer is counted waiting */
        kvr_queue_stats(q, &st);
        if (st.waits > 0)
            break;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    kvr_queue_close(q);
    pthread_join(th, &ret);
    assert_ptr_equal(ret, (void *)1);
    kvr_queue_destroy(q);
}

/* Several producers, one slow-ish consumer on a small ring: every item arrives exactly once,
 * each producer's items in order, and producers had to wait (back-pressure, no drops). */
#define NPROD 3
#define PER_PROD 20000

struct prod_arg {
    struct kvr_queue *q;
    uint32_t id;
};

static void *producer(void *arg)
{
    struct prod_arg *a = arg;
    for (uint64_t i = 0; i < PER_PROD; i++) {
        struct item *it = kvr_queue_reserve(a->q, NULL);
        if (it == NULL)
            return (void *)1;
        it->producer = a->id;
        it->value = i;
        kvr_queue_commit(a->q);
    }
    return NULL;
}

static void test_mpsc_stress(void **state)
{
    struct kvr_queue *q;
    pthread_t th[NPROD];
    struct prod_arg args[NPROD];
    uint64_t next[NPROD] = {0};
    uint64_t total = 0;
    struct kvr_queue_stats st;
    int64_t deadline = kvr_now_ms() + 30000;
    (void)state;

    assert_int_equal(kvr_queue_create(16, sizeof(struct item), &q), 0);
    for (uint32_t i = 0; i < NPROD; i++) {
        args[i].q = q;
        args[i].id = i;
        pthread_create(&th[i], NULL, producer, &args[i]);
    }
    while (total < (uint64_t)NPROD * PER_PROD) {
        size_t n = kvr_queue_acquire(q, 5, 100);
        assert_true(kvr_now_ms() < deadline);
        for (size_t i = 0; i < n; i++) {
            struct item *it = kvr_queue_item(q, i);
            assert_true(it->producer < NPROD);
            assert_int_equal(it->value, next[it->producer]);
            next[it->producer]++;
        }
        kvr_queue_release(q, n);
        total += n;
    }
    for (uint32_t i = 0; i < NPROD; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
        assert_int_equal(next[i], PER_PROD);
    }
    kvr_queue_stats(q, &st);
    assert_int_equal(st.pushed, (uint64_t)NPROD * PER_PROD);
    assert_int_equal(st.depth, 0);
    assert_true(st.max_depth <= 16);
    assert_int_equal(kvr_queue_acquire(q, 5, 0), 0);
    kvr_queue_destroy(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_fifo),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_try_reserve),
        cmocka_unit_test(test_try_reserve_beside_a_waiting_producer),
        cmocka_unit_test(test_close_drains),
        cmocka_unit_test(test_close_wakes_producer),
        cmocka_unit_test(test_mpsc_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
