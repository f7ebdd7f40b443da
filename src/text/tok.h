/* tok.h — prompt text to token ids, exactly as Hugging Face `tokenizers` (and so vLLM) computes
 * them, from a model's own `tokenizer.json` (+ `tokenizer_config.json`).
 *
 * Why in C, in-process: a gateway holds prompt text, not token ids; the router must turn the
 * text into the ids the engine will compute, bit for bit, without a Python hop.
 *
 * Supported (anything else is refused at load with "JSON.PATH: what"; never mis-tokenized):
 * - model: BPE with merge ranks, `ignore_merges`, `byte_fallback`, `fuse_unk`, `unk_token`
 *   (no dropout, no continuing_subword_prefix/end_of_word_suffix);
 * - normalizer: null, NFC/NFD/NFKC/NFKD (utf8proc), Prepend, Replace (String pattern),
 *   Sequence;
 * - pre_tokenizer: null, Split (Regex run by PCRE2 with UTF+UCP+JIT, or String; behaviours
 *   Isolated, Removed, MergedWithPrevious, MergedWithNext; not inverted), ByteLevel
 *   (add_prefix_space false; use_regex runs GPT-2's pattern), Sequence;
 * - added tokens: matched in the raw text before normalization (normalized=false) or in each
 *   normalized segment (normalized=true), leftmost-longest, honouring single_word, lstrip,
 *   rstrip;
 * - post_processor: null, ByteLevel (no effect on ids), TemplateProcessing (single), Sequence;
 *   and tokenizer_config.json's add_bos_token/add_eos_token for the classes whose fast
 *   tokenizer rebuilds the post-processor from them (LlamaTokenizer[Fast],
 *   GemmaTokenizer[Fast]), as transformers does.
 *
 * Threads: a loaded kvr_tok is immutable; any number of threads encode with it at once, each
 * with its own kvr_tok_scratch (per-call buffers, PCRE2 match data and JIT stack, a word
 * cache). No allocation per token: buffers grow per call and are kept in the scratch.
 */
#ifndef KVR_TOK_H
#define KVR_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_tok kvr_tok;
typedef struct kvr_tok_scratch kvr_tok_scratch;

/* Loads PATH: a tokenizer.json file, or a directory holding tokenizer.json (and, when present,
 * tokenizer_config.json). On error returns -errno (-ENOENT, -ENOMEM, -EINVAL for a bad or
 * unsupported file, -ENOTSUP for an unsupported component) and writes "FILE: JSON.PATH: what"
 * into err (errlen bytes, NUL-terminated) when err is not NULL. */
int kvr_tok_load(const char *path, kvr_tok **out, char *err, size_t errlen);

/* The same from memory: json (tokenizer.json, len bytes) and config (tokenizer_config.json,
 * config_len bytes; NULL when absent). Neither needs a NUL terminator. */
int kvr_tok_load_mem(const char *json, size_t len, const char *config, size_t config_len,
                     kvr_tok **out, char *err, size_t errlen);

void kvr_tok_free(kvr_tok *t);

/* Number of ids in the vocabulary (model vocab and added tokens): every id encode returns is
 * below this. */
uint32_t kvr_tok_vocab_size(const kvr_tok *t);

/* The bytes of token id (raw bytes for byte-level vocabularies, not GPT-2's "Ġ" spelling;
 * the content of an added token), *len set; NULL for an id with no token. For tests and
 * diagnostics (no decoder rules: no byte-fallback fusing, no "▁" to space). */
const char *kvr_tok_token(const kvr_tok *t, uint32_t id, size_t *len);

kvr_tok_scratch *kvr_tok_scratch_new(void);
void kvr_tok_scratch_free(kvr_tok_scratch *s);

/* A scratch keeps a word cache (BPE results of short pre-tokens, per tokenizer load, exact);
 * this empties it (benchmarks of cold text, tests). */
void kvr_tok_scratch_clear_cache(kvr_tok_scratch *s);

/* The token limit ([http] max_query_tokens): encodes with this scratch stop with -EMSGSIZE as
 * soon as the text is known to make more than max_ids ids (0 = no limit, the default), and
 * only then: a text of at most max_ids ids always encodes in full. Known when an id past
 * the limit would be appended; before a segment's BPE when its pre-tokens alone must make
 * too many (at least ceil(bytes / longest token) each, for tokenizers where that is sound);
 * before anything when the raw text is too long for max_ids tokens of the longest length,
 * where that is sound (tok_load.c: token_bounds says which tokenizers qualify and why). */
void kvr_tok_scratch_set_limit(kvr_tok_scratch *s, size_t max_ids);
/* True when len bytes of raw text certainly make more than the scratch's limit of ids
 * (never for tokenizers without a sound bound): encodes refuse such a text at once. */
bool kvr_tok_over_limit(const kvr_tok *t, const kvr_tok_scratch *s, size_t len);
/* Bytes of pre-tokens this scratch has run through BPE so far (cumulative; word-cache hits
 * included): how much text was actually tokenized (the limit's test and metric). */
uint64_t kvr_tok_scratch_bpe_bytes(const kvr_tok_scratch *s);

/* Encodes text (len bytes of UTF-8) into *ids (a buffer owned by s, valid until its next use);
 * add_special as HF's add_special_tokens (post-processor template, BOS/EOS). Returns the number
 * of ids, or -EILSEQ for invalid UTF-8, -ENOMEM, -EOVERFLOW (more than INT32_MAX ids),
 * -EMSGSIZE (more than the scratch's limit). */
int kvr_tok_encode(const kvr_tok *t, kvr_tok_scratch *s, const char *text, size_t len,
                   bool add_special, const uint32_t **ids);

/* Tests and benchmarks: true runs BPE over every pre-token whole, as HF does, instead of
 * cutting long ones where no merge can reach across (same ids, faster; tok.c says why).
 * Not for concurrent use with encodes. */
void kvr_tok_force_whole_words(bool on);

/* ---- the prefix cache (tok_cache.c) -------------------------------------------------------
 * Token ids of earlier texts at checkpoints proven resumable, shared by every thread and
 * every tokenizer (keyed by the load generation), LRU-bounded in bytes. Exact: the result
 * equals kvr_tok_encode's for every text (the cached text is compared byte for byte). */
typedef struct kvr_tok_cache kvr_tok_cache;

struct kvr_tok_cache_stats {
    uint64_t hits, misses, inserts, evictions;
    uint64_t bytes, entries;
    uint64_t saved_bytes; /* text bytes not tokenized again thanks to hits */
};

int kvr_tok_cache_new(size_t max_bytes, kvr_tok_cache **out); /* 0 or -ENOMEM */
void kvr_tok_cache_free(kvr_tok_cache *c);
void kvr_tok_cache_stats(kvr_tok_cache *c, struct kvr_tok_cache_stats *st);

/* kvr_tok_encode through the cache c (NULL: plain kvr_tok_encode): a text whose beginning
 * is cached is encoded from the longest cached checkpoint; texts of at least two blocks
 * (512 bytes) are added, unless they resumed and brought less than 2 KB of new text. Same results and errors as kvr_tok_encode. */
int kvr_tok_encode_cached(const kvr_tok *t, kvr_tok_cache *c, kvr_tok_scratch *s,
                          const char *text, size_t len, bool add_special, const uint32_t **ids);

#endif
