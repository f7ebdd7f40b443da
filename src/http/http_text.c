/* http_text.c — the HTTP layer's side of the text threads (http.c's design note has the whole
 * story): which requests leave the loop, the job that carries one (a copy of the request,
 * its answer), the hand-back to the loop (a list under the loop's done_lock plus its async
 * handle), and framing the answer on the loop once no write owns the connection's output.
 * Why a file of its own: http.c is the sockets, timers and connections; this is the
 * hand-off, with its own lifetime rules (a job never points into a connection; the
 * connection points to its job).
 * Threads: job_run/job_done on a text thread; everything else on the connection's loop.
 */
#include "http/http_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/metrics.h"
#include "http/httpapi.h"

static void job_free(struct job *j)
{
    kvr_buf_free(&j->body);
    kvr_buf_free(&j->out);
    free(j);
}

/* Text thread: the handler, with this thread's context, into the job's own buffer. */
static void job_run(void *ctx, struct kvr_textpool_job *pj)
{
    struct job *j = (struct job *)pj;

    kvr_httpapi_handle(ctx, &j->req, &j->resp);
}

/* Text thread: back to the loop (push and signal under done_lock: see the design note). */
static void job_done(struct kvr_textpool_job *pj)
{
    struct job *j = (struct job *)pj;
    struct loop_thread *lt = j->lt;

    pthread_mutex_lock(&lt->done_lock);
    j->done_next = lt->done_head;
    lt->done_head = j;
    uv_async_send(&lt->done_async);
    pthread_mutex_unlock(&lt->done_lock);
}

/* A copy of req the job owns; the body taken from the connection when it was gathered there
 * (no copy), else copied out of the loop's read buffer. NULL when out of memory. */
static struct job *job_create(struct conn *c, const struct kvr_httpreq *req)
{
    struct job *j = calloc(1, sizeof(*j));

    if (j == NULL)
        return NULL;
    j->pj.run = job_run;
    j->pj.done = job_done;
    atomic_init(&j->pj.cancelled, false);
    j->lt = c->lt;
    j->c = c;
    kvr_buf_init(&j->out);
    kvr_buf_init(&j->body);
    if (req->body_len > 0 && req->body == c->hc.body.data) {
        j->body = c->hc.body;
        kvr_buf_init(&c->hc.body);
    } else if (req->body_len > 0) {
        kvr_buf_append(&j->body, req->body, req->body_len);
        if (j->body.oom) {
            job_free(j);
            return NULL;
        }
    }
    memcpy(j->path, req->path, req->path_len);
    j->path[req->path_len] = '\0';
    snprintf(j->ctype, sizeof(j->ctype), "%s", req->content_type);
    j->req = *req;
    j->req.path = j->path;
    j->req.content_type = j->ctype;
    j->req.auth = NULL; /* the text endpoints take no token */
    j->req.auth_len = 0;
    if (req->session != NULL) { /* /v1/route's session key: the connection's copy goes on */
        memcpy(j->session, req->session, req->session_len);
        j->session[req->session_len] = '\0';
        j->req.session = j->session;
    }
    j->req.body = req->body_len > 0 ? j->body.data : NULL;
    j->resp = (struct kvr_httpresp){.status = 200, .endpoint = KVR_EP_OTHER,
                                     .content_type = "application/json", .body = &j->out};
    return j;
}

void kvr_http_text_handle(void *arg, const struct kvr_httpreq *req, struct kvr_httpresp *resp)
{
    struct conn *c = arg;
    struct loop_thread *lt = c->lt;
    struct kvr_http *h = lt->h;
    enum kvr_http_ep ep;
    struct job *j;

    if (h->pool == NULL || lt->stopping ||
        (ep = kvr_httpapi_offload(h->api, req, h->offload_bytes)) == KVR_EP_OTHER ||
        (j = job_create(c, req)) == NULL) {
        kvr_httpapi_handle(lt->api_thread, req, resp);
        return;
    }
    if (kvr_textpool_submit(h->pool, &j->pj) != 0) {
        job_free(j);
        kvr_httpreq_stats_limit(&lt->stats, KVR_LIMIT_TEXT_QUEUE);
        resp->endpoint = ep;
        resp->status = 503;
        resp->extra_headers = "Retry-After: 1\r\n";
        kvr_httpreq_error_body(resp->body, "too many large texts are waiting to be tokenized "
                                           "([tokenizer] queue); retry later");
        return;
    }
    c->job = j;
    lt->pending_jobs++;
    resp->deferred = true;
}

/* The connection closes with its job out: a returned one is freed here; otherwise it is
 * cancelled (a queued one is not tokenized) and forgotten, and kvr_http_text_done frees it
 * when it comes back. */
void kvr_http_text_forget(struct conn *c)
{
    struct job *j = c->job;

    c->job = NULL;
    if (j->back) { /* returned already: nobody else holds it */
        job_free(j);
        return;
    }
    kvr_textpool_cancel(&j->pj);
    j->c = NULL;
}

void kvr_http_text_finish(struct conn *c)
{
    struct job *j = c->job;

    KVR_ASSERT(j != NULL && j->back && !c->writing);
    c->job = NULL;
    if (!j->pj.ran) { /* cancelled while queued by a stop (on_stop): not tokenized */
        j->resp.status = 503;
        j->resp.extra_headers = "Retry-After: 1\r\n";
        kvr_httpreq_error_body(&j->out, "shutting down");
    }
    if (kvr_httpreq_conn_finish(&c->hc, &j->resp, (int64_t)uv_now(&c->lt->loop)) ==
        KVR_HTTPCONN_CLOSE)
        c->close_after_write = true;
    job_free(j);
    kvr_http_conn_flush(c, false);
    kvr_http_conn_rearm(c);
}

void kvr_http_text_done(uv_async_t *a)
{
    struct loop_thread *lt = a->data;
    struct job *j, *fifo = NULL;

    pthread_mutex_lock(&lt->done_lock);
    j = lt->done_head;
    lt->done_head = NULL;
    pthread_mutex_unlock(&lt->done_lock);
    while (j != NULL) { /* newest first: reverse */
        struct job *next = j->done_next;
        j->done_next = fifo;
        fifo = j;
        j = next;
    }
    while ((j = fifo) != NULL) {
        struct conn *c = j->c;
        fifo = j->done_next;
        lt->pending_jobs--;
        if (c == NULL) { /* its connection closed meanwhile */
            job_free(j);
            continue;
        }
        j->back = true;
        if (!c->writing) /* else out belongs to a write: on_write frames the answer */
            kvr_http_text_finish(c);
    }
    if (lt->stopping && lt->pending_jobs == 0 && lt->has_done_async &&
        !uv_is_closing((uv_handle_t *)&lt->done_async))
        uv_close((uv_handle_t *)&lt->done_async, NULL);
}

/* Each text thread's context: a handler context of its own (tokenizer reader with the
 * token limit, score context, buffers), its limit counts in pool_stats. */
static int pool_ctx_create(void *arg, unsigned i, void **ctx)
{
    struct kvr_http *h = arg;
    struct kvr_httpapi_thread *t;
    int rc = kvr_httpapi_thread_create(h->api, &h->pool_stats, &t);
    (void)i;
    if (rc == 0)
        *ctx = t;
    return rc;
}

static void pool_ctx_destroy(void *arg, void *ctx)
{
    (void)arg;
    kvr_httpapi_thread_destroy(ctx);
}

int kvr_http_text_pool_create(struct kvr_http *h, unsigned threads, unsigned queue)
{
    return kvr_textpool_create(threads, queue, pool_ctx_create, pool_ctx_destroy, h, &h->pool);
}

void kvr_http_text_metrics(struct kvr_http *h, struct kvr_buf *out)
{
    struct kvr_textpool_stats ps;

    if (h->pool == NULL)
        return;
    kvr_textpool_stats(h->pool, &ps);
    kvr_metrics_gauge(out, "text_threads", "Text threads ([tokenizer] threads)", NULL,
                      (double)ps.threads);
    kvr_metrics_gauge(out, "text_queued", "Large texts waiting for a text thread", NULL,
                      (double)ps.queued);
    kvr_metrics_gauge(out, "text_running", "Large texts being tokenized on the text threads",
                      NULL, (double)ps.running);
    kvr_metrics_counter(out, "text_jobs_total",
                        "Requests handed to the text threads ([tokenizer] offload_bytes)", NULL,
                        ps.jobs);
    kvr_metrics_counter(out, "text_rejected_total",
                        "Requests answered 503 because [tokenizer] queue texts were waiting",
                        NULL, ps.rejected);
    kvr_metrics_counter(out, "text_cancelled_total",
                        "Queued texts not tokenized (their connection closed, or shutdown)",
                        NULL, ps.cancelled);
}
