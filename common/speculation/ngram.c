/* ngram.c: see ngram.h. */
#include "ngram.h"

#include <stdbool.h>

#include "error.h"

/* Distinct continuations counted per lookup; rarer ones past this are not
 * candidates (a context followed by more than this many different tokens
 * predicts nothing well anyway). */
#define NGRAM_CANDIDATES 32

void ngram_params_default(struct ngram_params *p)
{
    *p = (struct ngram_params){.n_min = 2, .n_max = 4, .window = 1024};
}

int ngram_params_check(const struct ngram_params *p, char *err)
{
    if (p->n_min < 1 || p->n_min > NGRAM_N_MAX)
        return error_set(err, ERR_INVALID_ARG, "ngram n_min: must be in 1..%d, got %d", NGRAM_N_MAX, p->n_min);
    if (p->n_max < p->n_min || p->n_max > NGRAM_N_MAX)
        return error_set(err, ERR_INVALID_ARG, "ngram n_max: must be in n_min (%d)..%d, got %d", p->n_min,
                         NGRAM_N_MAX, p->n_max);
    if (p->window < 1 || p->window > NGRAM_WINDOW_MAX)
        return error_set(err, ERR_INVALID_ARG, "ngram window: must be in 1..%d, got %d", NGRAM_WINDOW_MAX,
                         p->window);
    return 0;
}

/* The sequence seen so far: the history, then the tokens predicted. */
struct ext_seq {
    const int32_t *hist;
    int n_hist;
    const int32_t *pred;
    int len;
};

static int32_t at(const struct ext_seq *e, int i)
{
    return i < e->n_hist ? e->hist[i] : e->pred[i - e->n_hist];
}

/* Whether the n tokens at i equal the last n. */
static bool matches_tail(const struct ext_seq *e, int i, int n)
{
    for (int j = 0; j < n; j++)
        if (at(e, i + j) != at(e, e->len - n + j))
            return false;
    return true;
}

/* The most frequent token after an earlier occurrence of the last n tokens
 * within the window (ties: the most recent), or -1. */
static int32_t predict_order(const struct ext_seq *e, int n, int window)
{
    int32_t tok[NGRAM_CANDIDATES];
    int count[NGRAM_CANDIDATES], last[NGRAM_CANDIDATES];
    int n_cand = 0;
    const int from = e->len - window > 0 ? e->len - window : 0;
    /* an occurrence at i is followed by the token at i + n, which must
     * exist before the tail itself starts to count */
    for (int i = from; i + n < e->len; i++) {
        if (!matches_tail(e, i, n))
            continue;
        const int32_t next = at(e, i + n);
        int c = 0;
        while (c < n_cand && tok[c] != next)
            c++;
        if (c == n_cand) {
            if (n_cand == NGRAM_CANDIDATES)
                continue;
            tok[c] = next;
            count[c] = 0;
            n_cand++;
        }
        count[c]++;
        last[c] = i;
    }
    int best = -1;
    for (int c = 0; c < n_cand; c++)
        if (best < 0 || count[c] > count[best] || (count[c] == count[best] && last[c] > last[best]))
            best = c;
    return best < 0 ? -1 : tok[best];
}

int ngram_draft(const struct ngram_params *p, const int32_t *hist, int n_hist, int k_max, int32_t *out)
{
    struct ext_seq e = {.hist = hist, .n_hist = n_hist, .pred = out, .len = n_hist};
    int k = 0;
    while (k < k_max) {
        int32_t next = -1;
        for (int n = p->n_max; n >= p->n_min && next < 0; n--)
            if (e.len > n)
                next = predict_order(&e, n, p->window);
        if (next < 0)
            break;
        out[k++] = next;
        e.len++;
    }
    return k;
}
