/* matmul_packed.c: cpu_matmul's packed path (AVX-512F+BW): w packed by
 * map_matrix (packed.h), any n (the contract and the choice of path are in
 * matmul.c).
 *
 * A task is an octet of output rows: its 8 rows are one sequential run of
 * 512-byte steps, and each 64-byte line holds, in the lanes the fixed order
 * assigns, two rows' 8-column chunks 2L (high halves) and 2L + 1 (low
 * halves), made f32 by one AND or one shift. Each input row has four
 * accumulators per octet (one per row pair), so four independent FMA chains
 * where the output pairs' 4-row tile had two; the row-major tile is bound by
 * its word permutes (one per two cycles) and by the FMA latency, and
 * streams far slower from L2.
 * How many octets are read side by side depends on n:
 *   - 1 row: MM_PK_STREAMS = 4 octets from separate runs of the task's
 *     range: one core's single stream does not keep enough lines in flight
 *     when there is little arithmetic per line (one octet at a time was
 *     slower than the row-major path at every prefetch lead, 6 octets
 *     slower than 4). A task is 4 octets (pk_task_octets), so a claim cuts
 *     into 4 equal runs: with tasks of one octet every claim whose length
 *     was no multiple of 4 left 1-3 octets to the one-octet tile, and a
 *     small matrix's guided claims of 2-3 octets were nothing else.
 *   - 2 rows: 4 octets too, without software prefetch, 32 accumulators
 *     of which GCC keeps some on the stack (L1).
 *   - 3 rows up: one octet in a tile, all rows of a group (up to
 *     MM_PK_RI = 6: 24 accumulators and 6 inputs; the 6-row tile spills two
 *     accumulators and is still the fastest at 6 rows). From here the FMAs,
 *     not the memory, are the limit, and rows are cheap only while their
 *     FMAs run under the read (a second group's FMAs after the read made
 *     2-octet tiles in groups of 3 + 2 slow). Past MM_PK_RI rows the groups
 *     take turns on k-blocks of MM_PK_KB columns, the accumulators parked
 *     in between, so that the read never waits for a whole later group.
 *   - 3 to 6 rows (one group): MM_PK_ROT = 3 adjacent octets take turns on
 *     those k-blocks (mm_packed_kblocks), the accumulators parked, each
 *     octet prefetching its own next k-block (MM_PK_ROT_LEAD), and from its
 *     last the first of the octet in its place in the next rotation
 *     (without that the rotation started cold). A whole octet at a time is
 *     one stream per core, and from 3 or 4 rows the tile's FMAs take about
 *     as long as the read: the stream then stalls the FMAs and they it,
 *     where three streams 32 KiB apart keep the hardware prefetchers
 *     fetching for the tile.
 * The row loops must unroll to MM_PK_RI (the pragmas): unrolled less, GCC
 * keeps the accumulators in memory and 6 rows take 4x as long.
 * The prefetch lead is MM_PK_LEAD. This path beats the panel path at
 * prefill too. The rows after the last full octet are row-major: mm_block
 * reads them.
 * One row does not prefetch: its 4 octets are 4 sequential streams the
 * hardware prefetchers follow, and the 32 prefetch instructions per 2 KiB
 * step only took load slots. Nor do 2 rows on 4 octets. From 3 rows (2
 * streams, or 1) the prefetch is needed.
 * Invariant: each output is the fixed order's dot product, bit for bit as
 * on the row-major matrix (packed.h); parking the accumulators between
 * k-blocks changes no bit.
 * Figures, and the shapes tried and dropped: docs/perf/cpu-matmul.md,
 * "Packed path".
 */
#include "matmul_internal.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MM_PK_LEAD 8192   /* bytes a prefetching tile reads ahead */
#define MM_PK_RI 6        /* most input rows per one-octet tile */
#define MM_PK_KB 256      /* columns per k-block from MM_PK_ONE_FROM rows */
#define MM_PK_RI_MIN 3    /* ... the fewest rows a group then has (3; 7 rows: 4 + 3) */
#define MM_PK_ROT 3       /* octets taking turns on k-blocks at one group of rows */
/* each octet's prefetch in a rotation: its next k-block */
#define MM_PK_ROT_LEAD (MM_PK_KB * CPU_PACKED_STEP_BYTES / CPU_PACKED_STEP)

/* Columns [k_begin, k_end) of q_streams octets (their first bytes in
 * octets[]) against ri input rows. prefetch: whether this tile prefetches
 * its octets, lead bytes ahead of its reads (the later groups of a k-block
 * find it in L1). park: NULL for whole rows; else the accumulators live
 * there between k-blocks (loaded unless first, stored unless last), which
 * changes no bit. */
CPU_SIMD_INLINE void mm_pktile(int q_streams, int ri, int prefetch, const char *const *octets,
                               size_t k_begin, size_t k_end, size_t lead, const float *x,
                               size_t ldx, __m512 *park, int first, int last, float *const *outs,
                               size_t ldo)
{
    __m512 acc[MM_PK_STREAMS][4][MM_PK_RI];
#pragma GCC unroll 4
    for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
            for (int b = 0; b < ri; b++)
                acc[q][p][b] = park && !first ? park[(q * 4 + p) * ri + b] : _mm512_setzero_ps();
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    const char *o[MM_PK_STREAMS];
#pragma GCC unroll 4
    for (int q = 0; q < q_streams; q++)
        o[q] = octets[q] + k_begin * (CPU_PACKED_STEP_BYTES / CPU_PACKED_STEP);
    for (size_t k = k_begin; k < k_end; k += CPU_PACKED_STEP) {
        if (prefetch) {
#pragma GCC unroll 4
            for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 8
                for (int l = 0; l < CPU_PACKED_STEP_BYTES / 64; l++)
                    /* an address, not a pointer: it may lie past the matrix */
                    _mm_prefetch((const char *)((uintptr_t)o[q] + lead + 64 * (uintptr_t)l),
                                 _MM_HINT_T0);
        }
#pragma GCC unroll 2
        for (int line = 0; line < 2; line++)
#pragma GCC unroll 2
            for (int low = 0; low < 2; low++) {
                const size_t kc = k + 16 * (size_t)line + 8 * (size_t)low;
                __m512 xv[MM_PK_RI];
#pragma GCC unroll 6
                for (int b = 0; b < ri; b++)
                    xv[b] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (size_t)b * ldx + kc));
#pragma GCC unroll 4
                for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++) {
                        const __m512i raw =
                            _mm512_load_si512((const void *)(o[q] + 128 * p + 64 * line));
                        const __m512 wv = _mm512_castsi512_ps(
                            low ? _mm512_slli_epi32(raw, 16) : _mm512_and_si512(raw, high));
#pragma GCC unroll 6
                        for (int b = 0; b < ri; b++)
                            acc[q][p][b] = _mm512_fmadd_ps(wv, xv[b], acc[q][p][b]);
                    }
            }
#pragma GCC unroll 4
        for (int q = 0; q < q_streams; q++)
            o[q] += CPU_PACKED_STEP_BYTES;
    }
    if (park && !last) {
#pragma GCC unroll 4
        for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
                for (int b = 0; b < ri; b++)
                    park[(q * 4 + p) * ri + b] = acc[q][p][b];
        return;
    }
#pragma GCC unroll 4
    for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
            for (int b = 0; b < ri; b++) {
                float *y = outs[q] + (size_t)b * ldo + (size_t)(2 * p);
                y[0] = cpu_simd_hsum8(_mm512_castps512_ps256(acc[q][p][b]));
                y[1] = cpu_simd_hsum8(_mm256_castpd_ps(
                    _mm512_extractf64x4_pd(_mm512_castps_pd(acc[q][p][b]), 1)));
            }
}

typedef void (*mm_pktile_fn)(const char *const *octets, size_t k_begin, size_t k_end,
                             size_t lead, const float *x, size_t ldx, __m512 *park, int first,
                             int last, float *const *outs, size_t ldo);
#define MM_DEFINE_PKTILE(q, ri, prefetch, sfx)                                              \
    static void mm_pktile_##q##x##ri##sfx(const char *const *octets, size_t k_begin,          \
                                          size_t k_end, size_t lead, const float *x,          \
                                          size_t ldx, __m512 *park, int first, int last,      \
                                          float *const *outs, size_t ldo)                     \
    {                                                                                        \
        mm_pktile(q, ri, prefetch, octets, k_begin, k_end, lead, x, ldx, park, first, last,  \
                  outs, ldo);                                                                \
    }
MM_DEFINE_PKTILE(4, 1, 0, )
MM_DEFINE_PKTILE(4, 2, 0, )
MM_DEFINE_PKTILE(1, 1, 1, _p)
MM_DEFINE_PKTILE(1, 2, 1, _p)
#define MM_DEFINE_PKTILES_KB(ri) MM_DEFINE_PKTILE(1, ri, 1, _p) MM_DEFINE_PKTILE(1, ri, 0, )
MM_DEFINE_PKTILES_KB(3)
MM_DEFINE_PKTILES_KB(4)
MM_DEFINE_PKTILES_KB(5)
MM_DEFINE_PKTILES_KB(6)
/* one octet, whole rows, prefetching: the rows after the 4-octet runs of 1
 * or 2 input rows; [ri - 1] */
static const mm_pktile_fn mm_pktiles_tail[2] = {mm_pktile_1x1_p, mm_pktile_1x2_p};
/* one octet over a k-block, [prefetching][ri - MM_PK_RI_MIN] */
static const mm_pktile_fn mm_pktiles_kb[2][MM_PK_RI - MM_PK_RI_MIN + 1] = {
    {mm_pktile_1x3, mm_pktile_1x4, mm_pktile_1x5, mm_pktile_1x6},
    {mm_pktile_1x3_p, mm_pktile_1x4_p, mm_pktile_1x5_p, mm_pktile_1x6_p},
};

/* q_streams octets (MM_PK_STREAMS or 1; their first bytes in octets[],
 * blks their indices) against the job's 1 or 2 input rows, whole rows. */
static void mm_packed_step(const struct mm_job *job, int q_streams, const char *const *octets,
                           const long *blks)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const int n = job->n;
    float *outs[MM_PK_STREAMS];
    for (int q = 0; q < q_streams; q++)
        outs[q] = job->out + (size_t)blks[q] * CPU_PACKED_ROWS;
    const mm_pktile_fn tile = q_streams == 1 ? mm_pktiles_tail[n - 1]
                              : n == 1       ? mm_pktile_4x1
                                             : mm_pktile_4x2;
    tile(octets, 0, d_in, MM_PK_LEAD, job->in, d_in, NULL, 1, 1, outs, d_out);
}

/* Octets [o_begin, o_end), all packed, against 1 or 2 input rows:
 * MM_PK_STREAMS runs of the range walked in lockstep, then what is left one
 * by one. */
static void mm_packed_octets(const struct mm_job *job, long o_begin, long o_end)
{
    const size_t octet_bytes = CPU_PACKED_ROWS * 2 * (size_t)job->d_in;
    const long run = (o_end - o_begin) / MM_PK_STREAMS;
    const char *w = job->w;
    for (long i = 0; i < run; i++) {
        const char *octets[MM_PK_STREAMS];
        long blks[MM_PK_STREAMS];
        for (int q = 0; q < MM_PK_STREAMS; q++) {
            blks[q] = o_begin + (long)q * run + i;
            octets[q] = w + (size_t)blks[q] * octet_bytes;
        }
        mm_packed_step(job, MM_PK_STREAMS, octets, blks);
    }
    for (long blk = o_begin + MM_PK_STREAMS * run; blk < o_end; blk++) {
        const char *octet = w + (size_t)blk * octet_bytes;
        mm_packed_step(job, 1, &octet, &blk);
    }
}

/* Octets [o_begin, o_end), all packed, against n >= MM_PK_ONE_FROM input
 * rows, in k-blocks of MM_PK_KB columns: on each octet's k-block the groups
 * of input rows take turns, the first prefetching; one group: MM_PK_ROT
 * adjacent octets take turns on each k-block (see the packed path). The
 * accumulators are parked between k-blocks (no bit changes). */
static void mm_packed_kblocks(const struct mm_job *job, long o_begin, long o_end)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t octet_bytes = CPU_PACKED_ROWS * 2 * d_in;
    const size_t col_bytes = CPU_PACKED_STEP_BYTES / CPU_PACKED_STEP; /* an octet's column */
    const int n = job->n, n_groups = (n + MM_PK_RI - 1) / MM_PK_RI;
    const int rot = n_groups == 1 ? MM_PK_ROT : 1;
    __m512 park[MM_PK_ROT][(MM_PK_JOB_ROWS + MM_PK_RI - 1) / MM_PK_RI][4 * MM_PK_RI];
    for (long o0 = o_begin; o0 < o_end; o0 += rot) {
        const int n_octets = o_end - o0 < rot ? (int)(o_end - o0) : rot;
        for (size_t k0 = 0; k0 < d_in; k0 += MM_PK_KB) {
            const size_t k1 = d_in - k0 < MM_PK_KB ? d_in : k0 + MM_PK_KB;
            /* each octet's next k-block; from the last, the first of the
             * octet in its place in the next rotation */
            const size_t lead = rot == 1    ? MM_PK_LEAD
                                : k1 < d_in ? MM_PK_ROT_LEAD
                                            : (size_t)rot * octet_bytes - k0 * col_bytes;
            for (int q = 0; q < n_octets; q++) {
                const char *octet = (const char *)job->w + (size_t)(o0 + q) * octet_bytes;
                for (int g = 0, i = 0; g < n_groups; g++) {
                    const int ri = n / n_groups + (g < n % n_groups);
                    float *out =
                        job->out + (size_t)i * d_out + (size_t)(o0 + q) * CPU_PACKED_ROWS;
                    mm_pktiles_kb[g == 0][ri - MM_PK_RI_MIN](&octet, k0, k1, lead,
                                                             job->in + (size_t)i * d_in, d_in,
                                                             park[q][g], k0 == 0, k1 == d_in,
                                                             &out, d_out);
                    i += ri;
                }
            }
        }
    }
}

/* Tasks of the packed path: job->pk_task_octets octets of output rows each. */
void mm_task_packed(void *ctx, long begin, long end, int thread_idx)
{
    const struct mm_job *job = ctx;
    const size_t row_bytes = 2 * (size_t)job->d_in;
    const int n = job->n;
    (void)thread_idx;
    const long n_octets = (job->d_out + CPU_PACKED_ROWS - 1) / CPU_PACKED_ROWS;
    begin *= job->pk_task_octets;
    end = end * job->pk_task_octets < n_octets ? end * job->pk_task_octets : n_octets;
    const long packed_end = job->packed_rows / CPU_PACKED_ROWS;
    const long o_end = end < packed_end ? end : packed_end;
    if (begin < o_end && n >= MM_PK_ONE_FROM)
        mm_packed_kblocks(job, begin, o_end);
    else if (begin < o_end)
        mm_packed_octets(job, begin, o_end);
    /* the rows after the last full octet, row-major */
    for (long blk = begin > packed_end ? begin : packed_end; blk < end; blk++) {
        const int o0 = (int)(blk * CPU_PACKED_ROWS);
        const int rows = job->d_out - o0 < CPU_PACKED_ROWS ? job->d_out - o0 : CPU_PACKED_ROWS;
        const char *w = (const char *)job->w + (size_t)o0 * row_bytes;
        for (int r = 0; r < rows;) {
            const int ro = rows - r >= MM_RO ? MM_RO : 1;
            mm_block(job, job->dtype, w + (size_t)r * row_bytes, ro, o0 + r);
            r += ro;
        }
    }
}
#endif
