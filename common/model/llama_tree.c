/* llama_tree.c: token trees in the forward pass and the KV after a tree
 * (docs/token-trees.md, issue 61): a chunk's paths for the kernels (node i
 * of a tree over a slot of length L at logical position L + depth - 1,
 * stored at L + i), and llama_ctx_tree_accept, which moves the accepted
 * path's rows down to L .. L + m - 1 before anything of it is named in the
 * prefix cache. What a slot's unaccepted tree forbids (other forwards, cuts
 * inside it, published blocks) is checked in llama.c, beside the rules it
 * extends. */
#include <string.h>

#include "error.h"
#include "llama_private.h"

/* The paths of the chunk's tree nodes (struct kern_kv_layout): node i of a
 * tree over a slot of length L moves to its logical position L + depth - 1
 * (ctx->positions: RoPE; rows: attention's bound) and reads its ancestors
 * and itself at their slots L + index. Chains' rows get empty paths. */
void llama_tree_chunk_paths(struct llama_ctx *ctx, const struct llama_seq_batch *seqs,
                            const struct llama_chunk_part *parts, int n_parts,
                            struct kern_kv_layout *kv)
{
    int32_t off = 0;
    ctx->path_offset[0] = 0;
    for (int p = 0; p < n_parts; p++) {
        const struct llama_chunk_part *cp = &parts[p];
        const struct llama_seq_batch *s = &seqs[cp->seq];
        const int L = ctx->slot_len[s->slot];
        for (int i = 0; i < cp->n; i++) {
            const int r = cp->chunk_row + i;
            if (s->parents) {
                int32_t up[LLAMA_TREE_MAX];
                int depth = 0;
                for (int32_t node = cp->tok0 + i; node >= 0; node = s->parents[node])
                    up[depth++] = node;
                for (int d = 0; d < depth; d++)
                    ctx->path_phys[off++] = L + up[depth - 1 - d];
                ctx->positions[r] = L + depth - 1;
                ctx->rows[2 * r + 1] = L + depth - 1;
            }
            ctx->path_offset[r + 1] = off;
        }
    }
    kv->path_offset = ctx->path_offset;
    kv->path_phys = ctx->path_phys;
}

int llama_ctx_tree_nodes(const struct llama_ctx *ctx, int slot)
{
    return slot >= 0 && slot < ctx->n_slots ? ctx->tree_n[slot] : 0;
}

/* Copies the keys and values of every layer at pool position `from` of slot
 * to position `to` (to < from: the path moves down, never onto a node it
 * still has to read). */
static int copy_kv_position(struct llama_ctx *ctx, int slot, int from, int to, char *err)
{
    const struct model_config *c = &ctx->model->cfg;
    const int32_t *table = ctx->tables + (size_t)slot * (size_t)ctx->table_stride;
    const size_t kv_dim = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    const int bs = ctx->block_size;
    const size_t src = ((size_t)table[from / bs] * (size_t)bs + (size_t)(from % bs)) * kv_dim;
    const size_t dst = ((size_t)table[to / bs] * (size_t)bs + (size_t)(to % bs)) * kv_dim;
    for (size_t plane = 0; plane < 2 * (size_t)c->num_hidden_layers; plane++) {
        float *base = ctx->kv_pool + plane * ctx->kv_plane;
        int rc = ctx->be->ops->copy(ctx->be, base + dst, base + src, kv_dim * sizeof(float), err);
        if (rc)
            return rc;
    }
    return 0;
}

int llama_ctx_tree_accept(struct llama_ctx *ctx, int slot, const int32_t *path, int m, char *err)
{
    if (slot < 0 || slot >= ctx->n_slots)
        return error_set(err, ERR_RANGE, "slot: must be in 0..%d, got %d", ctx->n_slots - 1, slot);
    const int n = ctx->tree_n[slot], L = ctx->tree_base[slot];
    if (n == 0)
        return error_set(err, ERR_INVALID_ARG, "tree accept: slot %d holds no unaccepted tree",
                         slot);
    if (m < 0 || m > n || (m > 0 && !path))
        return error_set(err, ERR_INVALID_ARG, "tree accept: a path of %d nodes in a tree of %d",
                         m, n);
    const int32_t *parents = ctx->tree_parents + (size_t)slot * LLAMA_TREE_MAX;
    const int32_t *tree_tokens = ctx->tree_tokens + (size_t)slot * LLAMA_TREE_MAX;
    int32_t tokens[LLAMA_TREE_MAX];
    for (int j = 0; j < m; j++) {
        if (path[j] < 0 || path[j] >= n || parents[path[j]] != (j > 0 ? path[j - 1] : -1))
            return error_set(err, ERR_INVALID_ARG,
                             "tree accept: path[%d] = %d is not a child of %d in slot %d's tree",
                             j, path[j], j > 0 ? path[j - 1] : -1, slot);
        tokens[j] = tree_tokens[path[j]];
    }
    /* path[j] >= j (parents come first), so each copy reads a node no
     * earlier copy wrote */
    for (int j = 0; j < m; j++) {
        if (path[j] == j)
            continue;
        int rc = copy_kv_position(ctx, slot, L + path[j], L + j, err);
        if (rc) {
            /* half moved: the tree is gone either way */
            ctx->tree_n[slot] = 0;
            ctx->slot_len[slot] = L;
            llama_kv_release_blocks(ctx, slot, llama_kv_blocks_for_len(ctx, L));
            llama_kv_check_after(ctx, "tree accept (copy failed)");
            return rc;
        }
    }
    ctx->tree_n[slot] = 0;
    ctx->slot_len[slot] = L + m;
    llama_kv_release_blocks(ctx, slot, llama_kv_blocks_for_len(ctx, L + m));
    if (ctx->kb.cache_on)
        llama_kv_note_appended(ctx, slot, L, tokens, m);
    llama_kv_check_after(ctx, "tree accept");
    return 0;
}

