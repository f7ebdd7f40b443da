/* reqbody_chat.c — the chat part of request bodies: OpenAI "messages" (and "tools",
 * "documents", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")
 * decoded straight into chat-template values (tmpl.h), as vLLM hands them to
 * apply_chat_template.
 *
 * What vLLM does, and so what this does (vllm/entrypoints/chat_utils.py):
 * - each message becomes {"role", "content"} then "tool_calls" (assistant), "tool_call_id"
 *   (tool), "name" (a string), "reasoning_content"; other keys are dropped;
 * - content: a string, null, or a list of parts; text parts ({"type": "text", "text"}) are
 *   kept, any other part type (images, audio, files) is refused (multimodal content is not
 *   supported); for templates that loop over content ("openai" format) content is the list
 *   of {"type": "text", "text"} dicts (a string becomes one part, null an empty list), for the
 *   others the texts joined with "\n" (null: ""). Both forms are built here; the model's
 *   template picks one (tokset), so a reload between parse and render cannot mismatch them;
 * - tool_calls' function.arguments given as a JSON string is parsed into its value (an empty
 *   or absent one becomes {}), as vLLM's _postprocess_messages does.
 * JSON only; numbers become int64 (no fraction or exponent, in range) or double.
 */
#include "http/reqbody_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define VAL_MAX_DEPTH 64

static bool key_is(const char *k, size_t klen, const char *name)
{
    size_t n = strlen(name);
    return klen == n && memcmp(k, name, n) == 0;
}

static int jfail(struct kvr_jtok *j, struct kvr_err *err)
{
    kvr_jtok_errstr(j, err->msg, sizeof(err->msg));
    return j->code ? j->code : -EINVAL;
}

static int nomem(struct kvr_err *err)
{
    return kvr_err_set(err, -ENOMEM, "out of memory (chat values)");
}

int kvr_reqbody_json_value(struct kvr_jtok *j, kvr_tmpl_ctx *ctx, int depth, kvr_tmpl_val **out,
                           struct kvr_err *err)
{
    int c = kvr_jtok_peek(j), rc, st = 0;
    char *s, *key;
    size_t n, klen;
    kvr_tmpl_val *v, *x;

    if (depth > VAL_MAX_DEPTH)
        return kvr_err_set(err, -EINVAL, "JSON value nested deeper than %d", VAL_MAX_DEPTH);
    if (c == '"') {
        if (kvr_jtok_string(j, &s, &n) != 0)
            return jfail(j, err);
        v = kvr_tmpl_str(ctx, s, n);
    } else if (c == '{') {
        if ((v = kvr_tmpl_dict(ctx)) == NULL)
            return nomem(err);
        while ((rc = kvr_jtok_object_next(j, &st, &key, &klen)) == 1) {
            if ((rc = kvr_reqbody_json_value(j, ctx, depth + 1, &x, err)) != 0)
                return rc;
            if (kvr_tmpl_dict_set(ctx, v, key, klen, x) != 0)
                return nomem(err);
        }
        if (rc < 0)
            return jfail(j, err);
    } else if (c == '[') {
        if ((v = kvr_tmpl_list(ctx)) == NULL)
            return nomem(err);
        while ((rc = kvr_jtok_array_next(j, &st)) == 1) {
            if ((rc = kvr_reqbody_json_value(j, ctx, depth + 1, &x, err)) != 0)
                return rc;
            if (kvr_tmpl_list_push(ctx, v, x) != 0)
                return nomem(err);
        }
        if (rc < 0)
            return jfail(j, err);
    } else if (c == 't' || c == 'f') {
        bool b;
        if (kvr_jtok_bool(j, &b) != 0)
            return jfail(j, err);
        v = kvr_tmpl_bool(ctx, b);
    } else if (kvr_jtok_null(j)) {
        v = kvr_tmpl_none(ctx);
    } else {
        char buf[64];
        if (kvr_jtok_number(j, &s, &n) != 0)
            return jfail(j, err);
        if (n >= sizeof(buf))
            n = sizeof(buf) - 1; /* a longer literal still parses as a double prefix */
        memcpy(buf, s, n);
        buf[n] = '\0';
        char *end;
        errno = 0;
        long long i = strtoll(buf, &end, 10);
        if (*end == '\0' && errno == 0)
            v = kvr_tmpl_int(ctx, i);
        else
            v = kvr_tmpl_double(ctx, strtod(buf, NULL));
    }
    if (v == NULL)
        return nomem(err);
    *out = v;
    return 0;
}

/* A JSON text held in a string (tool_calls' arguments) into a value; not JSON: the string. */
static int arguments_value(kvr_tmpl_ctx *ctx, const char *s, size_t n, kvr_tmpl_val **out,
                           struct kvr_err *err)
{
    char *copy;
    struct kvr_jtok j;
    int rc;

    if (n == 0)
        return (*out = kvr_tmpl_dict(ctx)) ? 0 : nomem(err);
    if ((copy = malloc(n)) == NULL)
        return nomem(err);
    memcpy(copy, s, n);
    kvr_jtok_init(&j, copy, n);
    rc = kvr_reqbody_json_value(&j, ctx, 1, out, err);
    if (rc == 0 && kvr_jtok_finish(&j) != 0)
        rc = jfail(&j, err);
    free(copy);
    if (rc == -ENOMEM)
        return rc;
    if (rc != 0) /* vLLM's json.loads would fail the request */
        return kvr_err_set(err, -EINVAL, "tool_calls[].function.arguments is not valid JSON");
    return 0;
}

/* One tool call: the object as sent, its function.arguments parsed. */
static int tool_call(struct kvr_jtok *j, kvr_tmpl_ctx *ctx, kvr_tmpl_val **out,
                     struct kvr_err *err)
{
    int rc, st = 0, st2;
    char *key, *k2, *s;
    size_t klen, k2len, n;
    kvr_tmpl_val *call, *fn, *x;
    bool have_args;

    if (kvr_jtok_peek(j) != '{')
        return kvr_reqbody_json_value(j, ctx, 2, out, err);
    if ((call = kvr_tmpl_dict(ctx)) == NULL)
        return nomem(err);
    while ((rc = kvr_jtok_object_next(j, &st, &key, &klen)) == 1) {
        if (!key_is(key, klen, "function") || kvr_jtok_peek(j) != '{') {
            if ((rc = kvr_reqbody_json_value(j, ctx, 3, &x, err)) != 0)
                return rc;
        } else {
            if ((fn = kvr_tmpl_dict(ctx)) == NULL)
                return nomem(err);
            st2 = 0;
            have_args = false;
            while ((rc = kvr_jtok_object_next(j, &st2, &k2, &k2len)) == 1) {
                if (key_is(k2, k2len, "arguments") && kvr_jtok_null(j)) {
                    if ((x = kvr_tmpl_dict(ctx)) == NULL) /* vLLM: falsy -> {} */
                        return nomem(err);
                    have_args = true;
                } else if (key_is(k2, k2len, "arguments") && kvr_jtok_peek(j) == '"') {
                    if (kvr_jtok_string(j, &s, &n) != 0)
                        return jfail(j, err);
                    if ((rc = arguments_value(ctx, s, n, &x, err)) != 0)
                        return rc;
                    have_args = true;
                } else if ((rc = kvr_reqbody_json_value(j, ctx, 4, &x, err)) != 0) {
                    return rc;
                } else if (key_is(k2, k2len, "arguments")) {
                    have_args = true; /* a dict or list as is */
                }
                if (kvr_tmpl_dict_set(ctx, fn, k2, k2len, x) != 0)
                    return nomem(err);
            }
            if (rc < 0)
                return jfail(j, err);
            if (!have_args && ((x = kvr_tmpl_dict(ctx)) == NULL ||
                               kvr_tmpl_dict_set(ctx, fn, "arguments", 9, x) != 0))
                return nomem(err);
            x = fn;
        }
        if (kvr_tmpl_dict_set(ctx, call, key, klen, x) != 0)
            return nomem(err);
    }
    if (rc < 0)
        return jfail(j, err);
    *out = call;
    return 0;
}

/* A message's content (a string, null, or text parts) in both forms: the texts joined by
 * "\n", and the list of {"type": "text", "text"} parts. */
struct content {
    kvr_tmpl_val *str, *parts; /* the two forms */
    const char *last_text;     /* the last text part (continue_final_message) */
    size_t last_len;
};

/* null or absent content: "" as a string, no parts */
static int content_none(kvr_tmpl_ctx *ctx, struct content *co, struct kvr_err *err)
{
    co->parts = kvr_tmpl_list(ctx);
    co->str = kvr_tmpl_str(ctx, "", 0);
    co->last_text = "", co->last_len = 0;
    return co->parts && co->str ? 0 : nomem(err);
}

static int content_value(struct kvr_jtok *j, kvr_tmpl_ctx *ctx, size_t msg_index,
                         struct content *co, struct kvr_err *err)
{
    int c = kvr_jtok_peek(j), rc, st = 0;
    char *s;
    size_t n;

    if (kvr_jtok_null(j))
        return content_none(ctx, co, err);
    co->parts = kvr_tmpl_list(ctx);
    if (co->parts == NULL)
        return nomem(err);
    if (c == '"') {
        kvr_tmpl_val *part = kvr_tmpl_dict(ctx), *t, *ty;
        if (kvr_jtok_string(j, &s, &n) != 0)
            return jfail(j, err);
        co->str = kvr_tmpl_str(ctx, s, n);
        t = co->str; /* values are immutable: both forms share the text */
        ty = kvr_tmpl_str(ctx, "text", 4);
        if (!part || !co->str || !t || !ty || kvr_tmpl_dict_set(ctx, part, "type", 4, ty) ||
            kvr_tmpl_dict_set(ctx, part, "text", 4, t) || kvr_tmpl_list_push(ctx, co->parts, part))
            return nomem(err);
        co->last_text = s, co->last_len = n;
        return 0;
    }
    if (c != '[')
        return kvr_err_set(err, -EINVAL, "messages[%zu].content must be a string, null or a "
                           "list of content parts", msg_index);
    /* the joined text is built in a growing buffer, then copied into the ctx */
    char *joined = NULL;
    size_t jlen = 0, nparts = 0;
    co->last_text = NULL;
    while ((rc = kvr_jtok_array_next(j, &st)) == 1) {
        int pst = 0;
        char *key, *type = NULL, *text = NULL;
        size_t klen, tylen = 0, txlen = 0;
        if (kvr_jtok_peek(j) != '{') {
            free(joined);
            return kvr_err_set(err, -EINVAL, "messages[%zu].content[%zu] must be an object",
                               msg_index, nparts);
        }
        while ((rc = kvr_jtok_object_next(j, &pst, &key, &klen)) == 1) {
            if ((key_is(key, klen, "type") || key_is(key, klen, "text")) &&
                kvr_jtok_peek(j) == '"') {
                if (kvr_jtok_string(j, &s, &n) != 0) {
                    free(joined);
                    return jfail(j, err);
                }
                if (key[1] == 'y')
                    type = s, tylen = n;
                else
                    text = s, txlen = n;
            } else if (kvr_jtok_skip(j) != 0) {
                free(joined);
                return jfail(j, err);
            }
        }
        if (rc < 0) {
            free(joined);
            return jfail(j, err);
        }
        if (type == NULL || tylen != 4 || memcmp(type, "text", 4) != 0) {
            free(joined);
            return kvr_err_set(err, -EINVAL, "messages[%zu].content[%zu]: multimodal content is "
                               "not supported (only {\"type\": \"text\"} parts)", msg_index,
                               nparts);
        }
        if (text == NULL) {
            free(joined);
            return kvr_err_set(err, -EINVAL, "messages[%zu].content[%zu] needs \"text\"",
                               msg_index, nparts);
        }
        char *g = realloc(joined, jlen + (nparts ? 1 : 0) + txlen + 1);
        if (g == NULL) {
            free(joined);
            return nomem(err);
        }
        joined = g;
        if (nparts)
            joined[jlen++] = '\n';
        memcpy(joined + jlen, text, txlen);
        jlen += txlen;
        kvr_tmpl_val *part = kvr_tmpl_dict(ctx), *t = kvr_tmpl_str(ctx, text, txlen),
                     *ty = kvr_tmpl_str(ctx, "text", 4);
        if (!part || !t || !ty || kvr_tmpl_dict_set(ctx, part, "type", 4, ty) ||
            kvr_tmpl_dict_set(ctx, part, "text", 4, t) ||
            kvr_tmpl_list_push(ctx, co->parts, part)) {
            free(joined);
            return nomem(err);
        }
        co->last_text = text, co->last_len = txlen; /* in the body buffer: stable */
        nparts++;
    }
    if (rc < 0) {
        free(joined);
        return jfail(j, err);
    }
    co->str = kvr_tmpl_str(ctx, joined ? joined : "", jlen);
    free(joined);
    if (co->last_text == NULL)
        co->last_text = "", co->last_len = 0;
    return co->str ? 0 : nomem(err);
}

static int one_message(struct kvr_jtok *j, kvr_tmpl_ctx *ctx, size_t i, struct kvr_reqbody_chat *ch,
                       struct kvr_err *err)
{
    int rc, st = 0;
    char *key, *s;
    size_t klen, n;
    kvr_tmpl_val *role = NULL, *tool_calls = NULL, *tool_call_id = NULL, *name = NULL;
    kvr_tmpl_val *reasoning = NULL, *x;
    struct content co = {0};
    bool have_content = false, is_assistant = false, is_tool = false;

    if (kvr_jtok_peek(j) != '{')
        return kvr_err_set(err, -EINVAL, "messages[%zu] must be an object", i);
    while ((rc = kvr_jtok_object_next(j, &st, &key, &klen)) == 1) {
        if (key_is(key, klen, "role")) {
            if (kvr_jtok_peek(j) != '"' || kvr_jtok_string(j, &s, &n) != 0)
                return kvr_err_set(err, -EINVAL, "messages[%zu].role must be a string", i);
            if ((role = kvr_tmpl_str(ctx, s, n)) == NULL)
                return nomem(err);
            is_assistant = n == 9 && memcmp(s, "assistant", 9) == 0;
            is_tool = n == 4 && memcmp(s, "tool", 4) == 0;
        } else if (key_is(key, klen, "content")) {
            if ((rc = content_value(j, ctx, i, &co, err)) != 0)
                return rc;
            have_content = true;
        } else if (key_is(key, klen, "tool_calls") && kvr_jtok_peek(j) == '[') {
            int ast = 0;
            if ((tool_calls = kvr_tmpl_list(ctx)) == NULL)
                return nomem(err);
            while ((rc = kvr_jtok_array_next(j, &ast)) == 1) {
                if ((rc = tool_call(j, ctx, &x, err)) != 0)
                    return rc;
                if (kvr_tmpl_list_push(ctx, tool_calls, x) != 0)
                    return nomem(err);
            }
            if (rc < 0)
                return jfail(j, err);
        } else if (key_is(key, klen, "tool_call_id") || key_is(key, klen, "reasoning_content")) {
            if ((rc = kvr_reqbody_json_value(j, ctx, 2, &x, err)) != 0)
                return rc;
            if (key[0] == 't')
                tool_call_id = x;
            else
                reasoning = x;
        } else if (key_is(key, klen, "name") && kvr_jtok_peek(j) == '"') {
            if (kvr_jtok_string(j, &s, &n) != 0)
                return jfail(j, err);
            if ((name = kvr_tmpl_str(ctx, s, n)) == NULL)
                return nomem(err);
        } else if (kvr_jtok_skip(j) != 0) {
            return jfail(j, err);
        }
    }
    if (rc < 0)
        return jfail(j, err);
    if (role == NULL)
        return kvr_err_set(err, -EINVAL, "messages[%zu] needs \"role\"", i);
    if (!have_content && (rc = content_none(ctx, &co, err)) != 0)
        return rc;
    kvr_tmpl_val *ms = kvr_tmpl_dict(ctx), *mp = kvr_tmpl_dict(ctx);
    if (ms == NULL || mp == NULL)
        return nomem(err);
    for (int k = 0; k < 2; k++) {
        kvr_tmpl_val *m = k ? mp : ms;
        if (kvr_tmpl_dict_set(ctx, m, "role", 4, role) ||
            kvr_tmpl_dict_set(ctx, m, "content", 7, k ? co.parts : co.str) ||
            (is_assistant && tool_calls && kvr_tmpl_dict_set(ctx, m, "tool_calls", 10, tool_calls)) ||
            (is_tool && tool_call_id && kvr_tmpl_dict_set(ctx, m, "tool_call_id", 12, tool_call_id)) ||
            (name && kvr_tmpl_dict_set(ctx, m, "name", 4, name)) ||
            (reasoning && kvr_tmpl_dict_set(ctx, m, "reasoning_content", 17, reasoning)))
            return nomem(err);
    }
    if (kvr_tmpl_list_push(ctx, ch->messages_str, ms) || kvr_tmpl_list_push(ctx, ch->messages_parts, mp))
        return nomem(err);
    ch->final_text = co.last_text;
    ch->final_len = co.last_len;
    return 0;
}

int kvr_reqbody_chat_key(struct kvr_reqbody_chat *ch, kvr_tmpl_ctx *ctx, const char *key,
                         size_t klen, struct kvr_jtok *j, struct kvr_err *err)
{
    int rc, st = 0;
    kvr_tmpl_val **slot = NULL;
    bool *flag = NULL;

    if (key_is(key, klen, "messages")) {
        size_t i = 0;
        if (ch->messages_str != NULL)
            return kvr_err_set(err, -EINVAL, "duplicate key \"messages\"");
        if (kvr_jtok_peek(j) != '[')
            return kvr_err_set(err, -EINVAL, "\"messages\" must be an array of objects");
        ch->messages_str = kvr_tmpl_list(ctx);
        ch->messages_parts = kvr_tmpl_list(ctx);
        if (ch->messages_str == NULL || ch->messages_parts == NULL)
            return nomem(err);
        while ((rc = kvr_jtok_array_next(j, &st)) == 1)
            if ((rc = one_message(j, ctx, i++, ch, err)) != 0)
                return rc;
        if (rc < 0)
            return jfail(j, err);
        ch->nmessages = i;
        return 1;
    }
    if (key_is(key, klen, "tools"))
        slot = &ch->tools;
    else if (key_is(key, klen, "documents"))
        slot = &ch->documents;
    else if (key_is(key, klen, "chat_template_kwargs"))
        slot = &ch->kwargs;
    else if (key_is(key, klen, "add_generation_prompt"))
        flag = &ch->add_generation_prompt;
    else if (key_is(key, klen, "continue_final_message"))
        flag = &ch->continue_final_message;
    else
        return 0;
    if (flag != NULL) {
        int c = kvr_jtok_peek(j);
        if (c != 't' && c != 'f')
            return kvr_err_set(err, -EINVAL, "\"%.*s\" must be true or false", (int)klen, key);
        return kvr_jtok_bool(j, flag) != 0 ? jfail(j, err) : 1;
    }
    if (*slot != NULL)
        return kvr_err_set(err, -EINVAL, "duplicate key \"%.*s\"", (int)klen, key);
    if (kvr_jtok_null(j))
        return 1; /* as absent */
    if (slot == &ch->kwargs && kvr_jtok_peek(j) != '{')
        return kvr_err_set(err, -EINVAL, "\"chat_template_kwargs\" must be an object");
    if ((rc = kvr_reqbody_json_value(j, ctx, 1, slot, err)) != 0)
        return rc;
    return 1;
}
