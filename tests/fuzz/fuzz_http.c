/* fuzz_http.c — the HTTP request path without sockets: raw bytes → http-parser, limits,
 * pipelining, routing, auth, JSON/msgpack bodies, scoring against a tiny real index.
 *
 * Input: byte 0 picks the chunking (the request bytes are fed in pieces of 1 + byte0 % 64
 * bytes, or all at once when byte0 >= 192) and byte 1 the listener (main/admin); the rest is
 * the byte stream a client sends. After the feed, a timeout far in the future runs (408 /
 * idle paths). The fixture (index with two pods holding blocks of model "m", block size 4,
 * tokens 1..8; admin_token "tok") is built once. Model "m" also has a tokenizer (the byte-level
 * BPE of fuzz_tok_common.h, written to a temp dir with a tokenizer_config.json holding a small
 * chat template), so "prompt" text and OpenAI chat bodies ("messages", tools, kwargs) are
 * parsed, rendered and tokenized as in the daemon.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "core/conf.h"
#include "index/hash.h"
#include "http/httpapi.h"
#include "http/httpreq.h"
#include "index/index.h"
#include "route/score.h"
#include "text/tokset.h"
#include "fuzz_tok_common.h"

/* The fixture's index keeps its nodes in mmap'ed slabs, which LeakSanitizer does not scan:
 * the holder sets they point to look unreachable, and libFuzzer's leak check (run after an
 * input that allocated more than it freed) reported them as leaks of the first input, so
 * `make fuzz` stopped at once. The fixture is built with leak checking off; what inputs
 * allocate is still checked, and everything is freed at exit (teardown). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUZZ_LSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(FUZZ_LSAN)
#define FUZZ_LSAN 1
#endif
#ifdef FUZZ_LSAN
#include <sanitizer/lsan_interface.h>
#endif

static struct kvr_conf conf;
static struct kvr_index *ix;
static struct kvr_score *score;
static struct kvr_httpapi *api;
static struct kvr_httpapi_thread *th;
static struct kvr_httpstats stats;
static struct kvr_buf scratch;
static struct kvr_tokset *tokset;
static char tokdir[64];
static struct kvr_httpreq_limits lim = {
    .max_body = 64 * 1024,
    .max_header_bytes = 4096,
    .max_headers = 32,
    .request_timeout_ms = 1000,
    .idle_timeout_ms = 5000,
    .session_header = "X-Session-ID",
};
/* the same with a small max_output: pipelined answers pause parsing (data[1] & 2) */
static struct kvr_httpreq_limits lim_pause = {
    .max_body = 64 * 1024,
    .max_header_bytes = 4096,
    .max_headers = 32,
    .request_timeout_ms = 1000,
    .idle_timeout_ms = 5000,
    .max_output = 512,
    .session_header = "X-Session-ID",
};

static void store(const char *pod, uint32_t nblocks)
{
    static const uint32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t wid, ns;
    uint64_t seed, content[2];
    uint8_t tier;
    struct kvr_index_block b[2];
    struct kvr_index_wres res = {0};

    if (kvr_index_worker_intern(ix, pod, 0, &wid) != 0 ||
        kvr_index_ns_intern(ix, "m", NULL, &ns, &seed) != 0 ||
        kvr_index_tier_intern(ix, "GPU", 3, &tier) != 0)
        abort();
    kvr_index_ns_set_block_size(ix, ns, 4);
    kvr_hash_blocks(seed, toks, nblocks, 4, content);
    for (uint32_t i = 0; i < nblocks; i++) {
        b[i].engine_hash = 10 + i;
        b[i].content_hash = content[i];
    }
    if (kvr_index_store(ix, wid, tier, ns, NULL, b, nblocks, &res) != 0)
        abort();
}

/* A chat template with what real ones use: loops, conditions, filters, tools, kwargs,
 * raise_exception, loop variables and the generation prompt. */
static const char tokcfg[] =
    "{\"bos_token\":\"<|im_start|>\",\"eos_token\":{\"content\":\"<|im_end|>\"},"
    "\"chat_template\":\"{%- if tools %}<|im_start|>system\\n{% for t in tools %}"
    "{{ t | tojson }}\\n{% endfor %}<|im_end|>\\n{%- endif %}"
    "{%- for m in messages %}{%- if m.role not in ['system','user','assistant','tool'] %}"
    "{{ raise_exception('bad role ' ~ m.role) }}{%- endif %}"
    "<|im_start|>{{ m.role }}\\n{%- if m.content is string %}{{ m.content | trim }}"
    "{%- else %}{% for c in m.content %}{{ c.text }}{% endfor %}{%- endif %}"
    "{%- if m.tool_calls %}{% for tc in m.tool_calls %}<tool>{{ tc.function.name }}"
    "{{ tc.function.arguments | tojson }}</tool>{% endfor %}{% endif %}"
    "<|im_end|>{{ '\\n' if not loop.last }}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{%- endif %}\"}";

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[128];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    if ((f = fopen(path, "w")) == NULL || fputs(text, f) == EOF || fclose(f) != 0)
        abort();
}

static void remove_tokdir(void)
{
    char path[128];

    snprintf(path, sizeof path, "%s/tokenizer.json", tokdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tokdir);
    unlink(path);
    rmdir(tokdir);
}

static void setup(void)
{
    struct kvr_index_opts o = {0};
    struct kvr_httpapi_deps d;
    struct kvr_err err;
    char conftext[512], *bl;

    snprintf(tokdir, sizeof tokdir, "/tmp/fuzz_http-XXXXXX");
    if (mkdtemp(tokdir) == NULL)
        abort();
    bl = ft_bytelevel_json();
    write_file(tokdir, "tokenizer.json", bl);
    free(bl);
    write_file(tokdir, "tokenizer_config.json", tokcfg);
    snprintf(conftext, sizeof conftext,
             "[events]\nbind = tcp://127.0.0.1:*\n[http]\n"
             "admin_listen = 127.0.0.1:0\nadmin_token = tok\n"
             "max_query_tokens = 4096\n[model \"m\"]\ntokenizer = %s\n", tokdir);
    if (kvr_conf_load_string("fuzz", conftext, &conf, &err) != 0 ||
        kvr_tokset_create(&conf, &tokset, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    o.max_query_blocks = 4096;
    if (kvr_index_create(&o, &ix) != 0 || kvr_score_create(ix, &conf, &score) != 0)
        abort();
    store("pod-a", 2);
    store("pod-b", 1);
    memset(&d, 0, sizeof(d));
    d.conf = &conf;
    d.score = score;
    d.index = ix;
    d.tokset = tokset;
    d.admin_listener = true;
    if (kvr_httpapi_create(&d, &api) != 0 || kvr_httpapi_thread_create(api, &stats, &th) != 0)
        abort();
    kvr_httpapi_set_ready(api, true);
    kvr_buf_init(&scratch);
}

/* The fixture lives for the process; freed at exit so leak checkers see a clean heap (the
 * index keeps compact references a leak scanner cannot follow). */
static void teardown(void)
{
    kvr_httpapi_thread_destroy(th);
    kvr_httpapi_destroy(api);
    kvr_tokset_destroy(tokset);
    remove_tokdir();
    kvr_score_destroy(score);
    kvr_index_destroy(ix);
    kvr_conf_free(&conf);
    kvr_buf_free(&scratch);
}

static int ready;
static int print_out = -1;

static void setup_once(void)
{
    if (ready)
        return;
#ifdef FUZZ_LSAN
    __lsan_disable();
#endif
    setup();
#ifdef FUZZ_LSAN
    __lsan_enable();
#endif
    atexit(teardown);
    ready = 1;
}

/* libFuzzer calls this once before any input (allocations here are not charged to inputs);
 * the gcc replay driver does not, so LLVMFuzzerTestOneInput also sets up lazily. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setup_once();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_httpconn c;
    size_t step, off = 0;
    int rc = 0;

    setup_once();
    if (size < 2)
        return 0;
    step = data[0] >= 192 ? size : (size_t)(1 + data[0] % 64);
    kvr_httpreq_conn_init(&c, (data[1] & 2) ? &lim_pause : &lim, &stats, kvr_httpapi_handle, th,
                          &scratch, data[1] & 1, 0);
    data += 2;
    size -= 2;
    while (off < size && rc == 0) {
        size_t n = size - off < step ? size - off : step;
        char *piece = malloc(n); /* exact size, fresh each time: catches stale pointers */
        if (piece == NULL)
            break;
        memcpy(piece, data + off, n);
        rc = kvr_httpreq_conn_feed(&c, piece, n, (int64_t)off);
        memset(piece, 0xAA, n);
        free(piece);
        off += n;
        if (c.out.len > 1 << 20)
            kvr_httpreq_conn_consumed(&c, c.out.len);
        /* the socket layer: drain out, resume the kept input, until no longer paused */
        while (rc == 0 && c.paused) {
            if (c.out.len == 0 || memcmp(c.out.data, "HTTP/1.1 ", 9) != 0)
                abort(); /* paused means answers wait, and they start like one */
            kvr_httpreq_conn_consumed(&c, c.out.len);
            rc = kvr_httpreq_conn_resume(&c, (int64_t)off);
        }
    }
    if (rc == 0)
        (void)kvr_httpreq_conn_timeout(&c, 1000000);
    /* every response must at least start like one */
    if (c.out.len > 0 && memcmp(c.out.data, "HTTP/1.1 ", 9) != 0)
        abort();
    if (print_out < 0) /* FUZZ_HTTP_PRINT=1: the answers to stderr (writing seeds) */
        print_out = getenv("FUZZ_HTTP_PRINT") != NULL;
    if (print_out)
        fprintf(stderr, "%.*s\n", (int)c.out.len, c.out.data);
    kvr_httpreq_conn_deinit(&c);
    return 0;
}
