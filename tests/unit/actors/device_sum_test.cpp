// form_device_sum (actors/train/device_sum.hpp): where a trainer group of `weft train` or
// `weft rl` sums its gradients, decided alike on every rank and, for the GPUs, the group's
// communicator joined — here over three in-process ranks with the stand-in collectives engine
// (tests/unit/transport/fake_collectives.hpp; NCCL itself cannot run on this machine).
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/train/device_sum.hpp"
#include "tests/unit/transport/fake_collectives.hpp"
#include "transport/peer_group.hpp"
#include "transport/registry.hpp"

namespace weft::train {
namespace {

constexpr int k_ranks = 3;

/// form_device_sum on every rank (a thread each) with `requested`, rank r's CUDA ordinal
/// `cuda[r]` and `engine`; then `use(sum, rank)` where it formed. The results by rank.
std::vector<result<device_sum>> on_every_rank(
    const std::string& requested, const std::vector<int>& cuda, const std::string& engine,
    const std::function<void(device_sum&, int)>& use = [](device_sum&, int) {}) {
  transport::testing::register_fakes();
  std::vector<std::unique_ptr<transport::engine>> engines;
  std::vector<transport::bytes> addresses;
  for (int r = 0; r < k_ranks; ++r) {
    auto e = transport::make_engine("inproc", {});
    EXPECT_TRUE(e.ok());
    auto a = (*e)->local_address();
    EXPECT_TRUE(a.ok());
    addresses.push_back(*a);
    engines.push_back(std::move(*e));
  }
  std::vector<std::optional<result<device_sum>>> out(k_ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < k_ranks; ++r) {
    threads.emplace_back([&, r] {
      auto peers = transport::peer_group::connect(*engines[static_cast<size_t>(r)], r, addresses);
      ASSERT_TRUE(peers.ok());
      auto sum = form_device_sum(**peers, requested, cuda[static_cast<size_t>(r)], 10'000, engine);
      if (sum && sum->group) use(*sum, r);
      out[static_cast<size_t>(r)].emplace(std::move(sum));
    });
  }
  for (auto& t : threads) t.join();
  std::vector<result<device_sum>> done;
  for (auto& o : out) done.push_back(std::move(*o));
  return done;
}

TEST(device_sum, every_rank_on_a_gpu_of_its_own_sums_on_the_gpus) {
  std::vector<std::vector<float>> grads(k_ranks);
  auto sums = on_every_rank("auto", {0, 1, 2}, "fake-collectives", [&](device_sum& s, int r) {
    EXPECT_EQ(s.group->size(), k_ranks);
    EXPECT_EQ(s.group->rank(), r);
    auto& g = grads[static_cast<size_t>(r)];
    g = {1.0f * static_cast<float>(r + 1), -2.0f, 0.5f};
    const std::span<float> pieces[1] = {g};
    EXPECT_TRUE(s.group->all_reduce_sum(pieces).ok());
  });
  for (auto& s : sums) {
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_NE(s->group, nullptr);
  }
  for (const auto& g : grads) EXPECT_EQ(g, (std::vector<float>{6.0f, -6.0f, 1.5f}));
  // --dist-backend nccl asks for the same.
  for (auto& s : on_every_rank("nccl", {0, 1, 2}, "fake-collectives")) {
    ASSERT_TRUE(s.ok());
    EXPECT_NE(s->group, nullptr);
  }
}

TEST(device_sum, a_rank_without_a_gpu_sums_in_host_memory_or_refuses_nccl) {
  for (auto& s : on_every_rank("auto", {0, -1, 2}, "fake-collectives")) {
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->group, nullptr);
    EXPECT_FALSE(s->join_failed);
    EXPECT_NE(s->why.find("rank 1 keeps its gradients in host memory"), std::string::npos)
        << s->why;
  }
  for (auto& s : on_every_rank("nccl", {0, -1, 2}, "fake-collectives")) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, errc::invalid_argument);
    EXPECT_EQ(s.error().message.rfind("--dist-backend nccl: rank 1", 0), 0u) << s.error().message;
  }
  // Two ranks on one GPU: NCCL needs a GPU per rank.
  for (auto& s : on_every_rank("auto", {0, 1, 1}, "fake-collectives")) {
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->group, nullptr);
    EXPECT_NE(s->why.find("ranks 1 and 2 share one GPU"), std::string::npos) << s->why;
  }
  for (auto& s : on_every_rank("ucx", {0, 1, 2}, "fake-collectives")) {
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->group, nullptr);
    EXPECT_EQ(s->why, "--dist-backend ucx");
  }
}

TEST(device_sum, a_communicator_that_does_not_form_falls_back_under_auto_only) {
  // Rank 1's engine fails as NCCL's does without a usable GPU: every rank learns it.
  for (auto& s : on_every_rank("auto", {0, 1, 2}, "fake-collectives-no-gpu-on-rank-1")) {
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->group, nullptr);
    EXPECT_TRUE(s->join_failed);
    EXPECT_NE(s->why.find("NCCL group not formed"), std::string::npos) << s->why;
  }
  for (auto& s : on_every_rank("nccl", {0, 1, 2}, "fake-collectives-no-gpu-on-rank-1")) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, errc::invalid_argument);
    EXPECT_EQ(s.error().message.rfind("--dist-backend nccl: ", 0), 0u) << s.error().message;
  }
}

TEST(device_sum, cuda_ordinal_reads_the_device_option) {
  EXPECT_EQ(cuda_ordinal("cuda"), 0);
  EXPECT_EQ(cuda_ordinal("cuda:3"), 3);
  EXPECT_EQ(cuda_ordinal("cpu"), -1);
  EXPECT_EQ(cuda_ordinal("cpu:0"), -1);
  EXPECT_EQ(cuda_ordinal("cuda:x"), -1);
  EXPECT_EQ(cuda_ordinal("cudax"), -1);
}

}  // namespace
}  // namespace weft::train
