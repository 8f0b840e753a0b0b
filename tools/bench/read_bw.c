/* read_bw.c: see read_bw.h.
 *
 * Threads are started once and meet at a barrier before and after every pass,
 * so a pass times only the loop (no thread creation). Each thread reads the
 * same share on every pass, so its pages stay local and warm in the TLB; the
 * buffer is 1 GiB, far beyond any last-level cache, and is touched (written,
 * with pseudo-random bytes: see rbw_thread_main) before the first pass so no
 * pass takes page faults.
 */
#define _GNU_SOURCE
#include "read_bw.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#define RBW_THREADS_MAX 1024

struct rbw_span {
    double start, end; /* seconds, CLOCK_MONOTONIC */
};

/* The read loops: one stream per thread, without and with software
 * prefetch, and four streams per thread (the decode matmul's shape: on this
 * project's VM it read 5-15% faster than any one-stream loop, so a ceiling
 * without it was below what a kernel reached). Then memcpy, for reference. */
enum { RBW_SHAPE_PLAIN, RBW_SHAPE_PREFETCH, RBW_SHAPE_STREAMS, RBW_SHAPE_COPY, RBW_N_SHAPES };

struct rbw_shared {
    char *buf, *dst;
    size_t share;            /* bytes per thread, a multiple of 4096 */
    int n_threads, passes;
    pthread_barrier_t barrier;
    double best_s[RBW_N_SHAPES];
};

struct rbw_thread {
    struct rbw_shared *sh;
    int idx;
    pthread_t th;
    uint64_t sink;        /* keeps the sums observable */
    struct rbw_span span; /* this pass's own reading, read after the barrier */
};

static double rbw_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A pass's time: from the first reader's start to the last reader's end, as
 * the readers clocked them. Not the caller's clock around the barriers: the
 * caller is one thread more than the readers, and on a machine with as many
 * cores as readers it often ran only after they had started, so a pass
 * looked shorter than it was (a 256 MiB read "at" 640 GB/s on 2 cores). */
static double rbw_pass_s(const struct rbw_span *spans, int n)
{
    double first = spans[0].start, last = spans[0].end;
    for (int i = 1; i < n; i++) {
        first = spans[i].start < first ? spans[i].start : first;
        last = spans[i].end > last ? spans[i].end : last;
    }
    return last - first;
}

/* Sums [p, p + size) as 32-bit integers with 8 independent accumulators
 * (integer adds: one cycle, never the bottleneck); prefetch_bytes > 0 also
 * prefetches that far ahead (a prefetch past the end never faults). size is
 * a multiple of 256. */
static uint64_t rbw_read(const char *p, size_t size, size_t prefetch_bytes)
{
#ifdef __AVX2__
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0;
    for (size_t i = 0; i < size; i += 256) {
        const __m256i *v = (const __m256i *)(const void *)(p + i);
        if (prefetch_bytes) {
            _mm_prefetch(p + i + prefetch_bytes, _MM_HINT_T0);
            _mm_prefetch(p + i + prefetch_bytes + 64, _MM_HINT_T0);
            _mm_prefetch(p + i + prefetch_bytes + 128, _MM_HINT_T0);
            _mm_prefetch(p + i + prefetch_bytes + 192, _MM_HINT_T0);
        }
        a0 = _mm256_add_epi32(a0, _mm256_load_si256(v + 0));
        a1 = _mm256_add_epi32(a1, _mm256_load_si256(v + 1));
        a2 = _mm256_add_epi32(a2, _mm256_load_si256(v + 2));
        a3 = _mm256_add_epi32(a3, _mm256_load_si256(v + 3));
        a4 = _mm256_add_epi32(a4, _mm256_load_si256(v + 4));
        a5 = _mm256_add_epi32(a5, _mm256_load_si256(v + 5));
        a6 = _mm256_add_epi32(a6, _mm256_load_si256(v + 6));
        a7 = _mm256_add_epi32(a7, _mm256_load_si256(v + 7));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                 _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)(void *)lanes, s);
    return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
#else
    (void)prefetch_bytes;
    uint64_t acc[8] = {0};
    for (size_t i = 0; i < size; i += 64)
        for (int j = 0; j < 8; j++) {
            uint64_t x;
            memcpy(&x, p + i + 8 * (size_t)j, sizeof x);
            acc[j] += x;
        }
    return acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
#endif
}

/* Sums [p, p + size) as four streams walked side by side, one 64-byte line
 * of each per step (size a multiple of 256). */
static uint64_t rbw_read_streams(const char *p, size_t size)
{
    const size_t quarter = size / 4 & ~(size_t)63;
    uint64_t tail = 0;
    if (4 * quarter < size)
        tail = rbw_read(p + 4 * quarter, size - 4 * quarter, 0);
#ifdef __AVX2__
    __m256i a[8];
    for (int j = 0; j < 8; j++)
        a[j] = _mm256_setzero_si256();
    for (size_t i = 0; i < quarter; i += 64)
        for (int q = 0; q < 4; q++) {
            const __m256i *v = (const __m256i *)(const void *)(p + (size_t)q * quarter + i);
            a[2 * q] = _mm256_add_epi32(a[2 * q], _mm256_load_si256(v));
            a[2 * q + 1] = _mm256_add_epi32(a[2 * q + 1], _mm256_load_si256(v + 1));
        }
    for (int j = 1; j < 8; j++)
        a[0] = _mm256_add_epi32(a[0], a[j]);
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)(void *)lanes, a[0]);
    return tail ^ lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
#else
    uint64_t acc[4] = {0};
    for (size_t i = 0; i < quarter; i += 8)
        for (int q = 0; q < 4; q++) {
            uint64_t x;
            memcpy(&x, p + (size_t)q * quarter + i, sizeof x);
            acc[q] += x;
        }
    return tail ^ acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
#endif
}

static void *rbw_thread_main(void *arg)
{
    struct rbw_thread *t = arg;
    struct rbw_shared *sh = t->sh;
    char *mine = sh->buf + (size_t)t->idx * sh->share;
    char *dst = sh->dst + (size_t)t->idx * (sh->share / 2);
    /* Touch our share first, from this thread, with bytes no two pages
     * share. A constant fill read 1.33x faster (median of 116 turns over ten
     * minutes, 0.87-2.17x, the gap growing with time) than a pseudo-random
     * one of the same size, read the same way in the same process in
     * alternation, on this project's VM: its host evidently merges
     * identical pages, which no model's weights are. */
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(t->idx + 1);
    for (size_t i = 0; i + sizeof x <= sh->share; i += sizeof x) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(mine + i, &x, sizeof x);
    }
    memset(dst, 0, sh->share / 2);
    for (int shape = 0; shape < RBW_N_SHAPES; shape++)
        for (int pass = 0; pass < sh->passes; pass++) {
            pthread_barrier_wait(&sh->barrier);
            t->span.start = rbw_now_s();
            switch (shape) {
            case RBW_SHAPE_PLAIN: t->sink += rbw_read(mine, sh->share, 0); break;
            case RBW_SHAPE_PREFETCH: t->sink += rbw_read(mine, sh->share, 2048); break;
            case RBW_SHAPE_STREAMS: t->sink += rbw_read_streams(mine, sh->share); break;
            default: memcpy(dst, mine, sh->share / 2); t->sink += (uint64_t)dst[pass]; break;
            }
            t->span.end = rbw_now_s();
            pthread_barrier_wait(&sh->barrier);
        }
    return NULL;
}

int read_bw_measure(struct read_bw_result *out, int n_threads, size_t size_bytes, int passes,
                    char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    if (n_threads < 1 || n_threads > RBW_THREADS_MAX) {
        snprintf(err, err_size, "read bandwidth: n_threads must be in 1..%d, got %d",
                 RBW_THREADS_MAX, n_threads);
        return -1;
    }
    if (size_bytes == 0)
        size_bytes = (size_t)1 << 30;
    if (passes <= 0)
        passes = 5;
    struct rbw_shared sh = {.n_threads = n_threads, .passes = passes};
    sh.share = size_bytes / (size_t)n_threads & ~(size_t)4095;
    if (sh.share < 8192) {
        snprintf(err, err_size, "read bandwidth: %zu bytes is too small for %d threads",
                 size_bytes, n_threads);
        return -1;
    }
    size_t total = sh.share * (size_t)n_threads, dst_total = total / 2;
    sh.buf = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    sh.dst = mmap(NULL, dst_total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sh.buf == MAP_FAILED || sh.dst == MAP_FAILED) {
        snprintf(err, err_size, "read bandwidth: mmap of %zu bytes failed", total + dst_total);
        if (sh.buf != MAP_FAILED)
            munmap(sh.buf, total);
        if (sh.dst != MAP_FAILED)
            munmap(sh.dst, dst_total);
        return -1;
    }
    /* Huge pages where the kernel offers them: fewer TLB misses, so the
     * figure is the memory's, not the page walker's. Advice only. */
    (void)madvise(sh.buf, total, MADV_HUGEPAGE);
    (void)madvise(sh.dst, dst_total, MADV_HUGEPAGE);
    int rc = pthread_barrier_init(&sh.barrier, NULL, (unsigned)n_threads + 1);
    struct rbw_thread *th = calloc((size_t)n_threads, sizeof *th);
    if (rc != 0 || !th) {
        snprintf(err, err_size, "read bandwidth: %s failed",
                 rc ? "pthread_barrier_init" : "calloc");
        if (!rc)
            pthread_barrier_destroy(&sh.barrier);
        free(th);
        munmap(sh.buf, total);
        munmap(sh.dst, dst_total);
        return -1;
    }
    int started = 0;
    for (; started < n_threads; started++) {
        th[started].sh = &sh;
        th[started].idx = started;
        if (pthread_create(&th[started].th, NULL, rbw_thread_main, &th[started]) != 0)
            break;
    }
    if (started < n_threads) {
        /* Threads already started wait at the barrier forever; this is a
         * benchmark tool, so report and let the process exit. */
        snprintf(err, err_size, "read bandwidth: pthread_create failed (thread %d)", started);
        return -1;
    }
    struct rbw_span spans[RBW_THREADS_MAX];
    for (int shape = 0; shape < RBW_N_SHAPES; shape++) {
        sh.best_s[shape] = 1e30;
        for (int pass = 0; pass < passes; pass++) {
            pthread_barrier_wait(&sh.barrier);
            pthread_barrier_wait(&sh.barrier);
            for (int t = 0; t < n_threads; t++)
                spans[t] = th[t].span;
            const double dt = rbw_pass_s(spans, n_threads);
            sh.best_s[shape] = dt < sh.best_s[shape] ? dt : sh.best_s[shape];
        }
    }
    uint64_t sink = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(th[t].th, NULL);
        sink ^= th[t].sink;
    }
    out->read_gbs = 0;
    for (int shape = RBW_SHAPE_PLAIN; shape <= RBW_SHAPE_STREAMS; shape++) {
        const double gbs = (double)total / sh.best_s[shape] / 1e9;
        out->read_gbs = gbs > out->read_gbs ? gbs : out->read_gbs;
    }
    out->checksum = sink;
    out->memcpy_gbs = 2.0 * (double)dst_total / sh.best_s[RBW_SHAPE_COPY] / 1e9;
    out->n_threads = n_threads;
    out->size_bytes = total;
    pthread_barrier_destroy(&sh.barrier);
    free(th);
    munmap(sh.buf, total);
    munmap(sh.dst, dst_total);
    return 0;
}

/* ---- over given regions ---- */

struct rbw_regions {
    const char *const *base;
    const size_t *len; /* each a multiple of 256 */
    int n;
    size_t total;
    int n_threads, passes;
    pthread_barrier_t barrier;
};

struct rbw_region_thread {
    struct rbw_regions *rg;
    int idx;
    pthread_t th;
    uint64_t sink;
    struct rbw_span span; /* as in struct rbw_thread */
};

/* Reads bytes [begin, end) of the regions' concatenation in loop shape
 * `shape` (a read shape, not RBW_SHAPE_COPY). */
static uint64_t rbw_read_span(const struct rbw_regions *rg, size_t begin, size_t end, int shape)
{
    uint64_t sink = 0;
    size_t at = 0;
    for (int i = 0; i < rg->n && at < end; at += rg->len[i], i++) {
        const size_t lo = begin > at ? begin - at : 0;
        const size_t hi = end - at < rg->len[i] ? end - at : rg->len[i];
        if (lo < hi)
            sink += shape == RBW_SHAPE_STREAMS
                        ? rbw_read_streams(rg->base[i] + lo, hi - lo)
                        : rbw_read(rg->base[i] + lo, hi - lo, shape == RBW_SHAPE_PREFETCH ? 2048 : 0);
    }
    return sink;
}

static void *rbw_region_thread_main(void *arg)
{
    struct rbw_region_thread *t = arg;
    struct rbw_regions *rg = t->rg;
    const size_t share = rg->total / (size_t)rg->n_threads & ~(size_t)255;
    const size_t begin = share * (size_t)t->idx;
    const size_t end = t->idx == rg->n_threads - 1 ? rg->total : begin + share;
    for (int shape = RBW_SHAPE_PLAIN; shape <= RBW_SHAPE_STREAMS; shape++)
        for (int pass = 0; pass < rg->passes; pass++) {
            pthread_barrier_wait(&rg->barrier);
            t->span.start = rbw_now_s();
            t->sink += rbw_read_span(rg, begin, end, shape);
            t->span.end = rbw_now_s();
            pthread_barrier_wait(&rg->barrier);
        }
    return NULL;
}

int read_bw_measure_regions(struct read_bw_result *out, int n_threads, const void *const *regions,
                            const size_t *bytes, int n_regions, int passes, char *err,
                            size_t err_size)
{
    memset(out, 0, sizeof *out);
    if (n_threads < 1 || n_threads > RBW_THREADS_MAX || n_regions < 1) {
        snprintf(err, err_size, "read bandwidth: %d threads over %d regions", n_threads, n_regions);
        return -1;
    }
    if (passes <= 0)
        passes = 5;
    struct rbw_regions rg = {.n = n_regions, .n_threads = n_threads, .passes = passes};
    size_t *len = calloc((size_t)n_regions, sizeof *len);
    struct rbw_region_thread *th = calloc((size_t)n_threads, sizeof *th);
    if (!len || !th) {
        snprintf(err, err_size, "read bandwidth: out of memory");
        goto fail;
    }
    for (int i = 0; i < n_regions; i++) {
        if ((uintptr_t)regions[i] % 32 != 0) {
            snprintf(err, err_size, "read bandwidth: region %d is not 32-byte aligned", i);
            goto fail;
        }
        len[i] = bytes[i] & ~(size_t)255;
        rg.total += len[i];
    }
    rg.base = (const char *const *)regions;
    rg.len = len;
    if (rg.total < (size_t)n_threads * 4096) {
        snprintf(err, err_size, "read bandwidth: %zu bytes is too little for %d threads", rg.total,
                 n_threads);
        goto fail;
    }
    if (pthread_barrier_init(&rg.barrier, NULL, (unsigned)n_threads + 1) != 0) {
        snprintf(err, err_size, "read bandwidth: pthread_barrier_init failed");
        goto fail;
    }
    for (int t = 0; t < n_threads; t++) {
        th[t].rg = &rg;
        th[t].idx = t;
        if (pthread_create(&th[t].th, NULL, rbw_region_thread_main, &th[t]) != 0) {
            /* as in read_bw_measure: started threads wait at the barrier;
             * a benchmark tool reports and exits */
            snprintf(err, err_size, "read bandwidth: pthread_create failed (thread %d)", t);
            return -1;
        }
    }
    double best = 1e30;
    struct rbw_span spans[RBW_THREADS_MAX];
    for (int shape = RBW_SHAPE_PLAIN; shape <= RBW_SHAPE_STREAMS; shape++)
        for (int pass = 0; pass < passes; pass++) {
            pthread_barrier_wait(&rg.barrier);
            pthread_barrier_wait(&rg.barrier);
            for (int t = 0; t < n_threads; t++)
                spans[t] = th[t].span;
            const double dt = rbw_pass_s(spans, n_threads);
            best = dt < best ? dt : best;
        }
    uint64_t sink = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(th[t].th, NULL);
        sink ^= th[t].sink;
    }
    out->read_gbs = (double)rg.total / best / 1e9;
    out->checksum = sink;
    out->n_threads = n_threads;
    out->size_bytes = rg.total;
    pthread_barrier_destroy(&rg.barrier);
    free(len);
    free(th);
    return 0;
fail:
    free(len);
    free(th);
    return -1;
}
