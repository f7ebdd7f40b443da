/* test_httpreq.c — the HTTP request path without sockets: framing, pipelining, limits,
 * timeouts, keep-alive, with a fake handler that echoes what it saw. (Routing and auth of
 * the real endpoints are covered in test_httpapi.c.) */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/httpreq.h"

static struct kvr_httpreq_limits g_lim = {
    .max_body = 1000,
    .max_header_bytes = 600,
    .max_headers = 8,
    .request_timeout_ms = 1000,
    .idle_timeout_ms = 5000,
};

static int g_calls;
static char g_deferred[256];

/* Echo: "METHOD PATH|ctype|auth|body"; /status/NNN answers NNN; /close asks to close;
 * /upcase upper-cases the body in place (bodies are mutable). */
static void echo(void *arg, const struct kvr_httpreq *req, struct kvr_httpresp *resp)
{
    (void)arg;
    g_calls++;
    resp->endpoint = KVR_EP_HEALTHZ;
    resp->content_type = "text/plain";
    if (strncmp(req->path, "/status/", 8) == 0)
        resp->status = atoi(req->path + 8);
    if (strcmp(req->path, "/close") == 0)
        resp->close = true;
    if (strncmp(req->path, "/defer", 6) == 0) { /* answered later: keep a copy of the body */
        snprintf(g_deferred, sizeof(g_deferred), "%.*s", (int)req->body_len,
                 req->body ? req->body : "");
        resp->deferred = true;
        return;
    }
    if (strcmp(req->path, "/upcase") == 0)
        for (size_t i = 0; i < req->body_len; i++)
            if (req->body[i] >= 'a' && req->body[i] <= 'z')
                req->body[i] = (char)(req->body[i] - 32);
    kvr_buf_printf(resp->body, "%s %s|%s|%s%s|%.*s", http_method_str(req->method), req->path,
                   req->content_type, req->auth ? req->auth : "-",
                   req->auth_truncated ? "(long)" : "", (int)req->body_len,
                   req->body ? req->body : "");
}

struct fixture {
    struct kvr_httpconn c;
    struct kvr_httpstats st;
    struct kvr_buf scratch;
};

static struct fixture *fx_new(void)
{
    struct fixture *f = calloc(1, sizeof(*f));
    kvr_buf_init(&f->scratch);
    kvr_httpreq_conn_init(&f->c, &g_lim, &f->st, echo, NULL, &f->scratch, false, 0);
    g_calls = 0;
    return f;
}

static void fx_free(struct fixture *f)
{
    kvr_httpreq_conn_deinit(&f->c);
    kvr_buf_free(&f->scratch);
    free(f);
}

/* Feeds s (copied: feed takes mutable bytes), in pieces of `step` bytes (0 = all at once). */
static int feed(struct fixture *f, const char *s, size_t step, int64_t now)
{
    size_t len = strlen(s), off = 0;
    int rc = 0;
    char *b = malloc(len + 1);
    memcpy(b, s, len + 1);
    if (step == 0)
        step = len;
    while (off < len && rc == 0) {
        size_t n = len - off < step ? len - off : step;
        char *piece = malloc(n); /* a fresh buffer each time: no pointer may survive a feed */
        memcpy(piece, b + off, n);
        rc = kvr_httpreq_conn_feed(&f->c, piece, n, now);
        memset(piece, 'X', n);
        free(piece);
        off += n;
    }
    free(b);
    return rc;
}

struct resp {
    int status;
    char headers[512];
    char body[512];
};

/* Splits the output into responses (by Content-Length); returns how many. */
static int parse_out(struct fixture *f, struct resp *r, int max)
{
    const char *p = f->c.out.data, *end = p + f->c.out.len;
    int n = 0;

    while (p < end && n < max) {
        const char *hend = strstr(p, "\r\n\r\n"), *cl;
        size_t blen = 0, hlen;
        assert_non_null(hend);
        hlen = (size_t)(hend - p);
        assert_true(hlen < sizeof(r[n].headers));
        memcpy(r[n].headers, p, hlen);
        r[n].headers[hlen] = '\0';
        assert_int_equal(sscanf(p, "HTTP/1.1 %d", &r[n].status), 1);
        cl = strstr(r[n].headers, "Content-Length: ");
        if (cl != NULL)
            blen = strtoul(cl + 16, NULL, 10);
        p = hend + 4;
        assert_true(blen < sizeof(r[n].body) && p + blen <= end);
        memcpy(r[n].body, p, blen);
        r[n].body[blen] = '\0';
        p += blen;
        n++;
    }
    return n;
}

static void test_simple_and_keepalive(void **state)
{
    struct fixture *f = fx_new();
    struct resp r[4];
    (void)state;

    assert_int_equal(feed(f, "GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n", 0, 10), 0);
    assert_int_equal(parse_out(f, r, 4), 1);
    assert_int_equal(r[0].status, 200);
    assert_string_equal(r[0].body, "GET /a||-|");
    assert_null(strstr(r[0].headers, "Connection:"));
    assert_false(f->c.in_request);
    assert_int_equal(f->st.requests[KVR_EP_HEALTHZ][0], 1);
    kvr_httpreq_conn_consumed(&f->c, f->c.out.len);
    assert_int_equal(f->c.out.len, 0);
    /* second request on the same connection */
    assert_int_equal(feed(f, "POST /b HTTP/1.1\r\nContent-Type: application/json\r\n"
                             "Authorization: Bearer t0k\r\nContent-Length: 5\r\n\r\nhello",
                          0, 20),
                     0);
    assert_int_equal(parse_out(f, r, 4), 1);
    assert_string_equal(r[0].body, "POST /b|application/json|Bearer t0k|hello");
    fx_free(f);
}

static void test_pipelining_and_splits(void **state)
{
    const char *reqs = "GET /1 HTTP/1.1\r\n\r\n"
                       "POST /2 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                       "POST /upcase HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "3\r\nxyz\r\n2\r\nqq\r\n0\r\n\r\n"
                       "GET /status/404 HTTP/1.1\r\n\r\n";
    size_t steps[] = {0, 1, 2, 3, 7, 16, 50};
    (void)state;

    for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
        struct fixture *f = fx_new();
        struct resp r[8];
        assert_int_equal(feed(f, reqs, steps[s], 0), 0);
        assert_int_equal(parse_out(f, r, 8), 4);
        assert_string_equal(r[0].body, "GET /1||-|");
        assert_string_equal(r[1].body, "POST /2||-|abc");
        assert_string_equal(r[2].body, "POST /upcase||-|XYZQQ");
        assert_int_equal(r[3].status, 404);
        assert_int_equal(f->st.requests[KVR_EP_HEALTHZ][2], 1);
        assert_int_equal(g_calls, 4);
        fx_free(f);
    }
}

static void test_connection_close_forms(void **state)
{
    struct fixture *f;
    struct resp r[4];
    (void)state;

    /* Connection: close → response says close, later pipelined bytes are ignored */
    f = fx_new();
    assert_int_equal(feed(f, "GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
                          0, 0),
                     KVR_HTTPCONN_CLOSE);
    assert_int_equal(parse_out(f, r, 4), 1);
    assert_non_null(strstr(r[0].headers, "Connection: close"));
    assert_int_equal(feed(f, "GET /c HTTP/1.1\r\n\r\n", 0, 0), KVR_HTTPCONN_CLOSE);
    assert_int_equal(g_calls, 1);
    fx_free(f);

    /* HTTP/1.0 closes by default, keeps alive when asked */
    f = fx_new();
    assert_int_equal(feed(f, "GET /a HTTP/1.0\r\n\r\n", 0, 0), KVR_HTTPCONN_CLOSE);
    fx_free(f);
    f = fx_new();
    assert_int_equal(feed(f, "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 0, 0), 0);
    assert_int_equal(parse_out(f, r, 4), 1);
    assert_non_null(strstr(r[0].headers, "Connection: keep-alive"));
    fx_free(f);

    /* the handler asks to close */
    f = fx_new();
    assert_int_equal(feed(f, "GET /close HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\n\r\n", 0, 0),
                     KVR_HTTPCONN_CLOSE);
    assert_int_equal(g_calls, 1);
    fx_free(f);
}

static void test_body_limit(void **state)
{
    struct fixture *f;
    struct resp r[2];
    char req[2000];
    (void)state;

    /* declared too large: 413 at the headers, handler never called, close */
    f = fx_new();
    assert_int_equal(feed(f, "POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 0, 0),
                     KVR_HTTPCONN_CLOSE);
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_int_equal(r[0].status, 413);
    assert_non_null(strstr(r[0].body, "{\"error\":"));
    assert_non_null(strstr(r[0].headers, "Connection: close"));
    assert_int_equal(g_calls, 0);
    assert_int_equal(f->st.limits[KVR_LIMIT_BODY], 1);
    assert_int_equal(f->st.requests[KVR_EP_OTHER][2], 1);
    fx_free(f);

    /* exactly the limit is fine */
    f = fx_new();
    snprintf(req, sizeof(req), "POST /x HTTP/1.1\r\nContent-Length: 1000\r\n\r\n%01000d", 0);
    assert_int_equal(feed(f, req, 100, 0), 0);
    assert_int_equal(g_calls, 1);
    fx_free(f);

    /* chunked growing past the limit */
    f = fx_new();
    assert_int_equal(feed(f, "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 0), 0);
    {
        char chunk[700];
        memset(chunk, 0, sizeof(chunk));
        snprintf(chunk, sizeof(chunk), "258\r\n%0600d\r\n", 0);
        assert_int_equal(feed(f, chunk, 0, 0), 0);
        assert_int_equal(feed(f, chunk, 0, 0), KVR_HTTPCONN_CLOSE);
    }
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_int_equal(r[0].status, 413);
    assert_int_equal(f->st.limits[KVR_LIMIT_BODY], 1);
    fx_free(f);
}

static void test_header_limits(void **state)
{
    struct fixture *f;
    struct resp r[2];
    static char req[KVR_HTTPREQ_URL_MAX + 200];
    size_t len;
    (void)state;

    /* too many headers */
    f = fx_new();
    len = (size_t)snprintf(req, sizeof(req), "GET / HTTP/1.1\r\n");
    for (int i = 0; i < 9; i++)
        len += (size_t)snprintf(req + len, sizeof(req) - len, "X-%d: v\r\n", i);
    snprintf(req + len, sizeof(req) - len, "\r\n");
    assert_int_equal(feed(f, req, 0, 0), KVR_HTTPCONN_CLOSE);
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_int_equal(r[0].status, 431);
    assert_int_equal(f->st.limits[KVR_LIMIT_HEADERS], 1);
    fx_free(f);

    /* 8 headers are fine */
    f = fx_new();
    len = (size_t)snprintf(req, sizeof(req), "GET / HTTP/1.1\r\n");
    for (int i = 0; i < 8; i++)
        len += (size_t)snprintf(req + len, sizeof(req) - len, "X-%d: v\r\n", i);
    snprintf(req + len, sizeof(req) - len, "\r\n");
    assert_int_equal(feed(f, req, 3, 0), 0);
    assert_int_equal(g_calls, 1);
    fx_free(f);

    /* too many header bytes (one long value), fed in small pieces */
    f = fx_new();
    len = (size_t)snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nX-Long: ");
    memset(req + len, 'a', 700);
    len += 700;
    snprintf(req + len, sizeof(req) - len, "\r\n\r\n");
    assert_int_equal(feed(f, req, 10, 0), KVR_HTTPCONN_CLOSE);
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_int_equal(r[0].status, 431);
    assert_int_equal(f->st.limits[KVR_LIMIT_HEADER_BYTES], 1);
    fx_free(f);

    /* request target too long */
    f = fx_new();
    len = (size_t)snprintf(req, sizeof(req), "GET /");
    memset(req + len, 'u', KVR_HTTPREQ_URL_MAX);
    len += KVR_HTTPREQ_URL_MAX;
    snprintf(req + len, sizeof(req) - len, " HTTP/1.1\r\n\r\n");
    g_lim.max_header_bytes = 100000;
    assert_int_equal(feed(f, req, 0, 0), KVR_HTTPCONN_CLOSE);
    g_lim.max_header_bytes = 600;
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_int_equal(r[0].status, 414);
    assert_int_equal(f->st.limits[KVR_LIMIT_URI], 1);
    fx_free(f);
}

static void test_malformed(void **state)
{
    static const char *const bad[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/9\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        "GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        "CONNECT h:1 HTTP/1.1\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
        "GET / HTTP/7.7\r\n\r\n",
        "\x01\x02\x03\r\n",
    };
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct fixture *f = fx_new();
        struct resp r[2];
        assert_int_equal(feed(f, bad[i], 0, 0), KVR_HTTPCONN_CLOSE);
        assert_int_equal(parse_out(f, r, 2), 1);
        if (r[0].status != 400)
            fail_msg("%zu: status %d", i, r[0].status);
        assert_non_null(strstr(r[0].body, "{\"error\":"));
        assert_int_equal(g_calls, 0);
        fx_free(f);
    }
}

static void test_timeouts(void **state)
{
    struct fixture *f;
    struct resp r[2];
    (void)state;

    /* slowloris: a request started at t=100 must be complete by t=1100 */
    f = fx_new();
    assert_int_equal(kvr_httpreq_conn_deadline(&f->c), 5000); /* idle since 0 */
    assert_int_equal(feed(f, "GET / HTTP/1.1\r\nX-A: ", 0, 100), 0);
    assert_true(f->c.in_request);
    assert_int_equal(kvr_httpreq_conn_deadline(&f->c), 1100);
    assert_int_equal(feed(f, "b\r\n", 0, 900), 0);
    assert_int_equal(kvr_httpreq_conn_deadline(&f->c), 1100); /* trickling does not extend it */
    assert_int_equal(kvr_httpreq_conn_timeout(&f->c, 1099), 0);
    assert_int_equal(kvr_httpreq_conn_timeout(&f->c, 1100), KVR_HTTPCONN_CLOSE);
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_int_equal(r[0].status, 408);
    assert_int_equal(f->st.limits[KVR_LIMIT_REQUEST_TIMEOUT], 1);
    assert_int_equal(kvr_httpreq_conn_timeout(&f->c, 99999), 0); /* already closing */
    fx_free(f);

    /* idle keep-alive: closed without a response */
    f = fx_new();
    assert_int_equal(feed(f, "GET / HTTP/1.1\r\n\r\n", 0, 200), 0);
    kvr_httpreq_conn_consumed(&f->c, f->c.out.len);
    assert_int_equal(kvr_httpreq_conn_deadline(&f->c), 5200);
    assert_int_equal(kvr_httpreq_conn_timeout(&f->c, 5199), 0);
    assert_int_equal(kvr_httpreq_conn_timeout(&f->c, 5200), KVR_HTTPCONN_CLOSE_NOW);
    assert_int_equal(f->c.out.len, 0);
    assert_int_equal(f->st.limits[KVR_LIMIT_IDLE_TIMEOUT], 1);
    fx_free(f);
}

static void test_headers_captured(void **state)
{
    struct fixture *f;
    struct resp r[2];
    char req[3000];
    size_t len;
    (void)state;

    /* empty header values, case-insensitive names, split names and values */
    f = fx_new();
    assert_int_equal(feed(f, "POST /h HTTP/1.1\r\nX-Empty:\r\ncontent-TYPE:  application/msgpack\r\n"
                             "AUTHORIZATION: Bearer abc\r\nContent-Length: 2\r\n\r\nok",
                          5, 0),
                     0);
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_string_equal(r[0].body, "POST /h|application/msgpack|Bearer abc|ok");
    fx_free(f);

    /* an over-long Authorization is flagged, never matched */
    f = fx_new();
    g_lim.max_header_bytes = 100000;
    len = (size_t)snprintf(req, sizeof(req), "GET /h HTTP/1.1\r\nAuthorization: Bearer ");
    memset(req + len, 'k', KVR_HTTPREQ_AUTH_MAX + 10);
    len += KVR_HTTPREQ_AUTH_MAX + 10;
    snprintf(req + len, sizeof(req) - len, "\r\n\r\n");
    assert_int_equal(feed(f, req, 0, 0), 0);
    g_lim.max_header_bytes = 600;
    assert_int_equal(parse_out(f, r, 2), 1);
    assert_non_null(strstr(r[0].body, "(long)"));
    fx_free(f);
}

static void test_expect_continue(void **state)
{
    struct fixture *f = fx_new();
    (void)state;

    assert_int_equal(feed(f, "POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
                          0, 0),
                     0);
    assert_int_equal(strcmp(f->c.out.data, "HTTP/1.1 100 Continue\r\n\r\n"), 0);
    assert_int_equal(feed(f, "hi", 0, 0), 0);
    assert_non_null(strstr(f->c.out.data, "POST /e||-|hi"));
    fx_free(f);

    /* too large: 413 instead of 100 */
    f = fx_new();
    assert_int_equal(feed(f, "POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n",
                          0, 0),
                     KVR_HTTPCONN_CLOSE);
    assert_null(strstr(f->c.out.data, "100 Continue"));
    assert_non_null(strstr(f->c.out.data, "413"));
    fx_free(f);
}

static void test_stats_render(void **state)
{
    struct fixture *f = fx_new();
    struct kvr_httpstats *all[1] = {&f->st};
    struct kvr_buf b;
    (void)state;

    assert_int_equal(feed(f, "GET / HTTP/1.1\r\n\r\n", 0, 0), 0);
    kvr_buf_init(&b);
    kvr_httpreq_stats_render(all, 1, 3, &b);
    assert_non_null(strstr(b.data, "# TYPE kvrouter_http_requests_total counter"));
    assert_non_null(strstr(b.data, "kvrouter_http_requests_total{endpoint=\"healthz\",code=\"2xx\"} 1"));
    assert_non_null(strstr(b.data, "kvrouter_http_limit_rejections_total{kind=\"body_bytes\"} 0"));
    assert_non_null(strstr(b.data, "kvrouter_http_connections_open 3"));
    kvr_buf_free(&b);
    fx_free(f);
}

/* A target longer than KVR_HTTPREQ_URL_MAX is 414 even when it is also far past
 * max_header_bytes and http-parser's own header limit (80 KiB), whole or in pieces. */
static void test_long_target_is_414(void **state)
{
    size_t n = 200 * 1024, len;
    char *req = malloc(n + 64);
    struct resp r[2];
    (void)state;

    len = (size_t)snprintf(req, 64, "GET /");
    memset(req + len, 'u', n);
    len += n;
    snprintf(req + len, 64, " HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int step = 0; step <= 4096; step += 4096) {
        struct fixture *f = fx_new();
        assert_int_equal(feed(f, req, (size_t)step, 0), KVR_HTTPCONN_CLOSE);
        assert_int_equal(parse_out(f, r, 2), 1);
        assert_int_equal(r[0].status, 414);
        assert_int_equal(f->st.limits[KVR_LIMIT_URI], 1);
        assert_int_equal(f->st.limits[KVR_LIMIT_HEADER_BYTES], 0);
        fx_free(f);
    }
    free(req);
}

/* Pipelined requests whose answers exceed max_output: parsing pauses with the rest of the
 * input kept, nothing more is parsed until out drained, and resuming produces every answer
 * in order. */
static void test_output_pause_resume(void **state)
{
    enum { N = 200 };
    struct fixture *f;
    char *all = malloc(N * 32 + 1), *w = all;
    size_t done_resp = 0;
    int rounds = 0;
    (void)state;

    for (int i = 0; i < N; i++)
        w += sprintf(w, "GET /r%03d HTTP/1.1\r\n\r\n", i);
    g_lim.max_output = 1000;
    f = fx_new();
    assert_int_equal(feed(f, all, 0, 0), 0);
    assert_true(f->c.paused);
    assert_true(f->c.in.len > 0);
    assert_true(g_calls < N);
    assert_true(f->c.out.len > 1000 && f->c.out.len < 1000 + 200);
    assert_int_equal(f->st.output_pauses, 1);
    /* not drained: resume does nothing */
    assert_int_equal(kvr_httpreq_conn_resume(&f->c, 0), 0);
    assert_true(f->c.paused);
    while (f->c.paused || f->c.out.len > 0) {
        const char *p = f->c.out.data, *end = p + f->c.out.len;
        char want[16];
        while (p < end) { /* each answer echoes its path, in order */
            snprintf(want, sizeof(want), "GET /r%03zu|", done_resp);
            p = strstr(p, "\r\n\r\n");
            assert_non_null(p);
            assert_memory_equal(p + 4, want, strlen(want));
            p = strstr(p + 4, "HTTP/1.1 200");
            if (p == NULL)
                p = end;
            done_resp++;
        }
        kvr_httpreq_conn_consumed(&f->c, f->c.out.len);
        assert_int_equal(kvr_httpreq_conn_resume(&f->c, 0), 0);
        assert_true(++rounds < N);
    }
    assert_int_equal(done_resp, N);
    assert_int_equal(g_calls, N);
    assert_true(f->st.output_pauses >= 2);
    assert_int_equal(f->c.in.len, 0);
    g_lim.max_output = 0;
    fx_free(f);
    free(all);
}

/* A deferred request (a text job): parsing stops after it, so what was pipelined behind it
 * waits; no deadline runs meanwhile; its answer, finished later, comes first and the rest
 * follows in order once resumed. Connection: close on the deferred one closes after it. */
static void test_deferred_order(void **state)
{
    struct fixture *f = fx_new();
    struct resp r[4];
    struct kvr_buf body;
    struct kvr_httpresp resp;
    (void)state;
    kvr_buf_init(&body);
    assert_int_equal(feed(f, "POST /defer HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
                             "GET /a HTTP/1.1\r\n\r\n", 0, 10), 0);
    assert_int_equal(g_calls, 1);
    assert_true(f->c.waiting);
    assert_true(f->c.paused);
    assert_string_equal(g_deferred, "hello");
    assert_int_equal(f->c.out.len, 0);
    assert_true(kvr_httpreq_conn_deadline(&f->c) == INT64_MAX);
    assert_int_equal(kvr_httpreq_conn_timeout(&f->c, 1000000), 0);
    /* more bytes meanwhile are kept, not parsed; resuming does nothing while waiting */
    assert_int_equal(feed(f, "GET /b HTTP/1.1\r\n\r\n", 0, 20), 0);
    assert_int_equal(kvr_httpreq_conn_resume(&f->c, 30), 0);
    assert_int_equal(g_calls, 1);
    kvr_buf_printf(&body, "late:%s", g_deferred);
    resp = (struct kvr_httpresp){.status = 201, .endpoint = KVR_EP_TOKENIZE,
                                 .content_type = "text/plain", .body = &body};
    assert_int_equal(kvr_httpreq_conn_finish(&f->c, &resp, 40), 0);
    assert_false(f->c.waiting);
    assert_int_equal(parse_out(f, r, 4), 1);
    assert_int_equal(r[0].status, 201);
    assert_string_equal(r[0].body, "late:hello");
    assert_int_equal(kvr_httpreq_conn_resume(&f->c, 50), 0);
    assert_int_equal(g_calls, 3);
    assert_int_equal(parse_out(f, r, 4), 3);
    assert_string_equal(r[1].body, "GET /a||-|");
    assert_string_equal(r[2].body, "GET /b||-|");
    assert_int_equal(atomic_load(&f->st.requests[KVR_EP_TOKENIZE][0]), 1);
    assert_int_equal(kvr_httpreq_conn_finish(&f->c, &resp, 60), 0); /* nothing waits: no-op */
    assert_int_equal(parse_out(f, r, 4), 3);
    fx_free(f);

    f = fx_new();
    assert_int_equal(feed(f, "POST /defer HTTP/1.1\r\nConnection: close\r\nContent-Length: 1\r\n"
                             "\r\nxGET /a HTTP/1.1\r\n\r\n", 0, 10), 0);
    kvr_buf_reset(&body);
    kvr_buf_printf(&body, "bye");
    resp = (struct kvr_httpresp){.status = 200, .content_type = "text/plain", .body = &body};
    assert_int_equal(kvr_httpreq_conn_finish(&f->c, &resp, 20), KVR_HTTPCONN_CLOSE);
    assert_int_equal(parse_out(f, r, 4), 1);
    assert_non_null(strstr(r[0].headers, "Connection: close"));
    assert_int_equal(kvr_httpreq_conn_resume(&f->c, 30), KVR_HTTPCONN_CLOSE);
    assert_int_equal(g_calls, 1); /* nothing after it is parsed */
    kvr_buf_free(&body);
    fx_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_and_keepalive),
        cmocka_unit_test(test_pipelining_and_splits),
        cmocka_unit_test(test_connection_close_forms),
        cmocka_unit_test(test_body_limit),
        cmocka_unit_test(test_header_limits),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_headers_captured),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_stats_render),
        cmocka_unit_test(test_long_target_is_414),
        cmocka_unit_test(test_output_pause_resume),
        cmocka_unit_test(test_deferred_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
