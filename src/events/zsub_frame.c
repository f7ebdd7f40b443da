/* zsub_frame.c — the ZeroMQ frames of the event wire format, as bytes: the topic
 * "kv@<pod>@<model>", the 8-byte big-endian seq (and the publisher id some engines send
 * after it), and a replay reply in either era.
 *
 * Why its own file: these are pure functions of peer bytes (no sockets, no msgpack, no state),
 * so they are unit-tested and fuzzed on their own (tests/unit/test_zsub.c,
 * tests/fuzz/fuzz_zsub_frame.c). They used to live in decode.c, which made zsub include the
 * msgpack decoder's header for three byte functions; batches themselves are never looked at
 * here. Threads: any.
 */
#include "events/zsub.h"

#include <errno.h>
#include <string.h>

static inline uint64_t be_read(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

int kvr_zsub_topic_split(const void *frame, size_t len, struct kvr_zsub_topic_parts *out)
{
    const char *s = frame;
    const char *at;

    if (s == NULL || out == NULL || len < 3 || memcmp(s, "kv@", 3) != 0)
        return -EINVAL;
    /* Reject NUL bytes: pods and models end up as C strings downstream. */
    if (memchr(s, '\0', len) != NULL)
        return -EINVAL;
    at = memchr(s + 3, '@', len - 3);
    if (at == NULL)
        return -EINVAL;
    out->pod = s + 3;
    out->pod_len = (size_t)(at - out->pod);
    out->model = at + 1;
    out->model_len = len - (size_t)(out->model - s);
    if (out->pod_len == 0 || out->model_len == 0)
        return -EINVAL;
    return 0;
}

int kvr_zsub_seq(const void *frame, size_t len, uint64_t *seq)
{
    if (frame == NULL || len != 8 || seq == NULL)
        return -EINVAL;
    *seq = be_read(frame, 8);
    return 0;
}

int kvr_zsub_seq_id(const void *frame, size_t len, uint64_t *seq, const void **id,
                    size_t *id_len)
{
    if (frame == NULL || len < 8 || len > 8 + KVR_ZSUB_PUBID_MAX || seq == NULL || id == NULL ||
        id_len == NULL)
        return -EINVAL;
    *seq = be_read(frame, 8);
    *id = len > 8 ? (const uint8_t *)frame + 8 : NULL;
    *id_len = len - 8;
    return 0;
}

int kvr_zsub_replay_reply(const void *const *frames, const size_t *lens, size_t nframes,
                          uint64_t *seq, const void **payload, size_t *payload_len)
{
    size_t is;

    if (frames == NULL || lens == NULL || seq == NULL || payload == NULL ||
        payload_len == NULL)
        return -EINVAL;
    if (nframes == 3)
        is = 1; /* [empty, seq, payload]          v0.9 – v0.24 */
    else if (nframes == 4)
        is = 2; /* [empty, topic, seq, payload]   v0.25+ */
    else
        return -EINVAL;
    if (lens[0] != 0) /* the DEALER's empty delimiter */
        return -EINVAL;
    if (kvr_zsub_seq(frames[is], lens[is], seq) != 0)
        return -EINVAL;
    if (lens[is + 1] != 0 && frames[is + 1] == NULL)
        return -EINVAL;
    *payload = frames[is + 1];
    *payload_len = lens[is + 1];
    return 0;
}
