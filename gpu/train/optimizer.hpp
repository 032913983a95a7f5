#pragma once
/// AdamW with decoupled weight decay, global-norm gradient clipping and the learning-rate schedule
/// (linear warmup, then cosine decay or constant) — the update rules of PyTorch's `AdamW`,
/// `clip_grad_norm_` and the usual warmup schedules, so a run can be checked against PyTorch step
/// by step (docs/training.md). Plain classes: no CAF, no device.

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu::train {

/// Hyper-parameters of AdamW.
struct adamw_config {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int threads = 1;  ///< Threads of the update (element-wise: the bits do not depend on it).
};

/// The per-update constants of AdamW, made on the host in double and rounded once, so every
/// implementation of the element update (host threads, a device) uses the same numbers.
struct adamw_scalars {
  float step_size = 0;  ///< lr / (1 − β1^t)
  float sqrt_bc2 = 1;   ///< √(1 − β2^t)
  float eps = 0;
  float keep = 1;  ///< 1 − lr · weight_decay
  float beta1 = 0, beta2 = 0;
  /// The update uses (g · grad_scale) · clip for each gradient element g, one rounding each
  /// (exact when 1): the mean's 1 / tokens and clip_grad_norm's factor applied as the update reads
  /// the gradients, the same bits as scaling them in place first, without those passes over them.
  float grad_scale = 1, clip = 1;
};

/// The element update of AdamW on [lo, hi) (PyTorch's, with g = (g · grad_scale) · clip: p *= keep
/// when `decay`; m = β1·m + (1−β1)·g;
/// v = β2·v + (1−β2)·g²; p −= step_size · m / (√v / √bc2 + eps)), with the roundings fixed: m =
/// fma(β1, m, (1−β1)·g), v = fma(β2, v, ((1−β2)·g)·g), the rest one IEEE operation at a time. 16
/// (AVX-512) or 8 (AVX2) elements a step and the scalar tail give the same bits, so the result does
/// not depend on how [lo, hi) is cut. Shared by adamw::step and the CPU device's kernel.
void adamw_update_range(float* p, const float* g, float* m, float* v, int64_t lo, int64_t hi,
                        bool decay, const adamw_scalars& s);

/// Σ x² over n floats in double, in an order fixed by n alone: 8 lanes (element i in lane i % 8)
/// of FMAs per 64 Ki-element chunk, the lanes summed in a fixed tree, the chunks in order; the
/// chunks run on up to `threads` threads (the bits do not depend on how many). With `scale`, the
/// sum of (x · scale)² with each product rounded to float first: the bits of scaling x in place
/// and then summing.
double sum_squares(const float* x, int64_t n, int threads = 1, float scale = 1.0f);

/// State and update of AdamW over a list of parameter tensors (each a flat span).
class adamw {
 public:
  explicit adamw(const adamw_config& config = {}) : config_(config) {}

  /// Sizes the moments for tensors of these sizes (zeroes them and the step).
  void init(std::span<const int64_t> sizes);

  /// One update: for tensor i, value[i] -= lr · (m̂ / (√v̂ + eps) + wd · value[i]); weight decay is
  /// skipped for tensors where `decay[i]` is false (norm weights, by convention).
  /// The gradients are read as (g · grad_scale) · clip (adamw_scalars).
  void step(std::span<const std::span<float>> values, std::span<const std::span<const float>> grads,
            std::span<const uint8_t> decay, double lr, float grad_scale = 1.0f, float clip = 1.0f);

  /// The constants of update number `step` (1-based) at rate `lr`.
  adamw_scalars scalars(int64_t step, double lr) const;

  int64_t steps() const { return step_; }
  const adamw_config& config() const { return config_; }
  /// First and second moments of tensor i (checkpoints).
  std::vector<float>& m(size_t i) { return m_[i]; }
  std::vector<float>& v(size_t i) { return v_[i]; }
  const std::vector<float>& m(size_t i) const { return m_[i]; }
  const std::vector<float>& v(size_t i) const { return v_[i]; }
  void set_steps(int64_t s) { step_ = s; }
  size_t n_tensors() const { return m_.size(); }

 private:
  adamw_config config_;
  int64_t step_ = 0;
  std::vector<std::vector<float>> m_, v_;
};

/// The global L2 norm of all gradients, each element times `scale`: √(Σ over the tensors, in
/// order, of sum_squares(tensor, scale)); the same bits for any number of threads.
double global_grad_norm(std::span<const std::span<const float>> grads, int threads = 1,
                        float scale = 1.0f);

/// The factor clip_grad_norm scales the gradients by at this norm (1 when it does not clip).
float clip_factor(double norm, double max_norm);

/// The error of an update whose gradient norm is not finite (update `step`, 1-based).
status non_finite_norm(int64_t step);

/// Scales every gradient by max_norm / norm when norm > max_norm (PyTorch's clip_grad_norm_ with
/// its 1e-6 guard); returns the norm before clipping. max_norm <= 0 disables clipping.
double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm, int threads = 1);

/// One update of an optimizer step on summed gradients: the gradient is g · grad_scale (the mean
/// over the step's tokens), its global norm is clipped to `max_norm` (clip_grad_norm's factor),
/// then AdamW at `lr` — the bits of scaling the gradients in place, clip_grad_norm and adamw::step,
/// in two passes over them (the norm's, the update's) that only read them: they are left as they
/// were. Returns the norm before clipping, or an error naming update `step` (1-based) when it is
/// not finite (nothing is updated then).
result<double> scale_clip_and_update(adamw& opt, std::span<const std::span<float>> values,
                                     std::span<const std::span<const float>> grads,
                                     std::span<const uint8_t> decay, float grad_scale,
                                     double max_norm, double lr, int64_t step);

/// scale_clip_and_update without scaling (the gradients are already the step's).
result<double> clip_and_update(adamw& opt, std::span<const std::span<float>> values,
                               std::span<const std::span<float>> grads,
                               std::span<const uint8_t> decay, double max_norm, double lr,
                               int64_t step);

/// Learning rate at a step.
struct lr_schedule {
  enum class shape { constant, cosine };
  double peak = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  shape decay = shape::cosine;
  double min_ratio = 0.0;  ///< Cosine decays to peak · min_ratio at total_steps.

  /// The rate for update number `step` (0-based): linear warmup from peak/warmup to peak over
  /// the first warmup_steps updates, then constant or cosine decay.
  double at(int64_t step) const;

  bool operator==(const lr_schedule&) const = default;
};

/// Parses "cosine" / "constant".
bool parse_lr_shape(const std::string& name, lr_schedule::shape& out);

}  // namespace weft::gpu::train
