/* test_http_metrics.c: the engine gauges under vLLM's names
 * (http_metrics_render_engine) from a coordinator stats reply, without any
 * process: names, types, the model_name label and its escaping, and the
 * series left out (not zeroed) when a figure is unknown. The gateway's own
 * counters are checked end to end (tests/e2e/test_gateway_metrics.py). */
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
