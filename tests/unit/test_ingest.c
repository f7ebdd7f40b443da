/* test_ingest.c — ingest without sockets: the test is the producer. Batches (msgpack-c
 * packer, both event eras; ingest_common.h) are pushed straight into ingest's writer queues
 * as struct kvr_queue_msg items with malloc'd payloads, and replays are answered through a
 * fake intake; the results are checked through the index (kvr_index_find,
 * kvr_index_worker_blocks), the streams (kvr_ingest_streams) and the metrics text. Every
 * payload handed over must be released exactly once (checked at teardown). The same cases
 * over real ZeroMQ, and zsub's own (frames, replay client, disconnects, endpoints), are in
 * test_zsub.c. Every wait is bounded.
 */
#include "ingest_common.h"

#include <stdatomic.h>

#include "events/decode.h"
#include "events/queue.h"
#include "events/queue_msg.h"
#include "route/score.h"

/* ---- the producer side, without sockets ---------------------------------------------- */

#define MAX_TOPICS 64

struct feeder {
    struct kvr_queue *const *qs;
    uint32_t nq;
    struct kvr_queue_topic topics[MAX_TOPICS];
    char names[MAX_TOPICS][2][128];
    size_t ntopics;
    bool can_replay; /* what LIVE items say about their source */
    uint32_t source;
};

static _Atomic long g_payloads; /* handed to ingest and not released yet */

static void payload_free(void *ctx)
{
    free(ctx);
    atomic_fetch_sub(&g_payloads, 1);
}

/* Interns "kv@<pod>@<model>" as zsub would (the test's topics are well formed). */
static const struct kvr_queue_topic *feeder_topic(struct feeder *fd, const char *topic)
{
    const char *pod = topic + 3, *at = strchr(pod, '@');
    size_t plen;

    assert_true(strncmp(topic, "kv@", 3) == 0 && at != NULL);
    plen = (size_t)(at - pod);
    for (size_t i = 0; i < fd->ntopics; i++)
        if (strlen(fd->names[i][0]) == plen && memcmp(fd->names[i][0], pod, plen) == 0 &&
            strcmp(fd->names[i][1], at + 1) == 0)
            return &fd->topics[i];
    assert_true(fd->ntopics < MAX_TOPICS && plen < 128 && strlen(at + 1) < 128);
    struct kvr_queue_topic *t = &fd->topics[fd->ntopics];
    memcpy(fd->names[fd->ntopics][0], pod, plen);
    fd->names[fd->ntopics][0][plen] = '\0';
    snprintf(fd->names[fd->ntopics][1], 128, "%s", at + 1);
    t->pod = fd->names[fd->ntopics][0];
    t->model = fd->names[fd->ntopics][1];
    t->shard = kvr_queue_shard(t->pod, plen, fd->nq);
    t->id = (uint32_t)fd->ntopics++;
    return t;
}

/* Pushes one item into the topic's queue (waiting while it is full, like zsub). */
static void feed(struct feeder *fd, const struct kvr_queue_msg *m)
{
    struct kvr_queue_msg *it = kvr_queue_reserve(fd->qs[m->topic->shard], NULL);

    assert_non_null(it);
    *it = *m;
    kvr_queue_commit(fd->qs[m->topic->shard]);
}

static struct kvr_queue_payload payload_of(const void *data, size_t len)
{
    void *copy = malloc(len ? len : 1);

    assert_non_null(copy);
    memcpy(copy, data, len);
    atomic_fetch_add(&g_payloads, 1);
    return (struct kvr_queue_payload){.data = copy, .len = len, .release = payload_free,
                                      .ctx = copy};
}

static void publish(void *pub, const char *topic, uint64_t seq, const struct tev *evs, size_t n,
                    int dp_rank)
{
    struct feeder *fd = pub;
    msgpack_sbuffer sb;
    struct kvr_queue_msg m = {.kind = KVR_QUEUE_LIVE, .seq = seq, .source = fd->source,
                              .can_replay = fd->can_replay};

    pack_batch(&sb, evs, n, dp_rank);
    m.topic = feeder_topic(fd, topic);
    m.recv_ns = kvr_now_ns();
    m.payload = payload_of(sb.data, sb.size);
    feed(fd, &m);
    msgpack_sbuffer_destroy(&sb);
}

static int64_t g_forget_after_ms; /* [events] forget_after of the next fixture */

/* A fake intake: records replay requests (from writer threads); answers nothing itself. */
struct fake_intake {
    pthread_mutex_t mu;
    struct kvr_queue_replay_req reqs[16];
    int nreqs;
    int rc; /* what replay() returns */
    const struct kvr_queue_topic *forgot[16]; /* topics released (forget()) */
    int nforgot;
};

static int fake_forget(void *arg, const struct kvr_queue_topic *t)
{
    struct fake_intake *fi = arg;

    pthread_mutex_lock(&fi->mu);
    assert_true(fi->nforgot < 16);
    fi->forgot[fi->nforgot++] = t;
    pthread_mutex_unlock(&fi->mu);
    return 0;
}

static int forgot_count(struct fake_intake *fi)
{
    pthread_mutex_lock(&fi->mu);
    int n = fi->nforgot;
    pthread_mutex_unlock(&fi->mu);
    return n;
}

static int fake_replay(void *arg, const struct kvr_queue_replay_req *r)
{
    struct fake_intake *fi = arg;
    int rc;

    pthread_mutex_lock(&fi->mu);
    if (fi->rc == 0 && fi->nreqs < 16)
        fi->reqs[fi->nreqs++] = *r;
    rc = fi->rc;
    pthread_mutex_unlock(&fi->mu);
    return rc;
}

static bool fake_running(void *arg)
{
    (void)arg;
    return true;
}

/* Waits for the n-th (1-based) replay request. */
static struct kvr_queue_replay_req wait_request(struct fake_intake *fi, int n)
{
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    struct kvr_queue_replay_req r;

    for (;;) {
        pthread_mutex_lock(&fi->mu);
        if (fi->nreqs >= n) {
            r = fi->reqs[n - 1];
            pthread_mutex_unlock(&fi->mu);
            return r;
        }
        pthread_mutex_unlock(&fi->mu);
        if (kvr_now_ms() >= deadline)
            fail_msg("no replay request #%d", n);
        sleep_ms(2);
    }
}

/* ---- fixture ------------------------------------------------------------------------ */

/* Creates index + ingest (started); f->pub is the feeder. intake may be NULL (no replays). */
static struct fx *fx_new_intake(const struct kvr_ingest_intake *intake)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct feeder *fd = calloc(1, sizeof(*fd));
    struct kvr_index_opts io = {0};
    struct kvr_err err = {{0}};

    conf_defaults(&f->conf);
    f->conf.forget_after_ms = g_forget_after_ms;
    io.orphan_capacity = 1024;
    assert_int_equal(kvr_index_create(&io, &f->ix), 0);
    assert_int_equal(kvr_index_reader_create(f->ix, &f->rd), 0);
    assert_int_equal(kvr_ingest_create(&f->conf, f->ix, &f->ing, &err), 0);
    if (intake != NULL)
        kvr_ingest_set_intake(f->ing, intake);
    if (kvr_ingest_start(f->ing, &err) != 0)
        fail_msg("start: %s", err.msg);
    assert_true(kvr_ingest_ready(f->ing));
    fd->qs = kvr_ingest_queues(f->ing, &fd->nq);
    assert_int_equal(fd->nq, f->conf.writer_threads);
    f->pub = fd;
    return f;
}

static struct fx *fx_new(void)
{
    return fx_new_intake(NULL);
}

static void fx_free(struct fx *f)
{
    kvr_ingest_stop(f->ing);
    kvr_ingest_destroy(f->ing);
    /* every payload handed over was released exactly once */
    assert_int_equal(atomic_load(&g_payloads), 0);
    kvr_index_reader_destroy(f->rd);
    kvr_index_destroy(f->ix);
    free(f->pub);
    free(f);
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_store_remove_clear(void **state)
{
    struct fx *f = fx_new();
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
    struct fx *f = fx_new();
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
    struct fx *f = fx_new();
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

static void test_restart_and_gap(void **state)
{
    struct fx *f = fx_new();
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
    /* the pod is forgotten: not indexed, not listed, its worker id free */
    uint32_t wid;
    assert_int_equal(kvr_index_worker_lookup(f->ix, "pod-r", 0, &wid), -ENOENT);
    assert_false(get_stream(f, "pod-r", 0, &si));
    assert_int_equal(metric(f, "events_pods_forgotten_total", NULL), 1);
    assert_int_equal(kvr_ingest_purge_pod(f->ing, "pod-r", &removed), -ENOENT);
    assert_int_equal(kvr_ingest_purge_pod(f->ing, "never-seen", &removed), -ENOENT);
    /* after the purge the next batch is a new baseline (not a restart) */
    publish(f->pub, "kv@pod-r@" MODEL, 3, &st, 1, 0);
    si = wait_seq(f, "pod-r", 0, 3, KVR_STREAM_SYNCED);
    assert_int_equal(si.restarts, 1);
    assert_int_equal(si.blocks, 4);
    fx_free(f);
}

/* Many pods over both writers, interleaved, with a small queue (back-pressure): every batch
 * is applied exactly once and in order per stream. */
static void test_many_pods_backpressure(void **state)
{
    struct fx *f = fx_new();
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


/* Replays through the intake interface: a gap asks for a replay from the next expected seq
 * (with the stream's ctx and gen), live batches are held back until the REPLAY items and the
 * REPLAY_END come back on the same queue, then applied once and in order. A refused request
 * abandons the replay: the stream is unsynced and the held batch applied. */
static void test_replay_via_intake(void **state)
{
    struct fake_intake fi = {.rc = 0};
    struct kvr_ingest_intake in = {.replay = fake_replay, .running = fake_running, .arg = &fi};
    struct fx *f;
    struct feeder *fd;
    uint32_t tok[64];
    uint64_t h[16];
    struct kvr_stream_info si;
    struct kvr_queue_replay_req r;
    msgpack_sbuffer sb;
    (void)state;

    pthread_mutex_init(&fi.mu, NULL);
    f = fx_new_intake(&in);
    fd = f->pub;
    fd->can_replay = true;
    fd->source = 7;
    tokens_seq(tok, 64, 500);
    for (int i = 0; i < 16; i++)
        h[i] = 7000 + (uint64_t)i;
    struct tev e[8];
    for (uint64_t q = 0; q < 8; q++)
        e[q] = (struct tev){.type = EV_STORED, .hashes = h + 2 * q, .n = 2, .has_parent = q > 0,
                            .parent = q > 0 ? h[2 * q - 1] : 0, .tokens = tok + 8 * q,
                            .ntok = 8, .bs = 4, .lora_id = -1};
    /* 0, 1 live; 2, 3 lost; 4, 5 live (held back); then the replay answers 2..5 */
    publish(fd, "kv@pod-rp@" MODEL, 0, &e[0], 1, 0);
    publish(fd, "kv@pod-rp@" MODEL, 1, &e[1], 1, 0);
    wait_seq(f, "pod-rp", 0, 1, KVR_STREAM_SYNCED);
    publish(fd, "kv@pod-rp@" MODEL, 4, &e[4], 1, 0);
    r = wait_request(&fi, 1);
    assert_int_equal(r.start, 2);
    assert_int_equal(r.source, 7);
    assert_string_equal(r.topic->pod, "pod-rp");
    assert_int_equal(r.shard, r.topic->shard);
    publish(fd, "kv@pod-rp@" MODEL, 5, &e[5], 1, 0);
    si = wait_seq(f, "pod-rp", 0, 1, KVR_STREAM_REPLAYING);
    for (uint64_t q = 2; q <= 5; q++) {
        struct kvr_queue_msg m = {.kind = KVR_QUEUE_REPLAY, .topic = r.topic, .ctx = r.ctx,
                                  .gen = r.gen, .seq = q};
        pack_batch(&sb, &e[q], 1, 0);
        m.payload = payload_of(sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
        feed(fd, &m);
    }
    {
        struct kvr_queue_msg m = {.kind = KVR_QUEUE_REPLAY_END, .topic = r.topic, .ctx = r.ctx,
                                  .gen = r.gen, .ok = true};
        feed(fd, &m);
    }
    si = wait_seq(f, "pod-rp", 0, 5, KVR_STREAM_SYNCED);
    assert_int_equal(si.gaps, 1);
    assert_int_equal(si.replays, 1);
    assert_int_equal(si.blocks, 12);
    assert_int_equal(matched(f, MODEL, NULL, tok, 48, 4, "pod-rp", 0), 12);
    assert_int_equal(metric(f, "events_replayed_batches_total", NULL), 4);
    assert_int_equal(metric(f, "events_duplicate_batches_total", NULL), 2); /* 4, 5 buffered */
    assert_int_equal(metric(f, "events_replays_total", "result=\"ok\""), 1);
    assert_int_equal(metric(f, "events_blocks_duplicate_total", NULL), 0);
    /* a stale REPLAY_END (old gen) is counted and ignored */
    {
        struct kvr_queue_msg m = {.kind = KVR_QUEUE_REPLAY_END, .topic = r.topic, .ctx = r.ctx,
                                  .gen = r.gen, .ok = true};
        feed(fd, &m);
        wait_metric(f, "events_stale_replay_items_total", NULL, 1);
    }

    /* the intake refuses: replay abandoned, the batch applied, stream unsynced */
    pthread_mutex_lock(&fi.mu);
    fi.rc = -ESHUTDOWN;
    pthread_mutex_unlock(&fi.mu);
    publish(fd, "kv@pod-rp@" MODEL, 7, &e[7], 1, 0);
    si = wait_seq(f, "pod-rp", 0, 7, KVR_STREAM_UNSYNCED);
    assert_int_equal(si.gaps, 2);
    assert_int_equal(metric(f, "events_replay_aborts_total", NULL), 1);
    fx_free(f);
    pthread_mutex_destroy(&fi.mu);
}

/* A PURGE item (the producer's source went away) clears the workers that source fed, and the
 * next batch is a new baseline; items of another source are left alone. */
static void test_purge_item(void **state)
{
    struct fx *f = fx_new();
    struct feeder *fd = f->pub;
    uint32_t tok[16];
    uint64_t h[4] = {1, 2, 3, 4};
    struct kvr_stream_info si;
    const struct kvr_queue_topic *t;
    (void)state;

    tokens_seq(tok, 16, 40);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
                     .lora_id = -1};
    fd->source = 3;
    publish(fd, "kv@pod-p@" MODEL, 10, &st, 1, 0);
    si = wait_seq(f, "pod-p", 0, 10, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);
    t = feeder_topic(fd, "kv@pod-p@" MODEL);
    {
        struct kvr_queue_msg m = {.kind = KVR_QUEUE_PURGE, .topic = t, .source = 4};
        feed(fd, &m); /* not the source that fed it */
        struct kvr_queue_msg m2 = {.kind = KVR_QUEUE_PURGE, .topic = t, .source = 3};
        feed(fd, &m2);
    }
    wait_metric(f, "events_blocks_purged_total", NULL, 4);
    assert_int_equal(worker_tier_blocks(f, "pod-p", 0, KVR_TIER_GPU), 0);
    publish(fd, "kv@pod-p@" MODEL, 2, &st, 1, 0); /* a new baseline, not a restart */
    si = wait_seq(f, "pod-p", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(si.restarts, 0);
    assert_int_equal(si.blocks, 4);
    fx_free(f);
}

/* Items never consumed (ingest created, never started) still have their payloads released by
 * destroy; stop is idempotent and ready stays false. */
static void test_destroy_releases_unconsumed(void **state)
{
    struct kvr_conf c;
    struct kvr_index *ix;
    struct kvr_ingest *ing;
    struct kvr_err err = {{0}};
    struct kvr_index_opts io = {0};
    struct feeder fd = {0};
    struct tev none[1] = {{0}};
    (void)state;

    conf_defaults(&c);
    assert_int_equal(kvr_index_create(&io, &ix), 0);
    assert_int_equal(kvr_ingest_create(&c, ix, &ing, &err), 0);
    fd.qs = kvr_ingest_queues(ing, &fd.nq);
    for (uint64_t q = 0; q < 10; q++)
        publish(&fd, "kv@pod-u@" MODEL, q, none, 0, 0);
    assert_true(atomic_load(&g_payloads) == 10);
    kvr_ingest_stop(ing);
    kvr_ingest_stop(ing);
    assert_false(kvr_ingest_ready(ing));
    kvr_ingest_destroy(ing);
    assert_int_equal(atomic_load(&g_payloads), 0);
    kvr_index_destroy(ix);
}

/* DELETE of a pod whose stream waits for a replay: the topic is released; its FORGET item
 * frees the topic's state only once that replay ended (its items carry the stream). */
static void test_forget_waits_for_replay(void **state)
{
    struct fake_intake fi = {.rc = 0};
    struct kvr_ingest_intake in = {.replay = fake_replay, .running = fake_running,
                                   .forget = fake_forget, .arg = &fi};
    struct fx *f;
    struct feeder *fd;
    uint32_t tok[8];
    uint64_t h[2] = {8100, 8101};
    uint64_t removed = 0;
    struct kvr_stream_info si;
    (void)state;

    pthread_mutex_init(&fi.mu, NULL);
    f = fx_new_intake(&in);
    fd = f->pub;
    fd->can_replay = true;
    tokens_seq(tok, 8, 900);
    struct tev e = {.type = EV_STORED, .hashes = h, .n = 2, .tokens = tok, .ntok = 8, .bs = 4,
                    .lora_id = -1};
    publish(fd, "kv@pod-f@" MODEL, 0, &e, 1, 0);
    wait_seq(f, "pod-f", 0, 0, KVR_STREAM_SYNCED);
    publish(fd, "kv@pod-f@" MODEL, 3, NULL, 0, 0); /* gap: a replay is asked for */
    struct kvr_queue_replay_req r = wait_request(&fi, 1);
    assert_int_equal(kvr_ingest_purge_pod(f->ing, "pod-f", &removed), 0);
    assert_int_equal(removed, 2);
    assert_int_equal(forgot_count(&fi), 1);
    assert_ptr_equal(fi.forgot[0], r.topic);
    assert_false(get_stream(f, "pod-f", 0, &si));
    uint32_t wid;
    assert_int_equal(kvr_index_worker_lookup(f->ix, "pod-f", 0, &wid), -ENOENT);

    /* the producer's FORGET: the state stays while the replay is out */
    long before = atomic_load(&g_payloads);
    struct kvr_queue_msg m = {.kind = KVR_QUEUE_FORGET, .topic = r.topic,
                              .payload = payload_of("rec", 3)};
    feed(fd, &m);
    /* a late replay batch for the stream is stale, not a crash */
    msgpack_sbuffer sb;
    pack_batch(&sb, &e, 1, 0);
    struct kvr_queue_msg rp = {.kind = KVR_QUEUE_REPLAY, .topic = r.topic, .ctx = r.ctx,
                               .gen = r.gen, .seq = 1, .payload = payload_of(sb.data, sb.size)};
    msgpack_sbuffer_destroy(&sb);
    feed(fd, &rp);
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    while (atomic_load(&g_payloads) > before + 1 && kvr_now_ms() < deadline) /* the replay's */
        sleep_ms(2);
    sleep_ms(20);
    assert_int_equal(atomic_load(&g_payloads), before + 1); /* the record's still held */
    struct kvr_queue_msg end = {.kind = KVR_QUEUE_REPLAY_END, .topic = r.topic, .ctx = r.ctx,
                                .gen = r.gen, .ok = true};
    feed(fd, &end);
    deadline = kvr_now_ms() + WAIT_MS;
    while (atomic_load(&g_payloads) > before && kvr_now_ms() < deadline)
        sleep_ms(2);
    assert_int_equal(atomic_load(&g_payloads), before); /* the record, released */
    for (size_t i = 0; i < fd->ntopics; i++) /* the producer would intern a new record */
        if (&fd->topics[i] == r.topic)
            fd->topics[i].owner = NULL;
    /* the pod comes back as a new one */
    publish(fd, "kv@pod-f@" MODEL, 0, &e, 1, 0);
    si = wait_seq(f, "pod-f", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 2);
    assert_int_equal(metric(f, "events_pods_forgotten_total", NULL), 1);
    fx_free(f);
    pthread_mutex_destroy(&fi.mu);
}

/* forget_after: a pod idle that long without blocks is forgotten, one with blocks kept. */
static void test_forget_after_idle(void **state)
{
    struct fake_intake fi = {.rc = 0};
    struct kvr_ingest_intake in = {.replay = fake_replay, .running = fake_running,
                                   .forget = fake_forget, .arg = &fi};
    uint32_t tok[8];
    uint64_t h[2] = {8200, 8201};
    struct kvr_stream_info si;
    uint32_t wid;
    (void)state;

    pthread_mutex_init(&fi.mu, NULL);
    g_forget_after_ms = 40;
    struct fx *f = fx_new_intake(&in);
    g_forget_after_ms = 0;
    struct feeder *fd = f->pub;
    tokens_seq(tok, 8, 950);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 2, .tokens = tok, .ntok = 8, .bs = 4,
                     .lora_id = -1};
    struct tev clr = {.type = EV_CLEARED};
    publish(fd, "kv@idle-empty@" MODEL, 0, &st, 1, 0);
    publish(fd, "kv@idle-empty@" MODEL, 1, &clr, 1, 0);
    publish(fd, "kv@idle-full@" MODEL, 0, &st, 1, 0);
    int64_t deadline = kvr_now_ms() + WAIT_MS;
    while (forgot_count(&fi) < 1 && kvr_now_ms() < deadline)
        sleep_ms(5);
    assert_int_equal(forgot_count(&fi), 1);
    assert_string_equal(fi.forgot[0]->pod, "idle-empty");
    assert_int_equal(kvr_index_worker_lookup(f->ix, "idle-empty", 0, &wid), -ENOENT);
    assert_false(get_stream(f, "idle-empty", 0, &si));
    sleep_ms(200); /* several more sweeps: the pod with blocks stays */
    assert_int_equal(forgot_count(&fi), 1);
    assert_int_equal(kvr_index_worker_lookup(f->ix, "idle-full", 0, &wid), 0);
    assert_true(get_stream(f, "idle-full", 0, &si));
    assert_int_equal(si.blocks, 2);
    assert_int_equal(metric(f, "events_pods_forgotten_total", NULL), 1);
    struct kvr_queue_msg m = {.kind = KVR_QUEUE_FORGET, .topic = fi.forgot[0],
                              .payload = payload_of("rec", 3)};
    feed(fd, &m);
    fx_free(f); /* every payload, the record included, released once */
    pthread_mutex_destroy(&fi.mu);
}

/* ---- the memory cap and the shown states --------------------------------------------- */

static double skipped_over_budget(struct fx *f)
{
    return metric(f, "events_skipped_total", "reason=\"over_budget\"");
}

/* [index] max_memory: past the cap a store is refused (counted with its reason, its blocks
 * counted), removals still apply, the stream reads over_budget until its worker is emptied
 * (AllBlocksCleared, engine restart, purge), also once the cap is lifted; other streams keep
 * their state until they lose a store themselves. */
static void test_budget_refuses_stores(void **state)
{
    struct fx *f = fx_new();
    uint32_t tok[24], tok2[8], tok3[16];
    uint64_t h[4] = {801, 802, 803, 804}, h2[2] = {805, 806}, h3[4] = {901, 902, 903, 904};
    struct kvr_stream_info si;
    (void)state;

    warm_up(f);
    assert_int_equal(metric(f, "index_max_memory_bytes", NULL), 0);
    tokens_seq(tok, 16, 40000);
    tokens_seq(tok2, 8, 40016);
    tokens_seq(tok3, 16, 50000);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 4, .tokens = tok, .ntok = 16, .bs = 4,
                     .lora_id = -1};
    struct tev st2 = {.type = EV_STORED, .hashes = h2, .n = 2, .has_parent = true,
                      .parent = 804, .tokens = tok2, .ntok = 8, .bs = 4, .lora_id = -1};
    struct tev st3 = {.type = EV_STORED, .hashes = h3, .n = 4, .tokens = tok3, .ntok = 16,
                      .bs = 4, .lora_id = -1};
    uint64_t rh[1] = {804};
    struct tev rm = {.type = EV_REMOVED, .hashes = rh, .n = 1};
    struct tev clr = {.type = EV_CLEARED};
    struct tev none[1] = {{0}};

    publish(f->pub, "kv@pod-b@" MODEL, 0, &st, 1, 0);
    publish(f->pub, "kv@pod-c@" MODEL, 0, &st3, 1, 0);
    si = wait_seq(f, "pod-b", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);
    wait_seq(f, "pod-c", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(skipped_over_budget(f), 0);

    /* cap below what the index holds: the next store is refused */
    kvr_ingest_set_max_memory(f->ing, 1);
    assert_int_equal(kvr_ingest_max_memory(f->ing), 1);
    assert_int_equal(metric(f, "index_max_memory_bytes", NULL), 1);
    publish(f->pub, "kv@pod-b@" MODEL, 1, &st2, 1, 0);
    si = wait_seq(f, "pod-b", 0, 1, KVR_STREAM_OVER_BUDGET);
    assert_int_equal(si.blocks, 4);
    assert_int_equal(si.orphans, 0);
    assert_int_equal(skipped_over_budget(f), 1);
    assert_int_equal(metric(f, "events_blocks_over_budget_total", NULL), 2);
    tokens_seq(tok, 24, 40000);
    assert_int_equal(matched(f, MODEL, NULL, tok, 24, 4, "pod-b", 0), 4);
    /* pod-c lost nothing: still synced */
    si = wait_seq(f, "pod-c", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(metric(f, "events_streams", "state=\"over_budget\""), 1);
    assert_true(metric(f, "events_streams", "state=\"synced\"") >= 2); /* pod-c, warmup */
    assert_int_equal(metric(f, "events_unsynced_streams", NULL), 0);

    /* removals apply over the cap */
    publish(f->pub, "kv@pod-b@" MODEL, 2, &rm, 1, 0);
    si = wait_seq(f, "pod-b", 0, 2, KVR_STREAM_OVER_BUDGET);
    assert_int_equal(si.blocks, 3);

    /* the cap lifted: stores apply again, but the blocks refused are still missing */
    kvr_ingest_set_max_memory(f->ing, 0);
    uint64_t h4[1] = {807};
    uint32_t tok4[4];
    tokens_seq(tok4, 4, 60000);
    struct tev st4 = {.type = EV_STORED, .hashes = h4, .n = 1, .tokens = tok4, .ntok = 4,
                      .bs = 4, .lora_id = -1};
    publish(f->pub, "kv@pod-b@" MODEL, 3, &st4, 1, 0);
    si = wait_seq(f, "pod-b", 0, 3, KVR_STREAM_OVER_BUDGET);
    assert_int_equal(si.blocks, 4);
    assert_int_equal(skipped_over_budget(f), 1);

    /* AllBlocksCleared resyncs */
    publish(f->pub, "kv@pod-b@" MODEL, 4, &clr, 1, 0);
    si = wait_seq(f, "pod-b", 0, 4, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 0);
    assert_int_equal(metric(f, "events_streams", "state=\"over_budget\""), 0);

    /* over budget again, then an engine restart (seq back to 0) resyncs */
    kvr_ingest_set_max_memory(f->ing, 1);
    publish(f->pub, "kv@pod-b@" MODEL, 5, &st, 1, 0);
    si = wait_seq(f, "pod-b", 0, 5, KVR_STREAM_OVER_BUDGET);
    assert_int_equal(si.blocks, 0);
    assert_int_equal(skipped_over_budget(f), 2);
    publish(f->pub, "kv@pod-b@" MODEL, 0, none, 0, 0);
    si = wait_seq(f, "pod-b", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(si.restarts, 1);

    /* over budget again, then the pod is purged (forgotten): its next batch starts afresh */
    publish(f->pub, "kv@pod-b@" MODEL, 1, &st, 1, 0);
    wait_seq(f, "pod-b", 0, 1, KVR_STREAM_OVER_BUDGET);
    uint64_t removed = 0;
    assert_int_equal(kvr_ingest_purge_pod(f->ing, "pod-b", &removed), 0);
    kvr_ingest_set_max_memory(f->ing, 0);
    publish(f->pub, "kv@pod-b@" MODEL, 2, &st, 1, 0);
    si = wait_seq(f, "pod-b", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(si.blocks, 4);
    {
        struct kvr_buf b;
        kvr_buf_init(&b);
        kvr_ingest_metrics(f->ing, &b);
        assert_families_grouped(b.data);
        kvr_buf_free(&b);
    }
    fx_free(f);
}

/* A cap a little above what the index holds: stores are accepted until the index is near it,
 * then refused; the index stays within the cap plus one growth step. */
static void test_budget_cap_reached(void **state)
{
    struct fx *f = fx_new();
    enum { N = 64 };
    uint32_t tok[N * 4];
    uint64_t h[N];
    uint64_t cap = 0, seq = 0;
    struct kvr_stream_info si;
    (void)state;

    warm_up(f);
    for (uint32_t round = 0; round < 4096; round++) {
        if (round == 1) { /* the first store mapped the first 2 MiB node chunk */
            cap = kvr_index_bytes(f->ix) + 256 * 1024;
            kvr_ingest_set_max_memory(f->ing, cap);
        }
        for (uint32_t i = 0; i < N; i++)
            h[i] = 1000000 + (uint64_t)round * N + i;
        tokens_seq(tok, N * 4, 100000 + round * N * 4);
        struct tev st = {.type = EV_STORED, .hashes = h, .n = N, .tokens = tok, .ntok = N * 4,
                         .bs = 4, .lora_id = -1};
        publish(f->pub, "kv@pod-m@" MODEL, seq, &st, 1, 0);
        si = wait_seq(f, "pod-m", 0, seq, -1);
        seq++;
        if (si.state == KVR_STREAM_OVER_BUDGET)
            break;
    }
    assert_int_equal(si.state, KVR_STREAM_OVER_BUDGET);
    assert_true(si.blocks >= 8 * N);           /* stores were accepted under the cap */
    assert_int_equal(si.blocks % N, 0);        /* whole stores, never part of one */
    assert_int_equal(skipped_over_budget(f), 1);
    /* one growth step: a 2 MiB node chunk, a reverse map doubling */
    assert_true(kvr_index_bytes(f->ix) <= cap + (2u << 20) + 64 * 1024);
    print_message("cap %llu, index %llu bytes, %llu blocks indexed\n",
                  (unsigned long long)cap, (unsigned long long)kvr_index_bytes(f->ix),
                  (unsigned long long)si.blocks);
    fx_free(f);
}

/* Blocks parked as orphans make the stream incomplete (shown with their count); adopted once
 * their parent arrives, it is synced again. */
static void test_orphans_incomplete(void **state)
{
    struct fx *f = fx_new();
    uint32_t tok[8], ptok[4];
    uint64_t h[2] = {702, 703}, ph[1] = {701};
    struct kvr_stream_info si;
    (void)state;

    warm_up(f);
    tokens_seq(ptok, 4, 70000);
    tokens_seq(tok, 8, 70004);
    struct tev child = {.type = EV_STORED, .hashes = h, .n = 2, .has_parent = true,
                        .parent = 701, .tokens = tok, .ntok = 8, .bs = 4, .lora_id = -1};
    struct tev parent = {.type = EV_STORED, .hashes = ph, .n = 1, .tokens = ptok, .ntok = 4,
                         .bs = 4, .lora_id = -1};
    publish(f->pub, "kv@pod-o@" MODEL, 0, &child, 1, 0);
    si = wait_seq(f, "pod-o", 0, 0, KVR_STREAM_INCOMPLETE);
    assert_int_equal(si.orphans, 2);
    assert_int_equal(si.blocks, 0);
    assert_int_equal(metric(f, "events_streams", "state=\"incomplete\""), 1);
    assert_int_equal(metric(f, "events_stream_orphans", NULL), 2);
    publish(f->pub, "kv@pod-o@" MODEL, 1, &parent, 1, 0);
    si = wait_seq(f, "pod-o", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(si.orphans, 0);
    assert_int_equal(si.blocks, 3);
    assert_int_equal(metric(f, "events_streams", "state=\"incomplete\""), 0);
    assert_int_equal(metric(f, "events_stream_orphans", NULL), 0);
    /* a gap (no replay) outranks incomplete: unsynced is shown */
    publish(f->pub, "kv@pod-o@" MODEL, 2, &child, 1, 0); /* duplicates: no orphans */
    struct tev orphan2 = child;
    uint64_t h5[2] = {712, 713};
    orphan2.hashes = h5;
    orphan2.parent = 711;
    publish(f->pub, "kv@pod-o@" MODEL, 4, &orphan2, 1, 0);
    si = wait_seq(f, "pod-o", 0, 4, KVR_STREAM_UNSYNCED);
    assert_int_equal(si.orphans, 2);
    /* AllBlocksCleared drops the parked blocks too */
    struct tev clr = {.type = EV_CLEARED};
    publish(f->pub, "kv@pod-o@" MODEL, 5, &clr, 1, 0);
    si = wait_seq(f, "pod-o", 0, 5, KVR_STREAM_SYNCED);
    assert_int_equal(si.orphans, 0);
    assert_string_equal(kvr_stream_state_name(KVR_STREAM_INCOMPLETE), "incomplete");
    assert_string_equal(kvr_stream_state_name(KVR_STREAM_OVER_BUDGET), "over_budget");
    fx_free(f);
}

/* Randomized against a naive model of one worker: stores (roots, or children of any block
 * published before: held, removed, refused or parked), removals, clears, and the cap toggled
 * between "everything refused" and none. The model keeps the set of blocks held, the set
 * parked (parent unknown to the worker), whether a store was refused since the last clear;
 * after every batch the stream's blocks, orphans, state and the over_budget count must match.
 * KVR_SEED=n replays a run. */
static void test_budget_model(void **state)
{
    enum { OPS = 400, MAXB = 4096, MAXN = 4 };
    const char *env = getenv("KVR_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    static uint8_t where[MAXB + 1]; /* 0 never/removed/refused, 1 held, 2 parked */
    uint64_t npub = 0, refused = 0;
    bool capped = false, over = false;
    struct fx *f = fx_new();
    (void)state;

    printf("test_budget_model: KVR_SEED=%llu\n", (unsigned long long)seed);
    fflush(stdout);
    memset(where, 0, sizeof(where));
    warm_up(f);
#define RND(n) ((rng = rng * 6364136223846793005ull + 1442695040888963407ull), \
                (uint32_t)((rng >> 33) % (n)))
    for (uint64_t op = 0; op < OPS && npub + MAXN < MAXB; op++) {
        uint32_t r = RND(100);
        uint64_t hs[MAXN];
        uint32_t tok[MAXN * 4];
        struct tev ev = {.lora_id = -1};
        if (r < 10) {
            capped = !capped;
            kvr_ingest_set_max_memory(f->ing, capped ? 1 : 0);
            ev.type = 0; /* an empty batch */
        } else if (r < 65) {
            uint32_t n = 1 + RND(MAXN);
            ev.type = EV_STORED;
            ev.n = n;
            ev.hashes = hs;
            ev.tokens = tok;
            ev.ntok = n * 4;
            ev.bs = 4;
            if (npub > 0 && RND(4) != 0) {
                ev.has_parent = true;
                ev.parent = 1 + RND((uint32_t)npub);
            }
            for (uint32_t i = 0; i < n; i++) {
                hs[i] = ++npub;
                tokens_seq(tok + i * 4, 4, (uint32_t)(hs[i] * 4));
            }
            if (capped) {
                refused++;
                over = true;
            } else {
                uint8_t to = !ev.has_parent || where[ev.parent] == 1 ? 1 : 2;
                for (uint32_t i = 0; i < n; i++)
                    where[hs[i]] = to;
            }
        } else if (r < 95 && npub > 0) {
            uint64_t x = 1 + RND((uint32_t)npub);
            hs[0] = x;
            ev.type = EV_REMOVED;
            ev.hashes = hs;
            ev.n = 1;
            where[x] = 0;
        } else {
            ev.type = EV_CLEARED;
            memset(where, 0, sizeof(where));
            over = false;
        }
        publish(f->pub, "kv@pod-z@" MODEL, op, &ev, ev.type ? 1 : 0, 0);
        struct kvr_stream_info si = wait_seq(f, "pod-z", 0, op, -1);
        uint64_t held = 0, parked = 0;
        for (uint64_t k = 1; k <= npub; k++) {
            held += where[k] == 1;
            parked += where[k] == 2;
        }
        int want = over ? KVR_STREAM_OVER_BUDGET : parked ? KVR_STREAM_INCOMPLETE
                                                          : KVR_STREAM_SYNCED;
        if (si.blocks != held || si.orphans != parked || (int)si.state != want ||
            skipped_over_budget(f) != (double)refused)
            fail_msg("seed %llu op %llu: blocks %llu/%llu orphans %u/%llu state %d/%d "
                     "refused %g/%llu", (unsigned long long)seed, (unsigned long long)op,
                     (unsigned long long)si.blocks, (unsigned long long)held, si.orphans,
                     (unsigned long long)parked, (int)si.state, want, skipped_over_budget(f),
                     (unsigned long long)refused);
    }
#undef RND
    fx_free(f);
}

/* ---- the rest of the wire: extra keys, SGLang, newest vLLM fields ------------------------ */

/* One raw payload (bytes as an engine sent them) into the topic's queue. */
static void publish_raw(void *pub, const char *topic, uint64_t seq, const void *b, size_t n)
{
    struct feeder *fd = pub;
    struct kvr_queue_msg m = {.kind = KVR_QUEUE_LIVE, .seq = seq, .source = fd->source,
                              .can_replay = fd->can_replay};

    m.topic = feeder_topic(fd, topic);
    m.recv_ns = kvr_now_ns();
    m.payload = payload_of(b, n);
    feed(fd, &m);
}

/* A literal extra key, as vLLM's generate_block_hash_extra_keys returns it. */
struct lit {
    int kind; /* 1 str (salt), 2 media [id, offset] */
    const char *s;
    int64_t off;
};

/* A vLLM BlockStored (map form) with extra keys; blk[i] are block i's keys after the LoRA
 * name (which is put first on every block when lora is set, as vLLM does). */
struct xev {
    uint64_t h[16];
    size_t n;
    bool has_parent;
    uint64_t parent;
    const uint32_t *tok;
    uint32_t bs;
    const char *lora;
    const char *medium;
    const char *locality;
    struct lit blk[16][6];
    int nblk[16];
};

static void pk_xev(msgpack_packer *p, const struct xev *e)
{
    msgpack_pack_map(p, 9 + (e->locality != NULL));
    pk_str(p, "type");
    pk_str(p, "BlockStored");
    pk_str(p, "block_hashes");
    pk_hashes(p, e->h, e->n);
    pk_str(p, "parent_block_hash");
    if (e->has_parent)
        msgpack_pack_uint64(p, e->parent);
    else
        msgpack_pack_nil(p);
    pk_str(p, "token_ids");
    msgpack_pack_array(p, e->n * e->bs);
    for (size_t i = 0; i < e->n * e->bs; i++)
        msgpack_pack_uint32(p, e->tok[i]);
    pk_str(p, "block_size");
    msgpack_pack_uint32(p, e->bs);
    pk_str(p, "lora_id");
    msgpack_pack_nil(p);
    pk_str(p, "medium");
    pk_str(p, e->medium ? e->medium : "GPU");
    pk_str(p, "lora_name");
    if (e->lora)
        pk_str(p, e->lora);
    else
        msgpack_pack_nil(p);
    pk_str(p, "extra_keys");
    msgpack_pack_array(p, e->n);
    for (size_t i = 0; i < e->n; i++) {
        int k = e->nblk[i] + (e->lora != NULL);
        if (k == 0) {
            msgpack_pack_nil(p);
            continue;
        }
        msgpack_pack_array(p, k);
        if (e->lora)
            pk_str(p, e->lora);
        for (int j = 0; j < e->nblk[i]; j++) {
            const struct lit *l = &e->blk[i][j];
            if (l->kind == 1) {
                pk_str(p, l->s);
            } else {
                msgpack_pack_array(p, 2);
                pk_str(p, l->s);
                msgpack_pack_int64(p, l->off);
            }
        }
    }
    if (e->locality) {
        pk_str(p, "locality");
        pk_str(p, e->locality);
    }
}

static void publish_xev(struct fx *f, const char *topic, uint64_t seq, const struct xev *e)
{
    msgpack_sbuffer sb;
    msgpack_packer p;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.5);
    msgpack_pack_array(&p, 1);
    pk_xev(&p, e);
    msgpack_pack_uint32(&p, 0);
    publish_raw(f->pub, topic, seq, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

struct scorer {
    struct kvr_score *s;
    struct kvr_score_ctx *c;
};

static void scorer_new(struct fx *f, struct scorer *sc)
{
    assert_int_equal(kvr_score_create(f->ix, &f->conf, &sc->s), 0);
    assert_int_equal(kvr_score_ctx_create(sc->s, 4096, &sc->c), 0);
}

static void scorer_free(struct scorer *sc)
{
    kvr_score_ctx_destroy(sc->c);
    kvr_score_destroy(sc->s);
}

/* matched_blocks of pod (rank 0) for a query through score (cache_salt, media). */
static uint32_t sc_matched(struct scorer *sc, const char *lora, const uint32_t *tok, size_t n,
                           const char *salt, const struct kvr_hash_media *m, size_t nm,
                           const char *pod)
{
    struct kvr_score_query q = {.model = MODEL, .lora_name = lora, .tokens = tok, .ntokens = n,
                                .cache_salt = salt, .media = m, .nmedia = nm};
    struct kvr_score_result r;

    assert_int_equal(kvr_score_query(sc->c, &q, &r), 0);
    for (size_t i = 0; i < r.nentries; i++)
        if (strcmp(r.entries[i].pod, pod) == 0 && r.entries[i].dp_rank == 0)
            return r.entries[i].matched_blocks;
    return 0;
}

/* Salted and multimodal blocks never match a plain query, and match a query with the same
 * salt / media (at the same offsets) only; the LoRA name in extra keys is the namespace's. */
static void test_extra_keys_no_false_hits(void **state)
{
    struct fx *f = fx_new();
    struct scorer sc;
    uint32_t tok[32];
    (void)state;

    warm_up(f);
    scorer_new(f, &sc);
    tokens_seq(tok, 32, 500);
    /* vLLM, cache_salt "tenant-a": the salt keys block 0 only */
    struct xev a = {.h = {11, 12}, .n = 2, .tok = tok, .bs = 16,
                    .blk = {{{1, "tenant-a", 0}}}, .nblk = {1, 0}};
    /* plain */
    struct xev b = {.h = {21, 22}, .n = 2, .tok = tok, .bs = 16};
    /* an image at tokens [4, 24): on both blocks, offsets 4 and 4 - 16 */
    struct xev c = {.h = {31, 32}, .n = 2, .tok = tok, .bs = 16,
                    .blk = {{{2, "img0", 4}}, {{2, "img0", -12}}}, .nblk = {1, 1}};
    /* LoRA "ad": its name first on every block, nothing else */
    struct xev e = {.h = {51, 52}, .n = 2, .tok = tok, .bs = 16, .lora = "ad"};
    /* LoRA "ad" and the salt */
    struct xev g = {.h = {61, 62}, .n = 2, .tok = tok, .bs = 16, .lora = "ad",
                    .blk = {{{1, "tenant-a", 0}}}, .nblk = {1, 0}};
    publish_xev(f, "kv@pod-a@" MODEL, 0, &a);
    publish_xev(f, "kv@pod-b@" MODEL, 0, &b);
    publish_xev(f, "kv@pod-c@" MODEL, 0, &c);
    publish_xev(f, "kv@pod-e@" MODEL, 0, &e);
    publish_xev(f, "kv@pod-g@" MODEL, 0, &g);
    /* SGLang: a salted page chain (BlockStoredWithMetadata, metadata at [7]), one page an
     * event, each carrying the salt */
    {
        msgpack_sbuffer sb;
        msgpack_packer p;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&p, 3);
        msgpack_pack_double(&p, 1.5);
        msgpack_pack_array(&p, 2);
        for (int i = 0; i < 2; i++) {
            msgpack_pack_array(&p, 8);
            pk_str(&p, "BlockStored");
            msgpack_pack_array(&p, 1);
            msgpack_pack_int64(&p, -41 - i);
            if (i == 0)
                msgpack_pack_nil(&p);
            else
                msgpack_pack_int64(&p, -41);
            msgpack_pack_array(&p, 16);
            for (int t = 0; t < 16; t++)
                msgpack_pack_uint32(&p, tok[16 * i + t]);
            msgpack_pack_uint32(&p, 16);
            msgpack_pack_nil(&p);
            pk_str(&p, "CPU_PINNED");
            msgpack_pack_map(&p, 1);
            pk_str(&p, "cache_salt");
            pk_str(&p, "tenant-a");
        }
        msgpack_pack_nil(&p);
        publish_raw(f->pub, "kv@pod-d@" MODEL, 0, sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
    }
    const char *pods[] = {"pod-a", "pod-b", "pod-c", "pod-d", "pod-e", "pod-g"};
    for (size_t i = 0; i < 6; i++)
        wait_seq(f, pods[i], 0, 0, KVR_STREAM_SYNCED);
    assert_true(metric(f, "events_skipped_total", "reason=\"bad_field\"") <= 0);
    assert_int_equal(worker_tier_blocks(f, "pod-d", 0, KVR_TIER_CPU), 2);

    struct kvr_hash_media img0 = {"img0", 4, 4, 20}, img1 = {"img1", 4, 4, 20},
                          img0_moved = {"img0", 4, 5, 20}, img0_short = {"img0", 4, 4, 10};
    /* plain query: the plain blocks only (the LoRA ones are another namespace) */
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, NULL, 0, "pod-b"), 2);
    for (size_t i = 0; i < 6; i++)
        if (strcmp(pods[i], "pod-b") != 0)
            assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, NULL, 0, pods[i]), 0);
    /* the tenant's salt: its blocks on both engines, nothing else */
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "tenant-a", NULL, 0, "pod-a"), 2);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "tenant-a", NULL, 0, "pod-d"), 2);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "tenant-a", NULL, 0, "pod-b"), 0);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "tenant-a", NULL, 0, "pod-c"), 0);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "tenant-b", NULL, 0, "pod-a"), 0);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "tenant-b", NULL, 0, "pod-d"), 0);
    /* "" is no salt (vLLM: a falsy salt adds no key) */
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "", NULL, 0, "pod-b"), 2);
    /* media: same id at the same offsets only */
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, &img0, 1, "pod-c"), 2);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, &img0, 1, "pod-b"), 0);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, &img1, 1, "pod-c"), 0);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, &img0_moved, 1, "pod-c"), 0);
    /* the image ends inside block 0: block 1 carries no key, so only block 0 matches */
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, &img0_short, 1, "pod-c"), 1);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, "tenant-a", &img0, 1, "pod-c"), 0);
    /* LoRA: the name in extra keys is the namespace's */
    assert_int_equal(sc_matched(&sc, "ad", tok, 32, NULL, NULL, 0, "pod-e"), 2);
    assert_int_equal(sc_matched(&sc, "ad", tok, 32, NULL, NULL, 0, "pod-g"), 0);
    assert_int_equal(sc_matched(&sc, "ad", tok, 32, "tenant-a", NULL, 0, "pod-g"), 2);
    assert_int_equal(sc_matched(&sc, "ad", tok, 32, "tenant-a", NULL, 0, "pod-e"), 0);
    scorer_free(&sc);
    fx_free(f);
}

/* remaining_copy_counts is authoritative: an engine that reports only the last copy's
 * removal (one BlockRemoved, count 0) leaves nothing behind, where per-copy counting would
 * keep the block forever; a count above 0 keeps exactly that many copies. */
static void test_remaining_copy_counts(void **state)
{
    struct fx *f = fx_new();
    uint32_t tok[16];
    uint64_t h[1] = {71};
    (void)state;

    warm_up(f);
    tokens_seq(tok, 16, 900);
    struct tev st = {.type = EV_STORED, .hashes = h, .n = 1, .tokens = tok, .ntok = 16, .bs = 16,
                     .lora_id = -1};
    struct tev three[3] = {st, st, st}; /* three physical copies of one block */
    publish(f->pub, "kv@pod-r@" MODEL, 0, three, 3, 0);
    publish(f->pub, "kv@pod-l@" MODEL, 0, three, 3, 0);
    wait_seq(f, "pod-r", 0, 0, KVR_STREAM_SYNCED);
    wait_seq(f, "pod-l", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(kvr_index_copies(f->ix, wid_of(f, "pod-r", 0), KVR_TIER_GPU, 71), 3);

    /* without counts, one removal drops one copy: the leak a last-copy-only engine causes */
    struct tev rm = {.type = EV_REMOVED, .hashes = h, .n = 1};
    publish(f->pub, "kv@pod-l@" MODEL, 1, &rm, 1, 0);
    wait_seq(f, "pod-l", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 16, "pod-l", 0), 1);

    /* with counts: [2] keeps two copies, then [0] removes the block */
    static const uint8_t rm2[] = {
        0x93, 0x00, 0x91, 0x83, 0xa4, 't', 'y', 'p', 'e', 0xac, 'B', 'l', 'o', 'c', 'k', 'R',
        'e', 'm', 'o', 'v', 'e', 'd', 0xac, 'b', 'l', 'o', 'c', 'k', '_', 'h', 'a', 's', 'h',
        'e', 's', 0x91, 71, 0xb5, 'r', 'e', 'm', 'a', 'i', 'n', 'i', 'n', 'g', '_', 'c', 'o',
        'p', 'y', '_', 'c', 'o', 'u', 'n', 't', 's', 0x91, 2, 0x00};
    uint8_t rm0[sizeof(rm2)];
    memcpy(rm0, rm2, sizeof(rm2));
    rm0[sizeof(rm0) - 2] = 0; /* remaining_copy_counts [0] */
    publish_raw(f->pub, "kv@pod-r@" MODEL, 1, rm2, sizeof(rm2));
    wait_seq(f, "pod-r", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(kvr_index_copies(f->ix, wid_of(f, "pod-r", 0), KVR_TIER_GPU, 71), 2);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 16, "pod-r", 0), 1);
    publish_raw(f->pub, "kv@pod-r@" MODEL, 2, rm0, sizeof(rm0));
    wait_seq(f, "pod-r", 0, 2, KVR_STREAM_SYNCED);
    assert_int_equal(kvr_index_copies(f->ix, wid_of(f, "pod-r", 0), KVR_TIER_GPU, 71), 0);
    assert_int_equal(matched(f, MODEL, NULL, tok, 16, 16, "pod-r", 0), 0);
    assert_int_equal(worker_tier_blocks(f, "pod-r", 0, KVR_TIER_GPU), 0);
    /* a count for a hash no longer held: an unknown removal, as without counts */
    double unknown = metric(f, "events_unknown_removes_total", NULL);
    publish_raw(f->pub, "kv@pod-r@" MODEL, 3, rm0, sizeof(rm0));
    wait_seq(f, "pod-r", 0, 3, KVR_STREAM_SYNCED);
    assert_true(metric(f, "events_unknown_removes_total", NULL) == unknown + 1);
    fx_free(f);
}

static uint8_t *slurp_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *b;
    long n;

    if (fp == NULL)
        fail_msg("cannot open %s (tests run from the repository root)", path);
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return b;
}

/* Every SGLang form (from its msgspec structs: 7-element BlockStored with signed hashes and a
 * nil attn_dp_rank, BlockStoredWithMetadata, the recent vLLM-like layout with locality,
 * BlockRemoved of 3 and 8 elements, AllBlocksCleared with its slot, tagged maps with
 * cache_salt and session_id) applies with no skipped event; mediums land on our tiers. */
static void test_sglang_forms(void **state)
{
    struct fx *f = fx_new();
    struct scorer sc;
    uint32_t tok[32];
    msgpack_sbuffer sb;
    msgpack_packer p;
    (void)state;

    warm_up(f);
    scorer_new(f, &sc);
    tokens_seq(tok, 32, 3000);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.5);
    msgpack_pack_array(&p, 7);
    /* 7 elements: two GPU pages */
    msgpack_pack_array(&p, 7);
    pk_str(&p, "BlockStored");
    msgpack_pack_array(&p, 2);
    msgpack_pack_int64(&p, -1);
    msgpack_pack_int64(&p, -2);
    msgpack_pack_nil(&p);
    msgpack_pack_array(&p, 32);
    for (int t = 0; t < 32; t++)
        msgpack_pack_uint32(&p, tok[t]);
    msgpack_pack_uint32(&p, 16);
    msgpack_pack_nil(&p);
    pk_str(&p, "GPU");
    /* the same pages on the host (CPU_PINNED), then on disk (DISK), older CPU_TIER2 */
    const char *med[3] = {"CPU_PINNED", "DISK", "CPU_TIER2"};
    for (int m = 0; m < 3; m++) {
        msgpack_pack_array(&p, 7);
        pk_str(&p, "BlockStored");
        msgpack_pack_array(&p, 2);
        msgpack_pack_int64(&p, -1);
        msgpack_pack_int64(&p, -2);
        msgpack_pack_nil(&p);
        msgpack_pack_array(&p, 32);
        for (int t = 0; t < 32; t++)
            msgpack_pack_uint32(&p, tok[t]);
        msgpack_pack_uint32(&p, 16);
        msgpack_pack_nil(&p);
        pk_str(&p, med[m]);
    }
    /* recent layout, EXTERNAL pool, locality REMOTE, one page */
    msgpack_pack_array(&p, 14);
    pk_str(&p, "BlockStored");
    msgpack_pack_array(&p, 1);
    msgpack_pack_int64(&p, -1);
    msgpack_pack_nil(&p);
    msgpack_pack_array(&p, 16);
    for (int t = 0; t < 16; t++)
        msgpack_pack_uint32(&p, tok[t]);
    msgpack_pack_uint32(&p, 16);
    msgpack_pack_nil(&p);
    pk_str(&p, "EXTERNAL");
    for (int k = 0; k < 5; k++)
        msgpack_pack_nil(&p);
    pk_str(&p, "REMOTE");
    msgpack_pack_nil(&p);
    /* BlockRemoved (3 elements) of the disk copy of page 2, (8 elements) of the host one */
    msgpack_pack_array(&p, 3);
    pk_str(&p, "BlockRemoved");
    msgpack_pack_array(&p, 1);
    msgpack_pack_int64(&p, -2);
    pk_str(&p, "DISK");
    msgpack_pack_array(&p, 8);
    pk_str(&p, "BlockRemoved");
    msgpack_pack_array(&p, 1);
    msgpack_pack_int64(&p, -2);
    pk_str(&p, "CPU_PINNED");
    for (int k = 0; k < 5; k++)
        msgpack_pack_nil(&p);
    msgpack_pack_nil(&p); /* attn_dp_rank */
    publish_raw(f->pub, "kv@sg@" MODEL, 0, sb.data, sb.size);
    wait_seq(f, "sg", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(worker_tier_blocks(f, "sg", 0, KVR_TIER_GPU), 2);
    /* CPU_PINNED and CPU_TIER2 are both cpu: the same two hashes twice (two copies each);
     * one copy of page 2 removed, both blocks still held */
    assert_int_equal(worker_tier_blocks(f, "sg", 0, KVR_TIER_CPU), 2);
    assert_int_equal(kvr_index_copies(f->ix, wid_of(f, "sg", 0), KVR_TIER_CPU, (uint64_t)-2), 1);
    assert_int_equal(worker_tier_blocks(f, "sg", 0, KVR_TIER_STORAGE), 1);
    {
        uint8_t t;
        assert_int_equal(kvr_index_tier_intern(f->ix, "remote", 6, &t), 0);
        assert_int_equal(worker_tier_blocks(f, "sg", 0, t), 1);
        assert_int_equal(kvr_index_tier_intern(f->ix, "external", 8, &t), 0);
        assert_int_equal(worker_tier_blocks(f, "sg", 0, t), 0); /* remote wins */
    }
    /* a tagged map with cache_salt and session_id, then AllBlocksCleared [tag, nil] */
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.5);
    msgpack_pack_array(&p, 1);
    msgpack_pack_map(&p, 9);
    pk_str(&p, "type");
    pk_str(&p, "BlockStored");
    pk_str(&p, "block_hashes");
    msgpack_pack_array(&p, 1);
    msgpack_pack_int64(&p, -9);
    pk_str(&p, "parent_block_hash");
    msgpack_pack_nil(&p);
    pk_str(&p, "token_ids");
    msgpack_pack_array(&p, 16);
    for (int t = 0; t < 16; t++)
        msgpack_pack_uint32(&p, tok[t]);
    pk_str(&p, "block_size");
    msgpack_pack_uint32(&p, 16);
    pk_str(&p, "lora_id");
    msgpack_pack_nil(&p);
    pk_str(&p, "medium");
    pk_str(&p, "GPU");
    pk_str(&p, "cache_salt");
    pk_str(&p, "tenant-s");
    pk_str(&p, "session_id");
    pk_str(&p, "sess-1");
    msgpack_pack_nil(&p);
    publish_raw(f->pub, "kv@sg2@" MODEL, 0, sb.data, sb.size);
    wait_seq(f, "sg2", 0, 0, KVR_STREAM_SYNCED);
    assert_int_equal(sc_matched(&sc, NULL, tok, 16, "tenant-s", NULL, 0, "sg2"), 1);
    assert_int_equal(sc_matched(&sc, NULL, tok, 16, NULL, NULL, 0, "sg2"), 0);
    assert_int_equal(sc_matched(&sc, NULL, tok, 32, NULL, NULL, 0, "sg"), 2);
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.5);
    msgpack_pack_array(&p, 1);
    msgpack_pack_array(&p, 2);
    pk_str(&p, "AllBlocksCleared");
    msgpack_pack_nil(&p);
    msgpack_pack_nil(&p);
    publish_raw(f->pub, "kv@sg@" MODEL, 1, sb.data, sb.size);
    wait_seq(f, "sg", 0, 1, KVR_STREAM_SYNCED);
    assert_int_equal(worker_tier_blocks(f, "sg", 0, KVR_TIER_GPU), 0);
    /* none of the above was skipped */
    for (int r = 1; r < KVR_SKIP_REASON_COUNT; r++) {
        char lab[64];
        snprintf(lab, sizeof(lab), "reason=\"%s\"",
                 kvr_decode_skip_reason_name((enum kvr_skip_reason)r));
        assert_true(metric(f, "events_skipped_total", lab) <= 0);
    }
    /* EAGLE pages ((t, t+1) tuples): counted under their own reason, never indexed */
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.5);
    msgpack_pack_array(&p, 1);
    msgpack_pack_array(&p, 7);
    pk_str(&p, "BlockStored");
    msgpack_pack_array(&p, 1);
    msgpack_pack_int64(&p, -5);
    msgpack_pack_nil(&p);
    msgpack_pack_array(&p, 16);
    for (int t = 0; t < 16; t++) {
        msgpack_pack_array(&p, 2);
        msgpack_pack_uint32(&p, tok[t]);
        msgpack_pack_uint32(&p, tok[t + 1]);
    }
    msgpack_pack_uint32(&p, 16);
    msgpack_pack_nil(&p);
    pk_str(&p, "GPU");
    msgpack_pack_nil(&p);
    publish_raw(f->pub, "kv@sg@" MODEL, 2, sb.data, sb.size);
    wait_seq(f, "sg", 0, 2, KVR_STREAM_SYNCED);
    assert_true(metric(f, "events_skipped_total", "reason=\"eagle_bigram\"") == 1);
    assert_int_equal(sc_matched(&sc, NULL, tok, 16, NULL, NULL, 0, "sg"), 0);
    msgpack_sbuffer_destroy(&sb);
    scorer_free(&sc);
    fx_free(f);
}

/* The real captures end to end through ingest: vLLM 0.28.0 (seq 0, 223, 234 of one stream:
 * a gap, then removals; every event applied) and the pre-v0.14 7-element batch. */
static void test_realwire_apply(void **state)
{
    static const char *const files[] = {
        "tests/data/realwire/kvstat-0.28.0-seq0.msgpack",
        "tests/data/realwire/kvstat-0.28.0-seq223.msgpack",
        "tests/data/realwire/kvstat-0.28.0-seq234.msgpack",
    };
    static const uint64_t seqs[] = {0, 223, 234};
    struct fx *f = fx_new();
    size_t len;
    uint8_t *b;
    (void)state;

    warm_up(f);
    for (int i = 0; i < 3; i++) {
        b = slurp_file(files[i], &len);
        publish_raw(f->pub, "kv@h100@Qwen/Qwen3-8B", seqs[i], b, len);
        free(b);
        wait_seq(f, "h100", 0, seqs[i], -1);
    }
    b = slurp_file("tests/data/realwire/ls2018-legacy7-seq5.msgpack", &len);
    publish_raw(f->pub, "kv@legacy@Qwen/Qwen3-0.6B", 5, b, len);
    free(b);
    wait_seq(f, "legacy", 0, 5, -1);
    for (int r = 1; r < KVR_SKIP_REASON_COUNT; r++) {
        char lab[64];
        snprintf(lab, sizeof(lab), "reason=\"%s\"",
                 kvr_decode_skip_reason_name((enum kvr_skip_reason)r));
        assert_true(metric(f, "events_skipped_total", lab) <= 0);
    }
    assert_true(metric(f, "events_total", "type=\"BlockStored\"") == 12 + 1);
    assert_true(metric(f, "events_total", "type=\"BlockRemoved\"") == 8);
    assert_true(worker_tier_blocks(f, "h100", 0, KVR_TIER_GPU) > 100);
    assert_int_equal(worker_tier_blocks(f, "legacy", 0, KVR_TIER_GPU), 0); /* orphan: its
                                                                             * parent unseen */
    fx_free(f);
}

/* ---- randomized differential test: extra keys against a literal model -------------------
 * Requests (tokens from two families so prefixes are shared, an optional LoRA, salt and up
 * to two media items) are stored on random pods as vLLM would announce them: extra keys
 * from a literal transcription of generate_block_hash_extra_keys (below, written from
 * vLLM's source, not from hash.c), LoRA name first; half of those without LoRA or media as
 * SGLang announces them instead (a page an event, the salt in each page's metadata). Queries
 * drawn the same way go through
 * score with cache_salt and mm_hashes. The model's answer: per pod, the longest prefix of
 * whole blocks equal to one stored request's in tokens, LoRA and literal extra keys. */

#define DX_BS 4
#define DX_MAXB 6
#define DX_PODS 3

struct dx_req {
    uint32_t tok[DX_BS * DX_MAXB];
    uint32_t nb;
    const char *lora, *salt;
    struct kvr_hash_media mm[2];
    size_t nmm;
    uint64_t eh[DX_MAXB]; /* engine hashes (a literal FNV chain: independent of ours) */
};

static uint64_t dx_s;
static uint64_t dx_rnd(void)
{
    uint64_t z = (dx_s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* vLLM's _gen_mm_extra_hash_keys + cache salt for one block, literally. */
static int dx_keys(const struct dx_req *r, uint32_t blk, struct lit *out)
{
    int64_t start = (int64_t)blk * DX_BS, end = start + DX_BS;
    int n = 0;
    size_t curr = 0;
    while (curr < r->nmm) {
        int64_t off = (int64_t)r->mm[curr].offset, len = (int64_t)r->mm[curr].length;
        if (end > off) {
            if (start >= off + len) {
                curr++;
                continue;
            }
            out[n].kind = 2;
            out[n].s = r->mm[curr].id;
            out[n].off = off - start;
            n++;
            if (end >= off + len)
                curr++;
            else
                break;
        } else {
            break;
        }
    }
    if (start == 0 && r->salt != NULL && r->salt[0] != '\0') {
        out[n].kind = 1;
        out[n].s = r->salt;
        out[n].off = 0;
        n++;
    }
    return n;
}

static bool dx_same_keys(const struct lit *a, int na, const struct lit *b, int nb)
{
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++)
        if (a[i].kind != b[i].kind || strcmp(a[i].s, b[i].s) != 0 || a[i].off != b[i].off)
            return false;
    return true;
}

static void dx_gen(struct dx_req *r)
{
    static const char *const loras[] = {NULL, NULL, "ad"};
    static const char *const salts[] = {NULL, NULL, "a", "b", ""};
    static const char *const ids[] = {"img0", "img1"};
    uint32_t fam = (uint32_t)(dx_rnd() % 2);

    memset(r, 0, sizeof(*r));
    r->nb = 1 + (uint32_t)(dx_rnd() % DX_MAXB);
    for (uint32_t i = 0; i < r->nb * DX_BS; i++) /* a late divergence now and then */
        r->tok[i] = fam * 1000 + i + (i > 10 && dx_rnd() % 16 == 0 ? 500 : 0);
    r->lora = loras[dx_rnd() % 3];
    r->salt = salts[dx_rnd() % 5];
    r->nmm = (size_t)(dx_rnd() % 3);
    uint64_t at = dx_rnd() % 6, total = (uint64_t)r->nb * DX_BS;
    for (size_t k = 0; k < r->nmm; k++) {
        uint64_t len = 1 + dx_rnd() % 7;
        if (at + len > total) {
            r->nmm = k;
            break;
        }
        r->mm[k] = (struct kvr_hash_media){ids[dx_rnd() % 2], 4, at, len};
        at += len + dx_rnd() % 5;
    }
    /* engine hashes: FNV-1a over the literal block contents, chained */
    uint64_t h = 14695981039346656037ull;
    for (uint32_t b = 0; b < r->nb; b++) {
        struct lit ks[6];
        int nk = dx_keys(r, b, ks);
#define FNV(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
        for (uint32_t t = 0; t < DX_BS; t++)
            FNV(r->tok[b * DX_BS + t]);
        for (const char *c = r->lora ? r->lora : ""; *c; c++)
            FNV(*c);
        for (int k = 0; k < nk; k++) {
            FNV(ks[k].kind);
            FNV(ks[k].off);
            for (const char *c = ks[k].s; *c; c++)
                FNV(*c);
        }
#undef FNV
        r->eh[b] = h;
    }
}

/* The same request as SGLang announces it: one page an event (BlockStoredWithMetadata, the
 * salt in the metadata map of every page), chained by parent, signed hashes. SGLang has no
 * media keys and no LoRA name: only requests without them are sent this way. */
static void publish_sglang(struct fx *f, const char *topic, uint64_t seq, const struct dx_req *r)
{
    msgpack_sbuffer sb;
    msgpack_packer p;
    bool salted = r->salt != NULL && r->salt[0] != '\0';

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.5);
    msgpack_pack_array(&p, r->nb);
    for (uint32_t b = 0; b < r->nb; b++) {
        msgpack_pack_array(&p, salted ? 8 : 7);
        pk_str(&p, "BlockStored");
        msgpack_pack_array(&p, 1);
        msgpack_pack_int64(&p, (int64_t)r->eh[b]);
        if (b == 0)
            msgpack_pack_nil(&p);
        else
            msgpack_pack_int64(&p, (int64_t)r->eh[b - 1]);
        msgpack_pack_array(&p, DX_BS);
        for (uint32_t t = 0; t < DX_BS; t++)
            msgpack_pack_uint32(&p, r->tok[b * DX_BS + t]);
        msgpack_pack_uint32(&p, DX_BS);
        msgpack_pack_nil(&p);
        pk_str(&p, "GPU");
        if (salted) {
            msgpack_pack_map(&p, 1);
            pk_str(&p, "cache_salt");
            pk_str(&p, r->salt);
        }
    }
    msgpack_pack_nil(&p);
    publish_raw(f->pub, topic, seq, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

static uint32_t dx_model(const struct dx_req *st, size_t nst, const struct dx_req *q)
{
    uint32_t best = 0;
    for (size_t i = 0; i < nst; i++) {
        const struct dx_req *s = &st[i];
        uint32_t k = 0;
        if ((s->lora == NULL) != (q->lora == NULL) ||
            (s->lora != NULL && strcmp(s->lora, q->lora) != 0))
            continue;
        while (k < s->nb && k < q->nb) {
            struct lit a[6], b[6];
            int na = dx_keys(s, k, a), nb = dx_keys(q, k, b);
            if (memcmp(&s->tok[k * DX_BS], &q->tok[k * DX_BS], DX_BS * sizeof(uint32_t)) != 0 ||
                !dx_same_keys(a, na, b, nb))
                break;
            k++;
        }
        if (k > best)
            best = k;
    }
    return best;
}

static void test_extra_keys_diff(void **state)
{
    struct fx *f = fx_new();
    struct scorer sc;
    static struct dx_req st[DX_PODS][64];
    size_t nst[DX_PODS] = {0};
    uint64_t seq[DX_PODS] = {0};
    const char *env = getenv("KVR_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)kvr_now_ns();
    (void)state;

    fprintf(stderr, "-- test_extra_keys_diff: KVR_SEED=%llu\n", (unsigned long long)seed);
    dx_s = seed;
    warm_up(f);
    scorer_new(f, &sc);
    for (int i = 0; i < 150; i++) {
        uint32_t pod = (uint32_t)(dx_rnd() % DX_PODS);
        struct dx_req *r;
        char topic[64];
        if (nst[pod] == 64)
            continue;
        r = &st[pod][nst[pod]++];
        dx_gen(r);
        struct xev e = {.n = r->nb, .tok = r->tok, .bs = DX_BS, .lora = r->lora};
        memcpy(e.h, r->eh, r->nb * sizeof(uint64_t));
        for (uint32_t b = 0; b < r->nb; b++)
            e.nblk[b] = dx_keys(r, b, e.blk[b]);
        snprintf(topic, sizeof(topic), "kv@dx%u@%s", pod, MODEL);
        if (r->lora == NULL && r->nmm == 0 && dx_rnd() % 2 == 0)
            publish_sglang(f, topic, seq[pod]++, r);
        else
            publish_xev(f, topic, seq[pod]++, &e);
    }
    for (uint32_t p = 0; p < DX_PODS; p++) {
        char pod[16];
        snprintf(pod, sizeof(pod), "dx%u", p);
        if (seq[p] > 0)
            wait_seq(f, pod, 0, seq[p] - 1, KVR_STREAM_SYNCED);
    }
    for (int i = 0; i < 400; i++) {
        struct dx_req q;
        dx_gen(&q);
        for (uint32_t p = 0; p < DX_PODS; p++) {
            char pod[16];
            uint32_t want = dx_model(st[p], nst[p], &q), got;
            snprintf(pod, sizeof(pod), "dx%u", p);
            got = sc_matched(&sc, q.lora, q.tok, q.nb * DX_BS, q.salt, q.mm, q.nmm, pod);
            if (got != want)
                fail_msg("KVR_SEED=%llu query %d pod %s: index %u, model %u (lora %s salt %s, "
                         "%zu media)", (unsigned long long)seed, i, pod, got, want,
                         q.lora ? q.lora : "-", q.salt ? q.salt : "-", q.nmm);
        }
    }
    scorer_free(&sc);
    fx_free(f);
}

/* ---- approximate mode: the index mirrors a naive model of the assumptions ---------------- */

#define AS_BS 4
#define AS_NP 48
#define AS_MAXB 24
#define AS_NW 4
#define AS_CAP 12

struct as_row {
    uint64_t key; /* FNV-1a of the prefix's tokens: an identity independent of the daemon's */
    uint64_t stamp;
};

static uint64_t fnv_tokens(const uint32_t *t, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ t[i]) * 1099511628211ull;
    return h;
}

static int as_find(const struct as_row *v, size_t n, uint64_t key)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].key == key)
            return (int)i;
    return -1;
}

/* Random routing decisions (prompts sharing prefixes, 4 workers, a 12-block cap per worker)
 * through kvr_ingest_assume and the writer threads: after every few, each worker's
 * assumed-tier block count and every prompt's longest match equal a naive model's (a list
 * per worker: touched from the last block back, least recently touched out past the cap).
 * Then a worker publishes an event: its assumptions are dropped and no new one is made. */
static void test_assume_mirrors_model(void **state)
{
    (void)state;
    const char *env = getenv("KVR_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    static uint32_t prompt[AS_NP][AS_MAXB * AS_BS];
    size_t plen[AS_NP]; /* blocks */
    struct as_row model[AS_NW][AS_CAP + AS_MAXB];
    size_t nmodel[AS_NW] = {0};
    uint64_t stamp = 0, applied = 0;
    static const char *const pods[AS_NW] = {"ap-0", "ap-1", "ap-2", "ap-3"};
    struct fx *f = fx_new();
    uint64_t ns_seed = kvr_hash_ns_seed(MODEL, strlen(MODEL), NULL, 0);

    printf("test_assume_mirrors_model: KVR_SEED=%llu\n", (unsigned long long)seed);
#define RND() (rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, rng)
    kvr_ingest_set_assume_limits(f->ing, 600000, AS_CAP);
    for (size_t i = 0; i < AS_NP; i++) { /* a prompt = an earlier one's head + new blocks */
        size_t head = 0;
        if (i > 0 && RND() % 4 != 0) {
            size_t j = RND() % i;
            head = 1 + RND() % plen[j];
            memcpy(prompt[i], prompt[j], head * AS_BS * sizeof(uint32_t));
        }
        plen[i] = head + 1 + RND() % 6;
        if (plen[i] > AS_MAXB)
            plen[i] = AS_MAXB;
        for (size_t t = head * AS_BS; t < plen[i] * AS_BS; t++)
            prompt[i][t] = (uint32_t)(RND() % 50000);
    }
    for (int step = 1; step <= 400; step++) {
        size_t p = RND() % AS_NP, w = RND() % AS_NW, n = plen[p];
        uint64_t content[AS_MAXB];
        kvr_hash_blocks(ns_seed, prompt[p], n, AS_BS, content);
        struct kvr_ingest_assumption a = {.model = MODEL, .pod = pods[w], .content = content,
                                          .n = n};
        int rc;
        while ((rc = kvr_ingest_assume(f->ing, &a)) == -EAGAIN) /* 64-slot queues */
            sleep_ms(1);
        assert_int_equal(rc, 0);
        applied++;
        if (n > AS_CAP)
            n = AS_CAP;
        for (size_t k = n; k-- > 0;) {
            uint64_t key = fnv_tokens(prompt[p], (k + 1) * AS_BS);
            int i = as_find(model[w], nmodel[w], key);
            if (i < 0)
                i = (int)nmodel[w]++;
            model[w][i] = (struct as_row){key, ++stamp};
        }
        while (nmodel[w] > AS_CAP) {
            size_t lo = 0;
            for (size_t i = 1; i < nmodel[w]; i++)
                if (model[w][i].stamp < model[w][lo].stamp)
                    lo = i;
            model[w][lo] = model[w][--nmodel[w]];
        }
        if (step % 8 != 0)
            continue;
        wait_metric(f, "route_assumptions_total", "result=\"applied\"", (double)applied);
        uint8_t tier;
        assert_int_equal(kvr_index_tier_intern(f->ix, "assumed", 7, &tier), 0);
        for (size_t wi = 0; wi < AS_NW; wi++) {
            uint32_t wid;
            if (kvr_index_worker_lookup(f->ix, pods[wi], 0, &wid) != 0) {
                assert_int_equal(nmodel[wi], 0);
                continue;
            }
            if (worker_tier_blocks(f, pods[wi], 0, tier) != nmodel[wi])
                fail_msg("KVR_SEED=%llu step %d %s: %llu assumed blocks, model %zu",
                         (unsigned long long)seed, step, pods[wi],
                         (unsigned long long)worker_tier_blocks(f, pods[wi], 0, tier),
                         nmodel[wi]);
            for (size_t q = 0; q < AS_NP; q++) {
                uint32_t want = 0;
                while (want < plen[q] &&
                       as_find(model[wi], nmodel[wi],
                               fnv_tokens(prompt[q], (want + 1) * AS_BS)) >= 0)
                    want++;
                uint32_t got = matched(f, MODEL, NULL, prompt[q], plen[q] * AS_BS, AS_BS,
                                       pods[wi], 0);
                if (got != want)
                    fail_msg("KVR_SEED=%llu step %d %s prompt %zu: matched %u, model %u",
                             (unsigned long long)seed, step, pods[wi], q, got, want);
            }
        }
    }
    wait_metric(f, "route_assumed_blocks", NULL,
                (double)(nmodel[0] + nmodel[1] + nmodel[2] + nmodel[3]));
    /* ap-0 publishes events: its assumptions go, and it is never assumed again */
    static const uint64_t h7[1] = {7};
    struct tev ev = {.type = EV_STORED, .hashes = h7, .n = 1, .tokens = prompt[0],
                     .ntok = AS_BS, .bs = AS_BS, .lora_id = -1};
    publish(f->pub, "kv@ap-0@" MODEL, 0, &ev, 1, 0);
    wait_seq(f, "ap-0", 0, 0, -1);
    uint8_t tier;
    assert_int_equal(kvr_index_tier_intern(f->ix, "assumed", 7, &tier), 0);
    assert_int_equal(worker_tier_blocks(f, "ap-0", 0, tier), 0);
    assert_int_equal(worker_tier_blocks(f, "ap-0", 0, KVR_TIER_GPU), 1);
    uint64_t content[AS_MAXB];
    kvr_hash_blocks(ns_seed, prompt[1], plen[1], AS_BS, content);
    struct kvr_ingest_assumption a = {.model = MODEL, .pod = "ap-0", .content = content,
                                      .n = plen[1]};
    assert_int_equal(kvr_ingest_assume(f->ing, &a), 0);
    wait_metric(f, "route_assumptions_total", "result=\"events\"", 1);
    assert_int_equal(worker_tier_blocks(f, "ap-0", 0, tier), 0);
#undef RND
    fx_free(f);
}

/* Predicted entries on the writer (ingest_predict.c): made only for a worker with events;
 * two siblings share 5 blocks; the first one's BlockStored confirms its 8 blocks (the shared
 * ones with them) and leaves the second's 2; a removal of a predicted block contradicts it;
 * AllBlocksCleared drops the rest. */
static void test_predict_confirm_contradict(void **state)
{
    (void)state;
    struct fx *f = fx_new();
    uint32_t a[8 * 4], b[7 * 4], c[4 * 4];
    uint64_t ca[8], cb[7], cc[4], ha[8], hc[4];
    uint64_t ns_seed = kvr_hash_ns_seed(MODEL, strlen(MODEL), NULL, 0);
    uint8_t tier;

    warm_up(f);
    tokens_seq(a, 8 * 4, 5000);
    memcpy(b, a, 5 * 4 * sizeof(uint32_t));
    tokens_seq(b + 20, 2 * 4, 9000);
    tokens_seq(c, 4 * 4, 7000);
    kvr_hash_blocks(ns_seed, a, 8, 4, ca);
    kvr_hash_blocks(ns_seed, b, 7, 4, cb);
    kvr_hash_blocks(ns_seed, c, 4, 4, cc);
    for (int i = 0; i < 8; i++)
        ha[i] = 300 + (uint64_t)i;
    for (int i = 0; i < 4; i++)
        hc[i] = 400 + (uint64_t)i;
    kvr_ingest_set_predict_ttl(f->ing, 600000);
    /* pp-0 has a stream (its first block of c); pp-x has none: skipped */
    struct tev e0 = {.type = EV_STORED, .hashes = hc, .n = 1, .tokens = c, .ntok = 4, .bs = 4,
                     .lora_id = -1};
    publish(f->pub, "kv@pp-0@" MODEL, 0, &e0, 1, 0);
    wait_seq(f, "pp-0", 0, 0, KVR_STREAM_SYNCED);
    struct kvr_ingest_assumption pa = {.model = MODEL, .pod = "pp-0", .content = ca, .n = 8,
                                       .predict = true};
    struct kvr_ingest_assumption pb = pa, pc = pa, px = pa;
    pb.content = cb;
    pb.n = 7;
    pc.content = cc;
    pc.n = 4;
    px.pod = "pp-x";
    assert_int_equal(kvr_ingest_assume(f->ing, &pa), 0);
    assert_int_equal(kvr_ingest_assume(f->ing, &pb), 0);
    assert_int_equal(kvr_ingest_assume(f->ing, &pc), 0);
    assert_int_equal(kvr_ingest_assume(f->ing, &px), 0);
    wait_metric(f, "route_predictions_total", "result=\"applied\"", 3);
    wait_metric(f, "route_predictions_total", "result=\"skipped\",reason=\"no_events\"", 1);
    assert_int_equal(kvr_index_tier_intern(f->ix, "predicted", 9, &tier), 0);
    assert_int_equal(worker_tier_blocks(f, "pp-0", 0, tier), 8 + 2 + 4);
    assert_int_equal(metric(f, "route_predicted_blocks_total", "event=\"refreshed\""), 5);
    assert_int_equal(matched(f, MODEL, NULL, a, 8 * 4, 4, "pp-0", 0), 8);
    assert_int_equal(matched(f, MODEL, NULL, b, 7 * 4, 4, "pp-0", 0), 7);
    uint32_t xw;
    assert_int_not_equal(kvr_index_worker_lookup(f->ix, "pp-x", 0, &xw), 0); /* not interned */
    /* a's prefill: its 8 blocks are exact, b's 2 stay predicted (b still matches whole) */
    struct tev ea = {.type = EV_STORED, .hashes = ha, .n = 8, .tokens = a, .ntok = 32, .bs = 4,
                     .lora_id = -1};
    publish(f->pub, "kv@pp-0@" MODEL, 1, &ea, 1, 0);
    wait_seq(f, "pp-0", 0, 1, KVR_STREAM_SYNCED);
    wait_metric(f, "route_predicted_blocks_total", "event=\"confirmed\"", 8);
    assert_int_equal(worker_tier_blocks(f, "pp-0", 0, tier), 2 + 4);
    assert_int_equal(matched(f, MODEL, NULL, b, 7 * 4, 4, "pp-0", 0), 7);
    /* c's first block (exact, predicted too) evicted: contradicted; nothing of c matches */
    struct tev rm = {.type = EV_REMOVED, .hashes = hc, .n = 1};
    publish(f->pub, "kv@pp-0@" MODEL, 2, &rm, 1, 0);
    wait_seq(f, "pp-0", 0, 2, KVR_STREAM_SYNCED);
    wait_metric(f, "route_predicted_blocks_total", "event=\"contradicted\"", 1);
    assert_int_equal(matched(f, MODEL, NULL, c, 4 * 4, 4, "pp-0", 0), 0);
    /* AllBlocksCleared: the rest (b's 2, c's 3) */
    struct tev clr = {.type = EV_CLEARED};
    publish(f->pub, "kv@pp-0@" MODEL, 3, &clr, 1, 0);
    wait_seq(f, "pp-0", 0, 3, KVR_STREAM_SYNCED);
    wait_metric(f, "route_predicted_blocks_total", "event=\"contradicted\"", 1 + 5);
    assert_int_equal(worker_tier_blocks(f, "pp-0", 0, tier), 0);
    wait_metric(f, "route_predicted_blocks", NULL, 0);
    /* off: nothing is handed over */
    kvr_ingest_set_predict_ttl(f->ing, 0);
    assert_int_equal(kvr_ingest_assume(f->ing, &pa), 0);
    assert_false(kvr_ingest_predicting(f->ing));
    fx_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_remove_clear),
        cmocka_unit_test(test_hybrid_groups),
        cmocka_unit_test(test_dp_ranks_lora_tiers),
        cmocka_unit_test(test_restart_and_gap),
        cmocka_unit_test(test_many_pods_backpressure),
        cmocka_unit_test(test_replay_via_intake),
        cmocka_unit_test(test_purge_item),
        cmocka_unit_test(test_destroy_releases_unconsumed),
        cmocka_unit_test(test_forget_waits_for_replay),
        cmocka_unit_test(test_forget_after_idle),
        cmocka_unit_test(test_budget_refuses_stores),
        cmocka_unit_test(test_budget_cap_reached),
        cmocka_unit_test(test_orphans_incomplete),
        cmocka_unit_test(test_budget_model),
        cmocka_unit_test(test_extra_keys_no_false_hits),
        cmocka_unit_test(test_remaining_copy_counts),
        cmocka_unit_test(test_sglang_forms),
        cmocka_unit_test(test_realwire_apply),
        cmocka_unit_test(test_extra_keys_diff),
        cmocka_unit_test(test_assume_mirrors_model),
        cmocka_unit_test(test_predict_confirm_contradict),
    };
    kvr_log_configure(getenv("KVR_TEST_DEBUG") ? KVR_LOG_DEBUG : KVR_LOG_ERROR, KVR_LOG_TEXT);
    if (getenv("KVR_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("KVR_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
