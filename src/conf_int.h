/* conf_int.h — private to conf*.c: the value parsers of conf_value.c that conf.c's setters
 * use besides the public kvr_conf_parse_* of conf.h.
 */
#ifndef KVR_CONF_INT_H
#define KVR_CONF_INT_H

#include <stdbool.h>
#include <stdint.h>

/* Parses an unsigned decimal integer prefix of s: the count of digits consumed (value in
 * *out), -1 when s does not start with a digit, -ERANGE past UINT64_MAX. */
int kvr_conf_parse_digits(const char *s, uint64_t *out);
/* 0 when ep is a valid ZMQ endpoint (tcp://HOST:PORT, ipc://PATH, inproc://NAME), else
 * -EINVAL. for_bind: the tcp host may be '*' and the port '*' or 0 (ephemeral). */
int kvr_conf_check_endpoint(const char *ep, bool for_bind);

#endif
