// Compute threads and helper threads (gpu/cpu/thread_class.hpp): the helper class is SCHED_BATCH
// and inherited by the threads a helper starts; compute threads (thread_pool's, and a pool's
// owner) go back to SCHED_OTHER. Each case runs on a thread of its own, so the test process's
// main thread keeps its policy.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gpu/cpu/thread_class.hpp"
#include "gpu/cpu/thread_pool.hpp"

namespace weft::gpu::cpu {
namespace {

int policy_on_new_thread() {
  int policy = -1;
  std::thread([&] { policy = sched_getscheduler(0); }).join();
  return policy;
}

// Whether this machine lets a thread enter SCHED_BATCH (unprivileged on Linux; a sandbox's
// seccomp filter may refuse it, and weft then runs with its helpers in SCHED_OTHER and a warning).
// Probed on a throwaway thread so that the test's own threads keep their policy; the cases that
// need it report "skipped" (never passed) where it is refused.
bool batch_allowed() {
  bool ok = false;
  std::thread([&] {
    sched_param p{};
    ok = sched_setscheduler(0, SCHED_BATCH, &p) == 0;
  }).join();
  return ok;
}

TEST(ThreadClass, ParsesItsTwoNames) {
  helper_sched s = helper_sched::normal;
  ASSERT_TRUE(parse_helper_sched("batch", s));
  EXPECT_EQ(s, helper_sched::batch);
  ASSERT_TRUE(parse_helper_sched("normal", s));
  EXPECT_EQ(s, helper_sched::normal);
  EXPECT_FALSE(parse_helper_sched("idle", s));
  EXPECT_FALSE(parse_helper_sched("", s));
}

TEST(ThreadClass, NormalLeavesThePolicyAlone) {
  std::thread([] {
    ASSERT_EQ(sched_getscheduler(0), SCHED_OTHER);
    EXPECT_EQ(enter_helper_class(helper_sched::normal), "");
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
    EXPECT_EQ(policy_on_new_thread(), SCHED_OTHER);
  }).join();
}

TEST(ThreadClass, HelpersAreBatchAndComputeThreadsAreNot) {
  if (!batch_allowed()) GTEST_SKIP() << "this machine refuses SCHED_BATCH";
  std::thread([] {
    EXPECT_EQ(enter_helper_class(helper_sched::batch), "");
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);
    // Threads a helper starts are helpers.
    EXPECT_EQ(policy_on_new_thread(), SCHED_BATCH);
    // A thread that declares itself a compute thread leaves the helper class, once for good.
    std::thread([] {
      enter_compute_class();
      EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
      enter_compute_class();
      EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
    }).join();
    // A pool built by a helper: its workers and, from its first job on, its owner compute.
    thread_pool pool(3);
    std::vector<std::atomic<int>> seen(3);
    for (auto& s : seen) s.store(-1);
    pool.parallel([&](int i, int) { seen[static_cast<size_t>(i)].store(sched_getscheduler(0)); });
    for (auto& s : seen) EXPECT_EQ(s.load(), SCHED_OTHER);
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
  }).join();
}

TEST(ThreadClass, AStartInBatchCountsAsDone) {
  // A node process started by a weft process in the helper class inherits SCHED_BATCH: its own
  // enter_helper_class accepts that and its compute threads still leave it.
  if (!batch_allowed()) GTEST_SKIP() << "this machine refuses SCHED_BATCH";
  std::thread([] {
    sched_param p{};
    ASSERT_EQ(sched_setscheduler(0, SCHED_BATCH, &p), 0);
    EXPECT_EQ(enter_helper_class(helper_sched::batch), "");
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);
    std::thread([] {
      enter_compute_class();
      EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
    }).join();
  }).join();
}

}  // namespace
}  // namespace weft::gpu::cpu
