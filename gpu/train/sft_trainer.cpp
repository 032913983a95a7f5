#include "gpu/train/sft_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

namespace weft::gpu::train {

sft_trainer::sft_trainer(trainable_model<float>& model, const sft_dataset& data,
                         const sft_config& config, gradient_reducer reduce, int rank, int world)
    : model_(model),
      config_(config),
      sampler_(data, config.seed, config.step_tokens, config.micro_batch_tokens),
      reduce_(std::move(reduce)),
      rank_(rank),
      world_(world),
      opt_([&config] {
        adamw_config c = config.adamw;
        c.threads = std::max({1, config.parallel, config.adamw.threads});
        return c;
      }()) {
  if (model_.compute_device() != nullptr && !config.offload_optimizer) {
    // Cannot fail with a device attached.
    (void)model_.set_device_resident(true);
  }
  std::vector<int64_t> sizes;
  for (const auto& p : std::as_const(model_).parameters()) {
    sizes.push_back(p.size());
    // Weight decay on matrices only, not on norm weights (the usual convention).
    decay_.push_back(p.ne[1] > 1 ? 1 : 0);
  }
  opt_.init(sizes);
}

result<step_record> sft_trainer::step() {
  int64_t tokens = 0;
  const int p = std::max(1, config_.parallel);
  const auto shares = sampler_.next_step_shares(rank_ * p, p, world_ * p, &tokens);
  model_.zero_grad(std::max(p, opt_.config().threads));
  double loss_sum = 0.0;
  int64_t loss_tokens = 0;
  const bool overlapped = overlap_ != nullptr && !model_.device_resident();
  if (overlapped) {
    const auto grads = model_.gradient_buffers();
    overlap_->begin(grads);
    auto l = model_.forward_backward(std::span<const std::vector<train_batch>>(shares),
                                     [this](size_t g) { overlap_->ready(g); });
    if (!l) {
      overlap_->abandon();
      return l.error();
    }
    loss_sum = l->sum;
    loss_tokens = l->tokens;
    if (auto st = overlap_->finish(loss_sum, loss_tokens); !st) return st;
  } else if (p == 1) {
    for (const auto& b : shares.front()) {
      auto l = model_.forward_backward(b);
      if (!l) return l.error();
      loss_sum += l->sum;
      loss_tokens += l->tokens;
    }
  } else {
    auto l = model_.forward_backward(std::span<const std::vector<train_batch>>(shares));
    if (!l) return l.error();
    loss_sum = l->sum;
    loss_tokens = l->tokens;
  }
  const double lr = config_.schedule.at(step_);
  result<double> norm = 0.0;
  if (model_.device_resident()) {
    if (device_reduce_) {
      auto grads = model_.device_gradients();
      if (!grads) return grads.error();
      if (auto st = device_reduce_(*grads, loss_sum, loss_tokens); !st) return st;
    } else if (reduce_) {
      if (auto st = model_.pull_gradients(); !st) return st;
      if (auto st = reduce_(model_.gradients(), loss_sum, loss_tokens); !st) return st;
      if (auto st = model_.push_gradients(); !st) return st;
    }
    // Gradient of the mean token loss over the whole step (all ranks').
    const float mean = loss_tokens > 0 ? 1.0f / static_cast<float>(loss_tokens) : 0.0f;
    norm = model_.device_step(opt_, decay_, mean, config_.max_grad_norm, lr, step_ + 1);
  } else {
    norm = host_update(loss_sum, loss_tokens, lr, overlapped);
  }
  if (!norm) return norm.error();
  ++step_;
  step_record r;
  r.step = step_;
  r.loss = loss_tokens > 0 ? loss_sum / static_cast<double>(loss_tokens) : 0.0;
  r.lr = lr;
  r.grad_norm = *norm;
  r.tokens = tokens;
  history_.push_back(r);
  return r;
}

result<double> sft_trainer::host_update(double& loss_sum, int64_t& loss_tokens, double lr,
                                        bool reduced) {
  auto& params = model_.parameters();
  std::vector<std::span<float>> grads, values;
  for (auto& p : params) {
    grads.emplace_back(p.grad);
    values.emplace_back(p.value);
  }
  if (reduce_ && !reduced) {
    if (auto st = reduce_(grads, loss_sum, loss_tokens); !st) return st;
  }
  // Gradient of the mean token loss over the whole step, applied as the update reads the sums.
  const float inv = loss_tokens > 0 ? 1.0f / static_cast<float>(loss_tokens) : 0.0f;
  const std::vector<std::span<const float>> sums(grads.begin(), grads.end());
  return scale_clip_and_update(opt_, values, sums, decay_, inv, config_.max_grad_norm, lr,
                               step_ + 1);
}

result<checkpoint_state> sft_trainer::snapshot() {
  checkpoint_state s;
  if (auto st = snapshot_into(s); !st) return st;
  return s;
}

result<eval_record> evaluate_loss(trainable_model<float>& model, const sft_dataset& data,
                                  int64_t batch_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  eval_record rec;
  double nll = 0.0;
  auto run = [&](const train_batch& b) -> status {
    if (b.tokens.empty()) return {};
    auto lp = model.target_logprobs(b);
    if (!lp) return lp.error();
    for (float x : *lp) nll -= static_cast<double>(x);
    rec.tokens += static_cast<int64_t>(lp->size());
    return {};
  };
  train_batch b;
  for (const sft_example& ex : data.examples) {
    const auto n = static_cast<int64_t>(ex.tokens.size());
    if (!b.tokens.empty() && static_cast<int64_t>(b.tokens.size()) + n > batch_tokens) {
      if (auto st = run(b); !st) return st;
      b = train_batch{};
    }
    b.add(ex.tokens, ex.in_loss);
    ++rec.examples;
  }
  if (auto st = run(b); !st) return st;
  if (rec.tokens == 0) return status{status_code::invalid_argument, "no token in the loss"};
  rec.nll_sum = nll;
  rec.loss = nll / static_cast<double>(rec.tokens);
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rec;
}

status sft_trainer::sync_host() {
  return model_.pull_to_host(&opt_);
}

status sft_trainer::checkpoint_meta(checkpoint_state& s) {
  if (auto st = sync_host(); !st) return st;
  s.step = step_;
  s.cursor = sampler_.cursor();
  s.seed = config_.seed;
  s.schedule = config_.schedule;
  s.history = history_;
  return {};
}

status sft_trainer::snapshot_into(checkpoint_state& s) {
  if (auto st = checkpoint_meta(s); !st) return st;
  snapshot_parameters(std::as_const(model_).parameters(), opt_, s);
  return {};
}

result<checkpoint_view> sft_trainer::live_checkpoint(checkpoint_state& meta) {
  if (auto st = checkpoint_meta(meta); !st) return st;
  return borrow_parameters(meta, std::as_const(model_).parameters(), opt_);
}

status sft_trainer::restore(const checkpoint_state& s) {
  if (s.seed != config_.seed) {
    return {status_code::invalid_argument,
            "checkpoint was made with seed " + std::to_string(s.seed) + ", this run has " +
                std::to_string(config_.seed) + " (the data order would differ)"};
  }
  if (auto st = restore_parameters(s, model_.parameters(), opt_); !st) return st;
  model_.host_replaced();
  sampler_.set_cursor(s.cursor);
  step_ = s.step;
  history_ = s.history;
  return {};
}

}  // namespace weft::gpu::train
