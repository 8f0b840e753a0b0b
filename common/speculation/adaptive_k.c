/* adaptive_k.c: the adaptive-K controller (see adaptive_k.h).
 *
 * Pure arithmetic over measured acceptance and costs: no model, no clock.
 * The caller (the coordinator's scheduler, in its process or in one with
 * the workers: coordinator/local.h) times the rounds and feeds the figures in.
 */
#include "adaptive_k.h"

#include <math.h>
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
/* A cost sample counts for at most this multiple of what the controller
 * expects it to be (k_update). On this VM a round is now and then stalled
 * for several times its cost: a K = 1 verification took 10.8 ms among
 * 4.5-4.9 (small pair, in-process). Taken whole, that one sample priced
 * K = 1 above plain decoding at a = 0.52 and the sequence decoded 11 plain
 * rounds until the next probe. A real change in cost still comes through,
 * at up to a tenth a round (K_EWMA_ALPHA of half again). */
#define K_SAMPLE_CAP 1.5
/* ... and a cost sample below the running average moves it this much (one
 * above: K_EWMA_ALPHA). A stall only ever adds time, so a low sample is the
 * better evidence; where the first verification at a k that is learnt is
 * the stalled one there is nothing yet to cap it against: 8.68 ms against
 * 5.4-5.9 later (small pair, in-process) held K = 1's price near 7.6 and
 * the sequence at K = 0 for 74 of 78 rounds. */
#define K_EWMA_ALPHA_DOWN 0.5
/* Decay of the sums of drafting rounds' wall time and tokens per drafting
 * round: about the last ten rounds count, as for acceptance. */
#define K_WALL_DECAY 0.9
/* Drafting rounds timed before their measured cost per token can overrule
 * the model. */
#define K_WALL_MIN_ROUNDS 4
/* How much slower per token than a plain round the last drafting rounds
 * must have been to overrule the model: the margin speculation must win by
 * to start, the other way. Without it a K = 2 round's tokens (1 or 3 on the
 * small pair, greedy acceptance comes in runs) and the machine's hiccups
 * ended speculation that paid: pipe runs of 3 requests, 15 requests each
 * way alternating, with this margin and new requests probing afresh
 * (adaptive_k_new_request): 1.01x target-only median (0.90-1.24x); without
 * either: 0.95x (0.87-1.12x). */
#define K_WALL_VETO_MARGIN 1.03
/* Weight of a probe's timing: at K = 0 probes are the only drafting rounds,
 * rare (16 to 256 rounds apart) while the machine's load moves the costs,
 * so each replaces half of what the last drafting rounds measured. */
#define K_PROBE_ALPHA 0.5
/* Until measured, each verification row beyond the first is assumed to cost
 * this share of a one-row call (memory-bound kernels read weights once). */
#define K_PRIOR_ROW_SHARE 0.15
/* Rounds at K = 0 before the first probe with K = 1; doubles up to the
 * maximum while probes keep failing, so a hopeless draft costs almost
 * nothing and a draft that starts matching again is found. */
#define K_PROBE_INTERVAL_MIN 16
#define K_PROBE_INTERVAL_MAX 256
/* ... and in wall time, at least as many rounds as keep what a probe is
 * measured to cost beyond the plain rounds it replaces within this share
 * of the time plain rounds take. In a batch a probe waits for the call
 * its sequence missed while the draft was made: small pair, 4 requests of
 * 64 tokens, a probe of two drafts took 22-40 ms where a plain round took
 * 10.5, and probes every 16-32 rounds cost the batch 4-6% of its
 * throughput. Alone the excess is a hop or two, and 16 rounds stay. */
#define K_PROBE_BUDGET 0.01
/* Drafts in a probe timed in wall time (the pipeline), at least: a round
 * there pays two trips through the coordinator whatever its K, which one
 * draft carries alone. Small pair, 2 + 2 threads on 2 cores: K = 1 rounds
 * took 8.2-10.9 ms for 1.6 tokens against 5-6 ms for a plain one, and
 * lost; K = 2 rounds 10.3-12 ms for 2.4, and won. Probes at K = 1 kept the
 * pipeline at K = 0 (3 requests of 96 tokens, 0.79-1.01x target-only, two
 * runs); at K = 2, 0.88-1.05x. In-process a drafting round has no such
 * cost, and a probe stays the cheapest one, K = 1. */
#define K_PROBE_K_WALL 2
/* Rounds at K > 0 between two plain rounds that measure plain decoding:
 * one round in 32 without drafts costs a few percent of the gain. */
#define K_PLAIN_PROBE_INTERVAL 32
/* Acceptance tests seen before the model may choose plain decoding. */
#define K_MIN_TRIALS 4
/* Acceptance tests until which plain decoding must win against an
 * acceptance one standard error above the estimate (adaptive_k_next_under_load). */
#define K_EARLY_TRIALS 16
/* ... and the tests a draft never accepted has that benefit for: past them
 * (no draft accepted in 4 tests: 0.4% of starts at a = 0.75, 2.6% at 0.6)
 * the estimate alone decides. With the benefit for all 16, a draft never
 * accepted (the small target at noise 0.2, a = 0) was drafted with for
 * most of its first 16 rounds: where a verified extra row is cheap (a
 * fifth of a step) and the draft costs a fifth too, plain decoding wins
 * only below a = 0.22-0.32, and one standard error above the estimate
 * with the prior's weight stayed there until about the 12th rejection;
 * each such round costs 28% of a step: 0.85-0.99x target-only over 96
 * tokens (8 runs, median 0.94x). */
#define K_NEVER_ACCEPTED_TRIALS 4
/* The first plain round comes after this many rounds: until one is run the
 * per-row cost is the prior's (k_verify_ms), which decides between K = 1
 * and 2 on a pair like the 1B-shaped one, so it is measured early. */
#define K_FIRST_PLAIN_ROUND 4
/* Rounds for which a k's measured verification cost stands for it
 * (k_verify_ms): costs move with the machine's load, and a k not run for
 * longer is priced from the ones run lately. */
#define K_VERIFY_AT_FRESH 64
/* The same in wall time (the pipeline), where plain rounds' wall time is
 * what drafting rounds are weighed against and moves with whatever else
 * the machine runs: a plain round in 8 keeps it current (seen on a shared
 * machine: a plain figure taken in a burst of load, 52 ms against 30 a few
 * rounds later, kept a losing speculation going for 32 rounds). It costs a
 * few percent where speculation pays. */
#define K_PLAIN_PROBE_INTERVAL_WALL 8
/* ... stretched, doubling at each plain round that finds speculation clearly
 * ahead, up to this many rounds, and back to K_PLAIN_PROBE_INTERVAL_WALL at
 * the first that does not. Clearly ahead: drafting rounds' measured wall
 * time per token at most K_PLAIN_CLEAR_SHARE of a plain round's compute
 * alone (plain_ms), never of its wall time. The wall-time average is what
 * a plain figure taken in a burst of load inflates (above), and so do
 * stalls and replies answered two at a time: simulated with a stall in 8
 * and bunched replies, a stretch judged against it let a draft that was
 * accepted 3 times in 10 go on drafting for 125 of 150 rounds. Judged
 * against the compute, over a grid of pipelines (acceptance 0.3-0.9, a
 * draft token 0.1-0.4 of a verification, 0.3-2.5 ms of hops a drafting
 * round, with and without stalls; 150 requests of 300 rounds each): where
 * speculation paid, 0.85% faster on average (0.996x to 1.025x); near the
 * break-even point, as before (worst 0.998x). */
#define K_PLAIN_PROBE_INTERVAL_WALL_MAX 32
#define K_PLAIN_CLEAR_SHARE 0.85
/* The pre-draft choice: each way is measured over this many drafting
 * rounds before the two are compared, and the one not chosen is tried
 * again for as many rounds after K_PREDRAFT_RETRY drafting rounds. Its sums
 * decay per round of their own kind, so about the last ten rounds count. */
#define K_PREDRAFT_TRIAL 8
#define K_PREDRAFT_RETRY 64
#define K_PREDRAFT_DECAY 0.9

void adaptive_k_init(struct adaptive_k *kc, int k_fixed, int k_max)
{
    memset(kc, 0, sizeof *kc);
    kc->k_fixed = k_fixed;
    kc->k_max = k_max < 1 ? 1 : (k_max > SPECULATE_K_MAX ? SPECULATE_K_MAX : k_max);
    /* one draft first: the cheapest way to learn what a new pair is worth */
    kc->k_current = k_fixed > 0 ? k_fixed : 1;
    kc->accept_rate = K_PRIOR_A;
    kc->probe_interval = K_PROBE_INTERVAL_MIN;
    kc->plain_interval_wall = K_PLAIN_PROBE_INTERVAL_WALL;
    kc->predraft_on = true;
}

void adaptive_k_init_wall(struct adaptive_k *kc, int k_fixed, int k_max)
{
    adaptive_k_init(kc, k_fixed, k_max);
    /* In wall time a round of one draft pays the same two trips through the
     * coordinator as one of two (K_PROBE_K_WALL), and its draft the same
     * step that feeds in the last round's tokens: the first rounds, which
     * the first prices are learnt from, draft two. */
    if (k_fixed <= 0)
        kc->k_current = K_PROBE_K_WALL < kc->k_max ? K_PROBE_K_WALL : kc->k_max;
}

/* Modelled verification cost of k drafted rows: what rounds at k cost
 * lately where there were any; else from the nearest k that was run below
 * it (between two that were, on the line through them), each further row
 * at the slope between the two highest run below (else the fit's); else
 * the fitted line. Against the line alone: the 1B-shaped pair on 2 cores
 * verified 1 row in 59.9 ms, 2 in 61-62 and 3 in 65-68, but a controller
 * running K = 1 never varied k enough to fit a slope, took the prior's 15%
 * a row, priced K = 2 at 67 + 2 drafts, and stayed at K = 1. */
/* Whether verify_at_ms[k] was fed within the last K_VERIFY_AT_FRESH rounds. */
static bool k_verify_at_fresh(const struct adaptive_k *kc, int k)
{
    return kc->verify_at_ms[k] > 0 &&
           kc->rounds_observed - kc->verify_at_round[k] <= K_VERIFY_AT_FRESH;
}

static double k_verify_ms(const struct adaptive_k *kc, int k)
{
    if (k < 0 || k > SPECULATE_K_MAX)
        return kc->verify_ms_base + kc->verify_ms_per_row * k;
    int lo = -1, lo2 = -1, hi = -1;
    double v[SPECULATE_K_MAX + 1];
    for (int j = 0; j <= SPECULATE_K_MAX; j++)
        v[j] = k_verify_at_fresh(kc, j) ? kc->verify_at_ms[j] : 0;
    if (v[k] > 0)
        return v[k];
    for (int j = k - 1; j >= 0; j--)
        if (v[j] > 0) {
            if (lo < 0) {
                lo = j;
            } else {
                lo2 = j;
                break;
            }
        }
    for (int j = k + 1; j <= SPECULATE_K_MAX; j++)
        if (v[j] > 0) {
            hi = j;
            break;
        }
    if (lo >= 0 && hi >= 0)
        return v[lo] + (v[hi] - v[lo]) * (k - lo) / (hi - lo);
    if (lo >= 0) {
        double per_row = kc->verify_ms_per_row;
        if (lo2 >= 0 && v[lo] >= v[lo2])
            per_row = (v[lo] - v[lo2]) / (lo - lo2);
        return v[lo] + per_row * (k - lo);
    }
    return kc->verify_ms_base + kc->verify_ms_per_row * k;
}

static void k_update(struct adaptive_k *kc, int k, int n_accepted, double draft_ms, double verify_ms);

/* The weight of a cost sample against its running average. */
static double k_alpha(double sample, double average)
{
    return sample < average ? K_EWMA_ALPHA_DOWN : K_EWMA_ALPHA;
}

void adaptive_k_update(struct adaptive_k *kc, int k, int n_accepted, double draft_ms,
                       double verify_ms)
{
    k_update(kc, k, n_accepted, draft_ms, verify_ms);
    kc->probing = false;
}

/* A drafting round of k drafts, n_accepted accepted, the draft's cost
 * draft_ms (< 0: unknown): the acceptance estimate and the draft's cost
 * per token. */
static void k_learn_draft(struct adaptive_k *kc, int k, int n_accepted, double draft_ms)
{
    kc->trials_seen += n_accepted + (n_accepted < k ? 1 : 0);
    /* A round is a truncated geometric observation: n_accepted successes,
     * then one failure unless every draft was accepted. */
    kc->accepted_sum = kc->accepted_sum * K_DECAY + n_accepted;
    kc->trials_sum = kc->trials_sum * K_DECAY + n_accepted + (n_accepted < k ? 1 : 0);
    kc->accept_rate = (kc->accepted_sum + K_PRIOR_A * K_PRIOR_WEIGHT) /
                      (kc->trials_sum + K_PRIOR_WEIGHT);
    if (draft_ms >= 0 && !kc->draft_warm) {
        /* The first drafting round of a fresh controller is not learnt
         * from: it is the draft's first decode call, which touches what
         * its prefill did not (the LM head's product among it) and took
         * 5-20 ms against 2.2 ms later (small pair, 2 threads). Priced
         * at that, K = 0 won and the draft was not tried again for 16
         * rounds, then, still averaged with it, for 32 more: most of a
         * first request decoded without speculation. Committing the
         * engine's row buffers at creation took away only part of it
         * (K = 2: 16.1 against 6.6 ms later in one run of two). */
        kc->draft_warm = true;
    } else if (draft_ms >= 0) {
        /* a floor keeps a fully hidden draft (pipelined, cost 0) measurable */
        double per_token = draft_ms / k > 1e-3 ? draft_ms / k : 1e-3;
        const double alpha =
            kc->probing ? K_PROBE_ALPHA : k_alpha(per_token, kc->draft_ms_per_token);
        kc->draft_ms_per_token = kc->draft_ms_per_token > 0
                                     ? kc->draft_ms_per_token + alpha * (per_token - kc->draft_ms_per_token)
                                     : per_token;
    }
}

/* A verification of k drafts cost verify_ms (> 0, a sample that counts):
 * the cost of k rows, and the base + per-row fit over every k. */
static void k_learn_verify(struct adaptive_k *kc, int k, double verify_ms)
{
    if (k >= 0 && k <= SPECULATE_K_MAX) {
        /* A k's first sample (or first after going stale) is met halfway by
         * what the other k's say it costs: a sample alone swings by 10% on
         * a shared machine, and a dear one would keep its k from being run
         * and measured again. */
        const double priced = k > 0 && !k_verify_at_fresh(kc, k) ? k_verify_ms(kc, k) : 0;
        kc->verify_at_ms[k] = k_verify_at_fresh(kc, k)
                                  ? kc->verify_at_ms[k] + k_alpha(verify_ms, kc->verify_at_ms[k]) *
                                                              (verify_ms - kc->verify_at_ms[k])
                              : priced > 0 ? 0.5 * (verify_ms + priced)
                                           : verify_ms;
        kc->verify_at_round[k] = kc->rounds_observed;
    }
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

/* adaptive_k_update but for the probe flag, which the caller clears once
 * the round is fully fed. */
static void k_update(struct adaptive_k *kc, int k, int n_accepted, double draft_ms, double verify_ms)
{
    /* The first drafting round's verification is the target's first
     * multi-row decode call, and is a warm-up too: 72.3 ms against 58-63
     * later (1B-shaped pair, 2 threads). Priced at that, with one draft of
     * the first two rejected, K = 0 won after two rounds, and a request
     * that ran at 1.37x with K = 2 ran at 1.01x. */
    const bool warm_up = k > 0 && draft_ms >= 0 && !kc->draft_warm;
    /* The first round at each k is the target's first call with that many
     * rows, and is a warm-up too (1B-shaped target, full head: 3 rows took
     * 78.8 ms the first time, then 72.4 and 71.3; 2 rows 69.3, then 66.7):
     * learnt, one such round priced K = 2 at 52.8 ms where plain and K = 1
     * rounds put it near 46, K = 2 was not run again, and the sample stood
     * for K_VERIFY_AT_FRESH rounds at K = 1 (5% slower there). */
    const bool first_at_k = k > 0 && k <= SPECULATE_K_MAX && !kc->verify_warm[k];
    if (k > 0 && k <= SPECULATE_K_MAX)
        kc->verify_warm[k] = true;
    const double verify_expected = k_verify_ms(kc, k);
    if (verify_ms > 0 && verify_expected > 0 && verify_ms > K_SAMPLE_CAP * verify_expected)
        verify_ms = K_SAMPLE_CAP * verify_expected;
    if (k > 0 && draft_ms > 0 && kc->draft_ms_per_token > 0 &&
        draft_ms > K_SAMPLE_CAP * kc->draft_ms_per_token * k)
        draft_ms = K_SAMPLE_CAP * kc->draft_ms_per_token * k;
    if (k > 0)
        k_learn_draft(kc, k, n_accepted, draft_ms);
    if (k == 0) {
        kc->rounds_since_plain = 0;
        if (verify_ms > 0)
            kc->plain_ms = kc->plain_ms > 0 ? kc->plain_ms + k_alpha(verify_ms, kc->plain_ms) *
                                                                 (verify_ms - kc->plain_ms)
                                            : verify_ms;
    } else {
        kc->rounds_since_plain++;
    }
    if (warm_up || first_at_k)
        verify_ms = 0;
    if (verify_ms > 0)
        k_learn_verify(kc, k, verify_ms);
    kc->rounds_observed++;
}

/* The wall-time costs of the current load level: the shared table's where
 * the last decision was handed one, else the controller's own. */
static struct adaptive_k_costs *k_costs(struct adaptive_k *kc)
{
    return kc->shared_costs ? &kc->shared_costs[kc->load_level] : &kc->costs[kc->load_level];
}

static const struct adaptive_k_costs *k_costs_c(const struct adaptive_k *kc)
{
    return kc->shared_costs ? &kc->shared_costs[kc->load_level] : &kc->costs[kc->load_level];
}

/* What the verification of k drafts is priced at for the round being
 * decided or learnt: the shared call's price under load (see
 * load_call_base), else what this sequence's verifications at k cost. */
static double k_verify_priced(const struct adaptive_k *kc, int k)
{
    return kc->load_call_base > 0 ? kc->load_call_base + kc->load_call_per_row * (double)(k + 1)
                                   : k_verify_ms(kc, k);
}

void adaptive_k_update_wall(struct adaptive_k *kc, int k, int n_accepted, double draft_ms,
                            double verify_ms, double wall_ms)
{
    /* the draft's first call (see k_update) would price drafting rounds'
     * wall time as wrongly as their compute */
    const bool first_draft = k > 0 && draft_ms >= 0 && !kc->draft_warm;
    struct adaptive_k_costs *cost = k_costs(kc);
    struct adaptive_k_wall *w = &kc->wall[kc->load_level];
    /* What the round should take, before this round is learnt from: a
     * stalled round counts for at most K_SAMPLE_CAP of it, as in k_update,
     * and a plain round for at least its share: the steps of a plain run
     * may be answered two at a time, one wall time read double and the
     * next as nothing. Taken whole, a stall in a plain round made
     * speculation look better than it was, one in a drafting round worse:
     * with one round in 10 stalled at 3x and bunched plain replies
     * (test_adaptive_k_wall_time_stalls_do_not_decide) a badly matched pair
     * drafted in 18% of its rounds (now 1%). Without the floor the small
     * pair, a stall in 5, ran at 1.12x plain decoding (whole: 1.15x; now
     * 1.16x). */
    const double draft_expected = kc->draft_ms_per_token * k;
    const double round_expected =
        k == 0 ? cost->plain_ms
        : cost->spec_rounds > 0 && draft_expected > 0
            ? draft_expected + k_verify_priced(kc, k) + cost->extra_ms
            : 0;
    /* Under load a verification's compute is the batch's shared call,
     * priced by the call's fit: taken as this sequence's cost of k rows it
     * would price its rounds alone at the batch's calls (the small pair: 44
     * ms for two drafts where alone they cost 12), and alone again it
     * would decode plainly until those figures went stale. */
    k_update(kc, k, n_accepted, draft_ms, kc->load_call_base > 0 ? 0.0 : verify_ms);
    const bool probe = kc->probing;
    kc->probing = false;
    if (wall_ms <= 0 || draft_ms < 0 || first_draft)
        return;
    if (round_expected > 0 && wall_ms > K_SAMPLE_CAP * round_expected) {
        wall_ms = K_SAMPLE_CAP * round_expected;
        if (draft_ms > K_SAMPLE_CAP * draft_expected)
            draft_ms = K_SAMPLE_CAP * draft_expected;
    }
    if (k == 0) {
        if (round_expected > 0 && wall_ms < round_expected / K_SAMPLE_CAP)
            wall_ms = round_expected / K_SAMPLE_CAP;
        /* a plain round run to measure, among drafting rounds, weighs as a probe */
        const double alpha = probe ? K_PROBE_ALPHA : k_alpha(wall_ms, cost->plain_ms);
        cost->plain_ms = cost->plain_ms > 0 ? cost->plain_ms + alpha * (wall_ms - cost->plain_ms) : wall_ms;
        if (probe) {
            const bool clear = w->spec_rounds >= K_WALL_MIN_ROUNDS &&
                               w->spec_tokens_sum > 0 && kc->plain_ms > 0 &&
                               w->spec_ms_sum / w->spec_tokens_sum <=
                                   K_PLAIN_CLEAR_SHARE * kc->plain_ms;
            const int stretched = kc->plain_interval_wall * 2;
            kc->plain_interval_wall = !clear ? K_PLAIN_PROBE_INTERVAL_WALL
                                      : stretched > K_PLAIN_PROBE_INTERVAL_WALL_MAX
                                          ? K_PLAIN_PROBE_INTERVAL_WALL_MAX
                                          : stretched;
        }
        return;
    }
    /* What the round took beyond its own measured compute: the hops and the
     * waits. The compute is priced by the model, which has learnt this
     * round's verification at its k (verify_at_ms: a verification slowed by
     * a draft beside it, and a k where the cost line misfits, are priced
     * there). Set against the model's price instead, a stall in the target's
     * compute landed here whole: on the small pair in the pipeline one
     * verification of 18 ms where 6.6 were usual moved the excess from 1.9
     * to 2.8 ms, the controller decoded plainly from there (its probes priced
     * the same way), and the request ran at 1.23x target-only where K = 2
     * throughout ran at 1.54x in the same minute. */
    double extra = wall_ms - (draft_ms > 0 ? draft_ms : 0) -
                   (kc->load_call_base > 0 ? k_verify_priced(kc, k) : verify_ms > 0 ? verify_ms : k_verify_ms(kc, k));
    if (extra < 0)
        extra = 0;
    const double alpha = probe ? K_PROBE_ALPHA : k_alpha(extra, cost->extra_ms);
    cost->extra_ms = cost->spec_rounds > 0 ? cost->extra_ms + alpha * (extra - cost->extra_ms) : extra;
    cost->spec_rounds++;
    w->spec_rounds++;
    const double decay = probe ? K_PROBE_ALPHA : K_WALL_DECAY;
    w->spec_ms_sum = w->spec_ms_sum * decay + wall_ms;
    w->spec_tokens_sum = w->spec_tokens_sum * decay + n_accepted + 1;
}

/* Tokens per ms of drafting rounds made that way (0 while unmeasured). */
static double predraft_rate(const struct adaptive_k *kc, int with)
{
    return kc->predraft_ms[with] > 0 ? kc->predraft_tokens[with] / kc->predraft_ms[with] : 0.0;
}

bool adaptive_k_predraft(struct adaptive_k *kc)
{
    /* with pre-drafts first (the choice that pays on hardware of their own),
     * then without */
    if (kc->predraft_rounds[1] < K_PREDRAFT_TRIAL)
        return true;
    if (kc->predraft_rounds[0] < K_PREDRAFT_TRIAL)
        return false;
    if (kc->predraft_trial_left > 0) {
        kc->predraft_trial_left--;
        return !kc->predraft_on;
    }
    /* the other way must win by a margin, so noise does not flip the choice */
    const double on = predraft_rate(kc, 1), off = predraft_rate(kc, 0);
    if (kc->predraft_on ? off > on * 1.03 : on > off * 1.03)
        kc->predraft_on = !kc->predraft_on;
    if (++kc->predraft_since_trial >= K_PREDRAFT_RETRY) {
        kc->predraft_since_trial = 0;
        kc->predraft_trial_left = K_PREDRAFT_TRIAL - 1;
        return !kc->predraft_on;
    }
    return kc->predraft_on;
}

void adaptive_k_note_predraft(struct adaptive_k *kc, bool predrafted, int n_tokens, double wall_ms)
{
    if (wall_ms <= 0 || n_tokens < 1)
        return;
    const int w = predrafted ? 1 : 0;
    kc->predraft_ms[w] = kc->predraft_ms[w] * K_PREDRAFT_DECAY + wall_ms;
    kc->predraft_tokens[w] = kc->predraft_tokens[w] * K_PREDRAFT_DECAY + n_tokens;
    kc->predraft_rounds[w]++;
}

void adaptive_k_new_request(struct adaptive_k *kc)
{
    kc->probe_interval = K_PROBE_INTERVAL_MIN;
}

/* Rounds at K = 0 before the next probe at the current load level: the
 * doubling interval, stretched to K_PROBE_BUDGET of the level's plain
 * rounds where a probe was measured to cost more. */
static int k_probe_due(const struct adaptive_k *kc)
{
    const struct adaptive_k_costs *cost = k_costs_c(kc);
    if (cost->plain_ms <= 0 || cost->spec_rounds == 0 || kc->draft_ms_per_token <= 0)
        return kc->probe_interval;
    /* what a probe takes (its price plus the level's measured excess over
     * the price, which is what such rounds took) beyond the plain rounds
     * that would have given its expected tokens */
    const int k = K_PROBE_K_WALL;
    const double round_ms = k * kc->draft_ms_per_token + k_verify_priced(kc, k) + cost->extra_ms;
    const double excess = round_ms - speculate_expected_tokens(kc->accept_rate, k) * cost->plain_ms;
    const double rounds = excess / (K_PROBE_BUDGET * cost->plain_ms);
    if (rounds <= kc->probe_interval)
        return kc->probe_interval;
    return rounds >= K_PROBE_INTERVAL_MAX ? K_PROBE_INTERVAL_MAX : (int)ceil(rounds);
}

int adaptive_k_plain_run(struct adaptive_k *kc, int max_rounds)
{
    if (max_rounds <= 1 || kc->k_fixed > 0 || kc->k_current != 0)
        return 1;
    /* at K = 0 each further plain round moves rounds_since_probe on, and
     * the one that reaches probe_interval is the probe */
    int run = k_probe_due(kc) - kc->rounds_since_probe;
    if (run < 1)
        run = 1;
    if (run > max_rounds)
        run = max_rounds;
    kc->rounds_since_probe += run - 1;
    return run;
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

/* What a round is priced by: plain decoding's cost, and what a drafting
 * round costs beyond its compute. */
struct k_prices {
    bool loaded;       /* the shared call's cost under load (every sequence adds its rows) */
    bool wall;         /* in wall time, plain rounds timed so (the pipeline) */
    double plain_ms;   /* one plain round */
    double extra_ms;   /* a drafting round's excess over its compute */
};

/* Plain decoding as measured in plain rounds when there were any: the
 * fit's base is taken while drafts run, which may slow the target. In wall
 * time where plain rounds of this load level were timed so (the pipeline):
 * then a drafting round is charged its own measured excess over its
 * compute, or until one is measured, the excess a plain round has over its
 * compute (the hop through the coordinator a drafting round makes too).
 * Under load the verification cost is the shared call's, every sequence
 * adding its rows; where plain rounds were timed at this level, plain
 * decoding is priced at their wall time, and a drafting round at its
 * compute plus the level's measured excess: in a batch that excess holds
 * the call the sequence misses while its draft is made (small pair, 4
 * requests: a plain round 11.4 ms, a drafting round of one draft 27-44,
 * its compute 18-20), which the fit of the call's cost cannot see. */
static struct k_prices k_prices_of(const struct adaptive_k *kc)
{
    const struct adaptive_k_costs *w = k_costs_c(kc);
    struct k_prices p = {0};
    p.loaded = kc->load_call_base > 0;
    p.wall = w->plain_ms > 0;
    p.plain_ms = p.wall     ? w->plain_ms
                 : p.loaded ? kc->load_call_base + kc->load_call_per_row
                 : kc->plain_ms > 0 ? kc->plain_ms
                                    : kc->verify_ms_base;
    if (p.wall && w->spec_rounds > 0)
        p.extra_ms = w->extra_ms;
    else if (p.wall && !p.loaded && kc->plain_ms > 0 && w->plain_ms > kc->plain_ms)
        p.extra_ms = w->plain_ms - kc->plain_ms;
    return p;
}

/* The K >= 1 (up to limit) with the best expected tokens per modelled
 * millisecond (Leviathan et al. 2023, section 3.5, with the measured costs
 * in place of the ratio c alone), its round's cost in *cost. Between two K
 * the better rate wins outright: a margin there held the 1B-shaped pair at
 * K = 1 where K = 2 was as good or better (a = 0.65-0.75, c = 0.3). */
static int k_best_by_model(const struct adaptive_k *kc, int limit, const struct k_prices *p, double *cost)
{
    double best_rate = 0;
    int best_k = 0;
    *cost = 0;
    for (int k = 1; k <= limit; k++) {
        const double tokens = speculate_expected_tokens(kc->accept_rate, k);
        const double round_ms = k * kc->draft_ms_per_token + k_verify_priced(kc, k) + p->extra_ms;
        if (tokens / round_ms > best_rate) {
            best_rate = tokens / round_ms;
            *cost = round_ms;
            best_k = k;
        }
    }
    return best_k;
}

/* best_k (its round costing best_cost) against plain decoding: 0 where
 * plain decoding wins, with the margins below. */
static int k_against_plain(const struct adaptive_k *kc, int best_k, double best_cost, const struct k_prices *p)
{
    /* Plain decoding only where it wins even at an acceptance one standard
     * error above the estimate, until K_EARLY_TRIALS tests are seen: on a
     * few the estimate is mostly luck, and giving up is sticky (the next
     * probe comes 16 rounds later, and each failed probe doubles the wait).
     * Two rejections in the first rounds (6% of starts at a = 0.75) held the
     * small pair (256-token prompts; K = 1 held: 1.11x) at K = 0 for most of
     * a run: 0.92x. From K_EARLY_TRIALS on the estimate alone decides, with
     * the margin, so a badly matched pair still ends at K = 0: a draft never
     * accepted by its 3rd or 4th test (at the 1B pair's costs, its 2nd). */
    const double n_tests = (double)kc->trials_seen + K_PRIOR_WEIGHT;
    const bool early = kc->trials_seen < K_EARLY_TRIALS &&
                       (kc->accepted_sum > 0 || kc->trials_seen < K_NEVER_ACCEPTED_TRIALS);
    const double a_high =
        early ? kc->accept_rate + sqrt(kc->accept_rate * (1.0 - kc->accept_rate) / n_tests) : kc->accept_rate;
    if (best_k > 0 &&
        speculate_expected_tokens(a_high < 1.0 ? a_high : 1.0, best_k) / best_cost <= 1.03 / p->plain_ms)
        best_k = 0;
    /* A draft that has been accepted gets a few acceptance tests before the
     * model may give up on it: on two the estimate is still the luck of the
     * first rounds (see warm_up in k_update). One never accepted is judged
     * by the model at once: on the badly matched 1B-shaped pair the four
     * rounds at K = 1 (0.68x each) took 1-2% of a 3 x 48-token run. */
    if (best_k == 0 && !p->loaded && kc->trials_seen < K_MIN_TRIALS && kc->accepted_sum > 0)
        best_k = 1;
    /* What drafting rounds actually cost per token overrules the model: when
     * they were slower than plain rounds the model's prices are off (the
     * acceptance is not the independent draws E(a, k) assumes, costs moved)
     * and plain decoding is the safe choice; probes measure again. */
    const struct adaptive_k_wall *w = &kc->wall[kc->load_level];
    if (best_k > 0 && p->wall && w->spec_rounds >= K_WALL_MIN_ROUNDS && w->spec_tokens_sum > 0 &&
        w->spec_ms_sum / w->spec_tokens_sum > p->plain_ms * K_WALL_VETO_MARGIN)
        best_k = 0;
    return best_k;
}

/* The K of the round after the decision best_k (model_k: the model's own
 * best): now and then a probe of speculation while plain decoding wins, or
 * a plain round while speculation does, to keep both measured. */
static int k_with_probes(struct adaptive_k *kc, int best_k, int model_k, int limit, bool wall)
{
    if (best_k == 0) {
        kc->plain_interval_wall = K_PLAIN_PROBE_INTERVAL_WALL;
        if (kc->k_current != 0)
            kc->rounds_since_probe = 0;
        if (++kc->rounds_since_probe >= k_probe_due(kc)) {
            kc->rounds_since_probe = 0;
            kc->probe_interval = kc->probe_interval * 2 > K_PROBE_INTERVAL_MAX ? K_PROBE_INTERVAL_MAX
                                                                               : kc->probe_interval * 2;
            /* in wall time, at the K the model ranks best, at least
             * K_PROBE_K_WALL; in-process one draft */
            int probe_k = !wall ? 1 : model_k > K_PROBE_K_WALL ? model_k : K_PROBE_K_WALL;
            if (probe_k > limit)
                probe_k = limit;
            kc->k_current = probe_k;
            kc->probing = true;
            return probe_k; /* k_current stays until the next decision */
        }
    } else {
        kc->probe_interval = K_PROBE_INTERVAL_MIN;
        const int plain_every = kc->plain_ms <= 0 ? K_FIRST_PLAIN_ROUND
                                : wall             ? kc->plain_interval_wall
                                                   : K_PLAIN_PROBE_INTERVAL;
        if (kc->rounds_since_plain >= plain_every) {
            kc->k_current = best_k;
            kc->probing = true;
            return 0; /* a plain round: measures what speculation is compared with */
        }
    }
    kc->k_current = best_k;
    return best_k;
}

/* Whether the controller is fed wall times (the pipeline): plain rounds'
 * wall time was measured at some load level. */
static bool k_wall_timed(const struct adaptive_k *kc)
{
    const struct adaptive_k_costs *costs = kc->shared_costs ? kc->shared_costs : kc->costs;
    for (int i = 0; i < ADAPTIVE_K_LOAD_LEVELS; i++)
        if (costs[i].plain_ms > 0)
            return true;
    return false;
}

const struct adaptive_k_costs *adaptive_k_level_costs(const struct adaptive_k *kc)
{
    return k_costs_c(kc);
}

int adaptive_k_load_level(int batch)
{
    int level = 0;
    while (batch > 1 && level < ADAPTIVE_K_LOAD_LEVELS - 1) {
        batch /= 2;
        level++;
    }
    return level;
}

int adaptive_k_next_under_load(struct adaptive_k *kc, int room, const struct adaptive_k_load *load)
{
    const bool loaded = load && load->batch > 1 && load->call_ms_base > 0 && load->call_ms_per_row >= 0;
    kc->load_level = adaptive_k_load_level(load ? load->batch : 1);
    kc->shared_costs = load ? load->costs : NULL;
    kc->load_call_base = loaded ? load->call_ms_base : 0.0;
    kc->load_call_per_row = loaded ? load->call_ms_per_row * load->batch : 0.0;
    int cap = room - 1;
    if (cap <= 0)
        return 0;
    if (kc->k_fixed > 0)
        return kc->k_fixed < cap ? kc->k_fixed : cap;
    int limit = kc->k_max < cap ? kc->k_max : cap;
    if (kc->draft_ms_per_token <= 0 || (kc->verify_ms_base <= 0 && !loaded)) {
        /* nothing measured yet: a first round at the initial K (under load
         * the verification is priced by the call's fit, see k_update's
         * caller in adaptive_k_update_wall) */
        return kc->k_current < limit ? kc->k_current : limit;
    }
    const struct k_prices prices = k_prices_of(kc);
    if (!prices.wall && k_wall_timed(kc)) {
        /* a load level not seen yet in a pipeline: one plain round first,
         * so that drafting there is weighed against what plain decoding
         * costs there (the level's drafting rounds would otherwise run
         * priced by the fit alone until the next plain round, up to 32
         * rounds away) */
        return 0;
    }
    double best_cost = 0;
    const int model_k = k_best_by_model(kc, limit, &prices, &best_cost);
    const int best_k = k_against_plain(kc, model_k, best_cost, &prices);
    return k_with_probes(kc, best_k, model_k, limit, prices.wall);
}

