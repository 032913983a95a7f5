#pragma once
/// A trainer rank's gradient all-reduce overlapped with its backward (`weft train --bucket-mb`,
/// docs/training.md "Overlapping the all-reduce"), as PyTorch DDP does it: the gradients are cut
/// into buckets of about the given size in the order the backward finishes them
/// (gpu::train::gradient_buckets), and a thread of this class sums each bucket over the peer group
/// as soon as the backward has finished all of it, while the backward goes on with the earlier
/// layers. Every rank cuts the same buckets from the same model and starts them in the same
/// order, and the group sums each element in rank order (transport::peer_group), so the result is
/// bit for bit that of one all-reduce of every tensor after the backward. Plain code: no CAF.
///
/// Failure: the first failed bucket (a lost peer, the group's deadline, abort) stops the rest and
/// finish() returns it, with "all-reduce" in the message (the trainer restarts the gang on it).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "gpu/train/gradient_buckets.hpp"
#include "gpu/train/sft_trainer.hpp"
#include "transport/peer_group.hpp"

namespace weft::train {

class bucket_reducer final : public gpu::train::overlapped_reducer {
 public:
  /// Sums the loss scalars (and whatever else the step agrees on) once the buckets are done;
  /// `since` is when finish() began.
  using scalars_fn = std::function<gpu::status(double& loss_sum, int64_t& loss_tokens,
                                               std::chrono::steady_clock::time_point since)>;

  /// `peers` must outlive this object; its calls are made from this object's thread between
  /// begin() and finish(), so the caller makes none of its own in that time.
  bucket_reducer(transport::peer_group& peers, gpu::train::gradient_buckets plan,
                 scalars_fn scalars);
  ~bucket_reducer() override;
  /// A reducer of `model`'s gradients in buckets of about `bucket_mb` MiB whose finish() sums no
  /// scalars (weft rl's trainer group sums its own after the gradients).
  static std::unique_ptr<bucket_reducer> gradients_only(
      transport::peer_group& peers, const gpu::train::trainable_model<float>& model,
      double bucket_mb);
  bucket_reducer(const bucket_reducer&) = delete;
  bucket_reducer& operator=(const bucket_reducer&) = delete;

  void begin(std::span<const std::span<float>> grads) override;
  void ready(size_t group) override;
  gpu::status finish(double& loss_sum, int64_t& loss_tokens) override;
  void abandon() override;

  /// Of the last finished step: seconds this object's thread spent in the buckets' all-reduces,
  /// and the seconds finish() waited for them (the part the backward did not hide).
  double busy_seconds() const;
  double waited_seconds() const;
  size_t n_buckets() const { return plan_.size(); }

 private:
  void loop();
  /// Queues `buckets` (under mu_).
  void enqueue(const std::vector<size_t>& buckets);
  /// Waits until every queued bucket is done (under `lock`).
  void drain(std::unique_lock<std::mutex>& lock);

  transport::peer_group& peers_;
  gpu::train::gradient_buckets plan_;
  scalars_fn scalars_;
  std::vector<std::span<float>> grads_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t queued_ = 0, done_ = 0;  ///< this step's buckets handed to the thread / finished by it
  bool skip_ = false;             ///< abandoned or failed: finish the rest without sending
  bool stop_ = false;
  transport::status failed_ = transport::ok_status();
  double busy_s_ = 0.0, waited_s_ = 0.0;
  std::thread thread_;
};

}  // namespace weft::train
