/* kernels.c: dtype helpers shared by every backend. */
#include "kernels.h"

size_t kern_dtype_size(enum kern_dtype dtype)
{
    switch (dtype) {
    case KERN_DTYPE_BF16: return 2;
    case KERN_DTYPE_F16: return 2;
    case KERN_DTYPE_F32: return 4;
    }
    return 0;
}

const char *kern_dtype_name(enum kern_dtype dtype)
{
    switch (dtype) {
    case KERN_DTYPE_BF16: return "BF16";
    case KERN_DTYPE_F16: return "F16";
    case KERN_DTYPE_F32: return "F32";
    }
    return "?";
}
