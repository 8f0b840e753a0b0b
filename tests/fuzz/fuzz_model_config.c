/* fuzz_model_config.c: config.json from fuzz bytes through model_config_parse
 * (its in-memory entry point; model_config_load only reads the file). On
 * success the documented invariants are checked and the RoPE frequencies
 * computed. */
#include "fuzz_common.h"

#include "error.h"
#include "model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct model_config cfg;
    char err[ERR_MSG_MAX];
    if (model_config_parse(&cfg, (const char *)data, size, "config.json", err) != 0)
        return 0;
    /* model_config.h: every size positive, heads divisible, head_dim even,
     * token ids in [0, vocab_size). */
    if (cfg.vocab_size <= 0 || cfg.hidden_size <= 0 || cfg.intermediate_size <= 0 ||
        cfg.num_hidden_layers <= 0 || cfg.num_attention_heads <= 0 ||
        cfg.num_key_value_heads <= 0 || cfg.head_dim <= 0 || cfg.head_dim % 2 != 0 ||
        cfg.num_attention_heads % cfg.num_key_value_heads != 0 ||
        cfg.bos_token_id < -1 || cfg.bos_token_id >= cfg.vocab_size ||
        cfg.n_eos_token_ids < 0 || cfg.n_eos_token_ids > MODEL_CONFIG_MAX_EOS)
        abort();
    for (int i = 0; i < cfg.n_eos_token_ids; i++)
        if (cfg.eos_token_ids[i] < 0 || cfg.eos_token_ids[i] >= cfg.vocab_size)
            abort();
    if (cfg.head_dim <= (1 << 16)) {
        float *inv_freq = malloc((size_t)cfg.head_dim / 2 * sizeof *inv_freq);
        if (inv_freq)
            model_config_rope_inv_freq(&cfg, inv_freq);
        free(inv_freq);
    }
    return 0;
}
