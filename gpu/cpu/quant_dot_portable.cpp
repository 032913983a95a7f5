// The portable reference implementations of the quantized kernels: the bit-exact definition the
// SIMD kernels of quant_dot.cpp are tested against, and the kernels of a build without AVX2.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu {

namespace {

/// Scale of a 32-value activation block quantized to int8 (d) and its inverse (id; 0 for an
/// all-zero block).
struct q8_scale {
  float d, id;
};

inline q8_scale block_q8_scale(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  return {amax / 127.f, amax != 0.0f ? 127.f / amax : 0.0f};
}

inline int nibble(const uint8_t* qs, int e) {
  return e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
}

}  // namespace

void quantize_act_q8_0_portable(const float* x, block_q8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    const auto [d, id] = block_q8_scale(x);
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) y[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
  }
}

void quantize_act_q8_1_portable(const float* x, block_q8_1* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    const auto [d, id] = block_q8_scale(x);
    y[b].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(x[j] * id));
      y[b].qs[j] = static_cast<int8_t>(q);
      sum += q;
    }
    y[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

float dot_q4_0_q8_0_portable(const block_q4_0* w, const block_q8_0* a, int64_t n_blocks) {
  float acc[8] = {};
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = fp16_to_fp32(w[b].d) * fp16_to_fp32(a[b].d);
    for (int l = 0; l < 8; ++l) {
      int s = 0;
      for (int k = 0; k < 4; ++k) s += (nibble(w[b].qs, 4 * l + k) - 8) * a[b].qs[4 * l + k];
      acc[l] = std::fma(d, static_cast<float>(s), acc[l]);
    }
  }
  return reduce8(acc);
}

float dot_q4_1_q8_1_portable(const block_q4_1* w, const block_q8_1* a, int64_t n_blocks) {
  float acc[8] = {};
  float summs = 0.0f;
  for (int64_t b = 0; b < n_blocks; ++b) {
    summs += fp16_to_fp32(w[b].m) * fp16_to_fp32(a[b].s);
    const float d = fp16_to_fp32(w[b].d) * fp16_to_fp32(a[b].d);
    for (int l = 0; l < 8; ++l) {
      int s = 0;
      for (int k = 0; k < 4; ++k) s += nibble(w[b].qs, 4 * l + k) * a[b].qs[4 * l + k];
      acc[l] = std::fma(d, static_cast<float>(s), acc[l]);
    }
  }
  return reduce8(acc) + summs;
}

float dot_q8_0_q8_0_portable(const block_q8_0* w, const block_q8_0* a, int64_t n_blocks) {
  float acc[8] = {};
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = fp16_to_fp32(w[b].d) * fp16_to_fp32(a[b].d);
    for (int l = 0; l < 8; ++l) {
      int s = 0;
      for (int k = 0; k < 4; ++k) s += w[b].qs[4 * l + k] * a[b].qs[4 * l + k];
      acc[l] = std::fma(d, static_cast<float>(s), acc[l]);
    }
  }
  return reduce8(acc);
}

}  // namespace weft::gpu::cpu
