// The trainer role's configuration (the spawn request's config_json): round trip and refusals;
// the same for the RL trainer and reward worker roles.

#include <gtest/gtest.h>

#include "actors/rl/remote_rewards.hpp"
#include "actors/rl/remote_trainers.hpp"
#include "actors/train/trainer.hpp"

namespace weft::train {
namespace {

trainer_config sample() {
  trainer_config c;
  c.run.model_path = "/m.gguf";
  c.run.data_path = "/d.jsonl";
  c.rank = 1;
  c.world = 3;
  c.coordinator_port = 4242;
  c.allreduce_timeout_ms = 5000;
  return c;
}

TEST(trainer_config, survives_the_json_round_trip) {
  auto back = trainer_config::from_json(sample().to_json());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->to_json(), sample().to_json());
}

TEST(trainer_config, refuses_ranks_outside_the_group_and_bad_runs) {
  auto refused = [](trainer_config c) { return !trainer_config::from_json(c.to_json()).ok(); };
  auto c = sample();
  c.rank = 3;
  EXPECT_TRUE(refused(c));
  c = sample();
  c.rank = -1;
  EXPECT_TRUE(refused(c));
  c = sample();
  c.coordinator_port = 0;
  EXPECT_TRUE(refused(c));
  c = sample();
  c.run.steps = 0;
  EXPECT_TRUE(refused(c));
  EXPECT_FALSE(trainer_config::from_json("not json").ok());
  EXPECT_FALSE(trainer_config::from_json(R"({"rank": 0})").ok());
}

TEST(rl_trainer_config, keeps_its_bucket_size_and_refuses_a_negative_one) {
  rl::rl_trainer_config c;
  c.model_path = "/m.gguf";
  c.controller_port = 4242;
  c.bucket_mb = 0.5;
  auto back = rl::rl_trainer_config::from_json(c.to_json());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->bucket_mb, 0.5);
  EXPECT_EQ(back->to_json(), c.to_json());
  c.bucket_mb = -1.0;
  EXPECT_FALSE(rl::rl_trainer_config::from_json(c.to_json()).ok());
}

TEST(reward_worker_config, keeps_its_copies_and_refuses_bad_values) {
  rl::reward_worker_config c;
  c.worker = 1;
  c.command = "python3 r.py";
  c.procs = 4;
  c.controller_port = 4242;
  auto back = rl::reward_worker_config::from_json(c.to_json());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->procs, 4);
  EXPECT_EQ(back->to_json(), c.to_json());
  // A config without "procs" (an older controller) runs one copy.
  auto one =
      rl::reward_worker_config::from_json(R"({"worker": 0, "command": "r", "controller_port": 1})");
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(one->procs, 1);
  for (int procs : {0, 65}) {
    auto x = c;
    x.procs = procs;
    EXPECT_FALSE(rl::reward_worker_config::from_json(x.to_json()).ok()) << procs;
  }
  auto x = c;
  x.command.clear();
  EXPECT_FALSE(rl::reward_worker_config::from_json(x.to_json()).ok());
  EXPECT_FALSE(rl::reward_worker_config::from_json("[1]").ok());
}

}  // namespace
}  // namespace weft::train
