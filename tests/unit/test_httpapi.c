/* test_httpapi.c — the real request path without sockets: bytes → httpreq → httpapi routing,
 * admin listener and token rules, content types, score bodies (JSON and msgpack) against a
 * real index, /metrics, /readyz, and the small formatting helpers. Ingestion is absent here
 * (its routes answer 503); the integration tests cover them with the daemon. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/conf.h"
#include "index/hash.h"
#include "http/httpapi.h"
#include "http/httpreq.h"
#include "index/index.h"
#include "route/score.h"

struct fx {
    struct kvr_conf conf;
    struct kvr_index *ix;
    struct kvr_score *score;
    struct kvr_httpapi *api;
    struct kvr_httpapi_thread *th;
    struct kvr_httpstats st;
    struct kvr_buf scratch;
    struct kvr_httpreq_limits lim;
    struct kvr_httpconn main, admin;
};

static void server_metrics(void *arg, struct kvr_buf *out)
{
    struct fx *f = arg;
    struct kvr_httpstats *all[1] = {&f->st};
    kvr_httpreq_stats_render(all, 1, 2, out);
}

static void store(struct fx *f, const char *pod, const uint32_t *toks, size_t n, uint32_t bs)
{
    uint32_t wid, ns;
    uint64_t seed, content[64];
    uint8_t tier;
    struct kvr_index_block b[64];
    struct kvr_index_wres res = {0};

    assert_int_equal(kvr_index_worker_intern(f->ix, pod, 0, &wid), 0);
    assert_int_equal(kvr_index_ns_intern(f->ix, "m", NULL, &ns, &seed), 0);
    kvr_index_ns_set_block_size(f->ix, ns, bs);
    assert_int_equal(kvr_index_tier_intern(f->ix, "GPU", 3, &tier), 0);
    kvr_hash_blocks(seed, toks, n / bs, bs, content);
    for (size_t i = 0; i < n / bs; i++) {
        b[i].engine_hash = 77 + i;
        b[i].content_hash = content[i];
    }
    assert_int_equal(kvr_index_store(f->ix, wid, tier, ns, NULL, b, n / bs, &res), 0);
}

static struct fx *fx_new(const char *http_conf)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct kvr_index_opts o = {0};
    struct kvr_httpapi_deps d;
    struct kvr_err err;
    char text[512];
    static const uint32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};

    snprintf(text, sizeof(text), "[events]\nbind = tcp://127.0.0.1:*\n[http]\n%s",
             http_conf ? http_conf : "");
    if (kvr_conf_load_string("t", text, &f->conf, &err) != 0)
        fail_msg("%s", err.msg);
    o.max_query_blocks = 1024;
    assert_int_equal(kvr_index_create(&o, &f->ix), 0);
    assert_int_equal(kvr_score_create(f->ix, &f->conf, &f->score), 0);
    store(f, "pod-a", toks, 8, 4);
    store(f, "pod-b", toks, 4, 4);
    memset(&d, 0, sizeof(d));
    d.conf = &f->conf;
    d.score = f->score;
    d.index = f->ix;
    d.admin_listener = f->conf.admin_listen != NULL;
    d.public_introspection = f->conf.public_introspection;
    d.server_metrics = server_metrics;
    d.server_metrics_arg = f;
    assert_int_equal(kvr_httpapi_create(&d, &f->api), 0);
    assert_int_equal(kvr_httpapi_thread_create(f->api, &f->st, &f->th), 0);
    kvr_buf_init(&f->scratch);
    f->lim.max_body = 1 << 20;
    f->lim.max_header_bytes = 16384;
    f->lim.max_headers = 64;
    f->lim.request_timeout_ms = 1000;
    f->lim.idle_timeout_ms = 1000;
    kvr_httpreq_conn_init(&f->main, &f->lim, &f->st, kvr_httpapi_handle, f->th, &f->scratch,
                          false, 0);
    kvr_httpreq_conn_init(&f->admin, &f->lim, &f->st, kvr_httpapi_handle, f->th, &f->scratch,
                          true, 0);
    return f;
}

static void fx_free(struct fx *f)
{
    kvr_httpreq_conn_deinit(&f->main);
    kvr_httpreq_conn_deinit(&f->admin);
    kvr_buf_free(&f->scratch);
    kvr_httpapi_thread_destroy(f->th);
    kvr_httpapi_destroy(f->api);
    kvr_score_destroy(f->score);
    kvr_index_destroy(f->ix);
    kvr_conf_free(&f->conf);
    free(f);
}

struct resp {
    int status;
    char headers[1024];
    char *body;
};

/* One request on the given connection; returns the parsed response (body malloc'd). */
static struct resp rq(struct kvr_httpconn *c, const char *method, const char *path,
                      const char *headers, const void *body, size_t blen)
{
    char head[2048];
    char *buf;
    size_t hlen, total;
    struct resp r;
    const char *p, *hend, *cl;
    size_t n = 0;

    hlen = (size_t)snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: t\r\n%s", method, path,
                            headers ? headers : "");
    if (body)
        hlen += (size_t)snprintf(head + hlen, sizeof(head) - hlen, "Content-Length: %zu\r\n",
                                 blen);
    hlen += (size_t)snprintf(head + hlen, sizeof(head) - hlen, "\r\n");
    total = hlen + blen;
    buf = malloc(total);
    memcpy(buf, head, hlen);
    if (blen)
        memcpy(buf + hlen, body, blen);
    kvr_buf_reset(&c->out);
    (void)kvr_httpreq_conn_feed(c, buf, total, 0);
    free(buf);
    p = c->out.data;
    assert_non_null(p);
    assert_int_equal(sscanf(p, "HTTP/1.1 %d", &r.status), 1);
    hend = strstr(p, "\r\n\r\n");
    assert_non_null(hend);
    snprintf(r.headers, sizeof(r.headers), "%.*s", (int)(hend - p), p);
    cl = strstr(r.headers, "Content-Length: ");
    if (cl)
        n = strtoul(cl + 16, NULL, 10);
    r.body = calloc(1, n + 1);
    memcpy(r.body, hend + 4, n);
    kvr_httpreq_conn_consumed(c, c->out.len);
    return r;
}

#define JSON_CT "Content-Type: application/json\r\n"

static void test_score_route(void **state)
{
    struct fx *f = fx_new(NULL);
    struct resp r;
    static const char q[] = "{\"model\":\"m\",\"token_ids\":[1,2,3,4,5,6,7,8,9]}";
    (void)state;

    r = rq(&f->main, "POST", "/v1/score", JSON_CT, q, strlen(q));
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body,
                        "{\"model\":\"m\",\"block_size\":4,\"query_blocks\":2,\"scores\":["
                        "{\"pod\":\"pod-a\",\"dp_rank\":0,\"matched_blocks\":2,\"matched_tokens\":8,"
                        "\"tiers\":{\"gpu\":2},\"score\":2},"
                        "{\"pod\":\"pod-b\",\"dp_rank\":0,\"matched_blocks\":1,\"matched_tokens\":4,"
                        "\"tiers\":{\"gpu\":1},\"score\":1}]}\n");
    free(r.body);

    /* same as msgpack; no Content-Type means JSON */
    {
        static const unsigned char mp[] = {0x83, 0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'm',
                                           0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's',
                                           0x94, 1, 2, 3, 0xcd, 0, 4, 0xa4, 'p', 'o', 'd', 's',
                                           0x91, 0xa5, 'p', 'o', 'd', '-', 'b'};
        r = rq(&f->main, "POST", "/v1/score", "Content-Type: application/x-msgpack\r\n", mp,
               sizeof(mp));
        assert_int_equal(r.status, 200);
        assert_non_null(strstr(r.body, "\"scores\":[{\"pod\":\"pod-b\""));
        assert_null(strstr(r.body, "pod-a"));
        free(r.body);
    }
    r = rq(&f->main, "POST", "/v1/score?x=1", NULL, q, strlen(q));
    assert_int_equal(r.status, 200);
    free(r.body);

    r = rq(&f->main, "POST", "/v1/score", "Content-Type: text/plain\r\n", q, strlen(q));
    assert_int_equal(r.status, 415);
    assert_non_null(strstr(r.body, "{\"error\":"));
    free(r.body);
    r = rq(&f->main, "POST", "/v1/score", "Content-Type: Application/JSON; charset=utf-8\r\n", q,
           strlen(q));
    assert_int_equal(r.status, 200);
    free(r.body);
    r = rq(&f->main, "GET", "/v1/score", NULL, NULL, 0);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.headers, "Allow: POST"));
    free(r.body);
    r = rq(&f->main, "POST", "/v1/score", JSON_CT, NULL, 0);
    assert_int_equal(r.status, 411);
    assert_non_null(strstr(r.headers, "Connection: close")); /* the body would follow */
    assert_true(f->main.closing);
    free(r.body);
    kvr_httpreq_conn_deinit(&f->main);
    kvr_httpreq_conn_init(&f->main, &f->lim, &f->st, kvr_httpapi_handle, f->th, &f->scratch,
                          false, 0);
    r = rq(&f->main, "POST", "/v1/score", JSON_CT "Content-Length: 0\r\n", NULL, 0);
    assert_int_equal(r.status, 400);
    free(r.body);
    r = rq(&f->main, "POST", "/v1/score", JSON_CT, "{\"model\":\"m\",\"token_ids\":[1.5]}", 31);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "fraction"));
    free(r.body);
    r = rq(&f->main, "POST", "/v1/score", JSON_CT, "{\"model\":\"zz\",\"token_ids\":[1]}", 30);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body,
                        "{\"model\":\"zz\",\"block_size\":null,\"query_blocks\":0,\"scores\":[]}\n");
    free(r.body);
    assert_int_equal(f->st.requests[KVR_EP_SCORE][0], 5);
    assert_int_equal(f->st.requests[KVR_EP_SCORE][2], 5);
    fx_free(f);
}

static void test_token_limit(void **state)
{
    struct fx *f = fx_new("max_query_tokens = 3\n");
    struct resp r;
    (void)state;

    r = rq(&f->main, "POST", "/v1/score", JSON_CT, "{\"model\":\"m\",\"token_ids\":[1,2,3]}", 33);
    assert_int_equal(r.status, 200);
    free(r.body);
    r = rq(&f->main, "POST", "/v1/score", JSON_CT, "{\"model\":\"m\",\"token_ids\":[1,2,3,4]}", 35);
    assert_int_equal(r.status, 413);
    assert_int_equal(f->st.limits[KVR_LIMIT_TOKENS], 1);
    free(r.body);
    fx_free(f);
}

static void test_routes_health_metrics(void **state)
{
    struct fx *f = fx_new(NULL);
    struct resp r;
    (void)state;

    r = rq(&f->main, "GET", "/healthz", NULL, NULL, 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}\n");
    free(r.body);
    r = rq(&f->main, "GET", "/readyz", NULL, NULL, 0);
    assert_int_equal(r.status, 503);
    free(r.body);
    kvr_httpapi_set_ready(f->api, true);
    r = rq(&f->main, "GET", "/readyz", NULL, NULL, 0);
    assert_int_equal(r.status, 200);
    free(r.body);
    r = rq(&f->main, "POST", "/healthz", NULL, "x", 1);
    assert_int_equal(r.status, 405);
    free(r.body);
    r = rq(&f->main, "GET", "/nope", NULL, NULL, 0);
    assert_int_equal(r.status, 404);
    free(r.body);
    r = rq(&f->main, "GET", "/v1/pods", NULL, NULL, 0);
    assert_int_equal(r.status, 503); /* no ingestion in this test */
    free(r.body);

    r = rq(&f->main, "GET", "/metrics", NULL, NULL, 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.headers, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(r.body, "kvrouter_ready 1\n"));
    assert_non_null(strstr(r.body, "# TYPE kvrouter_index_entries gauge"));
    assert_non_null(strstr(r.body, "# HELP kvrouter_index_entries (position, content hash)"));
    assert_non_null(strstr(r.body, "kvrouter_index_blocks{tier=\"gpu\"} "));
    assert_non_null(strstr(r.body, "# TYPE kvrouter_score_latency_seconds histogram"));
    assert_non_null(strstr(r.body, "kvrouter_http_requests_total{endpoint=\"healthz\",code=\"2xx\"} 1"));
    assert_non_null(strstr(r.body, "kvrouter_http_connections_open 2"));
    free(r.body);
    fx_free(f);
}

static void test_admin_listener_and_token(void **state)
{
    struct fx *f = fx_new("admin_listen = 127.0.0.1:0\nadmin_token = tok-123\n");
    struct resp r;
    static const char ep[] = "{\"endpoint\":\"tcp://127.0.0.1:9\"}";
    (void)state;

    /* mutating routes do not exist on the main listener */
    r = rq(&f->main, "DELETE", "/v1/pods/x", "Authorization: Bearer tok-123\r\n", NULL, 0);
    assert_int_equal(r.status, 404);
    free(r.body);
    r = rq(&f->main, "POST", "/v1/endpoints", JSON_CT "Authorization: Bearer tok-123\r\n", ep,
           strlen(ep));
    assert_int_equal(r.status, 404);
    free(r.body);
    /* read-only routes answer on both */
    r = rq(&f->admin, "POST", "/v1/score", JSON_CT, "{\"model\":\"m\",\"token_ids\":[]}", 28);
    assert_int_equal(r.status, 200);
    free(r.body);

    /* token: missing → 401 + WWW-Authenticate, wrong → 403, right → through (503: no ingest) */
    r = rq(&f->admin, "DELETE", "/v1/pods/x", NULL, NULL, 0);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.headers, "WWW-Authenticate: Bearer"));
    free(r.body);
    r = rq(&f->admin, "DELETE", "/v1/pods/x", "Authorization: Basic dG9rLTEyMw==\r\n", NULL, 0);
    assert_int_equal(r.status, 401);
    free(r.body);
    r = rq(&f->admin, "DELETE", "/v1/pods/x", "Authorization: Bearer tok-12\r\n", NULL, 0);
    assert_int_equal(r.status, 403);
    free(r.body);
    r = rq(&f->admin, "DELETE", "/v1/pods/x", "Authorization: Bearer tok-1234\r\n", NULL, 0);
    assert_int_equal(r.status, 403);
    free(r.body);
    r = rq(&f->admin, "DELETE", "/v1/pods/x", "Authorization: bearer   tok-123  \r\n", NULL, 0);
    assert_int_equal(r.status, 503);
    free(r.body);
    r = rq(&f->admin, "POST", "/v1/endpoints", JSON_CT "Authorization: Bearer tok-123\r\n", ep,
           strlen(ep));
    assert_int_equal(r.status, 503);
    free(r.body);
    r = rq(&f->admin, "PUT", "/v1/endpoints", NULL, NULL, 0);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.headers, "Allow: GET, POST, DELETE"));
    free(r.body);
    r = rq(&f->admin, "GET", "/v1/pods/x", "Authorization: Bearer tok-123\r\n", NULL, 0);
    assert_int_equal(r.status, 405);
    free(r.body);
    fx_free(f);
}

/* With an admin listener: introspection routes only there (unless public_introspection);
 * probe-only connections answer health and nothing else; the token can be replaced. */
static void test_introspection_probe_token(void **state)
{
    static const char *const intro[] = {"/metrics", "/v1/pods", "/v1/endpoints"};
    struct fx *f = fx_new("admin_listen = 127.0.0.1:0\nadmin_token = old-tok\n");
    struct resp r;
    (void)state;

    for (size_t i = 0; i < 3; i++) {
        r = rq(&f->main, "GET", intro[i], NULL, NULL, 0);
        assert_int_equal(r.status, 404);
        assert_non_null(strstr(r.body, "public_introspection"));
        free(r.body);
        r = rq(&f->admin, "GET", intro[i], NULL, NULL, 0);
        assert_int_not_equal(r.status, 404); /* 200, or 503 without ingestion here */
        free(r.body);
    }
    r = rq(&f->main, "GET", "/healthz", NULL, NULL, 0);
    assert_int_equal(r.status, 200);
    free(r.body);

    /* token replaced (SIGHUP): the old one is refused, the new one accepted */
    r = rq(&f->admin, "DELETE", "/v1/pods/x", "Authorization: Bearer old-tok\r\n", NULL, 0);
    assert_int_equal(r.status, 503); /* authorized; no ingestion here */
    free(r.body);
    assert_int_equal(kvr_httpapi_set_token(f->api, "new-tok"), 0);
    r = rq(&f->admin, "DELETE", "/v1/pods/x", "Authorization: Bearer old-tok\r\n", NULL, 0);
    assert_int_equal(r.status, 403);
    free(r.body);
    r = rq(&f->admin, "DELETE", "/v1/pods/x", "Authorization: Bearer new-tok\r\n", NULL, 0);
    assert_int_equal(r.status, 503);
    free(r.body);
    assert_int_equal(kvr_httpapi_set_token(f->api, NULL), 0);
    r = rq(&f->admin, "DELETE", "/v1/pods/x", NULL, NULL, 0);
    assert_int_equal(r.status, 503);
    free(r.body);

    /* probe-only connection: health answered and closed, the rest 503 */
    f->main.probe_only = true;
    r = rq(&f->main, "GET", "/healthz", NULL, NULL, 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.headers, "Connection: close"));
    free(r.body);
    kvr_httpreq_conn_deinit(&f->main);
    kvr_httpreq_conn_init(&f->main, &f->lim, &f->st, kvr_httpapi_handle, f->th, &f->scratch,
                          false, 0);
    f->main.probe_only = true;
    r = rq(&f->main, "POST", "/v1/score", JSON_CT, "{}", 2);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.headers, "Connection: close"));
    free(r.body);
    assert_true(f->st.limits[KVR_LIMIT_CONNECTIONS] >= 1);
    fx_free(f);

    f = fx_new("admin_listen = 127.0.0.1:0\npublic_introspection = on\n");
    for (size_t i = 0; i < 3; i++) {
        r = rq(&f->main, "GET", intro[i], NULL, NULL, 0);
        assert_int_not_equal(r.status, 404);
        free(r.body);
    }
    fx_free(f);
}

static void test_helpers(void **state)
{
    char d[16];
    struct kvr_buf b;
    static const struct {
        double v;
        const char *s;
    } nums[] = {{0, "0"}, {1, "1"}, {12.8, "12.8"}, {0.5, "0.5"}, {2.25, "2.25"},
                {1.0000004, "1"}, {1.0000006, "1.000001"}, {-3.5, "-3.5"}, {123456.125, "123456.125"}};
    (void)state;

    assert_int_equal(kvr_httpapi_percent_decode("a%2Fb%20c", 9, d, sizeof(d)), 0);
    assert_string_equal(d, "a/b c");
    assert_int_equal(kvr_httpapi_percent_decode("a+b", 3, d, sizeof(d)), 0);
    assert_string_equal(d, "a+b");
    assert_int_equal(kvr_httpapi_percent_decode("%zz", 3, d, sizeof(d)), -EINVAL);
    assert_int_equal(kvr_httpapi_percent_decode("%2", 2, d, sizeof(d)), -EINVAL);
    assert_int_equal(kvr_httpapi_percent_decode("%00", 3, d, sizeof(d)), -EINVAL);
    assert_int_equal(kvr_httpapi_percent_decode("0123456789abcdef", 16, d, sizeof(d)), -EINVAL);
    kvr_buf_init(&b);
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        kvr_buf_reset(&b);
        kvr_httpapi_put_double(&b, nums[i].v);
        if (strcmp(b.data, nums[i].s) != 0)
            fail_msg("%g → %s, want %s", nums[i].v, b.data, nums[i].s);
    }
    kvr_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_score_route),
        cmocka_unit_test(test_token_limit),
        cmocka_unit_test(test_routes_health_metrics),
        cmocka_unit_test(test_introspection_probe_token),
        cmocka_unit_test(test_admin_listener_and_token),
        cmocka_unit_test(test_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
