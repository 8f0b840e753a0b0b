/* kernels.c: what every backend shares: dtype helpers and the choice of a
 * backend by name. */
#include "kernels.h"

#include <string.h>

#include "error.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels_cuda.h"
#endif

size_t kern_dtype_size(enum kern_dtype dtype)
{
    switch (dtype) {
    case KERN_DTYPE_BF16: return 2;
    case KERN_DTYPE_F16: return 2;
    case KERN_DTYPE_F32: return 4;
    case KERN_DTYPE_Q8: return 1;
    case KERN_DTYPE_Q4: return 1; /* rounded up: kern_q4_bytes for a matrix */
    }
    return 0;
}

size_t kern_q8_scales_offset(int64_t rows, int64_t cols)
{
    return ((size_t)rows * (size_t)cols + 63) & ~(size_t)63;
}

size_t kern_q4_bytes(int64_t rows, int64_t cols)
{
    return (size_t)rows * ((size_t)cols / KERN_Q4_GROUP) * KERN_Q4_GROUP_BYTES;
}

size_t kern_q8_bytes(int64_t rows, int64_t cols)
{
    return kern_q8_scales_offset(rows, cols) + (size_t)rows * sizeof(float);
}

const char *kern_dtype_name(enum kern_dtype dtype)
{
    switch (dtype) {
    case KERN_DTYPE_BF16: return "BF16";
    case KERN_DTYPE_F16: return "F16";
    case KERN_DTYPE_F32: return "F32";
    case KERN_DTYPE_Q8: return "INT8";
    case KERN_DTYPE_Q4: return "INT4";
    }
    return "?";
}

int kern_backend_create(struct kern_backend **out, const char *name, const char *device,
                        int n_threads, char *err)
{
    *out = NULL;
    if (name == NULL || strcmp(name, "cpu") == 0)
        return kern_cpu_create(out, n_threads, err);
    if (strcmp(name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "backend \"%.32s\": must be \"cpu\" or \"cuda\"",
                         name);
#ifdef TANDEM_HAVE_CUDA
    /* Ask for the device count first: its error names a missing driver or
     * device plainly, where creating a backend would fail deeper down. */
    char why[ERR_MSG_MAX];
    int count = 0;
    if (kern_cuda_device_count(&count, why) != 0)
        return error_set(err, ERR_UNAVAILABLE, "backend cuda: no usable GPU: %s", why);
    if (count == 0)
        return error_set(err, ERR_UNAVAILABLE, "backend cuda: no CUDA device is visible");
    int rc = kern_cuda_create(out, device, why);
    if (rc == ERR_NOT_FOUND || rc == ERR_CUDA)
        return error_set(err, ERR_UNAVAILABLE, "backend cuda: %s", why);
    if (rc)
        return error_set(err, rc, "backend cuda: %s", why);
    return 0;
#else
    (void)device;
    return error_set(err, ERR_UNSUPPORTED,
                     "backend cuda: this build has no CUDA backend (built without the CUDA "
                     "toolkit)");
#endif
}

void kern_backend_destroy(struct kern_backend *be)
{
    if (be)
        be->ops->destroy(be);
}
