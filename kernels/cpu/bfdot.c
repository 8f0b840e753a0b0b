/* bfdot.c: the bf16 product on vdpbf16ps (contract: bfdot.h): the check
 * that the CPU has it and cpu_matmul_bf16, which rounds the input rows and
 * hands blocks of output rows to the pool. The tiles are in
 * bfdot_avx512bf16.c; the scalar emulation every path is checked against
 * is in tests/unit/test_kernels_cpu.c.
 */
#include "bfdot.h"

#include "cpu_backend.h"
#include "error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BD_X86 1
#include "cpu_features.h"
#endif

int bd_supported(void)
{
#ifdef BD_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma") && cpu_leaf7_1_eax_has(CPU_LEAF7_1_EAX_AVX512BF16);
#else
    return 0;
#endif
}

#ifndef BD_X86
/* Never called: bd_supported says no. */
void bd_round_rows_avx512bf16(const float *in, int d_in, uint16_t *xb, int dp, int i0, int i1)
{
    (void)in, (void)d_in, (void)xb, (void)dp, (void)i0, (void)i1;
}
void bd_rows_avx512bf16(const struct bd_job *job, int o0, int o1) { (void)job, (void)o0, (void)o1; }
float bd_dot_avx512bf16(const uint16_t *w, size_t step, const uint16_t *xb, int d_in)
{
    (void)w, (void)step, (void)xb, (void)d_in;
    return 0.0f;
}
#endif

/* Rounded input rows per job: a job's rows stay in L2 while every block of
 * weight rows is applied to them (jobs of rows change no bit). */
#define BD_JOB_BYTES (256 * 1024)
#define BD_TASK_ROWS 16 /* output rows per pool task: 2 tiles of 8 or 4 of 4 */

struct bd_round_job {
    const float *in;
    uint16_t *xb;
    int d_in, dp;
};

static void bd_round_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct bd_round_job *rj = ctx;
    (void)thread_idx;
    bd_round_rows_avx512bf16(rj->in, rj->d_in, rj->xb, rj->dp, (int)begin, (int)end);
}

static void bd_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct bd_job *job = ctx;
    const long o1 = end * job->task_rows < job->d_out ? end * job->task_rows : job->d_out;
    (void)thread_idx;
    bd_rows_avx512bf16(job, (int)(begin * job->task_rows), (int)o1);
}

int cpu_matmul_bf16(struct cpu_backend *cb, float *out, const float *in, const uint16_t *w, int n,
                    int d_in, int d_out, int packed_rows, char *err)
{
    const int dp = bd_padded(d_in);
    int rc = cpu_backend_scratch_reserve(cb, (size_t)n * (size_t)dp * sizeof(uint16_t), err);
    if (rc < 0)
        return rc;
    uint16_t *xb = (uint16_t *)(void *)cb->scratch[0];
    struct bd_round_job rj = {.in = in, .xb = xb, .d_in = d_in, .dp = dp};
    /* rows are rounded independently: a prompt's on all threads */
    cpu_pool_run(cb->pool, n, (long)n * d_in < 65536 ? n : 1, bd_round_task, &rj);
    /* one row on line octets: tasks of BD_STREAMS octets, so that a claim
     * cuts into BD_STREAMS equal runs read side by side */
    const int task_rows = n == 1 && packed_rows ? 8 * BD_STREAMS : BD_TASK_ROWS;
    const long n_tasks = (d_out + task_rows - 1) / task_rows;
    struct bd_job job = {.w = w, .d_in = d_in, .dp = dp, .d_out = d_out, .packed_rows = packed_rows,
                         .task_rows = task_rows};
    int job_rows = dp ? (int)(BD_JOB_BYTES / ((size_t)dp * sizeof(uint16_t))) : n;
    job_rows = job_rows < BD_RMAX ? BD_RMAX : job_rows;
    for (int i0 = 0; i0 < n; i0 += job_rows) {
        job.n = n - i0 < job_rows ? n - i0 : job_rows;
        job.xb = xb + (size_t)i0 * (size_t)dp;
        job.out = out + (size_t)i0 * (size_t)d_out;
        long chunk = n_tasks / ((long)cb->n_threads * 16);
        chunk = chunk < 1 ? 1 : chunk;
        /* tiny products are not worth waking the workers */
        if ((long)job.n * d_in * d_out < 32768)
            chunk = n_tasks;
        cpu_pool_run_guided(cb->pool, n_tasks, chunk, bd_task, &job);
    }
    return 0;
}
