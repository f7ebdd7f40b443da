/* test_buf.c — the growable byte buffer: appends, printf growth, NUL termination, reset. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/buf.h"

static void test_append_grows_and_terminates(void **state)
{
    (void)state;
    struct kvr_buf b;
    char chunk[100];
    kvr_buf_init(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    memset(chunk, 'x', sizeof(chunk));
    for (int i = 0; i < 50; i++) {
        kvr_buf_append(&b, chunk, sizeof(chunk));
        assert_int_equal(b.len, (size_t)(i + 1) * sizeof(chunk));
        assert_true(b.cap > b.len);
        assert_int_equal(b.data[b.len], '\0');
    }
    assert_int_equal(strspn(b.data, "x"), 5000);
    assert_int_equal(b.oom, 0);
    kvr_buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.cap, 0);
}

static void test_printf_longer_than_first_reserve(void **state)
{
    (void)state;
    struct kvr_buf b;
    char big[1000];
    kvr_buf_init(&b);
    kvr_buf_printf(&b, "n=%d ", 42);
    assert_string_equal(b.data, "n=42 ");
    memset(big, 'y', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvr_buf_printf(&b, "%s|%s", big, "end"); /* past the 128 bytes reserved up front */
    assert_int_equal(b.len, 5 + 999 + 4);
    assert_int_equal(strlen(b.data), b.len);
    assert_string_equal(b.data + b.len - 4, "|end");
    kvr_buf_free(&b);
}

static void test_reset_keeps_memory(void **state)
{
    (void)state;
    struct kvr_buf b;
    char *data;
    size_t cap;
    kvr_buf_init(&b);
    kvr_buf_append(&b, "hello", 5);
    data = b.data;
    cap = b.cap;
    kvr_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_ptr_equal(b.data, data);
    assert_int_equal(b.cap, cap);
    kvr_buf_append(&b, "ab", 2);
    assert_string_equal(b.data, "ab");
    assert_int_equal(kvr_buf_reserve(&b, 10), 0);
    assert_true(b.cap >= b.len + 10 + 1);
    kvr_buf_free(&b);
}

static void test_oom_drops_appends_until_reset(void **state)
{
    (void)state;
    struct kvr_buf b;
    kvr_buf_init(&b);
    kvr_buf_append(&b, "ok", 2);
    b.oom = 1; /* as after a failed realloc */
    assert_int_equal(kvr_buf_reserve(&b, 1), -ENOMEM);
    kvr_buf_append(&b, "lost", 4);
    kvr_buf_printf(&b, "%s", "lost");
    assert_int_equal(b.len, 2);
    assert_string_equal(b.data, "ok");
    kvr_buf_reset(&b);
    kvr_buf_append(&b, "again", 5);
    assert_string_equal(b.data, "again");
    kvr_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_grows_and_terminates),
        cmocka_unit_test(test_printf_longer_than_first_reserve),
        cmocka_unit_test(test_reset_keeps_memory),
        cmocka_unit_test(test_oom_drops_appends_until_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
