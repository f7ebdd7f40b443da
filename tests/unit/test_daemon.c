/* test_daemon.c — the ready-line contract and address formatting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "daemon/daemon.h"

static void test_ready_line(void **state)
{
    struct kvr_buf b;
    const char *eps[] = {"tcp://127.0.0.1:45678", "tcp://0.0.0.0:5557"};
    struct kvr_daemon_listeners none = {0};
    struct kvr_daemon_listeners all = {"127.0.0.1:34567", "127.0.0.1:34568", eps, 2};
    struct kvr_daemon_listeners some = {"[::1]:80", NULL, eps, 1};
    (void)state;

    kvr_buf_init(&b);
    kvr_daemon_format_ready(&b, &none);
    assert_string_equal(b.data, "kvrouterd ready version=" KVR_VERSION);
    kvr_buf_reset(&b);
    kvr_daemon_format_ready(&b, &all);
    assert_string_equal(b.data, "kvrouterd ready version=" KVR_VERSION " http=127.0.0.1:34567 "
                                "admin=127.0.0.1:34568 "
                                "events=tcp://127.0.0.1:45678,tcp://0.0.0.0:5557");
    kvr_buf_reset(&b);
    kvr_daemon_format_ready(&b, &some);
    assert_string_equal(b.data, "kvrouterd ready version=" KVR_VERSION
                                " http=[::1]:80 events=tcp://127.0.0.1:45678");
    kvr_buf_free(&b);
}

static void test_hostport(void **state)
{
    char buf[64];
    (void)state;
    kvr_daemon_hostport(buf, sizeof(buf), "127.0.0.1:0", 34567);
    assert_string_equal(buf, "127.0.0.1:34567");
    kvr_daemon_hostport(buf, sizeof(buf), "[::]:0", 8080);
    assert_string_equal(buf, "[::]:8080");
    kvr_daemon_hostport(buf, sizeof(buf), "0.0.0.0:8080", 8080);
    assert_string_equal(buf, "0.0.0.0:8080");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_line),
        cmocka_unit_test(test_hostport),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
