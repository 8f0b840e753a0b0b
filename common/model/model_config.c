/* model_config.c: parse and validate a Llama config.json (cJSON), compute
 * Llama-3 scaled RoPE frequencies, check a weight set against the config.
 *
 * What it is not: a general transformers config reader. Keys that do not
 * change the computation (initializer_range, torch_dtype, use_cache, ...) are
 * ignored; keys that would change it in ways the model code does not
 * implement (another architecture, activation, biases, rope type) are
 * refused by name rather than silently ignored.
 *
 * Invariants: see model_config.h. Every message starts with the source name
 * and the key ("config.json: rope_scaling.rope_type: ...").
 */
#include "model_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"
#include "safetensors.h"

/* A config.json is a few KiB; refuse absurd files before reading them. */
#define MODEL_CONFIG_FILE_MAX_BYTES (1u << 20)

static const char *mc_json_type(const cJSON *v)
{
    if (cJSON_IsNull(v))
        return "null";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "an invalid value";
}

/* Absent and JSON null both mean "not given" for optional keys. */
static const cJSON *mc_get(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* An integer value (JSON number without fraction, within int range). */
static int mc_as_int(const cJSON *v, const char *src, const char *key, int *out, char *err)
{
    if (!cJSON_IsNumber(v))
        return error_set(err, ERR_FORMAT, "%s: %s: expected an integer, got %s", src, key,
                         mc_json_type(v));
    double d = v->valuedouble;
    if (!(d >= (double)INT_MIN && d <= (double)INT_MAX) || d != floor(d))
        return error_set(err, ERR_FORMAT, "%s: %s: expected an integer, got %g", src, key, d);
    *out = (int)d;
    return 0;
}

/* The object keys are read from: its file (for messages) and its path
 * from the top ("rope_scaling." or ""). */
struct mc_keys {
    const cJSON *obj;
    const char *src;
    const char *prefix;
};

/* Integer key, >= 1; when absent: the default, or an error if required. */
static int mc_int(const struct mc_keys *k, const char *key, int required, int def, int *out,
                  char *err)
{
    const char *src = k->src;
    char full[96];
    snprintf(full, sizeof(full), "%s%s", k->prefix, key);
    const cJSON *v = mc_get(k->obj, key);
    if (!v) {
        if (required)
            return error_set(err, ERR_INVALID_ARG, "%s: %s: missing", src, full);
        *out = def;
        return 0;
    }
    int rc = mc_as_int(v, src, full, out, err);
    if (rc != 0)
        return rc;
    if (*out < 1)
        return error_set(err, ERR_INVALID_ARG, "%s: %s: must be at least %d, got %d", src, full,
                         1, *out);
    return 0;
}

/* Finite number key, > 0; when absent: the default, or an error if required. */
static int mc_positive(const struct mc_keys *k, const char *key, int required, double def,
                       double *out, char *err)
{
    const char *src = k->src;
    char full[96];
    snprintf(full, sizeof(full), "%s%s", k->prefix, key);
    const cJSON *v = mc_get(k->obj, key);
    if (!v) {
        if (required)
            return error_set(err, ERR_INVALID_ARG, "%s: %s: missing", src, full);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v))
        return error_set(err, ERR_FORMAT, "%s: %s: expected a number, got %s", src, full,
                         mc_json_type(v));
    if (!(v->valuedouble > 0.0) || !isfinite(v->valuedouble))
        return error_set(err, ERR_INVALID_ARG, "%s: %s: must be a positive number, got %g", src,
                         full, v->valuedouble);
    *out = v->valuedouble;
    return 0;
}

static int mc_bool(const cJSON *obj, const char *src, const char *key, int def, int *out,
                   char *err)
{
    const cJSON *v = mc_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return error_set(err, ERR_FORMAT, "%s: %s: expected a boolean, got %s", src, key,
                         mc_json_type(v));
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

static int mc_token_id(const cJSON *v, const char *src, const char *key, int vocab, int *out,
                       char *err)
{
    int rc = mc_as_int(v, src, key, out, err);
    if (rc != 0)
        return rc;
    if (*out < 0 || *out >= vocab)
        return error_set(err, ERR_INVALID_ARG, "%s: %s: token id %d outside the vocabulary [0, %d)",
                         src, key, *out, vocab);
    return 0;
}

static int mc_parse_architecture(const cJSON *root, const char *src, char *err)
{
    const cJSON *arch = mc_get(root, "architectures");
    const cJSON *type = mc_get(root, "model_type");
    if (!arch && !type)
        return error_set(err, ERR_INVALID_ARG,
                         "%s: architectures: missing (and no model_type either)", src);
    if (arch) {
        if (!cJSON_IsArray(arch))
            return error_set(err, ERR_FORMAT, "%s: architectures: expected an array, got %s", src,
                             mc_json_type(arch));
        if (cJSON_GetArraySize(arch) == 0)
            return error_set(err, ERR_INVALID_ARG, "%s: architectures: empty", src);
        const cJSON *a;
        cJSON_ArrayForEach(a, arch)
        {
            if (!cJSON_IsString(a))
                return error_set(err, ERR_FORMAT,
                                 "%s: architectures: expected strings, got %s", src,
                                 mc_json_type(a));
            if (strcmp(a->valuestring, "LlamaForCausalLM") != 0)
                return error_set(err, ERR_UNSUPPORTED,
                                 "%s: architectures: \"%s\" unsupported (only LlamaForCausalLM)",
                                 src, a->valuestring);
        }
    }
    if (type) {
        if (!cJSON_IsString(type))
            return error_set(err, ERR_FORMAT, "%s: model_type: expected a string, got %s", src,
                             mc_json_type(type));
        if (strcmp(type->valuestring, "llama") != 0)
            return error_set(err, ERR_UNSUPPORTED,
                             "%s: model_type: \"%s\" unsupported (only llama)", src,
                             type->valuestring);
    }
    const cJSON *act = mc_get(root, "hidden_act");
    if (act) {
        if (!cJSON_IsString(act))
            return error_set(err, ERR_FORMAT, "%s: hidden_act: expected a string, got %s", src,
                             mc_json_type(act));
        if (strcmp(act->valuestring, "silu") != 0)
            return error_set(err, ERR_UNSUPPORTED, "%s: hidden_act: \"%s\" unsupported (only silu)",
                             src, act->valuestring);
    }
    static const char *const bias_keys[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < sizeof(bias_keys) / sizeof(bias_keys[0]); i++) {
        int has_bias = 0;
        int rc = mc_bool(root, src, bias_keys[i], 0, &has_bias, err);
        if (rc != 0)
            return rc;
        if (has_bias)
            return error_set(err, ERR_UNSUPPORTED, "%s: %s: true is unsupported (no biases)", src,
                             bias_keys[i]);
    }
    return 0;
}

static int mc_parse_rope_scaling(const cJSON *root, const char *src, struct model_config *c,
                                 char *err)
{
    c->rope_scaling_llama3 = 0;
    c->rope_factor = 1.0;
    c->rope_low_freq_factor = 0.0;
    c->rope_high_freq_factor = 0.0;
    c->rope_original_max_position_embeddings = 0;
    const cJSON *rs = mc_get(root, "rope_scaling");
    if (!rs)
        return 0;
    if (!cJSON_IsObject(rs))
        return error_set(err, ERR_FORMAT, "%s: rope_scaling: expected an object or null, got %s",
                         src, mc_json_type(rs));
    const char *type_key = "rope_scaling.rope_type";
    const cJSON *type = mc_get(rs, "rope_type");
    if (!type) {
        type = mc_get(rs, "type"); /* the key's name before transformers 4.43 */
        type_key = "rope_scaling.type";
    }
    if (!type)
        return error_set(err, ERR_INVALID_ARG, "%s: rope_scaling.rope_type: missing", src);
    if (!cJSON_IsString(type))
        return error_set(err, ERR_FORMAT, "%s: %s: expected a string, got %s", src, type_key,
                         mc_json_type(type));
    if (strcmp(type->valuestring, "default") == 0)
        return 0;
    if (strcmp(type->valuestring, "llama3") != 0)
        return error_set(err, ERR_UNSUPPORTED,
                         "%s: %s: \"%s\" unsupported (llama3 or default only)", src, type_key,
                         type->valuestring);
    int rc;
    const struct mc_keys k = {.obj = rs, .src = src, .prefix = "rope_scaling."};
    if ((rc = mc_positive(&k, "factor", 1, 0, &c->rope_factor, err)) ||
        (rc = mc_positive(&k, "low_freq_factor", 1, 0, &c->rope_low_freq_factor, err)) ||
        (rc = mc_positive(&k, "high_freq_factor", 1, 0, &c->rope_high_freq_factor, err)) ||
        (rc = mc_int(&k, "original_max_position_embeddings", 1, 0,
                     &c->rope_original_max_position_embeddings, err)))
        return rc;
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return error_set(err, ERR_INVALID_ARG,
                         "%s: rope_scaling.high_freq_factor: %g must exceed low_freq_factor %g",
                         src, c->rope_high_freq_factor, c->rope_low_freq_factor);
    c->rope_scaling_llama3 = 1;
    return 0;
}

static int mc_parse_tokens(const cJSON *root, const char *src, struct model_config *c, char *err)
{
    int rc;
    c->bos_token_id = -1;
    const cJSON *bos = mc_get(root, "bos_token_id");
    if (bos && (rc = mc_token_id(bos, src, "bos_token_id", c->vocab_size, &c->bos_token_id, err)))
        return rc;

    c->n_eos_token_ids = 0;
    const cJSON *eos = mc_get(root, "eos_token_id");
    if (!eos)
        return 0;
    if (cJSON_IsArray(eos)) {
        int n = cJSON_GetArraySize(eos);
        if (n > MODEL_CONFIG_MAX_EOS)
            return error_set(err, ERR_RANGE, "%s: eos_token_id: %d ids, at most %d supported", src,
                             n, MODEL_CONFIG_MAX_EOS);
        const cJSON *id;
        cJSON_ArrayForEach(id, eos)
        {
            char key[48];
            snprintf(key, sizeof(key), "eos_token_id[%d]", c->n_eos_token_ids);
            rc = mc_token_id(id, src, key, c->vocab_size, &c->eos_token_ids[c->n_eos_token_ids],
                             err);
            if (rc != 0)
                return rc;
            c->n_eos_token_ids++;
        }
        return 0;
    }
    if (!cJSON_IsNumber(eos))
        return error_set(err, ERR_FORMAT,
                         "%s: eos_token_id: expected an integer or a list of integers, got %s",
                         src, mc_json_type(eos));
    rc = mc_token_id(eos, src, "eos_token_id", c->vocab_size, &c->eos_token_ids[0], err);
    if (rc != 0)
        return rc;
    c->n_eos_token_ids = 1;
    return 0;
}

/* A checkpoint quantized by another tool (GPTQ, AWQ, compressed-tensors,
 * bitsandbytes, ...) names its method in quantization_config: refused with
 * that name. Tandem quantizes the bf16/f16 weights itself as they load. */
static int mc_refuse_prequantized(const cJSON *root, const char *src, char *err)
{
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (q == NULL || cJSON_IsNull(q))
        return 0;
    const cJSON *method = cJSON_IsObject(q) ? cJSON_GetObjectItemCaseSensitive(q, "quant_method") : NULL;
    return error_set(err, ERR_UNSUPPORTED,
                     "%s: quantization_config: a checkpoint quantized as \"%.32s\" is not supported; "
                     "load the model's bf16 or f16 weights and set quantize (int8) instead",
                     src, cJSON_IsString(method) ? method->valuestring : "unknown");
}

int model_config_parse(struct model_config *out, const char *json, size_t len,
                       const char *source_name, char *err)
{
    struct model_config c;
    memset(&c, 0, sizeof(c));
    snprintf(c.source, sizeof(c.source), "%s", source_name ? source_name : "config.json");
    const char *src = c.source;
    if (!json)
        return error_set(err, ERR_INVALID_ARG, "%s: no text", src);

    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return error_set(err, ERR_FORMAT, "%s: not valid JSON", src);
    int rc;
    if (!cJSON_IsObject(root)) {
        rc = error_set(err, ERR_FORMAT, "%s: expected a JSON object at the top level", src);
        goto done;
    }
    if ((rc = mc_parse_architecture(root, src, err)) || (rc = mc_refuse_prequantized(root, src, err)))
        goto done;

    const struct mc_keys k = {.obj = root, .src = src, .prefix = ""};
    if ((rc = mc_int(&k, "vocab_size", 1, 0, &c.vocab_size, err)) ||
        (rc = mc_int(&k, "hidden_size", 1, 0, &c.hidden_size, err)) ||
        (rc = mc_int(&k, "intermediate_size", 1, 0, &c.intermediate_size, err)) ||
        (rc = mc_int(&k, "num_hidden_layers", 1, 0, &c.num_hidden_layers, err)) ||
        (rc = mc_int(&k, "num_attention_heads", 1, 0, &c.num_attention_heads, err)) ||
        (rc = mc_int(&k, "num_key_value_heads", 0, c.num_attention_heads,
                     &c.num_key_value_heads, err)) ||
        (rc = mc_int(&k, "max_position_embeddings", 0, 2048, &c.max_position_embeddings, err)) ||
        (rc = mc_positive(&k, "rms_norm_eps", 0, 1e-6, &c.rms_norm_eps, err)) ||
        (rc = mc_positive(&k, "rope_theta", 0, 10000.0, &c.rope_theta, err)) ||
        (rc = mc_bool(root, src, "tie_word_embeddings", 0, &c.tie_word_embeddings, err)))
        goto done;

    if (mc_get(root, "head_dim")) {
        if ((rc = mc_int(&k, "head_dim", 1, 0, &c.head_dim, err)))
            goto done;
    } else {
        if (c.hidden_size % c.num_attention_heads != 0) {
            rc = error_set(err, ERR_INVALID_ARG,
                           "%s: hidden_size: %d not divisible by num_attention_heads %d (and no "
                           "head_dim given)",
                           src, c.hidden_size, c.num_attention_heads);
            goto done;
        }
        c.head_dim = c.hidden_size / c.num_attention_heads;
    }
    if (c.head_dim % 2 != 0) {
        rc = error_set(err, ERR_INVALID_ARG, "%s: head_dim: %d must be even (RoPE rotates pairs)",
                       src, c.head_dim);
        goto done;
    }
    if (c.num_key_value_heads > c.num_attention_heads ||
        c.num_attention_heads % c.num_key_value_heads != 0) {
        rc = error_set(err, ERR_INVALID_ARG,
                       "%s: num_key_value_heads: %d does not divide num_attention_heads %d", src,
                       c.num_key_value_heads, c.num_attention_heads);
        goto done;
    }
    if ((rc = mc_parse_rope_scaling(root, src, &c, err)) ||
        (rc = mc_parse_tokens(root, src, &c, err)))
        goto done;
    *out = c;
done:
    cJSON_Delete(root);
    return rc;
}

/* Whether buf, a file's first len bytes, begins as a safetensors file does:
 * an 8-byte little-endian header length, then the header's JSON object. */
static bool looks_like_safetensors(const char *buf, size_t len)
{
    if (len < 9 || buf[8] != '{')
        return false;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | (unsigned char)buf[i];
    return n >= 2;
}

int model_config_load(struct model_config *out, const char *path, char *err)
{
    if (!path || !path[0])
        return error_set(err, ERR_INVALID_ARG, "model config: empty path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return error_set_errno(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_IO, errno, "%s", path);
    char file[4096];
    int n = S_ISDIR(sb.st_mode) ? snprintf(file, sizeof(file), "%s/config.json", path)
                                : snprintf(file, sizeof(file), "%s", path);
    if (n < 0 || (size_t)n >= sizeof(file))
        return error_set(err, ERR_INVALID_ARG, "%s: path too long", path);

    FILE *fp = fopen(file, "rb");
    if (!fp)
        return error_set_errno(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_IO, errno, "%s", file);
    char *buf = malloc(MODEL_CONFIG_FILE_MAX_BYTES + 1);
    if (!buf) {
        fclose(fp);
        return error_set(err, ERR_NOMEM, "%s: out of memory", file);
    }
    size_t len = fread(buf, 1, MODEL_CONFIG_FILE_MAX_BYTES + 1, fp);
    int rc = 0;
    if (ferror(fp))
        rc = error_set(err, ERR_IO, "%s: read failed", file);
    else if (len > MODEL_CONFIG_FILE_MAX_BYTES)
        rc = error_set(err, ERR_FORMAT, "%s: larger than %u bytes", file,
                       MODEL_CONFIG_FILE_MAX_BYTES);
    if (fclose(fp) != 0 && rc == 0)
        rc = error_set_errno(err, ERR_IO, errno, "%s: close", file);
    /* a model file given for its directory: say what is expected, not "not valid JSON" */
    if (rc == 0 && len >= 4 && memcmp(buf, "GGUF", 4) == 0)
        rc = error_set(err, ERR_FORMAT,
                       "%s is a GGUF file; Tandem loads a HuggingFace model directory (config.json, "
                       "*.safetensors, tokenizer.json). Convert it with transformers "
                       "(AutoModelForCausalLM.from_pretrained(DIR, gguf_file=FILE).save_pretrained(OUT), the "
                       "same with AutoTokenizer) or use the original safetensors release",
                       file);
    else if (rc == 0 && !S_ISDIR(sb.st_mode) && looks_like_safetensors(buf, len))
        rc = error_set(err, ERR_FORMAT,
                       "%s is a safetensors weights file: give the model directory that holds it (with "
                       "config.json and tokenizer.json)",
                       file);
    if (rc == 0)
        rc = model_config_parse(out, buf, len, file, err);
    free(buf);
    return rc;
}

void model_config_rope_inv_freq(const struct model_config *cfg, float *inv_freq)
{
    const int half = cfg->head_dim / 2;
    const double pi = 3.14159265358979323846;
    const double original = (double)cfg->rope_original_max_position_embeddings;
    for (int j = 0; j < half; j++) {
        double inv = pow(cfg->rope_theta, -(double)(2 * j) / (double)cfg->head_dim);
        if (cfg->rope_scaling_llama3) {
            const double low = cfg->rope_low_freq_factor, high = cfg->rope_high_freq_factor;
            const double wavelen = 2.0 * pi / inv;
            if (wavelen < original / high) {
                /* high frequency: unchanged */
            } else if (wavelen > original / low) {
                inv = inv / cfg->rope_factor;
            } else {
                const double smooth = (original / wavelen - low) / (high - low);
                inv = (1.0 - smooth) * inv / cfg->rope_factor + smooth * inv;
            }
        }
        inv_freq[j] = (float)inv;
    }
}

static int mc_expect(const struct safetensors *st, const char *name, int n_dims, int64_t d0,
                     int64_t d1, char *err)
{
    const int64_t shape[2] = {d0, d1};
    const struct safetensors_tensor *t = NULL;
    int rc = safetensors_expect(st, name, n_dims, shape, &t, err);
    if (rc != 0)
        return rc;
    if (t->dtype != KERN_DTYPE_BF16 && t->dtype != KERN_DTYPE_F16 && t->dtype != KERN_DTYPE_F32)
        return error_set(err, ERR_MISMATCH, "%s: tensor %s: dtype %s unsupported", t->file_path,
                         name, kern_dtype_name(t->dtype));
    return 0;
}

int model_config_check_weights(const struct model_config *cfg, const struct safetensors *st,
                               char *err)
{
    const int64_t hidden = cfg->hidden_size, ff = cfg->intermediate_size;
    const int64_t q_dim = (int64_t)cfg->num_attention_heads * cfg->head_dim;
    const int64_t kv_dim = (int64_t)cfg->num_key_value_heads * cfg->head_dim;
    int rc;
    if ((rc = mc_expect(st, "model.embed_tokens.weight", 2, cfg->vocab_size, hidden, err)) ||
        (rc = mc_expect(st, "model.norm.weight", 1, hidden, 0, err)))
        return rc;
    if (!cfg->tie_word_embeddings &&
        (rc = mc_expect(st, "lm_head.weight", 2, cfg->vocab_size, hidden, err)))
        return rc;
    struct {
        const char *suffix;
        int n_dims;
        int64_t d0, d1;
    } per_layer[] = {
        {"input_layernorm.weight", 1, hidden, 0},
        {"post_attention_layernorm.weight", 1, hidden, 0},
        {"self_attn.q_proj.weight", 2, q_dim, hidden},
        {"self_attn.k_proj.weight", 2, kv_dim, hidden},
        {"self_attn.v_proj.weight", 2, kv_dim, hidden},
        {"self_attn.o_proj.weight", 2, hidden, q_dim},
        {"mlp.gate_proj.weight", 2, ff, hidden},
        {"mlp.up_proj.weight", 2, ff, hidden},
        {"mlp.down_proj.weight", 2, hidden, ff},
    };
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        for (size_t i = 0; i < sizeof(per_layer) / sizeof(per_layer[0]); i++) {
            char name[128];
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, per_layer[i].suffix);
            rc = mc_expect(st, name, per_layer[i].n_dims, per_layer[i].d0, per_layer[i].d1, err);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}
