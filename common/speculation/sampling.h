/* sampling.h: the request's sampling transforms and token draws, on host
 * float arrays.
 *
 * What it is: the "adjusted distribution" of a position (temperature, top-k,
 * top-p, min-p applied to logits, renormalised), an argmax, and an
 * inverse-CDF draw driven by a caller-supplied uniform. Draft and target apply
 * the same function, so q and p are comparable row by row.
 * What it is not: a GPU kernel (the CUDA backend re-implements these rules),
 * nor the speculative accept/reject step (speculate.h).
 *
 * The adjusted distribution, exactly (the CUDA twin must follow these rules;
 * it may round differently inside sums, which can move a top-p boundary or a
 * draw only where a running sum lands within rounding of a threshold):
 *   - logits must not hold NaN or +inf; -inf masks a token. At least one
 *     logit must be finite.
 *   - Canonical order: logit descending, then token index ascending. It is a
 *     total order and agrees with probability order (exp is monotone); every
 *     boundary below (argmax, top-k, top-p) is taken in this order, so ties
 *     are broken toward the lower index, deterministically.
 *   - temperature == 0: greedy, one-hot 1.0 at the argmax (first in order).
 *     Other fields are ignored.
 *   - otherwise, with m = max logit: e[v] = expf((logit[v] - m) / temperature)
 *     (float32; e = 1 exactly at the argmax), then, as HF transformers'
 *     warpers in the order temperature -> top_k -> top_p -> min_p:
 *     top_k > 0 and < vocab: keep exactly the first top_k tokens in order
 *       (HF keeps every token tied with the k-th; we keep exactly k).
 *     top_p < 1: with S = sum of kept e (double, index order), keep the
 *       shortest prefix in order whose running sum of e (double, in order)
 *       reaches >= top_p * S; always at least one token.
 *     min_p > 0: keep tokens with e[v] >= min_p (min_p times the top token's
 *       e, which is 1).
 *     probs[v] = (float)(e[v] / sum of kept e) for kept tokens, 0 elsewhere.
 *
 * Threads: functions are reentrant; a workspace serves one caller at a time.
 * Errors: 0 or a negative code from error.h, reason in err (NULL or
 * ERR_MSG_MAX bytes).
 */
#ifndef TANDEM_SAMPLING_H
#define TANDEM_SAMPLING_H

#include <stdint.h>

struct sampling_params {
    float temperature; /* >= 0; 0 = greedy */
    int top_k;         /* >= 0; 0 = off */
    float top_p;       /* (0, 1]; 1 = off */
    float min_p;       /* [0, 1]; 0 = off */
    uint64_t seed;     /* Philox key for every draw of the request */
};

/* The one definition of what a request may ask for: the coordinator checks
 * client requests and the workers check commands against these, so a value
 * the coordinator accepts is never refused by a worker. */
#define SAMPLING_TEMPERATURE_MAX 1.0e6
#define SAMPLING_TOP_K_MAX (1 << 30)

/* Greedy defaults: temperature 0, top_k 0, top_p 1, min_p 0, seed 0. */
void sampling_params_default(struct sampling_params *p);

/* ERR_INVALID_ARG naming the field ("temperature: must be in [0, 1e+06], got
 * -1") for a temperature outside [0, SAMPLING_TEMPERATURE_MAX], top_k outside
 * [0, SAMPLING_TOP_K_MAX], top_p outside (0, 1], min_p outside [0, 1] (NaN is
 * outside every range). 0 when valid. */
int sampling_params_validate(const struct sampling_params *p, char *err);

/* Sets p's temperature, top_k, top_p and min_p from the values a message
 * carries (JSON numbers: doubles), rounded to the floats the sampler uses,
 * and validates the result as sampling_params_validate does, naming the
 * value as given: a top_p that rounds to 0 as a float (1e-50) is refused
 * here rather than by a worker. A temperature that rounds to 0 is greedy.
 * p->seed is left alone. 0 or ERR_INVALID_ARG. */
int sampling_params_set(struct sampling_params *p, double temperature, double top_k, double top_p,
                        double min_p, char *err);

/* 1 when p selects greedy decoding (temperature == 0). */
int sampling_params_is_greedy(const struct sampling_params *p);

/* Index buffers for the top-k / top-p selections, sized once (per sequence or
 * per worker thread) so no call allocates. */
struct sampling_workspace;

/* ERR_INVALID_ARG when vocab_max < 1, ERR_NOMEM. */
int sampling_workspace_create(struct sampling_workspace **out, int vocab_max, char *err);
void sampling_workspace_destroy(struct sampling_workspace *ws); /* NULL-safe */

/* The adjusted distribution of one position (rules above) into probs_out
 * [vocab] (caller-owned, may be a shared-memory q row). logits [vocab] are not
 * modified and must not alias probs_out. ws must hold at least vocab entries.
 * ERR_INVALID_ARG: invalid params, vocab out of 1..vocab_max, a NaN or +inf
 * logit (named by index), or every logit -inf. probs_out is unspecified
 * after an error. */
int sampling_adjust(struct sampling_workspace *ws, const struct sampling_params *p,
                    const float *logits, int vocab, float *probs_out, char *err);

/* Inverse-CDF draw: with S = sum of probs (double, index order), the smallest
 * index i whose running sum (double, index order) exceeds u * S, u in [0, 1).
 * Entries <= 0 or NaN count as 0 and are never returned; if rounding carries
 * the scan past the end, the last positive entry is returned. The input need
 * not be normalised. -1 when n < 1 or no entry is positive. */
int sampling_draw(const float *probs, int n, float u);

/* One token for one position: sampling_adjust into probs_out [vocab], then
 * the argmax (greedy) or sampling_draw with
 * u = philox_uniform(p->seed, stream, position, 0); position is the absolute
 * position of the token being produced (philox.h). Errors as sampling_adjust. */
int sampling_sample(struct sampling_workspace *ws, const struct sampling_params *p,
                    const float *logits, int vocab, uint32_t stream, uint64_t position,
                    float *probs_out, int32_t *token_out, char *err);

/* ---- sampling controls: logit bias and penalties ----
 *
 * Transforms of a position's raw logits that depend on the sequence's
 * tokens before it, applied before sampling_adjust (and before the argmax
 * of greedy decoding), in this order, as vLLM's sampler does:
 *   1. logit_bias: logit[id] += bias (OpenAI: -100..100).
 *   2. repetition_penalty r (vLLM's and llama.cpp's; 1 = off): for every
 *      token that occurs in the prompt or the output so far, a positive
 *      logit is divided by r, a negative or zero one multiplied by r.
 *   3. frequency_penalty f and presence_penalty pr (OpenAI's; 0 = off): for
 *      every token that occurs c > 0 times in the output so far (not the
 *      prompt), logit = (logit - f * c) - pr, in float.
 * A speculative verification applies them per row: row i's "so far" is the
 * output before it plus the drafts 1..i-1 (sampling_history holds them), so
 * every row sees what target-only decoding of that position sees. */
#define SAMPLING_BIAS_MAX 300          /* logit_bias entries (OpenAI's limit) */
#define SAMPLING_BIAS_ABS_MAX 100.0
#define SAMPLING_PENALTY_ABS_MAX 2.0   /* presence_penalty, frequency_penalty */
#define SAMPLING_REPETITION_MAX 10.0   /* repetition_penalty in (0, 10] */

/* Zeroed: no control (a repetition_penalty of 0 counts as 1). */
struct sampling_controls {
    float presence_penalty;
    float frequency_penalty;
    float repetition_penalty;
    int n_bias;                             /* 0..SAMPLING_BIAS_MAX */
    int32_t bias_ids[SAMPLING_BIAS_MAX];    /* distinct token ids */
    float bias[SAMPLING_BIAS_MAX];
};

/* The tokens a position follows: tokens [0, n_prompt) are the prompt,
 * [n_prompt, n_tokens) the output so far (drafts before a row included). */
struct sampling_history {
    const int32_t *tokens;
    int n_prompt, n_tokens;
};

/* 1 when c changes any logit. */
int sampling_controls_active(const struct sampling_controls *c);

/* ERR_INVALID_ARG naming the field ("presence_penalty: must be in [-2, 2],
 * got 3"; "logit_bias: ..."), or 0. Token ids are checked by apply. */
int sampling_controls_validate(const struct sampling_controls *c, char *err);

/* Applies c (rules above) to logits [vocab] in place for a position after
 * h. counts [vocab] is scratch that must be all zero and is left so.
 * ERR_INVALID_ARG: a bias id or a history token outside 0..vocab-1. */
int sampling_controls_apply(const struct sampling_controls *c, const struct sampling_history *h,
                            int32_t *counts, float *logits, int vocab, char *err);

/* ---- log-probabilities (the client's `logprobs`) ----
 *
 * What a request reports is the raw log-softmax of the target's logits at
 * the position, before any sampling transform (temperature, top-k/p, min-p):
 * vLLM's default ("raw_logprobs"), so a number does not depend on the
 * sampling settings and equals what target-only decoding reports:
 *   logprob[v] = (logit[v] - m) - log(sum_w exp(logit[w] - m)), m = max logit,
 * the sum and the logarithm in double, in index order, the result rounded
 * to float. The top entries are the first n_top tokens in the canonical
 * order (logit descending, then index ascending). A logprob below
 * SAMPLING_LOGPROB_MIN (a masked or underflowing token) is reported as it. */
#define SAMPLING_TOP_LOGPROBS_MAX 20
#define SAMPLING_LOGPROB_MIN (-9999.0f)

struct sampling_logprobs {
    float logprob;                            /* the emitted token's */
    int n_top;                                /* 0..SAMPLING_TOP_LOGPROBS_MAX */
    int32_t top_ids[SAMPLING_TOP_LOGPROBS_MAX];
    float top_logprobs[SAMPLING_TOP_LOGPROBS_MAX];
};

/* Fills out for token (in 0..vocab-1) with the n_top (clamped to
 * 0..SAMPLING_TOP_LOGPROBS_MAX and vocab) most likely tokens of logits
 * [vocab]. ERR_INVALID_ARG: vocab < 1, token out of range, a NaN or +inf
 * logit, or every logit -inf. */
int sampling_logprobs(const float *logits, int vocab, int32_t token, int n_top,
                      struct sampling_logprobs *out, char *err);

#endif
