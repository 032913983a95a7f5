#include "gpu/rl/rollout_scheduler.hpp"

#include <string>

namespace weft::gpu::rl {

namespace {

std::string name(const sample_key& k) {
  return "sample " + std::to_string(k.index) + " of group " + std::to_string(k.group) +
         " of step " + std::to_string(k.step);
}

}  // namespace

rollout_scheduler::rollout_scheduler(const scheduler_config& config, int64_t version)
    : config_(config), version_(version), next_admit_(version) {}

std::vector<int64_t> rollout_scheduler::admit() {
  std::vector<int64_t> out;
  while (next_admit_ <= version_ + config_.max_staleness &&
         (config_.last_step < 0 || next_admit_ < config_.last_step)) {
    step_state s;
    s.admitted_at = version_;
    s.oldest.assign(static_cast<size_t>(samples_per_step()), -1);
    steps_.emplace(next_admit_, std::move(s));
    in_flight_ += samples_per_step();
    out.push_back(next_admit_++);
  }
  return out;
}

status rollout_scheduler::finish(const sample_key& key, int64_t oldest_version,
                                 int64_t newest_version) {
  auto it = steps_.find(key.step);
  if (it == steps_.end()) {
    return {status_code::invalid_argument,
            name(key) + ": the step is not generating (never admitted, or already trained)"};
  }
  if (key.group < 0 || key.group >= config_.prompts_per_step || key.index < 0 ||
      key.index >= config_.group_size) {
    return {status_code::invalid_argument, name(key) + ": no such sample"};
  }
  step_state& s = it->second;
  const auto at = static_cast<size_t>(key.group * config_.group_size + key.index);
  if (s.oldest[at] >= 0) return {status_code::invalid_argument, name(key) + " finished twice"};
  if (oldest_version < s.admitted_at || newest_version < oldest_version ||
      newest_version > version_) {
    return {status_code::invalid_argument,
            name(key) + ": token versions " + std::to_string(oldest_version) + ".." +
                std::to_string(newest_version) + " outside " + std::to_string(s.admitted_at) +
                ".." + std::to_string(version_)};
  }
  s.oldest[at] = oldest_version;
  ++s.finished;
  --in_flight_;
  return {};
}

bool rollout_scheduler::ready() const {
  auto it = steps_.find(version_);
  return it != steps_.end() && it->second.finished == samples_per_step();
}

result<trained_step> rollout_scheduler::train() {
  if (!ready()) {
    return status{status_code::invalid_argument,
                  "step " + std::to_string(version_) + " is not fully generated"};
  }
  const step_state& s = steps_.at(version_);
  trained_step out;
  out.step = version_;
  for (int64_t oldest : s.oldest) {
    const int64_t lag = version_ - oldest;
    if (oldest < 0 || lag > config_.max_staleness) {
      return status{status_code::internal, "step " + std::to_string(version_) + " holds a sample " +
                                               std::to_string(lag) + " versions old (bound " +
                                               std::to_string(config_.max_staleness) + ")"};
    }
    out.staleness.push_back(lag);
  }
  for (int64_t lag : out.staleness) {
    if (histogram_.size() <= static_cast<size_t>(lag)) histogram_.resize(lag + 1, 0);
    ++histogram_[static_cast<size_t>(lag)];
  }
  trained_samples_ += samples_per_step();
  steps_.erase(version_);
  ++version_;
  return out;
}

}  // namespace weft::gpu::rl
