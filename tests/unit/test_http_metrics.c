/* test_http_metrics.c: the engine gauges and counters under vLLM's names
 * (http_metrics_render_engine) from a coordinator stats reply, without any
 * process: names, types, the model_name label and its escaping, and the
 * series left out (not zeroed) when a figure is unknown; the gateway's
 * histograms under vLLM's names beside Tandem's (http_metrics_render). The
 * gateway's own counters are checked end to end
 * (tests/e2e/test_gateway_metrics.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "http_metrics.h"

/* The text rendered from the stats JSON (NULL: no reply), after prefix. */
static char *render(const char *stats_json, const char *model, const char *prefix)
{
    char err[ERR_MSG_MAX];
    cJSON *stats = stats_json != NULL ? cJSON_Parse(stats_json) : NULL;
    assert_true(stats_json == NULL || stats != NULL);
    char *buf = NULL;
    size_t len = 0;
    if (prefix != NULL) {
        buf = strdup(prefix);
        assert_non_null(buf);
        len = strlen(prefix);
    }
    assert_int_equal(http_metrics_render_engine(stats, model, &buf, &len, err), 0);
    cJSON_Delete(stats);
    if (buf == NULL) {
        buf = strdup("");
        assert_non_null(buf);
    }
    assert_int_equal(strlen(buf), len);
    return buf;
}

static const char busy[] = "{\"type\":\"stats\",\"requests\":{\"active\":3,\"queued\":5},"
                           "\"kv_blocks\":{\"target_total\":200,\"target_reserved\":50,\"draft_total\":9}}";

static void test_http_metrics_engine_gauges_use_vllm_names(void **state)
{
    (void)state;
    char *t = render(busy, "tiny", "tandem_x 1\n");
    assert_true(strncmp(t, "tandem_x 1\n", 11) == 0); /* appended, what was there kept */
    assert_non_null(
        strstr(t, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"tiny\"} 5\n"));
    assert_non_null(
        strstr(t, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"tiny\"} 3\n"));
    assert_non_null(
        strstr(t, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n"));
    assert_non_null(
        strstr(t, "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"tiny\"} 0.25\n"));
    assert_non_null(strstr(t, "# HELP vllm:num_requests_waiting "));
    free(t);
}

/* No reply: nothing at all, so a scraper sees the series absent. */
static void test_http_metrics_engine_no_reply_leaves_them_out(void **state)
{
    (void)state;
    char *t = render(NULL, "tiny", "tandem_x 1\n");
    assert_string_equal(t, "tandem_x 1\n");
    free(t);
    t = render(NULL, "tiny", NULL);
    assert_string_equal(t, "");
    free(t);
}

/* A figure the reply lacks, or a pool of 0 blocks (no target registered),
 * leaves its gauge out; the others stay. */
static void test_http_metrics_engine_unknown_figures_are_left_out(void **state)
{
    (void)state;
    char *t = render("{\"requests\":{\"active\":0,\"queued\":0},\"kv_blocks\":{\"target_total\":0,"
                     "\"target_reserved\":0}}",
                     "tiny", NULL);
    assert_non_null(strstr(t, "vllm:num_requests_waiting{model_name=\"tiny\"} 0\n"));
    assert_non_null(strstr(t, "vllm:num_requests_running{model_name=\"tiny\"} 0\n"));
    assert_null(strstr(t, "cache_usage_perc"));
    free(t);
    t = render("{\"requests\":{\"active\":\"3\"},\"kv_blocks\":{\"target_total\":10,\"target_reserved\":10}}", "tiny",
               NULL);
    assert_null(strstr(t, "vllm:num_requests_waiting"));
    assert_null(strstr(t, "vllm:num_requests_running"));
    assert_non_null(strstr(t, "vllm:kv_cache_usage_perc{model_name=\"tiny\"} 1\n"));
    free(t);
}

/* The token and speculation counters, named as vLLM names them, each with
 * model_name; the acceptance per position with its position too. */
static void test_http_metrics_engine_counters_use_vllm_names(void **state)
{
    (void)state;
    char *t = render("{\"tokens\":{\"prompt\":120,\"generated\":64},\"spec\":{\"num_drafts\":10,"
                     "\"num_draft_tokens\":40,\"num_accepted_tokens\":25,\"accepted_per_pos\":[9,7,5,4]}}",
                     "tiny", NULL);
    static const char *const want[] = {
        "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"tiny\"} 120\n",
        "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"tiny\"} 64\n",
        "# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total{model_name=\"tiny\"} 10\n",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
        "vllm:spec_decode_num_draft_tokens_total{model_name=\"tiny\"} 40\n",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        "vllm:spec_decode_num_accepted_tokens_total{model_name=\"tiny\"} 25\n",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny\",position=\"0\"} 9\n",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny\",position=\"3\"} 4\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (strstr(t, want[i]) == NULL)
            fail_msg("missing:\n%s\nin:\n%s", want[i], t);
    free(t);
    /* a reply without them: left out, not 0 */
    t = render(busy, "tiny", NULL);
    assert_null(strstr(t, "vllm:prompt_tokens_total"));
    assert_null(strstr(t, "vllm:spec_decode"));
    free(t);
}

/* The gateway's three histograms appear twice: tandem_gateway_* as before
 * (unlabelled) and under vLLM's names with model_name, the same counts. */
static void test_http_metrics_histograms_under_vllm_names(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct http_metrics *m = NULL;
    assert_int_equal(http_metrics_create(&m, err), 0);
    http_metrics_generation_start(m);
    http_metrics_generation_first(m, 0.03);
    http_metrics_generation_end(m, 1, 11, 0.5, 0.6);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(http_metrics_render(m, "tiny", &buf, &len, err), 0);
    assert_int_equal(strlen(buf), len);
    static const char *const want[] = {
        "tandem_gateway_time_to_first_token_seconds_count 1\n",
        "# TYPE vllm:time_to_first_token_seconds histogram\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.02\"} 0\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.04\"} 1\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 1\n",
        "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 1\n",
        "# TYPE vllm:time_per_output_token_seconds histogram\n",
        "vllm:time_per_output_token_seconds_bucket{model_name=\"tiny\",le=\"0.05\"} 1\n", /* 0.5 s / 10 */
        "vllm:time_per_output_token_seconds_sum{model_name=\"tiny\"} 0.050000\n",
        "# TYPE vllm:e2e_request_latency_seconds histogram\n",
        "vllm:e2e_request_latency_seconds_count{model_name=\"tiny\"} 1\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (strstr(buf, want[i]) == NULL)
            fail_msg("missing:\n%s\nin:\n%s", want[i], buf);
    free(buf);
    http_metrics_destroy(m);
}

/* The served model name is a label value: \ " and line feed escaped. */
static void test_http_metrics_engine_escapes_the_model_name(void **state)
{
    (void)state;
    char *t = render(busy, "a\"b\\c\nd", NULL);
    assert_non_null(strstr(t, "vllm:num_requests_running{model_name=\"a\\\"b\\\\c\\nd\"} 3\n"));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_metrics_engine_gauges_use_vllm_names),
        cmocka_unit_test(test_http_metrics_engine_no_reply_leaves_them_out),
        cmocka_unit_test(test_http_metrics_engine_unknown_figures_are_left_out),
        cmocka_unit_test(test_http_metrics_engine_escapes_the_model_name),
        cmocka_unit_test(test_http_metrics_engine_counters_use_vllm_names),
        cmocka_unit_test(test_http_metrics_histograms_under_vllm_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
