/* tandem-generate: single-process generation, target-only or speculative.
 *
 *   tandem-generate --model DIR (--prompt TEXT | --chat TEXT | --ids 1,2,3)
 *       [--draft DIR] [--drafter model|ngram|none] [--spec-k N] [--spec-mode sampled|point_mass]
 *       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]
 *       [--seed S] [--threads N] [--max-seq-len N] [--json]
 *       [--backend cpu|cuda] [--device D] [--draft-device D] [--sampler host|device]
 *       [--no-graphs]
 *       [--quantize none|int8|int4] [--draft-quantize none|int8|int4]
 *       [--dump-logits FILE]
 *
 * Prints the generated text (or, with --json, one JSON object with ids, text
 * and figures). Thin: parse, create, run, destroy. --dump-logits writes the
 * target's raw logits after every token of the prompt and the output but the
 * last (float32, [n_prompt + n_out - 1, vocab]: row n_prompt - 1 + i holds
 * the logits output token i was chosen from), recomputed by one forward call:
 * what tests compute log-probabilities from on their own.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "error.h"
#include "grammar_spec.h"
#include "llama.h"
#include "specdec.h"
#include "tokenizer.h"

struct options {
    const char *model_dir, *draft_dir, *prompt, *chat, *ids;
    const char *backend, *device, *draft_device; /* draft_device NULL: the target's backend */
    const char *sampler; /* "host", "device" or NULL: device on cuda, host on cpu */
    const char *drafter; /* "model", "ngram", "none" or NULL: model with --draft, else none */
    const char *dump_logits; /* NULL, or the file of the output's logits rows */
    const char *grammar_file, *schema_file; /* structured output: GBNF text or a JSON schema */
    enum quantize_mode quantize, draft_quantize; /* the target's and the draft's projections */
    int max_tokens, spec_k, threads, max_seq_len, json;
    int no_graphs; /* every kernel launched one by one on cuda (the same bits) */
    enum speculate_mode mode;
    struct sampling_params sampling;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-generate --model DIR (--prompt TEXT | --chat TEXT | --ids 1,2,3)\n"
            "         [--draft DIR] [--drafter model|ngram|none] [--spec-k N (0 = adaptive)]\n"
            "         [--spec-mode sampled|point_mass]\n"
            "         [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
            "         [--seed S] [--threads N] [--max-seq-len N] [--json]\n"
            "         [--backend cpu|cuda] [--device ORDINAL|GPU-UUID] [--draft-device ORDINAL|GPU-UUID]\n"
            "         [--sampler host|device (default: device on cuda: logits stay on the GPU)]\n"
            "         [--quantize none|int8|int4] [--draft-quantize none|int8|int4]\n"
            "         [--dump-logits FILE (the output's raw logits, float32 rows)]\n"
            "         [--no-graphs (cuda: every kernel launched one by one; the same tokens)]\n"
            "         [--grammar-file FILE (GBNF) | --json-schema FILE (structured output)]\n");
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tandem-generate: %s: expected an integer in %ld..%ld, got \"%s\"\n", flag,
                lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) {
        fprintf(stderr, "tandem-generate: %s: expected a number, got \"%s\"\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Structured output for one run: the engine and mask of --grammar-file or
 * --json-schema over the tokenizer's bytes, and the target's and the
 * draft's views of the sequence (specdec.h). */
struct gen_grammar {
    struct token_mask_vocab *vocab;
    struct grammar_engine *engine;
    struct token_mask *mask;
    struct specdec_grammar half[2]; /* target, draft */
};

static int read_file(const char *path, char **out, size_t *len, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return error_set(err, ERR_NOMEM, "out of memory");
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

static int gen_grammar_open(struct gen_grammar *gg, const struct options *o,
                            const struct tokenizer *tk, const struct model_config *cfg,
                            struct specdec_request *req, char *err)
{
    if (!tk)
        return error_set(err, ERR_NOT_FOUND, "--grammar-file/--json-schema: the model has no tokenizer");
    struct grammar_spec spec = {.kind = o->grammar_file ? GRAMMAR_SPEC_GBNF : GRAMMAR_SPEC_JSON_SCHEMA};
    int rc = read_file(o->grammar_file ? o->grammar_file : o->schema_file, &spec.text, &spec.len, err);
    struct grammar *g = NULL;
    if (!rc)
        rc = grammar_spec_compile(&spec, o->grammar_file ? "--grammar-file" : "--json-schema", &g, err);
    grammar_spec_free(&spec);
    if (!rc)
        rc = grammar_engine_create(&gg->engine, g, 0, err);
    const int32_t n = tokenizer_vocab_size(tk);
    const uint8_t **bytes = rc ? NULL : calloc((size_t)n, sizeof *bytes);
    size_t *lens = rc ? NULL : calloc((size_t)n, sizeof *lens);
    if (!rc && (!bytes || !lens))
        rc = error_set(err, ERR_NOMEM, "out of memory");
    for (int32_t i = 0; !rc && i < n; i++)
        if (!tokenizer_is_special(tk, i))
            bytes[i] = tokenizer_token_bytes(tk, i, &lens[i]);
    if (!rc)
        rc = token_mask_vocab_create(&gg->vocab, bytes, lens, n, err);
    free(bytes);
    free(lens);
    if (!rc)
        rc = token_mask_create(&gg->mask, gg->engine, gg->vocab, 0, err);
    for (int h = 0; !rc && h < 2; h++) {
        struct specdec_grammar *s = &gg->half[h];
        s->mask = gg->mask;
        s->vocab = gg->vocab;
        s->eos = (struct token_mask_eos){.ids = cfg->eos_token_ids, .n = cfg->n_eos_token_ids};
        s->bits = malloc(token_mask_words(gg->mask) * sizeof(uint64_t));
        if (!s->bits || grammar_matcher_init(&s->matcher, gg->engine))
            rc = error_set(err, ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        req->gram_target = &gg->half[0];
        req->gram_draft = &gg->half[1];
    }
    return rc;
}

static void gen_grammar_close(struct gen_grammar *gg)
{
    for (int h = 0; h < 2; h++) {
        if (gg->half[h].matcher.states)
            grammar_matcher_free(&gg->half[h].matcher);
        free(gg->half[h].bits);
    }
    token_mask_destroy(gg->mask);
    grammar_engine_destroy(gg->engine);
    token_mask_vocab_destroy(gg->vocab);
}

static int parse_args(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->max_tokens = 128;
    o->mode = SPECULATE_MODE_SAMPLED;
    sampling_params_default(&o->sampling);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--no-graphs")) {
            o->no_graphs = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem-generate: %s: missing value (or unknown flag)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        long n;
        if (!strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--dump-logits")) o->dump_logits = v;
        else if (!strcmp(a, "--grammar-file")) o->grammar_file = v;
        else if (!strcmp(a, "--json-schema")) o->schema_file = v;
        else if (!strcmp(a, "--draft")) o->draft_dir = v;
        else if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--chat")) o->chat = v;
        else if (!strcmp(a, "--ids")) o->ids = v;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--draft-device")) o->draft_device = v;
        else if (!strcmp(a, "--drafter")) {
            if (strcmp(v, "model") && strcmp(v, "ngram") && strcmp(v, "none")) {
                fprintf(stderr, "tandem-generate: --drafter: expected model, ngram or none, got \"%s\" (suffix and "
                                "auto draft from earlier requests: the coordinator's)\n", v);
                return -1;
            }
            o->drafter = v;
        }
        else if (!strcmp(a, "--quantize") || !strcmp(a, "--draft-quantize")) {
            char err[ERR_MSG_MAX];
            if (quantize_mode_parse(v, !strcmp(a, "--quantize") ? &o->quantize : &o->draft_quantize, err)) {
                fprintf(stderr, "tandem-generate: %s: %s\n", a, err);
                return -1;
            }
        }
        else if (!strcmp(a, "--sampler")) {
            if (strcmp(v, "host") && strcmp(v, "device")) {
                fprintf(stderr, "tandem-generate: --sampler: expected host or device, got \"%s\"\n", v);
                return -1;
            }
            o->sampler = v;
        }
        else if (!strcmp(a, "--max-tokens")) {
            if (parse_long(a, v, 1, 1 << 20, &n)) return -1;
            o->max_tokens = (int)n;
        } else if (!strcmp(a, "--spec-k")) {
            if (parse_long(a, v, 0, SPECULATE_K_MAX, &n)) return -1;
            o->spec_k = (int)n;
        } else if (!strcmp(a, "--threads")) {
            if (parse_long(a, v, 0, 1024, &n)) return -1;
            o->threads = (int)n;
        } else if (!strcmp(a, "--max-seq-len")) {
            if (parse_long(a, v, 0, 1 << 24, &n)) return -1;
            o->max_seq_len = (int)n;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') {
                fprintf(stderr, "tandem-generate: --seed: expected an unsigned integer, got \"%s\"\n", v);
                return -1;
            }
            o->sampling.seed = (uint64_t)s;
        } else if (!strcmp(a, "--temperature")) {
            if (parse_float(a, v, &o->sampling.temperature)) return -1;
        } else if (!strcmp(a, "--top-k")) {
            if (parse_long(a, v, -1000000, 1000000000, &n)) return -1;
            o->sampling.top_k = (int)n;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_float(a, v, &o->sampling.top_p)) return -1;
        } else if (!strcmp(a, "--min-p")) {
            if (parse_float(a, v, &o->sampling.min_p)) return -1;
        } else if (!strcmp(a, "--spec-mode")) {
            if (!strcmp(v, "sampled")) o->mode = SPECULATE_MODE_SAMPLED;
            else if (!strcmp(v, "point_mass")) o->mode = SPECULATE_MODE_POINT_MASS;
            else {
                fprintf(stderr, "tandem-generate: --spec-mode: expected sampled or point_mass, got \"%s\"\n", v);
                return -1;
            }
        } else {
            fprintf(stderr, "tandem-generate: unknown flag %s\n", a);
            return -1;
        }
    }
    if (!o->model_dir) {
        fprintf(stderr, "tandem-generate: --model: required\n");
        return -1;
    }
    if (!!o->prompt + !!o->chat + !!o->ids != 1) {
        fprintf(stderr, "tandem-generate: give exactly one of --prompt, --chat, --ids\n");
        return -1;
    }
    if (o->grammar_file && o->schema_file) {
        fprintf(stderr, "tandem-generate: give at most one of --grammar-file, --json-schema\n");
        return -1;
    }
    if (!o->drafter)
        o->drafter = o->draft_dir ? "model" : "none";
    if (!strcmp(o->drafter, "model") != !!o->draft_dir) {
        fprintf(stderr, "tandem-generate: --drafter %s: %s\n", o->drafter,
                o->draft_dir ? "--draft is for --drafter model" : "needs --draft DIR");
        return -1;
    }
    return 0;
}

static int parse_ids(const char *s, int32_t **out, int *n_out, char *err)
{
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return error_set(err, ERR_NOMEM, "--ids: out of memory");
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return error_set(err, ERR_INVALID_ARG, "--ids: expected comma-separated token ids, got \"%s\"", s);
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, 2 * cap * sizeof *ids);
            if (!grown) {
                free(ids);
                return error_set(err, ERR_NOMEM, "--ids: out of memory");
            }
            ids = grown;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        free(ids);
        return error_set(err, ERR_INVALID_ARG, "--ids: no token ids given");
    }
    *out = ids;
    *n_out = (int)n;
    return 0;
}

/* Prompt ids from --ids, --prompt (with BOS) or --chat (one user message). */
static int build_prompt(const struct options *o, const struct tokenizer *tk, int32_t **ids,
                        int *n_ids, char *err)
{
    if (o->ids)
        return parse_ids(o->ids, ids, n_ids, err);
    if (!tk)
        return error_set(err, ERR_NOT_FOUND, "%s: the model has no tokenizer.json; use --ids",
                         o->model_dir);
    size_t n = 0;
    int rc;
    if (o->prompt) {
        rc = tokenizer_encode(tk, o->prompt, strlen(o->prompt), TOKENIZER_ADD_BOS, ids, &n, err);
    } else {
        struct chat_message msg = {.role = "user", .content = o->chat, .content_len = strlen(o->chat)};
        rc = chat_template_encode(tk, &msg, 1, 1, NULL, ids, &n, err);
    }
    *n_ids = (int)n;
    return rc;
}

static void print_json(const struct options *o, const int32_t *ids, int n, const char *text,
                       const struct specdec_stats *st, const char *sampler)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "ids");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON_AddStringToObject(j, "text", text ? text : "");
    cJSON_AddNumberToObject(j, "prompt_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(j, "generated_tokens", st->generated_tokens);
    cJSON_AddStringToObject(j, "finish_reason", st->finish_reason ? st->finish_reason : "");
    cJSON_AddNumberToObject(j, "prefill_ms", st->prefill_ms);
    cJSON_AddNumberToObject(j, "decode_ms", st->decode_ms);
    double decode_tokens = st->generated_tokens > 1 ? st->generated_tokens - 1 : 0;
    cJSON_AddNumberToObject(j, "tokens_per_s",
                            st->decode_ms > 0 ? decode_tokens * 1000.0 / st->decode_ms : 0.0);
    cJSON_AddStringToObject(j, "sampler", sampler);
    cJSON_AddStringToObject(j, "drafter", o->drafter);
    if (strcmp(o->drafter, "none") != 0) {
        cJSON_AddNumberToObject(j, "rounds", st->rounds);
        cJSON_AddNumberToObject(j, "drafted", st->drafted);
        cJSON_AddNumberToObject(j, "accepted", st->accepted);
        cJSON_AddNumberToObject(j, "acceptance_rate",
                                st->drafted ? (double)st->accepted / st->drafted : 0.0);
        cJSON_AddNumberToObject(j, "mean_accepted_per_round",
                                st->rounds ? (double)st->accepted / st->rounds : 0.0);
        cJSON_AddNumberToObject(j, "draft_ms", st->draft_ms);
        cJSON_AddNumberToObject(j, "verify_ms", st->verify_ms);
        cJSON_AddNumberToObject(j, "cost_ratio", st->cost_ratio);
    }
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

/* Loads a model and a one-slot context; the caller destroys both. */
static int load_model(const char *dir, struct kern_backend *be, enum quantize_mode quant,
                      int max_seq_len, bool no_graphs, struct llama_model **model,
                      struct llama_ctx **ctx, char *err)
{
    int rc = llama_model_load_quantized(model, dir, be, quant, err);
    if (rc)
        return rc;
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = max_seq_len,
                                 .no_graphs = no_graphs};
    return llama_ctx_create(ctx, *model, &p, err);
}

/* --dump-logits: slot 0 emptied, then prompt + out[0..n_out-2] in one
 * forward call whose every row keeps its logits, written to path. */
static int dump_logits(struct llama_ctx *ctx, const int32_t *prompt, int n_prompt,
                       const int32_t *out, int n_out, const char *path, char *err)
{
    const int vocab = llama_model_config(llama_ctx_model(ctx))->vocab_size;
    const int n = n_prompt + n_out - 1;
    int32_t *seq = malloc((size_t)(n > 0 ? n : 1) * sizeof *seq);
    float *rows = malloc((size_t)(n > 0 ? n : 1) * (size_t)vocab * sizeof *rows);
    int rc = !seq || !rows ? error_set(err, ERR_NOMEM, "--dump-logits: out of memory") : 0;
    if (!rc && n_out > 0) {
        memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
        memcpy(seq + n_prompt, out, (size_t)(n_out - 1) * sizeof *seq);
        struct llama_seq_batch b = {.slot = 0, .tokens = seq, .n_tokens = n, .n_logits = n,
                                    .logits_out = rows};
        if (!(rc = llama_ctx_truncate(ctx, 0, 0, err)))
            rc = llama_forward(ctx, &b, 1, err);
    }
    FILE *f = rc ? NULL : fopen(path, "wb");
    if (!rc && !f)
        rc = error_set(err, ERR_IO, "--dump-logits: cannot create %s", path);
    if (f && n_out > 0 && fwrite(rows, sizeof *rows, (size_t)n * (size_t)vocab, f) != (size_t)n * (size_t)vocab)
        rc = error_set(err, ERR_IO, "--dump-logits: cannot write %s", path);
    if (f && fclose(f) != 0 && !rc)
        rc = error_set(err, ERR_IO, "--dump-logits: cannot write %s", path);
    free(seq);
    free(rows);
    return rc;
}

/* The draft must share the target's vocabulary and EOS ids, or its tokens
 * mean something else. */
static int check_pair(const struct model_config *t, const struct model_config *d, char *err)
{
    if (t->vocab_size != d->vocab_size)
        return error_set(err, ERR_MISMATCH, "draft vocab_size %d differs from the target's %d",
                         d->vocab_size, t->vocab_size);
    if (t->n_eos_token_ids != d->n_eos_token_ids ||
        memcmp(t->eos_token_ids, d->eos_token_ids, (size_t)t->n_eos_token_ids * sizeof(int)))
        return error_set(err, ERR_MISMATCH, "draft eos_token_id differs from the target's");
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;
    if (parse_args(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be = NULL, *draft_be = NULL;
    struct llama_model *target_model = NULL, *draft_model = NULL;
    struct llama_ctx *target_ctx = NULL, *draft_ctx = NULL;
    struct specdec_target *target = NULL;
    struct specdec_draft *draft = NULL;
    struct tokenizer *tk = NULL;
    int32_t *prompt = NULL, *out = NULL;
    char *text = NULL;
    int n_prompt = 0, n_out = 0, status = 1;
    struct gen_grammar gg = {0};

    int rc = sampling_params_validate(&o.sampling, err);
    if (!rc)
        rc = kern_backend_create(&be, o.backend, o.device ? o.device : "", o.threads, err);
    /* A draft on another GPU gets a backend of its own; otherwise both
     * models share one (and its stream). */
    if (!rc && o.draft_dir && o.draft_device)
        rc = kern_backend_create(&draft_be, o.backend, o.draft_device, o.threads, err);
    if (!rc)
        rc = load_model(o.model_dir, be, o.quantize, o.max_seq_len, o.no_graphs, &target_model,
                        &target_ctx, err);
    if (!rc && o.draft_dir) {
        struct model_config draft_cfg;
        rc = model_config_load(&draft_cfg, o.draft_dir, err);
        if (!rc)
            rc = check_pair(llama_model_config(target_model), &draft_cfg, err);
        if (!rc)
            rc = load_model(o.draft_dir, draft_be ? draft_be : be, o.draft_quantize, o.max_seq_len,
                            o.no_graphs, &draft_model, &draft_ctx, err);
        if (!rc && !(rc = specdec_draft_create(&draft, draft_ctx, err)))
            specdec_draft_prepare_argmax(draft); /* not fatal: see specdec.h */
    }
    if (!rc && !(rc = specdec_target_create(&target, target_ctx, err)))
        specdec_target_prepare_argmax(target);
    /* Sampling on the device: per token only ids cross the bus. "host"
     * keeps the reference path (logits downloaded), for comparison. */
    const int on_device = o.sampler ? !strcmp(o.sampler, "device")
                                    : !strcmp(be ? be->name : "cpu", "cuda");
    if (!rc && on_device)
        rc = specdec_target_use_device(target, true, err);
    if (!rc && on_device && draft)
        rc = specdec_draft_use_device(draft, true, err);
    /* The workers of the pipeline are warm when a request comes (llama.h:
     * llama_ctx_warm_up); so are the figures printed here. */
    if (!rc)
        rc = llama_ctx_warm_up(target_ctx, err);
    if (!rc && draft_ctx)
        rc = llama_ctx_warm_up(draft_ctx, err);
    if (rc)
        goto done;
    /* The tokenizer is optional with --ids: random test models may have none. */
    char tk_err[ERR_MSG_MAX];
    if (tokenizer_load(&tk, o.model_dir, tk_err) != 0) {
        tk = NULL;
        if (!o.ids) {
            rc = error_set(err, ERR_NOT_FOUND, "%s", tk_err);
            goto done;
        }
    }
    if ((rc = build_prompt(&o, tk, &prompt, &n_prompt, err)))
        goto done;
    out = malloc((size_t)o.max_tokens * sizeof *out);
    if (!out) {
        rc = error_set(err, ERR_NOMEM, "out of memory");
        goto done;
    }
    const struct model_config *cfg = llama_model_config(target_model);
    struct specdec_request req = {
        .prompt = prompt,
        .n_prompt = n_prompt,
        .max_tokens = o.max_tokens,
        .sampling = o.sampling,
        .mode = o.mode,
        .k_fixed = o.spec_k,
        .stop_ids = cfg->eos_token_ids,
        .n_stop_ids = cfg->n_eos_token_ids,
        .slot = 0,
    };
    struct ngram_params ngram;
    ngram_params_default(&ngram);
    if (!strcmp(o.drafter, "ngram"))
        req.ngram = &ngram;
    if ((o.grammar_file || o.schema_file) &&
        (rc = gen_grammar_open(&gg, &o, tk, cfg, &req, err)))
        goto done;
    struct specdec_stats stats;
    if ((rc = specdec_generate(draft, target, &req, out, &n_out, &stats, NULL, NULL, err)))
        goto done;
    if (o.dump_logits &&
        (rc = dump_logits(target_ctx, prompt, n_prompt, out, n_out, o.dump_logits, err)))
        goto done;
    size_t text_len = 0;
    if (tk && (rc = tokenizer_decode(tk, out, (size_t)n_out, 1, &text, &text_len, err)))
        goto done;
    if (o.json) {
        print_json(&o, out, n_out, text, &stats, on_device ? "device" : "host");
    } else {
        if (text)
            fwrite(text, 1, text_len, stdout);
        else
            for (int i = 0; i < n_out; i++)
                printf("%s%d", i ? "," : "", out[i]);
        printf("\n");
        double decode_tokens = stats.generated_tokens > 1 ? stats.generated_tokens - 1 : 0;
        fprintf(stderr, "[%d prompt tokens, %d generated, prefill %.1f ms, %.2f tokens/s",
                stats.prompt_tokens, stats.generated_tokens, stats.prefill_ms,
                stats.decode_ms > 0 ? decode_tokens * 1000.0 / stats.decode_ms : 0.0);
        if (strcmp(o.drafter, "none") != 0)
            fprintf(stderr, ", acceptance %.3f, %.2f accepted/round",
                    stats.drafted ? (double)stats.accepted / stats.drafted : 0.0,
                    stats.rounds ? (double)stats.accepted / stats.rounds : 0.0);
        fprintf(stderr, "]\n");
    }
    status = 0;
done:
    if (rc)
        fprintf(stderr, "tandem-generate: %s\n", err[0] ? err : error_str(rc));
    free(text);
    free(out);
    free(prompt);
    gen_grammar_close(&gg);
    tokenizer_destroy(tk);
    specdec_target_destroy(target);
    specdec_draft_destroy(draft);
    llama_ctx_destroy(draft_ctx);
    llama_ctx_destroy(target_ctx);
    llama_model_destroy(draft_model);
    llama_model_destroy(target_model);
    kern_backend_destroy(draft_be);
    kern_backend_destroy(be);
    return status;
}
