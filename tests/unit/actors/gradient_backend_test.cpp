// --dist-backend: where a trainer group sums its gradients, decided alike on every rank from the
// ranks' (host, GPU) keys (actors/train/gradient_backend.hpp).

#include <gtest/gtest.h>

#include "actors/train/gradient_backend.hpp"

namespace weft::train {
namespace {

TEST(gradient_backend, auto_takes_the_gpus_when_every_rank_has_its_own) {
  const uint64_t a = 0x1111, b = 0x2222;
  const auto c = choose_gradient_backend(
      "auto", {device_key(a, 0), device_key(a, 1), device_key(b, 0), device_key(b, 1)});
  EXPECT_TRUE(c.device);
  EXPECT_FALSE(c.refused);
  EXPECT_TRUE(c.why.empty());
  EXPECT_NE(device_key(a, 0), 0u);
  EXPECT_NE(device_key(a, 0), device_key(a, 1));
  EXPECT_NE(device_key(a, 0), device_key(b, 0));
}

TEST(gradient_backend, auto_falls_back_to_the_host_saying_why) {
  // A rank on the host (or with its optimizer offloaded) contributes 0.
  auto c = choose_gradient_backend("auto", {device_key(7, 0), 0});
  EXPECT_FALSE(c.device);
  EXPECT_FALSE(c.refused);
  EXPECT_NE(c.why.find("rank 1 keeps its gradients in host memory"), std::string::npos) << c.why;
  // Two ranks on one GPU (--device cuda:0 for both): NCCL cannot put them in one communicator.
  c = choose_gradient_backend("auto", {device_key(7, 0), device_key(9, 0), device_key(7, 0)});
  EXPECT_FALSE(c.device);
  EXPECT_NE(c.why.find("ranks 0 and 2 share one GPU"), std::string::npos) << c.why;
}

TEST(gradient_backend, nccl_is_refused_where_a_rank_cannot_and_ucx_never_uses_the_gpus) {
  auto c = choose_gradient_backend("nccl", {0, 0});
  EXPECT_FALSE(c.device);
  EXPECT_TRUE(c.refused);
  EXPECT_NE(c.why.find("rank 0"), std::string::npos);
  c = choose_gradient_backend("nccl", {device_key(1, 0), device_key(1, 1)});
  EXPECT_TRUE(c.device);
  EXPECT_FALSE(c.refused);
  c = choose_gradient_backend("ucx", {device_key(1, 0), device_key(1, 1)});
  EXPECT_FALSE(c.device);
  EXPECT_FALSE(c.refused);
  EXPECT_EQ(c.why, "--dist-backend ucx");
  // One rank: nothing to sum, whatever was asked.
  EXPECT_FALSE(choose_gradient_backend("nccl", {device_key(1, 0)}).refused);
}

}  // namespace
}  // namespace weft::train
