// The CPU device's trainer ops: train_ops<float> on host memory (gpu/train/train_kernels.hpp).
#include "gpu/train/train_kernels.hpp"

#include "gpu/train/moe_ops.hpp"

#include <algorithm>
#include <string>
#include <thread>

namespace weft::gpu::train {

status cpu_train_kernels::moe_combine(const float* exp_out, const int32_t* slot_row,
                                      const float* weights, int64_t n, int64_t k, int64_t d,
                                      float* y) {
  train::moe_combine(exp_out, slot_row, weights, n, k, d, y);
  return {};
}

status cpu_train_kernels::moe_combine_backward(const float* dy, const float* exp_out,
                                               const int32_t* row_token, const int32_t* row_slot,
                                               const float* weights, int64_t rows, int64_t d,
                                               float* dout, float* dweights) {
  train::moe_combine_backward(dy, exp_out, row_token, row_slot, weights, rows, d, dout, dweights);
  return {};
}

namespace {

packed_sequences host_sequences(const device_sequences& d) {
  packed_sequences s;
  s.starts.assign(d.starts, d.starts + d.n_seqs + 1);
  if (d.prefix != nullptr) s.prefix.assign(d.prefix, d.prefix + d.n_seqs);
  return s;
}

status check_shape(const attention_shape& shape) {
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.n_heads % shape.n_kv_heads != 0)
    return {status_code::invalid_argument, "attention: heads " + std::to_string(shape.n_heads) +
                                               " / kv heads " + std::to_string(shape.n_kv_heads) +
                                               " / head_dim " + std::to_string(shape.head_dim)};
  return {};
}

}  // namespace

status cpu_train_kernels::linear_forward(const float* x, const float* w, int64_t n, int64_t in,
                                         int64_t out, float* y) {
  train::linear_forward(x, w, n, in, out, y);
  return {};
}

status cpu_train_kernels::linear_backward(const float* x, const float* w, const float* dy,
                                          int64_t n, int64_t in, int64_t out, float* dx, float* dw,
                                          bool add_dx) {
  train::linear_backward(x, w, dy, n, in, out, dx, dw, add_dx);
  return {};
}

status cpu_train_kernels::rms_norm_forward(const float* x, const float* g, int64_t n, int64_t d,
                                           float eps, float* y, float* rstd) {
  train::rms_norm_forward(x, g, n, d, eps, y, rstd);
  return {};
}

status cpu_train_kernels::rms_norm_backward(const float* x, const float* g, const float* rstd,
                                            const float* dy, int64_t n, int64_t d, float* dx,
                                            float* dg) {
  train::rms_norm_backward(x, g, rstd, dy, n, d, dx, dg);
  return {};
}

status cpu_train_kernels::rope_apply(float* x, int64_t n, int64_t heads, int64_t head_dim,
                                     const double* cos, const double* sin, int64_t n_dims,
                                     rope_style style, bool inverse) {
  if (n_dims <= 0 || n_dims > head_dim || n_dims % 2 != 0)
    return {status_code::invalid_argument, "rope: n_dims " + std::to_string(n_dims)};
  rope_table t;
  t.n_dims = n_dims;
  const size_t len = static_cast<size_t>(n * (n_dims / 2));
  t.cos.assign(cos, cos + len);
  t.sin.assign(sin, sin + len);
  train::rope_apply(x, n, heads, head_dim, t, style, inverse);
  return {};
}

status cpu_train_kernels::attention_forward(const float* q, const float* k, const float* v,
                                            const device_sequences& seqs,
                                            const attention_shape& shape, float* out, float* lse) {
  if (auto st = check_shape(shape); !st) return st;
  train::attention_forward(q, k, v, host_sequences(seqs), shape, out, lse);
  return {};
}

status cpu_train_kernels::attention_backward(const float* q, const float* k, const float* v,
                                             const float* out, const float* lse, const float* dout,
                                             const device_sequences& seqs,
                                             const attention_shape& shape, float* dq, float* dk,
                                             float* dv) {
  if (auto st = check_shape(shape); !st) return st;
  train::attention_backward(q, k, v, out, lse, dout, host_sequences(seqs), shape, dq, dk, dv);
  return {};
}

status cpu_train_kernels::swiglu_forward(const float* gate, const float* up, int64_t n, float* h) {
  train::swiglu_forward(gate, up, n, h);
  return {};
}

status cpu_train_kernels::swiglu_backward(const float* gate, const float* up, const float* dh,
                                          int64_t n, float* dgate, float* dup) {
  train::swiglu_backward(gate, up, dh, n, dgate, dup);
  return {};
}

status cpu_train_kernels::cross_entropy(const float* logits, const int32_t* targets, int64_t n,
                                        int64_t vocab, float grad_scale, float* dlogits,
                                        double* logp) {
  for (int64_t t = 0; t < n; ++t) {
    if (targets[t] < 0 || targets[t] >= vocab)
      return {status_code::invalid_argument,
              "cross_entropy: target " + std::to_string(targets[t]) + " outside the vocabulary"};
  }
  // Row by row so each row's log-probability keeps double precision.
  for (int64_t t = 0; t < n; ++t) {
    logp[t] =
        -train::cross_entropy<float>(logits + t * vocab, targets + t, 1, vocab, grad_scale,
                                     dlogits != nullptr ? dlogits + t * vocab : nullptr, nullptr);
  }
  return {};
}

status cpu_train_kernels::fill(float* x, int64_t n, float value) {
  std::fill(x, x + n, value);
  return {};
}

status cpu_train_kernels::embedding_backward(const float* dx, const int32_t* tokens, int64_t n,
                                             int64_t d, float* dembd) {
  for (int64_t t = 0; t < n; ++t) {
    float* row = dembd + static_cast<int64_t>(tokens[t]) * d;
    for (int64_t i = 0; i < d; ++i) row[i] += dx[t * d + i];
  }
  return {};
}

status cpu_train_kernels::scale_rows(float* x, const float* scales, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * width;
    for (int64_t j = 0; j < width; ++j) row[j] *= scales[r];
  }
  return {};
}

namespace {
/// Threads for an element-wise pass over n elements (the bits do not depend on it).
int element_threads(int64_t n) {
  return n >= (1 << 20) ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : 1;
}
}  // namespace

status cpu_train_kernels::scale(float* x, int64_t n, float factor) {
  parallel_ranges(n, element_threads(n), [x, factor](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) x[i] *= factor;
  });
  return {};
}

status cpu_train_kernels::sum_squares(const float* x, int64_t n, double* acc) {
  *acc += train::sum_squares(x, n, element_threads(n));  // global_grad_norm's bits
  return {};
}

status cpu_train_kernels::adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                                       bool decay, const adamw_scalars& s) {
  parallel_ranges(n, element_threads(n), [&](int64_t lo, int64_t hi) {
    adamw_update_range(p, g, m, v, lo, hi, decay, s);
  });
  return {};
}

}  // namespace weft::gpu::train
