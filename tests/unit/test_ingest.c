/* test_ingest.c — ingest end to end in one process with real ZeroMQ sockets on 127.0.0.1:
 * a PUB in the test publishes msgpack batches (msgpack-c packer, both event eras) into the
 * ingest SUB (bound on tcp://127.0.0.1:*, or connecting to the test's PUB), and the results
 * are checked through the index (kvr_index_find, kvr_index_worker_blocks), the streams
 * (kvr_ingest_streams) and the metrics text. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <msgpack.h>
#include <zmq.h>

#include "conf.h"
#include "hash.h"
#include "index.h"
#include "ingest.h"
#include "log.h"
#include "metrics.h"

#define WAIT_MS 10000

#define MODEL "org/model-7b"

/* ---- fixture ------------------------------------------------------------------------ */

struct fx {
    struct kvr_conf conf;
    char *bind_list[1];
    struct kvr_index *ix;
    struct kvr_index_reader *rd;
    struct kvr_ingest *ing;
    void *zctx;
    void *pub;
    char ep[256];
};

static void conf_defaults(struct kvr_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->subscribe = "kv@";
    c->writer_threads = 2;
    c->queue_depth = 64;
    c->rcvhwm = 0;
    c->max_message_size = 64 << 20;
    c->reconnect_interval_ms = 50;
    c->reconnect_interval_max_ms = 200;
    c->purge_after_disconnect_ms = 60000;
    c->replay_timeout_ms = 2000;
    c->max_concurrent_replays = 2;
    c->max_events_per_batch = 65536;
    c->max_tokens_per_event = 1 << 20;
    c->max_workers = 1024;
    c->orphan_capacity = 1024;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Creates index + ingest; bind mode unless `bind` is false; tweak edits the config. */
static struct fx *fx_new_conf(bool bind, int64_t purge_after_ms, void (*tweak)(struct kvr_conf *))
{
    struct fx *f = calloc(1, sizeof(*f));
    struct kvr_index_opts io = {0};
    struct kvr_err err = {{0}};
    const char *eps[1];

    conf_defaults(&f->conf);
    if (purge_after_ms >= 0)
        f->conf.purge_after_disconnect_ms = purge_after_ms;
    if (tweak != NULL)
        tweak(&f->conf);
    if (bind) {
        f->bind_list[0] = "tcp://127.0.0.1:*";
        f->conf.bind = f->bind_list;
        f->conf.nbind = 1;
    }
    io.orphan_capacity = 1024;
    assert_int_equal(kvr_index_create(&io, &f->ix), 0);
    assert_int_equal(kvr_index_reader_create(f->ix, &f->rd), 0);
    assert_int_equal(kvr_ingest_create(&f->conf, f->ix, &f->ing, &err), 0);
    if (kvr_ingest_start(f->ing, &err) != 0)
        fail_msg("start: %s", err.msg);
    assert_true(kvr_ingest_ready(f->ing));
    f->zctx = zmq_ctx_new();
    f->pub = zmq_socket(f->zctx, ZMQ_PUB);
    int zero = 0, big = 1000000;
    zmq_setsockopt(f->pub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(f->pub, ZMQ_SNDHWM, &big, sizeof(big));
    if (bind) {
        assert_int_equal(kvr_ingest_bound_endpoints(f->ing, eps, 1), 1);
        assert_non_null(strstr(eps[0], "tcp://127.0.0.1:"));
        assert_null(strchr(eps[0] + 16, '*'));
        snprintf(f->ep, sizeof(f->ep), "%s", eps[0]);
        assert_int_equal(zmq_connect(f->pub, f->ep), 0);
    } else {
        size_t len = sizeof(f->ep);
        assert_int_equal(zmq_bind(f->pub, "tcp://127.0.0.1:*"), 0);
        zmq_getsockopt(f->pub, ZMQ_LAST_ENDPOINT, f->ep, &len);
    }
    return f;
}

static struct fx *fx_new(bool bind, int64_t purge_after_ms)
{
    return fx_new_conf(bind, purge_after_ms, NULL);
}

static void fx_free(struct fx *f)
{
    if (f->pub != NULL)
        zmq_close(f->pub);
    zmq_ctx_term(f->zctx);
    kvr_ingest_stop(f->ing);
    kvr_ingest_destroy(f->ing);
    kvr_index_reader_destroy(f->rd);
    kvr_index_destroy(f->ix);
    free(f);
}

/* ---- batches ------------------------------------------------------------------------ */

enum { EV_STORED = 1, EV_REMOVED, EV_CLEARED, EV_GARBAGE_INT, EV_UNKNOWN_TAG };

struct tev {
    int type;
    const uint64_t *hashes;
    size_t n;
    bool has_parent;
    uint64_t parent;
    const uint32_t *tokens;
    size_t ntok;
    uint32_t bs;          /* 0 → written as nil (absent) */
    const char *medium;   /* NULL → "GPU" */
    const char *lora;
    int64_t lora_id;      /* < 0: nil */
    bool array_form;      /* legacy positional encoding */
    int group_idx;
    const char *kind;     /* kv_cache_spec_kind; NULL → "full_attention" */
};

static void pk_str(msgpack_packer *p, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(p, n);
    msgpack_pack_str_body(p, s, n);
}

static void pk_hashes(msgpack_packer *p, const uint64_t *h, size_t n)
{
    msgpack_pack_array(p, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(p, h[i]);
}

static void pk_event(msgpack_packer *p, const struct tev *e)
{
    const char *medium = e->medium ? e->medium : "GPU";

    switch (e->type) {
    case EV_STORED:
        if (e->array_form) {
            msgpack_pack_array(p, 12);
            pk_str(p, "BlockStored");
            pk_hashes(p, e->hashes, e->n);
            if (e->has_parent)
                msgpack_pack_uint64(p, e->parent);
            else
                msgpack_pack_nil(p);
            msgpack_pack_array(p, e->ntok);
            for (size_t i = 0; i < e->ntok; i++)
                msgpack_pack_uint32(p, e->tokens[i]);
            if (e->bs)
                msgpack_pack_uint32(p, e->bs);
            else
                msgpack_pack_nil(p);
            if (e->lora_id >= 0)
                msgpack_pack_int64(p, e->lora_id);
            else
                msgpack_pack_nil(p);
            pk_str(p, medium);
            if (e->lora)
                pk_str(p, e->lora);
            else
                msgpack_pack_nil(p);
            msgpack_pack_nil(p);            /* extra_keys */
            msgpack_pack_int(p, e->group_idx);
            pk_str(p, e->kind ? e->kind : "full_attention");
            msgpack_pack_nil(p);            /* sliding window */
        } else {
            msgpack_pack_map(p, 10);
            pk_str(p, "type");
            pk_str(p, "BlockStored");
            pk_str(p, "block_hashes");
            pk_hashes(p, e->hashes, e->n);
            pk_str(p, "parent_block_hash");
            if (e->has_parent)
                msgpack_pack_uint64(p, e->parent);
            else
                msgpack_pack_nil(p);
            pk_str(p, "token_ids");
            msgpack_pack_array(p, e->ntok);
            for (size_t i = 0; i < e->ntok; i++)
                msgpack_pack_uint32(p, e->tokens[i]);
            pk_str(p, "block_size");
            if (e->bs)
                msgpack_pack_uint32(p, e->bs);
            else
                msgpack_pack_nil(p);
            pk_str(p, "lora_id");
            if (e->lora_id >= 0)
                msgpack_pack_int64(p, e->lora_id);
            else
                msgpack_pack_nil(p);
            pk_str(p, "medium");
            pk_str(p, medium);
            pk_str(p, "lora_name");
            if (e->lora)
                pk_str(p, e->lora);
            else
                msgpack_pack_nil(p);
            pk_str(p, "group_idx");
            msgpack_pack_int(p, e->group_idx);
            pk_str(p, "kv_cache_spec_kind");
            pk_str(p, e->kind ? e->kind : "full_attention");
        }
        break;
    case EV_REMOVED:
        if (e->array_form) {
            msgpack_pack_array(p, 4);
            pk_str(p, "BlockRemoved");
            pk_hashes(p, e->hashes, e->n);
            pk_str(p, medium);
            msgpack_pack_int(p, e->group_idx);
        } else {
            msgpack_pack_map(p, 4);
            pk_str(p, "type");
            pk_str(p, "BlockRemoved");
            pk_str(p, "block_hashes");
            pk_hashes(p, e->hashes, e->n);
            pk_str(p, "medium");
            pk_str(p, medium);
            pk_str(p, "group_idx");
            msgpack_pack_int(p, e->group_idx);
        }
        break;
    case EV_CLEARED:
        if (e->array_form) {
            msgpack_pack_array(p, 1);
            pk_str(p, "AllBlocksCleared");
        } else {
            msgpack_pack_map(p, 1);
            pk_str(p, "type");
            pk_str(p, "AllBlocksCleared");
        }
        break;
    case EV_GARBAGE_INT:
        msgpack_pack_int(p, 42);
        break;
    case EV_UNKNOWN_TAG:
        msgpack_pack_map(p, 1);
        pk_str(p, "type");
        pk_str(p, "BlockInactive");
        break;
    }
}

static void send_frames(void *pub, const void *topic, size_t tlen, const void *seq, size_t slen,
                        const void *payload, size_t plen, int nframes)
{
    assert_true(zmq_send(pub, topic, tlen, nframes > 1 ? ZMQ_SNDMORE : 0) >= 0);
    if (nframes > 1)
        assert_true(zmq_send(pub, seq, slen, nframes > 2 ? ZMQ_SNDMORE : 0) >= 0);
    if (nframes > 2)
        assert_true(zmq_send(pub, payload, plen, nframes > 3 ? ZMQ_SNDMORE : 0) >= 0);
    if (nframes > 3)
        assert_true(zmq_send(pub, "x", 1, 0) >= 0);
}

static void be64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (56 - 8 * i));
}

/* Packs [ts, events, dp_rank] into sb (caller destroys). */
static void pack_batch(msgpack_sbuffer *sb, const struct tev *evs, size_t n, int dp_rank)
{
    msgpack_packer p;
    struct timespec ts;

    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&p, sb, msgpack_sbuffer_write);
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, (double)ts.tv_sec + ts.tv_nsec / 1e9);
    msgpack_pack_array(&p, n);
    for (size_t i = 0; i < n; i++)
        pk_event(&p, &evs[i]);
    if (dp_rank >= 0)
        msgpack_pack_int(&p, dp_rank);
    else
        msgpack_pack_nil(&p);
}

static void publish(void *pub, const char *topic, uint64_t seq, const struct tev *evs, size_t n,
                    int dp_rank)
{
    msgpack_sbuffer sb;
    unsigned char s8[8];

    pack_batch(&sb, evs, n, dp_rank);
    be64(s8, seq);
    send_frames(pub, topic, strlen(topic), s8, 8, sb.data, sb.size, 3);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- observing ---------------------------------------------------------------------- */

struct find_stream {
    const char *pod;
    uint32_t rank;
    bool found;
    struct kvr_stream_info si;
};

static void stream_cb(const struct kvr_stream_info *s, void *arg)
{
    struct find_stream *fs = arg;
    if (strcmp(s->pod, fs->pod) == 0 && s->dp_rank == fs->rank) {
        fs->found = true;
        fs->si = *s;
        fs->si.pod = NULL;
        fs->si.model = NULL;
        for (int t = 0; t < KVR_TIER_MAX; t++)
            fs->si.tier_names[t] = NULL;
    }
}

static bool get_stream(struct fx *f, const char *pod, uint32_t rank, struct kvr_stream_info *out)
{
    struct find_stream fs = {.pod = pod, .rank = rank};
    kvr_ingest_streams(f->ing, stream_cb, &fs);
    if (fs.found && out != NULL)
        *out = fs.si;
    return fs.found;
}

/* Waits until the stream has applied seq (and, when state >= 0, is in that state). */
static struct kvr_stream_info wait_seq(struct fx *f, const char *pod, uint32_t rank,
                                       uint64_t seq, int state)
{
    struct kvr_stream_info si;
    int64_t deadline = kvr_now_ms() + WAIT_MS;

    while (kvr_now_ms() < deadline) {
        if (get_stream(f, pod, rank, &si) && si.last_seq == seq &&
            (state < 0 || (int)si.state == state))
            return si;
        sleep_ms(2);
    }
    if (getenv("KVR_TEST_DEBUG") != NULL) {
        struct kvr_buf b;
        kvr_buf_init(&b);
        kvr_ingest_metrics(f->ing, &b);
        fprintf(stderr, "%s\n", b.data);
        kvr_buf_free(&b);
    }
    fail_msg("stream %s/%u did not reach seq %llu (state %d): found=%d last_seq=%llu state=%d "
             "gaps=%llu restarts=%llu",
             pod, rank, (unsigned long long)seq, state, get_stream(f, pod, rank, &si),
             (unsigned long long)si.last_seq, (int)si.state, (unsigned long long)si.gaps,
             (unsigned long long)si.restarts);
    return si;
}

/* Slow joiner: publish on a warm-up topic until the SUB is seen to receive. */
static void warm_up(struct fx *f)
{
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    struct tev none[1] = {{0}};
    uint64_t seq = 0;
    struct kvr_stream_info si;

    while (kvr_now_ms() < deadline) {
        publish(f->pub, "kv@warmup@" MODEL, seq++, none, 0, 0);
        sleep_ms(5);
        if (get_stream(f, "warmup", 0, &si))
            return;
    }
    fail_msg("subscriber never received the warm-up batches");
}

static uint32_t wid_of(struct fx *f, const char *pod, uint32_t rank)
{
    uint32_t wid;
    assert_int_equal(kvr_index_worker_lookup(f->ix, pod, rank, &wid), 0);
    return wid;
}

/* Longest prefix of tokens (whole blocks) held by (pod, rank) in namespace (model, lora). */
static uint32_t matched(struct fx *f, const char *model, const char *lora, const uint32_t *tokens,
                        size_t ntok, uint32_t bs, const char *pod, uint32_t rank)
{
    uint32_t ns, wid;
    uint64_t seed;
    uint64_t q[256];
    size_t n = ntok / bs;
    const struct kvr_index_hit *hits;
    size_t nhits;
    double weights[KVR_TIER_MAX];

    for (int i = 0; i < KVR_TIER_MAX; i++)
        weights[i] = 1.0;
    if (kvr_index_ns_lookup(f->ix, model, lora, &ns, &seed) != 0)
        return 0;
    if (kvr_index_worker_lookup(f->ix, pod, rank, &wid) != 0)
        return 0;
    assert_true(n <= 256);
    kvr_hash_blocks(seed, tokens, n, bs, q);
    assert_int_equal(kvr_index_find(f->rd, ns, q, n, NULL, 0, weights, &hits, &nhits), 0);
    for (size_t i = 0; i < nhits; i++)
        if (hits[i].wid == wid)
            return hits[i].matched;
    return 0;
}

static uint64_t worker_tier_blocks(struct fx *f, const char *pod, uint32_t rank, int tier)
{
    uint64_t b[KVR_TIER_MAX];
    kvr_index_worker_blocks(f->ix, wid_of(f, pod, rank), b);
    return b[tier];
}

/* Value of a metric line "name{labels} v" (labels NULL: "name v"); -1 when absent. */
static double metric(struct fx *f, const char *name, const char *labels)
{
    struct kvr_buf b;
    char key[256];
    const char *p;
    double v = -1;

    kvr_buf_init(&b);
    kvr_ingest_metrics(f->ing, &b);
    if (labels != NULL)
        snprintf(key, sizeof(key), "\nkvrouter_%s{%s} ", name, labels);
    else
        snprintf(key, sizeof(key), "\nkvrouter_%s ", name);
    p = b.data ? strstr(b.data, key) : NULL;
    if (p != NULL)
        v = strtod(p + strlen(key), NULL);
    kvr_buf_free(&b);
    return v;
}


/* Prometheus text: the samples of one family must be contiguous, each family announced
 * once. Fails the test otherwise. */
static void assert_families_grouped(const char *text)
{
    char seen[256][96];
    size_t nseen = 0;
    char cur[96] = "";

    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char name[96];
        size_t n = 0;

        if (len > 0 && l[0] != '#') {
            while (n < len && n < sizeof(name) - 1 && l[n] != '{' && l[n] != ' ')
                n++;
            memcpy(name, l, n);
            name[n] = '\0';
            /* histogram series belong to their family */
            for (const char *suf = "_bucket\0_sum\0_count\0"; *suf; suf += strlen(suf) + 1) {
                size_t sl = strlen(suf);
                if (n > sl && strcmp(name + n - sl, suf) == 0 &&
                    strncmp(cur, name, n - sl) == 0 && cur[n - sl] == '\0') {
                    name[n - sl] = '\0';
                    break;
                }
            }
            if (strcmp(name, cur) != 0) {
                for (size_t i = 0; i < nseen; i++)
                    if (strcmp(seen[i], name) == 0)
                        fail_msg("metric family %s is not contiguous", name);
                assert_true(nseen < 256);
                snprintf(seen[nseen++], sizeof(seen[0]), "%s", name);
                snprintf(cur, sizeof(cur), "%s", name);
            }
        }
        l += len + (e ? 1 : 0);
    }
}

static void wait_metric(struct fx *f, const char *name, const char *labels, double want)
{
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    double v = -1;
    while (kvr_now_ms() < deadline) {
        v = metric(f, name, labels);
        if (v == want)
            return;
        sleep_ms(2);
    }
    fail_msg("metric %s{%s} = %g, want %g", name, labels ? labels : "", v, want);
}

/* Tokens 0.. of one prompt: block b holds base+b*bs .. base+(b+1)*bs-1. */
static void tokens_seq(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_store_remove_clear(void **state)
{
    struct fx *f = fx_new(true, -1);
    uint32_t tok[64];
    uint64_t h[16] = {101, 102, 103, 104};
    struct kvr_stream_info si;
    (void)state;

    warm_up(f);
    tokens_seq(tok, 16, 1000);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
                     .lora_id = -1};
    publish(f->pub, "kv@pod-a@" MODEL, 0, &st, 1, 0);
    si = wait_seq(f, "pod-a", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);
    assert_int_equal(si.tier_blocks[KVR_TIER_GPU], 4);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-a", 0), 4);
    assert_int_equal(kvr_index_ns_block_size(f->ix, 0) == 4 ||
                         kvr_index_ns_block_size(f->ix, 1) == 4, 1);

    /* continue the chain in legacy array form with a parent */
    uint64_t h2[2] = {105, 106};
    uint32_t tok2[8];
    tokens_seq(tok2, 8, 1016);
    struct tev st2 = {.type = EV_STORED, .hashes = h2, .n = 2, .has_parent = true, .parent = 104,
                      .tokens = tok2, .ntok = 8, .bs = 4, .lora_id = -1, .array_form = true};
    publish(f->pub, "kv@pod-a@" MODEL, 1, &st2, 1, 0);
    wait_seq(f, "pod-a", 0, 1, KVR_STREAM_SYNCED);
    tokens_seq(tok, 24, 1000);
    assert_int_equal(matched(f, MODEL, NULL, tok, 24, 4, "pod-a", 0), 6);

    /* remove the tail block */
    uint64_t rh[1] = {106};
    struct tev rm = {.type = EV_REMOVED, .hashes = rh, .n = 1};
    publish(f->pub, "kv@pod-a@" MODEL, 2, &rm, 1, 0);
    si = wait_seq(f, "pod-a", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 5);
    assert_int_equal(matched(f, MODEL, NULL, tok, 24, 4, "pod-a", 0), 5);
    /* remove of an unknown hash is counted, not fatal */
    uint64_t uh[1] = {999};
    struct tev rm2 = {.type = EV_REMOVED, .hashes = uh, .n = 1, .array_form = true};
    publish(f->pub, "kv@pod-a@" MODEL, 3, &rm2, 1, 0);
    wait_seq(f, "pod-a", 0, 3, KVR_STREAM_SYNCED);
    assert_true(metric(f, "events_unknown_removes_total", NULL) >= 1);

    /* AllBlocksCleared drops everything */
    struct tev clr = {.type = EV_CLEARED};
    publish(f->pub, "kv@pod-a@" MODEL, 4, &clr, 1, 0);
    si = wait_seq(f, "pod-a", 0, 4, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 0);
    assert_int_equal(matched(f, MODEL, NULL, tok, 24, 4, "pod-a", 0), 0);
    assert_int_equal(si.gaps, 0);
    assert_true(si.last_event_age_ms >= 0);
    assert_true(metric(f, "events_total", "type=\"BlockStored\"") >= 2);
    assert_true(metric(f, "events_total", "type=\"AllBlocksCleared\"") >= 1);
    assert_true(metric(f, "events_lag_seconds_count", NULL) >= 5);
    {
        struct kvr_buf b;
        kvr_buf_init(&b);
        kvr_ingest_metrics(f->ing, &b);
        assert_families_grouped(b.data);
        kvr_buf_free(&b);
    }
    fx_free(f);
}

/* Hybrid (HMA) models: the same blocks are announced once per KV-cache group with the same
 * hashes. Only full-attention groups are indexed, and removals are applied only for those
 * groups — also when the full-attention group is not group 0. */
static void test_hybrid_groups(void **state)
{
    struct fx *f = fx_new(true, -1);
    uint32_t tok[16];
    uint64_t h[4] = {301, 302, 303, 304};
    uint64_t g[4] = {401, 402, 403, 404};
    struct kvr_stream_info si;
    (void)state;

    warm_up(f);
    tokens_seq(tok, 16, 5000);
    /* pod-h: group 0 full attention, group 1 sliding window, same hashes */
    struct tev st[2] = {
        {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
         .lora_id = -1, .group_idx = 0},
        {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
         .lora_id = -1, .group_idx = 1, .kind = "sliding_window"},
    };
    publish(f->pub, "kv@pod-h@" MODEL, 0, st, 2, 0);
    si = wait_seq(f, "pod-h", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);
    /* the sliding-window group drops its out-of-window blocks: not ours */
    struct tev rm1 = {.type = EV_REMOVED, .hashes = h, .n = 2, .group_idx = 1};
    publish(f->pub, "kv@pod-h@" MODEL, 1, &rm1, 1, 0);
    si = wait_seq(f, "pod-h", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-h", 0), 4);
    /* the full-attention group evicts its tail: applied */
    struct tev rm0 = {.type = EV_REMOVED, .hashes = h + 3, .n = 1, .group_idx = 0};
    publish(f->pub, "kv@pod-h@" MODEL, 2, &rm0, 1, 0);
    si = wait_seq(f, "pod-h", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 3);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-h", 0), 3);

    /* pod-k: group 0 is sliding window, group 1 is full attention */
    struct tev sk[2] = {
        {.type = EV_STORED, .hashes = g, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
         .lora_id = -1, .group_idx = 0, .kind = "sliding_window", .array_form = true},
        {.type = EV_STORED, .hashes = g, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
         .lora_id = -1, .group_idx = 1, .kind = "full_attention", .array_form = true},
    };
    publish(f->pub, "kv@pod-k@" MODEL, 0, sk, 2, 0);
    si = wait_seq(f, "pod-k", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);
    struct tev rk0 = {.type = EV_REMOVED, .hashes = g, .n = 4, .group_idx = 0};
    publish(f->pub, "kv@pod-k@" MODEL, 1, &rk0, 1, 0);
    si = wait_seq(f, "pod-k", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4); /* group 0 is known as sliding window: filtered */
    struct tev rk1 = {.type = EV_REMOVED, .hashes = g + 2, .n = 2, .group_idx = 1,
                      .array_form = true};
    publish(f->pub, "kv@pod-k@" MODEL, 2, &rk1, 1, 0);
    si = wait_seq(f, "pod-k", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 2); /* group 1 is full attention: applied */
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-k", 0), 2);
    assert_true(metric(f, "events_filtered_groups_total", NULL) >= 4);
    fx_free(f);
}

static void test_dp_ranks_lora_tiers(void **state)
{
    struct fx *f = fx_new(true, -1);
    uint32_t tok[32];
    uint64_t h0[4] = {1, 2, 3, 4}, h1[4] = {11, 12, 13, 14}, hl[4] = {21, 22, 23, 24};
    uint64_t hc[2] = {31, 32}, hid[2] = {41, 42};
    (void)state;

    warm_up(f);
    tokens_seq(tok, 32, 7);
    /* same topic, two DP ranks with their own seq */
    struct tev e0 = {.type = EV_STORED, .hashes = h0, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
                     .lora_id = -1};
    struct tev e1 = {.type = EV_STORED, .hashes = h1, .n = 2, .tokens = tok, .ntok = 8, .bs = 4,
                     .lora_id = -1};
    publish(f->pub, "kv@pod-dp@" MODEL, 5, &e0, 1, 0);
    publish(f->pub, "kv@pod-dp@" MODEL, 9, &e1, 1, 1);
    wait_seq(f, "pod-dp", 0, 5, KVR_STREAM_SYNCED);
    wait_seq(f, "pod-dp", 1, 9, KVR_STREAM_SYNCED);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-dp", 0), 4);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-dp", 1), 2);

    /* LoRA by name: its own namespace */
    struct tev el = {.type = EV_STORED, .hashes = hl, .n = 4, .tokens = tok + 16, .ntok = 16,
                     .bs = 4, .lora = "adapter-x", .lora_id = -1};
    publish(f->pub, "kv@pod-dp@" MODEL, 6, &el, 1, 0);
    wait_seq(f, "pod-dp", 0, 6, KVR_STREAM_SYNCED);
    assert_int_equal(matched(f, MODEL, "adapter-x", tok + 16, 16, 4, "pod-dp", 0), 4);
    assert_int_equal(matched(f, MODEL, NULL, tok + 16, 16, 4, "pod-dp", 0), 0);
    assert_int_equal(matched(f, MODEL, "other", tok + 16, 16, 4, "pod-dp", 0), 0);

    /* legacy lora_id without name → namespace "7"; block_size absent → learned (4) */
    struct tev eid = {.type = EV_STORED, .hashes = hid, .n = 2, .tokens = tok, .ntok = 8,
                      .bs = 0, .lora_id = 7, .array_form = true};
    /* first teach namespace (model,"7") its block size */
    struct tev eid0 = {.type = EV_STORED, .hashes = hid, .n = 1, .tokens = tok, .ntok = 4,
                       .bs = 4, .lora_id = 7};
    publish(f->pub, "kv@pod-dp@" MODEL, 7, &eid0, 1, 0);
    uint64_t hid2[1] = {43};
    eid.hashes = hid2;
    eid.n = 1;
    eid.tokens = tok + 4;
    eid.ntok = 4;
    eid.has_parent = true;
    eid.parent = 41;
    publish(f->pub, "kv@pod-dp@" MODEL, 8, &eid, 1, 0);
    wait_seq(f, "pod-dp", 0, 8, KVR_STREAM_SYNCED);
    assert_int_equal(matched(f, MODEL, "7", tok, 8, 4, "pod-dp", 0), 2);

    /* CPU tier */
    struct tev ec = {.type = EV_STORED, .hashes = hc, .n = 2, .tokens = tok, .ntok = 8, .bs = 4,
                     .medium = "CPU", .lora_id = -1};
    publish(f->pub, "kv@pod-dp@" MODEL, 10, &ec, 1, 1);
    wait_seq(f, "pod-dp", 1, 10, KVR_STREAM_SYNCED);
    assert_int_equal(worker_tier_blocks(f, "pod-dp", 1, KVR_TIER_CPU), 2);
    assert_int_equal(worker_tier_blocks(f, "pod-dp", 1, KVR_TIER_GPU), 2);
    /* a removal in the CPU tier leaves the GPU copy */
    uint64_t rc1[1] = {32};
    struct tev rc = {.type = EV_REMOVED, .hashes = rc1, .n = 1, .medium = "cpu"};
    publish(f->pub, "kv@pod-dp@" MODEL, 11, &rc, 1, 1);
    wait_seq(f, "pod-dp", 1, 11, KVR_STREAM_SYNCED);
    assert_int_equal(worker_tier_blocks(f, "pod-dp", 1, KVR_TIER_CPU), 1);
    assert_int_equal(worker_tier_blocks(f, "pod-dp", 1, KVR_TIER_GPU), 2);
    /* clear drops every tier of that rank only */
    struct tev clr = {.type = EV_CLEARED, .array_form = true};
    publish(f->pub, "kv@pod-dp@" MODEL, 12, &clr, 1, 1);
    wait_seq(f, "pod-dp", 1, 12, KVR_STREAM_SYNCED);
    assert_int_equal(worker_tier_blocks(f, "pod-dp", 1, KVR_TIER_CPU), 0);
    assert_int_equal(worker_tier_blocks(f, "pod-dp", 1, KVR_TIER_GPU), 0);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-dp", 0), 4);
    fx_free(f);
}

static void test_bad_frames_and_events(void **state)
{
    struct fx *f = fx_new(true, -1);
    unsigned char s8[8], s4[4] = {0, 0, 0, 1};
    uint32_t tok[16];
    uint64_t h[4] = {1, 2, 3, 4}, hb[2] = {5, 6};
    struct kvr_stream_info si;
    msgpack_sbuffer sb;
    (void)state;

    warm_up(f);
    tokens_seq(tok, 16, 50);
    be64(s8, 0);
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, "", 0, 2); /* 2 */
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, "\x90", 1, 4);
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s4, 4, "\x90", 1, 3);
    send_frames(f->pub, "kv@nomodel", 10, s8, 8, "\x90", 1, 3);
    /* an undecodable payload with a valid frame layout */
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, "\xc1\xc1", 2, 3);

    /* one batch: garbage, good store, unknown tag, store with bad token count, good remove */
    struct tev evs[5] = {
        {.type = EV_GARBAGE_INT},
        {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
         .lora_id = -1},
        {.type = EV_UNKNOWN_TAG},
        {.type = EV_STORED, .hashes = hb, .n = 2, .has_parent = true, .parent = 4, .tokens = tok,
         .ntok = 7, .bs = 4, .lora_id = -1},
        {.type = EV_REMOVED, .hashes = h + 3, .n = 1},
    };
    publish(f->pub, "kv@pod-b@" MODEL, 1, evs, 5, 0);
    si = wait_seq(f, "pod-b", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 3);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-b", 0), 3);
    wait_metric(f, "events_bad_frames_total", "reason=\"frames\"", 2);
    wait_metric(f, "events_bad_frames_total", "reason=\"seq\"", 1);
    wait_metric(f, "events_bad_frames_total", "reason=\"topic\"", 1);
    wait_metric(f, "events_bad_batches_total", "reason=\"decode\"", 1);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"not_event\"") +
                         metric(f, "events_skipped_total", "reason=\"no_tag\""),
                     1);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"unknown_tag\""), 1);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"token_count\""), 1);

    /* block size mismatch with the learned one: skipped, counted */
    struct tev bsm = {.type = EV_STORED, .hashes = hb, .n = 1, .tokens = tok, .ntok = 8, .bs = 8,
                      .lora_id = -1};
    publish(f->pub, "kv@pod-b@" MODEL, 2, &bsm, 1, 0);
    wait_seq(f, "pod-b", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(metric(f, "events_skipped_total", "reason=\"block_size_mismatch\""), 1);

    /* a batch without dp_rank (v0.9.0 shape) counts as rank 0 */
    pack_batch(&sb, &bsm, 0, -1);
    be64(s8, 3);
    send_frames(f->pub, "kv@pod-b@" MODEL, strlen("kv@pod-b@" MODEL), s8, 8, sb.data, sb.size, 3);
    msgpack_sbuffer_destroy(&sb);
    wait_seq(f, "pod-b", 0, 3, KVR_STREAM_SYNCED);
    fx_free(f);
}

static void test_restart_and_gap(void **state)
{
    struct fx *f = fx_new(true, -1);
    uint32_t tok[16];
    uint64_t h[4] = {1, 2, 3, 4}, h2[4] = {71, 72, 73, 74};
    struct kvr_stream_info si;
    (void)state;

    warm_up(f);
    tokens_seq(tok, 16, 300);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
                     .lora_id = -1};
    struct tev none[1] = {{0}};
    for (uint64_t q = 0; q < 4; q++)
        publish(f->pub, "kv@pod-r@" MODEL, q, q == 0 ? &st : none, q == 0 ? 1 : 0, 0);
    si = wait_seq(f, "pod-r", 0, 3, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);

    /* gap without replay endpoint (bind mode): counted, unsynced, batch applied */
    publish(f->pub, "kv@pod-r@" MODEL, 6, none, 0, 0);
    si = wait_seq(f, "pod-r", 0, 6, KVR_STREAM_UNSYNCED);
    assert_int_equal(si.gaps, 1);
    assert_int_equal(kvr_ingest_unsynced(f->ing), 1);
    assert_int_equal(metric(f, "events_unsynced_streams", NULL), 1);

    /* restart: seq back to 0 with new content; the old blocks are purged, synced again */
    uint32_t tok2[16];
    tokens_seq(tok2, 16, 9000);
    struct tev st2 = {.type = EV_STORED, .hashes = h2, .n = 4, .tokens = tok2, .ntok = 16,
                      .bs = 4, .lora_id = -1};
    publish(f->pub, "kv@pod-r@" MODEL, 0, &st2, 1, 0);
    si = wait_seq(f, "pod-r", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(si.restarts, 1);
    assert_int_equal(si.blocks, 4);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-r", 0), 0);
    assert_int_equal(matched(f, MODEL, NULL, tok2, 16, 4, "pod-r", 0), 4);
    assert_int_equal(metric(f, "events_restarts_total", NULL), 1);
    assert_true(metric(f, "events_blocks_restart_purged_total", NULL) >= 4);

    /* unsynced → AllBlocksCleared resyncs */
    publish(f->pub, "kv@pod-r@" MODEL, 5, none, 0, 0);
    wait_seq(f, "pod-r", 0, 5, KVR_STREAM_UNSYNCED);
    struct tev clr = {.type = EV_CLEARED};
    publish(f->pub, "kv@pod-r@" MODEL, 6, &clr, 1, 0);
    si = wait_seq(f, "pod-r", 0, 6, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 0);

    /* admin purge */
    publish(f->pub, "kv@pod-r@" MODEL, 7, &st, 1, 0);
    wait_seq(f, "pod-r", 0, 7, KVR_STREAM_SYNCED);
    uint64_t removed = 0;
    assert_int_equal(kvr_ingest_purge_pod(f->ing, "pod-r", &removed), 0);
    assert_int_equal(removed, 4);
    assert_int_equal(worker_tier_blocks(f, "pod-r", 0, KVR_TIER_GPU), 0);
    assert_int_equal(kvr_ingest_purge_pod(f->ing, "never-seen", &removed), -ENOENT);
    /* after the purge the next batch is a new baseline (not a restart) */
    publish(f->pub, "kv@pod-r@" MODEL, 3, &st, 1, 0);
    si = wait_seq(f, "pod-r", 0, 3, KVR_STREAM_SYNCED);
    assert_int_equal(si.restarts, 1);
    assert_int_equal(si.blocks, 4);
    fx_free(f);
}

/* ---- replay server (ROUTER) ---------------------------------------------------------- */

struct ring_ent {
    uint64_t seq;
    msgpack_sbuffer sb;
};

struct router {
    void *zctx;
    void *sock;
    char ep[256];
    const char *topic;
    bool v25;
    pthread_mutex_t mu;
    struct ring_ent ring[64];
    size_t nring;
    _Atomic bool stop;
    _Atomic int requests;
    uint64_t skip_seq; /* not served (simulates a hole in the ring); UINT64_MAX = none */
    bool mute;         /* never answers (a hung engine) */
    pthread_t th;
};

static void *router_main(void *arg)
{
    struct router *r = arg;
    while (!atomic_load(&r->stop)) {
        zmq_pollitem_t it = {.socket = r->sock, .events = ZMQ_POLLIN};
        zmq_msg_t id, empty, start;
        unsigned char s8[8];
        uint64_t from = 0;

        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zmq_msg_init(&id);
        zmq_msg_init(&empty);
        zmq_msg_init(&start);
        zmq_msg_recv(&id, r->sock, 0);
        zmq_msg_recv(&empty, r->sock, 0);
        zmq_msg_recv(&start, r->sock, 0);
        for (size_t i = 0; i < 8 && i < zmq_msg_size(&start); i++)
            from = (from << 8) | ((unsigned char *)zmq_msg_data(&start))[i];
        atomic_fetch_add(&r->requests, 1);
        if (r->mute) {
            zmq_msg_close(&id);
            zmq_msg_close(&empty);
            zmq_msg_close(&start);
            continue;
        }
        pthread_mutex_lock(&r->mu);
        for (size_t i = 0; i < r->nring; i++) {
            if (r->ring[i].seq < from || r->ring[i].seq == r->skip_seq)
                continue;
            be64(s8, r->ring[i].seq);
            zmq_send(r->sock, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
            zmq_send(r->sock, "", 0, ZMQ_SNDMORE);
            if (r->v25)
                zmq_send(r->sock, r->topic, strlen(r->topic), ZMQ_SNDMORE);
            zmq_send(r->sock, s8, 8, ZMQ_SNDMORE);
            zmq_send(r->sock, r->ring[i].sb.data, r->ring[i].sb.size, 0);
        }
        pthread_mutex_unlock(&r->mu);
        memset(s8, 0xff, 8);
        zmq_send(r->sock, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
        zmq_send(r->sock, "", 0, ZMQ_SNDMORE);
        if (r->v25)
            zmq_send(r->sock, "", 0, ZMQ_SNDMORE);
        zmq_send(r->sock, s8, 8, ZMQ_SNDMORE);
        zmq_send(r->sock, "", 0, 0);
        zmq_msg_close(&id);
        zmq_msg_close(&empty);
        zmq_msg_close(&start);
    }
    return NULL;
}

static struct router *router_new_mute(void *zctx, const char *topic, bool v25, bool mute)
{
    struct router *r = calloc(1, sizeof(*r));
    size_t len = sizeof(r->ep);
    int zero = 0;

    r->zctx = zctx;
    r->topic = topic;
    r->v25 = v25;
    r->skip_seq = UINT64_MAX;
    r->mute = mute;
    pthread_mutex_init(&r->mu, NULL);
    r->sock = zmq_socket(zctx, ZMQ_ROUTER);
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(r->sock, "tcp://127.0.0.1:*"), 0);
    zmq_getsockopt(r->sock, ZMQ_LAST_ENDPOINT, r->ep, &len);
    pthread_create(&r->th, NULL, router_main, r);
    return r;
}

static struct router *router_new(void *zctx, const char *topic, bool v25)
{
    return router_new_mute(zctx, topic, v25, false);
}

static void router_free(struct router *r)
{
    atomic_store(&r->stop, true);
    pthread_join(r->th, NULL);
    zmq_close(r->sock);
    for (size_t i = 0; i < r->nring; i++)
        msgpack_sbuffer_destroy(&r->ring[i].sb);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Publishes a batch (unless drop) and keeps it in the replay ring. */
static void engine_publish(void *pub, struct router *r, uint64_t seq, const struct tev *evs,
                           size_t n, bool drop)
{
    unsigned char s8[8];

    pthread_mutex_lock(&r->mu);
    assert_true(r->nring < 64);
    r->ring[r->nring].seq = seq;
    pack_batch(&r->ring[r->nring].sb, evs, n, 0);
    if (!drop) {
        be64(s8, seq);
        send_frames(pub, r->topic, strlen(r->topic), s8, 8, r->ring[r->nring].sb.data,
                    r->ring[r->nring].sb.size, 3);
    }
    r->nring++;
    pthread_mutex_unlock(&r->mu);
}

struct ep_seen {
    const char *ep;
    bool found;
    bool connected;
    bool from_config;
};

static void ep_cb(const struct kvr_endpoint_info *e, void *arg)
{
    struct ep_seen *s = arg;
    if (strcmp(e->endpoint, s->ep) == 0) {
        s->found = true;
        s->connected = e->connected;
        s->from_config = e->from_config;
    }
}

static void wait_connected(struct fx *f, const char *ep)
{
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    while (kvr_now_ms() < deadline) {
        struct ep_seen s = {.ep = ep};
        kvr_ingest_endpoints(f->ing, ep_cb, &s);
        if (s.found && s.connected)
            return;
        sleep_ms(5);
    }
    fail_msg("endpoint %s never connected", ep);
}

/* Connect mode with a replay ROUTER: dropped live batches come back through the replay. */
static void run_replay(bool v25)
{
    struct fx *f = fx_new(false, -1);
    const char *topic = "kv@pod-rp@" MODEL;
    struct router *r = router_new(f->zctx, topic, v25);
    struct kvr_err err;
    uint32_t tok[64];
    uint64_t h[16];
    struct kvr_stream_info si;

    assert_int_equal(kvr_ingest_endpoint_add(f->ing, f->ep, r->ep, NULL, &err), 0);
    assert_int_equal(kvr_ingest_endpoint_add(f->ing, f->ep, NULL, NULL, &err), -EEXIST);
    wait_connected(f, f->ep);
    warm_up(f);
    tokens_seq(tok, 64, 500);
    for (int i = 0; i < 16; i++)
        h[i] = 7000 + (uint64_t)i;
    /* a chain of 16 blocks over 8 batches (2 blocks each); batches 2, 3 and 6 are lost */
    for (uint64_t q = 0; q < 8; q++) {
        struct tev e = {.type = EV_STORED, .hashes = h + 2 * q, .n = 2, .has_parent = q > 0,
                        .parent = q > 0 ? h[2 * q - 1] : 0, .tokens = tok + 8 * q, .ntok = 8,
                        .bs = 4, .lora_id = -1};
        engine_publish(f->pub, r, q, &e, 1, q == 2 || q == 3 || q == 6);
    }
    si = wait_seq(f, "pod-rp", 0, 7, KVR_STREAM_SYNCED);
    assert_true(si.gaps >= 1);
    assert_true(si.replays >= 1);
    assert_int_equal(si.blocks, 16);
    assert_int_equal(matched(f, MODEL, NULL, tok, 64, 4, "pod-rp", 0), 16);
    assert_true(atomic_load(&r->requests) >= 1);
    assert_true(metric(f, "events_replayed_batches_total", NULL) >= 3);
    assert_true(metric(f, "events_replays_total", "result=\"ok\"") >= 1);
    /* nothing applied twice: every duplicate block store would show here */
    assert_int_equal(metric(f, "events_blocks_duplicate_total", NULL), 0);

    /* a hole in the engine's ring: replay cannot recover it → unsynced */
    pthread_mutex_lock(&r->mu);
    r->skip_seq = 9;
    pthread_mutex_unlock(&r->mu);
    struct tev none[1] = {{0}};
    engine_publish(f->pub, r, 8, none, 0, false);
    engine_publish(f->pub, r, 9, none, 0, true);
    engine_publish(f->pub, r, 10, none, 0, false);
    si = wait_seq(f, "pod-rp", 0, 10, KVR_STREAM_UNSYNCED);
    assert_true(metric(f, "events_replays_total", "result=\"failed\"") >= 1);

    assert_int_equal(kvr_ingest_endpoint_del(f->ing, f->ep, &err), 0);
    assert_int_equal(kvr_ingest_endpoint_del(f->ing, f->ep, &err), -ENOENT);
    router_free(r);
    fx_free(f);
}

static void test_replay_v24(void **state)
{
    (void)state;
    run_replay(false);
}

static void test_replay_v25(void **state)
{
    (void)state;
    run_replay(true);
}

/* Connect mode: an engine that goes away for longer than purge_after_disconnect is purged;
 * a pod override names an engine whose topic is empty. */
static void test_disconnect_purge_and_override(void **state)
{
    struct fx *f = fx_new(false, 200);
    struct kvr_err err;
    uint32_t tok[16];
    uint64_t h[4] = {1, 2, 3, 4};
    struct kvr_stream_info si;
    unsigned char s8[8];
    msgpack_sbuffer sb;
    (void)state;

    assert_int_equal(kvr_ingest_endpoint_add(f->ing, f->ep, NULL, "pod-o@" MODEL, &err), 0);
    wait_connected(f, f->ep);
    tokens_seq(tok, 16, 40);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
                     .lora_id = -1};
    pack_batch(&sb, &st, 1, 0);
    /* slow joiner: publish seq 0, 1, ... (empty topic frame, vLLM's default; the same
     * blocks again are reference-counted duplicates) until the stream is seen */
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    uint64_t seq = 0;
    while (!get_stream(f, "pod-o", 0, &si)) {
        assert_true(kvr_now_ms() < deadline);
        be64(s8, seq++);
        send_frames(f->pub, "", 0, s8, 8, sb.data, sb.size, 3);
        sleep_ms(5);
    }
    msgpack_sbuffer_destroy(&sb);
    si = wait_seq(f, "pod-o", 0, seq - 1, -1);
    assert_int_equal(si.blocks, 4);
    assert_int_equal(si.restarts, 0);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 4, "pod-o", 0), 4);

    /* the engine goes away */
    zmq_close(f->pub);
    f->pub = NULL;
    deadline = kvr_now_ms() + WAIT_MS;
    while (worker_tier_blocks(f, "pod-o", 0, KVR_TIER_GPU) != 0) {
        assert_true(kvr_now_ms() < deadline);
        sleep_ms(10);
    }
    assert_true(metric(f, "events_disconnect_purges_total", NULL) >= 1);
    assert_true(metric(f, "events_disconnects_total", NULL) >= 1);
    fx_free(f);
}

static void short_replay_timeout(struct kvr_conf *c)
{
    c->replay_timeout_ms = 300;
}

static void no_replays(struct kvr_conf *c)
{
    c->max_concurrent_replays = 0;
}

/* An engine whose ROUTER never answers: the stream replays until the deadline, buffering its
 * live batches, then applies them (in order, once) and is unsynced. */
static void test_replay_timeout(void **state)
{
    struct fx *f = fx_new_conf(false, -1, short_replay_timeout);
    const char *topic = "kv@pod-to@" MODEL;
    struct router *r = router_new_mute(f->zctx, topic, true, true);
    struct kvr_err err;
    struct tev none[1] = {{0}};
    struct kvr_stream_info si;
    int64_t deadline;
    (void)state;

    assert_int_equal(kvr_ingest_endpoint_add(f->ing, f->ep, r->ep, NULL, &err), 0);
    wait_connected(f, f->ep);
    warm_up(f);
    engine_publish(f->pub, r, 0, none, 0, false);
    wait_seq(f, "pod-to", 0, 0, KVR_STREAM_SYNCED);
    engine_publish(f->pub, r, 1, none, 0, true);
    engine_publish(f->pub, r, 2, none, 0, false);
    /* replaying: seq 2 is held back */
    deadline = kvr_now_ms() + WAIT_MS;
    while (!(get_stream(f, "pod-to", 0, &si) && si.state == KVR_STREAM_REPLAYING)) {
        assert_true(kvr_now_ms() < deadline);
        sleep_ms(2);
    }
    assert_int_equal(si.last_seq, 0);
    engine_publish(f->pub, r, 3, none, 0, false);
    si = wait_seq(f, "pod-to", 0, 3, KVR_STREAM_UNSYNCED);
    assert_int_equal(si.gaps, 1);
    assert_int_equal(si.replays, 1);
    assert_true(atomic_load(&r->requests) >= 1);
    assert_true(metric(f, "events_replays_total", "result=\"failed\"") >= 1);
    assert_true(metric(f, "events_buffered_batches_total", NULL) >= 1);
    router_free(r);
    fx_free(f);
}

/* max_concurrent_replays = 0: a gap is never replayed, even with a replay endpoint. */
static void test_replay_disabled(void **state)
{
    struct fx *f = fx_new_conf(false, -1, no_replays);
    const char *topic = "kv@pod-nr@" MODEL;
    struct router *r = router_new(f->zctx, topic, true);
    struct kvr_err err;
    struct tev none[1] = {{0}};
    struct kvr_stream_info si;
    (void)state;

    assert_int_equal(kvr_ingest_endpoint_add(f->ing, f->ep, r->ep, NULL, &err), 0);
    wait_connected(f, f->ep);
    warm_up(f);
    engine_publish(f->pub, r, 0, none, 0, false);
    engine_publish(f->pub, r, 1, none, 0, true);
    engine_publish(f->pub, r, 2, none, 0, false);
    si = wait_seq(f, "pod-nr", 0, 2, KVR_STREAM_UNSYNCED);
    assert_int_equal(si.replays, 0);
    assert_int_equal(atomic_load(&r->requests), 0);
    router_free(r);
    fx_free(f);
}

/* Many pods over both writers, interleaved, with a small queue (back-pressure): every batch
 * is applied exactly once and in order per stream. */
static void test_many_pods_backpressure(void **state)
{
    struct fx *f = fx_new(true, -1);
    enum { PODS = 8, BATCHES = 200 };
    uint32_t tok[8];
    (void)state;

    warm_up(f);
    tokens_seq(tok, 8, 1);
    for (uint64_t q = 0; q < BATCHES; q++) {
        for (int p = 0; p < PODS; p++) {
            char topic[64];
            /* batch 0 stores a 2-block root; later ones store 2 children of it and
             * remove them again in the same batch (the last one keeps them) */
            uint64_t h[2] = {q * 2 + 1, q * 2 + 2};
            struct tev e = {.type = EV_STORED, .hashes = h, .n = 2, .has_parent = q > 0,
                            .parent = 2, .tokens = tok, .ntok = 8, .bs = 4, .lora_id = -1};
            struct tev rm = {.type = EV_REMOVED, .hashes = h, .n = 2};
            struct tev evs[2] = {e, rm};
            snprintf(topic, sizeof(topic), "kv@bp-%d@" MODEL, p);
            publish(f->pub, topic, q, evs, q == 0 || q == BATCHES - 1 ? 1 : 2, 0);
        }
    }
    for (int p = 0; p < PODS; p++) {
        char pod[32];
        struct kvr_stream_info si;
        snprintf(pod, sizeof(pod), "bp-%d", p);
        si = wait_seq(f, pod, 0, BATCHES - 1, KVR_STREAM_SYNCED);
        assert_int_equal(si.gaps, 0);
        assert_int_equal(si.blocks, 4);
    }
    assert_int_equal(metric(f, "events_duplicate_batches_total", NULL), 0);
    fx_free(f);
}

static void test_endpoint_errors(void **state)
{
    struct fx *f = fx_new(true, -1);
    struct kvr_err err;
    struct kvr_buf b;
    (void)state;
    assert_int_equal(kvr_ingest_endpoint_add(f->ing, "not an endpoint", NULL, NULL, &err),
                     -EINVAL);
    assert_int_equal(kvr_ingest_endpoint_add(f->ing, "", NULL, NULL, &err), -EINVAL);
    assert_int_equal(kvr_ingest_endpoint_add(f->ing, "tcp://127.0.0.1:1", "bad", NULL, &err),
                     -EINVAL);
    assert_int_equal(kvr_ingest_endpoint_add(f->ing, "tcp://127.0.0.1:1", NULL, "@m", &err),
                     -EINVAL);
    assert_int_equal(kvr_ingest_endpoint_add(f->ing, "tcp://127.0.0.1:1", NULL, NULL, &err), 0);
    struct ep_seen s = {.ep = "tcp://127.0.0.1:1"};
    kvr_ingest_endpoints(f->ing, ep_cb, &s);
    assert_true(s.found);
    assert_false(s.from_config);
    assert_int_equal(kvr_ingest_endpoint_del(f->ing, "tcp://127.0.0.1:1", &err), 0);
    assert_int_equal(kvr_ingest_endpoint_del(f->ing, "tcp://127.0.0.1:1", &err), -ENOENT);
    /* metrics render without streams */
    kvr_buf_init(&b);
    kvr_ingest_metrics(f->ing, &b);
    assert_non_null(strstr(b.data, "kvrouter_events_lag_seconds_bucket"));
    assert_null(strstr(b.data, "kvrouter_index_entries")); /* httpapi renders the index's */
    kvr_buf_free(&b);
    /* stop is idempotent and ready goes false */
    kvr_ingest_stop(f->ing);
    kvr_ingest_stop(f->ing);
    assert_false(kvr_ingest_ready(f->ing));
    fx_free(f);
}

/* Garbage from the wire: random frame counts, seq sizes, topics and payloads. Nothing
 * crashes, every message is either counted as bad or handed to a writer, and a valid batch
 * after the storm is applied. */
static void test_random_garbage(void **state)
{
    struct fx *f = fx_new(true, -1);
    unsigned seed = (unsigned)(getenv("KVR_SEED") ? atoi(getenv("KVR_SEED")) : 4242);
    enum { N = 2000 };
    unsigned char buf[256];
    uint32_t tok[8];
    uint64_t h[2] = {1, 2};
    double sent_before, handed, bad = 0;
    (void)state;

    warm_up(f);
    sent_before = metric(f, "events_messages_total", NULL);
    srand(seed);
    for (int i = 0; i < N; i++) {
        int nframes = 1 + rand() % 5;
        for (int k = 0; k < nframes; k++) {
            size_t len = (size_t)(rand() % 40);
            int kind = rand() % 4;
            for (size_t j = 0; j < len; j++)
                buf[j] = (unsigned char)rand();
            if (k == 0 && kind < 2) {
                /* plausible topics, some valid */
                len = (size_t)snprintf((char *)buf, sizeof(buf), kind ? "kv@g%d@m" : "kv@g%d",
                                       rand() % 4);
            } else if (k == 1 && kind < 3) {
                len = 8;
            }
            assert_true(zmq_send(f->pub, buf, len, k + 1 < nframes ? ZMQ_SNDMORE : 0) >= 0);
        }
    }
    tokens_seq(tok, 8, 77);
    struct tev e = {.type = EV_STORED, .hashes = h, .n = 2, .tokens = tok, .ntok = 8, .bs = 4,
                    .lora_id = -1};
    publish(f->pub, "kv@after-storm@" MODEL, 5, &e, 1, 0);
    wait_seq(f, "after-storm", 0, 5, KVR_STREAM_SYNCED);
    handed = metric(f, "events_messages_total", NULL) - sent_before;
    for (int r = 0; r < 4; r++) {
        static const char *const reasons[] = {"frames", "seq", "topic", "too_many_topics"};
        char lab[64];
        snprintf(lab, sizeof(lab), "reason=\"%s\"", reasons[r]);
        bad += metric(f, "events_bad_frames_total", lab);
    }
    /* every message accounted for (SUB filter "kv@": non-matching topics never arrive, so
     * compare with what arrived: at most N + 1) */
    assert_true(handed + bad <= N + 1);
    assert_true(handed >= 1);
    assert_true(bad > 0);
    assert_true(matched(f, MODEL, NULL, tok, 8, 4, "after-storm", 0) == 2);
    fx_free(f);
}

/* IPv6: a bind on [::1] is reported as such, and an IPv6 engine gets through. */
static void test_ipv6_bind(void **state)
{
    struct kvr_conf c;
    struct kvr_index *ix;
    struct kvr_index_reader *rd;
    struct kvr_ingest *ing;
    struct kvr_err err = {{0}};
    char *binds[1] = {"tcp://[::1]:*"};
    struct kvr_index_opts io = {0};
    const char *eps[1];
    void *zctx, *pub;
    int one = 1, zero = 0;
    struct fx shim;
    (void)state;

    conf_defaults(&c);
    c.bind = binds;
    c.nbind = 1;
    assert_int_equal(kvr_index_create(&io, &ix), 0);
    assert_int_equal(kvr_index_reader_create(ix, &rd), 0);
    assert_int_equal(kvr_ingest_create(&c, ix, &ing, &err), 0);
    if (kvr_ingest_start(ing, &err) != 0) {
        /* no IPv6 loopback on this machine: nothing to test */
        kvr_ingest_destroy(ing);
        kvr_index_reader_destroy(rd);
        kvr_index_destroy(ix);
        skip();
    }
    assert_int_equal(kvr_ingest_bound_endpoints(ing, eps, 1), 1);
    assert_non_null(strstr(eps[0], "tcp://[::1]:"));
    zctx = zmq_ctx_new();
    pub = zmq_socket(zctx, ZMQ_PUB);
    zmq_setsockopt(pub, ZMQ_IPV6, &one, sizeof(one));
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_connect(pub, eps[0]), 0);
    memset(&shim, 0, sizeof(shim));
    shim.ing = ing;
    shim.ix = ix;
    shim.rd = rd;
    shim.pub = pub;
    warm_up(&shim);
    zmq_close(pub);
    zmq_ctx_term(zctx);
    kvr_ingest_destroy(ing);
    kvr_index_reader_destroy(rd);
    kvr_index_destroy(ix);
}

static void test_bind_error(void **state)
{
    struct kvr_conf c;
    struct kvr_index *ix;
    struct kvr_ingest *ing;
    struct kvr_err err = {{0}};
    char *binds[1] = {"tcp://nonsense"};
    struct kvr_index_opts io = {0};
    (void)state;
    conf_defaults(&c);
    c.bind = binds;
    c.nbind = 1;
    assert_int_equal(kvr_index_create(&io, &ix), 0);
    assert_int_equal(kvr_ingest_create(&c, ix, &ing, &err), 0);
    assert_true(kvr_ingest_start(ing, &err) < 0);
    assert_non_null(strstr(err.msg, "tcp://nonsense"));
    kvr_ingest_destroy(ing);
    kvr_index_destroy(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_remove_clear),
        cmocka_unit_test(test_hybrid_groups),
        cmocka_unit_test(test_dp_ranks_lora_tiers),
        cmocka_unit_test(test_bad_frames_and_events),
        cmocka_unit_test(test_restart_and_gap),
        cmocka_unit_test(test_replay_v24),
        cmocka_unit_test(test_replay_v25),
        cmocka_unit_test(test_replay_timeout),
        cmocka_unit_test(test_replay_disabled),
        cmocka_unit_test(test_disconnect_purge_and_override),
        cmocka_unit_test(test_many_pods_backpressure),
        cmocka_unit_test(test_endpoint_errors),
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_ipv6_bind),
        cmocka_unit_test(test_bind_error),
    };
    kvr_log_configure(getenv("KVR_TEST_DEBUG") ? KVR_LOG_DEBUG : KVR_LOG_ERROR, KVR_LOG_TEXT);
    if (getenv("KVR_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("KVR_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
