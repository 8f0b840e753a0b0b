/* metrics.h: the coordinator's counters and their two renderings (the JSON
 * of a "stats" reply and Prometheus text).
 *
 * What it is: plain counters the coordinator bumps as requests and rounds
 * finish, plus a snapshot of gauges it passes in at render time (workers,
 * queue). Prometheus names follow vLLM's where dashboards know them:
 * tandem_spec_decode_num_drafts_total, ..._num_draft_tokens_total,
 * ..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos{position}.
 * What it is not: thread-safe or persistent; one coordinator, one thread.
 */
#ifndef TANDEM_COORDINATOR_METRICS_H
#define TANDEM_COORDINATOR_METRICS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#define METRICS_POS_MAX 16

enum metrics_error {
    METRICS_ERR_INVALID_REQUEST = 0,
    METRICS_ERR_OVERLOADED,
    METRICS_ERR_TARGET_UNAVAILABLE,
    METRICS_ERR_CONTEXT_FULL,
    METRICS_ERR_INTERNAL,
    METRICS_ERR_CANCELLED,    /* the client cancelled it, or its replies could not be delivered */
    METRICS_ERR_COUNT,
};

enum metrics_finish {
    METRICS_FINISH_STOP = 0,
    METRICS_FINISH_LENGTH,
    METRICS_FINISH_STOP_STRING,
    METRICS_FINISH_COUNT,
};

struct metrics {
    uint64_t requests_total;          /* generate requests received (valid or not) */
    uint64_t requests_finished[METRICS_FINISH_COUNT];
    uint64_t requests_failed[METRICS_ERR_COUNT];
    uint64_t prompt_tokens_total;
    uint64_t generated_tokens_total;
    uint64_t verify_rounds_total;     /* every target call after prefill, k = 0 included */
    uint64_t num_drafts_total;        /* rounds with k > 0 */
    uint64_t num_draft_tokens_total;
    uint64_t num_accepted_tokens_total;
    uint64_t accepted_per_pos[METRICS_POS_MAX];
    uint64_t predraft_offered_total;
    uint64_t predraft_used_total;
    uint64_t target_only_rounds_total;  /* k = 0 because no draft was available */
    double queue_ms_total, prefill_ms_total, decode_ms_total;
    double draft_ms_total, verify_ms_total;
    uint64_t target_idle_samples;     /* verify_done messages that reported idle_ms */
    double target_idle_ms_total, target_idle_ms_max;
    /* Measured by the coordinator: from a verify_done that left the target
     * with nothing to do until the next round's verify was sent. */
    uint64_t target_gap_samples;
    double target_gap_ms_total, target_gap_ms_max;
    uint64_t worker_registrations[2]; /* [0] draft, [1] target */
    uint64_t worker_losses[2];
    uint64_t draft_refusals;
};

/* State the coordinator knows at render time. */
struct metrics_gauges {
    int active;
    int queued;
    int max_concurrency;
    int max_queue;
    int draft_up, target_up;
    int draft_pid, target_pid;
    const char *draft_model, *target_model;
    double uptime_s;
};

void metrics_init(struct metrics *m);

/* The "stats" reply's fields, added to obj. Returns 0 or ERR_NOMEM. */
int metrics_add_json(const struct metrics *m, const struct metrics_gauges *g, cJSON *obj, char *err);

/* Prometheus text exposition format (malloc'd, NUL-terminated; caller frees).
 * Returns 0 or ERR_NOMEM. */
int metrics_prometheus(const struct metrics *m, const struct metrics_gauges *g, char **text_out,
                       char *err);

const char *metrics_error_name(enum metrics_error e);
const char *metrics_finish_name(enum metrics_finish f);

#endif
