/* httpreq.c — HTTP/1.1 request parsing, limits, pipelining and response framing for one
 * connection, with no socket in sight (the libuv layer in http.c feeds it bytes).
 *
 * Design:
 * - http-parser callbacks copy only what the handler needs: the request target (bounded),
 *   Content-Type, Authorization and Expect values (bounded), and the body. A body that arrives
 *   in one piece inside the current read buffer is handed to the handler in place (zero copy);
 *   otherwise it is gathered in the connection's body buffer, which is reused across requests.
 * - Every limit is checked in exactly one callback (see httpreq.h for the table); a callback
 *   that rejects records the status and returns non-zero, which stops the parser; the feed
 *   then appends the error response and marks the connection closing.
 * - Requests are answered synchronously in on_message_complete, so pipelined requests get
 *   their responses in order in `out` without any queue; or, when the handler defers one
 *   (a large text for the text threads), parsing pauses right after it until the socket
 *   layer hands its answer to kvr_httpreq_conn_finish(): order is kept the same way.
 * - The clock is the caller's (now_ms per feed), so timeouts are testable without sleeping.
 * Threads: the connection's loop thread only.
 */
#include "http/httpreq.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "http/jtok.h"
#include "core/log.h"
#include "core/metrics.h"

#define BUF_KEEP_MAX (1u << 20) /* buffers larger than this are freed once idle */
/* http-parser's own header-size check fires before it hands us the URL or header bytes of
 * the current buffer, so it would answer 431 for an over-long URL. Our callbacks count and
 * bound the URL (414) and header bytes (431) themselves; the parser's limit stays only as a
 * backstop for bytes no callback sees (whitespace, blank lines), far above any feed. */
#define PARSER_MAX_HEADER_SIZE (64u << 20)

enum { HDR_NONE = 0, HDR_CTYPE, HDR_AUTH, HDR_EXPECT, HDR_SESSION };

static const char *const ep_names[KVR_EP_COUNT] = {
    "other", "score", "pods", "pod_delete", "endpoints", "healthz", "readyz", "metrics",
    "tokenize", "route",
};

static const char *const limit_names[KVR_LIMIT_COUNT] = {
    "body_bytes",       "header_bytes",  "headers",     "uri",    "request_timeout",
    "idle_timeout",     "write_timeout", "connections", "tokens", "text_queue",
};

const char *kvr_httpreq_ep_name(enum kvr_http_ep ep)
{
    return (unsigned)ep < KVR_EP_COUNT ? ep_names[ep] : "other";
}

const char *kvr_httpreq_limit_name(enum kvr_http_limit l)
{
    return (unsigned)l < KVR_LIMIT_COUNT ? limit_names[l] : "?";
}

static inline void inc(_Atomic uint64_t *v)
{
    atomic_fetch_add_explicit(v, 1, memory_order_relaxed);
}

void kvr_httpreq_stats_limit(struct kvr_httpstats *st, enum kvr_http_limit l)
{
    if ((unsigned)l < KVR_LIMIT_COUNT)
        inc(&st->limits[l]);
}

static uint64_t rd(const _Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

void kvr_httpreq_stats_render(struct kvr_httpstats *const *st, size_t n, uint64_t open_conns,
                              struct kvr_buf *out)
{
    static const char *const classes[4] = {"2xx", "3xx", "4xx", "5xx"};
    char labels[96];
    bool first = true;

    for (int ep = 0; ep < KVR_EP_COUNT; ep++) {
        for (int k = 0; k < 4; k++) {
            uint64_t sum = 0;
            for (size_t i = 0; i < n; i++)
                sum += rd(&st[i]->requests[ep][k]);
            snprintf(labels, sizeof(labels), "endpoint=\"%s\",code=\"%s\"", ep_names[ep],
                     classes[k]);
            kvr_metrics_counter(out, "http_requests_total",
                                first ? "HTTP requests answered, by endpoint and status class"
                                      : NULL,
                                labels, sum);
            first = false;
        }
    }
    for (int l = 0; l < KVR_LIMIT_COUNT; l++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += rd(&st[i]->limits[l]);
        snprintf(labels, sizeof(labels), "kind=\"%s\"", limit_names[l]);
        kvr_metrics_counter(out, "http_limit_rejections_total",
                            l == 0 ? "Requests or connections refused or closed by a limit"
                                   : NULL,
                            labels, sum);
    }
#define SUM(field, name, help)                                    \
    do {                                                          \
        uint64_t s_ = 0;                                          \
        for (size_t i = 0; i < n; i++)                            \
            s_ += rd(&st[i]->field);                              \
        kvr_metrics_counter(out, name, help, NULL, s_);           \
    } while (0)
    SUM(bad_requests, "http_malformed_requests_total", "Requests rejected by the HTTP parser");
    SUM(accepted, "http_connections_accepted_total", "Connections accepted");
    SUM(closed, "http_connections_closed_total", "Connections closed");
    SUM(bytes_in, "http_received_bytes_total", "Bytes read from HTTP clients");
    SUM(bytes_out, "http_sent_bytes_total", "Bytes written to HTTP clients");
    SUM(output_pauses, "http_output_pauses_total",
        "Times a connection stopped being read because max_output_bytes of responses waited");
#undef SUM
    kvr_metrics_gauge(out, "http_connections_open", "Connections open now", NULL,
                      (double)open_conns);
}

/* ---- responses -------------------------------------------------------------------------- */

const char *kvr_httpreq_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
    }
}

static char *put_str(char *w, const char *s)
{
    size_t n = strlen(s);
    memcpy(w, s, n);
    return w + n;
}

static char *put_u64(char *w, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *w++ = tmp[--n];
    return w;
}

static void write_response_conn(struct kvr_buf *out, int status, const char *ctype,
                                const char *extra, const char *body, size_t body_len,
                                int conn_hdr)
{
    size_t hdr_max = 160 + strlen(ctype) + (extra ? strlen(extra) : 0);
    char *w;

    if (status < 100 || status > 999)
        status = 500;
    if (kvr_buf_reserve(out, hdr_max + body_len) != 0)
        return;
    w = out->data + out->len;
    w = put_str(w, "HTTP/1.1 ");
    w = put_u64(w, (uint64_t)status);
    *w++ = ' ';
    w = put_str(w, kvr_httpreq_reason(status));
    w = put_str(w, "\r\nServer: kvrouterd\r\nContent-Type: ");
    w = put_str(w, ctype);
    w = put_str(w, "\r\nContent-Length: ");
    w = put_u64(w, body_len);
    w = put_str(w, "\r\n");
    if (conn_hdr == 1)
        w = put_str(w, "Connection: close\r\n");
    else if (conn_hdr == 2)
        w = put_str(w, "Connection: keep-alive\r\n");
    if (extra != NULL)
        w = put_str(w, extra);
    w = put_str(w, "\r\n");
    if (body_len)
        memcpy(w, body, body_len);
    w += body_len;
    out->len = (size_t)(w - out->data);
    out->data[out->len] = '\0';
}

void kvr_httpreq_write_response(struct kvr_buf *out, int status, const char *content_type,
                                const char *extra_headers, const char *body, size_t body_len,
                                bool close)
{
    write_response_conn(out, status, content_type ? content_type : "application/json",
                        extra_headers, body, body_len, close ? 1 : 0);
}

void kvr_httpreq_error_body(struct kvr_buf *out, const char *msg)
{
    size_t n = strlen(msg);

    kvr_buf_reset(out);
    if (kvr_buf_reserve(out, 16 + 6 * n) != 0)
        return;
    memcpy(out->data, "{\"error\":", 9);
    out->len = 9;
    out->len += kvr_jtok_escape(out->data + out->len, msg, n);
    out->data[out->len++] = '}';
    out->data[out->len++] = '\n';
    out->data[out->len] = '\0';
}

static void count_request(struct kvr_httpconn *c, enum kvr_http_ep ep, int status)
{
    int k = status / 100 - 2;
    if (k < 0 || k > 3)
        k = 3;
    if ((unsigned)ep >= KVR_EP_COUNT)
        ep = KVR_EP_OTHER;
    inc(&c->stats->requests[ep][k]);
}

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Bytes a terminal could act on, quotes and backslashes become \xHH. */
static size_t log_escape(char *dst, const char *src, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t w = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)src[i];
        if (ch < 0x20 || ch >= 0x7f || ch == '"' || ch == '\\') {
            dst[w++] = '\\';
            dst[w++] = 'x';
            dst[w++] = hex[ch >> 4];
            dst[w++] = hex[ch & 15];
        } else {
            dst[w++] = (char)ch;
        }
    }
    dst[w] = '\0';
    return w;
}

/* One access-log line for the response just appended (bytes long). started: the request
 * line was at least begun (method and URL so far are known). */
static void access_log(struct kvr_httpconn *c, bool started, int status, size_t bytes)
{
    char path[4 * KVR_HTTPREQ_URL_MAX + 1];
    int64_t us = started ? mono_us() - c->req_start_us : 0;

    if (!c->lim->access_log)
        return;
    log_escape(path, c->url, started ? c->url_len : 0);
    kvr_log_info("access: %s \"%s %s\" %d %zu %lld.%03lldms",
                 c->remote[0] ? c->remote : "-",
                 started && c->url_seen ? http_method_str((enum http_method)c->parser.method)
                                        : "-",
                 started && c->url_len ? path : "-", status, bytes, (long long)(us / 1000),
                 (long long)(us % 1000));
}

/* An error produced by this layer: JSON body, Connection: close. */
static void conn_error(struct kvr_httpconn *c, int status, const char *msg)
{
    size_t before = c->out.len;

    kvr_httpreq_error_body(c->scratch, msg);
    write_response_conn(&c->out, status, "application/json", NULL, c->scratch->data,
                        c->scratch->len, 1);
    count_request(c, KVR_EP_OTHER, status);
    access_log(c, c->in_request, status, c->out.len - before);
    c->closing = true;
    c->in_request = false;
}

/* ---- parser callbacks ------------------------------------------------------------------- */

static int reject(struct kvr_httpconn *c, int status, const char *msg, int limit)
{
    if (c->reject_status == 0) {
        c->reject_status = status;
        c->reject_msg = msg;
        if (limit >= 0)
            kvr_httpreq_stats_limit(c->stats, (enum kvr_http_limit)limit);
    }
    return -1;
}

static int add_header_bytes(struct kvr_httpconn *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->lim->max_header_bytes)
        return reject(c, 431, "request headers too large", KVR_LIMIT_HEADER_BYTES);
    return 0;
}

/* The request line is over: its target joins the header bytes. */
static int count_url(struct kvr_httpconn *c)
{
    if (c->url_counted)
        return 0;
    c->url_counted = true;
    return add_header_bytes(c, c->url_len);
}

static int on_message_begin(http_parser *p)
{
    struct kvr_httpconn *c = p->data;

    c->in_request = true;
    c->req_start_ms = c->now_ms;
    if (c->lim->access_log)
        c->req_start_us = mono_us();
    c->header_bytes = 0;
    c->nheaders = 0;
    c->last_was_value = false;
    c->cur_header = HDR_NONE;
    c->field_len = 0;
    c->field_long = false;
    c->url_len = 0;
    c->url_counted = false;
    c->url_seen = false;
    c->ctype_len = 0;
    c->auth_len = 0;
    c->auth_present = false;
    c->auth_long = false;
    c->expect_continue = false;
    c->session_len = 0;
    c->session_present = false;
    c->session_long = false;
    c->body_ptr = NULL;
    c->body_len = 0;
    c->body_copied = false;
    kvr_buf_reset(&c->body);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    struct kvr_httpconn *c = p->data;

    c->url_seen = true; /* the method is complete (for the access log) */
    /* The target counts towards max_header_bytes only once it is complete (count_url), so
     * an over-long one is 414 however long it is and in however many pieces it comes. */
    if (c->url_len + len > KVR_HTTPREQ_URL_MAX)
        return reject(c, 414, "request target too long", KVR_LIMIT_URI);
    memcpy(c->url + c->url_len, at, len);
    c->url_len += len;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct kvr_httpconn *c = p->data;

    if (count_url(c) != 0)
        return -1;
    if (c->nheaders == 0 || c->last_was_value) { /* a new header (not a split name) */
        c->nheaders++;
        if (c->nheaders > c->lim->max_headers)
            return reject(c, 431, "too many request headers", KVR_LIMIT_HEADERS);
        c->field_len = 0;
        c->field_long = false;
        c->last_was_value = false;
        if (add_header_bytes(c, 4) != 0) /* ": " and CRLF */
            return -1;
    }
    if (add_header_bytes(c, len) != 0)
        return -1;
    if (c->field_len + len >= sizeof(c->field)) {
        c->field_long = true;
    } else {
        memcpy(c->field + c->field_len, at, len);
        c->field_len += len;
    }
    return 0;
}

static bool field_is(const struct kvr_httpconn *c, const char *name)
{
    size_t n = strlen(name);
    return !c->field_long && c->field_len == n && strncasecmp(c->field, name, n) == 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct kvr_httpconn *c = p->data;

    if (!c->last_was_value) {
        c->last_was_value = true;
        if (field_is(c, "content-type")) {
            c->cur_header = HDR_CTYPE;
            c->ctype_len = 0;
        } else if (field_is(c, "authorization")) {
            c->cur_header = HDR_AUTH;
            c->auth_len = 0;
            c->auth_long = false;
            c->auth_present = true;
        } else if (field_is(c, "expect")) {
            c->cur_header = HDR_EXPECT;
            c->expect_continue = false;
        } else if (c->lim->session_header[0] != '\0' && field_is(c, c->lim->session_header)) {
            c->cur_header = HDR_SESSION; /* a repeated header: the last one */
            c->session_len = 0;
            c->session_long = false;
            c->session_present = true;
        } else {
            c->cur_header = HDR_NONE;
        }
    }
    if (add_header_bytes(c, len) != 0)
        return -1;
    switch (c->cur_header) {
    case HDR_CTYPE:
        if (c->ctype_len + len <= KVR_HTTPREQ_CTYPE_MAX) {
            memcpy(c->ctype + c->ctype_len, at, len);
            c->ctype_len += len;
        } else {
            c->ctype_len = KVR_HTTPREQ_CTYPE_MAX; /* truncated: will not match a known type */
        }
        break;
    case HDR_AUTH:
        if (c->auth_len + len <= KVR_HTTPREQ_AUTH_MAX) {
            memcpy(c->auth + c->auth_len, at, len);
            c->auth_len += len;
        } else {
            c->auth_long = true;
        }
        break;
    case HDR_SESSION:
        if (c->session_len + len <= KVR_HTTPREQ_SESSION_MAX) {
            memcpy(c->session + c->session_len, at, len);
            c->session_len += len;
        } else {
            c->session_long = true;
        }
        break;
    case HDR_EXPECT:
        /* http-parser hands the value in one piece unless it straddles reads; a split
         * "100-continue" is simply not honoured (the client sends the body after its wait) */
        if (len == 12 && strncasecmp(at, "100-continue", 12) == 0)
            c->expect_continue = true;
        break;
    default:
        break;
    }
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct kvr_httpconn *c = p->data;

    if (count_url(c) != 0)
        return -1;
    if (p->upgrade)
        return reject(c, 400, "protocol upgrade is not supported", -1);
    if (p->http_major != 1)
        return reject(c, 400, "unsupported HTTP version (HTTP/1.0 and HTTP/1.1 only)", -1);
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->lim->max_body)
        return reject(c, 413, "request body too large", KVR_LIMIT_BODY);
    if (c->expect_continue &&
        ((p->flags & F_CHUNKED) || ((p->flags & F_CONTENTLENGTH) && p->content_length > 0)))
        kvr_buf_append(&c->out, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct kvr_httpconn *c = p->data;
    size_t have = c->body_copied ? c->body.len : c->body_len;

    if (have + len > c->lim->max_body)
        return reject(c, 413, "request body too large", KVR_LIMIT_BODY);
    if (!c->body_copied && c->body_ptr == NULL) {
        c->body_ptr = at; /* zero copy while it stays one piece of this buffer */
        c->body_len = len;
        return 0;
    }
    if (!c->body_copied) {
        if ((p->flags & F_CONTENTLENGTH) && kvr_buf_reserve(&c->body, c->body_len + len +
                                                                         p->content_length) != 0)
            return reject(c, 503, "out of memory", -1);
        kvr_buf_append(&c->body, c->body_ptr, c->body_len);
        c->body_copied = true;
        c->body_ptr = NULL;
    }
    kvr_buf_append(&c->body, at, len);
    if (c->body.oom)
        return reject(c, 503, "out of memory", -1);
    return 0;
}

/* The response to the current request (handler's answer in resp, body in resp->body):
 * framed into out, counted, logged; the connection made ready for the next request. keep:
 * the request allows keep-alive; http10: an HTTP/1.0 request. Returns -1 when nothing after
 * it may be parsed (closing). */
static int respond(struct kvr_httpconn *c, const struct kvr_httpresp *resp, bool keep,
                   bool http10)
{
    const struct kvr_buf *body = resp->body;
    int conn_hdr;
    size_t before;

    keep = keep && !resp->close;
    conn_hdr = !keep ? 1 : http10 ? 2 : 0;
    before = c->out.len;
    write_response_conn(&c->out, resp->status, resp->content_type, resp->extra_headers,
                        body->data, body->len, conn_hdr);
    count_request(c, resp->endpoint, resp->status);
    access_log(c, true, resp->status, c->out.len - before);

    c->in_request = false;
    c->idle_since_ms = c->now_ms;
    c->body_ptr = NULL;
    c->body_len = 0;
    if (c->body.cap > BUF_KEEP_MAX)
        kvr_buf_free(&c->body);
    if (!keep) {
        c->closing = true;
        return -1;
    }
    if (c->lim->max_output > 0 && c->out.len > c->lim->max_output) {
        /* the client is not reading its answers: stop here, keep the rest of the input */
        c->paused = true;
        inc(&c->stats->output_pauses);
        http_parser_pause(&c->parser, 1);
    }
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct kvr_httpconn *c = p->data;
    struct kvr_httpreq req;
    struct kvr_httpresp resp;
    char *q;
    int rc;

    c->url[c->url_len] = '\0';
    c->ctype[c->ctype_len] = '\0';
    c->auth[c->auth_len] = '\0';
    memset(&req, 0, sizeof(req));
    req.method = (int)p->method;
    req.path = c->url;
    q = memchr(c->url, '?', c->url_len);
    req.path_len = q ? (size_t)(q - c->url) : c->url_len;
    if (q)
        *q = '\0';
    req.content_type = c->ctype;
    req.auth = c->auth_present ? c->auth : NULL;
    req.auth_len = c->auth_len;
    req.auth_truncated = c->auth_long;
    c->session[c->session_len] = '\0';
    req.session_truncated = c->session_present && c->session_long;
    if (c->session_present && !c->session_long && c->session_len > 0) {
        req.session = c->session;
        req.session_len = c->session_len;
    }
    req.has_length = (p->flags & (F_CONTENTLENGTH | F_CHUNKED)) != 0;
    if (c->body_copied) {
        req.body = c->body.data;
        req.body_len = c->body.len;
    } else if (c->body_ptr != NULL) {
        req.body = (char *)(uintptr_t)c->body_ptr; /* inside the caller's mutable buffer */
        req.body_len = c->body_len;
    }
    req.admin = c->admin;
    req.probe_only = c->probe_only;

    memset(&resp, 0, sizeof(resp));
    resp.status = 200;
    resp.endpoint = KVR_EP_OTHER;
    resp.content_type = "application/json";
    resp.body = c->scratch;
    kvr_buf_reset(c->scratch);
    c->handler(c->handler_arg, &req, &resp);
    if (q)
        *q = '?'; /* the access log shows the whole target */
    if (resp.deferred) {
        /* answered later (kvr_httpreq_conn_finish): nothing after this request is parsed
         * meanwhile, so pipelined responses stay in order */
        c->waiting = true;
        c->wait_keep = http_should_keep_alive(p);
        c->wait_http10 = p->http_major == 1 && p->http_minor == 0;
        c->in_request = false;
        c->paused = true;
        http_parser_pause(p, 1);
        return 0;
    }
    if (c->scratch->oom) {
        resp.status = 500;
        kvr_httpreq_error_body(c->scratch, "out of memory");
    }
    rc = respond(c, &resp, http_should_keep_alive(p),
                 p->http_major == 1 && p->http_minor == 0);
    return rc;
}

int kvr_httpreq_conn_finish(struct kvr_httpconn *c, struct kvr_httpresp *resp, int64_t now_ms)
{
    if (!c->waiting)
        return 0;
    c->waiting = false;
    c->now_ms = now_ms;
    if (resp->body->oom) {
        resp->status = 500;
        kvr_httpreq_error_body(resp->body, "out of memory");
    }
    if (respond(c, resp, c->wait_keep, c->wait_http10) != 0)
        return KVR_HTTPCONN_CLOSE;
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- connection ------------------------------------------------------------------------- */

static void set_parser_limit(void)
{
    http_parser_set_max_header_size(PARSER_MAX_HEADER_SIZE);
}

void kvr_httpreq_conn_init(struct kvr_httpconn *c, const struct kvr_httpreq_limits *lim,
                           struct kvr_httpstats *stats, kvr_httpreq_handler handler, void *arg,
                           struct kvr_buf *scratch, bool admin, int64_t now_ms)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, set_parser_limit);
    memset(c, 0, sizeof(*c));
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->lim = lim;
    c->stats = stats;
    c->handler = handler;
    c->handler_arg = arg;
    c->scratch = scratch;
    c->admin = admin;
    c->idle_since_ms = now_ms;
    c->now_ms = now_ms;
    kvr_buf_init(&c->body);
    kvr_buf_init(&c->out);
    kvr_buf_init(&c->in);
}

void kvr_httpreq_conn_deinit(struct kvr_httpconn *c)
{
    kvr_buf_free(&c->body);
    kvr_buf_free(&c->out);
    kvr_buf_free(&c->in);
}

/* Parses data[0..len); data may be c->in.data itself (resume). */
static int parse(struct kvr_httpconn *c, char *data, size_t len)
{
    size_t done;
    enum http_errno e;

    done = http_parser_execute(&c->parser, &settings, data, len);
    e = HTTP_PARSER_ERRNO(&c->parser);

    if (e == HPE_PAUSED && c->reject_status == 0 && !c->closing) {
        size_t rest = len - done; /* paused right after a complete request: no body pending */
        if (data == c->in.data) {
            memmove(c->in.data, data + done, rest);
            c->in.len = rest;
        } else {
            kvr_buf_reset(&c->in);
            kvr_buf_append(&c->in, data + done, rest);
            if (c->in.oom) {
                conn_error(c, 503, "out of memory");
                return KVR_HTTPCONN_CLOSE;
            }
        }
        return 0;
    }

    if (c->reject_status != 0) {
        conn_error(c, c->reject_status, c->reject_msg);
        return KVR_HTTPCONN_CLOSE;
    }
    if (c->closing)
        return KVR_HTTPCONN_CLOSE;
    if (e != HPE_OK) {
        char msg[160];
        if (e == HPE_HEADER_OVERFLOW) {
            kvr_httpreq_stats_limit(c->stats, KVR_LIMIT_HEADER_BYTES);
            conn_error(c, 431, "request headers too large");
            return KVR_HTTPCONN_CLOSE;
        }
        inc(&c->stats->bad_requests);
        snprintf(msg, sizeof(msg), "malformed HTTP request: %s", http_errno_description(e));
        conn_error(c, 400, msg);
        return KVR_HTTPCONN_CLOSE;
    }
    if (done != len) { /* upgrade or CONNECT: already rejected above; be safe */
        inc(&c->stats->bad_requests);
        conn_error(c, 400, "malformed HTTP request");
        return KVR_HTTPCONN_CLOSE;
    }
    /* a body still arriving must not point into this buffer after we return */
    if (c->in_request && c->body_ptr != NULL && !c->body_copied) {
        uint64_t want = (c->parser.flags & F_CONTENTLENGTH) ? c->parser.content_length : 0;
        if (want > c->body_len)
            kvr_buf_reserve(&c->body, want);
        kvr_buf_append(&c->body, c->body_ptr, c->body_len);
        c->body_copied = true;
        c->body_ptr = NULL;
        if (c->body.oom) {
            conn_error(c, 503, "out of memory");
            return KVR_HTTPCONN_CLOSE;
        }
    }
    return 0;
}

int kvr_httpreq_conn_feed(struct kvr_httpconn *c, char *data, size_t len, int64_t now_ms)
{
    if (c->closing)
        return KVR_HTTPCONN_CLOSE;
    c->now_ms = now_ms;
    atomic_fetch_add_explicit(&c->stats->bytes_in, len, memory_order_relaxed);
    if (c->paused) { /* the caller should not feed now; keep the bytes in order */
        kvr_buf_append(&c->in, data, len);
        if (c->in.oom) {
            conn_error(c, 503, "out of memory");
            return KVR_HTTPCONN_CLOSE;
        }
        return 0;
    }
    return parse(c, data, len);
}

int kvr_httpreq_conn_resume(struct kvr_httpconn *c, int64_t now_ms)
{
    int rc;

    if (c->closing)
        return KVR_HTTPCONN_CLOSE;
    if (!c->paused || c->waiting ||
        (c->lim->max_output > 0 && c->out.len > c->lim->max_output))
        return 0;
    c->now_ms = now_ms;
    c->paused = false;
    http_parser_pause(&c->parser, 0);
    if (c->in.len == 0)
        return 0; /* (a zero-length execute would mean EOF to http-parser) */
    rc = parse(c, c->in.data, c->in.len);
    if (!c->paused) {
        kvr_buf_reset(&c->in);
        if (c->in.cap > BUF_KEEP_MAX)
            kvr_buf_free(&c->in);
    }
    return rc;
}

int kvr_httpreq_conn_eof(struct kvr_httpconn *c)
{
    c->closing = true;
    c->in_request = false;
    return KVR_HTTPCONN_CLOSE;
}

int64_t kvr_httpreq_conn_deadline(const struct kvr_httpconn *c)
{
    if (c->waiting) /* the request is in; its answer is being computed (bounded work) */
        return INT64_MAX;
    if (c->in_request)
        return c->req_start_ms + c->lim->request_timeout_ms;
    return c->idle_since_ms + c->lim->idle_timeout_ms;
}

int kvr_httpreq_conn_timeout(struct kvr_httpconn *c, int64_t now_ms)
{
    if (c->closing || c->waiting)
        return 0;
    if (now_ms < kvr_httpreq_conn_deadline(c))
        return 0;
    if (c->in_request) {
        kvr_httpreq_stats_limit(c->stats, KVR_LIMIT_REQUEST_TIMEOUT);
        conn_error(c, 408, "request not received in time");
        return KVR_HTTPCONN_CLOSE;
    }
    kvr_httpreq_stats_limit(c->stats, KVR_LIMIT_IDLE_TIMEOUT);
    c->closing = true;
    return KVR_HTTPCONN_CLOSE_NOW;
}

void kvr_httpreq_conn_consumed(struct kvr_httpconn *c, size_t n)
{
    atomic_fetch_add_explicit(&c->stats->bytes_out, n, memory_order_relaxed);
    if (n >= c->out.len) {
        kvr_buf_reset(&c->out);
        if (c->out.cap > BUF_KEEP_MAX)
            kvr_buf_free(&c->out);
        return;
    }
    memmove(c->out.data, c->out.data + n, c->out.len - n);
    c->out.len -= n;
    c->out.data[c->out.len] = '\0';
}
