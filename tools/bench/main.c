/* tandem-bench: figures for the runtime and for speculative decoding.
 *
 *   tandem-bench runtime [--models DIR] [--threads N] [--tokens N] [--presets a,b]
 *       [--profile 0|1] [--prefix N] [--backend cpu|cuda] [--device D] [--quantize none|int8|int4]
 *       this machine's read bandwidth (read_bw.h; a memcpy figure beside it,
 *       labelled, for reference), then target-only decode tokens/s per preset
 *       and the weight bytes read per second as a share of read bandwidth: a
 *       decode step reads its weights and writes almost nothing, so the read
 *       figure is its ceiling (measured again after each preset; the higher
 *       of the figures around a decode is its reference), and the same share
 *       taken side by side: turns of a read right before one short request,
 *       the median share, against a fresh buffer's read and against a read
 *       of the model's own weight copies (kern_cpu_weight_copies). --profile 1 adds
 *       a second, profiled run per preset: time per op kind and per matmul
 *       shape, per token. Then the cost of verifying rows = 2, 3, 5, 9, 17
 *       in one forward call relative to one row, each measured beside a
 *       one-row call, after a prefix of --prefix tokens (64; the rows
 *       attend to it, so a longer one shows what attention adds).
 *       --backend cuda: the GPU's read bandwidth (kern_cuda_read_bandwidth:
 *       a kernel reading a buffer of several GB), then per preset decode
 *       ms/token with device sampling and with host sampling, each against
 *       the floor (weight bytes / read bandwidth); the cost of verifying
 *       rows = 2..17 in one forward call relative to one row; prefill
 *       tokens/s of a 512-token prompt; each figure with graphs and with
 *       every kernel launched one by one (runtime_cuda.c); decode at
 *       positions 512 and 8000. Where no GPU can be used it prints
 *       one line, "no GPU: <reason>", and exits 77 (the skip code of the
 *       test suite).
 *   tandem-bench spec [--models DIR] [--threads N] [--tokens N] [--noise a,b,c] [--ks LIST]
 *       [--modes 0|1] [--pair small|1b|3b] [--repeats N] [--full-head 0|1] [--prompt N]
 *       on the small pair, or (--pair 1b) a Llama-1B-shaped target over a
 *       2-layer draft of its width, or (--pair 3b, for a GPU) the Llama-3B
 *       shape over llama-3.2-3b-draft (targets derived from the draft at
 *       several noise levels): tokens/s target-only vs speculative for
 *       K = 1..8 and adaptive, speedup, acceptance, measured c and
 *       Leviathan's predicted speedup, and each draft position's acceptance
 *       given the ones before it; with --repeats N, target-only and
 *       every K run in turn N times, each speed-up the median of its turns'
 *       ratios to the target-only run of the same turn; with --full-head 1
 *       every K also runs with the draft and the target reading their whole
 *       LM heads instead of the argmax screen's one-byte copies ("full"),
 *       against a target-only run that does too. Then the acceptance
 *       of the sampled and point-mass draft modes at T = 0.7, 1.0. Each
 *       request's prompt is --prompt tokens (16): a long one shows what the
 *       context costs a verification's rows against one decode step.
 *
 *       --pair trained: the pair trained by tools/train (--trained DIR,
 *       default models/trained: DIR/target, DIR/draft), on six chat
 *       questions of the kinds it was trained on, one pass (no noise).
 *   tandem-bench ppl --model DIR --text FILE [--context N]
 *       [--quantize none|int8|int4]
 *       the model's perplexity on the text (trained.c), as one JSON line.
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

#include "bench.h"
#include "error.h"
#include "llama.h"
#include "modelgen.h"
#include "prof.h"
#include "read_bw.h"
#include "local_generate.h"
#include "logging.h"
#include "specdec.h"


double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int die(const char *what, const char *err)
{
    fprintf(stderr, "tandem-bench: %s: %s\n", what, err);
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (the mean of the middle two for even n). */
static double median(const double *v, int n)
{
    double s[16];
    if (n < 1 || n > 16)
        return 0;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* Smallest and largest of n >= 1 values. */
static void min_max(const double *v, int n, double *lo, double *hi)
{
    *lo = *hi = v[0];
    for (int i = 1; i < n; i++) {
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
}

static int ensure_model_layers(const char *dir, const char *preset, int layers, uint64_t seed,
                               const char *from_dir, double noise)
{
    char cfg[600];
    struct stat st;
    snprintf(cfg, sizeof cfg, "%s/model.safetensors", dir);
    if (stat(cfg, &st) == 0)
        return 0;
    fprintf(stderr, "tandem-bench: generating %s (%s)...\n", dir, preset);
    char err[ERR_MSG_MAX] = "";
    struct modelgen_params p = {
        .preset = preset, .seed = seed, .num_layers_override = layers, .force = 1};
    int rc = from_dir ? modelgen_derive(dir, from_dir, &p, noise, err) : modelgen_write(dir, &p, err);
    if (rc)
        return die(preset, err);
    return 0;
}

int ensure_model(const char *dir, const char *preset, uint64_t seed, const char *from_dir,
                        double noise)
{
    return ensure_model_layers(dir, preset, 0, seed, from_dir, noise);
}


/* The model at dir with one sequence of up to max_seq_len tokens, its
 * projections quantized as quant says. */
int load(struct bench_model *m, const char *dir, struct kern_backend *be, int max_seq_len,
                enum quantize_mode quant)
{
    char err[ERR_MSG_MAX] = "";
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = max_seq_len};
    if (llama_model_load_quantized(&m->model, dir, be, quant, err) ||
        llama_ctx_create(&m->ctx, m->model, &p, err))
        return die(dir, err);
    return 0;
}

void unload(struct bench_model *m)
{
    llama_ctx_destroy(m->ctx);
    llama_model_destroy(m->model);
    memset(m, 0, sizeof *m);
}

/* Adds one run's round counts and times to sum. */
static void stats_add(struct local_stats *sum, const struct local_stats *st)
{
    sum->rounds += st->rounds;
    sum->drafted += st->drafted;
    sum->accepted += st->accepted;
    sum->draft_ms += st->draft_ms;
    sum->verify_ms += st->verify_ms;
    for (int j = 0; j < SPECULATE_K_MAX; j++)
        sum->accepted_at[j] += st->accepted_at[j];
}

/* The server's scheduler and roles in this process over p's models
 * (coordinator/local.h): a fresh pair history, as a server just started. */
static int pipeline_create(struct local **out, const struct bench_pipeline *p, int k_max)
{
    char err[ERR_MSG_MAX] = "";
    struct proc_config cfg;
    proc_config_defaults(&cfg);
    cfg.coordinator.max_concurrency = 1;
    cfg.coordinator.max_queue = 1;
    if (k_max > cfg.coordinator.spec_k_max)
        cfg.coordinator.spec_k_max = k_max;
    struct worker_config *wc[2] = {&cfg.draft_worker, &cfg.target_worker};
    for (int r = 0; r < 2; r++) {
        snprintf(wc[r]->sampler, sizeof wc[r]->sampler, "%s", p->sampler);
        wc[r]->argmax_copy = !p->whole_heads;
    }
    struct worker_main_model tm, dm;
    worker_main_model_borrow(&tm, llama_ctx_backend(p->target->ctx), p->target->model, p->target->ctx);
    if (p->draft)
        worker_main_model_borrow(&dm, llama_ctx_backend(p->draft->ctx), p->draft->model, p->draft->ctx);
    const struct local_params lp = {.cfg = &cfg, .target = &tm, .draft = p->draft ? &dm : NULL};
    /* the roles' and the scheduler's logs are a server operator's; the
     * requests are ids, so the missing tokenizer it warns of is no loss */
    logging_set_level(LOGGING_ERROR);
    int rc = local_create(out, &lp, err);
    logging_set_level(LOGGING_INFO);
    return rc ? die("in-process pipeline", err) : 0;
}

/* Runs one request per prompt through the pipeline; returns decode
 * tokens/s over all of them. */
int run_requests(const struct bench_pipeline *p, const struct bench_requests *rq, struct local_stats *sum,
                 double *tps)
{
    char err[ERR_MSG_MAX] = "";
    int n_prompts = rq->n_prompts, prompt_len = rq->prompt_len;
    if (rq->prompts) {
        n_prompts = rq->prompts->n;
        prompt_len = 1;
        for (int i = 0; i < n_prompts; i++)
            prompt_len = rq->prompts->len[i] > prompt_len ? rq->prompts->len[i] : prompt_len;
    }
    int32_t *out = malloc((size_t)rq->max_tokens * sizeof(int32_t));
    int32_t *prompt = malloc((size_t)prompt_len * sizeof(int32_t));
    struct local *l = NULL;
    int rc = !out || !prompt ? die("bench", "out of memory") : pipeline_create(&l, p, rq->k);
    memset(sum, 0, sizeof *sum);
    double decode_ms = 0;
    long decode_tokens = 0;
    /* ids below 120000 fit every Llama 3 vocabulary; a test preset's smaller
     * vocabulary (tiny: 512) bounds them instead */
    const int vocab = llama_model_config(p->target->model)->vocab_size;
    const int id_mod = vocab < 120000 ? vocab : 120000;
    for (int i = 0; !rc && i < n_prompts; i++) {
        int n_prompt = prompt_len;
        if (rq->prompts) {
            n_prompt = rq->prompts->len[i];
            memcpy(prompt, rq->prompts->ids[i], (size_t)n_prompt * sizeof(int32_t));
        } else {
            for (int j = 0; j < prompt_len; j++)
                prompt[j] = (int32_t)((1000 + 7919 * (i * prompt_len + j)) % id_mod);
        }
        struct local_gen_request req = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = rq->max_tokens,
                                        .sampling = rq->sp, .mode = rq->mode, .ignore_eos = true,
                                        .spec_k = rq->k < 0 ? 0 : rq->k, .draft = rq->k < 0 ? "none" : "model"};
        req.sampling.seed = (uint64_t)(i + 1);
        struct local_gen_result res = {.ids = out, .cap = rq->max_tokens};
        logging_set_level(LOGGING_WARN);
        rc = local_generate(l, &req, &res, err);
        logging_set_level(LOGGING_INFO);
        if (rc) {
            rc = die("generate", err);
            break;
        }
        decode_ms += res.st.decode_ms;
        decode_tokens += res.st.generated_tokens - 1;
        stats_add(sum, &res.st);
    }
    local_destroy(l);
    free(out);
    free(prompt);
    *tps = decode_ms > 0 ? decode_tokens * 1000.0 / decode_ms : 0;
    return rc;
}


/* ms per llama_forward of `rows` tokens of one sequence after a prefix of
 * `prefix` tokens, every row's logits kept (verification's shape: K + 1
 * rows, K + 1 logits rows): in logits_host, or with logits_host NULL left
 * on the device in logits_dev; or with argmax_out only each row's argmax
 * (greedy verification's shape); `calls` calls after two warm-ups. */
int time_rows(struct bench_model *m, float *logits_host, float *logits_dev,
                     int32_t *argmax_out, int prefix, int rows, int calls, double *ms_out)
{
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be = llama_ctx_backend(m->ctx);
    const int vocab = llama_model_config(m->model)->vocab_size;
    int32_t tokens[32];
    for (int i = 0; i < rows; i++)
        tokens[i] = (int32_t)((4099 + 7919 * i) % vocab);
    struct llama_seq_batch b = {.slot = 0, .tokens = tokens, .n_tokens = rows, .n_logits = rows,
                                .logits_out = argmax_out ? NULL : logits_host,
                                .logits_dev = logits_host || argmax_out ? NULL : logits_dev,
                                .argmax_out = argmax_out};
    /* two untimed calls: a context with graphs records a shape the second
     * time it comes, and a recording is not what a call costs */
    enum { WARM_UP = 2 };
    double t0 = 0;
    for (int c = 0; c < calls + WARM_UP; c++) {
        if (c == WARM_UP) {
            if (be->ops->sync(be, err))
                return die("sync", err);
            t0 = now_s();
        }
        if (llama_forward(m->ctx, &b, 1, err) || llama_ctx_truncate(m->ctx, 0, prefix, err))
            return die("verification rows", err);
    }
    if (be->ops->sync(be, err))
        return die("sync", err);
    *ms_out = (now_s() - t0) * 1e3 / calls;
    return 0;
}

/* Prefill on the CPU: a prompt of `tokens` tokens in one llama_forward
 * call, the last row's logits, after one untimed call; the best of
 * `reps` runs, tokens per second. */
static int cpu_prefill(struct bench_model *m, int tokens, int reps)
{
    char err[ERR_MSG_MAX] = "";
    const int vocab = llama_model_config(m->model)->vocab_size;
    int32_t *prompt = malloc((size_t)tokens * sizeof *prompt);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    if (!prompt || !logits) {
        free(prompt);
        free(logits);
        return die("prefill", "out of memory");
    }
    for (int i = 0; i < tokens; i++)
        prompt[i] = (int32_t)((1000 + 7919 * i) % vocab);
    struct llama_seq_batch fb = {.slot = 0, .tokens = prompt, .n_tokens = tokens, .n_logits = 1,
                                 .logits_out = logits};
    double best = 0;
    int rc = 0;
    for (int r = 0; r <= reps && !rc; r++) {
        const double t0 = now_s();
        rc = llama_ctx_truncate(m->ctx, 0, 0, err) || llama_forward(m->ctx, &fb, 1, err);
        const double s = now_s() - t0;
        if (r > 0 && (best == 0 || s < best))
            best = s;
    }
    free(prompt);
    free(logits);
    if (rc || llama_ctx_truncate(m->ctx, 0, 0, err))
        return die("prefill", err);
    printf("  prefill %d tokens: %.1f ms, %.1f tokens/s (best of %d)\n", tokens, best * 1e3,
           tokens / best, reps);
    return 0;
}

/* The CPU's verification table: a forward call of K + 1 rows against one
 * of a single row, the two measured one right after the other and the pair
 * repeated, best of each (on this noisy machine only side-by-side figures
 * compare). The logits go to host memory, as the target worker's do; where
 * the backend finds an argmax from a copy of the head (greedy verification
 * reads only each row's argmax), the same calls asking only for that follow
 * in the same turns. With prof (the model's backend), a profile of a
 * PROF_ROWS-row call follows: where verification spends what one row does
 * not. */
static int cpu_verify_rows(struct bench_model *m, int prefix_len, int calls,
                           struct prof_backend *prof)
{
    enum { PROF_ROWS = 5 };
    enum { ROWS_MAX = 17, REPEATS = 3 };
    static const int row_counts[] = {2, 3, 5, 9, 17};
    char err[ERR_MSG_MAX] = "";
    const int vocab = llama_model_config(m->model)->vocab_size;
    float *logits = malloc((size_t)ROWS_MAX * (size_t)vocab * sizeof(float));
    int32_t *prefix = malloc((size_t)prefix_len * sizeof *prefix);
    int32_t picks[ROWS_MAX];
    if (!logits || !prefix) {
        free(logits);
        free(prefix);
        return die("verification rows", "out of memory");
    }
    const bool argmax = llama_ctx_has_argmax(m->ctx) &&
                        llama_model_prepare_argmax(m->model, false, err) == 0;
    for (int i = 0; i < prefix_len; i++)
        prefix[i] = (int32_t)((1000 + 7919 * i) % vocab);
    struct llama_seq_batch pb = {.slot = 0, .tokens = prefix, .n_tokens = prefix_len};
    const int prefilled = !llama_ctx_truncate(m->ctx, 0, 0, err) && !llama_forward(m->ctx, &pb, 1, err);
    free(prefix);
    if (!prefilled) {
        free(logits);
        return die("prefix", err);
    }
    printf("  verification rows (one sequence, %d-token prefix, best of %d alternating runs of %d "
           "calls):\n    rows   logits to host memory: ms/call  1 row ms  vs 1 row%s\n",
           prefix_len, REPEATS, calls,
           argmax ? "   argmax only (greedy): ms/call  1 row ms  vs 1 row" : "");
    for (size_t i = 0; i < sizeof row_counts / sizeof row_counts[0]; i++) {
        double best[2][2] = {{0, 0}, {0, 0}}; /* [logits, argmax][1 row, rows] */
        for (int r = 0; r < REPEATS; r++)
            for (int a = 0; a <= (argmax ? 1 : 0); a++) {
                int32_t *out = a ? picks : NULL;
                double one, ms;
                if (time_rows(m, logits, NULL, out, prefix_len, 1, calls, &one) ||
                    time_rows(m, logits, NULL, out, prefix_len, row_counts[i], calls, &ms)) {
                    free(logits);
                    return 1;
                }
                best[a][0] = r == 0 || one < best[a][0] ? one : best[a][0];
                best[a][1] = r == 0 || ms < best[a][1] ? ms : best[a][1];
            }
        printf("    %4d %31.3f %9.3f %8.2fx", row_counts[i], best[0][1], best[0][0],
               best[0][1] / best[0][0]);
        if (argmax)
            printf(" %32.3f %9.3f %8.2fx", best[1][1], best[1][0], best[1][1] / best[1][0]);
        printf("\n");
    }
    if (prof) {
        static const int profiled_rows[] = {1, 3, PROF_ROWS};
        for (int a = 0; a <= (argmax ? 1 : 0); a++)
            for (size_t pi = 0; pi < sizeof profiled_rows / sizeof profiled_rows[0]; pi++) {
                const int rows = profiled_rows[pi];
                double ms;
                prof_init(prof, prof->inner);
                const double t0 = now_s();
                if (time_rows(m, logits, NULL, a ? picks : NULL, prefix_len, rows, calls, &ms)) {
                    free(logits);
                    return 1;
                }
                char over[80];
                snprintf(over, sizeof over, "%d-row forward calls (%s), a warm-up included", rows,
                         a ? "argmax only" : "logits");
                prof_report(prof, now_s() - t0, calls + 1, "call", over);
            }
    }
    free(logits);
    return 0;
}

/* The share of read bandwidth, side by side. runtime_preset's figure sets
 * seconds of decode against the best of a few 1 GiB read passes before and
 * after it; this VM's bandwidth moves by up to 2x within a minute, so that
 * share reads low whenever a fast burst lands on a read pass. Here each turn
 * is a read (best of 3 passes) right before one request: the share per
 * turn, median. Each turn also reads the model's own weight copies with the
 * same loops: the bytes a decode step reads, in the pages the load placed
 * (a fresh buffer's pages are placed when the read starts, and on a VM the
 * host decides where). Both figures are printed; neither loop is the
 * kernel's shape, so either may read below it. bytes: the weight bytes a
 * token reads. */
static int runtime_side_by_side(const struct bench_opts *o, struct kern_backend *be,
                                const struct bench_pipeline *tp, const struct bench_requests *rq,
                                double bytes)
{
    enum { SIDE_TURNS = 7, SIDE_TOKENS = 16, COPIES_MAX = 4096 };
    static const void *copy_ptr[COPIES_MAX];
    static size_t copy_bytes[COPIES_MAX];
    char err[ERR_MSG_MAX] = "";
    int n_copies = kern_cpu_weight_copies(be, copy_ptr, copy_bytes, COPIES_MAX);
    n_copies = n_copies < COPIES_MAX ? n_copies : COPIES_MAX;
    size_t copied = 0;
    for (int i = 0; i < n_copies; i++)
        copied += copy_bytes[i];
    double share[SIDE_TURNS], share_w[SIDE_TURNS], fresh[SIDE_TURNS], weights[SIDE_TURNS];
    for (int r = 0; r < SIDE_TURNS; r++) {
        struct read_bw_result rb, rw = {0};
        struct local_stats st;
        double turn_tps;
        if (read_bw_measure(&rb, kern_cpu_threads(be), 0, 3, err, sizeof err))
            return die("read bandwidth", err);
        if (n_copies > 0 && read_bw_measure_regions(&rw, kern_cpu_threads(be), copy_ptr, copy_bytes,
                                                    n_copies, 3, err, sizeof err))
            return die("read bandwidth of the weights", err);
        struct bench_requests side = *rq;
        side.n_prompts = 1;
        side.max_tokens = o->tokens < SIDE_TOKENS ? o->tokens : SIDE_TOKENS;
        if (run_requests(tp, &side, &st, &turn_tps))
            return 1;
        fresh[r] = rb.read_gbs;
        weights[r] = rw.read_gbs;
        share[r] = bytes * turn_tps / 1e9 / rb.read_gbs;
        share_w[r] = rw.read_gbs > 0 ? bytes * turn_tps / 1e9 / rw.read_gbs : 0;
    }
    double lo, hi, lo_w, hi_w;
    min_max(share, SIDE_TURNS, &lo, &hi);
    min_max(share_w, SIDE_TURNS, &lo_w, &hi_w);
    printf("%-14s decode as a share of the read measured just before it, %d turns of a read "
           "and %d tokens: median %.1f%% (%.1f-%.1f%%) of a fresh 1 GiB buffer's read "
           "(median %.1f GB/s)\n",
           "", SIDE_TURNS, o->tokens < SIDE_TOKENS ? o->tokens : SIDE_TOKENS,
           100.0 * median(share, SIDE_TURNS), 100.0 * lo, 100.0 * hi,
           median(fresh, SIDE_TURNS));
    if (n_copies > 0)
        printf("%-14s   and median %.1f%% (%.1f-%.1f%%) of a read of the model's own %.1f MB "
               "of weight copies (median %.1f GB/s)\n",
               "", 100.0 * median(share_w, SIDE_TURNS), 100.0 * lo_w, 100.0 * hi_w,
               (double)copied / 1e6, median(weights, SIDE_TURNS));
    return 0;
}

/* One preset's rows of the CPU runtime table: decode tokens/s and its share
 * of read bandwidth, the shares side by side, a profile with --profile 1,
 * then the verification rows and prefill. *bw: the last read figure, which
 * the decode is set against and which is measured again after it. */
static int runtime_preset(const struct bench_opts *o, struct kern_backend *be, const char *preset,
                          struct read_bw_result *bw)
{
    char err[ERR_MSG_MAX] = "";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", o->models_dir, preset);
    if (ensure_model(dir, preset, 1, NULL, 0))
        return 1;
    struct prof_backend prof;
    prof_init(&prof, be);
    struct kern_backend *mbe = o->profile ? &prof.base : be;
    struct bench_model m;
    if (load(&m, dir, mbe, o->prefix + 64 > 1024 ? o->prefix + 64 : 1024, o->quantize))
        return 1;
    /* target-only through the server's scheduler; every row reads the
     * whole LM head, the bytes the figures below count (the argmax
     * screen would read a copy of a quarter of its size) */
    const struct bench_pipeline tp = {.target = &m, .sampler = "host", .whole_heads = true};
    struct bench_requests rq = {.n_prompts = 2, .prompt_len = 16, .max_tokens = o->tokens, .k = -1,
                                .mode = SPECULATE_MODE_SAMPLED};
    sampling_params_default(&rq.sp);
    struct local_stats st;
    double tps;
    if (run_requests(&tp, &rq, &st, &tps))
        return 1;
    const double read_before = bw->read_gbs;
    if (read_bw_measure(bw, kern_cpu_threads(be), 0, 5, err, sizeof err))
        return die("read bandwidth", err);
    const double read_gbs = read_before > bw->read_gbs ? read_before : bw->read_gbs;
    double bytes = (double)llama_model_weight_bytes_per_token(m.model);
    double gbps = bytes * tps / 1e9;
    printf("%-14s %12.1f %12.2f %10.2f %12.2f %10.2f %9.1f%%\n", preset, bytes / 1e6, tps,
           1000.0 / tps, gbps, read_gbs, 100.0 * gbps / read_gbs);
    if (runtime_side_by_side(o, be, &tp, &rq, bytes))
        return 1;
    if (o->profile) {
        /* a second run, now profiled from its start (the first warmed up) */
        prof_init(&prof, be);
        double t0 = now_s();
        if (run_requests(&tp, &rq, &st, &tps))
            return 1;
        prof_report(&prof, now_s() - t0, 2L * o->tokens, "token",
                    "generated tokens, prefill included");
    }
    if (cpu_verify_rows(&m, o->prefix, o->tokens < 10 ? o->tokens : 10, o->profile ? &prof : NULL))
        return 1;
    if (cpu_prefill(&m, 512, 2))
        return 1;
    unload(&m);
    return 0;
}

static int bench_runtime(const struct bench_opts *o, struct kern_backend *be)
{
    if (!strcmp(be->name, "cuda"))
        return bench_runtime_cuda(o, be);
    char err[ERR_MSG_MAX] = "";
    struct read_bw_result bw;
    if (read_bw_measure(&bw, kern_cpu_threads(be), 0, 5, err, sizeof err))
        return die("read bandwidth", err);
    printf("read bandwidth (%d threads, %zu MiB, best pass): %.2f GB/s\n", bw.n_threads,
           bw.size_bytes >> 20, bw.read_gbs);
    printf("memcpy (read+write counted, for reference only): %.2f GB/s\n", bw.memcpy_gbs);
    printf("int8/int4 integer dot: %s\n", kern_cpu_int_dot_name(kern_cpu_int_dot(be)));
    printf("bf16 products: %s\n", kern_cpu_bf16_dot(be) == 1 ? "vdpbf16ps (bf16 activations)"
                                                             : "f32 paths (f32 activations)");
    /* This VM's read bandwidth swings by 2x from minute to minute: it is
     * measured again after each decode, and the decode is set against the
     * higher of the two figures around it (never the flattering one). */
    printf("%-14s %12s %12s %10s %12s %10s %10s\n", "preset", "weights MB", "tokens/s", "ms/token",
           "weight GB/s", "read GB/s", "% of read");
    char list[256];
    snprintf(list, sizeof list, "%s", o->presets);
    for (char *save = NULL, *preset = strtok_r(list, ",", &save); preset;
         preset = strtok_r(NULL, ",", &save))
        if (runtime_preset(o, be, preset, &bw))
            return 1;
    return 0;
}

/* Continuous batching's cost curve: one decode row for each of B sequences
 * (each already holding a 64-token prefix) in one llama_forward call, for
 * B = 1, 2, 4, 8, 16: ms per call, against B = 1, and the aggregate tokens/s
 * the target could reach if every call were full. */
static int bench_batch(const struct bench_opts *o, struct kern_backend *be)
{
    enum { B_MAX = 16, PREFIX = 64 };
    static const int batches[] = {1, 2, 4, 8, 16};
    char err[ERR_MSG_MAX] = "";
    char list[256];
    snprintf(list, sizeof list, "%s", o->presets);
    for (char *save = NULL, *preset = strtok_r(list, ",", &save); preset;
         preset = strtok_r(NULL, ",", &save)) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", o->models_dir, preset);
        if (ensure_model(dir, preset, 1, NULL, 0))
            return 1;
        struct prof_backend prof;
        prof_init(&prof, be);
        struct kern_backend *mbe = o->profile ? &prof.base : be;
        struct llama_model *model = NULL;
        struct llama_ctx *ctx = NULL;
        struct llama_ctx_params p = {.n_slots = B_MAX, .max_seq_len = PREFIX + o->tokens + 8};
        if (llama_model_load_quantized(&model, dir, mbe, o->quantize, err) ||
            llama_ctx_create(&ctx, model, &p, err))
            return die(dir, err);
        const int vocab = llama_model_config(model)->vocab_size;
        float *logits = malloc((size_t)B_MAX * (size_t)vocab * sizeof(float));
        int32_t prompt[PREFIX], next[B_MAX];
        if (!logits)
            return die("batch", "out of memory");
        printf("%s: %d sequences x 1 row per call, %d-token prefixes, %d calls per size\n", preset,
               B_MAX, PREFIX, o->tokens);
        printf("  %4s %12s %10s %16s\n", "B", "ms/call", "vs B=1", "tokens/s (all B)");
        double one = 0;
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int B = batches[bi];
            struct llama_seq_batch seqs[B_MAX];
            for (int s = 0; s < B; s++) {
                for (int j = 0; j < PREFIX; j++)
                    prompt[j] = (int32_t)((1000 + 7919 * (s * PREFIX + j)) % vocab);
                if (llama_ctx_truncate(ctx, s, 0, err))
                    return die("truncate", err);
                struct llama_seq_batch b = {.slot = s, .tokens = prompt, .n_tokens = PREFIX};
                if (llama_forward(ctx, &b, 1, err))
                    return die("prefill", err);
                next[s] = prompt[PREFIX - 1];
                seqs[s] = (struct llama_seq_batch){.slot = s, .tokens = &next[s], .n_tokens = 1,
                                                   .n_logits = 1,
                                                   .logits_out = logits + (size_t)s * (size_t)vocab};
            }
            prof_init(&prof, be);
            double t0 = now_s();
            for (int it = 0; it < o->tokens; it++)
                if (llama_forward(ctx, seqs, B, err))
                    return die("forward", err);
            double ms = (now_s() - t0) * 1e3 / o->tokens;
            if (B == 1)
                one = ms;
            printf("  %4d %12.2f %9.2fx %16.1f\n", B, ms, ms / one, 1000.0 * B / ms);
            if (o->profile) {
                char over[64];
                snprintf(over, sizeof over, "calls of %d sequences x 1 row", B);
                prof_report(&prof, ms * o->tokens / 1e3, (long)o->tokens, "call", over);
            }
        }
        free(logits);
        llama_ctx_destroy(ctx);
        llama_model_destroy(model);
    }
    return 0;
}

/* Leviathan's per-token acceptance a from fixed-K rounds: accepted tokens
 * over accepted tokens plus rejections (rounds that stopped before K). */
static double alpha_of(const struct local_stats *s, int k)
{
    int rejections = s->rounds - (k > 0 ? s->accepted_at[k - 1] : 0);
    double denom = (double)s->accepted + rejections;
    return denom > 0 ? s->accepted / denom : 0;
}

/* The pairs: a target derived from its draft (modelgen_derive) at each
 * noise level. "1b" is the shape the issue compares with llama.cpp: a
 * Llama-1B-shaped target (hidden 2048, 16 layers) over a 2-layer draft of
 * the same width, so the draft reads about a third of the target's bytes
 * (the tied 128256-wide head is most of them). */
struct spec_pair {
    const char *name, *draft_preset, *target_preset;
    int draft_layers;
};
static const struct spec_pair spec_pairs[] = {
    {"small", "small-draft", "small", 0},
    {"1b", "llama-3.2-1b", "llama-3.2-1b", 2},
    /* the real target shape over a draft of a third of its bytes (GPU) */
    {"3b", "llama-3.2-3b-draft", "llama-3.2-3b", 0},
    /* the trained pair (tools/train): read from --trained, never generated */
    {"trained", NULL, NULL, 0},
};

/* The draft modes side by side: acceptance at T = 0.7 and 1.0 with K = 4
 * (--modes). */
static int run_draft_modes(const struct bench_opts *o, const struct bench_pipeline *p,
                           const struct bench_requests *base)
{
    for (int ti = 0; ti < 2 * o->modes; ti++) {
        struct bench_requests rq = *base;
        rq.k = 4;
        rq.sp.temperature = ti ? 1.0f : 0.7f;
        for (int mode = 0; mode < 2; mode++) {
            struct local_stats st;
            double tps;
            rq.mode = (enum speculate_mode)mode;
            if (run_requests(p, &rq, &st, &tps))
                return 1;
            printf("  T=%.1f K=4 %-10s acceptance %.3f, %.2f accepted/round, %.2f tokens/s\n",
                   rq.sp.temperature, mode ? "point-mass" : "sampled",
                   st.drafted ? (double)st.accepted / st.drafted : 0,
                   st.rounds ? (double)st.accepted / st.rounds : 0, tps);
        }
    }
    return 0;
}

/* The runs of one spec table: each K of --ks, and with --full-head each K
 * again reading both whole LM heads. */
enum { SPEC_RUNS_MAX = 2 * (SPECULATE_K_MAX + 2), SPEC_REPEATS_MAX = 16 };
struct spec_runs {
    int k[SPEC_RUNS_MAX];
    bool full[SPEC_RUNS_MAX];
    int n;
    bool full_head; /* target-only reading its whole head too */
};

static void spec_runs_parse(const struct bench_opts *o, struct spec_runs *r)
{
    char klist[64];
    snprintf(klist, sizeof klist, "%s", o->ks);
    r->n = 0;
    r->full_head = o->full_head;
    for (char *save = NULL, *kstr = strtok_r(klist, ",", &save); kstr && r->n + 2 <= SPEC_RUNS_MAX;
         kstr = strtok_r(NULL, ",", &save)) {
        int kk = atoi(kstr);
        if (kk < 0 || kk > SPECULATE_K_MAX)
            continue;
        r->full[r->n] = false;
        r->k[r->n++] = kk;
        if (o->full_head) {
            r->full[r->n] = true;
            r->k[r->n++] = kk;
        }
    }
}

/* What the turns of one spec table measured. */
struct spec_table {
    struct local_stats base, sum[SPEC_RUNS_MAX];
    double base_tps[SPEC_REPEATS_MAX], base_full_tps[SPEC_REPEATS_MAX];
    double tps[SPEC_RUNS_MAX][SPEC_REPEATS_MAX];
};

/* Row i of the spec table (runs->k[i], 0 for adaptive; runs->full[i]: both
 * whole heads read), from its turns' tokens/s against target-only's beside
 * them, and the per-position acceptance and the turns below it. */
static void print_spec_row(const struct spec_table *t, const struct spec_runs *runs, int i,
                           int repeats, double target_ms)
{
    const int kk = runs->k[i];
    const bool full = runs->full[i];
    const struct local_stats *sk = &t->sum[i];
    const double *tps = t->tps[i];
    enum { REPEATS_MAX = 16 };
    double ratio[REPEATS_MAX];
    for (int r = 0; r < repeats; r++) {
        const double base = full ? t->base_full_tps[r] : t->base_tps[r];
        ratio[r] = base > 0 ? tps[r] / base : 0;
    }
    double acc = sk->drafted ? (double)sk->accepted / sk->drafted : 0;
    double c = sk->drafted ? (sk->draft_ms / sk->drafted) / target_ms : 0;
    double alpha = kk ? alpha_of(sk, kk) : acc;
    char predicted[32] = "-";
    if (kk)
        snprintf(predicted, sizeof predicted, "%.2fx",
                 speculate_expected_speedup(alpha, kk, c));
    char label[24];
    if (kk)
        snprintf(label, sizeof label, "%d%s", kk, full ? " full" : "");
    else
        snprintf(label, sizeof label, "adaptive%s", full ? " full" : "");
    printf("%-9s %10.2f %7.2fx %11.3f %8.3f %8.3f %10.2f %12s\n", label,
           median(tps, repeats),
           median(ratio, repeats), acc, alpha, c,
           sk->rounds ? (double)sk->accepted / sk->rounds : 0, predicted);
    /* Acceptance of each draft position given the ones before it
     * were accepted: equal across positions where acceptance is the
     * independent draws Leviathan's E(a, k) assumes, rising where
     * accepted drafts come in runs (then a larger K pays more than
     * the model says). */
    if (kk > 1 && sk->rounds) {
        printf("%-9s", "  by pos");
        for (int j = 0; j < kk; j++) {
            const int reached = j ? sk->accepted_at[j - 1] : sk->rounds;
            printf(" %.3f", reached ? (double)sk->accepted_at[j] / reached : 0.0);
        }
        printf("\n");
    }
    if (repeats > 1) {
        printf("%-9s", "  turns");
        for (int r = 0; r < repeats; r++)
            printf(" %.2fx", ratio[r]);
        printf("\n");
    }
}

/* Target-only and every run in turn, the whole turn repeated: this VM's
 * memory bandwidth moves by up to 2x within minutes, and a speed-up is
 * only sound against the target-only run beside it. Each K's speed-up is
 * the median of its per-turn ratios; its other figures are summed over
 * the turns. */
static int spec_turns(const struct bench_pipeline *pair, const struct bench_requests *greedy,
                      const struct spec_runs *runs, int repeats, struct spec_table *t)
{
    memset(t, 0, sizeof *t);
    struct bench_pipeline p = *pair;
    struct bench_requests rq = *greedy;
    for (int r = 0; r < repeats; r++) {
        struct local_stats st;
        p.whole_heads = false;
        rq.k = -1;
        if (run_requests(&p, &rq, &st, &t->base_tps[r]))
            return 1;
        stats_add(&t->base, &st);
        /* whole heads: target-only decoding as it was before the screen */
        p.whole_heads = true;
        if (runs->full_head && run_requests(&p, &rq, &st, &t->base_full_tps[r]))
            return 1;
        for (int i = 0; i < runs->n; i++) {
            p.whole_heads = runs->full[i];
            rq.k = runs->k[i];
            if (run_requests(&p, &rq, &st, &t->tps[i][r]))
                return 1;
            stats_add(&t->sum[i], &st);
        }
    }
    return 0;
}

/* The draft of the pair named by --pair, generated when missing. 0, 1
 * (printed) or 2 (no such pair). */
static int spec_draft_dir(const struct bench_opts *o, const struct spec_pair **pair_out, char *draft_dir,
                          size_t size)
{
    const struct spec_pair *pair = NULL;
    for (size_t i = 0; i < sizeof spec_pairs / sizeof spec_pairs[0]; i++)
        if (!strcmp(o->pair, spec_pairs[i].name))
            pair = &spec_pairs[i];
    if (!pair) {
        fprintf(stderr, "tandem-bench: --pair %s: not a pair (small, 1b, 3b, trained)\n", o->pair);
        return 2;
    }
    *pair_out = pair;
    if (pair->draft_preset == NULL) /* trained */
        snprintf(draft_dir, size, "%s/draft", o->trained_dir);
    else if (pair->draft_layers)
        snprintf(draft_dir, size, "%s/%s-draft-%dl", o->models_dir, pair->name, pair->draft_layers);
    else
        snprintf(draft_dir, size, "%s/%s", o->models_dir, pair->draft_preset);
    if (pair->draft_preset && ensure_model_layers(draft_dir, pair->draft_preset, pair->draft_layers, 1, NULL, 0))
        return 1;
    return 0;
}

/* The table's title line: the pair, the prompts, target-only's speed. */
struct spec_what {
    const struct spec_pair *pair;
    const char *noise;
    const struct bench_requests *rq;
};

static void spec_title(const struct bench_opts *o, const struct spec_what *w, const struct spec_table *t,
                       int repeats, double target_ms)
{
    const struct bench_requests *rq = w->rq;
    const char *turns = repeats > 1 ? "s" : "";
    if (rq->prompts) {
        int shortest = rq->prompts->len[0], longest = rq->prompts->len[0];
        for (int i = 1; i < rq->prompts->n; i++) {
            shortest = rq->prompts->len[i] < shortest ? rq->prompts->len[i] : shortest;
            longest = rq->prompts->len[i] > longest ? rq->prompts->len[i] : longest;
        }
        printf("\ntrained pair (%s), greedy, %d chat prompts of %d..%d tokens x %d tokens, %d turn%s: "
               "target-only %.2f tokens/s (median; %.2f ms/token)\n",
               o->trained_dir, rq->prompts->n, shortest, longest, o->tokens, repeats, turns,
               median(t->base_tps, repeats), target_ms);
    } else
        printf("\n%s pair, draft noise %s, greedy, %d prompts of %d tokens x %d tokens, %d turn%s: "
               "target-only %.2f tokens/s (median; %.2f ms/token)\n",
               w->pair->name, w->noise, rq->n_prompts, o->prompt, o->tokens, repeats, turns,
               median(t->base_tps, repeats), target_ms);
    if (o->full_head)
        printf("  target-only reading its whole LM head: %.2f tokens/s (median); the \"full\" "
               "rows read both whole heads and are compared with it\n",
               median(t->base_full_tps, repeats));
}

/* One target of the pair (a noise level, or the trained target): the table. */
static int spec_target(const struct bench_opts *o, const struct spec_pair *pair, const char *noise,
                       struct bench_pipeline *p, const struct bench_requests *rq)
{
    struct spec_runs runs;
    spec_runs_parse(o, &runs);
    const int repeats = o->repeats < 1 ? 1 : o->repeats > SPEC_REPEATS_MAX ? SPEC_REPEATS_MAX : o->repeats;
    struct spec_table *t = malloc(sizeof *t);
    if (!t)
        return die("spec", "out of memory");
    if (spec_turns(p, rq, &runs, repeats, t)) {
        free(t);
        return 1;
    }
    double target_ms = t->base.verify_ms / (t->base.rounds ? t->base.rounds : 1);
    const struct spec_what what = {.pair = pair, .noise = noise, .rq = rq};
    spec_title(o, &what, t, repeats, target_ms);
    printf("%-9s %10s %8s %11s %8s %8s %10s %12s\n", "K", "tokens/s", "speedup", "acceptance",
           "alpha", "c", "acc/round", "predicted");
    for (int i = 0; i < runs.n; i++)
        print_spec_row(t, &runs, i, repeats, target_ms);
    free(t);
    if (run_draft_modes(o, p, rq))
        return 1;
    if (!strcmp(p->sampler, "device")) {
        struct llama_graph_stats gd, gt;
        llama_ctx_graph_stats(p->draft->ctx, &gd);
        llama_ctx_graph_stats(p->target->ctx, &gt);
        printf("  cuda graphs: draft %s (%lld recorded, %lld replayed), target %s (%lld, "
               "%lld)\n", gd.graphs ? "on" : "off", (long long)gd.recorded,
               (long long)gd.replayed, gt.graphs ? "on" : "off", (long long)gt.recorded,
               (long long)gt.replayed);
    }
    return 0;
}

/* tandem-bench spec: the pair's speculation through the server's own
 * scheduler in process, against target-only beside it. */
static int bench_spec(const struct bench_opts *o, struct kern_backend *be)
{
    const struct spec_pair *pair = NULL;
    char draft_dir[512];
    int rc = spec_draft_dir(o, &pair, draft_dir, sizeof draft_dir);
    if (rc)
        return rc;
    const bool trained = pair->draft_preset == NULL;
    /* The trained pair answers real questions (its chat data's kinds);
     * random ids would measure agreement on noise. */
    struct bench_prompts chat_prompts = {0};
    if (trained && bench_prompts_chat(&chat_prompts, draft_dir, BENCH_PROMPTS_MAX))
        return 1;
    struct bench_model dm, tm;
    /* the requests' prompts and tokens, and the drafts of a last round */
    const int room = o->prompt + o->tokens + 64 > 1024 ? o->prompt + o->tokens + 64 : 1024;
    if (load(&dm, draft_dir, be, room, o->draft_quantize)) {
        bench_prompts_free(&chat_prompts);
        return 1;
    }
    /* on the GPU both halves sample there (ids cross, logits stay) */
    struct bench_pipeline p = {.target = &tm, .draft = &dm,
                               .sampler = !strcmp(be->name, "cuda") ? "device" : "host"};
    struct bench_requests rq = {.n_prompts = trained ? chat_prompts.n : 3, .prompt_len = o->prompt,
                                .max_tokens = o->tokens, .prompts = trained ? &chat_prompts : NULL,
                                .mode = SPECULATE_MODE_SAMPLED};
    sampling_params_default(&rq.sp);
    char list[128];
    /* the trained pair has one target, no noise levels */
    snprintf(list, sizeof list, "%s", trained ? "none" : o->noise);
    for (char *save = NULL, *ns = strtok_r(list, ",", &save); ns && !rc; ns = strtok_r(NULL, ",", &save)) {
        char dir[512];
        if (trained)
            snprintf(dir, sizeof dir, "%s/target", o->trained_dir);
        else
            snprintf(dir, sizeof dir, "%s/%s-noise-%s", o->models_dir, pair->name, ns);
        if ((!trained && ensure_model(dir, pair->target_preset, 2, draft_dir, atof(ns))) ||
            load(&tm, dir, be, room, o->quantize)) {
            rc = 1;
            break;
        }
        rc = spec_target(o, pair, ns, &p, &rq);
        unload(&tm);
    }
    unload(&dm);
    bench_prompts_free(&chat_prompts);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: tandem-bench runtime|spec|batch|ppl [--models DIR] [--threads N] [--tokens N]\n"
                    "                    [--presets small,llama-3.2-1b] [--noise 0.02,0.05,0.2]\n"
                    "                    [--ks 1,2,3,4,5,6,7,8,0 (0 = adaptive)] [--modes 0|1]\n"
                    "                    [--pair small|1b|3b|trained] [--repeats N (spec: turns)]\n"
                    "                    [--trained DIR (spec --pair trained: models/trained)]\n"
                    "                    [--model DIR --text FILE [--context N] (ppl)]\n"
                    "                    [--full-head 0|1 (spec: also reading whole LM heads)]\n"
                    "                    [--profile 0|1 (runtime: time per op)]\n"
                    "                    [--prefix N (runtime: tokens before the verification rows)]\n"
                    "                    [--prompt N (spec: tokens per prompt, 16)]\n"
                    "                    [--backend cpu|cuda] [--device ORDINAL|GPU-UUID]\n"
                    "                    [--quantize none|int8|int4 (runtime, batch, spec targets)]\n"
                    "                    [--draft-quantize none|int8|int4 (spec drafts)]\n");
}

/* The flags after the command into *o, over the defaults: 0, or 2 (the
 * usage error's exit code) with the reason on stderr. */
static int parse_opts(int argc, char **argv, struct bench_opts *o)
{
    *o = (struct bench_opts){
        .models_dir = "bench-models", .threads = 0, .tokens = 64, .prefix = 64, .prompt = 16};
    snprintf(o->presets, sizeof o->presets, "small,llama-3.2-1b");
    snprintf(o->noise, sizeof o->noise, "0.02,0.05,0.2");
    snprintf(o->ks, sizeof o->ks, "1,2,3,4,5,6,7,8,0");
    o->modes = 1;
    o->pair = "small";
    o->trained_dir = "models/trained";
    o->context = 256;
    o->repeats = 1;
    o->backend = "cpu";
    o->device = "0";
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem-bench: %s: missing value\n", argv[i]);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--models")) o->models_dir = v;
        else if (!strcmp(argv[i - 1], "--threads")) o->threads = atoi(v);
        else if (!strcmp(argv[i - 1], "--tokens")) o->tokens = atoi(v);
        else if (!strcmp(argv[i - 1], "--presets")) snprintf(o->presets, sizeof o->presets, "%s", v);
        else if (!strcmp(argv[i - 1], "--noise")) snprintf(o->noise, sizeof o->noise, "%s", v);
        else if (!strcmp(argv[i - 1], "--ks")) snprintf(o->ks, sizeof o->ks, "%s", v);
        else if (!strcmp(argv[i - 1], "--modes")) o->modes = atoi(v) != 0;
        else if (!strcmp(argv[i - 1], "--pair")) o->pair = v;
        else if (!strcmp(argv[i - 1], "--trained")) o->trained_dir = v;
        else if (!strcmp(argv[i - 1], "--model")) o->model = v;
        else if (!strcmp(argv[i - 1], "--text")) o->text = v;
        else if (!strcmp(argv[i - 1], "--context")) o->context = atoi(v);
        else if (!strcmp(argv[i - 1], "--repeats")) o->repeats = atoi(v);
        else if (!strcmp(argv[i - 1], "--full-head")) o->full_head = atoi(v) != 0;
        else if (!strcmp(argv[i - 1], "--profile")) o->profile = atoi(v) != 0;
        else if (!strcmp(argv[i - 1], "--prefix")) o->prefix = atoi(v);
        else if (!strcmp(argv[i - 1], "--prompt")) o->prompt = atoi(v);
        else if (!strcmp(argv[i - 1], "--backend")) o->backend = v;
        else if (!strcmp(argv[i - 1], "--device")) o->device = v;
        else if (!strcmp(argv[i - 1], "--quantize") || !strcmp(argv[i - 1], "--draft-quantize")) {
            char qerr[ERR_MSG_MAX];
            if (quantize_mode_parse(v, !strcmp(argv[i - 1], "--quantize") ? &o->quantize : &o->draft_quantize,
                                    qerr)) {
                fprintf(stderr, "tandem-bench: %s: %s\n", argv[i - 1], qerr);
                return 2;
            }
        }
        else {
            fprintf(stderr, "tandem-bench: unknown flag %s\n", argv[i - 1]);
            return 2;
        }
    }
    return 0;
}

/* The ranges and combinations of flags: 0, or 2 as parse_opts. */
static int check_opts(const struct bench_opts *o)
{
    if (o->tokens < 2) {
        fprintf(stderr, "tandem-bench: --tokens: must be >= 2\n");
        return 2;
    }
    if (o->prompt < 1 || o->prompt > 65536) {
        fprintf(stderr, "tandem-bench: --prompt: must be 1..65536\n");
        return 2;
    }
    if (o->prefix < 1 || o->prefix > 65536) {
        fprintf(stderr, "tandem-bench: --prefix: must be 1..65536\n");
        return 2;
    }
    if (o->context < 2 || o->context > 65536) {
        fprintf(stderr, "tandem-bench: --context: must be 2..65536\n");
        return 2;
    }
    if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
        fprintf(stderr, "tandem-bench: --backend: expected cpu or cuda, got \"%s\"\n", o->backend);
        return 2;
    }
    if (!strcmp(o->backend, "cuda") && o->profile) {
        fprintf(stderr, "tandem-bench: --profile times ops on the host; it measures only the "
                        "cpu backend\n");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "runtime") && strcmp(argv[1], "spec") &&
                     strcmp(argv[1], "batch") && strcmp(argv[1], "ppl"))) {
        usage();
        return 2;
    }
    struct bench_opts o;
    if (parse_opts(argc, argv, &o) || check_opts(&o))
        return 2;
    /* The backend before anything else: without a GPU the run says so in
     * one line, with the skip code, and leaves nothing behind. */
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be;
    int brc = kern_backend_create(&be, o.backend, o.device, o.threads, err);
    if (brc == ERR_UNAVAILABLE || brc == ERR_UNSUPPORTED) {
        fprintf(stderr, "no GPU: %s\n", err);
        return 77;
    }
    if (brc)
        return die("backend", err);
    if (mkdir(o.models_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "tandem-bench: %s: %s\n", o.models_dir, strerror(errno));
        be->ops->destroy(be);
        return 1;
    }
    if (!strcmp(be->name, "cpu"))
        printf("cpu backend: %d threads\n", kern_cpu_threads(be));
    int rc = !strcmp(argv[1], "runtime") ? bench_runtime(&o, be)
             : !strcmp(argv[1], "batch") ? bench_batch(&o, be)
             : !strcmp(argv[1], "ppl")   ? bench_ppl(&o, be)
                                         : bench_spec(&o, be);
    be->ops->destroy(be);
    return rc;
}
