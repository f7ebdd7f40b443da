/* decode.h — vLLM KV-event wire format → plain event structs. Pure functions of bytes:
 * no sockets, no index, no globals. See ../shared/specs/vllm-kv-events.md.
 *
 * Batches: a decoder (one per writer thread; owns a reusable msgpack zone and scratch
 * arrays, so decoding makes no per-token allocation once warm) opens a batch with
 * kvr_decode_batch(), then kvr_decode_next() yields events one by one. A malformed or
 * unknown event is reported as a skip with a reason, and decoding continues with the next
 * event: the rest of the batch is still applied.
 *
 * Threads: a struct kvr_decoder belongs to one thread. Event pointers borrow from the
 * decoder and the input buffer; valid until the next kvr_decode_batch() on that decoder.
 */
#ifndef KVR_DECODE_H
#define KVR_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvr_decoder;

/* A limit of 0 means its default (65536 events, 1048576 tokens, 65536 hashes, depth 16);
 * max_depth is capped at 32 (msgpack-c's parser stack). An event that would need more than
 * sizeof(msgpack_object) * (max_tokens + max_hashes) + 1 MiB of unpacked objects (say a huge
 * extra_keys) is skipped as too_large without being unpacked. lim may be NULL (defaults). */
struct kvr_decode_limits {
    uint32_t max_events;   /* events per batch; more → the batch is rejected */
    uint32_t max_tokens;   /* token ids per event; more → event skipped */
    uint32_t max_hashes;   /* block hashes per event; more → event skipped */
    uint32_t max_depth;    /* msgpack nesting accepted */
    bool reference;        /* false (normal): the bulk arrays (block_hashes, token_ids) are
                            * read straight from the validated bytes; true: through msgpack-c
                            * objects like every other field (slower; tests compare the two
                            * paths, which must agree on every input) */
};

int kvr_decode_create(const struct kvr_decode_limits *lim, struct kvr_decoder **out);
void kvr_decode_destroy(struct kvr_decoder *d);

/* ---- batches --------------------------------------------------------------------------- */

struct kvr_batch {
    double ts;          /* engine wall clock, seconds (int ts accepted) */
    bool has_dp_rank;   /* false for v0.9.0 two-element batches or nil */
    uint32_t dp_rank;
    uint32_t nevents;   /* events array length (including ones that will be skipped) */
    /* A 4th element that is a bin or str of 1..KVR_DECODE_PUBID_MAX bytes: the publisher id
     * of the engine run (forward compatibility with vLLM's state-snapshot publishers; today's
     * PR #57789 sends it after the seq instead, see zsub.h). Borrowed from the input buffer;
     * NULL/0 when absent or of any other type (extra elements never reject a batch). */
    const uint8_t *pub_id;
    uint32_t pub_id_len;
};
#define KVR_DECODE_PUBID_MAX 64

/* Opens a batch: [ts, events, dp_rank?, publisher id?, ...extras ignored]. Returns 0, or -EBADMSG when the
 * outer structure is unusable (not an array of >= 2, ts not a number, events not an array,
 * too many events, trailing garbage, nesting too deep). */
int kvr_decode_batch(struct kvr_decoder *d, const void *buf, size_t len, struct kvr_batch *out);

enum kvr_event_type {
    KVR_EV_STORED = 1,
    KVR_EV_REMOVED = 2,
    KVR_EV_CLEARED = 3,
};

/* Why an event was skipped (counted per reason by ingest). */
enum kvr_skip_reason {
    KVR_SKIP_NONE = 0,
    KVR_SKIP_NOT_EVENT,      /* neither array nor map */
    KVR_SKIP_NO_TAG,         /* missing or non-string type tag */
    KVR_SKIP_UNKNOWN_TAG,    /* tag not BlockStored/BlockRemoved/AllBlocksCleared */
    KVR_SKIP_BAD_HASH,       /* a hash that is neither int nor bin (or empty bin) */
    KVR_SKIP_BAD_FIELD,      /* a field of the wrong msgpack type */
    KVR_SKIP_BAD_TOKENS,     /* token id not an int in [0, 2^32) */
    KVR_SKIP_TOKEN_COUNT,    /* token count != hashes * block_size */
    KVR_SKIP_TOO_LARGE,      /* over max_tokens / max_hashes */
    KVR_SKIP_GROUP,          /* BlockStored of a group that is not full attention (hybrid
                              * models): filtered; ev->type and ev->group_idx are set */
    KVR_SKIP_BIGRAM,         /* SGLang EAGLE token pairs [t, t+1]: the engine matches a block
                              * only with the token after it, which a per-block index cannot
                              * check (docs/wire-extra-keys.md) */
    KVR_SKIP_REASON_COUNT
};
const char *kvr_decode_skip_reason_name(enum kvr_skip_reason r); /* "unknown_tag", ... */

/* One item of a block's extra keys (vLLM extra_keys, v0.17+), as the engine hashed it. */
enum kvr_xkey_kind {
    KVR_XK_STR = 1,  /* a string: cache_salt (block 0), or a pre-v0.19 bare media id */
    KVR_XK_MEDIA,    /* [identifier, offset]: s/len the id, i the offset in the block */
    KVR_XK_BYTES,    /* bin: prompt-embeddings digest */
    KVR_XK_INT,      /* an int (i) */
    KVR_XK_OTHER,    /* any other shape (never matched by a query) */
};
struct kvr_xkey {
    enum kvr_xkey_kind kind;
    const char *s;   /* STR, MEDIA, BYTES: borrowed bytes */
    uint32_t len;
    int64_t i;       /* MEDIA offset, INT value */
};

/* One decoded event. Strings are borrowed, not NUL-terminated; NULL means nil/absent. */
struct kvr_event {
    enum kvr_event_type type;
    const uint64_t *hashes; /* block_hashes projected to u64 (int: two's complement; bin:
                             * last 8 bytes big-endian, left-padded) */
    size_t nhashes;
    bool has_parent;
    uint64_t parent;
    const uint32_t *tokens; /* token_ids (BlockStored) */
    size_t ntokens;
    uint32_t block_size;    /* 0 when absent */
    const char *medium;     /* NULL → gpu */
    size_t medium_len;
    const char *lora_name;  /* NULL when nil/absent */
    size_t lora_name_len;
    bool has_lora_id;       /* legacy lora_id (int) when lora_name is absent */
    int64_t lora_id;
    int32_t group_idx;      /* 0 when absent. BlockRemoved is yielded for every group: the
                             * consumer filters it with the kinds learned from BlockStored */
    /* BlockStored extra keys without the LoRA name (the namespace carries it): block i's
     * items are xkeys[xk_first[i] .. xk_first[i + 1]); NULL when no block has any. Valid
     * until the next kvr_decode_next() (not the next batch). */
    const struct kvr_xkey *xkeys;
    const uint32_t *xk_first; /* nhashes + 1 entries */
    /* BlockStored event-level cache_salt (SGLang: `metadata` {cache_salt}, map key
     * cache_salt, or an extra key "dynamo-cache-salt:<salt>", prefix removed): it keys the
     * request's first block, so it applies to blocks[0] when there is no parent. */
    const char *salt;
    size_t salt_len;
    bool remote;            /* locality "REMOTE" (case-insensitive); other values: local */
    /* BlockRemoved remaining_copy_counts (nhashes entries) or NULL; valid until the next
     * kvr_decode_next(). */
    const uint32_t *remaining;
};

/* Next event of the open batch: returns 1 with *ev filled, 0 at the end of the batch, or 2
 * when the event was skipped (*reason set; *ev partially filled: type may be set).
 * A BlockStored returned with block_size != 0 always has ntokens == nhashes * block_size
 * (tokens [i*block_size, (i+1)*block_size) belong to hashes[i]); block_size == 0 means the
 * field was absent (tokens unchecked) or 0 (then no tokens). Semantics of every field and
 * the group filter are described at the top of decode.c. */
int kvr_decode_next(struct kvr_decoder *d, struct kvr_event *ev, enum kvr_skip_reason *reason);

/* ---- token-id runs ------------------------------------------------------------------- */

/* Shared with the HTTP layer's msgpack request bodies (ARCHITECTURE.md: only decode touches
 * msgpack). Decodes up to n consecutive msgpack elements at *p that are positive fixint or
 * uint 8/16/32 into out[0..n) (out must have room for n), never reading at or past end, and
 * stops before the first element of any other kind or one that does not fit before end: the
 * caller takes that one its own way (rare widths, errors). Returns the count decoded; *p is
 * moved past them. Uses AVX-512 VBMI 64-byte windows when the CPU has them. Any thread. */
size_t kvr_decode_u32_run(const uint8_t **p, const uint8_t *end, uint32_t *out, size_t n);
/* Tests and benchmarks: 0 = scalar only, 1 = + AVX-512 VBMI windows (never above what the
 * CPU has); -1 = the best available (the default). Returns the level in effect. Not for
 * concurrent use. */
int kvr_decode_force_isa(int level);

#endif
