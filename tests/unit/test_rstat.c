/* test_rstat.c — the decision metrics add up: random decisions made by the real policies
 * (route.c) are recorded, the /metrics text is parsed back and every counter is compared with
 * sums kept naively here (seed printed, KVR_TEST_SEED=N replays); Dynamo's example of a mean
 * of ratios (0.495) against the block-weighted rate (0.980) computed from the exported
 * counters; the outcome branches; and the cardinality bounds (models past the cap, workers
 * past the cap, DELETE /v1/pods, idle expiry).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/buf.h"
#include "route/route.h"
#include "route/rstat.h"

static unsigned seed;

/* The value of the sample whose name and labels are exactly `series` ("name{a=\"b\"}" or
 * "name"), or -1 when absent. */
static double sample(const struct kvr_buf *b, const char *series)
{
    size_t n = strlen(series);
    const char *p = b->data, *end = b->data + b->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            nl = end;
        if ((size_t)(nl - p) > n && memcmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = nl + 1;
    }
    return -1;
}

static void render(struct kvr_rstat *s, struct kvr_buf *b)
{
    kvr_buf_reset(b);
    kvr_rstat_metrics(s, b);
    kvr_buf_append(b, "", 1); /* NUL for the debugging print below */
    b->len--;
}

static struct kvr_conf conf(const char *policy)
{
    struct kvr_conf c;
    memset(&c, 0, sizeof(c));
    c.route_policy = (char *)policy;
    c.route_overlap_weight = 1.0;
    c.route_balance_abs_threshold = 64;
    c.route_balance_rel_threshold = 1.5;
    c.route_cache_threshold = 0.3;
    c.route_max_request_age_ms = 600000;
    c.route_max_tracked = 1000;
    c.route_seed = seed | 1;
    c.route_prefill_rate = 20000;
    c.route_uncached_weight = 1;
    c.route_sticky_band = 0.5;
    c.route_prefill_timeout_ms = 30000;
    c.route_decode_time_ms = 5000;
    return c;
}

static const char *const pods[] = {"p0", "p1", "p2", "p3", "p4", "p5"};
static const char *const models[] = {"m/a", "m/b"};

struct naive {
    uint64_t decisions, query, chosen, best;
};

/* Random decisions by three policies on two models through kvr_route_decide, recorded; every
 * exported counter equals the naive sums, and the branches add up to the decisions. */
static void test_sums_add_up(void **state)
{
    (void)state;
    struct kvr_conf c = conf("cost");
    struct kvr_route *r;
    struct kvr_rstat *s;
    struct kvr_buf b;
    struct naive nv[2][KVR_ROUTE_NPOLICIES] = {0};
    uint64_t wdec[6][2] = {0}, wmatched[6][2] = {0}, wtok[6][2] = {0}, wprompt[6][2] = {0};
    uint64_t br[KVR_ROUTE_NPOLICIES][KVR_RSTAT_NBRANCHES] = {0};
    unsigned rs = seed;
    char series[256];

    kvr_buf_init(&b);
    assert_int_equal(kvr_route_create(&c, &r), 0);
    assert_int_equal(kvr_rstat_create(0, &s), 0);
    for (int k = 0; k < 3000; k++) {
        struct kvr_route_cand cand[6];
        size_t n = 1 + (size_t)rand_r(&rs) % 6;
        uint32_t qb = (uint32_t)rand_r(&rs) % 40;
        int m = rand_r(&rs) % 2;
        int pol = (int[]){KVR_ROUTE_COST, KVR_ROUTE_CACHE_AWARE, KVR_ROUTE_SCORE}[rand_r(&rs) % 3];
        for (size_t i = 0; i < n; i++) {
            cand[i] = (struct kvr_route_cand){.pod = pods[i], .dp_rank = (uint32_t)(rand_r(&rs) % 2),
                                              .has_requests = true, .has_tokens = true};
            cand[i].matched_blocks = qb && rand_r(&rs) % 3 ? (uint32_t)rand_r(&rs) % (qb + 1) : 0;
            cand[i].score = cand[i].matched_blocks;
            cand[i].active_requests = (uint64_t)(rand_r(&rs) % 4 ? rand_r(&rs) % 8 : rand_r(&rs) % 200);
            cand[i].active_tokens = (uint64_t)(rand_r(&rs) % 5000);
        }
        struct kvr_route_query q = {.query_blocks = qb, .block_size = 16,
                                    .prompt_tokens = qb * 16 + 3, .policy = pol, .cands = cand,
                                    .ncands = n};
        struct kvr_route_decision d;
        assert_int_equal(kvr_route_decide(r, &q, &d), 0);
        uint32_t best = 0;
        for (size_t i = 0; i < n; i++)
            best = cand[i].matched_blocks > best ? cand[i].matched_blocks : best;
        const struct kvr_route_cand *ch = &cand[d.chosen];
        int branch = kvr_rstat_branch(cand, n, d.chosen, d.policy, false);
        kvr_rstat_record(s, &(struct kvr_rstat_decision){
                                .endpoint = KVR_RSTAT_ROUTE, .input = k % 3, .model = models[m],
                                .policy = d.policy, .branch = branch, .query_blocks = qb,
                                .block_size = 16, .prompt_tokens = q.prompt_tokens,
                                .best_matched = kvr_rstat_best_matched(cand, n), .pod = ch->pod,
                                .dp_rank = ch->dp_rank, .chosen_matched = ch->matched_blocks,
                                .seconds = 1e-4});
        /* the naive view */
        nv[m][pol].decisions++;
        nv[m][pol].query += qb;
        nv[m][pol].chosen += ch->matched_blocks;
        nv[m][pol].best += best;
        size_t pi = (size_t)(ch->pod[1] - '0');
        wdec[pi][ch->dp_rank]++;
        wmatched[pi][ch->dp_rank] += ch->matched_blocks;
        wtok[pi][ch->dp_rank] += ch->matched_blocks * 16u;
        wprompt[pi][ch->dp_rank] += q.prompt_tokens;
        br[pol][best == 0 ? KVR_RSTAT_FALLBACK
                : ch->matched_blocks == best ? KVR_RSTAT_CACHE
                                             : KVR_RSTAT_LOAD]++;
    }
    render(s, &b);
    for (int m = 0; m < 2; m++) {
        for (int p = 0; p < KVR_ROUTE_NPOLICIES; p++) {
            static const char *const fam[4] = {"decision_total", "decision_query_blocks_total",
                                               "decision_chosen_matched_blocks_total",
                                               "decision_best_matched_blocks_total"};
            uint64_t want[4] = {nv[m][p].decisions, nv[m][p].query, nv[m][p].chosen,
                                nv[m][p].best};
            for (int f = 0; f < 4; f++) {
                snprintf(series, sizeof(series),
                         "kvrouter_%s{endpoint=\"route\",model=\"%s\",policy=\"%s\"}", fam[f],
                         models[m], kvr_route_policy_name(p));
                double got = sample(&b, series);
                if (want[0] == 0)
                    assert_true(got == -1); /* no series for a pair never used */
                else if (got != (double)want[f])
                    fail_msg("seed %u: %s = %.0f, want %" PRIu64, seed, series, got, want[f]);
            }
        }
    }
    for (int p = 0; p < KVR_ROUTE_NPOLICIES; p++) {
        uint64_t sum = 0;
        for (int k = 0; k < KVR_RSTAT_NBRANCHES; k++) {
            snprintf(series, sizeof(series),
                     "kvrouter_decision_branch_total{policy=\"%s\",branch=\"%s\"}",
                     kvr_route_policy_name(p), kvr_rstat_branch_name(k));
            double got = sample(&b, series);
            if (got != (double)br[p][k])
                fail_msg("seed %u: %s = %.0f, want %" PRIu64, seed, series, got, br[p][k]);
            sum += br[p][k];
        }
        assert_true(sum == nv[0][p].decisions + nv[1][p].decisions);
    }
    for (int i = 0; i < 6; i++) {
        for (int rk = 0; rk < 2; rk++) {
            static const char *const fam[4] = {"decision_worker_total",
                                               "decision_worker_matched_blocks_total",
                                               "decision_worker_matched_tokens_total",
                                               "decision_worker_prompt_tokens_total"};
            uint64_t want[4] = {wdec[i][rk], wmatched[i][rk], wtok[i][rk], wprompt[i][rk]};
            for (int f = 0; f < 4; f++) {
                snprintf(series, sizeof(series), "kvrouter_%s{pod=\"%s\",dp_rank=\"%d\"}",
                         fam[f], pods[i], rk);
                double got = sample(&b, series);
                if (got != (want[0] ? (double)want[f] : -1))
                    fail_msg("seed %u: %s = %.0f, want %" PRIu64, seed, series, got, want[f]);
            }
        }
    }
    /* 3000 latency observations of 100 µs, split by input kind */
    double total = 0;
    for (int in = 0; in < KVR_RSTAT_NINPUTS; in++) {
        snprintf(series, sizeof(series),
                 "kvrouter_decision_duration_seconds_count{endpoint=\"route\",input=\"%s\"}",
                 kvr_rstat_input_name(in));
        total += sample(&b, series);
    }
    assert_true(total == 3000);
    kvr_buf_free(&b);
    kvr_rstat_destroy(s);
    kvr_route_destroy(r);
}

/* Dynamo's report: two decisions, 99 of 100 blocks and 0 of 1; the mean of the ratios is
 * 0.495, the block-weighted rate from the exported sums 99/101 = 0.980. A refused decision
 * and one without candidates count as decisions but add no blocks. Scored queries are summed
 * under endpoint="score", policy="none", with no chosen blocks. */
static void test_block_weighted(void **state)
{
    (void)state;
    struct kvr_rstat *s;
    struct kvr_buf b;

    kvr_buf_init(&b);
    assert_int_equal(kvr_rstat_create(0, &s), 0);
    kvr_rstat_record(s, &(struct kvr_rstat_decision){.model = "m", .policy = KVR_ROUTE_TTFT,
                                                     .branch = KVR_RSTAT_CACHE,
                                                     .query_blocks = 100, .block_size = 16,
                                                     .prompt_tokens = 1600, .best_matched = 99,
                                                     .pod = "a", .chosen_matched = 99,
                                                     .seconds = -1});
    kvr_rstat_record(s, &(struct kvr_rstat_decision){.model = "m", .policy = KVR_ROUTE_TTFT,
                                                     .branch = KVR_RSTAT_LOAD, .query_blocks = 1,
                                                     .block_size = 16, .prompt_tokens = 20,
                                                     .best_matched = 1, .pod = "b",
                                                     .chosen_matched = 0, .seconds = -1});
    kvr_rstat_record(s, &(struct kvr_rstat_decision){.model = "m", .policy = KVR_ROUTE_TTFT,
                                                     .branch = KVR_RSTAT_BUSY,
                                                     .query_blocks = 50, .best_matched = 50,
                                                     .chosen_matched = 50, .seconds = -1});
    kvr_rstat_record(s, &(struct kvr_rstat_decision){.model = "m", .policy = KVR_ROUTE_TTFT,
                                                     .branch = KVR_RSTAT_NO_CANDIDATE,
                                                     .seconds = -1});
    kvr_rstat_record(s, &(struct kvr_rstat_decision){.endpoint = KVR_RSTAT_SCORE, .model = "m",
                                                     .query_blocks = 8, .best_matched = 6,
                                                     .input = KVR_RSTAT_CHAT, .seconds = 0.002});
    render(s, &b);
    double q = sample(&b, "kvrouter_decision_query_blocks_total{endpoint=\"route\",model=\"m\","
                          "policy=\"ttft\"}");
    double h = sample(&b, "kvrouter_decision_chosen_matched_blocks_total{endpoint=\"route\","
                          "model=\"m\",policy=\"ttft\"}");
    double best = sample(&b, "kvrouter_decision_best_matched_blocks_total{endpoint=\"route\","
                             "model=\"m\",policy=\"ttft\"}");
    assert_true(q == 101 && h == 99 && best == 100);
    assert_true(fabs(h / q - 0.980) < 0.001);            /* not (0.99 + 0) / 2 = 0.495 */
    assert_true(fabs(h / best - 0.99) < 1e-9);           /* chosen vs best */
    assert_true(sample(&b, "kvrouter_decision_total{endpoint=\"route\",model=\"m\","
                           "policy=\"ttft\"}") == 4);
    assert_true(sample(&b, "kvrouter_decision_branch_total{policy=\"ttft\",branch=\"busy\"}") == 1);
    assert_true(sample(&b, "kvrouter_decision_branch_total{policy=\"ttft\",branch=\"no_candidate\"}") == 1);
    assert_true(sample(&b, "kvrouter_decision_worker_matched_tokens_total{pod=\"a\","
                           "dp_rank=\"0\"}") == 99 * 16);
    assert_true(sample(&b, "kvrouter_decision_worker_prompt_tokens_total{pod=\"b\","
                           "dp_rank=\"0\"}") == 20);
    assert_true(sample(&b, "kvrouter_decision_query_blocks_total{endpoint=\"score\",model=\"m\","
                           "policy=\"none\"}") == 8);
    assert_true(sample(&b, "kvrouter_decision_best_matched_blocks_total{endpoint=\"score\","
                           "model=\"m\",policy=\"none\"}") == 6);
    assert_true(sample(&b, "kvrouter_decision_chosen_matched_blocks_total{endpoint=\"score\","
                           "model=\"m\",policy=\"none\"}") == -1);
    assert_true(sample(&b, "kvrouter_decision_duration_seconds_count{endpoint=\"score\","
                           "input=\"chat\"}") == 1);
    assert_true(sample(&b, "kvrouter_decision_duration_seconds_count{endpoint=\"route\","
                           "input=\"tokens\"}") == 0);
    kvr_buf_free(&b);
    kvr_rstat_destroy(s);
}

static void test_branches(void **state)
{
    (void)state;
    struct kvr_route_cand c[3] = {{.pod = "a", .matched_blocks = 5},
                                  {.pod = "b", .matched_blocks = 9},
                                  {.pod = "c", .matched_blocks = 0}};
    assert_int_equal(kvr_rstat_branch(c, 3, 1, KVR_ROUTE_COST, false), KVR_RSTAT_CACHE);
    assert_int_equal(kvr_rstat_branch(c, 3, 0, KVR_ROUTE_COST, false), KVR_RSTAT_LOAD);
    assert_int_equal(kvr_rstat_branch(c, 3, 2, KVR_ROUTE_TTFT, true), KVR_RSTAT_BUSY);
    c[0].busy = c[1].busy = true;
    assert_int_equal(kvr_rstat_branch(c, 3, 1, KVR_ROUTE_TTFT, false), KVR_RSTAT_CACHE);
    c[2].busy = true;
    assert_int_equal(kvr_rstat_branch(c, 3, 1, KVR_ROUTE_TTFT, false), KVR_RSTAT_BUSY);
    assert_int_equal(kvr_rstat_branch(c, 3, 1, KVR_ROUTE_COST, false), KVR_RSTAT_CACHE);
    c[0].matched_blocks = c[1].matched_blocks = 0;
    assert_int_equal(kvr_rstat_branch(c, 3, 0, KVR_ROUTE_SCORE, false), KVR_RSTAT_FALLBACK);
    assert_int_equal(kvr_rstat_branch(c, 0, 0, KVR_ROUTE_SCORE, false), KVR_RSTAT_NO_CANDIDATE);
    assert_int_equal(kvr_rstat_best_matched(c, 0), 0);
}

/* Models past the cap go to "_other"; workers past the cap are counted, not kept; DELETE and
 * idle expiry drop a worker's series. */
static void test_bounds(void **state)
{
    (void)state;
    struct kvr_rstat *s;
    struct kvr_buf b;
    char name[64];

    kvr_buf_init(&b);
    assert_int_equal(kvr_rstat_create(0, &s), 0);
    for (int i = 0; i < KVR_RSTAT_MAX_MODELS + 10; i++) {
        snprintf(name, sizeof(name), "model-%d", i);
        kvr_rstat_record(s, &(struct kvr_rstat_decision){.endpoint = KVR_RSTAT_SCORE,
                                                         .model = name, .query_blocks = 1,
                                                         .seconds = -1});
    }
    for (int i = 0; i < KVR_RSTAT_MAX_WORKERS + 5; i++) {
        snprintf(name, sizeof(name), "pod-%d", i);
        kvr_rstat_record(s, &(struct kvr_rstat_decision){.model = "m", .pod = name,
                                                         .branch = KVR_RSTAT_FALLBACK,
                                                         .seconds = -1});
    }
    render(s, &b);
    assert_true(sample(&b, "kvrouter_decision_total{endpoint=\"score\",model=\"_other\","
                           "policy=\"none\"}") == 10);
    assert_true(sample(&b, "kvrouter_decision_total{endpoint=\"score\",model=\"model-63\","
                           "policy=\"none\"}") == 1);
    assert_true(sample(&b, "kvrouter_decision_total{endpoint=\"score\",model=\"model-64\","
                           "policy=\"none\"}") == -1);
    assert_true(sample(&b, "kvrouter_decision_workers") == KVR_RSTAT_MAX_WORKERS);
    assert_true(sample(&b, "kvrouter_decision_worker_overflow_total") == 5);
    kvr_rstat_forget_pod(s, "pod-7");
    render(s, &b);
    assert_true(sample(&b, "kvrouter_decision_worker_total{pod=\"pod-7\",dp_rank=\"0\"}") == -1);
    assert_true(sample(&b, "kvrouter_decision_worker_total{pod=\"pod-8\",dp_rank=\"0\"}") == 1);
    assert_true(sample(&b, "kvrouter_decision_workers") == KVR_RSTAT_MAX_WORKERS - 1);
    kvr_rstat_destroy(s);

    /* idle expiry: a ttl of 500 ms */
    assert_int_equal(kvr_rstat_create(500, &s), 0);
    kvr_rstat_record(s, &(struct kvr_rstat_decision){.model = "m", .pod = "old", .seconds = -1});
    usleep(700 * 1000);
    kvr_rstat_record(s, &(struct kvr_rstat_decision){.model = "m", .pod = "new", .seconds = -1});
    render(s, &b);
    assert_true(sample(&b, "kvrouter_decision_worker_total{pod=\"old\",dp_rank=\"0\"}") == -1);
    assert_true(sample(&b, "kvrouter_decision_worker_total{pod=\"new\",dp_rank=\"0\"}") == 1);
    assert_true(sample(&b, "kvrouter_decision_workers_expired_total") == 1);
    kvr_buf_free(&b);
    kvr_rstat_destroy(s);
}

int main(void)
{
    const char *env = getenv("KVR_TEST_SEED");
    seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_rstat: seed %u (KVR_TEST_SEED=%u replays)\n", seed, seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums_add_up),
        cmocka_unit_test(test_block_weighted),
        cmocka_unit_test(test_branches),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
