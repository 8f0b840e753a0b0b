/* runtime_cuda.c: tandem-bench runtime --backend cuda.
 *
 * Per preset, side by side in one run: decode ms/token against the floor
 * (weight bytes / the read bandwidth measured first), with the context's
 * chunks replayed as CUDA graphs and with every kernel launched one by one
 * (llama_ctx_params.no_graphs: the same bits, so only the time differs);
 * the cost of verifying 1..17 rows in one call, both ways; decode at
 * positions 512 and 8000 (what attention adds with the context); prefill
 * tokens/s of a 512-token prompt; first, one verification's logits with
 * graphs, eager and on the CPU backend (bits_check).
 *
 * The CUDA backend queues its work and returns: every timing ends with the
 * backend's sync (or with the download of a token, which waits).
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "bench.h"
#include "error.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels_cuda.h"
#endif

#ifdef TANDEM_HAVE_CUDA
enum { PREFIX = 64, ROWS_MAX = 17, PREFILL = 512, LONG_POS = 8000, BITS_ROWS = 5 };

/* One line per aim of the GPU step (docs/perf), MET or MISS, so that the
 * stage's summary says which held without anyone reading the tables. */
static void print_aim(bool met, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void print_aim(bool met, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  AIM %s: ", met ? "MET " : "MISS");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* The share of the read floor a preset's greedy decode aims at (0: none). */
static double floor_aim(const char *preset)
{
    if (strcmp(preset, "llama-3.2-3b") == 0)
        return 0.60;
    if (strcmp(preset, "llama-3.2-1b") == 0)
        return 0.50;
    return 0;
}

/* A second context on m's model: graphs off, or a longer context. */
static int second_ctx(struct bench_model *out, const struct bench_model *m, int max_seq_len,
                      bool no_graphs)
{
    char err[ERR_MSG_MAX] = "";
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = max_seq_len, .no_graphs = no_graphs};
    out->model = m->model;
    if (llama_ctx_create(&out->ctx, m->model, &p, err))
        return die("context", err);
    return 0;
}

static void print_graphs(const char *what, const struct llama_ctx *ctx)
{
    struct llama_graph_stats g;
    llama_ctx_graph_stats(ctx, &g);
    printf("  %s: device steps %s, graphs %s, %d held, %lld recorded, %lld replayed\n", what,
           g.steps ? "on" : "off", g.graphs ? "on" : "off", g.held, (long long)g.recorded,
           (long long)g.replayed);
}

/* Target-only decode of the four sampler variants on m, and the device
 * greedy one on eager (graphs off). */
static int decode_table(const struct bench_opts *o, const char *preset, struct bench_model *m,
                        struct bench_model *eager, double floor_ms)
{
    double device_ms[2] = {0, 0}; /* device sampler: greedy, T=0.8 */
    printf("  %-34s %10s %10s %12s\n", "decode (target only)", "tokens/s", "ms/token",
           "% of floor");
    struct sampling_params greedy, sampled;
    sampling_params_default(&greedy);
    sampled = greedy;
    sampled.temperature = 0.8f;
    sampled.top_p = 0.9f;
    static const char *const names[5] = {
        "device sampler, greedy", "device sampler, T=0.8", "host sampler, greedy",
        "host sampler, T=0.8", "device sampler, greedy, no graphs"};
    for (int v = 0; v < 5; v++) {
        const struct bench_pipeline tp = {.target = v < 4 ? m : eager,
                                          .sampler = v < 2 || v == 4 ? "device" : "host"};
        struct bench_requests rq = {.n_prompts = 2, .prompt_len = 16, .max_tokens = o->tokens, .k = -1,
                                    .sp = v % 2 ? sampled : greedy, .mode = SPECULATE_MODE_SAMPLED};
        struct local_stats st;
        double tps;
        if (run_requests(&tp, &rq, &st, &tps))
            return 1;
        printf("  %-34s %10.1f %10.3f %11.1f%%\n", names[v], tps, 1000.0 / tps,
               100.0 * floor_ms * tps / 1000.0);
        if (v < 2)
            device_ms[v] = 1000.0 / tps;
    }
    const double aim = floor_aim(preset), share = floor_ms / device_ms[0];
    if (aim > 0)
        print_aim(share >= aim, "greedy decode at %.1f%% of the read floor (aim %.0f%%)",
                  100.0 * share, 100.0 * aim);
    print_aim(device_ms[1] - device_ms[0] <= 0.15,
              "sampled decode (T=0.8, top-p 0.9) %.3f ms a token over greedy (aim <= 0.15)",
              device_ms[1] - device_ms[0]);
    return 0;
}

/* Fills slot 0 of ctx with n tokens. */
static int fill(struct bench_model *m, int n, char *err)
{
    const int vocab = llama_model_config(m->model)->vocab_size;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids)
        return error_set(err, ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((1000 + 7919 * (int64_t)i) % vocab);
    struct llama_seq_batch b = {.slot = 0, .tokens = ids, .n_tokens = n};
    int rc = llama_ctx_truncate(m->ctx, 0, 0, err);
    if (!rc)
        rc = llama_forward(m->ctx, &b, 1, err);
    free(ids);
    return rc;
}

/* K + 1 rows in one call against one row, graphs and eager side by side. */
static int verify_table(const struct bench_opts *o, struct bench_model *m,
                        struct bench_model *eager, float *logits_dev, double *one_row_ms)
{
    static const struct {
        int rows;
        double aim; /* at most this many times one row, graphs on */
    } aims[3] = {{5, 1.10}, {9, 1.35}, {17, 1.60}};
    char err[ERR_MSG_MAX] = "";
    if (fill(m, PREFIX, err) || fill(eager, PREFIX, err))
        return die("prefix", err);
    const int calls = o->tokens < 20 ? o->tokens : 20;
    double one[2] = {0, 0};
    printf("  verification rows (one sequence, %d-token prefix, logits kept on the device, %d "
           "calls each):\n    rows  graphs ms  vs 1 row  eager ms  vs 1 row  eager/graphs\n",
           PREFIX, calls);
    for (int rows = 1; rows <= ROWS_MAX; rows++) {
        double ms[2];
        if (time_rows(m, NULL, logits_dev, NULL, PREFIX, rows, calls, &ms[0]) ||
            time_rows(eager, NULL, logits_dev, NULL, PREFIX, rows, calls, &ms[1]))
            return 1;
        if (rows == 1)
            one[0] = ms[0], one[1] = ms[1];
        printf("    %4d %10.3f %8.2fx %9.3f %8.2fx %12.2fx\n", rows, ms[0], ms[0] / one[0], ms[1],
               ms[1] / one[1], ms[1] / ms[0]);
        for (int a = 0; a < 3; a++)
            if (aims[a].rows == rows)
                print_aim(ms[0] / one[0] <= aims[a].aim, "%d verification rows %.2fx one row (aim <= %.2fx)",
                          rows, ms[0] / one[0], aims[a].aim);
    }
    *one_row_ms = one[0];
    return 0;
}

/* One-row decode calls at position 512 and at LONG_POS (a context of its
 * own), graphs on: what attention's length costs. */
static int long_context(const struct bench_opts *o, struct bench_model *m, float *logits_dev,
                        double at_prefix_ms)
{
    char err[ERR_MSG_MAX] = "";
    struct bench_model lc;
    if (second_ctx(&lc, m, LONG_POS + 64, false))
        return 1;
    const int calls = o->tokens < 20 ? o->tokens : 20;
    const int at[2] = {512, LONG_POS};
    double ms[2];
    for (int i = 0; i < 2; i++)
        if (fill(&lc, at[i], err) || time_rows(&lc, NULL, logits_dev, NULL, at[i], 1, calls, &ms[i])) {
            llama_ctx_destroy(lc.ctx);
            return die("long context", err);
        }
    printf("  decode one row at position %d: %.3f ms, at %d: %.3f ms (%.2fx)\n", at[0], ms[0],
           at[1], ms[1], ms[1] / ms[0]);
    print_aim(ms[0] <= 1.15 * at_prefix_ms, "decode at position %d %.2fx position %d (aim <= 1.15x)", at[0],
              ms[0] / at_prefix_ms, PREFIX);
    /* at LONG_POS, each attention kernel forced (the same bits) */
    static const enum kern_cuda_attn_path paths[2] = {KERN_CUDA_ATTN_PER_HEAD,
                                                      KERN_CUDA_ATTN_GROUPED};
    double pms[2];
    for (int p = 0; p < 2; p++)
        if (kern_cuda_set_attention_path(llama_ctx_backend(lc.ctx), paths[p], err) ||
            time_rows(&lc, NULL, logits_dev, NULL, at[1], 1, calls, &pms[p])) {
            llama_ctx_destroy(lc.ctx);
            return die("attention path", err);
        }
    if (kern_cuda_set_attention_path(llama_ctx_backend(lc.ctx), KERN_CUDA_ATTN_AUTO, err)) {
        llama_ctx_destroy(lc.ctx);
        return die("attention path", err);
    }
    printf("  decode at %d, attention per query head: %.3f ms, grouped per kv head: %.3f ms\n",
           at[1], pms[0], pms[1]);
    llama_ctx_destroy(lc.ctx);
    return 0;
}

/* A 512-token prompt, the last row's logits; ctx's graphs do not apply
 * (256-row chunks run eagerly as device steps). */
static int prefill(struct bench_model *m, float *logits_dev)
{
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be = llama_ctx_backend(m->ctx);
    const int vocab = llama_model_config(m->model)->vocab_size;
    int32_t *prompt = malloc(PREFILL * sizeof *prompt);
    if (!prompt)
        return die("prefill", "out of memory");
    for (int i = 0; i < PREFILL; i++)
        prompt[i] = (int32_t)((1000 + 7919 * i) % vocab);
    struct llama_seq_batch fb = {.slot = 0, .tokens = prompt, .n_tokens = PREFILL, .n_logits = 1,
                                 .logits_dev = logits_dev};
    const int reps = 5;
    double t0 = 0;
    int rc = 0;
    for (int r = 0; r <= reps && !rc; r++) {
        if (r == 1) {
            if ((rc = be->ops->sync(be, err)))
                break;
            t0 = now_s();
        }
        rc = llama_ctx_truncate(m->ctx, 0, 0, err) || llama_forward(m->ctx, &fb, 1, err);
    }
    free(prompt);
    if (rc || be->ops->sync(be, err))
        return die("prefill", err);
    const double prefill_ms = (now_s() - t0) * 1e3 / reps;
    printf("  prefill %d tokens: %.2f ms, %.0f tokens/s (%d runs)\n", PREFILL, prefill_ms,
           PREFILL * 1000.0 / prefill_ms, reps);
    return 0;
}

/* The logits of one verification (BITS_ROWS rows after a PREFIX-token
 * prefix, the tokens fill writes) on m, into host logits [BITS_ROWS][vocab]. */
static int verification_logits(struct bench_model *m, float *logits, char *err)
{
    const int vocab = llama_model_config(m->model)->vocab_size;
    int32_t ids[PREFIX + BITS_ROWS];
    for (int i = 0; i < PREFIX + BITS_ROWS; i++)
        ids[i] = (int32_t)((1000 + 7919 * (int64_t)i) % vocab);
    struct llama_seq_batch prefix = {.slot = 0, .tokens = ids, .n_tokens = PREFIX};
    struct llama_seq_batch rows = {.slot = 0, .tokens = ids + PREFIX, .n_tokens = BITS_ROWS,
                                   .n_logits = BITS_ROWS, .logits_out = logits};
    int rc = llama_ctx_truncate(m->ctx, 0, 0, err);
    if (!rc)
        rc = llama_forward(m->ctx, &prefix, 1, err);
    if (!rc)
        rc = llama_forward(m->ctx, &rows, 1, err);
    return rc;
}

/* Whether rows of a and b have the same argmax; *max_rel: the largest
 * |a - b| over the row's largest |logit|. */
static int agreeing_rows(const float *a, const float *b, int n_rows, int vocab, double *max_rel)
{
    int agree = 0;
    *max_rel = 0;
    for (int r = 0; r < n_rows; r++) {
        const float *ra = a + (size_t)r * vocab, *rb = b + (size_t)r * vocab;
        double scale = 0, diff = 0;
        for (int v = 0; v < vocab; v++) {
            scale = fabs(ra[v]) > scale ? fabs(ra[v]) : scale;
            diff = fabs(ra[v] - rb[v]) > diff ? fabs(ra[v] - rb[v]) : diff;
        }
        if (scale > 0 && diff / scale > *max_rel)
            *max_rel = diff / scale;
        agree += argmax_f32(ra, vocab) == argmax_f32(rb, vocab);
    }
    return agree;
}

/* One verification's logits three ways: graphs replayed (m), every kernel
 * launched one by one (eager), and the CPU backend, the reference the CUDA
 * kernels are checked against. Graphs and eager must agree bit for bit (the
 * same kernels); the CPU, in its own fixed order, within rounding: its
 * argmax on every row, and the largest difference printed. Skipped under
 * TANDEM_GPU_TEST_SHORT (the sanitizers' runs), where a CPU forward of the
 * 3B shape costs minutes. */
static int bits_check(const struct bench_opts *o, const char *dir, struct bench_model *m,
                      struct bench_model *eager)
{
    if (getenv("TANDEM_GPU_TEST_SHORT") != NULL) {
        printf("  bits: skipped (TANDEM_GPU_TEST_SHORT)\n");
        return 0;
    }
    char err[ERR_MSG_MAX] = "";
    const int vocab = llama_model_config(m->model)->vocab_size;
    const size_t n = (size_t)BITS_ROWS * (size_t)vocab;
    float *graphs = malloc(n * sizeof *graphs), *eager_l = malloc(n * sizeof *eager_l),
          *cpu_l = malloc(n * sizeof *cpu_l);
    struct kern_backend *cpu = NULL;
    struct bench_model cm = {0};
    int rc = graphs && eager_l && cpu_l ? 0 : error_set(err, ERR_NOMEM, "out of memory");
    if (!rc)
        rc = verification_logits(m, graphs, err);
    if (!rc)
        rc = verification_logits(eager, eager_l, err);
    if (!rc)
        rc = kern_cpu_create(&cpu, 0, err);
    if (!rc && load(&cm, dir, cpu, 1024, o->quantize))
        rc = error_set(err, ERR_INTERNAL, "the model on the cpu backend did not load");
    if (!rc)
        rc = verification_logits(&cm, cpu_l, err);
    if (!rc) {
        const bool same = memcmp(graphs, eager_l, n * sizeof *graphs) == 0;
        double rel = 0;
        const int agree = agreeing_rows(graphs, cpu_l, BITS_ROWS, vocab, &rel);
        printf("  bits, one verification of %d rows after %d tokens: graphs %s eager; cpu argmax on %d of "
               "%d rows, largest |cuda - cpu| %.2e of the row's largest logit\n",
               BITS_ROWS, PREFIX, same ? "==" : "!=", agree, BITS_ROWS, rel);
        print_aim(same, "graphs == eager, bit for bit");
        print_aim(agree == BITS_ROWS, "cuda argmax == cpu argmax on every row");
    }
    if (cm.model != NULL)
        unload(&cm);
    if (cpu != NULL)
        cpu->ops->destroy(cpu);
    free(graphs);
    free(eager_l);
    free(cpu_l);
    return rc ? die("bits", err) : 0;
}

static int bench_preset(const struct bench_opts *o, struct kern_backend *be, const char *preset,
                        double read_gbs)
{
    char err[ERR_MSG_MAX] = "";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", o->models_dir, preset);
    if (ensure_model(dir, preset, 1, NULL, 0))
        return 1;
    struct bench_model m, eager;
    if (load(&m, dir, be, 1024, o->quantize))
        return 1;
    if (second_ctx(&eager, &m, 1024, true)) {
        unload(&m);
        return 1;
    }
    const double bytes = (double)llama_model_weight_bytes_per_token(m.model);
    const double floor_ms = bytes / (read_gbs * 1e6);
    printf("\n%s: %.1f MB of weights per token, floor %.3f ms/token at %.1f GB/s\n", preset,
           bytes / 1e6, floor_ms, read_gbs);
    const int vocab = llama_model_config(m.model)->vocab_size;
    float *logits_dev = NULL;
    int rc = be->ops->alloc(be, (size_t)ROWS_MAX * (size_t)vocab * sizeof(float),
                            (void **)&logits_dev, err);
    if (rc)
        rc = die("logits buffer", err);
    double one_row_ms = 0;
    if (!rc)
        rc = bits_check(o, dir, &m, &eager);
    if (!rc)
        rc = decode_table(o, preset, &m, &eager, floor_ms);
    if (!rc)
        rc = verify_table(o, &m, &eager, logits_dev, &one_row_ms);
    if (!rc)
        rc = long_context(o, &m, logits_dev, one_row_ms);
    if (!rc)
        rc = prefill(&m, logits_dev);
    if (!rc) {
        print_graphs("graphs context", m.ctx);
        print_graphs("eager context", eager.ctx);
    }
    be->ops->free(be, logits_dev);
    llama_ctx_destroy(eager.ctx);
    unload(&m);
    return rc;
}

int bench_runtime_cuda(const struct bench_opts *o, struct kern_backend *be)
{
    char err[ERR_MSG_MAX] = "", uuid[KERN_CUDA_UUID_MAX] = "";
    if (kern_cuda_device_uuid(be, uuid, err))
        return die("cuda device", err);
    struct kern_cuda_read_bw bw;
    if (kern_cuda_read_bandwidth(be, (size_t)4 << 30, 5, &bw, err))
        return die("read bandwidth", err);
    printf("cuda backend: device %s (%s), %.1f of %.1f GiB free\n", o->device, uuid,
           (double)bw.free_bytes / (1u << 30), (double)bw.total_bytes / (1u << 30));
    printf("read bandwidth (one kernel reading %zu MiB, best of %d passes): %.1f GB/s\n",
           bw.size_bytes >> 20, bw.passes, bw.read_gbs);
    printf("matmul: the tiled kernel from %d rows (TANDEM_CUDA_MM_TILED_MIN_ROWS; fewer rows: "
           "the skinny kernels)\n", kern_cuda_matmul_tiled_min_rows(be));
    char list[256];
    snprintf(list, sizeof list, "%s", o->presets);
    for (char *save = NULL, *preset = strtok_r(list, ",", &save); preset;
         preset = strtok_r(NULL, ",", &save))
        if (bench_preset(o, be, preset, bw.read_gbs))
            return 1;
    return 0;
}
#else
/* Unreachable: without the CUDA backend no "cuda" backend can be made. */
int bench_runtime_cuda(const struct bench_opts *o, struct kern_backend *be)
{
    (void)o;
    (void)be;
    return die("runtime", "this build has no CUDA backend");
}
#endif
