/* llama.c: the Llama forward pass, written once against the kernel op table.
 *
 * What it is: embedding, per layer RMSNorm -> q/k/v projections -> RoPE
 * (Llama-3 scaled frequencies) -> KV cache store -> grouped-query attention
 * -> output projection + residual -> RMSNorm -> SwiGLU MLP + residual, then
 * the final norm and the (tied or untied) LM head for the rows asked for.
 * What it is not: a sampler or a scheduler; it returns logits.
 *
 * The KV cache is paged: one pool of blocks of block_size positions (every
 * layer's keys and values for those positions) shared by all slots; each
 * slot has a block table. A slot takes blocks as it grows and gives them back
 * when truncated, so memory in use follows the tokens cached, not slots x
 * context length.
 *
 * A call packs the rows of all its sequences into one activation matrix,
 * each row with its own slot and position: the weights are read once for
 * every sequence of the call. Rows are processed in chunks of max_rows that
 * may span sequences; a row's keys and values are stored before any row of
 * the chunk attends, and every kernel computes a row independently of the
 * others, so neither packing nor chunking changes a result.
 *
 * Prefix caching: every block a slot fills is published under the name of
 * its token prefix (kv_blocks.h), and kept after its slots let go until the
 * pool needs it. A new sequence maps the longest chain of published blocks
 * its prompt starts with (llama_ctx_prefix_map) and computes the rest. The
 * kernels compute a row independently of the others, so a mapped block
 * holds exactly the bits the sequence would have computed itself.
 *
 * Invariants: a slot's cache holds positions 0 .. len-1 of one sequence in
 * blocks table[0 .. ceil(len / block_size) - 1]; positions >= len are
 * garbage and never read. A block is free, cached, or in one or more
 * tables (kv_blocks.h); the block a slot writes next is in its table only
 * and not published, so a write never reaches another slot's positions.
 * A call either appends all of its tokens to every slot it names or (on a
 * validation error, including a pool too small for it) changes nothing.
 */
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "kv_blocks.h"
#include "llama_private.h"
#include "logging.h"
#include "quantize.h"
#include "safetensors.h"

/* The quantized copy of t (m->quant), a matrix [d0, d1], mapped: int4
 * where its rows split into groups of 32, else int8. */
static int map_quantized(struct llama_model *m, const char *name, const struct safetensors_tensor *t,
                         struct llama_weight *w, char *err)
{
    const int64_t d0 = t->shape[0], d1 = t->shape[1];
    void *buf = NULL;
    char why[ERR_MSG_MAX];
    const bool q4 = m->quant == QUANTIZE_INT4 && d1 % KERN_Q4_GROUP == 0;
    int rc = q4 ? quantize_q4(t->data, t->dtype, d0, d1, &buf, why)
                : quantize_q8(t->data, t->dtype, d0, d1, &buf, why);
    if (rc)
        return error_set(err, rc, "%s: %s", name, why);
    const enum kern_dtype dt = q4 ? KERN_DTYPE_Q4 : KERN_DTYPE_Q8;
    const void *dev;
    const size_t bytes = q4 ? kern_q4_bytes(d0, d1) : kern_q8_bytes(d0, d1);
    /* cuda has no map_matrix: its kernels read the layout as it is */
    rc = m->be->ops->map_matrix ? m->be->ops->map_matrix(m->be, buf, dt, d0, d1, &dev, err)
                                : m->be->ops->map_weights(m->be, buf, bytes, &dev, err);
    if (rc) {
        free(buf);
        return rc;
    }
    /* a backend that copied it (cpu: every tensor of a huge page or more)
     * reads its copy: ours would only double the weights' memory */
    if (dev != buf)
        free(buf);
    else
        m->qbufs[m->n_qbufs++] = buf;
    m->mapped[m->n_mapped++] = dev;
    w->ptr = dev;
    w->dtype = dt;
    m->file_bytes += t->size_bytes;
    m->held_bytes += bytes;
    return 0;
}

/* Loads of a few seconds or more say how far they are (a model of tens of
 * GB is minutes of reading, copying to the device or quantizing, and
 * silence looks like a hang): the first line after LLAMA_LOAD_QUIET_S,
 * then one per tenth of the bytes or per LLAMA_LOAD_EVERY_S, whichever
 * comes first. A quick load says nothing until its summary. */
#define LLAMA_LOAD_QUIET_S 2.0
#define LLAMA_LOAD_EVERY_S 2.0

static double load_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void load_begin(struct llama_model *m)
{
    m->n_tensors = (int)safetensors_count(m->st);
    for (size_t i = 0; i < safetensors_count(m->st); i++)
        m->load_total_bytes += safetensors_at(m->st, i)->size_bytes;
    m->load_t0_s = m->load_logged_s = load_now_s();
}

/* One tensor more is mapped (its bytes counted in m->file_bytes). */
static void load_progress(struct llama_model *m)
{
    m->n_loaded++;
    double now = load_now_s();
    int decile = m->load_total_bytes ? (int)(10 * m->file_bytes / m->load_total_bytes) : 10;
    if (now - m->load_t0_s < LLAMA_LOAD_QUIET_S ||
        (decile == m->load_logged_decile && now - m->load_logged_s < LLAMA_LOAD_EVERY_S))
        return;
    m->load_logged_decile = decile;
    m->load_logged_s = now;
    LOG_INFO("loading weights: %.0f%%, %.2f of %.2f GiB, %d of %d tensors, %.1f s",
             m->load_total_bytes ? 100.0 * (double)m->file_bytes / (double)m->load_total_bytes : 100.0,
             (double)m->file_bytes / (1 << 30), (double)m->load_total_bytes / (1 << 30), m->n_loaded, m->n_tensors,
             now - m->load_t0_s);
}

/* A tensor as the model expects it in the files. */
struct tensor_want {
    const char *name;
    int64_t d0, d1;   /* [d0, d1], or a vector [d0] with d1 0 */
    /* a layer's projection, which m->quant applies to (the embedding, the
     * LM head and the norms keep the files' precision) */
    bool quantizable;
};

static int map_tensor(struct llama_model *m, const struct tensor_want *want, struct llama_weight *w,
                      char *err)
{
    const char *name = want->name;
    const int64_t d0 = want->d0, d1 = want->d1;
    const int n_dims = d1 > 0 ? 2 : 1;
    const struct safetensors_tensor *t;
    int64_t shape[2] = {d0, d1};
    int rc = safetensors_expect(m->st, name, n_dims, shape, &t, err);
    if (rc)
        return rc;
    if (want->quantizable && n_dims == 2 && m->quant != QUANTIZE_NONE) {
        if ((rc = map_quantized(m, name, t, w, err)) == 0)
            load_progress(m);
        return rc;
    }
    m->file_bytes += t->size_bytes;
    m->held_bytes += t->size_bytes;
    const void *dev;
    /* The matrices only matmul and embed read: the backend may lay them out
     * for its kernels. */
    if (n_dims == 2 && m->be->ops->map_matrix)
        rc = m->be->ops->map_matrix(m->be, t->data, t->dtype, d0, d1, &dev, err);
    else
        rc = m->be->ops->map_weights(m->be, t->data, t->size_bytes, &dev, err);
    if (rc)
        return rc;
    m->mapped[m->n_mapped++] = dev;
    w->ptr = dev;
    w->dtype = t->dtype;
    load_progress(m);
    return 0;
}

static size_t weight_bytes(const struct llama_weight *w, size_t count)
{
    if (w->dtype == KERN_DTYPE_Q4) /* a scale of 4 bytes per 32 weights beside their 16 */
        return count / KERN_Q4_GROUP * KERN_Q4_GROUP_BYTES;
    return count * kern_dtype_size(w->dtype);
}

int llama_model_load(struct llama_model **out, const char *model_dir, struct kern_backend *be,
                     char *err)
{
    return llama_model_load_quantized(out, model_dir, be, QUANTIZE_NONE, err);
}

int llama_model_load_quantized(struct llama_model **out, const char *model_dir,
                               struct kern_backend *be, enum quantize_mode quant, char *err)
{
    int rc;
    *out = NULL;
    if (quant != QUANTIZE_NONE && strcmp(be->name, "cpu") != 0 && strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_UNSUPPORTED,
                         "quantize %s: the %s backend has no kernels for quantized weights (cpu and cuda "
                         "have)",
                         quantize_mode_name(quant), be->name);
    struct llama_model *m = calloc(1, sizeof *m);
    if (!m)
        return error_set(err, ERR_NOMEM, "llama model: out of memory");
    m->be = be;
    m->quant = quant;
    rc = model_config_load(&m->cfg, model_dir, err);
    if (rc)
        goto fail;
    rc = safetensors_open(&m->st, model_dir, err);
    if (rc)
        goto fail;
    rc = model_config_check_weights(&m->cfg, m->st, err);
    if (rc)
        goto fail;
    load_begin(m);

    const struct model_config *c = &m->cfg;
    const int64_t dim = c->hidden_size, ff = c->intermediate_size;
    const int64_t q_dim = (int64_t)c->num_attention_heads * c->head_dim;
    const int64_t kv_dim = (int64_t)c->num_key_value_heads * c->head_dim;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    m->mapped = calloc((size_t)c->num_hidden_layers * 9 + 3, sizeof *m->mapped);
    m->inv_freq = calloc((size_t)c->head_dim / 2, sizeof *m->inv_freq);
    m->qbufs = calloc((size_t)c->num_hidden_layers * 7, sizeof *m->qbufs);
    if (!m->layers || !m->mapped || !m->inv_freq || !m->qbufs) {
        rc = error_set(err, ERR_NOMEM, "llama model: out of memory");
        goto fail;
    }
    model_config_rope_inv_freq(c, m->inv_freq);

    const struct tensor_want embed = {"model.embed_tokens.weight", c->vocab_size, dim, false};
    const struct tensor_want norm = {"model.norm.weight", dim, 0, false};
    const struct tensor_want lm_head = {"lm_head.weight", c->vocab_size, dim, false};
    if ((rc = map_tensor(m, &embed, &m->embed, err)) || (rc = map_tensor(m, &norm, &m->norm, err)))
        goto fail;
    if (c->tie_word_embeddings)
        m->lm_head = m->embed;
    else if ((rc = map_tensor(m, &lm_head, &m->lm_head, err)))
        goto fail;

    size_t per_token = weight_bytes(&m->norm, (size_t)dim) +
                       weight_bytes(&m->lm_head, (size_t)c->vocab_size * (size_t)dim);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        struct llama_layer *L = &m->layers[l];
        char name[128];
#define LAYER_TENSOR(field, suffix, nd, a, b)                                       \
    do {                                                                            \
        snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, suffix);        \
        if ((rc = map_tensor(m, &(struct tensor_want){name, a, b, (nd) == 2},       \
                             &L->field, err)))                                      \
            goto fail;                                                              \
        per_token += weight_bytes(&L->field, (size_t)(a) * (size_t)((nd) == 2 ? (b) : 1)); \
    } while (0)
        LAYER_TENSOR(attn_norm, "input_layernorm", 1, dim, 0);
        LAYER_TENSOR(wq, "self_attn.q_proj", 2, q_dim, dim);
        LAYER_TENSOR(wk, "self_attn.k_proj", 2, kv_dim, dim);
        LAYER_TENSOR(wv, "self_attn.v_proj", 2, kv_dim, dim);
        LAYER_TENSOR(wo, "self_attn.o_proj", 2, dim, q_dim);
        LAYER_TENSOR(ffn_norm, "post_attention_layernorm", 1, dim, 0);
        LAYER_TENSOR(w_gate, "mlp.gate_proj", 2, ff, dim);
        LAYER_TENSOR(w_up, "mlp.up_proj", 2, ff, dim);
        LAYER_TENSOR(w_down, "mlp.down_proj", 2, dim, ff);
#undef LAYER_TENSOR
    }
    m->weight_bytes_per_token = per_token;
    LOG_INFO("weights loaded: %d tensors, %.2f GiB from %s in %.2f s", m->n_loaded,
             (double)m->file_bytes / (1 << 30), model_dir, load_now_s() - m->load_t0_s);
    *out = m;
    return 0;
fail:
    llama_model_destroy(m);
    return rc;
}

void llama_model_destroy(struct llama_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_mapped; i++)
        m->be->ops->unmap_weights(m->be, m->mapped[i]);
    free(m->mapped);
    for (int i = 0; i < m->n_qbufs; i++)
        free(m->qbufs[i]);
    free(m->qbufs);
    free(m->layers);
    free(m->inv_freq);
    safetensors_close(m->st);
    free(m);
}

const struct model_config *llama_model_config(const struct llama_model *m) { return &m->cfg; }

void llama_model_weight_memory(const struct llama_model *m, size_t *file_bytes, size_t *held_bytes)
{
    *file_bytes = m->file_bytes;
    *held_bytes = m->held_bytes;
}

size_t llama_model_weight_bytes_per_token(const struct llama_model *m)
{
    return m->weight_bytes_per_token;
}

static int ctx_alloc(struct llama_ctx *ctx, size_t count, float **out, char *err)
{
    return ctx->be->ops->alloc(ctx->be, count * sizeof(float), (void **)out, err);
}

/* Writes every row of the logits scratch once, at creation. On the CPU
 * backend a large buffer is a fresh anonymous mapping, committed 4 KiB page
 * by page as it is first written; rows past the first are first written by
 * the first verification of that many rows, which then paid for the faults:
 * on the 2-core VM the first 5-row call of the small pair took 24.8 ms
 * against 10-14 ms later (about 1,600 faults with the engine's own row
 * buffers), and the adaptive-K controller took that for the cost of K = 4.
 * Its 17 rows (8.7 MB at a 128,256 vocabulary) are in use at the first
 * long verification anyway. The KV pool is left lazy: it is sized for
 * every slot's whole context. */
static int ctx_touch_logits(struct llama_ctx *ctx, char *err)
{
    const size_t vocab = (size_t)ctx->model->cfg.vocab_size;
    float *zeros = calloc(vocab, sizeof(float));
    if (!zeros)
        return error_set(err, ERR_NOMEM, "llama context: out of memory");
    int rc = 0;
    for (size_t r = 0; r < LOGIT_ROWS && !rc; r++)
        rc = ctx->be->ops->upload(ctx->be, ctx->logits + r * vocab, zeros, vocab * sizeof(float),
                                  err);
    free(zeros);
    return rc;
}

/* The shape a context's params ask for, defaults filled in and checked
 * against the model: 0 with ctx's shape fields set, or the error. */
static int ctx_shape(struct llama_ctx *ctx, const struct model_config *c, const struct llama_ctx_params *params,
                     char *err)
{
    if (params->n_slots < 1 || params->n_slots > 4096)
        return error_set(err, ERR_INVALID_ARG, "n_slots: must be in 1..4096, got %d", params->n_slots);
    int max_seq = params->max_seq_len;
    if (max_seq == 0)
        max_seq = c->max_position_embeddings < LLAMA_DEFAULT_MAX_SEQ_LEN ? c->max_position_embeddings
                                                                         : LLAMA_DEFAULT_MAX_SEQ_LEN;
    if (max_seq < 2 || max_seq > c->max_position_embeddings)
        return error_set(err, ERR_INVALID_ARG,
                         "max_seq_len: must be in 2..%d (the model's max_position_embeddings), got %d",
                         c->max_position_embeddings, max_seq);
    int max_rows = params->max_rows ? params->max_rows : 256;
    if (max_rows < 1 || max_rows > 65536)
        return error_set(err, ERR_INVALID_ARG, "max_rows: must be in 1..65536, got %d", max_rows);
    int block_size = params->kv_block_size ? params->kv_block_size : LLAMA_DEFAULT_KV_BLOCK_SIZE;
    if (block_size < 1 || block_size > 4096)
        return error_set(err, ERR_INVALID_ARG, "kv_block_size: must be in 1..4096, got %d", block_size);
    const int table_stride = (max_seq + block_size - 1) / block_size;
    const long full_blocks = (long)params->n_slots * table_stride;
    long n_blocks = params->kv_blocks ? params->kv_blocks : full_blocks;
    if (n_blocks < 1 || n_blocks > full_blocks || n_blocks > INT32_MAX / block_size)
        return error_set(err, ERR_INVALID_ARG, "kv_blocks: must be in 1..%ld (every slot at its full context), got %ld",
                         full_blocks, n_blocks);
    ctx->n_slots = params->n_slots;
    ctx->max_seq_len = max_seq;
    ctx->max_rows = max_rows;
    ctx->block_size = block_size;
    ctx->n_blocks = (int)n_blocks;
    ctx->table_stride = table_stride;
    return 0;
}

/* The host-side bookkeeping of ctx: slots, block tables (all empty), a
 * step's rows, the block ledger. */
static int ctx_host_tables(struct llama_ctx *ctx, const struct llama_ctx_params *params, char *err)
{
    const size_t max_rows = (size_t)ctx->max_rows, table_stride = (size_t)ctx->table_stride;
    ctx->slot_len = calloc((size_t)ctx->n_slots, sizeof *ctx->slot_len);
    ctx->slot_blocks = calloc((size_t)ctx->n_slots, sizeof *ctx->slot_blocks);
    ctx->tables = malloc((size_t)ctx->n_slots * table_stride * sizeof *ctx->tables);
    ctx->tokens = calloc(max_rows, sizeof *ctx->tokens);
    ctx->positions = calloc(max_rows, sizeof *ctx->positions);
    ctx->rows = calloc(max_rows * 2, sizeof *ctx->rows);
    ctx->chunk_tables = malloc(max_rows * table_stride * sizeof *ctx->chunk_tables);
    ctx->chunk_seq_of = malloc((size_t)ctx->n_slots * sizeof *ctx->chunk_seq_of);
    ctx->path_offset = calloc(max_rows + 1, sizeof *ctx->path_offset);
    ctx->path_phys = calloc(max_rows * LLAMA_TREE_MAX, sizeof *ctx->path_phys);
    ctx->tree_base = calloc((size_t)ctx->n_slots, sizeof *ctx->tree_base);
    ctx->tree_n = calloc((size_t)ctx->n_slots, sizeof *ctx->tree_n);
    ctx->tree_tokens = calloc((size_t)ctx->n_slots * LLAMA_TREE_MAX, sizeof *ctx->tree_tokens);
    ctx->tree_parents = calloc((size_t)ctx->n_slots * LLAMA_TREE_MAX, sizeof *ctx->tree_parents);
    if (!ctx->slot_len || !ctx->slot_blocks || !ctx->tables || !ctx->tokens || !ctx->positions || !ctx->rows ||
        !ctx->chunk_tables || !ctx->chunk_seq_of || !ctx->path_offset || !ctx->path_phys ||
        !ctx->tree_base || !ctx->tree_n || !ctx->tree_tokens || !ctx->tree_parents)
        return error_set(err, ERR_NOMEM, "llama context: out of memory");
    for (size_t i = 0; i < (size_t)ctx->n_slots * table_stride; i++)
        ctx->tables[i] = -1;
    for (int s = 0; s < ctx->n_slots; s++)
        ctx->chunk_seq_of[s] = -1;
    const int cap_blocks = params->prefix_cache_tokens > 0
                               ? (params->prefix_cache_tokens + ctx->block_size - 1) / ctx->block_size
                               : 0;
    return kv_blocks_init(&ctx->kb, ctx->n_blocks, ctx->block_size, params->prefix_cache, cap_blocks, err);
}

/* The backend's buffers of ctx: the KV pool, a step's activations and the
 * logits rows. */
static int ctx_backend_buffers(struct llama_ctx *ctx, const struct model_config *c, char *err)
{
    const size_t kv_dim = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    ctx->kv_plane = (size_t)ctx->n_blocks * (size_t)ctx->block_size * kv_dim;
    const size_t kv_bytes = ctx->kv_plane * 2 * (size_t)c->num_hidden_layers * sizeof(float);
    char why[ERR_MSG_MAX] = "";
    int rc = ctx_alloc(ctx, kv_bytes / sizeof(float), &ctx->kv_pool, why);
    if (rc)
        /* Say what the bytes are for and which settings size them: on a GPU
         * the backend's reason carries the device's free and total memory. */
        return error_set(err, rc,
                         "kv cache: %d blocks of %d positions (%d slots x max_seq_len %d) need %zu "
                         "bytes on the %s backend: %s; lower max_seq_len, n_slots or kv_blocks",
                         ctx->n_blocks, ctx->block_size, ctx->n_slots, ctx->max_seq_len, kv_bytes, ctx->be->name,
                         why);
    const size_t R = (size_t)ctx->max_rows, dim = (size_t)c->hidden_size,
                 q_dim = (size_t)c->num_attention_heads * (size_t)c->head_dim, ff = (size_t)c->intermediate_size;
    if ((rc = ctx_alloc(ctx, R * dim, &ctx->x, err)) || (rc = ctx_alloc(ctx, R * dim, &ctx->xn, err)) ||
        (rc = ctx_alloc(ctx, R * q_dim, &ctx->q, err)) || (rc = ctx_alloc(ctx, R * kv_dim, &ctx->k, err)) ||
        (rc = ctx_alloc(ctx, R * kv_dim, &ctx->v, err)) || (rc = ctx_alloc(ctx, R * q_dim, &ctx->att, err)) ||
        (rc = ctx_alloc(ctx, R * dim, &ctx->proj, err)) || (rc = ctx_alloc(ctx, R * ff, &ctx->gate, err)) ||
        (rc = ctx_alloc(ctx, R * ff, &ctx->up, err)) ||
        (rc = ctx_alloc(ctx, (size_t)LOGIT_ROWS * (size_t)c->vocab_size, &ctx->logits, err)))
        return rc;
    return 0;
}

int llama_ctx_create(struct llama_ctx **out, struct llama_model *model,
                     const struct llama_ctx_params *params, char *err)
{
    *out = NULL;
    struct llama_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return error_set(err, ERR_NOMEM, "llama context: out of memory");
    ctx->model = model;
    ctx->be = model->be;
    int rc;
    if ((rc = ctx_shape(ctx, &model->cfg, params, err)) || (rc = ctx_host_tables(ctx, params, err)) ||
        (rc = ctx_backend_buffers(ctx, &model->cfg, err)) || (rc = ctx_touch_logits(ctx, err)) ||
        (rc = llama_step_init(ctx, params->no_graphs, err))) {
        llama_ctx_destroy(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

void llama_ctx_destroy(struct llama_ctx *ctx)
{
    if (!ctx)
        return;
    const struct kern_ops *ops = ctx->be->ops;
    llama_step_release(ctx);
    float *bufs[] = {ctx->kv_pool, ctx->x, ctx->xn, ctx->q, ctx->k, ctx->v, ctx->att, ctx->proj,
                     ctx->gate, ctx->up, ctx->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        ops->free(ctx->be, bufs[i]);
    free(ctx->slot_len);
    free(ctx->slot_blocks);
    free(ctx->tables);
    kv_blocks_free(&ctx->kb);
    free(ctx->tokens);
    free(ctx->positions);
    free(ctx->rows);
    free(ctx->chunk_tables);
    free(ctx->chunk_seq_of);
    free(ctx->path_offset);
    free(ctx->path_phys);
    free(ctx->tree_base);
    free(ctx->tree_n);
    free(ctx->tree_tokens);
    free(ctx->tree_parents);
    free(ctx);
}

void llama_ctx_graph_stats(const struct llama_ctx *ctx, struct llama_graph_stats *out)
{
    int held = 0;
    for (int i = 0; i < ctx->n_graphs; i++)
        held += ctx->graph[i].g != NULL;
    *out = (struct llama_graph_stats){.steps = ctx->steps, .graphs = ctx->graphs, .held = held,
                                      .recorded = ctx->graphs_recorded,
                                      .replayed = ctx->graphs_replayed};
}

struct llama_model *llama_ctx_model(const struct llama_ctx *ctx) { return ctx->model; }
struct kern_backend *llama_ctx_backend(const struct llama_ctx *ctx) { return ctx->be; }
int llama_ctx_max_seq_len(const struct llama_ctx *ctx) { return ctx->max_seq_len; }
int llama_ctx_n_slots(const struct llama_ctx *ctx) { return ctx->n_slots; }

int llama_ctx_slot_len(const struct llama_ctx *ctx, int slot)
{
    return (slot >= 0 && slot < ctx->n_slots) ? ctx->slot_len[slot] : -1;
}

void llama_ctx_kv_stats(const struct llama_ctx *ctx, struct llama_kv_stats *out)
{
    out->block_size = ctx->block_size;
    out->n_blocks = ctx->n_blocks;
    out->free_blocks = kv_blocks_available(&ctx->kb);
    out->cached_blocks = ctx->kb.n_cached;
    out->published_blocks = ctx->kb.n_published;
    out->evictions = ctx->kb.evictions;
    out->prefix_queries = ctx->prefix_queries;
    out->prefix_hits = ctx->prefix_hits;
}

int llama_kv_blocks_for_len(const struct llama_ctx *ctx, int len)
{
    return (len + ctx->block_size - 1) / ctx->block_size;
}

/* One slot's table against its length and the ledger's names; counts each
 * block's holders into holders[]. */
static int kv_check_slot(const struct llama_ctx *ctx, int slot, int *holders, char *err)
{
    const struct kv_blocks *kb = &ctx->kb;
    const int32_t *table = ctx->tables + (size_t)slot * (size_t)ctx->table_stride;
    const int n = ctx->slot_blocks[slot], len = ctx->slot_len[slot];
    if (n != llama_kv_blocks_for_len(ctx, len) || n > ctx->table_stride)
        return error_set(err, ERR_INTERNAL, "kv cache: slot %d holds %d blocks for %d positions", slot,
                         n, len);
    /* an unaccepted tree: its nodes (positions tree_base ..) are no one's
     * prefix, so no block holding one is published */
    const int tree_n = ctx->tree_n[slot], tree_base = ctx->tree_base[slot];
    if (tree_n > 0 && len != tree_base + tree_n)
        return error_set(err, ERR_INTERNAL, "kv cache: slot %d holds %d positions, its tree %d "
                         "nodes from %d", slot, len, tree_n, tree_base);
    for (int i = tree_n > 0 ? tree_base / ctx->block_size : n; i < n; i++)
        if (kb->published[table[i]])
            return error_set(err, ERR_INTERNAL, "kv cache: slot %d's block %d (pool %d) holds "
                             "nodes of an unaccepted tree (positions %d..) and is published",
                             slot, i, (int)table[i], tree_base);
    for (int i = 0; i < n; i++) {
        const int32_t b = table[i];
        if (b < 0 || b >= ctx->n_blocks)
            return error_set(err, ERR_INTERNAL, "kv cache: slot %d's block %d is %d", slot, i, (int)b);
        holders[b]++;
        if (!kb->published[b])
            continue;
        /* the block written next (a part-filled last one) is never published */
        if (i == n - 1 && len % ctx->block_size != 0)
            return error_set(err, ERR_INTERNAL, "kv cache: slot %d writes into block %d (positions "
                             "%d..%d) while it is published", slot, (int)b, i * ctx->block_size,
                             len - 1);
        const int32_t parent = i > 0 ? table[i - 1] : -1;
        const uint32_t parent_gen = i > 0 ? kb->gen[parent] : 0;
        if (kb->parent[b] != parent || kb->parent_gen[b] != parent_gen)
            return error_set(err, ERR_INTERNAL, "kv cache: slot %d's block %d is published under "
                             "parent %d gen %u, the slot holds %d gen %u before it", slot, (int)b,
                             (int)kb->parent[b], kb->parent_gen[b], (int)parent, parent_gen);
    }
    return 0;
}

int llama_ctx_kv_check(const struct llama_ctx *ctx, char *err)
{
    int rc = kv_blocks_check(&ctx->kb, err);
    if (rc)
        return rc;
    int *holders = calloc((size_t)ctx->n_blocks, sizeof *holders);
    if (!holders)
        return error_set(err, ERR_NOMEM, "kv cache: out of memory for the check");
    for (int slot = 0; slot < ctx->n_slots && !rc; slot++)
        rc = kv_check_slot(ctx, slot, holders, err);
    for (int b = 0; b < ctx->n_blocks && !rc; b++)
        if (holders[b] != ctx->kb.refs[b])
            rc = error_set(err, ERR_INTERNAL, "kv cache: block %d is in %d tables, its count says %d",
                           b, holders[b], ctx->kb.refs[b]);
    free(holders);
    return rc;
}

/* In the sanitizer build every operation on the cache is followed by the
 * whole check: a bookkeeping slip shows where it happens, not as another
 * request's wrong tokens later. */
#ifdef TANDEM_KV_CHECK
void llama_kv_check_after(const struct llama_ctx *ctx, const char *op)
{
    char err[ERR_MSG_MAX] = "";
    if (llama_ctx_kv_check(ctx, err)) {
        fprintf(stderr, "FATAL: kv cache invariant broken after %s: %s\n", op, err);
        abort();
    }
}
#else
void llama_kv_check_after(const struct llama_ctx *ctx, const char *op)
{
    (void)ctx;
    (void)op;
}
#endif

int llama_ctx_blocks_needed(const struct llama_ctx *ctx, int slot, int new_len)
{
    if (slot < 0 || slot >= ctx->n_slots || new_len < 0)
        return 0;
    int more = llama_kv_blocks_for_len(ctx, new_len) - ctx->slot_blocks[slot];
    return more > 0 ? more : 0;
}

/* Gives back every block of slot past the first `keep` blocks. */
void llama_kv_release_blocks(struct llama_ctx *ctx, int slot, int keep)
{
    int32_t *table = ctx->tables + (size_t)slot * (size_t)ctx->table_stride;
    while (ctx->slot_blocks[slot] > keep) {
        int b = --ctx->slot_blocks[slot];
        kv_blocks_drop(&ctx->kb, table[b]);
        table[b] = -1;
    }
}

/* Gives slot enough blocks to hold new_len positions; the caller checked
 * that the pool has them. */
static void take_blocks(struct llama_ctx *ctx, int slot, int new_len)
{
    int32_t *table = ctx->tables + (size_t)slot * (size_t)ctx->table_stride;
    const int want = llama_kv_blocks_for_len(ctx, new_len);
    while (ctx->slot_blocks[slot] < want)
        table[ctx->slot_blocks[slot]++] = kv_blocks_take(&ctx->kb);
}

/* Gives slot a block of its own for its table entry bi, holding what the
 * shared one held: the slot is about to write into it. */
static int copy_on_write(struct llama_ctx *ctx, int slot, int bi, char *err)
{
    if (kv_blocks_available(&ctx->kb) == 0)
        return error_set(err, ERR_OVERLOADED,
                         "kv cache: slot %d needs a block of its own to write into a shared one, "
                         "none of %d is free", slot, ctx->n_blocks);
    int32_t *table = ctx->tables + (size_t)slot * (size_t)ctx->table_stride;
    const int32_t from = table[bi], to = kv_blocks_take(&ctx->kb);
    const struct model_config *c = &ctx->model->cfg;
    const size_t block_floats = (size_t)ctx->block_size * (size_t)c->num_key_value_heads *
                                (size_t)c->head_dim;
    for (size_t plane = 0; plane < 2 * (size_t)c->num_hidden_layers; plane++) {
        float *base = ctx->kv_pool + plane * ctx->kv_plane;
        int rc = ctx->be->ops->copy(ctx->be, base + (size_t)to * block_floats,
                                    base + (size_t)from * block_floats,
                                    block_floats * sizeof(float), err);
        if (rc) {
            kv_blocks_drop(&ctx->kb, to);
            return rc;
        }
    }
    kv_blocks_set_tokens(&ctx->kb, to, 0, ctx->kb.tokens + (size_t)from * (size_t)ctx->block_size,
                         ctx->block_size);
    kv_blocks_drop(&ctx->kb, from);
    table[bi] = to;
    return 0;
}

int llama_ctx_truncate(struct llama_ctx *ctx, int slot, int new_len, char *err)
{
    if (slot < 0 || slot >= ctx->n_slots)
        return error_set(err, ERR_RANGE, "slot: must be in 0..%d, got %d", ctx->n_slots - 1, slot);
    if (new_len < 0 || new_len > ctx->slot_len[slot])
        return error_set(err, ERR_RANGE, "truncate slot %d: new length %d outside 0..%d", slot,
                         new_len, ctx->slot_len[slot]);
    if (ctx->tree_n[slot] > 0) {
        /* positions past the base hold nodes, not a chain: only
         * llama_ctx_tree_accept knows which of them to keep */
        if (new_len > ctx->tree_base[slot])
            return error_set(err, ERR_INVALID_ARG,
                             "truncate slot %d: new length %d inside its unaccepted tree (%d nodes "
                             "from %d); accept a path or cut to %d", slot, new_len,
                             ctx->tree_n[slot], ctx->tree_base[slot], ctx->tree_base[slot]);
        ctx->tree_n[slot] = 0;
    }
    const int keep = llama_kv_blocks_for_len(ctx, new_len);
    llama_kv_release_blocks(ctx, slot, keep);
    if (new_len % ctx->block_size != 0) {
        /* the slot will write into its last block again: it must be its own */
        const int32_t last = ctx->tables[(size_t)slot * (size_t)ctx->table_stride + (size_t)keep - 1];
        if (ctx->kb.refs[last] > 1) {
            int rc = copy_on_write(ctx, slot, keep - 1, err);
            if (rc) {
                /* the slot ends before the shared block, which it lets go */
                ctx->slot_len[slot] = (keep - 1) * ctx->block_size;
                llama_kv_release_blocks(ctx, slot, keep - 1);
                llama_kv_check_after(ctx, "truncate (copy refused)");
                return rc;
            }
        } else {
            kv_blocks_unpublish(&ctx->kb, last);
        }
    }
    ctx->slot_len[slot] = new_len;
    llama_kv_check_after(ctx, "truncate");
    return 0;
}

int llama_ctx_prefix_map(struct llama_ctx *ctx, int slot, const int32_t *tokens, int n_tokens,
                         int max_map)
{
    if (!ctx->kb.cache_on || slot < 0 || slot >= ctx->n_slots || n_tokens < 1 || !tokens)
        return 0;
    const int bs = ctx->block_size;
    int len = ctx->slot_len[slot];
    if (len % bs != 0 || max_map > n_tokens)
        return 0;
    int32_t *table = ctx->tables + (size_t)slot * (size_t)ctx->table_stride;
    int32_t parent = ctx->slot_blocks[slot] > 0 ? table[ctx->slot_blocks[slot] - 1] : -1;
    int mapped = 0;
    while (mapped + bs <= max_map && len + bs <= ctx->max_seq_len) {
        const int32_t b = kv_blocks_find(&ctx->kb, parent, tokens + mapped);
        if (b < 0)
            break;
        table[ctx->slot_blocks[slot]++] = b;
        parent = b;
        mapped += bs;
        len += bs;
    }
    ctx->slot_len[slot] = len;
    ctx->prefix_queries += n_tokens;
    ctx->prefix_hits += mapped;
    llama_kv_check_after(ctx, "prefix map");
    return mapped;
}

void llama_ctx_prefix_clear(struct llama_ctx *ctx)
{
    kv_blocks_clear_cached(&ctx->kb);
    llama_kv_check_after(ctx, "prefix clear");
}

/* Names the tokens slot just appended at positions old_len .. and
 * publishes every block they filled. */
void llama_kv_note_appended(struct llama_ctx *ctx, int slot, int old_len, const int32_t *tokens, int n)
{
    const int bs = ctx->block_size;
    const int32_t *table = ctx->tables + (size_t)slot * (size_t)ctx->table_stride;
    for (int i = 0; i < n;) {
        const int pos = old_len + i, bi = pos / bs, off = pos % bs;
        const int take = n - i < bs - off ? n - i : bs - off;
        kv_blocks_set_tokens(&ctx->kb, table[bi], off, tokens + i, take);
        if (off + take == bs)
            kv_blocks_publish(&ctx->kb, table[bi], bi > 0 ? table[bi - 1] : -1);
        i += take;
    }
}

/* Final norm + LM head of up to LOGIT_ROWS rows gathered from the chunk
 * (any sequences): the LM head's weights, the biggest matrix of a small
 * model, are read once per group, not once per sequence. A group is all
 * logits rows or all argmax rows (matmul_argmax). */
struct logit_group {
    int n;
    int argmax;                /* the rows want argmax_out */
    float *dst[LOGIT_ROWS];    /* destination of each gathered row's logits */
    int on_device[LOGIT_ROWS]; /* dst is backend memory (logits_dev): copy, not download */
    int32_t *idx_dst[LOGIT_ROWS]; /* argmax groups: where each row's index goes */
    const uint64_t *allow[LOGIT_ROWS]; /* argmax groups: each row's mask, NULL: none */
    int masked;                   /* some row of the group has a mask */
};

static int logit_group_flush(struct llama_ctx *ctx, struct logit_group *g, char *err)
{
    const struct llama_model *m = ctx->model;
    const int dim = m->cfg.hidden_size, vocab = m->cfg.vocab_size;
    struct kern_backend *be = ctx->be;
    int rc;
    if (g->n == 0)
        return 0;
    if ((rc = be->ops->rmsnorm(be, ctx->xn, ctx->xn, m->norm.ptr, m->norm.dtype, g->n, dim,
                               (float)m->cfg.rms_norm_eps, err)))
        return rc;
    if (g->argmax) {
        int32_t idx[LOGIT_ROWS];
        if ((rc = be->ops->matmul_argmax(be, idx, ctx->xn, m->lm_head.ptr, m->lm_head.dtype, g->n,
                                         dim, vocab, g->masked ? g->allow : NULL, err)))
            return rc;
        for (int i = 0; i < g->n; i++)
            *g->idx_dst[i] = idx[i];
        g->n = 0;
        g->masked = 0;
        return 0;
    }
    if ((rc = be->ops->matmul(be, ctx->logits, ctx->xn, m->lm_head.ptr, m->lm_head.dtype, g->n,
                              dim, vocab, err)))
        return rc;
    /* one transfer per run of rows that are consecutive in both places */
    for (int i = 0; i < g->n;) {
        int run = 1;
        while (i + run < g->n && g->on_device[i + run] == g->on_device[i] &&
               g->dst[i + run] == g->dst[i] + (size_t)run * (size_t)vocab)
            run++;
        const float *src = ctx->logits + (size_t)i * (size_t)vocab;
        const size_t bytes = (size_t)run * (size_t)vocab * sizeof(float);
        if ((rc = g->on_device[i] ? be->ops->copy(be, g->dst[i], src, bytes, err)
                                  : be->ops->download(be, g->dst[i], src, bytes, err)))
            return rc;
        i += run;
    }
    g->n = 0;
    return 0;
}

/* Logits of the chunk's rows that asked for them, into each sequence's
 * logits_out (or argmax_out): the hidden states are gathered into ctx->xn
 * (free once the chunk's layers ran) in groups of LOGIT_ROWS across
 * sequences, the logits rows first, then the argmax rows. */
static int chunk_logits(struct llama_ctx *ctx, const struct llama_seq_batch *seqs,
                        const struct llama_chunk_part *parts, int n_parts, char *err)
{
    const int dim = ctx->model->cfg.hidden_size, vocab = ctx->model->cfg.vocab_size;
    const int group = ctx->max_rows < LOGIT_ROWS ? ctx->max_rows : LOGIT_ROWS;
    struct kern_backend *be = ctx->be;
    int rc;
    for (int argmax = 0; argmax < 2; argmax++) {
        struct logit_group g = {.n = 0, .argmax = argmax};
        for (int p = 0; p < n_parts; p++) {
            const struct llama_chunk_part *cp = &parts[p];
            const struct llama_seq_batch *s = &seqs[cp->seq];
            if ((s->argmax_out != NULL) != argmax)
                continue;
            const int first_logit = s->n_tokens - s->n_logits;
            const int lo = first_logit > cp->tok0 ? first_logit : cp->tok0;
            for (int t = lo; t < cp->tok0 + cp->n; t++) {
                const int row = cp->chunk_row + (t - cp->tok0);
                if ((rc = be->ops->copy(be, ctx->xn + (size_t)g.n * (size_t)dim,
                                        ctx->x + (size_t)row * (size_t)dim,
                                        (size_t)dim * sizeof(float), err)))
                    return rc;
                if (argmax) {
                    const size_t words = ((size_t)vocab + 63) / 64;
                    g.allow[g.n] = s->argmax_allow
                                       ? s->argmax_allow + (size_t)(t - first_logit) * words
                                       : NULL;
                    g.masked |= s->argmax_allow != NULL;
                    g.idx_dst[g.n++] = s->argmax_out + (t - first_logit);
                } else {
                    float *base = s->logits_dev ? s->logits_dev : s->logits_out;
                    g.on_device[g.n] = s->logits_dev != NULL;
                    g.dst[g.n++] = base + (size_t)(t - first_logit) * (size_t)vocab;
                }
                if (g.n == group && (rc = logit_group_flush(ctx, &g, err)))
                    return rc;
            }
        }
        if ((rc = logit_group_flush(ctx, &g, err)))
            return rc;
    }
    return 0;
}

bool llama_ctx_has_argmax(const struct llama_ctx *ctx)
{
    return ctx->be->ops->matmul_argmax != NULL;
}

int llama_model_prepare_argmax(struct llama_model *m, bool draft, char *err)
{
    if (!m->be->ops->prepare_argmax)
        return 0;
    /* the head never changes once loaded: every pipeline an in-process
     * tool makes over the model asks again, and the copy it has serves */
    const int want = draft ? 2 : 1;
    if (m->argmax_prepared == want)
        return 0;
    int rc = m->be->ops->prepare_argmax(m->be, m->lm_head.ptr, m->lm_head.dtype, m->cfg.vocab_size,
                                        m->cfg.hidden_size, draft ? 1 : 0, err);
    m->argmax_prepared = rc ? 0 : want;
    return rc;
}

/* Prefill positions of the warm-up (llama_ctx_warm_up). */
#define WARM_UP_PREFIX 32

int llama_ctx_warm_up(struct llama_ctx *ctx, char *err)
{
    if (ctx->slot_len[0] != 0)
        return error_set(err, ERR_INVALID_ARG, "warm-up: slot 0 holds %d positions, must be empty",
                         ctx->slot_len[0]);
    const int vocab = ctx->model->cfg.vocab_size;
    int rows = ctx->max_rows < LOGIT_ROWS ? ctx->max_rows : LOGIT_ROWS;
    int prefix = WARM_UP_PREFIX;
    if (prefix + rows > ctx->max_seq_len) {
        prefix = ctx->max_seq_len / 2;
        if (rows > ctx->max_seq_len - prefix)
            rows = ctx->max_seq_len - prefix;
    }
    int32_t tokens[WARM_UP_PREFIX + LOGIT_ROWS], picks[LOGIT_ROWS];
    for (int i = 0; i < prefix + rows; i++)
        tokens[i] = (int32_t)((13 + 7919 * (long)i) % vocab);
    float *logits = malloc((size_t)rows * (size_t)vocab * sizeof *logits);
    if (!logits)
        return error_set(err, ERR_NOMEM, "warm-up: out of memory");
    const struct llama_seq_batch prefill = {.slot = 0, .tokens = tokens, .n_tokens = prefix};
    /* the decode step and the verification, each as the worker may ask */
    const bool argmax = llama_ctx_has_argmax(ctx);
    const struct llama_seq_batch calls[] = {
        {.slot = 0, .tokens = tokens + prefix, .n_tokens = 1, .n_logits = 1, .logits_out = logits},
        {.slot = 0, .tokens = tokens + prefix, .n_tokens = rows, .n_logits = rows,
         .logits_out = logits},
        {.slot = 0, .tokens = tokens + prefix, .n_tokens = 1, .n_logits = 1, .argmax_out = picks},
        {.slot = 0, .tokens = tokens + prefix, .n_tokens = rows, .n_logits = rows,
         .argmax_out = picks},
    };
    const int n_calls = argmax ? 4 : 2;
    int rc = llama_forward(ctx, &prefill, 1, err);
    for (int c = 0; c < n_calls && rc == 0; c++)
        if ((rc = llama_forward(ctx, &calls[c], 1, err)) == 0)
            rc = llama_ctx_truncate(ctx, 0, prefix, err);
    /* with graphs, every decode and verification shape (1 .. rows rows)
     * recorded now rather than in a request's first rounds: a shape is
     * recorded the second time it comes */
    for (int pass = 0; ctx->graphs && pass < 2; pass++)
        for (int r = 1; ctx->graphs && r <= rows && rc == 0; r++) {
            const struct llama_seq_batch v = {.slot = 0, .tokens = tokens + prefix, .n_tokens = r,
                                              .n_logits = r, .logits_out = logits};
            if ((rc = llama_forward(ctx, &v, 1, err)) == 0)
                rc = llama_ctx_truncate(ctx, 0, prefix, err);
        }
    free(logits);
    const int rc_empty = llama_ctx_truncate(ctx, 0, 0, err);
    /* the warm-up's tokens are no one's prefix */
    llama_ctx_prefix_clear(ctx);
    return rc ? rc : rc_empty;
}

int llama_check_seq(const struct llama_ctx *ctx, const struct llama_seq_batch *s, char *err)
{
    const int vocab = ctx->model->cfg.vocab_size;
    if (s->slot < 0 || s->slot >= ctx->n_slots)
        return error_set(err, ERR_RANGE, "slot: must be in 0..%d, got %d", ctx->n_slots - 1,
                         s->slot);
    if (s->n_tokens < 1 || !s->tokens)
        return error_set(err, ERR_INVALID_ARG, "forward: n_tokens must be >= 1, got %d",
                         s->n_tokens);
    if (s->n_logits < 0 || s->n_logits > s->n_tokens)
        return error_set(err, ERR_INVALID_ARG, "forward: n_logits must be in 0..%d, got %d",
                         s->n_tokens, s->n_logits);
    if (s->n_logits > 0 && (s->logits_out != NULL) + (s->logits_dev != NULL) +
                                   (s->argmax_out != NULL) != 1)
        return error_set(err, ERR_INVALID_ARG,
                         "forward: %d logits rows need exactly one of logits_out (host), "
                         "logits_dev (backend memory) and argmax_out", s->n_logits);
    if (s->argmax_allow && !s->argmax_out)
        return error_set(err, ERR_INVALID_ARG, "forward: argmax_allow without argmax_out");
    if (s->n_logits > 0 && s->argmax_out && !llama_ctx_has_argmax(ctx))
        return error_set(err, ERR_UNSUPPORTED,
                         "forward: argmax_out needs a backend with matmul_argmax (%s has none)",
                         ctx->be->name);
    if (ctx->tree_n[s->slot] > 0)
        return error_set(err, ERR_INVALID_ARG,
                         "forward: slot %d holds an unaccepted tree of %d nodes; accept a path "
                         "(llama_ctx_tree_accept) or truncate to %d first", s->slot,
                         ctx->tree_n[s->slot], ctx->tree_base[s->slot]);
    if (s->parents) {
        if (s->n_tokens > LLAMA_TREE_MAX)
            return error_set(err, ERR_INVALID_ARG, "forward: a tree of %d nodes, at most %d",
                             s->n_tokens, LLAMA_TREE_MAX);
        for (int i = 0; i < s->n_tokens; i++)
            if (s->parents[i] < -1 || s->parents[i] >= i)
                return error_set(err, ERR_INVALID_ARG,
                                 "forward: tree node %d has parent %d; a parent must come before "
                                 "its child (-1..%d)", i, s->parents[i], i - 1);
    }
    const int len = ctx->slot_len[s->slot];
    if (s->n_tokens > ctx->max_seq_len - len)
        return error_set(err, ERR_CONTEXT_FULL,
                         "sequence would reach %d positions, the context length is %d",
                         len + s->n_tokens, ctx->max_seq_len);
    for (int i = 0; i < s->n_tokens; i++)
        if (s->tokens[i] < 0 || s->tokens[i] >= vocab)
            return error_set(err, ERR_RANGE, "token id %d at index %d outside the vocabulary 0..%d",
                             s->tokens[i], i, vocab - 1);
    return 0;
}

/* Fills the chunk's host arrays and layout from its parts: each slot becomes
 * one sequence of the layout, with a copy of the blocks its rows reach. */
static void chunk_layout(struct llama_ctx *ctx, const struct llama_seq_batch *seqs,
                         const struct llama_chunk_part *parts, int n_parts, struct kern_kv_layout *kv,
                         int *max_positions)
{
    int n_seqs = 0, pos_max = 1;
    for (int p = 0; p < n_parts; p++) {
        const struct llama_seq_batch *s = &seqs[parts[p].seq];
        const int pos_end = ctx->slot_len[s->slot] + parts[p].tok0 + parts[p].n;
        pos_max = pos_end > pos_max ? pos_end : pos_max;
    }
    /* a device step's tables are as wide as its bound: a function of the
     * chunk's shape, as a recorded graph needs (llama_step.c) */
    *max_positions = ctx->steps ? llama_step_positions(ctx, pos_max) : pos_max;
    const int stride = llama_kv_blocks_for_len(ctx, *max_positions);
    for (int p = 0; p < n_parts; p++) {
        const struct llama_chunk_part *cp = &parts[p];
        const struct llama_seq_batch *s = &seqs[cp->seq];
        int idx = ctx->chunk_seq_of[s->slot];
        if (idx < 0) {
            idx = ctx->chunk_seq_of[s->slot] = n_seqs++;
            memcpy(ctx->chunk_tables + (size_t)idx * (size_t)stride,
                   ctx->tables + (size_t)s->slot * (size_t)ctx->table_stride,
                   (size_t)stride * sizeof(int32_t));
        }
        const int pos0 = ctx->slot_len[s->slot] + cp->tok0;
        for (int i = 0; i < cp->n; i++) {
            const int r = cp->chunk_row + i;
            ctx->tokens[r] = s->tokens[cp->tok0 + i];
            ctx->positions[r] = pos0 + i;
            ctx->rows[2 * r] = idx;
            ctx->rows[2 * r + 1] = pos0 + i;
        }
    }
    for (int p = 0; p < n_parts; p++)
        ctx->chunk_seq_of[seqs[parts[p].seq].slot] = -1;
    *kv = (struct kern_kv_layout){.block_size = ctx->block_size, .n_blocks = ctx->n_blocks,
                                  .n_seqs = n_seqs, .table_stride = stride,
                                  .tables = ctx->chunk_tables, .rows = ctx->rows};
    for (int p = 0; p < n_parts; p++)
        if (seqs[parts[p].seq].parents) {
            llama_tree_chunk_paths(ctx, seqs, parts, n_parts, kv);
            break;
        }
}

int llama_forward(struct llama_ctx *ctx, const struct llama_seq_batch *seqs, int n_seqs, char *err)
{
    int rc;
    if (n_seqs < 0 || (n_seqs > 0 && !seqs))
        return error_set(err, ERR_INVALID_ARG, "forward: %d sequences", n_seqs);
    int need = 0;
    for (int i = 0; i < n_seqs; i++) {
        if ((rc = llama_check_seq(ctx, &seqs[i], err)))
            return rc;
        /* Each entry is checked against its slot's length alone: a slot named
         * twice would pass both checks and then write past the context. */
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == seqs[i].slot)
                return error_set(err, ERR_INVALID_ARG,
                                 "forward: slot %d is named twice (entries %d and %d)", seqs[i].slot,
                                 j, i);
        need += llama_ctx_blocks_needed(ctx, seqs[i].slot,
                                        ctx->slot_len[seqs[i].slot] + seqs[i].n_tokens);
    }
    if (need > kv_blocks_available(&ctx->kb))
        return error_set(err, ERR_OVERLOADED,
                         "kv cache: the call needs %d more blocks of %d positions, %d of %d are "
                         "free", need, ctx->block_size, kv_blocks_available(&ctx->kb), ctx->n_blocks);
    for (int i = 0; i < n_seqs; i++)
        take_blocks(ctx, seqs[i].slot, ctx->slot_len[seqs[i].slot] + seqs[i].n_tokens);

    /* Walk the packed rows (sequence by sequence) in chunks of max_rows. */
    struct llama_chunk_part parts_stack[64];
    struct llama_chunk_part *parts = parts_stack;
    if (n_seqs > (int)(sizeof parts_stack / sizeof parts_stack[0])) {
        parts = malloc((size_t)n_seqs * sizeof *parts);
        if (!parts) {
            rc = error_set(err, ERR_NOMEM, "forward: out of memory");
            goto fail;
        }
    }
    rc = 0;
    int seq = 0, tok = 0;
    while (seq < n_seqs) {
        int n_parts = 0, rows = 0;
        while (seq < n_seqs && rows < ctx->max_rows) {
            int take = seqs[seq].n_tokens - tok;
            if (take > ctx->max_rows - rows)
                take = ctx->max_rows - rows;
            parts[n_parts++] = (struct llama_chunk_part){.seq = seq, .tok0 = tok, .n = take,
                                                   .chunk_row = rows};
            rows += take;
            tok += take;
            if (tok == seqs[seq].n_tokens) {
                seq++;
                tok = 0;
            }
        }
        struct kern_kv_layout kv;
        int max_positions;
        chunk_layout(ctx, seqs, parts, n_parts, &kv, &max_positions);
        if ((rc = llama_step_run(ctx, rows, &kv, max_positions, err)) ||
            (rc = chunk_logits(ctx, seqs, parts, n_parts, err)))
            break;
    }
    if (parts != parts_stack)
        free(parts);
    if (rc)
        goto fail;
    for (int i = 0; i < n_seqs; i++) {
        const int slot = seqs[i].slot;
        if (seqs[i].parents) {
            /* no name for a node until its path is accepted */
            ctx->tree_base[slot] = ctx->slot_len[slot];
            ctx->tree_n[slot] = seqs[i].n_tokens;
            memcpy(ctx->tree_tokens + (size_t)slot * LLAMA_TREE_MAX, seqs[i].tokens,
                   (size_t)seqs[i].n_tokens * sizeof(int32_t));
            memcpy(ctx->tree_parents + (size_t)slot * LLAMA_TREE_MAX, seqs[i].parents,
                   (size_t)seqs[i].n_tokens * sizeof(int32_t));
        } else if (ctx->kb.cache_on) {
            llama_kv_note_appended(ctx, slot, ctx->slot_len[slot], seqs[i].tokens, seqs[i].n_tokens);
        }
        ctx->slot_len[slot] += seqs[i].n_tokens;
    }
    llama_kv_check_after(ctx, "forward");
    return 0;
fail:
    /* A backend failure half-way: the slots keep their old lengths, and the
     * blocks taken for the call go back. */
    for (int i = 0; i < n_seqs; i++)
        llama_kv_release_blocks(ctx, seqs[i].slot,
                                llama_kv_blocks_for_len(ctx, ctx->slot_len[seqs[i].slot]));
    llama_kv_check_after(ctx, "forward (failed)");
    return rc;
}
