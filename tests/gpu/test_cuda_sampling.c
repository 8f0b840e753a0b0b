/* test_cuda_sampling.c: the device sampling and speculative accept/reject
 * (kernels/cuda/sampling.cu) against the CPU reference (common/speculation).
 *
 * What is checked, and how exactly:
 *   - Philox: the host build of the device code equals philox4x32_10 and
 *     philox_uniform (Random123 known answers, the documented grid, 100,000
 *     random inputs): run by main() before it looks for a device, so a build
 *     without a GPU still proves the restated constants; on the device, the
 *     same inputs give the same bits.
 *   - argmax: equal to argmax_f32 (base/argmax.h) on random rows, ties, NaN, +-inf, -0.
 *   - adjust: every row within |gpu - cpu| <= 1e-6 * cpu + 2^-126 of
 *     sampling_adjust (the bound sampling.cu derives is 6e-7), with the same
 *     support (kept set), for 29 parameter sets x 9 logit patterns x vocab
 *     1, 2, 12, 1000, 4099 and 128256. A support may differ only where the
 *     CPU's own value is within rounding of its threshold (top-p running sum
 *     within 1e-6 * S of top_p * S, e within 4 ulp of min_p): such rows are
 *     printed and counted, and at most 2 are allowed. Probabilities below
 *     2^-126 (subnormal) are compared with the absolute tolerance only.
 *     Same bits on a second run with the rows in reverse order and for a
 *     row alone. Errors: NaN / +inf / all -inf rows and bad parameters.
 *   - draws: equal to sampling_draw(row, philox_uniform(seed, stream, pos, 0))
 *     on the same rows (uploaded bit for bit); kern_cuda_sample's token is
 *     the CPU rule applied to its own adjusted row, and equals the CPU's
 *     sampling_sample whenever the two rows are bitwise equal; otherwise the
 *     tokens may differ with probability at most the rows' total variation
 *     distance (<= 1e-6): printed, at most 2 allowed.
 *   - accept/reject: the chi-square goodness-of-fit tests of
 *     tests/unit/test_speculate.c (same rows, seeds, 40,000 rounds, alpha
 *     1e-4, bins < 5 pooled) on the device's output, sampled and point-mass,
 *     K = 1 and 3, and the broken variant (correction from p) rejected by the
 *     same test; every round also equal to speculate_verify's token for token
 *     (these rows' double sums are exact, so the draws are the CPU's). Greedy
 *     and sampled rounds on random rows (vocab 1000 and 128256, k 0..16,
 *     mixed in one launch) equal to speculate_verify; degenerate rows and
 *     per-sequence status words.
 *   - timing (printed, not asserted): sampling rows of vocab 128256 on the
 *     device vs sampling_sample on the CPU.
 *
 * TANDEM_GPU_TEST_SHORT=1 (compute-sanitizer runs): no 128256-wide rows and
 * 500 rounds per goodness-of-fit test (the equality with the CPU is still
 * checked, the chi-square verdict is printed but not asserted).
 * Exits 77 ("SKIPPED: no CUDA device") where no device is visible, after the
 * host Philox check. TANDEM_CUDA_DEVICE selects the device (default "0").
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
#include <time.h>

#include <cmocka.h>

#include "argmax.h"
#include "error.h"
#include "kernels.h"
#include "kernels_cuda.h"
#include "gpu_skip.h"
#include "philox.h"
#include "sampling.h"
#include "speculate.h"
#include "stats_helpers.h"

/* The constants kernels_cuda.h restates, against their spec twins. */
_Static_assert(KERN_CUDA_SPEC_K_MAX == SPECULATE_K_MAX, "K max");
_Static_assert((int)KERN_CUDA_PHILOX_STREAM_TARGET_SAMPLE == (int)PHILOX_STREAM_TARGET_SAMPLE,
               "stream");
_Static_assert((int)KERN_CUDA_PHILOX_STREAM_TARGET_ACCEPT == (int)PHILOX_STREAM_TARGET_ACCEPT,
               "stream");
_Static_assert((int)KERN_CUDA_PHILOX_STREAM_DRAFT_SAMPLE == (int)PHILOX_STREAM_DRAFT_SAMPLE,
               "stream");
_Static_assert((int)KERN_CUDA_SPEC_MODE_SAMPLED == (int)SPECULATE_MODE_SAMPLED, "mode");
_Static_assert((int)KERN_CUDA_SPEC_MODE_POINT_MASS == (int)SPECULATE_MODE_POINT_MASS, "mode");
_Static_assert((int)KERN_CUDA_SPEC_DEBUG_NONE == (int)SPECULATE_DEBUG_NONE, "fault");
_Static_assert((int)KERN_CUDA_SPEC_DEBUG_RESIDUAL_FROM_P == (int)SPECULATE_DEBUG_RESIDUAL_FROM_P,
               "fault");

#define LLAMA3_VOCAB 128256
/* Adjusted rows: |gpu - cpu| <= ADJ_RTOL * cpu + ADJ_ATOL. */
#define ADJ_RTOL 1e-6
#define ADJ_ATOL 0x1.0p-126
/* A support difference is rounding when the CPU's top-p running sum is
 * within TOP_P_SLACK * S of its target, or e within MIN_P_SLACK (relative,
 * 4 ulp) of min_p. */
#define TOP_P_SLACK 1e-6
#define MIN_P_SLACK 4.8e-7
#define FLIPS_MAX 2

struct fixture {
    struct kern_backend *gpu;
    const char *device;
    int short_mode;
    int fewest;  /* TANDEM_GPU_TEST_SHORT=2 (racecheck): short, and no goodness-of-fit
                    runs or timings, whose kernels the other cases launch too */
    int flips; /* tolerated support differences so far (adjust) */
};

#define OK(call)                                                                 \
    do {                                                                         \
        int ok_rc_ = (call);                                                     \
        if (ok_rc_ != 0)                                                         \
            fail_msg("%s returned %d: %s", #call, ok_rc_, err);                  \
    } while (0)

struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_unit(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static void *xmalloc(size_t size_bytes)
{
    void *p = malloc(size_bytes ? size_bytes : 1);
    assert_non_null(p);
    return p;
}

static void *dev_alloc(struct kern_backend *be, size_t size_bytes)
{
    char err[ERR_MSG_MAX] = "";
    void *d = NULL;
    OK(be->ops->alloc(be, size_bytes, &d, err));
    return d;
}

static void *dev_put(struct kern_backend *be, const void *host, size_t size_bytes)
{
    char err[ERR_MSG_MAX] = "";
    void *d = dev_alloc(be, size_bytes);
    OK(be->ops->upload(be, d, host, size_bytes, err));
    return d;
}

static void dev_get(struct kern_backend *be, void *host, const void *dev, size_t size_bytes)
{
    char err[ERR_MSG_MAX] = "";
    OK(be->ops->download(be, host, dev, size_bytes, err));
}

static struct kern_cuda_sample_params kparams(const struct sampling_params *p)
{
    struct kern_cuda_sample_params k = {p->temperature, p->top_k, p->top_p, p->min_p, p->seed};
    return k;
}

static struct sampling_params params(float t, int k, float top_p, float min_p)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

/* ---- Philox --------------------------------------------------------------- */

/* Random123 kat_vectors, philox4x32_10 (as tests/unit/test_philox.c). */
static const uint32_t kat_in[3][6] = {
    {0, 0, 0, 0, 0, 0},
    {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
    {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0},
};
static const uint32_t kat_out[3][4] = {
    {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
    {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
    {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
};

#define PHILOX_RANDOM_ARGS 100000
#define PHILOX_RANDOM_BLOCKS 20000

/* The documented grid of test_philox.c plus random inputs. Caller frees. */
static struct kern_cuda_philox_arg *philox_args(int *n_out)
{
    static const uint64_t seeds[] = {0, 1, 0x123456789abcdef0ull, UINT64_MAX};
    static const uint64_t positions[] = {0, 7, 0xfffffffful, 0x100000000ull, 0xdeadbeefcafeull};
    static const uint32_t streams[] = {0, 1, 2, 3, 7, 0xffffffffu};
    const int n_grid = 4 * 5 * 6 * 9;
    const int n = n_grid + PHILOX_RANDOM_ARGS;
    struct kern_cuda_philox_arg *a = xmalloc((size_t)n * sizeof(*a));
    int i = 0;
    for (int s = 0; s < 4; s++)
        for (int p = 0; p < 5; p++)
            for (int st = 0; st < 6; st++)
                for (uint32_t index = 0; index < 9; index++)
                    a[i++] = (struct kern_cuda_philox_arg){seeds[s], positions[p], streams[st],
                                                           index};
    struct rng r = {2024};
    for (; i < n; i++) {
        uint64_t x = rng_next(&r);
        a[i].seed = rng_next(&r);
        a[i].position = (x & 1) ? rng_next(&r) : (rng_next(&r) & 0xffffff);
        a[i].stream = (uint32_t)(x >> 8) % 5u;
        a[i].index = (uint32_t)(x >> 20) % 13u;
    }
    *n_out = n;
    return a;
}

static int float_bits_equal(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Mismatches between the host build of sampling.cu's Philox and philox.c;
 * prints the first few. Needs no device. */
static int philox_host_twin_mismatches(void)
{
    int bad = 0;
    for (int t = 0; t < 3; t++) {
        uint32_t got[4], cpu[4];
        kern_cuda_philox4x32_10_host(kat_in[t], kat_in[t] + 4, got);
        philox4x32_10(kat_in[t], kat_in[t] + 4, cpu);
        for (int j = 0; j < 4; j++)
            if (got[j] != kat_out[t][j] || cpu[j] != kat_out[t][j]) {
                if (bad++ < 5)
                    fprintf(stderr, "philox KAT %d word %d: cuda host build 0x%08x, cpu 0x%08x, "
                            "want 0x%08x\n", t, j, got[j], cpu[j], kat_out[t][j]);
            }
    }
    int n;
    struct kern_cuda_philox_arg *a = philox_args(&n);
    for (int i = 0; i < n; i++) {
        float g = kern_cuda_philox_uniform_host(a[i].seed, a[i].stream, a[i].position, a[i].index);
        float c = philox_uniform(a[i].seed, a[i].stream, a[i].position, a[i].index);
        if (!float_bits_equal(g, c) && bad++ < 5)
            fprintf(stderr, "philox_uniform(%llu, %u, %llu, %u): cuda host build %.9g, cpu %.9g\n",
                    (unsigned long long)a[i].seed, a[i].stream,
                    (unsigned long long)a[i].position, a[i].index, (double)g, (double)c);
    }
    free(a);
    return bad;
}

static void test_cuda_philox_host_build_equals_cpu(void **state)
{
    (void)state;
    assert_int_equal(philox_host_twin_mismatches(), 0);
}

static void test_cuda_philox_device_bits_equal_cpu(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    int n;
    struct kern_cuda_philox_arg *a = philox_args(&n);
    float *got = xmalloc((size_t)n * sizeof(float));
    void *d_in = dev_put(g, a, (size_t)n * sizeof(*a));
    float *d_out = dev_alloc(g, (size_t)n * sizeof(float));
    OK(kern_cuda_philox_uniforms(g, d_out, d_in, n, err));
    dev_get(g, got, d_out, (size_t)n * sizeof(float));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float c = philox_uniform(a[i].seed, a[i].stream, a[i].position, a[i].index);
        if (!float_bits_equal(got[i], c) && bad++ < 5)
            fprintf(stderr, "uniform %d: device %.9g cpu %.9g\n", i, (double)got[i], (double)c);
    }
    printf("philox: %d device uniforms compared bit for bit, %d differ\n", n, bad);
    assert_int_equal(bad, 0);
    g->ops->free(g, d_in);
    g->ops->free(g, d_out);

    /* Raw blocks: the known answers, then random counters and keys. */
    const int nb = 3 + PHILOX_RANDOM_BLOCKS;
    uint32_t *in = xmalloc((size_t)nb * 6 * sizeof(uint32_t));
    uint32_t *out = xmalloc((size_t)nb * 4 * sizeof(uint32_t));
    memcpy(in, kat_in, sizeof(kat_in));
    struct rng r = {77};
    for (int i = 3 * 6; i < nb * 6; i++)
        in[i] = (uint32_t)rng_next(&r);
    uint32_t *d_bin = dev_put(g, in, (size_t)nb * 6 * sizeof(uint32_t));
    uint32_t *d_bout = dev_alloc(g, (size_t)nb * 4 * sizeof(uint32_t));
    OK(kern_cuda_philox_blocks(g, d_bout, d_bin, nb, err));
    dev_get(g, out, d_bout, (size_t)nb * 4 * sizeof(uint32_t));
    bad = 0;
    for (int i = 0; i < nb; i++) {
        uint32_t c[4];
        philox4x32_10(in + 6 * i, in + 6 * i + 4, c);
        for (int j = 0; j < 4; j++) {
            int wrong = out[4 * i + j] != c[j] || (i < 3 && out[4 * i + j] != kat_out[i][j]);
            if (wrong && bad++ < 5)
                fprintf(stderr, "block %d word %d: device 0x%08x cpu 0x%08x\n", i, j,
                        out[4 * i + j], c[j]);
        }
    }
    assert_int_equal(bad, 0);
    g->ops->free(g, d_bin);
    g->ops->free(g, d_bout);
    free(in);
    free(out);
    free(a);
    free(got);
}

/* ---- argmax ------------------------------------------------------------------ */

static void test_cuda_argmax_equals_cpu(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    const int vocabs[] = {1, 5, 31, 1000, 4099, LLAMA3_VOCAB};
    const int n_vocabs = f->short_mode ? 5 : 6;
    enum { R = 9 };
    struct rng r = {5};
    for (int vi = 0; vi < n_vocabs; vi++) {
        const int n = vocabs[vi];
        float *x = xmalloc((size_t)R * n * sizeof(float));
        for (int row = 0; row < R; row++) {
            float *y = x + (size_t)row * n;
            for (int v = 0; v < n; v++) {
                double u = rng_unit(&r);
                float val = (float)(8.0 * u - 4.0);
                switch (row) {
                case 1: val = roundf(val); break;                      /* many ties */
                case 2: val = u < 0.1 ? NAN : u < 0.2 ? -INFINITY : val; break;
                case 3: val = NAN; break;                             /* -1 */
                case 4: val = -INFINITY; break;                       /* 0 */
                case 5: val = v == n - 1 ? 100.0f : val; break;       /* last */
                case 6: val = (v % 7 == 3) ? ((v / 7) % 2 ? 0.0f : -0.0f) : -(float)u; break;
                case 7: val = (v % 5 == 2) ? INFINITY : (v % 3 == 0) ? NAN : val; break;
                case 8: val = (v % 2) ? NAN : -INFINITY; break;       /* -inf among NaN */
                default: break;
                }
                y[v] = val;
            }
        }
        float *d_x = dev_put(g, x, (size_t)R * n * sizeof(float));
        int32_t *d_out = dev_alloc(g, R * sizeof(int32_t));
        int32_t got[R];
        OK(kern_cuda_argmax(g, d_out, d_x, R, n, err));
        dev_get(g, got, d_out, sizeof(got));
        for (int row = 0; row < R; row++) {
            int want = argmax_f32(x + (size_t)row * n, n);
            if (got[row] != want)
                fail_msg("argmax vocab %d row %d: device %d, cpu %d", n, row, (int)got[row], want);
        }
        g->ops->free(g, d_x);
        g->ops->free(g, d_out);
        free(x);
    }
}

/* ---- adjusted distributions --------------------------------------------------- */

enum {
    LOGITS_RANDOM,
    LOGITS_QUANTISED,
    LOGITS_MASKED,
    LOGITS_QUANTISED_MASKED,
    LOGITS_FLAT,
    LOGITS_TWO_LEVEL,
    LOGITS_SIGNED_ZEROS,
    LOGITS_SINGLE,
    LOGITS_WIDE,
    LOGITS_KINDS
};

static const char *const logits_kind_name[LOGITS_KINDS] = {
    "random", "quantised", "masked", "quantised+masked", "flat", "two-level", "signed zeros",
    "single finite", "wide",
};

static void fill_logits(float *x, int n, int kind, uint64_t seed)
{
    struct rng r = {seed};
    for (int v = 0; v < n; v++) {
        double u1 = rng_unit(&r), u2 = rng_unit(&r);
        /* Heavy-ish tail like real logits (as test_sampling.c). */
        float val = (float)(8.0 * u1 - 4.0 + (u2 > 0.999 ? 12.0 * u2 : 0.0));
        switch (kind) {
        case LOGITS_QUANTISED: val = roundf(val * 2.0f) / 2.0f; break;
        case LOGITS_MASKED: val = u2 < 0.1 ? -INFINITY : val; break;
        case LOGITS_QUANTISED_MASKED: val = u2 < 0.1 ? -INFINITY : roundf(val * 2.0f) / 2.0f; break;
        case LOGITS_FLAT: val = 0.5f; break;
        case LOGITS_TWO_LEVEL: val = (v % 3 == 0) ? 1.0f : 0.0f; break;
        case LOGITS_SIGNED_ZEROS:
            val = (v % 5 == 1) ? ((v / 5) % 2 ? 0.0f : -0.0f) : -(float)(1.0 + u1);
            break;
        case LOGITS_SINGLE: val = v == n / 2 ? -3.0f : -INFINITY; break;
        case LOGITS_WIDE: val = (float)(2e4 * u1 - 1e4); break;
        default: break;
        }
        x[v] = val;
    }
    int finite = 0;
    for (int v = 0; v < n; v++)
        finite |= x[v] > -INFINITY;
    if (!finite)
        x[0] = 0.0f;
}

/* The parameter sets of every adjust test: test_sampling.c's, then edges.
 * top_k -1 means vocab - 1, -2 means vocab. */
static const struct {
    float t;
    int k;
    float top_p, min_p;
} adjust_cases[] = {
    {1.0f, 0, 1.0f, 0.0f},    {0.7f, 40, 1.0f, 0.0f},   {1.0f, 1, 1.0f, 0.0f},
    {1.0f, 0, 0.9f, 0.0f},    {1.3f, 0, 0.5f, 0.0f},    {1.0f, 50, 0.9f, 0.0f},
    {0.8f, 0, 1.0f, 0.05f},   {1.0f, 20, 0.95f, 0.1f},  {0.0f, 0, 1.0f, 0.0f},
    {5.0f, 0, 0.999f, 0.0f},  {1.0f, 999, 0.3f, 0.0f},  {1.0f, 2000, 1.0f, 0.0f},
    {0.9f, 3000, 0.8f, 0.02f}, {0.0f, 5, 0.3f, 0.5f},   {1.0f, -1, 1.0f, 0.0f},
    {1.0f, -2, 1.0f, 0.0f},   {1.0f, 100000, 1.0f, 0.0f}, {1.0f, 0, 1e-7f, 0.0f},
    {1.0f, 0, 1.0f, 1.0f},    {1e-3f, 0, 1.0f, 0.0f},   {1e-20f, 0, 0.9f, 0.0f},
    {1e6f, 0, 1.0f, 0.0f},    {1e6f, 7, 0.5f, 0.0f},    {2.0f, 3, 0.7f, 0.3f},
    {0.5f, 0, 0.6f, 0.01f},   {1.0f, 0, 0.9999f, 0.0f}, {1.0f, 5, 1.0f, 0.9f},
    {1.0f, -1, 0.5f, 0.0f},   {3.0f, 0, 0.25f, 1e-4f},
};
#define N_ADJUST_CASES ((int)(sizeof adjust_cases / sizeof adjust_cases[0]))

static struct sampling_params adjust_case(int c, int vocab)
{
    const int k0 = adjust_cases[c].k;
    const int k = k0 == -1 ? vocab - 1 : k0 == -2 ? vocab : k0;
    struct sampling_params p = params(adjust_cases[c].t, k, adjust_cases[c].top_p,
                                      adjust_cases[c].min_p);
    p.seed = 1000u + (uint64_t)c;
    return p;
}

static const float *order_logits;

static int order_cmp(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float li = order_logits[i], lj = order_logits[j];
    if (li != lj)
        return li > lj ? -1 : 1;
    return i < j ? -1 : 1;
}

/* The canonical order (logit descending, then index): caller frees. */
static int *canonical_order(const float *x, int n)
{
    int *order = xmalloc((size_t)n * sizeof(int));
    for (int v = 0; v < n; v++)
        order[v] = v;
    order_logits = x;
    qsort(order, (size_t)n, sizeof(int), order_cmp);
    return order;
}

/* Length of the row's support if it is a prefix of the canonical order,
 * else -1. Entries below FLT_MIN count as outside: subnormal probabilities
 * are compared with the absolute tolerance only (CUDA's expf may flush a
 * subnormal e to 0 where glibc's does not). */
static int support_prefix(const float *probs, const int *order, int n)
{
    int len = 0;
    while (len < n && probs[order[len]] >= FLT_MIN)
        len++;
    for (int r = len; r < n; r++)
        if (probs[order[r]] >= FLT_MIN)
            return -1;
    return len;
}

/* Compares one adjusted row with the CPU's (module header: tolerance,
 * support, tolerated boundary rounding). Returns 0 or 1 (printed). */
static int compare_adjusted(struct fixture *f, const char *what, const struct sampling_params *p,
                            const float *x, int n, const int *order, const float *cpu,
                            const float *gpu)
{
    if (p->temperature == 0.0f) {
        if (memcmp(cpu, gpu, (size_t)n * sizeof(float)) != 0) {
            fprintf(stderr, "%s: greedy row differs from the cpu's one-hot row\n", what);
            return 1;
        }
        return 0;
    }
    double sum = 0.0;
    for (int v = 0; v < n; v++) {
        if (!(gpu[v] >= 0.0f && gpu[v] <= 1.0f)) {
            fprintf(stderr, "%s: probs[%d] = %g\n", what, v, (double)gpu[v]);
            return 1;
        }
        sum += gpu[v];
    }
    if (fabs(sum - 1.0) > 1e-4) {
        fprintf(stderr, "%s: row sums to %.9g\n", what, sum);
        return 1;
    }
    const int n_cpu = support_prefix(cpu, order, n), n_gpu = support_prefix(gpu, order, n);
    if (n_gpu < 0 || n_cpu < 0) {
        fprintf(stderr, "%s: support is not a prefix of the canonical order (cpu %d, gpu %d)\n",
                what, n_cpu, n_gpu);
        return 1;
    }
    double rtol = ADJ_RTOL;
    if (n_cpu != n_gpu) {
        /* Recompute the CPU's e in canonical order and see whether every
         * token that changed sides sits within rounding of a threshold. */
        const int lo = n_cpu < n_gpu ? n_cpu : n_gpu, hi = n_cpu < n_gpu ? n_gpu : n_cpu;
        const int n_k = (p->top_k > 0 && p->top_k < n) ? p->top_k : n;
        const float m = x[order[0]];
        double *cum = xmalloc((size_t)n * sizeof(double));
        float *e = xmalloc((size_t)n * sizeof(float));
        double s = 0.0;
        for (int r = 0; r < n; r++) {
            e[r] = r < n_k ? expf((x[order[r]] - m) / p->temperature) : 0.0f;
            s += e[r];
            cum[r] = s;
        }
        const double target = (double)p->top_p * s;
        int near_p = p->top_p < 1.0f, near_min = p->min_p > 0.0f;
        double flipped = 0.0;
        for (int r = lo; r < hi; r++) {
            near_min &= fabs((double)e[r] - (double)p->min_p) <= MIN_P_SLACK * (double)p->min_p;
            flipped += e[r];
        }
        for (int r = lo - 1; r <= hi - 2; r++)
            near_p &= r >= 0 && fabs(cum[r] - target) <= TOP_P_SLACK * s;
        const double kept = lo > 0 ? cum[lo - 1] : 1.0; /* the smaller survivors' mass */
        free(cum);
        free(e);
        if (!(near_p || near_min)) {
            fprintf(stderr, "%s: kept %d tokens, the cpu %d (not explained by rounding at a "
                    "threshold)\n", what, n_gpu, n_cpu);
            return 1;
        }
        f->flips++;
        printf("%s: kept %d tokens, the cpu %d: %s within rounding (tolerated, %d so far)\n", what,
               n_gpu, n_cpu, near_p ? "top-p running sum" : "min-p", f->flips);
        rtol += 2.0 * flipped / kept; /* normalisation moved by the flipped mass */
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        const int v = order[r];
        if (r >= n_cpu || r >= n_gpu)
            continue; /* flipped ranks were judged above; subnormal tails pass the atol */
        const double diff = fabs((double)gpu[v] - (double)cpu[v]);
        if (!(diff <= ADJ_ATOL + rtol * (double)cpu[v])) {
            if (bad < 5)
                fprintf(stderr, "%s: probs[%d] (rank %d): gpu %.9g cpu %.9g (|diff| %.3g)\n", what,
                        v, r, (double)gpu[v], (double)cpu[v], diff);
            bad++;
        }
    }
    return bad > 0;
}

/* Every case on one logits row, batched (row c = case c), against the CPU;
 * then the same launch with the rows in reverse order and case `alone` in a
 * launch of its own must give the same bits. */
static void check_adjust_batch(struct fixture *f, const float *x, int n, const char *kind)
{
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    const int R = N_ADJUST_CASES;
    const size_t row_bytes = (size_t)n * sizeof(float);
    float *rows = xmalloc((size_t)R * row_bytes), *got = xmalloc((size_t)R * row_bytes),
          *again = xmalloc((size_t)R * row_bytes), *cpu = xmalloc(row_bytes);
    struct kern_cuda_sample_params kp[N_ADJUST_CASES], kp_rev[N_ADJUST_CASES];
    for (int c = 0; c < R; c++) {
        memcpy(rows + (size_t)c * n, x, row_bytes);
        struct sampling_params p = adjust_case(c, n);
        kp[c] = kparams(&p);
        kp_rev[R - 1 - c] = kp[c];
    }
    float *d_x = dev_put(g, rows, (size_t)R * row_bytes);
    float *d_p = dev_alloc(g, (size_t)R * row_bytes);
    int32_t *d_st = dev_alloc(g, R * sizeof(int32_t));
    int32_t st[N_ADJUST_CASES];
    OK(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, n, kp, err));
    dev_get(g, got, d_p, (size_t)R * row_bytes);
    dev_get(g, st, d_st, sizeof(st));
    OK(kern_cuda_sample_status_check(st, R, "adjust", err));

    struct sampling_workspace *ws = NULL;
    OK(sampling_workspace_create(&ws, n, err));
    int *order = canonical_order(x, n);
    int bad = 0;
    for (int c = 0; c < R; c++) {
        struct sampling_params p = adjust_case(c, n);
        OK(sampling_adjust(ws, &p, x, n, cpu, err));
        char what[160];
        snprintf(what, sizeof what, "adjust vocab %d %s logits, T %g top_k %d top_p %g min_p %g",
                 n, kind, (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p);
        bad += compare_adjusted(f, what, &p, x, n, order, cpu, got + (size_t)c * n);
    }
    assert_int_equal(bad, 0);
    assert_true(f->flips <= FLIPS_MAX);

    /* Same bits in another batch composition and alone. */
    OK(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, n, kp_rev, err));
    dev_get(g, again, d_p, (size_t)R * row_bytes);
    for (int c = 0; c < R; c++)
        if (memcmp(again + (size_t)(R - 1 - c) * n, got + (size_t)c * n, row_bytes) != 0)
            fail_msg("adjust vocab %d %s case %d: bits differ with the rows reversed", n, kind, c);
    const int alone = 5;
    OK(kern_cuda_sampling_adjust(g, d_p, NULL, d_x, 1, n, &kp[alone], err));
    dev_get(g, again, d_p, row_bytes);
    if (memcmp(again, got + (size_t)alone * n, row_bytes) != 0)
        fail_msg("adjust vocab %d %s case %d: bits differ alone", n, kind, alone);

    free(order);
    sampling_workspace_destroy(ws);
    g->ops->free(g, d_x);
    g->ops->free(g, d_p);
    g->ops->free(g, d_st);
    free(rows);
    free(got);
    free(again);
    free(cpu);
}

static void test_cuda_adjust_matches_cpu(void **state)
{
    struct fixture *f = *state;
    const int vocabs[] = {1, 2, 12, 1000, 4099};
    for (int vi = 0; vi < 5; vi++) {
        const int n = vocabs[vi];
        float *x = xmalloc((size_t)n * sizeof(float));
        for (int kind = 0; kind < LOGITS_KINDS; kind++) {
            fill_logits(x, n, kind, 100u + (uint64_t)kind * 7u + (uint64_t)n);
            check_adjust_batch(f, x, n, logits_kind_name[kind]);
        }
        free(x);
    }
    printf("adjust: %d tolerated boundary differences\n", f->flips);
}

static void test_cuda_adjust_matches_cpu_at_llama3_vocab(void **state)
{
    struct fixture *f = *state;
    if (f->short_mode) {
        printf("short mode: vocab %d skipped\n", LLAMA3_VOCAB);
        return;
    }
    const int n = LLAMA3_VOCAB;
    const int kinds[] = {LOGITS_RANDOM, LOGITS_QUANTISED_MASKED, LOGITS_TWO_LEVEL, LOGITS_WIDE};
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int i = 0; i < 4; i++) {
        fill_logits(x, n, kinds[i], 77u + (uint64_t)i);
        check_adjust_batch(f, x, n, logits_kind_name[kinds[i]]);
    }
    free(x);
    printf("adjust at vocab %d: %d tolerated boundary differences in all\n", n, f->flips);
}

static void test_cuda_adjust_reports_bad_rows_and_params(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    enum { N = 6, R = 4 };
    const float rows[R][N] = {
        {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f},
        {0.0f, NAN, 2.0f, 3.0f, 4.0f, 5.0f},
        {0.0f, 1.0f, INFINITY, 3.0f, 4.0f, 5.0f},
        {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
    };
    struct sampling_params p = params(1.0f, 0, 0.9f, 0.0f);
    struct kern_cuda_sample_params kp[R] = {kparams(&p), kparams(&p), kparams(&p), kparams(&p)};
    float *d_x = dev_put(g, rows, sizeof(rows));
    float *d_p = dev_alloc(g, sizeof(rows));
    int32_t *d_st = dev_alloc(g, R * sizeof(int32_t));
    OK(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, N, kp, err));
    int32_t st[R];
    float got[R][N];
    dev_get(g, st, d_st, sizeof(st));
    dev_get(g, got, d_p, sizeof(got));
    assert_int_equal(st[0], KERN_CUDA_SAMPLE_OK);
    assert_int_equal(st[1], KERN_CUDA_SAMPLE_BAD_LOGIT);
    assert_int_equal(st[2], KERN_CUDA_SAMPLE_BAD_LOGIT);
    assert_int_equal(st[3], KERN_CUDA_SAMPLE_ALL_MASKED);
    struct sampling_workspace *ws = NULL;
    OK(sampling_workspace_create(&ws, N, err));
    float cpu[N];
    OK(sampling_adjust(ws, &p, rows[0], N, cpu, err));
    for (int v = 0; v < N; v++)
        assert_true(fabs(got[0][v] - cpu[v]) <= ADJ_RTOL * cpu[v] + ADJ_ATOL);
    for (int r = 1; r < R; r++) {
        assert_int_equal(sampling_adjust(ws, &p, rows[r], N, cpu, NULL), ERR_INVALID_ARG);
        for (int v = 0; v < N; v++)
            assert_true(got[r][v] == 0.0f);
    }
    assert_int_equal(kern_cuda_sample_status_check(st, R, "logits", err), ERR_INVALID_ARG);
    printf("expected: %s\n", err);
    assert_non_null(strstr(err, "logits[1]"));

    /* Sampling a bad row gives token -1 and the status; good rows sample. */
    int32_t *d_tok = dev_alloc(g, R * sizeof(int32_t));
    const uint64_t pos[R] = {3, 3, 3, 3};
    OK(kern_cuda_sample(g, d_tok, d_st, d_p, d_x, R, N, kp, pos, PHILOX_STREAM_TARGET_SAMPLE, err));
    int32_t tok[R];
    dev_get(g, tok, d_tok, sizeof(tok));
    dev_get(g, st, d_st, sizeof(st));
    int32_t want;
    OK(sampling_sample(ws, &p, rows[0], N, PHILOX_STREAM_TARGET_SAMPLE, 3, cpu, &want, err));
    assert_int_equal(tok[0], want);
    assert_int_equal(st[0], KERN_CUDA_SAMPLE_OK);
    assert_true(tok[1] == -1 && tok[2] == -1 && tok[3] == -1);
    assert_int_equal(st[3], KERN_CUDA_SAMPLE_ALL_MASKED);

    /* Parameters are checked on the host, named. */
    struct kern_cuda_sample_params badp[R];
    memcpy(badp, kp, sizeof(badp));
    badp[2].top_p = 0.0f;
    assert_int_equal(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, N, badp, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "params[2].top_p"));
    memcpy(badp, kp, sizeof(badp));
    badp[1].temperature = -1.0f;
    assert_int_equal(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, N, badp, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "params[1].temperature"));
    memcpy(badp, kp, sizeof(badp));
    badp[3].min_p = NAN;
    assert_int_equal(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, N, badp, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "params[3].min_p"));
    memcpy(badp, kp, sizeof(badp));
    badp[0].top_k = -1;
    assert_int_equal(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, N, badp, err),
                     ERR_INVALID_ARG);
    assert_int_equal(kern_cuda_sampling_adjust(g, d_x, d_st, d_x, R, N, kp, err),
                     ERR_INVALID_ARG); /* aliasing */
    assert_int_equal(kern_cuda_sampling_adjust(g, d_p, d_st, d_x, R, 0, kp, err),
                     ERR_INVALID_ARG);
    sampling_workspace_destroy(ws);
    g->ops->free(g, d_x);
    g->ops->free(g, d_p);
    g->ops->free(g, d_st);
    g->ops->free(g, d_tok);
}

/* ---- draws -------------------------------------------------------------------- */

/* Draws from rows [R, n] (host) at positions pos0 .. pos0 + calls - 1 with
 * seeds 7 + r, through kern_cuda_draw, against sampling_draw. */
static void check_draws(struct fixture *f, const float *rows, int R, int n, int calls,
                        const char *what)
{
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    float *d_rows = dev_put(g, rows, (size_t)R * n * sizeof(float));
    int32_t *d_tok = dev_alloc(g, (size_t)R * sizeof(int32_t));
    uint64_t *seeds = xmalloc((size_t)R * sizeof(uint64_t));
    uint64_t *pos = xmalloc((size_t)R * sizeof(uint64_t));
    int32_t *tok = xmalloc((size_t)R * sizeof(int32_t));
    int bad = 0;
    for (int c = 0; c < calls; c++) {
        for (int r = 0; r < R; r++) {
            seeds[r] = 7u + (uint64_t)r;
            pos[r] = (uint64_t)c * 3u + (uint64_t)r;
        }
        OK(kern_cuda_draw(g, d_tok, d_rows, R, n, seeds, pos, PHILOX_STREAM_TARGET_SAMPLE, err));
        dev_get(g, tok, d_tok, (size_t)R * sizeof(int32_t));
        for (int r = 0; r < R; r++) {
            float u = philox_uniform(seeds[r], PHILOX_STREAM_TARGET_SAMPLE, pos[r], 0);
            int want = sampling_draw(rows + (size_t)r * n, n, u);
            if (tok[r] != want && bad++ < 5)
                fprintf(stderr, "%s: row %d position %llu (u %.9g): device %d, cpu %d\n", what, r,
                        (unsigned long long)pos[r], (double)u, (int)tok[r], want);
        }
    }
    printf("%s: %d draws, %d differ from sampling_draw\n", what, R * calls, bad);
    assert_int_equal(bad, 0);
    g->ops->free(g, d_rows);
    g->ops->free(g, d_tok);
    free(seeds);
    free(pos);
    free(tok);
}

static void test_cuda_draw_equals_cpu(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    /* test_sampling.c's hand rows, padded to 5 entries. */
    const float hand[8][5] = {
        {0.0f, 0.25f, 0.0f, 0.25f, 0.5f}, {2.0f, 0.0f, 6.0f, 0.0f, 0.0f},
        {0.3f, 0.7f, 0.0f, 0.0f, 0.0f},   {1.0f, 1e-30f, 0.0f, -1.0f, 0.0f},
        {NAN, 0.0f, 1.0f, 0.0f, 0.0f},     {0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
        {0.0f, 0.0f, 0.0f, 0.0f, 1.0f},    {0.2f, 0.2f, 0.2f, 0.2f, 0.2f},
    };
    check_draws(f, &hand[0][0], 8, 5, 400, "draw hand rows");

    /* CPU-adjusted rows uploaded bit for bit. */
    const int vocabs[] = {12, 1000, 4099, LLAMA3_VOCAB};
    const int n_vocabs = f->short_mode ? 3 : 4;
    for (int vi = 0; vi < n_vocabs; vi++) {
        const int n = vocabs[vi];
        enum { R = 6 };
        const struct sampling_params ps[R] = {
            params(1.0f, 0, 1.0f, 0.0f),  params(0.7f, 40, 1.0f, 0.0f),
            params(1.0f, 0, 0.9f, 0.0f),  params(5.0f, 0, 1.0f, 0.0f),
            params(0.8f, 0, 1.0f, 0.05f), params(1e6f, 0, 1.0f, 0.0f),
        };
        float *x = xmalloc((size_t)n * sizeof(float));
        float *rows = xmalloc((size_t)R * n * sizeof(float));
        struct sampling_workspace *ws = NULL;
        OK(sampling_workspace_create(&ws, n, err));
        for (int r = 0; r < R; r++) {
            fill_logits(x, n, r % 2 ? LOGITS_QUANTISED_MASKED : LOGITS_RANDOM, 300u + (uint64_t)r);
            OK(sampling_adjust(ws, &ps[r], x, n, rows + (size_t)r * n, err));
        }
        char what[64];
        snprintf(what, sizeof what, "draw vocab %d", n);
        check_draws(f, rows, R, n, n > 5000 ? 40 : 300, what);
        sampling_workspace_destroy(ws);
        free(x);
        free(rows);
    }
}

/* kern_cuda_sample (adjust + draw in one launch) against sampling_sample. */
static void test_cuda_sample_equals_cpu(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    const int vocabs[] = {12, 1000, LLAMA3_VOCAB};
    const int n_vocabs = f->short_mode ? 2 : 3;
    int draws = 0, differ = 0, rows_equal = 0, rows_total = 0;
    for (int vi = 0; vi < n_vocabs; vi++) {
        const int n = vocabs[vi];
        const int R = N_ADJUST_CASES;
        const int calls = n > 5000 ? 8 : 40;
        float *x = xmalloc((size_t)R * n * sizeof(float));
        float *got = xmalloc((size_t)R * n * sizeof(float));
        float *cpu = xmalloc((size_t)n * sizeof(float));
        struct kern_cuda_sample_params kp[N_ADJUST_CASES];
        for (int c = 0; c < R; c++) {
            fill_logits(x + (size_t)c * n, n, c % LOGITS_KINDS, 500u + (uint64_t)c);
            struct sampling_params p = adjust_case(c, n);
            kp[c] = kparams(&p);
        }
        float *d_x = dev_put(g, x, (size_t)R * n * sizeof(float));
        float *d_p = dev_alloc(g, (size_t)R * n * sizeof(float));
        int32_t *d_tok = dev_alloc(g, (size_t)R * sizeof(int32_t));
        int32_t *d_st = dev_alloc(g, (size_t)R * sizeof(int32_t));
        struct sampling_workspace *ws = NULL;
        OK(sampling_workspace_create(&ws, n, err));
        uint64_t pos[N_ADJUST_CASES];
        int32_t tok[N_ADJUST_CASES], st[N_ADJUST_CASES];
        for (int call = 0; call < calls; call++) {
            for (int c = 0; c < R; c++)
                pos[c] = 1000u * (uint64_t)call + (uint64_t)c;
            OK(kern_cuda_sample(g, d_tok, d_st, d_p, d_x, R, n, kp, pos,
                                PHILOX_STREAM_TARGET_SAMPLE, err));
            dev_get(g, tok, d_tok, sizeof(int32_t) * (size_t)R);
            dev_get(g, st, d_st, sizeof(int32_t) * (size_t)R);
            dev_get(g, got, d_p, (size_t)R * n * sizeof(float));
            OK(kern_cuda_sample_status_check(st, R, "sample", err));
            for (int c = 0; c < R; c++) {
                struct sampling_params p = adjust_case(c, n);
                const float *grow = got + (size_t)c * n;
                int32_t want;
                OK(sampling_sample(ws, &p, x + (size_t)c * n, n, PHILOX_STREAM_TARGET_SAMPLE,
                                   pos[c], cpu, &want, err));
                const float u = philox_uniform(p.seed, PHILOX_STREAM_TARGET_SAMPLE, pos[c], 0);
                /* The device follows the CPU's rule on its own row. */
                const int own = p.temperature == 0.0f ? argmax_f32(grow, n)
                                                      : sampling_draw(grow, n, u);
                if (tok[c] != own)
                    fail_msg("sample vocab %d case %d position %llu: device token %d, "
                             "sampling_draw of the device's row %d", n, c,
                             (unsigned long long)pos[c], (int)tok[c], own);
                const int same_row = memcmp(grow, cpu, (size_t)n * sizeof(float)) == 0;
                rows_equal += same_row;
                rows_total++;
                draws++;
                if (tok[c] != want) {
                    if (same_row)
                        fail_msg("sample vocab %d case %d: rows bitwise equal, tokens %d vs %d",
                                 n, c, (int)tok[c], (int)want);
                    differ++;
                    printf("sample vocab %d case %d position %llu: device %d, cpu %d (rows "
                           "differ within tolerance)\n", n, c, (unsigned long long)pos[c],
                           (int)tok[c], (int)want);
                }
            }
        }
        sampling_workspace_destroy(ws);
        g->ops->free(g, d_x);
        g->ops->free(g, d_p);
        g->ops->free(g, d_tok);
        g->ops->free(g, d_st);
        free(x);
        free(got);
        free(cpu);
    }
    printf("sample: %d draws, %d of %d rows bitwise equal to the cpu's, %d tokens differ\n", draws,
           rows_equal, rows_total, differ);
    assert_true(differ <= FLIPS_MAX);
}

/* ---- accept/reject: goodness of fit ------------------------------------------ */

/* The rows of tests/unit/test_speculate.c. */
enum { GV = 12, GK_MAX = 3 };
static const float p_base[GV] = {0.10f, 0.00f, 0.25f, 0.05f, 0.00f, 0.15f,
                                 0.10f, 0.05f, 0.20f, 0.00f, 0.06f, 0.04f};
static const float q_base[GV] = {0.20f, 0.10f, 0.05f, 0.00f, 0.15f, 0.15f,
                                 0.05f, 0.00f, 0.10f, 0.10f, 0.10f, 0.00f};

static void make_rows(float p_rows[GK_MAX + 1][GV], float q_rows[GK_MAX][GV])
{
    for (int i = 0; i <= GK_MAX; i++)
        for (int v = 0; v < GV; v++) {
            p_rows[i][v] = p_base[(v + 3 * i) % GV];
            if (i < GK_MAX)
                q_rows[i][v] = q_base[(v + 5 * i) % GV];
        }
}

#define GOF_ALPHA 1e-4
#define GOF_MIN_EXPECTED 5.0
#define GOF_TRIALS 40000
#define GOF_TRIALS_SHORT 500

struct gof_result {
    double stat[GK_MAX + 1];
    double crit[GK_MAX + 1];
    int df[GK_MAX + 1];
    uint64_t n[GK_MAX + 1];
    int trials;
};

/* test_speculate.c's run_gof with the device doing every round (one launch
 * of `trials` sequences), each round also checked against speculate_verify. */
static void run_gof_gpu(struct fixture *f, int k, enum speculate_mode mode,
                        enum speculate_debug_fault fault, uint64_t seed, struct gof_result *res)
{
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    const int trials = f->short_mode ? GOF_TRIALS_SHORT : GOF_TRIALS;
    float p_rows[GK_MAX + 1][GV], q_rows[GK_MAX][GV], scratch[GV];
    make_rows(p_rows, q_rows);
    int32_t *draft = xmalloc((size_t)trials * GK_MAX * sizeof(int32_t));
    struct kern_cuda_spec_seq *seqs = xmalloc((size_t)trials * sizeof(*seqs));
    struct kern_cuda_spec_result *out = xmalloc((size_t)trials * sizeof(*out));
    for (int r = 0; r < trials; r++) {
        const uint64_t pos0 = 64u * (uint64_t)r;
        for (int i = 0; i < k; i++) {
            int32_t *t = &draft[r * GK_MAX + i];
            if (mode == SPECULATE_MODE_SAMPLED)
                *t = sampling_draw(q_rows[i], GV,
                                   philox_uniform(seed, PHILOX_STREAM_DRAFT_SAMPLE,
                                                  pos0 + (uint64_t)i, 0));
            else
                *t = argmax_f32(q_rows[i], GV);
            assert_true(*t >= 0);
        }
        seqs[r] = (struct kern_cuda_spec_seq){.k = k, .greedy = 0, .mode = (int32_t)mode,
                                              .debug_fault = (int32_t)fault, .seed = seed,
                                              .position0 = pos0, .p_row0 = 0, .q_row0 = 0,
                                              .draft0 = r * GK_MAX};
    }
    float *d_p = dev_put(g, p_rows, sizeof(p_rows));
    float *d_q = dev_put(g, q_rows, sizeof(q_rows));
    int32_t *d_draft = dev_put(g, draft, (size_t)trials * GK_MAX * sizeof(int32_t));
    struct kern_cuda_spec_result *d_out = dev_alloc(g, (size_t)trials * sizeof(*out));
    OK(kern_cuda_speculate_verify(g, d_out, seqs, trials, d_p,
                                  mode == SPECULATE_MODE_SAMPLED ? d_q : NULL, d_draft, GV, err));
    dev_get(g, out, d_out, (size_t)trials * sizeof(*out));

    uint64_t counts[GK_MAX + 1][GV];
    memset(counts, 0, sizeof counts);
    memset(res, 0, sizeof *res);
    res->trials = trials;
    for (int r = 0; r < trials; r++) {
        struct speculate_input in = {
            .k = k, .vocab = GV, .draft_tokens = &draft[r * GK_MAX],
            .q_rows = mode == SPECULATE_MODE_SAMPLED ? &q_rows[0][0] : NULL,
            .p_rows = &p_rows[0][0], .greedy = 0, .mode = mode, .seed = seed,
            .position0 = seqs[r].position0, .debug_fault = fault,
        };
        int32_t want[GK_MAX + 1];
        int n_want = -1;
        OK(speculate_verify(&in, scratch, want, &n_want, err));
        const struct kern_cuda_spec_result *o = &out[r];
        if (o->status != KERN_CUDA_SAMPLE_OK || o->n_accepted != n_want ||
            memcmp(o->tokens, want, (size_t)(n_want + 1) * sizeof(int32_t)) != 0)
            fail_msg("round %d (k %d mode %d fault %d): device n %d status %d first %d, cpu n %d "
                     "first %d", r, k, (int)mode, (int)fault, (int)o->n_accepted, (int)o->status,
                     (int)o->tokens[0], n_want, (int)want[0]);
        for (int j = 0; j <= o->n_accepted; j++) {
            assert_true(o->tokens[j] >= 0 && o->tokens[j] < GV);
            counts[j][o->tokens[j]]++;
            res->n[j]++;
        }
    }
    for (int j = 0; j <= k; j++) {
        double expected[GV];
        for (int v = 0; v < GV; v++)
            expected[v] = (double)res->n[j] * p_rows[j][v];
        res->stat[j] = chi_square_statistic(counts[j], expected, GV, GOF_MIN_EXPECTED, &res->df[j]);
        res->crit[j] = res->df[j] >= 1 ? chi_square_critical(res->df[j], GOF_ALPHA) : 0.0;
    }
    g->ops->free(g, d_p);
    g->ops->free(g, d_q);
    g->ops->free(g, d_draft);
    g->ops->free(g, d_out);
    free(draft);
    free(seqs);
    free(out);
}

static void print_gof(const char *name, int k, const struct gof_result *res)
{
    for (int j = 0; j <= k; j++)
        printf("device %s: slot %d: n %llu, chi-square %.2f, df %d, critical(%g) %.2f\n", name, j,
               (unsigned long long)res->n[j], res->stat[j], res->df[j], GOF_ALPHA, res->crit[j]);
}

/* test_speculate.c's verdict: slots with >= 2000 samples pass, df >= 4. */
static void assert_gof_passes(struct fixture *f, const char *name, int k,
                              const struct gof_result *res)
{
    print_gof(name, k, res);
    assert_true(res->n[0] == (uint64_t)res->trials);
    if (f->short_mode) {
        printf("short mode: chi-square verdict not asserted (%d rounds)\n", res->trials);
        return;
    }
    if (k >= 2)
        assert_true(res->n[1] >= 2000);
    for (int j = 0; j <= k; j++) {
        if (res->n[j] < 2000)
            continue;
        assert_true(res->df[j] >= 4);
        assert_true(res->stat[j] <= res->crit[j]);
    }
}

static void test_cuda_speculate_sampled_emits_target_distribution(void **state)
{
    struct fixture *f = *state;
    if (f->fewest)
        skip();
    struct gof_result res;
    run_gof_gpu(f, 1, SPECULATE_MODE_SAMPLED, SPECULATE_DEBUG_NONE, 1001, &res);
    assert_gof_passes(f, "sampled K=1", 1, &res);
    run_gof_gpu(f, 3, SPECULATE_MODE_SAMPLED, SPECULATE_DEBUG_NONE, 1003, &res);
    assert_gof_passes(f, "sampled K=3", 3, &res);
}

static void test_cuda_speculate_point_mass_emits_target_distribution(void **state)
{
    struct fixture *f = *state;
    if (f->fewest)
        skip();
    struct gof_result res;
    run_gof_gpu(f, 1, SPECULATE_MODE_POINT_MASS, SPECULATE_DEBUG_NONE, 2001, &res);
    assert_gof_passes(f, "point-mass K=1", 1, &res);
    run_gof_gpu(f, 3, SPECULATE_MODE_POINT_MASS, SPECULATE_DEBUG_NONE, 2003, &res);
    assert_gof_passes(f, "point-mass K=3", 3, &res);
}

/* The broken variant (correction from p, not the residual) on the device:
 * the same test, sample size and alpha must reject it. */
static void test_cuda_speculate_broken_residual_fails_chi_square(void **state)
{
    struct fixture *f = *state;
    if (f->fewest)
        skip();
    const struct {
        const char *name;
        int k;
        enum speculate_mode mode;
        uint64_t seed;
    } cases[] = {
        {"sampled K=1", 1, SPECULATE_MODE_SAMPLED, 1001},
        {"sampled K=3", 3, SPECULATE_MODE_SAMPLED, 1003},
        {"point-mass K=1", 1, SPECULATE_MODE_POINT_MASS, 2001},
        {"point-mass K=3", 3, SPECULATE_MODE_POINT_MASS, 2003},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct gof_result good, broken;
        run_gof_gpu(f, cases[c].k, cases[c].mode, SPECULATE_DEBUG_NONE, cases[c].seed, &good);
        run_gof_gpu(f, cases[c].k, cases[c].mode, SPECULATE_DEBUG_RESIDUAL_FROM_P, cases[c].seed,
                    &broken);
        printf("device %s first token: correct chi-square %.2f, broken %.2f (df %d, critical "
               "%.2f)\n", cases[c].name, good.stat[0], broken.stat[0], broken.df[0],
               broken.crit[0]);
        if (f->short_mode)
            continue;
        assert_true(good.stat[0] <= good.crit[0]);
        assert_true(broken.df[0] >= 1);
        assert_true(broken.stat[0] > broken.crit[0]);
    }
}

/* ---- accept/reject on random rows, one launch for a mixed batch --------------- */

/* n_seqs sequences of k = s % 17 over vocab n: a third greedy (rows are raw
 * logits with ties and the odd NaN), a third sampled, a third point mass
 * (rows adjusted by the CPU from random logits). Rows and drafts sit at
 * shuffled offsets. Every result equals speculate_verify's. */
static void check_verify_random(struct fixture *f, int n, int n_seqs, uint64_t seed)
{
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {seed};
    struct kern_cuda_spec_seq *seqs = xmalloc((size_t)n_seqs * sizeof(*seqs));
    int total_p = 0, total_q = 0, total_d = 0;
    for (int s = 0; s < n_seqs; s++) {
        const int k = s % (KERN_CUDA_SPEC_K_MAX + 1);
        const int kind = s % 3;
        seqs[s] = (struct kern_cuda_spec_seq){
            .k = k, .greedy = kind == 0,
            .mode = kind == 2 ? KERN_CUDA_SPEC_MODE_POINT_MASS : KERN_CUDA_SPEC_MODE_SAMPLED,
            .seed = rng_next(&r), .position0 = rng_next(&r) >> 20};
        total_p += k + 1;
        total_q += k;
        total_d += k;
    }
    /* Row blocks in reverse sequence order; drafts in order. */
    int at_p = total_p, at_q = total_q, at_d = 0;
    for (int s = 0; s < n_seqs; s++) {
        at_p -= seqs[s].k + 1;
        at_q -= seqs[s].k;
        seqs[s].p_row0 = at_p;
        seqs[s].q_row0 = at_q;
        seqs[s].draft0 = at_d;
        at_d += seqs[s].k;
    }
    float *p_rows = xmalloc((size_t)total_p * n * sizeof(float));
    float *q_rows = xmalloc(((size_t)total_q + 1) * n * sizeof(float));
    int32_t *drafts = xmalloc(((size_t)total_d + 1) * sizeof(int32_t));
    float *x = xmalloc((size_t)n * sizeof(float)), *scratch = xmalloc((size_t)n * sizeof(float));
    struct sampling_workspace *ws = NULL;
    OK(sampling_workspace_create(&ws, n, err));
    for (int s = 0; s < n_seqs; s++) {
        const struct kern_cuda_spec_seq *q = &seqs[s];
        const struct sampling_params pp = params(0.6f + 0.1f * (float)(s % 7), s % 4 ? 0 : 50,
                                                 s % 5 ? 1.0f : 0.9f, 0.0f);
        for (int i = 0; i <= q->k; i++) {
            float *prow = p_rows + ((size_t)q->p_row0 + (size_t)i) * n;
            fill_logits(x, n, (s + i) % 2 ? LOGITS_QUANTISED : LOGITS_RANDOM, rng_next(&r));
            if (q->greedy) {
                memcpy(prow, x, (size_t)n * sizeof(float));
                if ((s + i) % 5 == 0)
                    prow[(size_t)(rng_next(&r) % (uint64_t)n)] = NAN;
            } else {
                OK(sampling_adjust(ws, &pp, x, n, prow, err));
            }
            if (i == q->k)
                break;
            float *qrow = q_rows + ((size_t)q->q_row0 + (size_t)i) * n;
            /* The draft's row: mostly the target's logits, perturbed. */
            for (int v = 0; v < n; v++)
                x[v] += (float)(0.5 * rng_unit(&r));
            OK(sampling_adjust(ws, &pp, x, n, qrow, err));
            int32_t *t = &drafts[q->draft0 + i];
            const double u = rng_unit(&r);
            if (q->greedy)
                *t = u < 0.8 ? argmax_f32(prow, n) : (int32_t)(rng_next(&r) % (uint64_t)n);
            else if (q->mode == KERN_CUDA_SPEC_MODE_POINT_MASS)
                *t = argmax_f32(qrow, n);
            else
                *t = sampling_draw(qrow, n, philox_uniform(q->seed, PHILOX_STREAM_DRAFT_SAMPLE,
                                                           q->position0 + (uint64_t)i, 0));
            if (*t < 0)
                *t = 0;
        }
    }
    float *d_p = dev_put(g, p_rows, (size_t)total_p * n * sizeof(float));
    float *d_q = dev_put(g, q_rows, ((size_t)total_q + 1) * n * sizeof(float));
    int32_t *d_d = dev_put(g, drafts, ((size_t)total_d + 1) * sizeof(int32_t));
    struct kern_cuda_spec_result *d_out = dev_alloc(g, (size_t)n_seqs * sizeof(*d_out));
    struct kern_cuda_spec_result *out = xmalloc((size_t)n_seqs * sizeof(*out));
    OK(kern_cuda_speculate_verify(g, d_out, seqs, n_seqs, d_p, d_q, d_d, n, err));
    dev_get(g, out, d_out, (size_t)n_seqs * sizeof(*out));
    int accepted = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct kern_cuda_spec_seq *q = &seqs[s];
        struct speculate_input in = {
            .k = q->k, .vocab = n, .draft_tokens = drafts + q->draft0,
            .q_rows = q_rows + (size_t)q->q_row0 * n, .p_rows = p_rows + (size_t)q->p_row0 * n,
            .greedy = q->greedy, .mode = (enum speculate_mode)q->mode, .seed = q->seed,
            .position0 = q->position0,
        };
        int32_t want[KERN_CUDA_SPEC_K_MAX + 1];
        int n_want = -1;
        int rc = speculate_verify(&in, scratch, want, &n_want, err);
        const struct kern_cuda_spec_result *o = &out[s];
        if (rc != 0) { /* a greedy row of NaN cannot happen here; report if it does */
            fail_msg("cpu speculate_verify seq %d: %s", s, err);
        }
        if (o->status != KERN_CUDA_SAMPLE_OK || o->n_accepted != n_want ||
            memcmp(o->tokens, want, (size_t)(n_want + 1) * sizeof(int32_t)) != 0) {
            fprintf(stderr, "seq %d (vocab %d k %d greedy %d mode %d): device n %d status %d "
                    "tokens", s, n, q->k, q->greedy, q->mode, (int)o->n_accepted, (int)o->status);
            for (int j = 0; j <= o->n_accepted && j <= q->k; j++)
                fprintf(stderr, " %d", (int)o->tokens[j]);
            fprintf(stderr, "; cpu n %d tokens", n_want);
            for (int j = 0; j <= n_want; j++)
                fprintf(stderr, " %d", (int)want[j]);
            fprintf(stderr, "\n");
            fail_msg("verify on random rows differs from the cpu (seq %d)", s);
        }
        accepted += n_want;
    }
    printf("verify vocab %d: %d sequences (k 0..%d, greedy/sampled/point-mass) equal to "
           "speculate_verify, %d drafts accepted\n", n, n_seqs, KERN_CUDA_SPEC_K_MAX, accepted);
    sampling_workspace_destroy(ws);
    g->ops->free(g, d_p);
    g->ops->free(g, d_q);
    g->ops->free(g, d_d);
    g->ops->free(g, d_out);
    free(seqs);
    free(p_rows);
    free(q_rows);
    free(drafts);
    free(x);
    free(scratch);
    free(out);
}

static void test_cuda_speculate_random_rows_equal_cpu(void **state)
{
    struct fixture *f = *state;
    check_verify_random(f, 1000, f->short_mode ? 51 : 255, 31);
    check_verify_random(f, 7, 51, 32);
    if (!f->short_mode)
        check_verify_random(f, LLAMA3_VOCAB, 34, 33);
}

/* ---- degenerate rows, statuses, argument checks ------------------------------- */

/* One sequence through the device, compared with speculate_verify (which
 * must succeed), returning the device result. */
static struct kern_cuda_spec_result verify_one(struct fixture *f, const struct speculate_input *in)
{
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    const int n = in->vocab, k = in->k;
    float *d_p = dev_put(g, in->p_rows, (size_t)(k + 1) * n * sizeof(float));
    float *d_q = in->q_rows ? dev_put(g, in->q_rows, (size_t)(k > 0 ? k : 1) * n * sizeof(float))
                            : NULL;
    int32_t *d_d = k > 0 ? dev_put(g, in->draft_tokens, (size_t)k * sizeof(int32_t)) : NULL;
    struct kern_cuda_spec_result *d_out = dev_alloc(g, sizeof(struct kern_cuda_spec_result));
    struct kern_cuda_spec_seq seq = {.k = k, .greedy = in->greedy, .mode = (int32_t)in->mode,
                                     .seed = in->seed, .position0 = in->position0};
    OK(kern_cuda_speculate_verify(g, d_out, &seq, 1, d_p, d_q, d_d, n, err));
    struct kern_cuda_spec_result o;
    dev_get(g, &o, d_out, sizeof o);
    g->ops->free(g, d_p);
    if (d_q)
        g->ops->free(g, d_q);
    if (d_d)
        g->ops->free(g, d_d);
    g->ops->free(g, d_out);
    return o;
}

static void expect_same_as_cpu(struct fixture *f, const struct speculate_input *in)
{
    char err[ERR_MSG_MAX] = "";
    float scratch[16];
    int32_t want[KERN_CUDA_SPEC_K_MAX + 1];
    int n_want = -1;
    assert_true(in->vocab <= 16);
    OK(speculate_verify(in, scratch, want, &n_want, err));
    struct kern_cuda_spec_result o = verify_one(f, in);
    assert_int_equal(o.status, KERN_CUDA_SAMPLE_OK);
    assert_int_equal(o.n_accepted, n_want);
    for (int j = 0; j <= n_want; j++)
        assert_int_equal(o.tokens[j], want[j]);
}

/* test_speculate.c's hand cases, each at many positions. */
static void test_cuda_speculate_degenerate_rows_equal_cpu(void **state)
{
    struct fixture *f = *state;
    const float q0[3] = {0.1f, 0.6f, 0.3f};
    const float p0[2][3] = {{0.4f, 0.3f, 0.3f}, {0.0f, 0.0f, 1.0f}};
    const float q1[2] = {0.5f, 0.5f};
    const float p1[2][2] = {{0.0f, 1.0f}, {1.0f, 0.0f}};
    const float q2[2] = {0.0f, 1.0f};
    const float p2[2][2] = {{0.01f, 0.99f}, {0.0f, 1.0f}};
    const float q3[3] = {0.5f, 0.5f, 0.0f};
    const float p3[2][3] = {{0.0f, 0.5f, 0.0f}, {0.0f, 0.0f, 1.0f}};
    const float p4[2][3] = {{0.0f, 1.0f, 0.0f}, {0.25f, 0.25f, 0.5f}};
    const float p5[2][3] = {{0.3f, 0.7f, 0.0f}, {1.0f, 0.0f, 0.0f}};
    const int32_t t0[1] = {0}, t1[1] = {1};
    const int positions = f->short_mode ? 20 : 200;
    int accepted = 0;
    for (uint64_t pos = 0; pos < (uint64_t)positions; pos++) {
        struct speculate_input in = {.k = 1, .vocab = 3, .draft_tokens = t1, .q_rows = q0,
                                     .p_rows = &p0[0][0], .seed = 99, .position0 = pos};
        expect_same_as_cpu(f, &in);
        struct kern_cuda_spec_result o = verify_one(f, &in);
        accepted += o.n_accepted;
        struct speculate_input a = {.k = 1, .vocab = 2, .draft_tokens = t0, .q_rows = q1,
                                    .p_rows = &p1[0][0], .seed = 5, .position0 = pos};
        expect_same_as_cpu(f, &a); /* p(t) = 0: rejected */
        a.mode = SPECULATE_MODE_POINT_MASS;
        a.q_rows = NULL;
        expect_same_as_cpu(f, &a);
        struct speculate_input b = {.k = 1, .vocab = 2, .draft_tokens = t0, .q_rows = q2,
                                    .p_rows = &p2[0][0], .seed = 6, .position0 = pos};
        expect_same_as_cpu(f, &b); /* q(t) = 0 < p(t): accepted */
        struct speculate_input c = {.k = 1, .vocab = 3, .draft_tokens = t0, .q_rows = q3,
                                    .p_rows = &p3[0][0], .seed = 7, .position0 = pos};
        expect_same_as_cpu(f, &c); /* empty residual: from p */
        struct speculate_input d = {.k = 1, .vocab = 3, .draft_tokens = t1, .p_rows = &p4[0][0],
                                    .mode = SPECULATE_MODE_POINT_MASS, .seed = 8,
                                    .position0 = pos};
        expect_same_as_cpu(f, &d); /* p(t) = 1: accepted */
        struct speculate_input e = {.k = 1, .vocab = 3, .draft_tokens = t1, .p_rows = &p5[0][0],
                                    .mode = SPECULATE_MODE_POINT_MASS, .seed = 9,
                                    .position0 = pos};
        expect_same_as_cpu(f, &e); /* never re-emits t */
        struct speculate_input k0 = {.k = 0, .vocab = 3, .p_rows = &p0[1][0], .seed = 3,
                                     .position0 = pos};
        expect_same_as_cpu(f, &k0); /* k = 0: plain sampling of p_1 */
    }
    printf("degenerate rows: %d positions each, u < p/q accepted %d times\n", positions, accepted);
    assert_true(accepted > 0 && accepted < positions);
}

static void test_cuda_speculate_reports_statuses_and_bad_arguments(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    enum { N = 4 };
    const float p[3][N] = {
        {0.5f, 0.5f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}, {NAN, NAN, NAN, NAN}};
    const float q[2][N] = {{0.25f, 0.25f, 0.25f, 0.25f}, {0.25f, 0.25f, 0.25f, 0.25f}};
    const int32_t drafts[4] = {0, 9, 1, 0};
    float *d_p = dev_put(g, p, sizeof p);
    float *d_q = dev_put(g, q, sizeof q);
    int32_t *d_d = dev_put(g, drafts, sizeof drafts);
    enum { S = 5 };
    struct kern_cuda_spec_seq seqs[S] = {
        {.k = 2, .draft0 = 0, .p_row0 = 0},                         /* draft 9: bad (sampled) */
        {.k = 2, .greedy = 1, .draft0 = 0, .p_row0 = 0},            /* draft 9: bad (greedy) */
        {.k = 0, .p_row0 = 1},                                      /* bonus row without mass */
        {.k = 0, .greedy = 1, .p_row0 = 2},                         /* greedy row of NaN */
        {.k = 1, .greedy = 1, .draft0 = 3, .p_row0 = 0, .mode = 1}, /* fine: accepts 0 */
    };
    struct kern_cuda_spec_result *d_out = dev_alloc(g, S * sizeof(struct kern_cuda_spec_result));
    OK(kern_cuda_speculate_verify(g, d_out, seqs, S, d_p, d_q, d_d, N, err));
    struct kern_cuda_spec_result o[S];
    dev_get(g, o, d_out, sizeof o);
    assert_int_equal(o[0].status, KERN_CUDA_SAMPLE_BAD_DRAFT);
    assert_int_equal(o[1].status, KERN_CUDA_SAMPLE_BAD_DRAFT);
    assert_int_equal(o[2].status, KERN_CUDA_SAMPLE_NO_MASS);
    assert_int_equal(o[3].status, KERN_CUDA_SAMPLE_NO_MASS);
    assert_int_equal(o[4].status, KERN_CUDA_SAMPLE_OK);
    assert_int_equal(o[4].n_accepted, 1);
    assert_int_equal(o[4].tokens[0], 0);
    printf("statuses: %s / %s\n", kern_cuda_sample_status_str(o[0].status),
           kern_cuda_sample_status_str(o[2].status));

    /* Host-side checks name the descriptor. */
    struct kern_cuda_spec_seq bad = {.k = KERN_CUDA_SPEC_K_MAX + 1};
    assert_int_equal(kern_cuda_speculate_verify(g, d_out, &bad, 1, d_p, d_q, d_d, N, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "seqs[0].k"));
    bad = (struct kern_cuda_spec_seq){.k = 1, .mode = 7};
    assert_int_equal(kern_cuda_speculate_verify(g, d_out, &bad, 1, d_p, d_q, d_d, N, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "mode"));
    bad = (struct kern_cuda_spec_seq){.k = 1};
    assert_int_equal(kern_cuda_speculate_verify(g, d_out, &bad, 1, d_p, NULL, d_d, N, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "q_rows"));
    assert_int_equal(kern_cuda_speculate_verify(g, d_out, &bad, 1, d_p, d_q, NULL, N, err),
                     ERR_INVALID_ARG);
    assert_int_equal(kern_cuda_speculate_verify(g, d_out, &bad, 1, d_p, d_q, d_d, 0, err),
                     ERR_INVALID_ARG);
    assert_int_equal(kern_cuda_speculate_verify(g, d_out, &bad, 0, d_p, d_q, d_d, N, err), 0);
    g->ops->free(g, d_p);
    g->ops->free(g, d_q);
    g->ops->free(g, d_d);
    g->ops->free(g, d_out);
}

/* ---- timing (printed, not asserted) ---------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void test_cuda_sampling_timing_at_llama3_vocab(void **state)
{
    struct fixture *f = *state;
    if (f->fewest)
        skip();
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    if (f->short_mode) {
        printf("short mode: timing skipped\n");
        return;
    }
    const int n = LLAMA3_VOCAB, rmax = 17;
    float *x = xmalloc((size_t)rmax * n * sizeof(float));
    float *probs = xmalloc((size_t)n * sizeof(float));
    for (int r = 0; r < rmax; r++)
        fill_logits(x + (size_t)r * n, n, LOGITS_RANDOM, 900u + (uint64_t)r);
    float *d_x = dev_put(g, x, (size_t)rmax * n * sizeof(float));
    float *d_p = dev_alloc(g, (size_t)rmax * n * sizeof(float));
    int32_t *d_tok = dev_alloc(g, (size_t)rmax * sizeof(int32_t));
    struct sampling_workspace *ws = NULL;
    OK(sampling_workspace_create(&ws, n, err));
    const struct sampling_params modes[] = {
        params(0.0f, 0, 1.0f, 0.0f), params(1.0f, 0, 1.0f, 0.0f),  params(0.7f, 50, 1.0f, 0.0f),
        params(0.7f, 0, 0.9f, 0.0f), params(0.7f, 50, 0.9f, 0.0f), params(1.0f, 0, 1.0f, 0.05f),
    };
    const int rows[2] = {1, rmax};
    printf("sampling time at vocab %d (kern_cuda_sample, launch to tokens on the host, vs "
           "sampling_sample per row on one CPU thread):\n", n);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
        for (int ri = 0; ri < 2; ri++) {
            const int R = rows[ri];
            struct kern_cuda_sample_params kp[17];
            uint64_t pos[17];
            int32_t tok[17];
            for (int r = 0; r < R; r++) {
                kp[r] = kparams(&modes[m]);
                pos[r] = (uint64_t)r;
            }
            const int reps = 20;
            OK(kern_cuda_sample(g, d_tok, NULL, d_p, d_x, R, n, kp, pos, 1, err)); /* warm up */
            dev_get(g, tok, d_tok, (size_t)R * sizeof(int32_t));
            double t0 = now_ms();
            for (int i = 0; i < reps; i++) {
                OK(kern_cuda_sample(g, d_tok, NULL, d_p, d_x, R, n, kp, pos, 1, err));
                dev_get(g, tok, d_tok, (size_t)R * sizeof(int32_t));
            }
            const double gpu_ms = (now_ms() - t0) / reps;
            t0 = now_ms();
            const int cpu_reps = 3;
            for (int i = 0; i < cpu_reps; i++)
                for (int r = 0; r < R; r++) {
                    int32_t t;
                    OK(sampling_sample(ws, &modes[m], x + (size_t)r * n, n, 1, pos[r], probs, &t,
                                       err));
                }
            const double cpu_ms = (now_ms() - t0) / cpu_reps;
            printf("  T=%g top_k=%d top_p=%g min_p=%g, %2d rows: device %.3f ms, cpu %.3f ms "
                   "(%.0fx)\n", (double)modes[m].temperature, modes[m].top_k,
                   (double)modes[m].top_p, (double)modes[m].min_p, R, gpu_ms, cpu_ms,
                   gpu_ms > 0.0 ? cpu_ms / gpu_ms : 0.0);
        }
    sampling_workspace_destroy(ws);
    g->ops->free(g, d_x);
    g->ops->free(g, d_p);
    g->ops->free(g, d_tok);
    free(x);
    free(probs);
}

/* ---- fixture and main ------------------------------------------------------------ */

static int setup(void **state)
{
    char err[ERR_MSG_MAX] = "";
    struct fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    f->device = getenv("TANDEM_CUDA_DEVICE");
    if (!f->device || !*f->device)
        f->device = "0";
    const char *s = getenv("TANDEM_GPU_TEST_SHORT");
    f->short_mode = s && *s && strcmp(s, "0") != 0;
    f->fewest = s && strcmp(s, "2") == 0;
    if (kern_cuda_create(&f->gpu, f->device, err) != 0) {
        fprintf(stderr, "kern_cuda_create(\"%s\"): %s\n", f->device, err);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    if (f) {
        f->gpu->ops->destroy(f->gpu);
        free(f);
    }
    return 0;
}

int main(void)
{
    /* No device needed: the restated Philox constants against philox.c. */
    int bad = philox_host_twin_mismatches();
    if (bad) {
        fprintf(stderr, "FAILED: the host build of sampling.cu's Philox differs from "
                "common/speculation/philox.c in %d values\n", bad);
        return 1;
    }
    printf("philox: the host build of the device code equals philox.c (Random123 answers, "
           "%d uniforms)\n", 4 * 5 * 6 * 9 + PHILOX_RANDOM_ARGS);
    if (gpu_skip_without_device())
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_philox_host_build_equals_cpu),
        cmocka_unit_test(test_cuda_philox_device_bits_equal_cpu),
        cmocka_unit_test(test_cuda_argmax_equals_cpu),
        cmocka_unit_test(test_cuda_adjust_matches_cpu),
        cmocka_unit_test(test_cuda_adjust_matches_cpu_at_llama3_vocab),
        cmocka_unit_test(test_cuda_adjust_reports_bad_rows_and_params),
        cmocka_unit_test(test_cuda_draw_equals_cpu),
        cmocka_unit_test(test_cuda_sample_equals_cpu),
        cmocka_unit_test(test_cuda_speculate_sampled_emits_target_distribution),
        cmocka_unit_test(test_cuda_speculate_point_mass_emits_target_distribution),
        cmocka_unit_test(test_cuda_speculate_broken_residual_fails_chi_square),
        cmocka_unit_test(test_cuda_speculate_random_rows_equal_cpu),
        cmocka_unit_test(test_cuda_speculate_degenerate_rows_equal_cpu),
        cmocka_unit_test(test_cuda_speculate_reports_statuses_and_bad_arguments),
        cmocka_unit_test(test_cuda_sampling_timing_at_llama3_vocab),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
