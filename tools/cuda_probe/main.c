/* tandem-cuda-probe: reports the CUDA devices this binary sees and, where
 * there is one, runs a kernel and creates a cuBLAS handle. Exits 0 with "no
 * CUDA device" where there is none (CI): its job there is to have been linked. */
#include <stdio.h>

#include "cuda/toolchain_probe.h"

int main(void)
{
    int n_devices = 0, cublas_version = 0;
    int rc = cuda_toolchain_probe(&n_devices, &cublas_version);
    if (rc != 0) {
        fprintf(stderr, "tandem-cuda-probe: a CUDA device is present but does not work\n");
        return 1;
    }
    if (n_devices == 0) {
        printf("tandem-cuda-probe: linked against cudart and cuBLAS; no CUDA device here\n");
        return 0;
    }
    printf("tandem-cuda-probe: %d CUDA device(s), cuBLAS %d, test kernel ran\n", n_devices,
           cublas_version);
    return 0;
}
