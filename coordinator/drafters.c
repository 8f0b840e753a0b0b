/* drafters.c: see drafters.h. */
#include <stdlib.h>
#include <string.h>

#include "constraint.h"
#include "drafters.h"

#include "logging.h"

/* Source "auto" takes a suffix-cache match over the draft model only when
 * it covers this many tokens of the sequence: a long shared context is a
 * repeat (a retried request, a loop of an agent), a short one often a
 * coincidence whose drafts would displace the model's. */
#define AUTO_SUFFIX_MIN_MATCH 8
/* What a source's drafts are assumed to be worth before a request has
 * seen any (per-draft acceptance, and how many drafts that guess weighs):
 * a suffix match is usually a repeat, an n-gram a guess. */
#define SUFFIX_PRIOR_ACCEPT 0.9
#define NGRAM_PRIOR_ACCEPT 0.6
#define PRIOR_DRAFTS 4.0
/* A source whose drafts do not pay at the prior still gets this many put
 * to the test per request, two a round: a request that repeats itself
 * shows it within a few rounds. */
#define PROBE_DRAFTS 8

int drafters_worth_k(double accept, int k_max, double call_ms_base, double call_ms_per_row, int batch)
{
    if (call_ms_base <= 0 && call_ms_per_row <= 0)
        return k_max;
    const double base = call_ms_base / (batch > 1 ? batch : 1);
    int best = 0;
    double best_rate = 1.0 / (base + call_ms_per_row);
    double tokens = 1.0, reach = 1.0; /* expected tokens of a round of k drafts: sum of accept^i, i <= k */
    for (int k = 1; k <= k_max; k++) {
        reach *= accept;
        tokens += reach;
        const double rate = tokens / (base + call_ms_per_row * (k + 1));
        if (rate > best_rate) {
            best_rate = rate;
            best = k;
        }
    }
    return best;
}

/* The per-draft acceptance s has seen from source (its prior before). */
static double accept_of(const struct seq *s, enum request_draft source)
{
    const int i = source == REQUEST_DRAFT_SUFFIX;
    const double prior = i ? SUFFIX_PRIOR_ACCEPT : NGRAM_PRIOR_ACCEPT;
    return (s->match_accepted[i] + prior * PRIOR_DRAFTS) / (s->match_trials[i] + PRIOR_DRAFTS);
}

void drafters_learn(struct seq *s, enum request_draft source, int k, int n_acc)
{
    const int i = source == REQUEST_DRAFT_SUFFIX;
    /* the drafts that were put to the test: every accepted one, and the
     * first rejected */
    s->match_accepted[i] += n_acc;
    s->match_trials[i] += n_acc + (n_acc < k);
}

/* The prediction's tokens after the output so far: where the output is
 * still the prediction's start, what follows it; else what follows the
 * latest PREDICTION_MATCH_MIN or more output tokens found in the
 * prediction, the occurrence nearest the last one used (an edit shifts
 * the rest of the text, it does not reorder it). 0: no match. */
#define PREDICTION_MATCH_MIN 3
#define PREDICTION_MATCH_MAX 16
static int prediction_draft(const struct seq *s, int k_cap, int32_t *drafts)
{
    const int32_t *out = s->hist + s->n_prompt, *pred = s->pred;
    const int n_out = s->n_hist - s->n_prompt, n_pred = s->n_pred;
    int start = -1;
    if (n_out <= n_pred && memcmp(out, pred, (size_t)n_out * sizeof *out) == 0)
        start = n_out;
    for (int m = n_out < PREDICTION_MATCH_MAX ? n_out : PREDICTION_MATCH_MAX; start < 0 && m >= PREDICTION_MATCH_MIN;
         m--) {
        int best = -1;
        for (int j = 0; j + m <= n_pred; j++) {
            if (memcmp(pred + j, out + n_out - m, (size_t)m * sizeof *out) != 0)
                continue;
            if (best < 0 || abs(j + m - s->pred_at) < abs(best - s->pred_at))
                best = j + m;
        }
        start = best;
    }
    if (start < 0 || start >= n_pred)
        return 0;
    ((struct seq *)s)->pred_at = start; /* the search's hint, not the round's state */
    const int k = n_pred - start < k_cap ? n_pred - start : k_cap;
    memcpy(drafts, pred + start, (size_t)k * sizeof *drafts);
    return k;
}

int drafters_propose(struct coordinator *c, const struct seq *s, bool model_usable, int k_cap, int32_t *drafts,
                     enum request_draft *source)
{
    /* the request's own prediction first, whatever its source: it is what
     * the client expects the output to be (edits of a given text), and the
     * target keeps the output exact whatever it drafts */
    if (s->n_pred > 0) {
        int k = prediction_draft(s, k_cap, drafts);
        if (k > 0 && (k = constraint_cut(c, s, drafts, k)) > 0) {
            *source = REQUEST_DRAFT_PREDICTION;
            return k;
        }
    }
    const bool greedy = sampling_params_is_greedy(&s->sp);
    /* sampled requests under "auto" keep the model: a point-mass draft
     * spends other random draws, and a seed should reproduce its output
     * whatever the cache holds */
    const bool try_suffix = c->suffix != NULL &&
                            (s->draft == REQUEST_DRAFT_SUFFIX || (s->draft == REQUEST_DRAFT_AUTO && greedy));
    const bool try_ngram = s->draft == REQUEST_DRAFT_NGRAM || (s->draft == REQUEST_DRAFT_AUTO && greedy);
    int k = 0;
    if (try_suffix) {
        int match = 0;
        k = suffix_cache_draft(c->suffix, s->hist, s->n_hist, k_cap, drafts, &match);
        if (k > 0 && s->draft == REQUEST_DRAFT_AUTO && match < AUTO_SUFFIX_MIN_MATCH && model_usable)
            k = 0;
        if (k > 0)
            *source = REQUEST_DRAFT_SUFFIX;
    }
    if (k == 0 && try_ngram) {
        /* beside a usable model, "auto" takes only a match of the longest
         * context: a sequence repeating itself, not a coincidence */
        struct ngram_params np = c->ngram;
        if (s->draft == REQUEST_DRAFT_AUTO && model_usable)
            np.n_min = np.n_max;
        k = ngram_draft(&np, s->hist, s->n_hist, k_cap, drafts);
        *source = REQUEST_DRAFT_NGRAM;
    }
    /* a draft the grammar refuses is rejected at its row: not worth one */
    k = constraint_cut(c, s, drafts, k);
    if (k == 0)
        return 0;
    int worth = drafters_worth_k(accept_of(s, *source), k, coord_pair_of(c, s)->call_ms_base,
                                 coord_pair_of(c, s)->call_ms_per_row, coord_pair_of(c, s)->n_active);
    if (worth == 0 && s->match_trials[*source == REQUEST_DRAFT_SUFFIX] < PROBE_DRAFTS)
        worth = k < 2 ? k : 2;
    if (worth < k)
        LOG_DEBUG("request \"%s\": %d of %d %s drafts worth a verification row (acceptance %.2f)", s->id, worth, k,
                  request_draft_name(*source), accept_of(s, *source));
    return worth;
}

/* Most candidates an n-gram tree node takes (ngram_draft_tree's branch):
 * the runner-up beside the best, the shape the in-process measurement
 * found paying (docs/perf/cpu-token-trees.md). */
#define NGRAM_TREE_BRANCH 2

int drafters_tree_budget(const struct coordinator *c, const struct seq *s)
{
    int budget = s->spec_tree;
    if (budget == REQUEST_SPEC_TREE_AUTO) {
        /* measured (tree_choice.h), alone only: in a batch every tree's
         * rows are every sequence's cost, and that is not measured */
        const struct pair *p = &c->pair[s->pair];
        if (p->n_active > 1 || !tree_choice_trees(&p->trees))
            return 0;
        budget = DRAFTERS_AUTO_TREE_NODES;
    }
    if (budget < REQUEST_SPEC_TREE_MIN)
        return 0; /* off */
    if (s->draft != REQUEST_DRAFT_SUFFIX && s->draft != REQUEST_DRAFT_NGRAM && s->draft != REQUEST_DRAFT_AUTO)
        return 0;
    /* what the target's tree path does not do yet (specdec_tree_check),
     * and a prediction, which drafts a chain first */
    if (s->n_pred > 0 || s->lp.on || sampling_controls_active(&s->ctl) || s->grammar != NULL)
        return 0;
    if (strcmp(coord_target_of(c, s)->backend, "cpu") != 0)
        return 0;
    const int nodes = budget - 1; /* the budget counts the root */
    return nodes < DRAFT_TREE_NODES_MAX ? nodes : DRAFT_TREE_NODES_MAX;
}

int drafters_propose_tree(struct coordinator *c, const struct seq *s, bool model_usable, int depth_max,
                          int nodes_max, struct draft_tree *out, enum request_draft *source)
{
    draft_tree_clear(out);
    const bool greedy = sampling_params_is_greedy(&s->sp);
    const bool try_suffix = c->suffix != NULL &&
                            (s->draft == REQUEST_DRAFT_SUFFIX || (s->draft == REQUEST_DRAFT_AUTO && greedy));
    const bool try_ngram = s->draft == REQUEST_DRAFT_NGRAM || (s->draft == REQUEST_DRAFT_AUTO && greedy);
    int n = 0;
    if (try_suffix) {
        int match = 0;
        n = suffix_cache_draft_tree(c->suffix, s->hist, s->n_hist, depth_max, nodes_max, out, &match);
        if (n > 0 && s->draft == REQUEST_DRAFT_AUTO && match < AUTO_SUFFIX_MIN_MATCH && model_usable)
            n = 0;
        if (n > 0)
            *source = REQUEST_DRAFT_SUFFIX;
    }
    if (n == 0 && try_ngram) {
        struct ngram_params np = c->ngram;
        if (s->draft == REQUEST_DRAFT_AUTO && model_usable)
            np.n_min = np.n_max;
        n = ngram_draft_tree(&np, s->hist, s->n_hist, depth_max, nodes_max, NGRAM_TREE_BRANCH, out);
        *source = REQUEST_DRAFT_NGRAM;
    }
    if (n == 0)
        draft_tree_clear(out);
    return n;
}

bool drafters_tree_is_chain(const struct draft_tree *t)
{
    for (int i = 0; i < t->n; i++)
        if (t->parents[i] != i - 1)
            return false;
    return true;
}

void drafters_remember(struct coordinator *c, const struct seq *s)
{
    if (c->suffix != NULL && suffix_cache_add(c->suffix, s->hist, s->n_hist) != 0)
        LOG_WARN("request \"%s\": not kept in the suffix cache: out of memory", s->id);
}
