/* toolchain_probe.cu: proves the CUDA toolchain is wired into the build.
 *
 * Compiled and linked in CI (which has no GPU) so that nvcc, cudart and cuBLAS
 * problems show up at build time, before any real kernel depends on them.
 * cuda_toolchain_probe() reports whether a device is usable right now; it
 * never aborts when none is.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/toolchain_probe.h"

__global__ static void probe_fill(float *out, float value, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = value;
}

extern "C" int cuda_toolchain_probe(int *n_devices_out, int *cublas_version_out)
{
    int n_devices = 0;
    *n_devices_out = 0;
    *cublas_version_out = 0;
    if (cudaGetDeviceCount(&n_devices) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: not an error here */
        return 0;
    }
    *n_devices_out = n_devices;
    if (n_devices == 0)
        return 0;
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS)
        return -1;
    int version = 0;
    cublasStatus_t st = cublasGetVersion(handle, &version);
    cublasDestroy(handle);
    if (st != CUBLAS_STATUS_SUCCESS)
        return -1;
    *cublas_version_out = version;
    float *buf = NULL;
    if (cudaMalloc(&buf, 256 * sizeof(float)) != cudaSuccess)
        return -1;
    probe_fill<<<1, 256>>>(buf, 1.0f, 256);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    cudaFree(buf);
    return (launch == cudaSuccess && sync == cudaSuccess) ? 0 : -1;
}
