/* bench_publisher.c — replays a request trace through simulated vLLM engines and publishes
 * their KV-cache events, in the real wire format, into a running kvrouterd.
 *
 * Engines: each has a prefix cache of `cache_blocks` blocks that behaves like vLLM's
 * BlockPool: a request's full blocks are hashed as a chain (engine hash = xxh3 of the block's
 * token ids seeded with the parent hash, the same for every engine, as with a shared
 * PYTHONHASHSEED), the longest cached prefix is reused, the rest is allocated from an LRU
 * free queue (reusing a block that still caches a hash evicts it: one BlockRemoved per
 * evicted block), the new full blocks are announced in one BlockStored (parent = last cached
 * block), and the finished request frees its blocks tail first (leaves are evicted before
 * their parents).
 *
 * Trace: one JSON object per line with input_length and hash_ids (one id per 512 tokens);
 * each id expands deterministically into 512 token ids (an epoch salt makes every pass over
 * the trace new content). Request i goes to engine hash(hash_ids[0]) % engines, so shared
 * prefixes meet on the same engine as a KV-aware router would arrange.
 *
 * Phases: all batches are generated first (one batch per request, v0.24+ map events inside
 * the positional batch, msgpack-c packer), then published: as fast as possible
 * (--rate 0) or paced at --rate batches/s. The batch timestamp is patched to the wall clock
 * right before each send, so the daemon's events_lag_seconds is publish-to-applied.
 * One PUB per engine, connected to the daemon's bound SUB, SNDHWM 0 (never drops: TCP
 * back-pressure instead), topic kv@bench-<i>@<model>.
 *
 * Output: one JSON line on stdout with what was published and the engines' final cache
 * contents (cached_blocks: what the index should hold at the end).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <msgpack.h>
#include <xxhash.h>
#include <zmq.h>

#define TRACE_BLOCK 512

struct opts {
    const char *trace;
    const char *endpoint;
    const char *model;
    uint32_t engines;
    uint32_t block_size;
    uint32_t cache_blocks;
    uint32_t epochs;
    uint32_t max_requests; /* 0 = all */
    double rate;           /* batches/s; 0 = as fast as possible */
    double duration;       /* paced mode: stop after this many seconds (0 = all) */
};

/* ---- trace ---------------------------------------------------------------------------- */

struct req {
    uint32_t input_length;
    uint32_t nids;
    uint32_t *ids;
};

static int load_trace(const char *path, struct req **out, size_t *n)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0, cnt = 0, rcap = 0;
    struct req *reqs = NULL;
    ssize_t len;

    if (f == NULL)
        return -errno;
    while ((len = getline(&line, &cap, f)) > 0) {
        char *p = strstr(line, "\"input_length\"");
        char *h = strstr(line, "\"hash_ids\"");
        struct req r = {0};
        size_t icap = 0;

        if (p == NULL || h == NULL)
            continue;
        p = strchr(p, ':');
        r.input_length = (uint32_t)strtoul(p + 1, NULL, 10);
        h = strchr(h, '[');
        if (h == NULL)
            continue;
        h++;
        for (;;) {
            char *end;
            unsigned long v;
            while (*h == ' ' || *h == ',')
                h++;
            if (*h == ']' || *h == '\0')
                break;
            v = strtoul(h, &end, 10);
            if (end == h)
                break;
            h = end;
            if (r.nids == icap) {
                icap = icap ? icap * 2 : 64;
                r.ids = realloc(r.ids, icap * sizeof(*r.ids));
            }
            r.ids[r.nids++] = (uint32_t)v;
        }
        if (r.nids == 0) {
            free(r.ids);
            continue;
        }
        if (cnt == rcap) {
            rcap = rcap ? rcap * 2 : 1024;
            reqs = realloc(reqs, rcap * sizeof(*reqs));
        }
        reqs[cnt++] = r;
    }
    free(line);
    fclose(f);
    *out = reqs;
    *n = cnt;
    return 0;
}

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- engines: vLLM's block pool in miniature ------------------------------------------- */

struct blk {
    uint64_t hash;
    int32_t prev, next; /* LRU free queue links (-1 = none) */
    uint32_t ref;
    bool cached;
    bool in_free;
};

struct engine {
    struct blk *b;
    uint32_t nblocks;
    int32_t head, tail; /* free queue: head = least recently freed (evicted first) */
    uint64_t *map_keys; /* open addressing: hash → block index + 1 */
    uint32_t *map_vals;
    uint32_t map_cap;
    uint64_t cached;
    uint64_t seq;
    void *pub;
    char topic[128];
};

static void fq_remove(struct engine *e, int32_t i)
{
    struct blk *b = &e->b[i];
    if (b->prev >= 0)
        e->b[b->prev].next = b->next;
    else
        e->head = b->next;
    if (b->next >= 0)
        e->b[b->next].prev = b->prev;
    else
        e->tail = b->prev;
    b->prev = b->next = -1;
    b->in_free = false;
}

static void fq_push(struct engine *e, int32_t i)
{
    struct blk *b = &e->b[i];
    b->prev = e->tail;
    b->next = -1;
    if (e->tail >= 0)
        e->b[e->tail].next = i;
    else
        e->head = i;
    e->tail = i;
    b->in_free = true;
}

static uint32_t map_slot(const struct engine *e, uint64_t h)
{
    return (uint32_t)(splitmix(h) & (e->map_cap - 1));
}

static int32_t map_get(const struct engine *e, uint64_t h)
{
    for (uint32_t j = map_slot(e, h);; j = (j + 1) & (e->map_cap - 1)) {
        if (e->map_vals[j] == 0)
            return -1;
        if (e->map_keys[j] == h)
            return (int32_t)e->map_vals[j] - 1;
    }
}

static void map_put(struct engine *e, uint64_t h, int32_t i)
{
    uint32_t j = map_slot(e, h);
    while (e->map_vals[j] != 0)
        j = (j + 1) & (e->map_cap - 1);
    e->map_keys[j] = h;
    e->map_vals[j] = (uint32_t)i + 1;
}

/* Backward-shift deletion keeps linear probing correct without tombstones. */
static void map_del(struct engine *e, uint64_t h)
{
    uint32_t mask = e->map_cap - 1, j = map_slot(e, h);
    while (e->map_vals[j] != 0 && e->map_keys[j] != h)
        j = (j + 1) & mask;
    if (e->map_vals[j] == 0)
        return;
    for (uint32_t k = (j + 1) & mask; e->map_vals[k] != 0; k = (k + 1) & mask) {
        uint32_t home = map_slot(e, e->map_keys[k]);
        /* move k into the hole j if its home is not in (j, k] cyclically */
        if (((k - home) & mask) >= ((k - j) & mask)) {
            e->map_keys[j] = e->map_keys[k];
            e->map_vals[j] = e->map_vals[k];
            j = k;
        }
    }
    e->map_vals[j] = 0;
}

static void engine_init(struct engine *e, uint32_t nblocks)
{
    memset(e, 0, sizeof(*e));
    e->nblocks = nblocks;
    e->b = calloc(nblocks, sizeof(*e->b));
    e->head = e->tail = -1;
    for (uint32_t i = 0; i < nblocks; i++) {
        e->b[i].prev = e->b[i].next = -1;
        fq_push(e, (int32_t)i);
    }
    e->map_cap = 1;
    while (e->map_cap < nblocks * 2)
        e->map_cap <<= 1;
    e->map_keys = calloc(e->map_cap, sizeof(*e->map_keys));
    e->map_vals = calloc(e->map_cap, sizeof(*e->map_vals));
}

/* ---- batches ----------------------------------------------------------------------------- */

struct batch {
    uint32_t engine;
    uint64_t seq;
    char *data;
    size_t len;
};

struct totals {
    uint64_t batches, stored_events, removed_events, blocks_stored, blocks_removed, bytes;
    uint64_t requests_skipped, hit_blocks;
};

static void pk_str(msgpack_packer *p, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(p, n);
    msgpack_pack_str_body(p, s, n);
}

/* Runs one request on engine e; appends the batch to out. */
static bool run_request(struct engine *e, const struct req *r, uint32_t bs, uint64_t salt,
                        uint32_t *tokens, uint64_t *hashes, int32_t *held, uint64_t *removed,
                        struct batch *out, struct totals *tot)
{
    uint32_t ntok = r->input_length;
    uint32_t nfull, hit = 0, nheld = 0, nrem = 0, need;
    msgpack_sbuffer sb;
    msgpack_packer p;

    if (ntok > r->nids * TRACE_BLOCK)
        ntok = r->nids * TRACE_BLOCK;
    nfull = ntok / bs;
    need = nfull + (ntok % bs ? 1 : 0);
    if (need == 0 || need > e->nblocks) {
        tot->requests_skipped++;
        return false;
    }
    for (uint32_t i = 0; i < ntok; i++) {
        uint64_t id = r->ids[i / TRACE_BLOCK];
        tokens[i] = (uint32_t)(splitmix((id << 10) ^ (i % TRACE_BLOCK) ^ salt) % 150000);
    }
    for (uint32_t i = 0; i < nfull; i++)
        hashes[i] = XXH3_64bits_withSeed(tokens + (size_t)i * bs, (size_t)bs * 4,
                                         i ? hashes[i - 1] : 0x5eedull);
    /* longest cached prefix */
    for (; hit < nfull; hit++) {
        int32_t bi = map_get(e, hashes[hit]);
        if (bi < 0)
            break;
        if (e->b[bi].ref++ == 0)
            fq_remove(e, bi);
        held[nheld++] = bi;
    }
    tot->hit_blocks += hit;
    /* allocate the rest (full blocks cached, the partial tail not) */
    for (uint32_t i = hit; i < need; i++) {
        int32_t bi = e->head;
        struct blk *b = &e->b[bi];
        fq_remove(e, bi);
        if (b->cached) {
            removed[nrem++] = b->hash;
            map_del(e, b->hash);
            b->cached = false;
            e->cached--;
        }
        b->ref = 1;
        if (i < nfull) {
            b->hash = hashes[i];
            b->cached = true;
            map_put(e, hashes[i], bi);
            e->cached++;
        }
        held[nheld++] = bi;
    }
    /* the batch: evictions first (allocation order), then the store */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 0.0); /* patched at send time */
    msgpack_pack_array(&p, nrem + (nfull > hit ? 1 : 0));
    for (uint32_t i = 0; i < nrem; i++) {
        msgpack_pack_map(&p, 4);
        pk_str(&p, "type");
        pk_str(&p, "BlockRemoved");
        pk_str(&p, "block_hashes");
        msgpack_pack_array(&p, 1);
        msgpack_pack_uint64(&p, removed[i]);
        pk_str(&p, "medium");
        pk_str(&p, "GPU");
        pk_str(&p, "group_idx");
        msgpack_pack_uint32(&p, 0);
    }
    if (nfull > hit) {
        uint32_t n = nfull - hit;
        msgpack_pack_map(&p, 11);
        pk_str(&p, "type");
        pk_str(&p, "BlockStored");
        pk_str(&p, "block_hashes");
        msgpack_pack_array(&p, n);
        for (uint32_t i = hit; i < nfull; i++)
            msgpack_pack_uint64(&p, hashes[i]);
        pk_str(&p, "parent_block_hash");
        if (hit > 0)
            msgpack_pack_uint64(&p, hashes[hit - 1]);
        else
            msgpack_pack_nil(&p);
        pk_str(&p, "token_ids");
        msgpack_pack_array(&p, (size_t)n * bs);
        for (size_t i = (size_t)hit * bs; i < (size_t)nfull * bs; i++)
            msgpack_pack_uint32(&p, tokens[i]);
        pk_str(&p, "block_size");
        msgpack_pack_uint32(&p, bs);
        pk_str(&p, "lora_id");
        msgpack_pack_nil(&p);
        pk_str(&p, "medium");
        pk_str(&p, "GPU");
        pk_str(&p, "lora_name");
        msgpack_pack_nil(&p);
        pk_str(&p, "extra_keys");
        msgpack_pack_array(&p, n);
        for (uint32_t i = 0; i < n; i++)
            msgpack_pack_nil(&p);
        pk_str(&p, "group_idx");
        msgpack_pack_uint32(&p, 0);
        pk_str(&p, "kv_cache_spec_kind");
        pk_str(&p, "full_attention");
        tot->stored_events++;
        tot->blocks_stored += n;
    }
    msgpack_pack_uint32(&p, 0); /* data_parallel_rank */
    tot->removed_events += nrem;
    tot->blocks_removed += nrem;
    /* the request finishes: free tail first */
    for (uint32_t k = nheld; k-- > 0;) {
        struct blk *b = &e->b[held[k]];
        if (--b->ref == 0)
            fq_push(e, held[k]);
    }
    out->data = sb.data;
    out->len = sb.size;
    out->seq = e->seq++;
    tot->batches++;
    tot->bytes += sb.size;
    return true;
}

/* ---- publishing ---------------------------------------------------------------------------- */

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void patch_ts(char *data, double ts)
{
    uint64_t bits;
    memcpy(&bits, &ts, 8);
    for (int i = 0; i < 8; i++)
        data[2 + i] = (char)(bits >> (56 - 8 * i));
}

static int send_batch(struct engine *e, struct batch *b)
{
    unsigned char s8[8];
    for (int i = 0; i < 8; i++)
        s8[i] = (unsigned char)(b->seq >> (56 - 8 * i));
    patch_ts(b->data, wall_s());
    if (zmq_send(e->pub, e->topic, strlen(e->topic), ZMQ_SNDMORE) < 0 ||
        zmq_send(e->pub, s8, 8, ZMQ_SNDMORE) < 0 || zmq_send(e->pub, b->data, b->len, 0) < 0)
        return -errno;
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_publisher --endpoint tcp://127.0.0.1:PORT [--trace FILE] [--engines N]\n"
            "       [--block-size N] [--cache-blocks N] [--epochs N] [--requests N]\n"
            "       [--rate BATCHES_PER_S] [--duration S] [--model NAME]\n"
            "env: KVR_BENCH_TRACE overrides the default trace "
            "(../shared/traces/synthetic_trace.jsonl)\n");
}

int main(int argc, char **argv)
{
    struct opts o = {.trace = NULL, .endpoint = NULL, .model = "bench/model", .engines = 8,
                     .block_size = 16, .cache_blocks = 16384, .epochs = 1};
    struct req *reqs = NULL;
    size_t nreqs = 0;
    struct engine *eng;
    struct batch *batches;
    struct totals tot = {0};
    uint32_t *tokens;
    uint64_t *hashes, *removed;
    int32_t *held;
    size_t nb = 0, maxtok = 0, sent = 0;
    double g0, g1, p0, p1;
    void *ctx;
    int rc;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            usage();
            return 2;
        }
        if (strcmp(a, "--endpoint") == 0)
            o.endpoint = v;
        else if (strcmp(a, "--trace") == 0)
            o.trace = v;
        else if (strcmp(a, "--model") == 0)
            o.model = v;
        else if (strcmp(a, "--engines") == 0)
            o.engines = (uint32_t)atoi(v);
        else if (strcmp(a, "--block-size") == 0)
            o.block_size = (uint32_t)atoi(v);
        else if (strcmp(a, "--cache-blocks") == 0)
            o.cache_blocks = (uint32_t)atoi(v);
        else if (strcmp(a, "--epochs") == 0)
            o.epochs = (uint32_t)atoi(v);
        else if (strcmp(a, "--requests") == 0)
            o.max_requests = (uint32_t)atoi(v);
        else if (strcmp(a, "--rate") == 0)
            o.rate = atof(v);
        else if (strcmp(a, "--duration") == 0)
            o.duration = atof(v);
        else {
            usage();
            return 2;
        }
        i++;
    }
    if (o.trace == NULL)
        o.trace = getenv("KVR_BENCH_TRACE") ? getenv("KVR_BENCH_TRACE")
                                            : "../shared/traces/synthetic_trace.jsonl";
    if (o.endpoint == NULL || o.engines == 0 || o.block_size == 0 || o.epochs == 0) {
        usage();
        return 2;
    }
    rc = load_trace(o.trace, &reqs, &nreqs);
    if (rc != 0 || nreqs == 0) {
        fprintf(stderr, "bench_publisher: cannot read trace %s: %s\n", o.trace,
                rc ? strerror(-rc) : "empty");
        return 1;
    }
    if (o.max_requests && o.max_requests < nreqs)
        nreqs = o.max_requests;
    for (size_t i = 0; i < nreqs; i++)
        if ((size_t)reqs[i].nids * TRACE_BLOCK > maxtok)
            maxtok = (size_t)reqs[i].nids * TRACE_BLOCK;

    /* generate */
    g0 = mono_s();
    eng = calloc(o.engines, sizeof(*eng));
    for (uint32_t i = 0; i < o.engines; i++) {
        engine_init(&eng[i], o.cache_blocks);
        snprintf(eng[i].topic, sizeof(eng[i].topic), "kv@bench-%u@%s", i, o.model);
    }
    tokens = malloc(maxtok * sizeof(*tokens));
    hashes = malloc((maxtok / o.block_size + 2) * sizeof(*hashes));
    removed = malloc((maxtok / o.block_size + 2) * sizeof(*removed));
    held = malloc((maxtok / o.block_size + 2) * sizeof(*held));
    batches = calloc(nreqs * o.epochs, sizeof(*batches));
    for (uint32_t ep = 0; ep < o.epochs; ep++) {
        uint64_t salt = splitmix(0xabcdefull + ep);
        for (size_t i = 0; i < nreqs; i++) {
            uint32_t ei = (uint32_t)(splitmix(reqs[i].ids[0] ^ salt) % o.engines);
            if (run_request(&eng[ei], &reqs[i], o.block_size, salt, tokens, hashes, held,
                            removed, &batches[nb], &tot))
                batches[nb++].engine = ei;
        }
    }
    g1 = mono_s();

    /* publish */
    ctx = zmq_ctx_new();
    for (uint32_t i = 0; i < o.engines; i++) {
        int zero = 0;
        eng[i].pub = zmq_socket(ctx, ZMQ_PUB);
        zmq_setsockopt(eng[i].pub, ZMQ_SNDHWM, &zero, sizeof(zero));
        if (zmq_connect(eng[i].pub, o.endpoint) != 0) {
            fprintf(stderr, "bench_publisher: connect %s: %s\n", o.endpoint,
                    zmq_strerror(errno));
            return 1;
        }
    }
    /* slow joiner: the daemon's SUB must have its subscription in place */
    {
        struct timespec ts = {0, 300 * 1000000L};
        nanosleep(&ts, NULL);
    }
    p0 = mono_s();
    for (size_t i = 0; i < nb; i++) {
        if (o.rate > 0) {
            double due = p0 + (double)i / o.rate;
            double now = mono_s();
            if (o.duration > 0 && now - p0 >= o.duration)
                break;
            if (due > now) {
                double d = due - now;
                struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
                nanosleep(&ts, NULL);
            }
        }
        if (send_batch(&eng[batches[i].engine], &batches[i]) != 0) {
            fprintf(stderr, "bench_publisher: send: %s\n", zmq_strerror(errno));
            return 1;
        }
        sent++;
    }
    p1 = mono_s();
    {
        uint64_t cached = 0;
        for (uint32_t i = 0; i < o.engines; i++)
            cached += eng[i].cached;
        printf("{\"requests\": %zu, \"epochs\": %u, \"engines\": %u, \"block_size\": %u, "
               "\"batches\": %" PRIu64 ", \"sent\": %zu, \"stored_events\": %" PRIu64
               ", \"removed_events\": %" PRIu64 ", \"blocks_stored\": %" PRIu64
               ", \"blocks_removed\": %" PRIu64 ", \"hit_blocks\": %" PRIu64
               ", \"bytes\": %" PRIu64 ", \"cached_blocks\": %" PRIu64
               ", \"skipped_requests\": %" PRIu64 ", \"generate_s\": %.3f, \"publish_s\": %.3f, "
               "\"publish_start_wall\": %.6f}\n",
               nreqs, o.epochs, o.engines, o.block_size, tot.batches, sent, tot.stored_events,
               tot.removed_events, tot.blocks_stored, tot.blocks_removed, tot.hit_blocks,
               tot.bytes, cached, tot.requests_skipped, g1 - g0, p1 - p0,
               wall_s() - (mono_s() - p0));
        fflush(stdout);
    }
    /* keep the sockets until everything is flushed to the daemon (linger: unlimited) */
    for (uint32_t i = 0; i < o.engines; i++)
        zmq_close(eng[i].pub);
    zmq_ctx_term(ctx);
    for (size_t i = 0; i < nb; i++)
        free(batches[i].data);
    free(batches);
    for (uint32_t i = 0; i < o.engines; i++) {
        free(eng[i].b);
        free(eng[i].map_keys);
        free(eng[i].map_vals);
    }
    free(eng);
    for (size_t i = 0; i < nreqs; i++)
        free(reqs[i].ids);
    free(reqs);
    free(tokens);
    free(hashes);
    free(removed);
    free(held);
    return 0;
}
