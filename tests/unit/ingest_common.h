/* ingest_common.h — test helpers shared by test_ingest.c (batches pushed straight into
 * ingest's writer queues, no sockets) and test_zsub.c (the same batches over real ZeroMQ,
 * through zsub, into ingest, wired as daemon/main.c does): msgpack batches of test events
 * (msgpack-c packer, both event eras), the fixture, and observing the results through the
 * streams (kvr_ingest_streams), the index and the metrics text. Every wait is bounded.
 *
 * Header-only test code, included by one test file each; that file defines publish() for its
 * own transport and the fixture's constructor.
 */
#ifndef KVR_TEST_INGEST_COMMON_H
#define KVR_TEST_INGEST_COMMON_H

#pragma GCC diagnostic ignored "-Wunused-function"

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

#include "core/conf.h"
#include "index/hash.h"
#include "index/index.h"
#include "events/ingest.h"
#include "core/log.h"
#include "core/metrics.h"

#define WAIT_MS 10000

#define MODEL "org/model-7b"

/* ---- fixture ------------------------------------------------------------------------ */

struct kvr_zsub;

struct fx {
    struct kvr_conf conf;
    char *bind_list[1];
    struct kvr_index *ix;
    struct kvr_index_reader *rd;
    struct kvr_ingest *ing;
    struct kvr_zsub *zsub;   /* test_zsub only */
    void *zctx;              /* test_zsub only */
    void *pub;               /* what publish() sends through (a PUB socket, or the feeder) */
    char ep[256];
    /* appends the producer's metric lines to what kvr_ingest_metrics rendered (or NULL) */
    void (*more_metrics)(struct fx *f, struct kvr_buf *b);
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

/* Sends one batch [topic, be64 seq, batch] through f->pub (defined by each test file). */
static void publish(void *pub, const char *topic, uint64_t seq, const struct tev *evs, size_t n,
                    int dp_rank);

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
    if (f->more_metrics != NULL)
        f->more_metrics(f, &b);
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

#endif
