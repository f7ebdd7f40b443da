/* tmpl.h — chat templates: a Jinja2 subset compiled once, rendered per request.
 *
 * The contract. A template source (a model's chat_template) is compiled once with
 * kvr_tmpl_compile into an immutable kvr_tmpl; anything outside the supported subset is refused
 * there with "line N: what". Rendering reads the compiled template only, so any number of
 * threads may render one kvr_tmpl at once, each with its own kvr_tmpl_ctx.
 *
 * Semantics are Jinja2 3.1's as Hugging Face transformers configures it for chat templates:
 * trim_blocks, lstrip_blocks, the loopcontrols extension, ImmutableSandboxedEnvironment
 * (no mutation of lists/dicts: `append` is refused as Jinja2's sandbox refuses it), tojson as
 * transformers overrides it (ensure_ascii=False, key order kept), raise_exception and
 * strftime_now globals. Deliberate differences are listed in docs/chat-templates.md.
 *
 * Values. A kvr_tmpl_ctx is an arena: every value built with the constructors below, and
 * every value and string a render makes, lives in it until kvr_tmpl_ctx_reset or _destroy.
 * A ctx is used by one thread at a time. Values are immutable once passed to a render.
 *
 * Stack: a render recurses at most ~1,000 evaluation frames deep (templates are refused at
 * compile time beyond 256 levels of nesting; recursive macros stop at max_depth or at that
 * frame cap with -ELOOP): about 0.5 MB in a release build, so any thread with the usual 2-8 MB
 * stack may render.
 *
 * Errors are negative errno values: -EINVAL (bad template or a render error such as
 * raise_exception or a type error; the message is in err), -ENOMEM (allocation, or the ctx's
 * memory cap), -E2BIG (output past max_bytes), -ELOOP (recursion depth or loop iteration
 * cap). err (when errlen > 0) always receives a NUL-terminated message.
 */
#ifndef KVR_TMPL_H
#define KVR_TMPL_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvr_tmpl kvr_tmpl;
typedef struct kvr_tmpl_ctx kvr_tmpl_ctx;
typedef struct kvr_tmpl_val kvr_tmpl_val;

/* Limits a render enforces; 0 in a field means the default. */
struct kvr_tmpl_limits {
    size_t max_mem;         /* bytes the ctx arena may hold (default 256 MiB) */
    uint32_t max_depth;     /* nested macro calls / expression depth (default 64) */
    uint64_t max_iters;     /* loop iterations per render, all loops together (default 1,000,000) */
};

/* Compiles src[0..len) (UTF-8; need not be NUL-terminated). 0 and *out, or -EINVAL with
 * "line N: what" in err, or -ENOMEM. */
int kvr_tmpl_compile(const char *src, size_t len, kvr_tmpl **out, char *err, size_t errlen);
void kvr_tmpl_free(kvr_tmpl *t);

/* vLLM's "auto" content format: 1 when the template iterates over a message's content (so
 * it expects OpenAI content parts, e.g. Gemma 3), 0 when it expects a string. Same rule as
 * vLLM's _detect_content_format (chat_utils.py). */
int kvr_tmpl_content_is_parts(const kvr_tmpl *t);

int kvr_tmpl_ctx_create(kvr_tmpl_ctx **out, const struct kvr_tmpl_limits *lim);
/* Frees every value and output of the ctx (its first arena chunk is kept for reuse). */
void kvr_tmpl_ctx_reset(kvr_tmpl_ctx *ctx);
void kvr_tmpl_ctx_destroy(kvr_tmpl_ctx *ctx);
/* The time strftime_now formats (UTC), in seconds since the epoch; until set, the clock. */
void kvr_tmpl_ctx_set_time(kvr_tmpl_ctx *ctx, int64_t unix_seconds);

/* Constructors: NULL when out of memory. Strings are copied into the ctx. */
kvr_tmpl_val *kvr_tmpl_none(kvr_tmpl_ctx *ctx);
kvr_tmpl_val *kvr_tmpl_bool(kvr_tmpl_ctx *ctx, int b);
kvr_tmpl_val *kvr_tmpl_int(kvr_tmpl_ctx *ctx, int64_t i);
kvr_tmpl_val *kvr_tmpl_double(kvr_tmpl_ctx *ctx, double d);
kvr_tmpl_val *kvr_tmpl_str(kvr_tmpl_ctx *ctx, const char *s, size_t n);
kvr_tmpl_val *kvr_tmpl_list(kvr_tmpl_ctx *ctx);
kvr_tmpl_val *kvr_tmpl_dict(kvr_tmpl_ctx *ctx);
/* Appends v to list (0, -EINVAL if list is not a list, -ENOMEM). */
int kvr_tmpl_list_push(kvr_tmpl_ctx *ctx, kvr_tmpl_val *list, kvr_tmpl_val *v);
/* Sets dict[key] = v; a new key goes last (insertion order is kept, as in Python). */
int kvr_tmpl_dict_set(kvr_tmpl_ctx *ctx, kvr_tmpl_val *dict, const char *key, size_t klen,
                      kvr_tmpl_val *v);
/* Sets every key of src into dst, in src's order (as Python's dict.update; keys live in the
 * same ctx). 0, -EINVAL (not dicts), -ENOMEM. */
int kvr_tmpl_dict_merge(kvr_tmpl_ctx *ctx, kvr_tmpl_val *dst, const kvr_tmpl_val *src);
/* Borrowed lookup: NULL when absent or dict is not a dict. */
const kvr_tmpl_val *kvr_tmpl_dict_get(const kvr_tmpl_val *dict, const char *key, size_t klen);

/* Renders t with the variables of the dict vars (may be NULL: no variables). On 0, *out
 * points at the output (NUL-terminated, *outlen bytes), valid until the next render on ctx
 * or its reset. Output beyond max_bytes (0: unlimited) fails with -E2BIG. */
int kvr_tmpl_render(const kvr_tmpl *t, kvr_tmpl_ctx *ctx, const kvr_tmpl_val *vars,
                    size_t max_bytes, const char **out, size_t *outlen, char *err,
                    size_t errlen);

#endif
