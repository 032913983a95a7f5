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

adamw_scalars adamw::scalars(int64_t step, double lr) const {
  const double b1 = config_.beta1;
  const double b2 = config_.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  adamw_scalars s;
  s.step_size = static_cast<float>(lr / bc1);
  s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(config_.eps);
  s.keep = static_cast<float>(1.0 - lr * config_.weight_decay);
  s.beta1 = static_cast<float>(b1);
  s.beta2 = static_cast<float>(b2);
  return s;
}

void adamw::step(std::span<const std::span<float>> values,
                 std::span<const std::span<const float>> grads, std::span<const uint8_t> decay,
                 double lr) {
  ++step_;
  const adamw_scalars sc = scalars(step_, lr);
  // Elements [lo, hi) of tensor i.
  auto update = [&](size_t i, size_t lo, size_t hi) {
    const bool wd = i < decay.size() ? decay[i] != 0 : true;
    adamw_update_range(values[i].data(), grads[i].data(), m_[i].data(), v_[i].data(),
                       static_cast<int64_t>(lo), static_cast<int64_t>(hi), wd, sc);
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
  if (!std::isfinite(norm)) return non_finite_norm(step);
  std::vector<std::span<const float>> cgrads;
  for (const auto& g : grads) cgrads.emplace_back(g.data(), g.size());
  opt.step(values, cgrads, decay, lr);
  return norm;
}

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm) {
  std::vector<std::span<const float>> view(grads.begin(), grads.end());
  const double norm = global_grad_norm(view);
  if (const float coef = clip_factor(norm, max_norm); coef != 1.0f) {
    for (const auto& g : grads) {
      for (float& x : g) x *= coef;
    }
  }
  return norm;
}

float clip_factor(double norm, double max_norm) {
  if (max_norm > 0.0 && norm > max_norm) return static_cast<float>(max_norm / (norm + 1e-6));
  return 1.0f;
}

status non_finite_norm(int64_t step) {
  return {status_code::internal, "gradient norm is not finite at step " + std::to_string(step) +
                                     " (lower --lr or check the data)"};
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
