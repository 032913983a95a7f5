#include "actors/restart_policy.hpp"

#include <algorithm>
#include <cmath>

namespace weft::actors {

restart_strategy parse_strategy(const std::string& name, bool* ok) {
  if (ok) *ok = true;
  if (name == "one_for_one") return restart_strategy::one_for_one;
  if (name == "one_for_all") return restart_strategy::one_for_all;
  if (name == "rest_for_one") return restart_strategy::rest_for_one;
  if (ok) *ok = false;
  return restart_strategy::one_for_one;
}

const char* to_string(restart_strategy s) {
  switch (s) {
    case restart_strategy::one_for_one:
      return "one_for_one";
    case restart_strategy::one_for_all:
      return "one_for_all";
    case restart_strategy::rest_for_one:
      return "rest_for_one";
  }
  return "?";
}

restart_tracker::restart_tracker(restart_strategy strategy, restart_intensity intensity,
                                 backoff_policy backoff)
    : strategy_(strategy), intensity_(intensity), backoff_(backoff) {}

size_t restart_tracker::restarts_in_window(uint64_t now_ms) {
  while (!restart_times_.empty() && restart_times_.front() + intensity_.window_ms <= now_ms) {
    restart_times_.pop_front();
  }
  return restart_times_.size();
}

restart_decision restart_tracker::on_exit(size_t index, size_t n_children, restart_type type,
                                          exit_kind how, uint64_t now_ms,
                                          uint64_t running_since_ms) {
  restart_decision d;
  if (consecutive_failures_.size() < n_children) consecutive_failures_.resize(n_children, 0);
  bool wants_restart = type == restart_type::permanent ||
                       (type == restart_type::transient && how == exit_kind::abnormal);
  if (!wants_restart) return d;

  if (restarts_in_window(now_ms) >= intensity_.max_restarts) {
    d.give_up = true;
    return d;
  }
  restart_times_.push_back(now_ms);

  if (now_ms >= running_since_ms + backoff_.reset_after_ms) consecutive_failures_[index] = 0;
  uint32_t failures = consecutive_failures_[index]++;
  // The first failure in a row restarts after first_delay_ms (default: at once); later ones wait
  // initial, initial*m, ... up to max.
  double delay = failures == 0 ? 0.0
                               : static_cast<double>(backoff_.initial_ms) *
                                     std::pow(backoff_.multiplier, failures - 1);
  d.delay_ms = failures == 0 ? backoff_.first_delay_ms
                             : static_cast<uint64_t>(std::min<double>(delay, backoff_.max_ms));

  switch (strategy_) {
    case restart_strategy::one_for_one:
      d.to_restart = {index};
      break;
    case restart_strategy::one_for_all:
      for (size_t i = 0; i < n_children; ++i) d.to_restart.push_back(i);
      break;
    case restart_strategy::rest_for_one:
      for (size_t i = index; i < n_children; ++i) d.to_restart.push_back(i);
      break;
  }
  return d;
}

}  // namespace weft::actors
