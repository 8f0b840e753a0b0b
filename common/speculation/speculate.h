/* speculate.h: the speculative accept/reject step (Leviathan et al. 2023,
 * Algorithm 1; Chen et al. 2023) on host float arrays, and the adaptive-K
 * arithmetic.
 *
 * What it is: given K draft tokens, the draft's adjusted distributions q and
 * the target's adjusted distributions p (sampling_adjust, same parameters),
 * decide how many drafts the target accepts and which token it emits after
 * them, such that the emitted tokens are distributed exactly as the target
 * sampling alone: each emitted token ~ p at its position.
 * What it is not: the forward passes, the KV-cache rollback, or the choice of
 * K (the caller measures acceptance and costs, and may use the helpers below).
 *
 * Positions and randomness (philox.h): draft token t_i (1-based) and the token
 * emitted in its place sit at absolute position position0 + i - 1; the bonus
 * token at position0 + K. At position n the accept test uses
 *   u = philox_uniform(seed, PHILOX_STREAM_TARGET_ACCEPT, n, 0)
 * and a correction or bonus draw uses
 *   u = philox_uniform(seed, PHILOX_STREAM_TARGET_SAMPLE, n, 0)
 * with sampling_draw (inverse CDF, sampling.h). The draft must draw t_i with
 * PHILOX_STREAM_DRAFT_SAMPLE at the same position: independent of both.
 *
 * Rules, per mode (greedy overrides mode):
 *   greedy (temperature 0): accept t_i while argmax p_i == t_i (lowest index
 *     among ties); the next token is argmax p_i (correction) or argmax
 *     p_(K+1) (bonus). No randomness; q is not read.
 *   SPECULATE_MODE_SAMPLED: t_i ~ q_i. Accept iff u * q_i(t_i) < p_i(t_i),
 *     evaluated in double, where the product of two 24-bit significands is
 *     exact, so the test equals u < p/q exactly (the CUDA twin can reproduce
 *     it bit for bit). Degenerate cases:
 *       p_i(t_i) == 0: always rejected (u*q >= 0 = p).
 *       q_i(t_i) == 0 with p_i(t_i) > 0: accepted (ratio +inf, the limit of
 *         min(1, p/q)). A correct draft never proposes such a token; if the
 *         q row disagrees with what the draft sampled from, no rule can keep
 *         the output exact, and this one at least never emits a token p
 *         excludes.
 *     On the first rejection, the correction is drawn from
 *     r = max(0, p_i - q_i) (float subtraction, element-wise, written to
 *     scratch; sampling_draw normalises with a double sum). If r has no
 *     positive entry (p and q equal up to rounding, so rejection had
 *     probability ~0) the correction is drawn from p_i itself. All K
 *     accepted: the bonus is drawn from p_(K+1).
 *   SPECULATE_MODE_POINT_MASS: the draft proposed its argmax, so q_i is a
 *     point mass at t_i (q rows are not read, may be NULL). Accept iff
 *     u < p_i(t_i) (never when p_i(t_i) == 0, always when it is 1). On
 *     rejection the correction is drawn from p_i with t_i removed (scratch);
 *     if nothing else has mass, from p_i itself. Bonus as above.
 * Why the output is exactly p (sampled): P(emit v) = min(q(v), p(v)) +
 *   P(reject) * r(v) / sum r, with P(reject) = 1 - sum min(p, q) = sum r, so
 *   P(emit v) = min(p, q)(v) + max(0, p - q)(v) = p(v). Point mass: p(t) +
 *   (1 - p(t)) * p(v)/(1 - p(t)) for v != t.
 *
 * Threads: reentrant; nothing is allocated.
 * Errors: 0 or a negative code from error.h, reason in err (NULL or
 * ERR_MSG_MAX bytes); outputs unspecified after an error.
 */
#ifndef TANDEM_SPECULATE_H
#define TANDEM_SPECULATE_H

#include <stdint.h>

/* Most drafts one round may carry (a verification is at most K + 1 rows). */
#define SPECULATE_K_MAX 16
/* Tokens the draft is fed at the start of a drafting round that follows
 * one: the bonus token, and the last draft when all were accepted (the
 * draft never ran it). More is catching up (after rounds at K = 0). */
#define SPECULATE_ROUND_FEED_MAX 2

enum speculate_mode {
    SPECULATE_MODE_SAMPLED = 0,    /* draft samples t_i ~ q_i, q rows required */
    SPECULATE_MODE_POINT_MASS = 1, /* draft proposes argmax q_i, only ids cross */
};

/* Deliberate faults, for tests ONLY: they exist so the goodness-of-fit test
 * can show it detects a broken sampler (tests/unit/test_speculate.c). No
 * production code may set anything but SPECULATE_DEBUG_NONE (the zero value,
 * so designated initialisers leave it off). */
enum speculate_debug_fault {
    SPECULATE_DEBUG_NONE = 0,
    /* On rejection, draw the correction from p_i instead of the residual
     * max(0, p_i - q_i) (point mass: instead of p_i without t_i). */
    SPECULATE_DEBUG_RESIDUAL_FROM_P = 1,
    /* Accept every draft the target gives any mass, without the ratio test
     * (u < p/q, point mass: u < p). */
    SPECULATE_DEBUG_ACCEPT_WITHOUT_RATIO = 2,
};

struct speculate_input {
    int k;                       /* number of draft tokens, >= 0 (0: just sample p_1) */
    int vocab;                   /* row width V, >= 1 */
    const int32_t *draft_tokens; /* (k) t_1..t_K, each in 0..V-1 */
    const float *q_rows;         /* (k, V) draft adjusted distributions; sampled mode only */
    const float *p_rows;         /* (k+1, V) target adjusted distributions */
    /* (k+1) greedy only, instead of p_rows (then NULL): each p row's argmax,
     * where the target's forward found only those (llama_seq_batch.argmax_out);
     * -1 for a row whose every entry is NaN. */
    const int32_t *p_argmax;
    int greedy;                  /* temperature 0: argmax rule, no randomness */
    enum speculate_mode mode;
    uint64_t seed;               /* the request's seed (Philox key) */
    uint64_t position0;          /* absolute position of t_1 */
    /* Optional lazy p rows. NULL: every row of p_rows is ready. Otherwise
     * row i is valid only once prepare_p_row(prepare_user, i, err) returned
     * 0: speculate_verify asks for each row just before it first reads it,
     * in increasing order, and never for rows past the first rejection, so a
     * caller that adjusts logits into p rows does only the rows that are
     * read. Not called in greedy mode (the argmax rule reads p_rows as they
     * are: pass the logits, whose argmax is the adjusted rows' argmax). A
     * nonzero return is passed up. */
    int (*prepare_p_row)(void *prepare_user, int i, char *err);
    void *prepare_user;
    enum speculate_debug_fault debug_fault; /* tests only; leave 0 */
};

/* Runs the accept/reject step. tokens_out [k+1] receives t_1..t_n followed by
 * the correction or bonus token (n + 1 tokens); *n_accepted_out = n in 0..k.
 * scratch [vocab] is overwritten (required unless greedy; it may be the
 * buffer the p rows were adjusted in, once they are copied out).
 * ERR_INVALID_ARG: k < 0, vocab < 1, a missing array, a draft token outside
 * 0..V-1 (named by index), an unknown mode, or a p row with no positive
 * entry where a token must be drawn from it. */
int speculate_verify(const struct speculate_input *in, float *scratch, int32_t *tokens_out,
                     int *n_accepted_out, char *err);

/* Expected tokens per round with K drafts when each is accepted independently
 * with probability a (Leviathan et al. 2023, eq. 1):
 * (1 - a^(k+1)) / (1 - a), and k + 1 at a = 1. a is clamped to [0, 1]; k < 0
 * counts as 0. */
double speculate_expected_tokens(double a, int k);

/* Expected wall-time speedup over plain decoding (Leviathan 3.5):
 * expected_tokens(a, k) / (k * c + 1), c = cost of a draft step over the cost
 * of a target step. */
double speculate_expected_speedup(double a, int k, double c);

/* The k in 1..k_max with the largest expected speedup (smallest k among
 * equals), or 0 when none beats plain decoding (speedup > 1.0), or when
 * k_max < 1. */
int speculate_best_k(double a, double c, int k_max);

#endif
