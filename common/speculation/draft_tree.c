/* draft_tree.c: see draft_tree.h. */
#include "draft_tree.h"

void draft_tree_clear(struct draft_tree *t)
{
    t->n = 0;
}

/* The child of `parent` (-1: the root) holding `token`, or -1. Children come
 * after their parent, so the scan starts there. */
static int child_of(const struct draft_tree *t, int parent, int32_t token)
{
    for (int i = parent + 1; i < t->n; i++)
        if (t->parents[i] == parent && t->tokens[i] == token)
            return i;
    return -1;
}

int draft_tree_add_chain(struct draft_tree *t, const int32_t *chain, int n, int32_t weight,
                         int nodes_max)
{
    if (nodes_max > DRAFT_TREE_NODES_MAX)
        nodes_max = DRAFT_TREE_NODES_MAX;
    int node = -1, held = 0;
    for (; held < n; held++) {
        int next = child_of(t, node, chain[held]);
        if (next < 0) {
            if (t->n >= nodes_max)
                break;
            next = t->n++;
            t->tokens[next] = chain[held];
            t->parents[next] = node;
            t->weight[next] = 0;
        }
        t->weight[next] += weight;
        node = next;
    }
    return held;
}

int draft_tree_depth(const struct draft_tree *t, int i)
{
    int d = 0;
    for (; i >= 0; i = t->parents[i])
        d++;
    return d;
}

int draft_tree_match(const struct draft_tree *t, const int32_t *want, int n)
{
    int node = -1, k = 0;
    while (k < n && (node = child_of(t, node, want[k])) >= 0)
        k++;
    return k;
}
