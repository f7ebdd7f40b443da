/* fuzz_tmpl.c — the chat-template engine on hostile templates and hostile variables.
 *
 * Input: TEMPLATE [ '\0' VARBYTES ]. The template is compiled (refusals are fine); when it
 * compiles it is rendered twice: once over a fixed, ordinary conversation and once over
 * variables built from VARBYTES (messages whose roles, contents, parts, tool calls and extra
 * keys the bytes choose, arbitrary bytes in strings, nested lists/dicts to a bounded depth).
 * Limits are small (8 MiB arena, 20,000 loop iterations, depth 16, 256 KiB output) so hostile
 * templates hit them quickly: every outcome must be 0 or a negative errno with a message —
 * never a crash, a sanitizer report or a hang.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tmpl.h"

struct src {
    const uint8_t *p;
    size_t n, i;
};

static unsigned take(struct src *s)
{
    return s->i < s->n ? s->p[s->i++] : 0;
}

static kvr_tmpl_val *gen(kvr_tmpl_ctx *ctx, struct src *s, int depth)
{
    unsigned k = take(s);
    switch (depth > 4 ? k % 5 : k % 7) {
    case 0: return kvr_tmpl_none(ctx);
    case 1: return kvr_tmpl_bool(ctx, (int)(k & 8));
    case 2: return kvr_tmpl_int(ctx, (int64_t)(int8_t)take(s) * (int64_t)(take(s) + 1));
    case 3: return kvr_tmpl_double(ctx, (double)(int8_t)take(s) / 7.0);
    case 4: {
        size_t len = take(s) % 24;
        if (len > s->n - s->i)
            len = s->n - s->i;
        kvr_tmpl_val *v = kvr_tmpl_str(ctx, (const char *)s->p + s->i, len);
        s->i += len;
        return v;
    }
    case 5: {
        kvr_tmpl_val *l = kvr_tmpl_list(ctx);
        unsigned n = take(s) % 5;
        for (unsigned i = 0; l && i < n; i++) {
            kvr_tmpl_val *v = gen(ctx, s, depth + 1);
            if (v == NULL || kvr_tmpl_list_push(ctx, l, v))
                return NULL;
        }
        return l;
    }
    default: {
        static const char *keys[] = {"role", "content", "type", "text", "name", "tool_calls",
                                     "function", "arguments", "reasoning_content", "items", "x"};
        kvr_tmpl_val *d = kvr_tmpl_dict(ctx);
        unsigned n = take(s) % 5;
        for (unsigned i = 0; d && i < n; i++) {
            const char *key = keys[take(s) % 11];
            kvr_tmpl_val *v = gen(ctx, s, depth + 1);
            if (v == NULL || kvr_tmpl_dict_set(ctx, d, key, strlen(key), v))
                return NULL;
        }
        return d;
    }
    }
}

static kvr_tmpl_val *hostile_vars(kvr_tmpl_ctx *ctx, struct src *s)
{
    static const char *roles[] = {"system", "user", "assistant", "tool", "", "developer"};
    kvr_tmpl_val *vars = kvr_tmpl_dict(ctx), *msgs = kvr_tmpl_list(ctx);
    if (vars == NULL || msgs == NULL)
        return NULL;
    unsigned n = take(s) % 8;
    for (unsigned i = 0; i < n; i++) {
        kvr_tmpl_val *m = kvr_tmpl_dict(ctx);
        const char *role = roles[take(s) % 6];
        kvr_tmpl_val *content = gen(ctx, s, 1);
        if (m == NULL || content == NULL ||
            kvr_tmpl_dict_set(ctx, m, "role", 4, kvr_tmpl_str(ctx, role, strlen(role))) ||
            kvr_tmpl_dict_set(ctx, m, "content", 7, content))
            return NULL;
        if (take(s) & 1) {
            kvr_tmpl_val *extra = gen(ctx, s, 2);
            if (extra == NULL || kvr_tmpl_dict_set(ctx, m, "tool_calls", 10, extra))
                return NULL;
        }
        if (kvr_tmpl_list_push(ctx, msgs, m))
            return NULL;
    }
    kvr_tmpl_val *tools = gen(ctx, s, 2), *agp = kvr_tmpl_bool(ctx, (int)(take(s) & 1));
    if (tools == NULL || agp == NULL || kvr_tmpl_dict_set(ctx, vars, "messages", 8, msgs) ||
        kvr_tmpl_dict_set(ctx, vars, "tools", 5, tools) ||
        kvr_tmpl_dict_set(ctx, vars, "add_generation_prompt", 21, agp) ||
        kvr_tmpl_dict_set(ctx, vars, "bos_token", 9, kvr_tmpl_str(ctx, "<s>", 3)))
        return NULL;
    return vars;
}

static kvr_tmpl_val *plain_vars(kvr_tmpl_ctx *ctx)
{
    static const char *turns[][2] = {{"system", "You are helpful."}, {"user", "Hi ✓"},
                                     {"assistant", "<think>\nhm\n</think>\n\nHello"},
                                     {"user", "Bye"}};
    kvr_tmpl_val *vars = kvr_tmpl_dict(ctx), *msgs = kvr_tmpl_list(ctx);
    if (vars == NULL || msgs == NULL)
        return NULL;
    for (int i = 0; i < 4; i++) {
        kvr_tmpl_val *m = kvr_tmpl_dict(ctx);
        if (m == NULL ||
            kvr_tmpl_dict_set(ctx, m, "role", 4, kvr_tmpl_str(ctx, turns[i][0], strlen(turns[i][0]))) ||
            kvr_tmpl_dict_set(ctx, m, "content", 7, kvr_tmpl_str(ctx, turns[i][1], strlen(turns[i][1]))) ||
            kvr_tmpl_list_push(ctx, msgs, m))
            return NULL;
    }
    if (kvr_tmpl_dict_set(ctx, vars, "messages", 8, msgs) ||
        kvr_tmpl_dict_set(ctx, vars, "add_generation_prompt", 21, kvr_tmpl_bool(ctx, 1)))
        return NULL;
    return vars;
}

static void check(int rc, const char *err)
{
    if (rc != 0 && rc != -EINVAL && rc != -ENOMEM && rc != -E2BIG && rc != -ELOOP)
        abort();
    if (rc != 0 && err[0] == 0)
        abort(); /* every failure explains itself */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    char err[256];
    kvr_tmpl *t;
    int rc = kvr_tmpl_compile((const char *)data, tlen, &t, err, sizeof err);
    check(rc, err);
    if (rc)
        return 0;
    (void)kvr_tmpl_content_is_parts(t);
    struct kvr_tmpl_limits lim = {.max_mem = 8 << 20, .max_depth = 16, .max_iters = 20000};
    kvr_tmpl_ctx *ctx;
    if (kvr_tmpl_ctx_create(&ctx, &lim) == 0) {
        kvr_tmpl_ctx_set_time(ctx, 1764000000);
        const char *out;
        size_t outlen;
        kvr_tmpl_val *v = plain_vars(ctx);
        if (v) {
            rc = kvr_tmpl_render(t, ctx, v, 256 << 10, &out, &outlen, err, sizeof err);
            check(rc, err);
            if (rc == 0 && (strlen(out) > outlen || outlen > (256 << 10)))
                abort();
        }
        kvr_tmpl_ctx_reset(ctx);
        struct src s = {.p = nul ? nul + 1 : data, .n = nul ? size - tlen - 1 : 0};
        v = hostile_vars(ctx, &s);
        if (v) {
            rc = kvr_tmpl_render(t, ctx, v, 256 << 10, &out, &outlen, err, sizeof err);
            check(rc, err);
        }
        kvr_tmpl_ctx_destroy(ctx);
    }
    kvr_tmpl_free(t);
    return 0;
}
