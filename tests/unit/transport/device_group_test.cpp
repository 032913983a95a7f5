// device_group: the NCCL-shaped bootstrap over a peer group and the in-place sums, on a stand-in
// collectives engine (tests/unit/transport/fake_collectives.hpp: this machine has no GPU, so
// NCCL itself cannot run here: docs/training.md).

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/unit/transport/fake_collectives.hpp"
#include "transport/device_group.hpp"
#include "transport/peer_group.hpp"
#include "transport/registry.hpp"

namespace weft::transport::testing {
namespace {

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
