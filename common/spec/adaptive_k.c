/* adaptive_k.c: the adaptive-K controller (see adaptive_k.h).
 *
 * Pure arithmetic over measured acceptance and costs: no model, no clock.
 * The callers (the in-process loop in engine/specdec.c and the coordinator's
 * scheduler) time the rounds and feed the figures in.
 */
#include "adaptive_k.h"

#include <stdbool.h>
#include <string.h>

#include "speculate.h"

/* Decay of the acceptance sums per round: about the last ten rounds count,
 * since acceptance drifts with the content being generated. */
#define K_DECAY 0.9
/* The prior on a: worth two acceptance tests at 0.6, so a draft that keeps
 * failing is recognised after one or two rounds, and a good one as fast. */
#define K_PRIOR_A 0.6
#define K_PRIOR_WEIGHT 2.0
/* Decay of the (k, verify_ms) sums: costs belong to the hardware and the
 * model, not to the content, so they are remembered much longer, which also
 * keeps the rounds where k varied (what separates the base cost from the
 * per-row cost) in the fit. */
#define K_COST_DECAY 0.98
/* Weight of the newest timing sample. */
#define K_EWMA_ALPHA 0.2
/* Until measured, each verification row beyond the first is assumed to cost
 * this share of a one-row call (memory-bound kernels read weights once). */
#define K_PRIOR_ROW_SHARE 0.15
/* Rounds at K = 0 before the first probe with K = 1; doubles up to the
 * maximum while probes keep failing, so a hopeless draft costs almost
 * nothing and a draft that starts matching again is found. */
#define K_PROBE_INTERVAL_MIN 16
#define K_PROBE_INTERVAL_MAX 256
/* Rounds at K > 0 between two plain rounds that measure plain decoding:
 * one round in 32 without drafts costs a few percent of the gain. */
#define K_PLAIN_PROBE_INTERVAL 32

void adaptive_k_init(struct adaptive_k *kc, int k_fixed, int k_max)
{
    memset(kc, 0, sizeof *kc);
    kc->k_fixed = k_fixed;
    kc->k_max = k_max < 1 ? 1 : (k_max > SPECULATE_K_MAX ? SPECULATE_K_MAX : k_max);
    /* one draft first: the cheapest way to learn what a new pair is worth */
    kc->k_current = k_fixed > 0 ? k_fixed : 1;
    kc->accept_rate = K_PRIOR_A;
    kc->probe_interval = K_PROBE_INTERVAL_MIN;
}

/* Modelled verification cost of k drafted rows. */
static double k_verify_ms(const struct adaptive_k *kc, int k)
{
    return kc->verify_ms_base + kc->verify_ms_per_row * k;
}

void adaptive_k_update(struct adaptive_k *kc, int k, int n_accepted, double draft_ms,
                       double verify_ms)
{
    if (k > 0) {
        /* A round is a truncated geometric observation: n_accepted successes,
         * then one failure unless every draft was accepted. */
        kc->accepted_sum = kc->accepted_sum * K_DECAY + n_accepted;
        kc->trials_sum = kc->trials_sum * K_DECAY + n_accepted + (n_accepted < k ? 1 : 0);
        kc->accept_rate = (kc->accepted_sum + K_PRIOR_A * K_PRIOR_WEIGHT) /
                          (kc->trials_sum + K_PRIOR_WEIGHT);
        /* a floor keeps a fully hidden draft (pipelined, cost 0) measurable */
        double per_token = draft_ms / k > 1e-3 ? draft_ms / k : 1e-3;
        kc->draft_ms_per_token = kc->draft_ms_per_token > 0
                                     ? kc->draft_ms_per_token +
                                           K_EWMA_ALPHA * (per_token - kc->draft_ms_per_token)
                                     : per_token;
    }
    if (k == 0) {
        kc->rounds_since_plain = 0;
        if (verify_ms > 0)
            kc->plain_ms = kc->plain_ms > 0 ? kc->plain_ms + K_EWMA_ALPHA * (verify_ms - kc->plain_ms)
                                            : verify_ms;
    } else {
        kc->rounds_since_plain++;
    }
    if (verify_ms > 0) {
        kc->fit_w = kc->fit_w * K_COST_DECAY + 1;
        kc->fit_k = kc->fit_k * K_COST_DECAY + k;
        kc->fit_kk = kc->fit_kk * K_COST_DECAY + (double)k * k;
        kc->fit_v = kc->fit_v * K_COST_DECAY + verify_ms;
        kc->fit_kv = kc->fit_kv * K_COST_DECAY + k * verify_ms;
        double mk = kc->fit_k / kc->fit_w, mv = kc->fit_v / kc->fit_w;
        double var = kc->fit_kk / kc->fit_w - mk * mk;
        double slope = var > 0.25 ? (kc->fit_kv / kc->fit_w - mk * mv) / var : -1;
        if (slope < 0) {
            /* k has not varied enough to separate the two costs: assume
             * the prior share per row around the mean */
            kc->verify_ms_base = mv / (1.0 + K_PRIOR_ROW_SHARE * mk);
            kc->verify_ms_per_row = K_PRIOR_ROW_SHARE * kc->verify_ms_base;
        } else {
            kc->verify_ms_per_row = slope;
            kc->verify_ms_base = mv - slope * mk;
            if (kc->verify_ms_base <= 0) {
                kc->verify_ms_base = mv / (1.0 + K_PRIOR_ROW_SHARE * mk);
                kc->verify_ms_per_row = K_PRIOR_ROW_SHARE * kc->verify_ms_base;
            }
        }
    }
    kc->rounds_observed++;
}

double adaptive_k_cost_ratio(const struct adaptive_k *kc)
{
    if (kc->draft_ms_per_token <= 0 || kc->verify_ms_base <= 0)
        return 0.0;
    return kc->draft_ms_per_token / kc->verify_ms_base;
}

int adaptive_k_next(struct adaptive_k *kc, int room)
{
    return adaptive_k_next_under_load(kc, room, NULL);
}

int adaptive_k_next_under_load(struct adaptive_k *kc, int room, const struct adaptive_k_load *load)
{
    int cap = room - 1;
    if (cap <= 0)
        return 0;
    if (kc->k_fixed > 0)
        return kc->k_fixed < cap ? kc->k_fixed : cap;
    int limit = kc->k_max < cap ? kc->k_max : cap;
    if (kc->draft_ms_per_token <= 0 || kc->verify_ms_base <= 0) {
        /* nothing measured yet: a first round at the initial K */
        return kc->k_current < limit ? kc->k_current : limit;
    }
    /* Throughput of plain decoding against each k: expected tokens per round
     * over the round's modelled cost (Leviathan et al. 2023, section 3.5,
     * with the measured costs in place of the ratio c alone). Under load the
     * verification cost is the shared call's, every sequence adding its rows. */
    const bool loaded = load && load->batch > 1 && load->call_ms_base > 0 &&
                        load->call_ms_per_row >= 0;
    /* plain decoding as measured in plain rounds when there were any: the
     * fit's base is taken while drafts run, which may slow the target */
    const double plain_ms = loaded             ? load->call_ms_base + load->call_ms_per_row * load->batch
                            : kc->plain_ms > 0 ? kc->plain_ms
                                               : kc->verify_ms_base;
    double best_rate = 1.0 / plain_ms;
    int best_k = 0;
    for (int k = 1; k <= limit; k++) {
        double tokens = speculate_expected_tokens(kc->accept_rate, k);
        double verify_ms = loaded ? load->call_ms_base +
                                        load->call_ms_per_row * load->batch * (double)(k + 1)
                                  : k_verify_ms(kc, k);
        double cost = k * kc->draft_ms_per_token + verify_ms;
        double rate = tokens / cost;
        if (rate > best_rate * 1.03) { /* a margin keeps noise from choosing speculation */
            best_rate = rate;
            best_k = k;
        }
    }
    if (best_k == 0) {
        if (kc->k_current != 0)
            kc->rounds_since_probe = 0;
        if (++kc->rounds_since_probe >= kc->probe_interval) {
            kc->rounds_since_probe = 0;
            kc->probe_interval = kc->probe_interval * 2 > K_PROBE_INTERVAL_MAX
                                     ? K_PROBE_INTERVAL_MAX
                                     : kc->probe_interval * 2;
            kc->k_current = 1;
            return 1; /* a probe: k_current stays 1 until the next decision */
        }
    } else {
        kc->probe_interval = K_PROBE_INTERVAL_MIN;
        if (kc->rounds_since_plain >= K_PLAIN_PROBE_INTERVAL) {
            kc->k_current = best_k;
            return 0; /* a plain round: measures what speculation is compared with */
        }
    }
    kc->k_current = best_k;
    return best_k;
}

