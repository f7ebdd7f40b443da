/* fuzz_replay_tmpl.c — libFuzzer target for replay address templates (zsub_tmpl.c): the
 * template comes from the configuration, the pod id from the network (a message's topic), so
 * both halves of the input are hostile here.
 *
 * Input format:
 *   [rank u16 le][tmpl_len u8][template][pod]   (lengths clamped to what is left)
 * Invariants (abort() when broken): check and build agree on syntax (a checked template
 * builds for any short host at rank 0); a built address is
 * NUL-terminated within the buffer, starts with tcp:// or ipc://, and contains the pod id only
 * when kvr_zsub_pod_is_host accepted it; a pod the host check accepts has no character a host
 * cannot have.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "events/zsub.h"

static void check(int ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char tmpl[KVR_ZSUB_ADDR_MAX + 64], pod[300], out[KVR_ZSUB_ADDR_MAX];
    struct kvr_err err;
    size_t tl, pl;
    uint32_t rank;
    bool host;
    int rc;

    if (size < 3)
        return 0;
    rank = (uint32_t)data[0] | (uint32_t)data[1] << 8;
    tl = data[2];
    data += 3, size -= 3;
    if (tl > size)
        tl = size;
    memcpy(tmpl, data, tl);
    tmpl[tl] = '\0';
    pl = size - tl < sizeof(pod) - 1 ? size - tl : sizeof(pod) - 1;
    memcpy(pod, data + tl, pl);
    pod[pl] = '\0';

    host = kvr_zsub_pod_is_host(pod, pl);
    if (host) {
        check(pl > 0 && pl <= 253);
        for (size_t i = 0; i < pl; i++)
            check(isalnum((unsigned char)pod[i]) || pod[i] == '.' || pod[i] == '-' ||
                  pod[i] == ':');
    }
    /* the builder takes the pod as a C string (a topic record's): up to its first NUL */
    if (memchr(pod, '\0', pl) != NULL) {
        check(!host);
        pl = strlen(pod);
        host = kvr_zsub_pod_is_host(pod, pl);
    }
    rc = kvr_zsub_template_check(tmpl, &err);
    memset(out, 'x', sizeof(out));
    if (kvr_zsub_template_build(tmpl, pod, rank, out, sizeof(out), &err) == 0) {
        check(memchr(out, '\0', sizeof(out)) != NULL);
        check(strncmp(out, "tcp://", 6) == 0 || strncmp(out, "ipc://", 6) == 0);
        if (strstr(tmpl, "{pod}") != NULL)
            check(host && strlen(pod) == pl && strstr(out, pod) != NULL);
    } else if (rc == 0 && host) {
        /* A checked template (built for the sample pod 192.0.2.1, rank 0) builds for any
         * host as short as that, without ':', at rank 0: only a longer pod (length), an
         * IPv6 pod (brackets) or a rank (the port range) can make it fail. */
        check(pl > 9 || strchr(pod, ':') != NULL || rank > 0);
    }
    return 0;
}
