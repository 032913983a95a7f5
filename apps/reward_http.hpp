#pragma once
/// A user's reward function behind an HTTP endpoint (docs/rl.md, "Rewards from your own
/// program"): `weft rl --reward-url URL` POSTs each batch as
///   {"samples": [{"id": 0, "prompt": "...", "completion": "...", "answer": "..."}, ...]}
/// and takes {"rewards": [r0, r1, ...]} back, one finite number per sample, in order. A failed
/// request (no connection, a timeout, a 5xx or 429) is sent again after a pause, a bounded number
/// of times; a 4xx, or an answer that is not such an object — not JSON, the wrong count, a reward
/// that is not a finite number — fails the run with an error naming the sample, never a silent 0.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/rl/reward_process.hpp"
#include "gpu/status.hpp"

namespace weft::apps {

struct reward_http_config {
  std::string url;  ///< http://host:port/path
  double timeout_s = 60.0;
  int max_retries = 3;
  std::string api_key;  ///< Sent as "Authorization: Bearer KEY" when not empty.
};

class reward_http {
 public:
  /// An error when the URL is not http://host[:port][/path].
  static gpu::result<reward_http> create(reward_http_config config);
  /// Thread-safe: each call has its own connection (`--reward-concurrency` calls at once).
  gpu::result<std::vector<double>> score(std::span<const gpu::rl::reward_request> items) const;
  /// Requests sent again after a failure, since construction (any thread).
  int64_t retries() const { return retries_->load(std::memory_order_relaxed); }

 private:
  reward_http_config config_;
  std::string host_port_;  ///< scheme://host:port
  std::string path_;
  std::shared_ptr<std::atomic<int64_t>> retries_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace weft::apps
