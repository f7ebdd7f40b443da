/* err.c — struct kvr_err helpers. No allocation, safe on any thread. */
#include "core/err.h"

#include <stdarg.h>
#include <stdio.h>

int kvr_err_set(struct kvr_err *err, int rc, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL)
        return rc;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return rc;
}
