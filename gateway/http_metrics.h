/* http_metrics.h: the gateway's own Prometheus figures.
 *
 * What it is: request counters by endpoint and HTTP status, histograms of
 * time to first token, time per output token and request latency, and the
 * gauges of requests in flight and requests waiting for their first token
 * (the gateway's queue). Rendered in the Prometheus text format after the
 * coordinator's own text on GET /metrics, the three histograms twice: as
 * tandem_gateway_* and under vLLM's names with its model_name label, so
 * dashboards made for vLLM read them. Beside them, the engine gauges a
 * balancer reads and the token and speculation counters, under vLLM's names
 * (http_metrics_render_engine), taken from the coordinator's stats reply of
 * the same scrape.
 * Threads: every function takes the object's mutex; any thread may call.
 */
#ifndef TANDEM_GATEWAY_HTTP_METRICS_H
#define TANDEM_GATEWAY_HTTP_METRICS_H

#include <stddef.h>

#include <cjson/cJSON.h>

enum http_metrics_endpoint {
    HTTP_METRICS_CHAT = 0,
    HTTP_METRICS_COMPLETIONS,
    HTTP_METRICS_MODELS,
    HTTP_METRICS_HEALTH,
    HTTP_METRICS_METRICS,
    HTTP_METRICS_OTHER,
    HTTP_METRICS_ENDPOINT_COUNT,
};

struct http_metrics;

int http_metrics_create(struct http_metrics **out, char *err);
void http_metrics_destroy(struct http_metrics *m);   /* NULL-safe */

/* One finished HTTP request (any endpoint, any status). */
void http_metrics_request_done(struct http_metrics *m, enum http_metrics_endpoint ep, int status);
/* A generation starts (in flight and waiting) / got its first token (no
 * longer waiting; ttft_s observed) / ended (tokens after the first over
 * decode_s give the per-output-token time; e2e_s observed). */
void http_metrics_generation_start(struct http_metrics *m);
void http_metrics_generation_first(struct http_metrics *m, double ttft_s);
void http_metrics_generation_end(struct http_metrics *m, int got_first, int n_tokens, double decode_s,
                                 double e2e_s);

/* Appends the Prometheus text to *buf (malloc'd, grown as needed; *len its
 * length): the tandem_gateway_* series, then the same three histograms as
 *   vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds,
 *   vllm:e2e_request_latency_seconds    {model_name=model_name} (escaped here)
 * 0 or ERR_NOMEM. */
int http_metrics_render(struct http_metrics *m, const char *model_name, char **buf, size_t *len, char *err);

/* Appends, under vLLM's exact names and with vLLM's model_name label, the
 * gauges llm-d's inference scheduler (Gateway API Inference Extension) reads
 * from every model server, computed from the coordinator's stats reply
 * (docs/protocol.md, "stats"):
 *   vllm:num_requests_waiting   requests.queued (waiting for a slot)
 *   vllm:num_requests_running   requests.active (sequences being generated)
 *   vllm:kv_cache_usage_perc    kv_blocks.target_reserved / target_total, 0..1
 *   vllm:gpu_cache_usage_perc   the same (vLLM's deprecated name, which older
 *                               schedulers read)
 * and the counters vLLM's dashboards read, from the same reply:
 *   vllm:prompt_tokens_total                   tokens.prompt
 *   vllm:generation_tokens_total               tokens.generated
 *   vllm:spec_decode_num_drafts_total          spec.num_drafts (rounds with drafts)
 *   vllm:spec_decode_num_draft_tokens_total    spec.num_draft_tokens
 *   vllm:spec_decode_num_accepted_tokens_total spec.num_accepted_tokens
 *   vllm:spec_decode_num_accepted_tokens_per_pos_total{position}
 *                                              spec.accepted_per_pos
 * stats NULL (the coordinator did not answer): nothing is appended, so the
 * series are absent rather than zero (a zero would call an unknown replica
 * idle). A field missing or not a number leaves its gauge out; so does a
 * target pool of 0 blocks (no target registered: usage unknown).
 * model_name is escaped here. *buf and *len as in http_metrics_render.
 * Reads nothing of the object's state. 0 or ERR_NOMEM. */
int http_metrics_render_engine(const cJSON *stats, const char *model_name, char **buf, size_t *len, char *err);

#endif
