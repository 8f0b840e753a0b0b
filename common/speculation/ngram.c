/* ngram.c: see ngram.h. */
#include "ngram.h"

#include <stdbool.h>
#include <string.h>

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

/* The tokens that followed earlier occurrences of the last n tokens within
 * the window, best first: the most frequent, then the most recent; at most
 * max of them into tok. Returns how many (0: no occurrence). */
static int rank_order(const struct ext_seq *e, int n, int window, int32_t *tok, int max)
{
    int32_t cand[NGRAM_CANDIDATES];
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
        while (c < n_cand && cand[c] != next)
            c++;
        if (c == n_cand) {
            if (n_cand == NGRAM_CANDIDATES)
                continue;
            cand[c] = next;
            count[c] = 0;
            n_cand++;
        }
        count[c]++;
        last[c] = i;
    }
    int n_out = 0;
    bool taken[NGRAM_CANDIDATES] = {false};
    for (; n_out < max && n_out < n_cand; n_out++) {
        int best = -1;
        for (int c = 0; c < n_cand; c++)
            if (!taken[c] && (best < 0 || count[c] > count[best] ||
                              (count[c] == count[best] && last[c] > last[best])))
                best = c;
        taken[best] = true;
        tok[n_out] = cand[best];
    }
    return n_out;
}

/* The candidates after e, from its longest matching order; returns how
 * many (at most max). */
static int candidates(const struct ngram_params *p, const struct ext_seq *e, int32_t *tok, int max)
{
    for (int n = p->n_max; n >= p->n_min; n--) {
        const int k = e->len > n ? rank_order(e, n, p->window, tok, max) : 0;
        if (k > 0)
            return k;
    }
    return 0;
}

int ngram_draft(const struct ngram_params *p, const int32_t *hist, int n_hist, int k_max, int32_t *out)
{
    struct ext_seq e = {.hist = hist, .n_hist = n_hist, .pred = out, .len = n_hist};
    int k = 0;
    while (k < k_max && candidates(p, &e, &out[k], 1) == 1) {
        k++;
        e.len++;
    }
    return k;
}

int ngram_draft_tree(const struct ngram_params *p, const int32_t *hist, int n_hist, int depth_max,
                     int nodes_max, int branch, struct draft_tree *out)
{
    draft_tree_clear(out);
    if (depth_max > DRAFT_TREE_NODES_MAX)
        depth_max = DRAFT_TREE_NODES_MAX;
    if (branch > NGRAM_TREE_BRANCH_MAX)
        branch = NGRAM_TREE_BRANCH_MAX;
    if (depth_max < 1 || nodes_max < 1)
        return 0;
    int32_t main_chain[DRAFT_TREE_NODES_MAX], alt[DRAFT_TREE_NODES_MAX];
    const int len = ngram_draft(p, hist, n_hist, depth_max, main_chain);
    draft_tree_add_chain(out, main_chain, len, 1, nodes_max);
    /* then, nearest the root first (where a miss costs the most), each
     * position's runner-up candidates, each extended by the same rule */
    for (int d = 0; d < len && out->n < nodes_max; d++) {
        struct ext_seq e = {.hist = hist, .n_hist = n_hist, .pred = alt, .len = n_hist + d};
        memcpy(alt, main_chain, (size_t)d * sizeof(int32_t));
        int32_t ranked[NGRAM_TREE_BRANCH_MAX];
        const int n_ranked = candidates(p, &e, ranked, branch);
        for (int c = 1; c < n_ranked && out->n < nodes_max; c++) {
            alt[d] = ranked[c];
            struct ext_seq x = {.hist = hist, .n_hist = n_hist, .pred = alt, .len = n_hist + d + 1};
            int k = d + 1;
            while (k < depth_max && candidates(p, &x, &alt[k], 1) == 1) {
                k++;
                x.len++;
            }
            draft_tree_add_chain(out, alt, k, 1, nodes_max);
        }
    }
    return out->n;
}
