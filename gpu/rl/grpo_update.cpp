// One optimizer iteration (every rank) and the GRPO loop's update: alone, on a device, or over a
// trainer group (docs/rl.md, "Trainer groups").
#include "gpu/rl/grpo_update.hpp"

#include <algorithm>
#include <tuple>

#include "gpu/rl/grpo_loop.hpp"

namespace weft::gpu::rl {

namespace {

/// Runs `sum` on the iteration's loss and counters packed as doubles (integers exact below 2^53),
/// then reads the sums back into `t`.
template <class Sum>
status reduce_scalars_with(iteration_totals& t, Sum&& sum) {
  double scalars[7] = {t.loss_sum,
                       static_cast<double>(t.tokens),
                       static_cast<double>(t.clipped),
                       static_cast<double>(t.abs_ratio_dev_nano),
                       static_cast<double>(t.kl_nano),
                       static_cast<double>(t.routes_replayed),
                       static_cast<double>(t.routes_differ)};
  if (auto st = sum(std::span<double>(scalars, 7)); !st) return st;
  t.loss_sum = scalars[0];
  t.tokens = static_cast<int64_t>(scalars[1]);
  t.clipped = static_cast<int64_t>(scalars[2]);
  t.abs_ratio_dev_nano = static_cast<int64_t>(scalars[3]);
  t.kl_nano = static_cast<int64_t>(scalars[4]);
  t.routes_replayed = static_cast<int64_t>(scalars[5]);
  t.routes_differ = static_cast<int64_t>(scalars[6]);
  return {};
}

/// The objective's counters and the routing replay's of this rank's forward and backward.
void take_counters(iteration_totals& t, const ppo_stats& stats,
                   train::trainable_model<float>& model) {
  t.tokens = stats.tokens.load();
  t.clipped = stats.clipped.load();
  t.abs_ratio_dev_nano = stats.abs_ratio_dev_nano.load();
  t.kl_nano = stats.kl_nano.load();
  std::tie(t.routes_replayed, t.routes_differ) = model.take_routing_stats();
}

}  // namespace

result<iteration_totals> update_iteration(train::trainable_model<float>& model, train::adamw& opt,
                                          std::span<const uint8_t> decay, const grpo_config& g,
                                          const iteration_inputs& in, int shares,
                                          std::span<const std::vector<train::train_batch>> lists,
                                          const group_reducer& reduce,
                                          train::overlapped_reducer* overlap) {
  ppo_stats stats;
  const auto objective = ppo_objective(g, &stats);
  model.zero_grad(std::max({1, shares, static_cast<int>(lists.size())}));
  iteration_totals t;
  const bool any =
      std::any_of(lists.begin(), lists.end(), [](const auto& l) { return !l.empty(); });
  if (overlap != nullptr && reduce) {
    // A rank without samples still takes part in every bucket's sum (the groups are told at once).
    overlap->begin(model.gradient_buffers());
    auto l = model.forward_backward(lists, objective, [overlap](size_t gi) { overlap->ready(gi); });
    if (!l) {
      overlap->abandon();
      return l.error();
    }
    t.loss_sum = l->sum;
  } else if (any) {
    auto l = model.forward_backward(lists, objective);
    if (!l) return l.error();
    t.loss_sum = l->sum;
  }
  std::vector<std::span<float>> grads, values;
  for (auto& p : model.parameters()) {
    grads.emplace_back(p.grad);
    values.emplace_back(p.value);
  }
  take_counters(t, stats, model);
  if (reduce) {
    if (auto st = reduce_scalars_with(t,
                                      [&](std::span<double> scalars) {
                                        return reduce(std::span<const std::span<float>>(grads),
                                                      scalars);
                                      });
        !st) {
      return st;
    }
  }
  // The objective's token weights already normalise the loss: no scaling here.
  auto norm =
      train::clip_and_update(opt, values, grads, decay, in.max_grad_norm, in.lr, in.opt_step);
  if (!norm) return norm.error();
  t.grad_norm = *norm;
  return t;
}

result<iteration_totals> device_update_iteration(
    train::trainable_model<float>& model, train::adamw& opt, std::span<const uint8_t> decay,
    const grpo_config& g, const iteration_inputs& in, int shares,
    std::span<const std::vector<train::train_batch>> lists, const group_reducer& reduce) {
  ppo_stats stats;
  const auto objective = ppo_objective(g, &stats);
  model.zero_grad(std::max({1, shares, static_cast<int>(lists.size())}));
  iteration_totals t;
  if (std::any_of(lists.begin(), lists.end(), [](const auto& l) { return !l.empty(); })) {
    auto l = model.forward_backward(lists, objective);
    if (!l) return l.error();
    t.loss_sum = l->sum;
  }
  take_counters(t, stats, model);
  if (reduce) {
    // A rank without samples sums its zeroed buffers (device_gradients zeroes what no backward
    // wrote), so every rank makes the same calls.
    auto grads = model.device_gradients();
    if (!grads) return grads.error();
    if (auto st = reduce_scalars_with(t,
                                      [&](std::span<double> scalars) {
                                        return reduce(std::span<const std::span<float>>(*grads),
                                                      scalars);
                                      });
        !st) {
      return st;
    }
  }
  // The objective's token weights already normalise the loss: no scaling here.
  auto norm = model.device_step(opt, decay, 1.0f, in.max_grad_norm, in.lr, in.opt_step);
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

status grpo_loop::update(const std::vector<std::vector<train::train_batch>>& batches,
                         rl_step_record& rec) {
  // updates_per_step optimizer steps on the same rollouts (TRL's num_iterations): the ratio to the
  // behaviour policy leaves 1 after the first, and clipping bounds how far the policy moves.
  const int64_t n = std::max<int64_t>(1, config_.updates_per_step);
  const double lr = config_.schedule.at(step_);
  iteration_totals sum;
  double norm_sum = 0.0;
  for (int64_t it = 0; it < n; ++it) {
    iteration_inputs in;
    in.step = step_;
    in.iteration = it;
    in.lr = lr;
    in.opt_step = step_ * n + it + 1;
    in.max_grad_norm = config_.max_grad_norm;
    auto t = group_ ? group_iteration(in, batches)
             : model_->device_resident()
                 ? device_iteration(in, batches)
                 : update_iteration(*model_, opt_, decay_, config_.grpo, in,
                                    std::max(1, config_.shares), batches, nullptr);
    if (!t) return t.error();
    sum.loss_sum += t->loss_sum;
    sum.tokens += t->tokens;
    sum.clipped += t->clipped;
    sum.abs_ratio_dev_nano += t->abs_ratio_dev_nano;
    sum.kl_nano += t->kl_nano;
    sum.routes_replayed += t->routes_replayed;
    sum.routes_differ += t->routes_differ;
    norm_sum += t->grad_norm;
  }
  ppo_stats stats;
  stats.tokens = sum.tokens;
  stats.clipped = sum.clipped;
  stats.abs_ratio_dev_nano = sum.abs_ratio_dev_nano;
  stats.kl_nano = sum.kl_nano;
  rec.loss = sum.loss_sum / static_cast<double>(n);
  rec.grad_norm = norm_sum / static_cast<double>(n);
  rec.lr = lr;
  rec.clip_fraction = stats.clip_fraction();
  rec.ratio_deviation = stats.mean_abs_ratio_deviation();
  note_routing(rec, sum.routes_replayed, sum.routes_differ);
  rec.kl = stats.mean_kl();
  if (group_) {
    rec.reduce_s = group_->take_reduce_seconds();
    rec.trainer_groups = group_->groups_formed();
  }
  return {};
}

result<iteration_totals> grpo_loop::device_iteration(
    const iteration_inputs& in, const std::vector<std::vector<train::train_batch>>& batches) {
  return device_update_iteration(
      *model_, opt_, decay_, config_.grpo, in, std::max(1, config_.shares),
      std::span<const std::vector<train::train_batch>>(batches), nullptr);
}

result<iteration_totals> grpo_loop::group_iteration(
    const iteration_inputs& in, const std::vector<std::vector<train::train_batch>>& batches) {
  // Rank r trains lists [r·shares, (r + 1)·shares) of the step's (pack_update made world·shares).
  const int shares = std::max(1, config_.shares);
  const int world = group_->world();
  auto lists_of = [&](int r) {
    std::vector<std::vector<train::train_batch>> out;
    for (size_t j = static_cast<size_t>(r * shares);
         j < std::min(batches.size(), static_cast<size_t>((r + 1) * shares)); ++j) {
      out.push_back(batches[j]);
    }
    return out;
  };
  std::vector<std::vector<std::vector<train::train_batch>>> per_rank;
  for (int r = 1; r < world; ++r) per_rank.push_back(lists_of(r));
  const auto own = lists_of(0);
  // A lost rank costs the iteration, not the step: the new group receives this rank's state
  // (untouched by the failed iteration: the update follows the sum) and the iteration repeats
  // with the same inputs, so the run goes on bit for bit.
  constexpr int max_attempts = 100;
  const state_source state = [this]() -> result<std::vector<std::span<float>>> {
    if (auto st = model_->pull_to_host(&opt_); !st) return st;
    return trainer_state(*model_, opt_);
  };
  const group_reducer reduce = [this](std::span<const std::span<float>> grads,
                                      std::span<double> scalars) {
    return group_->reduce(grads, scalars);
  };
  for (int attempt = 0;; ++attempt) {
    if (auto st = group_->ready(state); !st) {
      if (group_->lost() && attempt < max_attempts) continue;
      return st;
    }
    if (auto st = follow_group_device(); !st) return st;
    if (auto st = group_->start(in, per_rank); !st) {
      if (group_->lost() && attempt < max_attempts) continue;
      return st;
    }
    auto t =
        model_->device_resident()
            ? device_update_iteration(*model_, opt_, decay_, config_.grpo, in, shares, own, reduce)
            : update_iteration(*model_, opt_, decay_, config_.grpo, in, shares, own, reduce,
                               group_->overlap(*model_));
    if (t || !group_->lost() || attempt >= max_attempts) return t;
  }
}

status grpo_loop::follow_group_device() {
  const bool on_device = group_->sums_on_device();
  if (on_device == model_->device_resident()) return {};
  if (on_device) {
    // The group sums on the GPUs: the weights and moments move to the device and stay there.
    if (model_->compute_device() == nullptr) {
      return {status_code::internal, "the trainer group sums on the GPUs but rank 0 has none"};
    }
    if (auto st = model_->set_device_resident(true); !st) return st;
    model_->host_replaced();
    return {};
  }
  // The group sums host gradients: every rank runs forward and backward on its device, adds the
  // gradients into host memory and steps AdamW there (the ZeRO-Offload split).
  if (auto st = model_->pull_to_host(&opt_); !st) return st;
  return model_->set_device_resident(false);
}

status grpo_loop::set_update_group(std::shared_ptr<update_group> group) {
  if (group && config_.stream) {
    return {status_code::invalid_argument,
            "a trainer group (--trainers > 1) trains a whole step at a time: not with --mode "
            "stream"};
  }
  // Whether the ranks sum on the GPUs or in host memory is each new group's to say: the loop
  // follows it after every ready() (follow_group_device).
  group_ = std::move(group);
  return {};
}

}  // namespace weft::gpu::rl
