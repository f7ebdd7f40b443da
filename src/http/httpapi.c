/* httpapi.c — routing and endpoints of the HTTP API (see httpapi.h for the route table).
 *
 * Design:
 * - One routing function decides, in this order: route exists on this listener (404),
 *   method (405 + Allow), bearer token for mutating routes (401/403), content type (415),
 *   body (400/411/413), then the endpoint runs. Every error body is {"error": "..."}.
 * - Score responses are written by hand into the thread's scratch buffer (escaped strings,
 *   integers, a short fixed-point form for scores): no cJSON, no allocation once the
 *   buffers have grown.
 * - The score path decodes the body in place (reqbody) into the thread's token array and
 *   hashes straight from it (score.c).
 * - Ingestion is optional: unit tests, fuzzers and benchmarks pass ingest = NULL and
 *   zsub = NULL; routes that need them then answer 503. Pods (streams, purge) are ingest's;
 *   connect endpoints (list, add, remove) are zsub's and are asked of it directly. /metrics
 *   appends ingest's lines, then zsub's.
 * Threads: handlers run on loop threads; shared state is read-only except `ready`.
 * Files: POST /v1/route lives in httpapi_route.c; what the two share is httpapi_int.h.
 */
#include "http/httpapi.h"
#include "http/httpapi_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/jtok.h"
#include "core/metrics.h"
#include "core/modelfilter.h"
#include "http/reqbody.h"
#include "route/rstat.h"


int kvr_httpapi_create(const struct kvr_httpapi_deps *deps, struct kvr_httpapi **out)
{
    struct kvr_httpapi *api;

    if (deps == NULL || deps->conf == NULL || out == NULL)
        return -EINVAL;
    api = calloc(1, sizeof(*api));
    if (api == NULL)
        return -ENOMEM;
    api->conf = deps->conf;
    api->score = deps->score;
    api->ingest = deps->ingest;
    api->zsub = deps->zsub;
    api->index = deps->index;
    api->snap = deps->snap;
    api->tokset = deps->tokset;
    api->route = deps->route;
    api->load = deps->load;
    api->share = deps->share;
    api->models = deps->models;
    api->max_prompt_bytes = deps->conf->max_prompt_bytes > 0 ? (uint64_t)deps->conf->max_prompt_bytes
                                                             : 1u << 20;
    api->admin_listener = deps->admin_listener;
    api->public_introspection = deps->public_introspection;
    pthread_mutex_init(&api->token_lock, NULL);
    api->max_tokens = deps->conf->max_query_tokens ? deps->conf->max_query_tokens : 262144;
    api->min_streams_ready = deps->conf->min_streams_ready;
    api->server_metrics = deps->server_metrics;
    api->server_metrics_arg = deps->server_metrics_arg;
    if (deps->conf->admin_token != NULL && deps->conf->admin_token[0] != '\0') {
        api->token = strdup(deps->conf->admin_token);
        if (api->token == NULL) {
            free(api);
            return -ENOMEM;
        }
        api->token_len = strlen(api->token);
    }
    if (kvr_rstat_create(deps->conf->forget_after_ms, &api->rstat) != 0) {
        free(api->token);
        pthread_mutex_destroy(&api->token_lock);
        free(api);
        return -ENOMEM;
    }
    atomic_init(&api->ready, false);
    *out = api;
    return 0;
}

void kvr_httpapi_destroy(struct kvr_httpapi *api)
{
    if (api == NULL)
        return;
    if (api->token != NULL) {
        explicit_bzero(api->token, api->token_len);
        free(api->token);
    }
    pthread_mutex_destroy(&api->token_lock);
    kvr_rstat_destroy(api->rstat);
    free(api);
}

int kvr_httpapi_set_token(struct kvr_httpapi *api, const char *token)
{
    char *fresh = NULL, *old;
    size_t old_len;

    if (token != NULL && token[0] != '\0' && (fresh = strdup(token)) == NULL)
        return -ENOMEM;
    pthread_mutex_lock(&api->token_lock);
    old = api->token;
    old_len = api->token_len;
    api->token = fresh;
    api->token_len = fresh != NULL ? strlen(fresh) : 0;
    pthread_mutex_unlock(&api->token_lock);
    if (old != NULL) {
        explicit_bzero(old, old_len);
        free(old);
    }
    return 0;
}

void kvr_httpapi_set_ready(struct kvr_httpapi *api, bool ready)
{
    atomic_store_explicit(&api->ready, ready, memory_order_release);
}

bool kvr_httpapi_ready(const struct kvr_httpapi *api)
{
    return atomic_load_explicit(&api->ready, memory_order_acquire);
}

int kvr_httpapi_thread_create(struct kvr_httpapi *api, struct kvr_httpstats *stats,
                              struct kvr_httpapi_thread **out)
{
    struct kvr_httpapi_thread *t = calloc(1, sizeof(*t));
    int rc = -ENOMEM;

    if (t == NULL)
        return -ENOMEM;
    t->api = api;
    t->stats = stats;
    t->tokens = malloc((size_t)api->max_tokens * sizeof(uint32_t));
    t->pods = malloc(KVR_HTTPAPI_MAX_PODS * sizeof(char *));
    if (t->tokens == NULL || t->pods == NULL)
        goto fail;
    if (api->score != NULL) {
        rc = kvr_score_ctx_create(api->score, api->max_tokens, &t->sctx);
        if (rc != 0)
            goto fail;
    }
    if (api->tokset != NULL && (rc = kvr_tokset_reader_create(api->tokset, &t->tok)) != 0) {
        kvr_score_ctx_destroy(t->sctx);
        goto fail;
    }
    if (t->tok != NULL) /* a text past max_query_tokens stops as soon as that is known */
        kvr_tokset_reader_set_limit(t->tok, api->max_tokens);
    *out = t;
    return 0;
fail:
    free(t->tokens);
    free(t->pods);
    free(t);
    return rc;
}

void kvr_httpapi_thread_destroy(struct kvr_httpapi_thread *t)
{
    if (t == NULL)
        return;
    kvr_score_ctx_destroy(t->sctx);
    kvr_tokset_reader_destroy(t->tok);
    free(t->rs);
    free(t->tokens);
    free(t->pods);
    free(t);
}

/* ---- small output helpers ---------------------------------------------------------------- */

static void put_i64(struct kvr_buf *b, int64_t v)
{
    if (v < 0) {
        put(b, "-");
        put_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(b, (uint64_t)v);
    }
}

void kvr_httpapi_put_double(struct kvr_buf *b, double v)
{
    uint64_t scaled, ip, fp;
    char frac[8];
    int n = 6;

    if (!isfinite(v)) {
        put(b, "0");
        return;
    }
    if (v < 0) {
        put(b, "-");
        v = -v;
    }
    if (v >= 1e12) { /* not reached by sums of weights; keep it exact-ish and valid */
        kvr_buf_printf(b, "%.17g", v);
        return;
    }
    scaled = (uint64_t)llround(v * 1e6);
    ip = scaled / 1000000u;
    fp = scaled % 1000000u;
    put_u64(b, ip);
    if (fp == 0)
        return;
    for (int i = 5; i >= 0; i--) {
        frac[i] = (char)('0' + fp % 10);
        fp /= 10;
    }
    while (n > 0 && frac[n - 1] == '0')
        n--;
    put(b, ".");
    kvr_buf_append(b, frac, (size_t)n);
}

void kvr_httpapi_fail(struct kvr_httpresp *resp, int status, const char *fmt, ...)
{
    char msg[KVR_ERR_MSG_MAX + 64];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    resp->status = status;
    resp->content_type = "application/json";
    kvr_httpreq_error_body(resp->body, msg);
}

/* ---- request helpers --------------------------------------------------------------------- */

int kvr_httpapi_percent_decode(const char *src, size_t len, char *dst, size_t cap)
{
    size_t w = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c == '%') {
            int hi, lo;
            if (len - i < 3)
                return -EINVAL;
            hi = src[i + 1];
            lo = src[i + 2];
#define HEX(x) ((x) >= '0' && (x) <= '9' ? (x) - '0' : (x) >= 'a' && (x) <= 'f' ? (x) - 'a' + 10 \
               : (x) >= 'A' && (x) <= 'F' ? (x) - 'A' + 10 : -1)
            hi = HEX(hi);
            lo = HEX(lo);
#undef HEX
            if (hi < 0 || lo < 0)
                return -EINVAL;
            c = (unsigned char)(hi * 16 + lo);
            if (c == 0)
                return -EINVAL;
            i += 2;
        }
        if (w + 1 >= cap)
            return -EINVAL;
        dst[w++] = (char)c;
    }
    if (cap == 0)
        return -EINVAL;
    dst[w] = '\0';
    return 0;
}

enum body_kind { BODY_JSON, BODY_MSGPACK, BODY_OTHER };

static enum body_kind content_kind(const char *ct)
{
    size_t n;

    while (*ct == ' ' || *ct == '\t')
        ct++;
    n = strcspn(ct, ";");
    while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
        n--;
    if (n == 0)
        return BODY_JSON; /* absent: JSON */
#define IS(s) (n == sizeof(s) - 1 && strncasecmp(ct, s, n) == 0)
    if (IS("application/json"))
        return BODY_JSON;
    if (IS("application/msgpack") || IS("application/x-msgpack") || IS("application/vnd.msgpack"))
        return BODY_MSGPACK;
#undef IS
    return BODY_OTHER;
}

/* Constant time in the expected token's length, whatever is presented. */
static bool token_equal(const char *given, size_t glen, const char *want, size_t wlen)
{
    volatile unsigned char d = (unsigned char)(glen != wlen);
    for (size_t i = 0; i < wlen; i++)
        d = (unsigned char)(d | (unsigned char)(want[i] ^ (i < glen ? given[i] : 0)));
    return d == 0;
}

/* 0 when allowed; else the response is filled (401 or 403). The token may change on
 * SIGHUP: it is read and compared under token_lock (mutating routes only). */
static int check_auth(struct kvr_httpapi *api, const struct kvr_httpreq *req,
                      struct kvr_httpresp *resp)
{
    const char *a;
    size_t n;
    bool ok;

    pthread_mutex_lock(&api->token_lock);
    if (api->token == NULL) {
        pthread_mutex_unlock(&api->token_lock);
        return 0;
    }
    if (req->auth == NULL || req->auth_len < 7 || strncasecmp(req->auth, "bearer ", 7) != 0) {
        pthread_mutex_unlock(&api->token_lock);
        fail(resp, 401, "missing bearer token (Authorization: Bearer <admin_token>)");
        resp->extra_headers = "WWW-Authenticate: Bearer realm=\"kvrouterd\"\r\n";
        return -1;
    }
    a = req->auth + 7;
    n = req->auth_len - 7;
    while (n > 0 && (*a == ' ' || *a == '\t')) {
        a++;
        n--;
    }
    while (n > 0 && (a[n - 1] == ' ' || a[n - 1] == '\t'))
        n--;
    ok = !req->auth_truncated && token_equal(a, n, api->token, api->token_len);
    pthread_mutex_unlock(&api->token_lock);
    if (!ok) {
        fail(resp, 403, "wrong bearer token");
        return -1;
    }
    return 0;
}

/* A body is there (411 when unframed, 400 when empty): 0, or the error answered. */
static int need_body(const struct kvr_httpreq *req, struct kvr_httpresp *resp)
{
    if (req->body_len == 0) {
        if (!req->has_length) {
            /* a body sent without framing would be parsed as the next request: close */
            fail(resp, 411, "request body required (Content-Length)");
            resp->close = true;
        } else
            fail(resp, 400, "empty request body");
        return -1;
    }
    return 0;
}

/* JSON body presence and type for endpoints that take one (score has its own). */
static int need_json_body(const struct kvr_httpreq *req, struct kvr_httpresp *resp)
{
    if (content_kind(req->content_type) != BODY_JSON) {
        fail(resp, 415, "unsupported content type '%s' (use application/json)",
             req->content_type);
        return -1;
    }
    return need_body(req, resp);
}

/* ---- POST /v1/score -------------------------------------------------------------------- */

static void write_score(struct kvr_buf *b, const char *model, const struct kvr_score_result *r,
                        long prompt_tokens)
{
    put(b, "{\"model\":");
    put_json_str(b, model);
    put(b, ",\"block_size\":");
    if (r->block_size)
        put_u64(b, r->block_size);
    else
        put(b, "null");
    put_kv_u64(b, ",\"query_blocks\":", r->query_blocks);
    if (prompt_tokens >= 0) { /* the query was text: how many tokens it made */
        put_kv_u64(b, ",\"tokens\":", (uint64_t)prompt_tokens);
    }
    put(b, ",\"scores\":[");
    for (size_t i = 0; i < r->nentries; i++) {
        const struct kvr_score_entry *e = &r->entries[i];
        bool first = true;
        put(b, i ? ",{\"pod\":" : "{\"pod\":");
        put_json_str(b, e->pod);
        put_kv_u64(b, ",\"dp_rank\":", e->dp_rank);
        put_kv_u64(b, ",\"matched_blocks\":", e->matched_blocks);
        put_kv_u64(b, ",\"matched_tokens\":", e->matched_tokens);
        if (e->predicted_blocks > e->matched_blocks) /* issue #26: routed there, unconfirmed */
            put_kv_u64(b, ",\"predicted_blocks\":", e->predicted_blocks);
        put(b, ",\"tiers\":{");
        for (int t = 0; t < KVR_TIER_MAX; t++) {
            const char *name = r->tier_names[t];
            if (e->tiers[t] == 0)
                continue;
            if (name == NULL)
                name = t == KVR_TIER_GPU ? "gpu" : t == KVR_TIER_CPU ? "cpu" : "storage";
            if (!first)
                put(b, ",");
            first = false;
            put_json_str(b, name);
            put_kv_u64(b, ":", e->tiers[t]);
        }
        put(b, "},\"score\":");
        kvr_httpapi_put_double(b, e->score);
        put(b, "}");
    }
    put(b, "]}\n");
}

/* The checks every query body passes first (415, 411, empty): 0, or the error answered. */
static int query_body_ok(const struct kvr_httpreq *req, struct kvr_httpresp *resp,
                         enum body_kind kind, bool json_only)
{
    if (kind == BODY_OTHER || (json_only && kind != BODY_JSON)) {
        fail(resp, 415, json_only ? "unsupported content type '%s' (this route takes "
                                    "application/json)"
                                  : "unsupported content type '%s' (use application/json or "
                                    "application/msgpack)", req->content_type);
        return -1;
    }
    return need_body(req, resp);
}

/* The body of /v1/score, /v1/tokenize or (rq != NULL: JSON only, candidates into cands)
 * /v1/route into q: 0, or the error answered. */
int kvr_httpapi_query_body(struct kvr_httpapi_thread *t, const struct kvr_httpreq *req,
                           struct kvr_httpresp *resp, struct kvr_reqbody_query *q,
                           struct kvr_reqbody_route *rq, struct kvr_reqbody_cand *cands,
                           size_t cap)
{
    struct kvr_reqbody_scratch sc = {t->tokens, t->api->max_tokens, t->pods,
                                     KVR_HTTPAPI_MAX_PODS, t->media, KVR_REQBODY_MAX_MEDIA};
    struct kvr_err err;
    enum body_kind kind = content_kind(req->content_type);
    int rc;

    if (query_body_ok(req, resp, kind, rq != NULL) != 0)
        return -1;
    err.msg[0] = '\0';
    t->chat.messages_str = NULL;
    if (kind == BODY_JSON) { /* with tokenizers, chat bodies too */
        kvr_tmpl_ctx *ctx = t->tok != NULL ? kvr_tokset_reader_ctx(t->tok) : NULL;
        if (ctx != NULL)
            kvr_tmpl_ctx_reset(ctx);
        rc = kvr_reqbody_query_ext(req->body, req->body_len, &sc, q, ctx,
                                   ctx != NULL ? &t->chat : NULL, cands, cap, rq, &err);
    } else {
        rc = kvr_reqbody_query_msgpack(req->body, req->body_len, &sc, q, &err);
    }
    if (rc == -E2BIG) {
        kvr_httpreq_stats_limit(t->stats, KVR_LIMIT_TOKENS);
        fail(resp, 413, "%s", err.msg);
        return -1;
    }
    if (rc != 0) {
        fail(resp, 400, "%s", err.msg[0] ? err.msg : "invalid body");
        return -1;
    }
    /* a model partitioned to another instance: not an empty answer, an error the gateway
     * can see (docs/scaling.md) */
    if (!kvr_modelfilter_holds(t->api->models, q->model, strlen(q->model))) {
        fail(resp, 404, "model \"%.300s\" is not held by this kvrouterd instance: its "
                        "[events] models (%.400s) excludes it",
             q->model, kvr_modelfilter_text(t->api->models));
        return -1;
    }
    return 0;
}

/* A query about to be scored (httpapi_int.h). */
int kvr_httpapi_score_ready(struct kvr_httpapi_thread *t, struct kvr_reqbody_query *q,
                            struct kvr_httpresp *resp)
{
    if (!q->has_tokens) {
        uint64_t t0 = kvr_now_ns();
        if (kvr_httpapi_tokenize(t, q, resp) != 0)
            return -1;
        kvr_rstat_tokenized(t->api->rstat, kvr_httpapi_input_kind(t, q),
                            (double)(kvr_now_ns() - t0) / 1e9);
    }
    if (t->sctx == NULL) {
        fail(resp, 503, "scoring is not available");
        return -1;
    }
    return 0;
}

/* The query's text to token ids (into q->tokens, q->ntokens): the chat messages rendered
 * with the model's template, or the prompt; then tokenized. 0, or the error answered. */
int kvr_httpapi_tokenize(struct kvr_httpapi_thread *t, struct kvr_reqbody_query *q,
                         struct kvr_httpresp *resp)
{
    const struct kvr_reqbody_chat *ch = &t->chat;
    bool chat = ch->messages_str != NULL;
    const char *what = chat ? "the rendered chat" : "\"prompt\"";
    const uint32_t *ids;
    char msg[400] = "";
    int n;

    if (chat) {
        struct kvr_tokset_chat c = {
            .messages_str = ch->messages_str, .messages_parts = ch->messages_parts,
            .tools = ch->tools, .documents = ch->documents, .kwargs = ch->kwargs,
            .add_generation_prompt = ch->add_generation_prompt,
            .continue_final_message = ch->continue_final_message,
            /* vLLM's chat default: the template writes the special tokens itself */
            .add_special_tokens = q->add_special_given ? q->add_special_tokens : false,
            .final_text = ch->final_text, .final_len = ch->final_len,
            .max_render_bytes = t->api->max_prompt_bytes};
        n = kvr_tokset_chat(t->tok, q->model, &c, &ids, msg, sizeof(msg));
    } else if (q->prompt_len > t->api->max_prompt_bytes) {
        n = -E2BIG;
    } else {
        n = t->tok != NULL ? kvr_tokset_encode(t->tok, q->model, q->prompt, q->prompt_len,
                                               q->add_special_tokens, &ids)
                           : -ENOENT;
    }
    switch (n) {
    case -ENOENT:
        fail(resp, 400, "no tokenizer for model \"%.300s\" (configure [model \"%.300s\"] "
                        "tokenizer, or send token_ids)", q->model, q->model);
        return -1;
    case -ENOTSUP:
        fail(resp, 400, "model \"%.300s\" has no chat template (set [model] chat_template, "
                        "or send a prompt or token_ids)", q->model);
        return -1;
    case -EINVAL:
    case -ELOOP:
        fail(resp, 400, "chat template: %s", msg[0] ? msg : "too deep or too many iterations");
        return -1;
    case -E2BIG:
        kvr_httpreq_stats_limit(t->stats, KVR_LIMIT_TOKENS);
        fail(resp, 413, "%s is longer than [tokenizer] max_prompt_bytes (%llu bytes)", what,
             (unsigned long long)t->api->max_prompt_bytes);
        return -1;
    case -EILSEQ:
        fail(resp, 400, "%s is not valid UTF-8", what);
        return -1;
    case -EMSGSIZE: /* stopped early: the rest was not tokenized */
        kvr_httpreq_stats_limit(t->stats, KVR_LIMIT_TOKENS);
        fail(resp, 413, "%s makes more than [http] max_query_tokens (%u) tokens", what,
             t->api->max_tokens);
        return -1;
    default:
        break;
    }
    if (n < 0) {
        fail(resp, 500, "tokenization failed: %s", strerror(-n));
        return -1;
    }
    if ((uint64_t)n > t->api->max_tokens) {
        kvr_httpreq_stats_limit(t->stats, KVR_LIMIT_TOKENS);
        fail(resp, 413, "%s makes %d tokens, more than [http] max_query_tokens (%u)", what, n,
             t->api->max_tokens);
        return -1;
    }
    q->tokens = ids;
    q->ntokens = (size_t)n;
    return 0;
}

static void ep_score(struct kvr_httpapi_thread *t, const struct kvr_httpreq *req,
                     struct kvr_httpresp *resp)
{
    struct kvr_reqbody_query q;
    struct kvr_score_query sq;
    struct kvr_score_result res;
    uint64_t t0 = kvr_now_ns();
    uint32_t best = 0;
    int rc;

    if (kvr_httpapi_query_body(t, req, resp, &q, NULL, NULL, 0) != 0 ||
        kvr_httpapi_score_ready(t, &q, resp) != 0)
        return;
    sq.model = q.model;
    sq.lora_name = q.lora_name;
    sq.tokens = q.tokens;
    sq.ntokens = q.ntokens;
    sq.pods = q.pods;
    sq.npods = q.npods;
    sq.cache_salt = q.cache_salt;
    sq.media = q.media;
    sq.nmedia = q.nmedia;
    sq.want_hashes = false;
    rc = kvr_score_query(t->sctx, &sq, &res);
    if (rc == -E2BIG) {
        kvr_httpreq_stats_limit(t->stats, KVR_LIMIT_TOKENS);
        fail(resp, 413, "query too large");
        return;
    }
    if (rc != 0) {
        fail(resp, 500, "scoring failed: %s", strerror(-rc));
        return;
    }
    write_score(resp->body, q.model, &res, q.has_tokens ? -1 : (long)q.ntokens);
    for (size_t i = 0; i < res.nentries; i++)
        if (res.entries[i].matched_blocks > best)
            best = res.entries[i].matched_blocks;
    kvr_rstat_record(t->api->rstat,
                     &(struct kvr_rstat_decision){
                         .endpoint = KVR_RSTAT_SCORE, .input = kvr_httpapi_input_kind(t, &q),
                         .model = q.model, .query_blocks = res.query_blocks,
                         .block_size = res.block_size, .prompt_tokens = q.ntokens,
                         .best_matched = best, .seconds = (double)(kvr_now_ns() - t0) / 1e9});
}

/* ---- POST /v1/tokenize ----------------------------------------------------------------- */

static void ep_tokenize(struct kvr_httpapi_thread *t, const struct kvr_httpreq *req,
                        struct kvr_httpresp *resp)
{
    struct kvr_reqbody_query q;
    struct kvr_buf *b = resp->body;

    if (kvr_httpapi_query_body(t, req, resp, &q, NULL, NULL, 0) != 0)
        return;
    if (q.has_tokens) {
        fail(resp, 400, "/v1/tokenize takes \"prompt\" (text), not \"token_ids\"");
        return;
    }
    if (kvr_httpapi_tokenize(t, &q, resp) != 0)
        return;
    if (kvr_buf_reserve(b, 64 + strlen(q.model) * 6 + q.ntokens * 11) != 0) {
        fail(resp, 500, "out of memory");
        return;
    }
    put(b, "{\"model\":");
    put_json_str(b, q.model);
    put(b, ",\"tokens\":[");
    for (size_t i = 0; i < q.ntokens; i++) {
        if (i)
            put(b, ",");
        put_u64(b, q.tokens[i]);
    }
    put_kv_u64(b, "],\"count\":", q.ntokens);
    put(b, "}\n");
}

/* ---- pods -------------------------------------------------------------------------------- */

/* A JSON array written by an iteration callback: the buffer and the elements so far. */
struct json_list {
    struct kvr_buf *b;
    size_t n;
    struct kvr_route *route; /* pods: the tracked loads beside each stream */
    struct kvr_load *load;   /* pods: the engine's scraped load (kvr_load_put_json) */
};

static void pod_cb(const struct kvr_stream_info *s, void *arg)
{
    struct json_list *pc = arg;
    struct kvr_buf *b = pc->b;
    bool first = true;

    put(b, pc->n++ ? ",{\"pod\":" : "{\"pod\":");
    put_json_str(b, s->pod ? s->pod : "");
    put(b, ",\"model\":");
    put_json_str(b, s->model ? s->model : "");
    put_kv_u64(b, ",\"dp_rank\":", s->dp_rank);
    put_kv_u64(b, ",\"blocks\":", s->blocks);
    put(b, ",\"tiers\":{");
    for (int i = 0; i < KVR_TIER_MAX; i++) {
        if (s->tier_names[i] == NULL || s->tier_blocks[i] == 0)
            continue;
        if (!first)
            put(b, ",");
        first = false;
        put_json_str(b, s->tier_names[i]);
        put_kv_u64(b, ":", s->tier_blocks[i]);
    }
    put_kv_u64(b, "},\"last_seq\":", s->last_seq);
    put_kv_u64(b, ",\"gaps\":", s->gaps);
    put_kv_u64(b, ",\"replays\":", s->replays);
    put_kv_u64(b, ",\"restarts\":", s->restarts);
    put(b, ",\"state\":");
    put_json_str(b, kvr_stream_state_name(s->state));
    put_kv_u64(b, ",\"orphans\":", s->orphans);
    put(b, ",\"last_event_age_ms\":");
    put_i64(b, s->last_event_age_ms);
    if (pc->route != NULL) {
        struct kvr_route_flight f; /* one look under the route mutex */
        kvr_route_flight_of(pc->route, s->pod ? s->pod : "", s->dp_rank, &f);
        /* the role: a gateway's, given with the last decision routed here, else the
         * model's prefill_pods / decode_pods */
        int role = f.role_given >= 0 ? f.role_given
                                     : kvr_route_role_of(pc->route, s->model, s->pod ? s->pod
                                                                                     : "");
        put(b, ",\"role\":");
        put_json_str(b, kvr_route_role_name(role));
        put(b, f.role_given >= 0 ? ",\"role_source\":\"gateway\"" : ",\"role_source\":\"config\"");
        put_kv_u64(b, ",\"active_requests\":", f.requests);
        put_kv_u64(b, ",\"active_tokens\":", f.tokens);
        put_kv_u64(b, ",\"inflight\":{\"prefills\":", f.pending);
        put_kv_u64(b, ",\"prefill_tokens\":", f.pending_tokens);
        put_kv_u64(b, ",\"decoding\":", f.decoding);
        put_kv_u64(b, ",\"confirmed\":", f.confirmed);
        put(b, ",\"prefill_rate\":");
        kvr_httpapi_put_double(b, f.prefill_rate);
        put(b, "}");
    }
    kvr_load_put_json(pc->load, s->pod ? s->pod : "", s->dp_rank, b);
    put(b, "}");
}

/* One worker with a role (kvr_route_roles). */
static void role_cb(void *arg, const struct kvr_route_role_info *ri)
{
    struct json_list *l = arg;
    put(l->b, l->n++ ? ",{\"pod\":" : "{\"pod\":");
    put_json_str(l->b, ri->pod);
    if (ri->dp_rank >= 0)
        put_kv_u64(l->b, ",\"dp_rank\":", (uint64_t)ri->dp_rank);
    if (ri->model != NULL) {
        put(l->b, ",\"model\":");
        put_json_str(l->b, ri->model);
    }
    put(l->b, ",\"role\":");
    put_json_str(l->b, kvr_route_role_name(ri->role));
    put(l->b, ri->from_gateway ? ",\"source\":\"gateway\"" : ",\"source\":\"config\"");
    if (ri->from_gateway) {
        put(l->b, ",\"idle_ms\":");
        put_i64(l->b, ri->idle_ms);
    }
    put(l->b, "}");
}

/* One approximate-mode worker (kvr_ingest_assumed_workers). */
static void assumed_cb(void *arg, const char *pod, uint32_t dp_rank, uint64_t blocks)
{
    struct json_list *l = arg;
    put(l->b, l->n++ ? ",{\"pod\":" : "{\"pod\":");
    put_json_str(l->b, pod);
    put_kv_u64(l->b, ",\"dp_rank\":", dp_rank);
    put_kv_u64(l->b, ",\"blocks\":", blocks);
    kvr_load_put_json(l->load, pod, dp_rank, l->b);
    put(l->b, "}");
}

static void ep_pods(struct kvr_httpapi_thread *t, struct kvr_httpresp *resp)
{
    struct json_list pc = {resp->body, 0, t->api->route, t->api->load};
    struct json_list ac = {resp->body, 0, NULL, t->api->load};

    put(resp->body, "{\"pods\":[");
    kvr_ingest_streams(t->api->ingest, pod_cb, &pc);
    put(resp->body, "],\"assumed\":[");
    kvr_ingest_assumed_workers(t->api->ingest, assumed_cb, &ac);
    put(resp->body, "],\"roles\":[");
    struct json_list rc = {resp->body, 0, NULL, NULL};
    if (t->api->route != NULL)
        kvr_route_roles(t->api->route, role_cb, &rc);
    put(resp->body, "]}\n");
}

static void ep_pod_delete(struct kvr_httpapi_thread *t, const char *raw, size_t rawlen,
                          struct kvr_httpresp *resp)
{
    uint64_t removed = 0;
    int rc;

    if (kvr_httpapi_percent_decode(raw, rawlen, t->decoded, sizeof(t->decoded)) != 0) {
        fail(resp, 400, "bad percent-encoding in the pod name");
        return;
    }
    rc = kvr_ingest_purge_pod(t->api->ingest, t->decoded, &removed);
    if (rc == -ENOENT) {
        fail(resp, 404, "unknown pod '%s'", t->decoded);
        return;
    }
    if (rc != 0) {
        fail(resp, 500, "purge failed: %s", strerror(-rc));
        return;
    }
    size_t bonds = t->api->route != NULL ? kvr_route_forget_pod(t->api->route, t->decoded) : 0;
    kvr_rstat_forget_pod(t->api->rstat, t->decoded); /* its decision series go too */
    put(resp->body, "{\"pod\":");
    put_json_str(resp->body, t->decoded);
    put_kv_u64(resp->body, ",\"removed_blocks\":", removed);
    put_kv_u64(resp->body, ",\"session_bonds\":", bonds);
    put(resp->body, "}\n");
}

/* ---- endpoints --------------------------------------------------------------------------- */

static void put_opt_str(struct kvr_buf *b, const char *s)
{
    if (s == NULL)
        put(b, "null");
    else
        put_json_str(b, s);
}

static void ep_cb(const struct kvr_zsub_endpoint *e, void *arg)
{
    struct json_list *ec = arg;
    struct kvr_buf *b = ec->b;

    put(b, ec->n++ ? ",{\"endpoint\":" : "{\"endpoint\":");
    put_opt_str(b, e->endpoint);
    put(b, ",\"replay_endpoint\":");
    put_opt_str(b, e->replay);
    put(b, ",\"pod\":");
    put_opt_str(b, e->pod);
    put(b, e->connected ? ",\"connected\":true" : ",\"connected\":false");
    put(b, e->from_config ? ",\"from_config\":true}" : ",\"from_config\":false}");
}

static void ep_endpoints_get(struct kvr_httpapi_thread *t, struct kvr_httpresp *resp)
{
    struct json_list ec = {resp->body, 0, NULL, NULL};

    put(resp->body, "{\"endpoints\":[");
    kvr_zsub_endpoints(t->api->zsub, ep_cb, &ec);
    put(resp->body, "]}\n");
}

static void ep_endpoints_change(struct kvr_httpapi_thread *t, const struct kvr_httpreq *req,
                                struct kvr_httpresp *resp, bool add)
{
    struct kvr_reqbody_endpoint e;
    struct kvr_err err;
    int rc;

    if (need_json_body(req, resp) != 0)
        return;
    err.msg[0] = '\0';
    if (kvr_reqbody_endpoint_json(req->body, req->body_len, &e, &err) != 0) {
        fail(resp, 400, "%s", err.msg);
        return;
    }
    err.msg[0] = '\0';
    if (add)
        rc = kvr_zsub_endpoint_add(t->api->zsub, e.endpoint, e.replay_endpoint, e.pod, &err);
    else
        rc = kvr_zsub_endpoint_del(t->api->zsub, e.endpoint, &err);
    if (rc == -EEXIST) {
        fail(resp, 409, "endpoint '%s' already exists", e.endpoint);
        return;
    }
    if (rc == -ENOENT) {
        fail(resp, 404, "endpoint '%s' is not configured", e.endpoint);
        return;
    }
    if (rc == -EINVAL) {
        fail(resp, 400, "%s", err.msg[0] ? err.msg : "invalid endpoint");
        return;
    }
    if (rc != 0) {
        fail(resp, 500, "%s: %s", add ? "adding the endpoint failed" : "removal failed",
             err.msg[0] ? err.msg : strerror(-rc));
        return;
    }
    resp->status = add ? 201 : 200;
    put(resp->body, "{\"endpoint\":");
    put_json_str(resp->body, e.endpoint);
    if (add) {
        put(resp->body, ",\"replay_endpoint\":");
        put_opt_str(resp->body, e.replay_endpoint);
        put(resp->body, ",\"pod\":");
        put_opt_str(resp->body, e.pod);
    } else {
        put(resp->body, ",\"removed\":true");
    }
    put(resp->body, "}\n");
}

/* ---- health, readiness, metrics -------------------------------------------------------- */

/* Ingestion is ready when its writers and its receive thread run (each optional). */
static bool ingestion_ready(const struct kvr_httpapi *api)
{
    return (api->ingest == NULL || kvr_ingest_ready(api->ingest)) &&
           (api->zsub == NULL || kvr_zsub_running(api->zsub));
}

/* [events] min_streams_ready: enough streams synced (always, when 0); *n gets how many. */
static bool streams_ready(const struct kvr_httpapi *api, uint64_t *n)
{
    *n = 0;
    if (api->min_streams_ready == 0)
        return true;
    *n = api->ingest != NULL ? kvr_ingest_synced(api->ingest) : 0;
    return *n >= api->min_streams_ready;
}

static void ep_readyz(struct kvr_httpapi *api, struct kvr_httpresp *resp)
{
    bool http_ready = kvr_httpapi_ready(api);
    bool ing_ready = ingestion_ready(api);
    uint64_t synced;
    bool st_ready = streams_ready(api, &synced);

    if (http_ready && ing_ready && st_ready) {
        put(resp->body, "{\"ready\":true}\n");
        return;
    }
    if (http_ready && ing_ready) {
        fail(resp, 503, "not ready (%" PRIu64 " of [events] min_streams_ready = %u streams "
                        "synced)", synced, api->min_streams_ready);
        return;
    }
    fail(resp, 503, "not ready (%s)", !http_ready ? "starting or stopping" : "ingestion not ready");
}

/* The index's gauges: the one renderer of them (ingest renders only its own figures). */
static void index_gauges(struct kvr_index *ix, struct kvr_buf *b)
{
    struct kvr_index_stats st;
    uint64_t tier_blocks[KVR_TIER_MAX] = {0};
    uint32_t nw = kvr_index_worker_count(ix);
    bool first = true;

    kvr_index_stats(ix, &st);
    kvr_metrics_gauge(b, "index_entries", "(position, content hash) entries", NULL,
                      (double)st.entries);
    kvr_metrics_gauge(b, "index_holders", "(holder, entry) pairs", NULL, (double)st.holders);
    kvr_metrics_gauge(b, "index_memory_bytes", "Bytes used by the index", NULL,
                      (double)st.bytes);
    kvr_metrics_gauge(b, "index_workers", "Workers (pod, dp_rank) known", NULL,
                      (double)st.workers);
    kvr_metrics_gauge(b, "index_namespaces", "Namespaces (model, LoRA) known", NULL,
                      (double)st.namespaces);
    kvr_metrics_gauge(b, "index_orphans", "Blocks parked waiting for a parent", NULL,
                      (double)st.orphans);
    for (uint32_t wid = 0; wid < nw; wid++) {
        uint64_t tb[KVR_TIER_MAX];
        kvr_index_worker_blocks(ix, wid, tb);
        for (int t = 0; t < KVR_TIER_MAX; t++)
            tier_blocks[t] += tb[t];
    }
    for (int t = 0; t < KVR_TIER_MAX; t++) {
        const char *name = kvr_index_tier_name(ix, (uint8_t)t);
        char esc[64], lab[80];
        if (name == NULL)
            continue;
        kvr_metrics_label_escape(esc, sizeof(esc), name);
        snprintf(lab, sizeof(lab), "tier=\"%s\"", esc);
        kvr_metrics_gauge(b, "index_blocks", first ? "Blocks held, by tier" : NULL, lab,
                          (double)tier_blocks[t]);
        first = false;
    }
}

static void ep_metrics(struct kvr_httpapi *api, struct kvr_httpresp *resp)
{
    struct kvr_buf *b = resp->body;

    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    uint64_t synced;
    bool st_ready = streams_ready(api, &synced);
    kvr_metrics_gauge(b, "ready", "1 while /readyz answers 200", NULL,
                      kvr_httpapi_ready(api) && ingestion_ready(api) && st_ready ? 1.0 : 0.0);
    kvr_metrics_gauge(b, "ready_min_streams", "[events] min_streams_ready (0 = off)", NULL,
                      (double)api->min_streams_ready);
    if (api->ingest != NULL)
        kvr_ingest_metrics(api->ingest, b);
    if (api->zsub != NULL)
        kvr_zsub_metrics(api->zsub, b);
    if (api->index != NULL)
        index_gauges(api->index, b);
    if (api->score != NULL)
        kvr_score_metrics(api->score, b);
    if (api->tokset != NULL)
        kvr_tokset_metrics(api->tokset, b);
    if (api->route != NULL)
        kvr_route_metrics(api->route, b);
    kvr_rstat_metrics(api->rstat, b);
    if (api->snap != NULL)
        kvr_snap_metrics(api->snap, b);
    kvr_load_metrics(api->load, b); /* nothing when NULL */
    if (api->share != NULL)
        kvr_share_metrics(api->share, b);
    if (api->server_metrics != NULL)
        api->server_metrics(api->server_metrics_arg, b);
}

/* GET /v1/snapshot: a fresh snapshot, taken as the periodic ones are (each ingest writer its
 * part between two batches; scoring never waits), into this loop thread's response scratch
 * and sent with Content-Length. Not bounded by max_output_bytes (which only pauses reading
 * further requests of the connection): the whole snapshot is held in memory twice while it is
 * sent (scratch, then the connection's output), and this loop thread answers nothing else
 * while the writers take their parts. A peer's bootstrap is the intended client. */
static void ep_snapshot(struct kvr_httpapi *api, struct kvr_httpresp *resp)
{
    struct kvr_err err;

    if (kvr_snap_take(api->snap, resp->body, &err) != 0) {
        kvr_buf_reset(resp->body);
        fail(resp, 503, "%s", err.msg);
        return;
    }
    resp->content_type = "application/octet-stream";
}

/* ---- routing ---------------------------------------------------------------------------- */

static bool path_is(const struct kvr_httpreq *req, const char *p)
{
    size_t n = strlen(p);
    return req->path_len == n && memcmp(req->path, p, n) == 0;
}

/* Runs a void call and returns from the (void) handler. */
#define RET_VOID(call) \
    do {               \
        call;          \
        return;        \
    } while (0)

/* allow_hdr is a complete "Allow: ...\r\n" line (a string constant). */
static void method_not_allowed(struct kvr_httpresp *resp, const char *allow_hdr)
{
    fail(resp, 405, "method not allowed (%.*s)", (int)strcspn(allow_hdr, "\r"), allow_hdr);
    resp->extra_headers = allow_hdr;
}

/* An introspection route asked on the main listener while the admin listener serves it. */
static void not_here(struct kvr_httpresp *resp)
{
    fail(resp, 404, "not found on this listener (metrics, pods and endpoints are served on "
                    "[http] admin_listen unless public_introspection = on)");
}

/* An admin route asked on the main listener while an admin listener is configured. */
static void not_admin(struct kvr_httpresp *resp)
{
    fail(resp, 404, "not found on this listener (admin endpoints are served on "
                    "[http] admin_listen)");
}

#define ALLOW_GET "Allow: GET\r\n"
#define ALLOW_POST "Allow: POST\r\n"
#define ALLOW_DELETE "Allow: DELETE\r\n"
#define ALLOW_ALL "Allow: GET, POST, DELETE\r\n"

enum kvr_http_ep kvr_httpapi_offload(const struct kvr_httpapi *api, const struct kvr_httpreq *req,
                                     size_t min_bytes)
{
    if (api->tokset == NULL || req->probe_only || req->method != HTTP_POST ||
        req->body_len < min_bytes)
        return KVR_EP_OTHER;
    if (path_is(req, "/v1/score"))
        return KVR_EP_SCORE;
    if (path_is(req, "/v1/tokenize"))
        return KVR_EP_TOKENIZE;
    if (path_is(req, "/v1/route") && api->route != NULL)
        return KVR_EP_ROUTE;
    return KVR_EP_OTHER;
}

void kvr_httpapi_handle(void *arg, const struct kvr_httpreq *req, struct kvr_httpresp *resp)
{
    struct kvr_httpapi_thread *t = arg;
    struct kvr_httpapi *api = t->api;
    int m = req->method;
    bool admin_ok = !api->admin_listener || req->admin;
    bool intro_ok = admin_ok || api->public_introspection;

    if (req->probe_only) { /* over the connection cap: health probes only, one answer */
        resp->close = true;
        if (!(path_is(req, "/healthz") || path_is(req, "/readyz"))) {
            kvr_httpreq_stats_limit(t->stats, KVR_LIMIT_CONNECTIONS);
            RET_VOID(fail(resp, 503, "too many connections"));
        }
    }

    if (path_is(req, "/v1/score")) {
        resp->endpoint = KVR_EP_SCORE;
        if (m != HTTP_POST)
            RET_VOID(method_not_allowed(resp, ALLOW_POST));
        RET_VOID(ep_score(t, req, resp));
    }
    if (path_is(req, "/v1/tokenize")) {
        resp->endpoint = KVR_EP_TOKENIZE;
        if (m != HTTP_POST)
            RET_VOID(method_not_allowed(resp, ALLOW_POST));
        RET_VOID(ep_tokenize(t, req, resp));
    }
    if (path_is(req, "/v1/route")) {
        resp->endpoint = KVR_EP_ROUTE;
        if (m != HTTP_POST)
            RET_VOID(method_not_allowed(resp, ALLOW_POST));
        if (api->route == NULL)
            RET_VOID(fail(resp, 503, "routing is not available"));
        RET_VOID(kvr_httpapi_ep_route(t, req, resp));
    }
    if (req->path_len > 11 && memcmp(req->path, "/v1/routes/", 11) == 0) {
        resp->endpoint = KVR_EP_ROUTE;
        if (m != HTTP_DELETE)
            RET_VOID(method_not_allowed(resp, ALLOW_DELETE));
        if (api->route == NULL)
            RET_VOID(fail(resp, 503, "routing is not available"));
        if (kvr_route_end(api->route, req->path + 11, req->path_len - 11) != 0)
            RET_VOID(fail(resp, 404, "no such route (unknown, ended or expired)"));
        put(resp->body, "{\"ended\":true}\n");
        return;
    }
    if (path_is(req, "/healthz")) {
        resp->endpoint = KVR_EP_HEALTHZ;
        if (m != HTTP_GET)
            RET_VOID(method_not_allowed(resp, ALLOW_GET));
        put(resp->body, "{\"status\":\"ok\"}\n");
        return;
    }
    if (path_is(req, "/readyz")) {
        resp->endpoint = KVR_EP_READYZ;
        if (m != HTTP_GET)
            RET_VOID(method_not_allowed(resp, ALLOW_GET));
        RET_VOID(ep_readyz(api, resp));
    }
    if (path_is(req, "/metrics")) {
        resp->endpoint = KVR_EP_METRICS;
        if (!intro_ok)
            RET_VOID(not_here(resp));
        if (m != HTTP_GET)
            RET_VOID(method_not_allowed(resp, ALLOW_GET));
        RET_VOID(ep_metrics(api, resp));
    }
    if (path_is(req, "/v1/pods")) {
        resp->endpoint = KVR_EP_PODS;
        if (!intro_ok)
            RET_VOID(not_here(resp));
        if (m != HTTP_GET)
            RET_VOID(method_not_allowed(resp, ALLOW_GET));
        if (api->ingest == NULL)
            RET_VOID(fail(resp, 503, "ingestion is not running"));
        RET_VOID(ep_pods(t, resp));
    }
    if (req->path_len > 9 && memcmp(req->path, "/v1/pods/", 9) == 0) {
        resp->endpoint = KVR_EP_POD_DELETE;
        if (!admin_ok)
            RET_VOID(not_admin(resp));
        if (m != HTTP_DELETE)
            RET_VOID(method_not_allowed(resp, ALLOW_DELETE));
        if (check_auth(api, req, resp) != 0)
            return;
        if (api->ingest == NULL)
            RET_VOID(fail(resp, 503, "ingestion is not running"));
        RET_VOID(ep_pod_delete(t, req->path + 9, req->path_len - 9, resp));
    }
    if (path_is(req, "/v1/snapshot")) {
        resp->endpoint = KVR_EP_OTHER;
        if (!admin_ok)
            RET_VOID(not_admin(resp));
        if (m != HTTP_GET)
            RET_VOID(method_not_allowed(resp, ALLOW_GET));
        if (check_auth(api, req, resp) != 0)
            return;
        if (api->snap == NULL)
            RET_VOID(fail(resp, 503, "snapshots are not available"));
        RET_VOID(ep_snapshot(api, resp));
    }
    if (path_is(req, "/v1/endpoints")) {
        resp->endpoint = KVR_EP_ENDPOINTS;
        if (!intro_ok)
            RET_VOID(not_here(resp));
        if (m != HTTP_GET && m != HTTP_POST && m != HTTP_DELETE)
            RET_VOID(method_not_allowed(resp, admin_ok ? ALLOW_ALL : ALLOW_GET));
        if (m != HTTP_GET) {
            if (!admin_ok)
                RET_VOID(not_admin(resp));
            if (check_auth(api, req, resp) != 0)
                return;
        }
        if (api->zsub == NULL)
            RET_VOID(fail(resp, 503, "ingestion is not running"));
        if (m == HTTP_GET)
            RET_VOID(ep_endpoints_get(t, resp));
        RET_VOID(ep_endpoints_change(t, req, resp, m == HTTP_POST));
    }
    fail(resp, 404, "no such endpoint");
}
