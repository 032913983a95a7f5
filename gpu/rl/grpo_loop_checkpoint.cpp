// grpo_loop's checkpoints: what a step boundary saves (parameters, AdamW's moments, the prompt
// cursor, the history) and how a run resumes from it, dropping whatever was generating.
#include <string>
#include <utility>

#include "gpu/rl/grpo_loop.hpp"
#include "gpu/train/checkpoint.hpp"

namespace weft::gpu::rl {

status grpo_loop::snapshot_into(train::checkpoint_state& s) {
  if (auto st = checkpoint_meta(s); !st) return st;
  train::snapshot_parameters(std::as_const(*model_).parameters(), opt_, s);
  return {};
}

result<train::checkpoint_view> grpo_loop::live_checkpoint(train::checkpoint_state& meta) {
  if (auto st = checkpoint_meta(meta); !st) return st;
  return train::borrow_parameters(meta, std::as_const(*model_).parameters(), opt_);
}

status grpo_loop::checkpoint_meta(train::checkpoint_state& s) {
  if (auto st = model_->pull_to_host(&opt_); !st) return st;
  s.step = step_;
  // Steps already generating start again from their prompts after a resume.
  auto next = pending_.find(step_);
  s.cursor =
      train::data_cursor{0, next != pending_.end() ? next->second.cursor : prompts_.cursor()};
  s.seed = config_.seed;
  s.schedule = config_.schedule;
  s.history.clear();
  for (const auto& r : history_) {
    s.history.push_back(train::step_record{r.step, r.loss, r.lr, r.grad_norm, r.completion_tokens});
  }
  return {};
}

status grpo_loop::restore(const train::checkpoint_state& s) {
  if (s.seed != config_.seed) {
    return {status_code::invalid_argument,
            "checkpoint was made with seed " + std::to_string(s.seed) + ", this run has " +
                std::to_string(config_.seed) + " (prompts and samples would differ)"};
  }
  if (auto st = train::restore_parameters(s, model_->parameters(), opt_); !st) return st;
  model_->host_replaced();
  for (const auto& [id, where] : slots_) {
    if (waiting_.count(id) != 0) continue;  // waiting for a tool: nothing generates
    if (auto st = backend_->abort(id); !st) return st;
  }
  turns_.clear();  // tool results still to come are dropped
  waiting_.clear();
  held_calls_.clear();
  held_turns_.clear();
  size_t none = 0;
  while (backend_->has_work()) {
    if (auto st = pump(none); !st) return st;
  }
  // Rewards still being computed belong to the rollouts dropped above.
  while (rewards_ && rewards_->pending() > 0) (void)rewards_->ready(true);
  scoring_.clear();
  unscored_.clear();
  while (references_ && references_->pending() > 0) (void)references_->ready(true);
  referencing_.clear();
  unreferenced_.clear();
  slots_.clear();
  pending_.clear();
  prompts_.set_cursor(s.cursor.index);
  step_ = s.step;
  sched_ = rollout_scheduler(sched_.config(), step_);
  history_.clear();
  for (const auto& r : s.history) {
    rl_step_record x;
    x.step = r.step;
    x.version = r.step;
    x.loss = r.loss;
    x.lr = r.lr;
    x.grad_norm = r.grad_norm;
    x.completion_tokens = r.tokens;
    history_.push_back(x);
  }
  version_ = step_ - 1;  // one version per step, as in an uninterrupted run
  return push_weights();
}

}  // namespace weft::gpu::rl
