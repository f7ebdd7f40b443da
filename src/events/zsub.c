/* zsub.c — ZeroMQ receive thread: SUB sockets, frame checks, topic interning, sharded
 * hand-off, replay DEALERs, connection monitors, runtime endpoint changes.
 *
 * Sockets: one SUB per configured endpoint. A bound SUB subscribes to the configured prefix
 * (default "kv@") and tells engines apart by topic. A connected SUB talks to one engine PUB
 * (one DP rank): it has its own monitor (inproc PAIR fed by zmq_socket_monitor) for
 * CONNECTED/DISCONNECTED, its own optional replay endpoint, and, with a pod override, a
 * subscription to everything (the engine's topic may be empty) with the pod (and model, for
 * "POD@MODEL") taken from the override.
 *
 * Thread model: before start the creating thread sets sockets up; kvr_zsub_start() hands them
 * to the receive thread (pthread_create is the full fence ZeroMQ asks for when migrating
 * sockets). From then on only the receive thread touches sockets. Other threads post
 * commands (connect, disconnect) and replay requests on lists under `cmu` and write the
 * eventfd the receive thread polls; connect/disconnect callers wait for completion on
 * `ccond`. When the thread exits it stops accepting (under `cmu`) and fails what is left,
 * so no caller waits forever.
 *
 * Hand-off: a message is 3 frames [topic, be64 seq, payload]. The payload zmq_msg_t is moved
 * to a small heap handle behind a plain (data, len, release, ctx) payload in the writer
 * queue slot (the bytes are not copied; the writer's release closes it). Topics are interned
 * per (pod override, topic bytes): the record gives pod, model and shard =
 * FNV-1a-32(pod) % nshards without re-parsing. When a writer queue is full the thread waits
 * (counted): nothing is dropped.
 *
 * Replays: requests queue FIFO; at most max_concurrent_replays run, each on its own DEALER
 * polled with the SUBs. Request [empty, be64 start]; replies in either era are parsed with
 * kvr_zsub_replay_reply(); each batch goes to the requester's queue as a REPLAY item, the
 * end marker (or a failure: timeout, bad reply, source gone)
 * as REPLAY_END. Contiguity is the requester's business (stream.c). replay_timeout is a
 * deadline for the whole replay (not an inactivity limit): a stream waits for its replay, and
 * buffers its live batches meanwhile, for at most that long.
 *
 * Disconnect purge: a connected source that stays disconnected for purge_after_disconnect
 * (or is removed, then waits that long as a "ghost") gets one PURGE item per topic it
 * delivered, into that topic's writer queue.
 *
 * Admission (bind sockets): a ZAP handler polled by this loop, the pod == peer check on
 * the live path, a monitor per bind socket that counts publisher connections and the ones
 * ZeroMQ drops (oversized messages); see zsub_auth.c and docs/security.md.
 *
 * Files: this one holds the lifecycle, sockets and endpoints, the control list, timers and
 * the receive loop; zsub_recv.c the live path (frames → items, topics, monitors);
 * zsub_replay.c the replay client; zsub_auth.c admission (ZAP, CURVE, pod check, bind
 * monitors, key files, -t's endpoint checks); zsub_frame.c the pure frame parsers. They
 * share zsub_int.h.
 */
#include "events/zsub.h"
#include "events/zsub_int.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "core/base.h"
#include "core/log.h"

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer builds only. libzmq is not instrumented: its I/O thread fills receive
 * buffers and hands them over with atomics TSan cannot see, so every read of a received
 * frame would be reported as a race. Ignore what libzmq's own code does; ours stays checked.
 * With CURVE, libzmq's I/O thread decrypts frames in place through libsodium, whose
 * memmove TSan intercepts: ignore libsodium's calls for the same reason. And zsub_auth.c's
 * copies of fds libzmq accepted (kvr_zsub_fd_copy: see there).
 * (Any binary linking zsub gets this; TSAN_OPTIONS=suppressions=... still adds to it.) */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so.5\n"
           "called_from_lib:libsodium.so.23\n"
           "race:kvr_zsub_fd_copy\n"
           "race:kvr_zsub_fd_copy_close\n"
           "race:kvr_zsub_fd_peek\n";
}
#endif

char *kvr_zsub_xstrndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static char *xstrdup_opt(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}

bool kvr_zsub_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    size_t nc;
    void *p;

    if (need <= *cap)
        return true;
    nc = *cap ? *cap * 2 : 8;
    while (nc < need)
        nc *= 2;
    p = realloc(*arr, nc * elem);
    if (p == NULL)
        return false;
    *arr = p;
    *cap = nc;
    return true;
}

/* ---- create / destroy ----------------------------------------------------------------- */

int kvr_zsub_create(const struct kvr_zsub_opts *o, struct kvr_zsub **out, struct kvr_err *err)
{
    struct kvr_zsub *z;

    if (o->nshards == 0 || o->queues == NULL || o->max_concurrent_replays == 0)
        return kvr_err_set(err, -EINVAL, "zsub: bad options");
    if (o->bind_replay != NULL) {
        struct kvr_err e;
        int rc = kvr_zsub_template_check(o->bind_replay, &e);
        if (rc != 0)
            return kvr_err_set(err, rc, "[events] bind_replay %s: %s", o->bind_replay, e.msg);
    }
    z = calloc(1, sizeof(*z));
    if (z == NULL)
        return kvr_err_set(err, -ENOMEM, "zsub: out of memory");
    z->o = *o;
    z->queues = calloc(o->nshards, sizeof(*z->queues));
    if (z->queues != NULL)
        memcpy(z->queues, o->queues, o->nshards * sizeof(*z->queues));
    z->o.queues = z->queues;
    z->subscribe = strdup(o->subscribe != NULL ? o->subscribe : "kv@");
    z->o.subscribe = z->subscribe;
    z->bind_replay = xstrdup_opt(o->bind_replay);
    z->o.bind_replay = z->bind_replay;
    if (z->o.max_topics == 0)
        z->o.max_topics = 65536;
    z->active = calloc(o->max_concurrent_replays, sizeof(*z->active));
    z->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    z->ctx = zmq_ctx_new();
    if (z->subscribe == NULL || z->active == NULL || z->efd < 0 || z->ctx == NULL ||
        z->queues == NULL || (o->bind_replay != NULL && z->bind_replay == NULL)) {
        int rc = z->efd < 0 ? -errno : -ENOMEM;
        if (z->ctx != NULL)
            zmq_ctx_term(z->ctx);
        if (z->efd >= 0)
            close(z->efd);
        free(z->active);
        free(z->queues);
        free(z->subscribe);
        free(z->bind_replay);
        free(z);
        return kvr_err_set(err, rc, "zsub: cannot create context: %s", strerror(-rc));
    }
    zmq_ctx_set(z->ctx, ZMQ_BLOCKY, 0);
    pthread_mutex_init(&z->lmu, NULL);
    pthread_mutex_init(&z->cmu, NULL);
    pthread_cond_init(&z->ccond, NULL);
    z->accepting = false;
    kvr_ratelimit_init(&z->rl_frames, o->ratelimit_ms, o->ratelimit_burst);
    kvr_ratelimit_init(&z->rl_replay, o->ratelimit_ms, o->ratelimit_burst);
    {
        int rc = kvr_zsub_auth_init(z, err);
        if (rc != 0) {
            kvr_zsub_destroy(z);
            return rc;
        }
    }
    *out = z;
    return 0;
}

static void source_close_sockets(struct source *s)
{
    kvr_zsub_conns_close(s);
    if (s->mon != NULL) {
        zmq_socket_monitor(s->sock, NULL, 0);
        zmq_close(s->mon);
        s->mon = NULL;
    }
    if (s->sock != NULL) {
        zmq_close(s->sock);
        s->sock = NULL;
    }
}

static void source_free(struct source *s)
{
    if (s == NULL)
        return;
    source_close_sockets(s);
    free(s->endpoint);
    free(s->bound);
    free(s->replay);
    free(s->pod_cfg);
    free(s->pod);
    free(s->model);
    free(s->topics);
    free(s);
}

void kvr_zsub_destroy(struct kvr_zsub *z)
{
    if (z == NULL)
        return;
    kvr_zsub_stop(z);
    for (size_t i = 0; i < z->nactive; i++)
        kvr_zsub_replay_free(z->active[i]);
    while (z->pend_head != NULL) {
        struct replay *r = z->pend_head;
        z->pend_head = r->next;
        kvr_zsub_replay_free(r);
    }
    while (z->req_head != NULL) {
        struct replay *r = z->req_head;
        z->req_head = r->next;
        kvr_zsub_replay_free(r);
    }
    for (size_t i = 0; i < z->nsrcs; i++)
        source_free(z->srcs[i]);
    for (size_t i = 0; i < z->nghosts; i++)
        source_free(z->ghosts[i]);
    if (z->fwd != NULL)
        zmq_close(z->fwd);
    free(z->fwd_bound);
    kvr_zsub_auth_deinit(z);
    zmq_ctx_term(z->ctx);
    for (size_t i = 0; i < z->ntopics; i++)
        kvr_zsub_topic_free(z->tlist[i]);
    while (z->fgt_head != NULL) {
        struct forget_req *r = z->fgt_head;
        z->fgt_head = r->next;
        free(r);
    }
    free(z->tlist);
    free(z->tab);
    free(z->srcs);
    free(z->ghosts);
    free(z->active);
    free(z->items);
    free(z->slots);
    close(z->efd);
    pthread_cond_destroy(&z->ccond);
    pthread_mutex_destroy(&z->cmu);
    pthread_mutex_destroy(&z->lmu);
    free(z->subscribe);
    free(z->bind_replay);
    free(z->queues);
    free(z);
}

/* ---- sockets ------------------------------------------------------------------------ */

int kvr_zsub_set_int(void *s, int opt, int64_t v)
{
    int iv = v > INT32_MAX ? INT32_MAX : (int)v;
    return zmq_setsockopt(s, opt, &iv, sizeof(iv));
}

/* IPv6 only when the endpoint names an IPv6 address: with ZMQ_IPV6 on, IPv4 binds would be
 * reported as tcp://[::ffff:a.b.c.d]:P, which IPv4-only peers cannot dial. */
void kvr_zsub_set_ipv6_for(void *s, const char *endpoint)
{
    if (endpoint != NULL && strchr(endpoint, '[') != NULL)
        kvr_zsub_set_int(s, ZMQ_IPV6, 1);
}

static void *sub_socket(struct kvr_zsub *z, bool subscribe_all, const char *endpoint)
{
    void *s = zmq_socket(z->ctx, ZMQ_SUB);
    int64_t maxmsg = z->o.max_message_size > 0 ? z->o.max_message_size : -1;
    const char *sub = subscribe_all ? "" : z->o.subscribe;

    if (s == NULL)
        return NULL;
    kvr_zsub_set_int(s, ZMQ_LINGER, 0);
    kvr_zsub_set_ipv6_for(s, endpoint);
    kvr_zsub_set_int(s, ZMQ_RCVHWM, z->o.rcvhwm);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (z->o.reconnect_ivl_ms > 0)
        kvr_zsub_set_int(s, ZMQ_RECONNECT_IVL, z->o.reconnect_ivl_ms);
    if (z->o.reconnect_ivl_max_ms > 0)
        kvr_zsub_set_int(s, ZMQ_RECONNECT_IVL_MAX, z->o.reconnect_ivl_max_ms);
    zmq_setsockopt(s, ZMQ_SUBSCRIBE, sub, strlen(sub));
    return s;
}

static int add_source(struct kvr_zsub *z, struct source *s)
{
    int rc = 0;

    pthread_mutex_lock(&z->lmu);
    if (!kvr_zsub_grow((void **)&z->srcs, &z->capsrcs, z->nsrcs + 1, sizeof(*z->srcs)))
        rc = -ENOMEM;
    else
        z->srcs[z->nsrcs++] = s;
    pthread_mutex_unlock(&z->lmu);
    z->dirty = true;
    return rc;
}

int kvr_zsub_bind(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err)
{
    struct source *s;
    char last[512];
    size_t len = sizeof(last);
    int rc;

    if (z->started)
        return kvr_err_set(err, -EBUSY, "events bind %s: only before start", endpoint);
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return kvr_err_set(err, -ENOMEM, "out of memory");
    s->bind = true;
    s->from_config = true;
    s->id = z->next_id++;
    s->endpoint = strdup(endpoint);
    s->sock = sub_socket(z, false, endpoint);
    s->replay = xstrdup_opt(z->bind_replay);
    s->replay_tmpl = s->replay != NULL;
    s->replay_pod = kvr_zsub_template_uses_pod(s->replay);
    if (s->endpoint == NULL || s->sock == NULL || (z->bind_replay != NULL && s->replay == NULL)) {
        rc = kvr_err_set(err, -ENOMEM, "events bind %s: cannot create socket", endpoint);
        goto fail;
    }
    if ((rc = kvr_zsub_auth_bind_opts(z, s->sock, err)) != 0) {
        char m[sizeof(err->msg)];
        snprintf(m, sizeof(m), "%s", err != NULL ? err->msg : "");
        kvr_err_set(err, rc, "events bind %s: %s", endpoint, m);
        goto fail;
    }
    /* Publisher connections: accepted, refused, closed, dropped (zsub_auth.c). */
    snprintf(last, sizeof(last), "inproc://kvr-zsub-mon-%p-%" PRIu32, (void *)z, s->id);
    if (zmq_socket_monitor(s->sock, last,
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0 ||
        (s->mon = zmq_socket(z->ctx, ZMQ_PAIR)) == NULL || zmq_connect(s->mon, last) != 0) {
        rc = kvr_err_set(err, -ENOMEM, "events bind %s: cannot monitor: %s", endpoint,
                         zmq_strerror(errno));
        goto fail;
    }
    kvr_zsub_set_int(s->mon, ZMQ_LINGER, 0);
    if (zmq_bind(s->sock, endpoint) != 0) {
        rc = -errno;
        kvr_err_set(err, rc, "events bind %s: %s", endpoint, zmq_strerror(errno));
        goto fail;
    }
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, last, &len) == 0)
        s->bound = strdup(last);
    else
        s->bound = strdup(endpoint);
    if (s->bound == NULL || (rc = add_source(z, s)) != 0) {
        rc = kvr_err_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    kvr_log_info("events: SUB bound on %s%s%s", s->bound, s->replay ? " replay=" : "",
                 s->replay ? s->replay : "");
    return 0;
fail:
    source_free(s);
    return rc;
}

/* ---- forward: an XPUB re-publishing what the SUBs accept -------------------------------- */

int kvr_zsub_forward(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err)
{
    char last[512];
    size_t len = sizeof(last);
    int one = 1, rc;
    void *s;

    if (z->started || z->fwd != NULL)
        return kvr_err_set(err, -EBUSY, "events forward %s: only once, before start", endpoint);
    s = zmq_socket(z->ctx, ZMQ_XPUB);
    if (s == NULL)
        return kvr_err_set(err, -ENOMEM, "events forward %s: cannot create socket: %s",
                           endpoint, zmq_strerror(errno));
    kvr_zsub_set_int(s, ZMQ_LINGER, 0);
    kvr_zsub_set_ipv6_for(s, endpoint);
    /* As deep as our own SUBs' queues; full → EAGAIN (counted) instead of a silent drop. */
    kvr_zsub_set_int(s, ZMQ_SNDHWM, z->o.rcvhwm);
    zmq_setsockopt(s, ZMQ_XPUB_NODROP, &one, sizeof(one));
    /* [events] allow applies to replicas too (the ZAP handler); not CURVE: kvrouterd's own
     * SUBs, the replicas, connect without it. */
    if ((rc = kvr_zsub_auth_zap_opt(z, s, err)) != 0) {
        char m[sizeof(err->msg)];
        snprintf(m, sizeof(m), "%s", err != NULL ? err->msg : "");
        kvr_err_set(err, rc, "events forward %s: %s", endpoint, m);
        zmq_close(s);
        return rc;
    }
    if (zmq_bind(s, endpoint) != 0) {
        rc = -errno;
        kvr_err_set(err, rc, "events forward %s: %s", endpoint, zmq_strerror(errno));
        zmq_close(s);
        return rc;
    }
    z->fwd_bound = strdup(zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, last, &len) == 0 ? last
                                                                                : endpoint);
    if (z->fwd_bound == NULL) {
        zmq_close(s);
        return kvr_err_set(err, -ENOMEM, "out of memory");
    }
    z->fwd = s;
    z->dirty = true;
    kvr_log_info("events: forwarding live messages on %s", z->fwd_bound);
    return 0;
}

const char *kvr_zsub_forward_bound(const struct kvr_zsub *z)
{
    return z->fwd_bound;
}

static struct source *find_connect(struct kvr_zsub *z, const char *endpoint)
{
    for (size_t i = 0; i < z->nsrcs; i++)
        if (!z->srcs[i]->bind && strcmp(z->srcs[i]->endpoint, endpoint) == 0)
            return z->srcs[i];
    return NULL;
}

static bool endpoint_syntax_ok(const char *ep)
{
    const char *p = strstr(ep, "://");
    return ep != NULL && p != NULL && p != ep && p[3] != '\0' && strlen(ep) < 512;
}

/* Creates and connects a source. Runs on the receive thread, or on the caller before start. */
static int do_connect(struct kvr_zsub *z, const char *endpoint, const char *replay,
                      const char *pod, bool from_config, struct kvr_err *err)
{
    struct source *s;
    char addr[96];
    int rc;

    if (endpoint == NULL || !endpoint_syntax_ok(endpoint))
        return kvr_err_set(err, -EINVAL, "bad endpoint '%s'", endpoint ? endpoint : "");
    if (replay != NULL && !endpoint_syntax_ok(replay))
        return kvr_err_set(err, -EINVAL, "bad replay endpoint '%s'", replay);
    if (replay != NULL && strchr(replay, '{') != NULL) {
        struct kvr_err e;
        if ((rc = kvr_zsub_template_check(replay, &e)) != 0)
            return kvr_err_set(err, rc, "bad replay template '%s': %s", replay, e.msg);
    }
    if (pod != NULL) {
        const char *at = strchr(pod, '@');
        size_t plen = at ? (size_t)(at - pod) : strlen(pod);
        if (plen == 0 || plen > NAME_MAX_LEN || (at && (at[1] == '\0' ||
                                                        strlen(at + 1) > NAME_MAX_LEN)))
            return kvr_err_set(err, -EINVAL, "bad pod override '%s' (POD or POD@MODEL)", pod);
    }
    pthread_mutex_lock(&z->lmu);
    s = find_connect(z, endpoint);
    pthread_mutex_unlock(&z->lmu);
    if (s != NULL)
        return kvr_err_set(err, -EEXIST, "endpoint %s already present", endpoint);

    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return kvr_err_set(err, -ENOMEM, "out of memory");
    s->from_config = from_config;
    s->endpoint = strdup(endpoint);
    s->replay = xstrdup_opt(replay);
    s->replay_tmpl = replay != NULL && strchr(replay, '{') != NULL;
    s->replay_pod = s->replay_tmpl && kvr_zsub_template_uses_pod(replay);
    s->pod_cfg = xstrdup_opt(pod);
    if (s->endpoint == NULL || (replay && !s->replay) || (pod && !s->pod_cfg)) {
        rc = kvr_err_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if (pod != NULL) {
        const char *at = strchr(pod, '@');
        s->pod = at ? kvr_zsub_xstrndup(pod, (size_t)(at - pod)) : strdup(pod);
        s->model = at ? strdup(at + 1) : NULL;
        if (s->pod == NULL || (at && s->model == NULL)) {
            rc = kvr_err_set(err, -ENOMEM, "out of memory");
            goto fail;
        }
    }
    s->sock = sub_socket(z, pod != NULL, endpoint);
    if (s->sock == NULL) {
        rc = kvr_err_set(err, -ENOMEM, "endpoint %s: cannot create socket", endpoint);
        goto fail;
    }
    /* ZMTP heartbeats notice a dead engine that never closed its TCP connection. */
    kvr_zsub_set_int(s->sock, ZMQ_HEARTBEAT_IVL, 1000);
    kvr_zsub_set_int(s->sock, ZMQ_HEARTBEAT_TIMEOUT, 5000);
    s->id = z->next_id++;
    snprintf(addr, sizeof(addr), "inproc://kvr-zsub-mon-%p-%" PRIu32, (void *)z, s->id);
    if (zmq_socket_monitor(s->sock, addr, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
        (s->mon = zmq_socket(z->ctx, ZMQ_PAIR)) == NULL || zmq_connect(s->mon, addr) != 0) {
        rc = kvr_err_set(err, -ENOMEM, "endpoint %s: cannot monitor: %s", endpoint,
                         zmq_strerror(errno));
        goto fail;
    }
    kvr_zsub_set_int(s->mon, ZMQ_LINGER, 0);
    if (zmq_connect(s->sock, endpoint) != 0) {
        rc = kvr_err_set(err, -EINVAL, "endpoint %s: %s", endpoint, zmq_strerror(errno));
        goto fail;
    }
    /* A new source cancels the pending purge of a removed one with the same endpoint. */
    for (size_t i = 0; i < z->nghosts; i++)
        if (strcmp(z->ghosts[i]->endpoint, endpoint) == 0)
            z->ghosts[i]->purge_at = 0;
    if ((rc = add_source(z, s)) != 0) {
        kvr_err_set(err, rc, "out of memory");
        goto fail;
    }
    kvr_log_info("events: SUB connecting to %s%s%s%s%s", endpoint, replay ? " replay=" : "",
                 replay ? replay : "", pod ? " pod=" : "", pod ? pod : "");
    return 0;
fail:
    source_free(s);
    return rc;
}

static void push_purge(struct kvr_zsub *z, struct source *s)
{
    for (size_t i = 0; i < s->ntopics; i++) {
        struct topic_rec *t = s->topics[i];
        struct kvr_queue_msg *it = kvr_zsub_reserve_item(z, t->pub.shard);
        if (it == NULL)
            return;
        it->kind = KVR_QUEUE_PURGE;
        it->topic = &t->pub;
        it->source = s->id;
        kvr_queue_commit(z->o.queues[t->pub.shard]);
    }
    KVR_CNT_INC(z->disconnect_purges);
    kvr_log_info("events: %s disconnected for %" PRId64 " ms: purging %zu topic(s) it fed",
                 s->endpoint, z->o.purge_after_disconnect_ms, s->ntopics);
}

static int do_disconnect(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err)
{
    struct source *s = NULL;
    size_t i;

    pthread_mutex_lock(&z->lmu);
    for (i = 0; i < z->nsrcs; i++) {
        if (!z->srcs[i]->bind && strcmp(z->srcs[i]->endpoint, endpoint) == 0) {
            s = z->srcs[i];
            memmove(&z->srcs[i], &z->srcs[i + 1], (z->nsrcs - i - 1) * sizeof(*z->srcs));
            z->nsrcs--;
            break;
        }
    }
    pthread_mutex_unlock(&z->lmu);
    if (s == NULL)
        return kvr_err_set(err, -ENOENT, "endpoint %s not present", endpoint);
    z->dirty = true;
    /* Replays through this source cannot finish any more. */
    for (i = 0; i < z->nactive;) {
        if (z->active[i]->src == s) {
            struct replay *r = z->active[i];
            kvr_zsub_end_replay(z, r, false);
            kvr_zsub_replay_free(r);
            z->active[i] = z->active[--z->nactive];
            KVR_CNT_SET(z->replays_active, z->nactive);
        } else {
            i++;
        }
    }
    source_close_sockets(s);
    atomic_store(&s->connected, false);
    if (z->o.purge_after_disconnect_ms > 0 && s->ntopics > 0 &&
        kvr_zsub_grow((void **)&z->ghosts, &z->capghosts, z->nghosts + 1, sizeof(*z->ghosts))) {
        s->purge_at = kvr_now_ms() + z->o.purge_after_disconnect_ms;
        z->ghosts[z->nghosts++] = s;
    } else {
        source_free(s);
    }
    kvr_log_info("events: endpoint %s removed", endpoint);
    return 0;
}

/* Posts a command to the receive thread and waits for it. */
static int post_cmd(struct kvr_zsub *z, struct cmd *c)
{
    uint64_t one = 1;
    ssize_t w;

    pthread_mutex_lock(&z->cmu);
    if (!z->accepting) {
        pthread_mutex_unlock(&z->cmu);
        return 1; /* not running: caller executes it itself */
    }
    c->next = z->cmds;
    z->cmds = c;
    w = write(z->efd, &one, sizeof(one));
    (void)w;
    while (!c->done)
        pthread_cond_wait(&z->ccond, &z->cmu);
    pthread_mutex_unlock(&z->cmu);
    return 0;
}

int kvr_zsub_connect(struct kvr_zsub *z, const char *endpoint, const char *replay,
                     const char *pod, bool from_config, struct kvr_err *err)
{
    struct cmd c = {.type = CMD_CONNECT, .endpoint = endpoint, .replay = replay, .pod = pod,
                    .from_config = from_config, .err = err};

    if (post_cmd(z, &c) == 0)
        return c.rc;
    /* Not running: only the owning thread calls us (before start / after stop). */
    return do_connect(z, endpoint, replay, pod, from_config, err);
}

int kvr_zsub_disconnect(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err)
{
    struct cmd c = {.type = CMD_DISCONNECT, .endpoint = endpoint, .err = err};

    if (endpoint == NULL)
        return kvr_err_set(err, -EINVAL, "no endpoint");
    if (post_cmd(z, &c) == 0)
        return c.rc;
    return do_disconnect(z, endpoint, err);
}

int kvr_zsub_endpoint_add(struct kvr_zsub *z, const char *endpoint, const char *replay,
                          const char *pod, struct kvr_err *err)
{
    if (endpoint == NULL || *endpoint == '\0')
        return kvr_err_set(err, -EINVAL, "endpoint is required");
    if (replay != NULL && *replay == '\0')
        replay = NULL;
    if (pod != NULL && *pod == '\0')
        pod = NULL;
    return kvr_zsub_connect(z, endpoint, replay, pod, false, err);
}

int kvr_zsub_endpoint_del(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err)
{
    if (endpoint == NULL || *endpoint == '\0')
        return kvr_err_set(err, -EINVAL, "endpoint is required");
    return kvr_zsub_disconnect(z, endpoint, err);
}

size_t kvr_zsub_bound(const struct kvr_zsub *cz, const char **eps, size_t cap)
{
    struct kvr_zsub *z = (struct kvr_zsub *)cz;
    size_t n = 0;

    pthread_mutex_lock(&z->lmu);
    for (size_t i = 0; i < z->nsrcs; i++) {
        if (!z->srcs[i]->bind)
            continue;
        if (n < cap)
            eps[n] = z->srcs[i]->bound;
        n++;
    }
    pthread_mutex_unlock(&z->lmu);
    return n < cap ? n : cap;
}

void kvr_zsub_endpoints(struct kvr_zsub *z,
                        void (*cb)(const struct kvr_zsub_endpoint *e, void *arg), void *arg)
{
    pthread_mutex_lock(&z->lmu);
    for (size_t i = 0; i < z->nsrcs; i++) {
        struct source *s = z->srcs[i];
        struct kvr_zsub_endpoint e;
        if (s->bind)
            continue;
        e.endpoint = s->endpoint;
        e.replay = s->replay;
        e.pod = s->pod_cfg;
        e.connected = atomic_load(&s->connected);
        e.from_config = s->from_config;
        cb(&e, arg);
    }
    pthread_mutex_unlock(&z->lmu);
}

static void handle_control(struct kvr_zsub *z)
{
    uint64_t v;
    struct cmd *cmds;
    struct replay *reqs;
    struct forget_req *fgt;
    ssize_t rd = read(z->efd, &v, sizeof(v));
    (void)rd;

    pthread_mutex_lock(&z->cmu);
    cmds = z->cmds;
    z->cmds = NULL;
    reqs = z->req_head;
    z->req_head = z->req_tail = NULL;
    fgt = z->fgt_head;
    z->fgt_head = NULL;
    pthread_mutex_unlock(&z->cmu);
    kvr_zsub_forget_run(z, fgt); /* topics the consumer released (zsub_recv.c) */

    /* Commands were pushed LIFO; run them in posting order. */
    {
        struct cmd *rev = NULL;
        while (cmds != NULL) {
            struct cmd *n = cmds->next;
            cmds->next = rev;
            rev = cmds;
            cmds = n;
        }
        cmds = rev;
    }
    while (cmds != NULL) {
        struct cmd *c = cmds;
        cmds = c->next;
        if (c->type == CMD_CONNECT)
            c->rc = do_connect(z, c->endpoint, c->replay, c->pod, c->from_config, c->err);
        else
            c->rc = do_disconnect(z, c->endpoint, c->err);
        pthread_mutex_lock(&z->cmu);
        c->done = true;
        pthread_cond_broadcast(&z->ccond);
        pthread_mutex_unlock(&z->cmu);
    }
    while (reqs != NULL) {
        struct replay *r = reqs;
        reqs = r->next;
        r->next = NULL;
        if (z->pend_tail != NULL)
            z->pend_tail->next = r;
        else
            z->pend_head = r;
        z->pend_tail = r;
        KVR_CNT_INC(z->replays_pending);
    }
}

static void rebuild_items(struct kvr_zsub *z)
{
    size_t need = 3 + 2 * z->nsrcs + z->nactive;

    if (!kvr_zsub_grow((void **)&z->items, &z->capitems, need, sizeof(*z->items)) ||
        (z->slots = realloc(z->slots, z->capitems * sizeof(*z->slots))) == NULL) {
        kvr_log_error("events: out of memory building the poll set");
        abort();
    }
    z->nitems = 0;
#define ADD_ITEM(sock_, fd_, kind_, ptr_)                                                   \
    do {                                                                                    \
        z->items[z->nitems] = (zmq_pollitem_t){.socket = (sock_), .fd = (fd_),              \
                                               .events = ZMQ_POLLIN};                       \
        z->slots[z->nitems] = (struct pslot){(kind_), (ptr_)};                              \
        z->nitems++;                                                                        \
    } while (0)
    ADD_ITEM(NULL, z->efd, PS_EVENT, NULL);
    if (z->zap != NULL)
        ADD_ITEM(z->zap, 0, PS_ZAP, NULL);
    if (z->fwd != NULL)
        ADD_ITEM(z->fwd, 0, PS_FWD, NULL);
    for (size_t i = 0; i < z->nsrcs; i++) {
        ADD_ITEM(z->srcs[i]->sock, 0, PS_SUB, z->srcs[i]);
        if (z->srcs[i]->mon != NULL)
            ADD_ITEM(z->srcs[i]->mon, 0, PS_MON, z->srcs[i]);
    }
    for (size_t i = 0; i < z->nactive; i++)
        ADD_ITEM(z->active[i]->dealer, 0, PS_DEALER, z->active[i]);
#undef ADD_ITEM
    z->dirty = false;
}

static int64_t timers(struct kvr_zsub *z)
{
    int64_t now = kvr_now_ms();
    int64_t next = now + 1000;

    for (size_t i = 0; i < z->nactive;) {
        struct replay *r = z->active[i];
        if (now >= r->deadline) {
            kvr_log_limited(&z->rl_replay, KVR_LOG_WARN,
                            "events: replay from %s timed out after %" PRIu64 " batches",
                            r->addr, r->batches);
            kvr_zsub_end_replay(z, r, false);
            kvr_zsub_remove_active(z, i);
            continue;
        }
        if (r->deadline < next)
            next = r->deadline;
        i++;
    }
    if (z->o.purge_after_disconnect_ms > 0) {
        for (size_t i = 0; i < z->nsrcs; i++) {
            struct source *s = z->srcs[i];
            int64_t due;
            if (s->disc_since == 0 || s->purged)
                continue;
            due = s->disc_since + z->o.purge_after_disconnect_ms;
            if (now >= due) {
                push_purge(z, s);
                s->purged = true;
            } else if (due < next) {
                next = due;
            }
        }
        for (size_t i = 0; i < z->nghosts;) {
            struct source *s = z->ghosts[i];
            if (s->purge_at != 0 && now < s->purge_at) {
                if (s->purge_at < next)
                    next = s->purge_at;
                i++;
                continue;
            }
            if (s->purge_at != 0)
                push_purge(z, s);
            source_free(s);
            z->ghosts[i] = z->ghosts[--z->nghosts];
        }
    }
    return next - now < 0 ? 0 : next - now;
}

static void *recv_main(void *arg)
{
    struct kvr_zsub *z = arg;
    int64_t timeout = 0;

    z->dirty = true;
    while (!atomic_load(&z->stop)) {
        int rc;

        if (z->dirty)
            rebuild_items(z);
        rc = zmq_poll(z->items, (int)z->nitems, (long)timeout);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            kvr_log_error("events: zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        for (size_t i = 0; rc > 0 && i < z->nitems && !z->dirty; i++) {
            if (!(z->items[i].revents & ZMQ_POLLIN))
                continue;
            switch (z->slots[i].kind) {
            case PS_SUB:
                kvr_zsub_read_sub(z, z->slots[i].ptr);
                break;
            case PS_MON:
                kvr_zsub_read_monitor(z, z->slots[i].ptr);
                break;
            case PS_ZAP:
                kvr_zsub_read_zap(z);
                break;
            case PS_FWD:
                kvr_zsub_read_fwd(z);
                break;
            case PS_DEALER: {
                for (size_t a = 0; a < z->nactive; a++) {
                    if (z->active[a] == z->slots[i].ptr) {
                        if (kvr_zsub_read_dealer(z, a))
                            kvr_zsub_remove_active(z, a);
                        break;
                    }
                }
                break;
            }
            default:
                break;
            }
        }
        /* The control fd last: sources may change (dirty) while handling it. */
        if (z->nitems > 0 && (z->items[0].revents & ZMQ_POLLIN))
            handle_control(z);
        kvr_zsub_start_replays(z);
        timeout = timers(z);
    }

    /* Intake ends here: close every socket (linger 0) so ports are released at stop(). */
    for (size_t i = 0; i < z->nactive; i++) {
        zmq_close(z->active[i]->dealer);
        z->active[i]->dealer = NULL;
    }
    pthread_mutex_lock(&z->lmu);
    for (size_t i = 0; i < z->nsrcs; i++) {
        source_close_sockets(z->srcs[i]);
        atomic_store(&z->srcs[i]->connected, false);
    }
    pthread_mutex_unlock(&z->lmu);
    if (z->zap != NULL) {
        zmq_close(z->zap);
        z->zap = NULL;
    }
    if (z->fwd != NULL) {
        zmq_close(z->fwd);
        z->fwd = NULL;
    }

    /* Stop accepting; fail whoever is still waiting. */
    pthread_mutex_lock(&z->cmu);
    z->accepting = false;
    while (z->cmds != NULL) {
        struct cmd *c = z->cmds;
        z->cmds = c->next;
        c->rc = kvr_err_set(c->err, -ESHUTDOWN, "events: shutting down");
        c->done = true;
    }
    pthread_cond_broadcast(&z->ccond);
    pthread_mutex_unlock(&z->cmu);
    return NULL;
}

int kvr_zsub_start(struct kvr_zsub *z, struct kvr_err *err)
{
    int rc;

    if (z->started)
        return kvr_err_set(err, -EALREADY, "events: already started");
    z->started = true;
    pthread_mutex_lock(&z->cmu);
    z->accepting = true;
    pthread_mutex_unlock(&z->cmu);
    atomic_store(&z->running, true);
    rc = pthread_create(&z->th, NULL, recv_main, z);
    if (rc != 0) {
        atomic_store(&z->running, false);
        pthread_mutex_lock(&z->cmu);
        z->accepting = false;
        pthread_mutex_unlock(&z->cmu);
        return kvr_err_set(err, -rc, "events: cannot start the receive thread: %s", strerror(rc));
    }
    return 0;
}

void kvr_zsub_stop(struct kvr_zsub *z)
{
    uint64_t one = 1;
    ssize_t w;

    if (!atomic_load(&z->running))
        return;
    atomic_store(&z->stop, true);
    w = write(z->efd, &one, sizeof(one));
    (void)w;
    pthread_join(z->th, NULL);
    atomic_store(&z->running, false);
}

bool kvr_zsub_running(const struct kvr_zsub *z)
{
    return atomic_load(&((struct kvr_zsub *)z)->running);
}

void kvr_zsub_stats(struct kvr_zsub *z, struct kvr_zsub_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->messages = KVR_CNT_GET(z->messages);
    st->bytes = KVR_CNT_GET(z->bytes);
    for (int i = 0; i < KVR_ZSUB_BAD_COUNT; i++)
        st->bad[i] = KVR_CNT_GET(z->bad[i]);
    for (int i = 0; i < KVR_ZSUB_SKIP_COUNT; i++)
        st->skipped[i] = KVR_CNT_GET(z->skipped[i]);
    st->queue_waits = KVR_CNT_GET(z->queue_waits);
    st->replays_started = KVR_CNT_GET(z->replays_started);
    st->replays_completed = KVR_CNT_GET(z->replays_completed);
    st->replays_failed = KVR_CNT_GET(z->replays_failed);
    st->replay_batches = KVR_CNT_GET(z->replay_batches);
    st->replay_bad_replies = KVR_CNT_GET(z->replay_bad_replies);
    st->replay_unaddressable = KVR_CNT_GET(z->replay_unaddressable);
    st->replays_pending = KVR_CNT_GET(z->replays_pending);
    st->replays_active = KVR_CNT_GET(z->replays_active);
    st->connects = KVR_CNT_GET(z->connects);
    st->disconnects = KVR_CNT_GET(z->disconnects);
    st->disconnect_purges = KVR_CNT_GET(z->disconnect_purges);
    st->topics = KVR_CNT_GET(z->ntopics_pub);
    for (int i = 0; i < KVR_ZSUB_REJ_COUNT; i++)
        st->rejected[i] = KVR_CNT_GET(z->rejected[i]);
    st->publisher_connects = KVR_CNT_GET(z->publisher_connects);
    st->publisher_disconnects = KVR_CNT_GET(z->publisher_disconnects);
    st->connections_dropped = KVR_CNT_GET(z->connections_dropped);
    st->forwarded = KVR_CNT_GET(z->forwarded);
    st->forward_dropped = KVR_CNT_GET(z->forward_dropped);
    st->forward_subscriptions = KVR_CNT_GET(z->forward_subscriptions);
    pthread_mutex_lock(&z->lmu);
    for (size_t i = 0; i < z->nsrcs; i++) {
        if (z->srcs[i]->bind)
            continue;
        st->endpoints++;
        if (atomic_load(&z->srcs[i]->connected))
            st->endpoints_connected++;
    }
    pthread_mutex_unlock(&z->lmu);
}

void kvr_zsub_metrics(struct kvr_zsub *z, struct kvr_buf *out)
{
    struct kvr_zsub_stats zs;
    char lab[128];

    kvr_zsub_stats(z, &zs);
    kvr_metrics_counter(out, "events_messages_total",
                        "Live event messages (3 valid frames) handed to writers", NULL,
                        zs.messages);
    kvr_metrics_counter(out, "events_received_bytes_total", "Payload bytes of those messages",
                        NULL, zs.bytes);
    for (int r = 0; r < KVR_ZSUB_BAD_COUNT; r++) {
        snprintf(lab, sizeof(lab), "reason=\"%s\"", kvr_zsub_bad_name((enum kvr_zsub_bad)r));
        kvr_metrics_counter(out, "events_bad_frames_total",
                            r == 0 ? "Messages dropped before decoding, by reason" : NULL, lab,
                            zs.bad[r]);
    }
    kvr_metrics_counter(out, "events_messages_skipped_total",
                        "Live messages skipped before decoding, by reason (model: not one of "
                        "[events] models)",
                        "reason=\"model\"", zs.skipped[KVR_ZSUB_SKIP_MODEL]);
    kvr_metrics_counter(out, "events_replay_batches_received_total",
                        "Batches received from replay endpoints", NULL, zs.replay_batches);
    kvr_metrics_counter(out, "events_replay_bad_replies_total",
                        "Malformed replay replies", NULL, zs.replay_bad_replies);
    kvr_metrics_counter(out, "events_replay_unaddressable_topics_total",
                        "Topics whose pod id is not a host name or address, so a {pod} replay "
                        "template (bind_replay) cannot name their ROUTER: no replay for them",
                        NULL, zs.replay_unaddressable);
    kvr_metrics_counter(out, "events_replay_requests_failed_total",
                        "Replay requests that ended without an end marker (timeout, error)",
                        NULL, zs.replays_failed);
    kvr_metrics_gauge(out, "events_replays_active", "Replays in flight", NULL,
                      (double)zs.replays_active);
    kvr_metrics_gauge(out, "events_replays_pending", "Replays waiting for a slot", NULL,
                      (double)zs.replays_pending);
    kvr_metrics_gauge(out, "events_endpoints", "Connect endpoints configured", NULL,
                      (double)zs.endpoints);
    kvr_metrics_gauge(out, "events_endpoints_connected", "Connect endpoints connected now", NULL,
                      (double)zs.endpoints_connected);
    kvr_metrics_counter(out, "events_connects_total", "Connections established to engines",
                        NULL, zs.connects);
    kvr_metrics_counter(out, "events_disconnects_total", "Connections to engines lost", NULL,
                        zs.disconnects);
    kvr_metrics_counter(out, "events_disconnect_purges_total",
                        "Endpoints purged after staying disconnected", NULL,
                        zs.disconnect_purges);
    kvr_metrics_gauge(out, "events_topics",
                      "Topics interned now (deleted and forgotten pods' are freed)", NULL,
                      (double)zs.topics);
    for (int r = 0; r < KVR_ZSUB_REJ_COUNT; r++) {
        snprintf(lab, sizeof(lab), "reason=\"%s\"",
                 kvr_zsub_reject_name((enum kvr_zsub_reject)r));
        kvr_metrics_counter(out, "events_rejected_total",
                            r == 0 ? "Publishers and messages refused by admission on bind "
                                     "sockets, by reason (docs/security.md)"
                                   : NULL,
                            lab, zs.rejected[r]);
    }
    kvr_metrics_counter(out, "events_publisher_connects_total",
                        "Publisher connections accepted on bind sockets", NULL,
                        zs.publisher_connects);
    kvr_metrics_counter(out, "events_publisher_disconnects_total",
                        "Publisher connections on bind sockets closed by the publisher", NULL,
                        zs.publisher_disconnects);
    kvr_metrics_counter(out, "events_connections_dropped_total",
                        "Publisher connections ZeroMQ dropped: a message over max_message_size "
                        "or another protocol error (the message is lost)",
                        NULL, zs.connections_dropped);
    if (z->fwd_bound == NULL)
        return;
    kvr_metrics_counter(out, "events_forwarded_total",
                        "Live messages re-published on the forward socket ([events] forward)",
                        NULL, zs.forwarded);
    kvr_metrics_counter(out, "events_forward_dropped_total",
                        "Live messages not forwarded: a subscriber's queue (rcvhwm) was full "
                        "(dropped for every replica)",
                        NULL, zs.forward_dropped);
    kvr_metrics_counter(out, "events_forward_subscriptions_total",
                        "Subscriptions received on the forward socket (a replica connecting)",
                        NULL, zs.forward_subscriptions);
}
