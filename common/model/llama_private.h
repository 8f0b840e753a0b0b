/* llama_private.h: the model's and the context's records, shared by the
 * files of the forward pass (llama.c: loading, the KV cache, the calls;
 * llama_step.c: one chunk's ops on the backend, eager or as a graph).
 * Private to common/model. */
#ifndef TANDEM_MODEL_LLAMA_PRIVATE_H
#define TANDEM_MODEL_LLAMA_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"
#include "kv_blocks.h"
#include "llama.h"
#include "model_config.h"
#include "quantize.h"
#include "safetensors.h"

/* Shapes a context keeps (rows, sequences, attention bound), each with the
 * graph recorded for it once it came twice; the least recently used is
 * dropped for a new one. */
#define LLAMA_GRAPHS_MAX 64

/* Chunks of at most this many rows run as graphs: decode batches and
 * verifications, where launching ~15 kernels a layer costs more host time
 * than the GPU spends; prefill chunks are long enough to hide it. */
#define LLAMA_GRAPH_MAX_ROWS 64

struct llama_graph {
    int n, n_seqs, max_positions; /* the shape */
    struct kern_graph *g;         /* NULL: seen once, or stale */
    uint64_t last_use;
};

/* Rows of logits computed per LM-head call: bounds the logits scratch to
 * LOGIT_ROWS x vocab floats while covering a whole verification (K+1 <= 17). */
#define LOGIT_ROWS 17

struct llama_weight {
    const void *ptr; /* backend memory */
    enum kern_dtype dtype;
};

struct llama_layer {
    struct llama_weight attn_norm; /* [dim] */
    struct llama_weight wq;        /* [n_heads*head_dim, dim] */
    struct llama_weight wk;        /* [n_kv_heads*head_dim, dim] */
    struct llama_weight wv;        /* [n_kv_heads*head_dim, dim] */
    struct llama_weight wo;        /* [dim, n_heads*head_dim] */
    struct llama_weight ffn_norm;  /* [dim] */
    struct llama_weight w_gate;    /* [ff, dim] */
    struct llama_weight w_up;      /* [ff, dim] */
    struct llama_weight w_down;    /* [dim, ff] */
};

struct llama_model {
    struct model_config cfg;
    struct kern_backend *be;
    struct safetensors *st;
    struct llama_weight embed;   /* [vocab, dim] */
    struct llama_weight norm;    /* [dim] */
    struct llama_weight lm_head; /* [vocab, dim]; the embedding when tied */
    struct llama_layer *layers;  /* [n_layers] */
    float *inv_freq;             /* host [head_dim/2] */
    size_t weight_bytes_per_token;
    const void **mapped;         /* every map_weights result, to unmap */
    int n_mapped;
    enum quantize_mode quant;    /* of the layers' projections */
    int argmax_prepared;         /* the head's prepare_argmax: 0 none, 1 a target's, 2 a draft's */
    void **qbufs;                /* quantized host buffers the backend reads in place */
    int n_qbufs;
    size_t file_bytes, held_bytes; /* weights as in the files, as held */
    /* while loading only: what load_progress reports */
    size_t load_total_bytes;     /* every tensor of the files */
    int n_loaded, n_tensors;
    double load_t0_s, load_logged_s;
    int load_logged_decile;
};

struct llama_ctx {
    struct llama_model *model;
    struct kern_backend *be;
    int n_slots, max_seq_len, max_rows;
    int *slot_len;          /* host [n_slots] */
    /* paged KV cache */
    int block_size, n_blocks, table_stride; /* table_stride = blocks of a full slot */
    float *kv_pool;         /* backend [n_layers][2][n_blocks * block_size][kv_dim] f32 */
    size_t kv_plane;        /* floats per (layer, k|v) plane */
    int32_t *tables;        /* host [n_slots][table_stride]; -1 = no block */
    int *slot_blocks;       /* host [n_slots]: blocks held */
    struct kv_blocks kb;    /* which blocks are free, held, published, cached */
    int64_t prefix_queries, prefix_hits; /* prompt tokens looked up, found */
    /* activations, backend memory, [max_rows, ...] */
    float *x, *xn, *q, *k, *v, *att, *proj, *gate, *up;
    float *logits;          /* [LOGIT_ROWS, vocab] */
    /* one chunk's rows, host [max_rows]: tokens, positions, (seq, position) */
    int32_t *tokens, *positions, *rows;
    int32_t *chunk_tables;  /* host [max_rows][table_stride]: tables of a chunk's slots */
    int32_t *chunk_seq_of;  /* host [n_slots]: a slot's sequence index in the chunk, or -1 */
    /* token trees: a chunk's paths (kern_kv_layout), host [max_rows + 1]
     * and [max_rows][LLAMA_TREE_MAX]; and each slot's unaccepted tree:
     * tree_n[s] nodes (0: none) from position tree_base[s], their tokens
     * and parents, host [n_slots][LLAMA_TREE_MAX] */
    int32_t *path_offset, *path_phys;
    int *tree_base, *tree_n;
    int32_t *tree_tokens, *tree_parents;
    /* steps and graphs (llama_step.c) */
    bool steps;             /* the backend takes device steps (step_reserve ran) */
    bool graphs;            /* record and replay chunks of up to LLAMA_GRAPH_MAX_ROWS rows */
    struct llama_graph graph[LLAMA_GRAPHS_MAX];
    int n_graphs;
    uint64_t graph_clock;   /* ticks per replay: the least recently used goes first */
    int64_t graphs_recorded, graphs_replayed;
};


/* One sequence's rows inside a chunk: rows [chunk_row, chunk_row + n) of
 * the chunk are tokens [tok0, tok0 + n) of seqs[seq]. */
struct llama_chunk_part {
    int seq, tok0, n, chunk_row;
};

/* llama.c: the KV cache's bookkeeping llama_tree.c shares */

/* Blocks that hold len positions. */
int llama_kv_blocks_for_len(const struct llama_ctx *ctx, int len);
/* Gives back every block of slot past the first `keep` blocks. */
void llama_kv_release_blocks(struct llama_ctx *ctx, int slot, int keep);
/* Names the tokens slot just appended at positions old_len .. and
 * publishes every block they filled (prefix cache on). */
void llama_kv_note_appended(struct llama_ctx *ctx, int slot, int old_len, const int32_t *tokens,
                            int n);
/* The whole check after an operation in the sanitizer build (aborts on a
 * broken invariant); nothing otherwise. */
void llama_kv_check_after(const struct llama_ctx *ctx, const char *op);

/* llama_tree.c */

/* Sets the chunk's tree rows (seqs with parents) at their logical
 * positions (ctx->positions, ctx->rows) and kv's paths (ctx->path_offset,
 * ctx->path_phys); chains' rows get empty paths. */
void llama_tree_chunk_paths(struct llama_ctx *ctx, const struct llama_seq_batch *seqs,
                            const struct llama_chunk_part *parts, int n_parts,
                            struct kern_kv_layout *kv);

/* llama_step.c */

/* Reserves the backend's step memory for the context's largest chunk and
 * turns steps (and graphs, unless no_graphs) on where the backend has them. */
int llama_step_init(struct llama_ctx *ctx, bool no_graphs, char *err);
/* Drops the context's graphs. */
void llama_step_release(struct llama_ctx *ctx);
/* The bound on positions a chunk's attention is sized by (its rows'
 * positions are all below it): a power of two from 256, at most
 * max_seq_len, so that few shapes cover every length. */
int llama_step_positions(const struct llama_ctx *ctx, int max_pos_plus1);
/* Runs the n rows of one chunk (ctx->tokens, ctx->positions, kv: their
 * slots and positions; every position below max_positions), leaving the
 * final hidden states in ctx->x: as one device step, replaying the graph
 * recorded for its shape where there is one. */
int llama_step_run(struct llama_ctx *ctx, int n, const struct kern_kv_layout *kv,
                   int max_positions, char *err);

#endif
