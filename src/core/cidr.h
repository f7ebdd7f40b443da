/* cidr.h — IPv4/IPv6 address ranges ("10.0.0.0/8", "::1/128", "192.168.1.7") and the
 * matching of a peer address against them: the event plane's allowlist ([events] allow)
 * and the pod-must-match-peer comparison.
 *
 * Pure functions of their arguments: no sockets, no threads, no allocation. Addresses are
 * kept in 16 bytes; an IPv4 address (or range) is stored as its IPv4-mapped IPv6 form
 * ::ffff:a.b.c.d (/n becomes /96+n), so an IPv4 peer seen by a dual-stack socket as
 * "::ffff:10.1.2.3" matches "10.0.0.0/8" and the same peer seen as "10.1.2.3" does too.
 */
#ifndef KVR_CIDR_H
#define KVR_CIDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvr_cidr {
    uint8_t addr[16]; /* network address, host bits cleared */
    uint8_t bits;     /* prefix length over the 16-byte form: 0..128 */
};

/* "ADDR" or "ADDR/N" (IPv4: N 0..32, IPv6: N 0..128; no prefix = one host). Host bits set
 * below the prefix ("10.1.0.0/8") are rejected (-EINVAL: the writer probably meant another
 * range), as are anything but numeric addresses, spaces, leading zeros in N. 0 or -EINVAL. */
int kvr_cidr_parse(const char *s, struct kvr_cidr *out);
/* A numeric address ("10.0.0.7", "::1", "::ffff:10.0.0.7", "[::1]") → 16-byte form; a
 * bracketed IPv6 address is accepted (ZeroMQ's Peer-Address has none, endpoints do).
 * len bytes of s are read (no NUL needed). 0 or -EINVAL. */
int kvr_cidr_addr(const char *s, size_t len, uint8_t out[16]);
bool kvr_cidr_match(const struct kvr_cidr *c, const uint8_t addr[16]);
/* True when addr is in any of the n ranges (n == 0: false). */
bool kvr_cidr_match_any(const struct kvr_cidr *c, size_t n, const uint8_t addr[16]);
/* "10.0.0.0/8" or "::1/128" form of c into buf (IPv4-mapped ranges print as IPv4). */
void kvr_cidr_format(const struct kvr_cidr *c, char *buf, size_t cap);

#endif
