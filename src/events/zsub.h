/* zsub.h — the ZeroMQ side of ingestion: SUB sockets (bound or connected), frame checks,
 * topic interning, hand-off of each batch to a writer queue by FNV-1a-32(pod), replay clients
 * (DEALER) and connection monitoring. The only module that touches ZeroMQ.
 *
 * One receive thread owns every socket once started. Other threads talk to it through a
 * command list plus an eventfd it polls (endpoint add/remove, replay requests, stop).
 *
 * Outputs: zsub only produces. Everything it hands on is a struct kvr_queue_msg
 * (queue_msg.h) in one of the queues given at create (borrowed: their owner, the consumer,
 * creates them and destroys them after zsub is stopped). A payload is the received ZeroMQ
 * message itself, never copied, behind a plain (data, len, release, ctx): the consumer
 * releases it without knowing about ZeroMQ. zsub never calls the consumer.
 *
 * Inputs from other modules, all through this header: replay requests (kvr_zsub_replay,
 * which daemon.c adapts to ingest's intake interface), the admin API's endpoint add/remove/
 * list (httpapi calls kvr_zsub_endpoint_* directly) and its own /metrics lines
 * (kvr_zsub_metrics, called by httpapi).
 *
 * Admission (zsub_auth.c, docs/security.md): on bind sockets only, an address allowlist
 * through a ZAP handler, optional CURVE, and optionally the topic pod checked against the
 * peer's address; refusals are counted in events_rejected_total{reason}.
 *
 * Frames (zsub_frame.c): the byte-level checks of topic, seq and replay replies are pure
 * functions declared at the end, for the unit tests and the fuzzer; batches themselves are
 * never decoded here (zsub does not use decode).
 */
#ifndef KVR_ZSUB_H
#define KVR_ZSUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/cidr.h"
#include "core/err.h"
#include "core/log.h"
#include "core/metrics.h"
#include "events/queue.h"
#include "events/queue_msg.h"

struct kvr_zsub;

/* CURVE server keys for bind sockets (kvr_zsub_curve_load). */
struct kvr_zsub_curve {
    char secret[41];             /* Z85 */
    char public_key[41];         /* Z85, checked to belong to secret */
    uint8_t (*authorized)[32];   /* client public keys; NULL/0 = any client */
    size_t nauthorized;
};

struct kvr_modelfilter; /* core/modelfilter.h */

struct kvr_zsub_opts {
    const char *subscribe;            /* topic prefix for sockets without pod override */
    int64_t rcvhwm;                   /* ZMQ_RCVHWM (0 = unlimited) */
    int64_t max_message_size;         /* ZMQ_MAXMSGSIZE (-1/0 = unlimited) */
    int64_t reconnect_ivl_ms;
    int64_t reconnect_ivl_max_ms;
    int64_t purge_after_disconnect_ms; /* 0 = never */
    int64_t replay_timeout_ms;        /* deadline of one replay, from its start */
    uint32_t max_concurrent_replays;  /* >= 1 (replay on/off is the requester's choice) */
    uint32_t max_topics;              /* distinct topics interned; more are dropped, counted */
    int64_t ratelimit_ms;             /* peer-caused warnings: interval ([log]) */
    uint32_t ratelimit_burst;         /* and lines per interval */
    uint32_t nshards;
    struct kvr_queue *const *queues;  /* nshards queues of struct kvr_queue_msg (borrowed) */
    /* Admission on bind sockets (docs/security.md); copied at create. */
    const struct kvr_cidr *allow;     /* peers allowed to connect; nallow == 0: any */
    size_t nallow;
    bool pod_must_match_peer;         /* topic pod must be the peer's IP address */
    const struct kvr_zsub_curve *curve; /* NULL = no CURVE */
    /* Replay on bind sockets: the engines' ROUTER address as a template of the topic's pod
     * and the stream's DP rank (kvr_zsub_template_*), e.g. "tcp://{pod}:{5558+rank}"; NULL =
     * bind sockets have no replay. Checked at create (-EINVAL); copied. */
    const char *bind_replay;
    /* [events] models: a live message whose topic's model the filter does not hold is
     * skipped in the receive thread (counted, never queued, decoded or forwarded); NULL or
     * an inactive filter: every model. Borrowed (outlives zsub); may be changed meanwhile
     * (kvr_modelfilter_set): topics are judged again after each change. */
    const struct kvr_modelfilter *models;
};

/* With an allowlist or authorized CURVE keys, create also binds the context's ZAP handler
 * (inproc://zeromq.zap.01, RFC 27), answered by the receive thread: until kvr_zsub_start()
 * publishers that connect wait in their handshake. */
int kvr_zsub_create(const struct kvr_zsub_opts *o, struct kvr_zsub **out, struct kvr_err *err);
/* Stops if needed, closes every socket (linger 0), frees topics (destroy the consumer first:
 * it points at them). Items already queued keep their payloads valid (ZeroMQ messages
 * outlive the context's sockets). */
void kvr_zsub_destroy(struct kvr_zsub *z);

/* Before start, from the creating thread: our SUB binds (engines connect). -EINVAL for a bad
 * endpoint, -EADDRINUSE etc. from the bind, with the endpoint in err. Its streams replay
 * through o.bind_replay when that is set (else they have no replay). */
int kvr_zsub_bind(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err);
/* Any time, any thread (after start it is executed by the receive thread and waited for):
 * our SUB dials an engine PUB. replay: the engine's ROUTER or NULL, or a template of the
 * topic's pod and the DP rank (kvr_zsub_template_*: for a primary's forward socket, whose
 * messages come from many engines; -EINVAL when bad); pod: identity override
 * ("POD" or "POD@MODEL") or NULL. -EEXIST when present, -EINVAL for a bad endpoint. */
int kvr_zsub_connect(struct kvr_zsub *z, const char *endpoint, const char *replay,
                     const char *pod, bool from_config, struct kvr_err *err);
/* Any time: closes the endpoint's socket; what it delivered is purged after
 * purge_after_disconnect. -ENOENT when absent. */
int kvr_zsub_disconnect(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err);

/* The admin API's forms (any thread): a runtime connect endpoint (from_config false); an
 * empty or NULL endpoint is -EINVAL "endpoint is required", an empty replay or pod means
 * none. Otherwise as kvr_zsub_connect / kvr_zsub_disconnect. */
int kvr_zsub_endpoint_add(struct kvr_zsub *z, const char *endpoint, const char *replay,
                          const char *pod, struct kvr_err *err);
int kvr_zsub_endpoint_del(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err);

/* Before start, from the creating thread, at most once: binds an XPUB on endpoint that
 * re-publishes every live message a SUB accepts (3 valid frames, admitted, its topic
 * interned), the same frames (zmq_msg_copy: the bytes are shared, not copied), for replicas
 * to subscribe to ([events] forward). [events] allow applies to subscribers (through the ZAP
 * handler; CURVE does not). Sends never block: with ZMQ_XPUB_NODROP and SNDHWM = rcvhwm, a
 * message that does not fit some subscriber's queue is dropped for all of them and counted.
 * -EBUSY after start or when already set, -EINVAL/-EADDRINUSE... from the bind. */
int kvr_zsub_forward(struct kvr_zsub *z, const char *endpoint, struct kvr_err *err);
/* The forward socket's bound endpoint (ZMQ_LAST_ENDPOINT), or NULL. */
const char *kvr_zsub_forward_bound(const struct kvr_zsub *z);

int kvr_zsub_start(struct kvr_zsub *z, struct kvr_err *err);
/* Stops the receive thread; when it returns no item will be pushed any more. Replays in
 * flight are abandoned (no REPLAY_END): consumers flush their buffers themselves.
 * Idempotent. */
void kvr_zsub_stop(struct kvr_zsub *z);
bool kvr_zsub_running(const struct kvr_zsub *z);

size_t kvr_zsub_bound(const struct kvr_zsub *z, const char **eps, size_t cap);

struct kvr_zsub_endpoint {
    const char *endpoint;
    const char *replay; /* NULL if none */
    const char *pod;    /* NULL if none, as configured */
    bool connected;
    bool from_config;
};
/* Connect endpoints, under an internal lock (cb must not call back into zsub). */
void kvr_zsub_endpoints(struct kvr_zsub *z,
                        void (*cb)(const struct kvr_zsub_endpoint *e, void *arg), void *arg);

/* A replay request (any thread, never blocks on I/O). Answered by REPLAY items then one
 * REPLAY_END into queue[shard], all with ctx and gen. -ESHUTDOWN when the receive thread is
 * not running (no answer will come), -ENOMEM. A source without a replay endpoint (any more)
 * is answered with a failed REPLAY_END. */
int kvr_zsub_replay(struct kvr_zsub *z, const struct kvr_queue_replay_req *r);

/* Admission refusals on bind sockets (zsub_auth.c), counted per reason. */
enum kvr_zsub_reject {
    KVR_ZSUB_REJ_ADDRESS = 0,   /* peer address not in [events] allow (ZAP) */
    KVR_ZSUB_REJ_CURVE_KEY,     /* CURVE client key not in the authorized keys (ZAP) */
    KVR_ZSUB_REJ_HANDSHAKE,     /* handshake failed: no/bad CURVE, wrong mechanism */
    KVR_ZSUB_REJ_POD_MISMATCH,  /* message whose topic pod is not the peer's address */
    KVR_ZSUB_REJ_COUNT
};
const char *kvr_zsub_reject_name(enum kvr_zsub_reject r);
/* The consumer is done with topic t (its pod was deleted or forgotten; any thread, never
 * blocks on I/O; at most once per topic). The receive thread takes it out of the topic table
 * (max_topics counts live topics) and queues one KVR_QUEUE_FORGET item for it into
 * queue[t->shard], after everything queued for it; that item's payload owns the record. A
 * later message on the same topic starts a new record. -ESHUTDOWN when not running (the
 * record stays zsub's), -ENOMEM. */
int kvr_zsub_forget_topic(struct kvr_zsub *z, const struct kvr_queue_topic *t);

enum kvr_zsub_bad {
    KVR_ZSUB_BAD_FRAMES = 0, /* not exactly 3 frames */
    KVR_ZSUB_BAD_SEQ,        /* seq frame not 8 bytes (+ a publisher id of at most 64) */
    KVR_ZSUB_BAD_TOPIC,      /* not kv@<pod>@<model> (and no pod override) */
    KVR_ZSUB_BAD_TOO_MANY_TOPICS,
    KVR_ZSUB_BAD_COUNT
};
const char *kvr_zsub_bad_name(enum kvr_zsub_bad r);

/* Why a well-formed live message was skipped (not a fault of the peer's). */
enum kvr_zsub_skip {
    KVR_ZSUB_SKIP_MODEL = 0, /* its model is not one of [events] models (o.models) */
    KVR_ZSUB_SKIP_COUNT
};

struct kvr_zsub_stats {
    uint64_t messages;        /* live messages handed to writers */
    uint64_t bytes;           /* their payload bytes */
    uint64_t bad[KVR_ZSUB_BAD_COUNT];
    uint64_t skipped[KVR_ZSUB_SKIP_COUNT]; /* live messages skipped, by enum kvr_zsub_skip */
    uint64_t queue_waits;     /* hand-offs that found the writer queue full and waited */
    uint64_t replays_started;
    uint64_t replays_completed; /* end marker received */
    uint64_t replays_failed;    /* timeout, bad reply, source removed, socket error */
    uint64_t replay_batches;    /* replayed batches handed to writers */
    uint64_t replay_bad_replies;
    uint64_t replay_unaddressable; /* topics whose pod id cannot fill a {pod} template */
    uint64_t replays_pending;   /* gauge: waiting for a slot */
    uint64_t replays_active;    /* gauge */
    uint64_t connects;          /* monitor: connections established */
    uint64_t disconnects;       /* monitor: connections lost */
    uint64_t disconnect_purges; /* sources purged after purge_after_disconnect */
    uint64_t endpoints;         /* gauge: connect endpoints */
    uint64_t endpoints_connected; /* gauge */
    uint64_t topics;            /* gauge: interned topics */
    uint64_t rejected[KVR_ZSUB_REJ_COUNT];
    uint64_t publisher_connects;    /* bind sockets: publisher connections accepted */
    uint64_t publisher_disconnects; /* bind sockets: closed by the publisher */
    uint64_t connections_dropped;   /* bind sockets: dropped by ZeroMQ while the publisher
                                     * was still connected (a message over max_message_size,
                                     * or another ZMTP protocol error) */
    uint64_t forwarded;             /* forward: messages re-published */
    uint64_t forward_dropped;       /* forward: not sent (a subscriber's queue was full) */
    uint64_t forward_subscriptions; /* forward: subscriptions received from replicas */
};
void kvr_zsub_stats(struct kvr_zsub *z, struct kvr_zsub_stats *st);
/* Appends zsub's events_* counters and gauges (messages, bad frames, replay client,
 * connections, topics) in Prometheus text form. Any thread. */
void kvr_zsub_metrics(struct kvr_zsub *z, struct kvr_buf *out);

/* ---- admission helpers (zsub_auth.c): no sockets, any thread ------------------------ */

/* Reads the CURVE server key files (Z85, one key per file, '#' comment lines allowed) and
 * the optional authorized client keys (one a line); checks that public_file holds the public
 * key of secret_file and that libzmq has CURVE. authorized_file may be NULL. Errors name the
 * file ("curve_secret_key_file /etc/x: ..."). Free with kvr_zsub_curve_free. */
int kvr_zsub_curve_load(const char *secret_file, const char *public_file,
                        const char *authorized_file, struct kvr_zsub_curve *out,
                        struct kvr_err *err);
void kvr_zsub_curve_free(struct kvr_zsub_curve *c);

/* What zmq_bind would resolve, without binding (for kvrouterd -t): a tcp endpoint's host
 * must be '*', a numeric IPv4/IPv6 address or the name of an interface with an IPv4
 * address (IPv6: with an IPv6 address, in brackets) on this host; ZeroMQ never asks DNS
 * for a bind, so "localhost" fails with ENODEV. ipc:// needs an existing directory. 0, or
 * -ENODEV/-ENOENT/-EINVAL with the reason in err. */
int kvr_zsub_check_bind(const char *endpoint, struct kvr_err *err);
/* A connect endpoint's host resolves (numeric or DNS): 0 or -ENOENT with the reason. zmq_connect
 * itself accepts an unresolvable name and keeps retrying, so this is advice, not an error. */
int kvr_zsub_check_connect(const char *endpoint, struct kvr_err *err);

/* ---- replay address templates (zsub_tmpl.c): pure, any thread ------------------------ */

/* A replay address template is an endpoint with placeholders: {pod} (the topic's pod id,
 * which must then be a host: kvr_zsub_pod_is_host; an IPv6 address is put in brackets),
 * {rank} (the stream's DP rank) and {N+rank} (N + DP rank, a port: vLLM offsets its replay
 * port by the rank). Used by [events] bind_replay and by a connect endpoint's replay=. A
 * string without placeholders is a template that always builds itself. */
#define KVR_ZSUB_ADDR_MAX 256
/* 0, or -EINVAL with the reason in err: not tcp:// or ipc://, an unknown placeholder, a
 * stray brace, or a result that is not tcp://HOST:PORT / ipc://PATH for a sample pod. */
int kvr_zsub_template_check(const char *tmpl, struct kvr_err *err);
/* The address for (pod, rank) into out: 0; -EINVAL (bad template, or a pod id that is not a
 * host), -ERANGE (N + rank above 65535), -ENAMETOOLONG (cap), with the reason in err. */
int kvr_zsub_template_build(const char *tmpl, const char *pod, uint32_t rank, char *out,
                            size_t cap, struct kvr_err *err);
bool kvr_zsub_template_uses_pod(const char *tmpl);
/* An IPv4 or IPv6 address (no zone) or a DNS name of RFC 1123 labels (1..63 of
 * [A-Za-z0-9-], not starting or ending with '-'), at most 253 bytes. */
bool kvr_zsub_pod_is_host(const char *pod, size_t len);

/* ---- frames (zsub_frame.c): pure functions of peer bytes, any thread ---------------- */

struct kvr_zsub_topic_parts {
    const char *pod;   /* borrowed from the frame, not NUL-terminated */
    size_t pod_len;
    const char *model;
    size_t model_len;
};
/* "kv@<pod>@<model>" (prefix must be exactly "kv@"), split at the first two '@' (the model
 * may contain '@'): 0, or -EINVAL when the topic does not have that shape, pod/model is
 * empty or it contains a NUL byte. */
int kvr_zsub_topic_split(const void *frame, size_t len, struct kvr_zsub_topic_parts *out);
/* Exactly 8 bytes big-endian → 0; otherwise -EINVAL. */
int kvr_zsub_seq(const void *frame, size_t len, uint64_t *seq);
/* The longest publisher id accepted after the seq (vLLM's is 16 bytes). */
#define KVR_ZSUB_PUBID_MAX 64
/* A live seq frame: 8 bytes big-endian, then optionally the publisher's id (vLLM with a
 * snapshot_endpoint, PR #57789: a 16-byte uuid4 per publisher lifetime, so 24 bytes in
 * all). 0 with *seq set and id, id_len the id's bytes (NULL/0 without one: 8 bytes); -EINVAL
 * (outputs untouched) for fewer than 8 bytes or an id over KVR_ZSUB_PUBID_MAX bytes. */
int kvr_zsub_seq_id(const void *frame, size_t len, uint64_t *seq, const void **id,
                    size_t *id_len);

#define KVR_ZSUB_SEQ_END UINT64_MAX
/* A replay reply as seen by a DEALER: v0.9–v0.24 [empty, seq8, payload] or v0.25+
 * [empty, topic, seq8, payload] (replies carry no publisher id, PR #57789's included).
 * frames/lens hold nframes frames. On success *seq and the
 * payload span are set; *seq == KVR_ZSUB_SEQ_END (or an empty payload) is the end
 * marker. -EINVAL for any other shape. */
int kvr_zsub_replay_reply(const void *const *frames, const size_t *lens, size_t nframes,
                          uint64_t *seq, const void **payload, size_t *payload_len);

#endif
