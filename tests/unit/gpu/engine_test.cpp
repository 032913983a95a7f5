// Model + engine on tiny generated GGUF models (dense and MoE): batch invariance, seeds,
// stop strings, aborts, preemption, prefix reuse, KV accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <random>
#include <thread>
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

loaded load_tiny(const tiny_model_config& cfg, int threads = 2) {
  return load_tiny_model(cfg, threads);
}

tiny_model_config dense_q(ggml_type t) {
  tiny_model_config c;
  c.n_layers = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 128;
  c.weight_type = t;
  c.embedding_type = ggml_type::q8_0;
  return c;
}

tiny_model_config moe_q() {
  tiny_model_config c = dense_q(ggml_type::q4_1);
  c.n_expert = 4;
  c.n_expert_used = 2;
  return c;
}

/// The tiny MoE model on the CPU, recording each token's experts (routing replay).
struct recording_moe {
  std::unique_ptr<device> dev;
  std::unique_ptr<model> m;
  recording_moe() {
    auto img = make_tiny_model(moe_q());
    auto f = gguf_file::parse(*img);
    auto d = device_registry::instance().create("cpu", device_config{1, 0});
    if (!f.ok() || !d.ok()) return;
    dev = std::move(*d);
    model_load_config mc;
    mc.record_expert_ids = true;
    if (auto loaded = model::load(std::move(*f), *dev, mc); loaded.ok()) m = std::move(*loaded);
  }
};

// Runs requests to completion; returns generated tokens per id.
std::map<request_id, std::vector<int32_t>> run(engine& e) {
  std::map<request_id, std::vector<int32_t>> out;
  int guard = 0;
  while (e.has_work() && ++guard < 10000) {
    auto r = e.step();
    EXPECT_TRUE(r.ok());
    for (const auto& o : *r) {
      EXPECT_NE(o.finish, finish_reason::error) << o.error;
      out[o.id].insert(out[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  return out;
}

void expect_batch_invariance(const tiny_model_config& cfg, const sampling_params& sp) {
  auto l = load_tiny(cfg);
  engine_config ec;
  ec.kv_blocks = 256;
  ec.max_batch_tokens = 40;  // forces chunked prefill in the batched run
  const auto target = prompt_of(23, 1);
  std::vector<int32_t> alone;
  {
    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->add_request(1, target, sp).ok());
    alone = run(**e)[1];
    EXPECT_EQ((*e)->kv().stats().n_blocks_used, 0);
  }
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  const int lengths[] = {5, 31, 2, 17, 44, 9, 3};
  for (int i = 0; i < 7; ++i) {
    sampling_params other = sp;
    other.seed = 1000 + static_cast<uint64_t>(i);
    other.max_tokens = 5 + 3 * i;
    ASSERT_TRUE(
        (*e)->add_request(100 + static_cast<request_id>(i), prompt_of(lengths[i], 50 + i), other)
            .ok());
    if (i == 3) {
      ASSERT_TRUE((*e)->add_request(1, target, sp).ok());  // joins mid-queue
    }
  }
  auto all = run(**e);
  EXPECT_EQ(all[1], alone);
  EXPECT_EQ(static_cast<int>(alone.size()), sp.max_tokens);
  EXPECT_EQ((*e)->kv().stats().n_blocks_used, 0);
  EXPECT_TRUE((*e)->kv().check_invariants().ok());
}

TEST(engine, greedy_is_batch_invariant_q4_1) {
  sampling_params sp;
  sp.max_tokens = 12;
  expect_batch_invariance(dense_q(ggml_type::q4_1), sp);
}

TEST(engine, seeded_sampling_is_batch_invariant_q8_0) {
  sampling_params sp;
  sp.max_tokens = 12;
  sp.temperature = 0.9f;
  sp.top_p = 0.95f;
  sp.seed = 4242;
  expect_batch_invariance(dense_q(ggml_type::q8_0), sp);
}

TEST(engine, moe_model_runs_and_is_batch_invariant) {
  sampling_params sp;
  sp.max_tokens = 10;
  expect_batch_invariance(moe_q(), sp);
}

TEST(model, moe_routes_to_the_configured_number_of_experts) {
  const recording_moe rm;
  ASSERT_NE(rm.m, nullptr);
  EXPECT_EQ(rm.m->hparams().n_experts, 4);
  kv_cache_config kc;
  kc.layout = rm.m->kv_layout_for(8);
  kc.n_blocks = 8;
  auto kv = kv_cache::create(*rm.dev, kc);
  forward_batch b;
  const seq_id s = (*kv)->create_sequence();
  const auto p = prompt_of(6, 3);
  b.add(s, p, true);
  forward_output out;
  ASSERT_TRUE(rm.m->forward(b, **kv, out).ok());
  ASSERT_EQ(out.expert_ids.size(), 2u);
  ASSERT_EQ(out.expert_ids[0].size(), 6u * 2u);
  for (int32_t e : out.expert_ids[0]) {
    EXPECT_GE(e, 0);
    EXPECT_LT(e, 4);
  }
  for (size_t t = 0; t < 6; ++t) EXPECT_NE(out.expert_ids[1][2 * t], out.expert_ids[1][2 * t + 1]);
}

// Routing replay (RL): the engine keeps every computed position's experts and hands them over on
// the request's last output; the prompt's equal a direct forward's. With the prefix cache on, the
// routes live beside the cached K/V (kv_cache slot payload): a later request that hits the cache
// gets the routes of the pass that computed those blocks. Refused without MoE or without the
// model recording them, and for KV from elsewhere (no routes came with it).
struct routed_run {
  std::vector<int32_t> generated;
  std::vector<uint8_t> routes;
  int64_t cached = 0;
  int outputs_with_routes = 0;
};

routed_run run_routed(engine& e, request_id id, const std::vector<int32_t>& prompt, int n) {
  sampling_params sp;
  sp.max_tokens = n;
  routed_run out;
  EXPECT_TRUE(e.add_request(id, prompt, sp).ok());
  while (e.has_work()) {
    auto r = e.step();
    EXPECT_TRUE(r.ok());
    if (!r.ok()) break;
    for (const auto& o : *r) {
      out.generated.insert(out.generated.end(), o.new_tokens.begin(), o.new_tokens.end());
      out.cached = o.cached_prompt_tokens;
      if (!o.routes.empty()) {
        ++out.outputs_with_routes;
        EXPECT_NE(o.finish, finish_reason::none);
        out.routes = o.routes;
      }
    }
  }
  return out;
}

TEST(engine, records_each_computed_tokens_routes_for_routing_replay) {
  const recording_moe rm;
  ASSERT_NE(rm.m, nullptr);
  engine_config ec;
  ec.record_routes = true;
  ec.block_size = 16;
  ec.prefix_cache = false;
  auto e = engine::create(*rm.m, ec);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  const auto prompt = prompt_of(40, 4);
  const routed_run first = run_routed(**e, 1, prompt, 7);
  ASSERT_EQ(first.generated.size(), 7u);
  EXPECT_EQ(first.outputs_with_routes, 1);
  const size_t width = 2 * 2;  // layers x experts used
  ASSERT_EQ(first.routes.size(), (prompt.size() + first.generated.size() - 1) * width);
  for (size_t at = 0; at < first.routes.size(); at += 2) {
    EXPECT_LT(first.routes[at], 4);
    EXPECT_NE(first.routes[at], first.routes[at + 1]);
  }
  // The prompt's routes are a direct forward's of the prompt (prefill numerics both ways).
  kv_cache_config kc;
  kc.layout = rm.m->kv_layout_for(16);
  kc.n_blocks = 4;
  auto kv = kv_cache::create(*rm.dev, kc);
  forward_batch b;
  b.add((*kv)->create_sequence(), prompt, true);
  forward_output out;
  ASSERT_TRUE(rm.m->forward(b, **kv, out).ok());
  for (size_t t = 0; t < prompt.size(); ++t) {
    for (size_t l = 0; l < 2; ++l) {
      for (size_t j = 0; j < 2; ++j)
        EXPECT_EQ(first.routes[t * width + l * 2 + j], out.expert_ids[l][t * 2 + j])
            << t << " " << l;
    }
  }
  // The prefix cache on: the second run of the prompt takes two cached blocks and their routes,
  // and hands over the same routes as the first; a prompt sharing one block takes that block's.
  ec.prefix_cache = true;
  auto cached = engine::create(*rm.m, ec);
  ASSERT_TRUE(cached.ok()) << cached.error().to_string();
  const routed_run a = run_routed(**cached, 1, prompt, 7);
  const routed_run again = run_routed(**cached, 2, prompt, 7);
  EXPECT_EQ(a.cached, 0);
  EXPECT_EQ(again.cached, 32);
  EXPECT_EQ(a.routes, first.routes);
  EXPECT_EQ(again.generated, first.generated);
  EXPECT_EQ(again.routes, first.routes);
  auto other = prompt;
  for (size_t i = 16; i < other.size(); ++i) other[i] = 3 + (other[i] + 5) % 300;
  const routed_run shares = run_routed(**cached, 3, other, 3);
  EXPECT_EQ(shares.cached, 16);
  ASSERT_GE(shares.routes.size(), 16 * width);
  EXPECT_TRUE(
      std::equal(shares.routes.begin(), shares.routes.begin() + 16 * width, first.routes.begin()));
  // KV from elsewhere brings no routes.
  sampling_params sp;
  sp.max_tokens = 2;
  const seq_id s = (*cached)->kv().create_sequence();
  EXPECT_FALSE((*cached)->add_prefilled_request(9, s, prompt, sp, 0).ok());
  // A dense model, or a model that does not record, cannot.
  auto dense = load_tiny(dense_q(ggml_type::q8_0));
  EXPECT_FALSE(engine::create(*dense.m, ec).ok());
}

TEST(model, chunked_prefill_equals_one_shot_prefill) {
  auto l = load_tiny(dense_q(ggml_type::q4_0));
  kv_cache_config kc;
  kc.layout = l.m->kv_layout_for(4);
  kc.n_blocks = 32;
  auto kv = kv_cache::create(*l.dev, kc);
  const auto p = prompt_of(20, 9);
  forward_output a, b;
  {
    forward_batch fb;
    const seq_id s = (*kv)->create_sequence();
    fb.add(s, p, true);
    ASSERT_TRUE(l.m->forward(fb, **kv, a).ok());
  }
  {
    const seq_id s = (*kv)->create_sequence();
    for (size_t off = 0; off < p.size(); off += 7) {
      forward_batch fb;
      const size_t n = std::min<size_t>(7, p.size() - off);
      fb.add(s, std::span<const int32_t>(p.data() + off, n), off + n == p.size());
      ASSERT_TRUE(l.m->forward(fb, **kv, b).ok());
    }
  }
  EXPECT_EQ(a.logits, b.logits);
}

TEST(model, rejects_bad_batches) {
  auto l = load_tiny(dense_q(ggml_type::q8_0));
  kv_cache_config kc;
  kc.layout = l.m->kv_layout_for(4);
  kc.n_blocks = 4;
  auto kv = kv_cache::create(*l.dev, kc);
  forward_batch fb;
  forward_output out;
  EXPECT_EQ(l.m->forward(fb, **kv, out).code(), status_code::invalid_argument);
  const seq_id s = (*kv)->create_sequence();
  const std::vector<int32_t> bad = {99999};
  fb.add(s, bad, true);
  EXPECT_EQ(l.m->forward(fb, **kv, out).code(), status_code::invalid_argument);
  fb.clear();
  const auto big = prompt_of(17, 1);  // 5 blocks needed, 4 exist
  fb.add(s, big, true);
  EXPECT_EQ(l.m->forward(fb, **kv, out).code(), status_code::out_of_memory);
  EXPECT_TRUE((*kv)->check_invariants().ok());
}

TEST(engine, stop_strings_and_tokens_finish_without_leaking_text) {
  auto l = load_tiny(dense_q(ggml_type::q8_0));
  // Learn what greedy produces, then stop on a piece of it.
  engine_config ec;
  ec.detokenize = [](int32_t t) { return std::string(1, static_cast<char>('a' + t % 26)); };
  auto e = engine::create(*l.m, ec);
  sampling_params sp;
  sp.max_tokens = 8;
  ASSERT_TRUE((*e)->add_request(1, prompt_of(5, 2), sp).ok());
  const auto toks = run(**e)[1];
  ASSERT_EQ(toks.size(), 8u);
  std::string full;
  for (int32_t t : toks) full += ec.detokenize(t);
  sampling_params stop = sp;
  stop.stop_strings = {full.substr(3, 2)};
  ASSERT_TRUE((*e)->add_request(2, prompt_of(5, 2), stop).ok());
  std::string text;
  finish_reason reason = finish_reason::none;
  while ((*e)->has_work()) {
    auto r = (*e)->step();
    ASSERT_TRUE(r.ok());
    for (const auto& o : *r) {
      text += o.text_delta;
      if (o.finish != finish_reason::none) reason = o.finish;
    }
  }
  EXPECT_EQ(reason, finish_reason::stop_string);
  EXPECT_EQ(text, full.substr(0, full.find(stop.stop_strings[0])));
  sampling_params st = sp;
  st.stop_tokens = {toks.back()};
  ASSERT_TRUE((*e)->add_request(3, prompt_of(5, 2), st).ok());
  auto out = run(**e);
  const auto first = std::find(toks.begin(), toks.end(), toks.back());
  EXPECT_EQ(out[3],
            std::vector<int32_t>(toks.begin(), first));  // the stop token itself is not emitted
  EXPECT_EQ((*e)->kv().stats().n_blocks_used, 0);
}

TEST(engine, abort_and_preemption_free_every_block) {
  auto l = load_tiny(dense_q(ggml_type::q4_1));
  engine_config ec;
  ec.kv_blocks = 12;  // 12 x 16 tokens: forces swapping with 6 long requests
  ec.max_batch_tokens = 64;
  auto e = engine::create(*l.m, ec);
  sampling_params sp;
  sp.max_tokens = 40;
  for (request_id i = 0; i < 6; ++i)
    ASSERT_TRUE((*e)->add_request(i, prompt_of(20, static_cast<uint32_t>(i)), sp).ok());
  std::map<request_id, std::vector<int32_t>> early;
  for (int s = 0; s < 5; ++s) {
    auto r = (*e)->step();
    ASSERT_TRUE(r.ok());
    for (const auto& o : *r)
      early[o.id].insert(early[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
  }
  ASSERT_TRUE((*e)->abort(2).ok());
  EXPECT_EQ((*e)->abort(2).code(), status_code::not_found);
  auto out = run(**e);
  for (auto& [id, v] : early) out[id].insert(out[id].begin(), v.begin(), v.end());
  for (request_id i : {0, 1, 3, 4, 5}) EXPECT_EQ(out[i].size(), 40u) << i;
  EXPECT_GT((*e)->stats().n_preemptions, 0);
  EXPECT_EQ((*e)->kv().stats().n_blocks_used, 0);
  EXPECT_TRUE((*e)->kv().check_invariants().ok());
  // A prompt larger than the whole cache fails cleanly.
  ASSERT_TRUE((*e)->add_request(9, prompt_of(400, 1), sp).ok());
  auto r = (*e)->step();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].finish, finish_reason::error);
}

// A pass with no decode in it takes idle_batch_tokens of prompt; once anything decodes, passes go
// back to max_batch_tokens (the decodes first, prompt chunks in what is left).
TEST(engine, passes_without_decodes_take_the_idle_budget) {
  auto l = load_tiny(dense_q(ggml_type::q8_0));
  engine_config ec;
  ec.max_batch_tokens = 16;
  ec.idle_batch_tokens = 64;
  ec.prefix_cache = false;
  auto e = engine::create(*l.m, ec);
  sampling_params sp;
  sp.max_tokens = 8;
  ASSERT_TRUE((*e)->add_request(1, prompt_of(100, 3), sp).ok());
  ASSERT_TRUE((*e)->step().ok());
  EXPECT_EQ((*e)->stats().n_prefill_tokens, 64);
  auto r = (*e)->step();  // the last 36 prompt tokens and the first output token
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*e)->stats().n_prefill_tokens, 100);
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].new_tokens.size(), 1u);
  // Request 1 decodes now: request 2's prompt gets the 15 tokens its decode leaves.
  ASSERT_TRUE((*e)->add_request(2, prompt_of(100, 4), sp).ok());
  ASSERT_TRUE((*e)->step().ok());
  EXPECT_EQ((*e)->stats().n_prefill_tokens, 115);
  run(**e);
  EXPECT_EQ((*e)->kv().stats().n_blocks_used, 0);
}

// Runs `e` until idle: the tokens generated (one request's) and the most prompt tokens an output
// reported served from the prefix cache.
std::pair<std::vector<int32_t>, int64_t> run_one_counting_cached(engine& e) {
  int64_t cached = 0;
  std::vector<int32_t> tokens;
  while (e.has_work()) {
    auto r = e.step();
    EXPECT_TRUE(r.ok());
    if (!r.ok()) break;
    for (const auto& o : *r) {
      cached = std::max(cached, o.cached_prompt_tokens);
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  return {tokens, cached};
}

TEST(engine, prefix_cache_serves_repeated_prompts) {
  auto l = load_tiny(dense_q(ggml_type::q8_0));
  engine_config ec;
  auto e = engine::create(*l.m, ec);
  sampling_params sp;
  sp.max_tokens = 4;
  const auto p = prompt_of(40, 5);
  ASSERT_TRUE((*e)->add_request(1, p, sp).ok());
  const auto first = run(**e)[1];
  ASSERT_TRUE((*e)->add_request(2, p, sp).ok());
  const auto [second, cached] = run_one_counting_cached(**e);
  EXPECT_EQ(cached, 32);     // two full blocks of 16
  EXPECT_EQ(second, first);  // same numerics with and without the cache
  // A prompt of 33 tokens: the cache serves the first block and 15 tokens of the second (copied
  // into a block of the request's own) and leaves two tokens to compute (prefill numerics).
  const std::vector<int32_t> p33(p.begin(), p.begin() + 33);
  ASSERT_TRUE((*e)->add_request(3, p33, sp).ok());
  ASSERT_TRUE((*e)->step().ok());
  EXPECT_EQ((*e)->stats().n_prefill_tokens, 40 + 8 + 2);
}

// Token-granular reuse: a repeated prompt whose tail shares a block with the earlier request's
// first generated tokens is served up to its last two tokens, with the same outputs, greedy and
// seeded.
TEST(engine, prefix_cache_reuses_the_leading_tokens_of_a_block) {
  auto l = load_tiny(dense_q(ggml_type::q8_0));
  for (const float temperature : {0.0F, 0.9F}) {
    auto e = engine::create(*l.m, engine_config{});
    sampling_params sp;
    sp.max_tokens = 12;  // prompt 40 + 12 tokens: the third block fills with generated tokens
    sp.temperature = temperature;
    sp.seed = 5;
    const auto p = prompt_of(40, 7);
    ASSERT_TRUE((*e)->add_request(1, p, sp).ok());
    const auto first = run(**e)[1];
    const int64_t prefilled = (*e)->stats().n_prefill_tokens;
    ASSERT_TRUE((*e)->add_request(2, p, sp).ok());
    const auto [second, cached] = run_one_counting_cached(**e);
    EXPECT_EQ(cached, 38);
    EXPECT_EQ((*e)->stats().n_prefill_tokens - prefilled, 2);
    EXPECT_EQ(second, first) << "temperature " << temperature;
    EXPECT_EQ((*e)->kv().stats().n_blocks_used, 0);
    EXPECT_TRUE((*e)->kv().check_invariants().ok());
  }
}

TEST(engine, requests_arriving_together_share_one_prefill_of_their_prefix) {
  auto l = load_tiny(dense_q(ggml_type::q8_0));
  sampling_params sp;
  sp.max_tokens = 4;
  const auto p = prompt_of(100, 9);
  engine_config ec;
  ec.max_batch_tokens = 32;  // several chunks: the first request is mid-prefill when others come
  auto solo = engine::create(*l.m, ec);
  ASSERT_TRUE((*solo)->add_request(1, p, sp).ok());
  const auto expected = run(**solo)[1];
  for (const bool prefix_cache : {true, false}) {
    SCOPED_TRACE(prefix_cache ? "prefix cache" : "no prefix cache");
    ec.prefix_cache = prefix_cache;
    auto e = engine::create(*l.m, ec);
    // Four requests with one prompt (like n = 4 choices) and one with another prompt.
    for (request_id id = 1; id <= 4; ++id) ASSERT_TRUE((*e)->add_request(id, p, sp).ok());
    ASSERT_TRUE((*e)->add_request(5, prompt_of(40, 10), sp).ok());
    std::map<request_id, std::vector<int32_t>> out;
    std::map<request_id, int64_t> cached;
    while ((*e)->has_work()) {
      auto r = (*e)->step();
      ASSERT_TRUE(r.ok());
      for (const auto& o : *r) {
        out[o.id].insert(out[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
        cached[o.id] = std::max(cached[o.id], o.cached_prompt_tokens);
      }
    }
    for (request_id id = 1; id <= 4; ++id) EXPECT_EQ(out[id], expected) << id;
    EXPECT_EQ(cached[1], 0);
    EXPECT_EQ(cached[5], 0);
    const auto st = (*e)->stats();
    EXPECT_EQ(st.kv.n_blocks_used, 0);
    if (prefix_cache) {
      // The first computes the prompt; the other three wait for its blocks and compute only the
      // 4 tokens past the last full shared block (99 matchable tokens -> 96 cached).
      for (request_id id = 2; id <= 4; ++id) EXPECT_EQ(cached[id], 96) << id;
      EXPECT_EQ(st.n_prefix_waits, 3);
      EXPECT_EQ(st.n_prefill_tokens, 100 + 3 * 4 + 40);
    } else {
      EXPECT_EQ(st.n_prefix_waits, 0);
      EXPECT_EQ(st.n_prefill_tokens, 4 * 100 + 40);
    }
  }
}

}  // namespace

namespace {

/// Logits of a prefill of `p` and 6 greedy decode steps, on a CPU device with `threads` threads;
/// `before_step` (if set) runs before each forward pass.
std::vector<float> logits_with_threads(const tiny_model_config& cfg, int threads,
                                       const std::vector<int32_t>& p,
                                       const std::function<void(device&, int)>& before_step = {}) {
  auto l = load_tiny(cfg, threads);
  kv_cache_config kc;
  kc.layout = l.m->kv_layout_for(8);
  kc.n_blocks = 32;
  auto kv = kv_cache::create(*l.dev, kc);
  const seq_id s = (*kv)->create_sequence();
  forward_batch b;
  forward_output out;
  b.add(s, p, true);
  std::vector<float> all;
  for (int step = 0; step < 7; ++step) {
    if (before_step) before_step(*l.dev, step);
    EXPECT_TRUE(l.m->forward(b, **kv, out).ok());
    all.insert(all.end(), out.logits.begin(), out.logits.begin() + out.n_vocab);
    const auto t = static_cast<int32_t>(
        std::max_element(out.logits.begin(), out.logits.begin() + out.n_vocab) -
        out.logits.begin());
    b.clear();
    b.add(s, std::span<const int32_t>(&t, 1), true);
  }
  return all;
}

}  // namespace

// Workers of one server may run with different --threads (and a migrated sequence continues on
// another worker): the numerics must not depend on the thread count. Bit for bit.
// A worker that borrows cores changes its thread count between forward passes (and may between
// ops): the logits stay bit-identical to a fixed count.
TEST(model, logits_do_not_change_when_the_thread_count_changes_mid_run) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one core: no thread to add";
  const auto cfg = dense_q(ggml_type::q4_1);
  const auto p = prompt_of(23, 5);
  const auto fixed = logits_with_threads(cfg, 1, p);
  const auto changing = logits_with_threads(cfg, 1, p, [](device& dev, int step) {
    ASSERT_GE(dev.max_compute_threads(), 2);  // the CPU pool holds a thread per core
    dev.set_compute_threads(step % 2 == 0 ? dev.max_compute_threads() : 1);
  });
  EXPECT_TRUE(changing == fixed);
}

TEST(model, logits_do_not_depend_on_the_thread_count) {
  for (const auto& cfg : {dense_q(ggml_type::q4_1), dense_q(ggml_type::q8_0), moe_q()}) {
    const auto p = prompt_of(23, 5);
    const auto one = logits_with_threads(cfg, 1, p);
    for (int threads : {2, 3}) {
      const auto many = logits_with_threads(cfg, threads, p);
      ASSERT_EQ(one.size(), many.size());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), many.begin()))
          << threads << " threads give other logits than 1";
    }
  }
}

// The engine samples the rows of a pass on the device's host threads (device::parallel_host):
// every index exactly once, and each request's seeded tokens and log-probs are those of a
// one-thread device, bit for bit.
TEST(device, parallel_host_runs_every_index_once) {
  auto dev = device_registry::instance().create("cpu", device_config{3, 0});
  ASSERT_TRUE(dev.ok());
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    (*dev)->parallel_host(n, [&](int64_t i) { seen[static_cast<size_t>(i)].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)].load(), 1) << i;
  }
}

TEST(engine, sampled_tokens_do_not_depend_on_the_thread_count) {
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 3}) {
    auto l = load_tiny(dense_q(ggml_type::q4_1), threads);
    engine_config ec;
    ec.kv_blocks = 128;
    ec.block_size = 8;
    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    for (request_id id = 1; id <= 6; ++id) {
      sampling_params sp;
      sp.max_tokens = 12;
      sp.n_logprobs = 2;
      sp.temperature = id % 3 == 0 ? 0.0f : 0.9f;  // greedy and sampled rows in one pass
      sp.top_k = id % 2 == 0 ? 20 : 0;
      sp.seed = 100 + id;
      ASSERT_TRUE((*e)->add_request(id, prompt_of(5 + static_cast<int>(id), 9 + id), sp).ok());
    }
    std::vector<float> trace;  // id, token, log-probs of every output, in output order
    while ((*e)->has_work()) {
      auto outs = (*e)->step();
      ASSERT_TRUE(outs.ok());
      for (const auto& o : *outs) {
        for (size_t i = 0; i < o.new_tokens.size(); ++i) {
          trace.push_back(static_cast<float>(o.id));
          trace.push_back(static_cast<float>(o.new_tokens[i]));
          trace.push_back(o.samples[i].logprob);
          for (const auto& a : o.samples[i].top) trace.push_back(a.logprob);
        }
      }
    }
    runs.push_back(std::move(trace));
  }
  ASSERT_FALSE(runs[0].empty());
  EXPECT_TRUE(runs[0] == runs[1]) << "3 threads sample other tokens than 1";
}
