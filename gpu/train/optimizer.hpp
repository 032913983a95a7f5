#pragma once
/// AdamW with decoupled weight decay, global-norm gradient clipping and the learning-rate schedule
/// (linear warmup, then cosine decay or constant) — the update rules of PyTorch's `AdamW`,
/// `clip_grad_norm_` and the usual warmup schedules, so a run can be checked against PyTorch step
/// by step (docs/training.md). Plain classes: no CAF, no device.

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

/// State and update of AdamW over a list of parameter tensors (each a flat span).
class adamw {
 public:
  explicit adamw(const adamw_config& config = {}) : config_(config) {}

  /// Sizes the moments for tensors of these sizes (zeroes them and the step).
  void init(std::span<const int64_t> sizes);

  /// One update: for tensor i, value[i] -= lr · (m̂ / (√v̂ + eps) + wd · value[i]); weight decay is
  /// skipped for tensors where `decay[i]` is false (norm weights, by convention).
  void step(std::span<const std::span<float>> values, std::span<const std::span<const float>> grads,
            std::span<const uint8_t> decay, double lr);

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

/// The global L2 norm of all gradients, computed in double in a fixed order.
double global_grad_norm(std::span<const std::span<const float>> grads);

/// Scales every gradient by max_norm / norm when norm > max_norm (PyTorch's clip_grad_norm_ with
/// its 1e-6 guard); returns the norm before clipping. max_norm <= 0 disables clipping.
double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm);

/// One update of an optimizer step: clips the gradients to `max_norm` (clip_grad_norm), then
/// AdamW at `lr`. Returns the norm before clipping, or an error naming update `step` (1-based)
/// when it is not finite (nothing is updated then).
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
