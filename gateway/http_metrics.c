/* http_metrics.c: counters, gauges and fixed-bucket histograms behind one
 * mutex (see http_metrics.h). Bucket bounds follow vLLM's for the same
 * figures, so dashboards read both alike. The engine gauges under vLLM's
 * names hold no state here: each scrape computes them from the stats reply
 * it got. */
#include "http_metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

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

struct text {
    char *buf;
    size_t len, cap;
    int failed;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if (t->buf != NULL && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *b = realloc(t->buf, cap);
        if (b == NULL) {
            t->failed = 1;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
}

static void put_histogram(struct text *t, const char *name, const char *help, const struct histogram *h)
{
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(t, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    put(t, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

static char *label_value(const char *v);

/* The histogram h again under a vLLM name, with its model_name label. */
static void put_histogram_labelled(struct text *t, const char *name, const char *help, const char *model,
                                   const struct histogram *h)
{
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(t, "%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n", name, model, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(t, "%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", name, model, (unsigned long long)cum);
    put(t, "%s_sum{model_name=\"%s\"} %.6f\n%s_count{model_name=\"%s\"} %llu\n", name, model, h->sum, name, model,
        (unsigned long long)h->count);
}

int http_metrics_render(struct http_metrics *m, const char *model_name, char **buf, size_t *len, char *err)
{
    char *model = label_value(model_name);
    if (model == NULL)
        return error_set(err, ERR_NOMEM, "metrics: out of memory");
    struct text t = {.buf = *buf, .len = *len, .cap = *buf ? *len + 1 : 0};
    pthread_mutex_lock(&m->mu);
    put(&t, "# HELP tandem_gateway_requests_total HTTP requests answered by the gateway, by endpoint and status.\n"
            "# TYPE tandem_gateway_requests_total counter\n");
    for (int e = 0; e < HTTP_METRICS_ENDPOINT_COUNT; e++)
        for (int i = 0; i < STATUS_MAX && m->requests[e][i].count > 0; i++)
            put(&t, "tandem_gateway_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", endpoint_names[e],
                m->requests[e][i].status, (unsigned long long)m->requests[e][i].count);
    put(&t, "# HELP tandem_gateway_requests_in_flight Generations the gateway is serving.\n"
            "# TYPE tandem_gateway_requests_in_flight gauge\ntandem_gateway_requests_in_flight %lld\n",
        (long long)m->in_flight);
    put(&t, "# HELP tandem_gateway_requests_waiting Generations waiting for their first token (queue length).\n"
            "# TYPE tandem_gateway_requests_waiting gauge\ntandem_gateway_requests_waiting %lld\n",
        (long long)m->waiting);
    put(&t, "# HELP tandem_gateway_generated_tokens_total Tokens returned through the gateway.\n"
            "# TYPE tandem_gateway_generated_tokens_total counter\ntandem_gateway_generated_tokens_total %llu\n",
        (unsigned long long)m->generated_tokens);
    put_histogram(&t, "tandem_gateway_time_to_first_token_seconds",
                  "From the HTTP request to its first token (or its whole answer when not streamed).", &m->ttft);
    put_histogram(&t, "tandem_gateway_time_per_output_token_seconds",
                  "Decode time per output token after the first, per request.", &m->tpot);
    put_histogram(&t, "tandem_gateway_e2e_request_latency_seconds", "From the HTTP request to its last byte.",
                  &m->e2e);
    /* The same observations under vLLM's names: its dashboards and alerts
     * read these (the buckets are vLLM's too). */
    put_histogram_labelled(&t, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           model, &m->ttft);
    put_histogram_labelled(&t, "vllm:time_per_output_token_seconds",
                           "Histogram of time per output token in seconds.", model, &m->tpot);
    put_histogram_labelled(&t, "vllm:e2e_request_latency_seconds",
                           "Histogram of end to end request latency in seconds.", model, &m->e2e);
    pthread_mutex_unlock(&m->mu);
    free(model);
    *buf = t.buf;
    *len = t.len;
    if (t.failed)
        return error_set(err, ERR_NOMEM, "metrics: out of memory");
    return 0;
}

/* The stats reply's number obj.key, or NULL. */
static const cJSON *stats_number(const cJSON *stats, const char *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(stats, obj), key);
    return cJSON_IsNumber(v) ? v : NULL;
}

/* A label value in the text format: backslash, double quote and line feed
 * escaped. NULL when out of memory; the caller frees. */
static char *label_value(const char *v)
{
    char *out = malloc(2 * strlen(v) + 1), *o = out;
    if (out == NULL)
        return NULL;
    for (; *v != '\0'; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n')
            *o++ = '\\';
        *o++ = *v == '\n' ? 'n' : *v;
    }
    *o = '\0';
    return out;
}

static void put_engine_gauge(struct text *t, const char *name, const char *help, const char *model, double v)
{
    put(t, "# HELP %s %s\n# TYPE %s gauge\n%s{model_name=\"%s\"} %.9g\n", name, help, name, name, model, v);
}

static void put_engine_counter(struct text *t, const char *name, const char *help, const char *model, const cJSON *v)
{
    if (v != NULL)
        put(t, "# HELP %s %s\n# TYPE %s counter\n%s{model_name=\"%s\"} %.17g\n", name, help, name, name, model,
            v->valuedouble);
}

/* The token and speculation counters of the stats reply, under vLLM's
 * names; each left out when the reply lacks it. */
static void put_engine_counters(struct text *t, const cJSON *stats, const char *model)
{
    put_engine_counter(t, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", model,
                       stats_number(stats, "tokens", "prompt"));
    put_engine_counter(t, "vllm:generation_tokens_total", "Number of generation tokens processed.", model,
                       stats_number(stats, "tokens", "generated"));
    put_engine_counter(t, "vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", model,
                       stats_number(stats, "spec", "num_drafts"));
    put_engine_counter(t, "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", model,
                       stats_number(stats, "spec", "num_draft_tokens"));
    put_engine_counter(t, "vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", model,
                       stats_number(stats, "spec", "num_accepted_tokens"));
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(stats, "spec"),
                                                        "accepted_per_pos");
    if (!cJSON_IsArray(pos))
        return;
    put(t, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.\n"
           "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
    int i = 0;
    const cJSON *v = NULL;
    cJSON_ArrayForEach(v, pos) {
        if (cJSON_IsNumber(v))
            put(t, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"%s\",position=\"%d\"} %.17g\n",
                model, i, v->valuedouble);
        i++;
    }
}

int http_metrics_render_engine(const cJSON *stats, const char *model_name, char **buf, size_t *len, char *err)
{
    if (stats == NULL)
        return 0;
    const cJSON *queued = stats_number(stats, "requests", "queued");
    const cJSON *active = stats_number(stats, "requests", "active");
    const cJSON *kv_total = stats_number(stats, "kv_blocks", "target_total");
    const cJSON *kv_reserved = stats_number(stats, "kv_blocks", "target_reserved");
    char *model = label_value(model_name);
    if (model == NULL)
        return error_set(err, ERR_NOMEM, "metrics: out of memory");
    struct text t = {.buf = *buf, .len = *len, .cap = *buf ? *len + 1 : 0};
    if (queued != NULL)
        put_engine_gauge(&t, "vllm:num_requests_waiting", "Requests queued in the coordinator, waiting for a slot.",
                         model, queued->valuedouble);
    if (active != NULL)
        put_engine_gauge(&t, "vllm:num_requests_running", "Sequences being generated (holding a slot).", model,
                         active->valuedouble);
    /* Reserved, not written: admission reserves a sequence's prompt and
     * max_tokens up front (docs/batching.md), so this is what decides
     * whether the next request waits, the figure a balancer wants. */
    if (kv_total != NULL && kv_reserved != NULL && kv_total->valuedouble > 0) {
        double usage = kv_reserved->valuedouble / kv_total->valuedouble;
        put_engine_gauge(&t, "vllm:kv_cache_usage_perc",
                         "Fraction of the target's KV blocks reserved by admitted sequences. 1 means 100 percent.",
                         model, usage);
        put_engine_gauge(&t, "vllm:gpu_cache_usage_perc", "Deprecated: the same as vllm:kv_cache_usage_perc.", model,
                         usage);
    }
    put_engine_counters(&t, stats, model);
    free(model);
    *buf = t.buf;
    *len = t.len;
    if (t.failed)
        return error_set(err, ERR_NOMEM, "metrics: out of memory");
    return 0;
}
