/* fuzz_tok_load.c — the tokenizer.json loader on arbitrary bytes.
 *
 * Input: tokenizer.json, optionally followed by a NUL byte and a tokenizer_config.json. A load
 * either succeeds or fails with a negative errno and a non-empty message; a loaded tokenizer
 * then encodes a few fixed texts with every id in its vocabulary.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *j = (const char *)data, *c = NULL;
    size_t jl = size, cl = 0;
    const uint8_t *z = memchr(data, 0, size);
    if (z) {
        jl = (size_t)(z - data);
        c = (const char *)z + 1;
        cl = size - jl - 1;
    }
    kvr_tok *t = NULL;
    char err[256];
    int rc = kvr_tok_load_mem(j, jl, c, cl, &t, err, sizeof err);
    if (rc) {
        if (rc > 0 || t || !err[0])
            abort();
        return 0;
    }
    static const char *texts[] = {"", "Hello, world! 123", "a  b\n\n\tc 'sé中😀", "<s><|im_start|>x"};
    kvr_tok_scratch *s = kvr_tok_scratch_new();
    for (size_t i = 0; s && i < sizeof texts / sizeof *texts; i++) {
        const uint32_t *ids;
        int r = kvr_tok_encode(t, s, texts[i], strlen(texts[i]), i & 1, &ids);
        if (r < 0 && r != -E2BIG && r != -EOVERFLOW) /* too long; a normalizer blew up */
            abort();
        for (int k = 0; k < r; k++)
            if (ids[k] >= kvr_tok_vocab_size(t))
                abort();
    }
    kvr_tok_scratch_free(s);
    kvr_tok_free(t);
    return 0;
}
