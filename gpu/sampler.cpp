#include "gpu/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "gpu/cpu/elementwise.hpp"

namespace weft::gpu {

sampler::sampler(sampling_params params) : params_(std::move(params)), rng_(params_.seed) {}

void sampler::skip_draws(int64_t n) {
  if (params_.temperature > 0.0f && n > 0) rng_.discard(static_cast<unsigned long long>(n));
}

sample_result sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto n = static_cast<int64_t>(logits.size());
  sample_result res;

  // Log-probabilities under the model (before penalties and temperature). The first largest logit
  // (std::max_element's answer) comes with the maximum: greedy without penalties needs no copy.
  // (Vectorised: the scalar pass, its index a dependent load, was 4 % of one stream's decode.)
  float max_raw = 0.0f;
  const int64_t first_max = cpu::first_max_index(logits.data(), n, &max_raw);
  // The normaliser: its e^(l - max) in float, vectorised, summed in double (the log-probability is
  // a float: it moves by ~1e-7 at most against the C library's exp in double, which took ~5 % of a
  // serving step at 49k logits a token).
  const double log_z =
      std::log(cpu::exp_sum_below(logits.data(), static_cast<int64_t>(logits.size()), max_raw)) +
      max_raw;

  const bool penalties = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                         params_.frequency_penalty != 0.0f;
  if (params_.temperature <= 0.0f && !penalties && params_.logit_bias.empty()) {
    res.token = static_cast<int32_t>(first_max);
    return finish(res, logits, log_z);
  }
  work_.assign(logits.begin(), logits.end());
  for (const auto& [tok, bias] : params_.logit_bias) {
    if (tok >= 0 && tok < n) work_[static_cast<size_t>(tok)] += bias;
  }
  // Penalties over the last penalty_last_n tokens.
  if (penalties) {
    size_t start = 0;
    if (params_.penalty_last_n >= 0 &&
        history.size() > static_cast<size_t>(params_.penalty_last_n)) {
      start = history.size() - static_cast<size_t>(params_.penalty_last_n);
    }
    std::unordered_map<int32_t, int32_t> counts;
    for (size_t i = start; i < history.size(); ++i) {
      if (history[i] >= 0 && history[i] < n) ++counts[history[i]];
    }
    for (const auto& [tok, c] : counts) {
      float& l = work_[static_cast<size_t>(tok)];
      if (params_.repetition_penalty != 1.0f)
        l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
      l -= static_cast<float>(c) * params_.frequency_penalty + params_.presence_penalty;
    }
  }

  int32_t chosen = 0;
  if (params_.temperature <= 0.0f) {
    float top = 0.0f;
    chosen = static_cast<int32_t>(cpu::first_max_index(work_.data(), n, &top));
  } else if ((params_.top_k <= 0 || params_.top_k >= n) && params_.top_p >= 1.0f &&
             params_.min_p <= 0.0f) {
    // Nothing is truncated: sample the tempered softmax in id order. (Ordering the whole
    // vocabulary first, as the truncating path below must, cost more than everything else the
    // sampler does: ~8 % of an RL step on a 49k vocabulary.)
    // The weights in float, vectorised (as the normaliser above), accumulated in double.
    float top = 0.0f;
    cpu::first_max_index(work_.data(), n, &top);
    probs_.resize(static_cast<size_t>(n));
    const double total =
        cpu::exp_scaled_below(work_.data(), probs_.data(), n, top, 1.0f / params_.temperature);
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double acc = 0.0;
    chosen = static_cast<int32_t>(n - 1);
    for (int64_t i = 0; i < n; ++i) {
      acc += static_cast<double>(probs_[static_cast<size_t>(i)]);
      if (u < acc) {
        chosen = static_cast<int32_t>(i);
        break;
      }
    }
  } else {
    ids_.resize(static_cast<size_t>(n));
    std::iota(ids_.begin(), ids_.end(), 0);
    // Candidates sorted by logit (descending, ties by id): top-k first, then the rest if needed.
    auto by_logit = [&](int32_t a, int32_t b) {
      return work_[static_cast<size_t>(a)] > work_[static_cast<size_t>(b)] ||
             (work_[static_cast<size_t>(a)] == work_[static_cast<size_t>(b)] && a < b);
    };
    int64_t keep = n;
    if (params_.top_k > 0 && params_.top_k < n) keep = params_.top_k;
    std::partial_sort(ids_.begin(), ids_.begin() + keep, ids_.end(), by_logit);
    ids_.resize(static_cast<size_t>(keep));
    std::vector<double> p(ids_.size());
    const double inv_t = 1.0 / params_.temperature;
    const double top = work_[static_cast<size_t>(ids_[0])];
    double sum = 0.0;
    for (size_t i = 0; i < ids_.size(); ++i)
      sum += (p[i] = std::exp((work_[static_cast<size_t>(ids_[i])] - top) * inv_t));
    for (auto& x : p) x /= sum;
    size_t cut = p.size();
    if (params_.top_p < 1.0f) {
      double acc = 0.0;
      for (size_t i = 0; i < p.size(); ++i) {
        acc += p[i];
        if (acc >= params_.top_p) {
          cut = i + 1;
          break;
        }
      }
    }
    if (params_.min_p > 0.0f) {
      const double threshold = params_.min_p * p[0];
      size_t m = 1;
      while (m < cut && p[m] >= threshold) ++m;
      cut = m;
    }
    double total = 0.0;
    for (size_t i = 0; i < cut; ++i) total += p[i];
    // 53 random bits -> [0, 1); the RNG belongs to this sequence only.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double acc = 0.0;
    chosen = ids_[cut - 1];
    for (size_t i = 0; i < cut; ++i) {
      acc += p[i];
      if (u < acc) {
        chosen = ids_[i];
        break;
      }
    }
  }
  res.token = chosen;
  return finish(res, logits, log_z);
}

sample_result sampler::finish(sample_result res, std::span<const float> logits,
                              double log_z) const {
  const auto n = static_cast<int64_t>(logits.size());
  double inv_t = 1.0;
  if (params_.tempered_logprobs && params_.temperature > 0.0f && params_.temperature != 1.0f) {
    inv_t = 1.0 / static_cast<double>(params_.temperature);
    float top = 0.0f;
    cpu::first_max_index(logits.data(), n, &top);
    log_z =
        std::log(cpu::exp_scaled_below(logits.data(), nullptr, n, top, static_cast<float>(inv_t))) +
        static_cast<double>(top) * inv_t;
  }
  auto logprob = [&](int32_t t) {
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(t)]) * inv_t - log_z);
  };
  res.logprob = logprob(res.token);
  if (params_.n_logprobs > 0) {
    const auto k = static_cast<size_t>(std::min<int64_t>(params_.n_logprobs, n));
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(
        idx.begin(), idx.begin() + static_cast<int64_t>(k), idx.end(), [&](int32_t a, int32_t b) {
          return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
                 (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
        });
    for (size_t i = 0; i < k; ++i) res.top.push_back({idx[i], logprob(idx[i])});
  }
  return res;
}

}  // namespace weft::gpu
