// trainable_model::use_device on the CPU device: the device path (train_kernels, device buffers,
// upload on change, gradients added into the host's) gives the host path's bits.
#include <gtest/gtest.h>

#include <limits>
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
