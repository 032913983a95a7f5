// The engine under scheduling policies (gpu/schedule_policy.hpp): token-level preemption and KV
// swapping must not change any request's tokens, must free every block, and the default FCFS
// policy must behave like an engine without a policy. Test-local policies force heavy preemption;
// the FastServe MLFQ itself is tested with the engine in tests/unit/serve/policy_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/schedule_policy.hpp"
#include "gpu/tiny_model.hpp"
#include "tests/unit/gpu/tiny_engine_support.hpp"

namespace {

using namespace weft::gpu;
using weft::gpu::engine_test::load_tiny_model;
using weft::gpu::engine_test::loaded;
using weft::gpu::engine_test::prompt_of;

loaded load_tiny(ggml_type weights) {
  tiny_model_config c;
  c.weight_type = weights;
  c.embedding_type = ggml_type::q8_0;
  // A separate LM head: with tied embeddings the random model tends to repeat its input token,
  // which would make a wrong resume token invisible in the outputs.
  c.output = output_weight::separate;
  return load_tiny_model(c);
}

// Round robin: the ranking rotates by one request every `period` steps, so every request is
// displaced again and again (with max_running < live requests).
class rotating_policy final : public schedule_policy {
 public:
  explicit rotating_policy(int64_t period) : period_(period) {}
  std::string_view name() const override { return "rotating"; }
  void on_add(const sched_request&) override { ++n_added; }
  void on_progress(request_id, int64_t p, int64_t d) override { progress_tokens += p + d; }
  void on_finish(request_id) override { ++n_finished; }
  void rank(std::vector<sched_request>& live, int64_t now_step) override {
    std::sort(live.begin(), live.end(),
              [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
    if (live.empty()) return;
    const auto shift = static_cast<size_t>(now_step / period_) % live.size();
    std::rotate(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(shift), live.end());
  }
  int64_t n_added = 0;
  int64_t n_finished = 0;
  int64_t progress_tokens = 0;

 private:
  int64_t period_;
};

// Newest first: every arrival displaces the running requests.
class lifo_policy final : public schedule_policy {
 public:
  std::string_view name() const override { return "lifo"; }
  void on_add(const sched_request&) override {}
  void on_progress(request_id, int64_t, int64_t) override {}
  void on_finish(request_id) override {}
  void rank(std::vector<sched_request>& live, int64_t) override {
    std::sort(live.begin(), live.end(),
              [](const auto& a, const auto& b) { return a.arrival > b.arrival; });
  }
};

// Drops the last request from the ranking: a policy bug the engine must reject.
class broken_policy final : public schedule_policy {
 public:
  std::string_view name() const override { return "broken"; }
  void on_add(const sched_request&) override {}
  void on_progress(request_id, int64_t, int64_t) override {}
  void on_finish(request_id) override {}
  void rank(std::vector<sched_request>& live, int64_t) override {
    if (!live.empty()) live.pop_back();
  }
};

struct job {
  request_id id;
  std::vector<int32_t> prompt;
  sampling_params sp;
};

std::vector<job> jobs_mix(bool sampled) {
  std::vector<job> jobs;
  const int lengths[] = {20, 37, 5, 25, 12, 24};
  for (int i = 0; i < 6; ++i) {
    sampling_params sp;
    sp.max_tokens = 14 + 3 * i;
    sp.n_logprobs = 3;
    if (sampled) {
      sp.temperature = 0.9f;
      sp.top_p = 0.95f;
      sp.seed = 77 + static_cast<uint64_t>(i);
    }
    jobs.push_back({static_cast<request_id>(10 + i),
                    prompt_of(lengths[i], 100 + static_cast<uint32_t>(i)), sp});
  }
  return jobs;
}

// Per request: every sampled token with its log-prob and the top-3 alternatives. Log-probs are
// compared bit for bit: tiny random models often repeat one token, so tokens alone would hide a
// numerics change.
using trace = std::vector<float>;
using traces = std::map<request_id, trace>;

void append(trace& t, const request_output& o) {
  for (const auto& s : o.samples) {
    t.push_back(static_cast<float>(s.token));
    t.push_back(s.logprob);
    for (const auto& alt : s.top) {
      t.push_back(static_cast<float>(alt.token));
      t.push_back(alt.logprob);
    }
  }
}

// Runs to completion; checks KV invariants after every step.
traces drain(engine& e) {
  traces out;
  for (int guard = 0; e.has_work() && guard < 20000; ++guard) {
    auto r = e.step();
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    if (!r.ok()) break;
    for (const auto& o : *r) {
      EXPECT_NE(o.finish, finish_reason::error) << o.error;
      append(out[o.id], o);
    }
    const auto st = e.kv().check_invariants();
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
  }
  return out;
}

traces reference_outputs(model& m, const std::vector<job>& jobs) {
  traces ref;
  for (const auto& j : jobs) {
    engine_config ec;
    ec.kv_blocks = 64;
    auto e = engine::create(m, ec);
    EXPECT_TRUE(e.ok());
    EXPECT_TRUE((*e)->add_request(j.id, j.prompt, j.sp).ok());
    ref[j.id] = drain(**e)[j.id];
    EXPECT_EQ(static_cast<int>(ref[j.id].size()), j.sp.max_tokens * 8);
  }
  return ref;
}

void expect_preemption_keeps_outputs(ggml_type weights, bool sampled) {
  auto l = load_tiny(weights);
  const auto jobs = jobs_mix(sampled);
  const auto ref = reference_outputs(*l.m, jobs);
  auto policy = std::make_shared<rotating_policy>(3);
  engine_config ec;
  ec.kv_blocks =
      10;  // 160 tokens: two running requests fit, the paused ones must go to host memory
  ec.max_running = 2;
  ec.max_batch_tokens = 24;  // chunked prefill, interrupted by preemption
  ec.policy = policy;
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  for (const auto& j : jobs) ASSERT_TRUE((*e)->add_request(j.id, j.prompt, j.sp).ok());
  auto out = drain(**e);
  for (const auto& j : jobs) EXPECT_EQ(out[j.id], ref.at(j.id)) << "request " << j.id;
  const auto st = (*e)->stats();
  EXPECT_GT(st.n_preemptions, 10);
  EXPECT_GT(st.n_swaps_out, 0);
  EXPECT_EQ(st.n_swaps_in, st.n_swaps_out);  // nothing aborted: every swapped request came back
  EXPECT_EQ(st.kv.n_blocks_used, 0);
  EXPECT_EQ(st.kv.n_sequences, 0);
  EXPECT_EQ(policy->n_added, 6);
  EXPECT_EQ(policy->n_finished, 6);
  EXPECT_EQ(policy->progress_tokens, st.n_prefill_tokens + st.n_decode_tokens);
}

TEST(engine_policy, preemption_and_swap_keep_greedy_outputs_q4_1) {
  expect_preemption_keeps_outputs(ggml_type::q4_1, false);
}

TEST(engine_policy, preemption_and_swap_keep_seeded_sampling_q8_0) {
  expect_preemption_keeps_outputs(ggml_type::q8_0, true);
}

TEST(engine_policy, later_arrivals_displace_running_requests_without_swapping_when_kv_fits) {
  auto l = load_tiny(ggml_type::q4_0);
  const auto jobs = jobs_mix(false);
  const auto ref = reference_outputs(*l.m, jobs);
  engine_config ec;
  ec.kv_blocks = 64;
  ec.max_running = 2;
  ec.policy = std::make_shared<lifo_policy>();
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  traces out;
  // One arrival every 4 steps: each displaces the oldest running request.
  for (const auto& j : jobs) {
    ASSERT_TRUE((*e)->add_request(j.id, j.prompt, j.sp).ok());
    for (int s = 0; s < 4; ++s) {
      auto r = (*e)->step();
      ASSERT_TRUE(r.ok());
      for (const auto& o : *r) append(out[o.id], o);
    }
    EXPECT_LE((*e)->stats().n_running - (*e)->stats().n_paused, 2);
  }
  EXPECT_GT((*e)->stats().n_paused, 0);
  for (auto& [id, v] : drain(**e)) out[id].insert(out[id].end(), v.begin(), v.end());
  for (const auto& j : jobs) EXPECT_EQ(out[j.id], ref.at(j.id)) << "request " << j.id;
  const auto st = (*e)->stats();
  EXPECT_GT(st.n_preemptions, 0);
  EXPECT_EQ(st.n_swaps_out, 0);  // the paused requests' KV stayed resident
  EXPECT_EQ(st.kv.n_blocks_used, 0);
}

TEST(engine_policy, explicit_fcfs_equals_the_default) {
  auto l = load_tiny(ggml_type::q4_1);
  const auto jobs = jobs_mix(false);
  traces out[2];
  engine_stats stats[2];
  for (int k = 0; k < 2; ++k) {
    engine_config ec;
    ec.kv_blocks = 12;  // forces out-of-memory swaps
    ec.max_batch_tokens = 32;
    if (k == 1) ec.policy = std::make_shared<fcfs_policy>();
    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    for (const auto& j : jobs) ASSERT_TRUE((*e)->add_request(j.id, j.prompt, j.sp).ok());
    out[k] = drain(**e);
    stats[k] = (*e)->stats();
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(stats[0].n_steps, stats[1].n_steps);
  EXPECT_EQ(stats[0].n_preemptions, stats[1].n_preemptions);
  EXPECT_EQ(stats[0].n_swaps_out, stats[1].n_swaps_out);
  EXPECT_GT(stats[0].n_swaps_out, 0);
  EXPECT_EQ(stats[0].kv.n_blocks_used, 0);
}

TEST(engine_policy, fcfs_never_lets_a_later_request_overtake) {
  auto l = load_tiny(ggml_type::q8_0);
  engine_config ec;
  ec.max_running = 1;
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  sampling_params sp_long, sp_short;
  sp_long.max_tokens = 20;
  sp_short.max_tokens = 2;
  ASSERT_TRUE((*e)->add_request(1, prompt_of(8, 1), sp_long).ok());
  ASSERT_TRUE((*e)->add_request(2, prompt_of(8, 2), sp_short).ok());
  std::vector<request_id> finish_order;
  while ((*e)->has_work()) {
    auto r = (*e)->step();
    ASSERT_TRUE(r.ok());
    for (const auto& o : *r) {
      if (o.finish != finish_reason::none) finish_order.push_back(o.id);
    }
  }
  EXPECT_EQ(finish_order, (std::vector<request_id>{1, 2}));
  EXPECT_EQ((*e)->stats().n_preemptions, 0);
}

void random_ops(std::shared_ptr<schedule_policy> policy, uint32_t seed) {
  auto l = load_tiny(ggml_type::q4_1);
  engine_config ec;
  ec.kv_blocks = 14;
  ec.block_size = 8;
  ec.max_running = 3;
  ec.max_batch_tokens = 20;
  ec.policy = std::move(policy);
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  std::mt19937 rng(seed);
  std::set<request_id> live;
  request_id next = 1;
  int64_t n_errors = 0;
  for (int op = 0; op < 400; ++op) {
    const uint32_t dice = rng() % 10;
    if (dice < 3) {
      sampling_params sp;
      sp.max_tokens = 1 + static_cast<int>(rng() % 30);
      // Mostly fitting prompts, a few that can never fit (14 x 8 = 112 tokens).
      const int n = rng() % 20 == 0 ? 120 : 2 + static_cast<int>(rng() % 40);
      ASSERT_TRUE((*e)->add_request(next, prompt_of(n, rng()), sp).ok());
      live.insert(next++);
    } else if (dice < 4 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_TRUE((*e)->abort(*it).ok());
      live.erase(it);
    } else {
      auto r = (*e)->step();
      ASSERT_TRUE(r.ok()) << r.error().to_string();
      for (const auto& o : *r) {
        if (o.finish == finish_reason::error) ++n_errors;
        if (o.finish != finish_reason::none) live.erase(o.id);
      }
    }
    const auto st = (*e)->kv().check_invariants();
    ASSERT_TRUE(st.ok()) << "op " << op << ": " << st.to_string();
    const auto es = (*e)->stats();
    ASSERT_EQ(es.n_waiting + es.n_running + es.n_swapped, static_cast<int64_t>(live.size()));
    ASSERT_EQ(es.n_swapped, es.kv.n_swapped_sequences);
    ASSERT_EQ(es.n_running + es.n_swapped, es.kv.n_sequences);
  }
  while ((*e)->has_work()) {
    auto r = (*e)->step();
    ASSERT_TRUE(r.ok());
    for (const auto& o : *r) {
      if (o.finish == finish_reason::error) ++n_errors;
    }
  }
  const auto es = (*e)->stats();
  EXPECT_EQ(es.kv.n_blocks_used, 0);
  EXPECT_EQ(es.kv.n_sequences, 0);
  EXPECT_GT(es.n_preemptions, 0);
  EXPECT_GT(n_errors, 0);  // the oversized prompts
  EXPECT_TRUE((*e)->kv().check_invariants().ok());
}

TEST(engine_policy, random_add_abort_step_leaks_no_block_rotating) {
  random_ops(std::make_shared<rotating_policy>(2), 7);
}

TEST(engine_policy, random_add_abort_step_leaks_no_block_lifo) {
  random_ops(std::make_shared<lifo_policy>(), 8);
}

TEST(engine_policy, a_ranking_that_drops_requests_is_an_error) {
  auto l = load_tiny(ggml_type::q8_0);
  engine_config ec;
  ec.policy = std::make_shared<broken_policy>();
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  sampling_params sp;
  ASSERT_TRUE((*e)->add_request(1, prompt_of(5, 1), sp).ok());
  auto r = (*e)->step();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::internal);
  ASSERT_TRUE((*e)->abort(1).ok());
  EXPECT_EQ((*e)->kv().stats().n_blocks_used, 0);
}

}  // namespace
