// The KL reference in the GRPO loop (docs/rl.md, "KL to the reference"): the frozen starting
// weights' log-probabilities of every completion token — for a finished group as soon as it
// finishes (RLHFuse's inter-stage fusion), or for the update's packed batches in the training
// stage. A reference that runs elsewhere (reference workers) is called from a thread of the loop's
// own (reference_queue) while the rollouts go on; groups that finish while a call is out go
// together in the next call, which spreads them over the workers.
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "gpu/rl/grpo_loop.hpp"

namespace weft::gpu::rl {

namespace {

/// A finished group as one reference batch: the prompt's prefix once, each completion after the
/// prompt's last token. `expect`: its targets, the group's completion tokens (0: nothing to do).
train::train_batch group_batch(std::span<const rollout_sample> group, size_t& expect) {
  train::train_batch b;
  expect = 0;
  const std::vector<int32_t>& prompt = group.front().prompt;
  const bool shared = prompt.size() > 1;
  const int64_t prefix =
      shared ? b.add_prefix(std::span<const int32_t>(prompt).first(prompt.size() - 1)) : -1;
  for (const rollout_sample& x : group) {
    if (x.completion.empty()) continue;
    const size_t lead = shared ? 1 : prompt.size();
    std::vector<int32_t> toks(prompt.end() - static_cast<std::ptrdiff_t>(lead), prompt.end());
    toks.insert(toks.end(), x.completion.begin(), x.completion.end());
    std::vector<uint8_t> in_loss(toks.size(), 0);
    std::fill(in_loss.begin() + static_cast<std::ptrdiff_t>(lead), in_loss.end(), uint8_t{1});
    std::vector<train::policy_token> info(toks.size());
    b.add(toks, in_loss, info, prefix);
    expect += x.completion.size();
  }
  return b;
}

/// Splits a group's reference log-probs over its samples' ref_logp.
status apply_group(std::span<rollout_sample> group, const std::vector<float>& lp) {
  size_t expect = 0;
  for (const rollout_sample& x : group) expect += x.completion.size();
  if (lp.size() != expect) {
    return status{status_code::internal, "reference log-probs: " + std::to_string(lp.size()) +
                                             " for " + std::to_string(expect) + " tokens"};
  }
  size_t k = 0;
  for (rollout_sample& x : group) {
    x.ref_logp.assign(lp.begin() + static_cast<std::ptrdiff_t>(k),
                      lp.begin() + static_cast<std::ptrdiff_t>(k + x.completion.size()));
    k += x.completion.size();
  }
  return {};
}

double seconds_from(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void grpo_loop::set_reference(std::shared_ptr<reference_policy> ref) {
  ref_ = std::move(ref);
  if (ref_ && ref_->runs_elsewhere() && config_.fuse_reference && config_.async_reference &&
      !references_) {
    // One thread: a call spreads its groups over the workers itself, and the reference is
    // called from one thread at a time.
    references_ = std::make_unique<reference_queue>(1);
  }
}

void grpo_loop::stop_references() {
  if (!references_) return;
  references_->stop();
  references_.reset();
  referencing_.clear();
  unreferenced_.clear();
}

status grpo_loop::add_reference_logprobs(std::vector<std::vector<train::train_batch>>& batches) {
  // The loop calls the reference itself only with no call of the reference thread out.
  if (auto st = drain_references(); !st) return st;
  std::vector<train::train_batch*> all;
  for (auto& share : batches) {
    for (auto& b : share) all.push_back(&b);
  }
  auto lps = ref_->logprobs(std::span<const train::train_batch* const>(all.data(), all.size()));
  if (!lps) return lps.error();
  for (size_t j = 0; j < all.size(); ++j) {
    train::train_batch& b = *all[j];
    const std::vector<float>& lp = (*lps)[j];
    size_t k = 0;
    for (size_t i = 0; i < b.targets.size() && i < b.policy.size(); ++i) {
      if (b.targets[i] >= 0 && k < lp.size()) b.policy[i].ref_logp = lp[k++];
    }
  }
  return {};
}

status grpo_loop::reference_logprobs_of_group(std::span<rollout_sample> group) {
  size_t expect = 0;
  const train::train_batch b = group_batch(group, expect);
  if (expect == 0) return {};
  const train::train_batch* one = &b;
  auto lps = ref_->logprobs(std::span<const train::train_batch* const>(&one, 1));
  if (!lps) return lps.error();
  return apply_group(group, lps->front());
}

status grpo_loop::reference_group_finished(int64_t m, size_t g) {
  pending_step& p = pending_.at(m);
  if (references_) {
    p.group_ref_out[g] = 1;
    unreferenced_.emplace_back(m, g);
    return submit_unreferenced();
  }
  const auto n = static_cast<size_t>(config_.group_size);
  const auto t0 = std::chrono::steady_clock::now();
  auto st = reference_logprobs_of_group(std::span<rollout_sample>(p.samples).subspan(g * n, n));
  const double seconds = seconds_from(t0);
  p.ref_s += seconds;
  if (ref_->runs_elsewhere()) reference_wait_s_ += seconds;  // blocked on the workers
  return st;
}

status grpo_loop::submit_unreferenced() {
  if (unreferenced_.empty() || references_->pending() > 0) return {};
  const auto n = static_cast<size_t>(config_.group_size);
  std::vector<train::train_batch> batches;
  std::vector<std::pair<int64_t, size_t>> groups;
  for (const auto& [m, g] : unreferenced_) {
    auto it = pending_.find(m);
    if (it == pending_.end()) continue;  // a dropped step's
    size_t expect = 0;
    auto b =
        group_batch(std::span<const rollout_sample>(it->second.samples).subspan(g * n, n), expect);
    if (expect == 0) {
      it->second.group_ref_out[g] = 0;  // nothing generated: nothing to compute
      continue;
    }
    batches.push_back(std::move(b));
    groups.emplace_back(m, g);
  }
  unreferenced_.clear();
  if (groups.empty()) return {};
  // The job owns its batches and a reference to the policy: nothing of the loop's.
  const uint64_t ticket = next_ticket_++;
  auto job = [ref = ref_, batches = std::move(batches)] {
    std::vector<const train::train_batch*> all;
    for (const auto& b : batches) all.push_back(&b);
    return ref->logprobs(std::span<const train::train_batch* const>(all.data(), all.size()));
  };
  if (auto st = references_->submit(ticket, std::move(job)); !st) return st;
  referencing_[ticket] = std::move(groups);
  return {};
}

status grpo_loop::collect_references(bool wait) {
  if (!references_) return {};
  if (auto st = submit_unreferenced(); !st) return st;
  if (references_->pending() == 0) return {};
  const auto t0 = std::chrono::steady_clock::now();
  auto done = references_->ready(wait);
  if (wait) reference_wait_s_ += seconds_from(t0);
  const auto n = static_cast<size_t>(config_.group_size);
  for (auto& d : done) {
    auto it = referencing_.find(d.ticket);
    if (it == referencing_.end()) continue;  // a call of dropped steps
    const std::vector<std::pair<int64_t, size_t>> groups = std::move(it->second);
    referencing_.erase(it);
    if (!d.value) return d.value.error();  // the worker's error, as a call in the loop gives it
    if (d.value->size() != groups.size()) {
      return status{status_code::internal, "the reference answered " +
                                               std::to_string(d.value->size()) + " batches for " +
                                               std::to_string(groups.size()) + " groups"};
    }
    const double share = d.seconds / static_cast<double>(groups.size());
    for (size_t k = 0; k < groups.size(); ++k) {
      const auto [m, g] = groups[k];
      auto pit = pending_.find(m);
      if (pit == pending_.end()) continue;
      pending_step& p = pit->second;
      if (auto st =
              apply_group(std::span<rollout_sample>(p.samples).subspan(g * n, n), (*d.value)[k]);
          !st) {
        return st;
      }
      p.group_ref_out[g] = 0;
      p.ref_s += share;
    }
  }
  // The reference thread may be idle now: the groups that finished meanwhile go to it.
  return submit_unreferenced();
}

status grpo_loop::drain_references() {
  while (references_ && (references_->pending() > 0 || !unreferenced_.empty())) {
    if (auto st = collect_references(true); !st) return st;
  }
  return {};
}

bool grpo_loop::groups_referenced(const pending_step& p, int64_t begin, int64_t end) const {
  return std::all_of(p.group_ref_out.begin() + begin, p.group_ref_out.begin() + end,
                     [](uint8_t out) { return out == 0; });
}

}  // namespace weft::gpu::rl
