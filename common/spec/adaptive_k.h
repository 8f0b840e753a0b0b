/* adaptive_k.h: how many tokens to draft next round, from measurements.
 *
 * What it is not: it runs no model and reads no clock; the caller times each
 * round and calls adaptive_k_update, then asks adaptive_k_next. The in-process
 * loop and the coordinator's scheduler both use it, which is why it lives in
 * spec/ (no model) rather than beside the draft and target halves.
 */
#ifndef TANDEM_ADAPTIVE_K_H
#define TANDEM_ADAPTIVE_K_H

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
struct adaptive_k {
    int k_fixed;            /* > 0: always this K (still clipped by the context) */
    int k_max;
    int k_current;
    double accepted_sum;    /* decayed count of accepted drafts */
    double trials_sum;      /* decayed count of acceptance tests (accepted + rejected) */
    double accept_rate;     /* estimate of a: the sums plus a weak prior */
    double draft_ms_per_token;
    double verify_ms_base;  /* cost of a one-row target call */
    double verify_ms_per_row; /* extra cost of each further row */
    /* decayed sums of the (k, verify_ms) pairs: the line base + per_row * k
     * is fitted to them */
    double fit_w, fit_k, fit_kk, fit_v, fit_kv;
    double plain_ms;        /* running average of plain rounds' verify_ms (0: none yet) */
    int rounds_since_plain; /* rounds since the last plain one */
    int rounds_observed;
    int rounds_since_probe;
    int probe_interval;     /* rounds at K = 0 before the next probe; doubles while probes fail */
};

void adaptive_k_init(struct adaptive_k *kc, int k_fixed, int k_max);
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
};

/* adaptive_k_next with the load taken into account; load NULL or batch <= 1
 * or unmeasured is adaptive_k_next. */
int adaptive_k_next_under_load(struct adaptive_k *kc, int room, const struct adaptive_k_load *load);

/* Feeds the measurements of a finished round (k drafted, n_accepted). */
void adaptive_k_update(struct adaptive_k *kc, int k, int n_accepted, double draft_ms,
                       double verify_ms);
/* Measured draft/target cost ratio c (0 while unknown). */
double adaptive_k_cost_ratio(const struct adaptive_k *kc);

#endif
