/* httpapi_int.h — what the httpapi_*.c files share, private to them (libuv's internal.h):
 * the API and per-thread structures, the small output helpers, the error answer and the
 * body-to-tokens steps every query endpoint takes. Not a contract for other modules:
 * httpapi.h is. Files: httpapi.c (routing, every endpoint but one), httpapi_route.c
 * (POST /v1/route: candidates, the decision, approximate mode's hand-off).
 */
#ifndef KVR_HTTPAPI_INT_H
#define KVR_HTTPAPI_INT_H

#include "http/httpapi.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/buf.h"
#include "http/jtok.h"
#include "http/reqbody.h"
#include "route/rstat.h"

struct route_scratch;

struct kvr_httpapi {
    const struct kvr_conf *conf;
    struct kvr_score *score;
    struct kvr_ingest *ingest;
    struct kvr_zsub *zsub;
    struct kvr_index *index;
    struct kvr_snap *snap;
    struct kvr_tokset *tokset;
    struct kvr_route *route;
    struct kvr_load *load;
    struct kvr_share *share;
    struct kvr_rstat *rstat; /* decision metrics (owned; its own mutex) */
    const struct kvr_modelfilter *models; /* [events] models (NULL: all) */
    uint64_t max_prompt_bytes;
    bool admin_listener;
    bool public_introspection;
    pthread_mutex_t token_lock; /* token, token_len: set on SIGHUP (main), read by loops */
    char *token;      /* NULL = no auth */
    size_t token_len;
    uint32_t max_tokens;
    uint32_t min_streams_ready;  /* [events] min_streams_ready: /readyz waits for them */
    void (*server_metrics)(void *arg, struct kvr_buf *out);
    void *server_metrics_arg;
    _Atomic bool ready;
};

struct kvr_httpapi_thread {
    struct kvr_httpapi *api;
    struct kvr_httpstats *stats;
    struct kvr_score_ctx *sctx;
    struct kvr_tokset_reader *tok; /* NULL without tokenizers */
    uint32_t *tokens;
    const char **pods;
    struct kvr_hash_media media[KVR_REQBODY_MAX_MEDIA]; /* mm_hashes of a query */
    struct route_scratch *rs; /* POST /v1/route, allocated on first use */
    struct kvr_reqbody_chat chat; /* the request's chat keys (JSON bodies) */
    char decoded[KVR_HTTPREQ_URL_MAX + 1];
};

/* ---- small output helpers ---------------------------------------------------------------- */

static inline void put(struct kvr_buf *b, const char *s)
{
    kvr_buf_append(b, s, strlen(s));
}

static inline void put_json_str(struct kvr_buf *b, const char *s)
{
    size_t n = strlen(s);
    if (kvr_buf_reserve(b, 6 * n + 2) != 0)
        return;
    b->len += kvr_jtok_escape(b->data + b->len, s, n);
    b->data[b->len] = '\0';
}

static inline void put_u64(struct kvr_buf *b, uint64_t v)
{
    char tmp[24];
    int n = 0;
    if (kvr_buf_reserve(b, 24) != 0)
        return;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        b->data[b->len++] = tmp[--n];
    b->data[b->len] = '\0';
}

/* A member: key (with its comma, colon and quotes: ",\"dp_rank\":") and an integer. */
static inline void put_kv_u64(struct kvr_buf *b, const char *key, uint64_t v)
{
    put(b, key);
    put_u64(b, v);
}

/* An error answer: status and {"error": "<fmt>"}. */
void kvr_httpapi_fail(struct kvr_httpresp *resp, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define fail kvr_httpapi_fail

/* The body of /v1/score, /v1/tokenize or (rq != NULL: JSON only, candidates into cands)
 * /v1/route into q: 0, or -1 with the error answered. */
int kvr_httpapi_query_body(struct kvr_httpapi_thread *t, const struct kvr_httpreq *req,
                           struct kvr_httpresp *resp, struct kvr_reqbody_query *q,
                           struct kvr_reqbody_route *rq, struct kvr_reqbody_cand *cands,
                           size_t cap);
/* The query's text (chat messages rendered with the model's template, or the prompt) to
 * token ids into q->tokens/q->ntokens: 0, or -1 with the error answered. */
int kvr_httpapi_tokenize(struct kvr_httpapi_thread *t, struct kvr_reqbody_query *q,
                         struct kvr_httpresp *resp);

/* A query about to be scored: its text tokenized when it came as text, and the thread able
 * to score (503 otherwise): 0, or -1 with the error answered. */
int kvr_httpapi_score_ready(struct kvr_httpapi_thread *t, struct kvr_reqbody_query *q,
                            struct kvr_httpresp *resp);

/* The input kind of a parsed query for the decision metrics (rstat.h): token ids, a chat
 * (messages) or a prompt. */
static inline int kvr_httpapi_input_kind(const struct kvr_httpapi_thread *t,
                                         const struct kvr_reqbody_query *q)
{
    return q->has_tokens ? KVR_RSTAT_TOKENS
           : t->chat.messages_str != NULL ? KVR_RSTAT_CHAT
                                          : KVR_RSTAT_PROMPT;
}

/* POST /v1/route (httpapi_route.c). */
void kvr_httpapi_ep_route(struct kvr_httpapi_thread *t, const struct kvr_httpreq *req,
                          struct kvr_httpresp *resp);

#endif
