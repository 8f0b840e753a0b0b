/* bench_kernels.c: tandem-bench-kernels, the CPU backend's matmul against the
 * machine's memory bandwidth.
 *
 * Prints:
 *   - memcpy bandwidth with T threads, STREAM "copy" convention: (bytes read +
 *     bytes written) / time, on buffers far larger than the caches;
 *   - read bandwidth with T threads (a vector sum over a large buffer);
 *   - for bf16 weights of shapes 2048->8192, 8192->2048 and 2048->128256 and
 *     n = 1..9, 16, 17 input rows: time per matmul call, weight bytes read
 *     per second, that as a percentage of both bandwidth figures, and the
 *     time relative to n = 1 (speculative verification needs n = 2..9 to
 *     cost about as much as n = 1), also as one "ratio" line per shape.
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

#define BENCH_MIB (1024.0 * 1024.0)
#define BENCH_NS 11    /* row counts measured per shape */
#define BENCH_N_MAX 17 /* the largest of them */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct bw_part {
    char *dst;
    const char *src;
    size_t size;
    int reps;
    double sink;
};

static void *bw_copy_main(void *arg)
{
    struct bw_part *p = arg;
    for (int r = 0; r < p->reps; r++)
        memcpy(p->dst, p->src, p->size);
    return NULL;
}

static void *bw_read_main(void *arg)
{
    struct bw_part *p = arg;
    double total = 0;
    for (int r = 0; r < p->reps; r++) {
        const float *f = (const float *)(const void *)p->src;
        size_t count = p->size / sizeof(float), i = 0;
#ifdef __AVX2__
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; i + 32 <= count; i += 32) {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(f + i));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(f + i + 8));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(f + i + 16));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(f + i + 24));
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (int j = 0; j < 8; j++)
            total += lanes[j];
#endif
        for (; i < count; i++)
            total += f[i];
    }
    p->sink = total;
    return NULL;
}

/* Runs fn on n_threads threads, each over its share of size bytes, reps
 * times; returns the best seconds per rep over `trials` trials. */
static double bw_run(void *(*fn)(void *), char *dst, const char *src, size_t size, int n_threads,
                     int reps, int trials)
{
    struct bw_part parts[64];
    pthread_t th[64];
    size_t share = (size / (size_t)n_threads) & ~(size_t)63;
    double best = 1e30;
    for (int tr = 0; tr < trials; tr++) {
        double t0 = now_s();
        for (int t = 0; t < n_threads; t++) {
            parts[t] = (struct bw_part){ .dst = dst ? dst + (size_t)t * share : NULL,
                                         .src = src + (size_t)t * share, .size = share,
                                         .reps = reps };
            if (pthread_create(&th[t], NULL, fn, &parts[t]) != 0) {
                fprintf(stderr, "pthread_create failed\n");
                exit(1);
            }
        }
        for (int t = 0; t < n_threads; t++)
            pthread_join(th[t], NULL);
        double dt = (now_s() - t0) / reps;
        best = dt < best ? dt : best;
    }
    return best;
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
    const size_t bw_size = (size_t)512 << 20;
    char *a = malloc(bw_size), *b = malloc(bw_size);
    if (!a || !b) {
        fprintf(stderr, "tandem-bench-kernels: out of memory\n");
        return 1;
    }
    memset(a, 1, bw_size);
    memset(b, 2, bw_size);
    double t_copy = bw_run(bw_copy_main, b, a, bw_size, threads, 2, 3);
    double t_read = bw_run(bw_read_main, NULL, a, bw_size, threads, 2, 3);
    double copy_gbs = 2.0 * (double)bw_size / t_copy / 1e9;
    double read_gbs = (double)bw_size / t_read / 1e9;
    free(a);
    free(b);
    printf("threads: %d\n", threads);
    printf("memcpy bandwidth (read+write, %d threads, 512 MiB): %.1f GB/s\n", threads, copy_gbs);
    printf("read bandwidth   (%d threads, 512 MiB):             %.1f GB/s\n", threads, read_gbs);

    /* ---- matmul ---- */
    /* Each n is measured once per round, the rounds interleaved, and the
     * best round kept: on a shared machine the ratios time(n)/time(1) then
     * compare figures taken side by side. */
    static const int shapes[3][2] = {{2048, 8192}, {8192, 2048}, {2048, 128256}};
    static const int ns[BENCH_NS] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17};
    printf("\nmatmul bf16 (weight bytes / time per call; best of %d rounds)\n", rounds);
    printf("%-18s %3s %11s %10s %9s %9s %8s\n", "d_in -> d_out", "n", "us/call", "GB/s",
           "%memcpy", "%read", "t(n)/t1");
    for (int si = 0; si < 3; si++) {
        const int d_in = shapes[si][0], d_out = shapes[si][1];
        const size_t w_bytes = (size_t)d_in * (size_t)d_out * 2;
        int copies = (int)((256.0 * BENCH_MIB + (double)w_bytes - 1) / (double)w_bytes);
        copies = copies < 1 ? 1 : copies;
        void *w[16];
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
        double best[BENCH_NS];
        for (int ni = 0; ni < BENCH_NS; ni++)
            best[ni] = 1e30;
        for (int round = 0; round < rounds; round++)
            for (int ni = 0; ni < BENCH_NS; ni++) {
                const int n = ns[ni];
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
        for (int ni = 0; ni < BENCH_NS; ni++) {
            double gbs = (double)w_bytes / best[ni] / 1e9;
            printf("%-18s %3d %11.1f %10.1f %8.0f%% %8.0f%% %8.2f\n", label, ns[ni],
                   best[ni] * 1e6, gbs, 100.0 * gbs / copy_gbs, 100.0 * gbs / read_gbs,
                   best[ni] / best[0]);
        }
        printf("ratio %-12s", label);
        for (int ni = 0; ni < BENCH_NS; ni++)
            printf(" n%d:%.2f", ns[ni], best[ni] / best[0]);
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
