// A trainer group's all-reduce overlapped with the backward (actors/train/bucket_reducer.hpp), on
// inproc engines with every rank on its own thread as processes would be: the weights after a few
// updates are bit for bit those of the all-reduce after the backward, whatever the bucket size
// and the shares per rank (a rank with no example in an update included); a rank that leaves the
// group makes the others' update fail with an all-reduce error instead of hanging. The same for
// the GRPO update of `weft rl --trainers` (gpu/rl/grpo_update.hpp with rl::group_sum).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/rl/trainer_wire.hpp"
#include "actors/train/bucket_reducer.hpp"
#include "gpu/chat_template.hpp"
#include "gpu/gguf.hpp"
#include "gpu/rl/grpo_update.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/tokenizer.hpp"
#include "gpu/train/sft_data.hpp"
#include "gpu/train/sft_trainer.hpp"
#include "transport/registry.hpp"

namespace weft::train {
namespace {

using namespace weft::gpu;
using namespace weft::gpu::train;

struct fixture {
  gguf_file file = [] {
    tiny_model_config c;
    c.n_layers = 3;
    c.n_embd = 32;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_ff = 64;
    c.n_vocab = 384;
    auto img = make_tiny_model(c);
    EXPECT_TRUE(img.ok());
    return std::move(gguf_file::parse(*img).value());
  }();
  sft_dataset data = [this] {
    auto tok = tokenizer::from_gguf(file);
    auto chat = chat_template::from_gguf(file);
    EXPECT_TRUE(tok.ok() && chat.ok());
    sft_dataset d;
    for (int i = 0; i < 9; ++i) {
      const std::string line = R"({"prompt": ")" + std::to_string(i % 7) + "+" +
                               std::to_string((i * 3) % 5) + R"(=", "completion": ")" +
                               std::to_string(i % 7 + (i * 3) % 5) + R"("})";
      auto ex = encode_sft_line(line, *tok, &*chat, {});
      EXPECT_TRUE(ex.ok());
      d.tokens += static_cast<int64_t>(ex->tokens.size());
      d.examples.push_back(std::move(*ex));
    }
    return d;
  }();
};

sft_config run_config(const sft_dataset& data, int parallel) {
  sft_config c;
  c.seed = 3;
  c.step_tokens = 4 * static_cast<int64_t>(data.examples[0].tokens.size());
  c.micro_batch_tokens = c.step_tokens / 4 + 1;
  c.schedule.peak = 3e-3;
  c.schedule.total_steps = 6;
  c.parallel = parallel;
  return c;
}

gpu::status sum_scalars(transport::peer_group& g, double& loss_sum, int64_t& loss_tokens) {
  double s[2] = {loss_sum, static_cast<double>(loss_tokens)};
  if (auto st = g.all_reduce_sum(std::span<double>(s, 2)); !st.ok())
    return {gpu::status_code::internal, "loss all-reduce: " + st.to_string()};
  loss_sum = s[0];
  loss_tokens = static_cast<int64_t>(s[1]);
  return {};
}

/// How each rank sums: after the backward (cap < 0), or in buckets of `cap` bytes.
struct ranks {
  int k = 3;
  std::vector<std::unique_ptr<transport::engine>> engines;
  std::vector<transport::bytes> addresses;

  ranks() {
    for (int r = 0; r < k; ++r) {
      auto e = transport::make_engine("inproc", {});
      EXPECT_TRUE(e.ok());
      addresses.push_back(*(*e)->local_address());
      engines.push_back(std::move(*e));
    }
  }

  /// `body(group, rank)` on every rank, each on its own thread.
  void run(const std::function<void(transport::peer_group&, int)>& body, uint32_t timeout_ms) {
    std::vector<std::thread> threads;
    for (int r = 0; r < k; ++r) {
      threads.emplace_back([&, r] {
        auto g = transport::peer_group::connect(*engines[static_cast<size_t>(r)], r, addresses,
                                                {.timeout_ms = timeout_ms});
        ASSERT_TRUE(g.ok());
        body(**g, r);
      });
    }
    for (auto& t : threads) t.join();
  }
};

/// Every rank's weights after `steps` updates.
std::vector<std::vector<std::vector<float>>> train(const fixture& fx, int64_t cap, int parallel,
                                                   int steps) {
  ranks rs;
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(rs.k));
  rs.run(
      [&](transport::peer_group& g, int r) {
        auto m = trainable_model<float>::load(fx.file);
        ASSERT_TRUE(m.ok());
        auto& model = **m;
        sft_trainer t(
            model, fx.data, run_config(fx.data, parallel),
            [&g](std::span<const std::span<float>> grads, double& ls, int64_t& lt) {
              if (auto st = g.all_reduce_sum(grads); !st.ok())
                return gpu::status{gpu::status_code::internal, st.to_string()};
              return sum_scalars(g, ls, lt);
            },
            r, rs.k);
        std::unique_ptr<bucket_reducer> buckets;
        if (cap >= 0) {
          buckets = std::make_unique<bucket_reducer>(
              g, buckets_of(model, cap),
              [&g](double& ls, int64_t& lt, std::chrono::steady_clock::time_point) {
                return sum_scalars(g, ls, lt);
              });
          t.set_overlapped_reducer(buckets.get());
        }
        for (int s = 0; s < steps; ++s) ASSERT_TRUE(t.step().ok()) << "rank " << r;
        for (const auto& p : std::as_const(model).parameters())
          out[static_cast<size_t>(r)].push_back(p.value);
      },
      20'000);
  return out;
}

TEST(bucket_reducer, weights_are_the_bits_of_the_all_reduce_after_the_backward) {
  fixture fx;
  for (const int parallel : {1, 2}) {
    const auto after = train(fx, -1, parallel, 3);
    for (const int64_t cap : {int64_t{0}, int64_t{1}, int64_t{40'000}}) {
      const auto overlapped = train(fx, cap, parallel, 3);
      for (size_t r = 0; r < after.size(); ++r) {
        ASSERT_FALSE(after[r].empty());
        EXPECT_EQ(overlapped[r], after[r])
            << "rank " << r << ", buckets of " << cap << " bytes, " << parallel << " shares";
        EXPECT_EQ(after[r], after[0]) << "rank " << r << " differs from rank 0";
      }
    }
  }
}

TEST(bucket_reducer, a_rank_that_leaves_fails_the_others_update_with_an_all_reduce_error) {
  fixture fx;
  ranks rs;
  std::vector<std::string> errors(static_cast<size_t>(rs.k));
  rs.run(
      [&](transport::peer_group& g, int r) {
        auto m = trainable_model<float>::load(fx.file);
        ASSERT_TRUE(m.ok());
        auto& model = **m;
        sft_trainer t(model, fx.data, run_config(fx.data, 1), nullptr, r, rs.k);
        bucket_reducer buckets(
            g, buckets_of(model, 1),
            [&g](double& ls, int64_t& lt, std::chrono::steady_clock::time_point) {
              return sum_scalars(g, ls, lt);
            });
        t.set_overlapped_reducer(&buckets);
        if (r == rs.k - 1) g.abort();  // this rank is gone before its first bucket
        auto s = t.step();
        ASSERT_FALSE(s.ok()) << "rank " << r;
        errors[static_cast<size_t>(r)] = s.error().message();
      },
      1'000);
  for (size_t r = 0; r < errors.size(); ++r)
    EXPECT_NE(errors[r].find("all-reduce"), std::string::npos) << r << ": " << errors[r];
}

/// Rank r's micro-batches of one RL update (`weft rl --trainers`): sequences with policy inputs
/// whose behaviour log-probs are the model's own (ratio 1, nothing clipped), advantages of both
/// signs; the last rank gets none (it still takes part in every bucket's sum).
std::vector<std::vector<train_batch>> rl_lists(trainable_model<float>& model, int r, int k) {
  std::vector<std::vector<train_batch>> lists(1);
  if (r == k - 1) return lists;
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> toks;
    std::vector<uint8_t> in_loss;
    std::vector<policy_token> info;
    for (int i = 0; i < 14; ++i) {
      toks.push_back((r * 37 + s * 101 + i * 7 + 3) % 384);
      in_loss.push_back(i >= 5 ? 1 : 0);
      policy_token p;
      p.advantage = (i + s) % 3 == 0 ? -0.5f : 0.75f;
      p.weight = 1.0f / 40.0f;
      p.sample = s;
      info.push_back(p);
    }
    train_batch b;
    b.add(toks, in_loss, info);
    auto lp = model.target_logprobs(b);
    EXPECT_TRUE(lp.ok());
    size_t j = 0;
    for (size_t pos = 0; pos < b.targets.size(); ++pos) {
      if (b.targets[pos] >= 0) b.policy[pos].behaviour_logp = (*lp)[j++];
    }
    lists[0].push_back(std::move(b));
  }
  return lists;
}

/// Every rank's weights after two GRPO iterations (gpu/rl/grpo_update.hpp) summed with
/// rl::group_sum, after the backward (cap < 0) or in buckets of `cap` bytes during it.
std::vector<std::vector<std::vector<float>>> rl_train(const fixture& fx, int64_t cap) {
  ranks rs;
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(rs.k));
  rs.run(
      [&](transport::peer_group& g, int r) {
        auto m = trainable_model<float>::load(fx.file);
        ASSERT_TRUE(m.ok());
        auto& model = **m;
        adamw opt;
        std::vector<int64_t> sizes;
        std::vector<uint8_t> decay;
        for (const auto& p : std::as_const(model).parameters()) {
          sizes.push_back(p.size());
          decay.push_back(p.ne[1] > 1 ? 1 : 0);
        }
        opt.init(sizes);
        std::unique_ptr<bucket_reducer> buckets;
        if (cap >= 0) {
          buckets = std::make_unique<bucket_reducer>(
              g, buckets_of(model, cap),
              [](double&, int64_t&, std::chrono::steady_clock::time_point) {
                return gpu::status{};
              });
        }
        gpu::rl::grpo_config grpo;
        for (int it = 0; it < 2; ++it) {
          gpu::rl::iteration_inputs in;
          in.iteration = it;
          in.lr = 3e-3;
          in.opt_step = it + 1;
          const auto lists = rl_lists(model, r, rs.k);
          auto t = gpu::rl::update_iteration(
              model, opt, decay, grpo, in, 1, lists,
              [&](std::span<const std::span<float>> grads, std::span<double> scalars) {
                return weft::rl::group_sum(g, grads, scalars, buckets.get());
              },
              buckets.get());
          ASSERT_TRUE(t.ok()) << "rank " << r << ": " << t.error().message();
          EXPECT_GT(t->tokens, 0);
          EXPECT_GT(t->grad_norm, 0.0);
        }
        for (const auto& p : std::as_const(model).parameters())
          out[static_cast<size_t>(r)].push_back(p.value);
      },
      20'000);
  return out;
}

TEST(bucket_reducer, rl_updates_overlapped_are_the_bits_of_the_all_reduce_after_the_backward) {
  fixture fx;
  const auto after = rl_train(fx, -1);
  auto fresh = trainable_model<float>::load(fx.file);
  ASSERT_TRUE(fresh.ok());
  for (const int64_t cap : {int64_t{0}, int64_t{1}, int64_t{40'000}}) {
    const auto overlapped = rl_train(fx, cap);
    for (size_t r = 0; r < after.size(); ++r) {
      ASSERT_FALSE(after[r].empty());
      EXPECT_EQ(overlapped[r], after[r]) << "rank " << r << ", buckets of " << cap << " bytes";
      EXPECT_EQ(after[r], after[0]) << "rank " << r << " differs from rank 0";
    }
  }
  // The updates moved the weights (a sum that lost the gradients would leave them).
  size_t i = 0, moved = 0;
  for (const auto& p : std::as_const(**fresh).parameters()) {
    moved += std::vector<float>(p.value.begin(), p.value.end()) != after[0][i++] ? 1 : 0;
  }
  EXPECT_GT(moved, after[0].size() / 2);
}

}  // namespace
}  // namespace weft::train
