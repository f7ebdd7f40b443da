/* log.h — leveled logging to stderr, as text or JSON lines, with rate limiting for
 * peer-caused errors.
 *
 * Threads: every function may be called from any thread. A line is written with one
 * write(2), so lines from different threads never interleave. Never call with an index
 * lock held (house rule: no I/O under index locks).
 */
#ifndef KVR_LOG_H
#define KVR_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum kvr_log_level {
    KVR_LOG_ERROR = 0,
    KVR_LOG_WARN = 1,
    KVR_LOG_INFO = 2,
    KVR_LOG_DEBUG = 3,
};

enum kvr_log_format {
    KVR_LOG_TEXT = 0, /* "2026-11-23T10:00:00.123Z info  message" */
    KVR_LOG_JSON = 1, /* {"ts":"...","level":"info","msg":"..."} */
};

/* Sets level and format; may be called again at any time (SIGHUP reload). fd defaults to 2. */
void kvr_log_configure(enum kvr_log_level level, enum kvr_log_format format);
void kvr_log_set_fd(int fd);
enum kvr_log_level kvr_log_level(void);

/* Parses "error", "warn", "info", "debug" (and "warning"); returns 0 or -EINVAL. */
int kvr_log_level_parse(const char *s, enum kvr_log_level *out);
const char *kvr_log_level_name(enum kvr_log_level level);

void kvr_log(enum kvr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define kvr_log_error(...) kvr_log(KVR_LOG_ERROR, __VA_ARGS__)
#define kvr_log_warn(...) kvr_log(KVR_LOG_WARN, __VA_ARGS__)
#define kvr_log_info(...) kvr_log(KVR_LOG_INFO, __VA_ARGS__)
#define kvr_log_debug(...)                                          \
    do {                                                            \
        if (kvr_log_level() >= KVR_LOG_DEBUG)                       \
            kvr_log(KVR_LOG_DEBUG, __VA_ARGS__);                    \
    } while (0)

/* Rate limiter for peer-caused errors: at most `burst` lines per `interval_ms`; the rest are
 * counted and reported by the next line allowed through ("... (suppressed 512 similar)").
 * Initialise statically with KVR_RATELIMIT_INIT(interval_ms, burst). Lock-free. */
struct kvr_ratelimit {
    _Atomic int64_t window_start_ms;
    _Atomic uint32_t printed;
    _Atomic uint64_t suppressed;
    int64_t interval_ms;
    uint32_t burst;
};
#define KVR_RATELIMIT_INIT(interval, n) { 0, 0, 0, (interval), (n) }

/* Initialises a limiter at run time: at most burst lines per interval_ms (0 → 10 s / 10). */
void kvr_ratelimit_init(struct kvr_ratelimit *rl, int64_t interval_ms, uint32_t burst);

/* Returns true when a line may be printed now; *suppressed gets the number of lines dropped
 * since the last printed one (to be mentioned in that line). */
bool kvr_ratelimit_allow(struct kvr_ratelimit *rl, uint64_t *suppressed);

/* Logs through the limiter: prints with a " (N similar suppressed)" suffix when needed. */
void kvr_log_limited(struct kvr_ratelimit *rl, enum kvr_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* KVR_ASSERT(cond): an invariant of our own code (never of bytes from a peer: those are
 * validated, counted and rejected). Stays on in release builds: a failed one logs the
 * condition, file and line at error level and aborts (so it may log under a lock: the
 * process ends there). */
#define KVR_ASSERT(c)                                                                         \
    do {                                                                                      \
        if (__builtin_expect(!(c), 0))                                                        \
            kvr_log_assert_fail(#c, __FILE__, __LINE__);                                      \
    } while (0)
_Noreturn void kvr_log_assert_fail(const char *what, const char *file, int line);

/* Monotonic and wall clocks in ms / ns (helpers shared by every module). */
int64_t kvr_now_ms(void);
uint64_t kvr_now_ns(void);
double kvr_wall_s(void);

#endif
