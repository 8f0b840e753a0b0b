/* matmul_internal.h: what the files of cpu_matmul share (private to
 * kernels/cpu/matmul*.c; not an API: the mm_ names may change at any time).
 *
 * matmul.c holds the contract, the choice of path and the dispatch; each
 * path is one file: matmul_packed.c, matmul_opairs.c, matmul_ipairs.c,
 * matmul_direct.c (also the scalar code) and matmul_panel.c. This header
 * holds the job they all read, the constants the dispatch needs from the
 * paths, the two weight loads several paths use and the entry points each
 * path gives the dispatch. Every path keeps the fixed reduction order of
 * cpu_simd.h for every output element (see matmul.c).
 * Figures behind the constants: docs/perf/cpu-matmul.md.
 */
#ifndef TANDEM_KERNELS_CPU_MATMUL_INTERNAL_H
#define TANDEM_KERNELS_CPU_MATMUL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "packed.h"

#define MM_RO 4 /* output rows per tile */
#define MM_RO_ONE 8 /* output rows per tile at one input row (AVX2: mm_task_runs) */
#define MM_RI 3 /* max input rows per tile (direct path) */
#define MM_PANEL_MAX 32 /* input rows per panel job (more: several jobs) */
#define MM_PR 12 /* output rows per panel (a multiple of 3) */

#ifdef __AVX2__
#define MM_PAIRED_MAX 17 /* the largest verification: K = 16 drafts + 1 */
#define MM_DIRECT_JOB_ROWS 64 /* AVX2 without AVX-512F+BW: input rows per direct job */
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The pair paths (matmul_opairs.c, matmul_ipairs.c). */
#define MM_PF 512 /* weights: 1 KiB of bf16/f16 ahead (256..1024 measured alike) */
/* Blocks shorter than this (d_in < 768 in bf16) prefetch whole blocks
 * ahead, at least this many bytes: the in-row lead above, carried into the
 * next block, is only about one block (3.3 KiB at d_in = 384) there. */
#define MM_PF_SHORT_AHEAD 6144
#define MM_IPAIRS_MIN 6 /* input pairs from this n */
/* The output pairs: at most this many input rows per tile (10 accumulators,
 * 4 raw weight vectors, the widened pair and an input vector in registers). */
#define MM_OI (MM_IPAIRS_MIN - 1)
/* The output pairs' k-blocks (mm_blocks_opairs_kb): 512 columns (5 input
 * rows of it are 10 KiB) measured best of 256 to 2048. */
#define MM_OKB 512
/* Rows up to this long stay whole at 2 to 5 input rows: since the whole-row
 * prefetch runs into the next block (mm_otile's pf_next), whole rows were
 * faster than k-blocks up to 2048 columns and slower from 3072 (5 input
 * rows of 8192 no longer fit in L1). */
#define MM_OKB_MIN_DIN 2048

/* The packed path (matmul_packed.c). */
#define MM_PK_STREAMS 4   /* octets read side by side at 1 and 2 input rows */
#define MM_PK_JOB_ROWS 32 /* input rows per job (more: several jobs) */
#define MM_PK_ONE_FROM 3  /* one octet per tile from this many input rows */
#endif

/* One call's work as the pool's tasks see it; the dispatch (cpu_matmul)
 * fills it and sets the fields of the path it chose. */
struct mm_job {
    float *out;       /* [n, d_out] */
    const float *in;  /* [n, d_in] */
    const void *w;    /* [d_out, d_in] dtype */
    enum kern_dtype dtype;
    int n, d_in, d_out;
    float **scratch;  /* per thread (panel path): see mm_panel_private_bytes */
    const float *xp;  /* panel path: the packed inputs (mm_pack_inputs) */
    const float *xq;  /* input-pair path: the inputs packed in pairs (mm_pack_pairs) */
    int opairs;       /* the output-pair path (mm_block_opairs) */
    int okb;          /* output pairs in k-blocks of this many columns (0: whole rows) */
    ptrdiff_t pf_lead; /* output pairs, whole rows: each row's prefetch lead, in bytes */
    size_t pf_next;   /* ... and how much further once past a row's end (mm_otile) */
    int pkb;          /* panel path: k-block length */
    int packed_rows;  /* w's first rows in the packed layout (packed.h), or 0 */
    int pk_task_octets; /* packed path: octets per pool task (mm_task_packed) */
};

/* Bytes of elems weights of a row (bf16, f16, f32: int8 and int4 take
 * qdot.c's integer product instead). */
CPU_SIMD_INLINE size_t mm_bytes(enum kern_dtype dt, size_t elems)
{
    switch (dt) {
    case KERN_DTYPE_F32: return elems * 4;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: /* never here */
    case KERN_DTYPE_BF16:
    case KERN_DTYPE_F16: break;
    }
    return elems * 2;
}

CPU_SIMD_INLINE float mm_load1(enum kern_dtype dt, const void *w, size_t idx)
{
    switch (dt) {
    case KERN_DTYPE_BF16: return cpu_simd_bf16_to_f32(((const uint16_t *)w)[idx]);
    case KERN_DTYPE_F16: return cpu_simd_f16_to_f32(((const uint16_t *)w)[idx]);
    case KERN_DTYPE_F32: break;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break; /* never here: int8/int4 take qdot.c's integer product */
    }
    return ((const float *)w)[idx];
}

#ifdef __AVX2__
CPU_SIMD_INLINE __m256 mm_load8(enum kern_dtype dt, const void *w, size_t idx)
{
    switch (dt) {
    case KERN_DTYPE_BF16: return cpu_simd_load8_bf16((const uint16_t *)w + idx);
    case KERN_DTYPE_F16: return cpu_simd_load8_f16((const uint16_t *)w + idx);
    case KERN_DTYPE_F32: break;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break; /* never here: int8/int4 take qdot.c's integer product */
    }
    return _mm256_loadu_ps((const float *)w + idx);
}
#endif

/* ---- the direct path (matmul_direct.c) ---- */

/* Applies `ro` weight rows (dtype dt, row stride d_in; ro is MM_RO or 1) to
 * all input rows: out rows o0 .. o0+ro-1. */
void mm_block(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro, int o0);
#ifdef __AVX2__
/* Up to MM_RI input rows over the blocks [begin, end) of MM_RO output rows,
 * in tiles over runs of rows. */
void mm_task_runs(const struct mm_job *job, long begin, long end);
#endif
#if defined(__AVX2__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
#define MM_KB_ROWS_MIN MM_DIRECT_JOB_ROWS /* prefill: jobs of this many rows take k-blocks */
#define MM_KB_MIN_DIN 2048 /* ... with rows this long: a group of 6 is 48 KiB, more than L1 */
/* A prefill job (n >= MM_KB_ROWS_MIN input rows of at least MM_KB_MIN_DIN
 * columns) over the blocks [begin, end), in k-blocks. */
void mm_task_w2_kb(const struct mm_job *job, long begin, long end);
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* ---- the output pairs (matmul_opairs.c) ---- */

/* Weight rows o0 .. o0+rows-1 (rows <= MM_RO; w at row o0) against all
 * input rows, whole rows. */
void mm_block_opairs(const struct mm_job *job, const void *w, int rows, int o0);
/* The blocks [begin, end) of MM_RO rows in k-blocks of job->okb columns. */
void mm_blocks_opairs_kb(const struct mm_job *job, long begin, long end);

/* ---- the input pairs (matmul_ipairs.c) ---- */

/* Floats of packed pairs for n rows of length d_in (see mm_pack_pairs). */
size_t mm_pairs_floats(int n, int d_in);
/* Packs the first len8 columns of n input rows in pairs into xq. */
void mm_pack_pairs(const float *in, int n, int d_in, float *xq);
/* mm_block for n >= 2 with the pairs packed in job->xq. */
void mm_block_pairs(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro, int o0);

/* ---- the packed path (matmul_packed.c) ---- */

/* Tasks of the packed path: job->pk_task_octets octets of output rows each
 * (a cpu_pool_fn). */
void mm_task_packed(void *ctx, long begin, long end, int thread_idx);

/* ---- the panel path (matmul_panel.c) ---- */

/* k-block length for n input rows. */
int mm_panel_kb(int n);
/* Packs the input's first len8 columns k-block by k-block into xp. */
void mm_pack_inputs(const float *in, int n, int d_in, int pkb, float *xp);
/* Scratch of the panel path, per thread, and the packed inputs' floats. */
size_t mm_panel_private_bytes(int n, int pkb);
size_t mm_panel_xp_floats(int n, int d_in, int pkb);
/* Tasks of the panel path: panels of MM_PR output rows (a cpu_pool_fn). */
void mm_task_panel(void *ctx, long begin, long end, int thread_idx);
#endif

#endif
