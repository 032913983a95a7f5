// FastServe's skip-join MLFQ (actors/serve/mlfq_policy.hpp): placement, demotion, starvation
// promotion, the policy registry, and the policy driving a real engine on a tiny generated model.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "actors/serve/mlfq_policy.hpp"
#include "actors/serve/schedule_policies.hpp"
#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"

namespace {

using namespace weft;
using serve::mlfq_config;
using serve::mlfq_policy;

gpu::sched_request req(gpu::request_id id, uint64_t arrival, int64_t n_prompt) {
  gpu::sched_request r;
  r.id = id;
  r.arrival = arrival;
  r.n_prompt = n_prompt;
  return r;
}

std::vector<gpu::request_id> ids(const std::vector<gpu::sched_request>& v) {
  std::vector<gpu::request_id> out;
  for (const auto& r : v) out.push_back(r.id);
  return out;
}

std::shared_ptr<mlfq_policy> make(const mlfq_config& c) {
  auto p = mlfq_policy::create(c);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  return p.value();
}

TEST(mlfq_policy, rejects_bad_configs) {
  mlfq_config c;
  c.n_queues = 0;
  EXPECT_FALSE(mlfq_policy::create(c).ok());
  c = {};
  c.n_queues = 33;
  EXPECT_FALSE(mlfq_policy::create(c).ok());
  c = {};
  c.base_quantum = 0;
  EXPECT_FALSE(mlfq_policy::create(c).ok());
  c = {};
  c.prefill_cost_per_token = -1;
  EXPECT_EQ(mlfq_policy::create(c).error().code, errc::invalid_argument);
  c = {};
  c.starvation_steps = 0;
  EXPECT_FALSE(mlfq_policy::create(c).ok());
  EXPECT_TRUE(mlfq_policy::create().ok());
}

TEST(mlfq_policy, skip_join_picks_the_highest_queue_whose_quantum_covers_the_prefill) {
  mlfq_config c;
  c.n_queues = 5;
  c.base_quantum = 4;  // quanta 4, 8, 16, 32, 64
  c.prefill_cost_per_token = 0.0625;
  auto p = make(c);
  EXPECT_EQ(p->quantum(0), 4.0);
  EXPECT_EQ(p->quantum(4), 64.0);
  EXPECT_EQ(p->join_level(1), 0);
  EXPECT_EQ(p->join_level(64), 0);  // cost 4 == quantum 4
  EXPECT_EQ(p->join_level(65), 1);
  EXPECT_EQ(p->join_level(256), 2);  // cost 16
  EXPECT_EQ(p->join_level(257), 3);
  EXPECT_EQ(p->join_level(1000000), 4);  // beyond every quantum: the last queue
  p->on_add(req(1, 0, 300));
  p->on_add(req(2, 1, 10));
  EXPECT_EQ(p->level_of(1), 3);
  EXPECT_EQ(p->level_of(2), 0);
  // The short prompt that arrived later ranks first.
  std::vector<gpu::sched_request> live = {req(1, 0, 300), req(2, 1, 10)};
  p->rank(live, 1);
  EXPECT_EQ(ids(live), (std::vector<gpu::request_id>{2, 1}));
  // A prefill cost of 0 puts everything in queue 0.
  c.prefill_cost_per_token = 0;
  EXPECT_EQ(make(c)->join_level(1000000), 0);
}

TEST(mlfq_policy, demotes_after_using_the_quantum_and_ranks_fcfs_within_a_queue) {
  mlfq_config c;
  c.n_queues = 3;
  c.base_quantum = 2;  // quanta 2, 4, 8
  c.prefill_cost_per_token = 0.25;
  auto p = make(c);
  for (gpu::request_id id = 1; id <= 3; ++id) p->on_add(req(id, id, 4));
  std::vector<gpu::sched_request> live = {req(1, 1, 4), req(2, 2, 4), req(3, 3, 4)};
  p->rank(live, 1);
  EXPECT_EQ(ids(live), (std::vector<gpu::request_id>{1, 2, 3}));
  p->on_progress(1, 4, 0);  // prefill of 4 tokens: cost 1
  EXPECT_EQ(p->level_of(1), 0);
  EXPECT_DOUBLE_EQ(p->attained_of(1), 1.0);
  p->rank(live, 2);
  p->on_progress(1, 0, 1);  // quantum 2 used up
  EXPECT_EQ(p->level_of(1), 1);
  EXPECT_DOUBLE_EQ(p->attained_of(1), 0.0);
  EXPECT_EQ(p->n_demotions(), 1);
  p->rank(live, 3);
  EXPECT_EQ(ids(live), (std::vector<gpu::request_id>{2, 3, 1}));
  // Request 3 uses queue 0 up, then joins 1 in queue 1 behind it (arrival order).
  p->on_progress(3, 4, 0);
  p->on_progress(3, 0, 1);
  p->rank(live, 4);
  EXPECT_EQ(ids(live), (std::vector<gpu::request_id>{2, 1, 3}));
  // One level per iteration at most, and the last queue keeps its requests.
  p->on_progress(1, 400, 0);
  EXPECT_EQ(p->level_of(1), 2);
  p->on_progress(1, 0, 100);
  EXPECT_EQ(p->level_of(1), 2);
  p->on_finish(1);
  EXPECT_EQ(p->level_of(1), -1);
  std::vector<gpu::sched_request> rest = {req(2, 2, 4), req(3, 3, 4)};
  p->rank(rest, 5);
  EXPECT_EQ(ids(rest), (std::vector<gpu::request_id>{2, 3}));
}

TEST(mlfq_policy, starvation_guard_promotes_to_the_top_queue) {
  mlfq_config c;
  c.n_queues = 4;
  c.base_quantum = 100;           // quanta 100, 200, 400, 800
  c.prefill_cost_per_token = 50;  // 20 prompt tokens: cost 1000 -> queue 3; 2 tokens: queue 0
  c.starvation_steps = 10;
  auto p = make(c);
  p->on_add(req(1, 0, 20));
  p->on_add(req(2, 1, 2));
  EXPECT_EQ(p->level_of(1), 3);
  EXPECT_EQ(p->level_of(2), 0);
  std::vector<gpu::sched_request> live = {req(1, 0, 20), req(2, 1, 2)};
  // Request 2 runs every iteration; request 1 waits from step 1 on.
  for (int64_t step = 1; step <= 11; ++step) {
    p->rank(live, step);
    EXPECT_EQ(live.back().id, 1u) << step;
    p->on_progress(2, 0, 1);
  }
  EXPECT_EQ(p->n_promotions(), 0);  // waited 10 steps: not more than starvation_steps yet
  EXPECT_EQ(p->level_of(2), 0);
  p->rank(live, 12);
  EXPECT_EQ(p->n_promotions(), 1);
  EXPECT_EQ(p->level_of(1), 0);
  EXPECT_EQ(live.front().id, 1u);
  // Once it ran, its waiting clock restarts.
  p->on_progress(1, 20, 0);
  p->rank(live, 13);
  EXPECT_EQ(p->n_promotions(), 1);
}

TEST(schedule_policies, factory_knows_fcfs_mlfq_and_priority_only) {
  auto f = serve::make_schedule_policy("fcfs");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->name(), "fcfs");
  auto m = serve::make_schedule_policy("mlfq");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->name(), "mlfq");
  EXPECT_NE(f->get(), serve::make_schedule_policy("fcfs")->get());  // one instance per engine
  auto p = serve::make_schedule_policy("priority");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->name(), "priority");
  auto bad = serve::make_schedule_policy("sjf");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  EXPECT_NE(bad.error().message.find("sjf"), std::string::npos);
  mlfq_config c;
  c.n_queues = -1;
  EXPECT_FALSE(serve::make_schedule_policy("mlfq", c).ok());
}

// -- with the engine ------------------------------------------------------------------------------

struct loaded {
  std::unique_ptr<gpu::device> dev;
  std::unique_ptr<gpu::model> m;
};

loaded load_tiny() {
  gpu::tiny_model_config c;
  c.weight_type = gpu::ggml_type::q4_1;
  c.embedding_type = gpu::ggml_type::q8_0;
  c.output = gpu::output_weight::separate;  // varied outputs (tied heads tend to repeat a token)
  loaded l;
  auto img = gpu::make_tiny_model(c);
  EXPECT_TRUE(img.ok());
  auto f = gpu::gguf_file::parse(*img);
  EXPECT_TRUE(f.ok());
  l.dev =
      std::move(gpu::device_registry::instance().create("cpu", gpu::device_config{2, 0}).value());
  l.m = std::move(gpu::model::load(std::move(f.value()), *l.dev).value());
  return l;
}

std::vector<int32_t> prompt_of(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % 300);
  return p;
}

struct run_result {
  std::vector<gpu::request_id> finish_order;
  std::map<gpu::request_id, std::vector<float>> traces;  // token, logprob per sample
  gpu::engine_stats stats;
};

run_result run_short_behind_long(gpu::model& m, std::shared_ptr<gpu::schedule_policy> policy,
                                 int64_t kv_blocks, int32_t short_priority = 0) {
  gpu::engine_config ec;
  ec.max_running = 1;
  ec.kv_blocks = kv_blocks;
  ec.block_size = 8;
  ec.policy = std::move(policy);
  auto e = gpu::engine::create(m, ec);
  EXPECT_TRUE(e.ok());
  gpu::sampling_params lng, shrt;
  lng.max_tokens = 40;
  shrt.max_tokens = 3;
  shrt.priority = short_priority;
  EXPECT_TRUE((*e)->add_request(1, prompt_of(12, 1), lng).ok());
  EXPECT_TRUE((*e)->add_request(2, prompt_of(10, 2), lng).ok());
  run_result res;
  for (int step = 0; (*e)->has_work() && step < 1000; ++step) {
    if (step == 2) {
      EXPECT_TRUE((*e)->add_request(3, prompt_of(9, 3), shrt).ok());
    }
    auto r = (*e)->step();
    EXPECT_TRUE(r.ok());
    for (const auto& o : *r) {
      EXPECT_NE(o.finish, gpu::finish_reason::error) << o.error;
      for (const auto& s : o.samples) {
        res.traces[o.id].push_back(static_cast<float>(s.token));
        res.traces[o.id].push_back(s.logprob);
      }
      if (o.finish != gpu::finish_reason::none) res.finish_order.push_back(o.id);
    }
    EXPECT_TRUE((*e)->kv().check_invariants().ok());
  }
  res.stats = (*e)->stats();
  EXPECT_EQ(res.stats.kv.n_blocks_used, 0);
  return res;
}

TEST(mlfq_engine, short_job_behind_long_ones_finishes_first_under_mlfq_not_fcfs) {
  auto l = load_tiny();
  const auto fcfs = run_short_behind_long(*l.m, serve::make_schedule_policy("fcfs").value(), 64);
  const auto mlfq = run_short_behind_long(*l.m, serve::make_schedule_policy("mlfq").value(), 64);
  EXPECT_EQ(fcfs.finish_order, (std::vector<gpu::request_id>{1, 2, 3}));
  ASSERT_EQ(mlfq.finish_order.size(), 3u);
  EXPECT_EQ(mlfq.finish_order.front(), 3u);
  EXPECT_EQ(fcfs.stats.n_preemptions, 0);
  EXPECT_GT(mlfq.stats.n_preemptions, 0);
  EXPECT_EQ(mlfq.stats.n_swaps_out, 0);  // ample KV: paused requests keep theirs
  EXPECT_EQ(mlfq.traces, fcfs.traces);   // preemption changes no token and no log-prob
}

TEST(priority_engine, a_later_request_ranked_first_preempts_and_changes_no_token) {
  auto l = load_tiny();
  const auto fcfs = run_short_behind_long(*l.m, serve::make_schedule_policy("fcfs").value(), 64);
  // Every priority equal: first come, first served.
  const auto same =
      run_short_behind_long(*l.m, serve::make_schedule_policy("priority").value(), 64);
  EXPECT_EQ(same.finish_order, fcfs.finish_order);
  EXPECT_EQ(same.stats.n_preemptions, 0);
  // The late short request with a lower value than the two running ones goes first.
  const auto urgent =
      run_short_behind_long(*l.m, serve::make_schedule_policy("priority").value(), 64, -1);
  EXPECT_EQ(urgent.finish_order, (std::vector<gpu::request_id>{3, 1, 2}));
  EXPECT_GT(urgent.stats.n_preemptions, 0);
  EXPECT_EQ(urgent.traces, fcfs.traces);
  // A higher value waits for both, even for request 2, which arrived before it but had not run.
  const auto later =
      run_short_behind_long(*l.m, serve::make_schedule_policy("priority").value(), 64, 1);
  EXPECT_EQ(later.finish_order, (std::vector<gpu::request_id>{1, 2, 3}));
}

TEST(mlfq_engine, swapping_under_mlfq_keeps_outputs) {
  auto l = load_tiny();
  // 7 blocks of 8 tokens: the running request plus one paused one fit, not three.
  const auto fcfs = run_short_behind_long(*l.m, serve::make_schedule_policy("fcfs").value(), 7);
  const auto mlfq = run_short_behind_long(*l.m, serve::make_schedule_policy("mlfq").value(), 7);
  EXPECT_EQ(mlfq.finish_order.front(), 3u);
  EXPECT_GT(mlfq.stats.n_swaps_out, 0);
  EXPECT_EQ(mlfq.stats.n_swaps_in, mlfq.stats.n_swaps_out);
  EXPECT_EQ(mlfq.traces, fcfs.traces);
}

TEST(mlfq_engine, random_add_abort_step_leaks_no_block) {
  auto l = load_tiny();
  mlfq_config c;
  c.base_quantum = 1;
  c.n_queues = 4;
  c.prefill_cost_per_token = 0.1;
  c.starvation_steps = 6;
  auto policy = make(c);
  gpu::engine_config ec;
  ec.kv_blocks = 14;
  ec.block_size = 8;
  ec.max_running = 3;
  ec.max_batch_tokens = 20;
  ec.policy = policy;
  auto e = gpu::engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  std::mt19937 rng(11);
  std::set<gpu::request_id> live;
  gpu::request_id next = 1;
  for (int op = 0; op < 500; ++op) {
    const uint32_t dice = rng() % 10;
    if (dice < 3) {
      gpu::sampling_params sp;
      sp.max_tokens = 1 + static_cast<int>(rng() % 30);
      const int n = rng() % 25 == 0 ? 120 : 2 + static_cast<int>(rng() % 50);
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
        if (o.finish != gpu::finish_reason::none) live.erase(o.id);
      }
    }
    ASSERT_TRUE((*e)->kv().check_invariants().ok()) << op;
    const auto es = (*e)->stats();
    ASSERT_EQ(es.n_waiting + es.n_running + es.n_swapped, static_cast<int64_t>(live.size()));
    ASSERT_EQ(es.n_running + es.n_swapped, es.kv.n_sequences);
    for (auto id : live) ASSERT_GE(policy->level_of(id), 0);
  }
  while ((*e)->has_work()) ASSERT_TRUE((*e)->step().ok());
  const auto es = (*e)->stats();
  EXPECT_EQ(es.kv.n_blocks_used, 0);
  EXPECT_EQ(es.kv.n_sequences, 0);
  EXPECT_GT(es.n_preemptions, 0);
  EXPECT_GT(policy->n_demotions(), 0);
  EXPECT_GT(es.n_swaps_out, 0);
  for (gpu::request_id id = 1; id < next; ++id)
    EXPECT_EQ(policy->level_of(id), -1);  // all forgotten
}

}  // namespace
