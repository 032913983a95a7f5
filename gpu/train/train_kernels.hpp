#pragma once
/// The trainer's ops (gpu/train/train_ops.hpp) on a device's memory, f32: every backend implements
/// the same set with the same layouts and the same overwrite/add contract as train_ops. The CPU
/// device's implementation calls train_ops<float> (the reference); the CUDA device's launches the
/// kernels of gpu/cuda/train_ops.cu. All pointers are device pointers of the device; calls are
/// enqueued on its compute stream in order (device::synchronize waits for them).
///
/// Determinism: no implementation uses atomics; every reduction has a fixed order, so a result does
/// not depend on timing (the data-parallel trainer's exactness rests on it).

#include <cstdint>

#include "gpu/compute_ops.hpp"
#include "gpu/status.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/train_ops.hpp"

namespace weft::gpu::train {

/// packed_sequences in device memory: starts[n_seqs + 1] and prefix[n_seqs] (−1: none; null when
/// no sequence has a prefix). `n_tokens` = starts[n_seqs], known on the host.
struct device_sequences {
  const int64_t* starts = nullptr;
  const int64_t* prefix = nullptr;
  int64_t n_seqs = 0;
  int64_t n_tokens = 0;
};

class train_kernels {
 public:
  virtual ~train_kernels() = default;

  /// y[n][out] = x[n][in]·Wᵀ.
  virtual status linear_forward(const float* x, const float* w, int64_t n, int64_t in, int64_t out,
                                float* y) = 0;
  /// dx (+)= dy·W (added when `add_dx`); dw += dyᵀ·x. Either may be null.
  virtual status linear_backward(const float* x, const float* w, const float* dy, int64_t n,
                                 int64_t in, int64_t out, float* dx, float* dw, bool add_dx) = 0;
  virtual status rms_norm_forward(const float* x, const float* g, int64_t n, int64_t d, float eps,
                                  float* y, float* rstd) = 0;
  /// dx += ..., dg += ...
  virtual status rms_norm_backward(const float* x, const float* g, const float* rstd,
                                   const float* dy, int64_t n, int64_t d, float* dx, float* dg) = 0;
  /// Rotates in place with a rope_table's cos/sin ([n][n_dims / 2] doubles, device memory).
  virtual status rope_apply(float* x, int64_t n, int64_t heads, int64_t head_dim, const double* cos,
                            const double* sin, int64_t n_dims, rope_style style, bool inverse) = 0;
  virtual status attention_forward(const float* q, const float* k, const float* v,
                                   const device_sequences& seqs, const attention_shape& shape,
                                   float* out, float* lse) = 0;
  /// Overwrites dq, dk, dv.
  virtual status attention_backward(const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, const float* dout,
                                    const device_sequences& seqs, const attention_shape& shape,
                                    float* dq, float* dk, float* dv) = 0;
  virtual status swiglu_forward(const float* gate, const float* up, int64_t n, float* h) = 0;
  /// Overwrites dgate and dup.
  virtual status swiglu_backward(const float* gate, const float* up, const float* dh, int64_t n,
                                 float* dgate, float* dup) = 0;
  /// logp[t] = log-probability of targets[t] (double); dlogits, when non-null, is overwritten with
  /// grad_scale · (softmax − onehot). The loss is −Σ logp (summed by the caller, in double).
  virtual status cross_entropy(const float* logits, const int32_t* targets, int64_t n,
                               int64_t vocab, float grad_scale, float* dlogits, double* logp) = 0;
  /// x[i] = value for i < n.
  virtual status fill(float* x, int64_t n, float value) = 0;
  /// The token embedding's backward: dembd[tokens[t]] += dx[t] for t in order (rows of d).
  virtual status embedding_backward(const float* dx, const int32_t* tokens, int64_t n, int64_t d,
                                    float* dembd) = 0;
  /// x[r][j] *= scales[r] for rows of `width`.
  virtual status scale_rows(float* x, const float* scales, int64_t rows, int64_t width) = 0;
  /// Mixture of experts (moe_ops.hpp, the reference): y[t] = Σ_j weights[t][j] ·
  /// exp_out[slot_row[t][j]], j in order; overwrites y.
  virtual status moe_combine(const float* exp_out, const int32_t* slot_row, const float* weights,
                             int64_t n, int64_t k, int64_t d, float* y) = 0;
  /// Its backward per row r: dout[r] = weights[row_slot[r]] · dy[row_token[r]] and
  /// dweights[row_slot[r]] = dy[row_token[r]] · exp_out[r]; overwrites both.
  virtual status moe_combine_backward(const float* dy, const float* exp_out,
                                      const int32_t* row_token, const int32_t* row_slot,
                                      const float* weights, int64_t rows, int64_t d, float* dout,
                                      float* dweights) = 0;

  // The optimizer's ops (a device-resident update: trainable_model::set_device_resident).
  /// x[i] *= factor.
  virtual status scale(float* x, int64_t n, float factor) = 0;
  /// *acc += Σ x[i]² in double (acc: one double of device memory). The CPU implementation adds
  /// the squares one by one in order, as global_grad_norm does, so it gives that function's bits.
  virtual status sum_squares(const float* x, int64_t n, double* acc) = 0;
  /// AdamW's element update (adamw_update_range) over n elements of one tensor.
  virtual status adamw_update(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                              const adamw_scalars& s) = 0;
};

/// The CPU implementation (host memory): train_ops<float>.
class cpu_train_kernels final : public train_kernels {
 public:
  status linear_forward(const float* x, const float* w, int64_t n, int64_t in, int64_t out,
                        float* y) override;
  status linear_backward(const float* x, const float* w, const float* dy, int64_t n, int64_t in,
                         int64_t out, float* dx, float* dw, bool add_dx) override;
  status rms_norm_forward(const float* x, const float* g, int64_t n, int64_t d, float eps, float* y,
                          float* rstd) override;
  status rms_norm_backward(const float* x, const float* g, const float* rstd, const float* dy,
                           int64_t n, int64_t d, float* dx, float* dg) override;
  status rope_apply(float* x, int64_t n, int64_t heads, int64_t head_dim, const double* cos,
                    const double* sin, int64_t n_dims, rope_style style, bool inverse) override;
  status attention_forward(const float* q, const float* k, const float* v,
                           const device_sequences& seqs, const attention_shape& shape, float* out,
                           float* lse) override;
  status attention_backward(const float* q, const float* k, const float* v, const float* out,
                            const float* lse, const float* dout, const device_sequences& seqs,
                            const attention_shape& shape, float* dq, float* dk, float* dv) override;
  status swiglu_forward(const float* gate, const float* up, int64_t n, float* h) override;
  status swiglu_backward(const float* gate, const float* up, const float* dh, int64_t n,
                         float* dgate, float* dup) override;
  status cross_entropy(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                       float grad_scale, float* dlogits, double* logp) override;
  status fill(float* x, int64_t n, float value) override;
  status embedding_backward(const float* dx, const int32_t* tokens, int64_t n, int64_t d,
                            float* dembd) override;
  status scale_rows(float* x, const float* scales, int64_t rows, int64_t width) override;
  status moe_combine(const float* exp_out, const int32_t* slot_row, const float* weights, int64_t n,
                     int64_t k, int64_t d, float* y) override;
  status moe_combine_backward(const float* dy, const float* exp_out, const int32_t* row_token,
                              const int32_t* row_slot, const float* weights, int64_t rows,
                              int64_t d, float* dout, float* dweights) override;
  status scale(float* x, int64_t n, float factor) override;
  status sum_squares(const float* x, int64_t n, double* acc) override;
  status adamw_update(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                      const adamw_scalars& s) override;
};

}  // namespace weft::gpu::train
