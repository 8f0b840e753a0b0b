/* tandem-bench: figures for the runtime and for speculative decoding.
 *
 *   tandem-bench runtime [--models DIR] [--threads N] [--tokens N] [--presets a,b]
 *       memory bandwidth (large memcpy), then target-only decode tokens/s per
 *       preset and the weight bytes read per second as a share of bandwidth.
 *   tandem-bench spec [--models DIR] [--threads N] [--tokens N] [--noise a,b,c] [--ks LIST]
 *       [--modes 0|1]
 *       on the small pair (derived draft at several noise levels): tokens/s
 *       target-only vs speculative for K = 1..8 and adaptive, speedup,
 *       acceptance, measured c and Leviathan's predicted speedup; then the
 *       acceptance of the sampled and point-mass draft modes at T = 0.7, 1.0.
 *
 * Models are generated (deterministically) into --models (default
 * ./bench-models) when missing. Everything is measured side by side in one
 * run: this machine is noisy, so compare ratios, not absolute figures.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "error.h"
#include "llama.h"
#include "modelgen.h"
#include "specdec.h"

struct bench_opts {
    const char *models_dir;
    int threads, tokens;
    char presets[256];
    char noise[128];
    char ks[64]; /* K values to run; 0 = adaptive */
    int modes;   /* also compare the sampled and point-mass draft modes */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int die(const char *what, const char *err)
{
    fprintf(stderr, "tandem-bench: %s: %s\n", what, err);
    return 1;
}

/* Large-copy bandwidth, best of several runs: bytes read + bytes written. */
static double memcpy_gbps(void)
{
    const size_t size = (size_t)1 << 30;
    char *a = malloc(size), *b = malloc(size);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, size);
    memset(b, 2, size);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        memcpy(b, a, size);
        double t = now_s() - t0;
        best = t < best ? t : best;
        a[r] = b[size - 1 - r]; /* keep the copy observable */
    }
    free(a);
    free(b);
    return 2.0 * (double)size / best / 1e9;
}

static int ensure_model(const char *dir, const char *preset, uint64_t seed, const char *from_dir,
                        double noise)
{
    char cfg[600];
    struct stat st;
    snprintf(cfg, sizeof cfg, "%s/model.safetensors", dir);
    if (stat(cfg, &st) == 0)
        return 0;
    fprintf(stderr, "tandem-bench: generating %s (%s)...\n", dir, preset);
    char err[ERR_MSG_MAX] = "";
    struct modelgen_params p = {.preset = preset, .seed = seed, .force = 1};
    int rc = from_dir ? modelgen_derive(dir, from_dir, &p, noise, err) : modelgen_write(dir, &p, err);
    if (rc)
        return die(preset, err);
    return 0;
}

struct bench_model {
    struct llama_model *model;
    struct llama_ctx *ctx;
};

static int load(struct bench_model *m, const char *dir, struct kern_backend *be)
{
    char err[ERR_MSG_MAX] = "";
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = 1024};
    if (llama_model_load(&m->model, dir, be, err) || llama_ctx_create(&m->ctx, m->model, &p, err))
        return die(dir, err);
    return 0;
}

static void unload(struct bench_model *m)
{
    llama_ctx_destroy(m->ctx);
    llama_model_destroy(m->model);
    memset(m, 0, sizeof *m);
}

/* Runs one request per prompt; returns decode tokens/s over all of them. */
static int run_requests(struct specdec_draft *d, struct specdec_target *t, int n_prompts,
                        int max_tokens, int k, const struct sampling_params *sp,
                        enum speculate_mode mode, struct specdec_stats *sum, double *tps)
{
    char err[ERR_MSG_MAX] = "";
    int32_t *out = malloc((size_t)max_tokens * sizeof(int32_t));
    if (!out)
        return die("bench", "out of memory");
    memset(sum, 0, sizeof *sum);
    /* one history per run: like a server, later requests start from what
     * earlier ones measured about the pair */
    struct adaptive_k history;
    adaptive_k_init(&history, k, 8);
    double decode_ms = 0;
    long decode_tokens = 0;
    for (int i = 0; i < n_prompts; i++) {
        int32_t prompt[16];
        for (int j = 0; j < 16; j++)
            prompt[j] = (int32_t)((1000 + 7919 * (i * 16 + j)) % 120000);
        struct specdec_request req = {.prompt = prompt, .n_prompt = 16, .max_tokens = max_tokens,
                                      .sampling = *sp, .mode = mode, .k_fixed = k, .slot = 0,
                                      .k_history = &history};
        req.sampling.seed = (uint64_t)(i + 1);
        struct specdec_stats st;
        int n;
        if (specdec_generate(d, t, &req, out, &n, &st, NULL, NULL, err)) {
            free(out);
            return die("generate", err);
        }
        decode_ms += st.decode_ms;
        decode_tokens += st.generated_tokens - 1;
        sum->rounds += st.rounds;
        sum->drafted += st.drafted;
        sum->accepted += st.accepted;
        sum->draft_ms += st.draft_ms;
        sum->verify_ms += st.verify_ms;
        for (int j = 0; j < SPECULATE_K_MAX; j++)
            sum->accepted_at[j] += st.accepted_at[j];
    }
    free(out);
    *tps = decode_ms > 0 ? decode_tokens * 1000.0 / decode_ms : 0;
    return 0;
}

static int bench_runtime(const struct bench_opts *o, struct kern_backend *be)
{
    double bw = memcpy_gbps();
    printf("memory bandwidth (1 GiB memcpy, read+write): %.2f GB/s\n", bw);
    printf("%-14s %12s %12s %10s %12s %10s\n", "preset", "weights MB", "tokens/s", "ms/token",
           "weight GB/s", "% of bw");
    char list[256];
    snprintf(list, sizeof list, "%s", o->presets);
    for (char *save = NULL, *preset = strtok_r(list, ",", &save); preset;
         preset = strtok_r(NULL, ",", &save)) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", o->models_dir, preset);
        if (ensure_model(dir, preset, 1, NULL, 0))
            return 1;
        struct bench_model m;
        if (load(&m, dir, be))
            return 1;
        struct specdec_target *t;
        char err[ERR_MSG_MAX] = "";
        if (specdec_target_create(&t, m.ctx, err))
            return die("target", err);
        struct sampling_params sp;
        sampling_params_default(&sp);
        struct specdec_stats st;
        double tps;
        if (run_requests(NULL, t, 2, o->tokens, 0, &sp, SPECULATE_MODE_SAMPLED, &st, &tps))
            return 1;
        double bytes = (double)llama_model_weight_bytes_per_token(m.model);
        double gbps = bytes * tps / 1e9;
        printf("%-14s %12.1f %12.2f %10.2f %12.2f %9.1f%%\n", preset, bytes / 1e6, tps,
               1000.0 / tps, gbps, 100.0 * gbps / bw);
        specdec_target_destroy(t);
        unload(&m);
    }
    return 0;
}

/* Leviathan's per-token acceptance a from fixed-K rounds: accepted tokens
 * over accepted tokens plus rejections (rounds that stopped before K). */
static double alpha_of(const struct specdec_stats *s, int k)
{
    int rejections = s->rounds - (k > 0 ? s->accepted_at[k - 1] : 0);
    double denom = (double)s->accepted + rejections;
    return denom > 0 ? s->accepted / denom : 0;
}

static int bench_spec(const struct bench_opts *o, struct kern_backend *be)
{
    char draft_dir[512];
    snprintf(draft_dir, sizeof draft_dir, "%s/small-draft", o->models_dir);
    if (ensure_model(draft_dir, "small-draft", 1, NULL, 0))
        return 1;
    struct bench_model dm;
    if (load(&dm, draft_dir, be))
        return 1;
    char err[ERR_MSG_MAX] = "";
    struct specdec_draft *d;
    if (specdec_draft_create(&d, dm.ctx, err))
        return die("draft", err);
    struct sampling_params greedy;
    sampling_params_default(&greedy);
    const int n_prompts = 3;
    char list[128];
    snprintf(list, sizeof list, "%s", o->noise);
    for (char *save = NULL, *ns = strtok_r(list, ",", &save); ns; ns = strtok_r(NULL, ",", &save)) {
        double noise = atof(ns);
        char dir[512];
        snprintf(dir, sizeof dir, "%s/small-noise-%s", o->models_dir, ns);
        if (ensure_model(dir, "small", 2, draft_dir, noise))
            return 1;
        struct bench_model tm;
        if (load(&tm, dir, be))
            return 1;
        struct specdec_target *t;
        if (specdec_target_create(&t, tm.ctx, err))
            return die("target", err);
        struct specdec_stats base_st;
        double base_tps;
        if (run_requests(NULL, t, n_prompts, o->tokens, 0, &greedy, SPECULATE_MODE_SAMPLED,
                         &base_st, &base_tps))
            return 1;
        double target_ms = base_st.verify_ms / (base_st.rounds ? base_st.rounds : 1);
        printf("\nsmall pair, draft noise %s, greedy, %d prompts x %d tokens: target-only %.2f tokens/s "
               "(%.2f ms/token)\n",
               ns, n_prompts, o->tokens, base_tps, target_ms);
        printf("%-9s %10s %8s %11s %8s %8s %10s %12s\n", "K", "tokens/s", "speedup", "acceptance",
               "alpha", "c", "acc/round", "predicted");
        char klist[64];
        snprintf(klist, sizeof klist, "%s", o->ks);
        for (char *ksave = NULL, *kstr = strtok_r(klist, ",", &ksave); kstr;
             kstr = strtok_r(NULL, ",", &ksave)) {
            int kk = atoi(kstr);
            if (kk < 0 || kk > SPECULATE_K_MAX)
                continue;
            struct specdec_stats st;
            double tps;
            if (run_requests(d, t, n_prompts, o->tokens, kk, &greedy, SPECULATE_MODE_SAMPLED, &st,
                             &tps))
                return 1;
            double acc = st.drafted ? (double)st.accepted / st.drafted : 0;
            double c = st.drafted ? (st.draft_ms / st.drafted) / target_ms : 0;
            double alpha = kk ? alpha_of(&st, kk) : acc;
            char predicted[32] = "-";
            if (kk)
                snprintf(predicted, sizeof predicted, "%.2fx",
                         speculate_expected_speedup(alpha, kk, c));
            printf("%-9s %10.2f %7.2fx %11.3f %8.3f %8.3f %10.2f %12s\n",
                   kk ? (char[8]){(char)('0' + kk), 0} : "adaptive", tps, tps / base_tps, acc,
                   alpha, c, st.rounds ? (double)st.accepted / st.rounds : 0, predicted);
        }
        /* draft modes: acceptance at T = 0.7 and 1.0 with K = 4 */
        for (int ti = 0; ti < 2 * o->modes; ti++) {
            struct sampling_params sp = greedy;
            sp.temperature = ti ? 1.0f : 0.7f;
            for (int mode = 0; mode < 2; mode++) {
                struct specdec_stats st;
                double tps;
                if (run_requests(d, t, n_prompts, o->tokens, 4, &sp, (enum speculate_mode)mode, &st,
                                 &tps))
                    return 1;
                printf("  T=%.1f K=4 %-10s acceptance %.3f, %.2f accepted/round, %.2f tokens/s\n",
                       sp.temperature, mode ? "point-mass" : "sampled",
                       st.drafted ? (double)st.accepted / st.drafted : 0,
                       st.rounds ? (double)st.accepted / st.rounds : 0, tps);
            }
        }
        specdec_target_destroy(t);
        unload(&tm);
    }
    specdec_draft_destroy(d);
    unload(&dm);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "runtime") && strcmp(argv[1], "spec"))) {
        fprintf(stderr, "usage: tandem-bench runtime|spec [--models DIR] [--threads N] [--tokens N]\n"
                        "                    [--presets small,llama-3.2-1b] [--noise 0.02,0.05,0.2]\n"
                        "                    [--ks 1,2,3,4,5,6,7,8,0 (0 = adaptive)] [--modes 0|1]\n");
        return 2;
    }
    struct bench_opts o = {.models_dir = "bench-models", .threads = 0, .tokens = 64};
    snprintf(o.presets, sizeof o.presets, "small,llama-3.2-1b");
    snprintf(o.noise, sizeof o.noise, "0.02,0.05,0.2");
    snprintf(o.ks, sizeof o.ks, "1,2,3,4,5,6,7,8,0");
    o.modes = 1;
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem-bench: %s: missing value\n", argv[i]);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--models")) o.models_dir = v;
        else if (!strcmp(argv[i - 1], "--threads")) o.threads = atoi(v);
        else if (!strcmp(argv[i - 1], "--tokens")) o.tokens = atoi(v);
        else if (!strcmp(argv[i - 1], "--presets")) snprintf(o.presets, sizeof o.presets, "%s", v);
        else if (!strcmp(argv[i - 1], "--noise")) snprintf(o.noise, sizeof o.noise, "%s", v);
        else if (!strcmp(argv[i - 1], "--ks")) snprintf(o.ks, sizeof o.ks, "%s", v);
        else if (!strcmp(argv[i - 1], "--modes")) o.modes = atoi(v) != 0;
        else {
            fprintf(stderr, "tandem-bench: unknown flag %s\n", argv[i - 1]);
            return 2;
        }
    }
    if (o.tokens < 2) {
        fprintf(stderr, "tandem-bench: --tokens: must be >= 2\n");
        return 2;
    }
    if (mkdir(o.models_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "tandem-bench: %s: %s\n", o.models_dir, strerror(errno));
        return 1;
    }
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be;
    if (kern_cpu_create(&be, o.threads, err))
        return die("cpu backend", err);
    printf("cpu backend: %d threads\n", kern_cpu_threads(be));
    int rc = !strcmp(argv[1], "runtime") ? bench_runtime(&o, be) : bench_spec(&o, be);
    be->ops->destroy(be);
    return rc;
}
