/* llama_step.c: one forward chunk's ops on the backend.
 *
 * Where the backend takes steps (kernels.h: step_reserve .. step_end), a
 * chunk's small host arrays reach it in one transfer (step_begin) instead
 * of once per op, and its ops allocate nothing. Where it also records
 * graphs, a chunk of up to LLAMA_GRAPH_MAX_ROWS rows runs as the graph
 * recorded for its shape (rows, sequences, attention bound), recorded the
 * second time that shape comes: one launch instead of nine a layer. A graph
 * replays the very kernels of an eager run with the same arguments, and
 * the step makes every argument a function of the shape (the layout's
 * table stride and attention's grid follow the bound, not the rows'
 * positions; the arrays sit at fixed addresses), so a replay gives the
 * bits the eager run would (tests/gpu/test_cuda_graphs.c checks it; in CI,
 * tests/unit/test_llama_graphs.c on a CPU backend that records).
 *
 * A recording that fails (a backend refusing an op inside it) turns graphs
 * off for the context with a warning and the chunk runs eagerly: graphs
 * are a speed choice, never a reason to fail a call.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "llama_private.h"
#include "logging.h"

/* One product of ctx->xn ([n, hidden_size]) with a weight [d_out,
 * hidden_size] into out ([n, d_out]). */
struct product {
    const struct llama_weight *w;
    float *out;
    int d_out;
};

/* count products (at most 4) that share ctx->xn as input: one matmul_multi
 * where the backend has it and the weights share a dtype, else one matmul
 * each (the same bits either way). */
static int products(struct llama_ctx *ctx, const struct product *p, int count, int n, char *err)
{
    struct kern_backend *be = ctx->be;
    const int d_in = ctx->model->cfg.hidden_size;
    bool same = be->ops->matmul_multi != NULL;
    for (int j = 1; j < count; j++)
        same = same && p[j].w->dtype == p[0].w->dtype;
    if (same) {
        float *outs[4];
        const void *ptrs[4];
        int d_outs[4];
        for (int j = 0; j < count; j++) {
            outs[j] = p[j].out;
            ptrs[j] = p[j].w->ptr;
            d_outs[j] = p[j].d_out;
        }
        return be->ops->matmul_multi(be, count, outs, ctx->xn, ptrs, p[0].w->dtype, n, d_in,
                                     d_outs, err);
    }
    for (int j = 0; j < count; j++) {
        int rc = be->ops->matmul(be, p[j].out, ctx->xn, p[j].w->ptr, p[j].w->dtype, n, d_in,
                                 p[j].d_out, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int qkv(struct llama_ctx *ctx, const struct llama_layer *L, int n, char *err)
{
    const struct model_config *c = &ctx->model->cfg;
    const int kv_dim = c->num_key_value_heads * c->head_dim;
    const struct product p[3] = {
        {&L->wq, ctx->q, c->num_attention_heads * c->head_dim},
        {&L->wk, ctx->k, kv_dim},
        {&L->wv, ctx->v, kv_dim},
    };
    return products(ctx, p, 3, n, err);
}

/* ctx->gate = silu(gate product) * up product: one matmul_swiglu where the
 * backend has it (the same bits), else both products and swiglu. */
static int gate_up(struct llama_ctx *ctx, const struct llama_layer *L, int n, char *err)
{
    const struct model_config *c = &ctx->model->cfg;
    struct kern_backend *be = ctx->be;
    if (be->ops->matmul_swiglu && L->w_gate.dtype == L->w_up.dtype)
        return be->ops->matmul_swiglu(be, ctx->gate, ctx->up, ctx->xn, L->w_gate.ptr,
                                      L->w_up.ptr, L->w_gate.dtype, n, c->hidden_size,
                                      c->intermediate_size, err);
    const struct product p[2] = {
        {&L->w_gate, ctx->gate, c->intermediate_size},
        {&L->w_up, ctx->up, c->intermediate_size},
    };
    int rc = products(ctx, p, 2, n, err);
    if (rc == 0)
        rc = be->ops->swiglu(be, ctx->gate, ctx->gate, ctx->up,
                             (size_t)n * (size_t)c->intermediate_size, err);
    return rc;
}

/* rope of q and k, and k and v into the layer's pools, op by op. */
static int rope_and_store(struct llama_ctx *ctx, float *k_pool, float *v_pool, int n,
                          const struct kern_kv_layout *kv, char *err)
{
    const struct llama_model *m = ctx->model;
    const struct model_config *c = &m->cfg;
    struct kern_backend *be = ctx->be;
    const int hd = c->head_dim, n_kv = c->num_key_value_heads;
    int rc;
    if ((rc = be->ops->rope(be, ctx->q, ctx->positions, n, c->num_attention_heads, hd,
                            m->inv_freq, err)) ||
        (rc = be->ops->rope(be, ctx->k, ctx->positions, n, n_kv, hd, m->inv_freq, err)))
        return rc;
    return be->ops->kv_store(be, k_pool, v_pool, ctx->k, ctx->v, n, kv, n_kv * hd, err);
}

/* The residual add and the norm after it: x += proj, then xn =
 * rmsnorm(x) * w, fused where the backend has add_rmsnorm (the same bits);
 * w NULL (after the last layer): the add alone. */
static int add_norm(struct llama_ctx *ctx, const struct llama_weight *w, int n, char *err)
{
    struct kern_backend *be = ctx->be;
    const struct model_config *c = &ctx->model->cfg;
    const int dim = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;
    if (w && be->ops->add_rmsnorm)
        return be->ops->add_rmsnorm(be, ctx->xn, ctx->x, ctx->proj, w->ptr, w->dtype, n, dim, eps,
                                    err);
    int rc = be->ops->add(be, ctx->x, ctx->proj, (size_t)n * (size_t)dim, err);
    if (rc == 0 && w)
        rc = be->ops->rmsnorm(be, ctx->xn, ctx->x, w->ptr, w->dtype, n, dim, eps, err);
    return rc;
}

/* Runs the n rows of one chunk (ctx->tokens, ctx->positions, kv: their
 * slots and positions), leaving the final hidden states in ctx->x. Each
 * layer starts with xn = attn_norm(x) made by the one before it (the first
 * by the embedding's norm below). */
static int forward_chunk(struct llama_ctx *ctx, int n, const struct kern_kv_layout *kv, char *err)
{
    const struct llama_model *m = ctx->model;
    const struct model_config *c = &m->cfg;
    struct kern_backend *be = ctx->be;
    const struct kern_ops *ops = be->ops;
    const int dim = c->hidden_size, n_heads = c->num_attention_heads,
              n_kv = c->num_key_value_heads, hd = c->head_dim, ff = c->intermediate_size;
    const int q_dim = n_heads * hd, n_layers = c->num_hidden_layers;
    const float eps = (float)c->rms_norm_eps;
    const float scale = 1.0f / sqrtf((float)hd);
    int rc;

    if ((rc = ops->embed(be, ctx->x, m->embed.ptr, m->embed.dtype, ctx->tokens, n, dim, err)) ||
        (rc = ops->rmsnorm(be, ctx->xn, ctx->x, m->layers[0].attn_norm.ptr,
                           m->layers[0].attn_norm.dtype, n, dim, eps, err)))
        return rc;
    for (int l = 0; l < n_layers; l++) {
        const struct llama_layer *L = &m->layers[l];
        float *k_pool = ctx->kv_pool + (size_t)l * 2 * ctx->kv_plane;
        float *v_pool = k_pool + ctx->kv_plane;
        if ((rc = qkv(ctx, L, n, err)) ||
            (rc = ops->rope_kv_store
                      ? ops->rope_kv_store(be, ctx->q, ctx->k, ctx->v, ctx->positions, n, n_heads,
                                           n_kv, hd, m->inv_freq, k_pool, v_pool, kv, err)
                      : rope_and_store(ctx, k_pool, v_pool, n, kv, err)) ||
            (rc = ops->attention(be, ctx->att, ctx->q, k_pool, v_pool, n, kv, n_heads, n_kv, hd,
                                 scale, err)) ||
            (rc = ops->matmul(be, ctx->proj, ctx->att, L->wo.ptr, L->wo.dtype, n, q_dim, dim, err)) ||
            (rc = add_norm(ctx, &L->ffn_norm, n, err)) ||
            (rc = gate_up(ctx, L, n, err)) ||
            (rc = ops->matmul(be, ctx->proj, ctx->gate, L->w_down.ptr, L->w_down.dtype, n, ff, dim,
                              err)) ||
            (rc = add_norm(ctx, l + 1 < n_layers ? &m->layers[l + 1].attn_norm : NULL, n, err)))
            return rc;
    }
    return 0;
}

int llama_step_positions(const struct llama_ctx *ctx, int max_pos_plus1)
{
    int bound = 256;
    while (bound < max_pos_plus1 && bound < ctx->max_seq_len)
        bound *= 2;
    return bound < ctx->max_seq_len ? bound : ctx->max_seq_len;
}

int llama_step_init(struct llama_ctx *ctx, bool no_graphs, char *err)
{
    const struct kern_ops *ops = ctx->be->ops;
    if (!ops->step_reserve || !ops->step_begin || !ops->step_end)
        return 0;
    const struct model_config *c = &ctx->model->cfg;
    const struct kern_step_limits lim = {
        .max_rows = ctx->max_rows,
        .max_seqs = ctx->max_rows < ctx->n_slots ? ctx->max_rows : ctx->n_slots,
        .table_stride = ctx->table_stride,
        .max_positions = ctx->max_seq_len,
        .max_freq = c->head_dim / 2,
        .n_heads = c->num_attention_heads,
        .head_dim = c->head_dim,
    };
    int rc = ops->step_reserve(ctx->be, &lim, err);
    if (rc)
        return rc;
    ctx->steps = true;
    ctx->graphs = !no_graphs && ops->graph_capture_begin && ops->graph_capture_end &&
                  ops->graph_launch && ops->graph_destroy;
    return 0;
}

static void drop_graphs(struct llama_ctx *ctx)
{
    for (int i = 0; i < ctx->n_graphs; i++)
        ctx->be->ops->graph_destroy(ctx->be, ctx->graph[i].g);
    ctx->n_graphs = 0;
}

void llama_step_release(struct llama_ctx *ctx) { drop_graphs(ctx); }

static struct llama_graph *find_graph(struct llama_ctx *ctx, int n, int n_seqs, int max_positions)
{
    for (int i = 0; i < ctx->n_graphs; i++) {
        struct llama_graph *g = &ctx->graph[i];
        if (g->n == n && g->n_seqs == n_seqs && g->max_positions == max_positions)
            return g;
    }
    return NULL;
}

/* A shape seen for the first time: an entry without a graph (the least
 * recently used entry makes room). */
static struct llama_graph *note_shape(struct llama_ctx *ctx, int n, int n_seqs, int max_positions)
{
    if (ctx->n_graphs == LLAMA_GRAPHS_MAX) {
        int lru = 0;
        for (int i = 1; i < ctx->n_graphs; i++)
            if (ctx->graph[i].last_use < ctx->graph[lru].last_use)
                lru = i;
        ctx->be->ops->graph_destroy(ctx->be, ctx->graph[lru].g);
        ctx->graph[lru] = ctx->graph[--ctx->n_graphs];
    }
    struct llama_graph *g = &ctx->graph[ctx->n_graphs++];
    *g = (struct llama_graph){.n = n, .n_seqs = n_seqs, .max_positions = max_positions};
    return g;
}

/* Records the chunk's ops into entry g: true, or false with graphs turned
 * off and every entry gone (the warning says why). */
static bool record_graph(struct llama_ctx *ctx, struct llama_graph *g,
                         const struct kern_kv_layout *kv)
{
    struct kern_backend *be = ctx->be;
    char why[ERR_MSG_MAX] = "", why_end[ERR_MSG_MAX] = "";
    struct kern_graph *kg = NULL;
    int rc = be->ops->graph_capture_begin(be, why);
    if (rc == 0) {
        rc = forward_chunk(ctx, g->n, kv, why);
        /* the recording ends whatever happened inside it */
        const int rc_end = be->ops->graph_capture_end(be, &kg, why_end);
        if (rc == 0 && rc_end != 0) {
            rc = rc_end;
            memcpy(why, why_end, sizeof why);
        }
    }
    if (rc != 0 || !kg) {
        be->ops->graph_destroy(be, kg);
        LOG_WARN("forward: graphs off for this context, a recording of %d rows failed: %s", g->n,
                 why);
        ctx->graphs = false;
        drop_graphs(ctx);
        return false;
    }
    g->g = kg;
    ctx->graphs_recorded++;
    return true;
}

/* The chunk as a graph: false where it must run op by op instead. A shape
 * is recorded the second time it comes, not the first: a shape that never
 * comes back (a prompt of an odd length) costs no recording, and every
 * kernel a recording holds has run once before it (modules loaded). */
static bool run_graph(struct llama_ctx *ctx, int n, const struct kern_kv_layout *kv,
                      int max_positions, int *rc, char *err)
{
    struct kern_backend *be = ctx->be;
    struct llama_graph *g = find_graph(ctx, n, kv->n_seqs, max_positions);
    if (!g) {
        note_shape(ctx, n, kv->n_seqs, max_positions)->last_use = ++ctx->graph_clock;
        return false;
    }
    g->last_use = ++ctx->graph_clock;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!g->g && !record_graph(ctx, g, kv))
            return false;
        *rc = be->ops->graph_launch(be, g->g, err);
        if (*rc != ERR_NOT_FOUND)
            break;
        /* the memory the graphs read moved (a larger reservation on a
         * shared backend): every graph is stale; the shapes stay known */
        for (int i = 0; i < ctx->n_graphs; i++) {
            be->ops->graph_destroy(be, ctx->graph[i].g);
            ctx->graph[i].g = NULL;
        }
    }
    if (*rc == 0)
        ctx->graphs_replayed++;
    return true;
}

int llama_step_run(struct llama_ctx *ctx, int n, const struct kern_kv_layout *kv,
                   int max_positions, char *err)
{
    /* a tree's paths are no part of a step (cuda's step_begin refuses
     * them): its ops read their host arrays themselves */
    if (!ctx->steps || kv->path_offset)
        return forward_chunk(ctx, n, kv, err);
    struct kern_backend *be = ctx->be;
    const struct kern_step step = {.n = n, .ids = ctx->tokens, .positions = ctx->positions,
                                   .inv_freq = ctx->model->inv_freq,
                                   .n_freq = ctx->model->cfg.head_dim / 2, .kv = kv,
                                   .max_positions = max_positions};
    int rc = be->ops->step_begin(be, &step, err);
    if (rc)
        return rc;
    if (!(ctx->graphs && n <= LLAMA_GRAPH_MAX_ROWS && run_graph(ctx, n, kv, max_positions, &rc,
                                                                 err)))
        rc = forward_chunk(ctx, n, kv, err);
    be->ops->step_end(be);
    return rc;
}
