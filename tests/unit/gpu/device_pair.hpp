#pragma once
// Test helpers: one device and the buffers a test puts on it, random inputs, and a printed,
// checked comparison of a CPU result with another device's (the CUDA-vs-CPU tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/ggml_types.hpp"
#include "gpu/tensor_view.hpp"

namespace weft::gpu::testing {

/// One device and the buffers a test put on it.
struct dev_ctx {
  std::unique_ptr<device> d;
  std::vector<device_buffer> bufs;
  explicit dev_ctx(const std::string& kind) {
    auto r = device_registry::instance().create(kind, device_config{2, 0});
    if (r.ok()) d = std::move(r.value());
  }
  ~dev_ctx() {
    if (d)
      for (auto& b : bufs) d->release(b);
  }
  dev_ctx(const dev_ctx&) = delete;
  dev_ctx& operator=(const dev_ctx&) = delete;
  void* alloc(size_t bytes) {
    auto b = d->allocate(std::max<size_t>(bytes, 64));
    EXPECT_TRUE(b.ok());
    if (!b.ok()) return nullptr;
    bufs.push_back(*b);
    return b->data;
  }
  template <class T>
  T* up(const std::vector<T>& v) {
    void* p = alloc(v.size() * sizeof(T));
    EXPECT_TRUE(d->copy_to_device(p, v.data(), v.size() * sizeof(T)).ok());
    return static_cast<T*>(p);
  }
  float* zeros(size_t n) { return static_cast<float*>(alloc(n * sizeof(float))); }
  template <class T>
  std::vector<T> down(const T* p, size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(d->copy_to_host(v.data(), p, n * sizeof(T)).ok());
    EXPECT_TRUE(d->synchronize().ok());
    return v;
  }
  tensor_view weights(ggml_type t, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
    tensor_view v;
    v.type = t;
    v.data = up(bytes);
    v.n_rows = rows;
    v.n_cols = cols;
    v.row_bytes = *row_size_bytes(t, cols);
    v.mat_bytes = v.row_bytes * static_cast<size_t>(rows);
    return v;
  }
};

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Largest |cpu - gpu| relative to the largest |cpu|; printed, and checked against `rel_tol`.
inline void expect_close(const char* what, const std::vector<float>& cpu,
                         const std::vector<float>& gpu, double rel_tol) {
  ASSERT_EQ(cpu.size(), gpu.size());
  double max_abs = 0, scale = 0;
  size_t worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = std::fabs(double(cpu[i]) - double(gpu[i]));
    if (!(e <= max_abs)) {
      max_abs = e;
      worst = i;
    }
    scale = std::max(scale, double(std::fabs(cpu[i])));
  }
  const double rel = max_abs / std::max(scale, 1e-30);
  std::printf("[op] %-28s max|cpu-gpu| %.3g, scale %.3g, relative %.3g (worst at %zu: %g vs %g)\n",
              what, max_abs, scale, rel, worst, double(cpu[worst]), double(gpu[worst]));
  EXPECT_LE(rel, rel_tol) << what;
}

#define WEFT_BOTH_DEVICES                                                                         \
  dev_ctx cpu("cpu"), gpu("cuda");                                                                \
  if (!gpu.d) GTEST_SKIP() << "no CUDA device can be opened here (the CUDA backend did not run)"; \
  ASSERT_TRUE(cpu.d)

}  // namespace weft::gpu::testing
