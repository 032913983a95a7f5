#pragma once
/// The CPU device: host memory, a spinning thread pool, AVX2/FMA kernels (portable fallback).

#include <memory>

#include "gpu/device.hpp"

namespace weft::gpu::cpu {

/// Creates a CPU device with `config.n_threads` compute threads (0 = hardware concurrency).
/// Sets OpenBLAS to one thread: the device splits sgemm across its own pool instead.
result<std::unique_ptr<device>> make_cpu_device(const device_config& config);

}  // namespace weft::gpu::cpu
