#include "actors/serve/mlfq_policy.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace weft::serve {

result<std::shared_ptr<mlfq_policy>> mlfq_policy::create(const mlfq_config& config) {
  if (config.n_queues < 1 || config.n_queues > 32) {
    return make_error(errc::invalid_argument,
                      "mlfq: n_queues must be in 1..32, got " + std::to_string(config.n_queues));
  }
  if (!std::isfinite(config.base_quantum) || config.base_quantum <= 0.0) {
    return make_error(errc::invalid_argument, "mlfq: base_quantum must be a positive number");
  }
  if (!std::isfinite(config.prefill_cost_per_token) || config.prefill_cost_per_token < 0.0) {
    return make_error(errc::invalid_argument, "mlfq: prefill_cost_per_token must be a number >= 0");
  }
  if (config.starvation_steps < 1) {
    return make_error(errc::invalid_argument, "mlfq: starvation_steps must be >= 1");
  }
  return std::shared_ptr<mlfq_policy>(new mlfq_policy(config));
}

double mlfq_policy::quantum(int32_t level) const {
  return std::ldexp(config_.base_quantum, level);
}

int32_t mlfq_policy::join_level(int64_t n_prompt) const {
  const double cost = static_cast<double>(n_prompt) * config_.prefill_cost_per_token;
  for (int32_t i = 0; i < config_.n_queues; ++i) {
    if (quantum(i) >= cost) return i;
  }
  return config_.n_queues - 1;
}

void mlfq_policy::on_add(const gpu::sched_request& r) {
  entry e;
  e.level = join_level(r.n_prompt);
  entries_[r.id] = e;
}

void mlfq_policy::on_progress(gpu::request_id id, int64_t prefill_tokens, int64_t decode_tokens) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  entry& e = it->second;
  e.last_run_step = now_step_;
  e.attained += static_cast<double>(decode_tokens) +
                static_cast<double>(prefill_tokens) * config_.prefill_cost_per_token;
  // One level per iteration at most, as in FastServe; the last queue has no bound.
  if (e.attained >= quantum(e.level) && e.level + 1 < config_.n_queues) {
    ++e.level;
    e.attained = 0.0;
    ++n_demotions_;
  }
}

void mlfq_policy::on_finish(gpu::request_id id) {
  entries_.erase(id);
}

void mlfq_policy::rank(std::vector<gpu::sched_request>& live, int64_t now_step) {
  now_step_ = now_step;
  for (const auto& r : live) {
    auto [it, inserted] = entries_.try_emplace(r.id);
    entry& e = it->second;
    if (inserted)
      e.level = join_level(r.n_prompt);  // the engine always calls on_add; be total anyway
    if (e.last_run_step < 0) {
      e.last_run_step = now_step;  // the waiting clock starts when the request is first ranked
    } else if (now_step - e.last_run_step > config_.starvation_steps) {
      if (e.level != 0) ++n_promotions_;
      e.level = 0;
      e.attained = 0.0;
      e.last_run_step = now_step;
    }
  }
  std::stable_sort(live.begin(), live.end(),
                   [this](const gpu::sched_request& a, const gpu::sched_request& b) {
                     const int32_t la = entries_.at(a.id).level;
                     const int32_t lb = entries_.at(b.id).level;
                     if (la != lb) return la < lb;
                     return a.arrival < b.arrival;
                   });
}

int32_t mlfq_policy::level_of(gpu::request_id id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? -1 : it->second.level;
}

double mlfq_policy::attained_of(gpu::request_id id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0.0 : it->second.attained;
}

}  // namespace weft::serve
