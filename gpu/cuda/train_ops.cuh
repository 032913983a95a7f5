#pragma once
// The trainer's ops on the GPU (f32), the launchers of train_ops.cu; the semantics are those of
// gpu/train/train_ops.hpp (the CPU reference). Plain C++: included by cuda_device.cpp. Every
// reduction has a fixed order (no atomics): results do not depend on timing.
#include <cstdint>

#include "gpu/cuda/runtime.cuh"

namespace weft::gpu::cuda {

int launch_linear_forward(const float* x, const float* w, int64_t n, int64_t in, int64_t out,
                          float* y, blas_handle blas);
int launch_linear_backward(const float* x, const float* w, const float* dy, int64_t n, int64_t in,
                           int64_t out, float* dx, float* dw, bool add_dx, blas_handle blas);
int launch_rms_norm_forward(const float* x, const float* g, int64_t n, int64_t d, float eps,
                            float* y, float* rstd, stream_handle s);
int launch_rms_norm_backward(const float* x, const float* g, const float* rstd, const float* dy,
                             int64_t n, int64_t d, float* dx, float* dg, stream_handle s);
/// style: 0 normal (adjacent pairs), 1 neox (halves).
int launch_train_rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const double* cos,
                      const double* sin, int64_t n_dims, int style, bool inverse, stream_handle s);

struct train_attention_args {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* out = nullptr;
  const float* lse = nullptr;
  const float* dout = nullptr;
  const int64_t* starts = nullptr;  ///< [n_seqs + 1]
  const int64_t* prefix = nullptr;  ///< [n_seqs] or null
  int64_t n_seqs = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  ///< <= 256
  float scale = 1.0f;
};
/// Writes out[n][heads * hd] and lse[n][heads].
int launch_train_attention_forward(const train_attention_args& a, float* out, float* lse,
                                   float* scratch, stream_handle s);
/// Overwrites dq, dk, dv. `scratch` holds n_tokens * n_heads floats (rowsum(dO ∘ O)).
int launch_train_attention_backward(const train_attention_args& a, float* dq, float* dk, float* dv,
                                    float* scratch, stream_handle s);
int launch_swiglu_forward(const float* gate, const float* up, int64_t n, float* h, stream_handle s);
int launch_swiglu_backward(const float* gate, const float* up, const float* dh, int64_t n,
                           float* dgate, float* dup, stream_handle s);
int launch_cross_entropy(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                         float grad_scale, float* dlogits, double* logp, stream_handle s);

int launch_fill(float* x, int64_t n, float value, stream_handle s);
/// dembd[tokens[t]] += dx[t], tokens in order (one thread per column: no atomics).
int launch_embedding_backward(const float* dx, const int32_t* tokens, int64_t n, int64_t d,
                              float* dembd, stream_handle s);
int launch_scale_rows(float* x, const float* scales, int64_t rows, int64_t width, stream_handle s);
/// Mixture of experts (gpu/train/moe_ops.hpp): y[t] = Σ_j weights[t][j] · exp_out[slot_row[t][j]].
int launch_moe_combine(const float* exp_out, const int32_t* slot_row, const float* weights,
                       int64_t n, int64_t k, int64_t d, float* y, stream_handle s);
/// dout[r] = weights[row_slot[r]] · dy[row_token[r]], dweights[row_slot[r]] = dy[row_token[r]] ·
/// exp_out[r] (one block per row, a fixed-order reduction).
int launch_moe_combine_backward(const float* dy, const float* exp_out, const int32_t* row_token,
                                const int32_t* row_slot, const float* weights, int64_t rows,
                                int64_t d, float* dout, float* dweights, stream_handle s);

/// x[i] *= factor.
int launch_scale(float* x, int64_t n, float factor, stream_handle s);
/// Blocks of the first pass of launch_sum_squares: `partial` holds this many doubles.
inline constexpr int kSumSquaresBlocks = 1024;
/// *acc += Σ x[i]² in double: per-block sums into `partial`, then one thread adds them in order.
int launch_sum_squares(const float* x, int64_t n, double* acc, double* partial, stream_handle s);
/// AdamW's constants (gpu/train/optimizer.hpp's adamw_scalars).
struct adamw_args {
  float step_size = 0, sqrt_bc2 = 1, eps = 0, keep = 1, beta1 = 0, beta2 = 0;
  float grad_scale = 1, clip = 1;  ///< g is read as (g · grad_scale) · clip
};
/// AdamW's element update over one tensor (adamw_update_range).
int launch_adamw(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                 const adamw_args& a, stream_handle s);

}  // namespace weft::gpu::cuda
