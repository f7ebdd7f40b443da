/* zsub_replay.c — the replay client: requests queue FIFO, at most max_concurrent_replays
 * run, each on its own DEALER connected to the source's replay ROUTER; replies (either era,
 * kvr_zsub_replay_reply) become REPLAY items in the requester's queue, the end marker or a
 * failure (timeout, bad reply, source gone) one REPLAY_END.
 *
 * Why its own file: the replay protocol has its own state (pending and active replays, their
 * deadlines) and its own failure rules, and is tested on its own (test_zsub's replay cases
 * against a ROUTER in both eras, a mute one, a hole in the ring); the sockets of the live
 * path and the receive loop stay in zsub.c.
 *
 * Threads: kvr_zsub_replay() from any thread (posts under cmu, wakes the receive thread);
 * everything else on the receive thread.
 */
#include "events/zsub_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kvr_zsub_replay_free(struct replay *r)
{
    if (r->dealer != NULL)
        zmq_close(r->dealer);
    free(r);
}

void kvr_zsub_end_replay(struct kvr_zsub *z, struct replay *r, bool ok)
{
    struct kvr_queue_msg *it = kvr_zsub_reserve_item(z, r->req.shard);

    if (ok)
        KVR_CNT_INC(z->replays_completed);
    else
        KVR_CNT_INC(z->replays_failed);
    if (it == NULL)
        return;
    it->kind = KVR_QUEUE_REPLAY_END;
    it->topic = r->req.topic;
    it->ctx = r->req.ctx;
    it->gen = r->req.gen;
    it->ok = ok;
    kvr_queue_commit(z->o.queues[r->req.shard]);
}

int kvr_zsub_replay(struct kvr_zsub *z, const struct kvr_queue_replay_req *req)
{
    struct replay *r = calloc(1, sizeof(*r));
    uint64_t one = 1;
    ssize_t w;

    if (r == NULL)
        return -ENOMEM;
    r->req = *req;
    pthread_mutex_lock(&z->cmu);
    if (!z->accepting) {
        pthread_mutex_unlock(&z->cmu);
        free(r);
        return -ESHUTDOWN;
    }
    if (z->req_tail != NULL)
        z->req_tail->next = r;
    else
        z->req_head = r;
    z->req_tail = r;
    w = write(z->efd, &one, sizeof(one));
    (void)w;
    pthread_mutex_unlock(&z->cmu);
    return 0;
}

void kvr_zsub_remove_active(struct kvr_zsub *z, size_t i)
{
    kvr_zsub_replay_free(z->active[i]);
    z->active[i] = z->active[--z->nactive];
    KVR_CNT_SET(z->replays_active, z->nactive);
    z->dirty = true;
}

/* Reads the replies of active replay i; returns true when the replay finished. */
bool kvr_zsub_read_dealer(struct kvr_zsub *z, size_t idx)
{
    struct replay *r = z->active[idx];

    for (int k = 0; k < RECV_BURST; k++) {
        zmq_msg_t f[MAX_REPLY_FRAMES];
        const void *frames[MAX_REPLY_FRAMES];
        size_t lens[MAX_REPLY_FRAMES];
        size_t n = 0, total = 0;
        int more = 1;
        uint64_t seq;
        const void *payload;
        size_t plen;
        struct kvr_queue_msg *it;
        struct kvr_queue_payload pl;
        int rc;

        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], r->dealer, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[0]);
            return false;
        }
        n = total = 1;
        more = zmq_msg_more(&f[0]);
        while (more) {
            zmq_msg_t extra, *m = n < MAX_REPLY_FRAMES ? &f[n] : &extra;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, r->dealer, 0) < 0) {
                zmq_msg_close(m);
                break;
            }
            more = zmq_msg_more(m);
            if (m == &extra)
                zmq_msg_close(m);
            else
                n++;
            total++;
        }
        for (size_t i = 0; i < n; i++) {
            frames[i] = zmq_msg_data(&f[i]);
            lens[i] = zmq_msg_size(&f[i]);
        }
        rc = total == n ? kvr_zsub_replay_reply(frames, lens, n, &seq, &payload, &plen)
                        : -EINVAL;
        if (rc != 0) {
            KVR_CNT_INC(z->replay_bad_replies);
            kvr_log_limited(&z->rl_replay, KVR_LOG_WARN,
                            "events: replay from %s: malformed reply (%zu frames); giving up",
                            r->addr, total);
            for (size_t i = 0; i < n; i++)
                zmq_msg_close(&f[i]);
            kvr_zsub_end_replay(z, r, false);
            return true;
        }
        if (seq == KVR_ZSUB_SEQ_END || plen == 0) {
            for (size_t i = 0; i < n; i++)
                zmq_msg_close(&f[i]);
            kvr_log_debug("events: replay from %s of %s/%u done: %" PRIu64 " batches from %" PRIu64,
                          r->addr, r->req.topic->pod, r->req.dp_rank, r->batches, r->req.start);
            kvr_zsub_end_replay(z, r, true);
            return true;
        }
        if (payload == zmq_msg_data(&f[n - 1]) && plen == zmq_msg_size(&f[n - 1])) {
            rc = kvr_zsub_payload_take(&pl, &f[n - 1]);
        } else {
            /* Not the last frame as a whole: copy (never the case for the known eras). */
            zmq_msg_t c;
            rc = zmq_msg_init_size(&c, plen) == 0 ? 0 : -ENOMEM;
            if (rc == 0) {
                memcpy(zmq_msg_data(&c), payload, plen);
                rc = kvr_zsub_payload_take(&pl, &c);
                zmq_msg_close(&c);
            }
        }
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
        if (rc != 0) {
            kvr_log_limited(&z->rl_replay, KVR_LOG_WARN,
                            "events: replay from %s: out of memory; giving up", r->addr);
            kvr_zsub_end_replay(z, r, false);
            return true;
        }
        it = kvr_zsub_reserve_item(z, r->req.shard);
        if (it == NULL) {
            kvr_queue_payload_release(&pl);
            return true;
        }
        it->kind = KVR_QUEUE_REPLAY;
        it->topic = r->req.topic;
        it->ctx = r->req.ctx;
        it->gen = r->req.gen;
        it->seq = seq;
        it->recv_ns = kvr_now_ns();
        it->payload = pl;
        r->batches++;
        KVR_CNT_INC(z->replay_batches);
        kvr_queue_commit(z->o.queues[r->req.shard]);
    }
    return false;
}

static struct source *find_id(struct kvr_zsub *z, uint32_t id)
{
    for (size_t i = 0; i < z->nsrcs; i++)
        if (z->srcs[i]->id == id)
            return z->srcs[i];
    return NULL;
}

/* Starts pending replays while slots are free. */
void kvr_zsub_start_replays(struct kvr_zsub *z)
{
    while (z->pend_head != NULL && z->nactive < z->o.max_concurrent_replays) {
        struct replay *r = z->pend_head;
        unsigned char be[8];
        void *d;

        z->pend_head = r->next;
        if (z->pend_head == NULL)
            z->pend_tail = NULL;
        r->next = NULL;
        atomic_fetch_sub_explicit(&z->replays_pending, 1, memory_order_relaxed);
        r->src = find_id(z, r->req.source);
        KVR_CNT_INC(z->replays_started);
        if (r->src == NULL || r->src->replay == NULL) {
            kvr_zsub_end_replay(z, r, false);
            kvr_zsub_replay_free(r);
            continue;
        }
        if (r->src->replay_tmpl) {
            struct kvr_err e;
            if (r->req.topic == NULL ||
                kvr_zsub_template_build(r->src->replay, r->req.topic->pod, r->req.dp_rank,
                                        r->addr, sizeof(r->addr), &e) != 0) {
                kvr_log_limited(&z->rl_replay, KVR_LOG_WARN,
                                "events: no replay for %s/%u through %s: %s",
                                r->req.topic ? r->req.topic->pod : "?", r->req.dp_rank,
                                r->src->replay, r->req.topic ? e.msg : "no topic");
                kvr_zsub_end_replay(z, r, false);
                kvr_zsub_replay_free(r);
                continue;
            }
        } else {
            snprintf(r->addr, sizeof(r->addr), "%s", r->src->replay);
        }
        d = zmq_socket(z->ctx, ZMQ_DEALER);
        if (d == NULL) {
            kvr_zsub_end_replay(z, r, false);
            kvr_zsub_replay_free(r);
            continue;
        }
        r->dealer = d;
        kvr_zsub_set_int(d, ZMQ_LINGER, 0);
        kvr_zsub_set_ipv6_for(d, r->addr);
        kvr_zsub_set_int(d, ZMQ_RCVHWM, 0);
        if (z->o.max_message_size > 0)
            zmq_setsockopt(d, ZMQ_MAXMSGSIZE, &z->o.max_message_size, sizeof(int64_t));
        for (int i = 0; i < 8; i++)
            be[i] = (unsigned char)(r->req.start >> (56 - 8 * i));
        if (zmq_connect(d, r->addr) != 0 || zmq_send(d, "", 0, ZMQ_SNDMORE) != 0 ||
            zmq_send(d, be, 8, ZMQ_DONTWAIT) != 8) {
            kvr_log_limited(&z->rl_replay, KVR_LOG_WARN, "events: replay request to %s failed: %s",
                            r->addr, zmq_strerror(errno));
            kvr_zsub_end_replay(z, r, false);
            kvr_zsub_replay_free(r);
            continue;
        }
        r->deadline = kvr_now_ms() + z->o.replay_timeout_ms;
        z->active[z->nactive++] = r;
        KVR_CNT_SET(z->replays_active, z->nactive);
        z->dirty = true;
        kvr_log_debug("events: replaying %s/%u of %s from seq %" PRIu64 " via %s",
                      r->req.topic ? r->req.topic->pod : "?", r->req.dp_rank, r->src->endpoint,
                      r->req.start, r->addr);
    }
}

