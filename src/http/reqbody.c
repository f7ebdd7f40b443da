/* reqbody.c — JSON (through jtok) and msgpack (a bounded cursor) request bodies.
 *
 * Design: one pass over the body, in place. JSON keys and string values are decoded into the
 * buffer by jtok; msgpack strings are moved one header back (the header is at least one byte
 * long) so they can be NUL-terminated without touching the next item. NUL characters (JSON
 * "\u0000", a 0 byte in a msgpack string): text is (pointer, length) end to end, so "prompt"
 * keeps them (vLLM tokenizes U+0000 like any other character; so do the chat values,
 * reqbody_chat.c); every string used as a C string (model, lora_name, cache_salt, pods,
 * mm_hashes hashes, candidates' pods, policy, endpoints) is refused with a 400 naming the
 * field, never cut short at its first NUL. The JSON and msgpack walks decode values each their
 * own way and share the rest: one table of the query's keys (qkey_*: duplicates), the checks
 * and stores of its strings (query_str) and of mm_hashes items (media_*), so a value is
 * checked alike in both (only type errors, found by each decoder, read differently). The
 * msgpack cursor checks every length
 * against the bytes left before reading, so a count can never make it loop past the buffer;
 * generic values are skipped with a depth limit. Msgpack token arrays go through
 * kvr_decode_u32_run() (decode_scan.c: 64-byte windows with AVX-512 VBMI when the CPU has it, a
 * scalar loop otherwise), this file's careful cursor taking every element the run leaves
 * (rare widths, negatives, errors with their messages); both ISA levels accept and reject
 * exactly the same bodies with the same messages (tests/unit/test_reqbody.c and fuzz_jtok
 * compare them).
 * Pure; any thread.
 */
#include "http/reqbody.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "core/base.h" /* KVR_NAME_MAX */
#include "events/decode.h"
#include "http/jtok.h"
#include "http/reqbody_int.h"

#define MP_MAX_DEPTH 64

static int jerr(struct kvr_jtok *j, struct kvr_err *err)
{
    if (err != NULL)
        kvr_jtok_errstr(j, err->msg, sizeof(err->msg));
    return j->code != 0 ? j->code : -EINVAL;
}

static bool key_is(const char *k, size_t klen, const char *name)
{
    size_t n = strlen(name);
    return klen == n && memcmp(k, name, n) == 0;
}

/* A decoded string that holds a NUL byte, refused where the string becomes a C string: the
 * message is the field's name followed by NUL_REFUSED. */
#define NUL_REFUSED " must not contain a NUL character (\\u0000)"

static bool has_nul(const char *s, size_t n)
{
    return memchr(s, 0, n) != NULL;
}

static int query_check(struct kvr_reqbody_query *q, bool model, bool tokens, bool prompt,
                       struct kvr_err *err)
{
    if (!model)
        return kvr_err_set(err, -EINVAL, "missing \"model\"");
    if (tokens && prompt)
        return kvr_err_set(err, -EINVAL, "give either \"token_ids\" or \"prompt\", not both");
    if (!tokens && !prompt)
        return kvr_err_set(err, -EINVAL, "missing \"token_ids\" (or \"prompt\")");
    q->has_tokens = tokens;
    return 0;
}

/* mm_hashes items after parsing: what the engine's hashing assumes (reqbody.h). */
static int media_check(const struct kvr_hash_media *m, size_t n, struct kvr_err *err)
{
    for (size_t i = 0; i < n; i++) {
        if (m[i].id_len == 0 || m[i].id_len > KVR_NAME_MAX)
            return kvr_err_set(err, -EINVAL, "\"mm_hashes\"[%zu].hash must be 1..%d bytes", i,
                               KVR_NAME_MAX);
        if (m[i].length == 0)
            return kvr_err_set(err, -EINVAL, "\"mm_hashes\"[%zu].length must be >= 1", i);
        if (i > 0 && m[i].offset < m[i - 1].offset + m[i - 1].length)
            return kvr_err_set(err, -EINVAL, "\"mm_hashes\" must be sorted by offset and not "
                                             "overlap (item %zu)", i);
    }
    return 0;
}

/* ---- what the JSON and msgpack walks share ---------------------------------------------- */

/* The query's keys: each walk decodes a value its own way, then these check and store it. */
enum qkey { QK_TOKENS, QK_MODEL, QK_PROMPT, QK_SPECIAL, QK_LORA, QK_SALT, QK_MEDIA, QK_PODS, QK_N };
static const char *const qkey_names[QK_N] = {"token_ids", "model", "prompt", "add_special_tokens",
                                             "lora_name", "cache_salt", "mm_hashes", "pods"};
#define QBIT(k) (1u << (k))

/* The key's index, or -1 for another key. */
static int qkey_find(const char *key, size_t klen)
{
    for (int k = 0; k < QK_N; k++)
        if (key_is(key, klen, qkey_names[k]))
            return k;
    return -1;
}

/* Marks key k seen: 0, or the duplicate-key error. */
static int qkey_once(unsigned *seen, int k, struct kvr_err *err)
{
    if (*seen & QBIT(k))
        return kvr_err_set(err, -EINVAL, "duplicate key \"%s\"", qkey_names[k]);
    *seen |= QBIT(k);
    return 0;
}

static void query_init(struct kvr_reqbody_query *q, const struct kvr_reqbody_scratch *s)
{
    memset(q, 0, sizeof(*q));
    q->tokens = s->tokens;
    q->pods = s->pods;
    q->add_special_tokens = true;
}

/* A decoded string value of key k (model, prompt, lora_name, cache_salt, or a pods item):
 * checked and stored. The prompt is text (may hold NUL); the others are C strings. */
static int query_str(struct kvr_reqbody_query *q, const struct kvr_reqbody_scratch *s, int k,
                     char *str, size_t slen, struct kvr_err *err)
{
    switch (k) {
    case QK_PROMPT:
        q->prompt = str;
        q->prompt_len = slen;
        return 0;
    case QK_MODEL:
        if (slen == 0 || slen > KVR_NAME_MAX)
            return kvr_err_set(err, -EINVAL, "\"model\" must be 1..%d bytes", KVR_NAME_MAX);
        break;
    case QK_LORA:
        if (slen > KVR_NAME_MAX)
            return kvr_err_set(err, -EINVAL, "\"lora_name\" longer than %d bytes",
                               KVR_NAME_MAX);
        break;
    case QK_PODS:
        if (q->npods >= s->max_pods)
            return kvr_err_set(err, -EINVAL, "too many pods (limit %zu)", s->max_pods);
        if (has_nul(str, slen))
            return kvr_err_set(err, -EINVAL, "\"pods\"[%zu]" NUL_REFUSED, q->npods);
        s->pods[q->npods++] = str;
        return 0;
    default:
        break;
    }
    if (has_nul(str, slen))
        return kvr_err_set(err, -EINVAL, "\"%s\"" NUL_REFUSED, qkey_names[k]);
    if (k == QK_MODEL)
        q->model = str;
    else /* lora_name, cache_salt: "" is none */
        *(k == QK_LORA ? &q->lora_name : &q->cache_salt) = slen ? str : NULL;
    return 0;
}

/* mm_hashes items' keys, as qkey_* for the query's. */
enum mkey { MK_HASH, MK_OFFSET, MK_LENGTH, MK_N };
static const char *const mkey_names[MK_N] = {"hash", "offset", "length"};

/* An item's key: its index, MK_N for another key (skipped), or the duplicate error. */
static int media_key(const char *key, size_t klen, unsigned *seen, size_t item,
                     struct kvr_err *err)
{
    for (int k = 0; k < MK_N; k++) {
        if (!key_is(key, klen, mkey_names[k]))
            continue;
        if (*seen & QBIT(k))
            return kvr_err_set(err, -EINVAL, "duplicate key in \"mm_hashes\" item %zu", item);
        *seen |= QBIT(k);
        return k;
    }
    return MK_N;
}

/* Where an item's integer key goes. */
static uint64_t *media_slot(struct kvr_hash_media *m, int k)
{
    return k == MK_OFFSET ? &m->offset : &m->length;
}

static int media_int_err(size_t item, int k, struct kvr_err *err)
{
    return kvr_err_set(err, -EINVAL, "\"mm_hashes\"[%zu].%s must be an integer in [0, 2^32)",
                       item, mkey_names[k]);
}

/* The end of item i: all three keys given, or the error. */
static int media_item_done(unsigned seen, size_t item, struct kvr_err *err)
{
    if (seen != QBIT(MK_N) - 1)
        return kvr_err_set(err, -EINVAL, "\"mm_hashes\"[%zu] needs \"hash\", \"offset\" "
                           "and \"length\"", item);
    return 0;
}

/* ---- JSON ------------------------------------------------------------------------------- */

/* An unsigned integer in [0, 2^32) at the cursor (no sign, fraction or exponent). */
static int json_u32(struct kvr_jtok *j, uint64_t *v)
{
    uint64_t x = 0;
    char *p;

    if (kvr_jtok_peek(j) < '0' || kvr_jtok_peek(j) > '9')
        return -EINVAL;
    p = j->p;
    if (*p == '0' && p + 1 < j->end && p[1] >= '0' && p[1] <= '9')
        return -EINVAL;
    while (p < j->end && *p >= '0' && *p <= '9') {
        x = x * 10 + (uint64_t)(*p++ - '0');
        if (x > UINT32_MAX)
            return -EINVAL;
    }
    if (p < j->end && (*p == '.' || *p == 'e' || *p == 'E'))
        return -EINVAL;
    j->p = p;
    *v = x;
    return 0;
}

/* "mm_hashes": [{"hash": str, "offset": u32, "length": u32}, ...] or null. */
static int json_media(struct kvr_jtok *j, const struct kvr_reqbody_scratch *s,
                      struct kvr_reqbody_query *q, struct kvr_err *err)
{
    int ast = 0, rc;

    q->media = s->media;
    if (kvr_jtok_null(j))
        return 0;
    if (kvr_jtok_peek(j) != '[')
        return kvr_err_set(err, -EINVAL, "\"mm_hashes\" must be an array of objects");
    while ((rc = kvr_jtok_array_next(j, &ast)) == 1) {
        struct kvr_hash_media *m;
        unsigned seen = 0;
        int ost = 0, orc, k;
        char *key, *str;
        size_t klen, slen;

        if (kvr_jtok_peek(j) != '{')
            return kvr_err_set(err, -EINVAL, "\"mm_hashes\" must be an array of objects");
        if (q->nmedia >= s->max_media)
            return kvr_err_set(err, -EINVAL, "too many \"mm_hashes\" items (limit %zu)",
                               s->max_media);
        m = &s->media[q->nmedia];
        memset(m, 0, sizeof(*m));
        while ((orc = kvr_jtok_object_next(j, &ost, &key, &klen)) == 1) {
            if ((k = media_key(key, klen, &seen, q->nmedia, err)) < 0)
                return k;
            if (k == MK_N) {
                if (kvr_jtok_skip(j) != 0)
                    return jerr(j, err);
                continue;
            }
            if (k != MK_HASH) {
                if (json_u32(j, media_slot(m, k)) != 0)
                    return media_int_err(q->nmedia, k, err);
                continue;
            }
            if (kvr_jtok_peek(j) != '"')
                return kvr_err_set(err, -EINVAL, "\"mm_hashes\"[%zu].hash must be a string",
                                   q->nmedia);
            if (kvr_jtok_string(j, &str, &slen) != 0)
                return jerr(j, err);
            if (has_nul(str, slen))
                return kvr_err_set(err, -EINVAL, "\"mm_hashes\"[%zu].hash" NUL_REFUSED,
                                   q->nmedia);
            m->id = str;
            m->id_len = slen;
        }
        if (orc < 0)
            return jerr(j, err);
        if ((rc = media_item_done(seen, q->nmedia, err)) != 0)
            return rc;
        q->nmedia++;
    }
    if (rc < 0)
        return jerr(j, err);
    return media_check(q->media, q->nmedia, err);
}

/* An array of token ids at the cursor into the scratch: 0, -E2BIG, or -EINVAL with bad (NULL:
 * jtok's own message). */
static int json_ids(struct kvr_jtok *j, const struct kvr_reqbody_scratch *s,
                    struct kvr_reqbody_query *q, const char *bad, struct kvr_err *err)
{
    int rc = kvr_jtok_u32_array(j, s->tokens, s->max_tokens, &q->ntokens);
    if (rc == -E2BIG)
        return kvr_err_set(err, -E2BIG, "too many token ids (limit %zu)", s->max_tokens);
    if (rc != 0)
        return bad != NULL ? kvr_err_set(err, -EINVAL, "%s", bad) : jerr(j, err);
    return 0;
}

/* A string value of key k at the cursor: 0 with *str, *slen; 1 when nullable and null; or the
 * type error. */
static int json_str(struct kvr_jtok *j, int k, bool nullable, char **str, size_t *slen,
                    struct kvr_err *err)
{
    if (nullable && kvr_jtok_null(j))
        return 1;
    if (kvr_jtok_peek(j) != '"')
        return kvr_err_set(err, -EINVAL, "\"%s\" must be a string%s", qkey_names[k],
                           nullable ? " or null" : "");
    return kvr_jtok_string(j, str, slen) != 0 ? jerr(j, err) : 0;
}

/* The keys a query body had (for callers that accept more forms than the query itself). */
struct seen {
    bool model, tokens, prompt;
};

/* Other endpoints' own keys in a query body: 1 consumed, 0 not theirs, or -errno. */
typedef int (*json_hook)(void *arg, const char *key, size_t klen, struct kvr_jtok *j,
                         struct kvr_err *err);

static int query_json(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                      struct kvr_reqbody_query *q, struct kvr_err *err, json_hook hook,
                      void *hook_arg, struct seen *so)
{
    static const char both[] = "give either \"token_ids\" or \"prompt\", not both";
    struct kvr_jtok j;
    unsigned seen = 0;
    bool prompt_ids = false;
    int st = 0, rc, k;
    char *key, *str;
    size_t klen, slen;

    query_init(q, s);
    kvr_jtok_init(&j, body, len);
    if (kvr_jtok_peek(&j) != '{')
        return kvr_err_set(err, -EINVAL, "body must be a JSON object");
    while ((rc = kvr_jtok_object_next(&j, &st, &key, &klen)) == 1) {
        if ((k = qkey_find(key, klen)) < 0) {
            int h = hook ? hook(hook_arg, key, klen, &j, err) : 0;
            if (h < 0)
                return h;
            if (h == 0 && kvr_jtok_skip(&j) != 0)
                return jerr(&j, err);
            continue;
        }
        if (k == QK_TOKENS && prompt_ids)
            return kvr_err_set(err, -EINVAL, both);
        if ((rc = qkey_once(&seen, k, err)) != 0)
            return rc;
        switch (k) {
        case QK_TOKENS:
            if ((rc = json_ids(&j, s, q, NULL, err)) != 0)
                return rc;
            continue;
        case QK_PROMPT:
            if (kvr_jtok_peek(&j) != '[')
                break;
            /* /v1/completions: one prompt as token ids (then a "prompt" again is not a
             * duplicate: the checks after the walk refuse two forms) */
            if (seen & QBIT(QK_TOKENS))
                return kvr_err_set(err, -EINVAL, both);
            if ((rc = json_ids(&j, s, q, "\"prompt\" must be a string or one array of token "
                               "ids (a batch of several prompts is not supported)", err)) != 0)
                return rc;
            seen = (seen | QBIT(QK_TOKENS)) & ~QBIT(QK_PROMPT);
            prompt_ids = true;
            continue;
        case QK_SPECIAL: {
            int c = kvr_jtok_peek(&j);
            if (c != 't' && c != 'f')
                return kvr_err_set(err, -EINVAL, "\"add_special_tokens\" must be true or false");
            if (kvr_jtok_bool(&j, &q->add_special_tokens) != 0)
                return jerr(&j, err);
            q->add_special_given = true;
            continue;
        }
        case QK_MEDIA:
            if ((rc = json_media(&j, s, q, err)) != 0)
                return rc;
            continue;
        case QK_PODS: {
            int ast = 0;
            if (kvr_jtok_null(&j))
                continue;
            if (kvr_jtok_peek(&j) != '[')
                return kvr_err_set(err, -EINVAL, "\"pods\" must be an array of strings");
            while ((rc = kvr_jtok_array_next(&j, &ast)) == 1) {
                if (kvr_jtok_peek(&j) != '"')
                    return kvr_err_set(err, -EINVAL, "\"pods\" must be an array of strings");
                if (kvr_jtok_string(&j, &str, &slen) != 0)
                    return jerr(&j, err);
                if ((rc = query_str(q, s, k, str, slen, err)) != 0)
                    return rc;
            }
            if (rc < 0)
                return jerr(&j, err);
            continue;
        }
        default: /* model, lora_name, cache_salt */
            break;
        }
        /* the string keys: model, a prompt as text, lora_name and cache_salt (or null) */
        if ((rc = json_str(&j, k, k == QK_LORA || k == QK_SALT, &str, &slen, err)) < 0)
            return rc;
        if (rc == 0 && (rc = query_str(q, s, k, str, slen, err)) != 0)
            return rc;
    }
    if (rc < 0)
        return jerr(&j, err);
    if (kvr_jtok_finish(&j) != 0)
        return jerr(&j, err);
    if (so != NULL) { /* the caller checks, knowing its own keys */
        *so = (struct seen){seen & QBIT(QK_MODEL), seen & QBIT(QK_TOKENS),
                            seen & QBIT(QK_PROMPT)};
        return 0;
    }
    return query_check(q, seen & QBIT(QK_MODEL), seen & QBIT(QK_TOKENS),
                       seen & QBIT(QK_PROMPT), err);
}

int kvr_reqbody_query_json(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                           struct kvr_reqbody_query *q, struct kvr_err *err)
{
    return query_json(body, len, s, q, err, NULL, NULL, NULL);
}

/* ---- POST /v1/route: the query plus "candidates", "policy", "track" ---------------------- */

struct route_ctx {
    struct kvr_reqbody_route *rq; /* NULL: route keys are not this endpoint's */
    struct kvr_reqbody_cand *cands;
    size_t cap;
    bool seen_cands, seen_policy, seen_track, seen_session;
    kvr_tmpl_ctx *tctx;           /* NULL: chat keys are not this endpoint's */
    struct kvr_reqbody_chat *chat;
};

static int route_cand(struct route_ctx *rc, struct kvr_jtok *j, struct kvr_err *err)
{
    struct kvr_reqbody_cand *c = &rc->cands[rc->rq->ncands];
    int st = 0, r;
    char *key, *str;
    size_t klen, slen;
    uint64_t v;
    bool sp = false, sr = false, sq = false, stk = false, sro = false;

    memset(c, 0, sizeof(*c));
    c->role = -1;
    if (kvr_jtok_peek(j) != '{')
        return kvr_err_set(err, -EINVAL, "\"candidates\"[%zu] must be an object",
                           rc->rq->ncands);
    while ((r = kvr_jtok_object_next(j, &st, &key, &klen)) == 1) {
        bool *seen = key_is(key, klen, "pod") ? &sp
                     : key_is(key, klen, "dp_rank") ? &sr
                     : key_is(key, klen, "active_requests") ? &sq
                     : key_is(key, klen, "active_tokens") ? &stk
                     : key_is(key, klen, "role") ? &sro
                                                           : NULL;
        if (seen == NULL) {
            if (kvr_jtok_skip(j) != 0)
                return jerr(j, err);
            continue;
        }
        if (*seen)
            return kvr_err_set(err, -EINVAL, "\"candidates\"[%zu]: duplicate key \"%.*s\"",
                               rc->rq->ncands, (int)klen, key);
        *seen = true;
        if (seen == &sp) {
            if (kvr_jtok_peek(j) != '"' || kvr_jtok_string(j, &str, &slen) != 0 || slen == 0 ||
                slen > KVR_NAME_MAX)
                return kvr_err_set(err, -EINVAL, "\"candidates\"[%zu].pod must be a string of "
                                   "1..%d bytes", rc->rq->ncands, KVR_NAME_MAX);
            if (has_nul(str, slen))
                return kvr_err_set(err, -EINVAL, "\"candidates\"[%zu].pod" NUL_REFUSED,
                                   rc->rq->ncands);
            c->pod = str;
            continue;
        }
        if (seen == &sro) {
            static const char *const roles[] = {"both", "prefill", "decode"};
            c->role = -1;
            if (kvr_jtok_peek(j) == '"' && kvr_jtok_string(j, &str, &slen) == 0)
                for (int k = 0; k < 3 && c->role < 0; k++)
                    if (slen == strlen(roles[k]) && memcmp(str, roles[k], slen) == 0)
                        c->role = k;
            if (c->role < 0)
                return kvr_err_set(err, -EINVAL, "\"candidates\"[%zu].role must be \"prefill\", "
                                   "\"decode\" or \"both\"", rc->rq->ncands);
            continue;
        }
        if (kvr_jtok_u64(j, &v) != 0 || (seen == &sr && v > UINT32_MAX))
            return kvr_err_set(err, -EINVAL, "\"candidates\"[%zu].%.*s must be a non-negative "
                               "integer%s", rc->rq->ncands, (int)klen, key,
                               seen == &sr ? " below 2^32" : "");
        if (seen == &sr)
            c->dp_rank = (uint32_t)v;
        else if (seen == &sq)
            c->active_requests = v, c->has_requests = true;
        else
            c->active_tokens = v, c->has_tokens = true;
    }
    if (r < 0)
        return jerr(j, err);
    if (!sp)
        return kvr_err_set(err, -EINVAL, "\"candidates\"[%zu] needs \"pod\"", rc->rq->ncands);
    rc->rq->ncands++;
    return 0;
}

static int route_hook(void *arg, const char *key, size_t klen, struct kvr_jtok *j,
                      struct kvr_err *err)
{
    struct route_ctx *rc = arg;
    char *str;
    size_t slen;
    int r, st = 0;

    if (rc->tctx != NULL && (r = kvr_reqbody_chat_key(rc->chat, rc->tctx, key, klen, j, err)) != 0)
        return r;
    if (rc->rq == NULL)
        return 0;
    if (key_is(key, klen, "candidates")) {
        if (rc->seen_cands)
            return kvr_err_set(err, -EINVAL, "duplicate key \"candidates\"");
        rc->seen_cands = true;
        if (kvr_jtok_null(j))
            return 1;
        if (kvr_jtok_peek(j) != '[')
            return kvr_err_set(err, -EINVAL, "\"candidates\" must be an array of objects");
        while ((r = kvr_jtok_array_next(j, &st)) == 1) {
            if (rc->rq->ncands >= rc->cap)
                return kvr_err_set(err, -EINVAL, "too many candidates (limit %zu)", rc->cap);
            if ((r = route_cand(rc, j, err)) != 0)
                return r;
        }
        return r < 0 ? jerr(j, err) : 1;
    }
    if (key_is(key, klen, "policy")) {
        if (rc->seen_policy)
            return kvr_err_set(err, -EINVAL, "duplicate key \"policy\"");
        rc->seen_policy = true;
        if (kvr_jtok_null(j))
            return 1;
        if (kvr_jtok_peek(j) != '"' || kvr_jtok_string(j, &str, &slen) != 0)
            return kvr_err_set(err, -EINVAL, "\"policy\" must be a string");
        if (has_nul(str, slen))
            return kvr_err_set(err, -EINVAL, "\"policy\"" NUL_REFUSED);
        rc->rq->policy = str;
        return 1;
    }
    if (key_is(key, klen, "session_id")) {
        if (rc->seen_session)
            return kvr_err_set(err, -EINVAL, "duplicate key \"session_id\"");
        rc->seen_session = true;
        if (kvr_jtok_null(j))
            return 1;
        if (kvr_jtok_peek(j) != '"' || kvr_jtok_string(j, &str, &slen) != 0 || slen == 0 ||
            slen > 256)
            return kvr_err_set(err, -EINVAL, "\"session_id\" must be a string of 1..256 bytes");
        if (has_nul(str, slen))
            return kvr_err_set(err, -EINVAL, "\"session_id\"" NUL_REFUSED);
        rc->rq->session = str;
        rc->rq->session_len = slen;
        return 1;
    }
    if (key_is(key, klen, "track")) {
        int c = kvr_jtok_peek(j);
        if (rc->seen_track)
            return kvr_err_set(err, -EINVAL, "duplicate key \"track\"");
        rc->seen_track = true;
        if (c != 't' && c != 'f')
            return kvr_err_set(err, -EINVAL, "\"track\" must be true or false");
        return kvr_jtok_bool(j, &rc->rq->track) != 0 ? jerr(j, err) : 1;
    }
    return 0;
}

int kvr_reqbody_query_ext(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                          struct kvr_reqbody_query *q, kvr_tmpl_ctx *ctx,
                          struct kvr_reqbody_chat *chat, struct kvr_reqbody_cand *cands,
                          size_t cap, struct kvr_reqbody_route *rq, struct kvr_err *err)
{
    struct route_ctx rc = {rq, cands, cap, false, false, false, false, ctx, chat};
    struct seen so;
    int r;

    if (rq != NULL) {
        memset(rq, 0, sizeof(*rq));
        rq->cands = cands;
    }
    if (chat != NULL) {
        memset(chat, 0, sizeof(*chat));
        chat->add_generation_prompt = true;
    }
    if ((r = query_json(body, len, s, q, err, route_hook, &rc, &so)) != 0)
        return r;
    bool msgs = chat != NULL && chat->messages_str != NULL;
    if (!so.model)
        return kvr_err_set(err, -EINVAL, "missing \"model\"");
    if (so.tokens + so.prompt + msgs > 1)
        return kvr_err_set(err, -EINVAL, "give one of \"token_ids\", \"prompt\" and "
                                         "\"messages\"");
    if (!so.tokens && !so.prompt && !msgs)
        return kvr_err_set(err, -EINVAL, "missing \"token_ids\", \"prompt\" or \"messages\"");
    if (msgs && chat->continue_final_message && chat->add_generation_prompt)
        return kvr_err_set(err, -EINVAL, "continue_final_message and add_generation_prompt "
                                         "cannot both be true (set add_generation_prompt to "
                                         "false)");
    q->has_tokens = so.tokens;
    return 0;
}
static int opt_string(struct kvr_jtok *j, const char *name, const char **out, struct kvr_err *err)
{
    char *str;
    size_t slen;

    if (kvr_jtok_null(j)) {
        *out = NULL;
        return 0;
    }
    if (kvr_jtok_peek(j) != '"')
        return kvr_err_set(err, -EINVAL, "\"%s\" must be a string", name);
    if (kvr_jtok_string(j, &str, &slen) != 0)
        return jerr(j, err);
    if (has_nul(str, slen))
        return kvr_err_set(err, -EINVAL, "\"%s\"" NUL_REFUSED, name);
    *out = slen ? str : NULL;
    return 0;
}

int kvr_reqbody_endpoint_json(char *body, size_t len, struct kvr_reqbody_endpoint *e,
                              struct kvr_err *err)
{
    struct kvr_jtok j;
    bool seen[3] = {false, false, false};
    static const char *const names[3] = {"endpoint", "replay_endpoint", "pod"};
    const char **slots[3];
    int st = 0, rc;
    char *key;
    size_t klen;

    memset(e, 0, sizeof(*e));
    slots[0] = &e->endpoint;
    slots[1] = &e->replay_endpoint;
    slots[2] = &e->pod;
    kvr_jtok_init(&j, body, len);
    if (kvr_jtok_peek(&j) != '{')
        return kvr_err_set(err, -EINVAL, "body must be a JSON object");
    while ((rc = kvr_jtok_object_next(&j, &st, &key, &klen)) == 1) {
        int k;
        for (k = 0; k < 3; k++)
            if (key_is(key, klen, names[k]))
                break;
        if (k == 3) {
            if (kvr_jtok_skip(&j) != 0)
                return jerr(&j, err);
            continue;
        }
        if (seen[k])
            return kvr_err_set(err, -EINVAL, "duplicate key \"%s\"", names[k]);
        seen[k] = true;
        if ((rc = opt_string(&j, names[k], slots[k], err)) != 0)
            return rc;
    }
    if (rc < 0)
        return jerr(&j, err);
    if (kvr_jtok_finish(&j) != 0)
        return jerr(&j, err);
    if (e->endpoint == NULL)
        return kvr_err_set(err, -EINVAL, "missing \"endpoint\" (a non-empty string)");
    return 0;
}

/* ---- msgpack ---------------------------------------------------------------------------- */

struct mp {
    unsigned char *p;
    unsigned char *end;
    unsigned char *base;
    struct kvr_err *err;
};

static int mp_fail(struct mp *m, const char *what)
{
    return kvr_err_set(m->err, -EINVAL, "msgpack: %s at byte %zu", what,
                       (size_t)(m->p - m->base));
}

static inline uint64_t be(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t be64(uint64_t x)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return x;
#else
    return __builtin_bswap64(x);
#endif
}

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline bool mp_has(const struct mp *m, uint64_t n)
{
    return (uint64_t)(m->end - m->p) >= n;
}

/* Reads a container or string header of the given family: returns 0 and *n, or -EINVAL. */
enum mp_kind { MP_STR, MP_ARRAY, MP_MAP };

static int mp_header(struct mp *m, enum mp_kind kind, uint64_t *n, size_t *hdr)
{
    unsigned char b;
    unsigned w = 0;

    if (!mp_has(m, 1))
        return -EINVAL;
    b = m->p[0];
    switch (kind) {
    case MP_STR:
        if (b >= 0xa0 && b <= 0xbf) {
            *n = b & 0x1f;
            *hdr = 1;
            return 0;
        }
        w = b == 0xd9 ? 1 : b == 0xda ? 2 : b == 0xdb ? 4 : 0;
        break;
    case MP_ARRAY:
        if (b >= 0x90 && b <= 0x9f) {
            *n = b & 0x0f;
            *hdr = 1;
            return 0;
        }
        w = b == 0xdc ? 2 : b == 0xdd ? 4 : 0;
        break;
    case MP_MAP:
        if (b >= 0x80 && b <= 0x8f) {
            *n = b & 0x0f;
            *hdr = 1;
            return 0;
        }
        w = b == 0xde ? 2 : b == 0xdf ? 4 : 0;
        break;
    }
    if (w == 0 || !mp_has(m, 1 + w))
        return -EINVAL;
    *n = be(m->p + 1, w);
    *hdr = 1 + w;
    return 0;
}

/* A string: moved one header back and NUL-terminated in place. A 0 byte inside it is refused
 * unless text (the prompt, (pointer, length) end to end). */
static int mp_string(struct mp *m, const char *name, bool text, char **s, size_t *len)
{
    uint64_t n;
    size_t hdr;
    unsigned char *start = m->p;

    if (mp_header(m, MP_STR, &n, &hdr) != 0 || !mp_has(m, hdr + n))
        return kvr_err_set(m->err, -EINVAL, "msgpack: \"%s\" must be a string", name);
    if (!text && memchr(start + hdr, 0, n) != NULL)
        return kvr_err_set(m->err, -EINVAL, "msgpack: \"%s\"" NUL_REFUSED, name);
    memmove(start, start + hdr, n);
    start[n] = '\0';
    m->p = start + hdr + n;
    *s = (char *)start;
    *len = n;
    return 0;
}

static int mp_nil(struct mp *m)
{
    if (mp_has(m, 1) && m->p[0] == 0xc0) {
        m->p++;
        return 1;
    }
    return 0;
}

static int mp_skip(struct mp *m, int depth)
{
    unsigned char b;
    uint64_t n, len;
    size_t hdr;

    if (depth > MP_MAX_DEPTH)
        return mp_fail(m, "nested too deeply");
    if (!mp_has(m, 1))
        return mp_fail(m, "truncated");
    b = m->p[0];
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        m->p++;
        return 0;
    }
    if ((b >= 0xa0 && b <= 0xbf) || b == 0xd9 || b == 0xda || b == 0xdb) {
        if (mp_header(m, MP_STR, &n, &hdr) != 0 || !mp_has(m, hdr + n))
            return mp_fail(m, "truncated string");
        m->p += hdr + n;
        return 0;
    }
    if ((b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd ||
        (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf) {
        bool map = (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf;
        if (mp_header(m, map ? MP_MAP : MP_ARRAY, &n, &hdr) != 0)
            return mp_fail(m, "truncated container");
        m->p += hdr;
        if (map)
            n *= 2;
        if (!mp_has(m, n)) /* every element takes at least one byte */
            return mp_fail(m, "truncated container");
        for (uint64_t i = 0; i < n; i++)
            if (mp_skip(m, depth + 1) != 0)
                return -EINVAL;
        return 0;
    }
    switch (b) {
    case 0xcc: case 0xd0: len = 1; break;
    case 0xcd: case 0xd1: len = 2; break;
    case 0xca: case 0xce: case 0xd2: len = 4; break;
    case 0xcb: case 0xcf: case 0xd3: len = 8; break;
    case 0xd4: len = 2; break; /* fixext: type + data */
    case 0xd5: len = 3; break;
    case 0xd6: len = 5; break;
    case 0xd7: len = 9; break;
    case 0xd8: len = 17; break;
    case 0xc4: case 0xc5: case 0xc6: case 0xc7: case 0xc8: case 0xc9: {
        unsigned w = (b == 0xc4 || b == 0xc7) ? 1 : (b == 0xc5 || b == 0xc8) ? 2 : 4;
        if (!mp_has(m, 1 + w))
            return mp_fail(m, "truncated");
        len = w + be(m->p + 1, w) + (b >= 0xc7 ? 1 : 0);
        break;
    }
    default:
        return mp_fail(m, "invalid type byte");
    }
    if (!mp_has(m, 1 + len))
        return mp_fail(m, "truncated");
    m->p += 1 + len;
    return 0;
}

/* Elements [i, lim) of a token array at *pp, one type byte at a time: every element
 * kvr_decode_u32_run() leaves (rare widths, invalid bytes, truncation). */
static int mp_tokens_range(struct mp *m, uint32_t *out, const unsigned char **pp, uint64_t i,
                           uint64_t lim)
{
    const unsigned char *p = *pp, *end = m->end;

    for (; i < lim; i++) {
        unsigned char b;
        uint64_t v;
        unsigned w;

        if (p >= end)
            goto truncated;
        b = *p;
        if (b <= 0x7f) {
            out[i] = b;
            p++;
            continue;
        }
        /* uint8/16/32: width 1 << (b - 0xcc), read as one big-endian 8-byte load */
        if (LIKELY((unsigned)(b - 0xcc) <= 2 && end - p >= 9)) {
            unsigned k = (unsigned)(b - 0xcc);
            uint64_t x;
            memcpy(&x, p + 1, 8);
            out[i] = (uint32_t)(be64(x) >> (64 - (8u << k)));
            p += 1 + (1u << k);
            continue;
        }
        switch (b) {
        case 0xcc: case 0xd0: w = 1; break;
        case 0xcd: case 0xd1: w = 2; break;
        case 0xce: case 0xd2: w = 4; break;
        case 0xcf: case 0xd3: w = 8; break;
        default:
            m->p = (unsigned char *)p;
            if (b >= 0xe0)
                return kvr_err_set(m->err, -EINVAL,
                                   "msgpack: negative token id (element %llu)",
                                   (unsigned long long)i);
            return kvr_err_set(m->err, -EINVAL,
                               "msgpack: token id is not an integer (element %llu, byte %zu)",
                               (unsigned long long)i, (size_t)(p - m->base));
        }
        if ((size_t)(end - p) < 1 + w)
            goto truncated;
        v = be(p + 1, w);
        if (b >= 0xd0) { /* signed: sign-extend then require 0 <= v */
            unsigned sh = 64 - 8 * w;
            int64_t sv = (int64_t)(v << sh) >> sh;
            if (sv < 0)
                return kvr_err_set(m->err, -EINVAL, "msgpack: negative token id (element %llu)",
                                   (unsigned long long)i);
            v = (uint64_t)sv;
        }
        if (v > UINT32_MAX)
            return kvr_err_set(m->err, -EINVAL,
                               "msgpack: token id out of range (>= 2^32) (element %llu)",
                               (unsigned long long)i);
        out[i] = (uint32_t)v;
        p += 1 + w;
    }
    *pp = p;
    return 0;
truncated:
    m->p = (unsigned char *)p;
    return mp_fail(m, "truncated token array");
}

int kvr_reqbody_force_isa(int level)
{
    return kvr_decode_force_isa(level);
}

static int mp_tokens(struct mp *m, const struct kvr_reqbody_scratch *s, size_t *count)
{
    uint64_t n;
    size_t hdr;
    const unsigned char *p;
    uint64_t i = 0;
    int rc;

    if (mp_header(m, MP_ARRAY, &n, &hdr) != 0)
        return kvr_err_set(m->err, -EINVAL, "msgpack: \"token_ids\" must be an array of integers");
    m->p += hdr;
    if (n > s->max_tokens)
        return kvr_err_set(m->err, -E2BIG, "too many token ids (limit %zu)", s->max_tokens);
    if (!mp_has(m, n))
        return mp_fail(m, "truncated token array");
    p = m->p;
    for (;;) {
        i += kvr_decode_u32_run(&p, m->end, s->tokens + i, (size_t)(n - i));
        if (i == n)
            break;
        /* an element the run does not take: rare widths, negatives, errors, truncation */
        if ((rc = mp_tokens_range(m, s->tokens, &p, i, i + 1)) != 0)
            return rc;
        i++;
    }
    m->p = (unsigned char *)p;
    *count = (size_t)n;
    return 0;
}

/* An unsigned integer in [0, 2^32) (any msgpack int width). */
static int mp_u32(struct mp *m, uint64_t *v)
{
    static const unsigned char w[8] = {1, 2, 4, 8, 1, 2, 4, 8}; /* cc..cf, d0..d3 */
    unsigned char b;
    unsigned k;
    uint64_t x;

    if (!mp_has(m, 1))
        return -EINVAL;
    b = m->p[0];
    if (b <= 0x7f) {
        *v = b;
        m->p++;
        return 0;
    }
    if (b < 0xcc || b > 0xd3)
        return -EINVAL;
    k = b - 0xcc;
    if (!mp_has(m, 1u + w[k]))
        return -EINVAL;
    x = be(m->p + 1, w[k]);
    if (k >= 4 && (x >> (8 * w[k] - 1)) & 1) /* a negative signed int */
        return -EINVAL;
    if (x > UINT32_MAX)
        return -EINVAL;
    m->p += 1 + w[k];
    *v = x;
    return 0;
}

/* A map key (a string, not moved): 0 with *key, *klen, or the error. */
static int mp_key(struct mp *m, const char **key, uint64_t *klen)
{
    size_t khdr;

    if (mp_header(m, MP_STR, klen, &khdr) != 0 || !mp_has(m, khdr + *klen))
        return mp_fail(m, "map key must be a string");
    *key = (const char *)m->p + khdr;
    m->p += khdr + *klen;
    return 0;
}

static int mp_media(struct mp *m, const struct kvr_reqbody_scratch *s,
                    struct kvr_reqbody_query *q, struct kvr_err *err)
{
    uint64_t n;
    size_t hdr;
    int rc;

    q->media = s->media;
    if (mp_nil(m))
        return 0;
    if (mp_header(m, MP_ARRAY, &n, &hdr) != 0)
        return kvr_err_set(err, -EINVAL, "msgpack: \"mm_hashes\" must be an array of maps");
    m->p += hdr;
    if (n > s->max_media)
        return kvr_err_set(err, -EINVAL, "too many \"mm_hashes\" items (limit %zu)",
                           s->max_media);
    for (uint64_t i = 0; i < n; i++) {
        struct kvr_hash_media *md = &s->media[i];
        unsigned seen = 0;
        uint64_t nk;

        memset(md, 0, sizeof(*md));
        if (mp_header(m, MP_MAP, &nk, &hdr) != 0)
            return kvr_err_set(err, -EINVAL, "msgpack: \"mm_hashes\" must be an array of maps");
        m->p += hdr;
        if (!mp_has(m, nk * 2))
            return mp_fail(m, "truncated map");
        for (uint64_t e = 0; e < nk; e++) {
            uint64_t klen;
            const char *key;
            char *str;
            size_t slen;
            int k;

            if ((rc = mp_key(m, &key, &klen)) != 0)
                return rc;
            if ((k = media_key(key, klen, &seen, (size_t)i, err)) < 0)
                return k;
            if (k == MK_N) {
                if (mp_skip(m, 1) != 0)
                    return -EINVAL;
            } else if (k != MK_HASH) {
                if (mp_u32(m, media_slot(md, k)) != 0)
                    return media_int_err((size_t)i, k, err);
            } else {
                if ((rc = mp_string(m, "mm_hashes[].hash", false, &str, &slen)) != 0)
                    return rc;
                md->id = str;
                md->id_len = slen;
            }
        }
        if ((rc = media_item_done(seen, (size_t)i, err)) != 0)
            return rc;
        q->nmedia++;
    }
    return media_check(q->media, q->nmedia, err);
}

int kvr_reqbody_query_msgpack(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                              struct kvr_reqbody_query *q, struct kvr_err *err)
{
    struct mp m = {(unsigned char *)body, (unsigned char *)body + len, (unsigned char *)body, err};
    unsigned seen = 0;
    uint64_t nkeys;
    size_t hdr;
    int rc;

    query_init(q, s);
    if (mp_header(&m, MP_MAP, &nkeys, &hdr) != 0)
        return kvr_err_set(err, -EINVAL, "msgpack: body must be a map");
    m.p += hdr;
    if (!mp_has(&m, nkeys * 2))
        return mp_fail(&m, "truncated map");
    for (uint64_t i = 0; i < nkeys; i++) {
        uint64_t klen, n;
        const char *key;
        char *str;
        size_t slen;
        int k;

        if ((rc = mp_key(&m, &key, &klen)) != 0)
            return rc;
        if (key_is(key, klen, "messages"))
            return kvr_err_set(err, -EINVAL, "\"messages\" needs a JSON body "
                                             "(application/json)");
        if ((k = qkey_find(key, klen)) < 0) {
            if (mp_skip(&m, 1) != 0)
                return -EINVAL;
            continue;
        }
        if ((rc = qkey_once(&seen, k, err)) != 0)
            return rc;
        switch (k) {
        case QK_TOKENS:
            if ((rc = mp_tokens(&m, s, &q->ntokens)) != 0)
                return rc;
            continue;
        case QK_SPECIAL:
            if (m.p >= m.end || (*m.p != 0xc2 && *m.p != 0xc3))
                return kvr_err_set(err, -EINVAL, "\"add_special_tokens\" must be true or false");
            q->add_special_tokens = *m.p++ == 0xc3;
            q->add_special_given = true;
            continue;
        case QK_MEDIA:
            if ((rc = mp_media(&m, s, q, err)) != 0)
                return rc;
            continue;
        case QK_PODS:
            if (mp_nil(&m))
                continue;
            if (mp_header(&m, MP_ARRAY, &n, &hdr) != 0)
                return kvr_err_set(err, -EINVAL, "msgpack: \"pods\" must be an array of strings");
            m.p += hdr;
            if (n > s->max_pods)
                return kvr_err_set(err, -EINVAL, "too many pods (limit %zu)", s->max_pods);
            for (uint64_t e = 0; e < n; e++)
                if ((rc = mp_string(&m, "pods[]", false, &str, &slen)) != 0 ||
                    (rc = query_str(q, s, k, str, slen, err)) != 0)
                    return rc;
            continue;
        case QK_LORA:
        case QK_SALT:
            if (mp_nil(&m))
                continue;
            break;
        default: /* model, prompt */
            break;
        }
        if ((rc = mp_string(&m, qkey_names[k], k == QK_PROMPT, &str, &slen)) != 0 ||
            (rc = query_str(q, s, k, str, slen, err)) != 0)
            return rc;
    }
    if (m.p != m.end)
        return mp_fail(&m, "trailing data after the map");
    return query_check(q, seen & QBIT(QK_MODEL), seen & QBIT(QK_TOKENS), seen & QBIT(QK_PROMPT),
                       err);
}
