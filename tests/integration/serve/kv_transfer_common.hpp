#pragma once
// What the KV-transfer integration test and its peer process share: the same tiny model, cache
// shape and prompt, so both sides compute the same KV.

#include <memory>
#include <random>
#include <vector>

#include "actors/serve/kv_transfer.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"

namespace weft::serve::testing {

inline constexpr int64_t kv_block_size = 4;
inline constexpr int prompt_tokens = 37;

inline std::vector<int32_t> test_prompt() {
  std::mt19937 rng(2);
  std::vector<int32_t> p(prompt_tokens);
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % 300);
  return p;
}

/// SmolLM2-135M's KV shape: 30 layers, 3 KV heads, head_dim 64, fp16, blocks of 16 tokens.
inline gpu::kv_layout smollm2_layout() {
  return gpu::kv_layout{30, 3, 64, 16, gpu::ggml_type::f16};
}

inline kv_transfer_config test_identity() {
  kv_transfer_config c;
  c.model_id = "weft-tiny";
  c.weights_version = 1;
  return c;
}

/// A device, the tiny model and one cache of `n_blocks` (destroy the cache before the model).
struct model_and_cache {
  std::unique_ptr<gpu::device> dev;
  std::unique_ptr<gpu::model> model;
  std::unique_ptr<gpu::kv_cache> kv;

  static std::unique_ptr<model_and_cache> make(int64_t n_blocks) {
    auto m = std::make_unique<model_and_cache>();
    gpu::tiny_model_config c;
    c.output = gpu::output_weight::separate;
    auto img = gpu::make_tiny_model(c);
    if (!img) return nullptr;
    auto f = gpu::gguf_file::parse(*img);
    if (!f) return nullptr;
    auto d = gpu::device_registry::instance().create("cpu", gpu::device_config{1, 0});
    if (!d) return nullptr;
    m->dev = std::move(d.value());
    auto model = gpu::model::load(std::move(f.value()), *m->dev);
    if (!model) return nullptr;
    m->model = std::move(model.value());
    gpu::kv_cache_config kc;
    kc.layout = m->model->kv_layout_for(kv_block_size);
    kc.n_blocks = n_blocks;
    auto kv = gpu::kv_cache::create(*m->dev, kc);
    if (!kv) return nullptr;
    m->kv = std::move(kv.value());
    return m;
  }
  ~model_and_cache() { kv.reset(); }

  /// Runs `tokens` on `seq` and returns the last token's logits (empty on failure).
  std::vector<float> run(gpu::seq_id seq, std::span<const int32_t> tokens) {
    gpu::forward_batch fb;
    fb.add(seq, tokens, true);
    gpu::forward_output out;
    if (!model->forward(fb, *kv, out).ok()) return {};
    return out.logits;
  }
};

}  // namespace weft::serve::testing
