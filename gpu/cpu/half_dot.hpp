#pragma once
/// fp16 and f32 dot products of the CPU backend (attention, f16 / f32 weights), computed in the
/// lane layouts and reduction orders of llama.cpp's CPU build (see ggml_simd_layout in
/// quant_dot.hpp). Pure and thread-safe.

#include <cstdint>

namespace weft::gpu::cpu {

/// Dot product of two fp16 vectors with float accumulation, as ggml_vec_dot_f16 (one column):
/// 4 accumulators of 16 lanes per 64-element step (AVX-512 layout) or of 8 lanes per 32-element
/// step (AVX2 layout, see ggml_simd_layout), that layout's reduction tree, the tail in double.
float dot_f16(const uint16_t* x, const uint16_t* y, int64_t n);
/// out[d] = dot_f16(column d of V, y, n) for d < n_cols, bit for bit, where V has n rows of n_cols
/// halves: rows[i] for i < n_rows, zeros for n_rows <= i < n (padding). Reads V row by row (no
/// transpose): every (column, lane) accumulator sees its terms in dot_f16's order. `scratch` holds
/// at least 64 * n_cols floats.
void dot_f16_columns(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t n,
                     int64_t n_cols, float* scratch, float* out);
/// dot_f16_columns for n_y (1-3) weight vectors over the same rows, bit for bit, reading each row
/// once for all of them: the AVX-512 layout with 64 or 128 columns (`scratch[y]`: 64 * n_cols
/// floats each). Returns false, doing nothing, for any other case.
[[nodiscard]] bool dot_f16_columns_multi(const uint16_t* const* rows, int64_t n_rows,
                                         const uint16_t* const* ys, int n_y, int64_t n,
                                         int64_t n_cols, float* const* scratch, float* const* outs);
/// The same for dot_f16_gemm (n a multiple of the layout's lanes): out[d] = dot_f16_gemm(column d
/// of V, y, n), bit for bit.
void dot_f16_gemm_columns(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t n,
                          int64_t n_cols, float* scratch, float* out);
/// Dot product of two fp16 vectors (n a multiple of the layout's lanes) with one FMA chain per
/// lane, element i in lane i % lanes, then that layout's horizontal sum: llama.cpp's tinyBLAS GEMM,
/// which it uses for matmuls with >= 2 columns.
float dot_f16_gemm(const uint16_t* x, const uint16_t* y, int64_t n);
/// Dot product of fp16 weights and f32 activations (activations rounded to fp16 first, as ggml).
float dot_f16_f32(const uint16_t* w, const float* x, int64_t n);
/// Plain f32 dot product (8 lanes, FMA, fixed reduction order).
float dot_f32(const float* x, const float* y, int64_t n);

/// Prefetches the `n_bytes` bytes at `p` into the caches, one request per 64-byte line.
inline void prefetch_bytes(const void* p, int64_t n_bytes) {
  const auto* bytes = static_cast<const char*>(p);
  for (int64_t off = 0; off < n_bytes; off += 64) __builtin_prefetch(bytes + off);
}

}  // namespace weft::gpu::cpu
