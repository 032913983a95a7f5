#include "gpu/rl/grpo_update.hpp"

#include <algorithm>

namespace weft::gpu::rl {

result<iteration_totals> update_iteration(train::trainable_model<float>& model, train::adamw& opt,
                                          std::span<const uint8_t> decay, const grpo_config& g,
                                          const iteration_inputs& in, int shares,
                                          std::span<const std::vector<train::train_batch>> lists,
                                          const group_reducer& reduce) {
  ppo_stats stats;
  const auto objective = ppo_objective(g, &stats);
  model.zero_grad(std::max({1, shares, static_cast<int>(lists.size())}));
  iteration_totals t;
  const bool any =
      std::any_of(lists.begin(), lists.end(), [](const auto& l) { return !l.empty(); });
  if (any) {
    auto l = model.forward_backward(lists, objective);
    if (!l) return l.error();
    t.loss_sum = l->sum;
  }
  std::vector<std::span<float>> grads, values;
  for (auto& p : model.parameters()) {
    grads.emplace_back(p.grad);
    values.emplace_back(p.value);
  }
  t.tokens = stats.tokens.load();
  t.clipped = stats.clipped.load();
  t.abs_ratio_dev_nano = stats.abs_ratio_dev_nano.load();
  t.kl_nano = stats.kl_nano.load();
  if (reduce) {
    // Integer counters travel as doubles: exact below 2^53.
    double scalars[5] = {t.loss_sum, static_cast<double>(t.tokens), static_cast<double>(t.clipped),
                         static_cast<double>(t.abs_ratio_dev_nano), static_cast<double>(t.kl_nano)};
    if (auto st = reduce(std::span<const std::span<float>>(grads), std::span<double>(scalars, 5));
        !st) {
      return st;
    }
    t.loss_sum = scalars[0];
    t.tokens = static_cast<int64_t>(scalars[1]);
    t.clipped = static_cast<int64_t>(scalars[2]);
    t.abs_ratio_dev_nano = static_cast<int64_t>(scalars[3]);
    t.kl_nano = static_cast<int64_t>(scalars[4]);
  }
  // The objective's token weights already normalise the loss: no scaling here.
  auto norm =
      train::clip_and_update(opt, values, grads, decay, in.max_grad_norm, in.lr, in.opt_step);
  if (!norm) return norm.error();
  t.grad_norm = *norm;
  return t;
}

std::vector<std::span<float>> trainer_state(train::trainable_model<float>& model,
                                            train::adamw& opt) {
  std::vector<std::span<float>> out;
  for (auto& p : model.parameters()) out.emplace_back(p.value);
  for (size_t i = 0; i < opt.n_tensors(); ++i) out.emplace_back(opt.m(i));
  for (size_t i = 0; i < opt.n_tensors(); ++i) out.emplace_back(opt.v(i));
  return out;
}

}  // namespace weft::gpu::rl
