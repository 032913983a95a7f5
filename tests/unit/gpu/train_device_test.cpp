// trainable_model::use_device on the CPU device: the device path (train_kernels, device buffers,
// upload on change, gradients added into the host's) gives the host path's bits.
#include <gtest/gtest.h>

#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "gpu/device.hpp"
#include "train_device_check.hpp"

namespace {

using namespace weft::gpu;

TEST(trainable_model_on_a_device, cpu_device_gives_the_host_paths_bits) {
  auto dev = device_registry::instance().create("cpu", device_config{2, 0});
  ASSERT_TRUE(dev.ok());
  for (bool recompute : {false, true}) {
    for (bool tied : {false, true}) {
      const auto d = weft::gpu::testing::compare_device_training(**dev, recompute, tied);
      EXPECT_TRUE(d.bitwise) << "loss " << d.loss_rel << ", gradients " << d.grad_rel;
    }
    // Mixture of experts: routing on the host, mixing and its backward as device ops; with the
    // load-balancing loss too.
    for (double aux : {0.0, 0.02}) {
      const auto moe =
          weft::gpu::testing::compare_device_training(**dev, recompute, false, 3, 4, aux);
      EXPECT_TRUE(moe.bitwise) << "MoE (aux " << aux << "): loss " << moe.loss_rel << ", gradients "
                               << moe.grad_rel;
    }
  }
}

TEST(trainable_model_on_a_device, resident_and_offloaded_steps_give_the_host_loops_bits) {
  // sft_trainer with AdamW, clipping and the gradient sum on the CPU device against the host
  // loop: the same bits; a resumed device run equals the straight one. With the optimizer
  // offloaded each micro-batch's gradients are summed on the host after the fact (the host loop
  // accumulates inside its GEMMs): equal within rounding.
  auto dev = device_registry::instance().create("cpu", device_config{2, 0});
  ASSERT_TRUE(dev.ok());
  const auto resident = weft::gpu::testing::compare_resident_training(**dev, false);
  EXPECT_TRUE(resident.bitwise) << "loss " << resident.loss_rel << ", norm " << resident.norm_rel
                                << ", weights " << resident.weight_rel << ", moments "
                                << resident.moment_rel;
  EXPECT_TRUE(resident.resume_exact);
  const auto offloaded = weft::gpu::testing::compare_resident_training(**dev, true);
  EXPECT_LE(offloaded.loss_rel, 1e-6);
  EXPECT_LE(offloaded.norm_rel, 1e-5);
  EXPECT_LE(offloaded.moment_rel, 1e-4);
  EXPECT_TRUE(offloaded.resume_exact);
}

/// Where two ranks' reducers meet (threads standing in for processes): each hands over its
/// pieces; the last to arrive writes rank 0's + rank 1's (in that order) into both.
class two_rank_sum {
 public:
  weft::gpu::status sum(int rank, std::span<const std::span<float>> pieces, double& loss,
                        int64_t& tokens) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    posted_[rank] = {pieces, &loss, &tokens};
    if (++arrived_ < 2) {
      cv_.wait(lock, [&] { return gen_ != gen; });
      return {};
    }
    auto& a = posted_[0];
    auto& b = posted_[1];
    if (a.pieces.size() != b.pieces.size())
      return {weft::gpu::status_code::internal, "ranks sent different tensor counts"};
    for (size_t i = 0; i < a.pieces.size(); ++i) {
      for (size_t j = 0; j < a.pieces[i].size(); ++j) {
        const float x = a.pieces[i][j] + b.pieces[i][j];
        a.pieces[i][j] = x;
        b.pieces[i][j] = x;
      }
    }
    *a.loss = *b.loss = *a.loss + *b.loss;
    *a.tokens = *b.tokens = *a.tokens + *b.tokens;
    arrived_ = 0;
    ++gen_;
    cv_.notify_all();
    return {};
  }

 private:
  struct post {
    std::span<const std::span<float>> pieces;
    double* loss = nullptr;
    int64_t* tokens = nullptr;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  post posted_[2];
  int arrived_ = 0;
  uint64_t gen_ = 0;
};

TEST(trainable_model_on_a_device, data_parallel_sums_in_device_memory_give_the_host_sums_bits) {
  // Two device-resident ranks: the gradients summed in the devices' own buffers (what NCCL does
  // with --dist-backend nccl; sft_trainer::set_device_reducer) against copied to the host,
  // summed there and copied back (--dist-backend ucx): the same updates, bit for bit.
  using namespace weft::gpu::train;
  auto img = make_tiny_model(weft::gpu::testing::training_model_config(true));
  ASSERT_TRUE(img.ok());
  const sft_dataset data = weft::gpu::testing::random_sft_data(5, 16, 2);
  sft_config sc = weft::gpu::testing::small_sft_config(9, 64, 3);
  sc.max_grad_norm = 0.5;
  auto run = [&](bool in_device_memory) {
    two_rank_sum meet;
    std::vector<checkpoint_state> out(2);
    std::vector<std::vector<step_record>> history(2);
    std::vector<std::pair<int, int>> calls(2);  ///< host, device reducer calls by rank
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto dev = device_registry::instance().create("cpu", device_config{1, 0});
        ASSERT_TRUE(dev.ok());
        auto f = gguf_file::parse(*img);
        ASSERT_TRUE(f.ok());
        auto m = trainable_model<float>::load(*f);
        ASSERT_TRUE(m.ok());
        ASSERT_TRUE((*m)->use_device(dev->get()).ok());
        auto host_reduce = [&meet, &calls, r](std::span<const std::span<float>> g, double& loss,
                                              int64_t& tokens) {
          ++calls[static_cast<size_t>(r)].first;
          return meet.sum(r, g, loss, tokens);
        };
        sft_trainer t(**m, data, sc, host_reduce, r, 2);
        if (in_device_memory) {
          t.set_device_reducer([&meet, &calls, &m, r](std::span<const std::span<float>> g,
                                                      double& loss, int64_t& tokens) {
            ++calls[static_cast<size_t>(r)].second;
            // The device's own buffers, not the host copies.
            EXPECT_NE(g.front().data(), (*m)->gradients().front().data());
            return meet.sum(r, g, loss, tokens);
          });
        }
        ASSERT_TRUE((*m)->device_resident());
        for (int i = 0; i < 3; ++i) {
          auto s = t.step();
          ASSERT_TRUE(s.ok()) << s.error().to_string();
        }
        auto snap = t.snapshot();
        ASSERT_TRUE(snap.ok());
        out[static_cast<size_t>(r)] = std::move(*snap);
        history[static_cast<size_t>(r)] = t.history();
      });
    }
    for (auto& t : ranks) t.join();
    for (const auto& [host_calls, device_calls] : calls) {
      EXPECT_EQ(host_calls, in_device_memory ? 0 : 3);
      EXPECT_EQ(device_calls, in_device_memory ? 3 : 0);
    }
    return std::make_pair(std::move(out), std::move(history));
  };
  const auto [host, host_history] = run(false);
  const auto [device, device_history] = run(true);
  ASSERT_EQ(host.size(), 2u);
  EXPECT_EQ(device_history[0], host_history[0]);
  EXPECT_EQ(device_history[1], device_history[0]);
  EXPECT_EQ(device[0].values, host[0].values);
  EXPECT_EQ(device[1].values, device[0].values);
  EXPECT_EQ(device[0].m, host[0].m);
  EXPECT_EQ(device[0].v, host[0].v);
  // The ranks really trained (the updates moved the weights, the losses are finite).
  EXPECT_GT(host_history[0].size(), 0u);
  EXPECT_TRUE(std::isfinite(host_history[0].back().loss));
}

TEST(trainable_model_on_a_device, resident_state_is_guarded) {
  // Host writes while the device holds newer weights are refused, not silently overwritten.
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});
  ASSERT_TRUE(dev.ok());
  tiny_model_config c;
  auto img = make_tiny_model(c);
  ASSERT_TRUE(img.ok());
  auto f = gguf_file::parse(*img);
  ASSERT_TRUE(f.ok());
  auto m = train::trainable_model<float>::load(*f);
  ASSERT_TRUE(m.ok());
  auto& model = **m;
  EXPECT_FALSE(model.set_device_resident(true).ok());  // no device yet
  ASSERT_TRUE(model.use_device(dev->get()).ok());
  ASSERT_TRUE(model.set_device_resident(true).ok());
  train::train_batch b;
  b.add(std::vector<int32_t>{5, 6, 7, 8, 9}, std::vector<uint8_t>(5, 1));
  train::adamw opt;
  std::vector<int64_t> sizes;
  for (const auto& p : std::as_const(model).parameters()) sizes.push_back(p.size());
  opt.init(sizes);
  const std::vector<uint8_t> decay(sizes.size(), 1);
  model.zero_grad();
  ASSERT_TRUE(model.forward_backward(b).ok());
  auto norm = model.device_step(opt, decay, 0.25f, 1.0, 1e-3, 1);
  ASSERT_TRUE(norm.ok()) << norm.error().to_string();
  EXPECT_GT(*norm, 0.0);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_FALSE(model.host_current());
  EXPECT_FALSE(model.use_device(nullptr).ok());  // would drop the device's weights
  model.parameters()[0].value[0] += 1.0f;        // a host write while the device is newer
  auto refused = model.forward_backward(b);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("pull_to_host"), std::string::npos);
  // A non-finite gradient norm updates nothing and names the step.
  auto fresh = train::trainable_model<float>::load(*f);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*fresh)->use_device(dev->get()).ok());
  ASSERT_TRUE((*fresh)->set_device_resident(true).ok());
  (*fresh)->zero_grad();
  ASSERT_TRUE((*fresh)->forward_backward(b).ok());
  train::adamw opt2;
  opt2.init(sizes);
  auto bad =
      (*fresh)->device_step(opt2, decay, std::numeric_limits<float>::infinity(), 1.0, 1e-3, 7);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("step 7"), std::string::npos);
  EXPECT_EQ(opt2.steps(), 0);
  EXPECT_TRUE((*fresh)->host_current());
}

TEST(trainable_model_on_a_device, refuses_f64_and_detaches) {
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});
  ASSERT_TRUE(dev.ok());
  tiny_model_config c;
  auto img = make_tiny_model(c);
  ASSERT_TRUE(img.ok());
  auto f = gguf_file::parse(*img);
  ASSERT_TRUE(f.ok());
  auto m64 = train::trainable_model<double>::load(*f);
  ASSERT_TRUE(m64.ok());
  EXPECT_EQ((*m64)->use_device(dev->get()).code(), status_code::unsupported);
  auto m32 = train::trainable_model<float>::load(*f);
  ASSERT_TRUE(m32.ok());
  ASSERT_TRUE((*m32)->use_device(dev->get()).ok());
  EXPECT_TRUE((*m32)->use_device(nullptr).ok());
  EXPECT_EQ((*m32)->compute_device(), nullptr);
}

}  // namespace
