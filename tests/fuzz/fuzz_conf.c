/* fuzz_conf.c — libFuzzer target for the configuration parser (kvr_conf_load_string) and the
 * shared value parsers. Any input must give 0 or -EINVAL with a "t.conf:LINE: " message,
 * never a crash or a leak; a successful parse must survive a reload onto itself. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/conf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    struct kvr_conf c, d;
    struct kvr_err err, changed, ignored;
    int64_t v;
    char host[64];
    int port, rc;

    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    rc = kvr_conf_load_string("t.conf", text, &c, &err);
    if (rc == 0) {
        /* Reloading a config onto an identical one changes nothing. */
        if (kvr_conf_load_string("t.conf", text, &d, &err) != 0)
            abort();
        if (kvr_conf_apply_reload(&c, &d, &changed, &ignored) != 0 || ignored.msg[0] != '\0')
            abort();
        (void)kvr_conf_tier_weight(&c, "gpu");
        kvr_conf_free(&d);
        kvr_conf_free(&c);
    } else if (rc != -EINVAL || strncmp(err.msg, "t.conf:", 7) != 0) {
        abort();
    }

    /* The shared parsers on the first line. */
    char *nl = strchr(text, '\n');
    if (nl != NULL)
        *nl = '\0';
    (void)kvr_conf_parse_size(text, &v);
    (void)kvr_conf_parse_duration(text, &v);
    (void)kvr_conf_parse_hostport(text, host, sizeof(host), &port);
    free(text);
    return 0;
}
