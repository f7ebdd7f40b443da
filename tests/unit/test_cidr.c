/* test_cidr.c — cidr: parsing of [events] allow ranges and peer addresses, fixed cases, then
 * randomized ranges and addresses checked against a naive reference (IPv4 with shifts on a
 * uint32_t, IPv6 bit by bit); the seed is printed, KVR_SEED=N reruns one.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/cidr.h"

static bool in(const char *range, const char *addr)
{
    struct kvr_cidr c;
    uint8_t a[16];
    assert_int_equal(kvr_cidr_parse(range, &c), 0);
    assert_int_equal(kvr_cidr_addr(addr, strlen(addr), a), 0);
    return kvr_cidr_match(&c, a);
}

static void test_fixed(void **state)
{
    struct kvr_cidr c;
    char buf[64];
    uint8_t a[16];
    (void)state;

    assert_true(in("127.0.0.0/8", "127.0.0.1"));
    assert_true(in("127.0.0.0/8", "127.255.3.4"));
    assert_false(in("127.0.0.0/8", "128.0.0.1"));
    assert_true(in("127.0.0.2", "127.0.0.2"));
    assert_false(in("127.0.0.2", "127.0.0.1"));
    assert_true(in("127.0.0.2/32", "127.0.0.2"));
    assert_true(in("10.0.0.0/8", "::ffff:10.9.8.7")); /* dual-stack form of an IPv4 peer */
    assert_true(in("0.0.0.0/0", "1.2.3.4"));
    assert_false(in("0.0.0.0/0", "::1"));
    assert_true(in("::/0", "::1"));
    assert_true(in("::1/128", "::1"));
    assert_true(in("::1", "[::1]"));
    assert_false(in("::1/128", "::2"));
    assert_true(in("fd00::/8", "fd12:3456::1"));
    assert_false(in("fd00::/8", "fe80::1"));
    assert_true(in("fe80::/10", "febf::1"));
    assert_false(in("fe80::/10", "fec0::1"));
    assert_true(in("172.16.0.0/12", "172.31.255.255"));
    assert_false(in("172.16.0.0/12", "172.32.0.0"));

    assert_int_equal(kvr_cidr_parse("10.0.0.0/33", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("::/129", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("10.1.0.0/8", &c), -EINVAL); /* host bits set */
    assert_int_equal(kvr_cidr_parse("10.0.0.0/", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("10.0.0.0/08", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("10.0.0.0/8 ", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("10.0.0.0/-1", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("localhost", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("/8", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("10.0.0/8", &c), -EINVAL);
    assert_int_equal(kvr_cidr_parse("[::1]/128", &c), 0);
    assert_int_equal(kvr_cidr_parse("[10.0.0.1]", &c), -EINVAL);
    assert_int_equal(kvr_cidr_addr("eth0", 4, a), -EINVAL);
    assert_int_equal(kvr_cidr_addr("10.0.0.1x", 8, a), 0); /* len bytes only */

    assert_int_equal(kvr_cidr_parse("192.168.0.0/16", &c), 0);
    kvr_cidr_format(&c, buf, sizeof(buf));
    assert_string_equal(buf, "192.168.0.0/16");
    assert_int_equal(kvr_cidr_parse("fd00::/8", &c), 0);
    kvr_cidr_format(&c, buf, sizeof(buf));
    assert_string_equal(buf, "fd00::/8");
}

static uint64_t rng;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static bool naive_bit(const uint8_t *a, unsigned i)
{
    return (a[i / 8] >> (7 - i % 8)) & 1;
}

static void test_random(void **state)
{
    const char *env = getenv("KVR_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
    (void)state;

    printf("test_cidr random: seed %llu (KVR_SEED=N reruns)\n", (unsigned long long)seed);
    rng = seed | 1;
    for (int iter = 0; iter < 200000; iter++) {
        char rtext[80], atext[INET6_ADDRSTRLEN];
        struct kvr_cidr c;
        uint8_t a[16];
        bool want, v4 = rnd() & 1;

        if (v4) {
            uint32_t net = rnd(), addr, mask;
            unsigned n = rnd() % 33;
            mask = n == 0 ? 0 : ~0u << (32 - n);
            net &= mask;
            /* Half the addresses inside (random host bits), half anywhere. */
            addr = (rnd() & 1) ? (net | (rnd() & ~mask)) : rnd();
            want = n == 0 || (addr >> (32 - n)) == (net >> (32 - n));
            uint32_t nn = htonl(net), na = htonl(addr);
            char nt[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &nn, nt, sizeof(nt));
            inet_ntop(AF_INET, &na, atext, sizeof(atext));
            snprintf(rtext, sizeof(rtext), "%s/%u", nt, n);
        } else {
            uint8_t net[16], addr[16];
            unsigned n = rnd() % 129;
            char nt[INET6_ADDRSTRLEN];
            for (int i = 0; i < 16; i++)
                net[i] = (uint8_t)rnd();
            for (unsigned i = n; i < 128; i++)
                net[i / 8] &= (uint8_t)~(0x80 >> (i % 8));
            for (int i = 0; i < 16; i++)
                addr[i] = (rnd() & 1) ? net[i] : (uint8_t)rnd();
            if (rnd() & 1) /* flip exactly one bit somewhere */
                addr[rnd() % 16] ^= (uint8_t)(1u << (rnd() % 8));
            want = true;
            for (unsigned i = 0; i < n; i++)
                if (naive_bit(net, i) != naive_bit(addr, i))
                    want = false;
            inet_ntop(AF_INET6, net, nt, sizeof(nt));
            inet_ntop(AF_INET6, addr, atext, sizeof(atext));
            snprintf(rtext, sizeof(rtext), "%s/%u", nt, n);
        }
        if (kvr_cidr_parse(rtext, &c) != 0 || kvr_cidr_addr(atext, strlen(atext), a) != 0) {
            printf("seed %llu iter %d: cannot parse %s or %s\n", (unsigned long long)seed, iter,
                   rtext, atext);
            fail();
        }
        if (kvr_cidr_match(&c, a) != want) {
            printf("seed %llu iter %d: %s in %s: got %d, want %d\n", (unsigned long long)seed,
                   iter, atext, rtext, !want, want);
            fail();
        }
        /* A range with one host bit set is refused. */
        if ((v4 && c.bits < 128) || (!v4 && c.bits < 128)) {
            struct kvr_cidr bad;
            char ht[INET6_ADDRSTRLEN], btext[80];
            uint8_t h[16];
            unsigned bit = c.bits + rnd() % (128u - c.bits);
            memcpy(h, c.addr, 16);
            h[bit / 8] |= (uint8_t)(0x80 >> (bit % 8));
            if (v4)
                inet_ntop(AF_INET, h + 12, ht, sizeof(ht));
            else
                inet_ntop(AF_INET6, h, ht, sizeof(ht));
            snprintf(btext, sizeof(btext), "%s/%u", ht, v4 ? c.bits - 96u : c.bits);
            if (kvr_cidr_parse(btext, &bad) != -EINVAL) {
                printf("seed %llu iter %d: %s accepted\n", (unsigned long long)seed, iter, btext);
                fail();
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
