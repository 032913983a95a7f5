// Agentic rollouts (gpu/rl/tools.hpp, docs/rl.md "Agentic rollouts"): the tools, the tool tasks,
// and the GRPO loop's turns — driven by a scripted rollout backend that calls the calculator the
// way a model would, with the behaviour log-probs of the real tiny model, so that the update's
// ratio shows whether a tool's tokens were kept out of the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/rollout_backend.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/rl/tools.hpp"
#include "gpu/tokenizer.hpp"
#include "gpu/train/trainable_model.hpp"
#include "tests/unit/gpu/rl_test_support.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::rl;
using weft::gpu::rl_test::tiny_file;
using weft::gpu::train::trainable_model;

TEST(tools, calculator_lookup_and_call_parsing) {
  EXPECT_EQ(calculator("47 * 38"), "1786");
  EXPECT_EQ(calculator("(2 + 3) * 4 - 1"), "19");
  EXPECT_EQ(calculator("7 / 2"), "3.5");
  EXPECT_EQ(calculator("1 / 3"), "0.333333");
  EXPECT_EQ(calculator("1 / 0").rfind("error:", 0), 0u);
  EXPECT_EQ(calculator("two plus two").rfind("error:", 0), 0u);

  const long long v = lookup_value("kqzfa");
  EXPECT_GE(v, 1);
  EXPECT_LE(v, 99);
  EXPECT_EQ(lookup_value(" \"KQZFA\" "), v);
  EXPECT_EQ(lookup("kqzfa"), std::to_string(v));
  EXPECT_EQ(lookup_value("ab"), -1);
  EXPECT_EQ(lookup("two words").rfind("error: no entry", 0), 0u);
  std::vector<long long> seen;
  for (const char* w : {"apple", "river", "stone", "cloud", "maple", "tiger"}) {
    seen.push_back(lookup_value(w));
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_GT(std::unique(seen.begin(), seen.end()) - seen.begin(), 3) << "values vary by word";

  const std::vector<std::string> both{"calc", "lookup"};
  tool_call c;
  ASSERT_TRUE(parse_tool_call("Let me compute. <calc>47*38", both, c));
  EXPECT_EQ(c.tool, "calc");
  EXPECT_EQ(c.args, "47*38");
  ASSERT_TRUE(parse_tool_call("<calc>1+1 and <lookup>river", both, c));
  EXPECT_EQ(c.tool, "lookup");
  EXPECT_EQ(c.args, "river");
  EXPECT_FALSE(parse_tool_call("<lookup>river", {"calc"}, c));
  EXPECT_FALSE(parse_tool_call("no call here", both, c));
  EXPECT_EQ(tool_stop_strings(both), (std::vector<std::string>{"</calc>", "</lookup>"}));

  EXPECT_EQ(final_answer_text("<calc>2*3</calc><result>6</result> so 6"), " so 6");
  EXPECT_EQ(final_answer_text("plain 6"), "plain 6");
  EXPECT_EQ(tool_observation("6"), "<result>6</result>");

  auto ok = parse_tools("calc, lookup,calc");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, both);
  auto bad = parse_tools("calc,search");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("unknown tool 'search'"), std::string::npos);
  auto own = parse_tools("calc,search", {"search"});
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, (std::vector<std::string>{"calc", "search"}));

  auto cmd = parse_tool_command("search = python3 search.py --fast");
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->name, "search");
  EXPECT_EQ(cmd->command, "python3 search.py --fast");
  EXPECT_FALSE(parse_tool_command("search").ok());
  EXPECT_FALSE(parse_tool_command("Search=x").ok());
  EXPECT_FALSE(parse_tool_command("web-search=x").ok());
  EXPECT_FALSE(parse_tool_command("search=").ok());
  auto task = make_tool_task(make_arithmetic_task(1, "+"), {"search"});
  EXPECT_NE(task->problem(1, 0).text.find("<search>input</search>"), std::string::npos);
}

TEST(tools, tool_tasks_ask_for_the_tool_and_score_the_final_answer) {
  auto task = make_tool_task(make_arithmetic_task(3, "*"), {"calc"});
  const rl_prompt p = task->problem(5, 0);
  EXPECT_NE(p.text.find("<calc>expression</calc>"), std::string::npos) << p.text;
  EXPECT_NE(p.text.find("Answer with the number only."), std::string::npos) << p.text;
  const std::string ref = task->reference_completion(p);
  EXPECT_EQ(ref.rfind("<calc>", 0), 0u) << ref;
  EXPECT_NE(ref.find(tool_observation(p.answer)), std::string::npos) << ref;
  EXPECT_EQ(task->reward(p, ref), 1.0);
  // The tool's result alone is not an answer: the model has to state it after the result.
  EXPECT_EQ(task->reward(p, "<calc>x</calc>" + tool_observation(p.answer)), 0.0);
  EXPECT_EQ(task->reward(p, "<calc>x</calc>" + tool_observation("1") + " " + p.answer), 1.0);

  auto lk = make_tool_task(make_lookup_task(2), {"lookup", "calc"});
  const rl_prompt q = lk->problem(9, 3);
  EXPECT_NE(q.text.find("<lookup>word</lookup>"), std::string::npos) << q.text;
  ASSERT_EQ(q.tool_solution.size(), 3u);
  EXPECT_EQ(q.tool_solution[0][0], "lookup");
  const long long sum = lookup_value(q.tool_solution[0][1]) + lookup_value(q.tool_solution[1][1]);
  EXPECT_EQ(q.answer, std::to_string(sum));
  EXPECT_EQ(lk->reward(q, lk->reference_completion(q)), 1.0);
  EXPECT_EQ(lk->reward(q, "0"), 0.0);
}

/// A rollout backend that plays a model: for a prompt "What is A * B?" it writes
/// "<calc>A * B</calc>" (stopped there, as the engine's stop string stops it) when the sample's
/// seed is even, or the wrong answer " 0" when it is odd; after a tool result it writes the
/// result's value and ends. The log-probs it reports are the real tiny model's for those tokens
/// (the weights of version 0), so an on-policy update's ratio is 1 on every generated token.
class scripted_backend final : public rollout_backend {
 public:
  scripted_backend(const gguf_file& file, const tokenizer& tok) : tok_(tok) {
    auto m = trainable_model<float>::load(file);
    EXPECT_TRUE(m.ok());
    model_ = std::move(*m);
    const auto eog = tok_.end_of_generation_ids();
    eos_ = eog.front();
  }
  status add(std::vector<rollout_request> requests) override {
    if (!requests.empty() && requests.front().prompt.size() > first_prompt_ && first_prompt_ > 0) {
      continuation_adds.push_back(requests.size());
    }
    if (first_prompt_ == 0 && !requests.empty()) first_prompt_ = requests.front().prompt.size();
    for (auto& r : requests) {
      requests_seen.push_back(r);
      const std::string prompt = text_of(r.prompt);
      std::smatch m;
      rollout_output o;
      o.out.id = r.id;
      o.version = version_;
      std::string said;
      if (std::regex_search(prompt, m, std::regex("<result>(-?[0-9]+)</result>$"))) {
        said = " " + m[1].str();
        o.out.finish = finish_reason::stop_token;
      } else if (r.params.seed % 2 == 0 &&
                 std::regex_search(prompt, m, std::regex("What is ([0-9]+ \\* [0-9]+)\\?"))) {
        said = "<calc>" + m[1].str() + "</calc>";
        o.out.finish = finish_reason::stop_string;
      } else {
        said = " 0";
        o.out.finish = finish_reason::stop_token;
      }
      const auto toks = tok_.encode(said, add_special::no, parse_special::no);
      std::vector<int32_t> all = toks;
      if (o.out.finish == finish_reason::stop_token) all.push_back(eos_);
      const auto lp = logprobs(r.prompt, all);
      for (size_t i = 0; i < toks.size(); ++i) {
        o.out.new_tokens.push_back(toks[i]);
        o.out.samples.push_back(sample_result{toks[i], lp[i], {}});
      }
      if (o.out.finish == finish_reason::stop_token) {
        o.out.stop_sample = sample_result{eos_, lp.back(), {}};
        o.out.text_delta = said;
      } else {
        o.out.text_delta = said.substr(0, said.find("</calc>"));  // cut before the stop string
      }
      ready_.push_back(std::move(o));
    }
    return {};
  }
  status abort(request_id) override { return {}; }
  result<std::vector<rollout_output>> poll() override {
    std::vector<rollout_output> out(ready_.begin(), ready_.end());
    ready_.clear();
    return out;
  }
  bool has_work() const override { return !ready_.empty(); }
  status publish(int64_t version, std::span<const named_weights>) override {
    version_ = version;
    return {};
  }

  std::vector<rollout_request> requests_seen;
  /// Sizes of the add() calls that carried continuations (prompts longer than the problem's).
  std::vector<size_t> continuation_adds;

 private:
  std::string text_of(const std::vector<int32_t>& ids) const {
    std::string s;
    for (int32_t t : ids) s += tok_.token_to_piece(t);
    return s;
  }
  std::vector<float> logprobs(const std::vector<int32_t>& prompt, const std::vector<int32_t>& add) {
    train::train_batch b;
    std::vector<int32_t> toks = prompt;
    toks.insert(toks.end(), add.begin(), add.end());
    std::vector<uint8_t> in_loss(toks.size(), 0);
    std::fill(in_loss.end() - static_cast<std::ptrdiff_t>(add.size()), in_loss.end(), uint8_t{1});
    b.add(toks, in_loss);
    auto lp = model_->target_logprobs(b);
    EXPECT_TRUE(lp.ok());
    return *lp;
  }

  const tokenizer& tok_;
  std::unique_ptr<trainable_model<float>> model_;
  int32_t eos_ = 0;
  int64_t version_ = 0;
  size_t first_prompt_ = 0;
  std::deque<rollout_output> ready_;
};

struct scripted_run {
  gguf_file file = tiny_file();
  std::unique_ptr<tokenizer> tok;
  std::unique_ptr<rl_task> task = make_tool_task(make_arithmetic_task(2, "*"), {"calc"});
  std::shared_ptr<scripted_backend> backend;
  std::shared_ptr<inline_tools> tools = std::make_shared<inline_tools>();
  std::unique_ptr<grpo_loop> loop;

  explicit scripted_run(grpo_loop_config c) {
    auto t = tokenizer::from_gguf(file);
    EXPECT_TRUE(t.ok());
    tok = std::make_unique<tokenizer>(std::move(*t));
    backend = std::make_shared<scripted_backend>(file, *tok);
    auto m = trainable_model<float>::load(file);
    EXPECT_TRUE(m.ok());
    c.tools = {"calc"};
    auto l = grpo_loop::create(file, std::move(*m), *task, c, backend);
    EXPECT_TRUE(l.ok()) << l.error().message();
    loop = std::move(*l);
    loop->set_tools(tools);
  }
};

grpo_loop_config tool_loop_config() {
  auto c = weft::gpu::rl_test::tiny_loop_config();
  c.max_new_tokens = 24;
  return c;
}

TEST(grpo_loop_tools, a_turn_that_calls_a_tool_continues_after_its_result) {
  scripted_run run(tool_loop_config());
  const rl_prompt p = run.task->problem(1, 0);
  auto got = run.loop->generate({p}, 6, 77, false);
  ASSERT_TRUE(got.ok()) << got.error().message();
  int called = 0;
  for (const rollout_sample& s : *got) {
    if (s.tool_calls == 0) {
      EXPECT_TRUE(s.tool_mask.empty());
      EXPECT_EQ(s.text, " 0");
      continue;
    }
    ++called;
    EXPECT_EQ(s.tool_calls, 1);
    const std::string obs = tool_observation(p.answer);
    // The transcript: the call, the tool's result, the model's answer after it.
    EXPECT_EQ(s.text, "<calc>" + p.tool_solution[0][1] + "</calc>" + obs + " " + p.answer);
    EXPECT_EQ(run.task->reward(p, s.text), 1.0);
    const auto call = run.tok->encode("<calc>" + p.tool_solution[0][1] + "</calc>", add_special::no,
                                      parse_special::no);
    const auto result = run.tok->encode(obs, add_special::no, parse_special::no);
    ASSERT_EQ(s.tool_mask.size(), s.completion.size());
    ASSERT_GT(s.completion.size(), call.size() + result.size());
    for (size_t i = 0; i < s.completion.size(); ++i) {
      const bool tool = i >= call.size() && i < call.size() + result.size();
      EXPECT_EQ(s.tool_mask[i], tool ? 1 : 0) << i;
      EXPECT_EQ(s.version[i], tool ? -1 : 0) << i;
      if (tool) {
        EXPECT_EQ(s.completion[i], result[i - call.size()]);
        EXPECT_EQ(s.logp[i], 0.0f);
      }
    }
    EXPECT_EQ(s.generated(), static_cast<int64_t>(s.completion.size() - result.size()));
    EXPECT_TRUE(s.stopped);
  }
  EXPECT_GT(called, 0);
  EXPECT_LT(called, 6);
  // Each continuation is a new request of the same group: the prompt, then everything so far.
  int continuations = 0;
  for (const auto& r : run.backend->requests_seen) {
    EXPECT_EQ(r.params.stop_strings, std::vector<std::string>{"</calc>"});
    if (r.prompt.size() == (*got)[0].prompt.size()) continue;
    ++continuations;
    EXPECT_EQ(r.group, run.backend->requests_seen.front().group);
    EXPECT_TRUE(std::equal((*got)[0].prompt.begin(), (*got)[0].prompt.end(), r.prompt.begin()));
    EXPECT_LT(r.params.max_tokens, 24);
    EXPECT_NE(r.params.seed, run.backend->requests_seen.front().params.seed);
  }
  EXPECT_EQ(continuations, called);
  EXPECT_EQ(run.tools->calls(), called);
}

TEST(grpo_loop_tools, tool_results_stay_out_of_the_loss_and_runs_repeat) {
  auto c = tool_loop_config();
  c.prompts_per_step = 2;
  scripted_run a(c), b(c);
  for (int step = 0; step < 2; ++step) {
    auto ra = a.loop->step();
    auto rb = b.loop->step();
    ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message() : ra.error().message());
    EXPECT_GT(ra->tool_calls, 0);
    EXPECT_LT(ra->tool_calls, ra->samples);
    EXPECT_GT(ra->tool_tokens, 0);
    EXPECT_GT(ra->reward_mean, 0.0);
    EXPECT_LT(ra->reward_mean, 1.0);
    EXPECT_EQ(ra->tool_calls, rb->tool_calls);
    EXPECT_EQ(ra->loss, rb->loss);
    if (step == 0) {
      // Version 0 is what the scripted log-probs came from: on-policy, the ratio is 1 on every
      // token in the loss — a tool token in it (behaviour log-prob 0) would move it far from 1.
      EXPECT_LT(ra->ratio_deviation, 1e-4);
      EXPECT_GT(ra->grad_norm, 0.0);
    }
  }
  const auto& va = std::as_const(a.loop->model()).parameters();
  const auto& vb = std::as_const(b.loop->model()).parameters();
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i].value, vb[i].value) << va[i].name;
}

TEST(grpo_loop_tools, batch_synchronous_turns_give_the_same_samples) {
  auto c = tool_loop_config();
  c.prompts_per_step = 3;
  scripted_run a(c);
  c.batch_turns = true;
  scripted_run b(c);
  for (int step = 0; step < 2; ++step) {
    auto ra = a.loop->step();
    auto rb = b.loop->step();
    ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message() : ra.error().message());
    EXPECT_GT(rb->tool_calls, 0);
    EXPECT_EQ(ra->tool_calls, rb->tool_calls);
    EXPECT_EQ(ra->tool_tokens, rb->tool_tokens);
    EXPECT_EQ(ra->reward_mean, rb->reward_mean);
    EXPECT_EQ(ra->loss, rb->loss);
  }
  // weft's turns add each continuation as its result comes in; the baseline adds all of a
  // step's continuations at once, after the last result.
  EXPECT_EQ(a.backend->continuation_adds,
            std::vector<size_t>(a.backend->continuation_adds.size(), 1));
  ASSERT_EQ(b.backend->continuation_adds.size(), 2u);
  EXPECT_GT(b.backend->continuation_adds[0], 1u);
}

TEST(trajectory_priority, longest_predicted_first_and_rising_past_the_prediction) {
  // Until a trajectory outgrows its prediction, its priority is the prediction's.
  EXPECT_EQ(trajectory_priority_of(50.0, 0, 0), -50);
  EXPECT_EQ(trajectory_priority_of(50.0, 30, 1), -50);
  EXPECT_LT(trajectory_priority_of(80.0, 0, 0), trajectory_priority_of(50.0, 0, 0));
  // Past it: what it generated plus the mean of its turns so far.
  EXPECT_EQ(trajectory_priority_of(50.0, 60, 2), -90);
  EXPECT_EQ(trajectory_priority_of(50.0, 60, 0), -120);  // no turn done yet counts as one
  int32_t last = 0;
  for (int64_t g = 0; g < 400; g += 7) {  // never falls as it generates
    const int32_t p = trajectory_priority_of(50.0, g, 2);
    EXPECT_LE(p, last);
    last = p;
  }
  EXPECT_EQ(trajectory_priority_of(0.0, 0, 0), -1);
  EXPECT_EQ(trajectory_priority_of(1e30, 0, 0), -(1 << 30));
}

TEST(grpo_loop_tools, trajectory_priority_ranks_requests_and_changes_no_sample) {
  auto c = tool_loop_config();
  c.prompts_per_step = 2;
  scripted_run plain(c);
  c.trajectory_priority = true;
  scripted_run ranked(c);
  for (int step = 0; step < 2; ++step) {
    const size_t seen = ranked.backend->requests_seen.size();
    auto ra = plain.loop->step();
    auto rb = ranked.loop->step();
    ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message() : ra.error().message());
    EXPECT_GT(rb->tool_calls, 0);
    EXPECT_EQ(ra->tool_calls, rb->tool_calls);
    EXPECT_EQ(ra->reward_mean, rb->reward_mean);
    EXPECT_EQ(ra->loss, rb->loss);
    // The first turns of the step: the same prediction for every sample of a prompt.
    const auto& rs = ranked.backend->requests_seen;
    std::map<int64_t, int32_t> by_group;
    for (size_t i = seen; i < rs.size(); ++i) {
      if (rs[i].n_replay > 0) continue;  // a continuation
      auto it = by_group.emplace(rs[i].group, rs[i].params.priority);
      EXPECT_EQ(it.first->second, rs[i].params.priority);
      // Step 0 knows nothing: the ranker's prior (64 tokens); step 1 what step 0's samples did.
      if (step == 0) {
        EXPECT_EQ(rs[i].params.priority, -64);
      } else {
        EXPECT_LT(rs[i].params.priority, 0);
        EXPECT_GT(rs[i].params.priority, -64);
      }
    }
    EXPECT_EQ(by_group.size(), 2u);
  }
  for (const auto& r : plain.backend->requests_seen) EXPECT_EQ(r.params.priority, 0);
}

TEST(grpo_loop_tools, needs_a_tool_backend_and_known_tools) {
  const auto file = tiny_file();
  auto task = make_arithmetic_task(2, "+");
  auto c = tool_loop_config();
  c.tools = {"Search!"};
  auto m = trainable_model<float>::load(file);
  ASSERT_TRUE(m.ok());
  auto bad = grpo_loop::create(file, std::move(*m), *task, c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("cannot name a tool"), std::string::npos);
  c.tools = {"calc"};
  auto m2 = trainable_model<float>::load(file);
  ASSERT_TRUE(m2.ok());
  auto loop = grpo_loop::create(file, std::move(*m2), *task, c);
  ASSERT_TRUE(loop.ok()) << loop.error().message();
  auto st = (*loop)->step();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("tool backend"), std::string::npos);
}

}  // namespace
