/* local_generate.h: one generate request by token ids through the
 * in-process pipeline (local.h), and what its done reply says as numbers.
 *
 * What it is: the in-process callers' way in (tandem-bench spec, the
 * engine's and the coordinator's tests): a request built from ids and
 * sampling settings, run by the server's own scheduler and roles, the
 * output ids and figures read back from the done reply (docs/protocol.md).
 * What it is not: a second loop; every decision is the scheduler's.
 */
#ifndef TANDEM_LOCAL_GENERATE_H
#define TANDEM_LOCAL_GENERATE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "local.h"
#include "sampling.h"
#include "speculate.h"

/* A done reply's figures. */
struct local_stats {
    int prompt_tokens;
    int generated_tokens;
    int rounds;                  /* verification calls after prefill (plain runs included) */
    int drafted;
    int accepted;
    double prefill_ms;
    double decode_ms;            /* from the first token to the last */
    double draft_ms;
    double verify_ms;
    int tree_rounds, tree_nodes; /* rounds verified as token trees, and their nodes */
    double cost_ratio;           /* the pair's measured c after the request (local_cost_ratio), 0: none */
    int accepted_at[SPECULATE_K_MAX]; /* rounds whose draft position i was accepted */
    char finish_reason[16];      /* "stop", "length", ... */
};

struct local_gen_request {
    const int32_t *prompt;       /* prompt_ids, n_prompt >= 1 */
    int n_prompt;
    int max_tokens;
    struct sampling_params sampling; /* the seed is always sent (below 2^53, as the protocol asks) */
    int spec_k;                  /* < 0: not sent (the configured policy) */
    enum speculate_mode mode;
    const char *draft;           /* the request's "draft"; NULL: not sent */
    int spec_tree;               /* 0: not sent; -1: "off"; 2..32: a node budget (docs/token-trees.md) */
    bool ignore_eos;
};

/* Reads a done reply's usage, timing, spec and finish_reason into st
 * (absent numbers read as 0). */
void local_stats_from_done(const cJSON *done, struct local_stats *st);

/* Where a request's output goes: up to cap ids into ids (the caller's). */
struct local_gen_result {
    int32_t *ids;
    int cap;
    int n;                       /* ids written */
    struct local_stats st;
};

/* Runs rq to its end: its output ids and figures into res (cost_ratio
 * included). 0; or, for an error reply, its code as an error
 * (invalid_request ERR_INVALID_ARG, context_full ERR_CONTEXT_FULL,
 * anything else ERR_INTERNAL) with its message; or local_run's failure. */
int local_generate(struct local *l, const struct local_gen_request *rq, struct local_gen_result *res, char *err);

#endif
