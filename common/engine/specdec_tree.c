/* specdec_tree.c: see specdec_tree.h. */
#include "specdec_tree.h"

#include <stdlib.h>

#include "argmax.h"
#include "error.h"

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
