#pragma once
/// Row-wise and element-wise kernels of the CPU backend (single-threaded over a given range; the
/// CPU device splits work across its pool). Numerics follow ggml's CPU backend where it matters for
/// matching llama.cpp (double accumulation in RMSNorm, iterated theta in RoPE).

#include <cstdint>

#include "gpu/compute_ops.hpp"

namespace weft::gpu::cpu {

/// RMSNorm of rows [row_begin, row_end) of x ([rows][dim]), times `weight` (may be null).
void rms_norm_rows(const float* x, const float* weight, float* y, int64_t row_begin,
                   int64_t row_end, int64_t dim, float eps);

/// Fills cos/sin for one position: cache[2i] = cos, cache[2i+1] = sin for i < n_dims / 2.
void rope_cache(float* cache, int32_t position, const rope_config& config);

/// Rotates one head (head_dim values) in place with a cache from rope_cache.
void rope_head(float* x, const float* cache, const rope_config& config);

/// y = silu(g) * u over [begin, end).
void swiglu_range(const float* g, const float* u, float* y, int64_t begin, int64_t end);

/// y = a + b over [begin, end).
void add_range(const float* a, const float* b, float* y, int64_t begin, int64_t end);

/// Softmax of one row in place: exp in float, sum in double per 16-element chunk, scaled by 1/sum.
void softmax_row(float* x, int64_t n);

/// Dequantizes one row of `table` (f32, f16, q8_0, q4_0, q4_1, ...) into y.
status get_row(const tensor_view& table, int64_t row, float* y);

/// e^x as llama.cpp's vectorised CPU code computes it (a range reduction to 2^n * e^b and a
/// degree-5 polynomial, max error ~1.5 ulp; ARM optimized-routines' algorithm). Used by softmax and
/// SiLU so that weft's probabilities match llama.cpp's bit for bit.
float exp_approx(float x);

/// Sum of 16 floats in the tree order of a 512-bit horizontal add.
float reduce16(const float* v);

}  // namespace weft::gpu::cpu
