/* conf.h — the configuration: INI file (libinih) → validated plain struct.
 *
 * One table of directives in conf.c (section, name, type, default, min, max, repeatable,
 * reloadable) drives parsing, validation, the -t check and the defaults documented in
 * conf/kvrouterd.conf. Units: sizes take B/KiB/MiB/GiB (also K/M/G as binary), durations take
 * ms/s/m/h (a bare number is ms for durations). Unknown sections or keys, bad values,
 * out-of-range values and repeated non-repeatable keys are errors reported as
 * "FILE:LINE: message" in err->msg.
 *
 * Ownership: kvr_conf_load() fills a struct the caller owns; kvr_conf_free() releases the
 * strings and lists in it. No threads, no sockets: pure parsing. Uses cidr (pure parsing
 * of [events] allow ranges), which ARCHITECTURE.md's conf row does not list.
 */
#ifndef KVR_CONF_H
#define KVR_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/cidr.h"
#include "core/err.h"

#define KVR_CONF_MAX_TIERS 16 /* weights by name; the index itself holds 8 tiers */

struct kvr_conf_connect {
    char *endpoint; /* tcp://host:port of an engine's PUB socket */
    char *replay;   /* NULL or the engine's ROUTER endpoint (replay=), or a template of the
                     * topic's pod and the DP rank (it has a '{': checked by daemon.c) */
    char *pod;      /* NULL or identity override (pod=) for engines with an empty topic */
    int line;       /* where it was given (kvrouterd -t's template check) */
};

struct kvr_conf_tier_weight {
    char name[32]; /* lower-cased tier name ("gpu", "cpu", "storage", ...) */
    double weight;
};

/* [model "NAME"]: per-model settings, NAME as engines name the model in their topic. */
struct kvr_conf_model {
    char *name;
    char *tokenizer;    /* a directory holding tokenizer.json (+ tokenizer_config.json) or a
                         * tokenizer.json; relative paths are resolved against the config
                         * file's directory; NULL = no tokenizer (token ids only) */
    char *chat_template; /* a Jinja file overriding the tokenizer's chat template; NULL */
    /* approximate mode (engines that publish no KV events; route.h): */
    bool approximate;   /* approximate = BOOL: a decision to any worker of this model that
                         * has no event stream is assumed; default off */
    char **approximate_pods; /* approximate_pods = POD[,POD...]: these pods are assumed (when
                              * they publish no events) even without approximate, and are
                              * default route candidates (dp_rank 0) */
    size_t napproximate_pods;
    /* disaggregated prefill and decode (route_pd.c): the pods that only prefill, and those
     * that only decode, for this model; any other pod does both */
    char **prefill_pods, **decode_pods; /* prefill_pods = POD[,POD...], decode_pods = ... */
    size_t nprefill_pods, ndecode_pods;
    uint32_t block_size; /* block_size = N: the model's KV block size in tokens, used until
                          * events teach one (they win); 0 = unset (approximate models then
                          * use 16, vLLM's default) */
    int line;           /* of the section header */
    int tokenizer_line, chat_template_line, approximate_line, approximate_pods_line,
        block_size_line, prefill_pods_line, decode_pods_line;
};

struct kvr_conf {
    char *path; /* file it was loaded from */

    /* [log] — reloadable */
    int log_level;  /* enum kvr_log_level; default info */
    int log_format; /* enum kvr_log_format; default text */
    int64_t log_ratelimit_ms; /* interval of the peer-error limiter; default 10s */
    uint32_t log_ratelimit_burst; /* lines per interval; default 10 */
    bool access_log;  /* one line per HTTP request at info level; default off (restart) */

    /* [events] */
    char **bind; /* repeatable: our SUB binds, engines connect */
    size_t nbind;
    struct kvr_conf_connect *connect; /* repeatable: "ENDPOINT [replay=EP] [pod=ID]" */
    size_t nconnect;
    char *subscribe;                 /* topic prefix; default "kv@" */
    uint32_t writer_threads;         /* default 2, 1..64 */
    uint32_t queue_depth;            /* messages per writer queue; default 4096 */
    int64_t rcvhwm;                  /* ZMQ_RCVHWM; default 100000 (0 = unlimited) */
    int64_t max_message_size;        /* ZMQ_MAXMSGSIZE; default 64MiB */
    int64_t reconnect_interval_ms;   /* ZMQ_RECONNECT_IVL; default 100ms */
    int64_t reconnect_interval_max_ms; /* ZMQ_RECONNECT_IVL_MAX; default 5s */
    int64_t purge_after_disconnect_ms; /* connect mode; default 60s; 0 = never */
    int64_t replay_timeout_ms;       /* per replay; default 2s */
    uint32_t max_concurrent_replays; /* default 4 */
    uint32_t max_events_per_batch;   /* decoder limit; default 65536 */
    uint32_t max_tokens_per_event;   /* decoder limit; default 1048576 */
    /* admission (docs/security.md) */
    struct kvr_cidr *allow;          /* repeatable: peers allowed on bind sockets; none = all */
    size_t nallow;
    bool pod_must_match_peer;        /* topic pod == peer IP on bind sockets; default off */
    char *curve_secret_key_file;     /* CURVE server secret key (Z85, 40 chars); NULL = off */
    char *curve_public_key_file;     /* its public key; given together with the secret */
    char *curve_authorized_keys_file; /* client public keys (Z85, one a line); NULL = any */
    int *bind_line;                  /* line of each bind[i] (for -t's resolution check) */
    int curve_secret_key_line, curve_public_key_line, curve_authorized_keys_line;
    uint32_t min_streams_ready;      /* /readyz waits for this many synced streams; 0 = off */
    int64_t forget_after_ms;         /* pods idle (no events) this long with no blocks are
                                      * forgotten; default 10m; 0 = never */
    char *bind_replay;               /* replay address template for bind sockets, e.g.
                                      * tcp://{pod}:{5558+rank}; NULL = none (checked by
                                      * daemon.c through zsub: conf stays socket-free) */
    int bind_replay_line;
    char *forward;                   /* XPUB endpoint re-publishing live messages; NULL = off */
    int forward_line;
    char *events_models;             /* glob patterns of the models this instance holds
                                      * (core/modelfilter.h, checked); NULL/"" = all; reloadable */

    /* [index] */
    uint32_t jump_stride;    /* default 32, 1..4096 */
    uint32_t max_workers;    /* default 16384 */
    uint32_t orphan_capacity; /* blocks held while waiting for an unknown parent; default 65536 */
    int64_t max_memory;      /* index bytes past which new blocks are not indexed; default 0
                              * (unlimited); reloadable (main hands it to ingest) */

    /* [http] */
    char *listen;            /* HOST:PORT; default 0.0.0.0:8080; port 0 = pick and report */
    char *admin_listen;      /* NULL (admin on main listener) or HOST:PORT */
    char *admin_token;       /* NULL or bearer token for mutating endpoints; reloadable */
    uint32_t http_threads;   /* loop threads; default 1 */
    int64_t max_body_bytes;  /* default 8MiB */
    int64_t max_header_bytes; /* default 16KiB */
    uint32_t max_headers;    /* default 64 */
    int64_t request_timeout_ms; /* whole request must arrive within; default 10s */
    int64_t idle_timeout_ms;    /* keep-alive idle; default 60s */
    uint32_t max_connections;   /* default 10000 */
    uint32_t max_query_tokens;  /* default 262144 */
    int64_t max_output_bytes;   /* unsent response bytes per connection before parsing pauses;
                                 * default 4MiB */
    uint32_t probe_connections; /* over max_connections: connections that may still ask
                                 * /healthz or /readyz; default 16 */
    bool public_introspection;  /* /metrics, /v1/pods, /v1/endpoints (GET) also on the main
                                 * listener when admin_listen is set; default off */

    /* [score] — reloadable; weight.<tier> = number (repeatable by tier name) */
    struct kvr_conf_tier_weight weights[KVR_CONF_MAX_TIERS];
    size_t nweights;            /* defaults: gpu 1.0, cpu 0.8, storage 0.5, remote 0.6,
                                 * external 0.4, assumed 0.7 */
    double default_weight;      /* for tiers without a weight; default 0.5 */

    /* [tokenizer] */
    int64_t prefix_cache;      /* bytes of the shared text-prefix cache; default 64MiB; 0 = off */
    int64_t max_prompt_bytes;  /* a prompt (text) longer than this: 413; default 1MiB */
    uint32_t text_threads;     /* text threads (large texts off the HTTP loops); default 2;
                                * 0 = every text inline on its loop */
    uint32_t text_queue;       /* large texts waiting for a text thread before 503; default 64 */
    int64_t offload_bytes;     /* bodies of text endpoints from this size go to the text
                                * threads; default 16KiB */

    /* [route] — POST /v1/route (route.h); reloadable except seed */
    char *route_policy;               /* cost | cache_aware | score | ttft; default ttft */
    double route_overlap_weight;      /* cost: weight of blocks to prefill; default 1.0 */
    double route_temperature;         /* cost: softmax sampling; default 0 (argmin) */
    uint32_t route_balance_abs_threshold; /* cache_aware; default 64 */
    double route_balance_rel_threshold;   /* cache_aware; default 1.5 */
    double route_cache_threshold;     /* cache_aware: match rate; default 0.3 */
    int64_t route_max_request_age_ms; /* tracked requests end after; default 10m */
    uint32_t route_max_tracked;       /* tracked requests at once; default 100000 */
    uint32_t route_seed;              /* tie-break random stream; 0 = from the clock */
    int64_t route_assumed_ttl_ms;     /* approximate mode: an assumed block expires this long
                                       * after the last decision that routed it; default 120s */
    uint32_t route_assumed_max_blocks; /* approximate mode: assumed blocks per worker (LRU);
                                        * default 65536 */
    int64_t route_predicted_ttl_ms;   /* a decision to a worker with events predicts its
                                       * blocks there this long, unless its events confirm or
                                       * contradict them first; 0 = off; default 5s */
    double route_prefill_rate;        /* ttft: prefill tokens/s before one is learned; 20000 */
    double route_uncached_weight;     /* ttft: weight of this request's uncached tokens; 1 */
    double route_sticky_band;         /* ttft: within (1 + this) x the best time, the most
                                       * cached; default 0.5 (0 = off) */
    int64_t route_prefill_timeout_ms; /* an unconfirmed prefill stops counting; default 30s */
    int64_t route_decode_time_ms;     /* a confirmed request counts as decoding; default 5s */
    double route_busy_kv_usage;       /* ttft: skip workers at this KV usage; 0.95 (0 = off) */
    uint32_t route_busy_waiting;      /* ttft: ... with this many waiting; 0 = off */
    char *route_when_all_busy;        /* best | reject (429); default best */
    char *route_peer_bind;            /* replicas: our PUB endpoint for decisions; NULL/"" =
                                       * none (route/share.h); not reloadable */
    char *route_peers;                /* the other replicas' PUB endpoints (blanks/commas) */
    uint32_t route_pd_local_max_uncached; /* P/D: a request stays on its decode worker with
                                           * fewer uncached tokens than this; default 2048 */
    double route_pd_local_max_share;  /* ... and at most this share of its prompt uncached; 1 */
    char *route_session_header;       /* session affinity: the request header carrying the
                                       * session key; default X-Session-ID; "" = none (the
                                       * body's "session_id" only); not reloadable */
    int64_t route_session_ttl_ms;     /* a bond idle this long is gone; default 300s; 0 = off */
    uint32_t route_session_max;       /* bonds kept (least recently used out); default 100000 */
    int64_t route_session_max_wait_ms; /* ttft breaks a bond whose worker's predicted time to
                                        * first token exceeds the best by more; default 1s */

    /* [load] — the engines' own Prometheus endpoints, scraped by load.h; all reloadable */
    char *load_metrics_url;        /* URL template: {pod}, {host} (the pod up to its last
                                    * ':'), {rank} (the DP rank); NULL or "" = no scraping */
    int64_t load_interval_ms;      /* every target scraped this often; default 50ms */
    int64_t load_timeout_ms;       /* one scrape's deadline (connect included); default 500ms */
    int64_t load_stale_after_ms;   /* a sample older than this is stale; default 1s */
    int64_t load_max_response_bytes; /* a bigger answer is refused; default 4MiB */
    uint32_t load_max_targets;     /* workers (pod, dp_rank) scraped at most; default 4096 */

    /* [model "NAME"] sections — reloadable (SIGHUP loads changed tokenizers) */
    struct kvr_conf_model *models;
    size_t nmodels;

    /* [state] */
    char *state_dir;             /* snapshots go here; NULL/"" = no snapshots */
    int64_t snapshot_interval_ms; /* periodic snapshots; default 60s; 0 = only at shutdown */
    char *bootstrap;             /* NULL or http://HOST:PORT of a peer to start from */
    int64_t bootstrap_timeout_ms; /* the whole bootstrap fetch; default 30s */
    int state_dir_line;          /* line of [state] dir (for -t's directory check) */

    /* [daemon] */
    int64_t shutdown_timeout_ms; /* drain deadline on SIGTERM; default 5s */
};

/* Loads and validates path into *c (zeroed first). Returns 0, -ENOENT/-EACCES when the file
 * cannot be read, or -EINVAL with "FILE:LINE: message" in err. *c is freed on failure. */
int kvr_conf_load(const char *path, struct kvr_conf *c, struct kvr_err *err);

/* Same from an in-memory string (tests, fuzzing); `name` is used as FILE in messages. */
int kvr_conf_load_string(const char *name, const char *text, struct kvr_conf *c,
                         struct kvr_err *err);

void kvr_conf_free(struct kvr_conf *c);

/* Applies the reloadable directives of `fresh` onto `live` (log, score weights, the
 * [model] list: "model.NAME" for each added, removed or changed section); returns
 * the number of directives whose value changed, and names them in err->msg when non-NULL
 * (e.g. "log.level, score.weight.cpu"). Non-reloadable changes are listed in *ignored
 * (may be NULL) so the daemon can warn that they need a restart. */
int kvr_conf_apply_reload(struct kvr_conf *live, const struct kvr_conf *fresh,
                          struct kvr_err *changed, struct kvr_err *ignored);

/* Weight of a tier by name (case-insensitive); default_weight when not configured. */
double kvr_conf_tier_weight(const struct kvr_conf *c, const char *tier);

/* Parsers shared with other modules (e.g. the HTTP layer reuses the listen syntax). */
int kvr_conf_parse_size(const char *s, int64_t *out);     /* "64KiB" → 65536 */
int kvr_conf_parse_duration(const char *s, int64_t *ms);  /* "500ms", "10s" → ms */
/* "HOST:PORT" or "[v6]:PORT" → host (NUL-terminated, into host[cap]) and port (0..65535). */
int kvr_conf_parse_hostport(const char *s, char *host, size_t cap, int *port);

#endif
