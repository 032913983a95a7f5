#pragma once
/// fp16 and f32 dot products of the CPU backend (attention, f16 / f32 weights), computed in the
/// lane layouts and reduction orders of llama.cpp's CPU build (see ggml_simd_layout in
/// quant_dot.hpp). Pure and thread-safe.

#include <cstdint>
#include <vector>

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
/// The activations of an f32 matmul as dot_tile_f32 reads them: `n_tokens` rows of `n` floats at
/// `x`, and (AVX-512 builds, filled by pack_f32_acts) the same rows in pairs, 8 floats of each
/// token side by side, so one 16-lane FMA advances the 8-lane chains of two tokens.
struct f32_acts {
  const float* x = nullptr;
  int64_t n_tokens = 0;
  int64_t n = 0;
  const float* pairs = nullptr;
};
/// Lays `a`'s rows out in pairs in `buf` where the build uses them (once per matmul).
void pack_f32_acts(f32_acts& a, std::vector<float>& buf);
/// Weight rows per dot_tile_f32 call, and its most tokens.
inline constexpr int f32_tile_rows = 4;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512F__)
inline constexpr int f32_tile_tokens = 8;
#else
inline constexpr int f32_tile_tokens = 4;
#endif
/// `f32_tile_rows` f32 rows (`stride` floats apart, from `w`) times tokens t0 .. t0 + n_tok - 1
/// of `a` (n_tok in 1..f32_tile_tokens, t0 even): out[j][r] = dot_f32(row r, token t0 + j),
/// bit for bit — a token's outputs do not depend on the batch it runs in. Each weight row is loaded
/// once for all the tokens, and the independent FMA chains keep the FMA units busy where one
/// dot_f32 waits on its single chain. `next` (may be null): the f32_tile_rows * n contiguous
/// floats of the next tile, prefetched into L2 along the way.
void dot_tile_f32(const float* w, int64_t stride, const f32_acts& a, int64_t t0, int n_tok,
                  float* const* out, const float* next = nullptr);

/// Prefetches the `n_bytes` bytes at `p` into the caches, one request per 64-byte line.
inline void prefetch_bytes(const void* p, int64_t n_bytes) {
  const auto* bytes = static_cast<const char*>(p);
  for (int64_t off = 0; off < n_bytes; off += 64) __builtin_prefetch(bytes + off);
}

}  // namespace weft::gpu::cpu
