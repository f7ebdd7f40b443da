/* reqbody.h — request bodies of the HTTP API, decoded without allocation.
 *
 * Score query: {"model": str, "token_ids": [u32], "lora_name"?: str|null, "pods"?: [str]|null,
 * "cache_salt"?: str|null, "mm_hashes"?: [{"hash": str, "offset": u32, "length": u32}]|null}
 * or the same with "prompt": str (text the daemon tokenizes) in place of "token_ids", and
 * "add_special_tokens"?: bool (default true; meaningful with a prompt). The same map serves
 * /v1/tokenize ({"model", "prompt", "add_special_tokens"?}).
 * as JSON (strict, any key order, unknown keys ignored, duplicate known keys rejected) or the
 * same map as msgpack (token ids of any integer width, non-negative and < 2^32).
 * Endpoint admin: {"endpoint": str, "replay_endpoint"?: str|null, "pod"?: str|null} (JSON).
 *
 * Both decoders work in place on a mutable body buffer the caller owns: strings are decoded
 * into the buffer and NUL-terminated, so the results borrow from it. Token ids go to the
 * caller's scratch array and pod name pointers to the caller's pointer array, so a query
 * costs no heap allocation.
 *
 * NUL characters (JSON "\u0000", a 0 byte inside a msgpack string), as vLLM takes them:
 * - text keeps them: "prompt" (q->prompt, q->prompt_len: use the length, not strlen) and the
 *   chat values (message contents and parts, tools, documents, chat_template_kwargs: template
 *   strings carry their length);
 * - every other string is a C string (model, lora_name, cache_salt, pods, mm_hashes[].hash,
 *   candidates[].pod, policy, endpoint, replay_endpoint, pod) and is guaranteed free of NUL:
 *   one holding a NUL is refused with -EINVAL and "\"FIELD\" must not contain a NUL
 *   character (\u0000)" (msgpack: prefixed "msgpack: "), never cut short.
 *
 * Errors: -EINVAL (400: syntax, types, values; message in err->msg) or -E2BIG (413: more
 * token ids than the scratch holds). Pure; any thread.
 */
#ifndef KVR_REQBODY_H
#define KVR_REQBODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "text/tmpl.h"
#include "index/hash.h" /* struct kvr_hash_media */

/* mm_hashes items: the engine's media identifiers (vLLM extra keys) with their placeholder
 * ranges in token_ids, sorted by offset and not overlapping (else 400). */
#define KVR_REQBODY_MAX_MEDIA 256

struct kvr_reqbody_scratch {
    uint32_t *tokens;
    size_t max_tokens;
    const char **pods;
    size_t max_pods;
    struct kvr_hash_media *media; /* NULL/max_media 0: a body naming media is refused */
    size_t max_media;
};

struct kvr_reqbody_query {
    const char *model;      /* non-empty, at most KVR_NAME_MAX bytes */
    const char *lora_name;  /* NULL when absent, null or "" */
    const uint32_t *tokens; /* = scratch->tokens */
    size_t ntokens;
    const char *const *pods; /* = scratch->pods; npods 0 = no filter */
    size_t npods;
    bool has_tokens;         /* "token_ids" was given */
    const char *prompt;      /* NULL when absent (decoded in place; may hold NUL bytes:
                              * prompt_len is its length) */
    size_t prompt_len;
    bool add_special_tokens; /* default true */
    bool add_special_given;  /* "add_special_tokens" was in the body */
    const char *cache_salt;  /* NULL when absent, null or "" (vLLM: no salt) */
    const struct kvr_hash_media *media; /* = scratch->media */
    size_t nmedia;
};

int kvr_reqbody_query_json(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                           struct kvr_reqbody_query *q, struct kvr_err *err);
int kvr_reqbody_query_msgpack(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                              struct kvr_reqbody_query *q, struct kvr_err *err);

/* POST /v1/route: the query plus "candidates"?: [{"pod": str, "dp_rank"?: u32,
 * "active_requests"?: u64, "active_tokens"?: u64, "role"?: "prefill"|"decode"|"both"}]|null (at most cap, stored in cands),
 * "policy"?: str|null (checked by the caller), "track"?: bool, "session_id"?: str|null
 * (1..256 bytes, no NUL). JSON only. */
struct kvr_reqbody_cand {
    const char *pod;
    uint32_t dp_rank;
    int role;         /* "role": -1 when absent, else enum kvr_route_role (0 both, 1 prefill,
                       * 2 decode) */
    bool has_requests, has_tokens;
    uint64_t active_requests, active_tokens;
};
struct kvr_reqbody_route {
    const char *policy; /* NULL when absent or null */
    const char *session; /* "session_id"?: str|null, 1..256 bytes; NULL when absent or null */
    size_t session_len;
    bool track;
    struct kvr_reqbody_cand *cands;
    size_t ncands;      /* 0: not given */
};
/* The chat keys, decoded into template values (reqbody_chat.c documents vLLM's rules):
 * messages in both content forms (a string, or {"type": "text"} parts) for the template to
 * pick, tools/documents/chat_template_kwargs as sent (NULL when absent or null),
 * add_generation_prompt (default true), continue_final_message (default false), and the
 * final message's text (its last text part) for continue_final_message. */
struct kvr_reqbody_chat {
    kvr_tmpl_val *messages_str, *messages_parts; /* NULL: no "messages" */
    size_t nmessages;
    kvr_tmpl_val *tools, *documents, *kwargs;
    bool add_generation_prompt, continue_final_message;
    const char *final_text; /* in the body buffer */
    size_t final_len;
};

/* A query body with more forms, JSON: the query (token ids, a prompt as a string or as one
 * array of token ids, as /v1/completions sends it), the chat keys when chat != NULL (values
 * in ctx), and the route keys when rq != NULL (candidates stored in cands[cap]). Exactly one
 * of token_ids, prompt and messages. Unknown keys are ignored, so an OpenAI
 * /v1/chat/completions or /v1/completions body can be sent as it is. */
int kvr_reqbody_query_ext(char *body, size_t len, const struct kvr_reqbody_scratch *s,
                          struct kvr_reqbody_query *q, kvr_tmpl_ctx *ctx,
                          struct kvr_reqbody_chat *chat, struct kvr_reqbody_cand *cands,
                          size_t cap, struct kvr_reqbody_route *rq, struct kvr_err *err);

/* Tests and benchmarks: limits the msgpack token-array decoder to 0 = scalar only, 1 = + AVX-512
 * VBMI windows (x86-64; never above what the CPU has); -1 = the best available (the default).
 * Returns the level in effect. Not for concurrent use. */
int kvr_reqbody_force_isa(int level);

struct kvr_reqbody_endpoint {
    const char *endpoint;        /* non-empty */
    const char *replay_endpoint; /* NULL when absent or null */
    const char *pod;             /* NULL when absent or null */
};

int kvr_reqbody_endpoint_json(char *body, size_t len, struct kvr_reqbody_endpoint *e,
                              struct kvr_err *err);

#endif
