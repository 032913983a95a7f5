// Embeddings from the engine (sampling_params::pooling, `/v1/embeddings`): the hidden state the
// model returns is the output head's input (the head applied to it gives the logits), mean pooling
// is the mean of every prompt token's state whatever the chunking and the prefix cache, and an
// embedding request shares the engine with generating ones.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"
#include "tests/unit/gpu/tiny_engine_support.hpp"

namespace {

using namespace weft::gpu;
using weft::gpu::engine_test::load_tiny_model;
using weft::gpu::engine_test::loaded;
using weft::gpu::engine_test::prompt_of;

tiny_model_config f32_model() {
  tiny_model_config c;
  c.n_layers = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 128;
  c.output = output_weight::separate;
  return c;
}

std::unique_ptr<kv_cache> cache(loaded& l) {
  kv_cache_config kc;
  kc.layout = l.m->kv_layout_for(4);
  kc.n_blocks = 64;
  return std::move(kv_cache::create(*l.dev, kc).value());
}

/// Runs the engine dry; the embedding of each request that asked for one.
std::map<request_id, std::vector<float>> run(engine& e) {
  std::map<request_id, std::vector<float>> out;
  for (int guard = 0; e.has_work() && guard < 10000; ++guard) {
    auto r = e.step();
    EXPECT_TRUE(r.ok());
    for (auto& o : *r) {
      EXPECT_NE(o.finish, finish_reason::error) << o.error;
      if (!o.embedding.empty()) {
        EXPECT_EQ(o.finish, finish_reason::length);
        EXPECT_TRUE(o.new_tokens.empty());
        out[o.id] = o.embedding;
      }
    }
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

TEST(model_hidden, the_output_head_applied_to_the_hidden_state_gives_the_logits) {
  auto l = load_tiny_model(f32_model());
  const auto p = prompt_of(13, 3);
  forward_output with_logits, with_hidden;
  for (bool hidden : {false, true}) {
    auto kv = cache(l);
    forward_batch fb;
    fb.add(kv->create_sequence(), p, true);
    if (hidden) {
      fb.want_hidden.assign(p.size(), 0);
      fb.want_hidden.back() = 1;
    }
    ASSERT_TRUE(l.m->forward(fb, *kv, hidden ? with_hidden : with_logits).ok());
  }
  ASSERT_EQ(with_hidden.token_index.size(), 0u);  // the token asked for its state, not logits
  ASSERT_EQ(with_hidden.hidden_index, std::vector<int32_t>{12});
  const int64_t d = l.m->hparams().n_embd;
  ASSERT_EQ(static_cast<int64_t>(with_hidden.hidden.size()), d);
  const gguf_tensor* head = l.m->file().find_tensor("output.weight");
  ASSERT_NE(head, nullptr);
  ASSERT_EQ(head->type, ggml_type::f32);
  const auto* w = reinterpret_cast<const float*>(head->data);
  double worst = 0, scale = 0;
  for (int64_t v = 0; v < with_logits.n_vocab; ++v) {
    double z = 0;
    for (int64_t i = 0; i < d; ++i) z += static_cast<double>(w[v * d + i]) * with_hidden.hidden[i];
    worst = std::max(worst, std::fabs(z - with_logits.logits[static_cast<size_t>(v)]));
    scale = std::max(scale, std::fabs(z));
  }
  EXPECT_LT(worst, 1e-4 * (1 + scale));
}

TEST(engine_embeddings, mean_pooling_is_the_mean_of_every_prompt_tokens_state) {
  auto l = load_tiny_model(f32_model());
  const auto p = prompt_of(23, 5);
  // Reference: every token's state from one forward pass, averaged here.
  std::vector<double> mean(static_cast<size_t>(l.m->hparams().n_embd), 0.0);
  {
    auto kv = cache(l);
    forward_batch fb;
    fb.add(kv->create_sequence(), p, false);
    fb.want_hidden.assign(p.size(), 1);
    forward_output out;
    ASSERT_TRUE(l.m->forward(fb, *kv, out).ok());
    ASSERT_EQ(out.hidden_index.size(), p.size());
    for (size_t r = 0; r < p.size(); ++r)
      for (size_t i = 0; i < mean.size(); ++i) mean[i] += out.hidden[r * mean.size() + i];
    for (auto& x : mean) x /= static_cast<double>(p.size());
  }
  const std::vector<float> expect(mean.begin(), mean.end());
  // Through the engine, in chunks of 8 and 64 tokens, twice (the second time the prompt's blocks
  // are in the prefix cache: mean pooling must compute them anyway), beside a generating request.
  for (int64_t budget : {8, 64}) {
    engine_config ec;
    ec.kv_blocks = 64;
    ec.block_size = 4;
    ec.max_batch_tokens = budget;
    auto e = std::move(engine::create(*l.m, ec).value());
    sampling_params emb;
    emb.pooling = pooling_type::mean;
    sampling_params gen;
    gen.max_tokens = 5;
    ASSERT_TRUE(e->add_request(1, p, emb).ok());
    ASSERT_TRUE(e->add_request(2, p, gen).ok());
    auto first = run(*e);
    ASSERT_TRUE(e->add_request(3, p, emb).ok());
    auto second = run(*e);
    ASSERT_EQ(first.count(1), 1u);
    ASSERT_EQ(second.count(3), 1u);
    // Chunks change the GEMM shapes (rounding only).
    EXPECT_LT(max_abs_diff(first[1], expect), 1e-4) << "budget " << budget;
    EXPECT_EQ(first[1], second[3]) << "budget " << budget;
    EXPECT_EQ(first.count(2), 0u);  // the generating request returned tokens, no embedding
    EXPECT_TRUE(e->kv().check_invariants().ok());
    EXPECT_EQ(e->kv().stats().n_sequences, 0);
  }
}

TEST(engine_embeddings, last_pooling_is_the_last_tokens_state_and_bad_requests_are_refused) {
  auto l = load_tiny_model(f32_model());
  const auto p = prompt_of(17, 8);
  std::vector<float> expect;
  {
    auto kv = cache(l);
    forward_batch fb;
    fb.add(kv->create_sequence(), p, false);
    fb.want_hidden.assign(p.size(), 0);
    fb.want_hidden.back() = 1;
    forward_output out;
    ASSERT_TRUE(l.m->forward(fb, *kv, out).ok());
    expect = out.hidden;
  }
  engine_config ec;
  ec.kv_blocks = 64;
  ec.block_size = 4;
  ec.max_batch_tokens = 6;
  auto e = std::move(engine::create(*l.m, ec).value());
  sampling_params emb;
  emb.pooling = pooling_type::last;
  ASSERT_TRUE(e->add_request(1, p, emb).ok());
  auto got = run(*e);
  EXPECT_LT(max_abs_diff(got[1], expect), 1e-5);
  // A prompt's cached blocks may serve last pooling: the last token is always computed.
  ASSERT_TRUE(e->add_request(2, p, emb).ok());
  got = run(*e);
  EXPECT_LT(max_abs_diff(got[2], expect), 1e-5);

  sampling_params bad = emb;
  bad.grammar = "root ::= \"a\"";
  EXPECT_EQ(e->add_request(3, p, bad).code(), status_code::invalid_argument);
  EXPECT_EQ(e->add_resumed_request(4, p, 2, emb).code(), status_code::invalid_argument);
}

}  // namespace
