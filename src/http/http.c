/* http.c — the libuv front end: listeners, loop threads, connections, timers, writes.
 *
 * Design:
 * - [http] threads loop threads. Each has its own uv_loop and its own listening socket on the
 *   same port (SO_REUSEPORT when there is more than one thread, so the kernel spreads
 *   connections); the admin listener, when configured, has a loop thread of its own, so a
 *   slow admin answer (GET /v1/snapshot takes the whole index, a purge waits for a writer,
 *   /metrics renders every series) never delays scoring on the public loops. Sockets are created
 *   and bound on the caller's thread in kvr_http_start(), so bind errors come back with the
 *   address; loops run only after every handle is set up.
 * - A connection is a uv_tcp_t plus one uv_timer_t and the protocol state of httpreq.c.
 *   Reads land in the loop's single read buffer (read callbacks run one at a time on the
 *   loop), are parsed in place, and requests are answered inline on the loop thread
 *   (httpapi.c); responses accumulate in the connection's `out` buffer, reused across
 *   requests. A flush tries uv_try_write first; if the socket is full the rest goes through
 *   uv_write and reading pauses until it completes (backpressure: `out` is never appended to
 *   while a write owns it).
 * - Bounded output: one read of pipelined requests could produce far more response bytes
 *   than it holds (256 KiB of "GET /metrics" is ~10,000 responses). httpreq stops parsing
 *   once [http] max_output_bytes of responses wait and keeps the rest of the read; we stop
 *   reading, write, and resume parsing (then reading) once `out` drained. So a connection
 *   holds at most about max_output_bytes + one response + one read buffer. Fairness: one
 *   callback resumes a connection at most once (up to max_output_bytes of answers); when
 *   the socket took them all and input is still kept, the connection queues itself on the
 *   loop's idle handle and continues on the next loop iteration, after other connections'
 *   I/O, so a fast pipeliner cannot hold the loop for a whole read buffer of requests.
 * - Timers: one per connection, armed lazily: it is restarted only when the deadline moves
 *   earlier; when it fires early it re-arms for the real deadline. Request deadline (408),
 *   idle keep-alive and a stuck write (idle_timeout while a write is pending) close it.
 * - Closing after a final response is a lingering close: shutdown(SHUT_WR) after the write,
 *   then read and discard for up to LINGER_MS so the client sees the response rather than a
 *   reset caused by unread bytes.
 * - The connection cap is one atomic counter shared by the loops: over it, up to [http]
 *   probe_connections more are accepted as probe-only connections (httpapi answers /healthz
 *   and /readyz on them, 503 to anything else, and closes after one answer; the request
 *   must arrive within request_timeout), so a liveness probe still gets its 200 while
 *   clients hold every slot. Past that, a connection is accepted, answered 503 with
 *   uv_try_write, and closed (counted as a limit rejection).
 * - Large texts go to the text threads (textpool.h, [tokenizer] threads; the hand-off is
 *   http_text.c, what the two files share http_int.h): a POST to an
 *   endpoint that tokenizes or renders, with a body of [tokenizer] offload_bytes or more
 *   (httpapi decides which), becomes a job that owns a copy of the request (the body is
 *   taken from the connection's buffer, or copied out of the loop's read buffer) and runs
 *   the same handler with a text thread's own context. httpreq stops parsing after it, so
 *   pipelined answers keep their order; the connection keeps reading (bounded: one read
 *   buffer of input) so it sees a reset or EOF. A finished job is queued to its loop and
 *   the loop's async handle drains the queue: the answer is framed and written at once, and
 *   the rest of the connection's input is parsed on the next loop iteration (the idle
 *   queue), after the other connections' ready work; a connection has at most one job, so
 *   a client pipelining large bodies takes turns with the others in the pool's FIFO. Queue
 *   full: 503 with Retry-After, counted (http_limit_rejections_total{kind="text_queue"}).
 *   Lifetime: a job never points into a connection; the connection points to its job. A
 *   connection closed meanwhile (reset, write error, stop) cancels the job (a queued one is
 *   not run) and forgets it; the loop frees the job when it comes back. EOF while a job
 *   runs (a half-closing client) answers, then closes. The loop's done handle closes only
 *   once none of its jobs is out, so a worker never signals a closed handle (it pushes and
 *   signals under the loop's done_lock, which the drain takes too).
 * - Stop: an async handle per loop closes the listeners and every connection (waiting for a
 *   pending write or text job to finish), then the loop ends and the thread is joined; the
 *   text threads are joined after the loops.
 * Threads: the public functions run on the main thread; everything else on the loop threads.
 */
#include "http/http.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "core/buf.h"
#include "http/http_int.h"
#include "http/httpapi.h"
#include "http/httpreq.h"
#include "http/textpool.h"
#include "core/log.h"

static void conn_rearm(struct conn *c);
static void conn_flush(struct conn *c);
static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* ---- metrics callback ------------------------------------------------------------------ */

static void server_metrics(void *arg, struct kvr_buf *out)
{
    struct kvr_http *h = arg;

    kvr_httpreq_stats_render(h->stats_ptrs, (size_t)h->nloops + 1,
                             atomic_load_explicit(&h->open_conns, memory_order_relaxed), out);
    kvr_http_text_metrics(h, out);
}

/* ---- connection teardown -------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *handle)
{
    struct conn *c = handle->data;

    if (--c->open_handles > 0)
        return;
    kvr_httpreq_conn_deinit(&c->hc);
    free(c);
}

static void conn_close(struct conn *c)
{
    struct loop_thread *lt = c->lt;

    if (c->closing)
        return;
    c->closing = true;
    if (c->job != NULL)
        kvr_http_text_forget(c);
    if (c->resume_queued) { /* freed in the close callback: off the queue first */
        struct conn **pp = &lt->resume_head;
        while (*pp != c)
            pp = &(*pp)->resume_next;
        *pp = c->resume_next;
        c->resume_queued = false;
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        lt->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    atomic_fetch_sub_explicit(c->probe ? &lt->h->probe_conns : &lt->h->open_conns, 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&lt->stats.closed, 1, memory_order_relaxed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct conn *c = req->data;
    if (status != 0 && !c->closing)
        conn_close(c); /* peer gone: nothing to linger for */
}

/* After the final response was written: FIN, then discard input for a while. */
static void conn_linger(struct conn *c)
{
    if (c->closing || c->lingering)
        return;
    if (c->lt->stopping) { /* shutting down: no lingering */
        conn_close(c);
        return;
    }
    c->lingering = true;
    c->linger_start = (int64_t)uv_now(&c->lt->loop);
    c->sreq.data = c;
    if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    /* read (and discard) until EOF or the linger deadline; reading may have been paused by
     * the write that just finished */
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    c->reading = true;
    uv_timer_stop(&c->timer);
    c->timer_due = INT64_MAX;
    conn_rearm(c);
}

/* ---- timers ---------------------------------------------------------------------------- */

static int64_t conn_deadline(struct conn *c)
{
    if (c->lingering)
        return c->linger_start + LINGER_MS;
    if (c->writing) {
        int64_t d = c->write_start + c->lt->h->lim.idle_timeout_ms;
        /* stopping: a response still being written gets STOP_WRITE_MS, not the idle timeout */
        return c->lt->stopping && c->lt->stop_deadline < d ? c->lt->stop_deadline : d;
    }
    return kvr_httpreq_conn_deadline(&c->hc);
}

static void on_timer(uv_timer_t *t)
{
    struct conn *c = t->data;
    int64_t now = (int64_t)uv_now(&c->lt->loop);
    int rc;

    c->timer_due = INT64_MAX;
    if (c->closing)
        return;
    if (now < conn_deadline(c)) {
        conn_rearm(c);
        return;
    }
    if (c->lingering) {
        conn_close(c);
        return;
    }
    if (c->writing) { /* the client does not read its responses */
        kvr_httpreq_stats_limit(&c->lt->stats, KVR_LIMIT_WRITE_TIMEOUT);
        conn_close(c);
        return;
    }
    rc = kvr_httpreq_conn_timeout(&c->hc, now);
    if (rc == KVR_HTTPCONN_CLOSE_NOW) {
        conn_close(c);
        return;
    }
    if (rc == KVR_HTTPCONN_CLOSE) {
        c->close_after_write = true;
        conn_flush(c);
        return;
    }
    conn_rearm(c);
}

static void conn_rearm(struct conn *c)
{
    int64_t due, now;

    if (c->closing)
        return;
    due = conn_deadline(c);
    if (due >= c->timer_due)
        return; /* the armed timer fires earlier and re-arms then */
    now = (int64_t)uv_now(&c->lt->loop);
    c->timer_due = due;
    uv_timer_start(&c->timer, on_timer, due > now ? (uint64_t)(due - now) : 0, 0);
}

/* ---- reads and writes ------------------------------------------------------------------ */

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = handle->data;
    (void)suggested;
    buf->base = c->lt->rbuf;
    buf->len = READ_BUF_SIZE;
}

static void on_write(uv_write_t *req, int status)
{
    struct conn *c = req->data;

    c->writing = false;
    if (c->closing)
        return;
    if (status != 0) {
        conn_close(c);
        return;
    }
    kvr_httpreq_conn_consumed(&c->hc, c->write_len);
    c->write_len = 0;
    if (c->job != NULL && c->job->back) /* its answer waited for this write */
        kvr_http_text_finish(c);
    else
        conn_flush(c); /* more output (a 408 queued meanwhile, paused input), linger or read */
    conn_rearm(c);
}

/* Writes out what it can; what the socket does not take goes to uv_write and reading stops
 * until it completes. Once out is empty: resumes paused parsing (which may produce more
 * output: loop), then lingers after a final response or (re)starts reading. */
static void on_idle(uv_idle_t *idle)
{
    struct loop_thread *lt = idle->data;
    struct conn *c = lt->resume_head;

    lt->resume_head = NULL; /* conns re-queued meanwhile wait for the next iteration */
    uv_idle_stop(idle);
    while (c != NULL) {
        struct conn *next = c->resume_next;
        c->resume_queued = false;
        c->resume_next = NULL;
        conn_flush(c);
        conn_rearm(c);
        c = next;
    }
}

/* Continue this connection's paused input on the next loop iteration. */
static void conn_queue_resume(struct conn *c)
{
    struct loop_thread *lt = c->lt;

    if (c->resume_queued)
        return;
    c->resume_queued = true;
    c->resume_next = lt->resume_head;
    lt->resume_head = c;
    uv_idle_start(&lt->idle, on_idle);
}

/* resume_now false: a paused connection's input waits for the next loop iteration (after a
 * text job's answer: the others' ready work goes first). */
static void conn_flush_mode(struct conn *c, bool resume_now)
{
    uv_buf_t b;
    int n, rc;
    bool resumed = !resume_now;

    for (;;) {
        if (c->closing || c->writing)
            return;
        if (c->hc.out.len > 0) {
            b = uv_buf_init(c->hc.out.data, (unsigned)c->hc.out.len);
            n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
            if (n < 0 && n != UV_EAGAIN) {
                conn_close(c);
                return;
            }
            if (n > 0)
                kvr_httpreq_conn_consumed(&c->hc, (size_t)n);
            if (c->hc.out.len > 0) {
                b = uv_buf_init(c->hc.out.data, (unsigned)c->hc.out.len);
                c->write_len = c->hc.out.len;
                c->wreq.data = c;
                if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
                    conn_close(c);
                    return;
                }
                c->writing = true;
                c->write_start = (int64_t)uv_now(&c->lt->loop);
                if (c->reading) {
                    uv_read_stop((uv_stream_t *)&c->tcp);
                    c->reading = false;
                }
                conn_rearm(c);
                return;
            }
        }
        if (!c->hc.paused || c->close_after_write || c->lingering || c->hc.waiting)
            break;
        if (resumed || c->lt->stopping) { /* one round per callback: the rest waits */
            if (!c->lt->stopping)
                conn_queue_resume(c);
            break;
        }
        resumed = true;
        rc = kvr_httpreq_conn_resume(&c->hc, (int64_t)uv_now(&c->lt->loop));
        if (rc == KVR_HTTPCONN_CLOSE)
            c->close_after_write = true;
        else if (c->hc.paused && c->hc.out.len == 0)
            break; /* cannot happen (paused means out > max_output); never spin */
    }
    if (c->close_after_write) {
        if (c->job == NULL) /* else: once its answer is written */
            conn_linger(c);
        return;
    }
    if (c->hc.paused) {
        /* waiting for a text job: read on (a reset or EOF shows), up to one read buffer */
        bool more = c->hc.waiting && c->hc.in.len < READ_BUF_SIZE;
        if (more && !c->reading) {
            if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
                conn_close(c);
                return;
            }
            c->reading = true;
        } else if (!more && c->reading) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->reading = false;
        }
        return;
    }
    if (!c->reading && !c->lingering) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
            conn_close(c);
            return;
        }
        c->reading = true;
    }
}

static void conn_flush(struct conn *c)
{
    conn_flush_mode(c, true);
}

void kvr_http_conn_flush(struct conn *c, bool resume_now)
{
    conn_flush_mode(c, resume_now);
}

void kvr_http_conn_rearm(struct conn *c)
{
    conn_rearm(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    int rc;

    if (c->closing)
        return;
    if (nread < 0) { /* EOF or error: a partial request is dropped */
        if (c->lingering || nread != UV_EOF || (!c->writing && c->job == NULL))
            conn_close(c);
        else /* a half-close: the answer being written, or computed, is still sent */
            c->close_after_write = true;
        return;
    }
    if (nread == 0 || c->lingering || c->close_after_write)
        return; /* lingering: discard */
    rc = kvr_httpreq_conn_feed(&c->hc, buf->base, (size_t)nread, (int64_t)uv_now(&c->lt->loop));
    if (rc == KVR_HTTPCONN_CLOSE)
        c->close_after_write = true;
    conn_flush(c);
    conn_rearm(c);
}

/* ---- accept ---------------------------------------------------------------------------- */

static void on_reject_closed(uv_handle_t *handle)
{
    free(handle);
}

static void reject_conn(struct loop_thread *lt, uv_stream_t *server)
{
    static const char body[] = "{\"error\":\"too many connections\"}\n";
    uv_tcp_t *t = malloc(sizeof(*t));
    struct kvr_buf out;
    uv_buf_t b;

    kvr_httpreq_stats_limit(&lt->stats, KVR_LIMIT_CONNECTIONS);
    if (t == NULL || uv_tcp_init(&lt->loop, t) != 0) {
        free(t);
        return;
    }
    if (uv_accept(server, (uv_stream_t *)t) == 0) {
        kvr_buf_init(&out);
        kvr_httpreq_write_response(&out, 503, NULL, NULL, body, sizeof(body) - 1, true);
        if (!out.oom) {
            b = uv_buf_init(out.data, (unsigned)out.len);
            (void)uv_try_write((uv_stream_t *)t, &b, 1);
        }
        kvr_buf_free(&out);
    }
    uv_close((uv_handle_t *)t, on_reject_closed);
}

/* "IP:PORT" or "[IPv6]:PORT" of the peer, for the access log. */
static void peer_name(uv_tcp_t *tcp, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN];

    out[0] = '\0';
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        if (uv_ip6_name(a, ip, sizeof(ip)) == 0)
            snprintf(out, cap, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        if (uv_ip4_name(a, ip, sizeof(ip)) == 0)
            snprintf(out, cap, "%s:%d", ip, ntohs(a->sin_port));
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    struct loop_thread *lt = server->data;
    struct kvr_http *h = lt->h;
    struct conn *c;
    bool admin = server == (uv_stream_t *)&lt->admin;
    bool probe = false;
    _Atomic uint64_t *counter;
    int64_t now;

    if (status != 0 || lt->stopping)
        return;
    counter = &h->open_conns;
    if (atomic_fetch_add_explicit(counter, 1, memory_order_relaxed) >= h->max_conns) {
        atomic_fetch_sub_explicit(counter, 1, memory_order_relaxed);
        /* over the cap: a probe-only slot, if one is free */
        probe = true;
        counter = &h->probe_conns;
        if (atomic_fetch_add_explicit(counter, 1, memory_order_relaxed) >= h->max_probe_conns) {
            atomic_fetch_sub_explicit(counter, 1, memory_order_relaxed);
            reject_conn(lt, server);
            return;
        }
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        atomic_fetch_sub_explicit(counter, 1, memory_order_relaxed);
        reject_conn(lt, server);
        return;
    }
    c->lt = lt;
    c->probe = probe;
    c->timer_due = INT64_MAX;
    if (uv_tcp_init(&lt->loop, &c->tcp) != 0) {
        free(c);
        atomic_fetch_sub_explicit(counter, 1, memory_order_relaxed);
        return;
    }
    uv_timer_init(&lt->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    now = (int64_t)uv_now(&lt->loop);
    kvr_httpreq_conn_init(&c->hc, probe ? &h->probe_lim : &h->lim, &lt->stats,
                          kvr_http_text_handle, c, &lt->scratch, admin, now);
    c->hc.probe_only = probe;
    c->next = lt->conns;
    if (lt->conns)
        lt->conns->prev = c;
    lt->conns = c;
    atomic_fetch_add_explicit(&lt->stats.accepted, 1, memory_order_relaxed);
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    if (h->lim.access_log)
        peer_name(&c->tcp, c->hc.remote, sizeof(c->hc.remote));
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    c->reading = true;
    conn_rearm(c);
}

/* ---- loops ------------------------------------------------------------------------------ */

static void on_listener_closed(uv_handle_t *handle)
{
    (void)handle;
}

static void on_stop(uv_async_t *a)
{
    struct loop_thread *lt = a->data;
    struct conn *c, *next;

    lt->stopping = true;
    lt->stop_deadline = (int64_t)uv_now(&lt->loop) + STOP_WRITE_MS;
    if (lt->has_listener)
        uv_close((uv_handle_t *)&lt->listener, on_listener_closed);
    if (lt->has_admin)
        uv_close((uv_handle_t *)&lt->admin, on_listener_closed);
    uv_close((uv_handle_t *)&lt->stop_async, NULL);
    if (lt->has_idle)
        uv_close((uv_handle_t *)&lt->idle, NULL);
    for (c = lt->conns; c != NULL; c = next) {
        next = c->next;
        if (c->job != NULL) /* a queued text is not tokenized: answered 503, then closed */
            kvr_textpool_cancel(&c->job->pj);
        if (c->writing || c->job != NULL) {
            c->close_after_write = true; /* finish the response (bounded), then close */
            conn_rearm(c);
        } else {
            conn_close(c);
        }
    }
    if (lt->has_done_async && lt->pending_jobs == 0) /* else kvr_http_text_done closes it */
        uv_close((uv_handle_t *)&lt->done_async, NULL);
}

static void *loop_main(void *arg)
{
    struct loop_thread *lt = arg;
    char name[16];

    if (lt->idx == lt->h->nthreads)
        snprintf(name, sizeof(name), "kvr-http-admin");
    else
        snprintf(name, sizeof(name), "kvr-http-%d", lt->idx);
    pthread_setname_np(pthread_self(), name);
    uv_run(&lt->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* A listening socket on addr; SO_REUSEPORT when several loops share the port. */
static int make_listener(struct loop_thread *lt, uv_tcp_t *tcp, const struct sockaddr *addr,
                         bool reuseport, const char *what, bool *inited, struct kvr_err *err)
{
    int fd, one = 1, rc;
    socklen_t alen = addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);

    fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kvr_err_set(err, -errno, "%s: socket: %s", what, strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
        rc = -errno;
        close(fd);
        return kvr_err_set(err, rc, "%s: SO_REUSEPORT: %s", what, strerror(-rc));
    }
    if (bind(fd, addr, alen) != 0) {
        rc = -errno;
        close(fd);
        return kvr_err_set(err, rc, "%s: bind: %s", what, strerror(-rc));
    }
    rc = uv_tcp_init(&lt->loop, tcp);
    if (rc == 0) {
        *inited = true; /* from here the caller closes the handle */
        rc = uv_tcp_open(tcp, fd);
    }
    if (rc != 0) {
        close(fd);
        return kvr_err_set(err, rc, "%s: %s", what, uv_strerror(rc));
    }
    tcp->data = lt;
    rc = uv_listen((uv_stream_t *)tcp, LISTEN_BACKLOG, on_connection);
    if (rc != 0)
        return kvr_err_set(err, rc, "%s: listen: %s", what, uv_strerror(rc));
    return 0;
}

static int resolve(const char *listen, struct sockaddr_storage *ss, struct kvr_err *err)
{
    char host[256];
    int port, rc;

    rc = kvr_conf_parse_hostport(listen, host, sizeof(host), &port);
    if (rc != 0)
        return kvr_err_set(err, -EINVAL, "bad listen address '%s'", listen);
    if (host[0] == '\0' || strcmp(host, "*") == 0)
        snprintf(host, sizeof(host), "0.0.0.0");
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    if (strcmp(host, "localhost") == 0 && uv_ip4_addr("127.0.0.1", port,
                                                      (struct sockaddr_in *)ss) == 0)
        return 0;
    return kvr_err_set(err, -EINVAL, "listen address '%s': host must be a numeric IP address",
                       listen);
}

static int bound_port(uv_tcp_t *tcp)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);

    if (uv_tcp_getsockname(tcp, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void set_port(struct sockaddr_storage *ss, int port)
{
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
}

/* ---- public API ------------------------------------------------------------------------- */

int kvr_http_create(const struct kvr_http_deps *deps, struct kvr_http **out, struct kvr_err *err)
{
    const struct kvr_conf *conf;
    struct kvr_http *h;
    struct kvr_httpapi_deps ad;
    int rc;

    if (deps == NULL || deps->conf == NULL || out == NULL)
        return kvr_err_set(err, -EINVAL, "http: missing configuration");
    conf = deps->conf;
    h = calloc(1, sizeof(*h));
    if (h == NULL)
        return kvr_err_set(err, -ENOMEM, "http: out of memory");
    h->conf = conf;
    h->nthreads = conf->http_threads ? (int)conf->http_threads : 1;
    if (h->nthreads > MAX_THREADS)
        h->nthreads = MAX_THREADS;
    h->nloops = h->nthreads + (conf->admin_listen != NULL && conf->admin_listen[0] != '\0');
    h->max_conns = conf->max_connections ? conf->max_connections : 10000;
    h->lim.max_body = conf->max_body_bytes > 0 ? (uint64_t)conf->max_body_bytes : 8u << 20;
    h->lim.max_header_bytes =
        conf->max_header_bytes > 0 ? (uint64_t)conf->max_header_bytes : 16u << 10;
    h->lim.max_headers = conf->max_headers ? conf->max_headers : 64;
    if (conf->route_session_header != NULL)
        snprintf(h->lim.session_header, sizeof(h->lim.session_header), "%s",
                 conf->route_session_header);
    h->lim.request_timeout_ms = conf->request_timeout_ms > 0 ? conf->request_timeout_ms : 10000;
    h->lim.idle_timeout_ms = conf->idle_timeout_ms > 0 ? conf->idle_timeout_ms : 60000;
    h->lim.max_output =
        conf->max_output_bytes > 0 ? (uint64_t)conf->max_output_bytes : 4u << 20;
    h->lim.access_log = conf->access_log;
    h->max_probe_conns = conf->probe_connections; /* 0 = none */
    h->probe_lim = h->lim;
    if (h->probe_lim.idle_timeout_ms > h->probe_lim.request_timeout_ms)
        h->probe_lim.idle_timeout_ms = h->probe_lim.request_timeout_ms;
    atomic_init(&h->open_conns, 0);
    atomic_init(&h->probe_conns, 0);

    memset(&ad, 0, sizeof(ad));
    ad.conf = conf;
    ad.score = deps->score;
    ad.ingest = deps->ingest;
    ad.zsub = deps->zsub;
    ad.index = deps->index;
    ad.snap = deps->snap;
    ad.tokset = deps->tokset;
    ad.route = deps->route;
    ad.models = deps->models;
    ad.load = deps->load;
    ad.share = deps->share;
    ad.admin_listener = conf->admin_listen != NULL && conf->admin_listen[0] != '\0';
    ad.public_introspection = conf->public_introspection;
    ad.server_metrics = server_metrics;
    ad.server_metrics_arg = h;
    rc = kvr_httpapi_create(&ad, &h->api);
    if (rc != 0) {
        free(h);
        return kvr_err_set(err, rc, "http: %s", strerror(-rc));
    }
    h->lts = calloc((size_t)h->nloops, sizeof(*h->lts));
    if (h->lts == NULL) {
        kvr_httpapi_destroy(h->api);
        free(h);
        return kvr_err_set(err, -ENOMEM, "http: out of memory");
    }
    for (int i = 0; i < h->nloops; i++) {
        struct loop_thread *lt = &h->lts[i];
        lt->h = h;
        lt->idx = i;
        pthread_mutex_init(&lt->done_lock, NULL);
        h->stats_ptrs[i] = &lt->stats;
        kvr_buf_init(&lt->scratch);
        lt->rbuf = malloc(READ_BUF_SIZE);
        rc = lt->rbuf == NULL ? -ENOMEM : kvr_httpapi_thread_create(h->api, &lt->stats,
                                                                    &lt->api_thread);
        if (rc != 0) {
            kvr_http_destroy(h);
            return kvr_err_set(err, rc, "http: loop %d: %s", i, strerror(-rc));
        }
    }
    h->stats_ptrs[h->nloops] = &h->pool_stats;
    h->offload_bytes = (size_t)conf->offload_bytes;
    bool texts = false; /* a model with a tokenizer at startup: else no text to hand off */
    for (size_t i = 0; i < conf->nmodels; i++)
        texts |= conf->models[i].tokenizer != NULL;
    if (deps->tokset != NULL && texts && conf->text_threads > 0) {
        rc = kvr_http_text_pool_create(h, conf->text_threads,
                                       conf->text_queue ? conf->text_queue : 64);
        if (rc != 0) {
            kvr_http_destroy(h);
            return kvr_err_set(err, rc, "http: text threads: %s", strerror(-rc));
        }
    }
    *out = h;
    return 0;
}

int kvr_http_start(struct kvr_http *h, struct kvr_err *err)
{
    struct sockaddr_storage main_addr, admin_addr;
    bool have_admin = h->conf->admin_listen != NULL && h->conf->admin_listen[0] != '\0';
    int rc;

    if (h->started)
        return kvr_err_set(err, -EALREADY, "http: already started");
    rc = resolve(h->conf->listen ? h->conf->listen : "0.0.0.0:8080", &main_addr, err);
    if (rc != 0)
        return rc;
    if (have_admin && (rc = resolve(h->conf->admin_listen, &admin_addr, err)) != 0)
        return rc;
    h->started = true;

    for (int i = 0; i < h->nloops; i++) {
        struct loop_thread *lt = &h->lts[i];
        char what[300];

        rc = uv_loop_init(&lt->loop);
        if (rc != 0) {
            kvr_err_set(err, rc, "http: loop: %s", uv_strerror(rc));
            goto fail;
        }
        lt->loop_inited = true;
        if (i < h->nthreads) {
            snprintf(what, sizeof(what), "http listen %s", h->conf->listen);
            rc = make_listener(lt, &lt->listener, (struct sockaddr *)&main_addr,
                               h->nthreads > 1, what, &lt->has_listener, err);
            if (rc != 0)
                goto fail;
        }
        if (i == 0) { /* every other loop binds the port the first one got */
            h->port = bound_port(&lt->listener);
            set_port(&main_addr, h->port);
        }
        if (i == h->nthreads && have_admin) { /* the admin loop */
            snprintf(what, sizeof(what), "http admin_listen %s", h->conf->admin_listen);
            rc = make_listener(lt, &lt->admin, (struct sockaddr *)&admin_addr, false, what,
                               &lt->has_admin, err);
            if (rc != 0)
                goto fail;
            h->admin_port = bound_port(&lt->admin);
        }
        rc = uv_async_init(&lt->loop, &lt->stop_async, on_stop);
        if (rc != 0) {
            kvr_err_set(err, rc, "http: async: %s", uv_strerror(rc));
            goto fail;
        }
        lt->stop_async.data = lt;
        lt->has_async = true;
        rc = uv_idle_init(&lt->loop, &lt->idle);
        if (rc != 0) {
            kvr_err_set(err, rc, "http: idle: %s", uv_strerror(rc));
            goto fail;
        }
        lt->idle.data = lt;
        lt->has_idle = true;
        rc = uv_async_init(&lt->loop, &lt->done_async, kvr_http_text_done);
        if (rc != 0) {
            kvr_err_set(err, rc, "http: async: %s", uv_strerror(rc));
            goto fail;
        }
        lt->done_async.data = lt;
        lt->has_done_async = true;
    }
    for (int i = 0; i < h->nloops; i++) {
        struct loop_thread *lt = &h->lts[i];
        rc = pthread_create(&lt->thread, NULL, loop_main, lt);
        if (rc != 0) {
            kvr_err_set(err, -rc, "http: thread: %s", strerror(rc));
            rc = -rc;
            goto fail;
        }
        lt->started = true;
    }
    kvr_log_info("http: listening on %s (port %d, %d loop thread%s)%s%s%s", h->conf->listen,
                 h->port, h->nthreads, h->nthreads > 1 ? "s" : "",
                 have_admin ? ", admin on " : "", have_admin ? h->conf->admin_listen : "",
                 have_admin ? " (a loop thread of its own)" : "");
    return 0;
fail:
    kvr_http_stop(h);
    return rc;
}

int kvr_http_port(const struct kvr_http *h)
{
    return h->port;
}

int kvr_http_admin_port(const struct kvr_http *h)
{
    return h->admin_port;
}

void kvr_http_set_ready(struct kvr_http *h, bool ready)
{
    kvr_httpapi_set_ready(h->api, ready);
}

int kvr_http_set_admin_token(struct kvr_http *h, const char *token)
{
    return kvr_httpapi_set_token(h->api, token);
}

void kvr_http_stop(struct kvr_http *h)
{
    if (h == NULL || h->stopped)
        return;
    h->stopped = true;
    kvr_httpapi_set_ready(h->api, false);
    for (int i = 0; i < h->nloops; i++) {
        struct loop_thread *lt = &h->lts[i];
        if (lt->started) {
            uv_async_send(&lt->stop_async);
            continue;
        }
        /* never ran: close what was set up and drain the loop here */
        if (!lt->loop_inited)
            continue;
        if (lt->has_listener)
            uv_close((uv_handle_t *)&lt->listener, NULL);
        if (lt->has_admin)
            uv_close((uv_handle_t *)&lt->admin, NULL);
        if (lt->has_async)
            uv_close((uv_handle_t *)&lt->stop_async, NULL);
        if (lt->has_idle)
            uv_close((uv_handle_t *)&lt->idle, NULL);
        if (lt->has_done_async)
            uv_close((uv_handle_t *)&lt->done_async, NULL);
        uv_run(&lt->loop, UV_RUN_DEFAULT);
    }
    for (int i = 0; i < h->nloops; i++) {
        struct loop_thread *lt = &h->lts[i];
        if (lt->started) {
            pthread_join(lt->thread, NULL);
            lt->started = false;
        }
        if (lt->loop_inited) {
            if (uv_loop_close(&lt->loop) != 0)
                kvr_log_warn("http: loop %d closed with handles still open", i);
            lt->loop_inited = false;
        }
    }
}

void kvr_http_destroy(struct kvr_http *h)
{
    if (h == NULL)
        return;
    if (h->started)
        kvr_http_stop(h);
    kvr_textpool_destroy(h->pool); /* after the loops: none of their jobs is out */
    for (int i = 0; h->lts != NULL && i < h->nloops; i++) {
        struct loop_thread *lt = &h->lts[i];
        kvr_httpapi_thread_destroy(lt->api_thread);
        kvr_buf_free(&lt->scratch);
        free(lt->rbuf);
        pthread_mutex_destroy(&lt->done_lock);
    }
    free(h->lts);
    kvr_httpapi_destroy(h->api);
    free(h);
}
