// Step bounds of engine workers and the router's stall limit (stall_watch.hpp).

#include "actors/serve/stall_watch.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace weft::serve {

void step_history::record(double ms, int64_t tokens, uint64_t now_ms) {
  if (!(ms >= 0.0) || !std::isfinite(ms)) return;
  while (!slowest_.empty() && now_ms - std::min(now_ms, slowest_.front().at_ms) > window_ms) {
    slowest_.pop_front();
  }
  while (!slowest_.empty() && slowest_.back().ms <= ms) slowest_.pop_back();
  slowest_.push_back({now_ms, ms});
  if (tokens >= min_rate_tokens) {
    const double per_token = ms / static_cast<double>(tokens);
    ms_per_token_ = ms_per_token_ == 0.0
                        ? per_token
                        : ms_per_token_ + rate_weight * (per_token - ms_per_token_);
  }
}

uint32_t step_history::bound_ms(int64_t max_step_tokens, uint64_t now_ms) const {
  double slowest = 0.0;
  for (const auto& s : slowest_) {
    if (now_ms - std::min(now_ms, s.at_ms) <= window_ms) {
      slowest = s.ms;
      break;
    }
  }
  const double by_rate = ms_per_token_ * static_cast<double>(std::max<int64_t>(0, max_step_tokens));
  const double bound = std::ceil(std::max(slowest, by_rate));
  return bound >= static_cast<double>(std::numeric_limits<uint32_t>::max())
             ? std::numeric_limits<uint32_t>::max()
             : static_cast<uint32_t>(bound);
}

uint64_t stall_limit_ms(uint64_t stall_ms, uint32_t bound_ms) {
  return std::max(
      stall_ms, static_cast<uint64_t>(stall_step_multiple) * std::min(bound_ms, max_step_bound_ms));
}

}  // namespace weft::serve
