// The scheduling classes of RL post-training (gpu/rl/, docs/rl.md "Modes"): the rollout
// scheduler's admission, refusals and staleness histogram by hand, a property test over random
// rollout lengths and trainer delays for K = 0..3 (no sample lost, none trained twice, none older
// than K), the output-length ranker and longest-first placement.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "gpu/rl/dispatch.hpp"
#include "gpu/rl/rollout_scheduler.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::rl;

TEST(rollout_scheduler, sync_admits_one_step_at_a_time) {
  rollout_scheduler s(scheduler_config{2, 2, 0, 3});
  EXPECT_EQ(s.admit(), std::vector<int64_t>{0});
  EXPECT_TRUE(s.admit().empty());
  EXPECT_FALSE(s.ready());
  EXPECT_FALSE(s.train().ok());
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t j = 0; j < 2; ++j) ASSERT_TRUE(s.finish({0, g, j}, 0, 0).ok());
  }
  EXPECT_EQ(s.finish({0, 1, 1}, 0, 0).code(), status_code::invalid_argument);  // twice
  EXPECT_EQ(s.finish({1, 0, 0}, 0, 0).code(), status_code::invalid_argument);  // not admitted
  EXPECT_EQ(s.finish({0, 2, 0}, 0, 0).code(), status_code::invalid_argument);  // no such group
  ASSERT_TRUE(s.ready());
  auto t = s.train();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->staleness, std::vector<int64_t>(4, 0));
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.finish({0, 0, 0}, 0, 0).code(), status_code::invalid_argument);  // trained
  EXPECT_EQ(s.admit(), std::vector<int64_t>{1});
  // Versions a sample cannot have: newer than the trainer's, older than its admission.
  EXPECT_EQ(s.finish({1, 0, 0}, 1, 2).code(), status_code::invalid_argument);
  EXPECT_EQ(s.finish({1, 0, 0}, 0, 1).code(), status_code::invalid_argument);
}

TEST(rollout_scheduler, async_admits_k_steps_ahead_and_stops_at_the_last_step) {
  rollout_scheduler s(scheduler_config{1, 2, 2, 4});
  EXPECT_EQ(s.admit(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(s.in_flight(), 6);
  for (int64_t j = 0; j < 2; ++j) ASSERT_TRUE(s.finish({2, 0, j}, 0, 0).ok());  // out of order
  EXPECT_FALSE(s.ready());
  for (int64_t j = 0; j < 2; ++j) ASSERT_TRUE(s.finish({0, 0, j}, 0, 0).ok());
  ASSERT_TRUE(s.train().ok());
  EXPECT_EQ(s.admit(), std::vector<int64_t>{3});
  ASSERT_TRUE(s.finish({1, 0, 0}, 0, 1).ok());
  ASSERT_TRUE(s.finish({1, 0, 1}, 0, 0).ok());
  auto t = s.train();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->staleness, (std::vector<int64_t>{1, 1}));
  ASSERT_TRUE(s.train().ok());     // step 2 finished long ago: 2 versions old, within K
  EXPECT_TRUE(s.admit().empty());  // step 4 is past the end
  EXPECT_EQ(s.staleness_histogram(), (std::vector<int64_t>{2, 2, 2}));
}

/// Property test: random rollout lengths, random trainer delays, random token versions; for every
/// K, every sample is trained exactly once, none is lost and none is older than K versions.
TEST(rollout_scheduler, random_timings_never_lose_repeat_or_overage_a_sample) {
  std::mt19937_64 rng(2026);
  for (int64_t K = 0; K <= 3; ++K) {
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t P = 1 + static_cast<int64_t>(rng() % 3),
                    G = 2 + static_cast<int64_t>(rng() % 3);
      const int64_t steps = 6 + static_cast<int64_t>(rng() % 6);
      rollout_scheduler s(scheduler_config{P, G, K, steps});
      struct running {
        sample_key key;
        int64_t left = 0, oldest = -1, newest = -1;
      };
      std::vector<running> live;
      std::map<std::tuple<int64_t, int64_t, int64_t>, int> finished;
      int64_t trainer_busy = 0;
      while (s.version() < steps) {
        for (int64_t m : s.admit()) {
          for (int64_t g = 0; g < P; ++g) {
            for (int64_t j = 0; j < G; ++j) {
              live.push_back({{m, g, j}, 1 + static_cast<int64_t>(rng() % 40), -1, -1});
            }
          }
        }
        // One engine step: every live sample makes a token with the current version.
        for (auto& r : live) {
          if (r.oldest < 0) r.oldest = s.version();
          r.newest = s.version();
          --r.left;
        }
        for (size_t i = 0; i < live.size();) {
          if (live[i].left <= 0) {
            ASSERT_TRUE(s.finish(live[i].key, live[i].oldest, live[i].newest).ok());
            ++finished[{live[i].key.step, live[i].key.group, live[i].key.index}];
            live[i] = live.back();
            live.pop_back();
          } else {
            ++i;
          }
        }
        if (trainer_busy > 0) {
          --trainer_busy;
        } else if (s.ready()) {
          auto t = s.train();
          ASSERT_TRUE(t.ok()) << t.error().message();
          for (int64_t lag : t->staleness) ASSERT_LE(lag, K);
          trainer_busy = static_cast<int64_t>(rng() % 10);
        }
        ASSERT_EQ(s.in_flight(), static_cast<int64_t>(live.size()));
      }
      EXPECT_TRUE(live.empty());
      EXPECT_EQ(s.trained_samples(), steps * P * G);
      EXPECT_EQ(static_cast<int64_t>(finished.size()), steps * P * G);
      for (const auto& [k, n] : finished) ASSERT_EQ(n, 1);
      const auto& h = s.staleness_histogram();
      EXPECT_LE(static_cast<int64_t>(h.size()), K + 1);
      EXPECT_EQ(std::accumulate(h.begin(), h.end(), int64_t{0}), steps * P * G);
    }
  }
}

TEST(dispatch, the_ranker_learns_prompts_then_similar_prompts_then_falls_back_to_the_prior) {
  length_ranker r(64.0);
  EXPECT_EQ(r.predict(1, 100), 64.0);
  r.observe(1, 100, 300);
  r.observe(1, 100, 500);
  EXPECT_EQ(r.predict(1, 100), 400.0);  // its own history
  EXPECT_EQ(r.predict(2, 120), 400.0);  // a new prompt of similar length: the bucket's mean
  r.observe(3, 10, 20);
  EXPECT_EQ(r.predict(4, 9), 20.0);   // the short-prompt bucket
  EXPECT_EQ(r.predict(5, 30), 20.0);  // nearest bucket with history, shorter first
  length_ranker bounded(64.0, 1);
  bounded.observe(1, 100, 10);
  bounded.observe(2, 100, 30);  // table full: feeds only its bucket
  EXPECT_EQ(bounded.prompts_known(), 1);
  EXPECT_EQ(bounded.predict(2, 100), 20.0);
  // Prompts of one exact length, once two samples had it, before the bucket's mean.
  length_ranker shape(64.0);
  shape.observe(1, 40, 10);
  shape.observe(2, 44, 50);
  EXPECT_EQ(shape.predict(9, 40), 30.0);  // one sample of length 40: the bucket
  shape.observe(3, 40, 14);
  EXPECT_EQ(shape.predict(9, 40), 12.0);
  EXPECT_EQ(shape.predict(9, 44), 74.0 / 3.0);
}

TEST(dispatch, longest_first_placement_beats_round_robin_on_makespan) {
  const std::vector<dispatch_item> items{{0, 7}, {1, 5}, {2, 4}, {3, 3}, {4, 3}, {5, 2}};
  std::vector<double> load(2, 0.0);
  const auto lpt = place_longest_first(items, load);
  EXPECT_EQ(lpt, (std::vector<int>{0, 1, 1, 0, 1, 0}));
  EXPECT_EQ(*std::max_element(load.begin(), load.end()), 12.0);
  const auto rr = place_round_robin(items.size(), 2);
  std::vector<double> rr_load(2, 0.0);
  for (size_t i = 0; i < items.size(); ++i)
    rr_load[static_cast<size_t>(rr[i])] += items[i].predicted;
  EXPECT_EQ(*std::max_element(rr_load.begin(), rr_load.end()), 14.0);
  // Existing load counts: everything goes to the idle agent until it catches up.
  std::vector<double> busy{10.0, 0.0};
  EXPECT_EQ(place_longest_first(std::vector<dispatch_item>{{0, 4}, {1, 4}}, busy),
            (std::vector<int>{1, 1}));
  EXPECT_EQ(longest_first_order(items).front(), 0u);
  EXPECT_EQ(place_round_robin(3, 2, 1), (std::vector<int>{1, 0, 1}));
}

}  // namespace
