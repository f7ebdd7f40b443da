/* http_int.h — what http.c (sockets, timers, connections, loops) and http_text.c (the
 * hand-off of large texts to the text threads) share, private to them: the connection, loop
 * and server structures, and the few calls each makes of the other. Not a contract for other
 * modules: http.h is.
 */
#ifndef KVR_HTTP_INT_H
#define KVR_HTTP_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/buf.h"
#include "http/http.h"
#include "http/httpapi.h"
#include "http/httpreq.h"
#include "http/textpool.h"

#define READ_BUF_SIZE (256u * 1024u)
#define LISTEN_BACKLOG 1024
#define LINGER_MS 2000
#define STOP_WRITE_MS 2000
#define MAX_THREADS 64

struct loop_thread;
struct conn;

/* A request on the text threads: a copy of what the handler reads, and its answer. */
struct job {
    struct kvr_textpool_job pj; /* first: the pool's callbacks get &pj */
    struct loop_thread *lt;
    struct conn *c;          /* loop thread only: NULL once the connection closed */
    struct kvr_httpreq req;  /* points into path, ctype, body */
    char path[KVR_HTTPREQ_URL_MAX + 1];
    char ctype[KVR_HTTPREQ_CTYPE_MAX + 1];
    char session[KVR_HTTPREQ_SESSION_MAX + 1]; /* the session header's value, copied */
    struct kvr_buf body;     /* the request body, owned */
    struct kvr_buf out;      /* the answer's body (the text thread's, then the loop's) */
    struct kvr_httpresp resp;
    struct job *done_next;   /* on lt->done_head */
    bool back;               /* loop thread: returned, its answer not framed yet because the
                              * connection's output was being written (on_write frames it) */
};

struct conn {
    uv_tcp_t tcp; /* first: handle->data is the conn for both handles */
    uv_timer_t timer;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    struct loop_thread *lt;
    struct kvr_httpconn hc;
    size_t write_len;     /* bytes of hc.out owned by the pending uv_write */
    int64_t write_start;
    int64_t linger_start;
    int64_t timer_due;    /* when the armed timer fires; INT64_MAX when not armed */
    int open_handles;
    bool writing;
    bool close_after_write; /* final response queued: linger-close once it is written */
    bool lingering;
    bool closing;           /* uv_close issued */
    bool reading;           /* uv_read_start in effect */
    bool probe;             /* over the cap: counted in probe_conns, not open_conns */
    bool resume_queued;     /* on lt->resume_head: continue parsing next loop iteration */
    struct conn *resume_next;
    struct job *job;        /* its request on the text threads, or NULL */
    struct conn *prev, *next;
};

struct loop_thread {
    struct kvr_http *h;
    int idx;
    uv_loop_t loop;
    bool loop_inited;
    uv_tcp_t listener;
    bool has_listener;
    uv_tcp_t admin;
    bool has_admin;
    uv_async_t stop_async;
    bool has_async;
    pthread_t thread;
    bool started;
    bool stopping;          /* loop thread only */
    int64_t stop_deadline;  /* loop thread only: pending writes are cut after this */
    struct kvr_httpstats stats;
    struct kvr_httpapi_thread *api_thread;
    struct kvr_buf scratch;
    char *rbuf;
    struct conn *conns;     /* loop thread only */
    uv_idle_t idle;         /* runs queued resumes (see conn_flush) */
    bool has_idle;
    struct conn *resume_head; /* loop thread only: connections waiting for their turn */
    uv_async_t done_async;  /* text jobs finished: drained by on_done */
    bool has_done_async;
    pthread_mutex_t done_lock; /* done_head; held by a worker while it pushes and signals */
    struct job *done_head;  /* done_lock: finished jobs, newest first */
    unsigned pending_jobs;  /* loop thread only: jobs submitted and not yet back */
};

struct kvr_http {
    const struct kvr_conf *conf;
    struct kvr_httpapi *api;
    struct kvr_httpreq_limits lim;
    struct kvr_httpreq_limits probe_lim; /* lim, idle wait cut to request_timeout */
    int nthreads;           /* public loops: lts[0, nthreads) */
    int nloops;             /* + the admin loop, lts[nthreads], when admin_listen is set */
    struct loop_thread *lts;
    struct kvr_httpstats *stats_ptrs[MAX_THREADS + 2]; /* the loops', then the text threads' */
    struct kvr_textpool *pool; /* NULL: [tokenizer] threads = 0 or no tokenizers */
    struct kvr_httpstats pool_stats; /* the text threads' handler-level limit counts */
    size_t offload_bytes;
    _Atomic uint64_t open_conns;
    _Atomic uint64_t probe_conns;
    uint32_t max_conns;
    uint32_t max_probe_conns;
    int port;
    int admin_port;
    bool started;
    bool stopped;
};

/* http.c */
void kvr_http_conn_flush(struct conn *c, bool resume_now); /* write out; resume parsing now,
                                                           * or on the next iteration */
void kvr_http_conn_rearm(struct conn *c);

/* http_text.c */
/* The kvr_httpreq_handler of every connection (arg: the conn): inline, or a text job. */
void kvr_http_text_handle(void *arg, const struct kvr_httpreq *req, struct kvr_httpresp *resp);
/* The loop's done_async callback: returned jobs' answers framed (or parked behind a write). */
void kvr_http_text_done(uv_async_t *a);
/* The connection's returned job (c->job->back, no write pending): its answer into out. */
void kvr_http_text_finish(struct conn *c);
/* The connection closes while c->job is set. */
void kvr_http_text_forget(struct conn *c);
int kvr_http_text_pool_create(struct kvr_http *h, unsigned threads, unsigned queue);
void kvr_http_text_metrics(struct kvr_http *h, struct kvr_buf *out);

#endif
