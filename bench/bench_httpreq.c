/* bench_httpreq.c — CPU cost of one scoring request without sockets: HTTP parsing, body
 * decoding (JSON or msgpack), hashing, index lookup, ranking and the JSON answer, through the
 * same code the loop threads run (kvr_httpreq_conn_feed → httpapi → score → index).
 *
 * Index: 64 workers; worker w holds a prefix of (8 + w % 56) * 512 / 16 ... of one of 8 base
 * prompts of 8192 tokens, block size 16, so a query matches several workers at different
 * depths. Queries: the base prompts (8192 tokens), as "POST /v1/score" with ", "-separated
 * JSON and as msgpack (msgpack twice: the best token decoder, then the scalar one).
 * Thread CPU time, best of 5 rounds.
 * Usage: bench_httpreq [iterations [json|msgpack|mp-scalar]] (the second: that mode only, for
 * profiling)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/conf.h"
#include "index/hash.h"
#include "http/httpapi.h"
#include "http/httpreq.h"
#include "index/index.h"
#include "http/reqbody.h"
#include "route/score.h"

#define NTOK 8192
#define BS 16
#define NBASE 8
#define NWORKERS 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t base[NBASE][NTOK];

static size_t make_request(char *buf, size_t cap, int b, int msgpack)
{
    static char body[NTOK * 12 + 256];
    size_t blen = 0, hlen;

    if (!msgpack) {
        blen = (size_t)snprintf(body, sizeof(body), "{\"model\": \"Qwen/Qwen3-8B\", \"token_ids\": [");
        for (int i = 0; i < NTOK; i++)
            blen += (size_t)snprintf(body + blen, sizeof(body) - blen, "%s%u", i ? ", " : "",
                                     base[b][i]);
        blen += (size_t)snprintf(body + blen, sizeof(body) - blen, "]}");
    } else {
        unsigned char *p = (unsigned char *)body;
        p[blen++] = 0x82;
        p[blen++] = 0xa5;
        memcpy(p + blen, "model", 5);
        blen += 5;
        p[blen++] = 0xad;
        memcpy(p + blen, "Qwen/Qwen3-8B", 13);
        blen += 13;
        p[blen++] = 0xa9;
        memcpy(p + blen, "token_ids", 9);
        blen += 9;
        p[blen++] = 0xdc;
        p[blen++] = NTOK >> 8;
        p[blen++] = NTOK & 0xff;
        for (int i = 0; i < NTOK; i++) {
            uint32_t v = base[b][i];
            if (v < 128) {
                p[blen++] = (unsigned char)v;
            } else if (v < 65536) {
                p[blen++] = 0xcd;
                p[blen++] = (unsigned char)(v >> 8);
                p[blen++] = (unsigned char)v;
            } else {
                p[blen++] = 0xce;
                p[blen++] = (unsigned char)(v >> 24);
                p[blen++] = (unsigned char)(v >> 16);
                p[blen++] = (unsigned char)(v >> 8);
                p[blen++] = (unsigned char)v;
            }
        }
    }
    hlen = (size_t)snprintf(buf, cap,
                            "POST /v1/score HTTP/1.1\r\nHost: bench\r\nContent-Type: %s\r\n"
                            "Content-Length: %zu\r\n\r\n",
                            msgpack ? "application/msgpack" : "application/json", blen);
    memcpy(buf + hlen, body, blen);
    return hlen + blen;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    struct kvr_conf conf;
    struct kvr_err err;
    struct kvr_index *ix;
    struct kvr_index_opts o = {0};
    struct kvr_score *score;
    struct kvr_httpapi *api;
    struct kvr_httpapi_thread *th;
    struct kvr_httpapi_deps d;
    struct kvr_httpstats st;
    struct kvr_buf scratch;
    struct kvr_httpreq_limits lim = {16u << 20, 16384, 64, 10000, 60000, 0, false};
    struct kvr_httpconn c;
    static char reqs[2][NBASE][NTOK * 12 + 512], work[NTOK * 12 + 512];
    size_t lens[2][NBASE], resp_bytes = 0;
    unsigned seed = 1;
    uint64_t eh = 1;

    memset(&st, 0, sizeof(st));
    if (kvr_conf_load_string("bench", "[events]\nbind = tcp://127.0.0.1:*\n", &conf, &err) != 0)
        return fprintf(stderr, "%s\n", err.msg), 1;
    o.max_query_blocks = conf.max_query_tokens;
    if (kvr_index_create(&o, &ix) != 0 || kvr_score_create(ix, &conf, &score) != 0)
        return 1;
    for (int b = 0; b < NBASE; b++)
        for (int i = 0; i < NTOK; i++)
            base[b][i] = (uint32_t)rand_r(&seed) % 152064u;
    for (int w = 0; w < NWORKERS; w++) {
        char pod[32];
        uint32_t wid, ns, nb = (uint32_t)(NTOK / BS) * (uint32_t)(8 + w % 56) / 64u;
        uint64_t nseed, content[NTOK / BS];
        uint8_t tier;
        struct kvr_index_block blk[NTOK / BS];
        struct kvr_index_wres res = {0};
        snprintf(pod, sizeof(pod), "engine-%02d", w);
        kvr_index_worker_intern(ix, pod, 0, &wid);
        kvr_index_ns_intern(ix, "Qwen/Qwen3-8B", NULL, &ns, &nseed);
        kvr_index_ns_set_block_size(ix, ns, BS);
        kvr_index_tier_intern(ix, "GPU", 3, &tier);
        kvr_hash_blocks(nseed, base[w % NBASE], nb, BS, content);
        for (uint32_t i = 0; i < nb; i++) {
            blk[i].engine_hash = eh++;
            blk[i].content_hash = content[i];
        }
        kvr_index_store(ix, wid, tier, ns, NULL, blk, nb, &res);
    }
    memset(&d, 0, sizeof(d));
    d.conf = &conf;
    d.score = score;
    d.index = ix;
    if (kvr_httpapi_create(&d, &api) != 0 || kvr_httpapi_thread_create(api, &st, &th) != 0)
        return 1;
    kvr_buf_init(&scratch);
    kvr_httpreq_conn_init(&c, &lim, &st, kvr_httpapi_handle, th, &scratch, false, 0);
    for (int m = 0; m < 2; m++)
        for (int b = 0; b < NBASE; b++)
            lens[m][b] = make_request(reqs[m][b], sizeof(reqs[m][b]), b, m);

    /* json, msgpack (best decoder level), msgpack (scalar decoder: the before) */
    for (int mode = 0; mode < 3; mode++) {
        int m = mode ? 1 : 0;
        double best = 1e30;
        if (argc > 2 && strcmp(argv[2], mode == 0 ? "json" : mode == 1 ? "msgpack" : "mp-scalar"))
            continue;
        kvr_reqbody_force_isa(mode == 2 ? 0 : -1);
        for (int round = 0; round < 5; round++) {
            double t0 = now_s(), t;
            for (int i = 0; i < iters; i++) {
                int b = i % NBASE;
                memcpy(work, reqs[m][b], lens[m][b]); /* bodies are decoded in place */
                if (kvr_httpreq_conn_feed(&c, work, lens[m][b], 0) != 0 ||
                    memcmp(c.out.data, "HTTP/1.1 200", 12) != 0) {
                    fprintf(stderr, "bench_httpreq: request failed: %.300s\n", c.out.data);
                    return 1;
                }
                resp_bytes = c.out.len;
                kvr_httpreq_conn_consumed(&c, c.out.len);
            }
            t = now_s() - t0;
            if (t < best)
                best = t;
        }
        printf("%-9s %d tokens: request %6zu B, answer %5zu B: %7.2f us/request "
               "(%.0f requests/s of CPU, one thread; includes a %zu B memcpy)\n",
               mode == 0 ? "json" : mode == 1 ? "msgpack" : "mp-scalar", NTOK, lens[m][0], resp_bytes, best / iters * 1e6,
               iters / best, lens[m][0]);
    }
    kvr_reqbody_force_isa(-1);
    kvr_httpreq_conn_deinit(&c);
    kvr_buf_free(&scratch);
    kvr_httpapi_thread_destroy(th);
    kvr_httpapi_destroy(api);
    kvr_score_destroy(score);
    kvr_index_destroy(ix);
    kvr_conf_free(&conf);
    return 0;
}
