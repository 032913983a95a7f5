#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu/cuda/runtime.cuh"

namespace weft::gpu::cuda {

int device_count() {
  int n = 0;  // cudaGetDeviceCount leaves it untouched on error
  const cudaError_t e = cudaGetDeviceCount(&n);
  return e == cudaSuccess ? n : -static_cast<int>(e);
}

std::string device_name(int index) {
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, index) == cudaSuccess ? std::string{p.name} : std::string{};
}

size_t device_memory_bytes(int index) {
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, index) == cudaSuccess ? p.totalGlobalMem : 0;
}

std::string error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int set_device(int index) {
  return static_cast<int>(cudaSetDevice(index));
}

int malloc_zeroed(void** ptr, size_t size_bytes) {
  cudaError_t e = cudaMalloc(ptr, size_bytes);
  if (e != cudaSuccess) return static_cast<int>(e);
  // cudaMemset runs on the legacy default stream, asynchronously, and the device's streams are
  // non-blocking (no implicit ordering with it): without waiting here a copy enqueued right after
  // the allocation on a compute stream can land first and be zeroed afterwards.
  e = cudaMemset(*ptr, 0, size_bytes);
  if (e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(cudaDeviceSynchronize());
}

int free_memory(void* ptr) {
  return static_cast<int>(cudaFree(ptr));
}

int stream_create(stream_handle* s) {
  cudaStream_t st = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  *s = st;
  return static_cast<int>(e);
}

int stream_destroy(stream_handle s) {
  return static_cast<int>(cudaStreamDestroy(static_cast<cudaStream_t>(s)));
}
int stream_synchronize(stream_handle s) {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
}

int memcpy_async(void* dst, const void* src, size_t size_bytes, int kind, stream_handle s) {
  const cudaMemcpyKind k = kind == 0   ? cudaMemcpyHostToDevice
                           : kind == 1 ? cudaMemcpyDeviceToHost
                                       : cudaMemcpyDeviceToDevice;
  return static_cast<int>(cudaMemcpyAsync(dst, src, size_bytes, k, static_cast<cudaStream_t>(s)));
}

int blas_create(blas_handle* h, stream_handle s) {
  cublasHandle_t handle = nullptr;
  cublasStatus_t st = cublasCreate(&handle);
  if (st != CUBLAS_STATUS_SUCCESS) return 1000 + static_cast<int>(st);
  cublasSetStream(handle, static_cast<cudaStream_t>(s));
  *h = handle;
  return 0;
}

int blas_destroy(blas_handle h) {
  return static_cast<int>(cublasDestroy(static_cast<cublasHandle_t>(h)));
}

}  // namespace weft::gpu::cuda
