#pragma once
// A generated tiny model for the RL unit tests (rl_test.cpp, rl_loop_test.cpp).

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include "gpu/gguf.hpp"
#include "gpu/tiny_model.hpp"

namespace weft::gpu::rl_test {

inline tiny_model_config tiny_cfg(uint64_t seed = 42) {
  tiny_model_config c;
  c.n_layers = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 64;
  c.n_vocab = 384;
  c.seed = seed;
  return c;
}

inline gguf_file tiny_file(uint64_t seed = 42) {
  auto img = make_tiny_model(tiny_cfg(seed));
  EXPECT_TRUE(img.ok());
  auto f = gguf_file::parse(*img);
  EXPECT_TRUE(f.ok());
  return std::move(f.value());
}

}  // namespace weft::gpu::rl_test
