/* reqbody_int.h — private to src/reqbody*.c: the chat part of query bodies
 * (reqbody_chat.c) that reqbody.c's JSON walk hands its keys to.
 */
#ifndef KVR_REQBODY_INT_H
#define KVR_REQBODY_INT_H

#include "http/jtok.h"
#include "http/reqbody.h"
#include "text/tmpl.h"

/* Any JSON value at the cursor into a template value in ctx (depth: nesting so far). */
int kvr_reqbody_json_value(struct kvr_jtok *j, kvr_tmpl_ctx *ctx, int depth, kvr_tmpl_val **out,
                           struct kvr_err *err);
/* The chat keys ("messages", "tools", "documents", "chat_template_kwargs",
 * "add_generation_prompt", "continue_final_message"): 1 consumed, 0 not a chat key, or
 * -errno with err set. */
int kvr_reqbody_chat_key(struct kvr_reqbody_chat *ch, kvr_tmpl_ctx *ctx, const char *key,
                         size_t klen, struct kvr_jtok *j, struct kvr_err *err);

#endif
