/* speculate.c: the accept/reject step and the adaptive-K arithmetic (rules
 * and the proof that the output is exactly p are in speculate.h).
 *
 * Invariant: each (stream, position) uniform decides at most one thing, and a
 * row is read in full only where a token is drawn from it (the rejected
 * position or the bonus); accepted positions read one p and one q value.
 */
#include "argmax.h"
#include "speculate.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "error.h"
#include "philox.h"
#include "sampling.h"

static const float *row_of(const float *rows, int i, int vocab)
{
    return rows + (size_t)i * (size_t)vocab;
}

/* Draws from row i of p (a correction or the bonus) at position pos. */
static int draw_from_p(const struct speculate_input *in, int i, uint64_t pos, int32_t *tok,
                       char *err)
{
    const float *p = row_of(in->p_rows, i, in->vocab);
    int v = sampling_draw(p, in->vocab, philox_uniform(in->seed, PHILOX_STREAM_TARGET_SAMPLE, pos, 0));
    if (v < 0)
        return error_set(err, ERR_INVALID_ARG, "p_rows[%d]: no positive probability", i);
    *tok = v;
    return 0;
}

/* The correction at the rejected position i (0-based) with draft token t. */
static int correct(const struct speculate_input *in, int i, int32_t t, float *scratch,
                   int32_t *tok, char *err)
{
    const int vocab = in->vocab;
    const uint64_t pos = in->position0 + (uint64_t)i;
    if (in->debug_fault == SPECULATE_DEBUG_RESIDUAL_FROM_P)
        return draw_from_p(in, i, pos, tok, err);
    const float *p = row_of(in->p_rows, i, vocab);
    if (in->mode == SPECULATE_MODE_POINT_MASS) {
        memcpy(scratch, p, (size_t)vocab * sizeof *scratch);
        scratch[t] = 0.0f;
    } else {
        const float *q = row_of(in->q_rows, i, vocab);
        for (int v = 0; v < vocab; v++) {
            float r = p[v] - q[v];
            scratch[v] = r > 0.0f ? r : 0.0f;
        }
    }
    int v = sampling_draw(scratch, vocab,
                          philox_uniform(in->seed, PHILOX_STREAM_TARGET_SAMPLE, pos, 0));
    if (v < 0) /* residual empty through rounding: rejection had probability ~0 */
        return draw_from_p(in, i, pos, tok, err);
    *tok = v;
    return 0;
}

static int validate(const struct speculate_input *in, const float *scratch,
                    const int32_t *tokens_out, const int *n_accepted_out, char *err)
{
    if (in->k < 0)
        return error_set(err, ERR_INVALID_ARG, "speculate: k must be >= 0, got %d", in->k);
    if (in->vocab < 1)
        return error_set(err, ERR_INVALID_ARG, "speculate: vocab must be >= 1, got %d", in->vocab);
    if (in->mode != SPECULATE_MODE_SAMPLED && in->mode != SPECULATE_MODE_POINT_MASS)
        return error_set(err, ERR_INVALID_ARG, "speculate: unknown mode %d", (int)in->mode);
    if ((!in->p_rows && !(in->greedy && in->p_argmax)) || !tokens_out || !n_accepted_out)
        return error_set(err, ERR_INVALID_ARG, "speculate: p_rows (or, greedy, p_argmax), "
                                               "tokens_out and n_accepted_out are required");
    if (in->k > 0 && !in->draft_tokens)
        return error_set(err, ERR_INVALID_ARG, "speculate: draft_tokens missing for k = %d", in->k);
    if (!in->greedy && !scratch)
        return error_set(err, ERR_INVALID_ARG, "speculate: scratch [vocab] is required when "
                                               "sampling");
    if (!in->greedy && in->mode == SPECULATE_MODE_SAMPLED && in->k > 0 && !in->q_rows)
        return error_set(err, ERR_INVALID_ARG, "speculate: q_rows are required in sampled mode");
    for (int i = 0; i < in->k; i++) {
        int32_t t = in->draft_tokens[i];
        if (t < 0 || t >= in->vocab)
            return error_set(err, ERR_INVALID_ARG,
                             "draft_tokens[%d]: token %d outside the vocabulary 0..%d", i, (int)t,
                             in->vocab - 1);
    }
    return 0;
}

static int verify_greedy(const struct speculate_input *in, int32_t *tokens_out, int *n_out,
                         char *err)
{
    for (int i = 0; i <= in->k; i++) {
        const float *row = in->p_argmax ? NULL : row_of(in->p_rows, i, in->vocab);
        const int best = in->p_argmax ? in->p_argmax[i] : argmax_f32(row, in->vocab);
        if (best < 0 || best >= in->vocab)
            return error_set(err, ERR_INVALID_ARG,
                             "p_rows[%d]: argmax %d outside 0..%d (a row whose every entry is NaN "
                             "has none)", i, best, in->vocab - 1);
        tokens_out[i] = best;
        if (i == in->k || best != in->draft_tokens[i]) {
            *n_out = i;
            return 0;
        }
    }
    return error_set(err, ERR_INTERNAL, "speculate: greedy loop fell through");
}

int speculate_verify(const struct speculate_input *in, float *scratch, int32_t *tokens_out,
                     int *n_accepted_out, char *err)
{
    int rc = validate(in, scratch, tokens_out, n_accepted_out, err);
    if (rc)
        return rc;
    if (in->greedy)
        return verify_greedy(in, tokens_out, n_accepted_out, err);
    const int vocab = in->vocab;
    for (int i = 0; i < in->k; i++) {
        const int32_t t = in->draft_tokens[i];
        const uint64_t pos = in->position0 + (uint64_t)i;
        if (in->prepare_p_row && (rc = in->prepare_p_row(in->prepare_user, i, err)))
            return rc;
        const float pt = row_of(in->p_rows, i, vocab)[t];
        const float u = philox_uniform(in->seed, PHILOX_STREAM_TARGET_ACCEPT, pos, 0);
        int accept;
        if (!(pt > 0.0f)) {
            accept = 0;
        } else if (in->debug_fault == SPECULATE_DEBUG_ACCEPT_WITHOUT_RATIO) {
            accept = 1;
        } else if (in->mode == SPECULATE_MODE_POINT_MASS) {
            accept = u < pt;
        } else {
            const float qt = row_of(in->q_rows, i, vocab)[t];
            /* qt == 0 makes the left side 0 < pt: accepted, the ratio's limit. */
            accept = (double)u * (double)(qt > 0.0f ? qt : 0.0f) < (double)pt;
        }
        if (!accept) {
            *n_accepted_out = i;
            return correct(in, i, t, scratch, &tokens_out[i], err);
        }
        tokens_out[i] = t;
    }
    *n_accepted_out = in->k;
    if (in->prepare_p_row && (rc = in->prepare_p_row(in->prepare_user, in->k, err)))
        return rc;
    return draw_from_p(in, in->k, in->position0 + (uint64_t)in->k, &tokens_out[in->k], err);
}

double speculate_expected_tokens(double a, int k)
{
    if (!(a > 0.0))
        a = 0.0;
    if (a > 1.0)
        a = 1.0;
    /* 1 + a + ... + a^k: the closed form's 0/0 at a = 1 and its cancellation
     * near 1 do not arise. */
    double sum = 0.0, term = 1.0;
    for (int j = 0; j <= k; j++) {
        sum += term;
        term *= a;
    }
    return k < 0 ? 1.0 : sum;
}

double speculate_expected_speedup(double a, int k, double c)
{
    if (k < 0)
        k = 0;
    return speculate_expected_tokens(a, k) / ((double)k * c + 1.0);
}

int speculate_best_k(double a, double c, int k_max)
{
    int best_k = 0;
    double best = 1.0;
    for (int k = 1; k <= k_max; k++) {
        double s = speculate_expected_speedup(a, k, c);
        if (s > best) {
            best = s;
            best_k = k;
        }
    }
    return best_k;
}
