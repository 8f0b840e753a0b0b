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
/* Draft/target pairs rendered per pair (PROC_CONFIG_PAIRS_MAX; coord_state.h
 * checks they agree). */
#define METRICS_PAIRS_MAX 8
/* Target calls by the number of sequences in them: <= 1, 2, 4, ..., 128, more. */
#define METRICS_BATCH_BUCKETS 9

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
    uint64_t plain_runs_total;          /* verifies asking for more than one plain step */
    uint64_t plain_run_steps_total;     /* the steps they asked for */
    uint64_t beside_draft_total;        /* verifications sent beside their drafts */
    uint64_t beside_draft_failed_total; /* ... that the target gave up waiting for */
    uint64_t target_only_rounds_total;  /* k = 0 because no draft was available */
    /* rounds whose drafts were n-gram or suffix-cache matches made here (also counted in
     * num_drafts_total etc., which count every source) */
    uint64_t ngram_drafts_total, ngram_draft_tokens_total, ngram_accepted_tokens_total;
    uint64_t suffix_drafts_total, suffix_draft_tokens_total, suffix_accepted_tokens_total;
    /* token trees (verify_tree): rounds, nodes verified, accepted path lengths */
    uint64_t tree_rounds_total, tree_nodes_total, tree_accepted_tokens_total;
    double queue_ms_total, prefill_ms_total, decode_ms_total;
    double draft_ms_total, verify_ms_total;
    uint64_t target_idle_samples;     /* verify_done messages that reported idle_ms */
    double target_idle_ms_total, target_idle_ms_max;
    /* Measured by the coordinator: from a verify_done that left the target
     * with nothing to do until the next round's verify was sent. */
    uint64_t target_gap_samples;
    double target_gap_ms_total, target_gap_ms_max;
    /* Rounds with drafts: from the start of the round (the previous
     * verification's reply) until its verification was sent, the time the
     * request and the target waited for the draft (its compute and both
     * hops through the coordinator; 0 for a pre-draft that was there). */
    uint64_t draft_wait_rounds;
    double draft_wait_ms_total, draft_wait_ms_max;
    /* continuous batching: the target's forward calls (counted once each,
     * from the verify_done messages that name them) */
    uint64_t target_calls_total;
    uint64_t target_call_seqs_total, target_call_rows_total;
    double target_call_ms_total;
    uint64_t target_call_batch[METRICS_BATCH_BUCKETS];
    double busy_ms_total;             /* wall time with at least one active sequence */
    double request_tokens_per_s_sum;  /* per finished request: generated / decode time */
    uint64_t request_rate_samples;
    uint64_t kv_waits_total;          /* admissions that waited for KV blocks */
    uint64_t worker_registrations[2]; /* [0] draft, [1] target */
    uint64_t worker_losses[2];
    uint64_t draft_refusals;
    uint64_t slow_client_cancels_total;  /* requests cancelled: the client's queue was full */
    uint64_t replies_undelivered_total;  /* final replies dropped: never read within 60 s, or gone */
    uint64_t replies_withheld_total;     /* replies of a request whose connection dropped (its id may
                                            lead to another client by now) */
    /* the workers' prefix caches ([pair][0] draft, [pair][1] target): prompt
     * tokens looked up and found, from each prompt's reply; blocks kept and
     * evictions as the latest reply said (evictions summed across worker
     * restarts) */
    uint64_t prefix_queries[METRICS_PAIRS_MAX][2], prefix_hits[METRICS_PAIRS_MAX][2];
    int prefix_cached_blocks[METRICS_PAIRS_MAX][2];
    uint64_t prefix_evictions[METRICS_PAIRS_MAX][2];
    int64_t prefix_evictions_seen[METRICS_PAIRS_MAX][2]; /* the worker's own count in its latest reply */
};

/* A worker's reply for a prompt: looked_up tokens, cached of them found;
 * its cache now holds cached_blocks, and it has evicted evictions blocks
 * since it started. role: 0 draft, 1 target, of pair `pair`. */
void metrics_prefix_report(struct metrics *m, int pair, int role, int looked_up, int cached, int cached_blocks,
                           int64_t evictions);

/* One pair's state at render time ([0] draft, [1] target). */
struct metrics_pair_gauges {
    int up[2], lane[2], pid[2];
    const char *model[2];
    int cores_shared;
    int active;                       /* sequences admitted to the pair */
    int kv_blocks[2], kv_reserved[2];
    uint64_t target_calls;            /* forward calls its target reported */
    uint64_t admitted;                /* requests admitted to it */
};

/* State the coordinator knows at render time. */
struct metrics_gauges {
    int active;
    int queued;
    int max_concurrency;
    int max_queue;
    /* the workers in brief: up when any pair's is, the rest of the first
     * pair with one up (pairs[] has every worker) */
    int draft_up, target_up;
    int draft_lane, target_lane;      /* the worker's messages go both ways on its lane (lanes.h) */
    int cores_shared;                 /* the pair computes on the same cores (coord_state.h) */
    int draft_pid, target_pid;
    const char *draft_model, *target_model;
    double uptime_s;
    double busy_ms;                   /* busy_ms_total plus the current busy period */
    int kv_blocks[2], kv_reserved[2]; /* [0] draft, [1] target, summed over the pairs; kv_blocks 0:
                                         not reported */
    int n_pairs;
    struct metrics_pair_gauges pairs[METRICS_PAIRS_MAX];
    /* the config has a draft_worker section (proc_config.draft_configured):
     * without it, and while no draft ever registered, the Prometheus text
     * has no per-worker draft series (a target-only deployment would
     * otherwise show tandem_worker_up{worker="draft"} 0 forever) */
    int draft_configured;
};

/* Counts one target forward call of seqs sequences and rows rows. */
void metrics_note_target_call(struct metrics *m, int seqs, int rows, double ms);

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
