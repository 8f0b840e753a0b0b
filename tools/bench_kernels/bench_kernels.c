/* bench_kernels.c: tandem-bench-kernels, the matmul kernels against their
 * ceilings: the CPU backend against the machine's memory bandwidth, or
 * (--backend cuda) the CUDA backend's batch-invariant GEMM against cuBLAS.
 *
 * CPU (the default) prints:
 *   - read bandwidth with T threads (tools/bench/read_bw.h: the best of
 *     several read-only loops over 1 GiB), the ceiling of a decode step, and
 *     beside it memcpy ((bytes read + bytes written) / time), labelled, for
 *     reference only. That figure is taken once, before the matmuls; the %read column sets
 *     each round's matmul against a read of a 512 MiB buffer made in the
 *     same round (read_bw_measure_regions, one pass of each loop), the
 *     median of those shares: one figure at the start was 40 GB/s where
 *     the rounds' reads that followed were 60-90, and every shape then
 *     read at "158-177%".
 *   - %own: each round's matmul against a read of the shape's own weight
 *     copies in the same round (the bytes the matmul reads, in the pages
 *     they were placed in): on this VM one process's buffers read at
 *     55-62 or at 74 GB/s by where they landed, side by side, so a fresh
 *     buffer is not always the weights' ceiling.
 *   - for bf16 weights of the Llama-3.2-1B shapes 2048->2048 (q, o),
 *     2048->512 (k, v), 2048->8192 (gate, up), 8192->2048 (down) and
 *     2048->128256 (LM head) and n = 1..17 input rows: time per matmul call,
 *     weight bytes read per second, that as a percentage of read bandwidth,
 *     and the time relative to n = 1 (speculative verification needs
 *     n = 2..17 to cost about as much as n = 1), also as one "ratio" line per
 *     shape.
 *     Every n is measured once in each of R rounds (a slice of S seconds
 *     each, the order rotated from round to round). us/call and GB/s are
 *     the best round's; t(n)/t1 is the median over the rounds of that
 *     round's time for n over its time for n = 1, with the quartiles on
 *     the "ratio" line: on this noisy VM the memory bus swings by 2x over
 *     seconds, and the best n = 1 and the best n = 2 of a few long rounds
 *     often come from different phases (2 rows read 1.15-1.22x one row
 *     that way, 1.00-1.03x as the median of 40 paired 40 ms slices, the
 *     same build in the same minute).
 * Weights are rotated through enough copies (>= 256 MiB in all) that no call
 * finds its matrix in the last-level cache.
 *
 * CUDA (--backend cuda [--device D]) prints, for bf16 weights of the
 * Llama-3.2-3B shapes 3072->3072 (q, o), 3072->1024 (k, v), 3072->8192
 * (gate, up), 8192->3072 (down) and 3072->128256 (LM head):
 *   - at n = 16, 64, 256, 512 rows: the batch-invariant GEMM (the op
 *     table's matmul) and cuBLAS (cublasGemmEx on bf16-rounded activations,
 *     f32 accumulation: the path prefill took before), ms per call, the
 *     invariant GEMM's speed as a percentage of cuBLAS's (aim: >= 90%),
 *     weight GB/s and TFLOP/s (2 n d_in d_out per call) of both;
 *   - per shape, microseconds per call of every path of
 *     kern_cuda_matmul_path (auto, skinny, the tiled kernel in each block
 *     shape, cuBLAS) at n = 1, 2, 4, 8, 9, 12, 16, 17, 32, 64, 128, 256, 512
 *     (skinny only up to 64): where the kernels cross over, for
 *     MM_TILED_MIN_ROWS and mm_pick_cfg in kernels/cuda/matmul.cu.
 *   Times are CUDA events around back-to-back calls on the backend's stream
 *   (R rounds, the best kept), weights rotated through >= 256 MiB of copies
 *   (H100: 50 MB of L2). Without a usable GPU, or in a build without the
 *   CUDA backend, it prints "no GPU" with the reason and exits 77.
 *
 * Usage: tandem-bench-kernels [--threads N] [--seconds S] [--rounds R]
 *                             [--shapes DINxDOUT,...] [--rows N,...] [--cpu-time] [--hot]
 *                             [--row-major | --layouts]
 *        tandem-bench-kernels --backend cuda [--device D] [--seconds S] [--rounds R]
 *   N: backend threads (0 = one per online core, the default)
 *   S: minimum seconds per measurement (default 0.05)
 *   R: rounds per shape (default 25; cuda: 3; at most BENCH_ROUNDS_MAX)
 *   D: CUDA device, an ordinal or a GPU UUID (default "0")
 *   --cpu-time (CPU): time the matmuls in process CPU time (see bench_clock)
 *   --hot (CPU): one copy of the weights, not rotated: with a shape that fits
 *   in L2 (e.g. 2048x128, 512 KiB) this times the kernel's arithmetic
 *   without the memory bus, the ceiling it sets on n rows per weight
 *   --row-major (CPU): the weights as the caller wrote them; by default they
 *   are mapped as a model maps its matrices (map_matrix: on an AVX-512 CPU,
 *   bf16 rows of a multiple of 32 are packed, kernels/cpu/packed.h), which a
 *   shape under 2 MiB is not (only copies are packed), --hot's included
 *   --bf16-dot (CPU): as --layouts, the second copies mapped with the
 *   backend's bf16 dot on (vdpbf16ps, bf16 activations, its line octets)
 *   against the first on the f32 paths (kern_cpu_set_bf16_dot off while
 *   they were mapped): the two products side by side in one process
 *   --layouts (CPU): both, side by side: every copy mapped both ways
 *   (map_matrix, and map_weights for the row-major copy, so both sit in
 *   the backend's own memory), each n timed on one then the other in turn,
 *   and the ratio of the two printed: what the packed layout gains or
 *   loses at each n, figures taken seconds apart on this noisy machine
 *   --shapes, --rows (CPU): only these shapes and row counts (n = 1, the
 *   base of the ratios, is always measured), e.g. --shapes
 *   2048x8192,8192x2048,2048x128256 --rows 2,3,5,9,17: a minute's run
 *   instead of several when comparing two builds of a kernel. --rows takes
 *   counts up to BENCH_ROWS_MAX (128), at most BENCH_N_MAX of them: prefill
 *   chunks too, e.g. --shapes 2048x8192,8192x2048 --rows 18,32,64,128.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "error.h"
#include "kernels.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels_cuda.h"
#endif
#include "read_bw.h"

#define BENCH_MIB (1024.0 * 1024.0)
#define BENCH_N_MAX 17 /* row counts measured per shape: 1..BENCH_N_MAX by default, and at
                        * most this many with --rows */
/* --rows may ask for up to BENCH_N_MAX row counts of up to this many rows:
 * prefill-sized calls, which take another path than 1..17 rows */
#define BENCH_ROWS_MAX 128
#define BENCH_ROUNDS_MAX 200
#define BENCH_READ_BYTES ((size_t)512 << 20) /* each round's read (see %read) */
#define BENCH_N_SHAPES 5
#define BENCH_SHAPES_MAX 16 /* --shapes */

/* --cpu-time: the CPU matmul figures in process CPU time instead of wall
 * time. With --threads 1 on a machine shared with other jobs, CPU time does
 * not count the slices the scheduler gives to others (the memory bus is still
 * shared); with more threads it also counts the pool's spinning. */
static clockid_t bench_clock = CLOCK_MONOTONIC;

struct round_quartiles {
    double q1, median, q3;
};

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Quartiles of v[0..n) (n <= BENCH_ROUNDS_MAX), interpolated between ranks. */
static struct round_quartiles quartiles(const double *v, int n)
{
    double sorted[BENCH_ROUNDS_MAX];
    memcpy(sorted, v, (size_t)n * sizeof(*v));
    qsort(sorted, (size_t)n, sizeof(*sorted), cmp_double);
    double at[3];
    for (int q = 0; q < 3; q++) {
        const double rank = (double)(q + 1) * 0.25 * (double)(n - 1);
        const int lo = (int)rank;
        const int hi = lo + 1 < n ? lo + 1 : lo;
        at[q] = sorted[lo] + (rank - (double)lo) * (sorted[hi] - sorted[lo]);
    }
    return (struct round_quartiles){at[0], at[1], at[2]};
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x1234567;

static uint16_t rand_bf16(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    /* a value in [-1, 1): sign, exponent 110..126, random mantissa */
    return (uint16_t)(((rng_state >> 8) & 0x8000) | ((110 + (rng_state >> 20) % 17) << 7) |
                      ((rng_state >> 40) & 0x7f));
}

/* ---- CUDA: the batch-invariant GEMM against cuBLAS ---------------------- */

#define CB_N_SHAPES 5
#define CB_PATHS 6

#ifdef TANDEM_HAVE_CUDA
static const struct {
    const char *name;
    int d_in, d_out;
} cb_shapes[CB_N_SHAPES] = {
    {"q/o", 3072, 3072}, {"k/v", 3072, 1024}, {"gate/up", 3072, 8192},
    {"down", 8192, 3072}, {"lm_head", 3072, 128256},
};

static const enum kern_cuda_mm_path cb_paths[CB_PATHS] = {
    KERN_CUDA_MM_AUTO,        KERN_CUDA_MM_SKINNY,      KERN_CUDA_MM_TILED_32X32,
    KERN_CUDA_MM_TILED_16X32, KERN_CUDA_MM_TILED_16X16, KERN_CUDA_MM_CUBLAS,
};
static const char *const cb_path_names[CB_PATHS] = {"auto",   "skinny", "t32x32",
                                                    "t16x32", "t16x16", "cublas"};

/* Best ms per call of one path over `rounds` rounds of at least min_s. */
static int cb_time(struct kern_backend *be, enum kern_cuda_mm_path path, float *out,
                   const float *in, const void *const *w, int n_w, int n, int d_in, int d_out,
                   int rounds, double min_s, double *best_ms, char *err)
{
    double ms = 0;
    /* warm up (and size the call count from one call) */
    int rc = kern_cuda_matmul_time(be, path, out, in, w, n_w, KERN_DTYPE_BF16, n, d_in, d_out, 1,
                                   &ms, err);
    if (rc < 0)
        return rc;
    long calls = ms > 0 ? (long)(min_s * 1e3 / ms) + 1 : 1000;
    if (calls < n_w)
        calls = n_w;
    if (calls > 100000)
        calls = 100000;
    *best_ms = 1e30;
    for (int r = 0; r < rounds; r++) {
        rc = kern_cuda_matmul_time(be, path, out, in, w, n_w, KERN_DTYPE_BF16, n, d_in, d_out,
                                   (int)calls, &ms, err);
        if (rc < 0)
            return rc;
        if (ms < *best_ms)
            *best_ms = ms;
    }
    return 0;
}
#endif

static int bench_cuda(const char *device, double min_s, int rounds)
{
#ifndef TANDEM_HAVE_CUDA
    (void)device, (void)min_s, (void)rounds;
    printf("tandem-bench-kernels: no GPU: this build has no CUDA backend (configure with "
           "-DTANDEM_CUDA=ON)\n");
    return 77;
#else
    char err[ERR_MSG_MAX] = "";
    int count = 0;
    if (kern_cuda_device_count(&count, err) != 0) {
        printf("tandem-bench-kernels: no GPU: %s\n", err);
        return 77;
    }
    if (count == 0) {
        printf("tandem-bench-kernels: no GPU: no CUDA device is visible\n");
        return 77;
    }
    struct kern_backend *be = NULL;
    if (kern_cuda_create(&be, device, err) != 0) {
        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
        return 1;
    }
    char uuid[KERN_CUDA_UUID_MAX] = "";
    if (kern_cuda_device_uuid(be, uuid, err) != 0)
        snprintf(uuid, sizeof(uuid), "?");
    printf("device %s (%s)\n", device, uuid);
    printf("bf16 weights, Llama-3.2-3B shapes; CUDA events, best of %d rounds of >= %.2f s\n",
           rounds, min_s);

    static const int ns[] = {1, 2, 4, 8, 9, 12, 16, 17, 32, 64, 128, 256, 512};
    const int n_ns = (int)(sizeof(ns) / sizeof(ns[0]));
    const int n_max = 512;
    /* [shape][n index][path] ms; < 0: not measured */
    static double ms_tab[CB_N_SHAPES][13][CB_PATHS]; /* 13: ns */
    int rc = 0;
    for (int si = 0; si < CB_N_SHAPES && rc == 0; si++) {
        const int d_in = cb_shapes[si].d_in, d_out = cb_shapes[si].d_out;
        const size_t w_bytes = (size_t)d_in * (size_t)d_out * 2;
        int copies = (int)((256.0 * BENCH_MIB + (double)w_bytes - 1) / (double)w_bytes);
        copies = copies < 1 ? 1 : copies > 64 ? 64 : copies;
        void *w[64] = {0};
        float *in = NULL, *out = NULL;
        uint16_t *host_w = malloc(w_bytes);
        float *host_x = malloc((size_t)n_max * d_in * sizeof(float));
        if (!host_w || !host_x) {
            fprintf(stderr, "tandem-bench-kernels: out of host memory\n");
            rc = 1;
        }
        for (size_t k = 0; rc == 0 && k < w_bytes / 2; k++)
            host_w[k] = rand_bf16();
        for (int k = 0; rc == 0 && k < n_max * d_in; k++)
            host_x[k] = (float)((k * 37) % 101) / 101.0f - 0.5f;
        for (int c = 0; rc == 0 && c < copies; c++)
            if (be->ops->alloc(be, w_bytes, &w[c], err) != 0 ||
                be->ops->upload(be, w[c], host_w, w_bytes, err) != 0)
                rc = 1;
        if (rc == 0 &&
            (be->ops->alloc(be, (size_t)n_max * d_in * sizeof(float), (void **)&in, err) != 0 ||
             be->ops->upload(be, in, host_x, (size_t)n_max * d_in * sizeof(float), err) != 0 ||
             be->ops->alloc(be, (size_t)n_max * d_out * sizeof(float), (void **)&out, err) != 0))
            rc = 1;
        for (int ni = 0; rc == 0 && ni < n_ns; ni++)
            for (int p = 0; rc == 0 && p < CB_PATHS; p++) {
                ms_tab[si][ni][p] = -1;
                if (cb_paths[p] == KERN_CUDA_MM_SKINNY && ns[ni] > 64)
                    continue; /* groups of 17 rows: minutes, and beside the point */
                if (cb_time(be, cb_paths[p], out, in, (const void *const *)w, copies, ns[ni],
                            d_in, d_out, rounds, min_s, &ms_tab[si][ni][p], err) != 0)
                    rc = 1;
            }
        if (rc != 0)
            fprintf(stderr, "tandem-bench-kernels: %s %d -> %d: %s\n", cb_shapes[si].name, d_in,
                    d_out, err);
        for (int c = 0; c < copies; c++)
            be->ops->free(be, w[c]);
        be->ops->free(be, in);
        be->ops->free(be, out);
        free(host_w);
        free(host_x);
    }
    if (rc != 0) {
        be->ops->destroy(be);
        return rc;
    }

    printf("\nbatch-invariant GEMM (auto) vs cuBLAS (cublasGemmEx, bf16 activations)\n");
    printf("%-8s %-15s %4s %9s %9s %8s %9s %9s %8s %8s\n", "shape", "d_in -> d_out", "n",
           "inv ms", "cuBLAS ms", "% cuBLAS", "inv GB/s", "cub GB/s", "inv TF/s", "cub TF/s");
    static const int table_ns[4] = {16, 64, 256, 512};
    for (int si = 0; si < CB_N_SHAPES; si++)
        for (int ti = 0; ti < 4; ti++) {
            int ni = 0;
            while (ns[ni] != table_ns[ti])
                ni++;
            const int n = ns[ni], d_in = cb_shapes[si].d_in, d_out = cb_shapes[si].d_out;
            const double inv = ms_tab[si][ni][0], cub = ms_tab[si][ni][5];
            const double wb = (double)d_in * d_out * 2, flop = 2.0 * n * d_in * d_out;
            char label[32];
            snprintf(label, sizeof(label), "%d -> %d", d_in, d_out);
            printf("%-8s %-15s %4d %9.4f %9.4f %7.0f%% %9.0f %9.0f %8.1f %8.1f\n",
                   cb_shapes[si].name, label, n, inv, cub, 100.0 * cub / inv, wb / inv / 1e6,
                   wb / cub / 1e6, flop / inv / 1e9, flop / cub / 1e9);
        }
    printf("%% cuBLAS = cuBLAS time / invariant time (aim: >= 90%%)\n");

    printf("\nus per call by path (auto = the op table's choice)\n");
    for (int si = 0; si < CB_N_SHAPES; si++) {
        printf("%s %d -> %d\n%5s", cb_shapes[si].name, cb_shapes[si].d_in, cb_shapes[si].d_out,
               "n");
        for (int p = 0; p < CB_PATHS; p++)
            printf(" %9s", cb_path_names[p]);
        printf("\n");
        for (int ni = 0; ni < n_ns; ni++) {
            printf("%5d", ns[ni]);
            for (int p = 0; p < CB_PATHS; p++) {
                if (ms_tab[si][ni][p] < 0)
                    printf(" %9s", "-");
                else
                    printf(" %9.1f", ms_tab[si][ni][p] * 1e3);
            }
            printf("\n");
        }
        /* where the skinny kernels beat every tiled shape (MM_TILED_MIN_ROWS,
         * kernels/cuda/matmul_skinny.cuh, is set from these), and one row's
         * read rate (its floor: the weights once) */
        printf("  skinny faster than every tiled shape at n =");
        for (int ni = 0; ni < n_ns; ni++) {
            double tiled = 1e30;
            for (int p = 2; p <= 4; p++) /* t32x32, t16x32, t16x16 */
                if (ms_tab[si][ni][p] >= 0 && ms_tab[si][ni][p] < tiled)
                    tiled = ms_tab[si][ni][p];
            if (ms_tab[si][ni][1] >= 0 && ms_tab[si][ni][1] < tiled)
                printf(" %d", ns[ni]);
        }
        const double w1 = (double)cb_shapes[si].d_in * cb_shapes[si].d_out * 2;
        printf("\n  one row (auto): %.0f GB/s of weights\n", w1 / ms_tab[si][0][0] / 1e6);
    }
    be->ops->destroy(be);
    return 0;
#endif
}

/* "2048x8192,8192x2048" -> shapes; prints the reason and returns -1 when bad. */
static int parse_shapes(const char *arg, int shapes[][2], int *n_shapes)
{
    int n = 0;
    for (const char *p = arg; *p;) {
        char *end;
        long d_in = strtol(p, &end, 10), d_out = 0;
        if (end != p && *end == 'x')
            d_out = strtol(p = end + 1, &end, 10);
        if (end == p || d_in < 1 || d_out < 1 || d_in > 65536 || d_out > 1 << 20 ||
            (*end != ',' && *end != '\0') || n == BENCH_SHAPES_MAX) {
            fprintf(stderr,
                    "tandem-bench-kernels: --shapes: expected up to %d DINxDOUT (d_in 1..65536, "
                    "d_out 1..1048576) separated by commas, got \"%s\"\n",
                    BENCH_SHAPES_MAX, arg);
            return -1;
        }
        shapes[n][0] = (int)d_in;
        shapes[n][1] = (int)d_out;
        n++;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "tandem-bench-kernels: --shapes: empty\n");
        return -1;
    }
    *n_shapes = n;
    return 0;
}

/* "2,5,17" -> 1,2,5,17 (n = 1 first: the ratios' base), each 1..BENCH_ROWS_MAX
 * once, ascending, at most BENCH_N_MAX of them; prints the reason and
 * returns -1 when bad. */
static int parse_rows(const char *arg, int *ns, int *n_ns)
{
    int want[BENCH_ROWS_MAX + 1] = {0};
    want[1] = 1;
    for (const char *p = arg; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 1 || n > BENCH_ROWS_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr,
                    "tandem-bench-kernels: --rows: expected row counts 1..%d separated by "
                    "commas, got \"%s\"\n",
                    BENCH_ROWS_MAX, arg);
            return -1;
        }
        want[n] = 1;
        p = *end ? end + 1 : end;
    }
    *n_ns = 0;
    for (int n = 1; n <= BENCH_ROWS_MAX; n++)
        if (want[n]) {
            if (*n_ns == BENCH_N_MAX) {
                fprintf(stderr,
                        "tandem-bench-kernels: --rows: at most %d row counts (1 included), "
                        "got \"%s\"\n",
                        BENCH_N_MAX, arg);
                return -1;
            }
            ns[(*n_ns)++] = n;
        }
    return 0;
}

/* What a CPU matmul run measures, from the command line. */
struct bench_cpu_opts {
    int threads, rounds, hot, row_major, layouts;
    int bf16_dot; /* --bf16-dot: the second copies on vdpbf16ps, not row-major */
    double min_s;
    const int *ns; /* row counts, ascending */
    int n_ns;
    const void *read_buf; /* BENCH_READ_BYTES read each round for %read */
};

/* The weight copies of one shape and the buffers its calls use. */
struct bench_shape_bufs {
    int copies;
    size_t w_bytes;
    void *w[160], *host[160], *w_rm[160]; /* w_rm: --layouts' row-major copies; 160: the most copies */
    float *in, *out;
};

/* Each round: the reads %read is taken against, then every row count in
 * both layouts (rotated: no n always follows the same neighbour). Best and
 * per-round times per call into best / per_round, [layout][n]. */
static int bench_shape_rounds(struct kern_backend *be, const struct bench_cpu_opts *o, int d_in, int d_out,
                              const struct bench_shape_bufs *b, double best[2][BENCH_N_MAX],
                              double per_round[2][BENCH_N_MAX][BENCH_ROUNDS_MAX], double *read_per_round,
                              double *own_per_round)
{
    char err[ERR_MSG_MAX] = "";
    const int threads = o->threads, rounds = o->rounds, n_ns = o->n_ns, copies = b->copies;
    const int n_layouts = o->layouts ? 2 : 1;
    const size_t w_bytes = b->w_bytes;
    const double min_s = o->min_s;
    const int *ns = o->ns;
    float *in = b->in, *out = b->out;
    void *const *w = b->w;
    void *const *w_rm = b->w_rm;
    const void *const read_region[1] = {o->read_buf};
    const size_t read_region_bytes[1] = {BENCH_READ_BYTES};
    for (int ni = 0; ni < n_ns; ni++)
        best[0][ni] = best[1][ni] = 1e30;
    for (int round = 0; round < rounds; round++) {
        struct read_bw_result rr;
        if (read_bw_measure_regions(&rr, threads, read_region, read_region_bytes, 1, 1, err,
                                    sizeof err) != 0) {
            fprintf(stderr, "tandem-bench-kernels: %s\n", err);
            return 1;
        }
        read_per_round[round] = rr.read_gbs;
        /* the same bytes the matmuls read: a fresh buffer may sit in
         * faster or slower memory than the weights (see own_per_round) */
        const void *own_regions[160];
        size_t own_bytes[160];
        for (int c = 0; c < copies; c++) {
            own_regions[c] = w[c];
            own_bytes[c] = w_bytes;
        }
        if (read_bw_measure_regions(&rr, threads, own_regions, own_bytes, copies, 1, err,
                                    sizeof err) != 0) {
            fprintf(stderr, "tandem-bench-kernels: %s\n", err);
            return 1;
        }
        own_per_round[round] = rr.read_gbs;
        for (int slot = 0; slot < n_ns; slot++)
            for (int l = 0; l < n_layouts; l++) {
                /* rotated: no n always follows the same neighbour */
                const int ni = (slot + round) % n_ns;
                void *const *wl = l ? w_rm : w;
                const int n = ns[ni];
                long calls = 0;
                double t0 = now_s(), dt;
                do {
                    if (be->ops->matmul(be, out, in, wl[calls % copies], KERN_DTYPE_BF16, n,
                                        d_in, d_out, err) != 0) {
                        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
                        return 1;
                    }
                    calls++;
                    dt = now_s() - t0;
                } while (dt < min_s || calls < copies);
                double per_call = dt / (double)calls;
                best[l][ni] = per_call < best[l][ni] ? per_call : best[l][ni];
                per_round[l][ni][round] = per_call;
            }
    }
    return 0;
}

/* Prints one shape's rows: best time per call, GB/s, %read, %own and the
 * medians (and quartiles) of each round's own ratios. */
static void bench_shape_report(const struct bench_cpu_opts *o, int d_in, int d_out, size_t w_bytes,
                               double best[2][BENCH_N_MAX], double per_round[2][BENCH_N_MAX][BENCH_ROUNDS_MAX],
                               const double *read_per_round, const double *own_per_round)
{
    const int rounds = o->rounds, n_ns = o->n_ns, layouts = o->layouts;
    const int *ns = o->ns;
    char label[32];
    snprintf(label, sizeof(label), "%d -> %d", d_in, d_out);
    /* [0]: t(n)/t(1), [1]: mapped / row-major, each round's own */
    struct round_quartiles ratio[2][BENCH_N_MAX], share_of_read[BENCH_N_MAX],
        share_of_own[BENCH_N_MAX];
    for (int ni = 0; ni < n_ns; ni++) {
        double r[4][BENCH_ROUNDS_MAX];
        for (int round = 0; round < rounds; round++) {
            r[2][round] = (double)w_bytes / per_round[0][ni][round] / 1e9 /
                          read_per_round[round];
            r[3][round] = (double)w_bytes / per_round[0][ni][round] / 1e9 /
                          own_per_round[round];
            r[0][round] = per_round[0][ni][round] / per_round[0][0][round];
            r[1][round] = layouts ? per_round[0][ni][round] / per_round[1][ni][round] : 1.0;
        }
        ratio[0][ni] = quartiles(r[0], rounds);
        ratio[1][ni] = quartiles(r[1], rounds);
        share_of_read[ni] = quartiles(r[2], rounds);
        share_of_own[ni] = quartiles(r[3], rounds);
    }
    for (int ni = 0; ni < n_ns; ni++) {
        double gbs = (double)w_bytes / best[0][ni] / 1e9;
        printf("%-18s %3d %11.1f %10.1f %8.0f%% %8.0f%% %8.2f", label, ns[ni],
               best[0][ni] * 1e6, gbs, 100.0 * share_of_read[ni].median,
               100.0 * share_of_own[ni].median, ratio[0][ni].median);
        if (layouts)
            printf(" %14.1f %11.2fx", best[1][ni] * 1e6, ratio[1][ni].median);
        printf("\n");
    }
    printf("ratio %-12s", label);
    for (int ni = 0; ni < n_ns; ni++)
        printf(" n%d:%.2f[%.2f-%.2f]", ns[ni], ratio[0][ni].median, ratio[0][ni].q1,
               ratio[0][ni].q3);
    const struct round_quartiles read_q = quartiles(read_per_round, rounds);
    const struct round_quartiles own_q = quartiles(own_per_round, rounds);
    printf("  (median [quartiles] over %d rounds; their reads %.1f [%.1f-%.1f] GB/s, of the "
           "weights' own copies %.1f [%.1f-%.1f])\n",
           rounds, read_q.median, read_q.q1, read_q.q3, own_q.median, own_q.q1, own_q.q3);
    if (layouts) {
        printf("layout %-11s", label);
        for (int ni = 0; ni < n_ns; ni++)
            printf(" n%d:%.2f", ns[ni], ratio[1][ni].median);
        printf("  (time as mapped / time %s, median of the rounds)\n",
               o->bf16_dot ? "on vdpbf16ps" : "row-major");
    }
}

/* One shape: its weight copies made and mapped as a model maps them,
 * warmed up, timed, reported and freed. */
static int bench_shape(struct kern_backend *be, const struct bench_cpu_opts *o, int d_in, int d_out)
{
    char err[ERR_MSG_MAX] = "";
    const int hot = o->hot, row_major = o->row_major, layouts = o->layouts;
    static struct bench_shape_bufs bufs;
    struct bench_shape_bufs *b = &bufs;
    memset(b, 0, sizeof *b);
    const size_t w_bytes = b->w_bytes = (size_t)d_in * (size_t)d_out * 2;
    int copies = (int)((256.0 * BENCH_MIB + (double)w_bytes - 1) / (double)w_bytes);
    copies = copies < 1 || hot ? 1 : copies > 160 ? 160 : copies; /* 160: w[] */
    void **w = b->w, **host = b->host, **w_rm = b->w_rm;
    for (int c = 0; c < copies; c++) {
        if (be->ops->alloc(be, w_bytes, &host[c], err) != 0) {
            fprintf(stderr, "tandem-bench-kernels: %s\n", err);
            return 1;
        }
        uint16_t *p = host[c];
        for (size_t k = 0; k < w_bytes / 2; k++)
            p[k] = rand_bf16();
        /* as a model maps its matrices (its own layout, huge pages); with
         * --bf16-dot, for the f32 paths */
        if (o->bf16_dot && kern_cpu_set_bf16_dot(be, 0, err) != 0) {
            fprintf(stderr, "tandem-bench-kernels: %s\n", err);
            return 1;
        }
        const void *mapped = host[c];
        if (!row_major && be->ops->map_matrix &&
            be->ops->map_matrix(be, host[c], KERN_DTYPE_BF16, d_out, d_in, &mapped, err) != 0) {
            fprintf(stderr, "tandem-bench-kernels: %s\n", err);
            return 1;
        }
        w[c] = (void *)(uintptr_t)mapped;
        if (layouts && o->bf16_dot) {
            /* the same bytes mapped for vdpbf16ps; a matrix keeps the path
             * it was mapped for (kernels.h), so both sets run side by side */
            const void *bd = NULL;
            if (kern_cpu_set_bf16_dot(be, 1, err) != 0 ||
                be->ops->map_matrix(be, host[c], KERN_DTYPE_BF16, d_out, d_in, &bd, err) != 0) {
                fprintf(stderr, "tandem-bench-kernels: %s\n", err);
                return 1;
            }
            w_rm[c] = (void *)(uintptr_t)bd;
        } else if (layouts) {
            const void *rm = NULL;
            if (be->ops->map_weights(be, host[c], w_bytes, &rm, err) != 0) {
                fprintf(stderr, "tandem-bench-kernels: %s\n", err);
                return 1;
            }
            w_rm[c] = (void *)(uintptr_t)rm;
        }
    }
    float *in = NULL, *out = NULL;
    const int n_top = o->ns[o->n_ns - 1]; /* ascending */
    if (be->ops->alloc(be, (size_t)n_top * d_in * sizeof(float), (void **)&in, err) != 0 ||
        be->ops->alloc(be, (size_t)n_top * d_out * sizeof(float), (void **)&out, err) !=
            0) {
        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
        return 1;
    }
    for (int k = 0; k < n_top * d_in; k++)
        in[k] = (float)((k * 37) % 101) / 101.0f - 0.5f;
    const int n_layouts = layouts ? 2 : 1;
    for (int l = 0; l < n_layouts; l++)
        for (int c = 0; c < copies; c++) /* warm up: page in every copy */
            if (be->ops->matmul(be, out, in, l ? w_rm[c] : w[c], KERN_DTYPE_BF16, 1, d_in,
                                d_out, err) != 0) {
                fprintf(stderr, "tandem-bench-kernels: %s\n", err);
                return 1;
            }
    b->copies = copies;
    b->in = in;
    b->out = out;
    static double best[2][BENCH_N_MAX];
    static double per_round[2][BENCH_N_MAX][BENCH_ROUNDS_MAX];
    double read_per_round[BENCH_ROUNDS_MAX], own_per_round[BENCH_ROUNDS_MAX];
    if (bench_shape_rounds(be, o, d_in, d_out, b, best, per_round, read_per_round, own_per_round) != 0)
        return 1;
    bench_shape_report(o, d_in, d_out, w_bytes, best, per_round, read_per_round, own_per_round);
    for (int c = 0; c < copies; c++) {
        if (layouts && w_rm[c] != host[c])
            be->ops->unmap_weights(be, w_rm[c]);
        if (w[c] != host[c])
            be->ops->unmap_weights(be, w[c]);
        be->ops->free(be, host[c]);
    }
    be->ops->free(be, in);
    be->ops->free(be, out);
    return 0;
}

/* A matmul small enough that dispatching it over the threads is what it
 * costs. */
static int bench_small_matmul(struct kern_backend *be, int threads, double min_s)
{
    char err[ERR_MSG_MAX] = "";
    float *x = NULL, *y = NULL;
    const void *wsmall;
    void *wbuf = NULL;
    if (be->ops->alloc(be, (size_t)512 * 64 * 2, &wbuf, err) != 0 ||
        be->ops->alloc(be, 512 * sizeof(float), (void **)&x, err) != 0 ||
        be->ops->alloc(be, 64 * sizeof(float), (void **)&y, err) != 0) {
        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
        return 1;
    }
    wsmall = wbuf;
    long calls = 0;
    double t0 = now_s(), dt;
    do {
        if (be->ops->matmul(be, y, x, wsmall, KERN_DTYPE_BF16, 1, 512, 64, err) != 0) {
            fprintf(stderr, "tandem-bench-kernels: %s\n", err);
            return 1;
        }
        calls++;
        dt = now_s() - t0;
    } while (dt < min_s);
    printf("\nsmall matmul 512 -> 64 (n=1, split over %d threads): %.2f us/call\n", threads,
           dt / (double)calls * 1e6);
    be->ops->free(be, wbuf);
    be->ops->free(be, x);
    be->ops->free(be, y);
    return 0;
}

int main(int argc, char **argv)
{
    int n_threads = 0;
    double min_s = -1;
    int rounds = -1;
    const char *backend = "cpu", *device = "0";
    int shapes[BENCH_SHAPES_MAX][2] = {
        {2048, 2048}, {2048, 512}, {2048, 8192}, {8192, 2048}, {2048, 128256}};
    int n_shapes = BENCH_N_SHAPES;
    int ns[BENCH_N_MAX], n_ns = BENCH_N_MAX, hot = 0, row_major = 0, layouts = 0, bf16_dot = 0;
    for (int ni = 0; ni < BENCH_N_MAX; ni++)
        ns[ni] = ni + 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            n_threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            min_s = atof(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            backend = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
            if (parse_shapes(argv[++i], shapes, &n_shapes) != 0)
                return 2;
        } else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
            if (parse_rows(argv[++i], ns, &n_ns) != 0)
                return 2;
        } else if (strcmp(argv[i], "--hot") == 0) {
            hot = 1;
        } else if (strcmp(argv[i], "--row-major") == 0) {
            row_major = 1;
        } else if (strcmp(argv[i], "--layouts") == 0) {
            layouts = 1;
        } else if (strcmp(argv[i], "--bf16-dot") == 0) {
            layouts = bf16_dot = 1;
        } else if (strcmp(argv[i], "--cpu-time") == 0) {
            bench_clock = CLOCK_PROCESS_CPUTIME_ID;
        } else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--seconds S] [--rounds R] [--shapes DINxDOUT,...] "
                    "[--rows N,...] [--cpu-time] [--hot] [--row-major | --layouts | --bf16-dot]\n"
                    "       %s --backend cuda [--device D] [--seconds S] [--rounds R]\n",
                    argv[0], argv[0]);
            return 2;
        }
    }
    const int cuda = strcmp(backend, "cuda") == 0;
    if (!cuda && strcmp(backend, "cpu") != 0) {
        fprintf(stderr, "tandem-bench-kernels: --backend must be cpu or cuda, got \"%s\"\n",
                backend);
        return 2;
    }
    if (min_s < 0)
        min_s = 0.05;
    if (rounds < 0)
        rounds = cuda ? 3 : 25;
    if (rounds < 1 || rounds > BENCH_ROUNDS_MAX || min_s <= 0) {
        fprintf(stderr, "tandem-bench-kernels: --rounds must be 1..%d and --seconds > 0\n",
                BENCH_ROUNDS_MAX);
        return 2;
    }
    if (cuda)
        return bench_cuda(device, min_s, rounds);
    if (row_major && layouts) {
        fprintf(stderr, "tandem-bench-kernels: --layouts times both layouts; drop --row-major\n");
        return 2;
    }
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be = NULL;
    if (kern_cpu_create(&be, n_threads, err) != 0) {
        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
        return 1;
    }
    int threads = kern_cpu_threads(be);
    if (threads > 64)
        threads = 64;

    /* ---- bandwidth ---- */
    struct read_bw_result bw;
    if (read_bw_measure(&bw, threads, 0, 5, err, sizeof err) != 0) {
        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
        return 1;
    }
    const double read_gbs = bw.read_gbs;
    printf("threads: %d\n", threads);
    printf("read bandwidth (%d threads, %zu MiB, best pass):  %.1f GB/s\n", threads,
           bw.size_bytes >> 20, read_gbs);
    printf("memcpy (read+write counted, reference only):      %.1f GB/s\n", bw.memcpy_gbs);
    /* Filled with pseudo-random words, not a constant: read_bw.c found this
     * VM's host merging identical pages, which then read faster. */
    void *read_buf = NULL;
    if (be->ops->alloc(be, BENCH_READ_BYTES, &read_buf, err) != 0) {
        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
        return 1;
    }
    uint64_t fill = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < BENCH_READ_BYTES / sizeof fill; i++) {
        fill ^= fill << 13;
        fill ^= fill >> 7;
        fill ^= fill << 17;
        ((uint64_t *)read_buf)[i] = fill;
    }

    /* ---- matmul ---- */
    printf("\nmatmul bf16 (weight bytes / %s time per call, best of %d rounds; %%read and t(n)/t1: "
           "medians of the rounds' own ratios%s)\n",
           bench_clock == CLOCK_MONOTONIC ? "wall" : "process CPU", rounds,
           hot ? "; --hot: one weight copy, cache-resident if it fits" : "");
    if (layouts)
        printf("%-18s %3s %11s %10s %9s %9s %8s %14s %12s\n", "d_in -> d_out", "n", "us/call",
               "GB/s", "%read", "%own", "t(n)/t1", bf16_dot ? "bf16-dot us" : "row-major us",
               bf16_dot ? "vs bf16-dot" : "vs row-major");
    else
        printf("%-18s %3s %11s %10s %9s %9s %8s\n", "d_in -> d_out", "n", "us/call", "GB/s",
               "%read", "%own", "t(n)/t1");
    const struct bench_cpu_opts opts = {.threads = threads, .rounds = rounds, .hot = hot, .row_major = row_major,
                                        .layouts = layouts, .bf16_dot = bf16_dot, .min_s = min_s, .ns = ns, .n_ns = n_ns,
                                        .read_buf = read_buf};
    for (int si = 0; si < n_shapes; si++)
        if (bench_shape(be, &opts, shapes[si][0], shapes[si][1]) != 0)
            return 1;
    if (bench_small_matmul(be, threads, min_s) != 0)
        return 1;
    be->ops->free(be, read_buf);
    be->ops->destroy(be);
    return 0;
}
