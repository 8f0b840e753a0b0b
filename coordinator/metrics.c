/* metrics.c: rendering of the coordinator's counters (metrics.h).
 *
 * Invariant: both renderings read the same struct, so the JSON and the
 * Prometheus text of one stats reply always agree.
 */
#include "metrics.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "prom_text.h"

static const char *const error_names[METRICS_ERR_COUNT] = {
    "invalid_request", "overloaded", "target_unavailable", "context_full", "internal", "cancelled",
};
static const char *const finish_names[METRICS_FINISH_COUNT] = {"stop", "length", "stop_string"};

const char *metrics_error_name(enum metrics_error e)
{
    return (unsigned)e < METRICS_ERR_COUNT ? error_names[e] : "internal";
}

const char *metrics_finish_name(enum metrics_finish f)
{
    return (unsigned)f < METRICS_FINISH_COUNT ? finish_names[f] : "stop";
}

void metrics_init(struct metrics *m)
{
    memset(m, 0, sizeof(*m));
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0.0;
}

static const char *const batch_le[METRICS_BATCH_BUCKETS] = {"1", "2", "4", "8", "16", "32", "64",
                                                            "128", "+Inf"};

void metrics_note_target_call(struct metrics *m, int seqs, int rows, double ms)
{
    m->target_calls_total++;
    m->target_call_seqs_total += (uint64_t)(seqs > 0 ? seqs : 0);
    m->target_call_rows_total += (uint64_t)(rows > 0 ? rows : 0);
    m->target_call_ms_total += ms;
    int b = 0;
    while (b < METRICS_BATCH_BUCKETS - 1 && seqs > (1 << b))
        b++;
    m->target_call_batch[b]++;
}

struct prefix_sums {
    uint64_t queries, hits, evictions;
    int cached_blocks;
};

static void prefix_add(struct prefix_sums *sum, const struct metrics *m, int p, int r)
{
    sum->queries += m->prefix_queries[p][r];
    sum->hits += m->prefix_hits[p][r];
    sum->cached_blocks += m->prefix_cached_blocks[p][r];
    sum->evictions += m->prefix_evictions[p][r];
}

static bool add_prefix_json(cJSON *worker, const struct prefix_sums *sum)
{
    cJSON *pc = cJSON_AddObjectToObject(worker, "prefix_cache");
    return pc != NULL && cJSON_AddNumberToObject(pc, "queries", (double)sum->queries) &&
           cJSON_AddNumberToObject(pc, "hits", (double)sum->hits) &&
           cJSON_AddNumberToObject(pc, "hit_rate", ratio((double)sum->hits, (double)sum->queries)) &&
           cJSON_AddNumberToObject(pc, "cached_blocks", sum->cached_blocks) &&
           cJSON_AddNumberToObject(pc, "evictions", (double)sum->evictions);
}

/* One pair's entry of workers.pairs. */
static bool add_pair_json(const struct metrics *m, const struct metrics_pair_gauges *pg, int p, cJSON *pairs)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || !cJSON_AddItemToArray(pairs, o)) {
        cJSON_Delete(o);
        return false;
    }
    bool ok = cJSON_AddNumberToObject(o, "pair", p) && cJSON_AddNumberToObject(o, "active", pg->active) &&
              cJSON_AddNumberToObject(o, "admitted", (double)pg->admitted) &&
              cJSON_AddNumberToObject(o, "target_calls", (double)pg->target_calls) &&
              cJSON_AddBoolToObject(o, "cores_shared", pg->cores_shared);
    static const char *const roles[2] = {"draft", "target"};
    for (int r = 0; ok && r < 2; r++) {
        cJSON *w = cJSON_AddObjectToObject(o, roles[r]);
        struct prefix_sums sum = {0};
        prefix_add(&sum, m, p, r);
        ok = w != NULL && cJSON_AddBoolToObject(w, "up", pg->up[r]) &&
             cJSON_AddNumberToObject(w, "pid", pg->pid[r]) &&
             cJSON_AddStringToObject(w, "model", pg->model[r] ? pg->model[r] : "") &&
             cJSON_AddBoolToObject(w, "lane", pg->lane[r]) &&
             cJSON_AddNumberToObject(w, "kv_blocks", pg->kv_blocks[r]) &&
             cJSON_AddNumberToObject(w, "kv_reserved", pg->kv_reserved[r]) && add_prefix_json(w, &sum);
    }
    return ok;
}

/* A number under key in o; ok stays false once one could not be added. */
#define NUM(o, k, v) ok = ok && cJSON_AddNumberToObject((o), (k), (double)(v)) != NULL

static bool add_requests_json(const struct metrics *m, const struct metrics_gauges *g, cJSON *obj)
{
    uint64_t finished = 0, failed = 0;
    for (int i = 0; i < METRICS_FINISH_COUNT; i++)
        finished += m->requests_finished[i];
    for (int i = 0; i < METRICS_ERR_COUNT; i++)
        failed += m->requests_failed[i];
    cJSON *req = cJSON_AddObjectToObject(obj, "requests");
    cJSON *errors = req ? cJSON_AddObjectToObject(req, "errors") : NULL;
    cJSON *fin = req ? cJSON_AddObjectToObject(req, "finished_by") : NULL;
    bool ok = errors != NULL && fin != NULL;
    NUM(req, "total", m->requests_total);
    NUM(req, "finished", finished);
    NUM(req, "failed", failed);
    NUM(req, "active", g->active);
    NUM(req, "queued", g->queued);
    NUM(req, "max_concurrency", g->max_concurrency);
    NUM(req, "max_queue", g->max_queue);
    NUM(req, "slow_client_cancels", m->slow_client_cancels_total);
    NUM(req, "replies_undelivered", m->replies_undelivered_total);
    NUM(req, "replies_withheld", m->replies_withheld_total);
    for (int i = 0; i < METRICS_ERR_COUNT; i++)
        NUM(errors, error_names[i], m->requests_failed[i]);
    for (int i = 0; i < METRICS_FINISH_COUNT; i++)
        NUM(fin, finish_names[i], m->requests_finished[i]);
    return ok;
}

/* Tokens, and the target's forward calls and KV blocks. */
static bool add_tokens_json(const struct metrics *m, const struct metrics_gauges *g, cJSON *obj)
{
    cJSON *tok = cJSON_AddObjectToObject(obj, "tokens");
    cJSON *batch = cJSON_AddObjectToObject(obj, "batch");
    cJSON *hist = batch ? cJSON_AddObjectToObject(batch, "seqs_per_call") : NULL;
    cJSON *kv = cJSON_AddObjectToObject(obj, "kv_blocks");
    bool ok = tok != NULL && hist != NULL && kv != NULL;
    NUM(tok, "prompt", m->prompt_tokens_total);
    NUM(tok, "generated", m->generated_tokens_total);
    double decode_s = m->decode_ms_total / 1000.0;
    NUM(tok, "tokens_per_s", ratio((double)m->generated_tokens_total, decode_s + m->prefill_ms_total / 1000.0));
    /* the server's throughput: tokens over the time anything was active */
    NUM(tok, "aggregate_tokens_per_s", ratio((double)m->generated_tokens_total, g->busy_ms / 1000.0));
    NUM(tok, "per_request_tokens_per_s",
        ratio(m->request_tokens_per_s_sum, (double)m->request_rate_samples));
    NUM(batch, "target_calls", m->target_calls_total);
    NUM(batch, "mean_seqs_per_call", ratio((double)m->target_call_seqs_total, (double)m->target_calls_total));
    NUM(batch, "mean_rows_per_call", ratio((double)m->target_call_rows_total, (double)m->target_calls_total));
    NUM(batch, "mean_call_ms", ratio(m->target_call_ms_total, (double)m->target_calls_total));
    for (int i = 0; i < METRICS_BATCH_BUCKETS; i++)
        NUM(hist, batch_le[i], m->target_call_batch[i]);
    NUM(kv, "draft_total", g->kv_blocks[0]);
    NUM(kv, "draft_reserved", g->kv_reserved[0]);
    NUM(kv, "target_total", g->kv_blocks[1]);
    NUM(kv, "target_reserved", g->kv_reserved[1]);
    NUM(kv, "admissions_waited", m->kv_waits_total);
    return ok;
}

static bool add_spec_json(const struct metrics *m, cJSON *obj)
{
    cJSON *spec = cJSON_AddObjectToObject(obj, "spec");
    cJSON *pos = spec ? cJSON_AddArrayToObject(spec, "accepted_per_pos") : NULL;
    bool ok = pos != NULL;
    NUM(spec, "rounds", m->verify_rounds_total);
    NUM(spec, "num_drafts", m->num_drafts_total);
    NUM(spec, "num_draft_tokens", m->num_draft_tokens_total);
    NUM(spec, "num_accepted_tokens", m->num_accepted_tokens_total);
    NUM(spec, "acceptance_rate", ratio((double)m->num_accepted_tokens_total, (double)m->num_draft_tokens_total));
    NUM(spec, "mean_accepted_per_round", ratio((double)m->num_accepted_tokens_total, (double)m->num_drafts_total));
    NUM(spec, "predraft_offered", m->predraft_offered_total);
    NUM(spec, "predraft_used", m->predraft_used_total);
    NUM(spec, "predraft_hit_rate", ratio((double)m->predraft_used_total, (double)m->predraft_offered_total));
    NUM(spec, "plain_runs", m->plain_runs_total);
    NUM(spec, "plain_run_steps", m->plain_run_steps_total);
    NUM(spec, "verify_beside_draft", m->beside_draft_total);
    NUM(spec, "verify_beside_draft_failed", m->beside_draft_failed_total);
    NUM(spec, "target_only_rounds", m->target_only_rounds_total);
    NUM(spec, "ngram_drafts", m->ngram_drafts_total);
    NUM(spec, "ngram_draft_tokens", m->ngram_draft_tokens_total);
    NUM(spec, "ngram_accepted_tokens", m->ngram_accepted_tokens_total);
    NUM(spec, "suffix_drafts", m->suffix_drafts_total);
    NUM(spec, "suffix_draft_tokens", m->suffix_draft_tokens_total);
    NUM(spec, "suffix_accepted_tokens", m->suffix_accepted_tokens_total);
    NUM(spec, "tree_rounds", m->tree_rounds_total);
    NUM(spec, "tree_nodes", m->tree_nodes_total);
    NUM(spec, "tree_accepted_tokens", m->tree_accepted_tokens_total);
    for (int i = 0; i < METRICS_POS_MAX && ok; i++) {
        cJSON *n = cJSON_CreateNumber((double)m->accepted_per_pos[i]);
        ok = n != NULL && cJSON_AddItemToArray(pos, n);
    }
    return ok;
}

static bool add_time_json(const struct metrics *m, const struct metrics_gauges *g, cJSON *obj)
{
    uint64_t ended = 0;
    for (int i = 0; i < METRICS_FINISH_COUNT; i++)
        ended += m->requests_finished[i];
    for (int i = 0; i < METRICS_ERR_COUNT; i++)
        ended += m->requests_failed[i];
    cJSON *time = cJSON_AddObjectToObject(obj, "time_ms");
    bool ok = time != NULL;
    NUM(time, "queue", m->queue_ms_total);
    NUM(time, "queue_per_request", ratio(m->queue_ms_total, (double)ended));
    NUM(time, "busy", g->busy_ms);
    NUM(time, "prefill", m->prefill_ms_total);
    NUM(time, "decode", m->decode_ms_total);
    NUM(time, "draft", m->draft_ms_total);
    NUM(time, "verify", m->verify_ms_total);
    NUM(time, "target_idle", m->target_idle_ms_total);
    NUM(time, "target_idle_per_round", ratio(m->target_idle_ms_total, (double)m->target_idle_samples));
    NUM(time, "target_idle_max", m->target_idle_ms_max);
    NUM(time, "target_idle_samples", m->target_idle_samples);
    NUM(time, "target_gap", m->target_gap_ms_total);
    NUM(time, "target_gap_per_round", ratio(m->target_gap_ms_total, (double)m->target_gap_samples));
    NUM(time, "target_gap_max", m->target_gap_ms_max);
    NUM(time, "target_gap_samples", m->target_gap_samples);
    NUM(time, "draft_wait", m->draft_wait_ms_total);
    NUM(time, "draft_wait_per_round", ratio(m->draft_wait_ms_total, (double)m->draft_wait_rounds));
    NUM(time, "draft_wait_max", m->draft_wait_ms_max);
    NUM(time, "draft_wait_rounds", m->draft_wait_rounds);
    return ok;
}

static bool add_workers_json(const struct metrics *m, const struct metrics_gauges *g, cJSON *obj)
{
    cJSON *workers = cJSON_AddObjectToObject(obj, "workers");
    cJSON *draft = workers ? cJSON_AddObjectToObject(workers, "draft") : NULL;
    cJSON *target = workers ? cJSON_AddObjectToObject(workers, "target") : NULL;
    bool ok = draft != NULL && target != NULL;
    ok = ok && cJSON_AddBoolToObject(workers, "cores_shared", g->cores_shared) != NULL;
    ok = ok && cJSON_AddBoolToObject(draft, "up", g->draft_up) != NULL;
    NUM(draft, "pid", g->draft_pid);
    ok = ok && cJSON_AddStringToObject(draft, "model", g->draft_model ? g->draft_model : "") != NULL;
    NUM(draft, "registrations", m->worker_registrations[0]);
    NUM(draft, "losses", m->worker_losses[0]);
    NUM(draft, "refusals", m->draft_refusals);
    ok = ok && cJSON_AddBoolToObject(draft, "lane", g->draft_lane) != NULL;
    ok = ok && cJSON_AddBoolToObject(target, "up", g->target_up) != NULL;
    NUM(target, "pid", g->target_pid);
    ok = ok && cJSON_AddStringToObject(target, "model", g->target_model ? g->target_model : "") != NULL;
    NUM(target, "registrations", m->worker_registrations[1]);
    NUM(target, "losses", m->worker_losses[1]);
    ok = ok && cJSON_AddBoolToObject(target, "lane", g->target_lane) != NULL;
    cJSON *role_obj[2] = {draft, target};
    for (int r = 0; r < 2 && ok; r++) {
        struct prefix_sums sum = {0};
        for (int p = 0; p < g->n_pairs && p < METRICS_PAIRS_MAX; p++)
            prefix_add(&sum, m, p, r);
        ok = add_prefix_json(role_obj[r], &sum);
    }
    cJSON *pairs = ok ? cJSON_AddArrayToObject(workers, "pairs") : NULL;
    ok = ok && pairs != NULL;
    for (int p = 0; ok && p < g->n_pairs && p < METRICS_PAIRS_MAX; p++)
        ok = add_pair_json(m, &g->pairs[p], p, pairs);
    return ok;
}

int metrics_add_json(const struct metrics *m, const struct metrics_gauges *g, cJSON *obj, char *err)
{
    bool ok = add_requests_json(m, g, obj) && add_tokens_json(m, g, obj) && add_spec_json(m, obj) &&
              add_time_json(m, g, obj);
    NUM(obj, "uptime_s", g->uptime_s);
    ok = ok && add_workers_json(m, g, obj);
    if (!ok)
        return error_set(err, ERR_NOMEM, "stats: out of memory");
    return 0;
}
#undef NUM

static void counter(struct prom_text *tb, const char *name, const char *help, double v)
{
    prom_single(tb, name, "counter", help, v);
}

static void gauge(struct prom_text *tb, const char *name, const char *help, double v)
{
    prom_single(tb, name, "gauge", help, v);
}

/* The series of each worker, labelled worker="draft"|"target" and
 * pair="N" (its index in the config's "pairs"). The draft's only where a
 * draft is configured or has registered: a worker that is not part of the
 * deployment is not "down". */
static void per_worker_series(struct prom_text *tb, const struct metrics *m, const struct metrics_gauges *g)
{
    static const char *const roles[2] = {"draft", "target"};
    static const struct {
        const char *name, *type, *help;
    } series[] = {
        {"tandem_worker_up", "gauge", "Whether a worker is registered and alive."},
        {"tandem_prefix_cache_queries_total", "counter", "Prompt tokens looked up in a worker's prefix cache."},
        {"tandem_prefix_cache_hits_total", "counter", "Prompt tokens found in a worker's prefix cache (not computed)."},
        {"tandem_prefix_cache_blocks", "gauge", "KV blocks a worker keeps cached that no sequence holds."},
        {"tandem_prefix_cache_evictions_total", "counter", "Cached KV blocks a worker took back for new content."},
        {"tandem_worker_kv_blocks", "gauge", "KV blocks in a worker's pool (0: not reported)."},
        {"tandem_worker_kv_blocks_reserved", "gauge", "KV blocks reserved in a worker's pool."},
    };
    const int n_pairs = g->n_pairs < METRICS_PAIRS_MAX ? g->n_pairs : METRICS_PAIRS_MAX;
    const int first_role = g->draft_configured || m->worker_registrations[0] > 0 ? 0 : 1;
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++) {
        prom_family(tb, series[i].name, series[i].type, series[i].help);
        for (int p = 0; p < n_pairs; p++)
            for (int r = first_role; r < 2; r++) {
                const struct metrics_pair_gauges *pg = &g->pairs[p];
                const double v = i == 0   ? (double)(pg->up[r] ? 1 : 0)
                                 : i == 1 ? (double)m->prefix_queries[p][r]
                                 : i == 2 ? (double)m->prefix_hits[p][r]
                                 : i == 3 ? (double)m->prefix_cached_blocks[p][r]
                                 : i == 4 ? (double)m->prefix_evictions[p][r]
                                 : i == 5 ? (double)pg->kv_blocks[r]
                                          : (double)pg->kv_reserved[r];
                prom_printf(tb, "%s{worker=\"%s\",pair=\"%d\"} %.17g\n", series[i].name, roles[r], p, v);
            }
    }
    prom_printf(tb, "# HELP tandem_pair_target_calls_total Forward calls a pair's target reported.\n"
                  "# TYPE tandem_pair_target_calls_total counter\n");
    for (int p = 0; p < n_pairs; p++)
        prom_printf(tb, "tandem_pair_target_calls_total{pair=\"%d\"} %llu\n", p,
                  (unsigned long long)g->pairs[p].target_calls);
    prom_printf(tb, "# HELP tandem_pair_requests_active Sequences being generated on a pair.\n"
                  "# TYPE tandem_pair_requests_active gauge\n");
    for (int p = 0; p < n_pairs; p++)
        prom_printf(tb, "tandem_pair_requests_active{pair=\"%d\"} %d\n", p, g->pairs[p].active);
}

/* Requests by outcome. */
static void put_request_series(struct prom_text *tb, const struct metrics *m)
{
    counter(tb, "tandem_requests_total", "Generate requests received.", (double)m->requests_total);
    prom_printf(tb, "# HELP tandem_requests_finished_total Requests that finished, by reason.\n"
                   "# TYPE tandem_requests_finished_total counter\n");
    for (int i = 0; i < METRICS_FINISH_COUNT; i++)
        prom_printf(tb, "tandem_requests_finished_total{finish_reason=\"%s\"} %llu\n", finish_names[i],
                  (unsigned long long)m->requests_finished[i]);
    prom_printf(tb, "# HELP tandem_request_errors_total Requests answered with an error, by code.\n"
                   "# TYPE tandem_request_errors_total counter\n");
    for (int i = 0; i < METRICS_ERR_COUNT; i++)
        prom_printf(tb, "tandem_request_errors_total{code=\"%s\"} %llu\n", error_names[i],
                  (unsigned long long)m->requests_failed[i]);
    counter(tb, "tandem_slow_client_cancels_total",
            "Requests cancelled because their client did not read its replies (queue full).",
            (double)m->slow_client_cancels_total);
    counter(tb, "tandem_replies_undelivered_total",
            "Final replies dropped: the client read nothing for 60 s or went away.",
            (double)m->replies_undelivered_total);
}

/* Tokens and speculation: drafts, sources, pre-drafts, plain runs. */
static void put_spec_series(struct prom_text *tb, const struct metrics *m)
{
    counter(tb, "tandem_prompt_tokens_total", "Prompt tokens prefilled.", (double)m->prompt_tokens_total);
    counter(tb, "tandem_generated_tokens_total", "Tokens generated.", (double)m->generated_tokens_total);
    counter(tb, "tandem_spec_decode_num_drafts_total", "Speculation rounds with at least one drafted token.",
            (double)m->num_drafts_total);
    counter(tb, "tandem_spec_decode_num_draft_tokens_total", "Draft tokens proposed.",
            (double)m->num_draft_tokens_total);
    counter(tb, "tandem_spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
            (double)m->num_accepted_tokens_total);
    prom_printf(tb, "# HELP tandem_spec_decode_num_accepted_tokens_per_pos Accepted draft tokens by position.\n"
                   "# TYPE tandem_spec_decode_num_accepted_tokens_per_pos counter\n");
    for (int i = 0; i < METRICS_POS_MAX; i++)
        prom_printf(tb, "tandem_spec_decode_num_accepted_tokens_per_pos{position=\"%d\"} %llu\n", i,
                  (unsigned long long)m->accepted_per_pos[i]);
    counter(tb, "tandem_ngram_drafts_total", "Rounds whose drafts were n-gram matches.",
            (double)m->ngram_drafts_total);
    counter(tb, "tandem_ngram_draft_tokens_total", "Tokens drafted by n-gram matches.",
            (double)m->ngram_draft_tokens_total);
    counter(tb, "tandem_ngram_accepted_tokens_total", "N-gram drafted tokens accepted.",
            (double)m->ngram_accepted_tokens_total);
    counter(tb, "tandem_suffix_drafts_total", "Rounds whose drafts were suffix-cache matches.",
            (double)m->suffix_drafts_total);
    counter(tb, "tandem_suffix_draft_tokens_total", "Tokens drafted by suffix-cache matches.",
            (double)m->suffix_draft_tokens_total);
    counter(tb, "tandem_suffix_accepted_tokens_total", "Suffix-cache drafted tokens accepted.",
            (double)m->suffix_accepted_tokens_total);
    counter(tb, "tandem_tree_rounds_total", "Rounds whose drafts went as a token tree (verify_tree).",
            (double)m->tree_rounds_total);
    counter(tb, "tandem_tree_nodes_total", "Token tree nodes verified.", (double)m->tree_nodes_total);
    counter(tb, "tandem_tree_accepted_tokens_total", "Token tree nodes accepted (the accepted paths' lengths).",
            (double)m->tree_accepted_tokens_total);
    counter(tb, "tandem_verify_rounds_total", "Target calls after prefill (plain decoding included).",
            (double)m->verify_rounds_total);
    counter(tb, "tandem_target_only_rounds_total", "Rounds decoded without a draft (no draft worker).",
            (double)m->target_only_rounds_total);
    counter(tb, "tandem_predraft_offered_total", "Pre-drafted rounds offered by the draft worker.",
            (double)m->predraft_offered_total);
    counter(tb, "tandem_predraft_used_total", "Pre-drafted rounds used as they were.",
            (double)m->predraft_used_total);
    counter(tb, "tandem_plain_runs_total", "Runs of plain steps the target decoded without a round trip.",
            (double)m->plain_runs_total);
    counter(tb, "tandem_plain_run_steps_total", "Plain steps asked for in runs.",
            (double)m->plain_run_steps_total);
    counter(tb, "tandem_verify_beside_draft_total", "Verifications sent together with their drafts.",
            (double)m->beside_draft_total);
    counter(tb, "tandem_verify_beside_draft_failed_total",
            "Verifications sent with their drafts that the target stopped waiting for.",
            (double)m->beside_draft_failed_total);
}

/* Where the time went: queue, prefill, decode, the workers, the gaps between them. */
static void put_time_series(struct prom_text *tb, const struct metrics *m)
{
    counter(tb, "tandem_queue_seconds_total", "Time requests waited for a slot.", m->queue_ms_total / 1000.0);
    counter(tb, "tandem_prefill_seconds_total", "Time to first token after admission.",
            m->prefill_ms_total / 1000.0);
    counter(tb, "tandem_decode_seconds_total", "Time from first to last token.", m->decode_ms_total / 1000.0);
    counter(tb, "tandem_draft_seconds_total", "Draft worker compute time reported.", m->draft_ms_total / 1000.0);
    counter(tb, "tandem_verify_seconds_total", "Target worker verification time reported.",
            m->verify_ms_total / 1000.0);
    counter(tb, "tandem_target_idle_seconds_total",
            "Target idle time between finishing one verification and starting the next.",
            m->target_idle_ms_total / 1000.0);
    counter(tb, "tandem_target_idle_samples_total", "Verifications that reported their idle gap.",
            (double)m->target_idle_samples);
    counter(tb, "tandem_target_gap_seconds_total",
            "Coordinator-measured time the target had no verification queued between rounds.",
            m->target_gap_ms_total / 1000.0);
    counter(tb, "tandem_target_gap_samples_total", "Rounds whose gap was measured.", (double)m->target_gap_samples);
    counter(tb, "tandem_draft_wait_seconds_total",
            "Time rounds with drafts waited for the draft before their verification was sent.",
            m->draft_wait_ms_total / 1000.0);
    counter(tb, "tandem_draft_wait_rounds_total", "Rounds with drafts whose wait for the draft was measured.",
            (double)m->draft_wait_rounds);
}

int metrics_prometheus(const struct metrics *m, const struct metrics_gauges *g, char **text_out,
                       char *err)
{
    *text_out = NULL;
    struct prom_text tb;
    prom_text_init(&tb, NULL, 0);
    put_request_series(&tb, m);
    put_spec_series(&tb, m);
    put_time_series(&tb, m);
    const struct prom_histogram batch = {
        .le_text = batch_le, .counts = m->target_call_batch, .n_bounds = METRICS_BATCH_BUCKETS - 1,
        .sum = (double)m->target_call_seqs_total, .count = m->target_calls_total};
    prom_histogram(&tb, "tandem_target_batch_size", "Sequences per target forward call.", NULL, &batch);
    counter(&tb, "tandem_target_call_rows_total", "Rows in target forward calls.",
            (double)m->target_call_rows_total);
    counter(&tb, "tandem_busy_seconds_total", "Wall time with at least one active sequence.",
            g->busy_ms / 1000.0);
    gauge(&tb, "tandem_kv_blocks_reserved_target", "KV blocks reserved in the target's pool.",
          g->kv_reserved[1]);
    gauge(&tb, "tandem_kv_blocks_total_target", "KV blocks in the target's pool.", g->kv_blocks[1]);
    gauge(&tb, "tandem_requests_active", "Sequences being generated.", g->active);
    gauge(&tb, "tandem_requests_queued", "Requests waiting for a slot.", g->queued);
    per_worker_series(&tb, m, g);
    prom_printf(&tb, "# HELP tandem_worker_registrations_total Worker registrations accepted.\n"
                   "# TYPE tandem_worker_registrations_total counter\n"
                   "tandem_worker_registrations_total{role=\"draft\"} %llu\n"
                   "tandem_worker_registrations_total{role=\"target\"} %llu\n",
              (unsigned long long)m->worker_registrations[0], (unsigned long long)m->worker_registrations[1]);
    prom_printf(&tb, "# HELP tandem_worker_losses_total Workers declared dead (no heartbeat).\n"
                   "# TYPE tandem_worker_losses_total counter\n"
                   "tandem_worker_losses_total{role=\"draft\"} %llu\n"
                   "tandem_worker_losses_total{role=\"target\"} %llu\n",
              (unsigned long long)m->worker_losses[0], (unsigned long long)m->worker_losses[1]);
    size_t len = 0;
    return prom_text_finish(&tb, text_out, &len, err);
}

void metrics_prefix_report(struct metrics *m, int pair, int role, int looked_up, int cached, int cached_blocks,
                           int64_t evictions)
{
    if (role < 0 || role > 1 || pair < 0 || pair >= METRICS_PAIRS_MAX)
        return;
    m->prefix_queries[pair][role] += (uint64_t)looked_up;
    m->prefix_hits[pair][role] += (uint64_t)cached;
    m->prefix_cached_blocks[pair][role] = cached_blocks;
    /* a count below the last one is a restarted worker counting from 0 */
    const int64_t seen = m->prefix_evictions_seen[pair][role];
    m->prefix_evictions[pair][role] += (uint64_t)(evictions >= seen ? evictions - seen : evictions);
    m->prefix_evictions_seen[pair][role] = evictions;
}
