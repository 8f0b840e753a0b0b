/* llama.h: the Llama model (weights) and its run state (KV cache, activations).
 *
 * State is split by lifetime, as in llama2.c: struct llama_model holds the
 * immutable config and the read-only weights (used in place from the
 * safetensors mapping on the cpu backend); struct llama_ctx holds the KV
 * cache of every sequence slot plus the activations of one forward call.
 *
 * One call, llama_forward, serves prefill, decode and verification: for each
 * sequence in the batch it appends n tokens at the slot's current length and
 * returns the logits of the rows asked for. The computation of a row never
 * depends on how many rows are in the call (see kernels.h), so logits of a
 * position are bit-identical in decode and in verification.
 *
 * Not thread-safe: one thread drives a llama_ctx at a time. Several contexts
 * may share one model.
 */
#ifndef TANDEM_LLAMA_H
#define TANDEM_LLAMA_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"
#include "model_config.h"
#include "quantize.h"

#define LLAMA_DEFAULT_MAX_SEQ_LEN 8192
#define LLAMA_DEFAULT_KV_BLOCK_SIZE 16
/* Most nodes of one token tree (llama_seq_batch.parents). */
#define LLAMA_TREE_MAX 32

struct llama_model;
struct llama_ctx;

/* Loads config.json and the safetensors weights of an HF model directory,
 * checking every tensor's presence, dtype and shape against the config.
 * Borrows be: it must outlive the model. */
int llama_model_load(struct llama_model **out, const char *model_dir, struct kern_backend *be,
                     char *err);
/* llama_model_load with the layers' projections (q, k, v, o, gate, up,
 * down) quantized as they load (quantize.h); the embedding, the LM head and
 * the norms keep the files' precision (the head decides every token, and a
 * greedy head is read through the argmax screen's one-byte copy anyway).
 * ERR_UNSUPPORTED on a backend without quantized kernels (cuda). */
int llama_model_load_quantized(struct llama_model **out, const char *model_dir,
                               struct kern_backend *be, enum quantize_mode quant, char *err);
/* The weights' bytes as in the files and as held (quantized or not). */
void llama_model_weight_memory(const struct llama_model *m, size_t *file_bytes, size_t *held_bytes);
void llama_model_destroy(struct llama_model *model);
const struct model_config *llama_model_config(const struct llama_model *model);
/* Bytes of weights one decode step reads (every layer + final norm + LM head). */
size_t llama_model_weight_bytes_per_token(const struct llama_model *model);

struct llama_ctx_params {
    int n_slots;      /* sequence slots, each with its own block table; >= 1 */
    int max_seq_len;  /* positions per slot; 0 = min(8192, max_position_embeddings) */
    int max_rows;     /* rows per internal forward chunk; 0 = 256. Longer calls are chunked. */
    int kv_block_size; /* positions per KV block; 0 = LLAMA_DEFAULT_KV_BLOCK_SIZE */
    int kv_blocks;    /* blocks in the pool; 0 = enough for every slot at max_seq_len */
    bool prefix_cache; /* keep filled blocks for later sequences (llama_ctx_prefix_map) */
    int prefix_cache_tokens; /* most positions kept in blocks no slot holds; 0 = the pool */
    /* Run every chunk's ops one by one even where the backend records
     * graphs (cuda): for comparisons; a replay gives the same bits. */
    bool no_graphs;
};

/* Borrows model. KV memory: kv_blocks * kv_block_size * layers * 2 *
 * kv_heads * head_dim * 4 bytes, reserved at creation (on the CPU the OS
 * commits it as blocks are first used; freed blocks are reused first). */
int llama_ctx_create(struct llama_ctx **out, struct llama_model *model,
                     const struct llama_ctx_params *params, char *err);
void llama_ctx_destroy(struct llama_ctx *ctx);
struct llama_model *llama_ctx_model(const struct llama_ctx *ctx);
/* The backend the context's buffers (KV cache, activations) live in: the
 * one logits_dev buffers must come from. */
struct kern_backend *llama_ctx_backend(const struct llama_ctx *ctx);
int llama_ctx_max_seq_len(const struct llama_ctx *ctx);
int llama_ctx_n_slots(const struct llama_ctx *ctx);
/* Number of positions currently cached in slot. */
int llama_ctx_slot_len(const struct llama_ctx *ctx, int slot);
/* Drops cached positions >= new_len (speculation rolls back rejected
 * tokens) and gives back the blocks no longer needed. ERR_RANGE if new_len
 * is negative or beyond the slot's length. A cut inside a block another
 * slot shares copies that block first: ERR_OVERLOADED when the pool has
 * none for the copy (the slot then ends at the shared block's start).
 * A slot holding an unaccepted tree (llama_seq_batch.parents) may only be
 * cut back to the tree's base or below (which drops the tree, as
 * llama_ctx_tree_accept with no node would); ERR_INVALID_ARG otherwise. */
int llama_ctx_truncate(struct llama_ctx *ctx, int slot, int new_len, char *err);

/* How the context's forward chunks reach the backend: as device steps
 * (one transfer of a chunk's small inputs, nothing allocated inside), and
 * as graphs recorded once per chunk shape and replayed (common/model/
 * llama_step.c). */
struct llama_graph_stats {
    bool steps;        /* the backend takes device steps */
    bool graphs;       /* chunks of up to 64 rows run as graphs (off: no_graphs, a
                          backend without them, or a recording that failed) */
    int held;          /* graphs held now */
    int64_t recorded;  /* recordings made */
    int64_t replayed;  /* chunks run as a graph */
};
void llama_ctx_graph_stats(const struct llama_ctx *ctx, struct llama_graph_stats *out);

struct llama_kv_stats {
    int block_size;   /* positions per block */
    int n_blocks;     /* blocks in the pool */
    int free_blocks;  /* blocks in no slot's table (cached ones included: a take evicts them) */
    int cached_blocks; /* blocks in no slot's table kept for the prefix cache */
    int published_blocks; /* blocks a prefix lookup can find, held or cached */
    int64_t evictions; /* cached blocks taken back for new content */
    int64_t prefix_queries, prefix_hits; /* tokens looked up by llama_ctx_prefix_map, found */
};
void llama_ctx_kv_stats(const struct llama_ctx *ctx, struct llama_kv_stats *out);
/* Blocks slot must take from the pool to hold new_len positions (0 when it
 * holds them already, or for a bad slot). */
int llama_ctx_blocks_needed(const struct llama_ctx *ctx, int slot, int new_len);

/* Prefix caching (params.prefix_cache): maps into slot, at its length
 * (which must be a multiple of the block size; 0 for a new sequence), the
 * longest chain of cached blocks whose positions hold tokens[0 ..], at most
 * max_map tokens (a caller that wants the logits of the last token leaves
 * it out). Returns the tokens mapped (a multiple of the block size; the
 * slot's length grew by that many), 0 with the cache off. The mapped
 * positions hold the bits the slot would have computed: the caller feeds
 * tokens[returned ..] as if it had fed the rest. Counts n_tokens looked up
 * and the tokens found (llama_kv_stats). */
int llama_ctx_prefix_map(struct llama_ctx *ctx, int slot, const int32_t *tokens, int n_tokens,
                         int max_map);
/* Drops every cached block no slot holds (a warm-up leaves none behind). */
void llama_ctx_prefix_clear(struct llama_ctx *ctx);
/* Checks the KV cache's bookkeeping against its invariants: the block
 * ledger's own (kv_blocks_check), each slot holding exactly the blocks its
 * length needs, every block's holder count equal to the tables that name
 * it, no slot's partly written last block published, every published
 * block in a table named after the block before it there, and no block
 * holding a node of an unaccepted tree published (nor a slot's length
 * other than its tree's base plus its nodes). 0, or
 * ERR_INTERNAL naming the first broken one in err. A sanitizer build
 * (TANDEM_KV_CHECK) runs it after every operation on the cache and aborts
 * on a failure; tests call it after every step. */
int llama_ctx_kv_check(const struct llama_ctx *ctx, char *err);

/* One sequence's part of a forward call: tokens are appended at positions
 * slot_len .. slot_len + n_tokens - 1; logits of the last n_logits of those
 * rows are written to logits_out (host memory, [n_logits, vocab] f32), or,
 * when logits_dev is set, to logits_dev instead: backend memory (from the
 * context's backend's alloc), filled by a copy queued on the backend, never
 * downloaded, so a caller that samples on the device moves no logits
 * across the bus. Or, with argmax_out (host [n_logits]), only the index of
 * each row's largest logit, as argmax_f32 (base/argmax.h) would take it from logits_out
 * (a greedy draft; needs llama_ctx_has_argmax). Set exactly one of the three
 * when n_logits > 0. */
struct llama_seq_batch {
    int slot;
    const int32_t *tokens;
    int n_tokens;   /* >= 1 */
    int n_logits;   /* 0 .. n_tokens */
    float *logits_out;
    float *logits_dev;
    int32_t *argmax_out;
    /* With argmax_out: NULL, or host [n_logits][(vocab + 63) / 64] words, a
     * row's bitset of the token ids it may answer (bit v of word v / 64; a
     * grammar's mask, EOS ids included where the grammar can end): each
     * index is then the argmax among those ids alone, -1 where none is
     * allowed (kernels.h: matmul_argmax's allow). */
    const uint64_t *argmax_allow;
    /* NULL: the tokens are a chain, as above. Else host [n_tokens]: they are
     * a token tree of n_tokens <= LLAMA_TREE_MAX nodes, parents[i] the node
     * before node i on its path, -1 for a child of the slot's last token;
     * parents[i] < i (parents come first). With L the slot's length, node i
     * of depth d (1 for parent -1) sits at logical position L + d - 1 (its
     * RoPE) and is stored at position L + i; it attends the context and its
     * ancestors in depth order, so its logits (or argmax) are bit for bit
     * those of the chain of its path fed after the context. The slot's
     * length becomes L + n_tokens, its tree unaccepted: nothing of it is
     * published to the prefix cache, and the slot takes no other forward
     * until llama_ctx_tree_accept (or a truncate to L or below) settles it.
     * cuda runs the same indirection (compiled, not yet checked on a GPU). */
    const int32_t *parents;
};

/* KV after a tree (llama_seq_batch.parents): keeps the accepted path, the
 * nodes path[0 .. m - 1] (path[0] a child of the context, path[j] a child of
 * path[j - 1]; m = 0 keeps nothing), and drops the rest of the tree. The
 * path's keys and values are copied, layer by layer, from their slots to
 * positions L .. L + m - 1, and the slot's length becomes L + m: the cache
 * then holds exactly what feeding the path's tokens as a chain would have
 * written, and the blocks it fills are published as that chain's would be
 * (prefix cache). Blocks past L + m go back. ERR_INVALID_ARG (nothing
 * changed) when the slot holds no unaccepted tree or the path is not one of
 * its root paths. */
int llama_ctx_tree_accept(struct llama_ctx *ctx, int slot, const int32_t *path, int m, char *err);
/* Nodes of the slot's unaccepted tree; 0 when it holds none (or a bad slot). */
int llama_ctx_tree_nodes(const struct llama_ctx *ctx, int slot);

/* Whether the context's backend answers argmax_out (kernels.h: matmul_argmax). */
bool llama_ctx_has_argmax(const struct llama_ctx *ctx);
/* Readies the backend to find the argmax of the LM head's logits cheaply
 * (kernels.h: prepare_argmax; cpu: a one-byte copy of the head, 263 MB at the
 * Llama 3.2 shapes, made in about a second). A no-op where the backend has
 * nothing to prepare. For a model whose logits are mostly wanted as argmax_out.
 * draft: the model drafts for a target that verifies its proposals; the
 * backend may answer from a cheaper copy whose index is exact but for a
 * vanishing chance (kernels.h: prepare_argmax; cpu: half a byte a weight).
 * Asked again the way it was last made, it keeps that copy (the head does
 * not change once loaded); asked the other way, it makes the other. */
int llama_model_prepare_argmax(struct llama_model *m, bool draft, char *err);

/* Runs what a first request would run once, on slot 0, and empties the slot
 * again: a prefill, a decode step, and a verification's LOGIT_ROWS (17) rows
 * with logits and as argmax. First calls pay for what is done lazily (pages
 * of the activations, the KV blocks and the argmax lists committed on first
 * touch; on a GPU, modules loaded): on the 2-core VM the small target's
 * first prefill took 132 ms against 14.5 later, its first decode step 17 ms
 * against 4.7. A worker calls it before it takes requests, so that the first
 * request does not pay. Where the context replays graphs it also records
 * the decode and verification shapes of 1..17 rows (llama_step.c). Slot 0
 * must be empty. */
int llama_ctx_warm_up(struct llama_ctx *ctx, char *err);

/* Runs the batch: the rows of all sequences go through the layers together,
 * so a call of n sequences reads the weights once, not n times; trees and
 * chains may share a call. Errors (nothing is changed in any slot):
 * ERR_CONTEXT_FULL when a slot would exceed max_seq_len, ERR_RANGE for a
 * token id outside the vocabulary or a bad slot, ERR_INVALID_ARG for a slot
 * named by two entries, a malformed tree or a slot whose tree is still
 * unaccepted, ERR_OVERLOADED
 * when the KV pool lacks the blocks the call needs, backend errors. */
int llama_forward(struct llama_ctx *ctx, const struct llama_seq_batch *seqs, int n_seqs,
                  char *err);

/* The checks llama_forward makes of one entry on its own (slot, sizes,
 * context length, token ids; not the pool, not duplicates): a caller that
 * batches independent requests uses it to fail one request alone rather
 * than the whole call. */
int llama_check_seq(const struct llama_ctx *ctx, const struct llama_seq_batch *s, char *err);

#endif
