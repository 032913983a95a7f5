#pragma once
// A generated tiny model for the RL unit tests (rl_test.cpp, rl_loop_test.cpp).

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "gpu/gguf.hpp"
#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/tasks.hpp"
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

/// The GRPO loop's settings of the tests on the tiny model: 4 prompts x 6 samples, 12 new
/// tokens, a constant learning rate of 3e-3.
inline rl::grpo_loop_config tiny_loop_config() {
  rl::grpo_loop_config c;
  c.seed = 11;
  c.prompts_per_step = 4;
  c.group_size = 6;
  c.max_new_tokens = 12;
  c.eval_prompts = 8;
  c.schedule.peak = 3e-3;
  c.schedule.total_steps = 100;
  c.schedule.decay = train::lr_schedule::shape::constant;
  return c;
}

/// A test task with a graded reward a random tiny model gets partly right: the fraction of the
/// completion's characters that are digits.
class digits_task final : public rl::rl_task {
 public:
  std::string name() const override { return "digits"; }
  int64_t size() const override { return 0; }
  rl::rl_prompt problem(uint64_t seed, int64_t index) const override {
    const std::string k = std::to_string((seed * 131 + static_cast<uint64_t>(index)) % 997);
    return rl::rl_prompt{k, "Say some digits after " + k, "", {}, {}};
  }
  double reward(const rl::rl_prompt&, std::string_view c) const override {
    if (c.empty()) return 0.0;
    double d = 0;
    for (char ch : c) d += std::isdigit(static_cast<unsigned char>(ch)) ? 1 : 0;
    return d / static_cast<double>(c.size());
  }
};

}  // namespace weft::gpu::rl_test
