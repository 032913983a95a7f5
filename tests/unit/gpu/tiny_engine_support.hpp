#pragma once
// A generated tiny model loaded on the CPU device, and random prompts, for the engine's unit tests
// (engine_test, engine_policy_test, engine_resume_test, engine_embedding_test).

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"

namespace weft::gpu::engine_test {

struct loaded {
  std::unique_ptr<device> dev;
  std::unique_ptr<model> m;
};

/// Generates the model of `cfg` and loads it on a CPU device with `threads` threads.
inline loaded load_tiny_model(const tiny_model_config& cfg, int threads = 2) {
  loaded l;
  auto img = make_tiny_model(cfg);
  EXPECT_TRUE(img.ok()) << (img.ok() ? "" : img.error().to_string());
  if (!img.ok()) return l;
  auto f = gguf_file::parse(*img);
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().to_string());
  if (!f.ok()) return l;
  l.dev = std::move(device_registry::instance().create("cpu", device_config{threads, 0}).value());
  auto m = model::load(std::move(f.value()), *l.dev);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
  if (m.ok()) l.m = std::move(m.value());
  return l;
}

/// `n` random token ids in [3, 303): valid in every tiny vocabulary and in the default model's.
inline std::vector<int32_t> prompt_of(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % 300);
  return p;
}

}  // namespace weft::gpu::engine_test
