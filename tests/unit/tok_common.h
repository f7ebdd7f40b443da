/* tok_common.h — what the tokenizer tests share: where the reference tokenizers are, a file
 * read whole, the test seed. Static inline: each test binary includes it once.
 */
#ifndef KVR_TEST_TOK_COMMON_H
#define KVR_TEST_TOK_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* build/tokref, or $KVR_TOKREF (scripts/tok-fetch.sh puts the npm tokenizers there). */
static inline const char *tokref(void)
{
    const char *d = getenv("KVR_TOKREF");
    return d && *d ? d : "build/tokref";
}

/* KVR_TEST_SEED=N replays a randomized run; else one from the clock. */
static inline unsigned test_seed(void)
{
    const char *s = getenv("KVR_TEST_SEED");
    return s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)clock();
}

/* The whole file, NUL-terminated (*len without the NUL); NULL when it cannot be read. */
static inline char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    *len = 0;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        *len = (size_t)n;
    }
    return b;
}

#endif
