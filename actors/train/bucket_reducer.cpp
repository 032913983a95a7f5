#include "actors/train/bucket_reducer.hpp"

#include <utility>

namespace weft::train {

using clock_type = std::chrono::steady_clock;

bucket_reducer::bucket_reducer(transport::peer_group& peers, gpu::train::gradient_buckets plan,
                               scalars_fn scalars)
    : peers_(peers), plan_(std::move(plan)), scalars_(std::move(scalars)) {
  thread_ = std::thread([this] { loop(); });
}

std::unique_ptr<bucket_reducer> bucket_reducer::gradients_only(
    transport::peer_group& peers, const gpu::train::trainable_model<float>& model,
    double bucket_mb) {
  return std::make_unique<bucket_reducer>(
      peers, gpu::train::buckets_of(model, static_cast<int64_t>(bucket_mb * 1024.0 * 1024.0)),
      [](double&, int64_t&, std::chrono::steady_clock::time_point) { return gpu::status{}; });
}

bucket_reducer::~bucket_reducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    skip_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void bucket_reducer::begin(std::span<const std::span<float>> grads) {
  std::unique_lock<std::mutex> lock(mu_);
  drain(lock);  // a step abandoned before: let its last bucket end
  grads_.assign(grads.begin(), grads.end());
  plan_.reset();
  queue_.clear();
  queued_ = done_ = 0;
  skip_ = false;
  failed_ = transport::ok_status();
  busy_s_ = 0.0;
}

void bucket_reducer::enqueue(const std::vector<size_t>& buckets) {
  for (const size_t b : buckets) queue_.push_back(b);
  queued_ += buckets.size();
  if (!buckets.empty()) cv_.notify_all();
}

void bucket_reducer::drain(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return done_ == queued_; });
}

void bucket_reducer::ready(size_t group) {
  std::lock_guard<std::mutex> lock(mu_);
  enqueue(plan_.finish_group(group));
}

void bucket_reducer::abandon() {
  std::unique_lock<std::mutex> lock(mu_);
  skip_ = true;
  drain(lock);
}

gpu::status bucket_reducer::finish(double& loss_sum, int64_t& loss_tokens) {
  const auto t0 = clock_type::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    enqueue(plan_.finish_all());
    drain(lock);
    waited_s_ = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (!failed_.ok())
      return {gpu::status_code::internal, "gradient all-reduce: " + failed_.to_string()};
  }
  return scalars_(loss_sum, loss_tokens, t0);
}

double bucket_reducer::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_;
}

double bucket_reducer::waited_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waited_s_;
}

void bucket_reducer::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    const size_t b = queue_.front();
    queue_.pop_front();
    if (!skip_) {
      std::vector<std::span<float>> pieces;
      for (const int i : plan_.params(b)) pieces.push_back(grads_[static_cast<size_t>(i)]);
      lock.unlock();
      const auto t0 = clock_type::now();
      auto s = peers_.all_reduce_sum(std::span<const std::span<float>>(pieces));
      const double took = std::chrono::duration<double>(clock_type::now() - t0).count();
      lock.lock();
      busy_s_ += took;
      if (!s.ok() && failed_.ok()) {
        failed_ = std::move(s);
        skip_ = true;  // the group is broken: the later buckets are not sent
      }
    }
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace weft::train
