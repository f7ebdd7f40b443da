/* fuzz_tok_common.h — small tokenizer.json files built in code for the tok fuzz targets (no
 * file needed, so every build replays them): a byte-level BPE with a Qwen-style Split regex,
 * NFC, added tokens with every flag and a template; a SentencePiece-style BPE with Prepend/
 * Replace normalizers, byte_fallback, unk with fuse_unk and String splits. */
#ifndef FUZZ_TOK_COMMON_H
#define FUZZ_TOK_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2 bytes_to_unicode: the UTF-8 spelling of byte b, into out (at least 3 bytes). */
static size_t ft_bl_char(int b, char *out)
{
    int cp;
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        cp = b;
    else {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
                k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* JSON-escapes s into out (large enough). */
static size_t ft_esc(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            out[o++] = '\\', out[o++] = (char)c;
        else if (c < 0x20)
            o += (size_t)sprintf(out + o, "\\u%04x", c);
        else
            out[o++] = (char)c;
    }
    return o;
}

static const char *ft_merges[][2] = {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"},
                                     {" ", " "}, {"  ", "  "}, {"1", "2"}, {"12", "3"},
                                     {"e", "r"}, {" ", "a"}, {"\n", "\n"}, {"o", "n"}};

/* The byte-level tokenizer.json (malloc'ed). */
static char *ft_bytelevel_json(void)
{
    size_t cap = 1 << 16, n = 0;
    char *j = malloc(cap), k[64], e[128];
    n += (size_t)sprintf(j + n,
                         "{\"added_tokens\":["
                         "{\"id\":300,\"content\":\"<|im_start|>\",\"special\":true},"
                         "{\"id\":301,\"content\":\"<|im_end|>\",\"special\":true,\"lstrip\":true,"
                         "\"rstrip\":true},"
                         "{\"id\":302,\"content\":\"tool\",\"single_word\":true},"
                         "{\"id\":303,\"content\":\"\\u00e9t\\u00e9\",\"normalized\":true}],"
                         "\"normalizer\":{\"type\":\"NFC\"},"
                         "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                         "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re)|"
                         "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}"
                         "\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                         "\"behavior\":\"Isolated\",\"invert\":false},"
                         "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                         "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
                         "{\"SpecialToken\":{\"id\":\"<|im_start|>\"}},{\"Sequence\":{\"id\":\"A\"}},"
                         "{\"SpecialToken\":{\"id\":\"<|im_end|>\"}}],\"special_tokens\":{"
                         "\"<|im_start|>\":{\"ids\":[300]},\"<|im_end|>\":{\"ids\":[301]}}},"
                         "\"model\":{\"type\":\"BPE\",\"ignore_merges\":false,\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        size_t kl = ft_bl_char(b, k);
        size_t el = ft_esc(k, kl, e);
        n += (size_t)sprintf(j + n, "%s\"%.*s\":%d", b ? "," : "", (int)el, e, b);
    }
    int id = 256;
    size_t nm = sizeof ft_merges / sizeof *ft_merges;
    for (size_t m = 0; m < nm; m++) {
        size_t kl = 0;
        for (int s = 0; s < 2; s++)
            for (const char *p = ft_merges[m][s]; *p; p++)
                kl += ft_bl_char((unsigned char)*p, k + kl);
        size_t el = ft_esc(k, kl, e);
        n += (size_t)sprintf(j + n, ",\"%.*s\":%d", (int)el, e, id++);
    }
    n += (size_t)sprintf(j + n, "},\"merges\":[");
    for (size_t m = 0; m < nm; m++) {
        n += (size_t)sprintf(j + n, "%s[", m ? "," : "");
        for (int s = 0; s < 2; s++) {
            size_t kl = 0;
            for (const char *p = ft_merges[m][s]; *p; p++)
                kl += ft_bl_char((unsigned char)*p, k + kl);
            size_t el = ft_esc(k, kl, e);
            n += (size_t)sprintf(j + n, "%s\"%.*s\"", s ? "," : "", (int)el, e);
        }
        n += (size_t)sprintf(j + n, "]");
    }
    sprintf(j + n, "]}}");
    return j;
}

/* The SentencePiece-style tokenizer.json (static). */
static const char ft_sp_json[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
    "\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
    "\"content\":\"\\u2581\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
    "{\"type\":\"Split\",\"pattern\":{\"String\":\"\\u2581\"},\"behavior\":\"MergedWithNext\"},"
    "{\"type\":\"Split\",\"pattern\":{\"String\":\".\"},\"behavior\":\"MergedWithPrevious\"},"
    "{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},\"behavior\":\"Removed\"}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
    "{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[1]}}},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"<0x41>\":2,\"<0xE4>\":3,\"<0xB8>\":4,\"<0xAD>\":5,"
    "\"\\u2581\":6,\"a\":7,\"b\":8,\"\\u2581a\":9,\"ab\":10,\"\\u2581ab\":11,\".\":12,\"c\":13},"
    "\"merges\":[\"\\u2581 a\",\"a b\",\"\\u2581a b\"]}}";

#endif
