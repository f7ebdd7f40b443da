/* test_snap.c — the snap module: a snapshot taken from a random index and its streams, written
 * to a file and loaded into a fresh daemon state, answers exactly as the original and as a
 * naive model of what was stored (per worker: the set of prefixes, by engine hash); every
 * truncation, random corruptions, a future version, a foreign file and a blob the index refuses
 * are refused without changing the index (the file set aside); a write that fails (disk full,
 * through RLIMIT_FSIZE) keeps the previous snapshot; an unusable directory is an error.
 *
 * Randomized: KVR_SEED=<n> replays a run (the seed is printed). With -DFUZZ_SEEDS_DIR=... it
 * also writes small real snapshots as the fuzz seed corpus (tests/fuzz/corpus/snap).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/conf.h"
#include "index/index.h"
#include "events/ingest.h"
#include "core/log.h"
#include "state/snap.h"

static uint64_t g_seed, g_rng;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

#define CHECK(c)                                                                             \
    do {                                                                                     \
        if (!(c)) {                                                                          \
            print_error("%s:%d: %s (KVR_SEED=%" PRIu64 ")\n", __FILE__, __LINE__, #c, g_seed); \
            fail();                                                                          \
        }                                                                                    \
    } while (0)

/* ---- a daemon's state without threads: index + ingest, and the naive model --------------- */

#define NPODS 5
#define NPROMPTS 12
#define PLEN 24

struct model {
    uint64_t prompt[NPROMPTS][PLEN];           /* content hashes (shared prefixes) */
    /* per worker (pod i, rank 0): prefix lengths held per prompt, as engine hashes */
    uint64_t *held[NPODS];
    size_t nheld[NPODS];
};

struct st {
    struct kvr_conf conf;
    struct kvr_index *ix;
    struct kvr_ingest *ing;
};

static const struct kvr_index_opts IXO = {.orphan_capacity = 1024};

static void st_init(struct st *s)
{
    struct kvr_err err;
    memset(s, 0, sizeof(*s));
    s->conf.writer_threads = 2;
    s->conf.queue_depth = 64;
    s->conf.max_events_per_batch = 1024;
    s->conf.max_tokens_per_event = 1 << 16;
    s->conf.max_workers = 1024;
    assert_int_equal(kvr_index_create(&IXO, &s->ix), 0);
    assert_int_equal(kvr_ingest_create(&s->conf, s->ix, &s->ing, &err), 0);
}

static void st_free(struct st *s)
{
    kvr_ingest_destroy(s->ing);
    kvr_index_destroy(s->ix);
}

static uint64_t engine_hash(const uint64_t *prefix, size_t n)
{
    return XXH64(prefix, n * sizeof(*prefix), 42);
}

static bool held(const struct model *m, int pod, const uint64_t *prefix, size_t n)
{
    uint64_t h = engine_hash(prefix, n);
    for (size_t i = 0; i < m->nheld[pod]; i++)
        if (m->held[pod][i] == h)
            return true;
    return false;
}

static char g_pod[NPODS][16];

/* Random content: prompts sharing prefixes, stored by random workers into two namespaces and
 * two tiers (the model only tracks namespace 0, gpu), with orphans and removals. */
static void fill(struct st *s, struct model *m)
{
    struct kvr_ingest_snap_stream ss[NPODS + 1];
    uint32_t wid[NPODS], ns0, ns1;
    uint64_t seed;
    uint8_t cpu;

    memset(m, 0, sizeof(*m));
    for (int p = 0; p < NPROMPTS; p++)
        for (int k = 0; k < PLEN; k++)
            m->prompt[p][k] = p > 0 && k < 4 + (int)(rnd() % 4) ? m->prompt[0][k] : rnd();
    assert_int_equal(kvr_index_ns_intern(s->ix, "org/m", NULL, &ns0, &seed), 0);
    assert_int_equal(kvr_index_ns_intern(s->ix, "org/m", "lora-a", &ns1, &seed), 0);
    kvr_index_ns_set_block_size(s->ix, ns0, 16);
    assert_int_equal(kvr_index_tier_intern(s->ix, "cpu", 3, &cpu), 0);
    uint8_t odd;
    assert_int_equal(kvr_index_tier_intern(s->ix, "nvme-x", 6, &odd), 0);
    for (int i = 0; i < NPODS; i++) {
        snprintf(g_pod[i], sizeof(g_pod[i]), "pod-%d", i);
        ss[i] = (struct kvr_ingest_snap_stream){.pod = g_pod[i], .model = "org/m", .dp_rank = 0,
                                                .last_seq = rnd() % 1000, .unsynced = i == 2,
                                                .groups_full = 1, .groups_other = i == 3 ? 2 : 0};
    }
    ss[NPODS] = (struct kvr_ingest_snap_stream){.pod = g_pod[0], .model = "org/other",
                                                .dp_rank = 0, .last_seq = 5};
    assert_int_equal(kvr_ingest_restore_streams(s->ing, ss, NPODS + 1), 0);
    for (int i = 0; i < NPODS; i++)
        assert_int_equal(kvr_index_worker_lookup(s->ix, g_pod[i], 0, &wid[i]), 0);

    for (int op = 0; op < 200; op++) {
        int pod = (int)(rnd() % NPODS), p = (int)(rnd() % NPROMPTS);
        size_t n = 1 + rnd() % PLEN;
        struct kvr_index_block b[PLEN];
        struct kvr_index_wres res = {0};
        uint32_t ns = rnd() % 4 == 0 ? ns1 : ns0;
        uint8_t tier = rnd() % 5 == 0 ? cpu : KVR_TIER_GPU;
        for (size_t k = 0; k < n; k++) {
            b[k].engine_hash = engine_hash(m->prompt[p], k + 1) ^ (ns == ns1 ? 0x1111 : 0);
            b[k].content_hash = m->prompt[p][k];
        }
        if (rnd() % 10 == 0) { /* an orphan: its parent never stored */
            uint64_t parent = rnd();
            assert_int_equal(kvr_index_store(s->ix, wid[pod], tier, ns, &parent, b, 1, &res), 0);
            continue;
        }
        assert_int_equal(kvr_index_store(s->ix, wid[pod], tier, ns, NULL, b, n, &res), 0);
        if (ns != ns0 || tier != KVR_TIER_GPU)
            continue;
        for (size_t k = 0; k < n; k++) {
            if (held(m, pod, m->prompt[p], k + 1))
                continue;
            m->held[pod] = realloc(m->held[pod], (m->nheld[pod] + 1) * sizeof(uint64_t));
            m->held[pod][m->nheld[pod]++] = engine_hash(m->prompt[p], k + 1);
        }
    }
}

static void model_free(struct model *m)
{
    for (int i = 0; i < NPODS; i++)
        free(m->held[i]);
}

/* The hits of a find, as (pod, rank) -> (matched, tier_matched), compared between two states
 * and, for namespace 0 gpu, with the model. */
static void compare_finds(struct st *a, struct st *b, const struct model *m)
{
    struct kvr_index_reader *ra, *rb;
    double w[KVR_TIER_MAX] = {1, 0.8, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};

    assert_int_equal(kvr_index_reader_create(a->ix, &ra), 0);
    assert_int_equal(kvr_index_reader_create(b->ix, &rb), 0);
    for (uint32_t ns = 0; ns < 2; ns++) {
        for (int p = 0; p < NPROMPTS; p++) {
            const struct kvr_index_hit *ha, *hb;
            size_t na, nb;
            assert_int_equal(kvr_index_find(ra, ns, m->prompt[p], PLEN, NULL, 0, w, &ha, &na), 0);
            assert_int_equal(kvr_index_find(rb, ns, m->prompt[p], PLEN, NULL, 0, w, &hb, &nb), 0);
            CHECK(na == nb);
            for (size_t i = 0; i < na; i++) {
                size_t j;
                for (j = 0; j < nb; j++)
                    if (strcmp(ha[i].pod, hb[j].pod) == 0 && ha[i].dp_rank == hb[j].dp_rank)
                        break;
                CHECK(j < nb);
                CHECK(ha[i].matched == hb[j].matched);
                CHECK(memcmp(ha[i].tier_matched, hb[j].tier_matched,
                             sizeof(ha[i].tier_matched)) == 0);
                CHECK(ha[i].score == hb[j].score);
            }
            if (ns != 0)
                continue;
            for (int pod = 0; pod < NPODS; pod++) { /* the naive model: gpu of namespace 0 */
                uint32_t want = 0;
                while (want < PLEN && held(m, pod, m->prompt[p], want + 1))
                    want++;
                uint32_t got = 0;
                for (size_t j = 0; j < nb; j++)
                    if (strcmp(hb[j].pod, g_pod[pod]) == 0)
                        got = hb[j].tier_matched[KVR_TIER_GPU];
                CHECK(got == want);
            }
        }
    }
    kvr_index_reader_destroy(ra);
    kvr_index_reader_destroy(rb);
    struct kvr_index_stats sa, sb;
    kvr_index_stats(a->ix, &sa);
    kvr_index_stats(b->ix, &sb);
    CHECK(sa.entries == sb.entries);
    CHECK(sa.holders == sb.holders);
    CHECK(sa.orphans == sb.orphans);
    CHECK(sa.workers == sb.workers);
    CHECK(sa.namespaces == sb.namespaces);
    for (uint8_t t = 0; t < KVR_TIER_MAX; t++) {
        const char *x = kvr_index_tier_name(a->ix, t), *y = kvr_index_tier_name(b->ix, t);
        CHECK((x == NULL) == (y == NULL));
        CHECK(x == NULL || strcmp(x, y) == 0);
    }
}

struct stream_list {
    char line[16][160];
    int n;
};

static void list_cb(const struct kvr_stream_info *s, void *arg)
{
    struct stream_list *l = arg;
    if (l->n < 16)
        snprintf(l->line[l->n++], sizeof(l->line[0]), "%s %s %u %" PRIu64 " %s %" PRIu64,
                 s->pod, s->model, s->dp_rank, s->last_seq, kvr_stream_state_name(s->state),
                 s->blocks);
}

static int line_cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

static void compare_streams(struct st *a, struct st *b)
{
    struct stream_list la = {0}, lb = {0};
    kvr_ingest_streams(a->ing, list_cb, &la);
    kvr_ingest_streams(b->ing, list_cb, &lb);
    CHECK(la.n == NPODS + 1);
    CHECK(la.n == lb.n);
    qsort(la.line, (size_t)la.n, sizeof(la.line[0]), line_cmp);
    qsort(lb.line, (size_t)lb.n, sizeof(lb.line[0]), line_cmp);
    for (int i = 0; i < la.n; i++) {
        if (strcmp(la.line[i], lb.line[i]) != 0)
            print_error("stream %d: '%s' vs '%s'\n", i, la.line[i], lb.line[i]);
        CHECK(strcmp(la.line[i], lb.line[i]) == 0);
    }
}

/* Loads DIR's snapshot into a fresh state as kvr_snap_boot does at startup. */
static void boot_into(const char *dir, struct st *s, struct kvr_snap_boot *bt)
{
    struct kvr_snap_boot_opts bo = {.dir = dir, .index = IXO};
    struct kvr_err err;
    memset(s, 0, sizeof(*s));
    assert_int_equal(kvr_index_create(&IXO, &s->ix), 0);
    int rc = kvr_snap_boot(&bo, &s->ix, bt, &err);
    if (rc != 0)
        print_error("boot: %s\n", err.msg);
    assert_int_equal(rc, 0);
    s->conf.writer_threads = 2;
    s->conf.queue_depth = 64;
    s->conf.max_events_per_batch = 1024;
    s->conf.max_tokens_per_event = 1 << 16;
    s->conf.max_workers = 1024;
    assert_int_equal(kvr_ingest_create(&s->conf, s->ix, &s->ing, &err), 0);
    if (bt->loaded.nstreams > 0)
        assert_int_equal(
            kvr_ingest_restore_streams(s->ing, bt->loaded.streams, bt->loaded.nstreams), 0);
}

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvr-test-snap-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
}

static void rm_dir(void)
{
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        print_error("could not remove %s\n", g_dir);
}

static void snapshot_of(struct st *s, struct kvr_buf *out)
{
    struct kvr_snap_opts so = {.index = s->ix, .ingest = s->ing};
    struct kvr_snap *sn;
    struct kvr_err err;
    assert_int_equal(kvr_snap_create(&so, &sn, &err), 0);
    assert_int_equal(kvr_snap_take(sn, out, &err), 0);
    kvr_snap_destroy(sn);
}

static size_t count_aside(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *e;
    size_t n = 0;
    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, "snapshot.kvr.bad-", 17) == 0;
    closedir(d);
    return n;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_round_trip_file(void **state)
{
    struct st a, b;
    struct model m;
    struct kvr_snap_boot bt;
    struct kvr_snap *sn;
    struct kvr_err err;
    (void)state;

    for (int round = 0; round < 5; round++) {
        g_rng = g_seed ^ (uint64_t)(round + 1) * 0x9e3779b97f4a7c15ull;
        make_dir();
        st_init(&a);
        fill(&a, &m);
        struct kvr_snap_opts so = {.dir = g_dir, .index = a.ix, .ingest = a.ing};
        assert_int_equal(kvr_snap_create(&so, &sn, &err), 0);
        assert_int_equal(kvr_snap_save(sn, &err), 0);
        kvr_snap_destroy(sn);
        boot_into(g_dir, &b, &bt);
        CHECK(bt.source != NULL && strcmp(bt.source, "file") == 0);
        CHECK(bt.loaded.nstreams == NPODS + 1);
        kvr_snap_boot_free(&bt);
        compare_finds(&a, &b, &m);
        compare_streams(&a, &b);
        /* and again from the restored state: the same content (the blobs need not be
         * byte-identical: the index may order a restored worker's entries differently) */
        struct kvr_buf x, y;
        struct kvr_snap_info ix_, iy_;
        kvr_buf_init(&x);
        kvr_buf_init(&y);
        snapshot_of(&a, &x);
        snapshot_of(&b, &y);
        assert_int_equal(kvr_snap_verify(x.data, x.len, &ix_, &err), 0);
        assert_int_equal(kvr_snap_verify(y.data, y.len, &iy_, &err), 0);
        CHECK(ix_.pairs == iy_.pairs && ix_.workers == iy_.workers);
        CHECK(ix_.streams == iy_.streams && ix_.namespaces == iy_.namespaces);
        CHECK(ix_.tiers == iy_.tiers);
        kvr_buf_free(&x);
        kvr_buf_free(&y);
        st_free(&a);
        st_free(&b);
        model_free(&m);
        rm_dir();
    }
}

/* With the writer threads running: the parts are taken by the writers (CMD items). */
static void test_take_with_writers(void **state)
{
    struct st a;
    struct model m;
    struct kvr_buf x, y;
    struct kvr_err err;
    struct kvr_snap_info info;
    (void)state;

    g_rng = g_seed ^ 0x77;
    st_init(&a);
    fill(&a, &m);
    kvr_buf_init(&x);
    kvr_buf_init(&y);
    snapshot_of(&a, &x); /* inline (no writer threads) */
    assert_int_equal(kvr_ingest_start(a.ing, &err), 0);
    snapshot_of(&a, &y); /* by the writers */
    kvr_ingest_stop(a.ing);
    CHECK(x.len == y.len);
    CHECK(memcmp(x.data + 96, y.data + 96, x.len - 96 - 32) == 0); /* but time and END */
    assert_int_equal(kvr_snap_verify(y.data, y.len, &info, &err), 0);
    CHECK(info.streams == NPODS + 1 && info.workers == NPODS && info.namespaces == 2);
    CHECK(info.tiers == 4); /* gpu, cpu, storage, nvme-x */
    kvr_buf_free(&x);
    kvr_buf_free(&y);
    st_free(&a);
    model_free(&m);
}

/* Recomputes every section checksum and the END checksum after an edit (a file that passes
 * the checksums but carries bad content). */
static void reseal(unsigned char *d, size_t len)
{
    size_t off = 96;
    uint64_t h = XXH64(d, 88, 0); /* first: the END checksum covers the header */
    memcpy(d + 88, &h, 8);
    while (off + 24 <= len) {
        uint32_t type;
        uint64_t sl;
        memcpy(&type, d + off, 4);
        memcpy(&sl, d + off + 8, 8);
        if (type == 15) {
            uint64_t whole = XXH64(d, off, 0);
            memcpy(d + off + 24, &whole, 8);
        }
        uint64_t sum = XXH64(d + off + 24, sl, 0);
        memcpy(d + off + 16, &sum, 8);
        off += 24 + sl;
    }
}

/* Version 2 keeps each stream's publisher id (a restarted kvrouterd must not read the engine
 * run it already knew as a restart); version 1 files, which have none, still load; a
 * version 1 file claiming one is refused. */
static void test_publisher_ids(void **state)
{
    struct st a;
    struct kvr_buf x;
    struct kvr_err err;
    struct kvr_snap_loaded l;
    struct kvr_index *ix;
    (void)state;

    for (int with = 0; with < 2; with++) {
        struct kvr_ingest_snap_stream ss[2] = {
            {.pod = "pod-a", .model = "org/m", .last_seq = 7, .pub_id = with ? 0x1234 : 0},
            {.pod = "pod-b", .model = "org/m", .dp_rank = 1, .last_seq = 9, .unsynced = true},
        };
        st_init(&a);
        assert_int_equal(kvr_ingest_restore_streams(a.ing, ss, 2), 0);
        kvr_buf_init(&x);
        snapshot_of(&a, &x);
        unsigned char *d = (unsigned char *)x.data;
        CHECK(d[8] == 2 && d[9] == 0 && d[10] == 0 && d[11] == 0); /* version 2 */
        assert_int_equal(kvr_index_create(&IXO, &ix), 0);
        assert_int_equal(kvr_snap_apply(x.data, x.len, ix, &l, &err), 0);
        CHECK(l.nstreams == 2);
        for (size_t i = 0; i < l.nstreams; i++) {
            bool is_a = strcmp(l.streams[i].pod, "pod-a") == 0;
            CHECK(l.streams[i].pub_id == (is_a && with ? 0x1234u : 0u));
            CHECK(l.streams[i].unsynced == !is_a);
            CHECK(l.streams[i].last_seq == (is_a ? 7u : 9u));
        }
        kvr_snap_loaded_free(&l);
        kvr_index_destroy(ix);

        /* the same bytes labelled version 1: fine without ids, refused with one */
        d[8] = 1;
        reseal(d, x.len);
        int rc = kvr_snap_verify(x.data, x.len, NULL, &err);
        if (with) {
            CHECK(rc == -EINVAL);
            CHECK(strstr(err.msg, "streams") != NULL);
        } else {
            CHECK(rc == 0);
            assert_int_equal(kvr_index_create(&IXO, &ix), 0);
            assert_int_equal(kvr_snap_apply(x.data, x.len, ix, &l, &err), 0);
            CHECK(l.nstreams == 2 && l.info.version == 1);
            CHECK(l.streams[0].pub_id == 0 && l.streams[1].pub_id == 0);
            kvr_snap_loaded_free(&l);
            kvr_index_destroy(ix);
        }
        kvr_buf_free(&x);
        st_free(&a);
    }
}

static void test_refused_files(void **state)
{
    struct st a, b;
    struct model m;
    struct kvr_buf good;
    struct kvr_err err;
    struct kvr_snap_boot bt;
    char path[300];
    (void)state;

    g_rng = g_seed ^ 0x5a5a;
    st_init(&a);
    fill(&a, &m);
    kvr_buf_init(&good);
    snapshot_of(&a, &good);
    assert_int_equal(kvr_snap_verify(good.data, good.len, NULL, &err), 0);

    /* every truncation */
    for (size_t n = 0; n < good.len; n++)
        CHECK(kvr_snap_verify(good.data, n, NULL, &err) != 0);
    /* one more byte */
    {
        char *p = malloc(good.len + 1);
        memcpy(p, good.data, good.len);
        p[good.len] = 0;
        CHECK(kvr_snap_verify(p, good.len + 1, NULL, &err) != 0);
        free(p);
    }
    /* random corruptions: 1..4 bytes changed */
    unsigned char *c = malloc(good.len);
    for (int i = 0; i < 3000; i++) {
        memcpy(c, good.data, good.len);
        int k = 1 + (int)(rnd() % 4);
        bool changed = false;
        for (int j = 0; j < k; j++) {
            size_t at = rnd() % good.len;
            unsigned char v = (unsigned char)(rnd() | 1);
            changed |= v != 0;
            c[at] ^= v;
        }
        CHECK(!changed || kvr_snap_verify(c, good.len, NULL, &err) != 0);
    }
    /* a future version (a valid header otherwise) */
    memcpy(c, good.data, good.len);
    c[8] = KVR_SNAP_VERSION + 1;
    reseal(c, good.len);
    CHECK(kvr_snap_verify(c, good.len, NULL, &err) == -EPROTONOSUPPORT);
    CHECK(strstr(err.msg, "newer") != NULL);
    /* foreign bytes */
    CHECK(kvr_snap_verify("GIF89a......................", 28, NULL, &err) == -EINVAL);
    CHECK(strstr(err.msg, "not a kvrouterd snapshot") != NULL);

    /* through boot: each refused file is set aside, the daemon starts empty */
    make_dir();
    snprintf(path, sizeof(path), "%s/snapshot.kvr", g_dir);
    size_t cuts[] = {0, 5, 96, good.len / 2, good.len - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        write_bytes(path, good.data, cuts[i]);
        boot_into(g_dir, &b, &bt);
        CHECK(bt.source == NULL);
        CHECK(access(path, F_OK) != 0);
        struct kvr_index_stats st;
        kvr_index_stats(b.ix, &st);
        CHECK(st.workers == 0 && st.namespaces == 0);
        kvr_snap_boot_free(&bt);
        st_free(&b);
    }
    CHECK(count_aside() == sizeof(cuts) / sizeof(cuts[0])); /* none overwritten */

    /* checksums fine but a worker blob the index refuses: loaded into the index, refused,
     * the index replaced by an empty one (never half loaded) */
    memcpy(c, good.data, good.len);
    {
        /* the last WORKER section: its blob's last byte */
        size_t off = 96, last = 0, lastlen = 0;
        while (off + 24 <= good.len) {
            uint32_t type;
            uint64_t sl;
            memcpy(&type, c + off, 4);
            memcpy(&sl, c + off + 8, 8);
            if (type == 4) {
                last = off;
                lastlen = sl;
            }
            off += 24 + sl;
        }
        CHECK(last != 0 && lastlen > 20);
        /* the blob's first byte (its format version): pod string, rank, length before it */
        uint16_t podlen;
        memcpy(&podlen, c + last + 24, 2);
        c[last + 24 + 2 + podlen + 1 + 4 + 8] ^= 0xff;
    }
    reseal(c, good.len);
    CHECK(kvr_snap_verify(c, good.len, NULL, &err) == 0); /* the container is fine */
    rm_dir();
    make_dir();
    snprintf(path, sizeof(path), "%s/snapshot.kvr", g_dir);
    write_bytes(path, c, good.len);
    boot_into(g_dir, &b, &bt);
    CHECK(bt.source == NULL); /* refused: nothing of it stayed */
    {
        struct kvr_index_stats st;
        kvr_index_stats(b.ix, &st);
        CHECK(st.workers == 0 && st.namespaces == 0 && st.holders == 0);
        CHECK(access(path, F_OK) != 0 && count_aside() == 1);
    }
    kvr_snap_boot_free(&bt);
    st_free(&b);

    /* one worker listed twice (its section repeated, the header's count raised, resealed):
     * refused before anything is restored; the restore threads wrote both into the same
     * worker at once (fuzz_snap: an assertion in the apply, a use-after-free) */
    {
        size_t off = 96, last = 0, lastlen = 0;
        while (off + 24 <= good.len) {
            uint32_t type;
            uint64_t sl;
            memcpy(&type, good.data + off, 4);
            memcpy(&sl, good.data + off + 8, 8);
            if (type == 4) {
                last = off;
                lastlen = sl;
            }
            off += 24 + sl;
        }
        CHECK(last != 0);
        size_t sec = 24 + lastlen, at = last + sec, n = good.len + sec;
        unsigned char *d = malloc(n);
        uint64_t nw;
        memcpy(d, good.data, at);
        memcpy(d + at, good.data + last, sec);
        memcpy(d + at + sec, good.data + at, good.len - at);
        memcpy(&nw, d + 48, 8);
        nw++;
        memcpy(d + 48, &nw, 8);
        reseal(d, n);
        CHECK(kvr_snap_verify(d, n, NULL, &err) == 0);
        struct st e;
        struct kvr_snap_loaded l;
        st_init(&e);
        CHECK(kvr_snap_apply(d, n, e.ix, &l, &err) == -EINVAL);
        CHECK(strstr(err.msg, "listed twice") != NULL);
        st_free(&e);
        free(d);
    }

    /* apply into a non-empty index */
    CHECK(kvr_snap_apply(good.data, good.len, a.ix, &bt.loaded, &err) == -EBUSY);

    free(c);
    rm_dir();
    kvr_buf_free(&good);
    st_free(&a);
    model_free(&m);
}

static void test_disk_full_keeps_old(void **state)
{
    struct st a;
    struct model m;
    struct kvr_snap *sn;
    struct kvr_err err;
    struct kvr_buf before, after;
    struct rlimit old, lim;
    char path[300];
    (void)state;

    g_rng = g_seed ^ 0xd15c;
    make_dir();
    st_init(&a);
    fill(&a, &m);
    struct kvr_snap_opts so = {.dir = g_dir, .index = a.ix, .ingest = a.ing};
    assert_int_equal(kvr_snap_create(&so, &sn, &err), 0);
    assert_int_equal(kvr_snap_save(sn, &err), 0);
    snprintf(path, sizeof(path), "%s/snapshot.kvr", g_dir);
    kvr_buf_init(&before);
    kvr_buf_init(&after);
    assert_int_equal(kvr_snap_read_file(path, &before, &err), 0);

    /* more content, then a write limited to 1 KiB: EFBIG (SIGXFSZ ignored) */
    uint32_t wid;
    struct kvr_index_block blk = {.engine_hash = 77, .content_hash = 78};
    struct kvr_index_wres res = {0};
    assert_int_equal(kvr_index_worker_lookup(a.ix, g_pod[1], 0, &wid), 0);
    assert_int_equal(kvr_index_store(a.ix, wid, 0, 0, NULL, &blk, 1, &res), 0);
    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 1024;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = kvr_snap_save(sn, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    CHECK(rc != 0);
    CHECK(strstr(err.msg, "previous snapshot is kept") != NULL);
    assert_int_equal(kvr_snap_read_file(path, &after, &err), 0);
    CHECK(before.len == after.len && memcmp(before.data, after.data, before.len) == 0);
    snprintf(path, sizeof(path), "%s/snapshot.tmp", g_dir);
    CHECK(access(path, F_OK) != 0);
    struct kvr_buf mt;
    kvr_buf_init(&mt);
    kvr_snap_metrics(sn, &mt);
    CHECK(strstr(mt.data, "kvrouter_snapshot_failures_total 1\n") != NULL);
    CHECK(strstr(mt.data, "kvrouter_snapshot_total 1\n") != NULL);
    kvr_buf_free(&mt);

    kvr_snap_destroy(sn);
    kvr_buf_free(&before);
    kvr_buf_free(&after);
    st_free(&a);
    model_free(&m);
    rm_dir();
}

/* A snapshot from the future (the clock went back since it was written): loaded, with a
 * warning. */
static void test_clock_skew(void **state)
{
    struct st a, b;
    struct model m;
    struct kvr_buf x;
    struct kvr_snap_boot bt;
    char path[300], logpath[300], text[4096];
    (void)state;

    g_rng = g_seed ^ 0xc10c;
    st_init(&a);
    fill(&a, &m);
    kvr_buf_init(&x);
    snapshot_of(&a, &x);
    uint64_t created;
    memcpy(&created, x.data + 16, 8);
    created += 86400000ull; /* a day ahead */
    memcpy(x.data + 16, &created, 8);
    reseal((unsigned char *)x.data, x.len);
    make_dir();
    snprintf(path, sizeof(path), "%s/snapshot.kvr", g_dir);
    write_bytes(path, x.data, x.len);
    snprintf(logpath, sizeof(logpath), "%s/log", g_dir);
    int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    kvr_log_set_fd(fd);
    boot_into(g_dir, &b, &bt);
    kvr_log_set_fd(2);
    close(fd);
    CHECK(bt.source != NULL); /* loaded */
    FILE *f = fopen(logpath, "r");
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    CHECK(strstr(text, "in the future") != NULL);
    compare_finds(&a, &b, &m);
    kvr_snap_boot_free(&bt);
    st_free(&b);
    st_free(&a);
    kvr_buf_free(&x);
    model_free(&m);
    rm_dir();
}

static void test_unusable_dir(void **state)
{
    struct kvr_err err;
    struct kvr_index *ix;
    struct kvr_snap_boot bt;
    char path[300];
    (void)state;

    make_dir();
    CHECK(kvr_snap_check_dir(g_dir, false, &err) == 0);
    CHECK(kvr_snap_check_dir(g_dir, true, &err) == 0);
    /* neither the directory nor its parent: nothing is created, at -t or at startup */
    snprintf(path, sizeof(path), "%s/missing/deeper", g_dir);
    CHECK(kvr_snap_check_dir(path, false, &err) == -ENOENT);
    CHECK(strstr(err.msg, "missing/deeper") != NULL);
    CHECK(kvr_snap_check_dir(path, true, &err) == -ENOENT);
    snprintf(path, sizeof(path), "%s/missing", g_dir);
    CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof(path), "%s/file", g_dir);
    write_bytes(path, "x", 1);
    CHECK(kvr_snap_check_dir(path, false, &err) == -ENOTDIR);
    snprintf(path, sizeof(path), "%s/file/below", g_dir); /* the parent is a file */
    CHECK(kvr_snap_check_dir(path, true, &err) == -ENOTDIR);
    snprintf(path, sizeof(path), "%s/file", g_dir);
    /* startup: an error, not a daemon without snapshots */
    struct kvr_snap_boot_opts bo = {.dir = path, .index = IXO};
    assert_int_equal(kvr_index_create(&IXO, &ix), 0);
    CHECK(kvr_snap_boot(&bo, &ix, &bt, &err) == -ENOTDIR);
    kvr_index_destroy(ix);
    if (geteuid() != 0) { /* root writes anywhere */
        snprintf(path, sizeof(path), "%s/ro", g_dir);
        mkdir(path, 0500);
        CHECK(kvr_snap_check_dir(path, false, &err) == -EACCES);
        snprintf(path, sizeof(path), "%s/ro/state", g_dir); /* cannot be created */
        CHECK(kvr_snap_check_dir(path, false, &err) == -EACCES);
        CHECK(kvr_snap_check_dir(path, true, &err) == -EACCES);
    }
    rm_dir();
}

/* A missing state directory whose parent exists (a fresh machine's /var/lib/kvrouterd): -t
 * accepts it without creating it; startup creates it, mode 0750 less the umask, and boots. */
static void test_missing_dir_created(void **state)
{
    struct kvr_err err;
    struct kvr_index *ix;
    struct kvr_snap_boot bt;
    struct stat sb;
    char path[320], slashed[330];
    mode_t um = umask(022);
    (void)state;

    umask(um);
    make_dir();
    snprintf(path, sizeof(path), "%s/state", g_dir);
    CHECK(kvr_snap_check_dir(path, false, &err) == 1);
    CHECK(stat(path, &sb) != 0 && errno == ENOENT); /* -t changes nothing */
    CHECK(kvr_snap_check_dir(path, true, &err) == 0);
    CHECK(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    assert_int_equal(sb.st_mode & 0777, 0750 & ~um);
    CHECK(kvr_snap_check_dir(path, true, &err) == 0); /* exists now: unchanged */
    CHECK(rmdir(path) == 0);
    /* trailing slashes name the same directory */
    snprintf(slashed, sizeof(slashed), "%s//", path);
    CHECK(kvr_snap_check_dir(slashed, false, &err) == 1);
    CHECK(kvr_snap_check_dir(slashed, true, &err) == 0);
    CHECK(rmdir(path) == 0);
    /* startup: kvr_snap_boot makes it and starts empty */
    struct kvr_snap_boot_opts bo = {.dir = path, .index = IXO};
    assert_int_equal(kvr_index_create(&IXO, &ix), 0);
    CHECK(kvr_snap_boot(&bo, &ix, &bt, &err) == 0);
    CHECK(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    kvr_snap_boot_free(&bt);
    kvr_index_destroy(ix);
    rm_dir();
}

#ifdef FUZZ_SEEDS_DIR
/* Writes small real snapshots as the fuzz seed corpus (make -C ... with -DFUZZ_SEEDS_DIR). */
static void test_write_seeds(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        struct st a;
        struct model m;
        struct kvr_buf x;
        char path[512];
        g_rng = 0x1234 + (uint64_t)i;
        st_init(&a);
        if (i > 0)
            fill(&a, &m);
        kvr_buf_init(&x);
        snapshot_of(&a, &x);
        snprintf(path, sizeof(path), "%s/seed-%d.kvr", FUZZ_SEEDS_DIR, i);
        write_bytes(path, x.data, x.len);
        kvr_buf_free(&x);
        st_free(&a);
        if (i > 0)
            model_free(&m);
    }
    { /* version 2: streams with and without a publisher id */
        struct kvr_ingest_snap_stream ss[2] = {
            {.pod = "pod-a", .model = "org/m", .last_seq = 7, .pub_id = 0x1234},
            {.pod = "pod-b", .model = "org/m", .dp_rank = 1, .last_seq = 9, .unsynced = true},
        };
        struct st a;
        struct kvr_buf x;
        char path[512];
        st_init(&a);
        assert_int_equal(kvr_ingest_restore_streams(a.ing, ss, 2), 0);
        kvr_buf_init(&x);
        snapshot_of(&a, &x);
        snprintf(path, sizeof(path), "%s/seed-3-publisher-id.kvr", FUZZ_SEEDS_DIR);
        write_bytes(path, x.data, x.len);
        kvr_buf_free(&x);
        st_free(&a);
    }
}
#endif

int main(void)
{
    const char *env = getenv("KVR_SEED");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_file),
        cmocka_unit_test(test_take_with_writers),
        cmocka_unit_test(test_refused_files),
        cmocka_unit_test(test_publisher_ids),
        cmocka_unit_test(test_disk_full_keeps_old),
        cmocka_unit_test(test_clock_skew),
        cmocka_unit_test(test_unusable_dir),
        cmocka_unit_test(test_missing_dir_created),
#ifdef FUZZ_SEEDS_DIR
        cmocka_unit_test(test_write_seeds),
#endif
    };
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    if (g_seed == 0)
        g_seed = 1;
    printf("test_snap: KVR_SEED=%" PRIu64 "\n", g_seed);
    kvr_log_configure(KVR_LOG_WARN, KVR_LOG_TEXT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
