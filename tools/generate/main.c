/* tandem-generate: single-process generation, target-only or speculative,
 * through the server's own scheduler and worker roles (coordinator/local.h,
 * docs/one-core.md): the rounds, K and draft sources are the server's.
 *
 *   tandem-generate --model DIR (--prompt TEXT | --chat TEXT | --ids 1,2,3)
 *       [--draft DIR] [--drafter model|ngram|suffix|auto|none] [--spec-k N] [--spec-mode sampled|point_mass]
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
#include "llama.h"
#include "local.h"
#include "local_generate.h"
#include "logging.h"
#include "request.h"
#include "specdec.h"
#include "tokenizer.h"

struct options {
    const char *model_dir, *draft_dir, *prompt, *chat, *ids;
    const char *backend, *device, *draft_device; /* draft_device NULL: the target's backend */
    const char *sampler; /* "host", "device" or NULL: device on cuda, host on cpu */
    const char *drafter; /* a request's "draft" (docs/protocol.md) or NULL: model with --draft, else none */
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
            "         [--draft DIR] [--drafter model|ngram|suffix|auto|none] [--spec-k N (0 = adaptive)]\n"
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

/* --grammar-file or --json-schema as the request's "grammar" (docs/protocol.md):
 * the pipeline compiles it where the server does, over the model
 * directories' tokenizers. */
static int add_grammar(cJSON *req, const struct options *o, char *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = read_file(o->grammar_file ? o->grammar_file : o->schema_file, &text, &len, err);
    if (rc)
        return rc;
    cJSON *g = cJSON_AddObjectToObject(req, "grammar");
    cJSON *schema = o->schema_file ? cJSON_ParseWithLength(text, len) : NULL;
    if (o->schema_file && !schema)
        rc = error_set(err, ERR_FORMAT, "--json-schema %s: not JSON", o->schema_file);
    else if (!g || !cJSON_AddStringToObject(g, "type", o->schema_file ? "json_schema" : "gbnf") ||
             !(schema ? cJSON_AddItemToObject(g, "schema", schema) : cJSON_AddStringToObject(g, "text", text) != NULL))
        rc = error_set(err, ERR_NOMEM, "out of memory");
    else
        schema = NULL; /* the request owns it */
    cJSON_Delete(schema);
    free(text);
    return rc;
}

/* The generate request of o over prompt (docs/protocol.md), as a client of
 * the server would send it; *out malloc'd. The seed always travels: the
 * same seed and K give the same draws as through the server. */
static int request_text(const struct options *o, const int32_t *prompt, int n_prompt, int max_tokens, char **out,
                        char *err)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *ids = r ? cJSON_AddArrayToObject(r, "prompt_ids") : NULL;
    for (int i = 0; ids && i < n_prompt; i++)
        if (!cJSON_AddItemToArray(ids, cJSON_CreateNumber(prompt[i])))
            ids = NULL;
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->sampling.seed);
    const bool ok = ids && cJSON_AddNumberToObject(r, "v", 1) && cJSON_AddStringToObject(r, "type", "generate") &&
                    cJSON_AddNumberToObject(r, "max_tokens", max_tokens) &&
                    cJSON_AddNumberToObject(r, "temperature", o->sampling.temperature) &&
                    cJSON_AddNumberToObject(r, "top_k", o->sampling.top_k) &&
                    cJSON_AddNumberToObject(r, "top_p", o->sampling.top_p) &&
                    cJSON_AddNumberToObject(r, "min_p", o->sampling.min_p) && cJSON_AddStringToObject(r, "seed", seed) &&
                    cJSON_AddNumberToObject(r, "spec_k", o->spec_k) &&
                    cJSON_AddStringToObject(r, "spec_mode", o->mode == SPECULATE_MODE_POINT_MASS ? "point_mass" : "sampled") &&
                    cJSON_AddStringToObject(r, "draft", o->drafter);
    int rc = ok ? 0 : error_set(err, ERR_NOMEM, "out of memory");
    if (!rc && (o->grammar_file || o->schema_file))
        rc = add_grammar(r, o, err);
    if (!rc && !(*out = cJSON_PrintUnformatted(r)))
        rc = error_set(err, ERR_NOMEM, "out of memory");
    cJSON_Delete(r);
    return rc;
}

/* The option a flag that takes text as it is sets, or NULL. */
static const char **text_option(struct options *o, const char *flag)
{
    if (!strcmp(flag, "--model")) return &o->model_dir;
    if (!strcmp(flag, "--dump-logits")) return &o->dump_logits;
    if (!strcmp(flag, "--grammar-file")) return &o->grammar_file;
    if (!strcmp(flag, "--json-schema")) return &o->schema_file;
    if (!strcmp(flag, "--draft")) return &o->draft_dir;
    if (!strcmp(flag, "--prompt")) return &o->prompt;
    if (!strcmp(flag, "--chat")) return &o->chat;
    if (!strcmp(flag, "--ids")) return &o->ids;
    if (!strcmp(flag, "--backend")) return &o->backend;
    if (!strcmp(flag, "--device")) return &o->device;
    if (!strcmp(flag, "--draft-device")) return &o->draft_device;
    return NULL;
}

/* The flags that name one of a few choices. 1: flag a was one and v is
 * taken, 0: a is not one of them, -1: v is not a choice (said on stderr). */
static int parse_choice(struct options *o, const char *a, const char *v)
{
    char err[ERR_MSG_MAX];
    if (!strcmp(a, "--drafter")) {
        enum request_draft d;
        if (request_draft_parse(v, "--drafter", &d, err) || d == REQUEST_DRAFT_DEFAULT) {
            fprintf(stderr, "tandem-generate: --drafter: expected model, ngram, suffix, auto or none, "
                            "got \"%s\"\n", v);
            return -1;
        }
        o->drafter = v;
    } else if (!strcmp(a, "--quantize") || !strcmp(a, "--draft-quantize")) {
        if (quantize_mode_parse(v, !strcmp(a, "--quantize") ? &o->quantize : &o->draft_quantize, err)) {
            fprintf(stderr, "tandem-generate: %s: %s\n", a, err);
            return -1;
        }
    } else if (!strcmp(a, "--sampler")) {
        if (strcmp(v, "host") && strcmp(v, "device")) {
            fprintf(stderr, "tandem-generate: --sampler: expected host or device, got \"%s\"\n", v);
            return -1;
        }
        o->sampler = v;
    } else if (!strcmp(a, "--spec-mode")) {
        if (!strcmp(v, "sampled")) o->mode = SPECULATE_MODE_SAMPLED;
        else if (!strcmp(v, "point_mass")) o->mode = SPECULATE_MODE_POINT_MASS;
        else {
            fprintf(stderr, "tandem-generate: --spec-mode: expected sampled or point_mass, got \"%s\"\n", v);
            return -1;
        }
    } else {
        return 0;
    }
    return 1;
}

static int parse_seed(const char *v, uint64_t *seed)
{
    char *end;
    errno = 0;
    unsigned long long s = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-') {
        fprintf(stderr, "tandem-generate: --seed: expected an unsigned integer, got \"%s\"\n", v);
        return -1;
    }
    *seed = (uint64_t)s;
    return 0;
}

/* The flags that take a number, as parse_choice: 1 taken, 0 not one of
 * them, -1 v out of range or not a number. */
static int parse_number(struct options *o, const char *a, const char *v)
{
    struct sampling_params *sp = &o->sampling;
    long n;
    int rc = 0;
    if (!strcmp(a, "--max-tokens")) {
        if (!(rc = parse_long(a, v, 1, 1 << 20, &n))) o->max_tokens = (int)n;
    } else if (!strcmp(a, "--spec-k")) {
        if (!(rc = parse_long(a, v, 0, SPECULATE_K_MAX, &n))) o->spec_k = (int)n;
    } else if (!strcmp(a, "--threads")) {
        if (!(rc = parse_long(a, v, 0, 1024, &n))) o->threads = (int)n;
    } else if (!strcmp(a, "--max-seq-len")) {
        if (!(rc = parse_long(a, v, 0, 1 << 24, &n))) o->max_seq_len = (int)n;
    } else if (!strcmp(a, "--seed")) {
        rc = parse_seed(v, &sp->seed);
    } else if (!strcmp(a, "--temperature")) {
        rc = parse_float(a, v, &sp->temperature);
    } else if (!strcmp(a, "--top-k")) {
        if (!(rc = parse_long(a, v, -1000000, 1000000000, &n))) sp->top_k = (int)n;
    } else if (!strcmp(a, "--top-p")) {
        rc = parse_float(a, v, &sp->top_p);
    } else if (!strcmp(a, "--min-p")) {
        rc = parse_float(a, v, &sp->min_p);
    } else {
        return 0;
    }
    return rc ? -1 : 1;
}

/* What the flags must say together; fills in the default drafter. */
static int check_options(struct options *o)
{
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
    /* auto drafts with the model where it pays, so it may have one */
    const bool auto_src = !strcmp(o->drafter, "auto");
    if ((!strcmp(o->drafter, "model") && !o->draft_dir) || (o->draft_dir && strcmp(o->drafter, "model") && !auto_src)) {
        fprintf(stderr, "tandem-generate: --drafter %s: %s\n", o->drafter,
                o->draft_dir ? "--draft is for --drafter model or auto" : "needs --draft DIR");
        return -1;
    }
    return 0;
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
        const char **text = text_option(o, a);
        if (text) {
            *text = v;
            continue;
        }
        int taken = parse_choice(o, a, v);
        if (taken == 0)
            taken = parse_number(o, a, v);
        if (taken < 0)
            return -1;
        if (taken == 0) {
            fprintf(stderr, "tandem-generate: unknown flag %s\n", a);
            return -1;
        }
    }
    return check_options(o);
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
                       const struct local_stats *st, const char *sampler)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "ids");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON_AddStringToObject(j, "text", text ? text : "");
    cJSON_AddNumberToObject(j, "prompt_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(j, "generated_tokens", st->generated_tokens);
    cJSON_AddStringToObject(j, "finish_reason", st->finish_reason);
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

/* The models, loaded on their backends and warm, as the pipeline borrows them. */
struct gen_models {
    struct kern_backend *be, *draft_be; /* draft_be NULL: the draft shares be */
    struct llama_model *target_model, *draft_model;
    struct llama_ctx *target_ctx, *draft_ctx;
};

/* Loads the target's model (draft false) or the draft's, on its backend,
 * and a one-slot context; models_free destroys both. */
static int load_model(struct gen_models *g, const struct options *o, bool draft, char *err)
{
    struct kern_backend *be = draft && g->draft_be ? g->draft_be : g->be;
    struct llama_model **model = draft ? &g->draft_model : &g->target_model;
    int rc = llama_model_load_quantized(model, draft ? o->draft_dir : o->model_dir, be,
                                        draft ? o->draft_quantize : o->quantize, err);
    if (rc)
        return rc;
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = o->max_seq_len,
                                 .no_graphs = o->no_graphs};
    return llama_ctx_create(draft ? &g->draft_ctx : &g->target_ctx, *model, &p, err);
}

static int models_load(struct gen_models *g, const struct options *o, char *err)
{
    int rc = kern_backend_create(&g->be, o->backend, o->device ? o->device : "", o->threads, err);
    /* A draft on another GPU gets a backend of its own; otherwise both
     * models share one (and its stream). */
    if (!rc && o->draft_dir && o->draft_device)
        rc = kern_backend_create(&g->draft_be, o->backend, o->draft_device, o->threads, err);
    if (!rc)
        rc = load_model(g, o, false, err);
    if (!rc && o->draft_dir) {
        struct model_config draft_cfg;
        rc = model_config_load(&draft_cfg, o->draft_dir, err);
        if (!rc)
            rc = check_pair(llama_model_config(g->target_model), &draft_cfg, err);
        if (!rc)
            rc = load_model(g, o, true, err);
    }
    /* The workers of the pipeline are warm when a request comes (llama.h:
     * llama_ctx_warm_up); so are the figures printed here. */
    if (!rc)
        rc = llama_ctx_warm_up(g->target_ctx, err);
    if (!rc && g->draft_ctx)
        rc = llama_ctx_warm_up(g->draft_ctx, err);
    return rc;
}

static void models_free(struct gen_models *g)
{
    llama_ctx_destroy(g->draft_ctx);
    llama_ctx_destroy(g->target_ctx);
    llama_model_destroy(g->draft_model);
    llama_model_destroy(g->target_model);
    kern_backend_destroy(g->draft_be);
    kern_backend_destroy(g->be);
}

/* What the pipeline's replies said of the request. */
struct gen_result {
    int32_t *ids; /* capacity max_tokens */
    int n_ids, max_ids;
    struct local_stats st;
    char error[ERR_MSG_MAX]; /* an error reply's message; "" for none */
};

/* local_reply_fn: the done reply's ids and figures, or an error's message. */
static int on_reply(void *user, const cJSON *reply)
{
    struct gen_result *r = user;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "type"));
    if (type && !strcmp(type, "error")) {
        const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "message"));
        snprintf(r->error, sizeof r->error, "%s", m ? m : "the pipeline failed the request");
    }
    if (!type || strcmp(type, "done"))
        return 0;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(reply, "ids");
    for (const cJSON *id = ids ? ids->child : NULL; id && r->n_ids < r->max_ids; id = id->next)
        r->ids[r->n_ids++] = (int32_t)cJSON_GetNumberValue(id);
    local_stats_from_done(reply, &r->st);
    return 0;
}

/* --dump-logits: slot 0 emptied, then prompt + r's ids but the last in one
 * forward call whose every row keeps its logits, written to path. */
static int dump_logits(struct llama_ctx *ctx, const int32_t *prompt, int n_prompt,
                       const struct gen_result *r, const char *path, char *err)
{
    const int32_t *out = r->ids;
    const int n_out = r->n_ids;
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

/* The settings the three processes of a server would read, for this run. */
static void pipeline_config(struct proc_config *cfg, const struct options *o, const char *sampler)
{
    proc_config_defaults(cfg);
    cfg->coordinator.max_concurrency = 1;
    cfg->coordinator.max_queue = 1;
    if (o->spec_k > cfg->coordinator.spec_k_max)
        cfg->coordinator.spec_k_max = o->spec_k;
    snprintf(cfg->coordinator.tokenizer, sizeof cfg->coordinator.tokenizer, "%s", o->model_dir);
    snprintf(cfg->target_worker.model, sizeof cfg->target_worker.model, "%s", o->model_dir);
    if (o->draft_dir)
        snprintf(cfg->draft_worker.model, sizeof cfg->draft_worker.model, "%s", o->draft_dir);
    snprintf(cfg->target_worker.sampler, sizeof cfg->target_worker.sampler, "%s", sampler);
    snprintf(cfg->draft_worker.sampler, sizeof cfg->draft_worker.sampler, "%s", sampler);
}

/* Runs the request through the coordinator's scheduler and both roles in
 * this process (local.h): the policy the server runs. */
static int run_pipeline(const struct options *o, struct gen_models *g, const char *sampler, const char *request,
                        struct gen_result *r, char *err)
{
    struct proc_config cfg;
    pipeline_config(&cfg, o, sampler);
    struct worker_main_model tm, dm;
    worker_main_model_borrow(&tm, g->be, g->target_model, g->target_ctx);
    if (g->draft_ctx)
        worker_main_model_borrow(&dm, g->draft_be ? g->draft_be : g->be, g->draft_model, g->draft_ctx);
    const struct local_params p = {.cfg = &cfg, .target = &tm, .draft = g->draft_ctx ? &dm : NULL};
    struct local *l = NULL;
    /* what the roles and the scheduler log is a server operator's; the
     * person at this command reads the summary (warnings still show) */
    logging_set_level(LOGGING_WARN);
    int rc = local_create(&l, &p, err);
    if (!rc)
        rc = local_run(l, request, on_reply, r, err);
    if (!rc)
        r->st.cost_ratio = local_cost_ratio(l);
    local_destroy(l);
    logging_set_level(LOGGING_INFO);
    if (!rc && r->error[0])
        rc = error_set(err, ERR_INVALID_ARG, "%s", r->error);
    return rc;
}

static void print_text(const struct options *o, const int32_t *out, int n_out, const char *text, size_t text_len,
                       const struct local_stats *st)
{
    if (text)
        fwrite(text, 1, text_len, stdout);
    else
        for (int i = 0; i < n_out; i++)
            printf("%s%d", i ? "," : "", out[i]);
    printf("\n");
    double decode_tokens = st->generated_tokens > 1 ? st->generated_tokens - 1 : 0;
    fprintf(stderr, "[%d prompt tokens, %d generated, prefill %.1f ms, %.2f tokens/s", st->prompt_tokens,
            st->generated_tokens, st->prefill_ms, st->decode_ms > 0 ? decode_tokens * 1000.0 / st->decode_ms : 0.0);
    if (strcmp(o->drafter, "none") != 0)
        fprintf(stderr, ", acceptance %.3f, %.2f accepted/round",
                st->drafted ? (double)st->accepted / st->drafted : 0.0,
                st->rounds ? (double)st->accepted / st->rounds : 0.0);
    fprintf(stderr, "]\n");
}

/* Generates for o on the loaded models and prints the outcome. */
static int generate(const struct options *o, struct gen_models *g, const struct tokenizer *tk, char *err)
{
    int32_t *prompt = NULL;
    char *request = NULL, *text = NULL;
    size_t text_len = 0;
    int n_prompt = 0;
    struct gen_result r = {.max_ids = o->max_tokens};
    /* Sampling on the device: per token only ids cross the bus. "host"
     * keeps the reference path (logits downloaded), for comparison. */
    const char *sampler = o->sampler ? o->sampler : !strcmp(g->be->name, "cuda") ? "device" : "host";
    int rc = build_prompt(o, tk, &prompt, &n_prompt, err);
    if (!rc && !(r.ids = malloc((size_t)o->max_tokens * sizeof *r.ids)))
        rc = error_set(err, ERR_NOMEM, "out of memory");
    /* The server refuses more than a context of max_tokens; this command
     * has always run to the end of the context instead, as the server then
     * does (finish "length"). */
    const int context = llama_ctx_max_seq_len(g->target_ctx);
    if (!rc)
        rc = request_text(o, prompt, n_prompt, o->max_tokens < context ? o->max_tokens : context, &request, err);
    if (!rc)
        rc = run_pipeline(o, g, sampler, request, &r, err);
    if (!rc && o->dump_logits)
        rc = dump_logits(g->target_ctx, prompt, n_prompt, &r, o->dump_logits, err);
    if (!rc && tk)
        rc = tokenizer_decode(tk, r.ids, (size_t)r.n_ids, 1, &text, &text_len, err);
    if (!rc && o->json)
        print_json(o, r.ids, r.n_ids, text, &r.st, sampler);
    else if (!rc)
        print_text(o, r.ids, r.n_ids, text, text_len, &r.st);
    free(text);
    free(request);
    free(r.ids);
    free(prompt);
    return rc;
}

int main(int argc, char **argv)
{
    struct options o;
    if (parse_args(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    char err[ERR_MSG_MAX] = "";
    struct gen_models g = {0};
    struct tokenizer *tk = NULL;
    int rc = sampling_params_validate(&o.sampling, err);
    if (!rc)
        rc = models_load(&g, &o, err);
    /* The tokenizer is optional with --ids: random test models may have none. */
    char tk_err[ERR_MSG_MAX];
    if (!rc && tokenizer_load(&tk, o.model_dir, tk_err) != 0) {
        tk = NULL;
        if (!o.ids)
            rc = error_set(err, ERR_NOT_FOUND, "%s", tk_err);
    }
    if (!rc)
        rc = generate(&o, &g, tk, err);
    if (rc)
        fprintf(stderr, "tandem-generate: %s\n", err[0] ? err : error_str(rc));
    tokenizer_destroy(tk);
    models_free(&g);
    return rc ? 1 : 0;
}
