/* elementwise.c: cpu_swiglu (out = silu(gate) * up) and cpu_add (x += y).
 *
 * silu(g) is computed per element in f32 from t = e^-|g|, the softmax's
 * exponential (cpu_simd_exp, within 2 ulp), so that its argument is never
 * positive:
 *   g >= 0: g / (1 + t)          (= g / (1 + e^-g))
 *   g <  0: (g * t) / (1 + t)    (= g e^g / (1 + e^g), the same function)
 * each operation rounded once: a few ulp from the exact value. Every step is
 * an IEEE operation, so the 8-lane and the scalar forms give the same bits,
 * and elementwise results cannot depend on n or on the thread split. libm's
 * expf, used before, took about 2.4 ns an element: a 1B-shaped decode row's
 * 8192 elements 17 us, and 5 verification rows 70 us. add is one f32
 * addition per element. Large counts are split into blocks across the pool,
 * small ones run on the caller. out may alias gate (each element is read
 * before it is written by the same thread).
 */
#include <math.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"

/* Elements per task, and counts up to which the caller runs the op alone
 * (waking the pool costs about a microsecond). add is a fraction of a
 * nanosecond an element: only large counts are worth splitting. silu on 8
 * lanes, 2 threads, best of 200 (blocks and caller's share both 2048 /
 * 4096 / 8192): 8192 elements 3.8 / 3.7 / 3.8 us, 24576 6.9 / 6.4 / 11.3,
 * 40960 11.2 / 10.4 / 11.9 (5 blocks on 2 threads). */
#define EW_ADD_BLOCK 8192L
#define EW_ADD_INLINE_MAX 32768L
#define EW_SWIGLU_BLOCK 4096L
#define EW_SWIGLU_INLINE_MAX 4096L

struct ew_job {
    float *out;
    const float *a;
    const float *b;
    size_t count;
    size_t block; /* elements per task */
};

/* The 8-lane form's operations, one element. */
static float silu_scalar(float g)
{
    const float t = cpu_simd_exp_scalar(-fabsf(g));
    return (g < 0.0f ? g * t : g) / (1.0f + t);
}

static void swiglu_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct ew_job *job = ctx;
    size_t lo = (size_t)begin * job->block;
    size_t hi = (size_t)end * job->block < job->count ? (size_t)end * job->block : job->count;
    size_t k = lo;
#ifdef __AVX2__
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; k + 8 <= hi; k += 8) {
        const __m256 g = _mm256_loadu_ps(job->a + k);
        const __m256 t = cpu_simd_exp8(_mm256_or_ps(g, sign)); /* e^-|g| */
        const __m256 negative = _mm256_cmp_ps(g, zero, _CMP_LT_OQ);
        const __m256 num = _mm256_blendv_ps(g, _mm256_mul_ps(g, t), negative);
        const __m256 silu = _mm256_div_ps(num, _mm256_add_ps(one, t));
        _mm256_storeu_ps(job->out + k, _mm256_mul_ps(silu, _mm256_loadu_ps(job->b + k)));
    }
#endif
    for (; k < hi; k++)
        job->out[k] = silu_scalar(job->a[k]) * job->b[k];
}

static void add_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct ew_job *job = ctx;
    size_t lo = (size_t)begin * job->block;
    size_t hi = (size_t)end * job->block < job->count ? (size_t)end * job->block : job->count;
    size_t k = lo;
#ifdef __AVX2__
    for (; k + 8 <= hi; k += 8)
        _mm256_storeu_ps(job->out + k,
                         _mm256_add_ps(_mm256_loadu_ps(job->out + k), _mm256_loadu_ps(job->b + k)));
#endif
    for (; k < hi; k++)
        job->out[k] += job->b[k];
}

static void ew_run(struct cpu_backend *cb, struct ew_job *job, size_t inline_max, cpu_pool_fn fn)
{
    long n_tasks = (long)((job->count + job->block - 1) / job->block);
    long chunk = job->count <= inline_max ? n_tasks : 1;
    cpu_pool_run(cb->pool, n_tasks, chunk, fn, job);
}

int cpu_swiglu(struct kern_backend *be, float *out, const float *gate, const float *up,
               size_t count, char *err)
{
    if (count == 0)
        return 0;
    if (!out || !gate || !up)
        return error_set(err, ERR_INVALID_ARG, "cpu swiglu: NULL tensor");
    struct ew_job job = { .out = out, .a = gate, .b = up, .count = count, .block = EW_SWIGLU_BLOCK };
    ew_run(cpu_backend_of(be), &job, EW_SWIGLU_INLINE_MAX, swiglu_task);
    return 0;
}

int cpu_add(struct kern_backend *be, float *x, const float *y, size_t count, char *err)
{
    if (count == 0)
        return 0;
    if (!x || !y)
        return error_set(err, ERR_INVALID_ARG, "cpu add: NULL tensor");
    struct ew_job job = { .out = x, .a = x, .b = y, .count = count, .block = EW_ADD_BLOCK };
    ew_run(cpu_backend_of(be), &job, EW_ADD_INLINE_MAX, add_task);
    return 0;
}
