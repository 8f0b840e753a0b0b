/* test_model_config.c: config.json parsing and validation, Llama-3 RoPE
 * frequencies (against an independent computation here), and the check of a
 * weight set against a config.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "tmpdir_fixture.h"
#include "model_config.h"
#include "safetensors.h"

/* Llama-3.2-1B-Instruct's config.json as shipped on the hub. */
static const char *const CONFIG_1B =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"head_dim\":64,"
    "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,"
    "\"intermediate_size\":8192,\"max_position_embeddings\":131072,\"mlp_bias\":false,"
    "\"model_type\":\"llama\",\"num_attention_heads\":32,\"num_hidden_layers\":16,"
    "\"num_key_value_heads\":8,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,"
    "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
    "\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.45.0.dev0\",\"use_cache\":true,\"vocab_size\":128256}";

/* A minimal valid config; tests splice keys into it. */
#define MINIMAL_KEYS                                                                  \
    "\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64," \
    "\"intermediate_size\":96,\"num_hidden_layers\":2,\"num_attention_heads\":4"

static int parse(struct model_config *c, const char *json, char *err)
{
    return model_config_parse(c, json, strlen(json), "cfg.json", err);
}

/* Parses `json` expecting `code` and a message containing `needle` and the
 * source name, on one line. */
static void expect_parse_fails(const char *json, int code, const char *needle)
{
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    int rc = parse(&c, json, err);
    if (rc != code || !strstr(err, needle))
        print_error("json %s\n  rc %d (expected %d), message \"%s\" (expected to contain \"%s\")\n",
                    json, rc, code, err, needle);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err, needle));
    assert_non_null(strstr(err, "cfg.json: "));
    assert_null(strchr(err, '\n'));
}

static void test_model_config_parses_llama_3_2_1b_config(void **state)
{
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    int rc = parse(&c, CONFIG_1B, err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_string_equal(c.source, "cfg.json");
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.intermediate_size, 8192);
    assert_int_equal(c.num_hidden_layers, 16);
    assert_int_equal(c.num_attention_heads, 32);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(c.rope_scaling_llama3, 1);
    assert_true(c.rope_factor == 32.0);
    assert_true(c.rope_low_freq_factor == 1.0);
    assert_true(c.rope_high_freq_factor == 4.0);
    assert_int_equal(c.rope_original_max_position_embeddings, 8192);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.bos_token_id, 128000);
    assert_int_equal(c.n_eos_token_ids, 3);
    assert_int_equal(c.eos_token_ids[0], 128001);
    assert_int_equal(c.eos_token_ids[1], 128008);
    assert_int_equal(c.eos_token_ids[2], 128009);
}

static void test_model_config_defaults_apply_when_keys_absent(void **state)
{
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(parse(&c, "{" MINIMAL_KEYS "}", err), 0);
    assert_int_equal(c.head_dim, 16);            /* 64 / 4 */
    assert_int_equal(c.num_key_value_heads, 4); /* = heads */
    assert_int_equal(c.rope_scaling_llama3, 0);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos_token_ids, 0);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.max_position_embeddings, 2048);

    /* null means absent; an integer eos is a list of one. */
    assert_int_equal(parse(&c, "{" MINIMAL_KEYS ",\"rope_scaling\":null,\"head_dim\":null,"
                               "\"num_key_value_heads\":null,\"eos_token_id\":7,"
                               "\"bos_token_id\":5}", err),
                     0);
    assert_int_equal(c.rope_scaling_llama3, 0);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.n_eos_token_ids, 1);
    assert_int_equal(c.eos_token_ids[0], 7);
    assert_int_equal(c.bos_token_id, 5);

    /* model_type alone identifies a Llama too. */
    assert_int_equal(parse(&c, "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
                               "\"intermediate_size\":8,\"num_hidden_layers\":1,"
                               "\"num_attention_heads\":2}", err),
                     0);
}

static void test_model_config_head_dim_need_not_match_hidden_over_heads(void **state)
{
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    /* hidden 64 over 3 heads does not divide, but head_dim is given. */
    assert_int_equal(parse(&c, "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,"
                               "\"hidden_size\":64,\"intermediate_size\":96,"
                               "\"num_hidden_layers\":2,\"num_attention_heads\":3,"
                               "\"head_dim\":32,\"num_key_value_heads\":1}", err),
                     0);
    assert_int_equal(c.head_dim, 32);
    expect_parse_fails("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,"
                       "\"hidden_size\":64,\"intermediate_size\":96,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":3}",
                       ERR_INVALID_ARG, "hidden_size");
}

static void test_model_config_rope_scaling_variants(void **state)
{
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    /* The legacy "type" key. */
    assert_int_equal(parse(&c, "{" MINIMAL_KEYS ",\"rope_scaling\":{\"type\":\"llama3\","
                               "\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                               "\"original_max_position_embeddings\":8192}}", err),
                     0);
    assert_int_equal(c.rope_scaling_llama3, 1);
    assert_true(c.rope_factor == 8.0);
    /* "default" is no scaling. */
    assert_int_equal(parse(&c, "{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":\"default\"}}",
                           err),
                     0);
    assert_int_equal(c.rope_scaling_llama3, 0);

    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
                       ERR_UNSUPPORTED, "rope_scaling.rope_type: \"yarn\"");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":4}}",
                       ERR_UNSUPPORTED, "rope_scaling.type: \"linear\"");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"factor\":4}}", ERR_INVALID_ARG,
                       "rope_scaling.rope_type");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":\"llama3\"}", ERR_FORMAT,
                       "rope_scaling");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":3}}", ERR_FORMAT,
                       "rope_scaling.rope_type");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":\"llama3\","
                       "\"low_freq_factor\":1,\"high_freq_factor\":4,"
                       "\"original_max_position_embeddings\":8192}}",
                       ERR_INVALID_ARG, "rope_scaling.factor: missing");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":\"llama3\","
                       "\"factor\":\"32\",\"low_freq_factor\":1,\"high_freq_factor\":4,"
                       "\"original_max_position_embeddings\":8192}}",
                       ERR_FORMAT, "rope_scaling.factor");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":\"llama3\","
                       "\"factor\":32,\"low_freq_factor\":4,\"high_freq_factor\":4,"
                       "\"original_max_position_embeddings\":8192}}",
                       ERR_INVALID_ARG, "rope_scaling.high_freq_factor");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":\"llama3\","
                       "\"factor\":32,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                       "\"original_max_position_embeddings\":8192.5}}",
                       ERR_FORMAT, "rope_scaling.original_max_position_embeddings");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_scaling\":{\"rope_type\":\"llama3\","
                       "\"factor\":-2,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                       "\"original_max_position_embeddings\":8192}}",
                       ERR_INVALID_ARG, "rope_scaling.factor");
}

static void test_model_config_unsupported_model_is_rejected(void **state)
{
    expect_parse_fails("{\"architectures\":[\"MistralForCausalLM\"],\"vocab_size\":100,"
                       "\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4}",
                       ERR_UNSUPPORTED, "architectures: \"MistralForCausalLM\"");
    expect_parse_fails("{" MINIMAL_KEYS ",\"model_type\":\"mistral\"}", ERR_UNSUPPORTED,
                       "model_type: \"mistral\"");
    expect_parse_fails("{" MINIMAL_KEYS ",\"hidden_act\":\"gelu\"}", ERR_UNSUPPORTED,
                       "hidden_act: \"gelu\"");
    expect_parse_fails("{" MINIMAL_KEYS ",\"attention_bias\":true}", ERR_UNSUPPORTED,
                       "attention_bias");
    expect_parse_fails("{" MINIMAL_KEYS ",\"mlp_bias\":true}", ERR_UNSUPPORTED, "mlp_bias");
    /* checkpoints quantized by other tools: the method named */
    expect_parse_fails("{" MINIMAL_KEYS ",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}}",
                       ERR_UNSUPPORTED, "quantized as \"gptq\"");
    expect_parse_fails("{" MINIMAL_KEYS ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\"}}",
                       ERR_UNSUPPORTED, "\"compressed-tensors\"");
    expect_parse_fails("{" MINIMAL_KEYS ",\"quantization_config\":{}}", ERR_UNSUPPORTED, "\"unknown\"");
    expect_parse_fails("{\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":96,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4}",
                       ERR_INVALID_ARG, "architectures");
    expect_parse_fails("{\"architectures\":\"LlamaForCausalLM\",\"vocab_size\":100}", ERR_FORMAT,
                       "architectures");
    expect_parse_fails("{\"architectures\":[],\"vocab_size\":100}", ERR_INVALID_ARG,
                       "architectures");
}

static void test_model_config_wrong_json_types_name_the_key(void **state)
{
    expect_parse_fails("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,"
                       "\"hidden_size\":\"64\",\"intermediate_size\":96,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4}",
                       ERR_FORMAT, "hidden_size: expected an integer, got a string");
    expect_parse_fails("{" MINIMAL_KEYS ",\"tie_word_embeddings\":\"true\"}", ERR_FORMAT,
                       "tie_word_embeddings: expected a boolean");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_theta\":\"500000\"}", ERR_FORMAT,
                       "rope_theta: expected a number");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rms_norm_eps\":[1e-5]}", ERR_FORMAT, "rms_norm_eps");
    expect_parse_fails("{" MINIMAL_KEYS ",\"head_dim\":16.5}", ERR_FORMAT, "head_dim");
    expect_parse_fails("{" MINIMAL_KEYS ",\"num_key_value_heads\":true}", ERR_FORMAT,
                       "num_key_value_heads");
    expect_parse_fails("{" MINIMAL_KEYS ",\"eos_token_id\":\"</s>\"}", ERR_FORMAT,
                       "eos_token_id");
    expect_parse_fails("{" MINIMAL_KEYS ",\"eos_token_id\":[1,\"2\"]}", ERR_FORMAT,
                       "eos_token_id[1]");
    expect_parse_fails("{" MINIMAL_KEYS ",\"bos_token_id\":1.5}", ERR_FORMAT, "bos_token_id");
    expect_parse_fails("{" MINIMAL_KEYS ",\"hidden_act\":1}", ERR_FORMAT, "hidden_act");
    expect_parse_fails("{" MINIMAL_KEYS ",\"mlp_bias\":0}", ERR_FORMAT, "mlp_bias");
    expect_parse_fails("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":1e12,"
                       "\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4}",
                       ERR_FORMAT, "vocab_size");
}

static void test_model_config_bad_values_name_the_key(void **state)
{
    expect_parse_fails("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,"
                       "\"intermediate_size\":96,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4}",
                       ERR_INVALID_ARG, "vocab_size: missing");
    expect_parse_fails("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,"
                       "\"hidden_size\":0,\"intermediate_size\":96,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4}",
                       ERR_INVALID_ARG, "hidden_size");
    expect_parse_fails("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":100,"
                       "\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":-1,"
                       "\"num_attention_heads\":4}",
                       ERR_INVALID_ARG, "num_hidden_layers");
    expect_parse_fails("{" MINIMAL_KEYS ",\"num_key_value_heads\":3}", ERR_INVALID_ARG,
                       "num_key_value_heads");
    expect_parse_fails("{" MINIMAL_KEYS ",\"num_key_value_heads\":8}", ERR_INVALID_ARG,
                       "num_key_value_heads");
    expect_parse_fails("{" MINIMAL_KEYS ",\"num_key_value_heads\":0}", ERR_INVALID_ARG,
                       "num_key_value_heads");
    expect_parse_fails("{" MINIMAL_KEYS ",\"head_dim\":15}", ERR_INVALID_ARG, "head_dim");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rms_norm_eps\":0}", ERR_INVALID_ARG, "rms_norm_eps");
    expect_parse_fails("{" MINIMAL_KEYS ",\"rope_theta\":-1}", ERR_INVALID_ARG, "rope_theta");
    expect_parse_fails("{" MINIMAL_KEYS ",\"eos_token_id\":100}", ERR_INVALID_ARG,
                       "eos_token_id");
    expect_parse_fails("{" MINIMAL_KEYS ",\"bos_token_id\":-3}", ERR_INVALID_ARG,
                       "bos_token_id");
    expect_parse_fails("{" MINIMAL_KEYS ",\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", ERR_RANGE,
                       "eos_token_id");
    expect_parse_fails("{" MINIMAL_KEYS ",\"max_position_embeddings\":0}", ERR_INVALID_ARG,
                       "max_position_embeddings");
}

static void test_model_config_malformed_json_is_rejected(void **state)
{
    expect_parse_fails("{\"vocab_size\": 100,", ERR_FORMAT, "JSON");
    expect_parse_fails("", ERR_FORMAT, "JSON");
    expect_parse_fails("[1,2]", ERR_FORMAT, "object");
    /* The length bounds the parse: a valid prefix of a longer buffer. */
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(model_config_parse(&c, CONFIG_1B, strlen(CONFIG_1B) - 1, "cut", err),
                     ERR_FORMAT);
}

/* Independent reference: frequencies classified in frequency space (not
 * wavelength), theta^(-2j/d) as exp(-log(theta) * 2j / d). */
static double ref_inv_freq(double theta, int head_dim, int j, int llama3, double factor,
                           double low, double high, double original)
{
    double base = exp(-log(theta) * (2.0 * j) / head_dim);
    if (!llama3)
        return base;
    double two_pi = 2.0 * acos(-1.0);
    double f_high = two_pi * high / original; /* above: keep */
    double f_low = two_pi * low / original;   /* below: divide by factor */
    if (base > f_high)
        return base;
    if (base < f_low)
        return base / factor;
    double s = (original * base / two_pi - low) / (high - low);
    return base / factor + s * (base - base / factor);
}

static void test_model_config_rope_inv_freq_matches_reference(void **state)
{
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(parse(&c, CONFIG_1B, err), 0);
    float inv[32];
    model_config_rope_inv_freq(&c, inv);
    int n_keep = 0, n_div = 0, n_mid = 0;
    for (int j = 0; j < 32; j++) {
        double ref = ref_inv_freq(500000.0, 64, j, 1, 32.0, 1.0, 4.0, 8192.0);
        double plain = exp(-log(500000.0) * (2.0 * j) / 64);
        if (fabs(ref - plain) < 1e-12 * plain)
            n_keep++;
        else if (fabs(ref - plain / 32.0) < 1e-12 * plain)
            n_div++;
        else
            n_mid++;
        if (fabs(inv[j] - ref) > 1e-6 * ref)
            print_error("j %d: got %.9g, reference %.9g\n", j, inv[j], ref);
        assert_true(fabs(inv[j] - ref) <= 1e-6 * ref);
    }
    assert_true(inv[0] == 1.0f);
    /* The 1B config exercises all three regions. */
    assert_true(n_keep > 0 && n_div > 0 && n_mid > 0);

    /* Without scaling: plain theta^(-2j/d). */
    assert_int_equal(parse(&c, "{" MINIMAL_KEYS ",\"rope_theta\":10000}", err), 0);
    float plain[8];
    model_config_rope_inv_freq(&c, plain);
    for (int j = 0; j < 8; j++) {
        double ref = ref_inv_freq(10000.0, 16, j, 0, 0, 0, 0, 0);
        assert_true(fabs(plain[j] - ref) <= 1e-6 * ref);
    }
}

/* ---- weights against config, on a tiny model written to a temp dir ---- */

static int setup(void **state) { return tmpdir_fixture_setup(state, "test_model_config"); }
static int teardown(void **state) { return tmpdir_fixture_teardown(state); }

/* Tiny Llama: vocab 16, hidden 8, ff 12, 2 layers, 4 heads of 4 (q dim 16,
 * deliberately != hidden), 2 kv heads. */
#define TINY_CONFIG(tie)                                                                   \
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":16," \
    "\"hidden_size\":8,\"intermediate_size\":12,\"num_hidden_layers\":2,"                  \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"                  \
    "\"tie_word_embeddings\":" tie ",\"bos_token_id\":1,\"eos_token_id\":[2,3]}"

/* Writes model.safetensors with every tensor of the tiny model, except
 * `skip`, and with `bad` (if not NULL) given an extra row. */
static void write_tiny_model(const char *dir, int with_lm_head, const char *skip, const char *bad)
{
    static uint16_t zeros[16 * 16];
    struct safetensors_entry e[32];
    size_t n = 0;
    char names[32][96];
    struct {
        const char *name;
        int n_dims;
        int64_t d0, d1;
    } list[] = {
        {"model.embed_tokens.weight", 2, 16, 8}, {"model.norm.weight", 1, 8, 0},
        {"lm_head.weight", 2, 16, 8},
    };
    for (size_t i = 0; i < 3; i++) {
        if (i == 2 && !with_lm_head)
            continue;
        snprintf(names[n], sizeof(names[n]), "%s", list[i].name);
        e[n] = (struct safetensors_entry){.name = names[n], .dtype = KERN_DTYPE_BF16,
                                          .n_dims = list[i].n_dims,
                                          .shape = {list[i].d0, list[i].d1}, .data = zeros};
        n++;
    }
    struct {
        const char *suffix;
        int n_dims;
        int64_t d0, d1;
    } layer[] = {
        {"input_layernorm.weight", 1, 8, 0},    {"post_attention_layernorm.weight", 1, 8, 0},
        {"self_attn.q_proj.weight", 2, 16, 8},  {"self_attn.k_proj.weight", 2, 8, 8},
        {"self_attn.v_proj.weight", 2, 8, 8},   {"self_attn.o_proj.weight", 2, 8, 16},
        {"mlp.gate_proj.weight", 2, 12, 8},     {"mlp.up_proj.weight", 2, 12, 8},
        {"mlp.down_proj.weight", 2, 8, 12},
    };
    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; i < sizeof(layer) / sizeof(layer[0]); i++) {
            snprintf(names[n], sizeof(names[n]), "model.layers.%d.%s", l, layer[i].suffix);
            e[n] = (struct safetensors_entry){.name = names[n], .dtype = KERN_DTYPE_BF16,
                                              .n_dims = layer[i].n_dims,
                                              .shape = {layer[i].d0, layer[i].d1}, .data = zeros};
            n++;
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip && strcmp(e[i].name, skip) == 0)
            continue;
        if (bad && strcmp(e[i].name, bad) == 0)
            e[i].shape[0] += 1;
        e[kept++] = e[i];
    }
    char path[256], err[ERR_MSG_MAX] = "";
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    int rc = safetensors_write(path, e, kept, err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(text, 1, strlen(text), fp), strlen(text));
    assert_int_equal(fclose(fp), 0);
}

/* Loads config + weights from dir and returns check_weights' code. */
static int load_and_check(const char *dir, char *err)
{
    struct model_config c;
    int rc = model_config_load(&c, dir, err);
    assert_int_equal(rc, 0);
    struct safetensors *st = NULL;
    rc = safetensors_open(&st, dir, err);
    assert_int_equal(rc, 0);
    rc = model_config_check_weights(&c, st, err);
    safetensors_close(st);
    return rc;
}

static void test_model_config_check_weights_accepts_tied_tiny_model(void **state)
{
    struct tmpdir_fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    write_text(f->dir, "config.json", TINY_CONFIG("true"));
    write_tiny_model(f->dir, 0, NULL, NULL);
    int rc = load_and_check(f->dir, err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);

    /* Loading the config file by its own path works too. */
    struct model_config c;
    char path[256];
    snprintf(path, sizeof(path), "%s/config.json", f->dir);
    assert_int_equal(model_config_load(&c, path, err), 0);
    assert_string_equal(c.source, path);
    assert_int_equal(c.n_eos_token_ids, 2);
}

static void test_model_config_check_weights_needs_lm_head_when_untied(void **state)
{
    struct tmpdir_fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    write_text(f->dir, "config.json", TINY_CONFIG("false"));
    write_tiny_model(f->dir, 0, NULL, NULL);
    assert_int_equal(load_and_check(f->dir, err), ERR_NOT_FOUND);
    assert_non_null(strstr(err, "tensor lm_head.weight: missing"));
    write_tiny_model(f->dir, 1, NULL, NULL);
    assert_int_equal(load_and_check(f->dir, err), 0);
}

static void test_model_config_check_weights_reports_missing_and_misshapen(void **state)
{
    struct tmpdir_fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    write_text(f->dir, "config.json", TINY_CONFIG("true"));
    write_tiny_model(f->dir, 0, "model.layers.1.self_attn.v_proj.weight", NULL);
    assert_int_equal(load_and_check(f->dir, err), ERR_NOT_FOUND);
    assert_non_null(strstr(err, "model.layers.1.self_attn.v_proj.weight"));

    write_tiny_model(f->dir, 0, NULL, "model.layers.1.mlp.up_proj.weight");
    assert_int_equal(load_and_check(f->dir, err), ERR_MISMATCH);
    char want[ERR_MSG_MAX];
    snprintf(want, sizeof(want),
             "%s/model.safetensors: tensor model.layers.1.mlp.up_proj.weight: shape [13, 8] "
             "expected [12, 8]",
             f->dir);
    assert_string_equal(err, want);

    write_tiny_model(f->dir, 0, NULL, "model.layers.0.self_attn.k_proj.weight");
    assert_int_equal(load_and_check(f->dir, err), ERR_MISMATCH);
    assert_non_null(strstr(err, "k_proj"));
}

static void test_model_config_load_missing_file_is_not_found(void **state)
{
    struct tmpdir_fixture *f = *state;
    struct model_config c;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(model_config_load(&c, f->dir, err), ERR_NOT_FOUND);
    assert_non_null(strstr(err, "config.json"));
    write_text(f->dir, "config.json", "{\"architectures\":[\"LlamaForCausalLM\"]");
    assert_int_equal(model_config_load(&c, f->dir, err), ERR_FORMAT);
    assert_non_null(strstr(err, "config.json"));
}

/* A model file where the directory belongs says what is expected (issue 64:
 * both used to be "not valid JSON"). */
static void test_model_config_load_of_a_model_file_says_what_is_expected(void **state)
{
    struct tmpdir_fixture *f = *state;
    struct model_config c;
    char err[ERR_MSG_MAX] = "", path[600];
    write_text(f->dir, "model.gguf", "GGUF\x03\x00\x00\x00 rest of a GGUF file");
    snprintf(path, sizeof path, "%s/model.gguf", f->dir);
    assert_int_equal(model_config_load(&c, path, err), ERR_FORMAT);
    assert_non_null(strstr(err, "is a GGUF file"));
    assert_non_null(strstr(err, "gguf_file="));
    write_tiny_model(f->dir, 1, NULL, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", f->dir);
    assert_int_equal(model_config_load(&c, path, err), ERR_FORMAT);
    assert_non_null(strstr(err, "is a safetensors weights file: give the model directory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_config_parses_llama_3_2_1b_config),
        cmocka_unit_test(test_model_config_defaults_apply_when_keys_absent),
        cmocka_unit_test(test_model_config_head_dim_need_not_match_hidden_over_heads),
        cmocka_unit_test(test_model_config_rope_scaling_variants),
        cmocka_unit_test(test_model_config_unsupported_model_is_rejected),
        cmocka_unit_test(test_model_config_wrong_json_types_name_the_key),
        cmocka_unit_test(test_model_config_bad_values_name_the_key),
        cmocka_unit_test(test_model_config_malformed_json_is_rejected),
        cmocka_unit_test(test_model_config_rope_inv_freq_matches_reference),
        cmocka_unit_test_setup_teardown(test_model_config_check_weights_accepts_tied_tiny_model,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_config_check_weights_needs_lm_head_when_untied,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_model_config_check_weights_reports_missing_and_misshapen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_config_load_missing_file_is_not_found, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_model_config_load_of_a_model_file_says_what_is_expected, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
