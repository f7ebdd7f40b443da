/* textpool.h — a bounded pool of text threads ([tokenizer] threads): the HTTP loops hand it
 * the requests whose tokenization or chat rendering would hold a loop for long (a large
 * prompt), and it runs them on its own threads, each with a context of its own (the HTTP
 * layer gives every worker a tokenizer reader, a score context and buffers).
 *
 * Why our own threads rather than libuv's threadpool (uv_queue_work): libuv's pool is one
 * per process, sized by the UV_THREADPOOL_SIZE environment variable, shared with every loop's
 * file-system and DNS work, and its queue is unbounded; we need a queue bound that answers
 * 503 at once, a per-worker context that lives as long as the worker (tokenizer scratch,
 * score buffers: megabytes each, not to be built per job), and a size the configuration sets.
 *
 * Contract:
 * - kvr_textpool_submit() queues a job (FIFO, shared by every loop), or refuses it with
 *   -EAGAIN when `queue` jobs already wait (running jobs do not count), counted.
 * - Every accepted job is finished exactly once: a worker calls job->run(ctx, job) and then
 *   job->done(job), both on the worker thread; a job cancelled before a worker took it is
 *   not run, only done. done() hands the job back to its owner (for HTTP, a loop's queue
 *   plus uv_async_send); after done() the pool never touches the job again.
 * - kvr_textpool_cancel() may be called by the job's owner at any time before done() ran
 *   on the owner's side; it only spares the work when the job has not started.
 * - kvr_textpool_destroy(): the jobs still queued are finished as cancelled (done() is
 *   called), running ones finish, the workers are joined and their contexts destroyed.
 * Threads: submit and cancel from any thread; stats from any thread (relaxed counters).
 */
#ifndef KVR_TEXTPOOL_H
#define KVR_TEXTPOOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct kvr_textpool;

struct kvr_textpool_job {
    void (*run)(void *ctx, struct kvr_textpool_job *j); /* the work, with the worker's ctx */
    void (*done)(struct kvr_textpool_job *j);           /* always, after run (or instead) */
    _Atomic bool cancelled;
    bool ran;                                           /* set before done: run was called */
    struct kvr_textpool_job *next;                      /* the pool's, while queued */
};

struct kvr_textpool_stats {
    uint64_t threads, queued, running; /* gauges */
    uint64_t jobs, rejected, cancelled; /* since create: accepted, refused (full), skipped */
};

/* threads >= 1 workers, at most queue_cap waiting jobs (>= 1). ctx_create(arg, i, &ctx) makes
 * worker i's context on the caller's thread before any worker starts (0 or -errno: create
 * fails with it); ctx_destroy(arg, ctx) at destroy, after the workers are joined. Returns 0,
 * -EINVAL, -ENOMEM or a ctx_create/pthread error. */
int kvr_textpool_create(unsigned threads, unsigned queue_cap,
                        int (*ctx_create)(void *arg, unsigned i, void **ctx),
                        void (*ctx_destroy)(void *arg, void *ctx), void *arg,
                        struct kvr_textpool **out);
/* 0 (queued: done() will be called), -EAGAIN (the queue is full) or -ESHUTDOWN (destroying);
 * on error the job is the caller's again and neither callback runs. */
int kvr_textpool_submit(struct kvr_textpool *p, struct kvr_textpool_job *j);
void kvr_textpool_cancel(struct kvr_textpool_job *j);
void kvr_textpool_stats(struct kvr_textpool *p, struct kvr_textpool_stats *st);
void kvr_textpool_destroy(struct kvr_textpool *p);

#endif
