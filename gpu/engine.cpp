#include "gpu/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <unordered_set>

namespace weft::gpu {

const char* finish_reason_name(finish_reason r) {
  switch (r) {
    case finish_reason::none:
      return "none";
    case finish_reason::stop_token:
      return "stop";
    case finish_reason::stop_string:
      return "stop";
    case finish_reason::length:
      return "length";
    case finish_reason::aborted:
      return "abort";
    case finish_reason::error:
      return "error";
  }
  return "unknown";
}

result<std::unique_ptr<engine>> engine::create(model& m, const engine_config& config) {
  if (config.max_batch_tokens < 2 || config.max_running < 1 || config.block_size < 1 ||
      config.kv_blocks < 1) {
    return status{status_code::invalid_argument,
                  "engine: max_batch_tokens >= 2, max_running, block_size, kv_blocks >= 1"};
  }
  if (config.record_routes) {
    if (m.hparams().n_experts == 0 || !m.load_config().record_expert_ids ||
        m.hparams().n_experts > 256) {
      return status{status_code::invalid_argument,
                    "engine: recording routes needs a mixture-of-experts model (at most 256 "
                    "experts) loaded with record_expert_ids"};
    }
  }
  kv_cache_config kc;
  kc.layout = m.kv_layout_for(config.block_size);
  kc.n_blocks = config.kv_blocks;
  kc.leading_token_matches = config.prefix_partial;
  // Routing replay: each token's experts live beside its K/V, so a prefix-cache hit brings them.
  if (config.record_routes)
    kc.slot_payload_bytes = m.hparams().n_layers * m.hparams().n_experts_used;
  auto kv = kv_cache::create(m.dev(), kc);
  if (!kv) return kv.error();
  return std::unique_ptr<engine>(new engine(m, std::move(kv.value()), config));
}

engine::engine(model& m, std::unique_ptr<kv_cache> kv, const engine_config& config)
    : model_(m), kv_(std::move(kv)), config_(config) {
  if (!config_.policy) config_.policy = std::make_shared<fcfs_policy>();
  // The activation buffers of the largest pass this engine runs, allocated (and zeroed) now
  // instead of in the first long prompt's pass. Best effort: a pass that finds them missing
  // allocates them itself and reports an allocation failure there.
  const int64_t budget =
      std::max({config_.max_batch_tokens, config_.idle_batch_tokens, config_.rebuild_batch_tokens});
  (void)model_.reserve(budget, std::min(budget, config_.max_running));
}

engine::~engine() = default;

status engine::attach_grammar(request& r, std::span<const int32_t> generated) {
  const std::string& text = r.smp.params().grammar;
  if (text.empty()) return {};
  if (!config_.vocab)
    return {status_code::unsupported,
            "engine: structured outputs need the vocabulary (engine_config::vocab)"};
  auto it = grammars_.find(text);
  if (it == grammars_.end()) {
    auto g = grammar::grammar::parse(text);
    if (!g) return g.error();
    if (grammars_.size() >= 16) grammars_.clear();  // live requests keep theirs
    it = grammars_.emplace(text, std::make_shared<grammar::mask_cache>(*g, config_.vocab)).first;
  }
  r.cons = std::make_unique<grammar::constraint>(it->second, r.smp.params().stop_tokens);
  for (int32_t t : generated) {
    if (!r.cons->accept(config_.vocab->piece(t)))
      return {status_code::invalid_argument, "engine: generated token " + std::to_string(t) +
                                                 " does not match the request's grammar"};
  }
  return {};
}

status engine::add_request(request_id id, std::vector<int32_t> prompt, sampling_params params) {
  return add_resumed_request(id, std::move(prompt), 0, std::move(params));
}

status engine::add_resumed_request(request_id id, std::vector<int32_t> prompt, int64_t n_replay,
                                   sampling_params params) {
  if (n_replay < 0 || n_replay >= static_cast<int64_t>(prompt.size())) {
    return {status_code::invalid_argument, "engine: replayed tokens must leave a non-empty prompt"};
  }
  if (requests_.count(id) != 0)
    return {status_code::invalid_argument, "engine: duplicate request id " + std::to_string(id)};
  if (prompt.empty()) return {status_code::invalid_argument, "engine: empty prompt"};
  for (int32_t t : prompt) {
    if (t < 0 || t >= model_.hparams().n_vocab) {
      return {status_code::invalid_argument,
              "engine: prompt token " + std::to_string(t) + " out of range"};
    }
  }
  if (params.pooling != pooling_type::none) {
    // An embedding: the prompt only (a migrated one starts again; nothing was generated).
    if (n_replay != 0 || !params.grammar.empty())
      return {status_code::invalid_argument,
              "engine: an embedding request has no generated tokens and no grammar"};
    params.max_tokens = 1;
  }
  if (params.max_tokens < 1)
    return {status_code::invalid_argument, "engine: max_tokens must be >= 1"};
  auto r = std::make_unique<request>(id, std::move(prompt), std::move(params));
  r->n_prompt = static_cast<int64_t>(r->tokens.size());
  r->n_replay = n_replay;
  if (auto st = attach_grammar(*r, std::span<const int32_t>(r->tokens).subspan(
                                       r->tokens.size() - static_cast<size_t>(n_replay)));
      !st)
    return st;
  // Each replayed token consumed one random draw when it was sampled (none when greedy).
  if (n_replay > 0) r->smp.skip_draws(n_replay);
  resume_text(*r, n_replay);
  enqueue(std::move(r));
  return {};
}

status engine::add_imported_request(request_id id, seq_id seq, std::vector<int32_t> tokens,
                                    int64_t n_generated, sampling_params params) {
  auto refuse = [&](std::string why) -> status {
    if (auto st = kv_->free_sequence(seq); !st)
      spdlog::error("engine: freeing imported sequence: {}", st.to_string());
    return {status_code::invalid_argument,
            "engine: imported request " + std::to_string(id) + ": " + why};
  };
  if (requests_.count(id) != 0) return refuse("duplicate request id");
  if (config_.record_routes) return refuse("imported KV carries no routes (record_routes)");
  if (tokens.size() < 2 || n_generated < 1 || n_generated >= static_cast<int64_t>(tokens.size())) {
    return refuse("needs a prompt and at least one generated token");
  }
  if (kv_->length(seq) != static_cast<int64_t>(tokens.size()) - 1) {
    return refuse("cache holds " + std::to_string(kv_->length(seq)) + " tokens, expected " +
                  std::to_string(tokens.size() - 1));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= model_.hparams().n_vocab)
      return refuse("token " + std::to_string(t) + " out of range");
  }
  if (params.max_tokens < 1) return refuse("max_tokens must be >= 1");
  if (params.pooling != pooling_type::none) return refuse("an embedding has no generated tokens");
  auto r = std::make_unique<request>(id, std::move(tokens), std::move(params));
  if (auto st = attach_grammar(*r, std::span<const int32_t>(r->tokens).subspan(
                                       r->tokens.size() - static_cast<size_t>(n_generated)));
      !st)
    return refuse(st.message());
  r->n_prompt = static_cast<int64_t>(r->tokens.size()) - n_generated;
  r->n_computed = static_cast<int64_t>(r->tokens.size()) - 1;
  r->seq = seq;
  r->has_seq = true;
  r->ph = phase::decode;
  r->smp.skip_draws(n_generated);
  resume_text(*r, n_generated);
  enqueue(std::move(r));
  return {};
}

std::span<const int32_t> engine::tokens(request_id id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  return it->second->tokens;
}

status engine::add_prefilled_request(request_id id, seq_id seq, std::vector<int32_t> prompt,
                                     sampling_params params, int64_t n_replay) {
  const int64_t n_cached = kv_->length(seq);
  auto refuse = [&](std::string why) -> status {
    if (auto st = kv_->free_sequence(seq); !st)
      spdlog::error("engine: freeing prefilled sequence: {}", st.to_string());
    return {status_code::invalid_argument,
            "engine: prefilled request " + std::to_string(id) + ": " + why};
  };
  if (requests_.count(id) != 0) return refuse("duplicate request id");
  if (config_.record_routes) return refuse("prefilled KV carries no routes (record_routes)");
  if (params.pooling == pooling_type::mean) return refuse("mean pooling needs every prompt token");
  const auto n_tokens = static_cast<int64_t>(prompt.size());
  if (n_replay < 0 || n_replay >= n_tokens) return refuse("replayed tokens leave no prompt");
  const int64_t n_true = n_tokens - n_replay;
  // Two prompt tokens left to compute (prefill numerics), or the whole prompt cached and at least
  // one generated token left (decode numerics, as in the original decode steps).
  const bool prompt_left = n_cached >= 1 && n_cached <= n_true - 2;
  const bool replay_left = n_replay > 0 && n_cached >= n_true && n_cached <= n_tokens - 1;
  if (!prompt_left && !replay_left) {
    return refuse(std::to_string(n_cached) + " cached tokens for a prompt of " +
                  std::to_string(n_true) + " + " + std::to_string(n_replay) + " resumed tokens");
  }
  for (int32_t t : prompt) {
    if (t < 0 || t >= model_.hparams().n_vocab)
      return refuse("token " + std::to_string(t) + " out of range");
  }
  if (params.max_tokens < 1) return refuse("max_tokens must be >= 1");
  if (params.pooling != pooling_type::none) return refuse("an embedding has no generated tokens");
  auto r = std::make_unique<request>(id, std::move(prompt), std::move(params));
  if (auto st = attach_grammar(
          *r, std::span<const int32_t>(r->tokens).subspan(static_cast<size_t>(n_true)));
      !st)
    return refuse(st.message());
  r->n_prompt = n_tokens;
  r->n_replay = n_replay;
  // Each generated token consumed one random draw when it was sampled (none when greedy).
  if (n_replay > 0) r->smp.skip_draws(n_replay);
  resume_text(*r, n_replay);
  r->n_computed = n_cached;
  r->n_cached = std::min(n_cached, n_true);  // cached *prompt* tokens
  r->seq = seq;
  r->has_seq = true;
  r->ph = phase::prefill;
  enqueue(std::move(r));
  return {};
}

result<seq_id> engine::fork_kv(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return status{status_code::not_found, "engine: no request " + std::to_string(id)};
  if (!it->second->has_seq || !it->second->resident()) {
    return status{status_code::invalid_argument,
                  "engine: request " + std::to_string(id) + " has no resident KV"};
  }
  return kv_->fork(it->second->seq);
}

result<detached_request> engine::detach(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return status{status_code::not_found, "engine: no request " + std::to_string(id)};
  request& r = *it->second;
  if (r.ph != phase::decode || !r.has_seq) {
    return status{status_code::invalid_argument,
                  "engine: request " + std::to_string(id) + " is not decoding"};
  }
  detached_request d;
  d.seq = r.seq;
  d.tokens = std::move(r.tokens);
  d.n_generated = r.n_generated;
  r.has_seq = false;  // the caller owns the sequence now
  remove(id);
  return d;
}

void engine::release(request& r) {
  if (r.has_seq) {
    if (auto st = kv_->free_sequence(r.seq); !st)
      spdlog::error("engine: freeing request {}: {}", r.id, st.to_string());
    r.has_seq = false;
  }
}

void engine::remove(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  release(*it->second);
  requests_.erase(it);
  live_.erase(std::remove(live_.begin(), live_.end(), id), live_.end());
  config_.policy->on_finish(id);
}

void engine::fail(request_id id, std::string message, std::vector<request_output>& outputs) {
  request_output out;
  out.id = id;
  out.finish = finish_reason::error;
  out.error = std::move(message);
  remove(id);
  outputs.push_back(std::move(out));
}

result<std::vector<request_id>> engine::rank_live() {
  std::vector<sched_request> live;
  live.reserve(live_.size());
  for (request_id id : live_) {
    const request& r = *requests_.at(id);
    sched_request s;
    s.id = id;
    s.arrival = r.arrival;
    s.n_prompt = r.n_prompt;
    s.n_generated = r.n_generated;
    s.n_computed = r.n_computed;
    s.state = r.ph == phase::waiting   ? sched_state::waiting
              : r.ph == phase::swapped ? sched_state::swapped
                                       : sched_state::resident;
    s.scheduled_last_step = r.scheduled;
    s.priority = r.smp.params().priority;
    live.push_back(s);
  }
  config_.policy->rank(live, iteration_);
  std::vector<request_id> order;
  if (live.size() != live_.size()) {
    return status{status_code::internal, "engine: policy " + std::string(config_.policy->name()) +
                                             " changed the number of live requests"};
  }
  std::unordered_set<request_id> seen;
  for (const auto& s : live) {
    if (requests_.count(s.id) == 0 || !seen.insert(s.id).second) {
      return status{status_code::internal, "engine: policy " + std::string(config_.policy->name()) +
                                               " ranked an unknown or repeated request " +
                                               std::to_string(s.id)};
    }
    order.push_back(s.id);
  }
  if (n_expedited_live() > 0) order = with_expedited_first(std::move(order));
  return order;
}

size_t engine::n_expedited_live() const {
  return static_cast<size_t>(std::count_if(
      live_.begin(), live_.end(), [&](request_id id) { return requests_.at(id)->expedited; }));
}

std::vector<request_id> engine::with_expedited_first(std::vector<request_id> order) const {
  // Keep the policy's leading run of resident requests (running ones are not displaced), then the
  // expedited requests in arrival order, then everything else in the policy's order.
  std::vector<request_id> out;
  out.reserve(order.size());
  size_t i = 0;
  for (; i < order.size(); ++i) {
    const request& r = *requests_.at(order[i]);
    if (r.expedited || !r.resident()) break;
    out.push_back(order[i]);
  }
  for (request_id id : live_) {  // arrival order
    if (requests_.at(id)->expedited) out.push_back(id);
  }
  for (; i < order.size(); ++i) {
    if (!requests_.at(order[i])->expedited) out.push_back(order[i]);
  }
  return out;
}

status engine::expedite(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return {status_code::not_found, "engine: no request " + std::to_string(id)};
  it->second->beyond_cap = true;
  if (it->second->n_generated == 0) it->second->expedited = true;
  return {};
}

void engine::enqueue(std::unique_ptr<request> r) {
  r->arrival = arrival_counter_++;
  sched_request sr;
  sr.id = r->id;
  sr.arrival = r->arrival;
  sr.n_prompt = r->n_prompt;
  sr.priority = r->smp.params().priority;
  live_.push_back(r->id);
  requests_.emplace(r->id, std::move(r));
  config_.policy->on_add(sr);
}

status engine::swap_out(request& r) {
  if (auto st = kv_->swap_out(r.seq); !st) return st;
  r.ph = phase::swapped;
  ++counters_.n_swaps_out;
  return {};
}

bool engine::make_room(int64_t need_blocks, const std::vector<request_id>& order,
                       size_t lower_from) {
  int64_t free_blocks = kv_->stats().n_blocks_free;
  if (free_blocks >= need_blocks) return true;
  // Only requests ranked below the candidate may be displaced. Evict nothing unless evicting all of
  // them could make room (shared prefix blocks make this an upper bound; the loop re-checks).
  int64_t freeable = 0;
  for (size_t j = lower_from; j < order.size(); ++j) {
    auto it = requests_.find(order[j]);
    if (it != requests_.end() && it->second->resident())
      freeable += static_cast<int64_t>(kv_->block_table(it->second->seq).size());
  }
  if (free_blocks + freeable < need_blocks) return false;
  for (size_t j = order.size(); j-- > lower_from && free_blocks < need_blocks;) {
    auto it = requests_.find(order[j]);
    if (it == requests_.end() || !it->second->resident()) continue;
    if (auto st = swap_out(*it->second); !st) {
      spdlog::error("engine: swapping out request {}: {}", order[j], st.to_string());
      return false;
    }
    free_blocks = kv_->stats().n_blocks_free;
  }
  return free_blocks >= need_blocks;
}

bool engine::prefix_in_flight(const request& r) const {
  const int64_t bs = kv_->layout().block_size;
  const int64_t limit = std::max<int64_t>(r.n_prompt - r.n_replay - 1, 0);  // as in admit()
  if (limit < bs) return false;
  for (request_id id : live_) {
    const request& a = *requests_.at(id);
    if (&a == &r || a.ph != phase::prefill) continue;
    const int64_t a_prompt = a.n_prompt - a.n_replay;
    const int64_t n = std::min(limit, a_prompt);
    const auto diff = std::mismatch(r.tokens.begin(), r.tokens.begin() + n, a.tokens.begin());
    const int64_t shared = (diff.first - r.tokens.begin()) / bs * bs;
    // Worth waiting while at least one shared block is still to be computed by `a`.
    if (shared - a.n_computed >= bs) return true;
  }
  return false;
}

void engine::admit(request& r) {
  r.seq = kv_->create_sequence();
  r.has_seq = true;
  // Mean pooling needs every prompt token's hidden state: nothing is taken from the cache.
  if (config_.prefix_cache && r.smp.params().pooling != pooling_type::mean) {
    // Leave at least two prompt tokens to compute, so the last chunk keeps prefill numerics; never
    // match into replayed tokens (their blocks must be rebuilt with decode numerics).
    const int64_t n_true = r.n_prompt - r.n_replay;
    auto prefix = std::span<const int32_t>(r.tokens).first(
        static_cast<size_t>(std::max<int64_t>(n_true - 1, 0)));
    if (config_.prefix_into_replay && r.n_replay > 0) {
      // Blocks past the true prompt hold decode-computed KV (see prefix_into_replay): take them
      // when every true prompt token is cached, leaving at least the last token to compute.
      const auto longer = std::span<const int32_t>(r.tokens).first(
          static_cast<size_t>(std::max<int64_t>(r.n_prompt - 1, 0)));
      if (kv_->match_prefix(longer) >= n_true) prefix = longer;
    }
    auto matched = kv_->attach_prefix(r.seq, prefix);
    if (matched) r.n_computed = r.n_cached = *matched;
    if (matched && *matched > 0 && config_.record_routes) cached_routes(r, *matched);
  }
  r.ph = phase::prefill;
}

std::vector<request_id> engine::select(const std::vector<request_id>& order,
                                       std::vector<request_output>& outputs) {
  std::vector<request_id> selected;
  const int64_t total_blocks = kv_->stats().n_blocks_total;
  // Once a request that needs blocks cannot get them, no lower-ranked one may take blocks ahead of
  // it (no overtaking on memory); resident requests still run.
  bool admitting = true;
  // Retried requests (expedite()) run on top of max_running: they are another worker's load.
  int64_t n_capped = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    request& r = *requests_.at(order[i]);
    if (!r.beyond_cap && n_capped >= config_.max_running) continue;
    if (r.resident()) {
      selected.push_back(r.id);
      n_capped += r.beyond_cap ? 0 : 1;
      continue;
    }
    if (!admitting) continue;
    const bool waiting = r.ph == phase::waiting;
    if (waiting && config_.prefix_cache && r.smp.params().pooling != pooling_type::mean &&
        prefix_in_flight(r)) {
      // Admitted once the other request's blocks are in the cache (a later step); requests
      // ranked below may go ahead meanwhile.
      if (!r.waited_for_prefix) ++counters_.n_prefix_waits;
      r.waited_for_prefix = true;
      continue;
    }
    const int64_t n_tokens = waiting ? r.n_prompt : static_cast<int64_t>(r.tokens.size());
    const int64_t need = kv_->blocks_for(n_tokens + 1);
    if (need > total_blocks) {
      fail(r.id,
           (waiting ? "prompt of " : "request of ") + std::to_string(n_tokens) +
               " tokens does not fit the KV cache",
           outputs);
      continue;
    }
    if (!make_room(need, order, i + 1)) {
      admitting = false;
      continue;
    }
    if (waiting) {
      admit(r);
    } else {
      if (auto st = kv_->swap_in(r.seq); !st) {
        if (st.code() == status_code::out_of_memory) {
          admitting = false;
        } else {
          fail(r.id, st.to_string(), outputs);
        }
        continue;
      }
      ++counters_.n_swaps_in;
      r.ph = r.n_computed < r.n_prompt ? phase::prefill : phase::decode;
    }
    selected.push_back(r.id);
    n_capped += r.beyond_cap ? 0 : 1;
  }
  return selected;
}

void engine::note_scheduled(const std::vector<request_id>& in_batch) {
  for (request_id id : live_) {
    request& r = *requests_.at(id);
    const bool now = std::find(in_batch.begin(), in_batch.end(), id) != in_batch.end();
    if (r.scheduled && !now) ++counters_.n_preemptions;
    r.scheduled = now;
  }
}

void engine::mark_hidden(forward_batch& batch, const request& r, int64_t chunk, bool last_chunk) {
  batch.want_hidden.resize(batch.tokens.size(), 0);
  const size_t end = batch.tokens.size();
  if (r.smp.params().pooling == pooling_type::mean) {
    std::fill(batch.want_hidden.end() - chunk, batch.want_hidden.end(), uint8_t{1});
  } else if (last_chunk) {
    batch.want_hidden[end - 1] = 1;
  }
}

void engine::pool_hidden(const forward_batch& batch, const forward_output& fout,
                         const std::vector<request_id>& in_batch,
                         std::vector<request_output>& outputs, std::vector<request_id>& finished) {
  const int64_t d = model_.hparams().n_embd;
  for (size_t row = 0; row < fout.hidden_index.size(); ++row) {
    const int32_t si = batch.seq_index[static_cast<size_t>(fout.hidden_index[row])];
    request& r = *requests_.at(in_batch[static_cast<size_t>(si)]);
    const float* h = fout.hidden.data() + static_cast<int64_t>(row) * d;
    if (r.pooled.empty() || r.smp.params().pooling == pooling_type::last)
      r.pooled.assign(static_cast<size_t>(d), 0.0);
    for (int64_t i = 0; i < d; ++i) r.pooled[static_cast<size_t>(i)] += h[i];
  }
  for (request_id id : in_batch) {
    request& r = *requests_.at(id);
    if (!r.embeds() || r.n_computed < r.n_prompt) continue;
    request_output out;
    out.id = r.id;
    out.cached_prompt_tokens = r.n_cached;
    out.finish = finish_reason::length;
    // Mean over every prompt token (none came from the cache), accumulated in double.
    const double n =
        r.smp.params().pooling == pooling_type::mean ? static_cast<double>(r.n_prompt) : 1.0;
    out.embedding.resize(r.pooled.size());
    for (size_t i = 0; i < r.pooled.size(); ++i)
      out.embedding[i] = static_cast<float>(r.pooled[i] / n);
    finished.push_back(r.id);
    outputs.push_back(std::move(out));
  }
}

void engine::fill_batch(const std::vector<request_id>& selected, forward_batch& batch,
                        std::vector<request_id>& in_batch) const {
  batch.clear();
  in_batch.clear();
  int64_t budget = config_.max_batch_tokens;
  if (config_.idle_batch_tokens > budget &&
      std::none_of(selected.begin(), selected.end(),
                   [&](request_id id) { return requests_.at(id)->ph == phase::decode; })) {
    budget = config_.idle_batch_tokens;
  }
  if (config_.rebuild_batch_tokens > budget) {
    for (request_id id : selected) {
      const request& r = *requests_.at(id);
      if (r.ph == phase::prefill && r.n_replay > 0) budget = config_.rebuild_batch_tokens;
    }
  }
  for (request_id id : selected) {
    const request& r = *requests_.at(id);
    if (r.ph != phase::decode || budget < 1) continue;
    batch.add(r.seq, std::span<const int32_t>(&r.tokens.back(), 1), true);
    in_batch.push_back(id);
    --budget;
  }
  for (request_id id : selected) {
    const request& r = *requests_.at(id);
    if (r.ph != phase::prefill) continue;
    const int64_t n_true = r.n_prompt - r.n_replay;
    if (r.n_computed >= n_true) {
      // Replayed tokens: any chunk size, every token with decode numerics.
      const int64_t rest = r.n_prompt - r.n_computed;
      const int64_t chunk = std::min(rest, budget);
      if (chunk <= 0) continue;
      batch.add(
          r.seq,
          std::span<const int32_t>(r.tokens.data() + r.n_computed, static_cast<size_t>(chunk)),
          chunk == rest, /*as_decode=*/true);
      in_batch.push_back(id);
      budget -= chunk;
      continue;
    }
    const int64_t remaining = n_true - r.n_computed;
    int64_t chunk = std::min(remaining, budget);
    // A prompt chunk of one token would switch that token to decode numerics (docs/engine.md):
    // never leave a single token for the next chunk, never schedule a single-token chunk.
    if (chunk < remaining && remaining - chunk == 1) --chunk;
    if (chunk < remaining && chunk < 2) continue;
    if (chunk <= 0) continue;
    batch.add(r.seq,
              std::span<const int32_t>(r.tokens.data() + r.n_computed, static_cast<size_t>(chunk)),
              chunk == remaining && r.n_replay == 0 && !r.embeds());
    if (r.embeds()) mark_hidden(batch, r, chunk, chunk == remaining);
    in_batch.push_back(id);
    budget -= chunk;
  }
}

namespace {

/// Adds the seconds from construction to destruction to `total`.
struct step_timer {
  double& total;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~step_timer() {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace

result<std::vector<request_output>> engine::step() {
  step_timer timed{counters_.step_s};
  ++iteration_;
  std::vector<request_output> outputs = std::move(pending_);
  pending_.clear();
  auto ranked = rank_live();
  if (!ranked) {
    pending_ = std::move(outputs);
    return ranked.error();
  }
  const std::vector<request_id> order = std::move(ranked.value());
  std::vector<request_id> selected = select(order, outputs);
  forward_batch batch;
  forward_output fout;
  std::vector<request_id> in_batch;
  const double forward_before = counters_.forward_s;
  const status st = forward(order, selected, batch, fout, in_batch);
  note_scheduled(in_batch);
  if (!st.ok()) {
    // Unrecoverable for this batch: fail its requests (their blocks are freed).
    for (request_id id : in_batch) fail(id, st.to_string(), outputs);
    return outputs;
  }
  if (batch.tokens.empty()) return outputs;
  ++counters_.n_steps;
  bool prefilled = false;
  // Advance every sequence in the batch, then sample where logits came back.
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    request& r = *requests_.at(in_batch[si]);
    int64_t n = 0;
    for (int32_t x : batch.seq_index) n += x == static_cast<int32_t>(si) ? 1 : 0;
    if (config_.record_routes) record_routes(r, static_cast<int32_t>(si), batch, fout);
    r.n_computed += n;
    if (r.ph == phase::decode) {
      counters_.n_decode_tokens += n;
      config_.policy->on_progress(r.id, 0, n);
    } else {
      counters_.n_prefill_tokens += n;
      config_.policy->on_progress(r.id, n, 0);
      prefilled = true;
    }
  }
  if (prefilled) {
    counters_.prefill_pass_s += counters_.forward_s - forward_before;
    counters_.prefill_pass_tokens += static_cast<int64_t>(batch.tokens.size());
  }
  std::vector<request_id> finished;
  pool_hidden(batch, fout, in_batch, outputs, finished);
  sample_rows(batch, fout, in_batch, outputs, finished);
  for (request_id id : finished) remove(id);
  return outputs;
}

status engine::forward(const std::vector<request_id>& order, std::vector<request_id>& selected,
                       forward_batch& batch, forward_output& fout,
                       std::vector<request_id>& in_batch) {
  for (;;) {
    fill_batch(selected, batch, in_batch);
    if (batch.tokens.empty()) return {};
    if (!batch.want_hidden.empty()) batch.want_hidden.resize(batch.tokens.size(), 0);
    const status st = [&] {
      step_timer f{counters_.forward_s};
      return model_.forward(batch, *kv_, fout);
    }();
    if (st.ok()) return st;
    if (st.code() == status_code::out_of_memory) {
      // Make room: paused requests first (all rank below the selected ones), lowest-ranked first;
      // then the lowest-ranked selected request, keeping at least one.
      bool freed = false;
      for (auto it = order.rbegin(); it != order.rend() && !freed; ++it) {
        auto rq = requests_.find(*it);
        if (rq == requests_.end() || !rq->second->resident()) continue;
        if (std::find(selected.begin(), selected.end(), *it) != selected.end()) continue;
        freed = swap_out(*rq->second).ok();
      }
      if (!freed && selected.size() > 1 && swap_out(*requests_.at(selected.back())).ok()) {
        selected.pop_back();
        freed = true;
      }
      if (freed) continue;
    }
    return st;
  }
}

status engine::abort(request_id id) {
  if (requests_.count(id) == 0)
    return {status_code::not_found, "engine: no request " + std::to_string(id)};
  remove(id);
  return {};
}

bool engine::has_work() const {
  return !requests_.empty() || !pending_.empty();
}

engine_stats engine::stats() const {
  engine_stats s = counters_;
  s.kv = kv_->stats();
  for (const auto& [id, r] : requests_) {
    if (r->ph == phase::waiting) ++s.n_waiting;
    if (r->ph == phase::swapped) ++s.n_swapped;
    if (r->resident()) {
      ++s.n_running;
      if (!r->scheduled) ++s.n_paused;
    }
  }
  return s;
}

}  // namespace weft::gpu
