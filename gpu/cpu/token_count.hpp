#pragma once
/// The tile kernels' token counts as template arguments (cpu/quant_dot*.cpp).

#include <algorithm>
#include <type_traits>
#include <utility>

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

}  // namespace weft::gpu::cpu
