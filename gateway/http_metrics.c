/* http_metrics.c: counters, gauges and fixed-bucket histograms behind one
 * mutex (see http_metrics.h). Bucket bounds follow vLLM's for the same
 * figures, so dashboards read both alike. The engine gauges under vLLM's
 * names hold no state here: each scrape computes them from the stats reply
 * it got. */
#include "http_metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "prom_text.h"

#define STATUS_MAX 8   /* distinct statuses per endpoint */
#define BUCKETS_MAX 20

static const char *const endpoint_names[HTTP_METRICS_ENDPOINT_COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "other",
};

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double tpot_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                     0.3,  0.4,   0.5,  0.75,  1.0, 2.5};
static const double e2e_bounds[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

struct histogram {
    const double *bounds;
    int n_bounds;
    uint64_t counts[BUCKETS_MAX];   /* per bucket, not cumulative */
    uint64_t count;
    double sum;
};

struct status_count {
    int status;
    uint64_t count;
};

struct http_metrics {
    pthread_mutex_t mu;
    struct status_count requests[HTTP_METRICS_ENDPOINT_COUNT][STATUS_MAX];
    int64_t in_flight, waiting;
    uint64_t generated_tokens;
    struct histogram ttft, tpot, e2e;
};

static void histogram_init(struct histogram *h, const double *bounds, int n)
{
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n_bounds = n;
}

static void histogram_observe(struct histogram *h, double v)
{
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->counts[i]++;   /* i == n_bounds: the +Inf bucket */
    h->count++;
    h->sum += v;
}

int http_metrics_create(struct http_metrics **out, char *err)
{
    struct http_metrics *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return error_set(err, ERR_NOMEM, "metrics: out of memory");
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        return error_set(err, ERR_SYSTEM, "metrics: pthread_mutex_init failed");
    }
    histogram_init(&m->ttft, ttft_bounds, (int)(sizeof(ttft_bounds) / sizeof(ttft_bounds[0])));
    histogram_init(&m->tpot, tpot_bounds, (int)(sizeof(tpot_bounds) / sizeof(tpot_bounds[0])));
    histogram_init(&m->e2e, e2e_bounds, (int)(sizeof(e2e_bounds) / sizeof(e2e_bounds[0])));
    *out = m;
    return 0;
}

void http_metrics_destroy(struct http_metrics *m)
{
    if (m == NULL)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void http_metrics_request_done(struct http_metrics *m, enum http_metrics_endpoint ep, int status)
{
    if ((unsigned)ep >= HTTP_METRICS_ENDPOINT_COUNT)
        ep = HTTP_METRICS_OTHER;
    pthread_mutex_lock(&m->mu);
    struct status_count *sc = m->requests[ep];
    int i = 0;
    while (i < STATUS_MAX && sc[i].count > 0 && sc[i].status != status)
        i++;
    if (i == STATUS_MAX)
        i = STATUS_MAX - 1; /* more distinct statuses than slots: the last slot absorbs them */
    sc[i].status = sc[i].count > 0 ? sc[i].status : status;
    sc[i].count++;
    pthread_mutex_unlock(&m->mu);
}

void http_metrics_generation_start(struct http_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->in_flight++;
    m->waiting++;
    pthread_mutex_unlock(&m->mu);
}

void http_metrics_generation_first(struct http_metrics *m, double ttft_s)
{
    pthread_mutex_lock(&m->mu);
    m->waiting--;
    histogram_observe(&m->ttft, ttft_s);
    pthread_mutex_unlock(&m->mu);
}

void http_metrics_generation_end(struct http_metrics *m, int got_first, int n_tokens, double decode_s,
                                 double e2e_s)
{
    pthread_mutex_lock(&m->mu);
    m->in_flight--;
    if (!got_first)
        m->waiting--;
    if (n_tokens > 0)
        m->generated_tokens += (uint64_t)n_tokens;
    if (got_first && n_tokens > 1)
        histogram_observe(&m->tpot, decode_s / (n_tokens - 1));
    histogram_observe(&m->e2e, e2e_s);
    pthread_mutex_unlock(&m->mu);
}

/* h as the text format's histogram. */
static struct prom_histogram prom_of(const struct histogram *h)
{
    return (struct prom_histogram){
        .bounds = h->bounds, .counts = h->counts, .n_bounds = h->n_bounds, .sum = h->sum, .count = h->count};
}

/* The gateway's own series (m->mu held). */
static void put_gateway_series(struct prom_text *t, const struct http_metrics *m, const char *model_labels)
{
    prom_family(t, "tandem_gateway_requests_total", "counter",
                "HTTP requests answered by the gateway, by endpoint and status.");
    for (int e = 0; e < HTTP_METRICS_ENDPOINT_COUNT; e++)
        for (int i = 0; i < STATUS_MAX && m->requests[e][i].count > 0; i++)
            prom_printf(t, "tandem_gateway_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", endpoint_names[e],
                        m->requests[e][i].status, (unsigned long long)m->requests[e][i].count);
    prom_single(t, "tandem_gateway_requests_in_flight", "gauge", "Generations the gateway is serving.",
                (double)m->in_flight);
    prom_single(t, "tandem_gateway_requests_waiting", "gauge",
                "Generations waiting for their first token (queue length).", (double)m->waiting);
    prom_single(t, "tandem_gateway_generated_tokens_total", "counter", "Tokens returned through the gateway.",
                (double)m->generated_tokens);
    const struct prom_histogram ttft = prom_of(&m->ttft), tpot = prom_of(&m->tpot), e2e = prom_of(&m->e2e);
    prom_histogram(t, "tandem_gateway_time_to_first_token_seconds",
                   "From the HTTP request to its first token (or its whole answer when not streamed).", NULL, &ttft);
    prom_histogram(t, "tandem_gateway_time_per_output_token_seconds",
                   "Decode time per output token after the first, per request.", NULL, &tpot);
    prom_histogram(t, "tandem_gateway_e2e_request_latency_seconds", "From the HTTP request to its last byte.", NULL,
                   &e2e);
    /* The same observations under vLLM's names: its dashboards and alerts
     * read these (the buckets are vLLM's too). */
    prom_histogram(t, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                   model_labels, &ttft);
    prom_histogram(t, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                   model_labels, &tpot);
    prom_histogram(t, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                   model_labels, &e2e);
}

/* `model_name="<escaped name>"`: NULL when out of memory; the caller frees. */
static char *model_labels_of(const char *model_name)
{
    char *model = prom_label_value(model_name);
    if (model == NULL)
        return NULL;
    const size_t n = strlen(model) + sizeof "model_name=\"\"";
    char *labels = malloc(n);
    if (labels != NULL)
        snprintf(labels, n, "model_name=\"%s\"", model);
    free(model);
    return labels;
}

int http_metrics_render(struct http_metrics *m, const char *model_name, char **buf, size_t *len, char *err)
{
    char *labels = model_labels_of(model_name);
    if (labels == NULL)
        return error_set(err, ERR_NOMEM, "metrics: out of memory");
    struct prom_text t;
    prom_text_init(&t, *buf, *len);
    pthread_mutex_lock(&m->mu);
    put_gateway_series(&t, m, labels);
    pthread_mutex_unlock(&m->mu);
    free(labels);
    *buf = NULL;
    *len = 0;
    return prom_text_finish(&t, buf, len, err);
}

/* The stats reply's number obj.key, or NULL. */
static const cJSON *stats_number(const cJSON *stats, const char *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(stats, obj), key);
    return cJSON_IsNumber(v) ? v : NULL;
}

/* One series of the engine's under its vLLM name, labelled with the model;
 * left out when the stats reply lacks it (v NULL). */
static void put_engine_value(struct prom_text *t, const char *name, const char *type, const char *help,
                             const char *labels, const cJSON *v)
{
    if (v == NULL)
        return;
    prom_family(t, name, type, help);
    prom_sample(t, name, labels, v->valuedouble);
}

/* The token and speculation counters of the stats reply, under vLLM's
 * names; each left out when the reply lacks it. */
static void put_engine_counters(struct prom_text *t, const cJSON *stats, const char *labels)
{
    put_engine_value(t, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", labels,
                     stats_number(stats, "tokens", "prompt"));
    put_engine_value(t, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", labels,
                     stats_number(stats, "tokens", "generated"));
    put_engine_value(t, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", labels,
                     stats_number(stats, "spec", "num_drafts"));
    put_engine_value(t, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", labels,
                     stats_number(stats, "spec", "num_draft_tokens"));
    put_engine_value(t, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
                     labels, stats_number(stats, "spec", "num_accepted_tokens"));
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(stats, "spec"),
                                                        "accepted_per_pos");
    if (!cJSON_IsArray(pos))
        return;
    prom_family(t, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                "Accepted tokens per draft position.");
    int i = 0;
    const cJSON *v = NULL;
    cJSON_ArrayForEach(v, pos) {
        if (cJSON_IsNumber(v))
            prom_printf(t, "vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %.17g\n",
                        labels, i, v->valuedouble);
        i++;
    }
}

/* The engine's gauges: queue, running, KV usage. */
static void put_engine_gauges(struct prom_text *t, const cJSON *stats, const char *labels)
{
    put_engine_value(t, "vllm:num_requests_waiting", "gauge", "Requests queued in the coordinator, waiting for a slot.",
                     labels, stats_number(stats, "requests", "queued"));
    put_engine_value(t, "vllm:num_requests_running", "gauge", "Sequences being generated (holding a slot).", labels,
                     stats_number(stats, "requests", "active"));
    /* Reserved, not written: admission reserves a sequence's prompt and
     * max_tokens up front (docs/batching.md), so this is what decides
     * whether the next request waits, the figure a balancer wants. */
    const cJSON *kv_total = stats_number(stats, "kv_blocks", "target_total");
    const cJSON *kv_reserved = stats_number(stats, "kv_blocks", "target_reserved");
    if (kv_total != NULL && kv_reserved != NULL && kv_total->valuedouble > 0) {
        const double usage = kv_reserved->valuedouble / kv_total->valuedouble;
        prom_single_labelled(t, "vllm:kv_cache_usage_perc", "gauge",
                             "Fraction of the target's KV blocks reserved by admitted sequences. 1 means 100 percent.",
                             labels, usage);
        prom_single_labelled(t, "vllm:gpu_cache_usage_perc", "gauge",
                             "Deprecated: the same as vllm:kv_cache_usage_perc.", labels, usage);
    }
}

int http_metrics_render_engine(const cJSON *stats, const char *model_name, char **buf, size_t *len, char *err)
{
    if (stats == NULL)
        return 0;
    char *labels = model_labels_of(model_name);
    if (labels == NULL)
        return error_set(err, ERR_NOMEM, "metrics: out of memory");
    struct prom_text t;
    prom_text_init(&t, *buf, *len);
    put_engine_gauges(&t, stats, labels);
    put_engine_counters(&t, stats, labels);
    free(labels);
    *buf = NULL;
    *len = 0;
    return prom_text_finish(&t, buf, len, err);
}
