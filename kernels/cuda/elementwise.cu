/* elementwise.cu: cuda_swiglu (out = silu(gate) * up) and cuda_add (x += y),
 * the twins of kernels/cpu/elementwise.c.
 *
 * silu(g) = g / (1 + expf(-g)) per element in f32, each operation rounded
 * separately (expf is CUDA's, within 2 ulp: CUDA and CPU agree within
 * rounding); add is one f32 addition per element (bit-identical to the CPU).
 * Elementwise: nothing depends on n or on the grid. Grid-stride loops over
 * size_t counts. out may alias gate (each element is read, then written, by
 * one thread).
 */
#include "cuda_backend.h"

#define EW_THREADS 256

__global__ void __launch_bounds__(EW_THREADS)
    swiglu_kernel(float *out, const float *gate, const float *up, size_t count)
{
    const size_t stride = (size_t)gridDim.x * EW_THREADS;
    for (size_t k = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; k < count; k += stride) {
        const float g = gate[k];
        out[k] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[k]);
    }
}

__global__ void __launch_bounds__(EW_THREADS) add_kernel(float *x, const float *y, size_t count)
{
    const size_t stride = (size_t)gridDim.x * EW_THREADS;
    for (size_t k = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; k < count; k += stride)
        x[k] = __fadd_rn(x[k], y[k]);
}

static int swiglu_launch(struct cuda_backend *cb, float *out, const float *gate, const float *up,
                         size_t count, char *err)
{
    swiglu_kernel<<<cuda_grid_1d(count, EW_THREADS), EW_THREADS, 0, cb->stream>>>(out, gate, up,
                                                                                 count);
    CUDA_CHECK_LAUNCH("swiglu_kernel");
    return 0;
}

static int add_launch(struct cuda_backend *cb, float *x, const float *y, size_t count, char *err)
{
    add_kernel<<<cuda_grid_1d(count, EW_THREADS), EW_THREADS, 0, cb->stream>>>(x, y, count);
    CUDA_CHECK_LAUNCH("add_kernel");
    return 0;
}

int cuda_swiglu(struct kern_backend *be, float *out, const float *gate, const float *up,
                size_t count, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (count == 0)
        return 0;
    if (!out || !gate || !up)
        return error_set(err, ERR_INVALID_ARG, "cuda swiglu: NULL tensor");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    return swiglu_launch(cb, out, gate, up, count, err);
}

int cuda_add(struct kern_backend *be, float *x, const float *y, size_t count, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (count == 0)
        return 0;
    if (!x || !y)
        return error_set(err, ERR_INVALID_ARG, "cuda add: NULL tensor");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    return add_launch(cb, x, y, count, err);
}
