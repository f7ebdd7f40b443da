/* textpool.c — the text threads: a FIFO of jobs under one mutex, N workers (textpool.h has
 * the contract and why these are not libuv's threadpool).
 *
 * Invariants: `queued` is the length of the list head..tail (at most cap); a job is on the
 * list, or held by exactly one worker between the pop and its done(), or its owner's. The
 * lock is held only to link and unlink: run() and done() are called without it, so a
 * done() that takes its owner's lock (the HTTP loop's completion list) never nests under ours.
 * Threads: workers "kvr-text-N"; submit/cancel/stats from any thread; create/destroy from one.
 */
#include "http/textpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct kvr_textpool {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct kvr_textpool_job *head, *tail; /* lock */
    unsigned queued, cap;                 /* lock */
    bool stopping;                        /* lock */
    unsigned nthreads;
    pthread_t *threads;
    void **ctx;
    void (*ctx_destroy)(void *arg, void *ctx);
    void *arg;
    struct worker *workers;
    _Atomic uint64_t running, jobs, rejected, cancelled;
};

struct worker {
    struct kvr_textpool *p;
    unsigned idx;
};

static void finish(struct kvr_textpool *p, struct kvr_textpool_job *j, void *ctx)
{
    if (ctx != NULL && !atomic_load_explicit(&j->cancelled, memory_order_acquire)) {
        j->run(ctx, j);
        j->ran = true;
    } else {
        atomic_fetch_add_explicit(&p->cancelled, 1, memory_order_relaxed);
    }
    j->done(j); /* the job is its owner's from here */
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kvr_textpool *p = w->p;
    char name[16];

    snprintf(name, sizeof(name), "kvr-text-%u", w->idx);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->head == NULL && !p->stopping)
            pthread_cond_wait(&p->wake, &p->lock);
        if (p->head == NULL) /* stopping and nothing left */
            break;
        struct kvr_textpool_job *j = p->head;
        p->head = j->next;
        if (p->head == NULL)
            p->tail = NULL;
        p->queued--;
        bool stopping = p->stopping;
        pthread_mutex_unlock(&p->lock);
        atomic_fetch_add_explicit(&p->running, 1, memory_order_relaxed);
        finish(p, j, stopping ? NULL : p->ctx[w->idx]);
        atomic_fetch_sub_explicit(&p->running, 1, memory_order_relaxed);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int kvr_textpool_create(unsigned threads, unsigned queue_cap,
                        int (*ctx_create)(void *arg, unsigned i, void **ctx),
                        void (*ctx_destroy)(void *arg, void *ctx), void *arg,
                        struct kvr_textpool **out)
{
    struct kvr_textpool *p;
    unsigned made = 0, started = 0;
    int rc = 0;

    if (threads == 0 || queue_cap == 0 || ctx_create == NULL || out == NULL)
        return -EINVAL;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    p->threads = calloc(threads, sizeof(*p->threads));
    p->ctx = calloc(threads, sizeof(*p->ctx));
    p->workers = calloc(threads, sizeof(*p->workers));
    if (p->threads == NULL || p->ctx == NULL || p->workers == NULL) {
        rc = -ENOMEM;
        goto fail_alloc;
    }
    p->cap = queue_cap;
    p->ctx_destroy = ctx_destroy;
    p->arg = arg;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    for (; made < threads; made++)
        if ((rc = ctx_create(arg, made, &p->ctx[made])) != 0)
            goto fail_ctx;
    for (; started < threads; started++) {
        p->workers[started] = (struct worker){p, started};
        if ((rc = pthread_create(&p->threads[started], NULL, worker_main,
                                 &p->workers[started])) != 0) {
            rc = -rc;
            goto fail_threads;
        }
    }
    p->nthreads = threads;
    *out = p;
    return 0;

fail_threads:
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < started; i++)
        pthread_join(p->threads[i], NULL);
fail_ctx:
    for (unsigned i = 0; i < made; i++)
        if (ctx_destroy != NULL)
            ctx_destroy(arg, p->ctx[i]);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
fail_alloc:
    free(p->threads);
    free(p->ctx);
    free(p->workers);
    free(p);
    return rc;
}

int kvr_textpool_submit(struct kvr_textpool *p, struct kvr_textpool_job *j)
{
    j->next = NULL;
    j->ran = false;
    pthread_mutex_lock(&p->lock);
    if (p->stopping) {
        pthread_mutex_unlock(&p->lock);
        return -ESHUTDOWN;
    }
    if (p->queued >= p->cap) {
        pthread_mutex_unlock(&p->lock);
        atomic_fetch_add_explicit(&p->rejected, 1, memory_order_relaxed);
        return -EAGAIN;
    }
    if (p->tail != NULL)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    p->queued++;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_add_explicit(&p->jobs, 1, memory_order_relaxed);
    return 0;
}

void kvr_textpool_cancel(struct kvr_textpool_job *j)
{
    atomic_store_explicit(&j->cancelled, true, memory_order_release);
}

void kvr_textpool_stats(struct kvr_textpool *p, struct kvr_textpool_stats *st)
{
    pthread_mutex_lock(&p->lock);
    st->queued = p->queued;
    pthread_mutex_unlock(&p->lock);
    st->threads = p->nthreads;
    st->running = atomic_load_explicit(&p->running, memory_order_relaxed);
    st->jobs = atomic_load_explicit(&p->jobs, memory_order_relaxed);
    st->rejected = atomic_load_explicit(&p->rejected, memory_order_relaxed);
    st->cancelled = atomic_load_explicit(&p->cancelled, memory_order_relaxed);
}

void kvr_textpool_destroy(struct kvr_textpool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stopping = true; /* workers finish what is queued as cancelled, then exit */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    for (unsigned i = 0; i < p->nthreads; i++)
        if (p->ctx_destroy != NULL)
            p->ctx_destroy(p->arg, p->ctx[i]);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p->ctx);
    free(p->workers);
    free(p);
}
