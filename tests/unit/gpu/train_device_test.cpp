// trainable_model::use_device on the CPU device: the device path (train_kernels, device buffers,
// upload on change, gradients added into the host's) gives the host path's bits.
#include <gtest/gtest.h>

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
  }
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
