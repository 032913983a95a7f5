#include "actors/cache/heavy_hitters.hpp"

#include <algorithm>

namespace weft::cache {

heavy_hitters::heavy_hitters(heavy_hitters_config cfg) : cfg_(cfg) {
  if (cfg_.capacity == 0) cfg_.capacity = 1;
  if (cfg_.window == 0) cfg_.window = 1;
}

void heavy_hitters::record(uint64_t key) {
  total_ += 1;
  if (auto it = counters_.find(key); it != counters_.end()) {
    by_count_.erase({it->second.count, key});
    it->second.count += 1;
    by_count_.insert({it->second.count, key});
  } else if (counters_.size() < cfg_.capacity) {
    counters_.emplace(key, counter{1, 0});
    by_count_.insert({1, key});
  } else {
    // Replace the minimum: the newcomer inherits its count as error.
    auto [min_count, victim] = *by_count_.begin();
    by_count_.erase(by_count_.begin());
    counters_.erase(victim);
    counters_.emplace(key, counter{min_count + 1, min_count});
    by_count_.insert({min_count + 1, key});
  }
  if (++since_halving_ >= cfg_.window) {
    since_halving_ = 0;
    halve();
  }
}

void heavy_hitters::halve() {
  total_ /= 2;
  by_count_.clear();
  for (auto it = counters_.begin(); it != counters_.end();) {
    it->second.count /= 2;
    it->second.error /= 2;
    if (it->second.count == 0) {
      it = counters_.erase(it);
    } else {
      by_count_.insert({it->second.count, it->first});
      ++it;
    }
  }
}

uint64_t heavy_hitters::estimate(uint64_t key) const {
  auto it = counters_.find(key);
  return it == counters_.end() ? 0 : it->second.count;
}

uint64_t heavy_hitters::guaranteed(uint64_t key) const {
  auto it = counters_.find(key);
  return it == counters_.end() ? 0 : it->second.count - it->second.error;
}

bool heavy_hitters::hot(uint64_t key) const {
  const uint64_t g = guaranteed(key);
  if (g == 0 || g < cfg_.min_count) return false;
  return static_cast<double>(g) >= cfg_.hot_share * static_cast<double>(total_);
}

std::vector<heavy_hitter> heavy_hitters::top(size_t n) const {
  std::vector<heavy_hitter> all;
  all.reserve(counters_.size());
  for (const auto& [key, c] : counters_) all.push_back(heavy_hitter{key, c.count, c.error});
  n = std::min(n, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(),
                    [](const heavy_hitter& a, const heavy_hitter& b) {
                      return a.count != b.count ? a.count > b.count : a.key < b.key;
                    });
  all.resize(n);
  return all;
}

}  // namespace weft::cache
