#pragma once

// <immintrin.h> for the CPU backend's vector kernels. GCC 12's AVX-512 headers self-initialize
// the "undefined" source of some intrinsics (the masked ones among them), which its own
// -W(maybe-)uninitialized then flags wherever they are inlined; the warnings are silenced for the
// header alone. Kernels include this rather than <immintrin.h>; amx_matmul.cpp, whose
// target-attribute functions trip the same warnings where the intrinsics inline into them, turns
// them off for its whole file instead.
#if defined(__x86_64__) || defined(__i386__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

#if defined(__AVX512F__)
namespace weft::gpu::cpu {

// Sixteen 16-lane sums at once, lane k of the result summing v[0..15]'s lane k in the order of
// ggml's AVX-512 horizontal sum of 16 values (its hi + lo, v[l] + v[l + 8], then reduce8's tree:
// (t[l] + t[l + 4]), then (t[0] + t[2]) + (t[1] + t[3])). The score kernels' key lanes and the
// value sums' columns both end in it.
[[gnu::always_inline]] inline __m512 tree_sum_16(const __m512* v) {
  __m512 t8[8], t4[4];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) t8[l] = _mm512_add_ps(v[8 + l], v[l]);
#pragma GCC unroll 4
  for (int l = 0; l < 4; ++l) t4[l] = _mm512_add_ps(t8[4 + l], t8[l]);
  return _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
}

}  // namespace weft::gpu::cpu
#endif
