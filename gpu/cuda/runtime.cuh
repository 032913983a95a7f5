#pragma once
// Plain C++ wrappers around the CUDA runtime and cuBLAS, implemented in runtime.cu. No CUDA header
// here: this file is included by C++ translation units (cuda_device.cpp).
#include <cstddef>
#include <string>

namespace weft::gpu::cuda {

/// Opaque CUDA stream (cudaStream_t).
using stream_handle = void*;
/// Opaque cuBLAS handle.
using blas_handle = void*;

/// Number of CUDA devices; a negative value is -(cudaError_t) (e.g. no driver / no GPU).
int device_count();
/// Name of device `index` ("" on error).
std::string device_name(int index);
/// Total memory of device `index` in bytes (0 on error).
size_t device_memory_bytes(int index);
/// Error string of a CUDA error code.
std::string error_string(int code);

int set_device(int index);
int malloc_zeroed(void** ptr, size_t size_bytes);
int free_memory(void* ptr);
int stream_create(stream_handle* s);
int stream_destroy(stream_handle s);
int stream_synchronize(stream_handle s);
/// kind: 0 host->device, 1 device->host, 2 device->device.
int memcpy_async(void* dst, const void* src, size_t size_bytes, int kind, stream_handle s);

int blas_create(blas_handle* h, stream_handle s);
int blas_destroy(blas_handle h);

}  // namespace weft::gpu::cuda
