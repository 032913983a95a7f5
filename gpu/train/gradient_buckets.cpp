#include "gpu/train/gradient_buckets.hpp"

#include <algorithm>
#include <utility>

namespace weft::gpu::train {

gradient_buckets::gradient_buckets(std::vector<std::vector<int>> groups,
                                   std::span<const int64_t> param_bytes, int64_t cap_bytes)
    : groups_(std::move(groups)), finished_(groups_.size(), 0) {
  bucket open;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const int i : groups_[g]) {
      open.params.push_back(i);
      open.bytes += param_bytes[static_cast<size_t>(i)];
    }
    open.last_group = g;
    if (cap_bytes > 0 && open.bytes >= cap_bytes) {
      buckets_.push_back(std::move(open));
      open = bucket{};
    }
  }
  if (!open.params.empty()) buckets_.push_back(std::move(open));
}

void gradient_buckets::reset() {
  std::fill(finished_.begin(), finished_.end(), uint8_t{0});
  finished_prefix_ = 0;
  next_ = 0;
}

std::vector<size_t> gradient_buckets::startable() {
  while (finished_prefix_ < finished_.size() && finished_[finished_prefix_] != 0)
    ++finished_prefix_;
  std::vector<size_t> out;
  while (next_ < buckets_.size() && buckets_[next_].last_group < finished_prefix_)
    out.push_back(next_++);
  return out;
}

std::vector<size_t> gradient_buckets::finish_group(size_t g) {
  if (g < finished_.size()) finished_[g] = 1;
  return startable();
}

std::vector<size_t> gradient_buckets::finish_all() {
  std::fill(finished_.begin(), finished_.end(), uint8_t{1});
  return startable();
}

gradient_buckets buckets_of(const trainable_model<float>& model, int64_t cap_bytes) {
  std::vector<int64_t> bytes;
  for (const auto& p : model.parameters())
    bytes.push_back(p.size() * static_cast<int64_t>(sizeof(float)));
  return gradient_buckets(model.gradient_groups(), bytes, cap_bytes);
}

}  // namespace weft::gpu::train
