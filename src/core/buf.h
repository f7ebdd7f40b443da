/* buf.h — a growable byte buffer: what renderers write /metrics text into, and what the HTTP
 * layer builds request bodies and responses in.
 *
 * Ownership: kvr_buf_init() on caller storage, kvr_buf_free() releases the memory. data is
 * NUL-terminated after every append (when non-NULL), so a buffer can be logged or parsed as a
 * C string. A failed growth sets oom and drops every later append until kvr_buf_reset(), so
 * callers may append a whole rendering and check oom once.
 *
 * Threads: a kvr_buf belongs to one thread.
 */
#ifndef KVR_BUF_H
#define KVR_BUF_H

#include <stddef.h>

/* Growable byte buffer (output of renderers, HTTP responses). */
struct kvr_buf {
    char *data;
    size_t len;
    size_t cap;
    int oom; /* set when a growth failed; further appends are dropped */
};

void kvr_buf_init(struct kvr_buf *b);
void kvr_buf_free(struct kvr_buf *b);
void kvr_buf_reset(struct kvr_buf *b); /* len = 0, keeps memory */
int kvr_buf_reserve(struct kvr_buf *b, size_t extra); /* 0 or -ENOMEM */
void kvr_buf_append(struct kvr_buf *b, const void *p, size_t n);
void kvr_buf_printf(struct kvr_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
