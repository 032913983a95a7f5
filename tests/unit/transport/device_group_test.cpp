// device_group: the NCCL-shaped bootstrap over a peer group and the in-place sums, on a stand-in
// collectives engine (this machine has no GPU, so NCCL itself cannot run here: docs/training.md).
// The stand-in does what the NCCL engine promises device_group: rank 0's local_address() is the
// group id, connect(id) joins and blocks until every rank joined (or the deadline), all_reduce
// sums the ranks' regions in place; its "GPU memory" is host memory.

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/device_group.hpp"
#include "transport/peer_group.hpp"
#include "transport/registry.hpp"

namespace weft::transport::testing {
namespace {

/// One group of the stand-in engine: who joined, and the ranks' regions of each collective.
struct fake_world {
  std::mutex mu;
  std::condition_variable cv;
  int size = 0;
  int joined = 0;
  std::map<uint64_t, std::vector<std::pair<float*, size_t>>> posted;  ///< by op sequence number
  std::map<uint64_t, int> finished;                                   ///< ranks released per op
};

std::mutex worlds_mu;
std::map<uint64_t, std::shared_ptr<fake_world>> worlds;
uint64_t next_world = 1;

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

int param(const engine_config& c, const char* key) {
  auto it = c.params.find(key);
  return it == c.params.end() ? -1 : std::stoi(it->second);
}

void register_fakes() {
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

class device_group_test : public ::testing::Test {
 protected:
  void SetUp() override {
    register_fakes();
    for (int r = 0; r < k_; ++r) {
      auto e = make_engine("inproc", {});
      ASSERT_TRUE(e.ok()) << e.error().to_string();
      auto a = (*e)->local_address();
      ASSERT_TRUE(a.ok());
      addresses_.push_back(*a);
      engines_.push_back(std::move(*e));
    }
  }

  /// device_group::join on every rank (its own thread), then `fn(group, rank)` where it joined;
  /// the join results by rank.
  std::vector<status> on_every_rank(
      const std::string& engine_name,
      const std::function<void(device_group&, int)>& fn = [](device_group&, int) {}) {
    std::vector<status> out(static_cast<size_t>(k_));
    std::vector<std::thread> threads;
    for (int r = 0; r < k_; ++r) {
      threads.emplace_back([&, r] {
        auto peers = peer_group::connect(*engines_[static_cast<size_t>(r)], r, addresses_);
        ASSERT_TRUE(peers.ok());
        device_group_options o;
        o.engine = engine_name;
        o.device = r;
        o.timeout_ms = 10'000;
        auto g = device_group::join(**peers, o);
        if (!g) {
          out[static_cast<size_t>(r)] = g.error();
          return;
        }
        EXPECT_EQ((*g)->rank(), r);
        EXPECT_EQ((*g)->size(), k_);
        fn(**g, r);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  int k_ = 3;
  std::vector<std::unique_ptr<engine>> engines_;
  std::vector<bytes> addresses_;
};

TEST_F(device_group_test, joins_and_sums_pieces_in_place_on_every_rank) {
  std::vector<std::vector<std::vector<float>>> data(3);
  auto joined = on_every_rank("fake-collectives", [&](device_group& g, int r) {
    auto& mine = data[static_cast<size_t>(r)];
    mine = {std::vector<float>(1000), std::vector<float>(7), std::vector<float>(3)};
    for (auto& v : mine) {
      for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>((r + 1) * 100 + j);
    }
    std::vector<std::span<float>> pieces(mine.begin(), mine.end());
    for (int round = 0; round < 2; ++round) {  // the regions are registered once, then reused
      auto s = g.all_reduce_sum(pieces);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
  });
  for (const auto& s : joined) EXPECT_TRUE(s.ok()) << s.to_string();
  for (int r = 0; r < 3; ++r) {
    for (const auto& v : data[static_cast<size_t>(r)]) {
      // (100 + j) + (200 + j) + (300 + j), summed again by the second round (x 3).
      for (size_t j = 0; j < v.size(); ++j)
        ASSERT_EQ(v[j], 3.0f * (600.0f + 3.0f * static_cast<float>(j))) << "rank " << r;
    }
  }
}

TEST_F(device_group_test, a_rank_without_a_gpu_fails_the_join_on_every_rank) {
  // No rank waits for one that could not make its engine; every rank names rank 1.
  auto joined = on_every_rank("fake-collectives-no-gpu-on-rank-1");
  for (int r = 0; r < 3; ++r) {
    const auto& s = joined[static_cast<size_t>(r)];
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_NE(s.message.find("failed on rank 1"), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(joined[1].code, status_code::no_device);
  EXPECT_NE(joined[1].message.find("no CUDA device"), std::string::npos);
  EXPECT_EQ(joined[0].code, status_code::unsupported);
}

TEST_F(device_group_test, an_unknown_engine_fails_the_join_on_every_rank) {
  // What a build without NCCL does with the default engine name: a clear error on every rank.
  auto joined = on_every_rank("no-such-collectives-engine");
  for (const auto& s : joined) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message.find("failed on ranks 0, 1, 2"), std::string::npos) << s.to_string();
  }
}

TEST(device_group_of_one, joins_and_leaves_its_pieces_as_they_are) {
  // A group of one rank (`weft train` on one GPU with a device reducer): nothing to wait for.
  register_fakes();
  auto e = make_engine("inproc", {});
  ASSERT_TRUE(e.ok());
  auto a = (*e)->local_address();
  ASSERT_TRUE(a.ok());
  auto peers = peer_group::connect(**e, 0, {*a});
  ASSERT_TRUE(peers.ok());
  device_group_options o;
  o.engine = "fake-collectives";
  auto g = device_group::join(**peers, o);
  ASSERT_TRUE(g.ok()) << g.error().to_string();
  std::vector<float> v = {1.5f, -2.0f, 3.25f};
  const std::span<float> pieces[1] = {v};
  ASSERT_TRUE((*g)->all_reduce_sum(pieces).ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.25f}));
}

}  // namespace
}  // namespace weft::transport::testing
