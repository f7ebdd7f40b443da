/* test_conf.c — configuration parser: good and bad files with their exact error lines,
 * defaults, units, comments, repeatable keys, cross-checks, reload and the shared parsers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/conf.h"
#include "core/log.h"

#define EV "[events]\nbind = tcp://*:5557\n" /* minimal event source (2 lines) */

struct bad_case {
    const char *text;
    const char *error; /* exact err.msg */
};

static const struct bad_case bad_cases[] = {
    /* unknown key / section */
    {EV "[log]\nfoo = 1\n", "t.conf:4: unknown key 'foo' in section [log]"},
    {EV "[bar]\n", "t.conf:3: unknown section [bar] (expected one of [log], [events], [index], "
                   "[http], [score], [route], [load], [tokenizer], [state], [daemon], "
                   "[model \"NAME\"])"},
    {"[ log ]\nlevel = info\n", "t.conf:1: unknown section [ log ] (expected one of [log], "
                                "[events], [index], [http], [score], [route], [load], [tokenizer], [state], "
                                "[daemon], [model \"NAME\"])"},
    {"level = info\n" EV, "t.conf:1: key 'level' outside of any section"},
    {EV "[events]\nbind.x = 1\n", "t.conf:4: unknown key 'bind.x' in section [events]"},
    /* syntax */
    {EV "[log]\nlevel\n", "t.conf:4: syntax error: expected 'key = value' or '[section]', got "
                          "'level'"},
    {"[log\n" EV, "t.conf:1: missing ']' in section header"},
    {"[log] extra\n" EV, "t.conf:1: unexpected text after section header: 'extra'"},
    {"[log]\n= info\n" EV, "t.conf:2: unknown key '' in section [log]"},
    /* sizes */
    {EV "max_message_size = 64XB\n", "t.conf:3: invalid value '64XB' for [events] "
                                     "max_message_size: expected a size (e.g. 512B, 64KiB, "
                                     "16MiB, 1GiB; bare number = bytes)"},
    {EV "max_message_size = 1.5MiB\n", "t.conf:3: invalid value '1.5MiB' for [events] "
                                       "max_message_size: expected a size (e.g. 512B, 64KiB, "
                                       "16MiB, 1GiB; bare number = bytes)"},
    {EV "max_message_size = 2GiB\n",
     "t.conf:3: [events] max_message_size = 2GiB is out of range (1KiB..1GiB)"},
    {EV "max_message_size = 1023\n",
     "t.conf:3: [events] max_message_size = 1023 is out of range (1KiB..1GiB)"},
    {"[http]\nmax_header_bytes = 99999999999999999999GiB\n" EV,
     "t.conf:2: [http] max_header_bytes = 99999999999999999999GiB is out of range (1KiB..1MiB)"},
    {EV "[index]\nmax_memory = 2048GiB\n",
     "t.conf:4: [index] max_memory = 2048GiB is out of range (0B..1024GiB)"},
    {EV "[index]\nmax_memory = -1\n",
     "t.conf:4: invalid value '-1' for [index] max_memory: expected a size (e.g. 512B, 64KiB, "
     "16MiB, 1GiB; bare number = bytes)"},
    /* durations */
    {EV "replay_timeout = 11m\n", "t.conf:3: [events] replay_timeout = 11m is out of range "
                                  "(1ms..10m)"},
    {EV "replay_timeout = 0\n", "t.conf:3: [events] replay_timeout = 0 is out of range "
                                "(1ms..10m)"},
    {EV "replay_timeout = 2 s\n", "t.conf:3: invalid value '2 s' for [events] replay_timeout: "
                                  "expected a duration (e.g. 500ms, 10s, 5m, 1h; bare number = "
                                  "ms)"},
    {EV "replay_timeout = -1s\n", "t.conf:3: invalid value '-1s' for [events] replay_timeout: "
                                  "expected a duration (e.g. 500ms, 10s, 5m, 1h; bare number = "
                                  "ms)"},
    {"[daemon]\nshutdown_timeout = 2h\n" EV,
     "t.conf:2: [daemon] shutdown_timeout = 2h is out of range (0ms..1h)"},
    /* integers */
    {EV "writer_threads = 0\n", "t.conf:3: [events] writer_threads = 0 is out of range (1..64)"},
    {EV "writer_threads = 65\n", "t.conf:3: [events] writer_threads = 65 is out of range (1..64)"},
    {EV "writer_threads = two\n", "t.conf:3: invalid value 'two' for [events] writer_threads: "
                                  "expected a non-negative integer"},
    {EV "writer_threads = 4x\n", "t.conf:3: invalid value '4x' for [events] writer_threads: "
                                 "expected a non-negative integer"},
    {EV "queue_depth = 99999999999999999999999\n", "t.conf:3: [events] queue_depth = "
                                                   "99999999999999999999999 is out of range "
                                                   "(1..1048576)"},
    {"[index]\njump_stride = 4097\n" EV,
     "t.conf:2: [index] jump_stride = 4097 is out of range (1..4096)"},
    /* duplicates */
    {EV "[log]\nlevel = info\n\nlevel = debug\n",
     "t.conf:6: duplicate key 'level' in section [log] (first set on line 4)"},
    {EV "[log]\nlevel = info\n[log]\nlevel = info\n",
     "t.conf:6: duplicate key 'level' in section [log] (first set on line 4)"},
    {EV "[score]\nweight.gpu = 1\nweight.GPU = 2\n",
     "t.conf:5: duplicate key 'weight.GPU' in section [score] (first set on line 4)"},
    /* enums */
    {"[log]\nlevel = loud\n" EV, "t.conf:2: invalid value 'loud' for [log] level: expected "
                                 "error, warn, info or debug"},
    {"[log]\nformat = xml\n" EV, "t.conf:2: invalid value 'xml' for [log] format: expected text "
                                 "or json"},
    /* empty values */
    {EV "[http]\nlisten =\n", "t.conf:4: empty value for [http] listen"},
    {EV "[log]\nlevel = # only a comment\n", "t.conf:4: empty value for [log] level"},
    {"[events]\nbind =\n", "t.conf:2: empty value for [events] bind"},
    /* endpoints */
    {"[events]\nbind = udp://x:1\n", "t.conf:2: invalid endpoint 'udp://x:1' for [events] bind: "
                                     "expected tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or "
                                     "inproc://NAME"},
    {"[events]\nbind = tcp://host\n", "t.conf:2: invalid endpoint 'tcp://host' for [events] "
                                      "bind: expected tcp://HOST:PORT, tcp://*:PORT, ipc://PATH "
                                      "or inproc://NAME"},
    {"[events]\nbind = tcp://*:65536\n", "t.conf:2: invalid endpoint 'tcp://*:65536' for "
                                         "[events] bind: expected tcp://HOST:PORT, "
                                         "tcp://*:PORT, ipc://PATH or inproc://NAME"},
    {"[events]\nbind = tcp://::1:5557\n", "t.conf:2: invalid endpoint 'tcp://::1:5557' for "
                                          "[events] bind: expected tcp://HOST:PORT, "
                                          "tcp://*:PORT, ipc://PATH or inproc://NAME"},
    {"[events]\nbind = ipc://\n", "t.conf:2: invalid endpoint 'ipc://' for [events] bind: "
                                  "expected tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or "
                                  "inproc://NAME"},
    {"[events]\nconnect = tcp://*:5557\n", "t.conf:2: invalid endpoint 'tcp://*:5557' for "
                                           "[events] connect: expected tcp://HOST:PORT, "
                                           "ipc://PATH or inproc://NAME"},
    {"[events]\nconnect = tcp://h:0\n", "t.conf:2: invalid endpoint 'tcp://h:0' for [events] "
                                        "connect: expected tcp://HOST:PORT, ipc://PATH or "
                                        "inproc://NAME"},
    /* connect options */
    {"[events]\nconnect = tcp://h:1 foo=bar\n", "t.conf:2: invalid option 'foo=bar' for "
                                                "[events] connect: expected replay=ENDPOINT or "
                                                "pod=ID (each at most once)"},
    {"[events]\nconnect = tcp://h:1 pod=a pod=b\n", "t.conf:2: invalid option 'pod=b' for "
                                                    "[events] connect: expected "
                                                    "replay=ENDPOINT or pod=ID (each at most "
                                                    "once)"},
    {"[events]\nconnect = tcp://h:1 replay=h:2\n", "t.conf:2: invalid replay endpoint 'h:2' "
                                                   "for [events] connect: expected "
                                                   "tcp://HOST:PORT, ipc://PATH, "
                                                   "inproc://NAME or a template such as "
                                                   "tcp://{pod}:{5558+rank}"},
    {"[events]\nconnect = tcp://h:1 pod=\n", "t.conf:2: invalid pod id '' for [events] "
                                             "connect: expected 1..255 printable characters"},
    {"[events]\nconnect = tcp://h:1 replay=http://{pod}:1\n",
     "t.conf:2: invalid replay endpoint 'http://{pod}:1' for [events] connect: expected "
     "tcp://HOST:PORT, ipc://PATH, inproc://NAME or a template such as "
     "tcp://{pod}:{5558+rank}"},
    /* bind_replay, forward */
    {"[events]\nconnect = tcp://h:1\nbind_replay = tcp://{pod}:{5558+rank}\n",
     "t.conf:3: [events] bind_replay names the replay address of engines that connect to a "
     "bind socket, and there is no [events] bind"},
    {EV "bind_replay =\n", "t.conf:3: empty value for [events] bind_replay"},
    {EV "forward = tcp://*:5557\n",
     "t.conf:3: [events] forward tcp://*:5557 is also an [events] bind endpoint"},
    {EV "forward = 5559\n", "t.conf:3: invalid endpoint '5559' for [events] forward: expected "
                           "tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or inproc://NAME"},
    /* models: glob patterns checked, at the directive's line */
    {EV "models = Qwen/* org/m[0-9\n",
     "t.conf:3: [events] models: pattern 'org/m[0-9': '[' set without its ']' (a literal '[' is "
     "written '\\[')"},
    {EV "models = a\\\n", "t.conf:3: [events] models: pattern 'a\\' ends with '\\'"},
    /* host:port */
    {EV "[http]\nlisten = localhost:8080\n", "t.conf:4: invalid value 'localhost:8080' for "
                                             "[http] listen: expected IP:PORT or [IPv6]:PORT "
                                             "with a numeric address and port 0..65535 (e.g. "
                                             "127.0.0.1:8080)"},
    {EV "[http]\nlisten = 127.0.0.1\n", "t.conf:4: invalid value '127.0.0.1' for [http] listen: "
                                        "expected IP:PORT or [IPv6]:PORT with a numeric address "
                                        "and port 0..65535 (e.g. 127.0.0.1:8080)"},
    {EV "[http]\nadmin_listen = 127.0.0.1:65536\n", "t.conf:4: invalid value '127.0.0.1:65536' "
                                                    "for [http] admin_listen: expected IP:PORT "
                                                    "or [IPv6]:PORT with a numeric address and "
                                                    "port 0..65535 (e.g. 127.0.0.1:8080)"},
    {EV "[http]\nlisten = [::1]8080\n", "t.conf:4: invalid value '[::1]8080' for [http] listen: "
                                        "expected IP:PORT or [IPv6]:PORT with a numeric address "
                                        "and port 0..65535 (e.g. 127.0.0.1:8080)"},
    {EV "[http]\nlisten = *:8080\n", "t.conf:4: invalid value '*:8080' for [http] listen: "
                                     "expected IP:PORT or [IPv6]:PORT with a numeric address and "
                                     "port 0..65535 (e.g. 127.0.0.1:8080)"},
    /* on/off */
    {EV "[http]\npublic_introspection = maybe\n", "t.conf:4: invalid value 'maybe' for [http] "
                                                  "public_introspection: expected on or off (also "
                                                  "true/false, yes/no, 1/0)"},
    {EV "[http]\nmax_output_bytes = 1KiB\n", "t.conf:4: [http] max_output_bytes = 1KiB is out "
                                             "of range (64KiB..1GiB)"},
    /* strings */
    {EV "[http]\nadmin_token = "
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aa\n",
     "t.conf:4: line too long (at most 198 characters)"},
    /* [route] replicas and sessions */
    {EV "[route]\npeers = tcp://a:1, http://b:2\n",
     "t.conf:4: [route] peers: http://b:2 is not an endpoint (tcp://HOST:PORT, ipc://PATH)"},
    {EV "[route]\npeer_bind = tcp://*\n",
     "t.conf:4: [route] peer_bind = tcp://*: not a bind endpoint (tcp://HOST:PORT, ipc://PATH)"},
    {EV "[route]\nsession_header = X Session\n",
     "t.conf:4: [route] session_header = X Session: not an HTTP header name (letters, digits "
     "and !#$%&'*+-.^_`|~ only)"},
    /* [model "NAME"] sections */
    {EV "[model Qwen]\ntokenizer = x\n", "t.conf:3: expected [model \"NAME\"] (the model as "
                                         "engines name it in their topic, in double quotes)"},
    {EV "[model \"Qwen]\n", "t.conf:3: missing closing '\"' in [model \"NAME\"]"},
    {EV "[model \"\"]\n", "t.conf:3: empty model name in [model \"\"]"},
    {EV "[model \"a\" b]\n", "t.conf:3: unexpected text after the model name in [model \"NAME\"]"},
    {EV "[model \"a\"]\ntokenizer = x\n[model \"a\"]\n",
     "t.conf:5: [model \"a\"] is given twice (first on line 3)"},
    {EV "[model \"a\"]\ntokenizer = x\ntokenizer = y\n",
     "t.conf:5: duplicate key 'tokenizer' in [model \"a\"] (first set on line 4)"},
    {EV "[model \"a\"]\ntokeniser = x\n",
     "t.conf:4: unknown key 'tokeniser' in section [model \"a\"] (expected tokenizer, "
     "chat_template, approximate, approximate_pods, prefill_pods, decode_pods or block_size)"},
    {EV "[model \"a\"]\napproximate = maybe\n",
     "t.conf:4: [model \"a\"] approximate: expected on or off (also true/false, yes/no, 1/0)"},
    {EV "[model \"a\"]\napproximate = on\napproximate = off\n",
     "t.conf:5: duplicate key 'approximate' in [model \"a\"] (first set on line 4)"},
    {EV "[model \"a\"]\napproximate_pods = p1, p2 p1\n",
     "t.conf:4: [model \"a\"] approximate_pods: pod 'p1' is listed twice"},
    {EV "[model \"a\"]\napproximate_pods = ,\n",
     "t.conf:4: [model \"a\"] approximate_pods: expected pod names separated by commas"},
    {EV "[model \"a\"]\nblock_size = 0\n",
     "t.conf:4: [model \"a\"] block_size: expected a number of tokens (1..65536)"},
    {EV "[model \"a\"]\nblock_size = 16x\n",
     "t.conf:4: [model \"a\"] block_size: expected a number of tokens (1..65536)"},
    {EV "[route]\nassumed_ttl = 10ms\n",
     "t.conf:4: [route] assumed_ttl = 10ms is out of range (1s..168h)"},
    {EV "[tokenizer]\nmax_prompt_bytes = 10\n",
     "t.conf:4: [tokenizer] max_prompt_bytes = 10 is out of range (1KiB..1GiB)"},
    {EV "[tokenizer]\nthreads = 65\n",
     "t.conf:4: [tokenizer] threads = 65 is out of range (0..64)"},
    {EV "[tokenizer]\nthreads = -1\n", "t.conf:4: invalid value '-1' for [tokenizer] threads: "
                                         "expected a non-negative integer"},
    {EV "[tokenizer]\nqueue = 0\n", "t.conf:4: [tokenizer] queue = 0 is out of range (1..65536)"},
    {EV "[tokenizer]\noffload_bytes = 2GiB\n",
     "t.conf:4: [tokenizer] offload_bytes = 2GiB is out of range (0B..1GiB)"},
    /* weights */
    {EV "[score]\nweight.gpu = abc\n", "t.conf:4: invalid value 'abc' for [score] weight.*: "
                                       "expected a number (e.g. 0.8)"},
    {EV "[score]\nweight.gpu = nan\n", "t.conf:4: invalid value 'nan' for [score] weight.*: "
                                       "expected a number (e.g. 0.8)"},
    {EV "[score]\nweight.gpu = -1\n", "t.conf:4: [score] weight.gpu = -1 is out of range "
                                      "(0..1000)"},
    {EV "[score]\nweight. = 1\n", "t.conf:4: invalid tier name '' in [score] weight.: expected "
                                  "1..31 characters of [a-z0-9_-]"},
    {EV "[score]\nweight.g/pu = 1\n", "t.conf:4: invalid tier name 'g/pu' in [score] "
                                      "weight.g/pu: expected 1..31 characters of [a-z0-9_-]"},
    {EV "[score]\nweight.t1 = 1\nweight.t2 = 1\nweight.t3 = 1\nweight.t4 = 1\nweight.t5 = 1\n"
        "weight.t6 = 1\nweight.t7 = 1\nweight.t8 = 1\nweight.t9 = 1\nweight.t10 = 1\n",
     "t.conf:13: too many tiers in [score]: at most 16 weight.<tier> entries (including the "
     "defaults gpu, cpu, storage, remote, external, assumed, predicted)"},
    {EV "[score]\ndefault_weight = inf\n", "t.conf:4: invalid value 'inf' for [score] "
                                           "default_weight: expected a number (e.g. 0.5)"},
    {EV "[score]\ndefault_weight = 1001\n", "t.conf:4: [score] default_weight = 1001 is out of "
                                            "range (0..1000)"},
    /* cross-checks */
    {EV "[http]\nlisten = 127.0.0.1:9000\nadmin_listen = 0.0.0.0:9000\n",
     "t.conf:5: [http] admin_listen 0.0.0.0:9000 conflicts with listen 127.0.0.1:9000: use "
     "another port"},
    {EV "[http]\nadmin_listen = 0.0.0.0:8080\n",
     "t.conf:4: [http] admin_listen 0.0.0.0:8080 conflicts with listen 0.0.0.0:8080: use "
     "another port"},
    {EV "reconnect_interval = 10s\nreconnect_interval_max = 1s\n",
     "t.conf:4: [events] reconnect_interval_max (1000ms) is below reconnect_interval (10000ms); "
     "use 0 to disable the backoff"},
    {"[events]\nbind = tcp://*:1\nbind = tcp://*:1\n",
     "t.conf:3: [events] bind tcp://*:1 is given twice"},
    {"[events]\nconnect = tcp://a:1\nconnect = tcp://a:1 pod=x\n",
     "t.conf:3: [events] connect tcp://a:1 is given twice"},
    {"[log]\nlevel = info\n", "t.conf:2: no event source: set [events] bind (engines connect to "
                              "us) and/or [events] connect (we dial engines)"},
    {"", "t.conf:1: no event source: set [events] bind (engines connect to us) and/or [events] "
         "connect (we dial engines)"},
};

static void test_bad_configs(void **state)
{
    int failures = 0;
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        struct kvr_conf c;
        struct kvr_err err = {{0}};
        int rc = kvr_conf_load_string("t.conf", bad_cases[i].text, &c, &err);
        if (rc != -EINVAL || strcmp(err.msg, bad_cases[i].error) != 0) {
            print_error("case %zu: rc=%d\n  text: %s\n  want: %s\n  got:  %s\n", i, rc,
                        bad_cases[i].text, bad_cases[i].error, err.msg);
            failures++;
        }
        /* c was freed on failure: freeing again must be harmless. */
        kvr_conf_free(&c);
    }
    assert_int_equal(failures, 0);
}

static void load_ok(const char *text, struct kvr_conf *c)
{
    struct kvr_err err = {{0}};
    int rc = kvr_conf_load_string("t.conf", text, c, &err);
    if (rc != 0) {
        print_error("unexpected error %d: %s\n", rc, err.msg);
        fail();
    }
}

static void test_defaults(void **state)
{
    struct kvr_conf c;
    (void)state;
    load_ok(EV, &c);
    assert_string_equal(c.path, "t.conf");
    assert_int_equal(c.log_level, KVR_LOG_INFO);
    assert_int_equal(c.log_format, KVR_LOG_TEXT);
    assert_int_equal(c.log_ratelimit_ms, 10000);
    assert_int_equal(c.log_ratelimit_burst, 10);
    assert_int_equal(c.nbind, 1);
    assert_string_equal(c.bind[0], "tcp://*:5557");
    assert_int_equal(c.nconnect, 0);
    assert_string_equal(c.subscribe, "kv@");
    assert_int_equal(c.writer_threads, 2);
    assert_int_equal(c.queue_depth, 4096);
    assert_int_equal(c.rcvhwm, 100000);
    assert_int_equal(c.max_message_size, 64 << 20);
    assert_int_equal(c.reconnect_interval_ms, 100);
    assert_int_equal(c.reconnect_interval_max_ms, 5000);
    assert_int_equal(c.purge_after_disconnect_ms, 60000);
    assert_int_equal(c.replay_timeout_ms, 2000);
    assert_int_equal(c.max_concurrent_replays, 4);
    assert_int_equal(c.max_events_per_batch, 65536);
    assert_int_equal(c.max_tokens_per_event, 1048576);
    assert_int_equal(c.jump_stride, 32);
    assert_int_equal(c.max_workers, 16384);
    assert_int_equal(c.orphan_capacity, 65536);
    assert_int_equal(c.max_memory, 0);
    assert_string_equal(c.listen, "0.0.0.0:8080");
    assert_null(c.admin_listen);
    assert_null(c.admin_token);
    assert_int_equal(c.http_threads, 1);
    assert_int_equal(c.max_body_bytes, 8 << 20);
    assert_int_equal(c.max_header_bytes, 16 << 10);
    assert_int_equal(c.max_headers, 64);
    assert_int_equal(c.request_timeout_ms, 10000);
    assert_int_equal(c.idle_timeout_ms, 60000);
    assert_int_equal(c.max_connections, 10000);
    assert_int_equal(c.max_query_tokens, 262144);
    assert_int_equal(c.max_output_bytes, 4 << 20);
    assert_int_equal(c.probe_connections, 16);
    assert_false(c.public_introspection);
    assert_false(c.access_log);
    assert_int_equal(c.nweights, 7);
    assert_true(kvr_conf_tier_weight(&c, "gpu") == 1.0);
    assert_true(kvr_conf_tier_weight(&c, "remote") == 0.6);
    assert_true(kvr_conf_tier_weight(&c, "external") == 0.4);
    assert_true(kvr_conf_tier_weight(&c, "CPU") == 0.8);
    assert_true(kvr_conf_tier_weight(&c, "storage") == 0.5);
    assert_true(kvr_conf_tier_weight(&c, "disk") == 0.5);
    assert_true(c.default_weight == 0.5);
    assert_int_equal(c.shutdown_timeout_ms, 5000);
    kvr_conf_free(&c);
}

static void test_values_units_comments(void **state)
{
    struct kvr_conf c;
    (void)state;
    load_ok("\xEF\xBB\xBF# full-line comment\n"
            "; another\n"
            "[log]   # section comment\n"
            "  level = debug # trailing comment\n"
            "\tformat = JSON ; trailing semicolon comment\n"
            "ratelimit_interval = 1500\n"
            "[events]\n"
            "bind = tcp://*:5557\n"
            "bind = tcp://127.0.0.1:*\n"
            "bind = tcp://[::1]:0\n"
            "bind = ipc:///run/kvr.sock\n"
            "connect = tcp://10.0.0.7:5557   replay=tcp://10.0.0.7:5558  pod=pod-a\n"
            "connect = inproc://x\n"
            "subscribe =\n",
            &c);
    assert_int_equal(c.log_level, KVR_LOG_DEBUG);
    assert_int_equal(c.log_format, KVR_LOG_JSON);
    assert_int_equal(c.log_ratelimit_ms, 1500);
    assert_int_equal(c.nbind, 4);
    assert_string_equal(c.bind[1], "tcp://127.0.0.1:*");
    assert_string_equal(c.bind[2], "tcp://[::1]:0");
    assert_string_equal(c.bind[3], "ipc:///run/kvr.sock");
    assert_int_equal(c.nconnect, 2);
    assert_string_equal(c.connect[0].endpoint, "tcp://10.0.0.7:5557");
    assert_string_equal(c.connect[0].replay, "tcp://10.0.0.7:5558");
    assert_string_equal(c.connect[0].pod, "pod-a");
    assert_string_equal(c.connect[1].endpoint, "inproc://x");
    assert_null(c.connect[1].replay);
    assert_null(c.connect[1].pod);
    assert_string_equal(c.subscribe, "");
    kvr_conf_free(&c);
}

static void test_values_units(void **state)
{
    struct kvr_conf c;
    (void)state;
    load_ok(EV "max_message_size = 2KiB\nrcvhwm = 0\nreconnect_interval_max = 0\n"
               "purge_after_disconnect = 5m\nreplay_timeout = 10m\n"
               "[http]\nlisten = [::]:0\nadmin_listen = 127.0.0.1:0\n"
               "admin_token = s3cr#t;x # comment\nmax_body_bytes = 16MiB\n"
               "max_header_bytes = 64k\nmax_headers=8\nidle_timeout = 2m\n"
               "request_timeout = 250ms\n"
               "[score]\nweight.GPU = 2\nweight.nvme_1 = 0.3\ndefault_weight = 0.1\n"
               "[daemon]\nshutdown_timeout = 0\n",
            &c);
    assert_int_equal(c.max_message_size, 2048);
    assert_int_equal(c.rcvhwm, 0);
    assert_int_equal(c.reconnect_interval_max_ms, 0);
    assert_int_equal(c.purge_after_disconnect_ms, 300000);
    assert_int_equal(c.replay_timeout_ms, 600000);
    assert_string_equal(c.listen, "[::]:0");
    assert_string_equal(c.admin_listen, "127.0.0.1:0");
    assert_string_equal(c.admin_token, "s3cr#t;x");
    assert_int_equal(c.max_body_bytes, 16 << 20);
    assert_int_equal(c.max_header_bytes, 64 << 10);
    assert_int_equal(c.max_headers, 8);
    assert_int_equal(c.idle_timeout_ms, 120000);
    assert_int_equal(c.request_timeout_ms, 250);
    assert_int_equal(c.nweights, 8);
    assert_true(kvr_conf_tier_weight(&c, "gpu") == 2.0);
    assert_true(kvr_conf_tier_weight(&c, "NVME_1") == 0.3);
    assert_true(kvr_conf_tier_weight(&c, "cpu") == 0.8);
    assert_true(kvr_conf_tier_weight(&c, "other") == 0.1);
    assert_int_equal(c.shutdown_timeout_ms, 0);
    kvr_conf_free(&c);
}

/* [events] admission: allow (repeatable ranges), pod_must_match_peer, the CURVE key files. */
static void test_admission_directives(void **state)
{
    static const struct {
        const char *text, *error;
    } bad[] = {
        {EV "allow = 10.1.0.0/8\n", "t.conf:3: invalid value '10.1.0.0/8' for [events] allow: "
                                    "expected an IPv4 or IPv6 address or range with its host bits "
                                    "clear (e.g. 10.0.0.0/8, 127.0.0.1, ::1/128, fd00::/8)"},
        {EV "allow = localhost\n", "t.conf:3: invalid value 'localhost' for [events] allow: "
                                   "expected an IPv4 or IPv6 address or range with its host bits "
                                   "clear (e.g. 10.0.0.0/8, 127.0.0.1, ::1/128, fd00::/8)"},
        {EV "allow = 10.0.0.0/33\n", "t.conf:3: invalid value '10.0.0.0/33' for [events] allow: "
                                     "expected an IPv4 or IPv6 address or range with its host "
                                     "bits clear (e.g. 10.0.0.0/8, 127.0.0.1, ::1/128, fd00::/8)"},
        {EV "pod_must_match_peer = maybe\n", "t.conf:3: invalid value 'maybe' for [events] "
                                             "pod_must_match_peer: expected on or off (also "
                                             "true/false, yes/no, 1/0)"},
        {EV "pod_must_match_peer = on\npod_must_match_peer = off\n",
         "t.conf:4: duplicate key 'pod_must_match_peer' in section [events] (first set on line 3)"},
        {EV "curve_secret_key_file = /k/s\n", "t.conf:3: [events] curve_secret_key_file and "
                                              "curve_public_key_file go together: set both "
                                              "(CURVE on bind sockets) or neither"},
        {EV "curve_public_key_file = /k/p\n", "t.conf:3: [events] curve_secret_key_file and "
                                              "curve_public_key_file go together: set both "
                                              "(CURVE on bind sockets) or neither"},
        {EV "curve_authorized_keys_file = /k/a\n", "t.conf:3: [events] "
                                                   "curve_authorized_keys_file needs "
                                                   "curve_secret_key_file and "
                                                   "curve_public_key_file"},
    };
    struct kvr_conf c, d;
    struct kvr_err changed, ignored;
    uint8_t a[16];
    int failures = 0;
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct kvr_err err = {{0}};
        int rc = kvr_conf_load_string("t.conf", bad[i].text, &c, &err);
        if (rc != -EINVAL || strcmp(err.msg, bad[i].error) != 0) {
            print_error("case %zu: rc=%d\n  want: %s\n  got:  %s\n", i, rc, bad[i].error,
                        err.msg);
            failures++;
        }
        kvr_conf_free(&c);
    }
    assert_int_equal(failures, 0);

    /* Defaults: no allowlist (everyone, as before), no pod check, no CURVE. */
    load_ok(EV, &c);
    assert_int_equal(c.nallow, 0);
    assert_false(c.pod_must_match_peer);
    assert_null(c.curve_secret_key_file);
    assert_null(c.curve_authorized_keys_file);
    assert_int_equal(c.nbind, 1);
    assert_int_equal(c.bind_line[0], 2);
    kvr_conf_free(&c);

    load_ok(EV "allow = 127.0.0.0/8\nallow = ::1/128\nallow = 10.0.0.0/8\n"
               "pod_must_match_peer = yes\ncurve_secret_key_file = /k/s\n"
               "curve_public_key_file = /k/p\ncurve_authorized_keys_file = /k/a\n",
            &c);
    assert_int_equal(c.nallow, 3);
    assert_int_equal(kvr_cidr_addr("127.1.2.3", 9, a), 0);
    assert_true(kvr_cidr_match(&c.allow[0], a));
    assert_false(kvr_cidr_match(&c.allow[2], a));
    assert_true(c.pod_must_match_peer);
    assert_string_equal(c.curve_secret_key_file, "/k/s");
    assert_string_equal(c.curve_public_key_file, "/k/p");
    assert_string_equal(c.curve_authorized_keys_file, "/k/a");
    assert_int_equal(c.curve_secret_key_line, 7);
    assert_int_equal(c.curve_authorized_keys_line, 9);
    /* Not reloadable: a change is reported as needing a restart. */
    load_ok(EV "allow = 127.0.0.0/8\n", &d);
    assert_int_equal(kvr_conf_apply_reload(&c, &d, &changed, &ignored), 0);
    assert_non_null(strstr(ignored.msg, "events.allow"));
    assert_non_null(strstr(ignored.msg, "events.pod_must_match_peer"));
    assert_non_null(strstr(ignored.msg, "events.curve_secret_key_file"));
    kvr_conf_free(&c);
    kvr_conf_free(&d);
}

/* [events] models: kept as written, empty means all, reloadable (SIGHUP). */
static void test_events_models(void **state)
{
    struct kvr_conf c, d;
    struct kvr_err changed, ignored;
    (void)state;
    load_ok(EV, &c);
    assert_null(c.events_models);
    load_ok(EV "models = Qwen/*  meta-llama/Llama-3.1-8B\n", &d);
    assert_string_equal(d.events_models, "Qwen/*  meta-llama/Llama-3.1-8B");
    assert_int_equal(kvr_conf_apply_reload(&c, &d, &changed, &ignored), 1);
    assert_string_equal(changed.msg, "events.models");
    assert_string_equal(ignored.msg, "");
    assert_string_equal(c.events_models, "Qwen/*  meta-llama/Llama-3.1-8B");
    kvr_conf_free(&d);
    load_ok(EV "models =\n", &d);
    assert_string_equal(d.events_models, "");
    assert_int_equal(kvr_conf_apply_reload(&c, &d, &changed, &ignored), 1);
    assert_string_equal(c.events_models, "");
    kvr_conf_free(&c);
    kvr_conf_free(&d);
}

/* [events] bind_replay and forward are stored with their lines (kvrouterd -t checks the
 * template through zsub: test_zsub, test_daemon); connect's replay= may be a template. */
static void test_replay_directives(void **state)
{
    struct kvr_conf c;
    (void)state;
    load_ok(EV "bind_replay = tcp://{pod}:{5558+rank}\nforward = tcp://*:5559\n"
               "connect = tcp://primary:5559 replay=tcp://{pod}:{5558+rank}\n",
            &c);
    assert_string_equal(c.bind_replay, "tcp://{pod}:{5558+rank}");
    assert_int_equal(c.bind_replay_line, 3);
    assert_string_equal(c.forward, "tcp://*:5559");
    assert_int_equal(c.forward_line, 4);
    assert_int_equal(c.nconnect, 1);
    assert_string_equal(c.connect[0].replay, "tcp://{pod}:{5558+rank}");
    assert_int_equal(c.connect[0].line, 5);
    kvr_conf_free(&c);
    load_ok(EV, &c);
    assert_null(c.bind_replay);
    assert_null(c.forward);
    kvr_conf_free(&c);
}

static void test_shipped_config(void **state)
{
    struct kvr_conf c, d;
    struct kvr_err err = {{0}};
    int rc;
    (void)state;
    rc = kvr_conf_load("conf/kvrouterd.conf", &c, &err);
    if (rc != 0)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(c.nbind, 1);
    assert_string_equal(c.bind[0], "tcp://*:5557");
    assert_string_equal(c.listen, "0.0.0.0:8080");
    assert_string_equal(c.admin_listen, "127.0.0.1:8081");
    assert_string_equal(c.state_dir, "/var/lib/kvrouterd"); /* the unit's StateDirectory */
    /* Everything else is at its default: nothing to apply from the defaults. */
    assert_int_equal(c.nallow, 6);
    load_ok(EV "allow = 127.0.0.0/8\nallow = ::1/128\nallow = 10.0.0.0/8\n"
               "allow = 172.16.0.0/12\nallow = 192.168.0.0/16\nallow = fc00::/7\n"
               "[http]\nadmin_listen = 127.0.0.1:8081\n[state]\ndir = /var/lib/kvrouterd\n",
            &d);
    struct kvr_err changed, ignored;
    assert_int_equal(kvr_conf_apply_reload(&c, &d, &changed, &ignored), 0);
    assert_string_equal(ignored.msg, "");
    kvr_conf_free(&c);
    kvr_conf_free(&d);
}

static void test_state_directives(void **state)
{
    static const struct {
        const char *text, *error;
    } bad[] = {
        {EV "[state]\nbootstrap = 10.0.0.1:8081\n",
         "t.conf:4: [state] bootstrap = 10.0.0.1:8081: expected http://HOST:PORT (a peer's admin "
         "listener)"},
        {EV "[state]\nbootstrap = https://a:1\n",
         "t.conf:4: [state] bootstrap = https://a:1: expected http://HOST:PORT (a peer's admin "
         "listener)"},
        {EV "[state]\nbootstrap = http://a:1/v1/snapshot\n",
         "t.conf:4: [state] bootstrap = http://a:1/v1/snapshot: expected http://HOST:PORT (a "
         "peer's admin listener)"},
        {EV "[state]\nbootstrap = http://a\n",
         "t.conf:4: [state] bootstrap = http://a: expected http://HOST:PORT (a peer's admin "
         "listener)"},
        {EV "[state]\nsnapshot_interval = 169h\n",
         "t.conf:4: [state] snapshot_interval = 169h is out of range (0ms..168h)"},
    };
    struct kvr_conf c;
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct kvr_err err = {{0}};
        int rc = kvr_conf_load_string("t.conf", bad[i].text, &c, &err);
        if (rc == 0 || strcmp(err.msg, bad[i].error) != 0)
            print_error("case %zu: rc=%d got: %s\n", i, rc, err.msg);
        assert_int_not_equal(rc, 0);
        assert_string_equal(err.msg, bad[i].error);
    }
    load_ok(EV, &c); /* defaults: no snapshots, 60 s when a dir is given, no bootstrap */
    assert_null(c.state_dir);
    assert_int_equal(c.snapshot_interval_ms, 60000);
    assert_null(c.bootstrap);
    assert_int_equal(c.bootstrap_timeout_ms, 30000);
    kvr_conf_free(&c);
    load_ok(EV "[state]\ndir = /var/lib/x\nsnapshot_interval = 0\nbootstrap = http://peer:8081/\n"
               "bootstrap_timeout = 5s\n",
            &c);
    assert_string_equal(c.state_dir, "/var/lib/x");
    assert_int_equal(c.state_dir_line, 4);
    assert_int_equal(c.snapshot_interval_ms, 0);
    assert_string_equal(c.bootstrap, "http://peer:8081/");
    assert_int_equal(c.bootstrap_timeout_ms, 5000);
    kvr_conf_free(&c);
    load_ok(EV "[state]\ndir =\nbootstrap = http://[::1]:9\n", &c); /* empty = off */
    assert_true(c.state_dir == NULL || c.state_dir[0] == '\0');
    kvr_conf_free(&c);
}

/* [model "NAME"] sections: names as given (slashes, dots), paths resolved against the config
 * file's directory, [tokenizer] defaults, and the model list moving over on reload. */
static void test_model_sections(void **state)
{
    struct kvr_conf c, fresh;
    struct kvr_err changed, ignored;
    (void)state;
    load_ok(EV, &c);
    assert_int_equal(c.nmodels, 0);
    assert_int_equal(c.prefix_cache, 64 << 20);
    assert_int_equal(c.max_prompt_bytes, 1 << 20);
    assert_int_equal(c.text_threads, 2);
    assert_int_equal(c.text_queue, 64);
    assert_int_equal(c.offload_bytes, 16 << 10);
    kvr_conf_free(&c);
    struct kvr_err err = {{0}};
    assert_int_equal(kvr_conf_load_string("/etc/kvr/t.conf",
                                          EV "[model \"Qwen/Qwen3-8B\"]\ntokenizer = models/q\n"
                                             "[tokenizer]\nprefix_cache = 0\n"
                                             "[model  \"meta-llama/Llama-3.1-8B-Instruct\" ]\n"
                                             "tokenizer = /abs/l.json\n[model \"bare\"]\n",
                                          &c, &err),
                     0);
    assert_int_equal(c.nmodels, 3);
    assert_string_equal(c.models[0].name, "Qwen/Qwen3-8B");
    assert_string_equal(c.models[0].tokenizer, "/etc/kvr/models/q");
    assert_int_equal(c.models[0].line, 3);
    assert_int_equal(c.models[0].tokenizer_line, 4);
    assert_string_equal(c.models[1].name, "meta-llama/Llama-3.1-8B-Instruct");
    assert_string_equal(c.models[1].tokenizer, "/abs/l.json");
    assert_null(c.models[2].tokenizer);
    assert_int_equal(c.prefix_cache, 0);
    /* reload: one changed, one removed, one added; the list is the fresh one */
    load_ok(EV "[model \"Qwen/Qwen3-8B\"]\ntokenizer = /other\n[model \"bare\"]\n"
               "[model \"new\"]\ntokenizer = /n\n",
            &fresh);
    assert_int_equal(kvr_conf_apply_reload(&c, &fresh, &changed, &ignored), 3);
    assert_string_equal(changed.msg, "model.\"Qwen/Qwen3-8B\", model.\"new\", "
                                     "model.\"meta-llama/Llama-3.1-8B-Instruct\"");
    assert_int_equal(c.nmodels, 3);
    assert_string_equal(c.models[0].tokenizer, "/other");
    assert_string_equal(c.models[2].name, "new");
    assert_int_equal(kvr_conf_apply_reload(&c, &fresh, &changed, NULL), 0);
    kvr_conf_free(&c);
    kvr_conf_free(&fresh);

    /* approximate mode: the keys, their defaults, and a reload that changes only them */
    load_ok(EV "[model \"m\"]\napproximate = yes\napproximate_pods = a,b  c\t,d\n"
               "block_size = 32\n[model \"n\"]\n",
            &c);
    assert_true(c.models[0].approximate);
    assert_int_equal(c.models[0].napproximate_pods, 4);
    assert_string_equal(c.models[0].approximate_pods[2], "c");
    assert_string_equal(c.models[0].approximate_pods[3], "d");
    assert_int_equal(c.models[0].block_size, 32);
    assert_false(c.models[1].approximate);
    assert_int_equal(c.models[1].napproximate_pods, 0);
    assert_int_equal(c.models[1].block_size, 0);
    assert_int_equal(c.route_assumed_ttl_ms, 120000);
    assert_int_equal(c.route_assumed_max_blocks, 65536);
    assert_true(kvr_conf_tier_weight(&c, "assumed") == 0.7);
    load_ok(EV "[model \"m\"]\napproximate = yes\napproximate_pods = a,b,c\n"
               "block_size = 32\n[model \"n\"]\n[route]\nassumed_ttl = 5s\n",
            &fresh);
    assert_int_equal(kvr_conf_apply_reload(&c, &fresh, &changed, NULL), 2);
    assert_int_equal(c.models[0].napproximate_pods, 3);
    assert_string_equal(c.models[0].approximate_pods[1], "b");
    assert_int_equal(c.route_assumed_ttl_ms, 5000);
    kvr_conf_free(&c);
    kvr_conf_free(&fresh);
}

static void test_missing_file(void **state)
{
    struct kvr_conf c;
    struct kvr_err err = {{0}};
    (void)state;
    assert_int_equal(kvr_conf_load("/nonexistent/kvr.conf", &c, &err), -ENOENT);
    assert_string_equal(err.msg, "/nonexistent/kvr.conf: cannot open: No such file or directory");
    assert_int_equal(kvr_conf_load("/", &c, &err), -EINVAL);
}

static void test_file_with_nul(void **state)
{
    char path[] = "/tmp/kvr-test-conf-XXXXXX";
    int fd = mkstemp(path);
    struct kvr_conf c;
    struct kvr_err err = {{0}};
    static const char text[] = "[events]\nbind = tcp://*:1\n[log]\nlevel = in\0fo\n";
    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
    close(fd);
    assert_int_equal(kvr_conf_load(path, &c, &err), -EINVAL);
    char want[128];
    snprintf(want, sizeof(want), "%s:4: NUL byte in line", path);
    assert_string_equal(err.msg, want);
    unlink(path);
}

static void test_reload_apply(void **state)
{
    struct kvr_conf live, fresh;
    struct kvr_err changed, ignored;
    (void)state;
    load_ok(EV "[log]\nlevel = info\n[score]\nweight.nvme = 0.2\n", &live);
    load_ok(EV "writer_threads = 8\n[http]\nlisten = 127.0.0.1:1\n[log]\nlevel = debug\n"
               "format = json\n[score]\nweight.cpu = 0.25\nweight.disk = 0.1\n"
               "default_weight = 0.3\n",
            &fresh);
    int n = kvr_conf_apply_reload(&live, &fresh, &changed, &ignored);
    assert_int_equal(n, 6);
    assert_string_equal(changed.msg, "log.level, log.format, score.default_weight, "
                                     "score.weight.cpu, score.weight.disk, score.weight.nvme");
    assert_string_equal(ignored.msg, "events.writer_threads, http.listen");
    assert_int_equal(live.log_level, KVR_LOG_DEBUG);
    assert_int_equal(live.log_format, KVR_LOG_JSON);
    assert_int_equal(live.writer_threads, 2); /* not reloadable: unchanged */
    assert_string_equal(live.listen, "0.0.0.0:8080");
    assert_true(kvr_conf_tier_weight(&live, "cpu") == 0.25);
    assert_true(kvr_conf_tier_weight(&live, "disk") == 0.1);
    assert_true(kvr_conf_tier_weight(&live, "nvme") == 0.3); /* removed → default_weight */
    assert_true(live.default_weight == 0.3);
    /* Applying the same again changes nothing. */
    assert_int_equal(kvr_conf_apply_reload(&live, &fresh, &changed, NULL), 0);
    assert_string_equal(changed.msg, "");
    kvr_conf_free(&live);
    kvr_conf_free(&fresh);

    /* [http] admin_token is reloadable (set, changed, removed); access_log is not */
    load_ok(EV "[http]\nadmin_token = one\n", &live);
    load_ok(EV "[http]\nadmin_token = two\npublic_introspection = on\n[log]\naccess_log = on\n",
            &fresh);
    assert_int_equal(kvr_conf_apply_reload(&live, &fresh, &changed, &ignored), 1);
    assert_string_equal(changed.msg, "http.admin_token");
    assert_string_equal(ignored.msg, "log.access_log, http.public_introspection");
    assert_string_equal(live.admin_token, "two");
    assert_false(live.access_log);
    kvr_conf_free(&fresh);
    load_ok(EV "[log]\naccess_log = yes\n", &fresh);
    assert_true(fresh.access_log);
    assert_int_equal(kvr_conf_apply_reload(&live, &fresh, &changed, NULL), 1);
    assert_null(live.admin_token);
    kvr_conf_free(&live);
    kvr_conf_free(&fresh);

    /* [index] max_memory: a size, reloadable; orphan_capacity beside it is not */
    load_ok(EV "[index]\nmax_memory = 512MiB\n", &live);
    assert_int_equal(live.max_memory, 512 << 20);
    load_ok(EV "[index]\nmax_memory = 0\norphan_capacity = 5\n", &fresh);
    assert_int_equal(kvr_conf_apply_reload(&live, &fresh, &changed, &ignored), 1);
    assert_string_equal(changed.msg, "index.max_memory");
    assert_string_equal(ignored.msg, "index.orphan_capacity");
    assert_int_equal(live.max_memory, 0);
    kvr_conf_free(&live);
    kvr_conf_free(&fresh);
}

static void test_parse_size(void **state)
{
    int64_t v;
    (void)state;
    assert_int_equal(kvr_conf_parse_size("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(kvr_conf_parse_size("512B", &v), 0);
    assert_int_equal(v, 512);
    assert_int_equal(kvr_conf_parse_size("64KiB", &v), 0);
    assert_int_equal(v, 65536);
    assert_int_equal(kvr_conf_parse_size("64k", &v), 0);
    assert_int_equal(v, 65536);
    assert_int_equal(kvr_conf_parse_size("16MiB", &v), 0);
    assert_int_equal(v, 16 << 20);
    assert_int_equal(kvr_conf_parse_size("1GiB", &v), 0);
    assert_int_equal(v, 1 << 30);
    assert_int_equal(kvr_conf_parse_size("3G", &v), 0);
    assert_int_equal(v, 3LL << 30);
    assert_int_equal(kvr_conf_parse_size("", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_size("KiB", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_size("1 KiB", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_size("1TiB", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_size("-1", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_size("9223372036854775807", &v), 0);
    assert_int_equal(kvr_conf_parse_size("9223372036854775807K", &v), -ERANGE);
    assert_int_equal(kvr_conf_parse_size("99999999999999999999", &v), -ERANGE);
    assert_int_equal(kvr_conf_parse_size(NULL, &v), -EINVAL);
}

static void test_parse_duration(void **state)
{
    int64_t v;
    (void)state;
    assert_int_equal(kvr_conf_parse_duration("500ms", &v), 0);
    assert_int_equal(v, 500);
    assert_int_equal(kvr_conf_parse_duration("500", &v), 0);
    assert_int_equal(v, 500);
    assert_int_equal(kvr_conf_parse_duration("10s", &v), 0);
    assert_int_equal(v, 10000);
    assert_int_equal(kvr_conf_parse_duration("5m", &v), 0);
    assert_int_equal(v, 300000);
    assert_int_equal(kvr_conf_parse_duration("1h", &v), 0);
    assert_int_equal(v, 3600000);
    assert_int_equal(kvr_conf_parse_duration("1d", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_duration("1S", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_duration("s", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_duration("1.5s", &v), -EINVAL);
    assert_int_equal(kvr_conf_parse_duration("9223372036854775807h", &v), -ERANGE);
}

static void test_parse_hostport(void **state)
{
    char host[64];
    int port;
    (void)state;
    assert_int_equal(kvr_conf_parse_hostport("127.0.0.1:8080", host, sizeof(host), &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 8080);
    assert_int_equal(kvr_conf_parse_hostport("[::1]:0", host, sizeof(host), &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 0);
    assert_int_equal(kvr_conf_parse_hostport("router.local:65535", host, sizeof(host), &port), 0);
    assert_string_equal(host, "router.local");
    assert_int_equal(port, 65535);
    assert_int_equal(kvr_conf_parse_hostport("h:65536", host, sizeof(host), &port), -EINVAL);
    assert_int_equal(kvr_conf_parse_hostport("h:", host, sizeof(host), &port), -EINVAL);
    assert_int_equal(kvr_conf_parse_hostport(":80", host, sizeof(host), &port), -EINVAL);
    assert_int_equal(kvr_conf_parse_hostport("::1:80", host, sizeof(host), &port), -EINVAL);
    assert_int_equal(kvr_conf_parse_hostport("[zz]:80", host, sizeof(host), &port), -EINVAL);
    assert_int_equal(kvr_conf_parse_hostport("h:8x", host, sizeof(host), &port), -EINVAL);
    assert_int_equal(kvr_conf_parse_hostport("h h:80", host, sizeof(host), &port), -EINVAL);
    assert_int_equal(kvr_conf_parse_hostport("longhostname:80", host, 4, &port), -ENAMETOOLONG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_events_models),
        cmocka_unit_test(test_admission_directives),
        cmocka_unit_test(test_values_units_comments),
        cmocka_unit_test(test_values_units),
        cmocka_unit_test(test_replay_directives),
        cmocka_unit_test(test_shipped_config),
        cmocka_unit_test(test_state_directives),
        cmocka_unit_test(test_model_sections),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_file_with_nul),
        cmocka_unit_test(test_reload_apply),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_parse_duration),
        cmocka_unit_test(test_parse_hostport),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
