/* toolchain_probe.h: a C entry into the CUDA build, see toolchain_probe.cu. */
#ifndef TANDEM_CUDA_TOOLCHAIN_PROBE_H
#define TANDEM_CUDA_TOOLCHAIN_PROBE_H
#ifdef __cplusplus
extern "C" {
#endif
/* Returns 0 and the device count (0 without a GPU) and cuBLAS version (0 when
 * no device); -1 when a device exists but does not work. */
int cuda_toolchain_probe(int *n_devices_out, int *cublas_version_out);
#ifdef __cplusplus
}
#endif
#endif
