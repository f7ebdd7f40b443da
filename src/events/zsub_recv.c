/* zsub_recv.c — the live receive path: read 3-frame messages from a SUB, check them
 * (zsub_frame.c), intern their topic (pod, model, shard) once per distinct (pod override,
 * topic bytes), and hand each batch to its writer queue as a LIVE item whose payload is the
 * received ZeroMQ message; bad messages are counted by reason. Also the connection monitor
 * events of connect sources.
 *
 * Why its own file: this is the per-message hot path with its own rules (what is a bad
 * frame, how topics are keyed and bounded by max_topics, nothing dropped when a queue is
 * full) and tests (test_zsub's bad-frame, pod-override and random-garbage cases); sockets,
 * endpoints and the loop that polls them stay in zsub.c.
 *
 * Threads: the receive thread only.
 */
#include "events/zsub_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- payloads --------------------------------------------------------------------- */

/* A received message becomes a plain payload: the zmq_msg_t moves to the heap (the consumer
 * may keep the payload after its queue slot is reused, e.g. in a replay buffer, and copies it
 * by value) and the consumer's release closes it. The bytes are never copied. */
static void payload_release(void *ctx)
{
    zmq_msg_close(ctx);
    free(ctx);
}

int kvr_zsub_payload_take(struct kvr_queue_payload *p, zmq_msg_t *m)
{
    zmq_msg_t *h = malloc(sizeof(*h));

    if (h == NULL)
        return -ENOMEM;
    zmq_msg_init(h);
    zmq_msg_move(h, m);
    p->data = zmq_msg_data(h);
    p->len = zmq_msg_size(h);
    p->release = payload_release;
    p->ctx = h;
    return 0;
}

static const char *const bad_names[KVR_ZSUB_BAD_COUNT] = {"frames", "seq", "topic",
                                                          "too_many_topics"};

const char *kvr_zsub_bad_name(enum kvr_zsub_bad r)
{
    return (unsigned)r < KVR_ZSUB_BAD_COUNT ? bad_names[r] : "?";
}

static uint64_t fnv64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Push one item into a shard queue; waits while it is full. false when closed. */
struct kvr_queue_msg *kvr_zsub_reserve_item(struct kvr_zsub *z, uint32_t shard)
{
    bool waited = false;
    struct kvr_queue_msg *it = kvr_queue_reserve(z->o.queues[shard], &waited);

    if (waited)
        KVR_CNT_INC(z->queue_waits);
    if (it != NULL) {
        it->topic = NULL;
        it->ctx = NULL;
        it->seq = 0;
        it->recv_ns = 0;
        it->pubid = 0;
        it->source = 0;
        it->gen = 0;
        it->ok = false;
        it->can_replay = false;
        it->payload = (struct kvr_queue_payload){0};
    }
    return it;
}

static bool topic_key_eq(const struct topic_rec *t, const char *override, const void *raw,
                         size_t len)
{
    if (t->rawlen != len || memcmp(t->raw, raw, len) != 0)
        return false;
    if ((t->override == NULL) != (override == NULL))
        return false;
    return override == NULL || strcmp(t->override, override) == 0;
}

/* The table again from z->tlist (after topics left it): same capacity, no tombstones. */
static void tab_rebuild(struct kvr_zsub *z)
{
    memset(z->tab, 0, z->tabcap * sizeof(*z->tab));
    for (size_t i = 0; i < z->ntopics; i++) {
        struct topic_rec *t = z->tlist[i];
        if (t->gone)
            continue;
        size_t j = t->hash & (z->tabcap - 1);
        while (z->tab[j] != NULL)
            j = (j + 1) & (z->tabcap - 1);
        z->tab[j] = t;
    }
}

static bool tab_insert(struct kvr_zsub *z, struct topic_rec *t)
{
    if ((z->ntopics + 1) * 2 > z->tabcap) {
        size_t nc = z->tabcap ? z->tabcap * 2 : 64;
        struct topic_rec **nt = calloc(nc, sizeof(*nt));
        if (nt == NULL)
            return false;
        for (size_t i = 0; i < z->tabcap; i++) {
            struct topic_rec *o = z->tab[i];
            if (o == NULL)
                continue;
            size_t j = o->hash & (nc - 1);
            while (nt[j] != NULL)
                j = (j + 1) & (nc - 1);
            nt[j] = o;
        }
        free(z->tab);
        z->tab = nt;
        z->tabcap = nc;
    }
    size_t j = t->hash & (z->tabcap - 1);
    while (z->tab[j] != NULL)
        j = (j + 1) & (z->tabcap - 1);
    z->tab[j] = t;
    return true;
}

/* Resolves (source, topic bytes) to an interned record; NULL with *bad set when rejected. */
static struct topic_rec *intern_topic(struct kvr_zsub *z, struct source *s, const void *raw,
                                      size_t len, enum kvr_zsub_bad *bad)
{
    const char *override = s->pod_cfg;
    uint64_t h = 1469598103934665603ull;
    struct topic_rec *t;
    const char *pod, *model;
    size_t plen, mlen;
    struct kvr_zsub_topic_parts kt;
    uint32_t gen;

    if (s->last_topic != NULL && topic_key_eq(s->last_topic, override, raw, len))
        return s->last_topic;
    if (override != NULL)
        h = fnv64(h, override, strlen(override) + 1);
    h = fnv64(h, raw, len);
    if (z->tabcap > 0) {
        for (size_t j = h & (z->tabcap - 1); (t = z->tab[j]) != NULL; j = (j + 1) & (z->tabcap - 1))
            if (t->hash == h && topic_key_eq(t, override, raw, len))
                goto found;
    }
    /* New topic: work out pod and model (the filter's generation first: a change after this
     * read is seen at the topic's next message). */
    gen = kvr_modelfilter_gen(z->o.models);
    if (override == NULL) {
        if (kvr_zsub_topic_split(raw, len, &kt) != 0) {
            *bad = KVR_ZSUB_BAD_TOPIC;
            return NULL;
        }
        pod = kt.pod;
        plen = kt.pod_len;
        model = kt.model;
        mlen = kt.model_len;
    } else {
        pod = s->pod;
        plen = strlen(s->pod);
        if (s->model != NULL) {
            model = s->model;
            mlen = strlen(model);
        } else if (kvr_zsub_topic_split(raw, len, &kt) == 0) {
            model = kt.model;
            mlen = kt.model_len;
        } else if (len > 0) {
            model = raw;
            mlen = len;
        } else {
            model = DEFAULT_MODEL;
            mlen = strlen(DEFAULT_MODEL);
        }
    }
    if (plen == 0 || plen > NAME_MAX_LEN || mlen == 0 || mlen > NAME_MAX_LEN ||
        memchr(pod, '\0', plen) != NULL || memchr(model, '\0', mlen) != NULL) {
        *bad = KVR_ZSUB_BAD_TOPIC;
        return NULL;
    }
    /* [events] models: a model this instance does not hold is not even interned (its
     * topics would fill max_topics and never be released by a writer). */
    if (!kvr_modelfilter_holds(z->o.models, model, mlen)) {
        *bad = SKIP_MODEL;
        return NULL;
    }
    if (z->ntopics >= z->o.max_topics) {
        *bad = KVR_ZSUB_BAD_TOO_MANY_TOPICS;
        return NULL;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL ||
        !kvr_zsub_grow((void **)&z->tlist, &z->captlist, z->ntopics + 1, sizeof(*z->tlist))) {
        free(t);
        *bad = KVR_ZSUB_BAD_TOO_MANY_TOPICS;
        return NULL;
    }
    t->hash = h;
    t->pub.pod = kvr_zsub_xstrndup(pod, plen);
    t->pub.model = kvr_zsub_xstrndup(model, mlen);
    t->raw = malloc(len ? len : 1);
    /* The override string is kept alive by the record itself (sources come and go). */
    t->override = override != NULL ? strdup(override) : NULL;
    if (t->raw != NULL) {
        memcpy(t->raw, raw, len);
        t->rawlen = len;
    }
    if (t->pub.pod == NULL || t->pub.model == NULL || t->raw == NULL ||
        (override != NULL && t->override == NULL) || !tab_insert(z, t)) {
        free((char *)t->pub.pod);
        free((char *)t->pub.model);
        free(t->raw);
        free((char *)t->override);
        free(t);
        *bad = KVR_ZSUB_BAD_TOO_MANY_TOPICS;
        return NULL;
    }
    t->pub.shard = kvr_queue_shard(t->pub.pod, plen, z->o.nshards);
    t->pub.id = z->next_topic_id++;
    t->pod_host = kvr_zsub_pod_is_host(t->pub.pod, plen);
    t->models_gen = gen;
    t->tidx = z->ntopics;
    z->tlist[z->ntopics++] = t;
    KVR_CNT_SET(z->ntopics_pub, z->ntopics);
    kvr_log_debug("events: new topic pod=%s model=%s shard=%u", t->pub.pod, t->pub.model,
                  t->pub.shard);
found:
    if (s->replay_pod && !t->pod_host && !t->unaddressable) {
        /* Counted and told once per topic (topics interleave on a bind socket). */
        t->unaddressable = true;
        KVR_CNT_INC(z->replay_unaddressable);
        kvr_log_limited(&z->rl_replay, KVR_LOG_WARN,
                        "events: pod id '%.64s' is not a host name or address: its streams "
                        "get no replay through %s",
                        t->pub.pod, s->replay);
    }
    s->last_topic = t;
    /* Remember which topics a connect source delivered (for its disconnect purge). */
    if (!s->bind) {
        size_t i;
        for (i = 0; i < s->ntopics; i++)
            if (s->topics[i] == t)
                break;
        if (i == s->ntopics &&
            kvr_zsub_grow((void **)&s->topics, &s->captopics, s->ntopics + 1, sizeof(*s->topics)))
            s->topics[s->ntopics++] = t;
    }
    return t;
}

/* ---- forgetting topics -------------------------------------------------------------- *
 * Topics are bounded by max_topics live ones, not ever seen: the consumer (ingest's writer
 * that owns the topic) releases a topic when its pod is deleted or forgotten
 * (kvr_zsub_forget_topic, any thread); the receive thread then takes it out of the table,
 * the sources' lists (no later disconnect PURGE names it) and tlist, and queues one FORGET
 * item for it into its shard's queue, behind every item already queued for it. The item
 * hands the record over: the consumer frees it (the payload release) once nothing of its own
 * refers to it any more (replays it asked for have ended). A later message with the same
 * topic interns a new record. Each topic is released at most once by its consumer. */

void kvr_zsub_topic_free(void *rec)
{
    struct topic_rec *t = rec;
    if (t == NULL)
        return;
    free((char *)t->pub.pod);
    free((char *)t->pub.model);
    free((char *)t->override);
    free(t->raw);
    free(t);
}

int kvr_zsub_forget_topic(struct kvr_zsub *z, const struct kvr_queue_topic *t)
{
    struct forget_req *r = malloc(sizeof(*r));
    uint64_t one = 1;
    ssize_t w;

    if (r == NULL)
        return -ENOMEM;
    r->t = (struct topic_rec *)(void *)((char *)(uintptr_t)t - offsetof(struct topic_rec, pub));
    pthread_mutex_lock(&z->cmu);
    if (!z->accepting) {
        pthread_mutex_unlock(&z->cmu);
        free(r);
        return -ESHUTDOWN;
    }
    r->next = z->fgt_head;
    z->fgt_head = r;
    pthread_mutex_unlock(&z->cmu);
    w = write(z->efd, &one, sizeof(one));
    (void)w;
    return 0;
}

static void drop_gone(struct topic_rec **list, size_t *n, struct topic_rec **last)
{
    size_t k = 0;
    for (size_t i = 0; i < *n; i++)
        if (!list[i]->gone)
            list[k++] = list[i];
    *n = k;
    if (*last != NULL && (*last)->gone)
        *last = NULL;
}

void kvr_zsub_forget_run(struct kvr_zsub *z, struct forget_req *list)
{
    size_t n = 0;

    for (struct forget_req *r = list; r != NULL; r = r->next)
        if (!r->t->gone) {
            r->t->gone = true;
            n++;
        } else {
            r->t = NULL; /* posted twice: handled once */
        }
    if (n == 0)
        goto out;
    pthread_mutex_lock(&z->lmu);
    for (size_t i = 0; i < z->nsrcs; i++)
        drop_gone(z->srcs[i]->topics, &z->srcs[i]->ntopics, &z->srcs[i]->last_topic);
    pthread_mutex_unlock(&z->lmu);
    for (size_t i = 0; i < z->nghosts; i++)
        drop_gone(z->ghosts[i]->topics, &z->ghosts[i]->ntopics, &z->ghosts[i]->last_topic);
    for (struct forget_req *r = list; r != NULL; r = r->next) {
        struct topic_rec *t = r->t;
        if (t == NULL)
            continue;
        struct topic_rec *last = z->tlist[--z->ntopics];
        z->tlist[t->tidx] = last;
        last->tidx = t->tidx;
    }
    tab_rebuild(z);
    for (struct forget_req *r = list; r != NULL; r = r->next) {
        struct topic_rec *t = r->t;
        if (t == NULL)
            continue;
        struct kvr_queue_msg *it = kvr_zsub_reserve_item(z, t->pub.shard);
        if (it == NULL) { /* closing: keep it for destroy (out of the table) */
            t->tidx = z->ntopics;
            z->tlist[z->ntopics++] = t;
            continue;
        }
        kvr_log_debug("events: topic pod=%s model=%s forgotten", t->pub.pod, t->pub.model);
        it->kind = KVR_QUEUE_FORGET;
        it->topic = &t->pub;
        it->payload = (struct kvr_queue_payload){.release = kvr_zsub_topic_free, .ctx = t};
        KVR_CNT_INC(z->topics_forgotten);
        kvr_queue_commit(z->o.queues[t->pub.shard]); /* t is the consumer's from here on */
    }
    KVR_CNT_SET(z->ntopics_pub, z->ntopics);
out:
    while (list != NULL) {
        struct forget_req *r = list;
        list = r->next;
        free(r);
    }
}

/* ---- forward ------------------------------------------------------------------------ *
 * An accepted live message goes out on the forward XPUB as it came: each frame a
 * zmq_msg_copy (libzmq shares the bytes of a large message by reference count, so nothing
 * is copied; a small one is copied inline), libzmq fans it out to the replicas. Never
 * blocks: ZMQ_XPUB_NODROP makes a full subscriber queue an EAGAIN on the first frame, and
 * the message is then dropped (for every subscriber) and counted. The HWM check is per whole
 * message (a pipe counts complete messages), so once the first frame went the others go. */
static void forward(struct kvr_zsub *z, zmq_msg_t f[3])
{
    for (int i = 0; i < 3; i++) {
        zmq_msg_t c;
        zmq_msg_init(&c);
        if (zmq_msg_copy(&c, &f[i]) != 0 ||
            zmq_msg_send(&c, z->fwd, ZMQ_DONTWAIT | (i < 2 ? ZMQ_SNDMORE : 0)) < 0) {
            zmq_msg_close(&c);
            KVR_CNT_INC(z->forward_dropped);
            if (i > 0) /* cannot happen (see above); the replicas would see a cut message */
                kvr_log_limited(&z->rl_frames, KVR_LOG_WARN,
                                "events: forward: frame %d of a message not sent: %s", i,
                                zmq_strerror(errno));
            return;
        }
    }
    KVR_CNT_INC(z->forwarded);
}

void kvr_zsub_read_fwd(struct kvr_zsub *z)
{
    for (int k = 0; k < RECV_BURST; k++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z->fwd, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        /* XPUB delivers (un)subscriptions: 0x01 + prefix, 0x00 + prefix. */
        if (zmq_msg_size(&m) >= 1 && ((const unsigned char *)zmq_msg_data(&m))[0] == 1)
            KVR_CNT_INC(z->forward_subscriptions);
        zmq_msg_close(&m);
    }
}

static void count_bad(struct kvr_zsub *z, struct source *s, enum kvr_zsub_bad r, size_t nframes)
{
    KVR_CNT_INC(z->bad[r]);
    kvr_log_limited(&z->rl_frames, KVR_LOG_WARN, "events: dropped message from %s: bad %s (%zu frames)",
                    s->bind ? s->bound : s->endpoint, kvr_zsub_bad_name(r), nframes);
}

/* An interned topic's model is held by [events] models (judged again after a reload). */
static bool models_held(struct kvr_zsub *z, struct topic_rec *t)
{
    uint32_t gen = kvr_modelfilter_gen(z->o.models);

    if (t->models_gen != gen) {
        t->models_gen = gen;
        t->skip_model = !kvr_modelfilter_holds(z->o.models, t->pub.model, strlen(t->pub.model));
    }
    return !t->skip_model;
}

/* Reads up to RECV_BURST messages from a SUB and hands them off. */
void kvr_zsub_read_sub(struct kvr_zsub *z, struct source *s)
{
    for (int k = 0; k < RECV_BURST; k++) {
        zmq_msg_t f[3];
        size_t n = 0;
        int more = 1;
        uint64_t seq;
        const void *pid;
        size_t pid_len;
        enum kvr_zsub_bad bad;
        struct topic_rec *t;
        struct kvr_queue_msg *it;
        struct kvr_queue_payload pl;

        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], s->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[0]);
            return;
        }
        n = 1;
        more = zmq_msg_more(&f[0]);
        while (more) {
            zmq_msg_t *m = n < 3 ? &f[n] : NULL;
            zmq_msg_t extra;
            if (m == NULL)
                m = &extra;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, s->sock, 0) < 0) {
                zmq_msg_close(m);
                break;
            }
            more = zmq_msg_more(m);
            if (m == &extra)
                zmq_msg_close(m);
            n++;
        }
        if (n != 3) {
            count_bad(z, s, KVR_ZSUB_BAD_FRAMES, n);
            goto drop;
        }
        if (kvr_zsub_seq_id(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &seq, &pid,
                            &pid_len) != 0) {
            count_bad(z, s, KVR_ZSUB_BAD_SEQ, n);
            goto drop;
        }
        /* Admission before anything is queued: a spoofed topic never reaches a stream. */
        if (!kvr_zsub_pod_admitted(z, s, &f[0]))
            goto drop;
        t = intern_topic(z, s, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), &bad);
        if (t == NULL || !models_held(z, t)) {
            if (t == NULL && (int)bad != SKIP_MODEL)
                count_bad(z, s, bad, n);
            else
                KVR_CNT_INC(z->skipped[KVR_ZSUB_SKIP_MODEL]);
            goto drop;
        }
        if (z->fwd != NULL)
            forward(z, f);
        if (kvr_zsub_payload_take(&pl, &f[2]) != 0) {
            kvr_log_limited(&z->rl_frames, KVR_LOG_WARN,
                            "events: out of memory: dropped a message from %s",
                            s->bind ? s->bound : s->endpoint);
            goto drop;
        }
        it = kvr_zsub_reserve_item(z, t->pub.shard);
        if (it == NULL) {
            kvr_queue_payload_release(&pl);
            goto drop; /* shutting down */
        }
        it->kind = KVR_QUEUE_LIVE;
        it->topic = &t->pub;
        it->seq = seq;
        it->pubid = pid_len > 0 ? kvr_queue_pubid(pid, pid_len) : 0;
        it->recv_ns = kvr_now_ns();
        it->source = s->id;
        /* A {pod} template cannot name the ROUTER of a pod id that is no host. */
        it->can_replay = s->replay != NULL && (!s->replay_pod || t->pod_host);
        it->payload = pl;
        KVR_CNT_INC(z->messages);
        KVR_CNT_ADD(z->bytes, pl.len);
        kvr_queue_commit(z->o.queues[t->pub.shard]);
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        zmq_msg_close(&f[2]);
        continue;
drop:
        for (size_t i = 0; i < n && i < 3; i++)
            zmq_msg_close(&f[i]);
    }
}

void kvr_zsub_read_monitor(struct kvr_zsub *z, struct source *s)
{
    for (;;) {
        zmq_msg_t a, b;
        uint16_t ev;

        zmq_msg_init(&a);
        if (zmq_msg_recv(&a, s->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&a);
            return;
        }
        zmq_msg_init(&b);
        if (zmq_msg_more(&a))
            zmq_msg_recv(&b, s->mon, 0);
        if (zmq_msg_size(&a) >= 6 && s->bind) {
            uint32_t value;
            memcpy(&ev, zmq_msg_data(&a), sizeof(ev));
            memcpy(&value, (const char *)zmq_msg_data(&a) + 2, sizeof(value));
            kvr_zsub_bind_monitor_event(z, s, ev, value);
        } else if (zmq_msg_size(&a) >= 6) {
            memcpy(&ev, zmq_msg_data(&a), sizeof(ev));
            if (ev == ZMQ_EVENT_CONNECTED) {
                atomic_store(&s->connected, true);
                s->disc_since = 0;
                s->purged = false;
                KVR_CNT_INC(z->connects);
                kvr_log_info("events: connected to %s", s->endpoint);
            } else if (ev == ZMQ_EVENT_DISCONNECTED) {
                atomic_store(&s->connected, false);
                if (s->disc_since == 0)
                    s->disc_since = kvr_now_ms();
                KVR_CNT_INC(z->disconnects);
                kvr_log_info("events: disconnected from %s", s->endpoint);
            }
        }
        zmq_msg_close(&a);
        zmq_msg_close(&b);
    }
}

