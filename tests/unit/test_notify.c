/* test_notify.c — environment parsing of the sd_notify client (sending is covered by the
 * integration tests, which bind a real datagram socket). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "core/notify.h"

static void test_disabled_without_socket(void **state)
{
    struct kvr_notify n;
    (void)state;
    assert_int_equal(kvr_notify_init_from(&n, NULL, NULL, NULL, 42, NULL), 0);
    assert_false(kvr_notify_enabled(&n));
    assert_int_equal(kvr_notify_ready(&n, "x"), 0); /* no-op */
    assert_int_equal(kvr_notify_watchdog(&n), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 0);
    kvr_notify_deinit(&n);
    assert_int_equal(kvr_notify_init_from(&n, "", NULL, NULL, 42, NULL), 0);
    assert_false(kvr_notify_enabled(&n));
}

static void test_watchdog_env(void **state)
{
    struct kvr_notify n;
    (void)state;
    assert_int_equal(kvr_notify_init_from(&n, NULL, "3000000", NULL, 42, NULL), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 3000000);
    assert_int_equal(kvr_notify_init_from(&n, NULL, "3000000", "42", 42, NULL), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 3000000);
    /* Meant for another process (e.g. inherited from a parent): ignored. */
    assert_int_equal(kvr_notify_init_from(&n, NULL, "3000000", "41", 42, NULL), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 0);
    assert_int_equal(kvr_notify_init_from(&n, NULL, "0", NULL, 42, NULL), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 0);
    assert_int_equal(kvr_notify_init_from(&n, NULL, "-5", NULL, 42, NULL), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 0);
    assert_int_equal(kvr_notify_init_from(&n, NULL, "12abc", NULL, 42, NULL), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 0);
    assert_int_equal(kvr_notify_init_from(&n, NULL, "5", "x", 42, NULL), 0);
    assert_int_equal(kvr_notify_watchdog_usec(&n), 0);
}

static void test_socket_addresses(void **state)
{
    struct kvr_notify n;
    struct kvr_err err;
    char longpath[200];
    (void)state;
    assert_int_equal(kvr_notify_init_from(&n, "/run/systemd/notify", NULL, NULL, 1, &err), 0);
    assert_true(kvr_notify_enabled(&n));
    assert_int_equal(n.addr.sun_family, AF_UNIX);
    assert_string_equal(n.addr.sun_path, "/run/systemd/notify");
    assert_int_equal(n.addrlen, offsetof(struct sockaddr_un, sun_path) + 20);
    kvr_notify_deinit(&n);
    assert_false(kvr_notify_enabled(&n));

    assert_int_equal(kvr_notify_init_from(&n, "@abstract/name", NULL, NULL, 1, &err), 0);
    assert_true(kvr_notify_enabled(&n));
    assert_int_equal(n.addr.sun_path[0], '\0');
    assert_memory_equal(n.addr.sun_path + 1, "abstract/name", 13);
    assert_int_equal(n.addrlen, offsetof(struct sockaddr_un, sun_path) + 14); /* no trailing NUL */
    kvr_notify_deinit(&n);

    assert_int_equal(kvr_notify_init_from(&n, "vsock:2:1234", NULL, NULL, 1, &err),
                     -EAFNOSUPPORT);
    assert_false(kvr_notify_enabled(&n));
    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    assert_int_equal(kvr_notify_init_from(&n, longpath, NULL, NULL, 1, &err), -ENAMETOOLONG);
    assert_false(kvr_notify_enabled(&n));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disabled_without_socket),
        cmocka_unit_test(test_watchdog_env),
        cmocka_unit_test(test_socket_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
