/* fuzz_frames.h — the input format fuzz_decode and fuzz_zsub_frame share, so that one seed
 * corpus reaches both: [topic_len u8][seq_len u8][topic][seq][payload], each length clamped
 * to what is left. The three parts are the three ZMQ frames of a live message.
 */
#ifndef KVR_FUZZ_FRAMES_H
#define KVR_FUZZ_FRAMES_H

#include <stddef.h>
#include <stdint.h>

struct fuzz_frames {
    const uint8_t *topic, *seq, *payload;
    size_t tl, sl, pl;
};

static inline void fuzz_frames_split(const uint8_t *data, size_t size, struct fuzz_frames *f)
{
    size_t tl = 0, sl = 0;

    if (size >= 2) {
        tl = data[0];
        sl = data[1];
        data += 2;
        size -= 2;
    }
    if (tl > size)
        tl = size;
    f->topic = data, f->tl = tl;
    data += tl, size -= tl;
    if (sl > size)
        sl = size;
    f->seq = data, f->sl = sl;
    data += sl, size -= sl;
    f->payload = data, f->pl = size;
}

#endif
