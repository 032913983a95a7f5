#include "gpu/rl/grpo_loop.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "gpu/train/export.hpp"
#include "gpu/train/sft_run.hpp"

namespace weft::gpu::rl {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t sample_seed(uint64_t base, int64_t group, int64_t j) {
  uint64_t z = base + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(group * 4096 + j + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

grpo_loop::grpo_loop(std::unique_ptr<train::trainable_model<float>> model, const rl_task& task,
                     const grpo_loop_config& config)
    : model_(std::move(model)),
      task_(task),
      config_(config),
      prompts_(task, config.seed, config.eval_prompts),
      opt_([&config] {
        train::adamw_config c = config.adamw;
        c.threads = std::max(1, config.shares);
        return c;
      }()),
      sched_(scheduler_config{config.prompts_per_step, config.group_size, config.max_staleness,
                              config.total_steps > 0 ? config.total_steps : -1}) {}

grpo_loop::~grpo_loop() {
  stop_rewards();
  stop_references();
}

rollout_engine_params grpo_loop::engine_params(const grpo_loop_config& config) {
  rollout_engine_params p;
  // Every step that may be generating at once, and an evaluation beside them.
  p.max_sequences = config.prompts_per_step * config.group_size * (1 + config.max_staleness) +
                    config.eval_prompts;
  // Tool results add context beyond the generated tokens.
  p.max_new_tokens =
      config.max_new_tokens +
      (config.tools.empty() ? 0
                            : static_cast<int32_t>(config.max_tool_calls * max_observation_tokens));
  p.weight_type = config.rollout_type;
  p.device = config.rollout_device;
  p.threads = config.engine_threads;
  p.max_running = config.rollout_max_running;
  p.priority = config.trajectory_priority;
  p.record_routes = config.routing_replay;
  return p;
}

result<std::unique_ptr<grpo_loop>> grpo_loop::create(
    const gguf_file& source, std::unique_ptr<train::trainable_model<float>> model,
    const rl_task& task, const grpo_loop_config& config, std::shared_ptr<rollout_backend> backend) {
  if (config.prompts_per_step < 1 || config.group_size < 2 || config.max_new_tokens < 1) {
    return status{status_code::invalid_argument,
                  "GRPO needs at least 1 prompt per step, a group of at least 2 samples and at "
                  "least 1 new token"};
  }
  if (config.updates_per_step < 1 || config.updates_per_step > 64) {
    return status{status_code::invalid_argument, "updates per step must be within 1..64"};
  }
  if (config.updates_per_step > 1 && config.grpo.correction == off_policy_correction::decoupled) {
    return status{status_code::invalid_argument,
                  "the decoupled correction takes one update per batch (its proximal policy is "
                  "the trainer's current one); use ppo-clip with several updates per step"};
  }
  if (config.stream && (config.max_staleness != 0 || config.updates_per_step != 1)) {
    return status{status_code::invalid_argument,
                  "stream mode trains each group once as it finishes: it needs one update per "
                  "step and no staleness bound (it is on-policy)"};
  }
  if (!(config.temperature > 0.0f && config.temperature <= 10.0f) ||
      !(config.top_p > 0.0f && config.top_p <= 1.0f) || config.top_k < 0) {
    return status{status_code::invalid_argument,
                  "rollout sampling: the temperature must be within (0, 10], top-p within (0, 1] "
                  "and top-k >= 0 (0: off)"};
  }
  if (config.max_staleness < 0 || config.max_staleness > 64) {
    return status{status_code::invalid_argument, "the staleness bound must be within 0..64"};
  }
  for (const auto& t : config.tools) {
    if (!valid_tool_name(t)) {
      return status{status_code::invalid_argument,
                    "'" + t + "' cannot name a tool (tools: " + tool_list + ", or your own)"};
    }
  }
  if (!config.tools.empty() && (config.max_tool_calls < 1 || config.max_tool_calls > 16)) {
    return status{status_code::invalid_argument, "tool calls per sample must be within 1..16"};
  }
  if (!is_rollout_weight_type(config.rollout_type)) {
    return status{status_code::invalid_argument,
                  std::string{"the rollout weight type must be "} + rollout_weight_types};
  }
  std::unique_ptr<grpo_loop> loop(new grpo_loop(std::move(model), task, config));
  auto tok = tokenizer::from_gguf(source);
  if (!tok) return tok.error();
  loop->tok_ = std::make_unique<tokenizer>(std::move(*tok));
  if (config.chat) {
    auto chat = chat_template::from_gguf(source);
    if (!chat) {
      return status{chat.error().code(),
                    "chat template: " + chat.error().message() + " (raw prompts need no template)"};
    }
    loop->chat_ = std::make_unique<chat_template>(std::move(*chat));
  }
  if (backend) {
    loop->backend_ = std::move(backend);
  } else {
    // One engine in this process over an in-memory image of the trainer's weights, updated in
    // place after every step.
    const tokenizer* tk = loop->tok_.get();
    auto local = local_rollout_backend::create(source, *loop->model_, engine_params(config),
                                               [tk](int32_t id) { return tk->token_to_piece(id); });
    if (!local) return local.error();
    loop->backend_ = std::move(*local);
  }
  loop->model_->set_logit_temperature(config.temperature);
  std::vector<int64_t> sizes;
  for (const auto& p : std::as_const(*loop->model_).parameters()) {
    sizes.push_back(p.size());
    loop->decay_.push_back(p.ne[1] > 1 ? 1 : 0);
  }
  loop->opt_.init(sizes);
  auto train_dev = train::open_training_device(config.train_device);
  if (!train_dev) return train_dev.error();
  if (*train_dev) {
    loop->train_dev_ = std::move(*train_dev);
    if (auto st = loop->model_->use_device(loop->train_dev_.get()); !st) return st;
    if (auto st = loop->model_->set_device_resident(true); !st) return st;
  }
  if (config.grpo.kl_coef > 0.0 && !config.external_reference) {
    auto ref = load_local_reference(source, config.temperature, loop->train_dev_.get());
    if (!ref) return ref.error();
    loop->ref_ = std::move(*ref);
  }
  return loop;
}

std::vector<int32_t> grpo_loop::encode_prompt(const rl_prompt& p, status& st) const {
  std::vector<int32_t> ids;
  if (chat_) {
    const chat_message msg{"user", p.text};
    auto text = chat_->apply(std::span(&msg, 1), generation_prompt::add);
    if (!text) {
      st = text.error();
      return ids;
    }
    ids = tok_->encode(*text, add_special::yes, parse_special::yes);
  } else {
    ids = tok_->encode(p.text, add_special::yes, parse_special::no);
  }
  if (static_cast<int64_t>(ids.size()) > 512) {
    st = status{status_code::invalid_argument, "prompt '" + p.key.substr(0, 60) + "' is " +
                                                   std::to_string(ids.size()) +
                                                   " tokens; the limit is 512"};
  }
  return ids;
}

sampling_params grpo_loop::request_params(uint64_t seed, int32_t max_tokens, bool greedy) const {
  const grpo_loop_config& c = config_;
  const auto eog = tok_->end_of_generation_ids();
  sampling_params sp;
  sp.temperature = greedy ? 0.0f : c.temperature;
  if (!greedy) {
    sp.top_p = c.top_p;
    sp.top_k = c.top_k;
    sp.tempered_logprobs = true;
  }
  sp.seed = seed;
  sp.max_tokens = max_tokens;
  sp.stop_tokens.assign(eog.begin(), eog.end());
  sp.stop_strings = tool_stop_strings(c.tools);
  return sp;
}

namespace {

/// Whether every sample has its reference log-probs (computed when its group finished).
bool all_have_reference(std::span<const rollout_sample> samples) {
  return std::all_of(samples.begin(), samples.end(), [](const rollout_sample& x) {
    return x.ref_logp.size() == x.completion.size();
  });
}

/// Appends an engine output to its sample; true when the sample is complete.
result<bool> append_output(rollout_sample& s, const request_output& o, int64_t version,
                           int64_t route_width) {
  if (o.finish == finish_reason::error) {
    return status{status_code::internal, "rollout failed: " + o.error};
  }
  if (!o.routes.empty() &&
      (route_width <= 0 || o.routes.size() % static_cast<size_t>(route_width) != 0)) {
    return status{status_code::internal,
                  "rollout " + std::to_string(o.id) + ": its routes (" +
                      std::to_string(o.routes.size()) + " values) are not whole positions of " +
                      std::to_string(route_width) + " (layers x experts used)"};
  }
  if (s.prompt_cached < 0) s.prompt_cached = o.cached_prompt_tokens;
  for (size_t i = 0; i < o.new_tokens.size(); ++i) {
    s.completion.push_back(o.new_tokens[i]);
    s.logp.push_back(o.samples[i].logprob);
    s.version.push_back(version);
  }
  s.text += o.text_delta;
  if (o.finish == finish_reason::stop_token) {
    s.completion.push_back(o.stop_sample.token);
    s.logp.push_back(o.stop_sample.logprob);
    s.version.push_back(version);
    s.stopped = true;
  }
  if (!s.tool_mask.empty()) s.tool_mask.resize(s.completion.size(), 0);  // sampled tokens
  // Routing replay: the request that finished computed every position before its last token
  // (after a tool call, the continuation recomputed the whole trajectory).
  if (!o.routes.empty()) s.routes = o.routes;
  return o.finish != finish_reason::none;
}

uint64_t prompt_key(const std::vector<int32_t>& prompt) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the token ids
  for (int32_t t : prompt) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t step_seed(uint64_t seed, int64_t step) {
  return seed ^ (0xA5A5ull + static_cast<uint64_t>(step) * 0x100000001B3ull);
}

}  // namespace

result<std::vector<rollout_sample>> grpo_loop::generate(const std::vector<rl_prompt>& prompts,
                                                        int64_t group_size, uint64_t seed_base,
                                                        bool greedy) {
  std::vector<rollout_sample> out;
  if (!config_.tools.empty() && !tools_) {
    return status{status_code::invalid_argument, "agentic rollouts need a tool backend"};
  }
  direct_.clear();
  std::vector<rollout_request> requests;
  for (size_t g = 0; g < prompts.size(); ++g) {
    status st;
    auto ids = encode_prompt(prompts[g], st);
    if (!st) return st;
    for (int64_t j = 0; j < group_size; ++j) {
      rollout_request r;
      r.id = next_request_++;
      r.prompt = ids;
      const uint64_t seed = sample_seed(seed_base, static_cast<int64_t>(g), j);
      r.params = request_params(seed, config_.max_new_tokens, greedy);
      r.group = group_size > 1 ? static_cast<int64_t>(g) : -1;
      if (!config_.tools.empty()) turns_[r.id] = turn{r.params, r.group, 0, 0, seed};
      rollout_sample s;
      s.group = static_cast<int64_t>(g);
      s.prompt = ids;
      direct_[r.id] = out.size();
      out.push_back(std::move(s));
      requests.push_back(std::move(r));
    }
  }
  if (auto st = backend_->add(std::move(requests)); !st) return st;
  direct_out_ = &out;
  size_t finished = 0;
  status st;
  while (st && finished < out.size()) st = pump(finished);
  direct_out_ = nullptr;
  direct_.clear();
  if (!st) return st;
  return out;
}

int32_t grpo_loop::priority_for(const std::vector<int32_t>& prompt, int64_t generated,
                                int64_t turns_done) const {
  if (!config_.trajectory_priority) return 0;
  const double predicted =
      trajectory_lengths_.predict(prompt_key(prompt), static_cast<int64_t>(prompt.size()));
  return trajectory_priority_of(predicted, generated, turns_done);
}

status grpo_loop::start_step(int64_t m) {
  pending_step p;
  p.cursor = prompts_.cursor();
  if (!config_.tools.empty() && !tools_) {
    return status{status_code::invalid_argument, "agentic rollouts need a tool backend"};
  }
  const uint64_t base = step_seed(config_.seed, m);
  std::vector<rollout_request> requests;
  for (int64_t g = 0; g < config_.prompts_per_step; ++g) {
    p.prompts.push_back(prompts_.next());
    status st;
    auto ids = encode_prompt(p.prompts.back(), st);
    if (!st) return st;
    for (int64_t j = 0; j < config_.group_size; ++j) {
      rollout_request r;
      r.id = next_request_++;
      r.prompt = ids;
      const uint64_t seed = sample_seed(base, g, j);
      r.params = request_params(seed, config_.max_new_tokens, false);
      r.params.priority = priority_for(ids, 0, 0);
      r.group = m * config_.prompts_per_step + g;
      if (!config_.tools.empty()) turns_[r.id] = turn{r.params, r.group, 0, 0, seed};
      rollout_sample s;
      s.group = g;
      s.prompt = ids;
      slots_[r.id] = slot{m, p.samples.size()};
      p.samples.push_back(std::move(s));
      requests.push_back(std::move(r));
    }
  }
  if (auto st = backend_->add(std::move(requests)); !st) return st;
  p.group_finished.assign(static_cast<size_t>(config_.prompts_per_step), 0);
  p.group_rewarded.assign(static_cast<size_t>(config_.prompts_per_step), 0);
  p.group_ref_out.assign(static_cast<size_t>(config_.prompts_per_step), 0);
  pending_.emplace(m, std::move(p));
  return {};
}

status grpo_loop::pump(size_t& direct_finished) {
  if (tools_ && config_.batch_turns) {
    if (auto st = release_held(); !st) return st;
  }
  if (tools_ && tools_->pending() > 0) {
    // Tool results that are in; when nothing generates, wait for one.
    for (const auto& r : tools_->ready(!backend_->has_work())) {
      if (auto st = tool_returned(r); !st) return st;
    }
    if (config_.batch_turns) {
      if (auto st = release_held(); !st) return st;
    }
    if (!backend_->has_work()) return {};
  }
  auto outputs = backend_->poll();
  if (!outputs) return outputs.error();
  for (auto& [o, version] : *outputs) {
    if (auto d = direct_.find(o.id); d != direct_.end()) {
      rollout_sample& s = (*direct_out_)[d->second];
      if (!turns_.empty()) count_cached(o.id, s, o);
      auto done = append_output(s, o, version, route_width());
      if (!done) return done.error();
      if (*done) {
        auto calls = call_tool(o.id, s, o);
        if (!calls) return calls.error();
        if (!*calls) {
          direct_.erase(d);
          ++direct_finished;
        }
      }
      continue;
    }
    auto it = slots_.find(o.id);
    if (it == slots_.end()) {
      return status{status_code::internal, "output for unknown rollout " + std::to_string(o.id)};
    }
    const slot where = it->second;
    if (o.finish == finish_reason::aborted) {  // restore() drops the rollouts in flight
      slots_.erase(it);
      turns_.erase(o.id);
      continue;
    }
    rollout_sample& s = pending_.at(where.step).samples[where.index];
    if (!turns_.empty()) count_cached(o.id, s, o);
    auto done = append_output(s, o, version, route_width());
    if (!done) return done.error();
    if (*done) {
      auto calls = call_tool(o.id, s, o);
      if (!calls) return calls.error();
      if (*calls) continue;  // the sample waits for its tool
      slots_.erase(it);
      if (auto st = sample_finished(where.step, where.index); !st) return st;
    }
  }
  return {};
}

status grpo_loop::sample_finished(int64_t step, size_t index) {
  pending_step& p = pending_.at(step);
  rollout_sample& s = p.samples[index];
  const auto g = static_cast<size_t>(s.group);
  const auto j = static_cast<int64_t>(index) - s.group * config_.group_size;
  const auto [oldest, newest] = s.versions(version_);
  if (auto st = sched_.finish(sample_key{step, s.group, j}, oldest, newest); !st) return st;
  if (config_.trajectory_priority) {
    trajectory_lengths_.observe(prompt_key(s.prompt), static_cast<int64_t>(s.prompt.size()),
                                s.generated());
  }
  const bool group_done = ++p.group_finished[g] == config_.group_size;
  if (rewards_ && reward_unit_ == reward_unit::sample) {
    // Scored as it finishes, with whatever else finished while the reward thread was busy.
    unscored_.push_back(sample_ref{step, index});
    if (auto st = submit_unscored(); !st) return st;
  } else if (group_done) {
    std::vector<sample_ref> group;
    for (int64_t k = 0; k < config_.group_size; ++k) {
      group.push_back(
          sample_ref{step, g * static_cast<size_t>(config_.group_size) + static_cast<size_t>(k)});
    }
    if (auto st = score_samples(std::move(group)); !st) return st;
  }
  // Inter-stage fusion (RLHFuse): the reference's forward for this group runs now, while the other
  // groups still generate (and, with async rewards, while the group is scored), not in the
  // training stage.
  if (group_done && ref_ && config_.fuse_reference) return reference_group_finished(step, g);
  return {};
}

status grpo_loop::push_weights() {
  if (auto st = model_->pull_to_host(nullptr); !st) return st;
  std::vector<named_weights> tensors;
  for (const auto& p : std::as_const(*model_).parameters()) {
    tensors.push_back(named_weights{p.name, p.value});
  }
  // Cached prefixes were computed with the old weights: the backend never matches them again.
  if (auto st = backend_->publish(version_ + 1, tensors); !st) return st;
  ++version_;
  return {};
}

result<rl_step_record> grpo_loop::step() {
  if (config_.grpo.kl_coef > 0.0 && !ref_) {
    // An external reference that was never set: refuse rather than train without the KL term.
    return status{status_code::invalid_argument,
                  "kl_coef > 0 with an external reference, but set_reference() was not called"};
  }
  reward_wait_s_ = 0.0;
  reference_wait_s_ = 0.0;
  if (config_.stream) return stream_step();
  rl_step_record rec;
  rec.step = step_ + 1;
  const auto t0 = std::chrono::steady_clock::now();
  size_t none = 0;
  for (;;) {
    for (int64_t m : sched_.admit()) {
      if (auto st = start_step(m); !st) return st;
    }
    if (auto st = collect_rewards(false); !st) return st;
    if (auto st = collect_references(false); !st) return st;
    if (sched_.ready()) {
      // Every sample of the step has finished: wait for the rewards still out, without another
      // engine step, so that when the step trains (and the weights change under the rollouts
      // of later steps) depends on the rollouts alone, never on how long a reward took — the
      // run is the same bit for bit as with blocking rewards, in every mode.
      while (!step_scored(step_)) {
        if (!rewards_pending()) {
          return status{status_code::internal,
                        "step " + std::to_string(step_ + 1) + ": rewards missing"};
        }
        if (auto st = collect_rewards(true); !st) return st;
      }
      // And so for the reference's log-probs of its last groups (async reference).
      while (!groups_referenced(pending_.at(step_), 0, config_.prompts_per_step)) {
        if (!references_ || (references_->pending() == 0 && unreferenced_.empty())) {
          return status{status_code::internal,
                        "step " + std::to_string(step_ + 1) + ": reference log-probs missing"};
        }
        if (auto st = collect_references(true); !st) return st;
      }
      break;
    }
    if (!rollouts_busy()) {
      return status{status_code::internal, "step " + std::to_string(step_ + 1) +
                                               ": the engine is idle but the rollouts of the "
                                               "step are not complete"};
    }
    if (auto st = pump(none); !st) return st;
  }
  rec.rollout_s = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  auto trained = sched_.train();
  if (!trained) return trained.error();
  pending_step p = std::move(pending_.at(step_));
  pending_.erase(step_);
  rec.in_flight = sched_.in_flight();
  for (size_t i = 0; i < trained->staleness.size(); ++i) {
    rec.staleness_mean += static_cast<double>(trained->staleness[i]);
    rec.staleness_max = std::max(rec.staleness_max, trained->staleness[i]);
    const auto [oldest, newest] = p.samples[i].versions(version_);
    if (oldest != newest) ++rec.mixed_version_samples;
  }
  rec.staleness_mean /= static_cast<double>(std::max<size_t>(1, trained->staleness.size()));
  const scored_step scored = score_step(p.samples, rec);
  auto batches = pack_update(p.samples, scored);
  if (ref_ && !all_have_reference(p.samples)) {
    const auto t2 = std::chrono::steady_clock::now();
    if (auto st = add_reference_logprobs(batches); !st) return st;
    p.ref_s += seconds_since(t2);
  }
  rec.ref_s = p.ref_s;
  rec.ref_wait_s = reference_wait_s_;
  rec.reward_s = p.reward_s;
  rec.reward_wait_s = reward_wait_s_;
  if (auto st = update(batches, rec); !st) return st;
  rec.train_s = seconds_since(t1);

  return finish_step(rec);
}

grpo_loop::scored_step grpo_loop::score_step(const std::vector<rollout_sample>& samples,
                                             rl_step_record& rec) const {
  std::vector<double> rewards;
  std::vector<int64_t> lengths;
  int64_t continued = 0, cached = 0, prompt_tokens = 0, prompt_cached = 0;
  for (const auto& s : samples) {
    prompt_tokens += static_cast<int64_t>(s.prompt.size());
    prompt_cached += std::max<int64_t>(0, s.prompt_cached);
    rewards.push_back(s.reward);
    lengths.push_back(s.generated());
    rec.tool_calls += s.tool_calls;
    rec.tool_tokens += static_cast<int64_t>(s.completion.size()) - s.generated();
    continued += s.continued_tokens;
    cached += s.cached_tokens;
    rec.completion_tokens += lengths.back();
    rec.completion_len_max = std::max(rec.completion_len_max, lengths.back());
    rec.stopped_fraction += s.stopped ? 1.0 : 0.0;
  }
  const auto n = static_cast<double>(samples.size());
  rec.samples = static_cast<int64_t>(samples.size());
  rec.reward_mean = std::accumulate(rewards.begin(), rewards.end(), 0.0) / n;
  double var = 0.0;
  for (double r : rewards) var += (r - rec.reward_mean) * (r - rec.reward_mean);
  rec.reward_std = std::sqrt(var / n);
  rec.completion_len = static_cast<double>(rec.completion_tokens) / n;
  rec.stopped_fraction /= n;
  rec.prompt_cache_hit =
      prompt_tokens > 0 ? static_cast<double>(prompt_cached) / static_cast<double>(prompt_tokens)
                        : 0.0;
  rec.tool_kv_reuse =
      continued > 0 ? static_cast<double>(cached) / static_cast<double>(continued) : 0.0;
  scored_step out;
  out.adv = group_advantages(rewards, config_.group_size, config_.grpo.scale_rewards);
  const auto flat = zero_variance_groups(rewards, config_.group_size);
  out.keep.assign(samples.size(), 1);
  for (size_t s = 0; s < samples.size(); ++s) {
    const bool flat_group = flat[static_cast<size_t>(samples[s].group)] != 0;
    if (flat_group && config_.grpo.drop_zero_variance) out.keep[s] = 0;
  }
  for (uint8_t f : flat) rec.zero_variance_groups += f;
  out.weights = sample_token_weights(
      lengths, out.keep, config_.grpo.aggregation,
      config_.grpo.max_new_tokens > 0 ? config_.grpo.max_new_tokens : config_.max_new_tokens);
  return out;
}

result<rl_step_record> grpo_loop::finish_step(rl_step_record& rec) {
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = push_weights(); !st) return st;
  rec.sync_s = seconds_since(t0);
  rec.agents = backend_->stats();
  ++step_;
  rec.version = version_;
  history_.push_back(rec);
  return rec;
}

result<rl_step_record> grpo_loop::stream_step() {
  rl_step_record rec;
  rec.step = step_ + 1;
  const auto t0 = std::chrono::steady_clock::now();
  model_->zero_grad(std::max(1, config_.shares));
  ppo_stats stats;
  const auto objective = ppo_objective(config_.grpo, &stats);
  double loss = 0.0, train_s = 0.0;
  int64_t kept = 0, kept_tokens = 0, next = 0;
  size_t none = 0;
  for (;;) {
    for (int64_t m : sched_.admit()) {
      if (auto st = start_step(m); !st) return st;
    }
    // Train the scored groups in chunks of `shares` consecutive groups (one per parallel share),
    // in group order: which groups sum together never depends on timing. The rest of the step
    // generates elsewhere meanwhile.
    if (auto st = collect_rewards(false); !st) return st;
    if (auto st = collect_references(false); !st) return st;
    auto it = pending_.find(step_);
    const int64_t chunk = std::max(1, config_.shares);
    while (it != pending_.end() && next < config_.prompts_per_step) {
      const int64_t end = std::min(next + chunk, config_.prompts_per_step);
      if (!groups_scored(it->second, next, end) || !groups_referenced(it->second, next, end)) break;
      const auto tg = std::chrono::steady_clock::now();
      if (auto st = train_groups(it->second.samples, next, end, objective, loss, kept, kept_tokens);
          !st) {
        return st;
      }
      train_s += seconds_since(tg);
      next = end;
    }
    if (sched_.ready() && next == config_.prompts_per_step) break;
    if (!rollouts_busy()) {
      if (rewards_pending()) {
        if (auto st = collect_rewards(true); !st) return st;
        continue;
      }
      if (references_ && references_->pending() > 0) {
        if (auto st = collect_references(true); !st) return st;
        continue;
      }
      return status{status_code::internal, "step " + std::to_string(step_ + 1) +
                                               ": the rollouts are idle but the step's groups "
                                               "are not all trained"};
    }
    if (auto st = pump(none); !st) return st;
  }
  rec.rollout_s = seconds_since(t0) - train_s;
  const auto t1 = std::chrono::steady_clock::now();
  auto trained = sched_.train();
  if (!trained) return trained.error();
  pending_step p = std::move(pending_.at(step_));
  pending_.erase(step_);
  (void)score_step(p.samples, rec);  // the step's reward and length statistics
  rec.reward_s = p.reward_s;
  rec.reward_wait_s = reward_wait_s_;
  rec.ref_s = p.ref_s;
  rec.ref_wait_s = reference_wait_s_;
  // The groups trained with unnormalised weights: normalise as sample_token_weights would.
  double scale = 0.0;
  if (config_.grpo.aggregation == loss_aggregation::token) {
    scale = kept_tokens > 0 ? 1.0 / static_cast<double>(kept_tokens) : 0.0;
  } else {
    scale = kept > 0 ? 1.0 / static_cast<double>(kept) : 0.0;
  }
  rec.loss = loss * scale;
  if (auto st = apply_update(scale, rec); !st) return st;
  rec.clip_fraction = stats.clip_fraction();
  rec.ratio_deviation = stats.mean_abs_ratio_deviation();
  const auto [replayed, differ] = model_->take_routing_stats();
  note_routing(rec, replayed, differ);
  rec.kl = stats.mean_kl();
  rec.train_s = train_s + seconds_since(t1);
  return finish_step(rec);
}

status grpo_loop::train_groups(const std::vector<rollout_sample>& samples, int64_t g0, int64_t g1,
                               const train::token_objective<float>& obj, double& loss,
                               int64_t& kept, int64_t& kept_tokens) {
  const auto n = static_cast<size_t>(config_.group_size);
  std::vector<rollout_sample> chunk(
      samples.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(g0) * n),
      samples.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(g1) * n));
  std::vector<double> rewards;
  for (const auto& s : chunk) rewards.push_back(s.reward);
  scored_step sc;
  sc.adv = group_advantages(rewards, config_.group_size, config_.grpo.scale_rewards);
  const auto flat = zero_variance_groups(rewards, config_.group_size);
  sc.keep.assign(chunk.size(), 1);
  sc.weights.assign(chunk.size(), 0.0);
  const int64_t max_new =
      config_.grpo.max_new_tokens > 0 ? config_.grpo.max_new_tokens : config_.max_new_tokens;
  for (size_t s = 0; s < chunk.size(); ++s) {
    if (flat[s / n] != 0 && config_.grpo.drop_zero_variance) {
      sc.keep[s] = 0;
      continue;
    }
    const int64_t len = chunk[s].generated();
    ++kept;
    kept_tokens += len;
    switch (config_.grpo.aggregation) {
      case loss_aggregation::token:
        sc.weights[s] = 1.0;
        break;
      case loss_aggregation::sequence:
        sc.weights[s] = len > 0 ? 1.0 / static_cast<double>(len) : 0.0;
        break;
      case loss_aggregation::constant:
        sc.weights[s] = 1.0 / static_cast<double>(std::max<int64_t>(1, max_new));
        break;
    }
  }
  // One unit per group, spread over the shares as in a whole step.
  auto batches = pack_update(chunk, sc);
  if (batches.empty()) return {};
  if (ref_ && !all_have_reference(chunk)) {
    if (auto st = add_reference_logprobs(batches); !st) return st;
  }
  auto l = model_->forward_backward(std::span<const std::vector<train::train_batch>>(batches), obj);
  if (!l) return l.error();
  loss += l->sum;
  return {};
}

status grpo_loop::apply_update(double scale, rl_step_record& rec) {
  const double lr = config_.schedule.at(step_);
  rec.lr = lr;
  if (model_->device_resident()) {
    // The groups' gradients summed on the device: the update runs there (the same order and
    // formulas as the host's below).
    auto norm = model_->device_step(opt_, decay_, static_cast<float>(scale), config_.max_grad_norm,
                                    lr, step_ + 1);
    if (!norm) return norm.error();
    rec.grad_norm = *norm;
    return {};
  }
  std::vector<std::span<const float>> grads;
  std::vector<std::span<float>> values;
  for (auto& p : model_->parameters()) {
    grads.emplace_back(p.grad);
    values.emplace_back(p.value);
  }
  // The scale is applied as the update reads the gradients (scale_clip_and_update).
  auto norm = train::scale_clip_and_update(opt_, values, grads, decay_, static_cast<float>(scale),
                                           config_.max_grad_norm, lr, step_ + 1);
  if (!norm) return norm.error();
  rec.grad_norm = *norm;
  return {};
}

result<rl_eval_record> grpo_loop::evaluate() {
  rl_eval_record rec;
  rec.step = step_;
  const auto t0 = std::chrono::steady_clock::now();
  const auto& set = prompts_.eval_set();
  if (set.empty()) return rec;
  auto samples = generate(set, 1, config_.seed, true);
  if (!samples) return samples.error();
  auto scored = score_now(set, *samples);
  if (!scored) return scored.error();
  double solved = 0.0, len = 0.0;
  for (size_t i = 0; i < samples->size(); ++i) {
    solved += (*scored)[i];
    len += static_cast<double>((*samples)[i].generated());
    rec.tool_calls += (*samples)[i].tool_calls;
  }
  rec.prompts = static_cast<int64_t>(samples->size());
  rec.pass_at_1 = solved / static_cast<double>(rec.prompts);
  rec.completion_len = len / static_cast<double>(rec.prompts);
  rec.seconds = seconds_since(t0);
  return rec;
}

}  // namespace weft::gpu::rl
