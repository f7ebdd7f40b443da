/* zsub_int.h — zsub's private header: the receive thread's state (sources, topics, replays,
 * commands, the poll set) and the functions its files share (zsub.c: lifecycle, sockets,
 * endpoints, control, the receive loop; zsub_recv.c: the live path, frames to items, topic
 * interning, monitors; zsub_replay.c: the replay client; zsub_auth.c: admission;
 * zsub_frame.c: pure frame parsers). Not a contract for other modules: zsub.h is.
 *
 * Threads: as noted per field; after kvr_zsub_start() only the receive thread touches
 * sockets and everything marked "receive thread".
 */
#ifndef KVR_ZSUB_INT_H
#define KVR_ZSUB_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "core/base.h"
#include "core/log.h"
#include "core/modelfilter.h"
#include "events/zsub.h"

#define NAME_MAX_LEN (KVR_NAME_MAX - 1) /* 255: the longest pod or model name accepted */
#define RECV_BURST 512   /* messages read from one socket before polling the others */
#define MAX_REPLY_FRAMES 8
#define DEFAULT_MODEL "default"
#define SKIP_MODEL (-1) /* intern_topic's *bad for a model [events] models does not hold */

/* ---- state ------------------------------------------------------------------------- */

struct topic_rec {
    struct kvr_queue_topic pub;
    const char *override; /* key part: the source's pod override string (NULL = none) */
    unsigned char *raw;   /* key part: topic bytes */
    size_t rawlen;
    uint64_t hash;
    size_t tidx;          /* its index in z->tlist */
    bool gone;            /* being forgotten (kvr_zsub_forget_run) */
    bool pod_host;        /* the pod id can fill a {pod} replay template */
    bool unaddressable;   /* counted in replay_unaddressable (it came on a {pod} source) */
    bool skip_model;      /* receive thread: its model is not held ([events] models) ... */
    uint32_t models_gen;  /* ... as of this kvr_modelfilter_gen */
};

/* A topic the consumer is done with (kvr_zsub_forget_topic), posted under cmu. */
struct forget_req {
    struct topic_rec *t;
    struct forget_req *next;
};

/* A publisher connection on a bind socket, from the monitor's ACCEPTED event until its
 * DISCONNECTED: a dup of the connection's fd (so its state can be read after libzmq closed
 * its own fd) and the peer's address. */
struct pconn {
    int fd;     /* libzmq's fd number (the key) */
    int dupfd;  /* ours */
    char peer[64];
};

struct source {
    uint32_t id;
    bool bind;
    bool from_config;
    char *endpoint;      /* as given */
    char *bound;         /* bind: ZMQ_LAST_ENDPOINT */
    char *replay;        /* NULL = none; a template when replay_tmpl */
    bool replay_tmpl;    /* build the address per replay (kvr_zsub_template_build) */
    bool replay_pod;     /* the template uses {pod}: topics whose pod is no host cannot */
    char *pod_cfg;       /* override as given (NULL = none) */
    char *pod;           /* override pod */
    char *model;         /* override model (NULL: from the topic) */
    void *sock;
    void *mon;           /* connect: PAIR receiving monitor events */
    _Atomic bool connected;

    /* receive thread (or creating thread before start) */
    int64_t disc_since;  /* ms; 0 = not disconnected */
    bool purged;         /* this disconnect episode was purged */
    int64_t purge_at;    /* ghosts: when to purge; 0 = never */
    struct topic_rec **topics;
    size_t ntopics, captopics;
    struct topic_rec *last_topic;
    struct pconn *conns; /* bind: connections seen by the monitor (receive thread) */
    size_t nconns, capconns;
    unsigned refusals;   /* bind: failed handshakes whose DISCONNECTED is still to come */
};

struct replay {
    struct kvr_queue_replay_req req;
    struct source *src;
    char addr[KVR_ZSUB_ADDR_MAX]; /* the ROUTER dialed (the source's, or its template's) */
    void *dealer;
    int64_t deadline;
    uint64_t batches;
    struct replay *next;
};

enum { CMD_CONNECT = 1, CMD_DISCONNECT = 2 };

struct cmd {
    int type;
    const char *endpoint, *replay, *pod;
    bool from_config;
    struct kvr_err *err;
    int rc;
    bool done;
    struct cmd *next;
};

enum { PS_EVENT = 1, PS_SUB, PS_MON, PS_DEALER, PS_ZAP, PS_FWD };
struct pslot {
    int kind;
    void *ptr;
};

struct kvr_zsub {
    struct kvr_zsub_opts o;
    struct kvr_queue **queues; /* copy of o.queues */
    char *subscribe;
    char *bind_replay;         /* copy of o.bind_replay (NULL = none) */
    void *ctx;
    int efd;

    /* sources: structure changes under lmu (readers: endpoints(), stats()) */
    pthread_mutex_t lmu;
    struct source **srcs;
    size_t nsrcs, capsrcs;
    uint32_t next_id;
    struct source **ghosts; /* removed sources waiting for their purge (receive thread) */
    size_t nghosts, capghosts;

    /* topics (receive thread) */
    struct topic_rec **tab;
    size_t tabcap, ntopics;
    struct topic_rec **tlist; /* the live topics (tab's records, plus any whose FORGET item
                               * could not be queued), for destroy */
    size_t captlist;
    uint32_t next_topic_id;
    _Atomic uint64_t ntopics_pub, topics_forgotten;
    struct forget_req *fgt_head; /* cmu: topics released by the consumer */

    /* control (cmu) */
    pthread_mutex_t cmu;
    pthread_cond_t ccond;
    struct cmd *cmds;
    struct replay *req_head, *req_tail; /* posted replay requests */
    bool accepting;

    /* receive thread */
    pthread_t th;
    _Atomic bool running;
    bool started;
    _Atomic bool stop;
    struct replay *pend_head, *pend_tail; /* waiting for a slot */
    struct replay **active;
    size_t nactive;
    zmq_pollitem_t *items;
    struct pslot *slots;
    size_t nitems, capitems;
    bool dirty;

    struct kvr_ratelimit rl_frames, rl_replay; /* peer-caused warnings */
    struct kvr_ratelimit rl_admit, rl_conn;    /* refusals; dropped connections */

    /* admission (zsub_auth.c): set at create, read by the receive thread */
    struct kvr_cidr *allow;
    size_t nallow;
    struct kvr_zsub_curve curve; /* copy; curve_on says whether it is used */
    bool curve_on;
    void *zap;                   /* REP at inproc://zeromq.zap.01, or NULL */

    /* forward (kvr_zsub_forward): XPUB, receive thread after start */
    void *fwd;
    char *fwd_bound;

    /* stats (relaxed atomics; written by the receive thread) */
    _Atomic uint64_t messages, bytes, bad[KVR_ZSUB_BAD_COUNT], queue_waits;
    _Atomic uint64_t skipped[KVR_ZSUB_SKIP_COUNT];
    _Atomic uint64_t replays_started, replays_completed, replays_failed, replay_batches;
    _Atomic uint64_t replay_bad_replies, replays_pending, replays_active, replay_unaddressable;
    _Atomic uint64_t connects, disconnects, disconnect_purges;
    _Atomic uint64_t rejected[KVR_ZSUB_REJ_COUNT];
    _Atomic uint64_t publisher_connects, publisher_disconnects, connections_dropped;
    _Atomic uint64_t forwarded, forward_dropped, forward_subscriptions;
};

/* ---- shared between zsub's files -------------------------------------------------------- */

/* zsub.c */
int kvr_zsub_set_int(void *s, int opt, int64_t v);
void kvr_zsub_set_ipv6_for(void *s, const char *endpoint);
/* Grows *arr (of elem-byte elements, capacity *cap) to hold need; false when out of memory. */
bool kvr_zsub_grow(void **arr, size_t *cap, size_t need, size_t elem);
char *kvr_zsub_xstrndup(const char *s, size_t n);

/* zsub_recv.c (receive thread) */
/* Reads up to RECV_BURST messages from a SUB and hands them off. */
void kvr_zsub_read_sub(struct kvr_zsub *z, struct source *s);
/* Forward socket: drains the subscriptions replicas send (counted). */
void kvr_zsub_read_fwd(struct kvr_zsub *z);
/* Connection monitor events of a connect source. */
void kvr_zsub_read_monitor(struct kvr_zsub *z, struct source *s);
/* Moves a received message behind a payload (see zsub_recv.c); -ENOMEM leaves m as it was. */
int kvr_zsub_payload_take(struct kvr_queue_payload *p, zmq_msg_t *m);
/* Reserves a slot of queue[shard] (waiting while full, counted) with the fields cleared;
 * NULL once the queue is closed. The caller commits it. */
struct kvr_queue_msg *kvr_zsub_reserve_item(struct kvr_zsub *z, uint32_t shard);

/* zsub_auth.c */
/* At create: copies the allowlist and keys, binds the ZAP handler when needed. */
int kvr_zsub_auth_init(struct kvr_zsub *z, struct kvr_err *err);
void kvr_zsub_auth_deinit(struct kvr_zsub *z); /* closes the ZAP socket, frees copies */
/* Admission options of a new bind socket (ZAP domain, CURVE server). */
int kvr_zsub_auth_bind_opts(struct kvr_zsub *z, void *sock, struct kvr_err *err);
/* The ZAP domain only (when a handler runs): the forward socket's address allowlist. */
int kvr_zsub_auth_zap_opt(struct kvr_zsub *z, void *sock, struct kvr_err *err);
/* Receive thread: answers pending ZAP requests. */
void kvr_zsub_read_zap(struct kvr_zsub *z);
/* Receive thread: false (counted, logged) when pod_must_match_peer is on and the message's
 * topic pod is not the address it came from. first = the topic frame. */
bool kvr_zsub_pod_admitted(struct kvr_zsub *z, struct source *s, zmq_msg_t *first);
/* Receive thread: monitor events of a bind socket. */
void kvr_zsub_bind_monitor_event(struct kvr_zsub *z, struct source *s, uint16_t ev,
                                 uint32_t value);
void kvr_zsub_conns_close(struct source *s);
int kvr_zsub_fd_copy(int fd);          /* a CLOEXEC copy of fd, or -1 */
void kvr_zsub_fd_copy_close(int fd);
ssize_t kvr_zsub_fd_peek(int fd, char *b); /* recv 1 byte, MSG_PEEK | MSG_DONTWAIT */
/* Receive thread (handle_control): forgets the released topics of list (and frees it):
 * out of the table and the sources' lists, then one FORGET item each, which hands the
 * record to the consumer. */
void kvr_zsub_forget_run(struct kvr_zsub *z, struct forget_req *list);
/* Frees a topic record (FORGET payload release; destroy). */
void kvr_zsub_topic_free(void *rec);

/* zsub_replay.c (receive thread, except kvr_zsub_replay) */
void kvr_zsub_replay_free(struct replay *r);
/* Pushes the REPLAY_END of r (ok or failed) and counts it. */
void kvr_zsub_end_replay(struct kvr_zsub *z, struct replay *r, bool ok);
void kvr_zsub_remove_active(struct kvr_zsub *z, size_t i);
/* Reads the replies of active replay i; true when the replay finished. */
bool kvr_zsub_read_dealer(struct kvr_zsub *z, size_t idx);
/* Starts pending replays while slots are free. */
void kvr_zsub_start_replays(struct kvr_zsub *z);

#endif
