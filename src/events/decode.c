/* decode.c — vLLM KV-event wire format → plain event structs (see decode.h and
 * ../shared/specs/vllm-kv-events.md §2, §6).
 *
 * Files: decode.c (lifecycle, batches, events through msgpack-c) and decode_scan.c (prescan(),
 * that is kvr_decode_prescan(), and the bulk-array decoders it runs), sharing decode_int.h.
 *
 * Design
 * - kvr_decode_batch() runs prescan(): a bounds-checked cursor walk over the raw msgpack
 *   bytes of the whole batch, before anything is allocated for it. It rejects truncation,
 *   trailing bytes, the reserved byte 0xc1, nesting deeper than max_depth, an events array
 *   longer than max_events, and any declared length that exceeds the bytes left (a container
 *   of n items needs >= n more bytes, a map >= 2n). Every declared item is therefore proven
 *   to exist, so a 6-byte input declaring a 4-billion-item array is rejected here, before
 *   msgpack-c (whose parser allocates by declared length) ever sees it. The walk also
 *   records, per event: its byte span and exactly how much memory msgpack-c will take from
 *   its zone to unpack it (sizeof(msgpack_object) per array item, sizeof(msgpack_object_kv)
 *   per map pair; strings, bins and exts are referenced in place, not copied); and, for the
 *   batch, upper bounds of the hashes and token ids to be decoded (arrays at the
 *   block_hashes / token_ids positions of array events or under those keys in map events).
 * - Bulk arrays (the arrays at the block_hashes / token_ids positions: [1] and [3] of an
 *   array event, under those keys in a map event) are decoded by that same walk, straight
 *   from the bytes: token ids through kvr_decode_u32_run() (AVX-512 VBMI windows or a
 *   scalar loop; rare widths one by one), hashes by a scalar loop, into the scratch arrays,
 *   each array recorded as a "carve" (byte span, count, scratch offset, whether every item
 *   was valid). An item that is not a valid hash / token id stops the decoding; the walk
 *   goes on through the rest of the array as through any value, and the event is skipped as
 *   bad_hash / bad_tokens if it gets that far. msgpack-c turned every token id into a
 *   16-byte object first (13.7 ns a token; the whole decoder ran at 4.5M blocks/s).
 * - The outer scalars (ts, dp_rank) are unpacked from their spans; the events array itself
 *   is never materialised. kvr_decode_next() unpacks one event at a time with
 *   msgpack_unpack() into the decoder's zone, cleared per event. An event with carves is
 *   first copied into d->cbuf with each carved array replaced by a 3-byte placeholder (bin 8
 *   of one byte): msgpack-c parses the event's structure and small fields as always, and a
 *   placeholder is recognised by its address in the copy (a peer's own bin at that field
 *   lands elsewhere and stays a bin, refused as before). Strings found in the copy are
 *   mapped back into the batch bytes, so events borrow from the input buffer as before. So
 *   the zone holds one event, not the batch: its size is bounded by the limits (an event
 *   that would need more than sizeof(msgpack_object) * (max_tokens + max_hashes) + 1 MiB
 *   unpacked in full is skipped as too_large without being unpacked: the full cost is still
 *   what that test uses) instead of by the message size, and it stays cache-resident.
 *   (msgpack_unpack_next() is not used: in msgpack-c 4.0 it frees the zone of its
 *   msgpack_unpacked and creates a fresh default-size one on every call — checked by
 *   counting mallocs. msgpack_unpack() is marked "obsolete" in unpack.h but is exported,
 *   stable, and takes the caller's zone.)
 * - limits.reference turns carving off: every field, bulk arrays included, goes through
 *   msgpack-c objects as in the first version. test_decode (fixtures, odd shapes, 60k
 *   mutations) and fuzz_decode run both decoders side by side and require the same events,
 *   skips, reasons and fields.
 * - Scratch arrays (hashes u64, tokens u32) grow during the walk (offsets, not pointers,
 *   are recorded) and are sized from the prescan bounds, so every event handed out keeps
 *   valid pointers until the next kvr_decode_batch(), as decode.h promises, and
 *   kvr_decode_next() never reallocates them.
 * - Memory: the zone, the scratch arrays and the per-event span table are grow-only, so a
 *   warm decoder makes no heap allocation per batch (test_decode checks it by counting
 *   mallocs). The zone and the scratch arrays shrink back when they grew past a few MiB for
 *   an unusual batch and the current one is much smaller.
 * - Events: both eras. A tagged array (v0.9–v0.23; positions are a prefix-growing layout,
 *   see locate_array()) or a tagged map (v0.24+; any key order, omitted defaults, unknown
 *   keys ignored), both possibly in one batch. Any problem skips just that event with a
 *   reason.
 *
 * Decisions (documented here because the spec leaves them open)
 * - nil is treated like an absent field everywhere.
 * - block_hashes is required for BlockStored/BlockRemoved: missing, nil or not an array →
 *   KVR_SKIP_BAD_FIELD. An empty array is passed through (nhashes 0).
 * - token_ids nil/absent → 0 tokens. When block_size is present (even 0), the event is only
 *   yielded if ntokens == nhashes * block_size, otherwise KVR_SKIP_TOKEN_COUNT. So for every
 *   yielded BlockStored with block_size != 0, tokens cover exactly nhashes whole blocks.
 *   (Pre-v0.20 offload placeholders — tokens [] with a nonzero block_size — are therefore
 *   skipped as token_count; they carry nothing a token-hash index could use.)
 * - EAGLE (t, t+1) token pairs (SGLang with EAGLE): every item a pair of ints →
 *   KVR_SKIP_BIGRAM (the engine needs the token after each page to match it, which a per-block
 *   index cannot check: docs/wire-extra-keys.md); any other non-int token → bad_tokens.
 * - Extra keys (docs/wire-extra-keys.md): extra_keys must be nil or an array; its entries are
 *   nil, an array of keys, or one key. A leading string equal to lora_name is dropped (the
 *   namespace carries it); a string "dynamo-cache-salt:<s>" (SGLang) becomes the event's salt,
 *   as do the metadata map's cache_salt (array [7] or [14]) and a map event's cache_salt key
 *   (two different salts → bad_field). Keys left but entries not one per hash → bad_field.
 *   xkeys/xk_first and remaining use per-event scratch: valid until the next event.
 * - locality "REMOTE" (any case) sets ev->remote; any other value or type is local.
 *   remaining_copy_counts (BlockRemoved): one non-negative int < 2^32 per hash, else bad_field.
 * - Group filter (hybrid models) for BlockStored: kv_cache_spec_kind present → indexed only
 *   for full_attention / mla_attention / sink_full_attention (case-insensitive); absent →
 *   indexed only if group_idx is absent or 0. Filtered events → KVR_SKIP_GROUP, with type and
 *   group_idx filled so the consumer can learn which groups are not indexed. The filter runs
 *   after the field type checks and before the hash/token conversion. BlockRemoved carries
 *   no kind: it is always yielded with its group_idx, and the consumer (ingest) decides from
 *   the kinds it learned from that engine's BlockStored events. A stateless rule here would
 *   either drop the removals of a full-attention group that is not group 0 (stale entries)
 *   or apply a sliding-window group's removals to the full-attention group's blocks, which
 *   carry the same hashes when block sizes match.
 * - Types we expose are checked strictly (block_size: int in [0, 2^32); lora_id: int64;
 *   medium, lora_name, kind, cache_salt: str; group_idx: int in [0, 2^31)) →
 *   KVR_SKIP_BAD_FIELD. Fields we do not expose (kv_cache_spec_sliding_window, ownership,
 *   session_id, ...) are ignored whatever their type.
 * - has_lora_id is set only when lora_name is absent and lora_id is an int.
 * - ts: float32/float64 or any int. dp_rank: nil or an int in [0, 2^32); anything else
 *   rejects the batch (the stream key depends on it).
 * - Limits of 0 mean the defaults below; max_depth is clamped to 32, msgpack-c's own parser
 *   stack (MSGPACK_EMBED_STACK_SIZE).
 *
 * Threads: a decoder belongs to one thread; the frame helpers are pure.
 */
#include "events/decode.h"
#include "events/decode_int.h"
#include "core/log.h"

#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEF_MAX_EVENTS 65536u
#define DEF_MAX_TOKENS 1048576u
#define DEF_MAX_HASHES 65536u
#define DEF_MAX_DEPTH 16u
#define ZONE_MIN_CHUNK ((size_t)64 * 1024)
#define ZONE_KEEP ((size_t)4 << 20)       /* a bigger zone shrinks back when unused */
#define SCRATCH_KEEP ((size_t)1 << 20)    /* entries, per scratch array, likewise */
#define EV_ZONE_SLACK ((size_t)1 << 20)   /* per-event zone allowance beyond tokens+hashes */
#define XK_KEEP ((size_t)1 << 16)         /* extra-key / count scratch entries kept between
                                           * batches; a bigger one (an unusual event) is freed */

/* Our own invariant broke (not the peer's bytes: those are validated before this can be
 * reached). Assertions stay on in release builds (house style). */
static _Noreturn void decode_bug(const char *what, uint32_t event)
{
    kvr_log_error("decode: internal error: %s (event %u)", what, event);
    abort();
}

/* ---- small helpers ------------------------------------------------------------------- */

/* nil counts as absent */
static inline const msgpack_object *opt(const msgpack_object *o)
{
    return (o == NULL || o->type == MSGPACK_OBJECT_NIL) ? NULL : o;
}

static inline bool str_eq(const msgpack_object_str *s, const char *lit, size_t n)
{
    return s->size == n && memcmp(s->ptr, lit, n) == 0;
}
#define STR_EQ(s, lit) str_eq((s), (lit), sizeof(lit) - 1)

/* ---- decoder lifecycle --------------------------------------------------------------- */

int kvr_decode_create(const struct kvr_decode_limits *lim, struct kvr_decoder **out)
{
    struct kvr_decoder *d;

    if (out == NULL)
        return -EINVAL;
    d = calloc(1, sizeof(*d));
    if (d == NULL)
        return -ENOMEM;
    if (lim != NULL)
        d->lim = *lim;
    if (d->lim.max_events == 0)
        d->lim.max_events = DEF_MAX_EVENTS;
    if (d->lim.max_tokens == 0)
        d->lim.max_tokens = DEF_MAX_TOKENS;
    if (d->lim.max_hashes == 0)
        d->lim.max_hashes = DEF_MAX_HASHES;
    if (d->lim.max_depth == 0)
        d->lim.max_depth = DEF_MAX_DEPTH;
    if (d->lim.max_depth > HARD_MAX_DEPTH)
        d->lim.max_depth = HARD_MAX_DEPTH;

    for (int b = 0; b < 256; b++) {
        static const uint8_t w_cx[32] = {
            /* c0 */ 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 5, 9, 2, 3, 5, 9,
            /* d0 */ 2, 3, 5, 9, 3, 4, 6, 10, 18, 0, 0, 0, 0, 0, 0, 0,
        };
        d->scalar_width[b] = (b <= 0x7f || b >= 0xe0) ? 1 : (b >= 0xc0) ? w_cx[b - 0xc0] : 0;
        d->skip_width[b] = (b >= 0xa0 && b <= 0xbf) ? (uint8_t)(1 + (b & 0x1f)) : d->scalar_width[b];
    }
    d->ev_zone_max = sizeof(msgpack_object) * ((size_t)d->lim.max_tokens + d->lim.max_hashes) +
                     EV_ZONE_SLACK;
    d->zone_chunk = ZONE_MIN_CHUNK;
    d->zone = msgpack_zone_new(d->zone_chunk);
    if (d->zone == NULL)
        goto fail_zone;
    /* Never NULL afterwards (pointer arithmetic on them is then always defined). */
    d->hcap = 1024;
    d->hashes = malloc(d->hcap * sizeof(*d->hashes));
    if (d->hashes == NULL)
        goto fail_hashes;
    d->tcap = 4096;
    d->tokens = malloc(d->tcap * sizeof(*d->tokens));
    if (d->tokens == NULL)
        goto fail_tokens;
    *out = d;
    return 0;

fail_tokens:
    free(d->hashes);
fail_hashes:
    msgpack_zone_free(d->zone);
fail_zone:
    free(d);
    return -ENOMEM;
}

void kvr_decode_destroy(struct kvr_decoder *d)
{
    if (d == NULL)
        return;
    msgpack_zone_free(d->zone);
    free(d->spans);
    free(d->carves);
    free(d->cbuf);
    free(d->hashes);
    free(d->tokens);
    free(d->xk);
    free(d->xkf);
    free(d->rem);
    free(d);
}

/* ---- event field location (shared by the sizing pass and kvr_decode_next) ------------ */

struct fields {
    enum kvr_event_type type;
    const msgpack_object *hashes, *parent, *tokens, *block_size, *lora_id, *medium,
        *lora_name, *group_idx, *kind, *extra, *meta, *salt, *locality, *remaining;
};

static enum kvr_event_type tag_type(const msgpack_object_str *s)
{
    if (STR_EQ(s, "BlockStored"))
        return KVR_EV_STORED;
    if (STR_EQ(s, "BlockRemoved"))
        return KVR_EV_REMOVED;
    if (STR_EQ(s, "AllBlocksCleared"))
        return KVR_EV_CLEARED;
    return 0;
}

/* Positional layouts (the tag at [0]); each version only appended fields:
 *   BlockStored  [1] block_hashes [2] parent_block_hash [3] token_ids [4] block_size
 *                [5] lora_id (v0.9) [6] medium (v0.10.2) [7] lora_name (v0.14)
 *                [8] extra_keys (v0.17) [9] group_idx (v0.20) [10] kv_cache_spec_kind
 *                [11] kv_cache_spec_sliding_window (v0.22)
 *   BlockRemoved [1] block_hashes [2] medium (v0.10.2) [3] group_idx (v0.20)
 *   AllBlocksCleared: no fields.
 * SGLang writes the same layout: 7 elements up to medium (no lora_name); older versions put
 * a `metadata` map {cache_salt} at [7] (BlockStoredWithMetadata), recent ones write the full
 * vLLM layout plus [12] locality [13] ownership (BlockRemoved: [6] locality [7] ownership)
 * and the metadata map at [14]. A map at [7] or [14] is read as that metadata. */
static void locate_array(const msgpack_object_array *a, struct fields *f)
{
#define AT(i) ((i) < a->size ? opt(&a->ptr[i]) : NULL)
    if (f->type == KVR_EV_STORED) {
        f->hashes = AT(1);
        f->parent = AT(2);
        f->tokens = AT(3);
        f->block_size = AT(4);
        f->lora_id = AT(5);
        f->medium = AT(6);
        f->lora_name = AT(7);
        if (f->lora_name && f->lora_name->type == MSGPACK_OBJECT_MAP) {
            f->meta = f->lora_name;
            f->lora_name = NULL;
        }
        f->extra = AT(8);
        f->group_idx = AT(9);
        f->kind = AT(10);
        f->locality = AT(12);
        if (AT(14) && AT(14)->type == MSGPACK_OBJECT_MAP)
            f->meta = AT(14);
    } else if (f->type == KVR_EV_REMOVED) {
        f->hashes = AT(1);
        f->medium = AT(2);
        f->group_idx = AT(3);
        f->locality = AT(6);
    }
#undef AT
}

static void locate_map_key(const msgpack_object_str *k, const msgpack_object *v,
                           struct fields *f)
{
    v = opt(v);
    switch (k->size) {
    case 6:
        if (STR_EQ(k, "medium"))
            f->medium = v;
        break;
    case 8:
        if (STR_EQ(k, "locality"))
            f->locality = v;
        else if (STR_EQ(k, "metadata"))
            f->meta = v;
        break;
    case 7:
        if (STR_EQ(k, "lora_id"))
            f->lora_id = v;
        break;
    case 9:
        if (STR_EQ(k, "token_ids"))
            f->tokens = v;
        else if (STR_EQ(k, "lora_name"))
            f->lora_name = v;
        else if (STR_EQ(k, "group_idx"))
            f->group_idx = v;
        break;
    case 10:
        if (STR_EQ(k, "block_size"))
            f->block_size = v;
        else if (STR_EQ(k, "extra_keys"))
            f->extra = v;
        else if (STR_EQ(k, "cache_salt"))
            f->salt = v;
        break;
    case 12:
        if (STR_EQ(k, "block_hashes"))
            f->hashes = v;
        break;
    case 17:
        if (STR_EQ(k, "parent_block_hash"))
            f->parent = v;
        break;
    case 18:
        if (STR_EQ(k, "kv_cache_spec_kind"))
            f->kind = v;
        break;
    case 21:
        if (STR_EQ(k, "remaining_copy_counts"))
            f->remaining = v;
        break;
    default:
        break;
    }
}

static enum kvr_skip_reason locate(const msgpack_object *o, struct fields *f)
{
    memset(f, 0, sizeof(*f));
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *a = &o->via.array;
        if (a->size == 0 || a->ptr[0].type != MSGPACK_OBJECT_STR)
            return KVR_SKIP_NO_TAG;
        f->type = tag_type(&a->ptr[0].via.str);
        if (f->type == 0)
            return KVR_SKIP_UNKNOWN_TAG;
        locate_array(a, f);
        return KVR_SKIP_NONE;
    }
    if (o->type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &o->via.map;
        const msgpack_object *tag = NULL;
        for (uint32_t i = 0; i < m->size; i++) {
            const msgpack_object_kv *kv = &m->ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR)
                continue;
            if (STR_EQ(&kv->key.via.str, "type"))
                tag = &kv->val;
            else
                locate_map_key(&kv->key.via.str, &kv->val, f);
        }
        if (tag == NULL || tag->type != MSGPACK_OBJECT_STR)
            return KVR_SKIP_NO_TAG;
        f->type = tag_type(&tag->via.str);
        if (f->type == 0)
            return KVR_SKIP_UNKNOWN_TAG;
        /* keep only the fields this event type has */
        if (f->type == KVR_EV_REMOVED) {
            struct fields r = {.type = KVR_EV_REMOVED, .hashes = f->hashes,
                               .medium = f->medium, .group_idx = f->group_idx,
                               .locality = f->locality, .remaining = f->remaining};
            *f = r;
        } else if (f->type == KVR_EV_CLEARED) {
            memset(f, 0, sizeof(*f));
            f->type = KVR_EV_CLEARED;
        }
        return KVR_SKIP_NONE;
    }
    return KVR_SKIP_NOT_EVENT;
}

/* ---- batch ----------------------------------------------------------------------------- */

static int size_zone(struct kvr_decoder *d, size_t need)
{
    size_t chunk = fit_cap(d->zone_chunk, need + 64, ZONE_MIN_CHUNK, ZONE_KEEP);
    msgpack_zone *z;

    if (chunk == d->zone_chunk)
        return 0;
    z = msgpack_zone_new(chunk);
    if (z == NULL)
        return need + 64 <= d->zone_chunk ? 0 : -ENOMEM; /* failed shrink: keep the old */
    msgpack_zone_free(d->zone);
    d->zone = z;
    d->zone_chunk = chunk;
    return 0;
}

static int size_scratch(struct kvr_decoder *d, size_t nh, size_t nt)
{
    size_t hc = fit_cap(d->hcap, nh, 1024, SCRATCH_KEEP);
    size_t tc = fit_cap(d->tcap, nt, 4096, SCRATCH_KEEP);

    if (hc != d->hcap) {
        uint64_t *p = realloc(d->hashes, hc * sizeof(*p));
        if (p != NULL) {
            d->hashes = p;
            d->hcap = hc;
        } else if (nh > d->hcap) {
            return -ENOMEM;
        }
    }
    if (tc != d->tcap) {
        uint32_t *p = realloc(d->tokens, tc * sizeof(*p));
        if (p != NULL) {
            d->tokens = p;
            d->tcap = tc;
        } else if (nt > d->tcap) {
            return -ENOMEM;
        }
    }
    return 0;
}

static int size_copy(struct kvr_decoder *d, size_t need)
{
    size_t cap = fit_cap(d->cbcap, need, 1024, (size_t)1 << 20);
    uint8_t *p;

    if (cap == d->cbcap)
        return 0;
    p = realloc(d->cbuf, cap);
    if (p == NULL)
        return need <= d->cbcap ? 0 : -ENOMEM;
    d->cbuf = p;
    d->cbcap = cap;
    return 0;
}

static bool is_container(uint8_t b)
{
    return (b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf);
}

/* Unpacks the top-level scalar spanning buf[start, end). */
static int unpack_scalar(struct kvr_decoder *d, const uint8_t *buf, size_t start, size_t end,
                         msgpack_object *o)
{
    size_t off = start;

    if (is_container(buf[start]))
        return -EBADMSG;
    msgpack_zone_clear(d->zone);
    if (msgpack_unpack((const char *)buf, end, &off, d->zone, o) != MSGPACK_UNPACK_SUCCESS ||
        off != end)
        return -EBADMSG;
    return 0;
}

/* The batch's 4th element as a publisher id (decode.h): bin 8 or str (fixstr, str 8) of
 * 1..KVR_DECODE_PUBID_MAX bytes; anything else is left alone. prescan proved the element
 * and its bytes lie within len. */
static void batch_pub_id(const uint8_t *p, size_t off, size_t len, struct kvr_batch *out)
{
    uint8_t b = p[off];
    size_t hl, n;

    if (b >= 0xa0 && b <= 0xbf) {
        hl = 1;
        n = b & 0x1f;
    } else if ((b == 0xc4 || b == 0xd9) && off + 2 <= len) {
        hl = 2;
        n = p[off + 1];
    } else {
        return;
    }
    if (n == 0 || n > KVR_DECODE_PUBID_MAX || off + hl + n > len)
        return;
    out->pub_id = p + off + hl;
    out->pub_id_len = (uint32_t)n;
}

int kvr_decode_batch(struct kvr_decoder *d, const void *buf, size_t len, struct kvr_batch *out)
{
    const uint8_t *p = buf;
    struct scan sc;
    msgpack_object o;
    int rc;

    if (d == NULL || out == NULL || (buf == NULL && len != 0))
        return -EINVAL;
    d->buf = NULL;
    d->nevents = d->next = 0;
    d->hlen = d->tlen = 0;
    if (d->xkcap > XK_KEEP || d->xkfcap > XK_KEEP || d->remcap > XK_KEEP) {
        free(d->xk);
        free(d->xkf);
        free(d->rem);
        d->xk = NULL;
        d->xkf = d->rem = NULL;
        d->xkcap = d->xkfcap = d->remcap = 0;
    }
    memset(out, 0, sizeof(*out));
    if (len == 0)
        return -EBADMSG;

    rc = kvr_decode_prescan(d, p, len, &sc);
    if (rc != 0)
        return rc;
    if (sc.ntop < 2 || !sc.events_array)
        return -EBADMSG;

    rc = unpack_scalar(d, p, sc.top_off[0], sc.top_off[1], &o);
    if (rc != 0)
        return rc;
    switch (o.type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        out->ts = o.via.f64;
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        out->ts = (double)o.via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        out->ts = (double)o.via.i64;
        break;
    default:
        return -EBADMSG;
    }
    if (sc.ntop >= 3) {
        rc = unpack_scalar(d, p, sc.top_off[2], sc.ntop >= 4 ? sc.top_off[3] : len, &o);
        if (rc != 0)
            return rc;
        if (o.type == MSGPACK_OBJECT_POSITIVE_INTEGER && o.via.u64 <= UINT32_MAX) {
            out->has_dp_rank = true;
            out->dp_rank = (uint32_t)o.via.u64;
        } else if (o.type != MSGPACK_OBJECT_NIL) {
            return -EBADMSG;
        }
    }
    if (sc.ntop >= 4)
        batch_pub_id(p, sc.top_off[3], len, out);

    rc = size_zone(d, sc.zone_max);
    if (rc != 0)
        return rc;
    rc = size_scratch(d, sc.hbound, sc.tbound);
    if (rc != 0)
        return rc;
    rc = size_copy(d, sc.copy_max);
    if (rc != 0)
        return rc;
    out->nevents = sc.nevents;
    d->buf = p;
    d->nevents = sc.nevents;
    return 0;
}

/* ---- kvr_decode_next ----------------------------------------------------------------- */

static bool hash_of(const msgpack_object *o, uint64_t *h)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *h = o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *h = (uint64_t)o->via.i64; /* two's complement */
        return true;
    case MSGPACK_OBJECT_BIN:
        if (o->via.bin.size == 0)
            return false;
        if (o->via.bin.size >= 8)
            *h = be_read((const uint8_t *)o->via.bin.ptr + o->via.bin.size - 8, 8);
        else
            *h = be_read((const uint8_t *)o->via.bin.ptr, o->via.bin.size);
        return true;
    default:
        return false;
    }
}

static bool kind_is_full(const msgpack_object_str *s)
{
    static const char *const ok[] = {"full_attention", "mla_attention", "sink_full_attention"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        size_t n = strlen(ok[i]);
        if (s->size == n && strncasecmp(s->ptr, ok[i], n) == 0)
            return true;
    }
    return false;
}

/* Type checks of the scalar fields, group filter. */
static enum kvr_skip_reason check_fields(const struct fields *f, bool hashes_array,
                                        struct kvr_event *ev)
{
    if (!hashes_array)
        return KVR_SKIP_BAD_FIELD;
    if (f->medium) {
        if (f->medium->type != MSGPACK_OBJECT_STR)
            return KVR_SKIP_BAD_FIELD;
        ev->medium = f->medium->via.str.ptr;
        ev->medium_len = f->medium->via.str.size;
    }
    if (f->group_idx) {
        if (f->group_idx->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
            f->group_idx->via.u64 > INT32_MAX)
            return KVR_SKIP_BAD_FIELD;
        ev->group_idx = (int32_t)f->group_idx->via.u64;
    }
    if (f->type == KVR_EV_STORED) {
        if (f->block_size) {
            if (f->block_size->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                f->block_size->via.u64 > UINT32_MAX)
                return KVR_SKIP_BAD_FIELD;
            ev->block_size = (uint32_t)f->block_size->via.u64;
        }
        if (f->lora_name) {
            if (f->lora_name->type != MSGPACK_OBJECT_STR)
                return KVR_SKIP_BAD_FIELD;
            ev->lora_name = f->lora_name->via.str.ptr;
            ev->lora_name_len = f->lora_name->via.str.size;
        }
        if (f->lora_id) {
            if (f->lora_id->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
                ev->lora_id = f->lora_id->via.i64;
            } else if (f->lora_id->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                       f->lora_id->via.u64 <= INT64_MAX) {
                ev->lora_id = (int64_t)f->lora_id->via.u64;
            } else {
                return KVR_SKIP_BAD_FIELD;
            }
            ev->has_lora_id = (f->lora_name == NULL);
            if (!ev->has_lora_id)
                ev->lora_id = 0;
        }
        if (f->kind && f->kind->type != MSGPACK_OBJECT_STR)
            return KVR_SKIP_BAD_FIELD;
        if (f->kind ? !kind_is_full(&f->kind->via.str) : ev->group_idx != 0)
            return KVR_SKIP_GROUP;
    }
    return KVR_SKIP_NONE;
}

/* ---- bulk arrays ----------------------------------------------------------------------- */

/* An array field: msgpack-c objects (reference path), or a carved array decoded by prescan. */
struct arr {
    uint32_t n;
    const msgpack_object *obj; /* reference path */
    const struct carve *c;     /* else */
};

/* The event being decoded: where its carved copy's placeholders stand. */
struct evctx {
    const struct carve *c;  /* the event's carves, in byte order */
    uint32_t nc;
    const uint8_t *copy;    /* the copy msgpack-c unpacked (NULL: the batch bytes) */
    size_t off;             /* the event's first byte in the batch */
};

/* o is an array field (or a placeholder for one): fills *a. */
static bool as_arr(const struct kvr_decoder *d, const struct evctx *cx, const msgpack_object *o,
                   struct arr *a)
{
    if (o == NULL)
        return false;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        /* Outside the reference path every array at a hash/token position was carved, so
         * none reaches here; were one to, it is refused (a skip, never a crash), and the
         * differential tests would see the paths disagree. */
        if (!d->lim.reference)
            return false;
        a->n = o->via.array.size;
        a->obj = o->via.array.ptr;
        a->c = NULL;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_BIN && cx->copy != NULL) {
        /* a placeholder is identified by its address in the copy: a bin of the peer's at
         * the same field was copied elsewhere and stays a bin */
        for (uint32_t k = 0; k < cx->nc; k++) {
            if ((const uint8_t *)o->via.bin.ptr == cx->c[k].marker) {
                a->n = cx->c[k].n;
                a->obj = NULL;
                a->c = &cx->c[k];
                return true;
            }
        }
    }
    return false;
}

/* A string msgpack-c found in the copy, mapped back into the batch bytes (events borrow
 * from the input buffer, which outlives the copy). */
static const char *orig_ptr(const struct evctx *cx, const struct kvr_decoder *d, const char *p)
{
    if (cx->copy == NULL || p == NULL)
        return p;
    size_t q = (size_t)((const uint8_t *)p - cx->copy), shift = 0;
    for (uint32_t k = 0; k < cx->nc; k++) {
        if (cx->c[k].marker > (const uint8_t *)p)
            break;
        shift += cx->c[k].end - cx->c[k].start - CARVE_MARK;
    }
    /* A carve shorter than its marker (an empty array) makes shift "negative": the sum is
     * taken in size_t, where wrapping is defined, and only its result (inside the batch) is
     * added to the pointer; d->buf + off + q + shift would wrap the pointer on the way. */
    return (const char *)(d->buf + (cx->off + q + shift));
}

/* The array's hashes: decoded by prescan, or (reference path) converted into the scratch
 * at d->hlen. NULL when one is not a hash. */
static const uint64_t *arr_hashes(struct kvr_decoder *d, const struct arr *a)
{
    if (a->c != NULL) {
        if (a->c->tok) /* cannot happen: hashes are only read at hash positions */
            return NULL;
        return a->c->ok ? d->hashes + a->c->off : NULL;
    }
    uint64_t *out = d->hashes + d->hlen;
    for (uint32_t i = 0; i < a->n; i++)
        if (!hash_of(&a->obj[i], &out[i]))
            return NULL;
    d->hlen += a->n;
    return out;
}

static const uint32_t *arr_tokens(struct kvr_decoder *d, const struct arr *a)
{
    if (a->c != NULL) {
        if (!a->c->tok)
            return NULL;
        return a->c->ok ? d->tokens + a->c->off : NULL;
    }
    uint32_t *out = d->tokens + d->tlen;
    for (uint32_t i = 0; i < a->n; i++) {
        const msgpack_object *t = &a->obj[i];
        if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
            return NULL;
        out[i] = (uint32_t)t->via.u64;
    }
    d->tlen += a->n;
    return out;
}

/* ---- extra keys, salts, locality, remaining counts ------------------------------------- */

#define SALT_PREFIX "dynamo-cache-salt:" /* SGLang's (and Dynamo's) salt extra key */

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t nc;
    void *q;

    if (need <= *cap)
        return true;
    nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    q = realloc(*p, nc * elem);
    if (q == NULL)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

/* The event-level salt: the first one found; another, different one → false. */
static bool set_salt(struct kvr_event *ev, const char *p, size_t n)
{
    if (ev->salt == NULL) {
        ev->salt = p;
        ev->salt_len = n;
        return true;
    }
    return ev->salt_len == n && memcmp(ev->salt, p, n) == 0;
}

static bool is_int64(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        *v = (int64_t)o->via.u64;
        return true;
    }
    return false;
}

static void xkey_of(const struct kvr_decoder *d, const struct evctx *cx, const msgpack_object *o,
                    struct kvr_xkey *k)
{
    memset(k, 0, sizeof(*k));
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        k->kind = KVR_XK_STR;
        k->s = orig_ptr(cx, d, o->via.str.ptr);
        k->len = o->via.str.size;
        return;
    case MSGPACK_OBJECT_BIN:
        k->kind = KVR_XK_BYTES;
        k->s = orig_ptr(cx, d, o->via.bin.ptr);
        k->len = o->via.bin.size;
        return;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        k->kind = is_int64(o, &k->i) ? KVR_XK_INT : KVR_XK_OTHER;
        return;
    case MSGPACK_OBJECT_ARRAY:
        if (o->via.array.size == 2 && o->via.array.ptr[0].type == MSGPACK_OBJECT_STR &&
            is_int64(&o->via.array.ptr[1], &k->i)) {
            k->kind = KVR_XK_MEDIA;
            k->s = orig_ptr(cx, d, o->via.array.ptr[0].via.str.ptr);
            k->len = o->via.array.ptr[0].via.str.size;
            return;
        }
        k->kind = KVR_XK_OTHER;
        return;
    default:
        k->kind = KVR_XK_OTHER;
        return;
    }
}

static bool is_salt_key(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size >= sizeof(SALT_PREFIX) - 1 &&
           memcmp(o->via.str.ptr, SALT_PREFIX, sizeof(SALT_PREFIX) - 1) == 0;
}

/* BlockStored: cache_salt (metadata map, map key), extra_keys. */
static enum kvr_skip_reason decode_extra(struct kvr_decoder *d, const struct evctx *cx,
                                         const struct fields *f, struct kvr_event *ev)
{
    const msgpack_object *salt = f->salt;
    size_t total = 0, nitems = 0, n = ev->nhashes;
    const msgpack_object_array *a;

    if (f->meta) {
        if (f->meta->type != MSGPACK_OBJECT_MAP)
            return KVR_SKIP_BAD_FIELD;
        for (uint32_t i = 0; i < f->meta->via.map.size; i++) {
            const msgpack_object_kv *kv = &f->meta->via.map.ptr[i];
            if (kv->key.type == MSGPACK_OBJECT_STR && STR_EQ(&kv->key.via.str, "cache_salt") &&
                kv->val.type != MSGPACK_OBJECT_NIL) {
                if (salt != NULL && salt->type == MSGPACK_OBJECT_STR &&
                    kv->val.type == MSGPACK_OBJECT_STR &&
                    !str_eq(&salt->via.str, kv->val.via.str.ptr, kv->val.via.str.size))
                    return KVR_SKIP_BAD_FIELD; /* two different salts */
                salt = &kv->val;
            }
        }
    }
    if (salt) {
        if (salt->type != MSGPACK_OBJECT_STR)
            return KVR_SKIP_BAD_FIELD;
        if (salt->via.str.size > 0)
            set_salt(ev, orig_ptr(cx, d, salt->via.str.ptr), salt->via.str.size);
    }
    if (!f->extra)
        return KVR_SKIP_NONE;
    if (f->extra->type != MSGPACK_OBJECT_ARRAY)
        return KVR_SKIP_BAD_FIELD;
    a = &f->extra->via.array;
    for (uint32_t e = 0; e < a->size; e++)
        total += a->ptr[e].type == MSGPACK_OBJECT_ARRAY ? a->ptr[e].via.array.size
                 : a->ptr[e].type == MSGPACK_OBJECT_NIL ? 0 : 1;
    if (total == 0) /* text-only: [nil, nil, ...] */
        return KVR_SKIP_NONE;
    if (!grow((void **)&d->xk, &d->xkcap, total ? total : 1, sizeof(*d->xk)) ||
        !grow((void **)&d->xkf, &d->xkfcap, n + 1, sizeof(*d->xkf)))
        return KVR_SKIP_TOO_LARGE;
    d->xkf[0] = 0;
    for (uint32_t e = 0; e < a->size; e++) {
        const msgpack_object *en = &a->ptr[e];
        const msgpack_object *items = en;
        uint32_t m = 1;
        if (en->type == MSGPACK_OBJECT_ARRAY) {
            items = en->via.array.ptr;
            m = en->via.array.size;
        } else if (en->type == MSGPACK_OBJECT_NIL) {
            m = 0;
        }
        for (uint32_t j = 0; j < m; j++) {
            const msgpack_object *it = &items[j];
            if (is_salt_key(it)) {
                size_t pl = sizeof(SALT_PREFIX) - 1;
                if (it->via.str.size > pl &&
                    !set_salt(ev, orig_ptr(cx, d, it->via.str.ptr) + pl, it->via.str.size - pl))
                    return KVR_SKIP_BAD_FIELD;
                continue;
            }
            /* vLLM puts the LoRA name first in every block of a LoRA request; the namespace
             * (model, lora_name) already separates it */
            if (j == 0 && it->type == MSGPACK_OBJECT_STR && ev->lora_name != NULL &&
                ev->lora_name_len > 0 &&
                str_eq(&it->via.str, ev->lora_name, ev->lora_name_len))
                continue;
            xkey_of(d, cx, it, &d->xk[nitems++]);
        }
        if (a->size == n)
            d->xkf[e + 1] = (uint32_t)nitems;
    }
    if (nitems == 0)
        return KVR_SKIP_NONE;
    if (a->size != n) /* keys we cannot attribute to blocks: indexing them plain would lie */
        return KVR_SKIP_BAD_FIELD;
    ev->xkeys = d->xk;
    ev->xk_first = d->xkf;
    return KVR_SKIP_NONE;
}

static void decode_locality(const struct fields *f, struct kvr_event *ev)
{
    /* any other value or type is taken as local: the field is advisory, never a skip */
    if (f->locality && f->locality->type == MSGPACK_OBJECT_STR &&
        f->locality->via.str.size == 6 && strncasecmp(f->locality->via.str.ptr, "REMOTE", 6) == 0)
        ev->remote = true;
}

static enum kvr_skip_reason decode_remaining(struct kvr_decoder *d, const struct fields *f,
                                             struct kvr_event *ev)
{
    const msgpack_object_array *a;

    if (!f->remaining)
        return KVR_SKIP_NONE;
    if (f->remaining->type != MSGPACK_OBJECT_ARRAY ||
        f->remaining->via.array.size != ev->nhashes)
        return KVR_SKIP_BAD_FIELD;
    a = &f->remaining->via.array;
    if (!grow((void **)&d->rem, &d->remcap, a->size ? a->size : 1, sizeof(*d->rem)))
        return KVR_SKIP_TOO_LARGE;
    for (uint32_t i = 0; i < a->size; i++) {
        if (a->ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a->ptr[i].via.u64 > UINT32_MAX)
            return KVR_SKIP_BAD_FIELD;
        d->rem[i] = (uint32_t)a->ptr[i].via.u64;
    }
    ev->remaining = d->rem;
    return KVR_SKIP_NONE;
}

/* EAGLE bigram tokens: every item a [t, t'] pair of ints in [0, 2^32). */
static bool raw_tok(const uint8_t **pp, const uint8_t *end)
{
    const uint8_t *p = *pp;
    static const uint8_t w[8] = {1, 2, 4, 8, 1, 2, 4, 8}; /* cc..cf, d0..d3 */
    uint64_t v;
    unsigned k;

    if (p >= end)
        return false;
    if (*p <= 0x7f) {
        *pp = p + 1;
        return true;
    }
    if (*p < 0xcc || *p > 0xd3)
        return false;
    k = *p - 0xcc;
    if ((size_t)(end - p) < 1u + w[k])
        return false;
    v = be_n(p + 1, w[k]);
    if (k >= 4) { /* signed: non-negative values only */
        int64_t sv = w[k] == 1 ? (int8_t)v : w[k] == 2 ? (int16_t)v : w[k] == 4 ? (int32_t)v
                                                                      : (int64_t)v;
        if (sv < 0)
            return false;
        v = (uint64_t)sv;
    }
    if (v > UINT32_MAX)
        return false;
    *pp = p + 1 + w[k];
    return true;
}

static bool token_pairs(const struct kvr_decoder *d, const struct arr *ta)
{
    if (ta->n == 0)
        return false;
    if (ta->c == NULL) {
        for (uint32_t i = 0; i < ta->n; i++) {
            const msgpack_object *o = &ta->obj[i];
            if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2)
                return false;
            for (int j = 0; j < 2; j++)
                if (o->via.array.ptr[j].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                    o->via.array.ptr[j].via.u64 > UINT32_MAX)
                    return false;
        }
        return true;
    }
    const uint8_t *p = d->buf + ta->c->start, *end = d->buf + ta->c->end;
    if (*p >= 0x90 && *p <= 0x9f)
        p += 1;
    else if (*p == 0xdc)
        p += 3;
    else if (*p == 0xdd)
        p += 5;
    else
        return false;
    for (uint32_t i = 0; i < ta->n; i++) {
        if (p >= end || *p != 0x92)
            return false;
        p++;
        if (!raw_tok(&p, end) || !raw_tok(&p, end))
            return false;
    }
    return p == end;
}

static enum kvr_skip_reason decode_event(struct kvr_decoder *d, const struct evctx *cx,
                                         const msgpack_object *o, struct kvr_event *ev)
{
    struct fields f;
    enum kvr_skip_reason r;
    struct arr ha, ta;
    bool has_ta = false;
    const uint64_t *hs;
    const uint32_t *ts = NULL;

    r = locate(o, &f);
    if (r != KVR_SKIP_NONE)
        return r;
    ev->type = f.type;
    if (f.type == KVR_EV_CLEARED)
        return KVR_SKIP_NONE;
    r = check_fields(&f, as_arr(d, cx, f.hashes, &ha), ev);
    ev->medium = orig_ptr(cx, d, ev->medium);
    ev->lora_name = orig_ptr(cx, d, ev->lora_name);
    if (r != KVR_SKIP_NONE)
        return r;

    if (ha.n > d->lim.max_hashes)
        return KVR_SKIP_TOO_LARGE;
    if (f.type == KVR_EV_STORED && f.tokens) {
        if (!as_arr(d, cx, f.tokens, &ta))
            return KVR_SKIP_BAD_TOKENS;
        has_ta = true;
        if (ta.n > d->lim.max_tokens)
            return KVR_SKIP_TOO_LARGE;
    }
    /* Reference path: reserved by kvr_decode_batch from the prescan bounds. */
    if ((ha.c == NULL && ha.n > d->hcap - d->hlen) ||
        (has_ta && ta.c == NULL && ta.n > d->tcap - d->tlen))
        decode_bug("scratch bound exceeded", d->next - 1);

    hs = arr_hashes(d, &ha);
    if (hs == NULL)
        return KVR_SKIP_BAD_HASH;
    if (f.type == KVR_EV_STORED && f.parent) {
        if (!hash_of(f.parent, &ev->parent))
            return KVR_SKIP_BAD_HASH;
        ev->has_parent = true;
    }
    if (has_ta && (ts = arr_tokens(d, &ta)) == NULL)
        return token_pairs(d, &ta) ? KVR_SKIP_BIGRAM : KVR_SKIP_BAD_TOKENS;
    if (f.type == KVR_EV_STORED && f.block_size &&
        (uint64_t)(has_ta ? ta.n : 0) != (uint64_t)ha.n * ev->block_size)
        return KVR_SKIP_TOKEN_COUNT;

    ev->hashes = ha.n ? hs : NULL;
    ev->nhashes = ha.n;
    if (has_ta && ta.n) {
        ev->tokens = ts;
        ev->ntokens = ta.n;
    }
    decode_locality(&f, ev);
    if (f.type == KVR_EV_STORED)
        return decode_extra(d, cx, &f, ev);
    return decode_remaining(d, &f, ev);
}

/* Copies event [off, end) into d->cbuf with each carved array replaced by a placeholder
 * (bin 8 of one byte), recording where each placeholder's data byte lands. Returns the
 * copy's length (<= copy_max, reserved by kvr_decode_batch). */
static size_t carve_copy(struct kvr_decoder *d, size_t off, size_t end, uint32_t c0,
                         uint32_t c1)
{
    size_t at = off, len = 0;
    for (uint32_t k = c0; k < c1; k++) {
        struct carve *c = &d->carves[k];
        memcpy(d->cbuf + len, d->buf + at, c->start - at);
        len += c->start - at;
        d->cbuf[len] = 0xc4;
        d->cbuf[len + 1] = 0x01;
        d->cbuf[len + 2] = 0x00;
        c->marker = d->cbuf + len + 2;
        len += CARVE_MARK;
        at = c->end;
    }
    memcpy(d->cbuf + len, d->buf + at, end - at);
    return len + (end - at);
}

int kvr_decode_next(struct kvr_decoder *d, struct kvr_event *ev, enum kvr_skip_reason *reason)
{
    enum kvr_skip_reason r;
    const struct span *s;
    msgpack_object o;
    size_t off, end;

    if (reason)
        *reason = KVR_SKIP_NONE;
    if (d == NULL || ev == NULL || d->buf == NULL || d->next >= d->nevents)
        return 0;
    memset(ev, 0, sizeof(*ev));
    s = &d->spans[d->next++];
    off = s->off;
    end = s[1].off;
    if (s->zone > d->ev_zone_max) {
        r = KVR_SKIP_TOO_LARGE; /* not unpacked at all */
    } else {
        /* The zone was sized for the batch's largest event; msgpack-c would expand it (one
         * malloc) if that accounting were ever short, never fail. */
        /* d->carves is NULL until a batch has carves: no offset is added to it then */
        uint32_t nc = s[1].c0 - s->c0;
        struct evctx cx = {nc > 0 ? d->carves + s->c0 : NULL, nc, NULL, off};
        const char *src = (const char *)d->buf;
        size_t from = off, to = end;
        msgpack_unpack_return ur;
        if (cx.nc > 0) {
            to = carve_copy(d, off, end, s->c0, s[1].c0);
            from = 0;
            src = (const char *)d->cbuf;
            cx.copy = d->cbuf;
        }
        msgpack_zone_clear(d->zone);
        ur = msgpack_unpack(src, to, &from, d->zone, &o);
        if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
            r = KVR_SKIP_TOO_LARGE;
        else if (ur != MSGPACK_UNPACK_SUCCESS || from != to)
            decode_bug("msgpack-c disagrees with prescan", d->next - 1);
        else
            r = decode_event(d, &cx, &o, ev);
    }
    if (r == KVR_SKIP_NONE)
        return 1;
    if (reason)
        *reason = r;
    return 2;
}

const char *kvr_decode_skip_reason_name(enum kvr_skip_reason r)
{
    switch (r) {
    case KVR_SKIP_NONE: return "none";
    case KVR_SKIP_NOT_EVENT: return "not_event";
    case KVR_SKIP_NO_TAG: return "no_tag";
    case KVR_SKIP_UNKNOWN_TAG: return "unknown_tag";
    case KVR_SKIP_BAD_HASH: return "bad_hash";
    case KVR_SKIP_BAD_FIELD: return "bad_field";
    case KVR_SKIP_BAD_TOKENS: return "bad_tokens";
    case KVR_SKIP_TOKEN_COUNT: return "token_count";
    case KVR_SKIP_TOO_LARGE: return "too_large";
    case KVR_SKIP_GROUP: return "group_filtered";
    case KVR_SKIP_BIGRAM: return "eagle_bigram";
    case KVR_SKIP_REASON_COUNT: break;
    }
    return "invalid";
}
