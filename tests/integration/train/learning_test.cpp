// Learning, not just gradients: SFT of a tiny generated model on 2-digit addition ("37+48=" ->
// "85") reaches >= 95 % exact match on held-out prompts within a fixed step budget, greedy-decoded
// by the serving engine from the exported GGUF (docs/training.md).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/tokenizer.hpp"
#include "gpu/train/export.hpp"
#include "gpu/train/sft_data.hpp"
#include "gpu/train/sft_trainer.hpp"

namespace {

namespace fs = std::filesystem;
using namespace weft::gpu;
using namespace weft::gpu::train;

int64_t env_int(const char* name, int64_t def) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : def;
}

TEST(learning, tiny_model_learns_two_digit_addition) {
  tiny_model_config c;
  c.n_layers = static_cast<uint32_t>(env_int("WEFT_LEARN_LAYERS", 2));
  c.n_embd = static_cast<uint32_t>(env_int("WEFT_LEARN_EMBD", 64));
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 2 * c.n_embd;
  auto img = make_tiny_model(c);
  ASSERT_TRUE(img.ok());
  auto file = gguf_file::parse(*img);
  ASSERT_TRUE(file.ok());
  auto tok = tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.ok());

  // Every pair of 2-digit numbers; 200 held out.
  std::vector<std::pair<int, int>> pairs;
  for (int a = 10; a < 100; ++a) {
    for (int b = 10; b < 100; ++b) pairs.emplace_back(a, b);
  }
  std::mt19937 rng(7);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  const std::vector<std::pair<int, int>> held(pairs.begin(), pairs.begin() + 200);
  sft_dataset data;
  for (size_t i = 200; i < pairs.size(); ++i) {
    const auto [a, b] = pairs[i];
    auto ex = encode_sft_line(R"({"prompt": ")" + std::to_string(a) + "+" + std::to_string(b) +
                                  R"(=", "completion": ")" + std::to_string(a + b) + R"("})",
                              *tok, nullptr, {});
    ASSERT_TRUE(ex.ok());
    data.examples.push_back(std::move(*ex));
  }

  auto model = trainable_model<float>::load(*file);
  ASSERT_TRUE(model.ok());
  sft_config sc;
  sc.seed = 1;
  sc.step_tokens = env_int("WEFT_LEARN_BATCH", 1024);
  sc.micro_batch_tokens = sc.step_tokens;
  const int64_t steps = env_int("WEFT_LEARN_STEPS", 1500);
  sc.schedule.peak = static_cast<double>(env_int("WEFT_LEARN_LR_E4", 30)) * 1e-4;
  sc.schedule.warmup_steps = 50;
  sc.schedule.total_steps = steps;
  sc.schedule.min_ratio = 0.05;
  sc.adamw.weight_decay = 0.01;
  sft_trainer trainer(**model, data, sc);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    auto r = trainer.step();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    if (r->step % 250 == 0) std::cout << "step " << r->step << " loss " << r->loss << std::endl;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Held-out exact match, greedy, by the serving engine on the exported weights.
  const fs::path path =
      fs::temp_directory_path() / ("weft_learn_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_TRUE(export_gguf(*file, **model, ggml_type::f32, path).ok());
  auto served = gguf_file::open(path);
  ASSERT_TRUE(served.ok());
  auto dev = device_registry::instance().create("cpu", device_config{2, 0});
  auto em = model::load(std::move(*served), **dev);
  ASSERT_TRUE(em.ok());
  kv_cache_config kc;
  kc.layout = (*em)->kv_layout_for(16);
  kc.n_blocks = 64;
  auto kv = kv_cache::create(**dev, kc);
  int correct = 0;
  for (const auto& [a, b] : held) {
    const std::string prompt = std::to_string(a) + "+" + std::to_string(b) + "=";
    std::vector<int32_t> ids;
    for (auto id : tok->encode(prompt)) ids.push_back(static_cast<int32_t>(id));
    const seq_id s = (*kv)->create_sequence();
    std::vector<token_id> out;
    forward_batch fb;
    fb.add(s, ids, true);
    for (int i = 0; i < 6; ++i) {
      forward_output fo;
      ASSERT_TRUE((*em)->forward(fb, **kv, fo).ok());
      const auto t = static_cast<int32_t>(std::max_element(fo.logits.begin(), fo.logits.end()) -
                                          fo.logits.begin());
      if (tok->is_end_of_generation(t)) break;
      out.push_back(t);
      fb.clear();
      fb.add(s, std::span<const int32_t>(&t, 1), true);
    }
    ASSERT_TRUE((*kv)->free_sequence(s).ok());
    correct += tok->decode(out) == std::to_string(a + b) ? 1 : 0;
  }
  fs::remove(path);
  const double acc = correct / static_cast<double>(held.size());
  std::cout << "[learning] " << steps << " steps in " << secs << " s; held-out exact match "
            << correct << "/" << held.size() << " = " << acc << "\n";
  EXPECT_GE(acc, 0.95);
}

}  // namespace
