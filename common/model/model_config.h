/* model_config.h: a HuggingFace Llama config.json, parsed and validated, and
 * the checks that tie it to a safetensors weight set.
 *
 * What it is: the immutable description of one Llama model (sizes, norms,
 * RoPE with optional Llama-3 frequency scaling, tied embeddings, special
 * token ids). Only LlamaForCausalLM / model_type "llama" with silu
 * activations and no biases is accepted; anything else is refused with the
 * offending key named.
 * What it is not: the weights or the tokenizer.
 *
 * Invariants after a successful parse: every size is positive,
 * num_attention_heads % num_key_value_heads == 0, head_dim is even, token ids
 * lie in [0, vocab_size) (bos_token_id is -1 when absent).
 */
#ifndef TANDEM_MODEL_CONFIG_H
#define TANDEM_MODEL_CONFIG_H

#include <stddef.h>

struct safetensors;

#define MODEL_CONFIG_MAX_EOS 8

struct model_config {
    char source[256]; /* file or name it was parsed from, for messages */
    int vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim, max_position_embeddings;
    double rms_norm_eps, rope_theta;
    int rope_scaling_llama3; /* 0 none, 1 llama3 */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position_embeddings;
    int tie_word_embeddings;
    int bos_token_id; /* -1 when the config has none */
    int n_eos_token_ids;
    int eos_token_ids[MODEL_CONFIG_MAX_EOS];
};

/* Reads and parses `path`: a model directory (its config.json) or a
 * config.json file. Returns 0, ERR_NOT_FOUND / ERR_IO (file), or what
 * model_config_parse returns. */
int model_config_load(struct model_config *out, const char *path, char *err);

/* Parses json[0..len) (need not be NUL-terminated). source_name is used in
 * messages and copied into out->source. Defaults as in transformers'
 * LlamaConfig: head_dim = hidden_size / num_attention_heads,
 * num_key_value_heads = num_attention_heads, rms_norm_eps 1e-6, rope_theta
 * 10000, max_position_embeddings 2048, tie_word_embeddings false, no rope
 * scaling. Returns 0, ERR_FORMAT (not JSON, wrong JSON type: the key is
 * named), ERR_INVALID_ARG (missing or inconsistent value, named),
 * ERR_UNSUPPORTED (architecture, model_type, hidden_act, biases, rope type).
 * *out is fully written only on success. */
int model_config_parse(struct model_config *out, const char *json, size_t len,
                       const char *source_name, char *err);

/* RoPE inverse frequencies, inv_freq[j] for j in [0, head_dim/2), computed in
 * double and stored as float: theta^(-2j/head_dim), then Llama-3 scaled when
 * rope_scaling_llama3 (as transformers' _compute_llama3_parameters). */
void model_config_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

/* Checks that st holds every tensor a Llama model of this config needs with
 * the exact shape and a BF16/F16/F32 dtype: model.embed_tokens.weight,
 * per layer the two norms, q/k/v/o projections and gate/up/down projections,
 * model.norm.weight, and lm_head.weight when the embeddings are untied.
 * Returns 0, ERR_NOT_FOUND (missing tensor) or ERR_MISMATCH (shape, dtype);
 * the message names the file and tensor. */
int model_config_check_weights(const struct model_config *cfg, const struct safetensors *st,
                               char *err);

#endif
