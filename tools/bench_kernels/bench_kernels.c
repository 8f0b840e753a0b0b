/* bench_kernels.c: tandem-bench-kernels, the CPU backend's matmul against the
 * machine's memory bandwidth.
 *
 * Prints:
 *   - read bandwidth with T threads (tools/bench/read_bw.h: the best of
 *     several read-only loops over 1 GiB), the ceiling of a decode step, and
 *     beside it memcpy ((bytes read + bytes written) / time), labelled, for
 *     reference only;
 *   - for bf16 weights of the Llama-3.2-1B shapes 2048->2048 (q, o),
 *     2048->512 (k, v), 2048->8192 (gate, up), 8192->2048 (down) and
 *     2048->128256 (LM head) and n = 1..17 input rows: time per matmul call,
 *     weight bytes read per second, that as a percentage of read bandwidth,
 *     and the time relative to n = 1 (speculative verification needs
 *     n = 2..17 to cost about as much as n = 1), also as one "ratio" line per
 *     shape.
 *     Every n is measured in each of R interleaved rounds and the best kept,
 *     so the ratios compare figures taken side by side on a busy machine.
 * Weights are rotated through enough copies (>= 256 MiB in all) that no call
 * finds its matrix in the last-level cache.
 *
 * Usage: tandem-bench-kernels [--threads N] [--seconds S] [--rounds R]
 *   N: backend threads (0 = one per online core, the default)
 *   S: minimum seconds per measurement (default 0.5)
 *   R: rounds per shape (default 3)
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
#include "read_bw.h"

#define BENCH_MIB (1024.0 * 1024.0)
#define BENCH_N_MAX 17 /* row counts 1..BENCH_N_MAX are measured per shape */
#define BENCH_N_SHAPES 5

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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

int main(int argc, char **argv)
{
    int n_threads = 0;
    double min_s = 0.5;
    int rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            n_threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            min_s = atof(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--seconds S] [--rounds R]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || min_s <= 0) {
        fprintf(stderr, "tandem-bench-kernels: --rounds must be >= 1 and --seconds > 0\n");
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

    /* ---- matmul ---- */
    /* Each n is measured once per round, the rounds interleaved, and the
     * best round kept: on a shared machine the ratios time(n)/time(1) then
     * compare figures taken side by side. */
    static const int shapes[BENCH_N_SHAPES][2] = {
        {2048, 2048}, {2048, 512}, {2048, 8192}, {8192, 2048}, {2048, 128256}};
    printf("\nmatmul bf16 (weight bytes / time per call; best of %d rounds)\n", rounds);
    printf("%-18s %3s %11s %10s %9s %8s\n", "d_in -> d_out", "n", "us/call", "GB/s", "%read",
           "t(n)/t1");
    for (int si = 0; si < BENCH_N_SHAPES; si++) {
        const int d_in = shapes[si][0], d_out = shapes[si][1];
        const size_t w_bytes = (size_t)d_in * (size_t)d_out * 2;
        int copies = (int)((256.0 * BENCH_MIB + (double)w_bytes - 1) / (double)w_bytes);
        copies = copies < 1 ? 1 : copies;
        void *w[160];
        for (int c = 0; c < copies; c++) {
            if (be->ops->alloc(be, w_bytes, &w[c], err) != 0) {
                fprintf(stderr, "tandem-bench-kernels: %s\n", err);
                return 1;
            }
            uint16_t *p = w[c];
            for (size_t k = 0; k < w_bytes / 2; k++)
                p[k] = rand_bf16();
        }
        float *in = NULL, *out = NULL;
        if (be->ops->alloc(be, (size_t)BENCH_N_MAX * d_in * sizeof(float), (void **)&in, err) !=
                0 ||
            be->ops->alloc(be, (size_t)BENCH_N_MAX * d_out * sizeof(float), (void **)&out,
                           err) != 0) {
            fprintf(stderr, "tandem-bench-kernels: %s\n", err);
            return 1;
        }
        for (int k = 0; k < BENCH_N_MAX * d_in; k++)
            in[k] = (float)((k * 37) % 101) / 101.0f - 0.5f;
        for (int c = 0; c < copies; c++) /* warm up: page in every copy */
            if (be->ops->matmul(be, out, in, w[c], KERN_DTYPE_BF16, 1, d_in, d_out, err) != 0) {
                fprintf(stderr, "tandem-bench-kernels: %s\n", err);
                return 1;
            }
        double best[BENCH_N_MAX];
        for (int ni = 0; ni < BENCH_N_MAX; ni++)
            best[ni] = 1e30;
        for (int round = 0; round < rounds; round++)
            for (int ni = 0; ni < BENCH_N_MAX; ni++) {
                const int n = ni + 1;
                long calls = 0;
                double t0 = now_s(), dt;
                do {
                    if (be->ops->matmul(be, out, in, w[calls % copies], KERN_DTYPE_BF16, n, d_in,
                                        d_out, err) != 0) {
                        fprintf(stderr, "tandem-bench-kernels: %s\n", err);
                        return 1;
                    }
                    calls++;
                    dt = now_s() - t0;
                } while (dt < min_s || calls < copies);
                double per_call = dt / (double)calls;
                best[ni] = per_call < best[ni] ? per_call : best[ni];
            }
        char label[32];
        snprintf(label, sizeof(label), "%d -> %d", d_in, d_out);
        for (int ni = 0; ni < BENCH_N_MAX; ni++) {
            double gbs = (double)w_bytes / best[ni] / 1e9;
            printf("%-18s %3d %11.1f %10.1f %8.0f%% %8.2f\n", label, ni + 1, best[ni] * 1e6, gbs,
                   100.0 * gbs / read_gbs, best[ni] / best[0]);
        }
        printf("ratio %-12s", label);
        for (int ni = 0; ni < BENCH_N_MAX; ni++)
            printf(" n%d:%.2f", ni + 1, best[ni] / best[0]);
        printf("\n");
        for (int c = 0; c < copies; c++)
            be->ops->free(be, w[c]);
        be->ops->free(be, in);
        be->ops->free(be, out);
    }

    /* ---- dispatch-bound op ---- */
    {
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
            be->ops->matmul(be, y, x, wsmall, KERN_DTYPE_BF16, 1, 512, 64, err);
            calls++;
            dt = now_s() - t0;
        } while (dt < min_s);
        printf("\nsmall matmul 512 -> 64 (n=1, split over %d threads): %.2f us/call\n", threads,
               dt / (double)calls * 1e6);
        be->ops->free(be, wbuf);
        be->ops->free(be, x);
        be->ops->free(be, y);
    }
    be->ops->destroy(be);
    return 0;
}
