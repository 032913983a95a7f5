// The options of a training run as they travel to trainer ranks (JSON in a spawn request): round
// trip, and anything malformed or out of range refused by name.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>

#include "gpu/train/sft_run.hpp"

namespace weft::gpu::train {
namespace {

sft_run_options sample() {
  sft_run_options o;
  o.model_path = "/m.gguf";
  o.data_path = "/d.jsonl";
  o.steps = 7;
  o.batch_tokens = 333;
  o.lr = 2.5e-4;
  o.lr_schedule = "constant";
  o.seed = 99;
  o.recompute = true;
  o.checkpoint_dir = "/ck";
  o.save_path = "/o.gguf";
  o.save_type = "q8_0";
  o.bucket_mb = 4.5;
  return o;
}

TEST(sft_run_options, survive_the_json_round_trip) {
  auto back = sft_run_options_from_json(to_json(sample()));
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(to_json(*back), to_json(sample()));
  auto sc = make_sft_config(*back);
  ASSERT_TRUE(sc.ok());
  EXPECT_EQ(sc->schedule.decay, lr_schedule::shape::constant);
  EXPECT_EQ(sc->step_tokens, 333);
  EXPECT_EQ(sc->seed, 99u);
}

TEST(sft_run_options, refuse_what_a_run_cannot_use) {
  auto refused = [](nlohmann::json j, const std::string& why) {
    auto r = sft_run_options_from_json(j);
    EXPECT_FALSE(r.ok()) << j.dump();
    if (!r.ok()) {
      EXPECT_NE(r.error().message().find(why), std::string::npos) << r.error().message();
    }
  };
  auto j = to_json(sample());
  refused(nlohmann::json::array(), "JSON object");
  auto k = j;
  k["stepz"] = 1;
  refused(k, "unknown key 'stepz'");
  k = j;
  k["steps"] = "many";
  refused(k, "'steps' has the wrong type");
  k = j;
  k["bucket_mb"] = -1;
  refused(k, "hyperparameters out of range");
  k = j;
  k["steps"] = 0;
  refused(k, "out of range");
  k = j;
  k["lr"] = -1.0;
  refused(k, "out of range");
  k = j;
  k["save_type"] = "q3_k";
  refused(k, "save_type");
  k = j;
  k.erase("data");
  refused(k, "required");
  auto o = sample();
  o.lr_schedule = "linear";
  EXPECT_FALSE(make_sft_config(o).ok());
  // --offload-optimizer without a device would do nothing: refused, not ignored.
  o = sample();
  o.offload_optimizer = true;
  auto off = make_sft_config(o);
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.error().message().find("offload_optimizer needs a device"), std::string::npos);
  o.device = "cuda";
  auto on = make_sft_config(o);
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(on->offload_optimizer);
  EXPECT_EQ(on->parallel, 1);
}

TEST(sft_run, a_missing_model_file_is_named) {
  auto o = sample();
  o.model_path = "/nonexistent/model.gguf";
  auto r = load_sft_run(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("/nonexistent/model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace weft::gpu::train

namespace weft::gpu::train {
namespace {

/// Examples of lengths 3..17 whose first token is their index (to recognise them in batches).
sft_dataset numbered(int n) {
  sft_dataset d;
  for (int i = 0; i < n; ++i) {
    sft_example ex;
    const int len = 3 + (i * 7) % 15;
    for (int t = 0; t < len; ++t) ex.tokens.push_back(t == 0 ? i : 1000 + t);
    ex.in_loss.assign(static_cast<size_t>(len), 1);
    ex.in_loss[0] = 0;
    d.examples.push_back(ex);
  }
  return d;
}

/// The examples (by first token) and token count of a rank's micro-batches.
std::pair<std::vector<int>, int64_t> contents(const std::vector<train_batch>& micro) {
  std::vector<int> ids;
  int64_t tokens = 0;
  for (const auto& b : micro) {
    tokens += b.n_tokens();
    for (int64_t i = 0; i < b.seqs.n_seqs(); ++i) {
      ids.push_back(b.tokens[static_cast<size_t>(b.seqs.starts[static_cast<size_t>(i)])]);
    }
  }
  return {ids, tokens};
}

TEST(sft_sampler, data_parallel_ranks_split_each_step_evenly_and_completely) {
  const auto data = numbered(60);
  for (int world : {2, 3}) {
    sft_sampler whole(data, 5, 120, 40);
    std::vector<sft_sampler> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(data, 5, 120, 40);
    for (int step = 0; step < 8; ++step) {
      auto [all_ids, all_tokens] = contents(whole.next_step());
      std::vector<int> got;
      int64_t lo = INT64_MAX, hi = 0;
      for (int r = 0; r < world; ++r) {
        int64_t step_tokens = -1;
        auto [ids, tokens] =
            contents(ranks[static_cast<size_t>(r)].next_step(r, world, &step_tokens));
        EXPECT_EQ(step_tokens, all_tokens);
        got.insert(got.end(), ids.begin(), ids.end());
        lo = std::min(lo, tokens);
        hi = std::max(hi, tokens);
      }
      std::sort(got.begin(), got.end());
      std::sort(all_ids.begin(), all_ids.end());
      EXPECT_EQ(got, all_ids) << "world " << world << " step " << step;
      // Balanced to within one example (the longest is 17 tokens).
      EXPECT_LE(hi - lo, 17) << "world " << world << " step " << step;
      for (auto& s : ranks) EXPECT_EQ(s.cursor(), whole.cursor());
    }
  }
}

}  // namespace
}  // namespace weft::gpu::train
