/* elementwise.c: cpu_swiglu (out = silu(gate) * up) and cpu_add (x += y).
 *
 * silu(g) = g / (1 + expf(-g)), computed per element in f32; add is one f32
 * addition per element. Elementwise results cannot depend on n or on the
 * thread split; large counts are split into blocks across the pool, small
 * ones run on the caller. out may alias gate (each element is read before it
 * is written by the same thread).
 */
#include <math.h>

#include "cpu_backend.h"
#include "error.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#define EW_BLOCK 8192L           /* elements per task */
#define EW_INLINE_MAX 32768L     /* counts up to this run on the caller */

struct ew_job {
    float *out;
    const float *a;
    const float *b;
    size_t count;
};

static void swiglu_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct ew_job *job = ctx;
    size_t lo = (size_t)begin * EW_BLOCK;
    size_t hi = (size_t)end * EW_BLOCK < job->count ? (size_t)end * EW_BLOCK : job->count;
    for (size_t k = lo; k < hi; k++) {
        float g = job->a[k];
        job->out[k] = g / (1.0f + expf(-g)) * job->b[k];
    }
}

static void add_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct ew_job *job = ctx;
    size_t lo = (size_t)begin * EW_BLOCK;
    size_t hi = (size_t)end * EW_BLOCK < job->count ? (size_t)end * EW_BLOCK : job->count;
    size_t k = lo;
#ifdef __AVX2__
    for (; k + 8 <= hi; k += 8)
        _mm256_storeu_ps(job->out + k,
                         _mm256_add_ps(_mm256_loadu_ps(job->out + k), _mm256_loadu_ps(job->b + k)));
#endif
    for (; k < hi; k++)
        job->out[k] += job->b[k];
}

static void ew_run(struct cpu_backend *cb, struct ew_job *job, cpu_pool_fn fn)
{
    long n_tasks = (long)((job->count + EW_BLOCK - 1) / EW_BLOCK);
    long chunk = (long)job->count <= EW_INLINE_MAX ? n_tasks : 1;
    cpu_pool_run(cb->pool, n_tasks, chunk, fn, job);
}

int cpu_swiglu(struct kern_backend *be, float *out, const float *gate, const float *up,
               size_t count, char *err)
{
    if (count == 0)
        return 0;
    if (!out || !gate || !up)
        return error_set(err, ERR_INVALID_ARG, "cpu swiglu: NULL tensor");
    struct ew_job job = { .out = out, .a = gate, .b = up, .count = count };
    ew_run(cpu_backend_of(be), &job, swiglu_task);
    return 0;
}

int cpu_add(struct kern_backend *be, float *x, const float *y, size_t count, char *err)
{
    if (count == 0)
        return 0;
    if (!x || !y)
        return error_set(err, ERR_INVALID_ARG, "cpu add: NULL tensor");
    struct ew_job job = { .out = x, .a = x, .b = y, .count = count };
    ew_run(cpu_backend_of(be), &job, add_task);
    return 0;
}
