/* test_cuda_kernels.c: every op of the CUDA backend against the CPU backend
 * (kern_cpu_create), plus the CUDA backend's exactness contract and its
 * device naming and memory ops.
 *
 * Accuracy: seeded pseudo-random inputs; element-wise |cuda - cpu| <= atol +
 * rtol * s, where s is |cpu| or, for matmul, the magnitude sum_k |w*x| of the
 * element (tolerances stated at each check; the first mismatches are printed).
 * Every device output is poisoned with NaN before the op, so an element the
 * kernel never wrote fails. Conversions (embed) and add are compared bit for
 * bit.
 * Exactness: a row computed alone (n = 1) must be bit-identical to the same
 * row inside a call of n rows: matmul for every n in 1..256 and 257, 383,
 * 511, 512 (TANDEM_GPU_TEST_SHORT=1: 15 of them, for the sanitizers), through
 * every kernel and tile shape (kern_cuda_matmul_path), from aligned,
 * unaligned and row-offset inputs, bf16/f16/f32 weights, odd d_in;
 * attention across a split boundary.
 *
 * Exits 77 ("SKIPPED: no CUDA device") where no device is visible, before
 * any test runs. TANDEM_CUDA_DEVICE selects the device (default "0").
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "kernels.h"
#include "kernels_cuda.h"
#include "gpu_skip.h"
#include "quant_fixtures.h"

/* ---- helpers ---------------------------------------------------------- */

struct fixture {
    struct kern_backend *cpu;
    struct kern_backend *gpu;
    const char *device;
};

#define OK(call)                                                                 \
    do {                                                                         \
        int ok_rc_ = (call);                                                     \
        if (ok_rc_ != 0)                                                         \
            fail_msg("%s returned %d: %s", #call, ok_rc_, err);                  \
    } while (0)

static void fill(struct rng *r, float *x, size_t count, float amplitude)
{
    for (size_t i = 0; i < count; i++)
        x[i] = amplitude * rng_float(r);
}

static void *xmalloc(size_t size_bytes)
{
    void *p = malloc(size_bytes ? size_bytes : 1);
    assert_non_null(p);
    return p;
}

static float *falloc(size_t count)
{
    return xmalloc(count * sizeof(float));
}

static const enum kern_dtype all_dtypes[3] = {KERN_DTYPE_BF16, KERN_DTYPE_F16, KERN_DTYPE_F32};

/* Host weights of a dtype, plus their f32 values in *values (exact). bf16:
 * the top half of a random float; f16: built from bits (sign, exponent
 * 9..14, any mantissa), values in (-1, 1), decoded with ldexp here. */
static void *make_weights(struct rng *r, enum kern_dtype dt, size_t count, float **values)
{
    float *v = falloc(count);
    void *w = xmalloc(count * kern_dtype_size(dt));
    for (size_t i = 0; i < count; i++) {
        if (dt == KERN_DTYPE_F32) {
            v[i] = rng_float(r);
            ((float *)w)[i] = v[i];
        } else if (dt == KERN_DTYPE_BF16) {
            float f = rng_float(r);
            uint32_t bits;
            memcpy(&bits, &f, sizeof(bits));
            uint16_t h = (uint16_t)(bits >> 16);
            ((uint16_t *)w)[i] = h;
            bits = (uint32_t)h << 16;
            memcpy(&v[i], &bits, sizeof(bits));
        } else {
            uint64_t x = rng_next(r);
            unsigned sign = (unsigned)(x & 1), exp = 9 + (unsigned)((x >> 1) % 6),
                     mant = (unsigned)((x >> 8) & 0x3ff);
            ((uint16_t *)w)[i] = (uint16_t)(sign << 15 | exp << 10 | mant);
            v[i] = (float)ldexp((1.0 + mant / 1024.0) * (sign ? -1.0 : 1.0), (int)exp - 15);
        }
    }
    *values = v;
    return w;
}

/* Device buffer holding a copy of host bytes. */
static void *dev_put(struct kern_backend *be, const void *host, size_t size_bytes)
{
    char err[ERR_MSG_MAX] = "";
    void *d = NULL;
    OK(be->ops->alloc(be, size_bytes, &d, err));
    OK(be->ops->upload(be, d, host, size_bytes, err));
    return d;
}

static void dev_get(struct kern_backend *be, void *host, const void *dev, size_t size_bytes)
{
    char err[ERR_MSG_MAX] = "";
    OK(be->ops->download(be, host, dev, size_bytes, err));
}

/* Fills count floats of device memory with NaN. */
static void poison(struct kern_backend *be, void *dev, size_t count)
{
    char err[ERR_MSG_MAX] = "";
    float *nan_buf = falloc(count);
    for (size_t i = 0; i < count; i++)
        nan_buf[i] = NAN;
    OK(be->ops->upload(be, dev, nan_buf, count * sizeof(float), err));
    free(nan_buf);
}

/* Elements outside atol + rtol * s (s = scale[i] when scale, else |ref|);
 * NaN never passes. Prints the first few. */
static int count_mismatches(const char *what, const float *got, const float *ref, size_t count,
                            double atol, double rtol, const double *scale)
{
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        double s = scale ? scale[i] : fabs((double)ref[i]);
        double diff = fabs((double)got[i] - (double)ref[i]);
        if (!(diff <= atol + rtol * s)) {
            if (bad < 5)
                fprintf(stderr, "%s: mismatch at %zu: cuda %.9g cpu %.9g (|diff| %.3g, tol %.3g)\n",
                        what, i, (double)got[i], (double)ref[i], diff, atol + rtol * s);
            bad++;
        }
    }
    if (bad)
        fprintf(stderr, "%s: %d of %zu elements out of tolerance\n", what, bad, count);
    return bad;
}

static int count_bit_diffs(const char *what, const float *a, const float *b, size_t count)
{
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            if (bad < 5)
                fprintf(stderr, "%s: bits differ at %zu: %.9g vs %.9g\n", what, i, (double)a[i],
                        (double)b[i]);
            bad++;
        }
    }
    if (bad)
        fprintf(stderr, "%s: %d of %zu elements differ\n", what, bad, count);
    return bad;
}

/* ---- fixture ---------------------------------------------------------- */

static int setup(void **state)
{
    char err[ERR_MSG_MAX] = "";
    struct fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    f->device = getenv("TANDEM_CUDA_DEVICE");
    if (!f->device || !*f->device)
        f->device = "0";
    if (kern_cpu_create(&f->cpu, 2, err) != 0) {
        fprintf(stderr, "kern_cpu_create: %s\n", err);
        free(f);
        return -1;
    }
    /* the GPU keeps f32 activations: so does the CPU reference (on AVX512_BF16
     * its bf16 products would round them, kernels/cpu/bfdot.h) */
    if (kern_cpu_set_bf16_dot(f->cpu, 0, err) != 0) {
        fprintf(stderr, "kern_cpu_set_bf16_dot: %s\n", err);
        f->cpu->ops->destroy(f->cpu);
        free(f);
        return -1;
    }
    if (kern_cuda_create(&f->gpu, f->device, err) != 0) {
        fprintf(stderr, "kern_cuda_create(\"%s\"): %s\n", f->device, err);
        f->cpu->ops->destroy(f->cpu);
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
        f->cpu->ops->destroy(f->cpu);
        free(f);
    }
    return 0;
}

/* ---- device naming and memory ------------------------------------------ */

static void test_cuda_device_is_named_by_uuid(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    char uuid[KERN_CUDA_UUID_MAX], uuid2[KERN_CUDA_UUID_MAX];
    OK(kern_cuda_device_uuid(f->gpu, uuid, err));
    printf("device %s is %s\n", f->device, uuid);
    assert_int_equal(strncmp(uuid, "GPU-", 4), 0);
    assert_int_equal(strlen(uuid), 40);

    /* A second backend, created by UUID, on the same GPU: same UUID, and it
     * works beside the first one (no globals). */
    struct kern_backend *b2 = NULL;
    OK(kern_cuda_create(&b2, uuid, err));
    OK(kern_cuda_device_uuid(b2, uuid2, err));
    assert_string_equal(uuid, uuid2);
    float one[4] = {1, 2, 3, 4}, got[4];
    float *d = dev_put(b2, one, sizeof(one));
    OK(b2->ops->add(b2, d, d, 4, err));
    dev_get(b2, got, d, sizeof(got));
    assert_true(got[0] == 2.0f && got[3] == 8.0f);
    b2->ops->free(b2, d);
    b2->ops->destroy(b2);

    struct kern_backend *none = NULL;
    assert_int_equal(kern_cuda_create(&none, "GPU-00000000-0000-0000-0000-000000000000", err),
                     ERR_NOT_FOUND);
    assert_null(none);
    assert_int_equal(kern_cuda_create(&none, "999", err), ERR_NOT_FOUND);
    assert_int_equal(kern_cuda_create(&none, "zero", err), ERR_INVALID_ARG);
    assert_int_equal(kern_cuda_create(&none, "-1", err), ERR_INVALID_ARG);
    assert_int_equal(kern_cuda_device_uuid(f->cpu, uuid, err), ERR_INVALID_ARG);
}

static void test_cuda_memory_ops_roundtrip(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {1};
    const size_t count = 100003;
    float *host = falloc(count), *back = falloc(count);
    fill(&r, host, count, 1.0f);

    float *a = NULL, *b = NULL;
    OK(g->ops->alloc(g, count * sizeof(float), (void **)&a, err));
    OK(g->ops->alloc(g, count * sizeof(float), (void **)&b, err));
    dev_get(g, back, a, count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        if (back[i] != 0.0f)
            fail_msg("alloc: element %zu is %g, not zero", i, (double)back[i]);
    OK(g->ops->upload(g, a, host, count * sizeof(float), err));
    OK(g->ops->copy(g, b, a, count * sizeof(float), err));
    dev_get(g, back, b, count * sizeof(float));
    assert_int_equal(count_bit_diffs("upload+copy+download", back, host, count), 0);

    const void *w = NULL;
    OK(g->ops->map_weights(g, host, count * sizeof(float), &w, err));
    memset(back, 0, count * sizeof(float));
    dev_get(g, back, w, count * sizeof(float));
    assert_int_equal(count_bit_diffs("map_weights", back, host, count), 0);
    g->ops->unmap_weights(g, w);

    void *z = NULL;
    OK(g->ops->alloc(g, 0, &z, err));
    assert_non_null(z);
    g->ops->free(g, z);
    g->ops->free(g, NULL);
    OK(g->ops->sync(g, err));
    g->ops->free(g, a);
    g->ops->free(g, b);
    free(host);
    free(back);
}

/* kern_cuda_upload_staged (the engine's draft ids): the host buffer is
 * reused at once, more times than there are staging slots, each upload into
 * the same device array, read by a device copy queued after it: every copy
 * sees its own upload's bytes, in stream order. A CPU backend is refused. */
static void test_cuda_upload_staged_is_stream_ordered(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    enum { IDS = 9, ROUNDS = 20 };
    int32_t host[IDS], back[ROUNDS][IDS];
    int32_t *ids = NULL, *seen = NULL;
    OK(g->ops->alloc(g, IDS * sizeof(int32_t), (void **)&ids, err));
    OK(g->ops->alloc(g, (size_t)ROUNDS * IDS * sizeof(int32_t), (void **)&seen, err));
    for (int k = 0; k < ROUNDS; k++) {
        for (int i = 0; i < IDS; i++)
            host[i] = 1000 * k + i;
        OK(kern_cuda_upload_staged(g, ids, host, sizeof host, err));
        memset(host, 0xff, sizeof host); /* reused before the copy ran */
        OK(g->ops->copy(g, seen + (size_t)k * IDS, ids, sizeof host, err));
    }
    dev_get(g, back, seen, sizeof back);
    for (int k = 0; k < ROUNDS; k++)
        for (int i = 0; i < IDS; i++)
            if (back[k][i] != 1000 * k + i)
                fail_msg("upload %d: id %d is %d, not %d", k, i, (int)back[k][i], 1000 * k + i);
    OK(kern_cuda_upload_staged(g, ids, host, 0, err));
    assert_int_equal(kern_cuda_upload_staged(f->cpu, ids, host, sizeof host, err),
                     ERR_INVALID_ARG);
    assert_int_equal(kern_cuda_upload_staged(g, NULL, host, sizeof host, err), ERR_INVALID_ARG);
    g->ops->free(g, ids);
    g->ops->free(g, seen);
}

static void test_cuda_map_weights_out_of_memory_names_sizes(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    const size_t huge = (size_t)1 << 50; /* 1 PiB: more than any GPU has */
    const float dummy = 0.0f;
    const void *w = NULL;
    int rc = g->ops->map_weights(g, &dummy, huge, &w, err);
    printf("expected failure: %s\n", err);
    /* cudaErrorMemoryAllocation gives ERR_NOMEM; accept ERR_CUDA should a
     * driver call a request this size invalid instead: the message is what
     * a person reads. */
    assert_true(rc == ERR_NOMEM || rc == ERR_CUDA);
    assert_null(w);
    assert_non_null(strstr(err, "cudaMalloc of 1125899906842624 bytes"));
    assert_non_null(strstr(err, "GiB"));
    /* The failure is not sticky: the backend still works. */
    float x[3] = {1, 2, 3}, got[3];
    float *d = dev_put(g, x, sizeof(x));
    OK(g->ops->add(g, d, d, 3, err));
    dev_get(g, got, d, sizeof(got));
    assert_true(got[2] == 6.0f);
    g->ops->free(g, d);
}

/* add_rmsnorm = add, then rmsnorm, bit for bit: the sums written back to x
 * and the norm in out, for each dtype and dims below, at and above the
 * block's 256 threads. */
static void test_cuda_add_rmsnorm_equals_add_then_rmsnorm(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {37};
    const int dims[3] = {64, 1000, 3072};
    const int n = 6;
    const float eps = 1e-5f;
    for (int di = 0; di < 3; di++)
        for (int t = 0; t < 3; t++) {
            const int dim = dims[di];
            const enum kern_dtype dt = all_dtypes[t];
            const size_t cnt = (size_t)n * dim;
            float *values;
            void *w = make_weights(&r, dt, (size_t)dim, &values);
            float *x = falloc(cnt), *y = falloc(cnt);
            fill(&r, x, cnt, 2.0f);
            fill(&r, y, cnt, 1.0f);
            void *dw = dev_put(g, w, (size_t)dim * kern_dtype_size(dt));
            float *dx1 = dev_put(g, x, cnt * sizeof(float)), *dx2 = dev_put(g, x, cnt * sizeof(float));
            float *dy = dev_put(g, y, cnt * sizeof(float));
            float *d1 = NULL, *d2 = NULL;
            OK(g->ops->alloc(g, cnt * sizeof(float), (void **)&d1, err));
            OK(g->ops->alloc(g, cnt * sizeof(float), (void **)&d2, err));
            poison(g, d1, cnt);
            OK(g->ops->add(g, dx1, dy, cnt, err));
            OK(g->ops->rmsnorm(g, d1, dx1, dw, dt, n, dim, eps, err));
            OK(g->ops->add_rmsnorm(g, d2, dx2, dy, dw, dt, n, dim, eps, err));
            float *a = falloc(cnt), *b = falloc(cnt);
            char what[64];
            snprintf(what, sizeof what, "add_rmsnorm dim %d %s: norm", dim, kern_dtype_name(dt));
            dev_get(g, a, d1, cnt * sizeof(float));
            dev_get(g, b, d2, cnt * sizeof(float));
            assert_int_equal(count_bit_diffs(what, b, a, cnt), 0);
            snprintf(what, sizeof what, "add_rmsnorm dim %d %s: sums", dim, kern_dtype_name(dt));
            dev_get(g, a, dx1, cnt * sizeof(float));
            dev_get(g, b, dx2, cnt * sizeof(float));
            assert_int_equal(count_bit_diffs(what, b, a, cnt), 0);
            /* out aliasing x is refused (the kernel reads x back) */
            assert_int_equal(g->ops->add_rmsnorm(g, dx2, dx2, dy, dw, dt, n, dim, eps, err),
                             ERR_INVALID_ARG);
            float *bufs[6] = {dx1, dx2, dy, d1, d2, (float *)dw};
            for (int k = 0; k < 6; k++)
                g->ops->free(g, bufs[k]);
            free(a);
            free(b);
            free(x);
            free(y);
            free(w);
            free(values);
        }
}

/* ---- ops against the CPU ------------------------------------------------ */

static void test_cuda_embed_matches_cpu(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {2};
    const int vocab = 50, dim = 100, n = 7;
    int32_t ids[7] = {0, 49, 3, 3, 17, 48, 1};
    for (int t = 0; t < 3; t++) {
        enum kern_dtype dt = all_dtypes[t];
        float *values;
        void *table = make_weights(&r, dt, (size_t)vocab * dim, &values);
        float *ref = falloc((size_t)n * dim), *got = falloc((size_t)n * dim);
        OK(f->cpu->ops->embed(f->cpu, ref, table, dt, ids, n, dim, err));
        void *dtab = dev_put(f->gpu, table, (size_t)vocab * dim * kern_dtype_size(dt));
        float *dout = NULL;
        OK(f->gpu->ops->alloc(f->gpu, (size_t)n * dim * sizeof(float), (void **)&dout, err));
        poison(f->gpu, dout, (size_t)n * dim);
        OK(f->gpu->ops->embed(f->gpu, dout, dtab, dt, ids, n, dim, err));
        dev_get(f->gpu, got, dout, (size_t)n * dim * sizeof(float));
        assert_int_equal(count_bit_diffs(kern_dtype_name(dt), got, ref, (size_t)n * dim), 0);
        int32_t bad_id = -1;
        assert_int_equal(f->gpu->ops->embed(f->gpu, dout, dtab, dt, &bad_id, 1, dim, err),
                         ERR_INVALID_ARG);
        f->gpu->ops->free(f->gpu, dout);
        f->gpu->ops->free(f->gpu, dtab);
        free(ref);
        free(got);
        free(table);
        free(values);
    }
}

static void test_cuda_rmsnorm_matches_cpu(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {3};
    const int dims[3] = {64, 1000, 3072};
    const int n = 5;
    const float eps = 1e-5f;
    for (int di = 0; di < 3; di++)
        for (int t = 0; t < 3; t++) {
            const int dim = dims[di];
            enum kern_dtype dt = all_dtypes[t];
            const size_t cnt = (size_t)n * dim;
            float *values;
            void *w = make_weights(&r, dt, (size_t)dim, &values);
            float *x = falloc(cnt), *ref = falloc(cnt), *got = falloc(cnt), *got2 = falloc(cnt);
            fill(&r, x, cnt, 2.0f);
            OK(f->cpu->ops->rmsnorm(f->cpu, ref, x, w, dt, n, dim, eps, err));
            void *dw = dev_put(f->gpu, w, (size_t)dim * kern_dtype_size(dt));
            float *dx = dev_put(f->gpu, x, cnt * sizeof(float));
            float *dout = NULL;
            OK(f->gpu->ops->alloc(f->gpu, cnt * sizeof(float), (void **)&dout, err));
            poison(f->gpu, dout, cnt);
            OK(f->gpu->ops->rmsnorm(f->gpu, dout, dx, dw, dt, n, dim, eps, err));
            dev_get(f->gpu, got, dout, cnt * sizeof(float));
            char what[64];
            snprintf(what, sizeof(what), "rmsnorm dim %d %s", dim, kern_dtype_name(dt));
            /* Both sums of squares are within dim * 2^-24 (relative) of the
             * exact one; the root halves that; a few more roundings follow. */
            assert_int_equal(count_mismatches(what, got, ref, cnt, 1e-7, (dim + 8) * 0x1.0p-24,
                                              NULL), 0);
            /* row 3 alone, from an offset pointer: same bits */
            poison(f->gpu, dout, (size_t)dim);
            OK(f->gpu->ops->rmsnorm(f->gpu, dout, dx + 3 * dim, dw, dt, 1, dim, eps, err));
            dev_get(f->gpu, got2, dout, (size_t)dim * sizeof(float));
            assert_int_equal(count_bit_diffs(what, got2, got + 3 * dim, (size_t)dim), 0);
            /* in place (out aliases in): same bits */
            OK(f->gpu->ops->rmsnorm(f->gpu, dx, dx, dw, dt, n, dim, eps, err));
            dev_get(f->gpu, got2, dx, cnt * sizeof(float));
            assert_int_equal(count_bit_diffs(what, got2, got, cnt), 0);
            f->gpu->ops->free(f->gpu, dout);
            f->gpu->ops->free(f->gpu, dx);
            f->gpu->ops->free(f->gpu, dw);
            free(x);
            free(ref);
            free(got);
            free(got2);
            free(w);
            free(values);
        }
}

static void test_cuda_rope_matches_cpu(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {4};
    const int n = 6, n_heads = 4;
    const int hds[2] = {64, 128};
    const int32_t pos[6] = {0, 1, 17, 255, 4093, 8000};
    for (int hi = 0; hi < 2; hi++) {
        const int hd = hds[hi];
        const size_t cnt = (size_t)n * n_heads * hd;
        float *inv = falloc((size_t)hd / 2);
        for (int j = 0; j < hd / 2; j++)
            inv[j] = (float)pow(500000.0, -2.0 * j / hd);
        float *x = falloc(cnt), *ref = falloc(cnt), *got = falloc(cnt);
        fill(&r, x, cnt, 1.0f);
        memcpy(ref, x, cnt * sizeof(float));
        OK(f->cpu->ops->rope(f->cpu, ref, pos, n, n_heads, hd, inv, err));
        float *dx = dev_put(f->gpu, x, cnt * sizeof(float));
        OK(f->gpu->ops->rope(f->gpu, dx, pos, n, n_heads, hd, inv, err));
        dev_get(f->gpu, got, dx, cnt * sizeof(float));
        /* same f32 angle; CUDA's sincosf and glibc differ by a few ulp */
        assert_int_equal(count_mismatches("rope", got, ref, cnt, 2e-6, 2e-6, NULL), 0);
        /* row 4 alone: same bits */
        float *row = falloc((size_t)n_heads * hd);
        float *dr = dev_put(f->gpu, x + 4 * n_heads * hd, (size_t)n_heads * hd * sizeof(float));
        OK(f->gpu->ops->rope(f->gpu, dr, pos + 4, 1, n_heads, hd, inv, err));
        dev_get(f->gpu, row, dr, (size_t)n_heads * hd * sizeof(float));
        assert_int_equal(count_bit_diffs("rope row", row, got + 4 * n_heads * hd,
                                         (size_t)n_heads * hd), 0);
        f->gpu->ops->free(f->gpu, dr);
        f->gpu->ops->free(f->gpu, dx);
        free(row);
        free(inv);
        free(x);
        free(ref);
        free(got);
    }
}

static void test_cuda_swiglu_and_add_match_cpu(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {5};
    const size_t cnt = 100003;
    float *g = falloc(cnt), *u = falloc(cnt), *ref = falloc(cnt), *got = falloc(cnt);
    fill(&r, g, cnt, 8.0f);
    fill(&r, u, cnt, 2.0f);
    OK(f->cpu->ops->swiglu(f->cpu, ref, g, u, cnt, err));
    float *dg = dev_put(f->gpu, g, cnt * sizeof(float));
    float *du = dev_put(f->gpu, u, cnt * sizeof(float));
    OK(f->gpu->ops->swiglu(f->gpu, dg, dg, du, cnt, err)); /* out aliases gate */
    dev_get(f->gpu, got, dg, cnt * sizeof(float));
    /* expf within 2 ulp on both sides, then a division and a product */
    assert_int_equal(count_mismatches("swiglu", got, ref, cnt, 1e-7, 4e-6, NULL), 0);

    memcpy(ref, g, cnt * sizeof(float));
    OK(f->cpu->ops->add(f->cpu, ref, u, cnt, err));
    OK(f->gpu->ops->upload(f->gpu, dg, g, cnt * sizeof(float), err));
    OK(f->gpu->ops->add(f->gpu, dg, du, cnt, err));
    dev_get(f->gpu, got, dg, cnt * sizeof(float));
    assert_int_equal(count_bit_diffs("add", got, ref, cnt), 0);
    f->gpu->ops->free(f->gpu, dg);
    f->gpu->ops->free(f->gpu, du);
    free(g);
    free(u);
    free(ref);
    free(got);
}

/* scale[i][o] = sum_k |w[o][k] * x[i][k]|, the magnitude matmul errors scale with. */
static double *matmul_scale(const float *x, const float *w, int n, int d_in, int d_out)
{
    double *s = xmalloc((size_t)n * d_out * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int o = 0; o < d_out; o++) {
            double acc = 0;
            for (int k = 0; k < d_in; k++)
                acc += fabs((double)x[(size_t)i * d_in + k] * (double)w[(size_t)o * d_in + k]);
            s[(size_t)i * d_out + o] = acc;
        }
    return s;
}

/* CUDA vs CPU for one shape; rtol applies to sum_k |w*x|. */
static void matmul_case(struct fixture *f, struct rng *r, enum kern_dtype dt, int n, int d_in,
                        int d_out, double rtol)
{
    char err[ERR_MSG_MAX] = "";
    float *values;
    void *w = make_weights(r, dt, (size_t)d_out * d_in, &values);
    float *x = falloc((size_t)n * d_in), *ref = falloc((size_t)n * d_out),
          *got = falloc((size_t)n * d_out);
    fill(r, x, (size_t)n * d_in, 1.0f);
    OK(f->cpu->ops->matmul(f->cpu, ref, x, w, dt, n, d_in, d_out, err));
    void *dw = dev_put(f->gpu, w, (size_t)d_out * d_in * kern_dtype_size(dt));
    float *dx = dev_put(f->gpu, x, (size_t)n * d_in * sizeof(float));
    float *dout = NULL;
    OK(f->gpu->ops->alloc(f->gpu, (size_t)n * d_out * sizeof(float), (void **)&dout, err));
    poison(f->gpu, dout, (size_t)n * d_out);
    OK(f->gpu->ops->matmul(f->gpu, dout, dx, dw, dt, n, d_in, d_out, err));
    dev_get(f->gpu, got, dout, (size_t)n * d_out * sizeof(float));
    double *scale = matmul_scale(x, values, n, d_in, d_out);
    char what[96];
    snprintf(what, sizeof(what), "matmul %s n=%d d_in=%d d_out=%d", kern_dtype_name(dt), n, d_in,
             d_out);
    assert_int_equal(count_mismatches(what, got, ref, (size_t)n * d_out, 1e-6, rtol, scale), 0);
    f->gpu->ops->free(f->gpu, dout);
    f->gpu->ops->free(f->gpu, dx);
    f->gpu->ops->free(f->gpu, dw);
    free(scale);
    free(x);
    free(ref);
    free(got);
    free(w);
    free(values);
}

/* Both sides accumulate in f32 in different orders: each is within
 * d_in * 2^-24 * sum|w*x| of the exact value (the classic bound), so they
 * are within twice that of each other. */
static double f32_rtol(int d_in)
{
    return 2.0 * (d_in + 2) * 0x1.0p-24;
}

static void test_cuda_matmul_small_matches_cpu(void **state)
{
    struct fixture *f = *state;
    struct rng r = {6};
    const int ns[3] = {1, 5, 17};
    for (int t = 0; t < 3; t++)
        for (int ni = 0; ni < 3; ni++) {
            matmul_case(f, &r, all_dtypes[t], ns[ni], 100, 37, f32_rtol(100));
            matmul_case(f, &r, all_dtypes[t], ns[ni], 1024, 260, f32_rtol(1024));
        }
}

/* Prefill-sized calls take the tiled kernel: the same f32 order as decode,
 * so the f32 tolerance of the small calls holds for every dtype (it was
 * 2^-8 for bf16 when these rows went through cuBLAS on bf16 activations). */
static void test_cuda_matmul_prefill_matches_cpu(void **state)
{
    struct fixture *f = *state;
    struct rng r = {7};
    for (int t = 0; t < 3; t++) {
        matmul_case(f, &r, all_dtypes[t], 40, 256, 96, f32_rtol(256));
        matmul_case(f, &r, all_dtypes[t], 64, 1000, 130, f32_rtol(1000));
        matmul_case(f, &r, all_dtypes[t], 300, 517, 75, f32_rtol(517));
    }
    matmul_case(f, &r, KERN_DTYPE_BF16, 128, 3072, 200, f32_rtol(3072));
}

/* The paths of kern_cuda_matmul_path that must all give the bits of n = 1. */
static const enum kern_cuda_mm_path exact_paths[] = {
    KERN_CUDA_MM_AUTO,        KERN_CUDA_MM_SKINNY,      KERN_CUDA_MM_TILED,
    KERN_CUDA_MM_TILED_32X32, KERN_CUDA_MM_TILED_16X32, KERN_CUDA_MM_TILED_16X16,
};
static const char *const exact_path_names[] = {"auto",        "skinny",      "tiled",
                                               "tiled 32x32", "tiled 16x32", "tiled 16x16"};
#define N_EXACT_PATHS (sizeof(exact_paths) / sizeof(exact_paths[0]))

/* TANDEM_GPU_TEST_SHORT=1 (run_gpu_tests.sh sets it for memcheck and
 * synccheck): fewer row counts, still every shape, path and tile edge kind.
 * TANDEM_GPU_TEST_SHORT=2 (racecheck, which instruments every shared-memory
 * access): the fewest rows that still take each kernel and tile shape
 * (skinny, then the 16- and 32-row tiles and their partial edges). */
static int short_level(void)
{
    const char *s = getenv("TANDEM_GPU_TEST_SHORT");
    if (!s || !*s || strcmp(s, "0") == 0)
        return 0;
    return strcmp(s, "2") == 0 ? 2 : 1;
}

static int short_mode(void) { return short_level() > 0; }

#define INV_N_MAX 512

/* Row counts for the invariance test: every n in 1..256, then 257, 383,
 * 511, 512 (short mode: 15 of them, across the skinny/tiled switch and the
 * 16- and 32-row tile edges). */
static int invariance_row_counts(int *ns)
{
    int k = 0;
    if (short_level() == 2) {
        const int fewest[4] = {1, 9, 17, 33};
        for (int i = 0; i < 4; i++)
            ns[k++] = fewest[i];
        return k;
    }
    if (short_mode()) {
        const int quick[15] = {1, 2, 9, 15, 16, 17, 31, 32, 33, 40, 64, 65, 129, 257, INV_N_MAX};
        for (int i = 0; i < 15; i++)
            ns[k++] = quick[i];
        return k;
    }
    for (int n = 1; n <= 256; n++)
        ns[k++] = n;
    const int more[4] = {257, 383, 511, INV_N_MAX};
    for (int i = 0; i < 4; i++)
        ns[k++] = more[i];
    return k;
}

/* out (device, n rows) through a path, downloaded into got; the device
 * rows are poisoned first so an element no kernel wrote fails. */
static void run_path(struct kern_backend *g, enum kern_cuda_mm_path path, float *dout,
                     const float *din, const void *dw, enum kern_dtype dt, int n, int d_in,
                     int d_out, float *got)
{
    char err[ERR_MSG_MAX] = "";
    poison(g, dout, (size_t)n * d_out);
    OK(kern_cuda_matmul_path(g, path, dout, din, dw, dt, n, d_in, d_out, err));
    dev_get(g, got, dout, (size_t)n * d_out * sizeof(float));
}

/* The exactness contract for matmul: row i computed alone (n = 1) has the
 * same bits as row i of any call of n = 1..512 rows, through every kernel
 * and tile shape, from aligned, unaligned (one float past 16 bytes) and
 * row-offset input pointers; and the n = 1 rows agree with the CPU. Shapes:
 * d_in % 8 == 0 over 4 tiles of 256; odd d_in with a 5-element tail (scalar
 * loads everywhere); d_in % 8 == 4 (the tiled kernel's 16-byte copies end
 * in half a chunk); d_in < 256 (a single, partial tile); d_in % 256 == 64
 * (the first 8 lanes take one more chunk than the others, after the
 * skinny kernels' chunks loaded ahead). No d_out is a multiple of 8. The
 * comparison itself is checked to catch one ulp. */
static void test_cuda_matmul_is_batch_invariant(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {8};
    const int shapes[5][2] = {{1024, 67}, {517, 100}, {300, 33}, {100, 45}, {1088, 37}};
    int ns[300];
    const int n_ns = invariance_row_counts(ns);
    for (int t = 0; t < 3; t++)
        for (int si = 0; si < 5; si++) {
            const enum kern_dtype dt = all_dtypes[t];
            const int d_in = shapes[si][0], d_out = shapes[si][1];
            const size_t x_count = (size_t)INV_N_MAX * d_in, o_count = (size_t)INV_N_MAX * d_out;
            float *values;
            void *w = make_weights(&r, dt, (size_t)d_out * d_in, &values);
            float *x = falloc(x_count);
            fill(&r, x, x_count, 1.0f);
            void *dw = dev_put(g, w, (size_t)d_out * d_in * kern_dtype_size(dt));
            /* one spare row: row offsets up to INV_N_MAX rows stay inside */
            float *dx = NULL;
            OK(g->ops->alloc(g, (x_count + (size_t)d_in) * sizeof(float), (void **)&dx, err));
            OK(g->ops->upload(g, dx, x, x_count * sizeof(float), err));
            /* the same rows one float past a 16-byte boundary */
            float *dxu_base = NULL;
            OK(g->ops->alloc(g, (x_count + 1) * sizeof(float), (void **)&dxu_base, err));
            OK(g->ops->upload(g, dxu_base + 1, x, x_count * sizeof(float), err));
            float *dout = NULL;
            OK(g->ops->alloc(g, o_count * sizeof(float), (void **)&dout, err));
            float *single = falloc(o_count), *got = falloc(o_count);
            char what[128];

            /* every row alone, through the op table (only the rows the
             * calls below reach) */
            poison(g, dout, o_count);
            const int n_alone = ns[n_ns - 1] < INV_N_MAX ? ns[n_ns - 1] + 1 : INV_N_MAX;
            for (int i = 0; i < n_alone; i++)
                OK(g->ops->matmul(g, dout + (size_t)i * d_out, dx + (size_t)i * d_in, dw, dt, 1,
                                  d_in, d_out, err));
            dev_get(g, single, dout, o_count * sizeof(float));

            /* the rows alone agree with the CPU */
            float *ref = falloc(o_count);
            OK(f->cpu->ops->matmul(f->cpu, ref, x, w, dt, n_alone, d_in, d_out, err));
            double *scale = matmul_scale(x, values, n_alone, d_in, d_out);
            snprintf(what, sizeof(what), "matmul %s d_in=%d d_out=%d rows alone vs cpu",
                     kern_dtype_name(dt), d_in, d_out);
            assert_int_equal(count_mismatches(what, single, ref, (size_t)n_alone * d_out, 1e-6,
                                              f32_rtol(d_in), scale), 0);
            free(scale);
            free(ref);

            /* the comparison catches one ulp, and a neighbouring row */
            memcpy(got, single, o_count * sizeof(float));
            got[(size_t)7 * d_out + 3] = nextafterf(got[(size_t)7 * d_out + 3], INFINITY);
            assert_int_equal(count_bit_diffs("self-check (one element off by one ulp, expected)",
                                             got, single, o_count), 1);
            assert_true(count_bit_diffs("self-check (row i vs row i+1, expected)", single,
                                        single + d_out, (size_t)d_out) > 0);

            for (int ni = 0; ni < n_ns; ni++) {
                const int n = ns[ni];
                for (size_t p = 0; p < N_EXACT_PATHS; p++) {
                    run_path(g, exact_paths[p], dout, dx, dw, dt, n, d_in, d_out, got);
                    snprintf(what, sizeof(what), "matmul %s d_in=%d d_out=%d %s n=%d vs n=1",
                             kern_dtype_name(dt), d_in, d_out, exact_path_names[p], n);
                    assert_int_equal(count_bit_diffs(what, got, single, (size_t)n * d_out), 0);
                }
                /* unaligned input: the op table, and the tiled kernel's
                 * element-by-element copies */
                run_path(g, KERN_CUDA_MM_AUTO, dout, dxu_base + 1, dw, dt, n, d_in, d_out, got);
                snprintf(what, sizeof(what), "matmul %s d_in=%d d_out=%d unaligned n=%d vs n=1",
                         kern_dtype_name(dt), d_in, d_out, n);
                assert_int_equal(count_bit_diffs(what, got, single, (size_t)n * d_out), 0);
                run_path(g, KERN_CUDA_MM_TILED_16X16, dout, dxu_base + 1, dw, dt, n, d_in, d_out,
                         got);
                snprintf(what, sizeof(what),
                         "matmul %s d_in=%d d_out=%d tiled 16x16 unaligned n=%d vs n=1",
                         kern_dtype_name(dt), d_in, d_out, n);
                assert_int_equal(count_bit_diffs(what, got, single, (size_t)n * d_out), 0);
                /* input offset by a row: rows 1..n */
                if (n < INV_N_MAX) {
                    run_path(g, KERN_CUDA_MM_AUTO, dout, dx + d_in, dw, dt, n, d_in, d_out, got);
                    snprintf(what, sizeof(what),
                             "matmul %s d_in=%d d_out=%d rows 1..%d vs alone",
                             kern_dtype_name(dt), d_in, d_out, n);
                    assert_int_equal(count_bit_diffs(what, got, single + d_out,
                                                     (size_t)n * d_out), 0);
                }
            }
            g->ops->free(g, dout);
            g->ops->free(g, dxu_base);
            g->ops->free(g, dx);
            g->ops->free(g, dw);
            free(single);
            free(got);
            free(x);
            free(w);
            free(values);
        }
}

/* A Llama-sized row (d_in 3072, 12 tiles) alone and in calls that take
 * each tiled block shape: same bits. */
static void test_cuda_matmul_llama_rows_are_invariant(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {11};
    const enum kern_dtype dt = KERN_DTYPE_BF16;
    const int d_in = 3072, d_out = 1000, n_max = 300;
    const int ns[6] = {9, 16, 17, 64, 129, 300};
    const int n_ns = short_mode() ? 2 : 6; /* sanitizers: 9 and 16 rows */
    float *values;
    void *w = make_weights(&r, dt, (size_t)d_out * d_in, &values);
    float *x = falloc((size_t)n_max * d_in);
    fill(&r, x, (size_t)n_max * d_in, 1.0f);
    void *dw = dev_put(g, w, (size_t)d_out * d_in * kern_dtype_size(dt));
    float *dx = dev_put(g, x, (size_t)n_max * d_in * sizeof(float));
    float *dout = NULL;
    OK(g->ops->alloc(g, (size_t)n_max * d_out * sizeof(float), (void **)&dout, err));
    float *single = falloc((size_t)n_max * d_out), *got = falloc((size_t)n_max * d_out);
    const int n_alone = ns[n_ns - 1]; /* the rows the calls below compare */
    for (int i = 0; i < n_alone; i++)
        OK(g->ops->matmul(g, dout + (size_t)i * d_out, dx + (size_t)i * d_in, dw, dt, 1, d_in,
                          d_out, err));
    dev_get(g, single, dout, (size_t)n_max * d_out * sizeof(float));
    for (int ni = 0; ni < n_ns; ni++)
        for (size_t p = 0; p < N_EXACT_PATHS; p++) {
            if (exact_paths[p] == KERN_CUDA_MM_SKINNY && ns[ni] > 17)
                continue; /* the small-shape test covers the skinny groups */
            run_path(g, exact_paths[p], dout, dx, dw, dt, ns[ni], d_in, d_out, got);
            char what[96];
            snprintf(what, sizeof(what), "matmul bf16 3072->1000 %s n=%d vs n=1",
                     exact_path_names[p], ns[ni]);
            assert_int_equal(count_bit_diffs(what, got, single, (size_t)ns[ni] * d_out), 0);
        }
    g->ops->free(g, dout);
    g->ops->free(g, dx);
    g->ops->free(g, dw);
    free(single);
    free(got);
    free(x);
    free(w);
    free(values);
}

/* TANDEM_CUDA_MM_TILED_MIN_ROWS, read once at create, moves the rows from
 * which matmul, matmul_multi and matmul_swiglu take the tiled kernel (what
 * a GPU window compares without a rebuild): a backend created with 9 takes
 * it from 9 rows, and its results are the default backend's bits at every
 * row count around both thresholds; create refuses a malformed value,
 * naming the variable; the CPU backend has no threshold. */
static void test_cuda_matmul_tiled_threshold_from_env(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    static const char env[] = "TANDEM_CUDA_MM_TILED_MIN_ROWS";
    const char *was = getenv(env);
    char *saved = was ? strdup(was) : NULL;
    assert_true(!was || saved);
    assert_int_equal(kern_cuda_matmul_tiled_min_rows(f->cpu), ERR_INVALID_ARG);
    if (!was || !*was)
        assert_int_equal(kern_cuda_matmul_tiled_min_rows(g), 18);

    static const char *const bad[] = {"0", "-3", "abc", "18x", "1000001"};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        struct kern_backend *none = NULL;
        assert_int_equal(setenv(env, bad[b], 1), 0);
        assert_int_equal(kern_cuda_create(&none, f->device, err), ERR_INVALID_ARG);
        assert_null(none);
        assert_non_null(strstr(err, env));
    }
    struct kern_backend *g9 = NULL;
    assert_int_equal(setenv(env, "9", 1), 0);
    OK(kern_cuda_create(&g9, f->device, err));
    if (saved)
        assert_int_equal(setenv(env, saved, 1), 0);
    else
        assert_int_equal(unsetenv(env), 0);
    free(saved);
    assert_int_equal(kern_cuda_matmul_tiled_min_rows(g9), 9);

    struct rng r = {53};
    const int ns[8] = {1, 8, 9, 12, 16, 17, 18, 33};
    const int d_in = 1024, d_out = 67, n_max = 33;
    for (int t = 0; t < 3; t++) {
        const enum kern_dtype dt = all_dtypes[t];
        float *values;
        void *w = make_weights(&r, dt, (size_t)d_out * d_in, &values);
        float *x = falloc((size_t)n_max * d_in);
        fill(&r, x, (size_t)n_max * d_in, 1.0f);
        struct kern_backend *bes[2] = {g, g9};
        void *dw[2];
        float *dx[2], *dout[2], *got[2];
        for (int b = 0; b < 2; b++) {
            dw[b] = dev_put(bes[b], w, (size_t)d_out * d_in * kern_dtype_size(dt));
            dx[b] = dev_put(bes[b], x, (size_t)n_max * d_in * sizeof(float));
            OK(bes[b]->ops->alloc(bes[b], (size_t)n_max * d_out * sizeof(float),
                                  (void **)&dout[b], err));
            got[b] = falloc((size_t)n_max * d_out);
        }
        for (int ni = 0; ni < 8; ni++) {
            const int n = ns[ni];
            for (int b = 0; b < 2; b++)
                run_path(bes[b], KERN_CUDA_MM_AUTO, dout[b], dx[b], dw[b], dt, n, d_in, d_out,
                         got[b]);
            char what[96];
            snprintf(what, sizeof what, "matmul %s n=%d: tiled from 9 rows vs from 18",
                     kern_dtype_name(dt), n);
            assert_int_equal(count_bit_diffs(what, got[1], got[0], (size_t)n * d_out), 0);
        }
        for (int b = 0; b < 2; b++) {
            bes[b]->ops->free(bes[b], dout[b]);
            bes[b]->ops->free(bes[b], dx[b]);
            bes[b]->ops->free(bes[b], dw[b]);
            free(got[b]);
        }
        free(x);
        free(w);
        free(values);
    }
    g9->ops->destroy(g9);
}

/* matmul_multi (q, k, v in one launch; gate and up) gives every output the
 * bits of its own matmul, for each dtype, row counts on both sides of the
 * tiled kernel's threshold and the skinny groups of 17, an odd d_in (the
 * scalar loads), a d_in whose chunks run ahead in fours and one (1088) where
 * 8 lanes take a chunk past those loaded ahead. */
static void test_cuda_matmul_multi_equals_separate(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {29};
    const int ns[7] = {1, 2, 5, 8, 9, 17, 40};
    const int d_ins[3] = {1024, 1088, 200 + 3};
    const int d_outs[3] = {95, 34, 33}; /* a warp's columns straddle the parts */
    for (int di = 0; di < 3; di++)
        for (int t = 0; t < 3; t++) {
            const enum kern_dtype dt = all_dtypes[t];
            const int d_in = d_ins[di], n_max = ns[6];
            void *dw[3];
            float *dout[3], *dsep[3];
            for (int j = 0; j < 3; j++) {
                float *values;
                void *w = make_weights(&r, dt, (size_t)d_outs[j] * d_in, &values);
                dw[j] = dev_put(g, w, (size_t)d_outs[j] * d_in * kern_dtype_size(dt));
                free(w);
                free(values);
                OK(g->ops->alloc(g, (size_t)n_max * d_outs[j] * sizeof(float), (void **)&dout[j],
                                 err));
                OK(g->ops->alloc(g, (size_t)n_max * d_outs[j] * sizeof(float), (void **)&dsep[j],
                                 err));
            }
            float *x = falloc((size_t)n_max * d_in);
            fill(&r, x, (size_t)n_max * d_in, 1.0f);
            float *dx = dev_put(g, x, (size_t)n_max * d_in * sizeof(float));
            for (int ni = 0; ni < 7; ni++) {
                const int n = ns[ni];
                for (int j = 0; j < 3; j++) {
                    poison(g, dout[j], (size_t)n * d_outs[j]);
                    OK(g->ops->matmul(g, dsep[j], dx, dw[j], dt, n, d_in, d_outs[j], err));
                }
                const void *ws[3] = {dw[0], dw[1], dw[2]};
                OK(g->ops->matmul_multi(g, 3, dout, dx, ws, dt, n, d_in, d_outs, err));
                for (int j = 0; j < 3; j++) {
                    float *a = falloc((size_t)n * d_outs[j]), *b = falloc((size_t)n * d_outs[j]);
                    dev_get(g, a, dout[j], (size_t)n * d_outs[j] * sizeof(float));
                    dev_get(g, b, dsep[j], (size_t)n * d_outs[j] * sizeof(float));
                    char what[96];
                    snprintf(what, sizeof what, "matmul_multi %s d_in=%d n=%d part %d",
                             kern_dtype_name(dt), d_in, n, j);
                    assert_int_equal(count_bit_diffs(what, a, b, (size_t)n * d_outs[j]), 0);
                    free(a);
                    free(b);
                }
            }
            for (int j = 0; j < 3; j++) {
                g->ops->free(g, dw[j]);
                g->ops->free(g, dout[j]);
                g->ops->free(g, dsep[j]);
            }
            g->ops->free(g, dx);
            free(x);
        }
}

/* matmul_swiglu = matmul, matmul, swiglu, bit for bit, for each dtype, on
 * both sides of the tiled kernel's threshold (40 rows: the unfused ops), an
 * odd d_in (scalar loads), 1088 (8 lanes take a chunk past the pairs
 * loaded ahead) and rows in groups of 17. */
static void test_cuda_matmul_swiglu_equals_separate(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {41};
    const int ns[7] = {1, 2, 5, 8, 9, 17, 40};
    const int d_ins[3] = {1024, 1088, 203};
    const int d_out = 77;
    for (int di = 0; di < 3; di++)
        for (int t = 0; t < 3; t++) {
            const enum kern_dtype dt = all_dtypes[t];
            const int d_in = d_ins[di], n_max = ns[6];
            const size_t out_n = (size_t)n_max * d_out;
            void *dw[2];
            for (int j = 0; j < 2; j++) {
                float *values;
                void *w = make_weights(&r, dt, (size_t)d_out * d_in, &values);
                dw[j] = dev_put(g, w, (size_t)d_out * d_in * kern_dtype_size(dt));
                free(w);
                free(values);
            }
            float *x = falloc((size_t)n_max * d_in);
            fill(&r, x, (size_t)n_max * d_in, 1.0f);
            float *dx = dev_put(g, x, (size_t)n_max * d_in * sizeof(float));
            float *dg = NULL, *du = NULL, *fg = NULL, *fu = NULL;
            OK(g->ops->alloc(g, out_n * sizeof(float), (void **)&dg, err));
            OK(g->ops->alloc(g, out_n * sizeof(float), (void **)&du, err));
            OK(g->ops->alloc(g, out_n * sizeof(float), (void **)&fg, err));
            OK(g->ops->alloc(g, out_n * sizeof(float), (void **)&fu, err));
            float *a = falloc(out_n), *b = falloc(out_n);
            for (int ni = 0; ni < 7; ni++) {
                const int n = ns[ni];
                const size_t cnt = (size_t)n * d_out;
                OK(g->ops->matmul(g, dg, dx, dw[0], dt, n, d_in, d_out, err));
                OK(g->ops->matmul(g, du, dx, dw[1], dt, n, d_in, d_out, err));
                OK(g->ops->swiglu(g, dg, dg, du, cnt, err));
                poison(g, fg, cnt);
                OK(g->ops->matmul_swiglu(g, fg, fu, dx, dw[0], dw[1], dt, n, d_in, d_out, err));
                dev_get(g, a, dg, cnt * sizeof(float));
                dev_get(g, b, fg, cnt * sizeof(float));
                char what[96];
                snprintf(what, sizeof what, "matmul_swiglu %s d_in=%d n=%d", kern_dtype_name(dt),
                         d_in, n);
                assert_int_equal(count_bit_diffs(what, b, a, cnt), 0);
            }
            float *bufs[7] = {dg, du, fg, fu, dx, (float *)dw[0], (float *)dw[1]};
            for (int k = 0; k < 7; k++)
                g->ops->free(g, bufs[k]);
            free(a);
            free(b);
            free(x);
        }
}

/* The cuBLAS path (benchmark reference) computes the same product within
 * bf16 activation rounding; it refuses f16 weights and CPU backends. */
static void test_cuda_matmul_cublas_reference(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {12};
    const int n = 64, d_in = 1000, d_out = 130;
    for (int t = 0; t < 3; t++) {
        const enum kern_dtype dt = all_dtypes[t];
        float *values;
        void *w = make_weights(&r, dt, (size_t)d_out * d_in, &values);
        float *x = falloc((size_t)n * d_in), *ref = falloc((size_t)n * d_out),
              *got = falloc((size_t)n * d_out);
        fill(&r, x, (size_t)n * d_in, 1.0f);
        OK(f->cpu->ops->matmul(f->cpu, ref, x, w, dt, n, d_in, d_out, err));
        void *dw = dev_put(g, w, (size_t)d_out * d_in * kern_dtype_size(dt));
        float *dx = dev_put(g, x, (size_t)n * d_in * sizeof(float));
        float *dout = NULL;
        OK(g->ops->alloc(g, (size_t)n * d_out * sizeof(float), (void **)&dout, err));
        if (dt == KERN_DTYPE_F16) {
            assert_int_equal(kern_cuda_matmul_path(g, KERN_CUDA_MM_CUBLAS, dout, dx, dw, dt, n,
                                                   d_in, d_out, err),
                             ERR_UNSUPPORTED);
        } else {
            run_path(g, KERN_CUDA_MM_CUBLAS, dout, dx, dw, dt, n, d_in, d_out, got);
            double *scale = matmul_scale(x, values, n, d_in, d_out);
            /* bf16: each activation rounded to bf16 (2^-9 relative per term) */
            const double rtol = (dt == KERN_DTYPE_BF16 ? 0x1.0p-8 : 0.0) + f32_rtol(d_in);
            assert_int_equal(count_mismatches("matmul cublas path", got, ref, (size_t)n * d_out,
                                              1e-6, rtol, scale), 0);
            free(scale);
        }
        assert_int_equal(kern_cuda_matmul_path(f->cpu, KERN_CUDA_MM_AUTO, dout, dx, dw, dt, n,
                                               d_in, d_out, err),
                         ERR_INVALID_ARG);
        g->ops->free(g, dout);
        g->ops->free(g, dx);
        g->ops->free(g, dw);
        free(x);
        free(ref);
        free(got);
        free(w);
        free(values);
    }
}

struct attn_shape {
    int n, pos0, n_heads, n_kv, hd;
    float q_amp; /* larger q: peakier softmax */
};

/* Uploads q, k, v for a shape; caches sized pos0 + n positions. */
/* A contiguous cache of n_ctx positions as a paged layout (one sequence,
 * one block), its n rows at positions pos0 .. pos0 + n - 1. Static arrays:
 * one layout in use at a time. */
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

static void attn_inputs(struct rng *r, const struct attn_shape *s, float **q, float **k, float **v)
{
    const size_t qn = (size_t)s->n * s->n_heads * s->hd;
    const size_t kvn = (size_t)(s->pos0 + s->n) * s->n_kv * s->hd;
    *q = falloc(qn);
    *k = falloc(kvn);
    *v = falloc(kvn);
    fill(r, *q, qn, s->q_amp);
    fill(r, *k, kvn, 1.0f);
    fill(r, *v, kvn, 1.0f);
}

static void test_cuda_attention_matches_cpu(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {9};
    const struct attn_shape shapes[] = {
        {5, 0, 8, 2, 64, 1.0f},     /* prefill from position 0, GQA 4:1 */
        {17, 300, 8, 8, 128, 1.0f}, /* verification-sized, MHA, 2 splits */
        {4, 253, 6, 3, 96, 4.0f},   /* rows across the split boundary at 256 */
        {3, 1000, 4, 1, 64, 2.0f},  /* 4 splits, MQA */
        {1, 0, 2, 1, 32, 1.0f},     /* a single position */
        {3, 700, 24, 8, 128, 1.0f}, /* the 3B shape's heads, GQA 3:1, 3 splits */
        {4, 270, 4, 2, 256, 1.0f},  /* head_dim 256: 8 key elements a lane, 4 rows ahead */
        {2, 40, 2, 1, 160, 1.0f},   /* head_dim 160: lanes with 5 of 8 elements */
    };
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const struct attn_shape *s = &shapes[si];
        const size_t qn = (size_t)s->n * s->n_heads * s->hd;
        const size_t kvn = (size_t)(s->pos0 + s->n) * s->n_kv * s->hd;
        const float scale = 1.0f / sqrtf((float)s->hd);
        float *q, *k, *v;
        attn_inputs(&r, s, &q, &k, &v);
        float *ref = falloc(qn), *got = falloc(qn), *got2 = falloc(qn);
        const int n_ctx = s->pos0 + s->n;
        struct kern_kv_layout kv;
        OK(f->cpu->ops->attention(f->cpu, ref, q, k, v, s->n, contig_kv(&kv, s->n, s->pos0, n_ctx),
                                  s->n_heads, s->n_kv, s->hd, scale, err));
        float *dq = dev_put(g, q, qn * sizeof(float));
        float *dk = dev_put(g, k, kvn * sizeof(float));
        float *dv = dev_put(g, v, kvn * sizeof(float));
        float *dout = NULL;
        OK(g->ops->alloc(g, qn * sizeof(float), (void **)&dout, err));
        poison(g, dout, qn);
        OK(g->ops->attention(g, dout, dq, dk, dv, s->n, &kv, s->n_heads, s->n_kv, s->hd, scale,
                             err));
        dev_get(g, got, dout, qn * sizeof(float));
        char what[96];
        snprintf(what, sizeof(what), "attention n=%d pos0=%d heads=%d/%d hd=%d", s->n, s->pos0,
                 s->n_heads, s->n_kv, s->hd);
        /* outputs are convex combinations of v in [-1, 1]: absolute error */
        assert_int_equal(count_mismatches(what, got, ref, qn, 5e-6, 1e-5, NULL), 0);
        /* the per-head and the grouped kernel: the same bits as AUTO's */
        const enum kern_cuda_attn_path paths[2] = {KERN_CUDA_ATTN_PER_HEAD,
                                                   KERN_CUDA_ATTN_GROUPED};
        for (int pi = 0; pi < 2; pi++) {
            OK(kern_cuda_set_attention_path(g, paths[pi], err));
            poison(g, dout, qn);
            OK(g->ops->attention(g, dout, dq, dk, dv, s->n, &kv, s->n_heads, s->n_kv, s->hd,
                                 scale, err));
            dev_get(g, got2, dout, qn * sizeof(float));
            char pwhat[128];
            snprintf(pwhat, sizeof pwhat, "%s, %s kernel", what, pi ? "grouped" : "per-head");
            assert_int_equal(count_bit_diffs(pwhat, got2, got, qn), 0);
        }
        OK(kern_cuda_set_attention_path(g, KERN_CUDA_ATTN_AUTO, err));
        /* out aliasing q: same bits */
        OK(g->ops->attention(g, dq, dq, dk, dv, s->n, &kv, s->n_heads, s->n_kv, s->hd, scale,
                             err));
        dev_get(g, got2, dq, qn * sizeof(float));
        assert_int_equal(count_bit_diffs(what, got2, got, qn), 0);
        g->ops->free(g, dout);
        g->ops->free(g, dq);
        g->ops->free(g, dk);
        g->ops->free(g, dv);
        free(q);
        free(k);
        free(v);
        free(ref);
        free(got);
        free(got2);
    }
}

static void test_cuda_attention_is_batch_invariant(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {10};
    const struct attn_shape shapes[] = {
        {17, 245, 4, 2, 64, 2.0f}, /* positions 245..261 cross the split at 256 */
        {17, 0, 8, 2, 128, 1.0f},  /* prefill-like start */
        {3, 700, 4, 4, 64, 1.0f},  /* three splits */
        {9, 250, 4, 2, 256, 1.0f}, /* head_dim 256 (the wider key registers) */
    };
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const struct attn_shape *s = &shapes[si];
        const size_t row = (size_t)s->n_heads * s->hd;
        const size_t qn = (size_t)s->n * row;
        const size_t kvn = (size_t)(s->pos0 + s->n) * s->n_kv * s->hd;
        const float scale = 1.0f / sqrtf((float)s->hd);
        float *q, *k, *v;
        attn_inputs(&r, s, &q, &k, &v);
        float *all = falloc(qn), *one = falloc(row);
        float *dq = dev_put(g, q, qn * sizeof(float));
        float *dk = dev_put(g, k, kvn * sizeof(float));
        float *dv = dev_put(g, v, kvn * sizeof(float));
        float *dout = NULL;
        OK(g->ops->alloc(g, qn * sizeof(float), (void **)&dout, err));
        poison(g, dout, qn);
        const int n_ctx = s->pos0 + s->n;
        struct kern_kv_layout kv;
        OK(g->ops->attention(g, dout, dq, dk, dv, s->n, contig_kv(&kv, s->n, s->pos0, n_ctx),
                             s->n_heads, s->n_kv, s->hd, scale, err));
        dev_get(g, all, dout, qn * sizeof(float));
        for (int i = 0; i < s->n; i++) {
            poison(g, dout, row);
            OK(g->ops->attention(g, dout, dq + (size_t)i * row, dk, dv, 1,
                                 contig_kv(&kv, 1, s->pos0 + i, n_ctx), s->n_heads, s->n_kv,
                                 s->hd, scale, err));
            dev_get(g, one, dout, row * sizeof(float));
            char what[96];
            snprintf(what, sizeof(what), "attention position %d alone vs in n=%d", s->pos0 + i,
                     s->n);
            assert_int_equal(count_bit_diffs(what, one, all + (size_t)i * row, row), 0);
        }
        g->ops->free(g, dout);
        g->ops->free(g, dq);
        g->ops->free(g, dk);
        g->ops->free(g, dv);
        free(q);
        free(k);
        free(v);
        free(all);
        free(one);
    }
}

/* rope_kv_store = rope(q), rope(k), kv_store(k, v), bit for bit: the
 * rotated q and k and both whole pools (untouched rows keep the poison).
 * The kernel takes each angle's sincosf once for a stride of heads: shapes
 * with one head a thread, several (the 3B shape), a stride that leaves
 * threads idle (half = 48) and more pairs than threads (half = 320). */
static void rope_kv_store_case(struct kern_backend *g, struct rng *r, int heads, int n_kv, int hd)
{
    char err[ERR_MSG_MAX] = "";
    enum { N = 5, BS = 4, N_BLOCKS = 16, STRIDE = 8 };
    int32_t tables[2][STRIDE] = {{3, 9, 1, 12, -1, -1, -1, -1}, {5, 0, 7, -1, -1, -1, -1, -1}};
    const int32_t rows[2 * N] = {0, 13, 0, 14, 1, 3, 1, 4, 1, 10};
    const int32_t positions[N] = {13, 14, 3, 4, 10};
    const struct kern_kv_layout kv = {.block_size = BS, .n_blocks = N_BLOCKS, .n_seqs = 2,
                                      .table_stride = STRIDE, .tables = &tables[0][0],
                                      .rows = rows};
    float *inv_freq = falloc((size_t)hd / 2);
    for (int j = 0; j < hd / 2; j++)
        inv_freq[j] = powf(500000.0f, -2.0f * (float)j / (float)hd);
    const size_t qn = (size_t)N * heads * hd, kvn = (size_t)N * n_kv * hd,
                 pool_n = (size_t)N_BLOCKS * BS * n_kv * hd;
    float *q = falloc(qn), *k = falloc(kvn), *v = falloc(kvn);
    fill(r, q, qn, 2.0f);
    fill(r, k, kvn, 2.0f);
    fill(r, v, kvn, 1.0f);
    float *dq[2], *dk[2], *dv, *kp[2], *vp[2];
    for (int w = 0; w < 2; w++) {
        dq[w] = dev_put(g, q, qn * sizeof(float));
        dk[w] = dev_put(g, k, kvn * sizeof(float));
        OK(g->ops->alloc(g, pool_n * sizeof(float), (void **)&kp[w], err));
        OK(g->ops->alloc(g, pool_n * sizeof(float), (void **)&vp[w], err));
        poison(g, kp[w], pool_n);
        poison(g, vp[w], pool_n);
    }
    dv = dev_put(g, v, kvn * sizeof(float));
    OK(g->ops->rope(g, dq[0], positions, N, heads, hd, inv_freq, err));
    OK(g->ops->rope(g, dk[0], positions, N, n_kv, hd, inv_freq, err));
    OK(g->ops->kv_store(g, kp[0], vp[0], dk[0], dv, N, &kv, n_kv * hd, err));
    OK(g->ops->rope_kv_store(g, dq[1], dk[1], dv, positions, N, heads, n_kv, hd, inv_freq, kp[1],
                             vp[1], &kv, err));
    float *a = falloc(pool_n > qn ? pool_n : qn), *b = falloc(pool_n > qn ? pool_n : qn);
    const struct {
        const char *what;
        float *const *bufs;
        size_t count;
    } cmp[4] = {{"q", dq, qn}, {"k", dk, kvn}, {"k pool", kp, pool_n}, {"v pool", vp, pool_n}};
    for (int c = 0; c < 4; c++) {
        char what[96];
        snprintf(what, sizeof what, "rope_kv_store heads=%d kv=%d hd=%d: %s", heads, n_kv, hd,
                 cmp[c].what);
        dev_get(g, a, cmp[c].bufs[0], cmp[c].count * sizeof(float));
        dev_get(g, b, cmp[c].bufs[1], cmp[c].count * sizeof(float));
        assert_int_equal(count_bit_diffs(what, b, a, cmp[c].count), 0);
    }
    for (int w = 0; w < 2; w++) {
        g->ops->free(g, dq[w]);
        g->ops->free(g, dk[w]);
        g->ops->free(g, kp[w]);
        g->ops->free(g, vp[w]);
    }
    g->ops->free(g, dv);
    free(a);
    free(b);
    free(q);
    free(k);
    free(v);
    free(inv_freq);
}

static void test_cuda_rope_kv_store_equals_separate(void **state)
{
    struct fixture *f = *state;
    struct rng r = {43};
    const int shapes[][3] = {
        {6, 2, 32},   /* half 16: 16 heads in parallel, one head a thread */
        {24, 8, 128}, /* the 3B shape: half 64, 4 in parallel, 8 heads a thread */
        {6, 3, 96},   /* half 48: 5 in parallel, 16 threads idle */
        {2, 1, 640},  /* half 320 > 256 threads: a thread takes two j */
    };
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        rope_kv_store_case(f->gpu, &r, shapes[c][0], shapes[c][1], shapes[c][2]);
}

/* Sequences in scattered blocks of a pool that crosses the 256-position
 * split: kv_store on the GPU writes the same bits as on the CPU, and every
 * paged row is bit-identical to the same row over a contiguous copy of its
 * sequence, alone, and agrees with the CPU's paged attention. */
static void test_cuda_paged_attention_equals_contiguous(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {11};
    enum { N_SEQ = 3, BS = 16, N_BLOCKS = 48, HEADS = 8, N_KV = 2, HD = 64, STRIDE = 20 };
    static const int len[N_SEQ] = {300, 7, 40};
    int32_t tables[N_SEQ][STRIDE];
    /* blocks dealt out backwards and interleaved between the sequences */
    int next = N_BLOCKS - 1;
    for (int b = 0; b < STRIDE; b++)
        for (int s = 0; s < N_SEQ; s++)
            tables[s][b] = b * BS < len[s] ? next-- : -1;
    const int kv_dim = N_KV * HD, row = HEADS * HD;
    int total = 0;
    for (int s = 0; s < N_SEQ; s++)
        total += len[s];
    int32_t *rows = (int32_t *)malloc((size_t)total * 2 * sizeof(int32_t));
    assert_non_null(rows);
    int i = 0;
    for (int s = 0; s < N_SEQ; s++)
        for (int t = 0; t < len[s]; t++, i++) {
            rows[2 * i] = s;
            rows[2 * i + 1] = t;
        }
    const struct kern_kv_layout kv = {.block_size = BS, .n_blocks = N_BLOCKS, .n_seqs = N_SEQ,
                                      .table_stride = STRIDE, .tables = &tables[0][0],
                                      .rows = rows};
    const size_t pool_n = (size_t)N_BLOCKS * BS * kv_dim, kvn = (size_t)total * kv_dim,
                 qn = (size_t)total * row;
    float *k = falloc(kvn), *v = falloc(kvn), *q = falloc(qn);
    fill(&r, k, kvn, 1.0f);
    fill(&r, v, kvn, 1.0f);
    fill(&r, q, qn, 2.0f);
    float *cpu_k = falloc(pool_n), *cpu_v = falloc(pool_n), *got_k = falloc(pool_n);
    OK(f->cpu->ops->kv_store(f->cpu, cpu_k, cpu_v, k, v, total, &kv, kv_dim, err));
    float *dk = dev_put(g, k, kvn * sizeof(float)), *dv = dev_put(g, v, kvn * sizeof(float));
    float *dkp = dev_put(g, cpu_k, pool_n * sizeof(float)); /* zeros where nothing is stored */
    float *dvp = dev_put(g, cpu_v, pool_n * sizeof(float));
    poison(g, dkp, pool_n);
    poison(g, dvp, pool_n);
    OK(g->ops->kv_store(g, dkp, dvp, dk, dv, total, &kv, kv_dim, err));
    dev_get(g, got_k, dkp, pool_n * sizeof(float));
    /* only the stored rows are compared: the rest is poison on the GPU */
    for (int j = 0; j < total; j++) {
        const int32_t *tab = tables[rows[2 * j]];
        const int t = rows[2 * j + 1];
        const size_t off = ((size_t)tab[t / BS] * BS + (size_t)(t % BS)) * kv_dim;
        assert_int_equal(count_bit_diffs("kv_store row", got_k + off, cpu_k + off, kv_dim), 0);
    }
    const float scale = 1.0f / sqrtf((float)HD);
    float *ref = falloc(qn), *got = falloc(qn), *one = falloc(row);
    OK(f->cpu->ops->attention(f->cpu, ref, q, cpu_k, cpu_v, total, &kv, HEADS, N_KV, HD, scale,
                              err));
    float *dq = dev_put(g, q, qn * sizeof(float)), *dout = NULL;
    OK(g->ops->alloc(g, qn * sizeof(float), (void **)&dout, err));
    poison(g, dout, qn);
    OK(g->ops->attention(g, dout, dq, dkp, dvp, total, &kv, HEADS, N_KV, HD, scale, err));
    dev_get(g, got, dout, qn * sizeof(float));
    assert_int_equal(count_mismatches("paged attention vs cpu", got, ref, qn, 5e-6, 1e-5, NULL), 0);
    i = 0;
    for (int s = 0; s < N_SEQ; s++) {
        const size_t first = (size_t)(i)*kv_dim;
        for (int t = 0; t < len[s]; t++, i++) {
            if (t % 37 != 0 && t != len[s] - 1)
                continue; /* a spread of positions, both sides of the split */
            struct kern_kv_layout ckv;
            poison(g, dout, row);
            OK(g->ops->attention(g, dout, dq + (size_t)i * row, dk + first, dv + first, 1,
                                 contig_kv(&ckv, 1, t, len[s]), HEADS, N_KV, HD, scale, err));
            dev_get(g, one, dout, row * sizeof(float));
            char what[96];
            snprintf(what, sizeof what, "paged vs contiguous seq %d position %d", s, t);
            assert_int_equal(count_bit_diffs(what, one, got + (size_t)i * row, row), 0);
        }
    }
    g->ops->free(g, dout);
    g->ops->free(g, dq);
    g->ops->free(g, dk);
    g->ops->free(g, dv);
    g->ops->free(g, dkp);
    g->ops->free(g, dvp);
    free(rows);
    free(k);
    free(v);
    free(q);
    free(cpu_k);
    free(cpu_v);
    free(got_k);
    free(ref);
    free(got);
    free(one);
}

/* int8 and int4 weights (matmul_quant.cu): against the CPU's fixed order
 * within the f32 bound (relative to sum_k |w x|, times the row scale for
 * int8), and every row alone equal bit for bit to the same row in calls of
 * every row count of the invariance test, through every path (one kernel
 * takes them all). */
static void test_cuda_matmul_quantized(void **state)
{
    struct fixture *f = *state;
    struct kern_backend *g = f->gpu;
    char err[ERR_MSG_MAX] = "";
    struct rng r = {11};
    static const enum kern_dtype qdt[2] = {KERN_DTYPE_Q8, KERN_DTYPE_Q4};
    static const int shapes[3][2] = {{256, 37}, {1024, 100}, {2080, 29}};
    int ns[300];
    const int n_ns = invariance_row_counts(ns);
    for (int t = 0; t < 2; t++)
        for (int si = 0; si < 3; si++) {
            const enum kern_dtype dt = qdt[t];
            const int d_in = shapes[si][0], d_out = shapes[si][1];
            const size_t x_count = (size_t)INV_N_MAX * d_in, o_count = (size_t)INV_N_MAX * d_out;
            float *wf = falloc((size_t)d_out * d_in), scale[100];
            void *w = make_quantized(&r, dt, d_out, d_in, wf, scale);
            const size_t w_bytes = dt == KERN_DTYPE_Q8 ? kern_q8_bytes(d_out, d_in) : kern_q4_bytes(d_out, d_in);
            float *x = falloc(x_count);
            fill(&r, x, x_count, 1.0f);
            void *dw = dev_put(g, w, w_bytes);
            float *dx = dev_put(g, x, x_count * sizeof(float));
            float *dout = NULL;
            OK(g->ops->alloc(g, o_count * sizeof(float), (void **)&dout, err));
            float *single = falloc(o_count), *got = falloc(o_count), *ref = falloc(o_count);
            const int n_alone = 40;
            poison(g, dout, o_count);
            for (int i = 0; i < n_alone; i++)
                OK(g->ops->matmul(g, dout + (size_t)i * d_out, dx + (size_t)i * d_in, dw, dt, 1, d_in, d_out, err));
            dev_get(g, single, dout, (size_t)n_alone * d_out * sizeof(float));
            OK(f->cpu->ops->matmul(f->cpu, ref, x, w, dt, n_alone, d_in, d_out, err));
            /* the CPU's integer contract (qdot.h) computed the same way:
             * the CPU's bits */
            char what[128];
            snprintf(what, sizeof(what), "matmul %s d_in=%d d_out=%d rows alone vs cpu", kern_dtype_name(dt), d_in,
                     d_out);
            assert_int_equal(count_bit_diffs(what, single, ref, (size_t)n_alone * d_out), 0);
            /* every row count, every path: the rows alone's bits */
            for (size_t pi = 0; pi < N_EXACT_PATHS; pi++)
                for (int ni = 0; ni < n_ns; ni++) {
                    const int n = ns[ni];
                    if (n > n_alone)
                        continue;
                    poison(g, dout, (size_t)n * d_out);
                    OK(kern_cuda_matmul_path(g, exact_paths[pi], dout, dx, dw, dt, n, d_in, d_out, err));
                    dev_get(g, got, dout, (size_t)n * d_out * sizeof(float));
                    snprintf(what, sizeof(what), "matmul %s d_in=%d n=%d path %s vs rows alone",
                             kern_dtype_name(dt), d_in, n, exact_path_names[pi]);
                    assert_int_equal(count_bit_diffs(what, got, single, (size_t)n * d_out), 0);
                }
            /* cuBLAS has no such weights: said, not computed */
            assert_int_equal(kern_cuda_matmul_path(g, KERN_CUDA_MM_CUBLAS, dout, dx, dw, dt, 1, d_in, d_out, err),
                             ERR_UNSUPPORTED);
            g->ops->free(g, dout);
            g->ops->free(g, dx);
            g->ops->free(g, dw);
            free(single);
            free(got);
            free(ref);
            free(x);
            free(w);
            free(wf);
        }
}

int main(void)
{
    if (gpu_skip_without_device())
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_device_is_named_by_uuid),
        cmocka_unit_test(test_cuda_memory_ops_roundtrip),
        cmocka_unit_test(test_cuda_upload_staged_is_stream_ordered),
        cmocka_unit_test(test_cuda_map_weights_out_of_memory_names_sizes),
        cmocka_unit_test(test_cuda_embed_matches_cpu),
        cmocka_unit_test(test_cuda_rmsnorm_matches_cpu),
        cmocka_unit_test(test_cuda_add_rmsnorm_equals_add_then_rmsnorm),
        cmocka_unit_test(test_cuda_rope_matches_cpu),
        cmocka_unit_test(test_cuda_swiglu_and_add_match_cpu),
        cmocka_unit_test(test_cuda_matmul_small_matches_cpu),
        cmocka_unit_test(test_cuda_matmul_prefill_matches_cpu),
        cmocka_unit_test(test_cuda_matmul_is_batch_invariant),
        cmocka_unit_test(test_cuda_matmul_llama_rows_are_invariant),
        cmocka_unit_test(test_cuda_matmul_tiled_threshold_from_env),
        cmocka_unit_test(test_cuda_matmul_multi_equals_separate),
        cmocka_unit_test(test_cuda_matmul_swiglu_equals_separate),
        cmocka_unit_test(test_cuda_matmul_cublas_reference),
        cmocka_unit_test(test_cuda_matmul_quantized),
        cmocka_unit_test(test_cuda_attention_matches_cpu),
        cmocka_unit_test(test_cuda_attention_is_batch_invariant),
        cmocka_unit_test(test_cuda_paged_attention_equals_contiguous),
        cmocka_unit_test(test_cuda_rope_kv_store_equals_separate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
