// External rewards scored on a thread of their own (gpu/rl/work_queue.hpp, docs/rl.md "Rewards
// from your own program"): the queue runs its jobs in order off the caller's thread (or several at
// once on several threads), returns their errors and stops cleanly; a pool of reward processes
// scores batches at once on copies of the program, or one batch split over them; the GRPO loop
// with async rewards — one call or three at once — trains the very bits of the loop that waits for
// each group's rewards (sync, async K = 2 with an evaluation between steps, stream), and a reward
// that fails ends the step naming the group.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/reward_process.hpp"
#include "gpu/rl/work_queue.hpp"
#include "gpu/train/trainable_model.hpp"
#include "tests/unit/gpu/rl_test_support.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::rl;
using weft::gpu::rl_test::digits_task;
using weft::gpu::rl_test::tiny_file;

TEST(reward_queue, runs_its_jobs_in_order_on_a_thread_of_its_own) {
  reward_queue q;
  EXPECT_TRUE(q.ready(false).empty());
  EXPECT_TRUE(q.ready(true).empty());  // nothing pending: does not block
  const auto caller = std::this_thread::get_id();
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(q.submit(static_cast<uint64_t>(10 + i), [&, i]() -> result<std::vector<double>> {
                   std::this_thread::sleep_for(std::chrono::milliseconds(2));
                   std::lock_guard lock(mu);
                   order.push_back(i);
                   threads.push_back(std::this_thread::get_id());
                   return std::vector<double>{static_cast<double>(i)};
                 }).ok());
  }
  EXPECT_EQ(q.pending(), 4);
  std::vector<uint64_t> tickets;
  while (q.pending() > 0) {
    for (auto& s : q.ready(true)) {
      ASSERT_TRUE(s.value.ok());
      EXPECT_EQ((*s.value)[0], static_cast<double>(s.ticket - 10));
      EXPECT_GE(s.seconds, 0.0);
      tickets.push_back(s.ticket);
    }
  }
  EXPECT_EQ(tickets, (std::vector<uint64_t>{10, 11, 12, 13}));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  for (const auto& t : threads) EXPECT_NE(t, caller);
}

TEST(reward_queue, gives_back_a_jobs_error_and_stops_after_the_running_job) {
  reward_queue q;
  ASSERT_TRUE(q.submit(1, []() -> result<std::vector<double>> {
                 return status{status_code::invalid_argument, "garbage from sample 3"};
               }).ok());
  auto first = q.ready(true);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_FALSE(first[0].value.ok());
  EXPECT_EQ(first[0].value.error().message(), "garbage from sample 3");

  std::atomic<int> ran{0};
  std::atomic<bool> started{false};
  ASSERT_TRUE(q.submit(2, [&]() -> result<std::vector<double>> {
                 started = true;
                 std::this_thread::sleep_for(std::chrono::milliseconds(30));
                 ++ran;
                 return std::vector<double>{};
               }).ok());
  ASSERT_TRUE(q.submit(3, [&]() -> result<std::vector<double>> {
                 ++ran;
                 return std::vector<double>{};
               }).ok());
  while (!started) std::this_thread::yield();
  q.stop();  // waits for job 2, drops job 3
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(q.submit(4, [] { return result<std::vector<double>>(std::vector<double>{}); }).ok());
  auto rest = q.ready(false);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].ticket, 2u);
  EXPECT_EQ(q.pending(), 0);
  q.stop();  // idempotent
}

TEST(reward_queue, scores_as_many_batches_at_once_as_it_has_workers) {
  reward_queue q(3);
  EXPECT_EQ(q.workers(), 3);
  // Three jobs that each wait for the other two to start: they pass only when run at once.
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  std::atomic<int> running{0};
  for (uint64_t t = 1; t <= 3; ++t) {
    ASSERT_TRUE(q.submit(t, [&, t]() -> result<std::vector<double>> {
                   ++running;
                   std::unique_lock lock(mu);
                   ++started;
                   cv.notify_all();
                   if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return started == 3; })) {
                     return status{status_code::internal, "ran alone"};
                   }
                   --running;
                   return std::vector<double>{static_cast<double>(t)};
                 }).ok());
  }
  std::vector<uint64_t> tickets;
  while (q.pending() > 0) {
    for (auto& s : q.ready(true)) {
      ASSERT_TRUE(s.value.ok()) << s.value.error().message();
      EXPECT_EQ((*s.value)[0], static_cast<double>(s.ticket));
      tickets.push_back(s.ticket);
    }
  }
  std::sort(tickets.begin(), tickets.end());
  EXPECT_EQ(tickets, (std::vector<uint64_t>{1, 2, 3}));
  // stop() waits for every running job.
  for (uint64_t t = 4; t <= 5; ++t) {
    ASSERT_TRUE(q.submit(t, [&]() -> result<std::vector<double>> {
                   ++running;
                   std::this_thread::sleep_for(std::chrono::milliseconds(30));
                   --running;
                   return std::vector<double>{};
                 }).ok());
  }
  while (running.load() < 2) std::this_thread::yield();
  q.stop();
  EXPECT_EQ(running.load(), 0);
  EXPECT_EQ(q.ready(false).size(), 2u);
}

/// A scratch directory with `meet.py`: each request leaves a marker and waits (up to 20 s) until
/// two requests have; the reward is 1 when another copy was scoring at the same time, 0 when
/// this one waited alone. A completion "bad" gets the reward "x".
struct meeting_program {
  std::filesystem::path dir;
  std::string command;

  explicit meeting_program(const std::string& tag) {
    namespace fs = std::filesystem;
    dir = fs::temp_directory_path() / ("weft-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path script = dir / "meet.py";
    std::ofstream(script)
        << "import json, os, sys, time\n"
        << "d = '" << dir.string() << "'\n"
        << "for line in sys.stdin:\n"
        << "    r = json.loads(line)\n"
        << "    if r['completion'] == 'bad':\n"
        << "        print(json.dumps({'id': r['id'], 'reward': 'x'}), flush=True)\n"
        << "        continue\n"
        << "    open(os.path.join(d, 'm-%d-%d' % (os.getpid(), r['id'])), 'w').close()\n"
        << "    t0 = time.time()\n"
        << "    while len([f for f in os.listdir(d) if f.startswith('m-')]) < 2 and "
           "time.time() - t0 < 20:\n"
        << "        time.sleep(0.01)\n"
        << "    n = len([f for f in os.listdir(d) if f.startswith('m-')])\n"
        << "    print(json.dumps({'id': r['id'], 'reward': 1.0 if n >= 2 else 0.0}))\n"
        << "    sys.stdout.flush()\n";
    command = "python3 " + script.string();
  }
  ~meeting_program() { std::filesystem::remove_all(dir); }

  /// The pids of the copies that left markers.
  std::set<std::string> pids() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const auto name = e.path().filename().string();
      if (name.rfind("m-", 0) == 0) out.insert(name.substr(2, name.rfind('-') - 2));
    }
    return out;
  }
};

TEST(reward_process_pool, scores_batches_at_once_on_copies_of_the_program) {
  meeting_program meet("reward-pool");
  reward_process_pool pool({meet.command, 60.0, 1}, 2);
  EXPECT_EQ(pool.size(), 2);
  const std::vector<reward_request> one{reward_request{"p", "c", "a"}};
  result<std::vector<double>> a = std::vector<double>{}, b = std::vector<double>{};
  std::thread ta([&] { a = pool.score(one); });
  std::thread tb([&] { b = pool.score(one); });
  ta.join();
  tb.join();
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(b.ok()) << b.error().message();
  EXPECT_EQ(*a, std::vector<double>{1.0});
  EXPECT_EQ(*b, std::vector<double>{1.0});
  EXPECT_EQ(meet.pids().size(), 2u);  // two copies of the program, one batch each
}

TEST(reward_process_pool, splits_one_batch_over_its_free_copies) {
  meeting_program meet("reward-split");
  // Three copies, a batch of two: one sample on each of two copies, scored at once (each waits
  // for the other); in order.
  reward_process_pool pool({meet.command, 60.0, 1}, 3);
  const std::vector<reward_request> two{reward_request{"p", "c0", "a"},
                                        reward_request{"p", "c1", "a"}};
  auto r = pool.score_split(two);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(*r, (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(meet.pids().size(), 2u);
  EXPECT_TRUE(pool.score_split({}).ok());
  // A slice's error names the sample's place in the whole batch.
  const std::vector<reward_request> three{reward_request{"p", "c0", "a"},
                                          reward_request{"p", "c1", "a"},
                                          reward_request{"p", "bad", "a"}};
  auto bad = pool.score_split(three);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("samples 2..2 of the batch"), std::string::npos)
      << bad.error().message();
  EXPECT_NE(bad.error().message().find("sample 0 (completion 'bad')"), std::string::npos)
      << bad.error().message();
}

grpo_loop_config loop_cfg() {
  auto c = weft::gpu::rl_test::tiny_loop_config();
  c.shares = 2;
  return c;
}

/// The task's verifier as an external reward that takes its time, recording the threads it
/// ran on.
struct slow_reward {
  const digits_task* task = nullptr;
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::thread::id>> threads =
      std::make_shared<std::vector<std::thread::id>>();
  std::shared_ptr<std::vector<size_t>> sizes = std::make_shared<std::vector<size_t>>();
  result<std::vector<double>> operator()(const std::vector<rl_prompt>& prompts,
                                         const std::vector<rollout_sample>& samples) const {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    {
      std::lock_guard lock(*mu);
      threads->push_back(std::this_thread::get_id());
      sizes->push_back(samples.size());
    }
    std::vector<double> out;
    for (const auto& s : samples) {
      out.push_back(task->reward(prompts[static_cast<size_t>(s.group)], s.text));
    }
    return out;
  }
};

std::unique_ptr<grpo_loop> make_loop(const gguf_file& file, const rl_task& task, grpo_loop_config c,
                                     bool async, const slow_reward& r,
                                     reward_unit unit = reward_unit::group, int concurrency = 1) {
  c.async_rewards = async;
  auto m = train::trainable_model<float>::load(file);
  EXPECT_TRUE(m.ok());
  auto loop = grpo_loop::create(file, std::move(*m), task, c);
  EXPECT_TRUE(loop.ok()) << loop.error().message();
  (*loop)->set_reward(r, unit, concurrency);
  return std::move(*loop);
}

TEST(grpo_loop_rewards, async_rewards_train_the_bits_of_blocking_rewards_in_every_mode) {
  const auto file = tiny_file();
  digits_task task;
  struct mode {
    const char* name;
    int64_t staleness;
    bool stream;
    reward_unit unit;
    int concurrency = 1;  ///< reward calls at once (async only)
  };
  for (const mode& md : {mode{"sync", 0, false, reward_unit::group},
                         mode{"sync, per sample", 0, false, reward_unit::sample},
                         mode{"async K=2", 2, false, reward_unit::group},
                         mode{"async K=2, per sample", 2, false, reward_unit::sample},
                         mode{"stream", 0, true, reward_unit::group},
                         mode{"stream, per sample", 0, true, reward_unit::sample},
                         mode{"sync, 3 at once", 0, false, reward_unit::group, 3},
                         mode{"async K=2, per sample, 3 at once", 2, false, reward_unit::sample, 3},
                         mode{"stream, per sample, 3 at once", 0, true, reward_unit::sample, 3}}) {
    SCOPED_TRACE(md.name);
    auto cfg = loop_cfg();
    cfg.max_staleness = md.staleness;
    cfg.stream = md.stream;
    cfg.total_steps = 3;
    slow_reward ra{&task}, rb{&task};
    auto a = make_loop(file, task, cfg, true, ra, md.unit, md.concurrency);
    auto b = make_loop(file, task, cfg, false, rb, md.unit);
    for (int s = 0; s < 3; ++s) {
      auto xa = a->step();
      auto xb = b->step();
      ASSERT_TRUE(xa.ok() && xb.ok()) << (xa.ok() ? xb.error().message() : xa.error().message());
      EXPECT_EQ(xa->reward_mean, xb->reward_mean);
      EXPECT_EQ(xa->loss, xb->loss);
      EXPECT_EQ(xa->staleness_max, xb->staleness_max);
      EXPECT_EQ(xa->samples, 24);
      EXPECT_GT(xa->reward_s, 0.0);
      EXPECT_GT(xb->reward_s, 0.0);
      if (md.staleness == 0) {  // blocking: all of a step's scoring is waited for, in its call
        EXPECT_GE(xb->reward_wait_s, xb->reward_s * 0.99);
      }
      if (s == 1) {
        // The held-out evaluation goes through the reward thread too (groups of later steps
        // may be scored meanwhile).
        auto ea = a->evaluate();
        auto eb = b->evaluate();
        ASSERT_TRUE(ea.ok() && eb.ok()) << (ea.ok() ? eb.error().message() : ea.error().message());
        EXPECT_EQ(ea->pass_at_1, eb->pass_at_1);
      }
    }
    const auto& va = std::as_const(a->model()).parameters();
    const auto& vb = std::as_const(b->model()).parameters();
    for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i].value, vb[i].value) << va[i].name;
    const auto caller = std::this_thread::get_id();
    for (const auto& t : *ra.threads) EXPECT_NE(t, caller);
    for (const auto& t : *rb.threads) EXPECT_EQ(t, caller);
    // Blocking rewards score whole groups; per-sample async ones start with the first sample
    // that finishes, alone (the reward thread is idle then), and take the groups' evaluation
    // batch of 8 held-out prompts whole.
    for (size_t n : *rb.sizes) EXPECT_TRUE(n == 6 || n == 8) << n;
    if (md.unit == reward_unit::sample) {
      ASSERT_FALSE(ra.sizes->empty());
      EXPECT_EQ(ra.sizes->front(), 1u);
    } else {
      for (size_t n : *ra.sizes) EXPECT_TRUE(n == 6 || n == 8) << n;
    }
    a->stop_rewards();
    a->stop_rewards();  // idempotent
  }
}

TEST(grpo_loop_rewards, a_failing_reward_ends_the_step_naming_the_group) {
  const auto file = tiny_file();
  digits_task task;
  for (auto [async, unit] :
       {std::pair{true, reward_unit::group}, std::pair{false, reward_unit::group},
        std::pair{true, reward_unit::sample}}) {
    SCOPED_TRACE(async ? (unit == reward_unit::sample ? "async, per sample" : "async")
                       : "blocking");
    auto cfg = loop_cfg();
    cfg.async_rewards = async;
    auto m = train::trainable_model<float>::load(file);
    ASSERT_TRUE(m.ok());
    auto loop = grpo_loop::create(file, std::move(*m), task, cfg);
    ASSERT_TRUE(loop.ok());
    auto calls = std::make_shared<std::atomic<int>>(0);
    (*loop)->set_reward(
        [calls](const std::vector<rl_prompt>&,
                const std::vector<rollout_sample>& samples) -> result<std::vector<double>> {
          if (++*calls == 2) {
            return status{status_code::invalid_argument,
                          "the reward process gave sample 4 no reward"};
          }
          return std::vector<double>(samples.size(), 0.5);
        },
        unit);
    auto r = (*loop)->step();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), status_code::invalid_argument);
    // "rewards of step 1, group G: ..." (per sample, a batch of several: "rewards of N samples
    // from step 1, group G on: ...").
    EXPECT_EQ(r.error().message().rfind("rewards of ", 0), 0u) << r.error().message();
    EXPECT_NE(r.error().message().find("step 1, group "), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find("gave sample 4 no reward"), std::string::npos);
  }
}

TEST(grpo_loop_rewards, a_reward_with_the_wrong_count_is_an_error) {
  const auto file = tiny_file();
  digits_task task;
  auto m = train::trainable_model<float>::load(file);
  ASSERT_TRUE(m.ok());
  auto loop = grpo_loop::create(file, std::move(*m), task, loop_cfg());
  ASSERT_TRUE(loop.ok());
  (*loop)->set_reward([](const std::vector<rl_prompt>&, const std::vector<rollout_sample>&) {
    return result<std::vector<double>>(std::vector<double>{1.0});
  });
  auto r = (*loop)->step();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("1 rewards for 6 samples"), std::string::npos)
      << r.error().message();
}

}  // namespace
