// Agentic rollouts in the GRPO loop (docs/rl.md, "Agentic rollouts"): a turn that ends with a
// tool call waits for the tool while the other samples generate; the tool's result is appended
// to the sample (context, not in the loss) and the sample continues as a new request of the
// same group, so on the same agent, whose prefix cache still holds the turn's KV.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "gpu/rl/grpo_loop.hpp"

namespace weft::gpu::rl {

namespace {

/// The seed of a sample's turn `turn` (turn 0 keeps the sample's own seed).
uint64_t turn_seed(uint64_t first, int64_t turn) {
  if (turn == 0) return first;
  return task_mix(first, 0x70CA11, static_cast<uint64_t>(turn));
}

}  // namespace

int64_t rollout_sample::generated() const {
  const auto tool = std::count(tool_mask.begin(), tool_mask.end(), uint8_t{1});
  return static_cast<int64_t>(completion.size()) - static_cast<int64_t>(tool);
}

std::pair<int64_t, int64_t> rollout_sample::versions(int64_t now) const {
  int64_t lo = -1, hi = -1;
  for (int64_t v : version) {
    if (v < 0) continue;  // a tool's result
    lo = lo < 0 ? v : std::min(lo, v);
    hi = std::max(hi, v);
  }
  return lo < 0 ? std::pair{now, now} : std::pair{lo, hi};
}

rollout_sample* grpo_loop::sample_of(request_id id) {
  if (auto d = direct_.find(id); d != direct_.end() && direct_out_ != nullptr) {
    return &(*direct_out_)[d->second];
  }
  if (auto it = slots_.find(id); it != slots_.end()) {
    return &pending_.at(it->second.step).samples[it->second.index];
  }
  return nullptr;
}

bool grpo_loop::rollouts_busy() const {
  return backend_->has_work() || (tools_ && tools_->pending() > 0) || !held_calls_.empty() ||
         !held_turns_.empty();
}

status grpo_loop::release_held() {
  if (!held_calls_.empty() && !backend_->has_work()) {
    for (auto& [id, c] : held_calls_) {
      if (auto st = tools_->call(id, std::move(c)); !st) return st;
    }
    held_calls_.clear();
  }
  if (!held_turns_.empty() && held_calls_.empty() && tools_->pending() == 0) {
    std::vector<rollout_request> all;
    all.swap(held_turns_);
    return backend_->add(std::move(all));
  }
  return {};
}

void grpo_loop::count_cached(request_id id, rollout_sample& s, const request_output& o) {
  auto t = turns_.find(id);
  if (t == turns_.end() || t->second.calls == 0 || t->second.cache_counted) return;
  s.cached_tokens += o.cached_prompt_tokens;
  spdlog::debug("rollout {}: continuation {} found {} of its context's tokens cached", id,
                t->second.calls, o.cached_prompt_tokens);
  t->second.cache_counted = true;
}

result<bool> grpo_loop::call_tool(request_id id, rollout_sample& s, const request_output& o) {
  auto t = turns_.find(id);
  if (t == turns_.end()) return false;
  if (o.finish != finish_reason::stop_string) {
    spdlog::debug("rollout {}: ends after {} tool call(s): {:?}", id, t->second.calls, s.text);
    turns_.erase(t);
    return false;
  }
  tool_call c;
  const std::string_view text =
      std::string_view(s.text).substr(std::min(t->second.text_from, s.text.size()));
  // A closing tag without its opening one, the call budget spent, or no tokens left to use the
  // result: the sample ends here.
  if (!parse_tool_call(text, config_.tools, c) || t->second.calls >= config_.max_tool_calls ||
      s.generated() >= config_.max_new_tokens) {
    spdlog::debug("rollout {}: ends after {} tool call(s): {:?}", id, t->second.calls, s.text);
    turns_.erase(t);
    return false;
  }
  spdlog::debug("rollout {}: calls {}({:?})", id, c.tool, c.args);
  s.text += "</" + c.tool + ">";
  ++s.tool_calls;
  waiting_.insert(id);
  if (config_.batch_turns) {
    held_calls_.emplace_back(id, std::move(c));
    return true;
  }
  if (auto st = tools_->call(id, std::move(c)); !st) return st;
  return true;
}

status grpo_loop::tool_returned(const tool_result& r) {
  if (waiting_.erase(r.id) == 0) return {};  // dropped by restore()
  auto t = turns_.find(r.id);
  rollout_sample* s = sample_of(r.id);
  if (t == turns_.end() || s == nullptr) {
    return status{status_code::internal, "tool result for unknown rollout " + std::to_string(r.id)};
  }
  turn next = t->second;
  turns_.erase(t);
  // The result, cut to a bounded number of tokens, as context for the next turn.
  const std::string obs = tool_observation(std::string_view(r.text).substr(0, 120));
  auto ids = tok_->encode(obs, add_special::no, parse_special::no);
  if (static_cast<int64_t>(ids.size()) > max_observation_tokens) {
    ids.resize(static_cast<size_t>(max_observation_tokens));
  }
  s->tool_mask.resize(s->completion.size(), 0);
  for (int32_t tok : ids) {
    s->completion.push_back(tok);
    s->logp.push_back(0.0f);
    s->version.push_back(-1);
    s->tool_mask.push_back(1);
  }
  s->text += obs;
  // The continuation replays every token after the problem's prompt (decode numerics, from the
  // prefix cache where it still holds them): its KV and so its log-probs do not depend on what
  // the cache kept, and runs repeat bit for bit.
  rollout_request req;
  req.id = next_request_++;
  req.prompt = s->prompt;
  req.prompt.insert(req.prompt.end(), s->completion.begin(), s->completion.end());
  req.n_replay = static_cast<int64_t>(s->completion.size());
  ++next.calls;
  next.text_from = s->text.size();
  next.cache_counted = false;
  req.params = next.params;
  req.params.seed = turn_seed(next.first_seed, next.calls);
  req.params.max_tokens = static_cast<int32_t>(config_.max_new_tokens - s->generated());
  req.params.priority = priority_for(s->prompt, s->generated(), next.calls);
  req.group = next.group;
  s->continued_tokens += static_cast<int64_t>(req.prompt.size());
  // The sample now lives under its continuation's id.
  if (auto d = direct_.find(r.id); d != direct_.end()) {
    direct_[req.id] = d->second;
    direct_.erase(d);
  } else {
    auto it = slots_.find(r.id);
    slots_[req.id] = it->second;
    slots_.erase(it);
  }
  turns_[req.id] = next;
  if (config_.batch_turns) {
    held_turns_.push_back(std::move(req));
    return {};
  }
  std::vector<rollout_request> one;
  one.push_back(std::move(req));
  return backend_->add(std::move(one));
}

}  // namespace weft::gpu::rl
