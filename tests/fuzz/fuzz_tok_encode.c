/* fuzz_tok_encode.c — tokenization of arbitrary bytes.
 *
 * Input: the first byte picks the tokenizer (bit 0: byte-level or SentencePiece-style, built
 * in code by fuzz_tok_common.h; bit 1: also the real Qwen3/Mistral tokenizer of
 * $KVR_TOKREF, default build/tokref, when present) and bit 2 add_special_tokens; the rest is
 * the text. Invalid UTF-8 must be refused with -EILSEQ, valid text must encode, and every id
 * must be in the vocabulary; the same text encodes the same twice (scratch reuse), and
 * through the prefix cache (shared by every input, so inputs with common beginnings resume
 * from each other) exactly as without it, also with a continuation appended.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tok_common.h"
#include "text/tok.h"

static kvr_tok *tk[4];
static kvr_tok_scratch *sc, *sc2;
static kvr_tok_cache *cache;

static void init(void)
{
    char err[256];
    char *bl = ft_bytelevel_json();
    if (kvr_tok_load_mem(bl, strlen(bl), NULL, 0, &tk[0], err, sizeof err) ||
        kvr_tok_load_mem(ft_sp_json, strlen(ft_sp_json), NULL, 0, &tk[1], err, sizeof err)) {
        fprintf(stderr, "fuzz_tok_encode: %s\n", err);
        abort();
    }
    free(bl);
    const char *d = getenv("KVR_TOKREF");
    char p[512];
    snprintf(p, sizeof p, "%s/qwen3", d && *d ? d : "build/tokref");
    if (kvr_tok_load(p, &tk[2], err, sizeof err))
        tk[2] = NULL;
    snprintf(p, sizeof p, "%s/llama2", d && *d ? d : "build/tokref");
    if (kvr_tok_load(p, &tk[3], err, sizeof err))
        tk[3] = NULL;
    sc = kvr_tok_scratch_new();
    sc2 = kvr_tok_scratch_new();
    if (!sc || !sc2 || kvr_tok_cache_new(4 << 20, &cache))
        abort();
}

static bool valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF)
            k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 3, cp = c & 0x07;
        else
            return false;
        if (i + k >= n + (k ? 0 : 1) || n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += k + 1;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!sc)
        init();
    if (size < 1)
        return 0;
    int which = data[0] & 1;
    if ((data[0] & 2) && tk[2 + which])
        which += 2;
    bool add = data[0] & 4;
    const kvr_tok *t = tk[which];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    const uint32_t *ids;
    int r = kvr_tok_encode(t, sc, text, n, add, &ids);
    if (!valid_utf8(data + 1, n)) {
        if (r != -EILSEQ)
            abort();
        return 0;
    }
    if (r < 0)
        abort();
    uint32_t *copy = malloc((size_t)r * sizeof *copy + 1);
    for (int i = 0; i < r; i++) {
        size_t l;
        if (ids[i] >= kvr_tok_vocab_size(t) || !kvr_tok_token(t, ids[i], &l))
            abort();
        copy[i] = ids[i];
    }
    int r2 = kvr_tok_encode(t, sc, text, n, add, &ids);
    if (r2 != r || memcmp(ids, copy, (size_t)r * sizeof *ids))
        abort();
    r2 = kvr_tok_encode_cached(t, cache, sc2, text, n, add, &ids);
    if (r2 != r || memcmp(ids, copy, (size_t)r * sizeof *ids))
        abort();
    free(copy);
    /* the text twice, then the text with its first half again: both share a beginning with
     * what the cache holds */
    char *x = malloc(2 * n + 1);
    memcpy(x, text, n);
    memcpy(x + n, text, n);
    size_t cut = n / 2;
    while (cut < n && (x[n + cut] & 0xC0) == 0x80)
        cut++;
    const size_t lens[2] = {2 * n, n + cut};
    for (int i = 0; i < 2; i++) {
        const uint32_t *pl;
        int a = kvr_tok_encode_cached(t, cache, sc2, x, lens[i], add, &ids);
        int b = kvr_tok_encode(t, sc, x, lens[i], add, &pl);
        if (a != b || (a > 0 && memcmp(ids, pl, (size_t)a * sizeof *ids)))
            abort();
    }
    free(x);
    return 0;
}
