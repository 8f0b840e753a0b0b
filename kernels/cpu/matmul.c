/* matmul.c: cpu_matmul, out[i][o] = sum_k in[i][k] * w[o][k] (f32 accumulate).
 *
 * Reduction order: every output element is one dot product of length d_in in
 * the fixed order of cpu_simd.h (8 lanes over k in steps of 8 with FMA, fixed
 * lane fold, scalar FMA tail). Each element has its own accumulator in every
 * tile shape below and the same sequence of operations, so out[i][o] does not
 * depend on n, on the tile or path that computed it, nor on the thread. Never
 * split the reduction across threads (no split-K): that is what would make
 * results depend on shapes. Cutting it into k-blocks with the accumulators
 * parked in memory in between is fine: that changes no bit.
 *
 * Five paths, chosen from (n, d_in) and whether map_matrix packed w
 * (mm_use_panel, MM_IPAIRS_MIN, cpu_backend_packed), all exact:
 *   - packed (AVX-512F+BW; w in the packed layout of packed.h, any n):
 *     octets of 8 weight rows; up to 3 rows several octets side by side,
 *     from 3 rows one octet against up to 6 rows at once, in k-blocks, 3 to
 *     6 rows on 3 octets in turn (mm_task_packed).
 *   - output pairs (AVX-512F+BW; n = 1..5: decode
 *     and short speculative verifications): tasks are blocks of MM_RO
 *     output rows; two weight rows share each 512-bit accumulator (one
 *     8-lane half each, so every output keeps its 8-lane order) and the
 *     block's 4 weight rows are applied to all input rows per read; rows
 *     longer than MM_OKB_MIN_DIN go in k-blocks over 16 blocks at a time from 2 rows
 *     (mm_blocks_opairs_kb).
 *   - input pairs (AVX-512F+BW; n = 6 up to 17: longer verifications,
 *     batches of decode rows): the same tasks, two input rows per 512-bit
 *     accumulator instead, the block's 4 weight rows applied to up to 12
 *     input rows per read.
 *   - direct (AVX2 without AVX-512F+BW: every n, prefill in jobs of
 *     MM_DIRECT_JOB_ROWS rows; scalar: every n; with AVX-512F+BW only the
 *     packed path's rows after its last full octet): the same tasks; the
 *     bf16/f16/f32 weights are read directly over the whole row. Up to 3
 *     rows (AVX2 alone, mm_task_runs): a task's rows cut into runs, one row
 *     in MM_RO_ONE x 1 tiles and 2 or 3 rows in MM_RO x {2,3} tiles whose
 *     weight rows come one from each run, without prefetch. From 4 rows
 *     (AVX2) 2 x {3..6} tiles over adjacent rows (mm_block_w2), later tiles
 *     finding the weights in L1/L2, the first tile over each weight row
 *     prefetching the rows after it (mm_prefetch_ahead), as does the
 *     MM_RO x 1 tile of a 4-row block left after the runs. Full prefill
 *     jobs of rows of at least MM_KB_MIN_DIN columns turn that around
 *     (mm_task_w2_kb): each group of input rows against every pair of the
 *     claim's weight rows, in k-blocks that keep the group's inputs in L1.
 *     Bound by weight bandwidth at n = 1.
 *   - panel (AVX-512F+BW, weights not packed; prefill, n > 17): tasks are
 *     panels of MM_PR output rows, swept in k-blocks sized so that the
 *     packed k-block of all input rows stays in L1; each weight is widened
 *     to f32 once per call (not once per group of input rows) and applied
 *     with 3 x 4 register tiles. Inputs beyond MM_PANEL_MAX rows run as
 *     several jobs.
 * The input rows are never split across threads; the pool's threads claim
 * output blocks/panels.
 *
 * int8 and int4 weights are not here: they take the integer product of
 * qdot.c (int8 activations, its own contract in qdot.h), to which
 * cpu_matmul hands them after checking the arguments. Nor are bf16 weights
 * where the CPU has AVX512_BF16 (the default): they take vdpbf16ps
 * (bfdot.c, bf16 activations, its own contract in bfdot.h); the paths below
 * then serve only f16 and f32 weights, and bf16 ones mapped while the
 * backend's bf16 dot was off (kern_cpu_set_bf16_dot, TANDEM_CPU_BF16_DOT=0;
 * cpu_backend_on_bd). So a bf16 matrix's product differs by ISA (with
 * AVX512_BF16 or without), where this file's paths give the same bits on
 * every ISA.
 *
 * Files: this one holds the contract, the choice of path and the dispatch
 * (cpu_matmul, the pool's claims, the per-block choice among the row-block
 * paths); each path has its own file: matmul_packed.c, matmul_opairs.c,
 * matmul_ipairs.c, matmul_direct.c (also the scalar code of every build)
 * and matmul_panel.c, sharing matmul_internal.h. The measured history
 * behind the paths, their constants and the split between them is in
 * docs/perf/cpu-matmul.md.
 */
#include "error.h"
#include "matmul_internal.h"

/* Which path computes n rows of length d_in: all give the same bits, so
 * this is only a speed choice.
 * With AVX-512F+BW (weights not packed): the output pairs below
 * MM_IPAIRS_MIN rows, the input pairs up to MM_PAIRED_MAX, which beat the
 * panel at every n = 2..17 (every weight is read once for up to 12 rows and
 * applied with half the FMAs); the panel keeps prefill (n > MM_PAIRED_MAX),
 * where converting each weight once and k-blocking the inputs in L1 pay
 * off. The panel stays with AVX-512F+BW, where the input pairs are not
 * measured against it at prefill (nor is it used for packed weights).
 * AVX2 without AVX-512F+BW: no panel. The direct path's 2-row tiles with
 * their prefetch (mm_block_w2, mm_prefetch_ahead) beat it at every
 * n = 4..17, and at prefill too, in jobs of MM_DIRECT_JOB_ROWS input rows
 * (mm_block_w2's groups taking turns on each pair of weight rows; past that
 * many rows in one job a row costs more).
 * Figures: docs/perf/cpu-matmul.md, "Choosing a path". */
#if defined(__AVX512F__) && defined(__AVX512BW__)
static int mm_use_panel(int n)
{
    return n > MM_PAIRED_MAX;
}
#endif

/* Tasks of the paths in blocks of MM_RO output rows: the output pairs, the
 * input pairs (AVX-512F+BW) and the direct path, as cpu_matmul set the job. */
static void mm_task_direct(void *ctx, long begin, long end, int thread_idx)
{
    const struct mm_job *job = ctx;
    const enum kern_dtype dt = job->dtype;
    (void)thread_idx;
#ifdef __AVX2__
    if (job->n <= MM_RI && !job->opairs) {
        mm_task_runs(job, begin, end);
        return;
    }
#endif
#if defined(__AVX2__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
    if (job->n >= MM_KB_ROWS_MIN && job->d_in >= MM_KB_MIN_DIN) {
        mm_task_w2_kb(job, begin, end);
        return;
    }
#endif
    for (long blk = begin; blk < end; blk++) {
        const int o0 = (int)(blk * MM_RO);
        const int rows = job->d_out - o0 < MM_RO ? job->d_out - o0 : MM_RO;
        const char *w = (const char *)job->w + mm_bytes(dt, (size_t)o0 * (size_t)job->d_in);
#if defined(__AVX512F__) && defined(__AVX512BW__)
        if (job->okb > 0) {
            mm_blocks_opairs_kb(job, blk, end);
            break;
        }
        if (job->opairs) {
            mm_block_opairs(job, w, rows, o0);
            continue;
        }
        if (job->xq) {
            if (rows == MM_RO) {
                mm_block_pairs(job, job->dtype, w, MM_RO, o0);
                continue;
            }
            for (int r = 0; r < rows; r++)
                mm_block_pairs(job, job->dtype, w + mm_bytes(dt, (size_t)r * (size_t)job->d_in), 1,
                               o0 + r);
            continue;
        }
#endif
        if (rows == MM_RO) {
            mm_block(job, job->dtype, w, MM_RO, o0);
            continue;
        }
        for (int r = 0; r < rows; r++)
            mm_block(job, job->dtype, w + mm_bytes(dt, (size_t)r * (size_t)job->d_in), 1, o0 + r);
    }
}

/* Runs one job over all output rows on the pool. */
static void mm_run(struct cpu_backend *cb, struct mm_job *job, int rows_per_task, cpu_pool_fn fn)
{
    const long n_blocks = (job->d_out + rows_per_task - 1) / rows_per_task;
    /* Claims of up to 16 blocks, at least ~16 claims per thread to balance.
     * The pair paths and the packed path claim guided instead (a quarter of
     * what is left with 2 threads, down to those 16): a claim is one weight
     * stream, and its first blocks start cold, before the prefetch is ahead.
     * Guided claims were as fast as one run per thread, where fixed claims
     * of 64 blocks made a large head at one row much slower and fixed
     * claims of 16 made the input pairs slower at a large head (figures:
     * docs/perf/cpu-matmul.md, "Claims"). */
    long chunk = n_blocks / ((long)cb->n_threads * 16);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    /* Tiny products are not worth waking the workers. */
    if ((long)job->n * job->d_in * job->d_out < 32768)
        chunk = n_blocks;
    if (job->opairs || job->xq || job->packed_rows)
        cpu_pool_run_guided(cb->pool, n_blocks, chunk, fn, job);
    else
        cpu_pool_run(cb->pool, n_blocks, chunk, fn, job);
}

#ifdef __AVX2__
/* Runs job over its n input rows as jobs of at most job_rows rows (rows are
 * independent: chunking changes no bit); job is left at the last chunk. */
static void mm_run_jobs(struct cpu_backend *cb, struct mm_job *job, int job_rows,
                        int rows_per_task, cpu_pool_fn fn)
{
    const int n = job->n;
    const float *in = job->in;
    float *out = job->out;
    for (int i0 = 0; i0 < n; i0 += job_rows) {
        job->n = n - i0 < job_rows ? n - i0 : job_rows;
        job->in = in + (size_t)i0 * (size_t)job->d_in;
        job->out = out + (size_t)i0 * (size_t)job->d_out;
        mm_run(cb, job, rows_per_task, fn);
    }
}
#endif

int cpu_matmul(struct kern_backend *be, float *out, const float *in, const void *w,
               enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    const int quantized = dtype == KERN_DTYPE_Q8 || dtype == KERN_DTYPE_Q4;
    int rc = quantized ? 0 : cpu_backend_check_dtype(dtype, "matmul", err);
    if (rc < 0)
        return rc;
    if (dtype == KERN_DTYPE_Q4 && d_in % KERN_Q4_GROUP != 0)
        return error_set(err, ERR_INVALID_ARG, "cpu matmul: int4 rows of %d columns, not a multiple of %d",
                         d_in, KERN_Q4_GROUP);
    if (n < 0 || d_in < 0 || d_out < 0)
        return error_set(err, ERR_INVALID_ARG, "cpu matmul: negative shape n=%d d_in=%d d_out=%d",
                         n, d_in, d_out);
    if (n == 0 || d_out == 0)
        return 0;
    if (!out || !in || !w)
        return error_set(err, ERR_INVALID_ARG, "cpu matmul: NULL tensor (out=%p in=%p w=%p)",
                         (void *)out, (const void *)in, w);
    struct mm_job job = {
        .out = out, .in = in, .w = w, .dtype = dtype,
        .n = n, .d_in = d_in, .d_out = d_out, .scratch = cb->scratch,
    };
    if (quantized)
        return cpu_matmul_int(cb, out, in, w, dtype, n, d_in, d_out, err);
    int packed_d_in = 0;
    const int layout = cpu_backend_packed(cb, w, &job.packed_rows, &packed_d_in);
    if (layout != CPU_LAYOUT_ROWS &&
        (packed_d_in != d_in || dtype != KERN_DTYPE_BF16 || d_out < job.packed_rows))
        return error_set(err, ERR_INVALID_ARG,
                         "cpu matmul: w was mapped as a bf16 matrix of at least %d rows of %d, "
                         "called as %s [%d, %d]",
                         job.packed_rows, packed_d_in, kern_dtype_name(dtype), d_out, d_in);
    if (cpu_backend_on_bd(cb, dtype, layout))
        return cpu_matmul_bf16(cb, out, in, w, n, d_in, d_out, job.packed_rows, err);
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (job.packed_rows) {
        /* Jobs of at most MM_PK_JOB_ROWS input rows keep a job's inputs in
         * L2 while every octet is applied to them. At 1 and 2 rows a claim
         * is cut into MM_PK_STREAMS runs read side by side, so tasks of
         * that many octets (see the packed path); a call of more rows than
         * one job keeps single octets for all its jobs, the last of which
         * may have 1 or 2 rows. */
        job.pk_task_octets = n < MM_PK_ONE_FROM ? MM_PK_STREAMS : 1;
        mm_run_jobs(cb, &job, MM_PK_JOB_ROWS, CPU_PACKED_ROWS * job.pk_task_octets,
                    mm_task_packed);
        return 0;
    }
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (mm_use_panel(n)) {
        /* Chunks of at most MM_PANEL_MAX input rows bound the scratch (rows
         * are independent: chunking changes no bit). */
        const int n_max = n < MM_PANEL_MAX ? n : MM_PANEL_MAX;
        const int pkb = mm_panel_kb(n_max);
        const size_t priv = mm_panel_private_bytes(n_max, pkb);
        rc = cpu_backend_scratch_reserve(
            cb, priv + mm_panel_xp_floats(n_max, d_in, pkb) * sizeof(float), err);
        if (rc < 0)
            return rc;
        float *xp = (float *)(void *)((char *)cb->scratch[0] + priv);
        for (int i0 = 0; i0 < n; i0 += MM_PANEL_MAX) {
            job.n = n - i0 < MM_PANEL_MAX ? n - i0 : MM_PANEL_MAX;
            job.in = in + (size_t)i0 * (size_t)d_in;
            job.out = out + (size_t)i0 * (size_t)d_out;
            job.pkb = mm_panel_kb(job.n);
            mm_pack_inputs(job.in, job.n, d_in, job.pkb, xp);
            job.xp = xp;
            mm_run(cb, &job, MM_PR, mm_task_panel);
        }
        return 0;
    }
#elif defined(__AVX2__)
    if (n > MM_DIRECT_JOB_ROWS) {
        mm_run_jobs(cb, &job, MM_DIRECT_JOB_ROWS, MM_RO, mm_task_direct);
        return 0;
    }
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (d_in >= 8 && n >= MM_IPAIRS_MIN) {
        rc = cpu_backend_scratch_reserve(cb, mm_pairs_floats(n, d_in) * sizeof(float), err);
        if (rc < 0)
            return rc;
        mm_pack_pairs(in, n, d_in, cb->scratch[0]);
        job.xq = cb->scratch[0];
    } else {
        job.opairs = 1;
        if (n >= 2 && n <= MM_OI && d_in > MM_OKB_MIN_DIN)
            job.okb = MM_OKB;
        const size_t row_bytes = mm_bytes(dtype, (size_t)d_in);
        const size_t block_bytes = MM_RO * row_bytes;
        job.pf_lead = 2 * MM_PF;
        job.pf_next = (MM_RO - 1) * row_bytes;
        if (block_bytes > 0 && block_bytes < MM_PF_SHORT_AHEAD) { /* whole blocks ahead */
            job.pf_lead =
                (ptrdiff_t)(block_bytes * ((MM_PF_SHORT_AHEAD + block_bytes - 1) / block_bytes));
            job.pf_next = 0;
        }
    }
#endif
    mm_run(cb, &job, MM_RO, mm_task_direct);
    return 0;
}
