/* share.c — replicas sharing decisions (share.h): the codec, the ring decisions wait in, and
 * the thread that sends batches and applies the peers'.
 *
 * The thread polls its SUB socket with a 1 ms timeout and, between polls, sends what the
 * ring holds (a batch is due when it is full or its first decision has waited 1 ms). PUB
 * never blocks: past its high-water mark ZeroMQ drops, and a peer that is slow or gone is
 * its own loss.
 */
#include "route/share.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <zmq.h>

#include "core/log.h"
#include "core/metrics.h"

#define VERSION 1
#define ENTRY_FIXED 22 /* dp_rank 4, tokens 8, key 8, flags 1, pod length 1 */
#define BATCH_WAIT_NS 1000000ll
#define POLL_MS 1

/* ---- codec ------------------------------------------------------------------------------ */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int kvr_share_encode(const uint8_t id[16], const struct kvr_route_shared *d, size_t n,
                     struct kvr_buf *out)
{
    uint8_t h[KVR_SHARE_HDR] = {'K', 'V', 'R', 'S', VERSION};

    if (n > KVR_SHARE_BATCH)
        return -EINVAL;
    kvr_buf_reset(out);
    memcpy(h + 8, id, 16);
    put_le(h + 24, n, 2);
    kvr_buf_append(out, h, sizeof(h));
    for (size_t i = 0; i < n; i++) {
        size_t pl = d[i].pod != NULL ? strlen(d[i].pod) : 0;
        uint8_t e[ENTRY_FIXED];
        if (pl == 0 || pl > KVR_SHARE_POD_MAX)
            return -EINVAL;
        put_le(e, d[i].dp_rank, 4);
        put_le(e + 4, d[i].tokens, 8);
        put_le(e + 12, d[i].key, 8);
        e[20] = d[i].evented ? 1 : 0;
        e[21] = (uint8_t)pl;
        kvr_buf_append(out, e, sizeof(e));
        kvr_buf_append(out, d[i].pod, pl);
    }
    return out->oom ? -ENOMEM : 0;
}

int kvr_share_decode(const void *buf, size_t len, const uint8_t self[16],
                     void (*cb)(void *arg, const struct kvr_route_shared *d), void *arg,
                     struct kvr_err *err)
{
    const uint8_t *p = buf;
    char pod[KVR_SHARE_POD_MAX + 1];

    if (len < KVR_SHARE_HDR || memcmp(p, "KVRS", 4) != 0)
        return kvr_err_set(err, -EINVAL, "not a kvrouterd decision batch (%zu bytes)", len);
    if (p[4] != VERSION)
        return kvr_err_set(err, -EINVAL, "decision batch version %u (this build reads %d)",
                           p[4], VERSION);
    if (p[5] || p[6] || p[7] || p[26] || p[27])
        return kvr_err_set(err, -EINVAL, "decision batch with non-zero reserved bytes");
    size_t n = (size_t)get_le(p + 24, 2);
    if (n > KVR_SHARE_BATCH)
        return kvr_err_set(err, -EINVAL, "decision batch of %zu entries (at most %d)", n,
                           KVR_SHARE_BATCH);
    /* the whole frame first: nothing is applied from a frame that does not parse */
    size_t off = KVR_SHARE_HDR;
    for (size_t i = 0; i < n; i++) {
        if (len - off < ENTRY_FIXED)
            return kvr_err_set(err, -EINVAL, "decision batch cut in entry %zu", i);
        size_t pl = p[off + 21];
        if (pl == 0)
            return kvr_err_set(err, -EINVAL, "entry %zu: empty pod", i);
        if (p[off + 20] > 1)
            return kvr_err_set(err, -EINVAL, "entry %zu: unknown flags 0x%x", i, p[off + 20]);
        if (len - off - ENTRY_FIXED < pl)
            return kvr_err_set(err, -EINVAL, "decision batch cut in entry %zu's pod", i);
        if (memchr(p + off + ENTRY_FIXED, '\0', pl) != NULL)
            return kvr_err_set(err, -EINVAL, "entry %zu: NUL in the pod", i);
        off += ENTRY_FIXED + pl;
    }
    if (off != len)
        return kvr_err_set(err, -EINVAL, "%zu bytes after the last entry", len - off);
    if (self != NULL && memcmp(p + 8, self, 16) == 0)
        return 1;
    off = KVR_SHARE_HDR;
    for (size_t i = 0; i < n; i++) {
        size_t pl = p[off + 21];
        memcpy(pod, p + off + ENTRY_FIXED, pl);
        pod[pl] = '\0';
        struct kvr_route_shared d = {.pod = pod, .dp_rank = (uint32_t)get_le(p + off, 4),
                                     .tokens = get_le(p + off + 4, 8),
                                     .key = get_le(p + off + 12, 8),
                                     .evented = p[off + 20] == 1};
        cb(arg, &d);
        off += ENTRY_FIXED + pl;
    }
    return 0;
}

/* ---- the ring and the thread ------------------------------------------------------------- */

struct slot {
    struct kvr_route_shared d; /* d.pod points at pod */
    char pod[KVR_SHARE_POD_MAX + 1];
};

struct kvr_share {
    struct kvr_route *route;
    uint8_t id[16];
    void *ctx, *pub, *sub;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    pthread_mutex_t mu; /* the ring */
    struct slot *ring;
    size_t head, n;
    int64_t first_ns; /* when the oldest queued decision was queued */
    struct slot out[KVR_SHARE_BATCH]; /* the thread's copy of a batch being sent */
    /* counters (relaxed atomics: the thread and the publishers write, /metrics reads) */
    _Atomic uint64_t queued, dropped, sent_batches, sent, recv_batches, applied, echoes,
        malformed, send_failed;
};

static int64_t now_ns(void)
{
    return (int64_t)kvr_now_ns();
}

void kvr_share_publish(void *arg, const struct kvr_route_shared *d)
{
    struct kvr_share *s = arg;
    size_t pl = d->pod != NULL ? strlen(d->pod) : 0;
    if (pl == 0 || pl > KVR_SHARE_POD_MAX) {
        atomic_fetch_add_explicit(&s->dropped, 1, memory_order_relaxed);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (s->n == KVR_SHARE_RING) {
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add_explicit(&s->dropped, 1, memory_order_relaxed);
        return;
    }
    struct slot *sl = &s->ring[(s->head + s->n) % KVR_SHARE_RING];
    memcpy(sl->pod, d->pod, pl + 1);
    sl->d = *d;
    sl->d.pod = sl->pod;
    if (s->n++ == 0)
        s->first_ns = now_ns();
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add_explicit(&s->queued, 1, memory_order_relaxed);
}

/* Sends the ring's decisions in batches when a batch is due (or all of them with force). */
static void flush(struct kvr_share *s, struct kvr_buf *b, bool force)
{
    struct kvr_route_shared batch[KVR_SHARE_BATCH];
    struct slot *copy = s->out;

    for (;;) {
        size_t k;
        pthread_mutex_lock(&s->mu);
        if (s->n == 0 || (!force && s->n < KVR_SHARE_BATCH &&
                          now_ns() - s->first_ns < BATCH_WAIT_NS)) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        k = s->n < KVR_SHARE_BATCH ? s->n : KVR_SHARE_BATCH;
        for (size_t i = 0; i < k; i++) {
            copy[i] = s->ring[(s->head + i) % KVR_SHARE_RING];
            batch[i] = copy[i].d;
            batch[i].pod = copy[i].pod;
        }
        s->head = (s->head + k) % KVR_SHARE_RING;
        s->n -= k;
        s->first_ns = now_ns();
        pthread_mutex_unlock(&s->mu);
        if (s->pub == NULL)
            continue; /* listening only: nothing to send to */
        if (kvr_share_encode(s->id, batch, k, b) != 0 ||
            zmq_send(s->pub, b->data, b->len, ZMQ_DONTWAIT) < 0) {
            atomic_fetch_add_explicit(&s->send_failed, 1, memory_order_relaxed);
            continue;
        }
        atomic_fetch_add_explicit(&s->sent_batches, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->sent, k, memory_order_relaxed);
    }
}

static void apply_one(void *arg, const struct kvr_route_shared *d)
{
    struct kvr_share *s = arg;
    if (kvr_route_apply_shared(s->route, d) == 0)
        atomic_fetch_add_explicit(&s->applied, 1, memory_order_relaxed);
}

static void receive(struct kvr_share *s)
{
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->sub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        struct kvr_err err;
        int more = zmq_msg_more(&m);
        int rc = more ? kvr_err_set(&err, -EINVAL, "a multi-part message")
                      : kvr_share_decode(zmq_msg_data(&m), zmq_msg_size(&m), s->id, apply_one,
                                         s, &err);
        zmq_msg_close(&m);
        if (more) { /* drop the rest of it */
            zmq_msg_t x;
            zmq_msg_init(&x);
            while (zmq_msg_recv(&x, s->sub, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&x))
                ;
            zmq_msg_close(&x);
        }
        if (rc < 0) {
            if (atomic_fetch_add_explicit(&s->malformed, 1, memory_order_relaxed) == 0)
                kvr_log_warn("share: a peer's batch refused: %s (counted from now on)",
                             err.msg);
        } else if (rc == 1) {
            atomic_fetch_add_explicit(&s->echoes, 1, memory_order_relaxed);
        } else {
            atomic_fetch_add_explicit(&s->recv_batches, 1, memory_order_relaxed);
        }
    }
}

static void *share_main(void *arg)
{
    struct kvr_share *s = arg;
    struct kvr_buf b;

    kvr_buf_init(&b);
    while (!atomic_load(&s->stop)) {
        zmq_pollitem_t it = {.socket = s->sub, .events = ZMQ_POLLIN};
        if (s->sub != NULL) {
            if (zmq_poll(&it, 1, POLL_MS) > 0)
                receive(s);
        } else {
            struct timespec ts = {0, POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        flush(s, &b, false);
    }
    flush(s, &b, true);
    kvr_buf_free(&b);
    return NULL;
}

/* ---- life ------------------------------------------------------------------------------- */

static int open_sockets(struct kvr_share *s, const char *bind, const char *peers,
                        struct kvr_err *err)
{
    int zero = 0, hwm = 1000;

    if (bind != NULL && bind[0] != '\0') {
        if ((s->pub = zmq_socket(s->ctx, ZMQ_PUB)) == NULL)
            return kvr_err_set(err, -ENOMEM, "share: PUB socket: %s", zmq_strerror(errno));
        zmq_setsockopt(s->pub, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(s->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
        if (zmq_bind(s->pub, bind) != 0)
            return kvr_err_set(err, -EINVAL, "[route] peer_bind %s: %s", bind,
                               zmq_strerror(errno));
    }
    if (peers == NULL || peers[0] == '\0')
        return 0;
    if ((s->sub = zmq_socket(s->ctx, ZMQ_SUB)) == NULL)
        return kvr_err_set(err, -ENOMEM, "share: SUB socket: %s", zmq_strerror(errno));
    zmq_setsockopt(s->sub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, "KVRS", 4);
    for (const char *p = peers; *p;) {
        char ep[1024];
        size_t n = strcspn(p, " \t,");
        if (n > 0) {
            if (n >= sizeof(ep))
                return kvr_err_set(err, -EINVAL, "[route] peers: an endpoint over %zu bytes",
                                   sizeof(ep) - 1);
            memcpy(ep, p, n);
            ep[n] = '\0';
            if (zmq_connect(s->sub, ep) != 0)
                return kvr_err_set(err, -EINVAL, "[route] peers %s: %s", ep,
                                   zmq_strerror(errno));
        }
        p += n;
        p += strspn(p, " \t,");
    }
    return 0;
}

int kvr_share_create(struct kvr_route *route, const char *bind, const char *peers,
                     struct kvr_share **out, struct kvr_err *err)
{
    struct kvr_share *s = calloc(1, sizeof(*s));
    int rc;

    if (s == NULL || (s->ring = calloc(KVR_SHARE_RING, sizeof(*s->ring))) == NULL) {
        free(s);
        return kvr_err_set(err, -ENOMEM, "share: out of memory");
    }
    s->route = route;
    pthread_mutex_init(&s->mu, NULL);
    if (getrandom(s->id, sizeof(s->id), 0) != (ssize_t)sizeof(s->id)) {
        uint64_t t = kvr_now_ns() ^ (uint64_t)(uintptr_t)s;
        memcpy(s->id, &t, sizeof(t)); /* no entropy: the clock and an address differ enough */
    }
    if ((s->ctx = zmq_ctx_new()) == NULL) {
        kvr_share_destroy(s);
        return kvr_err_set(err, -ENOMEM, "share: ZeroMQ context: %s", zmq_strerror(errno));
    }
    if ((rc = open_sockets(s, bind, peers, err)) != 0) {
        kvr_share_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int kvr_share_start(struct kvr_share *s, struct kvr_err *err)
{
    int rc = pthread_create(&s->thread, NULL, share_main, s);
    if (rc != 0)
        return kvr_err_set(err, -rc, "share: thread: %s", strerror(rc));
    s->started = true;
    return 0;
}

void kvr_share_destroy(struct kvr_share *s)
{
    if (s == NULL)
        return;
    if (s->started) {
        atomic_store(&s->stop, true);
        pthread_join(s->thread, NULL);
    }
    if (s->pub != NULL)
        zmq_close(s->pub);
    if (s->sub != NULL)
        zmq_close(s->sub);
    if (s->ctx != NULL)
        zmq_ctx_term(s->ctx);
    pthread_mutex_destroy(&s->mu);
    free(s->ring);
    free(s);
}

void kvr_share_metrics(struct kvr_share *s, struct kvr_buf *out)
{
#define C(f) atomic_load_explicit(&s->f, memory_order_relaxed)
    kvr_metrics_counter(out, "share_decisions_queued_total",
                        "Decisions of this replica queued for its peers", NULL, C(queued));
    kvr_metrics_counter(out, "share_decisions_dropped_total",
                        "Decisions not shared: the queue was full", NULL, C(dropped));
    kvr_metrics_counter(out, "share_decisions_sent_total", "Decisions sent to peers", NULL,
                        C(sent));
    kvr_metrics_counter(out, "share_batches_sent_total", "Batches sent to peers", NULL,
                        C(sent_batches));
    kvr_metrics_counter(out, "share_send_failed_total", "Batches ZeroMQ did not take", NULL,
                        C(send_failed));
    kvr_metrics_counter(out, "share_batches_received_total", "Peers' batches applied", NULL,
                        C(recv_batches));
    kvr_metrics_counter(out, "share_decisions_applied_total",
                        "Peers' decisions taken in as in-flight work", NULL, C(applied));
    kvr_metrics_counter(out, "share_echoes_total", "This replica's own batches, skipped", NULL,
                        C(echoes));
    kvr_metrics_counter(out, "share_malformed_total", "Received batches refused", NULL,
                        C(malformed));
#undef C
}
