/* adaptive_k.h: how many tokens to draft next round, from measurements.
 *
 * What it is not: it runs no model and reads no clock; the caller times each
 * round and calls adaptive_k_update, then asks adaptive_k_next. The in-process
 * loop and the coordinator's scheduler both use it, which is why it lives in
 * spec/ (no model) rather than beside the draft and target halves.
 */
#ifndef TANDEM_ADAPTIVE_K_H
#define TANDEM_ADAPTIVE_K_H

#include <stdbool.h>

#include "speculate.h"

/* Adaptive K (Leviathan et al. 2023, section 3.5): tokens per round
 * E(a, k) = (1 - a^(k+1)) / (1 - a) against the round's measured cost
 * k * t_draft + t_verify(k), compared with plain decoding's t_verify(0).
 * Acceptance a and the times are running averages measured on this sequence
 * (the draft/target cost ratio c = t_draft / t_verify(0) is measured, not
 * assumed). K = 0 means plain decoding; while at 0 the controller probes
 * K = 1 now and then so a sequence whose drafts start matching again can
 * win speculation back; while at K > 0 it runs a plain round (K = 0) now
 * and then, so the cost it compares with is plain decoding as it is now
 * (in the three-process pipeline on shared cores, a verification runs
 * slower while the draft works beside it, and only a plain round shows what
 * the target costs alone). */
/* Load levels: one sequence alone, then batches of 2-3, 4-7, 8-15, 16 and
 * more (adaptive_k_load_level). */
#define ADAPTIVE_K_LOAD_LEVELS 5

/* What rounds cost in wall time at one load level. They belong to the pair
 * (its hardware, its batch), not to a sequence's content: where the caller
 * hands a table (adaptive_k_load.costs) every sequence of the pair reads
 * and teaches the same one, so one sequence's rounds at a level price the
 * others' at once; else the controller keeps its own. */
struct adaptive_k_costs {
    double plain_ms;        /* running average of plain rounds' wall time (0: none yet) */
    double extra_ms;        /* running average of a drafting round's wall time beyond
                             * its draft_ms + priced verification */
    int spec_rounds;        /* drafting rounds extra_ms was learnt from */
};

/* This sequence's own drafting rounds at one load level: their wall time
 * per token depends on its acceptance, so they are never shared. */
struct adaptive_k_wall {
    int spec_rounds;        /* drafting rounds whose wall time was measured */
    double spec_ms_sum, spec_tokens_sum; /* decayed sums over those rounds: their
                                          * measured wall time per token */
};

struct adaptive_k {
    int k_fixed;            /* > 0: always this K (still clipped by the context) */
    int k_max;
    int k_current;
    double accepted_sum;    /* decayed count of accepted drafts */
    double trials_sum;      /* decayed count of acceptance tests (accepted + rejected) */
    double accept_rate;     /* estimate of a: the sums plus a weak prior */
    int trials_seen;        /* acceptance tests seen, undecayed */
    double draft_ms_per_token;
    bool draft_warm;        /* a drafting round's cost was seen (and dropped: see k_update) */
    double verify_ms_base;  /* cost of a one-row target call */
    double verify_ms_per_row; /* extra cost of each further row */
    /* decayed sums of the (k, verify_ms) pairs: the line base + per_row * k
     * is fitted to them */
    double fit_w, fit_k, fit_kk, fit_v, fit_kv;
    /* Running average of the verification cost of rounds at each k, and the
     * round it was last fed (rounds_observed): where the cost of k rows is
     * not a line (the CPU's one-row product is another kernel than its
     * multi-row one), a K that was run is priced at what it cost. */
    double verify_at_ms[SPECULATE_K_MAX + 1];
    int verify_at_round[SPECULATE_K_MAX + 1];
    bool verify_warm[SPECULATE_K_MAX + 1]; /* a round at this k was verified (see k_update) */
    double plain_ms;        /* running average of plain rounds' verify_ms (0: none yet) */
    int rounds_since_plain; /* rounds since the last plain one */
    int plain_interval_wall; /* in wall time: drafting rounds between plain ones */
    int rounds_observed;
    int rounds_since_probe;
    int probe_interval;     /* rounds at K = 0 before the next probe; doubles while probes fail */
    bool probing;           /* the last K handed out was a probe from K = 0 */
    /* The round as the request experiences it (adaptive_k_update_wall), where
     * that is more than the draft's and the target's compute: in the
     * three-process pipeline each round crosses the coordinator, a fresh
     * draft adds two more hops, and on shared cores whatever the draft does
     * beside a verification slows it. Kept per load level (the batch the
     * round was decided under, adaptive_k_load_level): in a batch a
     * drafting round also waits for the call its sequence missed while its
     * draft was made, so a round alone says nothing of a round in a batch
     * of 16, and the other way. */
    struct adaptive_k_costs costs[ADAPTIVE_K_LOAD_LEVELS]; /* its own, without a shared table */
    struct adaptive_k_costs *shared_costs; /* the table of the last decision's load, or NULL */
    struct adaptive_k_wall wall[ADAPTIVE_K_LOAD_LEVELS];
    int load_level;         /* of the round last decided (adaptive_k_next*) */
    /* The shared call's price that round was decided with, base + per_row
     * * (k + 1) for k drafts (per_row already times the batch); base 0:
     * not under load. Its wall time's excess is taken over this price, so
     * that the price plus the excess is what such rounds took. */
    double load_call_base, load_call_per_row;
    /* Pre-drafting (adaptive_k_predraft): decayed sums of drafting rounds'
     * wall time and tokens, [0] rounds drafted without a pre-draft, [1] with
     * one (a fresh round that asked for it and a round that used it). */
    double predraft_ms[2], predraft_tokens[2];
    int predraft_rounds[2];
    bool predraft_on;       /* the choice, once both are measured */
    int predraft_trial_left; /* drafting rounds left trying the other choice */
    int predraft_since_trial;
};

void adaptive_k_init(struct adaptive_k *kc, int k_fixed, int k_max);
/* adaptive_k_init for a controller fed in wall time (adaptive_k_update_wall,
 * the pipeline's): its first rounds draft K_PROBE_K_WALL (2), not 1. */
void adaptive_k_init_wall(struct adaptive_k *kc, int k_fixed, int k_max);
/* K for the next round; never more than room - 1 where room is the number
 * of positions the sequence may still grow by (tokens still wanted, or
 * context left), so a round never overflows max_seq_len. */
int adaptive_k_next(struct adaptive_k *kc, int room);
/* The load a sequence shares the target with (continuous batching): batch
 * sequences each verify k + 1 rows in the same forward call, whose cost is
 * modelled as call_ms_base + call_ms_per_row * rows (measured over the
 * target's calls by the caller). Speculation then pays less as the batch
 * grows: plain decoding costs base + per_row * batch per token, k drafts
 * cost base + per_row * batch * (k + 1) per round; past some batch size
 * K = 0 wins, as vLLM's rule of turning speculation off above a batch size
 * says, but from measured costs rather than a fixed threshold. */
struct adaptive_k_load {
    int batch;              /* sequences sharing the target's calls, >= 1 */
    double call_ms_base;    /* <= 0: not measured yet (the load is then ignored) */
    double call_ms_per_row;
    /* the pair's wall-time costs per load level [ADAPTIVE_K_LOAD_LEVELS],
     * shared by its sequences (adaptive_k_costs); NULL: the controller's own */
    struct adaptive_k_costs *costs;
};

/* adaptive_k_next with the load taken into account; load NULL or batch <= 1
 * or unmeasured is adaptive_k_next. */
int adaptive_k_next_under_load(struct adaptive_k *kc, int room, const struct adaptive_k_load *load);

/* The load level of a batch of this many sequences (0: alone). */
int adaptive_k_load_level(int batch);

/* The wall-time costs the last decision was priced with (its load level's,
 * in the shared table or the controller's own). */
const struct adaptive_k_costs *adaptive_k_level_costs(const struct adaptive_k *kc);

/* Feeds the measurements of a finished round (k drafted, n_accepted).
 * draft_ms < 0: the round's drafting cost is not representative (it shared
 * the draft's forward calls with a prompt's prefill): acceptance and the
 * verification are learnt, the draft's cost is not. */
void adaptive_k_update(struct adaptive_k *kc, int k, int n_accepted, double draft_ms,
                       double verify_ms);
/* adaptive_k_update plus the round's wall time as the request experienced it
 * (from the previous round's result to this one's; wall_ms <= 0: not
 * measured). Once plain rounds' wall time is known, adaptive_k_next compares
 * wall times: plain decoding costs what its rounds took, a round of k drafts
 * costs its modelled compute (k * draft + verify(k)) plus what drafting
 * rounds took beyond their compute. Plain and drafting rounds are then
 * weighed as the request sees them, so speculation is chosen only where it
 * is faster in wall time; and where the last drafting rounds' measured wall
 * time per token was above a plain round's, K is 0 whatever the model says
 * (probes measure again). draft_ms < 0 (see adaptive_k_update): the round's
 * wall time is not used either. */
void adaptive_k_update_wall(struct adaptive_k *kc, int k, int n_accepted, double draft_ms,
                            double verify_ms, double wall_ms);
/* Whether the next drafting round should ask the draft to pre-draft the
 * round after it (the three-process pipeline). A pre-draft is made while the
 * target verifies, and saves the next round's drafting when every draft is
 * accepted and the bonus token was guessed. That pays where draft and target
 * have hardware of their own; where they share the same cores the pre-draft
 * slows the verification beside it by about what it may save, and is lost
 * whenever the round is not accepted whole. So it is measured, not assumed:
 * drafting rounds with pre-drafts, then without, each for a few rounds;
 * then the one with the lower wall time per token, trying the other again
 * now and then (costs drift with what else the machine runs). Counts the
 * call as one drafting round. */
bool adaptive_k_predraft(struct adaptive_k *kc);
/* Feeds a finished drafting round to the pre-draft choice: whether it was
 * drafted with a pre-draft (it asked for one, or it used one), the tokens it
 * emitted and its wall time (<= 0: not measured, ignored). */
void adaptive_k_note_predraft(struct adaptive_k *kc, bool predrafted, int n_tokens, double wall_ms);

/* Right after adaptive_k_next(_under_load) returned 0: how many plain
 * rounds in a row (this one included, at most max_rounds, at least 1) the
 * controller would hand out from here, before a probe or anything else.
 * They are counted as handed out, so the caller may run them as one run
 * (the pipeline's plain steps, which cross the coordinator once) and feed
 * each one's measurements as usual; the next adaptive_k_next continues
 * after them. 1 for a plain round that measures among drafting rounds. */
int adaptive_k_plain_run(struct adaptive_k *kc, int max_rounds);

/* A controller carried over from the last request (the coordinator keeps
 * the pair's measurements) starts a new one: the costs belong to the pair
 * and stay, but acceptance belongs to the content, so probes that failed on
 * the last request do not stretch the wait for the next probe here (the
 * probe interval is back at its minimum). */
void adaptive_k_new_request(struct adaptive_k *kc);

/* Measured draft/target cost ratio c (0 while unknown). */
double adaptive_k_cost_ratio(const struct adaptive_k *kc);

#endif
