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

/// Softmax of one row in place: exp in float, sum in double per 8- or 16-element chunk (the ggml
/// SIMD layout), scaled by 1/sum.
void softmax_row(float* x, int64_t n);

/// x[i] = e^(x[i] - max) for i < n, returning the sum in double, as ggml_vec_soft_max_f32 computes
/// it in the active ggml SIMD layout: the vector `exp` and a horizontal add per 8 or 16 elements,
/// the C library's expf for the tail. -inf entries (masked) become exactly 0.
double exp_sum_row(float* x, int64_t n, float max);
/// exp_sum_row one element at a time (exp_approx per element): the reference the vectorised
/// AVX-512 path is tested against bit for bit.
double exp_sum_row_scalar(float* x, int64_t n, float max);

/// y[i] = e^((x[i] - max) * scale) for i < n (y may be null), returning Σ y[i] in double; for
/// x[i] <= max and scale > 0: the sampler's normalisers and probabilities, not ggml's bits.
/// Vectorised (AVX-512 or AVX2 where the build has them: exp_approx's reduction and polynomial in
/// float, ~1.5 ulp, each term added in double); arguments below -87 count as -87 (-inf and NaN
/// entries included: e^-87 ~ 1.6e-38). Elsewhere the C library's exp.
double exp_scaled_below(const float* x, float* y, int64_t n, float max, float scale);
/// Σ e^(x[i] - max) (exp_scaled_below without the values).
inline double exp_sum_below(const float* x, int64_t n, float max) {
  return exp_scaled_below(x, nullptr, n, max, 1.0f);
}

/// The largest non-NaN x[i] (-inf if none) and the first index holding it: std::max_element's
/// answer (index 0 when x[0] is NaN, NaNs elsewhere ignored). Vectorised where the build has
/// AVX-512 or AVX2 (a max pass, then a compare pass): the sampler's argmax over a 49k vocabulary.
int64_t first_max_index(const float* x, int64_t n, float* max);

/// Training's SwiGLU (gpu/train), forward: h = g·σ(g)·u with σ(g) = 1 / (1 + e^-g), e^x by
/// exp_approx's reduction and polynomial (~1.5 ulp) on arguments clamped to [-87, 88]. Vectorised
/// with AVX-512 or AVX2 where the build has them; every element is computed by the same
/// instructions wherever it sits (the tail goes through the vector code too), so a result does not
/// depend on how a batch is cut.
void silu_mul_forward(const float* g, const float* u, float* h, int64_t n);
/// Its backward: du = dh·g·σ(g), dg = dh·u·σ(g)·(1 + g·(1 − σ(g))).
void silu_mul_backward(const float* g, const float* u, const float* dh, float* dg, float* du,
                       int64_t n);
/// Dequantizes one row of `table` (f32, f16, q8_0, q4_0, q4_1, ...) into y.
status get_row(const tensor_view& table, int64_t row, float* y);

/// e^x as llama.cpp's vectorised CPU code computes it (a range reduction to 2^n * e^b and a
/// degree-5 polynomial, max error ~1.5 ulp; ARM optimized-routines' algorithm). Used by softmax and
/// SiLU so that weft's probabilities match llama.cpp's bit for bit. The AVX-512 and AVX2 builds
/// finish differently (scale by 2^n after adding 1, versus k + k * p with k = 2^n), so each has a
/// function; `exp_approx` uses the active ggml SIMD layout.
float exp_approx(float x);
float exp_approx_avx512(float x);
float exp_approx_avx2(float x);

/// Sum of 16 floats in the tree order of a 512-bit horizontal add.
float reduce16(const float* v);
/// Sum of 8 floats in the tree order of a 256-bit horizontal add (hi + lo, then pairs).
float reduce8(const float* v);

}  // namespace weft::gpu::cpu
