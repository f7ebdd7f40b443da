/* tokset.h — the tokenizers of the configured models ([model "NAME"] tokenizer = PATH), by
 * model name, for the HTTP loops; replaced on SIGHUP without blocking them.
 *
 * Why a module: loading (at startup, for kvrouterd -t, on reload) and the hand-over to
 * readers are lifetime questions the tokenizer itself (tok.h, immutable once loaded) should
 * not know about. A reload builds a new name -> tokenizer table, publishes it with one
 * atomic store, and frees what it replaced only once every reader that could still hold it
 * has finished its call (per-reader epochs, RCU style): readers never take a lock or wait.
 *
 * Threads: create/reload/destroy from one thread (main); any number of readers, one
 * kvr_tokset_reader each (per loop thread and per text thread of the HTTP layer), used by one
 * thread at a time. A reload waits for the calls in progress (a large text on a text thread:
 * up to hundreds of ms), never for idle readers.
 */
#ifndef KVR_TOKSET_H
#define KVR_TOKSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/conf.h"
#include "core/err.h"
#include "text/tmpl.h"

struct kvr_tokset;
struct kvr_tokset_reader;

/* Loads every [model] tokenizer of c. A file that cannot be loaded fails with
 * "CONF:LINE: [model \"NAME\"] tokenizer: FILE: JSON.PATH: what". */
int kvr_tokset_create(const struct kvr_conf *c, struct kvr_tokset **out, struct kvr_err *err);

/* kvrouterd -t: loads and frees them, same errors. */
int kvr_tokset_check(const struct kvr_conf *c, struct kvr_err *err);

/* SIGHUP: loads the tokenizers whose section is new or whose path or files changed (by
 * path, size, mtime, inode of tokenizer.json and tokenizer_config.json), drops removed
 * models, keeps the others as they are, publishes the new table and frees the replaced
 * tokenizers once no reader holds them. A tokenizer that fails to load keeps its model's
 * previous one (if any): the error (first one, as create's) is returned in err with
 * -EINVAL, after everything else was applied. *nloaded (may be NULL): tokenizers loaded. */
int kvr_tokset_reload(struct kvr_tokset *ts, const struct kvr_conf *c, size_t *nloaded,
                      struct kvr_err *err);

void kvr_tokset_destroy(struct kvr_tokset *ts); /* after every reader is destroyed */

int kvr_tokset_reader_create(struct kvr_tokset *ts, struct kvr_tokset_reader **out);
void kvr_tokset_reader_destroy(struct kvr_tokset_reader *r);

/* The reader's token limit (0 = none, the default): encode and chat return -EMSGSIZE as soon
 * as the text is known to make more ids than this (tok.h: kvr_tok_scratch_set_limit),
 * without tokenizing the rest. Counted in /metrics. */
void kvr_tokset_reader_set_limit(struct kvr_tokset_reader *r, size_t max_ids);

/* Token ids of text (len bytes, UTF-8) as model's tokenizer computes them; add_special as
 * HF's add_special_tokens. Returns the count, *ids valid until the reader's next call; or
 * -ENOENT (no tokenizer configured for model), -EILSEQ (invalid UTF-8), -ENOMEM,
 * -EOVERFLOW, -EMSGSIZE (more ids than the reader's limit). */
int kvr_tokset_encode(struct kvr_tokset_reader *r, const char *model, const char *text,
                      size_t len, bool add_special, const uint32_t **ids);

/* ---- chat (chat templates, tmpl.h) ----------------------------------------------------- */

/* The reader's template ctx, for the request's values (the caller resets it per request). */
kvr_tmpl_ctx *kvr_tokset_reader_ctx(struct kvr_tokset_reader *r);

struct kvr_tokset_chat {
    kvr_tmpl_val *messages_str;   /* content as strings (texts joined with "\n") */
    kvr_tmpl_val *messages_parts; /* content as [{"type": "text", "text"}] */
    kvr_tmpl_val *tools, *documents, *kwargs; /* NULL: absent (tools/documents: None) */
    bool add_generation_prompt, continue_final_message, add_special_tokens;
    const char *final_text;       /* continue_final_message: the final message's text */
    size_t final_len;
    size_t max_render_bytes;
};

/* Renders the model's chat template with c, as transformers' apply_chat_template does for
 * vLLM (the "tool_use" template when tools are given and the model has one; content in the
 * form the template wants; special tokens and chat_template_kwargs as variables;
 * continue_final_message cuts the output after the final message's text), then tokenizes
 * the text (through the prefix cache: a conversation's earlier turns are not tokenized again).
 * Returns the count, *ids valid until the reader's next call; -ENOENT (no tokenizer for the
 * model), -ENOTSUP (the model has no chat template), -EINVAL (the template failed:
 * raise_exception's message in err, or the final message is not in the output), -E2BIG
 * (render larger than max_render_bytes), -ELOOP, -ENOMEM, -EILSEQ, -EMSGSIZE (the limit). */
int kvr_tokset_chat(struct kvr_tokset_reader *r, const char *model,
                    const struct kvr_tokset_chat *c, const uint32_t **ids, char *err,
                    size_t errlen);

/* Prometheus lines: models with a tokenizer, reloads, and the prefix cache. */
void kvr_tokset_metrics(struct kvr_tokset *ts, struct kvr_buf *out);

#endif
