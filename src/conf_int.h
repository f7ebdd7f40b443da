/* conf_int.h — private to conf*.c: the value parsers of conf_value.c that conf.c's setters
 * use besides the public kvr_conf_parse_* of conf.h.
 */
#ifndef KVR_CONF_INT_H
#define KVR_CONF_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses an unsigned decimal integer prefix of s: the count of digits consumed (value in
 * *out), -1 when s does not start with a digit, -ERANGE past UINT64_MAX. */
int kvr_conf_parse_digits(const char *s, uint64_t *out);
/* on/off, true/false, yes/no, 1/0 (any case) into *out: 0, or -EINVAL (*out unchanged). */
int kvr_conf_parse_bool(const char *s, bool *out);
/* 0 when ep is a valid ZMQ endpoint (tcp://HOST:PORT, ipc://PATH, inproc://NAME), else
 * -EINVAL. for_bind: the tcp host may be '*' and the port '*' or 0 (ephemeral). */
int kvr_conf_check_endpoint(const char *ep, bool for_bind);

/* [model "NAME"] sections (conf_model.c). hdr[0..n) is the header between '[' and ']',
 * starting with "model": the name goes to name[cap]; -EINVAL with a message otherwise. */
struct kvr_conf;
int kvr_conf_model_header(const char *hdr, size_t n, char *name, size_t cap, char *msg,
                          size_t msgcap);
/* Appends a model (duplicate names: -EINVAL); its keys then go to kvr_conf_model_key. */
int kvr_conf_model_add(struct kvr_conf *c, const char *name, int line, char *msg, size_t msgcap);
int kvr_conf_model_key(struct kvr_conf *c, const char *key, const char *value, int line,
                       char *msg, size_t msgcap);
void kvr_conf_models_free(struct kvr_conf *c);
/* Copies fresh's model list onto live; calls changed() for each model added, removed or
 * changed; returns their number, or -ENOMEM (live unchanged). */
int kvr_conf_models_reload(struct kvr_conf *live, const struct kvr_conf *fresh,
                           void (*changed)(void *arg, const char *name), void *arg);

#endif
