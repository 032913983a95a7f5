#pragma once
// Helpers the CPU kernel tests share (ops_test.cpp, attention_test.cpp).

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu::test_support {

/// n normally distributed floats (mean 0, standard deviation `scale`), the same for a seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Restores the process-wide ggml SIMD layout when a test that switches it ends.
struct simd_layout_guard {
  ggml_simd saved = ggml_simd_layout();
  ~simd_layout_guard() { set_ggml_simd_layout(saved); }
};

/// A test run once per ggml lane layout (instantiate with both values of ggml_simd).
class simd_layouts : public ::testing::TestWithParam<ggml_simd> {
 protected:
  void SetUp() override { set_ggml_simd_layout(GetParam()); }
  simd_layout_guard guard_;
};

}  // namespace weft::gpu::cpu::test_support
