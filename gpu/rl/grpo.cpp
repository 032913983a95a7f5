#include "gpu/rl/grpo.hpp"

#include <algorithm>
#include <cmath>

namespace weft::gpu::rl {

bool parse_loss_aggregation(const std::string& name, loss_aggregation& out) {
  if (name == "token") {
    out = loss_aggregation::token;
  } else if (name == "sequence") {
    out = loss_aggregation::sequence;
  } else if (name == "constant") {
    out = loss_aggregation::constant;
  } else {
    return false;
  }
  return true;
}

const char* loss_aggregation_name(loss_aggregation a) {
  switch (a) {
    case loss_aggregation::token:
      return "token";
    case loss_aggregation::sequence:
      return "sequence";
    case loss_aggregation::constant:
      return "constant";
  }
  return "?";
}

bool parse_off_policy_correction(const std::string& name, off_policy_correction& out) {
  if (name == "ppo-clip") {
    out = off_policy_correction::ppo_clip;
  } else if (name == "decoupled") {
    out = off_policy_correction::decoupled;
  } else {
    return false;
  }
  return true;
}

const char* off_policy_correction_name(off_policy_correction c) {
  return c == off_policy_correction::decoupled ? "decoupled" : "ppo-clip";
}

std::vector<double> group_advantages(std::span<const double> rewards, int64_t group_size,
                                     bool scale) {
  std::vector<double> adv(rewards.size(), 0.0);
  if (group_size <= 0) return adv;
  const auto g = static_cast<size_t>(group_size);
  for (size_t start = 0; start + g <= rewards.size(); start += g) {
    double mean = 0.0;
    for (size_t j = 0; j < g; ++j) mean += rewards[start + j];
    mean /= static_cast<double>(g);
    double var = 0.0;
    for (size_t j = 0; j < g; ++j) var += (rewards[start + j] - mean) * (rewards[start + j] - mean);
    const double sd = g > 1 ? std::sqrt(var / static_cast<double>(g - 1)) : 0.0;
    for (size_t j = 0; j < g; ++j) {
      const double centred = rewards[start + j] - mean;
      adv[start + j] = scale ? centred / (sd + 1e-4) : centred;
    }
  }
  return adv;
}

std::vector<uint8_t> zero_variance_groups(std::span<const double> rewards, int64_t group_size) {
  std::vector<uint8_t> out;
  if (group_size <= 0) return out;
  const auto g = static_cast<size_t>(group_size);
  for (size_t start = 0; start + g <= rewards.size(); start += g) {
    bool same = true;
    for (size_t j = 1; j < g; ++j) same = same && rewards[start + j] == rewards[start];
    out.push_back(same ? 1 : 0);
  }
  return out;
}

ppo_term ppo_clip(double logp, double behaviour_logp, double advantage, double clip_low,
                  double clip_high) {
  ppo_term t;
  t.ratio = std::exp(logp - behaviour_logp);
  const double clipped_ratio = std::clamp(t.ratio, 1.0 - clip_low, 1.0 + clip_high);
  const double unclipped = t.ratio * advantage;
  const double clipped = clipped_ratio * advantage;
  if (clipped < unclipped) {
    // The clipped branch is the minimum: constant in logp.
    t.loss = -clipped;
    t.dloss_dlogp = 0.0;
    t.clipped = true;
  } else {
    t.loss = -unclipped;
    t.dloss_dlogp = -unclipped;  // d(−r·A)/dlogp = −r·A
  }
  return t;
}

ppo_term decoupled_is(double logp, double behaviour_logp, double advantage, double cap) {
  ppo_term t;
  t.ratio = std::exp(logp - behaviour_logp);
  const double w = std::min(t.ratio, cap);
  t.clipped = t.ratio > cap;
  t.loss = -w * advantage;
  t.dloss_dlogp = -w * advantage;
  return t;
}

kl_term kl_k3(double logp, double ref_logp) {
  const double d = ref_logp - logp;
  const double e = std::exp(d);
  return kl_term{e - d - 1.0, 1.0 - e};
}

std::vector<double> sample_token_weights(std::span<const int64_t> lengths,
                                         std::span<const uint8_t> keep, loss_aggregation agg,
                                         int64_t max_new_tokens) {
  const size_t n = lengths.size();
  std::vector<double> w(n, 0.0);
  int64_t kept = 0, kept_tokens = 0;
  for (size_t s = 0; s < n; ++s) {
    if (keep.empty() || keep[s] != 0) {
      ++kept;
      kept_tokens += lengths[s];
    }
  }
  if (kept == 0) return w;
  for (size_t s = 0; s < n; ++s) {
    if (!keep.empty() && keep[s] == 0) continue;
    switch (agg) {
      case loss_aggregation::token:
        w[s] = kept_tokens > 0 ? 1.0 / static_cast<double>(kept_tokens) : 0.0;
        break;
      case loss_aggregation::sequence:
        w[s] = lengths[s] > 0 ? 1.0 / (static_cast<double>(kept) * static_cast<double>(lengths[s]))
                              : 0.0;
        break;
      case loss_aggregation::constant:
        w[s] = 1.0 / (static_cast<double>(kept) *
                      static_cast<double>(std::max<int64_t>(1, max_new_tokens)));
        break;
    }
  }
  return w;
}

double ppo_stats::clip_fraction() const {
  const int64_t n = tokens.load();
  return n > 0 ? static_cast<double>(clipped.load()) / static_cast<double>(n) : 0.0;
}

double ppo_stats::mean_kl() const {
  const int64_t n = tokens.load();
  return n > 0 ? static_cast<double>(kl_nano.load()) * 1e-9 / static_cast<double>(n) : 0.0;
}

double ppo_stats::mean_abs_ratio_deviation() const {
  const int64_t n = tokens.load();
  return n > 0 ? static_cast<double>(abs_ratio_dev_nano.load()) * 1e-9 / static_cast<double>(n)
               : 0.0;
}

train::token_objective<float> ppo_objective(const grpo_config& config, ppo_stats* stats) {
  const double lo = config.clip_low, hi = config.clip_high, cap = config.is_cap;
  const double beta = config.kl_coef;
  const bool decoupled = config.correction == off_policy_correction::decoupled;
  return [lo, hi, cap, beta, decoupled, stats](
             const train::train_batch& b, std::span<const int64_t> positions,
             std::span<const float> logp, std::span<float> dlogp) -> double {
    double total = 0.0;
    int64_t clipped = 0, dev = 0, kl_nano = 0;
    for (size_t j = 0; j < positions.size(); ++j) {
      const auto pos = static_cast<size_t>(positions[j]);
      const train::policy_token& p = b.policy.empty() ? train::policy_token{} : b.policy[pos];
      const ppo_term t = decoupled ? decoupled_is(logp[j], p.behaviour_logp, p.advantage, cap)
                                   : ppo_clip(logp[j], p.behaviour_logp, p.advantage, lo, hi);
      double loss = t.loss, grad = t.dloss_dlogp;
      if (beta > 0.0) {
        const kl_term k = kl_k3(logp[j], p.ref_logp);
        loss += beta * k.kl;
        grad += beta * k.dkl_dlogp;
        kl_nano += static_cast<int64_t>(std::llround(k.kl * 1e9));
      }
      total += static_cast<double>(p.weight) * loss;
      dlogp[j] = static_cast<float>(static_cast<double>(p.weight) * grad);
      clipped += t.clipped ? 1 : 0;
      dev += static_cast<int64_t>(std::llround(std::fabs(t.ratio - 1.0) * 1e9));
    }
    if (stats != nullptr) {
      stats->tokens += static_cast<int64_t>(positions.size());
      stats->clipped += clipped;
      stats->abs_ratio_dev_nano += dev;
      stats->kl_nano += kl_nano;
    }
    return total;
  };
}

}  // namespace weft::gpu::rl
