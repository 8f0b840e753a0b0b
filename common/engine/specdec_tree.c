/* specdec_tree.c: see specdec_tree.h. */
#include "specdec_tree.h"

#include <stdlib.h>

#include <string.h>

#include "argmax.h"
#include "error.h"
#include "specdec_internal.h"
#include "speculate_tree.h"

int specdec_tree_verify_greedy(struct llama_ctx *ctx, int slot, const struct specdec_tree *tree,
                               int32_t *out, int *n_out, char *err)
{
    if (tree->n < 0 || tree->n > LLAMA_TREE_MAX - 1)
        return error_set(err, ERR_INVALID_ARG,
                         "tree verify: %d candidates, at most %d after the last token", tree->n,
                         LLAMA_TREE_MAX - 1);
    if (tree->n > 0 && (!tree->tokens || !tree->parents))
        return error_set(err, ERR_INVALID_ARG, "tree verify: %d candidates without their tokens or parents",
                         tree->n);
    const int n = tree->n + 1; /* `last` is node 0, the tree's root */
    int32_t tokens[LLAMA_TREE_MAX], parents[LLAMA_TREE_MAX], picks[LLAMA_TREE_MAX],
        path[LLAMA_TREE_MAX];
    tokens[0] = tree->last;
    parents[0] = -1;
    for (int i = 1; i < n; i++) {
        tokens[i] = tree->tokens[i - 1];
        /* llama_forward checks the order; an out-of-range parent stays so */
        parents[i] = tree->parents[i - 1] < 0 ? (tree->parents[i - 1] == -1 ? 0 : -2)
                                              : tree->parents[i - 1] + 1;
    }
    const bool by_argmax = llama_ctx_has_argmax(ctx);
    const int vocab = llama_model_config(llama_ctx_model(ctx))->vocab_size;
    float *logits = NULL;
    if (!by_argmax && !(logits = malloc((size_t)n * (size_t)vocab * sizeof(float))))
        return error_set(err, ERR_NOMEM, "tree verify: out of memory for %d rows of logits", n);
    const struct llama_seq_batch b = {.slot = slot, .tokens = tokens, .n_tokens = n,
                                      .n_logits = n, .argmax_out = by_argmax ? picks : NULL,
                                      .logits_out = logits, .parents = parents};
    const int len = llama_ctx_slot_len(ctx, slot);
    int rc = llama_forward(ctx, &b, 1, err);
    if (rc == 0 && !by_argmax)
        for (int i = 0; i < n; i++)
            picks[i] = argmax_f32(logits + (size_t)i * (size_t)vocab, vocab);
    free(logits);
    if (rc)
        return rc;
    /* down from the root: the child the target picks, while the tree has it
     * (children in index order; two equal siblings: the first) */
    int m = 0, node = 0;
    path[m++] = 0;
    for (;;) {
        int next = -1;
        for (int c = node + 1; c < n && next < 0; c++)
            if (parents[c] == node && tokens[c] == picks[node])
                next = c;
        if (next < 0)
            break;
        out[m - 1] = tokens[next];
        path[m++] = next;
        node = next;
    }
    out[m - 1] = picks[node];
    *n_out = m;
    if ((rc = llama_ctx_tree_accept(ctx, slot, path, m, err))) {
        char ignored[ERR_MSG_MAX];
        llama_ctx_truncate(ctx, slot, len, ignored);
    }
    return rc;
}

int specdec_tree_check(const struct specdec_target *t, const struct specdec_verify_job *j, char *err)
{
    if (j->k < 1 || j->k > SPECDEC_TREE_NODES_MAX)
        return error_set(err, ERR_INVALID_ARG, "tree verify: %d drafts, must be 1..%d", j->k,
                         SPECDEC_TREE_NODES_MAX);
    if (!j->draft)
        return error_set(err, ERR_INVALID_ARG, "tree verify: %d drafts but none given", j->k);
    if (j->logprobs || j->ctl || j->gram || t->dev)
        return error_set(err, ERR_UNSUPPORTED, "tree verify: not with %s yet (send a chain)",
                         j->logprobs ? "logprobs" : j->ctl ? "sampling controls"
                                                : j->gram ? "a grammar" : "device sampling");
    int depth[SPECDEC_TREE_NODES_MAX];
    for (int i = 0; i < j->k; i++) {
        const int p = j->parents[i];
        if (p < -1 || p >= i)
            return error_set(err, ERR_INVALID_ARG, "tree verify: parents[%d] = %d, must be in -1..%d", i, p,
                             i - 1);
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        if (depth[i] > SPECULATE_K_MAX)
            return error_set(err, ERR_INVALID_ARG, "tree verify: draft %d is %d deep, at most %d", i,
                             depth[i], SPECULATE_K_MAX);
    }
    return 0;
}

/* Greedy: from the root (row 0) the child whose token is the row's argmax
 * (the first such child), while there is one. path_out gets the accepted
 * drafts' indices; returns how many. */
static int tree_walk_greedy(const struct specdec_verify_job *j, const int32_t *picks, int32_t *tokens_out,
                            int32_t *path_out)
{
    int m = 0, row = 0; /* row: the node reached, 0 the root, i + 1 draft i */
    for (;;) {
        int next = -1;
        for (int c = row; c < j->k && next < 0; c++)
            if (j->parents[c] == row - 1 && j->draft[c] == picks[row])
                next = c;
        if (next < 0)
            break;
        tokens_out[m] = j->draft[next];
        path_out[m++] = next;
        row = next + 1;
    }
    tokens_out[m] = picks[row];
    return m;
}

/* Sampled: each row made the target's distribution (the request's
 * sampling), then the multi-draft rule with point masses. */
static int tree_walk_sampled(struct specdec_target *t, const struct specdec_verify_job *j, float *p_rows,
                             int32_t *tokens_out, int32_t *path_out, int *n_acc, char *err)
{
    for (int r = 0; r <= j->k; r++) {
        float *row = p_rows + (size_t)r * (size_t)t->vocab;
        int rc = sampling_adjust(t->ws, &j->sp, row, t->vocab, t->scratch, err);
        if (rc)
            return rc;
        memcpy(row, t->scratch, (size_t)t->vocab * sizeof(float));
    }
    const struct speculate_tree_input in = {
        .n = j->k, .vocab = t->vocab, .tokens = j->draft, .parents = j->parents, .q_rows = NULL,
        .p_rows = p_rows, .greedy = 0, .seed = j->sp.seed,
        .position0 = (uint64_t)j->keep_len + (uint64_t)j->n_feed};
    return speculate_tree_verify(&in, t->scratch, tokens_out, path_out, n_acc, err);
}

void specdec_tree_finish(struct specdec_target *t, struct specdec_verify_job *j, float *p_rows,
                         const int32_t *p_argmax)
{
    char err[ERR_MSG_MAX];
    int32_t tokens[SPECDEC_TREE_NODES_MAX + 1], path[SPECDEC_TREE_NODES_MAX], kept[LLAMA_TREE_MAX];
    int32_t picks[LLAMA_TREE_MAX];
    int n_acc = 0, rc = 0;
    const int L = j->keep_len + j->n_feed - 1; /* the slot's length before the tree's root */
    if (sampling_params_is_greedy(&j->sp)) {
        if (!p_argmax)
            for (int r = 0; r <= j->k; r++)
                picks[r] = argmax_f32(p_rows + (size_t)r * (size_t)t->vocab, t->vocab);
        n_acc = tree_walk_greedy(j, p_argmax ? p_argmax : picks, tokens, path);
    } else {
        rc = tree_walk_sampled(t, j, p_rows, tokens, path, &n_acc, err);
    }
    if (!rc && n_acc > SPECULATE_K_MAX) /* specdec_tree_check bounds the depth */
        rc = error_set(err, ERR_INTERNAL, "tree verify: a path of %d drafts", n_acc);
    if (!rc) {
        kept[0] = 0; /* the root, then the accepted drafts at their rows */
        for (int i = 0; i < n_acc; i++)
            kept[i + 1] = path[i] + 1;
        rc = llama_ctx_tree_accept(t->ctx, j->slot, kept, n_acc + 1, err);
    }
    if (rc) {
        char ignored[ERR_MSG_MAX];
        if (llama_ctx_tree_nodes(t->ctx, j->slot) > 0)
            llama_ctx_truncate(t->ctx, j->slot, L, ignored);
        specdec_job_fail(&j->rc, j->err, &j->done, rc, err);
        return;
    }
    memcpy(j->tokens_out, tokens, (size_t)(n_acc + 1) * sizeof(int32_t));
    j->n_accepted = n_acc;
    j->done = true;
}
