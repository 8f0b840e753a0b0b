/* test_kernels_cpu.c: the CPU backend's ops against plain double-precision
 * references written here, plus the exactness contract of kernels.h.
 *
 * Accuracy: every op is compared element-wise with |got - ref| <= atol +
 * rtol * |ref| (tolerances stated at each check; the first mismatches are
 * printed). Inputs are seeded pseudo-random values in [-1, 1).
 * Exactness: batch invariance (a row computed alone vs inside n = 2..17, 31,
 * 33, 40, 70) and
 * thread-count invariance (1 vs 2 vs 3 threads) are compared bit for bit.
 * Weight dtypes bf16, f16 and f32; odd sizes (d_in = 67, 3 heads, head_dim 16,
 * 64 and 128); attention with pos0 > 0 and n > 1.
 * The reference decodes bf16 as bits << 16 and f16 with ldexp, independently
 * of the kernel's conversion code.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "argmax.h"
#include "error.h"
#include "kernels.h"
#include "quant_fixtures.h"
#include "sampling.h"

/* ---- helpers ---------------------------------------------------------- */

static void fill(struct rng *r, float *x, size_t count)
{
    for (size_t i = 0; i < count; i++)
        x[i] = rng_float(r);
}

static double ref_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static double ref_f16(uint16_t h)
{
    int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0)
        v = ldexp((double)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp((double)(mant + 1024), exp - 25);
    return sign ? -v : v;
}

/* Random weights of a dtype (finite values of magnitude < 1); `ref` gets the
 * exact values they stand for. Returns a malloc'd buffer. */
static void *make_weights(struct rng *r, enum kern_dtype dt, size_t count, double *ref)
{
    void *w = malloc(count * kern_dtype_size(dt) + 1);
    assert_non_null(w);
    for (size_t i = 0; i < count; i++) {
        float f = rng_float(r);
        if (dt == KERN_DTYPE_F32) {
            ((float *)w)[i] = f;
            ref[i] = f;
        } else if (dt == KERN_DTYPE_BF16) {
            uint32_t bits;
            memcpy(&bits, &f, sizeof(bits));
            uint16_t h = (uint16_t)(bits >> 16);
            ((uint16_t *)w)[i] = h;
            ref[i] = ref_bf16(h);
        } else {
            /* sign, exponent 1..14 (values 2^-14 .. <1), random mantissa;
             * every 17th value is a subnormal. */
            uint64_t u = rng_next(r);
            uint16_t h = (uint16_t)(((u & 1) << 15) | ((1 + (u >> 1) % 14) << 10) | ((u >> 8) & 0x3ff));
            if (i % 17 == 5)
                h = (uint16_t)((h & 0x83ff) | 0x0000);
            ((uint16_t *)w)[i] = h;
            ref[i] = ref_f16(h);
        }
    }
    return w;
}

/* Counts elements outside atol + rtol*|ref|; prints the first few. */
static int count_mismatches(const char *what, const float *got, const double *ref, size_t count,
                            double atol, double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        double diff = fabs((double)got[i] - ref[i]);
        if (!(diff <= atol + rtol * fabs(ref[i]))) {
            if (bad < 5)
                fprintf(stderr, "%s: mismatch at %zu: got %.9g want %.9g (|diff| %.3g)\n", what, i,
                        (double)got[i], ref[i], diff);
            bad++;
        }
    }
    if (bad)
        fprintf(stderr, "%s: %d of %zu elements out of tolerance (atol %g, rtol %g)\n", what, bad,
                count, atol, rtol);
    return bad;
}

static int count_bit_diffs(const char *what, const float *a, const float *b, size_t count)
{
    int bad = 0;
    for (size_t i = 0; i < count; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            if (bad < 5)
                fprintf(stderr, "%s: bits differ at %zu: %.9g vs %.9g\n", what, i, (double)a[i],
                        (double)b[i]);
            bad++;
        }
    return bad;
}

static struct kern_backend *make_backend(int n_threads)
{
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be = NULL;
    int rc = kern_cpu_create(&be, n_threads, err);
    if (rc != 0)
        fprintf(stderr, "kern_cpu_create: %s\n", err);
    assert_int_equal(rc, 0);
    assert_non_null(be);
    return be;
}

static float *falloc(size_t count)
{
    float *p = calloc(count ? count : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

static double *dalloc(size_t count)
{
    double *p = calloc(count ? count : 1, sizeof(double));
    assert_non_null(p);
    return p;
}

static const enum kern_dtype all_dtypes[3] = {KERN_DTYPE_BF16, KERN_DTYPE_F16, KERN_DTYPE_F32};

/* ---- references --------------------------------------------------------- */

static void ref_matmul(double *out, const float *in, const double *w, int n, int d_in, int d_out)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < d_out; o++) {
            double s = 0;
            for (int k = 0; k < d_in; k++)
                s += (double)in[(size_t)i * d_in + k] * w[(size_t)o * d_in + k];
            out[(size_t)i * d_out + o] = s;
        }
}

static void ref_rmsnorm(double *out, const float *in, const double *w, int n, int dim, double eps)
{
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int k = 0; k < dim; k++)
            ss += (double)in[(size_t)i * dim + k] * in[(size_t)i * dim + k];
        double r = 1.0 / sqrt(ss / dim + eps);
        for (int k = 0; k < dim; k++)
            out[(size_t)i * dim + k] = in[(size_t)i * dim + k] * r * w[k];
    }
}

static void ref_rope(double *out, const float *x, const int32_t *pos, int n, int n_heads, int hd,
                     const float *inv_freq)
{
    int half = hd / 2;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            const float *v = x + ((size_t)i * n_heads + h) * hd;
            double *o = out + ((size_t)i * n_heads + h) * hd;
            for (int j = 0; j < half; j++) {
                /* the angle is rounded to f32 as HF computes it */
                double a = (double)((float)pos[i] * inv_freq[j]);
                o[j] = v[j] * cos(a) - (double)v[j + half] * sin(a);
                o[j + half] = v[j + half] * cos(a) + (double)v[j] * sin(a);
            }
        }
}

static void ref_attention(double *out, const float *q, const float *kc, const float *vc, int n,
                          int pos0, int n_heads, int n_kv, int hd, double scale)
{
    int group = n_heads / n_kv;
    double *s = dalloc((size_t)(pos0 + n));
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            int g = h / group, np = pos0 + i + 1;
            const float *qv = q + ((size_t)i * n_heads + h) * hd;
            double m = -INFINITY, sum = 0;
            for (int t = 0; t < np; t++) {
                const float *kv = kc + ((size_t)t * n_kv + g) * hd;
                double d = 0;
                for (int k = 0; k < hd; k++)
                    d += (double)qv[k] * kv[k];
                s[t] = d * scale;
                m = s[t] > m ? s[t] : m;
            }
            for (int t = 0; t < np; t++) {
                s[t] = exp(s[t] - m);
                sum += s[t];
            }
            double *o = out + ((size_t)i * n_heads + h) * hd;
            for (int k = 0; k < hd; k++) {
                double acc = 0;
                for (int t = 0; t < np; t++)
                    acc += s[t] / sum * vc[((size_t)t * n_kv + g) * hd + k];
                o[k] = acc;
            }
        }
    free(s);
}

/* ---- matmul ------------------------------------------------------------- */

/* ---- bf16 weights on vdpbf16ps (kernels/cpu/bfdot.h) ------------------ */

/* The contract's emulation, written here from bfdot.h's rules and Intel's
 * pseudocode (not from the kernel's code); test_kernels_cpu_bf16_dot_step_
 * is_the_instruction holds it against the instruction itself. */

static int bf16_dot_on(const struct kern_backend *be)
{
    return kern_cpu_bf16_dot(be) == 1;
}

/* Rule 1, as vcvtneps2bf16: a zero or denormal to a zero of its sign, a NaN
 * to its quiet high half, anything else to nearest even. */
static uint16_t bf_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0)
        return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* A denormal (input: DAZ; result: FTZ) as a zero of its sign. */
static float bf_flush(float x)
{
    return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x;
}

/* One vdpbf16ps lane: acc + x1 w1, rounded, then + x0 w0, rounded (each
 * product of two bf16 is exact, so fmaf is the one rounding). */
static float bf_step(float acc, uint16_t w0, uint16_t w1, uint16_t x0, uint16_t x1)
{
    const float t = bf_flush(fmaf(bf_flush((float)ref_bf16(x1)), bf_flush((float)ref_bf16(w1)),
                                  bf_flush(acc)));
    return bf_flush(fmaf(bf_flush((float)ref_bf16(x0)), bf_flush((float)ref_bf16(w0)), t));
}

/* Rule 2 and 3: 16 lanes of pairs over the row padded to 32 columns, then
 * (l_j + l_{j+8}) and the fold of eight lanes. x: the row already rounded. */
static float bf_dot_ref(const uint16_t *w, const uint16_t *x, int d_in)
{
    float l[16] = {0};
    for (int k0 = 0; k0 < d_in; k0 += 32)
        for (int j = 0; j < 16; j++) {
            const int k = k0 + 2 * j;
            const uint16_t w0 = k < d_in ? w[k] : 0, w1 = k + 1 < d_in ? w[k + 1] : 0;
            const uint16_t x0 = k < d_in ? x[k] : 0, x1 = k + 1 < d_in ? x[k + 1] : 0;
            l[j] = bf_step(l[j], w0, w1, x0, x1);
        }
    float m[8];
    for (int j = 0; j < 8; j++)
        m[j] = l[j] + l[j + 8];
    const float a0 = m[0] + m[4], a1 = m[1] + m[5], a2 = m[2] + m[6], a3 = m[3] + m[7];
    return (a0 + a2) + (a1 + a3);
}

static void bf_round_rows(const float *in, size_t count, uint16_t *xb)
{
    for (size_t i = 0; i < count; i++)
        xb[i] = bf_round(in[i]);
}

/* in rounded by rule 1, as f32 (the input the f64 reference takes when the
 * backend runs bf16 on vdpbf16ps). */
static float *bf_rounded_copy(const float *in, size_t count)
{
    float *out = malloc((count ? count : 1) * sizeof *out);
    assert_non_null(out);
    for (size_t i = 0; i < count; i++)
        out[i] = (float)ref_bf16(bf_round(in[i]));
    return out;
}

static void test_kernels_cpu_matmul_matches_reference_for_every_dtype(void **state)
{
    static const int shapes[][3] = {
        /* n, d_in, d_out */
        {1, 64, 16}, {1, 67, 13}, {2, 67, 9}, {3, 130, 37}, {5, 8, 4},
        {16, 67, 21}, {4, 1, 5}, {7, 259, 66}, {1, 2048, 20}, {20, 67, 21}, {35, 300, 10},
    };
    struct kern_backend *be = make_backend(2);
    struct rng r = {42};
    char err[ERR_MSG_MAX];
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int di = 0; di < 3; di++) {
            int n = shapes[si][0], d_in = shapes[si][1], d_out = shapes[si][2];
            enum kern_dtype dt = all_dtypes[di];
            double *wref = dalloc((size_t)d_in * d_out);
            void *w = make_weights(&r, dt, (size_t)d_in * d_out, wref);
            float *in = falloc((size_t)n * d_in), *out = falloc((size_t)n * d_out);
            double *ref = dalloc((size_t)n * d_out);
            fill(&r, in, (size_t)n * d_in);
            assert_int_equal(be->ops->matmul(be, out, in, w, dt, n, d_in, d_out, err), 0);
            /* on vdpbf16ps the product takes the input rounded to bf16 */
            float *rin = dt == KERN_DTYPE_BF16 && bf16_dot_on(be) ? bf_rounded_copy(in, (size_t)n * d_in) : NULL;
            ref_matmul(ref, rin ? rin : in, wref, n, d_in, d_out);
            free(rin);
            char what[96];
            snprintf(what, sizeof(what), "matmul %s n=%d d_in=%d d_out=%d", kern_dtype_name(dt), n,
                     d_in, d_out);
            /* f32 accumulation of up to 2048 terms of magnitude < 1 */
            assert_int_equal(count_mismatches(what, out, ref, (size_t)n * d_out, 1e-5 * sqrt(d_in),
                                              1e-5),
                             0);
            free(w);
            free(wref);
            free(in);
            free(out);
            free(ref);
        }
    be->ops->destroy(be);
}

/* Decode and verification products (n = 1..17: the output and input pair
 * paths) large enough that the pool hands them out in many claims of
 * shrinking size (guided claims), with short rows (the whole-block
 * prefetch) and long ones (k-blocks at 2..5 rows): every output matches the
 * reference, and 2 and 3 threads give the 1-thread bits, whoever claimed
 * which rows. */
static void test_kernels_cpu_matmul_decode_over_many_claims_matches_one_thread(void **state)
{
    static const int shapes[][3] = {
        /* n, d_in, d_out */
        {1, 389, 4099}, {2, 389, 4099}, {5, 200, 3001}, {1, 2085, 1031}, {3, 2085, 1031},
        {9, 389, 2053}, {17, 200, 3001},
    };
    struct kern_backend *be[3];
    for (int t = 0; t < 3; t++)
        be[t] = make_backend(t + 1);
    struct rng r = {1234};
    char err[ERR_MSG_MAX];
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int di = 0; di < 3; di++) {
            const int n = shapes[si][0], d_in = shapes[si][1], d_out = shapes[si][2];
            const enum kern_dtype dt = all_dtypes[di];
            const size_t count = (size_t)n * d_out;
            double *wref = dalloc((size_t)d_in * d_out);
            void *w = make_weights(&r, dt, (size_t)d_in * d_out, wref);
            float *in = falloc((size_t)n * d_in);
            fill(&r, in, (size_t)n * d_in);
            float *out[3];
            for (int t = 0; t < 3; t++) {
                out[t] = falloc(count);
                assert_int_equal(be[t]->ops->matmul(be[t], out[t], in, w, dt, n, d_in, d_out, err),
                                 0);
            }
            double *ref = dalloc(count);
            float *rin = dt == KERN_DTYPE_BF16 && bf16_dot_on(be[0]) ? bf_rounded_copy(in, (size_t)n * d_in) : NULL;
            ref_matmul(ref, rin ? rin : in, wref, n, d_in, d_out);
            free(rin);
            char what[96];
            snprintf(what, sizeof(what), "matmul %s n=%d d_in=%d d_out=%d", kern_dtype_name(dt), n,
                     d_in, d_out);
            assert_int_equal(count_mismatches(what, out[0], ref, count, 1e-5 * sqrt(d_in), 1e-5), 0);
            for (int t = 1; t < 3; t++) {
                snprintf(what, sizeof(what), "matmul %s n=%d d_in=%d d_out=%d: 1 vs %d threads",
                         kern_dtype_name(dt), n, d_in, d_out, t + 1);
                assert_int_equal(count_bit_diffs(what, out[0], out[t], count), 0);
            }
            for (int t = 0; t < 3; t++)
                free(out[t]);
            free(ref);
            free(w);
            free(wref);
            free(in);
        }
    for (int t = 0; t < 3; t++)
        be[t]->ops->destroy(be[t]);
}

/* Each row of an n = 40 product (the prefill path) equals the same row
 * computed alone (n = 1), inside n = 3 and inside n = 16 (the decode and
 * verification path, other tilings), bit for bit. */
static void test_kernels_cpu_matmul_row_is_bit_identical_alone_and_in_batch(void **state)
{
    static const int shapes[][2] = {{67, 37}, {2048, 70}, {8, 5}, {1000, 9}};
    const int n = 40;
    struct kern_backend *be = make_backend(2);
    struct rng r = {7};
    char err[ERR_MSG_MAX];
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int di = 0; di < 3; di++) {
            int d_in = shapes[si][0], d_out = shapes[si][1];
            enum kern_dtype dt = all_dtypes[di];
            double *wref = dalloc((size_t)d_in * d_out);
            void *w = make_weights(&r, dt, (size_t)d_in * d_out, wref);
            float *in = falloc((size_t)n * d_in), *batch = falloc((size_t)n * d_out);
            float *one = falloc((size_t)n * d_out), *three = falloc((size_t)n * d_out);
            float *sixteen = falloc((size_t)n * d_out);
            fill(&r, in, (size_t)n * d_in);
            assert_int_equal(be->ops->matmul(be, batch, in, w, dt, n, d_in, d_out, err), 0);
            for (int i = 0; i < n; i += 1)
                assert_int_equal(be->ops->matmul(be, one + (size_t)i * d_out,
                                                 in + (size_t)i * d_in, w, dt, 1, d_in, d_out, err),
                                 0);
            for (int i = 0; i < n; i += 3) {
                int rows = n - i < 3 ? n - i : 3;
                assert_int_equal(be->ops->matmul(be, three + (size_t)i * d_out,
                                                 in + (size_t)i * d_in, w, dt, rows, d_in, d_out,
                                                 err),
                                 0);
            }
            for (int i = 0; i < n; i += 16) {
                int rows = n - i < 16 ? n - i : 16;
                assert_int_equal(be->ops->matmul(be, sixteen + (size_t)i * d_out,
                                                 in + (size_t)i * d_in, w, dt, rows, d_in, d_out,
                                                 err),
                                 0);
            }
            char what[96];
            snprintf(what, sizeof(what), "matmul %s d_in=%d: n=1 vs n=40", kern_dtype_name(dt), d_in);
            assert_int_equal(count_bit_diffs(what, one, batch, (size_t)n * d_out), 0);
            snprintf(what, sizeof(what), "matmul %s d_in=%d: n=3 vs n=40", kern_dtype_name(dt), d_in);
            assert_int_equal(count_bit_diffs(what, three, batch, (size_t)n * d_out), 0);
            snprintf(what, sizeof(what), "matmul %s d_in=%d: n=16 vs n=40", kern_dtype_name(dt), d_in);
            assert_int_equal(count_bit_diffs(what, sixteen, batch, (size_t)n * d_out), 0);
            free(w);
            free(wref);
            free(in);
            free(batch);
            free(one);
            free(three);
            free(sixteen);
        }
    be->ops->destroy(be);
}

/* The fixed order of kernels/cpu/cpu_simd.h, in scalar code: lane j takes
 * the terms k = j, j+8, ... below len & ~7 by fmaf, the lanes are folded
 * (l0+l4, l1+l5, l2+l6, l3+l7), (a0+a2, a1+a3), b0+b1, and the tail is added
 * term by term by fmaf. */
static float fixed_order_dot(const float *w, const float *x, int len)
{
    const int len8 = len & ~7;
    float l[8] = {0};
    for (int k = 0; k < len8; k += 8)
        for (int j = 0; j < 8; j++)
            l[j] = fmaf(w[k + j], x[k + j], l[j]);
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    float s = (a0 + a2) + (a1 + a3);
    for (int k = len8; k < len; k++)
        s = fmaf(w[k], x[k], s);
    return s;
}

/* The same order for a plain sum: eight lanes, the fold, the tail. */
static float fixed_order_sum(const float *x, int len)
{
    const int len8 = len & ~7;
    float l[8] = {0};
    for (int k = 0; k < len8; k += 8)
        for (int j = 0; j < 8; j++)
            l[j] += x[k + j];
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    float s = (a0 + a2) + (a1 + a3);
    for (int k = len8; k < len; k++)
        s += x[k];
    return s;
}

/* Every path (every n of decode, verification and prefill, every tile and
 * remainder) computes each output in exactly that order, bit for bit: the
 * CUDA kernels and the other backends' references rely on the order itself,
 * not only on the CPU agreeing with itself across n. d_in covers no full
 * 8-step, one, a tail after full 32-column blocks, and 1, 2 or 3 8-steps
 * after them (the SIMD paths read 32 weights per row at a time), on both
 * sides of 4096 (where the paths for n = 6..17 change); d_out leaves 1, 2 or
 * 3 rows after the 4-row blocks, and at 29 (one claim up to d_in 1000) one
 * row goes through 8 x 1 tiles over runs of 3 rows, then a lone 4-row
 * block, then the last row, and 2 or 3 rows through 4 x n tiles over runs
 * of 7, then the last row (AVX2 without AVX-512F+BW). */
static void test_kernels_cpu_matmul_every_path_follows_the_fixed_order(void **state)
{
    static const int d_ins[] = {5, 8, 67, 83, 123, 2051, 1000, 4105, 8195};
    static const int d_outs[] = {29, 6, 7};
    /* 18..40: prefill (AVX2 alone: the direct path's 2 x n tiles in groups;
     * AVX-512F+BW: the panel) */
    const int n_max = 40;
    struct kern_backend *be = make_backend(2);
    struct rng r = {23};
    char err[ERR_MSG_MAX];
    for (size_t si = 0; si < sizeof(d_ins) / sizeof(d_ins[0]); si++)
        for (int di = 0; di < 3; di++) {
            const int d_in = d_ins[si], d_out = d_outs[si % 3];
            enum kern_dtype dt = all_dtypes[di];
            double *wref = dalloc((size_t)d_in * d_out);
            void *w = make_weights(&r, dt, (size_t)d_in * d_out, wref);
            float *wf = falloc((size_t)d_in * d_out), *in = falloc((size_t)n_max * d_in);
            float *ref = falloc((size_t)n_max * d_out), *out = falloc((size_t)n_max * d_out);
            for (size_t i = 0; i < (size_t)d_in * d_out; i++)
                wf[i] = (float)wref[i]; /* exact: the weights are bf16/f16/f32 values */
            fill(&r, in, (size_t)n_max * d_in);
            /* bf16 on vdpbf16ps follows its own order (bfdot.h) */
            uint16_t *xb = NULL;
            if (dt == KERN_DTYPE_BF16 && bf16_dot_on(be)) {
                xb = malloc((size_t)n_max * d_in * sizeof *xb);
                assert_non_null(xb);
                bf_round_rows(in, (size_t)n_max * d_in, xb);
            }
            for (int i = 0; i < n_max; i++)
                for (int o = 0; o < d_out; o++)
                    ref[(size_t)i * d_out + o] =
                        xb ? bf_dot_ref((const uint16_t *)w + (size_t)o * d_in, xb + (size_t)i * d_in, d_in)
                           : fixed_order_dot(wf + (size_t)o * d_in, in + (size_t)i * d_in, d_in);
            free(xb);
            for (int n = 1; n <= n_max; n += n < 18 ? 1 : 11) {
                memset(out, 0xff, (size_t)n * d_out * sizeof(float));
                assert_int_equal(be->ops->matmul(be, out, in, w, dt, n, d_in, d_out, err), 0);
                char what[96];
                snprintf(what, sizeof(what), "matmul %s d_in=%d d_out=%d n=%d vs fixed order",
                         kern_dtype_name(dt), d_in, d_out, n);
                assert_int_equal(count_bit_diffs(what, ref, out, (size_t)n * d_out), 0);
            }
            free(w);
            free(wref);
            free(wf);
            free(in);
            free(ref);
            free(out);
        }
    be->ops->destroy(be);
}


#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BF_HW 1
/* The instruction itself on one lane (all 16 given the same operands). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static float
bf_step_hw(float acc, uint16_t w0, uint16_t w1, uint16_t x0, uint16_t x1)
{
    const __m512i w = _mm512_set1_epi32((int)((uint32_t)w1 << 16 | w0));
    const __m512i x = _mm512_set1_epi32((int)((uint32_t)x1 << 16 | x0));
    return _mm512_cvtss_f32(_mm512_dpbf16_ps(_mm512_set1_ps(acc), (__m512bh)w, (__m512bh)x));
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static uint16_t bf_round_hw(float x)
{
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_set1_ps(x));
    uint16_t out[16];
    memcpy(out, &b, sizeof out);
    return out[0];
}
#endif

static int same_float(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

/* A bf16 of sign, biased exponent in [e0, e0 + span) and random mantissa. */
static uint16_t bf_rand(struct rng *r, int e0, int span)
{
    const uint64_t u = rng_next(r);
    return (uint16_t)((u & 0x807f) | (uint64_t)(e0 + (int)((u >> 16) % (uint64_t)span)) << 7);
}

/* bf_step and bf_round are the instruction, bit for bit (NaNs as NaNs): on
 * random bits, on moderate values (rounding at every step), on products and
 * sums near and below 2^-126 (DAZ, FTZ between the two steps and after),
 * on cancellations into denormals, on overflow to infinity, and on denormal
 * inputs. The order (the odd column's product first) is what the moderate
 * cases pin: the other order, a single rounding of the three terms, or the
 * products summed first each miss about 5% of them. */
static void test_kernels_cpu_bf16_dot_step_is_the_instruction(void **state)
{
    (void)state;
#ifdef BF_HW
    struct kern_backend *be = make_backend(1);
    char err_on[ERR_MSG_MAX];
    const int on = kern_cpu_set_bf16_dot(be, 1, err_on) == 0;
    be->ops->destroy(be);
    if (!on) {
        fprintf(stderr, "no AVX512_BF16 on this CPU: the emulation is not checked here\n");
        return;
    }
    struct rng r = {31337};
    int bad = 0;
    for (int it = 0; it < 400000; it++) {
        const int mode = it % 6;
        uint16_t w0, w1, x0, x1;
        uint32_t ab = (uint32_t)rng_next(&r);
        switch (mode) {
        case 0: /* anything, NaNs and infinities included */
            w0 = (uint16_t)rng_next(&r), w1 = (uint16_t)rng_next(&r);
            x0 = (uint16_t)rng_next(&r), x1 = (uint16_t)rng_next(&r);
            break;
        case 1: /* moderate: every step rounds */
            w0 = bf_rand(&r, 120, 16), w1 = bf_rand(&r, 120, 16);
            x0 = bf_rand(&r, 120, 16), x1 = bf_rand(&r, 120, 16);
            ab = (ab & 0x807fffffu) | (uint32_t)(110 + (int)(rng_next(&r) % 40)) << 23;
            break;
        case 2: /* products and sums about 2^-126 */
            w0 = bf_rand(&r, 60, 8), w1 = bf_rand(&r, 60, 8);
            x0 = bf_rand(&r, 60, 8), x1 = bf_rand(&r, 60, 8);
            ab = (ab & 0x807fffffu) | (uint32_t)(rng_next(&r) % 4) << 23;
            break;
        case 3: /* cancellation into denormals */
            w1 = bf_rand(&r, 63, 2), x1 = bf_rand(&r, 63, 2);
            w0 = (uint16_t)(w1 ^ 0x8000u ^ (rng_next(&r) & 3)), x0 = x1;
            ab = (ab & 0x807fffffu) | (uint32_t)(rng_next(&r) % 3) << 23;
            break;
        case 4: /* past the float range */
            w0 = bf_rand(&r, 190, 64), w1 = bf_rand(&r, 190, 64);
            x0 = bf_rand(&r, 190, 64), x1 = bf_rand(&r, 190, 64);
            ab = (ab & 0x807fffffu) | (uint32_t)(240 + (int)(rng_next(&r) % 15)) << 23;
            break;
        default: /* denormal inputs */
            w0 = (uint16_t)(rng_next(&r) & 0x807f), x0 = bf_rand(&r, 120, 16);
            w1 = bf_rand(&r, 120, 16), x1 = (uint16_t)(rng_next(&r) & 0x807f);
            ab &= 0x807fffffu;
            break;
        }
        float acc;
        memcpy(&acc, &ab, sizeof acc);
        const float hw = bf_step_hw(acc, w0, w1, x0, x1), em = bf_step(acc, w0, w1, x0, x1);
        if (!same_float(hw, em)) {
            if (bad < 5)
                fprintf(stderr, "vdpbf16ps (mode %d): acc %a w %04x %04x x %04x %04x: %a, emulated %a\n",
                        mode, (double)acc, w0, w1, x0, x1, (double)hw, (double)em);
            bad++;
        }
        /* the rounding of an f32, from the same bits */
        float f;
        memcpy(&f, &ab, sizeof f);
        const uint16_t rh = bf_round_hw(f), re = bf_round(f);
        if (rh != re && !(isnan(f) && (rh & 0x7fc0) == 0x7fc0 && (re & 0x7fc0) == 0x7fc0)) {
            if (bad < 5)
                fprintf(stderr, "vcvtneps2bf16: %a (%08x): %04x, emulated %04x\n", (double)f, ab, rh, re);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
#endif
}

/* The emulated product of rows [0, n) of xb against w: ref [n][d_out]. */
static void bf_matmul_ref(float *ref, const uint16_t *xb, const uint16_t *w, int n, int d_in, int d_out)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < d_out; o++)
            ref[(size_t)i * d_out + o] = bf_dot_ref(w + (size_t)o * d_in, xb + (size_t)i * d_in, d_in);
}

/* On vdpbf16ps every product is the emulation's, bit for bit: n = 1..40
 * (decode, every verification, prefill tiles and their groups of rows)
 * then up to 256 (several jobs of rows), every tail of K (d_in mod 32 =
 * 0..31) and of N (d_out mod 16, past the tiles of 8 and 4), on 1, 2 and 3
 * threads; each row alone equals the same row in every batch; mapped
 * matrices as the caller's bytes. Inputs include denormals, values that
 * round past the largest bf16, and ties. */
static void test_kernels_cpu_matmul_bf16_dot_matches_the_emulation(void **state)
{
    (void)state;
    struct kern_backend *be[3];
    char err_on[ERR_MSG_MAX];
    int on = 1;
    for (int t = 0; t < 3; t++) {
        be[t] = make_backend(t + 1);
        /* on by default where the CPU has it; the f32 run (TANDEM_CPU_BF16_DOT=0) needs it here */
        on = on && kern_cpu_set_bf16_dot(be[t], 1, err_on) == 0;
    }
    if (!on) {
        fprintf(stderr, "no AVX512_BF16 on this CPU: bf16 takes the f32 paths\n");
        for (int t = 0; t < 3; t++)
            be[t]->ops->destroy(be[t]);
        return;
    }
    struct rng r = {4242};
    char err[ERR_MSG_MAX];
    const int n_max = 256;
    /* d_in: every tail of 32 below 64, then longer rows, the last so long
     * that a product's rows split into several jobs (bfdot.c: BD_JOB_BYTES
     * of rounded input a job, 64 rows of 2048); d_out: tails of 16 */
    for (int d_in = 1; d_in <= 2048; d_in += d_in < 64 ? 1 : d_in < 64 + 3 * 67 ? 67 : 2048 - (64 + 3 * 67)) {
        const int d_out = 1 + (d_in * 7) % 37;
        double *wref = dalloc((size_t)d_in * d_out);
        uint16_t *w = make_weights(&r, KERN_DTYPE_BF16, (size_t)d_in * d_out, wref);
        float *in = falloc((size_t)n_max * d_in);
        fill(&r, in, (size_t)n_max * d_in);
        for (size_t k = 0; k < (size_t)n_max * d_in; k += 97)
            in[k] = k % 3 == 0 ? 0x1p-130f : k % 3 == 1 ? 3.4e38f : 1.00390625f; /* denormal, overflow, tie */
        uint16_t *xb = malloc((size_t)n_max * d_in * sizeof *xb);
        assert_non_null(xb);
        bf_round_rows(in, (size_t)n_max * d_in, xb);
        float *ref = falloc((size_t)n_max * d_out), *out = falloc((size_t)n_max * d_out);
        bf_matmul_ref(ref, xb, w, n_max, d_in, d_out);
        const void *mapped = NULL;
        assert_int_equal(be[1]->ops->map_matrix(be[1], w, KERN_DTYPE_BF16, d_out, d_in, &mapped, err), 0);
        for (int n = 1; n <= n_max; n += n < 40 ? 1 : 27) {
            for (int t = 0; t < 3; t++) {
                const void *wt = t == 1 ? mapped : w;
                /* each n takes its rows from a different offset: a row's
                 * bits cannot depend on where in the batch it sits */
                const int i0 = (n * 5 + t) % (n_max - n + 1);
                memset(out, 0xff, (size_t)n * d_out * sizeof(float));
                assert_int_equal(be[t]->ops->matmul(be[t], out, in + (size_t)i0 * d_in, wt,
                                                    KERN_DTYPE_BF16, n, d_in, d_out, err),
                                 0);
                char what[96];
                snprintf(what, sizeof what, "bf16 dot d_in=%d d_out=%d n=%d rows %d.. %d threads", d_in,
                         d_out, n, i0, t + 1);
                assert_int_equal(count_bit_diffs(what, ref + (size_t)i0 * d_out, out, (size_t)n * d_out), 0);
            }
        }
        be[1]->ops->unmap_weights(be[1], mapped);
        free(w);
        free(wref);
        free(in);
        free(xb);
        free(ref);
        free(out);
    }
    for (int t = 0; t < 3; t++)
        be[t]->ops->destroy(be[t]);
}

/* Matrices map_matrix laid out in line octets (packed.h: copies of at least
 * 2 MiB, rows a multiple of 32) give the emulation's bits too, on every
 * path over them: one row's side-by-side octets, the rotations of octets
 * over k-blocks at 2..18 rows (a last, shorter k-block at 1056 columns; at
 * 8192 a job of rows is 16, so 17.. rows run as several jobs), the halves
 * of octets from 7 rows, prefill, and the row-major rows after the last
 * full octet (d_out 1003 and 131 leave 3); 1-3 threads, each row alone
 * equal to the same row in every batch. */
static void test_kernels_cpu_matmul_bf16_dot_line_octets_match_the_emulation(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1056, 1003}, {8192, 131}};
    static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 18, 19, 24, 33, 40, 64, 100};
    const int n_max = 100;
    struct kern_backend *be[3];
    char err[ERR_MSG_MAX];
    int on = 1;
    for (int t = 0; t < 3; t++) {
        be[t] = make_backend(t + 1);
        on = on && kern_cpu_set_bf16_dot(be[t], 1, err) == 0;
    }
    struct rng r = {5150};
    for (size_t si = 0; on && si < sizeof shapes / sizeof shapes[0]; si++) {
        const int d_in = shapes[si][0], d_out = shapes[si][1];
        double *wref = dalloc((size_t)d_in * d_out);
        uint16_t *w = make_weights(&r, KERN_DTYPE_BF16, (size_t)d_in * d_out, wref);
        float *in = falloc((size_t)n_max * d_in);
        fill(&r, in, (size_t)n_max * d_in);
        uint16_t *xb = malloc((size_t)n_max * d_in * sizeof *xb);
        assert_non_null(xb);
        bf_round_rows(in, (size_t)n_max * d_in, xb);
        float *ref = falloc((size_t)n_max * d_out), *out = falloc((size_t)n_max * d_out);
        bf_matmul_ref(ref, xb, w, n_max, d_in, d_out);
        const void *mapped[3];
        for (int t = 0; t < 3; t++) {
            assert_int_equal(be[t]->ops->map_matrix(be[t], w, KERN_DTYPE_BF16, d_out, d_in, &mapped[t], err), 0);
            /* a copy is laid out anew (none where huge pages are missing) */
            if (mapped[t] != (const void *)w)
                assert_int_not_equal(memcmp(mapped[t], w, (size_t)d_in * d_out * 2), 0);
        }
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int n = ns[ni];
            for (int t = 0; t < 3; t++) {
                const int i0 = (n * 7 + t) % (n_max - n + 1);
                memset(out, 0xff, (size_t)n * d_out * sizeof(float));
                assert_int_equal(be[t]->ops->matmul(be[t], out, in + (size_t)i0 * d_in, mapped[t],
                                                    KERN_DTYPE_BF16, n, d_in, d_out, err),
                                 0);
                char what[96];
                snprintf(what, sizeof what, "bf16 dot, line octets, d_in=%d d_out=%d n=%d rows %d.. %d threads",
                         d_in, d_out, n, i0, t + 1);
                assert_int_equal(count_bit_diffs(what, ref + (size_t)i0 * d_out, out, (size_t)n * d_out), 0);
            }
        }
        for (int t = 0; t < 3; t++)
            be[t]->ops->unmap_weights(be[t], mapped[t]);
        free(w);
        free(wref);
        free(in);
        free(xb);
        free(ref);
        free(out);
    }
    if (!on)
        fprintf(stderr, "no AVX512_BF16 on this CPU: bf16 takes the f32 paths\n");
    for (int t = 0; t < 3; t++)
        be[t]->ops->destroy(be[t]);
}

/* Turned off, bf16 weights take the f32 paths again (the fixed order of
 * cpu_simd.h on the unrounded input); turning it on where the CPU lacks it
 * is refused. */
static void test_kernels_cpu_bf16_dot_can_be_turned_off(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    /* the run's own setting, put back at the end for the tests after this */
    const char *variant = getenv("TANDEM_CPU_BF16_DOT");
    const int variant_on = variant != NULL && strcmp(variant, "1") == 0;
    /* the environment's choice, read at creation */
    struct kern_backend *env_be = NULL;
    assert_int_equal(setenv("TANDEM_CPU_BF16_DOT", "0", 1), 0);
    assert_int_equal(kern_cpu_create(&env_be, 1, err), 0);
    assert_int_equal(kern_cpu_bf16_dot(env_be), 0);
    const int supported = kern_cpu_set_bf16_dot(env_be, 1, err) == 0; /* the backend's own check */
    env_be->ops->destroy(env_be);
    assert_int_equal(setenv("TANDEM_CPU_BF16_DOT", "yes", 1), 0);
    assert_int_equal(kern_cpu_create(&env_be, 1, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "TANDEM_CPU_BF16_DOT"));
    if (supported) {
        assert_int_equal(setenv("TANDEM_CPU_BF16_DOT", "1", 1), 0);
        assert_int_equal(kern_cpu_create(&env_be, 1, err), 0);
        assert_int_equal(kern_cpu_bf16_dot(env_be), 1);
        env_be->ops->destroy(env_be);
    }
    assert_int_equal(unsetenv("TANDEM_CPU_BF16_DOT"), 0);
    struct kern_backend *be = make_backend(2);
    /* the tests after this one run as the process was started */
    if (variant_on)
        assert_int_equal(setenv("TANDEM_CPU_BF16_DOT", "1", 1), 0);
    assert_int_equal(kern_cpu_bf16_dot(be), supported); /* on wherever the CPU has it */
    if (!supported) {
        assert_int_equal(kern_cpu_set_bf16_dot(be, 1, err), ERR_UNSUPPORTED);
        be->ops->destroy(be);
        return;
    }
    assert_int_equal(kern_cpu_set_bf16_dot(be, 1, err), 0);
    assert_int_equal(kern_cpu_bf16_dot(be), 1);
    assert_int_equal(kern_cpu_set_bf16_dot(be, 0, err), 0);
    assert_int_equal(kern_cpu_bf16_dot(be), 0);
    struct rng r = {99};
    const int n = 3, d_in = 70, d_out = 9;
    double *wref = dalloc((size_t)d_in * d_out);
    uint16_t *w = make_weights(&r, KERN_DTYPE_BF16, (size_t)d_in * d_out, wref);
    float *in = falloc((size_t)n * d_in), *out = falloc((size_t)n * d_out), *ref = falloc((size_t)n * d_out);
    float *wf = falloc((size_t)d_in * d_out);
    for (size_t i = 0; i < (size_t)d_in * d_out; i++)
        wf[i] = (float)wref[i];
    fill(&r, in, (size_t)n * d_in);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < d_out; o++)
            ref[(size_t)i * d_out + o] = fixed_order_dot(wf + (size_t)o * d_in, in + (size_t)i * d_in, d_in);
    assert_int_equal(be->ops->matmul(be, out, in, w, KERN_DTYPE_BF16, n, d_in, d_out, err), 0);
    assert_int_equal(count_bit_diffs("bf16 dot off: f32 order", ref, out, (size_t)n * d_out), 0);
    assert_int_equal(kern_cpu_set_bf16_dot(be, 1, err), 0);
    be->ops->destroy(be);
    free(w);
    free(wref);
    free(wf);
    free(in);
    free(out);
    free(ref);
}

/* ---- int8 / int4 weights: integer products (kernels/cpu/qdot.h) -------- */

/* The contract's reference, written here from kernels.h's layouts and
 * qdot.h's rules (not from the kernel's code): each input row quantized
 * alone in blocks of 32, the integer sum of each block in plain int, and
 * the float epilogue in block order. */
static void ref_quantize_row(const float *x, int d_in, int8_t *q, float *s, int nb)
{
    memset(q, 0, (size_t)nb * 32);
    for (int b = 0; b < nb; b++) {
        const int len = d_in - 32 * b < 32 ? d_in - 32 * b : 32;
        float amax = 0.0f;
        int bad = 0;
        for (int k = 0; k < len; k++) {
            const float v = fabsf(x[32 * b + k]);
            bad |= !(v <= FLT_MAX);
            amax = v > amax ? v : amax;
        }
        s[b] = bad ? NAN : amax < 0x1p-96f ? 0.0f : amax / 127.0f;
        if (bad || amax < 0x1p-96f)
            continue;
        const float inv = 127.0f / amax;
        for (int k = 0; k < len; k++)
            q[32 * b + k] = (int8_t)lrintf(x[32 * b + k] * inv);
    }
}

/* A quantized matrix: dt, its bytes (kernels.h's layout) and shape. */
struct qmat {
    enum kern_dtype dt;
    const void *w;
    int d_out, d_in;
};

static float ref_int_dot(const struct qmat *m, int o, const int8_t *q, const float *s)
{
    const enum kern_dtype dt = m->dt;
    const void *w = m->w;
    const int d_in = m->d_in, d_out = m->d_out;
    const int nb = (d_in + 31) / 32;
    float acc = 0.0f, wsc;
    for (int b = 0; b < nb; b++) {
        int32_t isum = 0;
        for (int k = 32 * b; k < d_in && k < 32 * b + 32; k++) {
            int wv;
            if (dt == KERN_DTYPE_Q8) {
                wv = ((const int8_t *)w)[(size_t)o * d_in + k];
            } else {
                const uint8_t *g = (const uint8_t *)w + ((size_t)o * d_in + k) / 32 * KERN_Q4_GROUP_BYTES;
                wv = (k % 32 < 16 ? g[k % 32] & 15 : g[k % 32 - 16] >> 4) - 8;
            }
            isum += wv * q[k];
        }
        if (dt == KERN_DTYPE_Q8) {
            acc = fmaf((float)isum, s[b], acc);
        } else {
            memcpy(&wsc, (const uint8_t *)w + ((size_t)o * (d_in / 32) + b) * KERN_Q4_GROUP_BYTES + 16, 4);
            acc = fmaf((float)isum, wsc * s[b], acc);
        }
    }
    if (dt == KERN_DTYPE_Q8) {
        memcpy(&wsc, (const char *)w + kern_q8_scales_offset(d_out, d_in) + 4 * (size_t)o, 4);
        acc *= wsc;
    }
    return acc;
}

/* ref[n][d_out] by the reference. */
static void ref_int_matmul(const struct qmat *m, const float *in, int n, float *ref)
{
    const int d_in = m->d_in, d_out = m->d_out;
    const int nb = (d_in + 31) / 32;
    int8_t *q = malloc((size_t)nb * 32);
    float *s = falloc((size_t)nb);
    assert_non_null(q);
    for (int i = 0; i < n; i++) {
        ref_quantize_row(in + (size_t)i * d_in, d_in, q, s, nb);
        for (int o = 0; o < d_out; o++)
            ref[(size_t)i * d_out + o] = ref_int_dot(m, o, q, s);
    }
    free(q);
    free(s);
}

/* Runs matmul on every integer dot this CPU has (kern_cpu_set_int_dot) and
 * checks each against ref, bit for bit; returns how many it ran. */
static int check_int_dots(struct kern_backend *be, const struct qmat *m, const float *in, int n,
                          const float *ref, const char *what)
{
    const enum kern_dtype dt = m->dt;
    const int d_in = m->d_in, d_out = m->d_out;
    float *out = falloc((size_t)n * d_out);
    char err[ERR_MSG_MAX];
    const int best = kern_cpu_int_dot(be);
    int ran = 0;
    for (int isa = 0; isa < 4; isa++) {
        if (kern_cpu_set_int_dot(be, isa, err) != 0)
            continue;
        memset(out, 0xff, (size_t)n * d_out * sizeof(float));
        assert_int_equal(be->ops->matmul(be, out, in, m->w, dt, n, d_in, d_out, err), 0);
        char msg[160];
        snprintf(msg, sizeof msg, "matmul %s d_in=%d d_out=%d n=%d %s on %s vs reference", kern_dtype_name(dt),
                 d_in, d_out, n, what, kern_cpu_int_dot_name(isa));
        assert_int_equal(count_bit_diffs(msg, ref, out, (size_t)n * d_out), 0);
        ran++;
    }
    assert_int_equal(kern_cpu_set_int_dot(be, best, err), 0);
    free(out);
    return ran;
}

/* Every output equals the reference bit for bit, on every integer dot this
 * CPU has, at every n from decode through verification to prefill (1..40,
 * then 64, 65, 100, 255 and 256), 1 to 3 threads, d_out with every tail of
 * the 16-row panels, d_in with every tail of the 32-column blocks (int8),
 * the weights mapped (the backend's panels) and the caller's own. So a row
 * alone equals the same row in any batch: both equal the reference. */
static void check_quantized_matmul(enum kern_dtype dt, const int *d_ins, size_t n_d_ins, uint64_t seed)
{
    static const int d_outs[] = {29, 6, 67, 1, 133, 16};
    const int n_max = 256;
    struct rng r = {seed};
    char err[ERR_MSG_MAX];
    for (size_t si = 0; si < n_d_ins; si++) {
        struct kern_backend *be = make_backend(1 + (int)(si % 3));
        const int d_in = d_ins[si], d_out = d_outs[si % 6];
        float scale[133];
        float *wf = falloc((size_t)d_in * d_out), *in = falloc((size_t)n_max * d_in);
        float *ref = falloc((size_t)n_max * d_out);
        void *w = make_quantized(&r, dt, d_out, d_in, wf, scale);
        fill(&r, in, (size_t)n_max * d_in);
        const struct qmat caller = {dt, w, d_out, d_in};
        ref_int_matmul(&caller, in, n_max, ref);
        struct qmat mapped = caller;
        assert_int_equal(be->ops->map_matrix(be, w, dt, d_out, d_in, &mapped.w, err), 0);
        for (int n = 1; n <= n_max; n = n < 40 ? n + 1 : n == 40 ? 64 : n == 64 ? 65 : n == 65 ? 100 : n == 100 ? 255 : 256) {
            assert_true(check_int_dots(be, &mapped, in, n, ref, "mapped") >= 1);
            if (n <= 6 || n == 17 || n == 65)
                check_int_dots(be, &caller, in, n, ref, "caller's");
            if (n == n_max)
                break;
        }
        be->ops->unmap_weights(be, mapped.w);
        be->ops->destroy(be);
        free(w);
        free(wf);
        free(in);
        free(ref);
    }
}

/* int8: every tail of d_in; the ops that do not take int8 say so. */
static void test_kernels_cpu_matmul_int8_matches_the_integer_reference(void **state)
{
    (void)state;
    static const int d_ins[] = {5, 8, 67, 123, 1000, 2051, 32, 96};
    check_quantized_matmul(KERN_DTYPE_Q8, d_ins, sizeof d_ins / sizeof d_ins[0], 29);
    struct kern_backend *be = make_backend(1);
    char err[ERR_MSG_MAX];
    float x[8] = {0}, y[8];
    int8_t q[8 + 64] = {0};
    assert_int_equal(be->ops->rmsnorm(be, y, x, q, KERN_DTYPE_Q8, 1, 8, 1e-5f, err), ERR_UNSUPPORTED);
    be->ops->destroy(be);
}

/* int4: d_in a multiple of 32 from one group to many; a d_in off the group
 * is refused. */
static void test_kernels_cpu_matmul_int4_matches_the_integer_reference(void **state)
{
    (void)state;
    static const int d_ins[] = {32, 64, 96, 1024, 2080, 160};
    check_quantized_matmul(KERN_DTYPE_Q4, d_ins, sizeof d_ins / sizeof d_ins[0], 31);
    struct kern_backend *be = make_backend(1);
    char err[ERR_MSG_MAX];
    float x[40] = {0}, y[2];
    uint8_t q[64] = {0};
    assert_int_equal(be->ops->matmul(be, y, x, q, KERN_DTYPE_Q4, 1, 40, 1, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "multiple of 32"));
    be->ops->destroy(be);
}

/* The activations' scales are each row's and each block's own. Rows of
 * very different sizes in one batch (a row a million times larger beside
 * small ones, a row whose first block is large and the rest small): every
 * row equals itself computed alone and the reference, on every integer
 * dot. A scale taken over the batch, over two rows, or over a whole row
 * would round the small rows' or blocks' codes to zero and differ. */
static void test_kernels_cpu_matmul_int_scales_are_per_row_and_block(void **state)
{
    (void)state;
    const int d_in = 96, d_out = 40, n = 4;
    struct rng r = {41};
    char err[ERR_MSG_MAX];
    struct kern_backend *be = make_backend(2);
    float wf[96 * 40], scale[40];
    float in[4 * 96], ref[4 * 40], one[40];
    for (int di = 0; di < 2; di++) {
        const enum kern_dtype dt = di ? KERN_DTYPE_Q4 : KERN_DTYPE_Q8;
        void *w = make_quantized(&r, dt, d_out, d_in, wf, scale);
        fill(&r, in, (size_t)n * d_in);
        for (int k = 0; k < d_in; k++) {
            in[d_in + k] *= 1e6f;              /* row 1: huge */
            in[3 * d_in + k] *= k < 32 ? 1e4f : 1e-3f; /* row 3: one large block */
        }
        const struct qmat m = {dt, w, d_out, d_in};
        ref_int_matmul(&m, in, n, ref);
        /* the small rows are not all zero: their own scale kept them */
        int nonzero = 0;
        for (int o = 0; o < d_out; o++)
            nonzero += ref[o] != 0.0f && ref[2 * d_out + o] != 0.0f;
        assert_true(nonzero > d_out / 2);
        check_int_dots(be, &m, in, n, ref, "rows of different sizes");
        for (int i = 0; i < n; i++) {
            assert_int_equal(be->ops->matmul(be, one, in + (size_t)i * d_in, w, dt, 1, d_in, d_out, err), 0);
            assert_int_equal(count_bit_diffs("row alone vs in its batch", one, ref + (size_t)i * d_out, d_out), 0);
        }
        free(w);
    }
    be->ops->destroy(be);
}

/* Inputs that would saturate a 16-bit intermediate: int8 weights of +-127
 * (stored as 255 and 1) against codes of +-127, where a pair of products
 * is 255 * 127 * 2 = 64770 > 32767 (vpmaddubsw's saturating sum), and the
 * int4 extremes (nibbles 15 and 0). Every integer dot gives the reference,
 * whose value is worked out here too: 32 * 127 * 127 per block. */
static void test_kernels_cpu_matmul_int_never_saturates(void **state)
{
    (void)state;
    const int d_in = 64, d_out = 16, n = 3;
    char err[ERR_MSG_MAX];
    struct kern_backend *be = make_backend(1);
    float in[3 * 64], ref[3 * 16];
    for (int k = 0; k < d_in; k++) {
        in[k] = 1.0f;                      /* codes 127 */
        in[d_in + k] = -1.0f;              /* codes -127 */
        in[2 * d_in + k] = k % 2 ? 1.0f : -1.0f;
    }
    char *w8 = calloc(1, kern_q8_bytes(d_out, d_in));
    assert_non_null(w8);
    for (int o = 0; o < d_out; o++) {
        for (int k = 0; k < d_in; k++)
            ((int8_t *)w8)[o * d_in + k] = (int8_t)(o % 2 ? -127 : 127);
        const float one = 1.0f;
        memcpy(w8 + kern_q8_scales_offset(d_out, d_in) + 4 * o, &one, 4);
    }
    struct qmat m8 = {KERN_DTYPE_Q8, w8, d_out, d_in};
    ref_int_matmul(&m8, in, n, ref);
    /* 2 blocks x 32 x 127 x 127, times the code scale 1/127 */
    const float want = fmaf(32.0f * 127 * 127, 1.0f / 127, 32.0f * 127 * 127 * (1.0f / 127));
    assert_true(ref[0] == want && ref[1] == -want && ref[d_out] == -want);
    assert_int_equal(be->ops->map_matrix(be, w8, KERN_DTYPE_Q8, d_out, d_in, &m8.w, err), 0);
    assert_true(check_int_dots(be, &m8, in, n, ref, "saturating") >= 1);
    be->ops->unmap_weights(be, m8.w);
    uint8_t *w4 = calloc(1, kern_q4_bytes(d_out, d_in));
    assert_non_null(w4);
    for (int g = 0; g < d_out * d_in / 32; g++) {
        memset(w4 + g * KERN_Q4_GROUP_BYTES, g % 2 ? 0x00 : 0xff, 16);
        const float one = 1.0f;
        memcpy(w4 + g * KERN_Q4_GROUP_BYTES + 16, &one, 4);
    }
    const struct qmat m4 = {KERN_DTYPE_Q4, w4, d_out, d_in};
    ref_int_matmul(&m4, in, n, ref);
    assert_true(check_int_dots(be, &m4, in, n, ref, "extremes") >= 1);
    free(w8);
    free(w4);
    be->ops->destroy(be);
}

/* Non-finite inputs come out NaN (the block's scale is NaN), tiny blocks
 * as zeros, as the reference says, on every integer dot. */
static void test_kernels_cpu_matmul_int_non_finite_and_tiny_inputs(void **state)
{
    (void)state;
    const int d_in = 64, d_out = 20, n = 3;
    struct rng r = {43};
    struct kern_backend *be = make_backend(2);
    float wf[64 * 20], scale[20], in[3 * 64], ref[3 * 20];
    void *w = make_quantized(&r, KERN_DTYPE_Q8, d_out, d_in, wf, scale);
    fill(&r, in, (size_t)n * d_in);
    in[5] = INFINITY;
    in[d_in + 40] = NAN;
    for (int k = 0; k < 32; k++)
        in[2 * d_in + k] = 1e-30f;
    const struct qmat m = {KERN_DTYPE_Q8, w, d_out, d_in};
    ref_int_matmul(&m, in, n, ref);
    assert_true(isnan(ref[0]) && isnan(ref[d_out]) && !isnan(ref[2 * d_out]));
    check_int_dots(be, &m, in, n, ref, "non-finite");
    free(w);
    be->ops->destroy(be);
}

/* Speculative verification calls matmul with n = K+1 = 2..9 rows, and a
 * batched call with the rows of many sequences, up to 256 rows:
 * each row of every n (all tile shapes and remainders of the small-n paths,
 * several input jobs for n > 32, or 64 on AVX2 alone) equals the row
 * computed alone, bit for bit; d_out not a multiple of the blocks, d_in
 * with a tail, shorter than one SIMD step, and spanning several k-blocks. */
static void test_kernels_cpu_matmul_verification_row_counts_match_single_rows(void **state)
{
    static const int shapes[][2] = {{2051, 38}, {67, 13}, {5, 7},   {1000, 25},
                                    {4099, 14}, {83, 6},  {123, 9}};
    static const int ns[] = {2,  3,  4,  5,  6,  7,  8,   9,   10,  11,  12,  13, 14,
                             15, 16, 17, 31, 33, 64, 70, 100, 128, 129, 200, 255, 256};
    const int n_max = 256; /* batches of many sequences' rows (continuous batching) */
    struct kern_backend *be = make_backend(2);
    struct rng r = {11};
    char err[ERR_MSG_MAX];
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int di = 0; di < 3; di++) {
            int d_in = shapes[si][0], d_out = shapes[si][1];
            enum kern_dtype dt = all_dtypes[di];
            double *wref = dalloc((size_t)d_in * d_out);
            void *w = make_weights(&r, dt, (size_t)d_in * d_out, wref);
            float *in = falloc((size_t)n_max * d_in), *one = falloc((size_t)n_max * d_out);
            float *batch = falloc((size_t)n_max * d_out);
            fill(&r, in, (size_t)n_max * d_in);
            for (int i = 0; i < n_max; i++)
                assert_int_equal(be->ops->matmul(be, one + (size_t)i * d_out,
                                                 in + (size_t)i * d_in, w, dt, 1, d_in, d_out, err),
                                 0);
            for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
                const int n = ns[ni];
                memset(batch, 0xff, (size_t)n * d_out * sizeof(float));
                assert_int_equal(be->ops->matmul(be, batch, in, w, dt, n, d_in, d_out, err), 0);
                char what[96];
                snprintf(what, sizeof(what), "matmul %s d_in=%d d_out=%d: n=1 vs n=%d",
                         kern_dtype_name(dt), d_in, d_out, n);
                assert_int_equal(count_bit_diffs(what, one, batch, (size_t)n * d_out), 0);
            }
            free(w);
            free(wref);
            free(in);
            free(one);
            free(batch);
        }
    be->ops->destroy(be);
}

/* ---- rmsnorm ------------------------------------------------------------ */

static void test_kernels_cpu_rmsnorm_matches_reference_and_works_in_place(void **state)
{
    static const int dims[] = {67, 128, 2048, 3};
    const int n = 5;
    const float eps = 1e-5f;
    struct kern_backend *be = make_backend(2);
    struct rng r = {11};
    char err[ERR_MSG_MAX];
    for (size_t si = 0; si < sizeof(dims) / sizeof(dims[0]); si++)
        for (int di = 0; di < 3; di++) {
            int dim = dims[si];
            enum kern_dtype dt = all_dtypes[di];
            double *wref = dalloc((size_t)dim);
            void *w = make_weights(&r, dt, (size_t)dim, wref);
            float *in = falloc((size_t)n * dim), *out = falloc((size_t)n * dim);
            double *ref = dalloc((size_t)n * dim);
            fill(&r, in, (size_t)n * dim);
            ref_rmsnorm(ref, in, wref, n, dim, eps);
            assert_int_equal(be->ops->rmsnorm(be, out, in, w, dt, n, dim, eps, err), 0);
            char what[64];
            snprintf(what, sizeof(what), "rmsnorm %s dim=%d", kern_dtype_name(dt), dim);
            assert_int_equal(count_mismatches(what, out, ref, (size_t)n * dim, 1e-5, 1e-5), 0);
            /* in place gives the same bits */
            assert_int_equal(be->ops->rmsnorm(be, in, in, w, dt, n, dim, eps, err), 0);
            assert_int_equal(count_bit_diffs("rmsnorm in place", in, out, (size_t)n * dim), 0);
            free(w);
            free(wref);
            free(in);
            free(out);
            free(ref);
        }
    be->ops->destroy(be);
}

static void test_kernels_cpu_rmsnorm_row_is_bit_identical_alone_and_in_batch(void **state)
{
    const int n = 16, dim = 3077;
    struct kern_backend *be = make_backend(2);
    struct rng r = {12};
    char err[ERR_MSG_MAX];
    double *wref = dalloc(dim);
    void *w = make_weights(&r, KERN_DTYPE_BF16, dim, wref);
    float *in = falloc((size_t)n * dim), *batch = falloc((size_t)n * dim);
    float *one = falloc((size_t)n * dim);
    fill(&r, in, (size_t)n * dim);
    assert_int_equal(be->ops->rmsnorm(be, batch, in, w, KERN_DTYPE_BF16, n, dim, 1e-5f, err), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(be->ops->rmsnorm(be, one + (size_t)i * dim, in + (size_t)i * dim, w,
                                          KERN_DTYPE_BF16, 1, dim, 1e-5f, err),
                         0);
    assert_int_equal(count_bit_diffs("rmsnorm n=1 vs n=16", one, batch, (size_t)n * dim), 0);
    free(w);
    free(wref);
    free(in);
    free(batch);
    free(one);
    be->ops->destroy(be);
}

/* ---- rope --------------------------------------------------------------- */

static void make_inv_freq(float *inv_freq, int hd)
{
    for (int j = 0; j < hd / 2; j++)
        inv_freq[j] = (float)pow(500000.0, -2.0 * j / hd);
}

static void test_kernels_cpu_rope_matches_reference_and_is_batch_invariant(void **state)
{
    static const int head_dims[] = {16, 64, 128};
    const int n = 16, n_heads = 3;
    struct kern_backend *be = make_backend(2);
    struct rng r = {13};
    char err[ERR_MSG_MAX];
    for (size_t hi = 0; hi < 3; hi++) {
        int hd = head_dims[hi];
        size_t count = (size_t)n * n_heads * hd, row = (size_t)n_heads * hd;
        float *inv_freq = falloc((size_t)hd / 2);
        make_inv_freq(inv_freq, hd);
        int32_t pos[16];
        for (int i = 0; i < n; i++)
            pos[i] = i < 8 ? 37 + i : (int32_t)(rng_next(&r) % 130000);
        float *x = falloc(count), *batch = falloc(count), *one = falloc(count);
        double *ref = dalloc(count);
        fill(&r, x, count);
        ref_rope(ref, x, pos, n, n_heads, hd, inv_freq);
        memcpy(batch, x, count * sizeof(float));
        memcpy(one, x, count * sizeof(float));
        assert_int_equal(be->ops->rope(be, batch, pos, n, n_heads, hd, inv_freq, err), 0);
        for (int i = 0; i < n; i++)
            assert_int_equal(be->ops->rope(be, one + i * row, pos + i, 1, n_heads, hd, inv_freq, err),
                             0);
        char what[64];
        snprintf(what, sizeof(what), "rope head_dim=%d", hd);
        /* cosf/sinf of the same f32 angle: a few ulps */
        assert_int_equal(count_mismatches(what, batch, ref, count, 1e-6, 1e-5), 0);
        assert_int_equal(count_bit_diffs("rope n=1 vs n=16", one, batch, count), 0);
        free(inv_freq);
        free(x);
        free(batch);
        free(one);
        free(ref);
    }
    be->ops->destroy(be);
}

/* ---- attention ---------------------------------------------------------- */

/* A contiguous cache of n_ctx positions as a paged layout (one sequence,
 * one block), its n rows at positions pos0 .. pos0 + n - 1. The arrays are
 * static: one layout in use at a time. */
static int32_t contig_rows[2 * 1024];
static const int32_t contig_table[1] = {0};
static const struct kern_kv_layout *contig_kv(struct kern_kv_layout *kv, int n, int pos0,
                                              int n_ctx)
{
    assert_true(n <= 1024);
    for (int i = 0; i < n; i++) {
        contig_rows[2 * i] = 0;
        contig_rows[2 * i + 1] = pos0 + i;
    }
    *kv = (struct kern_kv_layout){.block_size = n_ctx, .n_blocks = 1, .n_seqs = 1,
                                  .table_stride = 1, .tables = contig_table, .rows = contig_rows};
    return kv;
}

struct attn_case {
    int n, pos0, n_heads, n_kv, hd;
};

static void test_kernels_cpu_attention_matches_reference(void **state)
{
    static const struct attn_case cases[] = {
        {1, 0, 3, 1, 16},   /* first token */
        {5, 0, 6, 2, 64},   /* prefill from 0, group 3 */
        {5, 17, 3, 1, 128}, /* verification: pos0 > 0, n > 1 */
        {1, 300, 6, 2, 64}, /* decode on a longer cache */
        {4, 9, 3, 3, 20},   /* MHA, head_dim not a multiple of 8 */
    };
    struct kern_backend *be = make_backend(2);
    struct rng r = {14};
    char err[ERR_MSG_MAX];
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const struct attn_case *c = &cases[ci];
        int n_ctx = c->pos0 + c->n + 3;
        size_t qn = (size_t)c->n * c->n_heads * c->hd, kn = (size_t)n_ctx * c->n_kv * c->hd;
        float *q = falloc(qn), *kc = falloc(kn), *vc = falloc(kn), *out = falloc(qn);
        double *ref = dalloc(qn);
        fill(&r, q, qn);
        fill(&r, kc, kn);
        fill(&r, vc, kn);
        for (size_t i = 0; i < qn; i++)
            q[i] *= 3.0f; /* sharper softmax */
        float scale = 1.0f / sqrtf((float)c->hd);
        struct kern_kv_layout kv;
        assert_int_equal(be->ops->attention(be, out, q, kc, vc, c->n,
                                            contig_kv(&kv, c->n, c->pos0, n_ctx), c->n_heads,
                                            c->n_kv, c->hd, scale, err),
                         0);
        ref_attention(ref, q, kc, vc, c->n, c->pos0, c->n_heads, c->n_kv, c->hd, scale);
        char what[96];
        snprintf(what, sizeof(what), "attention n=%d pos0=%d heads=%d/%d hd=%d", c->n, c->pos0,
                 c->n_heads, c->n_kv, c->hd);
        assert_int_equal(count_mismatches(what, out, ref, qn, 1e-5, 1e-4), 0);
        /* out aliasing q gives the same bits */
        assert_int_equal(be->ops->attention(be, q, q, kc, vc, c->n,
                                            contig_kv(&kv, c->n, c->pos0, n_ctx), c->n_heads,
                                            c->n_kv, c->hd, scale, err),
                         0);
        assert_int_equal(count_bit_diffs("attention in place", q, out, qn), 0);
        free(q);
        free(kc);
        free(vc);
        free(out);
        free(ref);
    }
    be->ops->destroy(be);
}

/* The softmax exponential of kernels/cpu/cpu_simd.h, written out again from
 * its description: x < -87 gives 0, x > 0 is taken as 0, NaN stays NaN;
 * n = x / ln 2 rounded to the nearest integer, r = x - n ln 2 in two fused
 * steps, the Taylor series of e^r to r^7 by Horner with fused steps, times
 * 2^n. */
static float softmax_exp(float x)
{
    if (isnan(x))
        return x;
    if (x < -87.0f)
        return 0.0f;
    if (!(x < 0.0f))
        x = 0.0f;
    const float n = fmaf(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
    const float r = fmaf(n, -1.42860682030941723212e-6f, fmaf(n, -0.693145751953125f, x));
    static const float taylor[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                    1.0f / 6.0f,    0.5f,           1.0f,           1.0f};
    float p = taylor[0];
    for (int i = 1; i < 8; i++)
        p = fmaf(p, r, taylor[i]);
    return ldexpf(p, (int)n);
}

/* The exponential is within 2 ulp of e^x over the whole range it serves
 * (every float from -87 to 0 one in 61 of them, both ends included), and the
 * rules at its edges hold. */
static void test_kernels_cpu_softmax_exp_is_within_2_ulp(void **state)
{
    (void)state;
    double worst = 0;
    float worst_x = 0;
    const float x_lo = -87.0f;
    uint32_t last;
    memcpy(&last, &x_lo, sizeof last);
    last &= 0x7fffffffu; /* |x| grows with these bits */
    for (uint32_t mag = 0;; mag = last - mag < 61 ? last : mag + 61) {
        float x;
        const uint32_t bits = mag | 0x80000000u;
        memcpy(&x, &bits, sizeof x);
        const double want = exp((double)x);
        const float got = softmax_exp(x);
        const double ulp = (double)nextafterf((float)want, INFINITY) - (double)(float)want;
        const double err = fabs((double)got - want) / ulp;
        if (err > worst) {
            worst = err;
            worst_x = x;
        }
        if (mag == last)
            break;
    }
    if (worst > 2.0)
        fail_msg("softmax exp: %.2f ulp at x = %.9g", worst, (double)worst_x);
    assert_true(softmax_exp(-87.5f) == 0.0f);
    assert_true(softmax_exp(-INFINITY) == 0.0f);
    assert_true(softmax_exp(0.0f) == 1.0f);
    assert_true(softmax_exp(-0.0f) == 1.0f);
    assert_true(softmax_exp(3.0f) == 1.0f);
    assert_true(isnan(softmax_exp(NAN)));
}

/* The fixed order of attention.c, one (row, head) at a time in plain C:
 * fixed_order_dot times scale; e = softmax_exp(s - max); their sum in the
 * fixed order (fixed_order_sum); p = e / sum; out[d] one fmaf per t in
 * increasing t. */
static void fixed_order_attention(float *out, const float *q, const float *kc, const float *vc,
                                  int n, int pos0, int n_heads, int n_kv, int hd, float scale)
{
    const int group = n_heads / n_kv;
    float *s = falloc((size_t)(pos0 + n));
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            const int g = h / group, np = pos0 + i + 1;
            const float *qv = q + ((size_t)i * n_heads + h) * hd;
            float m = -INFINITY, sum = 0.0f;
            for (int t = 0; t < np; t++) {
                s[t] = fixed_order_dot(qv, kc + ((size_t)t * n_kv + g) * hd, hd) * scale;
                m = s[t] > m ? s[t] : m;
            }
            for (int t = 0; t < np; t++)
                s[t] = softmax_exp(s[t] - m);
            sum = fixed_order_sum(s, np);
            float *o = out + ((size_t)i * n_heads + h) * hd;
            for (int k = 0; k < hd; k++) {
                float acc = 0.0f;
                for (int t = 0; t < np; t++)
                    acc = fmaf(s[t] / sum, vc[((size_t)t * n_kv + g) * hd + k], acc);
                o[k] = acc;
            }
        }
    free(s);
}

/* Heads that share a kv head are computed together (attention.c), in runs
 * of up to four: every group size from 1 to 6 (a run of four and a shorter
 * one), head sizes with 16-, 8- and 1-column tails, one and several rows,
 * give bit for bit what the fixed order gives one head at a time. */
static void test_kernels_cpu_attention_follows_the_fixed_order_bit_for_bit(void **state)
{
    static const struct attn_case cases[] = {
        {1, 63, 32, 8, 64},  /* Llama 3.2 1B decode: group 4 */
        {3, 63, 24, 8, 128}, /* Llama 3.2 3B verification: group 3 */
        {2, 10, 4, 4, 64},   /* group 1 */
        {3, 0, 4, 2, 24},    /* group 2, hd a multiple of 8, not 16 */
        {2, 30, 10, 2, 20},  /* group 5: a run of 4 and one, 4-column tail */
        {1, 200, 6, 1, 72},  /* group 6: 4 and 2, an 8-column chunk after the 16s */
        {4, 5, 8, 2, 7},     /* head_dim below 8: scalar only */
        {6, 100, 12, 4, 64}, /* the small model's verification: a block of 4 rows and one of 2 */
    };
    struct kern_backend *be = make_backend(2);
    struct rng r = {16};
    char err[ERR_MSG_MAX];
    /* q x 3: scores a few units apart; q x 80: many of them more than 87
     * below the largest, where the exponential gives 0 */
    for (size_t ci = 0; ci < 2 * sizeof(cases) / sizeof(cases[0]); ci++) {
        const struct attn_case *c = &cases[ci / 2];
        const float q_scale = ci % 2 ? 80.0f : 3.0f;
        int n_ctx = c->pos0 + c->n;
        size_t qn = (size_t)c->n * c->n_heads * c->hd, kn = (size_t)n_ctx * c->n_kv * c->hd;
        float *q = falloc(qn), *kc = falloc(kn), *vc = falloc(kn), *out = falloc(qn),
              *want = falloc(qn);
        fill(&r, q, qn);
        fill(&r, kc, kn);
        fill(&r, vc, kn);
        for (size_t i = 0; i < qn; i++)
            q[i] *= q_scale;
        float scale = 1.0f / sqrtf((float)c->hd);
        struct kern_kv_layout kv;
        assert_int_equal(be->ops->attention(be, out, q, kc, vc, c->n,
                                            contig_kv(&kv, c->n, c->pos0, n_ctx), c->n_heads,
                                            c->n_kv, c->hd, scale, err),
                         0);
        fixed_order_attention(want, q, kc, vc, c->n, c->pos0, c->n_heads, c->n_kv, c->hd, scale);
        char what[96];
        snprintf(what, sizeof(what), "attention n=%d pos0=%d heads=%d/%d hd=%d q x %g vs fixed order",
                 c->n, c->pos0, c->n_heads, c->n_kv, c->hd, (double)q_scale);
        assert_int_equal(count_bit_diffs(what, out, want, qn), 0);
        free(q);
        free(kc);
        free(vc);
        free(out);
        free(want);
    }
    be->ops->destroy(be);
}

static void test_kernels_cpu_attention_row_is_bit_identical_alone_and_in_batch(void **state)
{
    const int n = 16, pos0 = 40, n_heads = 6, n_kv = 2;
    static const int head_dims[] = {16, 64, 128};
    struct kern_backend *be = make_backend(2);
    struct rng r = {15};
    char err[ERR_MSG_MAX];
    for (int hi = 0; hi < 3; hi++) {
        int hd = head_dims[hi], n_ctx = pos0 + n;
        size_t row = (size_t)n_heads * hd, qn = (size_t)n * row;
        size_t kn = (size_t)n_ctx * n_kv * hd;
        float *q = falloc(qn), *kc = falloc(kn), *vc = falloc(kn);
        float *batch = falloc(qn), *one = falloc(qn);
        fill(&r, q, qn);
        fill(&r, kc, kn);
        fill(&r, vc, kn);
        float scale = 1.0f / sqrtf((float)hd);
        struct kern_kv_layout kv;
        assert_int_equal(be->ops->attention(be, batch, q, kc, vc, n, contig_kv(&kv, n, pos0, n_ctx),
                                            n_heads, n_kv, hd, scale, err),
                         0);
        for (int i = 0; i < n; i++)
            assert_int_equal(be->ops->attention(be, one + i * row, q + i * row, kc, vc, 1,
                                                contig_kv(&kv, 1, pos0 + i, n_ctx), n_heads, n_kv,
                                                hd, scale, err),
                             0);
        char what[64];
        snprintf(what, sizeof(what), "attention hd=%d n=1 vs n=16", hd);
        assert_int_equal(count_bit_diffs(what, one, batch, qn), 0);
        free(q);
        free(kc);
        free(vc);
        free(batch);
        free(one);
    }
    be->ops->destroy(be);
}

/* Three sequences in scattered blocks of a shared pool, stored by kv_store
 * and attended in one call: every row is bit-identical to the same row over
 * a contiguous cache holding the same values, alone. */
static void test_kernels_cpu_paged_attention_equals_contiguous(void **state)
{
    (void)state;
    enum { N_SEQ = 3, BS = 4, N_BLOCKS = 16, HEADS = 6, N_KV = 2, HD = 64, MAX_LEN = 14 };
    static const int len[N_SEQ] = {14, 5, 9};
    /* blocks handed out out of order and interleaved between sequences */
    static const int32_t tables[N_SEQ][4] = {{9, 2, 14, 0}, {5, 11, -1, -1}, {1, 15, 7, -1}};
    const int kv_dim = N_KV * HD, row = HEADS * HD;
    struct kern_backend *be = make_backend(2);
    struct rng r = {16};
    char err[ERR_MSG_MAX];
    size_t pool_n = (size_t)N_BLOCKS * BS * kv_dim;
    float *k_pool = falloc(pool_n), *v_pool = falloc(pool_n);
    int total = 0;
    for (int s = 0; s < N_SEQ; s++)
        total += len[s];
    float *k = falloc((size_t)total * kv_dim), *v = falloc((size_t)total * kv_dim);
    float *q = falloc((size_t)total * row), *out = falloc((size_t)total * row);
    float *one = falloc(row);
    fill(&r, k, (size_t)total * kv_dim);
    fill(&r, v, (size_t)total * kv_dim);
    fill(&r, q, (size_t)total * row);
    int32_t rows[2 * 28];
    int i = 0;
    for (int s = 0; s < N_SEQ; s++)
        for (int t = 0; t < len[s]; t++, i++) {
            rows[2 * i] = s;
            rows[2 * i + 1] = t;
        }
    struct kern_kv_layout kv = {.block_size = BS, .n_blocks = N_BLOCKS, .n_seqs = N_SEQ,
                                .table_stride = 4, .tables = &tables[0][0], .rows = rows};
    assert_int_equal(be->ops->kv_store(be, k_pool, v_pool, k, v, total, &kv, kv_dim, err), 0);
    /* the stored rows sit where the tables say */
    assert_memory_equal(k_pool + ((size_t)tables[0][3] * BS + 1) * kv_dim, k + (size_t)13 * kv_dim,
                        (size_t)kv_dim * sizeof(float));
    assert_memory_equal(v_pool + ((size_t)tables[2][1] * BS + 2) * kv_dim,
                        v + (size_t)(14 + 5 + 6) * kv_dim, (size_t)kv_dim * sizeof(float));
    float scale = 1.0f / sqrtf((float)HD);
    assert_int_equal(be->ops->attention(be, out, q, k_pool, v_pool, total, &kv, HEADS, N_KV, HD,
                                        scale, err),
                     0);
    /* the reference: each sequence's own keys and values, contiguous */
    i = 0;
    int first = 0;
    for (int s = 0; s < N_SEQ; s++) {
        const float *kc = k + (size_t)first * kv_dim, *vc = v + (size_t)first * kv_dim;
        for (int t = 0; t < len[s]; t++, i++) {
            struct kern_kv_layout ckv;
            assert_int_equal(be->ops->attention(be, one, q + (size_t)i * row, kc, vc, 1,
                                                contig_kv(&ckv, 1, t, MAX_LEN), HEADS, N_KV, HD,
                                                scale, err),
                             0);
            char what[64];
            snprintf(what, sizeof what, "paged attention seq %d pos %d", s, t);
            assert_int_equal(count_bit_diffs(what, one, out + (size_t)i * row, (size_t)row), 0);
        }
        first += len[s];
    }
    /* the check can fail: a row of another sequence differs */
    assert_true(memcmp(one, out, (size_t)row * sizeof(float)) != 0);
    free(k_pool);
    free(v_pool);
    free(k);
    free(v);
    free(q);
    free(out);
    free(one);
    be->ops->destroy(be);
}

/* ---- thread-count invariance -------------------------------------------- */

/* Runs every arithmetic op on sizes big enough to be split across threads. */
static void run_all_ops(struct kern_backend *be, float *res[6])
{
    char err[ERR_MSG_MAX];
    struct rng r = {99};
    const int n = 21, d_in = 1027, d_out = 515, dim = 9001;
    double *wref = dalloc((size_t)d_in * d_out);
    void *w = make_weights(&r, KERN_DTYPE_BF16, (size_t)d_in * d_out, wref);
    float *in = falloc((size_t)n * d_in);
    fill(&r, in, (size_t)n * d_in);
    res[0] = falloc((size_t)n * d_out);
    assert_int_equal(be->ops->matmul(be, res[0], in, w, KERN_DTYPE_BF16, n, d_in, d_out, err), 0);

    double *nref = dalloc(dim);
    void *nw = make_weights(&r, KERN_DTYPE_F16, dim, nref);
    float *x = falloc((size_t)n * dim);
    fill(&r, x, (size_t)n * dim);
    res[1] = falloc((size_t)n * dim);
    assert_int_equal(be->ops->rmsnorm(be, res[1], x, nw, KERN_DTYPE_F16, n, dim, 1e-6f, err), 0);

    const int rn = 64, heads = 24, hd = 128, n_kv = 8, pos0 = 70;
    size_t qn = (size_t)rn * heads * hd;
    float inv_freq[64];
    make_inv_freq(inv_freq, hd);
    int32_t pos[64];
    for (int i = 0; i < rn; i++)
        pos[i] = pos0 + i;
    res[2] = falloc(qn);
    fill(&r, res[2], qn);
    assert_int_equal(be->ops->rope(be, res[2], pos, rn, heads, hd, inv_freq, err), 0);

    size_t kn = (size_t)(pos0 + rn) * n_kv * hd;
    float *kc = falloc(kn), *vc = falloc(kn);
    fill(&r, kc, kn);
    fill(&r, vc, kn);
    res[3] = falloc(qn);
    struct kern_kv_layout kv;
    assert_int_equal(be->ops->attention(be, res[3], res[2], kc, vc, rn,
                                        contig_kv(&kv, rn, pos0, pos0 + rn), heads, n_kv, hd,
                                        0.0883883f, err),
                     0);

    const size_t count = 100003;
    float *up = falloc(count);
    fill(&r, up, count);
    res[4] = falloc(count);
    fill(&r, res[4], count);
    assert_int_equal(be->ops->swiglu(be, res[4], res[4], up, count, err), 0);
    res[5] = falloc(count);
    fill(&r, res[5], count);
    assert_int_equal(be->ops->add(be, res[5], up, count, err), 0);

    free(w);
    free(wref);
    free(in);
    free(nref);
    free(nw);
    free(x);
    free(kc);
    free(vc);
    free(up);
}

static void test_kernels_cpu_results_do_not_depend_on_thread_count(void **state)
{
    static const char *names[6] = {"matmul", "rmsnorm", "rope", "attention", "swiglu", "add"};
    const size_t counts[6] = {21 * 515, 21 * 9001, 64 * 24 * 128, 64 * 24 * 128, 100003, 100003};
    float *res[3][6];
    for (int t = 0; t < 3; t++) {
        struct kern_backend *be = make_backend(t + 1);
        assert_int_equal(kern_cpu_threads(be), t + 1);
        run_all_ops(be, res[t]);
        be->ops->destroy(be);
    }
    for (int t = 1; t < 3; t++)
        for (int op = 0; op < 6; op++) {
            char what[64];
            snprintf(what, sizeof(what), "%s: 1 vs %d threads", names[op], t + 1);
            assert_int_equal(count_bit_diffs(what, res[0][op], res[t][op], counts[op]), 0);
        }
    for (int t = 0; t < 3; t++)
        for (int op = 0; op < 6; op++)
            free(res[t][op]);
}

/* ---- embed, swiglu, add ------------------------------------------------- */

static void test_kernels_cpu_embed_widens_rows_exactly(void **state)
{
    const int vocab = 50, dim = 67, n = 7;
    const int32_t ids[7] = {3, 0, 49, 3, 17, 8, 22};
    struct kern_backend *be = make_backend(2);
    struct rng r = {16};
    char err[ERR_MSG_MAX];
    for (int di = 0; di < 3; di++) {
        enum kern_dtype dt = all_dtypes[di];
        double *tref = dalloc((size_t)vocab * dim);
        void *table = make_weights(&r, dt, (size_t)vocab * dim, tref);
        float *out = falloc((size_t)n * dim);
        double *ref = dalloc((size_t)n * dim);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < dim; k++)
                ref[(size_t)i * dim + k] = tref[(size_t)ids[i] * dim + k];
        assert_int_equal(be->ops->embed(be, out, table, dt, ids, n, dim, err), 0);
        assert_int_equal(count_mismatches("embed", out, ref, (size_t)n * dim, 0.0, 0.0), 0);
        free(table);
        free(tref);
        free(out);
        free(ref);
    }
    be->ops->destroy(be);
}

static void test_kernels_cpu_bf16_converts_by_shifting_the_bits(void **state)
{
    static const uint16_t bits[] = {0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80,
                                    0x0001, 0x807f, 0x4049, 0x7f7f, 0x3c00, 0x1234};
    const int dim = 12;
    const int32_t id = 0;
    struct kern_backend *be = make_backend(1);
    char err[ERR_MSG_MAX];
    float out[12];
    assert_int_equal(be->ops->embed(be, out, bits, KERN_DTYPE_BF16, &id, 1, dim, err), 0);
    for (int k = 0; k < dim; k++) {
        uint32_t want = (uint32_t)bits[k] << 16, got;
        memcpy(&got, &out[k], sizeof(got));
        assert_int_equal(got, want);
    }
    be->ops->destroy(be);
}

/* silu's edges: saturation both ways, e^-|g| below the exponential's range,
 * signed zeros, infinities and NaN, in the 8-lane body and in the tail. */
static void test_kernels_cpu_swiglu_edges_match_reference(void **state)
{
    static const float gates[] = {0.0f,   -0.0f,  1.0f,  -1.0f,     20.0f,     -20.0f,
                                  87.0f,  -87.0f, 88.5f, -88.5f,    100.0f,    -100.0f,
                                  1e-30f, -1e-30f, 3e38f, -3e38f,   INFINITY,  -INFINITY};
    const size_t count = sizeof(gates) / sizeof(gates[0]);
    struct kern_backend *be = make_backend(1);
    char err[ERR_MSG_MAX];
    float up[18], out[18];
    double ref[18];
    for (size_t i = 0; i < count; i++) {
        up[i] = 1.0f;
        ref[i] = gates[i] / (1.0 + exp(-(double)gates[i]));
    }
    assert_int_equal(be->ops->swiglu(be, out, gates, up, count, err), 0);
    for (size_t i = 0; i < count; i++) {
        if (isnan(ref[i])) { /* -inf / (1 + inf) */
            assert_true(isnan(out[i]));
            continue;
        }
        if (isinf(ref[i])) {
            assert_true(out[i] == ref[i]);
            continue;
        }
        assert_int_equal(count_mismatches("swiglu edge", &out[i], &ref[i], 1, 1e-30, 1.2e-6), 0);
        assert_int_equal(signbit(out[i]) != 0, signbit(gates[i]) != 0);
    }
    const float nan_gate[9] = {NAN, 1, 1, 1, 1, 1, 1, 1, NAN};
    assert_int_equal(be->ops->swiglu(be, out, nan_gate, up, 9, err), 0);
    assert_true(isnan(out[0]) && isnan(out[8]));
    be->ops->destroy(be);
}

static void test_kernels_cpu_swiglu_and_add_match_reference(void **state)
{
    static const size_t counts[] = {1, 13, 4096, 70001};
    struct kern_backend *be = make_backend(2);
    struct rng r = {17};
    char err[ERR_MSG_MAX];
    for (size_t ci = 0; ci < 4; ci++) {
        size_t count = counts[ci];
        float *g = falloc(count), *u = falloc(count), *out = falloc(count), *x = falloc(count);
        double *ref = dalloc(count);
        fill(&r, g, count);
        fill(&r, u, count);
        for (size_t i = 0; i < count; i++)
            g[i] *= 8.0f;
        for (size_t i = 0; i < count; i++)
            ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        assert_int_equal(be->ops->swiglu(be, out, g, u, count, err), 0);
        /* an exponential within 2 ulp and four roundings: under 10 ulp */
        assert_int_equal(count_mismatches("swiglu", out, ref, count, 1e-30, 1.2e-6), 0);
        /* one element alone takes the scalar form: the same bits as the 8 lanes */
        for (size_t i = 0; i < count && i < 64; i++) {
            float one;
            assert_int_equal(be->ops->swiglu(be, &one, &g[i], &u[i], 1, err), 0);
            assert_int_equal(count_bit_diffs("swiglu, one element", &one, &out[i], 1), 0);
        }
        /* out aliasing gate */
        assert_int_equal(be->ops->swiglu(be, g, g, u, count, err), 0);
        assert_int_equal(count_bit_diffs("swiglu in place", g, out, count), 0);

        fill(&r, x, count);
        for (size_t i = 0; i < count; i++)
            ref[i] = (double)x[i] + u[i];
        assert_int_equal(be->ops->add(be, x, u, count, err), 0);
        /* one f32 rounding */
        assert_int_equal(count_mismatches("add", x, ref, count, 0.0, 6e-8), 0);
        free(g);
        free(u);
        free(out);
        free(x);
        free(ref);
    }
    be->ops->destroy(be);
}

/* ---- memory ops and argument checks ------------------------------------- */

static void test_kernels_cpu_memory_ops_are_zeroed_aligned_and_copy(void **state)
{
    struct kern_backend *be = make_backend(0);
    char err[ERR_MSG_MAX];
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(kern_cpu_threads(be), online < 1 ? 1 : online);
    assert_string_equal(be->name, "cpu");
    /* from 2 MiB, a mapping of its own (cpu_backend.c) */
    static const size_t sizes[] = {1, 100, 4096, (2 << 20) - 1, 2 << 20, 3 << 20};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t size = sizes[si];
        unsigned char *a = NULL, *b = NULL;
        assert_int_equal(be->ops->alloc(be, size, (void **)&a, err), 0);
        assert_int_equal(be->ops->alloc(be, size, (void **)&b, err), 0);
        assert_int_equal((uintptr_t)a % 64, 0);
        for (size_t i = 0; i < size; i++)
            assert_int_equal(a[i], 0);
        unsigned char *host = malloc(size), *back = malloc(size);
        assert_non_null(host);
        assert_non_null(back);
        for (size_t i = 0; i < size; i++)
            host[i] = (unsigned char)(i * 7 + 1);
        assert_int_equal(be->ops->upload(be, a, host, size, err), 0);
        assert_int_equal(be->ops->copy(be, b, a, size, err), 0);
        assert_int_equal(be->ops->download(be, back, b, size, err), 0);
        assert_memory_equal(back, host, size);
        be->ops->free(be, a);
        be->ops->free(be, b);
        free(host);
        free(back);
    }
    be->ops->free(be, NULL);
    const void *mapped = NULL;
    static const uint16_t weights[4] = {1, 2, 3, 4};
    assert_int_equal(be->ops->map_weights(be, weights, sizeof(weights), &mapped, err), 0);
    assert_ptr_equal(mapped, weights);
    be->ops->unmap_weights(be, mapped);
    assert_int_equal(be->ops->sync(be, err), 0);
    be->ops->destroy(be);
    be = NULL;
    /* destroy is NULL-safe through any backend's table: nothing to call here,
     * but kern_cpu_threads(NULL) must not crash */
    assert_int_equal(kern_cpu_threads(be), 0);
}

/* Large weight tensors are copied by map_weights (into huge-page memory): the
 * copy holds the same bytes, a matmul on it gives the same bits as on the
 * caller's bytes, and unmap_weights (or destroy, for a copy never unmapped)
 * releases it. Small tensors are used in place. */
static void test_kernels_cpu_map_weights_copies_large_tensors_exactly(void **state)
{
    const int d_in = 2048, d_out = 1100, n = 3; /* 4.3 MiB of bf16 */
    const size_t count = (size_t)d_in * d_out;
    struct kern_backend *be = make_backend(2);
    struct rng r = {23};
    char err[ERR_MSG_MAX];
    double *wref = dalloc(count);
    void *w = make_weights(&r, KERN_DTYPE_BF16, count, wref);
    float *in = falloc((size_t)n * d_in), *a = falloc((size_t)n * d_out);
    float *b = falloc((size_t)n * d_out);
    fill(&r, in, (size_t)n * d_in);
    const void *mapped = NULL, *again = NULL;
    assert_int_equal(be->ops->map_weights(be, w, count * 2, &mapped, err), 0);
    assert_non_null(mapped);
    assert_memory_equal(mapped, w, count * 2);
    assert_int_equal(be->ops->matmul(be, a, in, w, KERN_DTYPE_BF16, n, d_in, d_out, err), 0);
    assert_int_equal(be->ops->matmul(be, b, in, mapped, KERN_DTYPE_BF16, n, d_in, d_out, err), 0);
    assert_int_equal(count_bit_diffs("matmul on mapped weights", a, b, (size_t)n * d_out), 0);
    /* the copies held are listed (a copy is made where huge pages exist) */
    const void *ptrs[4];
    size_t held_bytes[4];
    const int copied = mapped != (const void *)w;
    assert_int_equal(kern_cpu_weight_copies(be, ptrs, held_bytes, 4), copied);
    if (copied) {
        assert_ptr_equal(ptrs[0], mapped);
        assert_true(held_bytes[0] >= count * 2);
    }
    be->ops->unmap_weights(be, mapped);
    assert_int_equal(kern_cpu_weight_copies(be, ptrs, held_bytes, 4), 0);
    /* a second copy left mapped: destroy releases it */
    assert_int_equal(be->ops->map_weights(be, w, count * 2, &again, err), 0);
    assert_memory_equal(again, w, count * 2);
    assert_int_equal(kern_cpu_weight_copies(be, ptrs, held_bytes, 4), again != (const void *)w);
    assert_int_equal(kern_cpu_weight_copies(NULL, ptrs, held_bytes, 4), 0);
    be->ops->destroy(be);
    free(w);
    free(wref);
    free(in);
    free(a);
    free(b);
}

/* map_matrix may keep a matrix in a layout of its own (AVX-512 builds: bf16
 * with rows a multiple of 32 columns, kernels/cpu/packed.h): matmul at every
 * path's row count and embed read it to the same bits as the caller's
 * row-major bytes, the rows after the last full octet included. */
static void check_map_matrix_reads_exactly(int d_in, int d_out, int expect_packed, int bf16_dot)
{
    const size_t count = (size_t)d_in * d_out;
    struct kern_backend *be = make_backend(2);
    char err0[ERR_MSG_MAX];
    if (bf16_dot && kern_cpu_set_bf16_dot(be, 1, err0) != 0) {
        be->ops->destroy(be);
        return; /* no AVX512_BF16 here */
    }
    assert_int_equal(kern_cpu_set_bf16_dot(be, bf16_dot, err0), 0);
    struct rng r = {29};
    char err[ERR_MSG_MAX];
    double *wref = dalloc(count);
    void *w = make_weights(&r, KERN_DTYPE_BF16, count, wref);
    const int max_n = 33;
    float *in = falloc((size_t)max_n * d_in), *a = falloc((size_t)max_n * d_out);
    float *b = falloc((size_t)max_n * d_out);
    fill(&r, in, (size_t)max_n * d_in);
    const void *mapped = NULL;
    assert_int_equal(be->ops->map_matrix(be, w, KERN_DTYPE_BF16, d_out, d_in, &mapped, err), 0);
    assert_non_null(mapped);
    /* a copy (huge pages available) of a packable shape is packed: for
     * vdpbf16ps in line octets in every x86-64 build (its kernels are chosen
     * at run time), for the f32 paths in row octets where the kernels were
     * built with AVX-512F+BW (the AVX-512 test's library is, this file not) */
#if (defined(__AVX512F__) && defined(__AVX512BW__)) || defined(TANDEM_TEST_REQUIRE_AVX512)
    const int packs = expect_packed && mapped != w;
#else
    const int packs = expect_packed && bf16_dot && mapped != w;
#endif
    if (mapped != w)
        assert_int_equal(memcmp(mapped, w, count * 2) != 0, packs);
    const int ns[] = {1, 2, 3, 4, 5, 6, 9, 17, 18, 33};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        const int n = ns[t];
        char what[64];
        snprintf(what, sizeof what, "matmul n=%d on a mapped matrix", n);
        assert_int_equal(be->ops->matmul(be, a, in, w, KERN_DTYPE_BF16, n, d_in, d_out, err), 0);
        assert_int_equal(be->ops->matmul(be, b, in, mapped, KERN_DTYPE_BF16, n, d_in, d_out, err),
                         0);
        assert_int_equal(count_bit_diffs(what, a, b, (size_t)n * d_out), 0);
    }
    const int32_t ids[] = {0, 1, 7, 8, 13, d_out / 2, d_out - 8, d_out - 6, d_out - 1};
    const int n_ids = (int)(sizeof ids / sizeof ids[0]);
    assert_int_equal(be->ops->embed(be, a, w, KERN_DTYPE_BF16, ids, n_ids, d_in, err), 0);
    assert_int_equal(be->ops->embed(be, b, mapped, KERN_DTYPE_BF16, ids, n_ids, d_in, err), 0);
    assert_int_equal(count_bit_diffs("embed from a mapped matrix", a, b, (size_t)n_ids * d_in), 0);
    if (packs) {
        /* a packed matrix read with another row length is refused, not misread */
        assert_int_equal(be->ops->matmul(be, b, in, mapped, KERN_DTYPE_BF16, 1, d_in / 2,
                                         2 * d_out, err),
                         ERR_INVALID_ARG);
        assert_non_null(strstr(err, "mapped as a bf16 matrix"));
        assert_int_equal(be->ops->embed(be, b, mapped, KERN_DTYPE_BF16, ids, 1, d_in / 2, err),
                         ERR_INVALID_ARG);
        assert_non_null(strstr(err, "mapped as bf16 rows"));
    }
    be->ops->unmap_weights(be, mapped);
    be->ops->destroy(be);
    free(w);
    free(wref);
    free(in);
    free(a);
    free(b);
}

static void test_kernels_cpu_map_matrix_reads_exactly(void **state)
{
    for (int dot = 0; dot < 2; dot++) { /* the f32 paths, then vdpbf16ps where the CPU has it */
        check_map_matrix_reads_exactly(2048, 1029, 1, dot); /* 128 octets and 5 row-major rows */
        check_map_matrix_reads_exactly(384, 5464, 1, dot);  /* the small draft's row length */
        check_map_matrix_reads_exactly(2056, 1100, 0, dot); /* not a multiple of 32: left as it is */
    }
}

/* ---- matmul_argmax ---- */

/* The argmax of matmul's own row of logits for input row h. */
static int32_t product_argmax(struct kern_backend *be, const float *h, const void *w,
                              enum kern_dtype dt, int d_in, int d_out, float *logits)
{
    char err[ERR_MSG_MAX];
    assert_int_equal(be->ops->matmul(be, logits, h, w, dt, 1, d_in, d_out, err), 0);
    return argmax_f32(logits, d_out); /* the rule the screen must keep */
}

/* The argmax among the allowed indices of matmul's own rows of logits. */
static int32_t masked_product_argmax(struct kern_backend *be, const float *h, const void *w,
                                     enum kern_dtype dt, int d_in, int d_out, const uint64_t *allow,
                                     float *logits)
{
    char err[ERR_MSG_MAX];
    assert_int_equal(be->ops->matmul(be, logits, h, w, dt, 1, d_in, d_out, err), 0);
    int32_t best = -1;
    for (int v = 0; v < d_out; v++)
        if ((allow[v / 64] >> (v % 64)) & 1 && !isnan(logits[v]) &&
            (best < 0 || logits[v] > logits[best]))
            best = v;
    return best;
}

/* With a mask per row (a grammar's: dense, sparse, the unmasked argmax
 * refused, one index, none; rows without one beside), each answer is the
 * argmax among the row's allowed indices, screened or whole (9 rows). */
static void check_masked_argmax(struct kern_backend *be, const void *mw, enum kern_dtype dt,
                                int d_in, int d_out, const float *rows, int n_rows, struct rng *r)
{
    char err[ERR_MSG_MAX];
    const size_t words = ((size_t)d_out + 63) / 64;
    uint64_t *bits = calloc((size_t)n_rows * words, sizeof *bits);
    const uint64_t *allow[16];
    int32_t want[16], got[16];
    float *logits = falloc((size_t)d_out);
    assert_non_null(bits);
    for (int trial = 0; trial < 6; trial++) {
        for (int i = 0; i < n_rows; i++) {
            uint64_t *b = bits + (size_t)i * words;
            const int kind = (trial + i) % 6;
            memset(b, 0, words * sizeof *b);
            for (int v = 0; v < d_out; v++) {
                const uint32_t x = (uint32_t)(rng_next(r) >> 32);
                const int on = kind == 0 ? x % 2 == 0 : kind == 1 ? x % 100 == 0 : kind == 2;
                b[v / 64] |= (uint64_t)on << (v % 64);
            }
            if (kind == 2) { /* everything but the unmasked argmax */
                const int32_t top = product_argmax(be, rows + (size_t)i * d_in, mw, dt, d_in,
                                                   d_out, logits);
                b[top / 64] &= ~(1ull << (top % 64));
            } else if (kind == 3) { /* one index */
                const int v = (int)((rng_next(r) >> 33) % (uint64_t)d_out);
                b[v / 64] |= 1ull << (v % 64);
            }
            /* kind 4: none allowed; kind 5: no mask at all */
            allow[i] = kind == 5 ? NULL : b;
            want[i] = kind == 5 ? product_argmax(be, rows + (size_t)i * d_in, mw, dt, d_in, d_out,
                                                 logits)
                                : masked_product_argmax(be, rows + (size_t)i * d_in, mw, dt,
                                                        d_in, d_out, b, logits);
        }
        for (int n = 1; n <= n_rows; n += n_rows - 1) {
            memset(got, 0x7f, sizeof got);
            assert_int_equal(be->ops->matmul_argmax(be, got, rows, mw, dt, n, d_in, d_out, allow,
                                                    err),
                             0);
            for (int i = 0; i < n; i++)
                if (got[i] != want[i])
                    fail_msg("masked matmul_argmax %s [%d, %d], trial %d, %d rows: row %d gave "
                             "%d, want %d", kern_dtype_name(dt), d_out, d_in, trial, n, i,
                             got[i], want[i]);
        }
    }
    free(logits);
    free(bits);
}

/* A prepared matrix: over inputs of every scale, with outliers, the screen
 * answers every row (it never fell back to the whole product) and always
 * with the index the whole product's logits give, for each dtype and for a
 * packed matrix with row-major rows after its last octet, one row at a time
 * and several in one call. Ties go to the lowest index (the same row twice,
 * h along it). draft: prepared as a draft's head, whose copy (half a byte a
 * weight where the build has AVX-512) may miss the largest row only by a
 * chance far below what these inputs could show: the answers must be the
 * same. */
static void check_matmul_argmax(enum kern_dtype dt, int d_in, int d_out, int map, int draft)
{
    struct kern_backend *be = make_backend(2);
    struct rng r = {31};
    char err[ERR_MSG_MAX];
    double *wref = dalloc((size_t)d_in * d_out);
    void *w = make_weights(&r, dt, (size_t)d_in * d_out, wref);
    /* rows 3 and d_out - 2 are the same row: h along it makes them the largest */
    const size_t esz = kern_dtype_size(dt);
    memcpy((char *)w + (size_t)(d_out - 2) * d_in * esz, (char *)w + (size_t)3 * d_in * esz,
           (size_t)d_in * esz);
    const void *mw = w;
    if (map)
        assert_int_equal(be->ops->map_matrix(be, w, dt, d_out, d_in, &mw, err), 0);
    assert_int_equal(be->ops->prepare_argmax(be, mw, dt, d_out, d_in, draft, err), 0);
#if (defined(__AVX512F__) && defined(__AVX512BW__)) || defined(TANDEM_TEST_REQUIRE_AVX512)
    assert_int_equal(kern_cpu_argmax_copy_bits(be, mw), draft ? 4 : 8);
#else
    assert_int_equal(kern_cpu_argmax_copy_bits(be, mw), 8);
#endif
    float *h = falloc((size_t)d_in), *logits = falloc((size_t)d_out);
    const double scales[] = {1e-3, 1.0, 37.0, 1e4};
    int served = 0, tried = 0;
    for (int t = 0; t < 40; t++) {
        if (t == 39) {
            for (int k = 0; k < d_in; k++)
                h[k] = (float)wref[(size_t)3 * d_in + k];
        } else {
            fill(&r, h, (size_t)d_in);
            for (int k = 0; k < d_in; k++)
                h[k] *= (float)scales[t % 4] * (k % 61 == t % 61 ? 40.0f : 1.0f);
        }
        const int32_t want = product_argmax(be, h, mw, dt, d_in, d_out, logits);
        int32_t got = -7;
        assert_int_equal(be->ops->matmul_argmax(be, &got, h, mw, dt, 1, d_in, d_out, NULL, err), 0);
        if (got != want)
            fprintf(stderr, "matmul_argmax %s [%d, %d] input %d: %d, the product's argmax is %d\n",
                    kern_dtype_name(dt), d_out, d_in, t, got, want);
        assert_int_equal(got, want);
        const int candidates = kern_cpu_argmax_candidates(be);
        tried++;
        served += candidates >= 1 && candidates < d_out / 4;
        if (t == 39)
            assert_int_equal(got, 3);
    }
    assert_int_equal(served, tried);
    /* several rows: up to eight share a pass (a batch of drafts, a
     * verification's rows), each count its own register tile; nine take the
     * whole product */
    enum { ROWS = 9 };
    float *rows = falloc((size_t)ROWS * d_in);
    fill(&r, rows, (size_t)ROWS * d_in);
    for (int i = 0; i < ROWS; i++)
        for (int k = 0; k < d_in; k++)
            rows[(size_t)i * d_in + k] *= (float)scales[i % 4];
    int32_t want[ROWS], got_rows[ROWS];
    for (int i = 0; i < ROWS; i++)
        want[i] = product_argmax(be, rows + (size_t)i * d_in, mw, dt, d_in, d_out, logits);
    static const int ns[] = {2, 3, 4, 5, 6, 7, 8, 9};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        memset(got_rows, 0xff, sizeof got_rows);
        assert_int_equal(
            be->ops->matmul_argmax(be, got_rows, rows, mw, dt, ns[t], d_in, d_out, NULL, err), 0);
        assert_memory_equal(got_rows, want, (size_t)ns[t] * sizeof(int32_t));
        const int candidates = kern_cpu_argmax_candidates(be);
        if (ns[t] <= 8)
            assert_true(candidates >= 1 && candidates < d_out / 4);
        else
            assert_int_equal(candidates, -1);
    }
    check_masked_argmax(be, mw, dt, d_in, d_out, rows, ROWS, &r);
    free(rows);
    be->ops->unmap_weights(be, mw); /* drops the shadow too (ASan: no leak) */
    be->ops->destroy(be);
    free(h);
    free(logits);
    free(w);
    free(wref);
}

static void test_kernels_cpu_matmul_argmax_is_the_products_argmax(void **state)
{
    check_matmul_argmax(KERN_DTYPE_BF16, 2048, 1029, 1, 0); /* 128 octets and 5 row-major rows */
    check_matmul_argmax(KERN_DTYPE_BF16, 200, 3001, 0, 0);
    check_matmul_argmax(KERN_DTYPE_BF16, 8192, 600, 1, 0); /* past 4128 columns: a coarser input */
    check_matmul_argmax(KERN_DTYPE_F16, 67, 2000, 0, 0);
    check_matmul_argmax(KERN_DTYPE_F32, 300, 1500, 1, 0);
}

static void test_kernels_cpu_matmul_argmax_on_a_drafts_copy_is_the_products_argmax(void **state)
{
    check_matmul_argmax(KERN_DTYPE_BF16, 2048, 1029, 1, 1);
    check_matmul_argmax(KERN_DTYPE_BF16, 384, 20000, 1, 1); /* the small draft's rows */
    check_matmul_argmax(KERN_DTYPE_BF16, 200, 3001, 0, 1);  /* 56 columns of padding */
    check_matmul_argmax(KERN_DTYPE_F16, 67, 2000, 0, 1);
    check_matmul_argmax(KERN_DTYPE_F32, 300, 1500, 1, 1);
}

/* The one-byte copy can rank rows the wrong way round, and the bound must
 * cover it: rows whose rounding errors all point one way, with h along
 * them. Row a's weights sit 0.49 of a step above their rounded values, row
 * b's 0.49 below, b rounded one step higher than a in 80% of its columns:
 * the copy ranks b far above a (by 0.8 (d - 1) steps), the real weights a
 * above b (by 0.18 (d - 1) steps). The answer must be a: a bound that were
 * 0.6 of the true one or less would leave it out. */
static void test_kernels_cpu_matmul_argmax_finds_the_row_its_copy_ranks_lower(void **state)
{
    const int d_in = 64, d_out = 300, row_a = 17, row_b = 5, m = 50;
    const float step = 0x1p-7f; /* the rows' scale: their largest weight is 127 steps */
    struct kern_backend *be = make_backend(2);
    struct rng r = {41};
    char err[ERR_MSG_MAX];
    float *w = falloc((size_t)d_in * d_out), *h = falloc((size_t)d_in);
    float *logits = falloc((size_t)d_out);
    for (size_t i = 0; i < (size_t)d_in * d_out; i++)
        w[i] = 0.1f * step * rng_float(&r);
    float *a = w + (size_t)row_a * d_in, *b = w + (size_t)row_b * d_in;
    a[0] = b[0] = 127 * step;
    h[0] = 0; /* column 0 only pins the scale */
    for (int k = 1; k < d_in; k++) {
        a[k] = ((float)m + 0.49f) * step;
        b[k] = ((float)(k <= (d_in - 1) * 8 / 10 ? m + 1 : m) - 0.49f) * step;
        h[k] = 1;
    }
    assert_int_equal(be->ops->prepare_argmax(be, w, KERN_DTYPE_F32, d_out, d_in, 0, err), 0);
    assert_int_equal(product_argmax(be, h, w, KERN_DTYPE_F32, d_in, d_out, logits), row_a);
    int32_t got = -1;
    assert_int_equal(be->ops->matmul_argmax(be, &got, h, w, KERN_DTYPE_F32, 1, d_in, d_out, NULL, err),
                     0);
    assert_int_equal(got, row_a);
    const int candidates = kern_cpu_argmax_candidates(be);
    assert_true(candidates >= 2 && candidates < d_out); /* a and b, by the screen */
    be->ops->destroy(be);
    free(w);
    free(h);
    free(logits);
}

/* Where the screen does not serve (no shadow, an input with a NaN, an
 * infinity or all zeros, a matrix prepared for another shape), the answer is
 * still the whole product's, also for the other rows of a call; a matrix
 * holding a NaN is refused by prepare_argmax and answered the same way. */
static void test_kernels_cpu_matmul_argmax_falls_back_to_the_whole_product(void **state)
{
    const int d_in = 256, d_out = 1024;
    struct kern_backend *be = make_backend(2);
    struct rng r = {37};
    char err[ERR_MSG_MAX];
    double *wref = dalloc((size_t)d_in * d_out);
    uint16_t *w = make_weights(&r, KERN_DTYPE_BF16, (size_t)d_in * d_out, wref);
    float *in = falloc((size_t)3 * d_in), *logits = falloc((size_t)3 * d_out);
    fill(&r, in, (size_t)3 * d_in);
    int32_t got[3];
    /* not prepared */
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 1, d_in, d_out, NULL, err),
                     0);
    assert_int_equal(got[0], product_argmax(be, in, w, KERN_DTYPE_BF16, d_in, d_out, logits));
    assert_int_equal(kern_cpu_argmax_candidates(be), -1);
    assert_int_equal(be->ops->prepare_argmax(be, w, KERN_DTYPE_BF16, d_out, d_in, 0, err), 0);
    /* three rows in one call, screened together */
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 3, d_in, d_out, NULL, err),
                     0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(got[i], product_argmax(be, in + (size_t)i * d_in, w, KERN_DTYPE_BF16,
                                                d_in, d_out, logits));
    /* a NaN in the middle row of three: that row's logits are all NaN (-1),
     * the other two are still screened */
    in[d_in + 5] = NAN;
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 3, d_in, d_out, NULL, err),
                     0);
    assert_int_equal(got[1], -1);
    assert_int_equal(got[0], product_argmax(be, in, w, KERN_DTYPE_BF16, d_in, d_out, logits));
    assert_int_equal(got[2], product_argmax(be, in + (size_t)2 * d_in, w, KERN_DTYPE_BF16, d_in,
                                            d_out, logits));
    assert_true(kern_cpu_argmax_candidates(be) >= 1); /* the last row's: screened */
    /* a NaN, then an infinity: every logit NaN (-1), or the product's answer */
    in[5] = NAN;
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 1, d_in, d_out, NULL, err),
                     0);
    assert_int_equal(got[0], -1);
    assert_int_equal(kern_cpu_argmax_candidates(be), -1);
    in[5] = INFINITY;
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 1, d_in, d_out, NULL, err),
                     0);
    assert_int_equal(got[0], product_argmax(be, in, w, KERN_DTYPE_BF16, d_in, d_out, logits));
    assert_int_equal(kern_cpu_argmax_candidates(be), -1);
    /* all zeros: every logit 0, the first index */
    memset(in, 0, (size_t)d_in * sizeof *in);
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 1, d_in, d_out, NULL, err),
                     0);
    assert_int_equal(got[0], 0);
    /* the same bytes read as another shape */
    fill(&r, in, (size_t)d_in);
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 1, d_in / 2,
                                            2 * d_out, NULL, err),
                     0);
    assert_int_equal(got[0], product_argmax(be, in, w, KERN_DTYPE_BF16, d_in / 2, 2 * d_out,
                                            logits));
    assert_int_equal(kern_cpu_argmax_candidates(be), -1);
    /* a NaN in the matrix: refused, named */
    w[(size_t)77 * d_in + 5] = 0x7fc1;
    assert_int_equal(be->ops->prepare_argmax(be, w, KERN_DTYPE_BF16, d_out, d_in, 0, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "NaN"));
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 1, d_in, d_out, NULL, err),
                     0);
    assert_int_equal(got[0], product_argmax(be, in, w, KERN_DTYPE_BF16, d_in, d_out, logits));
    assert_int_equal(kern_cpu_argmax_candidates(be), -1);
    /* shapes */
    assert_int_equal(be->ops->matmul_argmax(be, got, in, w, KERN_DTYPE_BF16, 1, d_in, 0, NULL, err),
                     ERR_INVALID_ARG);
    assert_int_equal(be->ops->prepare_argmax(be, w, KERN_DTYPE_BF16, 0, d_in, 0, err),
                     ERR_INVALID_ARG);
    be->ops->destroy(be);
    free(w);
    free(wref);
    free(in);
    free(logits);
}

static void test_kernels_cpu_bad_arguments_are_rejected(void **state)
{
    struct kern_backend *be = make_backend(2);
    char err[ERR_MSG_MAX] = "";
    float buf[64] = {0};
    int32_t pos[2] = {0, 1};
    float inv_freq[4] = {1, 1, 1, 1};
    assert_int_equal(be->ops->matmul(be, buf, buf + 32, buf, (enum kern_dtype)7, 1, 4, 4, err),
                     ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "matmul"));
    assert_int_equal(be->ops->matmul(be, buf, buf + 32, buf, KERN_DTYPE_F32, -1, 4, 4, err),
                     ERR_INVALID_ARG);
    assert_int_equal(be->ops->rmsnorm(be, buf, buf, buf, KERN_DTYPE_F32, 1, 0, 1e-5f, err),
                     ERR_INVALID_ARG);
    assert_int_equal(be->ops->rope(be, buf, pos, 2, 1, 7, inv_freq, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "head_dim"));
    struct kern_kv_layout kv;
    assert_int_equal(be->ops->attention(be, buf, buf, buf, buf, 1, contig_kv(&kv, 1, 0, 4), 4, 3,
                                        8, 1.0f, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "n_kv_heads"));
    /* a row past what its table covers, and a table naming a block outside
     * the pool, are refused by both ops */
    assert_int_equal(be->ops->attention(be, buf, buf, buf, buf, 1, contig_kv(&kv, 1, 4, 4), 1, 1,
                                        8, 1.0f, err),
                     ERR_RANGE);
    assert_non_null(strstr(err, "position 4"));
    assert_int_equal(be->ops->kv_store(be, buf, buf, buf, buf, 1, contig_kv(&kv, 1, 4, 4), 8, err),
                     ERR_RANGE);
    const int32_t far_table[1] = {1};
    contig_kv(&kv, 1, 0, 4);
    kv.tables = far_table;
    assert_int_equal(be->ops->kv_store(be, buf, buf, buf, buf, 1, &kv, 8, err), ERR_RANGE);
    assert_non_null(strstr(err, "pool block 1 of 1"));
    int32_t bad_id = -1;
    assert_int_equal(be->ops->embed(be, buf, buf, KERN_DTYPE_F32, &bad_id, 1, 4, err),
                     ERR_INVALID_ARG);
    struct kern_backend *none = NULL;
    assert_int_equal(kern_cpu_create(&none, -3, err), ERR_INVALID_ARG);
    assert_null(none);
    /* n = 0 is a no-op */
    assert_int_equal(be->ops->matmul(be, NULL, NULL, NULL, KERN_DTYPE_BF16, 0, 4, 4, err), 0);
    /* d_in = 0: every output is the empty sum, 0 (a crash here once: the
     * prefetch lead was sized by dividing by the block's bytes) */
    for (int i = 0; i < 8; i++)
        buf[i] = 7.0f;
    assert_int_equal(be->ops->matmul(be, buf, buf + 32, buf + 48, KERN_DTYPE_BF16, 2, 0, 4, err), 0);
    for (int i = 0; i < 8; i++)
        assert_true(buf[i] == 0.0f);
    be->ops->destroy(be);
}

int main(void)
{
    /* Run with TANDEM_CPU_BF16_DOT=1 (bf16 on vdpbf16ps required): nothing
     * to check where the CPU cannot run it. (CTest's *_bf16_f32 runs set it
     * to 0: the f32 paths.) */
    const char *bf16_dot = getenv("TANDEM_CPU_BF16_DOT");
    if (bf16_dot != NULL && strcmp(bf16_dot, "1") == 0) {
        /* the backend's own check: it refuses to start so where it cannot */
        struct kern_backend *probe = NULL;
        char probe_err[ERR_MSG_MAX];
        if (kern_cpu_create(&probe, 1, probe_err) == ERR_UNSUPPORTED) {
            printf("SKIPPED: %s\n", probe_err);
            return 77;
        }
        if (probe != NULL)
            probe->ops->destroy(probe);
    }
#ifdef TANDEM_TEST_REQUIRE_AVX512
    /* The AVX-512 build of this test (tests/CMakeLists.txt): nothing to
     * check on a CPU that cannot run it. */
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512dq")) {
        printf("SKIPPED: this CPU lacks AVX-512 F, BW or DQ\n");
        return 77;
    }
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_cpu_matmul_matches_reference_for_every_dtype),
        cmocka_unit_test(test_kernels_cpu_matmul_decode_over_many_claims_matches_one_thread),
        cmocka_unit_test(test_kernels_cpu_matmul_row_is_bit_identical_alone_and_in_batch),
        cmocka_unit_test(test_kernels_cpu_matmul_verification_row_counts_match_single_rows),
        cmocka_unit_test(test_kernels_cpu_matmul_every_path_follows_the_fixed_order),
        cmocka_unit_test(test_kernels_cpu_bf16_dot_step_is_the_instruction),
        cmocka_unit_test(test_kernels_cpu_matmul_bf16_dot_matches_the_emulation),
        cmocka_unit_test(test_kernels_cpu_matmul_bf16_dot_line_octets_match_the_emulation),
        cmocka_unit_test(test_kernels_cpu_bf16_dot_can_be_turned_off),
        cmocka_unit_test(test_kernels_cpu_matmul_int8_matches_the_integer_reference),
        cmocka_unit_test(test_kernels_cpu_matmul_int4_matches_the_integer_reference),
        cmocka_unit_test(test_kernels_cpu_matmul_int_scales_are_per_row_and_block),
        cmocka_unit_test(test_kernels_cpu_matmul_int_never_saturates),
        cmocka_unit_test(test_kernels_cpu_matmul_int_non_finite_and_tiny_inputs),
        cmocka_unit_test(test_kernels_cpu_rmsnorm_matches_reference_and_works_in_place),
        cmocka_unit_test(test_kernels_cpu_rmsnorm_row_is_bit_identical_alone_and_in_batch),
        cmocka_unit_test(test_kernels_cpu_rope_matches_reference_and_is_batch_invariant),
        cmocka_unit_test(test_kernels_cpu_attention_matches_reference),
        cmocka_unit_test(test_kernels_cpu_softmax_exp_is_within_2_ulp),
        cmocka_unit_test(test_kernels_cpu_attention_follows_the_fixed_order_bit_for_bit),
        cmocka_unit_test(test_kernels_cpu_attention_row_is_bit_identical_alone_and_in_batch),
        cmocka_unit_test(test_kernels_cpu_paged_attention_equals_contiguous),
        cmocka_unit_test(test_kernels_cpu_results_do_not_depend_on_thread_count),
        cmocka_unit_test(test_kernels_cpu_embed_widens_rows_exactly),
        cmocka_unit_test(test_kernels_cpu_bf16_converts_by_shifting_the_bits),
        cmocka_unit_test(test_kernels_cpu_swiglu_and_add_match_reference),
        cmocka_unit_test(test_kernels_cpu_swiglu_edges_match_reference),
        cmocka_unit_test(test_kernels_cpu_memory_ops_are_zeroed_aligned_and_copy),
        cmocka_unit_test(test_kernels_cpu_bad_arguments_are_rejected),
        cmocka_unit_test(test_kernels_cpu_map_weights_copies_large_tensors_exactly),
        cmocka_unit_test(test_kernels_cpu_map_matrix_reads_exactly),
        cmocka_unit_test(test_kernels_cpu_matmul_argmax_is_the_products_argmax),
        cmocka_unit_test(test_kernels_cpu_matmul_argmax_on_a_drafts_copy_is_the_products_argmax),
        cmocka_unit_test(test_kernels_cpu_matmul_argmax_finds_the_row_its_copy_ranks_lower),
        cmocka_unit_test(test_kernels_cpu_matmul_argmax_falls_back_to_the_whole_product),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
