/* qdot.c: the int8/int4 matrix product's contract in code (qdot.h): the
 * activations' quantization, the weights' panel layout, the scalar tiles
 * (the reference every ISA's tiles match bit for bit) and the choice of
 * ISA. The vector tiles are qdot_tiles.h, built by qdot_<isa>.c.
 *
 * The quantization of a block has a scalar and an AVX2 form; both are IEEE
 * operations in the same order (max of absolute values is exact, one
 * division, one multiply per element, round to nearest even), so they give
 * the same codes and scales.
 */
#include "qdot.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "error.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#define QD_ALIGN(x) (((x) + 63) & ~(size_t)63)

size_t qd_act_bytes(int n, int d_in)
{
    const size_t nb = ((size_t)d_in + QD_BLOCK - 1) / QD_BLOCK;
    return QD_ALIGN((size_t)n * nb * QD_BLOCK) + 2 * QD_ALIGN((size_t)n * nb * 4);
}

/* One block of len <= QD_BLOCK values by rule 1 (qdot.h), scalar. */
static void qd_quantize_block_scalar(const float *x, int len, int8_t *q, float *s, int32_t *sum)
{
    float amax = 0.0f;
    int bad = 0;
    for (int k = 0; k < len; k++) {
        const float v = fabsf(x[k]);
        if (!(v <= FLT_MAX))
            bad = 1;
        else if (v > amax)
            amax = v;
    }
    memset(q, 0, QD_BLOCK);
    *sum = 0;
    if (bad) {
        *s = NAN;
        return;
    }
    if (amax < QD_TINY) {
        *s = 0.0f;
        return;
    }
    const float inv = 127.0f / amax;
    int32_t total = 0;
    for (int k = 0; k < len; k++) {
        q[k] = (int8_t)lrintf(x[k] * inv);
        total += q[k];
    }
    *s = amax / 127.0f;
    *sum = total;
}

#ifdef __AVX2__
/* qd_quantize_block_scalar for a full block, the same bits. */
static void qd_quantize_block_avx2(const float *x, int8_t *q, float *s, int32_t *sum)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    __m256 v[4], m = _mm256_setzero_ps();
    int bad = 0;
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        const __m256 a = _mm256_and_ps(v[j], abs_mask);
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ));
        m = _mm256_max_ps(m, a);
    }
    if (bad) {
        memset(q, 0, QD_BLOCK);
        *s = NAN;
        *sum = 0;
        return;
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    if (amax < QD_TINY) {
        memset(q, 0, QD_BLOCK);
        *s = 0.0f;
        *sum = 0;
        return;
    }
    const __m256 inv = _mm256_set1_ps(127.0f / amax);
    __m256i c[4];
    for (int j = 0; j < 4; j++)
        c[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv)); /* nearest even, as lrintf */
    /* |c| <= 127: the packs below never saturate */
    const __m256i w01 = _mm256_packs_epi32(c[0], c[1]), w23 = _mm256_packs_epi32(c[2], c[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)q, b);
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
    *s = amax / 127.0f;
    *sum = _mm_cvtsi128_si32(t4);
}
#endif

void qd_act_layout(void *buf, int n, int d_in, struct qd_act *a)
{
    const int nb = (d_in + QD_BLOCK - 1) / QD_BLOCK;
    float *s = (float *)(void *)((char *)buf + QD_ALIGN((size_t)n * (size_t)nb * QD_BLOCK));
    int32_t *sum = (int32_t *)(void *)((char *)s + QD_ALIGN((size_t)n * (size_t)nb * 4));
    *a = (struct qd_act){.q = buf, .s = s, .sum = sum, .nb = nb};
}

void qd_act_quantize_rows(const float *in, int d_in, const struct qd_act *a, int i0, int i1)
{
    const int nb = a->nb;
    int8_t *q = (int8_t *)(uintptr_t)a->q;
    float *s = (float *)(uintptr_t)a->s;
    int32_t *sum = (int32_t *)(uintptr_t)a->sum;
    for (int i = i0; i < i1; i++)
        for (int b = 0; b < nb; b++) {
            const float *x = in + (size_t)i * (size_t)d_in + (size_t)b * QD_BLOCK;
            const size_t at = (size_t)i * (size_t)nb + (size_t)b;
            const int len = d_in - b * QD_BLOCK < QD_BLOCK ? d_in - b * QD_BLOCK : QD_BLOCK;
#ifdef __AVX2__
            if (len == QD_BLOCK) {
                qd_quantize_block_avx2(x, q + at * QD_BLOCK, s + at, sum + at);
                continue;
            }
#endif
            qd_quantize_block_scalar(x, len, q + at * QD_BLOCK, s + at, sum + at);
        }
}

size_t qd_panel_bytes(enum kern_dtype dt, int d_in)
{
    const size_t nb = ((size_t)d_in + QD_BLOCK - 1) / QD_BLOCK;
    return dt == KERN_DTYPE_Q8 ? QD_LINE + nb * 8 * QD_LINE : nb * 5 * QD_LINE;
}

size_t qd_packed_bytes(enum kern_dtype dt, int rows, int d_in)
{
    return (size_t)((rows + QD_ROWS - 1) / QD_ROWS) * qd_panel_bytes(dt, d_in);
}

/* Row r's nibble of column k in kernels.h's int4 layout, and its group's scale. */
static int qd_q4_nibble(const uint8_t *w, int d_in, int r, int k)
{
    const uint8_t *g = w + ((size_t)r * (size_t)d_in + (size_t)k) / KERN_Q4_GROUP * KERN_Q4_GROUP_BYTES;
    const int j = k % KERN_Q4_GROUP;
    return j < KERN_Q4_GROUP / 2 ? g[j] & 15 : g[j - KERN_Q4_GROUP / 2] >> 4;
}

static float qd_q4_scale(const uint8_t *w, int d_in, int r, int b)
{
    float sc;
    memcpy(&sc, w + ((size_t)r * (size_t)(d_in / KERN_Q4_GROUP) + (size_t)b) * KERN_Q4_GROUP_BYTES +
                    KERN_Q4_GROUP / 2,
           sizeof sc);
    return sc;
}

void qd_pack(enum kern_dtype dt, const void *w, int rows, int d_in, void *dst)
{
    const int nb = (d_in + QD_BLOCK - 1) / QD_BLOCK;
    const size_t pb = qd_panel_bytes(dt, d_in);
    const uint8_t *src = w;
    for (int p = 0; p < (rows + QD_ROWS - 1) / QD_ROWS; p++) {
        uint8_t *o = (uint8_t *)dst + (size_t)p * pb;
        for (int r = 0; r < QD_ROWS; r++) {
            const int row = p * QD_ROWS + r;
            const int live = row < rows;
            if (dt == KERN_DTYPE_Q8) {
                float sc = 0.0f;
                if (live)
                    memcpy(&sc, src + kern_q8_scales_offset(rows, d_in) + (size_t)row * 4, 4);
                memcpy(o + 4 * r, &sc, 4);
                for (int k = 0; k < nb * QD_BLOCK; k++) {
                    const int v = live && k < d_in ? ((const int8_t *)w)[(size_t)row * d_in + k] : 0;
                    const int b = k / QD_BLOCK, l = k % QD_BLOCK / 4, t = k % 4;
                    o[QD_LINE + (size_t)b * 8 * QD_LINE + (size_t)l * QD_LINE + 4 * r + t] = (uint8_t)(v + 128);
                }
                continue;
            }
            for (int b = 0; b < nb; b++) {
                uint8_t *blk = o + (size_t)b * 5 * QD_LINE;
                for (int l = 0; l < 4; l++)
                    for (int t = 0; t < 4; t++) {
                        const int k = b * QD_BLOCK + 8 * l + t;
                        const int lo = live ? qd_q4_nibble(src, d_in, row, k) : 8;
                        const int hi = live ? qd_q4_nibble(src, d_in, row, k + 4) : 8;
                        blk[l * QD_LINE + 4 * r + t] = (uint8_t)(lo | hi << 4);
                    }
                const float sc = live ? qd_q4_scale(src, d_in, row, b) : 0.0f;
                memcpy(blk + 4 * QD_LINE + 4 * r, &sc, 4);
            }
        }
    }
}

/* The integer sum of block b of panel row r against input codes x (rule 2),
 * read from the layout as the vector tiles read it. */
static int32_t qd_isum_scalar(enum kern_dtype dt, const uint8_t *panel, int b, int r, const int8_t *x,
                              int32_t xsum)
{
    int32_t isum = 0;
    if (dt == KERN_DTYPE_Q8) {
        const uint8_t *blk = panel + QD_LINE + (size_t)b * 8 * QD_LINE;
        for (int l = 0; l < 8; l++)
            for (int t = 0; t < 4; t++)
                isum += (int32_t)blk[l * QD_LINE + 4 * r + t] * x[4 * l + t];
        return isum - 128 * xsum;
    }
    const uint8_t *blk = panel + (size_t)b * 5 * QD_LINE;
    for (int l = 0; l < 4; l++)
        for (int t = 0; t < 4; t++) {
            const int u = blk[l * QD_LINE + 4 * r + t];
            isum += (u & 15) * x[8 * l + t] + (u >> 4) * x[8 * l + 4 + t];
        }
    return isum - 8 * xsum;
}

void qd_panels_scalar(const struct qd_job *job, int p0, int np)
{
    const struct qd_act *a = job->a;
    const int nb = a->nb;
    for (int p = p0; p < p0 + np; p++) {
        const uint8_t *panel = job->w + (size_t)p * job->panel_bytes;
        for (int r = 0; r < QD_ROWS && p * QD_ROWS + r < job->d_out; r++)
            for (int i = 0; i < job->n; i++) {
                const int8_t *x = a->q + (size_t)i * (size_t)nb * QD_BLOCK;
                const float *s = a->s + (size_t)i * (size_t)nb;
                const int32_t *xs = a->sum + (size_t)i * (size_t)nb;
                float acc = 0.0f, wsc;
                for (int b = 0; b < nb; b++) {
                    const float isum = (float)qd_isum_scalar(job->dtype, panel, b, r, x + b * QD_BLOCK, xs[b]);
                    if (job->dtype == KERN_DTYPE_Q8) {
                        acc = fmaf(isum, s[b], acc);
                    } else {
                        memcpy(&wsc, panel + (size_t)b * 5 * QD_LINE + 4 * QD_LINE + 4 * r, 4);
                        acc = fmaf(isum, wsc * s[b], acc);
                    }
                }
                if (job->dtype == KERN_DTYPE_Q8) {
                    memcpy(&wsc, panel + 4 * r, 4);
                    acc *= wsc;
                }
                job->out[(size_t)i * (size_t)job->d_out + (size_t)(p * QD_ROWS + r)] = acc;
            }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QD_X86 1
#endif

#ifdef QD_X86
#include "cpu_features.h"
#endif

int qd_isa_supported(int isa)
{
    switch (isa) {
    case QD_ISA_SCALAR: return 1;
#ifdef QD_X86
    case QD_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case QD_ISA_AVXVNNI:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_leaf7_1_eax_has(CPU_LEAF7_1_EAX_AVXVNNI);
    case QD_ISA_AVX512VNNI:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
#endif
    default: return 0;
    }
}

int qd_isa_best(void)
{
    for (int isa = QD_ISA_COUNT - 1; isa > 0; isa--)
        if (qd_isa_supported(isa))
            return isa;
    return QD_ISA_SCALAR;
}

const char *qd_isa_name(int isa)
{
    static const char *const names[QD_ISA_COUNT] = {"scalar", "avx2", "avx-vnni", "avx512-vnni"};
    return isa >= 0 && isa < QD_ISA_COUNT ? names[isa] : "?";
}

#ifndef QD_X86
/* Never chosen: qd_isa_supported says no. */
void qd_panels_avx2(const struct qd_job *job, int p0, int np) { qd_panels_scalar(job, p0, np); }
void qd_panels_avxvnni(const struct qd_job *job, int p0, int np) { qd_panels_scalar(job, p0, np); }
void qd_panels_avx512vnni(const struct qd_job *job, int p0, int np) { qd_panels_scalar(job, p0, np); }
#endif

/* Codes of input rows per job: the job's rows stay in L2 while every panel
 * is applied to them (jobs of rows change no bit: rows are independent). */
#define QD_JOB_BYTES (256 * 1024)
#define QD_DECODE_TASK 4 /* panels per task at one input row: QD_TMAX of AVX-512 */
#define QD_TASK 2        /* ... from two rows: QD_PAIR */

struct qd_quant_job {
    const float *in;
    int d_in;
    const struct qd_act *a;
};

static void qd_quant_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct qd_quant_job *qj = ctx;
    (void)thread_idx;
    qd_act_quantize_rows(qj->in, qj->d_in, qj->a, (int)begin, (int)end);
}

static void qd_task(void *ctx, long begin, long end, int thread_idx)
{
    static const qd_panels_fn panels[QD_ISA_COUNT] = {
        [QD_ISA_SCALAR] = qd_panels_scalar,
        [QD_ISA_AVX2] = qd_panels_avx2,
        [QD_ISA_AVXVNNI] = qd_panels_avxvnni,
        [QD_ISA_AVX512VNNI] = qd_panels_avx512vnni,
    };
    const struct qd_job *job = ctx;
    const long total = (job->d_out + QD_ROWS - 1) / QD_ROWS;
    const long p0 = begin * job->task_panels;
    const long p1 = end * job->task_panels < total ? end * job->task_panels : total;
    (void)thread_idx;
    panels[job->isa](job, (int)p0, (int)(p1 - p0));
}

int cpu_matmul_int(struct cpu_backend *cb, float *out, const float *in, const void *w,
                   enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    void *own = NULL;
    if (!cpu_backend_qpanels(cb, w, dtype, d_out, d_in)) {
        /* the caller's bytes in kernels.h's layout: panels for this call */
        own = malloc(qd_packed_bytes(dtype, d_out, d_in));
        if (!own)
            return error_set(err, ERR_NOMEM, "cpu matmul: out of memory repacking a [%d, %d] %s matrix",
                             d_out, d_in, kern_dtype_name(dtype));
        qd_pack(dtype, w, d_out, d_in, own);
        w = own;
    }
    int rc = cpu_backend_scratch_reserve(cb, qd_act_bytes(n, d_in), err);
    if (rc < 0) {
        free(own);
        return rc;
    }
    struct qd_act act;
    qd_act_layout(cb->scratch[0], n, d_in, &act);
    struct qd_quant_job qj = {.in = in, .d_in = d_in, .a = &act};
    /* rows are quantized independently: a prompt's on all threads */
    cpu_pool_run(cb->pool, n, (long)n * d_in < 65536 ? n : 1, qd_quant_task, &qj);
    const long n_panels = (d_out + QD_ROWS - 1) / QD_ROWS;
    struct qd_job job = {
        .a = &act, .w = w, .dtype = dtype, .d_out = d_out,
        .panel_bytes = qd_panel_bytes(dtype, d_in), .isa = cb->qdot_isa,
        .task_panels = n <= QD_WIDE_ROWS ? QD_DECODE_TASK : QD_TASK,
    };
    const size_t row_bytes = (size_t)act.nb * QD_BLOCK;
    int job_rows = (int)(QD_JOB_BYTES / row_bytes);
    job_rows = job_rows < QD_RMAX ? QD_RMAX : job_rows;
    for (int i0 = 0; i0 < n; i0 += job_rows) {
        struct qd_act part = act;
        part.q += (size_t)i0 * row_bytes;
        part.s += (size_t)i0 * (size_t)act.nb;
        part.sum += (size_t)i0 * (size_t)act.nb;
        job.a = &part;
        job.n = n - i0 < job_rows ? n - i0 : job_rows;
        job.out = out + (size_t)i0 * (size_t)d_out;
        const long n_tasks = (n_panels + job.task_panels - 1) / job.task_panels;
        long chunk = n_tasks / ((long)cb->n_threads * 16);
        chunk = chunk < 1 ? 1 : chunk;
        /* tiny products are not worth waking the workers */
        if ((long)job.n * d_in * d_out < 32768)
            chunk = n_tasks;
        cpu_pool_run_guided(cb->pool, n_tasks, chunk, qd_task, &job);
    }
    free(own);
    return 0;
}
