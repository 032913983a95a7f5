#include <gtest/gtest.h>

#include "actors/restart_policy.hpp"

namespace weft::actors {
namespace {

restart_tracker tracker(restart_strategy s, uint32_t max = 3, uint64_t window = 1000) {
  return restart_tracker(s, restart_intensity{max, window}, backoff_policy{10, 80, 2.0, 500});
}

TEST(restart_policy, one_for_one_restarts_only_the_failed_child) {
  auto t = tracker(restart_strategy::one_for_one);
  auto d = t.on_exit(1, 3, restart_type::permanent, exit_kind::abnormal, 0, 0);
  EXPECT_FALSE(d.give_up);
  EXPECT_EQ(d.to_restart, (std::vector<size_t>{1}));
}

TEST(restart_policy, one_for_all_restarts_every_child) {
  auto t = tracker(restart_strategy::one_for_all);
  auto d = t.on_exit(1, 3, restart_type::permanent, exit_kind::abnormal, 0, 0);
  EXPECT_EQ(d.to_restart, (std::vector<size_t>{0, 1, 2}));
}

TEST(restart_policy, rest_for_one_restarts_the_failed_and_later_children) {
  auto t = tracker(restart_strategy::rest_for_one);
  auto d = t.on_exit(1, 4, restart_type::permanent, exit_kind::abnormal, 0, 0);
  EXPECT_EQ(d.to_restart, (std::vector<size_t>{1, 2, 3}));
}

TEST(restart_policy, restart_types) {
  auto t = tracker(restart_strategy::one_for_one);
  EXPECT_TRUE(
      t.on_exit(0, 1, restart_type::temporary, exit_kind::abnormal, 0, 0).to_restart.empty());
  EXPECT_TRUE(t.on_exit(0, 1, restart_type::transient, exit_kind::normal, 0, 0).to_restart.empty());
  EXPECT_FALSE(
      t.on_exit(0, 1, restart_type::transient, exit_kind::abnormal, 0, 0).to_restart.empty());
  EXPECT_FALSE(
      t.on_exit(0, 1, restart_type::permanent, exit_kind::normal, 0, 0).to_restart.empty());
}

TEST(restart_policy, intensity_limit_gives_up_within_the_window_only) {
  auto t = tracker(restart_strategy::one_for_one, 3, 1000);
  for (uint64_t now : {0, 10, 20}) {
    EXPECT_FALSE(t.on_exit(0, 1, restart_type::permanent, exit_kind::abnormal, now, now).give_up);
  }
  EXPECT_TRUE(t.on_exit(0, 1, restart_type::permanent, exit_kind::abnormal, 30, 30).give_up);
  // Once the window has slid past the old restarts, restarting is allowed again.
  auto t2 = tracker(restart_strategy::one_for_one, 3, 1000);
  for (uint64_t now : {0, 400, 800, 1200, 1600, 2000}) {
    EXPECT_FALSE(t2.on_exit(0, 1, restart_type::permanent, exit_kind::abnormal, now, now).give_up)
        << now;
  }
}

TEST(restart_policy, backoff_grows_then_caps_then_resets) {
  auto t = tracker(restart_strategy::one_for_one, 100, 1'000'000);
  std::vector<uint64_t> delays;
  for (int i = 0; i < 6; ++i) {
    uint64_t now = static_cast<uint64_t>(i) * 10;
    delays.push_back(
        t.on_exit(0, 1, restart_type::permanent, exit_kind::abnormal, now, now).delay_ms);
  }
  EXPECT_EQ(delays, (std::vector<uint64_t>{0, 10, 20, 40, 80, 80}));
  // The child ran for longer than reset_after_ms: the next failure restarts at once again.
  auto d = t.on_exit(0, 1, restart_type::permanent, exit_kind::abnormal, 10'000, 1'000);
  EXPECT_EQ(d.delay_ms, 0u);
}

TEST(restart_policy, parses_strategy_names) {
  bool ok = false;
  EXPECT_EQ(parse_strategy("rest_for_one", &ok), restart_strategy::rest_for_one);
  EXPECT_TRUE(ok);
  parse_strategy("bogus", &ok);
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace weft::actors
