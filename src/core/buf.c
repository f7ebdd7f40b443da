/* buf.c — the growable byte buffer (buf.h).
 *
 * Why its own module: it was born in metrics.c as the output of the Prometheus renderers, but
 * most of its users (http, httpreq, httpapi, daemon) only build bodies and responses with it
 * and have nothing to do with metrics.
 *
 * Growth doubles from 256 bytes and keeps one byte for the NUL terminator; memory is kept
 * across kvr_buf_reset(). After a failed realloc the buffer stays valid (old contents) and
 * oom makes further appends no-ops, so an out-of-memory rendering is truncated, never
 * corrupted.
 */
#include "core/buf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_buf_init(struct kvr_buf *b)
{
    memset(b, 0, sizeof(*b));
}

void kvr_buf_free(struct kvr_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void kvr_buf_reset(struct kvr_buf *b)
{
    b->len = 0;
    b->oom = 0;
}

int kvr_buf_reserve(struct kvr_buf *b, size_t extra)
{
    size_t need, cap;
    char *p;

    if (b->oom)
        return -ENOMEM;
    need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    p = realloc(b->data, cap);
    if (p == NULL) {
        b->oom = 1;
        return -ENOMEM;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void kvr_buf_append(struct kvr_buf *b, const void *p, size_t n)
{
    if (kvr_buf_reserve(b, n) != 0)
        return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void kvr_buf_printf(struct kvr_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (kvr_buf_reserve(b, 128) != 0)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= b->cap - b->len) {
        if (kvr_buf_reserve(b, (size_t)n) != 0)
            return;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}
