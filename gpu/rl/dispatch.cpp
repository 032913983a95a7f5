#include "gpu/rl/dispatch.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

namespace weft::gpu::rl {

size_t length_ranker::bucket(int64_t prompt_tokens) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(1, prompt_tokens));
  return std::min<size_t>(static_cast<size_t>(std::bit_width(n)), 23);
}

double length_ranker::predict(uint64_t prompt_key, int64_t prompt_tokens) const {
  if (auto it = by_prompt_.find(prompt_key); it != by_prompt_.end()) return it->second.value();
  // Prompts of exactly this length, once there are a few of them (a task's prompt shape often
  // tells its work: how many values to look up, how many digits).
  if (auto it = by_length_.find(prompt_tokens); it != by_length_.end() && it->second.n >= 2) {
    return it->second.value();
  }
  const size_t b = bucket(prompt_tokens);
  if (by_bucket_[b].n > 0) return by_bucket_[b].value();
  // The nearest bucket with history, shorter prompts first.
  for (size_t d = 1; d < by_bucket_.size(); ++d) {
    if (b >= d && by_bucket_[b - d].n > 0) return by_bucket_[b - d].value();
    if (b + d < by_bucket_.size() && by_bucket_[b + d].n > 0) return by_bucket_[b + d].value();
  }
  return prior_;
}

void length_ranker::observe(uint64_t prompt_key, int64_t prompt_tokens, int64_t output_tokens) {
  const auto len = static_cast<double>(output_tokens);
  auto it = by_prompt_.find(prompt_key);
  if (it == by_prompt_.end() && static_cast<int64_t>(by_prompt_.size()) < max_prompts_) {
    it = by_prompt_.emplace(prompt_key, mean{}).first;
  }
  if (it != by_prompt_.end()) {
    it->second.sum += len;
    ++it->second.n;
  }
  auto at = by_length_.find(prompt_tokens);
  if (at == by_length_.end() && static_cast<int64_t>(by_length_.size()) < max_prompts_) {
    at = by_length_.emplace(prompt_tokens, mean{}).first;
  }
  if (at != by_length_.end()) {
    at->second.sum += len;
    ++at->second.n;
  }
  mean& b = by_bucket_[bucket(prompt_tokens)];
  b.sum += len;
  ++b.n;
}

int32_t trajectory_priority_of(double predicted, int64_t generated, int64_t turns_done) {
  double total = std::max(predicted, 1.0);
  if (static_cast<double>(generated) >= total) {
    total = static_cast<double>(generated) +
            static_cast<double>(generated) / static_cast<double>(std::max<int64_t>(1, turns_done));
  }
  return -static_cast<int32_t>(std::llround(std::min(total, static_cast<double>(1 << 30))));
}

std::vector<size_t> longest_first_order(std::span<const dispatch_item> items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].predicted != items[b].predicted) return items[a].predicted > items[b].predicted;
    return items[a].id < items[b].id;
  });
  return order;
}

std::vector<int> place_longest_first(std::span<const dispatch_item> items, std::span<double> load) {
  std::vector<int> agent(items.size(), 0);
  if (load.empty()) return agent;
  for (size_t i : longest_first_order(items)) {
    const auto j = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    agent[i] = static_cast<int>(j);
    load[j] += items[i].predicted;
  }
  return agent;
}

std::vector<int> consolidation_targets(std::span<const int64_t> unfinished, int64_t capacity) {
  int64_t total = 0;
  std::vector<int> busy;
  for (size_t a = 0; a < unfinished.size(); ++a) {
    if (unfinished[a] > 0) {
      total += unfinished[a];
      busy.push_back(static_cast<int>(a));
    }
  }
  if (total == 0 || capacity < 1) return {};
  const auto needed = static_cast<size_t>((total + capacity - 1) / capacity);
  if (needed * 2 > busy.size()) return {};
  std::stable_sort(busy.begin(), busy.end(), [&](int x, int y) {
    return unfinished[static_cast<size_t>(x)] > unfinished[static_cast<size_t>(y)];
  });
  busy.resize(needed);
  std::sort(busy.begin(), busy.end());
  return busy;
}

std::vector<int> place_round_robin(size_t items, int agents, int start) {
  std::vector<int> agent(items, 0);
  if (agents <= 0) return agent;
  for (size_t i = 0; i < items; ++i) {
    agent[i] = static_cast<int>((static_cast<size_t>(start) + i) % static_cast<size_t>(agents));
  }
  return agent;
}

}  // namespace weft::gpu::rl
