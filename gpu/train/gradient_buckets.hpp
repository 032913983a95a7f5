#pragma once
/// Buckets for overlapping a data-parallel gradient all-reduce with the backward (PyTorch DDP's
/// idea, docs/training.md "Overlapping the all-reduce"): the backward finishes the gradients in
/// groups (trainable_model::gradient_groups: the output norm and head, each block from the last to
/// the first, the embedding), and consecutive groups are cut into buckets of about `cap_bytes`.
/// A bucket may be summed over the group once the backward has finished every group in it; the
/// buckets start strictly in order, so every rank issues the same collectives in the same order
/// however its threads were scheduled. Plain class: no CAF, no transport; not thread-safe (the
/// caller locks).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

class gradient_buckets {
 public:
  /// `groups`: parameter indices in the order the backward finishes them; `param_bytes[i]`:
  /// parameter i's gradient size. A bucket closes after the group that brings it to `cap_bytes`
  /// or more (a group is never split); `cap_bytes` <= 0 puts everything in one bucket.
  gradient_buckets(std::vector<std::vector<int>> groups, std::span<const int64_t> param_bytes,
                   int64_t cap_bytes);

  size_t size() const { return buckets_.size(); }
  size_t n_groups() const { return groups_.size(); }
  /// Parameter indices of bucket `b`, in group order.
  const std::vector<int>& params(size_t b) const { return buckets_[b].params; }
  int64_t bytes(size_t b) const { return buckets_[b].bytes; }

  /// A new backward: no group finished, no bucket started.
  void reset();
  /// Group `g` is finished (again: ignored). Returns the buckets that can start now, in order.
  std::vector<size_t> finish_group(size_t g);
  /// Every group is finished: the buckets not yet started, in order.
  std::vector<size_t> finish_all();
  /// Whether every bucket has been returned since reset.
  bool all_started() const { return next_ == buckets_.size(); }

 private:
  struct bucket {
    std::vector<int> params;
    size_t last_group = 0;  ///< it can start once groups 0..last_group are finished
    int64_t bytes = 0;
  };
  std::vector<size_t> startable();

  std::vector<std::vector<int>> groups_;
  std::vector<bucket> buckets_;
  std::vector<uint8_t> finished_;
  size_t finished_prefix_ = 0;  ///< groups 0..finished_prefix_-1 are all finished
  size_t next_ = 0;             ///< the next bucket to start
};

/// The buckets of `model`'s gradients (trainable_model::gradient_groups, f32), of about
/// `cap_bytes` each.
gradient_buckets buckets_of(const trainable_model<float>& model, int64_t cap_bytes);

}  // namespace weft::gpu::train
