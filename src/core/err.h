/* err.h — caller-owned error context.
 *
 * Fallible functions return 0 or a negative errno; the human-readable context goes into a
 * struct kvr_err the caller owns (fixed buffer: no allocation on error paths). A NULL
 * struct kvr_err pointer is always accepted and means "caller does not want the text".
 */
#ifndef KVR_ERR_H
#define KVR_ERR_H

#include <stddef.h>

#define KVR_ERR_MSG_MAX 512

struct kvr_err {
    char msg[KVR_ERR_MSG_MAX];
};

/* Formats into err->msg (truncating) when err is non-NULL; returns rc unchanged so callers
 * can write `return kvr_err_set(err, -EINVAL, "bad %s", x);`. */
int kvr_err_set(struct kvr_err *err, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
