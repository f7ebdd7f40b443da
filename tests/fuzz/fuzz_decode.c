/* fuzz_decode.c — libFuzzer target for the batch decoder (decode.h). The frame helpers it
 * used to cover moved to zsub (fuzz_zsub_frame.c); the input format is unchanged.
 *
 * Input format (the seed corpus in tests/fuzz/corpus/decode/ follows it; regenerate with
 * tests/unit/gen_decode_fixtures.py --corpus):
 *   [topic_len u8][seq_len u8][topic][seq][payload]   (lengths clamped to what is left)
 * The three parts are the three ZMQ frames of a live message: the payload is decoded as a
 * batch by two long-lived decoders (default limits and tight ones, so both the limit paths
 * and the normal paths run) and every event is iterated with its arrays read in full. The
 * whole input past its first 8 bytes (what a replay reply [empty, 8 bytes, rest] would
 * carry) is decoded too.
 * Invariants the decoder promises are checked with abort(), and the normal decoders are
 * compared with reference ones (limits.reference: bulk arrays through msgpack-c objects),
 * which must agree on every event, skip reason and field.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "events/decode.h"
#include "fuzz_frames.h"

static struct kvr_decoder *g_def, *g_tight, *g_def_ref, *g_tight_ref;

static void check(int ok)
{
    if (!ok)
        abort();
}

static void run_batch(struct kvr_decoder *d, const uint8_t *p, size_t n)
{
    struct kvr_batch bt;
    struct kvr_event ev;
    enum kvr_skip_reason why;
    volatile uint64_t sink = 0;
    uint32_t seen = 0;
    int rc;

    if (kvr_decode_batch(d, p, n, &bt) != 0) {
        check(kvr_decode_next(d, &ev, &why) == 0);
        return;
    }
    /* a publisher id borrows 1..KVR_DECODE_PUBID_MAX bytes of the input */
    check((bt.pub_id == NULL) == (bt.pub_id_len == 0));
    check(bt.pub_id_len <= KVR_DECODE_PUBID_MAX);
    check(bt.pub_id == NULL || (bt.pub_id > p && bt.pub_id + bt.pub_id_len <= p + n));
    while ((rc = kvr_decode_next(d, &ev, &why)) != 0) {
        seen++;
        check(rc == 1 || rc == 2);
        if (rc == 2) {
            check(why > KVR_SKIP_NONE && why < KVR_SKIP_REASON_COUNT);
            check(kvr_decode_skip_reason_name(why) != NULL);
            continue;
        }
        check(why == KVR_SKIP_NONE);
        check(ev.type >= KVR_EV_STORED && ev.type <= KVR_EV_CLEARED);
        check(ev.nhashes == 0 || ev.hashes != NULL);
        check(ev.ntokens == 0 || ev.tokens != NULL);
        if (ev.type == KVR_EV_STORED && ev.block_size != 0)
            check(ev.ntokens == (uint64_t)ev.nhashes * ev.block_size);
        for (size_t i = 0; i < ev.nhashes; i++)
            sink += ev.hashes[i];
        for (size_t i = 0; i < ev.ntokens; i++)
            sink += ev.tokens[i];
        /* borrowed strings point into the payload */
        if (ev.medium)
            check((const uint8_t *)ev.medium >= p &&
                  (const uint8_t *)ev.medium + ev.medium_len <= p + n);
        if (ev.lora_name)
            check((const uint8_t *)ev.lora_name >= p &&
                  (const uint8_t *)ev.lora_name + ev.lora_name_len <= p + n);
        if (ev.salt)
            check((const uint8_t *)ev.salt >= p && (const uint8_t *)ev.salt + ev.salt_len <= p + n);
        /* extra keys: per-block ranges in order, borrowed bytes inside the payload */
        if (ev.xkeys) {
            check(ev.xk_first[0] == 0);
            for (size_t i = 0; i < ev.nhashes; i++)
                check(ev.xk_first[i] <= ev.xk_first[i + 1]);
            for (uint32_t k = 0; k < ev.xk_first[ev.nhashes]; k++) {
                const struct kvr_xkey *x = &ev.xkeys[k];
                check(x->kind >= KVR_XK_STR && x->kind <= KVR_XK_OTHER);
                if (x->len)
                    check((const uint8_t *)x->s >= p && (const uint8_t *)x->s + x->len <= p + n);
            }
        }
        for (size_t i = 0; ev.remaining && i < ev.nhashes; i++)
            sink += ev.remaining[i];
    }
    check(seen == bt.nevents);
    (void)sink; /* the sums only make every array element be read */
}

/* The normal decoder (bulk arrays read from the raw bytes) against the reference one (every
 * field through msgpack-c objects): the same batch verdict, then the same events, skips and
 * reasons, field by field. */
static void run_diff(struct kvr_decoder *a, struct kvr_decoder *r, const uint8_t *p, size_t n)
{
    struct kvr_batch ba, br;
    struct kvr_event ea, er;
    enum kvr_skip_reason wa, wr;
    int ra, rr;

    ra = kvr_decode_batch(a, p, n, &ba);
    rr = kvr_decode_batch(r, p, n, &br);
    check(ra == rr);
    if (ra != 0)
        return;
    check(ba.nevents == br.nevents && ba.has_dp_rank == br.has_dp_rank &&
          ba.dp_rank == br.dp_rank && memcmp(&ba.ts, &br.ts, sizeof(ba.ts)) == 0 &&
          ba.pub_id == br.pub_id && ba.pub_id_len == br.pub_id_len);
    do {
        ra = kvr_decode_next(a, &ea, &wa);
        rr = kvr_decode_next(r, &er, &wr);
        check(ra == rr && wa == wr);
        if (ra == 2)
            check(ea.type == er.type && ea.group_idx == er.group_idx);
        if (ra != 1)
            continue;
        check(ea.type == er.type && ea.nhashes == er.nhashes && ea.ntokens == er.ntokens);
        check(ea.has_parent == er.has_parent && ea.parent == er.parent);
        check(ea.block_size == er.block_size && ea.group_idx == er.group_idx);
        check(ea.has_lora_id == er.has_lora_id && ea.lora_id == er.lora_id);
        check(ea.medium == er.medium && ea.medium_len == er.medium_len);
        check(ea.lora_name == er.lora_name && ea.lora_name_len == er.lora_name_len);
        check(ea.nhashes == 0 || memcmp(ea.hashes, er.hashes, ea.nhashes * 8) == 0);
        check(ea.ntokens == 0 || memcmp(ea.tokens, er.tokens, ea.ntokens * 4) == 0);
        check(ea.salt == er.salt && ea.salt_len == er.salt_len && ea.remote == er.remote);
        check((ea.xkeys == NULL) == (er.xkeys == NULL));
        if (ea.xkeys) {
            check(memcmp(ea.xk_first, er.xk_first, (ea.nhashes + 1) * 4) == 0);
            for (uint32_t k = 0; k < ea.xk_first[ea.nhashes]; k++)
                check(ea.xkeys[k].kind == er.xkeys[k].kind && ea.xkeys[k].s == er.xkeys[k].s &&
                      ea.xkeys[k].len == er.xkeys[k].len && ea.xkeys[k].i == er.xkeys[k].i);
        }
        check((ea.remaining == NULL) == (er.remaining == NULL));
        check(ea.remaining == NULL || memcmp(ea.remaining, er.remaining, ea.nhashes * 4) == 0);
    } while (ra != 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_frames fr;
    const uint8_t *payload;
    size_t pl;

    if (g_def == NULL) {
        struct kvr_decode_limits tight = {.max_events = 4, .max_tokens = 32, .max_hashes = 4,
                                          .max_depth = 6};
        struct kvr_decode_limits ref = {.reference = true}, tight_ref = tight;
        tight_ref.reference = true;
        if (kvr_decode_create(NULL, &g_def) != 0 || kvr_decode_create(&tight, &g_tight) != 0 ||
            kvr_decode_create(&ref, &g_def_ref) != 0 ||
            kvr_decode_create(&tight_ref, &g_tight_ref) != 0)
            abort();
    }
    fuzz_frames_split(data, size, &fr);
    payload = fr.payload;
    pl = fr.pl;

    /* live message */
    run_batch(g_def, payload, pl);
    run_batch(g_tight, payload, pl);
    run_diff(g_def, g_def_ref, payload, pl);
    run_diff(g_tight, g_tight_ref, payload, pl);
    if (kvr_decode_force_isa(-1) > 0) { /* token runs without the AVX-512 windows too */
        kvr_decode_force_isa(0);
        run_diff(g_def, g_def_ref, payload, pl);
        kvr_decode_force_isa(-1);
    }

    /* the whole input (after the 2 length bytes) past 8 bytes, as a replay payload */
    {
        const uint8_t *all = fr.topic;
        size_t n = fr.tl + fr.sl + fr.pl;
        if (n >= 8) {
            run_batch(g_def, all + 8, n - 8);
        }
    }
    return 0;
}
