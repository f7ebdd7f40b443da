/* fuzz_zsub_frame.c — libFuzzer target for zsub's frame helpers (zsub_frame.c): topic split,
 * seq, replay replies. They were part of fuzz_decode until they moved out of decode; the seed
 * corpus tests/fuzz/corpus/zsub_frame/ started as a copy of corpus/decode/ (same input
 * format, so the frames those seeds reached are still reached).
 *
 * Input format:
 *   [topic_len u8][seq_len u8][topic][seq][payload]   (lengths clamped to what is left)
 * The three parts are the three ZMQ frames of a live message: topic and seq (strict, and with
 * a publisher id after it) are parsed. The
 * same parts are then fed as replay replies in both eras ([empty, seq, payload] and
 * [empty, topic, seq, payload], plus a wrong delimiter), and the whole input as
 * [empty, first 8 bytes, rest]. Invariants are checked with abort().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_frames.h"
#include "events/zsub.h"

static void check(int ok)
{
    if (!ok)
        abort();
}

static void run_replay(const void *const *f, const size_t *l, size_t nf)
{
    uint64_t seq;
    const void *pl;
    size_t pn;

    if (kvr_zsub_replay_reply(f, l, nf, &seq, &pl, &pn) != 0)
        return;
    check(nf == 3 || nf == 4);
    check(l[0] == 0 && l[nf - 2] == 8);
    check(pn == l[nf - 1] && pl == f[nf - 1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_frames fr;
    const uint8_t *topic, *seqf, *payload;
    size_t tl, sl, pl;
    struct kvr_zsub_topic_parts t;
    uint64_t seq;

    fuzz_frames_split(data, size, &fr);
    topic = fr.topic, tl = fr.tl;
    seqf = fr.seq, sl = fr.sl;
    payload = fr.payload, pl = fr.pl;

    /* live message */
    if (kvr_zsub_topic_split(topic, tl, &t) == 0) {
        check(t.pod_len > 0 && t.model_len > 0);
        check(t.pod == (const char *)topic + 3);
        check(t.model + t.model_len == (const char *)topic + tl);
        check(memchr(t.pod, '@', t.pod_len) == NULL);
        check(memchr(topic, '\0', tl) == NULL);
    }
    if (kvr_zsub_seq(seqf, sl, &seq) == 0)
        check(sl == 8);
    else
        check(sl != 8);
    {
        const void *id;
        size_t idl;
        if (kvr_zsub_seq_id(seqf, sl, &seq, &id, &idl) == 0) {
            check(sl >= 8 && sl <= 8 + KVR_ZSUB_PUBID_MAX && idl == sl - 8);
            check(idl == 0 ? id == NULL : id == seqf + 8);
            check(kvr_queue_pubid(id, idl) != 0);
        } else {
            check(sl < 8 || sl > 8 + KVR_ZSUB_PUBID_MAX);
        }
    }

    /* replay replies, both eras */
    {
        const void *f3[] = {"", seqf, payload};
        size_t l3[] = {0, sl, pl};
        const void *f4[] = {"", topic, seqf, payload};
        size_t l4[] = {0, tl, sl, pl};
        const void *fbad[] = {topic, seqf, payload}; /* delimiter not empty unless tl 0 */
        size_t lbad[] = {tl, sl, pl};
        run_replay(f3, l3, 3);
        run_replay(f4, l4, 4);
        run_replay(fbad, lbad, 3);
    }
    /* the whole input (after the 2 length bytes) as [empty, 8 bytes, rest] */
    {
        const uint8_t *all = topic;
        size_t n = tl + sl + pl;
        if (n >= 8) {
            const void *f[] = {NULL, all, all + 8};
            size_t l[] = {0, 8, n - 8};
            run_replay(f, l, 3);
        }
    }
    return 0;
}
