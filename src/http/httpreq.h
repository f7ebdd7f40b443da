/* httpreq.h — one HTTP/1.1 server connection's protocol state, without sockets.
 *
 * Bytes read from a socket go into kvr_httpreq_conn_feed(); it parses them with http-parser,
 * enforces the request limits (one place for each), calls the handler for every complete
 * request in arrival order (pipelining) and appends the responses to conn->out, which the
 * socket layer writes out. Timeouts are driven by the caller's clock: kvr_httpreq_conn_deadline()
 * says when to call kvr_httpreq_conn_timeout() next. Everything the socket layer must do comes
 * back as flags (close after flushing `out`, close now).
 *
 * Limits (counted in struct kvr_httpstats.limits, each with its response):
 *   Content-Length > max_body             → 413, connection closed, body never read
 *   chunked body growing past max_body    → 413, close
 *   header bytes > max_header_bytes       → 431, close      (request line + headers)
 *   header count > max_headers            → 431, close
 *   request target > KVR_HTTPREQ_URL_MAX  → 414, close      (checked before header bytes,
 *                                            so an over-long URL is 414 whatever its size)
 *   whole request not received within request_timeout → 408, close (slowloris)
 *   no request within idle_timeout after the last response → close without a response
 *   handler-level limits (tokens per query) are counted by the handler with
 *   kvr_httpreq_stats_limit().
 *   unsent output > max_output (pipelining without reading) → parsing pauses after the
 *                                            response that crossed it; the unparsed rest of
 *                                            the feed is kept (conn->in) until the socket
 *                                            layer drained out and calls
 *                                            kvr_httpreq_conn_resume(). Counted in
 *                                            output_pauses. The caller stops reading meanwhile.
 * Malformed requests get 400 and close. Responses are JSON {"error": "..."} for errors.
 * Exactly one response per bad request: every error response closes the connection.
 *
 * Access log (lim->access_log): one INFO line per response produced here:
 *   access: REMOTE "METHOD PATH" STATUS BYTES DURATIONms
 * PATH is the raw target (query included), bytes below 0x20, 0x7f and above, '"' and '\'
 * escaped as \xHH; METHOD "-" when the request line was not parsed; BYTES the response's
 * size on the wire; the duration runs from the request's first byte to its response.
 *
 * Threads: a connection belongs to the thread of its loop; stats are per thread (relaxed
 * atomics so another thread may sum them for /metrics).
 */
#ifndef KVR_HTTPREQ_H
#define KVR_HTTPREQ_H

#include <http_parser.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

#define KVR_HTTPREQ_URL_MAX 4096
#define KVR_HTTPREQ_CTYPE_MAX 128
#define KVR_HTTPREQ_AUTH_MAX 1024
#define KVR_HTTPREQ_SESSION_MAX 256 /* the session header's value ([route] session_header) */

/* Endpoints, for request counters. */
enum kvr_http_ep {
    KVR_EP_OTHER = 0, /* unrouted or rejected before routing */
    KVR_EP_SCORE,
    KVR_EP_PODS,
    KVR_EP_POD_DELETE,
    KVR_EP_ENDPOINTS,
    KVR_EP_HEALTHZ,
    KVR_EP_READYZ,
    KVR_EP_METRICS,
    KVR_EP_TOKENIZE,
    KVR_EP_ROUTE,
    KVR_EP_COUNT
};
const char *kvr_httpreq_ep_name(enum kvr_http_ep ep);

enum kvr_http_limit {
    KVR_LIMIT_BODY = 0,
    KVR_LIMIT_HEADER_BYTES,
    KVR_LIMIT_HEADERS,
    KVR_LIMIT_URI,
    KVR_LIMIT_REQUEST_TIMEOUT,
    KVR_LIMIT_IDLE_TIMEOUT,
    KVR_LIMIT_WRITE_TIMEOUT,
    KVR_LIMIT_CONNECTIONS,
    KVR_LIMIT_TOKENS,
    KVR_LIMIT_TEXT_QUEUE, /* 503: [tokenizer] queue large texts already wait (http.c) */
    KVR_LIMIT_COUNT
};
const char *kvr_httpreq_limit_name(enum kvr_http_limit l);

/* Per-thread counters; written by the owning thread, read by any (relaxed). */
struct kvr_httpstats {
    _Atomic uint64_t requests[KVR_EP_COUNT][4]; /* by status class 2xx, 3xx, 4xx, 5xx */
    _Atomic uint64_t limits[KVR_LIMIT_COUNT];
    _Atomic uint64_t bad_requests;   /* malformed HTTP (400 from the parser) */
    _Atomic uint64_t accepted;       /* connections accepted */
    _Atomic uint64_t closed;         /* connections closed */
    _Atomic uint64_t bytes_in;
    _Atomic uint64_t bytes_out;
    _Atomic uint64_t output_pauses;  /* parsing paused: max_output of unsent responses */
};
void kvr_httpreq_stats_limit(struct kvr_httpstats *st, enum kvr_http_limit l);
/* Renders the sums over n per-thread stats, plus the open-connections gauge. */
void kvr_httpreq_stats_render(struct kvr_httpstats *const *st, size_t n, uint64_t open_conns,
                              struct kvr_buf *out);

struct kvr_httpreq_limits {
    uint64_t max_body;
    uint64_t max_header_bytes;
    uint32_t max_headers;
    int64_t request_timeout_ms;
    int64_t idle_timeout_ms;
    uint64_t max_output;     /* unsent response bytes before parsing pauses; 0 = no limit */
    bool access_log;         /* one log line per request */
    char session_header[65]; /* the header captured as kvr_httpreq.session; "" = none */
};

/* A complete request, as the handler sees it. Strings are NUL-terminated and valid during the
 * handler call only. */
struct kvr_httpreq {
    int method;              /* enum http_method */
    const char *path;        /* raw (not decoded) path, without the query */
    size_t path_len;
    const char *content_type; /* "" when absent */
    const char *auth;         /* Authorization value, NULL when absent */
    size_t auth_len;
    bool auth_truncated;      /* longer than KVR_HTTPREQ_AUTH_MAX: never a valid token */
    const char *session;      /* the session header's value, NULL when absent */
    size_t session_len;
    bool session_truncated;   /* longer than KVR_HTTPREQ_SESSION_MAX (session is NULL) */
    bool has_length;          /* Content-Length or chunked framing was present */
    char *body;               /* mutable (in-place decoding); NULL when empty */
    size_t body_len;
    bool admin;               /* arrived on the admin listener */
    bool probe_only;          /* over the connection cap: only /healthz and /readyz answer */
};

struct kvr_httpresp {
    int status;                 /* default 200 */
    enum kvr_http_ep endpoint;  /* default KVR_EP_OTHER */
    const char *content_type;   /* default application/json */
    const char *extra_headers;  /* NULL or "Name: value\r\n..." */
    struct kvr_buf *body;       /* the thread's scratch, reset before the call */
    bool close;                 /* close the connection after this response */
    bool deferred;              /* the handler answers later (kvr_httpreq_conn_finish); it
                                 * must have copied what it needs of the request: its
                                 * strings and body are not valid after the call */
};

typedef void (*kvr_httpreq_handler)(void *arg, const struct kvr_httpreq *req,
                                    struct kvr_httpresp *resp);

enum {
    KVR_HTTPCONN_CLOSE = 1,     /* flush out, then close */
    KVR_HTTPCONN_CLOSE_NOW = 2, /* close without writing (idle timeout) */
};

struct kvr_httpconn {
    http_parser parser;
    const struct kvr_httpreq_limits *lim;
    struct kvr_httpstats *stats;
    kvr_httpreq_handler handler;
    void *handler_arg;
    struct kvr_buf *scratch; /* response body scratch shared by the thread's connections */
    bool admin;
    bool probe_only;       /* set by the socket layer: see struct kvr_httpreq */
    char remote[64];       /* peer address for the access log ("" = unknown) */

    bool in_request;       /* bytes of a request received, response not produced yet */
    bool closing;          /* no more requests: flush and close */
    int64_t req_start_ms;  /* first byte of the current request */
    int64_t idle_since_ms; /* last response produced / connection opened */
    int64_t now_ms;        /* clock of the current feed */

    uint64_t header_bytes;
    uint32_t nheaders;
    bool last_was_value;
    int cur_header;        /* which captured header the current value belongs to */
    char field[32];
    size_t field_len;
    bool field_long;
    char url[KVR_HTTPREQ_URL_MAX + 1];
    size_t url_len;
    bool url_counted;      /* url_len added to header_bytes (request line complete) */
    bool url_seen;         /* on_url ran: the method is known */
    char ctype[KVR_HTTPREQ_CTYPE_MAX + 1];
    size_t ctype_len;
    char auth[KVR_HTTPREQ_AUTH_MAX + 1];
    size_t auth_len;
    bool auth_present;
    bool auth_long;
    bool expect_continue;
    char session[KVR_HTTPREQ_SESSION_MAX + 1];
    size_t session_len;
    bool session_present;
    bool session_long;

    /* body: zero-copy span of the current feed buffer, or copied into `body` */
    const char *body_ptr;
    size_t body_len;
    bool body_copied;
    struct kvr_buf body;

    int reject_status;      /* set by a callback to stop parsing with this error */
    const char *reject_msg;

    struct kvr_buf out;     /* response bytes not yet handed to the socket */
    struct kvr_buf in;      /* paused: received bytes not parsed yet */
    bool paused;            /* out > max_output, or waiting: parsing stopped, see
                             * kvr_httpreq_conn_resume */
    bool waiting;           /* a deferred request's answer is awaited (no deadline meanwhile) */
    bool wait_keep, wait_http10; /* what the deferred request said about keep-alive */
    int64_t req_start_us;   /* access log: monotonic start of the current request */
};

void kvr_httpreq_conn_init(struct kvr_httpconn *c, const struct kvr_httpreq_limits *lim,
                           struct kvr_httpstats *stats, kvr_httpreq_handler handler, void *arg,
                           struct kvr_buf *scratch, bool admin, int64_t now_ms);
void kvr_httpreq_conn_deinit(struct kvr_httpconn *c);

/* Parses data[0..len) (mutable: bodies are decoded in place); returns 0 or KVR_HTTPCONN_CLOSE.
 * After CLOSE, further data is ignored. */
int kvr_httpreq_conn_feed(struct kvr_httpconn *c, char *data, size_t len, int64_t now_ms);
/* While paused (out exceeded lim->max_output), the caller stops feeding; once out drained
 * to at most max_output it calls this to parse the kept input. Returns like _feed; the
 * connection may pause again (check ->paused). */
int kvr_httpreq_conn_resume(struct kvr_httpconn *c, int64_t now_ms);
/* The answer to the deferred request (resp as the handler would have filled it; its body
 * any buffer of the caller's): framed into out like any response. Parsing stays paused:
 * the caller resumes it (kvr_httpreq_conn_resume) when it wants to. Returns 0, or
 * KVR_HTTPCONN_CLOSE when the connection closes after it. No-op when nothing waits. */
int kvr_httpreq_conn_finish(struct kvr_httpconn *c, struct kvr_httpresp *resp, int64_t now_ms);
/* The peer closed its side: a partial request is dropped. Returns KVR_HTTPCONN_CLOSE. */
int kvr_httpreq_conn_eof(struct kvr_httpconn *c);
/* Absolute time (ms, caller's clock) at which kvr_httpreq_conn_timeout() must run. */
int64_t kvr_httpreq_conn_deadline(const struct kvr_httpconn *c);
/* 0 (nothing due), KVR_HTTPCONN_CLOSE (408 appended to out) or KVR_HTTPCONN_CLOSE_NOW. */
int kvr_httpreq_conn_timeout(struct kvr_httpconn *c, int64_t now_ms);
/* The socket layer wrote n bytes of out. Keeps buffers; drops them when they grew large. */
void kvr_httpreq_conn_consumed(struct kvr_httpconn *c, size_t n);

/* Appends a complete response (used for errors outside a connection too, e.g. 503 on the
 * connection cap). body may be NULL for an empty body. */
void kvr_httpreq_write_response(struct kvr_buf *out, int status, const char *content_type,
                                const char *extra_headers, const char *body, size_t body_len,
                                bool close);
/* {"error": "<escaped msg>"} into out (reset first). */
void kvr_httpreq_error_body(struct kvr_buf *out, const char *msg);
const char *kvr_httpreq_reason(int status);

#endif
