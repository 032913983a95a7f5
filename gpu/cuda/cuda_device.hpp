#pragma once
/// The CUDA device: device memory, explicit streams, one kernel launcher per op (gpu/cuda/*.cu),
/// cuBLAS for f32/f16 GEMMs. Plain C++ header (no CUDA include).

#include <memory>

#include "gpu/device.hpp"

namespace weft::gpu::cuda {

/// Creates a CUDA device on GPU `config.device_index`; `unsupported` with the CUDA error text when
/// no GPU (or no driver) is present.
result<std::unique_ptr<device>> make_cuda_device(const device_config& config);
/// CUDA devices this process can use (0 without a usable driver or device).
int cuda_device_count();

}  // namespace weft::gpu::cuda
