/* test_log.c — log lines: one line per message whatever the message holds (text: control
 * bytes and backslashes escaped; JSON: string escapes), levels, truncation, rate limiter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/log.h"

/* Logs through a pipe: cap_begin(), kvr_log(...), cap_end() returns what was written
 * (NUL-terminated, static buffer). */
static int cap_pipe[2];

static void cap_begin(enum kvr_log_format f)
{
    assert_int_equal(pipe(cap_pipe), 0);
    kvr_log_configure(KVR_LOG_DEBUG, f);
    kvr_log_set_fd(cap_pipe[1]);
}

static const char *cap_end(void)
{
    static char out[16384];
    ssize_t n;

    kvr_log_set_fd(2);
    close(cap_pipe[1]);
    n = read(cap_pipe[0], out, sizeof(out) - 1);
    close(cap_pipe[0]);
    assert_true(n >= 0);
    out[n] = 0;
    return out;
}

static const char *capture(enum kvr_log_format f, const char *arg)
{
    cap_begin(f);
    kvr_log_warn("bad topic '%s'", arg);
    return cap_end();
}

static size_t count(const char *s, char c)
{
    size_t k = 0;
    for (; *s; s++)
        k += *s == c;
    return k;
}

/* The message part of a text line: after "<ts> <level> ". */
static const char *text_msg(const char *line)
{
    const char *sp = strchr(line, ' ');
    assert_non_null(sp);
    sp++;
    while (*sp && *sp != ' ')
        sp++;
    while (*sp == ' ')
        sp++;
    return sp;
}

static void test_text_plain_unchanged(void **state)
{
    (void)state;
    const char *l = capture(KVR_LOG_TEXT, "kv@pod-a@llama 3 ü");
    assert_string_equal(text_msg(l), "bad topic 'kv@pod-a@llama 3 ü'\n");
    assert_non_null(strstr(l, " warn  bad topic"));
}

static void test_text_newline_cannot_forge_a_line(void **state)
{
    (void)state;
    const char *forged = "kv@x@m\n2026-11-23T10:00:00.000Z error forged\r\n";
    const char *l = capture(KVR_LOG_TEXT, forged);
    assert_int_equal(count(l, '\n'), 1);
    assert_int_equal(count(l, '\r'), 0);
    assert_int_equal(l[strlen(l) - 1], '\n');
    assert_string_equal(text_msg(l),
                        "bad topic 'kv@x@m\\n2026-11-23T10:00:00.000Z error forged\\r\\n'\n");
}

static void test_text_control_bytes_escaped(void **state)
{
    (void)state;
    const char *l = capture(KVR_LOG_TEXT, "a\x1b[31mred\x1b[0m\tb\x01\x7f\\c");
    for (const char *p = l; *p; p++)
        assert_true((unsigned char)*p >= 0x20 && *p != 0x7f ? 1 : *p == '\n');
    assert_string_equal(text_msg(l), "bad topic 'a\\e[31mred\\e[0m\\tb\\x01\\x7f\\\\c'\n");
}

static void test_text_escapes_whole_message(void **state)
{
    (void)state;
    /* the format string itself (not only %s arguments) is escaped */
    cap_begin(KVR_LOG_TEXT);
    kvr_log_error("two\nlines %s", "x");
    const char *l = cap_end();
    assert_int_equal(count(l, '\n'), 1);
    assert_string_equal(text_msg(l), "two\\nlines x\n");
}

static void test_text_long_message_stays_one_line(void **state)
{
    (void)state;
    static char big[3000];
    memset(big, '\n', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    const char *l = capture(KVR_LOG_TEXT, big);
    assert_int_equal(count(l, '\n'), 1);
    assert_int_equal(l[strlen(l) - 1], '\n');
    /* escaping stops on a whole escape: no dangling backslash before the newline */
    const char *m = text_msg(l);
    size_t n = strlen(m), bs = 0;
    for (size_t i = n - 1; i > 0 && m[i - 1] == '\\'; i--)
        bs++;
    assert_int_equal(bs % 2, 0);
}

static void test_json_escaped(void **state)
{
    (void)state;
    const char *l = capture(KVR_LOG_JSON, "q\"\\\n\x1b[0m");
    assert_int_equal(count(l, '\n'), 1);
    assert_non_null(strstr(l, "\"level\":\"warn\""));
    assert_non_null(strstr(l, "\"msg\":\"bad topic 'q\\\"\\\\\\n\\u001b[0m'\"}\n"));
}

static void test_level_filter(void **state)
{
    (void)state;
    int p[2];
    char out[256];

    assert_int_equal(pipe(p), 0);
    kvr_log_configure(KVR_LOG_WARN, KVR_LOG_TEXT);
    kvr_log_set_fd(p[1]);
    kvr_log_info("not shown");
    kvr_log_error("shown");
    kvr_log_set_fd(2);
    close(p[1]);
    ssize_t n = read(p[0], out, sizeof(out) - 1);
    close(p[0]);
    assert_true(n > 0);
    out[n] = 0;
    assert_null(strstr(out, "not shown"));
    assert_non_null(strstr(out, "error shown\n"));
}

static void test_ratelimit(void **state)
{
    (void)state;
    struct kvr_ratelimit rl;
    uint64_t sup = 99;
    kvr_ratelimit_init(&rl, 60000, 2);
    assert_true(kvr_ratelimit_allow(&rl, &sup));
    assert_int_equal(sup, 0);
    assert_true(kvr_ratelimit_allow(&rl, &sup));
    assert_false(kvr_ratelimit_allow(&rl, &sup));
    assert_false(kvr_ratelimit_allow(&rl, &sup));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_plain_unchanged),
        cmocka_unit_test(test_text_newline_cannot_forge_a_line),
        cmocka_unit_test(test_text_control_bytes_escaped),
        cmocka_unit_test(test_text_escapes_whole_message),
        cmocka_unit_test(test_text_long_message_stays_one_line),
        cmocka_unit_test(test_json_escaped),
        cmocka_unit_test(test_level_filter),
        cmocka_unit_test(test_ratelimit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
