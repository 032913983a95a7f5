// The step bound an engine worker reports and the router's stall limit (actors/serve/stall_watch).

#include "actors/serve/stall_watch.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace weft::serve {
namespace {

TEST(step_history, nothing_measured_gives_no_bound) {
  step_history h;
  EXPECT_EQ(h.bound_ms(512, 1000), 0u);
}

TEST(step_history, a_full_prompt_pass_is_bounded_by_the_per_token_time_of_large_steps) {
  // A Zen 1 core: a 64-token chunk in 870 ms (13.6 ms a token). A 512-token pass takes ~7 s
  // although no step that long has run yet.
  step_history h;
  h.record(870.0, 64, 1000);
  EXPECT_EQ(h.bound_ms(512, 1000), 6960u);  // 13.59375 ms * 512
  // Steps of a few decode tokens do not set the per-token time (they read every weight for few
  // tokens), but they count as steps.
  h.record(120.0, 3, 1100);
  EXPECT_EQ(h.bound_ms(512, 1100), 6960u);
  EXPECT_EQ(h.bound_ms(4, 1100), 870u);  // the slowest step beats 4 tokens' worth
}

TEST(step_history, the_per_token_time_is_an_average_and_is_not_forgotten) {
  step_history h;
  h.record(100.0, 100, 0);   // 1 ms a token
  h.record(300.0, 100, 10);  // 3 ms: the average moves by a tenth of the gap
  EXPECT_EQ(h.bound_ms(1000, 10), 1200u);
  // Long after, with only small decode steps since: the per-token time still bounds a full pass.
  h.record(5.0, 2, 10 * step_history::window_ms);
  EXPECT_EQ(h.bound_ms(1000, 10 * step_history::window_ms), 1200u);
}

TEST(step_history, the_slowest_step_counts_for_a_window) {
  step_history h;
  h.record(9000.0, 4, 0);  // an outlier of few tokens
  h.record(50.0, 4, 1000);
  EXPECT_EQ(h.bound_ms(8, 1000), 9000u);
  EXPECT_EQ(h.bound_ms(8, step_history::window_ms), 9000u);
  // Past the window the outlier is gone; the later step is the slowest.
  EXPECT_EQ(h.bound_ms(8, step_history::window_ms + 1), 50u);
  h.record(20.0, 4, step_history::window_ms + 2);
  EXPECT_EQ(h.bound_ms(8, step_history::window_ms + 2), 50u);
  EXPECT_EQ(h.bound_ms(8, step_history::window_ms + 1001), 20u);
  EXPECT_EQ(h.bound_ms(8, 10 * step_history::window_ms), 0u);
}

TEST(step_history, bad_durations_are_ignored) {
  step_history h;
  h.record(-1.0, 100, 0);
  h.record(std::numeric_limits<double>::quiet_NaN(), 100, 0);
  h.record(std::numeric_limits<double>::infinity(), 100, 0);
  EXPECT_EQ(h.bound_ms(512, 0), 0u);
}

TEST(stall_limit, is_the_configured_floor_or_a_multiple_of_the_step_bound) {
  EXPECT_EQ(stall_limit_ms(10'000, 0), 10'000u);
  EXPECT_EQ(stall_limit_ms(10'000, 2'000), 10'000u);
  EXPECT_EQ(stall_limit_ms(10'000, 7'000), 7'000u * stall_step_multiple);
  // A bound past ten minutes is not believed (hung detection stays on for everyone).
  EXPECT_EQ(stall_limit_ms(3'000, 4'294'967'295u),
            uint64_t{max_step_bound_ms} * stall_step_multiple);
}

}  // namespace
}  // namespace weft::serve
