#include "gpu/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace weft::gpu {

const char* finish_reason_name(finish_reason r) {
  switch (r) {
    case finish_reason::none: return "none";
    case finish_reason::stop_token: return "stop";
    case finish_reason::stop_string: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::aborted: return "abort";
    case finish_reason::error: return "error";
  }
  return "unknown";
}

namespace {

// Bytes at the end of `s` that start an incomplete UTF-8 sequence (held back from a text delta).
size_t incomplete_utf8_tail(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

result<std::unique_ptr<engine>> engine::create(model& m, const engine_config& config) {
  if (config.max_batch_tokens < 2 || config.max_running < 1 || config.block_size < 1 || config.kv_blocks < 1) {
    return status{status_code::invalid_argument, "engine: max_batch_tokens >= 2, max_running, block_size, kv_blocks >= 1"};
  }
  kv_cache_config kc;
  kc.layout = m.kv_layout_for(config.block_size);
  kc.n_blocks = config.kv_blocks;
  auto kv = kv_cache::create(m.dev(), kc);
  if (!kv) return kv.error();
  return std::unique_ptr<engine>(new engine(m, std::move(kv.value()), config));
}

engine::engine(model& m, std::unique_ptr<kv_cache> kv, const engine_config& config)
    : model_(m), kv_(std::move(kv)), config_(config) {}

engine::~engine() = default;

status engine::add_request(request_id id, std::vector<int32_t> prompt, sampling_params params) {
  if (requests_.count(id) != 0) return {status_code::invalid_argument, "engine: duplicate request id " + std::to_string(id)};
  if (prompt.empty()) return {status_code::invalid_argument, "engine: empty prompt"};
  for (int32_t t : prompt) {
    if (t < 0 || t >= model_.hparams().n_vocab) {
      return {status_code::invalid_argument, "engine: prompt token " + std::to_string(t) + " out of range"};
    }
  }
  if (params.max_tokens < 1) return {status_code::invalid_argument, "engine: max_tokens must be >= 1"};
  auto r = std::make_unique<request>(request{id, std::move(prompt), 0, 0, 0, phase::waiting, 0, false,
                                             sampler(std::move(params)), {}, 0, 0, 0});
  r->n_prompt = static_cast<int64_t>(r->tokens.size());
  requests_.emplace(id, std::move(r));
  waiting_.push_back(id);
  return {};
}

void engine::release(request& r) {
  if (r.has_seq) {
    if (auto st = kv_->free_sequence(r.seq); !st) spdlog::error("engine: freeing request {}: {}", r.id, st.to_string());
    r.has_seq = false;
  }
}

void engine::admit() {
  // Swapped requests first: they were admitted earlier.
  while (!swapped_.empty() && static_cast<int64_t>(running_.size()) < config_.max_running) {
    request& r = *requests_.at(swapped_.front());
    if (kv_->stats().n_blocks_free < kv_->blocks_for(static_cast<int64_t>(r.tokens.size()) + 1)) return;
    if (auto st = kv_->swap_in(r.seq); !st) return;
    r.ph = r.n_computed < r.n_prompt ? phase::prefill : phase::decode;
    running_.push_back(r.id);
    swapped_.pop_front();
  }
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_running) {
    request& r = *requests_.at(waiting_.front());
    const int64_t need = kv_->blocks_for(r.n_prompt + 1);
    if (need > kv_->stats().n_blocks_total) {
      request_output out;
      out.id = r.id;
      out.finish = finish_reason::error;
      out.error = "prompt of " + std::to_string(r.n_prompt) + " tokens does not fit the KV cache";
      pending_.push_back(std::move(out));
      waiting_.pop_front();
      requests_.erase(out.id);
      continue;
    }
    if (kv_->stats().n_blocks_free < need) return;
    r.seq = kv_->create_sequence();
    r.has_seq = true;
    if (config_.prefix_cache) {
      // Leave at least two prompt tokens to compute, so the last chunk keeps prefill numerics.
      const auto prefix = std::span<const int32_t>(r.tokens).first(static_cast<size_t>(std::max<int64_t>(r.n_prompt - 1, 0)));
      auto matched = kv_->attach_prefix(r.seq, prefix);
      if (matched) r.n_computed = r.n_cached = *matched;
    }
    r.ph = phase::prefill;
    r.admit_order = admit_counter_++;
    running_.push_back(r.id);
    waiting_.pop_front();
  }
}

bool engine::preempt_one(request_id keep) {
  // The most recently admitted running request other than `keep` goes to host memory.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (*it == keep) continue;
    request& r = *requests_.at(*it);
    if (auto st = kv_->swap_out(r.seq); !st) return false;
    r.ph = phase::swapped;
    swapped_.push_front(r.id);
    running_.erase(std::next(it).base());
    ++counters_.n_preemptions;
    return true;
  }
  return false;
}

void engine::finish_text(request& r, request_output& out, bool final) {
  const auto& stops = r.smp.params().stop_strings;
  size_t emit_to = r.text.size();
  if (!final) {
    size_t hold = incomplete_utf8_tail(r.text);
    for (const auto& s : stops) {
      for (size_t k = std::min(s.size() - 1, r.text.size()); k > hold; --k) {
        if (r.text.compare(r.text.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    emit_to = r.text.size() - hold;
  }
  if (emit_to > r.text_emitted) {
    out.text_delta += r.text.substr(r.text_emitted, emit_to - r.text_emitted);
    r.text_emitted = emit_to;
  }
}

result<std::vector<request_output>> engine::step() {
  admit();
  std::vector<request_output> outputs = std::move(pending_);
  pending_.clear();
  forward_batch batch;
  forward_output fout;
  std::vector<request_id> in_batch;
  for (int attempt = 0;; ++attempt) {
    batch.clear();
    in_batch.clear();
    int64_t budget = config_.max_batch_tokens;
    for (request_id id : running_) {
      request& r = *requests_.at(id);
      if (r.ph != phase::decode || budget < 1) continue;
      batch.add(r.seq, std::span<const int32_t>(&r.tokens.back(), 1), true);
      in_batch.push_back(id);
      --budget;
    }
    for (request_id id : running_) {
      request& r = *requests_.at(id);
      if (r.ph != phase::prefill) continue;
      const int64_t remaining = r.n_prompt - r.n_computed;
      int64_t chunk = std::min(remaining, budget);
      // A prompt chunk of one token would switch that token to decode numerics (docs/engine.md):
      // never leave a single token for the next chunk, never schedule a single-token chunk.
      if (chunk < remaining && remaining - chunk == 1) --chunk;
      if (chunk < remaining && chunk < 2) continue;
      if (chunk <= 0) continue;
      batch.add(r.seq, std::span<const int32_t>(r.tokens.data() + r.n_computed, static_cast<size_t>(chunk)),
                chunk == remaining);
      in_batch.push_back(id);
      budget -= chunk;
    }
    if (batch.tokens.empty()) return outputs;
    const status st = model_.forward(batch, *kv_, fout);
    if (st.ok()) break;
    if (st.code() == status_code::out_of_memory && running_.size() > 1 && preempt_one(running_.front())) continue;
    // Unrecoverable for this batch: fail its requests (their blocks are freed).
    for (request_id id : in_batch) {
      request& r = *requests_.at(id);
      request_output out;
      out.id = id;
      out.finish = finish_reason::error;
      out.error = st.to_string();
      release(r);
      running_.erase(std::find(running_.begin(), running_.end(), id));
      requests_.erase(id);
      outputs.push_back(std::move(out));
    }
    return outputs;
  }
  ++counters_.n_steps;
  // Advance every sequence in the batch, then sample where logits came back.
  std::unordered_map<request_id, size_t> out_index;
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    request& r = *requests_.at(in_batch[si]);
    int64_t n = 0;
    for (int32_t x : batch.seq_index) n += x == static_cast<int32_t>(si) ? 1 : 0;
    r.n_computed += n;
    if (r.ph == phase::decode) {
      counters_.n_decode_tokens += n;
    } else {
      counters_.n_prefill_tokens += n;
    }
  }
  std::vector<request_id> finished;
  for (size_t row = 0; row < fout.token_index.size(); ++row) {
    const int32_t si = batch.seq_index[static_cast<size_t>(fout.token_index[row])];
    request& r = *requests_.at(in_batch[static_cast<size_t>(si)]);
    const std::span<const float> logits(fout.logits.data() + row * fout.n_vocab, static_cast<size_t>(fout.n_vocab));
    sample_result s = r.smp.sample(logits, r.tokens);
    request_output out;
    out.id = r.id;
    out.cached_prompt_tokens = r.n_cached;
    r.ph = phase::decode;
    ++r.n_generated;
    const auto& p = r.smp.params();
    if (std::find(p.stop_tokens.begin(), p.stop_tokens.end(), s.token) != p.stop_tokens.end()) {
      out.finish = finish_reason::stop_token;
    } else {
      r.tokens.push_back(s.token);
      out.new_tokens.push_back(s.token);
      out.samples.push_back(std::move(s));
      if (config_.detokenize) {
        r.text += config_.detokenize(out.new_tokens.back());
        for (const auto& stop : p.stop_strings) {
          if (stop.empty()) continue;
          const size_t from = r.text_emitted;
          const size_t pos = r.text.find(stop, from);
          if (pos != std::string::npos) {
            r.text.resize(pos);
            out.finish = finish_reason::stop_string;
          }
        }
      }
      if (out.finish == finish_reason::none &&
          (r.n_generated >= p.max_tokens ||
           (model_.hparams().n_ctx_train > 0 && static_cast<int64_t>(r.tokens.size()) >= model_.hparams().n_ctx_train))) {
        out.finish = finish_reason::length;
      }
    }
    if (config_.detokenize) finish_text(r, out, out.finish != finish_reason::none);
    if (out.finish != finish_reason::none) finished.push_back(r.id);
    outputs.push_back(std::move(out));
  }
  for (request_id id : finished) {
    release(*requests_.at(id));
    running_.erase(std::find(running_.begin(), running_.end(), id));
    requests_.erase(id);
  }
  return outputs;
}

status engine::abort(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {status_code::not_found, "engine: no request " + std::to_string(id)};
  release(*it->second);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  swapped_.erase(std::remove(swapped_.begin(), swapped_.end(), id), swapped_.end());
  requests_.erase(it);
  return {};
}

bool engine::has_work() const { return !requests_.empty() || !pending_.empty(); }

engine_stats engine::stats() const {
  engine_stats s = counters_;
  s.kv = kv_->stats();
  s.n_waiting = static_cast<int64_t>(waiting_.size());
  s.n_running = static_cast<int64_t>(running_.size());
  s.n_swapped = static_cast<int64_t>(swapped_.size());
  return s;
}

}  // namespace weft::gpu
