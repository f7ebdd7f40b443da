/* log.c — leveled logging (text or JSON lines) and a lock-free rate limiter.
 *
 * Each line is formatted into a stack buffer and written with a single write(2), so lines
 * from several threads never interleave. Level and format are atomics: SIGHUP reload changes
 * them while other threads log. Messages longer than the buffer are truncated with "...".
 * Messages are escaped in both formats (JSON string escapes; in text, control bytes and the
 * backslash as C-style escapes), so no message can span or forge lines.
 */
#include "core/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 2048

static _Atomic int g_level = KVR_LOG_INFO;
static _Atomic int g_format = KVR_LOG_TEXT;
static _Atomic int g_fd = 2;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void kvr_log_configure(enum kvr_log_level level, enum kvr_log_format format)
{
    atomic_store_explicit(&g_level, (int)level, memory_order_relaxed);
    atomic_store_explicit(&g_format, (int)format, memory_order_relaxed);
}

void kvr_log_set_fd(int fd)
{
    atomic_store_explicit(&g_fd, fd, memory_order_relaxed);
}

enum kvr_log_level kvr_log_level(void)
{
    return (enum kvr_log_level)atomic_load_explicit(&g_level, memory_order_relaxed);
}

int kvr_log_level_parse(const char *s, enum kvr_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (enum kvr_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = KVR_LOG_WARN;
        return 0;
    }
    return -EINVAL;
}

const char *kvr_log_level_name(enum kvr_log_level level)
{
    return (unsigned)level < 4 ? level_names[level] : "?";
}

int64_t kvr_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t kvr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double kvr_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Appends s to buf as JSON string contents (without quotes). */
static size_t json_escape(char *dst, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            dst[n++] = '\\';
            dst[n++] = (char)c;
        } else if (c == '\n') {
            dst[n++] = '\\';
            dst[n++] = 'n';
        } else if (c < 0x20) {
            n += (size_t)snprintf(dst + n, cap - n, "\\u%04x", c);
        } else {
            dst[n++] = (char)c;
        }
    }
    return n;
}

/* Appends s to dst for a text line: control bytes (C0, DEL) become \n, \r, \t, \e or \xHH
 * and a backslash becomes \\, so a peer-supplied string (a topic, a pod name) can neither
 * end the line and forge the next one nor send terminal escape sequences, and the escaped
 * text is unambiguous. Bytes >= 0x80 (UTF-8) pass unchanged. Stops before an escape that
 * would not fit in cap. */
static size_t text_escape(char *dst, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;

    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e = 0;
        if (c >= 0x20 && c != 0x7f && c != '\\') {
            if (n + 1 > cap)
                break;
            dst[n++] = (char)c;
            continue;
        }
        switch (c) {
        case '\n': e = 'n'; break;
        case '\r': e = 'r'; break;
        case '\t': e = 't'; break;
        case 0x1b: e = 'e'; break;
        case '\\': e = '\\'; break;
        default: break;
        }
        if (n + (e ? 2 : 4) > cap)
            break;
        dst[n++] = '\\';
        if (e) {
            dst[n++] = e;
        } else {
            dst[n++] = 'x';
            dst[n++] = hex[c >> 4];
            dst[n++] = hex[c & 15];
        }
    }
    return n;
}

__attribute__((format(printf, 3, 0)))
static void vlog(enum kvr_log_level level, const char *suffix, const char *fmt, va_list ap)
{
    char msg[LINE_MAX_BYTES];
    char line[LINE_MAX_BYTES * 2];
    char ts[96];
    struct timespec now;
    struct tm tm;
    size_t n;
    int m;

    m = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (m >= (int)sizeof(msg))
        memcpy(msg + sizeof(msg) - 4, "...", 4);
    if (suffix != NULL) {
        size_t l = strlen(msg);
        snprintf(msg + l, sizeof(msg) - l, "%s", suffix);
    }
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)(now.tv_nsec / 1000000) % 1000);

    if (atomic_load_explicit(&g_format, memory_order_relaxed) == KVR_LOG_JSON) {
        n = (size_t)snprintf(line, sizeof(line), "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", ts,
                             kvr_log_level_name(level));
        n += json_escape(line + n, sizeof(line) - n - 4, msg);
        memcpy(line + n, "\"}\n", 3);
        n += 3;
    } else {
        /* every message is escaped: its arguments may hold peer-supplied bytes */
        n = (size_t)snprintf(line, sizeof(line), "%s %-5s ", ts, kvr_log_level_name(level));
        n += text_escape(line + n, sizeof(line) - n - 1, msg);
        line[n++] = '\n';
    }
    /* One write per line; a short write to stderr is not worth retrying. */
    ssize_t w = write(atomic_load_explicit(&g_fd, memory_order_relaxed), line, n);
    (void)w;
}

void kvr_log(enum kvr_log_level level, const char *fmt, ...)
{
    va_list ap;

    if ((int)level > atomic_load_explicit(&g_level, memory_order_relaxed))
        return;
    va_start(ap, fmt);
    vlog(level, NULL, fmt, ap);
    va_end(ap);
}

void kvr_ratelimit_init(struct kvr_ratelimit *rl, int64_t interval_ms, uint32_t burst)
{
    atomic_init(&rl->window_start_ms, 0);
    atomic_init(&rl->printed, 0);
    atomic_init(&rl->suppressed, 0);
    rl->interval_ms = interval_ms > 0 ? interval_ms : 10000;
    rl->burst = burst > 0 ? burst : 10;
}

bool kvr_ratelimit_allow(struct kvr_ratelimit *rl, uint64_t *suppressed)
{
    int64_t now = kvr_now_ms();
    int64_t start = atomic_load_explicit(&rl->window_start_ms, memory_order_relaxed);

    if (now - start >= rl->interval_ms &&
        atomic_compare_exchange_strong(&rl->window_start_ms, &start, now))
        atomic_store_explicit(&rl->printed, 0, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&rl->printed, 1, memory_order_relaxed) < rl->burst) {
        *suppressed = atomic_exchange_explicit(&rl->suppressed, 0, memory_order_relaxed);
        return true;
    }
    atomic_fetch_add_explicit(&rl->suppressed, 1, memory_order_relaxed);
    return false;
}

void kvr_log_limited(struct kvr_ratelimit *rl, enum kvr_log_level level, const char *fmt, ...)
{
    va_list ap;
    uint64_t suppressed = 0;
    char suffix[64];

    if ((int)level > atomic_load_explicit(&g_level, memory_order_relaxed))
        return;
    if (!kvr_ratelimit_allow(rl, &suppressed))
        return;
    if (suppressed > 0)
        snprintf(suffix, sizeof(suffix), " (%llu similar suppressed)",
                 (unsigned long long)suppressed);
    va_start(ap, fmt);
    vlog(level, suppressed > 0 ? suffix : NULL, fmt, ap);
    va_end(ap);
}

void kvr_log_assert_fail(const char *what, const char *file, int line)
{
    const char *base = strrchr(file, '/');

    kvr_log_error("internal invariant failed: %s (%s:%d)", what, base ? base + 1 : file, line);
    abort();
}
