/* speculate_tree.c: the accept/reject walk over a tree of drafts (contract
 * in speculate_tree.h). */
#include "speculate_tree.h"

#include <stdbool.h>
#include <string.h>

#include "argmax.h"
#include "error.h"
#include "philox.h"
#include "sampling.h"

static const float *p_row(const struct speculate_tree_input *in, int node)
{
    return in->p_rows + (size_t)(node + 1) * (size_t)in->vocab;
}

static const float *q_row(const struct speculate_tree_input *in, int node)
{
    return in->q_rows ? in->q_rows[node] : NULL;
}

static int validate(const struct speculate_tree_input *in, const float *scratch, const int32_t *tokens_out,
                    const int *n_accepted_out, char *err)
{
    if (in->n < 0 || in->n > SPECULATE_TREE_NODES_MAX)
        return error_set(err, ERR_INVALID_ARG, "tree: %d nodes, must be 0..%d", in->n, SPECULATE_TREE_NODES_MAX);
    if (in->vocab < 1)
        return error_set(err, ERR_INVALID_ARG, "tree: vocab must be >= 1, got %d", in->vocab);
    if (!in->p_rows || !tokens_out || !n_accepted_out || (in->n > 0 && (!in->tokens || !in->parents)))
        return error_set(err, ERR_INVALID_ARG, "tree: p_rows, tokens, parents and the outputs are required");
    if (!in->greedy && !scratch)
        return error_set(err, ERR_INVALID_ARG, "tree: scratch [vocab] is required when sampling");
    for (int i = 0; i < in->n; i++) {
        if (in->tokens[i] < 0 || in->tokens[i] >= in->vocab)
            return error_set(err, ERR_INVALID_ARG, "tree: node %d: token %d outside the vocabulary 0..%d", i,
                             (int)in->tokens[i], in->vocab - 1);
        if (in->parents[i] < -1 || in->parents[i] >= i)
            return error_set(err, ERR_INVALID_ARG, "tree: node %d: parent %d, must be -1 or an earlier node", i,
                             (int)in->parents[i]);
    }
    return 0;
}

/* The children of node (-1: the root), in index order; how many. */
static int children_of(const struct speculate_tree_input *in, int node, int *kids)
{
    int n = 0;
    for (int i = node + 1; i < in->n; i++)
        if (in->parents[i] == node)
            kids[n++] = i;
    return n;
}

static int walk_greedy(const struct speculate_tree_input *in, int32_t *tokens_out, int32_t *path_out, int *n_out,
                       char *err)
{
    int node = -1, depth = 0;
    int kids[SPECULATE_TREE_NODES_MAX];
    for (;;) {
        const int best = argmax_f32(p_row(in, node), in->vocab);
        if (best < 0)
            return error_set(err, ERR_INVALID_ARG, "tree: p row of node %d: every entry is NaN", node);
        const int n_kids = children_of(in, node, kids);
        int next = -1;
        for (int j = 0; j < n_kids && next < 0; j++)
            if (in->tokens[kids[j]] == best)
                next = kids[j];
        tokens_out[depth] = best;
        if (next < 0) {
            *n_out = depth;
            return 0;
        }
        if (path_out)
            path_out[depth] = next;
        depth++;
        node = next;
    }
}

/* The correction from what is left of r (or from p, where nothing is) at
 * position pos. */
static int draw_rest(const struct speculate_tree_input *in, int node, const float *r, uint64_t pos, int32_t *tok,
                     char *err)
{
    const float u = philox_uniform(in->seed, PHILOX_STREAM_TARGET_SAMPLE, pos, 0);
    int v = r ? sampling_draw(r, in->vocab, u) : -1;
    if (v < 0) /* nothing left (rounding), or a leaf's bonus */
        v = sampling_draw(p_row(in, node), in->vocab, u);
    if (v < 0)
        return error_set(err, ERR_INVALID_ARG, "tree: p row of node %d: no positive probability", node);
    *tok = v;
    return 0;
}

/* The visiting order of n_kids children at position pos: a Fisher-Yates
 * shuffle of kids. */
static void shuffle(const struct speculate_tree_input *in, uint64_t pos, int *kids, int n_kids)
{
    for (int j = n_kids - 1; j > 0; j--) {
        const float u = philox_uniform(in->seed, PHILOX_STREAM_TARGET_ACCEPT, pos,
                                       (uint32_t)(SPECULATE_TREE_ORDER_INDEX + j));
        int k = (int)(u * (float)(j + 1));
        if (k > j)
            k = j;
        const int t = kids[j];
        kids[j] = kids[k];
        kids[k] = t;
    }
}

/* Tries node's children against r (scratch, which the first rejection
 * fills from p); the accepted child, or -1 with r left holding the rest. */
static int try_children(const struct speculate_tree_input *in, int node, uint64_t pos, float *r, bool *r_used)
{
    int kids[SPECULATE_TREE_NODES_MAX];
    const int n_kids = children_of(in, node, kids);
    const bool faulty = in->fault == SPECULATE_TREE_FAULT_FIXED_ORDER_NO_RESIDUAL;
    if (!faulty)
        shuffle(in, pos, kids, n_kids);
    const float *p = p_row(in, node);
    double sum = 1.0; /* the row itself counts as normalized, as in the chain's test */
    *r_used = false;
    for (int j = 0; j < n_kids; j++) {
        const int c = kids[j];
        const int32_t x = in->tokens[c];
        const float *q = q_row(in, c);
        const double qx = q ? (double)q[x] : 1.0;
        const double rx = *r_used ? (double)r[x] : (double)p[x];
        const float u = philox_uniform(in->seed, PHILOX_STREAM_TARGET_ACCEPT, pos, (uint32_t)j);
        if ((double)u * qx * sum < rx) /* q(x) = 0 < r(x): accepted, the limit of min(1, r/q) */
            return c;
        if (faulty)
            continue;
        if (!*r_used) {
            memcpy(r, p, (size_t)in->vocab * sizeof *r);
            *r_used = true;
        }
        if (q) {
            /* r holds the residual scaled by its sum: q is taken off at
             * that scale (the first time sum is 1, the chain's arithmetic) */
            const float scale = (float)sum;
            for (int v = 0; v < in->vocab; v++) {
                const float d = r[v] - q[v] * scale;
                r[v] = d > 0.0f ? d : 0.0f;
            }
        } else {
            r[x] = 0.0f;
        }
        sum = 0.0;
        for (int v = 0; v < in->vocab; v++)
            sum += (double)r[v];
    }
    return -1;
}

int speculate_tree_verify(const struct speculate_tree_input *in, float *scratch, int32_t *tokens_out,
                          int32_t *path_out, int *n_accepted_out, char *err)
{
    int rc = validate(in, scratch, tokens_out, n_accepted_out, err);
    if (rc)
        return rc;
    if (in->greedy)
        return walk_greedy(in, tokens_out, path_out, n_accepted_out, err);
    int node = -1, depth = 0;
    for (;;) {
        const uint64_t pos = in->position0 + (uint64_t)depth;
        bool r_used = false;
        const int next = try_children(in, node, pos, scratch, &r_used);
        if (next < 0) {
            *n_accepted_out = depth;
            return draw_rest(in, node, r_used ? scratch : NULL, pos, &tokens_out[depth], err);
        }
        tokens_out[depth] = in->tokens[next];
        if (path_out)
            path_out[depth] = next;
        depth++;
        node = next;
    }
}
