// Rewards in the GRPO loop (docs/rl.md, "Rewards from your own program"): the task's verifier
// or an external reward; with async rewards, batches go to the reward thread (reward_queue) while
// the rollouts go on — whole groups, or with reward_unit::sample each sample as it finishes — and
// their results come back to their samples; a group is scored once all its samples are.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <utility>

#include "gpu/rl/grpo_loop.hpp"

namespace weft::gpu::rl {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void grpo_loop::set_reward(batch_reward reward, reward_unit unit, int concurrency) {
  stop_rewards();
  reward_ = std::move(reward);
  reward_unit_ = unit;
  if (reward_ && config_.async_rewards) rewards_ = std::make_unique<reward_queue>(concurrency);
}

void grpo_loop::stop_rewards() {
  if (!rewards_) return;
  rewards_->stop();
  rewards_.reset();
  scoring_.clear();
  unscored_.clear();
}

status grpo_loop::score_samples(std::vector<sample_ref> refs) {
  // The batch: copies of its samples, each answering its prompt in `prompts`.
  std::vector<rl_prompt> prompts;
  std::vector<rollout_sample> batch;
  std::map<std::pair<int64_t, int64_t>, int64_t> prompt_of;  // (step, group) -> index in prompts
  for (const auto& r : refs) {
    const pending_step& p = pending_.at(r.step);
    rollout_sample s = p.samples[r.index];
    auto [it, fresh] =
        prompt_of.try_emplace({r.step, s.group}, static_cast<int64_t>(prompts.size()));
    if (fresh) prompts.push_back(p.prompts[static_cast<size_t>(s.group)]);
    s.group = it->second;
    batch.push_back(std::move(s));
  }
  if (rewards_) {
    // Scored on the reward thread while the rollouts go on; the job owns its copies.
    const uint64_t ticket = next_ticket_++;
    auto job = [this, prompts = std::move(prompts), batch = std::move(batch)] {
      return score(prompts, batch);
    };
    if (auto st = rewards_->submit(ticket, std::move(job)); !st) return st;
    scoring_[ticket] = std::move(refs);
    return {};
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto rewards = score(prompts, batch);
  const double seconds = seconds_since(t0);
  if (reward_) reward_wait_s_ += seconds;  // the task's own verifier is not a wait for a reward
  return apply_rewards(refs, rewards, seconds);
}

status grpo_loop::submit_unscored() {
  if (unscored_.empty() || rewards_->pending() >= rewards_->workers()) return {};
  std::vector<sample_ref> refs;
  refs.swap(unscored_);
  return score_samples(std::move(refs));
}

status grpo_loop::apply_rewards(const std::vector<sample_ref>& refs,
                                const result<std::vector<double>>& rewards, double seconds) {
  if (refs.empty()) return {};
  if (!rewards) {
    const pending_step& p = pending_.at(refs.front().step);
    std::string which = "step " + std::to_string(refs.front().step + 1) + ", group " +
                        std::to_string(p.samples[refs.front().index].group);
    if (refs.size() > 1 && static_cast<int64_t>(refs.size()) != config_.group_size) {
      which = std::to_string(refs.size()) + " samples from " + which + " on";
    }
    return status{rewards.error().code(), "rewards of " + which + ": " + rewards.error().message()};
  }
  const double share = seconds / static_cast<double>(refs.size());
  for (size_t k = 0; k < refs.size(); ++k) {
    auto it = pending_.find(refs[k].step);
    if (it == pending_.end()) continue;  // a dropped step's
    pending_step& p = it->second;
    rollout_sample& s = p.samples[refs[k].index];
    s.reward = (*rewards)[k];
    const auto g = static_cast<size_t>(s.group);
    ++p.group_rewarded[g];
    p.reward_s += share;
  }
  return {};
}

status grpo_loop::collect_rewards(bool wait, uint64_t want,
                                  std::optional<result<std::vector<double>>>* wanted) {
  if (!rewards_) return {};
  if (auto st = submit_unscored(); !st) return st;
  if (rewards_->pending() == 0) return {};
  const auto t0 = std::chrono::steady_clock::now();
  auto done = rewards_->ready(wait);
  if (wait) reward_wait_s_ += seconds_since(t0);
  for (auto& d : done) {
    if (wanted && d.ticket == want) {
      *wanted = std::move(d.value);
      continue;
    }
    auto it = scoring_.find(d.ticket);
    if (it == scoring_.end()) continue;  // a batch of a dropped step
    const std::vector<sample_ref> refs = std::move(it->second);
    scoring_.erase(it);
    if (auto st = apply_rewards(refs, d.value, d.seconds); !st) return st;
  }
  // A reward thread may be idle now: what finished meanwhile goes to it.
  return submit_unscored();
}

bool grpo_loop::groups_scored(const pending_step& p, int64_t begin, int64_t end) const {
  return std::all_of(p.group_rewarded.begin() + begin, p.group_rewarded.begin() + end,
                     [this](int64_t n) { return n == config_.group_size; });
}

bool grpo_loop::step_scored(int64_t m) const {
  auto it = pending_.find(m);
  return it != pending_.end() && groups_scored(it->second, 0, config_.prompts_per_step);
}

bool grpo_loop::rewards_pending() const {
  return rewards_ && (rewards_->pending() > 0 || !unscored_.empty());
}

result<std::vector<double>> grpo_loop::score(const std::vector<rl_prompt>& prompts,
                                             const std::vector<rollout_sample>& samples) {
  if (reward_) {
    auto r = reward_(prompts, samples);
    if (r && r->size() != samples.size()) {
      return status{status_code::internal, "the reward gave " + std::to_string(r->size()) +
                                               " rewards for " + std::to_string(samples.size()) +
                                               " samples"};
    }
    return r;
  }
  std::vector<double> out;
  for (const auto& s : samples) {
    out.push_back(task_.reward(prompts[static_cast<size_t>(s.group)], s.text));
  }
  return out;
}

result<std::vector<double>> grpo_loop::score_now(const std::vector<rl_prompt>& prompts,
                                                 const std::vector<rollout_sample>& samples) {
  if (!rewards_) return score(prompts, samples);
  // Through the reward threads (the reward is used from them only); the job owns its copies
  // (an error of another batch may return before it runs). Batches of pending steps scored
  // meanwhile go to their steps.
  const uint64_t ticket = next_ticket_++;
  if (auto st = rewards_->submit(ticket,
                                 [this, set = prompts, all = samples] { return score(set, all); });
      !st) {
    return st;
  }
  std::optional<result<std::vector<double>>> mine;
  while (!mine && rewards_pending()) {
    if (auto st = collect_rewards(true, ticket, &mine); !st) return st;
  }
  if (!mine) return status{status_code::internal, "the batch's rewards did not come back"};
  return std::move(*mine);
}

}  // namespace weft::gpu::rl
