#pragma once
/// How the api actor hands a sequence's token chunks to the HTTP thread serving its request: one
/// channel per HTTP request (a queue with a condition variable), and a hub mapping each sequence id
/// to its channel and choice index. Plain C++, thread-safe; used only by api_server.cpp.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu/sampler.hpp"
#include "schema/envelope.hpp"

namespace weft::serve {

namespace wire = schema::wire;

/// An event for one choice: the admission answer, or a chunk of tokens / the finish.
struct choice_event {
  int choice = 0;
  bool ack = false;  ///< admission answer (err says whether it was refused)
  error err;
  std::vector<int32_t> tokens;
  std::vector<gpu::sample_result> logprobs;
  wire::FinishReason finish = wire::FinishReason::NONE;
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;
  std::vector<float> embedding;  ///< an embedding request's vector (with its finish)
};

class stream_channel {
 public:
  void push(choice_event e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  std::optional<choice_event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    auto e = std::move(q_.front());
    q_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<choice_event> q_;
};

/// Sequence id -> the channel of its HTTP request and its choice index there.
class stream_hub {
 public:
  void add(uint64_t id, std::shared_ptr<stream_channel> ch, int choice) {
    std::lock_guard<std::mutex> lock(mu_);
    m_[id] = {std::move(ch), choice};
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    m_.erase(id);
  }
  void deliver(uint64_t id, choice_event e) {
    std::shared_ptr<stream_channel> ch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = m_.find(id);
      if (it == m_.end()) return;
      ch = it->second.first;
      e.choice = it->second.second;
    }
    ch->push(std::move(e));
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::pair<std::shared_ptr<stream_channel>, int>> m_;
};

}  // namespace weft::serve
