#pragma once
/// What the quantized tile kernels of cpu/quant_dot.cpp and cpu/quant_dot_packed.cpp share: their
/// token counts as template arguments, and the Q4_1 min terms.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#if defined(__AVX2__) && defined(__FMA__)
#include "gpu/cpu/simd.hpp"
#endif

#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu {

/// Calls f(std::integral_constant<int, n>) for n = n_tok clamped to 1..Max: the tile kernels take
/// their token count as a template argument so that their accumulators stay in registers.
template <int Max, class F>
void with_token_count(int n_tok, F&& f) {
  const int n = std::clamp(n_tok, 1, Max);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((n == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }
  (std::make_integer_sequence<int, Max>{});
}

#if defined(__AVX2__) && defined(__FMA__)
/// Adds a 4-row tile's Q4_1 min terms to out[j][0..3] for its T tokens: lane j of row r's vector
/// is token j's chain over the blocks, fma(m_r, s_j, ·) per block as in the one-row function, so
/// the bits are its bits; lanes past T read the scales' padding and are dropped. `mins(b, m)`
/// writes block b's four row minimums m[0..3] (as floats) for the tile's own weight layout.
template <int T, class Mins>
[[gnu::always_inline]] inline void add_min_terms(const act_scales& sc, int64_t n_blocks,
                                                 Mins&& mins, float* const* out) {
  __m256 v[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  for (int64_t b = 0; b < n_blocks; ++b) {
    alignas(16) float m[4];
    mins(b, m);
    const __m256 sa = _mm256_loadu_ps(sc.s + b * sc.stride);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) v[r] = _mm256_fmadd_ps(_mm256_set1_ps(m[r]), sa, v[r]);
  }
  alignas(32) float summs[4][8];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) _mm256_store_ps(summs[r], v[r]);
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j)
    for (int r = 0; r < 4; ++r) out[j][r] += summs[r][j];
}
#endif

}  // namespace weft::gpu::cpu
