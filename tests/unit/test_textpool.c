/* test_textpool.c — the text threads' pool (src/http/textpool.h): every accepted job is done
 * exactly once, on a worker with that worker's own context; the queue bound refuses with
 * -EAGAIN and counts; a job cancelled before it started is done without being run; destroy
 * finishes the jobs still queued as cancelled; jobs submitted from several threads at once
 * (run under TSan in CI) all come back. No sockets, no sleeps in assertions: a gate job
 * holds the single worker while the queue is filled.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/textpool.h"

struct ctx {
    unsigned idx;
    pthread_t owner; /* set by the first job that runs with it */
    bool owned;
    unsigned runs;   /* only ever touched by its worker */
};

struct tjob {
    struct kvr_textpool_job pj;
    struct ctx *ran_with;
    pthread_t done_on;
    _Atomic int done_count;
    /* a gate: run() blocks until released */
    pthread_mutex_t *gate_lock;
    pthread_cond_t *gate_cond;
    bool *gate_open;
    _Atomic bool *started;
};

static _Atomic int ctx_live;

static int ctx_create(void *arg, unsigned i, void **out)
{
    (void)arg;
    struct ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    c->idx = i;
    atomic_fetch_add(&ctx_live, 1);
    *out = c;
    return 0;
}

static void ctx_destroy(void *arg, void *p)
{
    (void)arg;
    atomic_fetch_sub(&ctx_live, 1);
    free(p);
}

static void job_run(void *cp, struct kvr_textpool_job *pj)
{
    struct tjob *j = (struct tjob *)pj;
    struct ctx *c = cp;
    if (!c->owned) {
        c->owner = pthread_self();
        c->owned = true;
    }
    assert_true(pthread_equal(c->owner, pthread_self())); /* one context per worker */
    c->runs++;
    j->ran_with = c;
    if (j->started != NULL)
        atomic_store(j->started, true);
    if (j->gate_lock != NULL) {
        pthread_mutex_lock(j->gate_lock);
        while (!*j->gate_open)
            pthread_cond_wait(j->gate_cond, j->gate_lock);
        pthread_mutex_unlock(j->gate_lock);
    }
}

static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static int done_total;

static void job_done(struct kvr_textpool_job *pj)
{
    struct tjob *j = (struct tjob *)pj;
    j->done_on = pthread_self();
    atomic_fetch_add(&j->done_count, 1);
    pthread_mutex_lock(&done_lock);
    done_total++;
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_lock);
}

static void wait_done(int n)
{
    pthread_mutex_lock(&done_lock);
    while (done_total < n)
        pthread_cond_wait(&done_cond, &done_lock);
    pthread_mutex_unlock(&done_lock);
}

static void job_init(struct tjob *j)
{
    memset(j, 0, sizeof(*j));
    j->pj.run = job_run;
    j->pj.done = job_done;
    atomic_init(&j->pj.cancelled, false);
    atomic_init(&j->done_count, 0);
}

static void reset_done(void)
{
    pthread_mutex_lock(&done_lock);
    done_total = 0;
    pthread_mutex_unlock(&done_lock);
}

static void test_create_refusals(void **state)
{
    struct kvr_textpool *p = NULL;
    (void)state;
    assert_int_equal(kvr_textpool_create(0, 4, ctx_create, ctx_destroy, NULL, &p), -EINVAL);
    assert_int_equal(kvr_textpool_create(2, 0, ctx_create, ctx_destroy, NULL, &p), -EINVAL);
    assert_int_equal(kvr_textpool_create(2, 4, NULL, ctx_destroy, NULL, &p), -EINVAL);
    assert_null(p);
}

/* Many jobs over three workers: each done once, each run with a context of its worker. */
static void test_all_done(void **state)
{
    enum { N = 2000 };
    struct kvr_textpool *p;
    struct tjob *jobs = calloc(N, sizeof(*jobs));
    struct kvr_textpool_stats st;
    int accepted = 0;
    (void)state;
    reset_done();
    assert_non_null(jobs);
    assert_int_equal(kvr_textpool_create(3, N, ctx_create, ctx_destroy, NULL, &p), 0);
    assert_int_equal(atomic_load(&ctx_live), 3);
    for (int i = 0; i < N; i++) {
        job_init(&jobs[i]);
        assert_int_equal(kvr_textpool_submit(p, &jobs[i].pj), 0);
        accepted++;
    }
    wait_done(accepted);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&jobs[i].done_count), 1);
        assert_true(jobs[i].pj.ran);
        assert_non_null(jobs[i].ran_with);
        assert_true(pthread_equal(jobs[i].done_on, jobs[i].ran_with->owner));
    }
    kvr_textpool_stats(p, &st);
    assert_int_equal(st.threads, 3);
    assert_int_equal(st.jobs, N);
    assert_int_equal(st.rejected, 0);
    assert_int_equal(st.queued, 0);
    kvr_textpool_destroy(p);
    assert_int_equal(atomic_load(&ctx_live), 0);
    free(jobs);
}

/* One worker held by a gate; the queue (cap 3) fills: the 4th waiting job is refused,
 * counted; a cancelled queued job is done without running; opening the gate finishes all. */
static void test_bound_and_cancel(void **state)
{
    struct kvr_textpool *p;
    struct tjob gate, q[4];
    pthread_mutex_t gl = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t gc = PTHREAD_COND_INITIALIZER;
    bool open = false;
    _Atomic bool started = false;
    struct kvr_textpool_stats st;
    (void)state;
    reset_done();
    assert_int_equal(kvr_textpool_create(1, 3, ctx_create, ctx_destroy, NULL, &p), 0);
    job_init(&gate);
    gate.gate_lock = &gl;
    gate.gate_cond = &gc;
    gate.gate_open = &open;
    gate.started = &started;
    assert_int_equal(kvr_textpool_submit(p, &gate.pj), 0);
    while (!atomic_load(&started)) /* the worker holds the gate: the queue is empty */
        sched_yield();
    for (int i = 0; i < 4; i++)
        job_init(&q[i]);
    assert_int_equal(kvr_textpool_submit(p, &q[0].pj), 0);
    assert_int_equal(kvr_textpool_submit(p, &q[1].pj), 0);
    assert_int_equal(kvr_textpool_submit(p, &q[2].pj), 0);
    assert_int_equal(kvr_textpool_submit(p, &q[3].pj), -EAGAIN); /* running one not counted */
    kvr_textpool_stats(p, &st);
    assert_int_equal(st.queued, 3);
    assert_int_equal(st.running, 1);
    assert_int_equal(st.rejected, 1);
    kvr_textpool_cancel(&q[1].pj);
    pthread_mutex_lock(&gl);
    open = true;
    pthread_cond_broadcast(&gc);
    pthread_mutex_unlock(&gl);
    wait_done(4);
    assert_true(q[0].pj.ran);
    assert_false(q[1].pj.ran); /* cancelled while queued: not run, but done */
    assert_int_equal(atomic_load(&q[1].done_count), 1);
    assert_null(q[1].ran_with);
    assert_true(q[2].pj.ran);
    assert_int_equal(atomic_load(&q[3].done_count), 0); /* refused: never called back */
    kvr_textpool_stats(p, &st);
    assert_int_equal(st.cancelled, 1);
    assert_int_equal(st.jobs, 4);
    /* the refused job can be submitted again now that there is room */
    assert_int_equal(kvr_textpool_submit(p, &q[3].pj), 0);
    wait_done(5);
    assert_true(q[3].pj.ran);
    kvr_textpool_destroy(p);
}

/* Destroy with jobs still queued: they are done (as cancelled), none is lost. */
static void test_destroy_finishes_queued(void **state)
{
    struct kvr_textpool *p;
    struct tjob gate, q[5];
    pthread_mutex_t gl = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t gc = PTHREAD_COND_INITIALIZER;
    bool open = false;
    _Atomic bool started = false;
    (void)state;
    reset_done();
    assert_int_equal(kvr_textpool_create(1, 8, ctx_create, ctx_destroy, NULL, &p), 0);
    job_init(&gate);
    gate.gate_lock = &gl;
    gate.gate_cond = &gc;
    gate.gate_open = &open;
    gate.started = &started;
    assert_int_equal(kvr_textpool_submit(p, &gate.pj), 0);
    while (!atomic_load(&started))
        sched_yield();
    for (int i = 0; i < 5; i++) {
        job_init(&q[i]);
        assert_int_equal(kvr_textpool_submit(p, &q[i].pj), 0);
    }
    pthread_mutex_lock(&gl); /* opened before destroy joins, so the worker can finish */
    open = true;
    pthread_cond_broadcast(&gc);
    pthread_mutex_unlock(&gl);
    kvr_textpool_destroy(p);
    assert_int_equal(done_total, 6);
    for (int i = 0; i < 5; i++)
        assert_int_equal(atomic_load(&q[i].done_count), 1);
}

struct submitter {
    struct kvr_textpool *p;
    struct tjob *jobs;
    int n, accepted, refused;
};

static void *submit_main(void *arg)
{
    struct submitter *s = arg;
    for (int i = 0; i < s->n; i++) {
        job_init(&s->jobs[i]);
        int rc = kvr_textpool_submit(s->p, &s->jobs[i].pj);
        if (rc == 0)
            s->accepted++;
        else if (rc == -EAGAIN)
            s->refused++;
        else
            fail_msg("submit: %d", rc);
    }
    return NULL;
}

/* Four submitters at once against two workers and a small queue: accepted + refused = all,
 * every accepted job done once, the counters agree. */
static void test_concurrent_submit(void **state)
{
    enum { T = 4, N = 3000 };
    struct kvr_textpool *p;
    struct submitter sub[T];
    pthread_t th[T];
    struct kvr_textpool_stats st;
    int accepted = 0, refused = 0;
    (void)state;
    reset_done();
    assert_int_equal(kvr_textpool_create(2, 16, ctx_create, ctx_destroy, NULL, &p), 0);
    for (int i = 0; i < T; i++) {
        sub[i] = (struct submitter){p, calloc(N, sizeof(struct tjob)), N, 0, 0};
        assert_non_null(sub[i].jobs);
        assert_int_equal(pthread_create(&th[i], NULL, submit_main, &sub[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        accepted += sub[i].accepted;
        refused += sub[i].refused;
    }
    assert_int_equal(accepted + refused, T * N);
    wait_done(accepted);
    kvr_textpool_stats(p, &st);
    assert_int_equal(st.jobs, (uint64_t)accepted);
    assert_int_equal(st.rejected, (uint64_t)refused);
    kvr_textpool_destroy(p);
    for (int i = 0; i < T; i++) {
        for (int k = 0; k < N; k++)
            assert_true(atomic_load(&sub[i].jobs[k].done_count) <= 1);
        free(sub[i].jobs);
    }
    printf("test_textpool: %d accepted, %d refused by the queue bound\n", accepted, refused);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_refusals),
        cmocka_unit_test(test_all_done),
        cmocka_unit_test(test_bound_and_cancel),
        cmocka_unit_test(test_destroy_finishes_queued),
        cmocka_unit_test(test_concurrent_submit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
