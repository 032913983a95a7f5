#include "gpu/train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "gpu/train/train_ops.hpp"

namespace weft::gpu::train {

void adamw::init(std::span<const int64_t> sizes) {
  step_ = 0;
  m_.clear();
  v_.clear();
  for (int64_t s : sizes) {
    m_.emplace_back(static_cast<size_t>(s), 0.0f);
    v_.emplace_back(static_cast<size_t>(s), 0.0f);
  }
}

void adamw::step(std::span<const std::span<float>> values,
                 std::span<const std::span<const float>> grads, std::span<const uint8_t> decay,
                 double lr) {
  ++step_;
  const double b1 = config_.beta1;
  const double b2 = config_.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step_));
  // PyTorch's AdamW: p *= 1 - lr·wd; m = b1·m + (1-b1)·g; v = b2·v + (1-b2)·g²;
  // p -= (lr / bc1) · m / (√v / √bc2 + eps).
  const auto step_size = static_cast<float>(lr / bc1);
  const auto sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  const auto eps = static_cast<float>(config_.eps);
  const auto keep = static_cast<float>(1.0 - lr * config_.weight_decay);
  const auto fb1 = static_cast<float>(b1);
  const auto fb2 = static_cast<float>(b2);
  // Elements [lo, hi) of tensor i.
  auto update = [&](size_t i, size_t lo, size_t hi) {
    float* p = values[i].data();
    const float* g = grads[i].data();
    float* m = m_[i].data();
    float* v = v_[i].data();
    const bool wd = i < decay.size() ? decay[i] != 0 : true;
    for (size_t j = lo; j < hi; ++j) {
      if (wd) p[j] *= keep;
      m[j] = fb1 * m[j] + (1.0f - fb1) * g[j];
      v[j] = fb2 * v[j] + (1.0f - fb2) * g[j] * g[j];
      p[j] -= step_size * m[j] / (std::sqrt(v[j]) / sqrt_bc2 + eps);
    }
  };
  // All tensors as one range of elements, cut among the threads.
  std::vector<int64_t> starts{0};
  for (const auto& t : values) starts.push_back(starts.back() + static_cast<int64_t>(t.size()));
  parallel_ranges(starts.back(), config_.threads, [&](int64_t lo, int64_t hi) {
    auto i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) -
                                 starts.begin() - 1);
    for (; i < values.size() && starts[i] < hi; ++i) {
      const int64_t a = std::max(lo, starts[i]) - starts[i];
      const int64_t b = std::min(hi, starts[i + 1]) - starts[i];
      if (b > a) update(i, static_cast<size_t>(a), static_cast<size_t>(b));
    }
  });
}

double global_grad_norm(std::span<const std::span<const float>> grads) {
  double ss = 0.0;
  for (const auto& g : grads) {
    for (float x : g) ss += static_cast<double>(x) * x;
  }
  return std::sqrt(ss);
}

result<double> clip_and_update(adamw& opt, std::span<const std::span<float>> values,
                               std::span<const std::span<float>> grads,
                               std::span<const uint8_t> decay, double max_norm, double lr,
                               int64_t step) {
  const double norm = clip_grad_norm(grads, max_norm);
  if (!std::isfinite(norm)) {
    return status{status_code::internal, "gradient norm is not finite at step " +
                                             std::to_string(step) +
                                             " (lower --lr or check the data)"};
  }
  std::vector<std::span<const float>> cgrads;
  for (const auto& g : grads) cgrads.emplace_back(g.data(), g.size());
  opt.step(values, cgrads, decay, lr);
  return norm;
}

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm) {
  std::vector<std::span<const float>> view(grads.begin(), grads.end());
  const double norm = global_grad_norm(view);
  if (max_norm > 0.0 && norm > max_norm) {
    const auto coef = static_cast<float>(max_norm / (norm + 1e-6));
    for (const auto& g : grads) {
      for (float& x : g) x *= coef;
    }
  }
  return norm;
}

double lr_schedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (decay == shape::constant) return peak;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return peak * (min_ratio + (1.0 - min_ratio) * cosine);
}

bool parse_lr_shape(const std::string& name, lr_schedule::shape& out) {
  if (name == "cosine") {
    out = lr_schedule::shape::cosine;
  } else if (name == "constant") {
    out = lr_schedule::shape::constant;
  } else {
    return false;
  }
  return true;
}

}  // namespace weft::gpu::train
