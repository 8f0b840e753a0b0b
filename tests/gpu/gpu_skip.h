/* gpu_skip.h: the GPU tests' skip, one line and exit code 77 (CTest's
 * SKIP_RETURN_CODE) where no CUDA device is visible. */
#ifndef TANDEM_TESTS_GPU_SKIP_H
#define TANDEM_TESTS_GPU_SKIP_H

#include <stdio.h>

#include "error.h"
#include "kernels_cuda.h"

/* 77 after printing "SKIPPED: no CUDA device ..." where none is visible,
 * else 0. */
static inline int gpu_skip_without_device(void)
{
    char err[ERR_MSG_MAX] = "";
    int count = 0;
    if (kern_cuda_device_count(&count, err) != 0) {
        printf("SKIPPED: no CUDA device (%s)\n", err);
        return 77;
    }
    if (count == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    return 0;
}

#endif
