// What the trainer's forward and backward take from a step's samples: packed batches (a group's
// prompt once, every sample continuing it) with each token's policy inputs (docs/rl.md, "The
// algorithm"). The KL reference's log-probabilities of them: grpo_reference.cpp.
#include "gpu/rl/grpo_loop.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>

namespace weft::gpu::rl {

namespace {

// Units to shares, largest first to the lightest share; returns the shares' loads in tokens,
// heaviest first.
std::vector<size_t> assign_units(const std::vector<update_unit>& units, int shares,
                                 std::vector<std::vector<size_t>>& to) {
  std::vector<size_t> order(units.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return units[a].tokens > units[b].tokens; });
  to.assign(static_cast<size_t>(std::max(1, shares)), {});
  std::vector<size_t> load(to.size(), 0);
  for (size_t u : order) {
    const auto j = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    to[j].push_back(u);
    load[j] += units[u].tokens;
  }
  for (auto& s : to) std::sort(s.begin(), s.end());
  std::sort(load.begin(), load.end(), std::greater<>());
  return load;
}

}  // namespace

share_plan plan_update_shares(std::vector<update_unit> units, int shares,
                              const std::function<size_t(size_t)>& sample_tokens) {
  share_plan plan;
  std::vector<size_t> loads = assign_units(units, shares, plan.shares);
  plan.units = std::move(units);
  for (;;) {
    // The largest unit that can be split (the first of equals).
    size_t big = plan.units.size();
    for (size_t u = 0; u < plan.units.size(); ++u) {
      if (plan.units[u].samples.size() >= 2 &&
          (big == plan.units.size() || plan.units[u].tokens > plan.units[big].tokens)) {
        big = u;
      }
    }
    if (big == plan.units.size()) break;
    auto trial = plan.units;
    update_unit& a = trial[big];
    update_unit b{a.group, {}, a.prefix, a.prefix};
    const auto keep = static_cast<std::ptrdiff_t>(a.samples.size() / 2);
    b.samples.assign(a.samples.begin() + keep, a.samples.end());
    a.samples.resize(static_cast<size_t>(keep));
    for (size_t s : b.samples) {
      b.tokens += sample_tokens(s);
      a.tokens -= sample_tokens(s);
    }
    trial.insert(trial.begin() + static_cast<std::ptrdiff_t>(big) + 1, std::move(b));
    std::vector<std::vector<size_t>> to;
    auto trial_loads = assign_units(trial, shares, to);
    // Kept when the loads, heaviest first, are lexicographically lighter (two shares tied at the
    // top take two splits to lighten): each kept split lowers them, so this ends.
    if (!(trial_loads < loads)) break;
    plan.units = std::move(trial);
    plan.shares = std::move(to);
    loads = std::move(trial_loads);
  }
  plan.heaviest = loads.front();
  return plan;
}

std::vector<std::vector<train::train_batch>> grpo_loop::pack_update(
    const std::vector<rollout_sample>& samples, const scored_step& sc) const {
  // Samples with a zero advantage add exactly nothing to the gradient (their PPO term is 0·r)
  // unless a KL term pulls them: they count in the loss's normaliser (the weights) but skip the
  // forward and backward.
  // The others train in units of one prompt: the prompt (all but its last token) is packed once
  // as a shared prefix and every sample continues it with [last prompt token, completion] — the
  // same gradient as packing prompt + completion per sample, for a fraction of the tokens. Units
  // go to the shares balanced by tokens, split where a share would otherwise idle
  // (plan_update_shares), in a fixed order, so the bits repeat.
  // A trainer group trains `shares` lists on each of its ranks.
  const int shares = std::max(1, config_.shares) * (group_ ? group_->world() : 1);
  // Routing replay: positions [from, from + n) of a sample's routes go to the batch's tokens
  // from `at` on (as many of them as the rollout engine computed).
  const int64_t width = route_width();
  auto set_routes = [width](train::train_batch& b, int64_t at, const std::vector<uint8_t>& routes,
                            size_t from, size_t n) {
    if (width == 0 || routes.empty()) return;
    const size_t have = routes.size() / static_cast<size_t>(width);
    if (from >= have) return;
    const size_t count = std::min(n, have - from);
    b.set_routes(at,
                 std::span<const uint8_t>(routes).subspan(from * static_cast<size_t>(width),
                                                          count * static_cast<size_t>(width)),
                 width);
  };
  auto sample_tokens = [&](size_t s) {
    const rollout_sample& x = samples[s];
    return x.completion.size() + (x.prompt.size() > 1 ? 1 : x.prompt.size());
  };
  std::vector<update_unit> units;
  for (size_t s = 0; s < samples.size(); ++s) {
    const rollout_sample& x = samples[s];
    // With a KL term a zero-advantage sample still has a gradient (β·∇k3), and with the
    // load-balancing loss its routing still counts: it trains.
    const bool no_gradient =
        sc.adv[s] == 0.0 && config_.grpo.kl_coef == 0.0 && config_.grpo.router_aux_loss_coef == 0.0;
    if (sc.keep[s] == 0 || no_gradient || x.completion.empty()) continue;
    if (units.empty() || units.back().group != x.group) {
      const size_t prefix = x.prompt.size() > 1 ? x.prompt.size() - 1 : 0;
      units.push_back(update_unit{x.group, {}, prefix, prefix});
    }
    units.back().samples.push_back(s);
    units.back().tokens += sample_tokens(s);
  }
  const share_plan plan = plan_update_shares(std::move(units), shares, sample_tokens);
  const auto& share_units = plan.shares;
  std::vector<std::vector<train::train_batch>> batches(static_cast<size_t>(shares));
  for (size_t j = 0; j < share_units.size(); ++j) {
    auto& list = batches[j];
    for (size_t u : share_units[j]) {
      const update_unit& unit = plan.units[u];
      const std::vector<int32_t>& prompt = samples[unit.samples.front()].prompt;
      if (list.empty() ||
          list.back().n_tokens() + static_cast<int64_t>(unit.tokens) > config_.micro_batch_tokens) {
        list.emplace_back();
      }
      train::train_batch& b = list.back();
      const bool shared = prompt.size() > 1;
      const int64_t prefix_at = b.n_tokens();
      const int64_t prefix =
          shared ? b.add_prefix(std::span<const int32_t>(prompt).first(prompt.size() - 1)) : -1;
      // Routing replay: the shared prefix takes the routes of the unit's first sample.
      if (shared)
        set_routes(b, prefix_at, samples[unit.samples.front()].routes, 0, prompt.size() - 1);
      for (size_t s : unit.samples) {
        const rollout_sample& x = samples[s];
        // [last prompt token, completion...] after the shared prefix, or the whole sequence.
        const size_t lead = shared ? 1 : prompt.size();
        std::vector<int32_t> toks(prompt.end() - static_cast<std::ptrdiff_t>(lead), prompt.end());
        toks.insert(toks.end(), x.completion.begin(), x.completion.end());
        std::vector<uint8_t> in_loss(toks.size(), 0);
        std::vector<train::policy_token> info(toks.size());
        for (size_t i = 0; i < x.completion.size(); ++i) {
          const size_t at = lead + i;
          // A tool's result is context for what follows, not a token the policy chose.
          if (i < x.tool_mask.size() && x.tool_mask[i] != 0) continue;
          in_loss[at] = 1;
          info[at].behaviour_logp = x.logp[i];
          if (i < x.ref_logp.size()) info[at].ref_logp = x.ref_logp[i];
          info[at].advantage = static_cast<float>(sc.adv[s]);
          info[at].weight = static_cast<float>(sc.weights[s]);
          info[at].sample = static_cast<int32_t>(s);
        }
        const int64_t at = b.n_tokens();
        b.add(toks, in_loss, info, prefix);
        set_routes(b, at, x.routes, prompt.size() - lead, toks.size());
      }
    }
  }
  while (!batches.empty() && batches.back().empty()) batches.pop_back();
  return batches;
}

}  // namespace weft::gpu::rl
