#pragma once
// A stand-in collectives engine for tests of device_group and what builds on it (this machine has
// no GPU, so NCCL itself cannot run here: docs/training.md). It does what the NCCL engine
// promises device_group: rank 0's local_address() is the group id, connect(id) joins and blocks
// until every rank joined (or the deadline), all_reduce sums the ranks' regions in place, in rank
// order; its "GPU memory" is host memory. Its ranks are threads of one process.
// register_fakes() registers "fake-collectives" and "fake-collectives-no-gpu-on-rank-1" (whose
// rank 1 fails as the NCCL engine's factory does on a host without a GPU).

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transport/engine.hpp"
#include "transport/registry.hpp"

namespace weft::transport::testing {

/// One group of the stand-in engine: who joined, and the ranks' regions of each collective.
struct fake_world {
  std::mutex mu;
  std::condition_variable cv;
  int size = 0;
  int joined = 0;
  std::map<uint64_t, std::vector<std::pair<float*, size_t>>> posted;  ///< by op sequence number
  std::map<uint64_t, int> finished;                                   ///< ranks released per op
};

inline std::mutex worlds_mu;
inline std::map<uint64_t, std::shared_ptr<fake_world>> worlds;
inline uint64_t next_world = 1;

class fake_collectives final : public engine {
 public:
  fake_collectives(int rank, int size, uint32_t timeout_ms)
      : rank_(rank), size_(size), timeout_ms_(timeout_ms) {
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(worlds_mu);
      id_ = next_world++;
      auto w = std::make_shared<fake_world>();
      w->size = size;
      worlds[id_] = w;
    }
  }
  capabilities caps() const override {
    capabilities c;
    c.name = "fake-collectives";
    c.collectives = true;
    c.gpu_memory = true;
    return c;
  }
  result<region> register_memory(void* data, std::size_t size, memory_kind kind) override {
    if (kind != memory_kind::gpu) return make_status(status_code::unsupported, "gpu only");
    return region{next_region_++, static_cast<std::byte*>(data), size, kind};
  }
  result<region> allocate_memory(std::size_t, memory_kind) override {
    return make_status(status_code::unsupported, "not in the stand-in");
  }
  status release_memory(const region&) override { return ok_status(); }
  result<bytes> describe(const region&) override {
    return make_status(status_code::unsupported, "no one-sided access");
  }
  result<bytes> local_address() override {
    if (rank_ != 0) return make_status(status_code::unsupported, "only rank 0 has the group id");
    bytes b(sizeof id_);
    std::memcpy(b.data(), &id_, sizeof id_);
    return b;
  }
  result<peer_handle> connect(std::span<const std::byte> address) override {
    uint64_t id = 0;
    if (address.size() != sizeof id) return make_status(status_code::invalid_argument, "bad id");
    std::memcpy(&id, address.data(), sizeof id);
    {
      std::lock_guard<std::mutex> lock(worlds_mu);
      auto it = worlds.find(id);
      if (it == worlds.end()) return make_status(status_code::invalid_argument, "no such group");
      world_ = it->second;
    }
    std::unique_lock<std::mutex> lock(world_->mu);
    ++world_->joined;
    world_->cv.notify_all();
    if (!world_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms_),
                             [&] { return world_->joined >= size_; })) {
      return make_status(status_code::timeout, "not every rank joined");
    }
    return peer_handle{1};
  }
  status disconnect(peer_handle) override { return ok_status(); }
  result<remote_region> import_remote(peer_handle, std::span<const std::byte>) override {
    return make_status(status_code::unsupported, "no one-sided access");
  }
  status release_remote(remote_region) override { return ok_status(); }
  status cancel(const transfer&) override { return make_status(status_code::unsupported, "no"); }
  std::size_t progress() override { return 0; }
  progress_mode mode() const override { return progress_mode::manual; }

  /// Blocks until every rank posted its region for this op; sums in rank order into all.
  result<transfer> all_reduce(const collective_request& rq, completion_fn on_done) override {
    if (!world_) return make_status(status_code::invalid_argument, "connect first");
    const uint64_t op = seq_++;
    auto state = make_transfer_state(std::move(on_done));
    std::unique_lock<std::mutex> lock(world_->mu);
    auto& posts = world_->posted[op];
    posts.resize(static_cast<size_t>(size_));
    posts[static_cast<size_t>(rank_)] = {reinterpret_cast<float*>(rq.recv.data), rq.count};
    int arrived = 0;
    for (const auto& p : posts) arrived += p.first != nullptr;
    if (arrived == size_) {
      for (size_t j = 0; j < rq.count; ++j) {
        float s = posts[0].first[j];
        for (size_t r = 1; r < posts.size(); ++r) s += posts[r].first[j];
        for (auto& p : posts) p.first[j] = s;
      }
      world_->finished[op] = 0;
      world_->cv.notify_all();
    }
    const bool done = world_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms_),
                                          [&] { return world_->finished.count(op) > 0; });
    lock.unlock();
    state->finish({done ? ok_status() : make_status(status_code::timeout, "a rank never came"),
                   done ? rq.count * sizeof(float) : 0, 0});
    return transfer(state);
  }

 private:
  int rank_, size_;
  uint32_t timeout_ms_;
  uint64_t id_ = 0;
  uint64_t seq_ = 0;
  uint64_t next_region_ = 1;
  std::shared_ptr<fake_world> world_;
};

inline int param(const engine_config& c, const char* key) {
  auto it = c.params.find(key);
  return it == c.params.end() ? -1 : std::stoi(it->second);
}

inline void register_fakes() {
  register_engine("fake-collectives",
                  [](const engine_config& c) -> result<std::unique_ptr<engine>> {
                    return std::unique_ptr<engine>(new fake_collectives(
                        param(c, "nccl.rank"), param(c, "nccl.world_size"), c.default_timeout_ms));
                  });
  // The same, but rank 1 has no GPU (its factory fails as the NCCL engine's does here).
  register_engine("fake-collectives-no-gpu-on-rank-1",
                  [](const engine_config& c) -> result<std::unique_ptr<engine>> {
                    if (param(c, "nccl.rank") == 1)
                      return make_status(status_code::no_device, "no CUDA device visible");
                    return std::unique_ptr<engine>(new fake_collectives(
                        param(c, "nccl.rank"), param(c, "nccl.world_size"), c.default_timeout_ms));
                  });
}

}  // namespace weft::transport::testing
