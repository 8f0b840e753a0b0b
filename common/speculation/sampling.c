/* sampling.c: adjusted distributions, argmax and inverse-CDF draws (contract
 * and exact rules in sampling.h).
 *
 * Cost for a vocab of V: two passes (max, exp) plus one normalisation pass in
 * every mode. top-k selects with a bounded heap (k <= 1024; most tokens cost
 * one comparison) or quickselect, computes exp for the k survivors only, and
 * sorts them (O(k log k)) only when top-p is also on. top-p without
 * top-k gathers the tokens with e >= t for t = 2^-4, 2^-8, ... until they
 * carry top_p of the mass, and sorts only those: the nucleus is a prefix of
 * the canonical order, so any threshold set that reaches the mass contains
 * it. Invariant: every selection is defined by the canonical order alone,
 * never by the algorithm that found it, so results do not depend on
 * thresholds, pivots or sort stability.
 */
#include "argmax.h"
#include "sampling.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "error.h"
#include "philox.h"

/* Up to this k, top-k uses a bounded heap instead of quickselect. */
#define SAMPLING_HEAP_K_MAX 1024

struct sampling_cand {
    float logit;
    int32_t index;
};

struct sampling_workspace {
    int vocab_max;
    struct sampling_cand *cand; /* (vocab_max) */
};

void sampling_params_default(struct sampling_params *p)
{
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->seed = 0;
}

int sampling_params_validate(const struct sampling_params *p, char *err)
{
    if (!(p->temperature >= 0.0f && p->temperature <= (float)SAMPLING_TEMPERATURE_MAX))
        return error_set(err, ERR_INVALID_ARG, "temperature: must be in [0, %g], got %g",
                         SAMPLING_TEMPERATURE_MAX, (double)p->temperature);
    if (p->top_k < 0 || p->top_k > SAMPLING_TOP_K_MAX)
        return error_set(err, ERR_INVALID_ARG, "top_k: must be in [0, %d] (0 = off), got %d",
                         SAMPLING_TOP_K_MAX, p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return error_set(err, ERR_INVALID_ARG, "top_p: must be in (0, 1], got %g",
                         (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return error_set(err, ERR_INVALID_ARG, "min_p: must be in [0, 1], got %g",
                         (double)p->min_p);
    return 0;
}

int sampling_params_set(struct sampling_params *p, double temperature, double top_k, double top_p,
                        double min_p, char *err)
{
    if (!(temperature >= 0.0 && temperature <= SAMPLING_TEMPERATURE_MAX))
        return error_set(err, ERR_INVALID_ARG, "temperature: must be in [0, %g], got %g",
                         SAMPLING_TEMPERATURE_MAX, temperature);
    if (!(top_k >= 0.0 && top_k <= (double)SAMPLING_TOP_K_MAX) || top_k != floor(top_k))
        return error_set(err, ERR_INVALID_ARG, "top_k: must be an integer in [0, %d] (0 = off), got %g",
                         SAMPLING_TOP_K_MAX, top_k);
    if (!(top_p > 0.0 && top_p <= 1.0))
        return error_set(err, ERR_INVALID_ARG, "top_p: must be in (0, 1], got %g", top_p);
    if ((float)top_p == 0.0f)
        return error_set(err, ERR_INVALID_ARG,
                         "top_p: %g is 0 as a 32-bit float; must be at least %g", top_p,
                         (double)FLT_TRUE_MIN);
    if (!(min_p >= 0.0 && min_p <= 1.0))
        return error_set(err, ERR_INVALID_ARG, "min_p: must be in [0, 1], got %g", min_p);
    p->temperature = (float)temperature;
    p->top_k = (int)top_k;
    p->top_p = (float)top_p;
    p->min_p = (float)min_p;
    return sampling_params_validate(p, err);
}

int sampling_params_is_greedy(const struct sampling_params *p)
{
    return p->temperature == 0.0f;
}

int sampling_workspace_create(struct sampling_workspace **out, int vocab_max, char *err)
{
    *out = NULL;
    if (vocab_max < 1)
        return error_set(err, ERR_INVALID_ARG, "sampling workspace: vocab_max must be >= 1, got %d",
                         vocab_max);
    struct sampling_workspace *ws = calloc(1, sizeof *ws);
    if (!ws)
        goto fail;
    ws->vocab_max = vocab_max;
    ws->cand = malloc((size_t)vocab_max * sizeof *ws->cand);
    if (!ws->cand)
        goto fail;
    *out = ws;
    return 0;
fail:
    sampling_workspace_destroy(ws);
    return error_set(err, ERR_NOMEM, "sampling workspace: cannot allocate for vocab %d", vocab_max);
}

void sampling_workspace_destroy(struct sampling_workspace *ws)
{
    if (!ws)
        return;
    free(ws->cand);
    free(ws);
}

/* The canonical order: a before b when its logit is larger, or equal with a
 * lower index. */
static inline int cand_before(struct sampling_cand a, struct sampling_cand b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.index < b.index);
}

static int cand_compare(const void *pa, const void *pb)
{
    struct sampling_cand a = *(const struct sampling_cand *)pa;
    struct sampling_cand b = *(const struct sampling_cand *)pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static void cand_swap(struct sampling_cand *a, struct sampling_cand *b)
{
    struct sampling_cand t = *a;
    *a = *b;
    *b = t;
}

static void cand_insertion_sort(struct sampling_cand *a, int n)
{
    for (int i = 1; i < n; i++) {
        struct sampling_cand x = a[i];
        int j = i - 1;
        while (j >= 0 && cand_before(x, a[j])) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = x;
    }
}

/* Rearranges a[0..n) so that a[nth] is the element the canonical sort would
 * put there, everything before it precedes it and everything after follows.
 * Keys are distinct (the index breaks ties), so Hoare partitioning around a
 * median-of-three pivot always shrinks the range. */
static void cand_select_nth(struct sampling_cand *a, int n, int nth)
{
    int lo = 0, hi = n - 1;
    while (hi - lo >= 16) {
        int mid = lo + (hi - lo) / 2;
        if (cand_before(a[mid], a[lo]))
            cand_swap(&a[mid], &a[lo]);
        if (cand_before(a[hi], a[lo]))
            cand_swap(&a[hi], &a[lo]);
        if (cand_before(a[hi], a[mid]))
            cand_swap(&a[hi], &a[mid]);
        struct sampling_cand pivot = a[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_before(a[i], pivot))
                i++;
            while (cand_before(pivot, a[j]))
                j--;
            if (i <= j) {
                cand_swap(&a[i], &a[j]);
                i++;
                j--;
            }
        }
        if (nth <= j)
            hi = j;
        else if (nth >= i)
            lo = i;
        else
            return;
    }
    cand_insertion_sort(a + lo, hi - lo + 1);
}

/* Restores the heap property below node i of a heap whose root is the
 * element that comes LAST in the canonical order. */
static void cand_sift_down(struct sampling_cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && cand_before(h[worst], h[l]))
            worst = l;
        if (r < n && cand_before(h[worst], h[r]))
            worst = r;
        if (worst == i)
            return;
        cand_swap(&h[i], &h[worst]);
        i = worst;
    }
}

/* Leaves the first k tokens of the canonical order in c[0..k), unordered. For
 * small k a bounded heap (one comparison per token for most tokens), else
 * quickselect over all V. */
static void select_top_k(struct sampling_cand *c, const float *logits, int vocab, int k)
{
    if (k <= SAMPLING_HEAP_K_MAX) {
        for (int v = 0; v < k; v++) {
            c[v].logit = logits[v];
            c[v].index = v;
        }
        for (int i = k / 2 - 1; i >= 0; i--)
            cand_sift_down(c, k, i);
        for (int v = k; v < vocab; v++) {
            struct sampling_cand x = {logits[v], v};
            if (cand_before(x, c[0])) {
                c[0] = x;
                cand_sift_down(c, k, 0);
            }
        }
        return;
    }
    for (int v = 0; v < vocab; v++) {
        c[v].logit = logits[v];
        c[v].index = v;
    }
    cand_select_nth(c, vocab, k - 1);
}

/* Zeroes e[v] for every token that comes after `last` in the canonical order. */
static void keep_through(float *e, const float *logits, int vocab, struct sampling_cand last)
{
    for (int v = 0; v < vocab; v++) {
        struct sampling_cand c = {logits[v], v};
        if (cand_before(last, c))
            e[v] = 0.0f;
    }
}

static double sum_index_order(const float *x, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return s;
}

/* Scans sorted candidates c[0..n) and returns the position of the first one at
 * which the running sum of e reaches target, or -1. */
static int nucleus_end(const struct sampling_cand *c, int n, const float *e, double target)
{
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += e[c[i].index];
        if (cum >= target)
            return i;
    }
    return -1;
}

/* top-p over the kept tokens; top_k_kept > 0 means ws->cand[0..top_k_kept)
 * already holds exactly the kept tokens (the top-k set). */
static void apply_top_p(struct sampling_workspace *ws, float top_p, const float *logits,
                        int vocab, float *e, int top_k_kept)
{
    double target = (double)top_p * sum_index_order(e, vocab);
    struct sampling_cand *c = ws->cand;
    int n, end;
    if (top_k_kept > 0) {
        n = top_k_kept;
        qsort(c, (size_t)n, sizeof *c, cand_compare);
        end = nucleus_end(c, n, e, target);
    } else {
        end = -1;
        n = 0;
        for (float t = 0.0625f;; t *= 0.0625f) {
            /* t underflows to 0 after ~37 steps: then every token qualifies. */
            n = 0;
            double mass = 0.0;
            for (int v = 0; v < vocab; v++) {
                if (e[v] >= t && (t > 0.0f || e[v] > 0.0f)) {
                    c[n].logit = logits[v];
                    c[n].index = v;
                    n++;
                    mass += e[v];
                }
            }
            if (mass >= target || t == 0.0f) {
                qsort(c, (size_t)n, sizeof *c, cand_compare);
                end = nucleus_end(c, n, e, target);
                if (end >= 0 || t == 0.0f)
                    break;
            }
        }
    }
    if (end < 0) /* rounding kept the sum below target: the nucleus is everything kept */
        return;
    keep_through(e, logits, vocab, c[end]);
}

int sampling_adjust(struct sampling_workspace *ws, const struct sampling_params *p,
                    const float *logits, int vocab, float *probs_out, char *err)
{
    int rc = sampling_params_validate(p, err);
    if (rc)
        return rc;
    if (vocab < 1 || vocab > ws->vocab_max)
        return error_set(err, ERR_INVALID_ARG, "sampling: vocab %d outside 1..%d", vocab,
                         ws->vocab_max);
    float max_logit = -INFINITY;
    int arg = -1;
    for (int v = 0; v < vocab; v++) {
        float l = logits[v];
        if (isnan(l) || l == INFINITY)
            return error_set(err, ERR_INVALID_ARG, "logits[%d]: %s is not a valid logit", v,
                             isnan(l) ? "NaN" : "+inf");
        if (l > max_logit) {
            max_logit = l;
            arg = v;
        }
    }
    if (arg < 0)
        return error_set(err, ERR_INVALID_ARG, "logits: all %d values are -inf", vocab);

    if (p->temperature == 0.0f) {
        for (int v = 0; v < vocab; v++)
            probs_out[v] = 0.0f;
        probs_out[arg] = 1.0f;
        return 0;
    }

    /* e[v] = expf((logit[v] - max) / temperature), kept tokens only. */
    float *e = probs_out;
    int top_k_kept = 0;
    if (p->top_k > 0 && p->top_k < vocab) {
        const struct sampling_cand *c = ws->cand;
        select_top_k(ws->cand, logits, vocab, p->top_k);
        for (int v = 0; v < vocab; v++)
            e[v] = 0.0f;
        for (int i = 0; i < p->top_k; i++)
            e[c[i].index] = expf((c[i].logit - max_logit) / p->temperature);
        top_k_kept = p->top_k;
    } else {
        for (int v = 0; v < vocab; v++)
            e[v] = expf((logits[v] - max_logit) / p->temperature);
    }
    if (p->top_p < 1.0f)
        apply_top_p(ws, p->top_p, logits, vocab, e, top_k_kept);
    if (p->min_p > 0.0f) {
        for (int v = 0; v < vocab; v++)
            if (e[v] < p->min_p)
                e[v] = 0.0f;
    }
    /* e[arg] == 1 survives every filter, so the sum is >= 1. */
    double total = sum_index_order(e, vocab);
    for (int v = 0; v < vocab; v++)
        probs_out[v] = (float)(e[v] / total);
    return 0;
}

int sampling_draw(const float *probs, int n, float u)
{
    double total = 0.0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (probs[i] > 0.0f) {
            total += probs[i];
            last = i;
        }
    }
    if (last < 0)
        return -1;
    double target = (double)u * total, cum = 0.0;
    for (int i = 0; i < last; i++) {
        if (probs[i] > 0.0f) {
            cum += probs[i];
            if (cum > target)
                return i;
        }
    }
    return last;
}

int sampling_sample(struct sampling_workspace *ws, const struct sampling_params *p,
                    const float *logits, int vocab, uint32_t stream, uint64_t position,
                    float *probs_out, int32_t *token_out, char *err)
{
    int rc = sampling_adjust(ws, p, logits, vocab, probs_out, err);
    if (rc)
        return rc;
    int tok;
    if (sampling_params_is_greedy(p)) {
        tok = argmax_f32(probs_out, vocab);
    } else {
        tok = sampling_draw(probs_out, vocab, philox_uniform(p->seed, stream, position, 0));
    }
    if (tok < 0) /* adjust always leaves a positive entry */
        return error_set(err, ERR_INTERNAL, "sampling: adjusted distribution has no mass");
    *token_out = tok;
    return 0;
}

/* Inserts candidate c into top[0..*n-1], kept in canonical order and at
 * most cap long. */
static void top_insert(struct sampling_cand *top, int *n, int cap, struct sampling_cand c)
{
    if (*n == cap && !cand_before(c, top[cap - 1]))
        return;
    int i = *n < cap ? (*n)++ : cap - 1;
    while (i > 0 && cand_before(c, top[i - 1])) {
        top[i] = top[i - 1];
        i--;
    }
    top[i] = c;
}

static float logprob_of(float logit, float m, double log_total)
{
    double lp = ((double)logit - (double)m) - log_total;
    return lp < (double)SAMPLING_LOGPROB_MIN ? SAMPLING_LOGPROB_MIN : (float)lp;
}

int sampling_logprobs(const float *logits, int vocab, int32_t token, int n_top,
                      struct sampling_logprobs *out, char *err)
{
    if (vocab < 1)
        return error_set(err, ERR_INVALID_ARG, "logprobs: vocab must be >= 1, got %d", vocab);
    if (token < 0 || token >= vocab)
        return error_set(err, ERR_INVALID_ARG, "logprobs: token %d outside 0..%d", (int)token,
                         vocab - 1);
    int cap = n_top < 0 ? 0 : n_top;
    if (cap > SAMPLING_TOP_LOGPROBS_MAX)
        cap = SAMPLING_TOP_LOGPROBS_MAX;
    if (cap > vocab)
        cap = vocab;
    float m = -INFINITY;
    for (int v = 0; v < vocab; v++) {
        if (isnan(logits[v]) || logits[v] == INFINITY)
            return error_set(err, ERR_INVALID_ARG, "logprobs: logit %d is %g", v, (double)logits[v]);
        if (logits[v] > m)
            m = logits[v];
    }
    if (m == -INFINITY)
        return error_set(err, ERR_INVALID_ARG, "logprobs: every logit is -inf");
    struct sampling_cand top[SAMPLING_TOP_LOGPROBS_MAX];
    int n = 0;
    double total = 0.0;
    for (int v = 0; v < vocab; v++) {
        total += exp((double)logits[v] - (double)m);
        if (cap > 0)
            top_insert(top, &n, cap, (struct sampling_cand){.logit = logits[v], .index = v});
    }
    const double log_total = log(total);
    out->logprob = logprob_of(logits[token], m, log_total);
    out->n_top = n;
    for (int i = 0; i < n; i++) {
        out->top_ids[i] = top[i].index;
        out->top_logprobs[i] = logprob_of(top[i].logit, m, log_total);
    }
    return 0;
}

int sampling_controls_active(const struct sampling_controls *c)
{
    return c->presence_penalty != 0.0f || c->frequency_penalty != 0.0f ||
           (c->repetition_penalty != 0.0f && c->repetition_penalty != 1.0f) || c->n_bias > 0;
}

int sampling_controls_validate(const struct sampling_controls *c, char *err)
{
    const double pmax = SAMPLING_PENALTY_ABS_MAX;
    if (!(fabsf(c->presence_penalty) <= pmax))
        return error_set(err, ERR_INVALID_ARG, "presence_penalty: must be in [-2, 2], got %g",
                         (double)c->presence_penalty);
    if (!(fabsf(c->frequency_penalty) <= pmax))
        return error_set(err, ERR_INVALID_ARG, "frequency_penalty: must be in [-2, 2], got %g",
                         (double)c->frequency_penalty);
    if (!(c->repetition_penalty >= 0.0f && c->repetition_penalty <= SAMPLING_REPETITION_MAX))
        return error_set(err, ERR_INVALID_ARG, "repetition_penalty: must be in (0, 10], got %g",
                         (double)c->repetition_penalty);
    if (c->n_bias < 0 || c->n_bias > SAMPLING_BIAS_MAX)
        return error_set(err, ERR_INVALID_ARG, "logit_bias: at most %d entries, got %d",
                         SAMPLING_BIAS_MAX, c->n_bias);
    for (int i = 0; i < c->n_bias; i++)
        if (!(fabsf(c->bias[i]) <= SAMPLING_BIAS_ABS_MAX) || c->bias_ids[i] < 0)
            return error_set(err, ERR_INVALID_ARG,
                             "logit_bias: token %d: a bias in [-100, 100] for a token id >= 0",
                             (int)c->bias_ids[i]);
    return 0;
}

/* Step 2 of the rules: every token of the whole history, once. */
static void apply_repetition(float r, const struct sampling_history *h, int32_t *counts,
                             float *logits)
{
    for (int i = 0; i < h->n_tokens; i++) {
        const int32_t t = h->tokens[i];
        if (counts[t])
            continue;
        counts[t] = 1;
        logits[t] = logits[t] > 0.0f ? logits[t] / r : logits[t] * r;
    }
    for (int i = 0; i < h->n_tokens; i++)
        counts[h->tokens[i]] = 0;
}

/* Step 3: the output's tokens, by their counts. */
static void apply_frequency_presence(const struct sampling_controls *c,
                                     const struct sampling_history *h, int32_t *counts,
                                     float *logits)
{
    for (int i = h->n_prompt; i < h->n_tokens; i++)
        counts[h->tokens[i]]++;
    for (int i = h->n_prompt; i < h->n_tokens; i++) {
        const int32_t t = h->tokens[i];
        if (!counts[t])
            continue;
        logits[t] = (logits[t] - c->frequency_penalty * (float)counts[t]) - c->presence_penalty;
        counts[t] = 0;
    }
}

int sampling_controls_apply(const struct sampling_controls *c, const struct sampling_history *h,
                            int32_t *counts, float *logits, int vocab, char *err)
{
    for (int i = 0; i < c->n_bias; i++) {
        if (c->bias_ids[i] < 0 || c->bias_ids[i] >= vocab)
            return error_set(err, ERR_INVALID_ARG, "logit_bias: token %d outside the vocabulary (0..%d)",
                             (int)c->bias_ids[i], vocab - 1);
        logits[c->bias_ids[i]] += c->bias[i];
    }
    for (int i = 0; i < h->n_tokens; i++)
        if (h->tokens[i] < 0 || h->tokens[i] >= vocab)
            return error_set(err, ERR_INVALID_ARG, "sampling history: token %d outside 0..%d",
                             (int)h->tokens[i], vocab - 1);
    if (c->repetition_penalty != 0.0f && c->repetition_penalty != 1.0f)
        apply_repetition(c->repetition_penalty, h, counts, logits);
    if (c->frequency_penalty != 0.0f || c->presence_penalty != 0.0f)
        apply_frequency_presence(c, h, counts, logits);
    return 0;
}
