/* fuzz_jtok.c — the JSON token-array parser and the request-body decoders.
 *
 * Input: first byte selects the target, the rest is the body.
 *   0: kvr_jtok_u32_array on the body (every integer path: portable, SSE2, AVX2, AVX-512 —
 *      chosen by the second byte, capped at what the CPU has), cross-checked against a scalar
 *      reference parser
 *   1: score query JSON     3: endpoint JSON
 *   2: score query msgpack at the level the second byte picks (0 scalar, 1 AVX-512 windows,
 *      capped at what the CPU has), cross-checked against the scalar level on a second copy
 *   4: kvr_jtok_skip on the body (generic value validation)
 *   5: route query JSON (the score query + candidates, policy, track)
 * Bodies are copied into exact-size heap buffers so ASan sees any over-read; decoders run in
 * place (they write into the copy). Accepted queries are checked for the NUL contract
 * (reqbody.h): the prompt is terminated right at prompt_len (it may hold NULs before), and
 * the names used as C strings hold none.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/jtok.h"
#include "http/reqbody.h"

#define MAXTOK 4096

static uint32_t toks[MAXTOK], ref[MAXTOK];
static const char *pods[16], *rpods[16];

/* Scalar reference: same grammar, no cleverness. 0 ok, -1 invalid, -2 too many. */
static int ref_parse(const char *s, size_t len, uint32_t *out, size_t cap, size_t *n)
{
    size_t i = 0, cnt = 0;
#define WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')
    while (i < len && WS(s[i]))
        i++;
    if (i >= len || s[i] != '[')
        return -1;
    i++;
    while (i < len && WS(s[i]))
        i++;
    if (i < len && s[i] == ']') {
        *n = 0;
        return 0;
    }
    for (;;) {
        uint64_t v = 0;
        size_t st;
        while (i < len && WS(s[i]))
            i++;
        st = i;
        if (i >= len || s[i] < '0' || s[i] > '9')
            return -1;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (uint64_t)(s[i] - '0');
            if (v > UINT32_MAX)
                return -1;
            i++;
        }
        if (s[st] == '0' && i - st > 1)
            return -1;
        if (cnt >= cap)
            return -2;
        out[cnt++] = (uint32_t)v;
        while (i < len && WS(s[i]))
            i++;
        if (i < len && s[i] == ',') {
            i++;
            continue;
        }
        if (i < len && s[i] == ']')
            break;
        return -1;
    }
#undef WS
    *n = cnt;
    return 0;
}

/* reqbody.h's NUL contract on an accepted query. */
static bool nul_ok(const struct kvr_reqbody_query *q)
{
    if (q->prompt != NULL && q->prompt[q->prompt_len] != '\0')
        return false;
    for (size_t i = 0; i < q->nmedia; i++)
        if (memchr(q->media[i].id, 0, q->media[i].id_len) != NULL)
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kvr_hash_media media[4], rmedia[4];
    struct kvr_reqbody_scratch sc = {toks, MAXTOK, pods, 16, media, 4};
    struct kvr_reqbody_query q;
    struct kvr_reqbody_endpoint ep;
    struct kvr_jtok j;
    struct kvr_err err;
    size_t len, n = 0, rn = 0;
    char *buf;
    int rc, rr;

    if (size < 2)
        return 0;
    len = size - 2;
    buf = malloc(len ? len : 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, data + 2, len);
    switch (data[0] % 6) {
    case 0:
        kvr_jtok_force_isa(data[1] % 4);
        kvr_jtok_init(&j, buf, len);
        rc = kvr_jtok_u32_array(&j, toks, MAXTOK, &n);
        rr = ref_parse(buf, len, ref, MAXTOK, &rn);
        /* the reference accepts trailing bytes after ']'; compare on the array itself */
        if ((rc == 0) != (rr == 0) || (rc == -E2BIG) != (rr == -2) ||
            (rc == 0 && (n != rn || memcmp(toks, ref, n * sizeof(uint32_t)) != 0))) {
            fprintf(stderr, "jtok rc %d n %zu vs reference %d n %zu\n", rc, n, rr, rn);
            abort();
        }
        kvr_jtok_force_isa(-1);
        break;
    case 1:
        rc = kvr_reqbody_query_json(buf, len, &sc, &q, &err);
        if (rc == 0 && (q.model == NULL || q.ntokens > MAXTOK || q.nmedia > 4 || !nul_ok(&q)))
            abort();
        for (size_t i = 0; rc == 0 && i < q.nmedia; i++) /* sorted, not overlapping */
            if (q.media[i].id_len == 0 || q.media[i].length == 0 ||
                (i > 0 && q.media[i].offset < q.media[i - 1].offset + q.media[i - 1].length))
                abort();
        break;
    case 2: {
        /* the level data[1] picks against the scalar path, each on its own copy */
        struct kvr_reqbody_scratch rs = {ref, MAXTOK, rpods, 16, rmedia, 4};
        struct kvr_reqbody_query rq;
        struct kvr_err rerr;
        char *rbuf = malloc(len ? len : 1);
        if (rbuf == NULL)
            break;
        memcpy(rbuf, data + 2, len);
        kvr_reqbody_force_isa(data[1] % 2);
        rc = kvr_reqbody_query_msgpack(buf, len, &sc, &q, &err);
        kvr_reqbody_force_isa(0);
        rr = kvr_reqbody_query_msgpack(rbuf, len, &rs, &rq, &rerr);
        kvr_reqbody_force_isa(-1);
        if (rc != rr || (rc != 0 && strcmp(err.msg, rerr.msg) != 0) ||
            (rc == 0 && (q.model == NULL || q.ntokens > MAXTOK || q.ntokens != rq.ntokens ||
                         memcmp(toks, ref, q.ntokens * sizeof(uint32_t)) != 0 || !nul_ok(&q) ||
                         q.prompt_len != rq.prompt_len ||
                         (q.prompt_len && memcmp(q.prompt, rq.prompt, q.prompt_len) != 0)))) {
            fprintf(stderr, "msgpack rc %d vs scalar %d\n", rc, rr);
            abort();
        }
        free(rbuf);
        break;
    }
    case 3:
        (void)kvr_reqbody_endpoint_json(buf, len, &ep, &err);
        break;
    case 5: {
        static struct kvr_reqbody_cand cands[8];
        struct kvr_reqbody_route rt;
        rc = kvr_reqbody_query_ext(buf, len, &sc, &q, NULL, NULL, cands, 8, &rt, &err);
        if (rc == 0 && (q.model == NULL || rt.ncands > 8 || !nul_ok(&q)))
            abort();
        for (size_t i = 0; rc == 0 && i < rt.ncands; i++)
            if (cands[i].pod == NULL || cands[i].pod[0] == '\0')
                abort();
        break;
    }
    default:
        kvr_jtok_init(&j, buf, len);
        if (kvr_jtok_skip(&j) == 0)
            (void)kvr_jtok_finish(&j);
        break;
    }
    free(buf);
    return 0;
}
